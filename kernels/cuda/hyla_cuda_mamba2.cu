/* hyla_cuda_mamba2.cu — Mamba2's SSD mixer on the GPU [M2-1..3] (docs/MODELS.md "Mamba2").
 *
 * SSD is GLA [GLA-1] with q = C, k = B, v = dt'·x, scale 1 and the same scalar decay a on every
 * key dimension, and the state layout [H][N][P] is GLA's [H][dk][dv]. So both paths run GLA's
 * kernels: k_ssd_expand writes those per-head operands (B and C of the head's group, a broadcast
 * over N) into scratch (SCR_SSD), GLA's kernels run them, and k_ssd_finish adds D·x.
 *   - Chunked prefill: the GLA chunked kernels (hyla_cuda_lin_chunked.cu, tensor cores); a state
 *     wider than they take (StateX's N = 512) runs as GLA's key slabs (hyla_cuda_lin_slab.cu:
 *     state rows are independent under GLA's update, so N = 512 is four slab-heads of 128 whose
 *     outputs are summed in a fixed order). Every path chunks from the call's first token, so
 *     64-aligned pieces give the bits of one call.
 *   - Decode: GLA decode (`k_lin_dec`, key slabs for N > 128), one token per session.
 *   - k_ssd_rec, the SSD-specific recurrent kernel (one block per (session, head, 32 head-dim
 *     columns); lane = column j, warp w owns state rows i = w + 8r in registers; y reduced over
 *     i through shared memory in a fixed order), is kept for the prefill of shapes neither GLA
 *     path takes (N <= 256 with P beyond the chunked kernels' limits).
 *
 * dt' and a are computed in fp32 (softplus as max(x,0) + log1p(e^−|x|)) by every path the
 * same way; the CPU forms them in double and rounds, so the two backends may differ in the
 * last bit of dt' (within the parity tolerances of tests/test_gpu_ops.c).
 * Threading: launched on the context's stream. */
#include <math.h>
#include <string.h>

#include "hyla_cuda_impl.h"

#define M2_TPB 256

__device__ __forceinline__ void m2_step(float dt, float dt_bias, float A_log, float lo, float hi, float *dtp, float *a) {
    float z = dt + dt_bias;
    float d = fmaxf(z, 0.0f) + log1pf(expf(-fabsf(z)));
    d = fminf(fmaxf(d, lo), hi);
    *dtp = d;
    *a = -expf(A_log) * d;
}

struct SsdArgs {
    const float *xbc, *dt, *dt_bias, *A_log, *Dskip;
    int ldx, ld_dt, H, P, G, N, ntok;
    float lo, hi;
    float *const *S; /* device array [B] of states [H][N][P] */
    float *y;        /* [B*ntok][H][P] */
};

/* R = rows of S per warp (N <= 8R). Token t of session b is row b*ntok + t of xbc, dt and y. */
template <int R>
__global__ void __launch_bounds__(M2_TPB) k_ssd_rec(SsdArgs a) {
    __shared__ float red[2][8][33];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int j = blockIdx.x * 32 + lane, h = blockIdx.y, b = blockIdx.z;
    const int H = a.H, P = a.P, G = a.G, N = a.N;
    const bool jv = j < P;
    const int g = h / (H / G);
    float *Sg = a.S[b] + (size_t)h * N * P;
    float s[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        int i = w + 8 * r;
        s[r] = (jv && i < N) ? Sg[(size_t)i * P + j] : 0.0f;
    }
    const float bias = a.dt_bias[h], alog = a.A_log[h], Dh = a.Dskip[h];
    for (int t = 0; t < a.ntok; t++) {
        size_t row = (size_t)b * a.ntok + t;
        const float *xr = a.xbc + row * a.ldx;
        const float *Bg = xr + (size_t)H * P + (size_t)g * N, *Cg = xr + (size_t)H * P + (size_t)G * N + (size_t)g * N;
        float dtp, av;
        m2_step(a.dt[row * a.ld_dt + h], bias, alog, a.lo, a.hi, &dtp, &av);
        const float d = expf(av);
        const float x = jv ? xr[(size_t)h * P + j] : 0.0f;
        const float v = dtp * x;
        float acc = 0.0f;
#pragma unroll
        for (int r = 0; r < R; r++) {
            int i = w + 8 * r;
            if (i < N) {
                s[r] = d * s[r] + Bg[i] * v;
                acc += Cg[i] * s[r];
            }
        }
        float(*rb)[33] = red[t & 1];
        rb[w][lane] = acc;
        __syncthreads();
        if (w == 0 && jv) {
            float sum = 0.0f;
#pragma unroll
            for (int k = 0; k < 8; k++) sum += rb[k][lane];
            a.y[(row * H + h) * P + j] = sum + Dh * x;
        }
        /* buffer t & 1 is written again at t + 2, after the __syncthreads of t + 1 */
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        int i = w + 8 * r;
        if (jv && i < N) Sg[(size_t)i * P + j] = s[r];
    }
}

static hyla_status m2_check(const char *op, int n, int ldx, int ld_dt, int H, int P, int G, int N) {
    if (n < 0 || H <= 0 || P <= 0 || G <= 0 || N <= 0 || H % G || ldx < H * P + 2 * G * N || ld_dt < H)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "%s: n=%d H=%d P=%d G=%d N=%d ldx=%d ld_dt=%d", op, n, H, P, G, N, ldx,
                         ld_dt);
    if (N > 512) return hyla_fail(HYLA_ERR_UNSUPPORTED, "%s: state_size %d > 512 is not supported on cuda", op, N);
    if (H > 65535) return hyla_fail(HYLA_ERR_UNSUPPORTED, "%s: %d heads", op, H);
    return HYLA_OK;
}

static hyla_status launch_rec(hyla_cuda_ctx *c, const SsdArgs &a, int B) {
    dim3 grid(cu_blocks((size_t)a.P, 32), a.H, B);
    int R = (a.N + 7) / 8;
    if (R <= 1) k_ssd_rec<1><<<grid, M2_TPB, 0, c->stream>>>(a);
    else if (R <= 2) k_ssd_rec<2><<<grid, M2_TPB, 0, c->stream>>>(a);
    else if (R <= 4) k_ssd_rec<4><<<grid, M2_TPB, 0, c->stream>>>(a);
    else if (R <= 8) k_ssd_rec<8><<<grid, M2_TPB, 0, c->stream>>>(a);
    else if (R <= 16) k_ssd_rec<16><<<grid, M2_TPB, 0, c->stream>>>(a);
    else if (R <= 32) k_ssd_rec<32><<<grid, M2_TPB, 0, c->stream>>>(a);
    else k_ssd_rec<64><<<grid, M2_TPB, 0, c->stream>>>(a);
    CU_LAUNCH_CHECK("ssd recurrent");
    return HYLA_OK;
}

/* ---------------------------------------------------------------- chunked prefill via GLA */

/* One block per (token, head): q, k, gk [n][H][N]; v [n][H][P]. */
__global__ void k_ssd_expand(const float *__restrict__ xbc, int ldx, const float *__restrict__ dt, int ld_dt,
                             const float *__restrict__ dt_bias, const float *__restrict__ A_log, float lo, float hi,
                             int H, int P, int G, int N, float *q, float *k, float *gk, float *v) {
    const int t = blockIdx.x, h = blockIdx.y, g = h / (H / G);
    const float *xr = xbc + (size_t)t * ldx;
    float dtp, av;
    m2_step(dt[(size_t)t * ld_dt + h], dt_bias[h], A_log[h], lo, hi, &dtp, &av);
    size_t o = ((size_t)t * H + h) * N;
    const float *Bg = xr + (size_t)H * P + (size_t)g * N, *Cg = Bg + (size_t)G * N;
    for (int i = threadIdx.x; i < N; i += blockDim.x) {
        q[o + i] = Cg[i];
        k[o + i] = Bg[i];
        gk[o + i] = av;
    }
    size_t ov = ((size_t)t * H + h) * P;
    for (int j = threadIdx.x; j < P; j += blockDim.x) v[ov + j] = dtp * xr[(size_t)h * P + j];
}

/* The per-head GLA operands of n rows in scratch (SCR_SSD): q, k, gk [n][H][N], v [n][H][P]. */
static hyla_status ssd_expand(hyla_cuda_ctx *c, const float *xbc, int ldx, const float *dt, int ld_dt,
                              const float *dt_bias, const float *A_log, float dt_min, float dt_max, int n, int H, int P,
                              int G, int N, float **q, float **k, float **gk, float **v) {
    size_t qn = (size_t)n * H * N, vn = (size_t)n * H * P;
    size_t qb = (qn * 4 + 255) & ~(size_t)255, vb = (vn * 4 + 255) & ~(size_t)255;
    void *scr;
    HYLA_TRY(cu_scratch(c, SCR_SSD, 3 * qb + vb, &scr));
    uint8_t *p = (uint8_t *)scr;
    *q = (float *)p, *k = (float *)(p + qb), *gk = (float *)(p + 2 * qb), *v = (float *)(p + 3 * qb);
    k_ssd_expand<<<dim3(n, H), 128, 0, c->stream>>>(xbc, ldx, dt, ld_dt, dt_bias, A_log, dt_min, dt_max, H, P, G, N, *q,
                                                    *k, *gk, *v);
    CU_LAUNCH_CHECK("ssd expand");
    return HYLA_OK;
}

/* y [n][H][P] = o + D x (y may alias o). */
__global__ void k_ssd_finish(const float *o, const float *__restrict__ xbc, int ldx, const float *__restrict__ Dskip,
                             int n, int H, int P, float *y) {
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x, tot = (size_t)n * H * P;
    if (e >= tot) return;
    size_t t = e / ((size_t)H * P);
    int hp = (int)(e % ((size_t)H * P)), h = hp / P;
    y[e] = o[e] + Dskip[h] * xbc[t * ldx + hp];
}


extern "C" hyla_status cu_ssd_prefill(void *ctx, const float *xbc, int ldx, const float *dt, int ld_dt,
                                      const float *dt_bias, const float *A_log, const float *Dskip, float dt_min,
                                      float dt_max, int n, int H, int P, int G, int N, float *S, float *y) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    HYLA_TRY(m2_check("ssd_prefill", n, ldx, ld_dt, H, P, G, N));
    if (n == 0) return HYLA_OK;
    if (!cu_gla_slabs(0, N) && !cu_linattn_chunked_ok(c, 0, H, N, P, 1)) {
        void *d_s;
        HYLA_TRY(cu_stage(c, &S, sizeof(float *), &d_s));
        SsdArgs a = {xbc, dt, dt_bias, A_log, Dskip, ldx, ld_dt, H, P, G, N, n, dt_min, dt_max, (float *const *)d_s, y};
        return launch_rec(c, a, 1);
    }
    float *q, *k, *gk, *v;
    HYLA_TRY(ssd_expand(c, xbc, ldx, dt, ld_dt, dt_bias, A_log, dt_min, dt_max, n, H, P, G, N, &q, &k, &gk, &v));
    size_t vn = (size_t)n * H * P;
    HYLA_TRY(cu_gla_prefill(c, q, k, v, gk, n, H, N, P, 1.0f, S, y));
    k_ssd_finish<<<cu_blocks(vn, M2_TPB), M2_TPB, 0, c->stream>>>(y, xbc, ldx, Dskip, n, H, P, y);
    CU_LAUNCH_CHECK("ssd finish");
    return HYLA_OK;
}

/* ---------------------------------------------------------------- decode */

/* Decode is GLA decode (q = C, k = B, v = dt'·x, the decay a on every state row, scale 1) plus
 * D·x, as the chunked prefill is chunked GLA: `k_lin_dec` (N <= 128) or its key slabs (N > 128)
 * read and write each state once at ~0.9 of the copy rate, where the SSD-specific recurrent
 * kernel (`k_ssd_rec`: 32 columns per block, a shared-memory reduction of y per token) reached
 * 0.5 at N = 128 and 0.35 at 512. The per-head operands cost n·H·(3N + P) floats of scratch
 * (~5 % of the state traffic at N = 128, P = 64). */
extern "C" hyla_status cu_ssd_decode_dev(hyla_cuda_ctx *c, const float *xbc, int ldx, const float *dt, int ld_dt,
                                         const float *dt_bias, const float *A_log, const float *Dskip, float dt_min,
                                         float dt_max, int B, int H, int P, int G, int N, float *const *d_S,
                                         int states16, float *y) {
    if (B <= 0) return HYLA_OK;
    float *q, *k, *gk, *v;
    HYLA_TRY(ssd_expand(c, xbc, ldx, dt, ld_dt, dt_bias, A_log, dt_min, dt_max, B, H, P, G, N, &q, &k, &gk, &v));
    HYLA_TRY(cu_lin_decode_dev(c, 0, q, k, v, gk, NULL, B, H, N, P, 1.0f, d_S, states16, y));
    size_t vn = (size_t)B * H * P;
    k_ssd_finish<<<cu_blocks(vn, M2_TPB), M2_TPB, 0, c->stream>>>(y, xbc, ldx, Dskip, B, H, P, y);
    CU_LAUNCH_CHECK("ssd finish");
    return HYLA_OK;
}

extern "C" hyla_status cu_ssd_decode_check(int B, int ldx, int ld_dt, int H, int P, int G, int N) {
    HYLA_TRY(m2_check("ssd_decode", B, ldx, ld_dt, H, P, G, N));
    if (B > 65535) return hyla_fail(HYLA_ERR_UNSUPPORTED, "ssd_decode: batch %d", B);
    return HYLA_OK;
}

extern "C" hyla_status cu_ssd_decode(void *ctx, const float *xbc, int ldx, const float *dt, int ld_dt,
                                     const float *dt_bias, const float *A_log, const float *Dskip, float dt_min,
                                     float dt_max, int B, int H, int P, int G, int N, float *const *S, float *y) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    HYLA_TRY(cu_ssd_decode_check(B, ldx, ld_dt, H, P, G, N));
    if (B <= 0) return HYLA_OK;
    void *d_s;
    HYLA_TRY(cu_stage(c, S, (size_t)B * sizeof(float *), &d_s));
    return cu_ssd_decode_dev(c, xbc, ldx, dt, ld_dt, dt_bias, A_log, Dskip, dt_min, dt_max, B, H, P, G, N,
                             (float *const *)d_s, cu_states16(S, B), y);
}

/* ---------------------------------------------------------------- gated norm, copy2d */

/* [M2-3] one warp per (row, group); fp32 sum of squares in a fixed order. */
__global__ void k_ssd_norm(const float *o, const float *__restrict__ z, int ldz, const float *__restrict__ w, float *y,
                           int rows, int G, int gs, float eps) {
    int wid = (int)(((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
    if (wid >= rows * G) return;
    int r = wid / G, g = wid % G;
    size_t base = (size_t)r * G * gs + (size_t)g * gs;
    const float *orow = o + base, *zr = z + (size_t)r * ldz + (size_t)g * gs;
    float ss = 0.0f;
    for (int j = lane; j < gs; j += 32) {
        float zz = zr[j];
        float u = orow[j] * (zz / (1.0f + expf(-zz)));
        ss += u * u;
    }
#pragma unroll
    for (int m = 16; m; m >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, m);
    float inv = rsqrtf(ss / (float)gs + eps);
    for (int j = lane; j < gs; j += 32) {
        float zz = zr[j];
        float u = orow[j] * (zz / (1.0f + expf(-zz)));
        y[base + j] = u * inv * w[(size_t)g * gs + j];
    }
}

extern "C" hyla_status cu_ssd_norm_check(int ldz, int rows, int G, int gs) {
    if (rows < 0 || G <= 0 || gs <= 0 || ldz < G * gs)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "ssd_norm: rows=%d G=%d gs=%d ldz=%d", rows, G, gs, ldz);
    return HYLA_OK;
}

extern "C" hyla_status cu_ssd_norm(void *ctx, const float *o, const float *z, int ldz, const float *w, float *y,
                                   int rows, int G, int gs, float eps) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    HYLA_TRY(cu_ssd_norm_check(ldz, rows, G, gs));
    if (rows == 0) return HYLA_OK;
    size_t warps = (size_t)rows * G;
    k_ssd_norm<<<cu_blocks(warps * 32, M2_TPB), M2_TPB, 0, c->stream>>>(o, z, ldz, w, y, rows, G, gs, eps);
    CU_LAUNCH_CHECK("ssd_norm");
    return HYLA_OK;
}

extern "C" hyla_status cu_copy2d_check(int ldd, int lds, int rows, int cols) {
    if (rows < 0 || cols < 0 || ldd < cols || lds < cols)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "copy2d: rows=%d cols=%d ldd=%d lds=%d", rows, cols, ldd, lds);
    return HYLA_OK;
}

extern "C" hyla_status cu_copy2d(void *ctx, float *dst, int ldd, const float *src, int lds, int rows, int cols) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    HYLA_TRY(cu_copy2d_check(ldd, lds, rows, cols));
    if (rows == 0 || cols == 0) return HYLA_OK;
    CU_TRY(cudaMemcpy2DAsync(dst, (size_t)ldd * 4, src, (size_t)lds * 4, (size_t)cols * 4, (size_t)rows,
                             cudaMemcpyDeviceToDevice, c->stream));
    return HYLA_OK;
}
