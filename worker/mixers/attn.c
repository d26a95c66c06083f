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
    out[0] = (hyla_part_spec){"k", HYLA_PART_KV, kv_dtype, 2, {Hk, hd}, 1, {0}};
    out[1] = (hyla_part_spec){"v", HYLA_PART_KV, kv_dtype, 2, {Hk, hd}, 1, {0}};
    return 2;
}

static size_t layout(const attn_cfg *c, int R, void *base, hyla_gqa_scratch *s) {
    return hyla_gqa_layout(R, c->heads, c->kv_heads, c->head_dim, base, s);
}

HYLA_MIXER_SCRATCH_BYTES(hyla_gqa_scratch)

static hyla_status forward(const hyla_mixer_fwd *f) {
    const attn_cfg *c = f->cfg;
    const attn_w *w = f->w;
    const hyla_ops *o = f->o;
    void *ctx = f->ctx;
    int D = f->mc->hidden_size, Hq = c->heads, Hk = c->kv_heads, hd = c->head_dim, R = f->R;
    float scale = 1.0f / sqrtf((float)hd);
    hyla_gqa_scratch s;
    layout(c, f->cap_rows, f->scratch, &s);
    hyla_linear_out lo[3] = {
        {w->q, w->q_bias, s.q, Hq * hd, Hq * hd, NULL, 0},
        {w->k, w->k_bias, s.k, Hk * hd, Hk * hd, NULL, 0},
        {w->v, w->v_bias, s.v, Hk * hd, Hk * hd, NULL, 0},
    };
    HYLA_TRY(hyla_mixer_linear_multi(f, f->xn, D, 3, lo));
    HYLA_MIXER_MARK(f, "attn: q/k/v proj");
    if (w->q_norm) {
        HYLA_TRY(o->rmsnorm(ctx, s.q, w->q_norm, s.q, R * Hq, hd, 1e-5f));
        HYLA_TRY(o->rmsnorm(ctx, s.k, w->k_norm, s.k, R * Hk, hd, 1e-5f));
    }
    HYLA_TRY(hyla_mixer_rope_qk(f, s.q, s.k, Hq, Hk, hd, c->rope_theta));
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
    HYLA_TRY(hyla_mixer_linear(f, s.o, Hq * hd, w->o, NULL, f->out, D, f->out_acc));
    HYLA_MIXER_MARK(f, "attn: o proj");
    return HYLA_OK;
}

static const char *mk_config(json_t *obj, const hyla_mk_args *a) {
    int kvh;
    const char *why = hyla_mk_kv_heads(a, &kvh);
    if (why) return why;
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

static const char *tp_shard(void *cfgp, int T, char *why, size_t n) {
    attn_cfg *c = cfgp;
    const char *e = hyla_tp_divide(&c->heads, "num_heads", T, why, n);
    return e ? e : hyla_tp_divide(&c->kv_heads, "num_kv_heads", T, why, n);
}

const hyla_mixer hyla_mixer_attn = {
    .name = "attn",
    .model_type = "transformer",
    .spec_key = "attn",
    HYLA_MIXER_HOOKS(attn_cfg, attn_w),
    .mk_config = mk_config,
    .tp_shard = tp_shard,
};
