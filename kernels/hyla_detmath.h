/* hyla_detmath.h — functions whose results must be the same bits on every backend.
 *
 * A value that decides something discrete (which tokens an LTE cache keeps) must not depend on
 * the backend that computed it, or a session migrated between a CPU and a GPU worker would keep
 * other tokens. libm's exp and CUDA's are each accurate to about an ulp but not the same
 * function: a double exp rounded to float differs between them for ~2^-28 of inputs, and a
 * cache's scores pass millions of exponentials (test_gpu_ops saw 1-2 of 10,272 scores differ on
 * some inputs). hyla_exp_det is one sequence of IEEE double operations, each rounded to nearest
 * on its own (no fused multiply-add: CUDA's intrinsics here, and on the CPU separate products
 * and sums, which the C compiler does not fuse on x86-64 without -mfma), so both backends get
 * the same bits. Included by C and CUDA translation units. */
#ifndef HYLA_DETMATH_H
#define HYLA_DETMATH_H

#include <math.h>

#if defined(__CUDACC__)
#define HYLA_DET_FN __host__ __device__ __forceinline__
#else
#define HYLA_DET_FN static inline
#endif

#if defined(__CUDA_ARCH__)
#define HYLA_DET_MUL(a, b) __dmul_rn((a), (b))
#define HYLA_DET_ADD(a, b) __dadd_rn((a), (b))
#else
#define HYLA_DET_MUL(a, b) ((a) * (b))
#define HYLA_DET_ADD(a, b) ((a) + (b))
#endif

/* e^x: x = n ln2 + r with n = rint(x / ln2), |r| <= ln2 / 2 (ln2 in two parts, so r is exact
 * to ~2^-60), e^r by its Taylor series to r^13 / 13! (Horner; truncation below 2^-54
 * relative), times 2^n (exact). Within ~2 ulp of e^x. Below -700 it returns 0 and above 709
 * infinity: where the callers add it to 1 or divide by it, those give what e^x would. */
HYLA_DET_FN double hyla_exp_det(double x) {
    if (x != x) return x;
    if (x > 709.0) return HUGE_VAL;
    if (x < -700.0) return 0.0;
    const double inv_ln2 = 1.4426950408889634, ln2_hi = 6.93147180369123816490e-01,
                 ln2_lo = 1.90821492927058770002e-10;
    const double n = rint(HYLA_DET_MUL(x, inv_ln2));
    const double r = HYLA_DET_ADD(HYLA_DET_ADD(x, -HYLA_DET_MUL(n, ln2_hi)), -HYLA_DET_MUL(n, ln2_lo));
    /* 1/k!, k = 13 .. 1 */
    const double c[13] = {1.6059043836821613e-10, 2.0876756987868099e-09, 2.5052108385441720e-08,
                          2.7557319223985893e-07, 2.7557319223985888e-06, 2.4801587301587302e-05,
                          1.9841269841269841e-04, 1.3888888888888889e-03, 8.3333333333333332e-03,
                          4.1666666666666664e-02, 1.6666666666666666e-01, 5.0000000000000000e-01,
                          1.0};
    double p = c[0];
    for (int i = 1; i < 13; i++) p = HYLA_DET_ADD(HYLA_DET_MUL(p, r), c[i]);
    p = HYLA_DET_ADD(HYLA_DET_MUL(p, r), 1.0);
    return ldexp(p, (int)n);
}

#endif
