/* core_gemm_overlap.cu — does a prompt GEMM on a second stream fill the SMs that the GDN core
 * leaves idle during a prefill piece?
 *
 * A GDN layer's fused prefill pass (gdn_prefill, k_gdn_pipe) runs H x dv / 64 blocks at one
 * per SM: 72 of an H100's 132 SMs for the 1.68B model (18 heads, dv = 256), for ~0.7 ms of an
 * 8192-token piece. The output gate's projection (x [8192][2304] -> [8192][4608], a cuBLAS GEMM
 * at a fixed row count) does not feed the core, only the norm after it, so it could run beside
 * the core. This program times, for one 8192-token piece of that shape: the core alone, the
 * GEMM alone, both one after the other, and both at once on two streams (each through its own
 * backend context: its own stream, cuBLAS handle and scratch) in both launch orders and with
 * the GEMM's stream at low priority. The product's arithmetic is unchanged by where a kernel
 * runs, so this is a question of time only.
 *
 * usage: core_gemm_overlap [rows]   (default 8192). Exit 77 without a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_cuda_impl.h"
#include "hyla_ops.h"
#include "lab.h"

static float *dev_uniform(size_t n, float lo, float hi, uint64_t *seed) {
    float *h = (float *)malloc(n * 4), *d;
    for (size_t i = 0; i < n; i++) h[i] = lo + (hi - lo) * frand(seed);
    CK(cudaMalloc(&d, n * 4));
    CK(cudaMemcpy(d, h, n * 4, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

int main(int argc, char **argv) {
    lab_args(argc, argv, "usage: core_gemm_overlap [rows]   (default 8192). Exit 77 without a GPU.");
    const int R = argc > 1 ? atoi(argv[1]) : 8192, H = 18, dk = 128, dv = 256, D = 2304, N = H * dv;
    if (!hyla_cuda_available()) {
        printf("core_gemm_overlap: no usable CUDA device\n");
        return 77;
    }
    setenv("HYLA_CUDA_GRAPHS", "0", 1); /* every op launched when called, on its context's stream */
    hyla_backend *A, *B;
    HK(hyla_cuda_backend_create(0, &A));
    HK(hyla_cuda_backend_create(0, &B));
    hyla_cuda_ctx *ca = (hyla_cuda_ctx *)A->ctx, *cb = (hyla_cuda_ctx *)B->ctx;
    uint64_t seed = 20261127;
    float *q = dev_uniform((size_t)R * H * dk, -0.1f, 0.1f, &seed), *k = dev_uniform((size_t)R * H * dk, -0.1f, 0.1f, &seed);
    float *v = dev_uniform((size_t)R * H * dv, -1.0f, 1.0f, &seed), *g = dev_uniform((size_t)R * H, -0.2f, -0.01f, &seed);
    float *beta = dev_uniform((size_t)R * H, 0.2f, 0.8f, &seed), *S = dev_uniform((size_t)H * dk * dv, 0.0f, 0.0f, &seed);
    float *o, *x = dev_uniform((size_t)R * D, -1.0f, 1.0f, &seed), *y;
    CK(cudaMalloc(&o, (size_t)R * H * dv * 4));
    CK(cudaMalloc(&y, (size_t)R * N * 4));
    float *wf = (float *)malloc((size_t)N * D * 4);
    for (size_t i = 0; i < (size_t)N * D; i++) wf[i] = (2 * frand(&seed) - 1) / sqrtf((float)D);
    hyla_weight *W;
    HK(B->ops->weight_create(B->ctx, wf, HYLA_DT_F32, N, D, &W));
    free(wf);
    const float scale = 1.0f / sqrtf((float)dk);
    auto core = [&]() { HK(A->ops->gdn_prefill(A->ctx, q, k, v, g, beta, R, H, dk, dv, scale, S, o)); };
    auto gemm = [&]() {
        hyla_linear_out lo = {W, NULL, y, N, N};
        HK(B->ops->linear_multi(B->ctx, x, D, R, D, 1, &lo, 0, HYLA_LINEAR_PREFILL));
    };
    cudaStream_t sa = ca->stream, sb0 = cb->stream, slow;
    int plo, phi;
    CK(cudaDeviceGetStreamPriorityRange(&plo, &phi));
    CK(cudaStreamCreateWithPriority(&slow, cudaStreamNonBlocking, plo));
    cudaEvent_t e0, e1, fa, fb;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventCreate(&fa));
    CK(cudaEventCreate(&fb));
    /* warm-up: plans, scratch, the kernels' attributes */
    for (int i = 0; i < 3; i++) core(), gemm();
    CK(cudaDeviceSynchronize());
    const int iters = 20;
    /* mode: 0 core alone, 1 GEMM alone, 2 core then GEMM (one after the other), 3 both at once
     * (core first), 4 both at once (GEMM first), 5 both at once, core first, the GEMM's stream at
     * low priority */
    const char *names[6] = {"core alone", "GEMM alone", "core, then GEMM", "both at once (core launched first)",
                            "both at once (GEMM launched first)", "both at once, GEMM at low priority"};
    for (int round = 0; round < 2; round++)
        for (int mode = 0; mode < 6; mode++) {
            cb->stream = mode == 5 ? slow : sb0;
            float ms;
            CK(cudaEventRecord(e0, sa));
            for (int i = 0; i < iters; i++) {
                /* each iteration starts after both streams' work of the one before */
                CK(cudaEventRecord(fa, sa));
                CK(cudaStreamWaitEvent(cb->stream, fa, 0));
                if (mode == 0) core();
                if (mode == 1) gemm();
                if (mode == 2) {
                    core();
                    CK(cudaEventRecord(fa, sa));
                    CK(cudaStreamWaitEvent(cb->stream, fa, 0));
                    gemm();
                }
                if (mode == 3 || mode == 5) core(), gemm();
                if (mode == 4) gemm(), core();
                CK(cudaEventRecord(fb, cb->stream));
                CK(cudaStreamWaitEvent(sa, fb, 0));
            }
            CK(cudaEventRecord(e1, sa));
            CK(cudaEventSynchronize(e1));
            CK(cudaEventElapsedTime(&ms, e0, e1));
            printf("rows %d: %-40s %.3f ms\n", R, names[mode], ms / iters);
        }
    cb->stream = sb0;
    CK(cudaDeviceSynchronize());
    B->ops->weight_destroy(B->ctx, W);
    hyla_backend_destroy(A);
    hyla_backend_destroy(B);
    printf("core_gemm_overlap: ok\n");
    return 0;
}
