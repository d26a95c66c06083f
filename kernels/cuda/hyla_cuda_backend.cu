/* hyla_cuda_backend.cu — the CUDA backend's context, memory ops, weights, linear layers
 * (cublasLt, bf16 operands, fp32 accumulation and output) and the ops table.
 *
 * Invariants: see hyla_cuda_impl.h (one compute stream per context; host arrays staged
 * through a pinned ring; scratch only grows). Weights are converted to bf16 on the host at
 * weight_create and live in their own cudaMalloc allocation.
 * linear: M <= 256 rows (everything the runtime issues) go to the batch-invariant skinny kernel
 * (hyla_cuda_gemm.cu). Larger M: x (fp32, row stride ldx) is converted to a contiguous bf16
 * scratch copy, then
 * y[M][N] = x W^T through cublasLt (A = W as a K x N column-major matrix, op T; B = x as K x M;
 * C = y as N x M with ld = ldy). A plan (layouts + heuristic algorithm) is cached per
 * (M, N, K, ldy, accumulate, alignment of y): the same shape always takes the same algorithm,
 * so results are deterministic run to run. Different M may take different algorithms, so a
 * row's rounding can differ between M (documented in docs/CUDA.md).
 * Threading: one thread per context. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_cuda_impl.h"
#include "hyla_log.h"
#include "hyla_cuda_mma.cuh"
#include "hyla_cuda_pool.h"

/* ---------------------------------------------------------------- errors */

extern "C" hyla_status hyla_cuda_fail(cudaError_t e, const char *expr, const char *file, int line) {
    const char *base = strrchr(file, '/');
    hyla_status s = (e == cudaErrorMemoryAllocation) ? HYLA_ERR_NOMEM : HYLA_ERR_DEVICE;
    return hyla_fail(s, "CUDA: %s failed: %s (%s) at %s:%d", expr, cudaGetErrorName(e), cudaGetErrorString(e),
                     base ? base + 1 : file, line);
}

extern "C" hyla_status hyla_cublas_fail(cublasStatus_t e, const char *expr, const char *file, int line) {
    const char *base = strrchr(file, '/');
    hyla_status s = (e == CUBLAS_STATUS_ALLOC_FAILED) ? HYLA_ERR_NOMEM : HYLA_ERR_DEVICE;
    return hyla_fail(s, "cuBLAS: %s failed: %s (%s) at %s:%d", expr, cublasGetStatusName(e),
                     cublasGetStatusString(e), base ? base + 1 : file, line);
}

/* ---------------------------------------------------------------- staging and scratch */

#define RING_BYTES ((size_t)16 << 20)
#define BOUNCE_BYTES ((size_t)8 << 20)
#define READBACK_BYTES ((size_t)4 << 20) /* logits of 32 rows of a 32k vocabulary */

/* Make `need` contiguous bytes free at the ring's offset: grow the ring when `need` exceeds it
 * (rare: a table larger than the ring; after the stream drains), or wrap to its start (earlier
 * copies out of the ring and kernels reading its mirror must be done first). */
static hyla_status ring_room(hyla_cuda_ctx *c, size_t need) {
    if (need > c->ring_bytes) {
        size_t nb = c->ring_bytes;
        while (nb < need) nb *= 2;
        CU_TRY(cudaStreamSynchronize(c->stream));
        CU_TRY(cudaFreeHost(c->ring_host));
        CU_TRY(cudaFree(c->ring_dev));
        c->ring_host = NULL;
        c->ring_dev = NULL;
        CU_TRY(cudaMallocHost((void **)&c->ring_host, nb));
        CU_TRY(cudaMalloc((void **)&c->ring_dev, nb));
        c->ring_bytes = nb;
        c->ring_off = 0;
    }
    if (c->ring_off + need > c->ring_bytes) {
        CU_TRY(cudaStreamSynchronize(c->stream));
        c->ring_off = 0;
    }
    return HYLA_OK;
}

/* Make room for `parts` stages totalling `bytes` so none of them wraps the ring (a wrap
 * would reuse the mirror of an earlier part before its consumer kernel is queued). */
extern "C" hyla_status cu_stage_reserve(hyla_cuda_ctx *c, size_t bytes, int parts) {
    return ring_room(c, bytes + (size_t)parts * 256);
}

extern "C" hyla_status cu_stage(hyla_cuda_ctx *c, const void *host, size_t bytes, void **dev) {
    size_t need = (bytes + 255) & ~(size_t)255;
    if (need == 0) need = 256;
    HYLA_TRY(ring_room(c, need));
    uint8_t *h = c->ring_host + c->ring_off;
    uint8_t *d = c->ring_dev + c->ring_off;
    if (bytes) memcpy(h, host, bytes);
    CU_TRY(cudaMemcpyAsync(d, h, bytes ? bytes : 1, cudaMemcpyHostToDevice, c->stream));
    c->ring_off += need;
    *dev = d;
    return HYLA_OK;
}

extern "C" hyla_status cu_stage_to(hyla_cuda_ctx *c, const void *host, size_t bytes, void *dev) {
    if (!bytes) return HYLA_OK;
    size_t need = (bytes + 255) & ~(size_t)255;
    HYLA_TRY(cu_stage_reserve(c, bytes, 1));
    uint8_t *h = c->ring_host + c->ring_off;
    memcpy(h, host, bytes);
    CU_TRY(cudaMemcpyAsync(dev, h, bytes, cudaMemcpyHostToDevice, c->stream));
    c->ring_off += need;
    return HYLA_OK;
}

extern "C" hyla_status cu_scratch(hyla_cuda_ctx *c, int slot, size_t bytes, void **out) {
    if (bytes == 0) bytes = 256;
    if (c->scratch_bytes[slot] < bytes) {
        size_t nb = bytes + bytes / 4;
        nb = (nb + 4095) & ~(size_t)4095;
        if (c->scratch[slot]) {
            CU_TRY(cudaStreamSynchronize(c->stream)); /* queued kernels may still read it */
            CU_TRY(cudaFree(c->scratch[slot]));
            c->scratch[slot] = NULL;
            c->scratch_bytes[slot] = 0;
            c->scratch_gen++; /* captured graphs that used the old buffer are stale */
        }
        CU_TRY(cudaMalloc(&c->scratch[slot], nb));
        c->scratch_bytes[slot] = nb;
    }
    *out = c->scratch[slot];
    return HYLA_OK;
}

/* ---------------------------------------------------------------- memory ops
 *
 * alloc/free: the state pool (hyla_cuda_pool.cu), reached through the ops table in
 * hyla_cuda_graph.cu. upload/download run on the copy stream, ordered against the compute
 * stream by events: a copy starts after the compute work queued before it (which may write
 * what is read or read what is overwritten), and compute queued after an upload waits for it.
 * Pageable host memory goes through the pinned bounce buffers, double-buffered so the DMA of
 * one piece overlaps the host copy of the next; pinned host memory (hyla_cuda_host_alloc, or
 * registered) is copied directly. */

static int host_is_pinned(const void *p) {
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError(); /* plain malloc'ed memory may be reported as an error on old drivers */
        return 0;
    }
    return a.type == cudaMemoryTypeHost;
}

/* The copy stream waits for the compute work queued so far. */
static hyla_status copy_after_compute(hyla_cuda_ctx *c) {
    CU_TRY(cudaEventRecord(c->ev_compute, c->stream));
    CU_TRY(cudaStreamWaitEvent(c->copy_stream, c->ev_compute, 0));
    return HYLA_OK;
}

/* Compute queued from now on waits for the copies queued so far. */
static hyla_status compute_after_copy(hyla_cuda_ctx *c) {
    CU_TRY(cudaEventRecord(c->ev_copy, c->copy_stream));
    CU_TRY(cudaStreamWaitEvent(c->stream, c->ev_copy, 0));
    return HYLA_OK;
}

/* Host -> device. Returns once the host memory has been read (the last DMA may still run;
 * compute queued later waits for it). */
extern "C" hyla_status cu_upload(void *ctx, void *dst, const void *host_src, size_t bytes) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    if (!bytes) return HYLA_OK;
    HYLA_TRY(copy_after_compute(c));
    if (host_is_pinned(host_src)) {
        CU_TRY(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, c->copy_stream));
        CU_TRY(cudaEventRecord(c->ev_copy, c->copy_stream));
        CU_TRY(cudaStreamWaitEvent(c->stream, c->ev_copy, 0));
        CU_TRY(cudaEventSynchronize(c->ev_copy)); /* the caller may reuse host_src on return */
        return HYLA_OK;
    }
    const uint8_t *s = (const uint8_t *)host_src;
    uint8_t *d = (uint8_t *)dst;
    while (bytes) {
        size_t n = bytes < c->bounce_bytes ? bytes : c->bounce_bytes;
        int i = c->bounce_next;
        c->bounce_next ^= 1;
        CU_TRY(cudaEventSynchronize(c->bounce_ev[i]));
        memcpy(c->bounce[i], s, n);
        CU_TRY(cudaMemcpyAsync(d, c->bounce[i], n, cudaMemcpyHostToDevice, c->copy_stream));
        CU_TRY(cudaEventRecord(c->bounce_ev[i], c->copy_stream));
        s += n;
        d += n;
        bytes -= n;
    }
    return compute_after_copy(c);
}

/* Device -> host, after the compute work queued so far; complete on return. */
extern "C" hyla_status cu_download(void *ctx, void *host_dst, const void *src, size_t bytes) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    if (!bytes) return HYLA_OK;
    HYLA_TRY(copy_after_compute(c));
    if (host_is_pinned(host_dst)) {
        CU_TRY(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, c->copy_stream));
        CU_TRY(cudaEventRecord(c->ev_copy, c->copy_stream));
        CU_TRY(cudaEventSynchronize(c->ev_copy));
        return HYLA_OK;
    }
    const uint8_t *s = (const uint8_t *)src;
    uint8_t *d = (uint8_t *)host_dst;
    size_t pend_n[2] = {0, 0};
    uint8_t *pend_dst[2] = {NULL, NULL};
    int i = 0;
    CU_TRY(cudaEventSynchronize(c->bounce_ev[0]));
    CU_TRY(cudaEventSynchronize(c->bounce_ev[1]));
    while (bytes || pend_n[0] || pend_n[1]) {
        if (pend_n[i]) { /* drain this buffer's previous piece before reusing it */
            CU_TRY(cudaEventSynchronize(c->bounce_ev[i]));
            memcpy(pend_dst[i], c->bounce[i], pend_n[i]);
            pend_n[i] = 0;
        }
        if (bytes) {
            size_t n = bytes < c->bounce_bytes ? bytes : c->bounce_bytes;
            CU_TRY(cudaMemcpyAsync(c->bounce[i], s, n, cudaMemcpyDeviceToHost, c->copy_stream));
            CU_TRY(cudaEventRecord(c->bounce_ev[i], c->copy_stream));
            pend_n[i] = n;
            pend_dst[i] = d;
            s += n;
            d += n;
            bytes -= n;
        }
        i ^= 1;
    }
    return HYLA_OK;
}

/* Copies bytes from device memory to the mapped host buffer with stores from the SMs: no copy
 * engine, so a snapshot's device->host copies in flight on the copy stream do not delay it
 * (they would: device->host copies of all streams share the engine, one after the other). */
__global__ void k_readback(const uint8_t *__restrict__ src, uint8_t *__restrict__ dst, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    if ((((uintptr_t)src | (uintptr_t)dst) & 15) == 0) {
        size_t n16 = n / 16;
        for (size_t k = i; k < n16; k += stride) ((uint4 *)dst)[k] = ((const uint4 *)src)[k];
        for (size_t k = n16 * 16 + i; k < n; k += stride) dst[k] = src[k];
    } else {
        for (size_t k = i; k < n; k += stride) dst[k] = src[k];
    }
}

extern "C" hyla_status cu_readback(hyla_cuda_ctx *c, void *host_dst, const void *src, size_t bytes) {
    if (!bytes) return HYLA_OK;
    if (!c->rb_dev || bytes > c->rb_bytes) return cu_download(c, host_dst, src, bytes);
    int blocks = (int)((bytes / 16 + 255) / 256);
    if (blocks < 1) blocks = 1;
    if (blocks > 4 * c->sm_count) blocks = 4 * c->sm_count;
    k_readback<<<blocks, 256, 0, c->stream>>>((const uint8_t *)src, (uint8_t *)c->rb_dev, bytes);
    CU_LAUNCH_CHECK("readback");
    /* the kernel's stores to mapped memory are visible to the host once the stream is synced */
    CU_TRY(cudaStreamSynchronize(c->stream));
    memcpy(host_dst, c->rb_host, bytes);
    return HYLA_OK;
}

extern "C" hyla_status cu_sync(void *ctx) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    CU_TRY(cudaStreamSynchronize(c->stream));
    CU_TRY(cudaStreamSynchronize(c->copy_stream));
    CU_TRY(cudaGetLastError());
    return HYLA_OK;
}

/* ---------------------------------------------------------------- weights */

extern "C" hyla_status cu_weight_create(void *ctx, const void *host, hyla_dtype dt, int rows, int cols,
                                    hyla_weight **out) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    *out = NULL;
    if (rows <= 0 || cols <= 0) return hyla_fail(HYLA_ERR_INVALID_ARG, "weight_create: shape [%d][%d]", rows, cols);
    if (dt != HYLA_DT_F32 && dt != HYLA_DT_F16 && dt != HYLA_DT_BF16)
        return hyla_fail(HYLA_ERR_UNSUPPORTED, "weight_create: dtype %s", hyla_dtype_name(dt));
    size_t n = (size_t)rows * cols;
    /* aligned as its tensor maps must be (CUtensorMap is 64-byte aligned) */
    hyla_weight *w = NULL;
    if (posix_memalign((void **)&w, 64, sizeof *w)) w = NULL;
    if (!w) return hyla_fail(HYLA_ERR_NOMEM, "weight_create: out of host memory");
    memset(w, 0, sizeof *w);
    w->rows = rows;
    w->cols = cols;
    cudaError_t e = cudaMalloc((void **)&w->d, n * 2);
    if (e != cudaSuccess) {
        free(w);
        return hyla_cuda_fail(e, "cudaMalloc(weight)", __FILE__, __LINE__);
    }
    /* Convert in pieces of the bounce buffer size straight into pinned memory. */
    size_t piece = c->bounce_bytes / 2; /* elements per piece (bf16) */
    hyla_status st = HYLA_OK;
    for (size_t off = 0; off < n && st == HYLA_OK; off += piece) {
        size_t m = n - off < piece ? n - off : piece;
        int i = c->bounce_next;
        c->bounce_next ^= 1;
        e = cudaEventSynchronize(c->bounce_ev[i]);
        if (e != cudaSuccess) { st = hyla_cuda_fail(e, "cudaEventSynchronize", __FILE__, __LINE__); break; }
        uint16_t *dst = (uint16_t *)c->bounce[i];
        if (dt == HYLA_DT_BF16) {
            memcpy(dst, (const uint16_t *)host + off, m * 2);
        } else if (dt == HYLA_DT_F32) {
            const float *s = (const float *)host + off;
            for (size_t j = 0; j < m; j++) dst[j] = hyla_f32_to_bf16(s[j]);
        } else {
            const uint16_t *s = (const uint16_t *)host + off;
            for (size_t j = 0; j < m; j++) dst[j] = hyla_f32_to_bf16(hyla_f16_to_f32(s[j]));
        }
        e = cudaMemcpyAsync(w->d + off, dst, m * 2, cudaMemcpyHostToDevice, c->stream);
        if (e == cudaSuccess) e = cudaEventRecord(c->bounce_ev[i], c->stream);
        if (e != cudaSuccess) st = hyla_cuda_fail(e, "cudaMemcpyAsync(weight)", __FILE__, __LINE__);
    }
    if (st != HYLA_OK) {
        cudaStreamSynchronize(c->stream);
        cudaFree(w->d);
        free(w);
        return st;
    }
    *out = w;
    return HYLA_OK;
}

extern "C" void cu_weight_destroy(void *ctx, hyla_weight *w) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    if (!w) return;
    cudaStreamSynchronize(c->stream); /* queued GEMMs may still read it */
    cudaFree(w->d);
    free(w);
}

/* ---------------------------------------------------------------- linear */

static unsigned ptr_align(const void *p, size_t ld_bytes) {
    uintptr_t v = (uintptr_t)p | (uintptr_t)ld_bytes;
    unsigned a = 256;
    while (a > 4 && (v & (a - 1))) a >>= 1;
    return a;
}

/* The cached cublasLt plan of an (M, N, K) GEMM: layouts and an algorithm, the heuristic's first
 * choice, or with `from` (a plan of the same N, K, ldy and alignment), from's algorithm on this
 * M where cublasLtMatmulAlgoCheck accepts it (else no algorithm). */
static hyla_status gemm_plan(hyla_cuda_ctx *c, int M, int N, int K, int ldy, int acc, unsigned align_c,
                             const hyla_cu_gemm_plan *from, hyla_cu_gemm_plan **out, int cbf16 = 0) {
    const int derived = from != NULL;
    uint64_t key = ((uint64_t)M * 1000003u) ^ ((uint64_t)N << 20) ^ ((uint64_t)K << 40) ^ ((uint64_t)ldy * 7919u) ^
                   ((uint64_t)acc << 62) ^ ((uint64_t)derived << 61) ^ ((uint64_t)align_c << 50) ^
                   ((uint64_t)cbf16 << 63);
    key |= 1; /* 0 marks an empty slot */
    unsigned h = (unsigned)(key ^ (key >> 29)) % HYLA_CU_GEMM_PLANS;
    for (int probe = 0; probe < HYLA_CU_GEMM_PLANS; probe++) {
        hyla_cu_gemm_plan *p = &c->plans[(h + probe) % HYLA_CU_GEMM_PLANS];
        if (p->key == key && p->M == M && p->N == N && p->K == K && p->ldy == ldy && p->acc == acc &&
            p->derived == derived && p->cbf16 == cbf16) {
            *out = p;
            return HYLA_OK;
        }
        if (p->key == 0) {
            CUBLAS_TRY(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_16BF, K, N, K));
            CUBLAS_TRY(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_16BF, K, M, K));
            CUBLAS_TRY(cublasLtMatrixLayoutCreate(&p->lc, cbf16 ? CUDA_R_16BF : CUDA_R_32F, N, M, ldy));
            cublasLtMatmulPreference_t pref;
            CUBLAS_TRY(cublasLtMatmulPreferenceCreate(&pref));
            uint32_t ac = align_c;
            cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &c->lt_workspace_bytes, sizeof c->lt_workspace_bytes);
            cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ac, sizeof ac);
            cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ac, sizeof ac);
            cublasLtMatmulHeuristicResult_t res;
            int found = 0;
            cublasStatus_t hs;
            if (from) {
                hs = from->has_algo ? cublasLtMatmulAlgoCheck(c->lt, c->lt_desc, p->la, p->lb, p->lc, p->lc,
                                                              &from->algo, &res)
                                    : CUBLAS_STATUS_NOT_SUPPORTED;
                found = hs == CUBLAS_STATUS_SUCCESS && res.workspaceSize <= c->lt_workspace_bytes;
                res.algo = from->algo;
            } else {
                hs = cublasLtMatmulAlgoGetHeuristic(c->lt, c->lt_desc, p->la, p->lb, p->lc, p->lc, pref, 1, &res, &found);
            }
            cublasLtMatmulPreferenceDestroy(pref);
            p->has_algo = (hs == CUBLAS_STATUS_SUCCESS && found > 0);
            if (p->has_algo) p->algo = res.algo;
            p->derived = derived;
            p->cbf16 = cbf16;
            p->key = key;
            p->M = M;
            p->N = N;
            p->K = K;
            p->ldy = ldy;
            p->acc = acc;
            *out = p;
            return HYLA_OK;
        }
    }
    *out = NULL; /* table full: callers fall back to cublasGemmEx */
    return HYLA_OK;
}

extern "C" hyla_status cu_linear_check(int ldx, int K, const hyla_weight *W, int ldy, int N) {
    if (!W || W->rows != N || W->cols != K)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "linear: weight [%d][%d] for N=%d K=%d", W ? W->rows : -1,
                         W ? W->cols : -1, N, K);
    if (ldx < K || ldy < N) return hyla_fail(HYLA_ERR_INVALID_ARG, "linear: ldx %d < K %d or ldy %d < N %d", ldx, K, ldy, N);
    return HYLA_OK;
}

extern "C" hyla_status cu_fused_flags_check(const char *op, int flags) {
    if ((flags & (HYLA_LINEAR_X_BF16 | HYLA_LINEAR_GATE_BF16)) && !(flags & HYLA_LINEAR_PREFILL))
        return hyla_fail(HYLA_ERR_INVALID_ARG, "%s: bf16 inputs need prompt rows (HYLA_LINEAR_PREFILL)", op);
    return HYLA_OK;
}

extern "C" hyla_status cu_linear_flags_check(const hyla_cuda_ctx *c, int flags, const float *x, int ldx, int M, int K,
                                             int n, const hyla_linear_out *outs, int accumulate) {
    if ((flags & HYLA_LINEAR_X_BF16) && !(flags & HYLA_LINEAR_PREFILL) &&
        (!cu_decode_bf16_rows(c, M, K) || ldx != K || flags != HYLA_LINEAR_X_BF16 || hyla_linear_multi_has_x(x, n, outs)))
        return hyla_fail(HYLA_ERR_INVALID_ARG,
                         "linear_multi: bf16 decode rows (flags %d) need rows that take them (decode_bf16_rows: %d "
                         "rows of K %d %s), ldx == K (ldx %d) and no output of its own x or accumulate",
                         flags, M, K, cu_decode_bf16_rows(c, M, K) ? "do" : "do not", ldx);
    if ((flags & HYLA_LINEAR_X_BF16) && ldx != K)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "linear_multi: bf16 rows need ldx == K (ldx %d, K %d)", ldx, K);
    if (flags & HYLA_LINEAR_Y_BF16) {
        if (!(flags & HYLA_LINEAR_PREFILL) || accumulate)
            return hyla_fail(HYLA_ERR_INVALID_ARG, "linear_multi: bf16 outputs need prompt rows and no accumulate");
        for (int j = 0; j < n; j++)
            if (outs[j].bias || outs[j].ldy != outs[j].N)
                return hyla_fail(HYLA_ERR_INVALID_ARG, "linear_multi: bf16 output %d has a bias or ldy %d != N %d", j,
                                 outs[j].ldy, outs[j].N);
    }
    return HYLA_OK;
}

/* Prompt rows (HYLA_LINEAR_PREFILL) through cuBLAS at a fixed row count: every call is the
 * same (PROMPT_ROWS, N, K) GEMM with the same cached algorithm, so a row's result depends only on
 * the row (tested on the device: rows at other positions and in calls of other sizes give the
 * same bits), at cuBLAS speed. Pieces are cut into blocks of PROMPT_ROWS rows; a short block runs
 * the full count (the rows past it hold stale data whose results are dropped); runs of whole
 * blocks go as one GEMM with the same algorithm (prompt_gemm). The count is part of what the bits
 * depend on, like the GPU and the library: keep it the same wherever a session may be resumed. */
#define PROMPT_ROWS 1024
/* the most scratch an accumulating prompt-row call takes for a run of blocks (at least one block) */
#define PROMPT_SCRATCH_RUN ((size_t)80 << 20)

/* y[m][n] = (acc ? y : 0) + (t[m][n] + bias[n]) for m < M: the skinny kernel's epilogue order */
__global__ void k_fixed_epilogue(const float *t, int M, int N, const float *bias, float *y, int ldy, /* t may be y */
                                 int accumulate) {
    size_t total = (size_t)M * N;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        size_t m = i / N, n = i - m * N;
        lin_store(t[i], bias, n, y + m * ldy + n, accumulate);
    }
}

/* One fixed-size (MF, N, K) prompt-row GEMM: fp32 (or bf16) results into C (row stride N), or
 * added onto C's fp32 values with beta = 1 (cuBLAS's epilogue alpha·acc + beta·C with both 1: the
 * rounding of acc + C, as the epilogue kernel's y + t; tested against it). The
 * algorithm is chosen for C aligned as ptr_align(NULL, N * 4), a function of N only: the
 * 256-aligned scratch blocks always are, and a y is used directly only where it is at least as
 * aligned, so scratch and y get the same algorithm and the same bits. Every output takes its own
 * GEMM with its pinned algorithm: a batched call over outputs of the same N (which cuBLAS picks an
 * algorithm for per call) could only go block by block, and a 2304-wide q and k of a 16k piece
 * ran faster as one pinned GEMM each over the run (docs/CUDA.md "Runs of whole blocks"). */
static hyla_status prompt_gemm(hyla_cuda_ctx *c, const void *xb, int MF, int nblk, int K, int N, const hyla_weight *W,
                               void *C, int cbf16, float beta) {
    const float alpha = 1.0f;
    const size_t es = cbf16 ? 2 : 4; /* bytes of an output */
    const cudaDataType_t ct = cbf16 ? CUDA_R_16BF : CUDA_R_32F;
    const unsigned ac = ptr_align(NULL, (size_t)N * es); /* a function of N only (see prompt_align) */
    hyla_cu_gemm_plan *p = NULL;
    HYLA_TRY(gemm_plan(c, MF, N, K, N, 0, ac, NULL, &p, cbf16));
    if (nblk > 1) {
        /* nblk consecutive blocks (x and C contiguous): one GEMM of nblk * MF rows with the
         * MF-row plan's algorithm, so each row gets the operations it gets in an MF-row call
         * (tested: rows of long and short calls give the same bits) with nblk times the tiles
         * to fill the GPU; where that algorithm does not take the larger shape, block by block */
        hyla_cu_gemm_plan *q = NULL;
        if (p && p->has_algo) HYLA_TRY(gemm_plan(c, nblk * MF, N, K, N, 0, ac, p, &q, cbf16));
        if (q && q->has_algo &&
            cublasLtMatmul(c->lt, c->lt_desc, &alpha, W->d, q->la, xb, q->lb, &beta, C, q->lc, C, q->lc, &q->algo,
                           c->lt_workspace, c->lt_workspace_bytes, c->stream) == CUBLAS_STATUS_SUCCESS) {
            CU_LAUNCH_CHECK("linear (prompt rows, several blocks)");
            return HYLA_OK;
        }
        for (int b = 0; b < nblk; b++)
            HYLA_TRY(prompt_gemm(c, (const __nv_bfloat16 *)xb + (size_t)b * MF * K, MF, 1, K, N, W,
                                 (char *)C + (size_t)b * MF * N * es, cbf16, beta));
        return HYLA_OK;
    }
    cublasStatus_t st = CUBLAS_STATUS_NOT_SUPPORTED;
    if (p && p->has_algo)
        st = cublasLtMatmul(c->lt, c->lt_desc, &alpha, W->d, p->la, xb, p->lb, &beta, C, p->lc, C, p->lc, &p->algo,
                            c->lt_workspace, c->lt_workspace_bytes, c->stream);
    if (st != CUBLAS_STATUS_SUCCESS)
        CUBLAS_TRY(cublasGemmEx(c->cublas, CUBLAS_OP_T, CUBLAS_OP_N, N, MF, K, &alpha, W->d, CUDA_R_16BF, K, xb,
                                CUDA_R_16BF, K, &beta, C, ct, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    CU_LAUNCH_CHECK("linear (prompt rows)");
    return HYLA_OK;
}

/* What a prompt-row block is, before the bf16 rounding: the rows of x themselves, silu(x) * up
 * (swiglu_linear) or the gated RMSNorm of x's rows as M*H heads of D (gated_rmsnorm_linear). The
 * values are those of the op, then the rounding. */
struct prompt_pro {
    const float *up;                 /* swiglu: [M][ldx] (bf16 [M][K] with up_bf16) */
    int up_bf16;                     /* swiglu of bf16 gate and up rows (swiglu_linear, HYLA_LINEAR_X_BF16) */
    const float *gate, *norm_w;      /* gated RMSNorm (gate may be NULL; bf16 with gate_bf16) */
    int gate_bf16;
    int H, D;
    float eps;
};

static hyla_status prompt_rows_bf16(hyla_cuda_ctx *c, const float *x, int ldx, int r0, int m, int K,
                                    const prompt_pro *pro, __nv_bfloat16 *xb) {
    const size_t off = (size_t)r0 * ldx;
    if (pro && pro->up && pro->up_bf16) /* ldx == K */
        return cu_swiglu_bf16in(c, (const __nv_bfloat16 *)x + off, (const __nv_bfloat16 *)pro->up + off, (size_t)m * K,
                                xb);
    if (pro && pro->up) return cu_swiglu_bf16_rows(c, x + off, pro->up + off, ldx, m, K, xb);
    if (pro && pro->norm_w && pro->gate && pro->gate_bf16)
        return cu_gated_rmsnorm_bf16g(c, x + off, (const __nv_bfloat16 *)pro->gate + off, pro->norm_w, xb, m * pro->H,
                                      pro->D, pro->eps);
    if (pro && pro->norm_w)
        return cu_gated_rmsnorm_bf16(c, x + off, pro->gate ? pro->gate + off : NULL, pro->norm_w, xb, m * pro->H, pro->D,
                                     pro->eps);
    return cu_f32_to_bf16_rows(c, x + off, ldx, m, K, xb);
}

/* Prompt rows: one GEMM an output, every GEMM of MF rows (runs of whole blocks as one), so a
 * row's result depends on the row only; outputs of at most 64 columns on the skinny kernel
 * (cu_skinny_linear_xb), whose rows do not depend on each other either. */
static hyla_status linear_fixed_rows(hyla_cuda_ctx *c, const float *x, int ldx, int M, int K, int n,
                                     const hyla_linear_out *outs, int accumulate, int MF, const prompt_pro *pro,
                                     int flags) {
    /* HYLA_LINEAR_X_BF16: x holds bf16 rows; HYLA_LINEAR_Y_BF16: the GEMMs write bf16 (es bytes an
     * output), straight into y for whole blocks, through the scratch (then copied) for a partial
     * one; no bias or accumulate (cu_linear_flags_check) */
    const int x_bf16 = (flags & HYLA_LINEAR_X_BF16) != 0, y_bf16 = (flags & HYLA_LINEAR_Y_BF16) != 0;
    const size_t es = y_bf16 ? 2 : 4;
    /* Outputs of at most one skinny column tile (GDN's a and b gates, SSE's routing logits and
     * low-rank inputs) take the skinny kernel on the run's bf16 operand (cu_skinny_linear_xb:
     * a row's bits do not depend on the rows around it there either, and are those it gets as a
     * decode row); fp32 outputs only. */
    int narrow[HYLA_LINEAR_MULTI_MAX];
    size_t nsum = 0;
    for (int j = 0; j < n; j++) {
        narrow[j] = !y_bf16 && outs[j].N <= 64 /* SK_N */ && K % 8 == 0;
        if (!narrow[j]) nsum += (size_t)outs[j].N;
    }
    /* Runs of up to c->prompt_blocks whole blocks go to the GEMM together (prompt_gemm); the last
     * partial block alone. Where every output is written straight into y (no accumulate, ldy ==
     * N; the alignment is checked per run below) the scratch holds one block; otherwise (an
     * accumulating call: SSE's LoRA terms onto the copied projections) the run's results go
     * through scratch of up to PROMPT_SCRATCH_RUN bytes and one epilogue pass over the run, where
     * block by block cost three launches per 1024 rows. Each row gets the same GEMM and the same
     * epilogue either way: the same bits. An accumulating call without a bias (the runtime's
     * residual adds) adds its whole blocks in the GEMM (beta = 1) straight into y. */
    int maxb = c->prompt_blocks, via_scratch = 0;
    for (int j = 0; j < n; j++)
        if (!narrow[j] && ((accumulate && outs[j].bias) || outs[j].ldy != outs[j].N)) via_scratch = 1;
    if (via_scratch) {
        const size_t per_block = (size_t)MF * nsum * 4, cap = (size_t)PROMPT_SCRATCH_RUN / (per_block ? per_block : 1);
        if ((size_t)maxb > cap) maxb = cap > 1 ? (int)cap : 1;
    }
    if (M / MF < maxb) maxb = M / MF > 1 ? M / MF : 1;
    const int tblk = via_scratch ? maxb : 1; /* blocks the scratch holds per output */
    void *xb, *t;
    HYLA_TRY(cu_scratch(c, SCR_XB, (size_t)maxb * MF * K * 2, &xb));
    /* each output's scratch starts 256-aligned (tblk * N * MF * es bytes: MF is a multiple of 128) */
    HYLA_TRY(cu_scratch(c, SCR_LINEAR, (size_t)tblk * MF * nsum * es, &t));
    size_t toff[HYLA_LINEAR_MULTI_MAX];
    for (int j = 0, off = 0; j < n; j++) {
        toff[j] = (size_t)off * MF * tblk * es; /* bytes */
        if (!narrow[j]) off += outs[j].N;
    }
    for (int r0 = 0, m; r0 < M; r0 += m) {
        const int whole = (M - r0) / MF;
        int nblk = whole < 1 ? 1 : whole < maxb ? whole : maxb;
        for (int j = 0; j < n && nblk > 1 && !via_scratch; j++) /* into y straight: its alignment */
            if (!narrow[j] && ptr_align((char *)outs[j].y + (size_t)r0 * outs[j].ldy * es, (size_t)outs[j].N * es) <
                ptr_align(NULL, (size_t)outs[j].N * es))
                nblk = 1;
        m = whole < 1 ? M - r0 : nblk * MF;
        /* the run's bf16 operand: x's own rows where they already are (HYLA_LINEAR_X_BF16: whole
         * blocks, as aligned as the scratch; the same values either way), else formed once for
         * all outputs into the scratch (a partial block reads MF rows: the scratch's, never past
         * x's rows) */
        const void *xr = xb;
        if (x_bf16) {
            const __nv_bfloat16 *xs = (const __nv_bfloat16 *)x + (size_t)r0 * K;
            if (m % MF == 0 && ((uintptr_t)xs & 255) == 0)
                xr = xs;
            else
                CU_TRY(cudaMemcpyAsync(xb, xs, (size_t)m * K * 2, cudaMemcpyDeviceToDevice, c->stream));
        } else {
            HYLA_TRY(prompt_rows_bf16(c, x, ldx, r0, m, K, pro, (__nv_bfloat16 *)xb));
        }
        hyla_linear_out nar[HYLA_LINEAR_MULTI_MAX];
        int nn = 0;
        for (int j = 0; j < n; j++)
            if (narrow[j]) {
                nar[nn] = outs[j];
                nar[nn++].y = outs[j].y + (size_t)r0 * outs[j].ldy;
            }
        if (nn) HYLA_TRY(cu_skinny_linear_xb(c, (const __nv_bfloat16 *)xr, m, K, nn, nar, accumulate));
        for (int j = 0; j < n; j++) {
            const hyla_linear_out *o = &outs[j];
            const int N = o->N;
            if (narrow[j]) continue;
            /* A whole block with y's layout goes straight into y: the same algorithm and layout
             * as into scratch, so the same values, without the copy; the bias is then added in
             * place (t + bias either way), an accumulate (no bias) by the GEMM itself. */
            const int direct = m % MF == 0 && !(accumulate && o->bias) && o->ldy == N &&
                               ptr_align((char *)o->y + (size_t)r0 * o->ldy * es, (size_t)N * es) >=
                                   ptr_align(NULL, (size_t)N * es);
            HYLA_ASSERT(direct || m <= tblk * MF); /* t holds tblk blocks */
            void *C = direct ? (void *)((char *)o->y + (size_t)r0 * o->ldy * es) : (void *)((char *)t + toff[j]);
            HYLA_TRY(prompt_gemm(c, xr, MF, m / MF > 1 ? m / MF : 1, K, N, o->W, C, y_bf16,
                                 direct && accumulate ? 1.0f : 0.0f));
            if (direct && !o->bias) continue;
            if (y_bf16) { /* a partial block's rows, out of the scratch (ldy == N, no bias) */
                CU_TRY(cudaMemcpyAsync((char *)o->y + (size_t)r0 * N * 2, C, (size_t)m * N * 2, cudaMemcpyDeviceToDevice,
                                       c->stream));
                continue;
            }
            float *yb = o->y + (size_t)r0 * o->ldy;
            size_t total = (size_t)m * N, blocks = (total + 255) / 256;
            if (blocks > 65535u * 8) blocks = 65535u * 8;
            k_fixed_epilogue<<<(unsigned)blocks, 256, 0, c->stream>>>((const float *)C, m, N, o->bias, yb, o->ldy,
                                                                      direct ? 0 : accumulate);
            CU_LAUNCH_CHECK("linear (prompt rows) epilogue");
        }
    }
    return HYLA_OK;
}

/* Decode rows on the large-M path, two or more outputs: up to 64 rows (the warpgroup linear from
 * a lowered HYLA_CUDA_GEMM_WG_MIN) the outputs narrower than its 128-column tile (GDN's a and b:
 * one per head) go to the skinny kernel in one grouped launch, not a launch each (7 us apiece at
 * 64 rows); the rest to the warpgroup linear. */
static void split_narrow(hyla_cuda_ctx *c, int M, int K, int n, const hyla_linear_out *outs, hyla_linear_out *wide,
                         int *nw, hyla_linear_out *narrow, int *nn) {
    *nw = *nn = 0;
    for (int j = 0; j < n; j++) {
        if (M <= 64 && outs[j].N < 128 && cu_skinny_multi_ok(c, M, K))
            narrow[(*nn)++] = outs[j];
        else
            wide[(*nw)++] = outs[j];
    }
}

/* Decode rows from the norm's bf16 rows (HYLA_LINEAR_X_BF16 without HYLA_LINEAR_PREFILL, at rows
 * where cu_decode_bf16_rows): routed as the same call from fp32 rows is below, each path taking
 * these rows where it would have converted x itself: the same bits, one conversion pass fewer. */
static hyla_status linear_multi_decode_xb(hyla_cuda_ctx *c, const float *x, int ldx, int M, int K, int n,
                                          const hyla_linear_out *outs, int accumulate, int flags) {
    HYLA_TRY(cu_linear_flags_check(c, flags, x, ldx, M, K, n, outs, accumulate));
    for (int j = 0; j < n; j++) HYLA_TRY(cu_linear_check(K, K, outs[j].W, outs[j].ldy, outs[j].N));
    const __nv_bfloat16 *xb = (const __nv_bfloat16 *)x;
    if (n == 1) return cu_gemm_big_multi_xb(c, xb, M, K, 1, outs, accumulate); /* cu_linear's path */
    hyla_linear_out wide[HYLA_LINEAR_MULTI_MAX], narrow[HYLA_LINEAR_MULTI_MAX];
    int nw, nn;
    split_narrow(c, M, K, n, outs, wide, &nw, narrow, &nn);
    if (nn) HYLA_TRY(cu_skinny_linear_multi_xb(c, xb, M, K, nn, narrow, accumulate));
    return nw ? cu_gemm_big_multi_xb(c, xb, M, K, nw, wide, accumulate) : HYLA_OK;
}

/* Routed exactly as n cu_linear calls would be (so the same bits); the skinny case runs as one
 * grouped launch. Prompt rows (flags & HYLA_LINEAR_PREFILL) go to linear_fixed_rows; decode rows
 * from bf16 rows to linear_multi_decode_xb. */
extern "C" hyla_status cu_linear_multi(void *ctx, const float *x, int ldx, int M, int K, int n,
                                       const hyla_linear_out *outs, int accumulate, int flags) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    if (n < 1 || n > HYLA_LINEAR_MULTI_MAX)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "linear_multi: %d outputs (1..%d)", n, HYLA_LINEAR_MULTI_MAX);
    if (M <= 0) return HYLA_OK;
    if ((flags & HYLA_LINEAR_X_BF16) && !(flags & HYLA_LINEAR_PREFILL))
        return linear_multi_decode_xb(c, x, ldx, M, K, n, outs, accumulate, flags);
    if (hyla_linear_multi_has_x(x, n, outs)) {
        /* outputs of their own x: one grouped launch where the skinny kernel reads fp32 rows
         * straight (cu_skinny_multi_own_x: a few decode rows, or a small K ahead of the large-M
         * path), else a call per x */
        if (!(flags & HYLA_LINEAR_PREFILL) && (!cu_gemm_big_ok(c, M, K) || K <= HYLA_CU_SK_OWN_K) &&
            cu_skinny_multi_own_x(c, M, K)) {
            for (int j = 0; j < n; j++)
                HYLA_TRY(cu_linear_check(outs[j].x && outs[j].x != x ? K : ldx, K, outs[j].W, outs[j].ldy, outs[j].N));
            HYLA_TRY(cu_linear_flags_check(c, flags, x, ldx, M, K, n, outs, accumulate)); /* bf16 flags: prompt rows */
            return cu_skinny_linear_multi(c, x, ldx, M, K, n, outs, accumulate);
        }
        return hyla_linear_multi_by_x(cu_linear_multi, ctx, x, ldx, M, K, n, outs, accumulate, flags);
    }
    for (int j = 0; j < n; j++) HYLA_TRY(cu_linear_check(ldx, K, outs[j].W, outs[j].ldy, outs[j].N));
    HYLA_TRY(cu_linear_flags_check(c, flags, x, ldx, M, K, n, outs, accumulate));
    if (flags & HYLA_LINEAR_PREFILL)
        return linear_fixed_rows(c, x, ldx, M, K, n, outs, accumulate, PROMPT_ROWS, NULL, flags);
    if (n > 1 && !cu_gemm_big_ok(c, M, K) && cu_skinny_multi_ok(c, M, K))
        return cu_skinny_linear_multi(c, x, ldx, M, K, n, outs, accumulate);
    if (n > 1 && cu_gemm_big_ok(c, M, K)) {
        hyla_linear_out wide[HYLA_LINEAR_MULTI_MAX], narrow[HYLA_LINEAR_MULTI_MAX];
        int nw, nn;
        split_narrow(c, M, K, n, outs, wide, &nw, narrow, &nn);
        if (nn) HYLA_TRY(cu_skinny_linear_multi(c, x, ldx, M, K, nn, narrow, accumulate));
        return nw ? cu_gemm_big_multi(c, x, ldx, M, K, nw, wide, accumulate) : HYLA_OK;
    }
    for (int j = 0; j < n; j++)
        HYLA_TRY(cu_linear(ctx, x, ldx, M, K, outs[j].W, outs[j].bias, outs[j].y, outs[j].ldy, outs[j].N, accumulate));
    return HYLA_OK;
}

/* Prompt rows: the SwiGLU is formed in the pass that rounds each block of rows to the GEMM's bf16
 * operand (the same values as swiglu then that rounding, one pass over gate and up fewer);
 * decode rows that cu_linear would give the skinny kernel: that kernel forms it as it stages x
 * (the same values again, one launch fewer); decode rows of the large-M path (the warpgroup
 * linear, k_gemm_big): formed in the pass that rounds them to its bf16 operand, as prompt rows
 * (no fp32 write, one launch fewer); other rows: swiglu in place, then linear. */
extern "C" hyla_status cu_swiglu_linear(void *ctx, float *gate, const float *up, int M, int K, const hyla_weight *W,
                                        float *y, int N, int flags) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    if (M <= 0) return HYLA_OK;
    HYLA_TRY(cu_linear_check(K, K, W, N, N));
    HYLA_TRY(cu_fused_flags_check("swiglu_linear", flags));
    const int acc = (flags & HYLA_LINEAR_ACC) != 0;
    if (flags & HYLA_LINEAR_X_BF16) {
        const hyla_linear_out lo = {W, NULL, y, N, N};
        prompt_pro pro = {up, 1, NULL, NULL, 0, 0, 0, 0.0f};
        return linear_fixed_rows(c, gate, K, M, K, 1, &lo, acc, PROMPT_ROWS, &pro, HYLA_LINEAR_PREFILL);
    }
    if (flags & HYLA_LINEAR_PREFILL) {
        const hyla_linear_out lo = {W, NULL, y, N, N};
        prompt_pro pro = {up, 0, NULL, NULL, 0, 0, 0, 0.0f};
        return linear_fixed_rows(c, gate, K, M, K, 1, &lo, acc, PROMPT_ROWS, &pro, HYLA_LINEAR_PREFILL);
    }
    /* decode rows on the skinny kernel's path of cu_linear: it forms the SwiGLU as it stages x */
    if (!cu_gemm_big_ok(c, M, K) && M <= 256 && K % 8 == 0)
        return cu_skinny_linear(c, gate, K, M, K, W, NULL, y, N, N, acc, up);
    if (cu_gemm_big_ok(c, M, K)) {
        void *xb;
        HYLA_TRY(cu_scratch(c, SCR_XB, (size_t)M * K * 2, &xb));
        HYLA_TRY(cu_swiglu_bf16_rows(c, gate, up, K, M, K, (__nv_bfloat16 *)xb));
        return cu_gemm_big_xb(c, (const __nv_bfloat16 *)xb, M, K, W, NULL, y, N, N, acc);
    }
    HYLA_TRY(cu_swiglu(ctx, gate, up, gate, (size_t)M * K));
    return cu_linear(ctx, gate, K, M, K, W, NULL, y, N, N, acc);
}

/* Prompt rows: the norm writes each block of rows as the GEMM's bf16 operand; decode rows of the
 * large-M path likewise, its operand in one pass (no fp32 write, one launch fewer); other rows:
 * the norm in place, then linear. */
extern "C" hyla_status cu_gated_rmsnorm_linear(void *ctx, float *o, const float *gate, const float *w, int H, int D,
                                               float eps, int M, const hyla_weight *W, float *y, int N, int flags) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    if (M <= 0) return HYLA_OK;
    const int K = H * D;
    HYLA_TRY(cu_linear_check(K, K, W, N, N));
    HYLA_TRY(cu_fused_flags_check("gated_rmsnorm_linear", flags));
    if ((flags & HYLA_LINEAR_GATE_BF16) && D % 4)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "gated_rmsnorm_linear: a bf16 gate needs D %% 4 == 0 (D %d)", D);
    const int acc = (flags & HYLA_LINEAR_ACC) != 0;
    if (flags & HYLA_LINEAR_PREFILL) {
        const hyla_linear_out lo = {W, NULL, y, N, N};
        prompt_pro pro = {NULL, 0, gate, w, (flags & HYLA_LINEAR_GATE_BF16) != 0, H, D, eps};
        return linear_fixed_rows(c, o, K, M, K, 1, &lo, acc, PROMPT_ROWS, &pro, HYLA_LINEAR_PREFILL);
    }
    if (cu_gemm_big_ok(c, M, K)) {
        void *xb;
        HYLA_TRY(cu_scratch(c, SCR_XB, (size_t)M * K * 2, &xb));
        HYLA_TRY(cu_gated_rmsnorm_bf16(c, o, gate, w, (__nv_bfloat16 *)xb, M * H, D, eps));
        return cu_gemm_big_xb(c, (const __nv_bfloat16 *)xb, M, K, W, NULL, y, N, N, acc);
    }
    HYLA_TRY(cu_gated_rmsnorm(ctx, o, gate, w, o, M * H, D, eps));
    return cu_linear(ctx, o, K, M, K, W, NULL, y, N, N, acc);
}

extern "C" hyla_status cu_linear(void *ctx, const float *x, int ldx, int M, int K, const hyla_weight *W,
                                 const float *bias, float *y, int ldy, int N, int accumulate) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    if (M <= 0) return HYLA_OK;
    HYLA_TRY(cu_linear_check(ldx, K, W, ldy, N));
    if (cu_gemm_big_ok(c, M, K)) return cu_gemm_big(c, x, ldx, M, K, W, bias, y, ldy, N, accumulate);
    if (M <= 256) return cu_skinny_linear(c, x, ldx, M, K, W, bias, y, ldy, N, accumulate, NULL);
    void *xb;
    HYLA_TRY(cu_scratch(c, SCR_LINEAR, (size_t)M * K * 2, &xb));
    HYLA_TRY(cu_f32_to_bf16_rows(c, x, ldx, M, K, (__nv_bfloat16 *)xb));
    float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    hyla_cu_gemm_plan *p = NULL;
    unsigned ac = ptr_align(y, (size_t)ldy * 4);
    HYLA_TRY(gemm_plan(c, M, N, K, ldy, accumulate, ac, NULL, &p));
    cublasStatus_t st = CUBLAS_STATUS_NOT_SUPPORTED;
    if (p && p->has_algo)
        st = cublasLtMatmul(c->lt, c->lt_desc, &alpha, W->d, p->la, xb, p->lb, &beta, y, p->lc, y, p->lc, &p->algo,
                            c->lt_workspace, c->lt_workspace_bytes, c->stream);
    if (st != CUBLAS_STATUS_SUCCESS) {
        CUBLAS_TRY(cublasGemmEx(c->cublas, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &alpha, W->d, CUDA_R_16BF, K, xb,
                                CUDA_R_16BF, K, &beta, y, CUDA_R_32F, ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    CU_LAUNCH_CHECK("linear");
    if (bias) HYLA_TRY(cu_add_bias_rows(c, y, ldy, M, N, bias));
    return HYLA_OK;
}

/* ---------------------------------------------------------------- context */

extern "C" void cu_destroy(void *ctx) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    if (!c) return;
    cudaSetDevice(c->device);
    if (c->stream) cudaStreamSynchronize(c->stream);
    if (c->copy_stream) cudaStreamSynchronize(c->copy_stream);
    cu_graphs_destroy(c);
    if (c->ev_compute) cudaEventDestroy(c->ev_compute);
    if (c->ev_copy) cudaEventDestroy(c->ev_copy);
    for (int i = 0; i < HYLA_CU_GEMM_PLANS; i++) {
        hyla_cu_gemm_plan *p = &c->plans[i];
        if (!p->key) continue;
        cublasLtMatrixLayoutDestroy(p->la);
        cublasLtMatrixLayoutDestroy(p->lb);
        cublasLtMatrixLayoutDestroy(p->lc);
    }
    if (c->lt_desc) cublasLtMatmulDescDestroy(c->lt_desc);
    if (c->lt) cublasLtDestroy(c->lt);
    if (c->cublas) cublasDestroy(c->cublas);
    cudaFree(c->lt_workspace);
    for (int i = 0; i < HYLA_CU_SCRATCH_SLOTS; i++) cudaFree(c->scratch[i]);
    cudaFree(c->sk_count);
    for (int i = 0; i < 2; i++) {
        if (c->bounce[i]) cudaFreeHost(c->bounce[i]);
        if (c->bounce_ev[i]) cudaEventDestroy(c->bounce_ev[i]);
    }
    if (c->ring_host) cudaFreeHost(c->ring_host);
    if (c->rb_host) cudaFreeHost(c->rb_host);
    if (c->so_host) cudaFreeHost(c->so_host);
    cudaFree(c->ring_dev);
    cu_pool_destroy(c, c->pool);
    if (c->copy_stream) cudaStreamDestroy(c->copy_stream);
    if (c->stream) cudaStreamDestroy(c->stream);
    free(c);
}

static hyla_status ctx_init(hyla_cuda_ctx *c, int device) {
    int n = 0;
    CU_TRY(cudaGetDeviceCount(&n));
    if (device < 0 || device >= n)
        return hyla_fail(HYLA_ERR_DEVICE, "cuda:%d: this machine has %d CUDA device(s)", device, n);
    CU_TRY(cudaSetDevice(device));
    c->device = device;
    cudaDeviceProp prop;
    CU_TRY(cudaGetDeviceProperties(&prop, device));
    if (prop.major < 8)
        return hyla_fail(HYLA_ERR_UNSUPPORTED, "cuda:%d (%s) has compute capability %d.%d; bf16 kernels need 8.0+",
                         device, prop.name, prop.major, prop.minor);
    c->sm_count = prop.multiProcessorCount;
    c->smem_optin = prop.sharedMemPerBlockOptin;
    CU_TRY(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    CU_TRY(cudaStreamCreateWithFlags(&c->copy_stream, cudaStreamNonBlocking));
    CUBLAS_TRY(cublasCreate(&c->cublas));
    CUBLAS_TRY(cublasSetStream(c->cublas, c->stream));
    CUBLAS_TRY(cublasLtCreate(&c->lt));
    CUBLAS_TRY(cublasLtMatmulDescCreate(&c->lt_desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CUBLAS_TRY(cublasLtMatmulDescSetAttribute(c->lt_desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CUBLAS_TRY(cublasLtMatmulDescSetAttribute(c->lt_desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    c->lt_workspace_bytes = (size_t)32 << 20;
    CU_TRY(cudaMalloc(&c->lt_workspace, c->lt_workspace_bytes));
    CUBLAS_TRY(cublasSetWorkspace(c->cublas, c->lt_workspace, c->lt_workspace_bytes));
    c->ring_bytes = RING_BYTES;
    CU_TRY(cudaMallocHost((void **)&c->ring_host, c->ring_bytes));
    CU_TRY(cudaMalloc((void **)&c->ring_dev, c->ring_bytes));
    c->bounce_bytes = BOUNCE_BYTES;
    for (int i = 0; i < 2; i++) {
        CU_TRY(cudaMallocHost((void **)&c->bounce[i], c->bounce_bytes));
        CU_TRY(cudaEventCreateWithFlags(&c->bounce_ev[i], cudaEventDisableTiming));
    }
    /* a device that cannot map host memory reads back through the copy engine */
    if (prop.canMapHostMemory && cudaHostAlloc((void **)&c->rb_host, READBACK_BYTES, cudaHostAllocMapped) == cudaSuccess) {
        if (cudaHostGetDevicePointer(&c->rb_dev, c->rb_host, 0) == cudaSuccess) {
            c->rb_bytes = READBACK_BYTES;
        } else {
            cudaFreeHost(c->rb_host);
            c->rb_host = NULL;
            c->rb_dev = NULL;
        }
    }
    (void)cudaGetLastError();
    CU_TRY(cudaEventCreateWithFlags(&c->ev_compute, cudaEventDisableTiming));
    CU_TRY(cudaEventCreateWithFlags(&c->ev_copy, cudaEventDisableTiming));
    HYLA_TRY(cu_pool_create(c, &c->pool));
    HYLA_TRY(cu_graphs_create(c));
    /* the one operator switch (docs/CUDA.md): HYLA_CUDA_GRAPHS=0 turns graphs off, the same bits */
    const char *ge = getenv("HYLA_CUDA_GRAPHS");
    c->graphs_on = !(ge && !strcmp(ge, "0"));
    const char *pb = getenv("HYLA_CUDA_PROMPT_BLOCKS");
    c->prompt_blocks = pb && atoi(pb) >= 1 && atoi(pb) <= 64 ? atoi(pb) : 32;
    const char *pe = getenv("HYLA_CUDA_PDL");
    c->pdl = !(pe && !strcmp(pe, "0"));
    cu_skinny_cluster_init(c);
    cu_gemm_wg_init(c, prop.major);
    c->hopper = prop.major == 9;
    const char *bw = getenv("HYLA_CUDA_CHUNK_B_WG");
    c->chunk_b_wg = !(bw && !strcmp(bw, "0")) && c->hopper;
    const char *pv = getenv("HYLA_CUDA_GDN_PIPE_VW");
    c->gdn_pipe_vw = pv && (atoi(pv) == 64 || atoi(pv) == 128) ? atoi(pv) : 0;
    c->sse_windows = 1;
    c->attn_split_len = 8192;
    /* HYLA_CUDA_ATTN_SPLIT=N: flash prefill's key splits of N keys (0: one pass), as
     * hyla_cuda_set_attn_split; other bits than the default wherever keys reach past it */
    const char *as = getenv("HYLA_CUDA_ATTN_SPLIT");
    if (as && *as) {
        char *end = NULL;
        const long v = strtol(as, &end, 10);
        if (*end || !cu_attn_split_ok(v))
            HYLA_WARN("HYLA_CUDA_ATTN_SPLIT=%s ignored: not 0 or a multiple of 64 up to 2^24 (keeping %d)", as,
                      c->attn_split_len);
        else
            c->attn_split_len = (int)v;
    }
    /* HYLA_CUDA_ATTN_WALK=N: the fewest blocks of 64 queries (over the heads) a flash prefill
     * walks its splits in (0: never), as hyla_cuda_set_attn_walk; the same bits either way */
    c->attn_walk = 16 * c->sm_count;
    const char *awk = getenv("HYLA_CUDA_ATTN_WALK");
    if (awk && *awk) {
        char *end = NULL;
        const long v = strtol(awk, &end, 10);
        if (*end || v < 0 || v > INT_MAX)
            HYLA_WARN("HYLA_CUDA_ATTN_WALK=%s ignored: not a block count (keeping %d)", awk, c->attn_walk);
        else
            c->attn_walk = (int)v;
    }
    const char *aw = getenv("HYLA_CUDA_ATTN_WG");
    c->attn_wg = !(aw && !strcmp(aw, "0")) && c->hopper;
    const char *gt = getenv("HYLA_CUDA_GLA_TILES");
    c->gla_tiles = !(gt && !strcmp(gt, "0"));
    const char *aw2 = getenv("HYLA_CUDA_ATTN_WG2");
    c->attn_wg2 = aw2 && *aw2 ? atoi(aw2) : 8192;
    if (c->attn_wg2 < 0) c->attn_wg2 = 0;
    CU_TRY(cudaMalloc((void **)&c->sk_count, HYLA_CU_SK_COUNTS * sizeof(unsigned)));
    CU_TRY(cudaMemsetAsync(c->sk_count, 0, HYLA_CU_SK_COUNTS * sizeof(unsigned), c->stream));
    return HYLA_OK;
}

extern "C" hyla_status hyla_cuda_backend_create(int device, hyla_backend **out) {
    *out = NULL;
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)calloc(1, sizeof *c);
    hyla_backend *b = (hyla_backend *)calloc(1, sizeof *b);
    if (!c || !b) {
        free(c);
        free(b);
        return hyla_fail(HYLA_ERR_NOMEM, "cuda backend: out of host memory");
    }
    hyla_status s = ctx_init(c, device);
    if (s != HYLA_OK) {
        cu_destroy(c);
        free(b);
        return hyla_fail_wrap(s, "cuda:%d", device);
    }
    b->ops = &hyla_cuda_ops_table;
    b->ctx = c;
    /* 16384: every model measured prefills 0.3-3 % faster than at 8192 (BENCHMARKS.md "Prefill
     * pieces of 16k: the default"), and a prompt's piece reserves no logits, so its scratch is
     * about what 8192 rows took with logits */
    b->prefill_piece = 16384;
    *out = b;
    return HYLA_OK;
}

extern "C" int hyla_cuda_available(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* clear the "no device" error */
        return 0;
    }
    return n > 0;
}

/* ---------------------------------------------------------------- hyla_cuda_extra.h */

#include "hyla_cuda_extra.h"

static hyla_cuda_ctx *extra_ctx(hyla_backend *be) {
    if (!be || !be->ops || !be->ops->name || strcmp(be->ops->name, "cuda")) return NULL;
    return (hyla_cuda_ctx *)be->ctx;
}

extern "C" hyla_status hyla_cuda_device_info(hyla_backend *be, char *name, size_t name_len, int *sm_count,
                                             double *mem_gib) {
    hyla_cuda_ctx *c = extra_ctx(be);
    if (!c) return hyla_fail(HYLA_ERR_INVALID_ARG, "hyla_cuda_device_info: not a cuda backend");
    cudaDeviceProp prop;
    CU_TRY(cudaGetDeviceProperties(&prop, c->device));
    if (name && name_len) snprintf(name, name_len, "%s", prop.name);
    if (sm_count) *sm_count = prop.multiProcessorCount;
    if (mem_gib) *mem_gib = (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0);
    return HYLA_OK;
}

extern "C" hyla_status hyla_cuda_set_gemm_wg_min(hyla_backend *be, int rows) {
    hyla_cuda_ctx *c = extra_ctx(be);
    if (!c) return hyla_fail(HYLA_ERR_INVALID_ARG, "hyla_cuda_set_gemm_wg_min: not a cuda backend");
    if (rows < 1 || rows > 256)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "hyla_cuda_set_gemm_wg_min: %d rows (1..256)", rows);
    if (!c->gemm_wg_min_env) c->gemm_wg_min = rows; /* the environment's setting wins */
    return HYLA_OK;
}

extern "C" hyla_status hyla_cuda_switches(hyla_backend *be, char *buf, size_t len) {
    hyla_cuda_ctx *c = extra_ctx(be);
    if (!c) return hyla_fail(HYLA_ERR_INVALID_ARG, "hyla_cuda_switches: not a cuda backend");
    if (buf && len)
        snprintf(buf, len,
                 "graphs=%d pdl=%d prompt_blocks=%d sk_cluster=%d sk_cluster_max=%d gemm_wg=%d gemm_wg_min=%d "
                 "gemm_wgp=%d gemm_wg_n64=%d decode_bf16=%d chunk_b_wg=%d gdn_pipe_vw=%d attn_wg=%d attn_wg2=%d "
                 "attn_split=%d attn_walk=%d gla_tiles=%d",
                 c->graphs_on, c->pdl, c->prompt_blocks, c->sk_cluster, c->sk_cluster_max, c->gemm_wg, c->gemm_wg_min,
                 c->gemm_wgp, c->gemm_wg_n64, c->decode_bf16, c->chunk_b_wg, c->gdn_pipe_vw, c->attn_wg, c->attn_wg2,
                 c->attn_split_len, c->attn_walk, c->gla_tiles);
    return HYLA_OK;
}

__global__ void k_fill_bf16(__nv_bfloat16 *p, size_t n, uint32_t seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t x = (uint32_t)i * 2654435761u ^ seed;
        x ^= x >> 13;
        x *= 0x5bd1e995u;
        x ^= x >> 15;
        p[i] = __float2bfloat16_rn(((float)(x & 0xffff) / 65536.0f - 0.5f) * 0.1f);
    }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

extern "C" hyla_status hyla_cuda_bench_gemm_bf16(hyla_backend *be, int M, int N, int K, int iters, double *ms) {
    hyla_cuda_ctx *c = extra_ctx(be);
    if (!c) return hyla_fail(HYLA_ERR_INVALID_ARG, "hyla_cuda_bench_gemm_bf16: not a cuda backend");
    HYLA_TRY(cu_graph_flush(c));
    if (iters < 1) iters = 1;
    if (iters > 64) iters = 64;
    __nv_bfloat16 *A = NULL, *B = NULL, *C = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    hyla_status st = HYLA_OK;
    double t[64];
#define G(expr)                                                                                 \
    do {                                                                                        \
        cudaError_t e_ = (expr);                                                                \
        if (e_ != cudaSuccess) { st = hyla_cuda_fail(e_, #expr, __FILE__, __LINE__); goto out; } \
    } while (0)
#define GB(expr)                                                                                    \
    do {                                                                                            \
        cublasStatus_t e_ = (expr);                                                                 \
        if (e_ != CUBLAS_STATUS_SUCCESS) { st = hyla_cublas_fail(e_, #expr, __FILE__, __LINE__); goto out; } \
    } while (0)
    {
        G(cudaMalloc((void **)&A, (size_t)M * K * 2));
        G(cudaMalloc((void **)&B, (size_t)N * K * 2));
        G(cudaMalloc((void **)&C, (size_t)M * N * 2));
        k_fill_bf16<<<1024, 256, 0, c->stream>>>(A, (size_t)M * K, 1);
        k_fill_bf16<<<1024, 256, 0, c->stream>>>(B, (size_t)N * K, 2);
        G(cudaGetLastError());
        GB(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
        GB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
        GB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
        GB(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, K, N, K));
        GB(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, K, M, K));
        GB(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, N, M, N));
        GB(cublasLtMatmulPreferenceCreate(&pref));
        GB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &c->lt_workspace_bytes,
                                                sizeof c->lt_workspace_bytes));
        cublasLtMatmulHeuristicResult_t res;
        int found = 0;
        GB(cublasLtMatmulAlgoGetHeuristic(c->lt, desc, la, lb, lc, lc, pref, 1, &res, &found));
        if (!found) {
            st = hyla_fail(HYLA_ERR_DEVICE, "cublasLt found no bf16 algorithm for %dx%dx%d", M, N, K);
            goto out;
        }
        float alpha = 1.0f, beta = 0.0f;
        G(cudaEventCreate(&e0));
        G(cudaEventCreate(&e1));
        for (int i = 0; i < iters + 2; i++) {
            G(cudaEventRecord(e0, c->stream));
            GB(cublasLtMatmul(c->lt, desc, &alpha, B, la, A, lb, &beta, C, lc, C, lc, &res.algo, c->lt_workspace,
                              c->lt_workspace_bytes, c->stream));
            G(cudaEventRecord(e1, c->stream));
            G(cudaEventSynchronize(e1));
            float f;
            G(cudaEventElapsedTime(&f, e0, e1));
            if (i >= 2) t[i - 2] = f;
        }
        qsort(t, (size_t)iters, sizeof t[0], cmp_double);
        *ms = t[iters / 2];
    }
out:
#undef G
#undef GB
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (desc) cublasLtMatmulDescDestroy(desc);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaStreamSynchronize(c->stream);
    cudaFree(A);
    cudaFree(B);
    cudaFree(C);
    return st;
}

extern "C" hyla_status hyla_cuda_prefill_varlen(hyla_backend *be, int gdn, int H, int dk, int dv, float scale,
                                                const float *q, const float *k, const float *v, const float *ga,
                                                const float *gb, float *o, int nseq, const int32_t *start,
                                                const int32_t *len, float *const *S) {
    hyla_cuda_ctx *c = extra_ctx(be);
    if (!c) return hyla_fail(HYLA_ERR_INVALID_ARG, "hyla_cuda_prefill_varlen: not a cuda backend");
    HYLA_TRY(cu_graph_flush(c));
    hyla_cu_linattn_batch b;
    memset(&b, 0, sizeof b);
    b.gdn = gdn;
    b.H = H;
    b.dk = dk;
    b.dv = dv;
    b.scale = scale;
    b.q = q;
    b.k = k;
    b.v = v;
    b.ga = ga;
    b.gb = gb;
    b.o = o;
    b.nseq = nseq;
    b.h_start = start;
    b.h_len = len;
    b.h_S = S;
    return cu_linattn_prefill_batch(c, &b);
}

extern "C" hyla_status hyla_cuda_set_sse_windows(hyla_backend *be, int on) {
    hyla_cuda_ctx *c = extra_ctx(be);
    if (!c) return hyla_fail(HYLA_ERR_INVALID_ARG, "hyla_cuda_set_sse_windows: not a cuda backend");
    c->sse_windows = on ? 1 : 0;
    return HYLA_OK;
}

/* worker/hyla_tp.c reaches hyla_cuda_nccl.cu's and hyla_cuda_psum.cu's entry points through
 * weak references (it links without the CUDA backend too), and a weak reference does not pull an
 * object out of a static library: this object, linked whenever the cuda backend is, holds strong
 * ones. */
extern "C" __attribute__((used)) void *const hyla_cuda_tp_entry_points[] = {
    (void *)hyla_cuda_nccl_id,    (void *)hyla_cuda_nccl_open,  (void *)hyla_cuda_nccl_allreduce,
    (void *)hyla_cuda_nccl_close, (void *)hyla_cuda_bind_thread, (void *)hyla_cuda_psum_open,
    (void *)hyla_cuda_psum_ready, (void *)hyla_cuda_psum_issue, (void *)hyla_cuda_psum_join,
    (void *)hyla_cuda_psum_reset, (void *)hyla_cuda_psum_close, (void *)hyla_cuda_psum_oneshot,
    (void *)hyla_cuda_psum_oneshot_max, (void *)hyla_cuda_psum_oneshot_buf,
    (void *)hyla_cuda_psum_set_push_min, (void *)hyla_cuda_flush};
