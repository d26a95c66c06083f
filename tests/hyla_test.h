/* hyla_test.h — a tiny test harness: CHECK macros that count failures and keep going,
 * tolerance helpers, and paths to the build. Tests exit 0 on success, 1 on failure,
 * 77 when skipped (ctest SKIP_RETURN_CODE) after printing why. */
#ifndef HYLA_TEST_H
#define HYLA_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int hyla_test_failures = 0;

#define CHECK(cond)                                                                   \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);           \
            hyla_test_failures++;                                                     \
        }                                                                             \
    } while (0)

#define CHECK_MSG(cond, ...)                                                          \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);           \
            fprintf(stderr, __VA_ARGS__);                                             \
            fprintf(stderr, "\n");                                                    \
            hyla_test_failures++;                                                     \
        }                                                                             \
    } while (0)

#define CHECK_OK(expr)                                                                \
    do {                                                                              \
        hyla_status s_ = (expr);                                                      \
        if (s_ != HYLA_OK) {                                                          \
            fprintf(stderr, "FAIL %s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #expr,  \
                    hyla_status_str(s_), hyla_last_error());                          \
            hyla_test_failures++;                                                     \
        }                                                                             \
    } while (0)

/* Largest |a-b| / (atol + rtol*|b|) over n elements; <= 1 means within tolerance. */
static inline double hyla_test_max_violation(const float *a, const float *b, size_t n, double atol,
                                             double rtol, size_t *worst) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]) / (atol + rtol * fabs((double)b[i]));
        if (!(d <= m)) { /* catches NaN */
            m = isnan(d) ? INFINITY : d;
            if (worst) *worst = i;
        }
    }
    return m;
}

/* ||a - b|| / ||b|| over n elements (||a - b|| where b is all zero). */
static inline double hyla_test_rel_l2(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

#define CHECK_CLOSE(a, b, n, atol, rtol, what)                                              \
    do {                                                                                    \
        size_t w_ = 0;                                                                      \
        double v_ = hyla_test_max_violation((a), (b), (n), (atol), (rtol), &w_);            \
        if (!(v_ <= 1.0)) {                                                                 \
            fprintf(stderr, "FAIL %s:%d: %s: element %zu: %.8g vs %.8g (atol %g rtol %g)\n", \
                    __FILE__, __LINE__, (what), w_, (double)(a)[w_], (double)(b)[w_],       \
                    (double)(atol), (double)(rtol));                                        \
            hyla_test_failures++;                                                           \
        }                                                                                   \
    } while (0)

static inline int hyla_test_done(const char *name) {
    if (hyla_test_failures) {
        fprintf(stderr, "%s: %d check(s) failed\n", name, hyla_test_failures);
        return 1;
    }
    printf("%s: ok\n", name);
    return 0;
}

static inline const char *hyla_test_env(const char *name, const char *dflt) {
    const char *v = getenv(name);
    return v && *v ? v : dflt;
}

#endif
