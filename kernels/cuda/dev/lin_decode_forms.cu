/* lin_decode_forms.cu — the kernel lab's GLA / GDN decode forms: k_lin_dec with 2 or 4 value
 * columns per lane and register caps of 1, 2 or 3 blocks per SM, against the CPU reference and
 * against the product's decode (the backend's ops: k_lin_dec<.., 2, 2>), bit for bit, and timed.
 * The kernel is the product's own template (hyla_cuda_lin_dec.cuh); the forms are its other
 * instances. The product keeps the fastest (kernels/cuda/dev/NOTES.md "Decode forms").
 * usage: lin_decode_forms [B...]   (default B = 1 16 64; H = 16, dk = dv = 128)
 * Exit status 1 when a form is out of tolerance of the CPU or differs from the product's bits. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_cuda_impl.h"
#include "hyla_cuda_lin_dec.cuh"
#include "hyla_ops.h"
#include "lab.h"

struct Form {
    const char *name;
    void (*launch)(const hyla_cu_linrec &a, int B, cudaStream_t st);
};
template <int VW, int MINB>
static void launch_form(const hyla_cu_linrec &a, int B, cudaStream_t st) {
    dim3 g((a.dv + 32 * VW - 1) / (32 * VW), a.H, B);
    k_lin_dec<16, VW, MINB><<<g, 256, 0, st>>>(a); /* dk <= 128 */
}
static const Form forms[] = {
    {"d2 (product: 2 columns, 2 blocks/SM)", launch_form<2, 2>},
    {"d2c (2 columns, 3 blocks/SM)", launch_form<2, 3>},
    {"d4 (4 columns, 1 block/SM)", launch_form<4, 1>},
    {"d4b (4 columns, 2 blocks/SM)", launch_form<4, 2>},
};

int main(int argc, char **argv) {
    lab_args(argc, argv, "usage: lin_decode_forms [B...]   (default B = 1 16 64; H = 16, dk = dv = 128). Exit 77 without a GPU.");
    int Bs[8] = {1, 16, 64}, nb = 3;
    if (argc > 1) {
        nb = 0;
        for (int i = 1; i < argc && nb < 8; i++) Bs[nb++] = atoi(argv[i]);
    }
    if (!hyla_cuda_available()) {
        printf("lin_decode_forms: no usable CUDA device\n");
        return 77;
    }
    hyla_backend *cpu, *gpu;
    HK(hyla_cpu_backend_create(0, &cpu));
    HK(hyla_cuda_backend_create(0, &gpu));
    const int H = 16, dk = 128, dv = 128;
    const float scale = 1.0f / sqrtf((float)dk);
    int bad = 0;
    uint64_t seed = 20261126;
    for (int gdn = 0; gdn < 2; gdn++)
        for (int bi = 0; bi < nb; bi++) {
            const int B = Bs[bi];
            const size_t nqk = (size_t)B * H * dk, nv = (size_t)B * H * dv, ns = (size_t)H * dk * dv;
            const size_t ng = gdn ? (size_t)B * H : nqk;
            float *q = (float *)malloc(nqk * 4), *k = (float *)malloc(nqk * 4), *v = (float *)malloc(nv * 4);
            float *g = (float *)malloc(ng * 4), *be = (float *)malloc((size_t)B * H * 4);
            float *S0 = (float *)malloc(ns * B * 4), *Sc = (float *)malloc(ns * B * 4), *oc = (float *)malloc(nv * 4);
            for (size_t i = 0; i < nqk; i++) q[i] = 2 * frand(&seed) - 1, k[i] = 2 * frand(&seed) - 1;
            for (size_t i = 0; i < nv; i++) v[i] = 2 * frand(&seed) - 1;
            for (size_t i = 0; i < ng; i++) g[i] = -0.5f * frand(&seed);
            for (int i = 0; i < B * H; i++) be[i] = 0.05f + 0.9f * frand(&seed);
            for (size_t i = 0; i < ns * B; i++) S0[i] = 0.6f * frand(&seed) - 0.3f;
            if (gdn) /* GDN reads l2-normalised q, k */
                for (size_t r = 0; r < (size_t)B * H; r++) {
                    double sq = 0, sk = 0;
                    for (int i = 0; i < dk; i++) sq += q[r * dk + i] * q[r * dk + i], sk += k[r * dk + i] * k[r * dk + i];
                    for (int i = 0; i < dk; i++) q[r * dk + i] /= (float)sqrt(sq), k[r * dk + i] /= (float)sqrt(sk);
                }
            /* the CPU reference */
            memcpy(Sc, S0, ns * B * 4);
            float **Scp = (float **)malloc((size_t)B * sizeof(float *));
            for (int b = 0; b < B; b++) Scp[b] = Sc + (size_t)b * ns;
            if (gdn)
                HK(cpu->ops->gdn_decode(cpu->ctx, q, k, v, g, be, B, H, dk, dv, scale, Scp, oc));
            else
                HK(cpu->ops->gla_decode(cpu->ctx, q, k, v, g, B, H, dk, dv, scale, Scp, oc));
            /* device inputs */
            float *dq, *dk_, *dv_, *dg, *dbe, *dS, *dS0, *dop, *dSp;
            CK(cudaMalloc(&dq, nqk * 4));
            CK(cudaMalloc(&dk_, nqk * 4));
            CK(cudaMalloc(&dv_, nv * 4));
            CK(cudaMalloc(&dg, ng * 4));
            CK(cudaMalloc(&dbe, (size_t)B * H * 4));
            CK(cudaMalloc(&dS, ns * B * 4));
            CK(cudaMalloc(&dSp, ns * B * 4));
            CK(cudaMalloc(&dS0, ns * B * 4));
            CK(cudaMalloc(&dop, nv * 4));
            CK(cudaMemcpy(dq, q, nqk * 4, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(dk_, k, nqk * 4, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(dv_, v, nv * 4, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(dg, g, ng * 4, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(dbe, be, (size_t)B * H * 4, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(dS0, S0, ns * B * 4, cudaMemcpyHostToDevice));
            /* the product's decode through the backend */
            CK(cudaMemcpy(dSp, dS0, ns * B * 4, cudaMemcpyDeviceToDevice));
            float **Sp = (float **)malloc((size_t)B * sizeof(float *));
            for (int b = 0; b < B; b++) Sp[b] = dSp + (size_t)b * ns;
            if (gdn)
                HK(gpu->ops->gdn_decode(gpu->ctx, dq, dk_, dv_, dg, dbe, B, H, dk, dv, scale, Sp, dop));
            else
                HK(gpu->ops->gla_decode(gpu->ctx, dq, dk_, dv_, dg, B, H, dk, dv, scale, Sp, dop));
            HK(gpu->ops->sync(gpu->ctx));
            float *op_h = (float *)malloc(nv * 4), *Sp_h = (float *)malloc(ns * B * 4);
            CK(cudaMemcpy(op_h, dop, nv * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(Sp_h, dSp, ns * B * 4, cudaMemcpyDeviceToHost));
            /* the forms */
            float **Sd = (float **)malloc((size_t)B * sizeof(float *)), **dSd;
            for (int b = 0; b < B; b++) Sd[b] = dS + (size_t)b * ns;
            CK(cudaMalloc(&dSd, (size_t)B * sizeof(float *)));
            CK(cudaMemcpy(dSd, Sd, (size_t)B * sizeof(float *), cudaMemcpyHostToDevice));
            float *dof;
            CK(cudaMalloc(&dof, nv * 4));
            hyla_cu_linrec a;
            memset(&a, 0, sizeof a);
            a.gdn = gdn, a.H = H, a.dk = dk, a.dv = dv, a.ntok = 1, a.states16 = 1, a.scale = scale;
            a.q1 = dq, a.k1 = dk_, a.ga = dg, a.betaa = gdn ? dbe : NULL, a.v = dv_, a.o = dof, a.S0 = dSd;
            float *of = (float *)malloc(nv * 4), *Sf = (float *)malloc(ns * B * 4);
            cudaEvent_t e0, e1;
            CK(cudaEventCreate(&e0));
            CK(cudaEventCreate(&e1));
            for (size_t f = 0; f < sizeof forms / sizeof forms[0]; f++) {
                CK(cudaMemcpy(dS, dS0, ns * B * 4, cudaMemcpyDeviceToDevice));
                forms[f].launch(a, B, 0);
                CK(cudaGetLastError());
                CK(cudaDeviceSynchronize());
                CK(cudaMemcpy(of, dof, nv * 4, cudaMemcpyDeviceToHost));
                CK(cudaMemcpy(Sf, dS, ns * B * 4, cudaMemcpyDeviceToHost));
                double num = 0, den = 0;
                for (size_t i = 0; i < nv; i++) num += (double)(of[i] - oc[i]) * (of[i] - oc[i]), den += (double)oc[i] * oc[i];
                for (size_t i = 0; i < ns * B; i++) num += (double)(Sf[i] - Sc[i]) * (Sf[i] - Sc[i]), den += (double)Sc[i] * Sc[i];
                const double rel = sqrt(num / (den > 0 ? den : 1));
                const int same = !memcmp(of, op_h, nv * 4) && !memcmp(Sf, Sp_h, ns * B * 4);
                /* timing: 50 steps (the state keeps evolving; the work per step is the same) */
                CK(cudaEventRecord(e0));
                for (int it = 0; it < 50; it++) forms[f].launch(a, B, 0);
                CK(cudaEventRecord(e1));
                CK(cudaEventSynchronize(e1));
                float ms = 0;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                ms /= 50;
                const double gbs = 2.0 * ns * B * 4 / (ms * 1e-3) / 1e9;
                const int ok = rel <= 1e-4 && same;
                bad |= !ok;
                printf("%s B=%-3d %-38s %8.4f ms  %7.1f GB/s of state  rel %.1e vs CPU  %s product bits  %s\n",
                       gdn ? "gdn" : "gla", B, forms[f].name, ms, gbs, rel, same ? "==" : "!=", ok ? "ok" : "FAIL");
            }
            CK(cudaEventDestroy(e0));
            CK(cudaEventDestroy(e1));
            cudaFree(dq), cudaFree(dk_), cudaFree(dv_), cudaFree(dg), cudaFree(dbe), cudaFree(dS), cudaFree(dSp);
            cudaFree(dS0), cudaFree(dop), cudaFree(dof), cudaFree(dSd);
            free(q), free(k), free(v), free(g), free(be), free(S0), free(Sc), free(oc), free(Scp), free(Sp), free(Sd);
            free(op_h), free(Sp_h), free(of), free(Sf);
        }
    hyla_backend_destroy(gpu);
    hyla_backend_destroy(cpu);
    return bad;
}
