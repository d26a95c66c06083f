/* hyla_mixers.c — the list of mixer kinds (hyla_mixer.h) and the helpers every mixer module
 * uses. Adding a kind: one module in this folder and one line in hyla_mixers[] below
 * (docs/ARCHITECTURE.md "Adding a mixer"). The order of the list is the order in which hybrid
 * specs are read and in which `model_type` values are listed in messages. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_mixer.h"

extern const hyla_mixer hyla_mixer_gla, hyla_mixer_gdn, hyla_mixer_sse, hyla_mixer_attn;
/* sparse-attention kinds of the laLTE / laNSA hybrids */
extern const hyla_mixer hyla_mixer_lte, hyla_mixer_nsa;
/* Mamba2 (SSD) */
extern const hyla_mixer hyla_mixer_mamba2;
/* dynamic linear attention (DLA) kinds */
extern const hyla_mixer hyla_mixer_dla_gdn;
extern const hyla_mixer hyla_mixer_dla_mamba2;

const hyla_mixer *const hyla_mixers[] = {
    &hyla_mixer_gla,
    &hyla_mixer_gdn,
    &hyla_mixer_sse,
    &hyla_mixer_attn,
    /* sparse-attention kinds */
    &hyla_mixer_lte,
    &hyla_mixer_nsa,
    /* Mamba2 (SSD) */
    &hyla_mixer_mamba2,
    /* dynamic linear attention (DLA) kinds */
    &hyla_mixer_dla_gdn,
    &hyla_mixer_dla_mamba2,
    NULL,
};

const hyla_mixer *hyla_mixer_find(const char *name) {
    for (int i = 0; hyla_mixers[i]; i++) {
        const hyla_mixer *m = hyla_mixers[i];
        if (!strcmp(m->name, name) || (m->model_type && !strcmp(m->model_type, name)) ||
            (m->spec_key && !strcmp(m->spec_key, name)))
            return m;
    }
    return NULL;
}

void *const *hyla_mixer_gather(const hyla_mixer_fwd *f, int i, int part) {
    HYLA_ASSERT(i >= 0 && i < HYLA_MIXER_HOST_PTRS && f->decode);
    void **arr = f->host_ptrs + (size_t)i * (size_t)f->R;
    for (int r = 0; r < f->R; r++) arr[r] = f->st[r]->part[part].dev;
    return arr;
}

/* a linear's flags: prompt rows, and xn may be the norm's bf16 rows (prompt or decode rows) */
static int lin_flags(const hyla_mixer_fwd *f, const float *x) {
    return (f->decode ? 0 : HYLA_LINEAR_PREFILL) | (f->xn_bf16 && x == f->xn ? HYLA_LINEAR_X_BF16 : 0);
}

hyla_status hyla_mixer_linear(const hyla_mixer_fwd *f, const float *x, int K, const hyla_weight *W, const float *bias,
                              float *y, int N, int acc) {
    const int fl = lin_flags(f, x);
    if (!fl) return f->o->linear(f->ctx, x, K, f->R, K, W, bias, y, N, N, acc);
    hyla_linear_out lo = {W, bias, y, N, N, NULL, 0};
    return f->o->linear_multi(f->ctx, x, K, f->R, K, 1, &lo, acc, fl);
}

hyla_status hyla_mixer_linear_each(const hyla_mixer_fwd *f, int K, int n, const hyla_linear_out *outs, int acc) {
    if (f->decode) return f->o->linear_multi(f->ctx, outs[0].x, K, f->R, K, n, outs, acc, 0);
    for (int j = 0; j < n; j++)
        HYLA_TRY(hyla_mixer_linear(f, outs[j].x, K, outs[j].W, outs[j].bias, outs[j].y, outs[j].N, acc || outs[j].acc));
    return HYLA_OK;
}

hyla_status hyla_mixer_linear_multi(const hyla_mixer_fwd *f, const float *x, int K, int n, const hyla_linear_out *outs) {
    return f->o->linear_multi(f->ctx, x, K, f->R, K, n, outs, 0, lin_flags(f, x));
}

hyla_status hyla_mixer_linear_multi_bf16(const hyla_mixer_fwd *f, const float *x, int K, int n,
                                         const hyla_linear_out *outs) {
    HYLA_ASSERT(!f->decode && f->xn_bf16);
    return f->o->linear_multi(f->ctx, x, K, f->R, K, n, outs, 0, lin_flags(f, x) | HYLA_LINEAR_Y_BF16);
}

hyla_status hyla_mixer_kv_views(const hyla_mixer_fwd *f, int part_k, int part_v, hyla_kv_view **views) {
    int R = f->R, nv = f->decode ? R : 1;
    hyla_kv_view *v = calloc((size_t)nv, sizeof *v);
    if (!v) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    for (int i = 0; i < nv; i++) {
        hyla_layer_state *ls = f->st[i];
        int64_t need = f->pos[i] + (f->decode ? 1 : R);
        hyla_status st = hyla_layer_state_reserve(ls, part_k, need);
        if (st == HYLA_OK) st = hyla_layer_state_reserve(ls, part_v, need);
        if (st != HYLA_OK) {
            free(v);
            return st;
        }
        v[i].k_pages = ls->part[part_k].pages;
        v[i].v_pages = ls->part[part_v].pages;
        v[i].n_pages = ls->part[part_k].n_pages;
        v[i].page_tokens = HYLA_KV_PAGE_TOKENS;
    }
    *views = v;
    return HYLA_OK;
}

hyla_status hyla_mixer_rope_qk(const hyla_mixer_fwd *f, float *q, float *k, int Hq, int Hk, int hd, float theta) {
    HYLA_TRY(f->o->rope(f->ctx, q, f->R, Hq, hd, f->pos, theta));
    return f->o->rope(f->ctx, k, f->R, Hk, hd, f->pos, theta);
}

size_t hyla_gqa_layout(int R, int Hq, int Hk, int hd, void *base, hyla_gqa_scratch *s) {
    hyla_carver cv = hyla_carver_init(base);
    s->q = hyla_carve_f32(&cv, (size_t)R * Hq * hd);
    s->k = hyla_carve_f32(&cv, (size_t)R * Hk * hd);
    s->v = hyla_carve_f32(&cv, (size_t)R * Hk * hd);
    s->o = hyla_carve_f32(&cv, (size_t)R * Hq * hd);
    return cv.off;
}

const char *hyla_mk_kv_heads(const hyla_mk_args *a, int *kvh) {
    *kvh = a->kv_heads > 0 ? a->kv_heads : (a->heads % 2 == 0 ? a->heads / 2 : a->heads);
    if (a->hidden % a->heads || a->heads % *kvh) return "--hidden must be divisible by --heads, and heads by kv heads";
    return NULL;
}

hyla_decls hyla_decls_init(hyla_tensor_decl *out, const hyla_model_config *mc, int layer) {
    hyla_decls ds = {out, 0, ""};
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
    snprintf(ds.prefix, sizeof ds.prefix, mc->layout->mixer, layer);
#pragma GCC diagnostic pop
    return ds;
}

hyla_tensor_decl *hyla_decl(hyla_decls *ds, const char *suffix, hyla_tensor_use use, size_t offset, int ndim, int64_t d0,
                            int64_t d1, int64_t d2, hyla_init init, float p0, float p1) {
    HYLA_ASSERT(ds->n < HYLA_MIXER_MAX_TENSORS);
    hyla_tensor_decl *d = &ds->d[ds->n++];
    memset(d, 0, sizeof *d);
    snprintf(d->name[0], sizeof d->name[0], "%s%s", ds->prefix, suffix);
    d->use = use;
    d->offset = offset;
    d->ndim = ndim;
    d->shape[0] = d0;
    d->shape[1] = d1;
    d->shape[2] = d2;
    d->init = init;
    d->p0 = p0;
    d->p1 = p1;
    return d;
}

hyla_tensor_decl *hyla_decl_matrix(hyla_decls *ds, const char *suffix, size_t offset, int rows, int cols, float gain) {
    return hyla_decl(ds, suffix, HYLA_TENSOR_MATRIX, offset, 2, rows, cols, 0, HYLA_INIT_MATRIX, gain, 0);
}

hyla_tensor_decl *hyla_decl_vector(hyla_decls *ds, const char *suffix, size_t offset, int n, float base, float spread) {
    return hyla_decl(ds, suffix, HYLA_TENSOR_VECTOR, offset, 1, n, 0, 0, HYLA_INIT_VECTOR, base, spread);
}

void hyla_decl_alt(hyla_decls *ds, hyla_tensor_decl *d, const char *suffix) {
    for (int i = 1; i < HYLA_TENSOR_ALTS; i++)
        if (!d->name[i][0]) {
            snprintf(d->name[i], sizeof d->name[i], "%s%s", ds->prefix, suffix);
            return;
        }
    HYLA_ASSERT(!"too many alternative tensor names");
}

const char *hyla_tp_divide(int *v, const char *key, int T, char *why, size_t why_len) {
    if (*v % T) {
        snprintf(why, why_len, "%s %d is not divisible by %d", key, *v, T);
        return why;
    }
    *v /= T;
    return NULL;
}

/* The segments of a split dimension of shard length n: lens[] (negative: replicated); the default
 * (an empty list, or one that does not add up to n) is one split segment. */
static int tp_segs(const int *seg, int64_t n, int64_t *lens) {
    int k = 0;
    int64_t sum = 0;
    for (; k < HYLA_TP_SEGS && seg && seg[k]; k++) {
        lens[k] = seg[k];
        sum += seg[k] < 0 ? -seg[k] : seg[k];
    }
    if (!k || sum != n) {
        lens[0] = n;
        return 1;
    }
    return k;
}

int64_t hyla_tp_whole_len(const int *seg, int64_t n, int T) {
    int64_t lens[HYLA_TP_SEGS], w = 0;
    int k = tp_segs(seg, n, lens);
    for (int i = 0; i < k; i++) w += lens[i] < 0 ? -lens[i] : lens[i] * T;
    return w;
}

static void tp_copy(const int *seg, size_t outer, int64_t n, size_t inner, int T, int r, uint8_t *whole,
                    uint8_t *shard, int join) {
    int64_t lens[HYLA_TP_SEGS];
    int k = tp_segs(seg, n, lens);
    size_t wrun = (size_t)hyla_tp_whole_len(seg, n, T) * inner, srun = (size_t)n * inner;
    for (size_t o = 0; o < outer; o++) {
        uint8_t *w = whole + o * wrun, *s = shard + o * srun;
        for (int i = 0; i < k; i++) {
            size_t len = (size_t)(lens[i] < 0 ? -lens[i] : lens[i]) * inner;
            uint8_t *wp = w + (lens[i] < 0 ? 0 : (size_t)r * len);
            if (!join) memcpy(s, wp, len);
            else if (lens[i] > 0 || r == 0) memcpy(wp, s, len);
            w += lens[i] < 0 ? len : len * (size_t)T;
            s += len;
        }
    }
}

void hyla_tp_cut(const int *seg, size_t outer, int64_t n, size_t inner, int T, int r, const void *whole, void *shard) {
    tp_copy(seg, outer, n, inner, T, r, (uint8_t *)whole, shard, 0);
}

void hyla_tp_join(const int *seg, size_t outer, int64_t n, size_t inner, int T, int r, void *whole, const void *shard) {
    tp_copy(seg, outer, n, inner, T, r, whole, (uint8_t *)shard, 1);
}
