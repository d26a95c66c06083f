/* hyla_session.c — one conversation (hyla_session.h): position, pending token, sampler and RNG,
 * and its state (hyla_state.c); feeding prompts in aligned pieces, batched decode, pipeline stage
 * forwards, and snapshot export / import, generic over the parts the layers' mixers declare.
 *
 * Invariants: s->pos tokens have been consumed; s->pending is the next token to feed (or -1);
 * states of layers outside the model's layer range are not allocated; paged parts are never freed
 * while the session lives (so an export in flight may read them: s->exports counts those).
 * Threading: one thread drives a runtime's sessions (the backend thread); exported snapshots may
 * be destroyed on any thread (their buffers go back to the runtime's cache under its mutex). */
#include <stdlib.h>
#include <string.h>

#include "hyla_log.h"
#include "hyla_runtime_impl.h"
#include "hyla_session.h"
#include "hyla_tp.h"
#include "hyla_util.h"

struct hyla_session {
    hyla_runtime *rt;
    const hyla_model *m;
    hyla_state *st;
    int64_t pos;
    int32_t pending;
    int64_t generated;
    hyla_sampling sp;
    uint64_t seed;
    hyla_rng rng;
    void *tag;
    int exports; /* exports begun and not yet ended */
    /* the token log (hyla_session_read_tokens): the last log_n generated tokens, oldest at
     * log[log_head]; it grows by doubling up to HYLA_TOKEN_LOG_MAX, then wraps (log_head moves) */
    int32_t *log; /* [log_cap] */
    uint32_t log_cap, log_n, log_head;
    uint32_t log_max; /* the runtime's token log size when the session was created */
    /* On a tensor-parallel runtime (rank 0 of a group): the conversation's sessions on the other
     * ranks' runtimes, peer[1..T-1] (their heads' state; their own pending token, sampler and
     * log are unused). Every forward runs on all ranks through hyla_tp_run. */
    hyla_session *peer[HYLA_TP_MAX];
    int T; /* 1 without tensor parallelism */
};

/* Session r of the conversation (r = 0: s itself). */
static hyla_session *rank_of(hyla_session *s, int r) { return r ? s->peer[r] : s; }

#define OPS(m) (hyla_model_backend(m)->ops)
#define CTX(m) (hyla_model_backend(m)->ctx)

/* One rank's session (no peers). */
static hyla_status session_new(hyla_runtime *rt, hyla_session **out) {
    *out = NULL;
    hyla_session *s = calloc(1, sizeof *s);
    if (!s) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    s->rt = rt;
    s->m = hyla_runtime_model(rt);
    s->T = 1;
    s->pending = -1;
    s->log_max = (uint32_t)rt->token_log;
    s->sp.temperature = 0;
    s->sp.top_k = 0;
    s->sp.top_p = 1;
    hyla_rng_seed(&s->rng, 0);
    hyla_status st = hyla_state_create(s->m, &s->st);
    if (st != HYLA_OK) {
        free(s);
        return st;
    }
    *out = s;
    return HYLA_OK;
}

static void session_delete(hyla_session *s) {
    if (!s) return;
    /* an export in flight still reads this session's paged parts (hyla_session.h) */
    HYLA_ASSERT(s->exports == 0 && "every hyla_session_export_begin must end before hyla_session_free");
    hyla_state_free(s->st);
    free(s->log);
    free(s);
}

static hyla_status peer_free(void *ud, int r) {
    hyla_session *s = ud;
    if (r) {
        session_delete(s->peer[r]);
        s->peer[r] = NULL;
    }
    return HYLA_OK;
}

static hyla_status peer_new(void *ud, int r) {
    hyla_session *s = ud;
    return r ? session_new(hyla_tp_group_runtime(s->rt->tp, r), &s->peer[r]) : HYLA_OK;
}

/* A tensor-parallel runtime is driven through rank 0's: sessions on the others are its peers. */
static hyla_status check_rank0(const hyla_runtime *rt) {
    if (rt->tp && rt->tp_rank)
        return hyla_fail(HYLA_ERR_INVALID_ARG,
                         "runtime is rank %d of a tensor-parallel group: sessions are made on rank 0's runtime",
                         rt->tp_rank);
    return HYLA_OK;
}

hyla_status hyla_session_create(hyla_runtime *rt, hyla_session **out) {
    *out = NULL;
    HYLA_TRY(check_rank0(rt));
    hyla_session *s;
    HYLA_TRY(session_new(rt, &s));
    if (rt->tp) {
        s->T = hyla_tp_group_size(rt->tp);
        hyla_status st = hyla_tp_run(rt->tp, peer_new, s);
        if (st != HYLA_OK) {
            hyla_session_free(s);
            return st;
        }
    }
    *out = s;
    return HYLA_OK;
}

void hyla_session_free(hyla_session *s) {
    if (!s) return;
    /* pieces of a feed may still be posted to the later stages */
    if (hyla_runtime_finish(s->rt) != HYLA_OK) HYLA_WARN("freeing a session: %s", hyla_last_error());
    if (s->T > 1 && hyla_tp_run(s->rt->tp, peer_free, s) != HYLA_OK)
        HYLA_WARN("freeing a tensor-parallel session: %s", hyla_last_error());
    session_delete(s);
}

/* Record a generated token in the log. Out of memory while growing: the log restarts empty
 * (a read below its start is refused; generation does not fail for it). */
static void log_push(hyla_session *s, int32_t tok) {
    if (s->log_n == s->log_cap && s->log_cap < s->log_max) {
        uint32_t cap = s->log_cap ? s->log_cap * 2 : 256;
        if (cap > s->log_max) cap = s->log_max;
        int32_t *n = realloc(s->log, cap * sizeof *n); /* no wrap before the cap: log_head is 0 */
        if (!n) {
            s->log_n = 0;
            s->log_head = 0;
        } else {
            s->log = n;
            s->log_cap = cap;
        }
    }
    if (!s->log_cap) return;
    if (s->log_n < s->log_cap) {
        s->log[(s->log_head + s->log_n) % s->log_cap] = tok;
        s->log_n++;
    } else {
        s->log[s->log_head] = tok;
        s->log_head = (s->log_head + 1) % s->log_cap;
    }
}

int64_t hyla_session_log_first(const hyla_session *s) { return s->generated - (int64_t)s->log_n; }

int hyla_session_read_tokens(const hyla_session *s, int64_t from, int max, int32_t *out) {
    int64_t first = hyla_session_log_first(s);
    if (from < first || from >= s->generated || max <= 0) return 0;
    int64_t n = s->generated - from;
    if (n > max) n = max;
    for (int64_t i = 0; i < n; i++) out[i] = s->log[(s->log_head + (uint32_t)(from - first + i)) % s->log_cap];
    return (int)n;
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
const hyla_model *hyla_session_model(const hyla_session *s) { return s->m; }
hyla_runtime *hyla_session_runtime(const hyla_session *s) { return s->rt; }
uint64_t hyla_session_state_bytes(const hyla_session *s) {
    uint64_t b = s->st->bytes;
    for (int r = 1; r < s->T; r++) b += s->peer[r]->st->bytes;
    return b;
}
void hyla_session_set_tag(hyla_session *s, void *tag) { s->tag = tag; }
void *hyla_session_tag(const hyla_session *s) { return s->tag; }

/* ------------------------------------------------------------------------------------------ */
/* Forward passes                                                                              */

/* The runtime's forward over sessions ss (prefill: ss[0], R rows; decode: R sessions); grp: a
 * later stage's micro-batch (NULL: the first stage's rows); logits_host: its host logits. */
static hyla_status run_forward_group(hyla_session *const *ss, int R, int decode, const int32_t *pos, int want_logits,
                                     const hyla_stage_group *grp, float *logits_host) {
    int n = decode ? R : 1;
    hyla_state **st = malloc((size_t)n * sizeof *st);
    if (!st) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) st[i] = ss[i]->st;
    hyla_fwd f = {decode, R, pos, st, ss, 0, 0, 0, 0, logits_host, 0};
    if (grp) {
        f.group = grp->group;
        f.groups = grp->groups;
        f.row_off = grp->row_offset;
        f.total_rows = grp->total_rows;
    }
    hyla_status s = hyla_runtime_forward(ss[0]->rt, &f, want_logits);
    free(st);
    return s;
}

static hyla_status run_forward(hyla_session *const *ss, int R, int decode, const int32_t *pos, int want_logits) {
    return run_forward_group(ss, R, decode, pos, want_logits, NULL, NULL);
}

/* One rank's stage forward of rows already in its rt->x (or uploaded from hidden_in) at the
 * group's row offset. */
static hyla_status stage_rank(hyla_session *const *ss, int R, int decode, const float *hidden_in, int want_logits,
                              float *logits, const hyla_stage_group *g) {
    hyla_runtime *rt = ss[0]->rt;
    const hyla_model *m = ss[0]->m;
    HYLA_TRY(hyla_runtime_reserve(rt, g->total_rows, want_logits ? g->total_rows : 0));
    int32_t *pos = malloc((size_t)R * sizeof *pos);
    if (!pos) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    for (int i = 0; i < R; i++) pos[i] = (int32_t)(decode ? ss[i]->pos : ss[0]->pos + i);
    const hyla_model_config *c = &m->cfg;
    hyla_status st = HYLA_OK;
    if (hidden_in)
        st = OPS(m)->upload(CTX(m), rt->x + (size_t)g->row_offset * c->hidden_size, hidden_in,
                            (size_t)R * c->hidden_size * sizeof(float));
    if (st == HYLA_OK) st = run_forward_group(ss, R, decode, pos, want_logits, g, logits);
    if (st == HYLA_OK) {
        if (decode)
            for (int i = 0; i < R; i++) ss[i]->pos++;
        else
            ss[0]->pos += R;
    }
    free(pos);
    return st;
}

typedef struct {
    hyla_session *const *ss;
    int R, decode, want_logits;
    const float *hidden_in;
    float *logits;
    const hyla_stage_group *g;
} stage_job;

static hyla_status stage_job_rank(void *ud, int r) {
    stage_job *j = ud;
    int n = j->decode ? j->R : 1;
    hyla_session **sr = malloc((size_t)n * sizeof *sr);
    if (!sr) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) sr[i] = rank_of(j->ss[i], r);
    /* rank 0 hands out the logits (every rank holds the same) */
    hyla_status st = stage_rank(sr, j->R, j->decode, j->hidden_in, j->want_logits, r ? NULL : j->logits, j->g);
    free(sr);
    return st;
}

/* hyla_stage_forward's checks and rows; hidden_in NULL: the rows are already in rt->x. */
static hyla_status stage_forward(hyla_session *const *ss, int R, int decode, const float *hidden_in, int want_logits,
                                 float *logits, const hyla_stage_group *grp) {
    if (R < 1) return hyla_fail(HYLA_ERR_INVALID_ARG, "stage forward needs at least one row");
    hyla_stage_group whole = {0, 1, 0, R};
    const hyla_stage_group *g = grp ? grp : &whole;
    if (g->groups < 1 || g->groups > HYLA_MICRO_BATCH_MAX || g->group < 0 || g->group >= g->groups ||
        g->row_offset < 0 || g->row_offset + R > g->total_rows || (g->groups > 1 && !decode) ||
        (g->groups == 1 && (g->row_offset || g->total_rows != R)))
        return hyla_fail(HYLA_ERR_INVALID_ARG,
                         "stage forward of %d rows as group %d of %d at row %d of %d: not a micro-batch of a decode "
                         "step (groups 1..%d, rows inside the step)",
                         R, g->group, g->groups, g->row_offset, g->total_rows, HYLA_MICRO_BATCH_MAX);
    hyla_runtime *rt = ss[0]->rt;
    int n = decode ? R : 1;
    for (int i = 0; i < n; i++)
        if (ss[i]->rt != rt) return hyla_fail(HYLA_ERR_INVALID_ARG, "stage batch mixes sessions of different runtimes");
    /* a prefill piece either starts on a boundary of the model's prefill chunk or stays inside
     * one chunk (the pieces of any feed are then cut at the same absolute positions) */
    const int C = rt->m->cfg.prefill_chunk;
    if (!decode && (R > HYLA_PREFILL_PIECE_MAX || (ss[0]->pos % C && ss[0]->pos / C != (ss[0]->pos + R - 1) / C)))
        return hyla_fail(HYLA_ERR_INVALID_ARG,
                         "stage prefill of %d rows at position %lld: a piece must start on a %d-token chunk boundary "
                         "or stay inside one chunk, and hold at most %d rows",
                         R, (long long)ss[0]->pos, C, HYLA_PREFILL_PIECE_MAX);
    if (!hidden_in && g->total_rows > rt->rows) /* reserving now would drop the rows already received */
        return hyla_fail(HYLA_ERR_INVALID_ARG, "stage forward of %d rows: the stage buffers hold %d", g->total_rows,
                         rt->rows);
    if (ss[0]->T == 1) return stage_rank(ss, R, decode, hidden_in, want_logits, logits, g);
    /* a split stage takes its rows from the host: each rank uploads them */
    if (!hidden_in)
        return hyla_fail(HYLA_ERR_UNSUPPORTED, "a stage split over several devices takes its rows from the host");
    stage_job j = {ss, R, decode, want_logits, hidden_in, logits, g};
    return hyla_tp_run(rt->tp, stage_job_rank, &j);
}

hyla_status hyla_stage_forward(hyla_session *const *ss, int R, int decode, const float *hidden_in, float *logits) {
    return stage_forward(ss, R, decode, hidden_in, logits != NULL, logits, NULL);
}

hyla_status hyla_stage_forward_dev(hyla_session *const *ss, int R, int decode, int want_logits) {
    return stage_forward(ss, R, decode, NULL, want_logits, NULL, NULL);
}

hyla_status hyla_stage_forward_group(hyla_session *const *ss, int R, int decode, const float *hidden_in, float *logits,
                                     const hyla_stage_group *g) {
    return stage_forward(ss, R, decode, hidden_in, logits != NULL, logits, g);
}

hyla_status hyla_stage_forward_dev_group(hyla_session *const *ss, int R, int decode, int want_logits,
                                         const hyla_stage_group *g) {
    return stage_forward(ss, R, decode, NULL, want_logits, NULL, g);
}

static hyla_status check_tokens(const hyla_model *m, const int32_t *t, int n) {
    for (int i = 0; i < n; i++)
        if (t[i] < 0 || t[i] >= m->cfg.vocab_size)
            return hyla_fail(HYLA_ERR_INVALID_ARG, "token id %d at index %d is outside the vocabulary [0, %d)", t[i], i,
                             m->cfg.vocab_size);
    return HYLA_OK;
}

/* Prefill `n` tokens (one aligned piece) of one rank's session s. */
static hyla_status prefill_piece_rank(hyla_session *s, const int32_t *toks, int n, float *logits_host) {
    const hyla_model *m = s->m;
    hyla_runtime *rt = s->rt;
    if (m->layer_begin != 0)
        return hyla_fail(HYLA_ERR_UNSUPPORTED, "feeding tokens needs the first pipeline stage (layers from 0)");
    HYLA_TRY(hyla_runtime_reserve(rt, n, logits_host ? n : 0)); /* logits only when asked for */
    int32_t *pos = malloc((size_t)n * sizeof *pos);
    if (!pos) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) pos[i] = (int32_t)(s->pos + i);
    hyla_status st = OPS(m)->embed(CTX(m), m->embed, toks, n, rt->x);
    if (st == HYLA_OK) st = run_forward(&s, n, 0, pos, logits_host != NULL);
    free(pos);
    HYLA_TRY(st);
    if (logits_host) {
        HYLA_TRY(OPS(m)->download(CTX(m), logits_host, rt->logits, (size_t)n * m->cfg.vocab_size * sizeof(float)));
    }
    s->pos += n;
    return HYLA_OK;
}

typedef struct {
    hyla_session *s;
    const int32_t *toks;
    int n;
    float *logits;
} piece_job;

static hyla_status piece_rank(void *ud, int r) {
    piece_job *j = ud;
    /* every rank computes the same logits: rank 0 hands them out */
    return prefill_piece_rank(rank_of(j->s, r), j->toks, j->n, r ? NULL : j->logits);
}

/* Prefill one aligned piece on every rank of s. */
static hyla_status prefill_piece(hyla_session *s, const int32_t *toks, int n, float *logits_host) {
    if (s->T == 1) return prefill_piece_rank(s, toks, n, logits_host);
    piece_job j = {s, toks, n, logits_host};
    return hyla_tp_run(s->rt->tp, piece_rank, &j);
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
        /* to the next boundary of the model's prefill chunk, then pieces of up to prefill_piece
         * tokens (a multiple of the chunk) from boundaries */
        const int C = s->m->cfg.prefill_chunk;
        int off = (int)(s->pos % C);
        int room = off ? C - off : s->rt->prefill_piece;
        int piece = total - done < room ? total - done : room;
        st = prefill_piece(s, list + done, piece, logits ? logits + (size_t)done * V : NULL);
        if (st != HYLA_OK) break;
        done += piece;
        if (progress && done < total && progress(ud, done, total)) {
            st = hyla_fail(HYLA_ERR_CANCELLED, "feed cancelled after %d of %d tokens", done, total);
            break;
        }
    }
    /* pieces that want no logits may still be posted to the later stages: the next call that
     * needs them (decode, export, import, free, a feed that wants logits) finishes them */
    /* On success the last token is pending; on failure/cancel the next unconsumed one is (the
     * tokens after it were not fed). */
    s->pending = list[done < total ? done : total];
    if (progress && st == HYLA_OK) progress(ud, done, total);
    free(list);
    if (consumed_out) *consumed_out = done;
    return st;
}

/* Where a decode step's rows go: a lane (1 + its index; 0: an ordinary step at row 0) at rows
 * [off, off + B) of scratch made to hold `rows` rows. */
typedef struct {
    int lane, off, rows;
} step_rows;

/* The decode forward of tokens toks at positions pos for one rank's sessions ss. */
static hyla_status step_rank(hyla_session *const *ss, int B, const int32_t *toks, const int32_t *pos,
                             const step_rows *at) {
    hyla_runtime *rt = ss[0]->rt;
    const hyla_model *m = ss[0]->m;
    HYLA_TRY(hyla_runtime_reserve(rt, at->rows, at->rows));
    float *x = rt->x + (size_t)at->off * m->cfg.hidden_size;
    HYLA_TRY(OPS(m)->embed(CTX(m), m->embed, toks, B, x));
    int n = B;
    hyla_state **st = malloc((size_t)n * sizeof *st);
    if (!st) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) st[i] = ss[i]->st;
    hyla_fwd f = {1, B, pos, st, ss, 0, 0, at->off, 0, NULL, at->lane};
    hyla_status s = hyla_runtime_forward(rt, &f, 1);
    free(st);
    HYLA_TRY(s);
    for (int i = 0; i < B; i++) ss[i]->pos++;
    return HYLA_OK;
}

typedef struct {
    hyla_session *const *ss;
    int B;
    const int32_t *toks, *pos;
    const step_rows *at;
} step_job;

static hyla_status step_job_rank(void *ud, int r) {
    step_job *j = ud;
    if (!r) return step_rank(j->ss, j->B, j->toks, j->pos, j->at);
    hyla_session **sr = malloc((size_t)j->B * sizeof *sr);
    if (!sr) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    for (int i = 0; i < j->B; i++) sr[i] = j->ss[i]->peer[r];
    hyla_status st = step_rank(sr, j->B, j->toks, j->pos, j->at);
    free(sr);
    return st;
}

/* Decode-path forward of the pending tokens of B sessions; logits stay in the runtime's scratch
 * (rank 0's under tensor parallelism), at row at->off; a lane's step is posted, not finished. */
static hyla_status step_forward_at(hyla_session *const *ss, int B, const step_rows *at) {
    if (B < 1) return hyla_fail(HYLA_ERR_INVALID_ARG, "decode needs at least one session");
    hyla_runtime *rt = ss[0]->rt;
    const hyla_model *m = ss[0]->m;
    for (int i = 0; i < B; i++) {
        if (ss[i]->rt != rt) return hyla_fail(HYLA_ERR_INVALID_ARG, "decode batch mixes sessions of different runtimes");
        if (ss[i]->pending < 0)
            return hyla_fail(HYLA_ERR_INVALID_ARG, "session %d of the batch has no pending token (feed a prompt first)", i);
        for (int j = 0; j < i; j++)
            if (ss[j] == ss[i]) return hyla_fail(HYLA_ERR_INVALID_ARG, "decode batch holds one session twice");
    }
    if (m->layer_begin != 0) return hyla_fail(HYLA_ERR_UNSUPPORTED, "decode needs the first pipeline stage");
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
    if (ss[0]->T == 1) {
        st = step_rank(ss, B, toks, pos, at);
    } else { /* every rank checks its own lanes first (they agree), so all fail or none does */
        step_job j = {ss, B, toks, pos, at};
        st = hyla_tp_run(rt->tp, step_job_rank, &j);
    }
    if (st == HYLA_OK)
        for (int i = 0; i < B; i++) ss[i]->pending = -1;
out:
    free(toks);
    free(pos);
    return st;
}

static hyla_status step_forward(hyla_session *const *ss, int B) {
    step_rows at = {0, 0, B};
    return step_forward_at(ss, B, &at);
}

hyla_status hyla_session_step(hyla_session *const *ss, int B, float *logits) {
    HYLA_TRY(step_forward(ss, B));
    const hyla_model *m = ss[0]->m;
    if (logits)
        HYLA_TRY(OPS(m)->download(CTX(m), logits, ss[0]->rt->logits, (size_t)B * m->cfg.vocab_size * sizeof(float)));
    return HYLA_OK;
}

/* Sample the next token of B sessions from their logits at dlogits (backend [B][vocab]) and
 * make it pending. */
static hyla_status sample_rows(hyla_session *const *ss, int B, const float *dlogits, int aside, int32_t *out,
                               float *logits);

hyla_status hyla_session_decode(hyla_session *const *ss, int B, int32_t *out, float *logits) {
    HYLA_TRY(step_forward(ss, B));
    return sample_rows(ss, B, ss[0]->rt->logits, 0, out, logits);
}

hyla_status hyla_session_decode_post(hyla_session *const *ss, int B, int lane, int row_off, int rows) {
    if (lane < 0 || lane >= HYLA_LANES_MAX)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "decode lane %d: lanes are 0..%d", lane, HYLA_LANES_MAX - 1);
    if (B < 1 || row_off < 0 || row_off + B > rows)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "decode lane %d: rows %d..%d do not fit in %d", lane, row_off,
                         row_off + B - 1, rows);
    step_rows at = {lane + 1, row_off, rows};
    return step_forward_at(ss, B, &at);
}

hyla_status hyla_session_decode_collect(hyla_session *const *ss, int B, int lane, int32_t *out) {
    if (B < 1) return hyla_fail(HYLA_ERR_INVALID_ARG, "decode needs at least one session");
    hyla_runtime *rt = ss[0]->rt;
    int off = 0, n = 0, aside = 0;
    HYLA_TRY(hyla_runtime_collect_lane(rt, lane, &off, &n, &aside));
    for (int r = 1; r < ss[0]->T; r++) { /* the other ranks' lanes: their logits are not needed */
        int o2, n2, a2;
        HYLA_TRY(hyla_runtime_collect_lane(rank_of(ss[0], r)->rt, lane, &o2, &n2, &a2));
    }
    if (n != B) return hyla_fail(HYLA_ERR_INVALID_ARG, "decode lane %d posted %d sessions, collected as %d", lane, n, B);
    return sample_rows(ss, B, rt->logits + (size_t)off * ss[0]->m->cfg.vocab_size, aside, out, NULL);
}

/* aside: the logits are beside the compute stream (a lane's, received over NCCL): sample them
 * there through the downstream, so the tokens do not wait for the compute stream's queue. */
static hyla_status sample_rows(hyla_session *const *ss, int B, const float *dlogits, int aside, int32_t *out,
                               float *logits) {
    const hyla_model *m = ss[0]->m;
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
    hyla_runtime *rt = ss[0]->rt;
    st = aside ? rt->ds->sample_aside(rt->ds_ud, dlogits, B, (int)V, sp, u, out)
               : OPS(m)->sample(CTX(m), dlogits, B, (int)V, sp, u, out);
    if (st != HYLA_OK) goto out;
    if (logits && (st = OPS(m)->download(CTX(m), logits, dlogits, (size_t)B * V * sizeof(float))) != HYLA_OK)
        goto out;
    for (int i = 0; i < B; i++) {
        ss[i]->pending = out[i];
        ss[i]->generated++;
        log_push(ss[i], out[i]);
    }
out:
    free(sp);
    free(u);
    return st;
}

hyla_status hyla_session_sample_logits(hyla_session *s, const float *logits, int32_t *out) {
    const hyla_model *m = s->m;
    HYLA_TRY(hyla_runtime_reserve(s->rt, 1, 1));
    size_t V = (size_t)m->cfg.vocab_size;
    HYLA_TRY(OPS(m)->upload(CTX(m), s->rt->logits, logits, V * sizeof(float)));
    float u = hyla_rng_uniform(&s->rng);
    HYLA_TRY(OPS(m)->sample(CTX(m), s->rt->logits, 1, (int)V, &s->sp, &u, out));
    s->pending = *out;
    s->generated++;
    log_push(s, *out);
    return HYLA_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Snapshots (docs/MODELS.md §8, docs/STATE_FORMAT.md)                                         */

/* The snapshot shape of part p of a layer at position pos: fixed parts as declared, paged
 * parts [pos][row shape]. */
static uint32_t snap_shape(const hyla_part_spec *p, int64_t pos, uint64_t *shape) {
    uint32_t nd = 0;
    if (p->paged) shape[nd++] = (uint64_t)pos;
    for (uint32_t d = 0; d < p->ndim; d++) shape[nd++] = p->shape[d];
    return nd;
}

static uint64_t shape_bytes(hyla_dtype dt, const uint64_t *shape, uint32_t nd) {
    uint64_t n = hyla_dtype_size(dt);
    for (uint32_t d = 0; d < nd; d++) n *= shape[d];
    return n;
}

/* ---- export ----
 * begin: the snapshot's parts are carved from one snapshot buffer; the fixed parts (recurrent,
 * partition, conv tails, ...) are first copied on the device (ops->copy, in stream order) into
 * slots of one staging buffer (from the runtime's cache: no device allocation, no zero-fill in
 * steady state), because later ops overwrite the states; the rows of paged parts
 * below the position never change again, so their pages are captured in place (only the used
 * bytes of the last page: the next token's row is written while the copy may still run). One
 * ops->capture_begin queues all device->host copies; nothing waits for the device. */
typedef struct {
    void *slot;        /* staging slot (device): a piece of the export's staging buffer */
    const void *state; /* the state it copies */
    size_t bytes;
} export_stage;

struct hyla_export {
    hyla_session *s;
    hyla_snapshot *snap;
    hyla_capture *ticket;
    void *staging;       /* device: every slot; back to the runtime's cache at end */
    size_t staging_used; /* bytes of it carved so far */
    export_stage *stage; /* [n_stage] the fixed parts */
    int n_stage;
    /* tensor parallelism: rank r's export of its session, peer[1..T-1]; end merges them */
    struct hyla_export *peer[HYLA_TP_MAX];
    int T;
};

/* A staging slot's piece of the buffer: 256-byte aligned, like an allocation */
static size_t stage_piece(uint64_t bytes) { return (size_t)((bytes + 255) & ~(uint64_t)255); }

static void export_free(hyla_export *e) {
    hyla_stagebuf_release(e->s->rt, e->staging);
    hyla_snapshot_destroy(e->snap);
    free(e->stage);
    free(e);
}

/* Bytes at the front of paged part pd that an export since base_pos leaves out: the KV rows of
 * the tokens below base_pos, which never change once written (only HYLA_PART_KV parts: the
 * store's incremental put shares exactly those, hyla_store_rpc_put). */
static uint64_t export_skip(const hyla_part_spec *pd, int64_t pos, uint64_t base_pos) {
    if (!pd->paged || pd->kind != HYLA_PART_KV || !base_pos) return 0;
    uint64_t t = base_pos < (uint64_t)pos ? base_pos : (uint64_t)pos;
    return shape_bytes(pd->dtype, pd->shape, pd->ndim) * t;
}

/* Fill the snapshot's parts (carved from its arena), carve the staging slots and list the
 * device->host copies: dst/src/len [*nc]. */
static hyla_status export_plan(hyla_export *e, uint64_t base_pos, void **dst, const void **src, size_t *len, int *nc) {
    hyla_session *s = e->s;
    const hyla_model *m = s->m;
    *nc = 0;
    for (int l = m->layer_begin; l < m->layer_end; l++) {
        const hyla_layer *ly = &m->layers[l];
        hyla_layer_state *ls = &s->st->ls[l];
        for (int i = 0; i < ly->n_parts; i++) {
            const hyla_part_spec *pd = &ly->parts[i];
            uint64_t shape[5];
            uint32_t nd = snap_shape(pd, s->pos, shape);
            hyla_state_part *p;
            HYLA_TRY(hyla_snapshot_add_part_tail(e->snap, (uint32_t)l, pd->name, pd->kind, pd->dtype, nd, shape,
                                                 pd->paged ? HYLA_KV_PAGE_TOKENS : 0, export_skip(pd, s->pos, base_pos),
                                                 &p));
            if (!pd->paged) {
                export_stage *g = &e->stage[e->n_stage];
                g->slot = (uint8_t *)e->staging + e->staging_used;
                e->staging_used += stage_piece(p->nbytes);
                g->state = ls->part[i].dev;
                g->bytes = (size_t)p->nbytes;
                e->n_stage++;
                dst[*nc] = p->data;
                src[*nc] = g->slot;
                len[(*nc)++] = g->bytes;
                continue;
            }
            size_t pb = (size_t)shape_bytes(pd->dtype, pd->shape, pd->ndim) * HYLA_KV_PAGE_TOKENS;
            for (uint64_t off = p->skip; off < p->nbytes;) { /* page by page from the first byte held */
                uint64_t in = off % pb, end = off - in + pb < p->nbytes ? off - in + pb : p->nbytes;
                dst[*nc] = (uint8_t *)p->data + (off - p->skip);
                src[*nc] = (const uint8_t *)ls->part[i].pages[off / pb] + in;
                len[(*nc)++] = (size_t)(end - off);
                off = end;
            }
        }
    }
    return HYLA_OK;
}

static hyla_status export_begin_rank(hyla_session *s, uint64_t base_pos, hyla_export **out) {
    *out = NULL;
    const double t_begin = hyla_now();
    const hyla_model *m = s->m;
    const hyla_ops *o = OPS(m);
    /* sizes and counts first: one arena, one copy list */
    uint64_t arena = 0, staging = 0;
    int n_parts = 0, n_stage = 0, n_copies = 0;
    for (int l = m->layer_begin; l < m->layer_end; l++) {
        const hyla_layer *ly = &m->layers[l];
        for (int i = 0; i < ly->n_parts; i++) {
            const hyla_part_spec *pd = &ly->parts[i];
            uint64_t shape[5];
            uint32_t nd = snap_shape(pd, s->pos, shape);
            uint64_t n = shape_bytes(pd->dtype, shape, nd), skip = export_skip(pd, s->pos, base_pos);
            arena += hyla_snapshot_arena_piece(n - skip);
            n_parts++;
            if (pd->paged) {
                uint64_t pb = shape_bytes(pd->dtype, pd->shape, pd->ndim) * HYLA_KV_PAGE_TOKENS;
                if (n > skip) n_copies += (int)((n + pb - 1) / pb - skip / pb);
            } else {
                n_stage++;
                n_copies++;
                staging += stage_piece(n);
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
    st = hyla_stagebuf_get(s->rt, (size_t)staging, &e->staging);
    if (st == HYLA_OK) st = hyla_export_snapshot_new(s->rt, (size_t)arena, &e->snap);
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
    const double t_alloc = hyla_now();
    if (st == HYLA_OK) st = export_plan(e, base_pos, dst, src, len, &nc);
    const double t_plan = hyla_now();
    HYLA_ASSERT(st != HYLA_OK || (nc == n_copies && e->n_stage == n_stage && e->snap->n_parts == (uint32_t)n_parts));
    /* the device copies of the fixed parts, in stream order after everything queued so far;
     * queued after all staging allocations, so a backend that logs ops keeps them together */
    for (int i = 0; st == HYLA_OK && i < e->n_stage; i++)
        st = o->copy(CTX(m), e->stage[i].slot, e->stage[i].state, e->stage[i].bytes);
    const double t_stage = hyla_now();
    if (st == HYLA_OK) st = o->capture_begin(CTX(m), nc, dst, src, len, &e->ticket);
    const double t_capture = hyla_now();
    HYLA_DEBUG("session export begin: %d copies (%d staged), buffers %.3f ms, plan %.3f ms, staging copies %.3f ms, "
               "capture_begin %.3f ms",
               nc, e->n_stage, (t_alloc - t_begin) * 1e3, (t_plan - t_alloc) * 1e3, (t_stage - t_plan) * 1e3,
               (t_capture - t_stage) * 1e3);
    free(dst);
    free(src);
    free(len);
    if (st != HYLA_OK) {
        export_free(e); /* staging slots: nothing reads them once the queued copies into them ran */
        return hyla_fail_wrap(st, "exporting session state");
    }
    /* The snapshot covers the whole model even when this stage holds a range. */
    e->snap->n_layers = (uint32_t)m->cfg.num_layers;
    /* the token log (host memory: copied now, the state at begin); past the arena, so allocated */
    int32_t *log = NULL;
    if (s->log_n && hyla_snapshot_add_token_log(e->snap, s->log_n, &log) == HYLA_OK)
        hyla_session_read_tokens(s, hyla_session_log_first(s), (int)s->log_n, log);
    else if (s->log_n)
        HYLA_WARN("session export: the token log of %u tokens is left out: %s", s->log_n, hyla_last_error());
    s->exports++;
    *out = e;
    return HYLA_OK;
}

static int export_done_rank(hyla_export *e) {
    const hyla_model *m = e->s->m;
    return OPS(m)->capture_done(CTX(m), e->ticket);
}

static hyla_status export_end_rank(hyla_export *e, hyla_snapshot **out) {
    if (out) *out = NULL;
    const hyla_model *m = e->s->m;
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

/* Tensor parallelism: every rank exports its session; end joins the ranks' snapshots into the
 * whole model's (hyla_tp_snapshot_merge). */
typedef struct {
    hyla_session *s;
    hyla_export *e[HYLA_TP_MAX];
    hyla_snapshot *snap[HYLA_TP_MAX];
} tp_export_job;

static hyla_status tp_export_begin(void *ud, int r) {
    tp_export_job *j = ud;
    return export_begin_rank(rank_of(j->s, r), 0, &j->e[r]); /* whole: the merge joins whole parts */
}

static hyla_status tp_export_end(void *ud, int r) {
    tp_export_job *j = ud;
    hyla_export *e = j->e[r];
    j->e[r] = NULL;
    return e ? export_end_rank(e, &j->snap[r]) : HYLA_OK;
}

hyla_status hyla_session_export_begin(hyla_session *s, hyla_export **out) {
    return hyla_session_export_begin_since(s, 0, out);
}

hyla_status hyla_session_export_begin_since(hyla_session *s, uint64_t base_position, hyla_export **out) {
    *out = NULL;
    HYLA_TRY(hyla_runtime_finish(s->rt)); /* the later stages' state at this position (ExportStage) */
    if (s->T == 1) return export_begin_rank(s, base_position, out);
    tp_export_job j = {.s = s};
    hyla_status st = hyla_tp_run(s->rt->tp, tp_export_begin, &j);
    if (st != HYLA_OK) {
        if (hyla_tp_run(s->rt->tp, tp_export_end, &j) != HYLA_OK) HYLA_WARN("ending a failed export: %s", hyla_last_error());
        for (int r = 0; r < s->T; r++) hyla_snapshot_destroy(j.snap[r]);
        return st;
    }
    hyla_export *e = j.e[0];
    e->T = s->T;
    for (int r = 1; r < s->T; r++) e->peer[r] = j.e[r];
    *out = e;
    return HYLA_OK;
}

int hyla_session_export_done(hyla_export *e) {
    for (int r = 1; r < e->T; r++)
        if (!export_done_rank(e->peer[r])) return 0;
    return export_done_rank(e);
}

hyla_status hyla_session_export_end(hyla_export *e, hyla_snapshot **out) {
    if (out) *out = NULL;
    if (e->T <= 1) return export_end_rank(e, out);
    hyla_session *s = e->s;
    tp_export_job j = {.s = s};
    j.e[0] = e;
    for (int r = 1; r < s->T; r++) j.e[r] = e->peer[r];
    hyla_status st = hyla_tp_run(s->rt->tp, tp_export_end, &j);
    if (st == HYLA_OK && out) {
        const hyla_model *ms[HYLA_TP_MAX];
        for (int r = 0; r < s->T; r++) ms[r] = rank_of(s, r)->m;
        st = hyla_tp_snapshot_merge_into_export(s->rt, ms, (const hyla_snapshot *const *)j.snap, s->T, out);
    }
    for (int r = 0; r < s->T; r++) hyla_snapshot_destroy(j.snap[r]);
    return st;
}

hyla_status hyla_session_export(hyla_session *s, hyla_snapshot **out) { return hyla_session_export_since(s, 0, out); }

hyla_status hyla_session_export_since(hyla_session *s, uint64_t base_position, hyla_snapshot **out) {
    *out = NULL;
    hyla_export *e;
    HYLA_TRY(hyla_session_export_begin_since(s, base_position, &e));
    return hyla_session_export_end(e, out);
}

static void fmt_shape(char *buf, size_t n, const uint64_t *shape, uint32_t ndim) {
    size_t o = (size_t)snprintf(buf, n, "[");
    for (uint32_t i = 0; i < ndim && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, i ? ", %llu" : "%llu", (unsigned long long)shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

/* Upload a whole (unpaged) part from the snapshot, converting f32/bf16/f16 to the part's dtype
 * (an LTE cache's k, v rows exported by another backend). */
static hyla_status import_converted(const hyla_model *m, void *dev, const hyla_part_spec *pd, const hyla_state_part *p) {
    size_t n = (size_t)(p->nbytes / hyla_dtype_size((hyla_dtype)p->dtype));
    float *tmp = malloc(n * sizeof(float) + 4);
    void *conv = malloc(n * hyla_dtype_size(pd->dtype) + 4);
    hyla_status st = HYLA_OK;
    if (!tmp || !conv) st = hyla_fail(HYLA_ERR_RESOURCE, "import of part '%s': out of memory", pd->name);
    if (st == HYLA_OK) {
        hyla_to_f32(tmp, p->data, (hyla_dtype)p->dtype, n);
        hyla_from_f32(conv, pd->dtype, tmp, n);
        st = OPS(m)->upload(CTX(m), dev, conv, n * hyla_dtype_size(pd->dtype));
    }
    free(tmp);
    free(conv);
    return st;
}

/* Upload the rows of a paged part from the snapshot, converting f32/bf16/f16 to the part's dtype. */
static hyla_status import_paged(const hyla_model *m, hyla_layer_state *ls, int i, const hyla_part_spec *pd,
                                const hyla_state_part *p, int64_t pos) {
    HYLA_TRY(hyla_layer_state_reserve(ls, i, pos));
    void **pages = ls->part[i].pages;
    size_t es = hyla_dtype_size(pd->dtype), ps = hyla_dtype_size((hyla_dtype)p->dtype);
    size_t pb = (size_t)shape_bytes(pd->dtype, pd->shape, pd->ndim) * HYLA_KV_PAGE_TOKENS;
    size_t page_elems = pb / es;
    uint64_t elems = p->nbytes / ps;
    void *conv = NULL;
    float *tmp = NULL;
    if (p->dtype != (uint32_t)pd->dtype && (!(conv = malloc(pb)) || !(tmp = malloc(page_elems * sizeof(float))))) {
        free(conv);
        return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    }
    hyla_status st = HYLA_OK;
    for (uint64_t e0 = 0, pg = 0; st == HYLA_OK && e0 < elems; e0 += page_elems, pg++) {
        size_t cnt = elems - e0 < page_elems ? (size_t)(elems - e0) : page_elems;
        const uint8_t *src = (const uint8_t *)p->data + e0 * ps;
        if (conv) {
            hyla_to_f32(tmp, src, (hyla_dtype)p->dtype, cnt);
            hyla_from_f32(conv, pd->dtype, tmp, cnt);
            src = conv;
        }
        st = OPS(m)->upload(CTX(m), pages[pg], src, cnt * es);
    }
    free(conv);
    free(tmp);
    return st;
}

/* How a snapshot part reaches the device (import_prepare). */
typedef enum {
    IMP_SKIP = 0, /* not a part of a held layer (another pipeline stage's), or the token log */
    IMP_DIRECT,   /* fixed part in the backend's dtype: bytes [off, off+len) -> dev + off */
    IMP_PAGED,    /* paged part in the backend's dtype: split at page boundaries */
    IMP_CONVERT,  /* another float dtype (a snapshot of another backend): converted, whole */
} import_mode;

typedef struct {
    import_mode mode;
    int layer, part; /* the layer and its part spec */
} import_target;

/* The checks of an import (meta, then every held layer's part: present, kind, dtype, shape)
 * and a new session with the snapshot's meta, its paged parts reserved up to the position.
 * map [snap->n_parts] receives where each snapshot part goes. The token log is not read. */
static hyla_status import_prepare(hyla_runtime *rt, const hyla_snapshot *snap, import_target *map, hyla_session **out) {
    *out = NULL;
    const hyla_model *m = hyla_runtime_model(rt);
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
    HYLA_TRY(session_new(rt, &s));
    s->pos = (int64_t)snap->position;
    s->generated = (int64_t)snap->n_generated;
    s->pending = snap->pending_token;
    s->sp.temperature = snap->sampler.temperature;
    s->sp.top_k = snap->sampler.top_k;
    s->sp.top_p = snap->sampler.top_p;
    s->seed = snap->sampler.seed;
    memcpy(s->rng.s, snap->rng, sizeof snap->rng);
    memset(map, 0, (size_t)snap->n_parts * sizeof *map);
    hyla_status st = HYLA_OK;
    for (int l = m->layer_begin; st == HYLA_OK && l < m->layer_end; l++) {
        const hyla_layer *ly = &m->layers[l];
        for (int i = 0; st == HYLA_OK && i < ly->n_parts; i++) {
            const hyla_part_spec *pd = &ly->parts[i];
            const hyla_state_part *p = hyla_snapshot_find(snap, (uint32_t)l, pd->name);
            if (!p) {
                st = hyla_fail(HYLA_ERR_FORMAT, "snapshot lacks part '%s' of layer %d (%s)", pd->name, l, ly->mixer->name);
                break;
            }
            uint64_t shape[5];
            uint32_t nd = snap_shape(pd, s->pos, shape);
            int shape_ok = p->ndim == nd && p->kind == (uint32_t)pd->kind;
            for (uint32_t d = 0; shape_ok && d < p->ndim; d++) shape_ok = p->shape[d] == shape[d];
            /* paged parts (KV) and LTE caches' rows (kv_dtype) may come in any float type: a
             * snapshot of another backend */
            int fl = p->dtype == HYLA_DT_F32 || p->dtype == HYLA_DT_BF16 || p->dtype == HYLA_DT_F16;
            int lte_rows = pd->kind == HYLA_PART_LTE &&
                           (pd->dtype == HYLA_DT_F32 || pd->dtype == HYLA_DT_BF16 || pd->dtype == HYLA_DT_F16);
            int dtype_ok = p->dtype == (uint32_t)pd->dtype || ((pd->paged || lte_rows) && fl);
            if (!shape_ok || !dtype_ok) {
                char got[96], want[96];
                fmt_shape(got, sizeof got, p->shape, p->ndim);
                fmt_shape(want, sizeof want, shape, nd);
                st = hyla_fail(HYLA_ERR_MISMATCH, "layer %d part '%s': snapshot has %s %s %s, this model needs %s %s %s", l,
                               pd->name, hyla_part_kind_name((hyla_part_kind)p->kind), hyla_dtype_name((hyla_dtype)p->dtype),
                               got, hyla_part_kind_name(pd->kind), hyla_dtype_name(pd->dtype), want);
                break;
            }
            import_target *t = &map[p - snap->parts];
            t->layer = l;
            t->part = i;
            t->mode = p->dtype != (uint32_t)pd->dtype ? IMP_CONVERT : pd->paged ? IMP_PAGED : IMP_DIRECT;
            if (pd->paged) st = hyla_layer_state_reserve(&s->st->ls[l], i, s->pos);
        }
    }
    if (st != HYLA_OK) {
        session_delete(s);
        return st;
    }
    *out = s;
    return HYLA_OK;
}

/* The token log of the snapshot into s (its data must be final). */
static hyla_status import_token_log(hyla_session *s, const hyla_snapshot *snap) {
    const int32_t *log = NULL;
    uint32_t log_n = 0;
    HYLA_TRY(hyla_snapshot_token_log(snap, &log, &log_n));
    if (log_n) { /* the log ends at n_generated, as it did when it was exported */
        s->generated -= log_n;
        for (uint32_t i = 0; i < log_n; i++) {
            s->generated++;
            log_push(s, log[i]);
        }
    }
    return HYLA_OK;
}

/* One part the synchronous way (ops->upload, converting where needed). */
static hyla_status import_part_sync(hyla_session *s, const import_target *t, const hyla_state_part *p) {
    const hyla_model *m = s->m;
    const hyla_part_spec *pd = &m->layers[t->layer].parts[t->part];
    hyla_layer_state *ls = &s->st->ls[t->layer];
    if (pd->paged) return import_paged(m, ls, t->part, pd, p, s->pos);
    if (t->mode == IMP_CONVERT) return import_converted(m, ls->part[t->part].dev, pd, p);
    return OPS(m)->upload(CTX(m), ls->part[t->part].dev, p->data, p->nbytes);
}

/* One rank's import, the synchronous way: checks, the token log, every part uploaded. */
static hyla_status import_rank(hyla_runtime *rt, const hyla_snapshot *snap, hyla_session **out) {
    *out = NULL;
    import_target *map = malloc(((size_t)snap->n_parts + 1) * sizeof *map);
    if (!map) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    hyla_session *s = NULL;
    hyla_status st = import_prepare(rt, snap, map, &s);
    if (st == HYLA_OK) st = import_token_log(s, snap);
    for (uint32_t k = 0; st == HYLA_OK && k < snap->n_parts; k++)
        if (map[k].mode != IMP_SKIP) st = import_part_sync(s, &map[k], &snap->parts[k]);
    free(map);
    if (st != HYLA_OK) {
        session_delete(s);
        return st;
    }
    *out = s;
    return HYLA_OK;
}

/* Tensor parallelism: each rank imports its slice of the whole-model snapshot. */
typedef struct {
    hyla_runtime *rt;
    const hyla_snapshot *whole;
    hyla_session *s[HYLA_TP_MAX];
} tp_import_job;

static hyla_status tp_import(void *ud, int r) {
    tp_import_job *j = ud;
    hyla_runtime *rr = hyla_tp_group_runtime(j->rt->tp, r);
    hyla_snapshot *part = NULL;
    HYLA_TRY(hyla_tp_snapshot_split_for_import(rr, j->whole, &part));
    hyla_status st = import_rank(rr, part, &j->s[r]);
    hyla_snapshot_destroy(part);
    return st;
}

static hyla_status tp_import_undo(void *ud, int r) {
    tp_import_job *j = ud;
    session_delete(j->s[r]);
    j->s[r] = NULL;
    return HYLA_OK;
}

hyla_status hyla_session_import(hyla_runtime *rt, const hyla_snapshot *snap, hyla_session **out) {
    *out = NULL;
    HYLA_TRY(hyla_snapshot_require_whole(snap, "session import"));
    HYLA_TRY(check_rank0(rt));
    HYLA_TRY(hyla_runtime_finish(rt));
    if (!rt->tp) return import_rank(rt, snap, out);
    tp_import_job j = {.rt = rt, .whole = snap};
    hyla_status st = hyla_tp_run(rt->tp, tp_import, &j);
    if (st != HYLA_OK) {
        if (hyla_tp_run(rt->tp, tp_import_undo, &j) != HYLA_OK) HYLA_WARN("undoing an import: %s", hyla_last_error());
        return st;
    }
    hyla_session *s = j.s[0];
    s->T = hyla_tp_group_size(rt->tp);
    for (int r = 1; r < s->T; r++) s->peer[r] = j.s[r];
    *out = s;
    return HYLA_OK;
}

/* ---- streaming import ----
 * begin: import_prepare. ranges: the device copies of the byte ranges, queued at once through
 * ops->upload_begin (one ticket per call; the tickets end at end), or ops->upload in a backend
 * without it; converted parts wait for end. end: every byte of every part must have come (a
 * caller bug otherwise: HYLA_ERR_INTERNAL), then the converted parts, the token log, and the
 * wait for the copies. */
struct hyla_import {
    hyla_session *s;
    const hyla_snapshot *snap;
    import_target *map;   /* [snap->n_parts] */
    uint64_t *arrived;    /* [snap->n_parts] bytes queued of each part */
    hyla_capture **tickets;
    int n_tickets, cap_tickets;
    void **dst;           /* scratch of one call: [cap_copies] */
    const void **src;
    size_t *len;
    int cap_copies;
    hyla_status failed;   /* first failure of a ranges call: end reports it */
};

hyla_status hyla_session_import_begin(hyla_runtime *rt, const hyla_snapshot *snap, hyla_import **out) {
    *out = NULL;
    HYLA_TRY(hyla_snapshot_require_whole(snap, "session import"));
    HYLA_TRY(hyla_runtime_finish(rt));
    hyla_import *im = calloc(1, sizeof *im);
    if (!im || !(im->map = malloc(((size_t)snap->n_parts + 1) * sizeof *im->map)) ||
        !(im->arrived = calloc((size_t)snap->n_parts + 1, sizeof *im->arrived))) {
        if (im) free(im->map);
        free(im);
        return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    }
    im->snap = snap;
    hyla_status st = check_rank0(rt);
    /* a tensor-parallel group splits the snapshot per rank first (hyla_session_import) */
    if (st == HYLA_OK && rt->tp)
        st = hyla_fail(HYLA_ERR_UNSUPPORTED, "streaming import on a tensor-parallel runtime: use hyla_session_import");
    if (st == HYLA_OK) st = import_prepare(rt, snap, im->map, &im->s);
    if (st != HYLA_OK) {
        free(im->map);
        free(im->arrived);
        free(im);
        return st;
    }
    *out = im;
    return HYLA_OK;
}

static hyla_status import_room(hyla_import *im, int need) {
    if (need <= im->cap_copies) return HYLA_OK;
    int cap = im->cap_copies ? im->cap_copies : 64;
    while (cap < need) cap *= 2;
    void **d = realloc(im->dst, (size_t)cap * sizeof *d);
    if (d) im->dst = d;
    const void **sr = realloc(im->src, (size_t)cap * sizeof *sr);
    if (sr) im->src = sr;
    size_t *l = realloc(im->len, (size_t)cap * sizeof *l);
    if (l) im->len = l;
    if (!d || !sr || !l) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    im->cap_copies = cap;
    return HYLA_OK;
}

static hyla_status import_ranges(hyla_import *im, int n, const uint32_t *part, const uint64_t *off,
                                 const uint64_t *len) {
    const hyla_model *m = im->s->m;
    const hyla_snapshot *snap = im->snap;
    int nc = 0;
    for (int k = 0; k < n; k++) {
        if (part[k] >= snap->n_parts || off[k] + len[k] > snap->parts[part[k]].nbytes || off[k] + len[k] < off[k])
            return hyla_fail(HYLA_ERR_INVALID_ARG, "import range %u [%llu, +%llu) is outside the snapshot's parts", part[k],
                             (unsigned long long)off[k], (unsigned long long)len[k]);
        im->arrived[part[k]] += len[k];
        const import_target *t = &im->map[part[k]];
        if (t->mode != IMP_DIRECT && t->mode != IMP_PAGED) continue;
        const uint8_t *src = (const uint8_t *)snap->parts[part[k]].data;
        hyla_part_state *ps = &im->s->st->ls[t->layer].part[t->part];
        if (t->mode == IMP_DIRECT) {
            HYLA_TRY(import_room(im, nc + 1));
            im->dst[nc] = (uint8_t *)ps->dev + off[k];
            im->src[nc] = src + off[k];
            im->len[nc++] = (size_t)len[k];
            continue;
        }
        const hyla_part_spec *pd = &m->layers[t->layer].parts[t->part];
        uint64_t pb = shape_bytes(pd->dtype, pd->shape, pd->ndim) * HYLA_KV_PAGE_TOKENS;
        for (uint64_t o = off[k], e = off[k] + len[k]; o < e;) {
            uint64_t pe = (o / pb + 1) * pb, n1 = (pe < e ? pe : e) - o;
            HYLA_TRY(import_room(im, nc + 1));
            im->dst[nc] = (uint8_t *)ps->pages[o / pb] + o % pb;
            im->src[nc] = src + o;
            im->len[nc++] = (size_t)n1;
            o += n1;
        }
    }
    if (!nc) return HYLA_OK;
    const hyla_ops *o = OPS(m);
    if (!o->upload_begin) {
        for (int i = 0; i < nc; i++) HYLA_TRY(o->upload(CTX(m), im->dst[i], im->src[i], im->len[i]));
        return HYLA_OK;
    }
    /* tickets whose copies are done are finished now, while the caller waits for more ranges
     * anyway, instead of all at the end (they complete in order: one copy stream) */
    int reaped = 0;
    while (reaped < im->n_tickets && o->capture_done && o->capture_done(CTX(m), im->tickets[reaped])) {
        hyla_status e = o->capture_end(CTX(m), im->tickets[reaped]);
        reaped++;
        if (e != HYLA_OK) {
            memmove(im->tickets, im->tickets + reaped, (size_t)(im->n_tickets - reaped) * sizeof *im->tickets);
            im->n_tickets -= reaped;
            return hyla_fail_wrap(e, "importing session state");
        }
    }
    if (reaped) {
        memmove(im->tickets, im->tickets + reaped, (size_t)(im->n_tickets - reaped) * sizeof *im->tickets);
        im->n_tickets -= reaped;
    }
    if (im->n_tickets == im->cap_tickets) {
        int cap = im->cap_tickets ? im->cap_tickets * 2 : 16;
        hyla_capture **t = realloc(im->tickets, (size_t)cap * sizeof *t);
        if (!t) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
        im->tickets = t;
        im->cap_tickets = cap;
    }
    HYLA_TRY(o->upload_begin(CTX(m), nc, im->dst, im->src, im->len, &im->tickets[im->n_tickets]));
    im->n_tickets++;
    return HYLA_OK;
}

hyla_status hyla_session_import_ranges(hyla_import *im, int n, const uint32_t *part, const uint64_t *off,
                                       const uint64_t *len) {
    if (im->failed != HYLA_OK) return im->failed;
    hyla_status st = import_ranges(im, n, part, off, len);
    if (st != HYLA_OK) im->failed = st;
    return st;
}

/* Wait for every ticket; the first failure, or `st`. */
static hyla_status import_wait(hyla_import *im, hyla_status st) {
    const hyla_model *m = im->s->m;
    for (int i = 0; i < im->n_tickets; i++) {
        hyla_status e = OPS(m)->capture_end(CTX(m), im->tickets[i]);
        if (st == HYLA_OK && e != HYLA_OK) st = hyla_fail_wrap(e, "importing session state");
    }
    im->n_tickets = 0;
    return st;
}

static void import_free(hyla_import *im) {
    hyla_session_free(im->s);
    free(im->map);
    free(im->arrived);
    free(im->tickets);
    free(im->dst);
    free(im->src);
    free(im->len);
    free(im);
}

hyla_status hyla_session_import_end(hyla_import *im, hyla_session **out) {
    *out = NULL;
    hyla_status st = im->failed;
    const hyla_snapshot *snap = im->snap;
    for (uint32_t k = 0; st == HYLA_OK && k < snap->n_parts; k++)
        if (im->map[k].mode != IMP_SKIP && im->arrived[k] != snap->parts[k].nbytes)
            st = hyla_fail(HYLA_ERR_INTERNAL, "import of layer %u part '%s': %llu of its %llu bytes arrived",
                           snap->parts[k].layer, snap->parts[k].name, (unsigned long long)im->arrived[k],
                           (unsigned long long)snap->parts[k].nbytes);
    for (uint32_t k = 0; st == HYLA_OK && k < snap->n_parts; k++)
        if (im->map[k].mode == IMP_CONVERT) st = import_part_sync(im->s, &im->map[k], &snap->parts[k]);
    if (st == HYLA_OK) st = import_token_log(im->s, snap);
    st = import_wait(im, st);
    if (st == HYLA_OK) {
        *out = im->s;
        im->s = NULL;
    }
    import_free(im);
    return st;
}

void hyla_session_import_abort(hyla_import *im) {
    if (!im) return;
    (void)import_wait(im, HYLA_OK); /* the copies write the session's memory: wait before freeing it */
    import_free(im);
}
