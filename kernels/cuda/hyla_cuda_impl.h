/* hyla_cuda_impl.h — internals of the CUDA backend shared by its translation units
 * (kernels/cuda/*.cu). Not a public header: the public surface is hyla_ops.h
 * (hyla_cuda_backend_create) and hyla_cuda_pool.h (state pool and async snapshot copies).
 *
 * Invariants:
 *   - One context drives one device through one compute stream (ctx->stream); every kernel,
 *     memset and copy of an op is queued on it, so ops are ordered without host syncs.
 *   - Host arrays handed to ops (per-session state pointers, KV page tables, token ids,
 *     positions, sampler parameters) are staged into a pinned ring and copied to a device
 *     mirror of the ring on the same stream (cu_stage). The ring wraps after a stream sync.
 *   - Scratch buffers (cu_scratch) only grow; growing syncs the stream first.
 *   - Every CUDA/cuBLAS call goes through CU_TRY / CUBLAS_TRY (records expression, file, line
 *     into the thread's hyla error detail); every launch is followed by CU_LAUNCH_CHECK.
 * Threading: one thread drives one context (hyla_ops.h). */
#ifndef HYLA_CUDA_IMPL_H
#define HYLA_CUDA_IMPL_H

#include <cuda.h>
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include "hyla_ops.h"
#include "hyla_status.h"

/* ---- error checks ---- */
extern "C" hyla_status hyla_cuda_fail(cudaError_t e, const char *expr, const char *file, int line);
extern "C" hyla_status hyla_cublas_fail(cublasStatus_t e, const char *expr, const char *file, int line);

#define CU_TRY(expr)                                                        \
    do {                                                                    \
        cudaError_t cu_e_ = (expr);                                         \
        if (cu_e_ != cudaSuccess) return hyla_cuda_fail(cu_e_, #expr, __FILE__, __LINE__); \
    } while (0)
#define CUBLAS_TRY(expr)                                                    \
    do {                                                                    \
        cublasStatus_t cb_e_ = (expr);                                      \
        if (cb_e_ != CUBLAS_STATUS_SUCCESS) return hyla_cublas_fail(cb_e_, #expr, __FILE__, __LINE__); \
    } while (0)
/* After every kernel launch: a bad configuration or a sticky earlier fault becomes a status. */
#define CU_LAUNCH_CHECK(what) CU_TRY(cudaGetLastError())

#define HYLA_CU_SCRATCH_SLOTS 12
enum { SCR_LINEAR = 0, SCR_MISC = 1, SCR_CHUNK = 2, SCR_ATTN = 3, SCR_SSE = 4, SCR_SAMPLE = 5, SCR_BENCH = 6, SCR_XB = 7,
       SCR_PLAN = 8,
       /* Mamba2 (SSD) */
       SCR_SSD = 9,
       /* GLA key slabs (hyla_cuda_lin_slab.cu) */
       SCR_SLAB = 10,
       /* the narrow prompt linears' slice partials (cu_skinny_linear_xb) */
       SCR_NARROW = 11 };

typedef struct hyla_cu_pool hyla_cu_pool;     /* hyla_cuda_pool.cu */
typedef struct hyla_cu_graphs hyla_cu_graphs; /* hyla_cuda_graph.cu */

typedef struct {
    uint64_t key; /* M, N, K, ldy, accumulate hashed; 0 = empty */
    int M, N, K, ldy, acc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
    int has_algo;
    int derived; /* the algorithm is another plan's (gemm_plan's `from`), not this shape's heuristic */
    int cbf16;   /* C and D are bf16 (HYLA_LINEAR_Y_BF16), else fp32 */
} hyla_cu_gemm_plan;
#define HYLA_CU_GEMM_PLANS 512

typedef struct hyla_cuda_ctx {
    int device;
    int sm_count;
    size_t smem_optin; /* max dynamic shared memory per block (bytes) */
    cudaStream_t stream;      /* compute stream: every op */
    cudaStream_t copy_stream; /* snapshot/restore copies (hyla_cuda_pool.h) */
    cublasHandle_t cublas;
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t lt_desc;
    void *lt_workspace;
    size_t lt_workspace_bytes;
    hyla_cu_gemm_plan plans[HYLA_CU_GEMM_PLANS];

    /* staging ring for host arrays: pinned host + device mirror */
    uint8_t *ring_host;
    uint8_t *ring_dev;
    size_t ring_bytes, ring_off;

    /* pinned bounce buffers for upload/download (double buffered) */
    uint8_t *bounce[2];
    cudaEvent_t bounce_ev[2];
    size_t bounce_bytes;
    int bounce_next;

    /* readback buffer: pinned host memory mapped into the device's address space; small
     * device->host reads (sampled tokens, logits) are written into it by a kernel on the
     * compute stream, so they never queue behind a snapshot's copies on the copy engine */
    uint8_t *rb_host;
    void *rb_dev; /* the device's address of rb_host */
    size_t rb_bytes;
    /* sampling on another stream (hyla_cuda_sample_on): parameters, draws and tokens in pinned
     * host memory mapped into the device, so that stream needs no copy at all */
    uint8_t *so_host;
    void *so_dev;
    size_t so_bytes;

    void *scratch[HYLA_CU_SCRATCH_SLOTS];
    size_t scratch_bytes[HYLA_CU_SCRATCH_SLOTS];

    hyla_cu_pool *pool;
    hyla_cu_graphs *graphs;  /* op log and captured graphs (hyla_cuda_graph.cu) */
    int graphs_on;           /* log loggable ops and replay graphs (default; HYLA_CUDA_GRAPHS=0 at creation: off) */
    uint64_t scratch_gen;    /* bumped whenever a scratch buffer moves (graphs bake addresses in) */
    cudaEvent_t ev_compute;  /* upload/download: the copy stream waits for the compute stream ... */
    cudaEvent_t ev_copy;     /* ... and the compute stream for the copy stream */
    int sse_windows;        /* SSE prefill: a partition's chunks cut at the call's windows (default 1); 0: plain chunks */
    int attn_split_len;     /* flash prefill: keys per split (default 8192, 0 = one pass; a multiple of 64) */
    int attn_wg;            /* flash prefill at D = 64, 128 on k_attn_wg (Hopper; HYLA_CUDA_ATTN_WG=0: k_attn_flash2) */
    int attn_walk;          /* flash prefill: k_attn_wg walks all of a block's splits (no partials) in calls of at
                             * least this many blocks of 64 queries over the heads; 0: never (HYLA_CUDA_ATTN_WALK) */
    int attn_wg2;           /* k_attn_wg with two warpgroups a block for window-free calls of >= 2048 queries that see
                             * at least this many keys on average (pos0 + n / 2); 0: off (HYLA_CUDA_ATTN_WG2, 8192) */
    int hopper;             /* compute capability 9.x: the warpgroup (sm_90a) kernels can run */
    int prompt_blocks;      /* prompt rows: whole PROMPT_ROWS blocks per GEMM call (default 32, so a piece's whole
                             * blocks are one GEMM up to pieces of 32768;
                             * HYLA_CUDA_PROMPT_BLOCKS at creation, 1..64; the same bits) */
    int pdl;                /* the skinny linears may start before the kernel ahead of them ends (cu_launch_pdl;
                             * default; HYLA_CUDA_PDL=0 at creation: off, the same bits) */
    unsigned *sk_count;     /* device [HYLA_CU_SK_COUNTS], zero between launches: the skinny linears' slice
                             * arrivals per output tile (the last block of a tile sums the slices) */
    int gdn_pipe_vw;        /* k_gdn_pipe's value block: 0 = by the shape, or 64 / 128 (HYLA_CUDA_GDN_PIPE_VW) */
    int sk_cluster;         /* split skinny linears of this many rows and more sum their slices across a
                             * thread-block cluster (0: never; HYLA_CUDA_SK_CLUSTER, cu_skinny_cluster_init) */
    int sk_cluster_max;     /* ... up to this many rows (HYLA_CUDA_SK_CLUSTER_MAX, 64-256, default 128; above it
                             * k_gemm_big) */
    int gemm_wg;            /* decode rows of gemm_wg_min and more through k_gemm_wg (warpgroup products, the
                             * skinny kernel's bits; HYLA_CUDA_GEMM_WG=0: off) */
    int gemm_wg_min;        /* HYLA_CUDA_GEMM_WG_MIN (1-256, default 33; hyla_cuda_set_gemm_wg_min) */
    int gemm_wg_min_env;    /* gemm_wg_min came from the environment (the setter leaves it) */
    int gemm_wgp;           /* k_gemm_wgp (producer warp) from 65 rows (HYLA_CUDA_GEMM_WGP=0: k_gemm_wg only) */
    int gemm_wg_n64;        /* from 65 rows, outputs of blocks under half the SMs in 64 columns (HYLA_CUDA_GEMM_WG_N64=0: 128) */
    int decode_bf16;        /* decode norms write the warpgroup linears' bf16 rows (HYLA_CUDA_DECODE_BF16=0: fp32 rows) */
    int chunk_b_wg;         /* kernel B on warpgroup products for dk <= 128 (Hopper; HYLA_CUDA_CHUNK_B_WG=0: off) */
    int gla_tiles;          /* GLA's split form: k_gla_chunk_f for dk <= 128 (HYLA_CUDA_GLA_TILES=0: k_gla_chunk_a) */
} hyla_cuda_ctx;
#define HYLA_CU_SK_COUNTS 65536

struct hyla_weight {
    int rows, cols;
    __nv_bfloat16 *d; /* [rows][cols] bf16 */
    /* k_gemm_wg's tensor maps of d (boxes of 128, 256, 64, 32 and 48 rows: wg_map_slot), made
     * at first use; state 0 not yet, 1 made, -1 cannot be */
    CUtensorMap wg_map[5];
    int wg_map_state[5];
};

#ifdef __cplusplus
extern "C" {
#endif
/* Copy `bytes` of host memory into the staging ring and on to the device mirror (queued on
 * the stream); *dev receives the device address, valid for kernels queued after this call
 * until the ring wraps (the wrap syncs the stream, so queued readers are done). */
hyla_status cu_stage(hyla_cuda_ctx *c, const void *host, size_t bytes, void **dev);
/* Before several cu_stage calls whose results are used together: guarantees that stages
 * totalling `bytes` in `parts` calls do not wrap the ring (so none overwrites another). */
hyla_status cu_stage_reserve(hyla_cuda_ctx *c, size_t bytes, int parts);
/* Copy `bytes` of host memory through the staging ring to device memory `dev` (queued on the
 * stream; the host memory may be reused on return). */
hyla_status cu_stage_to(hyla_cuda_ctx *c, const void *host, size_t bytes, void *dev);
/* A scratch buffer of at least `bytes` (contents undefined), owned by the context. */
hyla_status cu_scratch(hyla_cuda_ctx *c, int slot, size_t bytes, void **out);

/* ---- ops implemented in the other translation units (signatures as in hyla_ops.h) ----
 * The ops table itself (hyla_cuda_ops_table) is in hyla_cuda_graph.cu: loggable ops go through
 * the graph log, every other op flushes the log first and then calls the function below. */
extern const hyla_ops hyla_cuda_ops_table;
hyla_status cu_upload(void *ctx, void *dst, const void *host_src, size_t bytes);
/* Device -> host through the mapped readback buffer when bytes fit it (a kernel on the compute
 * stream, after the work queued so far; complete on return), else as cu_download. */
hyla_status cu_readback(hyla_cuda_ctx *c, void *host_dst, const void *src, size_t bytes);
hyla_status cu_download(void *ctx, void *host_dst, const void *src, size_t bytes);
hyla_status cu_sync(void *ctx);
hyla_status cu_weight_create(void *ctx, const void *host, hyla_dtype dt, int rows, int cols, hyla_weight **out);
void cu_weight_destroy(void *ctx, hyla_weight *w);
void cu_destroy(void *ctx);
hyla_status cu_linear(void *ctx, const float *x, int ldx, int M, int K, const hyla_weight *W, const float *bias,
                      float *y, int ldy, int N, int accumulate);
/* HYLA_LINEAR_X_BF16 only with ldx == K, and without HYLA_LINEAR_PREFILL only alone, at rows that
 * take it (cu_decode_bf16_rows) and with no output of its own x; HYLA_LINEAR_Y_BF16 only with
 * HYLA_LINEAR_PREFILL, no accumulate, no bias, ldy == N (the logged op checks it when called) */
hyla_status cu_linear_flags_check(const hyla_cuda_ctx *c, int flags, const float *x, int ldx, int M, int K, int n,
                                  const hyla_linear_out *outs, int accumulate);
/* swiglu_linear's and gated_rmsnorm_linear's bf16 inputs only with HYLA_LINEAR_PREFILL (checked when logged too) */
hyla_status cu_fused_flags_check(const char *op, int flags);
hyla_status cu_linear_check(int ldx, int K, const hyla_weight *W, int ldy, int N);

/* graphs (hyla_cuda_graph.cu) */
hyla_status cu_graphs_create(hyla_cuda_ctx *c);
void cu_graphs_destroy(hyla_cuda_ctx *c); /* accepts c->graphs == NULL */
/* Launch the logged ops (as a graph or one by one). Every stream user outside the log calls it
 * first, so stream order equals call order. */
hyla_status cu_graph_flush(hyla_cuda_ctx *c);
/* A tensor-parallel one-shot sum of the ranks' exchange buffers j onto x (hyla_cuda_psum.cu):
 * logged into the graph log when it is on, else launched; cu_tp_sum launches it (os: the rank's
 * kernel arguments, stable). */
hyla_status cu_graph_tp_sum(hyla_cuda_ctx *c, const void *os, int j, float *x, size_t n);
hyla_status cu_tp_sum(hyla_cuda_ctx *c, const void *os, int j, float *x, size_t n);

/* Ops split into host preparation and a launch that reads its host arrays from device memory
 * already holding them ("_dev"), so a graph can read them from its own parameter block. */
hyla_status cu_embed_check(const hyla_weight *table, const int32_t *ids, int n);
hyla_status cu_embed_dev(hyla_cuda_ctx *c, const hyla_weight *table, const int32_t *d_ids, int n, float *out);
hyla_status cu_rope_dev(hyla_cuda_ctx *c, float *x, int n, int H, int D, const int32_t *d_pos, float theta);
hyla_status cu_short_conv_dev(hyla_cuda_ctx *c, float *x, int B, int n, int C, const float *w, const float *bias,
                              int K, float *const *d_tails, int act_silu);
/* 1 when every state pointer is 16-byte aligned (the 4-column recurrent kernel) */
int cu_states16(float *const *S, int B);
hyla_status cu_lin_decode_dev(hyla_cuda_ctx *c, int gdn, const float *q, const float *k, const float *v,
                              const float *ga, const float *gb, int B, int H, int dk, int dv, float scale,
                              float *const *d_S, int states16, float *o);
hyla_status cu_sse_decode_dev(hyla_cuda_ctx *c, hyla_sse_transition tr, const float *q1, const float *k1,
                              const float *q2, const float *k2, const float *v, const float *ga, const float *gb,
                              const float *betaa, const float *betab, const int32_t *idx, const float *w, int B,
                              int H, int dk, int dv, int N, int K, float scale, float *const *d_S0,
                              float *const *d_Sp, int states16, float *o);
hyla_status cu_attn_decode_plan(int B, int Hq, int Hk, int D, const int32_t *pos, const hyla_kv_view *kv, int window,
                                size_t *nptr, int *nsplit);
size_t cu_attn_decode_block_bytes(int B, size_t cap);
void cu_attn_decode_block(void *blk, int B, size_t cap, const int32_t *pos, const hyla_kv_view *kv);
hyla_status cu_attn_decode_dev(hyla_cuda_ctx *c, const float *q, const float *k, const float *v, int B, int Hq,
                               int Hk, int D, const void *d_blk, size_t cap, int page_tokens, int nsplit, int window,
                               float scale, float *o);

hyla_status cu_embed(void *ctx, const hyla_weight *table, const int32_t *ids, int n, float *out);
hyla_status cu_rmsnorm(void *ctx, const float *x, const float *w, float *y, int n, int D, float eps);
hyla_status cu_add_rmsnorm(void *ctx, float *residual, const float *x, const float *w, float *y, int n, int D,
                           float eps);
hyla_status cu_rmsnorm_bf16(void *ctx, float *residual, const float *x, const float *w, void *y, int n, int D,
                            float eps);
hyla_status cu_add(void *ctx, float *y, const float *x, size_t n);
hyla_status cu_swiglu(void *ctx, const float *gate, const float *up, float *out, size_t n);
hyla_status cu_silu(void *ctx, float *x, size_t n);
hyla_status cu_gla_gate(void *ctx, float *x, size_t n, float normalizer, float clamp_min);
hyla_status cu_softmax_rows(void *ctx, float *x, int rows, int cols);
hyla_status cu_l2norm_rows(void *ctx, float *x, int rows, int cols, float eps);
hyla_status cu_sse_maps(void *ctx, float *v, size_t nv, float *q0, float *q1, float *k0, float *k1, int rows, int cols,
                        int q_softmax, int k_softmax, int l2, float eps, float *g0, float *g1, size_t ng,
                        const float *gb0, const float *gb1, int nb, float normalizer, float clamp_min, int lora);
hyla_status cu_gdn_gates(void *ctx, const float *a, int a_stride, const float *b, int b_stride, const float *A_log,
                         const float *dt_bias, float *g, float *beta, int n, int H, int allow_neg);
hyla_status cu_rope(void *ctx, float *x, int n, int H, int D, const int32_t *pos, float theta);
hyla_status cu_short_conv(void *ctx, float *x, int B, int n, int C, const float *w, const float *bias, int K,
                          float *const *tails, int act_silu);
hyla_status cu_short_conv_multi(void *ctx, int m, const hyla_conv_part *p, int B, int n, int K, int act_silu);
/* tails16: every tail pointer is 16-byte aligned (cu_conv_tails16 of the host arrays) */
hyla_status cu_short_conv_multi_dev(hyla_cuda_ctx *c, int m, const hyla_conv_part *p, int B, int n, int K, int act_silu,
                                    int tails16);
int cu_conv_tails16(int m, const hyla_conv_part *p, int B);
hyla_status cu_short_conv_multi_check(int m, const hyla_conv_part *p, int K);
hyla_status cu_gated_rmsnorm(void *ctx, const float *o, const float *g, const float *w, float *y, int rows, int D,
                             float eps);
hyla_status cu_sample(void *ctx, const float *logits, int B, int V, const hyla_sampling *params, const float *u,
                      int32_t *out);
/* LTE (hyla_cuda_lte.cu) and NSA (hyla_cuda_nsa.cu) */
hyla_status cu_lte_score(void *ctx, const hyla_lte_params *p, const float *x, int T, int x0, float *r);
hyla_status cu_lte_prefill(void *ctx, const hyla_lte_params *p, const float *q, const float *k, const float *v, int n,
                           int Hq, int pos0, const hyla_lte_cache *c, float scale, float *o);
hyla_status cu_lte_decode(void *ctx, const hyla_lte_params *p, const float *q, const float *k, const float *v, int B,
                          int Hq, const int32_t *pos, const hyla_lte_cache *c, float scale, float *o);
hyla_status cu_nsa_prefill(void *ctx, const float *q, const float *k, const float *v, const float *g, int n, int Hq,
                           int Hk, int D, int pos0, const hyla_kv_view *kv, int block, int counts, int window,
                           float scale, float *o);
hyla_status cu_nsa_decode(void *ctx, const float *q, const float *k, const float *v, const float *g, int B, int Hq,
                          int Hk, int D, const int32_t *pos, const hyla_kv_view *kv, int block, int counts,
                          int window, float scale, float *o);
/* bf16 conversion of activations for cuBLAS (hyla_cuda_dense.cu) */
hyla_status cu_f32_to_bf16_rows(hyla_cuda_ctx *c, const float *x, int ldx, int M, int K, __nv_bfloat16 *out);
hyla_status cu_swiglu_bf16_rows(hyla_cuda_ctx *c, const float *g, const float *u, int ld, int M, int K,
                                __nv_bfloat16 *out);
hyla_status cu_swiglu_bf16in(hyla_cuda_ctx *c, const __nv_bfloat16 *g, const __nv_bfloat16 *u, size_t n,
                             __nv_bfloat16 *out);
hyla_status cu_gated_rmsnorm_bf16(hyla_cuda_ctx *c, const float *o, const float *g, const float *w, __nv_bfloat16 *y,
                                  int rows, int D, float eps);
hyla_status cu_gated_rmsnorm_bf16g(hyla_cuda_ctx *c, const float *o, const __nv_bfloat16 *g, const float *w,
                                   __nv_bfloat16 *y, int rows, int D, float eps);
hyla_status cu_gated_rmsnorm_linear(void *ctx, float *o, const float *gate, const float *w, int H, int D, float eps,
                                    int M, const hyla_weight *W, float *y, int N, int flags);
hyla_status cu_swiglu_linear(void *ctx, float *gate, const float *up, int M, int K, const hyla_weight *W, float *y, int N,
                             int flags);
hyla_status cu_add_bias_rows(hyla_cuda_ctx *c, float *y, int ldy, int M, int N, const float *bias);
/* batch-invariant linear for M <= 256 (hyla_cuda_gemm.cu) */
hyla_status cu_skinny_linear_xb(hyla_cuda_ctx *c, const __nv_bfloat16 *xb, int M, int K, int n,
                                const hyla_linear_out *outs, int accumulate);
hyla_status cu_skinny_linear(hyla_cuda_ctx *c, const float *x, int ldx, int M, int K, const hyla_weight *W,
                             const float *bias, float *y, int ldy, int N, int accumulate,
                             const float *up /* non-NULL (K % 8 == 0): x is silu(x) * up, as swiglu computes it */);
/* reads HYLA_CUDA_SK_CLUSTER and readies the cluster-sum kernels on this device (at creation) */
void cu_skinny_cluster_init(hyla_cuda_ctx *c);
/* several skinny linears of one x in one launch, the bits of separate calls (M <= 256) */
int cu_skinny_multi_ok(const hyla_cuda_ctx *c, int M, int K);
/* decode linears of at most this K take outputs of their own x or accumulate in one grouped
 * skinny launch up to HYLA_CU_SK_OWN_ROWS rows (cu_skinny_multi_own_x) */
#define HYLA_CU_SK_OWN_K 256
#define HYLA_CU_SK_OWN_ROWS 64
int cu_skinny_multi_own_x(const hyla_cuda_ctx *c, int M, int K);
hyla_status cu_skinny_linear_multi(hyla_cuda_ctx *c, const float *x, int ldx, int M, int K, int n,
                                   const hyla_linear_out *outs, int accumulate);
/* the same from x already rounded to bf16 rows [M][K] (more than 16 rows, no output of its own x) */
hyla_status cu_skinny_linear_multi_xb(hyla_cuda_ctx *c, const __nv_bfloat16 *xb, int M, int K, int n,
                                      const hyla_linear_out *outs, int accumulate);
/* M > 64 rows with the skinny kernel's bits at GEMM speed (k_gemm_big) */
int cu_gemm_big_ok(const hyla_cuda_ctx *c, int M, int K);
void cu_gemm_wg_init(hyla_cuda_ctx *c, int cc_major);
hyla_status cu_gemm_big(hyla_cuda_ctx *c, const float *x, int ldx, int M, int K, const hyla_weight *W,
                        const float *bias, float *y, int ldy, int N, int accumulate);
/* cu_gemm_big from x already rounded to bf16 rows [M][K] (a fused elementwise pass wrote them) */
hyla_status cu_gemm_big_xb(hyla_cuda_ctx *c, const __nv_bfloat16 *xb, int M, int K, const hyla_weight *W,
                           const float *bias, float *y, int ldy, int N, int accumulate);
hyla_status cu_gemm_big_multi(hyla_cuda_ctx *c, const float *x, int ldx, int M, int K, int n,
                              const hyla_linear_out *outs, int accumulate);
/* the same from x already rounded to bf16 rows [M][K] (the decode norm's) */
hyla_status cu_gemm_big_multi_xb(hyla_cuda_ctx *c, const __nv_bfloat16 *xb, int M, int K, int n,
                                 const hyla_linear_out *outs, int accumulate);
/* decode rows whose linears of K may take the norm's bf16 rows (hyla_ops.h decode_bf16_rows) */
int cu_decode_bf16_rows(const hyla_cuda_ctx *c, int M, int K);
hyla_status cu_linear_multi(void *ctx, const float *x, int ldx, int M, int K, int n, const hyla_linear_out *outs,
                            int accumulate, int flags);

/* linear attention (hyla_cuda_linattn.cu) */
hyla_status cu_gla_prefill(void *ctx, const float *q, const float *k, const float *v, const float *gk, int n, int H,
                           int dk, int dv, float scale, float *S, float *o);
hyla_status cu_gla_decode(void *ctx, const float *q, const float *k, const float *v, const float *gk, int B, int H,
                          int dk, int dv, float scale, float *const *S, float *o);
hyla_status cu_gdn_prefill(void *ctx, const float *q, const float *k, const float *v, const float *g,
                           const float *beta, int n, int H, int dk, int dv, float scale, float *S, float *o);
hyla_status cu_gdn_decode(void *ctx, const float *q, const float *k, const float *v, const float *g,
                          const float *beta, int B, int H, int dk, int dv, float scale, float *const *S, float *o);
hyla_status cu_gdn_decode_raw(void *ctx, float *q, float *k, const float *v, float *a, float *b, const float *A_log,
                              const float *dt_bias, int allow_neg, float eps, int B, int H, int dk, int dv, float scale,
                              float *const *S, float *o);
int cu_gdn_decode_raw_ok(const float *q, const float *k, const float *v, const float *o, int B, int H, int dk, int dv,
                         int states16);
hyla_status cu_gdn_decode_raw_dev(hyla_cuda_ctx *c, const float *q, const float *k, const float *v, const float *a,
                                  const float *b, const float *A_log, const float *dt_bias, int allow_neg, float eps,
                                  int B, int H, int dk, int dv, float scale, float *const *d_S, float *o);
hyla_status cu_sse_route(void *ctx, const float *logits, int n, int N, int K, int32_t *idx, float *w);
hyla_status cu_sse_prefill(void *ctx, hyla_sse_transition tr, const float *q1, const float *k1, const float *q2,
                           const float *k2, const float *v, const float *ga, const float *gb, const float *betaa,
                           const float *betab, const int32_t *idx, const float *w, int n, int H, int dk, int dv,
                           int N, int K, float scale, int window, float *S0, float *Sp, float *o);
hyla_status cu_sse_decode(void *ctx, hyla_sse_transition tr, const float *q1, const float *k1, const float *q2,
                          const float *k2, const float *v, const float *ga, const float *gb, const float *betaa,
                          const float *betab, const int32_t *idx, const float *w, int B, int H, int dk, int dv,
                          int N, int K, float scale, float *const *S0, float *const *Sp, float *o);

/* The batched recurrent (token-loop) kernel's arguments: B sessions x ntok tokens each, token
 * row = b * ntok + t. Partition 0 (plain GLA/GDN, or SSE's always-selected one) reads
 * q1,k1,ga,betaa and state S0[b]; with Sp != NULL (SSE) the sparse partitions read q2,k2,gb,
 * betab, the routes idx/w [row][K] and state Sp[b] [N][H][dk][dv]. S0, Sp: device arrays. */
typedef struct {
    int gdn, H, dk, dv, ntok, N, K;
    int states16; /* every state pointer is 16-byte aligned (enables the 4-column kernel) */
    float scale;
    const float *q1, *k1, *ga, *betaa;
    const float *q2, *k2, *gb, *betab;
    const float *v;
    float *o;
    float *const *S0;
    float *const *Sp;
    const int32_t *idx;
    const float *w;
    /* GDN decode from the raw projections (cu_gdn_decode_raw; 0 elsewhere): q1, k1 are l2-normalised
     * in the kernel (qk_eps), ga / betaa hold the gate projections a, b, turned into g, beta there
     * with A_log, dt_bias and allow_neg */
    int raw, allow_neg;
    float qk_eps;
    const float *A_log, *dt_bias;
} hyla_cu_linrec;

/* A linrec of partition 0 only (plain GLA/GDN: no SSE fields), every other field zero. */
static inline void cu_linrec_plain(hyla_cu_linrec *r, int gdn, int H, int dk, int dv, float scale, int ntok,
                                   const float *q, const float *k, const float *v, const float *ga,
                                   const float *betaa, float *o, float *const *S0, int states16) {
    memset(r, 0, sizeof *r);
    r->gdn = gdn;
    r->H = H;
    r->dk = dk;
    r->dv = dv;
    r->scale = scale;
    r->ntok = ntok;
    r->q1 = q;
    r->k1 = k;
    r->v = v;
    r->ga = ga;
    r->betaa = betaa;
    r->o = o;
    r->S0 = S0;
    r->states16 = states16;
}

/* One chunked linear-attention run over several sequences packed in one buffer (varlen):
 * sequence z has tokens [start[z], start[z]+len[z]) of q,k,v,ga,gb and state S[z]
 * (a device array of device pointers). gla: ga = gk [tok][H][dk], gb unused; gdn: ga = g,
 * gb = beta [tok][H]. Used by gla/gdn/sse prefill and by hyla-bench's batched prefill. */
typedef struct {
    int gdn;        /* 0 = GLA, 1 = GDN */
    int H, dk, dv;
    float scale;
    const float *q, *k, *v, *ga, *gb; /* packed over all sequences */
    float *o;
    int nseq;
    const int32_t *h_start, *h_len; /* host [nseq] */
    float *const *h_S;              /* host [nseq] device pointers to [H][dk][dv] */
    /* Optional explicit chunking (SSE windows): sequence z is cut into h_nck[z] chunks whose
     * lengths (each 1..64) follow in h_cklen, sequence after sequence. NULL: chunks of 64. */
    const int32_t *h_nck, *h_cklen;
} hyla_cu_linattn_batch;
hyla_status cu_linattn_prefill_batch(hyla_cuda_ctx *c, const hyla_cu_linattn_batch *b);
/* Whether the chunked (tensor-core) kernels run these dims (else the token loop). */
int cu_linattn_chunked_ok(hyla_cuda_ctx *c, int gdn, int H, int dk, int dv, int nseq);
/* The chunked kernels with their tables on the device: chunk c covers packed rows
 * [d_tok0[c], d_tok0[c] + d_len[c]); sequence z its chunks d_c0[z] .. + d_nc[z] and state d_S[z].
 * nrows: the rows q, k, v hold (0 = not known; the pipelined GDN pass then stages by rows instead
 * of by tensor-map copies, which must not read past the buffers).
 * NC: table entries (grid of kernel A). Entries no sequence lists may be padding with length 0:
 * kernel A computes an empty chunk for them and kernel B never reads it. */
hyla_status cu_linattn_chunked_dev(hyla_cuda_ctx *c, int gdn, int H, int dk, int dv, float scale, const float *q,
                                   const float *k, const float *v, const float *ga, const float *gb, float *o, int NC,
                                   int nseq, const int32_t *d_tok0, const int32_t *d_len, const int32_t *d_c0,
                                   const int32_t *d_nc, float *const *d_S, long long nrows);
/* SSE row map: packed rows r >= ndense are read from token src[r - ndense] / K with weight
 * w[src[...]] (q2, k2 times the weight; gates g2, GDN beta b2; v), instead of a gathered copy. */
typedef struct {
    const int32_t *src;
    int ndense, K;
    const float *w, *q2, *k2, *g2, *b2;
} hyla_cu_rowmap;
/* cu_linattn_chunked_dev with an optional row map (only where cu_lin_fused_ok). */
hyla_status cu_linattn_chunked_rm(hyla_cuda_ctx *c, int gdn, int H, int dk, int dv, float scale, const float *q,
                                  const float *k, const float *v, const float *ga, const float *gb, float *o, int NC,
                                  int nseq, const int32_t *d_tok0, const int32_t *d_len, const int32_t *d_c0,
                                  const int32_t *d_nc, float *const *d_S, const hyla_cu_rowmap *rm, long long nrows);
/* Whether GDN chunked prefill with this dk runs the fused kernel (one launch, no scratch). */
int cu_gdn_fused_ok(hyla_cuda_ctx *c, int dk);
/* Whether GLA chunked prefill with this dk may run the fused kernel (the same bits as kernels
 * A and B, which remain for few long sequences), and either transition's answer. */
int cu_gla_fused_ok(hyla_cuda_ctx *c, int dk);
int cu_lin_fused_ok(hyla_cuda_ctx *c, int gdn, int dk);
/* gla/gdn_prefill of one sequence of n tokens: the block of its chunk tables and state pointer
 * (returns its bytes; writes it when blk != NULL), and the launch with that block on the device. */
size_t cu_lin_prefill1_block(int n, float *S, void *blk);
hyla_status cu_lin_prefill1_dev(hyla_cuda_ctx *c, int gdn, const float *q, const float *k, const float *v,
                                const float *ga, const float *gb, int n, int H, int dk, int dv, float scale,
                                const void *d_blk, int states16, float *o);
/* SSE prefill planned on the device (no host sync); cu_sse_prefill_planned says whether it applies. */
int cu_sse_prefill_planned(hyla_cuda_ctx *c, hyla_sse_transition tr, int H, int dk, int dv, int N, int K);
hyla_status cu_sse_prefill_dev(hyla_cuda_ctx *c, hyla_sse_transition tr, const float *q1, const float *k1,
                               const float *q2, const float *k2, const float *v, const float *ga, const float *gb,
                               const float *betaa, const float *betab, const int32_t *idx, const float *w, int n,
                               int H, int dk, int dv, int N, int K, float scale, int windows, float *S0, float *Sp,
                               float *o);
hyla_status cu_lin_recurrent(hyla_cuda_ctx *c, const hyla_cu_linrec *a, int B);
/* GLA with dk > 256 (StateX's merged heads) as nsl key slabs of dk / nsl <= 128 keys through the
 * kernels above, the slab outputs summed in slab order (hyla_cuda_lin_slab.cu). cu_gla_slabs:
 * nsl for this shape in prefill, 0 where the shape does not take this path (GDN, or dk <= 256);
 * cu_gla_dec_slabs: the same for decode, from dk > 128 on. The others are cu_lin_decode_dev,
 * cu_lin_prefill1_dev and cu_linattn_prefill_batch for such shapes. */
int cu_gla_slabs(int gdn, int dk);
int cu_gla_dec_slabs(int gdn, int dk);
hyla_status cu_gla_slab_decode(hyla_cuda_ctx *c, const float *q, const float *k, const float *v, const float *gk, int B,
                               int H, int dk, int dv, float scale, float *const *d_S, int states16, float *o);
hyla_status cu_gla_slab_prefill1(hyla_cuda_ctx *c, const float *q, const float *k, const float *v, const float *gk,
                                 int n, int H, int dk, int dv, float scale, const void *d_blk, int states16, float *o);
hyla_status cu_gla_slab_batch(hyla_cuda_ctx *c, const hyla_cu_linattn_batch *b);

/* attention (hyla_cuda_attn.cu) */
hyla_status cu_attn_prefill(void *ctx, const float *q, const float *k, const float *v, int n, int Hq, int Hk, int D,
                            int pos0, const hyla_kv_view *kv, int window, float scale, float *o);
hyla_status cu_attn_decode(void *ctx, const float *q, const float *k, const float *v, int B, int Hq, int Hk, int D,
                           const int32_t *pos, const hyla_kv_view *kv, int window, float scale, float *o);

/* pool (hyla_cuda_pool.cu) */
hyla_status cu_pool_create(hyla_cuda_ctx *c, hyla_cu_pool **out);
void cu_pool_destroy(hyla_cuda_ctx *c, hyla_cu_pool *p);
hyla_status cu_pool_alloc(hyla_cuda_ctx *c, size_t bytes, void **out);
void cu_pool_free(hyla_cuda_ctx *c, void *p);
/* host buffers and asynchronous copies behind ops->host_alloc / capture_* and the
 * hyla_cuda_pool.h entry points; a capture ticket of this backend is a hyla_cuda_copy */
hyla_status cu_host_alloc(hyla_cuda_ctx *c, size_t bytes, void **out);
/* Mamba2 (SSD) (hyla_cuda_mamba2.cu) */
hyla_status cu_copy2d(void *ctx, float *dst, int ldd, const float *src, int lds, int rows, int cols);
hyla_status cu_copy2d_check(int ldd, int lds, int rows, int cols);
hyla_status cu_ssd_prefill(void *ctx, const float *xbc, int ldx, const float *dt, int ld_dt, const float *dt_bias,
                           const float *A_log, const float *Dskip, float dt_min, float dt_max, int n, int H, int P,
                           int G, int N, float *S, float *y);
hyla_status cu_ssd_decode(void *ctx, const float *xbc, int ldx, const float *dt, int ld_dt, const float *dt_bias,
                          const float *A_log, const float *Dskip, float dt_min, float dt_max, int B, int H, int P,
                          int G, int N, float *const *S, float *y);
hyla_status cu_ssd_decode_check(int B, int ldx, int ld_dt, int H, int P, int G, int N);
hyla_status cu_ssd_decode_dev(hyla_cuda_ctx *c, const float *xbc, int ldx, const float *dt, int ld_dt,
                              const float *dt_bias, const float *A_log, const float *Dskip, float dt_min, float dt_max,
                              int B, int H, int P, int G, int N, float *const *d_S, int states16, float *y);
hyla_status cu_ssd_norm(void *ctx, const float *o, const float *z, int ldz, const float *w, float *y, int rows, int G,
                        int gs, float eps);
hyla_status cu_ssd_norm_check(int ldz, int rows, int G, int gs);
void cu_host_free(hyla_cuda_ctx *c, void *p);
hyla_status cu_capture_begin(hyla_cuda_ctx *c, int n, void *const *host_dst, const void *const *src,
                             const size_t *bytes, hyla_capture **out);
int cu_capture_done(hyla_cuda_ctx *c, hyla_capture *t);
hyla_status cu_upload_begin(hyla_cuda_ctx *c, int n, void *const *dst, const void *const *host_src,
                            const size_t *bytes, hyla_capture **out);
hyla_status cu_capture_end(hyla_cuda_ctx *c, hyla_capture *t);
#ifdef __cplusplus
}
#endif

static inline unsigned cu_blocks(size_t n, unsigned t) { return (unsigned)((n + t - 1) / t); }
/* A flash prefill key-split length hyla_cuda_set_attn_split and HYLA_CUDA_ATTN_SPLIT accept: 0 (one
 * pass) or a multiple of 64 keys up to 2^24 */
static inline int cu_attn_split_ok(long keys) { return keys >= 0 && keys % 64 == 0 && keys <= (1L << 24); }

#ifdef __CUDACC__
/* Programmatic dependent launch (decode's weight streaming under the small kernels): a kernel
 * launched by cu_launch_pdl may start while the kernel before it still runs, as soon as every
 * block of that one has called pdl_trigger (or ended); it must call pdl_wait before it reads
 * anything an earlier kernel writes or writes anything, and pdl_wait returns once the earlier
 * grid has completed and its memory is visible. Before pdl_wait it may only touch what no
 * kernel writes (weights). pdl_trigger is a hint, harmless where the next kernel is launched
 * plainly. Both are no-ops below sm_90. */
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
/* kern<<<grid, threads, smem>>>(args) on the context's stream, allowed to overlap the kernel
 * before it when c->pdl is on (see pdl_wait). */
template <typename... P, typename... A>
static hyla_status cu_launch_pdl(hyla_cuda_ctx *c, void (*kern)(P...), dim3 grid, unsigned threads, size_t smem,
                                 A... args) {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    cfg.gridDim = grid;
    cfg.blockDim = dim3(threads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = c->stream;
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = c->pdl;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    CU_TRY(cudaLaunchKernelEx(&cfg, kern, ((P)args)...));
    return HYLA_OK;
}
/* kern<<<grid, threads, smem>>>(args) on the context's stream, for kernels whose dynamic shared
 * memory may pass the default limit: the opt-in attribute is set to smem first. */
template <typename... P, typename... A>
static hyla_status cu_launch_dyn(hyla_cuda_ctx *c, void (*kern)(P...), dim3 grid, unsigned threads, size_t smem,
                                 A... args) {
    CU_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    kern<<<grid, threads, smem, c->stream>>>(args...);
    CU_LAUNCH_CHECK("kernel");
    return HYLA_OK;
}
#endif

#endif
