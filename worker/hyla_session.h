/* hyla_session.h — one conversation on a loaded model: its per-layer state on the backend,
 * its position, its sampler and RNG; export to / import from a hyla_snapshot.
 *
 * The pending token. A session always knows the next token to feed (the last prompt token,
 * or the last sampled one) but has not fed it yet. hyla_session_feed() consumes the pending
 * token and all new tokens but the last, which becomes pending; hyla_session_decode() feeds
 * the pending token of each session, samples the next one and makes it pending. So a saved
 * session resumes by feeding its pending token, exactly as the uninterrupted run would have:
 * "generate 64" equals "generate 32, save, load, generate 32" bit for bit on one backend.
 *
 * Prefill runs in chunks of the model's prefill chunk (HYLA_PREFILL_CHUNK, or an SSE model's
 * prefill_window) aligned to absolute positions, in forward passes of up to the runtime's prefill
 * piece (hyla_runtime_set_prefill_piece) that start on chunk boundaries, so feeding a document in
 * pieces that end at chunk boundaries, or with any piece size, reproduces the one-piece run bit
 * for bit.
 *
 * Ownership: sessions borrow their runtime (hyla_runtime.h), which must outlive them.
 * Threading: a session is driven by one thread at a time, the thread that drives the runtime. */
#ifndef HYLA_SESSION_H
#define HYLA_SESSION_H

#include <stdint.h>

#include "hyla_model.h"
#include "hyla_runtime.h"
#include "hyla_snapshot.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Progress callback for long feeds: tokens done of total; return non-zero to cancel
 * (the feed stops at a chunk boundary with HYLA_ERR_CANCELLED, the session stays valid). */
typedef int (*hyla_progress_fn)(void *ud, int64_t done, int64_t total);

/* New empty session on rt at position 0 with greedy sampling and seed 0. Caller frees with
 * hyla_session_free. */
hyla_status hyla_session_create(hyla_runtime *rt, hyla_session **out);
void hyla_session_free(hyla_session *s); /* accepts NULL */

/* Sampling parameters and seed (re-seeds the RNG). */
void hyla_session_set_sampling(hyla_session *s, hyla_sampling params, uint64_t seed);
/* Sampling parameters only; the RNG stream continues. */
void hyla_session_set_sampling_params(hyla_session *s, hyla_sampling params);
hyla_sampling hyla_session_get_sampling(const hyla_session *s);

/* Feed n >= 1 tokens (see "pending token" above). logits: host [consumed][vocab] or NULL, one
 * row per consumed token (the pending one first, if any), where consumed = n - 1 + had_pending;
 * *consumed_out (may be NULL) receives that count. Token ids are checked against the vocab.
 * On a pipeline's first stage without logits, the last pieces may return still posted to the
 * later stages (hyla_runtime.h): decode, step, export, import, free and hyla_runtime_finish wait
 * for them first, and a failure of theirs fails that call. */
hyla_status hyla_session_feed(hyla_session *s, const int32_t *tokens, int n, float *logits, int *consumed_out,
                              hyla_progress_fn progress, void *ud);

/* One decode step for B sessions of the same model (each must have a pending token): feed
 * it, sample the next token with the session's sampler and RNG (one draw each), make it pending.
 * out: host [B] sampled tokens; logits: host [B][vocab] or NULL. */
hyla_status hyla_session_decode(hyla_session *const *ss, int B, int32_t *out, float *logits);

/* ---- decode lanes ----
 * A pipeline's first stage may keep several decode steps in flight: each lane is a batch of
 * sessions whose step is posted to the later stages (hyla_session_decode_post: the held layers
 * run, the rows go downstream, nothing waits) and later collected (hyla_session_decode_collect:
 * wait for that step's logits, sample as hyla_session_decode does). While lane 0's step is in
 * the later stages, lane 1's runs here: consecutive steps overlap across the stages. A session
 * is in at most one posted lane; collect lanes in the order they were posted. Between a post
 * and its collect the lane's sessions have no pending token: do not feed, decode, export or free
 * them, and make no other decode or feed on the runtime (collect every lane first). Each lane
 * uses rows [row_off, row_off + B) of the runtime's scratch, made to hold `rows` rows; give every
 * lane the same `rows` and disjoint row ranges. The tokens are the bits hyla_session_decode
 * gives (rows are independent of their batch). Needs a downstream (hyla_runtime.h) and one GPU
 * per stage (not tensor-parallel), or the whole model on one device or one tensor-parallel
 * group: then post queues the whole step on the device(s) (nothing waits on a GPU) and collect
 * samples its logits, so the host may do other work (send the last step's tokens) while the
 * step runs. */
hyla_status hyla_session_decode_post(hyla_session *const *ss, int B, int lane, int row_off, int rows);
hyla_status hyla_session_decode_collect(hyla_session *const *ss, int B, int lane, int32_t *out);

/* Feed the pending token of each of B sessions through the decode path without sampling;
 * afterwards no token is pending. logits: host [B][vocab] or NULL. (Conformance tests and
 * scoring use it; generation uses hyla_session_decode.) */
hyla_status hyla_session_step(hyla_session *const *ss, int B, float *logits);

int64_t hyla_session_position(const hyla_session *s);   /* tokens consumed */
int32_t hyla_session_pending(const hyla_session *s);    /* -1 if none */
int64_t hyla_session_generated(const hyla_session *s);  /* tokens sampled so far */

/* The token log: the session keeps its last hyla_runtime_token_log() generated tokens
 * (HYLA_TOKEN_LOG_MAX by default, hyla_snapshot.h), in host memory, carried in every snapshot (export and import), so that a client can read
 * back tokens it did not receive. hyla_session_log_first: the generated index of the oldest one
 * kept (= generated when the log is empty). hyla_session_read_tokens copies into out (room for
 * max) the tokens with generated indices from, from + 1, ... (at most max, up to generated) and
 * returns their count: 0 when from is below the log's first or at/after generated. */
int64_t hyla_session_log_first(const hyla_session *s);
int hyla_session_read_tokens(const hyla_session *s, int64_t from, int max, int32_t *out);
const hyla_model *hyla_session_model(const hyla_session *s);
hyla_runtime *hyla_session_runtime(const hyla_session *s);
/* Bytes of state this session holds on the backend (recurrent + partitions + KV pages). */
uint64_t hyla_session_state_bytes(const hyla_session *s);

/* Snapshot of the whole session state (held layers only): hyla_session_export_begin followed
 * by hyla_session_export_end. Caller frees with hyla_snapshot_destroy before hyla_runtime_free
 * (see below). Waits for the backend's copies of the state. */
hyla_status hyla_session_export(hyla_session *s, hyla_snapshot **out);

/* An incremental export: as hyla_session_export, but the KV rows of the tokens below
 * base_position (0: none; at most the position) are left out, so the snapshot is partial
 * (hyla_snapshot.h: those parts' skip) and only a store put against a base version at
 * base_position or later takes it (hyla_store_rpc_put). A tensor-parallel session exports whole. */
hyla_status hyla_session_export_since(hyla_session *s, uint64_t base_position, hyla_snapshot **out);

/* ---- asynchronous export ----
 * An export that overlaps compute: begin queues, in the backend's stream order, device copies
 * of the mutable state (recurrent states, SSE partitions, conv tails) into staging memory and
 * device->host copies of the staging and of the immutable KV (the used bytes of the pages below
 * the position) into one pinned host buffer; it returns at once, without waiting for the
 * device. The session may then be fed, decoded and exported again; the snapshot is the state at
 * begin, bit for bit what hyla_session_export would have returned then.
 *
 * Rules: every export begun must end (hyla_session_export_end) before hyla_session_free of its
 * session (the copies read the session's KV pages; freeing earlier is a programmer error and
 * aborts). Snapshots from a session's exports hold buffers of the runtime's cache of pinned host
 * buffers: destroy them (on any thread) before hyla_runtime_free. begin/done/end run on the thread
 * that drives the runtime. */
typedef struct hyla_export hyla_export;
/* *out: caller finishes it with hyla_session_export_end. */
hyla_status hyla_session_export_begin(hyla_session *s, hyla_export **out);
/* The same, incremental (hyla_session_export_since). */
hyla_status hyla_session_export_begin_since(hyla_session *s, uint64_t base_position, hyla_export **out);
/* 1 when the copies have finished (end will not wait for the device), 0 while they run. */
int hyla_session_export_done(hyla_export *e);
/* Wait for the copies, free e and its staging memory. *out (may be NULL: the snapshot is
 * discarded) receives the snapshot; caller frees it with hyla_snapshot_destroy. On failure
 * *out is NULL and e is freed all the same. */
hyla_status hyla_session_export_end(hyla_export *e, hyla_snapshot **out);
/* A new session on rt from a snapshot. Refuses (HYLA_ERR_MISMATCH / HYLA_ERR_FORMAT) a snapshot
 * of another model (fingerprint), an unknown format version, or a part whose kind, dtype or
 * shape does not fit its layer, naming the layer and part. Paged parts (KV) in bf16/f16/f32 are
 * converted to the backend's KV dtype. Caller frees with hyla_session_free. */
hyla_status hyla_session_import(hyla_runtime *rt, const hyla_snapshot *snap, hyla_session **out);

/* ---- streaming import ----
 * A restore whose state arrives piece by piece (worker/hyla_restore.h decodes it from the store
 * while the device copies run). begin checks snap's meta and layout as hyla_session_import does
 * (the same refusals) and creates the session without reading any part's data; each
 * hyla_session_import_ranges call queues the device copies of n byte ranges, range k being
 * bytes [off[k], off[k] + len[k]) of snap->parts[part[k]].data, which must be final (verified)
 * by then; nothing waits for the device (ops->upload_begin). end checks that every byte of
 * every part was given once, converts and copies parts in another float dtype (a snapshot of
 * another backend), reads the token log, waits for the copies and returns the session.
 * snap is borrowed until end or abort, and the memory of its parts' data must not change or be
 * freed until then; memory from the backend's host_alloc (a runtime's snapshot buffers) is
 * copied by the device directly, anything else more slowly. A failed ranges call fails end too.
 * Driving thread. */
typedef struct hyla_import hyla_import;
/* *out: caller finishes it with hyla_session_import_end or _abort. */
hyla_status hyla_session_import_begin(hyla_runtime *rt, const hyla_snapshot *snap, hyla_import **out);
hyla_status hyla_session_import_ranges(hyla_import *im, int n, const uint32_t *part, const uint64_t *off,
                                       const uint64_t *len);
/* *out: caller frees with hyla_session_free. im is freed, on failure too. */
hyla_status hyla_session_import_end(hyla_import *im, hyla_session **out);
/* Waits for the queued copies, frees im and the session it was building (accepts NULL). */
void hyla_session_import_abort(hyla_import *im);

/* ---- pipeline stages ---- (hyla_runtime.h: the downstream callback of the first stage) */

/* Run R rows through this stage's layers for sessions ss (prefill: ss[0], R rows in one piece
 * that starts at a multiple of the model's prefill chunk or does not cross one, at most
 * HYLA_PREFILL_PIECE_MAX rows; decode: R sessions). hidden_in: host
 * [R][hidden_size]. logits: host [R][vocab] or NULL — filled by this stage when it holds the last
 * layer, else by its downstream. Positions advance by R (prefill) or 1 (decode). */
hyla_status hyla_stage_forward(hyla_session *const *ss, int R, int decode, const float *hidden_in, float *logits);
/* The same with the rows already in the runtime's stage input (hyla_runtime_stage_buffers of
 * ss[0]'s runtime, filled in stream order, e.g. by an NCCL receive); the logits, when
 * want_logits, are left in its stage logits buffer (in stream order), not copied to the host. */
hyla_status hyla_stage_forward_dev(hyla_session *const *ss, int R, int decode, int want_logits);

/* A micro-batch of a decode step (hyla_runtime.h): group `group` of `groups`, its R rows at
 * row_offset of a step of total_rows rows (groups 1: the whole step, row_offset 0). */
typedef struct {
    int group, groups, row_offset, total_rows;
} hyla_stage_group;

/* hyla_stage_forward of one micro-batch. The stage's buffers hold the whole step (its rows and
 * logits at the group's rows). A stage with a downstream posts the group under the same
 * numbering and finishes at the last group: the logits of every group of the step (host [R][vocab]
 * each, borrowed until then) are filled when the last group's call returns, not before. */
hyla_status hyla_stage_forward_group(hyla_session *const *ss, int R, int decode, const float *hidden_in, float *logits,
                                     const hyla_stage_group *g);
/* The same with the rows already at the group's rows of the stage input (hyla_stage_forward_dev);
 * the logits of the whole step are in the stage logits buffer, in stream order, once the last
 * group's call returns. */
hyla_status hyla_stage_forward_dev_group(hyla_session *const *ss, int R, int decode, int want_logits,
                                         const hyla_stage_group *g);

/* Sample the next token of s from host logits [vocab] with its sampler and RNG (one draw) and
 * make it pending; for drivers that obtain logits themselves. */
hyla_status hyla_session_sample_logits(hyla_session *s, const float *logits, int32_t *out);

/* An opaque tag the owner attaches to a session (e.g. its id in a server). Borrowed. */
void hyla_session_set_tag(hyla_session *s, void *tag);
void *hyla_session_tag(const hyla_session *s);

#ifdef __cplusplus
}
#endif
#endif
