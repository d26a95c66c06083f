/* hyla_cuda_attn.cu — causal softmax attention with GQA and sliding window over paged bf16
 * KV (MODELS.md 5, [ATTN-2]).
 *
 * KV layout (hyla_ops.h): token p of a session lives in page p / page_tokens, row
 * p % page_tokens; a page is [page_tokens][Hk][D] bf16. New k, v are rounded to bf16 and
 * written into their pages first; queries then read only the cache, so prefill and decode see
 * the same bf16 keys and values.
 *
 * Prefill (D = 32, 64, 128): flash-attention style, each warp owns 16 query rows; key tiles of
 * 64 tokens are gathered from their pages into shared memory; S = Q K^T and O += P V run on
 * tensor cores (bf16, fp32 accumulation) with an online softmax in fp32 (max subtraction, exp
 * rescaling). k_attn_flash2: 4 warps per 64 queries, tiles streamed by cp.async into two
 * buffers (kernels/cuda/dev/NOTES.md: the plain-load and 8-warp forms it was measured against).
 * Calls whose keys reach past the split length (8192 keys; hyla_cuda_set_attn_split) cut them
 * into splits at absolute positions, one block per (query block, head, split), merged per row
 * by k_flash_combine.
 * Decode, and prefill for other head dims: split-K ("flash decoding"): one block per
 * (query, head, key split) runs an online softmax over blocks of 256 keys on CUDA cores and
 * writes (max, sum, acc); a combine kernel merges the splits in split order. All reductions
 * run in a fixed order: results are deterministic.
 * Threading: launched on the context's stream. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_cuda_impl.h"
#include "hyla_cuda_mma.cuh"
#include "hyla_log.h"

/* ---------------------------------------------------------------- KV write */

/* token t of this call (position pos[t] or pos0 + t) -> its page row, for k and v */
__global__ void k_kv_write(const float *k, const float *v, int n, int Hk, int D, int pos0, const int32_t *pos,
                           void *const *kp, void *const *vp, const int32_t *tab_off, int pt) {
    size_t per = (size_t)Hk * D;
    size_t total = (size_t)n * per;
    for (size_t x = (size_t)blockIdx.x * blockDim.x + threadIdx.x; x < total; x += (size_t)gridDim.x * blockDim.x) {
        size_t t = x / per, e = x % per;
        int p = pos ? pos[t] : pos0 + (int)t;
        int base = tab_off ? tab_off[t] : 0;
        __nv_bfloat16 *kd = (__nv_bfloat16 *)kp[base + p / pt], *vd = (__nv_bfloat16 *)vp[base + p / pt];
        size_t off = (size_t)(p % pt) * per + e;
        kd[off] = __float2bfloat16_rn(k[x]);
        vd[off] = __float2bfloat16_rn(v[x]);
    }
}

/* ---------------------------------------------------------------- split-K rows kernel */

#define AR_T 128
#define AR_KB 256
#define AR_MAXD 512
#define AD_SPLIT 512 /* decode: keys per split (fixed, so batching does not change a session's result) */

struct AttnRows {
    const float *q;    /* [nq][Hq][D] */
    int nq, Hq, Hk, D, window;
    float scale;
    int pos0;          /* prefill: query qi at pos0 + qi (pos == NULL) */
    const int32_t *pos;     /* decode: [nq] */
    const int32_t *tab_off; /* decode: [nq] offset into the page tables; prefill: NULL (0) */
    const int32_t *ptok;    /* decode: [nq] page_tokens; prefill: NULL (use pt) */
    int pt;
    void *const *kp, *const *vp;
    int split_len, nsplit;
    float *part; /* [nq][Hq][nsplit][D + 2] */
};

/* VEC: D % 8 == 0 and 128 % (D/8) == 0: keys and values move in 16-byte pieces; for P V the
 * block splits into G = 128/(D/8) groups of D/8 threads, group q summing keys q, q+G, ...
 * (merged in group order at the end). Otherwise one 2-byte element at a time. */
template <bool VEC>
__global__ void __launch_bounds__(AR_T) k_attn_rows(AttnRows a) {
    __shared__ __align__(16) float qs[AR_MAXD];
    __shared__ float sc[AR_KB];
    __shared__ float red[AR_T / 32];
    __shared__ __align__(16) float comb[VEC ? 1024 : 1];
    const int s = blockIdx.x, h = blockIdx.y, qi = blockIdx.z, tid = threadIdx.x;
    const int D = a.D, G = a.Hq / a.Hk, hk = h / G;
    const int qpos = a.pos ? a.pos[qi] : a.pos0 + qi;
    const int base = a.tab_off ? a.tab_off[qi] : 0;
    const int pt = a.ptok ? a.ptok[qi] : a.pt;
    int lo = a.window > 0 ? qpos - a.window + 1 : 0;
    if (lo < 0) lo = 0;
    int k0 = lo + s * a.split_len, k1 = k0 + a.split_len - 1;
    if (k1 > qpos) k1 = qpos;
    float *out = a.part + (((size_t)qi * a.Hq + h) * a.nsplit + s) * (D + 2);
    for (int d = tid; d < D; d += AR_T) qs[d] = a.q[((size_t)qi * a.Hq + h) * D + d] * a.scale;
    __syncthreads();
    float m = -INFINITY, l = 0.0f;
    const size_t rowsz = (size_t)a.Hk * D;
    /* VEC: this thread's 8 dims and key group */
    const int D8 = D / 8, NG = VEC ? AR_T / D8 : 1, grp = VEC ? tid / D8 : 0, d0 = VEC ? (tid % D8) * 8 : 0;
    float acc8[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    float acc[AR_MAXD / AR_T];
#pragma unroll
    for (int r = 0; r < AR_MAXD / AR_T; r++) acc[r] = 0.0f;
    for (int kb = k0; kb <= k1; kb += AR_KB) {
        int nk = k1 - kb + 1 < AR_KB ? k1 - kb + 1 : AR_KB;
        for (int i = tid; i < nk; i += AR_T) {
            int p = kb + i;
            const __nv_bfloat16 *kr = (const __nv_bfloat16 *)a.kp[base + p / pt] + (size_t)(p % pt) * rowsz + (size_t)hk * D;
            float dot = 0.0f;
            if (VEC) {
                for (int c = 0; c < D8; c++) {
                    uint4 u = *(const uint4 *)(kr + c * 8);
                    const __nv_bfloat162 *b2 = (const __nv_bfloat162 *)&u;
                    const float4 q0 = *(const float4 *)(qs + c * 8), q1 = *(const float4 *)(qs + c * 8 + 4);
                    float2 f0 = __bfloat1622float2(b2[0]), f1 = __bfloat1622float2(b2[1]);
                    float2 f2 = __bfloat1622float2(b2[2]), f3 = __bfloat1622float2(b2[3]);
                    dot += q0.x * f0.x + q0.y * f0.y + q0.z * f1.x + q0.w * f1.y + q1.x * f2.x + q1.y * f2.y +
                           q1.z * f3.x + q1.w * f3.y;
                }
            } else {
                for (int d = 0; d < D; d++) dot += qs[d] * __bfloat162float(kr[d]);
            }
            sc[i] = dot;
        }
        __syncthreads();
        float mb = -INFINITY;
        for (int i = tid; i < nk; i += AR_T) mb = fmaxf(mb, sc[i]);
        for (int o = 16; o; o >>= 1) mb = fmaxf(mb, __shfl_xor_sync(0xffffffffu, mb, o));
        if ((tid & 31) == 0) red[tid >> 5] = mb;
        __syncthreads();
        mb = red[0];
        for (int i = 1; i < AR_T / 32; i++) mb = fmaxf(mb, red[i]);
        float mn = fmaxf(m, mb);
        float corr = expf(m - mn); /* m = -inf on the first block: 0 */
        __syncthreads();
        for (int i = tid; i < nk; i += AR_T) sc[i] = expf(sc[i] - mn);
        __syncthreads();
        float ls = 0.0f;
        for (int i = 0; i < nk; i++) ls += sc[i]; /* same order in every thread */
        l = l * corr + ls;
        if (VEC) {
#pragma unroll
            for (int e = 0; e < 8; e++) acc8[e] *= corr;
            for (int i = grp; i < nk; i += NG) {
                int p = kb + i;
                const __nv_bfloat16 *vr =
                    (const __nv_bfloat16 *)a.vp[base + p / pt] + (size_t)(p % pt) * rowsz + (size_t)hk * D + d0;
                uint4 u = *(const uint4 *)vr;
                const __nv_bfloat162 *b2 = (const __nv_bfloat162 *)&u;
                float pi = sc[i];
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float2 f = __bfloat1622float2(b2[e]);
                    acc8[2 * e] += pi * f.x;
                    acc8[2 * e + 1] += pi * f.y;
                }
            }
        } else {
#pragma unroll
            for (int r = 0; r < AR_MAXD / AR_T; r++) {
                int d = tid + r * AR_T;
                if (d < D) {
                    float a2 = acc[r] * corr;
                    for (int i = 0; i < nk; i++) {
                        int p = kb + i;
                        const __nv_bfloat16 *vr =
                            (const __nv_bfloat16 *)a.vp[base + p / pt] + (size_t)(p % pt) * rowsz + (size_t)hk * D;
                        a2 += sc[i] * __bfloat162float(vr[d]);
                    }
                    acc[r] = a2;
                }
            }
        }
        m = mn;
        __syncthreads();
    }
    if (VEC) {
#pragma unroll
        for (int e = 0; e < 8; e++) comb[grp * D + d0 + e] = acc8[e];
        __syncthreads();
        for (int d = tid; d < D; d += AR_T) {
            float v = 0.0f;
            for (int q = 0; q < NG; q++) v += comb[q * D + d];
            out[d] = v;
        }
    } else {
#pragma unroll
        for (int r = 0; r < AR_MAXD / AR_T; r++) {
            int d = tid + r * AR_T;
            if (d < D) out[d] = acc[r];
        }
    }
    if (tid == 0) {
        out[D] = m;
        out[D + 1] = l;
    }
}

static bool rows_vec(int D) { return D % 8 == 0 && D <= 1024 && AR_T % (D / 8) == 0 && (AR_T / (D / 8)) * D <= 1024; }

__global__ void k_attn_combine(const float *part, int nq, int Hq, int D, int nsplit, float *o) {
    const int h = blockIdx.x, qi = blockIdx.y;
    const float *p = part + ((size_t)qi * Hq + h) * nsplit * (D + 2);
    float M = -INFINITY;
    for (int s = 0; s < nsplit; s++) M = fmaxf(M, p[(size_t)s * (D + 2) + D]);
    float L = 0.0f;
    for (int s = 0; s < nsplit; s++) {
        float ms = p[(size_t)s * (D + 2) + D];
        if (ms > -INFINITY) L += expf(ms - M) * p[(size_t)s * (D + 2) + D + 1];
    }
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float acc = 0.0f;
        for (int s = 0; s < nsplit; s++) {
            float ms = p[(size_t)s * (D + 2) + D];
            if (ms > -INFINITY) acc += expf(ms - M) * p[(size_t)s * (D + 2) + d];
        }
        o[((size_t)qi * Hq + h) * D + d] = acc / L;
    }
}

/* ---------------------------------------------------------------- flash prefill (tensor cores) */

#define FA_BQ 64
#define FA_BK 64

/* Key splits (split_len > 0, blockIdx.z = split s): the block runs the keys of
 * [s split_len, (s+1) split_len) only and writes, for each of its rows whose keys meet the
 * split, the unnormalised partial (O, m in log2 units, l) into part [n][Hq][nsplit][D + 2];
 * k_flash_combine then merges a row's splits in split order. The split boundaries are absolute
 * key positions, and key tiles past a row's position add exact zeros, so a row's result does not
 * depend on the call it is in (prefill pieces of any size give the same bits). split_len = 0:
 * one pass over all keys, o written directly. */
/* One 64-key tile of a flash block, for a warp's two query rows (r0 = 16 w + g, r1 = r0 + 8 at
 * positions p0, p1): S = Q K^T on the tile (K at Ks, V at Vs, rows of LD bf16), the causal /
 * window mask and keys past khi to -inf, the online softmax update of (m, l) in the log2 domain
 * and O = c O + P V. V rows past khi are zeroed in the fragments (k_attn_flash2, whose
 * shared tile may hold real rows there). */
template <int D>
__device__ __forceinline__ void fa_tile(const uint32_t (&qf)[D / 16][4], const __nv_bfloat16 *Ks, const __nv_bfloat16 *Vs,
                                        int kt, int khi, int p0, int p1, int window, float sl2, float &m0, float &m1,
                                        float &l0, float &l1, float (&oacc)[D / 8][4]) {
    constexpr int LD = D + 8;
    const int tq = (threadIdx.x & 31) & 3;
    float sacc[FA_BK / 8][4];
#pragma unroll
    for (int nt = 0; nt < FA_BK / 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) sacc[nt][e] = 0.0f;
#pragma unroll
    for (int kc = 0; kc < D / 16; kc++)
#pragma unroll
        for (int nt = 0; nt < FA_BK / 8; nt += 2) { /* two n8 tiles per ldmatrix.x4 */
            uint32_t bf[2][2];
            ldsm_frag_b2_nk(bf, Ks + (nt * 8) * LD + kc * 16, LD);
            mma_bf16_16816(sacc[nt], qf[kc], bf[0]);
            mma_bf16_16816(sacc[nt + 1], qf[kc], bf[1]);
        }
    /* mask and online softmax (log2 domain) */
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < FA_BK / 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int kpos = kt + nt * 8 + 2 * tq + (e & 1);
            int qpos = (e >> 1) ? p1 : p0;
            bool ok = kpos <= qpos && kpos <= khi && (window <= 0 || kpos > qpos - window);
            float v = ok ? sacc[nt][e] * sl2 : -INFINITY;
            sacc[nt][e] = v;
            if (e >> 1)
                mx1 = fmaxf(mx1, v);
            else
                mx0 = fmaxf(mx0, v);
        }
#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) {
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
    }
    float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    float b0 = mn0 == -INFINITY ? 0.0f : mn0, b1 = mn1 == -INFINITY ? 0.0f : mn1;
    float c0 = exp2f(m0 - b0), c1 = exp2f(m1 - b1);
    float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
    for (int nt = 0; nt < FA_BK / 8; nt++) {
        sacc[nt][0] = exp2f(sacc[nt][0] - b0);
        sacc[nt][1] = exp2f(sacc[nt][1] - b0);
        sacc[nt][2] = exp2f(sacc[nt][2] - b1);
        sacc[nt][3] = exp2f(sacc[nt][3] - b1);
        s0 += sacc[nt][0] + sacc[nt][1];
        s1 += sacc[nt][2] + sacc[nt][3];
    }
#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) {
        s0 += __shfl_xor_sync(0xffffffffu, s0, off);
        s1 += __shfl_xor_sync(0xffffffffu, s1, off);
    }
    l0 = l0 * c0 + s0;
    l1 = l1 * c1 + s1;
    m0 = mn0;
    m1 = mn1;
#pragma unroll
    for (int nt = 0; nt < D / 8; nt++) {
        oacc[nt][0] *= c0;
        oacc[nt][1] *= c0;
        oacc[nt][2] *= c1;
        oacc[nt][3] *= c1;
    }
    /* O += P V with the V rows past khi zeroed (only in a tile that reaches past khi, which for a
     * warp happens once) */
    const bool vcut = kt + FA_BK - 1 > khi;
#pragma unroll
    for (int kc = 0; kc < FA_BK / 16; kc++) {
        uint32_t pf[4];
        pf[0] = pack_bf16x2(sacc[2 * kc][0], sacc[2 * kc][1]);
        pf[1] = pack_bf16x2(sacc[2 * kc][2], sacc[2 * kc][3]);
        pf[2] = pack_bf16x2(sacc[2 * kc + 1][0], sacc[2 * kc + 1][1]);
        pf[3] = pack_bf16x2(sacc[2 * kc + 1][2], sacc[2 * kc + 1][3]);
        /* ldsm_frag_b2_kn: reg 0 of a tile holds keys 2tq (low half), 2tq + 1 (high); reg 1 keys
         * 2tq + 8, 2tq + 9 (of this 16-key step) */
        const int kb = kt + kc * 16 + 2 * tq;
        const uint32_t keep0 = (kb <= khi ? 0x0000ffffu : 0u) | (kb + 1 <= khi ? 0xffff0000u : 0u);
        const uint32_t keep1 = (kb + 8 <= khi ? 0x0000ffffu : 0u) | (kb + 9 <= khi ? 0xffff0000u : 0u);
#pragma unroll
        for (int nt = 0; nt < D / 8; nt += 2) { /* two n8 tiles per ldmatrix.x4.trans */
            uint32_t bf[2][2];
            ldsm_frag_b2_kn(bf, Vs + (kc * 16) * LD + nt * 8, LD);
            if (vcut) {
                bf[0][0] &= keep0;
                bf[1][0] &= keep0;
                bf[0][1] &= keep1;
                bf[1][1] &= keep1;
            }
            mma_bf16_16816(oacc[nt], pf, bf[0]);
            mma_bf16_16816(oacc[nt + 1], pf, bf[1]);
        }
    }
}

/* The end of a flash block for a warp's two rows (r0, r1 of the block q0, nq valid): with
 * split_len, the partials (O, m, l) of the rows whose keys meet this split, which
 * k_flash_combine reads; without, O / l, as k_flash_combine computes it for a row whose keys all
 * lie in one split (there the weight 2^(m - M) is exactly 1), so a call whose keys fit one split
 * skips the partials and gives the same bits. */
template <int D>
__device__ __forceinline__ void fa_finish(const float (&oacc)[D / 8][4], float m0, float m1, float l0, float l1, int q0,
                                          int nq, int r0, int r1, int p0, int p1, int h, int Hq, int window, int split,
                                          int split_len, int nsplit, float *part, float *o) {
    const int tq = (threadIdx.x & 31) & 3;
    if (split_len) {
        const int sl = split * split_len, sh = sl + split_len - 1;
        const bool w0 = r0 < nq && sl <= p0 && (window <= 0 || sh > p0 - window);
        const bool w1 = r1 < nq && sl <= p1 && (window <= 0 || sh > p1 - window);
        float *pr0 = part + (((size_t)(q0 + r0) * Hq + h) * nsplit + split) * (D + 2);
        float *pr1 = part + (((size_t)(q0 + r1) * Hq + h) * nsplit + split) * (D + 2);
#pragma unroll
        for (int nt = 0; nt < D / 8; nt++) {
            int d = nt * 8 + 2 * tq;
            if (w0) *(float2 *)(pr0 + d) = make_float2(oacc[nt][0], oacc[nt][1]);
            if (w1) *(float2 *)(pr1 + d) = make_float2(oacc[nt][2], oacc[nt][3]);
        }
        if (tq == 0) {
            if (w0) *(float2 *)(pr0 + D) = make_float2(m0, l0);
            if (w1) *(float2 *)(pr1 + D) = make_float2(m1, l1);
        }
        return;
    }
#pragma unroll
    for (int nt = 0; nt < D / 8; nt++) {
        int d = nt * 8 + 2 * tq;
        if (r0 < nq) {
            float *op = o + ((size_t)(q0 + r0) * Hq + h) * D + d;
            op[0] = l0 > 0.0f ? oacc[nt][0] / l0 : 0.0f;
            op[1] = l0 > 0.0f ? oacc[nt][1] / l0 : 0.0f;
        }
        if (r1 < nq) {
            float *op = o + ((size_t)(q0 + r1) * Hq + h) * D + d;
            op[0] = l1 > 0.0f ? oacc[nt][2] / l1 : 0.0f;
            op[1] = l1 > 0.0f ? oacc[nt][3] / l1 : 0.0f;
        }
    }
}

/* k_attn_flash2: one block of 4 warps per (64 queries, head[, key split]); each warp owns 16
 * query rows. The block streams 64-key tiles through two shared-memory buffers (cp.async,
 * 16-byte pieces gathered row by row from the pages: a tile may span pages; tile t + 1 loads
 * while tile t computes) and runs fa_tile on each, fa_finish at the end. The block's key range
 * [klo, khi] comes from its queries, the window and the split. The code keeps the general form
 * of a block of two 64-query halves (the 8-warp form measured in kernels/cuda/dev/NOTES.md);
 * with 4 warps half 1 is always empty, so every tile is half 0's. K rows past khi are masked to
 * -inf whatever they hold; V rows past khi are zeroed in the fragment registers (+0 bf16).
 * Shared memory: 2 buffers x (K, V) x [64][D + 8] bf16 (69,632 bytes at D = 128); the Q tile is
 * staged in buffer 1 until its fragments are in registers, while tile 0 streams into buffer 0.
 * Registers (sm_90, no spills): 168 at D = 128, three blocks per SM. Tiles past a row's
 * position would be bit-neutral too (all masked), but they are skipped so that a row's
 * sequence of tiles does not depend on the call. */
template <int D>
__global__ void __launch_bounds__(128, 3) k_attn_flash2(const float *q, int n, int Hq, int Hk, int pos0, int window,
                                                        float scale, void *const *kp, void *const *vp, int pt,
                                                        float *o, int split_len, int nsplit, float *part) {
    constexpr int NW = 4; /* warps: one 64-query half per block */
    constexpr int LD = D + 8, TILE = FA_BK * LD, NT = 32 * NW, BQ = 16 * NW;
    extern __shared__ __align__(16) unsigned char fa_smem[];
    __nv_bfloat16 *sm = (__nv_bfloat16 *)fa_smem; /* buffer b: K at sm + 2b TILE, V at sm + (2b+1) TILE */
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2;
    const int half = w >> 2, wl = w & 3;
    const int h = blockIdx.y, hk = h / (Hq / Hk), split = blockIdx.z;
    const int qB = blockIdx.x * BQ; /* first query of the block (call-relative) */
    const int nqB = n - qB < BQ ? n - qB : BQ;
    /* each half's queries q0, nq and keys [klo, khi] (empty: klo > khi) */
    int lo0, hi0, lo1, hi1;
    {
        int lo[2], hi[2];
#pragma unroll
        for (int s = 0; s < 2; s++) {
            const int q0s = qB + FA_BQ * s, nqs = n - q0s < FA_BQ ? n - q0s : FA_BQ;
            int klo = window > 0 ? pos0 + q0s - window + 1 : 0;
            if (klo < 0) klo = 0;
            int khi = pos0 + q0s + nqs - 1;
            if (split_len) {
                if (split * split_len > klo) klo = split * split_len;
                if ((split + 1) * split_len - 1 < khi) khi = (split + 1) * split_len - 1;
            }
            if (nqs <= 0 || s >= NW / 4) klo = khi + 1;
            lo[s] = klo;
            hi[s] = khi;
        }
        lo0 = lo[0], hi0 = hi[0], lo1 = lo[1], hi1 = hi[1];
    }
    /* passes (first tile, last key loaded); lo1 >= lo0 and hi1 >= hi0. A half computes the
     * tiles of its own grid only (kt = klo_h + 64 i), so in two passes each half skips the other's */
    int st0 = 0, end0 = -1, nt0 = 0, st1 = 0, end1 = -1, nt1 = 0;
    const bool e0 = lo0 > hi0, e1 = lo1 > hi1;
    if (e0 && !e1) {
        st0 = lo1, end0 = hi1;
    } else if (!e0 && e1) {
        st0 = lo0, end0 = hi0;
    } else if (!e0 && !e1) {
        if ((lo1 - lo0) % FA_BK == 0) {
            st0 = lo0, end0 = hi1;
        } else {
            st0 = lo0, end0 = hi0;
            st1 = lo1, end1 = hi1;
        }
    }
    if (end0 >= st0) nt0 = (end0 - st0) / FA_BK + 1;
    if (end1 >= st1) nt1 = (end1 - st1) / FA_BK + 1;
    const int ntile = nt0 + nt1;
    const size_t rowsz = (size_t)Hk * D;
    /* tile j -> buffer b: rows past the pass's last key zero-filled (src-size 0) */
    auto load = [&](int j, int b) {
        const bool p1 = j >= nt0;
        const int kt = p1 ? st1 + (j - nt0) * FA_BK : st0 + j * FA_BK, end = p1 ? end1 : end0;
        __nv_bfloat16 *Kd = sm + 2 * b * TILE, *Vd = Kd + TILE;
#pragma unroll 1
        for (int x = tid; x < FA_BK * (D / 8); x += NT) {
            const int r = x / (D / 8), c8 = x % (D / 8), p = kt + r, pc = p <= end ? p : end;
            const size_t off = (size_t)(pc % pt) * rowsz + (size_t)hk * D + c8 * 8;
            const int bytes = p <= end ? 16 : 0;
            cp_async16(Kd + r * LD + c8 * 8, (const __nv_bfloat16 *)kp[pc / pt] + off, bytes);
            cp_async16(Vd + r * LD + c8 * 8, (const __nv_bfloat16 *)vp[pc / pt] + off, bytes);
        }
        cp_async_commit();
    };
    if (ntile > 0) load(0, 0);
    /* Q tile (bf16) in buffer 1 */
    {
        __nv_bfloat16 *Qs = sm + 2 * TILE;
        for (int x = tid; x < BQ * (D / 4); x += NT) {
            const int r = x / (D / 4), d = (x % (D / 4)) * 4;
            float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            if (r < nqB) {
                const float *src = q + ((size_t)(qB + r) * Hq + h) * D + d; /* 4-byte aligned only */
#pragma unroll
                for (int e = 0; e < 4; e++) v[e] = src[e];
            }
            __nv_bfloat162 *dst = (__nv_bfloat162 *)(Qs + r * LD + d);
            dst[0] = __floats2bfloat162_rn(v[0], v[1]);
            dst[1] = __floats2bfloat162_rn(v[2], v[3]);
        }
    }
    __syncthreads();
    uint32_t qf[D / 16][4];
#pragma unroll
    for (int kc = 0; kc < D / 16; kc++) ldsm_frag_a(qf[kc], sm + 2 * TILE + (16 * w) * LD + kc * 16, LD);
    __syncthreads(); /* buffer 1 free for tile 1 */

    /* this warp's half (queries from q0 = qB + 64 half) and its two query rows */
    const int q0 = qB + FA_BQ * half, nq = n - q0 < FA_BQ ? n - q0 : FA_BQ;
    const int klo = half ? lo1 : lo0, khi = half ? hi1 : hi0;
    const int r0 = 16 * wl + g, r1 = r0 + 8;
    const int p0 = pos0 + q0 + r0, p1 = pos0 + q0 + r1;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    float oacc[D / 8][4];
#pragma unroll
    for (int nt = 0; nt < D / 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) oacc[nt][e] = 0.0f;
    const float sl2 = scale * 1.4426950408889634f; /* exp(x) = exp2(x log2 e) */
    for (int j = 0; j < ntile; j++) {
        if (j + 1 < ntile)
            load(j + 1, (j + 1) & 1);
        else
            cp_async_commit(); /* an empty group: wait_group 1 below then waits for tile j */
        cp_async_wait<1>();
        __syncthreads(); /* tile j in buffer j & 1, visible to all warps */
        const int kt = j >= nt0 ? st1 + (j - nt0) * FA_BK : st0 + j * FA_BK;
        /* one of this half's tiles (kt = klo + 64 i <= khi) */
        if (kt >= klo && kt <= khi && (kt - klo) % FA_BK == 0) {
            const __nv_bfloat16 *Ks = sm + 2 * (j & 1) * TILE, *Vs = Ks + TILE;
            fa_tile<D>(qf, Ks, Vs, kt, khi, p0, p1, window, sl2, m0, m1, l0, l1, oacc);
        }
        __syncthreads(); /* buffer j & 1 fully read before tile j + 2 streams into it */
    }
    if (nq <= 0) return;
    fa_finish<D>(oacc, m0, m1, l0, l1, q0, nq, r0, r1, p0, p1, h, Hq, window, split, split_len, nsplit, part, o);
}

/* Row qi (position pos0 + qi) of a split flash prefill: its splits s_lo..s_hi (those holding
 * keys of its window) merged in split order, o = sum_s 2^(m_s - M) O_s / sum_s 2^(m_s - M) l_s. */
__global__ void k_flash_combine(const float *part, int Hq, int D, int nsplit, int split_len, int pos0, int window,
                                float *o) {
    const int h = blockIdx.x, qi = blockIdx.y, p = pos0 + qi;
    const int s_hi = p / split_len, lo = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0, s_lo = lo / split_len;
    const float *pp = part + ((size_t)qi * Hq + h) * nsplit * (D + 2);
    float M = -INFINITY;
    for (int s = s_lo; s <= s_hi; s++) M = fmaxf(M, pp[(size_t)s * (D + 2) + D]);
    float L = 0.0f;
    for (int s = s_lo; s <= s_hi; s++) {
        float ms = pp[(size_t)s * (D + 2) + D];
        if (ms > -INFINITY) L += exp2f(ms - M) * pp[(size_t)s * (D + 2) + D + 1];
    }
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float acc = 0.0f;
        for (int s = s_lo; s <= s_hi; s++) {
            float ms = pp[(size_t)s * (D + 2) + D];
            if (ms > -INFINITY) acc += exp2f(ms - M) * pp[(size_t)s * (D + 2) + d];
        }
        o[((size_t)qi * Hq + h) * D + d] = L > 0.0f ? acc / L : 0.0f;
    }
}

/* ---------------------------------------------------------------- host side */

static unsigned grid_of(size_t n) {
    size_t b = (n + 255) / 256;
    if (b > 65535u * 8) b = 65535u * 8;
    return (unsigned)(b ? b : 1);
}

static hyla_status check_view(const hyla_kv_view *kv, int lo, int hi, const char *what, int b) {
    if (kv->page_tokens <= 0) return hyla_fail(HYLA_ERR_INVALID_ARG, "%s: session %d: page_tokens %d", what, b, kv->page_tokens);
    if (hi / kv->page_tokens >= kv->n_pages)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "%s: session %d: position %d needs page %d of %d", what, b, hi,
                         hi / kv->page_tokens, kv->n_pages);
    for (int p = lo / kv->page_tokens; p <= hi / kv->page_tokens; p++)
        if (!kv->k_pages[p] || !kv->v_pages[p])
            return hyla_fail(HYLA_ERR_INVALID_ARG, "%s: session %d: page %d (positions %d..%d) is not allocated",
                             what, b, p, p * kv->page_tokens, (p + 1) * kv->page_tokens - 1);
    return HYLA_OK;
}

/* Flash prefill for the head dims it is built for: k_attn_flash2 (4 warps per 64 queries, K/V
 * tiles by cp.async into two buffers). The kernel is part of what the bits of one-pass calls
 * depend on. */
template <int D>
static hyla_status flash_launch(hyla_cuda_ctx *c, unsigned ng, int Hq, int nsplit, const float *q, int n, int Hk,
                                int pos0, int window, float scale, void *const *kp, void *const *vp, int pt, float *o,
                                int split_len, float *part) {
    const size_t sm = (size_t)4 * FA_BK * (D + 8) * 2; /* 2 buffers of K and V; Q staged in one */
    return cu_launch_dyn(c, k_attn_flash2<D>, dim3(cu_blocks(ng, 64), Hq, nsplit), 128, sm, q, n, Hq, Hk, pos0, window,
                         scale, kp, vp, pt, o, split_len, nsplit, part);
}

extern "C" hyla_status cu_attn_prefill(void *ctx, const float *q, const float *k, const float *v, int n, int Hq,
                                       int Hk, int D, int pos0, const hyla_kv_view *kv, int window, float scale,
                                       float *o) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    if (n <= 0) return HYLA_OK;
    if (Hk <= 0 || Hq % Hk || D <= 0 || D > AR_MAXD || pos0 < 0)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "attn_prefill: Hq=%d Hk=%d D=%d pos0=%d", Hq, Hk, D, pos0);
    int lo = window > 0 ? pos0 - window + 1 : 0;
    if (lo < 0) lo = 0;
    HYLA_TRY(check_view(kv, lo, pos0 + n - 1, "attn_prefill", 0));
    /* page tables: k pointers then v pointers */
    int np = kv->n_pages;
    void **tab = (void **)malloc((size_t)2 * np * sizeof(void *));
    if (!tab) return hyla_fail(HYLA_ERR_NOMEM, "attn_prefill: out of host memory");
    memcpy(tab, kv->k_pages, (size_t)np * sizeof(void *));
    memcpy(tab + np, kv->v_pages, (size_t)np * sizeof(void *));
    void *d_tab;
    hyla_status st = cu_stage(c, tab, (size_t)2 * np * sizeof(void *), &d_tab);
    free(tab);
    HYLA_TRY(st);
    void *const *kp = (void *const *)d_tab, *const *vp = (void *const *)d_tab + np;
    k_kv_write<<<grid_of((size_t)n * Hk * D), 256, 0, c->stream>>>(k, v, n, Hk, D, pos0, NULL, kp, vp, NULL,
                                                                   kv->page_tokens);
    CU_LAUNCH_CHECK("kv write");
    if (D == 32 || D == 64 || D == 128) {
        const int L = c->attn_split_len;
        /* queries in groups (multiples of the query block) so the partials stay under 256 MiB */
        int group = n;
        void *scr = NULL;
        if (L && (pos0 + n - 1) / L > 0) { /* partials only where some group has two splits or more */
            const int nsplit_max = (pos0 + n - 1) / L + 1;
            const size_t per_q = (size_t)Hq * nsplit_max * (D + 2) * 4;
            size_t g = ((size_t)256 << 20) / per_q / FA_BQ * FA_BQ;
            group = g < FA_BQ ? FA_BQ : (g > (size_t)n ? n : (int)g);
            HYLA_TRY(cu_scratch(c, SCR_ATTN, per_q * group, &scr));
        }
        for (int g0 = 0; g0 < n; g0 += group) {
            const int ng = n - g0 < group ? n - g0 : group, gp0 = pos0 + g0;
            const int nsplit = L ? (gp0 + ng - 1) / L + 1 : 1;
            const int Lg = nsplit > 1 ? L : 0; /* keys in one split: the direct pass, the same bits */
            const float *qg = q + (size_t)g0 * Hq * D;
            float *og = o + (size_t)g0 * Hq * D, *part = (float *)scr;
            if (D == 32)
                HYLA_TRY(flash_launch<32>(c, ng, Hq, nsplit, qg, ng, Hk, gp0, window, scale, kp, vp,
                                          kv->page_tokens, og, Lg, part));
            else if (D == 64)
                HYLA_TRY(flash_launch<64>(c, ng, Hq, nsplit, qg, ng, Hk, gp0, window, scale, kp, vp,
                                          kv->page_tokens, og, Lg, part));
            else
                HYLA_TRY(flash_launch<128>(c, ng, Hq, nsplit, qg, ng, Hk, gp0, window, scale, kp, vp,
                                           kv->page_tokens, og, Lg, part));
            if (Lg) {
                k_flash_combine<<<dim3(Hq, ng), D, 0, c->stream>>>(part, Hq, D, nsplit, L, gp0, window, og);
                CU_LAUNCH_CHECK("attn flash combine");
            }
        }
        return HYLA_OK;
    }
    /* split-K rows, queries in groups so the partials stay bounded */
    int span = window > 0 && window < pos0 + n ? window : pos0 + n;
    int split_len = 1024;
    int nsplit = (span + split_len - 1) / split_len;
    size_t per_q = (size_t)Hq * nsplit * (D + 2) * 4;
    int group = (int)(((size_t)256 << 20) / per_q);
    if (group < 1) group = 1;
    if (group > 65535) group = 65535;
    if (group > n) group = n;
    void *scr;
    HYLA_TRY(cu_scratch(c, SCR_ATTN, per_q * group, &scr));
    for (int q0 = 0; q0 < n; q0 += group) {
        int nq = n - q0 < group ? n - q0 : group;
        AttnRows a;
        memset(&a, 0, sizeof a);
        a.q = q + (size_t)q0 * Hq * D;
        a.nq = nq;
        a.Hq = Hq;
        a.Hk = Hk;
        a.D = D;
        a.window = window;
        a.scale = scale;
        a.pos0 = pos0 + q0;
        a.pt = kv->page_tokens;
        a.kp = kp;
        a.vp = vp;
        a.split_len = split_len;
        a.nsplit = nsplit;
        a.part = (float *)scr;
        if (rows_vec(D))
            k_attn_rows<true><<<dim3(nsplit, Hq, nq), AR_T, 0, c->stream>>>(a);
        else
            k_attn_rows<false><<<dim3(nsplit, Hq, nq), AR_T, 0, c->stream>>>(a);
        CU_LAUNCH_CHECK("attn rows");
        k_attn_combine<<<dim3(Hq, nq), 128, 0, c->stream>>>((float *)scr, nq, Hq, D, nsplit,
                                                             o + (size_t)q0 * Hq * D);
        CU_LAUNCH_CHECK("attn combine");
    }
    return HYLA_OK;
}

/* Checks of attn_decode's arguments (host): every needed page exists. *nptr: pages over all
 * sessions; *nsplit: 512-key splits of the longest span. */
extern "C" hyla_status cu_attn_decode_plan(int B, int Hq, int Hk, int D, const int32_t *pos, const hyla_kv_view *kv,
                                           int window, size_t *nptr, int *nsplit) {
    if (Hk <= 0 || Hq % Hk || D <= 0 || D > AR_MAXD)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "attn_decode: Hq=%d Hk=%d D=%d", Hq, Hk, D);
    size_t np = 0;
    int maxspan = 1;
    for (int b = 0; b < B; b++) {
        if (pos[b] < 0) return hyla_fail(HYLA_ERR_INVALID_ARG, "attn_decode: session %d: position %d", b, pos[b]);
        int lo = window > 0 ? pos[b] - window + 1 : 0;
        if (lo < 0) lo = 0;
        HYLA_TRY(check_view(&kv[b], lo, pos[b], "attn_decode", b));
        if (kv[b].page_tokens != kv[0].page_tokens)
            return hyla_fail(HYLA_ERR_UNSUPPORTED, "attn_decode: sessions with different page sizes in one batch");
        np += (size_t)kv[b].n_pages;
        if (pos[b] - lo + 1 > maxspan) maxspan = pos[b] - lo + 1;
    }
    *nptr = np;
    *nsplit = (maxspan + AD_SPLIT - 1) / AD_SPLIT;
    return HYLA_OK;
}

/* The staged block of attn_decode: k tables [cap], v tables [cap] (same offsets), then int32
 * tab_off [B], pos [B], page_tokens [B]. cap >= the pages of all sessions (the rest unused). */
extern "C" size_t cu_attn_decode_block_bytes(int B, size_t cap) {
    return cap * 2 * sizeof(void *) + (size_t)B * 3 * sizeof(int32_t);
}
extern "C" void cu_attn_decode_block(void *blk, int B, size_t cap, const int32_t *pos, const hyla_kv_view *kv) {
    void **kt = (void **)blk, **vt = kt + cap;
    int32_t *toff = (int32_t *)(vt + cap), *hpos = toff + B, *hpt = hpos + B;
    size_t at = 0;
    for (int b = 0; b < B; b++) {
        toff[b] = (int32_t)at;
        hpos[b] = pos[b];
        hpt[b] = kv[b].page_tokens;
        memcpy(kt + at, kv[b].k_pages, (size_t)kv[b].n_pages * sizeof(void *));
        memcpy(vt + at, kv[b].v_pages, (size_t)kv[b].n_pages * sizeof(void *));
        at += (size_t)kv[b].n_pages;
    }
    if (at < cap) { /* unused tail: defined bytes (graphs compare nothing here, but keep it clean) */
        memset(kt + at, 0, (cap - at) * sizeof(void *));
        memset(vt + at, 0, (cap - at) * sizeof(void *));
    }
}

/* attn_decode with its block already on the device (d_blk, laid out as above). */
extern "C" hyla_status cu_attn_decode_dev(hyla_cuda_ctx *c, const float *q, const float *k, const float *v, int B,
                                          int Hq, int Hk, int D, const void *d_blk, size_t cap, int page_tokens,
                                          int nsplit, int window, float scale, float *o) {
    if (B <= 0) return HYLA_OK;
    void *const *kp = (void *const *)d_blk, *const *vp = (void *const *)d_blk + cap;
    const int32_t *d_toff = (const int32_t *)((void *const *)d_blk + 2 * cap);
    const int32_t *d_pos = d_toff + B, *d_pt = d_pos + B;
    k_kv_write<<<grid_of((size_t)B * Hk * D), 256, 0, c->stream>>>(k, v, B, Hk, D, 0, d_pos, kp, vp, d_toff,
                                                                   page_tokens);
    CU_LAUNCH_CHECK("kv write");
    /* Splits of a fixed length: a session's splits (and so its result) do not depend on the
     * other sessions of the batch. Sessions with shorter spans leave their last splits empty. */
    void *scr;
    HYLA_TRY(cu_scratch(c, SCR_ATTN, (size_t)B * Hq * nsplit * (D + 2) * 4, &scr));
    AttnRows a;
    memset(&a, 0, sizeof a);
    a.q = q;
    a.nq = B;
    a.Hq = Hq;
    a.Hk = Hk;
    a.D = D;
    a.window = window;
    a.scale = scale;
    a.pos = d_pos;
    a.tab_off = d_toff;
    a.ptok = d_pt;
    a.pt = page_tokens;
    a.kp = kp;
    a.vp = vp;
    a.split_len = AD_SPLIT;
    a.nsplit = nsplit;
    a.part = (float *)scr;
    if (rows_vec(D))
        k_attn_rows<true><<<dim3(nsplit, Hq, B), AR_T, 0, c->stream>>>(a);
    else
        k_attn_rows<false><<<dim3(nsplit, Hq, B), AR_T, 0, c->stream>>>(a);
    CU_LAUNCH_CHECK("attn rows");
    k_attn_combine<<<dim3(Hq, B), 128, 0, c->stream>>>((float *)scr, B, Hq, D, nsplit, o);
    CU_LAUNCH_CHECK("attn combine");
    return HYLA_OK;
}

extern "C" hyla_status cu_attn_decode(void *ctx, const float *q, const float *k, const float *v, int B, int Hq,
                                      int Hk, int D, const int32_t *pos, const hyla_kv_view *kv, int window,
                                      float scale, float *o) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    if (B <= 0) return HYLA_OK;
    size_t nptr;
    int nsplit;
    HYLA_TRY(cu_attn_decode_plan(B, Hq, Hk, D, pos, kv, window, &nptr, &nsplit));
    size_t bytes = cu_attn_decode_block_bytes(B, nptr);
    void *blk = malloc(bytes);
    if (!blk) return hyla_fail(HYLA_ERR_NOMEM, "attn_decode: out of host memory");
    cu_attn_decode_block(blk, B, nptr, pos, kv);
    void *d_blk;
    hyla_status st = cu_stage(c, blk, bytes, &d_blk);
    free(blk);
    HYLA_TRY(st);
    return cu_attn_decode_dev(c, q, k, v, B, Hq, Hk, D, d_blk, nptr, kv[0].page_tokens, nsplit, window, scale, o);
}
