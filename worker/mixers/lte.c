/* lte.c — learnable-token-eviction attention layers (the layers an `lte` spec lists in a hybrid
 * such as laLTE; docs/MODELS.md §5.1, [LTE-1..5]; lte-hybrid-sparse-attention-token-eviction
 * §3.1).
 *
 * Softmax attention with GQA and RoPE at true positions over a fixed-size cache per KV head: an
 * attention sink (the first s tokens), a sliding window (the last w tokens) and a segment of at
 * most b older tokens retained by a small grouped CNN's score r = sigmoid(CNN(k‖v)) > 0.5.
 * State: one `lte` part set whose size does not grow with the context (window ring, retained
 * segment with scores and positions, sink, the counters that say which positions are unscored).
 * The cache update and the attention are the backend's lte_prefill / lte_decode ops. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_mixer.h"
#include "hyla_profile.h"

typedef struct {
    int heads, kv_heads, head_dim;
    int sink, window, budget;
    int n_conv, kernel, dilation;
    int ch[HYLA_LTE_MAX_CONV + 1]; /* ch[0] = 2*head_dim */
    float rope_theta;
    int eager; /* "scoring": "eager" (a test and debugging mode; same outputs as lazy) */
} lte_cfg;

typedef struct {
    hyla_weight *q, *k, *v, *o;             /* [Hq*hd][D], [Hk*hd][D], [Hk*hd][D], [D][Hq*hd] */
    float *conv_w[HYLA_LTE_MAX_CONV];       /* [Hk*ch[l+1]][ch[l]][kernel] */
    float *conv_b[HYLA_LTE_MAX_CONV];       /* [Hk*ch[l+1]] */
    float *proj_w, *proj_b;                 /* [Hk][ch[L]][1], [Hk] */
} lte_w;

enum { PART_K = 0, PART_V, PART_R, PART_RPOS, PART_META, N_PARTS };

/* A refusal naming the key inside the spec ("key 'lte.window_size': ..."). */
static void bad_key(hyla_cfg *r, const char *key, const char *why, int v) {
    char k[96];
    snprintf(k, sizeof k, "%s%s%s", r->where && *r->where ? r->where : "", r->where && *r->where ? "." : "", key);
    hyla_cfg_fail(r, HYLA_ERR_FORMAT, "key '%s' %s (got %d)", k, why, v);
}

static void parse(hyla_cfg *r, json_t *obj, const hyla_model_config *mc, void *cfgp) {
    lte_cfg *c = cfgp;
    int D = mc->hidden_size;
    c->heads = hyla_cfg_int(r, obj, "num_heads", -1);
    if (r->st == HYLA_OK && c->heads <= 0) bad_key(r, "num_heads", "is required and must be positive", c->heads);
    if (r->st != HYLA_OK) return;
    c->kv_heads = hyla_cfg_int(r, obj, "num_kv_heads", c->heads);
    c->head_dim = hyla_cfg_int(r, obj, "head_dim", D % c->heads ? -1 : D / c->heads);
    c->rope_theta = (float)hyla_cfg_num(r, obj, "rope_theta", 10000.0);
    c->sink = hyla_cfg_int(r, obj, "sink_size", 4);
    c->window = hyla_cfg_int(r, obj, "window_size", 768);
    c->budget = hyla_cfg_int(r, obj, "budget", 512);
    c->kernel = hyla_cfg_int(r, obj, "conv_kernel_size", 3);
    c->dilation = hyla_cfg_int(r, obj, "conv_dilation", 2);
    const char *scoring = hyla_cfg_str(r, obj, "scoring", "lazy");
    if (r->st != HYLA_OK) return;
    if (c->kv_heads <= 0 || c->heads % c->kv_heads) { bad_key(r, "num_kv_heads", "must divide num_heads", c->kv_heads); return; }
    if (c->head_dim <= 0 || c->head_dim % 2)
    {
        bad_key(r, "head_dim", "must be positive and even (RoPE); without it hidden_size / num_heads", c->head_dim);
        return;
    }
    if (c->sink < 0) { bad_key(r, "sink_size", "must be >= 0", c->sink); return; }
    if (c->budget < 1) { bad_key(r, "budget", "must be >= 1", c->budget); return; }
    if (c->kernel < 1 || c->kernel % 2 == 0) { bad_key(r, "conv_kernel_size", "must be odd and positive", c->kernel); return; }
    if (c->dilation < 1) { bad_key(r, "conv_dilation", "must be positive", c->dilation); return; }
    if (!strcmp(scoring, "lazy")) c->eager = 0;
    else if (!strcmp(scoring, "eager")) c->eager = 1;
    else { hyla_cfg_refuse(r, "scoring", "must be \"lazy\" or \"eager\""); return; }
    c->ch[0] = 2 * c->head_dim;
    json_t *chs = json_object_get(obj, "conv_channels");
    if (chs && !json_is_null(chs)) {
        if (!json_is_array(chs) || json_array_size(chs) < 1 || json_array_size(chs) > HYLA_LTE_MAX_CONV)
            { bad_key(r, "conv_channels", "must be a list of 1 to 4 channel counts", (int)json_array_size(chs)); return; }
        c->n_conv = (int)json_array_size(chs);
        for (int l = 0; l < c->n_conv; l++) {
            json_t *e = json_array_get(chs, (size_t)l);
            c->ch[l + 1] = json_is_integer(e) ? (int)json_integer_value(e) : -1;
            if (c->ch[l + 1] <= 0) { bad_key(r, "conv_channels", "must hold positive integers", c->ch[l + 1]); return; }
        }
    } else { /* the paper's: three layers, each halving the channels */
        c->n_conv = 3;
        for (int l = 1; l <= 3; l++) c->ch[l] = c->ch[l - 1] / 2 > 0 ? c->ch[l - 1] / 2 : 1;
    }
    int rf = 1 + c->n_conv * (c->kernel - 1) * c->dilation;
    if (c->window < rf) bad_key(r, "window_size", "must be at least the scoring CNN's receptive field", c->window);
}

static int tensors(const hyla_model_config *mc, const void *cfgp, int layer, hyla_tensor_decl *out) {
    const lte_cfg *c = cfgp;
    int D = mc->hidden_size, Hq = c->heads, Hk = c->kv_heads, hd = c->head_dim;
    hyla_decls ds = hyla_decls_init(out, mc, layer);
    hyla_decl_matrix(&ds, "q_proj.weight", offsetof(lte_w, q), Hq * hd, D, 1.0f);
    hyla_decl_matrix(&ds, "k_proj.weight", offsetof(lte_w, k), Hk * hd, D, 1.0f);
    hyla_decl_matrix(&ds, "v_proj.weight", offsetof(lte_w, v), Hk * hd, D, 1.0f);
    hyla_decl_matrix(&ds, "o_proj.weight", offsetof(lte_w, o), D, Hq * hd, 0.5f);
    for (int l = 0; l < c->n_conv; l++) {
        char nm[64];
        int cin = c->ch[l], cout = c->ch[l + 1];
        float a = sqrtf(3.0f / (float)(cin * c->kernel)); /* unit-variance outputs */
        snprintf(nm, sizeof nm, "lte.convs.%d.weight", l);
        hyla_decl(&ds, nm, HYLA_TENSOR_VECTOR, offsetof(lte_w, conv_w) + (size_t)l * sizeof(float *), 3, Hk * cout, cin,
                  c->kernel, HYLA_INIT_VECTOR, 0.0f, a);
        snprintf(nm, sizeof nm, "lte.convs.%d.bias", l);
        hyla_decl_vector(&ds, nm, offsetof(lte_w, conv_b) + (size_t)l * sizeof(float *), Hk * cout, 0.0f, 0.1f);
    }
    int cl = c->ch[c->n_conv];
    hyla_decl(&ds, "lte.proj.weight", HYLA_TENSOR_VECTOR, offsetof(lte_w, proj_w), 3, Hk, cl, 1, HYLA_INIT_VECTOR, 0.0f,
              sqrtf(3.0f / (float)cl));
    hyla_decl_vector(&ds, "lte.proj.bias", offsetof(lte_w, proj_b), Hk, 0.0f, 0.5f);
    return ds.n;
}

static int parts(const hyla_model_config *mc, const void *cfgp, hyla_dtype kv_dtype, hyla_part_spec *out) {
    (void)mc;
    const lte_cfg *c = cfgp;
    uint64_t Hk = (uint64_t)c->kv_heads, hd = (uint64_t)c->head_dim;
    uint64_t rows = (uint64_t)(c->sink + c->window + c->budget);
    out[PART_K] = (hyla_part_spec){"k", HYLA_PART_LTE, kv_dtype, 3, {Hk, rows, hd}, 0, {0}};
    out[PART_V] = (hyla_part_spec){"v", HYLA_PART_LTE, kv_dtype, 3, {Hk, rows, hd}, 0, {0}};
    out[PART_R] = (hyla_part_spec){"r", HYLA_PART_LTE, HYLA_DT_F32, 2, {Hk, rows}, 0, {0}};
    out[PART_RPOS] = (hyla_part_spec){"rpos", HYLA_PART_LTE, HYLA_DT_I32, 2, {Hk, (uint64_t)c->budget}, 0, {0}};
    out[PART_META] = (hyla_part_spec){"meta", HYLA_PART_LTE, HYLA_DT_I32, 1, {2 + Hk}, 0, {-2, (int)Hk}}; /* counters, then per head */
    return N_PARTS;
}

static size_t layout(const lte_cfg *c, int R, void *base, hyla_gqa_scratch *s) {
    return hyla_gqa_layout(R, c->heads, c->kv_heads, c->head_dim, base, s);
}

HYLA_MIXER_SCRATCH_BYTES(hyla_gqa_scratch)

static hyla_lte_params params(const lte_cfg *c, const lte_w *w) {
    hyla_lte_params p = {0};
    p.Hk = c->kv_heads;
    p.D = c->head_dim;
    p.sink = c->sink;
    p.window = c->window;
    p.budget = c->budget;
    p.n_conv = c->n_conv;
    p.kernel = c->kernel;
    p.dilation = c->dilation;
    memcpy(p.ch, c->ch, sizeof p.ch);
    for (int l = 0; l < c->n_conv; l++) p.conv_w[l] = w->conv_w[l], p.conv_b[l] = w->conv_b[l];
    p.proj_w = w->proj_w;
    p.proj_b = w->proj_b;
    p.rope_theta = c->rope_theta;
    p.eager = c->eager;
    return p;
}

static hyla_lte_cache cache_of(hyla_layer_state *ls) {
    return (hyla_lte_cache){ls->part[PART_K].dev, ls->part[PART_V].dev, ls->part[PART_R].dev, ls->part[PART_RPOS].dev,
                            ls->part[PART_META].dev};
}

static hyla_status forward(const hyla_mixer_fwd *f) {
    const lte_cfg *c = f->cfg;
    const lte_w *w = f->w;
    const hyla_ops *o = f->o;
    void *ctx = f->ctx;
    if (!o->lte_prefill || !o->lte_decode)
        return hyla_fail(HYLA_ERR_UNSUPPORTED, "the %s backend has no LTE ops (lte layers run on the cpu backend)", o->name);
    int D = f->mc->hidden_size, Hq = c->heads, Hk = c->kv_heads, hd = c->head_dim, R = f->R;
    float scale = 1.0f / sqrtf((float)hd);
    hyla_gqa_scratch s;
    layout(c, f->cap_rows, f->scratch, &s);
    hyla_linear_out lo[3] = {
        {w->q, NULL, s.q, Hq * hd, Hq * hd, NULL, 0},
        {w->k, NULL, s.k, Hk * hd, Hk * hd, NULL, 0},
        {w->v, NULL, s.v, Hk * hd, Hk * hd, NULL, 0},
    };
    HYLA_TRY(hyla_mixer_linear_multi(f, f->xn, D, 3, lo));
    HYLA_MIXER_MARK(f, "lte: q/k/v proj");
    HYLA_TRY(hyla_mixer_rope_qk(f, s.q, s.k, Hq, Hk, hd, c->rope_theta));
    hyla_lte_params p = params(c, w);
    int nc = f->decode ? R : 1;
    hyla_lte_cache *cs = calloc((size_t)nc, sizeof *cs);
    if (!cs) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    for (int i = 0; i < nc; i++) cs[i] = cache_of(f->st[i]);
    hyla_status st = f->decode ? o->lte_decode(ctx, &p, s.q, s.k, s.v, R, Hq, f->pos, cs, scale, s.o)
                               : o->lte_prefill(ctx, &p, s.q, s.k, s.v, R, Hq, f->pos[0], cs, scale, s.o);
    free(cs);
    HYLA_TRY(st);
    HYLA_MIXER_MARK(f, "lte: rope, cache, core");
    HYLA_TRY(hyla_mixer_linear(f, s.o, Hq * hd, w->o, NULL, f->out, D, f->out_acc));
    HYLA_MIXER_MARK(f, "lte: o proj");
    return HYLA_OK;
}

static const char *mk_config(json_t *obj, const hyla_mk_args *a) {
    int kvh;
    const char *why = hyla_mk_kv_heads(a, &kvh);
    if (why) return why;
    if (!a->spec) return "lte layers come in hybrids (--arch lalte)";
    json_object_set_new(obj, "num_heads", json_integer(a->heads));
    json_object_set_new(obj, "num_kv_heads", json_integer(kvh));
    json_object_set_new(obj, "rope_theta", json_real(10000.0));
    json_object_set_new(obj, "sink_size", json_integer(a->sink >= 0 ? a->sink : 4));
    json_object_set_new(obj, "window_size", json_integer(a->window > 0 ? a->window : 768));
    json_object_set_new(obj, "budget", json_integer(a->budget > 0 ? a->budget : 512));
    json_object_set_new(obj, "conv_kernel_size", json_integer(3));
    json_object_set_new(obj, "conv_dilation", json_integer(2));
    int hd = a->hidden / a->heads;
    json_t *ch = json_array();
    for (int l = 1, c = 2 * hd; l <= 3; l++) json_array_append_new(ch, json_integer(c = c / 2 > 0 ? c / 2 : 1));
    json_object_set_new(obj, "conv_channels", ch);
    return NULL;
}

/* Tensor parallelism: everything is per KV head (the scoring CNN is grouped by head; the cache's
 * counters are the same on every rank: meta's split layout replicates them). */
static const char *tp_shard(void *cfgp, int T, char *why, size_t n) {
    lte_cfg *c = cfgp;
    const char *e = hyla_tp_divide(&c->heads, "num_heads", T, why, n);
    return e ? e : hyla_tp_divide(&c->kv_heads, "num_kv_heads", T, why, n);
}

const hyla_mixer hyla_mixer_lte = {
    .name = "lte",
    .model_type = NULL,
    .spec_key = "lte",
    HYLA_MIXER_HOOKS(lte_cfg, lte_w),
    .mk_config = mk_config,
    .tp_shard = tp_shard,
};
