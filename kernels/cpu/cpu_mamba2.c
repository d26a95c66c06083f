/* cpu_mamba2.c — Mamba2's SSD mixer on the CPU reference backend [M2-1..3]: the step sizes
 * and decays, the chunked prefill (the SSD form of docs/MODELS.md "Mamba2"), the recurrent
 * decode step, the gate-before-norm grouped RMSNorm, and the strided copy the mixer uses to
 * cut its input projection.
 *
 * Invariants:
 *   - States are fp32 [H][N][P] (row i = state dim, column j = head dim), the GLA layout with
 *     dk = N and dv = P: the SSD recurrence is GLA's with one scalar decay per head and token.
 *   - dt' and the per-token log decay a = −exp(A_log)·dt' are formed once per (token, head) by
 *     m2_step, shared by prefill and decode, so both see the same bits of a.
 *   - Prefill cuts the n tokens into chunks of M2_CHUNK (64) from the call's first token (the
 *     engine aligns pieces to absolute positions). Within a chunk the cumulative log decay
 *     b_t = Σ_{s<=t} a_s is summed in double and a decay is only ever exp(b_t − b_s), s <= t,
 *     so no factor can overflow however negative the decays are.
 * Threading: prefill parallelises over heads, decode over sessions × heads; each task owns its
 * head's state and outputs; per-thread workspace is carved by omp_get_thread_num(). Results do
 * not depend on the thread count. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "cpu_impl.h"

#define M2_CHUNK 64
#define CPU_SIMD _Pragma("omp simd")

/* softplus(x) = max(x,0) + log1p(e^−|x|), exact for every x. */
static double m2_softplus(double x) { return fmax(x, 0.0) + log1p(exp(-fabs(x))); }

/* [M2-1] dt' = clamp(softplus(dt + dt_bias), lo, hi) and a = −exp(A_log)·dt' (both fp32). */
static void m2_step(float dt, float dt_bias, float A_log, float lo, float hi, float *dtp, float *a) {
    double d = m2_softplus((double)dt + (double)dt_bias);
    if (d < lo) d = lo;
    if (d > hi) d = hi;
    float df = (float)d;
    *dtp = df;
    *a = (float)-exp((double)A_log) * df;
}

static hyla_status m2_check(const char *op, int n, int ldx, int ld_dt, int H, int P, int G, int N) {
    if (n < 0 || H <= 0 || P <= 0 || G <= 0 || N <= 0 || H % G || ldx < H * P + 2 * G * N || ld_dt < H)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "%s: n=%d H=%d P=%d G=%d N=%d ldx=%d ld_dt=%d", op, n, H, P, G, N, ldx,
                         ld_dt);
    return HYLA_OK;
}

/* Floats of per-thread workspace for one chunk: v [C][P], o [C][P], A [C][C], dt' and a [C],
 * then b [C] doubles. */
static size_t m2_ws_floats(int P) {
    size_t C = M2_CHUNK;
    return cpu_align64(sizeof(float) * C * (2 * (size_t)P + C + 2) + sizeof(double) * C + 64) / sizeof(float);
}

/* One head over one chunk of L tokens starting at row t0 [M2-2]. With b_t = Σ_{s<=t} a_s,
 * v_s = dt'_s x_s and the head's group rows B_s, C_t:
 *   y_t = exp(b_t) (C_t S_0) + Σ_{s<=t} exp(b_t − b_s) (C_t·B_s) v_s + D x_t
 *   S_L = exp(b_L) S_0 + Σ_s exp(b_L − b_s) B_sᵀ v_s */
static void m2_chunk(const float *xbc, int ldx, const float *dt, int ld_dt, float dt_bias, float A_log, float Dh,
                     float lo, float hi, int t0, int L, int h, int H, int P, int G, int N, float *S, float *y,
                     float *ws) {
    const size_t C = M2_CHUNK;
    float *v = ws, *o = v + C * P, *A = o + C * P, *dtp = A + C * C, *av = dtp + C;
    double *b = (double *)(av + C);
    int g = h / (H / G);
    size_t xo = (size_t)h * P, bo = (size_t)H * P + (size_t)g * N, co = (size_t)H * P + (size_t)G * N + (size_t)g * N;
    for (int t = 0; t < L; t++) {
        size_t r = (size_t)(t0 + t);
        m2_step(dt[r * ld_dt + h], dt_bias, A_log, lo, hi, &dtp[t], &av[t]);
        b[t] = (t ? b[t - 1] : 0.0) + (double)av[t];
        const float *x = xbc + r * ldx + xo;
        CPU_SIMD
        for (int j = 0; j < P; j++) v[(size_t)t * P + j] = dtp[t] * x[j];
    }
    /* what S_0 contributes */
    for (int t = 0; t < L; t++) {
        const float *Ct = xbc + (size_t)(t0 + t) * ldx + co;
        float *ot = o + (size_t)t * P;
        memset(ot, 0, (size_t)P * sizeof(float));
        for (int i = 0; i < N; i++) {
            float ci = Ct[i];
            const float *Si = S + (size_t)i * P;
            CPU_SIMD
            for (int j = 0; j < P; j++) ot[j] += ci * Si[j];
        }
        float e = (float)exp(b[t]);
        CPU_SIMD
        for (int j = 0; j < P; j++) ot[j] *= e;
    }
    /* decayed causal scores, then their values */
    for (int t = 0; t < L; t++) {
        const float *Ct = xbc + (size_t)(t0 + t) * ldx + co;
        for (int s = 0; s <= t; s++) {
            const float *Bs = xbc + (size_t)(t0 + s) * ldx + bo;
            float cb = 0.0f;
            for (int i = 0; i < N; i++) cb += Ct[i] * Bs[i];
            A[(size_t)t * C + s] = cb * (float)exp(b[t] - b[s]);
        }
    }
    for (int t = 0; t < L; t++) {
        float *ot = o + (size_t)t * P;
        for (int s = 0; s <= t; s++) {
            float a = A[(size_t)t * C + s];
            const float *vs = v + (size_t)s * P;
            CPU_SIMD
            for (int j = 0; j < P; j++) ot[j] += a * vs[j];
        }
        const float *x = xbc + (size_t)(t0 + t) * ldx + xo;
        float *yt = y + (size_t)(t0 + t) * H * P + xo;
        CPU_SIMD
        for (int j = 0; j < P; j++) yt[j] = ot[j] + Dh * x[j];
    }
    /* the state at the end of the chunk */
    float eL = (float)exp(b[L - 1]);
    for (int i = 0; i < N; i++) {
        float *Si = S + (size_t)i * P;
        CPU_SIMD
        for (int j = 0; j < P; j++) Si[j] *= eL;
        for (int s = 0; s < L; s++) {
            float f = xbc[(size_t)(t0 + s) * ldx + bo + i] * (float)exp(b[L - 1] - b[s]);
            const float *vs = v + (size_t)s * P;
            CPU_SIMD
            for (int j = 0; j < P; j++) Si[j] += f * vs[j];
        }
    }
}

hyla_status cpu_ssd_prefill(void *ctx, const float *xbc, int ldx, const float *dt, int ld_dt, const float *dt_bias,
                            const float *A_log, const float *Dskip, float dt_min, float dt_max, int n, int H, int P,
                            int G, int N, float *S, float *y) {
    cpu_ctx *c = ctx;
    HYLA_TRY(m2_check("ssd_prefill", n, ldx, ld_dt, H, P, G, N));
    if (n == 0) return HYLA_OK;
    size_t wsf = m2_ws_floats(P);
    void *mem;
    HYLA_TRY(cpu_scratch(c, (size_t)c->nt * wsf * sizeof(float), &mem));
#pragma omp parallel for num_threads(c->nt) schedule(dynamic, 1)
    for (int h = 0; h < H; h++) {
        float *ws = (float *)mem + (size_t)omp_get_thread_num() * wsf;
        float *Sh = S + (size_t)h * N * P;
        for (int t0 = 0; t0 < n; t0 += M2_CHUNK) {
            int L = n - t0 < M2_CHUNK ? n - t0 : M2_CHUNK;
            m2_chunk(xbc, ldx, dt, ld_dt, dt_bias[h], A_log[h], Dskip[h], dt_min, dt_max, t0, L, h, H, P, G, N, Sh, y,
                     ws);
        }
    }
    return HYLA_OK;
}

/* [M2-2] one token of one head: S = exp(a) S + Bᵀ (dt' x); y = C S + D x. */
hyla_status cpu_ssd_decode(void *ctx, const float *xbc, int ldx, const float *dt, int ld_dt, const float *dt_bias,
                           const float *A_log, const float *Dskip, float dt_min, float dt_max, int B, int H, int P,
                           int G, int N, float *const *S, float *y) {
    cpu_ctx *c = ctx;
    HYLA_TRY(m2_check("ssd_decode", B, ldx, ld_dt, H, P, G, N));
    for (int b = 0; b < B; b++)
        if (!S[b]) return hyla_fail(HYLA_ERR_INVALID_ARG, "ssd_decode: session %d has no state", b);
    void *mem;
    HYLA_TRY(cpu_scratch(c, (size_t)c->nt * 2 * (size_t)P * sizeof(float), &mem));
    long tasks = (long)B * H;
#pragma omp parallel for num_threads(c->nt) if (tasks > 1) schedule(static)
    for (long task = 0; task < tasks; task++) {
        int b = (int)(task / H), h = (int)(task % H), g = h / (H / G);
        float *v = (float *)mem + (size_t)omp_get_thread_num() * 2 * P, *acc = v + P;
        const float *row = xbc + (size_t)b * ldx;
        const float *x = row + (size_t)h * P, *Bg = row + (size_t)H * P + (size_t)g * N;
        const float *Cg = row + (size_t)H * P + (size_t)G * N + (size_t)g * N;
        float dtp, a;
        m2_step(dt[(size_t)b * ld_dt + h], dt_bias[h], A_log[h], dt_min, dt_max, &dtp, &a);
        float d = expf(a);
        float *Sh = S[b] + (size_t)h * N * P;
        CPU_SIMD
        for (int j = 0; j < P; j++) v[j] = dtp * x[j];
        for (int i = 0; i < N; i++) {
            float bi = Bg[i];
            float *Si = Sh + (size_t)i * P;
            CPU_SIMD
            for (int j = 0; j < P; j++) Si[j] = d * Si[j] + bi * v[j];
        }
        memset(acc, 0, (size_t)P * sizeof(float));
        for (int i = 0; i < N; i++) {
            float ci = Cg[i];
            const float *Si = Sh + (size_t)i * P;
            CPU_SIMD
            for (int j = 0; j < P; j++) acc[j] += ci * Si[j];
        }
        float *yt = y + ((size_t)b * H + h) * P;
        float Dh = Dskip[h];
        CPU_SIMD
        for (int j = 0; j < P; j++) yt[j] = acc[j] + Dh * x[j];
    }
    return HYLA_OK;
}

/* [M2-3] y = rmsnorm_group(o ⊙ silu(z)) ⊙ w, the sum of squares in double. */
hyla_status cpu_ssd_norm(void *ctx, const float *o, const float *z, int ldz, const float *w, float *y, int rows, int G,
                         int gs, float eps) {
    cpu_ctx *c = ctx;
    if (rows < 0 || G <= 0 || gs <= 0 || ldz < G * gs)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "ssd_norm: rows=%d G=%d gs=%d ldz=%d", rows, G, gs, ldz);
    size_t Dm = (size_t)G * gs;
#pragma omp parallel for num_threads(c->nt) if (rows > 16) schedule(static)
    for (int r = 0; r < rows; r++) {
        const float *orow = o + (size_t)r * Dm, *zr = z + (size_t)r * ldz;
        float *yr = y + (size_t)r * Dm;
        for (int g = 0; g < G; g++) {
            size_t j0 = (size_t)g * gs;
            double ss = 0;
            for (int j = 0; j < gs; j++) {
                float u = orow[j0 + j] * cpu_silu(zr[j0 + j]);
                ss += (double)u * u;
            }
            float inv = (float)(1.0 / sqrt(ss / gs + (double)eps));
            for (int j = 0; j < gs; j++) {
                float u = orow[j0 + j] * cpu_silu(zr[j0 + j]);
                yr[j0 + j] = u * inv * w[j0 + j];
            }
        }
    }
    return HYLA_OK;
}

hyla_status cpu_copy2d(void *ctx, float *dst, int ldd, const float *src, int lds, int rows, int cols) {
    (void)ctx;
    if (rows < 0 || cols < 0 || ldd < cols || lds < cols)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "copy2d: rows=%d cols=%d ldd=%d lds=%d", rows, cols, ldd, lds);
    for (int r = 0; r < rows; r++) memcpy(dst + (size_t)r * ldd, src + (size_t)r * lds, (size_t)cols * sizeof(float));
    return HYLA_OK;
}

hyla_status cpu_ssd_gates(void *ctx, const float *dt, int ld_dt, const float *dt_bias, const float *A_log, float dt_min,
                          float dt_max, int n, int H, float *a, float *dtp) {
    (void)ctx;
    if (n < 0 || H <= 0 || ld_dt < H)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "ssd_gates: n=%d H=%d ld_dt=%d", n, H, ld_dt);
    for (int t = 0; t < n; t++)
        for (int h = 0; h < H; h++) {
            size_t r = (size_t)t * H + h;
            m2_step(dt[(size_t)t * ld_dt + h], dt_bias[h], A_log[h], dt_min, dt_max, &dtp[r], &a[r]);
        }
    return HYLA_OK;
}

hyla_status cpu_ssd_skip(void *ctx, float *y, const float *x, int ldx, const float *Dskip, int n, int H, int P) {
    (void)ctx;
    if (n < 0 || H <= 0 || P <= 0 || ldx < H * P)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "ssd_skip: n=%d H=%d P=%d ldx=%d", n, H, P, ldx);
    for (int t = 0; t < n; t++)
        for (int h = 0; h < H; h++) {
            float *yr = y + ((size_t)t * H + h) * P;
            const float *xr = x + (size_t)t * ldx + (size_t)h * P;
            float d = Dskip[h];
            for (int j = 0; j < P; j++) yr[j] += d * xr[j];
        }
    return HYLA_OK;
}
