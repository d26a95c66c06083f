/* test_cpu_mamba2.c — Mamba2's ops on the CPU reference backend (kernels/cpu/cpu_mamba2.c):
 *   - ssd_decode against a naive double-precision recurrence written from [M2-1, M2-2]
 *     (softplus, clamp to the time-step limits, grouped B and C, D skip), nonzero initial
 *     states, strong decays (dt up to ~5 with A up to -16: per-token decay e^-80);
 *   - chunked ssd_prefill == the decode loop (n = 1, 5, 64, 100, 130), and == its 64-token
 *     pieces bit for bit; a decode batch == each session alone, bit for bit;
 *   - the time-step limits clamp (a limit that cuts dt changes the output as the reference
 *     says); the thread count changes no bit;
 *   - ssd_norm (gate before norm, per group) and copy2d against direct references; argument
 *     errors are refused.
 *
 * Tolerances as test_cpu_mixers.c (same arithmetic: fp32 with cumulative log decays in
 * double, reference in double): ATOL 2e-5 + RTOL 1e-4. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_ops.h"
#include "hyla_test.h"

#define ATOL 2e-5
#define RTOL 1e-4

static hyla_backend *be;
static const hyla_ops *ops;
static void *ctx;
static hyla_rng rng;

static float *randn(size_t n, float scale) {
    float *x = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = scale * hyla_rng_normal(&rng);
    return x;
}
static float *dup(const float *x, size_t n) {
    float *y = malloc(n * sizeof(float));
    memcpy(y, x, n * sizeof(float));
    return y;
}

typedef struct {
    int n, H, P, G, N, ldx, ld_dt;
    float *xbc, *dt; /* [n][ldx], [n][ld_dt] */
    float *dt_bias, *A_log, *Dsk; /* [H] */
    float *S0;       /* [H][N][P] */
    float lo, hi;
} ssd_case;

static ssd_case ssd_make(int n, int H, int P, int G, int N) {
    ssd_case c = {n, H, P, G, N, H * P + 2 * G * N + 3, H + 2, NULL, NULL, NULL, NULL, NULL, NULL, 0.0f, INFINITY};
    c.xbc = randn((size_t)n * c.ldx, 0.7f);
    c.dt = randn((size_t)n * c.ld_dt, 1.5f);
    c.dt_bias = malloc((size_t)H * sizeof(float));
    c.A_log = malloc((size_t)H * sizeof(float));
    for (int h = 0; h < H; h++) {
        c.dt_bias[h] = (float)(-2.0 + 0.5 * h);
        c.A_log[h] = (float)log(1.0 + 15.0 * hyla_rng_uniform(&rng));
    }
    c.Dsk = randn((size_t)H, 1.0f);
    c.S0 = randn((size_t)H * N * P, 0.5f);
    return c;
}
static void ssd_free(ssd_case *c) {
    free(c->xbc), free(c->dt), free(c->dt_bias), free(c->A_log), free(c->Dsk), free(c->S0);
}

/* The double reference: token t, all heads. S [H][N][P] double; y [H][P]. */
static void ssd_ref_step(const ssd_case *c, int t, double *S, double *y) {
    int H = c->H, P = c->P, G = c->G, N = c->N;
    const float *row = c->xbc + (size_t)t * c->ldx;
    for (int h = 0; h < H; h++) {
        int g = h / (H / G);
        double z = (double)c->dt[(size_t)t * c->ld_dt + h] + c->dt_bias[h];
        double dtp = z > 20 ? z : log1p(exp(z));
        if (dtp < c->lo) dtp = c->lo;
        if (dtp > c->hi) dtp = c->hi;
        double d = exp(-exp((double)c->A_log[h]) * dtp);
        const float *x = row + (size_t)h * P, *Bg = row + (size_t)H * P + (size_t)g * N;
        const float *Cg = row + (size_t)H * P + (size_t)G * N + (size_t)g * N;
        double *Sh = S + (size_t)h * N * P;
        for (int i = 0; i < N; i++)
            for (int j = 0; j < P; j++) Sh[(size_t)i * P + j] = d * Sh[(size_t)i * P + j] + Bg[i] * dtp * x[j];
        for (int j = 0; j < P; j++) {
            double a = 0;
            for (int i = 0; i < N; i++) a += Cg[i] * Sh[(size_t)i * P + j];
            y[(size_t)h * P + j] = a + (double)c->Dsk[h] * x[j];
        }
    }
}

static hyla_status prefill(const ssd_case *c, int t0, int m, float *S, float *y) {
    return ops->ssd_prefill(ctx, c->xbc + (size_t)t0 * c->ldx, c->ldx, c->dt + (size_t)t0 * c->ld_dt, c->ld_dt,
                            c->dt_bias, c->A_log, c->Dsk, c->lo, c->hi, m, c->H, c->P, c->G, c->N, S,
                            y + (size_t)t0 * c->H * c->P);
}

static void test_ssd(float lo, float hi) {
    int ns[] = {1, 5, 64, 100, 130};
    int H = 4, P = 12, G = 2, N = 16;
    for (size_t z = 0; z < sizeof ns / sizeof ns[0]; z++) {
        int n = ns[z];
        ssd_case c = ssd_make(n, H, P, G, N);
        c.lo = lo;
        c.hi = hi;
        size_t SN = (size_t)H * N * P, YN = (size_t)n * H * P;
        double *Sr = malloc(SN * sizeof(double)), *yr = malloc(YN * sizeof(double));
        for (size_t i = 0; i < SN; i++) Sr[i] = c.S0[i];
        for (int t = 0; t < n; t++) ssd_ref_step(&c, t, Sr, yr + (size_t)t * H * P);
        float *y_ref = malloc(YN * sizeof(float)), *S_ref = malloc(SN * sizeof(float));
        for (size_t i = 0; i < YN; i++) y_ref[i] = (float)yr[i];
        for (size_t i = 0; i < SN; i++) S_ref[i] = (float)Sr[i];
        float *Sd = dup(c.S0, SN), *yd = malloc(YN * sizeof(float));
        for (int t = 0; t < n; t++) {
            float *Sp[1] = {Sd};
            CHECK_OK(ops->ssd_decode(ctx, c.xbc + (size_t)t * c.ldx, c.ldx, c.dt + (size_t)t * c.ld_dt, c.ld_dt, c.dt_bias,
                                     c.A_log, c.Dsk, lo, hi, 1, H, P, G, N, Sp, yd + (size_t)t * H * P));
        }
        float *Sc = dup(c.S0, SN), *yc = malloc(YN * sizeof(float));
        CHECK_OK(prefill(&c, 0, n, Sc, yc));
        char what[96];
        snprintf(what, sizeof what, "ssd [%g,%g] n=%d decode vs double: y", lo, hi, n);
        CHECK_CLOSE(yd, y_ref, YN, ATOL, RTOL, what);
        snprintf(what, sizeof what, "ssd [%g,%g] n=%d decode vs double: S", lo, hi, n);
        CHECK_CLOSE(Sd, S_ref, SN, ATOL, RTOL, what);
        snprintf(what, sizeof what, "ssd [%g,%g] n=%d prefill vs decode: y", lo, hi, n);
        CHECK_CLOSE(yc, yd, YN, ATOL, RTOL, what);
        snprintf(what, sizeof what, "ssd [%g,%g] n=%d prefill vs decode: S", lo, hi, n);
        CHECK_CLOSE(Sc, Sd, SN, ATOL, RTOL, what);
        if (n > 64) {
            float *S2 = dup(c.S0, SN), *y2 = malloc(YN * sizeof(float));
            for (int t0 = 0; t0 < n; t0 += 64) CHECK_OK(prefill(&c, t0, n - t0 < 64 ? n - t0 : 64, S2, y2));
            CHECK_MSG(!memcmp(S2, Sc, SN * sizeof(float)) && !memcmp(y2, yc, YN * sizeof(float)),
                      "ssd n=%d: prefill in 64-token pieces differs from one call", n);
            free(S2), free(y2);
        }
        free(Sr), free(yr), free(y_ref), free(S_ref), free(Sd), free(yd), free(Sc), free(yc);
        ssd_free(&c);
    }
}

/* A limit that binds changes the result exactly as the reference's clamp does (checked above);
 * here: that it binds at all (a clamp ignored would leave the output unchanged). */
static void test_limits_bind(void) {
    ssd_case c = ssd_make(20, 2, 8, 1, 8);
    size_t SN = (size_t)2 * 8 * 8, YN = (size_t)20 * 2 * 8;
    float *S1 = dup(c.S0, SN), *S2 = dup(c.S0, SN), *y1 = malloc(YN * sizeof(float)), *y2 = malloc(YN * sizeof(float));
    CHECK_OK(prefill(&c, 0, 20, S1, y1));
    c.hi = 0.05f;
    CHECK_OK(prefill(&c, 0, 20, S2, y2));
    CHECK_MSG(memcmp(y1, y2, YN * sizeof(float)) != 0, "ssd: time_step_limit max 0.05 changed nothing");
    free(S1), free(S2), free(y1), free(y2);
    ssd_free(&c);
}

static void test_decode_batch(void) {
    int B = 3, H = 4, P = 8, G = 2, N = 8;
    ssd_case c = ssd_make(B, H, P, G, N);
    size_t SN = (size_t)H * N * P, YN = (size_t)B * H * P;
    float *Sb[3], *Sa[3], *yb = malloc(YN * sizeof(float)), *ya = malloc(YN * sizeof(float));
    for (int b = 0; b < B; b++) {
        Sb[b] = randn(SN, 0.5f);
        Sa[b] = dup(Sb[b], SN);
    }
    CHECK_OK(ops->ssd_decode(ctx, c.xbc, c.ldx, c.dt, c.ld_dt, c.dt_bias, c.A_log, c.Dsk, 0, INFINITY, B, H, P, G, N, Sb, yb));
    for (int b = 0; b < B; b++)
        CHECK_OK(ops->ssd_decode(ctx, c.xbc + (size_t)b * c.ldx, c.ldx, c.dt + (size_t)b * c.ld_dt, c.ld_dt, c.dt_bias,
                                 c.A_log, c.Dsk, 0, INFINITY, 1, H, P, G, N, &Sa[b], ya + (size_t)b * H * P));
    CHECK_MSG(!memcmp(ya, yb, YN * sizeof(float)), "ssd: a decode batch differs from its sessions alone");
    for (int b = 0; b < B; b++) {
        CHECK_MSG(!memcmp(Sa[b], Sb[b], SN * sizeof(float)), "ssd: batch state %d differs", b);
        free(Sa[b]), free(Sb[b]);
    }
    free(ya), free(yb);
    ssd_free(&c);
}

static void test_threads(void) {
    hyla_backend *b1 = NULL;
    CHECK_OK(hyla_cpu_backend_create(1, &b1));
    if (!b1) return;
    ssd_case c = ssd_make(100, 4, 8, 2, 8);
    size_t SN = (size_t)4 * 8 * 8, YN = (size_t)100 * 4 * 8;
    float *S1 = dup(c.S0, SN), *S2 = dup(c.S0, SN), *y1 = malloc(YN * sizeof(float)), *y2 = malloc(YN * sizeof(float));
    CHECK_OK(prefill(&c, 0, 100, S1, y1));
    CHECK_OK(b1->ops->ssd_prefill(b1->ctx, c.xbc, c.ldx, c.dt, c.ld_dt, c.dt_bias, c.A_log, c.Dsk, 0, INFINITY, 100, 4, 8,
                                  2, 8, S2, y2));
    CHECK_MSG(!memcmp(S1, S2, SN * sizeof(float)) && !memcmp(y1, y2, YN * sizeof(float)),
              "ssd: 1 thread and 2 threads differ");
    free(S1), free(S2), free(y1), free(y2);
    ssd_free(&c);
    hyla_backend_destroy(b1);
}

static void test_norm_copy(void) {
    int rows = 5, G = 2, gs = 6, ldz = 20;
    size_t Dm = (size_t)G * gs;
    float *o = randn(rows * Dm, 1.0f), *z = randn((size_t)rows * ldz, 1.5f), *w = randn(Dm, 1.0f);
    float *y = malloc(rows * Dm * sizeof(float)), *yr = malloc(rows * Dm * sizeof(float));
    float eps = 1e-5f;
    for (int r = 0; r < rows; r++)
        for (int g = 0; g < G; g++) {
            double u[64], ss = 0;
            for (int j = 0; j < gs; j++) {
                double zz = z[(size_t)r * ldz + g * gs + j];
                u[j] = o[r * Dm + g * gs + j] * zz / (1.0 + exp(-zz));
                ss += u[j] * u[j];
            }
            double inv = 1.0 / sqrt(ss / gs + eps);
            for (int j = 0; j < gs; j++) yr[r * Dm + g * gs + j] = (float)(u[j] * inv * w[g * gs + j]);
        }
    CHECK_OK(ops->ssd_norm(ctx, o, z, ldz, w, y, rows, G, gs, eps));
    CHECK_CLOSE(y, yr, rows * Dm, 1e-6, 1e-5, "ssd_norm vs double");
    CHECK_OK(ops->ssd_norm(ctx, o, z, ldz, w, o, rows, G, gs, eps)); /* in place */
    CHECK_MSG(!memcmp(o, y, rows * Dm * sizeof(float)), "ssd_norm in place differs");
    CHECK(ops->ssd_norm(ctx, o, z, 3, w, y, rows, G, gs, eps) != HYLA_OK);
    /* copy2d: a column slice */
    float *d = calloc((size_t)rows * 7, sizeof(float));
    CHECK_OK(ops->copy2d(ctx, d, 7, z + 3, ldz, rows, 5));
    int ok = 1;
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < 7; j++) ok &= d[r * 7 + j] == (j < 5 ? z[(size_t)r * ldz + 3 + j] : 0.0f);
    CHECK_MSG(ok, "copy2d: wrong elements");
    CHECK(ops->copy2d(ctx, d, 4, z, ldz, rows, 5) != HYLA_OK);
    /* ssd argument errors: groups that do not divide the heads, a short row stride */
    float *S[1] = {d};
    CHECK(ops->ssd_decode(ctx, z, 100, z, 8, w, w, w, 0, INFINITY, 1, 3, 2, 2, 2, S, y) != HYLA_OK);
    CHECK(ops->ssd_prefill(ctx, z, 5, z, 8, w, w, w, 0, INFINITY, 1, 2, 2, 1, 2, d, y) != HYLA_OK);
    free(o), free(z), free(w), free(y), free(yr), free(d);
}

int main(void) {
    hyla_rng_seed(&rng, 2718);
    CHECK_OK(hyla_cpu_backend_create(2, &be));
    if (!be) return hyla_test_done("test_cpu_mamba2");
    ops = be->ops;
    ctx = be->ctx;
    test_ssd(0.0f, INFINITY);
    test_ssd(0.01f, 0.5f);
    test_limits_bind();
    test_decode_batch();
    test_threads();
    test_norm_copy();
    hyla_backend_destroy(be);
    return hyla_test_done("test_cpu_mamba2");
}
