/* test_detmath.c — kernels/hyla_detmath.h, the functions whose bits both backends share (the LTE
 * scorer's exponentials and RoPE un-rotation): each within a few ulp of libm over the ranges
 * the callers use, with the limits the callers rely on. That both backends give the same bits
 * is test_gpu_ops' LTE case (the CPU's and the GPU's scores, bit for bit). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_detmath.h"
#include "hyla_test.h"

/* ulps between two doubles of the same sign */
static double ulps(double a, double b) {
    if (a == b) return 0.0;
    return fabs(a - b) / (nextafter(fabs(b), INFINITY) - fabs(b));
}

static uint64_t rng = 88172645463325252ull;
static double unif(void) { /* [0, 1) */
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

static void test_exp(void) {
    double worst = 0.0, at = 0.0;
    for (int i = 0; i < 1000000; i++) {
        const double x = -700.0 + 1409.0 * unif();
        const double u = ulps(hyla_exp_det(x), exp(x));
        if (u > worst) worst = u, at = x;
    }
    printf("hyla_exp_det: worst %.2f ulp (at %.17g) over [-700, 709]\n", worst, at);
    CHECK_MSG(worst <= 4.0, "hyla_exp_det is %.2f ulp from exp at %.17g", worst, at);
    CHECK(hyla_exp_det(0.0) == 1.0);
    CHECK(hyla_exp_det(-800.0) == 0.0);
    CHECK(isinf(hyla_exp_det(710.0)));
    CHECK(isnan(hyla_exp_det(NAN)));
}

static void test_sincos(void) {
    double worst = 0.0, at = 0.0;
    for (int i = 0; i < 2000000; i++) {
        /* the first 1000 angles small, then up to 1.6e6 either sign (RoPE: position x frequency) */
        const double x = i < 1000 ? i * 1e-3 : (unif() * 2.0 - 1.0) * 1.6e6;
        double s, c;
        hyla_sincos_det(x, &s, &c);
        const double e = fmax(fabs(s - sin(x)), fabs(c - cos(x)));
        if (e > worst) worst = e, at = x;
    }
    printf("hyla_sincos_det: worst absolute error %.3g (at %.17g) for |x| <= 1.6e6\n", worst, at);
    CHECK_MSG(worst <= 4.5e-16, "hyla_sincos_det is %.3g from sin / cos at %.17g", worst, at);
    /* each quadrant's signs and exact points */
    double s, c;
    hyla_sincos_det(0.0, &s, &c);
    CHECK(s == 0.0 && c == 1.0);
    const double q[4] = {0.5, 2.0, 3.5, 5.5}; /* one angle in each quadrant */
    for (int k = 0; k < 4; k++) {
        hyla_sincos_det(q[k], &s, &c);
        CHECK_MSG(fabs(s - sin(q[k])) < 1e-15 && fabs(c - cos(q[k])) < 1e-15, "quadrant %d: %.17g %.17g", k, s, c);
        hyla_sincos_det(-q[k], &s, &c);
        CHECK_MSG(fabs(s + sin(q[k])) < 1e-15 && fabs(c - cos(q[k])) < 1e-15, "negative angle, quadrant %d", k);
    }
}

/* RoPE's angle and its sine and cosine against pow / sin / cos in double, for the positions and
 * head dims the LTE scorer sees */
static void test_rope(void) {
    const double theta = 10000.0, lt = log(theta);
    const int Ds[3] = {32, 64, 128}, pos[6] = {0, 1, 17, 2321, 4639, 1000000};
    double worst = 0.0;
    for (int d = 0; d < 3; d++)
        for (int p = 0; p < 6; p++)
            for (int j = 0; j < Ds[d] / 2; j++) {
                double s, c;
                hyla_rope_det(pos[p], j, Ds[d], lt, &s, &c);
                const double a = (double)pos[p] * pow(theta, -2.0 * j / Ds[d]);
                /* the angle's relative error (a few ulp of the frequency) times the angle */
                const double tol = 1e-15 + 8.0 * 2.2e-16 * a;
                const double e = fmax(fabs(s - sin(a)), fabs(c - cos(a)));
                if (e / tol > worst) worst = e / tol;
                CHECK_MSG(e <= tol, "hyla_rope_det pos %d j %d D %d: error %.3g (tolerance %.3g)", pos[p], j, Ds[d], e,
                          tol);
            }
    printf("hyla_rope_det: worst error %.2f of its tolerance\n", worst);
}

int main(void) {
    test_exp();
    test_sincos();
    test_rope();
    if (hyla_test_failures) {
        fprintf(stderr, "test_detmath: %d failure(s)\n", hyla_test_failures);
        return 1;
    }
    printf("test_detmath: ok\n");
    return 0;
}
