/* test_cpu_nsa.c — native sparse attention on the CPU reference backend (kernels/cpu/cpu_nsa.c):
 *   - nsa_prefill against a double-precision reference of the three branches written from the
 *     spec (docs/MODELS.md §5.2: mean-pooled compressed blocks visible once complete, the group's
 *     block selection with the first, current and previous blocks forced, the window, sigmoid
 *     gates), GQA 4:2, blocks of 4, 4 selected, a window of 6, over 60 tokens;
 *   - prefill == decode loop == pieces of 7 tokens, bit for bit, with and without the derived
 *     cache of compressed blocks (c_pages); a decode batch == each session alone; errors;
 *   - with the cache, a decode step reads only the compressed rows, the selected blocks and the
 *     window: KV rows outside them set to NaN leave its output unchanged, bit for bit.
 * Tolerances: fp32 against double over sums of <= 60 terms of O(1) values: ATOL 2e-5 + RTOL 1e-4
 * (a wrong block, mask or gate moves outputs by >= 1e-2). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_ops.h"
#include "hyla_test.h"

#define ATOL 2e-5
#define RTOL 1e-4

enum { HQ = 4, HK = 2, G = HQ / HK, D = 8, BS = 4, CNT = 4, WIN = 6, T = 60, PT = 16, NP = 4 };

static hyla_backend *be;
static const hyla_ops *ops;
static void *ctx;
static hyla_rng rng;

static float *randn(size_t n, float scale) {
    float *x = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = scale * hyla_rng_normal(&rng);
    return x;
}

typedef struct {
    void *k[NP], *v[NP], *c[1]; /* c: the compressed blocks, T / BS < PT rows of [2][HK][D] */
    hyla_kv_view view;
} cache;

/* with_cmp: with the derived cache of compressed blocks (as the nsa mixer passes it) */
static void cache_make_cmp(cache *c, int with_cmp) {
    for (int i = 0; i < NP; i++) {
        CHECK_OK(ops->alloc(ctx, (size_t)PT * HK * D * sizeof(float), &c->k[i]));
        CHECK_OK(ops->alloc(ctx, (size_t)PT * HK * D * sizeof(float), &c->v[i]));
    }
    c->c[0] = NULL;
    if (with_cmp) CHECK_OK(ops->alloc(ctx, (size_t)PT * 2 * HK * D * sizeof(float), &c->c[0]));
    c->view = (hyla_kv_view){.k_pages = c->k, .v_pages = c->v, .n_pages = NP, .page_tokens = PT,
                             .c_pages = with_cmp ? c->c : NULL, .c_n_pages = with_cmp, .c_valid = 0};
}
static void cache_make(cache *c) { cache_make_cmp(c, 0); }
static void cache_free(cache *c) {
    for (int i = 0; i < NP; i++) ops->free(ctx, c->k[i]), ops->free(ctx, c->v[i]);
    ops->free(ctx, c->c[0]);
}

/* softmax attention of q over keys at pos[0..n): o (double) */
static void att_d(const float *q, const float *k, const float *v, int h, const int *pos, int n, double *o) {
    double sc[T], m = -INFINITY, sum = 0;
    for (int x = 0; x < D; x++) o[x] = 0;
    if (!n) return;
    for (int i = 0; i < n; i++) {
        double d = 0;
        for (int x = 0; x < D; x++) d += (double)q[x] * k[((size_t)pos[i] * HK + h) * D + x];
        sc[i] = d / sqrt((double)D);
        if (sc[i] > m) m = sc[i];
    }
    for (int i = 0; i < n; i++) {
        double e = exp(sc[i] - m);
        sum += e;
        for (int x = 0; x < D; x++) o[x] += e * v[((size_t)pos[i] * HK + h) * D + x];
    }
    for (int x = 0; x < D; x++) o[x] /= sum;
}

static double sig(double x) { return 1.0 / (1.0 + exp(-x)); }

/* The reference: o [T][HQ][D] in double; *nonforced counts selections of unforced blocks. */
static void nsa_ref(const float *q, const float *k, const float *v, const float *g, double *o, int *nonforced) {
    *nonforced = 0;
    for (int p = 0; p < T; p++)
        for (int h = 0; h < HK; h++) {
            int nc = (p + 1) / BS, cur = p / BS, nb = cur + 1;
            double kc[T / BS + 1][D], vc[T / BS + 1][D], score[T / BS + 1] = {0}, ocmp[G][D];
            for (int c = 0; c < nc; c++)
                for (int x = 0; x < D; x++) {
                    double a = 0, b = 0;
                    for (int j = c * BS; j < (c + 1) * BS; j++)
                        a += k[((size_t)j * HK + h) * D + x], b += v[((size_t)j * HK + h) * D + x];
                    kc[c][x] = a / BS, vc[c][x] = b / BS;
                }
            for (int i = 0; i < G; i++) {
                const float *qi = q + ((size_t)p * HQ + h * G + i) * D;
                double s[T / BS + 1], m = -INFINITY, sum = 0;
                for (int x = 0; x < D; x++) ocmp[i][x] = 0;
                for (int c = 0; c < nc; c++) {
                    s[c] = 0;
                    for (int x = 0; x < D; x++) s[c] += (double)qi[x] * kc[c][x];
                    s[c] /= sqrt((double)D);
                    if (s[c] > m) m = s[c];
                }
                for (int c = 0; c < nc; c++) sum += exp(s[c] - m);
                for (int c = 0; c < nc; c++) {
                    double pr = exp(s[c] - m) / sum;
                    score[c] += pr / G;
                    for (int x = 0; x < D; x++) ocmp[i][x] += pr * vc[c][x];
                }
            }
            int forced[T / BS + 1] = {0}, chosen[T / BS + 1] = {0}, pos[T], np = 0;
            for (int c = 0; c < nb; c++)
                if (c == 0 || c == cur || c == cur - 1) forced[c] = 1, score[c] = 1.0;
            for (int r = 0; r < CNT && r < nb; r++) {
                int best = -1;
                for (int c = 0; c < nb; c++)
                    if (!chosen[c] && (best < 0 || score[c] > score[best])) best = c;
                chosen[best] = 1;
                *nonforced += !forced[best];
                for (int t = best * BS; t < (best + 1) * BS && t <= p; t++) pos[np++] = t;
            }
            int wp[WIN], nw = 0;
            for (int t = p - WIN + 1 > 0 ? p - WIN + 1 : 0; t <= p; t++) wp[nw++] = t;
            for (int i = 0; i < G; i++) {
                int hq = h * G + i;
                const float *qi = q + ((size_t)p * HQ + hq) * D, *gi = g + ((size_t)p * HQ + hq) * 3;
                double os[D], ow[D];
                att_d(qi, k, v, h, pos, np, os);
                att_d(qi, k, v, h, wp, nw, ow);
                for (int x = 0; x < D; x++)
                    o[((size_t)p * HQ + hq) * D + x] = sig(gi[1]) * os[x] + sig(gi[0]) * ocmp[i][x] + sig(gi[2]) * ow[x];
            }
        }
}

static void run(const float *q, const float *k, const float *v, const float *g, int piece, int decode, cache *c,
                float *o) {
    float scale = 1.0f / sqrtf((float)D);
    for (int t0 = 0; t0 < T; t0 += piece) {
        int m = T - t0 < piece ? T - t0 : piece;
        size_t qo = (size_t)t0 * HQ * D, ko = (size_t)t0 * HK * D, go = (size_t)t0 * HQ * 3;
        if (decode) {
            int32_t pos = t0;
            CHECK_OK(ops->nsa_decode(ctx, q + qo, k + ko, v + ko, g + go, 1, HQ, HK, D, &pos, &c->view, BS, CNT, WIN,
                                     scale, o + qo));
        } else {
            CHECK_OK(ops->nsa_prefill(ctx, q + qo, k + ko, v + ko, g + go, m, HQ, HK, D, t0, &c->view, BS, CNT, WIN,
                                      scale, o + qo));
        }
        if (c->view.c_pages) c->view.c_valid = (t0 + (decode ? 1 : m)) / BS; /* as the mixer keeps it */
    }
}

/* A decode step at position p with 3 blocks selected (the forced ones: first, previous, current)
 * reads the compressed rows, those blocks and the window; every other KV row of the cache set to
 * NaN leaves its output unchanged, bit for bit. */
static void check_decode_reads(const float *q, const float *k, const float *v, const float *g) {
    enum { P = 50, CUR = P / BS };
    cache a, b;
    float tmp[T * HQ * D], oa[HQ * D], ob[HQ * D];
    cache *cs[2] = {&a, &b};
    for (int i = 0; i < 2; i++) {
        cache_make_cmp(cs[i], 1);
        CHECK_OK(ops->nsa_prefill(ctx, q, k, v, g, P, HQ, HK, D, 0, &cs[i]->view, BS, 3, WIN, 0.35f, tmp));
        cs[i]->view.c_valid = P / BS;
    }
    int poisoned = 0;
    for (int t = 0; t < P; t++) {
        int blk = t / BS;
        if (blk == 0 || blk >= CUR - 1 || t > P - WIN) continue;
        for (int e = 0; e < HK * D; e++) {
            ((float *)b.k[t / PT])[(t % PT) * HK * D + e] = NAN;
            ((float *)b.v[t / PT])[(t % PT) * HK * D + e] = NAN;
        }
        poisoned++;
    }
    CHECK_MSG(poisoned >= 30, "nsa: only %d rows poisoned", poisoned);
    int32_t p = P;
    for (int i = 0; i < 2; i++)
        CHECK_OK(ops->nsa_decode(ctx, q + (size_t)P * HQ * D, k + (size_t)P * HK * D, v + (size_t)P * HK * D,
                                 g + (size_t)P * HQ * 3, 1, HQ, HK, D, &p, &cs[i]->view, BS, 3, WIN, 0.35f,
                                 i ? ob : oa));
    int finite = 1;
    for (int x = 0; x < HQ * D; x++) finite &= isfinite(oa[x]) != 0;
    CHECK_MSG(finite && !memcmp(oa, ob, sizeof oa),
              "nsa_decode with the compressed cache read KV rows outside the selected blocks and the window");
    cache_free(&a);
    cache_free(&b);
}

int main(void) {
    hyla_rng_seed(&rng, 99);
    CHECK_OK(hyla_cpu_backend_create(2, &be));
    if (!be) return hyla_test_done("test_cpu_nsa");
    ops = be->ops;
    ctx = be->ctx;
    float *q = randn((size_t)T * HQ * D, 1.5f), *k = randn((size_t)T * HK * D, 1.5f), *v = randn((size_t)T * HK * D, 1.0f);
    float *g = randn((size_t)T * HQ * 3, 1.0f);
    size_t no = (size_t)T * HQ * D;
    double *od = malloc(no * sizeof(double));
    int nonforced;
    nsa_ref(q, k, v, g, od, &nonforced);
    CHECK_MSG(nonforced > 20, "nsa reference: only %d selections of unforced blocks", nonforced);
    float *o0 = malloc(no * sizeof(float)), *o1 = malloc(no * sizeof(float)), *of = malloc(no * sizeof(float));
    for (size_t i = 0; i < no; i++) of[i] = (float)od[i];
    cache c0, c1;
    cache_make(&c0);
    run(q, k, v, g, T, 0, &c0, o0);
    CHECK_CLOSE(o0, of, no, ATOL, RTOL, "nsa_prefill vs the double reference");
    for (int mode = 0; mode < 6; mode++) { /* decode loop, pieces of 7, one prefill; x (no) cache */
        int with_cmp = mode >= 3, how = mode % 3;
        cache_make_cmp(&c1, with_cmp);
        run(q, k, v, g, how == 1 ? 7 : how == 2 ? T : 1, how == 0, &c1, o1);
        CHECK_MSG(!memcmp(o0, o1, no * sizeof(float)), "nsa: %s%s differs from one prefill",
                  how == 0 ? "a decode loop" : how == 1 ? "pieces of 7" : "one prefill",
                  with_cmp ? " with the compressed cache" : "");
        cache_free(&c1);
    }
    check_decode_reads(q, k, v, g);
    /* a batch of 3 sessions at positions 10, 33, 50 == each alone (the caches of c0 hold the
     * whole sequence; each session writes its own token again, same bytes) */
    enum { B = 3 };
    cache cs[B];
    hyla_kv_view views[B];
    int32_t pos[B] = {10, 33, 50};
    float qb[B * HQ * D], kb[B * HK * D], vb[B * HK * D], gb[B * HQ * 3], ob[B * HQ * D], oa[HQ * D];
    for (int i = 0; i < B; i++) {
        cache_make(&cs[i]);
        float tmp[T * HQ * D];
        CHECK_OK(ops->nsa_prefill(ctx, q, k, v, g, pos[i], HQ, HK, D, 0, &cs[i].view, BS, CNT, WIN, 0.35f, tmp));
        views[i] = cs[i].view;
        memcpy(qb + i * HQ * D, q + (size_t)pos[i] * HQ * D, sizeof(float) * HQ * D);
        memcpy(kb + i * HK * D, k + (size_t)pos[i] * HK * D, sizeof(float) * HK * D);
        memcpy(vb + i * HK * D, v + (size_t)pos[i] * HK * D, sizeof(float) * HK * D);
        memcpy(gb + i * HQ * 3, g + (size_t)pos[i] * HQ * 3, sizeof(float) * HQ * 3);
    }
    CHECK_OK(ops->nsa_decode(ctx, qb, kb, vb, gb, B, HQ, HK, D, pos, views, BS, CNT, WIN, 0.35f, ob));
    for (int i = 0; i < B; i++) {
        CHECK_OK(ops->nsa_decode(ctx, qb + i * HQ * D, kb + i * HK * D, vb + i * HK * D, gb + i * HQ * 3, 1, HQ, HK, D,
                                 &pos[i], &views[i], BS, CNT, WIN, 0.35f, oa));
        CHECK_MSG(!memcmp(oa, ob + i * HQ * D, sizeof oa), "nsa_decode: session %d in a batch differs from alone", i);
        cache_free(&cs[i]);
    }
    /* errors: a position past the cache, a zero block size */
    int32_t far = NP * PT;
    CHECK(ops->nsa_decode(ctx, q, k, v, g, 1, HQ, HK, D, &far, &c0.view, BS, CNT, WIN, 0.35f, oa) == HYLA_ERR_RESOURCE);
    CHECK(ops->nsa_prefill(ctx, q, k, v, g, 1, HQ, HK, D, 0, &c0.view, 0, CNT, WIN, 0.35f, oa) == HYLA_ERR_INVALID_ARG);
    cache_free(&c0);
    free(q), free(k), free(v), free(g), free(od), free(o0), free(o1), free(of);
    hyla_backend_destroy(be);
    return hyla_test_done("test_cpu_nsa");
}
