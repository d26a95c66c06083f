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
/* x * sigmoid(x) on the special-function unit's exponential and an approximate division: five
 * instructions where expf and an IEEE division take ~25, which made the prompt's short convolution
 * issue-bound. Relative error ~1e-6 (|x| < 20), far below the bf16 rounding of every consumer; the
 * one definition every CUDA form calls, so the identity of prompt pieces, decode rows and batches
 * holds. x < -87: the exponential overflows and the quotient is -0, as the true value rounds. */
__device__ __forceinline__ float silu_f(float x) { return __fdividef(x, 1.0f + __expf(-x)); }

/* [GDN-2] the L2 norm's inverse 1 / sqrt(ss + eps), one special-function instruction (2 ulp)
 * where an IEEE square root and division take ~20: in the prompt's fused convolution it is paid
 * once a token for every four channels. Every CUDA L2 norm calls it, so their forms agree. */
__device__ __forceinline__ float l2_inv_f(float ss, float eps) { return rsqrtf(ss + eps); }

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
    return l2_inv_f(ss, eps);
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
