/* hyla_cuda_mma.cuh — warp-level bf16 tensor-core helpers (mma.sync m16n8k16, fp32
 * accumulate) shared by the chunked linear-attention and attention kernels.
 *
 * Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16"), lane = 4*g + t:
 *   A 16x16 (row-major): reg0 = A[g][2t..2t+1], reg1 = A[g+8][2t..], reg2 = A[g][2t+8..],
 *                        reg3 = A[g+8][2t+8..]   (low half = lower column)
 *   B 16x8 (k x n):      reg0 = B[2t..2t+1][g], reg1 = B[2t+8..2t+9][g]
 *   C/D 16x8 fp32:       c0,c1 = C[g][2t..2t+1], c2,c3 = C[g+8][2t..2t+1]
 * Shared-memory tiles use row strides that are multiples of 8 elements (16 bytes) plus 8, so
 * the 32-bit fragment loads of a warp hit 32 different banks. */
#ifndef HYLA_CUDA_MMA_CUH
#define HYLA_CUDA_MMA_CUH

#include <cuda_bf16.h>
#include <stdint.h>

__device__ __forceinline__ void mma_bf16_16816(float c[4], const uint32_t a[4], const uint32_t b[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* A fragment of the 16x16 tile at `base` (row-major, row stride ld elements, even). */
__device__ __forceinline__ void ld_frag_a(uint32_t a[4], const __nv_bfloat16 *base, int ld) {
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const __nv_bfloat16 *p = base + g * ld + 2 * t;
    a[0] = *(const uint32_t *)(p);
    a[1] = *(const uint32_t *)(p + 8 * ld);
    a[2] = *(const uint32_t *)(p + 8);
    a[3] = *(const uint32_t *)(p + 8 * ld + 8);
}

/* B fragment (16 x 8, k x n) stored transposed: element (k, n) at base[n*ld + k]. */
__device__ __forceinline__ void ld_frag_b_nk(uint32_t b[2], const __nv_bfloat16 *base, int ld) {
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const __nv_bfloat16 *p = base + g * ld + 2 * t;
    b[0] = *(const uint32_t *)(p);
    b[1] = *(const uint32_t *)(p + 8);
}

/* B fragment (16 x 8, k x n) stored row-major: element (k, n) at base[k*ld + n]. */
__device__ __forceinline__ void ld_frag_b_kn(uint32_t b[2], const __nv_bfloat16 *base, int ld) {
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const unsigned short *p = (const unsigned short *)base;
    uint32_t lo = p[(2 * t) * ld + g], hi = p[(2 * t + 1) * ld + g];
    b[0] = lo | (hi << 16);
    lo = p[(2 * t + 8) * ld + g];
    hi = p[(2 * t + 9) * ld + g];
    b[1] = lo | (hi << 16);
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}

/* ldmatrix.x4: four 8x8 b16 matrices; lane l supplies the address of row (l & 7) of matrix
 * (l >> 3) and receives reg j = matrix j's elements (row l/4, cols 2(l%4), 2(l%4)+1). */
__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const __nv_bfloat16 *row_ptr) {
    unsigned a = (unsigned)__cvta_generic_to_shared(row_ptr);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
/* A fragment of the 16x16 tile at base (row-major, ld elements, rows 16-byte aligned). */
__device__ __forceinline__ void ldsm_frag_a(uint32_t a[4], const __nv_bfloat16 *base, int ld) {
    int l = threadIdx.x & 31, m = l >> 3, r = l & 7;
    ldsm_x4(a, base + (r + (m & 1) * 8) * ld + (m >> 1) * 8);
}
/* B fragments of two n8 tiles (n0..n0+15) at one k16 step, B stored [n][k] (row stride ld):
 * b[0] = tile n0, b[1] = tile n0 + 8. */
__device__ __forceinline__ void ldsm_frag_b2_nk(uint32_t b[2][2], const __nv_bfloat16 *base, int ld) {
    int l = threadIdx.x & 31, m = l >> 3, r = l & 7;
    uint32_t x[4];
    ldsm_x4(x, base + (r + (m >> 1) * 8) * ld + (m & 1) * 8);
    b[0][0] = x[0];
    b[0][1] = x[1];
    b[1][0] = x[2];
    b[1][1] = x[3];
}

/* B fragments of two n8 tiles (n0..n0+15) at one k16 step, B stored row-major [k][n] (row
 * stride ld, rows 16-byte aligned): ldmatrix.trans hands lane 4g+t the elements (k = 2t, 2t+1;
 * n = g) of each 8x8 matrix, which is the B fragment. b[0] = tile n0, b[1] = tile n0 + 8. */
__device__ __forceinline__ void ldsm_frag_b2_kn(uint32_t b[2][2], const __nv_bfloat16 *base, int ld) {
    int l = threadIdx.x & 31, m = l >> 3, r = l & 7;
    unsigned a = (unsigned)__cvta_generic_to_shared(base + ((m & 1) * 8 + r) * ld + (m >> 1) * 8);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(b[0][0]), "=r"(b[0][1]), "=r"(b[1][0]), "=r"(b[1][1])
                 : "r"(a));
}

/* A fragment (m16 x k16) of the matrix M with M[m][k] = base[k*ld + m], i.e. of the transpose of
 * the row-major 16x16 tile at base (row stride ld elements, rows 16-byte aligned): the slab of
 * 16 columns of a row-major [k][m] tile, taken as the left operand with its columns as rows.
 * ldmatrix.trans: lane l gives the address of stored row (l & 7) of 8x8 matrix j = l >> 3, and
 * lane 4g+t receives in reg j the elements (stored row 2t, column g) (low half) and (stored row
 * 2t+1, column g) (high half) of matrix j, i.e. (M[g][2t], M[g][2t+1]) of matrix j seen as
 * M = stored^T. The matrices are
 *   j = 0: stored rows 0..7,  columns 0..7   -> a[0] = M[g][2t..2t+1]      (A frag reg0)
 *   j = 1: stored rows 0..7,  columns 8..15  -> a[1] = M[g+8][2t..2t+1]    (reg1)
 *   j = 2: stored rows 8..15, columns 0..7   -> a[2] = M[g][2t+8..2t+9]    (reg2)
 *   j = 3: stored rows 8..15, columns 8..15  -> a[3] = M[g+8][2t+8..2t+9]  (reg3)
 * so lane l addresses base + ((l >> 4) * 8 + (l & 7)) * ld + ((l >> 3) & 1) * 8 (the addresses
 * of ldsm_frag_b2_nk, with .trans). */
__device__ __forceinline__ void ldsm_frag_a_kn(uint32_t a[4], const __nv_bfloat16 *base, int ld) {
    int l = threadIdx.x & 31, m = l >> 3, r = l & 7;
    unsigned p = (unsigned)__cvta_generic_to_shared(base + (r + (m >> 1) * 8) * ld + (m & 1) * 8);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
                 : "r"(p));
}

/* Zero an array of C fragments (accumulators), element by element. */
template <int A, int B>
__device__ __forceinline__ void frag_zero(float (&x)[A][B]) {
#pragma unroll
    for (int a = 0; a < A; a++)
#pragma unroll
        for (int b = 0; b < B; b++) x[a][b] = 0.0f;
}
template <int A, int B, int C>
__device__ __forceinline__ void frag_zero(float (&x)[A][B][C]) {
#pragma unroll
    for (int a = 0; a < A; a++) frag_zero(x[a]);
}

/* 16-byte asynchronous global -> shared copy; src_bytes < 16 zero-fills the rest. */
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, int src_bytes) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes));
}
/* 4-byte asynchronous copy (through L1); src_bytes 0 writes a zero. */
__device__ __forceinline__ void cp_async4(void *smem, const void *gmem, int src_bytes) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* Named barriers (bar.sync / bar.arrive id, count): one role arrives, the other waits (the
 * warp-specialised fused GDN kernels; the flash kernel's two warpgroups taking turns) */
__device__ __forceinline__ void nb_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void nb_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }

/* The last step of every batch-invariant linear path (skinny, its reductions, k_gemm_big, the
 * prompt rows' epilogue): y = (acc ? y : 0) + (v + bias[n]), in this order, so that a row's bits
 * do not depend on which path computed v. One definition for all of them (and lin_store_g
 * below, the same for a group of outputs). */
__device__ __forceinline__ void lin_store(float v, const float *bias, int n, float *yp, int accumulate) {
    if (bias) v += bias[n];
    *yp = accumulate ? *yp + v : v;
}

/* lin_store for G outputs of one thread (value v[j] to row m[j], column n[j]; those past M or N
 * skipped), every bias and y load issued before the first store: the compiler may not move a
 * load of y or of the bias past a store to y (they may alias), so output by output each store
 * waited for its own round trip to memory (a 256-row LoRA term with accumulate took twice the
 * time of the same linear without). The same arithmetic as lin_store. */
template <int G>
__device__ __forceinline__ void lin_store_g(const float *v, const int *m, const int *n, int M, int N, const float *bias,
                                            float *y, int ldy, int accumulate) {
    float b[G], yo[G];
#pragma unroll
    for (int j = 0; j < G; j++) {
        const bool ok = m[j] < M && n[j] < N;
        b[j] = bias && ok ? bias[n[j]] : 0.0f;
        yo[j] = accumulate && ok ? y[(size_t)m[j] * ldy + n[j]] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < G; j++)
        if (m[j] < M && n[j] < N) {
            float t = v[j];
            if (bias) t += b[j];
            y[(size_t)m[j] * ldy + n[j]] = accumulate ? yo[j] + t : t;
        }
}

#endif
