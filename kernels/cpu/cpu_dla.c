/* cpu_dla.c — dynamic linear attention (DLA) on the CPU reference backend: the state cache of
 * docs/MODELS.md §4.7 [DLA-1..5] over a base transition given as per-token scalars (gated
 * DeltaNet, Mamba2).
 *
 * Invariants: one routine (dla_token) advances one head of one session by one token; prefill
 * calls it token by token and decode once per session, so boundaries, merges and bits of a
 * prefill equal those of a decode loop for any piece size. The information score is reduced in
 * double and rounded to float once; the boundary and merge decisions read only that float and
 * the float sums in the cache.
 * Threading: heads (prefill) or session-heads (decode) are spread over ctx->nt OpenMP threads;
 * each owns its head's states and a slice of the scratch. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu_impl.h"

#define CPU_SIMD _Pragma("omp simd")

#define DLA_NORM_EPS 1e-6  /* RMSNorm of a state: x / sqrt(mean(x^2) + eps) */
#define DLA_SCORE_EPS 1e-6 /* the denominator's epsilon of the score */

static float dla_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* [DLA-2] the information score of the token state s = w k v^T against the newest state S
 * ([dk][dv]): || rms(s) - rms(S) ||_F / (|| rms(S) ||_F + eps). An empty cache or an all-zero
 * newest state scores exactly tau (the token opens a state). */
float cpu_dla_score(const hyla_dla_params *p, const float *S, int m, const float *k, const float *v, float w) {
    if (m == 0) return p->tau;
    double kk = 0, vv = 0, SS = 0, sS = 0;
    for (int i = 0; i < p->dk; i++) kk += (double)k[i] * k[i];
    for (int j = 0; j < p->dv; j++) vv += (double)v[j] * v[j];
    for (int i = 0; i < p->dk; i++) {
        const float *Si = S + (size_t)i * p->dv;
        double r = 0;
        for (int j = 0; j < p->dv; j++) {
            SS += (double)Si[j] * Si[j];
            r += (double)Si[j] * v[j];
        }
        sS += (double)k[i] * r;
    }
    if (SS == 0) return p->tau;
    double N = (double)p->dk * p->dv, ss = (double)w * w * kk * vv;
    sS *= w;
    double rs = 1.0 / sqrt(ss / N + DLA_NORM_EPS), rS = 1.0 / sqrt(SS / N + DLA_NORM_EPS);
    double d2 = rs * rs * ss + rS * rS * SS - 2.0 * rs * rS * sS;
    if (d2 < 0) d2 = 0;
    return (float)(sqrt(d2) / (rS * sqrt(SS) + DLA_SCORE_EPS));
}

/* [DLA-4] the adjacent pair (i, i+1) of lowest density (I_i + I_i+1) / (n_i + n_i+1), the first
 * on ties. */
static int dla_pick_pair(const int32_t *n, const float *I, int m) {
    int best = 0;
    float bd = 0;
    for (int i = 0; i + 1 < m; i++) {
        float d = (I[i] + I[i + 1]) / (float)(n[i] + n[i + 1]);
        if (i == 0 || d < bd) bd = d, best = i;
    }
    return best;
}

/* One token of one head: S [K][dk][dv], n [K], I [K], m (this head's count); q, k [dk], v [dv];
 * lam [K]; o [dv]; tmp [dv]. */
static void dla_token(const hyla_dla_params *p, const float *q, const float *k, const float *v, float g, float e,
                      float w, const float *lam, float scale, float *S, int32_t *n, float *I, int32_t *m, float *o,
                      float *tmp) {
    int dk = p->dk, dv = p->dv, M = *m;
    size_t SZ = (size_t)dk * dv;
    /* [DLA-2] score against the newest state before this token's transition */
    float It = cpu_dla_score(p, M ? S + (size_t)(M - 1) * SZ : NULL, M, k, v, w);
    /* [DLA-1] the base transition, applied to every state */
    float a = expf(g);
    for (int s = 0; s < M; s++) {
        float *Ss = S + (size_t)s * SZ;
        CPU_SIMD
        for (size_t x = 0; x < SZ; x++) Ss[x] *= a;
        if (e != 0.0f) {
            memset(tmp, 0, (size_t)dv * sizeof(float));
            for (int i = 0; i < dk; i++) {
                const float *Si = Ss + (size_t)i * dv;
                float ki = k[i];
                CPU_SIMD
                for (int j = 0; j < dv; j++) tmp[j] += ki * Si[j];
            }
            for (int i = 0; i < dk; i++) {
                float *Si = Ss + (size_t)i * dv;
                float ek = e * k[i];
                CPU_SIMD
                for (int j = 0; j < dv; j++) Si[j] -= ek * tmp[j];
            }
        }
    }
    /* [DLA-3] boundary: open a new state (after freeing a slot [DLA-4]) or merge into the newest */
    if (M == 0 || It >= p->tau) {
        if (M == p->K) {
            int b = dla_pick_pair(n, I, M);
            float *Sb = S + (size_t)b * SZ, *Sc = Sb + SZ;
            CPU_SIMD
            for (size_t x = 0; x < SZ; x++) Sb[x] += Sc[x];
            n[b] += n[b + 1];
            I[b] += I[b + 1];
            memmove(Sc, Sc + SZ, (size_t)(M - b - 2) * SZ * sizeof(float));
            memmove(n + b + 1, n + b + 2, (size_t)(M - b - 2) * sizeof *n);
            memmove(I + b + 1, I + b + 2, (size_t)(M - b - 2) * sizeof *I);
            M--;
        }
        memset(S + (size_t)M * SZ, 0, SZ * sizeof(float));
        n[M] = 0;
        I[M] = 0;
        M++;
    }
    float *Sn = S + (size_t)(M - 1) * SZ;
    for (int i = 0; i < dk; i++) {
        float *Si = Sn + (size_t)i * dv;
        float wk = w * k[i];
        CPU_SIMD
        for (int j = 0; j < dv; j++) Si[j] += wk * v[j];
    }
    n[M - 1] += 1;
    I[M - 1] += It;
    *m = M;
    /* [DLA-5] the read: lam[0] weighs the newest state */
    memset(o, 0, (size_t)dv * sizeof(float));
    for (int s = 0; s < M; s++) {
        const float *Ss = S + (size_t)s * SZ;
        memset(tmp, 0, (size_t)dv * sizeof(float));
        for (int i = 0; i < dk; i++) {
            float qi = scale * q[i];
            const float *Si = Ss + (size_t)i * dv;
            CPU_SIMD
            for (int j = 0; j < dv; j++) tmp[j] += qi * Si[j];
        }
        float l = dla_softplus(lam[M - 1 - s]);
        CPU_SIMD
        for (int j = 0; j < dv; j++) o[j] += l * tmp[j];
    }
}

static hyla_status dla_check(const char *op, const hyla_dla_params *p, int n, const hyla_dla_cache *c, int nc) {
    if (n < 0 || p->H <= 0 || p->dk <= 0 || p->dv <= 0 || p->K < 2 || !(p->tau >= 0))
        return hyla_fail(HYLA_ERR_INVALID_ARG, "%s: n=%d H=%d dk=%d dv=%d K=%d tau=%g", op, n, p->H, p->dk, p->dv, p->K,
                         (double)p->tau);
    for (int b = 0; b < nc; b++)
        for (int h = 0; h < p->H; h++) {
            int32_t m = c[b].m[h];
            if (m < 0 || m > p->K)
                return hyla_fail(HYLA_ERR_INVALID_ARG, "%s: cache %d head %d holds %d states (capacity %d)", op, b, h,
                                 (int)m, p->K);
            for (int s = 0; s < m; s++)
                if (c[b].n[(size_t)h * p->K + s] <= 0)
                    return hyla_fail(HYLA_ERR_INVALID_ARG, "%s: cache %d head %d state %d counts %d tokens", op, b, h,
                                     s, (int)c[b].n[(size_t)h * p->K + s]);
        }
    return HYLA_OK;
}

hyla_status cpu_dla_prefill(void *ctx, const hyla_dla_params *p, const float *q, const float *k, const float *v,
                            const float *g, const float *erase, const float *write, const float *lam, int n,
                            float scale, const hyla_dla_cache *c, float *o) {
    cpu_ctx *cc = ctx;
    HYLA_TRY(dla_check("dla_prefill", p, n, c, 1));
    if (n == 0) return HYLA_OK;
    int H = p->H, dk = p->dk, dv = p->dv, K = p->K;
    void *mem;
    HYLA_TRY(cpu_scratch(cc, (size_t)H * cpu_align64((size_t)dv * sizeof(float)), &mem));
#pragma omp parallel for num_threads(cc->nt) schedule(dynamic, 1)
    for (int h = 0; h < H; h++) {
        float *tmp = (float *)((char *)mem + (size_t)h * cpu_align64((size_t)dv * sizeof(float)));
        for (int t = 0; t < n; t++) {
            size_t r = (size_t)t * H + h;
            dla_token(p, q + r * dk, k + r * dk, v + r * dv, g[r], erase ? erase[r] : 0.0f, write[r], lam + r * K,
                      scale, c->S + (size_t)h * K * dk * dv, c->n + (size_t)h * K, c->I + (size_t)h * K, c->m + h,
                      o + r * dv, tmp);
        }
    }
    return HYLA_OK;
}

hyla_status cpu_dla_decode(void *ctx, const hyla_dla_params *p, const float *q, const float *k, const float *v,
                           const float *g, const float *erase, const float *write, const float *lam, int B,
                           float scale, const hyla_dla_cache *c, float *o) {
    cpu_ctx *cc = ctx;
    HYLA_TRY(dla_check("dla_decode", p, B, c, B));
    if (B == 0) return HYLA_OK;
    int H = p->H, dk = p->dk, dv = p->dv, K = p->K;
    void *mem;
    size_t ts = cpu_align64((size_t)dv * sizeof(float));
    HYLA_TRY(cpu_scratch(cc, (size_t)B * H * ts, &mem));
#pragma omp parallel for num_threads(cc->nt) schedule(dynamic, 1)
    for (int bh = 0; bh < B * H; bh++) {
        int b = bh / H, h = bh % H;
        size_t r = (size_t)b * H + h;
        dla_token(p, q + r * dk, k + r * dk, v + r * dv, g[r], erase ? erase[r] : 0.0f, write[r], lam + r * K, scale,
                  c[b].S + (size_t)h * K * dk * dv, c[b].n + (size_t)h * K, c[b].I + (size_t)h * K, c[b].m + h,
                  o + r * dv, (float *)((char *)mem + (size_t)bh * ts));
    }
    return HYLA_OK;
}
