/* test_cpu_lte.c — the LTE ops of the CPU reference backend (kernels/cpu/cpu_lte.c):
 *   - lte_score against a naive double-precision CNN (grouped Conv1d, left zero padding of every
 *     layer, Swish, per-head projection, sigmoid); a score is the same bits whatever window of
 *     rows (T, x0) it was computed in;
 *   - lte_prefill against a double reference of the whole mechanism written from the paper's
 *     rules (sink, window, retained segment with the replacement rule and its tie break), with
 *     scores from the true pre-RoPE keys: outputs within tolerance, the same retained positions;
 *   - prefill of N tokens == N decode steps == prefill in pieces of 1, 7 and 33 tokens: the same
 *     cache bytes and outputs, bit for bit; lazy scoring == eager scoring (outputs and retained
 *     segment, bit for bit); a decode batch == each session alone; errors. Built twice: a window
 *     of 16 over 150 tokens, and (test_cpu_lte_wide) a window of 64 over 400.
 *
 * Tolerances: the backend is fp32, the reference double. Scores differ by the un-rotation of
 * the cached keys (cos/sin in double, one fp32 rounding per element) and fp32 sums over <= 48
 * terms: ~1e-6; 1e-5 leaves a margin and still catches a wrong tap or padding (>= 1e-2).
 * Outputs are softmax averages of O(1) values: ATOL 2e-5 + RTOL 1e-4 as the other mixers. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_ops.h"
#include "hyla_test.h"

#define ATOL 2e-5
#define RTOL 1e-4

/* LTE_WIDE (test_cpu_lte_wide): a window of 64, so lazy batches hold 52 positions, over 400
 * tokens; by default a window of 16 over 150. */
#ifdef LTE_WIDE
enum { HK = 2, HQ = 4, D = 8, SINK = 4, WIN = 64, BUD = 8, T = 400 };
#else
enum { HK = 2, HQ = 4, D = 8, SINK = 2, WIN = 16, BUD = 4, T = 150 };
#endif
#define ROWS (SINK + WIN + BUD)

static hyla_backend *be;
static const hyla_ops *ops;
static void *ctx;
static hyla_rng rng;

static float *randn(size_t n, float scale) {
    float *x = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = scale * hyla_rng_normal(&rng);
    return x;
}

/* ------------------------------------------------------------------ the reference */

typedef struct {
    hyla_lte_params p;
    float *w[HYLA_LTE_MAX_CONV], *b[HYLA_LTE_MAX_CONV], *pw, *pb;
} net;

static net net_make(void) {
    net n = {0};
    hyla_lte_params *p = &n.p;
    p->Hk = HK, p->D = D, p->sink = SINK, p->window = WIN, p->budget = BUD;
    p->n_conv = 3, p->kernel = 3, p->dilation = 2;
    p->ch[0] = 2 * D, p->ch[1] = D, p->ch[2] = D / 2, p->ch[3] = D / 4;
    for (int l = 0; l < 3; l++) {
        n.w[l] = randn((size_t)HK * p->ch[l + 1] * p->ch[l] * 3, sqrtf(1.0f / (float)(p->ch[l] * 3)));
        n.b[l] = randn((size_t)HK * p->ch[l + 1], 0.1f);
        p->conv_w[l] = n.w[l], p->conv_b[l] = n.b[l];
    }
    n.pw = randn((size_t)HK * p->ch[3], 1.0f);
    n.pb = randn(HK, 0.3f);
    p->proj_w = n.pw, p->proj_b = n.pb;
    p->rope_theta = 10000.0f;
    return n;
}
static void net_free(net *n) {
    for (int l = 0; l < 3; l++) free(n->w[l]), free(n->b[l]);
    free(n->pw), free(n->pb);
}

/* Scores [T][Hk] of x [T][Hk][2D] (positions 0..T-1), in double. Layer activations are kept for
 * every position; a position < 0 reads zero at every layer. */
static void cnn_ref(const hyla_lte_params *p, const float *x, int n, double *r) {
    int K = p->kernel, c = (K - 1) / 2, dil = p->dilation, maxc = p->ch[0];
    double *a = calloc((size_t)n * HK * maxc, sizeof(double)), *b = calloc((size_t)n * HK * maxc, sizeof(double));
    for (size_t i = 0; i < (size_t)n * HK * maxc; i++) a[i] = 0;
    for (int t = 0; t < n; t++)
        for (int j = 0; j < HK * p->ch[0]; j++) a[(size_t)t * HK * maxc + j] = x[(size_t)t * HK * p->ch[0] + j];
    for (int l = 0; l < p->n_conv; l++) {
        int ci = p->ch[l], co = p->ch[l + 1];
        for (int t = 0; t < n; t++)
            for (int h = 0; h < HK; h++)
                for (int o = 0; o < co; o++) {
                    double acc = p->conv_b[l][h * co + o];
                    for (int i = 0; i < K; i++) {
                        int ts = t + (i - c) * dil;
                        if (ts < 0 || ts >= n) continue;
                        for (int j = 0; j < ci; j++)
                            acc += (double)p->conv_w[l][((size_t)(h * co + o) * ci + j) * K + i] *
                                   a[(size_t)ts * HK * maxc + (size_t)h * ci + j];
                    }
                    b[(size_t)t * HK * maxc + (size_t)h * co + o] = acc / (1.0 + exp(-acc));
                }
        double *tmp = a;
        a = b, b = tmp;
    }
    int cl = p->ch[p->n_conv];
    for (int t = 0; t < n; t++)
        for (int h = 0; h < HK; h++) {
            double acc = p->proj_b[h];
            for (int j = 0; j < cl; j++) acc += (double)p->proj_w[h * cl + j] * a[(size_t)t * HK * maxc + (size_t)h * cl + j];
            r[(size_t)t * HK + h] = 1.0 / (1.0 + exp(-acc));
        }
    free(a), free(b);
}

static void rope_ref(const float *x, float *y, int pos, int H) {
    for (int h = 0; h < H; h++)
        for (int j = 0; j < D / 2; j++) {
            double ang = pos * pow(10000.0, -2.0 * j / D), x0 = x[h * D + j], x1 = x[h * D + j + D / 2];
            y[h * D + j] = (float)(x0 * cos(ang) - x1 * sin(ang));
            y[h * D + j + D / 2] = (float)(x1 * cos(ang) + x0 * sin(ang));
        }
}

typedef struct {
    float *q, *kpre, *k, *v; /* [T][HQ][D], [T][HK][D] pre-RoPE, rotated, values */
    double *r;               /* [T][HK] reference scores (scores at t >= T - h are never used) */
} seq;

static seq seq_make(const net *n) {
    seq s;
    s.q = randn((size_t)T * HQ * D, 1.0f);
    s.kpre = randn((size_t)T * HK * D, 1.0f);
    s.v = randn((size_t)T * HK * D, 1.0f);
    s.k = malloc((size_t)T * HK * D * sizeof(float));
    float *qr = malloc((size_t)T * HQ * D * sizeof(float));
    for (int t = 0; t < T; t++) {
        rope_ref(s.kpre + (size_t)t * HK * D, s.k + (size_t)t * HK * D, t, HK);
        rope_ref(s.q + (size_t)t * HQ * D, qr + (size_t)t * HQ * D, t, HQ);
    }
    free(s.q);
    s.q = qr;
    float *x = malloc((size_t)T * HK * 2 * D * sizeof(float));
    for (int t = 0; t < T; t++)
        for (int h = 0; h < HK; h++) {
            memcpy(x + ((size_t)t * HK + h) * 2 * D, s.kpre + ((size_t)t * HK + h) * D, D * sizeof(float));
            memcpy(x + ((size_t)t * HK + h) * 2 * D + D, s.v + ((size_t)t * HK + h) * D, D * sizeof(float));
        }
    s.r = malloc((size_t)T * HK * sizeof(double));
    cnn_ref(&n->p, x, T, s.r);
    free(x);
    return s;
}
static void seq_free(seq *s) { free(s->q), free(s->kpre), free(s->k), free(s->v), free(s->r); }

/* The mechanism in double, token by token: o [T][HQ][D]; the final retained positions and
 * counts per head; how many retained-by-score tokens replaced another and were dropped. */
static void lte_ref(const seq *s, double *o, int32_t rpos[HK][BUD], int cnt[HK], int *replaced, int *dropped) {
    double rs[HK][BUD];
    memset(cnt, 0, HK * sizeof(int));
    *replaced = *dropped = 0;
    for (int t = 0; t < T; t++) {
        int e = t - WIN;
        if (e >= SINK)
            for (int h = 0; h < HK; h++) {
                double r = s->r[(size_t)e * HK + h];
                if (!(r > 0.5)) continue;
                if (cnt[h] < BUD) {
                    rs[h][cnt[h]] = r, rpos[h][cnt[h]++] = e;
                    continue;
                }
                int v = 0; /* the lowest score; the oldest among equals */
                for (int i = 1; i < BUD; i++)
                    if (rs[h][i] < rs[h][v] || (rs[h][i] == rs[h][v] && rpos[h][i] < rpos[h][v])) v = i;
                if (r > rs[h][v]) rs[h][v] = r, rpos[h][v] = e, (*replaced)++;
                else (*dropped)++;
            }
        for (int hq = 0; hq < HQ; hq++) {
            int h = hq / (HQ / HK), vis[ROWS], n = 0;
            for (int j = 0; j < SINK && j <= t; j++) vis[n++] = j;
            for (int i = 0; i < cnt[h]; i++) vis[n++] = rpos[h][i];
            for (int j = t - WIN + 1 > SINK ? t - WIN + 1 : SINK; j <= t; j++) vis[n++] = j;
            double sc[ROWS], m = -INFINITY, sum = 0, acc[D] = {0};
            const float *q = s->q + ((size_t)t * HQ + hq) * D;
            for (int i = 0; i < n; i++) {
                const float *k = s->k + ((size_t)vis[i] * HK + h) * D;
                double d = 0;
                for (int x = 0; x < D; x++) d += (double)q[x] * k[x];
                sc[i] = d / sqrt((double)D);
                if (sc[i] > m) m = sc[i];
            }
            for (int i = 0; i < n; i++) {
                double e2 = exp(sc[i] - m);
                sum += e2;
                for (int x = 0; x < D; x++) acc[x] += e2 * s->v[((size_t)vis[i] * HK + h) * D + x];
            }
            for (int x = 0; x < D; x++) o[((size_t)t * HQ + hq) * D + x] = acc[x] / sum;
        }
    }
}

/* ------------------------------------------------------------------ caches */

typedef struct {
    hyla_lte_cache c;
} cache;

static cache cache_make(void) {
    cache k;
    CHECK_OK(ops->alloc(ctx, (size_t)HK * ROWS * D * sizeof(float), &k.c.k));
    CHECK_OK(ops->alloc(ctx, (size_t)HK * ROWS * D * sizeof(float), &k.c.v));
    CHECK_OK(ops->alloc(ctx, (size_t)HK * ROWS * sizeof(float), (void **)&k.c.r));
    CHECK_OK(ops->alloc(ctx, (size_t)HK * BUD * sizeof(int32_t), (void **)&k.c.rpos));
    CHECK_OK(ops->alloc(ctx, (size_t)(2 + HK) * sizeof(int32_t), (void **)&k.c.meta));
    return k;
}
static void cache_free(cache *k) {
    ops->free(ctx, k->c.k), ops->free(ctx, k->c.v), ops->free(ctx, k->c.r), ops->free(ctx, k->c.rpos);
    ops->free(ctx, k->c.meta);
}
static int cache_equal(const cache *a, const cache *b) {
    return !memcmp(a->c.k, b->c.k, (size_t)HK * ROWS * D * sizeof(float)) &&
           !memcmp(a->c.v, b->c.v, (size_t)HK * ROWS * D * sizeof(float)) &&
           !memcmp(a->c.r, b->c.r, (size_t)HK * ROWS * sizeof(float)) &&
           !memcmp(a->c.rpos, b->c.rpos, (size_t)HK * BUD * sizeof(int32_t)) &&
           !memcmp(a->c.meta, b->c.meta, (size_t)(2 + HK) * sizeof(int32_t));
}
/* The retained segments (counts, positions, scores, keys, values) are equal. */
static int segment_equal(const cache *a, const cache *b) {
    for (int h = 0; h < HK; h++) {
        int n = a->c.meta[2 + h];
        if (n != b->c.meta[2 + h]) return 0;
        size_t row = (size_t)h * ROWS + SINK + WIN;
        if (memcmp(a->c.rpos + (size_t)h * BUD, b->c.rpos + (size_t)h * BUD, (size_t)n * sizeof(int32_t)) ||
            memcmp(a->c.r + row, b->c.r + row, (size_t)n * sizeof(float)) ||
            memcmp((float *)a->c.k + row * D, (float *)b->c.k + row * D, (size_t)n * D * sizeof(float)) ||
            memcmp((float *)a->c.v + row * D, (float *)b->c.v + row * D, (size_t)n * D * sizeof(float)))
            return 0;
    }
    return 1;
}

/* Feed tokens [0, T) in pieces of `piece` (decode: one lte_decode per token). */
static void run(const hyla_lte_params *p, const seq *s, int piece, int decode, cache *k, float *o) {
    float scale = 1.0f / sqrtf((float)D);
    for (int t0 = 0; t0 < T; t0 += piece) {
        int m = T - t0 < piece ? T - t0 : piece;
        size_t qo = (size_t)t0 * HQ * D, ko = (size_t)t0 * HK * D;
        if (decode) {
            int32_t pos = t0;
            CHECK_OK(ops->lte_decode(ctx, p, s->q + qo, s->k + ko, s->v + ko, 1, HQ, &pos, &k->c, scale, o + qo));
        } else {
            CHECK_OK(ops->lte_prefill(ctx, p, s->q + qo, s->k + ko, s->v + ko, m, HQ, t0, &k->c, scale, o + qo));
        }
    }
}

/* ------------------------------------------------------------------ tests */

static void test_score(void) {
    net n = net_make();
    seq s = seq_make(&n);
    int h = 6; /* (3 - 1) / 2 * 2 per layer, 3 layers */
    float *x = malloc((size_t)T * HK * 2 * D * sizeof(float));
    for (int t = 0; t < T; t++)
        for (int kh = 0; kh < HK; kh++) {
            memcpy(x + ((size_t)t * HK + kh) * 2 * D, s.kpre + ((size_t)t * HK + kh) * D, D * sizeof(float));
            memcpy(x + ((size_t)t * HK + kh) * 2 * D + D, s.v + ((size_t)t * HK + kh) * D, D * sizeof(float));
        }
    /* all of positions 0..T-1-h at once, reading rows from position -h (x0 = -h: rows of
     * negative positions are never read, so pass x shifted back) */
    float *r = malloc((size_t)T * HK * sizeof(float));
    float *xs = calloc((size_t)(T + h) * HK * 2 * D, sizeof(float));
    memcpy(xs + (size_t)h * HK * 2 * D, x, (size_t)T * HK * 2 * D * sizeof(float));
    CHECK_OK(ops->lte_score(ctx, &n.p, xs, T + h, -h, r)); /* scores of 0..T-1-h */
    double *rd = malloc((size_t)T * HK * sizeof(double));
    for (int i = 0; i < (T - h) * HK; i++) rd[i] = s.r[i];
    float *rf = malloc((size_t)T * HK * sizeof(float));
    for (int i = 0; i < (T - h) * HK; i++) rf[i] = (float)rd[i];
    CHECK_CLOSE(r, rf, (size_t)(T - h) * HK, 1e-5, 0, "lte_score vs the double CNN");
    /* the same position from any window of rows: position j alone (T = 2h+1) and inside a
     * window of 40 rows starting elsewhere */
    int same = 1;
    for (int j = 0; j + h < T; j += 5) {
        float one[HK], win[40 * HK];
        CHECK_OK(ops->lte_score(ctx, &n.p, xs + (size_t)j * HK * 2 * D, 2 * h + 1, j - h, one));
        same &= !memcmp(one, r + (size_t)j * HK, sizeof one);
        int a = j - 3 < 0 ? 0 : j - 3; /* the window's first output position */
        if (a + 40 - 2 * h + h > T) continue;
        CHECK_OK(ops->lte_score(ctx, &n.p, xs + (size_t)a * HK * 2 * D, 40, a - h, win));
        same &= !memcmp(win + (size_t)(j - a) * HK, r + (size_t)j * HK, HK * sizeof(float));
    }
    CHECK_MSG(same, "lte_score: a score depends on the window of rows it was computed in");
    CHECK(ops->lte_score(ctx, &n.p, xs, 2 * h, 0, r) == HYLA_ERR_INVALID_ARG); /* shorter than the field */
    free(x), free(xs), free(r), free(rd), free(rf);
    seq_free(&s);
    net_free(&n);
}

static void test_against_reference(void) {
    net n = net_make();
    seq s = seq_make(&n);
    double *od = malloc((size_t)T * HQ * D * sizeof(double));
    int32_t rpos[HK][BUD];
    int cnt[HK], replaced, dropped;
    lte_ref(&s, od, rpos, cnt, &replaced, &dropped);
    CHECK_MSG(replaced > 0 && dropped > 0, "lte reference: the sequence should exercise replacement (%d) and drops (%d)",
              replaced, dropped);
    cache k = cache_make();
    float *o = malloc((size_t)T * HQ * D * sizeof(float)), *of = malloc((size_t)T * HQ * D * sizeof(float));
    run(&n.p, &s, T, 0, &k, o);
    for (size_t i = 0; i < (size_t)T * HQ * D; i++) of[i] = (float)od[i];
    CHECK_CLOSE(o, of, (size_t)T * HQ * D, ATOL, RTOL, "lte_prefill vs the double reference");
    for (int h = 0; h < HK; h++) {
        CHECK_MSG(k.c.meta[2 + h] == cnt[h], "head %d retains %d tokens, the reference %d", h, (int)k.c.meta[2 + h], cnt[h]);
        CHECK_MSG(!memcmp(k.c.rpos + (size_t)h * BUD, rpos[h], (size_t)cnt[h] * sizeof(int32_t)),
                  "head %d: retained positions differ from the reference", h);
    }
    CHECK(k.c.meta[0] == T);
    cache_free(&k);
    free(o), free(of), free(od);
    seq_free(&s);
    net_free(&n);
}

static void test_bit_identities(void) {
    net n = net_make();
    seq s = seq_make(&n);
    size_t no = (size_t)T * HQ * D;
    float *o0 = malloc(no * sizeof(float)), *o1 = malloc(no * sizeof(float));
    cache k0 = cache_make();
    run(&n.p, &s, T, 0, &k0, o0);
    /* N decode steps, and pieces of 1, 7 and 33 tokens: the cache of one prefill */
    for (int mode = 0; mode < 4; mode++) {
        static const int piece[] = {1, 1, 7, 33};
        cache k1 = cache_make();
        run(&n.p, &s, piece[mode], mode == 0, &k1, o1);
        CHECK_MSG(cache_equal(&k0, &k1) && !memcmp(o0, o1, no * sizeof(float)),
                  "lte: %s differs from one prefill of %d tokens (cache or outputs)",
                  mode == 0 ? "a decode loop" : mode == 1 ? "pieces of 1" : mode == 2 ? "pieces of 7" : "pieces of 33", T);
        cache_free(&k1);
    }
    /* eager scoring: the same outputs and retained segment; only the ring's unscored marks and
     * the next-to-score counter may differ */
    hyla_lte_params pe = n.p;
    pe.eager = 1;
    for (int piece = 1; piece <= T; piece += T - 1) {
        cache k1 = cache_make();
        run(&pe, &s, piece, 0, &k1, o1);
        CHECK_MSG(segment_equal(&k0, &k1) && !memcmp(o0, o1, no * sizeof(float)),
                  "lte: eager scoring (pieces of %d) differs from lazy scoring", piece);
        CHECK(k1.c.meta[1] == T - 6 && k0.c.meta[1] < T - 6);
        cache_free(&k1);
    }
    /* a decode batch of 3 sessions at different positions == each alone */
    enum { B = 3 };
    cache kb[B], ks[B];
    hyla_lte_cache cb[B];
    static const int start[B] = {5, 40, 97};
    for (int i = 0; i < B; i++) {
        kb[i] = cache_make(), ks[i] = cache_make();
        float *tmp = malloc((size_t)start[i] * HQ * D * sizeof(float) + 1);
        float scale = 1.0f / sqrtf((float)D);
        CHECK_OK(ops->lte_prefill(ctx, &n.p, s.q, s.k, s.v, start[i], HQ, 0, &kb[i].c, scale, tmp));
        CHECK_OK(ops->lte_prefill(ctx, &n.p, s.q, s.k, s.v, start[i], HQ, 0, &ks[i].c, scale, tmp));
        free(tmp);
        cb[i] = kb[i].c;
    }
    int same = 1;
    for (int step = 0; step < 30; step++) {
        float q[B * HQ * D], kk[B * HK * D], vv[B * HK * D], ob[B * HQ * D], os[HQ * D];
        int32_t pos[B];
        for (int i = 0; i < B; i++) {
            int t = start[i] + step;
            pos[i] = t;
            memcpy(q + i * HQ * D, s.q + (size_t)t * HQ * D, HQ * D * sizeof(float));
            memcpy(kk + i * HK * D, s.k + (size_t)t * HK * D, HK * D * sizeof(float));
            memcpy(vv + i * HK * D, s.v + (size_t)t * HK * D, HK * D * sizeof(float));
        }
        CHECK_OK(ops->lte_decode(ctx, &n.p, q, kk, vv, B, HQ, pos, cb, 1.0f / sqrtf((float)D), ob));
        for (int i = 0; i < B; i++) {
            CHECK_OK(ops->lte_decode(ctx, &n.p, q + i * HQ * D, kk + i * HK * D, vv + i * HK * D, 1, HQ, &pos[i], &ks[i].c,
                                     1.0f / sqrtf((float)D), os));
            same &= !memcmp(os, ob + i * HQ * D, sizeof os);
        }
    }
    for (int i = 0; i < B; i++) same &= cache_equal(&kb[i], &ks[i]);
    CHECK_MSG(same, "lte_decode: a batch differs from each session decoded alone");
    /* errors: a token at a position the cache does not hold next; a bad window */
    int32_t wrong = 3;
    float ob[HQ * D];
    CHECK(ops->lte_decode(ctx, &n.p, s.q, s.k, s.v, 1, HQ, &wrong, &kb[0].c, 1.0f, ob) == HYLA_ERR_INVALID_ARG);
    hyla_lte_params pw = n.p;
    pw.window = 12; /* receptive field 13 */
    CHECK(ops->lte_prefill(ctx, &pw, s.q, s.k, s.v, 1, HQ, 0, &ks[0].c, 1.0f, ob) == HYLA_ERR_INVALID_ARG);
    for (int i = 0; i < B; i++) cache_free(&kb[i]), cache_free(&ks[i]);
    cache_free(&k0);
    free(o0), free(o1);
    seq_free(&s);
    net_free(&n);
}

int main(void) {
    hyla_rng_seed(&rng, 777);
    CHECK_OK(hyla_cpu_backend_create(2, &be));
    if (!be) return hyla_test_done("test_cpu_lte");
    ops = be->ops;
    ctx = be->ctx;
    test_score();
    test_against_reference();
    test_bit_identities();
    hyla_backend_destroy(be);
    return hyla_test_done("test_cpu_lte");
}
