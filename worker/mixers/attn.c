/* attn.c — softmax attention layers (model_type "transformer", or the layers an `attn` spec
 * lists in a hybrid; docs/MODELS.md §4.4, [ATTN-1..2]).
 *
 * GQA, rotate-half RoPE at absolute positions, optional sliding window, qkv bias and q/k RMSNorm.
 * State: the keys and values of every position so far, paged (HYLA_KV_PAGE_TOKENS rows a page,
 * the backend's kv_dtype), incremental in snapshots. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_mixer.h"
#include "hyla_profile.h"

typedef struct {
    int heads, kv_heads, head_dim, window; /* window 0 = full */
    float rope_theta;
    int qkv_bias, qk_norm;
} attn_cfg;

typedef struct {
    hyla_weight *q, *k, *v, *o;      /* [Hq*hd][D], [Hk*hd][D], [Hk*hd][D], [D][Hq*hd] */
    float *q_bias, *k_bias, *v_bias; /* qkv_bias: [Hq*hd], [Hk*hd], [Hk*hd] */
    float *q_norm, *k_norm;          /* qk_norm: [hd] */
} attn_w;

enum { PART_K = 0, PART_V = 1 };

static void parse(hyla_cfg *r, json_t *obj, const hyla_model_config *mc, void *cfgp) {
    attn_cfg *c = cfgp;
    int spec = r->where && *r->where; /* a hybrid's spec requires num_heads; a transformer defaults it */
    c->heads = hyla_cfg_int(r, obj, "num_heads", spec ? -1 : 32);
    if (spec && c->heads <= 0) {
        hyla_cfg_fail(r, HYLA_ERR_FORMAT, "key '%s.num_heads' is required and must be positive", r->where);
        return;
    }
    c->kv_heads = hyla_cfg_int(r, obj, "num_kv_heads", c->heads);
    c->window = hyla_cfg_int(r, obj, "window_size", 0);
    c->rope_theta = (float)hyla_cfg_num(r, obj, "rope_theta", 10000.0);
    c->qkv_bias = hyla_cfg_bool(r, obj, "qkv_bias", 0);
    c->qk_norm = hyla_cfg_bool(r, obj, "qk_norm", 0);
    if (r->st != HYLA_OK) return;
    int D = mc->hidden_size;
    if (c->heads <= 0 || D % c->heads) {
        hyla_cfg_fail(r, HYLA_ERR_FORMAT, "hidden_size %d is not divisible by the attention num_heads %d", D, c->heads);
        return;
    }
    if (c->kv_heads <= 0 || c->heads % c->kv_heads) {
        hyla_cfg_fail(r, HYLA_ERR_FORMAT, "attention num_heads %d is not a multiple of num_kv_heads %d", c->heads,
                      c->kv_heads);
        return;
    }
    c->head_dim = D / c->heads;
    if (c->head_dim % 2) {
        hyla_cfg_fail(r, HYLA_ERR_FORMAT, "attention head dim %d must be even for RoPE", c->head_dim);
        return;
    }
    if (c->window < 0) c->window = 0;
}

static int tensors(const hyla_model_config *mc, const void *cfgp, int layer, hyla_tensor_decl *out) {
    const attn_cfg *c = cfgp;
    int D = mc->hidden_size, Hq = c->heads, Hk = c->kv_heads, hd = c->head_dim;
    hyla_decls ds = hyla_decls_init(out, mc, layer);
    hyla_decl_matrix(&ds, "q_proj.weight", offsetof(attn_w, q), Hq * hd, D, 1.0f);
    hyla_decl_matrix(&ds, "k_proj.weight", offsetof(attn_w, k), Hk * hd, D, 1.0f);
    hyla_decl_matrix(&ds, "v_proj.weight", offsetof(attn_w, v), Hk * hd, D, 1.0f);
    hyla_decl_matrix(&ds, "o_proj.weight", offsetof(attn_w, o), D, Hq * hd, 0.5f);
    if (c->qkv_bias) {
        hyla_decl_vector(&ds, "q_proj.bias", offsetof(attn_w, q_bias), Hq * hd, 0.0f, 0.1f);
        hyla_decl_vector(&ds, "k_proj.bias", offsetof(attn_w, k_bias), Hk * hd, 0.0f, 0.1f);
        hyla_decl_vector(&ds, "v_proj.bias", offsetof(attn_w, v_bias), Hk * hd, 0.0f, 0.1f);
    }
    if (c->qk_norm) {
        hyla_decl_vector(&ds, "q_norm.weight", offsetof(attn_w, q_norm), hd, 1.0f, 0.1f);
        hyla_decl_vector(&ds, "k_norm.weight", offsetof(attn_w, k_norm), hd, 1.0f, 0.1f);
    }
    return ds.n;
}

static int parts(const hyla_model_config *mc, const void *cfgp, hyla_dtype kv_dtype, hyla_part_spec *out) {
    (void)mc;
    const attn_cfg *c = cfgp;
    uint64_t Hk = (uint64_t)c->kv_heads, hd = (uint64_t)c->head_dim;
    out[0] = (hyla_part_spec){"k", HYLA_PART_KV, kv_dtype, 2, {Hk, hd}, 1};
    out[1] = (hyla_part_spec){"v", HYLA_PART_KV, kv_dtype, 2, {Hk, hd}, 1};
    return 2;
}

typedef struct {
    float *q, *k, *v; /* [R][Hq*hd], [R][Hk*hd], [R][Hk*hd] */
    float *o;         /* [R][Hq*hd] */
} attn_scratch;

static size_t layout(const attn_cfg *c, int R, void *base, attn_scratch *s) {
    hyla_carver cv = hyla_carver_init(base);
    s->q = hyla_carve_f32(&cv, (size_t)R * c->heads * c->head_dim);
    s->k = hyla_carve_f32(&cv, (size_t)R * c->kv_heads * c->head_dim);
    s->v = hyla_carve_f32(&cv, (size_t)R * c->kv_heads * c->head_dim);
    s->o = hyla_carve_f32(&cv, (size_t)R * c->heads * c->head_dim);
    return cv.off;
}

static size_t scratch_bytes(const hyla_model_config *mc, const void *cfg, int rows) {
    (void)mc;
    attn_scratch s;
    return layout(cfg, rows, NULL, &s);
}

static hyla_status forward(const hyla_mixer_fwd *f) {
    const attn_cfg *c = f->cfg;
    const attn_w *w = f->w;
    const hyla_ops *o = f->o;
    void *ctx = f->ctx;
    int D = f->mc->hidden_size, Hq = c->heads, Hk = c->kv_heads, hd = c->head_dim, R = f->R;
    float scale = 1.0f / sqrtf((float)hd);
    attn_scratch s;
    layout(c, f->cap_rows, f->scratch, &s);
    hyla_linear_out lo[3] = {
        {w->q, w->q_bias, s.q, Hq * hd, Hq * hd},
        {w->k, w->k_bias, s.k, Hk * hd, Hk * hd},
        {w->v, w->v_bias, s.v, Hk * hd, Hk * hd},
    };
    HYLA_TRY(hyla_mixer_linear_multi(f, f->xn, D, 3, lo));
    HYLA_MIXER_MARK(f, "attn: q/k/v proj");
    if (w->q_norm) {
        HYLA_TRY(o->rmsnorm(ctx, s.q, w->q_norm, s.q, R * Hq, hd, 1e-5f));
        HYLA_TRY(o->rmsnorm(ctx, s.k, w->k_norm, s.k, R * Hk, hd, 1e-5f));
    }
    HYLA_TRY(o->rope(ctx, s.q, R, Hq, hd, f->pos, c->rope_theta));
    HYLA_TRY(o->rope(ctx, s.k, R, Hk, hd, f->pos, c->rope_theta));
    hyla_kv_view *views = NULL;
    HYLA_TRY(hyla_mixer_kv_views(f, PART_K, PART_V, &views));
    hyla_status st;
    if (f->decode)
        st = o->attn_decode(ctx, s.q, s.k, s.v, R, Hq, Hk, hd, f->pos, views, c->window, scale, s.o);
    else
        st = o->attn_prefill(ctx, s.q, s.k, s.v, R, Hq, Hk, hd, f->pos[0], views, c->window, scale, s.o);
    free(views);
    HYLA_TRY(st);
    HYLA_MIXER_MARK(f, "attn: norms, rope, pages, core");
    HYLA_TRY(hyla_mixer_linear(f, s.o, Hq * hd, w->o, NULL, f->out, D, 0));
    HYLA_MIXER_MARK(f, "attn: o proj");
    return HYLA_OK;
}

static const char *mk_config(json_t *obj, const hyla_mk_args *a) {
    int kvh = a->kv_heads > 0 ? a->kv_heads : (a->heads % 2 == 0 ? a->heads / 2 : a->heads);
    if (a->hidden % a->heads || a->heads % kvh) return "--hidden must be divisible by --heads, and heads by kv heads";
    if (a->spec) { /* the keys of a hybrid's attn spec */
        json_object_set_new(obj, "num_heads", json_integer(a->heads));
        json_object_set_new(obj, "num_kv_heads", json_integer(kvh));
        json_object_set_new(obj, "window_size", a->window > 0 ? json_integer(a->window) : json_null());
        json_object_set_new(obj, "rope_theta", json_real(10000.0));
        json_object_set_new(obj, "qkv_bias", json_false());
        return NULL;
    }
    json_object_set_new(obj, "num_kv_heads", json_integer(kvh));
    json_object_set_new(obj, "rope_theta", json_real(10000.0));
    if (a->window > 0) json_object_set_new(obj, "window_size", json_integer(a->window));
    json_object_set_new(obj, "qkv_bias", json_false());
    return NULL;
}

const hyla_mixer hyla_mixer_attn = {
    .name = "attn",
    .model_type = "transformer",
    .spec_key = "attn",
    .layout = NULL,
    .parse_model = NULL,
    .cfg_size = sizeof(attn_cfg),
    .w_size = sizeof(attn_w),
    .parse = parse,
    .tensors = tensors,
    .parts = parts,
    .scratch_bytes = scratch_bytes,
    .forward = forward,
    .mk_config = mk_config,
};
