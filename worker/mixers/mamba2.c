/* mamba2.c — Mamba2 layers (model_type "mamba2"; docs/MODELS.md "Mamba2", [M2-1..3]).
 *
 * Keys, tensors and layout as Hugging Face transformers' Mamba2 (and flash-linear-attention's
 * copy of it) save them: `backbone.*` names, mixer-only layers (pre-RMSNorm -> mixer ->
 * residual; no MLP), `layer_norm_epsilon`. Forward: in_proj -> [z | xBC | dt]; xBC through the
 * causal depthwise conv (bias, silu) with its carried tail; the SSD scan over heads of P with
 * state size N, B and C shared by the heads of each of G groups, D skip; gated RMSNorm with z
 * (gate before norm; over all I channels as transformers, or per group of I/G as FLA); out_proj. State: S [H][N][P] fp32 and the conv tail
 * [K-1][I + 2GN] fp32. A `statex` spec (our extension) may give listed layers another
 * state_size; an `attn` spec places softmax-attention layers (Mamba2 hybrids). The keys, tensors,
 * layout and hyla-mkmodel keys are the hyla_m2_* functions here, which dla.c's Mamba2 base
 * calls too. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "hyla_linattn.h"
#include "hyla_profile.h"

typedef hyla_m2_keys m2_cfg;
typedef hyla_m2_w m2_w;

enum { PART_S = 0, PART_CONV = 1 };

const hyla_layout hyla_m2_layout = {
    .embed = "backbone.embeddings.weight",
    .layer_norm = "backbone.layers.%d.norm.weight",
    .mixer = "backbone.layers.%d.mixer.",
    .mlp_norm = NULL,
    .mlp = NULL,
    .final_norm = "backbone.norm_f.weight",
    .lm_head = "lm_head.weight",
};

/* The family's own name for the norm epsilon (transformers' Mamba2Config). */
void hyla_m2_parse_model(hyla_cfg *r, json_t *root, hyla_model_config *mc) {
    mc->norm_eps = (float)hyla_cfg_num(r, root, "layer_norm_epsilon", mc->norm_eps);
}

void hyla_m2_parse_keys(hyla_cfg *r, json_t *obj, int D, hyla_m2_keys *c) {
    c->N = hyla_cfg_int(r, obj, "state_size", 128);
    c->G = hyla_cfg_int(r, obj, "n_groups", 8);
    c->P = hyla_cfg_int(r, obj, "head_dim", 64);
    c->K = hyla_cfg_int(r, obj, "conv_kernel", 4);
    double expand = hyla_cfg_num(r, obj, "expand", 2);
    c->I = (int)(expand * D);
    c->H = hyla_cfg_int(r, obj, "num_heads", c->P > 0 ? c->I / c->P : 0);
    hyla_cfg_positive(r, "state_size", c->N);
    hyla_cfg_positive(r, "n_groups", c->G);
    hyla_cfg_positive(r, "head_dim", c->P);
    hyla_cfg_positive(r, "conv_kernel", c->K);
    hyla_cfg_positive(r, "num_heads", c->H);
    if (r->st != HYLA_OK) return;
    if (fabs(expand * D - c->I) > 1e-6) hyla_cfg_fail(r, HYLA_ERR_FORMAT, "expand*hidden_size must be an integer");
    if (c->H * c->P != c->I)
        hyla_cfg_refuse(r, "num_heads", "num_heads*head_dim must equal expand*hidden_size (the inner width)");
    if (c->H % c->G) hyla_cfg_refuse(r, "n_groups", "num_heads must be a multiple of n_groups");
    if (c->K > 64) hyla_cfg_refuse(r, "conv_kernel", "kernels longer than 64 are not supported");
    c->use_conv_bias = hyla_cfg_bool(r, obj, "use_conv_bias", 1);
    c->use_bias = hyla_cfg_bool(r, obj, "use_bias", 0);
    c->dt_min = 0.0f;
    c->dt_max = INFINITY;
    json_t *lim = json_object_get(obj, "time_step_limit");
    if (lim && !json_is_null(lim)) {
        if (!json_is_array(lim) || json_array_size(lim) != 2) {
            hyla_cfg_fail(r, HYLA_ERR_FORMAT, "key 'time_step_limit' must be a list of two numbers");
        } else {
            /* [lo, hi]; a null (an infinity as Python writes it, hyla_cfg_load_json) is no limit */
            json_t *lo = json_array_get(lim, 0), *hi = json_array_get(lim, 1);
            if ((!json_is_number(lo) && !json_is_null(lo)) || (!json_is_number(hi) && !json_is_null(hi)))
                hyla_cfg_fail(r, HYLA_ERR_FORMAT, "key 'time_step_limit' must be a list of two numbers");
            if (json_is_number(lo)) c->dt_min = (float)json_number_value(lo);
            if (json_is_number(hi)) c->dt_max = (float)json_number_value(hi);
        }
    }
    if (!hyla_cfg_bool(r, obj, "rms_norm", 1)) hyla_cfg_refuse(r, "rms_norm", "only the gated RMSNorm is supported");
    if (hyla_cfg_bool(r, obj, "norm_before_gate", 0))
        hyla_cfg_refuse(r, "norm_before_gate", "only the gate before the norm (Mamba2's) is supported");
    /* Choice (docs/MODELS.md 4.6): transformers' MambaRMSNormGated normalises over all I
     * channels, flash-linear-attention's (and mamba_ssm's) per group of I/G; they differ when
     * G > 1. A config with FLA's `norm_before_gate` key is FLA's; `norm_grouped` (ours) says it
     * outright. */
    c->norm_groups = hyla_cfg_bool(r, obj, "norm_grouped", hyla_cfg_has(obj, "norm_before_gate")) ? c->G : 1;
    const char *act = hyla_cfg_str(r, obj, "hidden_act", "silu");
    if (strcmp(act, "silu") && strcmp(act, "swish")) hyla_cfg_refuse(r, "hidden_act", "only silu is supported");
    c->Cc = c->I + 2 * c->G * c->N;
    c->Din = c->I + c->Cc + c->H;
}

#define MW(field) (at + offsetof(hyla_m2_w, field))

/* Tensor parallelism: in_proj's rows are [z (I) | x (I) | B (GN) | C (GN) | dt (H)] and the
 * convolved channels [x | B | C], each block split by heads (B and C by groups) on its own. */
static void seg_zxbcdt(const hyla_m2_keys *c, int *seg) {
    int gn = c->G * c->N, v[5] = {c->I, c->I, gn, gn, c->H};
    for (int i = 0; i < 5; i++) seg[i] = v[i];
}

void hyla_m2_seg_xbc(const hyla_m2_keys *c, int *seg) {
    seg[0] = c->I;
    seg[1] = seg[2] = c->G * c->N;
}

const char *hyla_m2_tp_shard(hyla_m2_keys *c, int T, char *why, size_t n) {
    if (c->norm_groups % T) {
        snprintf(why, n, "the gated RMSNorm over all %d inner channels (norm_grouped false) cannot be split", c->I);
        return why;
    }
    int ng = c->norm_groups;
    const char *e = hyla_tp_divide(&c->H, "num_heads", T, why, n);
    if (!e) e = hyla_tp_divide(&c->G, "n_groups", T, why, n);
    if (e) return e;
    c->norm_groups = ng / T;
    c->I = c->H * c->P;
    c->Cc = c->I + 2 * c->G * c->N;
    c->Din = c->I + c->Cc + c->H;
    return NULL;
}

void hyla_m2_decls(hyla_decls *ds, const hyla_m2_keys *c, int D, size_t at) {
    seg_zxbcdt(c, hyla_decl_matrix(ds, "in_proj.weight", MW(in_proj), c->Din, D, 1.0f)->tp_seg);
    if (c->use_bias) seg_zxbcdt(c, hyla_decl_vector(ds, "in_proj.bias", MW(in_bias), c->Din, 0.0f, 0.1f)->tp_seg);
    hyla_m2_seg_xbc(c, hyla_decl(ds, "conv1d.weight", HYLA_TENSOR_VECTOR, MW(conv_w), 3, c->Cc, 1, c->K, HYLA_INIT_CONV, 0, 0)->tp_seg);
    if (c->use_conv_bias) hyla_m2_seg_xbc(c, hyla_decl_vector(ds, "conv1d.bias", MW(conv_b), c->Cc, 0.0f, 0.1f)->tp_seg);
    hyla_decl(ds, "dt_bias", HYLA_TENSOR_VECTOR, MW(dt_bias), 1, c->H, 0, 0, HYLA_INIT_DT_BIAS, 0, 0);
    hyla_decl(ds, "A_log", HYLA_TENSOR_VECTOR, MW(A_log), 1, c->H, 0, 0, HYLA_INIT_A_LOG, 0, 0);
    hyla_decl_vector(ds, "D", MW(Dskip), c->H, 1.0f, 0.5f);
    hyla_decl_vector(ds, "norm.weight", MW(norm), c->I, 1.0f, 0.1f);
    hyla_decl_matrix(ds, "out_proj.weight", MW(out_proj), D, c->I, 0.5f);
    if (c->use_bias) hyla_decl_vector(ds, "out_proj.bias", MW(out_bias), D, 0.0f, 0.1f);
}

#undef MW

static void parse(hyla_cfg *r, json_t *obj, const hyla_model_config *mc, void *cfgp) {
    hyla_m2_parse_keys(r, obj, mc->hidden_size, cfgp);
}

static int tensors(const hyla_model_config *mc, const void *cfgp, int layer, hyla_tensor_decl *out) {
    hyla_decls ds = hyla_decls_init(out, mc, layer);
    hyla_m2_decls(&ds, cfgp, mc->hidden_size, 0);
    return ds.n;
}

static int parts(const hyla_model_config *mc, const void *cfgp, hyla_dtype kv_dtype, hyla_part_spec *out) {
    (void)mc;
    (void)kv_dtype;
    const m2_cfg *c = cfgp;
    out[0] = (hyla_part_spec){"S", HYLA_PART_RECURRENT, HYLA_DT_F32, 3, {(uint64_t)c->H, (uint64_t)c->N, (uint64_t)c->P}, 0, {0}};
    out[1] = (hyla_part_spec){"conv_xbc", HYLA_PART_RECURRENT, HYLA_DT_F32, 2, {(uint64_t)c->K - 1, (uint64_t)c->Cc}, 0, {0}};
    hyla_m2_seg_xbc(c, out[1].tp_seg);
    return c->K > 1 ? 2 : 1;
}

typedef struct {
    float *zxd; /* [R][Din] the input projection: z, xBC, dt */
    float *xbc; /* [R][Cc] xBC, convolved in place */
    float *y;   /* [R][I] the scan's output, normed in place */
} m2_scratch;

static size_t layout(const m2_cfg *c, int R, void *base, m2_scratch *s) {
    hyla_carver cv = hyla_carver_init(base);
    s->zxd = hyla_carve_f32(&cv, (size_t)R * c->Din);
    s->xbc = hyla_carve_f32(&cv, (size_t)R * c->Cc);
    s->y = hyla_carve_f32(&cv, (size_t)R * c->I);
    return cv.off;
}

HYLA_MIXER_SCRATCH_BYTES(m2_scratch)

static hyla_status forward(const hyla_mixer_fwd *f) {
    const m2_cfg *c = f->cfg;
    const m2_w *w = f->w;
    const hyla_ops *o = f->o;
    void *ctx = f->ctx;
    int D = f->mc->hidden_size, R = f->R;
    m2_scratch s;
    layout(c, f->cap_rows, f->scratch, &s);
    HYLA_TRY(hyla_mixer_linear(f, f->xn, D, w->in_proj, w->in_bias, s.zxd, c->Din, 0));
    HYLA_MIXER_MARK(f, "lin: in proj");
    HYLA_TRY(o->copy2d(ctx, s.xbc, c->Cc, s.zxd + c->I, c->Din, R, c->Cc));
    if (f->decode) {
        void *const *tails = c->K > 1 ? hyla_mixer_gather(f, 0, PART_CONV) : NULL;
        HYLA_TRY(o->short_conv(ctx, s.xbc, R, 1, c->Cc, w->conv_w, w->conv_b, c->K, (float *const *)tails, 1));
    } else {
        float *tail = c->K > 1 ? f->st[0]->part[PART_CONV].dev : NULL;
        HYLA_TRY(o->short_conv(ctx, s.xbc, 1, R, c->Cc, w->conv_w, w->conv_b, c->K, &tail, 1));
    }
    HYLA_MIXER_MARK(f, "mamba2: conv");
    const float *dt = s.zxd + c->I + c->Cc;
    /* [M2-1, M2-2] */
    if (f->decode) {
        void *const *S = hyla_mixer_gather(f, 1, PART_S);
        HYLA_TRY(o->ssd_decode(ctx, s.xbc, c->Cc, dt, c->Din, w->dt_bias, w->A_log, w->Dskip, c->dt_min, c->dt_max, R,
                               c->H, c->P, c->G, c->N, (float *const *)S, s.y));
    } else {
        HYLA_TRY(o->ssd_prefill(ctx, s.xbc, c->Cc, dt, c->Din, w->dt_bias, w->A_log, w->Dskip, c->dt_min, c->dt_max, R,
                                c->H, c->P, c->G, c->N, f->st[0]->part[PART_S].dev, s.y));
    }
    HYLA_MIXER_MARK(f, "mamba2: core");
    /* [M2-3] gated norm with z (the projection's first I columns), then out_proj */
    HYLA_TRY(o->ssd_norm(ctx, s.y, s.zxd, c->Din, w->norm, s.y, R, c->norm_groups, c->I / c->norm_groups,
                         f->mc->norm_eps));
    HYLA_MIXER_MARK(f, "lin: out norm");
    HYLA_TRY(hyla_mixer_linear(f, s.y, c->I, w->out_proj, w->out_bias, f->out, D, f->out_acc));
    HYLA_MIXER_MARK(f, "lin: out proj");
    return HYLA_OK;
}

/* hyla-mkmodel: inner width 2*hidden in `heads` heads, 2 groups when the heads divide evenly;
 * state size 128 (the Mamba2 release's; StateX expands listed layers to 512); FLA's keys, so
 * the gated norm is grouped. */
const char *hyla_m2_mk_config(json_t *obj, const hyla_mk_args *a) {
    if ((2 * a->hidden) % a->heads) return "mamba2: 2*hidden must be divisible by --heads";
    json_object_set_new(obj, "state_size", json_integer(128));
    json_object_set_new(obj, "expand", json_integer(2));
    json_object_set_new(obj, "head_dim", json_integer(2 * a->hidden / a->heads));
    json_object_set_new(obj, "n_groups", json_integer(a->heads % 2 == 0 ? 2 : 1));
    json_object_set_new(obj, "conv_kernel", json_integer(4));
    json_object_set_new(obj, "use_conv_bias", json_true());
    json_object_set_new(obj, "use_bias", json_false());
    json_object_set_new(obj, "layer_norm_epsilon", json_real(1e-5));
    json_object_set_new(obj, "hidden_act", json_string("silu"));
    json_t *lim = json_array();
    json_array_append_new(lim, json_real(0.0));
    json_array_append_new(lim, json_null());
    json_object_set_new(obj, "time_step_limit", lim);
    json_object_set_new(obj, "residual_in_fp32", json_true());
    json_object_set_new(obj, "norm_before_gate", json_false()); /* FLA's key: the grouped norm */
    return NULL;
}

static const char *tp_shard(void *cfgp, int T, char *why, size_t n) { return hyla_m2_tp_shard(cfgp, T, why, n); }

const hyla_mixer hyla_mixer_mamba2 = {
    .name = "mamba2",
    .model_type = "mamba2",
    .layout = &hyla_m2_layout,
    .parse_model = hyla_m2_parse_model,
    HYLA_MIXER_HOOKS(m2_cfg, m2_w),
    .mk_config = hyla_m2_mk_config,
    .tp_shard = tp_shard,
};
