/* hyla_tp.h — tensor parallelism inside one process (docs/MULTIGPU.md §2).
 *
 * A group of T ranks: rank t is a shard model (hyla_model_params tp_rank t of tp_size T, its
 * heads and MLP columns) on its own backend, with its own runtime; T threads drive the ranks in
 * lockstep, and the runtimes' allreduce hooks sum each block's partial output over the group
 * (NCCL between GPUs; on the CPU backend a host sum in rank order). The residual stream, the
 * norms and the head are replicated and every rank receives the same bits from each sum, so
 * every rank holds the same logits: rank 0's are used, nothing is broadcast.
 *
 * Sessions are made on rank 0's runtime with the ordinary calls (hyla_session.h): such a
 * session holds one session per rank (its heads' state) and runs every forward on all ranks
 * (hyla_tp_run); sampling, the pending token and the token log are rank 0's. Its snapshots are
 * whole-model snapshots (each part with the whole layer's shape, heads in order: the ranks'
 * exports joined by hyla_tp_snapshot_merge), and it imports whole-model snapshots (cut by
 * hyla_tp_snapshot_split), so a conversation moves between splits and to an unsplit model. The
 * numbers are not the unsplit model's bits: a sum over ranks rounds differently from one
 * accumulation (logits within the GPU-vs-GPU tolerance); the bit-exact promises (batching,
 * prefill pieces, pause/resume) hold within one split. A pipeline stage (a layer range) can be
 * split too: its rows arrive on the host and every rank takes them; rank 0 hands its rows to the
 * next stage.
 *
 * Threading: a group is created, run and freed by one thread; hyla_tp_run calls fn on T threads
 * (rank 0 on the caller's). */
#ifndef HYLA_TP_H
#define HYLA_TP_H

#include "hyla_model.h"
#include "hyla_runtime.h"
#include "hyla_snapshot.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HYLA_TP_MAX 8

typedef struct hyla_tp_group hyla_tp_group;

/* A group over rts[0..T-1] (rank t's runtime, on shard t of T of one model; 2 <= T <=
 * HYLA_TP_MAX; every backend "cpu", or every one "cuda" on distinct GPUs of a build with
 * NCCL). Installs the runtimes' allreduce hooks (removed by hyla_tp_group_free); on GPUs, unless
 * HYLA_PREFILL_PIECE is set, raises the runtimes' prefill piece to T times the backend's (up to
 * HYLA_PREFILL_PIECE_MAX). Caller frees with hyla_tp_group_free before the runtimes. */
hyla_status hyla_tp_group_create(hyla_runtime *const *rts, int T, hyla_tp_group **out);
void hyla_tp_group_free(hyla_tp_group *g); /* accepts NULL */
int hyla_tp_size(const hyla_tp_group *g);

/* Load model dir as T shards, one per backend (device "cpu": T CPU backends; "cuda:K": GPUs K
 * .. K+T-1), a runtime each, joined in a group that owns them all. params: NULL or with the
 * whole layer range (tp_rank/tp_size are set here). Rank 0's backend, model and runtime
 * (hyla_tp_backend etc., borrowed) drive sessions. Caller frees with hyla_tp_close. */
hyla_status hyla_tp_open(const char *dir, const char *device, int T, const hyla_model_params *params, hyla_tp_group **out);
void hyla_tp_close(hyla_tp_group *g); /* accepts NULL; every session on it freed first */
hyla_backend *hyla_tp_backend(const hyla_tp_group *g);
hyla_model *hyla_tp_model(const hyla_tp_group *g);
hyla_runtime *hyla_tp_runtime(const hyla_tp_group *g);
/* Rank r's backend and runtime (borrowed; e.g. to set each rank's CUDA graph mode). */
hyla_backend *hyla_tp_rank_backend(const hyla_tp_group *g, int r);
hyla_runtime *hyla_tp_rank_runtime(const hyla_tp_group *g, int r);

/* Run fn(ud, rank) for every rank at once, each on its own thread (bound to its rank's GPU),
 * and wait for all. When a rank fails, the others' pending sums fail too ("another rank
 * failed") and the first failure is returned with its message; the ranks' sessions may then
 * differ in position and must be freed. */
typedef hyla_status (*hyla_tp_fn)(void *ud, int rank);
hyla_status hyla_tp_run(hyla_tp_group *g, hyla_tp_fn fn, void *ud);

/* The whole-model snapshot of the T ranks' exports shards[0..T-1] (models[t]: rank t's shard
 * model; session metadata and the token log from rank 0). Caller frees with
 * hyla_snapshot_destroy. HYLA_ERR_MISMATCH when the shards' parts do not fit their models. */
hyla_status hyla_tp_snapshot_merge(const hyla_model *const *models, const hyla_snapshot *const *shards, int T,
                                   hyla_snapshot **out);
/* The same merge into one arena from rt's export buffers (rank 0's runtime: reused pinned
 * memory, hyla_exportbuf_get), as an export's own snapshot is: the same bytes. */
hyla_status hyla_tp_snapshot_merge_into_export(hyla_runtime *rt, const hyla_model *const *models,
                                               const hyla_snapshot *const *shards, int T, hyla_snapshot **out);
/* Rank `shard`'s part of a whole-model snapshot (its heads' slice of every split part of the
 * layers it holds), ready for hyla_session_import on that shard's runtime. HYLA_ERR_MISMATCH, naming layer and
 * part, when `whole` is not a snapshot of this model's whole layers. Caller frees with
 * hyla_snapshot_destroy. */
hyla_status hyla_tp_snapshot_split(const hyla_model *shard, const hyla_snapshot *whole, hyla_snapshot **out);
/* The same cut for rt's model into one arena from rt's export buffers (reused pinned memory the
 * import uploads from); destroy it before rt is freed. */
hyla_status hyla_tp_snapshot_split_for_import(hyla_runtime *rt, const hyla_snapshot *whole, hyla_snapshot **out);

#ifdef __cplusplus
}
#endif
#endif
