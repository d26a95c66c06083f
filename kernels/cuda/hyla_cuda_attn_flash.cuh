/* hyla_cuda_attn_flash.cuh — the flash-attention prefill kernel (internal to kernels/cuda): one
 * 64-key tile step (fa_tile), the end of a block (fa_finish) and the kernel k_attn_flash2<D, NW>
 * (the product runs NW = 4 warps, the kernel lab also 8). Included by
 * hyla_cuda_attn.cu (the launches, the split combine) and by the kernel lab's
 * kernels/cuda/dev/attn_flash_forms.cu, which runs the same code in its other forms, so the forms
 * it measures and the product's cannot drift apart.
 * Tensor cores: bf16 inputs, fp32 accumulation (mma.sync m16n8k16, hyla_cuda_mma.cuh). */
#ifndef HYLA_CUDA_ATTN_FLASH_CUH
#define HYLA_CUDA_ATTN_FLASH_CUH
#include "hyla_cuda_impl.h"
#include "hyla_cuda_mma.cuh"
#include "hyla_cuda_tma.cuh"
#include "hyla_cuda_wgmma.cuh"

#define FA_BQ 64
#define FA_BK 64
#define FA_MAX_SLACK 8.0f /* fa_softmax_c: how far a tile's max may pass the running max before it moves */

/* Key splits (split_len > 0, blockIdx.z = split s): the block runs the keys of
 * [s split_len, (s+1) split_len) only and writes, for each of its rows whose keys meet the
 * split, the unnormalised partial (O, m in log2 units, l) into part [n][Hq][nsplit][D + 2];
 * k_flash_combine then merges a row's splits in split order (fa_fold_ml). The split boundaries
 * are absolute key positions, and key tiles past a row's position add exact zeros, so a row's
 * result does not depend on the call it is in (prefill pieces of any size give the same bits).
 * split_len = 0: one pass over all keys, o written directly. k_attn_wg also walks: split_len > 0
 * with part = NULL (calls without a window), one block runs all of its rows' splits one after
 * the other and merges each into o as it ends, with k_flash_combine's arithmetic: the same bits
 * as the partials and the combine, without them (cu_attn_prefill takes it for calls of many
 * blocks, the partials where a call needs the splits' parallelism). */
/* A warp's online softmax state for its two query rows at the start of a block: running max
 * m = -inf and sum l = 0 (log2 domain), O = 0. */
template <int D>
__device__ __forceinline__ void fa_begin(float &m0, float &m1, float &l0, float &l1, float (&oacc)[D / 8][4]) {
    m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
#pragma unroll
    for (int nt = 0; nt < D / 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) oacc[nt][e] = 0.0f;
}

/* O's rows scaled by the softmax step's correction (c0: row r0, c1: row r1) */
template <int D>
__device__ __forceinline__ void fa_rescale(float (&oacc)[D / 8][4], float c0, float c1) {
#pragma unroll
    for (int nt = 0; nt < D / 8; nt++) {
        oacc[nt][0] *= c0;
        oacc[nt][1] *= c0;
        oacc[nt][2] *= c1;
        oacc[nt][3] *= c1;
    }
}

/* The online softmax step of one 64-key tile (log2 domain) for a warp's two query rows, on the
 * tile's scores sacc (S = Q K^T, mma.sync's C fragments of eight n8 tiles): keys past a row's
 * position, past khi or outside the window to -inf (FULL: the caller knows no key of the tile is
 * masked for any row of the block, so the tests are skipped: the same values), the running
 * (m, l) updated, O rescaled, sacc replaced by P = 2^(s - m) (FX: by fa_ex2). Shared by both
 * flash kernels, so their softmax is one piece of code. */
/* 2^x with the multi-function unit alone (ex2.approx.ftz: exp2f's instruction without its fix-up
 * for results below 2^-126, which flush to zero: a P that small adds nothing a bf16 product
 * keeps) */
__device__ __forceinline__ float fa_ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

template <bool FX>
__device__ __forceinline__ float fa_exp2(float x) {
    return FX ? fa_ex2(x) : exp2f(x);
}

/* One step of merging a row's splits in split order: the running (M, L) of the splits before
 * and a split's (m, l). Returns 0 where the split holds none of the row's keys (m = -inf: the
 * running values stay), 1 for the first split (taken as it is), 2 otherwise, with the weights a
 * of the running O and b of the split's: M' = max(M, m), a = 2^(M - M'), b = 2^(m - M'),
 * L' = L a + l b. Explicit roundings, so k_flash_combine and k_attn_wg's walk (two kernels)
 * give a row the same bits. */
__device__ __forceinline__ int fa_fold_ml(float &M, float &L, float m, float l, float &a, float &b) {
    if (m == -INFINITY) return 0;
    if (M == -INFINITY) {
        M = m, L = l;
        return 1;
    }
    const float Mn = fmaxf(M, m);
    a = fa_ex2(__fsub_rn(M, Mn));
    b = fa_ex2(__fsub_rn(m, Mn));
    L = __fmaf_rn(L, a, __fmul_rn(l, b));
    M = Mn;
    return 2;
}

/* an element of the running O after fa_fold_ml's step k (acc: before it, x: the split's) */
__device__ __forceinline__ float fa_fold_x(int k, float acc, float x, float a, float b) {
    return k == 2 ? __fmaf_rn(acc, a, __fmul_rn(x, b)) : k == 1 ? x : acc;
}

/* the merged row's output: O / L (0 for a row without keys), as fa_finish's direct pass */
__device__ __forceinline__ float fa_fold_out(float acc, float L) { return L > 0.0f ? acc / L : 0.0f; }

/* fa_softmax without O's rescale: the correction (c0, c1) is returned, for a caller that rescales
 * O itself (k_attn_wg skips a rescale by 1; the kernel lab's pipelined forms rescale after the
 * product in flight). BK: a tile of other than 64 keys (the kernel lab's forms only; other bits). */
template <bool FULL, bool FX, int BK = FA_BK>
__device__ __forceinline__ void fa_softmax_c(float (&sacc)[BK / 8][4], int kt, int khi, int p0, int p1, int window,
                                             float sl2, float &m0, float &m1, float &l0, float &l1, float &c0,
                                             float &c1) {
    const int tq = (threadIdx.x & 31) & 3;
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < BK / 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int kpos = kt + nt * 8 + 2 * tq + (e & 1);
            int qpos = (e >> 1) ? p1 : p0;
            bool ok = FULL || (kpos <= qpos && kpos <= khi && (window <= 0 || kpos > qpos - window));
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
    /* the running max moves only when a tile's max passes it by more than FA_MAX_SLACK (log2
     * units): P = 2^(s - m) then stays below 2^FA_MAX_SLACK, exact in fp32 and in bf16's range,
     * and O's rescale (c != 1) happens at a split's first tiles and rarely after, where with
     * the exact max a new max somewhere among a warp's rows rescaled O in most of a split's
     * first tiles (a split's partials start from -inf, so every split pays it again) */
    float mn0 = mx0 > m0 + FA_MAX_SLACK ? mx0 : m0, mn1 = mx1 > m1 + FA_MAX_SLACK ? mx1 : m1;
    float b0 = mn0 == -INFINITY ? 0.0f : mn0, b1 = mn1 == -INFINITY ? 0.0f : mn1;
    c0 = fa_exp2<FX>(m0 - b0), c1 = fa_exp2<FX>(m1 - b1);
    float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
    for (int nt = 0; nt < BK / 8; nt++) {
        sacc[nt][0] = fa_exp2<FX>(sacc[nt][0] - b0);
        sacc[nt][1] = fa_exp2<FX>(sacc[nt][1] - b0);
        sacc[nt][2] = fa_exp2<FX>(sacc[nt][2] - b1);
        sacc[nt][3] = fa_exp2<FX>(sacc[nt][3] - b1);
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
}

template <int D, bool FULL, bool FX = false>
__device__ __forceinline__ void fa_softmax(float (&sacc)[FA_BK / 8][4], int kt, int khi, int p0, int p1, int window,
                                           float sl2, float &m0, float &m1, float &l0, float &l1,
                                           float (&oacc)[D / 8][4]) {
    float c0, c1;
    fa_softmax_c<FULL, FX>(sacc, kt, khi, p0, p1, window, sl2, m0, m1, l0, l1, c0, c1);
    fa_rescale<D>(oacc, c0, c1);
}

/* One 64-key tile of a flash block, for a warp's two query rows (r0 = 16 w + g, r1 = r0 + 8 at
 * positions p0, p1): S = Q K^T on the tile (K at Ks, V at Vs, rows of LD bf16), the causal /
 * window mask and keys past khi to -inf, the online softmax update of (m, l) in the log2 domain
 * and O = c O + P V. VCUT: V rows past khi are zeroed in the fragments (the product's
 * k_attn_flash2, whose shared tile may hold real rows there; the kernel lab's plain-load form
 * zero-fills them when it loads the tile, the same +0 bf16). */
template <int D, bool VCUT>
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
    fa_softmax<D, false>(sacc, kt, khi, p0, p1, window, sl2, m0, m1, l0, l1, oacc);
    /* O += P V; with VCUT the V rows past khi zeroed (only in a tile that reaches past khi, which
     * for a warp happens once) */
    const bool vcut = VCUT && kt + FA_BK - 1 > khi;
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

/* fa_walk_fold's step for one row (its O in oacc[.][E], E + 1) and four column pairs from n0:
 * their loads of o first (rd), then the merge (fa_fold_x with the step k and weights a, b) and
 * (last) the division by L, stored back */
template <int D, int E>
__device__ __forceinline__ void fa_walk_batch(const float (&oacc)[D / 8][4], int n0, float *op, int k, float a, float b,
                                              float L, bool rd, bool last) {
    float2 v[4];
#pragma unroll
    for (int i = 0; i < 4; i++) v[i] = rd ? *(const float2 *)(op + (n0 + i) * 8) : make_float2(0.0f, 0.0f);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float x = fa_fold_x(k, v[i].x, oacc[n0 + i][E], a, b), y = fa_fold_x(k, v[i].y, oacc[n0 + i][E + 1], a, b);
        if (last) x = fa_fold_out(x, L), y = fa_fold_out(y, L);
        *(float2 *)(op + (n0 + i) * 8) = make_float2(x, y);
    }
}

/* k_attn_wg's walk over all splits: at the end of a split (and of the block: last), the warp's
 * two rows' (O, m, l) merged into the running (M, L), kept in shared memory at ml ([row][2] of
 * the warpgroup's rows: registers there would spill the two-warpgroup form), and into o, which
 * holds the running O between splits (each thread its own elements: no other thread reads
 * them); last: o = O / L. The four lanes of a row compute the same (M, L); lane 0 stores it. */
template <int D>
__device__ __forceinline__ void fa_walk_fold(const float (&oacc)[D / 8][4], float m0, float m1, float l0, float l1,
                                             float *ml, int q0, int nq, int r0, int r1, int h, int Hq, float *o,
                                             bool last) {
    const int tq = (threadIdx.x & 31) & 3;
    float M0 = ml[2 * r0], L0 = ml[2 * r0 + 1], M1 = ml[2 * r1], L1 = ml[2 * r1 + 1];
    __syncwarp();
    float a0 = 0.0f, b0 = 0.0f, a1 = 0.0f, b1 = 0.0f;
    const int k0 = fa_fold_ml(M0, L0, m0, l0, a0, b0), k1 = fa_fold_ml(M1, L1, m1, l1, a1, b1);
    if (tq == 0 && !last) {
        ml[2 * r0] = M0, ml[2 * r0 + 1] = L0;
        ml[2 * r1] = M1, ml[2 * r1 + 1] = L1;
    }
    /* o's running O is read where it is merged into, or (last) divided with no split of its own */
    const bool rd0 = k0 == 2 || (last && k0 == 0 && M0 != -INFINITY), wr0 = r0 < nq && (k0 || last);
    const bool rd1 = k1 == 2 || (last && k1 == 0 && M1 != -INFINITY), wr1 = r1 < nq && (k1 || last);
    /* the rows' addresses formed here, not hoisted out of the tile loop by the compiler (kept
     * live across it they spill the two-warpgroup form) */
    int qr0 = q0 + r0;
    asm volatile("" : "+r"(qr0));
    float *op0 = o + ((size_t)qr0 * Hq + h) * D + 2 * tq, *op1 = op0 + (size_t)8 * Hq * D;
    /* a row's four column pairs a batch, their four loads issued together: in program order a
     * load after a store that may alias it (op1 is op0 + 8 rows: a distance the compiler cannot
     * see) waits for it, one memory round trip each; the empty asm keeps the next batch's loads
     * from being hoisted (registers: the two-warpgroup form has none to spare) */
#pragma unroll
    for (int n0 = 0; n0 < D / 8; n0 += 4) {
        if (wr0) fa_walk_batch<D, 0>(oacc, n0, op0, k0, a0, b0, L0, rd0, last);
        asm volatile("" ::: "memory");
        if (wr1) fa_walk_batch<D, 2>(oacc, n0, op1, k1, a1, b1, L1, rd1, last);
        asm volatile("" ::: "memory");
    }
}

/* k_attn_flash2: a flash block of NW warps (4: 64 queries, the product; 8: 128 queries sharing
 * each K/V tile, the form measured in kernels/cuda/dev/NOTES.md) per (query block, head[, key
 * split]); each warp owns 16 query rows. The block streams 64-key tiles through two
 * shared-memory buffers (cp.async, 16-byte pieces gathered row by row from the pages: a tile may
 * span pages; tile t + 1 loads while tile t computes) and runs fa_tile on each, fa_finish at the
 * end. The block is two 64-query halves, each with the key range [klo, khi] of its queries, the
 * window and the split; with 4 warps half 1 is always empty, so every tile is half 0's. With 8
 * warps the halves' tile grids can differ when a window is set (half 0's window start clamped to
 * 0 or to the split start, half 1's not, klo_1 - klo_0 not a multiple of 64): then the block runs
 * two passes, each half computing only in its own. K rows past khi are masked to -inf whatever
 * they hold; V rows past khi are zeroed in the fragment registers (+0 bf16).
 * Shared memory: 2 buffers x (K, V) x [64][D + 8] bf16 (69,632 bytes at D = 128); the Q tile is
 * staged in buffer 1 until its fragments are in registers, while tile 0 streams into buffer 0.
 * Tiles past a row's position would be bit-neutral too (all masked), but they are skipped so
 * that a row's sequence of tiles does not depend on the call (nor on NW).
 * Registers (sm_90, no spills): NW = 4: 168 at D = 128, three blocks per SM (the product's
 * launch bounds); NW = 8: 207 / 159 / 127 at D = 128 / 64 / 32, one block per SM. D = 256 (NW =
 * 4): 135 KB of tiles, one block per SM, so its bounds let it have the registers of one block
 * (O alone is 128 a thread there). */
template <int D, int NW>
__global__ void __launch_bounds__(32 * NW, NW == 4 && D <= 128 ? 3 : 1) k_attn_flash2(const float *q, int n, int Hq, int Hk, int pos0,
                                                                 int window, float scale, void *const *kp,
                                                                 void *const *vp, int pt, float *o, int split_len,
                                                                 int nsplit, float *part) {
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
    float m0, m1, l0, l1, oacc[D / 8][4];
    fa_begin<D>(m0, m1, l0, l1, oacc);
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
            fa_tile<D, true>(qf, Ks, Vs, kt, khi, p0, p1, window, sl2, m0, m1, l0, l1, oacc);
        }
        __syncthreads(); /* buffer j & 1 fully read before tile j + 2 streams into it */
    }
    if (nq <= 0) return;
    fa_finish<D>(oacc, m0, m1, l0, l1, q0, nq, r0, r1, p0, p1, h, Hq, window, split, split_len, nsplit, part, o);
}

/* k_attn_wg: the flash block of k_attn_flash2<D, 4> on Hopper's warpgroup products (sm_90a),
 * D = 64 and 128, and D = 256 as two warpgroups (NWG = 2, the form's only one there: at one
 * warpgroup a pass of the tile loads covers 4 rows, not a whole swizzle group of 8; about 210
 * registers, 194 KB of shared memory, one block per SM). One warpgroup, 64 queries, the same
 * grid, key range, tiles (kt = klo + 64 i, absolute positions), splits and order of every sum
 * as k_attn_flash2<D, 4>: S = Q K^T is
 * wgmma m64n64k16 with the Q fragments in registers (D = 128: mma.sync's A fragments, warp w of
 * the warpgroup owns rows 16 w .. 16 w + 15, as there; D = 64: the Q tile in shared memory) and
 * the K tile in shared memory, D / 16 k16 steps in order; the scores land in mma.sync's C layout, so the softmax is fa_softmax itself;
 * O += P V is wgmma with P from registers (packed as fa_tile packs it) and V in shared memory
 * MN-major, the tile's four k16 steps in order, one m64n64 product per 64 columns of O. Tiles
 * whose keys are unmasked for every row of the block skip the mask's tests (the same values).
 * What bounds the kernel is a tile's instruction count more than the products or the loads (ncu
 * on an H200: about one instruction issued every two cycles a scheduler while the tensor pipe is
 * 40 % busy), so the tile is kept lean, the same values: each product's descriptor is one add
 * to a base, S's first k16 step has scale-d = 0 instead of 32 zeroed registers, O's rescale
 * is skipped where no row of the warp has a new max (a factor of 1), a tile of real rows
 * inside one page (pages of 64 rows or more) loads from one page lookup and one address, and
 * the warpgroup index comes from lane 0 (so the descriptors live in uniform registers: with it
 * taken from the thread index ptxas rebuilt and moved each one, 96 R2UR instructions).
 * Bits: a block of one key tile gives k_attn_flash2's bits; over several tiles about one output
 * in ten differs by an ulp or two (measured on an H200: where P V adds into the rescaled O, the
 * warpgroup product rounds otherwise than mma.sync), so the kernel is part of what a prefill's
 * bits depend on; it is piece-invariant on its own, as k_attn_flash2 is.
 * K and V tiles: [64 keys][D] bf16 in the 128-byte swizzle (wg_swz; 64 columns per 8 KB block),
 * streamed by cp.async into two buffers (rows past khi zero-filled, as k_attn_flash2<D, 4> sees
 * them), each tile made visible to the async proxy before the one barrier a tile (after which
 * the next tile streams into the buffer the last one used). The Q tile is staged in
 * buffer 1 ([64][D + 8], ldmatrix) while tile 0 streams into buffer 0. Shared memory:
 * 4 x 64 x D x 2 bytes, 8 bytes a query row for the walk's running (M, L) and 1 KB for the
 * alignment (66 KB at D = 128: three blocks per SM).
 * Walk (split_len > 0, part = NULL; calls without a window): the tiles run split by split, and
 * at the end of each split fa_walk_fold merges its (O, m, l) into o and the running (M, L), as
 * k_flash_combine merges partials: the bits of the partials and their combine, without writing
 * and reading them (and a row's query tile loaded once, not once a split).
 * D = 64 keeps the Q tile in shared memory (after the buffers, K-major in the swizzle: 8 KB,
 * 41 KB in all) and the S products read it there: with Q's fragments in registers, ptxas (CUDA
 * 13) gave that instantiation's loop-invariant Q registers to the P fragments after the S
 * products, so every tile after the first read P as Q (kernels/cuda/dev/NOTES.md "Flash prefill
 * on warpgroup products"). D = 128 keeps them in registers (three blocks per SM; 16 KB more of
 * shared memory would leave two), which test_gpu_ops checks against k_attn_flash2 and the CPU. */
template <int D, int NWG>
__global__ void __launch_bounds__(128 * NWG, NWG == 2 ? (D > 128 ? 1 : 2) : 3)
    k_attn_wg(const float *q, int n, int Hq, int Hk, int pos0, int window, float scale, void *const *kp,
              void *const *vp, int pt, int lgpt, float *o, int split_len, int nsplit, float *part) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int TILE = FA_BK * D, LDQ = D + 8, NT = 128 * NWG;
    extern __shared__ __align__(1024) unsigned char faw_raw[];
    __nv_bfloat16 *sm = (__nv_bfloat16 *)wg_align1024(faw_raw);
    /* half: broadcast from lane 0, so the compiler knows it is the same across the warp and keeps
     * what derives from it (the Q tile's descriptors) in uniform registers */
    const int tid = threadIdx.x, w = tid >> 5, g = (tid & 31) >> 2,
              half = NWG == 2 ? __shfl_sync(0xffffffffu, w >> 2, 0) : 0, wl = NWG == 2 ? w & 3 : w;
    const int h = blockIdx.y, hk = h / (Hq / Hk), split = blockIdx.z;
    /* the block's queries qB.. (NWG halves of 64, one per warpgroup); this warpgroup's q0, nq */
    /* the last query blocks (the most keys) first: the blocks' order only, not their sums, so that
     * the long blocks do not start last and leave SMs idle at the end of the grid */
    const int qB = (gridDim.x - 1 - blockIdx.x) * FA_BQ * NWG, nqB = n - qB < FA_BQ * NWG ? n - qB : FA_BQ * NWG;
    const int q0 = qB + FA_BQ * half, nq = NWG == 1 ? nqB : n - q0 < FA_BQ ? n - q0 : FA_BQ;
    /* keys: klo is the same for both halves (NWG = 2 runs without a window: 0 or the split's
     * start), khi this half's; the block loads up to the block's last key kend */
    int klo = window > 0 ? pos0 + q0 - window + 1 : 0;
    if (klo < 0) klo = 0;
    int khi = pos0 + q0 + nq - 1, kend = pos0 + qB + nqB - 1;
    /* walk: all the rows' splits in this block (part = NULL), each merged into o as it ends */
    const bool walk = split_len && !part;
    if (split_len && !walk) {
        if (split * split_len > klo) klo = split * split_len;
        if ((split + 1) * split_len - 1 < khi) khi = (split + 1) * split_len - 1;
        if ((split + 1) * split_len - 1 < kend) kend = (split + 1) * split_len - 1;
    }
    if (NWG == 1) kend = khi;
    const int ntile = klo <= kend ? (kend - klo) / FA_BK + 1 : 0;
    /* a thread's 16-byte chunk c8 of rows lr0 + RP i: its swizzled column is the same in every
     * one of them (RP is a multiple of 8), and pages of 2^lgpt rows take a shift */
    constexpr int CH = D / 8, RP = NT / CH;
    const int c8 = tid % CH, lr0 = tid / CH;
    const int swc = (c8 >> 3) * FA_BK * 64 + (((c8 & 7) ^ (lr0 & 7)) << 3);
    const size_t rowsz = (size_t)Hk * D, hoff = (size_t)hk * D + c8 * 8;
    auto load = [&](int j, int b) {
        const int kt = klo + j * FA_BK;
        __nv_bfloat16 *Kd = sm + 2 * b * TILE + swc + lr0 * 64, *Vd = Kd + TILE;
        if (lgpt >= 6 && !(kt & (FA_BK - 1)) && kt + FA_BK - 1 <= kend) {
            /* a whole tile of real rows inside one page (pages of 2^lgpt >= 64 rows start at
             * multiples of 64): one page lookup and one address a tile, the rows a stride apart */
            const size_t off = (size_t)((kt & ((1 << lgpt) - 1)) + lr0) * rowsz + hoff;
            const __nv_bfloat16 *ks = (const __nv_bfloat16 *)kp[kt >> lgpt] + off,
                                *vs = (const __nv_bfloat16 *)vp[kt >> lgpt] + off;
#pragma unroll
            for (int i = 0; i < FA_BK / RP; i++) {
                cp_async16(Kd + RP * i * 64, ks + i * RP * rowsz, 16);
                cp_async16(Vd + RP * i * 64, vs + i * RP * rowsz, 16);
            }
        } else {
#pragma unroll
            for (int i = 0; i < FA_BK / RP; i++) {
                const int r = lr0 + RP * i, p = kt + r, pc = p <= kend ? p : kend;
                const int pg = lgpt >= 0 ? pc >> lgpt : pc / pt, row = pc - pg * pt;
                const size_t off = (size_t)row * rowsz + hoff;
                const int bytes = p <= kend ? 16 : 0;
                cp_async16(Kd + RP * i * 64, (const __nv_bfloat16 *)kp[pg] + off, bytes);
                cp_async16(Vd + RP * i * 64, (const __nv_bfloat16 *)vp[pg] + off, bytes);
            }
        }
        cp_async_commit();
    };
    /* QS (D = 64, and NWG = 2): the Q tiles stay in shared memory after the buffers, K-major in
     * the swizzle, and the S products read them there (see above); else the Q tile is staged in
     * buffer 1 and read into registers */
    constexpr bool QS = D == 64 || NWG == 2;
    if (ntile > 0) load(0, 0);
    {
        __nv_bfloat16 *Qs = sm + (QS ? 4 : 2) * TILE;
        for (int x = tid; x < FA_BQ * NWG * (D / 4); x += NT) {
            const int r = x / (D / 4), d = (x % (D / 4)) * 4;
            float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            if (r < nqB) {
                const float *src = q + ((size_t)(qB + r) * Hq + h) * D + d;
#pragma unroll
                for (int e = 0; e < 4; e++) v[e] = src[e];
            }
            /* QS: half r / 64's tile of [64][D] */
            __nv_bfloat162 *dst =
                (__nv_bfloat162 *)(Qs + (QS ? (r / FA_BQ) * FA_BQ * D + wg_swz(r % FA_BQ, d, FA_BQ) : r * LDQ + d));
            dst[0] = __floats2bfloat162_rn(v[0], v[1]);
            dst[1] = __floats2bfloat162_rn(v[2], v[3]);
        }
    }
    if (QS) fence_proxy_async_smem(); /* Q's stores, to wgmma's proxy */
    __syncthreads();
    uint32_t qf[QS ? 1 : D / 16][4];
    const __nv_bfloat16 *Qsm = sm + 4 * TILE + half * FA_BQ * D;
    if constexpr (!QS) {
#pragma unroll
        for (int kc = 0; kc < D / 16; kc++) ldsm_frag_a(qf[kc], sm + 2 * TILE + (16 * wl) * LDQ + kc * 16, LDQ);
        __syncthreads(); /* buffer 1 free for tile 1 */
    }
    const int r0 = 16 * wl + g, r1 = r0 + 8;
    const int p0 = pos0 + q0 + r0, p1 = pos0 + q0 + r1;
    /* a tile is unmasked for every row when its last key is at or before the block's first
     * position and khi, and (window) its first key is inside the last row's window */
    const int pfirst = pos0 + q0, plast = pos0 + q0 + FA_BQ - 1;
    float m0, m1, l0, l1, oacc[D / 8][4];
    fa_begin<D>(m0, m1, l0, l1, oacc);
    /* walk: the merged splits' running (M, L) of this warpgroup's rows, after the tiles */
    float *ml = (float *)(sm + (4 + (QS ? NWG : 0)) * TILE) + half * 2 * FA_BQ;
    if (walk && (tid & 3) == 0) {
        ml[2 * r0] = -INFINITY, ml[2 * r0 + 1] = 0.0f;
        ml[2 * r1] = -INFINITY, ml[2 * r1 + 1] = 0.0f;
    }
    const float sl2 = scale * 1.4426950408889634f;
    float(&of)[D / 2] = *reinterpret_cast<float(*)[D / 2]>(&oacc[0][0]);
    /* descriptors: one base (the aligned buffers' start) plus each operand's element offset / 8
     * (16 bytes), so a product's descriptor is one add (wg_desc_lo) */
    const uint32_t dsm = wg_desc_lo(sm), dq = dsm + (uint32_t)((Qsm - sm) >> 3);
    /* S = Q K^T of the tile at element offset ko into sacc (issued, committed, not waited for);
     * the first k16 step with scale-d = 0, so sacc needs no zeroing (hyla_cuda_wgmma.cuh) */
    auto s_issue = [&](float(&sf)[32], int ko) {
        wg_fence();
        const uint32_t dk = dsm + (uint32_t)(ko >> 3);
#pragma unroll
        for (int kc = 0; kc < D / 16; kc++) {
            const uint32_t o = ((kc >> 2) * FA_BK * 64 + (kc & 3) * 16) >> 3;
            if constexpr (QS)
                wg_mma64_ss(sf, wg_desc_at(dq + (((kc >> 2) * FA_BQ * 64 + (kc & 3) * 16) >> 3)), wg_desc_at(dk + o),
                            kc > 0);
            else
                wg_mma64_rs<0>(sf, qf[kc], wg_desc_at(dk + o), kc > 0);
        }
        wg_commit();
    };
    /* O += P V of the tile whose V is at element offset vo (issued, committed) */
    auto pv_issue = [&](uint32_t(&pf)[FA_BK / 16][4], int vo) {
        wg_keep(*reinterpret_cast<uint32_t(*)[FA_BK / 4]>(&pf[0][0]));
        wg_keep(of);
        wg_fence();
        const uint32_t dv = dsm + (uint32_t)(vo >> 3);
#pragma unroll
        for (int kc = 0; kc < FA_BK / 16; kc++)
#pragma unroll
            for (int b = 0; b < D / 64; b++)
                wg_mma64_rs<1>(*reinterpret_cast<float(*)[32]>(&oacc[8 * b][0]), pf[kc],
                               wg_desc_at(dv + ((b * FA_BK * 64 + kc * 16 * 64) >> 3)));
        wg_commit();
    };
    auto pack_p = [&](uint32_t(&pf)[FA_BK / 16][4], const float(&sacc)[FA_BK / 8][4]) {
#pragma unroll
        for (int kc = 0; kc < FA_BK / 16; kc++) {
            pf[kc][0] = pack_bf16x2(sacc[2 * kc][0], sacc[2 * kc][1]);
            pf[kc][1] = pack_bf16x2(sacc[2 * kc][2], sacc[2 * kc][3]);
            pf[kc][2] = pack_bf16x2(sacc[2 * kc + 1][0], sacc[2 * kc + 1][1]);
            pf[kc][3] = pack_bf16x2(sacc[2 * kc + 1][2], sacc[2 * kc + 1][3]);
        }
    };
    /* one barrier a tile: it makes tile j visible and also tells that every thread is done with
     * tile j - 1, whose buffer tile j + 1 then streams into while tile j computes. Walk: the
     * tiles of a split, then the merge of its (O, m, l) before the next split's first tile (the
     * walk's keys start at 0, so a split is split_len / 64 whole tiles; the tile loop itself
     * tests nothing more) */
    const int tps = walk ? split_len / FA_BK : ntile;
    for (int j = 0; j < ntile;) {
        if (j > 0 && (NWG == 1 || klo + j * FA_BK <= khi)) { /* walk: a split's first tile, one of this half's */
            fa_walk_fold<D>(oacc, m0, m1, l0, l1, ml, q0, nq, r0, r1, h, Hq, o, false);
            fa_begin<D>(m0, m1, l0, l1, oacc);
        }
        const int jend = ntile - j < tps ? ntile : j + tps;
        for (; j < jend; j++) {
            cp_async_wait<0>();
            fence_proxy_async_smem(); /* this thread's cp.async writes, to wgmma's proxy */
            __syncthreads();
            if (j + 1 < ntile) load(j + 1, (j + 1) & 1);
            const int kt = klo + j * FA_BK;
            /* two warpgroups: half 1 issues its S after half 0 has issued its own, so the halves'
             * products and softmax take turns on the tensor cores instead of running in step (the
             * same products and sums, so the same bits; D = 256 prefill 1-2 % shorter, D = 128
             * level: kernels/cuda/dev/NOTES.md "The flash kernel's two warpgroups taking turns") */
            if (NWG == 2 && half == 1) nb_sync(1, 256);
            if (NWG == 1 || kt <= khi) { /* one of this half's tiles (the other half's last may lie past it) */
                const int ko = 2 * (j & 1) * TILE;
                float sacc[FA_BK / 8][4];
                float(&sf)[32] = *reinterpret_cast<float(*)[32]>(&sacc[0][0]);
                s_issue(sf, ko);
                if (NWG == 2 && half == 0) nb_arrive(1, 256);
                wg_wait<0>();
                wg_keep(sf);
                const bool full =
                    kt + FA_BK - 1 <= pfirst && kt + FA_BK - 1 <= khi && (window <= 0 || kt > plast - window);
                float c0, c1;
                if (full)
                    fa_softmax_c<true, true>(sacc, kt, khi, p0, p1, window, sl2, m0, m1, l0, l1, c0, c1);
                else
                    fa_softmax_c<false, true>(sacc, kt, khi, p0, p1, window, sl2, m0, m1, l0, l1, c0, c1);
                /* O's rescale only where a row of the warp has a new max: c = 1 leaves O as it is
                 * (x * 1 is x), and once the running max settles most tiles have none */
                if (__any_sync(0xffffffffu, c0 != 1.0f || c1 != 1.0f)) fa_rescale<D>(oacc, c0, c1);
                uint32_t pf[FA_BK / 16][4];
                pack_p(pf, sacc);
                pv_issue(pf, ko + TILE);
                wg_wait<0>();
                wg_keep(of);
                wg_keep(*reinterpret_cast<uint32_t(*)[FA_BK / 4]>(&pf[0][0]));
            } else if (NWG == 2 && half == 0)
                nb_arrive(1, 256); /* past this half's last tile: half 1 still waits for the turn */
        }
    }
    if (nq <= 0) return;
    if (walk)
        fa_walk_fold<D>(oacc, m0, m1, l0, l1, ml, q0, nq, r0, r1, h, Hq, o, true);
    else
        fa_finish<D>(oacc, m0, m1, l0, l1, q0, nq, r0, r1, p0, p1, h, Hq, window, split, split_len, nsplit, part, o);
#endif
}

#endif
