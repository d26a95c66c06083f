/* hyla_cuda_dense.cu — the dense ops of the CUDA backend: embedding, norms, elementwise
 * activations and gates, RoPE, short convolution, gated RMSNorm, the bf16 conversion that
 * feeds cuBLAS, and sampling.
 *
 * Row ops (norms, softmax) give a row to one warp (short rows) or one block (long rows), a
 * layout chosen from the row length alone, with fp32 sums in a fixed order, so every result is
 * deterministic and independent of the number of rows. Elementwise ops move float4s when the
 * pointers allow; the short convolution runs in place. Sampling runs one block per
 * row: top-k / top-p thresholds by radix descent over 64-bit keys (probability bits, then
 * ~index), then the draw in vocabulary order by a prefix sum, all with integer (fixed-point
 * 2^-40) masses, so ties and sums never depend on thread timing.
 * Math follows docs/MODELS.md; tags like [NORM-0] cite it.
 * Threading: launched on the context's stream; no host state beyond the call. */
#include <limits.h>
#include <math.h>
#include <string.h>

#include "hyla_cuda_impl.h"
#include "hyla_cuda_rowmath.cuh"

#define TPB 256

/* ---------------------------------------------------------------- helpers */

/* warp_sum, warp_max, silu_f, sq_acc: hyla_cuda_rowmath.cuh */

/* ---------------------------------------------------------------- conversion for cuBLAS */

__global__ void k_f32_to_bf16_rows(const float *__restrict__ x, int ldx, int M, int K, __nv_bfloat16 *__restrict__ out) {
    pdl_trigger(); /* launched by cu_launch_pdl */
    pdl_wait();
    size_t total = (size_t)M * K;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / K, cidx = i - r * K;
        out[i] = __float2bfloat16_rn(x[r * ldx + cidx]);
    }
}

__global__ void k_f32_to_bf16_vec4(const float4 *__restrict__ x, int ldx4, int M, int K4, __nv_bfloat162 *__restrict__ out) {
    pdl_trigger(); /* launched by cu_launch_pdl */
    pdl_wait();
    size_t total = (size_t)M * K4;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / K4, cidx = i - r * K4;
        float4 v = x[r * ldx4 + cidx];
        out[2 * i] = __floats2bfloat162_rn(v.x, v.y);
        out[2 * i + 1] = __floats2bfloat162_rn(v.z, v.w);
    }
}

static unsigned grid_for(size_t n) {
    size_t b = (n + TPB - 1) / TPB;
    if (b > 65535u * 8) b = 65535u * 8;
    return (unsigned)(b ? b : 1);
}

extern "C" hyla_status cu_f32_to_bf16_rows(hyla_cuda_ctx *c, const float *x, int ldx, int M, int K, __nv_bfloat16 *out) {
    if (K % 4 == 0 && ldx % 4 == 0 && ((uintptr_t)x & 15) == 0) {
        size_t n = (size_t)M * (K / 4);
        HYLA_TRY(cu_launch_pdl(c, k_f32_to_bf16_vec4, grid_for(n), TPB, 0, (const float4 *)x, ldx / 4, M, K / 4,
                               (__nv_bfloat162 *)out));
    } else {
        size_t n = (size_t)M * K;
        HYLA_TRY(cu_launch_pdl(c, k_f32_to_bf16_rows, grid_for(n), TPB, 0, x, ldx, M, K, out));
    }
    CU_LAUNCH_CHECK("f32_to_bf16");
    return HYLA_OK;
}

/* silu(g) * u as the swiglu op computes it in fp32, rounded to bf16: the down projection's
 * operand without the fp32 pass between (see swiglu_linear) */
__global__ void k_swiglu_bf16_rows(const float *__restrict__ g, const float *__restrict__ u, int ld, int M, int K,
                                   __nv_bfloat16 *__restrict__ out) {
    pdl_trigger(); /* launched by cu_launch_pdl */
    pdl_wait();
    size_t total = (size_t)M * K;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / K, cidx = i - r * K;
        out[i] = __float2bfloat16_rn(silu_f(g[r * ld + cidx]) * u[r * ld + cidx]);
    }
}

__global__ void k_swiglu_bf16_vec4(const float4 *__restrict__ g, const float4 *__restrict__ u, int ld4, int M, int K4,
                                   __nv_bfloat162 *__restrict__ out) {
    pdl_trigger(); /* launched by cu_launch_pdl */
    pdl_wait();
    size_t total = (size_t)M * K4;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / K4, cidx = i - r * K4;
        float4 a = g[r * ld4 + cidx], b = u[r * ld4 + cidx];
        out[2 * i] = __floats2bfloat162_rn(silu_f(a.x) * b.x, silu_f(a.y) * b.y);
        out[2 * i + 1] = __floats2bfloat162_rn(silu_f(a.z) * b.z, silu_f(a.w) * b.w);
    }
}

extern "C" hyla_status cu_swiglu_bf16_rows(hyla_cuda_ctx *c, const float *g, const float *u, int ld, int M, int K,
                                           __nv_bfloat16 *out) {
    if (K % 4 == 0 && ld % 4 == 0 && ((uintptr_t)g & 15) == 0 && ((uintptr_t)u & 15) == 0) {
        size_t n = (size_t)M * (K / 4);
        HYLA_TRY(cu_launch_pdl(c, k_swiglu_bf16_vec4, grid_for(n), TPB, 0, (const float4 *)g, (const float4 *)u, ld / 4,
                               M, K / 4, (__nv_bfloat162 *)out));
    } else {
        size_t n = (size_t)M * K;
        HYLA_TRY(cu_launch_pdl(c, k_swiglu_bf16_rows, grid_for(n), TPB, 0, g, u, ld, M, K, out));
    }
    CU_LAUNCH_CHECK("swiglu_bf16");
    return HYLA_OK;
}

/* The same from bf16 gate and up rows [M][K] (the MLP's prompt GEMMs' HYLA_LINEAR_Y_BF16 outputs):
 * silu and the product in fp32 on the widened values, rounded once; 8 values a thread. */
__global__ void k_swiglu_bf16in_vec8(const uint4 *__restrict__ g, const uint4 *__restrict__ u, size_t n8,
                                     uint4 *__restrict__ out) {
    pdl_trigger(); /* launched by cu_launch_pdl */
    pdl_wait();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n8; i += (size_t)gridDim.x * blockDim.x) {
        uint4 a = g[i], b = u[i], r;
        const __nv_bfloat162 *pa = (const __nv_bfloat162 *)&a, *pb = (const __nv_bfloat162 *)&b;
        __nv_bfloat162 *pr = (__nv_bfloat162 *)&r;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float2 x = __bfloat1622float2(pa[j]), y = __bfloat1622float2(pb[j]);
            pr[j] = __floats2bfloat162_rn(silu_f(x.x) * y.x, silu_f(x.y) * y.y);
        }
        out[i] = r;
    }
}
__global__ void k_swiglu_bf16in(const __nv_bfloat16 *__restrict__ g, const __nv_bfloat16 *__restrict__ u, size_t n,
                                __nv_bfloat16 *__restrict__ out) {
    pdl_trigger(); /* launched by cu_launch_pdl */
    pdl_wait();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16_rn(silu_f(__bfloat162float(g[i])) * __bfloat162float(u[i]));
}

/* n contiguous values (rows of gate and up with stride K): the vector form where all three are
 * 16-byte aligned and n % 8 == 0, else one value a thread (the same arithmetic) */
extern "C" hyla_status cu_swiglu_bf16in(hyla_cuda_ctx *c, const __nv_bfloat16 *g, const __nv_bfloat16 *u, size_t n,
                                        __nv_bfloat16 *out) {
    if (n % 8 == 0 && (((uintptr_t)g | (uintptr_t)u | (uintptr_t)out) & 15) == 0)
        HYLA_TRY(cu_launch_pdl(c, k_swiglu_bf16in_vec8, grid_for(n / 8), TPB, 0, (const uint4 *)g, (const uint4 *)u,
                               n / 8, (uint4 *)out));
    else
        HYLA_TRY(cu_launch_pdl(c, k_swiglu_bf16in, grid_for(n), TPB, 0, g, u, n, out));
    CU_LAUNCH_CHECK("swiglu_bf16in");
    return HYLA_OK;
}

__global__ void k_add_bias_rows(float *y, int ldy, int M, int N, const float *bias) {
    size_t total = (size_t)M * N;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / N, cidx = i - r * N;
        y[r * ldy + cidx] += bias[cidx];
    }
}

extern "C" hyla_status cu_add_bias_rows(hyla_cuda_ctx *c, float *y, int ldy, int M, int N, const float *bias) {
    size_t n = (size_t)M * N;
    k_add_bias_rows<<<grid_for(n), TPB, 0, c->stream>>>(y, ldy, M, N, bias);
    CU_LAUNCH_CHECK("add_bias");
    return HYLA_OK;
}

/* ---------------------------------------------------------------- embedding */

__global__ void k_embed(const __nv_bfloat16 *__restrict__ table, const int32_t *__restrict__ ids, int n, int D,
                        float *__restrict__ out) {
    size_t total = (size_t)n * D;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / D, d = i - r * D;
        out[i] = __bfloat162float(table[(size_t)ids[r] * D + d]);
    }
}

extern "C" hyla_status cu_embed_check(const hyla_weight *table, const int32_t *ids, int n) {
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= table->rows)
            return hyla_fail(HYLA_ERR_INVALID_ARG, "embed: token id %d at %d is outside the vocabulary [0, %d)", ids[i],
                             i, table->rows);
    return HYLA_OK;
}

extern "C" hyla_status cu_embed_dev(hyla_cuda_ctx *c, const hyla_weight *table, const int32_t *d_ids, int n,
                                    float *out) {
    if (n <= 0) return HYLA_OK;
    size_t total = (size_t)n * table->cols;
    k_embed<<<grid_for(total), TPB, 0, c->stream>>>(table->d, d_ids, n, table->cols, out);
    CU_LAUNCH_CHECK("embed");
    return HYLA_OK;
}

extern "C" hyla_status cu_embed(void *ctx, const hyla_weight *table, const int32_t *ids, int n, float *out) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    if (n <= 0) return HYLA_OK;
    HYLA_TRY(cu_embed_check(table, ids, n));
    void *d_ids;
    HYLA_TRY(cu_stage(c, ids, (size_t)n * 4, &d_ids));
    return cu_embed_dev(c, table, (const int32_t *)d_ids, n, out);
}

/* ---------------------------------------------------------------- row ops */

/* A row's layout is a function of D only, so a row's arithmetic never depends on the number of
 * rows, on the row's place or on the buffers' alignment:
 *   - units: D % 4 == 0: D/4 units of 4 floats (one float4 load when every pointer of the call
 *     is 16-byte aligned, else 4 scalar loads of the same values); otherwise D units of 1 float;
 *   - group: a row of <= 128 units is owned by one warp (8 rows per block of 256); a longer
 *     row by one block of G = min(512, 32·ceil(units / 128)) threads;
 *   - thread t of the group owns units t, t + G, t + 2G, ...; the first ROW_RC of them stay in
 *     registers between the passes, further ones (rows over ROW_RC·G units) are read again;
 *   - sums: each thread adds its units in ascending order (within a unit .x, .y, .z, .w, by
 *     fmaf for squares), the warp by a xor butterfly (every lane gets the same bits), a block's
 *     warps in warp order.
 * One row is read once and written once (rmsnorm: 8 bytes per element). */
#define ROW_RC 4
#define ROW_MAXG 512
#define ROW_WARP_ROWS 8

template <int V4, int A16> __device__ __forceinline__ float4 ld_u(const float *row, int u) {
    if (V4) {
        if (A16) return reinterpret_cast<const float4 *>(row)[u];
        const float *p = row + 4 * u;
        return make_float4(p[0], p[1], p[2], p[3]);
    }
    return make_float4(row[u], 0.0f, 0.0f, 0.0f);
}
template <int V4, int A16> __device__ __forceinline__ void st_u(float *row, int u, float4 v) {
    if (V4) {
        if (A16) {
            reinterpret_cast<float4 *>(row)[u] = v;
            return;
        }
        float *p = row + 4 * u;
        p[0] = v.x, p[1] = v.y, p[2] = v.z, p[3] = v.w;
        return;
    }
    row[u] = v.x;
}
template <int V4> __device__ __forceinline__ float max_acc(float m, float4 v) {
    m = fmaxf(m, v.x);
    if (V4) m = fmaxf(fmaxf(fmaxf(m, v.y), v.z), v.w);
    return m;
}
/* x * s * w per component (the order of the scalar kernels: (x * s) * w) */
__device__ __forceinline__ float4 mul_sw(float4 x, float s, float4 w) {
    return make_float4(x.x * s * w.x, x.y * s * w.y, x.z * s * w.z, x.w * s * w.w);
}

/* Sum (MAX = false) / max over the row's group (WARP: the warp; else the block, sh[32] shared):
 * the warps' results combined in warp order. */
template <int WARP, bool MAX> __device__ __forceinline__ float group_reduce(float v, float *sh) {
    v = MAX ? warp_max(v) : warp_sum(v);
    if (WARP) return v;
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    float t = sh[0];
    for (int i = 1; i < (int)(blockDim.x >> 5); i++) t = MAX ? fmaxf(t, sh[i]) : t + sh[i];
    __syncthreads(); /* sh is reused by the next reduction */
    return t;
}
template <int WARP> __device__ __forceinline__ float group_sum(float v, float *sh) {
    return group_reduce<WARP, false>(v, sh);
}
template <int WARP> __device__ __forceinline__ float group_max(float v, float *sh) {
    return group_reduce<WARP, true>(v, sh);
}

/* The group's row, thread index in the group and group size (ROW_SETUP: also the wait for the
 * kernel ahead, the return past the last row and U, the row's units). */
#define ROW_INDEX                                                                    \
    int row, t, G;                                                                   \
    if (WARP) {                                                                      \
        row = blockIdx.x * ROW_WARP_ROWS + (threadIdx.x >> 5), t = threadIdx.x & 31; \
        G = 32;                                                                      \
    } else {                                                                         \
        row = blockIdx.x, t = threadIdx.x, G = blockDim.x;                           \
    }
#define ROW_SETUP(nrows)                                                             \
    pdl_trigger(); /* the next kernel may start (cu_launch_pdl) ... */                \
    pdl_wait();    /* ... and this one reads nothing before the one ahead is done */ \
    ROW_INDEX                                                                        \
    if (row >= (nrows)) return;                                                      \
    const int U = V4 ? D / 4 : D;

/* ROW_SETUP for the norms, which also take the thread's first ROW_RC units of their weight w [D]
 * into cw before the wait: no kernel writes weights, so they load while the kernel ahead still
 * runs, and the output pass does not wait on them after the reduction. */
#define ROW_SETUP_W(nrows, w, cw) ROW_SETUP_WN(nrows, w, cw, ROW_RC)
/* ... caching the first RC units (a row op whose thread owns at most RC units caches them all) */
#define ROW_SETUP_WN(nrows, w, cw, RC)                                               \
    pdl_trigger();                                                                   \
    ROW_INDEX                                                                        \
    const int U = V4 ? D / 4 : D;                                                    \
    float4 cw[RC];                                                                   \
    _Pragma("unroll") for (int k_ = 0; k_ < RC; k_++) {                              \
        const int u_ = t + k_ * G;                                                   \
        if (u_ < U) cw[k_] = ld_u<V4, A16>(w, u_);                                   \
    }                                                                                \
    pdl_wait();                                                                      \
    if (row >= (nrows)) return;

/* The first pass of a row op: v = acc(v, unit) over this thread's units of the row in unit
 * order, from v0, the first RC units cached in c (how many are cached changes no value: the
 * units are taken in the same order either way). */
template <int V4, int A16, int RC, typename Acc>
__device__ __forceinline__ float row_first_pass(float4 (&c)[RC], const float *xr, float v0, int t, int G, int U,
                                                Acc acc) {
    float v = v0;
#pragma unroll
    for (int k = 0; k < RC; k++) {
        int u = t + k * G;
        if (u < U) {
            c[k] = ld_u<V4, A16>(xr, u);
            v = acc(v, c[k]);
        }
    }
    for (int u = t + RC * G; u < U; u += G) v = acc(v, ld_u<V4, A16>(xr, u));
    return v;
}

/* The norms' first pass: the sum of squares (sq_acc). */
template <int V4, int A16, int RC>
__device__ __forceinline__ float row_sumsq(float4 (&c)[RC], const float *xr, int t, int G, int U) {
    return row_first_pass<V4, A16>(c, xr, 0.0f, t, G, U, [](float ss, float4 x) { return sq_acc<V4>(ss, x); });
}

/* xr's cached units (the first RC of this thread) <- c * inv; the caller writes the rest. */
template <int V4, int A16, int RC>
__device__ __forceinline__ void row_scale_cached(float *xr, const float4 (&c)[RC], float inv, int t, int G, int U) {
#pragma unroll
    for (int k = 0; k < RC; k++) {
        int u = t + k * G;
        if (u < U) st_u<V4, A16>(xr, u, make_float4(c[k].x * inv, c[k].y * inv, c[k].z * inv, c[k].w * inv));
    }
}

/* the row's store: fp32 as st_u, or rounded to bf16 (a GEMM's operand: gated_rmsnorm_linear) */
template <int V4, int A16> __device__ __forceinline__ void st_out(float *row, int u, float4 v) { st_u<V4, A16>(row, u, v); }
template <int V4, int A16> __device__ __forceinline__ void st_out(__nv_bfloat16 *row, int u, float4 v) {
    if (V4) {
        __nv_bfloat162 *p = (__nv_bfloat162 *)(row + 4 * u);
        p[0] = __floats2bfloat162_rn(v.x, v.y);
        p[1] = __floats2bfloat162_rn(v.z, v.w);
    } else {
        row[u] = __float2bfloat16_rn(v.x);
    }
}

/* The output pass of both RMSNorms: y = v * inv * w over the row's units, v from the values cached
 * in registers for the first ROW_RC units of this thread and re-read from src (the row itself)
 * for the rest; cw: w's first ROW_RC units of this thread (ROW_SETUP_W). */
template <int V4, int A16, typename OUT>
__device__ __forceinline__ void rms_scale_store(OUT *yr, const float4 (&c)[ROW_RC], const float *src, float inv,
                                                const float *__restrict__ w, const float4 (&cw)[ROW_RC], int t, int G,
                                                int U) {
#pragma unroll
    for (int k = 0; k < ROW_RC; k++) {
        int u = t + k * G;
        if (u < U) st_out<V4, A16>(yr, u, mul_sw(c[k], inv, cw[k]));
    }
    for (int u = t + ROW_RC * G; u < U; u += G)
        st_out<V4, A16>(yr, u, mul_sw(ld_u<V4, A16>(src, u), inv, ld_u<V4, A16>(w, u)));
}

/* [NORM-0] y = x * rsqrt(mean(x^2) + eps) * w; y may alias x (every read of the row happens
 * before the group's reduction, every write after it, and re-read units are the thread's own). */
template <int V4, int A16, int WARP, typename OUT>
__device__ __forceinline__ void rmsnorm_row(const float *x, const float *__restrict__ w, OUT *y, int n, int D, float eps,
                                            float *sh) {
    ROW_SETUP_W(n, w, cw);
    const float *xr = x + (size_t)row * D;
    float4 cx[ROW_RC];
    float ss = group_sum<WARP>(row_sumsq<V4, A16>(cx, xr, t, G, U), sh);
    float inv = rsqrtf(ss / D + eps);
    rms_scale_store<V4, A16>(y + (size_t)row * D, cx, xr, inv, w, cw, t, G, U);
}
template <int V4, int A16, int WARP>
__global__ void __launch_bounds__(ROW_MAXG) k_rmsnorm(const float *x, const float *__restrict__ w, float *y, int n,
                                                      int D, float eps) {
    __shared__ float sh[32];
    rmsnorm_row<V4, A16, WARP>(x, w, y, n, D, eps, sh);
}
/* the same rows rounded to bf16 as they are stored (rmsnorm_bf16: a prompt GEMM's operand) */
template <int V4, int A16, int WARP>
__global__ void __launch_bounds__(ROW_MAXG) k_rmsnorm_bf16(const float *x, const float *__restrict__ w,
                                                           __nv_bfloat16 *y, int n, int D, float eps) {
    __shared__ float sh[32];
    rmsnorm_row<V4, A16, WARP>(x, w, y, n, D, eps, sh);
}

/* residual += x; y = rmsnorm(residual). y may alias x (as above). */
template <int V4, int A16, int WARP, typename OUT>
__device__ __forceinline__ void add_rmsnorm_row(float *residual, const float *x, const float *__restrict__ w, OUT *y,
                                                int n, int D, float eps, float *sh) {
    ROW_SETUP_W(n, w, cw);
    float *rr = residual + (size_t)row * D;
    const float *xr = x + (size_t)row * D;
    float4 cr[ROW_RC];
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < ROW_RC; k++) {
        int u = t + k * G;
        if (u < U) {
            float4 a = ld_u<V4, A16>(rr, u), b = ld_u<V4, A16>(xr, u);
            cr[k] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
            st_u<V4, A16>(rr, u, cr[k]);
            ss = sq_acc<V4>(ss, cr[k]);
        }
    }
    for (int u = t + ROW_RC * G; u < U; u += G) {
        float4 a = ld_u<V4, A16>(rr, u), b = ld_u<V4, A16>(xr, u);
        float4 r = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
        st_u<V4, A16>(rr, u, r);
        ss = sq_acc<V4>(ss, r);
    }
    ss = group_sum<WARP>(ss, sh);
    float inv = rsqrtf(ss / D + eps);
    rms_scale_store<V4, A16>(y + (size_t)row * D, cr, rr, inv, w, cw, t, G, U);
}
template <int V4, int A16, int WARP>
__global__ void __launch_bounds__(ROW_MAXG) k_add_rmsnorm(float *residual, const float *x, const float *__restrict__ w,
                                                          float *y, int n, int D, float eps) {
    __shared__ float sh[32];
    add_rmsnorm_row<V4, A16, WARP>(residual, x, w, y, n, D, eps, sh);
}
template <int V4, int A16, int WARP>
__global__ void __launch_bounds__(ROW_MAXG) k_add_rmsnorm_bf16(float *residual, const float *x,
                                                               const float *__restrict__ w, __nv_bfloat16 *y, int n,
                                                               int D, float eps) {
    __shared__ float sh[32];
    add_rmsnorm_row<V4, A16, WARP>(residual, x, w, y, n, D, eps, sh);
}

/* In place: x = exp(x - max) / sum(exp(x - max)) over one row (the group's: t of G, U units);
 * RC: the units a thread keeps in registers between the passes (the same values for any RC) */
template <int V4, int A16, int WARP, int RC = ROW_RC>
__device__ __forceinline__ void softmax_row(float *xr, int t, int G, int U, float *sh) {
    float4 cx[RC];
    float m = row_first_pass<V4, A16>(cx, xr, -INFINITY, t, G, U, [](float v, float4 x) { return max_acc<V4>(v, x); });
    m = group_max<WARP>(m, sh);
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < RC; k++) {
        int u = t + k * G;
        if (u < U) {
            float4 v = cx[k];
            cx[k] = make_float4(expf(v.x - m), V4 ? expf(v.y - m) : 0.0f, V4 ? expf(v.z - m) : 0.0f,
                                V4 ? expf(v.w - m) : 0.0f);
            s += cx[k].x;
            if (V4) s = ((s + cx[k].y) + cx[k].z) + cx[k].w;
        }
    }
    for (int u = t + RC * G; u < U; u += G) {
        float4 v = ld_u<V4, A16>(xr, u);
        s += expf(v.x - m);
        if (V4) s = ((s + expf(v.y - m)) + expf(v.z - m)) + expf(v.w - m);
    }
    s = group_sum<WARP>(s, sh);
    float inv = 1.0f / s;
    row_scale_cached<V4, A16>(xr, cx, inv, t, G, U);
    for (int u = t + RC * G; u < U; u += G) {
        float4 v = ld_u<V4, A16>(xr, u);
        st_u<V4, A16>(xr, u,
                      make_float4(expf(v.x - m) * inv, V4 ? expf(v.y - m) * inv : 0.0f, V4 ? expf(v.z - m) * inv : 0.0f,
                                  V4 ? expf(v.w - m) * inv : 0.0f));
    }
}
template <int V4, int A16, int WARP>
__global__ void __launch_bounds__(ROW_MAXG) k_softmax_rows(float *x, int rows, int D) {
    __shared__ float sh[32];
    ROW_SETUP(rows);
    softmax_row<V4, A16, WARP>(x + (size_t)row * D, t, G, U, sh);
}

/* [GDN-2] in place: x / sqrt(sum(x^2) + eps) over one row */
template <int V4, int A16, int WARP, int RC = ROW_RC>
__device__ __forceinline__ void l2norm_row(float *xr, int t, int G, int U, float eps, float *sh) {
    float4 cx[RC];
    float ss = group_sum<WARP>(row_sumsq<V4, A16>(cx, xr, t, G, U), sh);
    float inv = l2_inv_f(ss, eps);
    row_scale_cached<V4, A16>(xr, cx, inv, t, G, U);
    for (int u = t + RC * G; u < U; u += G) {
        float4 v = ld_u<V4, A16>(xr, u);
        st_u<V4, A16>(xr, u, make_float4(v.x * inv, v.y * inv, v.z * inv, v.w * inv));
    }
}
template <int V4, int A16, int WARP>
__global__ void __launch_bounds__(ROW_MAXG) k_l2norm_rows(float *x, int rows, int D, float eps) {
    __shared__ float sh[32];
    ROW_SETUP(rows);
    l2norm_row<V4, A16, WARP>(x + (size_t)row * D, t, G, U, eps, sh);
}

/* [NORM-1] y = rmsnorm(o) * w * (g ? silu(g) : 1); y may alias o. g's units are loaded with o's,
 * before the reduction (more bytes in flight). */
__device__ __forceinline__ float4 gate4(float4 v, float4 g) {
    return make_float4(v.x * silu_f(g.x), v.y * silu_f(g.y), v.z * silu_f(g.z), v.w * silu_f(g.w));
}
/* a gate unit: fp32 as o's, or bf16 widened (gated_rmsnorm_linear's HYLA_LINEAR_GATE_BF16; 8 bytes
 * for 4 values, aligned when D % 4 == 0) */
template <int V4, int A16> __device__ __forceinline__ float4 ld_g(const float *row, int u) { return ld_u<V4, A16>(row, u); }
template <int V4, int A16> __device__ __forceinline__ float4 ld_g(const __nv_bfloat16 *row, int u) {
    if (V4) {
        const uint2 q = *reinterpret_cast<const uint2 *>(row + 4 * u);
        const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&q.x)),
                     b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&q.y));
        return make_float4(a.x, a.y, b.x, b.y);
    }
    return make_float4(__bfloat162float(row[u]), 0.0f, 0.0f, 0.0f);
}

template <int V4, int A16, int WARP, typename OUT, typename GT = float, int RC = ROW_RC>
__device__ __forceinline__ void gated_rmsnorm_row(const float *o, const GT *g, const float *__restrict__ w, OUT *y,
                                                  int rows, int D, float eps, float *sh) {
    ROW_SETUP_WN(rows, w, cw, RC);
    const float *orow = o + (size_t)row * D;
    const GT *gr = g ? g + (size_t)row * D : NULL;
    float4 co[RC], cg[RC];
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < RC; k++) {
        int u = t + k * G;
        if (u < U) {
            co[k] = ld_u<V4, A16>(orow, u);
            if (gr) cg[k] = ld_g<V4, A16>(gr, u);
            ss = sq_acc<V4>(ss, co[k]);
        }
    }
    for (int u = t + RC * G; u < U; u += G) ss = sq_acc<V4>(ss, ld_u<V4, A16>(orow, u));
    ss = group_sum<WARP>(ss, sh);
    float inv = rsqrtf(ss / D + eps);
    OUT *yr = y + (size_t)row * D;
#pragma unroll
    for (int k = 0; k < RC; k++) {
        int u = t + k * G;
        if (u < U) {
            float4 v = mul_sw(co[k], inv, cw[k]);
            st_out<V4, A16>(yr, u, gr ? gate4(v, cg[k]) : v);
        }
    }
    for (int u = t + RC * G; u < U; u += G) {
        float4 v = mul_sw(ld_u<V4, A16>(orow, u), inv, ld_u<V4, A16>(w, u));
        st_out<V4, A16>(yr, u, gr ? gate4(v, ld_g<V4, A16>(gr, u)) : v);
    }
}
template <int V4, int A16, int WARP>
__global__ void __launch_bounds__(ROW_MAXG) k_gated_rmsnorm(const float *o, const float *g, const float *__restrict__ w,
                                                            float *y, int rows, int D, float eps) {
    __shared__ float sh[32];
    gated_rmsnorm_row<V4, A16, WARP>(o, g, w, y, rows, D, eps, sh);
}
template <int V4, int A16, int WARP>
__global__ void __launch_bounds__(ROW_MAXG) k_gated_rmsnorm_bf16(const float *o, const float *g,
                                                                 const float *__restrict__ w, __nv_bfloat16 *y,
                                                                 int rows, int D, float eps) {
    __shared__ float sh[32];
    gated_rmsnorm_row<V4, A16, WARP>(o, g, w, y, rows, D, eps, sh);
}

template <int V4, int A16, int WARP>
__global__ void __launch_bounds__(ROW_MAXG) k_gated_rmsnorm_bf16g(const float *o, const __nv_bfloat16 *g,
                                                                  const float *__restrict__ w, __nv_bfloat16 *y,
                                                                  int rows, int D, float eps) {
    __shared__ float sh[32];
    gated_rmsnorm_row<V4, A16, WARP>(o, g, w, y, rows, D, eps, sh);
}
/* The warp layout with RC = the lane's units (D / 128 rounded up): the same units in the same
 * order, so the same bits, in fewer registers. With ROW_RC's four cached units whatever D, the
 * kernel took 126 registers (two 256-thread blocks an SM) and moved the out norm of a 1.68B GDN
 * prompt (heads of 256, bf16 gate) at 1.5 TB/s on an H200; with RC = 2, 64 registers (the bound
 * asks for four blocks an SM; five spilled), none spilled for any RC (ptxas -v, sm_90a). With an
 * fp32 gate (SSE's heads of 128: RC = 1) the ROW_OP form took 78 registers (three blocks) and
 * moved a 16k-token piece's norm at 2.6 TB/s; RC = 1 asks for six blocks. GT: the gate's type. */
template <typename GT, int A16, int RC>
__global__ void __launch_bounds__(32 * ROW_WARP_ROWS, RC == 1 ? 6 : RC == 2 ? 4 : 3)
    k_gated_rmsnorm_bf16_w(const float *o, const GT *g, const float *__restrict__ w, __nv_bfloat16 *y, int rows, int D,
                           float eps) {
    gated_rmsnorm_row<1, A16, 1, __nv_bfloat16, GT, RC>(o, g, w, y, rows, D, eps, NULL);
}


/* The launch of a row op over `rows` rows of D (row_cfg: the layout above). */
typedef struct {
    int v4, a16, warp;
    unsigned blocks, threads;
} row_cfg;

static int al16(const void *p) { return p == NULL || ((uintptr_t)p & 15) == 0; }

static row_cfg row_config(int rows, int D, int aligned) {
    row_cfg r;
    r.v4 = D % 4 == 0;
    r.a16 = r.v4 && aligned;
    int U = r.v4 ? D / 4 : D;
    if (U <= 128) {
        r.warp = 1;
        r.threads = 32 * ROW_WARP_ROWS;
        r.blocks = cu_blocks((size_t)rows, ROW_WARP_ROWS);
    } else {
        r.warp = 0;
        int G = 32 * ((U + 127) / 128);
        r.threads = (unsigned)(G < ROW_MAXG ? G : ROW_MAXG);
        r.blocks = (unsigned)rows;
    }
    return r;
}

/* The body of a row op's entry point: nothing to do for an empty shape; else
 * kern<V4, A16, WARP><<<...>>>(args) in the configuration of rows x D (row_config; aligned: every
 * pointer 16-byte aligned) on ctx's stream, allowed to overlap the kernel ahead (ROW_SETUP's
 * pdl_wait). */
#define ROW_OP(ctx, kern, rows, D, aligned, ...)                                                              \
    do {                                                                                                       \
        hyla_cuda_ctx *c_ = (hyla_cuda_ctx *)(ctx);                                                            \
        if ((rows) <= 0 || (D) <= 0) return HYLA_OK;                                                           \
        const row_cfg rc = row_config(rows, D, aligned);                                                       \
        dim3 g_(rc.blocks);                                                                                    \
        if (rc.warp) {                                                                                         \
            if (!rc.v4) HYLA_TRY(cu_launch_pdl(c_, kern<0, 0, 1>, g_, rc.threads, 0, __VA_ARGS__));            \
            else if (rc.a16) HYLA_TRY(cu_launch_pdl(c_, kern<1, 1, 1>, g_, rc.threads, 0, __VA_ARGS__));       \
            else HYLA_TRY(cu_launch_pdl(c_, kern<1, 0, 1>, g_, rc.threads, 0, __VA_ARGS__));                   \
        } else {                                                                                               \
            if (!rc.v4) HYLA_TRY(cu_launch_pdl(c_, kern<0, 0, 0>, g_, rc.threads, 0, __VA_ARGS__));            \
            else if (rc.a16) HYLA_TRY(cu_launch_pdl(c_, kern<1, 1, 0>, g_, rc.threads, 0, __VA_ARGS__));       \
            else HYLA_TRY(cu_launch_pdl(c_, kern<1, 0, 0>, g_, rc.threads, 0, __VA_ARGS__));                   \
        }                                                                                                      \
        return HYLA_OK;                                                                                        \
    } while (0)

extern "C" hyla_status cu_rmsnorm(void *ctx, const float *x, const float *w, float *y, int n, int D, float eps) {
    ROW_OP(ctx, k_rmsnorm, n, D, al16(x) && al16(w) && al16(y), x, w, y, n, D, eps);
}

extern "C" hyla_status cu_add_rmsnorm(void *ctx, float *residual, const float *x, const float *w, float *y, int n,
                                      int D, float eps) {
    ROW_OP(ctx, k_add_rmsnorm, n, D, al16(residual) && al16(x) && al16(w) && al16(y), residual, x, w, y, n, D, eps);
}

/* The layout (row_config) is the fp32 op's for the same rows: the same reduction, so the fp32
 * values that round to y are the fp32 op's bits (y's alignment picks only the store form). */
extern "C" hyla_status cu_rmsnorm_bf16(void *ctx, float *residual, const float *x, const float *w, void *y, int n, int D,
                                       float eps) {
    __nv_bfloat16 *yb = (__nv_bfloat16 *)y;
    if (!x) ROW_OP(ctx, k_rmsnorm_bf16, n, D, al16(residual) && al16(w) && al16(y), residual, w, yb, n, D, eps);
    ROW_OP(ctx, k_add_rmsnorm_bf16, n, D, al16(residual) && al16(x) && al16(w) && al16(y), residual, x, w, yb, n, D,
           eps);
}

extern "C" hyla_status cu_softmax_rows(void *ctx, float *x, int rows, int cols) {
    ROW_OP(ctx, k_softmax_rows, rows, cols, al16(x), x, rows, cols);
}

extern "C" hyla_status cu_l2norm_rows(void *ctx, float *x, int rows, int cols, float eps) {
    ROW_OP(ctx, k_l2norm_rows, rows, cols, al16(x), x, rows, cols, eps);
}

extern "C" hyla_status cu_gated_rmsnorm(void *ctx, const float *o, const float *g, const float *w, float *y, int rows,
                                        int D, float eps) {
    ROW_OP(ctx, k_gated_rmsnorm, rows, D, al16(o) && al16(g) && al16(w) && al16(y), o, g, w, y, rows, D, eps);
}

/* The same rows rounded to bf16 into y (the prompt GEMM's operand; the values of cu_gated_rmsnorm
 * then cu_f32_to_bf16_rows): the layout is chosen from o, g and w alone, as there (y 16-byte
 * aligned: always, the GEMM's scratch), so the reduction is the same. */
/* The same with a bf16 gate (the layout from o and w, as there: the same reduction; the gate's
 * 8-byte loads need only D % 4 == 0) */
/* The warp layout's launch of k_gated_rmsnorm_bf16_w (RC from D) into *st; 0 where the layout is
 * not the warp one with float4 units (the caller takes ROW_OP's form). */
template <typename GT>
static int gated_bf16_warp(hyla_cuda_ctx *c, const float *o, const GT *g, const float *w, __nv_bfloat16 *y, int rows,
                           int D, float eps, int aligned, hyla_status *st) {
    const row_cfg rc = row_config(rows, D, aligned);
    if (rows <= 0 || !rc.warp || !rc.v4) return 0;
    const int rcn = (D / 4 + 31) / 32; /* units a lane: 1 .. 4 (the warp layout has U <= 128) */
    const dim3 gr(rc.blocks);
#define GRW(A, R) cu_launch_pdl(c, k_gated_rmsnorm_bf16_w<GT, A, R>, gr, rc.threads, 0, o, g, w, y, rows, D, eps)
    if (rc.a16) *st = rcn == 1 ? GRW(1, 1) : rcn == 2 ? GRW(1, 2) : rcn == 3 ? GRW(1, 3) : GRW(1, 4);
    else *st = rcn == 1 ? GRW(0, 1) : rcn == 2 ? GRW(0, 2) : rcn == 3 ? GRW(0, 3) : GRW(0, 4);
#undef GRW
    return 1;
}

extern "C" hyla_status cu_gated_rmsnorm_bf16g(hyla_cuda_ctx *c, const float *o, const __nv_bfloat16 *g, const float *w,
                                              __nv_bfloat16 *y, int rows, int D, float eps) {
    hyla_status st;
    if (gated_bf16_warp(c, o, g, w, y, rows, D, eps, al16(o) && al16(w), &st)) return st;
    ROW_OP(c, k_gated_rmsnorm_bf16g, rows, D, al16(o) && al16(w), o, g, w, y, rows, D, eps);
}

extern "C" hyla_status cu_gated_rmsnorm_bf16(hyla_cuda_ctx *c, const float *o, const float *g, const float *w,
                                             __nv_bfloat16 *y, int rows, int D, float eps) {
    hyla_status st;
    if (gated_bf16_warp(c, o, g, w, y, rows, D, eps, al16(o) && al16(g) && al16(w), &st)) return st;
    ROW_OP(c, k_gated_rmsnorm_bf16, rows, D, al16(o) && al16(g) && al16(w), o, g, w, y, rows, D, eps);
}

/* ---------------------------------------------------------------- elementwise */

/* One float4 per thread and iteration when every pointer is 16-byte aligned (n / 4 of them,
 * the last n % 4 elements one per thread), else one float; 32-bit indices whenever they cannot
 * overflow. Elementwise results do not depend on the path. */
struct ew_add {
    __device__ float operator()(float y, float x) const { return y + x; }
};
struct ew_swiglu {
    __device__ float operator()(float g, float u) const { return silu_f(g) * u; }
};
struct ew_silu {
    __device__ float operator()(float x) const { return silu_f(x); }
};
/* x = max(logsigmoid(x) / normalizer, clamp_min); logsigmoid(x) = min(x,0) - log1p(exp(-|x|)) */
struct ew_gla_gate {
    float inv_norm, clamp_min;
    __device__ float operator()(float v) const {
        float ls = fminf(v, 0.0f) - log1pf(expf(-fabsf(v)));
        return fmaxf(ls * inv_norm, clamp_min);
    }
};

/* out[i] = f(a[i]) (in place when out == a) */
template <class F, int VEC, class I> __global__ void k_ew1(const float *a, float *out, I n, F f) {
    pdl_trigger(); /* launched by cu_launch_pdl */
    pdl_wait();
    I stride = (I)gridDim.x * blockDim.x, i0 = (I)blockIdx.x * blockDim.x + threadIdx.x;
    if (VEC) {
        I n4 = n / 4;
        const float4 *a4 = reinterpret_cast<const float4 *>(a);
        float4 *o4 = reinterpret_cast<float4 *>(out);
        for (I i = i0; i < n4; i += stride) {
            float4 v = a4[i];
            o4[i] = make_float4(f(v.x), f(v.y), f(v.z), f(v.w));
        }
        if (i0 < n - 4 * n4) out[4 * n4 + i0] = f(a[4 * n4 + i0]);
    } else {
        for (I i = i0; i < n; i += stride) out[i] = f(a[i]);
    }
}
/* out[i] = f(a[i], b[i]) (out may alias a or b) */
template <class F, int VEC, class I> __global__ void k_ew2(const float *a, const float *b, float *out, I n, F f) {
    pdl_trigger(); /* launched by cu_launch_pdl */
    pdl_wait();
    I stride = (I)gridDim.x * blockDim.x, i0 = (I)blockIdx.x * blockDim.x + threadIdx.x;
    if (VEC) {
        I n4 = n / 4;
        const float4 *a4 = reinterpret_cast<const float4 *>(a), *b4 = reinterpret_cast<const float4 *>(b);
        float4 *o4 = reinterpret_cast<float4 *>(out);
        for (I i = i0; i < n4; i += stride) {
            float4 u = a4[i], v = b4[i];
            o4[i] = make_float4(f(u.x, v.x), f(u.y, v.y), f(u.z, v.z), f(u.w, v.w));
        }
        if (i0 < n - 4 * n4) out[4 * n4 + i0] = f(a[4 * n4 + i0], b[4 * n4 + i0]);
    } else {
        for (I i = i0; i < n; i += stride) out[i] = f(a[i], b[i]);
    }
}

#define EW_MAX_BLOCKS (1u << 20)
static unsigned ew_blocks(size_t items) {
    size_t b = (items + TPB - 1) / TPB;
    if (b > EW_MAX_BLOCKS) b = EW_MAX_BLOCKS;
    return (unsigned)(b ? b : 1);
}

template <class F> static hyla_status ew1_launch(hyla_cuda_ctx *c, const float *a, float *out, size_t n, F f) {
    int vec = al16(a) && al16(out);
    unsigned nb = ew_blocks(vec ? n / 4 + 1 : n);
    /* i0 + stride <= 2^28 + n: 32 bits suffice below 2^31 elements */
    if (n < ((size_t)1 << 31)) {
        if (vec) return cu_launch_pdl(c, k_ew1<F, 1, unsigned>, nb, TPB, 0, a, out, (unsigned)n, f);
        else return cu_launch_pdl(c, k_ew1<F, 0, unsigned>, nb, TPB, 0, a, out, (unsigned)n, f);
    } else {
        if (vec) return cu_launch_pdl(c, k_ew1<F, 1, size_t>, nb, TPB, 0, a, out, n, f);
        else return cu_launch_pdl(c, k_ew1<F, 0, size_t>, nb, TPB, 0, a, out, n, f);
    }
}
template <class F> static hyla_status ew2_launch(hyla_cuda_ctx *c, const float *a, const float *b, float *out, size_t n, F f) {
    int vec = al16(a) && al16(b) && al16(out);
    unsigned nb = ew_blocks(vec ? n / 4 + 1 : n);
    if (n < ((size_t)1 << 31)) {
        if (vec) return cu_launch_pdl(c, k_ew2<F, 1, unsigned>, nb, TPB, 0, a, b, out, (unsigned)n, f);
        else return cu_launch_pdl(c, k_ew2<F, 0, unsigned>, nb, TPB, 0, a, b, out, (unsigned)n, f);
    } else {
        if (vec) return cu_launch_pdl(c, k_ew2<F, 1, size_t>, nb, TPB, 0, a, b, out, n, f);
        else return cu_launch_pdl(c, k_ew2<F, 0, size_t>, nb, TPB, 0, a, b, out, n, f);
    }
}

extern "C" hyla_status cu_add(void *ctx, float *y, const float *x, size_t n) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    if (!n) return HYLA_OK;
    HYLA_TRY(ew2_launch(c, y, x, y, n, ew_add()));
    CU_LAUNCH_CHECK("add");
    return HYLA_OK;
}
extern "C" hyla_status cu_swiglu(void *ctx, const float *gate, const float *up, float *out, size_t n) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    if (!n) return HYLA_OK;
    HYLA_TRY(ew2_launch(c, gate, up, out, n, ew_swiglu()));
    CU_LAUNCH_CHECK("swiglu");
    return HYLA_OK;
}
extern "C" hyla_status cu_silu(void *ctx, float *x, size_t n) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    if (!n) return HYLA_OK;
    HYLA_TRY(ew1_launch(c, x, x, n, ew_silu()));
    CU_LAUNCH_CHECK("silu");
    return HYLA_OK;
}
extern "C" hyla_status cu_gla_gate(void *ctx, float *x, size_t n, float normalizer, float clamp_min) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    if (!n) return HYLA_OK;
    ew_gla_gate f;
    f.inv_norm = 1.0f / normalizer;
    f.clamp_min = clamp_min;
    HYLA_TRY(ew1_launch(c, x, x, n, f));
    CU_LAUNCH_CHECK("gla_gate");
    return HYLA_OK;
}

/* SSE's feature maps in one launch (cu_sse_maps). The first blocks are elementwise: silu over v,
 * then the GLA gate over g0 and over g1, each value first added its bias where the range has one
 * (gb[i % nb], the linear's own fp32 add; blocks eb[0..3) end each range's), one float4 a thread
 * where the range is 16-byte aligned and a multiple of 4 floats (and nb of 4), else one float. Every warp
 * after them owns one row of q0, q1, k0 or k1 (in that order) and runs on it what the row ops
 * would: silu or softmax_row, then l2norm_row, in the warp layout row_config gives rows of
 * cols <= 512 floats (cols % 4 == 0). With lora a warp owns a row of q (or k) in both sets: it
 * first adds q0's row onto q1's (the LoRA term, by ew_add as cu_add does), then maps both rows. Each
 * value's arithmetic is that of the ops one after the other (k_add, ew_silu, ew_gla_gate,
 * k_softmax_rows, k_l2norm_rows), so the bits are theirs. */
#define SSE_MAPS_FUSE_MAX ((size_t)1 << 23)
struct sse_maps_args {
    float *e[3];       /* v, g0, g1 */
    const float *ebias[3]; /* their biases [nb] (v: none) or NULL */
    int nb;
    size_t en[3];      /* their floats */
    unsigned eb[3];    /* the end of each range's blocks */
    int evec[3];       /* float4 a thread */
    float *x[4];       /* q0, q1, k0, k1 [rows][cols] */
    int rows, cols, q_softmax, k_softmax, l2, lora;
    float eps;
    ew_gla_gate gate;
};
template <int A16> __global__ void __launch_bounds__(32 * ROW_WARP_ROWS) k_sse_maps(sse_maps_args a) {
    pdl_trigger(); /* launched by cu_launch_pdl */
    pdl_wait();
    const unsigned b = blockIdx.x;
    if (b < a.eb[2]) {
        const int r = b < a.eb[0] ? 0 : b < a.eb[1] ? 1 : 2;
        size_t i = (size_t)(b - (r ? a.eb[r - 1] : 0)) * blockDim.x + threadIdx.x;
        float *p = a.e[r];
        const float *gb = a.ebias[r];
        if (a.evec[r]) {
            if (i < a.en[r] / 4) {
                float4 v = reinterpret_cast<float4 *>(p)[i];
                if (gb) {
                    /* 32-bit: the host keeps biased ranges under 2^32 floats */
                    const float4 b = *reinterpret_cast<const float4 *>(gb + (unsigned)(i * 4) % (unsigned)a.nb);
                    v = make_float4(v.x + b.x, v.y + b.y, v.z + b.z, v.w + b.w);
                }
                reinterpret_cast<float4 *>(p)[i] = r ? make_float4(a.gate(v.x), a.gate(v.y), a.gate(v.z), a.gate(v.w))
                                                     : make_float4(silu_f(v.x), silu_f(v.y), silu_f(v.z), silu_f(v.w));
            }
        } else if (i < a.en[r]) {
            const float v = gb ? p[i] + gb[(unsigned)i % (unsigned)a.nb] : p[i];
            p[i] = r ? a.gate(v) : silu_f(v);
        }
        return;
    }
    const int w = (int)(b - a.eb[2]) * ROW_WARP_ROWS + (int)(threadIdx.x >> 5), t = threadIdx.x & 31;
    const int U = a.cols / 4;
    /* one unit a lane kept in registers by the row ops (RC = 1; the same values for any RC): at
     * the usual 128 columns a lane has one unit, and the kernel's 62 registers (four blocks an SM)
     * became 46 (five): a 16k-token piece of the 1.3B SSE-H model 734 -> 635 us under ncu */
    auto map_row = [&](float *xr, int softmax) {
        if (softmax) {
            softmax_row<1, A16, 1, 1>(xr, t, 32, U, NULL);
        } else {
            for (int u = t; u < U; u += 32) {
                float4 v = ld_u<1, A16>(xr, u);
                st_u<1, A16>(xr, u, make_float4(silu_f(v.x), silu_f(v.y), silu_f(v.z), silu_f(v.w)));
            }
        }
        if (a.l2) {
            __syncwarp();
            l2norm_row<1, A16, 1, 1>(xr, t, 32, U, a.eps, NULL);
        }
    };
    if (a.lora) { /* row r of q (j = 0) or k (j = 1) in both sets */
        if (w >= 2 * a.rows) return;
        const int j = w / a.rows, sm = j ? a.k_softmax : a.q_softmax;
        const size_t off = (size_t)(w - j * a.rows) * a.cols;
        float *x0 = a.x[2 * j] + off, *x1 = a.x[2 * j + 1] + off;
        const ew_add add; /* cu_add's own operation: the term plus the projection */
        for (int u = t; u < U; u += 32) {
            const float4 p = ld_u<1, A16>(x0, u), q = ld_u<1, A16>(x1, u);
            st_u<1, A16>(x1, u, make_float4(add(q.x, p.x), add(q.y, p.y), add(q.z, p.z), add(q.w, p.w)));
        }
        __syncwarp();
        map_row(x0, sm);
        __syncwarp();
        map_row(x1, sm);
        return;
    }
    if (w >= 4 * a.rows) return;
    const int j = w / a.rows;
    map_row(a.x[j] + (size_t)(w - j * a.rows) * a.cols, j < 2 ? a.q_softmax : a.k_softmax);
}

/* x[i] = gate(x[i] + b[i % nb]): the fallback's gates with their biases */
__global__ void k_gla_gate_bias(float *x, size_t n, const float *b, int nb, ew_gla_gate f) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = f(x[i] + b[i % (size_t)nb]);
}

extern "C" hyla_status cu_sse_maps(void *ctx, float *v, size_t nv, float *q0, float *q1, float *k0, float *k1, int rows,
                                   int cols, int q_softmax, int k_softmax, int l2, float eps, float *g0, float *g1,
                                   size_t ng, const float *gb0, const float *gb1, int nb, float normalizer,
                                   float clamp_min, int lora) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    const size_t warps = (lora ? 2 : 4) * (size_t)rows, threads = 32 * ROW_WARP_ROWS;
    if (!g0 || !g1) ng = 0;
    if ((gb0 || gb1) && ng && (nb <= 0 || ng % (size_t)nb || ng >= ((size_t)1 << 32)))
        return hyla_fail(HYLA_ERR_INVALID_ARG, "sse_maps: gate bias of %d floats does not divide %zu (below 2^32)", nb,
                         ng);
    sse_maps_args a;
    memset(&a, 0, sizeof a);
    a.e[0] = v, a.e[1] = g0, a.e[2] = g1;
    a.ebias[1] = ng ? gb0 : NULL, a.ebias[2] = ng ? gb1 : NULL, a.nb = nb;
    a.en[0] = nv, a.en[1] = ng, a.en[2] = ng;
    size_t blocks = 0;
    for (int r = 0; r < 3; r++) {
        a.evec[r] = al16(a.e[r]) && a.en[r] % 4 == 0 && (!a.ebias[r] || (al16(a.ebias[r]) && nb % 4 == 0));
        blocks += ((a.evec[r] ? a.en[r] / 4 : a.en[r]) + threads - 1) / threads;
        a.eb[r] = (unsigned)blocks;
    }
    blocks += (warps + ROW_WARP_ROWS - 1) / ROW_WARP_ROWS;
    /* One launch pays where the launches are the cost (decode rows, short pieces). Past
     * SSE_MAPS_FUSE_MAX floats the passes are bound by memory, and there the plain kernels, with
     * fewer registers and more threads resident, are faster: a 16384-token piece of the 1.3B SSE-H
     * model prefilled ~1 % slower through the one launch (BENCHMARKS.md "SSE's feature maps in one
     * launch"). With lora the one launch also saves the two adds' passes over q and k (a warp
     * adds and maps a row while it is in cache), so it takes every size. */
    const size_t work = 4 * (size_t)rows * (size_t)(cols > 0 ? cols : 0) + nv + 2 * ng;
    if (rows <= 0 || cols <= 0 || cols % 4 || cols / 4 > 128 || (work > SSE_MAPS_FUSE_MAX && !lora) ||
        blocks > (size_t)INT_MAX) {
        /* the ops one by one */
        if (lora && rows > 0 && cols > 0) {
            HYLA_TRY(cu_add(c, q1, q0, (size_t)rows * cols));
            HYLA_TRY(cu_add(c, k1, k0, (size_t)rows * cols));
        }
        HYLA_TRY(cu_silu(c, v, nv));
        float *q[2] = {q0, q1}, *k[2] = {k0, k1}, *g[2] = {g0, g1};
        for (int j = 0; j < 2; j++) {
            HYLA_TRY(q_softmax ? cu_softmax_rows(c, q[j], rows, cols) : cu_silu(c, q[j], (size_t)rows * cols));
            HYLA_TRY(k_softmax ? cu_softmax_rows(c, k[j], rows, cols) : cu_silu(c, k[j], (size_t)rows * cols));
            if (l2) {
                HYLA_TRY(cu_l2norm_rows(c, q[j], rows, cols, eps));
                HYLA_TRY(cu_l2norm_rows(c, k[j], rows, cols, eps));
            }
            const float *gb = j ? gb1 : gb0;
            if (ng && gb) {
                ew_gla_gate f;
                f.inv_norm = 1.0f / normalizer; /* cu_gla_gate's */
                f.clamp_min = clamp_min;
                k_gla_gate_bias<<<ew_blocks(ng), TPB, 0, c->stream>>>(g[j], ng, gb, nb, f);
                CU_LAUNCH_CHECK("gla_gate_bias");
            } else if (ng) {
                HYLA_TRY(cu_gla_gate(c, g[j], ng, normalizer, clamp_min));
            }
        }
        return HYLA_OK;
    }
    a.x[0] = q0, a.x[1] = q1, a.x[2] = k0, a.x[3] = k1;
    a.rows = rows, a.cols = cols, a.q_softmax = q_softmax, a.k_softmax = k_softmax, a.l2 = l2, a.eps = eps;
    a.lora = lora;
    a.gate.inv_norm = 1.0f / normalizer; /* cu_gla_gate's */
    a.gate.clamp_min = clamp_min;
    if (al16(q0) && al16(q1) && al16(k0) && al16(k1))
        HYLA_TRY(cu_launch_pdl(c, k_sse_maps<1>, (unsigned)blocks, (unsigned)threads, 0, a));
    else HYLA_TRY(cu_launch_pdl(c, k_sse_maps<0>, (unsigned)blocks, (unsigned)threads, 0, a));
    CU_LAUNCH_CHECK("sse_maps");
    return HYLA_OK;
}

/* [GDN-1] g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b) * (allow_neg ? 2 : 1).
 * Element i = (row r, head h) is read and written by one thread, so the outputs are written in
 * place when each output either equals its input with a row stride of H (the runtime's call: the
 * thread overwrites only what it has read) or overlaps no input; any other aliasing (g/beta over
 * a/b with other strides) goes through scratch, as every call did before. */
template <class I>
__global__ void k_gdn_gates(const float *a, int a_stride, const float *b, int b_stride, const float *__restrict__ A_log,
                            const float *__restrict__ dt_bias, float *g, float *beta, I total, int H, int allow_neg) {
    pdl_trigger(); /* launched by cu_launch_pdl */
    pdl_wait();
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (I)gridDim.x * blockDim.x) {
        I r = i / (I)H;
        int h = (int)(i - r * (I)H);
        float gv, bt;
        gdn_gate_vals(a[r * (I)a_stride + h], b[r * (I)b_stride + h], A_log[h], dt_bias[h], allow_neg, gv, bt);
        g[i] = gv;
        beta[i] = bt;
    }
}

/* [p, p + bytes) and [q, q + qbytes) overlap */
static int overlaps(const void *p, size_t bytes, const void *q, size_t qbytes) {
    uintptr_t a = (uintptr_t)p, b = (uintptr_t)q;
    return a < b + qbytes && b < a + bytes;
}

extern "C" hyla_status cu_gdn_gates(void *ctx, const float *a, int a_stride, const float *b, int b_stride,
                                    const float *A_log, const float *dt_bias, float *g, float *beta, int n, int H,
                                    int allow_neg) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    if (n <= 0 || H <= 0) return HYLA_OK;
    size_t total = (size_t)n * H;
    size_t ob = total * sizeof(float);
    size_t ab = ((size_t)(n - 1) * a_stride + H) * sizeof(float), bb = ((size_t)(n - 1) * b_stride + H) * sizeof(float);
    /* output O may be written directly if it overlaps neither input, or is exactly that input
     * with stride H and overlaps the other one not at all (or is exactly it as well) */
    int direct = 1;
    const float *outs[2] = {g, beta};
    for (int k = 0; k < 2; k++) {
        const float *ins[2] = {a, b};
        int strides[2] = {a_stride, b_stride};
        size_t ibytes[2] = {ab, bb};
        for (int j = 0; j < 2; j++)
            if (overlaps(outs[k], ob, ins[j], ibytes[j]) && !(outs[k] == ins[j] && strides[j] == H)) direct = 0;
    }
    if (overlaps(g, ob, beta, ob)) direct = 0;
    float *dg = g, *dbeta = beta;
    if (!direct) {
        void *scr;
        HYLA_TRY(cu_scratch(c, SCR_MISC, total * 2 * sizeof(float), &scr));
        dg = (float *)scr;
        dbeta = dg + total;
    }
    unsigned nb = ew_blocks(total);
    if (total + (size_t)nb * TPB < ((size_t)1 << 32) && (size_t)(n - 1) * a_stride + H < ((size_t)1 << 31) &&
        (size_t)(n - 1) * b_stride + H < ((size_t)1 << 31))
        HYLA_TRY(cu_launch_pdl(c, k_gdn_gates<unsigned>, nb, TPB, 0, a, a_stride, b, b_stride, A_log, dt_bias, dg,
                               dbeta, (unsigned)total, H, allow_neg));
    else
        HYLA_TRY(cu_launch_pdl(c, k_gdn_gates<size_t>, nb, TPB, 0, a, a_stride, b, b_stride, A_log, dt_bias, dg, dbeta,
                               total, H, allow_neg));
    if (!direct) {
        CU_TRY(cudaMemcpyAsync(g, dg, ob, cudaMemcpyDeviceToDevice, c->stream));
        CU_TRY(cudaMemcpyAsync(beta, dbeta, ob, cudaMemcpyDeviceToDevice, c->stream));
    }
    return HYLA_OK;
}

/* ---------------------------------------------------------------- RoPE [ATTN-1] */

/* The angle pos * theta^(-2j/D) is formed in double: at positions of 10^5 an fp32 angle is
 * off by ~1e-2 rad. One thread per (token, j, group of hper <= ROPE_HG heads): the angle and its
 * sincos (double) once for the group, every pair loaded before any is stored; adjacent threads
 * take adjacent j (coalesced). The values equal one thread per (token, head, j). */
#define ROPE_HG 8
template <class I>
__global__ void k_rope(float *x, int n, int H, int D, const int32_t *pos, double log_theta, int ngrp, int hper) {
    int half = D / 2;
    I total = (I)n * half * ngrp;
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (I)gridDim.x * blockDim.x) {
        I r = i / (I)half;
        int j = (int)(i - r * (I)half);
        I t = r / (I)ngrp;
        int grp = (int)(r - t * (I)ngrp);
        double inv_freq = exp(-2.0 * j / D * log_theta);
        double ang = (double)pos[t] * inv_freq;
        double sn, cs;
        sincos(ang, &sn, &cs);
        int h0 = grp * hper;
        float *xr = x + ((size_t)t * H + h0) * D + j;
        float a[ROPE_HG], b[ROPE_HG];
#pragma unroll
        for (int k = 0; k < ROPE_HG; k++)
            if (k < hper && h0 + k < H) {
                a[k] = xr[(size_t)k * D];
                b[k] = xr[(size_t)k * D + half];
            }
#pragma unroll
        for (int k = 0; k < ROPE_HG; k++)
            if (k < hper && h0 + k < H) {
                xr[(size_t)k * D] = (float)(a[k] * cs - b[k] * sn);
                xr[(size_t)k * D + half] = (float)(b[k] * cs + a[k] * sn);
            }
    }
}

extern "C" hyla_status cu_rope_dev(hyla_cuda_ctx *c, float *x, int n, int H, int D, const int32_t *d_pos,
                                   float theta) {
    if (n <= 0 || H <= 0 || D < 2) return HYLA_OK;
    int ngrp = (H + ROPE_HG - 1) / ROPE_HG, hper = (H + ngrp - 1) / ngrp; /* H = 18: 3 groups of 6 */
    size_t total = (size_t)n * (D / 2) * ngrp;
    unsigned nb = ew_blocks(total);
    if (total + (size_t)nb * TPB < ((size_t)1 << 32))
        k_rope<unsigned><<<nb, TPB, 0, c->stream>>>(x, n, H, D, d_pos, log((double)theta), ngrp, hper);
    else
        k_rope<size_t><<<nb, TPB, 0, c->stream>>>(x, n, H, D, d_pos, log((double)theta), ngrp, hper);
    CU_LAUNCH_CHECK("rope");
    return HYLA_OK;
}

extern "C" hyla_status cu_rope(void *ctx, float *x, int n, int H, int D, const int32_t *pos, float theta) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    if (n <= 0) return HYLA_OK;
    if (D % 2) return hyla_fail(HYLA_ERR_INVALID_ARG, "rope: head dim %d is odd", D);
    void *d_pos;
    HYLA_TRY(cu_stage(c, pos, (size_t)n * 4, &d_pos));
    return cu_rope_dev(c, x, n, H, D, (const int32_t *)d_pos, theta);
}

/* ---------------------------------------------------------------- short conv [CONV-1] */

/* In place, K <= CONV_KMAX (k_conv): the n tokens of a session are cut into segments of
 * CONV_L; one thread per (session, segment, channel), channels fastest (each load and store of
 * a warp is 128 contiguous bytes). A thread loads its segment's inputs into registers, then
 * computes y_t = sum_j w[c][j] * in(t - K + 1 + j) (j ascending, fmaf from 0), + bias, silu,
 * over a register window of the last K-1 inputs, and overwrites x. The window before segment s
 * is the K-1 raw inputs before it, which the thread of segment s-1 overwrites: when there is
 * more than one segment, k_conv_halo first copies them (s = 0: the old tail) into scratch
 * (a (K-1)/CONV_L fraction of x). The thread of the last segment ends with the last K-1 inputs
 * in its window and writes them as the new tail (n < K-1: shifted old tail rows, as the CPU).
 * One segment (n <= CONV_L: decode steps, short pieces): one launch, the window read from the
 * tail. A value is the same function of its K inputs whatever the segment boundaries, so a call
 * equals its pieces and a session in a batch equals it alone, bit for bit. */
#define CONV_L 16
#define CONV_KMAX 4
#define CONV_TPB 128

template <int K>
__device__ __forceinline__ void conv_halo_body(const float *x, int n, int C, int nseg, float *const *tails, float *halo,
                                               int cidx, int bs) {
    int b = bs / nseg, s = bs - b * nseg;
    float *h = halo + (size_t)bs * (K - 1) * C + cidx;
    const float *src =
        s == 0 ? tails[b] + cidx : x + ((size_t)b * n + (size_t)s * CONV_L - (K - 1)) * C + cidx;
    float v[K > 1 ? K - 1 : 1];
#pragma unroll
    for (int r = 0; r < K - 1; r++) v[r] = src[(size_t)r * C];
#pragma unroll
    for (int r = 0; r < K - 1; r++) h[(size_t)r * C] = v[r];
}
template <int K>
__global__ void k_conv_halo(const float *x, int n, int C, int nseg, float *const *tails, float *halo) {
    int cidx = blockIdx.x * blockDim.x + threadIdx.x;
    if (cidx >= C) return;
    conv_halo_body<K>(x, n, C, nseg, tails, halo, cidx, blockIdx.y);
}

/* One channel's CONV_L tokens of one segment. KEEP: the results stay in out[] (the caller stores
 * them) instead of being written over x. */
template <int K, bool KEEP = false>
__device__ __forceinline__ void conv_body(float *x, int n, int C, int nseg, const float *__restrict__ w,
                                          const float *__restrict__ bias, float *const *tails, const float *halo,
                                          int act, int cidx, int bs, float *out = NULL) {
    int b = bs / nseg, s = bs - b * nseg;
    float wc[K], win[K]; /* win[0..K-2]: the previous K-1 inputs, oldest first */
#pragma unroll
    for (int j = 0; j < K; j++) wc[j] = w[(size_t)cidx * K + j];
    float bc = bias ? bias[cidx] : 0.0f;
    float *tail = K > 1 ? tails[b] : NULL;
    if (K > 1) {
        const float *src = nseg == 1 ? tail + cidx : halo + (size_t)bs * (K - 1) * C + cidx;
#pragma unroll
        for (int j = 0; j < K - 1; j++) win[j] = src[(size_t)j * C];
    }
    int t0 = s * CONV_L, len = n - t0 < CONV_L ? n - t0 : CONV_L;
    float *xp = x + ((size_t)b * n + t0) * C + cidx;
    float in[CONV_L];
#pragma unroll
    for (int i = 0; i < CONV_L; i++)
        if (i < len) in[i] = xp[(size_t)i * C];
#pragma unroll
    for (int i = 0; i < CONV_L; i++)
        if (i < len) {
            win[K - 1] = in[i];
            float acc = 0.0f;
#pragma unroll
            for (int j = 0; j < K; j++) acc = fmaf(wc[j], win[j], acc);
            if (bias) acc += bc;
            if (KEEP)
                out[i] = act ? silu_f(acc) : acc;
            else
                xp[(size_t)i * C] = act ? silu_f(acc) : acc;
#pragma unroll
            for (int j = 0; j < K - 1; j++) win[j] = win[j + 1];
        }
    if (K > 1 && s == nseg - 1) {
#pragma unroll
        for (int j = 0; j < K - 1; j++) tail[(size_t)j * C + cidx] = win[j];
    }
}
template <int K>
__global__ void __launch_bounds__(CONV_TPB) k_conv(float *x, int n, int C, int nseg, const float *__restrict__ w,
                                                   const float *__restrict__ bias, float *const *tails,
                                                   const float *halo, int act) {
    int cidx = blockIdx.x * blockDim.x + threadIdx.x;
    if (cidx >= C) return;
    conv_body<K>(x, n, C, nseg, w, bias, tails, halo, act, cidx, blockIdx.y);
}

/* Several tensors of the same sessions and tokens in one launch (short_conv_multi): the blocks
 * along x run over each tensor's channel blocks in turn, each thread the single-tensor code. */
struct conv_multi_args {
    float *x[HYLA_CONV_MULTI_MAX];
    const float *w[HYLA_CONV_MULTI_MAX], *bias[HYLA_CONV_MULTI_MAX];
    float *const *tails[HYLA_CONV_MULTI_MAX];
    float *halo[HYLA_CONV_MULTI_MAX];
    int C[HYLA_CONV_MULTI_MAX];
    const __nv_bfloat16 *src[HYLA_CONV_MULTI_MAX]; /* bf16 inputs (the 4-channel form only), else NULL */
    int l2[HYLA_CONV_MULTI_MAX]; /* 0, or L2 runs that divide CONV_TPB (conv_l2_fits) */
    float l2_eps[HYLA_CONV_MULTI_MAX];
    int cb[HYLA_CONV_MULTI_MAX + 1]; /* first block of each tensor */
    int m;
};

/* A tensor whose L2 runs the convolution's pass can normalise: each block's CONV_TPB channels are
 * whole runs of a multiple of 4 (l2_inv_warp's 16-byte units). */
static int conv_l2_fits(int l2, int C) { return l2 > 0 && l2 % 4 == 0 && CONV_TPB % l2 == 0 && C % l2 == 0; }

/* The convolution of a block's CONV_TPB channels (whole runs of l2), then each (token, run)'s L2
 * norm by one warp from shared memory: l2_inv_warp, k_l2norm_rows's arithmetic, and the same
 * product x * inv, so the bits of short_conv then l2norm_rows with one pass over x fewer. */
template <int K>
__device__ __forceinline__ void conv_body_l2(const conv_multi_args &a, int i, int cidx, int n, int nseg, int act) {
    __shared__ __align__(16) float tile[CONV_L][CONV_TPB];
    __shared__ float inv_s[CONV_L][CONV_TPB / 4];
    const int C = a.C[i], l2 = a.l2[i], bs = blockIdx.y, tid = threadIdx.x;
    const int valid = cidx < C, s = bs % nseg, t0 = s * CONV_L, len = n - t0 < CONV_L ? n - t0 : CONV_L;
    float v[CONV_L];
    if (valid) conv_body<K, true>(a.x[i], n, C, nseg, a.w[i], a.bias[i], a.tails[i], a.halo[i], act, cidx, bs, v);
#pragma unroll
    for (int t = 0; t < CONV_L; t++) tile[t][tid] = valid && t < len ? v[t] : 0.0f;
    __syncthreads();
    const int runs = CONV_TPB / l2, lane = tid & 31;
    for (int r = tid >> 5; r < len * runs; r += CONV_TPB / 32) {
        const int t = r / runs, h = r - t * runs;
        const float inv = l2_inv_warp(&tile[t][h * l2], l2, a.l2_eps[i], lane);
        if (lane == 0) inv_s[t][h] = inv;
    }
    __syncthreads();
    if (!valid) return;
    float *xp = a.x[i] + ((size_t)(bs / nseg) * n + t0) * C + cidx;
#pragma unroll
    for (int t = 0; t < CONV_L; t++)
        if (t < len) xp[(size_t)t * C] = v[t] * inv_s[t][tid / l2];
}
__device__ __forceinline__ int conv_multi_part(const conv_multi_args &a, int blk) {
    int i = 0;
    while (i + 1 < a.m && blk >= a.cb[i + 1]) i++;
    return i;
}
template <int K> __global__ void k_conv_multi_halo(conv_multi_args a, int n, int nseg) {
    pdl_trigger(); /* launched by cu_launch_pdl */
    pdl_wait();
    const int i = conv_multi_part(a, blockIdx.x), cidx = (blockIdx.x - a.cb[i]) * blockDim.x + threadIdx.x;
    if (cidx >= a.C[i]) return;
    conv_halo_body<K>(a.x[i], n, a.C[i], nseg, a.tails[i], a.halo[i], cidx, blockIdx.y);
}
template <int K> __global__ void __launch_bounds__(CONV_TPB) k_conv_multi(conv_multi_args a, int n, int nseg, int act) {
    pdl_trigger(); /* launched by cu_launch_pdl */
    pdl_wait();
    const int i = conv_multi_part(a, blockIdx.x), cidx = (blockIdx.x - a.cb[i]) * blockDim.x + threadIdx.x;
    if (a.l2[i]) { /* the whole block, invalid channels too: it meets at barriers */
        conv_body_l2<K>(a, i, cidx, n, nseg, act);
        return;
    }
    if (cidx >= a.C[i]) return;
    conv_body<K>(a.x[i], n, a.C[i], nseg, a.w[i], a.bias[i], a.tails[i], a.halo[i], act, cidx, blockIdx.y);
}

/* Kernel sizes over CONV_KMAX (and grids past 65535 segments): out of place into scratch, the
 * tail by a second kernel, then a copy back over x (the first version). */
__global__ void k_short_conv_oop(const float *x, float *y, int B, int n, int C, const float *__restrict__ w,
                                 const float *bias, int K, float *const *tails, int act) {
    size_t total = (size_t)B * n * C;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        int cidx = (int)(i % C);
        size_t bt = i / C;
        int t = (int)(bt % n);
        int b = (int)(bt / n);
        const float *xb = x + (size_t)b * n * C;
        const float *tail = tails[b];
        float acc = 0.0f;
        for (int j = 0; j < K; j++) {
            int s = t - K + 1 + j;
            float in = s >= 0 ? xb[(size_t)s * C + cidx] : tail[(size_t)(K - 1 + s) * C + cidx];
            acc = fmaf(w[(size_t)cidx * K + j], in, acc);
        }
        if (bias) acc += bias[cidx];
        y[i] = act ? silu_f(acc) : acc;
    }
}

/* new tail row r = input (n - (K-1) + r); rows ascending so row r+n is read before written */
__global__ void k_conv_tail(const float *x, int B, int n, int C, int K, float *const *tails) {
    size_t total = (size_t)B * C;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        int cidx = (int)(i % C);
        int b = (int)(i / C);
        float *tail = tails[b];
        for (int r = 0; r < K - 1; r++) {
            int s = n - (K - 1) + r;
            float v = s >= 0 ? x[((size_t)b * n + s) * C + cidx] : tail[(size_t)(r + n) * C + cidx];
            tail[(size_t)r * C + cidx] = v;
        }
    }
}

extern "C" hyla_status cu_short_conv(void *ctx, float *x, int B, int n, int C, const float *w, const float *bias,
                                     int K, float *const *tails, int act_silu) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    if (B <= 0 || n <= 0) return HYLA_OK;
    if (K < 1) return hyla_fail(HYLA_ERR_INVALID_ARG, "short_conv: kernel size %d", K);
    void *d_tails;
    HYLA_TRY(cu_stage(c, tails, (size_t)B * sizeof(float *), &d_tails));
    return cu_short_conv_dev(c, x, B, n, C, w, bias, K, (float *const *)d_tails, act_silu);
}

template <int K>
static hyla_status conv_launch(hyla_cuda_ctx *c, float *x, int B, int n, int C, const float *w, const float *bias,
                               float *const *d_tails, int act, int nseg) {
    dim3 grid(cu_blocks((size_t)C, CONV_TPB), (unsigned)(B * nseg));
    float *halo = NULL;
    if (nseg > 1 && K > 1) {
        void *scr;
        HYLA_TRY(cu_scratch(c, SCR_MISC, (size_t)B * nseg * (K - 1) * C * sizeof(float), &scr));
        halo = (float *)scr;
        k_conv_halo<K><<<grid, CONV_TPB, 0, c->stream>>>(x, n, C, nseg, d_tails, halo);
        CU_LAUNCH_CHECK("short_conv halo");
    }
    k_conv<K><<<grid, CONV_TPB, 0, c->stream>>>(x, n, C, nseg, w, bias, d_tails, halo, act);
    CU_LAUNCH_CHECK("short_conv");
    return HYLA_OK;
}

extern "C" hyla_status cu_short_conv_dev(hyla_cuda_ctx *c, float *x, int B, int n, int C, const float *w,
                                         const float *bias, int K, float *const *d_tails, int act_silu) {
    if (B <= 0 || n <= 0 || C <= 0) return HYLA_OK;
    int nseg = (n + CONV_L - 1) / CONV_L;
    if (K <= CONV_KMAX && (size_t)B * nseg <= 65535) {
        switch (K) {
        case 1: return conv_launch<1>(c, x, B, n, C, w, bias, d_tails, act_silu, nseg);
        case 2: return conv_launch<2>(c, x, B, n, C, w, bias, d_tails, act_silu, nseg);
        case 3: return conv_launch<3>(c, x, B, n, C, w, bias, d_tails, act_silu, nseg);
        default: return conv_launch<4>(c, x, B, n, C, w, bias, d_tails, act_silu, nseg);
        }
    }
    size_t total = (size_t)B * n * C;
    void *scr;
    HYLA_TRY(cu_scratch(c, SCR_MISC, total * sizeof(float), &scr));
    k_short_conv_oop<<<grid_for(total), TPB, 0, c->stream>>>(x, (float *)scr, B, n, C, w, bias, K, d_tails, act_silu);
    CU_LAUNCH_CHECK("short_conv");
    if (K > 1) {
        k_conv_tail<<<grid_for((size_t)B * C), TPB, 0, c->stream>>>(x, B, n, C, K, d_tails);
        CU_LAUNCH_CHECK("short_conv tail");
    }
    CU_TRY(cudaMemcpyAsync(x, scr, total * sizeof(float), cudaMemcpyDeviceToDevice, c->stream));
    return HYLA_OK;
}

/* The same convolution with 4 adjacent channels a thread (float4 loads and stores: 512 bytes of a
 * row per warp access, a quarter of the instructions), CONV4_TPB threads = 256 channels a block.
 * Every tensor of the launch has C % 4 == 0 and 16-byte aligned rows (conv4_fits); each output
 * is the scalar form's fmaf chain, component by component: the same bits. */
#define CONV4_TPB 64
#define CONV4_CH (4 * CONV4_TPB)

__device__ __forceinline__ float4 ld4(const float *p) { return *reinterpret_cast<const float4 *>(p); }
__device__ __forceinline__ void st4(float *p, float4 v) { *reinterpret_cast<float4 *>(p) = v; }
__device__ __forceinline__ float f4c(const float4 &v, int k) { return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w; }

template <int K> __global__ void k_conv4_halo(conv_multi_args a, int n, int nseg) {
    pdl_trigger(); /* launched by cu_launch_pdl */
    pdl_wait();
    const int i = conv_multi_part(a, blockIdx.x), c4 = ((blockIdx.x - a.cb[i]) * blockDim.x + threadIdx.x) * 4;
    const int C = a.C[i], bs = blockIdx.y, b = bs / nseg, s = bs - b * nseg;
    if (c4 >= C) return;
    float *h = a.halo[i] + (size_t)bs * (K - 1) * C + c4;
    const float *src = s == 0 ? a.tails[i][b] + c4 : a.x[i] + ((size_t)b * n + (size_t)s * CONV_L - (K - 1)) * C + c4;
    float4 v[K > 1 ? K - 1 : 1];
#pragma unroll
    for (int r = 0; r < K - 1; r++) v[r] = ld4(src + (size_t)r * C);
#pragma unroll
    for (int r = 0; r < K - 1; r++) st4(h + (size_t)r * C, v[r]);
}

/* L2 runs of the 4-channel form: a run of l2 channels is l2 / 4 adjacent lanes of one warp, each
 * holding one 16-byte unit of it (blocks start at multiples of CONV4_CH, warps at 128 channels,
 * l2 a power of two times 4 up to 128: conv4_fits). l2_inv_warp sums a row's units lane by lane
 * (sq_acc) and then by the xor butterfly over 32 lanes, its lanes past the row's units adding
 * 0.0 (exact); here the butterfly's steps below l2 / 4 lanes do the same sums within each run, so
 * the inverse is l2_inv_warp's, bit for bit, without shared memory. */
__device__ __forceinline__ float conv4_l2_inv(float4 v, int lanes, float eps) {
    float ss = sq_acc<1>(0.0f, v);
#pragma unroll
    for (int o = 16; o; o >>= 1)
        if (o < lanes) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    return l2_inv_f(ss, eps);
}

/* 4 bf16 values widened (8 bytes; C % 4 == 0 keeps them aligned) */
__device__ __forceinline__ float4 ld4b(const __nv_bfloat16 *p) {
    const uint2 u = *reinterpret_cast<const uint2 *>(p);
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&u.x)),
                 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&u.y));
    return make_float4(a.x, a.y, b.x, b.y);
}

/* A thread's four channels' taps and bias: wc[k][j] is channel c4 + k's tap j. With K == 4 and
 * 16-byte aligned rows each channel's taps are one float4 (a warp's 2 KB in 4 loads, not 16
 * scalar ones 64 bytes apart). */
template <int K>
__device__ __forceinline__ void conv4_taps(const float *__restrict__ w, const float *__restrict__ bias, int c4,
                                           float (&wc)[4][K], float (&bc)[4]) {
    if (K == 4 && !((uintptr_t)w & 15)) {
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const float4 t = ld4(w + (size_t)(c4 + k) * 4);
#pragma unroll
            for (int j = 0; j < K; j++) wc[k][j] = f4c(t, j);
        }
    } else {
#pragma unroll
        for (int k = 0; k < 4; k++)
#pragma unroll
            for (int j = 0; j < K; j++) wc[k][j] = w[(size_t)(c4 + k) * K + j];
    }
    if (bias && !((uintptr_t)bias & 15)) {
        const float4 t = ld4(bias + c4);
        bc[0] = t.x, bc[1] = t.y, bc[2] = t.z, bc[3] = t.w;
    } else {
#pragma unroll
        for (int k = 0; k < 4; k++) bc[k] = bias ? bias[c4 + k] : 0.0f;
    }
}

/* A segment's raw inputs: bf16 units (8 bytes, widened as they are used) or fp32 float4s */
template <bool SRC> struct conv4_raw { typedef float4 T; };
template <> struct conv4_raw<true> { typedef uint2 T; };
__device__ __forceinline__ float4 conv4_widen(const float4 &v) { return v; }
__device__ __forceinline__ float4 conv4_widen(const uint2 &u) {
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&u.x)),
                 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&u.y));
    return make_float4(a.x, a.y, b.x, b.y);
}

/* SRC: the inputs are bf16 rows a.src[i] (out of place into x), so the window before a segment is
 * read from the source itself (never written) and no halo pass runs.
 * Every input of the segment is requested first (the loads in flight together), kept raw (bf16
 * units from a source: half the registers), then each token's outputs are formed, L2-normalised
 * and stored in turn: no array of outputs, so a block needs few enough registers for several
 * blocks an SM (in place that is safe too: token t's store writes only row t, which no later
 * token of the thread reads from memory, and the next segment's window is the halo's copy).
 * Bits: each output is the scalar form's fmaf chain, the L2 inverse conv4_l2_inv's. */
template <int K, bool SRC>
__global__ void __launch_bounds__(CONV4_TPB, SRC ? 10 : 6) k_conv4(conv_multi_args a, int n, int nseg, int act) {
    pdl_trigger(); /* launched by cu_launch_pdl */
    pdl_wait();
    const int i = conv_multi_part(a, blockIdx.x), tid = threadIdx.x, c4 = ((blockIdx.x - a.cb[i]) * CONV4_TPB + tid) * 4;
    const int C = a.C[i], l2 = a.l2[i], bs = blockIdx.y, b = bs / nseg, s = bs - b * nseg;
    const int valid = c4 < C, t0 = s * CONV_L, len = n - t0 < CONV_L ? n - t0 : CONV_L;
    /* a warp past C: with L2 runs its lanes still take part in the shuffles (C % 128 may be
     * nonzero; a run never straddles C, C % l2 == 0) with zeros, without them it can leave */
    if (!valid && !l2) return;
    typedef typename conv4_raw<SRC>::T raw_t;
    float *xp = a.x[i] + ((size_t)b * n + t0) * C + c4;
    const __nv_bfloat16 *sp = SRC ? a.src[i] + ((size_t)b * n + t0) * C + c4 : NULL;
    raw_t in[CONV_L];
    float wc[4][K], bc[4];
    float4 win[K]; /* win[0..K-2]: the previous K-1 inputs, oldest first */
    float *tail = K > 1 && valid ? a.tails[i][b] : NULL;
    if (valid) {
#pragma unroll
        for (int t = 0; t < CONV_L; t++)
            if (t < len) {
                if (SRC)
                    in[t] = *reinterpret_cast<const raw_t *>(sp + (size_t)t * C);
                else
                    in[t] = *reinterpret_cast<const raw_t *>(xp + (size_t)t * C);
            }
        conv4_taps<K>(a.w[i], a.bias[i], c4, wc, bc);
        if (K > 1) {
            if (SRC && s > 0) {
#pragma unroll
                for (int j = 0; j < K - 1; j++) win[j] = ld4b(sp - (size_t)(K - 1 - j) * C);
            } else {
                const float *src = s == 0 ? tail + c4 : a.halo[i] + (size_t)bs * (K - 1) * C + c4;
#pragma unroll
                for (int j = 0; j < K - 1; j++) win[j] = ld4(src + (size_t)j * C);
            }
        }
    } else { /* zeros through the same arithmetic: outputs 0 (silu(0) = 0), never stored */
#pragma unroll
        for (int t = 0; t < CONV_L; t++) in[t] = raw_t{};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            bc[k] = 0.0f;
#pragma unroll
            for (int j = 0; j < K; j++) wc[k][j] = 0.0f;
        }
#pragma unroll
        for (int j = 0; j < K; j++) win[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    const int lanes = l2 / 4, hb = a.bias[i] != NULL;
#pragma unroll
    for (int t = 0; t < CONV_L; t++)
        if (t < len) { /* len and l2 uniform across the warp (one tensor, one segment) */
            win[K - 1] = conv4_widen(in[t]);
            float r[4];
#pragma unroll
            for (int k = 0; k < 4; k++) {
                float acc = 0.0f;
#pragma unroll
                for (int j = 0; j < K; j++) acc = fmaf(wc[k][j], f4c(win[j], k), acc);
                if (hb) acc += bc[k];
                r[k] = act ? silu_f(acc) : acc;
            }
            float4 v = make_float4(r[0], r[1], r[2], r[3]);
            if (l2) {
                const float inv = conv4_l2_inv(v, lanes, a.l2_eps[i]);
                v = make_float4(v.x * inv, v.y * inv, v.z * inv, v.w * inv);
            }
            if (valid) st4(xp + (size_t)t * C, v);
#pragma unroll
            for (int j = 0; j < K - 1; j++) win[j] = win[j + 1];
        }
    if (K > 1 && valid && s == nseg - 1) {
#pragma unroll
        for (int j = 0; j < K - 1; j++) st4(tail + (size_t)j * C + c4, win[j]);
    }
}

/* Whether a launch can take the 4-channel form: every tensor's C % 4 == 0 with 16-byte aligned
 * x, tails and halo rows, and its L2 runs (if any) fused in it (l2 % 4 == 0, dividing CONV4_CH). */
static int conv4_fits(const conv_multi_args &a, const hyla_conv_part *p) {
    for (int i = 0; i < a.m; i++) {
        if (a.C[i] % 4 || ((uintptr_t)a.x[i] & 15) || ((uintptr_t)p[i].src & 7)) return 0;
        if (!p[i].src != !p[0].src) return 0; /* all from bf16 sources, or none */
        const int l2 = p[i].l2; /* a power of two times 4, up to a warp's 128 channels (conv4_l2_inv) */
        if (l2 && !(l2 % 4 == 0 && l2 <= 128 && !((l2 / 4) & (l2 / 4 - 1)) && a.C[i] % l2 == 0)) return 0;
    }
    return 1;
}

/* The halo scratch of a multi-tensor launch: each tensor's K-1 raw inputs before each segment */
static hyla_status conv_halo_scratch(hyla_cuda_ctx *c, conv_multi_args &a, int B, int nseg, int K) {
    size_t tot = 0;
    for (int i = 0; i < a.m; i++) tot += (size_t)B * nseg * (K - 1) * a.C[i];
    void *scr;
    HYLA_TRY(cu_scratch(c, SCR_MISC, tot * sizeof(float), &scr));
    float *h = (float *)scr;
    for (int i = 0; i < a.m; i++) {
        a.halo[i] = h;
        h += (size_t)B * nseg * (K - 1) * a.C[i];
    }
    return HYLA_OK;
}

template <int K>
static hyla_status conv_multi_launch(hyla_cuda_ctx *c, conv_multi_args &a, int B, int n, int nseg, int act) {
    dim3 grid((unsigned)a.cb[a.m], (unsigned)(B * nseg));
    if (nseg > 1 && K > 1) {
        HYLA_TRY(conv_halo_scratch(c, a, B, nseg, K));
        HYLA_TRY(cu_launch_pdl(c, k_conv_multi_halo<K>, grid, CONV_TPB, 0, a, n, nseg));
    }
    return cu_launch_pdl(c, k_conv_multi<K>, grid, CONV_TPB, 0, a, n, nseg, act);
}

template <int K>
static hyla_status conv4_launch(hyla_cuda_ctx *c, conv_multi_args &a, int B, int n, int nseg, int act) {
    dim3 grid((unsigned)a.cb[a.m], (unsigned)(B * nseg));
    if (a.src[0]) /* every tensor's (conv4_fits) */
        return cu_launch_pdl(c, k_conv4<K, true>, grid, CONV4_TPB, 0, a, n, nseg, act);
    if (nseg > 1 && K > 1) { /* each tensor's halo 16-byte aligned: a multiple of 4 floats */
        HYLA_TRY(conv_halo_scratch(c, a, B, nseg, K));
        HYLA_TRY(cu_launch_pdl(c, k_conv4_halo<K>, grid, CONV4_TPB, 0, a, n, nseg));
    }
    return cu_launch_pdl(c, k_conv4<K, false>, grid, CONV4_TPB, 0, a, n, nseg, act);
}

__global__ void k_bf16_to_f32(const __nv_bfloat16 *__restrict__ x, size_t n, float *__restrict__ y) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = __bfloat162float(x[i]);
}
/* x = widen(src) for every tensor with a bf16 source: the in-place forms' inputs */
static hyla_status conv_widen(hyla_cuda_ctx *c, int m, const hyla_conv_part *p, int B, int n) {
    for (int i = 0; i < m; i++) {
        if (!p[i].src) continue;
        const size_t e = (size_t)B * n * p[i].C;
        k_bf16_to_f32<<<grid_for(e), TPB, 0, c->stream>>>((const __nv_bfloat16 *)p[i].src, e, p[i].x);
        CU_LAUNCH_CHECK("short_conv_multi: widen");
    }
    return HYLA_OK;
}

/* p[i].tails are device arrays of B pointers here. */
extern "C" hyla_status cu_short_conv_multi_dev(hyla_cuda_ctx *c, int m, const hyla_conv_part *p, int B, int n, int K,
                                               int act_silu, int tails16) {
    if (B <= 0 || n <= 0) return HYLA_OK;
    const int nseg = (n + CONV_L - 1) / CONV_L;
    /* L2 runs the convolution's pass cannot take: l2norm_rows after it (the same bits) */
    const int fused = K <= CONV_KMAX && (size_t)B * nseg <= 65535;
    int src_any = 0;
    for (int i = 0; i < m; i++) src_any |= p[i].src != NULL;
    if (!fused) { /* as separate calls (their out-of-place path) */
        if (src_any) HYLA_TRY(conv_widen(c, m, p, B, n));
        for (int i = 0; i < m; i++)
            HYLA_TRY(cu_short_conv_dev(c, p[i].x, B, n, p[i].C, p[i].w, p[i].bias, K, p[i].tails, act_silu));
    } else {
        conv_multi_args a;
        memset(&a, 0, sizeof a);
        a.m = m;
        for (int i = 0; i < m; i++)
            a.x[i] = p[i].x, a.w[i] = p[i].w, a.bias[i] = p[i].bias, a.tails[i] = p[i].tails, a.C[i] = p[i].C;
        /* prompt pieces only: a decode step's one token of B sessions has a few thousand
         * channels to spread, which one channel a thread spreads over more SMs (B = 1 ran 3 %
         * slower in the 4-channel form) */
        if (tails16 && n > CONV_L && conv4_fits(a, p)) {
            for (int i = 0; i < m; i++) a.src[i] = (const __nv_bfloat16 *)p[i].src;
            for (int i = 0; i < m; i++) {
                if (p[i].l2) a.l2[i] = p[i].l2, a.l2_eps[i] = p[i].l2_eps;
                a.cb[i + 1] = a.cb[i] + (int)cu_blocks((size_t)p[i].C / 4, CONV4_TPB);
            }
            switch (K) {
            case 1: HYLA_TRY(conv4_launch<1>(c, a, B, n, nseg, act_silu)); break;
            case 2: HYLA_TRY(conv4_launch<2>(c, a, B, n, nseg, act_silu)); break;
            case 3: HYLA_TRY(conv4_launch<3>(c, a, B, n, nseg, act_silu)); break;
            default: HYLA_TRY(conv4_launch<4>(c, a, B, n, nseg, act_silu)); break;
            }
            return HYLA_OK; /* every L2 run fused (conv4_fits) */
        }
        if (src_any) /* the other forms convolve in place: widen the inputs into x first */
            HYLA_TRY(conv_widen(c, m, p, B, n));
        for (int i = 0; i < m; i++) {
            if (conv_l2_fits(p[i].l2, p[i].C)) a.l2[i] = p[i].l2, a.l2_eps[i] = p[i].l2_eps;
            a.cb[i + 1] = a.cb[i] + (int)cu_blocks((size_t)p[i].C, CONV_TPB);
        }
        switch (K) {
        case 1: HYLA_TRY(conv_multi_launch<1>(c, a, B, n, nseg, act_silu)); break;
        case 2: HYLA_TRY(conv_multi_launch<2>(c, a, B, n, nseg, act_silu)); break;
        case 3: HYLA_TRY(conv_multi_launch<3>(c, a, B, n, nseg, act_silu)); break;
        default: HYLA_TRY(conv_multi_launch<4>(c, a, B, n, nseg, act_silu)); break;
        }
    }
    for (int i = 0; i < m; i++)
        if (p[i].l2 && !(fused && conv_l2_fits(p[i].l2, p[i].C)))
            HYLA_TRY(cu_l2norm_rows(c, p[i].x, (int)((size_t)B * n * p[i].C / p[i].l2), p[i].l2, p[i].l2_eps));
    return HYLA_OK;
}

extern "C" hyla_status cu_short_conv_multi_check(int m, const hyla_conv_part *p, int K) {
    if (m < 1 || m > HYLA_CONV_MULTI_MAX)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "short_conv_multi: %d tensors (1..%d)", m, HYLA_CONV_MULTI_MAX);
    if (K < 1) return hyla_fail(HYLA_ERR_INVALID_ARG, "short_conv_multi: kernel size %d", K);
    for (int i = 0; i < m; i++) {
        if (p[i].C <= 0) return hyla_fail(HYLA_ERR_INVALID_ARG, "short_conv_multi: tensor %d has %d channels", i, p[i].C);
        if (p[i].l2 < 0 || (p[i].l2 && p[i].C % p[i].l2))
            return hyla_fail(HYLA_ERR_INVALID_ARG, "short_conv_multi: L2 runs of %d do not divide %d channels", p[i].l2,
                             p[i].C);
    }
    return HYLA_OK;
}

/* Every session's tail of every tensor 16-byte aligned (host arrays of device pointers): the
 * 4-channel form's condition on them. */
extern "C" int cu_conv_tails16(int m, const hyla_conv_part *p, int B) {
    for (int i = 0; i < m; i++)
        for (int b = 0; b < B; b++)
            if ((uintptr_t)p[i].tails[b] & 15) return 0;
    return 1;
}

/* The host tails arrays are staged as one array of m * B pointers. */
extern "C" hyla_status cu_short_conv_multi(void *ctx, int m, const hyla_conv_part *p, int B, int n, int K,
                                           int act_silu) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    HYLA_TRY(cu_short_conv_multi_check(m, p, K));
    if (B <= 0 || n <= 0) return HYLA_OK;
    float *h[HYLA_CONV_MULTI_MAX * 256], **hp = h;
    if ((size_t)m * B > sizeof h / sizeof h[0] && !(hp = (float **)malloc((size_t)m * B * sizeof(float *))))
        return hyla_fail(HYLA_ERR_NOMEM, "short_conv_multi: out of host memory");
    for (int i = 0; i < m; i++) memcpy(hp + (size_t)i * B, p[i].tails, (size_t)B * sizeof(float *));
    void *d;
    hyla_status st = cu_stage(c, hp, (size_t)m * B * sizeof(float *), &d);
    if (hp != h) free(hp);
    HYLA_TRY(st);
    hyla_conv_part q[HYLA_CONV_MULTI_MAX];
    for (int i = 0; i < m; i++) {
        q[i] = p[i];
        q[i].tails = (float *const *)d + (size_t)i * B;
    }
    return cu_short_conv_multi_dev(c, m, q, B, n, K, act_silu, cu_conv_tails16(m, p, B));
}

/* ---------------------------------------------------------------- sampling [SAMPLE-1] */

#define SAMPLE_TPB 256
#define MASS_ONE 1099511627776.0 /* 2^40: masses are fixed point, so sums are exact and order-free */

__device__ __forceinline__ uint32_t float_order(float f) {
    if (isnan(f)) return 0;
    uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

struct samp_row {
    const float *l;
    int V;
    float m, invT;
};

__device__ __forceinline__ void samp_elem(const samp_row &r, int i, uint64_t *key, uint64_t *mass) {
    float x = r.l[i];
    float e = isnan(x) ? 0.0f : expf((x - r.m) * r.invT);
    *key = ((uint64_t)__float_as_uint(e) << 32) | (uint64_t)(0xffffffffu - (uint32_t)i);
    *mass = (uint64_t)((double)e * MASS_ONE);
}

__device__ uint64_t block_sum_u64(uint64_t v, uint64_t *sh) {
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    uint64_t t = 0;
    for (int i = 0; i < (int)(blockDim.x >> 5); i++) t += sh[i];
    __syncthreads();
    return t;
}

/* Largest existing key K* with sum{weight(i) : key(i) >= K*, key(i) >= floor} >= target
 * (weight = 1 when count_mode, else mass). target must be in [1, total]. */
__device__ uint64_t radix_select(const samp_row &r, int count_mode, uint64_t target, uint64_t floor_key,
                                 uint64_t *hist /* [256] */, uint64_t *bc /* [2] */) {
    uint64_t prefix = 0, above = 0;
    for (int level = 0; level < 8; level++) {
        int shift = 56 - 8 * level;
        hist[threadIdx.x] = 0;
        __syncthreads();
        for (int i = threadIdx.x; i < r.V; i += blockDim.x) {
            uint64_t key, mass;
            samp_elem(r, i, &key, &mass);
            if (key < floor_key) continue;
            if (level > 0 && (key >> (shift + 8)) != (prefix >> (shift + 8))) continue;
            int d = (int)((key >> shift) & 255);
            atomicAdd((unsigned long long *)&hist[d], (unsigned long long)(count_mode ? 1 : mass));
        }
        __syncthreads();
        /* suffix sums: suf[d] = sum_{d' >= d} hist[d'] (Hillis-Steele, in place) */
        for (int off = 1; off < 256; off <<= 1) {
            int d = threadIdx.x;
            uint64_t add = (d + off < 256) ? hist[d + off] : 0;
            __syncthreads();
            hist[d] += add;
            __syncthreads();
        }
        int d = threadIdx.x;
        int ok = above + hist[d] >= target;
        int ok_next = (d + 1 < 256) ? (above + hist[d + 1] >= target) : 0;
        if (ok && !ok_next) {
            bc[0] = prefix | ((uint64_t)d << shift);
            bc[1] = above + ((d + 1 < 256) ? hist[d + 1] : 0);
        }
        if (d == 0 && !ok) { /* target beyond the total (cannot happen for valid targets) */
            bc[0] = prefix;
            bc[1] = above;
        }
        __syncthreads();
        prefix = bc[0];
        above = bc[1];
        __syncthreads();
    }
    return prefix;
}

__global__ void __launch_bounds__(SAMPLE_TPB) k_sample(const float *logits, int V, const hyla_sampling *params,
                                                       const float *u, int32_t *out) {
    __shared__ uint64_t hist[256];
    __shared__ uint64_t sh[SAMPLE_TPB / 32];
    __shared__ uint64_t bc[2];
    __shared__ float shf[SAMPLE_TPB / 32];
    int b = blockIdx.x;
    const float *l = logits + (size_t)b * V;
    hyla_sampling p = params[b];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (!(p.temperature > 0.0f)) {
        /* greedy: max of (order(logit), ~index) = the largest logit, lowest index on ties (the
         * same token whatever order the logits are visited in). One block reads the row: 16-byte
         * loads, four per thread in flight, or a 32000-entry row is a chain of dependent loads
         * (~55 us on an H100 against a few) */
        uint64_t best = 0;
        auto take = [&](float x, int i) {
            uint64_t k = ((uint64_t)float_order(x) << 32) | (uint64_t)(0xffffffffu - (uint32_t)i);
            best = k > best ? k : best;
        };
        int i0 = 0;
        if ((((uintptr_t)l) & 15) == 0) {
            const float4 *l4 = (const float4 *)l;
            const int V4 = V / 4, bd = (int)blockDim.x;
            int i = threadIdx.x;
            for (; i + 3 * bd < V4; i += 4 * bd) {
                float4 a[4];
#pragma unroll
                for (int u = 0; u < 4; u++) a[u] = __ldg(l4 + i + u * bd);
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    const int j = 4 * (i + u * bd);
                    take(a[u].x, j), take(a[u].y, j + 1), take(a[u].z, j + 2), take(a[u].w, j + 3);
                }
            }
            for (; i < V4; i += bd) {
                const float4 a = __ldg(l4 + i);
                take(a.x, 4 * i), take(a.y, 4 * i + 1), take(a.z, 4 * i + 2), take(a.w, 4 * i + 3);
            }
            i0 = 4 * V4;
        }
        for (int i = i0 + threadIdx.x; i < V; i += blockDim.x) take(l[i], i);
        for (int o = 16; o; o >>= 1) {
            uint64_t x = __shfl_xor_sync(0xffffffffu, best, o);
            best = x > best ? x : best;
        }
        if (lane == 0) sh[w] = best;
        __syncthreads();
        if (threadIdx.x == 0) {
            uint64_t t = 0;
            for (int i = 0; i < SAMPLE_TPB / 32; i++) t = sh[i] > t ? sh[i] : t;
            out[b] = (int32_t)(0xffffffffu - (uint32_t)(t & 0xffffffffu));
        }
        return;
    }
    float m = -INFINITY;
    for (int i = threadIdx.x; i < V; i += blockDim.x) m = fmaxf(m, l[i]);
    m = warp_max(m);
    if (lane == 0) shf[w] = m;
    __syncthreads();
    m = -INFINITY;
    for (int i = 0; i < SAMPLE_TPB / 32; i++) m = fmaxf(m, shf[i]);
    samp_row r;
    r.l = l;
    r.V = V;
    r.m = m;
    r.invT = 1.0f / p.temperature;

    uint64_t floor_key = 0;
    if (p.top_k > 0 && p.top_k < V) floor_key = radix_select(r, 1, (uint64_t)p.top_k, 0, hist, bc);
    /* mass of the kept set */
    uint64_t kept = 0;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        uint64_t key, mass;
        samp_elem(r, i, &key, &mass);
        if (key >= floor_key) kept += mass;
    }
    kept = block_sum_u64(kept, sh);
    if (p.top_p < 1.0f) {
        double tp = p.top_p > 0.0f ? (double)p.top_p : 0.0;
        uint64_t target = (uint64_t)ceil(tp * (double)kept);
        if (target < 1) target = 1;
        if (target > kept) target = kept;
        uint64_t f2 = radix_select(r, 0, target, floor_key, hist, bc);
        floor_key = f2 > floor_key ? f2 : floor_key;
        kept = 0;
        for (int i = threadIdx.x; i < V; i += blockDim.x) {
            uint64_t key, mass;
            samp_elem(r, i, &key, &mass);
            if (key >= floor_key) kept += mass;
        }
        kept = block_sum_u64(kept, sh);
    }
    /* draw, as the CPU reference: walk the kept tokens in vocabulary order; the first whose
     * cumulative mass exceeds u * kept. Each thread owns a contiguous index range; an
     * exclusive scan of the range sums finds the thread where the crossing happens. */
    double uu = (double)u[b];
    if (uu < 0) uu = 0;
    uint64_t target = (uint64_t)floor(uu * (double)kept) + 1;
    if (target > kept) target = kept;
    if (threadIdx.x == 0) out[b] = 0; /* replaced below; kept > 0 always has a crossing */
    int per = (V + SAMPLE_TPB - 1) / SAMPLE_TPB;
    int lo = threadIdx.x * per, hi = lo + per < V ? lo + per : V;
    uint64_t mine = 0;
    for (int i = lo; i < hi; i++) {
        uint64_t key, mass;
        samp_elem(r, i, &key, &mass);
        if (key >= floor_key) mine += mass;
    }
    hist[threadIdx.x] = mine;
    __syncthreads();
    for (int off = 1; off < SAMPLE_TPB; off <<= 1) { /* inclusive prefix sums */
        uint64_t add = threadIdx.x >= (unsigned)off ? hist[threadIdx.x - off] : 0;
        __syncthreads();
        hist[threadIdx.x] += add;
        __syncthreads();
    }
    uint64_t before = hist[threadIdx.x] - mine;
    if (before < target && target <= before + mine) {
        uint64_t cum = before;
        for (int i = lo; i < hi; i++) {
            uint64_t key, mass;
            samp_elem(r, i, &key, &mass);
            if (key < floor_key) continue;
            cum += mass;
            if (cum >= target) {
                out[b] = i;
                break;
            }
        }
    }
}

/* The same kernel on `stream` (a decode lane's logits where they arrived, beside the compute
 * stream): the parameters and draws are read, and the tokens written, through mapped host
 * memory; waits for the stream. Same bits as cu_sample. */
extern "C" hyla_status hyla_cuda_sample_on(hyla_backend *be, void *stream, const float *logits, int B, int V,
                                           const hyla_sampling *params, const float *u, int32_t *out) {
    if (!be || !be->ops->name || strcmp(be->ops->name, "cuda"))
        return hyla_fail(HYLA_ERR_INVALID_ARG, "hyla_cuda_sample_on: not a cuda backend");
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)be->ctx;
    if (B <= 0) return HYLA_OK;
    if (V <= 0) return hyla_fail(HYLA_ERR_INVALID_ARG, "sample: vocab size %d", V);
    size_t o_u = ((size_t)B * sizeof(hyla_sampling) + 255) & ~(size_t)255;
    size_t o_out = o_u + (((size_t)B * sizeof(float) + 255) & ~(size_t)255);
    size_t need = o_out + (size_t)B * sizeof(int32_t);
    if (need > c->so_bytes) {
        if (c->so_host) cudaFreeHost(c->so_host);
        c->so_host = NULL;
        c->so_bytes = 0;
        CU_TRY(cudaHostAlloc((void **)&c->so_host, 2 * need, cudaHostAllocMapped));
        CU_TRY(cudaHostGetDevicePointer(&c->so_dev, c->so_host, 0));
        c->so_bytes = 2 * need;
    }
    memcpy(c->so_host, params, (size_t)B * sizeof(hyla_sampling));
    memcpy(c->so_host + o_u, u, (size_t)B * sizeof(float));
    uint8_t *d = (uint8_t *)c->so_dev;
    k_sample<<<B, SAMPLE_TPB, 0, (cudaStream_t)stream>>>(logits, V, (const hyla_sampling *)d, (const float *)(d + o_u),
                                                        (int32_t *)(d + o_out));
    CU_LAUNCH_CHECK("sample (beside the compute stream)");
    CU_TRY(cudaStreamSynchronize((cudaStream_t)stream));
    memcpy(out, c->so_host + o_out, (size_t)B * sizeof(int32_t));
    return HYLA_OK;
}

extern "C" hyla_status cu_sample(void *ctx, const float *logits, int B, int V, const hyla_sampling *params,
                                 const float *u, int32_t *out) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    if (B <= 0) return HYLA_OK;
    if (V <= 0) return hyla_fail(HYLA_ERR_INVALID_ARG, "sample: vocab size %d", V);
    void *d_params, *d_u, *d_out;
    HYLA_TRY(cu_stage_reserve(c, (size_t)B * (sizeof(hyla_sampling) + sizeof(float)), 2));
    HYLA_TRY(cu_stage(c, params, (size_t)B * sizeof(hyla_sampling), &d_params));
    HYLA_TRY(cu_stage(c, u, (size_t)B * sizeof(float), &d_u));
    HYLA_TRY(cu_scratch(c, SCR_SAMPLE, (size_t)B * sizeof(int32_t), &d_out));
    k_sample<<<B, SAMPLE_TPB, 0, c->stream>>>(logits, V, (const hyla_sampling *)d_params, (const float *)d_u,
                                              (int32_t *)d_out);
    CU_LAUNCH_CHECK("sample");
    return cu_readback(c, out, d_out, (size_t)B * sizeof(int32_t));
}
