/* test_gpu_ops.c — every op of each device backend (today the CUDA backend, cuda:0) against the
 * CPU reference backend, driven by one table of op cases (`cases` at the end: one row per op
 * and shape; a row's function runs it on both backends and compares), plus the device-only
 * properties the engine relies on:
 *   - memory ops, the state pool (slot reuse, reserve, stats), async snapshot/restore copies;
 *   - chunked prefill over n tokens == prefill over its 64-token pieces, bit for bit, for
 *     GLA, GDN, SSE (both transitions) and attention; varlen batches == each sequence alone;
 *   - errors (bad token id, missing KV page, bad shapes) come back as statuses.
 * Modes: `test_gpu_ops [OP-SUBSTRING]` runs the rows whose op contains the substring (all by
 * default); `--perf` also times each row's device calls (synced, wall clock) and prints one
 * PERF line per row. Skips (exit 77, with a message) when no device is usable.
 *
 * Inputs are drawn from a seeded RNG; weights and table entries are rounded to bf16 first so
 * that GPU weight storage (bf16) is exact and only the kernels' own arithmetic differs.
 * Metrics per comparison: rel = ||gpu - cpu||_2 / ||cpu||_2 and max = max|gpu - cpu| /
 * max|cpu|. Tolerances, by the precision each path computes in:
 *   - fp32 elementwise/row ops (norms, gates, rope, conv, softmax): the GPU sums in fp32 in
 *     another order than the CPU's double: rel <= 1e-5, max <= 1e-5 (observed ~1e-7).
 *   - linear: x is rounded to bf16 for cuBLAS (relative error 2^-9 per product), fp32
 *     accumulation: rel <= 1e-2, max <= 3e-2 (expected ~2e-3).
 *   - recurrent decode, token-loop prefill (fp32 states and math): rel, max <= 1e-4.
 *   - chunked prefill on tensor cores (bf16 operands: q, k, the chunk's gates, the state as an
 *     operand; fp32 accumulation and fp32 state between chunks): rel <= 2e-2, max <= 5e-2.
 *   - attention (keys/values stored bf16, P rounded to bf16 for P V): rel <= 2e-2, max <= 5e-2.
 *   - sampling: greedy rows must match exactly; sampled rows may differ only where fp32 vs
 *     double probabilities straddle the draw (a handful per thousand at most): <= 2 of 96.
 *   - SSE routes: identical indices (logits drawn with margins), weights within 1e-6.
 *   - DLA: identical boundaries and merges (states in use, counts); outputs, scores and states
 *     rel, max <= 1e-4 (the CPU's fp32 operations per element; the score's double sum in another
 *     order), and on the GPU prefill == pieces == decode loop, batch == alone, bit for bit. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hyla_ops.h"
#include "hyla_test.h"
#if __has_include("hyla_cuda_pool.h")
#include "hyla_cuda_pool.h"
#define HAVE_POOL_API 1
#endif
#include "hyla_cuda_extra.h"

/* cpu: the reference; gpu: the backend under test (each device backend in turn, see main) */
static hyla_backend *cpu, *gpu;
static hyla_rng rng;

/* Perf mode (--perf): the device calls of a case run inside PERF(...), which syncs, times the
 * call and adds it to the case's total; the case table prints the totals. */
static int perf_mode;
static double perf_ms;
static int perf_calls;
static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}
#define PERF(expr)                                                                                                     \
    do {                                                                                                               \
        if (perf_mode) CHECK_OK(gpu->ops->sync(gpu->ctx));                                                             \
        double perf_t0_ = perf_mode ? now_ms() : 0;                                                                    \
        expr;                                                                                                          \
        if (perf_mode) {                                                                                               \
            CHECK_OK(gpu->ops->sync(gpu->ctx));                                                                        \
            perf_ms += now_ms() - perf_t0_;                                                                            \
            perf_calls++;                                                                                              \
        }                                                                                                              \
    } while (0)

/* ---------------------------------------------------------------- helpers */

static float *randn(size_t n, float scale) {
    float *x = malloc(n * sizeof(float) + 4);
    for (size_t i = 0; i < n; i++) x[i] = scale * hyla_rng_normal(&rng);
    return x;
}
static float *randu(size_t n, float lo, float hi) {
    float *x = malloc(n * sizeof(float) + 4);
    for (size_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * hyla_rng_uniform(&rng);
    return x;
}
static void round_bf16(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = hyla_bf16_to_f32(hyla_f32_to_bf16(x[i]));
}
static void *dev(hyla_backend *b, const void *host, size_t bytes) {
    void *p = NULL;
    hyla_status s = b->ops->alloc(b->ctx, bytes ? bytes : 4, &p);
    if (s != HYLA_OK) {
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

/* A buffer present on both backends with the same initial contents. */
typedef struct {
    void *c, *g;
    size_t n; /* floats (or 4-byte elements) */
} pair;
static pair pair_new(const void *host, size_t n) {
    pair p = {dev(cpu, host, n * 4), dev(gpu, host, n * 4), n};
    return p;
}
static void pair_free(pair p) {
    dfree(cpu, p.c);
    dfree(gpu, p.g);
}

static int n_cmp, n_cmp_fail;
/* Compare the GPU result with the CPU one; print one line per comparison. */
static void cmp(const char *what, const float *g, const float *c, size_t n, double tol_rel, double tol_max) {
    double num = 0, den = 0, mx = 0, mref = 0;
    size_t worst = 0;
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)g[i] - (double)c[i];
        if (!isfinite(g[i]) && isfinite(c[i])) bad = 1;
        num += d * d;
        den += (double)c[i] * c[i];
        if (fabs(d) > mx) {
            mx = fabs(d);
            worst = i;
        }
        if (fabs(c[i]) > mref) mref = fabs(c[i]);
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    double mrel = mref > 0 ? mx / mref : mx;
    int ok = !bad && rel <= tol_rel && mrel <= tol_max;
    n_cmp++;
    if (!ok) n_cmp_fail++;
    printf("  %-44s rel %.2e  max %.2e  (tol %.0e/%.0e)  %s\n", what, rel, mrel, tol_rel, tol_max,
           ok ? "ok" : "FAIL");
    if (!ok) {
        fprintf(stderr, "FAIL %s: element %zu gpu %.8g cpu %.8g\n", what, worst, (double)g[worst], (double)c[worst]);
        hyla_test_failures++;
    }
}
static void cmp_pair(const char *what, pair p, double tol_rel, double tol_max) {
    float *hc = host_of(cpu, p.c, p.n), *hg = host_of(gpu, p.g, p.n);
    cmp(what, hg, hc, p.n, tol_rel, tol_max);
    free(hc);
    free(hg);
}
static int same_bits(hyla_backend *b, const void *x, const void *y, size_t bytes) {
    void *hx = malloc(bytes + 4), *hy = malloc(bytes + 4);
    CHECK_OK(b->ops->download(b->ctx, hx, x, bytes));
    CHECK_OK(b->ops->download(b->ctx, hy, y, bytes));
    int r = !memcmp(hx, hy, bytes);
    if (!r && bytes % 4 == 0) { /* how far apart, as floats: rounding (a few ulp) or a wrong value */
        const float *fx = (const float *)hx, *fy = (const float *)hy;
        size_t nd = 0, first = 0;
        double mx = 0.0;
        for (size_t i = 0; i < bytes / 4; i++)
            if (memcmp(fx + i, fy + i, 4)) {
                if (!nd++) first = i;
                double d = fabs((double)fx[i] - fy[i]);
                if (d > mx) mx = d;
            }
        printf("  (bits: %zu of %zu floats differ, the first at %zu: %.9g against %.9g, max |diff| %.3g)\n", nd,
               bytes / 4, first, fx[first], fy[first], mx);
    }
    free(hx);
    free(hy);
    return r;
}

#define FP32_TOL 1e-5, 1e-5
#define LIN_TOL 1e-2, 3e-2
#define REC_TOL 1e-4, 1e-4
#define CHUNK_TOL 2e-2, 5e-2
#define ATTN_TOL 2e-2, 5e-2

/* GLA gates logsigmoid(x)/16 with x ~ N(0, 2^2); GDN log-decays -softplus-like in (-1.5, 0). */
static float *gla_gates(size_t n) {
    float *g = malloc(n * sizeof(float) + 4);
    for (size_t i = 0; i < n; i++) {
        double x = 2.0 * hyla_rng_normal(&rng);
        g[i] = (float)((fmin(x, 0) - log1p(exp(-fabs(x)))) / 16.0);
    }
    return g;
}
static float *gdn_decays(size_t n) {
    float *g = malloc(n * sizeof(float) + 4);
    for (size_t i = 0; i < n; i++) g[i] = -0.02f - 0.3f * hyla_rng_uniform(&rng);
    return g;
}
static void l2rows(float *x, size_t rows, int cols) {
    for (size_t r = 0; r < rows; r++) {
        double s = 0;
        for (int i = 0; i < cols; i++) s += (double)x[r * cols + i] * x[r * cols + i];
        double inv = 1.0 / sqrt(s + 1e-6);
        for (int i = 0; i < cols; i++) x[r * cols + i] = (float)(x[r * cols + i] * inv);
    }
}

/* One row of the case table (main): the op (or op family) it covers, the function that runs it
 * on `gpu` and on the CPU and compares, and its shape parameters (their meaning is the
 * function's; rows of one function differ only in them). */
typedef struct op_case op_case;
struct op_case {
    const char *op;
    void (*run)(const op_case *c);
    int p[8];
};

/* ---------------------------------------------------------------- memory and pool */

static void case_memory(const op_case *c) {
    (void)c;
    const hyla_ops *o = gpu->ops;
    size_t n = 3 * 1024 * 1024 + 17; /* over the bounce buffer size: several pieces */
    float *h = randn(n, 1.0f);
    void *a = dev(gpu, NULL, n * 4), *b = dev(gpu, NULL, n * 4);
    float *z = host_of(gpu, a, n);
    int zero = 1;
    for (size_t i = 0; i < n; i++) zero &= z[i] == 0.0f;
    CHECK_MSG(zero, "alloc is zero-filled");
    free(z);
    CHECK_OK(o->upload(gpu->ctx, a, h, n * 4));
    CHECK_OK(o->copy(gpu->ctx, b, a, n * 4));
    float *back = host_of(gpu, b, n);
    CHECK_MSG(!memcmp(back, h, n * 4), "upload/copy/download round trip");
    CHECK_OK(o->zero(gpu->ctx, (float *)b + 5, 100 * 4));
    free(back);
    back = host_of(gpu, b, n);
    CHECK(back[4] == h[4] && back[5] == 0.0f && back[104] == 0.0f && back[105] == h[105]);
    CHECK_OK(o->sync(gpu->ctx));
    free(back);
    dfree(gpu, a);
    dfree(gpu, b);
#ifdef HAVE_POOL_API
    hyla_cuda_pool_stats s0, s1, s2;
    CHECK_OK(hyla_cuda_pool_get_stats(gpu, &s0));
    void *p[8];
    for (int i = 0; i < 8; i++) p[i] = dev(gpu, NULL, 1000000);
    CHECK_OK(hyla_cuda_pool_get_stats(gpu, &s1));
    CHECK(s1.n_live_slots == s0.n_live_slots + 8);
    for (int i = 0; i < 8; i++) dfree(gpu, p[i]);
    void *q = dev(gpu, NULL, 1000000); /* reuses a freed slot: no new slab */
    CHECK_OK(hyla_cuda_pool_get_stats(gpu, &s2));
    CHECK(s2.slab_bytes == s1.slab_bytes && s2.n_live_slots == s0.n_live_slots + 1);
    float *qz = host_of(gpu, q, 1000000 / 4);
    int qzero = 1;
    for (int i = 0; i < 1000000 / 4; i++) qzero &= qz[i] == 0.0f;
    CHECK_MSG(qzero, "a reused slot is zero-filled");
    free(qz);
    dfree(gpu, q);
    CHECK_OK(hyla_cuda_pool_reserve(gpu, 4096, 100));
    CHECK_OK(hyla_cuda_pool_get_stats(gpu, &s2));
    printf("  pool: %u slabs, %.1f MiB slabs, %u classes, %u free slots\n", s2.n_slabs, s2.slab_bytes / 1048576.0,
           s2.n_classes, s2.n_free_slots);
    CHECK(s2.n_free_slots >= 100);
    /* async snapshot / restore through pinned memory */
    size_t m = 1 << 20;
    void *src = dev(gpu, h, m * 4), *dst = dev(gpu, NULL, m * 4);
    void *pin = NULL;
    CHECK_OK(hyla_cuda_host_alloc(gpu, m * 4, &pin));
    hyla_cuda_copy *cp = NULL;
    const void *srcs[1] = {src};
    void *dsts[1] = {pin};
    size_t bytes[1] = {m * 4};
    CHECK_OK(hyla_cuda_snapshot_begin(gpu, 1, dsts, srcs, bytes, &cp));
    CHECK_OK(hyla_cuda_copy_wait(cp));
    CHECK_MSG(!memcmp(pin, h, m * 4), "async snapshot copy");
    void *ddst[1] = {dst};
    const void *hsrc[1] = {pin};
    CHECK_OK(hyla_cuda_restore_begin(gpu, 1, ddst, hsrc, bytes, &cp));
    CHECK_OK(hyla_cuda_copy_wait(cp));
    CHECK_MSG(same_bits(gpu, src, dst, m * 4), "async restore copy");
    /* a snapshot copy into pageable memory goes through the backend's own thread and bounce
     * buffer: pieces larger than the bounce's halves and more small pieces than a half lists */
    {
        size_t big = (size_t)40 << 20, small = 4096;
        int ns = 700, np = ns + 1;
        float *hb = malloc(big);
        for (size_t i = 0; i < big / 4; i++) hb[i] = (float)(i % 9973) * 0.5f - 7.0f;
        void *db = dev(gpu, hb, big);
        uint8_t *pg = malloc(big);
        memset(pg, 0x5a, big);
        void **pd = malloc((size_t)np * sizeof *pd);
        const void **ps = malloc((size_t)np * sizeof *ps);
        size_t *pz = malloc((size_t)np * sizeof *pz);
        for (int i = 0; i < ns; i++) { /* small pieces, in reverse order */
            size_t off = (size_t)(ns - 1 - i) * small;
            pd[i] = pg + off, ps[i] = (const uint8_t *)db + off, pz[i] = small;
        }
        pd[ns] = pg + (size_t)ns * small, ps[ns] = (const uint8_t *)db + (size_t)ns * small, pz[ns] = big - (size_t)ns * small;
        CHECK_OK(hyla_cuda_snapshot_begin(gpu, np, pd, ps, pz, &cp));
        int polls = 0;
        while (cp && !hyla_cuda_copy_done(cp) && polls < 100000) polls++, usleep(10);
        CHECK_OK(hyla_cuda_copy_wait(cp));
        CHECK_MSG(!memcmp(pg, hb, big), "async snapshot copy into pageable memory");
        printf("  pageable snapshot copy: %d pieces, %.0f MiB: same bytes\n", np, big / 1048576.0);
        free(pd), free(ps), free(pz), free(pg), free(hb);
        dfree(gpu, db);
    }
    /* a snapshot copy of many pieces into pinned memory (a long session's KV pages) is issued
     * by a thread of its own (ISSUE_THREAD_MIN pieces after merging): pieces in reverse order,
     * so none merge; the source's first pieces are zeroed by an op queued just before, which
     * the copies must see (they start after the compute work queued so far) */
    {
        const int ns = 1500;
        const size_t small = 2048, tot = (size_t)ns * small;
        float *hb = malloc(tot);
        for (size_t i = 0; i < tot / 4; i++) hb[i] = (float)(i % 7919) * 0.25f + 1.0f;
        void *db = dev(gpu, hb, tot);
        void *pb = NULL;
        CHECK_OK(hyla_cuda_host_alloc(gpu, tot, &pb));
        memset(pb, 0x5a, tot);
        void **pd = malloc((size_t)ns * sizeof *pd);
        const void **ps = malloc((size_t)ns * sizeof *ps);
        size_t *pz = malloc((size_t)ns * sizeof *pz);
        for (int i = 0; i < ns; i++) {
            size_t off = (size_t)(ns - 1 - i) * small;
            pd[i] = (uint8_t *)pb + off, ps[i] = (const uint8_t *)db + off, pz[i] = small;
        }
        const size_t zb = 8 * small;
        CHECK_OK(o->zero(gpu->ctx, db, zb));
        memset(hb, 0, zb);
        CHECK_OK(hyla_cuda_snapshot_begin(gpu, ns, pd, ps, pz, &cp));
        int polls = 0;
        while (cp && !hyla_cuda_copy_done(cp) && polls < 1000000) polls++, usleep(10);
        int done = cp && hyla_cuda_copy_done(cp);
        CHECK_OK(hyla_cuda_copy_wait(cp));
        CHECK_MSG(done, "a many-piece snapshot copy reports done before its wait");
        CHECK_MSG(!memcmp(pb, hb, tot), "async snapshot copy of %d pieces into pinned memory", ns);
        printf("  pinned snapshot copy: %d pieces (issued by a thread), %.1f MiB: same bytes\n", ns, tot / 1048576.0);
        free(pd), free(ps), free(pz), free(hb);
        hyla_cuda_host_free(gpu, pb);
        dfree(gpu, db);
    }
    /* ops->upload / ops->download with pinned host memory take the direct path (no bounce) */
    CHECK_OK(o->zero(gpu->ctx, dst, m * 4));
    CHECK_OK(o->upload(gpu->ctx, dst, pin, m * 4));
    CHECK_MSG(same_bits(gpu, src, dst, m * 4), "upload from pinned memory");
    memset(pin, 0, m * 4);
    CHECK_OK(o->download(gpu->ctx, pin, dst, m * 4));
    CHECK_MSG(!memcmp(pin, h, m * 4), "download into pinned memory");
    hyla_cuda_host_free(gpu, pin);
    dfree(gpu, src);
    dfree(gpu, dst);
    CHECK(hyla_cuda_pool_get_stats(cpu, &s2) == HYLA_ERR_INVALID_ARG);
#endif
    free(h);
}

/* ---------------------------------------------------------------- dense ops */

static void case_embed_linear(const op_case *c) {
    (void)c;
    int V = 300, D = 96;
    float *tab = randn((size_t)V * D, 1.0f);
    round_bf16(tab, (size_t)V * D);
    hyla_weight *wc, *wg;
    CHECK_OK(cpu->ops->weight_create(cpu->ctx, tab, HYLA_DT_F32, V, D, &wc));
    CHECK_OK(gpu->ops->weight_create(gpu->ctx, tab, HYLA_DT_F32, V, D, &wg));
    int32_t ids[7] = {0, 5, 299, 5, 17, 123, 1};
    pair out = pair_new(NULL, 7 * (size_t)D);
    CHECK_OK(cpu->ops->embed(cpu->ctx, wc, ids, 7, out.c));
    CHECK_OK(gpu->ops->embed(gpu->ctx, wg, ids, 7, out.g));
    cmp_pair("embed (bf16-exact table)", out, 0, 0);
    int32_t bad[2] = {3, 300};
    CHECK(gpu->ops->embed(gpu->ctx, wg, bad, 2, out.g) == HYLA_ERR_INVALID_ARG);
    pair_free(out);
    /* weights from bf16 and f16 host data */
    uint16_t *hb = malloc((size_t)V * D * 2);
    for (size_t i = 0; i < (size_t)V * D; i++) hb[i] = hyla_f32_to_bf16(tab[i]);
    hyla_weight *wb, *wbc;
    CHECK_OK(gpu->ops->weight_create(gpu->ctx, hb, HYLA_DT_BF16, V, D, &wb));
    CHECK_OK(cpu->ops->weight_create(cpu->ctx, hb, HYLA_DT_BF16, V, D, &wbc));
    pair o2 = pair_new(NULL, 7 * (size_t)D);
    CHECK_OK(cpu->ops->embed(cpu->ctx, wbc, ids, 7, o2.c));
    CHECK_OK(gpu->ops->embed(gpu->ctx, wb, ids, 7, o2.g));
    cmp_pair("embed (bf16 weights)", o2, 0, 0);
    pair_free(o2);
    gpu->ops->weight_destroy(gpu->ctx, wb);
    cpu->ops->weight_destroy(cpu->ctx, wbc);
    free(hb);
    cpu->ops->weight_destroy(cpu->ctx, wc);
    gpu->ops->weight_destroy(gpu->ctx, wg);
    free(tab);

    struct {
        int M, K, N, ldx, ldy, bias, acc;
    } cases[] = {{1, 96, 80, 96, 80, 0, 0},   {7, 96, 80, 100, 90, 1, 0},  {64, 256, 192, 256, 192, 0, 1},
                 {300, 512, 260, 512, 260, 1, 1}, {33, 2304, 1000, 2304, 1000, 0, 0},
                 {256, 2304, 6144, 2304, 6144, 0, 0}, {5, 100, 70, 101, 70, 1, 0},
                 /* M > 64: the large-M kernel (k_gemm_big), the skinny kernel's bits */
                 {65, 2304, 2304, 2304, 2304, 1, 0}, {150, 200, 130, 204, 133, 1, 1}, {1000, 6144, 2304, 6144, 2304, 0, 0},
                 {130, 100, 70, 100, 70, 0, 0},
                 /* decode rows on Hopper's warpgroup products (k_gemm_wg): a cluster's slices (N = D,
                  * 14 and 12 slices), part of a row block, bias and accumulate */
                 {256, 6144, 2304, 6144, 2304, 1, 1}, {192, 2304, 2304, 2304, 2304, 0, 0},
                 /* 17-32 rows: the cluster sum's 8-warp blocks */
                 {20, 2304, 2304, 2304, 2304, 1, 0}, {32, 512, 200, 520, 210, 1, 1},
                 /* a few k steps onto y, or with a bias (SSE's LoRA terms, GLA's gate logits):
                  * the ends that load y and the bias before they store */
                 {256, 128, 2304, 128, 2304, 0, 1}, {256, 16, 2304, 16, 2304, 1, 0}, {4, 128, 2304, 128, 2304, 1, 1}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        int M = cases[ci].M, K = cases[ci].K, N = cases[ci].N, ldx = cases[ci].ldx, ldy = cases[ci].ldy;
        float *W = randn((size_t)N * K, 1.0f / sqrtf((float)K));
        round_bf16(W, (size_t)N * K);
        float *x = randn((size_t)M * ldx, 1.0f), *y0 = randn((size_t)M * ldy, 1.0f), *bias = randn(N, 1.0f);
        hyla_weight *Wc, *Wg;
        CHECK_OK(cpu->ops->weight_create(cpu->ctx, W, HYLA_DT_F32, N, K, &Wc));
        CHECK_OK(gpu->ops->weight_create(gpu->ctx, W, HYLA_DT_F32, N, K, &Wg));
        pair px = pair_new(x, (size_t)M * ldx), py = pair_new(y0, (size_t)M * ldy), pb = pair_new(bias, N);
        CHECK_OK(cpu->ops->linear(cpu->ctx, px.c, ldx, M, K, Wc, cases[ci].bias ? pb.c : NULL, py.c, ldy, N,
                                  cases[ci].acc));
        CHECK_OK(gpu->ops->linear(gpu->ctx, px.g, ldx, M, K, Wg, cases[ci].bias ? pb.g : NULL, py.g, ldy, N,
                                  cases[ci].acc));
        char name[96];
        snprintf(name, sizeof name, "linear M=%d K=%d N=%d%s%s", M, K, N, cases[ci].bias ? " bias" : "",
                 cases[ci].acc ? " acc" : "");
        cmp_pair(name, py, LIN_TOL);
        /* determinism: the same call twice, same bits */
        if (ci == 3) {
            void *y2 = dev(gpu, y0, (size_t)M * ldy * 4);
            CHECK_OK(gpu->ops->linear(gpu->ctx, px.g, ldx, M, K, Wg, pb.g, y2, ldy, N, 1));
            void *y3 = dev(gpu, y0, (size_t)M * ldy * 4);
            CHECK_OK(gpu->ops->linear(gpu->ctx, px.g, ldx, M, K, Wg, pb.g, y3, ldy, N, 1));
            CHECK_MSG(same_bits(gpu, y2, y3, (size_t)M * ldy * 4), "linear is deterministic");
            dfree(gpu, y2);
            dfree(gpu, y3);
        }
        CHECK(gpu->ops->linear(gpu->ctx, px.g, ldx, M, K + 1, Wg, NULL, py.g, ldy, N, 0) == HYLA_ERR_INVALID_ARG);
        /* batch invariance: row r of an M-row call == the same row alone (any M: the large-M
         * kernel does the skinny kernel's arithmetic) */
        for (int q = 0; q < (M > 1 ? 2 : 0); q++) {
            int r = q ? M - 1 : M / 2;
            void *y1 = dev(gpu, y0 + (size_t)r * ldy, (size_t)ldy * 4);
            void *yM = dev(gpu, y0, (size_t)M * ldy * 4);
            CHECK_OK(gpu->ops->linear(gpu->ctx, (float *)px.g + (size_t)r * ldx, ldx, 1, K, Wg,
                                      cases[ci].bias ? pb.g : NULL, y1, ldy, N, cases[ci].acc));
            CHECK_OK(gpu->ops->linear(gpu->ctx, px.g, ldx, M, K, Wg, cases[ci].bias ? pb.g : NULL, yM, ldy, N,
                                      cases[ci].acc));
            CHECK_MSG(same_bits(gpu, y1, (float *)yM + (size_t)r * ldy, (size_t)N * 4),
                      "linear M=%d K=%d N=%d: row %d alone == row %d of the batch (bits)", M, K, N, r, r);
            dfree(gpu, y1);
            dfree(gpu, yM);
        }
        /* rows 64..M-1 as their own call (M > 64: large-M kernel vs skinny pieces) */
        if (M > 64) {
            void *ya = dev(gpu, y0, (size_t)M * ldy * 4), *yb = dev(gpu, y0, (size_t)M * ldy * 4);
            const float *bb = cases[ci].bias ? pb.g : NULL;
            CHECK_OK(gpu->ops->linear(gpu->ctx, px.g, ldx, M, K, Wg, bb, ya, ldy, N, cases[ci].acc));
            for (int r0 = 0; r0 < M; r0 += 64)
                CHECK_OK(gpu->ops->linear(gpu->ctx, (float *)px.g + (size_t)r0 * ldx, ldx, M - r0 < 64 ? M - r0 : 64, K,
                                          Wg, bb, (float *)yb + (size_t)r0 * ldy, ldy, N, cases[ci].acc));
            CHECK_MSG(same_bits(gpu, ya, yb, (size_t)M * ldy * 4),
                      "linear M=%d K=%d N=%d: one call == 64-row pieces (bits)", M, K, N);
            dfree(gpu, ya);
            dfree(gpu, yb);
        }
        pair_free(px);
        pair_free(py);
        pair_free(pb);
        cpu->ops->weight_destroy(cpu->ctx, Wc);
        gpu->ops->weight_destroy(gpu->ctx, Wg);
        free(W);
        free(x);
        free(y0);
        free(bias);
    }
}

/* The kernel-form switches are read when a backend is made and named by hyla_cuda_switches
 * (benchmark records carry that line): a second backend made with HYLA_CUDA_GEMM_WG=0,
 * HYLA_CUDA_CHUNK_B_WG=0, HYLA_CUDA_ATTN_WG=0 and HYLA_CUDA_ATTN_WG2=0 says so where the first
 * says its defaults (which the environment of the run must leave alone),
 * and its large-M linear (k_gemm_big instead of the warpgroup form where that runs) gives the
 * same bits. */
/* A second CUDA backend made with one switch variable set (unset again after), and its switches
 * line in sw; NULL where it could not be made (the failure checked). */
static hyla_backend *backend_with(const char *var, const char *val, char *sw, size_t n) {
    setenv(var, val, 1);
    hyla_backend *b = NULL;
    hyla_status st = hyla_cuda_backend_create(0, &b);
    unsetenv(var);
    CHECK_OK(st);
    if (b) CHECK_OK(hyla_cuda_switches(b, sw, n));
    return b;
}

/* The linear of x [M][K] by W [N][K] on backend b (NULL: skipped) gives the bits h1 */
static void linear_same_bits(hyla_backend *b, const float *W, const float *x, int M, int K, int N, const float *h1,
                             const char *what) {
    if (!b) return;
    hyla_weight *w;
    CHECK_OK(b->ops->weight_create(b->ctx, W, HYLA_DT_F32, N, K, &w));
    void *xd = dev(b, x, (size_t)M * K * 4), *yd = dev(b, NULL, (size_t)M * N * 4);
    CHECK_OK(b->ops->linear(b->ctx, xd, K, M, K, w, NULL, yd, N, N, 0));
    float *h = host_of(b, yd, (size_t)M * N);
    CHECK_MSG(!memcmp(h1, h, (size_t)M * N * 4), "linear %d x %d -> %d: other bits with %s", M, K, N, what);
    free(h);
    dfree(b, xd), dfree(b, yd);
    b->ops->weight_destroy(b->ctx, w);
}

static void case_switches(const op_case *c) {
    (void)c;
    char a[256] = "", b[256] = "";
    CHECK_OK(hyla_cuda_switches(gpu, a, sizeof a));
    setenv("HYLA_CUDA_GEMM_WG", "0", 1);
    setenv("HYLA_CUDA_CHUNK_B_WG", "0", 1);
    setenv("HYLA_CUDA_ATTN_WG", "0", 1);
    setenv("HYLA_CUDA_ATTN_WG2", "0", 1);
    hyla_backend *g2 = NULL;
    hyla_status st = hyla_cuda_backend_create(0, &g2);
    unsetenv("HYLA_CUDA_GEMM_WG");
    unsetenv("HYLA_CUDA_CHUNK_B_WG");
    unsetenv("HYLA_CUDA_ATTN_WG");
    unsetenv("HYLA_CUDA_ATTN_WG2");
    CHECK_OK(st);
    if (!g2) return;
    CHECK_OK(hyla_cuda_switches(g2, b, sizeof b));
    CHECK_MSG(strstr(a, "gemm_wg_min=") && strstr(b, "gemm_wg=0") && strstr(b, "chunk_b_wg=0"),
              "switches: default '%s', with HYLA_CUDA_GEMM_WG=0 HYLA_CUDA_CHUNK_B_WG=0 '%s'", a, b);
    /* the warpgroup flash kernel is on wherever kernel B's warpgroup form is (Hopper), and
     * HYLA_CUDA_ATTN_WG=0 turns it off */
    CHECK_MSG(!!strstr(a, "attn_wg=1") == !!strstr(a, "chunk_b_wg=1") && strstr(b, "attn_wg=0"),
              "switches: default '%s', with HYLA_CUDA_ATTN_WG=0 '%s'", a, b);
    /* its two-warpgroup form from 8192 keys on average; HYLA_CUDA_ATTN_WG2=0 turns it off */
    CHECK_MSG(strstr(a, "attn_wg2=8192") && strstr(b, "attn_wg2=0"),
              "switches: default '%s', with HYLA_CUDA_ATTN_WG2=0 '%s'", a, b);
    /* a third backend with k_gemm_wg's forms alone (HYLA_CUDA_GEMM_WGP=0): the same bits again */
    char d[256] = "";
    hyla_backend *g3 = backend_with("HYLA_CUDA_GEMM_WGP", "0", d, sizeof d);
    CHECK_MSG(strstr(a, "gemm_wgp=1") && strstr(d, "gemm_wgp=0"), "switches: default '%s', with HYLA_CUDA_GEMM_WGP=0 '%s'",
              a, d);
    /* a fourth with 128-column blocks where the default takes 64 from 65 rows
     * (HYLA_CUDA_GEMM_WG_N64=0: the operator's switch back, docs/CUDA.md): the same bits */
    char e4[256] = "";
    hyla_backend *g4 = backend_with("HYLA_CUDA_GEMM_WG_N64", "0", e4, sizeof e4);
    CHECK_MSG(strstr(a, "gemm_wg_n64=1") && strstr(e4, "gemm_wg_n64=0"),
              "switches: default '%s', with HYLA_CUDA_GEMM_WG_N64=0 '%s'", a, e4);
    /* a fifth whose decode norms leave fp32 rows (HYLA_CUDA_DECODE_BF16=0): it takes no bf16
     * decode rows where the default takes them */
    char e5[256] = "";
    hyla_backend *g5 = backend_with("HYLA_CUDA_DECODE_BF16", "0", e5, sizeof e5);
    CHECK_MSG(strstr(a, "decode_bf16=1") && strstr(e5, "decode_bf16=0") && g5 &&
                  !g5->ops->decode_bf16_rows(g5->ctx, 200, 2304) &&
                  gpu->ops->decode_bf16_rows(gpu->ctx, 200, 2304), /* 200 rows take the large-M path anywhere */
              "switches: default '%s', with HYLA_CUDA_DECODE_BF16=0 '%s'", a, e5);
    if (g5) hyla_backend_destroy(g5);
    /* a sixth and a seventh with the flash prefill's key splits set at creation
     * (HYLA_CUDA_ATTN_SPLIT): 16384 is taken, 100 (not a multiple of 64) is ignored */
    char e6[256] = "", e7[256] = "";
    hyla_backend *g6 = backend_with("HYLA_CUDA_ATTN_SPLIT", "16384", e6, sizeof e6);
    hyla_backend *g7 = backend_with("HYLA_CUDA_ATTN_SPLIT", "100", e7, sizeof e7);
    CHECK_MSG(strstr(a, "attn_split=8192") && strstr(e6, "attn_split=16384") && strstr(e7, "attn_split=8192"),
              "switches: default '%s', HYLA_CUDA_ATTN_SPLIT=16384 '%s', =100 '%s'", a, e6, e7);
    if (g6) hyla_backend_destroy(g6);
    if (g7) hyla_backend_destroy(g7);
    /* an eighth and a ninth with the walk's bound set at creation (HYLA_CUDA_ATTN_WALK): 0
     * (never) is taken, -5 ignored; the default is 16 blocks per SM */
    char e8[256] = "", e9[256] = "";
    hyla_backend *g8 = backend_with("HYLA_CUDA_ATTN_WALK", "0", e8, sizeof e8);
    hyla_backend *g9 = backend_with("HYLA_CUDA_ATTN_WALK", "-5", e9, sizeof e9);
    CHECK_MSG(strstr(a, "attn_walk=") && atoi(strstr(a, "attn_walk=") + 10) > 0 && strstr(e8, "attn_walk=0 ") &&
                  strstr(e9, "attn_walk=") && atoi(strstr(e9, "attn_walk=") + 10) == atoi(strstr(a, "attn_walk=") + 10),
              "switches: default '%s', HYLA_CUDA_ATTN_WALK=0 '%s', =-5 '%s'", a, e8, e9);
    if (g8) hyla_backend_destroy(g8);
    if (g9) hyla_backend_destroy(g9);
    /* each form of the warpgroup linear (hyla_cuda_gemm.cu gemm_wg): one warpgroup a block with
     * the cluster's slice sum (64 columns: 64 x 2304 -> 2304, 48 x 3072 -> 2304; 128 columns, a
     * deep K: 64 x 6144 -> 2304), one warpgroup and a producer warp over the whole K (256 x 2304 ->
     * 2304, 100 x 2304 -> 6144; at 64 rows and fewer, 64 columns: 64 x 2304 -> 6144, 40 x 2304 ->
     * 4608; from 65 rows where the blocks fill under half the SMs, 64 columns: 256 x 2304 -> 1152,
     * 160 x 4608 -> 2304, 96 x 6144 -> 2304), two warpgroups and a producer warp (256 x 2304 ->
     * 6144, a part row block: 200 x 2304 -> 4608), two warpgroups with the cluster's slice sum (128
     * x 2304 -> 1152). The first seven draw their inputs
     * from the shared stream, the rest from one of their own:
     * the cases after this one keep the inputs they have had (the LTE case's CPU-against-GPU
     * scores are not bit-identical on every input: kernels/cuda/dev/NOTES.md "LTE scores"). */
    const int shapes[][3] = {{64, 2304, 2304}, {256, 2304, 1152}, {256, 2304, 2304}, {100, 2304, 6144},
                             {160, 4608, 2304}, {256, 2304, 6144}, {200, 2304, 4608}, {64, 2304, 6144},
                             {128, 2304, 1152}, {40, 2304, 4608}, {64, 6144, 2304}, {48, 3072, 2304},
                             {96, 6144, 2304}};
    hyla_rng saved = rng;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int M = shapes[si][0], K = shapes[si][1], N = shapes[si][2];
        if (si == 7) { /* the shapes added later: a stream of their own */
            saved = rng;
            hyla_rng_seed(&rng, 20261127);
        }
        float *W = randn((size_t)N * K, 1.0f / sqrtf((float)K)), *x = randn((size_t)M * K, 1.0f);
        round_bf16(W, (size_t)N * K);
        hyla_weight *w1;
        CHECK_OK(gpu->ops->weight_create(gpu->ctx, W, HYLA_DT_F32, N, K, &w1));
        void *x1 = dev(gpu, x, (size_t)M * K * 4), *y1 = dev(gpu, NULL, (size_t)M * N * 4);
        CHECK_OK(gpu->ops->linear(gpu->ctx, x1, K, M, K, w1, NULL, y1, N, N, 0));
        float *h1 = host_of(gpu, y1, (size_t)M * N);
        linear_same_bits(g2, W, x, M, K, N, h1, "HYLA_CUDA_GEMM_WG=0");
        linear_same_bits(g3, W, x, M, K, N, h1, "HYLA_CUDA_GEMM_WGP=0");
        linear_same_bits(g4, W, x, M, K, N, h1, "HYLA_CUDA_GEMM_WG_N64=0");
        free(h1), free(W), free(x);
        dfree(gpu, x1), dfree(gpu, y1);
        gpu->ops->weight_destroy(gpu->ctx, w1);
    }
    rng = saved;
    if (g3) hyla_backend_destroy(g3);
    if (g4) hyla_backend_destroy(g4);
    hyla_backend_destroy(g2);
}

/* linear_multi with outputs of their own x (hyla_linear_out.x: SSE's two LoRA terms and GLA
 * gates' low-rank halves in decode) == separate linear calls of each output's rows, bit for bit,
 * on both backends, with and without accumulate (the call's, or some outputs' own: SSE's LoRA
 * terms add, the output gate's second half writes): the CUDA one runs rows up to its one-tile
 * skinny path, and up to 64 rows of a small K (K = 64, 128 here: 24 and 64 rows), as one grouped
 * launch, others a call per x (100 and 256 rows on the warpgroup linear); prompt rows go a call
 * per x too. */
static void linear_multi_own_x(void) {
    /* K = 128 (two slices for 2304 outputs: the grouped launch's reduction kernel from 5 rows,
     * as SSE's LoRA terms) draws from a stream of its own: the cases after keep their inputs */
    const int Ks[3] = {2304, 64, 128}, Ns[4] = {2304, 256, 2304, 16};
    const int Ms[7] = {1, 4, 7, 24, 64, 100, 256};
    hyla_rng shared = rng;
    for (int ki = 0; ki < 3; ki++) {
        const int K = Ks[ki];
        if (ki == 2) {
            shared = rng;
            hyla_rng_seed(&rng, 20261130);
        }
        hyla_weight *wc[4], *wg[4];
        float *W[4];
        for (int i = 0; i < 4; i++) {
            W[i] = randn((size_t)Ns[i] * K, 1.0f / sqrtf((float)K));
            CHECK_OK(cpu->ops->weight_create(cpu->ctx, W[i], HYLA_DT_F32, Ns[i], K, &wc[i]));
            CHECK_OK(gpu->ops->weight_create(gpu->ctx, W[i], HYLA_DT_F32, Ns[i], K, &wg[i]));
        }
        float *bias = randn(2304, 1.0f);
        for (int mi = 0; mi < 7; mi++)
            for (int mode = 0; mode < 3; mode++) { /* accumulate: none, the call's, outputs 0 and 2 their own */
                const int M = Ms[mi], acc = mode == 1, oacc[4] = {mode == 2, 0, mode == 2, 0};
                float *xs[3], *y0[4];
                pair px[3], py0[4], pb = pair_new(bias, 2304);
                for (int j = 0; j < 3; j++) {
                    xs[j] = randn((size_t)M * K, 1.0f);
                    px[j] = pair_new(xs[j], (size_t)M * K);
                }
                for (int i = 0; i < 4; i++) {
                    y0[i] = randn((size_t)M * Ns[i], 1.0f);
                    py0[i] = pair_new(y0[i], (size_t)M * Ns[i]);
                }
                /* output i reads x xi[i]: 0 the call's, 1 and 2 their own, 3 the same as 1 */
                const int xi[4] = {0, 1, 2, 1};
                for (int b = 0; b < 2; b++) {
                    hyla_backend *be = b ? gpu : cpu;
                    float *one[4], *grp[4];
                    hyla_linear_out outs[4];
                    for (int i = 0; i < 4; i++) {
                        const size_t by = (size_t)M * Ns[i] * 4;
                        const void *y0d = b ? py0[i].g : py0[i].c;
                        one[i] = dev(be, NULL, by);
                        grp[i] = dev(be, NULL, by);
                        CHECK_OK(be->ops->copy(be->ctx, one[i], y0d, by));
                        CHECK_OK(be->ops->copy(be->ctx, grp[i], y0d, by));
                        const float *xd = b ? px[xi[i]].g : px[xi[i]].c;
                        const float *bi = i == 2 ? (const float *)(b ? pb.g : pb.c) : NULL;
                        CHECK_OK(be->ops->linear(be->ctx, xd, K, M, K, b ? wg[i] : wc[i], bi, one[i], Ns[i], Ns[i],
                                                 acc || oacc[i]));
                        outs[i] = (hyla_linear_out){b ? wg[i] : wc[i], bi, grp[i], Ns[i], Ns[i], i ? xd : NULL, oacc[i]};
                    }
                    CHECK_OK(be->ops->linear_multi(be->ctx, b ? px[0].g : px[0].c, K, M, K, 4, outs, acc, 0));
                    int same = 1;
                    for (int i = 0; i < 4; i++) same &= same_bits(be, one[i], grp[i], (size_t)M * Ns[i] * 4);
                    CHECK_MSG(same, "%s linear_multi K=%d M=%d%s, outputs of three x == their linear calls (bits)",
                              be->ops->name, K, M, mode == 1 ? " (accumulate)" : mode == 2 ? " (outputs 0, 2 accumulate)" : "");
                    if (b && M == 1 && mode == 0) /* bf16 outputs are for prompt rows only, own x or not */
                        CHECK(be->ops->linear_multi(be->ctx, px[0].g, K, M, K, 4, outs, 0, HYLA_LINEAR_Y_BF16) ==
                              HYLA_ERR_INVALID_ARG);
                    for (int i = 0; i < 4; i++) {
                        dfree(be, one[i]);
                        dfree(be, grp[i]);
                    }
                }
                for (int j = 0; j < 3; j++) {
                    pair_free(px[j]);
                    free(xs[j]);
                }
                for (int i = 0; i < 4; i++) {
                    pair_free(py0[i]);
                    free(y0[i]);
                }
                pair_free(pb);
            }
        for (int i = 0; i < 4; i++) {
            cpu->ops->weight_destroy(cpu->ctx, wc[i]);
            gpu->ops->weight_destroy(gpu->ctx, wg[i]);
            free(W[i]);
        }
        free(bias);
        if (ki == 2) rng = shared;
    }
}

/* linear_multi == its outputs' separate linear calls, bit for bit, on both backends (the CUDA
 * one runs them as one grouped launch for M <= 64). */
static void case_linear_multi(const op_case *c) {
    linear_multi_own_x();
    (void)c;
    const int K = 2304, Ns[4] = {2304, 256, 16, 6144};
    hyla_weight *wc[4], *wg[4];
    float *W[4], *bias = randn(6144, 1.0f);
    for (int i = 0; i < 4; i++) {
        W[i] = randn((size_t)Ns[i] * K, 1.0f / sqrtf((float)K));
        CHECK_OK(cpu->ops->weight_create(cpu->ctx, W[i], HYLA_DT_F32, Ns[i], K, &wc[i]));
        CHECK_OK(gpu->ops->weight_create(gpu->ctx, W[i], HYLA_DT_F32, Ns[i], K, &wg[i]));
    }
    const int Ms[6] = {1, 7, 24, 40, 64, 100};
    for (int mi = 0; mi < 6; mi++) {
        int M = Ms[mi];
        float *x = randn((size_t)M * K, 1.0f);
        pair px = pair_new(x, (size_t)M * K), pbias = pair_new(bias, 6144);
        for (int b = 0; b < 2; b++) {
            hyla_backend *be = b ? gpu : cpu;
            void *xd = b ? px.g : px.c;
            float *one[4], *grp[4];
            hyla_linear_out outs[4];
            for (int i = 0; i < 4; i++) {
                one[i] = dev(be, NULL, (size_t)M * Ns[i] * 4);
                grp[i] = dev(be, NULL, (size_t)M * Ns[i] * 4);
                const float *bi = i == 1 ? (const float *)(b ? pbias.g : pbias.c) : NULL;
                CHECK_OK(be->ops->linear(be->ctx, xd, K, M, K, b ? wg[i] : wc[i], bi, one[i], Ns[i], Ns[i], 0));
                outs[i] = (hyla_linear_out){b ? wg[i] : wc[i], bi, grp[i], Ns[i], Ns[i], NULL, 0};
            }
            CHECK_OK(be->ops->linear_multi(be->ctx, xd, K, M, K, 4, outs, 0, 0));
            int same = 1;
            for (int i = 0; i < 4; i++) same &= same_bits(be, one[i], grp[i], (size_t)M * Ns[i] * 4);
            CHECK_MSG(same, "%s linear_multi M=%d (4 outputs, one with bias) == 4 linear calls (bits)", be->ops->name, M);
            CHECK(be->ops->linear_multi(be->ctx, xd, K, M, K, HYLA_LINEAR_MULTI_MAX + 1, outs, 0, 0) == HYLA_ERR_INVALID_ARG);
            for (int i = 0; i < 4; i++) {
                dfree(be, one[i]);
                dfree(be, grp[i]);
            }
        }
        pair_free(px);
        pair_free(pbias);
        free(x);
    }
    /* outputs of equal width run in pairs on the warpgroup path (from 33 rows on Hopper), narrow
     * ones up to three a launch: 2304 x 3 (a pair and a single), 6144 x 2, 128 x 3 (one launch),
     * some with a bias, as the bits of separate calls. The first round draws from the shared
     * stream what it always has (the cases after this one keep their inputs); its fifth weight
     * and the narrow round draw from streams of their own. */
    for (int wide = 1; wide >= 0; wide--) {
        const int N2[5] = {wide ? 2304 : 128, wide ? 2304 : 128, 6144, 6144, wide ? 2304 : 128};
        hyla_weight *wp[5];
        float *Wp[5];
        const hyla_rng shared = rng;
        if (!wide) hyla_rng_seed(&rng, 20261128);
        for (int i = 0; i < 5; i++) {
            hyla_rng keep = rng;
            if (i == 4 && wide) hyla_rng_seed(&rng, 20261129);
            Wp[i] = (i == 0 && wide) ? W[0] : i == 2 ? W[3] : randn((size_t)N2[i] * K, 1.0f / sqrtf((float)K));
            if (i == 4 && wide) rng = keep;
            CHECK_OK(gpu->ops->weight_create(gpu->ctx, Wp[i], HYLA_DT_F32, N2[i], K, &wp[i]));
        }
        const int Mp[4] = {33, 64, 100, 200};
        for (int mi = 0; mi < 4; mi++) {
            const int M = Mp[mi];
            float *x = randn((size_t)M * K, 1.0f);
            void *xd = dev(gpu, x, (size_t)M * K * 4), *bd = dev(gpu, bias, 6144 * 4);
            float *one[5], *grp[5];
            hyla_linear_out outs[5];
            for (int i = 0; i < 5; i++) {
                one[i] = dev(gpu, NULL, (size_t)M * N2[i] * 4);
                grp[i] = dev(gpu, NULL, (size_t)M * N2[i] * 4);
                const float *bi = i & 1 || i == 4 ? (const float *)bd : NULL;
                CHECK_OK(gpu->ops->linear(gpu->ctx, xd, K, M, K, wp[i], bi, one[i], N2[i], N2[i], 0));
                outs[i] = (hyla_linear_out){wp[i], bi, grp[i], N2[i], N2[i], NULL, 0};
            }
            CHECK_OK(gpu->ops->linear_multi(gpu->ctx, xd, K, M, K, 5, outs, 0, 0));
            int same = 1;
            for (int i = 0; i < 5; i++) same &= same_bits(gpu, one[i], grp[i], (size_t)M * N2[i] * 4);
            CHECK_MSG(same, "linear_multi M=%d, outputs %d, %d (bias), 6144, 6144 (bias), %d (bias) == 5 linear calls (bits)",
                      M, N2[0], N2[1], N2[4]);
            for (int i = 0; i < 5; i++) dfree(gpu, one[i]), dfree(gpu, grp[i]);
            dfree(gpu, xd), dfree(gpu, bd);
            free(x);
        }
        for (int i = 0; i < 5; i++) {
            gpu->ops->weight_destroy(gpu->ctx, wp[i]);
            if (i & 1 || i == 4 || (i == 0 && !wide)) free(Wp[i]);
        }
        if (!wide) rng = shared;
    }
    /* prompt rows (HYLA_LINEAR_PREFILL: cuBLAS at a fixed row count on the GPU): a row's result
     * depends only on the row — the same bits whatever the call's size, the row's place in it and
     * the other rows (calls of 2500 rows: whole 1024-row blocks, written straight into y, and a
     * partial one through scratch; of 37 rows at offset R; of 1 row; the 2500-row call again with
     * other rows around); close to the CPU; bias and accumulate as documented */
    for (int R = 500; R <= 2100; R += 800) { /* R = 500, 1300 (whole blocks), 2100 (the partial block) */
        const int MB = 2500;
        float *x = randn((size_t)MB * K, 1.0f), *x2 = randn((size_t)MB * K, 1.0f), *y0 = randn((size_t)MB * 6144, 1.0f);
        memcpy(x2 + (size_t)R * K, x + (size_t)R * K, (size_t)37 * K * sizeof(float)); /* rows R..R+36 shared */
        pair px = pair_new(x, (size_t)MB * K), px2 = pair_new(x2, (size_t)MB * K), pbias = pair_new(bias, 6144);
        for (int i = 0; i < 4; i++) {
            size_t ny = (size_t)MB * Ns[i];
            const float *bi = i == 1 ? (const float *)pbias.g : NULL;
            pair pa = pair_new(y0, ny);
            void *b37 = dev(gpu, y0 + (size_t)R * Ns[i], (size_t)37 * Ns[i] * 4),
                 *b1 = dev(gpu, y0 + (size_t)(R + 36) * Ns[i], (size_t)Ns[i] * 4);
            void *bo = dev(gpu, y0, ny * 4);
            int acc = i == 2;
            hyla_linear_out o1 = {wg[i], bi, pa.g, Ns[i], Ns[i], NULL, 0}, o37 = {wg[i], bi, b37, Ns[i], Ns[i], NULL, 0},
                            oo = {wg[i], bi, bo, Ns[i], Ns[i], NULL, 0}, o1r = {wg[i], bi, b1, Ns[i], Ns[i], NULL, 0};
            CHECK_OK(gpu->ops->linear_multi(gpu->ctx, px.g, K, MB, K, 1, &o1, acc, HYLA_LINEAR_PREFILL));
            CHECK_OK(gpu->ops->linear_multi(gpu->ctx, (float *)px.g + (size_t)R * K, K, 37, K, 1, &o37, acc,
                                            HYLA_LINEAR_PREFILL));
            CHECK_OK(gpu->ops->linear_multi(gpu->ctx, (float *)px.g + (size_t)(R + 36) * K, K, 1, K, 1, &o1r, acc,
                                            HYLA_LINEAR_PREFILL));
            CHECK_OK(gpu->ops->linear_multi(gpu->ctx, px2.g, K, MB, K, 1, &oo, acc, HYLA_LINEAR_PREFILL));
            CHECK_MSG(same_bits(gpu, (float *)pa.g + (size_t)R * Ns[i], b37, (size_t)37 * Ns[i] * 4) &&
                          same_bits(gpu, (float *)pa.g + (size_t)(R + 36) * Ns[i], b1, (size_t)Ns[i] * 4) &&
                          same_bits(gpu, (float *)pa.g + (size_t)R * Ns[i], (float *)bo + (size_t)R * Ns[i],
                                    (size_t)37 * Ns[i] * 4),
                      "linear_multi HYLA_LINEAR_PREFILL N=%d%s%s: rows %d..%d of %d == the same rows in a "
                      "37-row call, alone, and among other rows (bits)", Ns[i], bi ? " bias" : "", acc ? " acc" : "", R,
                      R + 36, MB);
            if (R == 500) { /* against the CPU, once */
                hyla_linear_out oc = {wc[i], i == 1 ? (const float *)pbias.c : NULL, pa.c, Ns[i], Ns[i], NULL, 0};
                CHECK_OK(cpu->ops->linear_multi(cpu->ctx, px.c, K, MB, K, 1, &oc, acc, HYLA_LINEAR_PREFILL));
                char name[96];
                snprintf(name, sizeof name, "linear prompt rows M=%d N=%d%s", MB, Ns[i], acc ? " acc" : "");
                cmp_pair(name, pa, LIN_TOL);
            }
            pair_free(pa);
            dfree(gpu, b37);
            dfree(gpu, b1);
            dfree(gpu, bo);
        }
        pair_free(px);
        pair_free(px2);
        pair_free(pbias);
        free(x);
        free(x2);
        free(y0);
    }
    /* prompt rows of a narrow output (at most one skinny column tile: GDN's a and b gates) run
     * the skinny kernel's arithmetic: each row's bits are those ops->linear gives it as a decode
     * row (rows R..R+36 of a 2500-row prompt call == a 37-row decode call == row R alone), with
     * a bias and with accumulate */
    {
        const int MB = 2500, R = 2100, N = 18;
        float *Wn = randn((size_t)N * K, 1.0f / sqrtf((float)K));
        hyla_weight *wn;
        CHECK_OK(gpu->ops->weight_create(gpu->ctx, Wn, HYLA_DT_F32, N, K, &wn));
        float *x = randn((size_t)MB * K, 1.0f), *y0 = randn((size_t)MB * N, 1.0f);
        pair px = pair_new(x, (size_t)MB * K), pbias = pair_new(bias, N);
        for (int v = 0; v < 3; v++) { /* plain, bias, accumulate */
            const float *bi = v == 1 ? (const float *)pbias.g : NULL;
            const int acc = v == 2;
            void *yp = dev(gpu, y0, (size_t)MB * N * 4), *y37 = dev(gpu, y0 + (size_t)R * N, (size_t)37 * N * 4),
                 *y1 = dev(gpu, y0 + (size_t)R * N, (size_t)N * 4);
            hyla_linear_out op = {wn, bi, yp, N, N, NULL, 0};
            CHECK_OK(gpu->ops->linear_multi(gpu->ctx, px.g, K, MB, K, 1, &op, acc, HYLA_LINEAR_PREFILL));
            CHECK_OK(gpu->ops->linear(gpu->ctx, (float *)px.g + (size_t)R * K, K, 37, K, wn, bi, y37, N, N, acc));
            CHECK_OK(gpu->ops->linear(gpu->ctx, (float *)px.g + (size_t)R * K, K, 1, K, wn, bi, y1, N, N, acc));
            CHECK_MSG(same_bits(gpu, (float *)yp + (size_t)R * N, y37, (size_t)37 * N * 4) &&
                          same_bits(gpu, (float *)yp + (size_t)R * N, y1, (size_t)N * 4),
                      "linear_multi HYLA_LINEAR_PREFILL N=%d%s%s: rows %d..%d of %d == the same rows as decode rows "
                      "(37 and 1; bits)", N, bi ? " bias" : "", acc ? " acc" : "", R, R + 36, MB);
            dfree(gpu, yp);
            dfree(gpu, y37);
            dfree(gpu, y1);
        }
        pair_free(px);
        pair_free(pbias);
        free(x);
        free(y0);
        gpu->ops->weight_destroy(gpu->ctx, wn);
        free(Wn);
    }
    /* prompt rows of one call with several outputs of the same N (q, k, v; gate and up), each its
     * own GEMM on the CUDA backend. Outputs
     * 2304 (no bias), 2304 (bias), 16 (alone), 2304: rows R..R+36 of a 2500-row call (whole
     * blocks straight into y, the partial block through scratch) == the same rows in a 37-row
     * call (scratch), for each output, with and without accumulate; close to the CPU. */
    {
        const int MB = 2500, R = 2100, NG[4] = {2304, 2304, 16, 2304};
        float *Wx[2];
        hyla_weight *wxc[2], *wxg[2];
        for (int i = 0; i < 2; i++) {
            Wx[i] = randn((size_t)2304 * K, 1.0f / sqrtf((float)K));
            CHECK_OK(cpu->ops->weight_create(cpu->ctx, Wx[i], HYLA_DT_F32, 2304, K, &wxc[i]));
            CHECK_OK(gpu->ops->weight_create(gpu->ctx, Wx[i], HYLA_DT_F32, 2304, K, &wxg[i]));
        }
        const hyla_weight *wgg[4] = {wg[0], wxg[0], wg[2], wxg[1]}, *wgc[4] = {wc[0], wxc[0], wc[2], wxc[1]};
        float *x = randn((size_t)MB * K, 1.0f), *y0 = randn((size_t)MB * 2304, 1.0f);
        pair px = pair_new(x, (size_t)MB * K), pbias = pair_new(bias, 6144);
        for (int acc = 0; acc < 2; acc++) {
            pair py[4];
            void *y37[4];
            hyla_linear_out og[4], o37[4], oc[4];
            for (int i = 0; i < 4; i++) {
                py[i] = pair_new(y0, (size_t)MB * NG[i]);
                y37[i] = dev(gpu, y0 + (size_t)R * NG[i], (size_t)37 * NG[i] * 4);
                og[i] = (hyla_linear_out){wgg[i], i == 1 ? (const float *)pbias.g : NULL, py[i].g, NG[i], NG[i], NULL, 0};
                o37[i] = og[i];
                o37[i].y = y37[i];
                oc[i] = (hyla_linear_out){wgc[i], i == 1 ? (const float *)pbias.c : NULL, py[i].c, NG[i], NG[i], NULL, 0};
            }
            CHECK_OK(gpu->ops->linear_multi(gpu->ctx, px.g, K, MB, K, 4, og, acc, HYLA_LINEAR_PREFILL));
            CHECK_OK(gpu->ops->linear_multi(gpu->ctx, (float *)px.g + (size_t)R * K, K, 37, K, 4, o37, acc,
                                            HYLA_LINEAR_PREFILL));
            CHECK_OK(cpu->ops->linear_multi(cpu->ctx, px.c, K, MB, K, 4, oc, acc, HYLA_LINEAR_PREFILL));
            int same = 1;
            for (int i = 0; i < 4; i++) {
                same &= same_bits(gpu, (float *)py[i].g + (size_t)R * NG[i], y37[i], (size_t)37 * NG[i] * 4);
                char name[96];
                snprintf(name, sizeof name, "linear prompt rows, 4 outputs (3 x 2304) M=%d: output %d%s", MB, i,
                         acc ? " acc" : "");
                cmp_pair(name, py[i], LIN_TOL);
            }
            CHECK_MSG(same, "linear_multi HYLA_LINEAR_PREFILL, outputs 2304, 2304 (bias), 16, 2304%s: rows %d..%d of %d "
                            "== the same rows in a 37-row call (bits)", acc ? " acc" : "", R, R + 36, MB);
            for (int i = 0; i < 4; i++) {
                pair_free(py[i]);
                dfree(gpu, y37[i]);
            }
        }
        pair_free(px);
        pair_free(pbias);
        free(x);
        free(y0);
        for (int i = 0; i < 2; i++) {
            cpu->ops->weight_destroy(cpu->ctx, wxc[i]);
            gpu->ops->weight_destroy(gpu->ctx, wxg[i]);
            free(Wx[i]);
        }
    }
    for (int i = 0; i < 4; i++) {
        cpu->ops->weight_destroy(cpu->ctx, wc[i]);
        gpu->ops->weight_destroy(gpu->ctx, wg[i]);
        free(W[i]);
    }
    free(bias);
}

/* swiglu_linear == swiglu then the down projection, bit for bit on the GPU: prompt rows (the
 * SwiGLU formed while rounding to bf16; 1024-row blocks straight into y and a partial block,
 * and a row alone) against swiglu + linear_multi(HYLA_LINEAR_PREFILL), decode rows (the skinny
 * kernel's staging at 1 row, the large-M path's bf16 pass at 40 and 200 on Hopper) against
 * swiglu + linear; close to the CPU. HYLA_LINEAR_ACC (y += the result: on prompt rows the whole
 * blocks by the GEMM's beta = 1, the partial one by the epilogue) == the add of y and the result,
 * bit for bit. */
static void case_swiglu_linear(const op_case *oc) {
    (void)oc;
    const int K = 6144, N = 2304, Ms[4] = {1300, 40, 1, 200};
    float *W = randn((size_t)N * K, 1.0f / sqrtf((float)K));
    hyla_weight *wc, *wg;
    CHECK_OK(cpu->ops->weight_create(cpu->ctx, W, HYLA_DT_F32, N, K, &wc));
    CHECK_OK(gpu->ops->weight_create(gpu->ctx, W, HYLA_DT_F32, N, K, &wg));
    for (int mi = 0; mi < 4; mi++)
        for (int fl = 0; fl < 2; fl++) {
            const int M = Ms[mi], flags = fl ? HYLA_LINEAR_PREFILL : 0;
            float *g = randn((size_t)M * K, 2.0f), *u = randn((size_t)M * K, 1.0f);
            pair pg = pair_new(g, (size_t)M * K), pu = pair_new(u, (size_t)M * K), py = pair_new(NULL, (size_t)M * N);
            float *g2 = dev(gpu, g, (size_t)M * K * 4), *y2 = dev(gpu, NULL, (size_t)M * N * 4);
            CHECK_OK(cpu->ops->swiglu_linear(cpu->ctx, pg.c, pu.c, M, K, wc, py.c, N, flags));
            CHECK_OK(gpu->ops->swiglu_linear(gpu->ctx, pg.g, pu.g, M, K, wg, py.g, N, flags));
            CHECK_OK(gpu->ops->swiglu(gpu->ctx, g2, pu.g, g2, (size_t)M * K));
            if (fl) {
                hyla_linear_out lo = {wg, NULL, y2, N, N, NULL, 0};
                CHECK_OK(gpu->ops->linear_multi(gpu->ctx, g2, K, M, K, 1, &lo, 0, HYLA_LINEAR_PREFILL));
            } else {
                CHECK_OK(gpu->ops->linear(gpu->ctx, g2, K, M, K, wg, NULL, y2, N, N, 0));
            }
            char name[80];
            snprintf(name, sizeof name, "swiglu_linear M=%d%s", M, fl ? " (prompt rows)" : "");
            cmp_pair(name, py, LIN_TOL);
            CHECK_MSG(same_bits(gpu, py.g, y2, (size_t)M * N * 4), "%s: differs from swiglu then the linear", name);
            {
                float *y0 = randn((size_t)M * N, 1.0f);
                float *ya = dev(gpu, y0, (size_t)M * N * 4), *yb = dev(gpu, y0, (size_t)M * N * 4),
                      *g3 = dev(gpu, g, (size_t)M * K * 4);
                CHECK_OK(gpu->ops->swiglu_linear(gpu->ctx, g3, pu.g, M, K, wg, ya, N, flags | HYLA_LINEAR_ACC));
                CHECK_OK(gpu->ops->add(gpu->ctx, yb, y2, (size_t)M * N));
                CHECK_MSG(same_bits(gpu, ya, yb, (size_t)M * N * 4), "%s, HYLA_LINEAR_ACC: differs from y + the result",
                          name);
                dfree(gpu, ya);
                dfree(gpu, yb);
                dfree(gpu, g3);
                free(y0);
            }
            pair_free(pg);
            pair_free(pu);
            pair_free(py);
            dfree(gpu, g2);
            dfree(gpu, y2);
            free(g);
            free(u);
        }
    cpu->ops->weight_destroy(cpu->ctx, wc);
    gpu->ops->weight_destroy(gpu->ctx, wg);
    free(W);
}

/* gated_rmsnorm_linear == the gated RMSNorm in place then the projection, bit for bit on the
 * GPU, for heads of 256 (two units a lane), 128 (one) and 1024 (a block per row), with and
 * without the gate, prompt rows (1024-row blocks and a partial one) and decode rows (1, 3, 40,
 * 200; with HYLA_LINEAR_ACC for the one-row-tile sizes); close to the CPU. */
/* ... and for prompt rows with a gate: the gate as bf16 rows (HYLA_LINEAR_GATE_BF16) == the fp32
 * gate of the same values, bit for bit; with HYLA_LINEAR_ACC == the add of y and the result. */
/* gated_rmsnorm_linear(o [M][H*D], gate, w) with flags | HYLA_LINEAR_ACC onto a random y ==
 * that y + y2 (the result without HYLA_LINEAR_ACC), bit for bit. */
static void gnl_acc_check(const char *name, const float *o, const float *gate, const float *w, int H, int D, int M,
                          hyla_weight *wg, int N, const float *y2, int flags) {
    const int K = H * D;
    float *y0 = randn((size_t)M * N, 1.0f);
    float *ya = dev(gpu, y0, (size_t)M * N * 4), *yb = dev(gpu, y0, (size_t)M * N * 4), *o4 = dev(gpu, o, (size_t)M * K * 4);
    CHECK_OK(gpu->ops->gated_rmsnorm_linear(gpu->ctx, o4, gate, w, H, D, 1e-6f, M, wg, ya, N, flags | HYLA_LINEAR_ACC));
    CHECK_OK(gpu->ops->add(gpu->ctx, yb, y2, (size_t)M * N));
    CHECK_MSG(same_bits(gpu, ya, yb, (size_t)M * N * 4), "%s: HYLA_LINEAR_ACC differs from y + the result", name);
    dfree(gpu, ya);
    dfree(gpu, yb);
    dfree(gpu, o4);
    free(y0);
}

static void case_gated_rmsnorm_linear(const op_case *oc) {
    (void)oc;
    const int N = 2304, Ms[5] = {1300, 40, 200, 1, 3};
    const int HD[3][2] = {{18, 256}, {18, 128}, {2, 1024}};
    for (int hi = 0; hi < 3; hi++) {
        const int H = HD[hi][0], D = HD[hi][1], K = H * D;
        float *W = randn((size_t)N * K, 1.0f / sqrtf((float)K)), *nw = randu(D, 0.5f, 1.5f);
        hyla_weight *wc, *wg;
        CHECK_OK(cpu->ops->weight_create(cpu->ctx, W, HYLA_DT_F32, N, K, &wc));
        CHECK_OK(gpu->ops->weight_create(gpu->ctx, W, HYLA_DT_F32, N, K, &wg));
        pair pn = pair_new(nw, D);
        for (int mi = 0; mi < 5; mi++)
            for (int v = 0; v < 4; v++) {
                const int M = Ms[mi], fl = v & 1, gated = v >> 1, flags = fl ? HYLA_LINEAR_PREFILL : 0;
                float *o = randn((size_t)M * K, 1.0f), *g = randn((size_t)M * K, 2.0f);
                round_bf16(g, (size_t)M * K); /* so that a bf16 gate holds the same values (below) */
                pair po = pair_new(o, (size_t)M * K), pg = pair_new(g, (size_t)M * K), py = pair_new(NULL, (size_t)M * N);
                float *o2 = dev(gpu, o, (size_t)M * K * 4), *y2 = dev(gpu, NULL, (size_t)M * N * 4);
                const float *gc = gated ? pg.c : NULL, *gg = gated ? pg.g : NULL;
                CHECK_OK(cpu->ops->gated_rmsnorm_linear(cpu->ctx, po.c, gc, pn.c, H, D, 1e-6f, M, wc, py.c, N, flags));
                CHECK_OK(gpu->ops->gated_rmsnorm_linear(gpu->ctx, po.g, gg, pn.g, H, D, 1e-6f, M, wg, py.g, N, flags));
                CHECK_OK(gpu->ops->gated_rmsnorm(gpu->ctx, o2, gg, pn.g, o2, M * H, D, 1e-6f));
                if (fl) {
                    hyla_linear_out lo = {wg, NULL, y2, N, N, NULL, 0};
                    CHECK_OK(gpu->ops->linear_multi(gpu->ctx, o2, K, M, K, 1, &lo, 0, HYLA_LINEAR_PREFILL));
                } else {
                    CHECK_OK(gpu->ops->linear(gpu->ctx, o2, K, M, K, wg, NULL, y2, N, N, 0));
                }
                char name[96];
                snprintf(name, sizeof name, "gated_rmsnorm_linear H=%d D=%d M=%d%s%s", H, D, M, gated ? " gate" : "",
                         fl ? " (prompt)" : "");
                cmp_pair(name, py, LIN_TOL);
                CHECK_MSG(same_bits(gpu, py.g, y2, (size_t)M * N * 4), "%s: differs from the norm then the linear", name);
                if (!fl && M <= 4) gnl_acc_check(name, o, gg, pn.g, H, D, M, wg, N, y2, 0); /* decode rows */
                if (fl && gated && gpu->ops->rmsnorm_bf16) { /* the gate as bf16 rows (HYLA_LINEAR_GATE_BF16) */
                    uint16_t *gb = malloc((size_t)M * K * 2 + 4);
                    for (size_t e = 0; e < (size_t)M * K; e++) gb[e] = hyla_f32_to_bf16(g[e]);
                    void *dgb = dev(gpu, gb, (size_t)M * K * 2);
                    float *o3 = dev(gpu, o, (size_t)M * K * 4), *y3 = dev(gpu, NULL, (size_t)M * N * 4);
                    CHECK_OK(gpu->ops->gated_rmsnorm_linear(gpu->ctx, o3, (const float *)dgb, pn.g, H, D, 1e-6f, M, wg, y3,
                                                            N, HYLA_LINEAR_PREFILL | HYLA_LINEAR_GATE_BF16));
                    CHECK_MSG(same_bits(gpu, py.g, y3, (size_t)M * N * 4), "%s: with the gate in bf16 rows differs", name);
                    gnl_acc_check(name, o, (const float *)dgb, pn.g, H, D, M, wg, N, y2,
                                  HYLA_LINEAR_PREFILL | HYLA_LINEAR_GATE_BF16);
                    hyla_status sb = gpu->ops->gated_rmsnorm_linear(gpu->ctx, o3, (const float *)dgb, pn.g, H, D, 1e-6f, M,
                                                                    wg, y3, N, HYLA_LINEAR_GATE_BF16);
                    if (sb == HYLA_OK) sb = gpu->ops->sync(gpu->ctx);
                    CHECK_MSG(sb == HYLA_ERR_INVALID_ARG, "%s: a bf16 gate without prompt rows is refused", name);
                    dfree(gpu, dgb);
                    dfree(gpu, o3);
                    dfree(gpu, y3);
                    free(gb);
                }
                pair_free(po);
                pair_free(pg);
                pair_free(py);
                dfree(gpu, o2);
                dfree(gpu, y2);
                free(o);
                free(g);
            }
        pair_free(pn);
        cpu->ops->weight_destroy(cpu->ctx, wc);
        gpu->ops->weight_destroy(gpu->ctx, wg);
        free(W);
        free(nw);
    }
}

/* rmsnorm_bf16, p = {n, D, row offset}: the norm's rows rounded to bf16 as stored are the fp32 op's
 * rounded (residual: the same bits), with and without the residual add; and prompt-row linears
 * from them (HYLA_LINEAR_X_BF16) give the bits of the linears from the fp32 rows, in whole 1024-row
 * blocks read in place, a partial block, and rows at an offset that is not 256-byte aligned (both
 * copied to the scratch). */
static void case_rmsnorm_bf16(const op_case *c) {
    if (!gpu->ops->rmsnorm_bf16) {
        printf("  (no rmsnorm_bf16 in this backend)\n");
        return;
    }
    const int n = c->p[0], D = c->p[1], off = c->p[2], N = 640, rows = n + off;
    const size_t nd = (size_t)rows * D;
    float *x = randn(nd, 1.0f), *r = randn(nd, 2.0f), *w = randn(D, 1.0f), *W = randn((size_t)N * D, 0.05f);
    round_bf16(W, (size_t)N * D);
    hyla_weight *wg;
    CHECK_OK(gpu->ops->weight_create(gpu->ctx, W, HYLA_DT_F32, N, D, &wg));
    float *dx = dev(gpu, x, nd * 4), *dw = dev(gpu, w, (size_t)D * 4);
    float *ra = dev(gpu, r, nd * 4), *rb = dev(gpu, r, nd * 4), *ya = dev(gpu, NULL, nd * 4);
    void *yb = dev(gpu, NULL, nd * 2);
    float *la = dev(gpu, NULL, (size_t)rows * N * 4), *lb = dev(gpu, NULL, (size_t)rows * N * 4), *lc = dev(gpu, NULL, (size_t)rows * N * 2 * 4);
    for (int add = 0; add < 2; add++) {
        const size_t o = (size_t)off * D;
        if (add)
            CHECK_OK(gpu->ops->add_rmsnorm(gpu->ctx, ra + o, dx + o, dw, ya + o, n, D, 1e-6f));
        else
            CHECK_OK(gpu->ops->rmsnorm(gpu->ctx, ra + o, dw, ya + o, n, D, 1e-6f));
        CHECK_OK(gpu->ops->rmsnorm_bf16(gpu->ctx, rb + o, add ? dx + o : NULL, dw, (uint16_t *)yb + o, n, D, 1e-6f));
        float *hya = host_of(gpu, ya + o, (size_t)n * D);
        uint16_t *hyb = malloc((size_t)n * D * 2 + 4);
        CHECK_OK(gpu->ops->download(gpu->ctx, hyb, (uint16_t *)yb + o, (size_t)n * D * 2));
        size_t bad = 0;
        for (size_t i = 0; i < (size_t)n * D; i++) bad += hyb[i] != hyla_f32_to_bf16(hya[i]);
        CHECK_MSG(bad == 0, "rmsnorm_bf16 n=%d D=%d off=%d%s: %zu of %zu values are not the fp32 norm's, rounded", n, D,
                  off, add ? " (add)" : "", bad, (size_t)n * D);
        CHECK_MSG(same_bits(gpu, ra, rb, nd * 4), "rmsnorm_bf16 n=%d D=%d%s: the residual == add_rmsnorm's (bits)", n, D,
                  add ? " (add)" : "");
        /* one output, then two of the same N (grouped as the MLP's gate and up) */
        hyla_linear_out oa = {wg, NULL, la + (size_t)off * N, N, N, NULL, 0}, ob = {wg, NULL, lb + (size_t)off * N, N, N, NULL, 0};
        CHECK_OK(gpu->ops->linear_multi(gpu->ctx, ya + o, D, n, D, 1, &oa, 0, HYLA_LINEAR_PREFILL));
        CHECK_OK(gpu->ops->linear_multi(gpu->ctx, (const float *)((uint16_t *)yb + o), D, n, D, 1, &ob, 0,
                                        HYLA_LINEAR_PREFILL | HYLA_LINEAR_X_BF16));
        CHECK_MSG(same_bits(gpu, la + (size_t)off * N, lb + (size_t)off * N, (size_t)n * N * 4),
                  "linear_multi from rmsnorm_bf16's rows n=%d D=%d off=%d == from the fp32 norm's (bits)", n, D, off);
        hyla_linear_out o2[2] = {{wg, NULL, lc, N, N, NULL, 0}, {wg, NULL, lc + (size_t)n * N, N, N, NULL, 0}};
        CHECK_OK(gpu->ops->linear_multi(gpu->ctx, (const float *)((uint16_t *)yb + o), D, n, D, 2, o2, 0,
                                        HYLA_LINEAR_PREFILL | HYLA_LINEAR_X_BF16));
        CHECK_MSG(same_bits(gpu, la + (size_t)off * N, lc, (size_t)n * N * 4) &&
                      same_bits(gpu, la + (size_t)off * N, lc + (size_t)n * N, (size_t)n * N * 4),
                  "linear_multi of two outputs from rmsnorm_bf16's rows n=%d D=%d == one (bits)", n, D);
        free(hya);
        free(hyb);
    }
    /* bf16 rows without prompt rows: refused with bf16 outputs, and at decode rows that do not
     * take them (decode_bf16_rows; case_decode_bf16 runs those that do) */
    hyla_linear_out bad = {wg, NULL, la, N, N, NULL, 0};
    const int fl = gpu->ops->decode_bf16_rows(gpu->ctx, n, D) ? HYLA_LINEAR_X_BF16 | HYLA_LINEAR_Y_BF16 : HYLA_LINEAR_X_BF16;
    hyla_status sb = gpu->ops->linear_multi(gpu->ctx, ya, D, n, D, 1, &bad, 0, fl);
    if (sb == HYLA_OK) sb = gpu->ops->sync(gpu->ctx); /* a logged op reports at the sync */
    CHECK_MSG(sb == HYLA_ERR_INVALID_ARG, "bf16 rows without prompt rows (flags %d, %d rows) are refused", fl, n);
    gpu->ops->weight_destroy(gpu->ctx, wg);
    dfree(gpu, dx);
    dfree(gpu, dw);
    dfree(gpu, ra);
    dfree(gpu, rb);
    dfree(gpu, ya);
    dfree(gpu, yb);
    dfree(gpu, la);
    dfree(gpu, lb);
    dfree(gpu, lc);
    free(x);
    free(r);
    free(w);
    free(W);
}

/* Decode rows from the norm's bf16 rows (ops->decode_bf16_rows; HYLA_LINEAR_X_BF16 without
 * HYLA_LINEAR_PREFILL), p = {M, K}: where the backend takes them, linear_multi from rmsnorm_bf16's
 * rows gives the bits of the same call from the fp32 norm's rows, for one output (1024 wide, a
 * bias), and for three (640 wide; 64 and 4 wide with a bias: the skinny kernel's grouped launch up
 * to 64 rows); where it does not (16 rows and fewer, K % 8 != 0, HYLA_CUDA_DECODE_BF16=0), the call
 * is refused. */
static void case_decode_bf16(const op_case *c) {
    const int M = c->p[0], K = c->p[1];
    const int take = gpu->ops->decode_bf16_rows(gpu->ctx, M, K);
    const int Ns[4] = {1024, 640, 64, 4};
    hyla_rng saved = rng; /* the cases after this one keep the inputs they have had */
    float *x = randn((size_t)M * K, 1.0f), *r = randn((size_t)M * K, 2.0f), *w = randn(K, 1.0f);
    float *dx = dev(gpu, x, (size_t)M * K * 4), *dw = dev(gpu, w, (size_t)K * 4);
    float *ra = dev(gpu, r, (size_t)M * K * 4), *rb = dev(gpu, r, (size_t)M * K * 4), *xa = dev(gpu, NULL, (size_t)M * K * 4);
    void *xb = dev(gpu, NULL, (size_t)M * K * 2);
    CHECK_OK(gpu->ops->add_rmsnorm(gpu->ctx, ra, dx, dw, xa, M, K, 1e-6f));
    CHECK_OK(gpu->ops->rmsnorm_bf16(gpu->ctx, rb, dx, dw, xb, M, K, 1e-6f));
    hyla_weight *wg[4];
    float *bias = randn(1024, 0.5f), *db = dev(gpu, bias, 1024 * 4), *ya[4], *yb[4];
    for (int j = 0; j < 4; j++) {
        float *W = randn((size_t)Ns[j] * K, 0.05f);
        round_bf16(W, (size_t)Ns[j] * K);
        CHECK_OK(gpu->ops->weight_create(gpu->ctx, W, HYLA_DT_F32, Ns[j], K, &wg[j]));
        ya[j] = dev(gpu, NULL, (size_t)M * Ns[j] * 4);
        yb[j] = dev(gpu, NULL, (size_t)M * Ns[j] * 4);
        free(W);
    }
    hyla_linear_out oa[4], ob[4];
    for (int j = 0; j < 4; j++) {
        const float *bj = j == 0 || j == 3 ? db : NULL;
        oa[j] = (hyla_linear_out){wg[j], bj, ya[j], Ns[j], Ns[j], NULL, 0};
        ob[j] = (hyla_linear_out){wg[j], bj, yb[j], Ns[j], Ns[j], NULL, 0};
    }
    hyla_status st = gpu->ops->linear_multi(gpu->ctx, (const float *)xb, K, M, K, 1, ob, 0, HYLA_LINEAR_X_BF16);
    if (st == HYLA_OK) st = gpu->ops->sync(gpu->ctx); /* a logged op reports at the sync */
    if (!take) {
        CHECK_MSG(st == HYLA_ERR_INVALID_ARG && strstr(hyla_last_error(), "decode_bf16_rows"),
                  "decode bf16 rows at M=%d K=%d, which the backend does not take: refused (%s)", M, K, hyla_last_error());
        printf("  M=%d K=%d: bf16 decode rows not taken, refused\n", M, K);
    } else {
        CHECK_OK(st);
        CHECK_OK(gpu->ops->linear_multi(gpu->ctx, xa, K, M, K, 1, oa, 0, 0));
        CHECK_OK(gpu->ops->linear_multi(gpu->ctx, xa, K, M, K, 3, oa + 1, 0, 0));
        CHECK_OK(gpu->ops->linear_multi(gpu->ctx, (const float *)xb, K, M, K, 3, ob + 1, 0, HYLA_LINEAR_X_BF16));
        for (int j = 0; j < 4; j++)
            CHECK_MSG(same_bits(gpu, ya[j], yb[j], (size_t)M * Ns[j] * 4),
                      "decode linear_multi from rmsnorm_bf16's rows, M=%d K=%d N=%d (of %d outputs) == from the fp32 "
                      "norm's (bits)", M, K, Ns[j], j ? 3 : 1);
        printf("  M=%d K=%d: bf16 decode rows, 1 and 3 outputs (1024; 640, 64, 4) == fp32 rows' bits\n", M, K);
    }
    for (int j = 0; j < 4; j++) {
        gpu->ops->weight_destroy(gpu->ctx, wg[j]);
        dfree(gpu, ya[j]);
        dfree(gpu, yb[j]);
    }
    dfree(gpu, dx);
    dfree(gpu, dw);
    dfree(gpu, ra);
    dfree(gpu, rb);
    dfree(gpu, xa);
    dfree(gpu, xb);
    dfree(gpu, db);
    free(x);
    free(r);
    free(w);
    free(bias);
    rng = saved;
}

/* HYLA_LINEAR_Y_BF16, p = {M, N}: prompt-row linears writing bf16 (the MLP's gate and up): a row's
 * result is the same bits in a call of M rows (whole blocks straight into y, a partial one through
 * the scratch), of 37 rows at an offset and of one row; within bf16 rounding of the fp32 outputs;
 * swiglu_linear of the bf16 rows (HYLA_LINEAR_X_BF16) == swiglu_linear of their fp32 values, bit
 * for bit; a bias or accumulate with bf16 outputs is refused. */
static void case_linear_y_bf16(const op_case *c) {
    const int M = c->p[0], N = c->p[1], K = 2304, R = M > 100 ? M - 60 : 0, D2 = 640;
    float *x = randn((size_t)M * K, 1.0f), *W = randn((size_t)N * K, 0.03f), *W2 = randn((size_t)D2 * N, 0.03f);
    round_bf16(W, (size_t)N * K);
    round_bf16(W2, (size_t)D2 * N);
    hyla_weight *wg, *wd;
    CHECK_OK(gpu->ops->weight_create(gpu->ctx, W, HYLA_DT_F32, N, K, &wg));
    CHECK_OK(gpu->ops->weight_create(gpu->ctx, W2, HYLA_DT_F32, D2, N, &wd));
    float *dx = dev(gpu, x, (size_t)M * K * 4), *yf = dev(gpu, NULL, (size_t)M * N * 4);
    uint16_t *yb = dev(gpu, NULL, (size_t)M * N * 2), *yb2 = dev(gpu, NULL, (size_t)M * N * 2),
             *y37 = dev(gpu, NULL, (size_t)37 * N * 2), *y1 = dev(gpu, NULL, (size_t)N * 2);
    const int F = HYLA_LINEAR_PREFILL | HYLA_LINEAR_Y_BF16;
    hyla_linear_out of = {wg, NULL, yf, N, N, NULL, 0}, o2[2] = {{wg, NULL, (float *)yb, N, N, NULL, 0}, {wg, NULL, (float *)yb2, N, N, NULL, 0}};
    hyla_linear_out o37 = {wg, NULL, (float *)y37, N, N, NULL, 0}, o1 = {wg, NULL, (float *)y1, N, N, NULL, 0};
    CHECK_OK(gpu->ops->linear_multi(gpu->ctx, dx, K, M, K, 1, &of, 0, HYLA_LINEAR_PREFILL));
    CHECK_OK(gpu->ops->linear_multi(gpu->ctx, dx, K, M, K, 2, o2, 0, F));
    const int r37 = R + 37 <= M ? R : 0, n37 = M < 37 ? M : 37;
    CHECK_OK(gpu->ops->linear_multi(gpu->ctx, dx + (size_t)r37 * K, K, n37, K, 1, &o37, 0, F));
    CHECK_OK(gpu->ops->linear_multi(gpu->ctx, dx + (size_t)(M - 1) * K, K, 1, K, 1, &o1, 0, F));
    CHECK_MSG(same_bits(gpu, yb, yb2, (size_t)M * N * 2) &&
                  same_bits(gpu, yb + (size_t)r37 * N, y37, (size_t)n37 * N * 2) &&
                  same_bits(gpu, yb + (size_t)(M - 1) * N, y1, (size_t)N * 2),
              "linear_multi HYLA_LINEAR_Y_BF16 M=%d N=%d: rows == the same rows in a call of %d rows and of one (bits)", M,
              N, n37);
    float *hf = host_of(gpu, yf, (size_t)M * N), *hb = malloc((size_t)M * N * 4 + 4);
    uint16_t *hbb = malloc((size_t)M * N * 2 + 4);
    CHECK_OK(gpu->ops->download(gpu->ctx, hbb, yb, (size_t)M * N * 2));
    for (size_t i = 0; i < (size_t)M * N; i++) hb[i] = hyla_bf16_to_f32(hbb[i]);
    char name[96];
    snprintf(name, sizeof name, "linear bf16 outputs M=%d N=%d (against fp32)", M, N);
    cmp(name, hb, hf, (size_t)M * N, 5e-3, 1e-2);
    /* swiglu_linear from the bf16 rows == from their fp32 values */
    float *dg = dev(gpu, hb, (size_t)M * N * 4), *du = dev(gpu, hb, (size_t)M * N * 4);
    float *z1 = dev(gpu, NULL, (size_t)M * D2 * 4), *z2 = dev(gpu, NULL, (size_t)M * D2 * 4);
    CHECK_OK(gpu->ops->swiglu_linear(gpu->ctx, dg, du, M, N, wd, z1, D2, HYLA_LINEAR_PREFILL));
    CHECK_OK(gpu->ops->swiglu_linear(gpu->ctx, (float *)yb, (const float *)yb2, M, N, wd, z2, D2,
                                     HYLA_LINEAR_PREFILL | HYLA_LINEAR_X_BF16));
    CHECK_MSG(same_bits(gpu, z1, z2, (size_t)M * D2 * 4),
              "swiglu_linear M=%d K=%d of bf16 gate and up == of their fp32 values (bits)", M, N);
    /* refusals: at the call, or at the sync where the op was logged */
    float *bias = dev(gpu, W, (size_t)N * 4);
    hyla_linear_out ob = {wg, bias, (float *)yb, N, N, NULL, 0};
    hyla_status s1 = gpu->ops->linear_multi(gpu->ctx, dx, K, M, K, 1, &ob, 0, F);
    if (s1 == HYLA_OK) s1 = gpu->ops->sync(gpu->ctx);
    CHECK_MSG(s1 == HYLA_ERR_INVALID_ARG && strstr(hyla_last_error(), "bias"), "bf16 outputs with a bias are refused");
    hyla_status s2 = gpu->ops->linear_multi(gpu->ctx, dx, K, M, K, 1, &o1, 1, F);
    if (s2 == HYLA_OK) s2 = gpu->ops->sync(gpu->ctx);
    CHECK_MSG(s2 == HYLA_ERR_INVALID_ARG, "bf16 outputs with accumulate are refused");
    gpu->ops->weight_destroy(gpu->ctx, wg);
    gpu->ops->weight_destroy(gpu->ctx, wd);
    dfree(gpu, dx);
    dfree(gpu, yf);
    dfree(gpu, yb);
    dfree(gpu, yb2);
    dfree(gpu, y37);
    dfree(gpu, y1);
    dfree(gpu, dg);
    dfree(gpu, du);
    dfree(gpu, z1);
    dfree(gpu, z2);
    dfree(gpu, bias);
    free(x), free(W), free(W2), free(hf), free(hb), free(hbb);
}

static void case_rowops(const op_case *c) {
    (void)c;
    int n = 37, D = 2304;
    size_t nd = (size_t)n * D;
    float *x = randn(nd, 2.0f), *r = randn(nd, 1.0f), *w = randn(D, 1.0f), *g = randn(nd, 1.5f);
    pair px = pair_new(x, nd), pr = pair_new(r, nd), pw = pair_new(w, D), py = pair_new(NULL, nd), pg = pair_new(g, nd);
    CHECK_OK(cpu->ops->rmsnorm(cpu->ctx, px.c, pw.c, py.c, n, D, 1e-6f));
    CHECK_OK(gpu->ops->rmsnorm(gpu->ctx, px.g, pw.g, py.g, n, D, 1e-6f));
    cmp_pair("rmsnorm", py, FP32_TOL);
    CHECK_OK(cpu->ops->add_rmsnorm(cpu->ctx, pr.c, px.c, pw.c, py.c, n, D, 1e-6f));
    CHECK_OK(gpu->ops->add_rmsnorm(gpu->ctx, pr.g, px.g, pw.g, py.g, n, D, 1e-6f));
    cmp_pair("add_rmsnorm (y)", py, FP32_TOL);
    cmp_pair("add_rmsnorm (residual)", pr, 0, 0);
    CHECK_OK(cpu->ops->add_rmsnorm(cpu->ctx, pr.c, px.c, pw.c, px.c, n, D, 1e-6f)); /* y aliases x */
    CHECK_OK(gpu->ops->add_rmsnorm(gpu->ctx, pr.g, px.g, pw.g, px.g, n, D, 1e-6f));
    cmp_pair("add_rmsnorm (y aliases x)", px, FP32_TOL);
    CHECK_OK(cpu->ops->add(cpu->ctx, px.c, pg.c, nd));
    CHECK_OK(gpu->ops->add(gpu->ctx, px.g, pg.g, nd));
    cmp_pair("add", px, FP32_TOL);
    CHECK_OK(cpu->ops->swiglu(cpu->ctx, pg.c, px.c, py.c, nd));
    CHECK_OK(gpu->ops->swiglu(gpu->ctx, pg.g, px.g, py.g, nd));
    cmp_pair("swiglu", py, FP32_TOL);
    CHECK_OK(cpu->ops->swiglu(cpu->ctx, pg.c, px.c, pg.c, nd)); /* out aliases gate */
    CHECK_OK(gpu->ops->swiglu(gpu->ctx, pg.g, px.g, pg.g, nd));
    cmp_pair("swiglu (out aliases gate)", pg, FP32_TOL);
    CHECK_OK(cpu->ops->silu(cpu->ctx, py.c, nd));
    CHECK_OK(gpu->ops->silu(gpu->ctx, py.g, nd));
    cmp_pair("silu", py, FP32_TOL);
    pair_free(pg);
    float *g2 = randn(nd, 4.0f);
    pg = pair_new(g2, nd);
    CHECK_OK(cpu->ops->gla_gate(cpu->ctx, pg.c, nd, 16.0f, -INFINITY));
    CHECK_OK(gpu->ops->gla_gate(gpu->ctx, pg.g, nd, 16.0f, -INFINITY));
    cmp_pair("gla_gate", pg, FP32_TOL);
    CHECK_OK(cpu->ops->gla_gate(cpu->ctx, pg.c, nd, 2.0f, -0.05f));
    CHECK_OK(gpu->ops->gla_gate(gpu->ctx, pg.g, nd, 2.0f, -0.05f));
    cmp_pair("gla_gate (clamp_min)", pg, FP32_TOL);
    CHECK_OK(cpu->ops->softmax_rows(cpu->ctx, px.c, n, D));
    CHECK_OK(gpu->ops->softmax_rows(gpu->ctx, px.g, n, D));
    cmp_pair("softmax_rows", px, FP32_TOL);
    CHECK_OK(cpu->ops->l2norm_rows(cpu->ctx, pr.c, n * 18, 128, 1e-6f));
    CHECK_OK(gpu->ops->l2norm_rows(gpu->ctx, pr.g, n * 18, 128, 1e-6f));
    cmp_pair("l2norm_rows", pr, FP32_TOL);
    CHECK_OK(cpu->ops->gated_rmsnorm(cpu->ctx, pr.c, pg.c, pw.c, py.c, n * 18, 128, 1e-6f));
    CHECK_OK(gpu->ops->gated_rmsnorm(gpu->ctx, pr.g, pg.g, pw.g, py.g, n * 18, 128, 1e-6f));
    cmp_pair("gated_rmsnorm", py, FP32_TOL);
    CHECK_OK(cpu->ops->gated_rmsnorm(cpu->ctx, pr.c, NULL, pw.c, pr.c, n * 18, 128, 1e-6f));
    CHECK_OK(gpu->ops->gated_rmsnorm(gpu->ctx, pr.g, NULL, pw.g, pr.g, n * 18, 128, 1e-6f));
    cmp_pair("gated_rmsnorm (no gate, in place)", pr, FP32_TOL);
    pair_free(px);
    pair_free(pr);
    pair_free(pw);
    pair_free(py);
    pair_free(pg);
    free(x);
    free(r);
    free(w);
    free(g);
    free(g2);

    /* gdn gates: (1) a and b interleaved in one [n][2H] buffer (row stride 2H), outputs in
     * their own buffers; (2) outputs aliasing their inputs exactly (g = a, beta = b, stride H),
     * as the runtime calls it */
    int H = 16;
    n = 300;
    float *ab = randn((size_t)n * 2 * H, 2.0f), *alog = randn(H, 0.5f), *dtb = randn(H, 0.5f);
    for (int neg = 0; neg < 2; neg++) {
        pair pab = pair_new(ab, (size_t)n * 2 * H), pa = pair_new(alog, H), pd = pair_new(dtb, H);
        pair pgo = pair_new(NULL, (size_t)n * H), pbo = pair_new(NULL, (size_t)n * H);
        CHECK_OK(cpu->ops->gdn_gates(cpu->ctx, pab.c, 2 * H, (float *)pab.c + H, 2 * H, pa.c, pd.c, pgo.c, pbo.c, n, H,
                                     neg));
        CHECK_OK(gpu->ops->gdn_gates(gpu->ctx, pab.g, 2 * H, (float *)pab.g + H, 2 * H, pa.g, pd.g, pgo.g, pbo.g, n, H,
                                     neg));
        cmp_pair(neg ? "gdn_gates strided (g, allow_neg)" : "gdn_gates strided (g)", pgo, FP32_TOL);
        cmp_pair(neg ? "gdn_gates strided (beta, allow_neg)" : "gdn_gates strided (beta)", pbo, FP32_TOL);
        pair pa2 = pair_new(ab, (size_t)n * H), pb2 = pair_new(ab + (size_t)n * H, (size_t)n * H);
        CHECK_OK(cpu->ops->gdn_gates(cpu->ctx, pa2.c, H, pb2.c, H, pa.c, pd.c, pa2.c, pb2.c, n, H, neg));
        CHECK_OK(gpu->ops->gdn_gates(gpu->ctx, pa2.g, H, pb2.g, H, pa.g, pd.g, pa2.g, pb2.g, n, H, neg));
        cmp_pair("gdn_gates in place (g)", pa2, FP32_TOL);
        cmp_pair("gdn_gates in place (beta)", pb2, FP32_TOL);
        pair_free(pab);
        pair_free(pa);
        pair_free(pd);
        pair_free(pgo);
        pair_free(pbo);
        pair_free(pa2);
        pair_free(pb2);
    }
    free(ab);
    free(alog);
    free(dtb);

    /* rope at small and large positions */
    int Hh = 6, hd = 128;
    n = 40;
    float *xr = randn((size_t)n * Hh * hd, 1.0f);
    int32_t *pos = malloc(n * sizeof(int32_t));
    for (int i = 0; i < n; i++) pos[i] = i < 20 ? i : 131000 + 37 * i;
    pair pxr = pair_new(xr, (size_t)n * Hh * hd);
    CHECK_OK(cpu->ops->rope(cpu->ctx, pxr.c, n, Hh, hd, pos, 10000.0f));
    CHECK_OK(gpu->ops->rope(gpu->ctx, pxr.g, n, Hh, hd, pos, 10000.0f));
    cmp_pair("rope (positions up to 132k)", pxr, FP32_TOL);
    pair_free(pxr);
    free(xr);
    free(pos);

    /* short conv: B=3 sessions, n = 5 then n = 1 (decode), K = 4, tails carried */
    int B = 3, C = 200, K = 4;
    float *wc = randn((size_t)C * K, 0.5f), *bc = randn(C, 0.1f);
    float *tails0 = randn((size_t)B * (K - 1) * C, 1.0f);
    pair pw2 = pair_new(wc, (size_t)C * K), pb2 = pair_new(bc, C);
    pair pt[3];
    float *tc[3], *tg[3];
    for (int b = 0; b < B; b++) {
        pt[b] = pair_new(tails0 + (size_t)b * (K - 1) * C, (size_t)(K - 1) * C);
        tc[b] = pt[b].c;
        tg[b] = pt[b].g;
    }
    int steps[3] = {5, 1, 2};
    for (int st = 0; st < 3; st++) {
        int nn = steps[st];
        float *xin = randn((size_t)B * nn * C, 1.0f);
        pair pxin = pair_new(xin, (size_t)B * nn * C);
        CHECK_OK(cpu->ops->short_conv(cpu->ctx, pxin.c, B, nn, C, pw2.c, st == 1 ? pb2.c : NULL, K, tc, st != 2));
        CHECK_OK(gpu->ops->short_conv(gpu->ctx, pxin.g, B, nn, C, pw2.g, st == 1 ? pb2.g : NULL, K, tg, st != 2));
        char name[64];
        snprintf(name, sizeof name, "short_conv n=%d", nn);
        cmp_pair(name, pxin, FP32_TOL);
        pair_free(pxin);
        free(xin);
    }
    for (int b = 0; b < B; b++) {
        cmp_pair("short_conv tail", pt[b], 0, 0);
        pair_free(pt[b]);
    }
    pair_free(pw2);
    pair_free(pb2);
    free(wc);
    free(bc);
    free(tails0);
}

/* ---------------------------------------------------------------- row-op layouts */

/* The row ops' kernels pick a layout from D alone (units of 4 floats when D % 4 == 0, else of 1;
 * a warp per row up to 128 units, else a block; rows over 4 units per thread re-read), and
 * float4 or scalar loads from the pointers' alignment. Each layout against the CPU; n = 1 and
 * n rows give the same bits for a shared row; pointers one float off 16-byte alignment (scalar
 * loads) give the same bits as aligned ones. */
enum { RO_RMSNORM, RO_ADD_RMSNORM, RO_GATED, RO_GATED_NOGATE, RO_L2NORM, RO_SOFTMAX, RO_N };
static const char *const ro_name[RO_N] = {"rmsnorm", "add_rmsnorm", "gated_rmsnorm", "gated_rmsnorm (no gate)",
                                          "l2norm_rows", "softmax_rows"};

/* Row op `op` on b over n rows of D (hx, hr, hg [n][D], hw [D]) with every device pointer `off`
 * floats past its allocation; the output comes back into hy [n][D] (add_rmsnorm: the residual
 * into hres). */
static void run_rowop(hyla_backend *b, int op, int n, int D, int off, const float *hx, const float *hr,
                      const float *hg, const float *hw, float *hy, float *hres) {
    size_t nd = (size_t)n * D;
    float *x = dev(b, NULL, (nd + off) * 4), *r = dev(b, NULL, (nd + off) * 4), *g = dev(b, NULL, (nd + off) * 4);
    float *y = dev(b, NULL, (nd + off) * 4), *w = dev(b, NULL, ((size_t)D + off) * 4);
    CHECK_OK(b->ops->upload(b->ctx, x + off, hx, nd * 4));
    CHECK_OK(b->ops->upload(b->ctx, r + off, hr, nd * 4));
    CHECK_OK(b->ops->upload(b->ctx, g + off, hg, nd * 4));
    CHECK_OK(b->ops->upload(b->ctx, w + off, hw, (size_t)D * 4));
    const hyla_ops *o = b->ops;
    float *res = y;
    switch (op) {
    case RO_RMSNORM: CHECK_OK(o->rmsnorm(b->ctx, x + off, w + off, y + off, n, D, 1e-6f)); break;
    case RO_ADD_RMSNORM: CHECK_OK(o->add_rmsnorm(b->ctx, r + off, x + off, w + off, y + off, n, D, 1e-6f)); break;
    case RO_GATED: CHECK_OK(o->gated_rmsnorm(b->ctx, x + off, g + off, w + off, y + off, n, D, 1e-6f)); break;
    case RO_GATED_NOGATE:
        CHECK_OK(o->gated_rmsnorm(b->ctx, x + off, NULL, w + off, x + off, n, D, 1e-6f));
        res = x;
        break;
    case RO_L2NORM:
        CHECK_OK(o->l2norm_rows(b->ctx, x + off, n, D, 1e-6f));
        res = x;
        break;
    default:
        CHECK_OK(o->softmax_rows(b->ctx, x + off, n, D));
        res = x;
        break;
    }
    CHECK_OK(o->download(b->ctx, hy, res + off, nd * 4));
    if (hres) CHECK_OK(o->download(b->ctx, hres, r + off, nd * 4));
    float *bufs[] = {x, r, g, y, w};
    for (int i = 0; i < 5; i++) dfree(b, bufs[i]);
}

static void case_rowop_layouts(const op_case *c) {
    (void)c;
    /* 128: vec warp; 37: scalar warp; 2304: vec block; 2305: scalar block; 12000: vec block,
     * re-read (3000 units > 4 x 512); 4101: scalar block, re-read */
    int Ds[] = {128, 37, 2304, 2305, 12000, 4101};
    for (size_t di = 0; di < sizeof Ds / sizeof Ds[0]; di++) {
        int D = Ds[di], n = D > 4096 ? 160 : 1000, k = n / 2 + 1;
        size_t nd = (size_t)n * D;
        float *x = randn(nd, 2.0f), *r = randn(nd, 1.0f), *g = randn(nd, 1.5f), *w = randn(D, 1.0f);
        float *yc = malloc(nd * 4), *yg = malloc(nd * 4), *ya = malloc(nd * 4), *y1 = malloc((size_t)D * 4);
        float *rc = malloc(nd * 4), *rg = malloc(nd * 4), *ra = malloc(nd * 4), *r1 = malloc((size_t)D * 4);
        for (int op = 0; op < RO_N; op++) {
            int add = op == RO_ADD_RMSNORM;
            run_rowop(cpu, op, n, D, 0, x, r, g, w, yc, add ? rc : NULL);
            run_rowop(gpu, op, n, D, 0, x, r, g, w, yg, add ? rg : NULL);
            run_rowop(gpu, op, n, D, 1, x, r, g, w, ya, add ? ra : NULL);
            run_rowop(gpu, op, 1, D, 0, x + (size_t)k * D, r + (size_t)k * D, g + (size_t)k * D, w, y1,
                      add ? r1 : NULL);
            char name[96];
            snprintf(name, sizeof name, "%s D=%d n=%d", ro_name[op], D, n);
            cmp(name, yg, yc, nd, FP32_TOL);
            CHECK_MSG(!memcmp(yg, ya, nd * 4), "%s: pointers off 16-byte alignment give other bits", name);
            CHECK_MSG(!memcmp(yg + (size_t)k * D, y1, (size_t)D * 4), "%s: row %d alone gives other bits", name, k);
            if (add) {
                cmp("add_rmsnorm (residual)", rg, rc, nd, 0, 0);
                CHECK(!memcmp(rg, ra, nd * 4) && !memcmp(rg + (size_t)k * D, r1, (size_t)D * 4));
            }
        }
        float *bufs[] = {x, r, g, w, yc, yg, ya, y1, rc, rg, ra, r1};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    }

    /* elementwise: float4 body + tail (n % 4 != 0) and scalar (off alignment), the same values */
    size_t ne = 4099;
    float *ea = randn(ne, 2.0f), *eb = randn(ne, 1.0f);
    float *outc = malloc(ne * 4), *outg[2] = {malloc(ne * 4), malloc(ne * 4)};
    for (int op = 0; op < 4; op++) {
        static const char *const nm[4] = {"silu", "add", "swiglu", "gla_gate"};
        for (int bi = 0; bi < 3; bi++) { /* cpu, gpu aligned, gpu off by one float */
            hyla_backend *b = bi ? gpu : cpu;
            int off = bi == 2;
            float *da = dev(b, NULL, (ne + 1) * 4), *db = dev(b, NULL, (ne + 1) * 4);
            CHECK_OK(b->ops->upload(b->ctx, da + off, ea, ne * 4));
            CHECK_OK(b->ops->upload(b->ctx, db + off, eb, ne * 4));
            if (op == 0) CHECK_OK(b->ops->silu(b->ctx, da + off, ne));
            else if (op == 1) CHECK_OK(b->ops->add(b->ctx, da + off, db + off, ne));
            else if (op == 2) CHECK_OK(b->ops->swiglu(b->ctx, da + off, db + off, db + off, ne)); /* out aliases up */
            else CHECK_OK(b->ops->gla_gate(b->ctx, da + off, ne, 8.0f, -0.5f));
            CHECK_OK(b->ops->download(b->ctx, bi ? outg[bi - 1] : outc, (op == 2 ? db : da) + off, ne * 4));
            dfree(b, da);
            dfree(b, db);
        }
        char name[64];
        snprintf(name, sizeof name, "%s n=%zu (float4 + tail)", nm[op], ne);
        cmp(name, outg[0], outc, ne, FP32_TOL);
        CHECK_MSG(!memcmp(outg[0], outg[1], ne * 4), "%s: scalar path gives other bits", nm[op]);
    }
    free(ea);
    free(eb);
    free(outc);
    free(outg[0]);
    free(outg[1]);

    /* gdn_gates whose g overwrites a with another row stride (a, b interleaved [n][2H], g over
     * its start with stride H): the scratch path */
    {
        int H = 18, n = 300;
        float *ab = randn((size_t)n * 2 * H, 2.0f), *alog = randn(H, 0.5f), *dtb = randn(H, 0.5f);
        pair pab = pair_new(ab, (size_t)n * 2 * H), pa = pair_new(alog, H), pd = pair_new(dtb, H);
        pair pbo = pair_new(NULL, (size_t)n * H);
        CHECK_OK(cpu->ops->gdn_gates(cpu->ctx, pab.c, 2 * H, (float *)pab.c + H, 2 * H, pa.c, pd.c, pab.c, pbo.c, n, H,
                                     1));
        CHECK_OK(gpu->ops->gdn_gates(gpu->ctx, pab.g, 2 * H, (float *)pab.g + H, 2 * H, pa.g, pd.g, pab.g, pbo.g, n, H,
                                     1));
        float *hc = host_of(cpu, pab.c, (size_t)n * H), *hg = host_of(gpu, pab.g, (size_t)n * H);
        cmp("gdn_gates g over a, other stride (g)", hg, hc, (size_t)n * H, FP32_TOL);
        cmp_pair("gdn_gates g over a, other stride (beta)", pbo, FP32_TOL);
        free(hc);
        free(hg);
        pair_free(pab);
        pair_free(pa);
        pair_free(pd);
        pair_free(pbo);
        free(ab);
        free(alog);
        free(dtb);
    }

    /* rope: heads in groups (18 = 3 x 6, 9 = 2 x 5 [one of 4]); n = 1 == its row of n */
    int Hs[] = {18, 9};
    for (int hi = 0; hi < 2; hi++) {
        int H = Hs[hi], hd = 64, n = 50;
        size_t nx = (size_t)n * H * hd;
        float *xr = randn(nx, 1.0f);
        int32_t *pos = malloc(n * sizeof(int32_t));
        for (int i = 0; i < n; i++) pos[i] = 7 * i + (i & 1) * 70000;
        pair px = pair_new(xr, nx), p1 = pair_new(xr + (size_t)9 * H * hd, (size_t)H * hd);
        CHECK_OK(cpu->ops->rope(cpu->ctx, px.c, n, H, hd, pos, 10000.0f));
        CHECK_OK(gpu->ops->rope(gpu->ctx, px.g, n, H, hd, pos, 10000.0f));
        CHECK_OK(gpu->ops->rope(gpu->ctx, p1.g, 1, H, hd, pos + 9, 10000.0f));
        char name[64];
        snprintf(name, sizeof name, "rope H=%d (head groups)", H);
        cmp_pair(name, px, FP32_TOL);
        CHECK_MSG(same_bits(gpu, (float *)px.g + (size_t)9 * H * hd, p1.g, (size_t)H * hd * 4), "rope: token alone");
        pair_free(px);
        pair_free(p1);
        free(xr);
        free(pos);
    }
}

/* short_conv in place: segments of 16 tokens with their halos copied first (n > 16), one launch
 * for n <= 16, the out-of-place kernel for K > 4; against the CPU, and a call == its pieces and
 * a batch of decode steps == each session alone, bit for bit (outputs and tails). */
static void conv_run(hyla_backend *b, float *x, int B, int n, int C, const float *w, const float *bias, int K,
                     float **tails, int act) {
    CHECK_OK(b->ops->short_conv(b->ctx, x, B, n, C, w, bias, K, tails, act));
}

static void case_short_conv(const op_case *c) {
    (void)c;
    int Ks[] = {4, 1, 2, 3, 6};
    int Cs[] = {2304, 37};
    for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++)
        for (int ci = 0; ci < 2; ci++) {
            int K = Ks[ki], C = Cs[ci], B = 3, n = ci ? 301 : 1000;
            size_t tn = (size_t)(K > 1 ? K - 1 : 1) * C;
            float *w = randn((size_t)C * K, 0.5f), *bias = randn(C, 0.1f), *tl = randn(B * tn, 1.0f);
            float *x = randn((size_t)B * n * C, 1.0f);
            pair pw = pair_new(w, (size_t)C * K), pb = pair_new(bias, C), px = pair_new(x, (size_t)B * n * C);
            pair pt[3];
            float *tc[3], *tg[3];
            for (int b = 0; b < B; b++) {
                pt[b] = pair_new(tl + b * tn, tn);
                tc[b] = pt[b].c;
                tg[b] = pt[b].g;
            }
            /* B sessions of n tokens in one call, against the CPU */
            conv_run(cpu, px.c, B, n, C, pw.c, ki & 1 ? pb.c : NULL, K, tc, ki != 2);
            conv_run(gpu, px.g, B, n, C, pw.g, ki & 1 ? pb.g : NULL, K, tg, ki != 2);
            char name[96];
            snprintf(name, sizeof name, "short_conv K=%d C=%d B=%d n=%d", K, C, B, n);
            cmp_pair(name, px, FP32_TOL);
            for (int b = 0; b < B && K > 1; b++) cmp_pair("short_conv tail", pt[b], 0, 0);
            /* session 0 again from its first tail, in pieces 1, 15, 16, 17, 2, rest: == the call */
            float *x0 = dev(gpu, x, (size_t)n * C * 4), *t0 = dev(gpu, tl, tn * 4);
            int pieces[] = {1, 15, 16, 17, 2, n - 51}, at = 0;
            for (int p = 0; p < 6; p++) {
                conv_run(gpu, x0 + (size_t)at * C, 1, pieces[p], C, pw.g, ki & 1 ? pb.g : NULL, K, &t0, ki != 2);
                at += pieces[p];
            }
            CHECK_MSG(same_bits(gpu, x0, px.g, (size_t)n * C * 4), "%s: pieces differ from one call", name);
            if (K > 1) CHECK_MSG(same_bits(gpu, t0, tg[0], tn * 4), "%s: tail after pieces differs", name);
            /* decode: B sessions one token each in one call == each alone (from the tails now) */
            float *xd = randn((size_t)B * C, 1.0f);
            float *dxb = dev(gpu, xd, (size_t)B * C * 4), *dx1 = dev(gpu, xd, (size_t)B * C * 4);
            float *t1[3];
            for (int b = 0; b < B; b++) {
                float *h = host_of(gpu, tg[b], tn);
                t1[b] = dev(gpu, h, tn * 4);
                free(h);
            }
            conv_run(gpu, dxb, B, 1, C, pw.g, ki & 1 ? pb.g : NULL, K, tg, ki != 2);
            for (int b = 0; b < B; b++)
                conv_run(gpu, dx1 + (size_t)b * C, 1, 1, C, pw.g, ki & 1 ? pb.g : NULL, K, &t1[b], ki != 2);
            CHECK_MSG(same_bits(gpu, dxb, dx1, (size_t)B * C * 4), "%s: batched decode differs from alone", name);
            for (int b = 0; b < B && K > 1; b++)
                CHECK_MSG(same_bits(gpu, tg[b], t1[b], tn * 4), "%s: decode tail %d differs", name, b);
            for (int b = 0; b < B; b++) {
                dfree(gpu, t1[b]);
                pair_free(pt[b]);
            }
            dfree(gpu, x0);
            dfree(gpu, t0);
            dfree(gpu, dxb);
            dfree(gpu, dx1);
            pair_free(pw);
            pair_free(pb);
            pair_free(px);
            free(w);
            free(bias);
            free(tl);
            free(x);
            free(xd);
        }
}

/* short_conv_multi == its tensors' short_conv calls, bit for bit on the GPU (outputs and tails):
 * From bf16 sources (hyla_conv_part.src: x's own contents garbage) == the widened rows in place.
 * One launch (with the halo pass for pieces over 16 tokens) for K <= 4 — for pieces four channels
 * a thread where every C % 4 == 0 (2304/2304/4608, 512/1280/96; L2 runs of 128, 16 and 8 by warp
 * shuffles), else and for decode one —, the calls
 * themselves for K = 6; decode (3 sessions, one token) and prefill (one session, 1000 and 301 tokens); a bias on
 * one tensor; close to the CPU. With L2 runs (GDN's q and k heads: in the convolution's pass where
 * the runs divide its blocks, 128 and 16 here; l2norm_rows after it for 37 and 50, and for K = 6):
 * == short_conv then l2norm_rows, bit for bit. */
static void case_short_conv_multi(const op_case *oc) {
    (void)oc;
    const int Cs[3][3] = {{2304, 2304, 4608}, {37, 64, 100}, {512, 1280, 96}}, Ks[2] = {4, 6};
    const int L2s[3][3] = {{128, 128, 0}, {37, 16, 50}, {16, 128, 8}};
    const int shapes[3][2] = {{3, 1}, {1, 1000}, {1, 301}}; /* B, n */
    for (int li = 0; li < 3; li++) /* li 2: L2 runs, inputs from bf16 sources */
    for (int ci = 0; ci < 3; ci++)
        for (int ki = 0; ki < 2; ki++)
            for (int si = 0; si < 3; si++) {
                const int K = Ks[ki], B = shapes[si][0], n = shapes[si][1];
                pair px[3], pw[3], pt[3][3];
                float *rx[3], *rt[3][3], *tc[3][3], *tg[3][3], *tr[3][3];
                void *sc[3] = {NULL, NULL, NULL}, *sg[3] = {NULL, NULL, NULL};
                float *bias = randn(Cs[ci][1], 0.1f);
                pair pb = pair_new(bias, Cs[ci][1]);
                hyla_conv_part pc[3], pg[3];
                for (int j = 0; j < 3; j++) {
                    const int C = Cs[ci][j];
                    const size_t nx = (size_t)B * n * C, nt = (size_t)(K - 1) * C;
                    float *x = randn(nx, 1.0f), *w = randn((size_t)C * K, 0.5f);
                    if (li == 2) { /* the bf16 rows as the source, x's own contents garbage */
                        round_bf16(x, nx);
                        uint16_t *xb = malloc(nx * 2 + 4);
                        for (size_t e = 0; e < nx; e++) xb[e] = hyla_f32_to_bf16(x[e]);
                        sc[j] = dev(cpu, xb, nx * 2);
                        sg[j] = dev(gpu, xb, nx * 2);
                        free(xb);
                    }
                    rx[j] = dev(gpu, x, nx * 4);
                    if (li == 2)
                        for (size_t e = 0; e < nx; e++) x[e] = 1e30f;
                    px[j] = pair_new(x, nx);
                    pw[j] = pair_new(w, (size_t)C * K);
                    for (int b = 0; b < B; b++) {
                        float *t = randn(nt, 1.0f);
                        pt[j][b] = pair_new(t, nt);
                        rt[j][b] = dev(gpu, t, nt * 4);
                        tc[j][b] = pt[j][b].c, tg[j][b] = pt[j][b].g, tr[j][b] = rt[j][b];
                        free(t);
                    }
                    const int hb = j == 1; /* a bias on the second tensor */
                    const int l2 = li ? L2s[ci][j] : 0;
                    pc[j] = (hyla_conv_part){px[j].c, pw[j].c, hb ? pb.c : NULL, tc[j], C, l2, 1e-6f, sc[j]};
                    pg[j] = (hyla_conv_part){px[j].g, pw[j].g, hb ? pb.g : NULL, tg[j], C, l2, 1e-6f, sg[j]};
                    free(x);
                    free(w);
                }
                CHECK_OK(cpu->ops->short_conv_multi(cpu->ctx, 3, pc, B, n, K, 1));
                CHECK_OK(gpu->ops->short_conv_multi(gpu->ctx, 3, pg, B, n, K, 1));
                for (int j = 0; j < 3; j++) {
                    CHECK_OK(gpu->ops->short_conv(gpu->ctx, rx[j], B, n, Cs[ci][j], pw[j].g, j == 1 ? pb.g : NULL, K,
                                                  tr[j], 1));
                    if (pg[j].l2)
                        CHECK_OK(gpu->ops->l2norm_rows(gpu->ctx, rx[j], B * n * Cs[ci][j] / pg[j].l2, pg[j].l2, 1e-6f));
                }
                char name[96];
                snprintf(name, sizeof name, "short_conv_multi C=%d/%d/%d K=%d B=%d n=%d%s", Cs[ci][0], Cs[ci][1],
                         Cs[ci][2], K, B, n, li == 2 ? " l2 bf16" : li ? " l2" : "");
                for (int j = 0; j < 3; j++) {
                    const int C = Cs[ci][j];
                    cmp_pair(name, px[j], FP32_TOL);
                    CHECK_MSG(same_bits(gpu, px[j].g, rx[j], (size_t)B * n * C * 4), "%s: tensor %d differs from short_conv",
                              name, j);
                    for (int b = 0; b < B; b++) {
                        cmp_pair("short_conv_multi tail", pt[j][b], 0, 0);
                        CHECK_MSG(same_bits(gpu, pt[j][b].g, rt[j][b], (size_t)(K - 1) * C * 4),
                                  "%s: tail %d of session %d differs", name, j, b);
                        pair_free(pt[j][b]);
                        dfree(gpu, rt[j][b]);
                    }
                    pair_free(px[j]);
                    pair_free(pw[j]);
                    dfree(gpu, rx[j]);
                    dfree(cpu, sc[j]);
                    dfree(gpu, sg[j]);
                }
                pair_free(pb);
                free(bias);
            }
}

/* ---------------------------------------------------------------- linear mixers */

static void run_lin_prefill(hyla_backend *b, int gdn, void *q, void *k, void *v, void *g, void *beta, int n, int H,
                            int dk, int dv, float scale, void *S, void *o) {
    if (gdn)
        CHECK_OK(b->ops->gdn_prefill(b->ctx, q, k, v, g, beta, n, H, dk, dv, scale, S, o));
    else
        CHECK_OK(b->ops->gla_prefill(b->ctx, q, k, v, g, n, H, dk, dv, scale, S, o));
}

/* GLA / GDN prefill of one sequence, p = {gdn, n, H, dk, dv}. The backend picks the path by
 * shape: the fused pass (dk <= 128, any dv: blocks of 128 value columns), its split form (few
 * long sequences: n = 300 here), kernels A and B (dk = 256; GLA's split form), the token loop
 * where kernels A and B do not fit either (dk 129..256 with dv > 1024: k_lin_rec), GLA with dk >
 * 256 (StateX's merged heads) as key slabs of <= 128 through the fused pass, each within its
 * tolerance of the CPU. 64-token pieces == one call, bit for bit (which for n = 300 also holds
 * the split form to the fused pass's bits). */
static void case_lin_prefill(const op_case *c) {
    const int gdn = c->p[0], n = c->p[1], H = c->p[2], dk = c->p[3], dv = c->p[4];
    const int token_loop = dk > 128 && dk <= 256 && dv > 1024; /* dk > 256 (GLA): key slabs, chunked */
    size_t nqk = (size_t)n * H * dk, nv = (size_t)n * H * dv, ns = (size_t)H * dk * dv;
    float scale = 1.0f / sqrtf((float)dk);
    float *q = randn(nqk, 1.0f), *k = randn(nqk, 1.0f), *v = randn(nv, 1.0f);
    float *g = gdn ? gdn_decays((size_t)n * H) : gla_gates(nqk);
    float *beta = randu((size_t)n * H, 0.05f, 1.0f);
    float *S0 = randn(ns, 0.3f);
    if (gdn) {
        l2rows(q, (size_t)n * H, dk);
        l2rows(k, (size_t)n * H, dk);
    }
    size_t ng = gdn ? (size_t)n * H : nqk;
    pair pq = pair_new(q, nqk), pk = pair_new(k, nqk), pv = pair_new(v, nv), pg = pair_new(g, ng),
         pb = pair_new(beta, (size_t)n * H), pS = pair_new(S0, ns), po = pair_new(NULL, nv);
    run_lin_prefill(cpu, gdn, pq.c, pk.c, pv.c, pg.c, pb.c, n, H, dk, dv, scale, pS.c, po.c);
    PERF(run_lin_prefill(gpu, gdn, pq.g, pk.g, pv.g, pg.g, pb.g, n, H, dk, dv, scale, pS.g, po.g));
    char name[96];
    snprintf(name, sizeof name, "%s prefill n=%d H=%d dk=%d dv=%d: o", gdn ? "gdn" : "gla", n, H, dk, dv);
    if (token_loop)
        cmp_pair(name, po, REC_TOL);
    else
        cmp_pair(name, po, CHUNK_TOL);
    snprintf(name, sizeof name, "%s prefill n=%d H=%d dk=%d dv=%d: S", gdn ? "gdn" : "gla", n, H, dk, dv);
    if (token_loop)
        cmp_pair(name, pS, REC_TOL);
    else
        cmp_pair(name, pS, CHUNK_TOL);
    if (n > 64) { /* 64-token pieces == one call, bit for bit */
        void *S3 = dev(gpu, S0, ns * 4), *o3 = dev(gpu, NULL, nv * 4);
        size_t qo = (size_t)64 * H * dk, vo = (size_t)64 * H * dv, go = gdn ? (size_t)64 * H : qo;
        run_lin_prefill(gpu, gdn, pq.g, pk.g, pv.g, pg.g, pb.g, 64, H, dk, dv, scale, S3, o3);
        run_lin_prefill(gpu, gdn, (float *)pq.g + qo, (float *)pk.g + qo, (float *)pv.g + vo, (float *)pg.g + go,
                        (float *)pb.g + (size_t)64 * H, n - 64, H, dk, dv, scale, S3, (float *)o3 + vo);
        CHECK_MSG(same_bits(gpu, S3, pS.g, ns * 4) && same_bits(gpu, o3, po.g, nv * 4),
                  "%s n=%d dk=%d dv=%d: 64-token pieces == one call (bits)", gdn ? "gdn" : "gla", n, dk, dv);
        dfree(gpu, S3);
        dfree(gpu, o3);
    }
    pair_free(pq);
    pair_free(pk);
    pair_free(pv);
    pair_free(pg);
    pair_free(pb);
    pair_free(pS);
    pair_free(po);
    free(q);
    free(k);
    free(v);
    free(g);
    free(beta);
    free(S0);
}

/* The chunked split form's kernels give one set of bits, p = {gdn, n, H, dk, dv, which}: a backend
 * with the form on and one with it off run the same prefill (the split form: few long sequences)
 * from the same state; states and outputs must match bit for bit. which = 0: kernel B on
 * warpgroup products (HYLA_CUDA_CHUNK_B_WG; keys padded to 128) against k_chunk_b; 1: GLA's
 * 16-warp chunk kernel k_gla_chunk_f (HYLA_CUDA_GLA_TILES) against kernel A. */
static void case_chunk_switches(const op_case *c) {
    const int gdn = c->p[0], n = c->p[1], H = c->p[2], dk = c->p[3], dv = c->p[4];
    const char *env = c->p[5] ? "HYLA_CUDA_GLA_TILES" : "HYLA_CUDA_CHUNK_B_WG",
               *off = c->p[5] ? "gla_tiles=0" : "chunk_b_wg=0";
    hyla_backend *b[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++) {
        setenv(env, i ? "0" : "1", 1);
        hyla_status st = hyla_cuda_backend_create(0, &b[i]);
        unsetenv(env);
        CHECK_OK(st);
        if (!b[i]) goto out;
    }
    char sw[256] = "";
    CHECK_OK(hyla_cuda_switches(b[1], sw, sizeof sw));
    CHECK_MSG(strstr(sw, off) != NULL, "switches with %s=0: '%s'", env, sw);
    size_t nqk = (size_t)n * H * dk, nv = (size_t)n * H * dv, ns = (size_t)H * dk * dv;
    float *q = randn(nqk, 1.0f), *k = randn(nqk, 1.0f), *v = randn(nv, 1.0f);
    float *g = gdn ? gdn_decays((size_t)n * H) : gla_gates(nqk);
    float *beta = randu((size_t)n * H, 0.05f, 1.0f), *S0 = randn(ns, 0.3f);
    if (gdn) {
        l2rows(q, (size_t)n * H, dk);
        l2rows(k, (size_t)n * H, dk);
    }
    size_t ng = gdn ? (size_t)n * H : nqk;
    float *hS[2], *ho[2];
    for (int i = 0; i < 2; i++) {
        void *dq = dev(b[i], q, nqk * 4), *dk_ = dev(b[i], k, nqk * 4), *dv_ = dev(b[i], v, nv * 4),
             *dg = dev(b[i], g, ng * 4), *db = dev(b[i], beta, (size_t)n * H * 4), *dS = dev(b[i], S0, ns * 4),
             *dO = dev(b[i], NULL, nv * 4);
        run_lin_prefill(b[i], gdn, dq, dk_, dv_, dg, db, n, H, dk, dv, 1.0f / sqrtf((float)dk), dS, dO);
        hS[i] = host_of(b[i], dS, ns);
        ho[i] = host_of(b[i], dO, nv);
        dfree(b[i], dq), dfree(b[i], dk_), dfree(b[i], dv_), dfree(b[i], dg), dfree(b[i], db), dfree(b[i], dS),
            dfree(b[i], dO);
    }
    CHECK_MSG(!memcmp(hS[0], hS[1], ns * 4) && !memcmp(ho[0], ho[1], nv * 4),
              "%s prefill n=%d H=%d dk=%d dv=%d: %s gives other bits than %s", gdn ? "gdn" : "gla", n, H, dk, dv,
              c->p[5] ? "k_gla_chunk_f" : "kernel B on warpgroup products", c->p[5] ? "k_gla_chunk_a" : "k_chunk_b");
    for (int i = 0; i < 2; i++) free(hS[i]), free(ho[i]);
    free(q), free(k), free(v), free(g), free(beta), free(S0);
out:
    for (int i = 0; i < 2; i++)
        if (b[i]) hyla_backend_destroy(b[i]);
}

/* GLA / GDN decode, p = {gdn, B, H, dk, dv}: B sessions with separately allocated states, three
 * steps (k_lin_dec where states and rows are 16-byte aligned, else the token-loop kernels). */
static void case_lin_decode(const op_case *c) {
    const int gdn = c->p[0], B = c->p[1], H = c->p[2], dk = c->p[3], dv = c->p[4];
    size_t nqk = (size_t)B * H * dk, nv = (size_t)B * H * dv, ns = (size_t)H * dk * dv;
    float scale = 1.0f / sqrtf((float)dk);
    pair *pS = malloc((size_t)B * sizeof *pS);
    float **Sc = malloc((size_t)B * sizeof *Sc), **Sg = malloc((size_t)B * sizeof *Sg);
    for (int b = 0; b < B; b++) {
        float *s0 = randn(ns, 0.3f);
        pS[b] = pair_new(s0, ns);
        Sc[b] = pS[b].c;
        Sg[b] = pS[b].g;
        free(s0);
    }
    for (int step = 0; step < 3; step++) {
        float *q = randn(nqk, 1.0f), *k = randn(nqk, 1.0f), *v = randn(nv, 1.0f);
        float *g = gdn ? gdn_decays((size_t)B * H) : gla_gates(nqk), *beta = randu((size_t)B * H, 0.05f, 1.0f);
        if (gdn) {
            l2rows(q, (size_t)B * H, dk);
            l2rows(k, (size_t)B * H, dk);
        }
        size_t ng = gdn ? (size_t)B * H : nqk;
        pair pq = pair_new(q, nqk), pk = pair_new(k, nqk), pv = pair_new(v, nv), pg = pair_new(g, ng),
             pb = pair_new(beta, (size_t)B * H), po = pair_new(NULL, nv);
        if (gdn) {
            CHECK_OK(cpu->ops->gdn_decode(cpu->ctx, pq.c, pk.c, pv.c, pg.c, pb.c, B, H, dk, dv, scale, Sc, po.c));
            PERF(CHECK_OK(gpu->ops->gdn_decode(gpu->ctx, pq.g, pk.g, pv.g, pg.g, pb.g, B, H, dk, dv, scale, Sg, po.g)));
        } else {
            CHECK_OK(cpu->ops->gla_decode(cpu->ctx, pq.c, pk.c, pv.c, pg.c, B, H, dk, dv, scale, Sc, po.c));
            PERF(CHECK_OK(gpu->ops->gla_decode(gpu->ctx, pq.g, pk.g, pv.g, pg.g, B, H, dk, dv, scale, Sg, po.g)));
        }
        char name[80];
        snprintf(name, sizeof name, "%s decode B=%d dk=%d dv=%d step %d: o", gdn ? "gdn" : "gla", B, dk, dv, step);
        cmp_pair(name, po, REC_TOL);
        pair_free(pq);
        pair_free(pk);
        pair_free(pv);
        pair_free(pg);
        pair_free(pb);
        pair_free(po);
        free(q);
        free(k);
        free(v);
        free(g);
        free(beta);
    }
    for (int b = 0; b < B; b++) {
        cmp_pair(gdn ? "gdn decode: state" : "gla decode: state", pS[b], REC_TOL);
        pair_free(pS[b]);
    }
    free(pS);
    free(Sc);
    free(Sg);
}

/* sse_maps, p = {rows, cols, q_softmax, k_softmax, l2, gates, off, lora}: SSE's feature maps in
 * one launch against silu, softmax_rows, l2norm_rows and gla_gate one after the other on the GPU
 * (lora: q1 and k1 hold LoRA terms, added onto q0 and k0 first, as add(q1, q0) would), bit for
 * bit, every buffer, with the ops logged for graphs and run eagerly. off = 1 starts every buffer
 * one float in (the unaligned loads); cols % 4 != 0, cols > 512 or, without lora, more than
 * 2^23 floats in all take the ops inside. gates = 3: the gates with their projections' biases
 * (nb = cols, or 2 cols where rows are even) given to sse_maps, against the biases added on the
 * host (the same fp32 add) before gla_gate. */
static void case_sse_maps(const op_case *c) {
    const int rows = c->p[0], cols = c->p[1], qs = c->p[2], ks = c->p[3], l2 = c->p[4], gates = c->p[5], off = c->p[6],
              lora = c->p[7];
    const size_t n = (size_t)rows * cols, nv = n + 3; /* v's length is its own (here not a multiple of 4) */
    if (!gpu->ops->sse_maps) {
        CHECK_MSG(0, "the cuda backend has sse_maps");
        return;
    }
    for (int graphs = 1; graphs >= 0; graphs--) {
        CHECK_OK(hyla_cuda_set_graphs(gpu, graphs));
        /* v, q0, q1, k0, k1, g0, g1 twice: [0] by the ops, [1] by sse_maps */
        const size_t len[7] = {nv, n, n, n, n, n, n};
        float *h[7], *d[2][7];
        for (int i = 0; i < 7; i++) {
            h[i] = randn(len[i] + 1, i >= 5 ? 4.0f : 2.0f);
            for (int k = 0; k < 2; k++) d[k][i] = (float *)dev(gpu, h[i], (len[i] + 1) * 4) + off;
        }
        float **x = d[0];
        const float norm = 16.0f, clamp = gates == 2 ? -INFINITY : -5.0f;
        const int nb = rows % 2 ? cols : 2 * cols;
        float *gb[2] = {NULL, NULL};
        if (gates == 3)
            for (int j = 0; j < 2; j++) {
                float *hb = randn((size_t)nb, 2.0f), *hg = malloc((len[5 + j] + 1) * 4);
                for (size_t e = 0; e < n; e++) hg[off + e] = h[5 + j][off + e] + hb[e % (size_t)nb];
                dfree(gpu, x[5 + j] - off);
                x[5 + j] = (float *)dev(gpu, hg, (len[5 + j] + 1) * 4) + off;
                gb[j] = (float *)dev(gpu, hb, (size_t)nb * 4);
                free(hb), free(hg);
            }
        if (lora) {
            CHECK_OK(gpu->ops->add(gpu->ctx, x[2], x[1], n));
            CHECK_OK(gpu->ops->add(gpu->ctx, x[4], x[3], n));
        }
        CHECK_OK(gpu->ops->silu(gpu->ctx, x[0], nv));
        for (int j = 0; j < 2; j++) {
            float *q = x[1 + j], *k = x[3 + j];
            CHECK_OK(qs ? gpu->ops->softmax_rows(gpu->ctx, q, rows, cols) : gpu->ops->silu(gpu->ctx, q, n));
            CHECK_OK(ks ? gpu->ops->softmax_rows(gpu->ctx, k, rows, cols) : gpu->ops->silu(gpu->ctx, k, n));
            if (l2) {
                CHECK_OK(gpu->ops->l2norm_rows(gpu->ctx, q, rows, cols, 1e-6f));
                CHECK_OK(gpu->ops->l2norm_rows(gpu->ctx, k, rows, cols, 1e-6f));
            }
            if (gates) CHECK_OK(gpu->ops->gla_gate(gpu->ctx, x[5 + j], n, norm, clamp));
        }
        float **y = d[1];
        CHECK_OK(gpu->ops->sse_maps(gpu->ctx, y[0], nv, y[1], y[2], y[3], y[4], rows, cols, qs, ks, l2, 1e-6f,
                                    gates ? y[5] : NULL, gates ? y[6] : NULL, gates ? n : 0, gb[0], gb[1], nb, norm, clamp,
                                    lora));
        if (gates == 3 && !graphs) /* a bias that does not divide the gates is refused (run eagerly) */
            CHECK(gpu->ops->sse_maps(gpu->ctx, y[0], nv, y[1], y[2], y[3], y[4], rows, cols, qs, ks, l2, 1e-6f, y[5],
                                     y[6], n, gb[0], gb[1], (int)n + 1, norm, clamp, lora) == HYLA_ERR_INVALID_ARG);
        static const char *name[7] = {"v", "q0", "q1", "k0", "k1", "g0", "g1"};
        for (int i = 0; i < 7; i++) {
            CHECK_MSG(same_bits(gpu, x[i], y[i], len[i] * 4),
                      "sse_maps rows=%d cols=%d q_softmax=%d k_softmax=%d l2=%d gates=%d off=%d lora=%d (graphs %d): %s "
                      "== the ops one by one (bits)", rows, cols, qs, ks, l2, gates, off, lora, graphs, name[i]);
            for (int k = 0; k < 2; k++) dfree(gpu, d[k][i] - off);
            free(h[i]);
        }
        for (int j = 0; j < 2; j++)
            if (gb[j]) dfree(gpu, gb[j]);
    }
    CHECK_OK(hyla_cuda_set_graphs(gpu, 1));
    printf("  sse_maps rows=%d cols=%d q_softmax=%d k_softmax=%d l2=%d gates=%d off=%d lora=%d: == the ops (bits)\n", rows,
           cols, qs, ks, l2, gates, off, lora);
}

/* gdn_decode_raw, p = {B, H, dk, dv}: the op from the raw projections (the L2 norms of q and k,
 * the gates and the recurrence, in one kernel where the shape allows) against l2norm_rows,
 * gdn_gates and gdn_decode on the GPU, bit for bit: o and the states over three steps, with the
 * ops logged for graphs and run eagerly. dk % 4 != 0 and batches over 32 take the three ops inside
 * the op. */
static void case_gdn_decode_raw(const op_case *c) {
    const int B = c->p[0], H = c->p[1], dk = c->p[2], dv = c->p[3];
    const size_t nqk = (size_t)B * H * dk, nv = (size_t)B * H * dv, ns = (size_t)H * dk * dv, ng = (size_t)B * H;
    const float scale = 1.0f / sqrtf((float)dk);
    float *Alog = randn((size_t)H, 0.5f), *dtb = randn((size_t)H, 0.5f);
    void *dA = dev(gpu, Alog, (size_t)H * 4), *ddt = dev(gpu, dtb, (size_t)H * 4);
    for (int graphs = 1; graphs >= 0; graphs--) {
        CHECK_OK(hyla_cuda_set_graphs(gpu, graphs));
        float **S1 = malloc((size_t)B * sizeof *S1), **S2 = malloc((size_t)B * sizeof *S2);
        for (int b = 0; b < B; b++) {
            float *s0 = randn(ns, 0.3f);
            S1[b] = dev(gpu, s0, ns * 4);
            S2[b] = dev(gpu, s0, ns * 4);
            free(s0);
        }
        for (int step = 0; step < 3; step++) {
            const int allow_neg = step == 2;
            float *q = randn(nqk, 1.0f), *k = randn(nqk, 1.0f), *v = randn(nv, 1.0f), *a = randn(ng, 2.0f),
                  *b = randn(ng, 2.0f);
            if (step == 1) a[0] = 30.0f; /* softplus's linear branch */
            float *q1 = dev(gpu, q, nqk * 4), *k1 = dev(gpu, k, nqk * 4), *a1 = dev(gpu, a, ng * 4),
                  *b1 = dev(gpu, b, ng * 4), *q2 = dev(gpu, q, nqk * 4), *k2 = dev(gpu, k, nqk * 4),
                  *a2 = dev(gpu, a, ng * 4), *b2 = dev(gpu, b, ng * 4), *dv_ = dev(gpu, v, nv * 4),
                  *o1 = dev(gpu, NULL, nv * 4), *o2 = dev(gpu, NULL, nv * 4);
            CHECK_OK(gpu->ops->l2norm_rows(gpu->ctx, q1, B * H, dk, 1e-6f));
            CHECK_OK(gpu->ops->l2norm_rows(gpu->ctx, k1, B * H, dk, 1e-6f));
            CHECK_OK(gpu->ops->gdn_gates(gpu->ctx, a1, H, b1, H, dA, ddt, a1, b1, B, H, allow_neg));
            CHECK_OK(gpu->ops->gdn_decode(gpu->ctx, q1, k1, dv_, a1, b1, B, H, dk, dv, scale, S1, o1));
            CHECK_OK(gpu->ops->gdn_decode_raw(gpu->ctx, q2, k2, dv_, a2, b2, dA, ddt, allow_neg, 1e-6f, B, H, dk, dv,
                                              scale, S2, o2));
            CHECK_MSG(same_bits(gpu, o1, o2, nv * 4),
                      "gdn_decode_raw B=%d H=%d dk=%d dv=%d step %d (graphs %d): o == l2norm_rows, gdn_gates, "
                      "gdn_decode (bits)", B, H, dk, dv, step, graphs);
            float *ptrs[] = {q1, k1, a1, b1, q2, k2, a2, b2, dv_, o1, o2};
            for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) dfree(gpu, ptrs[i]);
            free(q);
            free(k);
            free(v);
            free(a);
            free(b);
        }
        int same = 1;
        for (int b = 0; b < B; b++) {
            same &= same_bits(gpu, S1[b], S2[b], ns * 4);
            dfree(gpu, S1[b]);
            dfree(gpu, S2[b]);
        }
        CHECK_MSG(same, "gdn_decode_raw B=%d H=%d dk=%d dv=%d (graphs %d): states == the three ops' (bits)", B, H, dk,
                  dv, graphs);
        free(S1);
        free(S2);
    }
    CHECK_OK(hyla_cuda_set_graphs(gpu, 1));
    dfree(gpu, dA);
    dfree(gpu, ddt);
    free(Alog);
    free(dtb);
}

/* ---------------------------------------------------------------- SSE */

/* Route logits with a clear winner per token so CPU and GPU pick the same partitions. */
static float *route_logits(int n, int N) {
    float *l = malloc((size_t)n * N * sizeof(float));
    for (int t = 0; t < n; t++)
        for (int i = 0; i < N; i++) l[(size_t)t * N + i] = (float)(0.37 * ((t * 7 + i * 3) % N)) + 0.001f * i;
    for (int t = 0; t < n; t++) l[(size_t)t * N + (t * 5 + t / 3) % N] += 0.6f * hyla_rng_uniform(&rng);
    return l;
}

/* Batched (varlen) prefill, p = {gdn, dk, dv, H} (0: H 3, dk 64 / 128, dv 96 / 128): sequences of different lengths packed in one launch ==
 * each sequence alone, bit for bit, and within the chunked tolerance of the CPU. The batch runs
 * the fused pass; the 330-token sequence alone runs the split form (GDN: the fused pass's chunk
 * part over all chunks, then kernel B; GLA: kernels A and B), so the bit check also holds the
 * split forms to the fused pass's bits. GLA: the exact-exp path of strongly decaying key columns
 * included. With dk > 256 (GLA key slabs) the batch and each sequence alone run the slab path. */
static void case_varlen(const op_case *c) {
    {
        const int gdn = c->p[0];
        const int H = c->p[3] ? c->p[3] : 3, dk = c->p[1] ? c->p[1] : gdn ? 128 : 64,
                  dv = c->p[2] ? c->p[2] : gdn ? 128 : 96, nseq = 4;
        const int32_t lens[4] = {130, 64, 1, 330};
        int32_t starts[4];
        int n = 0;
        for (int z = 0; z < nseq; z++) {
            starts[z] = n;
            n += lens[z];
        }
        size_t nqk = (size_t)n * H * dk, nv = (size_t)n * H * dv, ns = (size_t)H * dk * dv, ng = gdn ? (size_t)n * H : nqk;
        float scale = 1.0f / sqrtf((float)dk);
        float *q = randn(nqk, 1.0f), *k = randn(nqk, 1.0f), *v = randn(nv, 1.0f);
        float *g = gdn ? gdn_decays((size_t)n * H) : gla_gates(nqk), *beta = randu((size_t)n * H, 0.05f, 1.0f);
        if (!gdn) /* GLA, last sequence: every 8th key column decays by e^-4.5 per token, so 16-token
                   * diagonal blocks span 67.5 > 60 and take the exact-exp path */
            for (size_t x = (size_t)starts[3] * H * dk; x < nqk; x++)
                if (x % dk % 8 == 5) g[x] = -4.5f;
        float *S0 = randn(ns * nseq, 0.3f);
        if (gdn) {
            l2rows(q, (size_t)n * H, dk);
            l2rows(k, (size_t)n * H, dk);
        }
        pair pq = pair_new(q, nqk), pk = pair_new(k, nqk), pv = pair_new(v, nv), pg = pair_new(g, ng),
             pb = pair_new(beta, (size_t)n * H), pS = pair_new(S0, ns * nseq), po = pair_new(NULL, nv);
        void *Sa = dev(gpu, S0, ns * nseq * 4), *oa = dev(gpu, NULL, nv * 4);
        float *Sz[4];
        for (int z = 0; z < nseq; z++) {
            size_t qo = (size_t)starts[z] * H * dk, vo = (size_t)starts[z] * H * dv, go = gdn ? (size_t)starts[z] * H : qo;
            run_lin_prefill(cpu, gdn, (float *)pq.c + qo, (float *)pk.c + qo, (float *)pv.c + vo, (float *)pg.c + go,
                            (float *)pb.c + (size_t)starts[z] * H, lens[z], H, dk, dv, scale, (float *)pS.c + z * ns,
                            (float *)po.c + vo);
            run_lin_prefill(gpu, gdn, (float *)pq.g + qo, (float *)pk.g + qo, (float *)pv.g + vo, (float *)pg.g + go,
                            (float *)pb.g + (size_t)starts[z] * H, lens[z], H, dk, dv, scale, (float *)Sa + z * ns,
                            (float *)oa + vo);
            Sz[z] = (float *)pS.g + z * ns;
        }
        PERF(CHECK_OK(hyla_cuda_prefill_varlen(gpu, gdn, H, dk, dv, scale, pq.g, pk.g, pv.g, pg.g, gdn ? pb.g : NULL,
                                               po.g, nseq, starts, lens, Sz)));
        char name[96];
        snprintf(name, sizeof name, "%s varlen 4 seqs dk=%d dv=%d: o", gdn ? "gdn" : "gla", dk, dv);
        cmp_pair(name, po, CHUNK_TOL);
        snprintf(name, sizeof name, "%s varlen 4 seqs dk=%d dv=%d: S", gdn ? "gdn" : "gla", dk, dv);
        cmp_pair(name, pS, CHUNK_TOL);
        CHECK_MSG(same_bits(gpu, Sa, pS.g, ns * nseq * 4) && same_bits(gpu, oa, po.g, nv * 4),
                  "%s varlen == each sequence alone (bits)", gdn ? "gdn" : "gla");
        dfree(gpu, Sa);
        dfree(gpu, oa);
        pair_free(pq);
        pair_free(pk);
        pair_free(pv);
        pair_free(pg);
        pair_free(pb);
        pair_free(pS);
        pair_free(po);
        free(q);
        free(k);
        free(v);
        free(g);
        free(beta);
        free(S0);
    }
}

/* SSE routing, prefill and decode, p = {transition, K}: against the CPU; 64-token pieces == one
 * call at a window of 64, bit for bit. GDN rows go through the plan's row map into the fused pass. */
static void case_sse(const op_case *c) {
    const int tr = c->p[0], K = c->p[1];
    {
            int n = 150, H = 2, dk = 64, dv = 64, N = 4, gdn = tr == HYLA_SSE_GDN;
            float scale = 1.0f / sqrtf((float)dk);
            size_t nqk = (size_t)n * H * dk, nv = (size_t)n * H * dv, ns = (size_t)H * dk * dv;
            float *lg = route_logits(n, N);
            pair pl = pair_new(lg, (size_t)n * N), pidx = pair_new(NULL, (size_t)n * K), pw = pair_new(NULL, (size_t)n * K);
            CHECK_OK(cpu->ops->sse_route(cpu->ctx, pl.c, n, N, K, pidx.c, pw.c));
            CHECK_OK(gpu->ops->sse_route(gpu->ctx, pl.g, n, N, K, pidx.g, pw.g));
            {
                int32_t *ic = (int32_t *)host_of(cpu, pidx.c, pidx.n), *ig = (int32_t *)host_of(gpu, pidx.g, pidx.n);
                CHECK_MSG(!memcmp(ic, ig, pidx.n * 4), "sse_route K=%d: same partitions", K);
                free(ic);
                free(ig);
            }
            cmp_pair("sse_route weights", pw, 1e-6, 1e-6);
            float *q1 = randn(nqk, 1.0f), *k1 = randn(nqk, 1.0f), *q2 = randn(nqk, 1.0f), *k2 = randn(nqk, 1.0f);
            float *v = randn(nv, 1.0f);
            size_t ng = gdn ? (size_t)n * H : nqk;
            float *ga = gdn ? gdn_decays(ng) : gla_gates(ng), *gb = gdn ? gdn_decays(ng) : gla_gates(ng);
            float *ba = randu((size_t)n * H, 0.05f, 1.0f), *bb = randu((size_t)n * H, 0.05f, 1.0f);
            if (gdn) {
                l2rows(q1, (size_t)n * H, dk);
                l2rows(k1, (size_t)n * H, dk);
                l2rows(q2, (size_t)n * H, dk);
                l2rows(k2, (size_t)n * H, dk);
            }
            float *S0 = randn(ns, 0.3f), *Sp = randn(ns * N, 0.3f);
            pair pq1 = pair_new(q1, nqk), pk1 = pair_new(k1, nqk), pq2 = pair_new(q2, nqk), pk2 = pair_new(k2, nqk),
                 pv = pair_new(v, nv), pga = pair_new(ga, ng), pgb = pair_new(gb, ng), pba = pair_new(ba, (size_t)n * H),
                 pbb = pair_new(bb, (size_t)n * H), pS0 = pair_new(S0, ns), pSp = pair_new(Sp, ns * N),
                 po = pair_new(NULL, nv);
            CHECK_OK(cpu->ops->sse_prefill(cpu->ctx, tr, pq1.c, pk1.c, pq2.c, pk2.c, pv.c, pga.c, pgb.c,
                                           gdn ? pba.c : NULL, gdn ? pbb.c : NULL, pidx.c, pw.c, n, H, dk, dv, N, K,
                                           scale, 64, pS0.c, pSp.c, po.c));
            PERF(CHECK_OK(gpu->ops->sse_prefill(gpu->ctx, tr, pq1.g, pk1.g, pq2.g, pk2.g, pv.g, pga.g, pgb.g,
                                                gdn ? pba.g : NULL, gdn ? pbb.g : NULL, pidx.g, pw.g, n, H, dk, dv, N,
                                                K, scale, 64, pS0.g, pSp.g, po.g)));
            char name[80];
            snprintf(name, sizeof name, "sse-%s K=%d prefill: o", gdn ? "gdn" : "gla", K);
            cmp_pair(name, po, CHUNK_TOL);
            snprintf(name, sizeof name, "sse-%s K=%d prefill: S0", gdn ? "gdn" : "gla", K);
            cmp_pair(name, pS0, CHUNK_TOL);
            snprintf(name, sizeof name, "sse-%s K=%d prefill: Sp", gdn ? "gdn" : "gla", K);
            cmp_pair(name, pSp, CHUNK_TOL);
            /* pieces of 64 == one call, bit for bit */
            {
                void *a0 = dev(gpu, S0, ns * 4), *ap = dev(gpu, Sp, ns * N * 4), *ao = dev(gpu, NULL, nv * 4);
                size_t qo = (size_t)64 * H * dk, vo = (size_t)64 * H * dv, go = gdn ? (size_t)64 * H : qo, bo = (size_t)64 * H;
                CHECK_OK(gpu->ops->sse_prefill(gpu->ctx, tr, pq1.g, pk1.g, pq2.g, pk2.g, pv.g, pga.g, pgb.g,
                                               gdn ? pba.g : NULL, gdn ? pbb.g : NULL, pidx.g, pw.g, 64, H, dk, dv, N,
                                               K, scale, 64, a0, ap, ao));
                CHECK_OK(gpu->ops->sse_prefill(
                    gpu->ctx, tr, (float *)pq1.g + qo, (float *)pk1.g + qo, (float *)pq2.g + qo, (float *)pk2.g + qo,
                    (float *)pv.g + vo, (float *)pga.g + go, (float *)pgb.g + go, gdn ? (float *)pba.g + bo : NULL,
                    gdn ? (float *)pbb.g + bo : NULL, (int32_t *)pidx.g + 64 * K, (float *)pw.g + 64 * K, n - 64, H,
                    dk, dv, N, K, scale, 64, a0, ap, (float *)ao + vo));
                CHECK_MSG(same_bits(gpu, a0, pS0.g, ns * 4) && same_bits(gpu, ap, pSp.g, ns * N * 4) &&
                              same_bits(gpu, ao, po.g, nv * 4),
                          "sse-%s K=%d: 64-token pieces == one call (bits)", gdn ? "gdn" : "gla", K);
                dfree(gpu, a0);
                dfree(gpu, ap);
                dfree(gpu, ao);
            }
            /* decode: 3 sessions, 2 steps, using the first 3 tokens' inputs */
            {
                int B = 3;
                float *Sc0[3], *Sg0[3], *Scp[3], *Sgp[3];
                pair d0[3], dp[3];
                for (int b = 0; b < B; b++) {
                    d0[b] = pair_new(S0, ns);
                    dp[b] = pair_new(Sp, ns * N);
                    Sc0[b] = d0[b].c;
                    Sg0[b] = d0[b].g;
                    Scp[b] = dp[b].c;
                    Sgp[b] = dp[b].g;
                }
                pair dout = pair_new(NULL, (size_t)B * H * dv);
                for (int step = 0; step < 2; step++) {
                    size_t t0 = (size_t)step * B;
                    size_t qo = t0 * H * dk, vo = t0 * H * dv, go = gdn ? t0 * H : qo, bo = t0 * H;
                    CHECK_OK(cpu->ops->sse_decode(cpu->ctx, tr, (float *)pq1.c + qo, (float *)pk1.c + qo,
                                                  (float *)pq2.c + qo, (float *)pk2.c + qo, (float *)pv.c + vo,
                                                  (float *)pga.c + go, (float *)pgb.c + go,
                                                  gdn ? (float *)pba.c + bo : NULL, gdn ? (float *)pbb.c + bo : NULL,
                                                  (int32_t *)pidx.c + t0 * K, (float *)pw.c + t0 * K, B, H, dk, dv, N,
                                                  K, scale, Sc0, Scp, dout.c));
                    CHECK_OK(gpu->ops->sse_decode(gpu->ctx, tr, (float *)pq1.g + qo, (float *)pk1.g + qo,
                                                  (float *)pq2.g + qo, (float *)pk2.g + qo, (float *)pv.g + vo,
                                                  (float *)pga.g + go, (float *)pgb.g + go,
                                                  gdn ? (float *)pba.g + bo : NULL, gdn ? (float *)pbb.g + bo : NULL,
                                                  (int32_t *)pidx.g + t0 * K, (float *)pw.g + t0 * K, B, H, dk, dv, N,
                                                  K, scale, Sg0, Sgp, dout.g));
                    snprintf(name, sizeof name, "sse-%s K=%d decode step %d: o", gdn ? "gdn" : "gla", K, step);
                    cmp_pair(name, dout, REC_TOL);
                }
                for (int b = 0; b < B; b++) {
                    cmp_pair("sse decode: S0", d0[b], REC_TOL);
                    cmp_pair("sse decode: Sp", dp[b], REC_TOL);
                    pair_free(d0[b]);
                    pair_free(dp[b]);
                }
                pair_free(dout);
            }
            pair_free(pl);
            pair_free(pidx);
            pair_free(pw);
            pair_free(pq1);
            pair_free(pk1);
            pair_free(pq2);
            pair_free(pk2);
            pair_free(pv);
            pair_free(pga);
            pair_free(pgb);
            pair_free(pba);
            pair_free(pbb);
            pair_free(pS0);
            pair_free(pSp);
            pair_free(po);
            free(lg);
            free(q1);
            free(k1);
            free(q2);
            free(k2);
            free(v);
            free(ga);
            free(gb);
            free(ba);
            free(bb);
            free(S0);
            free(Sp);
        }
}

/* ---------------------------------------------------------------- attention */

typedef struct {
    int n_pages, pt;
    void **kc, **vc, **kg, **vg; /* page pointers per backend */
} kvpair;

static hyla_kv_view kv_view(void *const *k, void *const *v, int n_pages, int pt) {
    return (hyla_kv_view){.k_pages = k, .v_pages = v, .n_pages = n_pages, .page_tokens = pt};
}
static kvpair kv_new(int n_pages, int pt, int Hk, int D) {
    kvpair p = {n_pages, pt, calloc(n_pages, sizeof(void *)), calloc(n_pages, sizeof(void *)),
                calloc(n_pages, sizeof(void *)), calloc(n_pages, sizeof(void *))};
    size_t pc = (size_t)pt * Hk * D * hyla_dtype_size(cpu->ops->kv_dtype);
    size_t pg = (size_t)pt * Hk * D * hyla_dtype_size(gpu->ops->kv_dtype);
    for (int i = 0; i < n_pages; i++) {
        p.kc[i] = dev(cpu, NULL, pc);
        p.vc[i] = dev(cpu, NULL, pc);
        p.kg[i] = dev(gpu, NULL, pg);
        p.vg[i] = dev(gpu, NULL, pg);
    }
    return p;
}
static void kv_free(kvpair *p) {
    for (int i = 0; i < p->n_pages; i++) {
        dfree(cpu, p->kc[i]);
        dfree(cpu, p->vc[i]);
        dfree(gpu, p->kg[i]);
        dfree(gpu, p->vg[i]);
    }
    free(p->kc);
    free(p->vc);
    free(p->kg);
    free(p->vg);
}

static void case_attention(const op_case *c) {
    (void)c;
    struct {
        int Hq, Hk, D, pt, window;
    } cases[] = {{4, 2, 64, 64, 0},  {4, 4, 128, 64, 0}, {6, 2, 128, 16, 50}, {4, 2, 48, 64, 0}, {2, 1, 32, 64, 30},
                 /* pages of a size that is no power of two (k_attn_wg divides instead of shifting),
                  * on inputs of their own so the cases after keep theirs */
                 {4, 2, 128, 24, 0}, {4, 2, 64, 40, 20},
                 /* heads of 256 (attention layers of hidden / heads = 256): the warpgroup flash
                  * prefill, and decode on the rows kernel with a key a thread */
                 {4, 2, 256, 64, 0}};
    hyla_rng saved = rng;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        if (ci == 5) {
            saved = rng;
            hyla_rng_seed(&rng, 20261128);
        }
        int Hq = cases[ci].Hq, Hk = cases[ci].Hk, D = cases[ci].D, pt = cases[ci].pt, W = cases[ci].window;
        float scale = 1.0f / sqrtf((float)D);
        int n1 = 100, n2 = 70; /* prefill 100, then append 70, then 3 decode steps */
        int total = n1 + n2 + 3;
        kvpair kv = kv_new((total + pt - 1) / pt, pt, Hk, D);
        hyla_kv_view vc = kv_view(kv.kc, kv.vc, kv.n_pages, pt), vg = kv_view(kv.kg, kv.vg, kv.n_pages, pt);
        int pos0 = 0;
        for (int part = 0; part < 2; part++) {
            int n = part ? n2 : n1;
            size_t nq = (size_t)n * Hq * D, nk = (size_t)n * Hk * D;
            float *q = randn(nq, 1.0f), *k = randn(nk, 1.0f), *v = randn(nk, 1.0f);
            pair pq = pair_new(q, nq), pk = pair_new(k, nk), pv = pair_new(v, nk), po = pair_new(NULL, nq);
            CHECK_OK(cpu->ops->attn_prefill(cpu->ctx, pq.c, pk.c, pv.c, n, Hq, Hk, D, pos0, &vc, W, scale, po.c));
            CHECK_OK(gpu->ops->attn_prefill(gpu->ctx, pq.g, pk.g, pv.g, n, Hq, Hk, D, pos0, &vg, W, scale, po.g));
            char name[96];
            snprintf(name, sizeof name, "attn prefill Hq=%d Hk=%d D=%d pt=%d W=%d pos0=%d", Hq, Hk, D, pt, W, pos0);
            cmp_pair(name, po, ATTN_TOL);
            pair_free(pq);
            pair_free(pk);
            pair_free(pv);
            pair_free(po);
            free(q);
            free(k);
            free(v);
            pos0 += n;
        }
        /* decode: 2 sessions — this cache and a copy at an earlier position */
        for (int step = 0; step < 3; step++) {
            int B = 1;
            size_t nq = (size_t)B * Hq * D, nk = (size_t)B * Hk * D;
            float *q = randn(nq, 1.0f), *k = randn(nk, 1.0f), *v = randn(nk, 1.0f);
            pair pq = pair_new(q, nq), pk = pair_new(k, nk), pv = pair_new(v, nk), po = pair_new(NULL, nq);
            int32_t pos[1] = {pos0};
            CHECK_OK(cpu->ops->attn_decode(cpu->ctx, pq.c, pk.c, pv.c, B, Hq, Hk, D, pos, &vc, W, scale, po.c));
            CHECK_OK(gpu->ops->attn_decode(gpu->ctx, pq.g, pk.g, pv.g, B, Hq, Hk, D, pos, &vg, W, scale, po.g));
            char name[96];
            snprintf(name, sizeof name, "attn decode D=%d W=%d pos=%d", D, W, pos0);
            cmp_pair(name, po, ATTN_TOL);
            pair_free(pq);
            pair_free(pk);
            pair_free(pv);
            pair_free(po);
            free(q);
            free(k);
            free(v);
            pos0++;
        }
        /* a missing page is an error, not a crash */
        {
            void *saved = kv.kg[0];
            kv.kg[0] = NULL;
            float *q = randn((size_t)Hq * D, 1.0f);
            pair pq = pair_new(q, (size_t)Hq * D), pk = pair_new(q, (size_t)Hk * D), po = pair_new(NULL, (size_t)Hq * D);
            int32_t pos[1] = {pos0};
            hyla_status s = gpu->ops->attn_decode(gpu->ctx, pq.g, pk.g, pk.g, 1, Hq, Hk, D, pos, &vg, 0, scale, po.g);
            CHECK_MSG(s == HYLA_ERR_INVALID_ARG, "attn_decode with a missing page -> invalid arg (got %s)",
                      hyla_status_str(s));
            kv.kg[0] = saved;
            pair_free(pq);
            pair_free(pk);
            pair_free(po);
            free(q);
        }
        kv_free(&kv);
    }
    rng = saved;
    /* split flash prefill (hyla_cuda_set_attn_split, default 8192 keys per split):
     * with splits of 64 keys, a 300-token prefill in one call == the same tokens as pieces of
     * 64 + 236 (both pieces' rows, bits: the split boundaries are absolute positions), with and
     * without a window; within the tolerance of the CPU; the one-pass form (=0) too */
    for (int W = 0; W <= 100; W += 100) {
        const int Hq = 4, Hk = 2, D = 128, pt = 64, n = 300, n1 = 64;
        float scale = 1.0f / sqrtf((float)D);
        size_t nq = (size_t)n * Hq * D, nk = (size_t)n * Hk * D, q1 = (size_t)n1 * Hq * D, k1 = (size_t)n1 * Hk * D;
        float *q = randn(nq, 1.0f), *k = randn(nk, 1.0f), *v = randn(nk, 1.0f);
        pair pq = pair_new(q, nq), pk = pair_new(k, nk), pv = pair_new(v, nk), po = pair_new(NULL, nq);
        kvpair kv1 = kv_new((n + pt - 1) / pt, pt, Hk, D), kv2 = kv_new((n + pt - 1) / pt, pt, Hk, D);
        hyla_kv_view vc = kv_view(kv1.kc, kv1.vc, kv1.n_pages, pt), v1 = kv_view(kv1.kg, kv1.vg, kv1.n_pages, pt),
                     v2 = kv_view(kv2.kg, kv2.vg, kv2.n_pages, pt);
        void *o2 = dev(gpu, NULL, nq * 4), *o3 = dev(gpu, NULL, nq * 4);
        CHECK_OK(hyla_cuda_set_attn_split(gpu, 64));
        CHECK_OK(gpu->ops->attn_prefill(gpu->ctx, pq.g, pk.g, pv.g, n, Hq, Hk, D, 0, &v1, W, scale, po.g));
        CHECK_OK(gpu->ops->attn_prefill(gpu->ctx, pq.g, pk.g, pv.g, n1, Hq, Hk, D, 0, &v2, W, scale, o2));
        CHECK_OK(gpu->ops->attn_prefill(gpu->ctx, (float *)pq.g + q1, (float *)pk.g + k1, (float *)pv.g + k1, n - n1, Hq,
                                        Hk, D, n1, &v2, W, scale, (float *)o2 + q1));
        CHECK_MSG(same_bits(gpu, po.g, o2, nq * 4),
                  "attn prefill, splits of 64 keys, W=%d: 300 tokens in one call == pieces of 64 + 236 (bits)", W);
        CHECK_OK(cpu->ops->attn_prefill(cpu->ctx, pq.c, pk.c, pv.c, n, Hq, Hk, D, 0, &vc, W, scale, po.c));
        char name[96];
        snprintf(name, sizeof name, "attn prefill, splits of 64 keys, n=%d W=%d", n, W);
        cmp_pair(name, po, ATTN_TOL);
        CHECK_OK(hyla_cuda_set_attn_split(gpu, 0));
        CHECK_OK(gpu->ops->attn_prefill(gpu->ctx, pq.g, pk.g, pv.g, n, Hq, Hk, D, 0, &v2, W, scale, o3));
        CHECK_OK(hyla_cuda_set_attn_split(gpu, 8192));
        float *h3 = host_of(gpu, o3, nq), *hc = host_of(cpu, po.c, nq);
        snprintf(name, sizeof name, "attn prefill, one pass, n=%d W=%d", n, W);
        cmp(name, h3, hc, nq, ATTN_TOL);
        free(h3);
        free(hc);
        dfree(gpu, o2);
        dfree(gpu, o3);
        kv_free(&kv1);
        kv_free(&kv2);
        pair_free(pq);
        pair_free(pk);
        pair_free(pv);
        pair_free(po);
        free(q);
        free(k);
        free(v);
    }
    /* batched decode: 4 sessions at different positions, one call */
    {
        int B = 4, Hq = 4, Hk = 2, D = 128, pt = 64;
        float scale = 1.0f / sqrtf((float)D);
        int lens[4] = {1, 70, 300, 1500};
        kvpair kv[4];
        hyla_kv_view vc[4], vg[4];
        for (int b = 0; b < B; b++) {
            kv[b] = kv_new((lens[b] + 1 + pt - 1) / pt, pt, Hk, D);
            vc[b] = kv_view(kv[b].kc, kv[b].vc, kv[b].n_pages, pt);
            vg[b] = kv_view(kv[b].kg, kv[b].vg, kv[b].n_pages, pt);
            int n = lens[b];
            size_t nq = (size_t)n * Hq * D, nk = (size_t)n * Hk * D;
            float *q = randn(nq, 1.0f), *k = randn(nk, 1.0f), *v = randn(nk, 1.0f);
            pair pq = pair_new(q, nq), pk = pair_new(k, nk), pv = pair_new(v, nk), po = pair_new(NULL, nq);
            CHECK_OK(cpu->ops->attn_prefill(cpu->ctx, pq.c, pk.c, pv.c, n, Hq, Hk, D, 0, &vc[b], 0, scale, po.c));
            CHECK_OK(gpu->ops->attn_prefill(gpu->ctx, pq.g, pk.g, pv.g, n, Hq, Hk, D, 0, &vg[b], 0, scale, po.g));
            if (b == 3) cmp_pair("attn prefill n=1500 D=128 (flash)", po, ATTN_TOL);
            pair_free(pq);
            pair_free(pk);
            pair_free(pv);
            pair_free(po);
            free(q);
            free(k);
            free(v);
        }
        size_t nq = (size_t)B * Hq * D, nk = (size_t)B * Hk * D;
        float *q = randn(nq, 1.0f), *k = randn(nk, 1.0f), *v = randn(nk, 1.0f);
        pair pq = pair_new(q, nq), pk = pair_new(k, nk), pv = pair_new(v, nk), po = pair_new(NULL, nq);
        CHECK_OK(cpu->ops->attn_decode(cpu->ctx, pq.c, pk.c, pv.c, B, Hq, Hk, D, lens, vc, 0, scale, po.c));
        CHECK_OK(gpu->ops->attn_decode(gpu->ctx, pq.g, pk.g, pv.g, B, Hq, Hk, D, lens, vg, 0, scale, po.g));
        cmp_pair("attn decode B=4 (pos 1..1500)", po, ATTN_TOL);
        pair_free(pq);
        pair_free(pk);
        pair_free(pv);
        pair_free(po);
        free(q);
        free(k);
        free(v);
        for (int b = 0; b < B; b++) kv_free(&kv[b]);
    }
}

/* Flash prefill (k_attn_wg / k_attn_flash2), p = {D}: a row gets the same bits whatever call it
 * is in: a prefill from position 0 (n = 300, 1100: several query blocks and a partial one) == the
 * same tokens as a piece of 64 and a piece at pos0 = 64, GQA, window 0 and 100, one pass and
 * splits of 64 keys; each within the tolerance of the CPU; at D = 64, 128 on Hopper (and 256
 * without a window: attention layers of hidden / heads = 256) the other flash kernel
 * (hyla_cuda_set_attn_wg(0): k_attn_flash2) within rounding of the default, and piece-invariant
 * too; with splits, k_attn_wg's walk over a block's splits (hyla_cuda_set_attn_walk) gives the
 * bits of the partials and their combine. */
static void case_attn_pieces(const op_case *c) {
    /* n = 2300 at D = 128 with the two-warpgroup form from any key count
     * (hyla_cuda_set_attn_wg2(1); the default takes it from 8192 keys on average): one call on it
     * (2048 queries and more, no window) == pieces of 64 (one warpgroup) and 2236 (two) */
    const int Hq = 4, Hk = 2, D = c->p[0], ns[3] = {300, 1100, 2300}, nn = D == 128 ? 3 : 2, n1 = 64;
    char sw[256] = "";
    CHECK_OK(hyla_cuda_switches(gpu, sw, sizeof sw));
    const char *aw = strstr(sw, "attn_wg=");
    const int wg_on = aw ? atoi(aw + 8) : 0; /* the default here */
    const char *aw2 = strstr(sw, "attn_wg2=");
    const int wg2_keys = aw2 ? atoi(aw2 + 9) : 0;
    const char *awk = strstr(sw, "attn_walk=");
    const int walk_blocks = awk ? atoi(awk + 10) : 0;
    for (int W = 0; W <= 100; W += 100) {
        /* k_attn_wg's head dims: 64, 128, and 256 without a window */
        const int wg_d = wg_on && ((D >= 64 && D <= 128) || (D == 256 && W == 0));
        printf("# attn pieces D=%d W=%d: the default kernel is %s\n", D, W, wg_d ? "k_attn_wg" : "k_attn_flash2");
        for (int sp = 0; sp < 2; sp++)
            for (int ni = 0; ni < nn; ni++) {
                const int n = ns[ni], pt = D == 64 ? 16 : 64;
                float scale = 1.0f / sqrtf((float)D);
                size_t nq = (size_t)n * Hq * D, nk = (size_t)n * Hk * D, q1 = (size_t)n1 * Hq * D,
                       k1 = (size_t)n1 * Hk * D;
                float *q = randn(nq, 1.0f), *k = randn(nk, 1.0f), *v = randn(nk, 1.0f);
                pair pq = pair_new(q, nq), pk = pair_new(k, nk), pv = pair_new(v, nk), po = pair_new(NULL, nq);
                kvpair kv = kv_new((n + pt - 1) / pt, pt, Hk, D);
                hyla_kv_view vc = kv_view(kv.kc, kv.vc, kv.n_pages, pt), vg = kv_view(kv.kg, kv.vg, kv.n_pages, pt);
                char name[112];
                if (sp) CHECK_OK(hyla_cuda_set_attn_split(gpu, 64));
                if (n == 2300 && wg2_keys) CHECK_OK(hyla_cuda_set_attn_wg2(gpu, 1));
                CHECK_OK(cpu->ops->attn_prefill(cpu->ctx, pq.c, pk.c, pv.c, n, Hq, Hk, D, 0, &vc, W, scale, po.c));
                void *op = dev(gpu, NULL, nq * 4);
                PERF(CHECK_OK(gpu->ops->attn_prefill(gpu->ctx, pq.g, pk.g, pv.g, n, Hq, Hk, D, 0, &vg, W, scale, po.g)));
                CHECK_OK(gpu->ops->attn_prefill(gpu->ctx, pq.g, pk.g, pv.g, n1, Hq, Hk, D, 0, &vg, W, scale, op));
                CHECK_OK(gpu->ops->attn_prefill(gpu->ctx, (float *)pq.g + q1, (float *)pk.g + k1, (float *)pv.g + k1,
                                                n - n1, Hq, Hk, D, n1, &vg, W, scale, (float *)op + q1));
                CHECK_MSG(same_bits(gpu, po.g, op, nq * 4),
                          "attn prefill D=%d W=%d n=%d%s: one call == pieces of 64 + %d at pos0=64 (bits)", D, W, n,
                          sp ? " splits of 64" : "", n - n1);
                /* the walk over all splits in one block (hyla_cuda_set_attn_walk(1): every call
                 * walks; these calls are below the default's bound, so po took the partials and
                 * the combine): the same bits, the whole call and the pieces */
                if (sp) {
                    CHECK_OK(hyla_cuda_set_attn_walk(gpu, 1));
                    void *ok = dev(gpu, NULL, nq * 4);
                    CHECK_OK(gpu->ops->attn_prefill(gpu->ctx, pq.g, pk.g, pv.g, n, Hq, Hk, D, 0, &vg, W, scale, ok));
                    CHECK_MSG(same_bits(gpu, po.g, ok, nq * 4),
                              "attn prefill D=%d W=%d n=%d, splits of 64: walking all splits == partials and combine (bits)",
                              D, W, n);
                    CHECK_OK(gpu->ops->attn_prefill(gpu->ctx, pq.g, pk.g, pv.g, n1, Hq, Hk, D, 0, &vg, W, scale, ok));
                    CHECK_OK(gpu->ops->attn_prefill(gpu->ctx, (float *)pq.g + q1, (float *)pk.g + k1,
                                                    (float *)pv.g + k1, n - n1, Hq, Hk, D, n1, &vg, W, scale,
                                                    (float *)ok + q1));
                    CHECK_MSG(same_bits(gpu, po.g, ok, nq * 4),
                              "attn prefill D=%d W=%d n=%d, splits of 64, walking: pieces of 64 + %d (bits)", D, W, n,
                              n - n1);
                    CHECK_OK(hyla_cuda_set_attn_walk(gpu, walk_blocks));
                    dfree(gpu, ok);
                }
                /* the other flash kernel (k_attn_wg, Hopper's default at D = 128, against
                 * k_attn_flash2): within rounding of each other (the same tiles, products and
                 * softmax; the warpgroup product's sums round differently where P V adds into a
                 * larger O, up to an ulp or two), and each one piece-invariant on its own */
                if (wg_d) {
                    CHECK_OK(hyla_cuda_set_attn_wg(gpu, 0));
                    void *ow = dev(gpu, NULL, nq * 4);
                    CHECK_OK(gpu->ops->attn_prefill(gpu->ctx, pq.g, pk.g, pv.g, n, Hq, Hk, D, 0, &vg, W, scale, ow));
                    float *hw = host_of(gpu, po.g, nq), *hf = host_of(gpu, ow, nq);
                    snprintf(name, sizeof name, "  k_attn_wg vs k_attn_flash2 D=%d W=%d n=%d%s", D, W, n,
                             sp ? " split" : "");
                    cmp(name, hw, hf, nq, 1e-6, 1e-6);
                    CHECK_OK(gpu->ops->attn_prefill(gpu->ctx, pq.g, pk.g, pv.g, n1, Hq, Hk, D, 0, &vg, W, scale, op));
                    CHECK_OK(gpu->ops->attn_prefill(gpu->ctx, (float *)pq.g + q1, (float *)pk.g + k1, (float *)pv.g + k1,
                                                    n - n1, Hq, Hk, D, n1, &vg, W, scale, (float *)op + q1));
                    CHECK_MSG(same_bits(gpu, ow, op, nq * 4),
                              "attn prefill D=%d W=%d n=%d%s with k_attn_flash2: one call == pieces (bits)", D, W, n,
                              sp ? " splits of 64" : "");
                    free(hw), free(hf);
                    CHECK_OK(hyla_cuda_set_attn_wg(gpu, wg_on));
                    dfree(gpu, ow);
                }
                snprintf(name, sizeof name, "attn prefill D=%d W=%d n=%d%s", D, W, n, sp ? " split 64" : "");
                cmp_pair(name, po, ATTN_TOL);
                if (sp) CHECK_OK(hyla_cuda_set_attn_split(gpu, 8192));
                if (n == 2300 && wg2_keys) CHECK_OK(hyla_cuda_set_attn_wg2(gpu, wg2_keys));
                dfree(gpu, op);
                kv_free(&kv);
                pair_free(pq);
                pair_free(pk);
                pair_free(pv);
                pair_free(po);
                free(q);
                free(k);
                free(v);
            }
    }
}

/* ---------------------------------------------------------------- sampling */

static void case_sample(const op_case *c) {
    (void)c;
    int B = 96, V = 1000;
    float *l = randn((size_t)B * V, 2.0f);
    for (int i = 0; i < 10; i++) l[(size_t)1 * V + 100 + i] = 50.0f; /* row 1: tie for the max */
    for (int i = 0; i < V; i++) l[(size_t)2 * V + i] = 0.0f;       /* row 2: all equal */
    hyla_sampling *sp = calloc(B, sizeof *sp);
    float *u = malloc(B * sizeof(float));
    for (int b = 0; b < B; b++) {
        u[b] = hyla_rng_uniform(&rng);
        int kind = b % 6;
        sp[b].temperature = kind == 0 ? 0.0f : 0.5f + 0.2f * (b % 5);
        sp[b].top_k = (kind == 2 || kind == 4) ? 1 + b % 50 : 0;
        sp[b].top_p = (kind == 3 || kind == 4) ? 0.3f + 0.1f * (b % 6) : 1.0f;
        if (kind == 5) sp[b].top_k = 1; /* equals greedy */
    }
    sp[1].temperature = 0.0f;
    sp[2].temperature = 1.0f;
    sp[2].top_k = 7; /* ties: the 7 lowest indices are kept */
    pair pl = pair_new(l, (size_t)B * V);
    int32_t *oc = malloc(B * 4), *og = malloc(B * 4);
    CHECK_OK(cpu->ops->sample(cpu->ctx, pl.c, B, V, sp, u, oc));
    CHECK_OK(gpu->ops->sample(gpu->ctx, pl.g, B, V, sp, u, og));
    int diff = 0, greedy_diff = 0;
    for (int b = 0; b < B; b++) {
        if (oc[b] != og[b]) {
            diff++;
            if (!(sp[b].temperature > 0)) greedy_diff++;
            printf("  sample row %d (T=%.2f k=%d p=%.2f u=%.4f): cpu %d gpu %d\n", b, sp[b].temperature, sp[b].top_k,
                   sp[b].top_p, u[b], oc[b], og[b]);
        }
    }
    printf("  sample: %d of %d rows differ (%d greedy)\n", diff, B, greedy_diff);
    CHECK(greedy_diff == 0 && diff <= 2);
    CHECK(og[1] == 100);
    CHECK(og[2] >= 0 && og[2] < 7);
    /* determinism */
    int32_t *og2 = malloc(B * 4);
    CHECK_OK(gpu->ops->sample(gpu->ctx, pl.g, B, V, sp, u, og2));
    CHECK(!memcmp(og, og2, B * 4));
    free(og2);
    pair_free(pl);
    free(l);
    /* greedy over a real vocabulary's width: rows whose 16-byte loads run four deep (V = 32000,
     * every row aligned), and V = 32003 (rows after the first unaligned: the one-by-one loop;
     * the first: the vector loop, then the last 3 one by one); ties for the max placed in the
     * unrolled part, across its 4-deep groups, and in the tail */
    const int Vs[2] = {32000, 32003};
    for (int vi = 0; vi < 2; vi++) {
        const int BV = 4, VV = Vs[vi];
        float *lv = randn((size_t)BV * VV, 2.0f);
        for (int r = 0; r < BV; r++) lv[(size_t)r * VV + 31000 + r] = 40.0f; /* a clear max */
        lv[(size_t)1 * VV + 20000] = lv[(size_t)1 * VV + 9000] = lv[(size_t)1 * VV + 17] = 41.0f; /* tie: 17 */
        lv[(size_t)2 * VV + VV - 1] = 42.0f;                                                        /* in the tail */
        hyla_sampling gs[4] = {{0.0f, 0, 1.0f}, {0.0f, 0, 1.0f}, {0.0f, 0, 1.0f}, {0.0f, 0, 1.0f}};
        float gu[4] = {0, 0, 0, 0};
        int32_t tc[4], tg[4];
        pair pv = pair_new(lv, (size_t)BV * VV);
        CHECK_OK(cpu->ops->sample(cpu->ctx, pv.c, BV, VV, gs, gu, tc));
        CHECK_OK(gpu->ops->sample(gpu->ctx, pv.g, BV, VV, gs, gu, tg));
        CHECK_MSG(!memcmp(tc, tg, sizeof tc) && tg[0] == 31000 && tg[1] == 17 && tg[2] == VV - 1,
                  "greedy, V = %d: cpu %d %d %d %d, gpu %d %d %d %d", VV, tc[0], tc[1], tc[2], tc[3], tg[0], tg[1],
                  tg[2], tg[3]);
        pair_free(pv);
        free(lv);
    }
    free(sp);
    free(u);
    free(oc);
    free(og);
}

/* SSE prefill planned on the device (N <= 64, K <= 8): longer than one planner tile (1024
 * tokens / rows), with an empty partition, K = 1, 2, windows of 64 and 256 (at K = 2 a partition
 * holds more than 64 tokens of a 256-token window: chunks cut within it) and plain chunks, and
 * more packed rows than one pass of the chunk-start scan (16384: 9000 tokens); and
 * planned on the host (N > 64), windows of 64 and 256: each against the CPU at the same window,
 * and an unselected partition's state untouched; window-sized pieces == one call, bit for bit.
 * p = {transition}. */
static void case_sse_plan(const op_case *c) {
    const int tr = c->p[0], gdn = tr == HYLA_SSE_GDN;
    /* the last shape: 8 heads of 128, so that GLA's kernel B grid (4 x 8 x 5 blocks) exceeds the
     * SMs and takes its compact stage (two blocks an SM) */
    struct {
        int n, N, K, win, H, dk, dv;
    } shapes[] = {{1500, 4, 1, 64, 2, 64, 64},  {1500, 4, 1, 0, 2, 64, 64},   {1500, 4, 2, 64, 2, 64, 64},
                  {1500, 4, 2, 0, 2, 64, 64},   {300, 72, 2, 64, 2, 64, 64},  {1500, 4, 1, 64, 8, 128, 128},
                  {1500, 4, 1, 256, 2, 64, 64}, {1500, 4, 2, 256, 2, 64, 64}, {700, 72, 2, 256, 2, 64, 64},
                  {1500, 4, 1, 256, 8, 128, 128}, {9000, 4, 1, 256, 2, 64, 64}, {9000, 4, 2, 0, 2, 64, 64}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int n = shapes[si].n, N = shapes[si].N, K = shapes[si].K, win = shapes[si].win, H = shapes[si].H,
                  dk = shapes[si].dk, dv = shapes[si].dv;
        float scale = 1.0f / sqrtf((float)dk);
        size_t nqk = (size_t)n * H * dk, nv = (size_t)n * H * dv, ns = (size_t)H * dk * dv;
        int32_t *idx = malloc((size_t)n * K * 4);
        float *w = randu((size_t)n * K, 0.05f, 1.0f);
        const int used = N - 1; /* partition N - 1 is never selected; runs of varying length */
        for (int t = 0; t < n; t++) {
            int p = (t * 7 / 13 + t / 97) % used;
            idx[t * K] = p;
            if (K == 2) idx[t * K + 1] = (p + 1 + (t / 5) % 2) % used;
        }
        float *q1 = randn(nqk, 1.0f), *k1 = randn(nqk, 1.0f), *q2 = randn(nqk, 1.0f), *k2 = randn(nqk, 1.0f);
        float *v = randn(nv, 1.0f);
        size_t ng = gdn ? (size_t)n * H : nqk;
        float *ga = gdn ? gdn_decays(ng) : gla_gates(ng), *gb = gdn ? gdn_decays(ng) : gla_gates(ng);
        float *ba = randu((size_t)n * H, 0.05f, 1.0f), *bb = randu((size_t)n * H, 0.05f, 1.0f);
        if (gdn) {
            l2rows(q1, (size_t)n * H, dk);
            l2rows(k1, (size_t)n * H, dk);
            l2rows(q2, (size_t)n * H, dk);
            l2rows(k2, (size_t)n * H, dk);
        }
        float *S0 = randn(ns, 0.3f), *Sp = randn(ns * N, 0.3f);
        pair pq1 = pair_new(q1, nqk), pk1 = pair_new(k1, nqk), pq2 = pair_new(q2, nqk), pk2 = pair_new(k2, nqk),
             pv = pair_new(v, nv), pga = pair_new(ga, ng), pgb = pair_new(gb, ng), pba = pair_new(ba, (size_t)n * H),
             pbb = pair_new(bb, (size_t)n * H), pi = pair_new(idx, (size_t)n * K), pw = pair_new(w, (size_t)n * K),
             pS0 = pair_new(S0, ns), pSp = pair_new(Sp, ns * N), po = pair_new(NULL, nv);
        /* win 0: the GPU's plain chunks, against the CPU's windows of 64 */
        const int cw = win ? win : 64;
        CHECK_OK(hyla_cuda_set_sse_windows(gpu, win != 0));
        CHECK_OK(cpu->ops->sse_prefill(cpu->ctx, tr, pq1.c, pk1.c, pq2.c, pk2.c, pv.c, pga.c, pgb.c, gdn ? pba.c : NULL,
                                       gdn ? pbb.c : NULL, pi.c, pw.c, n, H, dk, dv, N, K, scale, cw, pS0.c, pSp.c, po.c));
        PERF(CHECK_OK(gpu->ops->sse_prefill(gpu->ctx, tr, pq1.g, pk1.g, pq2.g, pk2.g, pv.g, pga.g, pgb.g,
                                            gdn ? pba.g : NULL, gdn ? pbb.g : NULL, pi.g, pw.g, n, H, dk, dv, N, K, scale,
                                            cw, pS0.g, pSp.g, po.g)));
        CHECK_OK(hyla_cuda_set_sse_windows(gpu, 1));
        char name[96];
        snprintf(name, sizeof name, "sse-%s n=%d H=%d N=%d K=%d %s %d: o", gdn ? "gdn" : "gla", n, H, N, K, win ? "windows" : "plain", win);
        cmp_pair(name, po, CHUNK_TOL);
        snprintf(name, sizeof name, "sse-%s n=%d H=%d N=%d K=%d %s %d: S0", gdn ? "gdn" : "gla", n, H, N, K, win ? "windows" : "plain", win);
        cmp_pair(name, pS0, CHUNK_TOL);
        snprintf(name, sizeof name, "sse-%s n=%d H=%d N=%d K=%d %s %d: Sp", gdn ? "gdn" : "gla", n, H, N, K, win ? "windows" : "plain", win);
        cmp_pair(name, pSp, CHUNK_TOL);
        float *hp = host_of(gpu, pSp.g, ns * N);
        CHECK_MSG(!memcmp(hp + (size_t)(N - 1) * ns, Sp + (size_t)(N - 1) * ns, ns * 4),
                  "sse-%s n=%d N=%d K=%d: an unselected partition changed", gdn ? "gdn" : "gla", n, N, K);
        free(hp);
        /* window-aligned chunks: pieces of the window == the one call, bit for bit. The one call
         * (few blocks, many chunks) runs the split form, through the row map (GLA: v rows copied
         * to kernel B's U0), and a piece's few chunks the fused pass, so this holds the split form
         * to the fused pass's bits. */
        if (win && N <= 64) {
            void *a0 = dev(gpu, S0, ns * 4), *ap = dev(gpu, Sp, ns * N * 4), *ao = dev(gpu, NULL, nv * 4);
            for (int t0 = 0; t0 < n; t0 += win) {
                const int m = n - t0 < win ? n - t0 : win;
                const size_t qo = (size_t)t0 * H * dk, vo = (size_t)t0 * H * dv, go = gdn ? (size_t)t0 * H : qo,
                             bo = (size_t)t0 * H;
                CHECK_OK(gpu->ops->sse_prefill(
                    gpu->ctx, tr, (float *)pq1.g + qo, (float *)pk1.g + qo, (float *)pq2.g + qo, (float *)pk2.g + qo,
                    (float *)pv.g + vo, (float *)pga.g + go, (float *)pgb.g + go, gdn ? (float *)pba.g + bo : NULL,
                    gdn ? (float *)pbb.g + bo : NULL, (int32_t *)pi.g + (size_t)t0 * K, (float *)pw.g + (size_t)t0 * K,
                    m, H, dk, dv, N, K, scale, win, a0, ap, (float *)ao + vo));
            }
            CHECK_MSG(same_bits(gpu, a0, pS0.g, ns * 4) && same_bits(gpu, ap, pSp.g, ns * N * 4) &&
                          same_bits(gpu, ao, po.g, nv * 4),
                      "sse-%s n=%d H=%d N=%d K=%d: %d-token pieces == one call, bits", gdn ? "gdn" : "gla", n, H, N, K,
                      win);
            dfree(gpu, a0);
            dfree(gpu, ap);
            dfree(gpu, ao);
        }
        pair ps[] = {pq1, pk1, pq2, pk2, pv, pga, pgb, pba, pbb, pi, pw, pS0, pSp, po};
        for (size_t x = 0; x < sizeof ps / sizeof ps[0]; x++) pair_free(ps[x]);
        float *hb[] = {q1, k1, q2, k2, v, ga, gb, ba, bb, S0, Sp, w};
        for (size_t x = 0; x < sizeof hb / sizeof hb[0]; x++) free(hb[x]);
        free(idx);
    }
}

/* ---------------------------------------------------------------- LTE and NSA */

/* LTE: a scoring CNN as the paper's (3 layers, kernel 3, dilation 2, channels halved), weights
 * fp32 on both backends. The cache is driven through a prefill piece, a second piece and decode
 * steps; k, v are rounded to bf16 so that the two caches (CPU fp32, GPU bf16) hold the same
 * values. Then the scores, retained positions and counters are compared exactly (the CUDA
 * scoring follows the CPU's arithmetic, so the same cached k, v give the same members in the
 * same slots), and the outputs within ATTN_TOL (bf16 keys and values, fp32 softmax). */
typedef struct {
    hyla_lte_params pc, pg; /* the same net on each backend */
    void *wc[2 * HYLA_LTE_MAX_CONV + 2], *wg[2 * HYLA_LTE_MAX_CONV + 2];
    int nw;
} lte_net;

static void lte_net_make(lte_net *n, int Hk, int D, int s, int w, int b, int eager) {
    memset(n, 0, sizeof *n);
    hyla_lte_params *p = &n->pc;
    p->Hk = Hk, p->D = D, p->sink = s, p->window = w, p->budget = b;
    p->n_conv = 3, p->kernel = 3, p->dilation = 2, p->eager = eager;
    p->ch[0] = 2 * D, p->ch[1] = D, p->ch[2] = D / 2, p->ch[3] = D / 4;
    p->rope_theta = 10000.0f;
    n->pg = *p;
    for (int l = 0; l <= 3; l++) {
        size_t nwt = l < 3 ? (size_t)Hk * p->ch[l + 1] * p->ch[l] * 3 : (size_t)Hk * p->ch[3];
        size_t nb = l < 3 ? (size_t)Hk * p->ch[l + 1] : (size_t)Hk;
        float *W = randn(nwt, l < 3 ? sqrtf(1.0f / (float)(p->ch[l] * 3)) : 1.0f), *B = randn(nb, l < 3 ? 0.1f : 0.3f);
        void *wc = dev(cpu, W, nwt * 4), *wg = dev(gpu, W, nwt * 4), *bc = dev(cpu, B, nb * 4), *bg = dev(gpu, B, nb * 4);
        if (l < 3) {
            n->pc.conv_w[l] = wc, n->pc.conv_b[l] = bc, n->pg.conv_w[l] = wg, n->pg.conv_b[l] = bg;
        } else {
            n->pc.proj_w = wc, n->pc.proj_b = bc, n->pg.proj_w = wg, n->pg.proj_b = bg;
        }
        n->wc[n->nw] = wc, n->wg[n->nw++] = wg;
        n->wc[n->nw] = bc, n->wg[n->nw++] = bg;
        free(W);
        free(B);
    }
}
static void lte_net_free(lte_net *n) {
    for (int i = 0; i < n->nw; i++) dfree(cpu, n->wc[i]), dfree(gpu, n->wg[i]);
}

typedef struct {
    hyla_lte_cache c, g;
    size_t rows; /* Hk * (s + w + b) */
} lte_cpair;

static lte_cpair lte_cpair_new(const hyla_lte_params *p) {
    lte_cpair k;
    k.rows = (size_t)p->Hk * (p->sink + p->window + p->budget);
    size_t kc = k.rows * p->D * hyla_dtype_size(cpu->ops->kv_dtype), kg = k.rows * p->D * hyla_dtype_size(gpu->ops->kv_dtype);
    k.c = (hyla_lte_cache){dev(cpu, NULL, kc), dev(cpu, NULL, kc), dev(cpu, NULL, k.rows * 4),
                           dev(cpu, NULL, (size_t)p->Hk * p->budget * 4 + 4), dev(cpu, NULL, (size_t)(2 + p->Hk) * 4)};
    k.g = (hyla_lte_cache){dev(gpu, NULL, kg), dev(gpu, NULL, kg), dev(gpu, NULL, k.rows * 4),
                           dev(gpu, NULL, (size_t)p->Hk * p->budget * 4 + 4), dev(gpu, NULL, (size_t)(2 + p->Hk) * 4)};
    return k;
}
static void lte_cpair_free(lte_cpair *k) {
    dfree(cpu, k->c.k), dfree(cpu, k->c.v), dfree(cpu, k->c.r), dfree(cpu, k->c.rpos), dfree(cpu, k->c.meta);
    dfree(gpu, k->g.k), dfree(gpu, k->g.v), dfree(gpu, k->g.r), dfree(gpu, k->g.rpos), dfree(gpu, k->g.meta);
}

/* The caches' bytes compared: meta, retained positions and scores exactly; k, v rows exactly
 * after widening the GPU's bf16. */
static void lte_cmp_cache(const char *what, const hyla_lte_params *p, const lte_cpair *k) {
    int Hk = p->Hk;
    size_t nm = 2 + (size_t)Hk, nrp = (size_t)Hk * p->budget;
    int32_t *mc = malloc(nm * 4), *mg = malloc(nm * 4), *rc = malloc(nrp * 4 + 4), *rg = malloc(nrp * 4 + 4);
    CHECK_OK(cpu->ops->download(cpu->ctx, mc, k->c.meta, nm * 4));
    CHECK_OK(gpu->ops->download(gpu->ctx, mg, k->g.meta, nm * 4));
    CHECK_OK(cpu->ops->download(cpu->ctx, rc, k->c.rpos, nrp * 4));
    CHECK_OK(gpu->ops->download(gpu->ctx, rg, k->g.rpos, nrp * 4));
    int retained = 0;
    for (int h = 0; h < Hk; h++) retained += mc[2 + h];
    CHECK_MSG(!memcmp(mc, mg, nm * 4), "%s: meta (tokens %d/%d, next scored %d/%d, %d retained on the CPU) equal", what,
              mc[0], mg[0], mc[1], mg[1], retained);
    CHECK_MSG(!memcmp(rc, rg, nrp * 4), "%s: retained positions equal", what);
    float *sc = host_of(cpu, k->c.r, k->rows), *sg = host_of(gpu, k->g.r, k->rows);
    size_t diff = 0;
    for (size_t i = 0; i < k->rows; i++) diff += memcmp(&sc[i], &sg[i], 4) != 0;
    CHECK_MSG(diff == 0, "%s: scores bit-identical (%zu of %zu differ)", what, diff, k->rows);
    size_t ne = k->rows * p->D;
    float *kc = host_of(cpu, k->c.k, ne);
    uint16_t *kg = malloc(ne * 2);
    CHECK_OK(gpu->ops->download(gpu->ctx, kg, k->g.k, ne * 2));
    size_t kd = 0;
    for (size_t i = 0; i < ne; i++) kd += kc[i] != hyla_bf16_to_f32(kg[i]);
    CHECK_MSG(kd == 0, "%s: cached keys equal (%zu differ)", what, kd);
    printf("  %-44s meta, %d retained, scores, keys identical: %s\n", what, retained,
           !memcmp(mc, mg, nm * 4) && !memcmp(rc, rg, nrp * 4) && !diff && !kd ? "ok" : "FAIL");
    free(mc), free(mg), free(rc), free(rg), free(sc), free(sg), free(kc), free(kg);
}

/* Two GPU caches' bytes equal (k, v, scores, retained positions, meta). */
static void lte_cmp_gpu(const char *what, const hyla_lte_params *p, const hyla_lte_cache *a, const hyla_lte_cache *b) {
    size_t rows = (size_t)p->Hk * (p->sink + p->window + p->budget);
    size_t kb = rows * p->D * hyla_dtype_size(gpu->ops->kv_dtype), nb[5] = {kb, kb, rows * 4, (size_t)p->Hk * p->budget * 4,
                                                                           (size_t)(2 + p->Hk) * 4};
    const void *pa[5] = {a->k, a->v, a->r, a->rpos, a->meta}, *pb[5] = {b->k, b->v, b->r, b->rpos, b->meta};
    static const char *const names[5] = {"k", "v", "r", "rpos", "meta"};
    int ok = 1;
    for (int i = 0; i < 5; i++) {
        if (!nb[i]) continue;
        void *ha = malloc(nb[i]), *hb = malloc(nb[i]);
        CHECK_OK(gpu->ops->download(gpu->ctx, ha, pa[i], nb[i]));
        CHECK_OK(gpu->ops->download(gpu->ctx, hb, pb[i], nb[i]));
        int same = !memcmp(ha, hb, nb[i]);
        CHECK_MSG(same, "%s: %s bytes differ", what, names[i]);
        ok &= same;
        free(ha), free(hb);
    }
    printf("  %-44s GPU caches byte-identical: %s\n", what, ok ? "ok" : "FAIL");
}

/* Device outputs equal bit for bit (n floats). */
static void lte_same_bits(const char *what, const void *a, const void *b, size_t n) {
    float *ha = host_of(gpu, a, n), *hb = host_of(gpu, b, n);
    size_t d = 0;
    for (size_t i = 0; i < n; i++) d += memcmp(&ha[i], &hb[i], 4) != 0;
    CHECK_MSG(d == 0, "%s: %zu of %zu outputs differ", what, d, n);
    printf("  %-44s bit-identical on the GPU: %s\n", what, d == 0 ? "ok" : "FAIL");
    free(ha), free(hb);
}

/* p: {Hk, Hq, D, sink, window, budget, eager}. Besides the CPU comparison, a second GPU cache
 * takes the same tokens one lte_decode call each: its outputs and bytes must equal the prefill
 * pieces' (prefill == decode on the device), and a batched decode must equal the same session
 * decoded alone. */
static void case_lte(const op_case *c) {
    int Hk = c->p[0], Hq = c->p[1], D = c->p[2], s = c->p[3], w = c->p[4], b = c->p[5], eager = c->p[6];
    hyla_rng saved = rng;
    if (c->p[7]) hyla_rng_seed(&rng, (uint64_t)c->p[7]); /* inputs of its own; the shared stream restored at the end */
    lte_net net;
    lte_net_make(&net, Hk, D, s, w, b, eager);
    float scale = 1.0f / sqrtf((float)D);
    /* lte_score on its own: 40 rows from position -3 */
    {
        int T = 40, h = 6;
        size_t nx = (size_t)T * Hk * 2 * D, nr = (size_t)(T - 2 * h) * Hk;
        float *x = randn(nx, 1.0f);
        pair px = pair_new(x, nx), pr = pair_new(NULL, nr);
        CHECK_OK(cpu->ops->lte_score(cpu->ctx, &net.pc, px.c, T, -3, pr.c));
        PERF(CHECK_OK(gpu->ops->lte_score(gpu->ctx, &net.pg, px.g, T, -3, pr.g)));
        cmp_pair("lte_score (same bits expected)", pr, 1e-6, 1e-6);
        float *rc = host_of(cpu, pr.c, nr), *rg = host_of(gpu, pr.g, nr);
        CHECK_MSG(!memcmp(rc, rg, nr * 4), "lte_score: GPU scores are the CPU's bits");
        free(rc), free(rg), free(x);
        pair_free(px), pair_free(pr);
    }
    lte_cpair k = lte_cpair_new(&net.pc), k3 = lte_cpair_new(&net.pc); /* k3.g: decoded token by token */
    int pieces[2] = {3 * w + 17, w + 5}, steps = 2 * w + 9, pos = 0;
    for (int part = 0; part < 3; part++) {
        int n = part < 2 ? pieces[part] : 1, reps = part < 2 ? 1 : steps;
        for (int r = 0; r < reps; r++) {
            size_t nq = (size_t)n * Hq * D, nk = (size_t)n * Hk * D;
            float *q = randn(nq, 1.0f), *kk = randn(nk, 1.0f), *v = randn(nk, 1.0f);
            round_bf16(kk, nk);
            round_bf16(v, nk);
            pair pq = pair_new(q, nq), pk = pair_new(kk, nk), pv = pair_new(v, nk), po = pair_new(NULL, nq);
            char name[96];
            if (part < 2) {
                CHECK_OK(cpu->ops->lte_prefill(cpu->ctx, &net.pc, pq.c, pk.c, pv.c, n, Hq, pos, &k.c, scale, po.c));
                PERF(CHECK_OK(gpu->ops->lte_prefill(gpu->ctx, &net.pg, pq.g, pk.g, pv.g, n, Hq, pos, &k.g, scale, po.g)));
                snprintf(name, sizeof name, "lte prefill Hq=%d Hk=%d D=%d n=%d pos0=%d", Hq, Hk, D, n, pos);
            } else {
                int32_t p1[1] = {pos};
                CHECK_OK(cpu->ops->lte_decode(cpu->ctx, &net.pc, pq.c, pk.c, pv.c, 1, Hq, p1, &k.c, scale, po.c));
                PERF(CHECK_OK(gpu->ops->lte_decode(gpu->ctx, &net.pg, pq.g, pk.g, pv.g, 1, Hq, p1, &k.g, scale, po.g)));
                snprintf(name, sizeof name, "lte decode pos=%d", pos);
            }
            if (part < 2 || r % 8 == 0 || r == reps - 1) cmp_pair(name, po, ATTN_TOL);
            { /* the same tokens, one decode call each, on the second GPU cache */
                float *od = dev(gpu, NULL, nq * 4);
                for (int i = 0; i < n; i++) {
                    int32_t pi[1] = {pos + i};
                    CHECK_OK(gpu->ops->lte_decode(gpu->ctx, &net.pg, (float *)pq.g + (size_t)i * Hq * D,
                                                  (float *)pk.g + (size_t)i * Hk * D, (float *)pv.g + (size_t)i * Hk * D,
                                                  1, Hq, pi, &k3.g, scale, od + (size_t)i * Hq * D));
                }
                if (part < 2 || r % 8 == 0 || r == reps - 1) {
                    char nm2[128];
                    snprintf(nm2, sizeof nm2, "%s == decode steps", part < 2 ? "prefill piece" : "decode");
                    lte_same_bits(nm2, po.g, od, nq);
                }
                dfree(gpu, od);
            }
            pair_free(pq), pair_free(pk), pair_free(pv), pair_free(po);
            free(q), free(kk), free(v);
            pos += n;
        }
        char what[64];
        snprintf(what, sizeof what, "lte cache after %d tokens (%s)", pos, eager ? "eager" : "lazy");
        lte_cmp_cache(what, &net.pc, &k);
        lte_cmp_gpu("lte cache: pieces == decode steps", &net.pc, &k.g, &k3.g);
    }
    /* batched decode: two sessions (this cache and a fresh one) in one call */
    {
        lte_cpair k2 = lte_cpair_new(&net.pc);
        int B = 2;
        size_t nq = (size_t)B * Hq * D, nk = (size_t)B * Hk * D;
        float *q = randn(nq, 1.0f), *kk = randn(nk, 1.0f), *v = randn(nk, 1.0f);
        round_bf16(kk, nk);
        round_bf16(v, nk);
        pair pq = pair_new(q, nq), pk = pair_new(kk, nk), pv = pair_new(v, nk), po = pair_new(NULL, nq);
        int32_t pb[2] = {pos, 0};
        hyla_lte_cache cc[2] = {k.c, k2.c}, cg[2] = {k.g, k2.g};
        CHECK_OK(cpu->ops->lte_decode(cpu->ctx, &net.pc, pq.c, pk.c, pv.c, B, Hq, pb, cc, scale, po.c));
        PERF(CHECK_OK(gpu->ops->lte_decode(gpu->ctx, &net.pg, pq.g, pk.g, pv.g, B, Hq, pb, cg, scale, po.g)));
        cmp_pair("lte decode B=2 (positions differ)", po, ATTN_TOL);
        lte_cmp_cache("lte batched: session 0", &net.pc, &k);
        lte_cmp_cache("lte batched: session 1", &net.pc, &k2);
        /* session 0 decoded alone (on the second cache) gives the batched bits */
        float *od = dev(gpu, NULL, (size_t)Hq * D * 4);
        CHECK_OK(gpu->ops->lte_decode(gpu->ctx, &net.pg, pq.g, pk.g, pv.g, 1, Hq, pb, &k3.g, scale, od));
        lte_same_bits("lte decode: batched == alone", po.g, od, (size_t)Hq * D);
        lte_cmp_gpu("lte cache: batched == alone", &net.pc, &k.g, &k3.g);
        dfree(gpu, od);
        pair_free(pq), pair_free(pk), pair_free(pv), pair_free(po);
        free(q), free(kk), free(v);
        lte_cpair_free(&k2);
    }
    lte_cpair_free(&k);
    lte_cpair_free(&k3);
    lte_net_free(&net);
    if (c->p[7]) rng = saved;
}

/* NSA: prefill in two pieces and decode steps over a paged cache, against the CPU. q is drawn
 * with a spread so the compressed attention ranks blocks clearly. p: {Hq, Hk, D, block,
 * counts, window, page_tokens} */
static void case_nsa(const op_case *c) {
    int Hq = c->p[0], Hk = c->p[1], D = c->p[2], BS = c->p[3], counts = c->p[4], W = c->p[5], pt = c->p[6];
    float scale = 1.0f / sqrtf((float)D);
    int pieces[2] = {150, 77}, steps = 5, total = pieces[0] + pieces[1] + steps, pos = 0;
    kvpair kv = kv_new((total + pt - 1) / pt, pt, Hk, D);
    hyla_kv_view vc = kv_view(kv.kc, kv.vc, kv.n_pages, pt), vg = kv_view(kv.kg, kv.vg, kv.n_pages, pt);
    for (int part = 0; part < 2 + steps; part++) {
        int n = part < 2 ? pieces[part] : 1;
        size_t nq = (size_t)n * Hq * D, nk = (size_t)n * Hk * D, ng = (size_t)n * Hq * 3;
        float *q = randn(nq, 1.0f), *kk = randn(nk, 1.0f), *v = randn(nk, 1.0f), *g = randn(ng, 1.0f);
        round_bf16(kk, nk);
        round_bf16(v, nk);
        pair pq = pair_new(q, nq), pk = pair_new(kk, nk), pv = pair_new(v, nk), pg = pair_new(g, ng),
             po = pair_new(NULL, nq);
        char name[112];
        if (part < 2) {
            CHECK_OK(cpu->ops->nsa_prefill(cpu->ctx, pq.c, pk.c, pv.c, pg.c, n, Hq, Hk, D, pos, &vc, BS, counts, W, scale,
                                           po.c));
            PERF(CHECK_OK(gpu->ops->nsa_prefill(gpu->ctx, pq.g, pk.g, pv.g, pg.g, n, Hq, Hk, D, pos, &vg, BS, counts, W,
                                                scale, po.g)));
            snprintf(name, sizeof name, "nsa prefill Hq=%d Hk=%d D=%d bs=%d n=%d W=%d pos0=%d", Hq, Hk, D, BS, counts, W,
                     pos);
            /* the same piece again (it rewrites the same rows) gives the same bits: the block's
             * threads share the selection list, which thread 0 reorders after all have read it */
            pair again = pair_new(NULL, nq);
            int same = 1;
            for (int rep = 0; rep < 4 && same; rep++) {
                CHECK_OK(gpu->ops->nsa_prefill(gpu->ctx, pq.g, pk.g, pv.g, pg.g, n, Hq, Hk, D, pos, &vg, BS, counts, W,
                                               scale, again.g));
                same = same_bits(gpu, po.g, again.g, nq * 4);
            }
            CHECK_MSG(same, "%s: a repeat gives the same bits", name);
            pair_free(again);
        } else {
            int32_t p1[1] = {pos};
            CHECK_OK(cpu->ops->nsa_decode(cpu->ctx, pq.c, pk.c, pv.c, pg.c, 1, Hq, Hk, D, p1, &vc, BS, counts, W, scale,
                                          po.c));
            PERF(CHECK_OK(gpu->ops->nsa_decode(gpu->ctx, pq.g, pk.g, pv.g, pg.g, 1, Hq, Hk, D, p1, &vg, BS, counts, W,
                                               scale, po.g)));
            snprintf(name, sizeof name, "nsa decode pos=%d", pos);
        }
        cmp_pair(name, po, ATTN_TOL);
        pair_free(pq), pair_free(pk), pair_free(pv), pair_free(pg), pair_free(po);
        free(q), free(kk), free(v), free(g);
        pos += n;
    }
    kv_free(&kv);
}

/* ---------------------------------------------------------------- DLA */

/* A DLA cache on one backend: S [H][K][dk][dv], n [H][K], I [H][K], m [H] (zero: empty). */
typedef struct {
    hyla_dla_cache c;
    size_t nS;
} dla_dcache;
static dla_dcache dla_cache_new(hyla_backend *b, const hyla_dla_params *p) {
    dla_dcache d;
    d.nS = (size_t)p->H * p->K * p->dk * p->dv;
    d.c = (hyla_dla_cache){dev(b, NULL, d.nS * 4), dev(b, NULL, (size_t)p->H * p->K * 4),
                           dev(b, NULL, (size_t)p->H * p->K * 4), dev(b, NULL, (size_t)p->H * 4)};
    return d;
}
static void dla_cache_free(hyla_backend *b, dla_dcache *d) {
    dfree(b, d->c.S), dfree(b, d->c.n), dfree(b, d->c.I), dfree(b, d->c.m);
}
/* the GPU cache against the CPU's: the decisions (m, n) exactly, scores and states in tolerance */
static void dla_cmp_cache(const char *what, const hyla_dla_params *p, const dla_dcache *cc, const dla_dcache *cg) {
    size_t hk = (size_t)p->H * p->K;
    int32_t *mc = (int32_t *)host_of(cpu, cc->c.m, p->H), *mg = (int32_t *)host_of(gpu, cg->c.m, p->H);
    int32_t *nc = (int32_t *)host_of(cpu, cc->c.n, hk), *ng = (int32_t *)host_of(gpu, cg->c.n, hk);
    CHECK_MSG(!memcmp(mc, mg, (size_t)p->H * 4) && !memcmp(nc, ng, hk * 4),
              "%s: the GPU's boundaries and merges (states in use, counts) differ from the CPU's", what);
    int opened = 0;
    for (int h = 0; h < p->H; h++) opened += mc[h];
    CHECK_MSG(opened > p->H, "%s: %d states in %d heads, the case exercises too little", what, opened, p->H);
    char name[160];
    float *Ic = host_of(cpu, cc->c.I, hk), *Ig = host_of(gpu, cg->c.I, hk);
    snprintf(name, sizeof name, "%.100s: scores", what);
    cmp(name, Ig, Ic, hk, REC_TOL);
    float *Sc = host_of(cpu, cc->c.S, cc->nS), *Sg = host_of(gpu, cg->c.S, cg->nS);
    snprintf(name, sizeof name, "%.100s: states", what);
    cmp(name, Sg, Sc, cc->nS, REC_TOL);
    free(mc), free(mg), free(nc), free(ng), free(Ic), free(Ig), free(Sc), free(Sg);
}
static int dla_same_cache(const hyla_dla_params *p, const dla_dcache *a, const dla_dcache *b) {
    size_t hk = (size_t)p->H * p->K;
    return same_bits(gpu, a->c.S, b->c.S, a->nS * 4) && same_bits(gpu, a->c.n, b->c.n, hk * 4) &&
           same_bits(gpu, a->c.I, b->c.I, hk * 4) && same_bits(gpu, a->c.m, b->c.m, (size_t)p->H * 4);
}

/* dla_prefill and dla_decode against the CPU, and on the GPU prefill == pieces == decode loop
 * bit for bit, a decode batch == its sessions alone. Inputs in segments of near-identical (k, v)
 * per head, so tokens both merge into the newest state and open states (and full caches merge).
 * Tolerance REC_TOL: the kernel does the CPU's float operations per element in the same order;
 * only the score (double, another summation order, rounded to float once), expf and log1pf
 * differ, by ulps; decisions must be identical (random scores are not within ulps of tau).
 * p: {erase (1: GDN base, 0: Mamba2-like, erase NULL), H, dk, dv, K, n} */
static void case_dla(const op_case *c) {
    const int erase = c->p[0], H = c->p[1], dk = c->p[2], dv = c->p[3], K = c->p[4], n = c->p[5];
    hyla_dla_params p = {H, dk, dv, K, 0.6f};
    float scale = erase ? 1.0f / sqrtf((float)dk) : 1.0f;
    size_t nr = (size_t)n * H, nqk = nr * dk, nv = nr * dv;
    float *q = randn(nqk, 1.0f), *k = malloc(nqk * 4), *v = malloc(nv * 4), *lam = randn(nr * K, 1.0f);
    float *g = gdn_decays(nr), *w = randu(nr, 0.2f, 0.8f);
    for (int h = 0; h < H; h++) {
        float *bk = randn((size_t)dk, 1.0f), *bv = randn((size_t)dv, 1.0f);
        int left = 0;
        for (int t = 0; t < n; t++) {
            if (!left) {
                for (int i = 0; i < dk; i++) bk[i] = hyla_rng_normal(&rng);
                for (int j = 0; j < dv; j++) bv[j] = hyla_rng_normal(&rng);
                left = 1 + (int)(hyla_rng_uniform(&rng) * 6);
            }
            left--;
            size_t r = (size_t)t * H + h;
            for (int i = 0; i < dk; i++) k[r * dk + i] = bk[i] + 0.05f * hyla_rng_normal(&rng);
            for (int j = 0; j < dv; j++) v[r * dv + j] = bv[j] + 0.05f * hyla_rng_normal(&rng);
        }
        free(bk), free(bv);
    }
    l2rows(q, nr, dk);
    l2rows(k, nr, dk);
    pair pq = pair_new(q, nqk), pk = pair_new(k, nqk), pv = pair_new(v, nv), pg = pair_new(g, nr), pw = pair_new(w, nr),
         pl = pair_new(lam, nr * K), po = pair_new(NULL, nv);
    const float *ec = erase ? pw.c : NULL, *eg = erase ? pw.g : NULL;
    dla_dcache cc = dla_cache_new(cpu, &p), cg = dla_cache_new(gpu, &p);
    CHECK_OK(cpu->ops->dla_prefill(cpu->ctx, &p, pq.c, pk.c, pv.c, pg.c, ec, pw.c, pl.c, n, scale, &cc.c, po.c));
    PERF(CHECK_OK(gpu->ops->dla_prefill(gpu->ctx, &p, pq.g, pk.g, pv.g, pg.g, eg, pw.g, pl.g, n, scale, &cg.c, po.g)));
    char name[112];
    snprintf(name, sizeof name, "dla_prefill %s H=%d dk=%d dv=%d K=%d n=%d: o", erase ? "gdn" : "mamba2", H, dk, dv, K,
             n);
    cmp_pair(name, po, REC_TOL);
    snprintf(name, sizeof name, "dla_prefill %s dk=%d dv=%d", erase ? "gdn" : "mamba2", dk, dv);
    dla_cmp_cache(name, &p, &cc, &cg);
    /* on the GPU: pieces of 7 and a decode loop give the one call's bits */
    for (int mode = 0; mode < 2; mode++) {
        dla_dcache c2 = dla_cache_new(gpu, &p);
        void *o2 = dev(gpu, NULL, nv * 4);
        int piece = mode ? 1 : 7;
        for (int t0 = 0; t0 < n; t0 += piece) {
            int m = n - t0 < piece ? n - t0 : piece;
            size_t r = (size_t)t0 * H;
            const float *qq = (const float *)pq.g + r * dk, *kk = (const float *)pk.g + r * dk;
            const float *vv = (const float *)pv.g + r * dv, *gg = (const float *)pg.g + r;
            const float *ww = (const float *)pw.g + r, *ll = (const float *)pl.g + r * K;
            float *oo = (float *)o2 + r * dv;
            if (mode)
                CHECK_OK(gpu->ops->dla_decode(gpu->ctx, &p, qq, kk, vv, gg, erase ? ww : NULL, ww, ll, 1, scale, &c2.c, oo));
            else
                CHECK_OK(gpu->ops->dla_prefill(gpu->ctx, &p, qq, kk, vv, gg, erase ? ww : NULL, ww, ll, m, scale, &c2.c, oo));
        }
        CHECK_MSG(same_bits(gpu, po.g, o2, nv * 4) && dla_same_cache(&p, &cg, &c2),
                  "dla %s dk=%d dv=%d: %s on the GPU differs from one prefill", erase ? "gdn" : "mamba2", dk, dv,
                  mode ? "the decode loop" : "pieces of 7");
        dla_cache_free(gpu, &c2);
        dfree(gpu, o2);
    }
    /* a decode batch of 2 sessions (the prefilled cache and a fresh one) == each alone, and == the CPU */
    {
        dla_dcache f = dla_cache_new(gpu, &p), f1 = dla_cache_new(gpu, &p), c1 = dla_cache_new(gpu, &p), fc = dla_cache_new(cpu, &p);
        CHECK_OK(gpu->ops->copy(gpu->ctx, c1.c.S, cg.c.S, cg.nS * 4));
        CHECK_OK(gpu->ops->copy(gpu->ctx, c1.c.n, cg.c.n, (size_t)H * K * 4));
        CHECK_OK(gpu->ops->copy(gpu->ctx, c1.c.I, cg.c.I, (size_t)H * K * 4));
        CHECK_OK(gpu->ops->copy(gpu->ctx, c1.c.m, cg.c.m, (size_t)H * 4));
        hyla_dla_cache bg[2] = {cg.c, f.c}, bc[2] = {cc.c, fc.c};
        size_t r2 = (size_t)2 * H;
        void *oa = dev(gpu, NULL, r2 * dv * 4);
        pair pob = pair_new(NULL, r2 * dv);
        const float *ew = erase ? (const float *)pw.g : NULL;
        PERF(CHECK_OK(gpu->ops->dla_decode(gpu->ctx, &p, pq.g, pk.g, pv.g, pg.g, ew, pw.g, pl.g, 2, scale, bg, pob.g)));
        CHECK_OK(cpu->ops->dla_decode(cpu->ctx, &p, pq.c, pk.c, pv.c, pg.c, ec, pw.c, pl.c, 2, scale, bc, pob.c));
        snprintf(name, sizeof name, "dla_decode %s B=2: o", erase ? "gdn" : "mamba2");
        cmp_pair(name, pob, REC_TOL);
        for (int b = 0; b < 2; b++) {
            size_t r = (size_t)b * H;
            CHECK_OK(gpu->ops->dla_decode(gpu->ctx, &p, (const float *)pq.g + r * dk, (const float *)pk.g + r * dk,
                                          (const float *)pv.g + r * dv, (const float *)pg.g + r,
                                          erase ? (const float *)pw.g + r : NULL, (const float *)pw.g + r,
                                          (const float *)pl.g + r * K, 1, scale, b ? &f1.c : &c1.c,
                                          (float *)oa + r * dv));
        }
        CHECK_MSG(same_bits(gpu, pob.g, oa, r2 * dv * 4) && dla_same_cache(&p, &cg, &c1) && dla_same_cache(&p, &f, &f1),
                  "dla_decode %s: a batch of 2 on the GPU differs from its sessions alone", erase ? "gdn" : "mamba2");
        dla_cache_free(gpu, &f), dla_cache_free(gpu, &f1), dla_cache_free(gpu, &c1), dla_cache_free(cpu, &fc);
        dfree(gpu, oa);
        pair_free(pob);
    }
    dla_cache_free(cpu, &cc), dla_cache_free(gpu, &cg);
    pair_free(pq), pair_free(pk), pair_free(pv), pair_free(pg), pair_free(pw), pair_free(pl), pair_free(po);
    free(q), free(k), free(v), free(lam), free(g), free(w);
}

/* ssd_gates and ssd_skip (the Mamba2 base of DLA) against the CPU. p: {n, H, P, limit} */
static void case_ssd_gates_skip(const op_case *c) {
    const int n = c->p[0], H = c->p[1], P = c->p[2], lim = c->p[3], ld_dt = H + 3, ldx = H * P + 5;
    float lo = lim ? 0.01f : 0.0f, hi = lim ? 0.5f : INFINITY;
    float *dt = randn((size_t)n * ld_dt, 2.0f), *bias = randn((size_t)H, 1.0f), *alog = randu((size_t)H, -1.0f, 1.5f);
    float *x = randn((size_t)n * ldx, 1.0f), *y = randn((size_t)n * H * P, 1.0f), *Dsk = randn((size_t)H, 1.0f);
    pair pdt = pair_new(dt, (size_t)n * ld_dt), pb = pair_new(bias, H), pal = pair_new(alog, H),
         pa = pair_new(NULL, (size_t)n * H), pd = pair_new(NULL, (size_t)n * H), px = pair_new(x, (size_t)n * ldx),
         py = pair_new(y, (size_t)n * H * P), pD = pair_new(Dsk, H);
    CHECK_OK(cpu->ops->ssd_gates(cpu->ctx, pdt.c, ld_dt, pb.c, pal.c, lo, hi, n, H, pa.c, pd.c));
    PERF(CHECK_OK(gpu->ops->ssd_gates(gpu->ctx, pdt.g, ld_dt, pb.g, pal.g, lo, hi, n, H, pa.g, pd.g)));
    cmp_pair(lim ? "ssd_gates (limits): a" : "ssd_gates: a", pa, FP32_TOL);
    cmp_pair(lim ? "ssd_gates (limits): dt'" : "ssd_gates: dt'", pd, FP32_TOL);
    CHECK_OK(cpu->ops->ssd_skip(cpu->ctx, py.c, px.c, ldx, pD.c, n, H, P));
    PERF(CHECK_OK(gpu->ops->ssd_skip(gpu->ctx, py.g, px.g, ldx, pD.g, n, H, P)));
    cmp_pair("ssd_skip", py, FP32_TOL);
    CHECK(gpu->ops->ssd_gates(gpu->ctx, pdt.g, H - 1, pb.g, pal.g, lo, hi, n, H, pa.g, pd.g) == HYLA_ERR_INVALID_ARG);
    pair_free(pdt), pair_free(pb), pair_free(pal), pair_free(pa), pair_free(pd), pair_free(px), pair_free(py),
        pair_free(pD);
    free(dt), free(bias), free(alog), free(x), free(y), free(Dsk);
}

/* The case table: one row per op case, run on every device backend against the CPU. */
static const op_case cases[] = {
    {"memory, pool, snapshots", case_memory, {0}},
    {"embed, linear", case_embed_linear, {0}},
    {"linear_multi", case_linear_multi, {0}},
    {"linear switches", case_switches, {0}},
    {"row ops", case_rowops, {0}},
    /* {n, D, row offset} */
    {"rmsnorm_bf16", case_rmsnorm_bf16, {2500, 2304, 0}},
    {"rmsnorm_bf16", case_rmsnorm_bf16, {2048, 2304, 64}},
    {"rmsnorm_bf16", case_rmsnorm_bf16, {1100, 2112, 1}},
    {"rmsnorm_bf16", case_rmsnorm_bf16, {300, 128, 0}},
    {"rmsnorm_bf16", case_rmsnorm_bf16, {40, 102, 3}},
    {"decode_bf16", case_decode_bf16, {16, 2304}},
    {"decode_bf16", case_decode_bf16, {33, 2304}},
    {"decode_bf16", case_decode_bf16, {64, 2304}},
    {"decode_bf16", case_decode_bf16, {65, 2304}},
    {"decode_bf16", case_decode_bf16, {200, 6144}},
    {"decode_bf16", case_decode_bf16, {256, 128}},
    {"decode_bf16", case_decode_bf16, {40, 100}},
    /* {M, N} */
    {"linear bf16 outputs", case_linear_y_bf16, {2500, 6144}},
    {"linear bf16 outputs", case_linear_y_bf16, {3072, 640}},
    {"linear bf16 outputs", case_linear_y_bf16, {300, 2304}},
    {"row-op layouts", case_rowop_layouts, {0}},
    {"short_conv", case_short_conv, {0}},
    {"short_conv_multi", case_short_conv_multi, {0}},
    {"swiglu_linear", case_swiglu_linear, {0}},
    {"gated_rmsnorm_linear", case_gated_rmsnorm_linear, {0}},
    /* {gdn, n, H, dk, dv} */
    {"gla_prefill", case_lin_prefill, {0, 1, 2, 16, 32}},
    {"gla_prefill", case_lin_prefill, {0, 200, 2, 64, 48}},
    {"gla_prefill", case_lin_prefill, {0, 130, 4, 128, 128}},
    {"gla_prefill", case_lin_prefill, {0, 64, 3, 32, 16}},
    {"gla_prefill", case_lin_prefill, {0, 90, 2, 256, 64}},
    {"gla_prefill", case_lin_prefill, {0, 40, 1, 16, 1025}},
    {"gla_prefill", case_lin_prefill, {0, 40, 1, 160, 1025}},
    /* the split form (more than 4 chunks, few blocks): its chunk kernel, a partial last chunk,
     * keys short of the padding (dk 100 of 128; dk 62 of 64, not 16-byte rows); the 64-token
     * pieces run the fused pass, so their bits hold the split form to it */
    {"gla_prefill", case_lin_prefill, {0, 300, 4, 128, 128}},
    {"gla_prefill", case_lin_prefill, {0, 300, 2, 100, 72}},
    {"gla_prefill", case_lin_prefill, {0, 330, 2, 62, 40}},
    /* StateX's merged GLA heads: key slabs (dk 1024 = 8 x 128, 512 = 4 x 128, 384 = 3 x 128) */
    {"gla_prefill", case_lin_prefill, {0, 130, 1, 1024, 2048}},
    {"gla_prefill", case_lin_prefill, {0, 100, 1, 512, 1024}},
    {"gla_prefill", case_lin_prefill, {0, 70, 2, 384, 96}},
    {"gdn_prefill", case_lin_prefill, {1, 1, 2, 16, 32}},
    {"gdn_prefill", case_lin_prefill, {1, 200, 2, 64, 48}},
    {"gdn_prefill", case_lin_prefill, {1, 300, 4, 128, 128}},
    {"gdn_prefill", case_lin_prefill, {1, 65, 2, 256, 96}},
    {"gdn_prefill", case_lin_prefill, {1, 70, 2, 8, 8}},
    {"gdn_prefill", case_lin_prefill, {1, 70, 1, 16, 1056}},
    {"gdn_prefill", case_lin_prefill, {1, 70, 1, 256, 1056}},
    /* {gdn, n, H, dk, dv}: one or two long sequences (kernel B's forms) */
    {"chunked switches", case_chunk_switches, {1, 300, 4, 128, 128}},
    {"chunked switches", case_chunk_switches, {0, 300, 4, 128, 128}},
    {"chunked switches", case_chunk_switches, {1, 1100, 2, 128, 256}},
    {"chunked switches", case_chunk_switches, {1, 330, 2, 128, 72}},
    {"chunked switches", case_chunk_switches, {0, 330, 2, 100, 72}},
    {"chunked switches", case_chunk_switches, {1, 330, 2, 128, 70}}, /* dv % 4: kernel B's cp.async form */
    /* {gdn, n, H, dk, dv, 1}: GLA's chunk kernel against kernel A */
    {"chunked switches", case_chunk_switches, {0, 300, 4, 128, 128, 1}},
    {"chunked switches", case_chunk_switches, {0, 330, 2, 62, 40, 1}},
    /* {gdn, B, H, dk, dv} */
    {"gla_decode", case_lin_decode, {0, 5, 4, 64, 128}},
    {"gla_decode", case_lin_decode, {0, 3, 1, 1024, 2048}},
    {"gla_decode", case_lin_decode, {0, 4, 1, 512, 1024}},
    {"gla_decode", case_lin_decode, {0, 2, 2, 384, 96}},
    /* 128 < dk <= 256: decode takes the key slabs (k_lin_dec holds at most 128 key rows) */
    {"gla_decode", case_lin_decode, {0, 3, 4, 256, 512}},
    {"gla_decode", case_lin_decode, {0, 2, 2, 160, 48}},
    {"gdn_decode", case_lin_decode, {1, 5, 4, 128, 128}},
    {"gdn_decode", case_lin_decode, {1, 3, 2, 64, 30}},
    /* {rows, cols, q_softmax, k_softmax, l2, gates (2: no clamp), off, lora} */
    {"sse_maps", case_sse_maps, {18, 128, 0, 1, 0, 1, 0}},          /* SSE-GLA, one decode row */
    {"sse_maps", case_sse_maps, {256 * 18, 128, 0, 1, 0, 1, 0}},    /* 256 decode rows */
    {"sse_maps", case_sse_maps, {4096 * 9, 128, 1, 0, 1, 0, 0}},    /* prompt rows: the ops inside */
    {"sse_maps", case_sse_maps, {256 * 9, 128, 1, 0, 1, 0, 0}},     /* SSE-GDN decode rows */
    {"sse_maps", case_sse_maps, {77, 64, 1, 1, 1, 2, 1}},           /* unaligned */
    {"sse_maps", case_sse_maps, {18, 128, 0, 1, 0, 1, 0, 1}},       /* the LoRA terms added inside */
    {"sse_maps", case_sse_maps, {18, 128, 0, 1, 0, 3, 0, 1}},       /* SSE-GLA decode: the gates' biases inside */
    {"sse_maps", case_sse_maps, {4096 * 18, 128, 0, 1, 0, 3, 0, 1}}, /* a 4096-token piece, biases inside */
    {"sse_maps", case_sse_maps, {77, 64, 1, 1, 1, 3, 1, 0}},        /* biases, unaligned: one float a thread */
    {"sse_maps", case_sse_maps, {20000, 128, 1, 0, 1, 3, 0, 0}},    /* biases in the ops one by one (2^23+) */
    {"sse_maps", case_sse_maps, {256 * 18, 128, 0, 1, 0, 1, 0, 1}},
    {"sse_maps", case_sse_maps, {4096 * 9, 128, 1, 0, 1, 0, 0, 1}}, /* prompt rows: one launch with lora */
    {"sse_maps", case_sse_maps, {77, 64, 1, 1, 1, 2, 1, 1}},
    {"sse_maps", case_sse_maps, {33, 66, 1, 0, 1, 1, 0, 1}},        /* cols % 4 != 0: the ops inside */
    {"sse_maps", case_sse_maps, {33, 512, 0, 1, 1, 1, 0}},          /* the widest warp rows */
    {"sse_maps", case_sse_maps, {9, 1024, 0, 1, 1, 1, 0}},          /* block rows: the ops inside */
    {"sse_maps", case_sse_maps, {13, 30, 1, 1, 0, 1, 0}},           /* cols % 4: the ops inside */
    {"gdn_decode_raw", case_gdn_decode_raw, {1, 18, 128, 256}},
    {"gdn_decode_raw", case_gdn_decode_raw, {32, 9, 128, 256}},
    {"gdn_decode_raw", case_gdn_decode_raw, {64, 9, 128, 256}},
    {"gdn_decode_raw", case_gdn_decode_raw, {5, 4, 64, 128}},
    {"gdn_decode_raw", case_gdn_decode_raw, {3, 2, 30, 40}},
    /* {gdn} */
    {"prefill varlen", case_varlen, {0}},
    {"prefill varlen", case_varlen, {1}},
    /* {gdn, dk, dv, H}: GLA key slabs (StateX) */
    {"prefill varlen", case_varlen, {0, 512, 1024, 1}},
    {"prefill varlen", case_varlen, {0, 384, 96, 2}},
    /* {transition, K} */
    {"sse_route, sse_prefill, sse_decode", case_sse, {HYLA_SSE_GLA, 1}},
    {"sse_route, sse_prefill, sse_decode", case_sse, {HYLA_SSE_GLA, 2}},
    {"sse_route, sse_prefill, sse_decode", case_sse, {HYLA_SSE_GDN, 1}},
    {"sse_route, sse_prefill, sse_decode", case_sse, {HYLA_SSE_GDN, 2}},
    /* {transition} */
    {"sse_prefill plans", case_sse_plan, {HYLA_SSE_GLA}},
    {"sse_prefill plans", case_sse_plan, {HYLA_SSE_GDN}},
    {"attn_prefill, attn_decode", case_attention, {0}},
    /* {D} */
    {"attn_prefill pieces", case_attn_pieces, {32}},
    {"attn_prefill pieces", case_attn_pieces, {64}},
    {"attn_prefill pieces", case_attn_pieces, {128}},
    {"sample", case_sample, {0}},
    /* {Hk, Hq, D, sink, window, budget, eager[, seed]} */
    {"lte_score, lte_prefill, lte_decode", case_lte, {2, 4, 64, 4, 32, 16, 0}},
    {"lte_score, lte_prefill, lte_decode", case_lte, {2, 4, 64, 4, 32, 16, 1}},
    {"lte_score, lte_prefill, lte_decode", case_lte, {1, 3, 128, 2, 48, 0, 0}},
    {"lte_score, lte_prefill, lte_decode", case_lte, {4, 8, 32, 0, 20, 64, 0}},
    /* the paper's 1.4B layer (s 4, w 768, b 512; GQA 32/8, head dim 64): prefill pieces of
     * 2321 and 773 tokens (the first spans three internal steps of the CUDA kernels) */
    {"lte_score, lte_prefill, lte_decode", case_lte, {8, 32, 64, 4, 768, 512, 0}},
    /* the same on inputs of their own (p[7]: the seed): the CPU's and the GPU's scores must agree
     * on any input, not on the shared stream's alone (both un-rotate the keys with
     * hyla_detmath.h's RoPE) */
    {"lte_score, lte_prefill, lte_decode", case_lte, {8, 32, 64, 4, 768, 512, 0, 101}},
    {"lte_score, lte_prefill, lte_decode", case_lte, {8, 32, 64, 4, 768, 512, 0, 202}},
    /* {Hq, Hk, D, block, counts, window, page_tokens} */
    {"nsa_prefill, nsa_decode", case_nsa, {4, 2, 64, 16, 4, 32, 64}},
    {"nsa_prefill, nsa_decode", case_nsa, {8, 1, 128, 32, 3, 0, 16}},
    {"nsa_prefill, nsa_decode", case_nsa, {2, 2, 32, 8, 16, 100, 64}},
    /* FLA's group of 16 (the checkpoint of nsa_fla_check.py), the paper's 32/2 shape */
    {"nsa_prefill, nsa_decode", case_nsa, {16, 1, 32, 16, 4, 32, 64}},
    {"nsa_prefill, nsa_decode", case_nsa, {32, 2, 64, 64, 16, 512, 64}},
    /* branches longer than one 128-row tile: 232 compressed rows (blocks of 1), 256 selected
     * keys, a 300-key window */
    {"nsa_prefill, nsa_decode", case_nsa, {2, 1, 16, 1, 8, 200, 64}},
    {"nsa_prefill, nsa_decode", case_nsa, {4, 1, 32, 4, 64, 300, 64}},
    /* a group of 32: the CUDA-core form of the selected and window branches */
    {"nsa_prefill, nsa_decode", case_nsa, {32, 1, 32, 8, 4, 40, 64}},
    /* {erase, H, dk, dv, K, n} */
    {"dla_prefill, dla_decode", case_dla, {1, 2, 16, 32, 4, 80}},
    {"dla_prefill, dla_decode", case_dla, {1, 3, 64, 128, 8, 120}},
    {"dla_prefill, dla_decode", case_dla, {0, 2, 32, 48, 4, 90}},
    {"dla_prefill, dla_decode", case_dla, {1, 1, 128, 300, 3, 40}},
    /* {n, H, P, limit} */
    {"ssd_gates, ssd_skip", case_ssd_gates_skip, {70, 4, 32, 0}},
    {"ssd_gates, ssd_skip", case_ssd_gates_skip, {5, 6, 64, 1}},
    /* last, so that the cases above keep the inputs they have had */
    {"attn_prefill pieces", case_attn_pieces, {256}},
};

/* The backends under test: every device backend built in (today the CUDA backend). */
static const struct {
    const char *name;
    int (*available)(void);
    hyla_status (*create)(int device, hyla_backend **out);
} backends[] = {{"cuda:0", hyla_cuda_available, hyla_cuda_backend_create}};

int main(int argc, char **argv) {
    const char *filter = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--perf"))
            perf_mode = 1;
        else if (argv[i][0] != '-')
            filter = argv[i];
        else {
            fprintf(stderr, "usage: test_gpu_ops [--perf] [OP-SUBSTRING]\n");
            return 2;
        }
    }
    if (hyla_cpu_backend_create(0, &cpu) != HYLA_OK) {
        fprintf(stderr, "test_gpu_ops: CPU backend creation failed: %s\n", hyla_last_error());
        return 1;
    }
    int tested = 0;
    for (size_t bi = 0; bi < sizeof backends / sizeof backends[0]; bi++) {
        if (!backends[bi].available()) {
            printf("test_gpu_ops: %s: SKIPPED — no usable device (or its backend is not built)\n", backends[bi].name);
            continue;
        }
        if (backends[bi].create(0, &gpu) != HYLA_OK) {
            fprintf(stderr, "test_gpu_ops: %s: backend creation failed: %s\n", backends[bi].name, hyla_last_error());
            return 1;
        }
        tested++;
        hyla_rng_seed(&rng, 20261122);
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
            const op_case *c = &cases[ci];
            if (filter && !strstr(c->op, filter)) continue;
            printf("%s: %s {%d, %d, %d, %d, %d, %d, %d}\n", backends[bi].name, c->op, c->p[0], c->p[1], c->p[2],
                   c->p[3], c->p[4], c->p[5], c->p[6]);
            perf_ms = 0;
            perf_calls = 0;
            c->run(c);
            CHECK_OK(gpu->ops->sync(gpu->ctx));
            if (perf_mode && perf_calls)
                printf("PERF %s %-36s {%d, %d, %d, %d, %d}  %9.4f ms per call (%d calls)\n", backends[bi].name, c->op,
                       c->p[0], c->p[1], c->p[2], c->p[3], c->p[4], perf_ms / perf_calls, perf_calls);
        }
        hyla_backend_destroy(gpu);
        gpu = NULL;
    }
    hyla_backend_destroy(cpu);
    if (!tested) return 77;
    printf("test_gpu_ops: %d comparisons, %d out of tolerance\n", n_cmp, n_cmp_fail);
    return hyla_test_done("test_gpu_ops");
}
