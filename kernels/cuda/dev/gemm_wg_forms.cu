/* gemm_wg_forms.cu — the kernel lab's forms of the warpgroup linear (k_gemm_wg, from the
 * product's template in hyla_cuda_gemm_wg.cuh) at decode rows, against the product's mma.sync
 * path, bit for bit, and timed.
 *
 * The product picks two forms by the output's size (whole K per block; one K slice per block
 * with the slices summed across a cluster), both with two warpgroups of 64 rows, 128 columns,
 * and a tile's products in flight. This program runs those and the other instances of the same
 * template — one or two warpgroups (64 or 128 rows a block), 128 or 256 columns, 3 to 5 stages,
 * products waited for at every tile or kept in flight — on the 1.68B GDN model's shapes and a
 * tensor-parallel rank's halves and the LM head, so the next change to the product's choice is a measured one.
 * Every form must give the bits of the product's path with the warpgroup form off
 * (HYLA_CUDA_GEMM_WG=0: the skinny kernel / k_gemm_big, which every row alone shares).
 *
 * The streamed form (k_gemm_ps, at most 64 rows) runs the plan's units persistently; the runs
 * form (k_gemm_wgr) gives each block of a cluster a run of consecutive slices.
 * Each timed call streams its weight from memory: the loops cycle through copies of it that
 * together exceed the L2 cache twice (a decode step reads each weight once).
 *
 * usage: [FORMS=SUBSTRING] gemm_wg_forms [M...]   (default M = 64 128 256)
 * Exit status 1 when a form's output differs from the product's bits, 77 off Hopper. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hyla_cuda_gemm_wg.cuh"
#include "hyla_ops.h"
#include "lab.h"

/* k_gemm_ps: the skinny kernel's bits (the same slice plan: each output's slice s sums its k16
 * steps from zero, then the slices are summed in slice order) for M <= 64 rows, as a persistent
 * stream. The work is the plan's units, (BN-column tile, slice) pairs; each of G blocks takes
 * units b, b + G, b + 2G, ... and one thread keeps ST tiles of 64 k (x and W by tensor maps, the
 * 128-byte swizzle) in flight across the unit boundaries, so a block's weight stream never
 * drains between units the way a grid of short blocks does (one wave of 3-7-tile blocks, each a
 * chain of load latency: kernels/cuda/dev/NOTES.md "Decode at 64 rows"). A unit ends by storing
 * its slice's partial tile; the last of a tile's S units to count itself in sums them in slice
 * order (sk_finish_tile's arithmetic) and resets the count. BN: 32 or 64 (m64n32 products,
 * BN / 32 of them per k16 step: an output column's steps do not depend on the tile width).
 * Measured (H100, weights streamed from memory; NOTES.md "The staged runs, run; decode linears"):
 * slower than the product's skinny kernel at every shape, and slower with more stages; it is
 * kept here, not in the product. */
template <int BN, int ST>
struct PsCfg {
    static constexpr int STAGE = (64 + BN) * 64; /* elements: x's 64 rows, then W's BN rows */
    static constexpr size_t SMEM = (size_t)ST * STAGE * 2 + 8 * ST + 1024;
};

template <int BN, int ST>
__global__ void __launch_bounds__(128, 1)
    k_gemm_ps(const __grid_constant__ CUtensorMap xmap, const __grid_constant__ CUtensorMap wmap, int M, int K, int N,
              int kchunk, int S, const float *bias, float *y, int ldy, int accumulate, float *part, unsigned *cnt) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    typedef PsCfg<BN, ST> C;
    constexpr int NB = BN / 32;
    extern __shared__ __align__(1024) unsigned char ps_smem_raw[];
    unsigned char *ps_smem = wg_align1024(ps_smem_raw);
    __nv_bfloat16 *sm = (__nv_bfloat16 *)ps_smem;
    uint64_t *full = (uint64_t *)(ps_smem + (size_t)ST * C::STAGE * 2);
    __shared__ int last;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, tq = lane & 3;
    const int ntl = (N + BN - 1) / BN, units = ntl * S, G = (int)gridDim.x;
    auto unit_tiles = [&](int u) {
        const int kb = (u % S) * kchunk, ke = kb + kchunk < K ? kb + kchunk : K;
        return (ke - kb + SK_K - 1) / SK_K;
    };
    /* the producer's cursor: the unit (this block's i-th: b + i G) and tile of the next stage */
    int pu = blockIdx.x, pt = 0, pn = pu < units ? unit_tiles(pu) : 0;
    unsigned pf = 0; /* stages issued */
    auto issue = [&]() {
        if (pu >= units) return;
        const int b = pf % ST;
        __nv_bfloat16 *xs = sm + b * C::STAGE, *ws = xs + 64 * SK_K;
        const int k = (pu % S) * kchunk + pt * SK_K;
        mbar_expect_tx(&full[b], (unsigned)C::STAGE * 2);
        tma_g2s_2d(ws, &wmap, k, (pu / S) * BN, &full[b]);
        tma_g2s_2d(xs, &xmap, k, 0, &full[b]);
        pf++;
        if (++pt == pn) {
            pt = 0;
            pu += G;
            pn = pu < units ? unit_tiles(pu) : 0;
        }
    };
    if (tid == 0) {
        for (int b = 0; b < ST; b++) mbar_init(&full[b], 1);
        fence_proxy_async_smem();
        for (int p = 0; p < ST - 1; p++) issue();
    }
    __syncthreads();
    unsigned f = 0; /* stages consumed */
    for (int u = blockIdx.x; u < units; u += G) {
        const int nkt = unit_tiles(u), tile = u / S, s = u % S, n0 = tile * BN;
        float acc[NB][4][4];
#pragma unroll
        for (int j = 0; j < NB; j++)
#pragma unroll
            for (int a = 0; a < 4; a++)
#pragma unroll
                for (int e = 0; e < 4; e++) acc[j][a][e] = 0.0f;
        for (int t = 0; t < nkt; t++, f++) {
            const int b = f % ST;
            mbar_wait(&full[b], (f / ST) & 1);
            const __nv_bfloat16 *xs = sm + b * C::STAGE, *ws = xs + 64 * SK_K;
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < SK_K / 16; kk++)
#pragma unroll
                for (int j = 0; j < NB; j++) wg_mma32(acc[j], wg_desc(xs + kk * 16), wg_desc(ws + j * 32 * SK_K + kk * 16), 1);
            wg_commit();
            /* this tile's products stay in flight while the stage before it is loaded again:
             * once every warp's products of that stage are done (wait, then the barrier) */
            if (t + 1 < nkt)
                wg_wait<1>();
            else
                wg_wait<0>();
            __syncthreads();
            if (tid == 0) issue();
        }
        /* register (j, a, e): n8 block 4 j + a of the tile; rows g and g + 8 of warp w's 16 */
        if (S == 1) {
#pragma unroll
            for (int j = 0; j < NB; j++)
#pragma unroll
                for (int a = 0; a < 4; a++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int m = w * 16 + g + 8 * (e >> 1), n = n0 + 32 * j + 8 * a + 2 * tq + (e & 1);
                        if (m < M && n < N) lin_store(acc[j][a][e], bias, n, y + (size_t)m * ldy + n, accumulate);
                    }
            continue;
        }
        float *ps = part + (size_t)s * M * N;
#pragma unroll
        for (int j = 0; j < NB; j++)
#pragma unroll
            for (int a = 0; a < 4; a++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int m = w * 16 + g + 8 * (e >> 1), n = n0 + 32 * j + 8 * a + 2 * tq + (e & 1);
                    if (m < M && n < N) ps[(size_t)m * N + n] = acc[j][a][e];
                }
        __threadfence();
        __syncthreads();
        if (tid == 0) {
            last = atomicAdd(&cnt[tile], 1u) == (unsigned)S - 1;
            if (last) atomicExch(&cnt[tile], 0u);
        }
        __syncthreads();
        if (!last) continue;
        __threadfence();
        const size_t total = (size_t)M * N;
        for (int i = tid; i < M * BN; i += 128) {
            const int m = i / BN, n = n0 + i % BN;
            if (n >= N) continue;
            const size_t o = (size_t)m * N + n;
            float tv[16]; /* every slice's load in flight at once (S <= 16, sk_plan) */
#pragma unroll
            for (int q = 0; q < 16; q++) tv[q] = q < S ? __ldcg(part + (size_t)q * total + o) : 0.0f;
            float v = tv[0];
#pragma unroll
            for (int q = 1; q < 16; q++)
                if (q < S) v += tv[q];
            lin_store(v, bias, n, y + (size_t)m * ldy + n, accumulate);
        }
    }
#endif
}

/* k_gemm_ps's launch: G = the blocks that fit the device at once (at most the units); part holds
 * S M N floats, cnt (zero between launches) one count per BN-column tile. */
template <int BN, int ST>
static hyla_status launch_ps(hyla_cuda_ctx *c, const __nv_bfloat16 *xb, int M, int K, hyla_weight *W, int N,
                             int kchunk, int S, const float *bias, float *y, int ldy, int accumulate, float *part,
                             unsigned *cnt, int *done) {
    typedef PsCfg<BN, ST> C;
    *done = 0;
    if (M > 64 || (N + BN - 1) / BN > HYLA_CU_SK_COUNTS) return HYLA_OK;
    CUtensorMap wm, xm;
    if (!wg_map(&wm, W->d, N, K, BN) || !wg_map(&xm, xb, M, K, 64)) return HYLA_OK;
    static int per_sm[16]; /* blocks per SM, + 1, per device ordinal */
    int *slot = c->device >= 0 && c->device < 16 ? &per_sm[c->device] : NULL;
    int bps = slot ? __atomic_load_n(slot, __ATOMIC_RELAXED) - 1 : -1;
    if (bps < 0) {
        CU_TRY(cudaFuncSetAttribute(k_gemm_ps<BN, ST>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)C::SMEM));
        CU_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&bps, k_gemm_ps<BN, ST>, 128, C::SMEM));
        if (bps < 1) bps = 1;
        if (slot) __atomic_store_n(slot, bps + 1, __ATOMIC_RELAXED);
    }
    const long units = (long)((N + BN - 1) / BN) * S;
    const unsigned G = (unsigned)(units < (long)bps * c->sm_count ? units : (long)bps * c->sm_count);
    k_gemm_ps<BN, ST><<<G, 128, C::SMEM, c->stream>>>(xm, wm, M, K, N, kchunk, S, bias, y, ldy, accumulate,
                                                       part, cnt);
    CU_LAUNCH_CHECK("linear (streamed few rows)");
    *done = 1;
    return HYLA_OK;
}

/* k_gemm_wgr: runs of slices a block (kernels/cuda/dev/NOTES.md "Decode at 64 rows: runs of
 * slices a block"). The skinny kernel's bits: each slice a zero-started chain of k16 steps, the
 * slices summed in slice order. A cluster of R blocks per 64 x 128 output tile; block r takes
 * the run of slices [rG, min(S, (r + 1)G)) and streams its tiles through k_gemm_wgp's ring (a
 * producer warp, full / empty mbarriers, no block barrier in the loop). Block 0 folds its run as
 * the whole-K form does (v = p0, v += p1, ...: the prefix of the slice-order sum); the others
 * keep each slice's partial tile in shared memory. After the cluster barrier each block sums
 * its share of the tile's outputs: block 0's fold, then p_G ... p_(S-1) in order, from the
 * owners' shared memory. */
template <int ST, int GMAX>
struct WgrCfg {
    static constexpr int BM = 64, BN = 128, NACC = 64, STAGE = (BM + BN) * 64, PLD = BN + 8;
    static constexpr size_t STAGING = (size_t)ST * STAGE * 2, PART = (size_t)BM * PLD * 4;
    static constexpr size_t SMEM = STAGING + GMAX * PART + 16 * ST + 1024;
};

template <int ST, int GMAX>
__global__ void __launch_bounds__(160, 1)
    k_gemm_wgr(const __grid_constant__ CUtensorMap xmap, const __grid_constant__ CUtensorMap wmap, int M, int K,
               int N, int kchunk, int S, int G, const float *bias, float *y, int ldy, int accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    typedef WgrCfg<ST, GMAX> C;
    constexpr int BM = C::BM, BN = C::BN, PLD = C::PLD;
    extern __shared__ __align__(1024) unsigned char wgr_smem_raw[];
    unsigned char *smem = wg_align1024(wgr_smem_raw);
    __nv_bfloat16 *sm = (__nv_bfloat16 *)smem;
    float *parts = (float *)(smem + C::STAGING);
    uint64_t *full = (uint64_t *)(smem + C::STAGING + GMAX * C::PART), *empty = full + ST;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, tq = lane & 3;
    const bool producer = __shfl_sync(0xffffffffu, tid >> 7, 0) == 1;
    const int r = (int)blockIdx.x, R = (int)gridDim.x;
    const int n0 = (int)blockIdx.y * BN, m0 = (int)blockIdx.z * BM;
    const int s0 = r * G, s1 = s0 + G < S ? s0 + G : S;
    const int kbeg = s0 * kchunk, kend = s1 * kchunk < K ? s1 * kchunk : K;
    const int nkt = kend > kbeg ? (kend - kbeg + SK_K - 1) / SK_K : 0;
    if (tid == 0) {
        for (int b = 0; b < ST; b++) mbar_init(&full[b], 1), mbar_init(&empty[b], 1);
        fence_proxy_async_smem();
    }
    __syncthreads();
    float acc[C::NACC], tot[C::NACC];
    const int rw = (w & 3) * 16 + g;
    if (producer) {
        if (lane == 0)
            for (int t = 0; t < nkt; t++) {
                const int b = t % ST;
                if (t >= ST) mbar_wait(&empty[b], (unsigned)(t / ST - 1) & 1);
                __nv_bfloat16 *xs = sm + b * C::STAGE, *ws = xs + BM * SK_K;
                mbar_expect_tx(&full[b], (unsigned)C::STAGE * 2);
                tma_g2s_2d(xs, &xmap, kbeg + t * SK_K, m0, &full[b]);
                tma_g2s_2d(ws, &wmap, kbeg + t * SK_K, n0, &full[b]);
            }
    } else {
        int t = 0, j = 0;
        for (int k0 = kbeg; k0 < kend; j++) {
            int k1 = (k0 / kchunk + 1) * kchunk;
            if (k1 > kend) k1 = kend;
            const int tn = (k1 - k0 + SK_K - 1) / SK_K;
#pragma unroll
            for (int i = 0; i < C::NACC; i++) acc[i] = 0.0f;
            for (int u = 0; u < tn; u++, t++) {
                mbar_wait(&full[t % ST], (unsigned)(t / ST) & 1);
                const __nv_bfloat16 *xs = sm + (t % ST) * C::STAGE, *ws = xs + BM * SK_K;
                wg_fence();
#pragma unroll
                for (int q = 0; q < SK_K / 16; q++) wg_mma<BN>(acc, wg_desc(xs + q * 16), wg_desc(ws + q * 16), 1);
                wg_commit();
                wg_wait<1>();
                if (t > 0 && tid == 0) mbar_arrive(&empty[(t - 1) % ST]);
            }
            wg_wait<0>();
            if (r == 0) {
#pragma unroll
                for (int i = 0; i < C::NACC; i++) tot[i] = j == 0 ? acc[i] : tot[i] + acc[i];
            } else {
                wg_put_partial<C::NACC, PLD>(parts + (size_t)j * BM * PLD, acc, rw, tq);
            }
            k0 = k1;
        }
        if (r == 0 && nkt > 0) wg_put_partial<C::NACC, PLD>(parts, tot, rw, tq);
    }
    cooperative_groups::cluster_group cl = cooperative_groups::this_cluster();
    cl.sync();
    /* block r's share of the tile: block 0's fold, then the later slices in order */
    const int rows = M - m0 < BM ? M - m0 : BM, cols = N - n0 < BN ? N - n0 : BN;
    const int tot_el = rows * cols, per = (tot_el + R - 1) / R, i1 = (r + 1) * per < tot_el ? (r + 1) * per : tot_el;
    for (int i = r * per + tid; i < i1; i += (int)blockDim.x) {
        const int rr = i / cols, cc = i - rr * cols, off = rr * PLD + cc;
        float tv[16]; /* every term's load in flight at once (1 + S - G <= 16: S <= 16, sk_plan) */
        tv[0] = *cl.map_shared_rank(parts + off, 0u);
#pragma unroll
        for (int e = 1; e < 16; e++) {
            const int q = G + e - 1;
            tv[e] = q < S ? *cl.map_shared_rank(parts + (size_t)(q % G) * BM * PLD + off, (unsigned)(q / G)) : 0.0f;
        }
        float v = tv[0];
#pragma unroll
        for (int e = 1; e < 16; e++)
            if (G + e - 1 < S) v += tv[e];
        lin_store(v, bias, n0 + cc, y + (size_t)(m0 + rr) * ldy + n0 + cc, accumulate);
    }
    cl.sync();
#endif
}

/* k_gemm_wgr's launch: the cluster size R as large as keeps the grid within one block per SM
 * (at most 8 and S), G = ceil(S / R) slices a block (at most GMAX). */
template <int ST, int GMAX>
static hyla_status wgr_form(hyla_cuda_ctx *c, const __nv_bfloat16 *xb, int M, int K, hyla_weight *W, int N, int kchunk,
                            int S, const float *bias, float *y, int ldy, int accumulate, int *done) {
    typedef WgrCfg<ST, GMAX> C;
    *done = 0;
    const int nt = (N + C::BN - 1) / C::BN, mt = (M + C::BM - 1) / C::BM;
    int R = c->sm_count / (nt * mt);
    if (R > 8) R = 8;
    if (R > S) R = S;
    if (R < 1) R = 1;
    const int G = (S + R - 1) / R;
    R = (S + G - 1) / G;
    if (G > GMAX) return HYLA_OK;
    CUtensorMap wm, xm;
    if (!wg_map(&wm, W->d, N, K, C::BN) || !wg_map(&xm, xb, M, K, C::BM)) return HYLA_OK;
    static int attr[16];
    if (!attr[c->device & 15]) {
        CU_TRY(cudaFuncSetAttribute(k_gemm_wgr<ST, GMAX>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)C::SMEM));
        attr[c->device & 15] = 1;
    }
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    cfg.gridDim = dim3((unsigned)R, (unsigned)nt, (unsigned)mt);
    cfg.blockDim = dim3(160);
    cfg.dynamicSmemBytes = C::SMEM;
    cfg.stream = c->stream;
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = (unsigned)R;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    CU_TRY(cudaLaunchKernelEx(&cfg, k_gemm_wgr<ST, GMAX>, xm, wm, M, K, N, kchunk, S, G, bias, y, ldy, accumulate));
    CU_LAUNCH_CHECK("linear (runs of slices)");
    *done = 1;
    return HYLA_OK;
}
#define WGR(name, ST, GMAX) {name, 1, 0, wgr_form<ST, GMAX>}

/* 64 columns a block (m64n64 products): the product's forms up to 64 rows (gemm_wg) */
#define WG64(name, ST, CL, PW) {name, 1, CL, launch_wg<1, 64, ST, CL, !(PW), PW>}


struct Form {
    const char *name;
    int wgm; /* warpgroups along M: the rows a block covers are 64 wgm */
    int cl;  /* one slice per block, summed across a cluster (needs S > 1) */
    hyla_status (*launch)(hyla_cuda_ctx *, const __nv_bfloat16 *, int, int, hyla_weight *, int, int, int, const float *,
                          float *, int, int, int *);
};

#define FORM(name, WGM, BN, ST, CL, OV) {name, WGM, CL, launch_wg<WGM, BN, ST, CL, OV>}

/* k_gemm_ps (at most 64 rows) through the forms' signature: its partials in a scratch buffer,
 * its counts the context's (zero between launches) */
template <int BN, int ST>
static hyla_status ps_form(hyla_cuda_ctx *c, const __nv_bfloat16 *xb, int M, int K, hyla_weight *W, int N, int kchunk,
                           int S, const float *bias, float *y, int ldy, int accumulate, int *done) {
    void *part;
    *done = 0;
    if (M > 64) return HYLA_OK;
    HYLA_TRY(cu_scratch(c, SCR_BENCH, (size_t)S * M * N * 4 + 4, &part));
    return launch_ps<BN, ST>(c, xb, M, K, W, N, kchunk, S, bias, y, ldy, accumulate, (float *)part, c->sk_count, done);
}
#define PS(name, BN, ST) {name, 1, 0, ps_form<BN, ST>}
/* k_gemm_wgp (the producer-warp form, hyla_cuda_gemm_wg.cuh) */
#define WGP(name, WGM, BN, ST, CL) {name, WGM, CL, launch_wg<WGM, BN, ST, CL, false, true>}
static const Form forms[] = {
    FORM("whole K, 2 wg x 128, 4 st, in flight (product)", 2, 128, 4, false, true),
    FORM("slices, 2 wg x 128, 3 st, in flight (product)", 2, 128, 3, true, true),
    FORM("whole K, 2 wg x 128, 4 st, waited", 2, 128, 4, false, false),
    FORM("slices, 2 wg x 128, 3 st, waited", 2, 128, 3, true, false),
    FORM("whole K, 2 wg x 128, 5 st, in flight", 2, 128, 5, false, true),
    FORM("slices, 2 wg x 128, 4 st, in flight", 2, 128, 4, true, true),
    FORM("slices, 2 wg x 256, 3 st, in flight", 2, 256, 3, true, true),
    FORM("whole K, 1 wg x 128, 4 st, in flight", 1, 128, 4, false, true),
    FORM("slices, 1 wg x 128, 3 st, in flight", 1, 128, 3, true, true),
    FORM("slices, 1 wg x 128, 5 st, in flight", 1, 128, 5, true, true),
    FORM("slices, 1 wg x 256, 3 st, in flight", 1, 256, 3, true, true),
    WGP("producer warp, whole K, 2 wg x 128, 4 st", 2, 128, 4, false),
    WGP("producer warp, whole K, 2 wg x 128, 6 st", 2, 128, 6, false),
    WGP("producer warp, slices, 2 wg x 128, 3 st", 2, 128, 3, true),
    WGP("producer warp, slices, 2 wg x 128, 5 st", 2, 128, 5, true),
    WGP("producer warp, whole K, 1 wg x 128, 6 st", 1, 128, 6, false),
    WGP("producer warp, slices, 1 wg x 128, 4 st", 1, 128, 4, true),
    WG64("slices, 1 wg x 64, 2 st, in flight", 2, true, false),
    WG64("slices, 1 wg x 64, 3 st, in flight", 3, true, false),
    WG64("slices, 1 wg x 64, 4 st, in flight", 4, true, false),
    WG64("producer warp, slices, 1 wg x 64, 3 st", 3, true, true),
    WG64("whole K, 1 wg x 64, 4 st, in flight", 4, false, false),
    WG64("producer warp, whole K, 1 wg x 64, 6 st", 6, false, true),
    WG64("producer warp, whole K, 1 wg x 64, 8 st", 8, false, true),
    WG64("producer warp, whole K, 1 wg x 64, 10 st", 10, false, true),
    WG64("producer warp, whole K, 1 wg x 64, 12 st", 12, false, true),
    WGP("producer warp, whole K, 1 wg x 48, 8 st", 1, 48, 8, false),
    WGP("producer warp, whole K, 1 wg x 48, 12 st", 1, 48, 12, false),
    WGP("producer warp, whole K, 1 wg x 32, 8 st", 1, 32, 8, false),
    WGP("producer warp, whole K, 1 wg x 32, 12 st", 1, 32, 12, false),
    WGP("producer warp, slices, 1 wg x 32, 3 st", 1, 32, 3, true),
    WGP("producer warp, slices, 1 wg x 48, 3 st", 1, 48, 3, true),
    WGR("runs of slices, 1 wg x 128, 4 st", 4, 2),
    WGR("runs of slices, 1 wg x 128, 6 st", 6, 2),
    WGR("runs of slices, 1 wg x 128, 3 st, up to 4", 3, 4),
    PS("streamed units, 64 cols, 4 st", 64, 4),
    PS("streamed units, 64 cols, 6 st", 64, 6),
    PS("streamed units, 64 cols, 8 st", 64, 8),
    PS("streamed units, 32 cols, 6 st", 32, 6),
    PS("streamed units, 32 cols, 10 st", 32, 10),
};

int main(int argc, char **argv) {
    lab_args(argc, argv, "usage: [FORMS=SUBSTRING] gemm_wg_forms [M...]   (default M = 64 128 256). Exit 1 when a form's output differs from the product's bits, 77 off Hopper.");
    int Ms[8] = {64, 128, 256}, nm = 3;
    if (argc > 1) {
        nm = 0;
        for (int i = 1; i < argc && nm < 8; i++) Ms[nm++] = atoi(argv[i]);
    }
    if (!hyla_cuda_available()) {
        printf("gemm_wg_forms: no usable CUDA device\n");
        return 77;
    }
    /* the reference: the product's linear with the warpgroup form off */
    setenv("HYLA_CUDA_GEMM_WG", "0", 1);
    hyla_backend *gpu;
    HK(hyla_cuda_backend_create(0, &gpu));
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)gpu->ctx;
    cudaDeviceProp pr;
    CK(cudaGetDeviceProperties(&pr, c->device));
    if (pr.major != 9) {
        printf("gemm_wg_forms: needs a Hopper GPU (sm_90), found %s\n", pr.name);
        hyla_backend_destroy(gpu);
        return 77;
    }
    /* K, N: the 1.68B GDN model's decode linears, a tensor-parallel rank's halves, the LM head */
    const int shapes[][2] = {{2304, 6144}, {6144, 2304}, {2304, 2304}, {2304, 4608}, {2304, 3072},
                             {3072, 2304}, {2304, 1152}, {4608, 2304}, {2304, 32000}};
    const int iters = 100;
    int bad = 0;
    uint64_t seed = 20261127;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int K = shapes[si][0], N = shapes[si][1];
        int S, kchunk;
        sk_plan(c, N, K, &S, &kchunk);
        float *Wf = (float *)malloc((size_t)N * K * 4);
        for (size_t i = 0; i < (size_t)N * K; i++) Wf[i] = (2 * frand(&seed) - 1) / sqrtf((float)K);
        /* copies of the weight, cycled through by the timing loops, that together exceed the L2
         * cache twice: every call streams its weight from memory, as in a decode step */
        const size_t wbytes = (size_t)N * K * 2;
        const int R = (int)((2 * (size_t)pr.l2CacheSize + wbytes - 1) / wbytes) + 1 < 64
                          ? (int)((2 * (size_t)pr.l2CacheSize + wbytes - 1) / wbytes) + 1
                          : 64;
        hyla_weight *Wr[64];
        for (int r = 0; r < R; r++) HK(gpu->ops->weight_create(gpu->ctx, Wf, HYLA_DT_F32, N, K, &Wr[r]));
        hyla_weight *Wg = Wr[0];
        free(Wf);
        for (int mi = 0; mi < nm; mi++) {
            const int M = Ms[mi];
            float *x = (float *)malloc((size_t)M * K * 4);
            for (size_t i = 0; i < (size_t)M * K; i++) x[i] = 2 * frand(&seed) - 1;
            float *dx, *dyp, *dyf;
            __nv_bfloat16 *dxb;
            CK(cudaMalloc(&dx, (size_t)M * K * 4));
            CK(cudaMalloc(&dxb, (size_t)M * K * 2));
            CK(cudaMalloc(&dyp, (size_t)M * N * 4));
            CK(cudaMalloc(&dyf, (size_t)M * N * 4));
            CK(cudaMemcpy(dx, x, (size_t)M * K * 4, cudaMemcpyHostToDevice));
            cudaStream_t st = c->stream;
            cudaEvent_t e0, e1;
            CK(cudaEventCreate(&e0));
            CK(cudaEventCreate(&e1));
            /* the product's path (x converted inside) */
            HK(gpu->ops->linear(gpu->ctx, dx, K, M, K, Wg, NULL, dyp, N, N, 0));
            HK(gpu->ops->sync(gpu->ctx));
            /* by the host's clock: the backend may hold ops back (CUDA graphs) until its sync, so
             * events on its stream would not bracket them */
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            for (int i = 0; i < iters; i++)
                HK(gpu->ops->linear(gpu->ctx, dx, K, M, K, Wr[i % R], NULL, dyp, N, N, 0));
            HK(gpu->ops->sync(gpu->ctx));
            clock_gettime(CLOCK_MONOTONIC, &t1);
            float ms;
            const double tp = ((t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9) / iters,
                         fl = 2.0 * M * (double)N * K;
            printf("M=%d K=%d N=%d S=%d: mma.sync path %.2f us (%.0f TFLOP/s, %.2f TB/s of weights)\n", M, K, N, S,
                   tp * 1e6, fl / tp * 1e-12, wbytes / tp * 1e-12);
            float *yp = (float *)malloc((size_t)M * N * 4), *yf = (float *)malloc((size_t)M * N * 4);
            CK(cudaMemcpy(yp, dyp, (size_t)M * N * 4, cudaMemcpyDeviceToHost));
            for (size_t fi = 0; fi < sizeof forms / sizeof forms[0]; fi++) {
                const Form *f = &forms[fi];
                if (f->cl && S == 1) continue;
                if (getenv("FORMS") && !strstr(f->name, getenv("FORMS"))) continue;
                HK(cu_f32_to_bf16_rows(c, dx, K, M, K, dxb));
                CK(cudaMemsetAsync(dyf, 0xff, (size_t)M * N * 4, st));
                int done = 0;
                HK(f->launch(c, dxb, M, K, Wg, N, kchunk, S, NULL, dyf, N, 0, &done));
                if (!done) {
                    printf("  %-48s no tensor maps: not run\n", f->name);
                    continue;
                }
                CK(cudaStreamSynchronize(st));
                CK(cudaMemcpy(yf, dyf, (size_t)M * N * 4, cudaMemcpyDeviceToHost));
                const int same = !memcmp(yf, yp, (size_t)M * N * 4);
                CK(cudaEventRecord(e0, st));
                for (int i = 0; i < iters; i++) {
                    HK(cu_f32_to_bf16_rows(c, dx, K, M, K, dxb));
                    HK(f->launch(c, dxb, M, K, Wr[i % R], N, kchunk, S, NULL, dyf, N, 0, &done));
                }
                CK(cudaEventRecord(e1, st));
                CK(cudaEventSynchronize(e1));
                CK(cudaEventElapsedTime(&ms, e0, e1));
                const double tf = ms * 1e-3 / iters;
                printf("  %-48s %.2f us (%.0f TFLOP/s, %.2f TB/s) %s\n", f->name, tf * 1e6, fl / tf * 1e-12,
                       wbytes / tf * 1e-12, same ? "bits = product" : "BITS DIFFER");
                bad |= !same;
            }
            CK(cudaEventDestroy(e0));
            CK(cudaEventDestroy(e1));
            free(x);
            free(yp);
            free(yf);
            CK(cudaFree(dx));
            CK(cudaFree(dxb));
            CK(cudaFree(dyp));
            CK(cudaFree(dyf));
        }
        for (int r = 0; r < R; r++) gpu->ops->weight_destroy(gpu->ctx, Wr[r]);
    }
    hyla_backend_destroy(gpu);
    printf("gemm_wg_forms: %s\n", bad ? "FAILED" : "ok");
    return bad;
}
