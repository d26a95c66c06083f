/* conv_prefill_forms.cu — the kernel lab's fused form of a GDN prefill piece's convolutions:
 * q, k, v through their short convolutions with silu and q, k through the per-head L2 norm in one
 * launch, out of place (a warp per L rows and 128 channels, lane = 4 channels), against the
 * product's ops (short_conv in place for each tensor, then l2norm_rows for q and k): the same
 * bits, and timed. The product keeps the separate ops, which were faster in the model
 * (kernels/cuda/dev/NOTES.md "Prefill elementwise fusions").
 * usage: conv_prefill_forms [n]   (default n = 1024 rows; q, k 18 heads of 128, v 4608, K = 4)
 * Exit status 1 when a form differs from the product's bits. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hyla_cuda_impl.h"
#include "hyla_cuda_rowmath.cuh"
#include "hyla_ops.h"
#include "lab.h"

#define CONV_KMAX 4

/* ---- the form (its args: up to three tensors, groups of G channels each) ---- */
struct conv_pf_args {
    const float *x[3];
    float *y[3];
    const float *w[3];
    float *tail[3];
    int C[3], G[3], l2[3];
    int gbase[3 + 1]; /* first group of each tensor; gbase[m]: all groups */
    int n, m;
    float eps;
};

__device__ __forceinline__ float f4c(float4 v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

template <int K, int L>
__global__ void __launch_bounds__(128) k_conv_prefill(conv_pf_args a) {
    const int lane = threadIdx.x & 31, gi = blockIdx.y * 4 + (threadIdx.x >> 5);
    if (gi >= a.gbase[a.m]) return; /* whole warps only: the reduction below is warp-wide */
    int ti = 0;
    while (ti + 1 < a.m && gi >= a.gbase[ti + 1]) ti++;
    const int C = a.C[ti], G = a.G[ti], l2 = a.l2[ti];
    const int ch = (gi - a.gbase[ti]) * G + 4 * lane;
    const bool act = 4 * lane < G;
    const int t0 = blockIdx.x * L, len = a.n - t0 < L ? a.n - t0 : L;
    const float *x = a.x[ti];
    float *y = a.y[ti], *tail = a.tail[ti];
    float wc[4][K], win[4][K];
    float4 in[L];
    if (act) {
#pragma unroll
        for (int q = 0; q < 4; q++)
#pragma unroll
            for (int j = 0; j < K; j++) wc[q][j] = a.w[ti][(size_t)(ch + q) * K + j];
#pragma unroll
        for (int j = 0; j < K - 1; j++) {
            const int r = t0 - (K - 1) + j;
            const float4 v = r >= 0 ? *(const float4 *)(x + (size_t)r * C + ch)
                                    : *(const float4 *)(tail + (size_t)(K - 1 + r) * C + ch);
#pragma unroll
            for (int q = 0; q < 4; q++) win[q][j] = f4c(v, q);
        }
#pragma unroll
        for (int i = 0; i < L; i++)
            if (i < len) in[i] = *(const float4 *)(x + (size_t)(t0 + i) * C + ch);
        if (K > 1 && blockIdx.x == 0) { /* the new tail: x's last K-1 rows (the old tail's where n < K-1) */
#pragma unroll
            for (int r = 0; r < K - 1; r++) {
                const int src = a.n - (K - 1) + r;
                float4 v;
                if (src >= 0) {
                    v = *(const float4 *)(x + (size_t)src * C + ch);
                } else {
                    float e[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
                    for (int j = 0; j < K - 1; j++)
                        if (j == r + a.n)
#pragma unroll
                            for (int q = 0; q < 4; q++) e[q] = win[q][j];
                    v = make_float4(e[0], e[1], e[2], e[3]);
                }
                *(float4 *)(tail + (size_t)r * C + ch) = v;
            }
        }
    }
#pragma unroll
    for (int i = 0; i < L; i++) {
        if (i >= len) break; /* uniform over the warp */
        float o[4] = {0.f, 0.f, 0.f, 0.f};
        if (act) {
#pragma unroll
            for (int q = 0; q < 4; q++) {
                win[q][K - 1] = f4c(in[i], q);
                float acc = 0.0f;
#pragma unroll
                for (int j = 0; j < K; j++) acc = fmaf(wc[q][j], win[q][j], acc);
                o[q] = silu_f(acc);
#pragma unroll
                for (int j = 0; j < K - 1; j++) win[q][j] = win[q][j + 1];
            }
        }
        float4 v = make_float4(o[0], o[1], o[2], o[3]);
        if (l2) {
            float ss = act ? sq_acc<1>(0.0f, v) : 0.0f;
            ss = warp_sum(ss);
            const float inv = l2_inv_f(ss, a.eps);
            v = make_float4(v.x * inv, v.y * inv, v.z * inv, v.w * inv);
        }
        if (act) *(float4 *)(y + (size_t)(t0 + i) * C + ch) = v;
    }
}


template <int L> static void launch(const conv_pf_args &a, cudaStream_t st) {
    dim3 grid((unsigned)((a.n + L - 1) / L), (unsigned)((a.gbase[a.m] + 3) / 4));
    k_conv_prefill<4, L><<<grid, 128, 0, st>>>(a);
}
struct Form {
    const char *name;
    void (*launch)(const conv_pf_args &a, cudaStream_t st);
};
static const Form forms[] = {{"fused, 4 rows a warp", launch<4>}, {"fused, 8 rows a warp", launch<8>},
                             {"fused, 16 rows a warp", launch<16>}};

int main(int argc, char **argv) {
    lab_args(argc, argv, "usage: conv_prefill_forms [n]   (default n = 1024 rows; q, k 18 heads of 128, v 4608, K = 4). Exit 77 without a GPU.");
    const int n = argc > 1 ? atoi(argv[1]) : 1024, K = 4, dk = 128, C[3] = {2304, 2304, 4608};
    if (!hyla_cuda_available()) {
        printf("conv_prefill_forms: no usable CUDA device\n");
        return 77;
    }
    hyla_backend *gpu;
    HK(hyla_cuda_backend_create(0, &gpu));
    uint64_t seed = 20261126;
    float *x[3], *y[3], *w[3], *t0[3], *tp[3], *tf[3], *ref[3];
    for (int j = 0; j < 3; j++) {
        const size_t nx = (size_t)n * C[j], nt = (size_t)(K - 1) * C[j], nw = (size_t)C[j] * K;
        float *h = (float *)malloc(nx * 4), *ht = (float *)malloc(nt * 4), *hw = (float *)malloc(nw * 4);
        for (size_t i = 0; i < nx; i++) h[i] = 2 * frand(&seed) - 1;
        for (size_t i = 0; i < nt; i++) ht[i] = 2 * frand(&seed) - 1;
        for (size_t i = 0; i < nw; i++) hw[i] = frand(&seed) - 0.5f;
        CK(cudaMalloc(&x[j], nx * 4));
        CK(cudaMalloc(&y[j], nx * 4));
        CK(cudaMalloc(&ref[j], nx * 4));
        CK(cudaMalloc(&w[j], nw * 4));
        CK(cudaMalloc(&t0[j], nt * 4));
        CK(cudaMalloc(&tp[j], nt * 4));
        CK(cudaMalloc(&tf[j], nt * 4));
        CK(cudaMemcpy(x[j], h, nx * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(w[j], hw, nw * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(t0[j], ht, nt * 4, cudaMemcpyHostToDevice));
        free(h), free(ht), free(hw);
    }
    /* the product: copy, short_conv in place, l2norm_rows (q, k) */
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    auto product = [&](float *const *out, float *const *tails) {
        for (int j = 0; j < 3; j++) {
            float *tl = tails[j];
            HK(gpu->ops->short_conv(gpu->ctx, out[j], 1, n, C[j], w[j], NULL, K, &tl, 1));
            if (j < 2) HK(gpu->ops->l2norm_rows(gpu->ctx, out[j], n * C[j] / dk, dk, 1e-6f));
        }
    };
    for (int j = 0; j < 3; j++) {
        CK(cudaMemcpy(ref[j], x[j], (size_t)n * C[j] * 4, cudaMemcpyDeviceToDevice));
        CK(cudaMemcpy(tp[j], t0[j], (size_t)(K - 1) * C[j] * 4, cudaMemcpyDeviceToDevice));
    }
    product(ref, tp);
    for (int j = 0; j < 3; j++) {
        CK(cudaMemcpy(y[j], x[j], (size_t)n * C[j] * 4, cudaMemcpyDeviceToDevice));
        CK(cudaMemcpy(tf[j], t0[j], (size_t)(K - 1) * C[j] * 4, cudaMemcpyDeviceToDevice));
    }
    HK(gpu->ops->sync(gpu->ctx));
    /* the backend's ops run on its own stream (and may be logged for a graph until a flush):
     * timed by the host clock between two syncs */
    struct timespec ts0, ts1;
    clock_gettime(CLOCK_MONOTONIC, &ts0);
    for (int it = 0; it < 50; it++) product(y, tf); /* timing only: in place on scratch */
    HK(gpu->ops->sync(gpu->ctx));
    clock_gettime(CLOCK_MONOTONIC, &ts1);
    float ms = (float)((ts1.tv_sec - ts0.tv_sec) * 1e3 + (ts1.tv_nsec - ts0.tv_nsec) / 1e6);
    double mb = 0;
    for (int j = 0; j < 3; j++) mb += 2.0 * n * C[j] * 4 / 1e6;
    printf("{\"form\":\"product (short_conv x3, l2norm_rows x2)\",\"n\":%d,\"us\":%.2f,\"gbps\":%.0f}\n", n, ms * 20,
           mb / (ms / 50));
    int bad = 0;
    for (size_t f = 0; f < sizeof forms / sizeof forms[0]; f++) {
        conv_pf_args a;
        memset(&a, 0, sizeof a);
        for (int j = 0; j < 3; j++) {
            CK(cudaMemcpy(tf[j], t0[j], (size_t)(K - 1) * C[j] * 4, cudaMemcpyDeviceToDevice));
            a.x[j] = x[j], a.y[j] = y[j], a.w[j] = w[j], a.tail[j] = tf[j];
            a.C[j] = C[j], a.G[j] = 128, a.l2[j] = j < 2 ? dk : 0;
            a.gbase[j + 1] = a.gbase[j] + C[j] / 128;
        }
        a.n = n, a.m = 3, a.eps = 1e-6f;
        forms[f].launch(a, 0);
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        int same = 1;
        for (int j = 0; j < 3; j++) {
            const size_t nx = (size_t)n * C[j], nt = (size_t)(K - 1) * C[j];
            float *hy = (float *)malloc(nx * 4), *hr = (float *)malloc(nx * 4), *ht = (float *)malloc(nt * 4),
                  *hp = (float *)malloc(nt * 4);
            CK(cudaMemcpy(hy, y[j], nx * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(hr, ref[j], nx * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(ht, tf[j], nt * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(hp, tp[j], nt * 4, cudaMemcpyDeviceToHost));
            same &= !memcmp(hy, hr, nx * 4) && !memcmp(ht, hp, nt * 4);
            free(hy), free(hr), free(ht), free(hp);
        }
        CK(cudaEventRecord(e0, 0));
        for (int it = 0; it < 50; it++) forms[f].launch(a, 0);
        CK(cudaEventRecord(e1, 0));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms, e0, e1));
        printf("{\"form\":\"%s\",\"n\":%d,\"us\":%.2f,\"gbps\":%.0f,\"same_bits\":%s}\n", forms[f].name, n, ms * 20,
               mb / (ms / 50), same ? "true" : "false");
        bad |= !same;
    }
    return bad;
}
