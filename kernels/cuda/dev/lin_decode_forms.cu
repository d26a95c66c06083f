/* lin_decode_forms.cu — the kernel lab's GLA / GDN decode forms: k_lin_dec with 2 or 4 value
 * columns per lane and register caps of 1, 2 or 3 blocks per SM, against the CPU reference and
 * against the product's decode (the backend's ops: k_lin_dec<.., 2, 2>), bit for bit, and timed.
 * The product keeps the fastest (kernels/cuda/dev/NOTES.md "Decode forms").
 * usage: lin_decode_forms [B...]   (default B = 1 16 64; H = 16, dk = dv = 128)
 * Exit status 1 when a form is out of tolerance of the CPU or differs from the product's bits. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_cuda_impl.h"
#include "hyla_ops.h"

/* Decode form of the recurrence (ntok == 1, every batched decode step): VW value columns per
 * lane (16- or 8-byte state loads), one block per (session, head, 32 * VW columns). Unlike the
 * token-loop kernels it stages the token's q, k (times the route weight) and GLA's e^gk for the
 * block's head in shared memory while the state loads are in flight, so the update loop reads
 * them from shared memory instead of waiting on a global load per key row. The arithmetic is
 * k_lin_rec4's, expression by expression, so both give the same bits (tested). */
template <int VW> struct DecVec;
template <> struct DecVec<4> {
    typedef float4 t;
    static __device__ __forceinline__ void ld(float (&d)[4], const float *p) {
        float4 x = *(const float4 *)p;
        d[0] = x.x, d[1] = x.y, d[2] = x.z, d[3] = x.w;
    }
    static __device__ __forceinline__ void st(float *p, const float (&d)[4]) {
        *(float4 *)p = make_float4(d[0], d[1], d[2], d[3]);
    }
};
template <> struct DecVec<2> {
    typedef float2 t;
    static __device__ __forceinline__ void ld(float (&d)[2], const float *p) {
        float2 x = *(const float2 *)p;
        d[0] = x.x, d[1] = x.y;
    }
    static __device__ __forceinline__ void st(float *p, const float (&d)[2]) { *(float2 *)p = make_float2(d[0], d[1]); }
};

template <int R, int VW, int MINB>
__global__ void __launch_bounds__(256, MINB) k_lin_dec(hyla_cu_linrec a) {
    typedef DecVec<VW> V;
    __shared__ __align__(16) float red[2][8][32 * VW];
    __shared__ float sq[8 * R], sk[8 * R], sd[8 * R];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int j = blockIdx.x * 32 * VW + lane * VW;
    bool jv = j < a.dv;
    int h = blockIdx.y, b = blockIdx.z;
    const int H = a.H, dk = a.dk, dv = a.dv;
    int nslots = a.Sp ? 1 + a.K : 1;
    int m = 0;
    float vj[VW];
#pragma unroll
    for (int c = 0; c < VW; c++) vj[c] = 0.0f;
    if (jv) V::ld(vj, a.v + ((size_t)b * H + h) * dv + j);
    for (int slot = 0; slot < nslots; slot++) {
        float *Sg;
        float wt = 1.0f;
        if (slot == 0) {
            Sg = a.S0[b] + (size_t)h * dk * dv;
        } else {
            int part = a.idx[(size_t)b * a.K + slot - 1];
            wt = a.w[(size_t)b * a.K + slot - 1];
            if (part < 0 || part >= a.N) continue; /* invalid route: skip (uniform) */
            Sg = a.Sp[b] + ((size_t)part * H + h) * dk * dv;
        }
        float s[R][VW];
#pragma unroll
        for (int r = 0; r < R; r++) {
            int i = w + 8 * r;
            if (i < dk && jv) {
                V::ld(s[r], Sg + (size_t)i * dv + j);
            } else {
#pragma unroll
                for (int c = 0; c < VW; c++) s[r][c] = 0.0f;
            }
        }
        const float *Q = slot ? a.q2 : a.q1, *Kx = slot ? a.k2 : a.k1;
        const float *GA = slot ? a.gb : a.ga, *BE = slot ? a.betab : a.betaa;
        size_t row = (size_t)b;
        for (int i = threadIdx.x; i < dk; i += 256) {
            sq[i] = Q[(row * H + h) * dk + i] * wt;
            sk[i] = Kx[(row * H + h) * dk + i] * wt;
            if (!a.gdn) sd[i] = expf(GA[(row * H + h) * dk + i]);
        }
        __syncthreads();
        float po[VW];
#pragma unroll
        for (int c = 0; c < VW; c++) po[c] = 0.0f;
        if (!a.gdn) {
#pragma unroll
            for (int r = 0; r < R; r++) {
                int i = w + 8 * r;
                if (i < dk) {
                    float ki = sk[i], qi = sq[i], d = sd[i];
#pragma unroll
                    for (int c = 0; c < VW; c++) s[r][c] = __fmaf_rn(d, s[r][c], __fmul_rn(ki, vj[c]));
#pragma unroll
                    for (int c = 0; c < VW; c++) po[c] = __fmaf_rn(qi, s[r][c], po[c]);
                }
            }
        } else {
            float d = expf(GA[row * H + h]);
            float beta = BE[row * H + h];
            float pk[VW];
#pragma unroll
            for (int c = 0; c < VW; c++) pk[c] = 0.0f;
#pragma unroll
            for (int r = 0; r < R; r++) {
                int i = w + 8 * r;
                if (i < dk) {
                    float ki = sk[i];
#pragma unroll
                    for (int c = 0; c < VW; c++) s[r][c] *= d;
#pragma unroll
                    for (int c = 0; c < VW; c++) pk[c] += ki * s[r][c];
                }
            }
            V::st(&red[m & 1][w][lane * VW], pk);
            __syncthreads();
            float ks[VW];
#pragma unroll
            for (int c = 0; c < VW; c++) ks[c] = 0.0f;
#pragma unroll
            for (int q = 0; q < 8; q++) {
                float x[VW];
                V::ld(x, &red[m & 1][q][lane * VW]);
#pragma unroll
                for (int c = 0; c < VW; c++) ks[c] += x[c];
            }
            m++;
            float u[VW];
#pragma unroll
            for (int c = 0; c < VW; c++) u[c] = beta * (vj[c] - ks[c]);
#pragma unroll
            for (int r = 0; r < R; r++) {
                int i = w + 8 * r;
                if (i < dk) {
                    float ki = sk[i], qi = sq[i];
#pragma unroll
                    for (int c = 0; c < VW; c++) s[r][c] += ki * u[c];
#pragma unroll
                    for (int c = 0; c < VW; c++) po[c] += qi * s[r][c];
                }
            }
        }
        /* the state goes back before the reduction: its stores drain while the block reduces */
#pragma unroll
        for (int r = 0; r < R; r++) {
            int i = w + 8 * r;
            if (i < dk && jv) V::st(Sg + (size_t)i * dv + j, s[r]);
        }
        V::st(&red[m & 1][w][lane * VW], po);
        __syncthreads();
        if (w == 0 && jv) {
            float acc[VW];
#pragma unroll
            for (int c = 0; c < VW; c++) acc[c] = 0.0f;
#pragma unroll
            for (int q = 0; q < 8; q++) {
                float x[VW];
                V::ld(x, &red[m & 1][q][lane * VW]);
#pragma unroll
                for (int c = 0; c < VW; c++) acc[c] += x[c];
            }
            float *op = a.o + ((size_t)b * H + h) * dv + j;
            float res[VW];
#pragma unroll
            for (int c = 0; c < VW; c++) res[c] = a.scale * acc[c];
            if (slot != 0) {
                float prev[VW];
                V::ld(prev, op);
#pragma unroll
                for (int c = 0; c < VW; c++) res[c] += prev[c];
            }
            V::st(op, res);
        }
        m++;
    }
}

#define CK(x)                                                                                                          \
    do {                                                                                                               \
        cudaError_t e_ = (x);                                                                                          \
        if (e_ != cudaSuccess) {                                                                                       \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));                       \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)
#define HK(x)                                                                                                          \
    do {                                                                                                               \
        if ((x) != HYLA_OK) {                                                                                          \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, hyla_last_error());                            \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

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

static float frand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffffff) / 16777216.0f;
}

int main(int argc, char **argv) {
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
