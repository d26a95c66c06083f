/* test_cpu_dla.c — dynamic linear attention on the CPU reference backend (kernels/cpu/cpu_dla.c):
 *   - dla_prefill against a double-precision reference written from the spec (docs/MODELS.md
 *     §4.7 [DLA-1..5]: score against the newest state with RMSNorm on both, threshold tau, merge
 *     or open, lowest-density adjacent merge when full, softplus(lam) weights newest first), for
 *     the gated-DeltaNet base (erase = write = beta) and a Mamba2-like base (erase NULL), with the
 *     same boundaries and counts as the reference;
 *   - with every lambda = 1 the output and the summed states equal plain gdn_prefill (the delta
 *     rule applied to each state sums to the delta rule on the sum), and over the Mamba2 base
 *     (ssd_gates, B/C/x as k/q/v, ssd_skip) the output equals ssd_prefill;
 *   - prefill == decode loop == pieces of 3 and 7 tokens, bit for bit (outputs and cache), for both
 *     bases; a decode batch == each session alone; refusals.
 * Inputs come in segments of near-identical (k, v) so that both merges into the newest state and
 * new states (and so full-cache merges, K = 4) occur in 80 tokens.
 * Tolerances: fp32 against double over <= 80 rank-1 terms of O(1): ATOL 1e-4 + RTOL 1e-3 (a
 * wrong boundary, merge or weight moves outputs by >= 1e-2). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_ops.h"
#include "hyla_test.h"

#define ATOL 1e-4
#define RTOL 1e-3

enum { H = 2, DK = 8, DV = 12, K = 4, T = 80 };
#define TAU 0.6f

static hyla_backend *be;
static const hyla_ops *ops;
static void *ctx;
static hyla_rng rng;

typedef struct {
    float *q, *k, *v, *g, *beta, *lam;
} inputs;

static void l2(float *x, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(s + 1e-6));
    for (int i = 0; i < n; i++) x[i] *= r;
}

/* segments of 1..6 tokens per head sharing (k, v) up to 5 % noise */
static inputs make_inputs(int lam_one) {
    inputs in;
    in.q = malloc((size_t)T * H * DK * sizeof(float));
    in.k = malloc((size_t)T * H * DK * sizeof(float));
    in.v = malloc((size_t)T * H * DV * sizeof(float));
    in.g = malloc((size_t)T * H * sizeof(float));
    in.beta = malloc((size_t)T * H * sizeof(float));
    in.lam = malloc((size_t)T * H * K * sizeof(float));
    for (int h = 0; h < H; h++) {
        float bk[DK], bv[DV];
        int left = 0;
        for (int t = 0; t < T; t++) {
            if (!left) {
                for (int i = 0; i < DK; i++) bk[i] = hyla_rng_normal(&rng);
                for (int j = 0; j < DV; j++) bv[j] = hyla_rng_normal(&rng);
                left = 1 + (int)(hyla_rng_uniform(&rng) * 6);
            }
            left--;
            size_t r = (size_t)t * H + h;
            for (int i = 0; i < DK; i++) in.k[r * DK + i] = bk[i] + 0.05f * hyla_rng_normal(&rng);
            for (int i = 0; i < DK; i++) in.q[r * DK + i] = hyla_rng_normal(&rng);
            for (int j = 0; j < DV; j++) in.v[r * DV + j] = bv[j] + 0.05f * hyla_rng_normal(&rng);
            l2(in.k + r * DK, DK);
            l2(in.q + r * DK, DK);
            in.g[r] = -0.02f - 0.1f * hyla_rng_uniform(&rng);
            in.beta[r] = 0.2f + 0.6f * hyla_rng_uniform(&rng);
            for (int s = 0; s < K; s++) in.lam[r * K + s] = lam_one ? 0.54132485f : hyla_rng_normal(&rng);
        }
    }
    return in;
}

static void free_inputs(inputs *in) {
    free(in->q), free(in->k), free(in->v), free(in->g), free(in->beta), free(in->lam);
}

typedef struct {
    void *S, *n, *I, *m;
    hyla_dla_cache c;
} cache;

static void cache_make(cache *c) {
    CHECK_OK(ops->alloc(ctx, (size_t)H * K * DK * DV * sizeof(float), &c->S));
    CHECK_OK(ops->alloc(ctx, (size_t)H * K * sizeof(int32_t), &c->n));
    CHECK_OK(ops->alloc(ctx, (size_t)H * K * sizeof(float), &c->I));
    CHECK_OK(ops->alloc(ctx, (size_t)H * sizeof(int32_t), &c->m));
    c->c = (hyla_dla_cache){c->S, c->n, c->I, c->m};
}
static void cache_free(cache *c) { ops->free(ctx, c->S), ops->free(ctx, c->n), ops->free(ctx, c->I), ops->free(ctx, c->m); }
static int cache_eq(const cache *a, const cache *b) {
    return !memcmp(a->S, b->S, (size_t)H * K * DK * DV * sizeof(float)) &&
           !memcmp(a->n, b->n, (size_t)H * K * sizeof(int32_t)) && !memcmp(a->I, b->I, (size_t)H * K * sizeof(float)) &&
           !memcmp(a->m, b->m, (size_t)H * sizeof(int32_t));
}

/* ---- the double-precision reference, per head ---- */
typedef struct {
    double S[K][DK][DV];
    int n[K];
    double I[K];
    int m;
    int opened, merged_full, merged_newest;
} ref_head;

static double ref_score(const ref_head *r, const float *k, const float *v, double w) {
    if (r->m == 0) return TAU;
    const double N = DK * DV;
    double s[DK][DV], ss = 0, SS = 0, d2 = 0;
    for (int i = 0; i < DK; i++)
        for (int j = 0; j < DV; j++) {
            s[i][j] = w * k[i] * v[j];
            ss += s[i][j] * s[i][j];
            SS += r->S[r->m - 1][i][j] * r->S[r->m - 1][i][j];
        }
    if (SS == 0) return TAU;
    double rs = 1 / sqrt(ss / N + 1e-6), rS = 1 / sqrt(SS / N + 1e-6);
    for (int i = 0; i < DK; i++)
        for (int j = 0; j < DV; j++) {
            double d = rs * s[i][j] - rS * r->S[r->m - 1][i][j];
            d2 += d * d;
        }
    return sqrt(d2) / (rS * sqrt(SS) + 1e-6);
}

static void ref_token(ref_head *r, const float *q, const float *k, const float *v, double g, double e, double w,
                      const float *lam, double scale, double *o) {
    double I = (float)ref_score(r, k, v, w); /* the op rounds the score to float once */
    for (int s = 0; s < r->m; s++) {
        double kS[DV] = {0};
        for (int i = 0; i < DK; i++)
            for (int j = 0; j < DV; j++) kS[j] += k[i] * r->S[s][i][j];
        for (int i = 0; i < DK; i++)
            for (int j = 0; j < DV; j++) r->S[s][i][j] = exp(g) * (r->S[s][i][j] - e * k[i] * kS[j]);
    }
    if (r->m == 0 || I >= TAU) {
        if (r->m == K) {
            int b = 0;
            double bd = 0;
            for (int i = 0; i + 1 < r->m; i++) {
                double d = (r->I[i] + r->I[i + 1]) / (r->n[i] + r->n[i + 1]);
                if (i == 0 || d < bd) bd = d, b = i;
            }
            for (int i = 0; i < DK; i++)
                for (int j = 0; j < DV; j++) r->S[b][i][j] += r->S[b + 1][i][j];
            r->n[b] += r->n[b + 1];
            r->I[b] += r->I[b + 1];
            for (int s = b + 1; s + 1 < r->m; s++) {
                memcpy(r->S[s], r->S[s + 1], sizeof r->S[s]);
                r->n[s] = r->n[s + 1];
                r->I[s] = r->I[s + 1];
            }
            r->m--;
            r->merged_full++;
        }
        memset(r->S[r->m], 0, sizeof r->S[r->m]);
        r->n[r->m] = 0;
        r->I[r->m] = 0;
        r->m++;
        r->opened++;
    } else {
        r->merged_newest++;
    }
    for (int i = 0; i < DK; i++)
        for (int j = 0; j < DV; j++) r->S[r->m - 1][i][j] += w * k[i] * v[j];
    r->n[r->m - 1]++;
    r->I[r->m - 1] += I;
    for (int j = 0; j < DV; j++) o[j] = 0;
    for (int s = 0; s < r->m; s++) {
        double lv = log1p(exp(lam[r->m - 1 - s]));
        for (int i = 0; i < DK; i++)
            for (int j = 0; j < DV; j++) o[j] += lv * scale * q[i] * r->S[s][i][j];
    }
}

static void run(const hyla_dla_params *p, const inputs *in, int erase, int piece, int decode, cache *c, float *o) {
    float scale = 1.0f / sqrtf((float)DK);
    if (decode) piece = 1;
    for (int t0 = 0; t0 < T; t0 += piece) {
        int m = T - t0 < piece ? T - t0 : piece;
        size_t r = (size_t)t0 * H;
        const float *e = erase ? in->beta + r : NULL;
        if (decode)
            CHECK_OK(ops->dla_decode(ctx, p, in->q + r * DK, in->k + r * DK, in->v + r * DV, in->g + r, e, in->beta + r,
                                     in->lam + r * K, 1, scale, &c->c, o + r * DV));
        else
            CHECK_OK(ops->dla_prefill(ctx, p, in->q + r * DK, in->k + r * DK, in->v + r * DV, in->g + r, e,
                                      in->beta + r, in->lam + r * K, m, scale, &c->c, o + r * DV));
    }
}

static void test_reference(int erase) {
    hyla_dla_params p = {H, DK, DV, K, TAU};
    inputs in = make_inputs(0);
    float *o = malloc((size_t)T * H * DV * sizeof(float)), *of = malloc((size_t)T * H * DV * sizeof(float));
    cache c;
    cache_make(&c);
    run(&p, &in, erase, T, 0, &c, o);
    ref_head *rh = calloc(H, sizeof *rh);
    double od[DV];
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            size_t r = (size_t)t * H + h;
            ref_token(&rh[h], in.q + r * DK, in.k + r * DK, in.v + r * DV, in.g[r], erase ? in.beta[r] : 0, in.beta[r],
                      in.lam + r * K, 1.0 / sqrt((double)DK), od);
            for (int j = 0; j < DV; j++) of[r * DV + j] = (float)od[j];
        }
    CHECK_CLOSE(o, of, (size_t)T * H * DV, ATOL, RTOL, erase ? "dla (gdn base) vs reference" : "dla (erase 0) vs reference");
    const int32_t *m = c.m, *n = c.n;
    for (int h = 0; h < H; h++) {
        CHECK_MSG(rh[h].opened > K + 2 && rh[h].merged_full > 2 && rh[h].merged_newest > 10,
                  "head %d: %d opened, %d full merges, %d merged into the newest: the test exercises too little", h,
                  rh[h].opened, rh[h].merged_full, rh[h].merged_newest);
        CHECK_MSG(m[h] == rh[h].m, "head %d: %d states, reference %d", h, (int)m[h], rh[h].m);
        int tot = 0;
        for (int s = 0; s < m[h] && s < K; s++) {
            CHECK_MSG(n[h * K + s] == rh[h].n[s], "head %d state %d: %d tokens, reference %d", h, s, (int)n[h * K + s],
                      rh[h].n[s]);
            tot += n[h * K + s];
        }
        CHECK_MSG(tot == T, "head %d: counts sum to %d, want %d", h, tot, T);
    }
    free(rh);
    cache_free(&c);
    free(o), free(of);
    free_inputs(&in);
}

/* lambda = 1: the sum of the states and the output are those of the gated delta rule */
static void test_equals_gdn(void) {
    hyla_dla_params p = {H, DK, DV, K, TAU};
    inputs in = make_inputs(1);
    size_t no = (size_t)T * H * DV;
    float *o = malloc(no * sizeof(float)), *og = malloc(no * sizeof(float));
    cache c;
    cache_make(&c);
    run(&p, &in, 1, T, 0, &c, o);
    void *S;
    CHECK_OK(ops->alloc(ctx, (size_t)H * DK * DV * sizeof(float), &S));
    CHECK_OK(ops->gdn_prefill(ctx, in.q, in.k, in.v, in.g, in.beta, T, H, DK, DV, 1.0f / sqrtf((float)DK), S, og));
    CHECK_CLOSE(o, og, no, ATOL, RTOL, "dla with lambda 1 vs gdn_prefill");
    float sum[H * DK * DV];
    const float *Sc = c.S;
    const int32_t *m = c.m;
    for (int h = 0; h < H; h++)
        for (int x = 0; x < DK * DV; x++) {
            float a = 0;
            for (int s = 0; s < m[h]; s++) a += Sc[((size_t)h * K + s) * DK * DV + x];
            sum[h * DK * DV + x] = a;
        }
    CHECK_CLOSE(sum, (const float *)S, (size_t)H * DK * DV, ATOL, RTOL, "sum of dla states vs gdn state");
    ops->free(ctx, S);
    cache_free(&c);
    free(o), free(og);
    free_inputs(&in);
}

/* The Mamba2 base: ssd_gates, B and C of the group as k and q, x as v, no erase, scale 1, then
 * ssd_skip; with lambda = 1 the output is ssd_prefill's (the states sum to the SSD state). */
static void test_equals_mamba2(void) {
    enum { N = DK, P = DV, G = 1, LDX = H * P + 2 * G * N };
    hyla_dla_params p = {H, N, P, K, TAU};
    float *xbc = malloc((size_t)T * LDX * sizeof(float)), *dt = malloc((size_t)T * H * sizeof(float));
    float *q = malloc((size_t)T * H * N * sizeof(float)), *k = malloc((size_t)T * H * N * sizeof(float));
    float *v = malloc((size_t)T * H * P * sizeof(float)), *lam = malloc((size_t)T * H * K * sizeof(float));
    float *a = malloc((size_t)T * H * sizeof(float)), *dtp = malloc((size_t)T * H * sizeof(float));
    size_t no = (size_t)T * H * P;
    float *o = malloc(no * sizeof(float)), *oy = malloc(no * sizeof(float));
    float dt_bias[H], A_log[H], Dskip[H];
    for (int h = 0; h < H; h++) dt_bias[h] = -1.0f + 0.5f * h, A_log[h] = 0.3f * h, Dskip[h] = 0.5f + h;
    for (size_t i = 0; i < (size_t)T * LDX; i++) xbc[i] = 0.5f * hyla_rng_normal(&rng);
    for (size_t i = 0; i < (size_t)T * H; i++) dt[i] = hyla_rng_normal(&rng);
    for (size_t i = 0; i < (size_t)T * H * K; i++) lam[i] = 0.54132485f;
    CHECK_OK(ops->ssd_gates(ctx, dt, H, dt_bias, A_log, 0.0f, INFINITY, T, H, a, dtp));
    CHECK_OK(ops->copy2d(ctx, v, H * P, xbc, LDX, T, H * P));
    for (int h = 0; h < H; h++) {
        CHECK_OK(ops->copy2d(ctx, k + h * N, H * N, xbc + H * P, LDX, T, N));
        CHECK_OK(ops->copy2d(ctx, q + h * N, H * N, xbc + H * P + G * N, LDX, T, N));
    }
    cache c;
    cache_make(&c);
    CHECK_OK(ops->dla_prefill(ctx, &p, q, k, v, a, NULL, dtp, lam, T, 1.0f, &c.c, o));
    CHECK_OK(ops->ssd_skip(ctx, o, xbc, LDX, Dskip, T, H, P));
    void *S;
    CHECK_OK(ops->alloc(ctx, (size_t)H * N * P * sizeof(float), &S));
    CHECK_OK(ops->ssd_prefill(ctx, xbc, LDX, dt, H, dt_bias, A_log, Dskip, 0.0f, INFINITY, T, H, P, G, N, S, oy));
    CHECK_CLOSE(o, oy, no, ATOL, RTOL, "dla over mamba2 with lambda 1 vs ssd_prefill");
    int states = 0;
    for (int h = 0; h < H; h++) states += ((const int32_t *)c.m)[h];
    CHECK_MSG(states > H, "dla over mamba2: %d states in %d heads, the test exercises too little", states, H);
    ops->free(ctx, S);
    cache_free(&c);
    free(xbc), free(dt), free(q), free(k), free(v), free(lam), free(a), free(dtp), free(o), free(oy);
}

static void test_pieces_and_batch(void) {
    hyla_dla_params p = {H, DK, DV, K, TAU};
    inputs in = make_inputs(0);
    size_t no = (size_t)T * H * DV;
    float *o0 = malloc(no * sizeof(float)), *o1 = malloc(no * sizeof(float));
    cache c0, c1;
    const int pieces[] = {1, 3, 7};
    /* both bases: erase = beta (GDN) and no erase (Mamba2) */
    for (int erase = 0; erase < 2; erase++) {
        cache_make(&c0);
        run(&p, &in, erase, T, 0, &c0, o0);
        for (int d = 0; d < 2; d++)
            for (size_t pi = 0; pi < sizeof pieces / sizeof *pieces; pi++) {
                if (d && pi) break;
                cache_make(&c1);
                memset(o1, 0, no * sizeof(float));
                run(&p, &in, erase, pieces[pi], d, &c1, o1);
                CHECK_MSG(!memcmp(o0, o1, no * sizeof(float)) && cache_eq(&c0, &c1),
                          "dla (%s): %s of %d differs from one prefill", erase ? "gdn base" : "no erase",
                          d ? "decode loop" : "pieces", pieces[pi]);
                cache_free(&c1);
            }
        if (!erase) cache_free(&c0);
    }
    /* a batch of 3 sessions (tokens t, t+1, t+2 of the inputs as three sessions) == each alone */
    enum { B = 3, STEPS = 20 };
    cache cb[B], ca[B];
    hyla_dla_cache hc[B];
    for (int b = 0; b < B; b++) cache_make(&cb[b]), cache_make(&ca[b]), hc[b] = cb[b].c;
    float scale = 1.0f / sqrtf((float)DK);
    float ob[B * H * DV], oa[H * DV];
    float qb[B * H * DK], kb[B * H * DK], vb[B * H * DV], gb[B * H], bb[B * H], lb[B * H * K];
    int same = 1;
    for (int s = 0; s < STEPS; s++) {
        for (int b = 0; b < B; b++) {
            size_t r = (size_t)(s * B + b) * H;
            memcpy(qb + b * H * DK, in.q + r * DK, H * DK * sizeof(float));
            memcpy(kb + b * H * DK, in.k + r * DK, H * DK * sizeof(float));
            memcpy(vb + b * H * DV, in.v + r * DV, H * DV * sizeof(float));
            memcpy(gb + b * H, in.g + r, H * sizeof(float));
            memcpy(bb + b * H, in.beta + r, H * sizeof(float));
            memcpy(lb + b * H * K, in.lam + r * K, H * K * sizeof(float));
        }
        CHECK_OK(ops->dla_decode(ctx, &p, qb, kb, vb, gb, bb, bb, lb, B, scale, hc, ob));
        for (int b = 0; b < B; b++) {
            CHECK_OK(ops->dla_decode(ctx, &p, qb + b * H * DK, kb + b * H * DK, vb + b * H * DV, gb + b * H, bb + b * H,
                                     bb + b * H, lb + b * H * K, 1, scale, &ca[b].c, oa));
            same &= !memcmp(oa, ob + b * H * DV, sizeof oa);
        }
    }
    for (int b = 0; b < B; b++) same &= cache_eq(&ca[b], &cb[b]), cache_free(&ca[b]), cache_free(&cb[b]);
    CHECK_MSG(same, "dla: a decode batch differs from its sessions alone");
    /* refusals: a capacity below 2, a cache claiming more states than its capacity */
    hyla_dla_params bad = p;
    bad.K = 1;
    CHECK(ops->dla_prefill(ctx, &bad, in.q, in.k, in.v, in.g, in.beta, in.beta, in.lam, 1, scale, &c0.c, o1) ==
          HYLA_ERR_INVALID_ARG);
    ((int32_t *)c0.m)[1] = K + 1;
    CHECK(ops->dla_decode(ctx, &p, in.q, in.k, in.v, in.g, in.beta, in.beta, in.lam, 1, scale, &c0.c, o1) ==
          HYLA_ERR_INVALID_ARG);
    cache_free(&c0);
    free(o0), free(o1);
    free_inputs(&in);
}

int main(void) {
    hyla_rng_seed(&rng, 1234);
    CHECK_OK(hyla_cpu_backend_create(2, &be));
    if (!be) return hyla_test_done("test_cpu_dla");
    ops = be->ops;
    ctx = be->ctx;
    test_reference(1);
    test_reference(0);
    test_equals_gdn();
    test_equals_mamba2();
    test_pieces_and_batch();
    hyla_backend_destroy(be);
    return hyla_test_done("test_cpu_dla");
}
