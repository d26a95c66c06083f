/* hyla_cuda_gemm.cu — the batch-invariant "skinny" linear for M <= 256 rows (every linear the
 * runtime issues: prefill pieces of <= 64 tokens, decode batches of <= 256 sessions).
 *
 * y[M][N] = x[M][K] W[N][K]^T (+ bias) (+ y): x fp32 rounded to bf16 (by a conversion kernel,
 * or while staged in shared memory for M <= 16), W bf16, bf16 tensor-core products (mma.sync
 * m16n8k16) with fp32 accumulation.
 * A block owns 64 output columns (128 in some cluster forms) and one K slice; K is cut into S
 * slices where S depends on N and K only (enough blocks to cover the GPU), the slices' fp32
 * partials are summed in slice order: by the last block of a tile for up to 4 rows, across a
 * thread-block cluster for 5 to 128 rows (k_skinny2c), by a second kernel where neither
 * applies, by the block itself when there is one slice. So the arithmetic that produces y[m][n] — which products, in
 * which order, in which instructions — does not depend on M or on the other rows: a session's
 * logits are bit-identical whether it is decoded alone or in a batch (hyla_ops.h: "each row's
 * result does not depend on M"). Weights stream through once per 128-row block.
 * Threading: launched on the context's stream. */
#include <cooperative_groups.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_cuda_impl.h"
#include "hyla_cuda_mma.cuh"
#include "hyla_cuda_rowmath.cuh"
#include "hyla_cuda_gemm_wg.cuh"
#include "hyla_log.h"


/* A K slice's fp32 partial sums of the block's tile (rows m0.., columns n0..; warp w owns
 * columns 16w..16w+15) to out [M][N], for the slice reduction. */
template <int MT>
__device__ __forceinline__ void sk_store_part(const float (&acc)[MT][2][4], float *out, int M, int N, int m0, int n0,
                                              int w, int g, int tq) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int m = m0 + mt * 16 + g + (e >> 1) * 8, n = n0 + 16 * w + nt * 8 + 2 * tq + (e & 1);
                if (m < M && n < N) out[(size_t)m * N + n] = acc[mt][nt][e];
            }
}

/* The slice reduction inside the skinny kernel: each block of a tile, after storing its slice's
 * partial sums, counts itself in; the last of the S to arrive sums the tile's slices in slice
 * order (k_skinny_reduce's arithmetic, so the same bits) and resets the count for the next
 * launch. This saves the reduction launch of every split linear of a decode step (several per
 * layer). The fences make the other blocks' partials visible before they are read through L2. */
template <int MT>
__device__ __forceinline__ void sk_finish_tile(const float *part, int S, int M, int N, const float *bias, float *y,
                                               int ldy, int accumulate, int m0, int n0, unsigned *cnt) {
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(cnt, 1u) == (unsigned)S - 1;
        if (last) atomicExch(cnt, 0u);
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    const size_t total = (size_t)M * N;
    for (int i = threadIdx.x; i < MT * 16 * SK_N; i += blockDim.x) {
        const int m = m0 + i / SK_N, n = n0 + i % SK_N;
        if (m >= M || n >= N) continue;
        const size_t o = (size_t)m * N + n;
        float t[16]; /* every slice's load in flight at once (S <= 16, sk_plan) */
#pragma unroll
        for (int s = 0; s < 16; s++) t[s] = s < S ? __ldcg(part + (size_t)s * total + o) : 0.0f;
        float v = t[0];
#pragma unroll
        for (int s = 1; s < 16; s++)
            if (s < S) v += t[s];
        lin_store(v, bias, n, y + (size_t)m * ldy + n, accumulate);
    }
}

template <int MT>
__global__ void __launch_bounds__(128) k_skinny(const float *__restrict__ x, int ldx, int M, int K,
                                                const __nv_bfloat16 *__restrict__ W, int N, int kchunk,
                                                float *__restrict__ part) {
    __shared__ __align__(16) __nv_bfloat16 Ws[SK_N * SK_LD];
    __shared__ __align__(16) __nv_bfloat16 Xs[MT * 16 * SK_LD];
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, tq = lane & 3;
    const int n0 = blockIdx.x * SK_N, s = blockIdx.y, m0 = blockIdx.z * MT * 16;
    const int kbeg = s * kchunk, kend = kbeg + kchunk < K ? kbeg + kchunk : K;
    const bool vecw = (K & 7) == 0, vecx = (ldx & 3) == 0 && (((uintptr_t)x) & 15) == 0;
    float acc[MT][2][4];
    frag_zero(acc);
    for (int kt = kbeg; kt < kend; kt += SK_K) {
        /* W tile: 64 rows x 64 k, 16-byte pieces */
        for (int c = tid; c < SK_N * 8; c += 128) {
            int r = c >> 3, kk = (c & 7) * 8, n = n0 + r, k = kt + kk;
            uint4 v = make_uint4(0, 0, 0, 0);
            if (n < N) {
                const __nv_bfloat16 *src = W + (size_t)n * K + k;
                if (vecw && k + 8 <= kend) {
                    v = *(const uint4 *)src;
                } else {
                    unsigned short tmp[8];
                    for (int j = 0; j < 8; j++)
                        tmp[j] = (k + j < kend) ? ((const unsigned short *)src)[j] : (unsigned short)0;
                    v = make_uint4(tmp[0] | (tmp[1] << 16), tmp[2] | (tmp[3] << 16), tmp[4] | (tmp[5] << 16),
                                   tmp[6] | (tmp[7] << 16));
                }
            }
            *(uint4 *)(Ws + r * SK_LD + kk) = v;
        }
        /* x tile: MT*16 rows x 64 k, fp32 -> bf16 */
        for (int c = tid; c < MT * 16 * 16; c += 128) {
            int r = c >> 4, kk = (c & 15) * 4, m = m0 + r, k = kt + kk;
            float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
            if (m < M) {
                const float *src = x + (size_t)m * ldx + k;
                if (vecx && k + 4 <= kend) {
                    v = *(const float4 *)src;
                } else {
                    v.x = k < kend ? src[0] : 0.f;
                    v.y = k + 1 < kend ? src[1] : 0.f;
                    v.z = k + 2 < kend ? src[2] : 0.f;
                    v.w = k + 3 < kend ? src[3] : 0.f;
                }
            }
            uint2 pk = make_uint2(pack_bf16x2(v.x, v.y), pack_bf16x2(v.z, v.w));
            *(uint2 *)(Xs + r * SK_LD + kk) = pk;
        }
        __syncthreads();
#pragma unroll
        for (int kc = 0; kc < SK_K / 16; kc++) {
            uint32_t bf[2][2];
#pragma unroll
            for (int nt = 0; nt < 2; nt++) ld_frag_b_nk(bf[nt], Ws + (16 * w + nt * 8) * SK_LD + kc * 16, SK_LD);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                uint32_t af[4];
                ld_frag_a(af, Xs + (mt * 16) * SK_LD + kc * 16, SK_LD);
#pragma unroll
                for (int nt = 0; nt < 2; nt++) mma_bf16_16816(acc[mt][nt], af, bf[nt]);
            }
        }
        __syncthreads();
    }
    sk_store_part(acc, part + (size_t)s * M * N, M, N, m0, n0, w, g, tq);
}

/* v2 (K % 8 == 0): x pre-converted to bf16 [M][K]; tiles arrive by cp.async, two stages deep,
 * fragments by ldmatrix. Same products in the same order per output as v1's contract: the
 * result of a row still depends only on that row (and N, K).
 * XF (M <= 16, decode): x is read as fp32 (row stride ldx) and rounded to bf16 while staged,
 * instead of by a separate conversion kernel: one launch less per linear, and the same bf16
 * values (round to nearest even either way), so the same bits. For larger M every block would
 * convert all M rows again, so those keep the conversion kernel. */
/* The staging of a block of NW warps (16 NW output columns) and MT*16 rows: W and x tiles of
 * two stages, bf16; the cluster form reuses the W part for its partial tile. */
template <int MT, int NW, int NS = 2>
struct SkSmem {
    static constexpr int BN = 16 * NW, W_ELEMS = NS * BN * SK_LD, X_ELEMS = NS * MT * 16 * SK_LD;
    static constexpr int BYTES = (W_ELEMS + X_ELEMS) * 2, PLD = BN + 8; /* PLD: partial tile row stride */
    static_assert(MT * 16 * PLD * 4 <= W_ELEMS * 2, "the partial tile fits the weight staging");
};

template <int MT, bool XF, bool CL, int NW, int NS = 2>
__device__ __forceinline__ void skinny2_body(__nv_bfloat16 *__restrict__ Wsm, __nv_bfloat16 *__restrict__ Xsm,
                                             const __nv_bfloat16 *__restrict__ xb, const float *__restrict__ xf,
                                             const float *__restrict__ xu, /* XF: x = silu(xf) * xu (NULL: xf) */
                                             int ldx, int vecx, int M, int K, const __nv_bfloat16 *__restrict__ W,
                                             int N, int kchunk, float *__restrict__ part, int S,
                                             const float *bias, float *y, int ldy, int accumulate, int n0, int s,
                                             int m0, unsigned *cnt, int r0 /* CL: cluster rank of slice 0 */) {
    typedef SkSmem<MT, NW, NS> SM;
    constexpr int NT = 32 * NW, BN = SM::BN;
    static_assert(CL || NW == 4, "the partial-sum forms own 64 columns");
    __nv_bfloat16(*Ws)[BN * SK_LD] = (__nv_bfloat16(*)[BN * SK_LD])Wsm;
    __nv_bfloat16(*Xs)[MT * 16 * SK_LD] = (__nv_bfloat16(*)[MT * 16 * SK_LD])Xsm;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, tq = lane & 3;
    const int kbeg = s * kchunk, kend = kbeg + kchunk < K ? kbeg + kchunk : K;
    const int nk = (kend - kbeg + SK_K - 1) / SK_K;
    pdl_trigger();
    float acc[MT][2][4];
    frag_zero(acc);
    auto stage_w = [&](int buf, int kt) {
#pragma unroll
        for (int q = 0; q < BN * 8 / NT; q++) {
            int c = tid + q * NT, r = c >> 3, kk = (c & 7) * 8, n = n0 + r, k = kt + kk;
            bool ok = n < N && k < kend;
            cp_async16(&Ws[buf][r * SK_LD + kk], ok ? (const void *)(W + (size_t)n * K + k) : (const void *)W,
                       ok ? 16 : 0);
        }
    };
    auto stage_x = [&](int buf, int kt) {
#pragma unroll
        for (int q = 0; q < (MT * 16 * 8 + NT - 1) / NT; q++) {
            int c = tid + q * NT, r = c >> 3, kk = (c & 7) * 8, m = m0 + r, k = kt + kk;
            if (c >= MT * 16 * 8) break;
            bool ok = m < M && k < kend;
            if (XF) { /* k < kend implies k + 8 <= kend: K % 8 == 0 and slices are multiples of 64 */
                float v[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
                if (ok) {
                    const float *src = xf + (size_t)m * ldx + k;
                    if (vecx) {
                        float4 a = *(const float4 *)src, b = *(const float4 *)(src + 4);
                        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
                    } else {
#pragma unroll
                        for (int j = 0; j < 8; j++) v[j] = src[j];
                    }
                    if (xu) { /* the swiglu op's value, formed here instead of by its own pass */
                        const float *us = xu + (size_t)m * ldx + k;
#pragma unroll
                        for (int j = 0; j < 8; j++) v[j] = silu_f(v[j]) * us[j];
                    }
                }
                *(uint4 *)&Xs[buf][r * SK_LD + kk] = make_uint4(pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3]),
                                                               pack_bf16x2(v[4], v[5]), pack_bf16x2(v[6], v[7]));
            } else {
                cp_async16(&Xs[buf][r * SK_LD + kk], ok ? (const void *)(xb + (size_t)m * K + k) : (const void *)xb,
                           ok ? 16 : 0);
            }
        }
    };
    /* NS stages. Launched by cu_launch_pdl, the block may be here while the kernel ahead still
     * runs: the weight tiles of every stage are requested (no kernel writes weights), as one
     * group, then it waits for that kernel before it reads x, whose first NS - 1 tiles are the
     * second group. Iteration `it` queues tile it + NS - 1 (its x, and its weights past the
     * first NS) as one group, into the stage tile it - 1 left; tile `it` has landed once both
     * first groups have (it = 0) and, later, once at most NS - 1 groups are pending. */
#pragma unroll
    for (int j = 0; j < NS; j++)
        if (j < nk) stage_w(j, kbeg + j * SK_K);
    cp_async_commit();
    pdl_wait();
#pragma unroll
    for (int j = 0; j < NS - 1; j++)
        if (j < nk) stage_x(j, kbeg + j * SK_K);
    cp_async_commit();
    for (int it = 0; it < nk; it++) {
        const int nx = it + NS - 1;
        if (nx < nk) {
            if (nx >= NS) stage_w(nx % NS, kbeg + nx * SK_K);
            stage_x(nx % NS, kbeg + nx * SK_K);
        }
        cp_async_commit();
        if (it == 0) cp_async_wait<1>();
        else cp_async_wait<NS - 1>();
        __syncthreads();
        const __nv_bfloat16 *ws = Ws[it % NS], *xs = Xs[it % NS];
#pragma unroll
        for (int kc = 0; kc < SK_K / 16; kc++) {
            uint32_t bf[2][2];
            ldsm_frag_b2_nk(bf, ws + (16 * w) * SK_LD + kc * 16, SK_LD);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                uint32_t af[4];
                ldsm_frag_a(af, xs + (mt * 16) * SK_LD + kc * 16, SK_LD);
#pragma unroll
                for (int nt = 0; nt < 2; nt++) mma_bf16_16816(acc[mt][nt], af, bf[nt]);
            }
        }
        __syncthreads();
    }
    if (S == 1) { /* one slice: finish here, same arithmetic as the reduction (lin_store_g: a row
                   * tile's loads before its stores) */
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            float v[8];
            int m[8], n[8];
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int nt = j >> 2, e = j & 3;
                v[j] = acc[mt][nt][e];
                m[j] = m0 + mt * 16 + g + (e >> 1) * 8;
                n[j] = n0 + 16 * w + nt * 8 + 2 * tq + (e & 1);
            }
            lin_store_g<8>(v, m, n, M, N, bias, y, ldy, accumulate);
        }
        if (!CL) return;
    } else if (!CL) {
        sk_store_part(acc, part + (size_t)s * M * N, M, N, m0, n0, w, g, tq);
        if (cnt) sk_finish_tile<MT>(part, S, M, N, bias, y, ldy, accumulate, m0, n0, cnt);
        return;
    }
    /* CL: the partial tile into the (now idle) weight staging, then the cluster's slice sum */
    float *P = reinterpret_cast<float *>(Wsm);
    if (S > 1) {
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int h = 0; h < 2; h++)
                    *(float2 *)&P[(mt * 16 + g + h * 8) * SM::PLD + 16 * w + nt * 8 + 2 * tq] =
                        make_float2(acc[mt][nt][2 * h], acc[mt][nt][2 * h + 1]);
    }
    cooperative_groups::this_cluster().sync();
    if (S > 1) sk_cluster_sum<MT, BN, SM::PLD>(P, S, r0, s, M, N, bias, y, ldy, accumulate, m0, n0);
    cooperative_groups::this_cluster().sync();
}

/* Stages of the skinny kernels of up to 16 rows outside the cluster form (1-4 rows: decode of a
 * few sessions): three on an H200 made the 1.68B GDN model's
 * B = 1 step 2 % faster than two (1.747-1.761 -> 1.717-1.718 ms), four 4.5 % slower (the block's
 * 46 KB of staging leaves fewer blocks an SM); the same bits every way (BENCHMARKS.md "The
 * one-row linears: three stages"). More rows keep two (their tiles are larger). */
#define SK_STAGES_1ROW 3

template <int MT, bool XF, int NS = 2>
__global__ void __launch_bounds__(128) k_skinny2(const __nv_bfloat16 *__restrict__ xb, const float *__restrict__ xf,
                                                 const float *__restrict__ xu, int ldx, int vecx, int M, int K,
                                                 const __nv_bfloat16 *__restrict__ W, int N, int kchunk,
                                                 float *__restrict__ part, int S, const float *bias, float *y,
                                                 int ldy, int accumulate, unsigned *cnt) {
    __shared__ __align__(16) __nv_bfloat16 Ws[SkSmem<MT, 4, NS>::W_ELEMS], Xs[SkSmem<MT, 4, NS>::X_ELEMS];
    skinny2_body<MT, XF, false, 4, NS>(Ws, Xs, xb, xf, xu, ldx, vecx, M, K, W, N, kchunk, part, S, bias, y, ldy,
                                   accumulate, blockIdx.x * SK_N, blockIdx.y, blockIdx.z * MT * 16,
                                   cnt ? cnt + blockIdx.x * gridDim.z + blockIdx.z : NULL, 0);
}

/* Several linears of the same x in one launch (ops->linear_multi): block x of the grid walks the
 * concatenation of every member's (column tile, K slice) grid; each member keeps the slice plan
 * (S, kchunk) a lone call would use, and the body is k_skinny2's, so every output has the bits of
 * a separate ops->linear call. */
struct SkGroup {
    int n;
    int blk0[HYLA_LINEAR_MULTI_MAX + 1]; /* first block of member i; blk0[n] = total */
    int N[HYLA_LINEAR_MULTI_MAX], kchunk[HYLA_LINEAR_MULTI_MAX], S[HYLA_LINEAR_MULTI_MAX],
        ntiles[HYLA_LINEAR_MULTI_MAX], ldy[HYLA_LINEAR_MULTI_MAX];
    const __nv_bfloat16 *W[HYLA_LINEAR_MULTI_MAX];
    float *part[HYLA_LINEAR_MULTI_MAX];
    const float *bias[HYLA_LINEAR_MULTI_MAX];
    float *y[HYLA_LINEAR_MULTI_MAX];
    unsigned *cnt[HYLA_LINEAR_MULTI_MAX]; /* member i's tile counts (NULL: the reduction kernel sums) */
    int C, cl0[HYLA_LINEAR_MULTI_MAX + 1]; /* k_skinny2c: cluster size, first cluster of member i */
    int MB;                                /* k_skinny2c: blocks of MT*16 rows along M */
    /* k_skinny2g with fp32 rows (XF): member i's own x [M][K] (hyla_linear_out.x; NULL: the
     * launch's) and whether it takes 16-byte loads */
    const float *xo[HYLA_LINEAR_MULTI_MAX];
    int vecxo[HYLA_LINEAR_MULTI_MAX];
    int acc[HYLA_LINEAR_MULTI_MAX]; /* k_skinny2g: member i adds onto its y (hyla_linear_out.acc) */
};

template <int MT, bool XF, int NS = 2>
__global__ void __launch_bounds__(128) k_skinny2g(const __nv_bfloat16 *__restrict__ xb, const float *__restrict__ xf,
                                                  int ldx, int vecx, int M, int K, SkGroup G, int accumulate) {
    int i = 0;
    while (i + 1 < G.n && (int)blockIdx.x >= G.blk0[i + 1]) i++;
    const int r = blockIdx.x - G.blk0[i], nt = r % G.ntiles[i], s = r / G.ntiles[i];
    __shared__ __align__(16) __nv_bfloat16 Ws[SkSmem<MT, 4, NS>::W_ELEMS], Xs[SkSmem<MT, 4, NS>::X_ELEMS];
    if (XF && G.xo[i]) { /* the member's own rows (uniform over the block) */
        xf = G.xo[i];
        ldx = K;
        vecx = G.vecxo[i];
    }
    skinny2_body<MT, XF, false, 4, NS>(Ws, Xs, xb, xf, NULL, ldx, vecx, M, K, G.W[i], G.N[i], G.kchunk[i], G.part[i],
                                   G.S[i], G.bias[i], G.y[i], G.ldy[i], accumulate || G.acc[i], nt * SK_N, s,
                                   blockIdx.z * MT * 16, G.cnt[i] ? G.cnt[i] + nt * gridDim.z + blockIdx.z : NULL, 0);
}

/* The same linears with the slices summed across a thread-block cluster (sk_cluster_sum): the
 * grid is clusters of C = the largest S of the members; a cluster holds C / S_i of member i's
 * output tiles, S_i blocks each (block s of a tile computes slice s), and the ranks left over
 * only keep the cluster's barriers. More than 64 rows run in blocks of 64 along M (G.MB). */
template <int MT, bool XF, int NW>
__global__ void __launch_bounds__(32 * NW) k_skinny2c(const __nv_bfloat16 *__restrict__ xb, const float *__restrict__ xf,
                                                      const float *__restrict__ xu, int ldx, int vecx, int M, int K,
                                                      SkGroup G, int accumulate) {
    extern __shared__ __align__(16) unsigned char sk_smem[];
    /* cluster index = (member cluster, row block): the row blocks of one cluster's tiles run
     * side by side, so their weight slices are read from L2 after the first */
    const int C = G.C, cq = blockIdx.x / C, cr = blockIdx.x - cq * C, ci = cq / G.MB, mb = cq - ci * G.MB;
    int i = 0;
    while (i + 1 < G.n && ci >= G.cl0[i + 1]) i++;
    const int S = G.S[i], tpc = C / S, local = cr / S, s = cr - local * S, tile = (ci - G.cl0[i]) * tpc + local;
    if (local >= tpc || tile >= G.ntiles[i]) { /* pdl-lint: returns before the wait touch no memory */
        pdl_trigger();
        cooperative_groups::this_cluster().sync();
        cooperative_groups::this_cluster().sync();
        return;
    }
    __nv_bfloat16 *Ws = (__nv_bfloat16 *)sk_smem, *Xs = Ws + SkSmem<MT, NW>::W_ELEMS;
    skinny2_body<MT, XF, true, NW>(Ws, Xs, xb, xf, xu, ldx, vecx, M, K, G.W[i], G.N[i], G.kchunk[i], NULL, S,
                                   G.bias[i], G.y[i], G.ldy[i], accumulate, tile * 16 * NW, s, mb * MT * 16, NULL,
                                   cr - s);
}

/* y = sum_s part[s] (in s order) + bias + (acc ? y : 0), grid-stride over M x N */
__device__ __forceinline__ void skinny_reduce(const float *__restrict__ part, int S, int M, int N, const float *bias,
                                              float *y, int ldy, int accumulate) {
    size_t total = (size_t)M * N;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        size_t m = i / N, n = i - m * N;
        float v = part[i];
        for (int s = 1; s < S; s++) v += part[(size_t)s * total + i];
        lin_store(v, bias, n, y + m * ldy + n, accumulate);
    }
}

__global__ void k_skinny_reduce(const float *__restrict__ part, int S, int M, int N, const float *bias, float *y,
                                int ldy, int accumulate) {
    pdl_trigger();
    skinny_reduce(part, S, M, N, bias, y, ldy, accumulate);
}

/* k_skinny_reduce for every member of a group with more than one slice (same sums, same order) */
__global__ void k_skinny_reduce_g(SkGroup G, int M, int accumulate) {
    pdl_trigger();
    for (int i = 0; i < G.n; i++)
        if (G.S[i] > 1)
            skinny_reduce(G.part[i], G.S[i], M, G.N[i], G.bias[i], G.y[i], G.ldy[i], accumulate || G.acc[i]);
}

/* The tile counts for a launch of `tiles` output tiles of M rows, any split into slices (NULL:
 * nothing split, more rows than the in-kernel sum suits, or too many tiles for the counts: then
 * the reduction kernel sums). The in-kernel sum is one block's work per tile, on the kernel's
 * tail: for a few rows only (at M = 16 the decode step took 20 % longer than with the reduction
 * kernel, at M = 64 a third longer). */
static unsigned *sk_counts(const hyla_cuda_ctx *c, int M, int split, size_t tiles) {
    if (!split || M > 4 || tiles > HYLA_CU_SK_COUNTS) return NULL;
    return c->sk_count;
}

/* ---- cluster slice sums (k_skinny2c): rows c->sk_cluster .. c->sk_cluster_max, every split
 * linear; more than 64 rows in blocks of 64 along M ---- */

static int sk_cluster_on(const hyla_cuda_ctx *c, int M) {
    return c->sk_cluster > 0 && M >= c->sk_cluster && M <= c->sk_cluster_max;
}

template <int MT, bool XF, int NW>
static hyla_status sk_launch_c(hyla_cuda_ctx *c, unsigned blocks, int C, const __nv_bfloat16 *xb, const float *x,
                               const float *up, int ldx, int vecx, int M, int K, const SkGroup &G, int accumulate) {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[2];
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(32 * NW);
    cfg.dynamicSmemBytes = SkSmem<MT, NW>::BYTES;
    cfg.stream = c->stream;
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = c->pdl;
    at[1].id = cudaLaunchAttributeClusterDimension;
    at[1].val.clusterDim.x = (unsigned)C;
    at[1].val.clusterDim.y = 1;
    at[1].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = 2;
    CU_TRY(cudaLaunchKernelEx(&cfg, k_skinny2c<MT, XF, NW>, xb, x, up, ldx, vecx, M, K, G, accumulate));
    return HYLA_OK;
}

/* G's members (N, S, kchunk, W, bias, y, ldy) laid out in clusters and launched. A block owns
 * 16 output columns per warp; which columns a block owns changes no output's arithmetic (that is
 * the slices', sk_plan, from 64-column tiles). 17-32 rows take 8 warps (128 columns: x staged
 * half as often), the rest 4: on the 1.68B GDN model's decode 8 warps were 3.5 % faster at
 * B = 32 and the same at 64 (kernels/cuda/dev/NOTES.md "Decode at 64 rows"). */
static hyla_status sk_cluster_run(hyla_cuda_ctx *c, SkGroup &G, const __nv_bfloat16 *xb, const float *x,
                                  const float *up, int ldx, int vecx, int M, int K, int accumulate, bool xf) {
    const int NW = M > 16 && M <= 32 ? 8 : 4, BN = 16 * NW;
    int C = 1;
    for (int i = 0; i < G.n; i++)
        if (G.S[i] > C) C = G.S[i];
    G.C = C;
    G.cl0[0] = 0;
    for (int i = 0; i < G.n; i++) {
        const int tpc = C / G.S[i];
        G.ntiles[i] = (G.N[i] + BN - 1) / BN;
        G.cl0[i + 1] = G.cl0[i] + (G.ntiles[i] + tpc - 1) / tpc;
    }
    G.MB = (M + 63) / 64; /* more than 64 rows: blocks of 64 (MT = 4) */
    const unsigned blocks = (unsigned)G.cl0[G.n] * (unsigned)G.MB * (unsigned)C;
    if (M <= 16) {
        if (xf)
            HYLA_TRY((sk_launch_c<1, true, 4>(c, blocks, C, xb, x, up, ldx, vecx, M, K, G, accumulate)));
        else
            HYLA_TRY((sk_launch_c<1, false, 4>(c, blocks, C, xb, x, up, ldx, vecx, M, K, G, accumulate)));
    } else if (M <= 32) {
        HYLA_TRY((sk_launch_c<2, false, 8>(c, blocks, C, xb, x, up, ldx, vecx, M, K, G, accumulate)));
    } else {
        HYLA_TRY((sk_launch_c<4, false, 4>(c, blocks, C, xb, x, up, ldx, vecx, M, K, G, accumulate)));
    }
    CU_LAUNCH_CHECK("skinny linear (cluster sums)");
    return HYLA_OK;
}

/* At context creation: HYLA_CUDA_SK_CLUSTER (rows from which split linears sum their slices in a
 * cluster; 0 = never, the reduction kernel or the last block sums them; the same bits either
 * way), and on this device (function attributes are per device) the kernels' shared memory and
 * cluster sizes above 8. A device that cannot run a 16-block cluster of them keeps the other
 * path. */
extern "C" void cu_skinny_cluster_init(hyla_cuda_ctx *c) {
    const char *e = getenv("HYLA_CUDA_SK_CLUSTER"), *em = getenv("HYLA_CUDA_SK_CLUSTER_MAX");
    c->sk_cluster = e ? atoi(e) : 5;
    c->sk_cluster_max = em && atoi(em) >= 64 && atoi(em) <= 256 ? atoi(em) : 128;
    if (c->sk_cluster <= 0 || c->sk_cluster > 64) {
        c->sk_cluster = 0;
        return;
    }
    const void *ks[4] = {(const void *)k_skinny2c<1, true, 4>, (const void *)k_skinny2c<1, false, 4>,
                         (const void *)k_skinny2c<2, false, 8>, (const void *)k_skinny2c<4, false, 4>};
    const int sm[4] = {SkSmem<1, 4>::BYTES, SkSmem<1, 4>::BYTES, SkSmem<2, 8>::BYTES, SkSmem<4, 4>::BYTES};
    const int nt[4] = {128, 128, 256, 128};
    int ok = 1;
    for (int i = 0; i < 4 && ok; i++) {
        ok &= cudaFuncSetAttribute(ks[i], cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess;
        ok &= cudaFuncSetAttribute(ks[i], cudaFuncAttributeMaxDynamicSharedMemorySize, sm[i]) == cudaSuccess;
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute at[1];
        cfg.gridDim = dim3(16);
        cfg.blockDim = dim3(nt[i]);
        cfg.dynamicSmemBytes = sm[i];
        at[0].id = cudaLaunchAttributeClusterDimension;
        at[0].val.clusterDim.x = 16;
        at[0].val.clusterDim.y = 1;
        at[0].val.clusterDim.z = 1;
        cfg.attrs = at;
        cfg.numAttrs = 1;
        int n = 0;
        ok &= cudaOccupancyMaxActiveClusters(&n, ks[i], &cfg) == cudaSuccess && n > 0;
    }
    if (!ok) {
        (void)cudaGetLastError();
        hyla_log(HYLA_LOG_INFO, "cuda: no 16-block clusters on this device; split linears sum their slices in a "
                                "second pass");
        c->sk_cluster = 0;
    }
}

extern "C" hyla_status cu_skinny_linear(hyla_cuda_ctx *c, const float *x, int ldx, int M, int K, const hyla_weight *W,
                                        const float *bias, float *y, int ldy, int N, int accumulate, const float *up) {
    HYLA_ASSERT(!up || K % 8 == 0);
    int ntiles = (N + SK_N - 1) / SK_N, S, kchunk;
    sk_plan(c, N, K, &S, &kchunk);
    void *scr;
    HYLA_TRY(cu_scratch(c, SCR_LINEAR, (size_t)S * M * N * sizeof(float), &scr));
    float *part = (float *)scr;
    int MT = M <= 16 ? 1 : M <= 32 ? 2 : M <= 64 ? 4 : 8;
    dim3 grid(ntiles, S, (M + MT * 16 - 1) / (MT * 16));
    if (K % 8 == 0) {
        const __nv_bfloat16 *xbb = NULL;
        /* M <= 16: convert x inside the kernel; the SwiGLU only for M <= 4 (every column tile's
         * blocks form it again, in the staging each k step waits for: at M = 16 that made the
         * decode step 6 % slower than its own pass) */
        const bool xf = MT == 1 && (!up || M <= 4);
        const int vecx = ldx % 4 == 0 && ((uintptr_t)x & 15) == 0;
        if (!xf) {
            void *xb;
            HYLA_TRY(cu_scratch(c, SCR_XB, (size_t)M * K * 2, &xb));
            if (up)
                HYLA_TRY(cu_swiglu_bf16_rows(c, x, up, ldx, M, K, (__nv_bfloat16 *)xb));
            else
                HYLA_TRY(cu_f32_to_bf16_rows(c, x, ldx, M, K, (__nv_bfloat16 *)xb));
            xbb = (const __nv_bfloat16 *)xb;
        }
        if (S > 1 && sk_cluster_on(c, M)) {
            SkGroup G;
            memset(&G, 0, sizeof G);
            G.n = 1;
            G.N[0] = N, G.ldy[0] = ldy, G.W[0] = W->d, G.bias[0] = bias, G.y[0] = y;
            G.ntiles[0] = ntiles, G.S[0] = S, G.kchunk[0] = kchunk;
            return sk_cluster_run(c, G, xbb, x, up, ldx, vecx, M, K, accumulate, xf);
        }
        if (MT > 4) { /* 64 rows per block (static shared memory); more blocks along M */
            MT = 4;
            grid.z = (M + 63) / 64;
        }
        unsigned *cnt = sk_counts(c, M, S > 1, (size_t)grid.x * grid.z);
        switch (MT) {
        case 1:
#define SK1(XFV)                                                                                                  \
    HYLA_TRY(cu_launch_pdl(c, k_skinny2<1, XFV, SK_STAGES_1ROW>, grid, 128, 0, xbb, x, up, ldx, vecx, M, K, W->d, N,    \
                           kchunk, part, S, bias, y, ldy, accumulate, cnt))
            if (xf) SK1(true);
            else SK1(false);
#undef SK1
            break;
        case 2:
            HYLA_TRY(cu_launch_pdl(c, k_skinny2<2, false>, grid, 128, 0, xbb, x, up, ldx, vecx, M, K, W->d, N, kchunk,
                                   part, S, bias, y, ldy, accumulate, cnt));
            break;
        default:
            HYLA_TRY(cu_launch_pdl(c, k_skinny2<4, false>, grid, 128, 0, xbb, x, up, ldx, vecx, M, K, W->d, N, kchunk,
                                   part, S, bias, y, ldy, accumulate, cnt));
            break;
        }
        CU_LAUNCH_CHECK("skinny linear v2");
        if (S == 1 || cnt) return HYLA_OK;
    } else switch (MT) {
    case 1: k_skinny<1><<<grid, 128, 0, c->stream>>>(x, ldx, M, K, W->d, N, kchunk, part); break;
    case 2: k_skinny<2><<<grid, 128, 0, c->stream>>>(x, ldx, M, K, W->d, N, kchunk, part); break;
    case 4: k_skinny<4><<<grid, 128, 0, c->stream>>>(x, ldx, M, K, W->d, N, kchunk, part); break;
    default: k_skinny<8><<<grid, 128, 0, c->stream>>>(x, ldx, M, K, W->d, N, kchunk, part); break;
    }
    CU_LAUNCH_CHECK("skinny linear");
    size_t total = (size_t)M * N;
    size_t blocks = (total + 255) / 256;
    if (blocks > 65535u * 8) blocks = 65535u * 8;
    k_skinny_reduce<<<(unsigned)blocks, 256, 0, c->stream>>>(part, S, M, N, bias, y, ldy, accumulate);
    CU_LAUNCH_CHECK("skinny reduce");
    return HYLA_OK;
}

/* Prompt rows of a narrow output (N <= SK_N: one column tile) from their bf16 operand xb [M][K],
 * with the skinny kernel's arithmetic, so each row gets the bits ops->linear gives it as a decode
 * row, for any M: from SK_XB_BIG rows the large-M kernels (k_gemm_wg / k_gemm_big: a block owns
 * its rows and all of K, the slices summed in slice order in registers, x read once, no
 * partials), below it the skinny kernel itself (64-row blocks, k_skinny_reduce; its partials in
 * SCR_NARROW: linear_fixed_rows holds SCR_LINEAR and SCR_XB meanwhile). A GEMM library's plan
 * for a 1024-row block of so few columns splits K and runs tiles of 32 rows: on a 16384-row
 * piece of the 1.68B GDN model its a and b gates took 0.115 ms each, and the skinny kernel over
 * all the rows 0.100 ms (slices of 192 k: short blocks, 12 partials a row). */
#define SK_XB_BIG 256
static hyla_status gemm_big_multi_bf16(hyla_cuda_ctx *c, const __nv_bfloat16 *xb, int M, int K, int n,
                                       const hyla_linear_out *outs, int accumulate);
extern "C" hyla_status cu_skinny_linear_xb(hyla_cuda_ctx *c, const __nv_bfloat16 *xb, int M, int K, int n,
                                           const hyla_linear_out *outs, int accumulate) {
    for (int j = 0; j < n; j++)
        if (outs[j].N > SK_N || K % 8)
            return hyla_fail(HYLA_ERR_INVALID_ARG, "skinny linear (bf16 rows): N %d, K %d", outs[j].N, K);
    /* two outputs of one width (GDN's a and b) in one warpgroup launch there: x read once */
    if (M >= SK_XB_BIG) return gemm_big_multi_bf16(c, xb, M, K, n, outs, accumulate);
    for (int j = 0; j < n; j++) {
        const hyla_linear_out *o = &outs[j];
        int S, kchunk;
        sk_plan(c, o->N, K, &S, &kchunk);
        float *part = NULL;
        if (S > 1) {
            void *scr;
            HYLA_TRY(cu_scratch(c, SCR_NARROW, (size_t)S * M * o->N * sizeof(float), &scr));
            part = (float *)scr;
        }
        const dim3 grid(1, S, (M + 63) / 64);
        HYLA_TRY(cu_launch_pdl(c, k_skinny2<4, false>, grid, 128, 0, xb, (const float *)NULL, (const float *)NULL, K, 0,
                               M, K, o->W->d, o->N, kchunk, part, S, o->bias, o->y, o->ldy, accumulate,
                               (unsigned *)NULL));
        CU_LAUNCH_CHECK("skinny linear (bf16 rows)");
        if (S == 1) continue;
        const size_t blocks = ((size_t)M * o->N + 255) / 256;
        k_skinny_reduce<<<(unsigned)blocks, 256, 0, c->stream>>>(part, S, M, o->N, o->bias, o->y, o->ldy, accumulate);
        CU_LAUNCH_CHECK("skinny reduce (bf16 rows)");
    }
    return HYLA_OK;
}

extern "C" int cu_skinny_multi_ok(const hyla_cuda_ctx *c, int M, int K) {
    return M >= 1 && M <= 256 && K % 8 == 0;
}

/* Whether cu_skinny_linear_multi takes outputs with their own x (hyla_linear_out.x) or their own
 * accumulate in its one launch: rows the kernel reads as fp32 straight from x and sums without
 * the cluster form — one 16-row tile, or up to HYLA_CU_SK_OWN_ROWS rows where K is at most
 * HYLA_CU_SK_OWN_K (SSE's LoRA terms and output gate, K = the LoRA rank; GLA's gate logits,
 * K = 16: a few k steps, where a launch a linear and a conversion of its x a launch cost more
 * than the products: SSE-H B = 64 7-10 % shorter on an H200, B = 256 0.5-2 % longer, so 64 rows;
 * BENCHMARKS.md "Small-K linears of their own input grouped"); elsewhere the caller splits the
 * call by x. */
extern "C" int cu_skinny_multi_own_x(const hyla_cuda_ctx *c, int M, int K) {
    return cu_skinny_multi_ok(c, M, K) &&
           ((M <= 16 && !sk_cluster_on(c, M)) || (M <= HYLA_CU_SK_OWN_ROWS && K <= HYLA_CU_SK_OWN_K));
}

/* n linears of the same x [M][K] in one launch (its last blocks per tile sum the slices; the
 * reduction kernel only where the counts are off or too few); the bits of n separate cu_skinny_linear calls. Requires cu_skinny_multi_ok.
 * xb: x's rows already rounded to bf16 ([M][K], the decode norm's: cu_decode_bf16_rows), taken
 * where the launch would convert x (more than 16 rows, no output of its own x); else NULL. */
static hyla_status skinny_multi(hyla_cuda_ctx *c, const float *x, const __nv_bfloat16 *xb, int ldx, int M, int K,
                                int n, const hyla_linear_out *outs, int accumulate) {
    if (n < 1 || n > HYLA_LINEAR_MULTI_MAX)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "linear_multi: %d outputs (1..%d)", n, HYLA_LINEAR_MULTI_MAX);
    SkGroup G;
    memset(&G, 0, sizeof G);
    G.n = n;
    size_t part_floats = 0;
    int any_split = 0;
    for (int i = 0; i < n; i++) {
        G.N[i] = outs[i].N;
        G.ldy[i] = outs[i].ldy;
        G.W[i] = outs[i].W->d;
        G.bias[i] = outs[i].bias;
        G.y[i] = outs[i].y;
        if (outs[i].x && outs[i].x != x) {
            G.xo[i] = outs[i].x;
            G.vecxo[i] = K % 4 == 0 && ((uintptr_t)outs[i].x & 15) == 0;
        }
        G.acc[i] = outs[i].acc != 0;
        G.ntiles[i] = (outs[i].N + SK_N - 1) / SK_N;
        sk_plan(c, outs[i].N, K, &G.S[i], &G.kchunk[i]);
        G.blk0[i + 1] = G.blk0[i] + G.ntiles[i] * G.S[i];
        part_floats += (size_t)G.S[i] * M * outs[i].N;
        any_split |= G.S[i] > 1;
    }
    void *scr;
    HYLA_TRY(cu_scratch(c, SCR_LINEAR, part_floats * sizeof(float), &scr));
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        G.part[i] = (float *)scr + off;
        off += (size_t)G.S[i] * M * outs[i].N;
    }
    int MT = M <= 16 ? 1 : M <= 32 ? 2 : 4;
    int own = 0; /* outputs of their own x or accumulate: fp32 rows read by the kernel, no cluster */
    for (int i = 0; i < n; i++) {
        if ((G.xo[i] || G.acc[i]) && !cu_skinny_multi_own_x(c, M, K))
            return hyla_fail(HYLA_ERR_INVALID_ARG, "linear_multi: output %d has its own x or accumulate at %d rows", i,
                             M);
        own |= G.xo[i] || G.acc[i];
    }
    const bool xf = MT == 1 || own;
    if (xb && xf) return hyla_fail(HYLA_ERR_INTERNAL, "skinny linear: bf16 rows at %d rows or with own x", M);
    const int vecx = ldx % 4 == 0 && ((uintptr_t)x & 15) == 0;
    const __nv_bfloat16 *xbb = xb;
    if (!xf && !xb) { /* one conversion of x for the whole group */
        void *xb;
        HYLA_TRY(cu_scratch(c, SCR_XB, (size_t)M * K * 2, &xb));
        HYLA_TRY(cu_f32_to_bf16_rows(c, x, ldx, M, K, (__nv_bfloat16 *)xb));
        xbb = (const __nv_bfloat16 *)xb;
    }
    if (any_split && sk_cluster_on(c, M) && !own)
        return sk_cluster_run(c, G, xbb, x, NULL, ldx, vecx, M, K, accumulate, xf);
    dim3 grid(G.blk0[n], 1, (M + MT * 16 - 1) / (MT * 16));
    size_t tiles = 0;
    for (int i = 0; i < n; i++) tiles += (size_t)G.ntiles[i] * grid.z;
    unsigned *cnt = sk_counts(c, M, any_split, tiles);
    for (size_t i = 0, at = 0; cnt && i < (size_t)n; at += (size_t)G.ntiles[i] * grid.z, i++)
        G.cnt[i] = G.S[i] > 1 ? cnt + at : NULL;
    if (MT == 1) {
#define SKG1(XFV) \
    HYLA_TRY(cu_launch_pdl(c, k_skinny2g<1, XFV, SK_STAGES_1ROW>, grid, 128, 0, xbb, x, ldx, vecx, M, K, G, accumulate))
        if (xf) SKG1(true);
        else SKG1(false);
#undef SKG1
    } else if (MT == 2) {
        if (xf) HYLA_TRY(cu_launch_pdl(c, k_skinny2g<2, true>, grid, 128, 0, xbb, x, ldx, vecx, M, K, G, accumulate));
        else HYLA_TRY(cu_launch_pdl(c, k_skinny2g<2, false>, grid, 128, 0, xbb, x, ldx, vecx, M, K, G, accumulate));
    } else {
        if (xf) HYLA_TRY(cu_launch_pdl(c, k_skinny2g<4, true>, grid, 128, 0, xbb, x, ldx, vecx, M, K, G, accumulate));
        else HYLA_TRY(cu_launch_pdl(c, k_skinny2g<4, false>, grid, 128, 0, xbb, x, ldx, vecx, M, K, G, accumulate));
    }
    CU_LAUNCH_CHECK("skinny linear (multi)");
    if (!any_split || cnt) return HYLA_OK;
    size_t total = 0;
    for (int i = 0; i < n; i++)
        if (G.S[i] > 1 && (size_t)M * outs[i].N > total) total = (size_t)M * outs[i].N;
    size_t blocks = (total + 255) / 256;
    if (blocks > 65535u * 8) blocks = 65535u * 8;
    k_skinny_reduce_g<<<(unsigned)blocks, 256, 0, c->stream>>>(G, M, accumulate);
    CU_LAUNCH_CHECK("skinny reduce (multi)");
    return HYLA_OK;
}

extern "C" hyla_status cu_skinny_linear_multi(hyla_cuda_ctx *c, const float *x, int ldx, int M, int K, int n,
                                              const hyla_linear_out *outs, int accumulate) {
    return skinny_multi(c, x, NULL, ldx, M, K, n, outs, accumulate);
}

extern "C" hyla_status cu_skinny_linear_multi_xb(hyla_cuda_ctx *c, const __nv_bfloat16 *xb, int M, int K, int n,
                                                 const hyla_linear_out *outs, int accumulate) {
    return skinny_multi(c, (const float *)xb, xb, K, M, K, n, outs, accumulate);
}

/* ---------------------------------------------------------------- large M, the same bits */

/* k_gemm_big: the skinny linear's arithmetic for many rows (M > 64: prefill pieces of several
 * chunks). A block owns a 128 x 128 output tile and all of K; 8 warps as 2 (rows) x 4 (columns),
 * 64 x 32 outputs per warp; W and x tiles of 64 k arrive by cp.async three stages deep. Every
 * output gets exactly the skinny kernel's operations: the same K slices (sk_plan, from N and K),
 * within a slice the same m16n8k16 products over the same 16-wide k steps in the same order from
 * a zero accumulator (zero-padded past K as there), and the slices summed in slice order before
 * the bias and the accumulate — so a row's result is bit-identical to what the skinny kernel
 * gives it, for any M. That keeps ops->linear's contract (a row's result does not depend on M)
 * while prefill pieces of many tokens run at GEMM speed. x is bf16 (cu_f32_to_bf16_rows). */
/* Tiles: WM x WN warps (8), each MT m16 x NT n8 outputs; BM = WM*MT*16 rows, BN = WN*NT*8
 * columns; ST cp.async stages; TSM: the slice sums in shared memory (a [values][256] array, so
 * the large tiles stay under 255 registers) instead of registers. */
template <int WM, int WN, int MT, int NT, int ST, bool TSM>
struct BigCfg {
    static constexpr int BM = WM * MT * 16, BN = WN * NT * 8, NV = MT * NT * 4, NTH = WM * WN * 32;
    static constexpr size_t SMEM = (size_t)ST * (BM + BN) * SK_LD * 2 + (TSM ? (size_t)NV * NTH * 4 : 0);
};

template <int WM, int WN, int MT, int NT, int ST, bool TSM>
__global__ void __launch_bounds__(BigCfg<WM, WN, MT, NT, ST, TSM>::NTH,
                                  (BigCfg<WM, WN, MT, NT, ST, TSM>::SMEM <= 113 * 1024) ? 2 : 1)
    k_gemm_big(const __nv_bfloat16 *__restrict__ xb, int M, int K, const __nv_bfloat16 *__restrict__ W, int N,
               int kchunk, const float *bias, float *y, int ldy, int accumulate) {
    typedef BigCfg<WM, WN, MT, NT, ST, TSM> C;
    constexpr int BM = C::BM, BN = C::BN, NTH = C::NTH;
    extern __shared__ __align__(16) unsigned char bg_smem[];
    __nv_bfloat16 *Ws = (__nv_bfloat16 *)bg_smem; /* [ST][BN][SK_LD] */
    __nv_bfloat16 *Xs = Ws + ST * BN * SK_LD;     /* [ST][BM][SK_LD] */
    float *tots = (float *)(Xs + ST * BM * SK_LD); /* TSM: [NV][NTH] */
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, tq = lane & 3;
    const int wm = w / WN, wn = w % WN;
    const int n0 = blockIdx.x * BN, m0 = blockIdx.y * BM;
    const int nkt = (K + SK_K - 1) / SK_K;
    auto stage = [&](int buf, int t) {
        const int kt = t * SK_K;
        int kend = (kt / kchunk + 1) * kchunk;
        if (kend > K) kend = K;
        __nv_bfloat16 *ws = Ws + buf * BN * SK_LD, *xs = Xs + buf * BM * SK_LD;
#pragma unroll
        for (int q = 0; q < BN * 8 / NTH; q++) {
            int c = tid + q * NTH, r = c >> 3, kk = (c & 7) * 8, n = n0 + r, k = kt + kk;
            bool ok = n < N && k < kend;
            cp_async16(ws + r * SK_LD + kk, ok ? (const void *)(W + (size_t)n * K + k) : (const void *)W, ok ? 16 : 0);
        }
#pragma unroll
        for (int q = 0; q < BM * 8 / NTH; q++) {
            int c = tid + q * NTH, r = c >> 3, kk = (c & 7) * 8, m = m0 + r, k = kt + kk;
            bool ok = m < M && k < kend;
            cp_async16(xs + r * SK_LD + kk, ok ? (const void *)(xb + (size_t)m * K + k) : (const void *)xb, ok ? 16 : 0);
        }
    };
    float acc[MT][NT][4], tot[TSM ? 1 : MT][TSM ? 1 : NT][4];
    frag_zero(acc);
#pragma unroll
    for (int s = 0; s < ST - 1; s++) {
        if (s < nkt) stage(s, s);
        cp_async_commit();
    }
    bool first = true;
    for (int t = 0; t < nkt; t++) {
        /* tile t has landed once at most ST - 2 groups are pending; the barrier also ends every
         * warp's reads of tile t - 1, whose buffer the next stage then overwrites */
        cp_async_wait<ST - 2>();
        __syncthreads();
        if (t + ST - 1 < nkt) stage((t + ST - 1) % ST, t + ST - 1);
        cp_async_commit();
        const __nv_bfloat16 *ws = Ws + (t % ST) * BN * SK_LD, *xs = Xs + (t % ST) * BM * SK_LD;
#pragma unroll
        for (int kc = 0; kc < SK_K / 16; kc++) {
            uint32_t bfr[NT / 2][2][2];
#pragma unroll
            for (int nb = 0; nb < NT / 2; nb++)
                ldsm_frag_b2_nk(bfr[nb], ws + (wn * NT * 8 + nb * 16) * SK_LD + kc * 16, SK_LD);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                uint32_t af[4];
                ldsm_frag_a(af, xs + (wm * MT * 16 + mt * 16) * SK_LD + kc * 16, SK_LD);
#pragma unroll
                for (int nt = 0; nt < NT; nt++) mma_bf16_16816(acc[mt][nt], af, bfr[nt >> 1][nt & 1]);
            }
        }
        const int kt_end = (t + 1) * SK_K;
        if (kt_end % kchunk == 0 || kt_end >= K) { /* end of a K slice: fold it in, slice order */
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        if (TSM) {
                            float *tp = tots + ((mt * NT + nt) * 4 + e) * NTH + tid;
                            *tp = first ? acc[mt][nt][e] : *tp + acc[mt][nt][e];
                        } else {
                            float &tv = tot[TSM ? 0 : mt][TSM ? 0 : nt][e];
                            tv = first ? acc[mt][nt][e] : tv + acc[mt][nt][e];
                        }
                        acc[mt][nt][e] = 0.0f;
                    }
            first = false;
        }
    }
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int m = m0 + wm * MT * 16 + mt * 16 + g + (e >> 1) * 8, n = n0 + wn * NT * 8 + nt * 8 + 2 * tq + (e & 1);
                if (m < M && n < N) {
                    float v = TSM ? tots[((mt * NT + nt) * 4 + e) * NTH + tid] : tot[TSM ? 0 : mt][TSM ? 0 : nt][e];
                    lin_store(v, bias, n, y + (size_t)m * ldy + n, accumulate);
                }
            }
}

template <int WM, int WN, int MT, int NT, int ST, bool TSM>
static hyla_status launch_big(hyla_cuda_ctx *c, const __nv_bfloat16 *xb, int M, int K, const hyla_weight *W,
                              int N, int kchunk, const float *bias, float *y, int ldy, int accumulate) {
    typedef BigCfg<WM, WN, MT, NT, ST, TSM> C;
    /* The shared-memory attribute belongs to the function on the current device: set once per
     * device ordinal (a tensor-parallel group launches it on several); ordinals past the table
     * set it every time. */
    static int attr_set[16];
    int *slot = c->device >= 0 && c->device < 16 ? &attr_set[c->device] : NULL;
    if (!slot || !__atomic_load_n(slot, __ATOMIC_RELAXED)) {
        CU_TRY(cudaFuncSetAttribute(k_gemm_big<WM, WN, MT, NT, ST, TSM>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)C::SMEM));
        if (slot) __atomic_store_n(slot, 1, __ATOMIC_RELAXED);
    }
    dim3 grid((N + C::BN - 1) / C::BN, (M + C::BM - 1) / C::BM);
    if (grid.y > 65535) return hyla_fail(HYLA_ERR_UNSUPPORTED, "linear: M = %d rows is too many for one call", M);
    k_gemm_big<WM, WN, MT, NT, ST, TSM><<<grid, C::NTH, C::SMEM, c->stream>>>(xb, M, K, W->d, N, kchunk, bias, y,
                                                                             ldy, accumulate);
    CU_LAUNCH_CHECK("linear (large M)");
    return HYLA_OK;
}

/* The form for a shape, by the number t1 of 64 x 128 one-warpgroup blocks the outputs make
 * (sk_plan gives the slices S from N and K). Whole K per block runs k_gemm_wgp (a producer warp,
 * 6 stages); "slices" is k_gemm_wg's cluster form, one K slice per block summed across the
 * cluster. Up to 64 rows: slices (one warpgroup) where t1 is under a third of the SMs, else one
 * warpgroup whole K, both in blocks of 64 columns (m64n64 products, half the shared memory, twice
 * the blocks: the lab at 64 rows, us, 64 against 128 columns: 2304 -> 6144 whole K 18.0 / 19.9,
 * 2304 -> 4608 16.1 / 19.0, the LM head 64.4 / 66.2, 2304 -> 2304 slices 13.8 / 16.1, 3072 -> 2304
 * 15.2 / 17.2), except slices over K > 3072 (o, down: level, 21.7 / 22.1 at 6144 -> 2304, and
 * slower at 32 rows), which keep 128. From 65 rows: two warpgroups whole K where t1 exceeds the
 * SMs; slices (two warpgroups) under a sixth of them; one warpgroup whole K in 64 columns where
 * 2 t1 fits the SMs (96-192-row steps 2-4 % shorter on an H200; taken for every output from 65
 * to 128 rows, paired and wide ones too, it made an H100's GDN steps 1-4 % slower, and at 256
 * rows the 144 blocks of a 2304-wide output overrun one wave); else in 128 columns. The kernel
 * lab's times on H100, weights streamed from memory (kernels/cuda/dev/NOTES.md "Producer warps"),
 * us, this choice against k_gemm_wg's forms: 256 x 2304 -> 2304 20.1 / 36.8, 256 x 4608 -> 2304 29.9 / 50.2,
 * 256 x 2304 -> 6144 30.8 / 40.0, 128 x 6144 -> 2304 33.7 / 36.3, 64 x 2304 -> 6144 20.2 / 22.6,
 * the LM head at 64 rows 67.1 / 80.4; slices stay best at 64 x 2304 -> 2304 (15.7 against 19.1)
 * and 128 x 2304 -> 1152. Every form gives the same bits.
 * more (or NULL): a second and third output (more[1].W NULL: none) of the same N and K, in the
 * same launch; their tiles count in the choice of form. */
static hyla_status gemm_wg(hyla_cuda_ctx *c, const __nv_bfloat16 *xb, int M, int K, const hyla_linear_out *o,
                           const hyla_linear_out *more, int S, int kchunk, int accumulate, int *done) {
    /* the weights' tensor maps are made once and kept with them */
    hyla_weight *W = (hyla_weight *)o->W;
    const int N = o->N, nout = more ? (more[1].W ? 3 : 2) : 1;
#define WG_ARGS c, xb, M, K, W, N, kchunk, S, o->bias, o->y, o->ldy, more, accumulate, done
    const long t1 = (long)nout * ((M + 63) / 64) * ((N + 127) / 128); /* one-warpgroup blocks */
    if (!c->gemm_wgp) { /* k_gemm_wg's forms alone (HYLA_CUDA_GEMM_WGP=0) */
        if (M <= 64) { /* one warpgroup a block: no rows of padding past 64 */
            if (S > 1) return launch_wg2<1, 128, 3, true, true>(WG_ARGS);
            return launch_wg2<1, 128, 4, false, true>(WG_ARGS);
        }
        if (S > 1 && 2L * nout * ((M + 127) / 128) * ((N + 127) / 128) < c->sm_count)
            return launch_wg2<2, 128, 3, true, true>(WG_ARGS);
        return launch_wg2<2, 128, 4, false, true>(WG_ARGS);
    }
    if (M <= 64) { /* 64 columns a block (m64n64 products) except the slices of a deep K */
        if (S > 1 && 3 * t1 < c->sm_count) {
            if (K <= 3072) return launch_wg2<1, 64, 3, true, true>(WG_ARGS);
            return launch_wg2<1, 128, 3, true, true>(WG_ARGS);
        }
        return launch_wg2<1, 64, 6, false, false, true>(WG_ARGS);
    }
    if (t1 > c->sm_count) return launch_wg2<2, 128, 6, false, false, true>(WG_ARGS);
    if (S > 1 && 6 * t1 < c->sm_count) return launch_wg2<2, 128, 3, true, true>(WG_ARGS);
    /* kernels/cuda/dev/NOTES.md "64-column blocks from 65 rows" */
    if (c->gemm_wg_n64 && 2 * t1 <= c->sm_count) return launch_wg2<1, 64, 6, false, false, true>(WG_ARGS);
    return launch_wg2<1, 128, 6, false, false, true>(WG_ARGS);
#undef WG_ARGS
}

/* Rows from which k_gemm_big may take over from the skinny kernel (the same bits either way). 17
 * made a 64 x 2304 -> 6144 linear faster (0.031 -> 0.025 ms) but decode at B = 64 slower (sse-h
 * 7.0 -> 9.7 ms: for N = 2304 the 64x64 tiles give 36 blocks where the skinny kernel's K slices
 * fill the GPU). With the cluster sums the skinny kernel keeps rows up to c->sk_cluster_max (128:
 * 1.68B GDN decode at B = 96 / 128 13 % / 8 % faster than k_gemm_big, at 256 6 % slower). */
#define BIG_MIN_ROWS 65

extern "C" int cu_gemm_big_ok(const hyla_cuda_ctx *c, int M, int K) {
    if (K % 8) return 0;
    if (c->gemm_wg && M >= c->gemm_wg_min) return 1;
    return M >= BIG_MIN_ROWS && !sk_cluster_on(c, M);
}

/* At context creation: HYLA_CUDA_GEMM_WG=0 turns k_gemm_wg off (on by default where the build
 * has sm_90a code and the device is a Hopper), HYLA_CUDA_GEMM_WG_MIN moves the rows from which it
 * takes over (1-256; the same bits either way), HYLA_CUDA_GEMM_WGP=0 keeps the producer-warp
 * forms out (gemm_wg). The default, 33, is one GPU's (1.68B GDN decode,
 * H100): from 65 rows against 129, B = 96 / 128 8.29 -> 7.42 / 9.85 -> 9.01 ms; from 33 against
 * 65 (one warpgroup a block up to 64 rows, cu_linear_multi's outputs narrower than a tile left
 * to the skinny kernel's grouped launch), B = 48 / 64 4.57 -> 4.44 / 5.43 -> 5.17 ms, B = 32
 * within 0.5 %. A tensor-parallel rank's half-width linears are 3-7 % slower on it, so its group
 * sets 65 (hyla_cuda_set_gemm_wg_min: from 65 rows the producer-warp forms make them faster). */
#define GEMM_WG_MIN_DEFAULT 33
extern "C" void cu_gemm_wg_init(hyla_cuda_ctx *c, int cc_major) {
    const char *e = getenv("HYLA_CUDA_GEMM_WG"), *em = getenv("HYLA_CUDA_GEMM_WG_MIN"), *ep = getenv("HYLA_CUDA_GEMM_WGP");
    c->gemm_wg = WG_BUILT && cc_major == 9 && !(e && !strcmp(e, "0"));
    c->gemm_wg_min_env = em && atoi(em) >= 1 && atoi(em) <= 256;
    c->gemm_wg_min = c->gemm_wg_min_env ? atoi(em) : GEMM_WG_MIN_DEFAULT;
    c->gemm_wgp = !(ep && !strcmp(ep, "0"));
    const char *en = getenv("HYLA_CUDA_GEMM_WG_N64");
    c->gemm_wg_n64 = !(en && !strcmp(en, "0"));
    const char *ed = getenv("HYLA_CUDA_DECODE_BF16");
    c->decode_bf16 = !(ed && !strcmp(ed, "0"));
}


/* y = x W^T (+ bias) (+ y) for M > 64 rows through k_gemm_big: the skinny kernel's bits, with
 * the tile shape chosen by the output's size (every shape gives the same bits): 128x128 by 4
 * warps of 64x64, sums in shared memory (the fastest at M = 4096 on H100: 156-239 TFLOP/s), or
 * 64x64 by 4 warps of 32x32, sums in registers, up to 4 blocks per SM, when the 128x128 tiles
 * would not fill the GPU twice (prefill pieces of a few hundred rows against N ~ D). Other
 * shapes measured slower on H100 (8 warps of 64x32, 128x64, 64x128, 4 stages: BENCHMARKS.md
 * sixth round). */
static hyla_status gemm_big_bf16(hyla_cuda_ctx *c, const __nv_bfloat16 *xbb, int M, int K, const hyla_weight *W,
                                 const float *bias, float *y, int ldy, int N, int accumulate) {
    int S, kchunk;
    sk_plan(c, N, K, &S, &kchunk);
    if (c->gemm_wg && M >= c->gemm_wg_min) { /* without tensor maps: k_gemm_big below */
        int done = 0;
        const hyla_linear_out o = {W, bias, y, ldy, N};
        HYLA_TRY(gemm_wg(c, xbb, M, K, &o, NULL, S, kchunk, accumulate, &done));
        if (done) return HYLA_OK;
    }
    const long tiles = (long)((M + 127) / 128) * ((N + 127) / 128);
    if (tiles < 2L * c->sm_count)
        return launch_big<2, 2, 2, 4, 3, false>(c, xbb, M, K, W, N, kchunk, bias, y, ldy, accumulate);
    return launch_big<2, 2, 4, 8, 3, true>(c, xbb, M, K, W, N, kchunk, bias, y, ldy, accumulate);
}

/* linear_multi's outputs through the large-M path from their bf16 rows xb */
static hyla_status gemm_big_multi_bf16(hyla_cuda_ctx *c, const __nv_bfloat16 *xb, int M, int K, int n,
                                       const hyla_linear_out *outs, int accumulate) {
    /* on the warpgroup path, two outputs of the same width in one launch (a layer's q and k, v
     * and gate, MLP gate and up: the same bits, one launch's ramp and tail instead of two), three
     * where they are narrow (SSE's LoRA inputs and output gate input, 128 wide: their launches
     * are mostly ramp and tail; SSE-H B = 64 / 128 0.6-2 % shorter on an H200, where three wide
     * outputs of GLA's in one launch took a slower form and made 128-256 rows 1-2 % longer) */
    int paired[HYLA_LINEAR_MULTI_MAX] = {0};
    for (int j = 0; j < n; j++) {
        if (paired[j]) continue;
        int mate[2] = {-1, -1}, nm = 0;
        if (c->gemm_wg && M >= c->gemm_wg_min)
            for (int k = j + 1; k < n && nm < (outs[j].N <= 512 ? 2 : 1); k++)
                if (!paired[k] && outs[k].N == outs[j].N) mate[nm++] = k;
        if (nm) {
            int S, kchunk, done = 0;
            hyla_linear_out more[2];
            memset(more, 0, sizeof more);
            for (int i = 0; i < nm; i++) more[i] = outs[mate[i]];
            sk_plan(c, outs[j].N, K, &S, &kchunk);
            HYLA_TRY(gemm_wg(c, (const __nv_bfloat16 *)xb, M, K, &outs[j], more, S, kchunk, accumulate, &done));
            if (done) {
                for (int i = 0; i < nm; i++) paired[mate[i]] = 1;
                continue;
            }
        }
        HYLA_TRY(gemm_big_bf16(c, (const __nv_bfloat16 *)xb, M, K, outs[j].W, outs[j].bias, outs[j].y, outs[j].ldy,
                               outs[j].N, accumulate));
    }
    return HYLA_OK;
}

/* linear_multi's outputs through the large-M path with x rounded to bf16 once for all of them
 * (the same values each separate call would round: the same bits, n - 1 conversions fewer) */
extern "C" hyla_status cu_gemm_big_multi(hyla_cuda_ctx *c, const float *x, int ldx, int M, int K, int n,
                                         const hyla_linear_out *outs, int accumulate) {
    void *xb;
    HYLA_TRY(cu_scratch(c, SCR_XB, (size_t)M * K * 2, &xb));
    HYLA_TRY(cu_f32_to_bf16_rows(c, x, ldx, M, K, (__nv_bfloat16 *)xb));
    return gemm_big_multi_bf16(c, (const __nv_bfloat16 *)xb, M, K, n, outs, accumulate);
}

extern "C" hyla_status cu_gemm_big_multi_xb(hyla_cuda_ctx *c, const __nv_bfloat16 *xb, int M, int K, int n,
                                            const hyla_linear_out *outs, int accumulate) {
    return gemm_big_multi_bf16(c, xb, M, K, n, outs, accumulate);
}

/* Decode rows whose every linear_multi path of x [M][K] reads x as bf16 rows it converts itself
 * (the warpgroup linear, and the skinny kernel's grouped launch for narrow outputs above 16
 * rows): there the norm before may write those rows (ops->decode_bf16_rows) */
extern "C" int cu_decode_bf16_rows(const hyla_cuda_ctx *c, int M, int K) {
    return c->decode_bf16 && M > 16 && K % 8 == 0 && cu_gemm_big_ok(c, M, K);
}

extern "C" hyla_status cu_gemm_big_xb(hyla_cuda_ctx *c, const __nv_bfloat16 *xb, int M, int K, const hyla_weight *W,
                                      const float *bias, float *y, int ldy, int N, int accumulate) {
    return gemm_big_bf16(c, xb, M, K, W, bias, y, ldy, N, accumulate);
}

extern "C" hyla_status cu_gemm_big(hyla_cuda_ctx *c, const float *x, int ldx, int M, int K, const hyla_weight *W,
                                   const float *bias, float *y, int ldy, int N, int accumulate) {
    const hyla_linear_out o = {W, bias, y, ldy, N};
    return cu_gemm_big_multi(c, x, ldx, M, K, 1, &o, accumulate);
}
