/* test_sched.c — the worker scheduler's pure policies (worker/server/hyla_worker_sched.h).
 *
 * sched_prefill_budget sets a step's prefill tokens: the operator's budget while sessions
 * generate, a whole prefill piece while none does.
 *
 * sched_feed_len decides how many queued Append tokens a scheduler step feeds. The identity of
 * an Append's tokens with one uninterrupted feed rests on it: every feed but a stream's tail
 * must leave the session's position on a multiple of the prefill chunk, never exceed what is
 * queued or the budget, take every whole chunk that fits (or prefill would crawl), and make
 * progress whenever a chunk's worth is queued (or a session would starve).
 *
 * sched_fair_cap picks a decode step's sessions when more could decode than a step takes: those
 * decoded least recently, so that each gets a step at least every ceil(n / cap) steps, in
 * whatever order the worker's table lists them (newest first), and joiners do not wait. */
#include "hyla_test.h"
#include "hyla_worker_sched.h"

#include <stdint.h>

/* Position after feeding n tokens from next_pos (the newest token stays pending). */
static int64_t pos_after(int64_t next_pos, int n) { return next_pos + n - 1; }

static void exact_cases(void) {
    /* a fresh session: the first token goes to position 0, so 961 tokens reach position 960 */
    CHECK(sched_feed_len(0, 1000, 1024, 0, 64) == 961);
    /* one fed position short of a boundary: one token closes the chunk, then whole chunks */
    CHECK(sched_feed_len(64, 1000, 1024, 0, 64) == 1 + 960);
    /* on a boundary (position 0 fed, its token pending): whole chunks only */
    CHECK(sched_feed_len(1, 1000, 1024, 0, 64) == 960);
    CHECK(sched_feed_len(1, 63, 1024, 0, 64) == 0);
    CHECK(sched_feed_len(1, 64, 1024, 0, 64) == 64);
    /* fewer tokens than the distance to the next boundary: wait for more */
    CHECK(sched_feed_len(10, 20, 1024, 0, 64) == 0);
    CHECK(sched_feed_len(10, 55, 1024, 0, 64) == 55);
    /* the budget caps the feed, still aligned */
    CHECK(sched_feed_len(10, 5000, 1024, 0, 64) == 55 + 960);
    CHECK(sched_feed_len(10, 5000, 64, 0, 64) == 55);
    /* an ended stream's tail that fits the budget goes whole */
    CHECK(sched_feed_len(10, 20, 1024, 1, 64) == 20);
    CHECK(sched_feed_len(10, 1024, 1024, 1, 64) == 1024);
    /* ... but a tail larger than the budget is still fed aligned */
    CHECK(sched_feed_len(10, 1025, 1024, 1, 64) == 55 + 960);
}

/* Every argument combination in a range against the properties, by brute force. */
static void properties(void) {
    const int chunks[] = {64, 16, 1};
    const int budgets[] = {64, 100, 1024};
    for (size_t ci = 0; ci < sizeof chunks / sizeof *chunks; ci++)
        for (size_t bi = 0; bi < sizeof budgets / sizeof *budgets; bi++)
            for (int64_t p = 0; p < 200; p++)
                for (size_t q = 1; q < 1300; q += (q < 140 ? 1 : 37))
                    for (int ended = 0; ended < 2; ended++) {
                        int C = chunks[ci], B = budgets[bi];
                        if (B < C) continue; /* the worker clamps its budget to at least a chunk */
                        int n = sched_feed_len(p, q, B, ended, C);
                        int64_t avail = q < (size_t)B ? (int64_t)q : B;
                        int tail = ended && q <= (size_t)B;
                        CHECK_MSG(n >= 0 && n <= avail, "p %lld q %zu B %d C %d: n %d", (long long)p, q, B, C, n);
                        if (tail) {
                            CHECK_MSG(n == (int)q, "p %lld q %zu B %d: ended tail n %d", (long long)p, q, B, n);
                            continue;
                        }
                        if (n > 0)
                            CHECK_MSG(pos_after(p, n) % C == 0, "p %lld q %zu B %d C %d: n %d unaligned", (long long)p,
                                      q, B, C, n);
                        /* maximal: no larger aligned feed fits */
                        for (int64_t k = n + 1; k <= avail; k++)
                            if (pos_after(p, (int)k) % C == 0) {
                                CHECK_MSG(0, "p %lld q %zu B %d C %d: n %d but %lld fits", (long long)p, q, B, C, n,
                                          (long long)k);
                                break;
                            }
                        /* progress: a chunk's worth queued always feeds */
                        if (avail >= C) CHECK_MSG(n > 0, "p %lld q %zu B %d C %d: starved", (long long)p, q, B, C);
                    }
}

/* A document arriving in uneven messages, fed step by step: every feed but the last ends on a
 * boundary, and the whole document is fed once the stream ends. */
static void stream(void) {
    uint64_t rng = 12345;
    for (int trial = 0; trial < 200; trial++) {
        int64_t next_pos = (int64_t)(rng % 300);
        int B = 64 + (int)(rng % 2000);
        size_t doc = 1 + (size_t)((rng >> 8) % 5000), sent = 0, queued = 0, fed = 0;
        int ended = 0, steps = 0, last_unaligned = 0;
        while (fed < doc && steps < 100000) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            if (sent < doc) {
                size_t m = 1 + (size_t)((rng >> 33) % 700);
                if (m > doc - sent) m = doc - sent;
                sent += m;
                queued += m;
                ended = sent == doc;
            }
            if (queued) {
                int n = sched_feed_len(next_pos, queued, B, ended, 64);
                if (n > 0) {
                    CHECK_MSG(!last_unaligned, "trial %d: a feed after an unaligned one", trial);
                    if (pos_after(next_pos, n) % 64) last_unaligned = 1;
                    next_pos += n;
                    queued -= (size_t)n;
                    fed += (size_t)n;
                }
            }
            steps++;
        }
        CHECK_MSG(fed == doc, "trial %d: fed %zu of %zu in %d steps", trial, fed, doc, steps);
    }
}

/* The step's budget: --prefill-budget while sessions generate; a whole piece when none does,
 * never less than the budget. */
static void budget_cases(void) {
    CHECK(sched_prefill_budget(1024, 8192, 1) == 1024);
    CHECK(sched_prefill_budget(1024, 8192, 0) == 8192);
    CHECK(sched_prefill_budget(1024, 1024, 0) == 1024);
    CHECK(sched_prefill_budget(4096, 1024, 0) == 4096);
    CHECK(sched_prefill_budget(4096, 1024, 1) == 4096);
}

/* n sessions, cap a step, `steps` steps: each step takes sched_fair_cap's first cap of the
 * sessions in table order (newest first); a session joins at step join[i] (0: from the start).
 * Returns the longest wait (steps between two of a session's steps, or from its joining). */
static int fair_run(int n, int cap, int steps, const int *join) {
    uint64_t last[64], keys[64];
    void *items[64];
    int since[64], worst = 0;
    for (int i = 0; i < n; i++) last[i] = 0, since[i] = 0;
    for (int t = 1; t <= steps; t++) {
        int m = 0;
        for (int i = n - 1; i >= 0; i--) /* the table: newest (highest index) first */
            if (!join || join[i] < t) keys[m] = last[i], items[m++] = (void *)(intptr_t)i;
        int k = sched_fair_cap(keys, items, m, cap);
        CHECK(k == (m < cap ? m : cap));
        for (int j = 1; j < m; j++) CHECK(keys[j - 1] <= keys[j] || m <= cap); /* sorted when capped */
        for (int j = 0; j < k; j++) {
            int i = (int)(intptr_t)items[j];
            last[i] = (uint64_t)t;
            since[i] = 0;
        }
        for (int i = 0; i < n; i++)
            if (!join || join[i] < t) {
                if (last[i] != (uint64_t)t) since[i]++;
                if (since[i] > worst) worst = since[i];
            }
    }
    return worst;
}

static void fair_cases(void) {
    /* not capped: nothing moves */
    uint64_t k[3] = {5, 1, 3};
    void *it[3] = {(void *)1, (void *)2, (void *)3};
    CHECK(sched_fair_cap(k, it, 3, 3) == 3 && k[0] == 5 && it[0] == (void *)1 && it[2] == (void *)3);
    /* capped: the least recent first, ties in their order */
    uint64_t k2[5] = {4, 0, 2, 0, 1};
    void *it2[5] = {(void *)10, (void *)11, (void *)12, (void *)13, (void *)14};
    CHECK(sched_fair_cap(k2, it2, 5, 2) == 2);
    CHECK(it2[0] == (void *)11 && it2[1] == (void *)13 && it2[2] == (void *)14 && it2[3] == (void *)12 &&
          it2[4] == (void *)10);
    /* every session waits at most ceil(n / cap) - 1 steps between two of its own */
    for (int n = 1; n <= 40; n++)
        for (int cap = 1; cap <= 12; cap++) {
            int worst = fair_run(n, cap, 200, NULL), bound = (n + cap - 1) / cap - 1;
            CHECK_MSG(worst <= bound, "n=%d cap=%d: a session waited %d steps (bound %d)", n, cap, worst, bound);
        }
    /* sessions joining while others decode (each new one first in the table) wait no longer */
    int join[9] = {0, 0, 3, 5, 5, 9, 20, 21, 40};
    int worst = fair_run(9, 2, 120, join);
    CHECK_MSG(worst <= 4, "joiners: a session waited %d steps (bound 4)", worst);
}

int main(void) {
    fair_cases();
    budget_cases();
    exact_cases();
    properties();
    stream();
    if (hyla_test_failures) {
        fprintf(stderr, "test_sched: %d failures\n", hyla_test_failures);
        return 1;
    }
    printf("test_sched: ok\n");
    return 0;
}
