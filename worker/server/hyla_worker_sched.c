/* hyla_worker_sched.c — the scheduler thread: continuous batching in a loop of named steps.
 *
 * Every iteration: commands (handlers' requests, I/O outcomes, membership orders) → cancelled
 * calls end their jobs → ONE batched decode step of every generating session → prefill of
 * Append jobs under a token budget, fed so positions land on 64-token boundaries (bit-exact with
 * one uninterrupted feed; sched_feed_len) → auto-snapshots every K tokens (export begun, ended
 * once its copies are done while later steps decode) and drain snapshots → drained? → idle:
 * end pending exports → evict idle sessions over the budgets → publish the heartbeat summary →
 * idle: wait for a command. Generate's token output (stop sequences, finish reasons) is here
 * too, as the decode step's last stage.
 * Threading: the scheduler thread owns the backend, the model, the session table and every
 * job; other threads reach it only through commands. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_worker_impl.h"


/* Draining: remember why handing a session over failed (heartbeats carry it to the coordinator,
 * whose DrainWorker answer shows it to the operator); NULL clears it after a success. */
void set_drain_error(hyla_worker *w, const char *session, const char *err) {
    size_t n = session ? strlen(session) : 0;
    int named = session && strncmp(err, "session ", 8) == 0 && strncmp(err + 8, session, n) == 0;
    pthread_mutex_lock(&w->sum_mu);
    if (!session)
        w->drain_error[0] = 0;
    else if (named) /* the message already starts with "session ID" */
        snprintf(w->drain_error, sizeof w->drain_error, "%s", err);
    else
        snprintf(w->drain_error, sizeof w->drain_error, "session %s: %s", session, err);
    pthread_mutex_unlock(&w->sum_mu);
}

static int snapshot_due(const hyla_worker *w, const wsess *s);

static void publish_summary(hyla_worker *w, uint32_t queued_tokens) {
    size_t n = 0;
    for (wsess *s = w->sessions; s; s = s->next) n++;
    Hyla__V1__WorkerSessionStatus *sum = calloc(n ? n : 1, sizeof *sum);
    char **ids = calloc(n ? n : 1, sizeof *ids);
    size_t i = 0;
    uint32_t gpu = 0, host = 0, calls = 0;
    int snap_in_flight = 0, snap_waiting = 0;
    for (wsess *s = w->sessions; s; s = s->next, i++) {
        snap_in_flight += s->exp || s->put_inflight;
        snap_waiting += snapshot_due(w, s);
        fill_status(w, s, &sum[i]);
        ids[i] = strdup(s->id);
        sum[i].session_id = ids[i];
        gpu += s->s != NULL;
        host += s->host != NULL;
        calls += (s->app != NULL) + (s->gen != NULL);
    }
    free(ids); /* the strings now belong to sum[] */
    double t = now_s();
    double rate = t > w->tok_window_t0 ? w->tok_window / (t - w->tok_window_t0) : 0;
    size_t scratch_logits = 0, scratch = w->rt ? hyla_runtime_scratch_bytes(w->rt, &scratch_logits) : 0;
    if (t - w->tok_window_t0 > 5) {
        w->tok_window_t0 = t;
        w->tok_window = 0;
    }
    pthread_mutex_lock(&w->sum_mu);
    for (size_t k = 0; k < w->n_sum; k++) free(w->sum[k].session_id);
    free(w->sum);
    w->sum = sum;
    w->n_sum = n;
    hyla__v1__worker_load__init(&w->load);
    w->load.sessions_gpu = gpu;
    w->load.sessions_host = host;
    w->load.active_calls = calls;
    w->load.state_bytes = resident_bytes(w);
    w->load.state_budget_bytes = w->p.state_budget_bytes;
    w->load.tokens_per_second = rate;
    w->load.queued_tokens = queued_tokens;
    w->scratch_bytes = scratch;
    w->scratch_logits_bytes = scratch_logits;
    w->snap_in_flight = snap_in_flight;
    w->snap_waiting = snap_waiting;
    pthread_mutex_unlock(&w->sum_mu);
}

/* ------------------------------------------------------------------------------------------ */
/* generation                                                                                  */

/* Longest suffix of text[from..len) that is a proper prefix of some stop sequence. */
static size_t held_suffix(const gen_job *g, size_t from) {
    size_t best = 0;
    for (size_t i = 0; i < g->n_stop; i++) {
        size_t sl = strlen(g->stop[i]);
        for (size_t k = sl - 1; k > best; k--) {
            if (k > g->text_len - from) continue;
            if (!memcmp(g->text + g->text_len - k, g->stop[i], k)) {
                best = k;
                break;
            }
        }
    }
    return best;
}

static void gen_add_text(gen_job *g, const char *bytes, size_t nb) {
    if (g->text_len + nb + 1 > g->text_cap) {
        g->text_cap = (g->text_cap ? g->text_cap * 2 : 256) + nb;
        g->text = realloc(g->text, g->text_cap);
        HYLA_ASSERT(g->text);
    }
    memcpy(g->text + g->text_len, bytes, nb);
    g->text_len += nb;
}

/* A token's outcome, decided before it is sent (decode lanes post the next step in between). */
typedef struct {
    Hyla__V1__FinishReason why; /* unspecified: the job goes on */
    size_t from, to;            /* text bytes [from, to) to send */
    uint64_t position, generated;
} gen_out;

/* Count one sampled token into its job: text, stop conditions, what to send. */
static void deliver_decide(hyla_worker *w, wsess *ws, int32_t tok, gen_out *o) {
    gen_job *g = ws->gen;
    const hyla_model_config *cfg = hyla_model_get_config(w->m);
    g->delivered++;
    int last = g->delivered >= g->max_tokens || (!g->ignore_eos && tok == cfg->eos_token_id);
    for (size_t i = 0; i < g->n_stop_ids; i++)
        if (tok == g->stop_ids[i]) last = 1;
    if (g->ds) {
        size_t nb;
        const char *bytes = hyla_tokenizer_stream_push(g->ds, tok, &nb);
        gen_add_text(g, bytes, nb);
        if (last) { /* a character left incomplete comes out as U+FFFD */
            bytes = hyla_tokenizer_stream_flush(g->ds, &nb);
            gen_add_text(g, bytes, nb);
        }
    }
    Hyla__V1__FinishReason why = HYLA__V1__FINISH_REASON__FINISH_REASON_UNSPECIFIED;
    size_t send_to = g->text_len;
    for (size_t i = 0; i < g->n_stop_ids; i++)
        if (tok == g->stop_ids[i]) why = HYLA__V1__FINISH_REASON__FINISH_STOP;
    if (!why && !g->ignore_eos && tok == cfg->eos_token_id) why = HYLA__V1__FINISH_REASON__FINISH_EOS;
    if (!why && g->n_stop) {
        size_t from = g->text_sent > g->max_stop_len ? g->text_sent - g->max_stop_len : 0;
        for (size_t i = 0; i < g->n_stop; i++) {
            size_t sl = strlen(g->stop[i]);
            for (size_t p = from; p + sl <= g->text_len; p++)
                if (!memcmp(g->text + p, g->stop[i], sl)) {
                    if (p < send_to) send_to = p;
                    why = HYLA__V1__FINISH_REASON__FINISH_STOP;
                    break;
                }
        }
        if (send_to < g->text_sent) send_to = g->text_sent;
    }
    if (!why && g->delivered >= g->max_tokens) why = HYLA__V1__FINISH_REASON__FINISH_LENGTH;
    if (!why && g->n_stop) send_to = g->text_len - held_suffix(g, g->text_sent);
    o->why = why;
    o->from = g->text_sent;
    o->to = send_to > g->text_sent ? send_to : g->text_sent;
    o->position = (uint64_t)hyla_session_position(ws->s);
    o->generated = (uint64_t)hyla_session_generated(ws->s);
    g->text_sent = o->to;
}

/* Send a decided token; returns 1 when the job is finished (replied). posted: the session's next
 * step is already posted, so a failed send only marks the job gone (it ends at that step, whose
 * token the session keeps, and the trailer counts it). */
static int deliver_send(hyla_worker *w, wsess *ws, int32_t tok, const gen_out *o, int posted) {
    (void)w;
    gen_job *g = ws->gen;
    Hyla__V1__FinishReason why = o->why;
    Hyla__V1__GenerateResponse r = HYLA__V1__GENERATE_RESPONSE__INIT;
    r.n_token_ids = 1;
    r.token_ids = &tok;
    r.text.data = (uint8_t *)g->text + o->from;
    r.text.len = o->to - o->from;
    r.position = o->position;
    r.generated = o->generated;
    if (why) {
        r.done = 1;
        r.finish_reason = why;
        r.tokens_delivered = g->delivered;
        hyla_rpc_call_send(g->call, &r.base);
        hyla_rpc_call_reply(g->call, NULL);
        free_gen(g);
        ws->gen = NULL;
        return 1;
    }
    if (!g->gone && hyla_rpc_call_send(g->call, &r.base) == HYLA_OK) return 0;
    if (posted) {
        g->gone = 1;
        return 0;
    }
    /* the client went away: end the job (the call reports its own status); the token stays in
     * the session, and the trailer tells the coordinator how many it kept */
    char n[32];
    snprintf(n, sizeof n, "%u", g->delivered);
    hyla_rpc_call_set_trailer(g->call, HYLA_API_TOKENS_DELIVERED_KEY, n);
    hyla_rpc_call_fail(g->call, HYLA_RPC_CANCELLED, "Generate cancelled");
    free_gen(g);
    ws->gen = NULL;
    return 1;
}

/* Deliver one sampled token; returns 1 when the job is finished (replied). */
static int deliver(hyla_worker *w, wsess *ws, int32_t tok) {
    gen_out o;
    deliver_decide(w, ws, tok, &o);
    return deliver_send(w, ws, tok, &o, 0);
}

/* ------------------------------------------------------------------------------------------ */
/* the loop: one function per step                                                             */

int sched_prefill_budget(int budget, int piece, int generating) {
    return !generating && piece > budget ? piece : budget;
}

int sched_feed_len(int64_t next_pos, size_t queued, int budget, int stream_ended, int chunk) {
    if (stream_ended && queued <= (size_t)budget) return (int)queued;
    int64_t first = ((1 - next_pos) % chunk + chunk) % chunk; /* tokens up to the next boundary */
    if (first == 0) first = chunk;
    int64_t avail = queued < (size_t)budget ? (int64_t)queued : budget;
    return avail < first ? 0 : (int)(first + (avail - first) / chunk * chunk);
}

/* One decode lane: a batch whose step is posted to the later stages and collected later. */
typedef struct {
    int n;                /* sessions posted (0: the lane is idle) */
    hyla_session **batch; /* [max_batch] */
    wsess **ws;           /* [max_batch] */
    int32_t *out;         /* [max_batch] */
    double t0;            /* when it was posted */
} decode_lane;

/* Buffers of one decode step, allocated once for the thread's life. */
typedef struct {
    hyla_session **batch; /* [max_batch] */
    wsess **ws;           /* [max_batch] the batch's sessions */
    int32_t *out;         /* [max_batch] sampled tokens */
    decode_lane lane[HYLA_LANES_MAX];
    /* the tokens of the lane just collected, decided, sent after its next post */
    wsess **got_ws;  /* [max_batch] */
    int32_t *got_tok; /* [max_batch] */
    gen_out *got;     /* [max_batch] */
    int busy;       /* lanes posted */
    int next;       /* the lane collected and posted next (lanes are collected in post order) */
    int lanes;      /* lanes of the posted ones */
    int most_lanes; /* the most lanes used so far (logged as it grows) */
    /* the pace of decoding (pace_count), logged at debug level every 2 s of steady decoding */
    double pace_t0, pace_last;
    uint64_t pace_steps, pace_tokens;
    double pace_wait, pace_post, pace_send; /* s: collect (device + sampling), post, sends */
    wsess **cand; /* [cand_cap] sessions that may decode (fair_cap), grown with the table (cand_room) */
    uint64_t *cand_last; /* [cand_cap] their last_step, for sched_fair_cap */
    int cand_cap;
    /* the whole model's lane step fed the Append jobs between its collect and its post (the
     * runtime runs no other forward while a lane is posted): whether it did, and what
     * step_prefill said */
    int fed_here, fed_worked;
    uint32_t fed_queued;
} decode_bufs;

/* Count a decode step that delivered `tokens` tokens; every 2 s without a pause of 0.1 s between
 * steps, log the mean step (wall time, the host's turn included) and the token rate. */
static void pace_count(decode_bufs *d, int tokens) {
    double t = now_s();
    if (t - d->pace_last > 0.1) { /* idle before this step: a new window */
        d->pace_t0 = t;
        d->pace_steps = d->pace_tokens = 0;
        d->pace_wait = d->pace_post = d->pace_send = 0;
    } else {
        d->pace_steps++;
        d->pace_tokens += (uint64_t)tokens;
    }
    d->pace_last = t;
    if (t - d->pace_t0 >= 2 && d->pace_steps) {
        double k = 1e3 / (double)d->pace_steps;
        HYLA_DEBUG("decode pace: %llu steps of %.1f tokens in %.2f s: %.3f ms a step (collect %.3f, post %.3f, "
                   "sends %.3f), %.0f tokens/s",
                   (unsigned long long)d->pace_steps, (double)d->pace_tokens / (double)d->pace_steps, t - d->pace_t0,
                   (t - d->pace_t0) * k, d->pace_wait * k, d->pace_post * k, d->pace_send * k,
                   (double)d->pace_tokens / (t - d->pace_t0));
        d->pace_t0 = t;
        d->pace_steps = d->pace_tokens = 0;
        d->pace_wait = d->pace_post = d->pace_send = 0;
    }
}

static void lanes_drain(hyla_worker *w, decode_bufs *d);
static int step_prefill(hyla_worker *w, uint32_t *queued);

/* Whether s is among the n sessions of the lane just collected. */
static int lane_got(const decode_bufs *d, int n, const wsess *s) {
    for (int i = 0; i < n; i++)
        if (d->got_ws[i] == s) return 1;
    return 0;
}
static void fail_batch(hyla_worker *w, wsess **ws, int B, hyla_status st, const char *msg);

/* Take every queued command and run it; returns whether there was any (the session table may
 * have changed: the summary is published at once). Commands see no posted lane. */
static int step_commands(hyla_worker *w, decode_bufs *d) {
    pthread_mutex_lock(&w->mu);
    cmd *list = w->q_head;
    w->q_head = w->q_tail = NULL;
    pthread_mutex_unlock(&w->mu);
    int any = list != NULL;
    if (any) lanes_drain(w, d);
    run_commands(w, list);
    return any;
}

/* Cancelled calls (client cancel, deadline) end their jobs, once no lane is posted (a session in
 * a lane would otherwise gain a token after its trailer counted the delivered ones). */
static void step_cancellations(hyla_worker *w, decode_bufs *d) {
    for (wsess *s = w->sessions; s && d->busy; s = s->next)
        if (s->gen && hyla_rpc_call_cancelled(s->gen->call)) lanes_drain(w, d);
    for (append_job *a = w->appends; a && d->busy; a = a->next_reg)
        if (!a->released && hyla_rpc_call_cancelled(a->call)) lanes_drain(w, d);
    for (wsess *s = w->sessions; s; s = s->next) {
        if (s->gen && hyla_rpc_call_cancelled(s->gen->call)) {
            char n[32]; /* the tokens the session kept, for the coordinator's record */
            snprintf(n, sizeof n, "%u", s->gen->delivered);
            hyla_rpc_call_set_trailer(s->gen->call, HYLA_API_TOKENS_DELIVERED_KEY, n);
            hyla_rpc_call_fail(s->gen->call, HYLA_RPC_CANCELLED, "Generate cancelled after %u tokens", s->gen->delivered);
            free_gen(s->gen);
            s->gen = NULL;
        }
    }
    for (append_job *a = w->appends, *next; a; a = next) {
        next = a->next_reg;
        if (!a->released && hyla_rpc_call_cancelled(a->call)) append_finish(w, a, HYLA_RPC_CANCELLED, "Append cancelled");
    }
}

int sched_fair_cap(uint64_t *last, void **items, int n, int cap) {
    if (n <= cap) return n;
    for (int i = 1; i < n; i++) { /* stable insertion sort: n is a few hundred */
        uint64_t k = last[i];
        void *x = items[i];
        int j = i;
        for (; j > 0 && last[j - 1] > k; j--) {
            last[j] = last[j - 1];
            items[j] = items[j - 1];
        }
        last[j] = k;
        items[j] = x;
    }
    return cap;
}

/* When more sessions could decode than a step takes (cap), keep the cap of them decoded least
 * recently (sched_fair_cap): the table's order alone (newest first) would serve the newest and
 * leave the oldest waiting for as long as new ones keep arriving. Which rows share a step does
 * not change any session's tokens. Returns how many of cand[0..n) to take (sorted so). */
static int fair_cap(decode_bufs *d, wsess **cand, int n, int cap) {
    if (n <= cap) return n;
    for (int i = 0; i < n; i++) d->cand_last[i] = cand[i]->last_step;
    return sched_fair_cap(d->cand_last, (void **)cand, n, cap);
}

/* Mark the sessions of a step (or lane post) as decoded now. */
static void mark_step(hyla_worker *w, wsess *const *ws, int B) {
    w->decode_steps++;
    for (int i = 0; i < B; i++) ws[i]->last_step = w->decode_steps;
}

/* Room for every session that may decode now: the list grows with the table (allocated with
 * max_batch places; if growing fails, the sessions past the room wait for a later step). */
static int cand_room(const hyla_worker *w, decode_bufs *d) {
    int k = 0;
    for (const wsess *s = w->sessions; s; s = s->next) k++;
    if (k > d->cand_cap) {
        wsess **c = realloc(d->cand, (size_t)k * sizeof *c);
        if (c) d->cand = c;
        uint64_t *l = realloc(d->cand_last, (size_t)k * sizeof *l);
        if (l) d->cand_last = l;
        if (c && l) d->cand_cap = k;
    }
    return d->cand_cap;
}

/* One batched decode step over every generating session (up to max_batch, fair_cap); returns
 * whether it ran. A failed step fails every call of the batch. */
static int step_decode(hyla_worker *w, decode_bufs *d) {
    int n = 0, room = cand_room(w, d);
    for (wsess *s = w->sessions; s && n < room; s = s->next)
        if (s->gen && s->s) d->cand[n++] = s;
    int B = fair_cap(d, d->cand, n, w->p.max_batch);
    for (int i = 0; i < B; i++) {
        d->ws[i] = d->cand[i];
        d->batch[i] = d->cand[i]->s;
    }
    if (!B) return 0;
    mark_step(w, d->ws, B);
    double t0 = now_s();
    hyla_status st = hyla_session_decode(d->batch, B, d->out, NULL);
    if (st != HYLA_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", hyla_last_error());
        HYLA_ERROR("decode step of %d sessions failed: %s", B, msg);
        fail_batch(w, d->ws, B, st, msg);
    } else {
        double t1 = now_s();
        w->tok_window += (uint64_t)B;
        worker_metrics_tokens(w, "decode", (uint64_t)B, t1 - t0);
        pace_count(d, B);
        for (int i = 0; i < B; i++) {
            d->ws[i]->last_used = t1;
            deliver(w, d->ws[i], d->out[i]);
        }
        d->pace_wait += t1 - t0;
        d->pace_send += now_s() - t1;
    }
    return 1;
}

/* ---- decode lanes ----
 * A whole-model worker on a GPU keeps one lane: each scheduler step collects it (waits for the
 * step's logits, samples), posts the next step of the sessions that go on, and only then sends
 * the collected tokens, so the device runs step N + 1 while the host sends step N's tokens and
 * does the loop's other work (the host's turn between steps is otherwise the device's idle
 * time). On a pipeline's first stage (one GPU per stage, --micro-batches M >= 2) with at least
 * M * HYLA_MICRO_BATCH_MIN_ROWS generating sessions, decoding runs in L = min(M, HYLA_LANES_MAX)
 * lanes: each scheduler step collects the oldest lane (waits for its logits, samples, delivers)
 * and posts it again with up to ceil(sessions / L) sessions, so while one lane's step is in the
 * later stages the next runs here, and consecutive steps overlap across the stages. Anything
 * else that touches sessions (commands, cancellations, Append feeds, draining, shutdown) first
 * collects every lane (lanes_drain); a session whose auto-snapshot is due sits out one lane
 * step instead (left out of the post, taken by step_snapshots). Rows are independent, so a session's tokens
 * are the same bits in any lane. */
static int lanes_count(hyla_worker *w, int n_gen) {
    int lb, le;
    hyla_model_layer_range(w->m, &lb, &le);
    if (holds_all_layers(w)) return w->ahead && n_gen > 0;
    int M = hyla_runtime_micro_batches(w->rt), L = M < HYLA_LANES_MAX ? M : HYLA_LANES_MAX;
    if (n_gen / HYLA_MICRO_BATCH_MIN_ROWS < L) L = n_gen / HYLA_MICRO_BATCH_MIN_ROWS;
    if (lb != 0 || w->tp || L < 2 || !w->lanes_on) return 0;
    return L;
}

/* Fail a batch's calls after a failed decode step. */
static void fail_batch(hyla_worker *w, wsess **ws, int B, hyla_status st, const char *msg) {
    (void)w;
    for (int i = 0; i < B; i++) {
        if (!ws[i]->gen) continue;
        char n[32];
        snprintf(n, sizeof n, "%u", ws[i]->gen->delivered);
        hyla_rpc_call_set_trailer(ws[i]->gen->call, HYLA_API_TOKENS_DELIVERED_KEY, n);
        fail_call(ws[i]->gen->call, st, msg);
        free_gen(ws[i]->gen);
        ws[i]->gen = NULL;
    }
}

/* Collect lane k's tokens and decide each (deliver_decide) into d->got; returns how many (0
 * after a failure, whose calls are failed). The lane is idle afterwards. */
static int lane_take(hyla_worker *w, decode_bufs *d, int k) {
    decode_lane *ln = &d->lane[k];
    int n = ln->n;
    hyla_status st = hyla_session_decode_collect(ln->batch, n, k, ln->out);
    for (int i = 0; i < n; i++) ln->ws[i]->in_lane = 0;
    ln->n = 0;
    d->busy--;
    if (st != HYLA_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", hyla_last_error());
        HYLA_ERROR("decode lane %d of %d sessions failed: %s", k, n, msg);
        fail_batch(w, ln->ws, n, st, msg);
        return 0;
    }
    w->tok_window += (uint64_t)n;
    worker_metrics_tokens(w, "decode", (uint64_t)n, now_s() - ln->t0);
    pace_count(d, n);
    for (int i = 0; i < n; i++) {
        d->got_ws[i] = ln->ws[i];
        d->got_tok[i] = ln->out[i];
        ln->ws[i]->last_used = now_s();
        if (ln->ws[i]->gen) deliver_decide(w, ln->ws[i], ln->out[i], &d->got[i]);
    }
    return n;
}

/* Send what lane_take decided. */
static void lane_send(hyla_worker *w, decode_bufs *d, int n) {
    for (int i = 0; i < n; i++)
        if (d->got_ws[i]->gen) deliver_send(w, d->got_ws[i], d->got_tok[i], &d->got[i], d->got_ws[i]->in_lane);
}

/* Collect lane k: its logits, the sampled tokens, delivered. */
static void lane_collect(hyla_worker *w, decode_bufs *d, int k) {
    lane_send(w, d, lane_take(w, d, k));
}

/* Collect every posted lane, oldest first. */
static void lanes_drain(hyla_worker *w, decode_bufs *d) {
    for (int i = 0; i < HYLA_LANES_MAX && d->busy; i++) {
        int k = (d->next + i) % HYLA_LANES_MAX;
        if (d->lane[k].n) lane_collect(w, d, k);
    }
    d->next = 0;
}

/* Whether anything this step is about to do needs the sessions out of the lanes: Append jobs
 * (except on the whole model, whose lane step feeds them between its collect and its post),
 * draining, shutdown. (A session whose auto-snapshot is due sits out one lane step instead:
 * step_decode_lanes leaves it out, step_snapshots takes it.) */
static int lanes_must_drain(hyla_worker *w) {
    return (w->appends && !holds_all_layers(w)) || w->draining || w->stop;
}

/* An auto-snapshot of s is due (every snapshot_every tokens; not while one is on its way). */
static int snapshot_due(const hyla_worker *w, const wsess *s) {
    return s->s && w->p.snapshot_every && !s->put_inflight && !s->exp && now_s() >= s->snap_retry_at &&
           (uint64_t)hyla_session_position(s->s) >= s->snap_pos + w->p.snapshot_every;
}

/* How many more auto-snapshots may begin now (--snapshot-concurrency less the sessions whose
 * export or put is in flight). Many sessions pass a snapshot point together (a batch started
 * together generates in step): begun at once, their exports would each take a buffer (a new
 * pinned one stalls every GPU call while it is page-locked) and their puts would queue behind one
 * another anyway; so the rest stay due and go on decoding until a slot frees. */
static int snapshot_room(const hyla_worker *w) {
    if (!w->p.snapshot_concurrency) return INT_MAX;
    int busy = 0;
    for (const wsess *s = w->sessions; s; s = s->next) busy += s->exp || s->put_inflight;
    return busy < (int)w->p.snapshot_concurrency ? (int)w->p.snapshot_concurrency - busy : 0;
}

/* Whether s sits out the lane step being posted for its due auto-snapshot (while *room lasts). */
static int sits_out(const hyla_worker *w, const wsess *s, int *room) {
    if (*room <= 0 || !snapshot_due(w, s)) return 0;
    (*room)--;
    return 1;
}

/* One scheduler step of L lanes: collect lane d->next, post it again, then send its tokens, so
 * the first GPU runs the lane's next step while the host sends. A session goes on in the lane
 * when its token did not end its job (decided before the post, stop sequences included);
 * sessions not in a lane fill the rest. Returns whether it ran. */
static int step_decode_lanes(hyla_worker *w, decode_bufs *d, int L, int n_gen) {
    int k = d->next, worked = 0, got = 0;
    decode_lane *ln = &d->lane[k];
    if (ln->n) {
        double t0 = now_s();
        got = lane_take(w, d, k);
        d->pace_wait += now_s() - t0;
        worked = 1;
        n_gen = 0;
        for (wsess *s = w->sessions; s; s = s->next) n_gen += s->gen && s->s && !(s->gen->gone);
    }
    if (holds_all_layers(w)) { /* prompts are fed here, with no lane posted, then the step */
        d->fed_worked = step_prefill(w, &d->fed_queued);
        d->fed_here = 1;
    }
    int per = (w->p.max_batch + L - 1) / L, cap = (n_gen + L - 1) / L;
    if (cap > per) cap = per;
    int nc = 0, room = snapshot_room(w), fit = cand_room(w, d);
    wsess **cand = d->cand;
    for (int i = 0; i < got && nc < fit; i++) { /* the lane's own sessions first, in their order */
        wsess *s = d->got_ws[i];
        if (s->gen && !s->gen->gone && !d->got[i].why && s->s && !sits_out(w, s, &room)) cand[nc++] = s;
    }
    for (wsess *s = w->sessions; s && nc < fit; s = s->next)
        if (s->gen && !s->gen->gone && s->s && !s->in_lane && !lane_got(d, got, s) && !sits_out(w, s, &room))
            cand[nc++] = s;
    int B = fair_cap(d, cand, nc, cap); /* then the least recently decoded, when they are too many */
    for (int i = 0; i < B; i++) {
        ln->ws[i] = cand[i];
        ln->batch[i] = cand[i]->s;
    }
    d->next = (k + 1) % L;
    if (B) {
        ln->t0 = now_s();
        hyla_status st = hyla_session_decode_post(ln->batch, B, k, k * per, L * per);
        d->pace_post += now_s() - ln->t0;
        if (st != HYLA_OK) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", hyla_last_error());
            HYLA_ERROR("posting decode lane %d of %d sessions failed: %s", k, B, msg);
            lane_send(w, d, got); /* the tokens sampled before the failure still reach their clients */
            fail_batch(w, ln->ws, B, st, msg);
            return 1;
        }
        for (int i = 0; i < B; i++) ln->ws[i]->in_lane = 1;
        mark_step(w, ln->ws, B);
        ln->n = B;
        d->busy++;
        worked = 1;
    }
    double t0 = now_s();
    lane_send(w, d, got);
    d->pace_send += now_s() - t0;
    return worked;
}

/* The decode step: in lanes when they apply, else one batched step. */
static int step_decode_any(hyla_worker *w, decode_bufs *d) {
    int n_gen = 0;
    for (wsess *s = w->sessions; s; s = s->next) n_gen += s->gen && s->s;
    int L = lanes_count(w, n_gen);
    if (L && d->busy && L != d->lanes) lanes_drain(w, d); /* lanes are posted round robin over L */
    if (L) {
        if (L > d->most_lanes) {
            if (holds_all_layers(w)) HYLA_INFO("decode one step ahead (%d sessions generating)", n_gen);
            else HYLA_INFO("decode in %d lanes (%d sessions generating)", L, n_gen);
            d->most_lanes = L;
        }
        d->lanes = L;
        return step_decode_lanes(w, d, L, n_gen);
    }
    if (d->busy) lanes_drain(w, d);
    return step_decode(w, d);
}

typedef enum { FEED_NONE, FEED_OK, FEED_FAILED } feed_result;

/* Feed what the budget and the alignment allow of one Append job's queued tokens. FEED_FAILED:
 * the feed failed and the job is ended (a may be freed). */
static feed_result feed_append(hyla_worker *w, wsess *s, append_job *a, int *budget) {
    if (!a->n || *budget <= 0 || !s->s) return FEED_NONE;
    int64_t next_pos = hyla_session_position(s->s) + (hyla_session_pending(s->s) >= 0);
    int n = sched_feed_len(next_pos, a->n, *budget, a->half_closed, hyla_runtime_prefill_chunk(w->rt));
    if (n == 0) return FEED_NONE;
    int consumed = 0;
    double t0 = now_s();
    hyla_status st = hyla_session_feed(s->s, a->toks, n, NULL, &consumed, NULL, NULL);
    if (st != HYLA_OK) {
        append_finish(w, a, hyla_rpc_code_from_status(st), "%s", hyla_last_error());
        return FEED_FAILED;
    }
    memmove(a->toks, a->toks + n, (a->n - (size_t)n) * sizeof *a->toks);
    a->n -= (size_t)n;
    a->ingested += (uint64_t)n;
    *budget -= n;
    w->tok_window += (uint64_t)n;
    s->last_used = now_s();
    worker_metrics_tokens(w, "prefill", (uint64_t)n, s->last_used - t0);
    HYLA_DEBUG("fed %d tokens of %s in %.1f ms (position %lld)", n, s->id, (s->last_used - t0) * 1e3,
               (long long)hyla_session_position(s->s));
    if (a->held && a->n < (size_t)w->p.prefill_budget * 16) {
        hyla_rpc_call_read_resume(a->call);
        a->held = 0;
    }
    return FEED_OK;
}

/* Tell an Append's client how far it got (at most every 0.2 s), and answer it once its stream
 * has ended and everything is fed. */
static void append_progress(hyla_worker *w, wsess *s, append_job *a) {
    double t = now_s();
    int done = a->half_closed && a->n == 0;
    if (!done && t - a->last_progress <= 0.2) return;
    if (done) { /* the last pieces may still be posted to the later stages: done once they answer */
        hyla_status st = hyla_runtime_finish(w->rt);
        if (st != HYLA_OK) {
            append_finish(w, a, hyla_rpc_code_from_status(st), "%s", hyla_last_error());
            return;
        }
    }
    Hyla__V1__AppendProgress pr = HYLA__V1__APPEND_PROGRESS__INIT;
    pr.tokens_received = a->received;
    pr.tokens_ingested = a->ingested;
    pr.total_tokens = a->total_hint;
    pr.tokens_per_second = t > a->t0 ? a->ingested / (t - a->t0) : 0;
    pr.position = (uint64_t)hyla_session_position(s->s); /* consumed, as everywhere */
    pr.done = done;
    a->last_progress = t;
    if (done) {
        hyla_rpc_call_send(a->call, &pr.base);
        append_finish(w, a, HYLA_RPC_OK, " ");
    } else if (a->ingested) {
        hyla_rpc_call_send(a->call, &pr.base);
    }
}

/* Prefill of Append jobs under the step's token budget (sched_prefill_budget); returns whether
 * any feed ran and sets *queued to the tokens still waiting. */
static int step_prefill(hyla_worker *w, uint32_t *queued) {
    int generating = 0, worked = 0;
    for (wsess *s = w->sessions; s && !generating; s = s->next) generating = s->gen != NULL;
    int budget = sched_prefill_budget(w->p.prefill_budget, hyla_runtime_prefill_piece(w->rt), generating);
    *queued = 0;
    for (wsess *s = w->sessions; s; s = s->next) {
        append_job *a = s->app;
        if (!a) continue;
        feed_result r = feed_append(w, s, a, &budget);
        if (r != FEED_NONE) worked = 1;
        if (r == FEED_FAILED) continue;
        *queued += (uint32_t)a->n;
        append_progress(w, s, a);
    }
    return worked;
}

/* Auto-snapshots every snapshot_every tokens (begun here, ended once their copies are done), and
 * while draining a durable snapshot of every idle session. Only stage 0 snapshots. */
static void step_snapshots(hyla_worker *w) {
    int lb0, le0;
    hyla_model_layer_range(w->m, &lb0, &le0);
    int whole = holds_all_layers(w);
    if (lb0 != 0) return;
    for (wsess *s = w->sessions; s; s = s->next)
        if (s->exp && hyla_session_export_done(s->exp)) finish_export(w, s);
    int room = snapshot_room(w); /* auto-snapshots; a drain's puts are not limited */
    for (wsess *s = w->sessions; s; s = s->next) {
        if (!s->s || s->put_inflight || s->exp || s->in_lane) continue; /* in a lane: once it sits out */
        int drain = w->draining && !s->app && !s->gen && now_s() >= s->snap_retry_at;
        int due = !drain && room > 0 && snapshot_due(w, s);
        room -= due;
        if (due && whole) {
            s->exp_base = incremental_base(w, s);
            s->exp_t0 = now_s();
            if (hyla_session_export_begin_since(s->s, s->exp_base, &s->exp) != HYLA_OK) {
                HYLA_WARN("snapshot of %s: %s (retrying in 2 s)", s->id, hyla_last_error());
                s->snap_retry_at = now_s() + 2;
            } else {
                HYLA_DEBUG("snapshot of %s: export begun at position %lld since %llu (%.1f ms)", s->id,
                           (long long)hyla_session_position(s->s), (unsigned long long)s->exp_base,
                           (now_s() - s->exp_t0) * 1e3);
            }
        } else if (due || drain) {
            if (start_put(w, s, NULL, 0, drain) != HYLA_OK) {
                HYLA_WARN("snapshot of %s: %s (retrying in 2 s)", s->id, hyla_last_error());
                if (drain) set_drain_error(w, s->id, hyla_last_error());
                s->snap_retry_at = now_s() + 2;
            }
        }
    }
}

/* Draining: once no session is left (each was unloaded after its durable put), say so to
 * hyla_worker_wait and the membership thread. */
static void step_drain(hyla_worker *w) {
    if (!w->draining || w->drained || w->sessions) return;
    HYLA_INFO("drained: every session is durable in the store");
    pthread_mutex_lock(&w->exit_mu);
    w->drained = 1;
    pthread_cond_broadcast(&w->exit_cv);
    pthread_mutex_unlock(&w->exit_mu);
}

/* Idle: wait up to 50 ms for a command, or 1 ms while an auto-snapshot's copies are in flight
 * (step_snapshots queues its put once they are done). The scheduler never waits for the copies
 * themselves: those of a long document's KV take seconds, and a Generate or Append arriving
 * meanwhile must not wait behind them (nothing but a put, a fork or a drop of that session
 * needs them finished). */
static void step_idle_wait(hyla_worker *w) {
    int exporting = 0;
    for (wsess *s = w->sessions; s && !exporting; s = s->next) exporting = s->exp != NULL;
    pthread_mutex_lock(&w->mu);
    if (!w->q_head && !w->stop) hyla_cond_wait_ms(&w->cv, &w->mu, exporting ? 1 : 50);
    pthread_mutex_unlock(&w->mu);
}

/* Shutdown: end every job and call, free the sessions, fail the commands still queued. */
static void shutdown_jobs(hyla_worker *w) {
    while (w->sessions) drop_session(w, w->sessions, "the worker is shutting down");
    for (append_job *a = w->appends; a; a = a->next_reg)
        if (!a->released) {
            a->done_seen = 0; /* freed below, not inside append_finish */
            append_finish(w, a, HYLA_RPC_UNAVAILABLE, "the worker is shutting down");
        }
    while (w->appends) {
        append_job *a = w->appends;
        w->appends = a->next_reg;
        free_append(a);
    }
    for (stage_call *sc = w->stage_calls; sc; sc = sc->next)
        if (!sc->released) {
            sc->released = 1;
            hyla_rpc_call_fail(sc->call, HYLA_RPC_UNAVAILABLE, "the worker is shutting down");
        }
    while (w->stage_calls) {
        stage_call *sc = w->stage_calls;
        w->stage_calls = sc->next;
        free(sc);
    }
    close_next(w);
    pthread_mutex_lock(&w->mu);
    cmd *list = w->q_head;
    w->q_head = w->q_tail = NULL;
    pthread_mutex_unlock(&w->mu);
    while (list) {
        cmd *c = list;
        list = list->next;
        if (c->call && c->type != C_APPEND_MSG && c->type != C_APPEND_END && c->type != C_APPEND_START &&
            c->type != C_APPEND_DONE && c->type < C_STAGE_START)
            hyla_rpc_call_fail(c->call, HYLA_RPC_UNAVAILABLE, "the worker is shutting down");
        free_cmd(c);
    }
}

void *scheduler_main(void *arg) {
    hyla_worker *w = arg;
    decode_bufs d;
    d.batch = malloc((size_t)w->p.max_batch * sizeof *d.batch);
    d.ws = malloc((size_t)w->p.max_batch * sizeof *d.ws);
    d.out = malloc((size_t)w->p.max_batch * sizeof *d.out);
    HYLA_ASSERT(d.batch && d.ws && d.out);
    for (int k = 0; k < HYLA_LANES_MAX; k++) {
        decode_lane *ln = &d.lane[k];
        *ln = (decode_lane){0};
        ln->batch = malloc((size_t)w->p.max_batch * sizeof *ln->batch);
        ln->ws = malloc((size_t)w->p.max_batch * sizeof *ln->ws);
        ln->out = malloc((size_t)w->p.max_batch * sizeof *ln->out);
        HYLA_ASSERT(ln->batch && ln->ws && ln->out);
    }
    d.got_ws = malloc((size_t)w->p.max_batch * sizeof *d.got_ws);
    d.got_tok = malloc((size_t)w->p.max_batch * sizeof *d.got_tok);
    d.got = malloc((size_t)w->p.max_batch * sizeof *d.got);
    HYLA_ASSERT(d.got_ws && d.got_tok && d.got);
    d.busy = d.next = d.lanes = d.most_lanes = 0;
    d.pace_t0 = d.pace_last = 0;
    d.pace_steps = d.pace_tokens = 0;
    d.pace_wait = d.pace_post = d.pace_send = 0;
    d.fed_here = d.fed_worked = 0;
    d.fed_queued = 0;
    d.cand = malloc((size_t)w->p.max_batch * sizeof *d.cand);
    d.cand_last = malloc((size_t)w->p.max_batch * sizeof *d.cand_last);
    HYLA_ASSERT(d.cand && d.cand_last);
    d.cand_cap = w->p.max_batch;
    w->tok_window_t0 = now_s();
    double last_pub = 0;
    while (!w->stop) {
        int commands = step_commands(w, &d);
        step_cancellations(w, &d);
        if (d.busy && lanes_must_drain(w)) lanes_drain(w, &d);
        d.fed_here = 0;
        int worked = step_decode_any(w, &d);
        uint32_t queued = d.fed_queued;
        if (d.fed_here) worked |= d.fed_worked;
        else worked |= step_prefill(w, &queued);
        step_snapshots(w);
        step_drain(w);
        evict_if_needed(w);
        double t = now_s();
        if (t - last_pub > 0.2 || worked || commands) {
            publish_summary(w, queued);
            last_pub = t;
        }
        if (!worked) step_idle_wait(w);
    }
    lanes_drain(w, &d);
    shutdown_jobs(w);
    for (int k = 0; k < HYLA_LANES_MAX; k++) {
        free(d.lane[k].batch);
        free(d.lane[k].ws);
        free(d.lane[k].out);
    }
    free(d.cand);
    free(d.cand_last);
    free(d.got_ws);
    free(d.got_tok);
    free(d.got);
    free(d.batch);
    free(d.ws);
    free(d.out);
    return NULL;
}
