/* attn_flash_forms.cu — the kernel lab's flash-attention prefill forms: k_attn_flash (4 warps per
 * 64 queries, plain loads into one buffer), the product's kernel k_attn_flash2 with 8 warps (128
 * queries a block sharing each K/V tile) and with 4 (the product's form), each against the CPU
 * reference, the 4-warp form also against the product's attn_prefill (with k_attn_flash2, not
 * Hopper's k_attn_wg) bit for bit, and timed.
 * k_attn_flash2, its tile step and its block end are the product's own code
 * (hyla_cuda_attn_flash.cuh); this file adds only the form that left the product. One pass over
 * the keys (no key splits), causal, GQA. The product keeps the 4-warp cp.async form
 * (kernels/cuda/dev/NOTES.md). usage: attn_flash_forms [n]   (default n = 1024 and 4096)
 * Exit status 1 when a form is out of tolerance or the product form's bits differ. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_cuda_attn_flash.cuh"
#include "hyla_cuda_extra.h"
#include "hyla_cuda_impl.h"
#include "hyla_ops.h"
#include "lab.h"

/* k_attn_flash: the first flash form. One block of 4 warps per (64 queries, head[, key split]);
 * each key tile is loaded by plain 16-byte loads into one buffer (rows past khi zero-filled,
 * so fa_tile runs without VCUT) between two barriers, so loads and products do not overlap.
 * The flash2 block keeps its key ranges and its tile sequence per 64-query half, so both run
 * the same fa_tile steps on the same operands. */
template <int D>
__global__ void __launch_bounds__(128) k_attn_flash(const float *q, int n, int Hq, int Hk, int pos0, int window,
                                                    float scale, void *const *kp, void *const *vp, int pt, float *o,
                                                    int split_len, int nsplit, float *part) {
    constexpr int LD = D + 8;
    extern __shared__ __align__(16) unsigned char fa_smem[];
    __nv_bfloat16 *Qs = (__nv_bfloat16 *)fa_smem; /* [64][LD] */
    __nv_bfloat16 *Ks = Qs + FA_BQ * LD;          /* [64][LD] */
    __nv_bfloat16 *Vs = Ks + FA_BK * LD;          /* [64][LD] */
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2;
    const int qb = blockIdx.x, h = blockIdx.y, hk = h / (Hq / Hk);
    const int q0 = qb * FA_BQ; /* first query (call-relative) */
    const int nq = n - q0 < FA_BQ ? n - q0 : FA_BQ;
    for (int x = tid; x < FA_BQ * D; x += 128) {
        int r = x / D, d = x % D;
        float v = r < nq ? q[((size_t)(q0 + r) * Hq + h) * D + d] : 0.0f;
        Qs[r * LD + d] = __float2bfloat16_rn(v);
    }
    __syncthreads();
    uint32_t qf[D / 16][4];
#pragma unroll
    for (int kc = 0; kc < D / 16; kc++) ldsm_frag_a(qf[kc], Qs + (16 * w) * LD + kc * 16, LD);

    const int qp_lo = pos0 + q0, qp_hi = pos0 + q0 + nq - 1;
    int klo = window > 0 ? qp_lo - window + 1 : 0;
    if (klo < 0) klo = 0;
    int khi = qp_hi;
    const int split = blockIdx.z;
    if (split_len) { /* this block's keys: the split's part of [klo, khi] */
        if (split * split_len > klo) klo = split * split_len;
        if ((split + 1) * split_len - 1 < khi) khi = (split + 1) * split_len - 1;
    }
    /* this thread's two query rows */
    const int r0 = 16 * w + g, r1 = r0 + 8;
    const int p0 = pos0 + q0 + r0, p1 = pos0 + q0 + r1;
    float m0, m1, l0, l1, oacc[D / 8][4];
    fa_begin<D>(m0, m1, l0, l1, oacc);
    const size_t rowsz = (size_t)Hk * D;
    const float sl2 = scale * 1.4426950408889634f; /* exp(x) = exp2(x log2 e) */
    for (int kt = klo; kt <= khi; kt += FA_BK) {
        __syncthreads(); /* previous tile fully consumed */
        for (int x = tid; x < FA_BK * (D / 8); x += 128) {
            int r = x / (D / 8), c8 = x % (D / 8);
            int p = kt + r;
            uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
            if (p <= khi) {
                size_t off = (size_t)(p % pt) * rowsz + (size_t)hk * D + c8 * 8;
                kv = *(const uint4 *)((const __nv_bfloat16 *)kp[p / pt] + off);
                vv = *(const uint4 *)((const __nv_bfloat16 *)vp[p / pt] + off);
            }
            *(uint4 *)(Ks + r * LD + c8 * 8) = kv;
            *(uint4 *)(Vs + r * LD + c8 * 8) = vv;
        }
        __syncthreads();
        fa_tile<D, false>(qf, Ks, Vs, kt, khi, p0, p1, window, sl2, m0, m1, l0, l1, oacc);
    }
    fa_finish<D>(oacc, m0, m1, l0, l1, q0, nq, r0, r1, p0, p1, h, Hq, window, split, split_len, nsplit, part, o);
}

struct Args {
    const float *q;
    int n, Hq, Hk, pos0, window;
    float scale;
    void *const *kp, *const *vp;
    int pt;
    float *o;
};

template <int D>
static void run_form(int form, const Args &a) {
    if (form == 0) {
        const size_t sm = (size_t)(FA_BQ + 2 * FA_BK) * (D + 8) * 2;
        CK(cudaFuncSetAttribute(k_attn_flash<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
        k_attn_flash<D><<<dim3(cu_blocks(a.n, FA_BQ), a.Hq, 1), 128, sm>>>(a.q, a.n, a.Hq, a.Hk, a.pos0, a.window,
                                                                          a.scale, a.kp, a.vp, a.pt, a.o, 0, 1, NULL);
    } else {
        const size_t sm = (size_t)4 * FA_BK * (D + 8) * 2;
        if (form == 1) {
            CK(cudaFuncSetAttribute(k_attn_flash2<D, 8>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
            k_attn_flash2<D, 8><<<dim3(cu_blocks(a.n, 128), a.Hq, 1), 256, sm>>>(
                a.q, a.n, a.Hq, a.Hk, a.pos0, a.window, a.scale, a.kp, a.vp, a.pt, a.o, 0, 1, NULL);
        } else {
            CK(cudaFuncSetAttribute(k_attn_flash2<D, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
            k_attn_flash2<D, 4><<<dim3(cu_blocks(a.n, 64), a.Hq, 1), 128, sm>>>(
                a.q, a.n, a.Hq, a.Hk, a.pos0, a.window, a.scale, a.kp, a.vp, a.pt, a.o, 0, 1, NULL);
        }
    }
    CK(cudaGetLastError());
}

int main(int argc, char **argv) {
    lab_args(argc, argv, "usage: attn_flash_forms [n]   (default n = 1024 and 4096). Exit 77 without a GPU.");
    int ns[2] = {1024, 4096}, nn = 2;
    if (argc > 1) ns[0] = atoi(argv[1]), nn = 1;
    if (!hyla_cuda_available()) {
        printf("attn_flash_forms: no usable CUDA device\n");
        return 77;
    }
    hyla_backend *cpu, *gpu;
    HK(hyla_cpu_backend_create(0, &cpu));
    HK(hyla_cuda_backend_create(0, &gpu));
    HK(hyla_cuda_set_attn_wg(gpu, 0)); /* the product's k_attn_flash2 (on Hopper k_attn_wg is the default) */
    const char *names[3] = {"flash1 (4 warps, one buffer)", "flash2, 8 warps", "flash2, 4 warps (product)"};
    const int Hq = 8, Hk = 4, D = 128, pt = 64;
    const float scale = 1.0f / sqrtf((float)D);
    int bad = 0;
    uint64_t seed = 20261126;
    for (int ni = 0; ni < nn; ni++) {
        const int n = ns[ni], np = (n + pt - 1) / pt;
        const size_t nq = (size_t)n * Hq * D, nk = (size_t)n * Hk * D, page = (size_t)pt * Hk * D;
        float *q = (float *)malloc(nq * 4), *k = (float *)malloc(nk * 4), *v = (float *)malloc(nk * 4);
        for (size_t i = 0; i < nq; i++) q[i] = 2 * frand(&seed) - 1;
        for (size_t i = 0; i < nk; i++) k[i] = 2 * frand(&seed) - 1, v[i] = 2 * frand(&seed) - 1;
        /* the CPU reference (its own pages) */
        void **kc = (void **)malloc(np * sizeof(void *)), **vc = (void **)malloc(np * sizeof(void *));
        void **kg = (void **)malloc(np * sizeof(void *)), **vg = (void **)malloc(np * sizeof(void *));
        for (int p = 0; p < np; p++) {
            HK(cpu->ops->alloc(cpu->ctx, page * 4, &kc[p]));
            HK(cpu->ops->alloc(cpu->ctx, page * 4, &vc[p]));
            HK(gpu->ops->alloc(gpu->ctx, page * 2, &kg[p]));
            HK(gpu->ops->alloc(gpu->ctx, page * 2, &vg[p]));
        }
        float *oc = (float *)malloc(nq * 4);
        hyla_kv_view vwc = {kc, vc, np, pt}, vwg = {kg, vg, np, pt};
        HK(cpu->ops->attn_prefill(cpu->ctx, q, k, v, n, Hq, Hk, D, 0, &vwc, 0, scale, oc));
        /* the product (writes the bf16 pages the forms then read) */
        float *dq, *dk_, *dv_, *dop, *dof;
        CK(cudaMalloc(&dq, nq * 4));
        CK(cudaMalloc(&dk_, nk * 4));
        CK(cudaMalloc(&dv_, nk * 4));
        CK(cudaMalloc(&dop, nq * 4));
        CK(cudaMalloc(&dof, nq * 4));
        CK(cudaMemcpy(dq, q, nq * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dk_, k, nk * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dv_, v, nk * 4, cudaMemcpyHostToDevice));
        HK(gpu->ops->attn_prefill(gpu->ctx, dq, dk_, dv_, n, Hq, Hk, D, 0, &vwg, 0, scale, dop));
        HK(gpu->ops->sync(gpu->ctx));
        float *op_h = (float *)malloc(nq * 4), *of = (float *)malloc(nq * 4);
        CK(cudaMemcpy(op_h, dop, nq * 4, cudaMemcpyDeviceToHost));
        void **tab;
        CK(cudaMalloc(&tab, 2 * np * sizeof(void *)));
        CK(cudaMemcpy(tab, kg, np * sizeof(void *), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(tab + np, vg, np * sizeof(void *), cudaMemcpyHostToDevice));
        Args a = {dq, n, Hq, Hk, 0, 0, scale, tab, tab + np, pt, dof};
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        for (int f = 0; f < 3; f++) {
            CK(cudaMemset(dof, 0, nq * 4));
            run_form<D>(f, a);
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(of, dof, nq * 4, cudaMemcpyDeviceToHost));
            double num = 0, den = 0;
            for (size_t i = 0; i < nq; i++) num += (double)(of[i] - oc[i]) * (of[i] - oc[i]), den += (double)oc[i] * oc[i];
            const double rel = sqrt(num / (den > 0 ? den : 1));
            const int same = !memcmp(of, op_h, nq * 4);
            CK(cudaEventRecord(e0));
            for (int it = 0; it < 10; it++) run_form<D>(f, a);
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float ms = 0;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            ms /= 10;
            const double tflops = 2.0 * 2.0 * Hq * D * ((double)n * (n + 1) / 2) / (ms * 1e-3) / 1e12;
            const int ok = rel <= 2e-2 && (f != 2 || same);
            bad |= !ok;
            printf("attn prefill n=%-5d D=%d %-30s %8.4f ms  %6.1f TFLOP/s  rel %.1e vs CPU  %s product bits  %s\n", n, D,
                   names[f], ms, tflops, rel, same ? "==" : "!=", ok ? "ok" : "FAIL");
        }
        CK(cudaEventDestroy(e0));
        CK(cudaEventDestroy(e1));
        for (int p = 0; p < np; p++) {
            cpu->ops->free(cpu->ctx, kc[p]);
            cpu->ops->free(cpu->ctx, vc[p]);
            gpu->ops->free(gpu->ctx, kg[p]);
            gpu->ops->free(gpu->ctx, vg[p]);
        }
        cudaFree(dq), cudaFree(dk_), cudaFree(dv_), cudaFree(dop), cudaFree(dof), cudaFree(tab);
        free(q), free(k), free(v), free(oc), free(op_h), free(of), free(kc), free(vc), free(kg), free(vg);
    }
    hyla_backend_destroy(gpu);
    hyla_backend_destroy(cpu);
    return bad;
}
