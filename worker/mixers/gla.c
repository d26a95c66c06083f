/* gla.c — Gated Linear Attention layers (model_type "gla"; docs/MODELS.md §4.1, [GLA-1]).
 *
 * Keys and tensors as flash-linear-attention's GLA layer names them; both namings of the output
 * norm load (`g_norm_swish_gate` with fuse_norm, `g_norm` without). State: S [H][dk][dv] fp32 and,
 * with use_short_conv, the conv tails. Forward: q, k, v (and the gate's low-rank input) in one
 * projection call, the output gate in a second, short conv, gk = logsigmoid(.)/normalizer, the
 * chunked (prefill) or recurrent (decode) GLA op, gated RMSNorm per head, o_proj. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>

#include "hyla_linattn.h"
#include "hyla_profile.h"

typedef struct {
    int H, dk, dv;
    int use_short_conv, conv_size, use_output_gate, gate_low_rank_dim;
    float gate_logit_normalizer, clamp_min; /* clamp_min = -INFINITY when absent */
} gla_cfg;

typedef struct {
    hyla_weight *q, *k, *v, *o;   /* [H*dk][D], [H*dk][D], [H*dv][D], [D][H*dv] */
    hyla_weight *gk_a, *gk_b;     /* gk_proj.0 [r][D], gk_proj.1 [H*dk][r] */
    float *gk_bias;               /* [H*dk] */
    hyla_weight *g_proj;          /* [H*dv][D] (use_output_gate) */
    float *o_norm;                /* [dv] */
    float *conv_w[3];             /* [C][K] q, k, v */
} gla_w;

enum { PART_S = 0, PART_CONV = 1 };

static void parse(hyla_cfg *r, json_t *obj, const hyla_model_config *mc, void *cfgp) {
    gla_cfg *c = cfgp;
    c->H = hyla_cfg_int(r, obj, "num_heads", 4);
    hyla_cfg_positive(r, "num_heads", c->H);
    if (r->st != HYLA_OK) return;
    c->use_short_conv = hyla_cfg_bool(r, obj, "use_short_conv", 0);
    c->conv_size = hyla_cfg_int(r, obj, "conv_size", 4);
    c->gate_logit_normalizer = (float)hyla_cfg_num(r, obj, "gate_logit_normalizer", 16);
    c->gate_low_rank_dim = hyla_cfg_int(r, obj, "gate_low_rank_dim", 16);
    double ek = hyla_cfg_num(r, obj, "expand_k", 0.5), ev = hyla_cfg_num(r, obj, "expand_v", 1.0);
    int D = mc->hidden_size, kd = (int)(D * ek), vd = (int)(D * ev);
    if (kd % c->H || vd % c->H) {
        hyla_cfg_fail(r, HYLA_ERR_FORMAT,
                      "hidden_size*expand_k (%d) and hidden_size*expand_v (%d) must be divisible by num_heads (%d)", kd,
                      vd, c->H);
        return;
    }
    c->dk = kd / c->H;
    c->dv = vd / c->H;
    c->use_output_gate = hyla_cfg_bool(r, obj, "use_output_gate", 1);
    c->clamp_min = hyla_cfg_has(obj, "clamp_min") ? (float)hyla_cfg_num(r, obj, "clamp_min", 0) : -INFINITY;
    if (hyla_cfg_has(obj, "feature_map")) hyla_cfg_refuse(r, "feature_map", "only null (no feature map) is supported");
    if (hyla_cfg_bool(r, obj, "use_gv", 0)) hyla_cfg_refuse(r, "use_gv", "must be false");
    if (!hyla_cfg_bool(r, obj, "use_gk", 1)) hyla_cfg_refuse(r, "use_gk", "must be true");
    if (hyla_cfg_int(r, obj, "num_kv_heads", c->H) != c->H)
        hyla_cfg_refuse(r, "num_kv_heads", "GLA with num_kv_heads != num_heads is not supported");
    if (!hyla_cfg_bool(r, obj, "elementwise_affine", 1)) hyla_cfg_refuse(r, "elementwise_affine", "must be true");
    if (c->use_short_conv) hyla_cfg_positive(r, "conv_size", c->conv_size);
    hyla_lin_common_keys(r, obj);
}

static int tensors(const hyla_model_config *mc, const void *cfgp, int layer, hyla_tensor_decl *out) {
    const gla_cfg *c = cfgp;
    int D = mc->hidden_size, H = c->H, dk = c->dk, dv = c->dv, r = c->gate_low_rank_dim;
    hyla_decls ds = hyla_decls_init(out, mc, layer);
    hyla_decl_matrix(&ds, "q_proj.weight", offsetof(gla_w, q), H * dk, D, 1.0f);
    hyla_decl_matrix(&ds, "k_proj.weight", offsetof(gla_w, k), H * dk, D, 1.0f);
    hyla_decl_matrix(&ds, "v_proj.weight", offsetof(gla_w, v), H * dv, D, 1.0f);
    if (c->use_short_conv) {
        const size_t off[3] = {offsetof(gla_w, conv_w[0]), offsetof(gla_w, conv_w[1]), offsetof(gla_w, conv_w[2])};
        hyla_lin_conv_decls(&ds, off, H * dk, H * dv, c->conv_size);
    }
    hyla_decl_matrix(&ds, "gk_proj.0.weight", offsetof(gla_w, gk_a), r, D, 1.0f);
    hyla_decl_matrix(&ds, "gk_proj.1.weight", offsetof(gla_w, gk_b), H * dk, r, 1.0f);
    /* bias ~ +2: sigmoid ~ 0.88 -> per-token log-decay ~ -0.13/16: slow decay, long memory */
    hyla_decl_vector(&ds, "gk_proj.1.bias", offsetof(gla_w, gk_bias), H * dk, 2.0f, 1.0f);
    if (c->use_output_gate) {
        hyla_decl_matrix(&ds, "g_proj.weight", offsetof(gla_w, g_proj), H * dv, D, 1.0f);
        /* fuse_norm=True names the norm after the fused swish gate; fuse_norm=False plain g_norm */
        hyla_tensor_decl *n = hyla_decl_vector(&ds, "g_norm_swish_gate.weight", offsetof(gla_w, o_norm), dv, 1.0f, 0.1f);
        hyla_decl_alt(&ds, n, "g_norm.weight");
    } else {
        hyla_decl_vector(&ds, "g_norm.weight", offsetof(gla_w, o_norm), dv, 1.0f, 0.1f);
    }
    hyla_decl_matrix(&ds, "o_proj.weight", offsetof(gla_w, o), D, H * dv, 0.5f);
    return ds.n;
}

static int parts(const hyla_model_config *mc, const void *cfgp, hyla_dtype kv_dtype, hyla_part_spec *out) {
    (void)mc;
    (void)kv_dtype;
    const gla_cfg *c = cfgp;
    return hyla_lin_parts(out, c->H, c->dk, c->dv, c->use_short_conv ? c->conv_size : 0);
}

typedef struct {
    float *q, *k, *v; /* [R][H*dk], [R][H*dk], [R][H*dv] */
    float *gk;        /* [R][H*dk] log-decay */
    float *gk_lr;     /* [R][r] the gate's low-rank input */
    float *o;         /* [R][H*dv] */
    float *gate;      /* [R][H*dv] output gate */
} gla_scratch;

static size_t layout(const gla_cfg *c, int R, void *base, gla_scratch *s) {
    hyla_carver cv = hyla_carver_init(base);
    size_t qk = (size_t)R * c->H * c->dk, vo = (size_t)R * c->H * c->dv;
    s->q = hyla_carve_f32(&cv, qk);
    s->k = hyla_carve_f32(&cv, qk);
    s->v = hyla_carve_f32(&cv, vo);
    s->gk = hyla_carve_f32(&cv, qk);
    s->gk_lr = hyla_carve_f32(&cv, (size_t)R * c->gate_low_rank_dim);
    s->o = hyla_carve_f32(&cv, vo);
    s->gate = hyla_carve_f32(&cv, vo);
    return cv.off;
}

HYLA_MIXER_SCRATCH_BYTES(gla_scratch)

static hyla_status forward(const hyla_mixer_fwd *f) {
    const gla_cfg *c = f->cfg;
    const gla_w *w = f->w;
    const hyla_ops *o = f->o;
    void *ctx = f->ctx;
    int D = f->mc->hidden_size, H = c->H, dk = c->dk, dv = c->dv, R = f->R, r = c->gate_low_rank_dim;
    float scale = 1.0f / sqrtf((float)dk);
    gla_scratch s;
    layout(c, f->cap_rows, f->scratch, &s);
    hyla_linear_out lo[HYLA_LINEAR_MULTI_MAX] = {
        {w->q, NULL, s.q, H * dk, H * dk, NULL, 0},
        {w->k, NULL, s.k, H * dk, H * dk, NULL, 0},
        {w->v, NULL, s.v, H * dv, H * dv, NULL, 0},
        {w->gk_a, NULL, s.gk_lr, r, r, NULL, 0},
    };
    /* the output gate with them, unless it goes as bf16 rows for the out norm (prompt rows):
     * one call, each output the bits of its own linear */
    const int g16 = hyla_lin_gate_bf16(f, dv);
    const hyla_linear_out g = {w->g_proj, NULL, s.gate, H * dv, H * dv, NULL, 0};
    int n = 4;
    if (w->g_proj && !g16) lo[n++] = g;
    HYLA_TRY(hyla_mixer_linear_multi(f, f->xn, D, n, lo));
    HYLA_MIXER_MARK(f, "lin: q/k/v proj");
    if (w->g_proj && g16) HYLA_TRY(hyla_mixer_linear_multi_bf16(f, f->xn, D, 1, &g));
    HYLA_MIXER_MARK(f, "lin: gate proj");
    if (c->use_short_conv)
        HYLA_TRY(hyla_lin_short_conv(f, s.q, s.k, s.v, H * dk, H * dv, w->conv_w, c->conv_size, PART_CONV, 0, NULL));
    /* gk [R][H*dk] via the low-rank pair [GLA-1] */
    HYLA_TRY(hyla_mixer_linear(f, s.gk_lr, r, w->gk_b, w->gk_bias, s.gk, H * dk, 0));
    HYLA_TRY(o->gla_gate(ctx, s.gk, (size_t)R * H * dk, c->gate_logit_normalizer, c->clamp_min));
    HYLA_MIXER_MARK(f, "gla: conv, gates");
    if (f->decode) {
        void *const *S = hyla_mixer_gather(f, 0, PART_S);
        HYLA_TRY(o->gla_decode(ctx, s.q, s.k, s.v, s.gk, R, H, dk, dv, scale, (float *const *)S, s.o));
    } else {
        HYLA_TRY(o->gla_prefill(ctx, s.q, s.k, s.v, s.gk, R, H, dk, dv, scale, f->st[0]->part[PART_S].dev, s.o));
    }
    HYLA_MIXER_MARK(f, "gla: core");
    return hyla_lin_norm_out(f, s.o, w->g_proj ? s.gate : NULL, w->o_norm, w->o, H, dv, g16);
}

static const char *mk_config(json_t *obj, const hyla_mk_args *a) {
    if ((a->hidden / 2) % a->heads) return "gla needs hidden/2 divisible by heads";
    json_object_set_new(obj, "expand_k", json_real(0.5));
    json_object_set_new(obj, "expand_v", json_real(1.0));
    json_object_set_new(obj, "use_output_gate", json_true());
    json_object_set_new(obj, "gate_low_rank_dim", json_integer(16));
    json_object_set_new(obj, "gate_logit_normalizer", json_integer(16));
    json_object_set_new(obj, "use_short_conv", json_boolean(a->short_conv > 0));
    json_object_set_new(obj, "conv_size", json_integer(4));
    return NULL;
}

static const char *tp_shard(void *cfgp, int T, char *why, size_t n) {
    return hyla_tp_divide(&((gla_cfg *)cfgp)->H, "num_heads", T, why, n);
}

const hyla_mixer hyla_mixer_gla = {
    .name = "gla",
    .model_type = "gla",
    HYLA_MIXER_HOOKS(gla_cfg, gla_w),
    .tp_shard = tp_shard,
    .mk_config = mk_config,
};
