/* hyla_cuda_dense.cu — the dense ops of the CUDA backend: embedding, norms, elementwise
 * activations and gates, RoPE, short convolution, gated RMSNorm, the bf16 conversion that
 * feeds cuBLAS, and sampling.
 *
 * Row ops (norms, softmax) use one warp per row with fp32 sums in a fixed order, so every
 * result is deterministic and independent of the number of rows. Sampling runs one block per
 * row: top-k / top-p thresholds by radix descent over 64-bit keys (probability bits, then
 * ~index), then the draw in vocabulary order by a prefix sum, all with integer (fixed-point
 * 2^-40) masses, so ties and sums never depend on thread timing.
 * Math follows docs/MODELS.md; tags like [NORM-0] cite it.
 * Threading: launched on the context's stream; no host state beyond the call. */
#include <math.h>
#include <string.h>

#include "hyla_cuda_impl.h"

#define TPB 256

/* ---------------------------------------------------------------- helpers */

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }

/* ---------------------------------------------------------------- conversion for cuBLAS */

__global__ void k_f32_to_bf16_rows(const float *__restrict__ x, int ldx, int M, int K, __nv_bfloat16 *__restrict__ out) {
    size_t total = (size_t)M * K;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / K, cidx = i - r * K;
        out[i] = __float2bfloat16_rn(x[r * ldx + cidx]);
    }
}

__global__ void k_f32_to_bf16_vec4(const float4 *__restrict__ x, int ldx4, int M, int K4, __nv_bfloat162 *__restrict__ out) {
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
        k_f32_to_bf16_vec4<<<grid_for(n), TPB, 0, c->stream>>>((const float4 *)x, ldx / 4, M, K / 4,
                                                               (__nv_bfloat162 *)out);
    } else {
        size_t n = (size_t)M * K;
        k_f32_to_bf16_rows<<<grid_for(n), TPB, 0, c->stream>>>(x, ldx, M, K, out);
    }
    CU_LAUNCH_CHECK("f32_to_bf16");
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

/* ---------------------------------------------------------------- row ops: one warp per row */

#define ROWS_PER_BLOCK 8

/* [NORM-0] y = x * rsqrt(mean(x^2) + eps) * w */
__global__ void k_rmsnorm(const float *x, const float *__restrict__ w, float *y, int n, int D, float eps) {
    int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= n) return;
    const float *xr = x + (size_t)row * D;
    float ss = 0;
    for (int i = lane; i < D; i += 32) ss += xr[i] * xr[i];
    ss = warp_sum(ss);
    float inv = rsqrtf(ss / D + eps);
    float *yr = y + (size_t)row * D;
    for (int i = lane; i < D; i += 32) yr[i] = xr[i] * inv * w[i];
}

extern "C" hyla_status cu_rmsnorm(void *ctx, const float *x, const float *w, float *y, int n, int D, float eps) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    if (n <= 0) return HYLA_OK;
    k_rmsnorm<<<cu_blocks(n, ROWS_PER_BLOCK), 32 * ROWS_PER_BLOCK, 0, c->stream>>>(x, w, y, n, D, eps);
    CU_LAUNCH_CHECK("rmsnorm");
    return HYLA_OK;
}

/* residual += x; y = rmsnorm(residual). y may alias x: every read of x in a row happens
 * before the warp's reduction, every write of y after it. */
__global__ void k_add_rmsnorm(float *residual, const float *x, const float *__restrict__ w, float *y, int n, int D,
                              float eps) {
    int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= n) return;
    float *rr = residual + (size_t)row * D;
    const float *xr = x + (size_t)row * D;
    float ss = 0;
    for (int i = lane; i < D; i += 32) {
        float r = rr[i] + xr[i];
        rr[i] = r;
        ss += r * r;
    }
    ss = warp_sum(ss);
    float inv = rsqrtf(ss / D + eps);
    float *yr = y + (size_t)row * D;
    for (int i = lane; i < D; i += 32) yr[i] = rr[i] * inv * w[i];
}

extern "C" hyla_status cu_add_rmsnorm(void *ctx, float *residual, const float *x, const float *w, float *y, int n,
                                      int D, float eps) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    if (n <= 0) return HYLA_OK;
    k_add_rmsnorm<<<cu_blocks(n, ROWS_PER_BLOCK), 32 * ROWS_PER_BLOCK, 0, c->stream>>>(residual, x, w, y, n, D, eps);
    CU_LAUNCH_CHECK("add_rmsnorm");
    return HYLA_OK;
}

__global__ void k_softmax_rows(float *x, int rows, int cols) {
    int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= rows) return;
    float *xr = x + (size_t)row * cols;
    float m = -INFINITY;
    for (int i = lane; i < cols; i += 32) m = fmaxf(m, xr[i]);
    m = warp_max(m);
    float s = 0;
    for (int i = lane; i < cols; i += 32) s += expf(xr[i] - m);
    s = warp_sum(s);
    float inv = 1.0f / s;
    for (int i = lane; i < cols; i += 32) xr[i] = expf(xr[i] - m) * inv;
}

extern "C" hyla_status cu_softmax_rows(void *ctx, float *x, int rows, int cols) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    if (rows <= 0) return HYLA_OK;
    k_softmax_rows<<<cu_blocks(rows, ROWS_PER_BLOCK), 32 * ROWS_PER_BLOCK, 0, c->stream>>>(x, rows, cols);
    CU_LAUNCH_CHECK("softmax_rows");
    return HYLA_OK;
}

/* [GDN-2] x / sqrt(sum(x^2) + eps) */
__global__ void k_l2norm_rows(float *x, int rows, int cols, float eps) {
    int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= rows) return;
    float *xr = x + (size_t)row * cols;
    float ss = 0;
    for (int i = lane; i < cols; i += 32) ss += xr[i] * xr[i];
    ss = warp_sum(ss);
    float inv = 1.0f / sqrtf(ss + eps);
    for (int i = lane; i < cols; i += 32) xr[i] *= inv;
}

extern "C" hyla_status cu_l2norm_rows(void *ctx, float *x, int rows, int cols, float eps) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    if (rows <= 0) return HYLA_OK;
    k_l2norm_rows<<<cu_blocks(rows, ROWS_PER_BLOCK), 32 * ROWS_PER_BLOCK, 0, c->stream>>>(x, rows, cols, eps);
    CU_LAUNCH_CHECK("l2norm_rows");
    return HYLA_OK;
}

/* [NORM-1] y = rmsnorm(o) * w * (g ? silu(g) : 1); y may alias o. */
__global__ void k_gated_rmsnorm(const float *o, const float *g, const float *__restrict__ w, float *y, int rows, int D,
                                float eps) {
    int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= rows) return;
    const float *orow = o + (size_t)row * D;
    float ss = 0;
    for (int i = lane; i < D; i += 32) ss += orow[i] * orow[i];
    ss = warp_sum(ss);
    float inv = rsqrtf(ss / D + eps);
    float *yr = y + (size_t)row * D;
    const float *gr = g ? g + (size_t)row * D : NULL;
    for (int i = lane; i < D; i += 32) {
        float v = orow[i] * inv * w[i];
        if (gr) v *= silu_f(gr[i]);
        yr[i] = v;
    }
}

extern "C" hyla_status cu_gated_rmsnorm(void *ctx, const float *o, const float *g, const float *w, float *y, int rows,
                                        int D, float eps) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    if (rows <= 0) return HYLA_OK;
    k_gated_rmsnorm<<<cu_blocks(rows, ROWS_PER_BLOCK), 32 * ROWS_PER_BLOCK, 0, c->stream>>>(o, g, w, y, rows, D, eps);
    CU_LAUNCH_CHECK("gated_rmsnorm");
    return HYLA_OK;
}

/* ---------------------------------------------------------------- elementwise */

__global__ void k_add(float *y, const float *x, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] += x[i];
}
__global__ void k_swiglu(const float *gate, const float *up, float *out, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float g = gate[i], u = up[i];
        out[i] = silu_f(g) * u;
    }
}
__global__ void k_silu(float *x, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = silu_f(x[i]);
}
/* x = max(logsigmoid(x) / normalizer, clamp_min); logsigmoid(x) = min(x,0) - log1p(exp(-|x|)) */
__global__ void k_gla_gate(float *x, size_t n, float inv_norm, float clamp_min) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float v = x[i];
        float ls = fminf(v, 0.0f) - log1pf(expf(-fabsf(v)));
        x[i] = fmaxf(ls * inv_norm, clamp_min);
    }
}

extern "C" hyla_status cu_add(void *ctx, float *y, const float *x, size_t n) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    if (!n) return HYLA_OK;
    k_add<<<grid_for(n), TPB, 0, c->stream>>>(y, x, n);
    CU_LAUNCH_CHECK("add");
    return HYLA_OK;
}
extern "C" hyla_status cu_swiglu(void *ctx, const float *gate, const float *up, float *out, size_t n) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    if (!n) return HYLA_OK;
    k_swiglu<<<grid_for(n), TPB, 0, c->stream>>>(gate, up, out, n);
    CU_LAUNCH_CHECK("swiglu");
    return HYLA_OK;
}
extern "C" hyla_status cu_silu(void *ctx, float *x, size_t n) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    if (!n) return HYLA_OK;
    k_silu<<<grid_for(n), TPB, 0, c->stream>>>(x, n);
    CU_LAUNCH_CHECK("silu");
    return HYLA_OK;
}
extern "C" hyla_status cu_gla_gate(void *ctx, float *x, size_t n, float normalizer, float clamp_min) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    if (!n) return HYLA_OK;
    k_gla_gate<<<grid_for(n), TPB, 0, c->stream>>>(x, n, 1.0f / normalizer, clamp_min);
    CU_LAUNCH_CHECK("gla_gate");
    return HYLA_OK;
}

/* [GDN-1] into scratch first: g/beta may alias a/b with different row strides, so an in-place
 * parallel write could clobber inputs other threads have not read yet. */
__global__ void k_gdn_gates(const float *a, int a_stride, const float *b, int b_stride, const float *A_log,
                            const float *dt_bias, float *g, float *beta, int n, int H, int allow_neg) {
    size_t total = (size_t)n * H;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / H;
        int h = (int)(i - r * H);
        float x = a[r * a_stride + h] + dt_bias[h];
        float sp = x > 20.0f ? x : log1pf(expf(x));
        g[i] = -expf(A_log[h]) * sp;
        float s = 1.0f / (1.0f + expf(-b[r * b_stride + h]));
        beta[i] = allow_neg ? 2.0f * s : s;
    }
}

extern "C" hyla_status cu_gdn_gates(void *ctx, const float *a, int a_stride, const float *b, int b_stride,
                                    const float *A_log, const float *dt_bias, float *g, float *beta, int n, int H,
                                    int allow_neg) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    if (n <= 0) return HYLA_OK;
    size_t total = (size_t)n * H;
    void *scr;
    HYLA_TRY(cu_scratch(c, SCR_MISC, total * 2 * sizeof(float), &scr));
    float *sg = (float *)scr, *sb = sg + total;
    k_gdn_gates<<<grid_for(total), TPB, 0, c->stream>>>(a, a_stride, b, b_stride, A_log, dt_bias, sg, sb, n, H,
                                                        allow_neg);
    CU_LAUNCH_CHECK("gdn_gates");
    CU_TRY(cudaMemcpyAsync(g, sg, total * sizeof(float), cudaMemcpyDeviceToDevice, c->stream));
    CU_TRY(cudaMemcpyAsync(beta, sb, total * sizeof(float), cudaMemcpyDeviceToDevice, c->stream));
    return HYLA_OK;
}

/* ---------------------------------------------------------------- RoPE [ATTN-1] */

/* The angle pos * theta^(-2j/D) is formed in double: at positions of 10^5 an fp32 angle is
 * off by ~1e-2 rad. */
__global__ void k_rope(float *x, int n, int H, int D, const int32_t *pos, double log_theta) {
    int half = D / 2;
    size_t total = (size_t)n * H * half;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        int j = (int)(i % half);
        size_t th = i / half; /* token * H + head */
        size_t t = th / H;
        double inv_freq = exp(-2.0 * j / D * log_theta);
        double ang = (double)pos[t] * inv_freq;
        double sn, cs;
        sincos(ang, &sn, &cs);
        float *xr = x + th * D;
        float a = xr[j], b = xr[j + half];
        xr[j] = (float)(a * cs - b * sn);
        xr[j + half] = (float)(b * cs + a * sn);
    }
}

extern "C" hyla_status cu_rope_dev(hyla_cuda_ctx *c, float *x, int n, int H, int D, const int32_t *d_pos,
                                   float theta) {
    if (n <= 0) return HYLA_OK;
    size_t total = (size_t)n * H * (D / 2);
    k_rope<<<grid_for(total), TPB, 0, c->stream>>>(x, n, H, D, d_pos, log((double)theta));
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

/* y[b][t][c] = sum_j w[c][j] * in(t - K + 1 + j) (+bias) (silu), in(s<0) = tail[K-1+s] */
__global__ void k_short_conv(const float *x, float *y, int B, int n, int C, const float *__restrict__ w,
                             const float *bias, int K, float *const *tails, int act) {
    size_t total = (size_t)B * n * C;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        int cidx = (int)(i % C);
        size_t bt = i / C;
        int t = (int)(bt % n);
        int b = (int)(bt / n);
        const float *xb = x + (size_t)b * n * C;
        const float *tail = tails[b];
        float acc = bias ? bias[cidx] : 0.0f;
        for (int j = 0; j < K; j++) {
            int s = t - K + 1 + j;
            float in = s >= 0 ? xb[(size_t)s * C + cidx] : tail[(size_t)(K - 1 + s) * C + cidx];
            acc += w[cidx * K + j] * in;
        }
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

extern "C" hyla_status cu_short_conv_dev(hyla_cuda_ctx *c, float *x, int B, int n, int C, const float *w,
                                         const float *bias, int K, float *const *d_tails, int act_silu) {
    if (B <= 0 || n <= 0) return HYLA_OK;
    size_t total = (size_t)B * n * C;
    void *scr;
    HYLA_TRY(cu_scratch(c, SCR_MISC, total * sizeof(float), &scr));
    k_short_conv<<<grid_for(total), TPB, 0, c->stream>>>(x, (float *)scr, B, n, C, w, bias, K, d_tails, act_silu);
    CU_LAUNCH_CHECK("short_conv");
    if (K > 1) {
        k_conv_tail<<<grid_for((size_t)B * C), TPB, 0, c->stream>>>(x, B, n, C, K, d_tails);
        CU_LAUNCH_CHECK("short_conv tail");
    }
    CU_TRY(cudaMemcpyAsync(x, scr, total * sizeof(float), cudaMemcpyDeviceToDevice, c->stream));
    return HYLA_OK;
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
        /* greedy: max of (order(logit), ~index) = the largest logit, lowest index on ties */
        uint64_t best = 0;
        for (int i = threadIdx.x; i < V; i += blockDim.x) {
            uint64_t k = ((uint64_t)float_order(l[i]) << 32) | (uint64_t)(0xffffffffu - (uint32_t)i);
            best = k > best ? k : best;
        }
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
    CU_TRY(cudaMemcpyAsync(out, d_out, (size_t)B * sizeof(int32_t), cudaMemcpyDeviceToHost, c->stream));
    CU_TRY(cudaStreamSynchronize(c->stream));
    return HYLA_OK;
}
