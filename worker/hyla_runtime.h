/* hyla_runtime.h — what sessions of a model run on: scratch activations, the cache of pinned
 * snapshot buffers, the prefill piece size and, for a pipeline stage, the callback to the
 * remaining stages.
 *
 * The model (hyla_model.h) is immutable config + weights; everything a forward pass writes
 * besides session state lives here. One runtime per model per driving thread (a worker has
 * one); sessions are created on a runtime and run on it (hyla_session.h).
 *
 * Ownership: hyla_runtime_create borrows the model (it must outlive the runtime); the caller
 * frees the runtime with hyla_runtime_free after every session on it and every snapshot
 * exported from them (snapshot buffers come from the runtime's cache). Threading: driven by
 * one thread, the one that drives the model's backend; exported snapshots may be destroyed on
 * any thread. */
#ifndef HYLA_RUNTIME_H
#define HYLA_RUNTIME_H

#include "hyla_model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hyla_runtime hyla_runtime;
typedef struct hyla_session hyla_session;

/* A runtime for m. The prefill piece starts at the backend's preferred piece (hyla_backend's
 * prefill_piece: 16384 on CUDA) or else HYLA_PREFILL_PIECE_DEFAULT, or the environment variable
 * HYLA_PREFILL_PIECE read here (refused by name when invalid); a GPU tensor-parallel group
 * raises its ranks' default (hyla_tp.h). Caller frees with hyla_runtime_free. */
hyla_status hyla_runtime_create(const hyla_model *m, hyla_runtime **out);
void hyla_runtime_free(hyla_runtime *rt); /* accepts NULL */
const hyla_model *hyla_runtime_model(const hyla_runtime *rt);

/* Tokens a prefill forward pass takes at most (docs/MODELS.md §3.1): a multiple of the model's
 * prefill chunk (HYLA_PREFILL_CHUNK, or its SSE layers' prefill_window) up to
 * HYLA_PREFILL_PIECE_MAX (refused otherwise, naming the chunk). Larger pieces run the
 * projections as larger GEMMs; the results are the same bits for any piece size (pieces stay
 * aligned to chunk boundaries and every op's rows are independent of how many it gets).
 * Scratch memory grows with it (activations of that many rows; logits only for the rows whose
 * logits a caller asks for: a decode batch, a piece fed with a logits buffer). */
hyla_status hyla_runtime_set_prefill_piece(hyla_runtime *rt, int tokens);
/* The model's prefill chunk (hyla_model_config.prefill_chunk): pieces start at its multiples. */
int hyla_runtime_prefill_chunk(const hyla_runtime *rt);
int hyla_runtime_prefill_piece(const hyla_runtime *rt);
/* Rows of logits the scratch holds now (0 until a step wanted logits; for tests and diagnostics). */
int hyla_runtime_logit_rows(const hyla_runtime *rt);
/* Device bytes of the runtime's scratch now: activations, the mixers' scratch and logits (the
 * logits' share in *logits_bytes, when given). The backend's own buffers (GEMM operands, graph
 * parameter blocks) are not counted. hyla-bench e2e reports it. */
size_t hyla_runtime_scratch_bytes(const hyla_runtime *rt, size_t *logits_bytes);

/* Generated tokens each session of this runtime keeps in its token log (hyla_session.h), 1 ..
 * HYLA_TOKEN_LOG_MAX (the default: one whole Generate at its largest max_tokens); sessions created
 * or imported afterwards use it (an imported log longer than it keeps its last tokens). */
hyla_status hyla_runtime_set_token_log(hyla_runtime *rt, int tokens);
int hyla_runtime_token_log(const hyla_runtime *rt);

/* ---- pipeline stages ----
 * A model loaded with a layer range is one stage. The first stage drives sessions with
 * hyla_session_feed/decode as usual (pending token, sampler and RNG live there); when its model
 * does not hold the last layer, the forward hands the hidden states to the downstream, which runs
 * the remaining stages (e.g. over gRPC to the next worker) and returns the logits when asked.
 * Other stages run hyla_stage_forward on their own sessions of the same conversation.
 *
 * The downstream is asynchronous: the forward POSTS each step (this stage's rows; it does not
 * wait) and FINISHES when it needs the answers (the logits, or later stages at rest). A decode
 * step of R >= 16 rows is cut into micro-batches (hyla_runtime_set_micro_batches): the layers
 * run on group g, the group is posted, then group g + 1, ..., and the step finishes; the next
 * stage works on group g while this one computes group g + 1. The pieces of one feed are posted
 * without waiting (at most HYLA_DOWNSTREAM_IN_FLIGHT unanswered) and, when they want no logits,
 * may stay posted after the feed returns, so the next scheduler step's work overlaps them; every
 * other session call that posts (decode, step) finishes before it returns, and those that need
 * the later stages at rest (export, import, free) finish first. */

#define HYLA_MICRO_BATCH_MAX 16      /* micro-batches of one decode step at most */
#define HYLA_MICRO_BATCH_MIN_ROWS 8  /* rows of a micro-batch at least (smaller batches: fewer groups) */
#define HYLA_DOWNSTREAM_IN_FLIGHT 4  /* posted prefill pieces unanswered at most */
#define HYLA_LANES_MAX 4             /* decode lanes of a first stage (hyla_session_decode_post) */

/* One posted step of the downstream: a micro-batch (a group) of a decode step, or a whole step.
 * ss: the group's sessions of the first stage (prefill: ss[0] only, R consecutive rows starting
 * at hyla_session_position(ss[0]); decode: R sessions, one row each, at their positions). */
typedef struct {
    hyla_session *const *ss;
    int R;                      /* the group's rows */
    int decode;
    int want_logits;            /* the step wants logits (every group of it says so) */
    int group, groups;          /* group g of M (0 of 1: a whole step; prefill pieces are whole steps) */
    int row_offset, total_rows; /* the group's first row within the step, and the step's rows */
    const float *hidden;        /* post: host [R][hidden_size]; post_dev: backend [R][hidden_size] */
    /* NULL: no logits wanted. post: host [R][vocab], filled by the time finish has read this
     * group's answer. post_dev: backend [total_rows][vocab] of the whole step, given with the
     * LAST group only, filled in stream order. */
    float *logits;
    /* post_dev of a decode lane: receive the logits beside the compute stream, so the layers of
     * the next lane are not queued behind them; finish, when it reads this step's answer, makes
     * the compute stream wait for them. */
    int logits_aside;
} hyla_downstream_step;

/* The remaining stages. post: send the group's rows; the step's answer is read by a later
 * finish (a failure here or there fails the step; the transport is closed as it sees fit).
 * post_dev (optional; NULL: host only): the same from backend buffers (NCCL between GPUs of one
 * host), tried for group 0 of each step: *handled = 1 when it took the group (the rest of the
 * step then goes through post_dev too), 0 to let post take the whole step (rows and logits then
 * cross the host). finish: wait for the answers of posted steps, in order, until at most `keep`
 * are unanswered; logits land where their posts asked. The hidden rows are read before post
 * returns (host) or in stream order (backend); the caller may reuse them afterwards. */
typedef struct {
    hyla_status (*post)(void *ud, const hyla_downstream_step *s);
    hyla_status (*post_dev)(void *ud, const hyla_downstream_step *s, int *handled);
    hyla_status (*finish)(void *ud, int keep);
    /* optional: sample B rows of a decode lane's logits where post_dev received them, beside
     * the compute stream (the backend's sample op, same bits), once finish has read the lane's
     * answer; waits for the tokens. NULL: the runtime samples on the compute stream. */
    hyla_status (*sample_aside)(void *ud, const float *logits, int B, int V, const hyla_sampling *sp, const float *u,
                                int32_t *out);
} hyla_downstream_ops;

/* ops is borrowed for the runtime's life (a static table); ud is handed to its functions. */
void hyla_runtime_set_downstream_ops(hyla_runtime *rt, const hyla_downstream_ops *ops, void *ud);

/* A synchronous downstream (runs the remaining stages at once): hidden: host [R][hidden_size];
 * logits: host [R][vocab] to fill, or NULL. Posts of a step call it group by group. */
typedef hyla_status (*hyla_downstream_fn)(void *ud, hyla_session *const *ss, int R, int decode, const float *hidden,
                                          float *logits);
void hyla_runtime_set_downstream(hyla_runtime *rt, hyla_downstream_fn fn, void *ud);

/* Micro-batches per decode step of a stage with a downstream: 1 .. HYLA_MICRO_BATCH_MAX (1:
 * off; default 2). A step of R rows runs min(M, R / HYLA_MICRO_BATCH_MIN_ROWS) groups (at least
 * one) of contiguous rows. The tokens are the same bits for any M (rows are independent). */
hyla_status hyla_runtime_set_micro_batches(hyla_runtime *rt, int m);
int hyla_runtime_micro_batches(const hyla_runtime *rt);

/* Wait for every posted step's answer (hyla_downstream_ops.finish with keep 0) and put the
 * logits where the forward wants them. A no-op when nothing is in flight. */
hyla_status hyla_runtime_finish(hyla_runtime *rt);

/* ---- tensor parallelism ----
 * A runtime on a tensor-parallel shard (hyla_model_params.tp_size > 1) produces, after each
 * mixer and each MLP, only its heads' part of the block's output: `fn` must sum buf [n] floats
 * (backend memory) over the group's ranks in place, in the backend's stream order, the same bits
 * on every rank (hyla_tp.h makes one). Called twice per layer with the same count on each rank. */
typedef hyla_status (*hyla_allreduce_fn)(void *ud, float *buf, size_t n);
void hyla_runtime_set_allreduce(hyla_runtime *rt, hyla_allreduce_fn fn, void *ud);
/* The same sum begun beside the backend's stream (optional, the same ud): queued in stream order
 * like fn's, but the ops called after it may run while it travels, until join(ud, *ticket),
 * which must come before anything reads or writes buf again. A hook that cannot overlap may sum
 * at once and give ticket -1 (join is then a no-op). With both set, a prefill piece of at least
 * two of the model's prefill chunks runs as two halves through the layers in turn (run_layers_wave in
 * hyla_runtime.c), each half's sums travelling while the other half computes; the bits are those
 * of the two halves fed as two pieces. acc (or NULL): the sum is added onto acc[0..n) on every rank
 * (each value the rounding of acc + the sum, the residual's add) instead of being left in buf,
 * whose contents are then unspecified; join must come before anything touches acc too. */
typedef hyla_status (*hyla_allreduce_begin_fn)(void *ud, float *buf, size_t n, float *acc, int *ticket);
typedef hyla_status (*hyla_allreduce_join_fn)(void *ud, int ticket);
void hyla_runtime_set_allreduce_aside(hyla_runtime *rt, hyla_allreduce_begin_fn begin, hyla_allreduce_join_fn join);
/* The sum waited for at once, onto the residual (optional, the same ud): the ranks write their
 * partials into two buffers the group owns, buf[0] and buf[1] (backend memory, up to max floats
 * each, where every rank's peers can read them), and onto(ud, j, x, n) adds the rank-order sum of
 * every rank's buf[j] onto x[0..n) (x + sum, the residual's add), in stream order, the same bits
 * on every rank. The runtime alternates j between consecutive sums (the peers may still read
 * buf[j] while the rank goes on) and resets it with hyla_runtime_reset_allreduce_onto. Sums of
 * more than max floats, or onto an x not 16-byte aligned, take fn. fn NULL: off. */
typedef hyla_status (*hyla_allreduce_onto_fn)(void *ud, int j, float *x, size_t n);
void hyla_runtime_set_allreduce_onto(hyla_runtime *rt, hyla_allreduce_onto_fn fn, float *buf0, float *buf1,
                                     size_t max);
void hyla_runtime_reset_allreduce_onto(hyla_runtime *rt);
/* How many prefill pieces ran as two halves with overlapped sums (above), since creation. */
long hyla_runtime_wave_pieces(const hyla_runtime *rt);

/* The backend buffers a later stage's rows go through, made to hold `rows` rows: *x_dev
 * [rows][hidden_size] (the input of hyla_stage_forward_dev; a micro-batch's rows at its row
 * offset) and *logits_dev [logit_rows][vocab] (its logits, at the same rows; logit_rows: rows
 * when the step wants logits, else 0). Borrowed until the next call that reserves rows on rt (a
 * forward of more rows). */
hyla_status hyla_runtime_stage_buffers(hyla_runtime *rt, int rows, int logit_rows, float **x_dev, float **logits_dev);

#ifdef __cplusplus
}
#endif
#endif
