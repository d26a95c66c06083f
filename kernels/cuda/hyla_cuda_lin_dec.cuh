/* hyla_cuda_lin_dec.cuh — the GLA / GDN decode kernel k_lin_dec and the slot lookup the
 * recurrent kernels share (internal to kernels/cuda). Included by hyla_cuda_lin_decode.cu (the
 * product: the token-loop kernels and the launches) and by the kernel lab's
 * kernels/cuda/dev/lin_decode_forms.cu, which instantiates the same template in the forms it
 * measures against the product's, so they cannot drift apart.
 * Layout: hyla_cu_linrec (hyla_cuda_impl.h); states [H][dk][dv] fp32 per session (S0) and per
 * SSE partition (Sp). */
#ifndef HYLA_CUDA_LIN_DEC_CUH
#define HYLA_CUDA_LIN_DEC_CUH
#include "hyla_cuda_impl.h"
#include "hyla_cuda_rowmath.cuh"

/* The state Sg a recurrent block updates in slot `slot` of session b, head h: slot 0 the
 * session's own state S0; slot 1 + q (SSE) partition part = idx[b][q] with route weight wfix
 * when decoding one token (ONE: the kernel only decodes), or partition part = q for a token loop
 * (weights per token: lin_token_weight). 0 for an invalid route (Sg not set). */
template <bool ONE>
__device__ __forceinline__ int lin_slot_state(const hyla_cu_linrec &a, int b, int h, int H, int dk, int dv, int slot,
                                              float *&Sg, int &part, float &wfix) {
    part = -1;
    wfix = 1.0f;
    if (slot == 0) {
        Sg = a.S0[b] + (size_t)h * dk * dv;
        return 1;
    }
    if (ONE || a.ntok == 1) {
        part = a.idx[(size_t)b * a.K + slot - 1];
        wfix = a.w[(size_t)b * a.K + slot - 1];
    } else {
        part = slot - 1;
    }
    if (part < 0 || part >= a.N) return 0;
    Sg = a.Sp[b] + ((size_t)part * H + h) * dk * dv;
    return 1;
}

/* Decode form of the recurrence (ntok == 1, every batched decode step): VW value columns per
 * lane (16- or 8-byte state loads), one block per (session, head, 32 * VW columns); MINB blocks
 * per SM cap its registers. The product runs k_lin_dec<R, 2, 2>; the kernel lab's
 * lin_decode_forms times the other widths and caps (VW = 4, MINB = 1, 3). Unlike the
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

/* sum = the lane's VW columns summed over the block's 8 warps' rows of buf [8][32 VW], in warp
 * order (the fixed order of every reduction of the recurrent kernels). */
template <int VW>
__device__ __forceinline__ void dec_sum8(float (&sum)[VW], const float (*buf)[32 * VW], int lane) {
#pragma unroll
    for (int c = 0; c < VW; c++) sum[c] = 0.0f;
#pragma unroll
    for (int q = 0; q < 8; q++) {
        float x[VW];
        DecVec<VW>::ld(x, &buf[q][lane * VW]);
#pragma unroll
        for (int c = 0; c < VW; c++) sum[c] += x[c];
    }
}

/* RAW (GDN without SSE partitions, dk % 4 == 0, dk <= 512, q and k 16-byte aligned: cu_gdn_decode_raw):
 * q and k arrive as projected and ga / betaa as the gate projections a, b. Warps 0 and 1 take the
 * L2 norms of the head's q and k rows (l2_inv_warp: k_l2norm_rows's arithmetic) while the state
 * loads are in flight, and each thread forms g, beta as k_gdn_gates does (gdn_gate_vals), so the
 * block computes exactly what l2norm_rows, gdn_gates and the plain form compute, without their two
 * launches or the round trip of q, k, g, beta through memory. */
template <int R, int VW, int MINB, bool RAW = false>
__global__ void __launch_bounds__(256, MINB) k_lin_dec(hyla_cu_linrec a) {
    typedef DecVec<VW> V;
    pdl_trigger(); /* launched by cu_launch_pdl in the product: nothing is read before the wait */
    pdl_wait();
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
        float *Sg, wt;
        int part;
        if (!lin_slot_state<true>(a, b, h, H, dk, dv, slot, Sg, part, wt)) continue; /* invalid route: skip (uniform) */
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
        float invq = 1.0f, invk = 1.0f; /* RAW: the rows' inverse L2 norms */
        if (RAW) {
            __shared__ float sinv[2];
            if (w < 2) {
                const float inv = l2_inv_warp((w ? Kx : Q) + (row * H + h) * dk, dk, a.qk_eps, lane);
                if (lane == 0) sinv[w] = inv;
            }
            __syncthreads();
            invq = sinv[0];
            invk = sinv[1];
        }
        for (int i = threadIdx.x; i < dk; i += 256) {
            if (RAW) { /* the normalised element (x * inv, as k_l2norm_rows stores it), then the weight */
                const float qn = Q[(row * H + h) * dk + i] * invq, kn = Kx[(row * H + h) * dk + i] * invk;
                sq[i] = qn * wt;
                sk[i] = kn * wt;
            } else {
                sq[i] = Q[(row * H + h) * dk + i] * wt;
                sk[i] = Kx[(row * H + h) * dk + i] * wt;
            }
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
            float gv = GA[row * H + h], beta = BE[row * H + h];
            if (RAW) gdn_gate_vals(gv, beta, a.A_log[h], a.dt_bias[h], a.allow_neg, gv, beta);
            float d = expf(gv);
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
            dec_sum8<VW>(ks, red[m & 1], lane);
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
            dec_sum8<VW>(acc, red[m & 1], lane);
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

#endif
