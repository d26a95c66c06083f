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

/* 1 / sqrt(sum(x^2) + eps) of a row of D floats (D % 4 == 0, D <= 512, 16-byte aligned), by one
 * warp: lane t sums units t, t + 32, ... (4 floats each, sq_acc) in ascending order, then the xor
 * butterfly. That is k_l2norm_rows's arithmetic in its warp-per-row, 16-byte form, so the row
 * scaled by the result has its bits (the fused GDN decode uses it). Every lane gets the value. */
__device__ __forceinline__ float l2_inv_warp(const float *row, int D, float eps, int lane) {
    float ss = 0.0f;
    for (int u = lane; u < D / 4; u += 32) ss = sq_acc<1>(ss, reinterpret_cast<const float4 *>(row)[u]);
    ss = warp_sum(ss);
    return 1.0f / sqrtf(ss + eps);
}

/* [GDN-1] one (row, head)'s gates from its projections a, b: g = -exp(A_log) softplus(a + dt_bias),
 * beta = sigmoid(b) (x 2 with allow_neg); shared by k_gdn_gates and the fused GDN decode. */
__device__ __forceinline__ void gdn_gate_vals(float av, float bv, float A_log, float dt_bias, int allow_neg, float &g,
                                              float &beta) {
    float x = av + dt_bias;
    float sp = x > 20.0f ? x : log1pf(expf(x));
    g = -expf(A_log) * sp;
    float s = 1.0f / (1.0f + expf(-bv));
    beta = allow_neg ? 2.0f * s : s;
}

#endif
