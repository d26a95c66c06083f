/* hyla_cuda_dla.cu — dynamic linear attention (DLA) on the GPU [DLA-1..5] (docs/MODELS.md §4.7),
 * and Mamba2's gates and D skip outside the SSD ops (the DLA-over-Mamba2 base uses them).
 *
 * One kernel (k_dla) serves prefill and decode: one block per (session, head) walks that head's
 * tokens in order, because each token's boundary and merge decisions depend on the states every
 * earlier token left. Thread x owns the state columns j = x + bdim*c of every state of the head
 * (bdim = dv rounded up to a warp, at most 256), so the transition, the merge, the shift, the
 * write and the read touch only the thread's own columns and need no synchronisation; only the
 * information score's two state sums are reduced over the block (in double, in a fixed order).
 * The states stay in global memory (K states of dk*dv floats do not fit on chip); a token costs
 * O(m*dk*dv) reads and writes, the paper's §4.3 cost.
 *
 * Bits: prefill and decode run the same per-token code with the same block shape, so a prefill
 * equals a decode loop bit for bit, for any piece size. Against the CPU reference the float
 * operations of the transition, merge, write and read are the same and in the same order per
 * element (no FMA contraction: explicit __fmul_rn/__fadd_rn); the score is reduced in double in
 * another order and rounded to float once, and softplus/exp come from CUDA's libm, so the two
 * backends agree to a few ulps and take the same decisions except within that distance of tau
 * or of a density tie (tests/test_gpu_ops.c states the tolerance).
 * The cache's counts are not validated on the device (the CPU backend checks them on the host).
 * Threading: launched on the context's stream; every op flushes the graph log first. */
#include <math.h>

#include "hyla_cuda_dla.h"
#include "hyla_cuda_impl.h"

#define DLA_MAXC 8    /* columns per thread: dv <= 8 * 256 */
#define DLA_MAXT 256  /* threads per block */
#define DLA_NORM_EPS 1e-6
#define DLA_SCORE_EPS 1e-6

struct DlaArgs {
    const float *q, *k, *v, *g, *erase, *write, *lam;
    const hyla_dla_cache *caches; /* device array [B] */
    float *o;
    int H, dk, dv, K, ntok;
    float tau, scale;
};

__device__ __forceinline__ float dla_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* Sum of one double per thread over the block, in a fixed order; every thread gets the sum. */
__device__ double dla_block_sum(double x, double *red) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_down_sync(0xffffffffu, x, o);
    __syncthreads(); /* red's previous readers are done */
    if (lane == 0) red[w] = x;
    __syncthreads();
    double s = 0;
    for (int i = 0; i < nw; i++) s += red[i];
    return s;
}

/* grid (H, B); token t of session b is row (b*ntok + t) of q, k, v, o ([row][H][d]), g, erase,
 * write ([row][H]) and lam ([row][H][K]). Shared: q, k [dk], v [dv], lam [K], n [K], I [K]. */
__global__ void __launch_bounds__(DLA_MAXT) k_dla(DlaArgs a) {
    extern __shared__ float sm[];
    __shared__ double red[DLA_MAXT / 32];
    const int h = blockIdx.x, b = blockIdx.y, x = threadIdx.x, bd = blockDim.x;
    const int H = a.H, dk = a.dk, dv = a.dv, K = a.K;
    float *sq = sm, *sk = sq + dk, *sv = sk + dk, *sl = sv + dv, *sI = sl + K;
    int *sn = (int *)(sI + K);
    const hyla_dla_cache c = a.caches[b];
    float *S = c.S + (size_t)h * K * dk * dv;
    const size_t SZ = (size_t)dk * dv;
    int M = c.m[h];
    for (int i = x; i < K; i += bd) {
        sn[i] = c.n[(size_t)h * K + i];
        sI[i] = c.I[(size_t)h * K + i];
    }
    for (int t = 0; t < a.ntok; t++) {
        const size_t r = ((size_t)b * a.ntok + t) * H + h;
        __syncthreads(); /* the previous token's readers of the shared vectors are done */
        for (int i = x; i < dk; i += bd) {
            sq[i] = a.q[r * dk + i];
            sk[i] = a.k[r * dk + i];
        }
        for (int j = x; j < dv; j += bd) sv[j] = a.v[r * dv + j];
        for (int i = x; i < K; i += bd) sl[i] = a.lam[r * K + i];
        __syncthreads();
        const float g = a.g[r], e = a.erase ? a.erase[r] : 0.0f, w = a.write[r];
        /* [DLA-2] the newest state's sums before the transition (double, fixed order) */
        double SSp = 0, sSp = 0;
        if (M > 0) {
            const float *Sn = S + (size_t)(M - 1) * SZ;
            for (int j = x; j < dv; j += bd) {
                double cs = 0;
                for (int i = 0; i < dk; i++) {
                    double s = Sn[(size_t)i * dv + j];
                    SSp += s * s;
                    cs += (double)sk[i] * s;
                }
                sSp += cs * (double)sv[j];
            }
        }
        double SS = dla_block_sum(SSp, red);
        double sS = dla_block_sum(sSp, red);
        float It = a.tau;
        if (M > 0 && SS != 0) {
            double kk = 0, vv = 0;
            for (int i = 0; i < dk; i++) kk += (double)sk[i] * sk[i];
            for (int j = 0; j < dv; j++) vv += (double)sv[j] * sv[j];
            double Nd = (double)dk * dv, ss = (double)w * w * kk * vv;
            sS *= w;
            double rs = 1.0 / sqrt(ss / Nd + DLA_NORM_EPS), rS = 1.0 / sqrt(SS / Nd + DLA_NORM_EPS);
            double d2 = rs * rs * ss + rS * rS * SS - 2.0 * rs * rS * sS;
            if (d2 < 0) d2 = 0;
            It = (float)(sqrt(d2) / (rS * sqrt(SS) + DLA_SCORE_EPS));
        }
        /* [DLA-1] the transition of every state, on the thread's columns */
        const float av = expf(g);
        for (int s = 0; s < M; s++) {
            float *Ss = S + (size_t)s * SZ;
            for (int j = x; j < dv; j += bd) {
                if (e == 0.0f) {
                    for (int i = 0; i < dk; i++) Ss[(size_t)i * dv + j] = __fmul_rn(Ss[(size_t)i * dv + j], av);
                    continue;
                }
                float tmp = 0.0f;
                for (int i = 0; i < dk; i++) {
                    float y = __fmul_rn(Ss[(size_t)i * dv + j], av);
                    Ss[(size_t)i * dv + j] = y;
                    tmp = __fadd_rn(tmp, __fmul_rn(sk[i], y));
                }
                for (int i = 0; i < dk; i++) {
                    float ek = __fmul_rn(e, sk[i]);
                    Ss[(size_t)i * dv + j] = __fsub_rn(Ss[(size_t)i * dv + j], __fmul_rn(ek, tmp));
                }
            }
        }
        /* [DLA-3, DLA-4] open a state (merging the lowest-density pair of a full cache first) */
        if (M == 0 || It >= a.tau) {
            if (M == K) {
                int best = 0;
                float bdn = 0;
                for (int i = 0; i + 1 < M; i++) {
                    float d = (sI[i] + sI[i + 1]) / (float)(sn[i] + sn[i + 1]);
                    if (i == 0 || d < bdn) bdn = d, best = i;
                }
                float *Sb = S + (size_t)best * SZ;
                for (int j = x; j < dv; j += bd)
                    for (int i = 0; i < dk; i++) {
                        size_t p = (size_t)i * dv + j;
                        Sb[p] = __fadd_rn(Sb[p], Sb[SZ + p]);
                    }
                for (int s = best + 1; s + 1 < M; s++) {
                    float *Sd = S + (size_t)s * SZ;
                    for (int j = x; j < dv; j += bd)
                        for (int i = 0; i < dk; i++) Sd[(size_t)i * dv + j] = Sd[SZ + (size_t)i * dv + j];
                }
                __syncthreads(); /* every thread read sn, sI above */
                if (x == 0) {
                    sn[best] += sn[best + 1];
                    sI[best] = sI[best] + sI[best + 1];
                    for (int s = best + 1; s + 1 < M; s++) {
                        sn[s] = sn[s + 1];
                        sI[s] = sI[s + 1];
                    }
                }
                M--;
            }
            float *Sz = S + (size_t)M * SZ;
            for (int j = x; j < dv; j += bd)
                for (int i = 0; i < dk; i++) Sz[(size_t)i * dv + j] = 0.0f;
            __syncthreads();
            if (x == 0) {
                sn[M] = 0;
                sI[M] = 0.0f;
            }
            M++;
        }
        /* the token's state into the newest one */
        float *Sn = S + (size_t)(M - 1) * SZ;
        for (int j = x; j < dv; j += bd)
            for (int i = 0; i < dk; i++) {
                size_t p = (size_t)i * dv + j;
                Sn[p] = __fadd_rn(Sn[p], __fmul_rn(__fmul_rn(w, sk[i]), sv[j]));
            }
        __syncthreads();
        if (x == 0) {
            sn[M - 1] += 1;
            sI[M - 1] = sI[M - 1] + It;
        }
        /* [DLA-5] the read; lam[0] weighs the newest state */
        float acc[DLA_MAXC];
#pragma unroll
        for (int cc = 0; cc < DLA_MAXC; cc++) acc[cc] = 0.0f;
        for (int s = 0; s < M; s++) {
            const float *Ss = S + (size_t)s * SZ;
            const float l = dla_softplus(sl[M - 1 - s]);
#pragma unroll
            for (int cc = 0; cc < DLA_MAXC; cc++) {
                int j = x + cc * bd;
                if (j >= dv) break;
                float tmp = 0.0f;
                for (int i = 0; i < dk; i++) tmp = __fadd_rn(tmp, __fmul_rn(__fmul_rn(a.scale, sq[i]), Ss[(size_t)i * dv + j]));
                acc[cc] = __fadd_rn(acc[cc], __fmul_rn(l, tmp));
            }
        }
#pragma unroll
        for (int cc = 0; cc < DLA_MAXC; cc++) {
            int j = x + cc * bd;
            if (j < dv) a.o[r * dv + j] = acc[cc];
        }
    }
    __syncthreads();
    for (int i = x; i < K; i += bd) {
        c.n[(size_t)h * K + i] = i < M ? sn[i] : 0;
        c.I[(size_t)h * K + i] = i < M ? sI[i] : 0.0f;
    }
    if (x == 0) c.m[h] = M;
}

static hyla_status dla_check(const char *op, const hyla_dla_params *p, int n, size_t *smem) {
    if (n < 0 || p->H <= 0 || p->dk <= 0 || p->dv <= 0 || p->K < 2 || !(p->tau >= 0))
        return hyla_fail(HYLA_ERR_INVALID_ARG, "%s: n=%d H=%d dk=%d dv=%d K=%d tau=%g", op, n, p->H, p->dk, p->dv, p->K,
                         (double)p->tau);
    if (p->dv > DLA_MAXC * DLA_MAXT || p->H > 65535)
        return hyla_fail(HYLA_ERR_UNSUPPORTED, "%s: dv=%d (at most %d) H=%d on cuda", op, p->dv, DLA_MAXC * DLA_MAXT,
                         p->H);
    *smem = (size_t)(2 * p->dk + p->dv + 2 * p->K) * sizeof(float) + (size_t)p->K * sizeof(int);
    if (*smem > 48 * 1024)
        return hyla_fail(HYLA_ERR_UNSUPPORTED, "%s: dk=%d dv=%d K=%d need %zu bytes of shared memory on cuda", op, p->dk,
                         p->dv, p->K, *smem);
    return HYLA_OK;
}

/* dla_prefill (one session, B = 1, of ntok tokens) and dla_decode (B sessions of one token, each
 * its own cache): the graph log flushed, the checks (`op` names the caller's op), then k_dla
 * over B x ntok tokens. */
static hyla_status dla_run(void *ctx, const char *op, const hyla_dla_params *p, const float *q, const float *k,
                           const float *v, const float *g, const float *erase, const float *write, const float *lam,
                           int B, int ntok, float scale, const hyla_dla_cache *c, float *o) {
    hyla_cuda_ctx *cx = (hyla_cuda_ctx *)ctx;
    size_t smem;
    HYLA_TRY(cu_graph_flush(cx));
    HYLA_TRY(dla_check(op, p, B * ntok, &smem));
    if (B * ntok == 0) return HYLA_OK;
    if (B > 65535) return hyla_fail(HYLA_ERR_UNSUPPORTED, "%s: batch %d on cuda", op, B);
    void *d_c;
    HYLA_TRY(cu_stage(cx, c, (size_t)B * sizeof *c, &d_c));
    DlaArgs a = {q, k, v, g, erase, write, lam, (const hyla_dla_cache *)d_c, o, p->H, p->dk, p->dv, p->K, ntok,
                 p->tau, scale};
    int bd = (p->dv + 31) / 32 * 32;
    if (bd > DLA_MAXT) bd = DLA_MAXT;
    k_dla<<<dim3(p->H, B), bd, smem, cx->stream>>>(a);
    CU_LAUNCH_CHECK("k_dla");
    return HYLA_OK;
}

extern "C" hyla_status cu_dla_prefill(void *ctx, const hyla_dla_params *p, const float *q, const float *k,
                                      const float *v, const float *g, const float *erase, const float *write,
                                      const float *lam, int n, float scale, const hyla_dla_cache *c, float *o) {
    return dla_run(ctx, "dla_prefill", p, q, k, v, g, erase, write, lam, 1, n, scale, c, o);
}

extern "C" hyla_status cu_dla_decode(void *ctx, const hyla_dla_params *p, const float *q, const float *k,
                                     const float *v, const float *g, const float *erase, const float *write,
                                     const float *lam, int B, float scale, const hyla_dla_cache *c, float *o) {
    return dla_run(ctx, "dla_decode", p, q, k, v, g, erase, write, lam, B, 1, scale, c, o);
}

/* ---- Mamba2's gates and skip [M2-1, M2-2]: the fp32 formulas of hyla_cuda_mamba2.cu ---- */

__global__ void k_ssd_gates(const float *dt, int ld_dt, const float *dt_bias, const float *A_log, float lo, float hi,
                            int n, int H, float *a, float *dtp) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)n * H) return;
    int t = (int)(i / H), h = (int)(i % H);
    float z = dt[(size_t)t * ld_dt + h] + dt_bias[h];
    float d = fmaxf(z, 0.0f) + log1pf(expf(-fabsf(z)));
    d = fminf(fmaxf(d, lo), hi);
    dtp[i] = d;
    a[i] = -expf(A_log[h]) * d;
}

__global__ void k_ssd_skip(float *y, const float *x, int ldx, const float *Dskip, int n, int H, int P) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)n * H * P) return;
    size_t t = i / ((size_t)H * P);
    int hp = (int)(i % ((size_t)H * P));
    y[i] += Dskip[hp / P] * x[t * ldx + hp];
}

extern "C" hyla_status cu_ssd_gates(void *ctx, const float *dt, int ld_dt, const float *dt_bias, const float *A_log,
                                    float dt_min, float dt_max, int n, int H, float *a, float *dtp) {
    hyla_cuda_ctx *cx = (hyla_cuda_ctx *)ctx;
    HYLA_TRY(cu_graph_flush(cx));
    if (n < 0 || H <= 0 || ld_dt < H) return hyla_fail(HYLA_ERR_INVALID_ARG, "ssd_gates: n=%d H=%d ld_dt=%d", n, H, ld_dt);
    size_t total = (size_t)n * H;
    if (!total) return HYLA_OK;
    k_ssd_gates<<<(unsigned)((total + 255) / 256), 256, 0, cx->stream>>>(dt, ld_dt, dt_bias, A_log, dt_min, dt_max, n, H,
                                                                          a, dtp);
    CU_LAUNCH_CHECK("k_ssd_gates");
    return HYLA_OK;
}

extern "C" hyla_status cu_ssd_skip(void *ctx, float *y, const float *x, int ldx, const float *Dskip, int n, int H,
                                   int P) {
    hyla_cuda_ctx *cx = (hyla_cuda_ctx *)ctx;
    HYLA_TRY(cu_graph_flush(cx));
    if (n < 0 || H <= 0 || P <= 0 || ldx < H * P)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "ssd_skip: n=%d H=%d P=%d ldx=%d", n, H, P, ldx);
    size_t total = (size_t)n * H * P;
    if (!total) return HYLA_OK;
    k_ssd_skip<<<(unsigned)((total + 255) / 256), 256, 0, cx->stream>>>(y, x, ldx, Dskip, n, H, P);
    CU_LAUNCH_CHECK("k_ssd_skip");
    return HYLA_OK;
}
