/* test_cpu_ops.c — the dense ops and sampling of the CPU reference backend (kernels/cpu/)
 * against naive double-precision references written here from docs/MODELS.md, plus the
 * properties the engine relies on: `linear` batch invariance (row r of an M=37 call equals
 * an M=1 call bit for bit, and the thread count changes no bit), short_conv continuation across calls, sampling determinism and
 * the exact top-k / top-p / inverse-CDF rules of [SAMPLE-1]; the fused output projections'
 * accumulate (HYLA_LINEAR_ACC == the op then add, bit for bit); host buffers and the deferred
 * capture (copies performed at capture_end, done 0 then 1).
 *
 * Tolerances are stated per op. The backend computes in fp32 (reductions in double), the
 * references in double, so an elementwise op is within a few fp32 ulps (rtol ~1e-6) and a
 * length-K dot product within ~K·2^-24 of the sum of |terms|. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_ops.h"
#include "hyla_test.h"

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

static double silu_d(double x) { return x / (1.0 + exp(-x)); }

/* ---------------------------------------------------------------- weights, embed, linear */

static void test_weights_embed(void) {
    int V = 11, D = 6;
    float *t = randn((size_t)V * D, 1.0f);
    uint16_t *tb = malloc((size_t)V * D * 2);
    hyla_from_f32(tb, HYLA_DT_BF16, t, (size_t)V * D);
    hyla_weight *w32 = NULL, *wb = NULL, *bad = NULL;
    CHECK_OK(ops->weight_create(ctx, t, HYLA_DT_F32, V, D, &w32));
    CHECK_OK(ops->weight_create(ctx, tb, HYLA_DT_BF16, V, D, &wb));
    CHECK(ops->weight_create(ctx, t, HYLA_DT_I32, V, D, &bad) == HYLA_ERR_UNSUPPORTED && !bad);
    int32_t ids[4] = {3, 0, 10, 3};
    float out[4 * 6], outb[4 * 6];
    CHECK_OK(ops->embed(ctx, w32, ids, 4, out));
    CHECK_OK(ops->embed(ctx, wb, ids, 4, outb));
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < D; j++) {
            CHECK(out[i * D + j] == t[ids[i] * D + j]); /* a copy: exact */
            CHECK(outb[i * D + j] == hyla_bf16_to_f32(tb[ids[i] * D + j]));
        }
    int32_t bad_ids[2] = {1, 11};
    CHECK(ops->embed(ctx, w32, bad_ids, 2, out) == HYLA_ERR_INVALID_ARG);
    ops->weight_destroy(ctx, w32);
    ops->weight_destroy(ctx, wb);
    ops->weight_destroy(ctx, NULL);
    free(t);
    free(tb);
}

/* y = x Wᵀ + bias (+y) against a double reference. Tolerance: inputs N(0,1), W N(0,1/K), so
 * |y| ~ 1 and the fp32 sum of K terms is within ~sqrt(K)·2^-24·Σ|terms| typically and
 * K·2^-24·Σ|terms| at worst: atol 1e-4 + rtol 1e-4 holds for K <= ~2000 with a wide margin. */
static void test_linear_reference(void) {
    int shapes[][3] = {{5, 7, 3}, {37, 64, 48}, {20, 300, 1100}, {3, 33, 2050}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        int ldx = K + 3, ldy = N + 2;
        float *x = randn((size_t)M * ldx, 1.0f), *W = randn((size_t)N * K, 1.0f / sqrtf((float)K));
        float *bias = randn((size_t)N, 1.0f), *y0 = randn((size_t)M * ldy, 1.0f);
        float *y = dup(y0, (size_t)M * ldy), *ya = dup(y0, (size_t)M * ldy);
        float *ref = malloc((size_t)M * N * sizeof(float)), *refa = malloc((size_t)M * N * sizeof(float));
        float *got = malloc((size_t)M * N * sizeof(float)), *gota = malloc((size_t)M * N * sizeof(float));
        hyla_weight *w;
        CHECK_OK(ops->weight_create(ctx, W, HYLA_DT_F32, N, K, &w));
        CHECK_OK(ops->linear(ctx, x, ldx, M, K, w, bias, y, ldy, N, 0));
        CHECK_OK(ops->linear(ctx, x, ldx, M, K, w, NULL, ya, ldy, N, 1));
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) {
                double acc = 0;
                for (int k = 0; k < K; k++) acc += (double)x[(size_t)m * ldx + k] * W[(size_t)n * K + k];
                ref[m * N + n] = (float)(acc + bias[n]);
                refa[m * N + n] = (float)(acc + y0[(size_t)m * ldy + n]);
                got[m * N + n] = y[(size_t)m * ldy + n];
                gota[m * N + n] = ya[(size_t)m * ldy + n];
            }
        CHECK_CLOSE(got, ref, (size_t)M * N, 1e-4, 1e-4, "linear + bias");
        CHECK_CLOSE(gota, refa, (size_t)M * N, 1e-4, 1e-4, "linear accumulate");
        /* the padding columns of y (ldy > N) are untouched */
        for (int m = 0; m < M; m++)
            for (int n = N; n < ldy; n++) CHECK(y[(size_t)m * ldy + n] == y0[(size_t)m * ldy + n]);
        hyla_weight *wrong;
        CHECK_OK(ops->weight_create(ctx, W, HYLA_DT_F32, N, K, &wrong));
        CHECK(ops->linear(ctx, x, ldx, M, K + 1, wrong, NULL, y, ldy, N, 0) == HYLA_ERR_INVALID_ARG);
        ops->weight_destroy(ctx, wrong);
        ops->weight_destroy(ctx, w);
        free(x), free(W), free(bias), free(y0), free(y), free(ya), free(ref), free(refa), free(got), free(gota);
    }
}

/* Batch invariance: row r of one call over M rows equals the same row computed alone (M=1)
 * and inside other batch sizes, bit for bit. Exact comparison (memcmp): this is the property
 * that lets a session decoded alone and in a batch produce the same tokens. */
static void test_linear_batch_invariance(void) {
    int shapes[][2] = {{7, 5}, {64, 48}, {300, 1100}, {33, 2050}, {1000, 64}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int N = shapes[s][0], K = shapes[s][1], M = 37;
        float *x = randn((size_t)M * K, 1.0f), *W = randn((size_t)N * K, 1.0f / sqrtf((float)K));
        float *bias = randn((size_t)N, 0.5f);
        float *yM = malloc((size_t)M * N * sizeof(float)), *y1 = malloc((size_t)N * sizeof(float));
        float *yS = malloc((size_t)M * N * sizeof(float));
        hyla_weight *w;
        CHECK_OK(ops->weight_create(ctx, W, HYLA_DT_F32, N, K, &w));
        CHECK_OK(ops->linear(ctx, x, K, M, K, w, bias, yM, N, N, 0));
        int mismatches = 0;
        for (int r = 0; r < M; r++) {
            CHECK_OK(ops->linear(ctx, x + (size_t)r * K, K, 1, K, w, bias, y1, N, N, 0));
            if (memcmp(y1, yM + (size_t)r * N, (size_t)N * sizeof(float))) mismatches++;
        }
        CHECK_MSG(mismatches == 0, "N=%d K=%d: %d of %d rows differ between M=1 and M=%d", N, K, mismatches, M, M);
        /* another thread count: the same bits */
        hyla_backend *be3 = NULL;
        CHECK_OK(hyla_cpu_backend_create(3, &be3));
        if (be3) {
            hyla_weight *w3;
            CHECK_OK(be3->ops->weight_create(be3->ctx, W, HYLA_DT_F32, N, K, &w3));
            CHECK_OK(be3->ops->linear(be3->ctx, x, K, M, K, w3, bias, yS, N, N, 0));
            CHECK_MSG(!memcmp(yS, yM, (size_t)M * N * sizeof(float)), "N=%d K=%d: 3 threads differ from 2", N, K);
            be3->ops->weight_destroy(be3->ctx, w3);
            hyla_backend_destroy(be3);
        }
        /* other batch sizes and offsets: rows 5.. as batches of 3, 16 and 17 */
        int sizes[] = {3, 16, 17, 32};
        for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++) {
            int Mb = sizes[z];
            CHECK_OK(ops->linear(ctx, x + 5 * (size_t)K, K, Mb, K, w, bias, yS, N, N, 0));
            CHECK_MSG(!memcmp(yS, yM + 5 * (size_t)N, (size_t)Mb * N * sizeof(float)),
                      "N=%d K=%d: rows 5..%d differ between M=%d and M=%d", N, K, 5 + Mb - 1, Mb, M);
        }
        ops->weight_destroy(ctx, w);
        free(x), free(W), free(bias), free(yM), free(y1), free(yS);
    }
}

/* linear_multi with outputs of their own x (hyla_linear_out.x) == the linear of each output's
 * rows, bit for bit, decode and prompt rows, with and without accumulate (the call's and the
 * outputs' own, hyla_linear_out.acc); own x with bf16 rows
 * is refused by name. */
static void test_linear_multi_own_x(void) {
    const int M = 5, K = 24, Ns[3] = {7, 16, 9};
    float *xs[2] = {randn((size_t)M * K, 1.0f), randn((size_t)M * K, 1.0f)};
    hyla_weight *w[3];
    float *W[3], *y0[3], *one[3], *grp[3];
    for (int i = 0; i < 3; i++) {
        W[i] = randn((size_t)Ns[i] * K, 0.2f);
        CHECK_OK(ops->weight_create(ctx, W[i], HYLA_DT_F32, Ns[i], K, &w[i]));
        y0[i] = randn((size_t)M * Ns[i], 1.0f);
        one[i] = malloc((size_t)M * Ns[i] * sizeof(float));
        grp[i] = malloc((size_t)M * Ns[i] * sizeof(float));
    }
    const int xi[3] = {0, 1, 1}, oacc[3] = {1, 0, 1}; /* oacc: with pa, the outputs' own accumulate */
    for (int fl = 0; fl < 2; fl++)
        for (int acc = 0; acc < 2; acc++)
        for (int pa = 0; pa < 2; pa++) {
            hyla_linear_out outs[3];
            for (int i = 0; i < 3; i++) {
                const int oa = pa && oacc[i];
                memcpy(one[i], y0[i], (size_t)M * Ns[i] * sizeof(float));
                memcpy(grp[i], y0[i], (size_t)M * Ns[i] * sizeof(float));
                hyla_linear_out lo = {w[i], NULL, one[i], Ns[i], Ns[i], NULL, 0};
                CHECK_OK(ops->linear_multi(ctx, xs[xi[i]], K, M, K, 1, &lo, acc || oa, fl ? HYLA_LINEAR_PREFILL : 0));
                outs[i] = (hyla_linear_out){w[i], NULL, grp[i], Ns[i], Ns[i], xi[i] ? xs[1] : NULL, oa};
            }
            CHECK_OK(ops->linear_multi(ctx, xs[0], K, M, K, 3, outs, acc, fl ? HYLA_LINEAR_PREFILL : 0));
            for (int i = 0; i < 3; i++)
                CHECK_MSG(!memcmp(one[i], grp[i], (size_t)M * Ns[i] * sizeof(float)),
                          "linear_multi with own x, output %d%s%s%s: differs from its own call", i,
                          fl ? " (prompt rows)" : "", acc ? " (accumulate)" : "", pa && oacc[i] ? " (its own accumulate)" : "");
            if (fl && !acc && !pa) {
                hyla_status st = ops->linear_multi(ctx, xs[0], K, M, K, 3, outs, 0, HYLA_LINEAR_PREFILL | HYLA_LINEAR_X_BF16);
                CHECK(st == HYLA_ERR_INVALID_ARG);
                CHECK_MSG(strstr(hyla_last_error(), "own x") != NULL, "own x with bf16 rows: %s", hyla_last_error());
            }
        }
    for (int i = 0; i < 3; i++) {
        ops->weight_destroy(ctx, w[i]);
        free(W[i]), free(y0[i]), free(one[i]), free(grp[i]);
    }
    free(xs[0]), free(xs[1]);
}

/* ---------------------------------------------------------------- norms and pointwise ops */

/* Norms: the backend's rsqrt factor is exact to fp32 rounding (sum in double), the products
 * are 2 fp32 roundings: rtol 1e-6 plus atol 1e-7 for values near zero. */
static void test_norms(void) {
    int n = 5, D = 96;
    float eps = 1e-6f;
    float *x = randn((size_t)n * D, 2.0f), *w = randn((size_t)D, 1.0f), *g = randn((size_t)n * D, 2.0f);
    float *res0 = randn((size_t)n * D, 1.0f);
    float *y = malloc((size_t)n * D * sizeof(float)), *ref = malloc((size_t)n * D * sizeof(float));
    float *refg = malloc((size_t)n * D * sizeof(float)), *refa = malloc((size_t)n * D * sizeof(float));
    float *refres = malloc((size_t)n * D * sizeof(float));
    for (int i = 0; i < n; i++) {
        double ss = 0, ssa = 0;
        for (int j = 0; j < D; j++) {
            double xa = (double)res0[i * D + j] + x[i * D + j];
            ss += (double)x[i * D + j] * x[i * D + j];
            ssa += (float)xa * (double)(float)xa;
            refres[i * D + j] = (float)xa;
        }
        double r = 1.0 / sqrt(ss / D + eps), ra = 1.0 / sqrt(ssa / D + eps);
        for (int j = 0; j < D; j++) {
            ref[i * D + j] = (float)(x[i * D + j] * r * w[j]);
            refg[i * D + j] = (float)(x[i * D + j] * r * w[j] * silu_d(g[i * D + j]));
            refa[i * D + j] = (float)(refres[i * D + j] * ra * w[j]);
        }
    }
    CHECK_OK(ops->rmsnorm(ctx, x, w, y, n, D, eps));
    CHECK_CLOSE(y, ref, (size_t)n * D, 1e-7, 1e-6, "rmsnorm");
    float *xa = dup(x, (size_t)n * D); /* in place (y aliases x) */
    CHECK_OK(ops->rmsnorm(ctx, xa, w, xa, n, D, eps));
    CHECK(!memcmp(xa, y, (size_t)n * D * sizeof(float)));
    CHECK_OK(ops->gated_rmsnorm(ctx, x, g, w, y, n, D, eps));
    CHECK_CLOSE(y, refg, (size_t)n * D, 1e-7, 1e-6, "gated_rmsnorm");
    CHECK_OK(ops->gated_rmsnorm(ctx, x, NULL, w, y, n, D, eps));
    CHECK_CLOSE(y, ref, (size_t)n * D, 1e-7, 1e-6, "gated_rmsnorm without gate");
    float *res = dup(res0, (size_t)n * D);
    CHECK_OK(ops->add_rmsnorm(ctx, res, x, w, y, n, D, eps));
    CHECK(!memcmp(res, refres, (size_t)n * D * sizeof(float))); /* one fp32 add: exact */
    CHECK_CLOSE(y, refa, (size_t)n * D, 1e-7, 1e-6, "add_rmsnorm");
    free(x), free(w), free(g), free(res0), free(y), free(ref), free(refg), free(refa), free(refres), free(xa),
        free(res);
}

/* Pointwise ops: one expf/log1pf (a few ulps) and a few roundings: rtol 1e-6, atol 1e-7. */
static void test_pointwise(void) {
    size_t n = 1000;
    float *a = randn(n, 4.0f), *b = randn(n, 1.0f);
    a[0] = 90.0f, a[1] = -90.0f, a[2] = 0.0f; /* saturated and zero inputs */
    float *y = malloc(n * sizeof(float)), *ref = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) ref[i] = (float)(silu_d(a[i]) * b[i]);
    CHECK_OK(ops->swiglu(ctx, a, b, y, n));
    CHECK_CLOSE(y, ref, n, 1e-7, 1e-6, "swiglu");
    float *s = dup(a, n);
    CHECK_OK(ops->swiglu(ctx, s, b, s, n)); /* out aliases gate */
    CHECK(!memcmp(s, y, n * sizeof(float)));
    memcpy(s, a, n * sizeof(float));
    for (size_t i = 0; i < n; i++) ref[i] = (float)silu_d(a[i]);
    CHECK_OK(ops->silu(ctx, s, n));
    CHECK_CLOSE(s, ref, n, 1e-7, 1e-6, "silu");
    memcpy(y, b, n * sizeof(float));
    CHECK_OK(ops->add(ctx, y, a, n));
    for (size_t i = 0; i < n; i++) CHECK(y[i] == b[i] + a[i]);
    /* gla_gate: logsigmoid(x)/16, then clamp */
    float clamps[2] = {-INFINITY, -0.25f};
    for (int c = 0; c < 2; c++) {
        memcpy(s, a, n * sizeof(float));
        for (size_t i = 0; i < n; i++) {
            double ls = -log1p(exp(-(double)a[i]));
            if (a[i] < -30) ls = a[i] - log1p(exp((double)a[i]));
            ref[i] = (float)fmax(ls / 16.0, clamps[c]);
        }
        CHECK_OK(ops->gla_gate(ctx, s, n, 16.0f, clamps[c]));
        CHECK_CLOSE(s, ref, n, 1e-7, 1e-6, c ? "gla_gate clamp" : "gla_gate");
        for (size_t i = 0; i < n; i++) CHECK(s[i] <= 0.0f && s[i] >= clamps[c]);
    }
    free(a), free(b), free(y), free(ref), free(s);
}

/* softmax and l2norm rows: sums in double, one exp and one division per element: rtol 1e-6. */
static void test_rows(void) {
    int rows = 70, cols = 33;
    float *x = randn((size_t)rows * cols, 5.0f), *ref = malloc((size_t)rows * cols * sizeof(float));
    x[0] = 1000.0f; /* max subtraction keeps this finite */
    float *s = dup(x, (size_t)rows * cols);
    for (int r = 0; r < rows; r++) {
        double m = -INFINITY, sum = 0;
        for (int c = 0; c < cols; c++) m = fmax(m, x[r * cols + c]);
        for (int c = 0; c < cols; c++) sum += exp(x[r * cols + c] - m);
        for (int c = 0; c < cols; c++) ref[r * cols + c] = (float)(exp(x[r * cols + c] - m) / sum);
    }
    CHECK_OK(ops->softmax_rows(ctx, s, rows, cols));
    CHECK_CLOSE(s, ref, (size_t)rows * cols, 1e-9, 1e-6, "softmax_rows");
    memcpy(s, x, (size_t)rows * cols * sizeof(float));
    for (int r = 0; r < rows; r++) {
        double ss = 0;
        for (int c = 0; c < cols; c++) ss += (double)x[r * cols + c] * x[r * cols + c];
        for (int c = 0; c < cols; c++) ref[r * cols + c] = (float)(x[r * cols + c] / sqrt(ss + 1e-6));
    }
    CHECK_OK(ops->l2norm_rows(ctx, s, rows, cols, 1e-6f));
    CHECK_CLOSE(s, ref, (size_t)rows * cols, 1e-7, 1e-6, "l2norm_rows");
    free(x), free(ref), free(s);
}

/* swiglu_linear and gated_rmsnorm_linear with HYLA_LINEAR_ACC (the runtime's residual added by
 * the output projections of prompt rows): y0 + the result, bit for bit the op into a fresh y then
 * add, with and without HYLA_LINEAR_PREFILL. */
static void test_fused_acc(void) {
    const int M = 5, K = 48, N = 24, H = 3, D = 16;
    float *W = randn((size_t)N * K, 0.2f), *y0 = randn((size_t)M * N, 1.0f);
    hyla_weight *w = NULL;
    CHECK_OK(ops->weight_create(ctx, W, HYLA_DT_F32, N, K, &w));
    for (int fl = 0; fl < 2; fl++) {
        const int flags = fl ? HYLA_LINEAR_PREFILL : 0;
        float *g = randn((size_t)M * K, 1.0f), *u = randn((size_t)M * K, 1.0f), *nw = randn(D, 1.0f);
        float *g1 = dup(g, (size_t)M * K), *t = malloc((size_t)M * N * sizeof(float)), *ya = dup(y0, (size_t)M * N);
        CHECK_OK(ops->swiglu_linear(ctx, g1, u, M, K, w, t, N, flags));
        CHECK_OK(ops->swiglu_linear(ctx, g, u, M, K, w, ya, N, flags | HYLA_LINEAR_ACC));
        float *yb = dup(y0, (size_t)M * N);
        CHECK_OK(ops->add(ctx, yb, t, (size_t)M * N));
        CHECK_MSG(!memcmp(ya, yb, (size_t)M * N * sizeof(float)), "swiglu_linear%s HYLA_LINEAR_ACC == the op then add",
                  fl ? " (prompt rows)" : "");
        float *o = randn((size_t)M * K, 1.0f), *o1 = dup(o, (size_t)M * K);
        memcpy(ya, y0, (size_t)M * N * sizeof(float));
        memcpy(yb, y0, (size_t)M * N * sizeof(float));
        CHECK_OK(ops->gated_rmsnorm_linear(ctx, o1, u, nw, H, D, 1e-6f, M, w, t, N, flags));
        CHECK_OK(ops->gated_rmsnorm_linear(ctx, o, u, nw, H, D, 1e-6f, M, w, ya, N, flags | HYLA_LINEAR_ACC));
        CHECK_OK(ops->add(ctx, yb, t, (size_t)M * N));
        CHECK_MSG(!memcmp(ya, yb, (size_t)M * N * sizeof(float)),
                  "gated_rmsnorm_linear%s HYLA_LINEAR_ACC == the op then add", fl ? " (prompt rows)" : "");
        free(g), free(u), free(nw), free(g1), free(t), free(ya), free(yb), free(o), free(o1);
    }
    ops->weight_destroy(ctx, w);
    free(W), free(y0);
}

/* [GDN-1] gates, computed in double and rounded once: rtol 1e-6. Also the aliased layout the
 * runtime uses: a and b are the two halves of one [n][2H] projection, g and beta overwrite it. */
static void test_gdn_gates(void) {
    int n = 9, H = 5;
    float *ab = randn((size_t)n * 2 * H, 3.0f), *A_log = randn((size_t)H, 1.0f), *dtb = randn((size_t)H, 1.0f);
    ab[0] = 50.0f, ab[1] = -50.0f;
    for (int neg = 0; neg < 2; neg++) {
        float *g = malloc((size_t)n * H * sizeof(float)), *beta = malloc((size_t)n * H * sizeof(float));
        float *rg = malloc((size_t)n * H * sizeof(float)), *rb = malloc((size_t)n * H * sizeof(float));
        for (int i = 0; i < n; i++)
            for (int h = 0; h < H; h++) {
                double a = (double)ab[i * 2 * H + h] + dtb[h], bb = ab[i * 2 * H + H + h];
                double sp = a > 30 ? a : log1p(exp(a));
                rg[i * H + h] = (float)(-exp((double)A_log[h]) * sp);
                rb[i * H + h] = (float)((neg ? 2.0 : 1.0) / (1.0 + exp(-bb)));
            }
        CHECK_OK(ops->gdn_gates(ctx, ab, 2 * H, ab + H, 2 * H, A_log, dtb, g, beta, n, H, neg));
        CHECK_CLOSE(g, rg, (size_t)n * H, 1e-7, 1e-6, "gdn_gates g");
        CHECK_CLOSE(beta, rb, (size_t)n * H, 1e-7, 1e-6, "gdn_gates beta");
        /* g written densely over the interleaved input it is computed from */
        float *alias = dup(ab, (size_t)n * 2 * H), *beta2 = malloc((size_t)n * H * sizeof(float));
        CHECK_OK(ops->gdn_gates(ctx, alias, 2 * H, alias + H, 2 * H, A_log, dtb, alias, beta2, n, H, neg));
        CHECK(!memcmp(alias, g, (size_t)n * H * sizeof(float)));
        CHECK(!memcmp(beta2, beta, (size_t)n * H * sizeof(float)));
        /* separate a and b arrays overwritten in place by g and beta */
        float *a2 = malloc((size_t)n * H * sizeof(float)), *b2 = malloc((size_t)n * H * sizeof(float));
        for (int i = 0; i < n; i++) {
            memcpy(a2 + (size_t)i * H, ab + (size_t)i * 2 * H, (size_t)H * sizeof(float));
            memcpy(b2 + (size_t)i * H, ab + (size_t)i * 2 * H + H, (size_t)H * sizeof(float));
        }
        CHECK_OK(ops->gdn_gates(ctx, a2, H, b2, H, A_log, dtb, a2, b2, n, H, neg));
        CHECK(!memcmp(a2, g, (size_t)n * H * sizeof(float)));
        CHECK(!memcmp(b2, beta, (size_t)n * H * sizeof(float)));
        free(g), free(beta), free(rg), free(rb), free(alias), free(beta2), free(a2), free(b2);
    }
    free(ab), free(A_log), free(dtb);
}

/* [ATTN-1] RoPE, rotate-half. The backend's angles are double, so even at position 10^6 the
 * result is the double reference rounded: rtol 1e-6, atol 1e-6 (|x| ~ 1). */
static void test_rope(void) {
    int n = 4, H = 3, D = 16;
    int32_t pos[4] = {0, 1, 77, 1000000};
    float theta = 10000.0f;
    float *x = randn((size_t)n * H * D, 1.0f), *ref = malloc((size_t)n * H * D * sizeof(float));
    float *y = dup(x, (size_t)n * H * D);
    for (int i = 0; i < n; i++)
        for (int h = 0; h < H; h++)
            for (int j = 0; j < D / 2; j++) {
                double th = pos[i] * pow(theta, -2.0 * j / D);
                const float *r = x + ((size_t)i * H + h) * D;
                ref[((size_t)i * H + h) * D + j] = (float)(r[j] * cos(th) - r[j + D / 2] * sin(th));
                ref[((size_t)i * H + h) * D + j + D / 2] = (float)(r[j + D / 2] * cos(th) + r[j] * sin(th));
            }
    CHECK_OK(ops->rope(ctx, y, n, H, D, pos, theta));
    CHECK_CLOSE(y, ref, (size_t)n * H * D, 1e-6, 1e-6, "rope");
    CHECK(!memcmp(y, x, (size_t)H * D * sizeof(float))); /* position 0 is the identity */
    free(x), free(ref), free(y);
}

/* [CONV-1] causal depthwise conv with carried tails for B sessions. Reference: the full
 * sequence (initial tail followed by the inputs) convolved in double: K products, rtol 1e-5.
 * Continuation: one call over n tokens equals two calls over a split, bit for bit. */
static void test_short_conv(void) {
    int B = 2, n = 7, C = 5, K = 4;
    float *x = randn((size_t)B * n * C, 1.0f), *w = randn((size_t)C * K, 0.5f), *bias = randn((size_t)C, 0.1f);
    float *tail0 = randn((size_t)B * (K - 1) * C, 1.0f);
    for (int silu = 0; silu < 2; silu++) {
        float *ref = malloc((size_t)B * n * C * sizeof(float));
        for (int b = 0; b < B; b++)
            for (int t = 0; t < n; t++)
                for (int c = 0; c < C; c++) {
                    double acc = 0;
                    for (int j = 0; j < K; j++) {
                        int src = t - K + 1 + j; /* < 0: from the tail, row K-1+src */
                        double xv = src >= 0 ? x[((size_t)b * n + src) * C + c]
                                             : tail0[((size_t)b * (K - 1) + (K - 1 + src)) * C + c];
                        acc += (double)w[c * K + j] * xv;
                    }
                    acc += bias[c];
                    ref[((size_t)b * n + t) * C + c] = (float)(silu ? silu_d(acc) : acc);
                }
        /* one call */
        float *y = dup(x, (size_t)B * n * C), *tails = dup(tail0, (size_t)B * (K - 1) * C);
        float *tp[2] = {tails, tails + (K - 1) * C};
        CHECK_OK(ops->short_conv(ctx, y, B, n, C, w, bias, K, tp, silu));
        CHECK_CLOSE(y, ref, (size_t)B * n * C, 1e-6, 1e-5, "short_conv");
        for (int b = 0; b < B; b++) /* tail = the last K-1 inputs */
            CHECK(!memcmp(tp[b], x + ((size_t)b * n + n - (K - 1)) * C, (size_t)(K - 1) * C * sizeof(float)));
        /* the same sequence in two calls of 3 and 4 tokens per session */
        float *t2 = dup(tail0, (size_t)B * (K - 1) * C), *y2 = malloc((size_t)B * n * C * sizeof(float));
        float *tp2[2] = {t2, t2 + (K - 1) * C};
        int split = 3;
        float *p1 = malloc((size_t)B * split * C * sizeof(float)), *p2 = malloc((size_t)B * (n - split) * C * sizeof(float));
        for (int b = 0; b < B; b++) {
            memcpy(p1 + (size_t)b * split * C, x + (size_t)b * n * C, (size_t)split * C * sizeof(float));
            memcpy(p2 + (size_t)b * (n - split) * C, x + ((size_t)b * n + split) * C, (size_t)(n - split) * C * sizeof(float));
        }
        CHECK_OK(ops->short_conv(ctx, p1, B, split, C, w, bias, K, tp2, silu));
        CHECK_OK(ops->short_conv(ctx, p2, B, n - split, C, w, bias, K, tp2, silu));
        for (int b = 0; b < B; b++) {
            memcpy(y2 + (size_t)b * n * C, p1 + (size_t)b * split * C, (size_t)split * C * sizeof(float));
            memcpy(y2 + ((size_t)b * n + split) * C, p2 + (size_t)b * (n - split) * C, (size_t)(n - split) * C * sizeof(float));
        }
        CHECK(!memcmp(y, y2, (size_t)B * n * C * sizeof(float)));
        CHECK(!memcmp(tails, t2, (size_t)B * (K - 1) * C * sizeof(float)));
        free(ref), free(y), free(tails), free(t2), free(y2), free(p1), free(p2);
    }
    free(x), free(w), free(bias), free(tail0);
    /* short_conv_multi with L2 runs (GDN's q and k heads) == short_conv then l2norm_rows, bit for
     * bit; runs that do not divide the channels are refused, naming both */
    {
        const int C2 = 8, l2 = 4;
        float *xa = randn((size_t)B * n * C2, 1.0f), *w2 = randn((size_t)C2 * K, 0.5f);
        float *ta = randn((size_t)B * (K - 1) * C2, 1.0f), *xb = dup(xa, (size_t)B * n * C2),
              *tb = dup(ta, (size_t)B * (K - 1) * C2);
        float *tpa[2] = {ta, ta + (K - 1) * C2}, *tpb[2] = {tb, tb + (K - 1) * C2};
        hyla_conv_part p = {xa, w2, NULL, tpa, C2, l2, 1e-6f, NULL};
        CHECK_OK(ops->short_conv_multi(ctx, 1, &p, B, n, K, 1));
        CHECK_OK(ops->short_conv(ctx, xb, B, n, C2, w2, NULL, K, tpb, 1));
        CHECK_OK(ops->l2norm_rows(ctx, xb, B * n * C2 / l2, l2, 1e-6f));
        CHECK_MSG(!memcmp(xa, xb, (size_t)B * n * C2 * sizeof(float)), "short_conv_multi l2 == short_conv, l2norm_rows");
        double ss = 0;
        for (int i = 0; i < l2; i++) ss += (double)xa[i] * xa[i];
        CHECK_MSG(fabs(ss - 1.0) < 1e-3, "short_conv_multi l2: a run has unit norm (%.8f)", ss);
        /* from bf16 inputs (src): == the widened rows in place */
        uint16_t *sb = malloc((size_t)B * n * C2 * 2);
        float *xw = malloc((size_t)B * n * C2 * sizeof(float)), *xo = malloc((size_t)B * n * C2 * sizeof(float));
        float *t3 = randn((size_t)B * (K - 1) * C2, 1.0f), *t4 = dup(t3, (size_t)B * (K - 1) * C2);
        float *tp3[2] = {t3, t3 + (K - 1) * C2}, *tp4[2] = {t4, t4 + (K - 1) * C2};
        for (size_t e = 0; e < (size_t)B * n * C2; e++) {
            sb[e] = hyla_f32_to_bf16(xb[e]);
            xw[e] = hyla_bf16_to_f32(sb[e]);
            xo[e] = 1e30f;
        }
        hyla_conv_part ps = {xo, w2, NULL, tp3, C2, l2, 1e-6f, sb}, pw = {xw, w2, NULL, tp4, C2, l2, 1e-6f, NULL};
        CHECK_OK(ops->short_conv_multi(ctx, 1, &ps, B, n, K, 1));
        CHECK_OK(ops->short_conv_multi(ctx, 1, &pw, B, n, K, 1));
        CHECK_MSG(!memcmp(xo, xw, (size_t)B * n * C2 * sizeof(float)) &&
                      !memcmp(t3, t4, (size_t)B * (K - 1) * C2 * sizeof(float)),
                  "short_conv_multi from bf16 rows == the widened rows in place (outputs and tails)");
        free(sb), free(xw), free(xo), free(t3), free(t4);
        p.l2 = 3;
        CHECK(ops->short_conv_multi(ctx, 1, &p, B, n, K, 1) == HYLA_ERR_INVALID_ARG);
        CHECK(strstr(hyla_last_error(), "L2 runs of 3") != NULL);
        free(xa), free(w2), free(ta), free(xb), free(tb);
    }
}

/* ---------------------------------------------------------------- sampling [SAMPLE-1] */

static int32_t sample1(const float *logits, int V, float T, int top_k, float top_p, float u) {
    hyla_sampling sp = {T, top_k, top_p};
    int32_t out = -1;
    CHECK_OK(ops->sample(ctx, logits, 1, V, &sp, &u, &out));
    return out;
}

/* Draw with a grid of G evenly spaced u and return per-token frequencies. With an exact
 * inverse CDF, token i gets its probability ± 1/G (each boundary moves by at most one u). */
static void grid_freq(const float *logits, int V, float T, int top_k, float top_p, int G, double *freq) {
    for (int i = 0; i < V; i++) freq[i] = 0;
    for (int g = 0; g < G; g++) {
        int32_t t = sample1(logits, V, T, top_k, top_p, (float)((g + 0.5) / G));
        CHECK(t >= 0 && t < V);
        if (t >= 0 && t < V) freq[t] += 1.0 / G;
    }
}

static void test_sample(void) {
    /* greedy: argmax, lowest index on ties, u ignored */
    float l1[6] = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f, 0.0f};
    CHECK(sample1(l1, 6, 0.0f, 0, 1.0f, 0.0f) == 1);
    CHECK(sample1(l1, 6, -1.0f, 3, 0.5f, 0.999f) == 1);

    /* exact inverse CDF in vocabulary order: p = (0.1, 0.2, 0.3, 0.4), cumulative 0.1 0.3 0.6 1 */
    float l2[4] = {logf(0.1f), logf(0.2f), logf(0.3f), logf(0.4f)};
    CHECK(sample1(l2, 4, 1.0f, 0, 1.0f, 0.0f) == 0);
    CHECK(sample1(l2, 4, 1.0f, 0, 1.0f, 0.05f) == 0);
    CHECK(sample1(l2, 4, 1.0f, 0, 1.0f, 0.25f) == 1);
    CHECK(sample1(l2, 4, 1.0f, 0, 1.0f, 0.59f) == 2);
    CHECK(sample1(l2, 4, 1.0f, 0, 1.0f, 0.65f) == 3);
    CHECK(sample1(l2, 4, 1.0f, 0, 1.0f, 0.9999f) == 3);
    /* top-k 2 keeps tokens 3 (0.4) and 2 (0.3): renormalised 3/7, 4/7, drawn in index order */
    CHECK(sample1(l2, 4, 1.0f, 2, 1.0f, 0.0f) == 2);
    CHECK(sample1(l2, 4, 1.0f, 2, 1.0f, 0.42f) == 2);
    CHECK(sample1(l2, 4, 1.0f, 2, 1.0f, 0.44f) == 3);
    /* top-p: sorted 0.4, 0.3, 0.2, 0.1; p=0.65 keeps {3, 2} (0.7 >= 0.65); p=0.75 keeps {3, 2, 1} */
    double f[8];
    int G = 20000;
    grid_freq(l2, 4, 1.0f, 0, 0.65f, G, f);
    CHECK(f[0] == 0 && f[1] == 0 && fabs(f[2] - 3.0 / 7) < 2.0 / G && fabs(f[3] - 4.0 / 7) < 2.0 / G);
    grid_freq(l2, 4, 1.0f, 0, 0.75f, G, f);
    CHECK(f[0] == 0 && fabs(f[1] - 2.0 / 9) < 2.0 / G && fabs(f[2] - 3.0 / 9) < 2.0 / G && fabs(f[3] - 4.0 / 9) < 2.0 / G);
    /* top-k then top-p on the renormalised remainder: k=3 keeps 0.4,0.3,0.2 (mass 0.9);
     * top_p 0.7 needs 0.63 of it: 0.4 < 0.63 <= 0.7 -> {3, 2} */
    grid_freq(l2, 4, 1.0f, 3, 0.7f, G, f);
    CHECK(f[0] == 0 && f[1] == 0 && fabs(f[2] - 3.0 / 7) < 2.0 / G);
    /* top_p tiny keeps exactly the most probable token */
    grid_freq(l2, 4, 1.0f, 0, 1e-6f, 1000, f);
    CHECK(fabs(f[3] - 1.0) < 1e-9 && f[0] == 0 && f[1] == 0 && f[2] == 0);
    /* top_k 1 is greedy for any u */
    for (int g = 0; g < 10; g++) CHECK(sample1(l1, 6, 0.7f, 1, 1.0f, g / 10.0f) == 1);
    /* ties in top-k: all equal, k=2 keeps the two lowest indices, half each */
    float l3[5] = {1, 1, 1, 1, 1};
    grid_freq(l3, 5, 1.0f, 2, 1.0f, 1000, f);
    CHECK(fabs(f[0] - 0.5) < 2e-3 && fabs(f[1] - 0.5) < 2e-3 && f[2] == 0 && f[3] == 0 && f[4] == 0);
    /* temperature: T=0.5 squares the probabilities: (1,4,9,16)/30 */
    grid_freq(l2, 4, 0.5f, 0, 1.0f, G, f);
    for (int i = 0; i < 4; i++) CHECK_MSG(fabs(f[i] - (i + 1.0) * (i + 1.0) / 30) < 2.0 / G, "T=0.5 token %d: %g", i, f[i]);

    /* batch: rows with different params, determinism (same inputs, same tokens) */
    int B = 4, V = 1000;
    float *lg = randn((size_t)B * V, 3.0f);
    hyla_sampling sp[4] = {{0.0f, 0, 1.0f}, {1.0f, 0, 1.0f}, {0.8f, 40, 1.0f}, {1.2f, 0, 0.9f}};
    float u[4] = {0.3f, 0.7f, 0.1f, 0.95f};
    int32_t a[4], b[4];
    CHECK_OK(ops->sample(ctx, lg, B, V, sp, u, a));
    CHECK_OK(ops->sample(ctx, lg, B, V, sp, u, b));
    CHECK(!memcmp(a, b, sizeof a));
    for (int r = 0; r < B; r++) /* each row is sampled as if alone */
        CHECK(a[r] == sample1(lg + (size_t)r * V, V, sp[r].temperature, sp[r].top_k, sp[r].top_p, u[r]));
    /* top-k 40 mask on random logits: only the 40 largest ever come out */
    float *row = lg + 2 * (size_t)V;
    float kth;
    {
        float *sorted = dup(row, (size_t)V);
        for (int i = 0; i < 40; i++) /* partial selection sort, descending */
            for (int j = i + 1; j < V; j++)
                if (sorted[j] > sorted[i]) {
                    float t = sorted[i];
                    sorted[i] = sorted[j];
                    sorted[j] = t;
                }
        kth = sorted[39];
        free(sorted);
    }
    int outside = 0;
    for (int g = 0; g < 500; g++) {
        int32_t t = sample1(row, V, 3.0f, 40, 1.0f, (float)((g + 0.5) / 500));
        if (row[t] < kth) outside++;
    }
    CHECK(outside == 0);
    free(lg);
}

/* ---------------------------------------------------------------- host buffers, capture */

/* The CPU backend defers a capture's copies to capture_end (hyla_ops.h), so a write to the
 * source after capture_begin shows in the result: the reference holds callers to the rule that
 * captured memory stays unchanged until the ticket ends. */
static void test_capture(void) {
    void *h = NULL, *d0 = NULL, *d1 = NULL;
    CHECK_OK(ops->host_alloc(ctx, 1000, &h));
    CHECK(h && ((uintptr_t)h & 63) == 0);
    CHECK_OK(ops->alloc(ctx, 400, &d0));
    CHECK_OK(ops->alloc(ctx, 600, &d1));
    if (!h || !d0 || !d1) return;
    memset(h, 0x11, 1000);
    memset(d0, 0x22, 400);
    memset(d1, 0x33, 600);
    void *dst[3] = {h, (char *)h + 400, (char *)h + 999};
    const void *src[3] = {d0, d1, d1};
    size_t bytes[3] = {400, 599, 0};
    hyla_capture *t = NULL;
    CHECK_OK(ops->capture_begin(ctx, 3, dst, src, bytes, &t));
    CHECK(((unsigned char *)h)[0] == 0x11); /* nothing copied yet */
    memset(d1, 0x44, 600);                    /* breaks the rule on purpose: seen below */
    CHECK(ops->capture_done(ctx, t) == 0);
    CHECK(ops->capture_done(ctx, t) == 1);
    CHECK_OK(ops->capture_end(ctx, t));
    const unsigned char *b = h;
    int ok = 1;
    for (int i = 0; i < 400; i++) ok &= b[i] == 0x22;
    for (int i = 400; i < 999; i++) ok &= b[i] == 0x44;
    ok &= b[999] == 0x11; /* the 0-byte copy */
    CHECK_MSG(ok, "capture_end did not perform the recorded copies");
    CHECK_OK(ops->capture_end(ctx, NULL));
    void *dn[1] = {NULL};
    const void *sn[1] = {d0};
    size_t bn[1] = {4};
    CHECK(ops->capture_begin(ctx, 1, dn, sn, bn, &t) == HYLA_ERR_INVALID_ARG && t == NULL);
    ops->free(ctx, d0);
    ops->free(ctx, d1);
    ops->host_free(ctx, h);
    ops->host_free(ctx, NULL);
}

int main(void) {
    hyla_rng_seed(&rng, 1234);
    CHECK_OK(hyla_cpu_backend_create(2, &be));
    if (!be) return hyla_test_done("test_cpu_ops");
    ops = be->ops;
    ctx = be->ctx;
    CHECK(!strcmp(ops->name, "cpu") && ops->kv_dtype == HYLA_DT_F32);
    void *p = NULL;
    CHECK_OK(ops->alloc(ctx, 100, &p));
    for (int i = 0; i < 100; i++) CHECK(((unsigned char *)p)[i] == 0);
    ops->free(ctx, p);
    ops->free(ctx, NULL);
    test_weights_embed();
    test_linear_reference();
    test_linear_batch_invariance();
    test_linear_multi_own_x();
    test_norms();
    test_pointwise();
    test_rows();
    test_gdn_gates();
    test_fused_acc();
    test_rope();
    test_short_conv();
    test_sample();
    test_capture();
    hyla_backend_destroy(be);
    return hyla_test_done("test_cpu_ops");
}
