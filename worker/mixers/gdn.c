/* gdn.c — Gated DeltaNet layers (model_type "gated_deltanet"; docs/MODELS.md §4.2, [GDN-1..3]).
 *
 * Keys and tensors as flash-linear-attention's GatedDeltaNet layer names them (parsed and declared
 * by the hyla_gdn_* functions here, which dla.c's GDN base calls too). State: S
 * [H][dk][dv] fp32 and, with use_short_conv (the default), the conv tails. Forward: q, k, v in one
 * projection call, a, b and the output gate in a second, short conv (silu inside; plain silu
 * without the conv), l2-normalised q and k, the gates g = -exp(A_log) softplus(a + dt_bias) and
 * beta = sigmoid(b), the chunked (prefill) or recurrent (decode) delta rule, gated RMSNorm per
 * head, o_proj. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>

#include "hyla_linattn.h"
#include "hyla_profile.h"

typedef hyla_gdn_keys gdn_cfg;
typedef hyla_gdn_w gdn_w;

enum { PART_S = 0, PART_CONV = 1 };

void hyla_gdn_parse_keys(hyla_cfg *r, json_t *obj, hyla_gdn_keys *c) {
    c->H = hyla_cfg_int(r, obj, "num_heads", 6);
    hyla_cfg_positive(r, "num_heads", c->H);
    if (r->st != HYLA_OK) return;
    c->use_short_conv = hyla_cfg_bool(r, obj, "use_short_conv", 1);
    c->conv_size = hyla_cfg_int(r, obj, "conv_size", 4);
    c->allow_neg_eigval = hyla_cfg_bool(r, obj, "allow_neg_eigval", 0);
    c->dk = hyla_cfg_int(r, obj, "head_dim", 256);
    double ev = hyla_cfg_num(r, obj, "expand_v", 2.0);
    c->dv = (int)(c->dk * ev);
    hyla_cfg_positive(r, "head_dim", c->dk);
    if (r->st == HYLA_OK && fabs(c->dk * ev - c->dv) > 1e-6)
        hyla_cfg_fail(r, HYLA_ERR_FORMAT, "head_dim*expand_v must be an integer");
    if (hyla_cfg_int(r, obj, "num_v_heads", c->H) != c->H)
        hyla_cfg_refuse(r, "num_v_heads", "num_v_heads != num_heads is not supported");
    c->use_gate = hyla_cfg_bool(r, obj, "use_gate", 1);
    if (c->use_short_conv) hyla_cfg_positive(r, "conv_size", c->conv_size);
    hyla_lin_common_keys(r, obj);
}

#define GW(field) (at + offsetof(hyla_gdn_w, field))

void hyla_gdn_decls(hyla_decls *ds, const hyla_gdn_keys *c, int D, size_t at) {
    int H = c->H, dk = c->dk, dv = c->dv;
    hyla_decl_matrix(ds, "q_proj.weight", GW(q), H * dk, D, 1.0f);
    hyla_decl_matrix(ds, "k_proj.weight", GW(k), H * dk, D, 1.0f);
    hyla_decl_matrix(ds, "v_proj.weight", GW(v), H * dv, D, 1.0f);
    if (c->use_short_conv) {
        const size_t off[3] = {GW(conv_w[0]), GW(conv_w[1]), GW(conv_w[2])};
        hyla_lin_conv_decls(ds, off, H * dk, H * dv, c->conv_size);
    }
    hyla_decl_matrix(ds, "a_proj.weight", GW(a_proj), H, D, 1.0f);
    hyla_decl_matrix(ds, "b_proj.weight", GW(b_proj), H, D, 1.0f);
    hyla_decl(ds, "A_log", HYLA_TENSOR_VECTOR, GW(A_log), 1, H, 0, 0, HYLA_INIT_A_LOG, 0, 0);
    hyla_decl(ds, "dt_bias", HYLA_TENSOR_VECTOR, GW(dt_bias), 1, H, 0, 0, HYLA_INIT_DT_BIAS, 0, 0);
    if (c->use_gate) hyla_decl_matrix(ds, "g_proj.weight", GW(g_proj), H * dv, D, 1.0f);
    hyla_decl_vector(ds, "o_norm.weight", GW(o_norm), dv, 1.0f, 0.1f);
    hyla_decl_matrix(ds, "o_proj.weight", GW(o), D, H * dv, 0.5f);
}

#undef GW

static void parse(hyla_cfg *r, json_t *obj, const hyla_model_config *mc, void *cfgp) {
    (void)mc;
    hyla_gdn_parse_keys(r, obj, cfgp);
}

static int tensors(const hyla_model_config *mc, const void *cfgp, int layer, hyla_tensor_decl *out) {
    hyla_decls ds = hyla_decls_init(out, mc, layer);
    hyla_gdn_decls(&ds, cfgp, mc->hidden_size, 0);
    return ds.n;
}

static int parts(const hyla_model_config *mc, const void *cfgp, hyla_dtype kv_dtype, hyla_part_spec *out) {
    (void)mc;
    (void)kv_dtype;
    const gdn_cfg *c = cfgp;
    return hyla_lin_parts(out, c->H, c->dk, c->dv, c->use_short_conv ? c->conv_size : 0);
}

typedef struct {
    float *q, *k, *v; /* [R][H*dk], [R][H*dk], [R][H*dv]; k follows q's R rows (one L2-norm call) */
    float *g, *beta;  /* [R][H]: a and b from the projection, then the gates in place */
    float *o;         /* [R][H*dv] */
    float *gate;      /* [R][H*dv] output gate */
} gdn_scratch;

/* R: the rows the scratch is sized for. q and k share one block of 2R rows; forward puts k right
 * after the call's own rows of q, so their L2 norms are one call. */
static size_t layout(const gdn_cfg *c, int R, void *base, gdn_scratch *s) {
    hyla_carver cv = hyla_carver_init(base);
    size_t qk = (size_t)R * c->H * c->dk, vo = (size_t)R * c->H * c->dv;
    s->q = hyla_carve_f32(&cv, 2 * qk);
    s->k = s->q + qk;
    s->v = hyla_carve_f32(&cv, vo);
    s->g = hyla_carve_f32(&cv, (size_t)R * c->H);
    s->beta = hyla_carve_f32(&cv, (size_t)R * c->H);
    s->o = hyla_carve_f32(&cv, vo);
    s->gate = hyla_carve_f32(&cv, vo);
    return cv.off;
}

HYLA_MIXER_SCRATCH_BYTES(gdn_scratch)

static hyla_status forward(const hyla_mixer_fwd *f) {
    const gdn_cfg *c = f->cfg;
    const gdn_w *w = f->w;
    const hyla_ops *o = f->o;
    void *ctx = f->ctx;
    int D = f->mc->hidden_size, H = c->H, dk = c->dk, dv = c->dv, R = f->R;
    float scale = 1.0f / sqrtf((float)dk);
    gdn_scratch s;
    layout(c, f->cap_rows, f->scratch, &s);
    s.k = s.q + (size_t)R * H * dk; /* within q's and k's block: k right after this call's q rows */
    /* Prompt rows on a backend with bf16 rows (f->xn_bf16): q, k and v leave their GEMMs as bf16
     * into o's block (free until the core writes it; (2 dk + dv) * 2 <= 4 dv bytes a head when
     * dv >= 2 dk, as expand_v 2 has it) and the convolution reads them from there, writing fp32
     * q, k, v (hyla_conv_part.src): half the bytes written and read, no copy of the window
     * between segments. Otherwise fp32 in place. */
    const int qkv16 = !f->decode && f->xn_bf16 && c->use_short_conv && dv >= 2 * dk;
    uint16_t *qb = (uint16_t *)s.o, *kb = qb + (size_t)R * H * dk, *vb = kb + (size_t)R * H * dk;
    /* The output gate as bf16 too where the out norm reads it so (hyla_lin_gate_bf16). The
     * projections of xn go out as two calls, the bf16 outputs' and the fp32 ones' (one launch for
     * a decode batch, which has only the second; the CUDA prompt GEMMs group by N either way). */
    const int g16 = w->g_proj && hyla_lin_gate_bf16(f, dv);
    hyla_linear_out lb[HYLA_LINEAR_MULTI_MAX], lf[HYLA_LINEAR_MULTI_MAX];
    int nb = 0, nf = 0;
    hyla_linear_out *const lq = qkv16 ? lb : lf;
    int *const nq = qkv16 ? &nb : &nf;
    lq[(*nq)++] = (hyla_linear_out){w->q, NULL, qkv16 ? (float *)qb : s.q, H * dk, H * dk, NULL, 0};
    lq[(*nq)++] = (hyla_linear_out){w->k, NULL, qkv16 ? (float *)kb : s.k, H * dk, H * dk, NULL, 0};
    lq[(*nq)++] = (hyla_linear_out){w->v, NULL, qkv16 ? (float *)vb : s.v, H * dv, H * dv, NULL, 0};
    lf[nf++] = (hyla_linear_out){w->a_proj, NULL, s.g, H, H, NULL, 0};
    lf[nf++] = (hyla_linear_out){w->b_proj, NULL, s.beta, H, H, NULL, 0};
    if (w->g_proj) *(g16 ? &lb[nb++] : &lf[nf++]) = (hyla_linear_out){w->g_proj, NULL, s.gate, H * dv, H * dv, NULL, 0};
    if (nb) HYLA_TRY(hyla_mixer_linear_multi_bf16(f, f->xn, D, nb, lb));
    HYLA_TRY(hyla_mixer_linear_multi(f, f->xn, D, nf, lf));
    HYLA_MIXER_MARK(f, "lin: q/k/v, gates proj");
    /* the L2 norms of q and k in the convolution's op (the same bits, one pass over them fewer),
     * except where the fused decode takes them */
    const int raw = f->decode && o->gdn_decode_raw, l2 = c->use_short_conv && !raw ? dk : 0;
    if (c->use_short_conv) {
        const void *src[3] = {qb, kb, vb};
        HYLA_TRY(hyla_lin_short_conv(f, s.q, s.k, s.v, H * dk, H * dv, w->conv_w, c->conv_size, PART_CONV, l2,
                                     qkv16 ? src : NULL));
    } else {
        HYLA_TRY(o->silu(ctx, s.q, (size_t)R * H * dk));
        HYLA_TRY(o->silu(ctx, s.k, (size_t)R * H * dk));
        HYLA_TRY(o->silu(ctx, s.v, (size_t)R * H * dv));
    }
    /* [GDN-1..3] */
    if (raw) { /* norms, gates and the recurrence in one op (the same bits) */
        HYLA_MIXER_MARK(f, "gdn: conv");
        void *const *S = hyla_mixer_gather(f, 0, PART_S);
        HYLA_TRY(o->gdn_decode_raw(ctx, s.q, s.k, s.v, s.g, s.beta, w->A_log, w->dt_bias, c->allow_neg_eigval, 1e-6f, R,
                                   H, dk, dv, scale, (float *const *)S, s.o));
        HYLA_MIXER_MARK(f, "gdn: norms, gates, core");
        return hyla_lin_norm_out(f, s.o, w->g_proj ? s.gate : NULL, w->o_norm, w->o, H, dv, 0);
    }
    if (!l2) HYLA_TRY(o->l2norm_rows(ctx, s.q, 2 * R * H, dk, 1e-6f)); /* q's rows, then k's */
    HYLA_TRY(o->gdn_gates(ctx, s.g, H, s.beta, H, w->A_log, w->dt_bias, s.g, s.beta, R, H, c->allow_neg_eigval));
    HYLA_MIXER_MARK(f, "gdn: conv, norms, gates");
    if (f->decode) {
        void *const *S = hyla_mixer_gather(f, 0, PART_S);
        HYLA_TRY(o->gdn_decode(ctx, s.q, s.k, s.v, s.g, s.beta, R, H, dk, dv, scale, (float *const *)S, s.o));
    } else {
        HYLA_TRY(o->gdn_prefill(ctx, s.q, s.k, s.v, s.g, s.beta, R, H, dk, dv, scale, f->st[0]->part[PART_S].dev, s.o));
    }
    HYLA_MIXER_MARK(f, "gdn: core");
    return hyla_lin_norm_out(f, s.o, w->g_proj ? s.gate : NULL, w->o_norm, w->o, H, dv, g16);
}

const char *hyla_gdn_mk_config(json_t *obj, const hyla_mk_args *a) {
    int dk = a->head_dim > 0 ? a->head_dim : a->hidden / a->heads;
    json_object_set_new(obj, "head_dim", json_integer(dk));
    json_object_set_new(obj, "expand_v", json_real(2.0));
    json_object_set_new(obj, "use_gate", json_true());
    json_object_set_new(obj, "use_short_conv", json_boolean(a->short_conv != 0));
    json_object_set_new(obj, "conv_size", json_integer(4));
    return NULL;
}

static const char *tp_shard(void *cfgp, int T, char *why, size_t n) {
    return hyla_tp_divide(&((gdn_cfg *)cfgp)->H, "num_heads", T, why, n);
}

const hyla_mixer hyla_mixer_gdn = {
    .name = "gdn",
    .model_type = "gated_deltanet",
    HYLA_MIXER_HOOKS(gdn_cfg, gdn_w),
    .mk_config = hyla_gdn_mk_config,
    .tp_shard = tp_shard,
};
