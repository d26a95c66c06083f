/* test_cpu_mixers.c — the token mixers of the CPU reference backend (kernels/cpu/):
 *   - GLA, GDN, SSE(gla), SSE(gdn): decode against a naive double-precision recurrence;
 *     chunked prefill == repeated decode (n = 1, 5, 64, 100, 130 and nonzero initial states);
 *     prefill over n tokens == prefill over its 64-token pieces, bit for bit; a decode batch
 *     == each session decoded alone, bit for bit;
 *   - SSE: routing (softmax, top-K, ties to the lower index); a partition nobody selects is
 *     bit-identical before and after, in prefill and in decode; prefill in pieces of its window
 *     (64, 128) == one call, bit for bit; a window that is no multiple of 64 refused;
 *   - attention: prefill == decode loop (bit for bit: one per-row routine), against a double
 *     reference, GQA (Hq=4, Hk=2), pages of 4 tokens, the sliding-window boundary (window 5:
 *     the token at p attends to exactly [p-4, p]), freed pages outside the window, errors;
 *   - the thread count changes no bit (SSE prefill over both transitions, attention).
 *
 * Tolerances: the backend is fp32 (cumulative log-decays in double), the reference double;
 * values are ~0.01-1 carried over up to 150 steps, and the largest differences observed
 * (decode vs double, chunked vs decode: two fp32 orders of summation) are ~5e-7 absolute,
 * ~1e-5 relative. ATOL 2e-5 + RTOL 1e-4 leaves a 10x margin while still catching any
 * wrong decay, missing term or off-by-one token (those move outputs by >= 1e-3). */
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
static float *to_f(const double *x, size_t n) {
    float *y = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) y[i] = (float)x[i];
    return y;
}
static double *to_d(const float *x, size_t n) {
    double *y = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) y[i] = x[i];
    return y;
}
/* GLA gate values: logsigmoid(x)/16 (in (-inf, 0)), with a few very strong decays. */
static float *gla_gates(size_t n) {
    float *g = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        double x = 2.0 * hyla_rng_normal(&rng);
        g[i] = (float)(-log1p(exp(-x)) / 16.0);
        if (i % 37 == 5) g[i] = -25.0f;
    }
    return g;
}
/* GDN gates: g = -0.3·softplus(x) (<= 0), β = sigmoid(x). */
static float *gdn_g(size_t n) {
    float *g = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) g[i] = (float)(-0.3 * log1p(exp(hyla_rng_normal(&rng))));
    return g;
}
static float *gdn_beta(size_t n) {
    float *b = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) b[i] = (float)(1.0 / (1.0 + exp(-hyla_rng_normal(&rng))));
    return b;
}
/* q, k l2-normalised per head [GDN-2]. */
static float *unit_rows(size_t rows, int d) {
    float *x = randn(rows * d, 1.0f);
    for (size_t r = 0; r < rows; r++) {
        double ss = 0;
        for (int i = 0; i < d; i++) ss += (double)x[r * d + i] * x[r * d + i];
        for (int i = 0; i < d; i++) x[r * d + i] = (float)(x[r * d + i] / sqrt(ss + 1e-6));
    }
    return x;
}

/* ---------------------------------------------------------------- double references */

/* [GLA-1] S = diag(exp(gk)) S + (w k)ᵀ v; o += scale (w q) S */
static void gla_step_d(const float *q, const float *k, const float *v, const float *gk, double wt, int dk, int dv,
                       double scale, double *S, double *o) {
    for (int i = 0; i < dk; i++)
        for (int j = 0; j < dv; j++) S[i * dv + j] = exp((double)gk[i]) * S[i * dv + j] + wt * k[i] * v[j];
    for (int j = 0; j < dv; j++) {
        double a = 0;
        for (int i = 0; i < dk; i++) a += scale * wt * q[i] * S[i * dv + j];
        o[j] += a;
    }
}

/* [GDN-3] S' = exp(g) S; S = S' + β (w k)ᵀ (v − (w k) S'); o += scale (w q) S */
static void gdn_step_d(const float *q, const float *k, const float *v, double g, double beta, double wt, int dk,
                       int dv, double scale, double *S, double *o) {
    for (int x = 0; x < dk * dv; x++) S[x] *= exp(g);
    for (int j = 0; j < dv; j++) {
        double ks = 0;
        for (int i = 0; i < dk; i++) ks += wt * k[i] * S[i * dv + j];
        double u = beta * (v[j] - ks);
        for (int i = 0; i < dk; i++) S[i * dv + j] += wt * k[i] * u;
    }
    for (int j = 0; j < dv; j++) {
        double a = 0;
        for (int i = 0; i < dk; i++) a += scale * wt * q[i] * S[i * dv + j];
        o[j] += a;
    }
}

/* ---------------------------------------------------------------- GLA and GDN */

typedef struct {
    int gdn, n, H, dk, dv;
    float *q, *k, *v, *g, *beta; /* g: [n][H][dk] (GLA) or [n][H] (GDN) */
    float *S0;                   /* [H][dk][dv] initial state */
} lin_case;

static lin_case lin_make(int gdn, int n, int H, int dk, int dv) {
    lin_case c = {gdn, n, H, dk, dv, NULL, NULL, NULL, NULL, NULL, NULL};
    size_t nq = (size_t)n * H * dk;
    c.q = gdn ? unit_rows((size_t)n * H, dk) : randn(nq, 0.5f);
    c.k = gdn ? unit_rows((size_t)n * H, dk) : randn(nq, 0.5f);
    c.v = randn((size_t)n * H * dv, 1.0f);
    c.g = gdn ? gdn_g((size_t)n * H) : gla_gates(nq);
    c.beta = gdn ? gdn_beta((size_t)n * H) : NULL;
    c.S0 = randn((size_t)H * dk * dv, 0.5f);
    return c;
}
static void lin_free(lin_case *c) { free(c->q), free(c->k), free(c->v), free(c->g), free(c->beta), free(c->S0); }

/* Prefill of tokens [t0, t0+m) of the case (pointers offset). */
static hyla_status lin_prefill(const lin_case *c, int t0, int m, float scale, float *S, float *o) {
    size_t qo = (size_t)t0 * c->H * c->dk, vo = (size_t)t0 * c->H * c->dv, go = (size_t)t0 * c->H;
    if (c->gdn)
        return ops->gdn_prefill(ctx, c->q + qo, c->k + qo, c->v + vo, c->g + go, c->beta + go, m, c->H, c->dk, c->dv,
                                scale, S, o + vo);
    return ops->gla_prefill(ctx, c->q + qo, c->k + qo, c->v + vo, c->g + qo, m, c->H, c->dk, c->dv, scale, S, o + vo);
}

static void test_linear_mixer(int gdn) {
    const char *name = gdn ? "gdn" : "gla";
    int ns[] = {1, 5, 64, 100, 130};
    int H = 3, dk = 16, dv = 12;
    float scale = 1.0f / sqrtf((float)dk);
    for (size_t z = 0; z < sizeof ns / sizeof ns[0]; z++) {
        int n = ns[z];
        lin_case c = lin_make(gdn, n, H, dk, dv);
        size_t SN = (size_t)H * dk * dv, ON = (size_t)n * H * dv;
        /* double reference */
        double *Sr = to_d(c.S0, SN), *orf = calloc(ON, sizeof(double));
        for (int t = 0; t < n; t++)
            for (int h = 0; h < H; h++) {
                size_t qi = ((size_t)t * H + h) * dk, vi = ((size_t)t * H + h) * dv, gi = (size_t)t * H + h;
                if (gdn)
                    gdn_step_d(c.q + qi, c.k + qi, c.v + vi, c.g[gi], c.beta[gi], 1.0, dk, dv, scale,
                               Sr + (size_t)h * dk * dv, orf + vi);
                else
                    gla_step_d(c.q + qi, c.k + qi, c.v + vi, c.g + qi, 1.0, dk, dv, scale, Sr + (size_t)h * dk * dv,
                               orf + vi);
            }
        float *o_ref = to_f(orf, ON), *S_ref = to_f(Sr, SN);
        /* decode loop */
        float *Sd = dup(c.S0, SN), *od = malloc(ON * sizeof(float));
        for (int t = 0; t < n; t++) {
            size_t qi = (size_t)t * H * dk, vi = (size_t)t * H * dv, gi = (size_t)t * H;
            float *Sp[1] = {Sd};
            if (gdn)
                CHECK_OK(ops->gdn_decode(ctx, c.q + qi, c.k + qi, c.v + vi, c.g + gi, c.beta + gi, 1, H, dk, dv, scale,
                                         Sp, od + vi));
            else
                CHECK_OK(ops->gla_decode(ctx, c.q + qi, c.k + qi, c.v + vi, c.g + qi, 1, H, dk, dv, scale, Sp, od + vi));
        }
        /* chunked prefill, one call */
        float *Sc = dup(c.S0, SN), *oc = malloc(ON * sizeof(float));
        CHECK_OK(lin_prefill(&c, 0, n, scale, Sc, oc));
        char what[96];
        snprintf(what, sizeof what, "%s n=%d decode vs double: o", name, n);
        CHECK_CLOSE(od, o_ref, ON, ATOL, RTOL, what);
        snprintf(what, sizeof what, "%s n=%d decode vs double: S", name, n);
        CHECK_CLOSE(Sd, S_ref, SN, ATOL, RTOL, what);
        snprintf(what, sizeof what, "%s n=%d prefill vs decode: o", name, n);
        CHECK_CLOSE(oc, od, ON, ATOL, RTOL, what);
        snprintf(what, sizeof what, "%s n=%d prefill vs decode: S", name, n);
        CHECK_CLOSE(Sc, Sd, SN, ATOL, RTOL, what);
        snprintf(what, sizeof what, "%s n=%d prefill vs double: o", name, n);
        CHECK_CLOSE(oc, o_ref, ON, ATOL, RTOL, what);
        /* the same tokens as 64-token pieces: bit for bit (chunks start at the call's start) */
        if (n > 64) {
            float *S2 = dup(c.S0, SN), *o2 = malloc(ON * sizeof(float));
            for (int t0 = 0; t0 < n; t0 += 64) CHECK_OK(lin_prefill(&c, t0, n - t0 < 64 ? n - t0 : 64, scale, S2, o2));
            CHECK_MSG(!memcmp(S2, Sc, SN * sizeof(float)) && !memcmp(o2, oc, ON * sizeof(float)),
                      "%s n=%d: prefill in 64-token pieces differs from one call", name, n);
            free(S2), free(o2);
        }
        free(Sr), free(orf), free(o_ref), free(S_ref), free(Sd), free(od), free(Sc), free(oc);
        lin_free(&c);
    }
}

/* A decode batch of 3 sessions equals each session decoded alone, bit for bit. */
static void test_decode_batch(int gdn) {
    int B = 3, H = 2, dk = 8, dv = 8;
    float scale = 0.35f;
    lin_case c = lin_make(gdn, B, H, dk, dv); /* "tokens" = sessions */
    size_t SN = (size_t)H * dk * dv;
    float *Sb[3], *Sa[3], ob[3 * 2 * 8], oa[3 * 2 * 8];
    for (int b = 0; b < B; b++) {
        Sb[b] = randn(SN, 0.5f);
        Sa[b] = dup(Sb[b], SN);
    }
    if (gdn)
        CHECK_OK(ops->gdn_decode(ctx, c.q, c.k, c.v, c.g, c.beta, B, H, dk, dv, scale, Sb, ob));
    else
        CHECK_OK(ops->gla_decode(ctx, c.q, c.k, c.v, c.g, B, H, dk, dv, scale, Sb, ob));
    for (int b = 0; b < B; b++) {
        size_t qi = (size_t)b * H * dk, vi = (size_t)b * H * dv, gi = (size_t)b * H;
        if (gdn)
            CHECK_OK(ops->gdn_decode(ctx, c.q + qi, c.k + qi, c.v + vi, c.g + gi, c.beta + gi, 1, H, dk, dv, scale, &Sa[b],
                                     oa + vi));
        else
            CHECK_OK(ops->gla_decode(ctx, c.q + qi, c.k + qi, c.v + vi, c.g + qi, 1, H, dk, dv, scale, &Sa[b], oa + vi));
        CHECK(!memcmp(Sa[b], Sb[b], SN * sizeof(float)));
    }
    CHECK(!memcmp(oa, ob, sizeof oa));
    for (int b = 0; b < B; b++) free(Sa[b]), free(Sb[b]);
    lin_free(&c);
}

/* ---------------------------------------------------------------- SSE */

static void test_sse_route(void) {
    int32_t idx[8];
    float w[8];
    /* all equal: the lowest indices, equal weights */
    float l0[4] = {0, 0, 0, 0};
    CHECK_OK(ops->sse_route(ctx, l0, 1, 4, 2, idx, w));
    CHECK(idx[0] == 0 && idx[1] == 1 && w[0] == 0.25f && w[1] == 0.25f);
    /* a tie between 1 and 2 for first place, then 3 */
    float l1[4] = {1, 3, 3, 2};
    CHECK_OK(ops->sse_route(ctx, l1, 1, 4, 3, idx, w));
    CHECK(idx[0] == 1 && idx[1] == 2 && idx[2] == 3 && w[0] == w[1] && w[1] > w[2]);
    /* two rows at once, a tie for second place between 0 and 3 */
    float l2[8] = {2, 5, -1, 2, 0, 0, 7, 0};
    CHECK_OK(ops->sse_route(ctx, l2, 2, 4, 2, idx, w));
    CHECK(idx[0] == 1 && idx[1] == 0 && idx[2] == 2 && idx[3] == 0);
    /* weights are the softmax (not renormalised): compare with double, rtol 1e-6 */
    double s = exp(2.0) * 2 + exp(5.0) + exp(-1.0);
    float ref[2] = {(float)(exp(5.0) / s), (float)(exp(2.0) / s)};
    CHECK_CLOSE(w, ref, 2, 0, 1e-6, "sse_route weights");
    CHECK(ops->sse_route(ctx, l2, 2, 4, 5, idx, w) == HYLA_ERR_INVALID_ARG);
}

typedef struct {
    hyla_sse_transition tr;
    int n, H, dk, dv, N, K;
    float *q1, *k1, *q2, *k2, *v, *ga, *gb, *ba, *bb;
    int32_t *idx;
    float *w;
    float *S0, *Sp; /* initial states */
} sse_case;

static sse_case sse_make(hyla_sse_transition tr, int n, int K) {
    sse_case c = {tr, n, 2, 8, 6, 4, K, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    int gdn = tr == HYLA_SSE_GDN, H = c.H, dk = c.dk, dv = c.dv, N = c.N;
    size_t rows = (size_t)n * H;
    c.q1 = gdn ? unit_rows(rows, dk) : randn(rows * dk, 0.5f);
    c.k1 = gdn ? unit_rows(rows, dk) : randn(rows * dk, 0.5f);
    c.q2 = gdn ? unit_rows(rows, dk) : randn(rows * dk, 0.5f);
    c.k2 = gdn ? unit_rows(rows, dk) : randn(rows * dk, 0.5f);
    c.v = randn(rows * dv, 1.0f);
    c.ga = gdn ? gdn_g(rows) : gla_gates(rows * dk);
    c.gb = gdn ? gdn_g(rows) : gla_gates(rows * dk);
    c.ba = gdn ? gdn_beta(rows) : NULL;
    c.bb = gdn ? gdn_beta(rows) : NULL;
    /* routing logits: partition N-1 far below the others, so nobody selects it */
    float *logits = randn((size_t)n * N, 2.0f);
    for (int t = 0; t < n; t++) logits[(size_t)t * N + N - 1] = -40.0f;
    c.idx = malloc((size_t)n * K * sizeof(int32_t));
    c.w = malloc((size_t)n * K * sizeof(float));
    CHECK_OK(ops->sse_route(ctx, logits, n, N, K, c.idx, c.w));
    free(logits);
    c.S0 = randn((size_t)H * dk * dv, 0.5f);
    c.Sp = randn((size_t)N * H * dk * dv, 0.5f);
    return c;
}
static void sse_free(sse_case *c) {
    free(c->q1), free(c->k1), free(c->q2), free(c->k2), free(c->v), free(c->ga), free(c->gb), free(c->ba), free(c->bb);
    free(c->idx), free(c->w), free(c->S0), free(c->Sp);
}

/* sse_prefill's window in sse_call */
static int sse_window = HYLA_SSE_PREFILL_WINDOW;

/* sse_prefill (B=0) or sse_decode (B=1) over tokens [t0, t0+m). */
static hyla_status sse_call(const sse_case *c, int decode, int t0, int m, float scale, float *S0, float *Sp, float *o) {
    int gdn = c->tr == HYLA_SSE_GDN;
    size_t qo = (size_t)t0 * c->H * c->dk, vo = (size_t)t0 * c->H * c->dv, go = gdn ? (size_t)t0 * c->H : qo;
    size_t bo = (size_t)t0 * c->H, io = (size_t)t0 * c->K;
    const float *ba = gdn ? c->ba + bo : NULL, *bb = gdn ? c->bb + bo : NULL;
    if (decode) {
        float *s0[1] = {S0}, *sp[1] = {Sp};
        return ops->sse_decode(ctx, c->tr, c->q1 + qo, c->k1 + qo, c->q2 + qo, c->k2 + qo, c->v + vo, c->ga + go,
                               c->gb + go, ba, bb, c->idx + io, c->w + io, 1, c->H, c->dk, c->dv, c->N, c->K, scale, s0,
                               sp, o + vo);
    }
    return ops->sse_prefill(ctx, c->tr, c->q1 + qo, c->k1 + qo, c->q2 + qo, c->k2 + qo, c->v + vo, c->ga + go,
                            c->gb + go, ba, bb, c->idx + io, c->w + io, m, c->H, c->dk, c->dv, c->N, c->K, scale,
                            sse_window, S0, Sp, o + vo);
}

static void test_sse(hyla_sse_transition tr, int K) {
    const char *name = tr == HYLA_SSE_GDN ? "sse(gdn)" : "sse(gla)";
    int gdn = tr == HYLA_SSE_GDN;
    int ns[] = {1, 7, 64, 100, 150};
    for (size_t z = 0; z < sizeof ns / sizeof ns[0]; z++) {
        int n = ns[z];
        sse_case c = sse_make(tr, n, K);
        int H = c.H, dk = c.dk, dv = c.dv, N = c.N;
        float scale = 1.0f / sqrtf((float)dk);
        size_t SH = (size_t)dk * dv, S0N = H * SH, SpN = N * S0N, ON = (size_t)n * H * dv;
        /* [SSE-2..4] in double */
        double *S0r = to_d(c.S0, S0N), *Spr = to_d(c.Sp, SpN), *orf = calloc(ON, sizeof(double));
        for (int t = 0; t < n; t++)
            for (int h = 0; h < H; h++) {
                size_t qi = ((size_t)t * H + h) * dk, vi = ((size_t)t * H + h) * dv, gi = (size_t)t * H + h;
                if (gdn)
                    gdn_step_d(c.q1 + qi, c.k1 + qi, c.v + vi, c.ga[gi], c.ba[gi], 1.0, dk, dv, scale, S0r + h * SH,
                               orf + vi);
                else
                    gla_step_d(c.q1 + qi, c.k1 + qi, c.v + vi, c.ga + qi, 1.0, dk, dv, scale, S0r + h * SH, orf + vi);
                for (int j = 0; j < K; j++) {
                    int i = c.idx[(size_t)t * K + j];
                    double wt = c.w[(size_t)t * K + j];
                    double *Si = Spr + ((size_t)i * H + h) * SH;
                    if (gdn)
                        gdn_step_d(c.q2 + qi, c.k2 + qi, c.v + vi, c.gb[gi], c.bb[gi], wt, dk, dv, scale, Si, orf + vi);
                    else
                        gla_step_d(c.q2 + qi, c.k2 + qi, c.v + vi, c.gb + qi, wt, dk, dv, scale, Si, orf + vi);
                }
            }
        float *o_ref = to_f(orf, ON), *S0_ref = to_f(S0r, S0N), *Sp_ref = to_f(Spr, SpN);
        /* decode loop */
        float *S0d = dup(c.S0, S0N), *Spd = dup(c.Sp, SpN), *od = malloc(ON * sizeof(float));
        for (int t = 0; t < n; t++) CHECK_OK(sse_call(&c, 1, t, 1, scale, S0d, Spd, od));
        /* prefill, one call */
        float *S0c = dup(c.S0, S0N), *Spc = dup(c.Sp, SpN), *oc = malloc(ON * sizeof(float));
        CHECK_OK(sse_call(&c, 0, 0, n, scale, S0c, Spc, oc));
        char what[96];
#define CMP(a, b, len, label)                                                    \
    do {                                                                         \
        snprintf(what, sizeof what, "%s K=%d n=%d %s", name, K, n, label);       \
        CHECK_CLOSE(a, b, len, ATOL, RTOL, what);                                \
    } while (0)
        CMP(od, o_ref, ON, "decode vs double: o");
        CMP(S0d, S0_ref, S0N, "decode vs double: S0");
        CMP(Spd, Sp_ref, SpN, "decode vs double: Sp");
        CMP(oc, od, ON, "prefill vs decode: o");
        CMP(S0c, S0d, S0N, "prefill vs decode: S0");
        CMP(Spc, Spd, SpN, "prefill vs decode: Sp");
#undef CMP
        /* the partition nobody selected is untouched, bit for bit */
        size_t last = (size_t)(N - 1) * S0N;
        CHECK_MSG(!memcmp(Spd + last, c.Sp + last, S0N * sizeof(float)), "%s n=%d: decode touched an unselected partition", name, n);
        CHECK_MSG(!memcmp(Spc + last, c.Sp + last, S0N * sizeof(float)), "%s n=%d: prefill touched an unselected partition", name, n);
        /* pieces of the window == one call, bit for bit, for windows of 64 and 128 (at K = 2 a
         * partition then holds more than 64 tokens of a window: chunks cut within it too) */
        for (int W = 64; W <= 128 && n > 64; W *= 2) {
            const int keep = sse_window;
            sse_window = W;
            float *S01 = dup(c.S0, S0N), *Sp1 = dup(c.Sp, SpN), *o1 = malloc(ON * sizeof(float));
            float *S02 = dup(c.S0, S0N), *Sp2 = dup(c.Sp, SpN), *o2 = malloc(ON * sizeof(float));
            CHECK_OK(sse_call(&c, 0, 0, n, scale, S01, Sp1, o1));
            for (int t0 = 0; t0 < n; t0 += W) CHECK_OK(sse_call(&c, 0, t0, n - t0 < W ? n - t0 : W, scale, S02, Sp2, o2));
            CHECK_MSG(!memcmp(S02, S01, S0N * sizeof(float)) && !memcmp(Sp2, Sp1, SpN * sizeof(float)) &&
                          !memcmp(o2, o1, ON * sizeof(float)),
                      "%s n=%d: prefill in %d-token pieces differs from one call at window %d", name, n, W, W);
            snprintf(what, sizeof what, "%s K=%d n=%d window %d: prefill vs decode", name, K, n, W);
            CHECK_CLOSE(o1, od, ON, ATOL, RTOL, what);
            sse_window = keep;
            free(S01), free(Sp1), free(o1), free(S02), free(Sp2), free(o2);
        }
        /* a window that is no multiple of 64 is refused */
        {
            const int keep = sse_window;
            sse_window = 100;
            CHECK(sse_call(&c, 0, 0, n, scale, S0c, Spc, oc) == HYLA_ERR_INVALID_ARG);
            sse_window = keep;
        }
        free(S0r), free(Spr), free(orf), free(o_ref), free(S0_ref), free(Sp_ref);
        free(S0d), free(Spd), free(od), free(S0c), free(Spc), free(oc);
        sse_free(&c);
    }
}

/* A duplicate or out-of-range partition index is refused. */
static void test_sse_errors(void) {
    sse_case c = sse_make(HYLA_SSE_GLA, 2, 2);
    float o[2 * 2 * 6];
    c.idx[1] = c.idx[0];
    CHECK(sse_call(&c, 0, 0, 2, 0.3f, c.S0, c.Sp, o) == HYLA_ERR_INVALID_ARG);
    c.idx[1] = 4;
    CHECK(sse_call(&c, 1, 0, 1, 0.3f, c.S0, c.Sp, o) == HYLA_ERR_INVALID_ARG);
    sse_free(&c);
}

/* ---------------------------------------------------------------- attention */

typedef struct {
    int n_pages, pt, Hk, D;
    void **k, **v;
    hyla_kv_view view;
} kv_cache;

static kv_cache kv_make(int n_pages, int pt, int Hk, int D) {
    kv_cache c = {n_pages, pt, Hk, D, calloc((size_t)n_pages, sizeof(void *)), calloc((size_t)n_pages, sizeof(void *)),
                  {0}};
    for (int p = 0; p < n_pages; p++) {
        CHECK_OK(ops->alloc(ctx, (size_t)pt * Hk * D * sizeof(float), &c.k[p]));
        CHECK_OK(ops->alloc(ctx, (size_t)pt * Hk * D * sizeof(float), &c.v[p]));
    }
    c.view = (hyla_kv_view){.k_pages = c.k, .v_pages = c.v, .n_pages = n_pages, .page_tokens = pt};
    return c;
}
static void kv_free(kv_cache *c) {
    for (int p = 0; p < c->n_pages; p++) ops->free(ctx, c->k[p]), ops->free(ctx, c->v[p]);
    free(c->k), free(c->v);
}

/* [ATTN-2] in double from the full k, v arrays [T][Hk][D]. */
static void attn_ref(const float *q, const float *k, const float *v, int T, int Hq, int Hk, int D, int window,
                     double scale, float *o) {
    double *s = malloc((size_t)T * sizeof(double));
    for (int p = 0; p < T; p++)
        for (int h = 0; h < Hq; h++) {
            int kh = h / (Hq / Hk), lo = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
            const float *qr = q + ((size_t)p * Hq + h) * D;
            double m = -INFINITY, sum = 0;
            for (int j = lo; j <= p; j++) {
                double d = 0;
                for (int x = 0; x < D; x++) d += (double)qr[x] * k[((size_t)j * Hk + kh) * D + x];
                s[j] = d * scale;
                m = fmax(m, s[j]);
            }
            for (int j = lo; j <= p; j++) sum += exp(s[j] - m);
            for (int x = 0; x < D; x++) {
                double a = 0;
                for (int j = lo; j <= p; j++) a += exp(s[j] - m) / sum * v[((size_t)j * Hk + kh) * D + x];
                o[((size_t)p * Hq + h) * D + x] = (float)a;
            }
        }
    free(s);
}

/* Prefill in two calls (10 + 13 tokens) == decode loop, bit for bit; both against double
 * (softmax weights and fp32 dot products of length 8: atol 1e-5 + rtol 1e-4); GQA 4/2; pages
 * of 4 tokens; the new k/v land in the pages; a batch of 2 decodes == each alone. */
static void test_attention(int window) {
    int T = 23, Hq = 4, Hk = 2, D = 8, pt = 4, NP = 8;
    float scale = 1.0f / sqrtf((float)D);
    float *q = randn((size_t)T * Hq * D, 1.5f), *k = randn((size_t)T * Hk * D, 1.5f), *v = randn((size_t)T * Hk * D, 1.0f);
    float *ref = malloc((size_t)T * Hq * D * sizeof(float));
    attn_ref(q, k, v, T, Hq, Hk, D, window, scale, ref);
    kv_cache a = kv_make(NP, pt, Hk, D), b = kv_make(NP, pt, Hk, D), c2 = kv_make(NP, pt, Hk, D);
    float *op = malloc((size_t)T * Hq * D * sizeof(float)), *od = malloc((size_t)T * Hq * D * sizeof(float));
    CHECK_OK(ops->attn_prefill(ctx, q, k, v, 10, Hq, Hk, D, 0, &a.view, window, scale, op));
    CHECK_OK(ops->attn_prefill(ctx, q + 10 * Hq * D, k + 10 * Hk * D, v + 10 * Hk * D, T - 10, Hq, Hk, D, 10, &a.view,
                               window, scale, op + 10 * Hq * D));
    /* other session of the batch: its own random sequence */
    float *q2 = randn((size_t)T * Hq * D, 1.0f), *k2 = randn((size_t)T * Hk * D, 1.0f), *v2 = randn((size_t)T * Hk * D, 1.0f);
    for (int t = 0; t < T; t++) {
        int32_t pos = t;
        CHECK_OK(ops->attn_decode(ctx, q + (size_t)t * Hq * D, k + (size_t)t * Hk * D, v + (size_t)t * Hk * D, 1, Hq,
                                  Hk, D, &pos, &b.view, window, scale, od + (size_t)t * Hq * D));
    }
    /* batch: sessions (other, this) at positions (t, t) */
    float *obat = malloc((size_t)2 * Hq * D * sizeof(float));
    int batch_same = 1;
    kv_cache other = kv_make(NP, pt, Hk, D);
    for (int t = 0; t < T; t++) {
        float qb[2 * 4 * 8], kb[2 * 2 * 8], vb[2 * 2 * 8];
        memcpy(qb, q2 + (size_t)t * Hq * D, Hq * D * sizeof(float));
        memcpy(qb + Hq * D, q + (size_t)t * Hq * D, Hq * D * sizeof(float));
        memcpy(kb, k2 + (size_t)t * Hk * D, Hk * D * sizeof(float));
        memcpy(kb + Hk * D, k + (size_t)t * Hk * D, Hk * D * sizeof(float));
        memcpy(vb, v2 + (size_t)t * Hk * D, Hk * D * sizeof(float));
        memcpy(vb + Hk * D, v + (size_t)t * Hk * D, Hk * D * sizeof(float));
        int32_t pos[2] = {t, t};
        hyla_kv_view views[2] = {other.view, c2.view};
        CHECK_OK(ops->attn_decode(ctx, qb, kb, vb, 2, Hq, Hk, D, pos, views, window, scale, obat));
        if (memcmp(obat + Hq * D, od + (size_t)t * Hq * D, Hq * D * sizeof(float))) batch_same = 0;
    }
    CHECK_MSG(batch_same, "attention window=%d: batched decode differs from decode alone", window);
    char what[64];
    snprintf(what, sizeof what, "attn window=%d prefill vs double", window);
    CHECK_CLOSE(op, ref, (size_t)T * Hq * D, 1e-5, 1e-4, what);
    CHECK_MSG(!memcmp(op, od, (size_t)T * Hq * D * sizeof(float)), "attention window=%d: prefill != decode loop", window);
    /* the cache holds the keys and values where [ATTN-2] says */
    for (int t = 0; t < T; t++) {
        const float *kr = (const float *)a.k[t / pt] + (size_t)(t % pt) * Hk * D;
        const float *vr = (const float *)a.v[t / pt] + (size_t)(t % pt) * Hk * D;
        CHECK(!memcmp(kr, k + (size_t)t * Hk * D, Hk * D * sizeof(float)));
        CHECK(!memcmp(vr, v + (size_t)t * Hk * D, Hk * D * sizeof(float)));
    }
    kv_free(&a), kv_free(&b), kv_free(&c2), kv_free(&other);
    free(q), free(k), free(v), free(ref), free(op), free(od), free(q2), free(k2), free(v2), free(obat);
}

/* Window 5: with q = 0 every visible key scores the same, so the output is the mean of the
 * visible values; with v_j = e_j (one-hot at position j) the output shows exactly which
 * positions were visible: 1/|W| on [max(0,p-4), p], 0 elsewhere. Then pages wholly below
 * the window may be freed (NULL), and a page the window needs may not. */
static void test_window_boundary(void) {
    int T = 16, D = 16, pt = 4, NP = 4, W = 5;
    float *q = calloc((size_t)T * D, sizeof(float)), *k = randn((size_t)T * D, 1.0f);
    float *v = calloc((size_t)T * D, sizeof(float)), *o = malloc((size_t)T * D * sizeof(float));
    for (int j = 0; j < T; j++) v[j * D + j] = 1.0f;
    kv_cache c = kv_make(NP, pt, 1, D);
    CHECK_OK(ops->attn_prefill(ctx, q, k, v, T, 1, 1, D, 0, &c.view, W, 1.0f, o));
    for (int p = 0; p < T; p++) {
        int lo = p - W + 1 > 0 ? p - W + 1 : 0, cnt = p - lo + 1;
        for (int x = 0; x < D; x++) {
            float want = x >= lo && x <= p ? 1.0f / cnt : 0.0f;
            CHECK_MSG(fabsf(o[p * D + x] - want) <= 1e-6f, "window: p=%d position %d weight %g, expected %g", p, x,
                      o[p * D + x], want);
        }
    }
    /* decode at p = 12 (window 8..12) with pages 0 and 1 (positions 0..7) freed */
    void *k0 = c.k[0], *k1 = c.k[1], *v0 = c.v[0], *v1 = c.v[1];
    c.k[0] = c.k[1] = c.v[0] = c.v[1] = NULL;
    int32_t pos = 12;
    float ob[16];
    CHECK_OK(ops->attn_decode(ctx, q, k + 12 * D, v + 12 * D, 1, 1, 1, D, &pos, &c.view, W, 1.0f, ob));
    CHECK(!memcmp(ob, o + 12 * D, D * sizeof(float)));
    /* p = 11 sees 7..11: page 1 is needed */
    pos = 11;
    CHECK(ops->attn_decode(ctx, q, k + 11 * D, v + 11 * D, 1, 1, 1, D, &pos, &c.view, W, 1.0f, ob) == HYLA_ERR_INVALID_ARG);
    /* beyond capacity (4 pages of 4) */
    pos = 16;
    CHECK(ops->attn_decode(ctx, q, k, v, 1, 1, 1, D, &pos, &c.view, W, 1.0f, ob) == HYLA_ERR_RESOURCE);
    c.k[0] = k0, c.k[1] = k1, c.v[0] = v0, c.v[1] = v1;
    kv_free(&c);
    free(q), free(k), free(v), free(o);
}

/* The thread count changes no bit: SSE prefill (which runs the GLA/GDN chunk routines) and
 * attention prefill with 1 and 3 threads against the shared 2-thread backend. */
static void test_thread_invariance(void) {
    int nts[2] = {1, 3};
    for (int z = 0; z < 2; z++) {
        hyla_backend *b2 = NULL;
        CHECK_OK(hyla_cpu_backend_create(nts[z], &b2));
        if (!b2) return;
        for (int tr = 0; tr < 2; tr++) {
            sse_case c = sse_make((hyla_sse_transition)tr, 100, 2);
            size_t S0N = (size_t)c.H * c.dk * c.dv, SpN = c.N * S0N, ON = (size_t)c.n * c.H * c.dv;
            float *S0a = dup(c.S0, S0N), *Spa = dup(c.Sp, SpN), *oa = malloc(ON * sizeof(float));
            float *S0b = dup(c.S0, S0N), *Spb = dup(c.Sp, SpN), *ob = malloc(ON * sizeof(float));
            CHECK_OK(sse_call(&c, 0, 0, c.n, 0.3f, S0a, Spa, oa));
            const hyla_ops *keep = ops;
            void *keep_ctx = ctx;
            ops = b2->ops, ctx = b2->ctx;
            CHECK_OK(sse_call(&c, 0, 0, c.n, 0.3f, S0b, Spb, ob));
            ops = keep, ctx = keep_ctx;
            CHECK_MSG(!memcmp(oa, ob, ON * sizeof(float)) && !memcmp(S0a, S0b, S0N * sizeof(float)) &&
                          !memcmp(Spa, Spb, SpN * sizeof(float)),
                      "sse transition %d: %d threads differ from 2", tr, nts[z]);
            free(S0a), free(Spa), free(oa), free(S0b), free(Spb), free(ob);
            sse_free(&c);
        }
        int T = 40, Hq = 4, Hk = 2, D = 8;
        float *q = randn((size_t)T * Hq * D, 1.0f), *k = randn((size_t)T * Hk * D, 1.0f), *v = randn((size_t)T * Hk * D, 1.0f);
        float *oa = malloc((size_t)T * Hq * D * sizeof(float)), *ob = malloc((size_t)T * Hq * D * sizeof(float));
        kv_cache ka = kv_make(10, 4, Hk, D), kb = kv_make(10, 4, Hk, D);
        CHECK_OK(ops->attn_prefill(ctx, q, k, v, T, Hq, Hk, D, 0, &ka.view, 0, 0.35f, oa));
        CHECK_OK(b2->ops->attn_prefill(b2->ctx, q, k, v, T, Hq, Hk, D, 0, &kb.view, 0, 0.35f, ob));
        CHECK_MSG(!memcmp(oa, ob, (size_t)T * Hq * D * sizeof(float)), "attention: %d threads differ from 2", nts[z]);
        kv_free(&ka), kv_free(&kb);
        free(q), free(k), free(v), free(oa), free(ob);
        hyla_backend_destroy(b2);
    }
}

int main(void) {
    hyla_rng_seed(&rng, 4321);
    CHECK_OK(hyla_cpu_backend_create(2, &be));
    if (!be) return hyla_test_done("test_cpu_mixers");
    ops = be->ops;
    ctx = be->ctx;
    test_linear_mixer(0);
    test_linear_mixer(1);
    test_decode_batch(0);
    test_decode_batch(1);
    test_sse_route();
    test_sse(HYLA_SSE_GLA, 1);
    test_sse(HYLA_SSE_GLA, 2);
    test_sse(HYLA_SSE_GDN, 1);
    test_sse(HYLA_SSE_GDN, 2);
    test_sse_errors();
    test_attention(0);
    test_attention(5);
    test_window_boundary();
    test_thread_invariance();
    hyla_backend_destroy(be);
    return hyla_test_done("test_cpu_mixers");
}
