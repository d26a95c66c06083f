/* hyla_cuda_linattn.cuh — what the GLA/GDN kernel files share (internal to kernels/cuda): the
 * chunk length, the chunked kernels' argument block and its row lookup through SSE row maps, the
 * device helpers of the fused GDN kernels, and the launchers one file calls in another.
 *   hyla_cuda_lin_decode.cu   the recurrent kernels (decode, SSE decode, token-loop prefill)
 *   hyla_cuda_lin_chunked.cu  chunked prefill: kernels A and B, the fused GLA pass, the host
 *                             dispatch of every chunked call (varlen batches, SSE row maps)
 *   hyla_cuda_gdn_fused.cu    the fused GDN pass k_gdn_fused (and its split form)
 *   hyla_cuda_gdn_pipe.cu     the pipelined fused GDN pass k_gdn_pipe (sm_90a)
 * Threading: everything launches on the context's stream. */
#ifndef HYLA_CUDA_LINATTN_CUH
#define HYLA_CUDA_LINATTN_CUH
#include "hyla_cuda_impl.h"
#include "hyla_cuda_mma.cuh"

#include <type_traits>

#define CH 64 /* chunk length */

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
    /* GLA's split form with a row map: k_gla_chunk_f copies each chunk's v rows (zero past the
     * chunk) to u0 as GDN's chunk part writes U0, and kernel B reads its U source there, since
     * a partition's packed rows are no run of v's rows the copy engine could fetch */
    int gla_u0;
    /* the split form: chunks per block of the chunk parts (k_gdn_fused MODE 1, k_gla_chunk_f),
     * chunks in all (the scratch holds split_nc * H (chunk, head) tiles) */
    int split_cpb, split_nc;
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

/* ---- the state in kernel B's layout (k_chunk_b, k_gla_fused, k_gdn_fused) ----
 * The 8 NT value columns j0.. of a group of 4 warps (NT = 4: 32; k_chunk_b may take 2); warp wq
 * holds key tiles mt = wq + 4 mi (16 rows each, mt < MT) as NT n8 C fragments per tile, fp32, in
 * registers for the whole pass. g = lane / 4, tq = lane % 4 as in the mma fragment layouts. */

/* sacc <- S[i][j] (row stride dv); zero outside dk x dv, and everywhere unless `on`. */
template <int MT, int MTW, int NT>
__device__ __forceinline__ void state_load(float (&sacc)[MTW][NT][4], const float *S, bool on, int wq, int g, int tq,
                                           int j0, int dk, int dv) {
#pragma unroll
    for (int mi = 0; mi < MTW; mi++) {
        int mt = wq + 4 * mi;
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int i = mt * 16 + g + (e >> 1) * 8, j = j0 + n * 8 + 2 * tq + (e & 1);
                sacc[mi][n][e] = (on && mt < MT && i < dk && j < dv) ? S[(size_t)i * dv + j] : 0.0f;
            }
    }
}

/* S[i][j] <- sacc inside dk x dv, when `on`. */
template <int MT, int MTW, int NT>
__device__ __forceinline__ void state_store(const float (&sacc)[MTW][NT][4], float *S, bool on, int wq, int g, int tq,
                                            int j0, int dk, int dv) {
#pragma unroll
    for (int mi = 0; mi < MTW; mi++) {
        int mt = wq + 4 * mi;
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int i = mt * 16 + g + (e >> 1) * 8, j = j0 + n * 8 + 2 * tq + (e & 1);
                if (on && mt < MT && i < dk && j < dv) S[(size_t)i * dv + j] = sacc[mi][n][e];
            }
    }
}

/* S^T in bf16, the operand of a chunk's products: SbT[j - j0][i] (row stride ldk). */
template <int MT, int MTW, int NT>
__device__ __forceinline__ void state_to_sbt(const float (&sacc)[MTW][NT][4], __nv_bfloat16 *SbT, int ldk, int wq, int g,
                                             int tq) {
#pragma unroll
    for (int mi = 0; mi < MTW; mi++) {
        int mt = wq + 4 * mi;
        if (mt < MT)
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int i = mt * 16 + g + (e >> 1) * 8, jj = n * 8 + 2 * tq + (e & 1);
                    SbT[jj * ldk + i] = __float2bfloat16_rn(sacc[mi][n][e]);
                }
    }
}

/* One key tile's decay before S += k~^T U: rows g of the tile times d0, rows g + 8 times d1. */
template <int NT>
__device__ __forceinline__ void state_decay(float (&st)[NT][4], float d0, float d1) {
#pragma unroll
    for (int n = 0; n < NT; n++) {
        st[n][0] *= d0;
        st[n][1] *= d0;
        st[n][2] *= d1;
        st[n][3] *= d1;
    }
}

/* ---- device helpers of the fused GDN kernels (k_gdn_fused, k_gdn_pipe) and k_gla_fused ---- */

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
 * the A fragment of the later rows. Every form (k_gdn_fused's slabs, k_gdn_pipe's key slabs and
 * value slabs) runs this one code: the same bits. */
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

/* ---- host side ---- */

/* f(std::integral_constant<int, DKP>()) for the kernels' key width dkp (pow2_dkp): the one
 * place a runtime width becomes a template argument. Widths above MAXW (the widest form the
 * caller has) take MAXW; callers check the width first. */
template <int MAXW, typename F>
static auto dkp_dispatch(int dkp, F &&f) -> decltype(f(std::integral_constant<int, 16>())) {
    switch (dkp) {
    case 16: return f(std::integral_constant<int, 16>());
    case 32: return f(std::integral_constant<int, 32>());
    case 64: return f(std::integral_constant<int, 64>());
    }
    if constexpr (MAXW > 128)
        if (dkp == 128) return f(std::integral_constant<int, 128>());
    return f(std::integral_constant<int, MAXW>());
}

/* kernel B's dynamic shared memory: st stages of a chunk's tiles and the state operands */
static inline size_t smem_b(int dkp, int gdn, int st) {
    size_t stage = (size_t)CH * (dkp + 8) * (gdn ? 2 : 1) + (size_t)dkp * 72 + (size_t)CH * 72 + (size_t)dkp * 2;
    return (stage * st + (size_t)32 * (dkp + 8) + (size_t)32 * 72) * 2;
}

/* dk rounded up to the kernels' key widths (16, 32, 64, 128, 256) */
static inline int pow2_dkp(int dk) {
    int d = 16;
    while (d < dk) d *= 2;
    return d;
}

/* Kernel B over the chunk tiles in ca's scratch (hyla_cuda_lin_chunked.cu). */
hyla_status cu_chunk_b_launch(hyla_cuda_ctx *c, const ChunkArgs &ca, int nseq, int gdn);
/* GDN's fused pass (split = 0) or its split form (split = 1: tiles to ca's scratch, then kernel
 * B) for ca.dkp <= 128 (hyla_cuda_gdn_fused.cu); requires cu_gdn_fused_ok. */
hyla_status cu_gdn_fused_launch(hyla_cuda_ctx *c, const ChunkArgs &ca, int NC, int nseq, int split);

/* The split form's chunk parts (GDN's k_gdn_fused MODE 1, GLA's k_gla_chunk_f) run one block per
 * SM (their staging and tiles take most of its shared memory), so a block of one chunk left its SM
 * idle while the chunk loaded. A block takes a run of consecutive chunks instead and streams the
 * next one's rows in while it works on the one in hand: up to 8, keeping >= 4 blocks per SM over
 * the (chunk, head, value block) tasks. Sets ca's split_cpb and split_nc; returns the grid's
 * x extent. The same bits: each chunk's tiles are its own, whichever block forms them. H100, one
 * sequence of 18 heads of 128, the whole op with one chunk a block against runs of 8: GDN 32k
 * 2.06 -> 1.92 ms, 128k 8.09 -> 7.41-7.49; GLA 32k 1.81 -> 1.74, 128k 7.19 -> 6.82. */
static inline unsigned cu_split_runs(hyla_cuda_ctx *c, ChunkArgs &ca, int NC, size_t tasks) {
    int cpb = 1;
    while (cpb < 8 && tasks / ((size_t)cpb * 2) >= (size_t)4 * c->sm_count) cpb *= 2;
    ca.split_cpb = cpb;
    ca.split_nc = NC;
    return (unsigned)((NC + cpb - 1) / cpb);
}
/* The pipelined fused GDN pass where it applies (sm_90a build, q, k, v 16-byte aligned, dv % 4
 * == 0, its shared memory fits): *launched = 1 after queuing it, else 0 and nothing queued
 * (hyla_cuda_gdn_pipe.cu). */
hyla_status cu_gdn_pipe_launch(hyla_cuda_ctx *c, const ChunkArgs &ca, int nseq, int *launched);

#endif
