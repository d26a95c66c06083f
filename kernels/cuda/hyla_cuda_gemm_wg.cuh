/* hyla_cuda_gemm_wg.cuh — what the batch-invariant linears share with the kernel lab: the slice
 * plan (which K slices an N x K weight's outputs sum, hence their bits), the slice sum across a
 * thread-block cluster, and the warpgroup linear k_gemm_wg with its launch (hyla_cuda_gemm.cu
 * picks its forms; kernels/cuda/dev/gemm_wg_forms times the others from the same template).
 * Included by one translation unit each: its host functions are static. */
#ifndef HYLA_CUDA_GEMM_WG_CUH
#define HYLA_CUDA_GEMM_WG_CUH

#include <cooperative_groups.h>

#include "hyla_cuda_impl.h"
#include "hyla_cuda_mma.cuh"
#include "hyla_cuda_tma.cuh"
#include "hyla_cuda_wgmma.cuh"

#define SK_N 64 /* output columns per block */
#define SK_K 64 /* K per shared-memory tile */
#define SK_LD 72

/* The slice plan of an N x K weight: enough blocks for ~4 per SM, from N and K only. */
static void sk_plan(const hyla_cuda_ctx *c, int N, int K, int *S_out, int *kchunk_out) {
    int ntiles = (N + SK_N - 1) / SK_N;
    int ktiles = (K + SK_K - 1) / SK_K;
    int S = (4 * c->sm_count + ntiles - 1) / ntiles;
    if (S > 16) S = 16;
    if (S > ktiles) S = ktiles;
    if (S < 1) S = 1;
    int kchunk = (ktiles + S - 1) / S * SK_K;
    *S_out = (K + kchunk - 1) / kchunk;
    *kchunk_out = kchunk;
}

/* The slice reduction across a thread-block cluster: the S blocks of one output tile (cluster
 * ranks r0 .. r0 + S - 1) have each left their slice's partial tile in their own shared memory
 * (P, rows x PLD floats), and after the cluster barrier block s sums its share of the tile's
 * outputs, reading the S partials from the peers' shared memory in slice order: the arithmetic
 * of k_skinny_reduce and sk_finish_tile (v = p0, v += p1, ...), so the same bits, while the
 * partials never leave the SMs (at 64 rows they are more bytes than the weights) and no second
 * kernel runs. The caller holds the cluster barrier again before the block's shared memory may
 * go. */
template <int MT, int BN, int PLD>
__device__ __forceinline__ void sk_cluster_sum(float *P, int S, int r0, int s, int M, int N, const float *bias,
                                               float *y, int ldy, int accumulate, int m0, int n0) {
    cooperative_groups::cluster_group cl = cooperative_groups::this_cluster();
    const int rows = M - m0 < MT * 16 ? M - m0 : MT * 16, cols = N - n0 < BN ? N - n0 : BN;
    const int tot = rows * cols, per = (tot + S - 1) / S, i1 = (s + 1) * per < tot ? (s + 1) * per : tot;
    for (int i = s * per + (int)threadIdx.x; i < i1; i += blockDim.x) {
        const int r = i / cols, cc = i - r * cols, off = r * PLD + cc;
        float t[16]; /* every peer's load in flight at once (S <= 16, sk_plan) */
#pragma unroll
        for (int q = 0; q < 16; q++) t[q] = q < S ? *cl.map_shared_rank(P + off, (unsigned)(r0 + q)) : 0.0f;
        float v = t[0];
#pragma unroll
        for (int q = 1; q < 16; q++)
            if (q < S) v += t[q];
        lin_store(v, bias, n0 + cc, y + (size_t)(m0 + r) * ldy + n0 + cc, accumulate);
    }
}

/* ---------------------------------------------------------------- large M, warpgroup products */

/* k_gemm_wg: k_gemm_big's contract (the skinny kernel's bits for any M) on Hopper's warpgroup
 * products (wgmma.mma_async m64nNk16, sm_90a). One wgmma k16 step rounds exactly as one
 * mma.sync m16n8k16 step (kernels/cuda/dev/wgmma_bits: every output of 393,216 over uniform and
 * 2^-24..2^24-spread inputs, the same bits), so an output that gets the same k16 steps in the
 * same order from a zero accumulator, slice by slice, then the slices' sums in slice order, has
 * the skinny kernel's bits. A warpgroup's product reads its operand tiles from shared memory
 * itself (no fragment loads through registers per warp, as mma.sync needs), and the tiles arrive
 * by the copy engine, not by every thread's 16-byte copies.
 * Block: WGM warpgroups along M (BM = 64 WGM rows) x BN columns; x and W tiles of 64 k arrive by
 * tensor maps (one thread issues them, an mbarrier per stage) ST stages deep, in the 128-byte
 * swizzle. Two forms: whole K per block (each slice from a zeroed accumulator, folded into `tot`
 * as it ends), or CL: one slice per block, the S blocks of an output tile a cluster that sums
 * the slices from each other's shared memory in slice order (sk_cluster_sum), for outputs too
 * few to fill the GPU (N = D at 256 rows: 36 tiles of 128 x 128). OV: a tile's products stay in
 * flight while the stage before it is loaded again (10-16 % off the whole-K form; nothing off
 * the slices, whose blocks are short: 3-7 tiles). At 256 rows it runs up to 1.5 x k_gemm_big's rate (equal at 2304 x 2304)
 * and ~0.5 x cuBLAS's (BENCHMARKS.md "Decode: large batches on warpgroup products"). */
#ifdef HYLA_CUDA_SM90A
#define WG_BUILT 1
#else
#define WG_BUILT 0
#endif

template <int WGM, int BN, int ST, bool CL>
struct WgCfg {
    static constexpr int BM = 64 * WGM, NTH = 128 * WGM, NACC = BN / 2, STAGE = (BM + BN) * 64, PLD = BN + 8;
    static constexpr size_t STAGING = (size_t)ST * STAGE * 2, PART = CL ? (size_t)BM * PLD * 4 : 0;
    /* + the stages' mbarriers, + the alignment */
    static constexpr size_t SMEM = (STAGING > PART ? STAGING : PART) + 8 * ST + 1024;
};

/* -DHYLA_WG_PROFILE (diagnostic builds only): thread 0 of the first and the last block of each
 * of the first 16 launches of at most 512 rows adds up its cycles by phase — the prologue, per tile the wait for the
 * stage, the products (issue to done) and the barrier (k_gemm_wgp: the producer's waits for a
 * free stage), then the cluster's barriers and its sum —
 * and records them in device memory; launch_wg then prints them from a one-thread kernel. The
 * products kernel itself has no call in it: a printf there would make ptxas serialize every
 * wgmma of the kernel, and the profile would time another kernel. */
#ifdef HYLA_WG_PROFILE
struct WgProfRec {
    int form, M, K, N, S, nkt;
    unsigned blin, bn;
    long long pf[9];
};
static __device__ int g_wgprof_launches, g_wgprof_n, g_wgprof_printed; /* per translation unit */
static __device__ WgProfRec g_wgprof[32];
__device__ __forceinline__ long long wg_clock() {
    long long t;
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(t)::"memory");
    return t;
}
static __global__ void k_wgprof_print() {
    /* the producer-warp forms' "barriers": the producer's waits for a free stage */
    static const char *forms[6] = {"whole K",        "whole K, in flight",     "slices", "slices, in flight",
                                   "producer, whole K", "producer, slices"};
    const int n = g_wgprof_n < 32 ? g_wgprof_n : 32;
    for (int i = g_wgprof_printed; i < n; i++) {
        const WgProfRec *r = &g_wgprof[i];
        printf("gemm_wg profile: %s %d x %d -> %d, %d slices (block %u of %u, %d tiles): prologue %lld, waits "
               "%lld, products %lld, barriers %lld, loop end %lld; cluster barrier %lld, sum %lld, barrier "
               "%lld; total %lld cycles\n",
               forms[r->form < 6 ? r->form : 0], r->M, r->K, r->N, r->S, r->blin, r->bn, r->nkt, r->pf[0], r->pf[1], r->pf[2],
               r->pf[3], r->pf[4], r->pf[5], r->pf[6], r->pf[7], r->pf[8]);
    }
    g_wgprof_printed = n;
}
/* thread 0's record of its block (the first or the last of the grid, the first 16 launches) */
__device__ __forceinline__ void wg_prof_report(int form, int M, int K, int N, int S, int nkt, const long long *pf,
                                               long long pt0) {
    if (M > 512) return; /* the decode rows it is for, not a bench's large products ahead of them */
    const unsigned blin = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z),
                   bn = gridDim.x * gridDim.y * gridDim.z;
    if (threadIdx.x != 0 || (blin != 0 && blin != bn - 1)) return;
    const int launch = blin == 0 ? atomicAdd(&g_wgprof_launches, 1) : atomicAdd(&g_wgprof_launches, 0) - 1;
    if (launch >= 16) return;
    const int slot = atomicAdd(&g_wgprof_n, 1);
    if (slot >= 32) return;
    WgProfRec *r = &g_wgprof[slot];
    r->form = form, r->M = M, r->K = K, r->N = N, r->S = S, r->nkt = nkt, r->blin = blin, r->bn = bn;
    for (int i = 0; i < 8; i++) r->pf[i] = pf[i];
    r->pf[8] = wg_clock() - pt0;
}
#define WG_PROF(...) __VA_ARGS__
#else
#define WG_PROF(...)
#endif

/* What a block of k_gemm_wg or k_gemm_wgp computes: its slice s (CL: blockIdx.x), its output
 * tile (n0, m0) and which output it is of (the column tiles of a second and third output of the
 * same x, N and K follow the first's: one launch for them all, a layer's q and k, v and gate,
 * the MLP's gate and up, SSE's LoRA inputs with its output gate's), and its K range
 * [kbeg, kend) of nkt tiles of 64. */
struct WgBlock {
    int s, out, n0, m0, kbeg, kend, nkt;
};
/* the second and third outputs of a launch (WgBlock.out 1 and 2) */
struct WgMore {
    const float *bias2, *bias3;
    float *y2, *y3;
    int ldy2, ldy3;
};
/* the block's output: its weight map, bias, y and ldy */
__device__ __forceinline__ const CUtensorMap *wg_pick(int out, const CUtensorMap *w1, const CUtensorMap *w2,
                                                      const CUtensorMap *w3, const WgMore &mo, const float **bias,
                                                      float **y, int *ldy) {
    if (out == 1) *bias = mo.bias2, *y = mo.y2, *ldy = mo.ldy2;
    if (out == 2) *bias = mo.bias3, *y = mo.y3, *ldy = mo.ldy3;
    return out == 0 ? w1 : out == 1 ? w2 : w3;
}
template <int BN, int BM, bool CL>
__device__ __forceinline__ WgBlock wg_block(int N, int K, int kchunk) {
    WgBlock b;
    b.s = CL ? (int)blockIdx.x : 0;
    const int ntl = (N + BN - 1) / BN, jt = CL ? (int)blockIdx.y : (int)blockIdx.x;
    b.out = jt / ntl;
    b.n0 = (jt - b.out * ntl) * BN;
    b.m0 = (CL ? blockIdx.z : blockIdx.y) * BM;
    b.kbeg = CL ? b.s * kchunk : 0;
    b.kend = CL ? (b.kbeg + kchunk < K ? b.kbeg + kchunk : K) : K;
    b.nkt = (b.kend - b.kbeg + SK_K - 1) / SK_K;
    return b;
}

/* The ends of k_gemm_wg's and k_gemm_wgp's blocks. Accumulator register i of a warpgroup's
 * m64nNk16 products: n8 block i / 4; rows g and g + 8 of the warp's 16 (rw: the thread's first
 * row in the block). Whole K: the folded tile to y; CL: the slice's partial tile into P (rows of
 * PLD floats) for the cluster's slice sum. */
template <int NACC>
__device__ __forceinline__ void wg_store_tile(const float *v, int M, int N, int m0, int n0, int rw, int tq,
                                              const float *bias, float *y, int ldy, int accumulate) {
    constexpr int G = NACC < 16 ? NACC : 16; /* outputs whose loads go before their stores (lin_store_g) */
#pragma unroll
    for (int i0 = 0; i0 < NACC; i0 += G) {
        int m[G], n[G];
#pragma unroll
        for (int j = 0; j < G; j++) {
            const int i = i0 + j;
            m[j] = m0 + rw + 8 * ((i & 3) >> 1);
            n[j] = n0 + 8 * (i >> 2) + 2 * tq + (i & 1);
        }
        lin_store_g<G>(v + i0, m, n, M, N, bias, y, ldy, accumulate);
    }
}
template <int NACC, int PLD>
__device__ __forceinline__ void wg_put_partial(float *P, const float *acc, int rw, int tq) {
#pragma unroll
    for (int i = 0; i < NACC; i += 2)
        *(float2 *)&P[(rw + 8 * ((i & 3) >> 1)) * PLD + 8 * (i >> 2) + 2 * tq] = make_float2(acc[i], acc[i + 1]);
}

template <int WGM, int BN, int ST, bool CL, bool OV>
__global__ void __launch_bounds__(128 * WGM, 1)
    k_gemm_wg(const __grid_constant__ CUtensorMap xmap, const __grid_constant__ CUtensorMap wmap,
              const __grid_constant__ CUtensorMap wmap2, const __grid_constant__ CUtensorMap wmap3, int M, int K,
              int N, int kchunk, int S, const float *bias, float *y, int ldy, const WgMore mo, int accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    typedef WgCfg<WGM, BN, ST, CL> C;
    constexpr int BM = C::BM;
    extern __shared__ __align__(1024) unsigned char wg_smem_raw[];
    unsigned char *wg_smem = wg_align1024(wg_smem_raw);
    __nv_bfloat16 *sm = (__nv_bfloat16 *)wg_smem;
    uint64_t *full = (uint64_t *)(wg_smem + (C::STAGING > C::PART ? C::STAGING : C::PART));
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, wg = tid >> 7, g = lane >> 2, tq = lane & 3;
    const WgBlock B = wg_block<BN, BM, CL>(N, K, kchunk);
    const int s = B.s, n0 = B.n0, m0 = B.m0, kbeg = B.kbeg, kend = B.kend, nkt = B.nkt;
    const CUtensorMap *wm = wg_pick(B.out, &wmap, &wmap2, &wmap3, mo, &bias, &y, &ldy);
    /* tile t into stage t % ST by the copy engine: x's BM rows and W's BN rows of k kbeg + 64 t
     * (rows past M or N and k past K read as zero, as the skinny kernel's padding) */
    auto stage = [&](int t) {
        const int b = t % ST;
        __nv_bfloat16 *xs = sm + b * C::STAGE, *ws = xs + BM * SK_K;
        mbar_expect_tx(&full[b], (unsigned)C::STAGE * 2);
        tma_g2s_2d(xs, &xmap, kbeg + t * SK_K, m0, &full[b]);
        tma_g2s_2d(ws, wm, kbeg + t * SK_K, n0, &full[b]);
    };
    WG_PROF(long long pt0 = wg_clock(); long long pf[8] = {0, 0, 0, 0, 0, 0, 0, 0}; long long pa);
    if (tid == 0) {
        for (int b = 0; b < ST; b++) mbar_init(&full[b], 1);
        fence_proxy_async_smem();
        for (int p = 0; p < ST - 1 && p < nkt; p++) stage(p);
    }
    __syncthreads();
    WG_PROF(pf[0] = wg_clock() - pt0);
    float acc[C::NACC], tot[CL ? 1 : C::NACC];
    /* One K slice at a time, as k_gemm_wgp (whose comment says why): the accumulator zeroed
     * before a slice's first products, folded in after its last tile's */
    bool first = true;
    int t = 0;
    for (int k0 = kbeg; k0 < kend;) {
        int k1 = CL ? kend : (k0 / kchunk + 1) * kchunk;
        if (k1 > kend) k1 = kend;
        const int tn = (k1 - k0 + SK_K - 1) / SK_K;
#pragma unroll
        for (int i = 0; i < C::NACC; i++) acc[i] = 0.0f;
        for (int u = 0; u < tn; u++, t++) {
            if (!OV) {
                /* after the barrier every warpgroup has finished tile t - 1's products (waited for
                 * below), so its stage may be loaded again */
                if (t > 0) __syncthreads();
                if (tid == 0 && t + ST - 1 < nkt) stage(t + ST - 1);
            }
            WG_PROF(pa = wg_clock());
            mbar_wait(&full[t % ST], (unsigned)(t / ST) & 1);
            WG_PROF(pf[1] += wg_clock() - pa; pa = wg_clock());
            const __nv_bfloat16 *xs = sm + (t % ST) * C::STAGE, *ws = xs + BM * SK_K;
            wg_fence();
#pragma unroll
            for (int j = 0; j < SK_K / 16; j++)
                wg_mma<BN>(acc, wg_desc(xs + wg * 64 * SK_K + j * 16), wg_desc(ws + j * 16), 1);
            wg_commit();
            /* OV: tile t's products stay in flight while tile t - 1's stage is loaded again:
             * after this warpgroup's products of t - 1 are done and the barrier (every
             * warpgroup's) */
            if (OV)
                wg_wait<1>();
            else
                wg_wait<0>();
            WG_PROF(pf[2] += wg_clock() - pa; pa = wg_clock());
            if (OV) {
                __syncthreads();
                if (tid == 0 && t + ST - 1 < nkt) stage(t + ST - 1); /* t = 0: a stage not used yet */
            }
            WG_PROF(pf[3] += wg_clock() - pa);
        }
        wg_wait<0>(); /* the slice's last tile */
        if (!CL) { /* end of a K slice: fold it in, slice order */
#pragma unroll
            for (int i = 0; i < C::NACC; i++) tot[CL ? 0 : i] = first ? acc[i] : tot[CL ? 0 : i] + acc[i];
            first = false;
        }
        k0 = k1;
    }
    WG_PROF(pf[4] = wg_clock() - pt0);
#ifdef HYLA_WG_PROFILE
    auto report = [&](int form) { wg_prof_report(form, M, K, N, S, nkt, pf, pt0); };
#endif
    /* the thread's first row in the block (wg_store_tile) */
    const int rw = wg * 64 + (w & 3) * 16 + g;
    if (!CL) {
        wg_store_tile<C::NACC>(tot, M, N, m0, n0, rw, tq, bias, y, ldy, accumulate);
        WG_PROF(report(OV ? 1 : 0));
        return;
    }
    /* CL: the slice's partial tile into the (now idle) staging, then the cluster's slice sum */
    __syncthreads();
    float *P = reinterpret_cast<float *>(wg_smem);
    wg_put_partial<C::NACC, C::PLD>(P, acc, rw, tq);
    WG_PROF(pa = wg_clock());
    cooperative_groups::this_cluster().sync();
    WG_PROF(pf[5] = wg_clock() - pa; pa = wg_clock());
    sk_cluster_sum<BM / 16, BN, C::PLD>(P, S, 0, s, M, N, bias, y, ldy, accumulate, m0, n0);
    WG_PROF(pf[6] = wg_clock() - pa; pa = wg_clock());
    cooperative_groups::this_cluster().sync();
    WG_PROF(pf[7] = wg_clock() - pa; report(OV ? 3 : 2));
#endif
}

/* k_gemm_wgp: k_gemm_wg with a producer warp. In k_gemm_wg every 64-k tile ends in a block
 * barrier (the warpgroups wait for each other's products before thread 0 reissues the stage):
 * ~500 of a ~1,500-cycle tile in its profile. Here a warp of its own issues the copies, and each
 * stage has a second mbarrier, "empty", on which each consumer warpgroup arrives once its
 * products of that stage are done (wgmma.wait_group 1 after the next tile's products are
 * issued), so the consumers take no block barrier in the loop and the producer runs up to ST
 * tiles ahead. The same products in the same order from the same zero accumulators: k_gemm_wg's
 * bits (gemm_wg_forms and test_gpu_ops compare them). Whole K per block, or CL as k_gemm_wg;
 * one to three outputs (wmap2, wmap3, mo) as k_gemm_wg. */
template <int WGM, int BN, int ST, bool CL>
__global__ void __launch_bounds__(128 * WGM + 32, 1)
    k_gemm_wgp(const __grid_constant__ CUtensorMap xmap, const __grid_constant__ CUtensorMap wmap,
               const __grid_constant__ CUtensorMap wmap2, const __grid_constant__ CUtensorMap wmap3, int M, int K,
               int N, int kchunk, int S, const float *bias, float *y, int ldy, const WgMore mo, int accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    typedef WgCfg<WGM, BN, ST, CL> C;
    constexpr int BM = C::BM;
    extern __shared__ __align__(1024) unsigned char wgp_smem_raw[];
    unsigned char *smem = wg_align1024(wgp_smem_raw);
    __nv_bfloat16 *sm = (__nv_bfloat16 *)smem;
    uint64_t *full = (uint64_t *)(smem + (C::STAGING > C::PART ? C::STAGING : C::PART)), *empty = full + ST;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, wg = tid >> 7, g = lane >> 2, tq = lane & 3;
    /* the role as a warp-uniform value (a shuffle from lane 0), so that ptxas sees the products
     * outside any divergent path */
    const bool producer = __shfl_sync(0xffffffffu, tid >> 7, 0) == WGM;
    const WgBlock B = wg_block<BN, BM, CL>(N, K, kchunk);
    const int s = B.s, n0 = B.n0, m0 = B.m0, kbeg = B.kbeg, kend = B.kend, nkt = B.nkt;
    const CUtensorMap *wm = wg_pick(B.out, &wmap, &wmap2, &wmap3, mo, &bias, &y, &ldy);
    WG_PROF(long long pt0 = wg_clock(); long long pf[8] = {0, 0, 0, 0, 0, 0, 0, 0}; long long pa;
            __shared__ long long prod_wait);
    if (tid == 0) {
        for (int b = 0; b < ST; b++) mbar_init(&full[b], 1), mbar_init(&empty[b], WGM);
        fence_proxy_async_smem();
    }
    __syncthreads();
    WG_PROF(pf[0] = wg_clock() - pt0);
    float acc[C::NACC], tot[CL ? 1 : C::NACC];
    if (producer) {
        if (lane == 0) {
            WG_PROF(long long pw = 0);
            for (int t = 0; t < nkt; t++) {
                const int b = t % ST;
                WG_PROF(pa = wg_clock());
                if (t >= ST) mbar_wait(&empty[b], (unsigned)(t / ST - 1) & 1);
                WG_PROF(pw += wg_clock() - pa);
                __nv_bfloat16 *xs = sm + b * C::STAGE, *ws = xs + BM * SK_K;
                mbar_expect_tx(&full[b], (unsigned)C::STAGE * 2);
                tma_g2s_2d(xs, &xmap, kbeg + t * SK_K, m0, &full[b]);
                tma_g2s_2d(ws, wm, kbeg + t * SK_K, n0, &full[b]);
            }
            WG_PROF(atomicExch((unsigned long long *)&prod_wait, (unsigned long long)pw));
        }
    } else {
        /* One K slice at a time (CL: the block's one slice): the accumulator is zeroed before the
         * slice's first products and folded in after its last tile's (wait 0), so inside a slice no
         * instruction but the products touches it and a tile's products stay in flight across the
         * next tile's wait. A zeroing or fold inside the tile loop, even predicated off, makes
         * ptxas wait for every tile's products before the next tile (a WARPGROUP.DEPBAR 0 per
         * iteration in the SASS): the tensor cores then idle through each tile's wait. */
        bool first = true;
        int t = 0;
        for (int k0 = kbeg; k0 < kend;) {
            int k1 = CL ? kend : (k0 / kchunk + 1) * kchunk;
            if (k1 > kend) k1 = kend;
            const int tn = (k1 - k0 + SK_K - 1) / SK_K;
#pragma unroll
            for (int i = 0; i < C::NACC; i++) acc[i] = 0.0f;
            for (int u = 0; u < tn; u++, t++) {
                WG_PROF(pa = wg_clock());
                mbar_wait(&full[t % ST], (unsigned)(t / ST) & 1);
                WG_PROF(pf[1] += wg_clock() - pa; pa = wg_clock());
                const __nv_bfloat16 *xs = sm + (t % ST) * C::STAGE, *ws = xs + BM * SK_K;
                wg_fence();
#pragma unroll
                for (int j = 0; j < SK_K / 16; j++)
                    wg_mma<BN>(acc, wg_desc(xs + wg * 64 * SK_K + j * 16), wg_desc(ws + j * 16), 1);
                wg_commit();
                wg_wait<1>();
                WG_PROF(pf[2] += wg_clock() - pa);
                /* this warpgroup's products of tile t - 1 are done: its stage may be loaded again */
                if (t > 0 && (tid & 127) == 0) mbar_arrive(&empty[(t - 1) % ST]);
            }
            wg_wait<0>(); /* the slice's last tile */
            if (!CL) { /* fold the slice in, slice order */
#pragma unroll
                for (int i = 0; i < C::NACC; i++) tot[CL ? 0 : i] = first ? acc[i] : tot[CL ? 0 : i] + acc[i];
                first = false;
            }
            k0 = k1;
        }
    }
    WG_PROF(pf[4] = wg_clock() - pt0);
    const int rw = wg * 64 + (w & 3) * 16 + g;
    if (!CL) {
        if (producer) return;
        wg_store_tile<C::NACC>(tot, M, N, m0, n0, rw, tq, bias, y, ldy, accumulate);
        WG_PROF(pf[3] = (long long)atomicAdd((unsigned long long *)&prod_wait, 0ull);
                wg_prof_report(4, M, K, N, S, nkt, pf, pt0));
        return;
    }
    /* CL: every copy has landed (the consumers waited for each), so the staging may hold the
     * slice's partial tile; then the cluster's slice sum, the producer warp's threads helping */
    __syncthreads();
    float *P = reinterpret_cast<float *>(smem);
    if (!producer) wg_put_partial<C::NACC, C::PLD>(P, acc, rw, tq);
    WG_PROF(pa = wg_clock());
    cooperative_groups::this_cluster().sync();
    WG_PROF(pf[5] = wg_clock() - pa; pa = wg_clock());
    sk_cluster_sum<BM / 16, BN, C::PLD>(P, S, 0, s, M, N, bias, y, ldy, accumulate, m0, n0);
    WG_PROF(pf[6] = wg_clock() - pa; pa = wg_clock());
    cooperative_groups::this_cluster().sync();
    WG_PROF(pf[7] = wg_clock() - pa; pf[3] = (long long)atomicAdd((unsigned long long *)&prod_wait, 0ull);
            wg_prof_report(5, M, K, N, S, nkt, pf, pt0));
#endif
}

/* A 2-D tensor map of a bf16 [rows][K] matrix, boxes of `box` rows x 64 k in the 128-byte
 * swizzle (out-of-range elements read as zero). 0: cannot. */
static int wg_map(CUtensorMap *map, const void *base, int rows, int K, int box) {
    PFN_cuTensorMapEncodeTiled_v12000 enc = cu_tensor_map_encoder();
    if (!enc) return 0;
    const cuuint64_t dim[2] = {(cuuint64_t)K, (cuuint64_t)rows}, str[1] = {(cuuint64_t)K * 2};
    const cuuint32_t bx[2] = {SK_K, (cuuint32_t)box}, es[2] = {1, 1};
    return enc(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)base, dim, str, bx, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
               CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

/* hyla_weight.wg_map's slot of the maps with boxes of BN rows (32 and 48: the kernel lab's forms) */
static constexpr int wg_map_slot(int BN) { return BN == 256 ? 1 : BN == 64 ? 2 : BN == 32 ? 3 : BN == 48 ? 4 : 0; }

/* One output, or up to three of the same N and K from the same x in one launch (more: NULL, or
 * the second and third, more[1].W NULL for two). PW: k_gemm_wgp (a producer warp; OV does not
 * apply), else k_gemm_wg. */
template <int WGM, int BN, int ST, bool CL, bool OV, bool PW = false>
static hyla_status launch_wg2(hyla_cuda_ctx *c, const __nv_bfloat16 *xb, int M, int K, hyla_weight *W, int N,
                              int kchunk, int S, const float *bias, float *y, int ldy, const hyla_linear_out *more,
                              int accumulate, int *done) {
    hyla_weight *W2 = more ? (hyla_weight *)more[0].W : NULL, *W3 = more ? (hyla_weight *)more[1].W : NULL;
    const unsigned nout = W3 ? 3u : W2 ? 2u : 1u;
    typedef WgCfg<WGM, BN, ST, CL> C;
    const size_t smem = C::SMEM + (PW ? 8 * ST : 0); /* + k_gemm_wgp's empty barriers */
    static_assert(BN == 32 || BN == 48 || BN == 64 || BN == 128 || BN == 256, "no weight map slot for this box height");
    auto kern = PW ? k_gemm_wgp<WGM, BN, ST, CL> : k_gemm_wg<WGM, BN, ST, CL, OV>;
    *done = 0;
    /* the weights' maps, made once per box height and kept with them */
    const int wi = wg_map_slot(BN);
    if (!W->wg_map_state[wi]) W->wg_map_state[wi] = wg_map(&W->wg_map[wi], W->d, N, K, BN) ? 1 : -1;
    if (W2 && !W2->wg_map_state[wi]) W2->wg_map_state[wi] = wg_map(&W2->wg_map[wi], W2->d, N, K, BN) ? 1 : -1;
    if (W3 && !W3->wg_map_state[wi]) W3->wg_map_state[wi] = wg_map(&W3->wg_map[wi], W3->d, N, K, BN) ? 1 : -1;
    CUtensorMap xm;
    if (W->wg_map_state[wi] < 0 || (W2 && W2->wg_map_state[wi] < 0) || (W3 && W3->wg_map_state[wi] < 0) ||
        !wg_map(&xm, xb, M, K, C::BM))
        return HYLA_OK;
    static int attr_set[16]; /* per device ordinal, as launch_big */
    int *slot = c->device >= 0 && c->device < 16 ? &attr_set[c->device] : NULL;
    if (!slot || !__atomic_load_n(slot, __ATOMIC_RELAXED)) {
        CU_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        if (CL) CU_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
        if (slot) __atomic_store_n(slot, 1, __ATOMIC_RELAXED);
    }
    const unsigned nt = (unsigned)((N + BN - 1) / BN) * nout, mt = (unsigned)((M + C::BM - 1) / C::BM);
    if (mt > 65535) return hyla_fail(HYLA_ERR_UNSUPPORTED, "linear: M = %d rows is too many for one call", M);
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    cfg.gridDim = CL ? dim3((unsigned)S, nt, mt) : dim3(nt, mt);
    cfg.blockDim = dim3(C::NTH + (PW ? 32 : 0));
    cfg.dynamicSmemBytes = smem;
    cfg.stream = c->stream;
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = CL ? (unsigned)S : 1;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = CL ? 1 : 0;
    WgMore mo = {};
    if (W2) mo.bias2 = more[0].bias, mo.y2 = more[0].y, mo.ldy2 = more[0].ldy;
    if (W3) mo.bias3 = more[1].bias, mo.y3 = more[1].y, mo.ldy3 = more[1].ldy;
    CU_TRY(cudaLaunchKernelEx(&cfg, kern, xm, W->wg_map[wi], W2 ? W2->wg_map[wi] : W->wg_map[wi],
                              W3 ? W3->wg_map[wi] : W->wg_map[wi], M, K, N, kchunk, S, bias, y, ldy, mo, accumulate));
    CU_LAUNCH_CHECK(PW ? "linear (warpgroup products, producer warp)" : "linear (warpgroup products)");
#ifdef HYLA_WG_PROFILE
    k_wgprof_print<<<1, 1, 0, c->stream>>>();
#endif
    *done = 1;
    return HYLA_OK;
}

template <int WGM, int BN, int ST, bool CL, bool OV, bool PW = false>
static hyla_status launch_wg(hyla_cuda_ctx *c, const __nv_bfloat16 *xb, int M, int K, hyla_weight *W, int N,
                             int kchunk, int S, const float *bias, float *y, int ldy, int accumulate, int *done) {
    return launch_wg2<WGM, BN, ST, CL, OV, PW>(c, xb, M, K, W, N, kchunk, S, bias, y, ldy, NULL, accumulate, done);
}


#endif
