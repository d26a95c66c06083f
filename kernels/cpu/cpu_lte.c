/* cpu_lte.c — the CPU reference of the LTE ops (learnable token eviction; docs/MODELS.md §5.1,
 * [LTE-1..5]): the scoring CNN, the fixed-size cache (sink, window ring, retained segment) and
 * attention over it.
 *
 * Invariants: a cache holding N tokens has meta[0] = N; positions [meta[1], N - h) are complete
 * but not yet scored (h = half the receptive field); the ring holds positions max(s, N-w)..N-1;
 * each head's retained segment holds meta[2+h] <= b entries, all at positions in [s, N-w).
 * The cache evolves one token at a time by the same function in prefill and decode, and a score
 * depends only on its receptive field, so any split of a prompt into pieces, and any batching of
 * decode steps, leaves the same bytes. Threading: prefill inserts tokens in order and spreads one
 * token's query heads over the threads; decode spreads sessions. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_impl.h"
#include "hyla_detmath.h"

static int lte_rows(const hyla_lte_params *p) { return p->sink + p->window + p->budget; }

static size_t score_scratch_floats(const hyla_lte_params *p, int T) { return 2 * (size_t)T * p->Hk * hyla_lte_maxch(p); }

/* The CNN's Swish with its exponential in double (hyla_detmath.h: the same bits as the GPU
 * backend's, which libm's exp and CUDA's are not in every case), rounded once. */
static float lte_silu(float x) { return x / (1.0f + (float)hyla_exp_det(-(double)x)); }

/* [LTE-2] The CNN over x [T][Hk][ch0] (positions x0..), into r [T-2h][Hk]. a, b: scratch of
 * T*Hk*maxch floats each. Layer l's activation at position t is computed from layer l-1 at
 * t + (i - (K-1)/2)*dil, i < K, summed in a fixed order (bias, then taps, then channels), and is
 * zero at t < 0 (left zero padding of every layer), so a value never depends on T or x0. */
static void lte_cnn(const hyla_lte_params *p, const float *x, int T, int x0, float *r, float *a, float *b) {
    int Hk = p->Hk, K = p->kernel, dil = p->dilation, c = (K - 1) / 2;
    int lo = 0, hi = T; /* valid rows of the current activation: [lo, hi) */
    const float *in = x;
    int cin = p->ch[0];
    for (int l = 0; l < p->n_conv; l++) {
        int cout = p->ch[l + 1], nlo = lo + c * dil, nhi = hi - c * dil;
        float *out = (l % 2 == 0) ? a : b;
        const float *W = p->conv_w[l], *B = p->conv_b[l];
        for (int t = nlo; t < nhi; t++)
            for (int h = 0; h < Hk; h++) {
                float *y = out + ((size_t)t * Hk + h) * cout;
                if (x0 + t < 0) {
                    memset(y, 0, (size_t)cout * sizeof(float));
                    continue;
                }
                for (int o = 0; o < cout; o++) {
                    const float *w = W + ((size_t)(h * cout + o) * cin) * K;
                    float acc = B[h * cout + o];
                    for (int i = 0; i < K; i++) {
                        int ts = t + (i - c) * dil;
                        if (x0 + ts < 0) continue; /* zero padding */
                        const float *xi = in + ((size_t)ts * Hk + h) * cin;
                        for (int j = 0; j < cin; j++) acc += w[(size_t)j * K + i] * xi[j];
                    }
                    y[o] = lte_silu(acc);
                }
            }
        in = out;
        cin = cout;
        lo = nlo;
        hi = nhi;
    }
    for (int t = lo; t < hi; t++)
        for (int h = 0; h < Hk; h++) {
            const float *xi = in + ((size_t)t * Hk + h) * cin;
            float acc = p->proj_b[h];
            for (int j = 0; j < cin; j++) acc += p->proj_w[(size_t)h * cin + j] * xi[j];
            r[(size_t)(t - lo) * Hk + h] = (float)(1.0 / (1.0 + hyla_exp_det(-(double)acc)));
        }
}

hyla_status cpu_lte_score(void *ctx, const hyla_lte_params *p, const float *x, int T, int x0, float *r) {
    HYLA_TRY(hyla_lte_check("lte_score", p));
    int h = hyla_lte_half(p);
    if (T < 2 * h + 1) return hyla_fail(HYLA_ERR_INVALID_ARG, "lte_score: %d rows, the receptive field needs %d", T, 2 * h + 1);
    void *mem;
    HYLA_TRY(cpu_scratch(ctx, score_scratch_floats(p, T) * sizeof(float), &mem));
    float *a = mem;
    lte_cnn(p, x, T, x0, r, a, a + (size_t)T * p->Hk * hyla_lte_maxch(p));
    return HYLA_OK;
}

/* ------------------------------------------------------------------ the cache */

static float *krow(const hyla_lte_params *p, const hyla_lte_cache *c, int h, int row) {
    return (float *)c->k + ((size_t)h * lte_rows(p) + row) * p->D;
}
static float *vrow(const hyla_lte_params *p, const hyla_lte_cache *c, int h, int row) {
    return (float *)c->v + ((size_t)h * lte_rows(p) + row) * p->D;
}
/* The row of a cached position (sink or ring). */
static int pos_row(const hyla_lte_params *p, int pos) {
    return pos < p->sink ? pos : p->sink + (pos - p->sink) % p->window;
}

/* Per-session scratch of the cache update: the CNN's input rows and two activations. */
static size_t update_scratch_floats(const hyla_lte_params *p) {
    int T = p->window + hyla_lte_half(p); /* the longest lazy batch plus its context (cache_check) */
    return (size_t)T * p->Hk * (p->ch[0] + 1) + score_scratch_floats(p, T);
}

/* [LTE-2] Score positions [lo, hi] from the cache (all of [lo-h, hi+h] present): gather the
 * un-rotated keys (RoPE at the position with the sine negated, [LTE-1]) and the values. */
static void score_range(const hyla_lte_params *p, const hyla_lte_cache *c, int lo, int hi, float *mem) {
    int h = hyla_lte_half(p), Hk = p->Hk, D = p->D, T = hi - lo + 1 + 2 * h, half = D / 2;
    float *x = mem, *act = mem + (size_t)T * Hk * p->ch[0];
    const double ln_theta = log((double)p->rope_theta);
    for (int t = 0; t < T; t++) {
        int pos = lo - h + t;
        float *xr = x + (size_t)t * Hk * 2 * D;
        if (pos < 0) {
            memset(xr, 0, (size_t)Hk * 2 * D * sizeof(float));
            continue;
        }
        int row = pos_row(p, pos);
        for (int kh = 0; kh < Hk; kh++) {
            const float *kr = krow(p, c, kh, row);
            float *xk = xr + (size_t)kh * 2 * D;
            for (int j = 0; j < half; j++) {
                double cs, sn, k0 = kr[j], k1 = kr[j + half];
                hyla_rope_det(pos, j, D, ln_theta, &sn, &cs); /* the CUDA backend's bits */
                xk[j] = (float)(k0 * cs + k1 * sn);
                xk[j + half] = (float)(k1 * cs - k0 * sn);
            }
            memcpy(xk + D, vrow(p, c, kh, row), (size_t)D * sizeof(float));
        }
    }
    float *r = act + score_scratch_floats(p, T); /* past both activations */
    lte_cnn(p, x, T, lo - h, r, act, act + (size_t)T * Hk * hyla_lte_maxch(p));
    for (int t = lo; t <= hi; t++)
        for (int kh = 0; kh < Hk; kh++) c->r[(size_t)kh * lte_rows(p) + pos_row(p, t)] = r[(size_t)(t - lo) * Hk + kh];
}

/* [LTE-3] A token leaving the window: kept when r > 0.5; a full segment gives up its lowest
 * score (the oldest position among equal lowest scores) if the newcomer scores strictly higher. */
static void evict(const hyla_lte_params *p, const hyla_lte_cache *c, int pos) {
    int row = pos_row(p, pos), R = lte_rows(p), base = p->sink + p->window;
    for (int h = 0; h < p->Hk; h++) {
        float r = c->r[(size_t)h * R + row];
        if (!(r > 0.5f)) continue;
        int32_t *n = &c->meta[2 + h], *rp = c->rpos + (size_t)h * p->budget;
        const float *seg = c->r + (size_t)h * R + base;
        int slot = -1;
        if (*n < p->budget) {
            slot = (*n)++;
        } else if (p->budget > 0) {
            int v = 0;
            for (int i = 1; i < p->budget; i++)
                if (seg[i] < seg[v] || (seg[i] == seg[v] && rp[i] < rp[v])) v = i;
            if (r > seg[v]) slot = v;
        }
        if (slot < 0) continue;
        memcpy(krow(p, c, h, base + slot), krow(p, c, h, row), (size_t)p->D * sizeof(float));
        memcpy(vrow(p, c, h, base + slot), vrow(p, c, h, row), (size_t)p->D * sizeof(float));
        c->r[(size_t)h * R + base + slot] = r;
        rp[slot] = pos;
    }
}

/* [LTE-4] Insert the token at position t (k, v [Hk][D], rotated). mem: update scratch. */
static void insert(const hyla_lte_params *p, const hyla_lte_cache *c, int t, const float *k, const float *v,
                   float *mem) {
    int h = hyla_lte_half(p), R = lte_rows(p);
    int32_t *meta = c->meta;
    if (t >= p->sink + p->window) { /* the ring is full: position e leaves it */
        int e = t - p->window;
        if (meta[1] <= e + h) { /* lazy scoring: e is needed by the next unscored position */
            score_range(p, c, meta[1], t - 1 - h, mem);
            meta[1] = t - h;
        }
        evict(p, c, e);
    }
    int row = pos_row(p, t);
    for (int kh = 0; kh < p->Hk; kh++) {
        memcpy(krow(p, c, kh, row), k + (size_t)kh * p->D, (size_t)p->D * sizeof(float));
        memcpy(vrow(p, c, kh, row), v + (size_t)kh * p->D, (size_t)p->D * sizeof(float));
        c->r[(size_t)kh * R + row] = 0.0f;
    }
    meta[0] = t + 1;
    if (p->eager && t - h >= meta[1]) {
        score_range(p, c, meta[1], t - h, mem);
        meta[1] = t - h + 1;
    }
}

/* [LTE-5] The rows a query of KV head kh sees when the cache holds N tokens, in the order the
 * softmax visits them: the sink, the retained segment by slot, the window oldest first. */
static int visible_rows(const hyla_lte_params *p, const hyla_lte_cache *c, int kh, int N, int *rows) {
    int n = 0, s = N < p->sink ? N : p->sink, lo = N - p->window > p->sink ? N - p->window : p->sink;
    int base = p->sink + p->window;
    for (int r = 0; r < s; r++) rows[n++] = r;
    for (int r = 0; r < c->meta[2 + kh]; r++) rows[n++] = base + r;
    for (int pos = lo; pos < N; pos++) rows[n++] = pos_row(p, pos);
    return n;
}

/* [LTE-5] One query row q [D] of KV head kh: s_j = scale·(q·k_j), o = softmax(s)·V over the
 * visible rows, max-subtracted, the normaliser summed in double. sc: scratch of 2(s+w+b) floats. */
static void attend(const hyla_lte_params *p, const hyla_lte_cache *c, int kh, int N, const float *q, float scale,
                   float *sc, float *o) {
    int D = p->D, *rows = (int *)(sc + lte_rows(p));
    int n = visible_rows(p, c, kh, N, rows);
    float m = -INFINITY;
    for (int j = 0; j < n; j++) {
        const float *kr = krow(p, c, kh, rows[j]);
        float d = 0.0f;
        for (int x = 0; x < D; x++) d += q[x] * kr[x];
        sc[j] = d * scale;
        if (sc[j] > m) m = sc[j];
    }
    double sum = 0;
    memset(o, 0, (size_t)D * sizeof(float));
    for (int j = 0; j < n; j++) {
        float e = expf(sc[j] - m);
        sum += e;
        const float *vr = vrow(p, c, kh, rows[j]);
        for (int x = 0; x < D; x++) o[x] += e * vr[x];
    }
    float inv = (float)(1.0 / sum);
    for (int x = 0; x < D; x++) o[x] *= inv;
}

static hyla_status cache_check(const char *op, const hyla_lte_params *p, const hyla_lte_cache *c, int pos) {
    if (!c || !c->k || !c->v || !c->r || !c->rpos || !c->meta) return hyla_fail(HYLA_ERR_INVALID_ARG, "%s: bad cache", op);
    if (c->meta[0] != pos)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "%s: the cache holds %d tokens, the next token is at position %d", op,
                         (int)c->meta[0], pos);
    for (int h = 0; h < p->Hk; h++)
        if (c->meta[2 + h] < 0 || c->meta[2 + h] > p->budget)
            return hyla_fail(HYLA_ERR_INVALID_ARG, "%s: head %d holds %d retained entries, the budget is %d", op, h,
                             (int)c->meta[2 + h], p->budget);
    /* unscored positions never lag the window (which bounds a lazy batch by w + h rows) */
    int lo = pos - p->window > p->sink ? pos - p->window : p->sink;
    int hi = pos > p->sink ? pos : p->sink;
    if (pos > 0 && (c->meta[1] < lo || c->meta[1] > hi))
        return hyla_fail(HYLA_ERR_INVALID_ARG, "%s: next position to score %d is outside [%d, %d]", op, (int)c->meta[1],
                         lo, hi);
    return HYLA_OK;
}

hyla_status cpu_lte_prefill(void *ctx, const hyla_lte_params *p, const float *q, const float *k,
                                   const float *v, int n, int Hq, int pos0, const hyla_lte_cache *c, float scale,
                                   float *o) {
    cpu_ctx *cc = ctx;
    HYLA_TRY(hyla_lte_check("lte_prefill", p));
    if (n < 0 || Hq <= 0 || Hq % p->Hk || pos0 < 0)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "lte_prefill: n=%d Hq=%d Hk=%d pos0=%d", n, Hq, p->Hk, pos0);
    if (n == 0) return HYLA_OK;
    HYLA_TRY(cache_check("lte_prefill", p, c, pos0));
    if (pos0 == 0) c->meta[1] = p->sink;
    size_t upd = update_scratch_floats(p), sc = 2 * (size_t)lte_rows(p);
    void *mem;
    HYLA_TRY(cpu_scratch(cc, (upd + (size_t)cc->nt * sc) * sizeof(float), &mem));
    float *um = mem, *scm = um + upd;
    int Hk = p->Hk, D = p->D, group = Hq / Hk;
    for (int t = 0; t < n; t++) {
        insert(p, c, pos0 + t, k + (size_t)t * Hk * D, v + (size_t)t * Hk * D, um);
#pragma omp parallel for num_threads(cc->nt) if (Hq > 1) schedule(static)
        for (int h = 0; h < Hq; h++) {
            size_t row = ((size_t)t * Hq + h) * D;
            attend(p, c, h / group, pos0 + t + 1, q + row, scale, scm + (size_t)omp_get_thread_num() * sc, o + row);
        }
    }
    return HYLA_OK;
}

hyla_status cpu_lte_decode(void *ctx, const hyla_lte_params *p, const float *q, const float *k,
                                  const float *v, int B, int Hq, const int32_t *pos, const hyla_lte_cache *c,
                                  float scale, float *o) {
    cpu_ctx *cc = ctx;
    HYLA_TRY(hyla_lte_check("lte_decode", p));
    if (B < 0 || Hq <= 0 || Hq % p->Hk) return hyla_fail(HYLA_ERR_INVALID_ARG, "lte_decode: B=%d Hq=%d Hk=%d", B, Hq, p->Hk);
    for (int b = 0; b < B; b++) {
        if (pos[b] < 0) return hyla_fail(HYLA_ERR_INVALID_ARG, "lte_decode: session %d at position %d", b, (int)pos[b]);
        HYLA_TRY(cache_check("lte_decode", p, &c[b], pos[b]));
    }
    size_t per = update_scratch_floats(p) + 2 * (size_t)lte_rows(p);
    void *mem;
    HYLA_TRY(cpu_scratch(cc, (size_t)cc->nt * per * sizeof(float), &mem));
    int Hk = p->Hk, D = p->D, group = Hq / Hk;
#pragma omp parallel for num_threads(cc->nt) if (B > 1) schedule(dynamic, 1)
    for (int b = 0; b < B; b++) {
        float *um = (float *)mem + (size_t)omp_get_thread_num() * per, *scm = um + update_scratch_floats(p);
        if (pos[b] == 0) c[b].meta[1] = p->sink;
        insert(p, &c[b], pos[b], k + (size_t)b * Hk * D, v + (size_t)b * Hk * D, um);
        for (int h = 0; h < Hq; h++) {
            size_t row = ((size_t)b * Hq + h) * D;
            attend(p, &c[b], h / group, pos[b] + 1, q + row, scale, scm, o + row);
        }
    }
    return HYLA_OK;
}

