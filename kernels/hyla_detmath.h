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

/* sin x and cos x: x = n pi/2 + r with n = rint(x 2/pi) and pi/2 in three parts (33, 33 and 53
 * bits: n pi/2 is exact to ~2^-100 relative while |n| < 2^20, that is |x| < 1.6e6), |r| <= pi/4,
 * sin r and cos r by their Taylor series to r^17 / 17! and r^18 / 18! (Horner in r^2;
 * truncation below 2^-57), the quadrant from n mod 4. Within a few ulp of libm's; past 1.6e6
 * less accurate, still the same bits everywhere. */
HYLA_DET_FN void hyla_sincos_det(double x, double *sn, double *cs) {
    const double two_over_pi = 6.36619772367581382433e-01, pio2_1 = 1.57079632673412561417e+00,
                 pio2_2 = 6.07710050630396597660e-11, pio2_3 = 2.02226624871116645580e-21;
    const double n = rint(HYLA_DET_MUL(x, two_over_pi));
    double r = HYLA_DET_ADD(x, -HYLA_DET_MUL(n, pio2_1));
    r = HYLA_DET_ADD(r, -HYLA_DET_MUL(n, pio2_2));
    r = HYLA_DET_ADD(r, -HYLA_DET_MUL(n, pio2_3));
    const double z = HYLA_DET_MUL(r, r);
    /* (-1)^k / (2k + 1)!, k = 8 .. 1, and (-1)^k / (2k)!, k = 9 .. 1 */
    const double sc[8] = {2.8114572543455206e-15, -7.6471637318198164e-13, 1.6059043836821613e-10,
                          -2.5052108385441720e-08, 2.7557319223985893e-06, -1.9841269841269841e-04,
                          8.3333333333333332e-03, -1.6666666666666666e-01};
    const double cc[9] = {-1.5619206968586225e-16, 4.7794773323873853e-14, -1.1470745597729725e-11,
                          2.0876756987868099e-09, -2.7557319223985888e-07, 2.4801587301587302e-05,
                          -1.3888888888888889e-03, 4.1666666666666664e-02, -5.0000000000000000e-01};
    double ps = sc[0], pc = cc[0];
    for (int i = 1; i < 8; i++) ps = HYLA_DET_ADD(HYLA_DET_MUL(ps, z), sc[i]);
    for (int i = 1; i < 9; i++) pc = HYLA_DET_ADD(HYLA_DET_MUL(pc, z), cc[i]);
    const double s = HYLA_DET_ADD(r, HYLA_DET_MUL(HYLA_DET_MUL(r, z), ps));
    const double c = HYLA_DET_ADD(1.0, HYLA_DET_MUL(z, pc));
    switch ((int)((long long)n & 3)) {
    case 0: *sn = s, *cs = c; break;
    case 1: *sn = c, *cs = -s; break;
    case 2: *sn = -s, *cs = -c; break;
    default: *sn = -c, *cs = s; break;
    }
}

/* RoPE's angle for pair j of D at position pos, with ln_theta = log(theta) computed by the
 * caller's host (one libm call on one machine: the CPU backend and the CUDA backend's launch
 * both take it from the host): pos theta^(-2j/D), and its sine and cosine, the same bits on
 * every backend. */
HYLA_DET_FN void hyla_rope_det(int pos, int j, int D, double ln_theta, double *sn, double *cs) {
    const double f = hyla_exp_det(HYLA_DET_MUL(-2.0 * j / D, ln_theta));
    hyla_sincos_det(HYLA_DET_MUL((double)pos, f), sn, cs);
}

#endif
