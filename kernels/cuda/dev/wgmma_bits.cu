/* wgmma_bits.cu — does Hopper's warpgroup product (wgmma.mma_async m64nNk16, bf16 in, fp32
 * accumulate) give the same bits as the warp product every batch-invariant kernel of the product
 * uses (mma.sync m16n8k16)?
 *
 * The linears, the GDN state pass and the flash kernels promise that a row's result does not
 * depend on the batch: each output is a chain of m16n8k16 products over 16-wide k steps from a
 * zero accumulator. A faster form built on wgmma keeps that promise (and every session's
 * tokens) only if one wgmma k16 step rounds exactly as one mma.sync k16 step for every input.
 * This program computes C = A B^T (64 rows, N columns, K = 256: sixteen k16 steps chained in
 * the accumulator) three ways on one GPU — mma.sync, wgmma with both operands in shared memory
 * (no swizzle), wgmma with A in registers — over inputs chosen to stress the adder inside the
 * tensor core (uniform, exponents spread over 2^-24..2^24, mixed), and reports for each form the
 * outputs whose bits differ from mma.sync's and its error against a double-precision sum. A
 * fourth set has rows whose products are all -0, where a first step that ignores the accumulator
 * (scale-d = 0) may keep a -0 that mma.sync's zero accumulator turns into +0: a fourth form starts
 * from a zeroed accumulator instead (as k_gemm_wg does) and is judged on that set too.
 *
 * usage: wgmma_bits        Exit status 1 when a wgmma form's bits differ from mma.sync's, 2
 *                          when a form is wrong against the double sums (a layout mistake). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_bf16.h>

#include "hyla_cuda_mma.cuh"
#include "hyla_cuda_wgmma.cuh"
#include "lab.h"

#define MM 64
#define KK 256

/* Element (r, k) of an operand of R rows in the k16-step blocks wgmma reads without swizzle:
 * per k step an R x 16 block; inside it 8-row groups of two 8 x 8 core matrices (128 bytes
 * each, rows of 16 bytes), the k-halves 128 bytes apart (LBO) and the row groups 256 (SBO). */
__host__ __device__ static inline int core_off(int r, int k, int R) {
    return (k / 16) * R * 16 + (r / 8) * 128 + ((k % 16) / 8) * 64 + (r % 8) * 8 + (k % 8);
}

__device__ static inline uint64_t desc(const void *p, unsigned lbo, unsigned sbo) {
    uint64_t a = (uint64_t)__cvta_generic_to_shared(p);
    return ((a & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32);
}

template <int N>
__global__ void k_mma(const __nv_bfloat16 *A, const __nv_bfloat16 *B, float *C) {
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    float acc[N / 8][4];
    for (int j = 0; j < N / 8; j++)
        for (int e = 0; e < 4; e++) acc[j][e] = 0.0f;
    for (int s = 0; s < KK / 16; s++) {
        uint32_t af[4];
        ld_frag_a(af, A + (16 * w) * KK + 16 * s, KK);
        for (int j = 0; j < N / 8; j++) {
            uint32_t bf[2];
            ld_frag_b_nk(bf, B + (8 * j) * KK + 16 * s, KK);
            mma_bf16_16816(acc[j], af, bf);
        }
    }
    for (int j = 0; j < N / 8; j++)
        for (int e = 0; e < 4; e++) C[(16 * w + g + 8 * (e >> 1)) * N + 8 * j + 2 * tq + (e & 1)] = acc[j][e];
}

__device__ static inline void fill(__nv_bfloat16 *S, const __nv_bfloat16 *X, int R) {
    for (int i = threadIdx.x; i < R * KK; i += blockDim.x) S[core_off(i / KK, i % KK, R)] = X[i];
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
}

/* the single-instruction helpers are the product's (hyla_cuda_wgmma.cuh): wg_mma<N> is the
 * m64nNk16 product with both operands in shared memory, wg_fence / wg_commit / wg_wait its
 * ordering; the register-A form here takes a scale-d operand, which the product's does not */
__device__ static inline void wg_commit_wait() {
    wg_commit();
    wg_wait<0>();
}
__device__ static inline void wg_rs64(float (&d)[32], const uint32_t (&a)[4], uint64_t db, int scale_d) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
#endif
}

template <int N>
__device__ static inline void store_d(const float (&d)[N / 2], float *C) {
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    for (int j = 0; j < N / 8; j++)
        for (int e = 0; e < 4; e++) C[(16 * w + g + 8 * (e >> 1)) * N + 8 * j + 2 * tq + (e & 1)] = d[j * 4 + e];
}

/* both operands from shared memory; lbo / sbo as given (a swapped pair tells a layout mistake);
 * zeroed: the first k16 step adds to a zeroed accumulator (scale-d = 1, as the product's
 * k_gemm_wg and as mma.sync from a zero accumulator) instead of ignoring it (scale-d = 0) */
template <int N>
__global__ void k_wg_ss(const __nv_bfloat16 *A, const __nv_bfloat16 *B, float *C, unsigned lbo, unsigned sbo,
                        int zeroed) {
    extern __shared__ __align__(128) __nv_bfloat16 sm[];
    __nv_bfloat16 *As = sm, *Bs = sm + MM * KK;
    fill(As, A, MM);
    fill(Bs, B, N);
    float d[N / 2];
    for (int i = 0; i < N / 2; i++) d[i] = 0.0f;
    wg_fence();
    for (int s = 0; s < KK / 16; s++)
        wg_mma<N>(d, desc(As + s * MM * 16, lbo, sbo), desc(Bs + s * N * 16, lbo, sbo), zeroed || s > 0);
    wg_commit_wait();
    store_d<N>(d, C);
}

/* A in registers (each warp its 16 rows, mma.sync's A fragment), B from shared memory */
__global__ void k_wg_rs64(const __nv_bfloat16 *A, const __nv_bfloat16 *B, float *C) {
    extern __shared__ __align__(128) __nv_bfloat16 sm[];
    fill(sm, B, 64);
    const int w = threadIdx.x >> 5;
    float d[32];
    for (int i = 0; i < 32; i++) d[i] = 0.0f;
    wg_fence();
    for (int s = 0; s < KK / 16; s++) {
        uint32_t af[4];
        ld_frag_a(af, A + (16 * w) * KK + 16 * s, KK);
        wg_rs64(d, af, desc(sm + s * 64 * 16, 128, 256), s > 0);
    }
    wg_commit_wait();
    store_d<64>(d, C);
}

static float bf2f(__nv_bfloat16 v) { return __bfloat162float(v); }

/* the value of set `set` at draw i: 0 uniform [-1, 1); 1 sign x [1, 2) x 2^[-24, 24]; 2 a mix
 * (half the entries from each); 3 (signed zeros) A's even rows +0 and B negative, so those rows'
 * products are all -0: a zero accumulator gives +0, ignoring it may give -0 */
static float draw(int set, uint64_t *s) {
    float u = frand(s) * 2.0f - 1.0f;
    if (set == 3) return u;
    if (set == 0 || (set == 2 && frand(s) < 0.5f)) return u;
    int e = (int)(frand(s) * 49.0f) - 24;
    return (u < 0 ? -1.0f : 1.0f) * (1.0f + frand(s)) * ldexpf(1.0f, e);
}

int main(int argc, char **argv) {
    if (argc > 1) {
        printf("usage: wgmma_bits   (no arguments). Exit 1 when a wgmma form's bits differ from mma.sync's, 2 when a\n"
               "form is wrong against the double sums, 77 without a Hopper GPU.\n");
        return strcmp(argv[1], "--help") && strcmp(argv[1], "-h") ? 2 : 0;
    }
    int dev = 0, ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        printf("wgmma_bits: no usable CUDA device\n");
        return 77;
    }
    cudaDeviceProp pr;
    CK(cudaGetDeviceProperties(&pr, dev));
    if (pr.major != 9) {
        printf("wgmma_bits: needs a Hopper GPU (sm_90), found %s (sm_%d%d)\n", pr.name, pr.major, pr.minor);
        return 77;
    }
    const int NMAX = 128;
    __nv_bfloat16 *hA = (__nv_bfloat16 *)malloc(MM * KK * 2), *hB = (__nv_bfloat16 *)malloc(NMAX * KK * 2);
    float *hC[5];
    for (int i = 0; i < 5; i++) hC[i] = (float *)malloc(MM * NMAX * 4);
    __nv_bfloat16 *dA, *dB;
    float *dC[5];
    CK(cudaMalloc(&dA, MM * KK * 2));
    CK(cudaMalloc(&dB, NMAX * KK * 2));
    for (int i = 0; i < 5; i++) CK(cudaMalloc(&dC[i], MM * NMAX * 4));
    CK(cudaFuncSetAttribute(k_wg_ss<64>, cudaFuncAttributeMaxDynamicSharedMemorySize, (MM + 64) * KK * 2));
    CK(cudaFuncSetAttribute(k_wg_ss<128>, cudaFuncAttributeMaxDynamicSharedMemorySize, (MM + 128) * KK * 2));
    CK(cudaFuncSetAttribute(k_wg_rs64, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * KK * 2));
    int status = 0;
    long total_diff = 0, total_out = 0;
    long zero_sign = 0; /* set 3: outputs where ignoring the accumulator gave another zero than mma.sync */
    const char *setname[4] = {"uniform", "exp2^+-24", "mixed", "signed 0"};
    for (int set = 0; set < 4; set++)
        for (int rep = 0; rep < 8; rep++) {
            uint64_t seed = 0x9e3779b97f4a7c15ull * (uint64_t)(set * 64 + rep + 1);
            for (int i = 0; i < MM * KK; i++) hA[i] = __float2bfloat16(set == 3 && (i / KK) % 2 == 0 ? 0.0f : draw(set, &seed));
            for (int i = 0; i < NMAX * KK; i++) {
                const float v = draw(set, &seed);
                hB[i] = __float2bfloat16(set == 3 ? -fabsf(v) - 0.5f : v);
            }
            CK(cudaMemcpy(dA, hA, MM * KK * 2, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(dB, hB, NMAX * KK * 2, cudaMemcpyHostToDevice));
            for (int N = 64; N <= 128; N += 64) {
                /* forms: 0 mma.sync, 1 wgmma SS (LBO 128, SBO 256), 2 the pair swapped, 3 RS,
                 * 4 SS from a zeroed accumulator (N = 64) */
                if (N == 64) {
                    k_mma<64><<<1, 128>>>(dA, dB, dC[0]);
                    k_wg_ss<64><<<1, 128, (MM + 64) * KK * 2>>>(dA, dB, dC[1], 128, 256, 0);
                    k_wg_ss<64><<<1, 128, (MM + 64) * KK * 2>>>(dA, dB, dC[2], 256, 128, 0);
                    k_wg_rs64<<<1, 128, 64 * KK * 2>>>(dA, dB, dC[3]);
                    k_wg_ss<64><<<1, 128, (MM + 64) * KK * 2>>>(dA, dB, dC[4], 128, 256, 1);
                } else {
                    k_mma<128><<<1, 128>>>(dA, dB, dC[0]);
                    k_wg_ss<128><<<1, 128, (MM + 128) * KK * 2>>>(dA, dB, dC[1], 128, 256, 0);
                    k_wg_ss<128><<<1, 128, (MM + 128) * KK * 2>>>(dA, dB, dC[2], 256, 128, 0);
                }
                CK(cudaGetLastError());
                CK(cudaDeviceSynchronize());
                const int nf = N == 64 ? 5 : 3;
                for (int f = 0; f < nf; f++) CK(cudaMemcpy(hC[f], dC[f], MM * N * 4, cudaMemcpyDeviceToHost));
                for (int f = 0; f < nf; f++) {
                    long diff = 0;
                    double maxerr = 0;
                    for (int m = 0; m < MM; m++)
                        for (int n = 0; n < N; n++) {
                            double ref = 0, mag = 0;
                            for (int k = 0; k < KK; k++) {
                                double p = (double)bf2f(hA[m * KK + k]) * (double)bf2f(hB[n * KK + k]);
                                ref += p;
                                mag += fabs(p);
                            }
                            float v = hC[f][m * N + n];
                            double err = mag > 0 ? fabs(v - ref) / mag : fabs(v);
                            if (!(err <= maxerr)) maxerr = err;
                            if (memcmp(&v, &hC[0][m * N + n], 4)) diff++;
                        }
                    const char *fname[5] = {"mma.sync", "wgmma SS", "wgmma SS swapped", "wgmma RS",
                                            "wgmma SS zeroed"};
                    const int correct = maxerr < 1e-5;
                    if (rep == 0 || (f != 2 && (diff || !correct)))
                        printf("set %-9s rep %d N %3d %-17s: %5ld of %5d outputs' bits differ from mma.sync; "
                               "error / sum|p| %.2e%s\n",
                               setname[set], rep, N, fname[f], diff, MM * N, maxerr, correct ? "" : " (WRONG)");
                    /* the verdict: every form on values, the zeroed form on signed zeros too; the
                     * sign of a zero sum under scale-d = 0 is reported, not judged */
                    if (set == 3 && (f == 1 || f == 3)) {
                        zero_sign += diff;
                        if (!correct) status = 2;
                    } else if (f == 1 || f == 3 || f == 4) {
                        total_diff += diff;
                        total_out += MM * N;
                        if (!correct) status = 2;
                        else if (diff && status == 0) status = 1;
                    }
                    if (f == 0 && !correct) status = 2;
                }
            }
        }
    printf("wgmma_bits: %ld of %ld wgmma outputs differ from mma.sync's bits: %s\n", total_diff, total_out,
           status == 0 ? "the same bits" : status == 1 ? "DIFFERENT bits" : "a form is wrong (layout)");
    printf("wgmma_bits: all -0 products, the first step ignoring the accumulator (scale-d = 0): %ld outputs' "
           "zeros differ in sign from mma.sync's (zeroed accumulators: counted above)\n",
           zero_sign);
    return status;
}
