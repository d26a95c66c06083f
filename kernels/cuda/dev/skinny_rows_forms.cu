/* skinny_rows_forms.cu — the kernel lab's forms of the batch-invariant skinny linear for 16-64
 * rows (decode batches), against the product's ops->linear (x converted to bf16, k_skinny2c with
 * its slices summed across a cluster), bit for bit, and timed.
 *
 * Every form does each output's arithmetic of the product: the same K slices (S and the slice
 * length from N, K and the SM count, sk_plan), within a slice the same m16n8k16 products over
 * the same 16-wide k steps from a zero accumulator, the slices added in slice order across the
 * cluster of the tile's S blocks, then lin_store. What the forms change is only who computes
 * which outputs: a block's columns (BN = WN x NTW x 8, 64 in the product) and the warps' shape
 * (WM x WN warps, each MT*16/WM rows x NTW*8 columns), and the stages of the W / x ring (ST).
 * More columns per block read each x tile fewer times (x is as many bytes as W at 64 rows);
 * more rows per warp read each W fragment for more products.
 *
 * usage: skinny_rows_forms [M...]   (default M = 16 32 64; shapes of the 1.68B GDN model)
 * Exit status 1 when a form's output differs from the product's bits. */
#include <cooperative_groups.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hyla_cuda_impl.h"
#include "hyla_cuda_mma.cuh"
#include "hyla_ops.h"
#include "lab.h"

#define LK 64  /* k per stage */
#define LLD 72 /* bf16 row stride of the staged tiles */

template <int MT, int WM, int WN, int NTW, int ST>
struct FormCfg {
    static constexpr int BN = WN * NTW * 8, NTH = 32 * WM * WN, MTW = MT / WM, PLD = BN + 8;
    static constexpr int WBYTES = ST * BN * LLD * 2, XBYTES = ST * MT * 16 * LLD * 2;
    static constexpr int SMEM = WBYTES + XBYTES;
    static_assert(MT % WM == 0, "warp rows");
    static_assert(NTW % 2 == 0, "B fragments come in pairs of n8 tiles");
    static_assert(MT * 16 * PLD * 4 <= WBYTES, "the partial tile fits the W staging");
};

/* y[M][N] = xb[M][K] W[N][K]^T, M <= MT*16 (one block along M); grid (ceil(N/BN), S), clusters
 * (1, S, 1): block s of a column tile computes slice s. */
template <int MT, int WM, int WN, int NTW, int ST>
__global__ void __launch_bounds__(FormCfg<MT, WM, WN, NTW, ST>::NTH)
    k_form(const __nv_bfloat16 *__restrict__ xb, int M, int K, const __nv_bfloat16 *__restrict__ W, int N, int kchunk,
           int S, float *__restrict__ y) {
    typedef FormCfg<MT, WM, WN, NTW, ST> C;
    extern __shared__ __align__(16) unsigned char smem[];
    __nv_bfloat16 *Ws = (__nv_bfloat16 *)smem, *Xs = (__nv_bfloat16 *)(smem + C::WBYTES);
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, tq = lane & 3;
    const int wm = w / WN, wn = w % WN;
    const int n0 = blockIdx.x * C::BN, s = blockIdx.y;
    const int kbeg = s * kchunk, kend = kbeg + kchunk < K ? kbeg + kchunk : K;
    const int nk = (kend - kbeg + LK - 1) / LK;
    float acc[C::MTW][NTW][4];
    frag_zero(acc);
    auto stage_w = [&](int buf, int kt) {
        for (int c = tid; c < C::BN * 8; c += C::NTH) {
            int r = c >> 3, kk = (c & 7) * 8, n = n0 + r, k = kt + kk;
            bool ok = n < N && k < kend;
            cp_async16(Ws + (size_t)buf * C::BN * LLD + r * LLD + kk, ok ? (const void *)(W + (size_t)n * K + k) : (const void *)W,
                       ok ? 16 : 0);
        }
    };
    auto stage_x = [&](int buf, int kt) {
        for (int c = tid; c < MT * 16 * 8; c += C::NTH) {
            int r = c >> 3, kk = (c & 7) * 8, k = kt + kk;
            bool ok = r < M && k < kend;
            cp_async16(Xs + (size_t)buf * MT * 16 * LLD + r * LLD + kk, ok ? (const void *)(xb + (size_t)r * K + k) : (const void *)xb,
                       ok ? 16 : 0);
        }
    };
    for (int p = 0; p < ST - 1; p++) {
        if (p < nk) {
            stage_w(p, kbeg + p * LK);
            stage_x(p, kbeg + p * LK);
        }
        cp_async_commit();
    }
    for (int it = 0; it < nk; it++) {
        const int nx = it + ST - 1;
        if (nx < nk) {
            stage_w(nx % ST, kbeg + nx * LK);
            stage_x(nx % ST, kbeg + nx * LK);
        }
        cp_async_commit();
        cp_async_wait<ST - 1>();
        __syncthreads();
        const __nv_bfloat16 *ws = Ws + (size_t)(it % ST) * C::BN * LLD, *xs = Xs + (size_t)(it % ST) * MT * 16 * LLD;
#pragma unroll
        for (int kc = 0; kc < LK / 16; kc++) {
            uint32_t bf[NTW][2];
#pragma unroll
            for (int np = 0; np < NTW / 2; np++)
                ldsm_frag_b2_nk(*(uint32_t(*)[2][2]) & bf[2 * np], ws + (wn * NTW * 8 + np * 16) * LLD + kc * 16, LLD);
#pragma unroll
            for (int mt = 0; mt < C::MTW; mt++) {
                uint32_t af[4];
                ldsm_frag_a(af, xs + ((wm * C::MTW + mt) * 16) * LLD + kc * 16, LLD);
#pragma unroll
                for (int nt = 0; nt < NTW; nt++) mma_bf16_16816(acc[mt][nt], af, bf[nt]);
            }
        }
        __syncthreads();
    }
    cp_async_wait<0>();
    __syncthreads();
    float *P = (float *)smem;
#pragma unroll
    for (int mt = 0; mt < C::MTW; mt++)
#pragma unroll
        for (int nt = 0; nt < NTW; nt++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                *(float2 *)&P[((wm * C::MTW + mt) * 16 + g + h * 8) * C::PLD + wn * NTW * 8 + nt * 8 + 2 * tq] =
                    make_float2(acc[mt][nt][2 * h], acc[mt][nt][2 * h + 1]);
    cooperative_groups::cluster_group cl = cooperative_groups::this_cluster();
    cl.sync();
    const int rows = M < MT * 16 ? M : MT * 16, cols = N - n0 < C::BN ? N - n0 : C::BN;
    const int tot = rows * cols, per = (tot + S - 1) / S, i1 = (s + 1) * per < tot ? (s + 1) * per : tot;
    for (int i = s * per + tid; i < i1; i += C::NTH) {
        const int r = i / cols, cc = i - r * cols, off = r * C::PLD + cc;
        float t[16];
#pragma unroll
        for (int q = 0; q < 16; q++) t[q] = q < S ? *cl.map_shared_rank(P + off, (unsigned)q) : 0.0f;
        float v = t[0];
#pragma unroll
        for (int q = 1; q < 16; q++)
            if (q < S) v += t[q];
        lin_store(v, NULL, n0 + cc, y + (size_t)r * N + n0 + cc, 0);
    }
    cl.sync();
}

struct Form {
    const char *name;
    int BN, mt_max; /* rows it takes: up to mt_max*16 */
    void (*launch)(const __nv_bfloat16 *xb, int M, int K, const __nv_bfloat16 *W, int N, int kchunk, int S, float *y,
                   cudaStream_t st);
};

template <int MT, int WM, int WN, int NTW, int ST>
static void launch_form(const __nv_bfloat16 *xb, int M, int K, const __nv_bfloat16 *W, int N, int kchunk, int S,
                        float *y, cudaStream_t st) {
    typedef FormCfg<MT, WM, WN, NTW, ST> C;
    static bool ready = false;
    if (!ready) {
        CK(cudaFuncSetAttribute(k_form<MT, WM, WN, NTW, ST>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM));
        CK(cudaFuncSetAttribute(k_form<MT, WM, WN, NTW, ST>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
        ready = true;
    }
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    cfg.gridDim = dim3((N + C::BN - 1) / C::BN, S);
    cfg.blockDim = dim3(C::NTH);
    cfg.dynamicSmemBytes = C::SMEM;
    cfg.stream = st;
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = 1;
    at[0].val.clusterDim.y = (unsigned)S;
    at[0].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    CK(cudaLaunchKernelEx(&cfg, k_form<MT, WM, WN, NTW, ST>, xb, M, K, W, N, kchunk, S, y));
}

static const Form forms[] = {
    /* the product's layout (64 columns, 4 warps side by side, two stages), rows 17-64 */
    {"p64 (64 cols, 1x4 warps, 2 stages)", 64, 4, launch_form<4, 1, 4, 2, 2>},
    {"s3 (64 cols, 1x4 warps, 3 stages)", 64, 4, launch_form<4, 1, 4, 2, 3>},
    {"w22 (64 cols, 2x2 warps of 32x32)", 64, 4, launch_form<4, 2, 2, 4, 2>},
    {"c128 (128 cols, 1x8 warps)", 128, 4, launch_form<4, 1, 8, 2, 2>},
    {"c128b (128 cols, 2x4 warps of 32x32)", 128, 4, launch_form<4, 2, 4, 4, 2>},
    {"c128c (128 cols, 4x2 warps of 16x64)", 128, 4, launch_form<4, 4, 2, 8, 2>},
    {"c256 (256 cols, 2x4 warps of 32x64)", 256, 4, launch_form<4, 2, 4, 8, 2>},
    {"c128-16 (128 cols, 1x8 warps, 16 rows)", 128, 1, launch_form<1, 1, 8, 2, 2>},
    {"c256-16 (256 cols, 1x8 warps of 16x32, 16 rows)", 256, 1, launch_form<1, 1, 8, 4, 2>},
};

/* sk_plan of the product (hyla_cuda_gemm.cu): S and the slice length from N, K, the SM count */
static void plan(int sms, int N, int K, int *S_out, int *kchunk_out) {
    int ntiles = (N + 63) / 64, ktiles = (K + 63) / 64;
    int S = (4 * sms + ntiles - 1) / ntiles;
    if (S > 16) S = 16;
    if (S > ktiles) S = ktiles;
    if (S < 1) S = 1;
    int kchunk = (ktiles + S - 1) / S * 64;
    *S_out = (K + kchunk - 1) / kchunk;
    *kchunk_out = kchunk;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

int main(int argc, char **argv) {
    lab_args(argc, argv, "usage: skinny_rows_forms [M...]   (default M = 16 32 64; shapes of the 1.68B GDN model). Exit 1 when a form's output differs from the product's bits, 77 without a GPU.");
    int Ms[8] = {16, 32, 64}, nm = 3;
    if (argc > 1) {
        nm = 0;
        for (int i = 1; i < argc && nm < 8; i++) Ms[nm++] = atoi(argv[i]);
    }
    if (!hyla_cuda_available()) {
        printf("skinny_rows_forms: no usable CUDA device\n");
        return 77;
    }
    hyla_backend *gpu;
    HK(hyla_cuda_backend_create(0, &gpu));
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)gpu->ctx;
    const int shapes[][2] = {{2304, 2304}, {2304, 4608}, {2304, 6144}, {4608, 2304}, {6144, 2304}}; /* K, N */
    const int iters = 200;
    int bad = 0;
    uint64_t seed = 20261127;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int K = shapes[si][0], N = shapes[si][1];
        int S, kchunk;
        plan(c->sm_count, N, K, &S, &kchunk);
        float *Wf = (float *)malloc((size_t)N * K * 4);
        for (size_t i = 0; i < (size_t)N * K; i++) Wf[i] = (2 * frand(&seed) - 1) / sqrtf((float)K);
        hyla_weight *Wg;
        HK(gpu->ops->weight_create(gpu->ctx, Wf, HYLA_DT_F32, N, K, &Wg));
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
            /* the product */
            HK(gpu->ops->linear(gpu->ctx, dx, K, M, K, Wg, NULL, dyp, N, N, 0));
            HK(gpu->ops->sync(gpu->ctx));
            double t0 = now_s();
            for (int i = 0; i < iters; i++) HK(gpu->ops->linear(gpu->ctx, dx, K, M, K, Wg, NULL, dyp, N, N, 0));
            HK(gpu->ops->sync(gpu->ctx));
            const double tp = (now_s() - t0) / iters;
            const double wbytes = (double)N * K * 2;
            printf("M=%d K=%d N=%d S=%d: product %.2f us (%.2f TB/s of W)\n", M, K, N, S, tp * 1e6, wbytes / tp * 1e-12);
            float *yp = (float *)malloc((size_t)M * N * 4), *yf = (float *)malloc((size_t)M * N * 4);
            CK(cudaMemcpy(yp, dyp, (size_t)M * N * 4, cudaMemcpyDeviceToHost));
            for (size_t fi = 0; fi < sizeof forms / sizeof forms[0]; fi++) {
                const Form *f = &forms[fi];
                if (M > f->mt_max * 16 || (f->mt_max == 4 && M <= 32)) continue;
                cudaStream_t st = c->stream;
                HK(cu_f32_to_bf16_rows(c, dx, K, M, K, dxb));
                CK(cudaMemsetAsync(dyf, 0xff, (size_t)M * N * 4, st));
                f->launch(dxb, M, K, Wg->d, N, kchunk, S, dyf, st);
                CK(cudaStreamSynchronize(st));
                CK(cudaMemcpy(yf, dyf, (size_t)M * N * 4, cudaMemcpyDeviceToHost));
                const int same = !memcmp(yf, yp, (size_t)M * N * 4);
                cudaEvent_t e0, e1;
                CK(cudaEventCreate(&e0));
                CK(cudaEventCreate(&e1));
                CK(cudaEventRecord(e0, st));
                for (int i = 0; i < iters; i++) {
                    HK(cu_f32_to_bf16_rows(c, dx, K, M, K, dxb));
                    f->launch(dxb, M, K, Wg->d, N, kchunk, S, dyf, st);
                }
                CK(cudaEventRecord(e1, st));
                CK(cudaEventSynchronize(e1));
                float ms;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                const double tf = ms * 1e-3 / iters;
                printf("  %-48s %.2f us (%.2f TB/s of W) %s\n", f->name, tf * 1e6, wbytes / tf * 1e-12,
                       same ? "bits = product" : "BITS DIFFER");
                bad |= !same;
                CK(cudaEventDestroy(e0));
                CK(cudaEventDestroy(e1));
            }
            free(x);
            free(yp);
            free(yf);
            CK(cudaFree(dx));
            CK(cudaFree(dxb));
            CK(cudaFree(dyp));
            CK(cudaFree(dyf));
        }
        gpu->ops->weight_destroy(gpu->ctx, Wg);
    }
    hyla_backend_destroy(gpu);
    printf("skinny_rows_forms: %s\n", bad ? "FAILED" : "ok");
    return bad;
}
