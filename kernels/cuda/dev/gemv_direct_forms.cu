/* gemv_direct_forms.cu — the kernel lab's forms of the one-row-tile skinny linear (decode of 1-4
 * sessions) that take the weights straight from global memory into the mma B fragments: no
 * shared-memory staging, no barrier between k steps, as many loads in flight a thread as the form
 * unrolls. Against the product's ops->linear (k_skinny2<1, ...>: cp.async stages, ldmatrix), bit
 * for bit, and timed with the weights streamed from DRAM (each call reads the next of several
 * copies that together exceed the L2 four times).
 *
 * Why a form can give the product's bits: every output gets the same arithmetic — the same K
 * slices (sk_plan: S and the slice length from N, K and the SM count); within a slice the same
 * m16n8k16 products over the same 16-wide k steps, in ascending order, from a zero accumulator
 * (steps past the slice's end as the product runs them: whole 64-wide tiles, zeros beyond); the
 * same operand values in the same fragment positions (a B fragment word is W[n][k], W[n][k + 1]
 * exactly where ldmatrix puts it; x rounded to bf16 as the product's staging rounds it, rows past
 * M zero); and for S > 1 the slices' partials summed in slice order by the tile's last block.
 * What a form changes is only how the bytes arrive.
 *
 * Forms:
 *   d4-U   each lane loads its fragment words (4 bytes each: rows g and g + 8 of the warp's 16
 *          columns, k + 2t and k + 8 + 2t) for U k16 steps before the first product of them;
 *   d16-U  each lane loads 16 bytes (8 k) of rows g and g + 8 for U 32-wide k chunks, and the
 *          four lanes of a quad exchange words (two xor shuffles) so that each holds its
 *          fragment words.
 *
 * usage: gemv_direct_forms [M...]   (default M = 1 4; the 1.68B GDN model's decode shapes)
 * Exit status 1 when a form's output differs from the product's bits, 77 without a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hyla_cuda_gemm_wg.cuh" /* sk_plan: the product's slice plan */
#include "hyla_cuda_impl.h"
#include "hyla_cuda_mma.cuh"
#include "hyla_ops.h"
#include "lab.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

#define GN 64 /* output columns a block (the product's tile) */
#define GK 64 /* k of the product's shared-memory tile: a slice runs whole tiles of it */

/* x's A fragment words for one k16 step at k (rows g < M; the rest zero): a[0] row g, k + 2t;
 * a[1] row g, k + 8 + 2t (the fragment's rows g + 8 are past any M <= 8). */
__device__ __forceinline__ void gd_frag_x(uint32_t (&a)[2], const float *__restrict__ x, int M, int K, int kend, int k,
                                          int g, int t) {
    a[0] = a[1] = 0u;
    if (g >= M) return;
    const float *r = x + (size_t)g * K;
    const int k1 = k + 2 * t, k2 = k + 8 + 2 * t;
    if (k1 < kend) a[0] = pack_bf16x2(r[k1], r[k1 + 1]);
    if (k2 < kend) a[1] = pack_bf16x2(r[k2], r[k2 + 1]);
}

/* acc[nt] += x_step * W_step^T for the warp's two n8 tiles (the product's mma order: nt 0, 1). */
__device__ __forceinline__ void gd_mma(float (&acc)[2][4], const uint32_t (&a)[2], const uint32_t (&b)[2][2]) {
    const uint32_t af[4] = {a[0], 0u, a[1], 0u};
    mma_bf16_16816(acc[0], af, b[0]);
    mma_bf16_16816(acc[1], af, b[1]);
}

/* The tile's epilogue: S == 1 stores y; else the slice's partials to part [S][M][N], and the last
 * of the tile's S blocks to arrive sums them in slice order (the product's sk_finish_tile). */
__device__ __forceinline__ void gd_finish(const float (&acc)[2][4], float *__restrict__ part, float *__restrict__ y,
                                          unsigned *cnt, int M, int N, int S, int s, int n0, int w, int g, int t) {
#pragma unroll
    for (int nt = 0; nt < 2; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int m = g + (e >> 1) * 8, n = n0 + 16 * w + nt * 8 + 2 * t + (e & 1);
            if (m < M && n < N) {
                if (S == 1) lin_store(acc[nt][e], NULL, n, y + (size_t)m * N + n, 0);
                else part[((size_t)s * M + m) * N + n] = acc[nt][e];
            }
        }
    if (S == 1) return;
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(cnt + blockIdx.x, 1u) == (unsigned)S - 1;
        if (last) atomicExch(cnt + blockIdx.x, 0u);
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (int i = threadIdx.x; i < M * GN; i += blockDim.x) {
        const int m = i / GN, n = n0 + i % GN;
        if (n >= N) continue;
        float tv[16];
#pragma unroll
        for (int q = 0; q < 16; q++) tv[q] = q < S ? __ldcg(part + ((size_t)q * M + m) * N + n) : 0.0f;
        float v = tv[0];
#pragma unroll
        for (int q = 1; q < 16; q++)
            if (q < S) v += tv[q];
        lin_store(v, NULL, n, y + (size_t)m * N + n, 0);
    }
}

/* d4-U: grid (ceil(N / 64), S), 128 threads; warp w owns columns n0 + 16w .. + 15. */
template <int U>
__global__ void __launch_bounds__(128) k_gd4(const float *__restrict__ x, int M, int K,
                                             const __nv_bfloat16 *__restrict__ W, int N, int kchunk, int S,
                                             float *__restrict__ part, float *__restrict__ y, unsigned *cnt) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int n0 = blockIdx.x * GN, s = blockIdx.y;
    const int kbeg = s * kchunk, kend = kbeg + kchunk < K ? kbeg + kchunk : K;
    const int kstop = kbeg + (kend - kbeg + GK - 1) / GK * GK; /* whole tiles, as the product runs them */
    const int nr[2] = {n0 + 16 * w + g, n0 + 16 * w + 8 + g};
    const uint32_t *wr[2];
#pragma unroll
    for (int h = 0; h < 2; h++) wr[h] = nr[h] < N ? (const uint32_t *)(W + (size_t)nr[h] * K) : NULL;
    float acc[2][4];
    frag_zero(acc);
    for (int k0 = kbeg; k0 < kstop; k0 += 16 * U) {
        uint32_t b[U][2][2];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int k1 = k0 + 16 * u + 2 * t, k2 = k1 + 8;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                b[u][h][0] = wr[h] && k1 < kend ? __ldg(wr[h] + k1 / 2) : 0u;
                b[u][h][1] = wr[h] && k2 < kend ? __ldg(wr[h] + k2 / 2) : 0u;
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int k = k0 + 16 * u;
            if (k >= kstop) break;
            uint32_t a[2];
            gd_frag_x(a, x, M, K, kend, k, g, t);
            gd_mma(acc, a, b[u]);
        }
    }
    gd_finish(acc, part, y, cnt, M, N, S, s, n0, w, g, t);
}

/* d16-U: lane t of a quad loads 16 bytes, k0 + 8t .. + 7, of rows g and g + 8 for each 32-wide k
 * chunk, so the quad holds words q[t][i] = (k0 + 8t + 2i, + 1). The fragments of the chunk's
 * two k16 steps want, at lane t, step 0: q[0][t], q[1][t]; step 1: q[2][t], q[3][t] — a 4 x 4
 * transpose of words across the quad, done with two xor shuffles a word. */
__device__ __forceinline__ void gd_quad_transpose(uint32_t (&q)[4], int t) {
    /* round 1 (xor 1): lanes swap the words whose index differs from theirs in bit 0 */
#pragma unroll
    for (int i = 0; i < 4; i += 2) {
        const uint32_t send = (t & 1) ? q[i] : q[i + 1];
        const uint32_t got = __shfl_xor_sync(0xffffffffu, send, 1);
        if (t & 1) q[i] = got;
        else q[i + 1] = got;
    }
    /* round 2 (xor 2): the same on bit 1 */
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const uint32_t send = (t & 2) ? q[i] : q[i + 2];
        const uint32_t got = __shfl_xor_sync(0xffffffffu, send, 2);
        if (t & 2) q[i] = got;
        else q[i + 2] = got;
    }
}

template <int U>
__global__ void __launch_bounds__(128) k_gd16(const float *__restrict__ x, int M, int K,
                                              const __nv_bfloat16 *__restrict__ W, int N, int kchunk, int S,
                                              float *__restrict__ part, float *__restrict__ y, unsigned *cnt) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int n0 = blockIdx.x * GN, s = blockIdx.y;
    const int kbeg = s * kchunk, kend = kbeg + kchunk < K ? kbeg + kchunk : K;
    const int kstop = kbeg + (kend - kbeg + GK - 1) / GK * GK;
    const int nr[2] = {n0 + 16 * w + g, n0 + 16 * w + 8 + g};
    const uint4 *wr[2];
#pragma unroll
    for (int h = 0; h < 2; h++) wr[h] = nr[h] < N ? (const uint4 *)(W + (size_t)nr[h] * K) : NULL;
    float acc[2][4];
    frag_zero(acc);
    for (int k0 = kbeg; k0 < kstop; k0 += 32 * U) {
        uint32_t q[U][2][4];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int k = k0 + 32 * u + 8 * t; /* K % 8 == 0: a piece is wholly before kend or not */
#pragma unroll
            for (int h = 0; h < 2; h++) {
                uint4 v = make_uint4(0u, 0u, 0u, 0u);
                if (wr[h] && k < kend) v = __ldg(wr[h] + k / 8);
                q[u][h][0] = v.x, q[u][h][1] = v.y, q[u][h][2] = v.z, q[u][h][3] = v.w;
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (k0 + 32 * u >= kstop) break;
#pragma unroll
            for (int h = 0; h < 2; h++) gd_quad_transpose(q[u][h], t);
            /* now lane t holds q[u][h][j] = the word of lane j's piece at index t: (k0 + 32u + 8j
             * + 2t, + 1), so step 0 (k0 + 32u) is (j = 0, 1), step 1 (k0 + 32u + 16) is (j = 2, 3) */
#pragma unroll
            for (int st = 0; st < 2; st++) {
                const int k = k0 + 32 * u + 16 * st;
                if (k >= kstop) break;
                const uint32_t b[2][2] = {{q[u][0][2 * st], q[u][0][2 * st + 1]}, {q[u][1][2 * st], q[u][1][2 * st + 1]}};
                uint32_t a[2];
                gd_frag_x(a, x, M, K, kend, k, g, t);
                gd_mma(acc, a, b);
            }
        }
    }
    gd_finish(acc, part, y, cnt, M, N, S, s, n0, w, g, t);
}

typedef void (*gd_kernel)(const float *, int, int, const __nv_bfloat16 *, int, int, int, float *, float *, unsigned *);

struct Form {
    const char *name;
    gd_kernel k;
};

static const Form forms[] = {
    {"d4-4 (4-byte fragment loads, 4 k16 steps ahead)", k_gd4<4>},
    {"d4-8 (4-byte fragment loads, 8 k16 steps ahead)", k_gd4<8>},
    {"d4-16 (4-byte fragment loads, 16 k16 steps ahead)", k_gd4<16>},
    {"d16-2 (16-byte loads, quad transpose, 2 chunks ahead)", k_gd16<2>},
    {"d16-4 (16-byte loads, quad transpose, 4 chunks ahead)", k_gd16<4>},
    {"d16-8 (16-byte loads, quad transpose, 8 chunks ahead)", k_gd16<8>},
};

int main(int argc, char **argv) {
    lab_args(argc, argv,
             "usage: gemv_direct_forms [M...]   (default M = 1 4, at most 4; the 1.68B GDN model's decode shapes). "
             "Exit 1 when a form's output differs from the product's bits, 77 without a GPU.");
    int Ms[8] = {1, 4}, nm = 2;
    if (argc > 1) {
        nm = 0;
        for (int i = 1; i < argc && nm < 8; i++) {
            const int m = atoi(argv[i]);
            if (m > 4) {
                fprintf(stderr, "gemv_direct_forms: M = %d: the forms are the one-row-tile kernel's, M <= 4\n", m);
                return 2;
            }
            Ms[nm++] = m;
        }
    }
    if (!hyla_cuda_available()) {
        printf("gemv_direct_forms: no usable CUDA device\n");
        return 77;
    }
    hyla_backend *gpu;
    HK(hyla_cuda_backend_create(0, &gpu));
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)gpu->ctx;
    /* Every time here is the host's clock around a run of launches and a stream sync: events
     * recorded around the product's launches gave 0.06 us a call with and without programmatic
     * serialization, so they are not trusted here. The product's launches keep their
     * programmatic serialization (as in a decode step); the forms are plain launches. */
    int l2 = 0;
    CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, c->device));
    /* K, N: q/k, v/gate, o, MLP gate/up, MLP down */
    const int shapes[][2] = {{2304, 2304}, {2304, 4608}, {4608, 2304}, {2304, 6144}, {6144, 2304}};
    const int iters = 300;
    int bad = 0;
    uint64_t seed = 20261128;
    unsigned *dcnt;
    CK(cudaMalloc(&dcnt, 4096 * sizeof(unsigned)));
    CK(cudaMemset(dcnt, 0, 4096 * sizeof(unsigned)));
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int K = shapes[si][0], N = shapes[si][1];
        int S, kchunk;
        sk_plan(c, N, K, &S, &kchunk);
        const double wbytes = (double)N * K * 2;
        /* copies of W that together exceed the L2 four times: each call streams its weights */
        int R = (int)ceil(4.0 * l2 / wbytes);
        if (R < 2) R = 2;
        hyla_weight **Wg = (hyla_weight **)calloc((size_t)R, sizeof *Wg);
        float *Wf = (float *)malloc((size_t)N * K * 4);
        for (size_t i = 0; i < (size_t)N * K; i++) Wf[i] = (2 * frand(&seed) - 1) / sqrtf((float)K);
        for (int r = 0; r < R; r++) HK(gpu->ops->weight_create(gpu->ctx, Wf, HYLA_DT_F32, N, K, &Wg[r]));
        free(Wf);
        for (int mi = 0; mi < nm; mi++) {
            const int M = Ms[mi];
            float *xh = (float *)malloc((size_t)M * K * 4), *yp = (float *)malloc((size_t)M * N * 4),
                  *yf = (float *)malloc((size_t)M * N * 4);
            for (size_t i = 0; i < (size_t)M * K; i++) xh[i] = 2 * frand(&seed) - 1;
            float *dx, *dy, *dpart;
            CK(cudaMalloc(&dx, (size_t)M * K * 4));
            CK(cudaMalloc(&dy, (size_t)M * N * 4));
            CK(cudaMalloc(&dpart, (size_t)S * M * N * 4));
            CK(cudaMemcpy(dx, xh, (size_t)M * K * 4, cudaMemcpyHostToDevice));
            /* the product, its bits and its time */
            HK(gpu->ops->linear(gpu->ctx, dx, K, M, K, Wg[0], NULL, dy, N, N, 0));
            HK(gpu->ops->sync(gpu->ctx));
            CK(cudaMemcpy(yp, dy, (size_t)M * N * 4, cudaMemcpyDeviceToHost));
            double t0 = now_s();
            for (int i = 0; i < iters; i++) HK(gpu->ops->linear(gpu->ctx, dx, K, M, K, Wg[i % R], NULL, dy, N, N, 0));
            HK(gpu->ops->sync(gpu->ctx));
            const double tp = (now_s() - t0) / iters;
            printf("M=%d K=%d N=%d S=%d (%d copies of W): product %.2f us (%.2f TB/s of W)\n", M, K, N, S, R, tp * 1e6,
                   wbytes / tp * 1e-12);
            for (size_t fi = 0; fi < sizeof forms / sizeof forms[0]; fi++) {
                const Form *f = &forms[fi];
                const dim3 grid((N + GN - 1) / GN, S);
                CK(cudaMemset(dy, 0xff, (size_t)M * N * 4));
                f->k<<<grid, 128, 0, c->stream>>>(dx, M, K, Wg[0]->d, N, kchunk, S, dpart, dy, dcnt);
                CK(cudaGetLastError());
                CK(cudaStreamSynchronize(c->stream));
                CK(cudaMemcpy(yf, dy, (size_t)M * N * 4, cudaMemcpyDeviceToHost));
                const int same = !memcmp(yp, yf, (size_t)M * N * 4);
                if (!same) bad = 1;
                t0 = now_s();
                for (int i = 0; i < iters; i++)
                    f->k<<<grid, 128, 0, c->stream>>>(dx, M, K, Wg[i % R]->d, N, kchunk, S, dpart, dy, dcnt);
                CK(cudaStreamSynchronize(c->stream));
                const double tf = (now_s() - t0) / iters;
                printf("  %-56s %.2f us (%.2f TB/s of W) %s\n", f->name, tf * 1e6, wbytes / tf * 1e-12,
                       same ? "same bits" : "DIFFERS");
            }
            CK(cudaFree(dx));
            CK(cudaFree(dy));
            CK(cudaFree(dpart));
            free(xh), free(yp), free(yf);
        }
        for (int r = 0; r < R; r++) gpu->ops->weight_destroy(gpu->ctx, Wg[r]);
        free(Wg);
    }
    CK(cudaFree(dcnt));
    hyla_backend_destroy(gpu);
    printf("gemv_direct_forms: %s\n", bad ? "FAILED" : "ok");
    return bad;
}
