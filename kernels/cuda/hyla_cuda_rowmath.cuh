/* hyla_cuda_rowmath.cuh — the per-element and per-warp arithmetic the row and elementwise ops of
 * hyla_cuda_dense.cu share with the kernel lab's forms of them (kernels/cuda/dev/): one
 * definition, so a form and the product compute the same bits. */
#ifndef HYLA_CUDA_ROWMATH_CUH
#define HYLA_CUDA_ROWMATH_CUH

/* the lanes' values added by the fixed xor butterfly */
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }

/* ss + the unit's squares, in component order */
template <int V4> __device__ __forceinline__ float sq_acc(float ss, float4 v) {
    ss = fmaf(v.x, v.x, ss);
    if (V4) {
        ss = fmaf(v.y, v.y, ss);
        ss = fmaf(v.z, v.z, ss);
        ss = fmaf(v.w, v.w, ss);
    }
    return ss;
}

#endif
