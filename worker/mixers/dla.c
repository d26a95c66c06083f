/* dla.c — dynamic linear attention layers over a pluggable base (docs/MODELS.md §4.7, [DLA-1..5];
 * dla-dynamic-linear-attention.txt): model_type "dla_gated_deltanet" (kind dla-gdn) and
 * "dla_mamba2" (kind dla-mamba2).
 *
 * The DLA part is base-independent: the keys dla_capacity (K) and dla_threshold (tau), the
 * lambda projection l_proj (H*K logits per token, softplus in the op), the four `dla` state parts
 * (states, counts, scores, states in use) and the dla_prefill / dla_decode ops. A base (struct
 * dla_base) supplies the rest: its keys, its tensors, its own state parts (conv tails), its
 * scratch, the projection from the normed input to q, k, v and the per-token transition scalars
 * (log decay g, erase e, write w: every state S_i <- exp(g)(S_i - e k k^T S_i), the token's state
 * w k v^T), and the output stage. Gated DeltaNet (e = w = beta; gdn.c's keys and tensors) and
 * Mamba2 (e = 0, w = dt, k = B, v = x, q = C, then its D skip and gated norm; mamba2.c's keys,
 * tensors and `backbone.*` layout) are the two bases, each with its mixer table.
 *
 * Threading: as every mixer (hyla_mixer.h). */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include "hyla_linattn.h"
#include "hyla_profile.h"

#define DLA_DEFAULT_CAPACITY 30  /* the paper's K */
#define DLA_DEFAULT_THRESHOLD 0.6 /* the paper's tau */

struct dla_base;

typedef struct {
    const struct dla_base *base;
    int H, dk, dv; /* heads, key and value dims of one state */
    int K;         /* dla_capacity */
    float tau;     /* dla_threshold */
    float scale;   /* the base's query scale (GDN: dk^-1/2; Mamba2: 1) */
    union {
        hyla_gdn_keys gdn;
        hyla_m2_keys m2;
    } b;
} dla_cfg;

typedef struct {
    hyla_weight *l_proj; /* [H*K][D] lambda logits, newest state first */
    float *l_bias;       /* [H*K] */
    union {
        hyla_gdn_w gdn;
        hyla_m2_w m2;
    } b;
} dla_w;

/* The DLA parts come first; a base's parts follow from PART_BASE. */
enum { PART_S = 0, PART_N, PART_I, PART_M, PART_BASE };

typedef struct {
    float *q, *k, *v;           /* [R][H*dk], [R][H*dk], [R][H*dv] */
    float *g, *erase, *write;   /* [R][H] the base's transition scalars (erase: for a base whose
                                 * erase differs from its write; GDN's does not) */
    float *lam;                 /* [R][H*K] */
    float *o;                   /* [R][H*dv] */
    float *gate;                /* [R][H*dv] GDN's output gate */
    float *zxd, *xbc;           /* [R][Din], [R][Cc] Mamba2's input projection and convolved xBC */
} dla_scratch;

/* A base model under the DLA cache. */
typedef struct dla_base {
    /* the base's keys into c (H, dk, dv, scale and c->b) */
    void (*parse)(hyla_cfg *r, json_t *obj, const hyla_model_config *mc, dla_cfg *c);
    /* the base's tensors, appended to ds (offsets relative to dla_w) */
    void (*tensors)(const hyla_model_config *mc, const dla_cfg *c, hyla_decls *ds);
    /* the base's parts, appended at out[*n] */
    void (*parts)(const dla_cfg *c, hyla_part_spec *out, int *n);
    /* the base's own scratch buffers, carved after the common ones */
    void (*scratch)(const dla_cfg *c, int R, hyla_carver *cv, dla_scratch *s);
    /* xn -> s->q, k, v, g, write; *erase: the erase scalars [R][H] (s->erase, s->write when they
     * equal the write scalars, or NULL for a base that does not erase) */
    hyla_status (*project)(const hyla_mixer_fwd *f, const dla_cfg *c, const dla_w *w, dla_scratch *s,
                           const float **erase);
    /* s->o (the DLA read) -> f->out */
    hyla_status (*finish)(const hyla_mixer_fwd *f, const dla_cfg *c, const dla_w *w, dla_scratch *s);
    /* hyla-mkmodel's keys of the base */
    const char *(*mk_config)(json_t *obj, const hyla_mk_args *a);
} dla_base;

/* ------------------------------------------------------------------ the gated-DeltaNet base */

static void gdn_parse(hyla_cfg *r, json_t *obj, const hyla_model_config *mc, dla_cfg *c) {
    (void)mc;
    hyla_gdn_parse_keys(r, obj, &c->b.gdn);
    c->H = c->b.gdn.H;
    c->dk = c->b.gdn.dk;
    c->dv = c->b.gdn.dv;
    if (c->dk > 0) c->scale = 1.0f / sqrtf((float)c->dk);
}

static void gdn_tensors(const hyla_model_config *mc, const dla_cfg *c, hyla_decls *ds) {
    hyla_gdn_decls(ds, &c->b.gdn, mc->hidden_size, offsetof(dla_w, b.gdn));
}

static void gdn_parts(const dla_cfg *c, hyla_part_spec *out, int *n) {
    if (c->b.gdn.use_short_conv) hyla_lin_conv_parts(out, n, c->H * c->dk, c->H * c->dv, c->b.gdn.conv_size);
}

static void gdn_scratch(const dla_cfg *c, int R, hyla_carver *cv, dla_scratch *s) {
    s->gate = hyla_carve_f32(cv, (size_t)R * c->H * c->dv);
}

/* [GDN-1..2] as gdn.c: projections, short conv, l2-normalised q and k, gates; e = w = beta */
static hyla_status gdn_project(const hyla_mixer_fwd *f, const dla_cfg *c, const dla_w *wp, dla_scratch *s,
                               const float **erase) {
    const hyla_gdn_w *w = &wp->b.gdn;
    const hyla_ops *o = f->o;
    void *ctx = f->ctx;
    int D = f->mc->hidden_size, H = c->H, dk = c->dk, dv = c->dv, R = f->R;
    hyla_linear_out lo[HYLA_LINEAR_MULTI_MAX] = {
        {w->q, NULL, s->q, H * dk, H * dk, NULL, 0},
        {w->k, NULL, s->k, H * dk, H * dk, NULL, 0},
        {w->v, NULL, s->v, H * dv, H * dv, NULL, 0},
    };
    /* with a, b and the output gate: one call, each output the bits of its own linear */
    int n = 3;
    lo[n++] = (hyla_linear_out){w->a_proj, NULL, s->g, H, H, NULL, 0};
    lo[n++] = (hyla_linear_out){w->b_proj, NULL, s->write, H, H, NULL, 0};
    if (w->g_proj) lo[n++] = (hyla_linear_out){w->g_proj, NULL, s->gate, H * dv, H * dv, NULL, 0};
    HYLA_TRY(hyla_mixer_linear_multi(f, f->xn, D, n, lo));
    HYLA_MIXER_MARK(f, "lin: q/k/v, gate proj");
    if (c->b.gdn.use_short_conv) { /* with q's and k's L2 norms (the same bits as l2norm_rows after it) */
        HYLA_TRY(hyla_lin_short_conv(f, s->q, s->k, s->v, H * dk, H * dv, w->conv_w, c->b.gdn.conv_size, PART_BASE,
                                     dk, NULL));
    } else {
        HYLA_TRY(o->silu(ctx, s->q, (size_t)R * H * dk));
        HYLA_TRY(o->silu(ctx, s->k, (size_t)R * H * dk));
        HYLA_TRY(o->silu(ctx, s->v, (size_t)R * H * dv));
        HYLA_TRY(o->l2norm_rows(ctx, s->q, R * H, dk, 1e-6f));
        HYLA_TRY(o->l2norm_rows(ctx, s->k, R * H, dk, 1e-6f));
    }
    HYLA_TRY(o->gdn_gates(ctx, s->g, H, s->write, H, w->A_log, w->dt_bias, s->g, s->write, R, H,
                          c->b.gdn.allow_neg_eigval));
    HYLA_MIXER_MARK(f, "gdn: conv, norms, gates");
    *erase = s->write;
    return HYLA_OK;
}

static hyla_status gdn_finish(const hyla_mixer_fwd *f, const dla_cfg *c, const dla_w *wp, dla_scratch *s) {
    const hyla_gdn_w *w = &wp->b.gdn;
    /* [NORM-1] per head, then o_proj */
    return hyla_lin_norm_out(f, s->o, w->g_proj ? s->gate : NULL, w->o_norm, w->o, c->H, c->dv, 0);
}

static const dla_base dla_base_gdn = {gdn_parse,   gdn_tensors, gdn_parts,         gdn_scratch,
                                     gdn_project, gdn_finish,  hyla_gdn_mk_config};

/* ------------------------------------------------------------------ the Mamba2 base */

/* Mamba2's keys; a state is [N][P] (dk = N, dv = P, mamba2.c's [H][N][P] layout), scale 1. */
static void m2_parse(hyla_cfg *r, json_t *obj, const hyla_model_config *mc, dla_cfg *c) {
    hyla_m2_parse_keys(r, obj, mc->hidden_size, &c->b.m2);
    c->H = c->b.m2.H;
    c->dk = c->b.m2.N;
    c->dv = c->b.m2.P;
    c->scale = 1.0f;
}

static void m2_tensors(const hyla_model_config *mc, const dla_cfg *c, hyla_decls *ds) {
    hyla_m2_decls(ds, &c->b.m2, mc->hidden_size, offsetof(dla_w, b.m2));
}

static void m2_parts(const dla_cfg *c, hyla_part_spec *out, int *n) {
    const hyla_m2_keys *m = &c->b.m2;
    if (m->K > 1)
    {
        out[*n] = (hyla_part_spec){"conv_xbc", HYLA_PART_RECURRENT, HYLA_DT_F32, 2, {(uint64_t)m->K - 1, (uint64_t)m->Cc}, 0, {0}};
        hyla_m2_seg_xbc(m, out[(*n)++].tp_seg);
    }
}

static void m2_scratch(const dla_cfg *c, int R, hyla_carver *cv, dla_scratch *s) {
    s->zxd = hyla_carve_f32(cv, (size_t)R * c->b.m2.Din);
    s->xbc = hyla_carve_f32(cv, (size_t)R * c->b.m2.Cc);
}

/* [M2-1] as mamba2.c up to the scan: in_proj -> [z | xBC | dt], conv + silu on xBC; then per head
 * q = C and k = B of the head's group, v = x, g = a, w = dt'; no erase. */
static hyla_status m2_project(const hyla_mixer_fwd *f, const dla_cfg *c, const dla_w *wp, dla_scratch *s,
                              const float **erase) {
    const hyla_m2_keys *m = &c->b.m2;
    const hyla_m2_w *w = &wp->b.m2;
    const hyla_ops *o = f->o;
    void *ctx = f->ctx;
    int R = f->R, H = m->H, N = m->N, I = m->I, GN = m->G * m->N;
    HYLA_TRY(hyla_mixer_linear(f, f->xn, f->mc->hidden_size, w->in_proj, w->in_bias, s->zxd, m->Din, 0));
    HYLA_MIXER_MARK(f, "lin: in proj");
    HYLA_TRY(o->copy2d(ctx, s->xbc, m->Cc, s->zxd + I, m->Din, R, m->Cc));
    if (f->decode) {
        void *const *tails = m->K > 1 ? hyla_mixer_gather(f, 0, PART_BASE) : NULL;
        HYLA_TRY(o->short_conv(ctx, s->xbc, R, 1, m->Cc, w->conv_w, w->conv_b, m->K, (float *const *)tails, 1));
    } else {
        float *tail = m->K > 1 ? f->st[0]->part[PART_BASE].dev : NULL;
        HYLA_TRY(o->short_conv(ctx, s->xbc, 1, R, m->Cc, w->conv_w, w->conv_b, m->K, &tail, 1));
    }
    HYLA_TRY(o->copy2d(ctx, s->v, I, s->xbc, m->Cc, R, I));
    for (int h = 0; h < H; h++) {
        int g = h / (H / m->G);
        HYLA_TRY(o->copy2d(ctx, s->k + (size_t)h * N, H * N, s->xbc + I + (size_t)g * N, m->Cc, R, N));
        HYLA_TRY(o->copy2d(ctx, s->q + (size_t)h * N, H * N, s->xbc + I + GN + (size_t)g * N, m->Cc, R, N));
    }
    HYLA_TRY(o->ssd_gates(ctx, s->zxd + I + m->Cc, m->Din, w->dt_bias, w->A_log, m->dt_min, m->dt_max, R, H, s->g,
                          s->write));
    HYLA_MIXER_MARK(f, "mamba2: conv, gates");
    *erase = NULL;
    return HYLA_OK;
}

/* [M2-2]'s D skip, [M2-3] gated norm with z, out_proj */
static hyla_status m2_finish(const hyla_mixer_fwd *f, const dla_cfg *c, const dla_w *wp, dla_scratch *s) {
    const hyla_m2_keys *m = &c->b.m2;
    const hyla_m2_w *w = &wp->b.m2;
    HYLA_TRY(f->o->ssd_skip(f->ctx, s->o, s->xbc, m->Cc, w->Dskip, f->R, m->H, m->P));
    HYLA_TRY(f->o->ssd_norm(f->ctx, s->o, s->zxd, m->Din, w->norm, s->o, f->R, m->norm_groups, m->I / m->norm_groups,
                            f->mc->norm_eps));
    HYLA_TRY(hyla_mixer_linear(f, s->o, m->I, w->out_proj, w->out_bias, f->out, f->mc->hidden_size, f->out_acc));
    HYLA_MIXER_MARK(f, "lin: out norm, out proj");
    return HYLA_OK;
}

static const dla_base dla_base_m2 = {m2_parse,   m2_tensors, m2_parts,         m2_scratch,
                                    m2_project, m2_finish,  hyla_m2_mk_config};

/* ------------------------------------------------------------------ the DLA part */

static void parse_common(hyla_cfg *r, json_t *obj, const hyla_model_config *mc, dla_cfg *c) {
    c->base->parse(r, obj, mc, c);
    if (r->st != HYLA_OK) return;
    c->K = hyla_cfg_int(r, obj, "dla_capacity", DLA_DEFAULT_CAPACITY);
    if (r->st == HYLA_OK && c->K < 2) hyla_cfg_fail(r, HYLA_ERR_FORMAT, "key 'dla_capacity': %d, want >= 2", c->K);
    double tau = hyla_cfg_num(r, obj, "dla_threshold", DLA_DEFAULT_THRESHOLD);
    if (r->st == HYLA_OK && !(tau >= 0 && isfinite(tau)))
        hyla_cfg_fail(r, HYLA_ERR_FORMAT, "key 'dla_threshold': %g, want a finite value >= 0", tau);
    c->tau = (float)tau;
}

static void parse_gdn(hyla_cfg *r, json_t *obj, const hyla_model_config *mc, void *cfgp) {
    dla_cfg *c = cfgp;
    c->base = &dla_base_gdn;
    parse_common(r, obj, mc, c);
}

static void parse_m2(hyla_cfg *r, json_t *obj, const hyla_model_config *mc, void *cfgp) {
    dla_cfg *c = cfgp;
    c->base = &dla_base_m2;
    parse_common(r, obj, mc, c);
}

static int tensors(const hyla_model_config *mc, const void *cfgp, int layer, hyla_tensor_decl *out) {
    const dla_cfg *c = cfgp;
    hyla_decls ds = hyla_decls_init(out, mc, layer);
    c->base->tensors(mc, c, &ds);
    /* [DLA-5] lambda logits; the bias starts at softplus^-1(1) so a fresh layer reads the states
     * with weights near 1 (near the plain base model) */
    hyla_decl_matrix(&ds, "l_proj.weight", offsetof(dla_w, l_proj), c->H * c->K, mc->hidden_size, 0.3f);
    hyla_decl_vector(&ds, "l_proj.bias", offsetof(dla_w, l_bias), c->H * c->K, 0.5413f, 0.5f);
    return ds.n;
}

static int parts(const hyla_model_config *mc, const void *cfgp, hyla_dtype kv_dtype, hyla_part_spec *out) {
    (void)mc;
    (void)kv_dtype;
    const dla_cfg *c = cfgp;
    uint64_t H = (uint64_t)c->H, K = (uint64_t)c->K;
    out[PART_S] = (hyla_part_spec){"S", HYLA_PART_DLA, HYLA_DT_F32, 4, {H, K, (uint64_t)c->dk, (uint64_t)c->dv}, 0, {0}};
    out[PART_N] = (hyla_part_spec){"n", HYLA_PART_DLA, HYLA_DT_I32, 2, {H, K}, 0, {0}};
    out[PART_I] = (hyla_part_spec){"I", HYLA_PART_DLA, HYLA_DT_F32, 2, {H, K}, 0, {0}};
    out[PART_M] = (hyla_part_spec){"m", HYLA_PART_DLA, HYLA_DT_I32, 1, {H}, 0, {0}};
    int n = PART_BASE;
    c->base->parts(c, out, &n);
    return n;
}

static size_t layout(const dla_cfg *c, int R, void *base, dla_scratch *s) {
    hyla_carver cv = hyla_carver_init(base);
    size_t qk = (size_t)R * c->H * c->dk, vo = (size_t)R * c->H * c->dv, rh = (size_t)R * c->H;
    s->q = hyla_carve_f32(&cv, qk);
    s->k = hyla_carve_f32(&cv, qk);
    s->v = hyla_carve_f32(&cv, vo);
    s->g = hyla_carve_f32(&cv, rh);
    s->erase = hyla_carve_f32(&cv, rh);
    s->write = hyla_carve_f32(&cv, rh);
    s->lam = hyla_carve_f32(&cv, rh * (size_t)c->K);
    s->o = hyla_carve_f32(&cv, vo);
    c->base->scratch(c, R, &cv, s);
    return cv.off;
}

HYLA_MIXER_SCRATCH_BYTES(dla_scratch)

static hyla_dla_cache cache_of(hyla_layer_state *ls) {
    return (hyla_dla_cache){ls->part[PART_S].dev, ls->part[PART_N].dev, ls->part[PART_I].dev, ls->part[PART_M].dev};
}

static hyla_status forward(const hyla_mixer_fwd *f) {
    const dla_cfg *c = f->cfg;
    const dla_w *w = f->w;
    const hyla_ops *o = f->o;
    if (!o->dla_prefill || !o->dla_decode || (c->base == &dla_base_m2 && (!o->ssd_gates || !o->ssd_skip)))
        return hyla_fail(HYLA_ERR_UNSUPPORTED, "the %s backend lacks the ops of %s layers", o->name,
                         c->base == &dla_base_m2 ? "dla-mamba2" : "dla-gdn");
    int R = f->R;
    dla_scratch s;
    layout(c, f->cap_rows, f->scratch, &s);
    const float *e = NULL;
    HYLA_TRY(c->base->project(f, c, w, &s, &e));
    HYLA_TRY(hyla_mixer_linear(f, f->xn, f->mc->hidden_size, w->l_proj, w->l_bias, s.lam, c->H * c->K, 0));
    HYLA_MIXER_MARK(f, "dla: lambda proj");
    hyla_dla_params p = {c->H, c->dk, c->dv, c->K, c->tau};
    float scale = c->scale;
    int nc = f->decode ? R : 1;
    hyla_dla_cache *cs = calloc((size_t)nc, sizeof *cs);
    if (!cs) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    for (int i = 0; i < nc; i++) cs[i] = cache_of(f->st[i]);
    hyla_status st = f->decode ? o->dla_decode(f->ctx, &p, s.q, s.k, s.v, s.g, e, s.write, s.lam, R, scale, cs, s.o)
                               : o->dla_prefill(f->ctx, &p, s.q, s.k, s.v, s.g, e, s.write, s.lam, R, scale, cs, s.o);
    free(cs);
    HYLA_TRY(st);
    HYLA_MIXER_MARK(f, "dla: cache, core");
    return c->base->finish(f, c, w, &s);
}

static const char *mk_config_common(json_t *obj, const hyla_mk_args *a, const dla_base *b) {
    const char *why = b->mk_config(obj, a);
    if (why) return why;
    json_object_set_new(obj, "dla_capacity", json_integer(a->dla_capacity > 0 ? a->dla_capacity : DLA_DEFAULT_CAPACITY));
    json_object_set_new(obj, "dla_threshold", json_real(a->dla_threshold >= 0 ? a->dla_threshold : DLA_DEFAULT_THRESHOLD));
    return NULL;
}

static const char *mk_config_gdn(json_t *obj, const hyla_mk_args *a) { return mk_config_common(obj, a, &dla_base_gdn); }
static const char *mk_config_m2(json_t *obj, const hyla_mk_args *a) { return mk_config_common(obj, a, &dla_base_m2); }

/* Tensor parallelism: the cache is per head, like the base's state; the base splits its keys. */
static const char *tp_shard_gdn(void *cfgp, int T, char *why, size_t n) {
    dla_cfg *c = cfgp;
    const char *e = hyla_tp_divide(&c->b.gdn.H, "num_heads", T, why, n);
    if (!e) c->H = c->b.gdn.H;
    return e;
}

static const char *tp_shard_m2(void *cfgp, int T, char *why, size_t n) {
    dla_cfg *c = cfgp;
    const char *e = hyla_m2_tp_shard(&c->b.m2, T, why, n);
    if (!e) c->H = c->b.m2.H;
    return e;
}

const hyla_mixer hyla_mixer_dla_gdn = {
    .name = "dla-gdn",
    .model_type = "dla_gated_deltanet",
    .spec_key = NULL,
    .layout = NULL,
    .parse_model = NULL,
    .cfg_size = sizeof(dla_cfg),
    .w_size = sizeof(dla_w),
    .parse = parse_gdn,
    .tensors = tensors,
    .parts = parts,
    .scratch_bytes = scratch_bytes,
    .forward = forward,
    .mk_config = mk_config_gdn,
    .tp_shard = tp_shard_gdn,
};

const hyla_mixer hyla_mixer_dla_mamba2 = {
    .name = "dla-mamba2",
    .model_type = "dla_mamba2",
    .spec_key = NULL,
    .layout = &hyla_m2_layout,
    .parse_model = hyla_m2_parse_model,
    .cfg_size = sizeof(dla_cfg),
    .w_size = sizeof(dla_w),
    .parse = parse_m2,
    .tensors = tensors,
    .parts = parts,
    .scratch_bytes = scratch_bytes,
    .forward = forward,
    .mk_config = mk_config_m2,
    .tp_shard = tp_shard_m2,
};
