/* hyla_session.c — session state on the backend and the forward pass (docs/MODELS.md §3–§6).
 *
 * The forward runs R rows through the held layers in one of two modes:
 *   prefill: R consecutive tokens of ONE session (a piece: from the position to the next
 *            multiple of HYLA_PREFILL_CHUNK, or, from a multiple, up to the model's
 *            prefill_piece tokens), mixers use the *_prefill ops;
 *   decode:  one token for each of R sessions, mixers use the batched *_decode ops.
 * Dense work (norms, projections, MLP) is identical in both modes and row-independent.
 *
 * Scratch buffers of the model (hyla_scratch) are used as follows by every layer:
 *   buf[0..12] mixer temporaries (documented per mixer below), buf[13] = mixer/MLP output.
 *
 * Invariants: s->pos tokens have been consumed; s->pending is the next token to feed (or -1);
 * states of layers outside the model's layer range are not allocated; KV pages are never freed
 * while the session lives (so an export in flight may read them: s->exports counts those).
 * Threading: one thread drives a model's sessions (the backend thread); exported snapshots may
 * be destroyed on any thread (their buffers go back to the model's cache under its mutex). */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_model_impl.h"
#include "hyla_profile.h"
#include "hyla_session.h"

typedef struct {
    float *S;        /* gla/gdn: [H][dk][dv] fp32; sse: S0 [H][dk][dv] */
    float *Sp;       /* sse: [N][H][dk][dv] fp32 */
    float *conv[3];  /* short-conv tails q, k, v: [K-1][C] fp32 */
    void **kpages;   /* attn: host array [cap_pages] of device pages [page][Hk][hd] kv_dtype */
    void **vpages;
    int n_pages, cap_pages;
} layer_state;

struct hyla_session {
    hyla_model *m;
    layer_state ls[HYLA_MAX_LAYERS];
    int64_t pos;
    int32_t pending;
    int64_t generated;
    hyla_sampling sp;
    uint64_t seed;
    hyla_rng rng;
    uint64_t state_bytes;
    void *tag;
    int exports; /* exports begun and not yet ended */
};

#define OPS(m) ((m)->be->ops)
#define CTX(m) ((m)->be->ctx)

static size_t conv_channels(const hyla_model_config *c, int j) {
    return (size_t)c->num_heads * (size_t)(j == 2 ? c->head_v_dim : c->head_k_dim);
}
static size_t kv_page_bytes(const hyla_model *m) {
    const hyla_model_config *c = &m->cfg;
    return (size_t)HYLA_KV_PAGE_TOKENS * c->attn_kv_heads * c->attn_head_dim * hyla_dtype_size(OPS(m)->kv_dtype);
}

static hyla_status state_alloc(hyla_session *s, size_t bytes, float **out) {
    hyla_status st = OPS(s->m)->alloc(CTX(s->m), bytes, (void **)out);
    if (st != HYLA_OK) return hyla_fail_wrap(st, "allocating %zu bytes of session state", bytes);
    s->state_bytes += bytes;
    return HYLA_OK;
}

hyla_status hyla_session_create(hyla_model *m, hyla_session **out) {
    *out = NULL;
    hyla_session *s = calloc(1, sizeof *s);
    if (!s) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    s->m = m;
    s->pending = -1;
    s->sp.temperature = 0;
    s->sp.top_k = 0;
    s->sp.top_p = 1;
    hyla_rng_seed(&s->rng, 0);
    const hyla_model_config *c = &m->cfg;
    size_t Sbytes = (size_t)c->num_heads * c->head_k_dim * c->head_v_dim * sizeof(float);
    hyla_status st = HYLA_OK;
    for (int l = m->layer_begin; st == HYLA_OK && l < m->layer_end; l++) {
        layer_state *ls = &s->ls[l];
        switch (c->mixer[l]) {
        case HYLA_MIXER_GLA:
        case HYLA_MIXER_GDN:
            st = state_alloc(s, Sbytes, &ls->S);
            for (int j = 0; st == HYLA_OK && c->use_short_conv && j < 3; j++)
                st = state_alloc(s, (size_t)(c->conv_size - 1) * conv_channels(c, j) * sizeof(float), &ls->conv[j]);
            break;
        case HYLA_MIXER_SSE:
            st = state_alloc(s, Sbytes, &ls->S);
            if (st == HYLA_OK) st = state_alloc(s, Sbytes * (size_t)c->sse_partitions, &ls->Sp);
            break;
        case HYLA_MIXER_ATTN: break; /* pages are allocated as the context grows */
        }
    }
    if (st != HYLA_OK) {
        hyla_session_free(s);
        return st;
    }
    *out = s;
    return HYLA_OK;
}

void hyla_session_free(hyla_session *s) {
    if (!s) return;
    /* an export in flight still reads this session's KV pages (hyla_session.h) */
    HYLA_ASSERT(s->exports == 0 && "every hyla_session_export_begin must end before hyla_session_free");
    hyla_model *m = s->m;
    for (int l = m->layer_begin; l < m->layer_end; l++) {
        layer_state *ls = &s->ls[l];
        OPS(m)->free(CTX(m), ls->S);
        OPS(m)->free(CTX(m), ls->Sp);
        for (int j = 0; j < 3; j++) OPS(m)->free(CTX(m), ls->conv[j]);
        for (int p = 0; p < ls->n_pages; p++) {
            OPS(m)->free(CTX(m), ls->kpages[p]);
            OPS(m)->free(CTX(m), ls->vpages[p]);
        }
        free(ls->kpages);
        free(ls->vpages);
    }
    free(s);
}

void hyla_session_set_sampling(hyla_session *s, hyla_sampling params, uint64_t seed) {
    s->sp = params;
    s->seed = seed;
    hyla_rng_seed(&s->rng, seed);
}
void hyla_session_set_sampling_params(hyla_session *s, hyla_sampling params) { s->sp = params; }
hyla_sampling hyla_session_get_sampling(const hyla_session *s) { return s->sp; }
int64_t hyla_session_position(const hyla_session *s) { return s->pos; }
int32_t hyla_session_pending(const hyla_session *s) { return s->pending; }
int64_t hyla_session_generated(const hyla_session *s) { return s->generated; }
hyla_model *hyla_session_model(const hyla_session *s) { return s->m; }
uint64_t hyla_session_state_bytes(const hyla_session *s) { return s->state_bytes; }

/* Make the attention KV of layer l hold at least `tokens` tokens. */
static hyla_status ensure_pages(hyla_session *s, int l, int64_t tokens) {
    layer_state *ls = &s->ls[l];
    int need = (int)((tokens + HYLA_KV_PAGE_TOKENS - 1) / HYLA_KV_PAGE_TOKENS);
    if (need <= ls->n_pages) return HYLA_OK;
    if (need > ls->cap_pages) {
        int cap = ls->cap_pages ? ls->cap_pages : 8;
        while (cap < need) cap *= 2;
        void **k = realloc(ls->kpages, (size_t)cap * sizeof *k);
        if (!k) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
        ls->kpages = k;
        void **v = realloc(ls->vpages, (size_t)cap * sizeof *v);
        if (!v) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
        ls->vpages = v;
        ls->cap_pages = cap;
    }
    size_t pb = kv_page_bytes(s->m);
    while (ls->n_pages < need) {
        HYLA_TRY(state_alloc(s, pb, (float **)&ls->kpages[ls->n_pages]));
        hyla_status st = state_alloc(s, pb, (float **)&ls->vpages[ls->n_pages]);
        if (st != HYLA_OK) {
            OPS(s->m)->free(CTX(s->m), ls->kpages[ls->n_pages]);
            s->state_bytes -= pb;
            return st;
        }
        ls->n_pages++;
    }
    return HYLA_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Forward                                                                                     */

typedef struct {
    int decode;                /* 0: prefill of ss[0]; 1: one token per session */
    hyla_session *const *ss;   /* [1] (prefill) or [R] (decode) */
    int R;                     /* rows */
    const int32_t *pos;        /* host [R]: absolute position of each row */
} fwd;

/* Every linear of the forward: decode rows through ops->linear, prompt rows (prefill pieces)
 * through ops->linear_multi with HYLA_LINEAR_PREFILL (a row's result still depends only on the
 * row; the CUDA backend then runs cuBLAS at a fixed row count). */
static hyla_status lin(const hyla_ops *o, void *ctx, int decode, int R, const float *x, int K, const hyla_weight *W,
                       const float *bias, float *y, int N, int acc) {
    if (decode) return o->linear(ctx, x, K, R, K, W, bias, y, N, N, acc);
    hyla_linear_out lo = {W, bias, y, N, N};
    return o->linear_multi(ctx, x, K, R, K, 1, &lo, acc, HYLA_LINEAR_PREFILL);
}
#define LIN(x, K, W, b, y, N, acc) lin(o, ctx, f->decode, f->R, (x), (K), (W), (b), (y), (N), (acc))
/* HYLA_PROFILE marks (hyla_profile.h): the time since the previous mark is charged to label */
#define PM(label)                                                        \
    do {                                                                 \
        if (hyla_prof_on) hyla_prof_mark(o, ctx, f->decode, (label));   \
    } while (0)
/* Projections of the same x [R][K] as one ops->linear_multi (the bits of separate calls, fewer
 * launches on the GPU): add outputs with LOUT, then run MULTI. */
#define LOUT(lo, n, W_, b_, y_, N_) ((lo)[(n)++] = (hyla_linear_out){(W_), (b_), (y_), (N_), (N_)})
#define MULTI(x, K, lo, n) \
    o->linear_multi(ctx, (x), (K), f->R, (K), (n), (lo), 0, f->decode ? 0 : HYLA_LINEAR_PREFILL)

/* Collect per-session device pointers of a state field for the decode ops. */
#define GATHER(arr, field)                                            \
    for (int r_ = 0; r_ < f->R; r_++) (arr)[r_] = f->ss[r_]->ls[l].field

static hyla_status mixer_linear(hyla_model *m, int l, const fwd *f, float *xn, float *out) {
    const hyla_model_config *c = &m->cfg;
    const hyla_layer *ly = &m->layers[l];
    const hyla_ops *o = OPS(m);
    void *ctx = CTX(m);
    float **b = m->sc.buf;
    int D = c->hidden_size, H = c->num_heads, dk = c->head_k_dim, dv = c->head_v_dim, R = f->R;
    float scale = 1.0f / sqrtf((float)dk);
    float **ptrs = NULL;
    hyla_status st = HYLA_OK;
    if (f->decode && !(ptrs = malloc((size_t)R * sizeof *ptrs))) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
#define T(call) do { if ((st = (call)) != HYLA_OK) goto done; } while (0)
    /* b0 = q [R][H*dk], b1 = k, b2 = v [R][H*dv]; from the same x: GLA's gate low-rank input
     * (b4), GDN's a and b (b3, b4), the output gate (b6) */
    hyla_linear_out lo[HYLA_LINEAR_MULTI_MAX];
    int nlo = 0;
    LOUT(lo, nlo, ly->q, NULL, b[0], H * dk);
    LOUT(lo, nlo, ly->k, NULL, b[1], H * dk);
    LOUT(lo, nlo, ly->v, NULL, b[2], H * dv);
    if (ly->kind == HYLA_MIXER_GLA) LOUT(lo, nlo, ly->gk_a[0], NULL, b[4], c->gate_low_rank_dim);
    T(MULTI(xn, D, lo, nlo));
    PM("lin: q/k/v proj");
    nlo = 0;
    if (ly->kind != HYLA_MIXER_GLA) {
        LOUT(lo, nlo, ly->a_proj, NULL, b[3], H);
        LOUT(lo, nlo, ly->b_proj, NULL, b[4], H);
    }
    if (ly->g_proj) LOUT(lo, nlo, ly->g_proj, NULL, b[6], H * dv);
    if (nlo) T(MULTI(xn, D, lo, nlo));
    PM("lin: gate proj");
    if (c->use_short_conv) { /* [CONV-1], silu inside */
        for (int j = 0; j < 3; j++) {
            int C = (int)conv_channels(c, j);
            if (f->decode) {
                GATHER(ptrs, conv[j]);
                T(o->short_conv(ctx, b[j], R, 1, C, ly->conv_w[j], NULL, c->conv_size, ptrs, 1));
            } else {
                float *tail = f->ss[0]->ls[l].conv[j];
                T(o->short_conv(ctx, b[j], 1, R, C, ly->conv_w[j], NULL, c->conv_size, &tail, 1));
            }
        }
    } else if (ly->kind == HYLA_MIXER_GDN) {
        for (int j = 0; j < 3; j++) T(o->silu(ctx, b[j], (size_t)R * (size_t)(j == 2 ? H * dv : H * dk)));
    }
    if (ly->kind == HYLA_MIXER_GLA) {
        /* b3 = gk [R][H*dk] via the low-rank pair (b4 = [R][r]) [GLA-1] */
        int r = c->gate_low_rank_dim;
        T(LIN(b[4], r, ly->gk_b[0], ly->gk_bias[0], b[3], H * dk, 0));
        T(o->gla_gate(ctx, b[3], (size_t)R * H * dk, c->gate_logit_normalizer, c->clamp_min));
        PM("gla: conv, gates");
        if (f->decode) {
            GATHER(ptrs, S);
            T(o->gla_decode(ctx, b[0], b[1], b[2], b[3], R, H, dk, dv, scale, ptrs, b[5]));
        } else {
            T(o->gla_prefill(ctx, b[0], b[1], b[2], b[3], R, H, dk, dv, scale, f->ss[0]->ls[l].S, b[5]));
        }
        PM("gla: core");
    } else { /* GDN [GDN-1..3]: b3 = g [R][H], b4 = beta [R][H] */
        T(o->l2norm_rows(ctx, b[0], R * H, dk, 1e-6f));
        T(o->l2norm_rows(ctx, b[1], R * H, dk, 1e-6f));
        T(o->gdn_gates(ctx, b[3], H, b[4], H, ly->A_log, ly->dt_bias, b[3], b[4], R, H, c->allow_neg_eigval));
        PM("gdn: conv, norms, gates");
        if (f->decode) {
            GATHER(ptrs, S);
            T(o->gdn_decode(ctx, b[0], b[1], b[2], b[3], b[4], R, H, dk, dv, scale, ptrs, b[5]));
        } else {
            T(o->gdn_prefill(ctx, b[0], b[1], b[2], b[3], b[4], R, H, dk, dv, scale, f->ss[0]->ls[l].S, b[5]));
        }
        PM("gdn: core");
    }
    /* b6 = output gate [R][H*dv] (above); [NORM-1] per head; then o_proj */
    T(o->gated_rmsnorm(ctx, b[5], ly->g_proj ? b[6] : NULL, ly->o_norm, b[5], R * H, dv, c->norm_eps));
    PM("lin: out norm");
    T(LIN(b[5], H * dv, ly->o, NULL, out, D, 0));
    PM("lin: o proj");
done:
    free(ptrs);
    return st;
}

static hyla_status mixer_sse(hyla_model *m, int l, const fwd *f, float *xn, float *out) {
    const hyla_model_config *c = &m->cfg;
    const hyla_layer *ly = &m->layers[l];
    const hyla_ops *o = OPS(m);
    void *ctx = CTX(m);
    float **b = m->sc.buf;
    int D = c->hidden_size, H = c->num_heads, dk = c->head_k_dim, dv = c->head_v_dim, R = f->R;
    int N = c->sse_partitions, K = c->sse_topk, rank = c->sse_lora_rank, gdn = c->sse_transition == HYLA_SSE_GDN;
    size_t qk = (size_t)R * H * dk;
    float scale = 1.0f / sqrtf((float)dk);
    float **p0 = NULL, **p1 = NULL;
    hyla_status st = HYLA_OK;
    if (f->decode && (!(p0 = malloc((size_t)R * sizeof *p0)) || !(p1 = malloc((size_t)R * sizeof *p1)))) {
        free(p0);
        return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    }
    /* b0 = qa, b1 = ka (always-selected), b2 = qs, b3 = ks (sparse); lora temps b4 (q), b8 (k)
     * [R][rank] */
    hyla_linear_out lo[HYLA_LINEAR_MULTI_MAX];
    int nlo = 0;
    LOUT(lo, nlo, ly->q, NULL, b[0], H * dk);
    LOUT(lo, nlo, ly->k, NULL, b[1], H * dk);
    LOUT(lo, nlo, ly->lora_q_a, NULL, b[4], rank);
    LOUT(lo, nlo, ly->lora_k_a, NULL, b[8], rank);
    T(MULTI(xn, D, lo, nlo));
    PM("sse: q/k proj");
    T(o->copy(ctx, b[2], b[0], qk * sizeof(float)));
    T(o->copy(ctx, b[3], b[1], qk * sizeof(float)));
    float *lq = c->sse_lora_on_sparse ? b[2] : b[0], *lk = c->sse_lora_on_sparse ? b[3] : b[1];
    T(LIN(b[4], rank, ly->lora_q_b, NULL, lq, H * dk, 1));
    T(LIN(b[8], rank, ly->lora_k_b, NULL, lk, H * dk, 1));
    PM("sse: copies, lora");
    /* b5 = v = silu(x Wv); b4 = routing logits [R][N]; the gates' inputs: GLA b8, b9 (low-rank
     * [R][r]), GDN b6 = a, b7 = b [R][2H] */
    nlo = 0;
    LOUT(lo, nlo, ly->v, NULL, b[5], H * dv);
    LOUT(lo, nlo, ly->e_proj, NULL, b[4], N);
    if (!gdn) {
        LOUT(lo, nlo, ly->gk_a[0], NULL, b[8], c->gate_low_rank_dim);
        LOUT(lo, nlo, ly->gk_a[1], NULL, b[9], c->gate_low_rank_dim);
    } else {
        LOUT(lo, nlo, ly->a_proj, NULL, b[6], 2 * H);
        LOUT(lo, nlo, ly->b_proj, NULL, b[7], 2 * H);
    }
    T(MULTI(xn, D, lo, nlo));
    PM("sse: v/e/gate proj");
    T(o->silu(ctx, b[5], (size_t)R * H * dv));
    for (int j = 0; j < 4; j += 2) { /* feature maps of eq. 8 */
        if (c->sse_q_softmax) T(o->softmax_rows(ctx, b[j], R * H, dk));
        else T(o->silu(ctx, b[j], qk));
        if (c->sse_k_softmax) T(o->softmax_rows(ctx, b[j + 1], R * H, dk));
        else T(o->silu(ctx, b[j + 1], qk));
        if (gdn) { /* choice (b): normalise before the gate weight */
            T(o->l2norm_rows(ctx, b[j], R * H, dk, 1e-6f));
            T(o->l2norm_rows(ctx, b[j + 1], R * H, dk, 1e-6f));
        }
    }
    PM("sse: feature maps");
    /* gates: GLA: b6 = gk0, b7 = gk1 (from b8, b9); GDN: b8/b9 = g/beta (always), b10/b11 = g/beta (sparse) */
    const float *ga, *gb, *ba = NULL, *bb = NULL;
    if (!gdn) {
        int r = c->gate_low_rank_dim;
        for (int j = 0; j < 2; j++) {
            T(LIN(b[8 + j], r, ly->gk_b[j], ly->gk_bias[j], b[6 + j], H * dk, 0));
            T(o->gla_gate(ctx, b[6 + j], qk, c->gate_logit_normalizer, c->clamp_min));
        }
        ga = b[6];
        gb = b[7];
    } else {
        T(o->gdn_gates(ctx, b[6], 2 * H, b[7], 2 * H, ly->A_log, ly->dt_bias, b[8], b[9], R, H, c->allow_neg_eigval));
        T(o->gdn_gates(ctx, b[6] + H, 2 * H, b[7] + H, 2 * H, ly->A_log + H, ly->dt_bias + H, b[10], b[11], R, H,
                       c->allow_neg_eigval));
        ga = b[8];
        gb = b[10];
        ba = b[9];
        bb = b[11];
    }
    PM("sse: gates");
    /* routing [SSE-1]: b4 = e logits [R][N] (above) */
    T(o->sse_route(ctx, b[4], R, N, K, m->sc.sse_idx, m->sc.sse_w));
    PM("sse: route");
    /* b12 = o [R][H*dv] [SSE-2..4] */
    hyla_sse_transition tr = gdn ? HYLA_SSE_GDN : HYLA_SSE_GLA;
    if (f->decode) {
        GATHER(p0, S);
        GATHER(p1, Sp);
        T(o->sse_decode(ctx, tr, b[0], b[1], b[2], b[3], b[5], ga, gb, ba, bb, m->sc.sse_idx, m->sc.sse_w, R, H, dk, dv,
                        N, K, scale, p0, p1, b[12]));
    } else {
        T(o->sse_prefill(ctx, tr, b[0], b[1], b[2], b[3], b[5], ga, gb, ba, bb, m->sc.sse_idx, m->sc.sse_w, R, H, dk,
                         dv, N, K, scale, f->ss[0]->ls[l].S, f->ss[0]->ls[l].Sp, b[12]));
    }
    PM("sse: core");
    /* output gate g_proj.1(g_proj.0(x)) (b0 temp [R][dv], b1 = g) */
    if (ly->g_proj) {
        T(LIN(xn, D, ly->g_proj, NULL, b[0], dv, 0));
        T(LIN(b[0], dv, ly->g_proj2, NULL, b[1], H * dv, 0));
    }
    T(o->gated_rmsnorm(ctx, b[12], ly->g_proj ? b[1] : NULL, ly->o_norm, b[12], R * H, dv, c->norm_eps));
    PM("sse: out gate, norm");
    T(LIN(b[12], H * dv, ly->o, NULL, out, D, 0));
    PM("sse: o proj");
done:
    free(p0);
    free(p1);
    return st;
}

static hyla_status mixer_attn(hyla_model *m, int l, const fwd *f, float *xn, float *out) {
    const hyla_model_config *c = &m->cfg;
    const hyla_layer *ly = &m->layers[l];
    const hyla_ops *o = OPS(m);
    void *ctx = CTX(m);
    float **b = m->sc.buf;
    int D = c->hidden_size, Hq = c->attn_heads, Hk = c->attn_kv_heads, hd = c->attn_head_dim, R = f->R;
    float scale = 1.0f / sqrtf((float)hd);
    hyla_status st = HYLA_OK;
    hyla_kv_view *views = calloc((size_t)(f->decode ? R : 1), sizeof *views);
    if (!views) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    /* b0 = q [R][Hq*hd], b1 = k, b2 = v [R][Hk*hd], b3 = o */
    hyla_linear_out lo[3];
    int nlo = 0;
    LOUT(lo, nlo, ly->q, ly->q_bias, b[0], Hq * hd);
    LOUT(lo, nlo, ly->k, ly->k_bias, b[1], Hk * hd);
    LOUT(lo, nlo, ly->v, ly->v_bias, b[2], Hk * hd);
    T(MULTI(xn, D, lo, nlo));
    PM("attn: q/k/v proj");
    if (ly->q_norm) {
        T(o->rmsnorm(ctx, b[0], ly->q_norm, b[0], R * Hq, hd, 1e-5f));
        T(o->rmsnorm(ctx, b[1], ly->k_norm, b[1], R * Hk, hd, 1e-5f));
    }
    T(o->rope(ctx, b[0], R, Hq, hd, f->pos, c->rope_theta));
    T(o->rope(ctx, b[1], R, Hk, hd, f->pos, c->rope_theta));
    int nv = f->decode ? R : 1;
    for (int i = 0; i < nv; i++) {
        hyla_session *s = f->ss[i];
        T(ensure_pages(s, l, f->pos[i] + (f->decode ? 1 : R)));
        views[i].k_pages = s->ls[l].kpages;
        views[i].v_pages = s->ls[l].vpages;
        views[i].n_pages = s->ls[l].n_pages;
        views[i].page_tokens = HYLA_KV_PAGE_TOKENS;
    }
    if (f->decode)
        T(o->attn_decode(ctx, b[0], b[1], b[2], R, Hq, Hk, hd, f->pos, views, c->attn_window, scale, b[3]));
    else
        T(o->attn_prefill(ctx, b[0], b[1], b[2], R, Hq, Hk, hd, f->pos[0], views, c->attn_window, scale, b[3]));
    PM("attn: norms, rope, pages, core");
    T(LIN(b[3], Hq * hd, ly->o, NULL, out, D, 0));
    PM("attn: o proj");
done:
    free(views);
    return st;
}

/* Rows of sc.x (already embedded) through the held layers; final norm + head into sc.logits
 * when want_logits and this is the last stage. */
static hyla_status forward(hyla_model *m, const fwd *f, int want_logits) {
    const hyla_model_config *c = &m->cfg;
    const hyla_ops *o = OPS(m);
    void *ctx = CTX(m);
    hyla_scratch *sc = &m->sc;
    int D = c->hidden_size, F = c->intermediate_size;
    float *mo = sc->buf[13];
    if (hyla_prof_on) hyla_prof_begin(o, ctx);
    for (int l = m->layer_begin; l < m->layer_end; l++) {
        const hyla_layer *ly = &m->layers[l];
        HYLA_TRY(o->rmsnorm(ctx, sc->x, ly->attn_norm, sc->xn, f->R, D, c->norm_eps));
        PM("norm");
        hyla_status st;
        switch (ly->kind) {
        case HYLA_MIXER_SSE: st = mixer_sse(m, l, f, sc->xn, mo); break;
        case HYLA_MIXER_ATTN: st = mixer_attn(m, l, f, sc->xn, mo); break;
        default: st = mixer_linear(m, l, f, sc->xn, mo); break;
        }
        if (st != HYLA_OK) return hyla_fail_wrap(st, "layer %d (%s)", l, hyla_mixer_name(ly->kind));
        HYLA_TRY(o->add_rmsnorm(ctx, sc->x, mo, ly->mlp_norm, sc->xn, f->R, D, c->norm_eps));
        PM("norm");
        float *g = sc->buf[0], *u = sc->buf[1];
        hyla_linear_out lo[2] = {{ly->mlp_gate, NULL, g, F, F}, {ly->mlp_up, NULL, u, F, F}};
        HYLA_TRY(o->linear_multi(ctx, sc->xn, D, f->R, D, 2, lo, 0, f->decode ? 0 : HYLA_LINEAR_PREFILL));
        PM("mlp: gate/up proj");
        HYLA_TRY(o->swiglu(ctx, g, u, g, (size_t)f->R * F));
        PM("mlp: swiglu");
        HYLA_TRY(lin(o, ctx, f->decode, f->R, g, F, ly->mlp_down, NULL, mo, D, 0));
        PM("mlp: down proj");
        HYLA_TRY(o->add(ctx, sc->x, mo, (size_t)f->R * D));
        PM("residual add");
    }
    if (m->lm_head) {
        if (!want_logits) return HYLA_OK;
        HYLA_TRY(o->rmsnorm(ctx, sc->x, m->final_norm, sc->xn, f->R, D, c->norm_eps));
        hyla_status hs = lin(o, ctx, f->decode, f->R, sc->xn, D, m->lm_head, NULL, sc->logits, c->vocab_size, 0);
        PM("final norm, lm head");
        return hs;
    }
    /* not the last stage: hand the hidden states to the remaining stages */
    if (!m->downstream)
        return hyla_fail(HYLA_ERR_UNSUPPORTED, "model holds layers %d..%d of %d and has no downstream stage",
                         m->layer_begin, m->layer_end - 1, c->num_layers);
    size_t V = (size_t)c->vocab_size;
    float *hidden = malloc((size_t)f->R * D * sizeof(float));
    float *logits = want_logits ? malloc((size_t)f->R * V * sizeof(float)) : NULL;
    hyla_status st = (!hidden || (want_logits && !logits)) ? hyla_fail(HYLA_ERR_NOMEM, "out of memory") : HYLA_OK;
    if (st == HYLA_OK) st = o->download(ctx, hidden, sc->x, (size_t)f->R * D * sizeof(float));
    if (st == HYLA_OK) {
        st = m->downstream(m->downstream_ud, f->ss, f->R, f->decode, hidden, logits);
        if (st != HYLA_OK) st = hyla_fail_wrap(st, "downstream stage after layer %d", m->layer_end - 1);
    }
    if (st == HYLA_OK && want_logits) st = o->upload(ctx, sc->logits, logits, (size_t)f->R * V * sizeof(float));
    free(hidden);
    free(logits);
    return st;
}

void hyla_model_set_downstream(hyla_model *m, hyla_downstream_fn fn, void *ud) {
    m->downstream = fn;
    m->downstream_ud = ud;
}

void hyla_session_set_tag(hyla_session *s, void *tag) { s->tag = tag; }
void *hyla_session_tag(const hyla_session *s) { return s->tag; }

hyla_status hyla_stage_forward(hyla_session *const *ss, int R, int decode, const float *hidden_in, float *logits) {
    if (R < 1) return hyla_fail(HYLA_ERR_INVALID_ARG, "stage forward needs at least one row");
    hyla_model *m = ss[0]->m;
    int n = decode ? R : 1;
    for (int i = 0; i < n; i++)
        if (ss[i]->m != m) return hyla_fail(HYLA_ERR_INVALID_ARG, "stage batch mixes sessions of different models");
    /* a prefill piece either starts on a chunk boundary or stays inside one chunk (the pieces of
     * any feed are then cut at the same absolute positions) */
    if (!decode && (R > HYLA_PREFILL_PIECE_MAX ||
                    (ss[0]->pos % HYLA_PREFILL_CHUNK &&
                     ss[0]->pos / HYLA_PREFILL_CHUNK != (ss[0]->pos + R - 1) / HYLA_PREFILL_CHUNK)))
        return hyla_fail(HYLA_ERR_INVALID_ARG,
                         "stage prefill of %d rows at position %lld: a piece must start on a %d-token chunk boundary "
                         "or stay inside one chunk, and hold at most %d rows",
                         R, (long long)ss[0]->pos, HYLA_PREFILL_CHUNK, HYLA_PREFILL_PIECE_MAX);
    HYLA_TRY(hyla_model_scratch_reserve(m, R));
    int32_t *pos = malloc((size_t)R * sizeof *pos);
    if (!pos) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    for (int i = 0; i < R; i++) pos[i] = (int32_t)(decode ? ss[i]->pos : ss[0]->pos + i);
    const hyla_model_config *c = &m->cfg;
    hyla_status st = OPS(m)->upload(CTX(m), m->sc.x, hidden_in, (size_t)R * c->hidden_size * sizeof(float));
    fwd f = {decode, ss, R, pos};
    if (st == HYLA_OK) st = forward(m, &f, logits != NULL);
    if (st == HYLA_OK && logits && m->lm_head)
        st = OPS(m)->download(CTX(m), logits, m->sc.logits, (size_t)R * c->vocab_size * sizeof(float));
    if (st == HYLA_OK) {
        if (decode)
            for (int i = 0; i < R; i++) ss[i]->pos++;
        else
            ss[0]->pos += R;
    }
    free(pos);
    return st;
}

static hyla_status check_tokens(const hyla_model *m, const int32_t *t, int n) {
    for (int i = 0; i < n; i++)
        if (t[i] < 0 || t[i] >= m->cfg.vocab_size)
            return hyla_fail(HYLA_ERR_INVALID_ARG, "token id %d at index %d is outside the vocabulary [0, %d)", t[i], i,
                             m->cfg.vocab_size);
    return HYLA_OK;
}

/* Prefill `n` tokens (one aligned piece) of session s. */
static hyla_status prefill_piece(hyla_session *s, const int32_t *toks, int n, float *logits_host) {
    hyla_model *m = s->m;
    if (m->layer_begin != 0)
        return hyla_fail(HYLA_ERR_UNSUPPORTED, "feeding tokens needs the first pipeline stage (layers from 0)");
    HYLA_TRY(hyla_model_scratch_reserve(m, n));
    int32_t *pos = malloc((size_t)n * sizeof *pos);
    if (!pos) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) pos[i] = (int32_t)(s->pos + i);
    hyla_status st = OPS(m)->embed(CTX(m), m->embed, toks, n, m->sc.x);
    fwd f = {0, &s, n, pos};
    if (st == HYLA_OK) st = forward(m, &f, logits_host != NULL);
    free(pos);
    HYLA_TRY(st);
    if (logits_host) {
        HYLA_TRY(OPS(m)->download(CTX(m), logits_host, m->sc.logits, (size_t)n * m->cfg.vocab_size * sizeof(float)));
    }
    s->pos += n;
    return HYLA_OK;
}

hyla_status hyla_session_feed(hyla_session *s, const int32_t *tokens, int n, float *logits, int *consumed_out,
                              hyla_progress_fn progress, void *ud) {
    if (consumed_out) *consumed_out = 0;
    if (n < 1) return hyla_fail(HYLA_ERR_INVALID_ARG, "feed needs at least one token");
    HYLA_TRY(check_tokens(s->m, tokens, n));
    /* the list to consume: [pending] + tokens[0..n-2]; tokens[n-1] becomes pending */
    int had = s->pending >= 0;
    int total = n - 1 + had;
    int32_t *list = malloc(((size_t)total + 1) * sizeof *list);
    if (!list) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    if (had) list[0] = s->pending;
    memcpy(list + had, tokens, (size_t)(n - 1) * sizeof *list);
    list[total] = tokens[n - 1];
    int done = 0;
    hyla_status st = HYLA_OK;
    size_t V = (size_t)s->m->cfg.vocab_size;
    while (done < total) {
        /* to the next chunk boundary, then pieces of up to prefill_piece tokens from boundaries */
        int off = (int)(s->pos % HYLA_PREFILL_CHUNK);
        int room = off ? HYLA_PREFILL_CHUNK - off : s->m->prefill_piece;
        int piece = total - done < room ? total - done : room;
        st = prefill_piece(s, list + done, piece, logits ? logits + (size_t)done * V : NULL);
        if (st != HYLA_OK) break;
        done += piece;
        if (progress && done < total && progress(ud, done, total)) {
            st = hyla_fail(HYLA_ERR_CANCELLED, "feed cancelled after %d of %d tokens", done, total);
            break;
        }
    }
    /* On success the last token is pending; on failure/cancel the next unconsumed one is (the
     * tokens after it were not fed). */
    s->pending = list[done < total ? done : total];
    if (progress && st == HYLA_OK) progress(ud, done, total);
    free(list);
    if (consumed_out) *consumed_out = done;
    return st;
}

/* Decode-path forward of the pending tokens of B sessions; logits stay in m->sc.logits. */
static hyla_status step_forward(hyla_session *const *ss, int B) {
    if (B < 1) return hyla_fail(HYLA_ERR_INVALID_ARG, "decode needs at least one session");
    hyla_model *m = ss[0]->m;
    for (int i = 0; i < B; i++) {
        if (ss[i]->m != m) return hyla_fail(HYLA_ERR_INVALID_ARG, "decode batch mixes sessions of different models");
        if (ss[i]->pending < 0)
            return hyla_fail(HYLA_ERR_INVALID_ARG, "session %d of the batch has no pending token (feed a prompt first)", i);
        for (int j = 0; j < i; j++)
            if (ss[j] == ss[i]) return hyla_fail(HYLA_ERR_INVALID_ARG, "decode batch holds one session twice");
    }
    if (m->layer_begin != 0) return hyla_fail(HYLA_ERR_UNSUPPORTED, "decode needs the first pipeline stage");
    HYLA_TRY(hyla_model_scratch_reserve(m, B));
    int32_t *toks = malloc((size_t)B * sizeof *toks), *pos = malloc((size_t)B * sizeof *pos);
    hyla_status st = HYLA_OK;
    if (!toks || !pos) {
        st = hyla_fail(HYLA_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (int i = 0; i < B; i++) {
        toks[i] = ss[i]->pending;
        pos[i] = (int32_t)ss[i]->pos;
    }
    if ((st = OPS(m)->embed(CTX(m), m->embed, toks, B, m->sc.x)) != HYLA_OK) goto out;
    fwd f = {1, ss, B, pos};
    if ((st = forward(m, &f, 1)) != HYLA_OK) goto out;
    for (int i = 0; i < B; i++) {
        ss[i]->pos++;
        ss[i]->pending = -1;
    }
out:
    free(toks);
    free(pos);
    return st;
}

hyla_status hyla_session_step(hyla_session *const *ss, int B, float *logits) {
    HYLA_TRY(step_forward(ss, B));
    hyla_model *m = ss[0]->m;
    if (logits)
        HYLA_TRY(OPS(m)->download(CTX(m), logits, m->sc.logits, (size_t)B * m->cfg.vocab_size * sizeof(float)));
    return HYLA_OK;
}

hyla_status hyla_session_decode(hyla_session *const *ss, int B, int32_t *out, float *logits) {
    HYLA_TRY(step_forward(ss, B));
    hyla_model *m = ss[0]->m;
    hyla_sampling *sp = malloc((size_t)B * sizeof *sp);
    float *u = malloc((size_t)B * sizeof *u);
    hyla_status st = HYLA_OK;
    size_t V = (size_t)m->cfg.vocab_size;
    if (!sp || !u) {
        st = hyla_fail(HYLA_ERR_NOMEM, "out of memory");
        goto out;
    }
    /* one RNG draw per sampled token, greedy included [SAMPLE-1] */
    for (int i = 0; i < B; i++) {
        sp[i] = ss[i]->sp;
        u[i] = hyla_rng_uniform(&ss[i]->rng);
    }
    if ((st = OPS(m)->sample(CTX(m), m->sc.logits, B, (int)V, sp, u, out)) != HYLA_OK) goto out;
    if (logits && (st = OPS(m)->download(CTX(m), logits, m->sc.logits, (size_t)B * V * sizeof(float))) != HYLA_OK)
        goto out;
    for (int i = 0; i < B; i++) {
        ss[i]->pending = out[i];
        ss[i]->generated++;
    }
out:
    free(sp);
    free(u);
    return st;
}

hyla_status hyla_session_sample_logits(hyla_session *s, const float *logits, int32_t *out) {
    hyla_model *m = s->m;
    HYLA_TRY(hyla_model_scratch_reserve(m, 1));
    size_t V = (size_t)m->cfg.vocab_size;
    HYLA_TRY(OPS(m)->upload(CTX(m), m->sc.logits, logits, V * sizeof(float)));
    float u = hyla_rng_uniform(&s->rng);
    HYLA_TRY(OPS(m)->sample(CTX(m), m->sc.logits, 1, (int)V, &s->sp, &u, out));
    s->pending = *out;
    s->generated++;
    return HYLA_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Snapshots (docs/MODELS.md §8)                                                               */

typedef struct {
    const char *name;
    hyla_part_kind kind;
    hyla_dtype dtype;
    uint32_t ndim;
    uint64_t shape[4];
    float **dev; /* where the data lives (recurrent/partition) */
} part_desc;

/* The parts layer l of session s declares. Returns the count (<= 4). */
static int layer_parts(hyla_session *s, int l, part_desc *pd) {
    const hyla_model_config *c = &s->m->cfg;
    layer_state *ls = &s->ls[l];
    uint64_t H = (uint64_t)c->num_heads, dk = (uint64_t)c->head_k_dim, dv = (uint64_t)c->head_v_dim;
    int n = 0;
    switch (c->mixer[l]) {
    case HYLA_MIXER_GLA:
    case HYLA_MIXER_GDN:
        pd[n++] = (part_desc){"S", HYLA_PART_RECURRENT, HYLA_DT_F32, 3, {H, dk, dv, 0}, &ls->S};
        if (c->use_short_conv) {
            static const char *names[3] = {"conv_q", "conv_k", "conv_v"};
            for (int j = 0; j < 3; j++)
                pd[n++] = (part_desc){names[j], HYLA_PART_RECURRENT, HYLA_DT_F32, 2,
                                      {(uint64_t)c->conv_size - 1, conv_channels(c, j), 0, 0}, &ls->conv[j]};
        }
        break;
    case HYLA_MIXER_SSE:
        pd[n++] = (part_desc){"S0", HYLA_PART_RECURRENT, HYLA_DT_F32, 3, {H, dk, dv, 0}, &ls->S};
        pd[n++] = (part_desc){"Sp", HYLA_PART_PARTITION, HYLA_DT_F32, 4, {(uint64_t)c->sse_partitions, H, dk, dv}, &ls->Sp};
        break;
    case HYLA_MIXER_ATTN: {
        uint64_t T = (uint64_t)s->pos, Hk = (uint64_t)c->attn_kv_heads, hd = (uint64_t)c->attn_head_dim;
        hyla_dtype kd = OPS(s->m)->kv_dtype;
        pd[n++] = (part_desc){"k", HYLA_PART_KV, kd, 3, {T, Hk, hd, 0}, NULL};
        pd[n++] = (part_desc){"v", HYLA_PART_KV, kd, 3, {T, Hk, hd, 0}, NULL};
        break;
    }
    }
    return n;
}

/* ---- snapshot buffers: pinned host memory for exports, cached per model ----
 * An export's parts live in one arena buffer from ops->host_alloc (page-locked on CUDA, so the
 * device copies into it directly). Allocating page-locked memory is slow and may synchronise
 * the device, so a released buffer is kept for the next export. Snapshots may be destroyed on
 * any thread (the worker's I/O thread destroys them after the put), so the release callback only
 * files its buffer under the mutex: as idle, or, over the bound, on the `doomed` list that the
 * driving thread host_frees at its next export or at hyla_model_free. Bound: SNAPBUF_IDLE_MAX
 * idle buffers and SNAPBUF_IDLE_BYTES idle bytes, smallest dropped first, the largest always
 * kept (so a large session exported again and again reuses it). A buffer starts with a
 * SNAPBUF_HDR-byte header (its size, the doomed-list link); the arena follows. */
#define SNAPBUF_HDR 64
#define SNAPBUF_IDLE_MAX 4
#define SNAPBUF_IDLE_BYTES ((size_t)1 << 30)

typedef struct {
    uint8_t *p;   /* what host_alloc returned */
    size_t bytes; /* its size, header included */
} snapbuf;

struct hyla_snapbufs {
    pthread_mutex_t mu; /* guards everything below */
    snapbuf idle[SNAPBUF_IDLE_MAX + 1];
    int n_idle;
    size_t idle_bytes;
    uint8_t *doomed; /* list linked through the headers */
    int out;         /* buffers held by live snapshots */
};

typedef struct {
    size_t bytes;
    uint8_t *next;
} snapbuf_hdr;

static snapbuf_hdr *hdr_of(uint8_t *p) { return (snapbuf_hdr *)(void *)p; }

/* Buffer sizes in classes (steps of a quarter of the power of two below; 64 KiB steps up to
 * 1 MiB), so a session whose KV grows a little reuses the buffer of its previous export. */
static size_t snapbuf_class(size_t need) {
    if (need <= ((size_t)1 << 20)) return (need + 65535) & ~(size_t)65535;
    size_t q = (size_t)1 << 18; /* quarter of 1 MiB */
    while (q * 8 <= need) q <<= 1;
    return (need + q - 1) / q * q;
}

static void snapbuf_release(void *ctx, void *base) {
    hyla_snapbufs *c = ctx;
    uint8_t *p = (uint8_t *)base - SNAPBUF_HDR;
    pthread_mutex_lock(&c->mu);
    c->out--;
    c->idle[c->n_idle].p = p;
    c->idle[c->n_idle].bytes = hdr_of(p)->bytes;
    c->idle_bytes += hdr_of(p)->bytes;
    c->n_idle++;
    while (c->n_idle > 1 && (c->n_idle > SNAPBUF_IDLE_MAX || c->idle_bytes > SNAPBUF_IDLE_BYTES)) {
        int k = 0;
        for (int i = 1; i < c->n_idle; i++)
            if (c->idle[i].bytes < c->idle[k].bytes) k = i;
        uint8_t *d = c->idle[k].p;
        c->idle_bytes -= c->idle[k].bytes;
        c->idle[k] = c->idle[--c->n_idle];
        hdr_of(d)->next = c->doomed; /* host_free belongs to the driving thread */
        c->doomed = d;
    }
    pthread_mutex_unlock(&c->mu);
}

/* An arena of at least `need` bytes (64-byte aligned) for a snapshot: *base; give it back
 * through snapbuf_release. Driving thread. */
static hyla_status snapbuf_get(hyla_model *m, size_t need, uint8_t **base) {
    *base = NULL;
    hyla_snapbufs *c = m->snapbufs;
    if (!c) {
        if (!(c = calloc(1, sizeof *c))) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
        if (pthread_mutex_init(&c->mu, NULL) != 0) {
            free(c);
            return hyla_fail(HYLA_ERR_INTERNAL, "snapshot buffers: pthread_mutex_init failed");
        }
        m->snapbufs = c;
    }
    uint8_t *got = NULL;
    pthread_mutex_lock(&c->mu);
    uint8_t *doomed = c->doomed;
    c->doomed = NULL;
    int k = -1;
    for (int i = 0; i < c->n_idle; i++)
        if (c->idle[i].bytes - SNAPBUF_HDR >= need && (k < 0 || c->idle[i].bytes < c->idle[k].bytes)) k = i;
    if (k >= 0) {
        got = c->idle[k].p;
        c->idle_bytes -= c->idle[k].bytes;
        c->idle[k] = c->idle[--c->n_idle];
        c->out++;
    }
    pthread_mutex_unlock(&c->mu);
    while (doomed) {
        uint8_t *next = hdr_of(doomed)->next;
        OPS(m)->host_free(CTX(m), doomed);
        doomed = next;
    }
    if (!got) {
        size_t bytes = snapbuf_class(need + SNAPBUF_HDR);
        void *p = NULL;
        hyla_status st = OPS(m)->host_alloc(CTX(m), bytes, &p);
        if (st != HYLA_OK) return hyla_fail_wrap(st, "allocating a %zu-byte snapshot buffer", bytes);
        HYLA_ASSERT(((uintptr_t)p & 63) == 0);
        got = p;
        hdr_of(got)->bytes = bytes;
        pthread_mutex_lock(&c->mu);
        c->out++;
        pthread_mutex_unlock(&c->mu);
    }
    *base = got + SNAPBUF_HDR;
    return HYLA_OK;
}

void hyla_snapbufs_destroy(hyla_model *m) {
    hyla_snapbufs *c = m->snapbufs;
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    /* a live snapshot would give its buffer back to freed memory (hyla_session.h) */
    HYLA_ASSERT(c->out == 0 && "snapshots exported from this model must be destroyed before hyla_model_free");
    for (int i = 0; i < c->n_idle; i++) OPS(m)->host_free(CTX(m), c->idle[i].p);
    for (uint8_t *d = c->doomed, *next; d; d = next) {
        next = hdr_of(d)->next;
        OPS(m)->host_free(CTX(m), d);
    }
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_destroy(&c->mu);
    free(c);
    m->snapbufs = NULL;
}

/* ---- export ----
 * begin: the snapshot's parts are carved from one snapshot buffer; the mutable parts
 * (recurrent, partition, conv) are first copied on the device (ops->copy, in stream order) into
 * staging slots of their own size (the same pool classes as the states, so no new device
 * allocation in steady state), because later ops overwrite the states; the KV rows below the
 * position never change again, so their pages are captured in place (only the used bytes of the
 * last page: the next token's row is written while the copy may still run). One
 * ops->capture_begin queues all device->host copies; nothing waits for the device. */
typedef struct {
    void *slot;        /* staging slot (device), freed at end */
    const void *state; /* the state it copies */
    size_t bytes;
} export_stage;

struct hyla_export {
    hyla_session *s;
    hyla_snapshot *snap;
    hyla_capture *ticket;
    export_stage *stage; /* [n_stage] the mutable parts */
    int n_stage;
};

static void export_free(hyla_export *e) {
    hyla_model *m = e->s->m;
    for (int i = 0; i < e->n_stage; i++) OPS(m)->free(CTX(m), e->stage[i].slot);
    hyla_snapshot_destroy(e->snap);
    free(e->stage);
    free(e);
}

/* Fill the snapshot's parts (carved from its arena), allocate the staging slots and list the
 * device->host copies: dst/src/len [*nc]. */
static hyla_status export_plan(hyla_export *e, void **dst, const void **src, size_t *len, int *nc) {
    hyla_session *s = e->s;
    hyla_model *m = s->m;
    size_t pb = kv_page_bytes(m);
    *nc = 0;
    for (int l = m->layer_begin; l < m->layer_end; l++) {
        part_desc pd[4];
        int np = layer_parts(s, l, pd);
        for (int i = 0; i < np; i++) {
            hyla_state_part *p;
            HYLA_TRY(hyla_snapshot_add_part(e->snap, (uint32_t)l, pd[i].name, pd[i].kind, pd[i].dtype, pd[i].ndim,
                                            pd[i].shape, pd[i].kind == HYLA_PART_KV ? HYLA_KV_PAGE_TOKENS : 0, &p));
            if (pd[i].kind != HYLA_PART_KV) {
                export_stage *g = &e->stage[e->n_stage];
                HYLA_TRY(OPS(m)->alloc(CTX(m), (size_t)p->nbytes, &g->slot));
                g->state = *pd[i].dev;
                g->bytes = (size_t)p->nbytes;
                e->n_stage++;
                dst[*nc] = p->data;
                src[*nc] = g->slot;
                len[(*nc)++] = g->bytes;
                continue;
            }
            void **pages = pd[i].name[0] == 'k' ? s->ls[l].kpages : s->ls[l].vpages;
            for (uint64_t off = 0; off < p->nbytes; off += pb) {
                dst[*nc] = (uint8_t *)p->data + off;
                src[*nc] = pages[off / pb];
                len[(*nc)++] = p->nbytes - off < pb ? (size_t)(p->nbytes - off) : pb;
            }
        }
    }
    return HYLA_OK;
}

hyla_status hyla_session_export_begin(hyla_session *s, hyla_export **out) {
    *out = NULL;
    hyla_model *m = s->m;
    const hyla_ops *o = OPS(m);
    size_t pb = kv_page_bytes(m);
    /* sizes and counts first: one arena, one copy list */
    uint64_t arena = 0;
    int n_parts = 0, n_stage = 0, n_copies = 0;
    for (int l = m->layer_begin; l < m->layer_end; l++) {
        part_desc pd[4];
        int np = layer_parts(s, l, pd);
        for (int i = 0; i < np; i++) {
            uint64_t n = hyla_dtype_size(pd[i].dtype);
            for (uint32_t d = 0; d < pd[i].ndim; d++) n *= pd[i].shape[d];
            arena += hyla_snapshot_arena_piece(n);
            n_parts++;
            if (pd[i].kind == HYLA_PART_KV) {
                n_copies += (int)((n + pb - 1) / pb);
            } else {
                n_stage++;
                n_copies++;
            }
        }
    }
    hyla_export *e = calloc(1, sizeof *e);
    void **dst = malloc((size_t)(n_copies + 1) * sizeof *dst);
    const void **src = malloc((size_t)(n_copies + 1) * sizeof *src);
    size_t *len = malloc((size_t)(n_copies + 1) * sizeof *len);
    hyla_status st = HYLA_OK;
    if (!e || !dst || !src || !len || !(e->stage = calloc((size_t)n_stage + 1, sizeof *e->stage))) {
        free(e);
        free(dst);
        free(src);
        free(len);
        return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    }
    e->s = s;
    uint8_t *base = NULL;
    st = snapbuf_get(m, (size_t)arena, &base);
    if (st == HYLA_OK && !(e->snap = hyla_snapshot_create_arena(base, (size_t)arena, snapbuf_release, m->snapbufs))) {
        snapbuf_release(m->snapbufs, base);
        st = hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    }
    if (st == HYLA_OK) {
        hyla_snapshot *snap = e->snap;
        snap->model_fingerprint = m->fingerprint;
        snap->position = (uint64_t)s->pos;
        snap->n_generated = (uint64_t)s->generated;
        snap->pending_token = s->pending;
        snap->sampler.temperature = s->sp.temperature;
        snap->sampler.top_k = s->sp.top_k;
        snap->sampler.top_p = s->sp.top_p;
        snap->sampler.seed = s->seed;
        memcpy(snap->rng, s->rng.s, sizeof snap->rng);
    }
    int nc = 0;
    if (st == HYLA_OK) st = export_plan(e, dst, src, len, &nc);
    HYLA_ASSERT(st != HYLA_OK || (nc == n_copies && e->n_stage == n_stage && e->snap->n_parts == (uint32_t)n_parts));
    /* the device copies of the mutable states, in stream order after everything queued so far;
     * queued after all staging allocations, so a backend that logs ops keeps them together */
    for (int i = 0; st == HYLA_OK && i < e->n_stage; i++)
        st = o->copy(CTX(m), e->stage[i].slot, e->stage[i].state, e->stage[i].bytes);
    if (st == HYLA_OK) st = o->capture_begin(CTX(m), nc, dst, src, len, &e->ticket);
    free(dst);
    free(src);
    free(len);
    if (st != HYLA_OK) {
        export_free(e); /* staging slots: nothing reads them once the queued copies into them ran */
        return hyla_fail_wrap(st, "exporting session state");
    }
    /* The snapshot covers the whole model even when this stage holds a range. */
    e->snap->n_layers = (uint32_t)m->cfg.num_layers;
    s->exports++;
    *out = e;
    return HYLA_OK;
}

int hyla_session_export_done(hyla_export *e) {
    hyla_model *m = e->s->m;
    return OPS(m)->capture_done(CTX(m), e->ticket);
}

hyla_status hyla_session_export_end(hyla_export *e, hyla_snapshot **out) {
    if (out) *out = NULL;
    hyla_model *m = e->s->m;
    hyla_status st = OPS(m)->capture_end(CTX(m), e->ticket);
    e->ticket = NULL;
    e->s->exports--;
    if (st == HYLA_OK && out) {
        *out = e->snap;
        e->snap = NULL;
    }
    export_free(e); /* staging slots: the copies that read them are done */
    return st == HYLA_OK ? HYLA_OK : hyla_fail_wrap(st, "exporting session state");
}

hyla_status hyla_session_export(hyla_session *s, hyla_snapshot **out) {
    *out = NULL;
    hyla_export *e;
    HYLA_TRY(hyla_session_export_begin(s, &e));
    return hyla_session_export_end(e, out);
}

static void fmt_shape(char *buf, size_t n, const uint64_t *shape, uint32_t ndim) {
    size_t o = (size_t)snprintf(buf, n, "[");
    for (uint32_t i = 0; i < ndim && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, i ? ", %llu" : "%llu", (unsigned long long)shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

hyla_status hyla_session_import(hyla_model *m, const hyla_snapshot *snap, hyla_session **out) {
    *out = NULL;
    if (snap->format_version != HYLA_SNAPSHOT_FORMAT_VERSION)
        return hyla_fail(HYLA_ERR_FORMAT, "snapshot format version %u is not supported (this build reads %u)",
                         snap->format_version, HYLA_SNAPSHOT_FORMAT_VERSION);
    if (snap->model_fingerprint != m->fingerprint)
        return hyla_fail(HYLA_ERR_MISMATCH,
                         "snapshot was taken on another model (fingerprint %016llx, this model %016llx at %s)",
                         (unsigned long long)snap->model_fingerprint, (unsigned long long)m->fingerprint, m->dir);
    if (snap->pending_token >= m->cfg.vocab_size)
        return hyla_fail(HYLA_ERR_FORMAT, "snapshot pending token %d is outside the vocabulary", snap->pending_token);
    hyla_session *s;
    HYLA_TRY(hyla_session_create(m, &s));
    s->pos = (int64_t)snap->position;
    s->generated = (int64_t)snap->n_generated;
    s->pending = snap->pending_token;
    s->sp.temperature = snap->sampler.temperature;
    s->sp.top_k = snap->sampler.top_k;
    s->sp.top_p = snap->sampler.top_p;
    s->seed = snap->sampler.seed;
    memcpy(s->rng.s, snap->rng, sizeof snap->rng);
    hyla_status st = HYLA_OK;
    for (int l = m->layer_begin; st == HYLA_OK && l < m->layer_end; l++) {
        part_desc pd[4];
        int np = layer_parts(s, l, pd);
        for (int i = 0; st == HYLA_OK && i < np; i++) {
            const hyla_state_part *p = hyla_snapshot_find(snap, (uint32_t)l, pd[i].name);
            if (!p) {
                st = hyla_fail(HYLA_ERR_FORMAT, "snapshot lacks part '%s' of layer %d (%s)", pd[i].name, l,
                               hyla_mixer_name(m->cfg.mixer[l]));
                break;
            }
            int shape_ok = p->ndim == pd[i].ndim && p->kind == (uint32_t)pd[i].kind;
            for (uint32_t d = 0; shape_ok && d < p->ndim; d++) shape_ok = p->shape[d] == pd[i].shape[d];
            int kv = pd[i].kind == HYLA_PART_KV;
            int dtype_ok = p->dtype == (uint32_t)pd[i].dtype ||
                           (kv && (p->dtype == HYLA_DT_F32 || p->dtype == HYLA_DT_BF16 || p->dtype == HYLA_DT_F16));
            if (!shape_ok || !dtype_ok) {
                char got[96], want[96];
                fmt_shape(got, sizeof got, p->shape, p->ndim);
                fmt_shape(want, sizeof want, pd[i].shape, pd[i].ndim);
                st = hyla_fail(HYLA_ERR_MISMATCH, "layer %d part '%s': snapshot has %s %s %s, this model needs %s %s %s", l,
                               pd[i].name, hyla_part_kind_name((hyla_part_kind)p->kind), hyla_dtype_name((hyla_dtype)p->dtype),
                               got, hyla_part_kind_name(pd[i].kind), hyla_dtype_name(pd[i].dtype), want);
                break;
            }
            if (!kv) {
                st = OPS(m)->upload(CTX(m), *pd[i].dev, p->data, p->nbytes);
                continue;
            }
            if ((st = ensure_pages(s, l, s->pos)) != HYLA_OK) break;
            void **pages = pd[i].name[0] == 'k' ? s->ls[l].kpages : s->ls[l].vpages;
            size_t pb = kv_page_bytes(m), es = hyla_dtype_size(pd[i].dtype), ps = hyla_dtype_size((hyla_dtype)p->dtype);
            size_t page_elems = pb / es;
            uint64_t elems = p->nbytes / ps;
            void *conv = NULL;
            if (p->dtype != (uint32_t)pd[i].dtype && !(conv = malloc(pb))) {
                st = hyla_fail(HYLA_ERR_NOMEM, "out of memory");
                break;
            }
            float *tmp = conv ? malloc(page_elems * sizeof(float)) : NULL;
            if (conv && !tmp) {
                free(conv);
                st = hyla_fail(HYLA_ERR_NOMEM, "out of memory");
                break;
            }
            for (uint64_t e0 = 0, pg = 0; st == HYLA_OK && e0 < elems; e0 += page_elems, pg++) {
                size_t cnt = elems - e0 < page_elems ? (size_t)(elems - e0) : page_elems;
                const uint8_t *src = (const uint8_t *)p->data + e0 * ps;
                if (conv) {
                    hyla_to_f32(tmp, src, (hyla_dtype)p->dtype, cnt);
                    hyla_from_f32(conv, pd[i].dtype, tmp, cnt);
                    src = conv;
                }
                st = OPS(m)->upload(CTX(m), pages[pg], src, cnt * es);
            }
            free(conv);
            free(tmp);
        }
    }
    if (st != HYLA_OK) {
        hyla_session_free(s);
        return st;
    }
    *out = s;
    return HYLA_OK;
}
