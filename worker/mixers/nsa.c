/* nsa.c — native sparse attention layers (model_type "nsa", or the layers an `nsa` spec lists in
 * a hybrid such as laNSA; docs/MODELS.md §5.2, [NSA-1..4]).
 *
 * Keys and tensors as flash-linear-attention's NativeSparseAttention layer and NSA model name
 * them: q/k/v projections (optional bias), g_proj giving three gate logits per query head
 * (compressed, selected, window), o_proj; GQA and rotate-half RoPE. State: the keys and values
 * of every position, paged and incremental in snapshots exactly as attention's. The compressed
 * blocks (one row [2][Hk][hd] fp32 per complete block) are a cache derived from the KV in the
 * layer state's derived pages: the ops fill a block once, when it completes, so a decode step
 * reads only the compressed rows, the selected blocks and the window. Snapshots hold the KV
 * alone; an imported session starts with an empty cache, which its first forward refills from
 * the KV (the same bits: a block's mean depends only on its tokens). */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include "hyla_mixer.h"
#include "hyla_profile.h"

typedef struct {
    int heads, kv_heads, head_dim, qkv_bias;
    int block, counts, window; /* block_size, block_counts, window_size (0 = no window branch) */
    float rope_theta;
} nsa_cfg;

typedef struct {
    hyla_weight *q, *k, *v, *g, *o;  /* [Hq*hd][D], [Hk*hd][D] x2, [Hq*3][D], [D][Hq*hd] */
    float *q_bias, *k_bias, *v_bias; /* qkv_bias */
} nsa_w;

enum { PART_K = 0, PART_V = 1 };

static void parse(hyla_cfg *r, json_t *obj, const hyla_model_config *mc, void *cfgp) {
    (void)mc;
    nsa_cfg *c = cfgp;
    int spec = r->where && *r->where; /* a spec requires num_heads; an nsa model has FLA's defaults */
    c->heads = hyla_cfg_int(r, obj, "num_heads", spec ? -1 : 64);
    if (spec && r->st == HYLA_OK && c->heads <= 0) {
        hyla_cfg_fail(r, HYLA_ERR_FORMAT, "key '%s.num_heads' is required and must be positive", r->where);
        return;
    }
    c->kv_heads = hyla_cfg_int(r, obj, "num_kv_heads", spec ? c->heads : 4);
    c->head_dim = hyla_cfg_int(r, obj, "head_dim", spec ? 64 : 32);
    c->qkv_bias = hyla_cfg_bool(r, obj, "qkv_bias", 0);
    c->block = hyla_cfg_int(r, obj, "block_size", 64);
    c->window = hyla_cfg_int(r, obj, "window_size", 512);
    c->rope_theta = (float)hyla_cfg_num(r, obj, "rope_theta", 10000.0);
    json_t *bc = json_object_get(obj, "block_counts");
    if (bc && !json_is_null(bc) && !json_is_integer(bc)) {
        hyla_cfg_refuse(r, "block_counts", "only an integer (the same count for every query) is supported");
        return;
    }
    c->counts = hyla_cfg_int(r, obj, "block_counts", 16);
    if (r->st != HYLA_OK) return;
    hyla_cfg_positive(r, "num_heads", c->heads);
    hyla_cfg_positive(r, "num_kv_heads", c->kv_heads);
    hyla_cfg_positive(r, "head_dim", c->head_dim);
    hyla_cfg_positive(r, "block_size", c->block);
    hyla_cfg_positive(r, "block_counts", c->counts);
    if (r->st != HYLA_OK) return;
    if (c->heads % c->kv_heads) hyla_cfg_refuse(r, "num_kv_heads", "must divide num_heads");
    else if (c->head_dim % 2) hyla_cfg_refuse(r, "head_dim", "must be even (RoPE)");
    if (c->window < 0) c->window = 0;
}

static int tensors(const hyla_model_config *mc, const void *cfgp, int layer, hyla_tensor_decl *out) {
    const nsa_cfg *c = cfgp;
    int D = mc->hidden_size, Hq = c->heads, Hk = c->kv_heads, hd = c->head_dim;
    hyla_decls ds = hyla_decls_init(out, mc, layer);
    hyla_decl_matrix(&ds, "q_proj.weight", offsetof(nsa_w, q), Hq * hd, D, 1.0f);
    hyla_decl_matrix(&ds, "k_proj.weight", offsetof(nsa_w, k), Hk * hd, D, 1.0f);
    hyla_decl_matrix(&ds, "v_proj.weight", offsetof(nsa_w, v), Hk * hd, D, 1.0f);
    hyla_decl_matrix(&ds, "g_proj.weight", offsetof(nsa_w, g), Hq * 3, D, 1.0f);
    hyla_decl_matrix(&ds, "o_proj.weight", offsetof(nsa_w, o), D, Hq * hd, 0.5f);
    if (c->qkv_bias) {
        hyla_decl_vector(&ds, "q_proj.bias", offsetof(nsa_w, q_bias), Hq * hd, 0.0f, 0.1f);
        hyla_decl_vector(&ds, "k_proj.bias", offsetof(nsa_w, k_bias), Hk * hd, 0.0f, 0.1f);
        hyla_decl_vector(&ds, "v_proj.bias", offsetof(nsa_w, v_bias), Hk * hd, 0.0f, 0.1f);
    }
    return ds.n;
}

static int parts(const hyla_model_config *mc, const void *cfgp, hyla_dtype kv_dtype, hyla_part_spec *out) {
    (void)mc;
    const nsa_cfg *c = cfgp;
    uint64_t Hk = (uint64_t)c->kv_heads, hd = (uint64_t)c->head_dim;
    out[PART_K] = (hyla_part_spec){"k", HYLA_PART_KV, kv_dtype, 2, {Hk, hd}, 1, {0}};
    out[PART_V] = (hyla_part_spec){"v", HYLA_PART_KV, kv_dtype, 2, {Hk, hd}, 1, {0}};
    return 2;
}

typedef struct {
    float *q, *k, *v, *g; /* [R][Hq*hd], [R][Hk*hd] x2, [R][Hq*3] */
    float *o;             /* [R][Hq*hd] */
} nsa_scratch;

static size_t layout(const nsa_cfg *c, int R, void *base, nsa_scratch *s) {
    hyla_carver cv = hyla_carver_init(base);
    s->q = hyla_carve_f32(&cv, (size_t)R * c->heads * c->head_dim);
    s->k = hyla_carve_f32(&cv, (size_t)R * c->kv_heads * c->head_dim);
    s->v = hyla_carve_f32(&cv, (size_t)R * c->kv_heads * c->head_dim);
    s->g = hyla_carve_f32(&cv, (size_t)R * c->heads * 3);
    s->o = hyla_carve_f32(&cv, (size_t)R * c->heads * c->head_dim);
    return cv.off;
}

HYLA_MIXER_SCRATCH_BYTES(nsa_scratch)

static hyla_status forward(const hyla_mixer_fwd *f) {
    const nsa_cfg *c = f->cfg;
    const nsa_w *w = f->w;
    const hyla_ops *o = f->o;
    void *ctx = f->ctx;
    if (!o->nsa_prefill || !o->nsa_decode)
        return hyla_fail(HYLA_ERR_UNSUPPORTED, "the %s backend has no NSA ops (nsa layers run on the cpu backend)", o->name);
    int D = f->mc->hidden_size, Hq = c->heads, Hk = c->kv_heads, hd = c->head_dim, R = f->R;
    float scale = 1.0f / sqrtf((float)hd);
    nsa_scratch s;
    layout(c, f->cap_rows, f->scratch, &s);
    hyla_linear_out lo[4] = {
        {w->q, w->q_bias, s.q, Hq * hd, Hq * hd, NULL, 0},
        {w->k, w->k_bias, s.k, Hk * hd, Hk * hd, NULL, 0},
        {w->v, w->v_bias, s.v, Hk * hd, Hk * hd, NULL, 0},
        {w->g, NULL, s.g, Hq * 3, Hq * 3, NULL, 0},
    };
    HYLA_TRY(hyla_mixer_linear_multi(f, f->xn, D, 4, lo));
    HYLA_MIXER_MARK(f, "nsa: q/k/v/g proj");
    HYLA_TRY(hyla_mixer_rope_qk(f, s.q, s.k, Hq, Hk, hd, c->rope_theta));
    hyla_kv_view *views = NULL;
    HYLA_TRY(hyla_mixer_kv_views(f, PART_K, PART_V, &views));
    hyla_status st = HYLA_OK;
    int nv = f->decode ? R : 1;
    size_t crow = (size_t)2 * Hk * hd * sizeof(float);
    for (int i = 0; st == HYLA_OK && i < nv; i++) {
        hyla_layer_state *ls = f->st[i];
        int64_t first = f->pos[i], last = f->pos[i] + (f->decode ? 0 : R - 1);
        st = hyla_layer_state_reserve_derived(ls, crow, (last + 1) / c->block);
        /* blocks wholly before this forward's first token are unchanged since they were filled
         * (a session only ever appends after the tokens it keeps) */
        int64_t valid = ls->derived_rows < first / c->block ? ls->derived_rows : first / c->block;
        views[i].c_pages = ls->derived.pages;
        views[i].c_n_pages = ls->derived.n_pages;
        views[i].c_valid = (int)valid;
    }
    if (st != HYLA_OK) {
        free(views);
        return st;
    }
    if (f->decode)
        st = o->nsa_decode(ctx, s.q, s.k, s.v, s.g, R, Hq, Hk, hd, f->pos, views, c->block, c->counts, c->window,
                           scale, s.o);
    else
        st = o->nsa_prefill(ctx, s.q, s.k, s.v, s.g, R, Hq, Hk, hd, f->pos[0], views, c->block, c->counts,
                            c->window, scale, s.o);
    free(views);
    HYLA_TRY(st);
    for (int i = 0; i < nv; i++) f->st[i]->derived_rows = (f->pos[i] + (f->decode ? 1 : R)) / c->block;
    HYLA_MIXER_MARK(f, "nsa: rope, pages, core");
    HYLA_TRY(hyla_mixer_linear(f, s.o, Hq * hd, w->o, NULL, f->out, D, f->out_acc));
    HYLA_MIXER_MARK(f, "nsa: o proj");
    return HYLA_OK;
}

static const char *mk_config(json_t *obj, const hyla_mk_args *a) {
    int kvh;
    const char *why = hyla_mk_kv_heads(a, &kvh);
    if (why) return why;
    if (a->spec) json_object_set_new(obj, "num_heads", json_integer(a->heads));
    json_object_set_new(obj, "num_kv_heads", json_integer(kvh));
    json_object_set_new(obj, "head_dim", json_integer(a->head_dim > 0 ? a->head_dim : a->hidden / a->heads));
    json_object_set_new(obj, "qkv_bias", json_false());
    json_object_set_new(obj, "block_size", json_integer(a->nsa_block > 0 ? a->nsa_block : 64));
    json_object_set_new(obj, "block_counts", json_integer(a->nsa_counts > 0 ? a->nsa_counts : 16));
    json_object_set_new(obj, "window_size", json_integer(a->window > 0 ? a->window : 512));
    json_object_set_new(obj, "rope_theta", json_real(10000.0));
    return NULL;
}

static const char *tp_shard(void *cfgp, int T, char *why, size_t n) {
    nsa_cfg *c = cfgp;
    const char *e = hyla_tp_divide(&c->heads, "num_heads", T, why, n);
    return e ? e : hyla_tp_divide(&c->kv_heads, "num_kv_heads", T, why, n);
}

const hyla_mixer hyla_mixer_nsa = {
    .name = "nsa",
    .model_type = "nsa",
    .spec_key = "nsa",
    HYLA_MIXER_HOOKS(nsa_cfg, nsa_w),
    .mk_config = mk_config,
    .tp_shard = tp_shard,
};
