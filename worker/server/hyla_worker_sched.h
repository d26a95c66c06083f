/* hyla_worker_sched.h — the scheduler's pure policies, kept apart from the loop so that they
 * have unit tests of their own (tests/test_sched.c). No state, no I/O, no threads. */
#ifndef HYLA_WORKER_SCHED_H
#define HYLA_WORKER_SCHED_H

#include <stddef.h>
#include <stdint.h>

/* How many of an Append job's `queued` tokens (> 0) to feed in one scheduler step under `budget`
 * (> 0) prefill tokens, for a session whose next fed token goes to absolute position `next_pos`
 * (its position, plus one when it holds a pending token).
 *
 * A feed leaves its newest token pending, so after feeding n tokens the session's position is
 * next_pos + n - 1. The answer makes that position a multiple of `chunk` (the model's prefill chunk):
 * the prefill pieces are then those of one uninterrupted feed of the whole document, bit for
 * bit, whatever the budget and however the tokens arrived. It is the largest such n within
 * min(queued, budget), or 0 when none fits (wait for more tokens). Only the tail of a stream
 * that has ended (`stream_ended`) and fits the budget is fed whole, unaligned. */
int sched_feed_len(int64_t next_pos, size_t queued, int budget, int stream_ended, int chunk);

/* The prefill tokens a scheduler step may feed: `budget` (--prefill-budget) bounds how long the
 * step holds up the sessions that generate; while none does (`generating` 0), up to a whole
 * prefill `piece` (the runtime's: 8192 on a GPU), so a lone long document runs at the backend's
 * best piece size. */
int sched_prefill_budget(int budget, int piece, int generating);

/* A decode step's pick when more sessions could decode than it takes: items[0..n) with keys
 * last[0..n) (the step each last decoded in; 0: never). Sorts both stably by last, ascending, and
 * returns min(n, cap): take the first that many. When n <= cap nothing moves. So every session
 * gets a step at least every ceil(n / cap) steps, whatever order the items come in. */
int sched_fair_cap(uint64_t *last, void **items, int n, int cap);

#endif
