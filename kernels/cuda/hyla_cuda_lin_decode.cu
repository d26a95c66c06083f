/* hyla_cuda_lin_decode.cu — the GLA / GDN recurrence one token at a time on the GPU: batched
 * decode (also SSE decode, whose states are {S0, Sp[idx]}) and the token-loop fallback of
 * prefill for shapes the chunked kernels do not take.
 *
 * Recurrent kernel: one block per (session, head, 32 value columns); lane = value column j,
 * warp w owns key rows i = w + 8r, so S[i][j] lives in registers for the whole call and the
 * state is read and written once (coalesced 128-byte rows). Reductions over i go through
 * shared memory in a fixed order (deterministic). k_lin_rec4 (4 columns per lane) and k_lin_dec
 * (the decode form, in hyla_cuda_lin_dec.cuh with the slot lookup the kernels share) do the same
 * arithmetic with wider loads.
 * Threading: launched on the context's stream. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_cuda_impl.h"
#include "hyla_cuda_lin_dec.cuh"

/* ================================================================ recurrent kernel */

/* Token row `row`'s weight for partition `part` (its last route to it) into wt; 0 when the
 * token did not select the partition. */
__device__ __forceinline__ int lin_token_weight(const hyla_cu_linrec &a, size_t row, int part, float &wt) {
    int js = -1;
    for (int q = 0; q < a.K; q++)
        if (a.idx[row * a.K + q] == part) js = q;
    if (js < 0) return 0;
    wt = a.w[row * a.K + js];
    return 1;
}

template <int R>
__global__ void __launch_bounds__(256) k_lin_rec(hyla_cu_linrec a) {
    __shared__ float red[2][8][33];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int j = blockIdx.x * 32 + lane;
    bool jv = j < a.dv;
    int h = blockIdx.y, b = blockIdx.z;
    const int H = a.H, dk = a.dk, dv = a.dv;
    int nslots = a.Sp ? (a.ntok == 1 ? 1 + a.K : 1 + a.N) : 1;
    int m = 0; /* reduction counter: buffer m & 1 */
    for (int slot = 0; slot < nslots; slot++) {
        float *Sg, wfix;
        int part;
        if (!lin_slot_state<false>(a, b, h, H, dk, dv, slot, Sg, part, wfix)) continue; /* invalid route: skip (uniform) */
        const float *Q = slot ? a.q2 : a.q1, *Kx = slot ? a.k2 : a.k1;
        const float *GA = slot ? a.gb : a.ga, *BE = slot ? a.betab : a.betaa;
        float s[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            int i = w + 8 * r;
            s[r] = (i < dk && jv) ? Sg[(size_t)i * dv + j] : 0.0f;
        }
        for (int t = 0; t < a.ntok; t++) {
            size_t row = (size_t)b * a.ntok + t;
            float wt = wfix;
            if (slot > 0 && a.ntok > 1 && !lin_token_weight(a, row, part, wt))
                continue; /* token did not select this partition (uniform) */
            const float *qr = Q + (row * H + h) * dk, *kr = Kx + (row * H + h) * dk;
            float vj = jv ? a.v[(row * H + h) * dv + j] : 0.0f;
            float po = 0.0f;
            if (!a.gdn) {
                const float *gk = GA + (row * H + h) * dk;
#pragma unroll
                for (int r = 0; r < R; r++) {
                    int i = w + 8 * r;
                    if (i < dk) {
                        float ki = kr[i] * wt, qi = qr[i] * wt;
                        s[r] = __fmaf_rn(expf(gk[i]), s[r], __fmul_rn(ki, vj)); /* explicit: every form */
                        po = __fmaf_rn(qi, s[r], po);                           /* rounds alike */
                    }
                }
            } else {
                float d = expf(GA[row * H + h]);
                float beta = BE[row * H + h];
                float pk = 0.0f;
#pragma unroll
                for (int r = 0; r < R; r++) {
                    int i = w + 8 * r;
                    if (i < dk) {
                        s[r] *= d;
                        pk += kr[i] * wt * s[r];
                    }
                }
                red[m & 1][w][lane] = pk;
                __syncthreads();
                float ks = 0.0f;
#pragma unroll
                for (int q = 0; q < 8; q++) ks += red[m & 1][q][lane];
                m++;
                float u = beta * (vj - ks);
#pragma unroll
                for (int r = 0; r < R; r++) {
                    int i = w + 8 * r;
                    if (i < dk) {
                        s[r] += kr[i] * wt * u;
                        po += qr[i] * wt * s[r];
                    }
                }
            }
            red[m & 1][w][lane] = po;
            __syncthreads();
            if (w == 0 && jv) {
                float acc = 0.0f;
#pragma unroll
                for (int q = 0; q < 8; q++) acc += red[m & 1][q][lane];
                float *op = a.o + (row * H + h) * dv + j;
                if (slot == 0)
                    *op = a.scale * acc;
                else
                    *op += a.scale * acc;
            }
            m++;
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            int i = w + 8 * r;
            if (i < dk && jv) Sg[(size_t)i * dv + j] = s[r];
        }
    }
}

/* The same recurrence with 4 value columns per lane (16-byte state loads and stores): one block
 * covers 128 columns of a head. For dv % 4 == 0, dk <= 128, 16-byte aligned v, o and states. */
template <int R>
__global__ void __launch_bounds__(256) k_lin_rec4(hyla_cu_linrec a) {
    __shared__ float4 red[2][8][32];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int j = blockIdx.x * 128 + lane * 4;
    bool jv = j < a.dv;
    int h = blockIdx.y, b = blockIdx.z;
    const int H = a.H, dk = a.dk, dv = a.dv;
    int nslots = a.Sp ? (a.ntok == 1 ? 1 + a.K : 1 + a.N) : 1;
    int m = 0;
    for (int slot = 0; slot < nslots; slot++) {
        float *Sg, wfix;
        int part;
        if (!lin_slot_state<false>(a, b, h, H, dk, dv, slot, Sg, part, wfix)) continue; /* invalid route: skip (uniform) */
        const float *Q = slot ? a.q2 : a.q1, *Kx = slot ? a.k2 : a.k1;
        const float *GA = slot ? a.gb : a.ga, *BE = slot ? a.betab : a.betaa;
        float4 s[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            int i = w + 8 * r;
            s[r] = (i < dk && jv) ? *(const float4 *)(Sg + (size_t)i * dv + j) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
        for (int t = 0; t < a.ntok; t++) {
            size_t row = (size_t)b * a.ntok + t;
            float wt = wfix;
            if (slot > 0 && a.ntok > 1 && !lin_token_weight(a, row, part, wt))
                continue; /* token did not select this partition (uniform) */
            const float *qr = Q + (row * H + h) * dk, *kr = Kx + (row * H + h) * dk;
            float4 vj = jv ? *(const float4 *)(a.v + (row * H + h) * dv + j) : make_float4(0.f, 0.f, 0.f, 0.f);
            float4 po = make_float4(0.f, 0.f, 0.f, 0.f);
            if (!a.gdn) {
                const float *gk = GA + (row * H + h) * dk;
#pragma unroll
                for (int r = 0; r < R; r++) {
                    int i = w + 8 * r;
                    if (i < dk) {
                        float ki = kr[i] * wt, qi = qr[i] * wt, d = expf(gk[i]);
                        s[r].x = __fmaf_rn(d, s[r].x, __fmul_rn(ki, vj.x));
                        s[r].y = __fmaf_rn(d, s[r].y, __fmul_rn(ki, vj.y));
                        s[r].z = __fmaf_rn(d, s[r].z, __fmul_rn(ki, vj.z));
                        s[r].w = __fmaf_rn(d, s[r].w, __fmul_rn(ki, vj.w));
                        po.x = __fmaf_rn(qi, s[r].x, po.x);
                        po.y = __fmaf_rn(qi, s[r].y, po.y);
                        po.z = __fmaf_rn(qi, s[r].z, po.z);
                        po.w = __fmaf_rn(qi, s[r].w, po.w);
                    }
                }
            } else {
                float d = expf(GA[row * H + h]);
                float beta = BE[row * H + h];
                float4 pk = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
                for (int r = 0; r < R; r++) {
                    int i = w + 8 * r;
                    if (i < dk) {
                        float ki = kr[i] * wt;
                        s[r].x *= d;
                        s[r].y *= d;
                        s[r].z *= d;
                        s[r].w *= d;
                        pk.x += ki * s[r].x;
                        pk.y += ki * s[r].y;
                        pk.z += ki * s[r].z;
                        pk.w += ki * s[r].w;
                    }
                }
                red[m & 1][w][lane] = pk;
                __syncthreads();
                float4 ks = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
                for (int q = 0; q < 8; q++) {
                    float4 x = red[m & 1][q][lane];
                    ks.x += x.x;
                    ks.y += x.y;
                    ks.z += x.z;
                    ks.w += x.w;
                }
                m++;
                float4 u = make_float4(beta * (vj.x - ks.x), beta * (vj.y - ks.y), beta * (vj.z - ks.z),
                                       beta * (vj.w - ks.w));
#pragma unroll
                for (int r = 0; r < R; r++) {
                    int i = w + 8 * r;
                    if (i < dk) {
                        float ki = kr[i] * wt, qi = qr[i] * wt;
                        s[r].x += ki * u.x;
                        s[r].y += ki * u.y;
                        s[r].z += ki * u.z;
                        s[r].w += ki * u.w;
                        po.x += qi * s[r].x;
                        po.y += qi * s[r].y;
                        po.z += qi * s[r].z;
                        po.w += qi * s[r].w;
                    }
                }
            }
            red[m & 1][w][lane] = po;
            __syncthreads();
            if (w == 0 && jv) {
                float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
                for (int q = 0; q < 8; q++) {
                    float4 x = red[m & 1][q][lane];
                    acc.x += x.x;
                    acc.y += x.y;
                    acc.z += x.z;
                    acc.w += x.w;
                }
                float4 *op = (float4 *)(a.o + (row * H + h) * dv + j);
                float4 res = make_float4(a.scale * acc.x, a.scale * acc.y, a.scale * acc.z, a.scale * acc.w);
                if (slot != 0) {
                    float4 prev = *op;
                    res.x += prev.x;
                    res.y += prev.y;
                    res.z += prev.z;
                    res.w += prev.w;
                }
                *op = res;
            }
            m++;
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            int i = w + 8 * r;
            if (i < dk && jv) *(float4 *)(Sg + (size_t)i * dv + j) = s[r];
        }
    }
}

/* Decode (one token per session, 16-byte aligned states and rows): k_lin_dec with 2 columns
 * per lane and at least 2 blocks per SM, the fastest form on an H100 at every batch measured
 * (2.5-2.6 TB/s of state at B = 64; the other forms in kernels/cuda/dev/NOTES.md). */
static hyla_status launch_dec(hyla_cuda_ctx *c, const hyla_cu_linrec *a, int B, int R) {
    dim3 g(cu_blocks(a->dv, 32 * 2), a->H, B);
    if (a->raw) { /* cu_gdn_decode_raw */
        if (R <= 4) return cu_launch_pdl(c, k_lin_dec<4, 2, 2, true>, g, 256, 0, *a);
        if (R <= 8) return cu_launch_pdl(c, k_lin_dec<8, 2, 2, true>, g, 256, 0, *a);
        return cu_launch_pdl(c, k_lin_dec<16, 2, 2, true>, g, 256, 0, *a);
    }
    if (R <= 4)
        return cu_launch_pdl(c, k_lin_dec<4, 2, 2>, g, 256, 0, *a);
    else if (R <= 8)
        return cu_launch_pdl(c, k_lin_dec<8, 2, 2>, g, 256, 0, *a);
    return cu_launch_pdl(c, k_lin_dec<16, 2, 2>, g, 256, 0, *a);
}

extern "C" hyla_status cu_lin_recurrent(hyla_cuda_ctx *c, const hyla_cu_linrec *a, int B) {
    if (B <= 0 || a->ntok <= 0) return HYLA_OK;
    if (a->dk > 256)
        return hyla_fail(HYLA_ERR_UNSUPPORTED,
                         "linear attention: key head dim %d > 256 is not supported on cuda for %s", a->dk,
                         a->gdn ? "gdn (the delta rule couples the key rows)" : "sse partitions");
    if (a->H > 65535 || B > 65535) return hyla_fail(HYLA_ERR_UNSUPPORTED, "linear attention: H=%d B=%d", a->H, B);
    int R = (a->dk + 7) / 8;
    bool al = a->dv % 4 == 0 && ((uintptr_t)a->v & 15) == 0 && ((uintptr_t)a->o & 15) == 0;
    if (al && a->states16 && R <= 16 && a->ntok == 1) {
        return launch_dec(c, a, B, R);
    }
    if (al && a->states16 && R <= 16) {
        dim3 g4(cu_blocks(a->dv, 128), a->H, B);
        if (R <= 4)
            k_lin_rec4<4><<<g4, 256, 0, c->stream>>>(*a);
        else if (R <= 8)
            k_lin_rec4<8><<<g4, 256, 0, c->stream>>>(*a);
        else
            k_lin_rec4<16><<<g4, 256, 0, c->stream>>>(*a);
        CU_LAUNCH_CHECK("linear attention recurrent (x4)");
        return HYLA_OK;
    }
    dim3 grid(cu_blocks(a->dv, 32), a->H, B);
    if (R <= 2)
        k_lin_rec<2><<<grid, 256, 0, c->stream>>>(*a);
    else if (R <= 4)
        k_lin_rec<4><<<grid, 256, 0, c->stream>>>(*a);
    else if (R <= 8)
        k_lin_rec<8><<<grid, 256, 0, c->stream>>>(*a);
    else if (R <= 16)
        k_lin_rec<16><<<grid, 256, 0, c->stream>>>(*a);
    else
        k_lin_rec<32><<<grid, 256, 0, c->stream>>>(*a);
    CU_LAUNCH_CHECK("linear attention recurrent");
    return HYLA_OK;
}

/* ================================================================ ops */

extern "C" hyla_status cu_lin_decode_dev(hyla_cuda_ctx *c, int gdn, const float *q, const float *k, const float *v,
                                         const float *ga, const float *gb, int B, int H, int dk, int dv, float scale,
                                         float *const *d_S, int states16, float *o) {
    if (B <= 0) return HYLA_OK;
    if (cu_gla_dec_slabs(gdn, dk)) return cu_gla_slab_decode(c, q, k, v, ga, B, H, dk, dv, scale, d_S, states16, o);
    hyla_cu_linrec r;
    cu_linrec_plain(&r, gdn, H, dk, dv, scale, 1, q, k, v, ga, gb, o, d_S, states16);
    return cu_lin_recurrent(c, &r, B);
}

/* GDN decode from the raw projections: the fused kernel where cu_gdn_decode_raw_ok, else
 * l2norm_rows, gdn_gates and the plain decode, in place on q, k, a, b. The same bits either way.
 * The fused form takes batches of up to 32 sessions, where a step is bound by its launches: the
 * 1.68B GDN model on an H100, B = 1 2.005-2.022 -> 1.945-1.986 ms a step; at B = 64 it measured
 * level (4.73-4.76 ms either way) and at B = 256, a step bound by the state traffic, 12.76-12.82 ->
 * 13.00-13.19 ms (the norms' barrier before the staging delays every block's update loop). */
#define GDN_DEC_RAW_MAX_B 32
extern "C" int cu_gdn_decode_raw_ok(const float *q, const float *k, const float *v, const float *o, int B, int H, int dk,
                                    int dv, int states16) {
    return B > 0 && B <= GDN_DEC_RAW_MAX_B && H <= 65535 && dk % 4 == 0 && dk <= 128 && dv % 4 == 0 &&
           states16 && ((uintptr_t)q & 15) == 0 && ((uintptr_t)k & 15) == 0 && ((uintptr_t)v & 15) == 0 &&
           ((uintptr_t)o & 15) == 0;
}

extern "C" hyla_status cu_gdn_decode_raw_dev(hyla_cuda_ctx *c, const float *q, const float *k, const float *v,
                                             const float *a, const float *b, const float *A_log, const float *dt_bias,
                                             int allow_neg, float eps, int B, int H, int dk, int dv, float scale,
                                             float *const *d_S, float *o) {
    hyla_cu_linrec r;
    cu_linrec_plain(&r, 1, H, dk, dv, scale, 1, q, k, v, a, b, o, d_S, 1);
    r.raw = 1;
    r.allow_neg = allow_neg;
    r.qk_eps = eps;
    r.A_log = A_log;
    r.dt_bias = dt_bias;
    return launch_dec(c, &r, B, (dk + 7) / 8);
}

extern "C" hyla_status cu_gdn_decode_raw(void *ctx, float *q, float *k, const float *v, float *a, float *b,
                                         const float *A_log, const float *dt_bias, int allow_neg, float eps, int B,
                                         int H, int dk, int dv, float scale, float *const *S, float *o) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    if (B <= 0) return HYLA_OK;
    if (cu_gdn_decode_raw_ok(q, k, v, o, B, H, dk, dv, cu_states16(S, B))) {
        void *d_s;
        HYLA_TRY(cu_stage(c, S, (size_t)B * sizeof(float *), &d_s));
        return cu_gdn_decode_raw_dev(c, q, k, v, a, b, A_log, dt_bias, allow_neg, eps, B, H, dk, dv, scale,
                                     (float *const *)d_s, o);
    }
    HYLA_TRY(cu_l2norm_rows(ctx, q, B * H, dk, eps));
    HYLA_TRY(cu_l2norm_rows(ctx, k, B * H, dk, eps));
    HYLA_TRY(cu_gdn_gates(ctx, a, H, b, H, A_log, dt_bias, a, b, B, H, allow_neg));
    return cu_gdn_decode(ctx, q, k, v, a, b, B, H, dk, dv, scale, S, o);
}

extern "C" int cu_states16(float *const *S, int B) {
    int a = 1;
    for (int b = 0; b < B; b++) a &= ((uintptr_t)S[b] & 15) == 0;
    return a;
}

static hyla_status decode_common(hyla_cuda_ctx *c, int gdn, const float *q, const float *k, const float *v,
                                 const float *ga, const float *gb, int B, int H, int dk, int dv, float scale,
                                 float *const *S, float *o) {
    if (B <= 0) return HYLA_OK;
    void *d_s;
    HYLA_TRY(cu_stage(c, S, (size_t)B * sizeof(float *), &d_s));
    return cu_lin_decode_dev(c, gdn, q, k, v, ga, gb, B, H, dk, dv, scale, (float *const *)d_s, cu_states16(S, B), o);
}

extern "C" hyla_status cu_gla_decode(void *ctx, const float *q, const float *k, const float *v, const float *gk,
                                     int B, int H, int dk, int dv, float scale, float *const *S, float *o) {
    return decode_common((hyla_cuda_ctx *)ctx, 0, q, k, v, gk, NULL, B, H, dk, dv, scale, S, o);
}

extern "C" hyla_status cu_gdn_decode(void *ctx, const float *q, const float *k, const float *v, const float *g,
                                     const float *beta, int B, int H, int dk, int dv, float scale, float *const *S,
                                     float *o) {
    return decode_common((hyla_cuda_ctx *)ctx, 1, q, k, v, g, beta, B, H, dk, dv, scale, S, o);
}
