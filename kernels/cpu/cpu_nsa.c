/* cpu_nsa.c — the CPU reference of native sparse attention (docs/MODELS.md §5.2, [NSA-1..4];
 * flash-linear-attention's `nsa` layer, whose compression is mean pooling).
 *
 * The keys and values live in the paged KV cache of attention (hyla_kv_view). The compressed
 * blocks (mean of each block of `block` tokens) live in the view's derived cache (c_pages): a
 * call first fills the blocks its tokens complete, each computed once, so a query reads the
 * compressed rows, its selected blocks and its window, and nothing else of the KV. Without a
 * cache (c_pages NULL) a query derives the blocks it needs from the KV, with the same
 * arithmetic. One routine computes one (token, KV head) pair — the query group's compressed
 * attention, its shared block selection, the selected and the window attention — so prefill
 * and decode give the same bits. Threading: (token, KV head) pairs, and the blocks to fill, are
 * spread over the threads; each task has its own scratch. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_impl.h"

static const float *row(const hyla_kv_view *kv, void *const *pages, int pos, int Hk, int D, int h) {
    const float *page = pages[pos / kv->page_tokens];
    return page + ((size_t)(pos % kv->page_tokens) * Hk + h) * D;
}

/* [NSA-1] block c of KV head h: kr, vr [D] = the mean of its keys and values, summed in order. */
static void compress_block(const hyla_kv_view *kv, int c, int h, int Hk, int D, int BS, float *kr, float *vr) {
    memset(kr, 0, (size_t)D * sizeof(float));
    memset(vr, 0, (size_t)D * sizeof(float));
    for (int j = c * BS; j < (c + 1) * BS; j++) {
        const float *kj = row(kv, kv->k_pages, j, Hk, D, h), *vj = row(kv, kv->v_pages, j, Hk, D, h);
        for (int x = 0; x < D; x++) kr[x] += kj[x], vr[x] += vj[x];
    }
    for (int x = 0; x < D; x++) kr[x] /= (float)BS, vr[x] /= (float)BS;
}

/* The cached compressed key (isv 0) or value (isv 1) of block c, KV head h. */
static float *cmp_row(const hyla_kv_view *kv, int c, int isv, int h, int Hk, int D) {
    float *page = kv->c_pages[c / kv->page_tokens];
    return page + (((size_t)(c % kv->page_tokens) * 2 + isv) * Hk + h) * D;
}

static float sigm(float x) { return (float)(1.0 / (1.0 + exp(-(double)x))); }

/* Softmax attention of q [D] over the keys at positions pos[0..n) (in that order): o [D].
 * sc: scratch [n]. Max-subtracted, the normaliser summed in double (as attention, [ATTN-2]). */
static void attend(const float *q, const hyla_kv_view *kv, int Hk, int D, int h, const int *pos, int n, float scale,
                   float *sc, float *o) {
    memset(o, 0, (size_t)D * sizeof(float));
    if (n == 0) return;
    float m = -INFINITY;
    for (int i = 0; i < n; i++) {
        const float *kr = row(kv, kv->k_pages, pos[i], Hk, D, h);
        float d = 0.0f;
        for (int x = 0; x < D; x++) d += q[x] * kr[x];
        sc[i] = d * scale;
        if (sc[i] > m) m = sc[i];
    }
    double sum = 0;
    for (int i = 0; i < n; i++) {
        float e = expf(sc[i] - m);
        sum += e;
        const float *vr = row(kv, kv->v_pages, pos[i], Hk, D, h);
        for (int x = 0; x < D; x++) o[x] += e * vr[x];
    }
    float inv = (float)(1.0 / sum);
    for (int x = 0; x < D; x++) o[x] *= inv;
}

typedef struct {
    int Hq, Hk, D, block, counts, window;
    float scale;
} nsa_dims;

/* The scratch of one (token, head) task at position p, carved from mem (NULL: sizes only).
 * Returns its size in floats. */
typedef struct {
    float *kc, *vc, *probs, *score, *sc, *oc, *os, *ow; /* [nb][D] x2, [G][nb], [nb], [keys], [D] x3 */
    int *sel, *pos;                                     /* [nb], [ksel + kwin] */
} nsa_scratch;

static size_t task_layout(const nsa_dims *d, int p, int cached, float *mem, nsa_scratch *s) {
    size_t nb = (size_t)(p / d->block + 1), G = (size_t)(d->Hq / d->Hk), D = (size_t)d->D;
    size_t ncf = cached ? 0 : nb * D; /* uncached: the blocks are derived into the scratch */
    size_t ksel = (size_t)d->counts * d->block < (size_t)p + 1 ? (size_t)d->counts * d->block : (size_t)p + 1;
    size_t kwin = d->window <= 0 ? 0 : (size_t)d->window < (size_t)p + 1 ? (size_t)d->window : (size_t)p + 1;
    size_t keys = ksel > kwin ? ksel : kwin, off = 0;
#define NSA_CARVE(field, type, n) (s->field = mem ? (type *)(mem + off) : NULL, off += (n))
    NSA_CARVE(kc, float, ncf);
    NSA_CARVE(vc, float, ncf);
    NSA_CARVE(probs, float, G * nb);
    NSA_CARVE(score, float, nb);
    NSA_CARVE(sc, float, keys + 1);
    NSA_CARVE(oc, float, D);
    NSA_CARVE(os, float, D);
    NSA_CARVE(ow, float, D);
    NSA_CARVE(sel, int, nb);
    NSA_CARVE(pos, int, ksel + kwin);
#undef NSA_CARVE
    return off;
}

static size_t task_floats(const nsa_dims *d, int p, int cached) {
    nsa_scratch s;
    return task_layout(d, p, cached, NULL, &s);
}

/* [NSA-1..4] The query group of KV head h at position p: q [G][D] rows of the token's q,
 * g [G][3] gate logits, o [G][D]. */
static void nsa_task(const nsa_dims *d, const hyla_kv_view *kv, int p, int h, const float *q, const float *g, float *o,
                     float *mem) {
    int D = d->D, BS = d->block, G = d->Hq / d->Hk;
    int nc = (p + 1) / BS;  /* compressed blocks wholly in the past: (c+1)·BS − 1 <= p */
    int nb = p / BS + 1;    /* blocks touched so far (the current one may be partial) */
    int cached = kv->c_pages != NULL;
    nsa_scratch S;
    task_layout(d, p, cached, mem, &S);
    float *probs = S.probs, *score = S.score, *sc = S.sc, *oc = S.oc, *os = S.os, *ow = S.ow;
    int *sel = S.sel, *pos = S.pos;
    /* [NSA-1] compressed keys and values: the cached rows, or (no cache) the mean of each
     * complete block derived here */
    if (!cached)
        for (int c = 0; c < nc; c++) compress_block(kv, c, h, d->Hk, D, BS, S.kc + (size_t)c * D, S.vc + (size_t)c * D);
#define KC(c) (cached ? cmp_row(kv, (c), 0, h, d->Hk, D) : S.kc + (size_t)(c) * D)
#define VC(c) (cached ? cmp_row(kv, (c), 1, h, d->Hk, D) : S.vc + (size_t)(c) * D)
    for (int c = 0; c < nb; c++) score[c] = 0.0f;
    for (int i = 0; i < G; i++) {
        const float *qi = q + (size_t)i * D;
        float *pr = probs + (size_t)i * nb, *oci = oc;
        /* [NSA-2] compressed attention (no visible block: zero) */
        float m = -INFINITY;
        for (int c = 0; c < nc; c++) {
            const float *kcr = KC(c);
            float s = 0.0f;
            for (int x = 0; x < D; x++) s += qi[x] * kcr[x];
            pr[c] = s * d->scale;
            if (pr[c] > m) m = pr[c];
        }
        double sum = 0;
        for (int c = 0; c < nc; c++) sum += (pr[c] = expf(pr[c] - m));
        memset(oci, 0, (size_t)D * sizeof(float));
        for (int c = 0; c < nc; c++) {
            pr[c] = (float)(pr[c] / sum);
            const float *vcr = VC(c);
            for (int x = 0; x < D; x++) oci[x] += pr[c] * vcr[x];
            score[c] += pr[c];
        }
        /* keep this head's compressed output in o until the branches are summed */
        memcpy(o + (size_t)i * D, oci, (size_t)D * sizeof(float));
    }
#undef KC
#undef VC
    /* [NSA-3] block selection, shared by the group: mean probability, the first, current and
     * previous blocks forced (score 1); the `counts` highest, ties to the lower block index */
    int cur = p / BS, ns = 0;
    for (int c = 0; c < nb; c++) {
        score[c] /= (float)G;
        if (c == 0 || c == cur || c == cur - 1) score[c] = 1.0f;
    }
    int want = d->counts < nb ? d->counts : nb;
    for (int k = 0; k < want; k++) {
        int best = -1;
        for (int c = 0; c < nb; c++) {
            int taken = 0;
            for (int j = 0; j < ns; j++) taken |= sel[j] == c;
            if (!taken && (best < 0 || score[c] > score[best])) best = c;
        }
        sel[ns++] = best;
    }
    /* the selected blocks' keys at positions <= p, in selection order */
    int nk = 0;
    for (int j = 0; j < ns; j++)
        for (int t = sel[j] * BS; t < (sel[j] + 1) * BS && t <= p; t++) pos[nk++] = t;
    int nw = 0, lo = d->window > 0 && p - d->window + 1 > 0 ? p - d->window + 1 : 0;
    for (int i = 0; i < G; i++) {
        const float *qi = q + (size_t)i * D;
        memcpy(oc, o + (size_t)i * D, (size_t)D * sizeof(float));
        attend(qi, kv, d->Hk, D, h, pos, nk, d->scale, sc, os);
        /* [NSA-4] o = σ(g_slc)·o_slc + σ(g_cmp)·o_cmp (+ σ(g_swa)·o_swa) */
        float gc = sigm(g[(size_t)i * 3 + 0]), gs = sigm(g[(size_t)i * 3 + 1]), gw = sigm(g[(size_t)i * 3 + 2]);
        float *oi = o + (size_t)i * D;
        for (int x = 0; x < D; x++) oi[x] = os[x] * gs + oc[x] * gc;
        if (d->window > 0) {
            int *wp = pos + nk; /* window positions after the selected ones */
            nw = 0;
            for (int t = lo; t <= p; t++) wp[nw++] = t;
            attend(qi, kv, d->Hk, D, h, wp, nw, d->scale, sc, ow);
            for (int x = 0; x < D; x++) oi[x] += ow[x] * gw;
        }
    }
}

static hyla_status nsa_check(const char *op, int n, const nsa_dims *d) {
    if (n < 0 || d->Hq <= 0 || d->Hk <= 0 || d->Hq % d->Hk || d->D <= 0 || d->block <= 0 || d->counts <= 0)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "%s: n=%d Hq=%d Hk=%d D=%d block=%d counts=%d", op, n, d->Hq, d->Hk, d->D,
                         d->block, d->counts);
    return HYLA_OK;
}

static hyla_status kv_ready(const char *op, const hyla_kv_view *kv, int hi) {
    if (!kv || kv->page_tokens <= 0 || hi / kv->page_tokens >= kv->n_pages)
        return hyla_fail(HYLA_ERR_RESOURCE, "%s: position %d is beyond the cache", op, hi);
    for (int pg = 0; pg <= hi / kv->page_tokens; pg++)
        if (!kv->k_pages[pg] || !kv->v_pages[pg])
            return hyla_fail(HYLA_ERR_INVALID_ARG, "%s: page %d is not allocated", op, pg);
    return HYLA_OK;
}

static hyla_status cache_ready(const char *op, const hyla_kv_view *kv, int hi, int block) {
    if (!kv->c_pages) return HYLA_OK;
    int nc = (hi + 1) / block;
    if (kv->c_valid < 0 || (nc > 0 && (nc - 1) / kv->page_tokens >= kv->c_n_pages))
        return hyla_fail(HYLA_ERR_RESOURCE, "%s: %d compressed blocks need more than the %d cache pages (%d valid)", op,
                         nc, kv->c_n_pages, kv->c_valid);
    return HYLA_OK;
}

/* Fill the compressed blocks c_valid.. that are complete at position hi of each of the nkv
 * sessions' caches (after their tokens were written), in parallel over (block, head). */
static void fill_blocks(cpu_ctx *c, const hyla_kv_view *kv, const int *hi, int nkv, int Hk, int D, int BS) {
    for (int z = 0; z < nkv; z++) {
        if (!kv[z].c_pages) continue;
        int lo = kv[z].c_valid, nc = (hi[z] + 1) / BS;
        long tasks = (long)(nc > lo ? nc - lo : 0) * Hk;
#pragma omp parallel for num_threads(c->nt) if (tasks > 1) schedule(static)
        for (long t = 0; t < tasks; t++) {
            int blk = lo + (int)(t / Hk), h = (int)(t % Hk);
            compress_block(&kv[z], blk, h, Hk, D, BS, cmp_row(&kv[z], blk, 0, h, Hk, D), cmp_row(&kv[z], blk, 1, h, Hk, D));
        }
    }
}

static void kv_put(const hyla_kv_view *kv, int pos, const float *k, const float *v, int Hk, int D) {
    memcpy((float *)row(kv, kv->k_pages, pos, Hk, D, 0), k, (size_t)Hk * D * sizeof(float));
    memcpy((float *)row(kv, kv->v_pages, pos, Hk, D, 0), v, (size_t)Hk * D * sizeof(float));
}

hyla_status cpu_nsa_prefill(void *ctx, const float *q, const float *k, const float *v, const float *g, int n, int Hq,
                            int Hk, int D, int pos0, const hyla_kv_view *kv, int block, int counts, int window,
                            float scale, float *o) {
    cpu_ctx *c = ctx;
    nsa_dims d = {Hq, Hk, D, block, counts, window, scale};
    HYLA_TRY(nsa_check("nsa_prefill", n, &d));
    if (n == 0) return HYLA_OK;
    if (pos0 < 0) return hyla_fail(HYLA_ERR_INVALID_ARG, "nsa_prefill: pos0=%d", pos0);
    int hi = pos0 + n - 1;
    HYLA_TRY(kv_ready("nsa_prefill", kv, hi));
    HYLA_TRY(cache_ready("nsa_prefill", kv, hi, block));
    for (int t = 0; t < n; t++) kv_put(kv, pos0 + t, k + (size_t)t * Hk * D, v + (size_t)t * Hk * D, Hk, D);
    fill_blocks(c, kv, &hi, 1, Hk, D, block);
    size_t per = task_floats(&d, hi, kv->c_pages != NULL);
    void *mem;
    HYLA_TRY(cpu_scratch(c, (size_t)c->nt * per * sizeof(float), &mem));
    long tasks = (long)n * Hk;
    int G = Hq / Hk;
#pragma omp parallel for num_threads(c->nt) if (tasks > 1) schedule(dynamic, 2)
    for (long task = 0; task < tasks; task++) {
        int t = (int)(task / Hk), h = (int)(task % Hk);
        size_t qo = ((size_t)t * Hq + (size_t)h * G);
        nsa_task(&d, kv, pos0 + t, h, q + qo * D, g + qo * 3, o + qo * D, (float *)mem + (size_t)omp_get_thread_num() * per);
    }
    return HYLA_OK;
}

hyla_status cpu_nsa_decode(void *ctx, const float *q, const float *k, const float *v, const float *g, int B, int Hq,
                           int Hk, int D, const int32_t *pos, const hyla_kv_view *kv, int block, int counts,
                           int window, float scale, float *o) {
    cpu_ctx *c = ctx;
    nsa_dims d = {Hq, Hk, D, block, counts, window, scale};
    HYLA_TRY(nsa_check("nsa_decode", B, &d));
    size_t per = 1;
    for (int b = 0; b < B; b++) {
        if (pos[b] < 0) return hyla_fail(HYLA_ERR_INVALID_ARG, "nsa_decode: session %d at position %d", b, (int)pos[b]);
        HYLA_TRY(kv_ready("nsa_decode", &kv[b], pos[b]));
        HYLA_TRY(cache_ready("nsa_decode", &kv[b], pos[b], block));
        size_t f = task_floats(&d, pos[b], kv[b].c_pages != NULL);
        if (f > per) per = f;
    }
    for (int b = 0; b < B; b++) kv_put(&kv[b], pos[b], k + (size_t)b * Hk * D, v + (size_t)b * Hk * D, Hk, D);
    int *hi = malloc((size_t)(B > 0 ? B : 1) * sizeof *hi);
    if (!hi) return hyla_fail(HYLA_ERR_NOMEM, "nsa_decode: out of memory");
    for (int b = 0; b < B; b++) hi[b] = pos[b];
    fill_blocks(c, kv, hi, B, Hk, D, block);
    free(hi);
    void *mem;
    HYLA_TRY(cpu_scratch(c, (size_t)c->nt * per * sizeof(float), &mem));
    long tasks = (long)B * Hk;
    int G = Hq / Hk;
#pragma omp parallel for num_threads(c->nt) if (tasks > 1) schedule(dynamic, 2)
    for (long task = 0; task < tasks; task++) {
        int b = (int)(task / Hk), h = (int)(task % Hk);
        size_t qo = ((size_t)b * Hq + (size_t)h * G);
        nsa_task(&d, &kv[b], pos[b], h, q + qo * D, g + qo * 3, o + qo * D,
                 (float *)mem + (size_t)omp_get_thread_num() * per);
    }
    return HYLA_OK;
}
