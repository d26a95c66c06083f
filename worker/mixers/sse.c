/* sse.c — Sparse State Expansion layers (model_type "sse", our documented extension;
 * docs/MODELS.md §4.3, [SSE-1..4]; sse-sparse-state-expansion.txt eqs. 7-10).
 *
 * Each head has an always-selected state S0 and N partition states Sp, of which each token
 * routes to the top K (softmax over e_proj logits); the transition of every state is GLA's
 * (per-key gates from two low-rank gate projections) or GDN's (per-head g and beta, two sets).
 * State: S0 [H][dk][dv] and Sp [N][H][dk][dv], fp32. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "hyla_linattn.h"
#include "hyla_profile.h"

typedef struct {
    int H, dk, dv;
    int N, K;                  /* partitions, selected per token */
    hyla_sse_transition tr;
    int lora_rank, lora_on_sparse, q_softmax, k_softmax;
    int use_output_gate, gate_low_rank_dim, allow_neg_eigval;
    float gate_logit_normalizer, clamp_min;
    int window;                /* prefill_window: a partition's prefill chunks end at its multiples */
} sse_cfg;

typedef struct {
    hyla_weight *q, *k, *v, *o;       /* [H*dk][D], [H*dk][D], [H*dv][D], [D][H*dv] */
    hyla_weight *lora_q_a, *lora_q_b; /* [rank][D], [H*dk][rank] */
    hyla_weight *lora_k_a, *lora_k_b;
    hyla_weight *e_proj;              /* [N][D] */
    hyla_weight *gk_a[2], *gk_b[2];   /* GLA transition: gk_proj.j.0 [r][D], gk_proj.j.1 [H*dk][r] */
    float *gk_bias[2];                /* [H*dk] */
    hyla_weight *a_proj, *b_proj;     /* GDN transition: [2H][D] */
    float *A_log, *dt_bias;           /* [2H] */
    hyla_weight *g_proj, *g_proj2;    /* g_proj.0 [dv][D], g_proj.1 [H*dv][dv] (use_output_gate) */
    float *o_norm;                    /* [dv] */
} sse_w;

enum { PART_S0 = 0, PART_SP = 1 };

static void parse(hyla_cfg *r, json_t *obj, const hyla_model_config *mc, void *cfgp) {
    (void)mc;
    sse_cfg *c = cfgp;
    c->H = hyla_cfg_int(r, obj, "num_heads", 6);
    hyla_cfg_positive(r, "num_heads", c->H);
    if (r->st != HYLA_OK) return;
    c->gate_logit_normalizer = (float)hyla_cfg_num(r, obj, "gate_logit_normalizer", 16);
    c->gate_low_rank_dim = hyla_cfg_int(r, obj, "gate_low_rank_dim", 16);
    c->allow_neg_eigval = hyla_cfg_bool(r, obj, "allow_neg_eigval", 0);
    c->clamp_min = -INFINITY;
    c->dk = hyla_cfg_int(r, obj, "head_dim", 64);
    double ev = hyla_cfg_num(r, obj, "expand_v", 1.0);
    c->dv = (int)(c->dk * ev);
    hyla_cfg_positive(r, "head_dim", c->dk);
    if (r->st == HYLA_OK && fabs(c->dk * ev - c->dv) > 1e-6)
        hyla_cfg_fail(r, HYLA_ERR_FORMAT, "head_dim*expand_v must be an integer");
    if (hyla_cfg_int(r, obj, "num_v_heads", c->H) != c->H)
        hyla_cfg_refuse(r, "num_v_heads", "num_v_heads != num_heads is not supported");
    c->use_output_gate = hyla_cfg_bool(r, obj, "use_output_gate", 1);
    c->N = hyla_cfg_int(r, obj, "num_sparse_partition", 4);
    c->K = hyla_cfg_int(r, obj, "num_writer", 1);
    int reader = hyla_cfg_int(r, obj, "num_reader", c->K);
    hyla_cfg_positive(r, "num_sparse_partition", c->N);
    hyla_cfg_positive(r, "num_writer", c->K);
    if (reader != c->K) hyla_cfg_refuse(r, "num_reader", "must equal num_writer");
    if (r->st == HYLA_OK && c->K > c->N)
        hyla_cfg_fail(r, HYLA_ERR_FORMAT, "num_writer (%d) exceeds num_sparse_partition (%d)", c->K, c->N);
    const char *tr = hyla_cfg_str(r, obj, "sse_transition", "gla");
    if (!strcmp(tr, "gla")) c->tr = HYLA_SSE_GLA;
    else if (!strcmp(tr, "gdn")) c->tr = HYLA_SSE_GDN;
    else hyla_cfg_refuse(r, "sse_transition", "must be \"gla\" or \"gdn\"");
    c->lora_rank = hyla_cfg_int(r, obj, "lora_rank", c->dv);
    hyla_cfg_positive(r, "lora_rank", c->lora_rank);
    const char *lt = hyla_cfg_str(r, obj, "lora_target", "always");
    if (!strcmp(lt, "always")) c->lora_on_sparse = 0;
    else if (!strcmp(lt, "sparse")) c->lora_on_sparse = 1;
    else hyla_cfg_refuse(r, "lora_target", "must be \"always\" or \"sparse\"");
    c->q_softmax = hyla_cfg_bool(r, obj, "use_q_softmax", 0);
    c->k_softmax = hyla_cfg_bool(r, obj, "use_k_softmax", 1);
    if (hyla_cfg_bool(r, obj, "use_short_conv", 0)) hyla_cfg_refuse(r, "use_short_conv", "SSE layers have no short convolution");
    /* our extension (MODELS.md §4.3 "Prefill"): the windows of absolute positions at which a
     * partition's prefill chunks are cut (and every 64 of its tokens within one); the model's
     * prompts are then cut into forward passes at its multiples */
    c->window = hyla_cfg_int(r, obj, "prefill_window", HYLA_SSE_PREFILL_WINDOW);
    if (r->st == HYLA_OK && (c->window < HYLA_PREFILL_CHUNK || c->window > HYLA_PREFILL_PIECE_MAX ||
                             (c->window & (c->window - 1))))
        hyla_cfg_refuse(r, "prefill_window", "must be a power of two from 64 to 32768");
    hyla_lin_common_keys(r, obj);
}

static int prefill_align(const void *cfgp) { return ((const sse_cfg *)cfgp)->window; }

static int tensors(const hyla_model_config *mc, const void *cfgp, int layer, hyla_tensor_decl *out) {
    const sse_cfg *c = cfgp;
    int D = mc->hidden_size, H = c->H, dk = c->dk, dv = c->dv, rank = c->lora_rank, r = c->gate_low_rank_dim;
    hyla_decls ds = hyla_decls_init(out, mc, layer);
    hyla_decl_matrix(&ds, "q_proj.weight", offsetof(sse_w, q), H * dk, D, 1.0f);
    hyla_decl_matrix(&ds, "k_proj.weight", offsetof(sse_w, k), H * dk, D, 1.0f);
    hyla_decl_matrix(&ds, "v_proj.weight", offsetof(sse_w, v), H * dv, D, 1.0f);
    hyla_decl_matrix(&ds, "lora_q_proj.0.weight", offsetof(sse_w, lora_q_a), rank, D, 1.0f);
    hyla_decl_matrix(&ds, "lora_q_proj.1.weight", offsetof(sse_w, lora_q_b), H * dk, rank, 0.3f);
    hyla_decl_matrix(&ds, "lora_k_proj.0.weight", offsetof(sse_w, lora_k_a), rank, D, 1.0f);
    hyla_decl_matrix(&ds, "lora_k_proj.1.weight", offsetof(sse_w, lora_k_b), H * dk, rank, 0.3f);
    hyla_decl_matrix(&ds, "e_proj.weight", offsetof(sse_w, e_proj), c->N, D, 2.0f);
    if (c->tr == HYLA_SSE_GDN) {
        /* [2H]: the always-selected state's H, then the sparse partitions' H (split each) */
        hyla_tensor_decl *two[4] = {
            hyla_decl_matrix(&ds, "a_proj.weight", offsetof(sse_w, a_proj), 2 * H, D, 1.0f),
            hyla_decl_matrix(&ds, "b_proj.weight", offsetof(sse_w, b_proj), 2 * H, D, 1.0f),
            hyla_decl(&ds, "A_log", HYLA_TENSOR_VECTOR, offsetof(sse_w, A_log), 1, 2 * H, 0, 0, HYLA_INIT_A_LOG, 0, 0),
            hyla_decl(&ds, "dt_bias", HYLA_TENSOR_VECTOR, offsetof(sse_w, dt_bias), 1, 2 * H, 0, 0, HYLA_INIT_DT_BIAS, 0,
                      0)};
        for (int j = 0; j < 4; j++) two[j]->tp_seg[0] = two[j]->tp_seg[1] = H;
    } else {
        static const char *nm[2][3] = {{"gk_proj.0.0.weight", "gk_proj.0.1.weight", "gk_proj.0.1.bias"},
                                       {"gk_proj.1.0.weight", "gk_proj.1.1.weight", "gk_proj.1.1.bias"}};
        for (int j = 0; j < 2; j++) {
            hyla_decl_matrix(&ds, nm[j][0], offsetof(sse_w, gk_a) + (size_t)j * sizeof(hyla_weight *), r, D, 1.0f);
            hyla_decl_matrix(&ds, nm[j][1], offsetof(sse_w, gk_b) + (size_t)j * sizeof(hyla_weight *), H * dk, r, 1.0f);
            /* bias ~ +2: slow decay (as GLA's) */
            hyla_decl_vector(&ds, nm[j][2], offsetof(sse_w, gk_bias) + (size_t)j * sizeof(float *), H * dk, 2.0f, 1.0f);
        }
    }
    if (c->use_output_gate) {
        hyla_decl_matrix(&ds, "g_proj.0.weight", offsetof(sse_w, g_proj), dv, D, 1.0f);
        hyla_decl_matrix(&ds, "g_proj.1.weight", offsetof(sse_w, g_proj2), H * dv, dv, 1.0f);
    }
    hyla_decl_vector(&ds, "o_norm.weight", offsetof(sse_w, o_norm), dv, 1.0f, 0.1f);
    hyla_decl_matrix(&ds, "o_proj.weight", offsetof(sse_w, o), D, H * dv, 0.5f);
    return ds.n;
}

static int parts(const hyla_model_config *mc, const void *cfgp, hyla_dtype kv_dtype, hyla_part_spec *out) {
    (void)mc;
    (void)kv_dtype;
    const sse_cfg *c = cfgp;
    uint64_t H = (uint64_t)c->H, dk = (uint64_t)c->dk, dv = (uint64_t)c->dv;
    out[0] = (hyla_part_spec){"S0", HYLA_PART_RECURRENT, HYLA_DT_F32, 3, {H, dk, dv}, 0, {0}};
    out[1] = (hyla_part_spec){"Sp", HYLA_PART_PARTITION, HYLA_DT_F32, 4, {(uint64_t)c->N, H, dk, dv}, 0, {0}};
    return 2;
}

typedef struct {
    float *qa, *ka;       /* [R][H*dk] the always-selected partition's q, k */
    float *qs, *ks;       /* [R][H*dk] the sparse partitions' q, k */
    float *v;             /* [R][H*dv] */
    float *lora_q;        /* [R][rank] */
    float *lora_k;        /* [R][rank] */
    float *elog;          /* [R][N] the routing logits */
    float *ga, *gb;       /* GLA: [R][H*dk] gk of the always-selected / sparse states; GDN: a, b [R][2H] */
    float *g1lr, *g2lr;   /* GLA: the two gates' low-rank inputs [R][r] */
    float *gdn[4];        /* GDN: g, beta (always-selected), g, beta (sparse) [R][H] */
    float *o;             /* [R][H*dv] */
    float *gate;          /* [R][H*dv] output gate; gate_lr [R][dv] before it */
    float *gate_lr;
    int32_t *idx;         /* [R][K] routing */
    float *rw;            /* [R][K] routing weights */
} sse_scratch;

static size_t layout(const sse_cfg *c, int R, void *base, sse_scratch *s) {
    hyla_carver cv = hyla_carver_init(base);
    size_t qk = (size_t)R * c->H * c->dk, vo = (size_t)R * c->H * c->dv;
    size_t lr = (size_t)R * (size_t)c->lora_rank;
    size_t gw = c->tr == HYLA_SSE_GDN ? (size_t)R * 2 * c->H : qk;
    /* each set's q and k in one block, k at the carver's next aligned place (as if carved on its
     * own): forward packs them for its rows where it can (sse_pack) */
    const size_t al = HYLA_SCRATCH_ALIGN / sizeof(float), qk_al = (qk + al - 1) / al * al;
    s->qa = hyla_carve_f32(&cv, qk_al + qk);
    s->ka = s->qa + qk_al;
    s->qs = hyla_carve_f32(&cv, qk_al + qk);
    s->ks = s->qs + qk_al;
    s->v = hyla_carve_f32(&cv, vo);
    s->lora_q = hyla_carve_f32(&cv, lr);
    s->lora_k = hyla_carve_f32(&cv, lr);
    s->elog = hyla_carve_f32(&cv, (size_t)R * c->N);
    s->ga = hyla_carve_f32(&cv, gw);
    s->gb = hyla_carve_f32(&cv, gw);
    s->g1lr = hyla_carve_f32(&cv, (size_t)R * c->gate_low_rank_dim);
    s->g2lr = hyla_carve_f32(&cv, (size_t)R * c->gate_low_rank_dim);
    for (int j = 0; j < 4; j++) s->gdn[j] = hyla_carve_f32(&cv, (size_t)R * c->H);
    s->o = hyla_carve_f32(&cv, vo);
    s->gate = hyla_carve_f32(&cv, vo);
    s->gate_lr = hyla_carve_f32(&cv, (size_t)R * c->dv);
    s->idx = hyla_carve(&cv, (size_t)R * c->K * sizeof(int32_t));
    s->rw = hyla_carve_f32(&cv, (size_t)R * c->K);
    return cv.off;
}

HYLA_MIXER_SCRATCH_BYTES(sse_scratch)

/* Each set's q and k side by side for a forward of R rows (k right after q's R rows), so that
 * where the mixer copies (a backend without sse_maps) the sparse set is one copy of the
 * always-selected one; only where k then keeps the carver's alignment (every buffer's, which
 * the backends' fast paths want). */
static void sse_pack(const sse_cfg *c, int R, sse_scratch *s) {
    size_t qk = (size_t)R * c->H * c->dk;
    if (qk * sizeof(float) % HYLA_SCRATCH_ALIGN) return;
    s->ka = s->qa + qk;
    s->ks = s->qs + qk;
}

static hyla_status forward(const hyla_mixer_fwd *f) {
    const sse_cfg *c = f->cfg;
    const sse_w *w = f->w;
    const hyla_ops *o = f->o;
    void *ctx = f->ctx;
    int D = f->mc->hidden_size, H = c->H, dk = c->dk, dv = c->dv, R = f->R;
    int N = c->N, K = c->K, rank = c->lora_rank, gdn = c->tr == HYLA_SSE_GDN;
    size_t qk = (size_t)R * H * dk;
    float scale = 1.0f / sqrtf((float)dk);
    sse_scratch s;
    layout(c, f->cap_rows, f->scratch, &s);
    sse_pack(c, R, &s);
    /* every projection of xn: q, k, the LoRA inputs, the output gate's low-rank input, v, the
     * routing logits [R][N] and the gates' inputs, each output the bits of its own linear. Up to
     * 16 rows in one call (one launch: SSE-H steps 1-5 % shorter at 1-16 rows on an H200); from
     * 17 rows as two calls, q/k and then, after the LoRA terms, the rest (one grouped launch of
     * all ten was 3 % longer at 64 rows, level at 256; BENCHMARKS.md "SSE's projections in one
     * call") */
    /* Where the backend has sse_maps, the LoRA terms do not add onto a copy of q and k: the
     * projections write q and k to the set without the terms (rq, rk), the terms go to the other
     * set's buffers (tq, tk), and sse_maps forms that set as q + term (the accumulate's one fp32
     * add, so the same bits) before the maps: no copy, and no read of y by the terms' epilogue.
     * Otherwise q and k go to the always-selected set and are copied to the sparse one. */
    const int lora_in_maps = o->sse_maps != NULL;
    float *rq = s.qa, *rk = s.ka, *tq = s.qs, *tk = s.ks;
    if (lora_in_maps && !c->lora_on_sparse) rq = s.qs, rk = s.ks, tq = s.qa, tk = s.ka;
    hyla_linear_out lo[HYLA_LINEAR_MULTI_MAX];
    int n = 0;
    lo[n++] = (hyla_linear_out){w->q, NULL, rq, H * dk, H * dk, NULL, 0};
    lo[n++] = (hyla_linear_out){w->k, NULL, rk, H * dk, H * dk, NULL, 0};
    lo[n++] = (hyla_linear_out){w->lora_q_a, NULL, s.lora_q, rank, rank, NULL, 0};
    lo[n++] = (hyla_linear_out){w->lora_k_a, NULL, s.lora_k, rank, rank, NULL, 0};
    if (w->g_proj) lo[n++] = (hyla_linear_out){w->g_proj, NULL, s.gate_lr, dv, dv, NULL, 0};
    lo[n++] = (hyla_linear_out){w->v, NULL, s.v, H * dv, H * dv, NULL, 0};
    lo[n++] = (hyla_linear_out){w->e_proj, NULL, s.elog, N, N, NULL, 0};
    if (!gdn) {
        int r = c->gate_low_rank_dim;
        lo[n++] = (hyla_linear_out){w->gk_a[0], NULL, s.g1lr, r, r, NULL, 0};
        lo[n++] = (hyla_linear_out){w->gk_a[1], NULL, s.g2lr, r, r, NULL, 0};
    } else {
        lo[n++] = (hyla_linear_out){w->a_proj, NULL, s.ga, 2 * H, 2 * H, NULL, 0};
        lo[n++] = (hyla_linear_out){w->b_proj, NULL, s.gb, 2 * H, 2 * H, NULL, 0};
    }
    const int n1 = R <= 16 ? n : w->g_proj ? 5 : 4;
    HYLA_TRY(hyla_mixer_linear_multi(f, f->xn, D, n1, lo));
    HYLA_MIXER_MARK(f, "sse: projections");
    if (!lora_in_maps) {
        if (s.ka == s.qa + qk && s.ks == s.qs + qk) { /* qs, ks = qa, ka */
            HYLA_TRY(o->copy(ctx, s.qs, s.qa, 2 * qk * sizeof(float)));
        } else {
            HYLA_TRY(o->copy(ctx, s.qs, s.qa, qk * sizeof(float)));
            HYLA_TRY(o->copy(ctx, s.ks, s.ka, qk * sizeof(float)));
        }
        tq = c->lora_on_sparse ? s.qs : s.qa, tk = c->lora_on_sparse ? s.ks : s.ka;
    }
    /* the LoRA terms (added onto q and k, or written for sse_maps to add); the output gate's
     * second half (its input is ready, and of the same width as theirs by default: rank = dv)
     * writes the gate in the same launch */
    const int gate2 = w->g_proj && rank == dv, acc = !lora_in_maps;
    const hyla_linear_out lora[3] = {{w->lora_q_b, NULL, tq, H * dk, H * dk, s.lora_q, acc},
                                     {w->lora_k_b, NULL, tk, H * dk, H * dk, s.lora_k, acc},
                                     {w->g_proj2, NULL, s.gate, H * dv, H * dv, s.gate_lr, 0}};
    HYLA_TRY(hyla_mixer_linear_each(f, rank, gate2 ? 3 : 2, lora, 0));
    HYLA_MIXER_MARK(f, gate2 ? "sse: copies, lora, out gate" : "sse: copies, lora");
    if (n1 < n) { /* here, as before the grouping: issued ahead of the copies and the LoRA
                   * terms, the 64-row step was 2.4 % longer */
        HYLA_TRY(hyla_mixer_linear_multi(f, f->xn, D, n - n1, lo + n1));
        HYLA_MIXER_MARK(f, "sse: v/e/gate proj");
    }
    float *elog = s.elog;
    /* GLA's gate logits from their low-rank inputs; where the backend has sse_maps their biases
     * go there, added in its pass over the gates (the same fp32 add, one pass over them fewer) */
    float *g[2] = {s.ga, s.gb};
    const int bias_in_maps = o->sse_maps != NULL && !gdn;
    if (!gdn) {
        const hyla_linear_out gk[2] = {
            {w->gk_b[0], bias_in_maps ? NULL : w->gk_bias[0], g[0], H * dk, H * dk, s.g1lr, 0},
            {w->gk_b[1], bias_in_maps ? NULL : w->gk_bias[1], g[1], H * dk, H * dk, s.g2lr, 0}};
        HYLA_TRY(hyla_mixer_linear_each(f, c->gate_low_rank_dim, 2, gk, 0));
    }
    /* silu(v), the feature maps of eq. 8 (GDN: choice (b), normalised before the gate weight) and
     * GLA's gates: one launch where the backend has it */
    if (o->sse_maps) { /* lora_in_maps: tq, tk = rq + term, rk + term, then the maps */
        HYLA_TRY(o->sse_maps(ctx, s.v, (size_t)R * H * dv, rq, tq, rk, tk, R * H, dk, c->q_softmax, c->k_softmax, gdn,
                             1e-6f, gdn ? NULL : s.ga, gdn ? NULL : s.gb, gdn ? 0 : qk, bias_in_maps ? w->gk_bias[0] : NULL,
                             bias_in_maps ? w->gk_bias[1] : NULL, H * dk, c->gate_logit_normalizer, c->clamp_min, 1));
    } else {
        HYLA_TRY(o->silu(ctx, s.v, (size_t)R * H * dv));
        float *fm[2][2] = {{s.qa, s.ka}, {s.qs, s.ks}};
        for (int j = 0; j < 2; j++) {
            if (c->q_softmax) HYLA_TRY(o->softmax_rows(ctx, fm[j][0], R * H, dk));
            else HYLA_TRY(o->silu(ctx, fm[j][0], qk));
            if (c->k_softmax) HYLA_TRY(o->softmax_rows(ctx, fm[j][1], R * H, dk));
            else HYLA_TRY(o->silu(ctx, fm[j][1], qk));
            if (gdn) {
                HYLA_TRY(o->l2norm_rows(ctx, fm[j][0], R * H, dk, 1e-6f));
                HYLA_TRY(o->l2norm_rows(ctx, fm[j][1], R * H, dk, 1e-6f));
            }
            if (!gdn) HYLA_TRY(o->gla_gate(ctx, g[j], qk, c->gate_logit_normalizer, c->clamp_min));
        }
    }
    HYLA_MIXER_MARK(f, "sse: feature maps");
    const float *ga, *gb, *ba = NULL, *bb = NULL;
    if (!gdn) {
        ga = s.ga;
        gb = s.gb;
    } else {
        HYLA_TRY(o->gdn_gates(ctx, s.ga, 2 * H, s.gb, 2 * H, w->A_log, w->dt_bias, s.gdn[0], s.gdn[1], R, H,
                              c->allow_neg_eigval));
        HYLA_TRY(o->gdn_gates(ctx, s.ga + H, 2 * H, s.gb + H, 2 * H, w->A_log + H, w->dt_bias + H, s.gdn[2], s.gdn[3], R,
                              H, c->allow_neg_eigval));
        ga = s.gdn[0];
        ba = s.gdn[1];
        gb = s.gdn[2];
        bb = s.gdn[3];
    }
    HYLA_MIXER_MARK(f, "sse: gates");
    HYLA_TRY(o->sse_route(ctx, elog, R, N, K, s.idx, s.rw)); /* [SSE-1] */
    HYLA_MIXER_MARK(f, "sse: route");
    if (f->decode) { /* [SSE-2..4] */
        void *const *S0 = hyla_mixer_gather(f, 0, PART_S0), *const *Sp = hyla_mixer_gather(f, 1, PART_SP);
        HYLA_TRY(o->sse_decode(ctx, c->tr, s.qa, s.ka, s.qs, s.ks, s.v, ga, gb, ba, bb, s.idx, s.rw, R, H, dk, dv, N, K,
                               scale, (float *const *)S0, (float *const *)Sp, s.o));
    } else {
        HYLA_TRY(o->sse_prefill(ctx, c->tr, s.qa, s.ka, s.qs, s.ks, s.v, ga, gb, ba, bb, s.idx, s.rw, R, H, dk, dv, N, K,
                                scale, c->window, f->st[0]->part[PART_S0].dev, f->st[0]->part[PART_SP].dev, s.o));
    }
    HYLA_MIXER_MARK(f, "sse: core");
    /* output gate g_proj.1(g_proj.0(x)), unless it went with the LoRA terms */
    if (w->g_proj && !gate2) {
        HYLA_TRY(hyla_mixer_linear(f, s.gate_lr, dv, w->g_proj2, NULL, s.gate, H * dv, 0));
        HYLA_MIXER_MARK(f, "sse: out gate");
    }
    /* the norm and o_proj in one op (prompt rows: the norm writes the projection's bf16 operand) */
    HYLA_TRY(o->gated_rmsnorm_linear(ctx, s.o, w->g_proj ? s.gate : NULL, w->o_norm, H, dv, f->mc->norm_eps, R, w->o,
                                     f->out, D, (f->decode ? 0 : HYLA_LINEAR_PREFILL) | (f->out_acc ? HYLA_LINEAR_ACC : 0)));
    HYLA_MIXER_MARK(f, "sse: out norm, o proj");
    return HYLA_OK;
}

static const char *mk_config(json_t *obj, const hyla_mk_args *a) {
    int gdn = a->variant && !strcmp(a->variant, "gdn");
    int dk = a->head_dim > 0 ? a->head_dim : a->hidden / a->heads;
    int N = a->partitions > 0 ? a->partitions : 4, K = a->topk > 0 ? a->topk : (gdn ? 2 : 1);
    json_object_set_new(obj, "head_dim", json_integer(dk));
    json_object_set_new(obj, "expand_v", json_real(1.0));
    json_object_set_new(obj, "use_output_gate", json_true());
    json_object_set_new(obj, "use_short_conv", json_false());
    json_object_set_new(obj, "num_sparse_partition", json_integer(N));
    json_object_set_new(obj, "num_writer", json_integer(K));
    json_object_set_new(obj, "num_reader", json_integer(K));
    json_object_set_new(obj, "sse_transition", json_string(gdn ? "gdn" : "gla"));
    json_object_set_new(obj, "gate_low_rank_dim", json_integer(16));
    json_object_set_new(obj, "gate_logit_normalizer", json_integer(16));
    json_object_set_new(obj, "lora_rank", json_integer(dk));
    json_object_set_new(obj, "lora_target", json_string("always"));
    json_object_set_new(obj, "use_q_softmax", json_false());
    json_object_set_new(obj, "use_k_softmax", json_true());
    if (a->prefill_window > 0) json_object_set_new(obj, "prefill_window", json_integer(a->prefill_window));
    return NULL;
}

static const char *tp_shard(void *cfgp, int T, char *why, size_t n) {
    return hyla_tp_divide(&((sse_cfg *)cfgp)->H, "num_heads", T, why, n);
}

const hyla_mixer hyla_mixer_sse = {
    .name = "sse",
    .model_type = "sse",
    HYLA_MIXER_HOOKS(sse_cfg, sse_w),
    .mk_config = mk_config,
    .tp_shard = tp_shard,
    .prefill_align = prefill_align,
};
