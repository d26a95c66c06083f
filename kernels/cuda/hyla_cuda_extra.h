/* hyla_cuda_extra.h — CUDA-only entry points beyond the ops table, for hyla-bench and for a
 * runtime that batches prefill across sessions.
 *
 * They exist only in builds with the CUDA backend. Code that must also link without it can
 * declare them weak (`__attribute__((weak))`) and test the address: they live in the object
 * that holds hyla_cuda_backend_create, which every CUDA build links.
 * Each fails with HYLA_ERR_INVALID_ARG when given a backend that is not "cuda". */
#ifndef HYLA_CUDA_EXTRA_H
#define HYLA_CUDA_EXTRA_H

#include <stddef.h>
#include <stdint.h>

#include "hyla_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The GPU's name, SM count and memory (for benchmark records). */
hyla_status hyla_cuda_device_info(hyla_backend *be, char *name, size_t name_len, int *sm_count, double *mem_gib);

/* The kernel-form switches the backend was created with (docs/CUDA.md "Operator switches"), as
 * one line of name=value pairs, for benchmark records. */
hyla_status hyla_cuda_switches(hyla_backend *be, char *buf, size_t len);

/* The reference the projection target is measured against: a plain cuBLAS bf16 GEMM
 * (bf16 A, B and C, fp32 accumulation) of M x N x K on random data, `iters` times after a
 * warm-up. *ms receives the median time of one GEMM. */
hyla_status hyla_cuda_bench_gemm_bf16(hyla_backend *be, int M, int N, int K, int iters, double *ms);

/* Chunked GLA (gdn = 0: ga = gk [tok][H][dk]) or GDN (gdn = 1: ga = g, gb = beta [tok][H])
 * prefill of nseq sequences packed in one buffer: sequence z is tokens
 * [start[z], start[z] + len[z]) with state S[z] ([H][dk][dv] fp32, updated). One launch pair
 * for all sequences. start, len, S: host arrays [nseq]; the rest device pointers. */
hyla_status hyla_cuda_prefill_varlen(hyla_backend *be, int gdn, int H, int dk, int dv, float scale, const float *q,
                                     const float *k, const float *v, const float *ga, const float *gb, float *o,
                                     int nseq, const int32_t *start, const int32_t *len, float *const *S);

/* SSE prefill chunking: on (default) = a partition's subsequence is cut at the call's windows
 * (sse_prefill's window: the layer's prefill_window) and every 64 rows within one, so a call
 * equals its window-aligned pieces bit for bit (as on the CPU backend); off = plain 64-token
 * chunks of the subsequence (fewer, fuller chunks for long calls; equal to the token loop up to
 * rounding, but the bits depend on where the runtime cuts a prompt). */
hyla_status hyla_cuda_set_sse_windows(hyla_backend *be, int on);

/* Flash attention prefill: calls whose keys reach past `keys` (a multiple of 64; 0 = one pass;
 * default 8192) cut them into splits at absolute key positions, merged per row. Part of what
 * the bits of a prefill depend on (keep it the same wherever a session may resume); a row gives
 * the same bits in calls of any size under one setting. */
hyla_status hyla_cuda_set_attn_split(hyla_backend *be, int keys);
/* Flash attention prefill calls whose keys reach past a split, without a window, on k_attn_wg:
 * with at least min_blocks blocks of 64 queries over the heads, each block runs all its rows'
 * splits and merges them itself; with fewer, a block per split writes partials that a second
 * kernel merges. The same arithmetic in the same order: the same bits either way, only the time
 * differs. 0: never; default 16 blocks per SM (HYLA_CUDA_ATTN_WALK in the environment sets it at
 * start). */
hyla_status hyla_cuda_set_attn_walk(hyla_backend *be, int min_blocks);
/* Flash attention prefill at head dims 64 and 128 on Hopper's warpgroup products (on: the default on
 * compute capability 9.x, where alone it takes effect; HYLA_CUDA_ATTN_WG=0 in the environment
 * starts a backend with it off) or on the mma.sync kernel. Each is piece-invariant; they agree
 * within rounding (an ulp or two), not bit for bit, so keep one setting wherever a session may
 * resume. */
hyla_status hyla_cuda_set_attn_wg(hyla_backend *be, int on);
/* k_attn_wg's two-warpgroup form (D = 128, no window, calls of 2048 queries and more) for calls
 * whose queries see at least min_keys keys on average, pos0 + n / 2; 0 turns it off. The default
 * 8192 (HYLA_CUDA_ATTN_WG2 in the environment sets it at start, 0 off) keeps the one-warpgroup
 * form where that is faster. Both forms give the same bits. */
hyla_status hyla_cuda_set_attn_wg2(hyla_backend *be, int min_keys);
/* The fewest decode rows the warpgroup linear (k_gemm_wg) takes, 1..256 (default 33; the same
 * bits whichever kernel runs). HYLA_CUDA_GEMM_WG_MIN in the environment, when set, wins: the call
 * then changes nothing. Tensor-parallel groups set 65 for their ranks (worker/hyla_tp.c). */
hyla_status hyla_cuda_set_gemm_wg_min(hyla_backend *be, int rows);
/* CUDA graphs for repeated op sequences (docs/CUDA.md "Graphs"): on by default
 * (HYLA_CUDA_GRAPHS=0 in the environment turns them off at creation). Results are the same
 * bits either way; off launches every kernel one by one (for comparisons). */
hyla_status hyla_cuda_set_graphs(hyla_backend *be, int on);
/* Make be's GPU the calling thread's current device (a thread that drives a backend it did not
 * create calls it first). */
hyla_status hyla_cuda_bind_thread(hyla_backend *be);
/* Launch what the graph log holds (nothing waits): before a thread waits for another thread
 * whose GPU may need this GPU's logged work (tensor-parallel ranks, worker/hyla_tp.c). */
hyla_status hyla_cuda_flush(hyla_backend *be);

typedef struct {
    uint64_t segments;         /* flushed op sequences */
    uint64_t ops;              /* ops logged in them */
    uint64_t replays;          /* segments run as one graph launch */
    uint64_t captures;         /* graphs captured and instantiated */
    uint64_t capture_failures; /* captures abandoned (the segment ran op by op) */
    uint64_t eager_segments;   /* segments run op by op */
    uint64_t evictions;        /* graphs dropped from the cache */
    uint32_t cached;           /* graphs held now */
} hyla_cuda_graph_stats;
hyla_status hyla_cuda_get_graph_stats(hyla_backend *be, hyla_cuda_graph_stats *out);

/* ---- Peer sums (hyla_cuda_psum.cu): a tensor-parallel group's sum over the GPUs of one process
 * by peer copies (copy engines, no SMs) and one small addition kernel per rank: the sum that
 * travels while the GPUs compute. Each float of the result is the rank-order sum of the ranks'
 * partials, the same bits on every rank whatever the count. A sum is numbered (seq, from 0, in
 * the same order on every rank) and made of three calls per rank, each on the rank's own thread:
 *   ready(seq, buf, acc, n): buf [n] (device, the rank's partial, complete after the ops called so
 *     far on its compute stream) is summed in place, or with acc (device [n], or NULL) added onto
 *     acc on every rank (acc + sum, one rounding; buf's contents then unspecified);
 *   issue(seq): after EVERY rank's ready(seq): queues this rank's share on its side stream;
 *   join(seq): after EVERY rank's issue(seq): the compute stream waits for the whole sum in buf
 *     or acc (call it before anything reads or writes buf or acc again).
 * Sums seq and seq + HYLA_PSUM_SLOTS must not be in flight at once. Open fails where a GPU cannot
 * reach another's memory (no peer access). oneshot_max: the most floats a one-shot sum (below)
 * takes (0: none). */
#define HYLA_PSUM_SLOTS 4
typedef struct hyla_cuda_psum hyla_cuda_psum;
hyla_status hyla_cuda_psum_open(hyla_backend *const *be, int T, size_t oneshot_max, hyla_cuda_psum **out);
hyla_status hyla_cuda_psum_ready(hyla_cuda_psum *p, int rank, unsigned seq, float *buf, float *acc, size_t n);
hyla_status hyla_cuda_psum_issue(hyla_cuda_psum *p, int rank, unsigned seq);
hyla_status hyla_cuda_psum_join(hyla_cuda_psum *p, int rank, unsigned seq);
/* After a failure left the ranks at different numbers: wait until every rank's streams are
 * idle and count the one-shot sums from 0 again (the caller numbers the peer sums from 0 on
 * every rank). No rank may be inside a sum. */
void hyla_cuda_psum_reset(hyla_cuda_psum *p);
/* A sum waited for at once, as an op of the rank's compute stream (logged into CUDA graphs):
 * x [n] += the rank-order sum of every rank's exchange buffer j (0 or 1; n <= oneshot_max, a
 * multiple of 4, x 16-byte aligned), where the rank's partial was written in place
 * (hyla_cuda_psum_oneshot_buf): the peer sums' bits added onto x. Peers read a rank's buffer j
 * while they sum, so a rank's consecutive one-shot sums must alternate j, the same j on every
 * rank. Every rank must call it, in the same order as its other sums, and no rank's thread may
 * make a CUDA call that waits for another GPU between reaching it and queueing it (sequence the
 * calls as worker/hyla_tp.c does). The launch waits on the device for every rank's. */
hyla_status hyla_cuda_psum_oneshot(hyla_cuda_psum *p, int rank, int j, float *x, size_t n);
/* The rank's exchange buffer j (0 or 1) of oneshot_max floats, device memory the group owns
 * (NULL: no one-shot sums). */
float *hyla_cuda_psum_oneshot_buf(hyla_cuda_psum *p, int rank, int j);
/* One-shot sums of at least `floats` floats take the push form (each rank stores its partial
 * into the others' buffers, then adds locally; two kernels), smaller ones the pull form (one
 * kernel reading the peers' partials over NVLink); the same bits either way. Default 131072
 * (512 KiB); set before the first sum. */
void hyla_cuda_psum_set_push_min(hyla_cuda_psum *p, size_t floats);
size_t hyla_cuda_psum_oneshot_max(const hyla_cuda_psum *p);
void hyla_cuda_psum_close(hyla_cuda_psum *p);

/* ---- NCCL links (hyla_cuda_nccl.cu): processes on one host exchanging device buffers ----
 * Whether this build has NCCL (1) or not (0; the functions below then fail with
 * HYLA_ERR_UNSUPPORTED). */
int hyla_cuda_nccl_built(void);
#define HYLA_NCCL_ID_BYTES 128
typedef struct hyla_nccl_link hyla_nccl_link;
/* A new unique id for a link; one side makes it and hands it to every other side. */
hyla_status hyla_cuda_nccl_id(uint8_t id[HYLA_NCCL_ID_BYTES]);
/* Join link `id` as `rank` of `nranks` on be's device. Waits (at most timeout_ms) until every
 * rank has joined. Caller frees with hyla_cuda_nccl_close. */
hyla_status hyla_cuda_nccl_open(hyla_backend *be, const uint8_t id[HYLA_NCCL_ID_BYTES], int nranks, int rank,
                                int timeout_ms, hyla_nccl_link **out);
/* Queue a send of `bytes` at device address dev to rank `peer` (or a receive from it) on be's
 * compute stream, after every op called before. Completes in stream order (the next download
 * or sync sees it done); a peer must post the matching call, sends and receives between two
 * ranks pair in call order. */
hyla_status hyla_cuda_nccl_send(hyla_backend *be, hyla_nccl_link *l, const void *dev, size_t bytes, int peer);
hyla_status hyla_cuda_nccl_recv(hyla_backend *be, hyla_nccl_link *l, void *dev, size_t bytes, int peer);
/* A receive beside the compute stream: queued on the link's own stream after every op called
 * before on the compute stream (so it pairs in call order like the others), but the ops called
 * after it on the compute stream do not wait for it. *ticket names it for hyla_cuda_nccl_join,
 * which makes the compute stream wait for it (call it before anything reads dev). At most
 * HYLA_NCCL_ASIDE receives may be unjoined at once. */
#define HYLA_NCCL_ASIDE 8
/* Sample B rows of logits (device, written by receives beside the compute stream) on the
 * link's side stream, as the backend's sample op does (same kernel, same bits); waits for it. */
hyla_status hyla_cuda_nccl_sample_aside(hyla_backend *be, hyla_nccl_link *l, const float *logits, int B, int V,
                                        const hyla_sampling *params, const float *u, int32_t *out);
hyla_status hyla_cuda_nccl_recv_aside(hyla_backend *be, hyla_nccl_link *l, void *dev, size_t bytes, int peer, int *ticket);
hyla_status hyla_cuda_nccl_join(hyla_backend *be, hyla_nccl_link *l, int ticket);
/* Queue an in-place sum of dev [n] floats over every rank of the link on be's compute stream,
 * after every op called before (tensor parallelism); every rank must post it with the same n.
 * Every rank receives the same bits. */
hyla_status hyla_cuda_nccl_allreduce(hyla_backend *be, hyla_nccl_link *l, float *dev, size_t n);
/* Who be's GPU is, for deciding whether two processes can share a link: *host gets the host's
 * identity (boot id and host name), *dev the GPU's PCI bus id. */
hyla_status hyla_cuda_nccl_peer_key(hyla_backend *be, char *host, size_t host_len, char *dev, size_t dev_len);
/* Abort and free the link (accepts NULL); operations in flight on it are abandoned. */
void hyla_cuda_nccl_close(hyla_nccl_link *l);

#ifdef __cplusplus
}
#endif
#endif
