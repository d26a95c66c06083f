/* cpu_mixers.c — the token mixers of the CPU reference backend: GLA [GLA-1], the gated
 * delta rule [GDN-3], sparse state expansion [SSE-1..4] and paged softmax attention
 * [ATTN-2], each as a decode step (the recurrence, one token) and a prefill (the chunked
 * form of docs/MODELS.md §4, equal to the recurrence up to float rounding).
 *
 * Invariants:
 *   - States are fp32 [H][dk][dv] (row i = key dim); products and sums are fp32, written in
 *     the order of the spec's formulas so the CUDA backend can mirror it.
 *   - Prefill cuts the n tokens of a call into chunks of CPU_CHUNK (64) starting at the
 *     call's first token; the engine passes chunks aligned to absolute positions, so a
 *     prefill interrupted at a chunk boundary and resumed gives the same bits.
 *   - A decay factor is only ever formed as exp(b_t − b_s) with s <= t (never exp(b_t) ·
 *     exp(−b_s)), so gates as negative as they come cannot overflow. The cumulative log
 *     decays b_t (GLA) and G_t (GDN) are summed and differenced in double: in fp32 a
 *     difference of two large cumulative sums loses the digits that matter.
 *   - SSE: a partition that no token selects is neither read nor written (bit-identical).
 *
 * Threading: prefill parallelises over heads (SSE: over partitions × heads), decode over
 * sessions × heads, attention over tokens × query heads. Each task owns its outputs and the
 * state slice it updates; per-thread workspace is carved from the context's scratch by
 * omp_get_thread_num(). Results do not depend on the thread count. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "cpu_impl.h"

#define CPU_CHUNK 64

/* Marks a loop of independent elementwise updates (never a reduction): vectorising it
 * changes no bits, and without it -O2 leaves loops of unknown length scalar. */
#define CPU_SIMD _Pragma("omp simd")

/* ------------------------------------------------------------------ sequences and chunks */

/* The tokens of one head as a chunk routine reads them. Element e (0..m-1) of the sequence is
 * source token tok[e] (or e); its q and k are multiplied by w[e] (SSE's write/read weight) when
 * w is set; its output goes to o + orow[e]*so (or e*so). */
typedef struct {
    const float *q, *k; /* token 0 of this head; token stride sqk */
    const float *v;     /* token stride sv */
    const float *g;     /* GLA: [dk] per token; GDN: 1 per token; token stride sg */
    const float *beta;  /* GDN only; token stride sg */
    size_t sqk, sv, sg;
    const int32_t *tok;
    const float *w;
    const int32_t *orow;
    float *o;
    size_t so;
    int m;
} cpu_seq;

/* Floats of per-thread workspace for one chunk (GLA and GDN both fit). */
static size_t chunk_ws_floats(int dk, int dv) {
    size_t C = CPU_CHUNK;
    /* q, k, g [C][dk] + v, o, u [C][dv] + A [C][C] + β [C] floats; b [C][dk] + G [C] doubles */
    return cpu_align64(sizeof(float) * C * (3 * (size_t)dk + 3 * (size_t)dv + C + 1) +
                       sizeof(double) * C * ((size_t)dk + 1) + 64) / sizeof(float);
}

/* Copy elements [e0, e0+L) of a sequence into contiguous chunk buffers (q, k scaled by w). */
static void chunk_load(const cpu_seq *s, int e0, int L, int dk, int dv, int g_per_key, float *qc, float *kc,
                       float *vc, float *gc, float *bc) {
    for (int t = 0; t < L; t++) {
        int e = e0 + t;
        size_t src = s->tok ? (size_t)s->tok[e] : (size_t)e;
        float wt = s->w ? s->w[e] : 1.0f;
        const float *qs = s->q + src * s->sqk, *ks = s->k + src * s->sqk;
        for (int i = 0; i < dk; i++) {
            qc[(size_t)t * dk + i] = wt * qs[i];
            kc[(size_t)t * dk + i] = wt * ks[i];
        }
        memcpy(vc + (size_t)t * dv, s->v + src * s->sv, (size_t)dv * sizeof(float));
        if (g_per_key) {
            memcpy(gc + (size_t)t * dk, s->g + src * s->sg, (size_t)dk * sizeof(float));
        } else {
            gc[t] = s->g[src * s->sg];
            bc[t] = s->beta[src * s->sg];
        }
    }
}

static void chunk_store(const cpu_seq *s, int e0, int L, int dv, const float *oc) {
    for (int t = 0; t < L; t++) {
        int e = e0 + t;
        size_t row = s->orow ? (size_t)s->orow[e] : (size_t)e;
        memcpy(s->o + row * s->so, oc + (size_t)t * dv, (size_t)dv * sizeof(float));
    }
}

/* GLA chunked form (MODELS.md §4.1) over one chunk of L tokens of one head.
 * In: qc, kc, gc [L][dk], vc [L][dv]; S [dk][dv] = S_0. Out: oc [L][dv], S = S_L.
 * b [L][dk] (double) and A [L][L] are workspace. With b_t = Σ_{s<=t} gk_s:
 *   o_t = scale·(q_t ⊙ exp(b_t)) S_0 + Σ_{s<=t} [scale·(q_t ⊙ exp(b_t − b_s))·k_s] v_s
 *   S_L = diag(exp(b_L)) S_0 + Σ_s (k_s ⊙ exp(b_L − b_s))ᵀ v_s */
static void gla_chunk(float *qc, const float *kc, const float *gc, const float *vc, int L, int dk, int dv,
                      float scale, float *S, float *oc, double *b, float *A) {
    for (int t = 0; t < L; t++)
        for (int i = 0; i < dk; i++)
            b[(size_t)t * dk + i] = (t ? b[(size_t)(t - 1) * dk + i] : 0.0) + gc[(size_t)t * dk + i];
    for (size_t x = 0; x < (size_t)L * dk; x++) qc[x] *= scale; /* scale·q, as in [GLA-1] */

    /* inter-chunk: what S_0 contributes */
    for (int t = 0; t < L; t++) {
        float *ot = oc + (size_t)t * dv;
        memset(ot, 0, (size_t)dv * sizeof(float));
        for (int i = 0; i < dk; i++) {
            float f = qc[(size_t)t * dk + i] * (float)exp(b[(size_t)t * dk + i]);
            const float *Si = S + (size_t)i * dv;
            CPU_SIMD
            for (int j = 0; j < dv; j++) ot[j] += f * Si[j];
        }
    }
    /* intra-chunk: decayed causal scores, then their values */
    for (int t = 0; t < L; t++) {
        const float *qt = qc + (size_t)t * dk;
        const double *bt = b + (size_t)t * dk;
        for (int s = 0; s <= t; s++) {
            const float *ks = kc + (size_t)s * dk;
            const double *bs = b + (size_t)s * dk;
            float a = 0.0f;
            for (int i = 0; i < dk; i++) a += qt[i] * ks[i] * (float)exp(bt[i] - bs[i]);
            A[(size_t)t * L + s] = a;
        }
    }
    for (int t = 0; t < L; t++) {
        float *ot = oc + (size_t)t * dv;
        for (int s = 0; s <= t; s++) {
            float a = A[(size_t)t * L + s];
            const float *vs = vc + (size_t)s * dv;
            CPU_SIMD
            for (int j = 0; j < dv; j++) ot[j] += a * vs[j];
        }
    }
    /* state at the end of the chunk */
    const double *bL = b + (size_t)(L - 1) * dk;
    for (int i = 0; i < dk; i++) {
        float *Si = S + (size_t)i * dv;
        float d = (float)exp(bL[i]);
        CPU_SIMD
        for (int j = 0; j < dv; j++) Si[j] *= d;
        for (int s = 0; s < L; s++) {
            float f = kc[(size_t)s * dk + i] * (float)exp(bL[i] - b[(size_t)s * dk + i]);
            const float *vs = vc + (size_t)s * dv;
            CPU_SIMD
            for (int j = 0; j < dv; j++) Si[j] += f * vs[j];
        }
    }
}

/* Gated delta rule, chunked (MODELS.md §4.2, WY / UT form) over one chunk of L tokens.
 * In: qc, kc [L][dk], vc [L][dv], gc, bc [L] (g, β); S = S_0. Out: oc [L][dv], S = S_L.
 * With G_t = Σ_{s<=t} g_s and γ_t = exp(G_t), the recurrence [GDN-3] unrolls to
 *   S_t = γ_t S_0 + Σ_{s<=t} exp(G_t − G_s) k_sᵀ u_s
 * where the pseudo-values u solve the unit lower-triangular system (I + A) U = R:
 *   A[t][s] = β_t exp(G_t − G_s) (k_t·k_s)  (s < t),   R_t = β_t (v_t − γ_t k_t S_0),
 * i.e. U = T R with T = (I + tril(diag(β) K Kᵀ ⊙ Γ, −1))⁻¹, applied here by forward
 * substitution. Then o_t = scale·q_t S_t and S_L follow from the unrolled form.
 * Workspace: G [L] (double), A [L][L], u [L][dv]. */
static void gdn_chunk(float *qc, const float *kc, const float *vc, const float *gc, const float *bc, int L, int dk,
                      int dv, float scale, float *S, float *oc, double *G, float *A, float *u) {
    for (int t = 0; t < L; t++) G[t] = (t ? G[t - 1] : 0.0) + gc[t];
    for (size_t x = 0; x < (size_t)L * dk; x++) qc[x] *= scale;

    /* R_t = β_t (v_t − γ_t k_t S_0) */
    for (int t = 0; t < L; t++) {
        float *ut = u + (size_t)t * dv;
        memset(ut, 0, (size_t)dv * sizeof(float));
        for (int i = 0; i < dk; i++) {
            float kti = kc[(size_t)t * dk + i];
            const float *Si = S + (size_t)i * dv;
            CPU_SIMD
            for (int j = 0; j < dv; j++) ut[j] += kti * Si[j];
        }
        float gam = (float)exp(G[t]);
        const float *vt = vc + (size_t)t * dv;
        CPU_SIMD
        for (int j = 0; j < dv; j++) ut[j] = bc[t] * (vt[j] - gam * ut[j]);
    }
    /* A (strictly lower) and forward substitution u_t = R_t − Σ_{s<t} A[t][s] u_s */
    for (int t = 0; t < L; t++) {
        const float *kt = kc + (size_t)t * dk;
        for (int s = 0; s < t; s++) {
            const float *ks = kc + (size_t)s * dk;
            float kk = 0.0f;
            for (int i = 0; i < dk; i++) kk += kt[i] * ks[i];
            A[(size_t)t * L + s] = bc[t] * (float)exp(G[t] - G[s]) * kk;
        }
    }
    for (int t = 0; t < L; t++) {
        float *ut = u + (size_t)t * dv;
        for (int s = 0; s < t; s++) {
            float a = A[(size_t)t * L + s];
            const float *us = u + (size_t)s * dv;
            CPU_SIMD
            for (int j = 0; j < dv; j++) ut[j] -= a * us[j];
        }
    }
    /* o_t = γ_t (scale q_t) S_0 + Σ_{s<=t} exp(G_t − G_s) ((scale q_t)·k_s) u_s */
    for (int t = 0; t < L; t++) {
        float *ot = oc + (size_t)t * dv;
        const float *qt = qc + (size_t)t * dk;
        memset(ot, 0, (size_t)dv * sizeof(float));
        for (int i = 0; i < dk; i++) {
            const float *Si = S + (size_t)i * dv;
            CPU_SIMD
            for (int j = 0; j < dv; j++) ot[j] += qt[i] * Si[j];
        }
        float gam = (float)exp(G[t]);
        CPU_SIMD
        for (int j = 0; j < dv; j++) ot[j] *= gam;
        for (int s = 0; s <= t; s++) {
            const float *ks = kc + (size_t)s * dk;
            float qk = 0.0f;
            for (int i = 0; i < dk; i++) qk += qt[i] * ks[i];
            float a = (float)exp(G[t] - G[s]) * qk;
            const float *us = u + (size_t)s * dv;
            CPU_SIMD
            for (int j = 0; j < dv; j++) ot[j] += a * us[j];
        }
    }
    /* S_L = γ_L S_0 + Σ_s exp(G_L − G_s) k_sᵀ u_s */
    float gL = (float)exp(G[L - 1]);
    for (int i = 0; i < dk; i++) {
        float *Si = S + (size_t)i * dv;
        CPU_SIMD
        for (int j = 0; j < dv; j++) Si[j] *= gL;
        for (int s = 0; s < L; s++) {
            float f = (float)exp(G[L - 1] - G[s]) * kc[(size_t)s * dk + i];
            const float *us = u + (size_t)s * dv;
            CPU_SIMD
            for (int j = 0; j < dv; j++) Si[j] += f * us[j];
        }
    }
}

/* Run a whole sequence of one head through the chunk routine of its transition, chunk by
 * chunk. gdn = 0: GLA; 1: GDN. ws: chunk_ws_floats(dk, dv) floats. */
static void seq_run(const cpu_seq *s, int gdn, int dk, int dv, float scale, float *S, float *ws) {
    const size_t C = CPU_CHUNK;
    double *b = (double *)ws, *G = b + C * dk;                           /* [C][dk], [C] */
    float *qc = (float *)(G + C), *kc = qc + C * dk, *gc = kc + C * dk;   /* [C][dk] each */
    float *vc = gc + C * dk, *oc = vc + C * dv, *u = oc + C * dv;         /* [C][dv] each */
    float *A = u + C * dv, *bc = A + C * C;                              /* [C][C], [C] */
    for (int e0 = 0; e0 < s->m; e0 += CPU_CHUNK) {
        int L = s->m - e0 < CPU_CHUNK ? s->m - e0 : CPU_CHUNK;
        chunk_load(s, e0, L, dk, dv, !gdn, qc, kc, vc, gc, bc);
        if (gdn)
            gdn_chunk(qc, kc, vc, gc, bc, L, dk, dv, scale, S, oc, G, A, u);
        else
            gla_chunk(qc, kc, gc, vc, L, dk, dv, scale, S, oc, b, A);
        chunk_store(s, e0, L, dv, oc);
    }
}

/* ------------------------------------------------------------------ decode steps */

/* o (+)= (scale·(w q)) S for one head, summed in acc [dv] first: the read-out that ends the GLA
 * and GDN steps, in one place so both sum in the same order. */
static void step_read(const float *q, float wt, int dk, int dv, float scale, const float *S, float *o, float *acc,
                      int accumulate) {
    memset(acc, 0, (size_t)dv * sizeof(float));
    for (int i = 0; i < dk; i++) {
        float qi = scale * (wt * q[i]);
        const float *Si = S + (size_t)i * dv;
        CPU_SIMD
        for (int j = 0; j < dv; j++) acc[j] += qi * Si[j];
    }
    CPU_SIMD
    for (int j = 0; j < dv; j++) o[j] = accumulate ? o[j] + acc[j] : acc[j];
}

/* [GLA-1] one token of one head: S = diag(exp(gk)) S + (w k)ᵀ v; o (+)= (scale·(w q)) S.
 * tmp: [dv]. */
static void gla_step(const float *q, const float *k, const float *v, const float *gk, float wt, int dk, int dv,
                     float scale, float *S, float *o, float *tmp, int accumulate) {
    for (int i = 0; i < dk; i++) {
        float d = expf(gk[i]), kw = wt * k[i];
        float *Si = S + (size_t)i * dv;
        CPU_SIMD
        for (int j = 0; j < dv; j++) Si[j] = d * Si[j] + kw * v[j];
    }
    step_read(q, wt, dk, dv, scale, S, o, tmp, accumulate);
}

/* [GDN-3] one token of one head with key w·k and query w·q:
 * S' = exp(g) S; S = S' + β (w k)ᵀ (v − (w k) S'); o (+)= (scale·(w q)) S. tmp: [2][dv]. */
static void gdn_step(const float *q, const float *k, const float *v, float g, float beta, float wt, int dk, int dv,
                     float scale, float *S, float *o, float *tmp, int accumulate) {
    float d = expf(g);
    float *u = tmp, *acc = tmp + dv;
    CPU_SIMD
    for (size_t x = 0; x < (size_t)dk * dv; x++) S[x] *= d;
    memset(u, 0, (size_t)dv * sizeof(float));
    for (int i = 0; i < dk; i++) {
        float kw = wt * k[i];
        const float *Si = S + (size_t)i * dv;
        CPU_SIMD
        for (int j = 0; j < dv; j++) u[j] += kw * Si[j];
    }
    CPU_SIMD
    for (int j = 0; j < dv; j++) u[j] = beta * (v[j] - u[j]);
    for (int i = 0; i < dk; i++) {
        float kw = wt * k[i];
        float *Si = S + (size_t)i * dv;
        CPU_SIMD
        for (int j = 0; j < dv; j++) Si[j] += kw * u[j];
    }
    step_read(q, wt, dk, dv, scale, S, o, acc, accumulate);
}

static hyla_status check_dims(const char *op, int n, int H, int dk, int dv) {
    if (n < 0 || H <= 0 || dk <= 0 || dv <= 0)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "%s: n=%d H=%d dk=%d dv=%d", op, n, H, dk, dv);
    return HYLA_OK;
}

/* ------------------------------------------------------------------ GLA, GDN */

hyla_status cpu_gla_prefill(void *ctx, const float *q, const float *k, const float *v, const float *gk, int n, int H,
                            int dk, int dv, float scale, float *S, float *o) {
    cpu_ctx *c = ctx;
    HYLA_TRY(check_dims("gla_prefill", n, H, dk, dv));
    if (n == 0) return HYLA_OK;
    size_t wsf = chunk_ws_floats(dk, dv);
    void *mem;
    HYLA_TRY(cpu_scratch(c, (size_t)c->nt * wsf * sizeof(float), &mem));
#pragma omp parallel for num_threads(c->nt) schedule(dynamic, 1)
    for (int h = 0; h < H; h++) {
        cpu_seq s = {.q = q + (size_t)h * dk, .k = k + (size_t)h * dk, .v = v + (size_t)h * dv,
                     .g = gk + (size_t)h * dk, .sqk = (size_t)H * dk, .sv = (size_t)H * dv, .sg = (size_t)H * dk,
                     .o = o + (size_t)h * dv, .so = (size_t)H * dv, .m = n};
        float *ws = (float *)mem + (size_t)omp_get_thread_num() * wsf;
        seq_run(&s, 0, dk, dv, scale, S + (size_t)h * dk * dv, ws);
    }
    return HYLA_OK;
}

hyla_status cpu_gla_decode(void *ctx, const float *q, const float *k, const float *v, const float *gk, int B, int H,
                           int dk, int dv, float scale, float *const *S, float *o) {
    cpu_ctx *c = ctx;
    HYLA_TRY(check_dims("gla_decode", B, H, dk, dv));
    void *mem;
    HYLA_TRY(cpu_scratch(c, (size_t)c->nt * dv * sizeof(float), &mem));
    long tasks = (long)B * H;
#pragma omp parallel for num_threads(c->nt) if (tasks > 1) schedule(static)
    for (long task = 0; task < tasks; task++) {
        int b = (int)(task / H), h = (int)(task % H);
        size_t qk = ((size_t)b * H + h) * dk, vo = ((size_t)b * H + h) * dv;
        float *tmp = (float *)mem + (size_t)omp_get_thread_num() * dv;
        gla_step(q + qk, k + qk, v + vo, gk + qk, 1.0f, dk, dv, scale, S[b] + (size_t)h * dk * dv, o + vo, tmp, 0);
    }
    return HYLA_OK;
}

hyla_status cpu_gdn_prefill(void *ctx, const float *q, const float *k, const float *v, const float *g,
                            const float *beta, int n, int H, int dk, int dv, float scale, float *S, float *o) {
    cpu_ctx *c = ctx;
    HYLA_TRY(check_dims("gdn_prefill", n, H, dk, dv));
    if (n == 0) return HYLA_OK;
    size_t wsf = chunk_ws_floats(dk, dv);
    void *mem;
    HYLA_TRY(cpu_scratch(c, (size_t)c->nt * wsf * sizeof(float), &mem));
#pragma omp parallel for num_threads(c->nt) schedule(dynamic, 1)
    for (int h = 0; h < H; h++) {
        cpu_seq s = {.q = q + (size_t)h * dk, .k = k + (size_t)h * dk, .v = v + (size_t)h * dv, .g = g + h,
                     .beta = beta + h, .sqk = (size_t)H * dk, .sv = (size_t)H * dv, .sg = (size_t)H,
                     .o = o + (size_t)h * dv, .so = (size_t)H * dv, .m = n};
        float *ws = (float *)mem + (size_t)omp_get_thread_num() * wsf;
        seq_run(&s, 1, dk, dv, scale, S + (size_t)h * dk * dv, ws);
    }
    return HYLA_OK;
}

hyla_status cpu_gdn_decode(void *ctx, const float *q, const float *k, const float *v, const float *g,
                           const float *beta, int B, int H, int dk, int dv, float scale, float *const *S, float *o) {
    cpu_ctx *c = ctx;
    HYLA_TRY(check_dims("gdn_decode", B, H, dk, dv));
    void *mem;
    HYLA_TRY(cpu_scratch(c, (size_t)c->nt * 2 * dv * sizeof(float), &mem));
    long tasks = (long)B * H;
#pragma omp parallel for num_threads(c->nt) if (tasks > 1) schedule(static)
    for (long task = 0; task < tasks; task++) {
        int b = (int)(task / H), h = (int)(task % H);
        size_t qk = ((size_t)b * H + h) * dk, vo = ((size_t)b * H + h) * dv, gh = (size_t)b * H + h;
        float *tmp = (float *)mem + (size_t)omp_get_thread_num() * 2 * dv;
        gdn_step(q + qk, k + qk, v + vo, g[gh], beta[gh], 1.0f, dk, dv, scale, S[b] + (size_t)h * dk * dv, o + vo,
                 tmp, 0);
    }
    return HYLA_OK;
}

/* ------------------------------------------------------------------ SSE */

/* [SSE-1] e = softmax(logits); the K largest entries, descending, lower index first on ties
 * (a strict comparison keeps the earlier index); w = e at those entries, not renormalised. */
hyla_status cpu_sse_route(void *ctx, const float *logits, int n, int N, int K, int32_t *idx, float *w) {
    cpu_ctx *c = ctx;
    if (N <= 0 || K < 1 || K > N) return hyla_fail(HYLA_ERR_INVALID_ARG, "sse_route: N=%d K=%d", N, K);
    void *mem;
    HYLA_TRY(cpu_scratch(c, (size_t)N * (sizeof(float) + 1), &mem));
    float *e = mem;
    unsigned char *taken = (unsigned char *)(e + N);
    for (int t = 0; t < n; t++) {
        const float *l = logits + (size_t)t * N;
        double m = -INFINITY, sum = 0;
        for (int i = 0; i < N; i++)
            if (l[i] > m) m = l[i];
        for (int i = 0; i < N; i++) sum += exp((double)l[i] - m);
        for (int i = 0; i < N; i++) e[i] = (float)(exp((double)l[i] - m) / sum);
        memset(taken, 0, (size_t)N);
        for (int j = 0; j < K; j++) {
            int best = -1;
            for (int i = 0; i < N; i++)
                if (!taken[i] && (best < 0 || e[i] > e[best])) best = i;
            taken[best] = 1;
            idx[(size_t)t * K + j] = best;
            w[(size_t)t * K + j] = e[best];
        }
    }
    return HYLA_OK;
}

/* Partitions of each token must be in [0, N) and distinct (sse_route guarantees it; a
 * duplicate would write one partition twice in decode and break the grouping in prefill). */
static hyla_status sse_check(const char *op, hyla_sse_transition tr, const int32_t *idx, int n, int N, int K,
                             const float *betaa, const float *betab) {
    if (tr != HYLA_SSE_GLA && tr != HYLA_SSE_GDN) return hyla_fail(HYLA_ERR_INVALID_ARG, "%s: transition %d", op, (int)tr);
    if (tr == HYLA_SSE_GDN && (!betaa || !betab)) return hyla_fail(HYLA_ERR_INVALID_ARG, "%s: GDN needs beta", op);
    if (N <= 0 || K < 1 || K > N) return hyla_fail(HYLA_ERR_INVALID_ARG, "%s: N=%d K=%d", op, N, K);
    for (int t = 0; t < n; t++)
        for (int j = 0; j < K; j++) {
            int32_t i = idx[(size_t)t * K + j];
            if (i < 0 || i >= N)
                return hyla_fail(HYLA_ERR_INVALID_ARG, "%s: token %d selects partition %d of %d", op, t, (int)i, N);
            for (int j2 = 0; j2 < j; j2++)
                if (idx[(size_t)t * K + j2] == i)
                    return hyla_fail(HYLA_ERR_INVALID_ARG, "%s: token %d selects partition %d twice", op, t, (int)i);
        }
    return HYLA_OK;
}

/* [SSE-2..4] token by token, for B sessions: the always-selected partition S⁰ with (q1, k1,
 * ga, βa) and weight 1, then each selected partition i = idx[j] in the order of idx with
 * (w_j q2, w_j k2, gb, βb); o = the sum of the reads, in that order. */
hyla_status cpu_sse_decode(void *ctx, hyla_sse_transition tr, const float *q1, const float *k1, const float *q2,
                           const float *k2, const float *v, const float *ga, const float *gb, const float *betaa,
                           const float *betab, const int32_t *idx, const float *w, int B, int H, int dk, int dv,
                           int N, int K, float scale, float *const *S0, float *const *Sp, float *o) {
    cpu_ctx *c = ctx;
    HYLA_TRY(check_dims("sse_decode", B, H, dk, dv));
    HYLA_TRY(sse_check("sse_decode", tr, idx, B, N, K, betaa, betab));
    void *mem;
    HYLA_TRY(cpu_scratch(c, (size_t)c->nt * 2 * dv * sizeof(float), &mem));
    long tasks = (long)B * H;
    size_t SH = (size_t)dk * dv; /* floats of one head's state */
#pragma omp parallel for num_threads(c->nt) if (tasks > 1) schedule(static)
    for (long task = 0; task < tasks; task++) {
        int b = (int)(task / H), h = (int)(task % H);
        size_t qk = ((size_t)b * H + h) * dk, vo = ((size_t)b * H + h) * dv, gh = (size_t)b * H + h;
        float *tmp = (float *)mem + (size_t)omp_get_thread_num() * 2 * dv;
        float *ob = o + vo;
        if (tr == HYLA_SSE_GLA)
            gla_step(q1 + qk, k1 + qk, v + vo, ga + qk, 1.0f, dk, dv, scale, S0[b] + h * SH, ob, tmp, 0);
        else
            gdn_step(q1 + qk, k1 + qk, v + vo, ga[gh], betaa[gh], 1.0f, dk, dv, scale, S0[b] + h * SH, ob, tmp, 0);
        for (int j = 0; j < K; j++) {
            int i = idx[(size_t)b * K + j];
            float wt = w[(size_t)b * K + j];
            float *Si = Sp[b] + ((size_t)i * H + h) * SH;
            if (tr == HYLA_SSE_GLA)
                gla_step(q2 + qk, k2 + qk, v + vo, gb + qk, wt, dk, dv, scale, Si, ob, tmp, 1);
            else
                gdn_step(q2 + qk, k2 + qk, v + vo, gb[gh], betab[gh], wt, dk, dv, scale, Si, ob, tmp, 1);
        }
    }
    return HYLA_OK;
}

/* SSE prefill, grouped by partition (MODELS.md §4.3 "Prefill", the paper's varlen method).
 * The tokens are taken in windows of `window` tokens starting at the call's first token, so a
 * call over n tokens equals successive calls over its window-aligned pieces bit for bit. Inside
 * a window, partition i sees the subsequence of tokens that selected it, in order, with q and k
 * scaled by that token's weight, and runs it through the same chunk routine as GLA/GDN (chunks
 * of CPU_CHUNK rows from the window's first). Because an unselected partition is neither decayed nor
 * written, this is the token-by-token recurrence. The always-selected partition runs over all
 * tokens of the window. Each (token, slot j) read lands in its own row of a buffer and the
 * reads are summed per token in slot order, as decode sums them. */
static hyla_status sse_window(cpu_ctx *c, int gdn, const float *q1, const float *k1, const float *q2,
                              const float *k2, const float *v, const float *ga, const float *gb, const float *betaa,
                              const float *betab, const int32_t *idx, const float *w, int n, int H, int dk, int dv,
                              int N, int K, float scale, float *S0, float *Sp, float *o) {
    size_t nk = (size_t)n * K, wsf = chunk_ws_floats(dk, dv);
    size_t b_tok = cpu_align64(nk * sizeof(int32_t)), b_w = cpu_align64(nk * sizeof(float));
    size_t b_cnt = cpu_align64(2 * (size_t)N * sizeof(int)), b_pbuf = cpu_align64(nk * H * dv * sizeof(float));
    void *mem;
    HYLA_TRY(cpu_scratch(c, 2 * b_tok + b_w + b_cnt + b_pbuf + (size_t)c->nt * wsf * sizeof(float), &mem));
    char *p = mem;
    int32_t *tok = (int32_t *)p;            /* [n*K] source token of each grouped element */
    int32_t *orow = (int32_t *)(p + b_tok); /* [n*K] its row t*K + j in pbuf */
    float *wg = (float *)(p + 2 * b_tok);   /* [n*K] its weight */
    int *off = (int *)(p + 2 * b_tok + b_w), *cnt = off + N;
    float *pbuf = (float *)(p + 2 * b_tok + b_w + b_cnt);    /* [n*K][H][dv] */
    float *wsb = (float *)(p + 2 * b_tok + b_w + b_cnt + b_pbuf);

    memset(cnt, 0, (size_t)N * sizeof(int));
    for (size_t x = 0; x < nk; x++) cnt[idx[x]]++;
    for (int i = 0, acc = 0; i < N; i++) {
        off[i] = acc;
        acc += cnt[i];
        cnt[i] = 0;
    }
    for (int t = 0; t < n; t++)
        for (int j = 0; j < K; j++) {
            int i = idx[(size_t)t * K + j];
            int e = off[i] + cnt[i]++;
            tok[e] = t;
            orow[e] = t * K + j;
            wg[e] = w[(size_t)t * K + j];
        }

    size_t SH = (size_t)dk * dv;
    long tasks = (long)(N + 1) * H;
#pragma omp parallel for num_threads(c->nt) schedule(dynamic, 1)
    for (long task = 0; task < tasks; task++) {
        int part = (int)(task / H) - 1, h = (int)(task % H); /* part -1: the always-selected one */
        float *ws = wsb + (size_t)omp_get_thread_num() * wsf;
        cpu_seq s = {.v = v + (size_t)h * dv, .sqk = (size_t)H * dk, .sv = (size_t)H * dv,
                     .sg = gdn ? (size_t)H : (size_t)H * dk, .so = (size_t)H * dv};
        size_t goff = gdn ? (size_t)h : (size_t)h * dk;
        if (part < 0) {
            s.q = q1 + (size_t)h * dk;
            s.k = k1 + (size_t)h * dk;
            s.g = ga + goff;
            s.beta = gdn ? betaa + h : NULL;
            s.o = o + (size_t)h * dv;
            s.m = n;
            seq_run(&s, gdn, dk, dv, scale, S0 + h * SH, ws);
        } else {
            if (!cnt[part]) continue; /* nobody selected it: untouched */
            s.q = q2 + (size_t)h * dk;
            s.k = k2 + (size_t)h * dk;
            s.g = gb + goff;
            s.beta = gdn ? betab + h : NULL;
            s.tok = tok + off[part];
            s.w = wg + off[part];
            s.orow = orow + off[part];
            s.o = pbuf + (size_t)h * dv;
            s.m = cnt[part];
            seq_run(&s, gdn, dk, dv, scale, Sp + ((size_t)part * H + h) * SH, ws);
        }
    }
    size_t HD = (size_t)H * dv;
#pragma omp parallel for num_threads(c->nt) if (n > 1) schedule(static)
    for (int t = 0; t < n; t++)
        for (int j = 0; j < K; j++) {
            const float *src = pbuf + ((size_t)t * K + j) * HD;
            float *dst = o + (size_t)t * HD;
            for (size_t x = 0; x < HD; x++) dst[x] += src[x];
        }
    return HYLA_OK;
}

hyla_status cpu_sse_prefill(void *ctx, hyla_sse_transition tr, const float *q1, const float *k1, const float *q2,
                            const float *k2, const float *v, const float *ga, const float *gb, const float *betaa,
                            const float *betab, const int32_t *idx, const float *w, int n, int H, int dk, int dv,
                            int N, int K, float scale, int window, float *S0, float *Sp, float *o) {
    HYLA_TRY(check_dims("sse_prefill", n, H, dk, dv));
    HYLA_TRY(sse_check("sse_prefill", tr, idx, n, N, K, betaa, betab));
    if (window < CPU_CHUNK || window % CPU_CHUNK)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "sse_prefill: window %d is not a positive multiple of %d", window,
                         CPU_CHUNK);
    int gdn = tr == HYLA_SSE_GDN;
    size_t sqk = (size_t)H * dk, sv = (size_t)H * dv, sg = gdn ? (size_t)H : (size_t)H * dk;
    for (int t0 = 0; t0 < n; t0 += window) {
        int L = n - t0 < window ? n - t0 : window;
        size_t t = (size_t)t0;
        HYLA_TRY(sse_window(ctx, gdn, q1 + t * sqk, k1 + t * sqk, q2 + t * sqk, k2 + t * sqk, v + t * sv,
                            ga + t * sg, gb + t * sg, gdn ? betaa + t * H : NULL, gdn ? betab + t * H : NULL,
                            idx + t * K, w + t * K, L, H, dk, dv, N, K, scale, S0, Sp, o + t * sv));
    }
    return HYLA_OK;
}

/* ------------------------------------------------------------------ attention */

static float *kv_row(const hyla_kv_view *kv, void *const *pages, int pos, int Hk, int D, int kvh) {
    float *page = pages[pos / kv->page_tokens];
    return page + ((size_t)(pos % kv->page_tokens) * Hk + kvh) * D;
}

/* The window of a query at position p: [lo, p]. [ATTN-2] */
static int window_lo(int p, int window) { return window > 0 && p - window + 1 > 0 ? p - window + 1 : 0; }

/* Every page touched by positions [lo, hi] must exist. */
static hyla_status kv_check(const char *op, const hyla_kv_view *kv, int lo, int hi) {
    if (!kv || kv->page_tokens <= 0) return hyla_fail(HYLA_ERR_INVALID_ARG, "%s: bad kv view", op);
    if (hi / kv->page_tokens >= kv->n_pages)
        return hyla_fail(HYLA_ERR_RESOURCE, "%s: position %d needs page %d, the cache has %d", op, hi,
                         hi / kv->page_tokens, kv->n_pages);
    for (int pg = lo / kv->page_tokens; pg <= hi / kv->page_tokens; pg++)
        if (!kv->k_pages[pg] || !kv->v_pages[pg])
            return hyla_fail(HYLA_ERR_INVALID_ARG, "%s: page %d (positions %d..%d) is not allocated", op, pg,
                             pg * kv->page_tokens, (pg + 1) * kv->page_tokens - 1);
    return HYLA_OK;
}

static void kv_write(const hyla_kv_view *kv, int pos, const float *k, const float *v, int Hk, int D) {
    memcpy(kv_row(kv, kv->k_pages, pos, Hk, D, 0), k, (size_t)Hk * D * sizeof(float));
    memcpy(kv_row(kv, kv->v_pages, pos, Hk, D, 0), v, (size_t)Hk * D * sizeof(float));
}

/* One query row q [D] at position p over cached keys [lo, p] of KV head kvh:
 * s_j = scale·(q·k_j); o = Σ_j softmax(s)_j v_j, max-subtracted, the normaliser summed in
 * double. sc: [p − lo + 1] scores. */
static void attn_row(const float *q, const hyla_kv_view *kv, int Hk, int D, int kvh, int lo, int p, float scale,
                     float *sc, float *o) {
    float m = -INFINITY;
    for (int j = lo; j <= p; j++) {
        const float *kr = kv_row(kv, kv->k_pages, j, Hk, D, kvh);
        float d = 0.0f;
        for (int x = 0; x < D; x++) d += q[x] * kr[x];
        float s = d * scale;
        sc[j - lo] = s;
        if (s > m) m = s;
    }
    double sum = 0;
    memset(o, 0, (size_t)D * sizeof(float));
    for (int j = lo; j <= p; j++) {
        float e = expf(sc[j - lo] - m);
        sum += e;
        const float *vr = kv_row(kv, kv->v_pages, j, Hk, D, kvh);
        CPU_SIMD
        for (int x = 0; x < D; x++) o[x] += e * vr[x];
    }
    float inv = (float)(1.0 / sum);
    for (int x = 0; x < D; x++) o[x] *= inv;
}

static hyla_status attn_dims(const char *op, int n, int Hq, int Hk, int D) {
    if (n < 0 || Hq <= 0 || Hk <= 0 || D <= 0 || Hq % Hk)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "%s: n=%d Hq=%d Hk=%d D=%d (Hq must be a multiple of Hk)", op, n, Hq,
                         Hk, D);
    return HYLA_OK;
}

hyla_status cpu_attn_prefill(void *ctx, const float *q, const float *k, const float *v, int n, int Hq, int Hk, int D,
                             int pos0, const hyla_kv_view *kv, int window, float scale, float *o) {
    cpu_ctx *c = ctx;
    HYLA_TRY(attn_dims("attn_prefill", n, Hq, Hk, D));
    if (n == 0) return HYLA_OK;
    if (pos0 < 0) return hyla_fail(HYLA_ERR_INVALID_ARG, "attn_prefill: pos0=%d", pos0);
    int last = pos0 + n - 1;
    HYLA_TRY(kv_check("attn_prefill", kv, window_lo(pos0, window), last));
    for (int t = 0; t < n; t++) kv_write(kv, pos0 + t, k + (size_t)t * Hk * D, v + (size_t)t * Hk * D, Hk, D);
    int maxlen = last - window_lo(last, window) + 1; /* window lengths grow with p */
    void *mem;
    HYLA_TRY(cpu_scratch(c, (size_t)c->nt * (size_t)maxlen * sizeof(float), &mem));
    long tasks = (long)n * Hq;
    int group = Hq / Hk;
#pragma omp parallel for num_threads(c->nt) if (tasks > 1) schedule(dynamic, 4)
    for (long task = 0; task < tasks; task++) {
        int t = (int)(task / Hq), h = (int)(task % Hq), p = pos0 + t;
        float *sc = (float *)mem + (size_t)omp_get_thread_num() * maxlen;
        size_t row = ((size_t)t * Hq + h) * D;
        attn_row(q + row, kv, Hk, D, h / group, window_lo(p, window), p, scale, sc, o + row);
    }
    return HYLA_OK;
}

hyla_status cpu_attn_decode(void *ctx, const float *q, const float *k, const float *v, int B, int Hq, int Hk, int D,
                            const int32_t *pos, const hyla_kv_view *kv, int window, float scale, float *o) {
    cpu_ctx *c = ctx;
    HYLA_TRY(attn_dims("attn_decode", B, Hq, Hk, D));
    int maxlen = 1;
    for (int b = 0; b < B; b++) {
        if (pos[b] < 0) return hyla_fail(HYLA_ERR_INVALID_ARG, "attn_decode: session %d at position %d", b, (int)pos[b]);
        HYLA_TRY(kv_check("attn_decode", &kv[b], window_lo(pos[b], window), pos[b]));
        int len = pos[b] - window_lo(pos[b], window) + 1;
        if (len > maxlen) maxlen = len;
    }
    for (int b = 0; b < B; b++) kv_write(&kv[b], pos[b], k + (size_t)b * Hk * D, v + (size_t)b * Hk * D, Hk, D);
    void *mem;
    HYLA_TRY(cpu_scratch(c, (size_t)c->nt * (size_t)maxlen * sizeof(float), &mem));
    long tasks = (long)B * Hq;
    int group = Hq / Hk;
#pragma omp parallel for num_threads(c->nt) if (tasks > 1) schedule(dynamic, 4)
    for (long task = 0; task < tasks; task++) {
        int b = (int)(task / Hq), h = (int)(task % Hq);
        float *sc = (float *)mem + (size_t)omp_get_thread_num() * maxlen;
        size_t row = ((size_t)b * Hq + h) * D;
        attn_row(q + row, &kv[b], Hk, D, h / group, window_lo(pos[b], window), pos[b], scale, sc, o + row);
    }
    return HYLA_OK;
}
