/* test_gpu_mamba2.c — Mamba2's ops on the CUDA backend (cuda:0) against the CPU reference:
 *   - ssd_decode over several steps (state carried) for N = 16, 128, 512 and P = 48, 64;
 *   - ssd_prefill (n = 1, 100, 130, 150, 200, nonzero initial state): the chunked path (GLA
 *     kernels on tensor cores) for N <= 256 and, through GLA's key slabs, N = 512; a binding
 *     time-step limit;
 *   - on the GPU, bit for bit: prefill over 64-token pieces == one call; a decode batch of 3
 *     == each session alone; decode steps logged into CUDA graphs == graphs off;
 *   - ssd_norm and copy2d; argument errors come back as statuses.
 * Tolerances (the classes of test_gpu_ops.c): recurrent paths are fp32 (rel, max <= 1e-4);
 * the chunked path multiplies bf16 operands (rel <= 2e-2, max <= 5e-2); the norm is fp32
 * (1e-5). Skips (77) without a usable GPU. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_cuda_extra.h"
#include "hyla_ops.h"
#include "hyla_test.h"

static hyla_backend *cpu, *gpu;
static hyla_rng rng;

static float *randn(size_t n, float scale) {
    float *x = malloc(n * sizeof(float) + 4);
    for (size_t i = 0; i < n; i++) x[i] = scale * hyla_rng_normal(&rng);
    return x;
}
static void *dev(hyla_backend *b, const void *host, size_t bytes) {
    void *p = NULL;
    if (b->ops->alloc(b->ctx, bytes ? bytes : 4, &p) != HYLA_OK) {
        fprintf(stderr, "alloc of %zu on %s failed: %s\n", bytes, b->ops->name, hyla_last_error());
        exit(1);
    }
    if (host && bytes) CHECK_OK(b->ops->upload(b->ctx, p, host, bytes));
    return p;
}
static float *host_of(hyla_backend *b, const void *d, size_t n) {
    float *h = malloc(n * sizeof(float) + 4);
    CHECK_OK(b->ops->download(b->ctx, h, d, n * sizeof(float)));
    return h;
}
static void dfree(hyla_backend *b, void *p) { b->ops->free(b->ctx, p); }

static void cmp(const char *what, const float *g, const float *c, size_t n, double tol_rel, double tol_max) {
    double num = 0, den = 0, mx = 0, mref = 0;
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)g[i] - (double)c[i];
        if (!isfinite(g[i]) && isfinite(c[i])) bad = 1;
        num += d * d;
        den += (double)c[i] * c[i];
        if (fabs(d) > mx) mx = fabs(d);
        if (fabs(c[i]) > mref) mref = fabs(c[i]);
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num), mrel = mref > 0 ? mx / mref : mx;
    int ok = !bad && rel <= tol_rel && mrel <= tol_max;
    printf("  %-52s rel %.2e  max %.2e  (tol %.0e/%.0e)  %s\n", what, rel, mrel, tol_rel, tol_max, ok ? "ok" : "FAIL");
    if (!ok) hyla_test_failures++;
}
static void cmp_dev(const char *what, hyla_backend *gb, const void *g, const void *c, size_t n, double tr, double tm) {
    float *hg = host_of(gb, g, n), *hc = host_of(cpu, c, n);
    cmp(what, hg, hc, n, tr, tm);
    free(hg);
    free(hc);
}
static int same(hyla_backend *b, const void *x, const void *y, size_t n) {
    float *hx = host_of(b, x, n), *hy = host_of(b, y, n);
    int r = !memcmp(hx, hy, n * sizeof(float));
    free(hx);
    free(hy);
    return r;
}

#define REC_TOL 1e-4, 1e-4
#define CHUNK_TOL 2e-2, 5e-2
#define FP32_TOL 1e-5, 1e-5

/* One case's inputs on the host. */
typedef struct {
    int n, H, P, G, N, ldx, ld_dt;
    float *xbc, *dt, *dt_bias, *A_log, *Dsk, *S0;
} ssd_in;

static ssd_in mk(int n, int H, int P, int G, int N) {
    ssd_in c = {n, H, P, G, N, H * P + 2 * G * N + 4, H + 3, NULL, NULL, NULL, NULL, NULL, NULL};
    c.xbc = randn((size_t)n * c.ldx, 0.7f);
    c.dt = randn((size_t)n * c.ld_dt, 1.5f);
    c.dt_bias = malloc((size_t)H * 4);
    c.A_log = malloc((size_t)H * 4);
    for (int h = 0; h < H; h++) {
        c.dt_bias[h] = -2.0f + 0.3f * (float)(h % 8);
        c.A_log[h] = logf(1.0f + 15.0f * hyla_rng_uniform(&rng));
    }
    c.Dsk = randn((size_t)H, 1.0f);
    c.S0 = randn((size_t)H * N * P, 0.3f);
    return c;
}
static void mk_free(ssd_in *c) { free(c->xbc), free(c->dt), free(c->dt_bias), free(c->A_log), free(c->Dsk), free(c->S0); }

/* The case's buffers on one backend. */
typedef struct {
    void *xbc, *dt, *bias, *alog, *D, *S, *y;
} ssd_dev;
static ssd_dev up(hyla_backend *b, const ssd_in *c) {
    ssd_dev d;
    d.xbc = dev(b, c->xbc, (size_t)c->n * c->ldx * 4);
    d.dt = dev(b, c->dt, (size_t)c->n * c->ld_dt * 4);
    d.bias = dev(b, c->dt_bias, (size_t)c->H * 4);
    d.alog = dev(b, c->A_log, (size_t)c->H * 4);
    d.D = dev(b, c->Dsk, (size_t)c->H * 4);
    d.S = dev(b, c->S0, (size_t)c->H * c->N * c->P * 4);
    d.y = dev(b, NULL, (size_t)c->n * c->H * c->P * 4);
    return d;
}
static void down(hyla_backend *b, ssd_dev *d) {
    dfree(b, d->xbc), dfree(b, d->dt), dfree(b, d->bias), dfree(b, d->alog), dfree(b, d->D), dfree(b, d->S),
        dfree(b, d->y);
}
static hyla_status pre(hyla_backend *b, const ssd_in *c, ssd_dev *d, int t0, int m, float lo, float hi) {
    return b->ops->ssd_prefill(b->ctx, (const float *)d->xbc + (size_t)t0 * c->ldx, c->ldx,
                               (const float *)d->dt + (size_t)t0 * c->ld_dt, c->ld_dt, d->bias, d->alog, d->D, lo, hi,
                               m, c->H, c->P, c->G, c->N, d->S, (float *)d->y + (size_t)t0 * c->H * c->P);
}

static void test_prefill(int n, int H, int P, int G, int N, float hi) {
    ssd_in c = mk(n, H, P, G, N);
    ssd_dev dc = up(cpu, &c), dg = up(gpu, &c);
    CHECK_OK(pre(cpu, &c, &dc, 0, n, 0.0f, hi));
    CHECK_OK(pre(gpu, &c, &dg, 0, n, 0.0f, hi));
    CHECK_OK(gpu->ops->sync(gpu->ctx));
    char w[128];
    size_t yn = (size_t)n * H * P, sn = (size_t)H * N * P;
    snprintf(w, sizeof w, "ssd_prefill n=%d H=%d P=%d G=%d N=%d%s: y", n, H, P, G, N, isinf(hi) ? "" : " limit");
    cmp_dev(w, gpu, dg.y, dc.y, yn, CHUNK_TOL); /* every N is chunked (N = 512 as key slabs) */
    snprintf(w, sizeof w, "ssd_prefill n=%d N=%d: S", n, N);
    cmp_dev(w, gpu, dg.S, dc.S, sn, CHUNK_TOL);
    if (n > 64) { /* 64-token pieces == one call, bit for bit */
        ssd_dev d2 = up(gpu, &c);
        for (int t0 = 0; t0 < n; t0 += 64) CHECK_OK(pre(gpu, &c, &d2, t0, n - t0 < 64 ? n - t0 : 64, 0.0f, hi));
        CHECK_MSG(same(gpu, d2.y, dg.y, yn) && same(gpu, d2.S, dg.S, sn),
                  "ssd_prefill n=%d N=%d: 64-token pieces differ from one call on the GPU", n, N);
        down(gpu, &d2);
    }
    down(cpu, &dc), down(gpu, &dg);
    mk_free(&c);
}

/* T decode steps of B sessions (each session its own state), GPU vs CPU; then the batch vs
 * each session alone on the GPU (bits). */
static void test_decode(int B, int H, int P, int G, int N) {
    enum { T = 6 };
    ssd_in c = mk(B * T, H, P, G, N);
    size_t sn = (size_t)H * N * P;
    void *Sc[4], *Sg[4], *Sa[4];
    for (int b = 0; b < B; b++) {
        float *s0 = randn(sn, 0.3f);
        Sc[b] = dev(cpu, s0, sn * 4);
        Sg[b] = dev(gpu, s0, sn * 4);
        Sa[b] = dev(gpu, s0, sn * 4);
        free(s0);
    }
    ssd_dev dc = up(cpu, &c), dg = up(gpu, &c);
    void *ya = dev(gpu, NULL, (size_t)B * T * H * P * 4);
    for (int t = 0; t < T; t++) {
        size_t r0 = (size_t)t * B;
        CHECK_OK(cpu->ops->ssd_decode(cpu->ctx, (const float *)dc.xbc + r0 * c.ldx, c.ldx, (const float *)dc.dt + r0 * c.ld_dt,
                                      c.ld_dt, dc.bias, dc.alog, dc.D, 0.0f, INFINITY, B, H, P, G, N, (float *const *)Sc,
                                      (float *)dc.y + r0 * H * P));
        CHECK_OK(gpu->ops->ssd_decode(gpu->ctx, (const float *)dg.xbc + r0 * c.ldx, c.ldx, (const float *)dg.dt + r0 * c.ld_dt,
                                      c.ld_dt, dg.bias, dg.alog, dg.D, 0.0f, INFINITY, B, H, P, G, N, (float *const *)Sg,
                                      (float *)dg.y + r0 * H * P));
        for (int b = 0; b < B; b++)
            CHECK_OK(gpu->ops->ssd_decode(gpu->ctx, (const float *)dg.xbc + (r0 + b) * c.ldx, c.ldx,
                                          (const float *)dg.dt + (r0 + b) * c.ld_dt, c.ld_dt, dg.bias, dg.alog, dg.D, 0.0f,
                                          INFINITY, 1, H, P, G, N, (float *const *)&Sa[b], (float *)ya + (r0 + b) * H * P));
    }
    char w[128];
    snprintf(w, sizeof w, "ssd_decode B=%d x %d steps H=%d P=%d G=%d N=%d: y", B, T, H, P, G, N);
    cmp_dev(w, gpu, dg.y, dc.y, (size_t)B * T * H * P, REC_TOL);
    snprintf(w, sizeof w, "ssd_decode N=%d: S (session 0)", N);
    cmp_dev(w, gpu, Sg[0], Sc[0], sn, REC_TOL);
    int eq = same(gpu, ya, dg.y, (size_t)B * T * H * P);
    for (int b = 0; b < B; b++) eq &= same(gpu, Sa[b], Sg[b], sn);
    CHECK_MSG(eq, "ssd_decode N=%d: a batch differs from its sessions alone on the GPU", N);
    for (int b = 0; b < B; b++) dfree(cpu, Sc[b]), dfree(gpu, Sg[b]), dfree(gpu, Sa[b]);
    dfree(gpu, ya);
    down(cpu, &dc), down(gpu, &dg);
    mk_free(&c);
}

/* A decode step as the mixer issues it (copy2d, ssd_decode, ssd_norm), 4 times with the same
 * pointers: logged and replayed as a CUDA graph == graphs off, bit for bit. */
static void run_steps(int graphs, const ssd_in *c, float *out) {
    CHECK_OK(hyla_cuda_set_graphs(gpu, graphs));
    int H = c->H, P = c->P, G = c->G, N = c->N, I = H * P, Cc = I + 2 * G * N, Din = I + Cc + H;
    float *zxd = randn((size_t)Din, 1.0f);
    void *dz = dev(gpu, zxd, (size_t)Din * 4), *dxbc = dev(gpu, NULL, (size_t)Cc * 4), *dy = dev(gpu, NULL, (size_t)I * 4);
    void *S = dev(gpu, c->S0, (size_t)H * N * P * 4), *bias = dev(gpu, c->dt_bias, (size_t)H * 4);
    void *alog = dev(gpu, c->A_log, (size_t)H * 4), *D = dev(gpu, c->Dsk, (size_t)H * 4), *w = dev(gpu, zxd, (size_t)I * 4);
    for (int k = 0; k < 4; k++) {
        CHECK_OK(gpu->ops->copy2d(gpu->ctx, dxbc, Cc, (const float *)dz + I, Din, 1, Cc));
        CHECK_OK(gpu->ops->ssd_decode(gpu->ctx, dxbc, Cc, (const float *)dz + I + Cc, Din, bias, alog, D, 0.0f, INFINITY, 1, H,
                                      P, G, N, (float *const *)&S, dy));
        CHECK_OK(gpu->ops->ssd_norm(gpu->ctx, dy, dz, Din, w, dy, 1, G, I / G, 1e-5f));
        CHECK_OK(gpu->ops->add(gpu->ctx, (float *)dz + I, dy, (size_t)(I < Cc ? I : Cc))); /* feed back */
        CHECK_OK(gpu->ops->sync(gpu->ctx)); /* one logged segment per step: captured, then replayed */
    }
    float *hs = host_of(gpu, S, (size_t)H * N * P), *hy = host_of(gpu, dy, (size_t)I);
    memcpy(out, hy, (size_t)I * 4);
    memcpy(out + I, hs, (size_t)H * N * P * 4);
    free(hs), free(hy), free(zxd);
    dfree(gpu, dz), dfree(gpu, dxbc), dfree(gpu, dy), dfree(gpu, S), dfree(gpu, bias), dfree(gpu, alog), dfree(gpu, D),
        dfree(gpu, w);
}
static void test_graphs(void) {
    ssd_in c = mk(1, 4, 64, 2, 128);
    size_t n = (size_t)4 * 64 + (size_t)4 * 128 * 64;
    float *a = malloc(n * 4), *b = malloc(n * 4);
    hyla_rng keep = rng;
    run_steps(0, &c, a);
    rng = keep;
    run_steps(1, &c, b);
    hyla_cuda_graph_stats gs;
    CHECK_OK(hyla_cuda_get_graph_stats(gpu, &gs));
    printf("  mixer decode steps: graphs on == off: %s (%llu graph launches)\n", memcmp(a, b, n * 4) ? "FAIL" : "bits",
           (unsigned long long)gs.replays);
    CHECK_MSG(!memcmp(a, b, n * 4), "mamba2 decode steps with CUDA graphs differ from graphs off");
    free(a), free(b);
    mk_free(&c);
}

static void test_norm_copy(void) {
    int rows = 37, G = 4, gs = 96, ldz = G * gs + 11;
    size_t Dm = (size_t)G * gs;
    float *o = randn(rows * Dm, 1.0f), *z = randn((size_t)rows * ldz, 1.5f), *w = randn(Dm, 1.0f);
    void *oc = dev(cpu, o, rows * Dm * 4), *og = dev(gpu, o, rows * Dm * 4);
    void *zc = dev(cpu, z, (size_t)rows * ldz * 4), *zg = dev(gpu, z, (size_t)rows * ldz * 4);
    void *wc = dev(cpu, w, Dm * 4), *wg = dev(gpu, w, Dm * 4);
    CHECK_OK(cpu->ops->ssd_norm(cpu->ctx, oc, zc, ldz, wc, oc, rows, G, gs, 1e-5f));
    CHECK_OK(gpu->ops->ssd_norm(gpu->ctx, og, zg, ldz, wg, og, rows, G, gs, 1e-5f));
    cmp_dev("ssd_norm rows=37 G=4 gs=96 (in place)", gpu, og, oc, rows * Dm, FP32_TOL);
    void *dg = dev(gpu, NULL, (size_t)rows * 50 * 4);
    CHECK_OK(gpu->ops->copy2d(gpu->ctx, dg, 50, (const float *)zg + 7, ldz, rows, 40));
    float *h = host_of(gpu, dg, (size_t)rows * 50);
    int ok = 1;
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < 40; j++) ok &= h[r * 50 + j] == z[(size_t)r * ldz + 7 + j];
    CHECK_MSG(ok, "copy2d on the GPU: wrong elements");
    CHECK(gpu->ops->copy2d(gpu->ctx, dg, 30, zg, ldz, rows, 40) != HYLA_OK);
    CHECK(gpu->ops->ssd_norm(gpu->ctx, og, zg, 3, wg, og, rows, G, gs, 1e-5f) != HYLA_OK);
    CHECK(gpu->ops->ssd_prefill(gpu->ctx, zg, 5, zg, 8, wg, wg, wg, 0, INFINITY, 1, 3, 2, 2, 2, dg, og) != HYLA_OK);
    CHECK_OK(gpu->ops->sync(gpu->ctx));
    free(o), free(z), free(w), free(h);
    dfree(cpu, oc), dfree(gpu, og), dfree(cpu, zc), dfree(gpu, zg), dfree(cpu, wc), dfree(gpu, wg), dfree(gpu, dg);
}

int main(void) {
    if (!hyla_cuda_available()) {
        printf("test_gpu_mamba2: SKIPPED — no usable CUDA device (or the CUDA backend is not built)\n");
        return 77;
    }
    hyla_rng_seed(&rng, 1357);
    if (hyla_cpu_backend_create(0, &cpu) != HYLA_OK || hyla_cuda_backend_create(0, &gpu) != HYLA_OK) {
        fprintf(stderr, "test_gpu_mamba2: %s\n", hyla_last_error());
        return 1;
    }
    test_prefill(1, 4, 64, 2, 128, INFINITY);
    test_prefill(100, 4, 64, 2, 128, INFINITY);
    test_prefill(200, 8, 48, 4, 16, INFINITY);
    test_prefill(130, 4, 64, 1, 128, 0.05f);
    test_prefill(150, 2, 64, 2, 512, INFINITY);
    test_decode(3, 4, 64, 2, 128);
    test_decode(3, 8, 48, 4, 16);
    test_decode(2, 2, 64, 2, 512);
    test_norm_copy();
    test_graphs();
    CHECK_OK(gpu->ops->sync(gpu->ctx));
    hyla_backend_destroy(gpu);
    hyla_backend_destroy(cpu);
    return hyla_test_done("test_gpu_mamba2");
}
