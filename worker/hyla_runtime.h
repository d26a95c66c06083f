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

/* A runtime for m. The prefill piece starts at HYLA_PREFILL_PIECE_DEFAULT, or the environment
 * variable HYLA_PREFILL_PIECE read here (refused by name when invalid). Caller frees with
 * hyla_runtime_free. */
hyla_status hyla_runtime_create(const hyla_model *m, hyla_runtime **out);
void hyla_runtime_free(hyla_runtime *rt); /* accepts NULL */
const hyla_model *hyla_runtime_model(const hyla_runtime *rt);

/* Tokens a prefill forward pass takes at most (docs/MODELS.md §3.1): a multiple of
 * HYLA_PREFILL_CHUNK in [HYLA_PREFILL_CHUNK, HYLA_PREFILL_PIECE_MAX]. Larger pieces run the
 * projections as larger GEMMs; the results are the same bits for any piece size (pieces stay
 * aligned to chunk boundaries and every op's rows are independent of how many it gets).
 * Scratch memory grows with it (activations of that many rows, logits included). */
hyla_status hyla_runtime_set_prefill_piece(hyla_runtime *rt, int tokens);
int hyla_runtime_prefill_piece(const hyla_runtime *rt);

/* Generated tokens each session of this runtime keeps in its token log (hyla_session.h), 1 ..
 * HYLA_TOKEN_LOG_MAX (the default: one whole Generate at its largest max_tokens); sessions created
 * or imported afterwards use it (an imported log longer than it keeps its last tokens). */
hyla_status hyla_runtime_set_token_log(hyla_runtime *rt, int tokens);
int hyla_runtime_token_log(const hyla_runtime *rt);

/* ---- pipeline stages ----
 * A model loaded with a layer range is one stage. The first stage drives sessions with
 * hyla_session_feed/decode as usual (pending token, sampler and RNG live there); when its model
 * does not hold the last layer, the forward hands the hidden states to `downstream`, which runs
 * the remaining stages (e.g. over gRPC to the next worker) and returns the logits when asked.
 * Other stages run hyla_stage_forward on their own sessions of the same conversation.
 *
 * downstream: ss are the first stage's sessions (prefill: ss[0] only, R consecutive rows starting
 * at hyla_session_position(ss[0]); decode: R sessions, one row each, at their positions);
 * hidden: host [R][hidden_size]; logits: host [R][vocab] to fill, or NULL when not needed. */
typedef hyla_status (*hyla_downstream_fn)(void *ud, hyla_session *const *ss, int R, int decode, const float *hidden,
                                          float *logits);
void hyla_runtime_set_downstream(hyla_runtime *rt, hyla_downstream_fn fn, void *ud);

/* A downstream that takes the backend's own buffers (NCCL between GPUs of one host), tried
 * before the host one each time the forward hands rows on: it sets *handled = 1 when it moved
 * them (and the logits), or leaves it 0 to let `downstream` run this step (hidden and logits are
 * then copied through the host). hidden_dev: backend buffer [R][hidden_size], this stage's
 * output; logits_dev: backend buffer [R][vocab] to fill in stream order, or NULL. ud is the one
 * given to hyla_runtime_set_downstream. */
typedef hyla_status (*hyla_downstream_dev_fn)(void *ud, hyla_session *const *ss, int R, int decode,
                                              const float *hidden_dev, float *logits_dev, int *handled);
void hyla_runtime_set_downstream_dev(hyla_runtime *rt, hyla_downstream_dev_fn fn);

/* ---- tensor parallelism ----
 * A runtime on a tensor-parallel shard (hyla_model_params.tp_size > 1) produces, after each
 * mixer and each MLP, only its heads' part of the block's output: `fn` must sum buf [n] floats
 * (backend memory) over the group's ranks in place, in the backend's stream order, the same bits
 * on every rank (hyla_tp.h makes one). Called twice per layer with the same count on each rank. */
typedef hyla_status (*hyla_allreduce_fn)(void *ud, float *buf, size_t n);
void hyla_runtime_set_allreduce(hyla_runtime *rt, hyla_allreduce_fn fn, void *ud);

/* The backend buffers a later stage's rows go through, made to hold `rows` rows: *x_dev
 * [rows][hidden_size] (the input of hyla_stage_forward_dev) and *logits_dev [rows][vocab] (its
 * logits). Borrowed until the next call that reserves rows on rt (a forward of more rows). */
hyla_status hyla_runtime_stage_buffers(hyla_runtime *rt, int rows, float **x_dev, float **logits_dev);

#ifdef __cplusplus
}
#endif
#endif
