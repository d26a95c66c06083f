/* hyla_bench_model.h — the model-side subcommands of hyla-bench (worker/hyla_bench_main.c):
 *   kernels  per-op and per-mixer timings on one device (--device cpu | cuda:N)
 *   e2e      prefill and decode tokens/s of a model directory (hyla-mkmodel makes one)
 * Each prints one JSON object per measurement on stdout (progress on stderr) and returns the
 * process exit status. Timings never feed test asserts; BENCHMARKS.md records them. */
#ifndef HYLA_BENCH_MODEL_H
#define HYLA_BENCH_MODEL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_util.h"

/* The benchmark programs' way out: a failed step ends the run with one line naming the step and
 * the library's message (a benchmark has no caller to hand an error to). */
#define HYLA_BENCH_DIE(prog, ...)               \
    do {                                        \
        fprintf(stderr, prog ": " __VA_ARGS__); \
        fprintf(stderr, "\n");                  \
        exit(1);                                \
    } while (0)
#define HYLA_BENCH_TRY(prog, call)                                                                         \
    do {                                                                                                  \
        hyla_status s_ = (call);                                                                          \
        if (s_ != HYLA_OK) HYLA_BENCH_DIE(prog, "%s: %s: %s", #call, hyla_status_str(s_), hyla_last_error()); \
    } while (0)

/* A comma-separated list of positive integers ("4096,32768") into out (at most max); the count.
 * Anything else (an empty item, a sign, a letter, 0, more than max items) exits 2 naming the
 * option opt and the text: a list that parsed as zeros ran the benchmark on nothing. */
static inline int hyla_bench_parse_list(const char *opt, const char *s, int *out, int max) {
    int n = 0;
    const char *p = s;
    while (p) {
        char item[32];
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        uint64_t v = 0;
        if (len < sizeof item) {
            memcpy(item, p, len);
            item[len] = 0;
        }
        if (len >= sizeof item || n == max || !hyla_parse_u64(item, 1, 1 << 30, &v)) {
            fprintf(stderr, "hyla-bench: %s: '%s' is not a comma-separated list of up to %d positive integers\n", opt,
                    s, max);
            exit(2);
        }
        out[n++] = (int)v;
        p = comma ? comma + 1 : NULL;
    }
    return n;
}

static inline int hyla_bench_cmpd(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
/* The median of v[0..n) (sorts v) */
static inline double hyla_bench_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof v[0], hyla_bench_cmpd);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The number s of option opt in [lo, hi] (a whole number when whole); anything else exits 2
 * naming the option and the text. */
static inline double hyla_bench_num(const char *opt, const char *s, double lo, double hi, int whole) {
    double v;
    if (!hyla_parse_num(s, lo, hi, &v) || (whole && v != (double)(long long)v)) {
        if (whole)
            fprintf(stderr, "hyla-bench: %s: '%s' is not a whole number from %.0f to %.0f\n", opt, s, lo, hi);
        else
            fprintf(stderr, "hyla-bench: %s: '%s' is not a number from %g to %g\n", opt, s, lo, hi);
        exit(2);
    }
    return v;
}

/* Where a subcommand's usage goes for argument arg: stdout for --help / -h (*help = 1), else
 * stderr after a line naming the argument it did not take (*help = 0). */
static inline FILE *hyla_bench_usage_to(const char *cmd, const char *arg, int *help) {
    *help = !strcmp(arg, "--help") || !strcmp(arg, "-h");
    if (!*help) fprintf(stderr, "hyla-bench %s: unknown option or missing value: %s\n", cmd, arg);
    return *help ? stdout : stderr;
}

int hyla_bench_kernels(int argc, char **argv);
int hyla_bench_e2e(int argc, char **argv);

#endif
