/* hyla_cuda_lin_chunked.cu — GLA and gated-delta-rule (GDN) prefill on tensor cores, chunk by
 * chunk, and the host side of every chunked call.
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
 * GDN with dk <= 128 runs the fused pass instead (hyla_cuda_gdn_fused.cu, hyla_cuda_gdn_pipe.cu:
 *   kernel A's quantities computed per chunk in shared memory by the block that carries the
 *   state, so only q, k, v, gates are read and o written), or for few long sequences its chunk
 *   part over all chunks followed by kernel B; kernels A and B remain for dk = 256. GLA with
 *   dk <= 128 likewise runs a fused kernel (k_gla_fused), whose tiles and products are exactly
 *   kernels A's and B's, so the two give the same bits; kernels A and B stay for few long
 *   sequences and dk = 256.
 * Sequences are packed (varlen) so SSE partitions and batched prefill share the kernels; the
 *   fused kernels can also read SSE rows through the plan's row map (no gathered copy).
 * Threading: launched on the context's stream. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_cuda_linattn.cuh"
#include "hyla_cuda_tma.cuh"
#include "hyla_cuda_wgmma.cuh"
#include "hyla_log.h"

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
        frag_zero(kk);
        frag_zero(qk);
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
            frag_zero(acc);
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
            frag_zero(acc);
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
 * computes; ST = 1 when two stages do not fit in shared memory (dk = 256 with GDN).
 * NV: n8 tiles of value columns per block (the product launches 4: 32 columns; 2, twice the
 * blocks, was slower in the model). Each value column's sums are its own, so NV changes no bit. */
/* What k_chunk_b and k_chunk_b_wg share: a warp's tokens and value columns of a chunk (rows
 * 16 w + g and + 8, columns j0 + 8 n + 2 tq and + 1, the mma accumulator layout both keep).
 * chunkb_usrc: the warp's U source (GDN: U0 of chunk row ch; GLA: V, zero past the chunk's
 * len tokens and past dv), loaded before the products. chunkb_store_o: the chunk's O rows. */
template <int NV, int GDN>
__device__ __forceinline__ void chunkb_usrc(float (&usrc)[NV][4], const ChunkArgs &a, size_t ch, int tok0, int len,
                                            int h, int H, int dv, int j0, int w, int g, int tq) {
#pragma unroll
    for (int n = 0; n < NV; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int t = 16 * w + g + (e >> 1) * 8, j = j0 + n * 8 + 2 * tq + (e & 1);
            float u = 0.0f;
            if (j < dv) {
                if (GDN || a.gla_u0)
                    u = a.u0[(ch * CH + t) * dv + j];
                else if (t < len)
                    u = a.v[((size_t)(tok0 + t) * H + h) * dv + j];
            }
            usrc[n][e] = u;
        }
}
template <int NV>
__device__ __forceinline__ void chunkb_store_o(const float (&oacc)[NV][4], const ChunkArgs &a, int tok0, int len,
                                               int h, int H, int dv, int j0, int w, int g, int tq) {
#pragma unroll
    for (int n = 0; n < NV; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int t = 16 * w + g + (e >> 1) * 8, j = j0 + n * 8 + 2 * tq + (e & 1);
            if (t < len && j < dv) a.o[((size_t)(tok0 + t) * H + h) * dv + j] = oacc[n][e];
        }
}

template <int DKP, int GDN, int ST, int NV>
__global__ void __launch_bounds__(128) k_chunk_b(ChunkArgs a) {
    extern __shared__ __align__(16) unsigned char smem[];
    const int LDK = DKP + 8;
    constexpr int MT = DKP / 16, MTW = (MT + 3) / 4;
    constexpr int STAGE = CH * (DKP + 8) * (GDN ? 2 : 1) + DKP * 72 + CH * 72 + DKP * 2; /* bf16 elements */
    __nv_bfloat16 *SbT = (__nv_bfloat16 *)smem + ST * STAGE; /* [8 NV][LDK] */
    __nv_bfloat16 *UT = SbT + 8 * NV * LDK;                   /* [8 NV][72] */
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, tq = lane & 3;
    const int j0 = blockIdx.x * 8 * NV, h = blockIdx.y, z = blockIdx.z, H = a.H, dk = a.dk, dv = a.dv;
    float *S = a.S[z] + (size_t)h * dk * dv;

    float sacc[MTW][NV][4];
    state_load<MT>(sacc, S, true, w, g, tq, j0, dk, dv);
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
        float usrc[NV][4];
        chunkb_usrc<NV, GDN>(usrc, a, ch, tok0, len, h, H, dv, j0, w, g, tq);
        /* S (bf16, transposed) as the operand of this chunk */
        state_to_sbt<MT>(sacc, SbT, LDK, w, g, tq);
        __syncthreads();
        /* U for rows 16w..16w+15 */
        {
            float uacc[NV][4];
            frag_zero(uacc);
            if (GDN) {
#pragma unroll
                for (int kc = 0; kc < DKP / 16; kc++) {
                    uint32_t af[4];
                    ld_frag_a(af, Wt + (16 * w) * LDK + kc * 16, LDK);
#pragma unroll
                    for (int n = 0; n < NV; n++) {
                        uint32_t bf[2];
                        ld_frag_b_nk(bf, SbT + (n * 8) * LDK + kc * 16, LDK);
                        mma_bf16_16816(uacc[n], af, bf);
                    }
                }
            }
#pragma unroll
            for (int n = 0; n < NV; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int t = 16 * w + g + (e >> 1) * 8, jj = n * 8 + 2 * tq + (e & 1);
                    UT[jj * 72 + t] = __float2bfloat16_rn(usrc[n][e] - uacc[n][e]);
                }
        }
        __syncthreads();
        /* O = q~ S + Aqk U */
        {
            float oacc[NV][4];
            frag_zero(oacc);
#pragma unroll
            for (int kc = 0; kc < DKP / 16; kc++) {
                uint32_t af[4];
                ld_frag_a(af, Qt + (16 * w) * LDK + kc * 16, LDK);
#pragma unroll
                for (int n = 0; n < NV; n++) {
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
                for (int n = 0; n < NV; n++) {
                    uint32_t bf[2];
                    ld_frag_b_nk(bf, UT + (n * 8) * 72 + kc * 16, 72);
                    mma_bf16_16816(oacc[n], af, bf);
                }
            }
            chunkb_store_o<NV>(oacc, a, tok0, len, h, H, dv, j0, w, g, tq);
        }
        /* S = e^(bC) S + k~^T U */
#pragma unroll
        for (int mi = 0; mi < MTW; mi++) {
            int mt = w + 4 * mi;
            if (mt < MT) {
                float d0 = GDN ? decs[0] : decs[mt * 16 + g], d1 = GDN ? decs[0] : decs[mt * 16 + g + 8];
                state_decay(sacc[mi], d0, d1);
#pragma unroll
                for (int kc = 0; kc < CH / 16; kc++) {
                    uint32_t af[4];
                    ld_frag_a(af, KtT + (mt * 16) * 72 + kc * 16, 72);
#pragma unroll
                    for (int n = 0; n < NV; n++) {
                        uint32_t bf[2];
                        ld_frag_b_nk(bf, UT + (n * 8) * 72 + kc * 16, 72);
                        mma_bf16_16816(sacc[mi][n], af, bf);
                    }
                }
            }
        }
        __syncthreads();
    }
    state_store<MT>(sacc, S, true, w, g, tq, j0, dk, dv);
}

/* ---- kernel B on warpgroup products (sm_90a; DKP = 128, 32 value columns a block) ----
 * k_chunk_b's state pass with each phase's products as wgmma m64n32k16 of its one warpgroup
 * (the block's 4 warps). A warp's part of the m64n32 accumulator is k_chunk_b's register layout
 * (U and O: token rows 16w..; S: key tiles mt = w + 4 mi, the two m64 halves of the 128 keys),
 * and every output gets k_chunk_b's k16 steps in its order from the same start (zeroed U and
 * O; S decayed first), so the bits are k_chunk_b's (hyla_cuda_wgmma.cuh). The operand tiles sit
 * in shared memory in the 128-byte swizzle instead of padded rows: the chunk's q~, W, k~^T and
 * Aqk by cp.async (two stages), S^T and U^T written by the threads. On by default on Hopper
 * (HYLA_CUDA_CHUNK_B_WG=0: off); test_gpu_ops' "chunked switches" holds it to k_chunk_b's bits.
 * On an H100: one sequence of 8192 tokens, 16 heads, 0.632 -> 0.554 ms; a tensor-parallel rank's
 * GDN prefill at 128k (the split form) 167 k -> 173 k tok/s (BENCHMARKS.md). */
/* A stage: q~, W, k~^T, Aqk (bf16 elements), then the decays (512 bytes) padded to 1024.
 * CMP (GLA, whose W is unused): the stage without W, so that two blocks fit an SM (111 KB each
 * with the U source), for grids of more blocks than SMs: an SSE call's 1 + N sequences. With
 * one block an SM GLA keeps the full stage: the compact one measured 4-6 % slower on one
 * sequence (72 blocks), for reasons not found. */
#define BW_STAGE_W(w) (CH * 128 * ((w) ? 2 : 1) + 128 * CH + CH * CH)
#define BW_STAGE_BYTES_W(w) (BW_STAGE_W(w) * 2 + 1024)
#define BW_U_BYTES (CH * 32 * 4)                    /* TM: the U source [64 t][32] fp32, 128-byte swizzle */
static inline size_t smem_b_wg(int tm, int cmp) {
    return (size_t)2 * (BW_STAGE_BYTES_W(!cmp) + (tm ? BW_U_BYTES : 0)) + (size_t)(32 * 128 + 32 * CH) * 2 + 1024 +
           (tm ? 64 : 0);
}

/* TM: the copy engine's tensor maps over the scratch (q~, W: boxes of 64 x 64, two a tile; k~^T
 * 64 x 128; Aqk 64 x 64; bf16 in the 128-byte swizzle wgmma reads) and over the U source (GDN's
 * U0 [rows][dv], GLA's v [rows][H][dv]: boxes of 32 fp32 columns x 64 rows, the same swizzle). */
struct ChunkBMaps {
    CUtensorMap qt, wt, kt, aq, u;
};

/* -DHYLA_FUSED_PROFILE (diagnostic builds only): thread 0 of block (0,0,0) sums clock64()
 * intervals between the phases of each chunk from the 8th on, and the first launch of each
 * GDN value prints the means per chunk. */
#ifdef HYLA_FUSED_PROFILE
__device__ int g_bprof_once[2];
#define BPROF(k)                                                                                                       \
    if (bprof) {                                                                                                       \
        long long t_ = clock64();                                                                                      \
        bp[k] += t_ - bt;                                                                                              \
        bt = t_;                                                                                                       \
    }
#else
#define BPROF(k)
#endif

/* Two stages of the chunk ring (the next chunk's tiles in flight; three measured no faster).
 * TM = 1: each chunk's tiles and its U source (GLA's v, GDN's U0) come by the copy engine, one
 * thread issuing a stage's boxes on its mbarrier (ChunkBMaps). Issued by the threads as cp.async
 * pieces (TM = 0), the ~4,100 16-byte copies of a chunk stalled the warps ~1,700 cycles a chunk
 * in the issue itself (phase profile, -DHYLA_FUSED_PROFILE), and the U source, loaded from global
 * memory at the chunk's start, sat on the chain from one chunk's state to the next. One 32k
 * sequence of 18 heads on an H100, the whole op: GLA 2.14 (TM = 0) -> 1.81 (U staged by cp.async)
 * -> 1.42 ms (TM = 1), GDN 2.27 -> 2.03 -> 1.53. TM needs dv % 4 == 0 and, for GLA, v 16-byte
 * aligned and its row count known; the launch checks and otherwise takes TM = 0. */
/* What kernel B's two warpgroup forms (k_chunk_b_wg, k_chunk_b_ws) share, in the order a chunk
 * runs them; each is the same instructions in both kernels (one warpgroup of 4 warps, warp w,
 * lane (g, tq); 32 value columns; DKP = 128). */
/* S^T in bf16 as the chunk's operand: row j, k = key i ([32 j][128 i], swizzled) */
template <int MTW>
__device__ __forceinline__ void chunkb_put_st(__nv_bfloat16 *SbT, const float (&sacc)[MTW][4][4], int w, int g, int tq) {
#pragma unroll
    for (int mi = 0; mi < MTW; mi++)
#pragma unroll
        for (int n = 0; n < 4; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int i = (w + 4 * mi) * 16 + g + (e >> 1) * 8, jj = n * 8 + 2 * tq + (e & 1);
                SbT[wg_swz(jj, i, 32)] = __float2bfloat16_rn(sacc[mi][n][e]);
            }
}
/* The U source (GDN's U0, GLA's v) of token rows 16w.. from the copy engine's staging: rows of 32
 * floats, 16-byte piece p of row t at p ^ (t % 8); GLA's rows past the chunk (the next
 * sequence's, inside the tensor) read as zero */
template <int GDN>
__device__ __forceinline__ void chunkb_usrc_tm(float (&usrc)[4][4], const float *Us, int len, int w, int g, int tq) {
#pragma unroll
    for (int n = 0; n < 4; n++)
#pragma unroll
        for (int e2 = 0; e2 < 2; e2++) {
            const int t = 16 * w + g + e2 * 8, col = n * 8 + 2 * tq;
            float2 u2 = *(const float2 *)(Us + t * 32 + ((((col >> 2) ^ (t & 7))) << 2) + (col & 3));
            const bool in = GDN || t < len;
            usrc[n][2 * e2] = in ? u2.x : 0.0f;
            usrc[n][2 * e2 + 1] = in ? u2.y : 0.0f;
        }
}
/* uacc = W S for token rows 16w.. (GDN; GLA: zero), products waited for */
template <int GDN, int DKP>
__device__ __forceinline__ void chunkb_ws(float (&uacc)[4][4], const __nv_bfloat16 *Wt, const __nv_bfloat16 *SbT) {
    float(&uf)[16] = *reinterpret_cast<float(*)[16]>(&uacc[0][0]);
    frag_zero(uacc);
    if (GDN) {
        wg_keep(uf); /* operand fences (hyla_cuda_wgmma.cuh) */
        wg_fence();
#pragma unroll
        for (int kc = 0; kc < DKP / 16; kc++)
            wg_mma32(uacc, wg_desc(Wt + (kc >> 2) * CH * 64 + (kc & 3) * 16),
                     wg_desc(SbT + (kc >> 2) * 32 * 64 + (kc & 3) * 16), 1);
        wg_commit();
        wg_wait<0>();
        wg_keep(uf);
    }
}
/* U^T = (U source - W S)^T in bf16 ([32 j][64 t], swizzled) */
__device__ __forceinline__ void chunkb_put_ut(__nv_bfloat16 *UT, const float (&usrc)[4][4], const float (&uacc)[4][4],
                                              int w, int g, int tq) {
#pragma unroll
    for (int n = 0; n < 4; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int t = 16 * w + g + (e >> 1) * 8, jj = n * 8 + 2 * tq + (e & 1);
            UT[wg_swz(jj, t, 32)] = __float2bfloat16_rn(usrc[n][e] - uacc[n][e]);
        }
}
/* S = e^(bC) S: GDN one decay a head, GLA one a key row */
template <int GDN, int MTW>
__device__ __forceinline__ void chunkb_decay(float (&sacc)[MTW][4][4], const float *decs, int w, int g) {
#pragma unroll
    for (int mi = 0; mi < MTW; mi++) {
        const int mt = w + 4 * mi;
        float d0 = GDN ? decs[0] : decs[mt * 16 + g], d1 = GDN ? decs[0] : decs[mt * 16 + g + 8];
        state_decay(sacc[mi], d0, d1);
    }
}
/* the products (issued, not committed) of O += q~ S + Aqk U ... */
template <int DKP>
__device__ __forceinline__ void chunkb_o_products(float (&oacc)[4][4], const __nv_bfloat16 *Qt, const __nv_bfloat16 *Aq,
                                                  const __nv_bfloat16 *SbT, const __nv_bfloat16 *UT) {
#pragma unroll
    for (int kc = 0; kc < DKP / 16; kc++)
        wg_mma32(oacc, wg_desc(Qt + (kc >> 2) * CH * 64 + (kc & 3) * 16),
                 wg_desc(SbT + (kc >> 2) * 32 * 64 + (kc & 3) * 16), 1);
#pragma unroll
    for (int kc = 0; kc < CH / 16; kc++) wg_mma32(oacc, wg_desc(Aq + kc * 16), wg_desc(UT + kc * 16), 1);
}
/* ... and of S += k~^T U */
template <int MTW>
__device__ __forceinline__ void chunkb_s_products(float (&sacc)[MTW][4][4], const __nv_bfloat16 *KtT,
                                                  const __nv_bfloat16 *UT) {
#pragma unroll
    for (int mi = 0; mi < MTW; mi++)
#pragma unroll
        for (int kc = 0; kc < CH / 16; kc++)
            wg_mma32(sacc[mi], wg_desc(KtT + mi * 64 * 64 + kc * 16), wg_desc(UT + kc * 16), 1);
}

template <int GDN, int ST, int TM, int CMP>
__global__ void __launch_bounds__(128) k_chunk_b_wg(ChunkArgs a, const __grid_constant__ ChunkBMaps bm) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int DKP = 128, MT = DKP / 16, MTW = 2;
    static_assert(!(GDN && CMP), "GDN reads W");
    constexpr size_t SBY = BW_STAGE_BYTES_W(!CMP), SB = SBY + (TM ? BW_U_BYTES : 0);
    extern __shared__ __align__(1024) unsigned char bw_raw[];
    unsigned char *base = wg_align1024(bw_raw);
    __nv_bfloat16 *SbT = (__nv_bfloat16 *)(base + ST * SB); /* [32 j][128 i], swizzled */
    __nv_bfloat16 *UT = SbT + 32 * 128;                                 /* [32 j][64 t], swizzled */
    uint64_t *fullb = (uint64_t *)(UT + 32 * CH);                       /* TM: a stage's tiles landed */
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, tq = lane & 3;
    const int j0 = blockIdx.x * 32, h = blockIdx.y, z = blockIdx.z, H = a.H, dk = a.dk, dv = a.dv;
    float *S = a.S[z] + (size_t)h * dk * dv;
    float sacc[MTW][4][4];
    state_load<MT>(sacc, S, true, w, g, tq, j0, dk, dv);
    const int c0 = a.seq_c0[z], nc = a.seq_nc[z];
    auto tiles = [&](int buf, __nv_bfloat16 *&Qt, __nv_bfloat16 *&Wt, __nv_bfloat16 *&KtT, __nv_bfloat16 *&Aq,
                     float *&decs) {
        Qt = (__nv_bfloat16 *)(base + buf * SB); /* [64 t][128 k] */
        Wt = Qt + CH * 128;                                    /* [64 t][128 k] (GDN) */
        KtT = Wt + (CMP ? 0 : CH * 128);                       /* [128 k][64 t] */
        Aq = KtT + 128 * CH;                                   /* [64 t][64 t'] */
        decs = (float *)(Aq + CH * CH);
    };
    /* 16-byte pieces: a warp's 8-lane phases write one row's 8 pieces of a 64-k block, which the
     * swizzle spreads over every bank */
    auto stage = [&](int buf, int c) {
        __nv_bfloat16 *Qt, *Wt, *KtT, *Aq;
        float *decs;
        tiles(buf, Qt, Wt, KtT, Aq, decs);
        const size_t ch = (size_t)c * H + h;
        if (TM) { /* one thread hands the chunk's tiles to the copy engine */
            if (tid == 0) {
                uint64_t *m = &fullb[buf];
                float *Us = (float *)(base + buf * SB + SBY);
                const int row = (int)(ch * CH);
                mbar_expect_tx(m, (unsigned)((GDN ? 2 : 1) * CH * DKP * 2 + DKP * CH * 2 + CH * CH * 2 + DKP * 4 +
                                             BW_U_BYTES));
                tma_g2s_2d(Qt, &bm.qt, 0, row, m);
                tma_g2s_2d(Qt + CH * 64, &bm.qt, 64, row, m);
                if (GDN) {
                    tma_g2s_2d(Wt, &bm.wt, 0, row, m);
                    tma_g2s_2d(Wt + CH * 64, &bm.wt, 64, row, m);
                }
                tma_g2s_2d(KtT, &bm.kt, 0, (int)(ch * DKP), m);
                tma_g2s_2d(Aq, &bm.aq, 0, row, m);
                bulk_g2s(decs, a.dec + ch * DKP, DKP * 4, m);
                if (GDN || a.gla_u0)
                    tma_g2s_2d(Us, &bm.u, j0, row, m);
                else
                    tma_g2s_3d(Us, &bm.u, j0, h, a.ck_tok0[c], m);
            }
            return;
        }
        const __nv_bfloat16 *src = a.qt + ch * CH * DKP;
        for (int x = tid; x < CH * DKP / 8; x += 128) cp_async16(Qt + wg_swz(x / 16, (x % 16) * 8, CH), src + (size_t)x * 8, 16);
        if (GDN) {
            src = a.wt + ch * CH * DKP;
            for (int x = tid; x < CH * DKP / 8; x += 128)
                cp_async16(Wt + wg_swz(x / 16, (x % 16) * 8, CH), src + (size_t)x * 8, 16);
        }
        src = a.ktT + ch * DKP * CH;
        for (int x = tid; x < DKP * CH / 8; x += 128) cp_async16(KtT + wg_swz(x / 8, (x % 8) * 8, DKP), src + (size_t)x * 8, 16);
        src = a.aqk + ch * CH * CH;
        for (int x = tid; x < CH * CH / 8; x += 128) cp_async16(Aq + wg_swz(x / 8, (x % 8) * 8, CH), src + (size_t)x * 8, 16);
        const float *dsrc = a.dec + ch * DKP;
        for (int x = tid; x < DKP / 4; x += 128) cp_async16(decs + x * 4, dsrc + x * 4, 16);
        cp_async_commit();
    };
    if (TM) {
        if (tid == 0) {
            for (int b = 0; b < ST; b++) mbar_init(&fullb[b], 1);
            asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        }
        __syncthreads();
    }
    /* the first ST - 1 chunks in flight; every turn commits one group (empty past the last
     * chunk), so waiting for all but the newest ST - 1 groups leaves this chunk's tiles landed
     * (TM: each stage's mbarrier, phase = its use count mod 2) */
    for (int s0 = 0; s0 < ST - 1; s0++) {
        if (s0 < nc) stage(s0, c0 + s0);
        else cp_async_commit();
    }
#ifdef HYLA_FUSED_PROFILE
    long long bp[6] = {0, 0, 0, 0, 0, 0}, bt = 0;
    const bool bprof0 = tid == 0 && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0;
#endif
    for (int cc = 0; cc < nc; cc++) {
#ifdef HYLA_FUSED_PROFILE
        const bool bprof = bprof0 && cc >= 8;
        if (bprof) bt = clock64();
#endif
        const int c = c0 + cc, buf = cc % ST;
        const size_t ch = (size_t)c * H + h;
        const int tok0 = a.ck_tok0[c], len = a.ck_len[c];
        if (cc + ST - 1 < nc) stage((cc + ST - 1) % ST, c + ST - 1);
        else if (!TM) cp_async_commit();
        if (TM)
            mbar_wait(&fullb[buf], (unsigned)(cc / ST) & 1u);
        else
            cp_async_wait<ST - 1>();
        BPROF(0);
        __nv_bfloat16 *Qt, *Wt, *KtT, *Aq;
        float *decs;
        tiles(buf, Qt, Wt, KtT, Aq, decs);
        float usrc[4][4];
        if (!TM) chunkb_usrc<4, GDN>(usrc, a, ch, tok0, len, h, H, dv, j0, w, g, tq);
        chunkb_put_st<MTW>(SbT, sacc, w, g, tq);
        fence_proxy_async_smem(); /* this thread's stores and cp.async writes, to wgmma's proxy */
        __syncthreads();
        BPROF(1);
        if (TM) chunkb_usrc_tm<GDN>(usrc, (const float *)((const unsigned char *)Qt + SBY), len, w, g, tq);
        /* U = U0 - W S for token rows 16w.. (GLA: U = V) */
        float uacc[4][4];
        chunkb_ws<GDN, DKP>(uacc, Wt, SbT);
        BPROF(2);
        chunkb_put_ut(UT, usrc, uacc, w, g, tq);
        fence_proxy_async_smem();
        __syncthreads();
        BPROF(3);
        /* O = q~ S + Aqk U, then S = e^(bC) S + k~^T U */
        float oacc[4][4];
        float(&of)[16] = *reinterpret_cast<float(*)[16]>(&oacc[0][0]);
        float(&sf)[MTW * 16] = *reinterpret_cast<float(*)[MTW * 16]>(&sacc[0][0][0]);
        frag_zero(oacc);
        chunkb_decay<GDN, MTW>(sacc, decs, w, g);
        wg_keep(of); /* the decayed S and the zeroed O written before the fence */
        wg_keep(sf);
        wg_fence();
        chunkb_o_products<DKP>(oacc, Qt, Aq, SbT, UT);
        chunkb_s_products<MTW>(sacc, KtT, UT);
        wg_commit();
        wg_wait<0>();
        wg_keep(of);
        wg_keep(sf);
        BPROF(4);
        chunkb_store_o<4>(oacc, a, tok0, len, h, H, dv, j0, w, g, tq);
        __syncthreads(); /* every warpgroup's reads of this stage, S^T and U^T done */
        BPROF(5);
    }
    state_store<MT>(sacc, S, true, w, g, tq, j0, dk, dv);
#ifdef HYLA_FUSED_PROFILE
    if (bprof0 && nc > 8 && atomicAdd(&g_bprof_once[GDN], 1) == 0) {
        const double n = nc - 8;
        printf("kernel B profile (k_chunk_b_wg<%d, %d, %d, CMP>, cycles per chunk, mean of %d chunks): ring wait %.0f, "
               "S^T + barrier %.0f, W S %.0f, U^T + barrier %.0f, O and S products %.0f, o stores + barrier %.0f, "
               "total %.0f\n",
               GDN, ST, TM, nc - 8, bp[0] / n, bp[1] / n, bp[2] / n, bp[3] / n, bp[4] / n, bp[5] / n,
               (bp[0] + bp[1] + bp[2] + bp[3] + bp[4] + bp[5]) / n);
    }
#endif
#endif
}

/* ---- kernel B with its outputs in a warpgroup of their own (sm_90a, DKP = 128, 32 value columns) ----
 * k_chunk_b_wg's chain from one chunk's state to the next runs its O products (12 of a chunk's 20
 * last products) before the next chunk can start. Here warpgroup 0 walks the state chain alone
 * (Sᵀ, W S, U, Uᵀ, S = e^(bC) S + k̃ᵀ U) and hands each chunk's Sᵀ and Uᵀ to warpgroup 1 through
 * one of two slots; warpgroup 1 forms O = q̃ Sᵀ + Aqk U from them (the same products in the same
 * order into a zeroed accumulator: k_chunk_b_wg's bits) and stores it, a chunk behind at most.
 * Each warpgroup has its own ring of three stages by the copy engine (W, k̃ᵀ, the U source and
 * the decays; q̃ and Aqk), two chunks ahead. mbarriers: the rings' tiles landed; a slot ready
 * (warpgroup 0 -> 1) and free again (1 -> 0). 225 KB, one block per SM. Launched for GDN only
 * (launch_b says why). */
#define BS_SRB(gdn) ((size_t)((gdn) ? CH * 128 * 2 : 0) + 128 * CH * 2 + BW_U_BYTES + 1024)
#define BS_ORB ((size_t)CH * 128 * 2 + CH * CH * 2)
#define BS_SLOT ((size_t)32 * 128 * 2 + 32 * CH * 2)
static inline size_t smem_b_ws(int gdn) { return 3 * BS_SRB(gdn) + 3 * BS_ORB + 2 * BS_SLOT + 1024 + 128; }

template <int GDN>
__global__ void __launch_bounds__(256, 1) k_chunk_b_ws(ChunkArgs a, const __grid_constant__ ChunkBMaps bm) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int DKP = 128, MT = DKP / 16, MTW = 2, NS = 3;
    constexpr size_t SRB = BS_SRB(GDN), WSZ = GDN ? (size_t)CH * DKP * 2 : 0;
    extern __shared__ __align__(1024) unsigned char bw_raw[];
    unsigned char *base = wg_align1024(bw_raw);
    unsigned char *sring = base, *oring = base + NS * SRB, *slots = oring + NS * BS_ORB;
    uint64_t *bar = (uint64_t *)(slots + 2 * BS_SLOT);
    uint64_t *sfull = bar, *ofull = bar + NS, *ready = bar + 2 * NS, *sempty = bar + 2 * NS + 2;
    const int tid = threadIdx.x, wgi = tid >> 7, t7 = tid & 127, lane = tid & 31, w = t7 >> 5, g = lane >> 2,
              tq = lane & 3;
    const int j0 = blockIdx.x * 32, h = blockIdx.y, z = blockIdx.z, H = a.H, dk = a.dk, dv = a.dv;
    const int c0 = a.seq_c0[z], nc = a.seq_nc[z];
    if (tid == 0) {
        for (int i = 0; i < NS; i++) mbar_init(&sfull[i], 1), mbar_init(&ofull[i], 1);
        for (int i = 0; i < 2; i++) mbar_init(&ready[i], 1), mbar_init(&sempty[i], 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    auto slotS = [&](int sl) { return (__nv_bfloat16 *)(slots + sl * BS_SLOT); };            /* [32 j][128 i] */
    auto slotU = [&](int sl) { return (__nv_bfloat16 *)(slots + sl * BS_SLOT + 32 * 128 * 2); }; /* [32 j][64 t] */
    if (wgi == 0) {
        /* ---- warpgroup 0: the state chain ---- */
        float *S = a.S[z] + (size_t)h * dk * dv;
        float sacc[MTW][4][4];
        state_load<MT>(sacc, S, true, w, g, tq, j0, dk, dv);
        auto stage = [&](int b, int c) { /* W, k~^T, the U source and the decays of chunk c */
            if (t7 == 0) {
                const size_t ch = (size_t)c * H + h;
                const int row = (int)(ch * CH);
                unsigned char *p = sring + b * SRB;
                __nv_bfloat16 *Wt = (__nv_bfloat16 *)p, *KtT = (__nv_bfloat16 *)(p + WSZ);
                float *Us = (float *)(p + WSZ + DKP * CH * 2), *decs = (float *)(p + WSZ + DKP * CH * 2 + BW_U_BYTES);
                mbar_expect_tx(&sfull[b], (unsigned)(WSZ + DKP * CH * 2 + BW_U_BYTES + DKP * 4));
                if (GDN) {
                    tma_g2s_2d(Wt, &bm.wt, 0, row, &sfull[b]);
                    tma_g2s_2d(Wt + CH * 64, &bm.wt, 64, row, &sfull[b]);
                }
                tma_g2s_2d(KtT, &bm.kt, 0, (int)(ch * DKP), &sfull[b]);
                bulk_g2s(decs, a.dec + ch * DKP, DKP * 4, &sfull[b]);
                if (GDN || a.gla_u0)
                    tma_g2s_2d(Us, &bm.u, j0, row, &sfull[b]);
                else
                    tma_g2s_3d(Us, &bm.u, j0, h, a.ck_tok0[c], &sfull[b]);
            }
        };
        for (int s0 = 0; s0 < NS - 1 && s0 < nc; s0++) stage(s0, c0 + s0);
        for (int cc = 0; cc < nc; cc++) {
            const int c = c0 + cc, b = cc % NS, sl = cc & 1, len = a.ck_len[c];
            /* the buffer of chunk cc - 1: this warpgroup is done with it (the barrier below) */
            if (cc + NS - 1 < nc) stage((cc + NS - 1) % NS, c + NS - 1);
            unsigned char *p = sring + b * SRB;
            __nv_bfloat16 *Wt = (__nv_bfloat16 *)p, *KtT = (__nv_bfloat16 *)(p + WSZ), *SbT = slotS(sl), *UT = slotU(sl);
            const float *Us = (const float *)(p + WSZ + DKP * CH * 2), *decs = (const float *)(p + WSZ + DKP * CH * 2 + BW_U_BYTES);
            mbar_wait(&sfull[b], (unsigned)(cc / NS) & 1u);
            if (cc >= 2) mbar_wait(&sempty[sl], (unsigned)((cc - 2) / 2) & 1u); /* warpgroup 1 is done with the slot */
            chunkb_put_st<MTW>(SbT, sacc, w, g, tq);
            fence_proxy_async_smem();
            nb_sync(1, 128);
            float usrc[4][4];
            chunkb_usrc_tm<GDN>(usrc, Us, len, w, g, tq);
            float uacc[4][4];
            chunkb_ws<GDN, DKP>(uacc, Wt, SbT);
            chunkb_put_ut(UT, usrc, uacc, w, g, tq);
            fence_proxy_async_smem();
            nb_sync(1, 128);
            if (t7 == 0) mbar_arrive(&ready[sl]); /* S^T and U^T of chunk cc for warpgroup 1 */
            float(&sf)[MTW * 16] = *reinterpret_cast<float(*)[MTW * 16]>(&sacc[0][0][0]);
            chunkb_decay<GDN, MTW>(sacc, decs, w, g);
            wg_keep(sf);
            wg_fence();
            chunkb_s_products<MTW>(sacc, KtT, UT);
            wg_commit();
            wg_wait<0>();
            wg_keep(sf);
            nb_sync(1, 128); /* every warp's reads of this stage done before a later stage() refills it */
        }
        state_store<MT>(sacc, S, true, w, g, tq, j0, dk, dv);
    } else {
        /* ---- warpgroup 1: the outputs, a chunk behind at most ---- */
        auto stage = [&](int b, int c) { /* q~ and Aqk of chunk c */
            if (t7 == 0) {
                const size_t ch = (size_t)c * H + h;
                const int row = (int)(ch * CH);
                __nv_bfloat16 *Qt = (__nv_bfloat16 *)(oring + b * BS_ORB), *Aq = Qt + CH * DKP;
                mbar_expect_tx(&ofull[b], (unsigned)BS_ORB);
                tma_g2s_2d(Qt, &bm.qt, 0, row, &ofull[b]);
                tma_g2s_2d(Qt + CH * 64, &bm.qt, 64, row, &ofull[b]);
                tma_g2s_2d(Aq, &bm.aq, 0, row, &ofull[b]);
            }
        };
        for (int s0 = 0; s0 < NS - 1 && s0 < nc; s0++) stage(s0, c0 + s0);
        for (int cc = 0; cc < nc; cc++) {
            const int c = c0 + cc, b = cc % NS, sl = cc & 1;
            const int tok0 = a.ck_tok0[c], len = a.ck_len[c];
            /* the buffer of chunk cc - 1, whose products completed (a warpgroup's wgmma completes
             * as a whole, so this warp's wait covered every warp's reads) */
            if (cc + NS - 1 < nc) stage((cc + NS - 1) % NS, c + NS - 1);
            const __nv_bfloat16 *Qt = (const __nv_bfloat16 *)(oring + b * BS_ORB), *Aq = Qt + CH * DKP;
            __nv_bfloat16 *SbT = slotS(sl), *UT = slotU(sl);
            mbar_wait(&ofull[b], (unsigned)(cc / NS) & 1u);
            mbar_wait(&ready[sl], (unsigned)(cc / 2) & 1u);
            float oacc[4][4];
            float(&of)[16] = *reinterpret_cast<float(*)[16]>(&oacc[0][0]);
            frag_zero(oacc);
            wg_keep(of);
            wg_fence();
            chunkb_o_products<DKP>(oacc, Qt, Aq, SbT, UT);
            wg_commit();
            wg_wait<0>();
            wg_keep(of);
            if (t7 == 0) mbar_arrive(&sempty[sl]); /* the slot is free for chunk cc + 2 */
            chunkb_store_o<4>(oacc, a, tok0, len, h, H, dv, j0, w, g, tq);
        }
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

/* The cumulative log decay of key column i of a GLA chunk, in place in its fp32 staging (kernel
 * A's order of sums), and the chunk decay e^(b_C). */
template <int DKP, bool SKIP>
__device__ __forceinline__ void gla_cumdecay(float *Gst, float *dec, int i, int len) {
    float run = 0.0f;
    /* SKIP: rows past the chunk's len were staged zero, and run + 0 == run (run is never -0: it
     * starts at +0), so they take run unread */
#pragma unroll 8
    for (int t = 0; t < CH; t++) {
        const int d = fg_sw<DKP>(t, i);
        if (!SKIP || t < len) run += Gst[d];
        Gst[d] = run;
    }
    dec[i] = expf(run);
}

/* Kernel A's tiles of one GLA chunk from its fp32 staging (Qst, Kst, Gst [64][DKP] in the fg_sw
 * layout, Gst holding the cumulative log decay; wr the rows' weights): Aqk by warps 0-9, one
 * 16 x 16 lower block each (kernel A's reference-row form; the exact exp path on a diagonal block
 * whose span exceeds GLA_SPAN_MAX), and q~, k~^T and Aqk's zero blocks by warps 10-15. Shared by
 * the fused pass (k_gla_fused) and the split form's chunk kernel (k_gla_chunk_f), so both give
 * kernel A's values. Qt [64][DKP + 8], KtT [DKP][72], Aq [64][72]. */
template <int DKP, bool SKIP>
__device__ __forceinline__ void gla_tiles(const float *Qst, const float *Kst, const float *Gst, const float *wr,
                                          __nv_bfloat16 *Qt, __nv_bfloat16 *KtT, __nv_bfloat16 *Aq, const ChunkArgs &a,
                                          int dk, int len, int tid, int lane, int w, int g, int tq) {
    constexpr int LDK = DKP + 8;
    /* SKIP (the chunk kernel through a row map): rows at and past len were staged zero with
     * weight 0, so every value formed from them is +0 (a product of +0 and a finite factor,
     * summed from +0): they are stored as zeros without the arithmetic, the same bits, which
     * spares much of the work of an SSE partition's chunks (a quarter full at N = 4, K = 1).
     * Full chunks gain nothing from the tests, so plain GLA leaves them out. */
    if (w < 10) {
        const int wt = w < 1 ? 0 : (w < 3 ? 1 : (w < 6 ? 2 : 3)), rb = w - wt * (wt + 1) / 2, ref = 16 * wt;
        const bool diag = rb == wt;
        if (SKIP && ref >= len) { /* query rows ref.. all past the chunk: a zero block */
            for (int x = lane; x < 256; x += 32) Aq[(ref + x / 16) * 72 + rb * 16 + x % 16] = __float2bfloat16_rn(0.0f);
            return;
        }
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
            if (SKIP && t >= len) {
                *(uint2 *)(Qt + t * LDK + i) = make_uint2(0u, 0u);
                continue;
            }
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
            if (SKIP && t >= len) {
                *(uint32_t *)(KtT + i * 72 + t) = 0u;
                continue;
            }
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
    state_load<MT>(sacc, S, true, wq, g, tq, j0, dk, dv);
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
            state_to_sbt<MT>(sacc, SbT, LDK, wq, g, tq);
        }
        if (tid < DKP) { /* cumulative log decay of column i, in place (kernel A's order) */
            gla_cumdecay<DKP, false>(Gst, dec, tid, len);
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
        gla_tiles<DKP, false>(Qst, Kst, Gst, wr, Qt, KtT, Aq, a, dk, len, tid, lane, w, g, tq);
        __syncthreads();
        if (cc + 1 < nc) stage_qkg(bs ^ 1); /* (c') the staging area is free: the next chunk streams in now */
        /* (d) this group's 32 value columns: O = q~ S + Aqk V, S = e^(bC) S + k~^T V */
        if (active) {
            float oacc[4][4];
            frag_zero(oacc);
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
                    state_decay(sacc[mi], dec[mt * 16 + g], dec[mt * 16 + g + 8]);
                    mma_16x32<CH>(sacc[mi], KtT + (mt * 16) * 72, 72, UT, 72);
                }
            }
        }
    }
    state_store<MT>(sacc, S, true, wq, g, tq, j0, dk, dv);
}

/* ---- the split form's chunk kernel for GLA (dk <= 128) ----
 * One block of 16 warps per (chunk, head) forms kernel A's tiles as the fused pass forms them
 * (gla_cumdecay, gla_tiles: kernel A's values, which test_gpu_ops holds the fused pass to) from
 * the chunk's fp32 q, k, g staged by cp.async, and writes them to the scratch in kernel B's
 * layouts: q~ [64][DKP], k~^T [DKP][64], Aqk [64][64] (bf16), e^(b_C) [DKP]. k_gla_chunk_a forms
 * the same tiles with 4 warps element by element from global memory; ncu had it at 2.34 ms for
 * one 32k sequence of 18 heads (DRAM 19 %, SM 34 %), against FLA's ~1.1 ms for the same work. */
template <int DKP>
struct GlaTilesSmem {
    static constexpr size_t STG = (size_t)3 * CH * DKP * 4;  /* Qst Kst Gst fp32 */
    static constexpr size_t QT = (size_t)CH * (DKP + 8) * 2; /* q~ [64][DKP + 8] */
    static constexpr size_t KT = (size_t)DKP * 72 * 2;       /* k~^T [DKP][72] */
    static constexpr size_t AQ = (size_t)CH * 72 * 2;        /* Aqk [64][72] */
    static constexpr size_t TOTAL = STG + QT + KT + AQ + (size_t)DKP * 4 + (size_t)CH * 4;
};

#ifdef HYLA_FUSED_PROFILE
__device__ int g_gprof_once;
#endif
template <int DKP, int RM> /* RM: through an SSE row map (then gla_u0) */
__global__ void __launch_bounds__(FG_T, 1) k_gla_chunk_f(ChunkArgs a) {
    typedef GlaTilesSmem<DKP> L;
    constexpr int LDK = DKP + 8;
    extern __shared__ __align__(16) unsigned char smem[];
    float *Qst = (float *)smem, *Kst = Qst + CH * DKP, *Gst = Kst + CH * DKP;
    __nv_bfloat16 *Qt = (__nv_bfloat16 *)(smem + L::STG);
    __nv_bfloat16 *KtT = (__nv_bfloat16 *)(smem + L::STG + L::QT);
    __nv_bfloat16 *Aq = (__nv_bfloat16 *)(smem + L::STG + L::QT + L::KT);
    float *dec = (float *)(smem + L::STG + L::QT + L::KT + L::AQ); /* [DKP] e^(bC) */
    float *wr = dec + DKP;                                          /* [64] 1 for the chunk's rows, 0 past it */
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, tq = lane & 3;
    const int h = blockIdx.y, H = a.H, dk = a.dk;
    auto row_of = [&](int r, int &sp, float &wt) -> size_t {
        if (RM) return chunk_row(a, r, sp, wt);
        sp = 0;
        wt = 1.0f;
        return (size_t)r;
    };
    /* a run of split_cpb consecutive chunks: the next one's rows stream in while this one's
     * tiles are copied out */
    const int c0 = blockIdx.x * a.split_cpb, nc = min(a.split_cpb, a.split_nc - c0);
    /* q, k, g rows of chunk c in the fg_sw layout; rows past the chunk and columns past dk zero.
     * Through a row map (SSE) a sparse row reads q2, k2, g2 of its token and wr holds its weight,
     * as the fused pass stages them (wr: 1 for the chunk's dense rows, 0 past it). */
    auto stage = [&](int c) {
        const int tok0 = a.ck_tok0[c], len = a.ck_len[c];
        if (tid < CH) {
            int sp = 0;
            float wt = 0.0f;
            if (tid < len) (void)row_of(tok0 + tid, sp, wt);
            wr[tid] = wt;
        }
        if (a.fvec) {
            for (int x = tid; x < CH * DKP / 4; x += FG_T) {
                const int t = x / (DKP / 4), i = (x % (DKP / 4)) * 4, d = fg_sw<DKP>(t, i);
                const bool ok = t < len && i < dk;
                int sp = 0;
                float wt;
                const size_t off = ((ok ? row_of(tok0 + t, sp, wt) : 0) * H + h) * dk + i;
                cp_async16(Qst + d, ok ? (sp ? a.q2 : a.q) + off : a.q, ok ? 16 : 0);
                cp_async16(Kst + d, ok ? (sp ? a.k2 : a.k) + off : a.k, ok ? 16 : 0);
                cp_async16(Gst + d, ok ? (sp ? a.g2 : a.ga) + off : a.ga, ok ? 16 : 0);
            }
            cp_async_commit();
        } else {
            for (int x = tid; x < CH * DKP; x += FG_T) {
                const int t = x / DKP, i = x % DKP, d = fg_sw<DKP>(t, i);
                const bool ok = t < len && i < dk;
                int sp = 0;
                float wt;
                const size_t off = ((ok ? row_of(tok0 + t, sp, wt) : 0) * H + h) * dk + i;
                Qst[d] = ok ? (sp ? a.q2 : a.q)[off] : 0.0f;
                Kst[d] = ok ? (sp ? a.k2 : a.k)[off] : 0.0f;
                Gst[d] = ok ? (sp ? a.g2 : a.ga)[off] : 0.0f;
            }
        }
    };
    /* gla_u0: chunk c's v rows (its tokens' rows through the map) to U0 [64][dv], zero past it */
    auto put_u0 = [&](int c, size_t ch) {
        const int tok0 = a.ck_tok0[c], len = a.ck_len[c], dv = a.dv;
        float *u = a.u0 + ch * CH * dv;
        if (a.fvec && (((uintptr_t)a.u0) & 15) == 0) {
            for (int x = tid; x < CH * dv / 4; x += FG_T) {
                const int t = x / (dv / 4), j = (x % (dv / 4)) * 4;
                float4 v4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (t < len) {
                    int sp;
                    float wt;
                    v4 = *(const float4 *)(a.v + (row_of(tok0 + t, sp, wt) * H + h) * dv + j);
                }
                *(float4 *)(u + (size_t)t * dv + j) = v4;
            }
        } else {
            for (int x = tid; x < CH * dv; x += FG_T) {
                const int t = x / dv, j = x % dv;
                int sp;
                float wt;
                u[x] = t < len ? a.v[(row_of(tok0 + t, sp, wt) * H + h) * dv + j] : 0.0f;
            }
        }
    };
    if (nc > 0) stage(c0);
#ifdef HYLA_FUSED_PROFILE /* thread 0 of block (0,0): cycles a chunk by phase, the first launch prints */
    const bool gp = tid == 0 && blockIdx.x == 0 && blockIdx.y == 0;
    long long gacc[5] = {0, 0, 0, 0, 0}, glast = clock64();
#define GPROF(k)                                                                                                       \
    if (gp) {                                                                                                          \
        long long t_ = clock64();                                                                                      \
        gacc[k] += t_ - glast;                                                                                         \
        glast = t_;                                                                                                    \
    }
#else
#define GPROF(k)
#endif
    for (int cc = 0; cc < nc; cc++) {
        const int c = c0 + cc;
        const size_t ch = (size_t)c * H + h;
        if (a.fvec) cp_async_wait<0>();
        __syncthreads(); /* the rows landed; the previous chunk's tiles are copied out */
        GPROF(0);
        const int len = a.ck_len[c];
        if (tid < DKP) gla_cumdecay<DKP, RM != 0>(Gst, dec, tid, len);
        __syncthreads();
        GPROF(1);
        gla_tiles<DKP, RM != 0>(Qst, Kst, Gst, wr, Qt, KtT, Aq, a, dk, len, tid, lane, w, g, tq);
        __syncthreads(); /* the tiles are formed and the staging (and wr) is free */
        GPROF(2);
        if (cc + 1 < nc) stage(c + 1);
        GPROF(3);
        __nv_bfloat16 *qo = a.qt + ch * CH * DKP, *ko = a.ktT + ch * DKP * CH, *ao = a.aqk + ch * CH * CH;
        for (int x = tid; x < CH * DKP / 8; x += FG_T) {
            const int t = x / (DKP / 8), i = (x % (DKP / 8)) * 8;
            *(uint4 *)(qo + t * DKP + i) = *(const uint4 *)(Qt + t * LDK + i);
        }
        for (int x = tid; x < DKP * CH / 8; x += FG_T) {
            const int i = x / (CH / 8), t = (x % (CH / 8)) * 8;
            *(uint4 *)(ko + i * CH + t) = *(const uint4 *)(KtT + i * 72 + t);
        }
        for (int x = tid; x < CH * CH / 8; x += FG_T) {
            const int r = x / (CH / 8), t = (x % (CH / 8)) * 8;
            *(uint4 *)(ao + r * CH + t) = *(const uint4 *)(Aq + r * 72 + t);
        }
        for (int i = tid; i < DKP; i += FG_T) a.dec[ch * DKP + i] = dec[i];
        if (RM) put_u0(c, ch);
        GPROF(4);
    }
#ifdef HYLA_FUSED_PROFILE
    if (gp && nc > 0 && atomicAdd(&g_gprof_once, 1) == 0)
        printf("GLA chunk kernel profile (k_gla_chunk_f<%d>, cycles per chunk, mean of %d chunks): wait %.0f "
               "cumdecay %.0f tiles %.0f stage %.0f write-out %.0f\n",
               DKP, nc, (double)gacc[0] / nc, (double)gacc[1] / nc, (double)gacc[2] / nc, (double)gacc[3] / nc,
               (double)gacc[4] / nc);
#endif
#undef GPROF
}

/* ================================================================ host side */

/* GLA's split form forms its chunk tiles with k_gla_chunk_f (dk <= 128, on unless
 * HYLA_CUDA_GLA_TILES=0, its shared memory within the device's opt-in); else kernel A. */
static bool gla_tiles_ok(const hyla_cuda_ctx *c, int dkp) {
    if (!c->gla_tiles || dkp > 128) return false;
    return dkp_dispatch<128>(dkp, [&](auto D) { return GlaTilesSmem<decltype(D)::value>::TOTAL <= (size_t)c->smem_optin; });
}

static size_t smem_a_gdn(int dkp, int dvp) {
    return (size_t)2 * CH * (dkp + 8) * 2 + (size_t)CH * (dvp + 8) * 2 + (size_t)CH * 72 * 2 + (size_t)2 * CH * 65 * 4 +
           (size_t)2 * CH * 4 + (size_t)16 * 49 * 4;
}
static size_t smem_a_gla(int dkp) { return (size_t)CH * dkp * 4 + (size_t)2 * 4 * 16 * (dkp + 8) * 2; }

#ifdef HYLA_CUDA_SM90A
/* The copy engine's tensor maps for k_chunk_b_wg's TM form (ChunkBMaps); 0 where the driver's
 * encoder is missing or a map cannot be made (then the cp.async forms). */
static int chunkb_maps(ChunkBMaps *m, const ChunkArgs &ca, int gdn) {
    PFN_cuTensorMapEncodeTiled_v12000 enc = cu_tensor_map_encoder();
    const long long nch = (long long)ca.split_nc * ca.H; /* (chunk, head) tiles in the scratch */
    if (!enc || nch <= 0 || nch * 128 > 0x7fffffffLL) return 0;
    if (!gdn && !ca.gla_u0 && (ca.nrows <= 0 || ca.nrows > 0x7fffffffLL)) return 0;
    const cuuint32_t es[3] = {1, 1, 1};
    auto map2 = [&](CUtensorMap *dst, CUtensorMapDataType ty, const void *base, cuuint64_t cols, cuuint64_t rows,
                    cuuint32_t esz, cuuint32_t bx, cuuint32_t by) {
        const cuuint64_t dim[2] = {cols, rows}, str[1] = {cols * esz};
        const cuuint32_t box[2] = {bx, by};
        return enc(dst, ty, 2, (void *)base, dim, str, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                   CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
    };
    const cuuint64_t rows = (cuuint64_t)nch * CH;
    const CUtensorMapDataType BF = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, F32 = CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
    if (!map2(&m->qt, BF, ca.qt, 128, rows, 2, 64, CH) || !map2(&m->kt, BF, ca.ktT, CH, (cuuint64_t)nch * 128, 2, 64, 128) ||
        !map2(&m->aq, BF, ca.aqk, CH, rows, 2, 64, CH))
        return 0;
    if (gdn) return map2(&m->wt, BF, ca.wt, 128, rows, 2, 64, CH) && map2(&m->u, F32, ca.u0, ca.dv, rows, 4, 32, CH);
    if (ca.gla_u0) return map2(&m->u, F32, ca.u0, ca.dv, rows, 4, 32, CH);
    const cuuint64_t dim[3] = {(cuuint64_t)ca.dv, (cuuint64_t)ca.H, (cuuint64_t)ca.nrows};
    const cuuint64_t str[2] = {(cuuint64_t)ca.dv * 4, (cuuint64_t)ca.dv * 4 * ca.H};
    const cuuint32_t box[3] = {32, 1, CH};
    return enc(&m->u, F32, 3, (void *)ca.v, dim, str, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}
#endif

/* Kernel B on warpgroup products where c->chunk_b_wg (Hopper, unless HYLA_CUDA_CHUNK_B_WG=0) and
 * the keys pad to 128; else k_chunk_b in blocks of 32 value columns. The same bits. GDN with
 * tensor maps takes k_chunk_b_ws (H100, one sequence of 18 heads: 1.54 -> 1.46 ms at 32k, 6.00
 * -> 5.62 ms at 128k); GLA keeps k_chunk_b_wg, which measured level at 32k and 2 % faster at 128k
 * (1.43 / 5.51 against 1.43 / 5.60 ms): its chain is shorter (no W S), so a second warpgroup
 * buys less than its hand-over costs. (Blocks of 16
 * columns, for a tensor-parallel rank's few heads, were slower in the model: 154 k against 167 k
 * tok/s at 128k, and left for the lab's notes.) */
template <int DKP, int GDN, int ST>
static hyla_status launch_b(hyla_cuda_ctx *c, const ChunkArgs &ca, int nseq) {
#ifdef HYLA_CUDA_SM90A
    if (DKP == 128 && c->chunk_b_wg) {
        const dim3 grid(cu_blocks(ca.dv, 32), ca.H, nseq);
        const int tm = ca.dv % 4 == 0 && (GDN || ca.gla_u0 || ((uintptr_t)ca.v % 16 == 0));
        ChunkBMaps bm;
        memset(&bm, 0, sizeof bm);
        if (tm && smem_b_wg(1, 0) <= c->smem_optin && chunkb_maps(&bm, ca, GDN)) {
            if constexpr (GDN != 0) {
                if (smem_b_ws(GDN) <= c->smem_optin)
                    return cu_launch_dyn(c, k_chunk_b_ws<GDN>, grid, 256, smem_b_ws(GDN), ca, bm);
            } else if ((long long)grid.x * grid.y * grid.z > c->sm_count) {
                /* two blocks an SM want the whole carveout as shared memory (a hint) */
                (void)cudaFuncSetAttribute(k_chunk_b_wg<0, 2, 1, 1>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                           (int)cudaSharedmemCarveoutMaxShared);
                return cu_launch_dyn(c, k_chunk_b_wg<0, 2, 1, 1>, grid, 128, smem_b_wg(1, 1), ca, bm);
            }
            return cu_launch_dyn(c, k_chunk_b_wg<GDN, 2, 1, 0>, grid, 128, smem_b_wg(1, 0), ca, bm);
        }
        if (smem_b_wg(0, 0) <= c->smem_optin)
            return cu_launch_dyn(c, k_chunk_b_wg<GDN, 2, 0, 0>, grid, 128, smem_b_wg(0, 0), ca, bm);
    }
#endif
    return cu_launch_dyn(c, k_chunk_b<DKP, GDN, ST, 4>, dim3(cu_blocks(ca.dv, 32), ca.H, nseq), 128,
                         smem_b(DKP, GDN, ST), ca);
}

/* Blocks of kernel B that one SM of c's device holds at once (0 when the query fails). The
 * answer depends only on the kernel and the device, so it is asked once per device (this runs
 * on every prefill piece of every layer); devices past the table are asked every time. */
template <int DKP, int GDN, int ST>
static int b_blocks_per_sm(hyla_cuda_ctx *c) {
    static int known[16]; /* blocks + 1 per device ordinal, 0: not asked yet */
    int *slot = c->device >= 0 && c->device < 16 ? &known[c->device] : NULL;
    int k = slot ? __atomic_load_n(slot, __ATOMIC_RELAXED) : 0;
    if (k) return k - 1;
    int n = 0;
    size_t sb = smem_b(DKP, GDN, ST);
    if (cudaFuncSetAttribute(k_chunk_b<DKP, GDN, ST, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sb) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k_chunk_b<DKP, GDN, ST, 4>, 128, sb) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0; /* not remembered: asked again next time */
    }
    if (slot) __atomic_store_n(slot, n + 1, __ATOMIC_RELAXED);
    return n;
}

/* Two stages where they fit, except where the grid would need a second wave at two stages but
 * fits in one at one stage (e.g. one sequence, 18 heads, dv = 256: 144 blocks, one per SM at two
 * stages): each block walks its chunks in order, so a second wave doubles the time. The stages
 * only prefetch the next chunk's tiles: both give the same bits. */
template <int DKP, int GDN>
static hyla_status launch_b_st(hyla_cuda_ctx *c, const ChunkArgs &ca, int nseq) {
    if (smem_b(DKP, GDN, 2) > c->smem_optin) return launch_b<DKP, GDN, 1>(c, ca, nseq);
    const long long grid = (long long)cu_blocks(ca.dv, 32) * ca.H * nseq;
    if (grid > c->sm_count) {
        const long long two = (long long)b_blocks_per_sm<DKP, GDN, 2>(c) * c->sm_count;
        const long long one = (long long)b_blocks_per_sm<DKP, GDN, 1>(c) * c->sm_count;
        if (grid > two && grid <= one) return launch_b<DKP, GDN, 1>(c, ca, nseq);
    }
    return launch_b<DKP, GDN, 2>(c, ca, nseq);
}

template <int DKP>
static hyla_status launch_b_for(hyla_cuda_ctx *c, const ChunkArgs &ca, int nseq, int gdn) {
    return gdn ? launch_b_st<DKP, 1>(c, ca, nseq) : launch_b_st<DKP, 0>(c, ca, nseq);
}

/* Kernel B over the chunk tiles in ca's scratch: two stages of tiles where they fit. */
hyla_status cu_chunk_b_launch(hyla_cuda_ctx *c, const ChunkArgs &ca, int nseq, int gdn) {
    return dkp_dispatch<256>(ca.dkp, [&](auto D) { return launch_b_for<decltype(D)::value>(c, ca, nseq, gdn); });
}

template <int DKP>
static hyla_status launch_chunked(hyla_cuda_ctx *c, const ChunkArgs &ca, int gdn, int NC, int nseq, int dvp) {
    dim3 ga(NC, ca.H);
    if (gdn)
        HYLA_TRY(cu_launch_dyn(c, k_gdn_chunk_a<DKP>, ga, 128, smem_a_gdn(DKP, dvp), ca, dvp));
    else {
        if (gla_tiles_ok(c, DKP)) { /* GLA, dk <= 128: the 16-warp chunk kernel (HYLA_CUDA_GLA_TILES=0: kernel A) */
            ChunkArgs cf = ca;
            const unsigned gx = cu_split_runs(c, cf, NC, (size_t)NC * ca.H);
            if constexpr (DKP <= 128) {
                if (ca.gla_u0)
                    HYLA_TRY(cu_launch_dyn(c, k_gla_chunk_f<DKP, 1>, dim3(gx, ca.H), FG_T, GlaTilesSmem<DKP>::TOTAL, cf));
                else
                    HYLA_TRY(cu_launch_dyn(c, k_gla_chunk_f<DKP, 0>, dim3(gx, ca.H), FG_T, GlaTilesSmem<DKP>::TOTAL, cf));
            }
        } else
            HYLA_TRY(cu_launch_dyn(c, k_gla_chunk_a<DKP>, ga, 128, smem_a_gla(DKP), ca));
    }
    return cu_chunk_b_launch(c, ca, nseq, gdn);
}

/* The fused GLA pass (one block per sequence, head and 128 value columns): the bits of kernels
 * A and B. */
template <int DKP>
static hyla_status launch_gla_fused(hyla_cuda_ctx *c, const ChunkArgs &ca, int nseq) {
    return cu_launch_dyn(c, k_gla_fused<DKP>, dim3(cu_blocks(ca.dv, 128), ca.H, nseq), FG_T, GlaFusedSmem<DKP>::TOTAL, ca);
}

static size_t gla_fused_smem(int dkp) {
    if (dkp > 128) return (size_t)-1;
    return dkp_dispatch<128>(dkp, [](auto D) { return GlaFusedSmem<decltype(D)::value>::TOTAL; });
}

/* GLA likewise (dk <= 128). */
extern "C" int cu_gla_fused_ok(hyla_cuda_ctx *c, int dk) {
    const int dkp = pow2_dkp(dk);
    return dkp <= 128 && gla_fused_smem(dkp) <= c->smem_optin && smem_a_gla(dkp) <= c->smem_optin &&
           smem_b(dkp, 0, 1) <= c->smem_optin;
}

extern "C" int cu_lin_fused_ok(hyla_cuda_ctx *c, int gdn, int dk) {
    return gdn ? cu_gdn_fused_ok(c, dk) : cu_gla_fused_ok(c, dk);
}

extern "C" int cu_linattn_chunked_ok(hyla_cuda_ctx *c, int gdn, int H, int dk, int dv, int nseq) {
    const int dkp = pow2_dkp(dk), dvp = (dv + 15) / 16 * 16;
    if (cu_lin_fused_ok(c, gdn, dk) && H <= 65535 && nseq <= 65535) return 1;
    int ok = dkp <= 256 && dv <= 1024 && H <= 65535 && nseq <= 65535;
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
     * sequences are few and long: fewer (sequence, head, value block) blocks than a third of
     * the SMs (GLA: half) and more than 4 chunks per sequence on average. Both give the same
     * bits. H100, one run: one 8k sequence of 16 heads, dv = 128 (16 blocks) takes 0.63 ms split
     * and 0.93 ms fused, while the 1.68B GDN model (18 heads of dv = 256: 36 blocks) prefilled 32k
     * tokens in 0.327 s fused and 0.343 s split (kernels/cuda/dev/NOTES.md), so the bound was a
     * quarter of the SMs; since kernel B's outputs have a warpgroup of their own and the chunk
     * part's rows come by the copy engine, the split form leads at 36 blocks (120.1-120.4 against
     * 119.0-119.2 k tok/s at 32k, 119.4-119.9 against 119.1 at 128k), so a third. GLA: the fused
     * pass, or kernels A and B in the split case (the same bits again). GLA with a row map
     * (SSE) splits through k_gla_chunk_f only, which copies the chunks' v rows to u0 for
     * kernel B (gla_u0), and it takes the split form wherever the chunks are many: the 64-token
     * windows leave a partition's chunks about a quarter full, which the chunk kernel mostly
     * skips (gla_tiles) and the fused pass walks at full cost. H100s: the 1.3B SSE-H model's
     * 18 heads (1 + 4 sequences, 90 blocks) prefilled 128k tokens at 73.0 k tok/s split against
     * 71.5 k fused (32k: 99.7 k against 95.4 k); a tensor-parallel rank's 9 heads 112.5 k
     * against 98.1 k (BENCHMARKS.md "SSE-GLA's split form, TP halves' sums onto x"). */
    const int fused = cu_lin_fused_ok(c, gdn, dk);
    int split = 0;
    if (fused) {
        size_t blocks = (size_t)nseq * H * cu_blocks(dv, 128);
        split = NC > 4 * nseq && (blocks < (size_t)c->sm_count / (gdn ? 3 : 2) || (!gdn && rm));
        if (!gdn && rm && !gla_tiles_ok(c, dkp)) split = 0;
        if (!split && !gdn)
            return dkp_dispatch<128>(dkp, [&](auto D) { return launch_gla_fused<decltype(D)::value>(c, ca, nseq); });
        if (!split) return cu_gdn_fused_launch(c, ca, NC, nseq, 0);
    }
    if (rm && !fused) return hyla_fail(HYLA_ERR_UNSUPPORTED, "linear attention: a row map needs a fused kernel");
    /* scratch: per (chunk, head) tiles */
    size_t nch = (size_t)NC * H;
    ca.gla_u0 = !gdn && rm;
    size_t sz_qt = nch * CH * dkp * 2, sz_aqk = nch * CH * CH * 2, sz_u0 = gdn || ca.gla_u0 ? nch * CH * dv * 4 : 0;
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
    ca.split_nc = NC; /* kernel B's tensor maps span the scratch's NC * H tiles */
#undef AL
    if (split && gdn) return cu_gdn_fused_launch(c, ca, NC, nseq, 1);
    return dkp_dispatch<256>(dkp, [&](auto D) { return launch_chunked<decltype(D)::value>(c, ca, gdn, NC, nseq, dvp); });
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
    if (cu_gla_slabs(b->gdn, dk)) return cu_gla_slab_batch(c, b);
    if (!cu_linattn_chunked_ok(c, b->gdn, H, dk, dv, b->nseq)) {
        /* token loop, one sequence at a time */
        for (int z = 0; z < b->nseq; z++) {
            if (b->h_len[z] <= 0) continue;
            void *d_s;
            HYLA_TRY(cu_stage(c, &b->h_S[z], sizeof(float *), &d_s));
            size_t st = (size_t)b->h_start[z];
            hyla_cu_linrec r;
            cu_linrec_plain(&r, b->gdn, H, dk, dv, b->scale, b->h_len[z], b->q + st * H * dk, b->k + st * H * dk,
                            b->v + st * H * dv, b->gdn ? b->ga + st * H : b->ga + st * H * dk,
                            b->gdn ? b->gb + st * H : NULL, b->o + st * H * dv, (float *const *)d_s,
                            ((uintptr_t)b->h_S[z] & 15) == 0);
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
    if (cu_gla_slabs(gdn, dk)) return cu_gla_slab_prefill1(c, q, k, v, ga, n, H, dk, dv, scale, d_blk, states16, o);
    int NC = (n + CH - 1) / CH;
    size_t sp = ((size_t)(2 * NC + 2) * 4 + 7) & ~(size_t)7;
    const int32_t *t = (const int32_t *)d_blk;
    float *const *d_S = (float *const *)((const uint8_t *)d_blk + sp);
    if (cu_linattn_chunked_ok(c, gdn, H, dk, dv, 1))
        return cu_linattn_chunked_dev(c, gdn, H, dk, dv, scale, q, k, v, ga, gb, o, NC, 1, t, t + NC, t + 2 * NC,
                                      t + 2 * NC + 1, d_S, n);
    hyla_cu_linrec r; /* token loop */
    cu_linrec_plain(&r, gdn, H, dk, dv, scale, n, q, k, v, ga, gdn ? gb : NULL, o, d_S, states16);
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

