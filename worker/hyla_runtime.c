/* hyla_runtime.c — what sessions run on (hyla_runtime.h): scratch activations, the layer loop
 * (norm -> mixer -> residual + norm -> MLP -> residual, then the head or the downstream stages),
 * the asynchronous downstream (steps posted, finished when their answers are needed; decode
 * steps in micro-batches of contiguous rows at their offsets of the buffers), and the cache of
 * pinned snapshot buffers.
 *
 * The forward runs R rows through the held layers in one of two modes:
 *   prefill: R consecutive tokens of ONE session (a piece: from the position to the next
 *            multiple of the model's prefill chunk, or, from a multiple, up to prefill_piece tokens);
 *   decode:  one token for each of R sessions.
 * Dense work (norms, projections, MLP) is identical in both modes and row-independent; the mixer
 * modules (hyla_mixer.h) do the rest.
 *
 * Threading: one thread drives a runtime (the backend's); snapshot buffers go back to the cache
 * from any thread (under its mutex). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_log.h"
#include "hyla_profile.h"
#include "hyla_runtime_impl.h"
#include "hyla_snapshot.h"

static void scratch_free(hyla_runtime *rt) {
    const hyla_ops *o = rt->be->ops;
    void *ctx = rt->be->ctx;
    o->free(ctx, rt->x);
    o->free(ctx, rt->xn);
    o->free(ctx, rt->mo);
    o->free(ctx, rt->mlp_g);
    o->free(ctx, rt->mlp_u);
    o->free(ctx, rt->mixer_scratch);
    free(rt->host_ptrs);
    rt->x = rt->xn = rt->mo = rt->mlp_g = rt->mlp_u = NULL;
    rt->mixer_scratch = NULL;
    rt->host_ptrs = NULL;
    rt->rows = 0;
    rt->act_bytes = 0;
}

static void logits_free(hyla_runtime *rt) {
    rt->be->ops->free(rt->be->ctx, rt->logits);
    rt->logits = NULL;
    rt->logit_rows = 0;
}

hyla_status hyla_runtime_reserve(hyla_runtime *rt, int rows, int logit_rows) {
    if (rows <= rt->rows && logit_rows <= rt->logit_rows) return HYLA_OK;
    if (rt->lanes_busy) /* a lane's logits may still land in the buffers about to go */
        return hyla_fail(HYLA_ERR_INTERNAL, "the scratch would grow to %d rows (%d of logits) under %d posted decode lanes",
                         rows, logit_rows, rt->lanes_busy);
    /* posted rows may still be read from (or logits written to) the buffers about to go */
    HYLA_TRY(hyla_runtime_finish(rt));
    const hyla_model *m = rt->m;
    const hyla_model_config *c = &m->cfg;
    const hyla_ops *o = rt->be->ops;
    void *ctx = rt->be->ctx;
    size_t D = (size_t)c->hidden_size, F = (size_t)c->intermediate_size, V = (size_t)c->vocab_size;
    if (logit_rows > rt->logit_rows) {
        int lwant = logit_rows < 2 * rt->logit_rows ? 2 * rt->logit_rows : logit_rows;
        logits_free(rt);
        hyla_status s = o->alloc(ctx, (size_t)lwant * V * sizeof(float), (void **)&rt->logits);
        if (s != HYLA_OK) return hyla_fail_wrap(s, "allocating logits scratch for %d rows of %zu", lwant, V);
        rt->logit_rows = lwant;
    }
    if (rows <= rt->rows) return HYLA_OK;
    int want = rows < 2 * rt->rows ? 2 * rt->rows : rows;
    scratch_free(rt);
    size_t mix = 0;
    for (int l = m->layer_begin; l < m->layer_end; l++) {
        const hyla_layer *ly = &m->layers[l];
        size_t b = ly->mixer->scratch_bytes(c, ly->cfg, want);
        if (b > mix) mix = b;
    }
    hyla_status s = o->alloc(ctx, want * D * sizeof(float), (void **)&rt->x);
    if (s == HYLA_OK) s = o->alloc(ctx, want * D * sizeof(float), (void **)&rt->xn);
    if (s == HYLA_OK) s = o->alloc(ctx, want * D * sizeof(float), (void **)&rt->mo);
    if (s == HYLA_OK) s = o->alloc(ctx, want * F * sizeof(float), (void **)&rt->mlp_g);
    if (s == HYLA_OK) s = o->alloc(ctx, want * F * sizeof(float), (void **)&rt->mlp_u);
    if (s == HYLA_OK) s = o->alloc(ctx, mix ? mix : 1, &rt->mixer_scratch);
    if (s == HYLA_OK && !(rt->host_ptrs = calloc((size_t)HYLA_MIXER_HOST_PTRS * want, sizeof(void *))))
        s = hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    if (s != HYLA_OK) {
        scratch_free(rt);
        return hyla_fail_wrap(s, "allocating activation scratch for %d rows", want);
    }
    rt->rows = want;
    rt->act_bytes = (size_t)want * (3 * D + 2 * F) * sizeof(float) + (mix ? mix : 1);
    return HYLA_OK;
}

int hyla_runtime_prefill_chunk(const hyla_runtime *rt) { return rt->m->cfg.prefill_chunk; }

hyla_status hyla_runtime_set_prefill_piece(hyla_runtime *rt, int tokens) {
    const int C = hyla_runtime_prefill_chunk(rt);
    if (tokens < C || tokens > HYLA_PREFILL_PIECE_MAX || tokens % C)
        return hyla_fail(HYLA_ERR_INVALID_ARG,
                         "prefill piece of %d tokens: must be a multiple of %d in [%d, %d] (the model's prefill chunk%s)",
                         tokens, C, C, HYLA_PREFILL_PIECE_MAX,
                         C > HYLA_PREFILL_CHUNK ? ": the alignment its layers ask, an SSE layer's prefill_window" : "");
    rt->prefill_piece = tokens;
    return HYLA_OK;
}

int hyla_runtime_prefill_piece(const hyla_runtime *rt) { return rt->prefill_piece; }
int hyla_runtime_logit_rows(const hyla_runtime *rt) { return rt->logit_rows; }
size_t hyla_runtime_scratch_bytes(const hyla_runtime *rt, size_t *logits_bytes) {
    size_t lb = (size_t)rt->logit_rows * (size_t)rt->m->cfg.vocab_size * sizeof(float);
    if (logits_bytes) *logits_bytes = lb;
    return rt->act_bytes + lb;
}

hyla_status hyla_runtime_set_token_log(hyla_runtime *rt, int tokens) {
    if (tokens < 1 || tokens > (int)HYLA_TOKEN_LOG_MAX)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "token log of %d tokens: must be 1..%u", tokens, HYLA_TOKEN_LOG_MAX);
    rt->token_log = tokens;
    return HYLA_OK;
}
int hyla_runtime_token_log(const hyla_runtime *rt) { return rt->token_log; }

void hyla_runtime_set_allreduce_aside(hyla_runtime *rt, hyla_allreduce_begin_fn begin, hyla_allreduce_join_fn join) {
    rt->allreduce_begin = begin && join ? begin : NULL;
    rt->allreduce_join = begin && join ? join : NULL;
}

long hyla_runtime_wave_pieces(const hyla_runtime *rt) { return rt->wave_pieces; }

void hyla_runtime_set_allreduce_onto(hyla_runtime *rt, hyla_allreduce_onto_fn fn, float *buf0, float *buf1,
                                     size_t max) {
    const int on = fn && buf0 && buf1 && max;
    rt->allreduce_onto = on ? fn : NULL;
    rt->onto_buf[0] = on ? buf0 : NULL;
    rt->onto_buf[1] = on ? buf1 : NULL;
    rt->onto_max = on ? max : 0;
    rt->onto_j = 0;
}

void hyla_runtime_reset_allreduce_onto(hyla_runtime *rt) { rt->onto_j = 0; }

void hyla_runtime_set_allreduce(hyla_runtime *rt, hyla_allreduce_fn fn, void *ud) {
    rt->allreduce = fn;
    rt->allreduce_ud = ud;
}

/* hyla_runtime_set_downstream: a synchronous function behind the asynchronous table (each post
 * runs the remaining stages at once; finish has nothing to wait for). */
static hyla_status sync_post(void *ud, const hyla_downstream_step *s) {
    hyla_runtime *rt = ud;
    return rt->sync_fn(rt->sync_ud, s->ss, s->R, s->decode, s->hidden, s->logits);
}
static hyla_status sync_finish(void *ud, int keep) {
    (void)ud, (void)keep;
    return HYLA_OK;
}
static const hyla_downstream_ops sync_ops = {sync_post, NULL, sync_finish, NULL};

void hyla_runtime_set_downstream(hyla_runtime *rt, hyla_downstream_fn fn, void *ud) {
    rt->sync_fn = fn;
    rt->sync_ud = ud;
    rt->ds = fn ? &sync_ops : NULL;
    rt->ds_ud = rt;
}

void hyla_runtime_set_downstream_ops(hyla_runtime *rt, const hyla_downstream_ops *ops, void *ud) {
    HYLA_ASSERT(!ops || (ops->post && ops->finish));
    rt->ds = ops;
    rt->ds_ud = ud;
}

hyla_status hyla_runtime_set_micro_batches(hyla_runtime *rt, int m) {
    if (m < 1 || m > HYLA_MICRO_BATCH_MAX)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "%d micro-batches: must be 1..%d", m, HYLA_MICRO_BATCH_MAX);
    rt->micro_batches = m;
    return HYLA_OK;
}
int hyla_runtime_micro_batches(const hyla_runtime *rt) { return rt->micro_batches; }

hyla_status hyla_runtime_stage_buffers(hyla_runtime *rt, int rows, int logit_rows, float **x_dev, float **logits_dev) {
    HYLA_TRY(hyla_runtime_reserve(rt, rows, logit_rows));
    *x_dev = rt->x;
    *logits_dev = rt->logits;
    return HYLA_OK;
}

const hyla_model *hyla_runtime_model(const hyla_runtime *rt) { return rt->m; }
hyla_snapbufs *hyla_runtime_snapbufs(hyla_runtime *rt) { return rt->snapbufs; }

static void snapbufs_destroy(hyla_runtime *rt);
static void stagebufs_destroy(hyla_runtime *rt);

hyla_status hyla_runtime_create(const hyla_model *m, hyla_runtime **out) {
    *out = NULL;
    hyla_prof_init();
    hyla_runtime *rt = calloc(1, sizeof *rt);
    if (!rt) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    rt->m = m;
    rt->be = hyla_model_backend(m);
    const int C = m->cfg.prefill_chunk;
    rt->prefill_piece = rt->be->prefill_piece >= HYLA_PREFILL_CHUNK && rt->be->prefill_piece <= HYLA_PREFILL_PIECE_MAX &&
                                rt->be->prefill_piece % HYLA_PREFILL_CHUNK == 0
                            ? rt->be->prefill_piece
                            : HYLA_PREFILL_PIECE_DEFAULT;
    /* a multiple of the model's prefill chunk (SSE's window may exceed the backend's piece); both
     * are powers of two up to HYLA_PREFILL_PIECE_MAX, so the rounding stays within it */
    if (rt->prefill_piece % C) rt->prefill_piece = (rt->prefill_piece / C + 1) * C;
    rt->micro_batches = 2;
    rt->token_log = (int)HYLA_TOKEN_LOG_MAX;
    hyla_status s = HYLA_OK;
    const char *pe = getenv("HYLA_PREFILL_PIECE");
    if (pe && *pe) {
        char *end;
        long v = strtol(pe, &end, 10);
        s = *end ? hyla_fail(HYLA_ERR_INVALID_ARG, "HYLA_PREFILL_PIECE='%s' is not a number", pe)
                 : hyla_runtime_set_prefill_piece(rt, v > 0 && v <= HYLA_PREFILL_PIECE_MAX ? (int)v : -1);
        if (s != HYLA_OK) s = hyla_fail_wrap(s, "environment variable HYLA_PREFILL_PIECE");
    }
    if (s == HYLA_OK) s = hyla_runtime_reserve(rt, C, 0);
    if (s != HYLA_OK) {
        hyla_runtime_free(rt);
        return s;
    }
    *out = rt;
    return HYLA_OK;
}

void hyla_runtime_free(hyla_runtime *rt) {
    if (!rt) return;
    snapbufs_destroy(rt);
    stagebufs_destroy(rt);
    scratch_free(rt);
    logits_free(rt);
    free(rt->hlogits);
    free(rt->hhidden);
    free(rt);
}

/* ------------------------------------------------------------------------------------------ */
/* Forward                                                                                     */

/* Whether R decode rows of width D take the norms' bf16 rows (hyla_ops.h decode_bf16_rows; the
 * backend must have rmsnorm_bf16 to write them) */
static int decode_bf16(const hyla_ops *o, void *ctx, int decode, int R, int D) {
    return decode && o->rmsnorm_bf16 && o->decode_bf16_rows && o->decode_bf16_rows(ctx, R, D);
}

/* The LM head: the final norm of R rows into rt->xn, then the logits: decode rows through
 * ops->linear (or, from the norm's bf16 rows, linear_multi with HYLA_LINEAR_X_BF16), prompt rows
 * through linear_multi with HYLA_LINEAR_PREFILL (as hyla_mixer_linear). */
static hyla_status lm_head(hyla_runtime *rt, int decode, int R, float *x, float *lg) {
    const hyla_model *m = rt->m;
    const hyla_model_config *c = &m->cfg;
    const hyla_ops *o = rt->be->ops;
    void *ctx = rt->be->ctx;
    const int D = c->hidden_size, V = c->vocab_size, db = decode_bf16(o, ctx, decode, R, D);
    if (db) HYLA_TRY(o->rmsnorm_bf16(ctx, x, NULL, m->final_norm, rt->xn, R, D, c->norm_eps));
    else HYLA_TRY(o->rmsnorm(ctx, x, m->final_norm, rt->xn, R, D, c->norm_eps));
    if (decode && !db) return o->linear(ctx, rt->xn, D, R, D, m->lm_head, NULL, lg, V, V, 0);
    hyla_linear_out lo = {m->lm_head, NULL, lg, V, V, NULL, 0};
    return o->linear_multi(ctx, rt->xn, D, R, D, 1, &lo, 0, decode ? HYLA_LINEAR_X_BF16 : HYLA_LINEAR_PREFILL);
}

#define PM(label)                                                        \
    do {                                                                 \
        if (hyla_prof_on) hyla_prof_mark(o, ctx, decode, (label));      \
    } while (0)

/* A tensor-parallel prefill piece in two halves, so that the sums travel while the GPU computes:
 * each layer runs half A's mixer, begins A's sum, runs half B's mixer (which needs A's state of
 * this layer only) while A's sum travels, begins B's, then A's MLP while B's sum travels, and so
 * on; only the last sum of the piece is waited for with nothing beside it. The halves are split
 * at a multiple of the model's prefill chunk from the piece's start (itself on a boundary), so
 * each half is a piece the session could have been fed as, and every mixer's arithmetic for
 * its rows is that piece's: the bits are those of the two pieces one after the other (prefill
 * pieces do not change the bits). Half B uses the scratch rows after half A's (x, xn, mo and
 * the MLP buffers have a row each; where xn or the MLP's gate and up hold bf16 rows, half B's
 * start at the same float offset, where both their writer and their reader look); the mixers'
 * scratch is shared, in stream order. Each sum of a half's partial outputs (mo) lands on that
 * half's rows of x itself (the hook's acc: x + sum, the add's rounding), which nothing touches
 * while it travels, so the norms after it read x alone. */
static hyla_status run_layers_wave(hyla_runtime *rt, int R, const int32_t *pos, hyla_state *const *st, float *x) {
    const hyla_model *m = rt->m;
    const hyla_model_config *c = &m->cfg;
    const hyla_ops *o = rt->be->ops;
    void *ctx = rt->be->ctx;
    const int decode = 0;
    void *ud = rt->allreduce_ud;
    size_t D = (size_t)c->hidden_size, F = (size_t)c->intermediate_size;
    const int C = c->prefill_chunk;
    int a = R / 2 / C * C;
    int n[2] = {a, R - a}, off[2] = {0, a};
    float *xh[2] = {x, x + a * D}, *xn[2] = {rt->xn, rt->xn + a * D}, *mo[2] = {rt->mo, rt->mo + a * D};
    float *g[2] = {rt->mlp_g, rt->mlp_g + a * F}, *u[2] = {rt->mlp_u, rt->mlp_u + a * F};
    int tk[2] = {-1, -1}, busy[2] = {0, 0}; /* busy: a sum of mo[h] onto x's half h in flight */
    const int nb = o->rmsnorm_bf16 != NULL; /* the norms write the prompt GEMMs' bf16 operand */
    const int xf = HYLA_LINEAR_PREFILL | (nb ? HYLA_LINEAR_X_BF16 : 0);
    const int gf = nb ? HYLA_LINEAR_Y_BF16 : 0, hf = nb ? HYLA_LINEAR_X_BF16 : 0; /* the MLP's gate and up */
    hyla_layer_state *ls[1];
    hyla_status s = HYLA_OK;
    rt->wave_pieces++;
#define WAVE_JOIN(h)                                                                  \
    do {                                                                              \
        if (busy[h] && (s = rt->allreduce_join(ud, tk[h])) != HYLA_OK) goto wave_out; \
        busy[h] = 0;                                                                  \
    } while (0)
#define WAVE_BEGIN(h)                                                                                    \
    do {                                                                                                 \
        if ((s = rt->allreduce_begin(ud, mo[h], (size_t)n[h] * D, xh[h], &tk[h])) != HYLA_OK) goto wave_out; \
        busy[h] = 1;                                                                                     \
    } while (0)
    for (int l = m->layer_begin; l < m->layer_end; l++) {
        const hyla_layer *ly = &m->layers[l];
        ls[0] = &st[0]->ls[l];
        for (int h = 0; h < 2; h++) {
            WAVE_JOIN(h); /* the sums add onto x themselves: the norms read x alone */
            s = nb ? o->rmsnorm_bf16(ctx, xh[h], NULL, ly->attn_norm, xn[h], n[h], (int)D, c->norm_eps)
                   : o->rmsnorm(ctx, xh[h], ly->attn_norm, xn[h], n[h], (int)D, c->norm_eps);
            if (s != HYLA_OK) goto wave_out;
            PM("norm");
            hyla_mixer_fwd mf = {o,   ctx,          c,    ly->cfg, ly->w, l, decode, n[h], rt->rows, pos + off[h],
                                 ls,  xn[h],        mo[h], rt->mixer_scratch, rt->host_ptrs, nb,
                                 0}; /* partial sums: summed across the ranks before they join x */
            if ((s = ly->mixer->forward(&mf)) != HYLA_OK) {
                s = hyla_fail_wrap(s, "layer %d (%s)", l, ly->mixer->name);
                goto wave_out;
            }
            WAVE_BEGIN(h);
            PM("mixer, tp sum begun");
        }
        if (!ly->mlp_gate) continue; /* a mixer-only layer */
        for (int h = 0; h < 2; h++) {
            WAVE_JOIN(h);
            s = nb ? o->rmsnorm_bf16(ctx, xh[h], NULL, ly->mlp_norm, xn[h], n[h], (int)D, c->norm_eps)
                   : o->rmsnorm(ctx, xh[h], ly->mlp_norm, xn[h], n[h], (int)D, c->norm_eps);
            if (s != HYLA_OK) goto wave_out;
            hyla_linear_out lo[2] = {{ly->mlp_gate, NULL, g[h], (int)F, (int)F, NULL, 0}, {ly->mlp_up, NULL, u[h], (int)F, (int)F, NULL, 0}};
            if ((s = o->linear_multi(ctx, xn[h], (int)D, n[h], (int)D, 2, lo, 0, xf | gf)) != HYLA_OK) goto wave_out;
            s = o->swiglu_linear(ctx, g[h], u[h], n[h], (int)F, ly->mlp_down, mo[h], (int)D, HYLA_LINEAR_PREFILL | hf);
            if (s != HYLA_OK) goto wave_out;
            WAVE_BEGIN(h);
            PM("mlp, tp sum begun");
        }
    }
    for (int h = 0; h < 2; h++) WAVE_JOIN(h);
    PM("last sums");
wave_out:
    /* after a failure, the sums in flight still end before their buffers are reused; the group
     * has failed (the other ranks' sums fail or time out), so their errors add nothing */
    for (int h = 0; h < 2; h++)
        if (busy[h]) (void)rt->allreduce_join(ud, tk[h]);
#undef WAVE_JOIN
#undef WAVE_BEGIN
    return s;
}

/* A tensor-parallel shard's sum of the block output mo [n] (nothing without a group): onto x
 * from the group's buffer (onto: mo is rt->onto_buf[rt->onto_j]; the next sum takes the other),
 * or in place in mo, which the norm after it then adds onto x. */
static hyla_status tp_sum(hyla_runtime *rt, int onto, float *mo, float *x, size_t n) {
    if (!rt->allreduce) return HYLA_OK;
    if (!onto) return rt->allreduce(rt->allreduce_ud, mo, n);
    const int j = rt->onto_j;
    rt->onto_j ^= 1;
    return rt->allreduce_onto(rt->allreduce_ud, j, x, n);
}

/* R rows at x (host arrays of the rows: pos [R]; st [decode ? R : 1]) through the held layers. */
static hyla_status run_layers(hyla_runtime *rt, int decode, int R, const int32_t *pos, hyla_state *const *st, float *x) {
    const hyla_model *m = rt->m;
    const hyla_model_config *c = &m->cfg;
    const hyla_ops *o = rt->be->ops;
    void *ctx = rt->be->ctx;
    int D = c->hidden_size, F = c->intermediate_size, nst = decode ? R : 1;
    /* prompt rows: the norms write the prompt GEMMs' bf16 operand where the backend can (the bits
     * of fp32 rows; hyla_ops.h rmsnorm_bf16), halving the bytes of xn and skipping its rounding */
    const int nb = !decode && o->rmsnorm_bf16;
    /* decode rows that the backend's linears take as bf16 rows (hyla_ops.h decode_bf16_rows):
     * the norms before the projections write those, the linears skip their conversion pass */
    const int db = decode_bf16(o, ctx, decode, R, D);
    const int xf = decode ? (db ? HYLA_LINEAR_X_BF16 : 0) : HYLA_LINEAR_PREFILL | (nb ? HYLA_LINEAR_X_BF16 : 0);
    /* and the MLP's gate and up in bf16 (half the bytes written and read; the values the SwiGLU
     * then sees are rounded once more than decode rows': prompt and decode rows are separate paths) */
    const int gf = nb ? HYLA_LINEAR_Y_BF16 : 0, hf = nb ? HYLA_LINEAR_X_BF16 : 0;
    /* and the mixer's and the MLP's output projections add onto x themselves (the GEMM's
     * accumulate: the rounding of x + output, the add's): no mo written and read again, and the
     * norms after them read x alone. Not under tensor parallelism, whose outputs are partial sums
     * to be summed across the ranks before they join the residual. */
    const int xacc = nb && !rt->allreduce;
    /* Under tensor parallelism, the sums waited for at once onto x where the group has them
     * (hyla_runtime_set_allreduce_onto: CUDA's one-shot sums, the CPU's host sums): the
     * partials go to the group's buffers, alternating, and nothing is owed to the norms. */
    const size_t nx = (size_t)R * D;
    const int onto = rt->allreduce && rt->allreduce_onto && nx <= rt->onto_max && nx % 4 == 0 && (uintptr_t)x % 16 == 0;
    const int C = rt->m->cfg.prefill_chunk;
    if (!decode && rt->allreduce && rt->allreduce_begin && R >= 2 * C && pos[0] % C == 0)
        return run_layers_wave(rt, R, pos, st, x);
    hyla_layer_state **ls = malloc((size_t)nst * sizeof *ls);
    if (!ls) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    hyla_status s = HYLA_OK;
    /* A layer's last residual (x += mo) is owed to the next layer's first norm, which adds it
     * itself (add_rmsnorm: the same values as add then rmsnorm, one pass over x fewer); the
     * last layer's is added after the loop, so x leaves complete. With xacc nothing is owed: the
     * output projections have added onto x already. */
    int owed = 0;
    for (int l = m->layer_begin; s == HYLA_OK && l < m->layer_end; l++) {
        const hyla_layer *ly = &m->layers[l];
        if (nb || db)
            s = o->rmsnorm_bf16(ctx, x, owed ? rt->mo : NULL, ly->attn_norm, rt->xn, R, D, c->norm_eps);
        else if (owed)
            s = o->add_rmsnorm(ctx, x, rt->mo, ly->attn_norm, rt->xn, R, D, c->norm_eps);
        else
            s = o->rmsnorm(ctx, x, ly->attn_norm, rt->xn, R, D, c->norm_eps);
        if (s != HYLA_OK) break;
        owed = 0;
        PM("norm");
        for (int i = 0; i < nst; i++) ls[i] = &st[i]->ls[l];
        float *mo = onto ? rt->onto_buf[rt->onto_j] : xacc ? x : rt->mo;
        hyla_mixer_fwd mf = {o, ctx, c, ly->cfg, ly->w, l, decode, R, rt->rows, pos, ls, rt->xn, mo,
                             rt->mixer_scratch, rt->host_ptrs, nb || db, xacc};
        if ((s = ly->mixer->forward(&mf)) != HYLA_OK) {
            s = hyla_fail_wrap(s, "layer %d (%s)", l, ly->mixer->name);
            break;
        }
        if ((s = tp_sum(rt, onto, mo, x, nx)) != HYLA_OK) break;
        if (rt->allreduce) PM("tp sum");
        if (!ly->mlp_gate) { /* a mixer-only layer (the family has no MLP) */
            owed = !xacc && !onto;
            continue;
        }
        if (nb || db) s = o->rmsnorm_bf16(ctx, x, xacc || onto ? NULL : rt->mo, ly->mlp_norm, rt->xn, R, D, c->norm_eps);
        else if (onto) s = o->rmsnorm(ctx, x, ly->mlp_norm, rt->xn, R, D, c->norm_eps);
        else s = o->add_rmsnorm(ctx, x, rt->mo, ly->mlp_norm, rt->xn, R, D, c->norm_eps);
        if (s != HYLA_OK) break;
        PM("norm");
        hyla_linear_out lo[2] = {{ly->mlp_gate, NULL, rt->mlp_g, F, F, NULL, 0}, {ly->mlp_up, NULL, rt->mlp_u, F, F, NULL, 0}};
        if ((s = o->linear_multi(ctx, rt->xn, D, R, D, 2, lo, 0, xf | gf)) != HYLA_OK) break;
        PM("mlp: gate/up proj");
        /* the SwiGLU and the down projection in one op: prompt rows skip the fp32 pass between */
        mo = onto ? rt->onto_buf[rt->onto_j] : xacc ? x : rt->mo;
        s = o->swiglu_linear(ctx, rt->mlp_g, rt->mlp_u, R, F, ly->mlp_down, mo, D,
                             decode ? 0 : HYLA_LINEAR_PREFILL | hf | (xacc ? HYLA_LINEAR_ACC : 0));
        if (s != HYLA_OK) break;
        PM("mlp: swiglu, down proj");
        if ((s = tp_sum(rt, onto, mo, x, nx)) != HYLA_OK) break;
        if (rt->allreduce) PM("tp sum");
        owed = !xacc && !onto;
    }
    if (s == HYLA_OK && owed) {
        s = o->add(ctx, x, rt->mo, (size_t)R * D);
        PM("residual add");
    }
    free(ls);
    return s;
}

/* Host room for `hidden` rows of hidden states and `logits` rows of logits crossing the host to a
 * post (grown, never shrunk; the logits only when a step wants them there). */
static hyla_status host_room(hyla_runtime *rt, int hidden, int logits) {
    const hyla_model_config *c = &rt->m->cfg;
    if (hidden > rt->hrows) {
        float *h = realloc(rt->hhidden, (size_t)hidden * c->hidden_size * sizeof(float));
        if (!h) return hyla_fail(HYLA_ERR_NOMEM, "out of memory (host rows for the downstream stage)");
        rt->hhidden = h;
        rt->hrows = hidden;
    }
    if (logits > rt->hlrows) {
        float *l = realloc(rt->hlogits, (size_t)logits * c->vocab_size * sizeof(float));
        if (!l) return hyla_fail(HYLA_ERR_NOMEM, "out of memory (host logits from the downstream stage)");
        rt->hlogits = l;
        rt->hlrows = logits;
    }
    return HYLA_OK;
}

/* After a failure: wait out what is posted (the transport has closed what it could not keep
 * paired) and forget the step, keeping the failure's message. */
static hyla_status abandon(hyla_runtime *rt, hyla_status st) {
    if (rt->in_flight) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", hyla_last_error());
        (void)rt->ds->finish(rt->ds_ud, 0);
        st = hyla_fail(st, "%s", msg);
    }
    rt->in_flight = 0;
    rt->step.open = 0;
    memset(rt->lane, 0, sizeof rt->lane); /* their answers are gone: collecting them fails */
    rt->lanes_busy = 0;
    return st;
}

hyla_status hyla_runtime_finish(hyla_runtime *rt) {
    if (!rt->ds || (!rt->in_flight && !rt->step.open)) return HYLA_OK;
    hyla_status st = rt->in_flight ? rt->ds->finish(rt->ds_ud, 0) : HYLA_OK;
    if (st != HYLA_OK) return abandon(rt, hyla_fail_wrap(st, "downstream stage after layer %d", rt->m->layer_end - 1));
    rt->in_flight = 0;
    if (!rt->step.open) return HYLA_OK;
    rt->step.open = 0;
    const hyla_ops *o = rt->be->ops;
    void *ctx = rt->be->ctx;
    size_t V = (size_t)rt->m->cfg.vocab_size;
    for (int g = 0; st == HYLA_OK && g < rt->step.n_groups; g++) {
        float *dev = rt->logits + (size_t)rt->step.g[g].off * V, *host = rt->step.g[g].host;
        size_t bytes = (size_t)rt->step.g[g].n * V * sizeof(float);
        if (rt->step.dev && !rt->step.want_dev) st = o->download(ctx, host, dev, bytes);
        else if (!rt->step.dev && rt->step.want_dev) st = o->upload(ctx, dev, host, bytes);
    }
    return st;
}

/* At most HYLA_DOWNSTREAM_IN_FLIGHT posts unanswered: read the oldest answer before another. */
static hyla_status bound_in_flight(hyla_runtime *rt) {
    if (rt->in_flight < HYLA_DOWNSTREAM_IN_FLIGHT) return HYLA_OK;
    HYLA_TRY(rt->ds->finish(rt->ds_ud, HYLA_DOWNSTREAM_IN_FLIGHT - 1));
    rt->in_flight = HYLA_DOWNSTREAM_IN_FLIGHT - 1;
    return HYLA_OK;
}

/* Post group g of G (rows [off, off + R) of a step of `total` rows, at x) to the downstream.
 * logits_host: where the caller wants this group's logits on the host (NULL: in rt->logits). */
static hyla_status post_group(hyla_runtime *rt, hyla_session *const *ss, int R, int decode, int g, int G, int off,
                              int total, const float *x, int want, float *logits_host) {
    const hyla_model_config *c = &rt->m->cfg;
    size_t V = (size_t)c->vocab_size;
    hyla_downstream_step s = {.ss = ss, .R = R, .decode = decode, .want_logits = want, .group = g, .groups = G,
                              .row_offset = off, .total_rows = total, .hidden = x, .logits = NULL};
    hyla_status st = HYLA_OK;
    if (g == 0) {
        /* a prefill piece is bounded in flight; a step that wants logits is finished before
         * anything else is posted, so at most one step's logits are awaited */
        HYLA_TRY(bound_in_flight(rt));
        if (rt->step.open) HYLA_TRY(hyla_runtime_finish(rt)); /* a step left unfinished by its sender */
        rt->step.dev = 0;
        if (rt->ds->post_dev) {
            s.logits = want && G == 1 ? rt->logits : NULL;
            int handled = 0;
            if ((st = rt->ds->post_dev(rt->ds_ud, &s, &handled)) != HYLA_OK) return st;
            rt->step.dev = handled;
        }
        if (want) {
            rt->step.open = 1;
            rt->step.want_dev = logits_host == NULL;
            rt->step.n_groups = 0;
        }
        if (rt->step.dev) goto posted;
    } else if (rt->step.dev) {
        s.logits = want && g == G - 1 ? rt->logits : NULL;
        int handled = 0;
        if ((st = rt->ds->post_dev(rt->ds_ud, &s, &handled)) != HYLA_OK) return st;
        if (!handled) return hyla_fail(HYLA_ERR_INTERNAL, "the device downstream declined group %d of %d", g, G);
        goto posted;
    }
    /* over the host */
    HYLA_TRY(host_room(rt, R, want && !logits_host ? total : 0));
    HYLA_TRY(rt->be->ops->download(rt->be->ctx, rt->hhidden, x, (size_t)R * c->hidden_size * sizeof(float)));
    s.hidden = rt->hhidden;
    s.logits = !want ? NULL : logits_host ? logits_host : rt->hlogits + (size_t)off * V;
    if ((st = rt->ds->post(rt->ds_ud, &s)) != HYLA_OK) return st;
posted:
    rt->in_flight++;
    rt->posts++;
    if (want) {
        HYLA_ASSERT(rt->step.n_groups < HYLA_MICRO_BATCH_MAX);
        rt->step.g[rt->step.n_groups].host = rt->step.want_dev ? s.logits : logits_host;
        rt->step.g[rt->step.n_groups].off = off;
        rt->step.g[rt->step.n_groups].n = R;
        rt->step.n_groups++;
    }
    return HYLA_OK;
}

/* Post decode lane L's step (rows [off, off + R) at x) without finishing: its logits land at the
 * same rows of rt->logits (post_dev, received beside the compute stream) or rt->hlogits (post). */
static hyla_status post_lane(hyla_runtime *rt, hyla_session *const *ss, int R, int off, const float *x, int L) {
    const hyla_model_config *c = &rt->m->cfg;
    size_t V = (size_t)c->vocab_size;
    if (rt->step.open) HYLA_TRY(hyla_runtime_finish(rt));
    HYLA_TRY(bound_in_flight(rt));
    hyla_downstream_step s = {.ss = ss, .R = R, .decode = 1, .want_logits = 1, .groups = 1, .total_rows = R,
                              .hidden = x, .logits = rt->logits + (size_t)off * V, .logits_aside = 1};
    int handled = 0;
    if (rt->ds->post_dev) HYLA_TRY(rt->ds->post_dev(rt->ds_ud, &s, &handled));
    if (!handled) {
        if (rt->lanes_busy && rt->hlrows < rt->rows)
            return hyla_fail(HYLA_ERR_INTERNAL, "host logits would move under a posted decode lane");
        HYLA_TRY(host_room(rt, R, rt->rows));
        HYLA_TRY(rt->be->ops->download(rt->be->ctx, rt->hhidden, x, (size_t)R * c->hidden_size * sizeof(float)));
        s.hidden = rt->hhidden;
        s.logits = rt->hlogits + (size_t)off * V;
        s.logits_aside = 0;
        HYLA_TRY(rt->ds->post(rt->ds_ud, &s));
    }
    rt->in_flight++;
    rt->posts++;
    rt->lane[L].busy = 1;
    rt->lane[L].dev = handled;
    rt->lane[L].off = off;
    rt->lane[L].n = R;
    rt->lane[L].post_seq = rt->posts;
    rt->lanes_busy++;
    return HYLA_OK;
}

hyla_status hyla_runtime_collect_lane(hyla_runtime *rt, int L, int *off, int *n, int *aside) {
    if (L < 0 || L >= HYLA_LANES_MAX || !rt->lane[L].busy)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "decode lane %d has no posted step (a failure may have dropped it)", L);
    uint64_t answered = rt->posts - (uint64_t)rt->in_flight;
    if (rt->lane[L].post_seq > answered) {
        int keep = (int)(rt->posts - rt->lane[L].post_seq);
        hyla_status st = rt->ds->finish(rt->ds_ud, keep);
        if (st != HYLA_OK) return abandon(rt, hyla_fail_wrap(st, "downstream stage after layer %d", rt->m->layer_end - 1));
        rt->in_flight = keep;
    }
    rt->lane[L].busy = 0;
    rt->lanes_busy--;
    *off = rt->lane[L].off;
    *n = rt->lane[L].n;
    *aside = rt->lane[L].dev && rt->ds && rt->ds->sample_aside;
    if (rt->lane[L].dev) return HYLA_OK;
    size_t V = (size_t)rt->m->cfg.vocab_size, at = (size_t)*off * V;
    return rt->be->ops->upload(rt->be->ctx, rt->logits + at, rt->hlogits + at, (size_t)*n * V * sizeof(float));
}

hyla_status hyla_runtime_forward(hyla_runtime *rt, const hyla_fwd *f, int want_logits) {
    const hyla_model *m = rt->m;
    const hyla_model_config *c = &m->cfg;
    const hyla_ops *o = rt->be->ops;
    void *ctx = rt->be->ctx;
    int D = c->hidden_size, decode = f->decode;
    size_t V = (size_t)c->vocab_size;
    float *x = rt->x + (size_t)f->row_off * D;
    int last = m->lm_head != NULL;
    int lane = f->lane - 1;
    if (f->lane) {
        /* a lane is posted to the later stages, or (the whole model on one device, or on every
         * rank of a tensor-parallel group, each marking its own lane) left running on the
         * device's queue: its logits land in rt->logits and collect samples them */
        const char *why = last && m->layer_begin != 0 ? "not a first stage's decode step"
                          : !last && !rt->ds          ? "needs a later pipeline stage"
                          : rt->tp && !last           ? "not on a tensor-parallel stage"
                          : !f->decode || f->groups   ? "not a first stage's decode step"
                          : lane >= HYLA_LANES_MAX    ? "no such lane"
                          : rt->lane[lane].busy       ? "already posted (collect it first)"
                                                      : NULL;
        if (why) return hyla_fail(HYLA_ERR_INVALID_ARG, "decode lane %d: %s", lane, why);
    } else if (!f->groups && rt->lanes_busy) {
        return hyla_fail(HYLA_ERR_INTERNAL, "a forward while %d decode lanes are posted (collect them first)",
                         rt->lanes_busy);
    }
    /* the first stage's decode step in micro-batches unless it is a lane (a later stage runs the
     * group it got; a tensor-parallel stage does not cut: every rank must sum the same rows in
     * the same order) */
    int G = 1;
    if (!last && f->decode && !f->groups && !f->lane && rt->ds && !rt->tp) {
        G = f->R / HYLA_MICRO_BATCH_MIN_ROWS;
        if (G > rt->micro_batches) G = rt->micro_batches;
        if (G < 1) G = 1;
    }
    if (hyla_prof_on) hyla_prof_begin(o, ctx);
    hyla_status st = HYLA_OK;
    for (int g = 0; g < G; g++) {
        int a = (int)((long)f->R * g / G), n = (int)((long)f->R * (g + 1) / G) - a;
        const int32_t *pos = f->pos + a;
        hyla_state *const *sts = f->st + (f->decode ? a : 0);
        if ((st = run_layers(rt, f->decode, n, pos, sts, x + (size_t)a * D)) != HYLA_OK) break;
        if (last) break; /* G is 1 */
        /* not the last stage: hand the hidden states to the remaining stages (a tensor-parallel
         * group's rank 0 does; the other ranks hold the same rows) */
        if (rt->tp && rt->tp_rank) break;
        if (!rt->ds) {
            st = hyla_fail(HYLA_ERR_UNSUPPORTED, "model holds layers %d..%d of %d and has no downstream stage",
                           m->layer_begin, m->layer_end - 1, c->num_layers);
            break;
        }
        if (f->lane)
            st = post_lane(rt, f->ss, n, f->row_off, x, lane);
        else if (f->groups) /* a later stage passes its group on under the step's numbering */
            st = post_group(rt, f->ss, n, f->decode, f->group, f->groups, f->row_off, f->total_rows, x, want_logits,
                            f->logits_host);
        else
            st = post_group(rt, f->ss + (f->decode ? a : 0), n, f->decode, g, G, a, f->R, x + (size_t)a * D, want_logits,
                            NULL);
        if (st != HYLA_OK) {
            st = hyla_fail_wrap(st, "downstream stage after layer %d", m->layer_end - 1);
            break;
        }
    }
    if (st != HYLA_OK) return rt->ds && !last ? abandon(rt, st) : st;
    if (last) {
        if (!want_logits) return HYLA_OK;
        if (f->row_off + f->R > rt->logit_rows)
            return hyla_fail(HYLA_ERR_INTERNAL, "logits of rows %d..%d wanted with %d reserved", f->row_off,
                             f->row_off + f->R - 1, rt->logit_rows);
        float *lg = rt->logits + (size_t)f->row_off * V;
        hyla_status hs = lm_head(rt, f->decode, f->R, x, lg);
        PM("final norm, lm head");
        if (hs == HYLA_OK && f->logits_host) hs = o->download(ctx, f->logits_host, lg, (size_t)f->R * V * sizeof(float));
        if (hs == HYLA_OK && f->lane && o->submit) hs = o->submit(ctx); /* the device starts it now */
        if (hs == HYLA_OK && f->lane) { /* nothing in flight downstream: collect only samples */
            rt->lane[lane].busy = 1;
            rt->lane[lane].dev = 1;
            rt->lane[lane].off = f->row_off;
            rt->lane[lane].n = f->R;
            rt->lane[lane].post_seq = rt->posts - (uint64_t)rt->in_flight;
            rt->lanes_busy++;
        }
        return hs;
    }
    if ((rt->tp && rt->tp_rank) || f->lane) return HYLA_OK; /* a lane is finished by its collect */
    /* finish when the logits are needed: a decode step, a piece that wants them, the last group
     * of a later stage's step */
    if (f->groups ? f->group == f->groups - 1 : want_logits) return hyla_runtime_finish(rt);
    return HYLA_OK;
}

/* ---- snapshot buffers: pinned host memory for exports, cached per runtime ----
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

void hyla_snapbuf_release(void *ctx, void *base) {
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

hyla_status hyla_snapbuf_get(hyla_runtime *rt, size_t need, uint8_t **base) {
    *base = NULL;
    hyla_snapbufs *c = rt->snapbufs;
    if (!c) {
        if (!(c = calloc(1, sizeof *c))) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
        if (pthread_mutex_init(&c->mu, NULL) != 0) {
            free(c);
            return hyla_fail(HYLA_ERR_INTERNAL, "snapshot buffers: pthread_mutex_init failed");
        }
        rt->snapbufs = c;
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
        rt->be->ops->host_free(rt->be->ctx, doomed);
        doomed = next;
    }
    if (!got) {
        size_t bytes = snapbuf_class(need + SNAPBUF_HDR);
        void *p = NULL;
        hyla_status st = rt->be->ops->host_alloc(rt->be->ctx, bytes, &p);
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

/* Exports larger than this take pageable memory unless a cached pinned buffer fits them:
 * page-locking a new buffer stalls every CUDA call of the process (about 0.45 s a GB), while the
 * backend copies into pageable memory on a thread of its own. HYLA_EXPORT_PIN_MAX_MB overrides. */
#define EXPORTBUF_PIN_MAX ((size_t)256 << 20)

static size_t exportbuf_pin_max(void) {
    const char *e = getenv("HYLA_EXPORT_PIN_MAX_MB");
    return e && *e ? (size_t)strtoull(e, NULL, 10) << 20 : EXPORTBUF_PIN_MAX;
}

static void pageable_release(void *ctx, void *base) {
    (void)ctx;
    free(base);
}

hyla_status hyla_exportbuf_get(hyla_runtime *rt, size_t need, uint8_t **base, hyla_snapshot_release_fn *release,
                               void **release_ctx) {
    *base = NULL;
    int cached = 0;
    hyla_snapbufs *c = rt->snapbufs;
    if (c) {
        pthread_mutex_lock(&c->mu);
        for (int i = 0; i < c->n_idle && !cached; i++) cached = c->idle[i].bytes - SNAPBUF_HDR >= need;
        pthread_mutex_unlock(&c->mu);
    }
    if (!cached && need > exportbuf_pin_max()) {
        size_t bytes = (need + 63) & ~(size_t)63;
        void *p = aligned_alloc(64, bytes ? bytes : 64);
        if (!p) return hyla_fail(HYLA_ERR_NOMEM, "out of memory for a %zu-byte export", need);
        *base = p;
        *release = pageable_release;
        *release_ctx = NULL;
        return HYLA_OK;
    }
    HYLA_TRY(hyla_snapbuf_get(rt, need, base));
    *release = hyla_snapbuf_release;
    *release_ctx = rt->snapbufs;
    return HYLA_OK;
}

hyla_status hyla_export_snapshot_new(hyla_runtime *rt, size_t bytes, hyla_snapshot **out) {
    *out = NULL;
    uint8_t *base;
    hyla_snapshot_release_fn rel;
    void *rel_ctx;
    HYLA_TRY(hyla_exportbuf_get(rt, bytes, &base, &rel, &rel_ctx));
    if (!(*out = hyla_snapshot_create_arena(base, bytes, rel, rel_ctx))) {
        rel(rel_ctx, base);
        return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    }
    return HYLA_OK;
}

hyla_status hyla_stagebuf_get(hyla_runtime *rt, size_t need, void **dev) {
    *dev = NULL;
    const hyla_ops *o = rt->be->ops;
    int fit = -1, idle = -1, empty = -1;
    for (int i = 0; i < HYLA_STAGEBUF_MAX; i++) {
        if (!rt->stagebufs[i].dev) {
            if (empty < 0) empty = i;
        } else if (!rt->stagebufs[i].busy) {
            if (rt->stagebufs[i].bytes >= need && (fit < 0 || rt->stagebufs[i].bytes < rt->stagebufs[fit].bytes)) fit = i;
            if (idle < 0 || rt->stagebufs[i].bytes < rt->stagebufs[idle].bytes) idle = i;
        }
    }
    if (fit >= 0) {
        rt->stagebufs[fit].busy = 1;
        *dev = rt->stagebufs[fit].dev;
        return HYLA_OK;
    }
    int k = empty >= 0 ? empty : idle;
    if (k >= 0 && rt->stagebufs[k].dev) { /* too small: replaced by a larger one */
        o->free(rt->be->ctx, rt->stagebufs[k].dev);
        rt->stagebufs[k].dev = NULL;
    }
    size_t bytes = need ? need : 256;
    HYLA_TRY(o->alloc(rt->be->ctx, bytes, dev));
    if (k >= 0) {
        rt->stagebufs[k].dev = *dev;
        rt->stagebufs[k].bytes = bytes;
        rt->stagebufs[k].busy = 1;
    }
    return HYLA_OK;
}

void hyla_stagebuf_release(hyla_runtime *rt, void *dev) {
    if (!dev) return;
    for (int i = 0; i < HYLA_STAGEBUF_MAX; i++)
        if (rt->stagebufs[i].dev == dev) {
            HYLA_ASSERT(rt->stagebufs[i].busy);
            rt->stagebufs[i].busy = 0;
            return;
        }
    rt->be->ops->free(rt->be->ctx, dev); /* over the bound: not cached */
}

static void stagebufs_destroy(hyla_runtime *rt) {
    for (int i = 0; i < HYLA_STAGEBUF_MAX; i++) {
        HYLA_ASSERT(!rt->stagebufs[i].busy && "every export must end before hyla_runtime_free");
        rt->be->ops->free(rt->be->ctx, rt->stagebufs[i].dev);
    }
}

static void snapbufs_destroy(hyla_runtime *rt) {
    hyla_snapbufs *c = rt->snapbufs;
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    /* a live snapshot would give its buffer back to freed memory (hyla_session.h) */
    HYLA_ASSERT(c->out == 0 && "snapshots exported on this runtime must be destroyed before hyla_runtime_free");
    for (int i = 0; i < c->n_idle; i++) rt->be->ops->host_free(rt->be->ctx, c->idle[i].p);
    for (uint8_t *d = c->doomed, *next; d; d = next) {
        next = hdr_of(d)->next;
        rt->be->ops->host_free(rt->be->ctx, d);
    }
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_destroy(&c->mu);
    free(c);
    rt->snapbufs = NULL;
}

