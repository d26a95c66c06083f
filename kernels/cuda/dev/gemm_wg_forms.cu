/* gemm_wg_forms.cu — the kernel lab's forms of the warpgroup linear (k_gemm_wg, from the
 * product's template in hyla_cuda_gemm_wg.cuh) at decode rows, against the product's mma.sync
 * path, bit for bit, and timed.
 *
 * The product picks two forms by the output's size (whole K per block; one K slice per block
 * with the slices summed across a cluster), both with two warpgroups of 64 rows, 128 columns,
 * and a tile's products in flight. This program runs those and the other instances of the same
 * template — one or two warpgroups (64 or 128 rows a block), 128 or 256 columns, 3 to 5 stages,
 * products waited for at every tile or kept in flight — on the 1.68B GDN model's shapes and a
 * tensor-parallel rank's halves, so the next change to the product's choice is a measured one.
 * Every form must give the bits of the product's path with the warpgroup form off
 * (HYLA_CUDA_GEMM_WG=0: the skinny kernel / k_gemm_big, which every row alone shares).
 *
 * usage: gemm_wg_forms [M...]   (default M = 64 128 256)
 * Exit status 1 when a form's output differs from the product's bits, 77 off Hopper. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hyla_cuda_gemm_wg.cuh"
#include "hyla_ops.h"
#include "lab.h"

struct Form {
    const char *name;
    int wgm; /* warpgroups along M: the rows a block covers are 64 wgm */
    int cl;  /* one slice per block, summed across a cluster (needs S > 1) */
    hyla_status (*launch)(hyla_cuda_ctx *, const __nv_bfloat16 *, int, int, hyla_weight *, int, int, int, const float *,
                          float *, int, int, int *);
};

#define FORM(name, WGM, BN, ST, CL, OV) {name, WGM, CL, launch_wg<WGM, BN, ST, CL, OV>}
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
};

int main(int argc, char **argv) {
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
    /* K, N: the 1.68B GDN model's decode linears, then a tensor-parallel rank's halves */
    const int shapes[][2] = {{2304, 6144}, {6144, 2304}, {2304, 2304}, {2304, 4608},
                             {2304, 3072}, {3072, 2304}, {2304, 1152}, {4608, 2304}};
    const int iters = 100;
    int bad = 0;
    uint64_t seed = 20261127;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int K = shapes[si][0], N = shapes[si][1];
        int S, kchunk;
        sk_plan(c, N, K, &S, &kchunk);
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
            cudaStream_t st = c->stream;
            cudaEvent_t e0, e1;
            CK(cudaEventCreate(&e0));
            CK(cudaEventCreate(&e1));
            /* the product's path (x converted inside) */
            HK(gpu->ops->linear(gpu->ctx, dx, K, M, K, Wg, NULL, dyp, N, N, 0));
            HK(gpu->ops->sync(gpu->ctx));
            CK(cudaEventRecord(e0, st));
            for (int i = 0; i < iters; i++) HK(gpu->ops->linear(gpu->ctx, dx, K, M, K, Wg, NULL, dyp, N, N, 0));
            CK(cudaEventRecord(e1, st));
            HK(gpu->ops->sync(gpu->ctx));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            const double tp = ms * 1e-3 / iters, fl = 2.0 * M * (double)N * K;
            printf("M=%d K=%d N=%d S=%d: mma.sync path %.2f us (%.0f TFLOP/s)\n", M, K, N, S, tp * 1e6, fl / tp * 1e-12);
            float *yp = (float *)malloc((size_t)M * N * 4), *yf = (float *)malloc((size_t)M * N * 4);
            CK(cudaMemcpy(yp, dyp, (size_t)M * N * 4, cudaMemcpyDeviceToHost));
            for (size_t fi = 0; fi < sizeof forms / sizeof forms[0]; fi++) {
                const Form *f = &forms[fi];
                if (f->cl && S == 1) continue;
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
                    HK(f->launch(c, dxb, M, K, Wg, N, kchunk, S, NULL, dyf, N, 0, &done));
                }
                CK(cudaEventRecord(e1, st));
                CK(cudaEventSynchronize(e1));
                CK(cudaEventElapsedTime(&ms, e0, e1));
                const double tf = ms * 1e-3 / iters;
                printf("  %-48s %.2f us (%.0f TFLOP/s) %s\n", f->name, tf * 1e6, fl / tf * 1e-12,
                       same ? "bits = product" : "BITS DIFFER");
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
        gpu->ops->weight_destroy(gpu->ctx, Wg);
    }
    hyla_backend_destroy(gpu);
    printf("gemm_wg_forms: %s\n", bad ? "FAILED" : "ok");
    return bad;
}
