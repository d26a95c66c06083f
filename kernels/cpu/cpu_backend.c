/* cpu_backend.c — the CPU reference backend: memory, weights, dense ops, sampling and the
 * ops table (the mixers live in cpu_mixers.c). It is the executable specification of
 * docs/MODELS.md that the CUDA backend is compared against, so each op is written as the
 * formula it implements; tags like [NORM-0] point at the spec.
 *
 * Invariants:
 *   - Device memory is host memory: 64-byte aligned, zero-filled by alloc.
 *   - capture_begin only records its copies; capture_end performs them (hyla_ops.h).
 *   - Weights are converted to fp32 once, at weight_create, and packed for `linear`.
 *   - Row reductions (sums of squares, softmax sums) accumulate in double, so the
 *     reference is at least as exact as any fp32 backend it is compared with.
 *   - `linear` is batch invariant by construction: every output element is one fixed
 *     sequence of IEEE fp32 operations (see cpu_linear), whatever M, the row's place in the
 *     batch, the thread count or the instruction set.
 *
 * Threading: one thread drives a context (hyla_ops rule). Inside an op, rows (or output
 * panels) are spread over ctx->nt OpenMP threads; every output element is computed by
 * exactly one thread in a fixed order, so results do not depend on the thread count. */
#include <float.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu_impl.h"
#include "hyla_util.h"

/* Each float operation must round to float (no wider evaluation), or the batch-invariance
 * argument of cpu_linear would not hold. True of x86-64 (SSE) and AArch64. */
#if !defined(FLT_EVAL_METHOD) || FLT_EVAL_METHOD != 0
#error "kernels/cpu needs FLT_EVAL_METHOD == 0"
#endif

/* Rows of x per pass of `linear` (a thread's tile is CPU_LINEAR_ROWS x CPU_GROUP*CPU_PANEL floats). */
#define CPU_LINEAR_ROWS 64
/* Panels per parallel work item of `linear` (64 output features). */
#define CPU_GROUP 8
/* Largest short-convolution kernel (the carried tail is held in a local array). */
#define CPU_MAX_CONV 64

/* ------------------------------------------------------------------ memory */

static void *cpu_aligned_alloc(size_t bytes) {
    size_t n = cpu_align64(bytes ? bytes : 1);
    return aligned_alloc(64, n);
}

hyla_status cpu_scratch(cpu_ctx *c, size_t bytes, void **out) {
    if (bytes > c->scratch_bytes) {
        free(c->scratch);
        c->scratch = cpu_aligned_alloc(bytes);
        c->scratch_bytes = c->scratch ? bytes : 0;
        if (!c->scratch) {
            *out = NULL;
            return hyla_fail(HYLA_ERR_NOMEM, "cpu backend: cannot allocate %zu bytes of scratch", bytes);
        }
    }
    *out = c->scratch;
    return HYLA_OK;
}

static hyla_status cpu_alloc(void *ctx, size_t bytes, void **out) {
    (void)ctx;
    void *p = cpu_aligned_alloc(bytes);
    if (!p) {
        *out = NULL;
        return hyla_fail(HYLA_ERR_NOMEM, "cpu backend: cannot allocate %zu bytes", bytes);
    }
    memset(p, 0, cpu_align64(bytes ? bytes : 1));
    *out = p;
    return HYLA_OK;
}

static void cpu_free(void *ctx, void *p) {
    (void)ctx;
    free(p);
}

static hyla_status cpu_memcpy_op(void *ctx, void *dst, const void *src, size_t bytes) {
    (void)ctx;
    if (bytes) memmove(dst, src, bytes);
    return HYLA_OK;
}

static hyla_status cpu_zero(void *ctx, void *dst, size_t bytes) {
    (void)ctx;
    if (bytes) memset(dst, 0, bytes);
    return HYLA_OK;
}

static hyla_status cpu_sync(void *ctx) {
    (void)ctx;
    return HYLA_OK;
}

/* ------------------------------------------------------------------ host buffers, capture
 *
 * Host buffers are plain aligned memory. A capture is genuinely deferred: begin records the
 * copies, end performs them. So the reference backend holds callers to the contract of
 * hyla_ops.h (sources unchanged until the ticket ends) instead of hiding a violation behind
 * copies that happen to run at once. HYLA_CPU_CAPTURE_MS=T (read at creation) makes every
 * capture take T ms, as a GPU's copies of a long document's KV take seconds: capture_done says
 * no until then and capture_end waits for it, so the tests can see who waits for a capture. */

struct hyla_capture {
    int n;
    int polled;   /* capture_done was asked once */
    double ready; /* hyla_now() from which the copies count as done (HYLA_CPU_CAPTURE_MS) */
    struct {
        void *dst;
        const void *src;
        size_t bytes;
    } c[];
};

static hyla_status cpu_host_alloc(void *ctx, size_t bytes, void **out) {
    (void)ctx;
    *out = cpu_aligned_alloc(bytes);
    if (!*out) return hyla_fail(HYLA_ERR_NOMEM, "cpu backend: cannot allocate %zu bytes of host buffer", bytes);
    return HYLA_OK;
}

static void cpu_host_free(void *ctx, void *p) {
    (void)ctx;
    free(p);
}

static hyla_status cpu_capture_begin(void *ctx, int n, void *const *host_dst, const void *const *src,
                                     const size_t *bytes, hyla_capture **out) {
    const cpu_ctx *c = ctx;
    *out = NULL;
    if (n < 0) return hyla_fail(HYLA_ERR_INVALID_ARG, "capture_begin: %d copies", n);
    for (int i = 0; i < n; i++)
        if (bytes[i] && (!host_dst[i] || !src[i]))
            return hyla_fail(HYLA_ERR_INVALID_ARG, "capture_begin: copy %d of %zu bytes has a NULL pointer", i, bytes[i]);
    hyla_capture *t = malloc(sizeof *t + (size_t)n * sizeof t->c[0]);
    if (!t) return hyla_fail(HYLA_ERR_NOMEM, "capture_begin: out of memory for %d copies", n);
    t->n = n;
    t->polled = 0;
    t->ready = c->capture_s > 0 ? hyla_now() + c->capture_s : 0;
    for (int i = 0; i < n; i++) {
        t->c[i].dst = host_dst[i];
        t->c[i].src = src[i];
        t->c[i].bytes = bytes[i];
    }
    *out = t;
    return HYLA_OK;
}

static int cpu_capture_done(void *ctx, hyla_capture *t) {
    (void)ctx;
    if (t && t->ready > 0) return hyla_now() >= t->ready;
    if (!t || t->polled) return 1;
    t->polled = 1;
    return 0;
}

static hyla_status cpu_capture_end(void *ctx, hyla_capture *t) {
    (void)ctx;
    if (!t) return HYLA_OK;
    for (double left; t->ready > 0 && (left = t->ready - hyla_now()) > 0;)
        usleep((useconds_t)(left * 1e6) + 1);
    for (int i = 0; i < t->n; i++)
        if (t->c[i].bytes) memcpy(t->c[i].dst, t->c[i].src, t->c[i].bytes);
    free(t);
    return HYLA_OK;
}

/* An upload is not deferred: ops called after it run at once and must see its bytes. The
 * ticket carries no copies; capture_end frees it. */
static hyla_status cpu_upload_begin(void *ctx, int n, void *const *dst, const void *const *host_src,
                                    const size_t *bytes, hyla_capture **out) {
    (void)ctx;
    *out = NULL;
    if (n < 0) return hyla_fail(HYLA_ERR_INVALID_ARG, "upload_begin: %d copies", n);
    for (int i = 0; i < n; i++)
        if (bytes[i] && (!dst[i] || !host_src[i]))
            return hyla_fail(HYLA_ERR_INVALID_ARG, "upload_begin: copy %d of %zu bytes has a NULL pointer", i, bytes[i]);
    hyla_capture *t = malloc(sizeof *t);
    if (!t) return hyla_fail(HYLA_ERR_NOMEM, "upload_begin: out of memory");
    t->n = 0;
    t->polled = 0;
    for (int i = 0; i < n; i++)
        if (bytes[i]) memcpy(dst[i], host_src[i], bytes[i]);
    *out = t;
    return HYLA_OK;
}

/* ------------------------------------------------------------------ weights */

static hyla_status cpu_weight_create(void *ctx, const void *host, hyla_dtype dt, int rows, int cols,
                                     hyla_weight **out) {
    (void)ctx;
    *out = NULL;
    if (dt != HYLA_DT_F32 && dt != HYLA_DT_F16 && dt != HYLA_DT_BF16)
        return hyla_fail(HYLA_ERR_UNSUPPORTED, "cpu weight_create: dtype %s (expected F32, F16 or BF16)",
                         hyla_dtype_name(dt));
    if (rows <= 0 || cols <= 0)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "cpu weight_create: shape [%d, %d]", rows, cols);
    hyla_weight *w = malloc(sizeof *w);
    size_t panels = ((size_t)rows + CPU_PANEL - 1) / CPU_PANEL, ps = cpu_panel_stride(cols);
    float *data = cpu_aligned_alloc(panels * ps * sizeof(float));
    float *row = malloc((size_t)cols * sizeof(float));
    if (!w || !data || !row) {
        free(w);
        free(data);
        free(row);
        return hyla_fail(HYLA_ERR_NOMEM, "cpu weight_create: cannot allocate [%d, %d] fp32", rows, cols);
    }
    size_t esz = hyla_dtype_size(dt);
    for (size_t r = 0; r < panels * CPU_PANEL; r++) {
        if (r < (size_t)rows)
            hyla_to_f32(row, (const char *)host + r * (size_t)cols * esz, dt, (size_t)cols);
        else
            memset(row, 0, (size_t)cols * sizeof(float)); /* padding rows of the last panel */
        float *panel = data + (r / CPU_PANEL) * ps;
        for (int k = 0; k < cols; k++) panel[(size_t)k * CPU_PANEL + r % CPU_PANEL] = row[k];
    }
    free(row);
    w->rows = rows;
    w->cols = cols;
    w->pstride = ps;
    w->packed = data;
    *out = w;
    return HYLA_OK;
}

static void cpu_weight_destroy(void *ctx, hyla_weight *w) {
    (void)ctx;
    if (!w) return;
    free(w->packed);
    free(w);
}

/* ------------------------------------------------------------------ dense ops */

static hyla_status cpu_embed(void *ctx, const hyla_weight *table, const int32_t *ids, int n, float *out) {
    (void)ctx;
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= table->rows)
            return hyla_fail(HYLA_ERR_INVALID_ARG, "embed: token id %d at %d is outside [0, %d)", (int)ids[i], i,
                             table->rows);
    size_t D = (size_t)table->cols;
    for (int i = 0; i < n; i++) {
        const float *panel = table->packed + (size_t)(ids[i] / CPU_PANEL) * table->pstride;
        for (size_t k = 0; k < D; k++) out[(size_t)i * D + k] = panel[k * CPU_PANEL + ids[i] % CPU_PANEL];
    }
    return HYLA_OK;
}

/* y = x Wᵀ (+ bias) (+ y) — batch invariant by construction.
 *
 * BLAS libraries choose kernels, tile edges and K-unrolling from the matrix shape and from a
 * row's place in a tile; OpenBLAS 0.3.21 on Zen, for one, sums rows 6..15 of a 16-row
 * sgemm in a different order from rows 0..5. So `linear` uses its own kernel, whose result
 * for an element is defined as
 *     acc = 0;  for k = 0..K-1 ascending: p = x[m][k] * W[n][k]; acc = acc + p;
 *     t = acc (+ bias[n]);  y[m][n] = t (or y[m][n] + t when accumulating)
 * with every operation rounded to fp32 (FLT_EVAL_METHOD == 0, products and sums in separate
 * statements and fp contraction off, so no FMA fuses them). Vector lanes hold different
 * output features and never mix, and IEEE multiplication and addition give the same bits in
 * a lane as in a scalar register, so the 8-row tile, the 1-row tail, any thread split and
 * the AVX2 or SSE2 clone all produce exactly this sequence: row r's result cannot depend on
 * M. tests/test_cpu_ops.c also checks it (row r of M=37 == M=1, bit for bit).
 *
 * Layout: W is packed at weight_create into panels of CPU_PANEL (8) output features,
 * [ceil(N/8)][K][8] with panels pstride = K*8 + 16 floats apart, so one aligned 8-float
 * load feeds 8 accumulators. The extra cache line per panel, like the padded copy of x in
 * cpu_linear, keeps streams that are read side by side out of the same cache sets (with a
 * power-of-two K they would all map to one set and thrash it). */
typedef float cpu_v8 __attribute__((vector_size(32)));

#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif

/* An AVX2 clone and a baseline clone picked at load time; they give the same bits (no FMA in
 * either). -DHYLA_CPU_NO_CLONES builds the baseline alone. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(HYLA_CPU_NO_CLONES)
#define CPU_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CPU_CLONES
#endif

#define CPU_INLINE static inline __attribute__((always_inline))

/* v = 8 floats at ptr (a macro: a function returning a vector would change the ABI
 * between the clones). */
#define V8_LD(v, ptr) memcpy(&(v), (ptr), sizeof(cpu_v8))

/* 8 rows x 1 panel: out[i*ldo + 0..7] for rows x + i*ldx. */
CPU_INLINE void kern_8x1(const float *x, int ldx, int K, const float *Wp, float *out, int ldo) {
    const float *x0 = x, *x1 = x0 + ldx, *x2 = x1 + ldx, *x3 = x2 + ldx;
    const float *x4 = x3 + ldx, *x5 = x4 + ldx, *x6 = x5 + ldx, *x7 = x6 + ldx;
    cpu_v8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, a4 = {0}, a5 = {0}, a6 = {0}, a7 = {0}, p;
    for (int k = 0; k < K; k++) {
        cpu_v8 w;
        V8_LD(w, Wp + (size_t)k * CPU_PANEL);
        p = w * x0[k]; a0 = a0 + p;
        p = w * x1[k]; a1 = a1 + p;
        p = w * x2[k]; a2 = a2 + p;
        p = w * x3[k]; a3 = a3 + p;
        p = w * x4[k]; a4 = a4 + p;
        p = w * x5[k]; a5 = a5 + p;
        p = w * x6[k]; a6 = a6 + p;
        p = w * x7[k]; a7 = a7 + p;
    }
    memcpy(out + 0 * (size_t)ldo, &a0, sizeof a0);
    memcpy(out + 1 * (size_t)ldo, &a1, sizeof a1);
    memcpy(out + 2 * (size_t)ldo, &a2, sizeof a2);
    memcpy(out + 3 * (size_t)ldo, &a3, sizeof a3);
    memcpy(out + 4 * (size_t)ldo, &a4, sizeof a4);
    memcpy(out + 5 * (size_t)ldo, &a5, sizeof a5);
    memcpy(out + 6 * (size_t)ldo, &a6, sizeof a6);
    memcpy(out + 7 * (size_t)ldo, &a7, sizeof a7);
}

/* 1 row x 8 panels (ps floats apart): out[0..63]. Eight independent sums keep the adder busy
 * when there are fewer than 8 rows (decode). */
CPU_INLINE void kern_1x8(const float *x, int K, const float *Wp, size_t ps, float *out) {
    cpu_v8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, a4 = {0}, a5 = {0}, a6 = {0}, a7 = {0}, p;
    for (int k = 0; k < K; k++) {
        const float *w = Wp + (size_t)k * CPU_PANEL;
        float xk = x[k];
        cpu_v8 w0, w1, w2, w3, w4, w5, w6, w7;
        V8_LD(w0, w + 0 * ps), V8_LD(w1, w + 1 * ps), V8_LD(w2, w + 2 * ps), V8_LD(w3, w + 3 * ps);
        V8_LD(w4, w + 4 * ps), V8_LD(w5, w + 5 * ps), V8_LD(w6, w + 6 * ps), V8_LD(w7, w + 7 * ps);
        p = w0 * xk; a0 = a0 + p;
        p = w1 * xk; a1 = a1 + p;
        p = w2 * xk; a2 = a2 + p;
        p = w3 * xk; a3 = a3 + p;
        p = w4 * xk; a4 = a4 + p;
        p = w5 * xk; a5 = a5 + p;
        p = w6 * xk; a6 = a6 + p;
        p = w7 * xk; a7 = a7 + p;
    }
    memcpy(out + 0 * CPU_PANEL, &a0, sizeof a0);
    memcpy(out + 1 * CPU_PANEL, &a1, sizeof a1);
    memcpy(out + 2 * CPU_PANEL, &a2, sizeof a2);
    memcpy(out + 3 * CPU_PANEL, &a3, sizeof a3);
    memcpy(out + 4 * CPU_PANEL, &a4, sizeof a4);
    memcpy(out + 5 * CPU_PANEL, &a5, sizeof a5);
    memcpy(out + 6 * CPU_PANEL, &a6, sizeof a6);
    memcpy(out + 7 * CPU_PANEL, &a7, sizeof a7);
}

/* 1 row x 1 panel: out[0..7]. */
CPU_INLINE void kern_1x1(const float *x, int K, const float *Wp, float *out) {
    cpu_v8 a = {0}, p;
    for (int k = 0; k < K; k++) {
        cpu_v8 w;
        V8_LD(w, Wp + (size_t)k * CPU_PANEL);
        p = w * x[k];
        a = a + p;
    }
    memcpy(out, &a, sizeof a);
}

/* Rows [0, M) of x times a group of P <= CPU_GROUP panels starting at Wp (panels ps floats
 * apart): tile [M][CPU_GROUP*8]. All three kernels compute each element by the sequence in
 * the comment above cpu_linear; they differ only in how many sums run side by side. */
CPU_CLONES static void linear_group(const float *x, int ldx, int M, int K, const float *Wp, size_t ps, int P,
                                    float *tile) {
    const int ldt = CPU_GROUP * CPU_PANEL;
    int r = 0;
    for (; r + 8 <= M; r += 8)
        for (int p = 0; p < P; p++) kern_8x1(x + (size_t)r * ldx, ldx, K, Wp + p * ps, tile + (size_t)r * ldt + p * CPU_PANEL, ldt);
    for (; r < M; r++) {
        if (P == CPU_GROUP)
            kern_1x8(x + (size_t)r * ldx, K, Wp, ps, tile + (size_t)r * ldt);
        else
            for (int p = 0; p < P; p++) kern_1x1(x + (size_t)r * ldx, K, Wp + p * ps, tile + (size_t)r * ldt + p * CPU_PANEL);
    }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

static hyla_status cpu_linear(void *ctx, const float *x, int ldx, int M, int K, const hyla_weight *W,
                              const float *bias, float *y, int ldy, int N, int accumulate) {
    cpu_ctx *c = ctx;
    if (!W || W->rows != N || W->cols != K)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "linear: weight is [%d, %d], expected [%d, %d]", W ? W->rows : -1,
                         W ? W->cols : -1, N, K);
    if (M < 0 || ldx < K || ldy < N)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "linear: M=%d ldx=%d (K=%d) ldy=%d (N=%d)", M, ldx, K, ldy, N);
    if (M == 0) return HYLA_OK;
    /* Rows in blocks of CPU_LINEAR_ROWS so a thread's tile stays small; groups of CPU_GROUP
     * panels (64 output features) in parallel. */
    const int RB = CPU_LINEAR_ROWS, GW = CPU_GROUP * CPU_PANEL;
    int groups = (N + GW - 1) / GW;
    size_t tile_floats = (size_t)RB * GW, ldb = (size_t)K + 16; /* padded row stride of the x copy */
    void *mem;
    HYLA_TRY(cpu_scratch(c, ((size_t)c->nt * tile_floats + (size_t)RB * ldb) * sizeof(float), &mem));
    float *xb = (float *)mem + (size_t)c->nt * tile_floats; /* [RB][ldb] */
    for (int r0 = 0; r0 < M; r0 += RB) {
        int rows = M - r0 < RB ? M - r0 : RB;
        for (int r = 0; r < rows; r++) memcpy(xb + r * ldb, x + (size_t)(r0 + r) * ldx, (size_t)K * sizeof(float));
#pragma omp parallel for num_threads(c->nt) if ((long)groups * rows * K > 32768) schedule(static)
        for (int gi = 0; gi < groups; gi++) {
            float *tile = (float *)mem + (size_t)omp_get_thread_num() * tile_floats;
            int n0 = gi * GW, nc = N - n0 < GW ? N - n0 : GW;
            int P = (nc + CPU_PANEL - 1) / CPU_PANEL;
            linear_group(xb, (int)ldb, rows, K, W->packed + (size_t)gi * CPU_GROUP * W->pstride, W->pstride, P, tile);
            for (int r = 0; r < rows; r++) {
                float *yr = y + (size_t)(r0 + r) * ldy + n0;
                const float *tr = tile + (size_t)r * GW;
                for (int j = 0; j < nc; j++) {
                    float t = tr[j];
                    if (bias) t = t + bias[n0 + j];
                    yr[j] = accumulate ? yr[j] + t : t;
                }
            }
        }
    }
    return HYLA_OK;
}

static hyla_status cpu_linear_multi_f32(void *ctx, const float *x, int ldx, int M, int K, int n,
                                        const hyla_linear_out *outs, int accumulate, int flags) {
    (void)flags; /* cpu_linear is row-invariant already: prompt rows need no other method */
    if (n < 1 || n > HYLA_LINEAR_MULTI_MAX)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "linear_multi: %d outputs (1..%d)", n, HYLA_LINEAR_MULTI_MAX);
    for (int i = 0; i < n; i++)
        HYLA_TRY(cpu_linear(ctx, x, ldx, M, K, outs[i].W, outs[i].bias, outs[i].y, outs[i].ldy, outs[i].N, accumulate));
    return HYLA_OK;
}

static hyla_status cpu_swiglu(void *ctx, const float *gate, const float *up, float *out, size_t n);

static hyla_status cpu_gated_rmsnorm(void *ctx, const float *o, const float *g, const float *w, float *y, int rows,
                                     int D, float eps);

/* The composition gated_rmsnorm_linear is defined as. */
static hyla_status cpu_gated_rmsnorm_linear_f32(void *ctx, float *o, const float *gate, const float *w, int H, int D,
                                                float eps, int M, const hyla_weight *W, float *y, int N, int flags) {
    HYLA_TRY(cpu_gated_rmsnorm(ctx, o, gate, w, o, M * H, D, eps));
    return cpu_linear(ctx, o, H * D, M, H * D, W, NULL, y, N, N, (flags & HYLA_LINEAR_ACC) != 0);
}

/* The composition swiglu_linear is defined as. */
static hyla_status cpu_swiglu_linear_f32(void *ctx, float *gate, const float *up, int M, int K, const hyla_weight *W,
                                         float *y, int N, int flags) {
    /* prompt rows need no other method (see cpu_linear_multi) */
    HYLA_TRY(cpu_swiglu(ctx, gate, up, gate, (size_t)M * K));
    return cpu_linear(ctx, gate, K, M, K, W, NULL, y, N, N, (flags & HYLA_LINEAR_ACC) != 0);
}

/* 1 / sqrt(mean(x²) + eps), the sum of squares taken in double. [NORM-0] */
static float rms_inv(const float *x, int D, float eps) {
    double ss = 0;
    for (int i = 0; i < D; i++) ss += (double)x[i] * x[i];
    return (float)(1.0 / sqrt(ss / D + (double)eps));
}

/* [NORM-0] y = x * rsqrt(mean(x²) + eps) * w */
static hyla_status cpu_rmsnorm(void *ctx, const float *x, const float *w, float *y, int n, int D, float eps) {
    cpu_ctx *c = ctx;
#pragma omp parallel for num_threads(c->nt) if (n > 1) schedule(static)
    for (int i = 0; i < n; i++) {
        const float *xr = x + (size_t)i * D;
        float *yr = y + (size_t)i * D;
        float r = rms_inv(xr, D, eps);
        for (int j = 0; j < D; j++) yr[j] = xr[j] * r * w[j];
    }
    return HYLA_OK;
}

static hyla_status cpu_add_rmsnorm(void *ctx, float *residual, const float *x, const float *w, float *y, int n,
                                   int D, float eps) {
    cpu_ctx *c = ctx;
#pragma omp parallel for num_threads(c->nt) if (n > 1) schedule(static)
    for (int i = 0; i < n; i++) {
        float *rr = residual + (size_t)i * D;
        const float *xr = x + (size_t)i * D;
        float *yr = y + (size_t)i * D;
        for (int j = 0; j < D; j++) rr[j] += xr[j];
        float r = rms_inv(rr, D, eps);
        for (int j = 0; j < D; j++) yr[j] = rr[j] * r * w[j];
    }
    return HYLA_OK;
}

static hyla_status cpu_add(void *ctx, float *y, const float *x, size_t n) {
    (void)ctx;
    for (size_t i = 0; i < n; i++) y[i] += x[i];
    return HYLA_OK;
}

static hyla_status cpu_swiglu(void *ctx, const float *gate, const float *up, float *out, size_t n) {
    cpu_ctx *c = ctx;
    ptrdiff_t nn = (ptrdiff_t)n;
#pragma omp parallel for num_threads(c->nt) if (nn > 65536) schedule(static)
    for (ptrdiff_t i = 0; i < nn; i++) out[i] = cpu_silu(gate[i]) * up[i];
    return HYLA_OK;
}

static hyla_status cpu_silu_op(void *ctx, float *x, size_t n) {
    cpu_ctx *c = ctx;
    ptrdiff_t nn = (ptrdiff_t)n;
#pragma omp parallel for num_threads(c->nt) if (nn > 65536) schedule(static)
    for (ptrdiff_t i = 0; i < nn; i++) x[i] = cpu_silu(x[i]);
    return HYLA_OK;
}

/* [GLA-1] gk = max(logsigmoid(x) / normalizer, clamp_min); logsigmoid(x) = min(x,0) − log1p(e^−|x|)
 * (the overflow-free form). */
static hyla_status cpu_gla_gate(void *ctx, float *x, size_t n, float normalizer, float clamp_min) {
    (void)ctx;
    for (size_t i = 0; i < n; i++) {
        float ls = fminf(x[i], 0.0f) - log1pf(expf(-fabsf(x[i])));
        x[i] = fmaxf(ls / normalizer, clamp_min);
    }
    return HYLA_OK;
}

/* Softmax of one row in double, max-subtracted, written as fp32. */
static void softmax_row(const float *x, float *y, int cols) {
    double m = -INFINITY, sum = 0;
    for (int j = 0; j < cols; j++)
        if (x[j] > m) m = x[j];
    for (int j = 0; j < cols; j++) sum += exp((double)x[j] - m);
    for (int j = 0; j < cols; j++) y[j] = (float)(exp((double)x[j] - m) / sum);
}

static hyla_status cpu_softmax_rows(void *ctx, float *x, int rows, int cols) {
    cpu_ctx *c = ctx;
#pragma omp parallel for num_threads(c->nt) if (rows > 64) schedule(static)
    for (int i = 0; i < rows; i++) softmax_row(x + (size_t)i * cols, x + (size_t)i * cols, cols);
    return HYLA_OK;
}

/* [GDN-2] x = x / sqrt(Σx² + eps) */
static hyla_status cpu_l2norm_rows(void *ctx, float *x, int rows, int cols, float eps) {
    cpu_ctx *c = ctx;
#pragma omp parallel for num_threads(c->nt) if (rows > 64) schedule(static)
    for (int i = 0; i < rows; i++) {
        float *r = x + (size_t)i * cols;
        double ss = 0;
        for (int j = 0; j < cols; j++) ss += (double)r[j] * r[j];
        float inv = (float)(1.0 / sqrt(ss + (double)eps));
        for (int j = 0; j < cols; j++) r[j] *= inv;
    }
    return HYLA_OK;
}

/* softplus(x) = max(x,0) + log1p(e^−|x|), exact for every x (no threshold switch). */
static double softplus(double x) { return fmax(x, 0.0) + log1p(exp(-fabs(x))); }

/* [GDN-1] g = −exp(A_log)·softplus(a + dt_bias), β = sigmoid(b)·(allow_neg ? 2 : 1).
 * Rows are processed in order and each row is read whole before it is written, so g/beta may
 * alias a/b (the outputs are never ahead of the inputs when strides are >= H). */
static hyla_status cpu_gdn_gates(void *ctx, const float *a, int a_stride, const float *b, int b_stride,
                                 const float *A_log, const float *dt_bias, float *g, float *beta, int n, int H,
                                 int allow_neg) {
    cpu_ctx *c = ctx;
    if (a_stride < H || b_stride < H)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "gdn_gates: strides %d, %d smaller than H=%d", a_stride, b_stride, H);
    void *mem;
    HYLA_TRY(cpu_scratch(c, 2 * (size_t)H * sizeof(float), &mem));
    float *ta = mem, *tb = ta + H;
    for (int i = 0; i < n; i++) {
        memcpy(ta, a + (size_t)i * a_stride, (size_t)H * sizeof(float));
        memcpy(tb, b + (size_t)i * b_stride, (size_t)H * sizeof(float));
        for (int h = 0; h < H; h++) {
            g[(size_t)i * H + h] = (float)(-exp((double)A_log[h]) * softplus((double)ta[h] + (double)dt_bias[h]));
            double s = 1.0 / (1.0 + exp(-(double)tb[h]));
            beta[(size_t)i * H + h] = (float)(allow_neg ? 2.0 * s : s);
        }
    }
    return HYLA_OK;
}

/* [ATTN-1] rotate-half RoPE; θ_j = pos·theta^(−2j/D). Angles, cos and sin in double so large
 * positions keep their accuracy (an fp32 angle is off by ~pos·6e-8 rad). */
static hyla_status cpu_rope(void *ctx, float *x, int n, int H, int D, const int32_t *pos, float theta) {
    cpu_ctx *c = ctx;
    if (D % 2) return hyla_fail(HYLA_ERR_INVALID_ARG, "rope: head dim %d is odd", D);
    int half = D / 2;
    void *mem;
    HYLA_TRY(cpu_scratch(c, (size_t)half * sizeof(double), &mem));
    double *inv_freq = mem;
    for (int j = 0; j < half; j++) inv_freq[j] = pow((double)theta, -2.0 * j / D);
#pragma omp parallel for num_threads(c->nt) if (n > 1) schedule(static)
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < half; j++) {
            double ang = (double)pos[i] * inv_freq[j];
            double cs = cos(ang), sn = sin(ang);
            for (int h = 0; h < H; h++) {
                float *r = x + ((size_t)i * H + h) * D;
                double x0 = r[j], x1 = r[j + half];
                r[j] = (float)(x0 * cs - x1 * sn);
                r[j + half] = (float)(x1 * cs + x0 * sn);
            }
        }
    }
    return HYLA_OK;
}

/* [CONV-1] y_t[c] = Σ_{j<K} w[c][j]·x_{t−K+1+j}[c] (+bias[c]) (then silu); inputs before the
 * first token come from the tail, tail row 0 being the oldest. Each (session, channel) column
 * keeps its last K−1 raw inputs in a local window, so x can be overwritten in place. */
static hyla_status cpu_short_conv(void *ctx, float *x, int B, int n, int C, const float *w, const float *bias,
                                  int K, float *const *tails, int act_silu) {
    cpu_ctx *c = ctx;
    if (K < 1 || K > CPU_MAX_CONV)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "short_conv: kernel size %d outside [1, %d]", K, CPU_MAX_CONV);
    if (K > 1)
        for (int b = 0; b < B; b++)
            if (!tails || !tails[b]) return hyla_fail(HYLA_ERR_INVALID_ARG, "short_conv: session %d has no tail", b);
    long tasks = (long)B * C;
#pragma omp parallel for num_threads(c->nt) if (tasks * n > 4096) schedule(static)
    for (long task = 0; task < tasks; task++) {
        int b = (int)(task / C), ch = (int)(task % C);
        float *xb = x + (size_t)b * n * C;
        float *tail = K > 1 ? tails[b] : NULL;
        float win[CPU_MAX_CONV]; /* win[0..K-2]: the previous K−1 inputs, oldest first */
        for (int j = 0; j < K - 1; j++) win[j] = tail[(size_t)j * C + ch];
        const float *wc = w + (size_t)ch * K;
        for (int t = 0; t < n; t++) {
            float xt = xb[(size_t)t * C + ch];
            win[K - 1] = xt;
            float acc = 0.0f;
            for (int j = 0; j < K; j++) acc += wc[j] * win[j];
            if (bias) acc += bias[ch];
            xb[(size_t)t * C + ch] = act_silu ? cpu_silu(acc) : acc;
            for (int j = 0; j < K - 1; j++) win[j] = win[j + 1];
        }
        for (int j = 0; j < K - 1; j++) tail[(size_t)j * C + ch] = win[j];
    }
    return HYLA_OK;
}

/* The m calls short_conv_multi is defined as. */
static hyla_status cpu_short_conv_multi(void *ctx, int m, const hyla_conv_part *p, int B, int n, int K, int act_silu) {
    if (m < 1 || m > HYLA_CONV_MULTI_MAX)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "short_conv_multi: %d tensors (1..%d)", m, HYLA_CONV_MULTI_MAX);
    for (int i = 0; i < m; i++) {
        if (p[i].l2 < 0 || (p[i].l2 && p[i].C % p[i].l2))
            return hyla_fail(HYLA_ERR_INVALID_ARG, "short_conv_multi: L2 runs of %d do not divide %d channels", p[i].l2,
                             p[i].C);
        if (p[i].src) { /* bf16 inputs: widened into x, then the convolution in place */
            const uint16_t *sb = p[i].src;
            for (size_t e = 0; e < (size_t)B * n * p[i].C; e++) p[i].x[e] = hyla_bf16_to_f32(sb[e]);
        }
        HYLA_TRY(cpu_short_conv(ctx, p[i].x, B, n, p[i].C, p[i].w, p[i].bias, K, p[i].tails, act_silu));
        if (p[i].l2)
            HYLA_TRY(cpu_l2norm_rows(ctx, p[i].x, (int)((size_t)B * n * p[i].C / p[i].l2), p[i].l2, p[i].l2_eps));
    }
    return HYLA_OK;
}

/* ---------------------------------------------------------------- bf16 prompt rows (opt-in)
 *
 * With HYLA_CPU_BF16_ROWS=1 at creation the backend takes the CUDA backend's bf16 prompt rows
 * (hyla_ops.h rmsnorm_bf16, HYLA_LINEAR_X_BF16 / Y_BF16): each bf16 value is the fp32 one rounded
 * to nearest-even, widened again where read; decode rows' norms too (decode_bf16_rows). Not the
 * reference's arithmetic (which stays fp32): it lets the CPU tests run the runtime's and mixers'
 * bf16 paths (pieces, tensor-parallel halves, decode steps). */
static float *cpu_widen(const void *x, size_t n) {
    const uint16_t *b = x;
    float *f = malloc(n * sizeof(float) + 4);
    if (f)
        for (size_t i = 0; i < n; i++) f[i] = hyla_bf16_to_f32(b[i]);
    return f;
}
static void cpu_round(const float *f, size_t n, void *y) {
    uint16_t *b = y;
    for (size_t i = 0; i < n; i++) b[i] = hyla_f32_to_bf16(f[i]);
}

static hyla_status cpu_rmsnorm_bf16(void *ctx, float *residual, const float *x, const float *w, void *y, int n, int D,
                                    float eps) {
    float *t = malloc((size_t)n * D * sizeof(float) + 4);
    if (!t) return hyla_fail(HYLA_ERR_NOMEM, "rmsnorm_bf16: out of memory");
    hyla_status st = x ? cpu_add_rmsnorm(ctx, residual, x, w, t, n, D, eps) : cpu_rmsnorm(ctx, residual, w, t, n, D, eps);
    if (st == HYLA_OK) cpu_round(t, (size_t)n * D, y);
    free(t);
    return st;
}

static hyla_status cpu_linear_multi(void *ctx, const float *x, int ldx, int M, int K, int n, const hyla_linear_out *outs,
                                    int accumulate, int flags) {
    if (n >= 1 && n <= HYLA_LINEAR_MULTI_MAX && hyla_linear_multi_has_x(x, n, outs))
        return hyla_linear_multi_by_x(cpu_linear_multi, ctx, x, ldx, M, K, n, outs, accumulate, flags);
    if (!(flags & (HYLA_LINEAR_X_BF16 | HYLA_LINEAR_Y_BF16)))
        return cpu_linear_multi_f32(ctx, x, ldx, M, K, n, outs, accumulate, flags);
    if (!((cpu_ctx *)ctx)->bf16_rows || !((flags & HYLA_LINEAR_PREFILL) || flags == HYLA_LINEAR_X_BF16) || n < 1 ||
        n > HYLA_LINEAR_MULTI_MAX || ((flags & HYLA_LINEAR_X_BF16) && ldx != K))
        return hyla_fail(HYLA_ERR_INVALID_ARG, "linear_multi: bf16 rows (flags %d) need prompt rows (or bf16 x alone), "
                                               "ldx == K and a backend created with HYLA_CPU_BF16_ROWS=1", flags);
    float *xf = (flags & HYLA_LINEAR_X_BF16) ? cpu_widen(x, (size_t)M * K) : NULL;
    hyla_linear_out o[HYLA_LINEAR_MULTI_MAX];
    float *yf[HYLA_LINEAR_MULTI_MAX] = {NULL};
    hyla_status st = (flags & HYLA_LINEAR_X_BF16) && !xf ? hyla_fail(HYLA_ERR_NOMEM, "linear_multi: out of memory") : HYLA_OK;
    for (int j = 0; j < n && st == HYLA_OK; j++) {
        o[j] = outs[j];
        if (!(flags & HYLA_LINEAR_Y_BF16)) continue;
        if (accumulate || outs[j].bias || outs[j].ldy != outs[j].N)
            st = hyla_fail(HYLA_ERR_INVALID_ARG, "linear_multi: bf16 output %d has a bias, accumulate or ldy != N", j);
        else if (!(yf[j] = malloc((size_t)M * outs[j].N * sizeof(float) + 4)))
            st = hyla_fail(HYLA_ERR_NOMEM, "linear_multi: out of memory");
        else
            o[j].y = yf[j];
    }
    if (st == HYLA_OK)
        st = cpu_linear_multi_f32(ctx, xf ? xf : x, xf ? K : ldx, M, K, n, o, accumulate, flags & HYLA_LINEAR_PREFILL);
    for (int j = 0; j < n; j++) {
        if (st == HYLA_OK && yf[j]) cpu_round(yf[j], (size_t)M * outs[j].N, outs[j].y);
        free(yf[j]);
    }
    free(xf);
    return st;
}

/* flags HYLA_LINEAR_GATE_BF16: the gate widened from bf16 rows (the bf16 prompt rows, above) */
static hyla_status cpu_gated_rmsnorm_linear(void *ctx, float *o, const float *gate, const float *w, int H, int D,
                                            float eps, int M, const hyla_weight *W, float *y, int N, int flags) {
    if (!(flags & HYLA_LINEAR_GATE_BF16) || !gate)
        return cpu_gated_rmsnorm_linear_f32(ctx, o, gate, w, H, D, eps, M, W, y, N, flags);
    if (!((cpu_ctx *)ctx)->bf16_rows || !(flags & HYLA_LINEAR_PREFILL))
        return hyla_fail(HYLA_ERR_INVALID_ARG, "gated_rmsnorm_linear: a bf16 gate needs prompt rows and a backend "
                                               "created with HYLA_CPU_BF16_ROWS=1");
    float *g = cpu_widen(gate, (size_t)M * H * D);
    hyla_status st = g ? cpu_gated_rmsnorm_linear_f32(ctx, o, g, w, H, D, eps, M, W, y, N, flags)
                       : hyla_fail(HYLA_ERR_NOMEM, "gated_rmsnorm_linear: out of memory");
    free(g);
    return st;
}

static hyla_status cpu_swiglu_linear(void *ctx, float *gate, const float *up, int M, int K, const hyla_weight *W,
                                     float *y, int N, int flags) {
    if (!(flags & HYLA_LINEAR_X_BF16)) return cpu_swiglu_linear_f32(ctx, gate, up, M, K, W, y, N, flags);
    if (!((cpu_ctx *)ctx)->bf16_rows || !(flags & HYLA_LINEAR_PREFILL))
        return hyla_fail(HYLA_ERR_INVALID_ARG, "swiglu_linear: bf16 gate and up need prompt rows and a backend created "
                                               "with HYLA_CPU_BF16_ROWS=1");
    float *g = cpu_widen(gate, (size_t)M * K), *u = cpu_widen(up, (size_t)M * K);
    hyla_status st = g && u ? cpu_swiglu_linear_f32(ctx, g, u, M, K, W, y, N, flags & (HYLA_LINEAR_PREFILL | HYLA_LINEAR_ACC))
                            : hyla_fail(HYLA_ERR_NOMEM, "swiglu_linear: out of memory");
    free(g);
    free(u);
    return st;
}

/* [NORM-1] y = rmsnorm(o; w) · silu(g) per row of D (the head's value dim). */
static hyla_status cpu_gated_rmsnorm(void *ctx, const float *o, const float *g, const float *w, float *y, int rows,
                                     int D, float eps) {
    cpu_ctx *c = ctx;
#pragma omp parallel for num_threads(c->nt) if (rows > 16) schedule(static)
    for (int i = 0; i < rows; i++) {
        const float *orow = o + (size_t)i * D;
        const float *grow = g ? g + (size_t)i * D : NULL;
        float *yr = y + (size_t)i * D;
        float r = rms_inv(orow, D, eps);
        for (int j = 0; j < D; j++) {
            float v = orow[j] * r * w[j];
            yr[j] = grow ? v * cpu_silu(grow[j]) : v;
        }
    }
    return HYLA_OK;
}

/* ------------------------------------------------------------------ sampling [SAMPLE-1]
 *
 * temperature <= 0: argmax of the logits, lowest index on ties; u is ignored.
 * Otherwise, in double:
 *   p_i ∝ exp(l_i/T − max_j l_j/T)
 *   order tokens by (p descending, index ascending) — a total order, so ties are stable;
 *   top-k: keep the first k of that order (top_k <= 0 or >= V: all);
 *   top-p: keep the shortest prefix of the kept tokens whose mass is >= top_p of the kept
 *          mass (the renormalised distribution after top-k, as Hugging Face and vLLM do);
 *          top_p >= 1: all; at least one token is always kept;
 *   draw: walk the kept tokens in VOCABULARY order (ascending index), accumulating p; the
 *         result is the first token whose cumulative mass exceeds u·(kept mass) (the last
 *         kept token if rounding leaves none). Vocabulary order needs no sort when no filter
 *         is active, and a GPU can implement it with a threshold instead of a sort. */

typedef struct {
    double p;
    int32_t i;
} cand;

/* a ranks before b: more probable, or as probable with a lower index. */
static int cand_before(const cand *a, const cand *b) { return a->p > b->p || (a->p == b->p && a->i < b->i); }
static int cand_cmp_rank(const void *x, const void *y) {
    const cand *a = x, *b = y;
    return cand_before(a, b) ? -1 : cand_before(b, a) ? 1 : 0;
}
static int cand_cmp_index(const void *x, const void *y) {
    const cand *a = x, *b = y;
    return (a->i > b->i) - (a->i < b->i);
}

/* Min-heap on rank (root = the worst kept candidate). */
static void heap_sift_down(cand *h, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, worst = i;
        if (l < n && cand_before(&h[worst], &h[l])) worst = l;
        if (r < n && cand_before(&h[worst], &h[r])) worst = r;
        if (worst == i) return;
        cand t = h[i];
        h[i] = h[worst];
        h[worst] = t;
        i = worst;
    }
}

/* e [V] holds unnormalised probabilities; cands [V] is workspace. */
static int32_t sample_row(const double *e, int V, const hyla_sampling *sp, float u, cand *cands) {
    int top_k = sp->top_k > 0 && sp->top_k < V ? sp->top_k : V;
    int use_p = sp->top_p < 1.0f;
    if (top_k == V && !use_p) { /* no filter: inverse CDF over the whole vocabulary */
        double total = 0, cum = 0;
        for (int i = 0; i < V; i++) total += e[i];
        double target = (double)u * total;
        for (int i = 0; i < V; i++) {
            cum += e[i];
            if (cum > target) return i;
        }
        return V - 1;
    }
    int cnt;
    if (top_k < V) { /* bounded heap: the top_k best candidates, then ranked */
        for (int i = 0; i < top_k; i++) cands[i] = (cand){e[i], i};
        for (int i = top_k / 2 - 1; i >= 0; i--) heap_sift_down(cands, top_k, i);
        for (int i = top_k; i < V; i++) {
            cand x = {e[i], i};
            if (cand_before(&x, &cands[0])) {
                cands[0] = x;
                heap_sift_down(cands, top_k, 0);
            }
        }
        cnt = top_k;
    } else {
        for (int i = 0; i < V; i++) cands[i] = (cand){e[i], i};
        cnt = V;
    }
    qsort(cands, (size_t)cnt, sizeof(cand), cand_cmp_rank);
    if (use_p) {
        double kept = 0, cum = 0;
        for (int r = 0; r < cnt; r++) kept += cands[r].p;
        double need = (double)sp->top_p * kept;
        int m = cnt; /* if rounding keeps the sum below `need`, everything stays */
        for (int r = 0; r < cnt; r++) {
            cum += cands[r].p;
            if (cum >= need) {
                m = r + 1;
                break;
            }
        }
        cnt = m;
    }
    qsort(cands, (size_t)cnt, sizeof(cand), cand_cmp_index);
    double total = 0, cum = 0;
    for (int r = 0; r < cnt; r++) total += cands[r].p;
    double target = (double)u * total;
    for (int r = 0; r < cnt; r++) {
        cum += cands[r].p;
        if (cum > target) return cands[r].i;
    }
    return cands[cnt - 1].i;
}

static hyla_status cpu_sample(void *ctx, const float *logits, int B, int V, const hyla_sampling *params,
                              const float *u, int32_t *out) {
    cpu_ctx *c = ctx;
    if (V <= 0) return hyla_fail(HYLA_ERR_INVALID_ARG, "sample: V=%d", V);
    void *mem;
    HYLA_TRY(cpu_scratch(c, (size_t)V * (sizeof(double) + sizeof(cand)), &mem));
    double *e = mem;
    cand *cands = (cand *)(e + V);
    for (int b = 0; b < B; b++) {
        const float *l = logits + (size_t)b * V;
        const hyla_sampling *sp = &params[b];
        if (!(sp->temperature > 0.0f)) {
            int best = 0;
            for (int i = 1; i < V; i++)
                if (l[i] > l[best]) best = i;
            out[b] = best;
            continue;
        }
        double invT = 1.0 / (double)sp->temperature, m = -INFINITY;
        for (int i = 0; i < V; i++)
            if ((double)l[i] * invT > m) m = (double)l[i] * invT;
        for (int i = 0; i < V; i++) e[i] = exp((double)l[i] * invT - m);
        out[b] = sample_row(e, V, sp, u[b], cands);
    }
    return HYLA_OK;
}

/* ------------------------------------------------------------------ ops table */

static void cpu_destroy(void *ctx) {
    cpu_ctx *c = ctx;
    if (!c) return;
    free(c->scratch);
    free(c);
}

static const hyla_ops cpu_ops = {
    .name = "cpu",
    .kv_dtype = HYLA_DT_F32,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_memcpy_op,
    .download = cpu_memcpy_op,
    .copy = cpu_memcpy_op,
    .zero = cpu_zero,
    .sync = cpu_sync,
    .weight_create = cpu_weight_create,
    .weight_destroy = cpu_weight_destroy,
    .embed = cpu_embed,
    .linear = cpu_linear,
    .linear_multi = cpu_linear_multi,
    .swiglu_linear = cpu_swiglu_linear,
    .gated_rmsnorm_linear = cpu_gated_rmsnorm_linear,
    .rmsnorm = cpu_rmsnorm,
    .add_rmsnorm = cpu_add_rmsnorm,
    .add = cpu_add,
    .swiglu = cpu_swiglu,
    .silu = cpu_silu_op,
    .gla_gate = cpu_gla_gate,
    .softmax_rows = cpu_softmax_rows,
    .l2norm_rows = cpu_l2norm_rows,
    .gdn_gates = cpu_gdn_gates,
    .rope = cpu_rope,
    .short_conv = cpu_short_conv,
    .short_conv_multi = cpu_short_conv_multi,
    .gated_rmsnorm = cpu_gated_rmsnorm,
    .gla_prefill = cpu_gla_prefill,
    .gla_decode = cpu_gla_decode,
    .gdn_prefill = cpu_gdn_prefill,
    .gdn_decode = cpu_gdn_decode,
    .attn_prefill = cpu_attn_prefill,
    .attn_decode = cpu_attn_decode,
    /* LTE */
    .lte_score = cpu_lte_score,
    .lte_prefill = cpu_lte_prefill,
    .lte_decode = cpu_lte_decode,
    /* NSA */
    .nsa_prefill = cpu_nsa_prefill,
    .nsa_decode = cpu_nsa_decode,
    /* DLA */
    .dla_prefill = cpu_dla_prefill,
    .dla_decode = cpu_dla_decode,
    .sse_route = cpu_sse_route,
    .sse_prefill = cpu_sse_prefill,
    .sse_decode = cpu_sse_decode,
    .sample = cpu_sample,
    .destroy = cpu_destroy,
    .host_alloc = cpu_host_alloc,
    .host_free = cpu_host_free,
    .capture_begin = cpu_capture_begin,
    .capture_done = cpu_capture_done,
    .capture_end = cpu_capture_end,
    /* Mamba2 */
    .copy2d = cpu_copy2d,
    .ssd_prefill = cpu_ssd_prefill,
    .ssd_decode = cpu_ssd_decode,
    .ssd_norm = cpu_ssd_norm,
    .ssd_gates = cpu_ssd_gates,
    .ssd_skip = cpu_ssd_skip,
    .upload_begin = cpu_upload_begin,
};
/* the same with the bf16 prompt rows (HYLA_CPU_BF16_ROWS=1) */
static hyla_ops cpu_ops_bf16;

/* decode rows too: every row count, so that a row's result does not depend on its batch (the
 * fp32 linear does not round x, so rows in bf16 differ from fp32 rows: all or none) */
static int cpu_decode_bf16_rows(void *ctx, int M, int K) {
    (void)ctx;
    return M >= 1 && K >= 1;
}

static void cpu_ops_bf16_init(void) {
    cpu_ops_bf16 = cpu_ops;
    cpu_ops_bf16.rmsnorm_bf16 = cpu_rmsnorm_bf16;
    cpu_ops_bf16.decode_bf16_rows = cpu_decode_bf16_rows;
}

hyla_status hyla_cpu_backend_create(int n_threads, hyla_backend **out) {
    *out = NULL;
    cpu_ctx *c = calloc(1, sizeof *c);
    hyla_backend *b = calloc(1, sizeof *b);
    if (!c || !b) {
        free(c);
        free(b);
        return hyla_fail(HYLA_ERR_NOMEM, "cpu backend: out of memory");
    }
    if (n_threads > 0) {
        c->nt = n_threads;
    } else {
        c->nt = omp_get_num_procs();
    }
    if (c->nt < 1) c->nt = 1;
    b->ops = &cpu_ops;
    const char *cm = getenv("HYLA_CPU_CAPTURE_MS");
    c->capture_s = cm && *cm ? atof(cm) / 1e3 : 0;
    const char *br = getenv("HYLA_CPU_BF16_ROWS");
    if (br && !strcmp(br, "1")) {
        static pthread_once_t once = PTHREAD_ONCE_INIT;
        pthread_once(&once, cpu_ops_bf16_init);
        c->bf16_rows = 1;
        b->ops = &cpu_ops_bf16;
    }
    b->ctx = c;
    *out = b;
    return HYLA_OK;
}
