/* hyla_cuda_linattn.cu — GLA and gated-delta-rule (GDN) mixers on the GPU: the batched
 * one-token recurrent kernel (decode, also SSE decode and the token-loop fallback of every
 * prefill) and the chunked prefill on tensor cores.
 *
 * Recurrent kernel: one block per (session, head, 32 value columns); lane = value column j,
 * warp w owns key rows i = w + 8r, so S[i][j] lives in registers for the whole call and the
 * state is read and written once (coalesced 128-byte rows). Reductions over i go through
 * shared memory in a fixed order (deterministic).
 *
 * Chunked prefill (chunk C = 64 tokens, aligned to the start of the call; MODELS.md 4.1/4.2):
 *   kernel A, one block per (chunk, head), all chunks in parallel: everything that does not
 *     depend on the state entering the chunk —
 *       GDN: T = (I + tril(diag(beta) K K^T * Gamma, -1))^-1 (fp32 forward substitution),
 *            W = T diag(beta e^b) K, U0 = T diag(beta) V, Aqk = scale tril(Q K^T * Gamma),
 *       GLA: Aqk[t][s] = scale sum_i q_ti k_si e^(b_ti - b_si) by 16x16 sub-blocks with a
 *            reference row (both factors <= 1 off the diagonal), exact exp on a diagonal block
 *            whose decay span could overflow,
 *     and q~ = scale e^b q, k~^T = (e^(b_C - b) k)^T, the chunk decay e^(b_C).
 *   kernel B, one block per (sequence, head, 32 value columns), chunks in order, the state
 *     in fp32 mma accumulators the whole time:
 *       U = U0 - W S (GDN) or V (GLA);  O = q~ S + Aqk U;  S = e^(b_C) S + k~^T U.
 *   Matrix products are bf16 x bf16 -> fp32 (mma.sync m16n8k16); the state is rounded to
 *   bf16 only as an operand, never in storage.
 * GDN with dk <= 128 runs the fused kernel instead (k_gdn_fused: kernel A's quantities computed
 *   per chunk in shared memory by the block that carries the state, so only q, k, v, gates
 *   are read and o written; k_gdn_pipe, its pipelined form with the same bits, where the rows
 *   are plain: chunk c+1's tiles formed beside chunk c's state pass), or for few long sequences its chunk part over all chunks followed
 *   by kernel B (the same arithmetic, the same bits); kernels A and B remain for dk = 256 and
 *   HYLA_CUDA_CHUNK=ab. GLA with dk <= 128 likewise runs a fused kernel (k_gla_fused), whose
 *   tiles and products are exactly kernels A's and B's, so the two give the same bits; kernels A
 *   and B stay for few long sequences, dk = 256 and HYLA_CUDA_CHUNK=ab.
 * Sequences are packed (varlen) so SSE partitions and batched prefill share the kernels; the
 *   fused kernels can also read SSE rows through the plan's row map (no gathered copy).
 * Threading: launched on the context's stream. */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_cuda_impl.h"
#include "hyla_cuda_mma.cuh"
#include "hyla_log.h"

#define CH 64 /* chunk length */

/* ================================================================ recurrent kernel */

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
        float *Sg;
        int part = -1;
        float wfix = 1.0f;
        if (slot == 0) {
            Sg = a.S0[b] + (size_t)h * dk * dv;
        } else {
            if (a.ntok == 1) {
                part = a.idx[(size_t)b * a.K + slot - 1];
                wfix = a.w[(size_t)b * a.K + slot - 1];
            } else {
                part = slot - 1;
            }
            if (part < 0 || part >= a.N) continue; /* invalid route: skip (uniform) */
            Sg = a.Sp[b] + ((size_t)part * H + h) * dk * dv;
        }
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
            if (slot > 0 && a.ntok > 1) {
                int js = -1;
                for (int q = 0; q < a.K; q++)
                    if (a.idx[row * a.K + q] == part) js = q;
                if (js < 0) continue; /* token did not select this partition (uniform) */
                wt = a.w[row * a.K + js];
            }
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
        float *Sg;
        int part = -1;
        float wfix = 1.0f;
        if (slot == 0) {
            Sg = a.S0[b] + (size_t)h * dk * dv;
        } else {
            if (a.ntok == 1) {
                part = a.idx[(size_t)b * a.K + slot - 1];
                wfix = a.w[(size_t)b * a.K + slot - 1];
            } else {
                part = slot - 1;
            }
            if (part < 0 || part >= a.N) continue;
            Sg = a.Sp[b] + ((size_t)part * H + h) * dk * dv;
        }
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
            if (slot > 0 && a.ntok > 1) {
                int js = -1;
                for (int q = 0; q < a.K; q++)
                    if (a.idx[row * a.K + q] == part) js = q;
                if (js < 0) continue;
                wt = a.w[row * a.K + js];
            }
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

/* Decode form of the recurrence (ntok == 1, every batched decode step): VW value columns per
 * lane (16- or 8-byte state loads), one block per (session, head, 32 * VW columns). Unlike the
 * token-loop kernels it stages the token's q, k (times the route weight) and GLA's e^gk for the
 * block's head in shared memory while the state loads are in flight, so the update loop reads
 * them from shared memory instead of waiting on a global load per key row. The arithmetic is
 * k_lin_rec4's, expression by expression, so both give the same bits (tested). */
template <int VW> struct DecVec;
template <> struct DecVec<4> {
    typedef float4 t;
    static __device__ __forceinline__ void ld(float (&d)[4], const float *p) {
        float4 x = *(const float4 *)p;
        d[0] = x.x, d[1] = x.y, d[2] = x.z, d[3] = x.w;
    }
    static __device__ __forceinline__ void st(float *p, const float (&d)[4]) {
        *(float4 *)p = make_float4(d[0], d[1], d[2], d[3]);
    }
};
template <> struct DecVec<2> {
    typedef float2 t;
    static __device__ __forceinline__ void ld(float (&d)[2], const float *p) {
        float2 x = *(const float2 *)p;
        d[0] = x.x, d[1] = x.y;
    }
    static __device__ __forceinline__ void st(float *p, const float (&d)[2]) { *(float2 *)p = make_float2(d[0], d[1]); }
};

template <int R, int VW, int MINB>
__global__ void __launch_bounds__(256, MINB) k_lin_dec(hyla_cu_linrec a) {
    typedef DecVec<VW> V;
    __shared__ __align__(16) float red[2][8][32 * VW];
    __shared__ float sq[8 * R], sk[8 * R], sd[8 * R];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int j = blockIdx.x * 32 * VW + lane * VW;
    bool jv = j < a.dv;
    int h = blockIdx.y, b = blockIdx.z;
    const int H = a.H, dk = a.dk, dv = a.dv;
    int nslots = a.Sp ? 1 + a.K : 1;
    int m = 0;
    float vj[VW];
#pragma unroll
    for (int c = 0; c < VW; c++) vj[c] = 0.0f;
    if (jv) V::ld(vj, a.v + ((size_t)b * H + h) * dv + j);
    for (int slot = 0; slot < nslots; slot++) {
        float *Sg;
        float wt = 1.0f;
        if (slot == 0) {
            Sg = a.S0[b] + (size_t)h * dk * dv;
        } else {
            int part = a.idx[(size_t)b * a.K + slot - 1];
            wt = a.w[(size_t)b * a.K + slot - 1];
            if (part < 0 || part >= a.N) continue; /* invalid route: skip (uniform) */
            Sg = a.Sp[b] + ((size_t)part * H + h) * dk * dv;
        }
        float s[R][VW];
#pragma unroll
        for (int r = 0; r < R; r++) {
            int i = w + 8 * r;
            if (i < dk && jv) {
                V::ld(s[r], Sg + (size_t)i * dv + j);
            } else {
#pragma unroll
                for (int c = 0; c < VW; c++) s[r][c] = 0.0f;
            }
        }
        const float *Q = slot ? a.q2 : a.q1, *Kx = slot ? a.k2 : a.k1;
        const float *GA = slot ? a.gb : a.ga, *BE = slot ? a.betab : a.betaa;
        size_t row = (size_t)b;
        for (int i = threadIdx.x; i < dk; i += 256) {
            sq[i] = Q[(row * H + h) * dk + i] * wt;
            sk[i] = Kx[(row * H + h) * dk + i] * wt;
            if (!a.gdn) sd[i] = expf(GA[(row * H + h) * dk + i]);
        }
        __syncthreads();
        float po[VW];
#pragma unroll
        for (int c = 0; c < VW; c++) po[c] = 0.0f;
        if (!a.gdn) {
#pragma unroll
            for (int r = 0; r < R; r++) {
                int i = w + 8 * r;
                if (i < dk) {
                    float ki = sk[i], qi = sq[i], d = sd[i];
#pragma unroll
                    for (int c = 0; c < VW; c++) s[r][c] = __fmaf_rn(d, s[r][c], __fmul_rn(ki, vj[c]));
#pragma unroll
                    for (int c = 0; c < VW; c++) po[c] = __fmaf_rn(qi, s[r][c], po[c]);
                }
            }
        } else {
            float d = expf(GA[row * H + h]);
            float beta = BE[row * H + h];
            float pk[VW];
#pragma unroll
            for (int c = 0; c < VW; c++) pk[c] = 0.0f;
#pragma unroll
            for (int r = 0; r < R; r++) {
                int i = w + 8 * r;
                if (i < dk) {
                    float ki = sk[i];
#pragma unroll
                    for (int c = 0; c < VW; c++) s[r][c] *= d;
#pragma unroll
                    for (int c = 0; c < VW; c++) pk[c] += ki * s[r][c];
                }
            }
            V::st(&red[m & 1][w][lane * VW], pk);
            __syncthreads();
            float ks[VW];
#pragma unroll
            for (int c = 0; c < VW; c++) ks[c] = 0.0f;
#pragma unroll
            for (int q = 0; q < 8; q++) {
                float x[VW];
                V::ld(x, &red[m & 1][q][lane * VW]);
#pragma unroll
                for (int c = 0; c < VW; c++) ks[c] += x[c];
            }
            m++;
            float u[VW];
#pragma unroll
            for (int c = 0; c < VW; c++) u[c] = beta * (vj[c] - ks[c]);
#pragma unroll
            for (int r = 0; r < R; r++) {
                int i = w + 8 * r;
                if (i < dk) {
                    float ki = sk[i], qi = sq[i];
#pragma unroll
                    for (int c = 0; c < VW; c++) s[r][c] += ki * u[c];
#pragma unroll
                    for (int c = 0; c < VW; c++) po[c] += qi * s[r][c];
                }
            }
        }
        /* the state goes back before the reduction: its stores drain while the block reduces */
#pragma unroll
        for (int r = 0; r < R; r++) {
            int i = w + 8 * r;
            if (i < dk && jv) V::st(Sg + (size_t)i * dv + j, s[r]);
        }
        V::st(&red[m & 1][w][lane * VW], po);
        __syncthreads();
        if (w == 0 && jv) {
            float acc[VW];
#pragma unroll
            for (int c = 0; c < VW; c++) acc[c] = 0.0f;
#pragma unroll
            for (int q = 0; q < 8; q++) {
                float x[VW];
                V::ld(x, &red[m & 1][q][lane * VW]);
#pragma unroll
                for (int c = 0; c < VW; c++) acc[c] += x[c];
            }
            float *op = a.o + ((size_t)b * H + h) * dv + j;
            float res[VW];
#pragma unroll
            for (int c = 0; c < VW; c++) res[c] = a.scale * acc[c];
            if (slot != 0) {
                float prev[VW];
                V::ld(prev, op);
#pragma unroll
                for (int c = 0; c < VW; c++) res[c] += prev[c];
            }
            V::st(op, res);
        }
        m++;
    }
}

/* HYLA_CUDA_REC: "scalar" (1 column per lane, every call), "x4" (k_lin_rec4 for decode too),
 * "d4" / "d4b" / "d2" / "d2c": the decode kernel with 4 or 2 columns per lane and at least 1, 2,
 * 2, 3 blocks per SM (register caps). Default "d2" (fastest on an H100 at every batch measured:
 * 2.5-2.6 TB/s of state at B = 64; BENCHMARKS.md). */
static int dec_mode(void) { /* read per launch (host side only) so tests can compare the forms */
    const char *e = getenv("HYLA_CUDA_REC");
    if (!e) return 0;
    return !strcmp(e, "x4") ? 1 : !strcmp(e, "d4b") ? 5 : !strcmp(e, "d2c") ? 3 : !strcmp(e, "d4") ? 4 : 0;
}

template <int VW, int MINB>
static void launch_dec(hyla_cuda_ctx *c, const hyla_cu_linrec *a, int B, int R) {
    dim3 g(cu_blocks(a->dv, 32 * VW), a->H, B);
    if (R <= 4)
        k_lin_dec<4, VW, MINB><<<g, 256, 0, c->stream>>>(*a);
    else if (R <= 8)
        k_lin_dec<8, VW, MINB><<<g, 256, 0, c->stream>>>(*a);
    else
        k_lin_dec<16, VW, MINB><<<g, 256, 0, c->stream>>>(*a);
}

extern "C" hyla_status cu_lin_recurrent(hyla_cuda_ctx *c, const hyla_cu_linrec *a, int B) {
    if (B <= 0 || a->ntok <= 0) return HYLA_OK;
    if (a->dk > 256)
        return hyla_fail(HYLA_ERR_UNSUPPORTED, "linear attention: key head dim %d > 256 is not supported on cuda",
                         a->dk);
    if (a->H > 65535 || B > 65535) return hyla_fail(HYLA_ERR_UNSUPPORTED, "linear attention: H=%d B=%d", a->H, B);
    int R = (a->dk + 7) / 8;
    bool al = a->dv % 4 == 0 && ((uintptr_t)a->v & 15) == 0 && ((uintptr_t)a->o & 15) == 0;
    int dm = dec_mode();
    if (al && a->states16 && R <= 16 && !c->rec_scalar && a->ntok == 1 && dm != 1) {
        if (dm == 5)
            launch_dec<4, 2>(c, a, B, R);
        else if (dm == 3)
            launch_dec<2, 3>(c, a, B, R);
        else if (dm == 4)
            launch_dec<4, 1>(c, a, B, R);
        else
            launch_dec<2, 2>(c, a, B, R);
        CU_LAUNCH_CHECK("linear attention decode");
        return HYLA_OK;
    }
    if (al && a->states16 && R <= 16 && !c->rec_scalar) {
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

/* ================================================================ chunked prefill */

struct ChunkArgs {
    int H, dk, dv, dkp;
    int vec4; /* dk % 4 == 0 and q, k, v 16-byte aligned: float4 loads */
    int fvec; /* fused GLA: vec4, dv % 4 == 0 and the gates 16-byte aligned: staging by 16-byte pieces */
    int ovec; /* dv even and o 8-byte aligned: o stored two columns at a time */
    float scale;
    const float *q, *k, *v, *ga, *gb;
    float *o;
    const int32_t *ck_tok0, *ck_len;  /* [NC] */
    const int32_t *seq_c0, *seq_nc;   /* [nseq] */
    float *const *S;                  /* [nseq] */
    /* per (chunk, head) scratch, index ch = chunk * H + head */
    __nv_bfloat16 *qt;  /* [ch][64][dkp]  scale e^b q */
    __nv_bfloat16 *ktT; /* [ch][dkp][64]  (e^(bC-b) k)^T */
    __nv_bfloat16 *wt;  /* [ch][64][dkp]  GDN: T diag(beta e^b) K */
    __nv_bfloat16 *aqk; /* [ch][64][64] */
    float *u0;          /* [ch][64][dv]   GDN: T diag(beta) V */
    float *dec;         /* [ch][dkp]      e^(bC) (GDN: element 0) */
    /* SSE row map (rsrc NULL: packed row r is row r of q, k, v, ga, gb). Rows r >= rdense are
     * sparse: s = rsrc[r - rdense], token s / rK, weight rw[s]; their q, k are q2, k2 times
     * the weight (the product the gather kernel would have stored), gates g2 (GDN: beta b2),
     * and v the token's row of v. The dense rows read q, k, ga, gb as without a map. */
    const int32_t *rsrc;
    int rdense, rK;
    const float *rw, *q2, *k2, *g2, *b2;
    long long nrows; /* rows of q, k, v (0: not known) */
};

/* Source of packed row r: token index, sparse or not, weight (1 for dense rows: x * 1.0f == x). */
__device__ __forceinline__ size_t chunk_row(const ChunkArgs &a, int r, int &sp, float &wt) {
    if (a.rsrc && r >= a.rdense) {
        int s = a.rsrc[r - a.rdense];
        sp = 1;
        wt = a.rw[s];
        return (size_t)(s / a.rK);
    }
    sp = 0;
    wt = 1.0f;
    return (size_t)r;
}

/* ---- kernel A, GDN ---- */
template <int DKP>
__global__ void __launch_bounds__(128) k_gdn_chunk_a(ChunkArgs a, int dvp) {
    extern __shared__ __align__(16) unsigned char smem[];
    const int LDK = DKP + 8, LDV = dvp + 8;
    __nv_bfloat16 *Kb = (__nv_bfloat16 *)smem;         /* [64][LDK] */
    __nv_bfloat16 *Qb = Kb + CH * LDK;                 /* [64][LDK], later beta e^b K */
    __nv_bfloat16 *Vb = Qb + CH * LDK;                 /* [64][LDV] beta V */
    __nv_bfloat16 *Tb = Vb + CH * LDV;                 /* [64][72] */
    float *Af = (float *)(Tb + CH * 72);               /* [64][65] */
    float *Xf = Af + CH * 65;                          /* [64][65] */
    float *bc = Xf + CH * 65;                          /* [64] */
    float *be = bc + CH;                               /* [64] */
    float *Pf = be + CH;                               /* [16][49] block products */
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, tq = lane & 3;
    const int c = blockIdx.x, h = blockIdx.y, H = a.H, dk = a.dk, dv = a.dv;
    const int tok0 = a.ck_tok0[c], len = a.ck_len[c];
    const size_t ch = (size_t)c * H + h;

    if (a.vec4) { /* 16-byte loads, several in flight per thread */
#pragma unroll 4
        for (int x = tid; x < CH * DKP / 4; x += 128) {
            int t = x / (DKP / 4), i = (x % (DKP / 4)) * 4;
            float4 kv = make_float4(0.f, 0.f, 0.f, 0.f), qv = kv;
            if (t < len && i < dk) {
                size_t off = ((size_t)(tok0 + t) * H + h) * dk + i;
                kv = __ldg((const float4 *)(a.k + off));
                qv = __ldg((const float4 *)(a.q + off));
            }
            *(uint2 *)(Kb + t * LDK + i) = make_uint2(pack_bf16x2(kv.x, kv.y), pack_bf16x2(kv.z, kv.w));
            *(uint2 *)(Qb + t * LDK + i) = make_uint2(pack_bf16x2(qv.x, qv.y), pack_bf16x2(qv.z, qv.w));
        }
    } else {
        for (int x = tid; x < CH * DKP; x += 128) {
            int t = x / DKP, i = x % DKP;
            float kv = 0.0f, qv = 0.0f;
            if (t < len && i < dk) {
                size_t off = ((size_t)(tok0 + t) * H + h) * dk + i;
                kv = a.k[off];
                qv = a.q[off];
            }
            Kb[t * LDK + i] = __float2bfloat16_rn(kv);
            Qb[t * LDK + i] = __float2bfloat16_rn(qv);
        }
    }
    if (tid < CH) {
        bool ok = tid < len;
        bc[tid] = ok ? a.ga[(size_t)(tok0 + tid) * H + h] : 0.0f;
        be[tid] = ok ? a.gb[(size_t)(tok0 + tid) * H + h] : 0.0f;
    }
    __syncthreads();
    if (tid == 0)
        for (int t = 1; t < CH; t++) bc[t] += bc[t - 1];
    __syncthreads();
    if (a.vec4 && dv % 4 == 0) {
#pragma unroll 4
        for (int x = tid; x < CH * dvp / 4; x += 128) {
            int t = x / (dvp / 4), j = (x % (dvp / 4)) * 4;
            float4 vv = make_float4(0.f, 0.f, 0.f, 0.f);
            if (t < len && j < dv) vv = __ldg((const float4 *)(a.v + ((size_t)(tok0 + t) * H + h) * dv + j));
            float f = be[t];
            *(uint2 *)(Vb + t * LDV + j) = make_uint2(pack_bf16x2(vv.x * f, vv.y * f), pack_bf16x2(vv.z * f, vv.w * f));
        }
    } else {
        for (int x = tid; x < CH * dvp; x += 128) {
            int t = x / dvp, j = x % dvp;
            float vv = (t < len && j < dv) ? a.v[((size_t)(tok0 + t) * H + h) * dv + j] * be[t] : 0.0f;
            Vb[t * LDV + j] = __float2bfloat16_rn(vv);
        }
    }
    /* K K^T and Q K^T for rows 16w..16w+15 */
    {
        float kk[8][4], qk[8][4];
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) kk[n][e] = qk[n][e] = 0.0f;
#pragma unroll
        for (int kc = 0; kc < DKP / 16; kc++) {
            uint32_t ak[4], aq[4];
            ld_frag_a(ak, Kb + (16 * w) * LDK + kc * 16, LDK);
            ld_frag_a(aq, Qb + (16 * w) * LDK + kc * 16, LDK);
#pragma unroll
            for (int n = 0; n < 8; n++) {
                uint32_t bf[2];
                ld_frag_b_nk(bf, Kb + (n * 8) * LDK + kc * 16, LDK);
                mma_bf16_16816(kk[n], ak, bf);
                mma_bf16_16816(qk[n], aq, bf);
            }
        }
        __nv_bfloat16 *aqk = a.aqk + ch * CH * CH;
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int r = 16 * w + g + (e >> 1) * 8, s = n * 8 + 2 * tq + (e & 1);
                float gam = (s <= r) ? expf(bc[r] - bc[s]) : 0.0f;
                Af[r * 65 + s] = (s < r) ? be[r] * gam * kk[n][e] : 0.0f;
                aqk[r * CH + s] = __float2bfloat16_rn(a.scale * gam * qk[n][e]);
            }
    }
    __syncthreads();
    /* T = (I + A)^-1, blocked: the four 16x16 diagonal blocks by forward substitution (warp w
     * inverts block w, column s by lanes 2s' and 2s'+1), then the blocks below the diagonal
     * one block row at a time: T_ij = -T_ii sum_{k=j}^{i-1} A_ik T_kj. */
    for (int x = tid; x < CH * 65; x += 128) Xf[x] = 0.0f;
    __syncthreads();
    {
        const int sl = lane >> 1, half = lane & 1, s = 16 * w + sl;
        if (half == 0) Xf[s * 65 + s] = 1.0f;
        __syncwarp();
        for (int tl = 1; tl < 16; tl++) {
            int t = 16 * w + tl;
            float part = 0.0f;
            if (t > s)
                for (int r = s + half; r < t; r += 2) part += Af[t * 65 + r] * Xf[r * 65 + s];
            float tot = part + __shfl_xor_sync(0xffffffffu, part, 1);
            if (t > s && half == 0) Xf[t * 65 + s] = -tot;
            __syncwarp();
        }
    }
    __syncthreads();
    for (int i = 1; i < 4; i++) {
        for (int x = tid; x < i * 256; x += 128) {
            int j = x >> 8, ra = (x >> 4) & 15, cb = x & 15;
            float acc = 0.0f;
            for (int col = 16 * j; col < 16 * i; col++) acc += Af[(16 * i + ra) * 65 + col] * Xf[col * 65 + 16 * j + cb];
            Pf[ra * 49 + 16 * j + cb] = acc;
        }
        __syncthreads();
        for (int x = tid; x < i * 256; x += 128) {
            int j = x >> 8, ra = (x >> 4) & 15, cb = x & 15;
            float acc = 0.0f;
#pragma unroll
            for (int r = 0; r < 16; r++) acc += Xf[(16 * i + ra) * 65 + 16 * i + r] * Pf[r * 49 + 16 * j + cb];
            Xf[(16 * i + ra) * 65 + 16 * j + cb] = -acc;
        }
        __syncthreads();
    }
    for (int x = tid; x < CH * CH; x += 128) {
        int r = x / CH, s = x % CH;
        Tb[r * 72 + s] = __float2bfloat16_rn(Xf[r * 65 + s]);
    }
    /* Qb <- diag(beta e^b) K (from fp32 k) */
    if (a.vec4) {
#pragma unroll 4
        for (int x = tid; x < CH * DKP / 4; x += 128) {
            int t = x / (DKP / 4), i = (x % (DKP / 4)) * 4;
            float4 kv = make_float4(0.f, 0.f, 0.f, 0.f);
            if (t < len && i < dk) kv = __ldg((const float4 *)(a.k + ((size_t)(tok0 + t) * H + h) * dk + i));
            float f = be[t] * expf(bc[t]);
            *(uint2 *)(Qb + t * LDK + i) =
                make_uint2(pack_bf16x2(kv.x * f, kv.y * f), pack_bf16x2(kv.z * f, kv.w * f));
        }
    } else {
        for (int x = tid; x < CH * DKP; x += 128) {
            int t = x / DKP, i = x % DKP;
            float kv = (t < len && i < dk) ? a.k[((size_t)(tok0 + t) * H + h) * dk + i] * be[t] * expf(bc[t]) : 0.0f;
            Qb[t * LDK + i] = __float2bfloat16_rn(kv);
        }
    }
    __syncthreads();
    /* W = T (beta e^b K), U0 = T (beta V); rows 16w.. */
    {
        __nv_bfloat16 *wo = a.wt + ch * CH * DKP;
        for (int n0 = 0; n0 < DKP / 8; n0 += 8) {
            float acc[8][4];
#pragma unroll
            for (int n = 0; n < 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) acc[n][e] = 0.0f;
#pragma unroll
            for (int kc = 0; kc < CH / 16; kc++) {
                uint32_t at[4];
                ld_frag_a(at, Tb + (16 * w) * 72 + kc * 16, 72);
#pragma unroll
                for (int n = 0; n < 8; n++) {
                    if (n0 + n < DKP / 8) {
                        uint32_t bf[2];
                        ld_frag_b_kn(bf, Qb + (kc * 16) * LDK + (n0 + n) * 8, LDK);
                        mma_bf16_16816(acc[n], at, bf);
                    }
                }
            }
#pragma unroll
            for (int n = 0; n < 8; n++)
                if (n0 + n < DKP / 8)
#pragma unroll
                    for (int e = 0; e < 4; e += 2) {
                        int r = 16 * w + g + (e >> 1) * 8, col = (n0 + n) * 8 + 2 * tq;
                        *(uint32_t *)(wo + r * DKP + col) = pack_bf16x2(acc[n][e], acc[n][e + 1]);
                    }
        }
        float *uo = a.u0 + ch * CH * dv;
        for (int n0 = 0; n0 < dvp / 8; n0 += 8) {
            float acc[8][4];
#pragma unroll
            for (int n = 0; n < 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) acc[n][e] = 0.0f;
#pragma unroll
            for (int kc = 0; kc < CH / 16; kc++) {
                uint32_t at[4];
                ld_frag_a(at, Tb + (16 * w) * 72 + kc * 16, 72);
#pragma unroll
                for (int n = 0; n < 8; n++) {
                    if (n0 + n < dvp / 8) {
                        uint32_t bf[2];
                        ld_frag_b_kn(bf, Vb + (kc * 16) * LDV + (n0 + n) * 8, LDV);
                        mma_bf16_16816(acc[n], at, bf);
                    }
                }
            }
#pragma unroll
            for (int n = 0; n < 8; n++)
                if (n0 + n < dvp / 8)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int r = 16 * w + g + (e >> 1) * 8, col = (n0 + n) * 8 + 2 * tq + (e & 1);
                        if (col < dv) uo[(size_t)r * dv + col] = acc[n][e];
                    }
        }
    }
    /* q~ = scale e^b q, k~^T = (e^(bC - b) k)^T, decay */
    {
        const float bC = bc[CH - 1];
        __nv_bfloat16 *qo = a.qt + ch * CH * DKP, *ko = a.ktT + ch * DKP * CH;
        if (a.vec4) {
#pragma unroll 4
            for (int x = tid; x < CH * DKP / 4; x += 128) {
                int t = x / (DKP / 4), i = (x % (DKP / 4)) * 4;
                float4 qv = make_float4(0.f, 0.f, 0.f, 0.f);
                if (t < len && i < dk) qv = __ldg((const float4 *)(a.q + ((size_t)(tok0 + t) * H + h) * dk + i));
                float f = a.scale * expf(bc[t]);
                *(uint2 *)(qo + (size_t)x * 4) =
                    make_uint2(pack_bf16x2(qv.x * f, qv.y * f), pack_bf16x2(qv.z * f, qv.w * f));
            }
        } else {
            for (int x = tid; x < CH * DKP; x += 128) {
                int t = x / DKP, i = x % DKP;
                float qv =
                    (t < len && i < dk) ? a.q[((size_t)(tok0 + t) * H + h) * dk + i] * a.scale * expf(bc[t]) : 0.0f;
                qo[x] = __float2bfloat16_rn(qv);
            }
        }
        /* k~^T through shared memory (the Af/Xf area, free now): row reads of Kb, 16-byte
         * coalesced writes to global */
        __syncthreads();
        __nv_bfloat16 *kst = (__nv_bfloat16 *)Af; /* [DKP][64]: 2*64*65*4 bytes >= DKP*64*2 */
        for (int x = tid; x < CH * DKP; x += 128) {
            int t = x / DKP, i = x % DKP;
            kst[i * CH + t] = __float2bfloat16_rn(__bfloat162float(Kb[t * LDK + i]) * expf(bC - bc[t]));
        }
        __syncthreads();
        for (int x = tid; x < CH * DKP / 8; x += 128) ((uint4 *)ko)[x] = ((const uint4 *)kst)[x];
        if (tid == 0) a.dec[ch * DKP] = expf(bC);
    }
}

/* ---- kernel A, GLA ---- */
#define GLA_SPAN_MAX 60.0f /* larger log-decay span inside a 16-token block: exact exp path */

template <int DKP>
__global__ void __launch_bounds__(128) k_gla_chunk_a(ChunkArgs a) {
    extern __shared__ __align__(16) unsigned char smem[];
    const int LDK = DKP + 8;
    float *Bc = (float *)smem;                              /* [64][DKP] cumulative log decay */
    __nv_bfloat16 *Qr = (__nv_bfloat16 *)(Bc + CH * DKP);   /* [4 warps][16][LDK] */
    __nv_bfloat16 *Kr = Qr + 4 * 16 * LDK;                  /* [4 warps][16][LDK] */
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, tq = lane & 3;
    const int c = blockIdx.x, h = blockIdx.y, H = a.H, dk = a.dk;
    const int tok0 = a.ck_tok0[c], len = a.ck_len[c];
    const size_t ch = (size_t)c * H + h;
#define QX(t, i) (((t) < len && (i) < dk) ? a.q[((size_t)(tok0 + (t)) * H + h) * dk + (i)] : 0.0f)
#define KX(t, i) (((t) < len && (i) < dk) ? a.k[((size_t)(tok0 + (t)) * H + h) * dk + (i)] : 0.0f)

    for (int i = tid; i < DKP; i += 128) {
        float run = 0.0f;
        for (int t = 0; t < CH; t++) {
            run += (t < len && i < dk) ? a.ga[((size_t)(tok0 + t) * H + h) * dk + i] : 0.0f;
            Bc[t * DKP + i] = run;
        }
    }
    __syncthreads();
    {
        __nv_bfloat16 *qo = a.qt + ch * CH * DKP, *ko = a.ktT + ch * DKP * CH;
        if (a.vec4) {
#pragma unroll 4
            for (int x = tid; x < CH * DKP / 4; x += 128) {
                int t = x / (DKP / 4), i = (x % (DKP / 4)) * 4;
                float4 qv = make_float4(0.f, 0.f, 0.f, 0.f);
                if (t < len && i < dk) qv = __ldg((const float4 *)(a.q + ((size_t)(tok0 + t) * H + h) * dk + i));
                const float *bt = Bc + t * DKP + i;
                *(uint2 *)(qo + (size_t)x * 4) =
                    make_uint2(pack_bf16x2(qv.x * a.scale * expf(bt[0]), qv.y * a.scale * expf(bt[1])),
                               pack_bf16x2(qv.z * a.scale * expf(bt[2]), qv.w * a.scale * expf(bt[3])));
            }
        } else {
            for (int x = tid; x < CH * DKP; x += 128) {
                int t = x / DKP, i = x % DKP;
                qo[x] = __float2bfloat16_rn(QX(t, i) * a.scale * expf(Bc[t * DKP + i]));
            }
        }
        /* k~^T staged in the Qr/Kr area (not used yet): coalesced reads of k, 16-byte writes */
        __nv_bfloat16 *kst = Qr; /* [DKP][64]: 2*4*16*(DKP+8) >= DKP*64 elements */
        for (int x = tid; x < CH * DKP; x += 128) {
            int t = x / DKP, i = x % DKP;
            kst[i * CH + t] = __float2bfloat16_rn(KX(t, i) * expf(Bc[(CH - 1) * DKP + i] - Bc[t * DKP + i]));
        }
        __syncthreads();
        for (int x = tid; x < CH * DKP / 8; x += 128) ((uint4 *)ko)[x] = ((const uint4 *)kst)[x];
        for (int i = tid; i < DKP; i += 128) a.dec[ch * DKP + i] = expf(Bc[(CH - 1) * DKP + i]);
        __syncthreads();
    }
    /* Aqk, t-block R = w (rows 16w..16w+15), reference row 16w */
    __nv_bfloat16 *aqk = a.aqk + ch * CH * CH;
    __nv_bfloat16 *qr = Qr + w * 16 * LDK, *kr = Kr + w * 16 * LDK;
    const int ref = 16 * w;
    for (int x = lane; x < 16 * DKP; x += 32) {
        int r = x / DKP, i = x % DKP, t = ref + r;
        qr[r * LDK + i] = __float2bfloat16_rn(QX(t, i) * expf(Bc[t * DKP + i] - Bc[ref * DKP + i]));
    }
    for (int rb = 0; rb < 4; rb++) {
        if (rb > w) { /* above the diagonal: zero */
            for (int x = lane; x < 256; x += 32) aqk[(ref + x / 16) * CH + rb * 16 + x % 16] = __float2bfloat16_rn(0.0f);
            continue;
        }
        bool diag = rb == w;
        bool exact = false;
        if (diag) {
            float span = 0.0f;
            for (int i = lane; i < DKP; i += 32) span = fmaxf(span, Bc[ref * DKP + i] - Bc[(ref + 15) * DKP + i]);
#pragma unroll
            for (int o = 16; o; o >>= 1) span = fmaxf(span, __shfl_xor_sync(0xffffffffu, span, o));
            exact = span > GLA_SPAN_MAX;
        }
        if (exact) {
            for (int x = lane; x < 256; x += 32) {
                int r = x / 16, cc = x % 16, t = ref + r, s = ref + cc;
                float sum = 0.0f;
                if (cc <= r)
                    for (int i = 0; i < dk; i++)
                        sum = fmaf(QX(t, i) * KX(s, i), expf(Bc[t * DKP + i] - Bc[s * DKP + i]), sum);
                aqk[t * CH + s] = __float2bfloat16_rn(a.scale * sum);
            }
            continue;
        }
        __syncwarp();
        for (int x = lane; x < 16 * DKP; x += 32) {
            int r = x / DKP, i = x % DKP, s = rb * 16 + r;
            kr[r * LDK + i] = __float2bfloat16_rn(KX(s, i) * expf(Bc[ref * DKP + i] - Bc[s * DKP + i]));
        }
        __syncwarp();
        float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
        for (int kc = 0; kc < DKP / 16; kc++) {
            uint32_t af[4];
            ld_frag_a(af, qr + kc * 16, LDK);
#pragma unroll
            for (int n = 0; n < 2; n++) {
                uint32_t bf[2];
                ld_frag_b_nk(bf, kr + (n * 8) * LDK + kc * 16, LDK);
                mma_bf16_16816(acc[n], af, bf);
            }
        }
#pragma unroll
        for (int n = 0; n < 2; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int r = g + (e >> 1) * 8, cc = n * 8 + 2 * tq + (e & 1);
                float v = (!diag || cc <= r) ? a.scale * acc[n][e] : 0.0f;
                aqk[(ref + r) * CH + rb * 16 + cc] = __float2bfloat16_rn(v);
            }
    }
#undef QX
#undef KX
}

/* ---- kernel B: the state pass ----
 * ST = 2: the next chunk's tiles (q~, W, k~^T, Aqk, decay) arrive by cp.async while this chunk
 * computes; ST = 1 when two stages do not fit in shared memory (dk = 256 with GDN). */
template <int DKP, int GDN, int ST>
__global__ void __launch_bounds__(128) k_chunk_b(ChunkArgs a) {
    extern __shared__ __align__(16) unsigned char smem[];
    const int LDK = DKP + 8;
    constexpr int MT = DKP / 16, MTW = (MT + 3) / 4;
    constexpr int STAGE = CH * (DKP + 8) * (GDN ? 2 : 1) + DKP * 72 + CH * 72 + DKP * 2; /* bf16 elements */
    __nv_bfloat16 *SbT = (__nv_bfloat16 *)smem + ST * STAGE; /* [32][LDK] */
    __nv_bfloat16 *UT = SbT + 32 * LDK;                       /* [32][72] */
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, tq = lane & 3;
    const int j0 = blockIdx.x * 32, h = blockIdx.y, z = blockIdx.z, H = a.H, dk = a.dk, dv = a.dv;
    float *S = a.S[z] + (size_t)h * dk * dv;

    float sacc[MTW][4][4];
#pragma unroll
    for (int mi = 0; mi < MTW; mi++) {
        int mt = w + 4 * mi;
#pragma unroll
        for (int n = 0; n < 4; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int i = mt * 16 + g + (e >> 1) * 8, j = j0 + n * 8 + 2 * tq + (e & 1);
                sacc[mi][n][e] = (mt < MT && i < dk && j < dv) ? S[(size_t)i * dv + j] : 0.0f;
            }
    }
    const int c0 = a.seq_c0[z], nc = a.seq_nc[z];
    auto tiles = [&](int buf, __nv_bfloat16 *&Qt, __nv_bfloat16 *&Wt, __nv_bfloat16 *&KtT, __nv_bfloat16 *&Aq,
                     float *&decs) {
        Qt = (__nv_bfloat16 *)smem + buf * STAGE;
        Wt = Qt + CH * LDK;
        KtT = Wt + (GDN ? CH * LDK : 0);
        Aq = KtT + DKP * 72;
        decs = (float *)(Aq + CH * 72);
    };
    auto stage = [&](int buf, int c) {
        __nv_bfloat16 *Qt, *Wt, *KtT, *Aq;
        float *decs;
        tiles(buf, Qt, Wt, KtT, Aq, decs);
        const size_t ch = (size_t)c * H + h;
        const __nv_bfloat16 *src = a.qt + ch * CH * DKP;
        for (int x = tid; x < CH * DKP / 8; x += 128) {
            int r = x / (DKP / 8), q = x % (DKP / 8);
            cp_async16(Qt + r * LDK + q * 8, src + (size_t)x * 8, 16);
        }
        if (GDN) {
            src = a.wt + ch * CH * DKP;
            for (int x = tid; x < CH * DKP / 8; x += 128) {
                int r = x / (DKP / 8), q = x % (DKP / 8);
                cp_async16(Wt + r * LDK + q * 8, src + (size_t)x * 8, 16);
            }
        }
        src = a.ktT + ch * DKP * CH;
        for (int x = tid; x < DKP * CH / 8; x += 128) cp_async16(KtT + (x / 8) * 72 + (x % 8) * 8, src + (size_t)x * 8, 16);
        src = a.aqk + ch * CH * CH;
        for (int x = tid; x < CH * CH / 8; x += 128) cp_async16(Aq + (x / 8) * 72 + (x % 8) * 8, src + (size_t)x * 8, 16);
        const float *dsrc = a.dec + ch * DKP;
        for (int x = tid; x < DKP / 4; x += 128) cp_async16(decs + x * 4, dsrc + x * 4, 16);
        cp_async_commit();
    };
    if (ST == 2 && nc > 0) stage(0, c0);
    for (int cc = 0; cc < nc; cc++) {
        const int c = c0 + cc, buf = ST == 2 ? (cc & 1) : 0;
        const size_t ch = (size_t)c * H + h;
        const int tok0 = a.ck_tok0[c], len = a.ck_len[c];
        if (ST == 2) {
            if (cc + 1 < nc) {
                stage((cc + 1) & 1, c + 1);
                cp_async_wait<1>();
            } else {
                cp_async_wait<0>();
            }
        } else {
            stage(0, c);
            cp_async_wait<0>();
        }
        __nv_bfloat16 *Qt, *Wt, *KtT, *Aq;
        float *decs;
        tiles(buf, Qt, Wt, KtT, Aq, decs);
        /* this warp's U source (U0 of GDN, or V of GLA): loads issued before the products */
        float usrc[4][4];
#pragma unroll
        for (int n = 0; n < 4; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int t = 16 * w + g + (e >> 1) * 8, j = j0 + n * 8 + 2 * tq + (e & 1);
                float u = 0.0f;
                if (j < dv) {
                    if (GDN)
                        u = a.u0[(ch * CH + t) * dv + j];
                    else if (t < len)
                        u = a.v[((size_t)(tok0 + t) * H + h) * dv + j];
                }
                usrc[n][e] = u;
            }
        /* S (bf16, transposed) as the operand of this chunk */
#pragma unroll
        for (int mi = 0; mi < MTW; mi++) {
            int mt = w + 4 * mi;
            if (mt < MT)
#pragma unroll
                for (int n = 0; n < 4; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int i = mt * 16 + g + (e >> 1) * 8, jj = n * 8 + 2 * tq + (e & 1);
                        SbT[jj * LDK + i] = __float2bfloat16_rn(sacc[mi][n][e]);
                    }
        }
        __syncthreads();
        /* U for rows 16w..16w+15 */
        {
            float uacc[4][4];
#pragma unroll
            for (int n = 0; n < 4; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) uacc[n][e] = 0.0f;
            if (GDN) {
#pragma unroll
                for (int kc = 0; kc < DKP / 16; kc++) {
                    uint32_t af[4];
                    ld_frag_a(af, Wt + (16 * w) * LDK + kc * 16, LDK);
#pragma unroll
                    for (int n = 0; n < 4; n++) {
                        uint32_t bf[2];
                        ld_frag_b_nk(bf, SbT + (n * 8) * LDK + kc * 16, LDK);
                        mma_bf16_16816(uacc[n], af, bf);
                    }
                }
            }
#pragma unroll
            for (int n = 0; n < 4; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int t = 16 * w + g + (e >> 1) * 8, jj = n * 8 + 2 * tq + (e & 1);
                    UT[jj * 72 + t] = __float2bfloat16_rn(usrc[n][e] - uacc[n][e]);
                }
        }
        __syncthreads();
        /* O = q~ S + Aqk U */
        {
            float oacc[4][4];
#pragma unroll
            for (int n = 0; n < 4; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) oacc[n][e] = 0.0f;
#pragma unroll
            for (int kc = 0; kc < DKP / 16; kc++) {
                uint32_t af[4];
                ld_frag_a(af, Qt + (16 * w) * LDK + kc * 16, LDK);
#pragma unroll
                for (int n = 0; n < 4; n++) {
                    uint32_t bf[2];
                    ld_frag_b_nk(bf, SbT + (n * 8) * LDK + kc * 16, LDK);
                    mma_bf16_16816(oacc[n], af, bf);
                }
            }
#pragma unroll
            for (int kc = 0; kc < CH / 16; kc++) {
                uint32_t af[4];
                ld_frag_a(af, Aq + (16 * w) * 72 + kc * 16, 72);
#pragma unroll
                for (int n = 0; n < 4; n++) {
                    uint32_t bf[2];
                    ld_frag_b_nk(bf, UT + (n * 8) * 72 + kc * 16, 72);
                    mma_bf16_16816(oacc[n], af, bf);
                }
            }
#pragma unroll
            for (int n = 0; n < 4; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int t = 16 * w + g + (e >> 1) * 8, j = j0 + n * 8 + 2 * tq + (e & 1);
                    if (t < len && j < dv) a.o[((size_t)(tok0 + t) * H + h) * dv + j] = oacc[n][e];
                }
        }
        /* S = e^(bC) S + k~^T U */
#pragma unroll
        for (int mi = 0; mi < MTW; mi++) {
            int mt = w + 4 * mi;
            if (mt < MT) {
                float d0 = GDN ? decs[0] : decs[mt * 16 + g], d1 = GDN ? decs[0] : decs[mt * 16 + g + 8];
#pragma unroll
                for (int n = 0; n < 4; n++) {
                    sacc[mi][n][0] *= d0;
                    sacc[mi][n][1] *= d0;
                    sacc[mi][n][2] *= d1;
                    sacc[mi][n][3] *= d1;
                }
#pragma unroll
                for (int kc = 0; kc < CH / 16; kc++) {
                    uint32_t af[4];
                    ld_frag_a(af, KtT + (mt * 16) * 72 + kc * 16, 72);
#pragma unroll
                    for (int n = 0; n < 4; n++) {
                        uint32_t bf[2];
                        ld_frag_b_nk(bf, UT + (n * 8) * 72 + kc * 16, 72);
                        mma_bf16_16816(sacc[mi][n], af, bf);
                    }
                }
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int mi = 0; mi < MTW; mi++) {
        int mt = w + 4 * mi;
#pragma unroll
        for (int n = 0; n < 4; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int i = mt * 16 + g + (e >> 1) * 8, j = j0 + n * 8 + 2 * tq + (e & 1);
                if (mt < MT && i < dk && j < dv) S[(size_t)i * dv + j] = sacc[mi][n][e];
            }
    }
}

/* ---- fused GDN prefill: kernels A and B in one ----
 * One block of 16 warps per (sequence, head, 128 value columns) walks the sequence's chunks in
 * order with the state in fp32 mma accumulators, as kernel B does, and computes each chunk's
 * kernel-A quantities itself in shared memory: nothing but q, k, v, g, beta is read from
 * global memory and nothing but o (and the state at the end) is written. Per chunk:
 *   stage  the chunk's fp32 rows arrive by cp.async into a staging area (issued while the
 *          previous chunk was still computing: right after its staging was consumed);
 *   (b)    warp 0: cumulative log decay bc by a warp scan, per-row factors;
 *   (c)    K, Q -> bf16;  (d) K K^T, Q K^T on tensor cores -> A = tril(diag(beta) K K^T G, -1)
 *          in fp32 and Aqk = scale tril(Q K^T G) in bf16 (G = e^(bc_t - bc_s) for s <= t);
 *   (e)    warps 0-3 invert the diagonal 16x16 blocks of I + A (a lane per column, the column
 *          in registers) while warps 4-15 form beta e^b K, beta V, q~ = scale e^b q and
 *          k~^T = (e^(bC - b) k)^T from the fp32 staging; then the next chunk is staged;
 *   (f)    T below the diagonal blocks, block row by block row: T_ij = -T_ii sum_k A_ik T_kj;
 *   (h)    W = T (beta e^b K) for all key columns (shared), U0 = T (beta V) for each warp
 *          group's 32 value columns (kept in registers);
 *   (i)    each group of 4 warps (32 value columns): U = U0 - W S, O = q~ S + Aqk U,
 *          S = e^(bC) S + k~^T U.
 * The products are those of kernels A and B (bf16 operands, fp32 accumulation, T and A in
 * fp32), so the results agree with them up to rounding. Sequences with SSE row maps read their
 * rows through chunk_row. Shared memory for dk = 128: 99 KB staging + 127 KB tiles, one block
 * per SM.
 * FS = 1 (HYLA_CUDA_GDN_FS=1, every form): (d) writes A's diagonal blocks in fp32 and bf16(-A)
 * below them (into T's place), (e) inverts only the diagonal blocks, and (f) + (h) become one
 * phase (f'): each warp solves (I + A) X = B for its own 16 columns of B = [beta e^b K | beta V]
 * by blocked forward substitution on tensor cores (W to its place in R2, U0 to an fp32 tile over
 * R1, read at the start of (i)). */
#define FU_T 512

/* -DHYLA_FUSED_PROFILE (diagnostic builds only): block (0,0,0) records clock64() at the phase
 * boundaries of its chunk 20 and the first such launch prints them. */
#ifdef HYLA_FUSED_PROFILE
__device__ long long g_fprof_t[20];
__device__ int g_fprof_once;
#define FPROF(k)                                                                                                       \
    if (!MODE && cc == 20 && tid == 0 && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0) g_fprof_t[k] = clock64();
#else
#define FPROF(k)
#endif

template <int DKP, int WS = 0, int FS = 0>
struct FusedSmem {
    static constexpr int LDK = DKP + 8, LDV = 136;
    /* FS: the U0 tile [64][U0LD] fp32 (U0 = T beta V for the block's 128 value columns; the row
     * stride 132 makes the transposed writes of phase (f') conflict-free) over R1 */
    static constexpr int U0LD = 132;
    static constexpr size_t U0SZ = FS ? (size_t)CH * U0LD * 4 : 0;
    /* staging: Kst, Qst [64][DKP], Vst [64][128], Gst, Bst, Wr [64] fp32 */
    static constexpr size_t STG = ((size_t)2 * CH * DKP + (size_t)CH * 128 + 3 * CH) * 4;
    /* R1: Kb [64][LDK] (-> beta e^b K) and Vb [64][LDV]; in the state pass SbT [4][32][LDK];
     * FS: between them the U0 tile (R1 unchanged at DKP = 128, larger below) */
    static constexpr size_t R1a = (size_t)CH * LDK * 2 + (size_t)CH * LDV * 2, R1b = (size_t)4 * 32 * LDK * 2;
    static constexpr size_t R1c = R1a > R1b ? R1a : R1b;
    static constexpr size_t R1 = R1c > U0SZ ? R1c : U0SZ;
    static constexpr size_t QB = (size_t)CH * LDK * 2; /* Qb: q, then q~ */
    static constexpr size_t KT = (size_t)DKP * 72 * 2; /* k~^T [DKP][72] */
    static constexpr size_t AQ = (size_t)CH * 72 * 2;  /* Aqk [64][72], and T [64][72] */
    /* R2: Af, Xf [64][65], Ah [6][16][17] fp32; once T is done W [64][LDK] and UT [4][32][72]
     * (WS: UT at the end of R2, so that T, W and the rest of R2 are one free span in the O phase).
     * FS: only Af's diagonal 16x16 blocks (at their places in [64][65]), no Xf, no Ah */
    static constexpr size_t R2a = FS ? (size_t)CH * 65 * 4 : (size_t)2 * CH * 65 * 4 + (size_t)6 * 16 * 17 * 4,
                            R2b = (size_t)CH * LDK * 2 + (size_t)4 * 32 * 72 * 2;
    static constexpr size_t R2 = R2a > R2b ? R2a : R2b;
    static constexpr size_t UTSZ = (size_t)4 * 32 * 72 * 2, UTOFF = WS ? R2 - UTSZ : (size_t)CH * LDK * 2;
    /* WS: the O tile [64][128] fp32 of the chunk spans OPAD (a pad before T), T and R2 up to UT */
    static constexpr size_t OB = (size_t)CH * 128 * 4;
    static constexpr size_t OPAD = WS && OB > AQ + UTOFF ? OB - AQ - UTOFF : 0;
    static constexpr size_t SM = (size_t)6 * CH * 4; /* bc be fq fm fk dec */
    static constexpr size_t TOTAL = STG + R1 + QB + KT + 2 * AQ + OPAD + R2 + SM;
    static_assert(UTOFF >= (size_t)CH * LDK * 2, "UT overlaps W");
    static_assert(!WS || OPAD + AQ + UTOFF >= OB, "O tile overlaps UT");
    static_assert((STG + R1 + QB + KT + AQ) % 16 == 0 && OPAD % 16 == 0 && UTOFF % 16 == 0, "alignment");
    static_assert(U0SZ <= R1 && STG % 16 == 0, "U0 tile");
};

/* Named barriers (bar.sync / bar.arrive id, count) of the warp-specialised form. */
__device__ __forceinline__ void nb_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void nb_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
/* barrier among the block's compute warps: all threads, or (WS) warps 0-15 only */
template <int WS>
__device__ __forceinline__ void fu_sync() {
    if (WS)
        nb_sync(1, FU_T);
    else
        __syncthreads();
}
#define FU_FULL 2  /* producer -> compute: the chunk's staging landed and the previous O tile is stored
                    * (WS = 2: read out into the producer's registers) */
#define FU_EMPTY 3 /* compute -> producer: the staging area is consumed */
#define FU_OREADY 4 /* compute -> producer: the chunk's O tile is in shared memory */
/* producer warps of the WS form: WS = 1 one warp, WS = 2 a warpgroup of 4 (one per SM sub-partition);
 * threads of the block: the 16 compute warps and these */
#define FU_PW(ws) ((ws) >= 2 ? 4 : (ws) ? 1 : 0)
#define FU_WTN(ws) (FU_T + 32 * FU_PW(ws))

#ifdef HYLA_FUSED_PROFILE
#define FPROFP(k)                                                                                                      \
    if (cc == 20 && threadIdx.x == FU_T && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0) g_fprof_t[k] = clock64();
#else
#define FPROFP(k)
#endif

/* The producer warps of the WS form (warps 16.. : one warp for WS = 1, four for WS = 2, warp pw
 * owning the chunk rows [pw RW, (pw + 1) RW), RW = 64 / NPW): they issue chunk c+1's staging
 * (cp.async 16-byte pieces: a row of q or k per DKP/4 lanes, a row of v per instruction; the row
 * sources of the warp's rows computed once per chunk, one or two rows per lane, and broadcast by
 * shuffles) as soon as the compute warps release the staging area, then store chunk c's O tile
 * (one 512-byte row per st.global.v4), wait for their copies and open the next chunk (FULL).
 * WS = 2 reads its 16 rows of the O tile into registers, waits for its copies and opens the next
 * chunk before it issues the o stores, so the compute warps never wait for their issue. The values are those of the
 * default staging and of the default o stores. Needs vec (dk % 4 == 0, dv % 4 == 0, 16-byte
 * aligned q, k, v) and o 16-byte aligned. */
/* QK = 0 (WS = 3): the producers stage q and k of the first chunk only; the compute warps stage
 * them for the later chunks (right after EMPTY), the producers v, g, beta and the row weights. */
template <int DKP, int NPW, int QK = 1>
__device__ __forceinline__ void fu_producer(const ChunkArgs &a, float *Kst, float *Qst, float *Vst, float *Gst,
                                            float *Bst, float *Wr, const float *Ob, int c0, int nc, int h, int jb,
                                            int pw, int lane) {
    constexpr int WT = FU_T + 32 * NPW, RW = CH / NPW, NS = (RW + 31) / 32; /* rows per warp, row slots per lane */
    constexpr int PR = DKP / 4, RPI = 32 / PR; /* 16-byte pieces per q/k row, rows per instruction */
    static_assert(NS <= 2 && RW % RPI == 0 && (RW % 32 == 0 || 32 % RW == 0), "producer row split");
    const int H = a.H, dk = a.dk, dv = a.dv, r0 = pw * RW;
    auto stage = [&](int c) {
        const int tok0 = a.ck_tok0[c], len = a.ck_len[c];
        long long rtok[NS];
        int rfl[NS]; /* rows r0 + lane (+ 32): source token, flags (1: in the chunk, 2: sparse) */
#pragma unroll
        for (int hf = 0; hf < NS; hf++) {
            const int u = lane + 32 * hf, t = r0 + u;
            int sp = 0;
            float wt = 0.0f;
            const bool ok = u < RW && t < len;
            size_t tok = ok ? chunk_row(a, tok0 + t, sp, wt) : 0;
            rtok[hf] = (long long)tok;
            rfl[hf] = (ok ? 1 : 0) | (sp ? 2 : 0);
            if (u < RW) {
                cp_async4(Gst + t, ok ? (sp ? a.g2 : a.ga) + tok * H + h : a.ga, ok ? 4 : 0);
                cp_async4(Bst + t, ok ? (sp ? a.b2 : a.gb) + tok * H + h : a.gb, ok ? 4 : 0);
                Wr[t] = ok ? wt : 0.0f;
            }
        }
#pragma unroll 4
        for (int u0 = 0; u0 < ((QK || c == c0) ? RW : 0); u0 += RPI) {
            const int u = u0 + lane / PR, t = r0 + u, i = (lane % PR) * 4;
            const long long tk = __shfl_sync(0xffffffffu, NS > 1 && u0 >= 32 ? rtok[NS - 1] : rtok[0], u & 31);
            const int fl = __shfl_sync(0xffffffffu, NS > 1 && u0 >= 32 ? rfl[NS - 1] : rfl[0], u & 31);
            const bool ok = (fl & 1) && i < dk;
            const size_t off = ((size_t)tk * H + h) * dk + i;
            cp_async16(Qst + t * DKP + i, ok ? ((fl & 2) ? a.q2 : a.q) + off : a.q, ok ? 16 : 0);
            cp_async16(Kst + t * DKP + i, ok ? ((fl & 2) ? a.k2 : a.k) + off : a.k, ok ? 16 : 0);
        }
        const bool okv = jb + 4 * lane < dv;
#pragma unroll 4
        for (int u = 0; u < RW; u++) {
            const long long tk = __shfl_sync(0xffffffffu, NS > 1 && u >= 32 ? rtok[NS - 1] : rtok[0], u & 31);
            const int fl = __shfl_sync(0xffffffffu, NS > 1 && u >= 32 ? rfl[NS - 1] : rfl[0], u & 31);
            const bool ok = (fl & 1) && okv;
            cp_async16(Vst + (r0 + u) * 128 + 4 * lane, ok ? a.v + ((size_t)tk * H + h) * dv + jb + 4 * lane : a.v,
                       ok ? 16 : 0);
        }
        cp_async_commit();
    };
    stage(c0);
    cp_async_wait<0>();
    nb_arrive(FU_FULL, WT);
    const bool okc = jb + 4 * lane < dv;
    for (int cc = 0; cc < nc; cc++) {
        const int c = c0 + cc;
        if (cc + 1 < nc) {
            nb_sync(FU_EMPTY, WT);
            FPROFP(12);
            stage(c + 1);
            FPROFP(13);
        }
        const int tok0 = a.ck_tok0[c], len = a.ck_len[c];
        float *orow = a.o + ((size_t)tok0 * H + h) * dv + jb + 4 * lane;
        nb_sync(FU_OREADY, WT);
        FPROFP(14);
        /* the O tile: row t's 16-byte piece p at p ^ 2(t mod 4) */
        if constexpr (NPW > 1) { /* the warp's rows to registers, the next chunk opened, then the stores */
            float4 ov[RW];
#pragma unroll
            for (int u = 0; u < RW; u++) {
                const int t = r0 + u;
                ov[u] = *(const float4 *)(Ob + t * 128 + ((lane ^ ((t & 3) << 1)) << 2));
            }
            FPROFP(15);
            if (cc + 1 < nc) {
                cp_async_wait<0>();
                FPROFP(17);
                nb_arrive(FU_FULL, WT);
            }
#pragma unroll
            for (int u = 0; u < RW; u++)
                if (r0 + u < len && okc) *(float4 *)(orow + (size_t)(r0 + u) * H * dv) = ov[u];
            FPROFP(16);
        } else {
#pragma unroll 1
            for (int t0 = 0; t0 < CH; t0 += 8) {
                float4 ov[8];
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    const int t = t0 + u;
                    ov[u] = *(const float4 *)(Ob + t * 128 + ((lane ^ ((t & 3) << 1)) << 2));
                }
#pragma unroll
                for (int u = 0; u < 8; u++)
                    if (t0 + u < len && okc) *(float4 *)(orow + (size_t)(t0 + u) * H * dv) = ov[u];
            }
            FPROFP(15);
            FPROFP(16);
            if (cc + 1 < nc) {
                cp_async_wait<0>();
                FPROFP(17);
                nb_arrive(FU_FULL, WT);
            }
        }
    }
}

/* Phase (b) of the fused GDN kernels, by one warp: the chunk's cumulative log decay b_t (a scan of
 * the staged gates g; rows past the chunk have g = 0, beta = 0) and the per-row factors: bc = b,
 * be = beta, fq = scale e^b, fm = beta e^b, fk = e^(b_C - b), and *dec = e^(b_C). Lane l owns rows
 * 2l, 2l + 1. */
__device__ __forceinline__ void gdn_chunk_decay(const float *Gst, const float *Bst, float scale, int lane, float *bc,
                                                float *be, float *fq, float *fm, float *fk, float *dec) {
    float g0 = Gst[2 * lane], g1 = Gst[2 * lane + 1], v = g0 + g1;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        float y = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += y;
    }
    float ex = __shfl_up_sync(0xffffffffu, v, 1);
    if (lane == 0) ex = 0.0f;
    float b0 = ex + g0, b1 = b0 + g1, bC = __shfl_sync(0xffffffffu, b1, 31);
    int t0 = 2 * lane, t1 = t0 + 1;
    float e0 = expf(b0), e1 = expf(b1), be0 = Bst[t0], be1 = Bst[t1];
    bc[t0] = b0;
    bc[t1] = b1;
    be[t0] = be0;
    be[t1] = be1;
    fq[t0] = scale * e0;
    fq[t1] = scale * e1;
    fm[t0] = be0 * e0;
    fm[t1] = be1 * e1;
    fk[t0] = expf(bC - b0);
    fk[t1] = expf(bC - b1);
    if (lane == 0) *dec = expf(bC);
}

/* Phase (e)'s inverse of one 16x16 diagonal block: column s of T_ii = (I + A_ii)^-1 by forward
 * substitution in fp32 (A_ii strictly lower, row stride lda), into x[0..15]. */
__device__ __forceinline__ void gdn_diag_inverse_col(const float *A, int lda, int s, float (&x)[16]) {
#pragma unroll
    for (int t = 0; t < 16; t++) {
        float acc = 0.0f;
#pragma unroll
        for (int r = 0; r < t; r++) acc = fmaf(A[t * lda + r], x[r], acc);
        x[t] = t < s ? 0.0f : (t == s ? 1.0f : -acc);
    }
}

/* acc (16 x 32: four n8 C fragments) += A (16 rows x K, row-major at A, row stride lda) times
 * B^T, B stored [n][k] (32 rows of K at B, row stride ldb): per 16-wide k step one A fragment and
 * the B fragments of the two 16-column halves. The fused kernels' 16 x 32 products (U = W S,
 * O = q~ S + Aqk U, S += k~^T U) all run this one code, so their sums keep one order. */
template <int K>
__device__ __forceinline__ void mma_16x32(float (&acc)[4][4], const __nv_bfloat16 *A, int lda, const __nv_bfloat16 *B,
                                          int ldb) {
#pragma unroll
    for (int kc = 0; kc < K / 16; kc++) {
        uint32_t af[4];
        ldsm_frag_a(af, A + kc * 16, lda);
#pragma unroll
        for (int hb = 0; hb < 2; hb++) {
            uint32_t bf[2][2];
            ldsm_frag_b2_nk(bf, B + (hb * 16) * ldb + kc * 16, ldb);
            mma_bf16_16816(acc[2 * hb], af, bf[0]);
            mma_bf16_16816(acc[2 * hb + 1], af, bf[1]);
        }
    }
}

/* One block row i of phase (f')'s forward substitution (I + A) X = B for a warp's 16-column slab
 * of B, in transposed form (fragment layouts in k_gdn_fused's (f') comment): from B_i^T (bf16, in
 * xf[i]) and the rows before (bf16 X_j^T in xf[j], j < i),
 *     acc^T = B_i^T + sum_{j<i} X_j^T (-A_ij)^T,   X_i^T = bf16(acc^T) T_ii^T,
 * with -A below T's diagonal blocks and T_ii on them read from Tb ([64][72] bf16). xo gets X_i^T
 * in fp32 (C fragments of the two n8 tiles, rows 16i.. and 16i+8..) and xf[i] its bf16 values,
 * the A fragment of the later rows. Every FS = 1 form (k_gdn_fused's slabs, k_gdn_pipe's key
 * slabs and value slabs) runs this one code: the same bits. */
__device__ __forceinline__ void fs_block_row(uint32_t (&xf)[4][4], const __nv_bfloat16 *Tb, int i, float (&xo)[2][4]) {
    float acc[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; nt++) { /* B_i^T, bf16 pairs -> fp32 C layout */
        acc[nt][0] = __uint_as_float(xf[i][2 * nt] << 16);
        acc[nt][1] = __uint_as_float(xf[i][2 * nt] & 0xffff0000u);
        acc[nt][2] = __uint_as_float(xf[i][2 * nt + 1] << 16);
        acc[nt][3] = __uint_as_float(xf[i][2 * nt + 1] & 0xffff0000u);
    }
#pragma unroll
    for (int j = 0; j < 3; j++) { /* + X_j^T (-A_ij)^T */
        if (j < i) {
            uint32_t bn[2][2];
            ldsm_frag_b2_nk(bn, Tb + (16 * i) * 72 + 16 * j, 72);
            mma_bf16_16816(acc[0], xf[j], bn[0]);
            mma_bf16_16816(acc[1], xf[j], bn[1]);
        }
    }
    const uint32_t ya[4] = {pack_bf16x2(acc[0][0], acc[0][1]), pack_bf16x2(acc[0][2], acc[0][3]),
                            pack_bf16x2(acc[1][0], acc[1][1]), pack_bf16x2(acc[1][2], acc[1][3])};
    uint32_t bt[2][2];
    ldsm_frag_b2_nk(bt, Tb + (16 * i) * 72 + 16 * i, 72);
#pragma unroll
    for (int nt = 0; nt < 2; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) xo[nt][e] = 0.0f;
    mma_bf16_16816(xo[0], ya, bt[0]); /* X_i^T = acc^T T_ii^T */
    mma_bf16_16816(xo[1], ya, bt[1]);
#pragma unroll
    for (int nt = 0; nt < 2; nt++) {
        xf[i][2 * nt] = pack_bf16x2(xo[nt][0], xo[nt][1]);
        xf[i][2 * nt + 1] = pack_bf16x2(xo[nt][2], xo[nt][3]);
    }
}

template <int DKP, int MODE, int WS = 0, int FS = 0>
__global__ void __launch_bounds__(FU_WTN(WS), 1) k_gdn_fused(ChunkArgs a) {
    static_assert(!(MODE && WS), "the WS form is the fused pass only");
    typedef FusedSmem<DKP, WS, FS> L;
    constexpr int WT = FU_WTN(WS); /* threads at the producer/compute handshakes */
    constexpr int LDK = L::LDK, LDV = L::LDV, MT = DKP / 16, MTW = (MT + 3) / 4, NB = DKP / 16, NBW = (NB + 3) / 4;
    extern __shared__ __align__(16) unsigned char smem[];
    float *Kst = (float *)smem, *Qst = Kst + CH * DKP, *Vst = Qst + CH * DKP;
    float *Gst = Vst + CH * 128, *Bst = Gst + CH, *Wr = Bst + CH;
    unsigned char *sp_ = smem + L::STG;
    __nv_bfloat16 *R1 = (__nv_bfloat16 *)sp_;
    __nv_bfloat16 *Kb = R1, *Mb = R1, *Vb = R1 + CH * LDK;
    float *U0t = (float *)R1; /* FS: the U0 tile [64][L::U0LD] fp32, from (f') to the start of (i) */
    sp_ += L::R1;
    __nv_bfloat16 *Qb = (__nv_bfloat16 *)sp_;
    sp_ += L::QB;
    __nv_bfloat16 *KtT = (__nv_bfloat16 *)sp_;
    sp_ += L::KT;
    __nv_bfloat16 *Aq = (__nv_bfloat16 *)sp_;
    sp_ += L::AQ;
    float *Ob = (float *)sp_; /* WS: the O tile [64][128] over OPAD, T and R2 up to UT */
    sp_ += L::OPAD;
    __nv_bfloat16 *Tb = (__nv_bfloat16 *)sp_;
    sp_ += L::AQ;
    float *Af = (float *)sp_, *Xf = Af + CH * 65, *Ah = Xf + CH * 65;
    __nv_bfloat16 *Wb = (__nv_bfloat16 *)sp_, *UTall = (__nv_bfloat16 *)(sp_ + L::UTOFF);
    sp_ += L::R2;
    float *bc = (float *)sp_, *be = bc + CH, *fq = be + CH, *fm = fq + CH, *fk = fm + CH, *decp = fk + CH;

    /* (not const: the WS form re-derives them per phase, see FU_REFRESH) */
    int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, tq = lane & 3;
    int gq = w >> 2, wq = w & 3;
    /* MODE 0: block (value block, head, sequence); MODE 1: block (chunk, head, value block) */
    const int h = blockIdx.y, z = MODE ? 0 : blockIdx.z, H = a.H, dk = a.dk, dv = a.dv;
    const int jb = (MODE ? blockIdx.z : blockIdx.x) * 128;
    int j0 = jb + gq * 32;
    bool active = j0 < dv;
    const int c0 = MODE ? (int)blockIdx.x : a.seq_c0[z], nc = MODE ? 1 : a.seq_nc[z];
    if (nc <= 0) return; /* nothing selected this sequence: the state stays untouched */
    if (WS && w >= FU_T / 32) { /* the producer warp(s) */
        fu_producer<DKP, WS >= 2 ? 4 : 1, WS != 3>(a, Kst, Qst, Vst, Gst, Bst, Wr, Ob, c0, nc, h, jb, w - FU_T / 32,
                                                  lane);
        return;
    }
    float *S = MODE ? NULL : a.S[z] + (size_t)h * dk * dv;
    const bool vec = a.vec4 && dv % 4 == 0;

    /* cp.async of chunk c's q and k rows in 16-byte pieces (vec4 inputs), not committed: part of
     * stage() and, in the WS = 3 form, what the compute warps issue themselves (stage_qk) */
    auto stage_qk_issue = [&](int c) {
        const int tok0 = a.ck_tok0[c], len = a.ck_len[c];
        for (int x = tid; x < CH * DKP / 4; x += FU_T) {
            int t = x / (DKP / 4), i = (x % (DKP / 4)) * 4, sp = 0;
            float wt;
            bool ok = t < len && i < dk;
            size_t tok = ok ? chunk_row(a, tok0 + t, sp, wt) : 0;
            size_t off = (tok * H + h) * dk + i;
            cp_async16(Qst + t * DKP + i, ok ? (sp ? a.q2 : a.q) + off : a.q, ok ? 16 : 0);
            cp_async16(Kst + t * DKP + i, ok ? (sp ? a.k2 : a.k) + off : a.k, ok ? 16 : 0);
        }
    };
    auto stage = [&](int c) {
        const int tok0 = a.ck_tok0[c], len = a.ck_len[c];
        if (vec) {
            stage_qk_issue(c);
            for (int x = tid; x < CH * 32; x += FU_T) {
                int t = x >> 5, j = (x & 31) * 4, sp = 0;
                float wt;
                bool ok = t < len && jb + j < dv;
                size_t tok = ok ? chunk_row(a, tok0 + t, sp, wt) : 0;
                cp_async16(Vst + t * 128 + j, ok ? a.v + (tok * H + h) * dv + jb + j : a.v, ok ? 16 : 0);
            }
            if (tid < CH) {
                int t = tid, sp = 0;
                float wt = 0.0f;
                bool ok = t < len;
                size_t tok = ok ? chunk_row(a, tok0 + t, sp, wt) : 0;
                cp_async4(Gst + t, ok ? (sp ? a.g2 : a.ga) + tok * H + h : a.ga, ok ? 4 : 0);
                cp_async4(Bst + t, ok ? (sp ? a.b2 : a.gb) + tok * H + h : a.gb, ok ? 4 : 0);
                Wr[t] = ok ? wt : 0.0f;
            }
            cp_async_commit();
        } else {
            for (int x = tid; x < CH * DKP; x += FU_T) {
                int t = x / DKP, i = x % DKP, sp = 0;
                float wt, qv = 0.0f, kv = 0.0f;
                if (t < len && i < dk) {
                    size_t off = (chunk_row(a, tok0 + t, sp, wt) * H + h) * dk + i;
                    qv = (sp ? a.q2 : a.q)[off];
                    kv = (sp ? a.k2 : a.k)[off];
                }
                Qst[t * DKP + i] = qv;
                Kst[t * DKP + i] = kv;
            }
            for (int x = tid; x < CH * 128; x += FU_T) {
                int t = x >> 7, j = x & 127, sp = 0;
                float wt, vv = 0.0f;
                if (t < len && jb + j < dv) vv = a.v[(chunk_row(a, tok0 + t, sp, wt) * H + h) * dv + jb + j];
                Vst[t * 128 + j] = vv;
            }
            if (tid < CH) {
                int t = tid, sp = 0;
                float wt = 0.0f, gv = 0.0f, bv = 0.0f;
                if (t < len) {
                    size_t tok = chunk_row(a, tok0 + t, sp, wt);
                    gv = (sp ? a.g2 : a.ga)[tok * H + h];
                    bv = (sp ? a.b2 : a.gb)[tok * H + h];
                }
                Gst[t] = gv;
                Bst[t] = bv;
                Wr[t] = t < len ? wt : 0.0f;
            }
        }
    };

    /* WS = 3: the compute warps stage q and k of chunk c */
    auto stage_qk = [&](int c) {
        stage_qk_issue(c);
        cp_async_commit();
    };
    float sacc[MTW][4][4];
#pragma unroll
    for (int mi = 0; mi < MTW; mi++) {
        int mt = wq + 4 * mi;
#pragma unroll
        for (int n = 0; n < 4; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int i = mt * 16 + g + (e >> 1) * 8, j = j0 + n * 8 + 2 * tq + (e & 1);
                sacc[mi][n][e] = (!MODE && mt < MT && i < dk && j < dv) ? S[(size_t)i * dv + j] : 0.0f;
            }
    }
    if (!WS) stage(c0);
    /* WS (96 registers with 17 warps): the thread's indices are re-derived at each chunk and made
     * opaque at the phase starts, so the compiler recomputes the per-lane fragment addresses there
     * instead of keeping ~20 of them live (spilled) through the chunk loop */
#define FU_REFRESH                                                                                                     \
    if (WS) asm volatile("" : "+r"(tid), "+r"(lane), "+r"(w), "+r"(g), "+r"(tq), "+r"(gq), "+r"(wq))
    for (int cc = 0; cc < nc; cc++) {
        if (WS) {
            asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tid));
            lane = tid & 31;
            w = tid >> 5;
            g = lane >> 2;
            tq = lane & 3;
            gq = w >> 2;
            wq = w & 3;
            j0 = jb + gq * 32;
            active = j0 < dv;
        }
        const int c = c0 + cc, tok0 = WS ? 0 : a.ck_tok0[c], len = WS ? 0 : a.ck_len[c];
        FPROF(0);
        if (WS) {
            if (WS == 3) cp_async_wait<0>(); /* this thread's own q, k pieces (staged after EMPTY) */
            nb_sync(FU_FULL, WT); /* (a) staging landed, the previous O tile stored (WS = 2: read out) */
        } else {
            cp_async_wait<0>();
            __syncthreads(); /* (a) this chunk's staging is visible; the previous chunk's tiles are dead */
        }
        FPROF(1);
        /* (b) cumulative log decay (rows past len have g = 0, beta = 0) and per-row factors */
        if (w == 0) gdn_chunk_decay(Gst, Bst, a.scale, lane, bc, be, fq, fm, fk, decp);
        /* (c) K, Q (weighted rows of a row map) -> bf16; T above the diagonal blocks = 0 */
#pragma unroll 2
        for (int x = tid; x < CH * DKP / 4; x += FU_T) {
            int t = x / (DKP / 4), i = (x % (DKP / 4)) * 4;
            float wt = Wr[t];
            float4 kv = *(const float4 *)(Kst + t * DKP + i), qv = *(const float4 *)(Qst + t * DKP + i);
            *(uint2 *)(Kb + t * LDK + i) =
                make_uint2(pack_bf16x2(kv.x * wt, kv.y * wt), pack_bf16x2(kv.z * wt, kv.w * wt));
            *(uint2 *)(Qb + t * LDK + i) =
                make_uint2(pack_bf16x2(qv.x * wt, qv.y * wt), pack_bf16x2(qv.z * wt, qv.w * wt));
        }
        if (!FS) /* FS reads only T's diagonal blocks and -A below them */
            for (int x = tid; x < CH * CH; x += FU_T) {
                int r = x >> 6, s = x & 63;
                if ((s >> 4) > (r >> 4)) Tb[r * 72 + s] = __float2bfloat16_rn(0.0f);
            }
        fu_sync<WS>();
        FPROF(2);
        FU_REFRESH;
        /* (d) K K^T and Q K^T: warp (rows 16 wq.., columns 16 gq..) */
        {
            float kk[2][4], qk[2][4];
#pragma unroll
            for (int n = 0; n < 2; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) kk[n][e] = qk[n][e] = 0.0f;
            if (gq <= wq) {
#pragma unroll
                for (int kc = 0; kc < DKP / 16; kc++) {
                    uint32_t ak[4], aq[4], bf[2][2];
                    ldsm_frag_a(ak, Kb + (16 * wq) * LDK + kc * 16, LDK);
                    ldsm_frag_a(aq, Qb + (16 * wq) * LDK + kc * 16, LDK);
                    ldsm_frag_b2_nk(bf, Kb + (16 * gq) * LDK + kc * 16, LDK);
#pragma unroll
                    for (int n = 0; n < 2; n++) {
                        mma_bf16_16816(kk[n], ak, bf[n]);
                        mma_bf16_16816(qk[n], aq, bf[n]);
                    }
                }
            }
#pragma unroll
            for (int n = 0; n < 2; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int r = 16 * wq + g + (e >> 1) * 8, s = 16 * gq + n * 8 + 2 * tq + (e & 1);
                    float gam = (s <= r) ? expf(bc[r] - bc[s]) : 0.0f;
                    if (!FS)
                        Af[r * 65 + s] = (s < r) ? be[r] * gam * kk[n][e] : 0.0f;
                    else if (gq == wq) /* FS: A's diagonal blocks in fp32 for (e) */
                        Af[r * 65 + s] = (s < r) ? be[r] * gam * kk[n][e] : 0.0f;
                    else if (gq < wq) /* FS: -A below the diagonal blocks in bf16, for (f') */
                        Tb[r * 72 + s] = __float2bfloat16_rn(-(be[r] * gam * kk[n][e]));
                    Aq[r * 72 + s] = __float2bfloat16_rn(a.scale * gam * qk[n][e]);
                }
        }
        fu_sync<WS>();
        FPROF(3);
        FU_REFRESH;
        /* (e) diagonal blocks of T (warps 0-3) || the operand tiles (warps 4-15) */
        if (w < 4) {
            const int s = lane & 15;
            float x[16];
            gdn_diag_inverse_col(Af + (16 * w) * 65 + 16 * w, 65, s, x);
            if (lane < 16) {
#pragma unroll
                for (int t = 0; t < 16; t++) {
                    if (!FS) Xf[(16 * w + t) * 65 + 16 * w + s] = x[t];
                    Tb[(16 * w + t) * 72 + 16 * w + s] = __float2bfloat16_rn(x[t]);
                }
            }
        } else {
            const int ht = tid - 128, HT = FU_T - 128;
            for (int x = ht; x < CH * DKP / 4; x += HT) {
                int t = x / (DKP / 4), i = (x % (DKP / 4)) * 4;
                float wt = Wr[t], f = fm[t], fqq = fq[t];
                float4 kv = *(const float4 *)(Kst + t * DKP + i), qv = *(const float4 *)(Qst + t * DKP + i);
                kv.x *= wt;
                kv.y *= wt;
                kv.z *= wt;
                kv.w *= wt;
                qv.x *= wt;
                qv.y *= wt;
                qv.z *= wt;
                qv.w *= wt;
                *(uint2 *)(Mb + t * LDK + i) = make_uint2(pack_bf16x2(kv.x * f, kv.y * f), pack_bf16x2(kv.z * f, kv.w * f));
                *(uint2 *)(Qb + t * LDK + i) =
                    make_uint2(pack_bf16x2(qv.x * fqq, qv.y * fqq), pack_bf16x2(qv.z * fqq, qv.w * fqq));
            }
            for (int x = ht; x < CH * 32; x += HT) {
                int t = x >> 5, j = (x & 31) * 4;
                float4 vv = *(const float4 *)(Vst + t * 128 + j);
                float f = be[t];
                *(uint2 *)(Vb + t * LDV + j) = make_uint2(pack_bf16x2(vv.x * f, vv.y * f), pack_bf16x2(vv.z * f, vv.w * f));
            }
            for (int x = ht; x < (CH / 2) * DKP; x += HT) {
                int t = 2 * (x / DKP), i = x % DKP;
                float k0 = Kst[t * DKP + i] * Wr[t] * fk[t], k1 = Kst[(t + 1) * DKP + i] * Wr[t + 1] * fk[t + 1];
                *(uint32_t *)(KtT + i * 72 + t) = pack_bf16x2(k0, k1);
            }
        }
        fu_sync<WS>();
        FPROF(4);
        if (WS) {
            if (cc + 1 < nc) nb_arrive(FU_EMPTY, WT); /* the producer stages the next chunk */
            if (WS == 3 && cc + 1 < nc) stage_qk(c + 1); /* ... and these warps its q, k */
        } else if (cc + 1 < nc)
            stage(c + 1); /* the staging area is free: the next chunk streams in now */
        FPROF(5);
        FU_REFRESH;
        float u0[4][4]; /* U0 = T (beta V), rows 16 wq.., the group's columns j0.. (C fragments) */
        if constexpr (FS) {
            /* (f') W = T (beta e^b K) and U0 = T (beta V) without forming T: X = (I + A)^-1 B for
             * B = [Mb | Vb] by blocked forward substitution on tensor cores,
             *     X_i = T_ii (B_i - sum_{j<i} A_ij X_j),  i = 0..3 (row blocks of 16),
             * in transposed form so that each warp keeps all of it in registers: warp w owns the
             * 16-column slab w of B (slabs 0..NB-1: key columns 16w.. of Mb -> W; NB..NB+7: value
             * columns 16(w - NB).. of Vb -> U0; a value slab wholly past dv is skipped, and with
             * DKP < 128 warps NB+8.. have none). Per block row i, with m = the slab's column and
             * n = the row inside block i (two n8 tiles: rows 16i..16i+7 and 16i+8..16i+15):
             *     acc^T = B_i^T + sum_{j<i} X_j^T (-A_ij)^T      (m16 x n16, fp32)
             *     X_i^T = bf16(acc^T) T_ii^T                      (m16 x n16, fp32)
             * Fragments (lane = 4g + t; PTX m16n8k16 layouts, see hyla_cuda_mma.cuh):
             *   xf[i] (A operand, m16 x k16, k = row in block i), by ldsm_frag_a_kn on the slab:
             *     xf[i][0] = (col g,   rows 16i+2t, +1)    xf[i][1] = (col g+8, rows 16i+2t, +1)
             *     xf[i][2] = (col g,   rows 16i+8+2t, +1)  xf[i][3] = (col g+8, rows 16i+8+2t, +1)
             *   (low half = the lower row); once X_i is formed xf[i] holds bf16(X_i^T) in the same
             *   places, so the registers of B_i turn into those of X_i (16 in all, throughout);
             *   acc[nt] / xo[nt] (C, m16 x n8, tile nt = rows 16i+8nt..): [0], [1] = (col g,
             *     rows 16i+8nt+2t, +1), [2], [3] = (col g+8, the same rows); so acc[nt][0..1] =
             *     xf[i][2nt] and acc[nt][2..3] = xf[i][2nt+1] (the flash-attention register reuse:
             *     C fragments of the two n8 tiles are the A fragment of the next k16 step);
             *   B operand (k = row 16j+k of the block column, n = row 16i+n): (-A_ij)^T (k, n) =
             *     -A[16i+n][16j+k] = Tb[(16i+n)*72 + 16j+k] ((d) writes bf16(-A) there), and
             *     T_ii^T (k, n) = T_ii[n][k] = Tb[(16i+n)*72 + 16i+k] ((e)): both "[n][k]" tiles,
             *     ldsm_frag_b2_nk, b[0] = rows 16i..16i+7, b[1] = rows 16i+8...
             * Outputs: X_i^T element (col m, row r) goes to Wb[r][16w + m] (bf16, the value of
             * xf[i]) or to the U0 tile [r][16(w - NB) + m] (fp32); both writes are transposed
             * (rows 2t, cols g: the tile's stride 132 makes them conflict-free).
             * Numerics: A below the diagonal blocks, the right-hand side and every X_j fed to later
             * block rows are bf16 (the default forms T in fp32 and rounds it once to bf16 for W =
             * T Mb, U0 = T Vb), so the results differ from FS = 0 by rounding (within the chunked
             * tolerance); all forms with FS (WS = 0, 1, 2, split) share this code: the same bits.
             * The U0 tile lies over R1 (Kb/Mb, Vb), so every warp loads its whole B first. */
            const int vs = w - NB;
            const bool kslab = w < NB, run = kslab || (vs < 8 && jb + 16 * vs < dv);
            uint32_t xf[4][4];
            if (run) {
                const __nv_bfloat16 *src = kslab ? Mb + 16 * w : Vb + 16 * vs;
                const int ld = kslab ? LDK : LDV;
#pragma unroll
                for (int i = 0; i < 4; i++) ldsm_frag_a_kn(xf[i], src + (16 * i) * ld, ld);
            } else /* defined values (undefined ones cost spills, as u0 in (i)) */
#pragma unroll
                for (int i = 0; i < 4; i++)
#pragma unroll
                    for (int e = 0; e < 4; e++) xf[i][e] = 0u;
            fu_sync<WS>(); /* every warp holds its B: R1 is free for the U0 tile (Af is dead since (e)) */
            FPROF(6);
            if (run) {
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    float xo[2][4];
                    fs_block_row(xf, Tb, i, xo);
#pragma unroll
                    for (int nt = 0; nt < 2; nt++)
#pragma unroll
                        for (int e = 0; e < 4; e++) { /* (col g + 8(e/2), row 16i + 8nt + 2t + e%2) */
                            const int r = 16 * i + 8 * nt + 2 * tq + (e & 1), m = g + 8 * (e >> 1);
                            if (kslab)
                                ((unsigned short *)Wb)[r * LDK + 16 * w + m] =
                                    (unsigned short)(xf[i][2 * nt + (e >> 1)] >> (16 * (e & 1)));
                            else
                                U0t[r * L::U0LD + 16 * vs + m] = xo[nt][e];
                        }
                }
            }
            FPROF(7);
            fu_sync<WS>(); /* W and the U0 tile complete */
            FPROF(8);
        } else {
            /* (f) T below the diagonal blocks: with Ah_ik = T_ii A_ik (block (i, k), k < i, stored at
             * i(i-1)/2 + k), T_ij = -sum_{k=j}^{i-1} Ah_ik T_kj, one block diagonal d = i - j at a time */
            for (int x = tid; x < 6 * 256; x += FU_T) {
                int bi = x >> 8, ra = (x >> 4) & 15, cb = x & 15;
                int i = bi < 1 ? 1 : (bi < 3 ? 2 : 3), k = bi - i * (i - 1) / 2;
                float acc = 0.0f;
#pragma unroll
                for (int r = 0; r < 16; r++) acc = fmaf(Xf[(16 * i + ra) * 65 + 16 * i + r], Af[(16 * i + r) * 65 + 16 * k + cb], acc);
                Ah[bi * 272 + ra * 17 + cb] = acc;
            }
            fu_sync<WS>();
            FPROF(6);
            for (int d = 1; d < 4; d++) {
                for (int x = tid; x < (4 - d) * 256; x += FU_T) {
                    int i = d + (x >> 8), j = i - d, ra = (x >> 4) & 15, cb = x & 15;
                    float acc = 0.0f;
                    for (int k = j; k < i; k++) {
                        const float *ah = Ah + (i * (i - 1) / 2 + k) * 272 + ra * 17;
#pragma unroll
                        for (int r = 0; r < 16; r++) acc = fmaf(ah[r], Xf[(16 * k + r) * 65 + 16 * j + cb], acc);
                    }
                    Xf[(16 * i + ra) * 65 + 16 * j + cb] = -acc;
                    Tb[(16 * i + ra) * 72 + 16 * j + cb] = __float2bfloat16_rn(-acc);
                }
                fu_sync<WS>();
            }
            FPROF(7);
            /* (h) W = T (beta e^b K): warp rows 16 wq.., column blocks gq + 4q; U0 = T (beta V) for
             * the group's 32 value columns. W goes to R2 (A, X, P are dead now). */
            FU_REFRESH;
#pragma unroll
            for (int n = 0; n < 4; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) u0[n][e] = 0.0f;
            {
                float wacc[NBW][2][4];
#pragma unroll
                for (int q = 0; q < NBW; q++)
#pragma unroll
                    for (int n = 0; n < 2; n++)
#pragma unroll
                        for (int e = 0; e < 4; e++) wacc[q][n][e] = 0.0f;
#pragma unroll
                for (int kc = 0; kc < CH / 16; kc++) {
                    uint32_t at[4];
                    ldsm_frag_a(at, Tb + (16 * wq) * 72 + kc * 16, 72);
#pragma unroll
                    for (int q = 0; q < NBW; q++) {
                        int nb = gq + 4 * q;
                        if (nb < NB) {
                            uint32_t bf[2][2];
                            ldsm_frag_b2_kn(bf, Mb + (kc * 16) * LDK + nb * 16, LDK);
                            mma_bf16_16816(wacc[q][0], at, bf[0]);
                            mma_bf16_16816(wacc[q][1], at, bf[1]);
                        }
                    }
                }
#pragma unroll
                for (int q = 0; q < NBW; q++) {
                    int nb = gq + 4 * q;
                    if (nb < NB)
#pragma unroll
                        for (int n = 0; n < 2; n++)
#pragma unroll
                            for (int e = 0; e < 4; e += 2) {
                                int r = 16 * wq + g + (e >> 1) * 8, col = nb * 16 + n * 8 + 2 * tq;
                                *(uint32_t *)(Wb + r * LDK + col) = pack_bf16x2(wacc[q][n][e], wacc[q][n][e + 1]);
                            }
                }
            }
            if (active) { /* after W, so that its accumulators and U0's are not live together */
#pragma unroll
                for (int kc = 0; kc < CH / 16; kc++) {
                    uint32_t at[4];
                    ldsm_frag_a(at, Tb + (16 * wq) * 72 + kc * 16, 72);
#pragma unroll
                    for (int hb = 0; hb < 2; hb++) {
                        uint32_t bf[2][2];
                        ldsm_frag_b2_kn(bf, Vb + (kc * 16) * LDV + gq * 32 + hb * 16, LDV);
                        mma_bf16_16816(u0[2 * hb], at, bf[0]);
                        mma_bf16_16816(u0[2 * hb + 1], at, bf[1]);
                    }
                }
            }
            fu_sync<WS>();
            FPROF(8);
        }
        if (MODE) {
            /* the chunk's tiles for kernel B, in its layouts: the same values the fused pass
             * uses, so kernel B computes the same bits */
            const size_t ch = (size_t)c * H + h;
            if (jb == 0) {
                __nv_bfloat16 *qo = a.qt + ch * CH * DKP, *wo = a.wt + ch * CH * DKP, *ko = a.ktT + ch * DKP * CH;
                for (int x = tid; x < CH * DKP / 8; x += FU_T) {
                    int t = x / (DKP / 8), i = (x % (DKP / 8)) * 8;
                    *(uint4 *)(qo + (size_t)x * 8) = *(const uint4 *)(Qb + t * LDK + i);
                    *(uint4 *)(wo + (size_t)x * 8) = *(const uint4 *)(Wb + t * LDK + i);
                }
                for (int x = tid; x < DKP * CH / 8; x += FU_T) {
                    int i = x / (CH / 8), t = (x % (CH / 8)) * 8;
                    *(uint4 *)(ko + (size_t)x * 8) = *(const uint4 *)(KtT + i * 72 + t);
                }
                __nv_bfloat16 *ao = a.aqk + ch * CH * CH;
                for (int x = tid; x < CH * CH / 8; x += FU_T) {
                    int t = x >> 3, s8 = (x & 7) * 8;
                    *(uint4 *)(ao + (size_t)x * 8) = *(const uint4 *)(Aq + t * 72 + s8);
                }
                if (tid == 0) a.dec[ch * DKP] = decp[0];
            }
            if constexpr (FS) { /* U0 from the tile (the values the fused pass reads) */
                float *uo = a.u0 + ch * CH * dv;
                for (int x = tid; x < CH * 128; x += FU_T) {
                    const int t = x >> 7, jj = x & 127;
                    if (jb + jj < dv) uo[(size_t)t * dv + jb + jj] = U0t[t * L::U0LD + jj];
                }
            } else if (active) {
                float *uo = a.u0 + ch * CH * dv;
#pragma unroll
                for (int n = 0; n < 4; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int t = 16 * wq + g + (e >> 1) * 8, j = j0 + n * 8 + 2 * tq + (e & 1);
                        if (j < dv) uo[(size_t)t * dv + j] = u0[n][e];
                    }
            }
            return;
        }
        FU_REFRESH;
        /* (i) the state pass of this group's 32 value columns */
        __nv_bfloat16 *SbT = R1 + gq * 32 * LDK, *UT = UTall + gq * 32 * 72;
        if constexpr (FS) {
            if (active) /* u0[n][e] = U0 (row 16 wq + g + 8(e/2), column j0 - jb + 8n + 2 tq + e%2), as (h)
                         * leaves it; a 16-column slab wholly past dv was not formed: 0 */
#pragma unroll
                for (int n = 0; n < 4; n++) {
                    const bool ok = jb + 16 * (2 * gq + (n >> 1)) < dv;
#pragma unroll
                    for (int e = 0; e < 4; e += 2) {
                        const int t = 16 * wq + g + (e >> 1) * 8, col = gq * 32 + n * 8 + 2 * tq;
                        const float2 uv = ok ? *(const float2 *)(U0t + t * L::U0LD + col) : make_float2(0.0f, 0.0f);
                        u0[n][e] = uv.x;
                        u0[n][e + 1] = uv.y;
                    }
                }
            else /* defined values: undefined ones here made the WS forms spill */
#pragma unroll
                for (int n = 0; n < 4; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) u0[n][e] = 0.0f;
            fu_sync<WS>(); /* the U0 tile is read: R1 takes S^T */
        }
        if (active) {
#pragma unroll
            for (int mi = 0; mi < MTW; mi++) {
                int mt = wq + 4 * mi;
                if (mt < MT)
#pragma unroll
                    for (int n = 0; n < 4; n++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            int i = mt * 16 + g + (e >> 1) * 8, jj = n * 8 + 2 * tq + (e & 1);
                            SbT[jj * LDK + i] = __float2bfloat16_rn(sacc[mi][n][e]);
                        }
            }
        }
        fu_sync<WS>();
        FPROF(9);
        if (WS && active) { /* U = U0 - W S, one 16-column half at a time (8 accumulators less
                             * live; each accumulator's products in the same order) */
#pragma unroll
            for (int hb = 0; hb < 2; hb++) {
                float uacc[2][4];
#pragma unroll
                for (int n = 0; n < 2; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) uacc[n][e] = 0.0f;
#pragma unroll
                for (int kc = 0; kc < DKP / 16; kc++) {
                    uint32_t af[4], bf[2][2];
                    ldsm_frag_a(af, Wb + (16 * wq) * LDK + kc * 16, LDK);
                    ldsm_frag_b2_nk(bf, SbT + (hb * 16) * LDK + kc * 16, LDK);
                    mma_bf16_16816(uacc[0], af, bf[0]);
                    mma_bf16_16816(uacc[1], af, bf[1]);
                }
#pragma unroll
                for (int n = 0; n < 2; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int t = 16 * wq + g + (e >> 1) * 8, jj = (2 * hb + n) * 8 + 2 * tq + (e & 1);
                        UT[jj * 72 + t] = __float2bfloat16_rn(u0[2 * hb + n][e] - uacc[n][e]);
                    }
            }
        } else if (active) { /* U = U0 - W S for rows 16 wq.. */
            float uacc[4][4];
#pragma unroll
            for (int n = 0; n < 4; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) uacc[n][e] = 0.0f;
            mma_16x32<DKP>(uacc, Wb + (16 * wq) * LDK, LDK, SbT, LDK);
#pragma unroll
            for (int n = 0; n < 4; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int t = 16 * wq + g + (e >> 1) * 8, jj = n * 8 + 2 * tq + (e & 1);
                    UT[jj * 72 + t] = __float2bfloat16_rn(u0[n][e] - uacc[n][e]);
                }
        }
        fu_sync<WS>();
        FPROF(10);
        if (active) {
            /* O = q~ S + Aqk U */
            float oacc[4][4];
#pragma unroll
            for (int n = 0; n < 4; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) oacc[n][e] = 0.0f;
            mma_16x32<DKP>(oacc, Qb + (16 * wq) * LDK, LDK, SbT, LDK);
            mma_16x32<CH>(oacc, Aq + (16 * wq) * 72, 72, UT, 72);
            if (WS) { /* to the O tile (16-byte pieces XOR 2(t mod 4)); the producer stores it */
#pragma unroll
                for (int n = 0; n < 4; n++)
#pragma unroll
                    for (int e = 0; e < 4; e += 2) {
                        int t = 16 * wq + g + (e >> 1) * 8, col = gq * 32 + n * 8 + 2 * tq;
                        *(float2 *)(Ob + t * 128 + (((col >> 2) ^ ((t & 3) << 1)) << 2) + (col & 3)) =
                            make_float2(oacc[n][e], oacc[n][e + 1]);
                    }
                nb_arrive(FU_OREADY, WT);
            } else
#pragma unroll
                for (int n = 0; n < 4; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int t = 16 * wq + g + (e >> 1) * 8, j = j0 + n * 8 + 2 * tq + (e & 1);
                        if (t < len && j < dv) a.o[((size_t)(tok0 + t) * H + h) * dv + j] = oacc[n][e];
                    }
            /* S = e^(bC) S + k~^T U */
            const float d = decp[0];
#pragma unroll
            for (int mi = 0; mi < MTW; mi++) {
                int mt = wq + 4 * mi;
                if (mt < MT) {
#pragma unroll
                    for (int n = 0; n < 4; n++)
#pragma unroll
                        for (int e = 0; e < 4; e++) sacc[mi][n][e] *= d;
                    mma_16x32<CH>(sacc[mi], KtT + (mt * 16) * 72, 72, UT, 72);
                }
            }
        } else if (WS)
            nb_arrive(FU_OREADY, WT); /* a group past dv: nothing of the O tile */
        FPROF(11);
    }
#undef FU_REFRESH
    if (WS) { /* the state's address again rather than kept live through the chunk loop */
        float *const *Sv = a.S;
        asm volatile("" : "+l"(Sv));
        S = Sv[z] + (size_t)h * dk * dv;
    }
#pragma unroll
    for (int mi = 0; mi < MTW; mi++) {
        int mt = wq + 4 * mi;
#pragma unroll
        for (int n = 0; n < 4; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int i = mt * 16 + g + (e >> 1) * 8, j = j0 + n * 8 + 2 * tq + (e & 1);
                if (!MODE && mt < MT && i < dk && j < dv) S[(size_t)i * dv + j] = sacc[mi][n][e];
            }
    }
#ifdef HYLA_FUSED_PROFILE
    if (!MODE && nc > 21 && tid == 0 && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 &&
        atomicAdd(&g_fprof_once, 1) == 0) {
        long long *p = g_fprof_t;
        if (FS) /* (f'): B loads + barrier, warp 0's substitution, the wait for the other warps;
                 * sbt includes the U0 tile read and its barrier */
            printf("fused FS=1 profile (cycles, chunk 20): wait %lld bc+cvt %lld kk/qk %lld inv+tiles %lld stage %lld "
                   "fs-load %lld fs-subst %lld fs-wait %lld u0+sbt %lld u %lld o+s %lld total %lld\n",
                   p[1] - p[0], p[2] - p[1], p[3] - p[2], p[4] - p[3], p[5] - p[4], p[6] - p[5], p[7] - p[6],
                   p[8] - p[7], p[9] - p[8], p[10] - p[9], p[11] - p[10], p[11] - p[0]);
        else
            printf("fused profile (cycles, chunk 20): wait %lld bc+cvt %lld kk/qk %lld inv+tiles %lld stage %lld "
                   "ahat %lld offdiag %lld w/u0 %lld sbt %lld u %lld o+s %lld total %lld\n",
                   p[1] - p[0], p[2] - p[1], p[3] - p[2], p[4] - p[3], p[5] - p[4], p[6] - p[5], p[7] - p[6],
                   p[8] - p[7], p[9] - p[8], p[10] - p[9], p[11] - p[10], p[11] - p[0]);
        if (WS) /* the producer (warp 16), from the compute warps' chunk start: staging issue, OREADY
                 * passed, O tile read out (WS = 2) or stored (WS = 1), o stores issued, copies landed
                 * (WS = 2: before the o stores) */
            printf("fused WS=%d producer (cycles from chunk 20's start): stage issue %lld..%lld, O tile %lld..%lld, "
                   "o stores issued %lld, staging landed %lld\n",
                   WS, p[12] - p[0], p[13] - p[0], p[14] - p[0], p[15] - p[0], p[16] - p[0], p[17] - p[0]);
    }
#endif
}

/* ---- fused GDN, pipelined: the chunk part of chunk c+1 beside the state pass of chunk c ----
 * k_gdn_pipe (the default fused form in sm_90a builds, plain rows and SSE's row map alike;
 * HYLA_CUDA_GDN_WS=4 forces it; docs/CUDA.md "Pipelined GDN pass", kernels/cuda/dev/NOTES.md
 * variants 11-12): the same tiles,
 * products and bits as the FS = 1 forms of k_gdn_fused, with the block's 12 warps split in two
 * roles that run concurrently:
 *   warps 0-7 ("chunk warps") stage the chunks — three tensor-map bulk copies per chunk (q, k, v
 *     boxes of 64 rows of one head) on an mbarrier, or one bulk copy per row where there is no
 *     map (a row map, or the row count unknown); g, beta by 4-byte cp.async — and form chunk
 *     c+1's tiles: (b) cumulative decay; (c) one pass over the staging: K, Q in bf16 for (d), beta
 *     V, and beta e^b K, q~, k~ kept in registers; the next chunk's copies issued; (d) K K^T, Q K^T
 *     on the 10 lower 16x16 blocks (warp w block w; of blocks 8, 9 warps 0, 1 the K K^T, warps 2, 3
 *     the Q K^T); (e) diagonal inverses, beta e^b K and q~ written over K and Q; (f') W by forward
 *     substitution (warp w = key slab w);
 *   warps 8-11 ("state warps", one warpgroup) run the state pass of chunk c: warp 8 + w owns
 *     the value slabs 2w and 2w+1 (32 value columns) and keeps S^T (its 32 value rows x DKP keys,
 *     fp32) in registers, so it needs nobody else's part of the state: per slab and 16-token
 *     block, U0^T by forward substitution for the slab (the value-slab half of (f'), same code)
 *     and U^T = U0^T - S^T W^T; then O^T = S^T q~^T + U^T Aqk^T (16 tokens at a time, stored to o
 *     from registers) and S^T = e^(bC) S^T + U^T k~, with A operands from registers (S^T and U^T
 *     packed to bf16 as the other forms round S and U) and B operands the other forms' tiles
 *     ([n][k]: W, q~, Aqk; k~ row-major through ldmatrix.trans). In O and the S update each B
 *     fragment read from shared memory feeds both slabs, which halves those reads against one
 *     slab per warp (the shared-memory traffic that bounded the 16-warp form, NOTES.md).
 * Registers (setmaxnreg, sm_90a): launched at 168 per thread, the chunk warpgroups drop to 128
 * and the state warpgroup rises to 240 (S^T alone is 128).
 * Each element is the same sum of the same bf16 products in the same order as in k_gdn_fused
 * (a product and its transpose), so the results are bit-identical (tested with the WS forms).
 * Hand-off (named barriers, bar.arrive by one role, bar.sync by the other, 384 threads):
 *   GP_TILES chunk warps -> state warps: chunk c's tiles are complete;
 *   GP_VB / GP_TV / GP_W / GP_QAK state -> chunk warps: beta V, T, W, then q~/Aqk/k~ of the
 *   chunk before are read, so the next chunk's may be written (single buffers), except q (raw,
 *   then q~) which alternates between two buffers by chunk parity. Aqk's and k~'s values are held
 *   in the chunk warps' registers from (c)/(d) until GP_QAK. Shared memory (dk = 128): 97 KB fp32
 *   staging + 126 KB tiles, one block per SM; 384 threads. */
/* The A fragment of S^T (one slab, keys 16 kc..16 kc + 15) in bf16: pairs with the bits of
 * pack_bf16x2, packed per use by a volatile cvt from the fp32 state xor an opaque zero (z, read
 * from shared memory where it is used), so ptxas can neither share the packs of one phase's
 * blocks nor hoist them out of a loop, which would keep 64 packed registers of two slabs live
 * beside S^T's 128 */
template <int NKT>
__device__ __forceinline__ void st_frag(uint32_t (&sa)[4], const float (&st)[NKT][4], int kc, uint32_t z) {
#pragma unroll
    for (int r = 0; r < 4; r++) {
        const float lo = __uint_as_float(__float_as_uint(st[2 * kc + (r >> 1)][2 * (r & 1)]) ^ z);
        const float hi = __uint_as_float(__float_as_uint(st[2 * kc + (r >> 1)][2 * (r & 1) + 1]) ^ z);
        asm volatile("cvt.rn.bf16x2.f32 %0, %2, %1;\n" : "=r"(sa[r]) : "f"(lo), "f"(hi));
    }
}
__device__ __forceinline__ uint32_t opaque_zero(const float *p) { return *(const volatile uint32_t *)p; }
#define GP_T 384 /* 8 chunk warps (two warpgroups) + 4 state warps (one warpgroup) */
#define GP_C 256 /* threads of the chunk warps (0-7) */
/* Registers: the block is launched with 168 per thread (64K / 384); the chunk warpgroups give
 * 40 each back (128, what their code needs without spilling) and the state warpgroup takes
 * them (168 + 2 x 40 = 248; 240 asked): S^T of 32 value rows is 128 registers per thread.
 * setmaxnreg is an sm_90a instruction: built for plain sm_90 the kernel keeps 168 everywhere
 * (the state warps then spill) and the host does not pick it by default (HYLA_CUDA_SM90A). */
#ifdef HYLA_CUDA_SM90A
#define GP_BUILT_SM90A 1
#else
#define GP_BUILT_SM90A 0
#endif
/* (c)'s load batches: q, k pieces and beta V pieces loaded together before their stores */
#ifndef GP_CB
#define GP_CB 4
#endif
#ifndef GP_VBATCH
#define GP_VBATCH 8
#endif
#define GP_CREG 128
#define GP_SREG 240
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define GP_SETMAXNREG(act, n) asm volatile("setmaxnreg." act ".sync.aligned.u32 %0;\n" ::"n"(n))
#else
#define GP_SETMAXNREG(act, n)
#endif
#define GP_BC 1    /* chunk warps among themselves */
#define GP_TILES 2 /* chunk -> state warps */
#define GP_TV 3    /* state -> chunk warps: T, beta V read */
#define GP_W 4     /* state -> chunk warps: W read */
#define GP_QAK 5   /* state -> chunk warps: q~, Aqk, k~^T read */
#define GP_VB 6    /* state -> chunk warps: beta V read (into registers) */

/* mbarrier and bulk copies (sm_90): whole rows global -> shared by the copy engine, completing
 * on an mbarrier (transaction bytes): no per-16-byte issue cost in the chunk warps */
__device__ __forceinline__ unsigned smem_u32(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(uint64_t *m, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(m)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t *m, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(m)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t *m, unsigned parity) {
    asm volatile("{\n .reg .pred P1;\n LAB_WAIT:\n mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n @P1 bra DONE;\n"
                 " bra LAB_WAIT;\n DONE:\n }\n" ::"r"(smem_u32(m)), "r"(parity) : "memory");
}
__device__ __forceinline__ void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
/* one box of a 3-D tensor map (the chunk's 64 rows of one head: {columns, head, row}) */
__device__ __forceinline__ void tma_g2s_3d(void *dst, const CUtensorMap *map, int x, int y, int zc, uint64_t *m) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, "
                 "%4}], [%5];\n" ::"r"(smem_u32(dst)),
                 "l"((unsigned long long)map), "r"(x), "r"(y), "r"(zc), "r"(smem_u32(m))
                 : "memory");
}
/* tensor maps of q, k, v ({dk or dv, H, rows}, boxes {DKP or 128, 1, 64}); use = 0: row copies */
struct PipeMaps {
    CUtensorMap q, k, v;
    int use;
};
__device__ __forceinline__ void bulk_g2s(void *dst, const void *src, unsigned bytes, uint64_t *m) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(m))
                 : "memory");
}

template <int DKP>
struct PipeSmem {
    static constexpr int LDK = DKP + 8, LDV = 136;
    static constexpr size_t STG = ((size_t)2 * CH * DKP + (size_t)CH * 128 + 3 * CH) * 4;
    static constexpr size_t TK = (size_t)CH * LDK * 2; /* Kb/Mb, Qbuf[2], Wb, k~ */
    static constexpr size_t TV = (size_t)CH * LDV * 2; /* Vb */
    static constexpr size_t AQ = (size_t)CH * 72 * 2;  /* Aqk, T */
    static constexpr size_t AF = (size_t)4 * 16 * 17 * 4; /* A's diagonal blocks, fp32 */
    static constexpr size_t SM = (size_t)(5 * CH + 4) * 4 + 16; /* bc be fq fm fk, decp[2] (+2), the mbarrier */
    static constexpr size_t TOTAL = STG + 5 * TK + TV + 2 * AQ + AF + SM;
    static_assert(STG % 16 == 0 && TK % 16 == 0 && TV % 16 == 0 && AQ % 16 == 0 && AF % 16 == 0,
                  "alignment");
};

#ifdef HYLA_FUSED_PROFILE
__device__ long long g_pprof_t[24];
__device__ int g_pprof_once;
/* clock64 with a memory clobber, so that it is read after a preceding bar.sync completes */
__device__ __forceinline__ long long gp_clock() {
    long long t;
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(t)::"memory");
    return t;
}
#define GPROF(k, who)                                                                                                  \
    if (cc == 20 && tid == (who) && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0) g_pprof_t[k] = gp_clock();
#else
#define GPROF(k, who)
#endif

template <int DKP>
__global__ void __launch_bounds__(GP_T, 1) k_gdn_pipe(ChunkArgs a, const __grid_constant__ PipeMaps pm) {
    typedef PipeSmem<DKP> L;
    constexpr int LDK = L::LDK, LDV = L::LDV, NB = DKP / 16, NKT = DKP / 8;
    constexpr int QI = CH * DKP / 4 / GP_C; /* 4-element pieces of a q or k tile per chunk thread */
    extern __shared__ __align__(128) unsigned char smem[];
    float *Kst = (float *)smem, *Qst = Kst + CH * DKP, *Vst = Qst + CH * DKP;
    float *Gst = Vst + CH * 128, *Bst = Gst + CH, *Wr = Bst + CH;
    unsigned char *sp_ = smem + L::STG;
    __nv_bfloat16 *Kb = (__nv_bfloat16 *)sp_, *Mb = Kb; /* K (c)-(d), then beta e^b K (e)-(f') */
    sp_ += L::TK;
    __nv_bfloat16 *Qbuf = (__nv_bfloat16 *)sp_; /* [2]: chunk parity; q (c)-(d), then q~ */
    sp_ += 2 * L::TK;
    __nv_bfloat16 *Wb = (__nv_bfloat16 *)sp_;
    sp_ += L::TK;
    __nv_bfloat16 *Vb = (__nv_bfloat16 *)sp_;
    sp_ += L::TV;
    __nv_bfloat16 *Kt = (__nv_bfloat16 *)sp_; /* k~ = e^(bC-b) K, row-major (the B operand of S^T += U^T k~) */
    sp_ += L::TK;
    __nv_bfloat16 *Aq = (__nv_bfloat16 *)sp_;
    sp_ += L::AQ;
    __nv_bfloat16 *Tb = (__nv_bfloat16 *)sp_;
    sp_ += L::AQ;
    float *Af = (float *)sp_; /* [4][16][17] */
    sp_ += L::AF;
    float *bc = (float *)sp_, *be = bc + CH, *fq = be + CH, *fm = fq + CH, *fk = fm + CH, *decp = fk + CH; /* decp[2] */

    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, tq = lane & 3;
    const int h = blockIdx.y, z = blockIdx.z, H = a.H, dk = a.dk, dv = a.dv, jb = blockIdx.x * 128;
    const int c0 = a.seq_c0[z], nc = a.seq_nc[z];
    if (nc <= 0) return; /* nothing selected this sequence: the state stays untouched */

    if (w < GP_C / 32) {
        /* ================= chunk warps ================= */
        GP_SETMAXNREG("dec", GP_CREG);
        uint64_t *mbar = (uint64_t *)(decp + 4);
        /* stage chunk c (its ld-th load: mbarrier phase ld): one bulk copy per row of q, k, v
         * (thread t of 0-191: row t % 64 of q, k or v) completing on the mbarrier; rows past len
         * zeroed by the thread instead; g, beta by 4-byte cp.async (threads 192-255). Columns
         * past dk (q, k) and past the block's value columns (v) stay zero from the start. */
        auto stage = [&](int tok0, int len) {
            const int nrows = len < CH ? len : CH, vcols = dv - jb < 128 ? dv - jb : 128;
            if (pm.use) { /* three boxes (OOB columns and rows read as zero); rows past len
                           * inside the tensor are zeroed at (a) */
                if (tid == 0) {
                    mbar_expect_tx(mbar, (unsigned)(CH * (2 * DKP + 128) * 4));
                    tma_g2s_3d(Qst, &pm.q, 0, h, tok0, mbar);
                    tma_g2s_3d(Kst, &pm.k, 0, h, tok0, mbar);
                    tma_g2s_3d(Vst, &pm.v, jb, h, tok0, mbar);
                }
            } else if (tid == 0)
                mbar_expect_tx(mbar, (unsigned)nrows * (unsigned)(2 * dk + vcols) * 4u);
            if (pm.use) {
            } else if (tid < 3 * CH) {
                const int t = tid & (CH - 1), kind = tid >> 6; /* 0 q, 1 k, 2 v */
                float *dst = kind == 0 ? Qst + t * DKP : kind == 1 ? Kst + t * DKP : Vst + t * 128;
                if (t < len) {
                    int sp = 0;
                    float wt;
                    const size_t tok = chunk_row(a, tok0 + t, sp, wt);
                    const float *src = kind == 2 ? a.v + (tok * H + h) * dv + jb
                                                 : (kind == 0 ? (sp ? a.q2 : a.q) : (sp ? a.k2 : a.k)) + (tok * H + h) * dk;
                    bulk_g2s(dst, src, (unsigned)(kind == 2 ? vcols : dk) * 4u, mbar);
                } else {
                    for (int u = 0; u < (kind == 2 ? 128 : DKP) / 4; u++) ((float4 *)dst)[u] = make_float4(0.f, 0.f, 0.f, 0.f);
                    fence_proxy_async_smem(); /* before a later chunk's bulk copy to this row */
                }
            }
            if (tid >= 3 * CH) {
                const int t = tid - 3 * CH;
                int sp = 0;
                float wt = 0.0f;
                const bool ok = t < len;
                const size_t tok = ok ? chunk_row(a, tok0 + t, sp, wt) : 0;
                cp_async4(Gst + t, ok ? (sp ? a.g2 : a.ga) + tok * H + h : a.ga, ok ? 4 : 0);
                cp_async4(Bst + t, ok ? (sp ? a.b2 : a.gb) + tok * H + h : a.gb, ok ? 4 : 0);
                Wr[t] = ok ? wt : 0.0f;
                cp_async_commit();
            }
        };
        /* the staging zeroed (padding columns stay zero), Aqk above the diagonal blocks zero for
         * every chunk ((d) writes the rest) */
        for (int x = tid; x < (2 * CH * DKP + CH * 128) / 4; x += GP_C) ((float4 *)Kst)[x] = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int x = tid; x < CH * CH; x += GP_C) {
            int r = x >> 6, s = x & 63;
            if ((s >> 4) > (r >> 4)) Aq[r * 72 + s] = __float2bfloat16_rn(0.0f);
        }
        if (tid == 0) {
            mbar_init(mbar, 1);
            ((uint32_t *)decp)[2] = 0u; /* the state warps' opaque zero */
        }
        fence_proxy_async_smem();
        nb_sync(GP_BC, GP_C);
        int curlen = a.ck_len[c0];
        stage(a.ck_tok0[c0], curlen);
        for (int cc = 0; cc < nc; cc++) {
            const int c = c0 + cc;
            __nv_bfloat16 *Qb = Qbuf + (cc & 1) * (L::TK / 2);
            GPROF(0, 0);
            /* the next chunk's table entries, loaded long before stage() needs them */
            const int ntok0 = cc + 1 < nc ? a.ck_tok0[c + 1] : 0, nlen = cc + 1 < nc ? a.ck_len[c + 1] : 0;
            mbar_wait(mbar, (unsigned)cc & 1u);
            cp_async_wait<0>();
            if (pm.use && curlen < CH) { /* rows past the chunk (the next sequence's) read as zero */
                for (int x = tid; x < (CH - curlen) * (2 * DKP + 128) / 4; x += GP_C) {
                    const int per = (2 * DKP + 128) / 4, t = curlen + x / per, u = x % per;
                    float *row = u < DKP / 4 ? Qst + t * DKP : u < DKP / 2 ? Kst + t * DKP : Vst + t * 128;
                    const int off = u < DKP / 4 ? u : u < DKP / 2 ? u - DKP / 4 : u - DKP / 2;
                    ((float4 *)row)[off] = make_float4(0.f, 0.f, 0.f, 0.f);
                }
                fence_proxy_async_smem(); /* before the next bulk copies to these rows */
            }
            nb_sync(GP_BC, GP_C); /* (a) the chunk's staging is visible */
            GPROF(1, 0);
            /* (b) cumulative log decay and per-row factors (k_gdn_fused's (b)) */
            if (w == 0) gdn_chunk_decay(Gst, Bst, a.scale, lane, bc, be, fq, fm, fk, decp + (cc & 1));
            nb_sync(GP_BC, GP_C);
            if (cc) nb_sync(GP_VB, GP_T); /* the state warps hold beta V of chunk c-1 */
            GPROF(2, 0);
            /* (c) one pass over the staging: K, Q (weighted rows) -> bf16 for (d); beta e^b K and
             * q~ (k_gdn_fused's (e) values) kept in registers until (d) is done, k~ until GP_QAK;
             * beta V */
            /* loads in batches of CB pieces before their stores (the compiler keeps the loads
             * after earlier stores to shared memory, which may alias: one round trip per batch,
             * not per piece) */
            constexpr int CB = QI < GP_CB ? QI : GP_CB; /* QI is 1 for dk <= 16 */
            static_assert(QI % CB == 0, "(c) batches");
            uint2 mbr[QI], qtr[QI], ktr[QI];
#pragma unroll
            for (int u0 = 0; u0 < QI; u0 += CB) {
                float4 kv[CB], qv[CB];
                float wt[CB], f[CB], fqq[CB], fkk[CB];
#pragma unroll
                for (int b = 0; b < CB; b++) {
                    const int x = tid + (u0 + b) * GP_C, t = x / (DKP / 4), i = (x % (DKP / 4)) * 4;
                    wt[b] = Wr[t];
                    f[b] = fm[t];
                    fqq[b] = fq[t];
                    fkk[b] = fk[t];
                    kv[b] = *(const float4 *)(Kst + t * DKP + i);
                    qv[b] = *(const float4 *)(Qst + t * DKP + i);
                }
#pragma unroll
                for (int b = 0; b < CB; b++) {
                    const int u = u0 + b, x = tid + u * GP_C, t = x / (DKP / 4), i = (x % (DKP / 4)) * 4;
                    float4 k4 = kv[b], q4 = qv[b];
                    k4.x *= wt[b];
                    k4.y *= wt[b];
                    k4.z *= wt[b];
                    k4.w *= wt[b];
                    q4.x *= wt[b];
                    q4.y *= wt[b];
                    q4.z *= wt[b];
                    q4.w *= wt[b];
                    *(uint2 *)(Kb + t * LDK + i) = make_uint2(pack_bf16x2(k4.x, k4.y), pack_bf16x2(k4.z, k4.w));
                    *(uint2 *)(Qb + t * LDK + i) = make_uint2(pack_bf16x2(q4.x, q4.y), pack_bf16x2(q4.z, q4.w));
                    mbr[u] = make_uint2(pack_bf16x2(k4.x * f[b], k4.y * f[b]), pack_bf16x2(k4.z * f[b], k4.w * f[b]));
                    qtr[u] = make_uint2(pack_bf16x2(q4.x * fqq[b], q4.y * fqq[b]), pack_bf16x2(q4.z * fqq[b], q4.w * fqq[b]));
                    ktr[u] = make_uint2(pack_bf16x2(k4.x * fkk[b], k4.y * fkk[b]), pack_bf16x2(k4.z * fkk[b], k4.w * fkk[b]));
                }
            }
            static_assert(CH * 32 % (GP_C * GP_VBATCH) == 0, "beta V batches");
#pragma unroll 1
            for (int x0 = tid; x0 < CH * 32; x0 += GP_C * GP_VBATCH) {
                float4 vv[GP_VBATCH];
                float f[GP_VBATCH];
#pragma unroll
                for (int b = 0; b < GP_VBATCH; b++) {
                    const int x = x0 + b * GP_C;
                    vv[b] = *(const float4 *)(Vst + (x >> 5) * 128 + (x & 31) * 4);
                    f[b] = be[x >> 5];
                }
#pragma unroll
                for (int b = 0; b < GP_VBATCH; b++) {
                    const int x = x0 + b * GP_C, t = x >> 5, j = (x & 31) * 4;
                    *(uint2 *)(Vb + t * LDV + j) =
                        make_uint2(pack_bf16x2(vv[b].x * f[b], vv[b].y * f[b]), pack_bf16x2(vv[b].z * f[b], vv[b].w * f[b]));
                }
            }
            nb_sync(GP_BC, GP_C); /* the staging is consumed */
            GPROF(3, 0);
            if (cc + 1 < nc) stage(ntok0, nlen); /* the next chunk streams in now */
            GPROF(4, 0);
            if (cc) nb_sync(GP_TV, GP_T); /* the state warps have read T of chunk c-1 */
            GPROF(5, 0);
            /* (d) K K^T and Q K^T on the 10 lower 16x16 blocks (row block rb, column block cb):
             * warp w takes block w, and of blocks 8 and 9 warps 0, 1 the K K^T and warps 2, 3 the
             * Q K^T (at most three products per warp); A's diagonal blocks in fp32 (Af), -A below
             * them in bf16 (T's place), Aqk's values kept in registers until GP_QAK */
            uint32_t aqr[2][4];
#pragma unroll
            for (int rep = 0; rep < 2; rep++) {
                const int bi = rep ? 8 + (w & 1) : w;
                const bool dokk = !rep || w < 2, doqk = !rep || (w >= 2 && w < 4);
#pragma unroll
                for (int e = 0; e < 4; e++) aqr[rep][e] = 0u;
                if (dokk || doqk) {
                    const int rb = (bi >= 1) + (bi >= 3) + (bi >= 6), cb = bi - rb * (rb + 1) / 2;
                    float kk[2][4], qk[2][4];
#pragma unroll
                    for (int n = 0; n < 2; n++)
#pragma unroll
                        for (int e = 0; e < 4; e++) kk[n][e] = qk[n][e] = 0.0f;
#pragma unroll
                    for (int kc = 0; kc < DKP / 16; kc++) {
                        uint32_t ak[4], aq[4], bf[2][2];
                        if (dokk) ldsm_frag_a(ak, Kb + (16 * rb) * LDK + kc * 16, LDK);
                        if (doqk) ldsm_frag_a(aq, Qb + (16 * rb) * LDK + kc * 16, LDK);
                        ldsm_frag_b2_nk(bf, Kb + (16 * cb) * LDK + kc * 16, LDK);
#pragma unroll
                        for (int n = 0; n < 2; n++) {
                            if (dokk) mma_bf16_16816(kk[n], ak, bf[n]);
                            if (doqk) mma_bf16_16816(qk[n], aq, bf[n]);
                        }
                    }
                    if (rep == 0) GPROF(18, 0);
                    if (rep == 1) GPROF(21, 0);
                    /* the epilogue: every value it reads from shared memory loaded first (eight
                     * loads in flight together instead of a load-store chain per element, which
                     * the compiler keeps in order since Af and Tb may alias bc and be), the
                     * off-diagonal T pairs stored as one 32-bit word */
                    const int r0 = 16 * rb + g, s0 = 16 * cb + 2 * tq;
                    const float bcr[2] = {bc[r0], bc[r0 + 8]}, ber[2] = {be[r0], be[r0 + 8]};
                    const float bcs[4] = {bc[s0], bc[s0 + 1], bc[s0 + 8], bc[s0 + 9]};
                    float av[2][4], tv[2][4];
#pragma unroll
                    for (int n = 0; n < 2; n++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const int r = r0 + (e >> 1) * 8, s = s0 + n * 8 + (e & 1);
                            const float gam = (s <= r) ? expf(bcr[e >> 1] - bcs[2 * n + (e & 1)]) : 0.0f;
                            tv[n][e] = (cb == rb) ? ((s < r) ? ber[e >> 1] * gam * kk[n][e] : 0.0f)
                                                  : -(ber[e >> 1] * gam * kk[n][e]);
                            av[n][e] = a.scale * gam * qk[n][e];
                        }
                    if (dokk) {
                        if (cb == rb) {
#pragma unroll
                            for (int n = 0; n < 2; n++)
#pragma unroll
                                for (int e = 0; e < 4; e++)
                                    Af[rb * 272 + (g + (e >> 1) * 8) * 17 + n * 8 + 2 * tq + (e & 1)] = tv[n][e];
                        } else {
#pragma unroll
                            for (int n = 0; n < 2; n++)
#pragma unroll
                                for (int h2 = 0; h2 < 2; h2++)
                                    *(uint32_t *)(Tb + (r0 + 8 * h2) * 72 + s0 + n * 8) = pack_bf16x2(tv[n][2 * h2], tv[n][2 * h2 + 1]);
                        }
                    }
                    if (doqk)
#pragma unroll
                        for (int n = 0; n < 2; n++) {
                            aqr[rep][2 * n] = pack_bf16x2(av[n][0], av[n][1]);
                            aqr[rep][2 * n + 1] = pack_bf16x2(av[n][2], av[n][3]);
                        }
                    if (rep == 0) GPROF(20, 0);
                }
            }
            GPROF(19, 0);
            nb_sync(GP_BC, GP_C);
            GPROF(6, 0);
            /* (e) diagonal blocks of T (warps 0-3); beta e^b K over K and q~ over q (every thread) */
            if (w < 4) {
                const int s = lane & 15;
                float x[16];
                gdn_diag_inverse_col(Af + w * 272, 17, s, x);
                if (lane < 16) {
#pragma unroll
                    for (int t = 0; t < 16; t++) Tb[(16 * w + t) * 72 + 16 * w + s] = __float2bfloat16_rn(x[t]);
                }
            }
#pragma unroll
            for (int u = 0; u < QI; u++) {
                const int x = tid + u * GP_C, t = x / (DKP / 4), i = (x % (DKP / 4)) * 4;
                *(uint2 *)(Mb + t * LDK + i) = mbr[u];
                *(uint2 *)(Qb + t * LDK + i) = qtr[u];
            }
            nb_sync(GP_BC, GP_C); /* T, beta e^b K, q~ complete */
            GPROF(7, 0);
            /* (f') W = T (beta e^b K): k_gdn_fused's forward substitution, key slab w */
            uint32_t xf[4][4];
            if (w < NB) {
#pragma unroll
                for (int i = 0; i < 4; i++) ldsm_frag_a_kn(xf[i], Mb + 16 * w + (16 * i) * LDK, LDK);
            }
            if (cc) nb_sync(GP_W, GP_T); /* the state warps have read W of chunk c-1 */
            GPROF(8, 0);
            if (w < NB) {
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    float xo[2][4];
                    fs_block_row(xf, Tb, i, xo);
#pragma unroll
                    for (int nt = 0; nt < 2; nt++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const int r = 16 * i + 8 * nt + 2 * tq + (e & 1), m = g + 8 * (e >> 1);
                            ((unsigned short *)Wb)[r * LDK + 16 * w + m] =
                                (unsigned short)(xf[i][2 * nt + (e >> 1)] >> (16 * (e & 1)));
                        }
                }
            }
            GPROF(9, 0);
            if (cc) nb_sync(GP_QAK, GP_T); /* the state warps are done with chunk c-1 */
            GPROF(10, 0);
#pragma unroll
            for (int u = 0; u < QI; u++) {
                const int x = tid + u * GP_C, t = x / (DKP / 4), i = (x % (DKP / 4)) * 4;
                *(uint2 *)(Kt + t * LDK + i) = ktr[u];
            }
#pragma unroll
            for (int rep = 0; rep < 2; rep++) {
                const int bi = rep ? 8 + (w & 1) : w;
                if (!rep || (w >= 2 && w < 4)) { /* the warps that formed these Aqk values */
                    const int rb = (bi >= 1) + (bi >= 3) + (bi >= 6), cb = bi - rb * (rb + 1) / 2;
#pragma unroll
                    for (int n = 0; n < 2; n++)
#pragma unroll
                        for (int e = 0; e < 4; e += 2) {
                            int r = 16 * rb + g + (e >> 1) * 8, s = 16 * cb + n * 8 + 2 * tq;
                            *(uint32_t *)(Aq + r * 72 + s) = aqr[rep][2 * n + (e >> 1)];
                        }
                }
            }
            nb_arrive(GP_TILES, GP_T); /* chunk c's tiles are complete */
            GPROF(11, 0);
            curlen = nlen;
        }
    } else {
        /* ================= state warps ================= */
        GP_SETMAXNREG("inc", GP_SREG);
        /* warp 8 + sw owns the value slabs 2 sw and 2 sw + 1 (32 value columns from j0): each B
         * fragment read from shared memory feeds both slabs' products. A slab past dv runs on
         * zeros (its staged columns are zero) and stores nothing: no branch on it, since values
         * loaded and used under two such branches stay live through the whole loop in ptxas */
        const int sw = w - GP_C / 32, j0 = jb + 32 * sw;
        float *S = a.S[z] + (size_t)h * dk * dv;
        float st[2][NKT][4]; /* S^T of slab s: (value j0 + 16 s + g + 8(e/2), key 8 kt + 2 tq + e%2) */
#pragma unroll
        for (int s = 0; s < 2; s++)
#pragma unroll
            for (int kt = 0; kt < NKT; kt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int i = 8 * kt + 2 * tq + (e & 1), j = j0 + 16 * s + g + 8 * (e >> 1);
                    st[s][kt][e] = (i < dk && j < dv) ? S[(size_t)i * dv + j] : 0.0f;
                }
        for (int cc = 0; cc < nc; cc++) {
            const int c = c0 + cc;
            const __nv_bfloat16 *Qb = Qbuf + (cc & 1) * (L::TK / 2);
            GPROF(12, GP_C);
            nb_sync(GP_TILES, GP_T);
            GPROF(13, GP_C);
            const int tok0 = a.ck_tok0[c], len = a.ck_len[c];
            /* per 16-token block i: U0^T by k_gdn_fused's (f') for each value slab (its C
             * fragments u0[s][nt]: value row, token 16i + 8nt + ..), then U^T = U0^T - S^T W^T for
             * the block, kept as the bf16 A fragment ua[s][i] (k = the block's tokens) */
            uint32_t ua[2][4][4];
#pragma unroll
            for (int s = 0; s < 2; s++) { /* one slab after the other, slab 1's V fragments loaded
                                           * after slab 0's U: 16 live registers fewer */
                uint32_t xf[4][4];
#pragma unroll
                for (int i = 0; i < 4; i++) ldsm_frag_a_kn(xf[i], Vb + 32 * sw + 16 * s + (16 * i) * LDV, LDV);
                if (s == 1 && cc + 1 < nc) nb_arrive(GP_VB, GP_T); /* beta V is in registers */
                /* S^T W^T for the chunk's four token blocks in one sweep over the keys (eight
                 * independent accumulator chains, each S^T pair packed once), then the blocks'
                 * forward substitution and U^T = U0^T - S^T W^T */
                float acc[4][2][4];
#pragma unroll
                for (int i = 0; i < 4; i++)
#pragma unroll
                    for (int nt = 0; nt < 2; nt++)
#pragma unroll
                        for (int e = 0; e < 4; e++) acc[i][nt][e] = 0.0f;
                const uint32_t zz = opaque_zero(decp + 2);
#pragma unroll
                for (int kc = 0; kc < NB; kc++) {
                    uint32_t sa[4];
                    st_frag(sa, st[s], kc, zz);
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        uint32_t bf[2][2];
                        ldsm_frag_b2_nk(bf, Wb + (16 * i) * LDK + 16 * kc, LDK);
                        mma_bf16_16816(acc[i][0], sa, bf[0]);
                        mma_bf16_16816(acc[i][1], sa, bf[1]);
                    }
                }
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    float u0[2][4];
                    fs_block_row(xf, Tb, i, u0);
                    ua[s][i][0] = pack_bf16x2(u0[0][0] - acc[i][0][0], u0[0][1] - acc[i][0][1]);
                    ua[s][i][1] = pack_bf16x2(u0[0][2] - acc[i][0][2], u0[0][3] - acc[i][0][3]);
                    ua[s][i][2] = pack_bf16x2(u0[1][0] - acc[i][1][0], u0[1][1] - acc[i][1][1]);
                    ua[s][i][3] = pack_bf16x2(u0[1][2] - acc[i][1][2], u0[1][3] - acc[i][1][3]);
                }
            }
            if (cc + 1 < nc) nb_arrive(GP_TV, GP_T);
            GPROF(14, GP_C);
            GPROF(15, GP_C);
            if (cc + 1 < nc) nb_arrive(GP_W, GP_T);
            {
                /* O^T = S^T q~^T + U^T Aqk^T, 32 tokens at a time (eight accumulator chains),
                 * stored from registers */
#pragma unroll 1
                for (int hf = 0; hf < 2; hf++) {
                    float oa[2][4][4];
#pragma unroll
                    for (int s = 0; s < 2; s++)
#pragma unroll
                        for (int n = 0; n < 4; n++)
#pragma unroll
                            for (int e = 0; e < 4; e++) oa[s][n][e] = 0.0f;
                    const uint32_t zz = opaque_zero(decp + 2);
#pragma unroll
                    for (int kc = 0; kc < NB; kc++) {
                        uint32_t sa[2][4];
#pragma unroll
                        for (int s = 0; s < 2; s++) st_frag(sa[s], st[s], kc, zz);
#pragma unroll
                        for (int q2 = 0; q2 < 2; q2++) {
                            uint32_t bf[2][2];
                            ldsm_frag_b2_nk(bf, Qb + (32 * hf + 16 * q2) * LDK + 16 * kc, LDK);
#pragma unroll
                            for (int s = 0; s < 2; s++) {
                                mma_bf16_16816(oa[s][2 * q2], sa[s], bf[0]);
                                mma_bf16_16816(oa[s][2 * q2 + 1], sa[s], bf[1]);
                            }
                        }
                    }
#pragma unroll
                    for (int kc = 0; kc < CH / 16; kc++) {
#pragma unroll
                        for (int q2 = 0; q2 < 2; q2++) {
                            uint32_t bf[2][2];
                            ldsm_frag_b2_nk(bf, Aq + (32 * hf + 16 * q2) * 72 + 16 * kc, 72);
#pragma unroll
                            for (int s = 0; s < 2; s++) {
                                mma_bf16_16816(oa[s][2 * q2], ua[s][kc], bf[0]);
                                mma_bf16_16816(oa[s][2 * q2 + 1], ua[s][kc], bf[1]);
                            }
                        }
                    }
#pragma unroll
                    for (int s = 0; s < 2; s++)
#pragma unroll
                        for (int n = 0; n < 4; n++)
#pragma unroll
                            for (int e = 0; e < 4; e++) {
                                int t = 32 * hf + 8 * n + 2 * tq + (e & 1), j = j0 + 16 * s + g + 8 * (e >> 1);
                                if (t < len && j < dv) a.o[((size_t)(tok0 + t) * H + h) * dv + j] = oa[s][n][e];
                            }
                }
                GPROF(16, GP_C);
                /* S^T = e^(bC) S^T + U^T k~ */
                const float d = decp[cc & 1];
#pragma unroll
                for (int s = 0; s < 2; s++)
#pragma unroll
                    for (int kt = 0; kt < NKT; kt++)
#pragma unroll
                        for (int e = 0; e < 4; e++) st[s][kt][e] *= d;
#pragma unroll
                for (int kc = 0; kc < CH / 16; kc++) {
#pragma unroll
                    for (int nb = 0; nb < NB; nb++) {
                        uint32_t bf[2][2];
                        ldsm_frag_b2_kn(bf, Kt + (16 * kc) * LDK + 16 * nb, LDK);
#pragma unroll
                        for (int s = 0; s < 2; s++) {
                            mma_bf16_16816(st[s][2 * nb], ua[s][kc], bf[0]);
                            mma_bf16_16816(st[s][2 * nb + 1], ua[s][kc], bf[1]);
                        }
                    }
                }
            }
            if (cc + 1 < nc) nb_arrive(GP_QAK, GP_T);
            GPROF(17, GP_C);
        }
        float *const *Sv = a.S;
        asm volatile("" : "+l"(Sv));
        S = Sv[z] + (size_t)h * dk * dv;
        /* the store's indices from an opaque zero: computed here, not kept live through the
         * chunk loop from the load above (~40 registers of addresses and predicates) */
        const int zo = (int)opaque_zero(decp + 2), tqz = tq + zo, j0z = j0 + g + zo;
#pragma unroll
        for (int s = 0; s < 2; s++)
#pragma unroll
            for (int kt = 0; kt < NKT; kt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int i = 8 * kt + 2 * tqz + (e & 1), j = j0z + 16 * s + 8 * (e >> 1);
                    if (i < dk && j < dv) S[(size_t)i * dv + j] = st[s][kt][e];
                }
    }
#ifdef HYLA_FUSED_PROFILE
    __syncthreads();
    if (nc > 21 && tid == 0 && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && atomicAdd(&g_pprof_once, 1) == 0) {
        long long *p = g_pprof_t, t0 = p[0];
        printf("pipe profile (cycles from the chunk warps' start of chunk 20): chunk warps: staged %lld, (b) %lld, "
               "(c) %lld, stage issued %lld, TV %lld, (d) %lld, (e) %lld, W %lld, (f') %lld, QAK %lld, tiles %lld; state "
               "warps (chunk 20): wait from %lld to %lld, U0+U %lld (%lld), O %lld, S %lld\n",
               p[1] - t0, p[2] - t0, p[3] - t0, p[4] - t0, p[5] - t0, p[6] - t0, p[7] - t0, p[8] - t0, p[9] - t0,
               p[10] - t0, p[11] - t0, p[12] - t0, p[13] - t0, p[14] - t0, p[15] - t0, p[16] - t0, p[17] - t0);
        printf("pipe profile: warp 0 in (d): block 0 products %lld, epilogue %lld; second product %lld, all done %lld\n",
               p[18] - t0, p[20] - t0, p[21] - t0, p[19] - t0);
    }
#endif
}

/* ---- fused GLA prefill: kernels A and B in one, the same bits ----
 * One block of 16 warps per (sequence, head, 128 value columns) walks the sequence's chunks in
 * order with the state in fp32 mma accumulators (kernel B's layout: each group of 4 warps owns
 * 32 value columns) and forms each chunk's kernel-A tiles itself in shared memory, so only q,
 * k, v, the gates and o (and the state at the end) cross global memory. Every tile value is
 * computed by kernel A's expression from the same fp32 inputs and every product is kernel B's
 * (same operands, same k order), so the results equal kernels A + B bit for bit; the backend
 * picks either by shape. Per chunk:
 *   (a)  wait for the chunk's staging (fp32 q, k, g [64][DKP] with 16-byte pieces XOR-swizzled
 *        by row so fragment reads hit distinct banks; v [64][128]; a row table of source rows
 *        and weights, which is how SSE rows are read through the plan's row map);
 *   (b)  every warp writes S^T (bf16) for its group; threads < DKP run kernel A's cumulative
 *        log decay in place (sequential in t, as kernel A) and the chunk decay; the others
 *        form V^T (bf16) and the next chunk's row table;
 *   (b') the next chunk's v is issued (its staging area is free now);
 *   (c)  warps 0-9: the 10 lower 16x16 blocks of Aqk, one each, operand fragments computed
 *        in registers from the staging (kernel A's reference-row form, exact exp on a diagonal
 *        block whose span exceeds GLA_SPAN_MAX); warps 10-15: q~, k~^T, the zero blocks;
 *   (c') the next chunk's q, k, g are issued;
 *   (d)  each group: O = q~ S + Aqk V, S = diag(e^(bC)) S + k~^T V.
 * Shared memory for dk = 128: 128 KB staging + 98 KB tiles (one block per SM). */
#define FG_T 512

template <int DKP>
struct GlaFusedSmem {
    static constexpr int LDK = DKP + 8;
    static constexpr size_t STG = (size_t)3 * CH * DKP * 4 + (size_t)CH * 128 * 4; /* Qst Kst Gst, Vst fp32 */
    static constexpr size_t QT = (size_t)CH * LDK * 2;                             /* q~ [64][LDK] */
    static constexpr size_t KT = (size_t)DKP * 72 * 2;                             /* k~^T [DKP][72] */
    static constexpr size_t AQ = (size_t)CH * 72 * 2;                              /* Aqk [64][72] */
    static constexpr size_t UT = (size_t)128 * 72 * 2;                             /* V^T [128][72] */
    static constexpr size_t SB = (size_t)4 * 32 * LDK * 2;                         /* S^T [4][32][LDK] */
    static constexpr size_t SM = (size_t)DKP * 4 + (size_t)2 * CH * 4 * 2;         /* dec, row tables */
    static constexpr size_t TOTAL = STG + QT + KT + AQ + UT + SB + SM;
};

/* element (t, i) of a [64][DKP] fp32 staging array: 16-byte piece i/4 XOR 2(t mod 4) */
template <int DKP>
__device__ __forceinline__ int fg_sw(int t, int i) {
    return t * DKP + ((((i >> 2) ^ (((t & 3) << 1) & (DKP / 4 - 1)))) << 2) + (i & 3);
}

template <int DKP>
__global__ void __launch_bounds__(FG_T, 1) k_gla_fused(ChunkArgs a) {
    typedef GlaFusedSmem<DKP> L;
    constexpr int LDK = L::LDK, MT = DKP / 16, MTW = (MT + 3) / 4;
    extern __shared__ __align__(16) unsigned char smem[];
    float *Qst = (float *)smem, *Kst = Qst + CH * DKP, *Gst = Kst + CH * DKP, *Vst = Gst + CH * DKP;
    unsigned char *sp_ = smem + L::STG;
    __nv_bfloat16 *Qt = (__nv_bfloat16 *)sp_;
    sp_ += L::QT;
    __nv_bfloat16 *KtT = (__nv_bfloat16 *)sp_;
    sp_ += L::KT;
    __nv_bfloat16 *Aq = (__nv_bfloat16 *)sp_;
    sp_ += L::AQ;
    __nv_bfloat16 *UTall = (__nv_bfloat16 *)sp_;
    sp_ += L::UT;
    __nv_bfloat16 *SbTall = (__nv_bfloat16 *)sp_;
    sp_ += L::SB;
    float *dec = (float *)sp_;                  /* [DKP] e^(bC) */
    int *rtok = (int *)(dec + DKP);             /* [2][64] source row: >= 0 dense, <= -2 sparse (-2 - row), -1 none */
    float *rwt = (float *)(rtok + 2 * CH);      /* [2][64] row weight (1 dense, 0 none) */

    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, tq = lane & 3;
    const int gq = w >> 2, wq = w & 3;
    const int h = blockIdx.y, z = blockIdx.z, H = a.H, dk = a.dk, dv = a.dv;
    const int jb = blockIdx.x * 128, j0 = jb + gq * 32;
    const bool active = j0 < dv;
    const int c0 = a.seq_c0[z], nc = a.seq_nc[z];
    if (nc <= 0) return; /* nothing selected this sequence: the state stays untouched */
    float *S = a.S[z] + (size_t)h * dk * dv;
    const bool vec = a.fvec;

    /* row t of chunk c -> table bsel (one thread per row) */
    auto rows = [&](int c, int bsel, int t) {
        int r = -1;
        float wt = 0.0f;
        if (t < a.ck_len[c]) {
            int sp = 0;
            size_t tok = chunk_row(a, a.ck_tok0[c] + t, sp, wt);
            r = sp ? -2 - (int)tok : (int)tok;
        }
        rtok[bsel * CH + t] = r;
        rwt[bsel * CH + t] = wt;
    };
    auto stage_v = [&](int bsel) {
        const int *rt = rtok + bsel * CH;
        if (vec) {
            for (int x = tid; x < CH * 32; x += FG_T) {
                int t = x >> 5, j = (x & 31) * 4, r = rt[t];
                bool ok = r != -1 && jb + j < dv;
                size_t tok = r >= 0 ? (size_t)r : (size_t)(-2 - r);
                cp_async16(Vst + t * 128 + j, ok ? a.v + (tok * H + h) * dv + jb + j : a.v, ok ? 16 : 0);
            }
            cp_async_commit();
        } else {
            for (int x = tid; x < CH * 128; x += FG_T) {
                int t = x >> 7, j = x & 127, r = rt[t];
                float vv = 0.0f;
                if (r != -1 && jb + j < dv) {
                    size_t tok = r >= 0 ? (size_t)r : (size_t)(-2 - r);
                    vv = a.v[(tok * H + h) * dv + jb + j];
                }
                Vst[t * 128 + j] = vv;
            }
        }
    };
    auto stage_qkg = [&](int bsel) {
        const int *rt = rtok + bsel * CH;
        if (vec) {
            for (int x = tid; x < CH * DKP / 4; x += FG_T) {
                int t = x / (DKP / 4), i = (x % (DKP / 4)) * 4, r = rt[t];
                bool ok = r != -1 && i < dk, sp = r < -1;
                size_t tok = r >= 0 ? (size_t)r : (size_t)(-2 - r);
                size_t off = (tok * H + h) * dk + i;
                int d = fg_sw<DKP>(t, i);
                cp_async16(Qst + d, ok ? (sp ? a.q2 : a.q) + off : a.q, ok ? 16 : 0);
                cp_async16(Kst + d, ok ? (sp ? a.k2 : a.k) + off : a.k, ok ? 16 : 0);
                cp_async16(Gst + d, ok ? (sp ? a.g2 : a.ga) + off : a.ga, ok ? 16 : 0);
            }
            cp_async_commit();
        } else {
            for (int x = tid; x < CH * DKP; x += FG_T) {
                int t = x / DKP, i = x % DKP, r = rt[t];
                float qv = 0.0f, kv = 0.0f, gv = 0.0f;
                if (r != -1 && i < dk) {
                    bool sp = r < -1;
                    size_t tok = r >= 0 ? (size_t)r : (size_t)(-2 - r);
                    size_t off = (tok * H + h) * dk + i;
                    qv = (sp ? a.q2 : a.q)[off];
                    kv = (sp ? a.k2 : a.k)[off];
                    gv = (sp ? a.g2 : a.ga)[off];
                }
                int d = fg_sw<DKP>(t, i);
                Qst[d] = qv;
                Kst[d] = kv;
                Gst[d] = gv;
            }
        }
    };

    float sacc[MTW][4][4];
#pragma unroll
    for (int mi = 0; mi < MTW; mi++) {
        int mt = wq + 4 * mi;
#pragma unroll
        for (int n = 0; n < 4; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int i = mt * 16 + g + (e >> 1) * 8, j = j0 + n * 8 + 2 * tq + (e & 1);
                sacc[mi][n][e] = (mt < MT && i < dk && j < dv) ? S[(size_t)i * dv + j] : 0.0f;
            }
    }
    if (tid >= FG_T - CH) rows(c0, 0, tid - (FG_T - CH));
    __syncthreads();
    stage_v(0);
    stage_qkg(0);
    __nv_bfloat16 *SbT = SbTall + gq * 32 * LDK;
    const __nv_bfloat16 *UT = UTall + gq * 32 * 72;
    for (int cc = 0; cc < nc; cc++) {
        const int c = c0 + cc, tok0 = a.ck_tok0[c], len = a.ck_len[c], bs = cc & 1;
        const float *wr = rwt + bs * CH;
        cp_async_wait<0>();
        __syncthreads(); /* (a) this chunk's staging is visible; the previous chunk's tiles are dead */
        /* (b) S^T of the state entering this chunk (kernel B's operand) */
        if (active) {
#pragma unroll
            for (int mi = 0; mi < MTW; mi++) {
                int mt = wq + 4 * mi;
                if (mt < MT)
#pragma unroll
                    for (int n = 0; n < 4; n++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            int i = mt * 16 + g + (e >> 1) * 8, jj = n * 8 + 2 * tq + (e & 1);
                            SbT[jj * LDK + i] = __float2bfloat16_rn(sacc[mi][n][e]);
                        }
            }
        }
        if (tid < DKP) { /* cumulative log decay of column i, in place (kernel A's order) */
            const int i = tid;
            float run = 0.0f;
#pragma unroll 8
            for (int t = 0; t < CH; t++) {
                const int d = fg_sw<DKP>(t, i);
                run += Gst[d];
                Gst[d] = run;
            }
            dec[i] = expf(run);
        } else {
            const int ht = tid - DKP, HT = FG_T - DKP;
            for (int x = ht; x < (CH / 2) * 128; x += HT) { /* V^T, rows t, t + 1 of column j */
                int t = 2 * (x >> 7), j = x & 127;
                *(uint32_t *)(UTall + j * 72 + t) = pack_bf16x2(Vst[t * 128 + j], Vst[(t + 1) * 128 + j]);
            }
            if (tid >= FG_T - CH && cc + 1 < nc) rows(c + 1, bs ^ 1, tid - (FG_T - CH));
        }
        __syncthreads();
        if (cc + 1 < nc) stage_v(bs ^ 1); /* (b') */
        /* (c) Aqk (warps 0-9) || q~, k~^T, zero blocks (warps 10-15) */
        if (w < 10) {
            const int wt = w < 1 ? 0 : (w < 3 ? 1 : (w < 6 ? 2 : 3)), rb = w - wt * (wt + 1) / 2, ref = 16 * wt;
            const bool diag = rb == wt;
            bool exact = false;
            if (diag) {
                float span = 0.0f;
                for (int i = lane; i < DKP; i += 32)
                    span = fmaxf(span, Gst[fg_sw<DKP>(ref, i)] - Gst[fg_sw<DKP>(ref + 15, i)]);
#pragma unroll
                for (int o = 16; o; o >>= 1) span = fmaxf(span, __shfl_xor_sync(0xffffffffu, span, o));
                exact = span > GLA_SPAN_MAX;
            }
            if (exact) {
                for (int x = lane; x < 256; x += 32) {
                    int r = x / 16, cs = x % 16, t = ref + r, s = ref + cs;
                    float sum = 0.0f;
                    if (cs <= r)
                        for (int i = 0; i < dk; i++) {
                            float qv = Qst[fg_sw<DKP>(t, i)] * wr[t], kv = Kst[fg_sw<DKP>(s, i)] * wr[s];
                            sum = fmaf(qv * kv, expf(Gst[fg_sw<DKP>(t, i)] - Gst[fg_sw<DKP>(s, i)]), sum);
                        }
                    Aq[t * 72 + s] = __float2bfloat16_rn(a.scale * sum);
                }
            } else {
                /* kernel A's operands: q_t e^(b_t - b_ref) (A, rows ref..) and k_s e^(b_ref - b_s)
                 * (B, rows s of block rb), as fragments */
                float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
                const float wa0 = wr[ref + g], wa1 = wr[ref + g + 8], wb0 = wr[rb * 16 + g], wb1 = wr[rb * 16 + 8 + g];
#pragma unroll 2
                for (int kc = 0; kc < DKP / 16; kc++) {
                    uint32_t af[4], bf[2][2];
#pragma unroll
                    for (int hf = 0; hf < 2; hf++) {
                        const int col = kc * 16 + 2 * tq + 8 * hf;
                        const float2 br = *(const float2 *)(Gst + fg_sw<DKP>(ref, col));
#pragma unroll
                        for (int rh = 0; rh < 2; rh++) {
                            const int t = ref + g + 8 * rh;
                            const float2 qv = *(const float2 *)(Qst + fg_sw<DKP>(t, col));
                            const float2 bt = *(const float2 *)(Gst + fg_sw<DKP>(t, col));
                            const float wq_ = rh ? wa1 : wa0;
                            af[2 * hf + rh] = pack_bf16x2((qv.x * wq_) * expf(bt.x - br.x), (qv.y * wq_) * expf(bt.y - br.y));
                        }
#pragma unroll
                        for (int n = 0; n < 2; n++) {
                            const int s = rb * 16 + n * 8 + g;
                            const float2 kv = *(const float2 *)(Kst + fg_sw<DKP>(s, col));
                            const float2 bsv = *(const float2 *)(Gst + fg_sw<DKP>(s, col));
                            const float wk = n ? wb1 : wb0;
                            bf[n][hf] = pack_bf16x2((kv.x * wk) * expf(br.x - bsv.x), (kv.y * wk) * expf(br.y - bsv.y));
                        }
                    }
                    mma_bf16_16816(acc[0], af, bf[0]);
                    mma_bf16_16816(acc[1], af, bf[1]);
                }
#pragma unroll
                for (int n = 0; n < 2; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int r = g + (e >> 1) * 8, cs = n * 8 + 2 * tq + (e & 1);
                        float v = (!diag || cs <= r) ? a.scale * acc[n][e] : 0.0f;
                        Aq[(ref + r) * 72 + rb * 16 + cs] = __float2bfloat16_rn(v);
                    }
            }
        } else {
            const int ht = tid - 320, HT = FG_T - 320;
            for (int x = ht; x < CH * DKP / 4; x += HT) { /* q~ = scale e^b q */
                int t = x / (DKP / 4), i = (x % (DKP / 4)) * 4, d = fg_sw<DKP>(t, i);
                float4 qv = *(const float4 *)(Qst + d), bt = *(const float4 *)(Gst + d);
                const float wq_ = wr[t];
                qv.x *= wq_;
                qv.y *= wq_;
                qv.z *= wq_;
                qv.w *= wq_;
                *(uint2 *)(Qt + t * LDK + i) =
                    make_uint2(pack_bf16x2(qv.x * a.scale * expf(bt.x), qv.y * a.scale * expf(bt.y)),
                               pack_bf16x2(qv.z * a.scale * expf(bt.z), qv.w * a.scale * expf(bt.w)));
            }
            for (int x = ht; x < (CH / 2) * DKP; x += HT) { /* k~^T = (e^(bC - b) k)^T, rows t, t + 1 */
                int t = 2 * (x / DKP), i = x % DKP;
                const float bC = Gst[fg_sw<DKP>(CH - 1, i)];
                const int d0 = fg_sw<DKP>(t, i), d1 = fg_sw<DKP>(t + 1, i);
                float k0 = (Kst[d0] * wr[t]) * expf(bC - Gst[d0]), k1 = (Kst[d1] * wr[t + 1]) * expf(bC - Gst[d1]);
                *(uint32_t *)(KtT + i * 72 + t) = pack_bf16x2(k0, k1);
            }
            for (int x = ht; x < CH * CH; x += HT) { /* Aqk above the diagonal blocks */
                int r = x >> 6, s = x & 63;
                if ((s >> 4) > (r >> 4)) Aq[r * 72 + s] = __float2bfloat16_rn(0.0f);
            }
        }
        __syncthreads();
        if (cc + 1 < nc) stage_qkg(bs ^ 1); /* (c') the staging area is free: the next chunk streams in now */
        /* (d) this group's 32 value columns: O = q~ S + Aqk V, S = e^(bC) S + k~^T V */
        if (active) {
            float oacc[4][4];
#pragma unroll
            for (int n = 0; n < 4; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) oacc[n][e] = 0.0f;
            mma_16x32<DKP>(oacc, Qt + (16 * wq) * LDK, LDK, SbT, LDK);
            mma_16x32<CH>(oacc, Aq + (16 * wq) * 72, 72, UT, 72);
#pragma unroll
            for (int n = 0; n < 4; n++)
#pragma unroll
                for (int e = 0; e < 4; e += 2) {
                    int t = 16 * wq + g + (e >> 1) * 8, j = j0 + n * 8 + 2 * tq;
                    float *op = a.o + ((size_t)(tok0 + t) * H + h) * dv + j;
                    if (t < len && j < dv) {
                        if (a.ovec) {
                            *(float2 *)op = make_float2(oacc[n][e], oacc[n][e + 1]);
                        } else {
                            op[0] = oacc[n][e];
                            if (j + 1 < dv) op[1] = oacc[n][e + 1];
                        }
                    }
                }
#pragma unroll
            for (int mi = 0; mi < MTW; mi++) {
                int mt = wq + 4 * mi;
                if (mt < MT) {
                    const float d0 = dec[mt * 16 + g], d1 = dec[mt * 16 + g + 8];
#pragma unroll
                    for (int n = 0; n < 4; n++) {
                        sacc[mi][n][0] *= d0;
                        sacc[mi][n][1] *= d0;
                        sacc[mi][n][2] *= d1;
                        sacc[mi][n][3] *= d1;
                    }
                    mma_16x32<CH>(sacc[mi], KtT + (mt * 16) * 72, 72, UT, 72);
                }
            }
        }
    }
#pragma unroll
    for (int mi = 0; mi < MTW; mi++) {
        int mt = wq + 4 * mi;
#pragma unroll
        for (int n = 0; n < 4; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int i = mt * 16 + g + (e >> 1) * 8, j = j0 + n * 8 + 2 * tq + (e & 1);
                if (mt < MT && i < dk && j < dv) S[(size_t)i * dv + j] = sacc[mi][n][e];
            }
    }
}

static size_t smem_a_gdn(int dkp, int dvp) {
    return (size_t)2 * CH * (dkp + 8) * 2 + (size_t)CH * (dvp + 8) * 2 + (size_t)CH * 72 * 2 + (size_t)2 * CH * 65 * 4 +
           (size_t)2 * CH * 4 + (size_t)16 * 49 * 4;
}
static size_t smem_a_gla(int dkp) { return (size_t)CH * dkp * 4 + (size_t)2 * 4 * 16 * (dkp + 8) * 2; }
static size_t smem_b(int dkp, int gdn, int st) {
    size_t stage = (size_t)CH * (dkp + 8) * (gdn ? 2 : 1) + (size_t)dkp * 72 + (size_t)CH * 72 + (size_t)dkp * 2;
    return (stage * st + (size_t)32 * (dkp + 8) + (size_t)32 * 72) * 2;
}

template <int DKP, int GDN, int ST>
static hyla_status launch_b(hyla_cuda_ctx *c, const ChunkArgs &ca, int nseq) {
    size_t sb = smem_b(DKP, GDN, ST);
    CU_TRY(cudaFuncSetAttribute(k_chunk_b<DKP, GDN, ST>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sb));
    k_chunk_b<DKP, GDN, ST><<<dim3(cu_blocks(ca.dv, 32), ca.H, nseq), 128, sb, c->stream>>>(ca);
    CU_LAUNCH_CHECK("chunk B");
    return HYLA_OK;
}

template <int DKP>
static hyla_status launch_chunked(hyla_cuda_ctx *c, const ChunkArgs &ca, int gdn, int NC, int nseq, int dvp) {
    dim3 ga(NC, ca.H);
    if (gdn) {
        size_t sm = smem_a_gdn(DKP, dvp);
        CU_TRY(cudaFuncSetAttribute(k_gdn_chunk_a<DKP>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
        if (c->chunk_phase != 2) k_gdn_chunk_a<DKP><<<ga, 128, sm, c->stream>>>(ca, dvp);
        CU_LAUNCH_CHECK("gdn chunk A");
        if (c->chunk_phase == 1) return HYLA_OK;
        if (smem_b(DKP, 1, 2) <= c->smem_optin) return launch_b<DKP, 1, 2>(c, ca, nseq);
        return launch_b<DKP, 1, 1>(c, ca, nseq);
    } else {
        size_t sm = smem_a_gla(DKP);
        CU_TRY(cudaFuncSetAttribute(k_gla_chunk_a<DKP>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
        if (c->chunk_phase != 2) k_gla_chunk_a<DKP><<<ga, 128, sm, c->stream>>>(ca);
        CU_LAUNCH_CHECK("gla chunk A");
        if (c->chunk_phase == 1) return HYLA_OK;
        if (smem_b(DKP, 0, 2) <= c->smem_optin) return launch_b<DKP, 0, 2>(c, ca, nseq);
        return launch_b<DKP, 0, 1>(c, ca, nseq);
    }
    return HYLA_OK;
}

/* The fused kernel (mode 0), or its chunk part (mode 1: all chunks in parallel, tiles to the
 * scratch) followed by kernel B: the same bits, for few long sequences where one block per
 * (sequence, head) would leave most SMs idle. */
/* The fused pass's forms, all with the same bits. By default (HYLA_CUDA_GDN_WS unset) the
 * pipelined kernel k_gdn_pipe in an sm_90a build (H100 runs 55-57: 8 x 8192 varlen 0.95-0.96 ms;
 * through SSE's row map, one bulk copy per row, SSE-GDN 32k 5.35 ms windows / 4.39 plain against
 * the WS = 3 form's 6.37 / 6.34), else the WS = 3 form. =4 the pipelined kernel wherever it fits
 * (in a plain sm_90 build too, where it has no register hand-over); =3 the warp-specialised form
 * whose producer warpgroup (4 warps, each a quarter of the chunk's rows) stages v, g, beta of the
 * next chunk and stores o from a shared-memory O tile while the compute warps issue its q, k right
 * after releasing the staging (run 56: 1.47 ms); =2 the warpgroup stages everything (1.56 / 6.55-6.63
 * in run 34's code); =1 one producer warp (slower); =0 every warp stages (the first fused form).
 * Read per launch (host side only) so tests can compare. Returns -1 for the default. */
static int gdn_ws_mode(void) {
    const char *e = getenv("HYLA_CUDA_GDN_WS");
    if (!e || !*e) return -1;
    return strcmp(e, "0") == 0 ? 0 : strcmp(e, "1") == 0 ? 1 : strcmp(e, "2") == 0 ? 2 : strcmp(e, "4") == 0 ? 4 : 3;
}

/* HYLA_CUDA_GDN_FS (default 1): the fused pass (all WS forms) and its split form form W and U0
 * by blocked forward substitution on tensor cores (phase (f'), k_gdn_fused<.., FS = 1>; H100 run
 * 29: 8 x 8192 varlen 1.59 ms, SSE-GDN 32k 6.51 ms); =0: T's off-diagonal blocks in fp32 and T
 * times the tiles, as before (1.75 / 7.50 ms in the same run). The two differ by rounding (FS = 1
 * rounds A and the intermediate blocks to bf16) and each is the same bits in all of its forms.
 * Read per launch (host side only) so tests can compare; a malformed value warns once and keeps
 * the default. */
static int gdn_fs_mode(void) {
    const char *e = getenv("HYLA_CUDA_GDN_FS");
    if (!e || !*e || strcmp(e, "1") == 0) return 1; /* the default since run 29 (1.59 vs 1.75 ms) */
    if (strcmp(e, "0") == 0) return 0;
    static int warned;
    if (!warned++) HYLA_WARN("HYLA_CUDA_GDN_FS='%s' is not 0 or 1: using 1", e);
    return 1;
}

/* The pipelined pass's tensor maps of q, k, v (3-D: {columns, head, row}; boxes of one head's 64
 * rows, DKP key columns or 128 value columns; out-of-range elements read as zero), through the
 * driver's cuTensorMapEncodeTiled (found once at run time; without it the kernel copies rows).
 * Returns 0 where a map cannot be made (then rows). */
static int pipe_maps(PipeMaps *pm, const ChunkArgs &ca, int dkp) {
    static PFN_cuTensorMapEncodeTiled_v12000 enc;
    static int looked;
    if (!looked) {
        looked = 1;
        void *fn = NULL;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) == cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            enc = (PFN_cuTensorMapEncodeTiled_v12000)fn;
        else
            (void)cudaGetLastError();
    }
    if (!enc || ca.nrows <= 0 || ca.nrows > 0x7fffffffLL) return 0;
    const cuuint32_t es[3] = {1, 1, 1};
    const float *src[3] = {ca.q, ca.k, ca.v};
    CUtensorMap *dst[3] = {&pm->q, &pm->k, &pm->v};
    for (int x = 0; x < 3; x++) {
        const cuuint64_t cols = x < 2 ? (cuuint64_t)ca.dk : (cuuint64_t)ca.dv;
        const cuuint64_t dim[3] = {cols, (cuuint64_t)ca.H, (cuuint64_t)ca.nrows};
        const cuuint64_t str[2] = {cols * 4, cols * 4 * (cuuint64_t)ca.H};
        const cuuint32_t box[3] = {x < 2 ? (cuuint32_t)dkp : 128u, 1u, (cuuint32_t)CH};
        if (enc(dst[x], CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, (void *)src[x], dim, str, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
            return 0;
    }
    return 1;
}

template <int DKP, int FS>
static hyla_status launch_fused_fs(hyla_cuda_ctx *c, const ChunkArgs &ca, int NC, int nseq, int split) {
    /* FS = 1 never needs more than the default without WS (what cu_gdn_fused_ok checks) */
    static_assert(FusedSmem<DKP, 0, FS>::TOTAL <= FusedSmem<DKP>::TOTAL, "FS shared memory");
    const size_t sm = FusedSmem<DKP, 0, FS>::TOTAL;
    const unsigned ncb = cu_blocks(ca.dv, 128);
    int ws = split ? 0 : gdn_ws_mode();
    if (ws < 0) ws = GP_BUILT_SM90A ? 4 : 3; /* the default (gdn_ws_mode) */
    if (ws == 4 && FS && ca.vec4 && ca.dv % 4 == 0 && PipeSmem<DKP>::TOTAL <= c->smem_optin) {
        const size_t sp = PipeSmem<DKP>::TOTAL;
        PipeMaps pm;
        memset(&pm, 0, sizeof pm);
        pm.use = !ca.rsrc && ca.nrows > 0 && pipe_maps(&pm, ca, DKP);
        CU_TRY(cudaFuncSetAttribute(k_gdn_pipe<DKP>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sp));
        k_gdn_pipe<DKP><<<dim3(ncb, ca.H, nseq), GP_T, sp, c->stream>>>(ca, pm);
        CU_LAUNCH_CHECK("gdn fused chunk (pipelined)");
        return HYLA_OK;
    }
    if (ws == 4) ws = 3; /* the pipelined kernel does not apply: the WS = 3 form */
    if (ws && ca.vec4 && ca.dv % 4 == 0 && ((uintptr_t)ca.o & 15) == 0 && FusedSmem<DKP, 1, FS>::TOTAL <= c->smem_optin) {
        const size_t sw = FusedSmem<DKP, 1, FS>::TOTAL; /* the same layout for WS = 1 and 2 */
        if (ws == 2) {
            CU_TRY(cudaFuncSetAttribute(k_gdn_fused<DKP, 0, 2, FS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sw));
            k_gdn_fused<DKP, 0, 2, FS><<<dim3(ncb, ca.H, nseq), FU_WTN(2), sw, c->stream>>>(ca);
            CU_LAUNCH_CHECK("gdn fused chunk (ws2)");
        } else if (ws >= 3) {
            CU_TRY(cudaFuncSetAttribute(k_gdn_fused<DKP, 0, 3, FS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sw));
            k_gdn_fused<DKP, 0, 3, FS><<<dim3(ncb, ca.H, nseq), FU_WTN(3), sw, c->stream>>>(ca);
            CU_LAUNCH_CHECK("gdn fused chunk (ws3)");
        } else {
            CU_TRY(cudaFuncSetAttribute(k_gdn_fused<DKP, 0, 1, FS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sw));
            k_gdn_fused<DKP, 0, 1, FS><<<dim3(ncb, ca.H, nseq), FU_WTN(1), sw, c->stream>>>(ca);
            CU_LAUNCH_CHECK("gdn fused chunk (ws)");
        }
        return HYLA_OK;
    }
    if (!split) {
        CU_TRY(cudaFuncSetAttribute(k_gdn_fused<DKP, 0, 0, FS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
        k_gdn_fused<DKP, 0, 0, FS><<<dim3(ncb, ca.H, nseq), FU_T, sm, c->stream>>>(ca);
        CU_LAUNCH_CHECK("gdn fused chunk");
        return HYLA_OK;
    }
    CU_TRY(cudaFuncSetAttribute(k_gdn_fused<DKP, 1, 0, FS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
    k_gdn_fused<DKP, 1, 0, FS><<<dim3(NC, ca.H, ncb), FU_T, sm, c->stream>>>(ca);
    CU_LAUNCH_CHECK("gdn chunk tiles");
    if (smem_b(DKP, 1, 2) <= c->smem_optin) return launch_b<DKP, 1, 2>(c, ca, nseq);
    return launch_b<DKP, 1, 1>(c, ca, nseq);
}

template <int DKP>
static hyla_status launch_fused(hyla_cuda_ctx *c, const ChunkArgs &ca, int NC, int nseq, int split) {
    return gdn_fs_mode() ? launch_fused_fs<DKP, 1>(c, ca, NC, nseq, split) : launch_fused_fs<DKP, 0>(c, ca, NC, nseq, split);
}

/* The fused GLA pass (one block per sequence, head and 128 value columns): the bits of kernels
 * A and B. */
template <int DKP>
static hyla_status launch_gla_fused(hyla_cuda_ctx *c, const ChunkArgs &ca, int nseq) {
    const size_t sm = GlaFusedSmem<DKP>::TOTAL;
    CU_TRY(cudaFuncSetAttribute(k_gla_fused<DKP>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
    k_gla_fused<DKP><<<dim3(cu_blocks(ca.dv, 128), ca.H, nseq), FG_T, sm, c->stream>>>(ca);
    CU_LAUNCH_CHECK("gla fused chunk");
    return HYLA_OK;
}

static size_t gla_fused_smem(int dkp) {
    switch (dkp) {
    case 16: return GlaFusedSmem<16>::TOTAL;
    case 32: return GlaFusedSmem<32>::TOTAL;
    case 64: return GlaFusedSmem<64>::TOTAL;
    case 128: return GlaFusedSmem<128>::TOTAL;
    default: return (size_t)-1;
    }
}

static size_t fused_smem(int dkp) {
    switch (dkp) {
    case 16: return FusedSmem<16>::TOTAL;
    case 32: return FusedSmem<32>::TOTAL;
    case 64: return FusedSmem<64>::TOTAL;
    case 128: return FusedSmem<128>::TOTAL;
    default: return (size_t)-1;
    }
}

static int pow2_dkp(int dk) {
    int d = 16;
    while (d < dk) d *= 2;
    return d;
}

/* GDN runs the fused kernel for dk <= 128 unless HYLA_CUDA_CHUNK=ab or a kernel-phase timing
 * asks for kernels A and B. The choice depends on the shapes only, so every call of a sequence
 * (and each of its 64-token pieces) takes the same path. */
extern "C" int cu_gdn_fused_ok(hyla_cuda_ctx *c, int dk) {
    const int dkp = pow2_dkp(dk);
    return c->prefill_mode == 0 && c->chunk_mode != 1 && c->chunk_phase == 0 && dkp <= 128 &&
           fused_smem(dkp) <= c->smem_optin && smem_b(dkp, 1, 1) <= c->smem_optin;
}

/* GLA likewise (dk <= 128; HYLA_CUDA_CHUNK=ab and kernel-phase timings use kernels A and B). */
extern "C" int cu_gla_fused_ok(hyla_cuda_ctx *c, int dk) {
    const int dkp = pow2_dkp(dk);
    return c->prefill_mode == 0 && c->chunk_mode != 1 && c->chunk_phase == 0 && dkp <= 128 &&
           gla_fused_smem(dkp) <= c->smem_optin && smem_a_gla(dkp) <= c->smem_optin &&
           smem_b(dkp, 0, 1) <= c->smem_optin;
}

extern "C" int cu_lin_fused_ok(hyla_cuda_ctx *c, int gdn, int dk) {
    return gdn ? cu_gdn_fused_ok(c, dk) : cu_gla_fused_ok(c, dk);
}

extern "C" int cu_linattn_chunked_ok(hyla_cuda_ctx *c, int gdn, int H, int dk, int dv, int nseq) {
    const int dkp = pow2_dkp(dk), dvp = (dv + 15) / 16 * 16;
    if (cu_lin_fused_ok(c, gdn, dk) && H <= 65535 && nseq <= 65535) return 1;
    int ok = c->prefill_mode == 0 && dkp <= 256 && dv <= 1024 && H <= 65535 && nseq <= 65535;
    if (ok && gdn && smem_a_gdn(dkp, dvp) > c->smem_optin) ok = 0;
    if (ok && smem_b(dkp, gdn, 1) > c->smem_optin) ok = 0;
    if (ok && !gdn && smem_a_gla(dkp) > c->smem_optin) ok = 0;
    return ok;
}

extern "C" hyla_status cu_linattn_chunked_rm(hyla_cuda_ctx *c, int gdn, int H, int dk, int dv, float scale,
                                             const float *q, const float *k, const float *v, const float *ga,
                                             const float *gb, float *o, int NC, int nseq, const int32_t *d_tok0,
                                             const int32_t *d_len, const int32_t *d_c0, const int32_t *d_nc,
                                             float *const *d_S, const hyla_cu_rowmap *rm, long long nrows) {
    if (NC <= 0 || nseq <= 0) return HYLA_OK;
    const int dkp = pow2_dkp(dk), dvp = (dv + 15) / 16 * 16;
    ChunkArgs ca;
    memset(&ca, 0, sizeof ca);
    ca.H = H;
    ca.dk = dk;
    ca.dv = dv;
    ca.dkp = dkp;
    ca.scale = scale;
    ca.q = q;
    ca.k = k;
    ca.v = v;
    ca.ga = ga;
    ca.gb = gb;
    ca.o = o;
    ca.vec4 = dk % 4 == 0 && ((uintptr_t)q & 15) == 0 && ((uintptr_t)k & 15) == 0 && ((uintptr_t)v & 15) == 0;
    if (rm) {
        ca.rsrc = rm->src;
        ca.rdense = rm->ndense;
        ca.rK = rm->K;
        ca.rw = rm->w;
        ca.q2 = rm->q2;
        ca.k2 = rm->k2;
        ca.g2 = rm->g2;
        ca.b2 = rm->b2;
        ca.vec4 = ca.vec4 && ((uintptr_t)rm->q2 & 15) == 0 && ((uintptr_t)rm->k2 & 15) == 0;
    }
    ca.fvec = ca.vec4 && dv % 4 == 0 && ((uintptr_t)ga & 15) == 0 && (!rm || ((uintptr_t)rm->g2 & 15) == 0);
    ca.ovec = dv % 2 == 0 && ((uintptr_t)o & 7) == 0;
    ca.nrows = nrows;
    ca.ck_tok0 = d_tok0;
    ca.ck_len = d_len;
    ca.seq_c0 = d_c0;
    ca.seq_nc = d_nc;
    ca.S = d_S;
    /* fused GDN: one pass, or (split) its chunk part over all chunks then kernel B, where the
     * sequences are few and long: fewer (sequence, head, value block) blocks than half the SMs
     * and more than 4 chunks per sequence on average. Both give the same bits. GLA: the fused
     * pass, or kernels A and B in the split case (the same bits again); with a row map always
     * the fused pass (kernel B reads v by packed row). */
    const int fused = cu_lin_fused_ok(c, gdn, dk);
    int split = 0;
    if (fused) {
        size_t blocks = (size_t)nseq * H * cu_blocks(dv, 128);
        split = c->chunk_mode == 3 || (c->chunk_mode != 2 && NC > 4 * nseq && blocks < (size_t)c->sm_count / 2);
        if (!gdn && rm) split = 0;
        if (!split && !gdn) {
            switch (dkp) {
            case 16: return launch_gla_fused<16>(c, ca, nseq);
            case 32: return launch_gla_fused<32>(c, ca, nseq);
            case 64: return launch_gla_fused<64>(c, ca, nseq);
            default: return launch_gla_fused<128>(c, ca, nseq);
            }
        }
        if (!split) {
            switch (dkp) {
            case 16: return launch_fused<16>(c, ca, NC, nseq, 0);
            case 32: return launch_fused<32>(c, ca, NC, nseq, 0);
            case 64: return launch_fused<64>(c, ca, NC, nseq, 0);
            default: return launch_fused<128>(c, ca, NC, nseq, 0);
            }
        }
    }
    if (rm && !fused) return hyla_fail(HYLA_ERR_UNSUPPORTED, "linear attention: a row map needs a fused kernel");
    /* scratch: per (chunk, head) tiles */
    size_t nch = (size_t)NC * H;
    size_t sz_qt = nch * CH * dkp * 2, sz_aqk = nch * CH * CH * 2, sz_u0 = gdn ? nch * CH * dv * 4 : 0;
    size_t sz_w = gdn ? sz_qt : 0, sz_dec = nch * dkp * 4;
#define AL(x) (((x) + 255) & ~(size_t)255)
    size_t total = AL(sz_qt) * 2 + AL(sz_w) + AL(sz_aqk) + AL(sz_u0) + AL(sz_dec);
    void *scr;
    HYLA_TRY(cu_scratch(c, SCR_CHUNK, total, &scr));
    uint8_t *p = (uint8_t *)scr;
    ca.qt = (__nv_bfloat16 *)p;
    p += AL(sz_qt);
    ca.ktT = (__nv_bfloat16 *)p;
    p += AL(sz_qt);
    ca.wt = (__nv_bfloat16 *)p;
    p += AL(sz_w);
    ca.aqk = (__nv_bfloat16 *)p;
    p += AL(sz_aqk);
    ca.u0 = (float *)p;
    p += AL(sz_u0);
    ca.dec = (float *)p;
#undef AL
    if (split && gdn) {
        switch (dkp) {
        case 16: return launch_fused<16>(c, ca, NC, nseq, 1);
        case 32: return launch_fused<32>(c, ca, NC, nseq, 1);
        case 64: return launch_fused<64>(c, ca, NC, nseq, 1);
        default: return launch_fused<128>(c, ca, NC, nseq, 1);
        }
    }
    switch (dkp) {
    case 16: return launch_chunked<16>(c, ca, gdn, NC, nseq, dvp);
    case 32: return launch_chunked<32>(c, ca, gdn, NC, nseq, dvp);
    case 64: return launch_chunked<64>(c, ca, gdn, NC, nseq, dvp);
    case 128: return launch_chunked<128>(c, ca, gdn, NC, nseq, dvp);
    default: return launch_chunked<256>(c, ca, gdn, NC, nseq, dvp);
    }
}

extern "C" hyla_status cu_linattn_chunked_dev(hyla_cuda_ctx *c, int gdn, int H, int dk, int dv, float scale,
                                              const float *q, const float *k, const float *v, const float *ga,
                                              const float *gb, float *o, int NC, int nseq, const int32_t *d_tok0,
                                              const int32_t *d_len, const int32_t *d_c0, const int32_t *d_nc,
                                              float *const *d_S, long long nrows) {
    return cu_linattn_chunked_rm(c, gdn, H, dk, dv, scale, q, k, v, ga, gb, o, NC, nseq, d_tok0, d_len, d_c0, d_nc,
                                 d_S, NULL, nrows);
}

extern "C" hyla_status cu_linattn_prefill_batch(hyla_cuda_ctx *c, const hyla_cu_linattn_batch *b) {
    const int H = b->H, dk = b->dk, dv = b->dv;
    if (b->nseq <= 0) return HYLA_OK;
    if (H <= 0 || dk <= 0 || dv <= 0) return hyla_fail(HYLA_ERR_INVALID_ARG, "linear attention: H=%d dk=%d dv=%d", H, dk, dv);
    if (!cu_linattn_chunked_ok(c, b->gdn, H, dk, dv, b->nseq)) {
        /* token loop, one sequence at a time */
        for (int z = 0; z < b->nseq; z++) {
            if (b->h_len[z] <= 0) continue;
            void *d_s;
            HYLA_TRY(cu_stage(c, &b->h_S[z], sizeof(float *), &d_s));
            size_t st = (size_t)b->h_start[z];
            hyla_cu_linrec r;
            memset(&r, 0, sizeof r);
            r.gdn = b->gdn;
            r.H = H;
            r.dk = dk;
            r.dv = dv;
            r.scale = b->scale;
            r.ntok = b->h_len[z];
            r.q1 = b->q + st * H * dk;
            r.k1 = b->k + st * H * dk;
            r.v = b->v + st * H * dv;
            r.ga = b->gdn ? b->ga + st * H : b->ga + st * H * dk;
            r.betaa = b->gdn ? b->gb + st * H : NULL;
            r.o = b->o + st * H * dv;
            r.S0 = (float *const *)d_s;
            r.states16 = ((uintptr_t)b->h_S[z] & 15) == 0;
            HYLA_TRY(cu_lin_recurrent(c, &r, 1));
        }
        return HYLA_OK;
    }
    /* chunk tables */
    int NC = 0;
    for (int z = 0; z < b->nseq; z++) NC += b->h_nck ? b->h_nck[z] : (b->h_len[z] + CH - 1) / CH;
    size_t nint = (size_t)2 * NC + 2 * (size_t)b->nseq;
    int32_t *tab = (int32_t *)malloc((nint ? nint : 1) * sizeof(int32_t));
    if (!tab) return hyla_fail(HYLA_ERR_NOMEM, "linear attention: out of host memory");
    int32_t *tok0 = tab, *lenv = tab + NC, *sc0 = tab + 2 * NC, *snc = sc0 + b->nseq;
    int ci = 0, cl = 0;
    for (int z = 0; z < b->nseq; z++) {
        sc0[z] = ci;
        int n = b->h_len[z] > 0 ? b->h_len[z] : 0;
        if (b->h_nck) {
            snc[z] = b->h_nck[z];
            int s = 0;
            for (int q = 0; q < b->h_nck[z]; q++) {
                tok0[ci] = b->h_start[z] + s;
                lenv[ci] = b->h_cklen[cl++];
                s += lenv[ci];
                ci++;
            }
        } else {
            snc[z] = (n + CH - 1) / CH;
            for (int s = 0; s < n; s += CH) {
                tok0[ci] = b->h_start[z] + s;
                lenv[ci] = n - s < CH ? n - s : CH;
                ci++;
            }
        }
    }
    void *d_tab, *d_S;
    hyla_status st = cu_stage_reserve(c, nint * sizeof(int32_t) + (size_t)b->nseq * sizeof(float *), 2);
    if (st == HYLA_OK) st = cu_stage(c, tab, nint * sizeof(int32_t), &d_tab);
    free(tab);
    HYLA_TRY(st);
    HYLA_TRY(cu_stage(c, b->h_S, (size_t)b->nseq * sizeof(float *), &d_S));
    const int32_t *dt = (const int32_t *)d_tab;
    long long nrows = 0; /* rows the packed inputs hold: up to the end of the last sequence */
    for (int z = 0; z < b->nseq; z++)
        if (b->h_len[z] > 0 && (long long)b->h_start[z] + b->h_len[z] > nrows) nrows = (long long)b->h_start[z] + b->h_len[z];
    return cu_linattn_chunked_dev(c, b->gdn, H, dk, dv, b->scale, b->q, b->k, b->v, b->ga, b->gb, b->o, NC, b->nseq,
                                  dt, dt + NC, dt + 2 * NC, dt + 2 * NC + b->nseq, (float *const *)d_S, nrows);
}

/* One sequence of n tokens (the gla/gdn_prefill ops): its chunk tables and state pointer in one
 * block [tok0 NC][len NC][c0][nc] int32, then the state pointer at an 8-byte boundary. */
extern "C" size_t cu_lin_prefill1_block(int n, float *S, void *blk) {
    int NC = (n + CH - 1) / CH;
    size_t sp = ((size_t)(2 * NC + 2) * 4 + 7) & ~(size_t)7;
    if (blk) {
        int32_t *t = (int32_t *)blk;
        for (int i = 0; i < NC; i++) {
            t[i] = i * CH;
            t[NC + i] = n - i * CH < CH ? n - i * CH : CH;
        }
        t[2 * NC] = 0;
        t[2 * NC + 1] = NC;
        for (size_t x = (size_t)(2 * NC + 2) * 4; x < sp; x++) ((uint8_t *)blk)[x] = 0;
        memcpy((uint8_t *)blk + sp, &S, sizeof S);
    }
    return sp + sizeof(float *);
}

extern "C" hyla_status cu_lin_prefill1_dev(hyla_cuda_ctx *c, int gdn, const float *q, const float *k, const float *v,
                                           const float *ga, const float *gb, int n, int H, int dk, int dv, float scale,
                                           const void *d_blk, int states16, float *o) {
    if (n <= 0) return HYLA_OK;
    int NC = (n + CH - 1) / CH;
    size_t sp = ((size_t)(2 * NC + 2) * 4 + 7) & ~(size_t)7;
    const int32_t *t = (const int32_t *)d_blk;
    float *const *d_S = (float *const *)((const uint8_t *)d_blk + sp);
    if (cu_linattn_chunked_ok(c, gdn, H, dk, dv, 1))
        return cu_linattn_chunked_dev(c, gdn, H, dk, dv, scale, q, k, v, ga, gb, o, NC, 1, t, t + NC, t + 2 * NC,
                                      t + 2 * NC + 1, d_S, n);
    hyla_cu_linrec r; /* token loop */
    memset(&r, 0, sizeof r);
    r.gdn = gdn;
    r.H = H;
    r.dk = dk;
    r.dv = dv;
    r.scale = scale;
    r.ntok = n;
    r.q1 = q;
    r.k1 = k;
    r.v = v;
    r.ga = ga;
    r.betaa = gdn ? gb : NULL;
    r.o = o;
    r.S0 = d_S;
    r.states16 = states16;
    return cu_lin_recurrent(c, &r, 1);
}

static hyla_status prefill1(hyla_cuda_ctx *c, int gdn, const float *q, const float *k, const float *v,
                            const float *ga, const float *gb, int n, int H, int dk, int dv, float scale, float *S,
                            float *o) {
    if (n <= 0) return HYLA_OK;
    if (H <= 0 || dk <= 0 || dv <= 0) return hyla_fail(HYLA_ERR_INVALID_ARG, "linear attention: H=%d dk=%d dv=%d", H, dk, dv);
    size_t bytes = cu_lin_prefill1_block(n, S, NULL);
    void *blk = malloc(bytes);
    if (!blk) return hyla_fail(HYLA_ERR_NOMEM, "linear attention: out of host memory");
    cu_lin_prefill1_block(n, S, blk);
    void *d_blk;
    hyla_status st = cu_stage(c, blk, bytes, &d_blk);
    free(blk);
    HYLA_TRY(st);
    return cu_lin_prefill1_dev(c, gdn, q, k, v, ga, gb, n, H, dk, dv, scale, d_blk, ((uintptr_t)S & 15) == 0, o);
}

/* ================================================================ ops */

extern "C" hyla_status cu_gla_prefill(void *ctx, const float *q, const float *k, const float *v, const float *gk,
                                      int n, int H, int dk, int dv, float scale, float *S, float *o) {
    return prefill1((hyla_cuda_ctx *)ctx, 0, q, k, v, gk, NULL, n, H, dk, dv, scale, S, o);
}

extern "C" hyla_status cu_gdn_prefill(void *ctx, const float *q, const float *k, const float *v, const float *g,
                                      const float *beta, int n, int H, int dk, int dv, float scale, float *S,
                                      float *o) {
    return prefill1((hyla_cuda_ctx *)ctx, 1, q, k, v, g, beta, n, H, dk, dv, scale, S, o);
}

extern "C" hyla_status cu_lin_decode_dev(hyla_cuda_ctx *c, int gdn, const float *q, const float *k, const float *v,
                                         const float *ga, const float *gb, int B, int H, int dk, int dv, float scale,
                                         float *const *d_S, int states16, float *o) {
    if (B <= 0) return HYLA_OK;
    hyla_cu_linrec r;
    memset(&r, 0, sizeof r);
    r.gdn = gdn;
    r.H = H;
    r.dk = dk;
    r.dv = dv;
    r.scale = scale;
    r.ntok = 1;
    r.q1 = q;
    r.k1 = k;
    r.v = v;
    r.ga = ga;
    r.betaa = gb;
    r.o = o;
    r.S0 = d_S;
    r.states16 = states16;
    return cu_lin_recurrent(c, &r, B);
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
