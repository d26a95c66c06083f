/* hyla_worker.c — the Worker service: lifecycle, the gRPC handlers and the commands they post.
 *
 * The program's other files: hyla_worker_sched.c (the scheduler loop), hyla_worker_pool.c
 * (session table and tiers), hyla_worker_stage.c (pipelines), hyla_worker_io.c (statestore and
 * coordinator threads); hyla_worker_impl.h has the types they share.
 *
 * Threads and ownership:
 *   - rpc loop threads run the handlers; a handler copies its request into a command and
 *     posts it to the scheduler (never touches sessions);
 *   - the scheduler thread owns the backend, the model, the session table and every job;
 *     it replies to calls (or hands them to the I/O thread with the data they need);
 *   - the I/O thread performs statestore calls (put/get) and reports to the coordinator, then
 *     posts the outcome back to the scheduler as a command;
 *   - the membership thread registers and heartbeats; it reads a summary the scheduler
 *     publishes under `sum_mu` and posts commands (drop, drain) when the coordinator asks.
 * A call handed to the scheduler is replied exactly once by whoever holds it last. Jobs poll
 * hyla_rpc_call_cancelled() every step, so a client cancel or deadline ends its job.
 *
 * Auto-snapshots overlap compute: the scheduler begins an export (hyla_session_export_begin,
 * the state at that position), keeps decoding, polls it every iteration and, once its copies
 * are done (or the scheduler has nothing else to do), ends it and queues the durable put as a
 * synchronous export would have. Whatever needs the session's state at once or frees it
 * (Snapshot, Unload, Fork, ExportStage, eviction, drop, shutdown) finishes a pending export
 * first (finish_export). Pipelines (stage 0 without the last layer) export synchronously: the
 * later stages' parts are gathered at the snapshot's position, which must still be theirs. */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hyla_auth.h"
#include "hyla_worker_impl.h"

/* Every method of this port needs the cluster credential (or the operator key) when the cluster
 * is keyed; the rpc layer refuses other callers before a handler runs. */
static hyla_status worker_protect(hyla_rpc_server *srv, const char *admin_key) {
    if (!admin_key || !admin_key[0]) {
        HYLA_WARN("worker: DEVELOPMENT MODE: no --admin-key-file, so this port accepts any caller");
        return HYLA_OK;
    }
    char cred[HYLA_AUTH_KEY_MAX];
    hyla_auth_cluster_credential(admin_key, cred);
    HYLA_TRY(hyla_rpc_server_accept_key(srv, cred, HYLA_RPC_PRINCIPAL_CLUSTER));
    return hyla_rpc_server_accept_key(srv, admin_key, HYLA_RPC_PRINCIPAL_OPERATOR);
}

hyla_worker_params hyla_worker_default_params(void) {
    hyla_worker_params p;
    memset(&p, 0, sizeof p);
    p.device = "cpu";
    p.layer_end = -1;
    p.tp = 1;
    p.listen = "127.0.0.1:0";
    p.snapshot_every = 1024;
    p.snapshot_concurrency = 4;
    p.max_batch = 64;
    p.prefill_budget = 1024; /* one default prefill piece (hyla_model.h) per scheduler step */
    p.micro_batches = 2;
    p.max_generate = 65536;
    p.max_append_tokens = 1u << 24;
    p.rpc_threads = 2;
    p.max_message_bytes = 16 << 20;
    p.host_budget_bytes = 1ull << 32;
    return p;
}

void post_cmd(hyla_worker *w, cmd *c) {
    pthread_mutex_lock(&w->mu);
    c->next = NULL;
    if (w->q_tail) w->q_tail->next = c;
    else w->q_head = c;
    w->q_tail = c;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

cmd *new_cmd(cmd_type t, hyla_rpc_call *call, const ProtobufCMessage *msg) {
    cmd *c = calloc(1, sizeof *c);
    HYLA_ASSERT(c);
    c->type = t;
    c->call = call;
    if (msg) c->msg = hyla_rpc_message_dup(msg);
    return c;
}

void free_cmd(cmd *c) {
    if (!c) return;
    if (c->msg) protobuf_c_message_free_unpacked(c->msg, NULL);
    hyla_snapshot_destroy(c->snap);
    free(c);
}

void io_post(hyla_worker *w, io_item *it) {
    pthread_mutex_lock(&w->io_mu);
    it->next = NULL;
    if (w->io_tail) w->io_tail->next = it;
    else w->io_head = it;
    w->io_tail = it;
    pthread_cond_signal(&w->io_cv);
    pthread_mutex_unlock(&w->io_mu);
}

/* ------------------------------------------------------------------------------------------ */
/* handlers (rpc loop threads): copy and post                                                  */

static void h_unary(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *msg, void *ud, cmd_type t) {
    if (ev != HYLA_RPC_EV_START) return;
    post_cmd(ud, new_cmd(t, call, msg));
}
static void h_load(hyla_rpc_call *c, hyla_rpc_event e, const ProtobufCMessage *m, void *ud) { h_unary(c, e, m, ud, C_LOAD); }
static void h_snapshot(hyla_rpc_call *c, hyla_rpc_event e, const ProtobufCMessage *m, void *ud) { h_unary(c, e, m, ud, C_SNAPSHOT); }
static void h_unload(hyla_rpc_call *c, hyla_rpc_event e, const ProtobufCMessage *m, void *ud) { h_unary(c, e, m, ud, C_UNLOAD); }
static void h_fork(hyla_rpc_call *c, hyla_rpc_event e, const ProtobufCMessage *m, void *ud) { h_unary(c, e, m, ud, C_FORK); }
static void h_describe(hyla_rpc_call *c, hyla_rpc_event e, const ProtobufCMessage *m, void *ud) { h_unary(c, e, m, ud, C_DESCRIBE); }
static void h_read_tokens(hyla_rpc_call *c, hyla_rpc_event e, const ProtobufCMessage *m, void *ud) { h_unary(c, e, m, ud, C_READ_TOKENS); }

static void h_export(hyla_rpc_call *c, hyla_rpc_event e, const ProtobufCMessage *m, void *ud) { h_unary(c, e, m, ud, C_EXPORT); }

static void h_generate(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *msg, void *ud) {
    hyla_worker *w = ud;
    if (ev == HYLA_RPC_EV_START) post_cmd(w, new_cmd(C_GENERATE, call, msg));
    else if (ev == HYLA_RPC_EV_DONE) post_cmd(w, new_cmd(C_WAKE, NULL, NULL)); /* let the scheduler see a cancel */
}

static void h_append(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *msg, void *ud) {
    hyla_worker *w = ud;
    switch (ev) {
    case HYLA_RPC_EV_START: post_cmd(w, new_cmd(C_APPEND_START, call, NULL)); break;
    case HYLA_RPC_EV_MESSAGE: post_cmd(w, new_cmd(C_APPEND_MSG, call, msg)); break;
    case HYLA_RPC_EV_HALF_CLOSE: post_cmd(w, new_cmd(C_APPEND_END, call, NULL)); break;
    case HYLA_RPC_EV_DONE: post_cmd(w, new_cmd(C_APPEND_DONE, call, NULL)); break;
    }
}

static void h_stage(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *msg, void *ud) {
    hyla_worker *w = ud;
    switch (ev) {
    case HYLA_RPC_EV_START: post_cmd(w, new_cmd(C_STAGE_START, call, NULL)); break;
    case HYLA_RPC_EV_MESSAGE: post_cmd(w, new_cmd(C_STAGE_MSG, call, msg)); break;
    case HYLA_RPC_EV_HALF_CLOSE: post_cmd(w, new_cmd(C_STAGE_END, call, NULL)); break;
    case HYLA_RPC_EV_DONE: post_cmd(w, new_cmd(C_STAGE_DONE, call, NULL)); break;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* calls and their jobs                                                                        */

void fail_call(hyla_rpc_call *call, hyla_status st, const char *msg) {
    if (call) hyla_rpc_call_fail_status(call, st, msg);
}

void free_append(append_job *a) {
    if (!a) return;
    free(a->toks);
    free(a->tbuf);
    free(a);
}

static append_job *find_append(hyla_worker *w, hyla_rpc_call *call) {
    for (append_job *a = w->appends; a; a = a->next_reg)
        if (a->call == call) return a;
    return NULL;
}

static void unregister_append(hyla_worker *w, append_job *a) {
    append_job **pp = &w->appends;
    while (*pp && *pp != a) pp = &(*pp)->next_reg;
    if (*pp) *pp = a->next_reg;
    free_append(a);
}

/* Release an Append call: reply OK (code HYLA_RPC_OK) or fail; detach it from its session. */
void append_finish(hyla_worker *w, append_job *a, hyla_rpc_code code, const char *fmt, ...) {
    if (a->released) return;
    a->released = 1;
    wsess *ws = a->ws;
    if (ws && ws->app == a) ws->app = NULL;
    a->ws = NULL;
    if (code == HYLA_RPC_OK) {
        hyla_rpc_call_reply(a->call, NULL);
    } else {
        char msg[1024];
        va_list ap;
        va_start(ap, fmt);
        int len = vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        /* what the failed call left: the pieces fed before the error stay in the session (an
         * Append is not a transaction), so say how many and where the session now is */
        if (a->ingested && ws && ws->s && len >= 0 && (size_t)len < sizeof msg)
            snprintf(msg + len, sizeof msg - (size_t)len,
                     " (this Append had added %llu tokens to session %s before it ended; they stay, and the session "
                     "is at position %lld)",
                     (unsigned long long)a->ingested, ws->id, (long long)hyla_session_position(ws->s));
        hyla_rpc_call_fail(a->call, code, "%s", msg);
    }
    if (a->done_seen) unregister_append(w, a);
}
void free_gen(gen_job *g) {
    if (!g) return;
    for (size_t i = 0; i < g->n_stop; i++) free(g->stop[i]);
    free(g->stop);
    free(g->stop_ids);
    free(g->text);
    hyla_tokenizer_stream_free(g->ds);
    free(g);
}

static void reply_session(hyla_worker *w, hyla_rpc_call *call, wsess *ws, double t0) {
    Hyla__V1__WorkerSessionStatus st;
    fill_status(w, ws, &st);
    Hyla__V1__WorkerSessionResponse r = HYLA__V1__WORKER_SESSION_RESPONSE__INIT;
    r.session = &st;
    r.state_bytes = ws->s ? hyla_session_state_bytes(ws->s) : 0;
    r.load_ms = (uint64_t)((now_s() - t0) * 1000);
    hyla_rpc_call_reply(call, &r.base);
}

static hyla_sampling sampling_from(const Hyla__V1__SamplingParams *sp) {
    hyla_sampling s = {0.0f, 0, 1.0f};
    if (sp) {
        s.temperature = sp->temperature;
        s.top_k = sp->top_k > 0 ? sp->top_k : 0; /* <= 0: top-k off (the proto's rule) */
        s.top_p = (sp->top_p <= 0 || sp->top_p >= 1) ? 1.0f : sp->top_p;
    }
    return s;
}

static const char *bad_sampling(const Hyla__V1__SamplingParams *sp) {
    if (!sp) return NULL;
    if (!isfinite(sp->temperature) || sp->temperature < 0) return "sampling.temperature must be >= 0";
    if (!isfinite(sp->top_p) || sp->top_p < 0 || sp->top_p > 1) return "sampling.top_p must be in [0, 1]";
    return NULL;
}

static int valid_id(const char *id) { return hyla_session_id_check(id, "session_id") == HYLA_OK; }

/* ------------------------------------------------------------------------------------------ */
/* commands on the scheduler                                                                   */

static void do_load(hyla_worker *w, cmd *c) {
    const Hyla__V1__LoadSessionRequest *r = (const Hyla__V1__LoadSessionRequest *)c->msg;
    double t0 = now_s();
    if (!valid_id(r->session_id)) {
        hyla_rpc_call_fail(c->call, HYLA_RPC_INVALID_ARGUMENT, "LoadSession: session_id must be 1..%d printable bytes",
                           HYLA_SESSION_ID_MAX);
        return;
    }
    const char *bad = bad_sampling(r->sampling);
    if (bad) {
        hyla_rpc_call_fail(c->call, HYLA_RPC_INVALID_ARGUMENT, "LoadSession: %s", bad);
        return;
    }
    if (w->draining) {
        hyla_rpc_call_fail(c->call, HYLA_RPC_UNAVAILABLE, "worker %s is draining", w->worker_id);
        return;
    }
    wsess *ws = session_find(w, r->session_id);
    if (ws) {
        if (r->placement_epoch < ws->epoch) {
            hyla_rpc_call_fail(c->call, HYLA_RPC_FAILED_PRECONDITION,
                               "LoadSession %s: placement epoch %llu is older than the resident one (%llu)", ws->id,
                               (unsigned long long)r->placement_epoch, (unsigned long long)ws->epoch);
            return;
        }
        if (r->placement_epoch == ws->epoch && (r->snapshot_version == 0 || r->snapshot_version == ws->snap_version)) {
            hyla_status st = make_resident(w, ws);
            if (st != HYLA_OK) fail_call(c->call, st, hyla_last_error());
            else reply_session(w, c->call, ws, t0);
            return;
        }
        drop_session(w, ws, "superseded by a newer placement");
    }
    if (r->snapshot_version == 0) {
        ws = calloc(1, sizeof *ws);
        HYLA_ASSERT(ws);
        snprintf(ws->id, sizeof ws->id, "%s", r->session_id);
        ws->epoch = r->placement_epoch;
        hyla_status st = hyla_session_create(w->rt, &ws->s);
        if (st != HYLA_OK) {
            fail_call(c->call, st, hyla_last_error());
            free(ws);
            return;
        }
        hyla_session_set_sampling(ws->s, sampling_from(r->sampling), r->seed);
        hyla_session_set_tag(ws->s, ws);
        ws->last_used = now_s();
        ws->next = w->sessions;
        w->sessions = ws;
        reply_session(w, c->call, ws, t0);
        return;
    }
    /* restore from the store: the I/O thread reads, C_GOT_SNAPSHOT imports */
    io_item *it = calloc(1, sizeof *it);
    HYLA_ASSERT(it);
    it->kind = 2;
    snprintf(it->session, sizeof it->session, "%s", r->session_id);
    it->epoch = r->placement_epoch;
    it->version = r->snapshot_version;
    it->call = c->call;
    io_post(w, it);
}

static void do_got_snapshot(hyla_worker *w, cmd *c) {
    double t0 = now_s();
    if (c->status != HYLA_OK) {
        fail_call(c->call, c->status, c->err);
        return;
    }
    wsess *ws = session_find(w, c->session);
    if (ws) {
        if (c->epoch < ws->epoch) {
            hyla_rpc_call_fail(c->call, HYLA_RPC_FAILED_PRECONDITION, "LoadSession %s: superseded while loading", c->session);
            return;
        }
        drop_session(w, ws, "superseded by a newer placement");
    }
    ws = calloc(1, sizeof *ws);
    HYLA_ASSERT(ws);
    snprintf(ws->id, sizeof ws->id, "%s", c->session);
    ws->epoch = c->epoch;
    hyla_status st = hyla_session_import(w->rt, c->snap, &ws->s);
    if (st != HYLA_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "session %s version %llu: %s", c->session, (unsigned long long)c->version,
                 hyla_last_error());
        fail_call(c->call, st, msg);
        free(ws);
        return;
    }
    hyla_session_set_tag(ws->s, ws);
    ws->snap_version = c->version;
    ws->snap_pos = c->snap->position;
    ws->layout = layout_of(c->snap);
    ws->last_used = now_s();
    ws->next = w->sessions;
    w->sessions = ws;
    HYLA_INFO("session %s restored from version %llu at position %llu", ws->id, (unsigned long long)c->version,
              (unsigned long long)c->snap->position);
    reply_session(w, c->call, ws, t0);
}

wsess *lookup_or_fail(hyla_worker *w, hyla_rpc_call *call, const char *id, const char *what) {
    if (!valid_id(id)) {
        hyla_rpc_call_fail(call, HYLA_RPC_INVALID_ARGUMENT, "%s: session_id must be 1..%d printable bytes", what,
                           HYLA_SESSION_ID_MAX);
        return NULL;
    }
    wsess *ws = session_find(w, id);
    if (!ws) hyla_rpc_call_fail(call, HYLA_RPC_NOT_FOUND, "%s: session %s is not loaded on worker %s", what, id, w->worker_id);
    return ws;
}

static void do_snapshot(hyla_worker *w, cmd *c) {
    const Hyla__V1__SnapshotRequest *r = (const Hyla__V1__SnapshotRequest *)c->msg;
    wsess *ws = lookup_or_fail(w, c->call, r->session_id, "Snapshot");
    if (!ws) return;
    /* The coordinator snapshots to pause or move the session: a call in progress ends first, so
     * the snapshot holds every token it delivered and none it did not. */
    end_jobs(w, ws, HYLA_RPC_ABORTED, "paused or moved; call again to continue");
    hyla_status st = start_put(w, ws, c->call, 1, 0);
    if (st != HYLA_OK) fail_call(c->call, st, hyla_last_error());
}

static void do_unload(hyla_worker *w, cmd *c) {
    const Hyla__V1__UnloadRequest *r = (const Hyla__V1__UnloadRequest *)c->msg;
    wsess *ws = lookup_or_fail(w, c->call, r->session_id, "Unload");
    if (!ws) return;
    end_jobs(w, ws, HYLA_RPC_CANCELLED, "deleted or moved");
    if (r->snapshot_first) {
        hyla_status st = start_put(w, ws, c->call, 2, 1);
        if (st != HYLA_OK) fail_call(c->call, st, hyla_last_error());
        return;
    }
    drop_session(w, ws, "unloaded");
    Hyla__V1__UnloadResponse resp = HYLA__V1__UNLOAD_RESPONSE__INIT;
    hyla_rpc_call_reply(c->call, &resp.base);
}

static void do_describe(hyla_worker *w, cmd *c) {
    const Hyla__V1__DescribeSessionRequest *r = (const Hyla__V1__DescribeSessionRequest *)c->msg;
    wsess *ws = lookup_or_fail(w, c->call, r->session_id, "DescribeSession");
    if (ws) reply_session(w, c->call, ws, now_s());
}

/* ReadTokens: the session's token log, from the resident session or its host copy; always OK
 * for a loaded session (the coordinator turns a from_generated below first_available into
 * OUT_OF_RANGE). The scheduler thread answers, so the log is the one of the last step. */
static void do_read_tokens(hyla_worker *w, cmd *c) {
    const Hyla__V1__ReadTokensRequest *r = (const Hyla__V1__ReadTokensRequest *)c->msg;
    wsess *ws = lookup_or_fail(w, c->call, r->session_id, "ReadTokens");
    if (!ws) return;
    uint32_t max = r->max_tokens && r->max_tokens <= HYLA_TOKEN_LOG_MAX ? r->max_tokens : HYLA_TOKEN_LOG_MAX;
    int32_t *toks = malloc((size_t)max * sizeof *toks);
    HYLA_ASSERT(toks);
    uint64_t generated = 0, first = 0;
    int n = 0;
    if (ws->s) {
        generated = (uint64_t)hyla_session_generated(ws->s);
        first = (uint64_t)hyla_session_log_first(ws->s);
        if (r->from_generated >= first) n = hyla_session_read_tokens(ws->s, (int64_t)r->from_generated, (int)max, toks);
    } else if (ws->host) {
        const int32_t *log = NULL;
        uint32_t log_n = 0;
        hyla_status st = hyla_snapshot_token_log(ws->host, &log, &log_n);
        if (st != HYLA_OK) {
            free(toks);
            fail_call(c->call, st, hyla_last_error());
            return;
        }
        generated = ws->host->n_generated;
        first = generated - log_n;
        if (r->from_generated >= first && r->from_generated < generated) {
            uint64_t k = generated - r->from_generated;
            n = (int)(k < max ? k : max);
            memcpy(toks, log + (r->from_generated - first), (size_t)n * sizeof *toks);
        }
    } else {
        free(toks);
        hyla_rpc_call_fail(c->call, HYLA_RPC_UNAVAILABLE, "ReadTokens: session %s has no state on worker %s", ws->id,
                           w->worker_id);
        return;
    }
    Hyla__V1__ReadTokensResponse resp = HYLA__V1__READ_TOKENS_RESPONSE__INIT;
    resp.n_token_ids = (size_t)n;
    resp.token_ids = toks;
    resp.from_generated = r->from_generated;
    resp.generated = generated;
    resp.first_available = first;
    char *text = NULL;
    size_t tlen = 0;
    if (w->tok && n > 0 && hyla_tokenizer_decode(w->tok, toks, (size_t)n, HYLA_TOK_SKIP_SPECIAL, &text, &tlen) == HYLA_OK) {
        resp.text.data = (uint8_t *)text;
        resp.text.len = tlen;
    }
    hyla_rpc_call_reply(c->call, &resp.base);
    free(text);
    free(toks);
}

static void do_fork(hyla_worker *w, cmd *c) {
    const Hyla__V1__ForkSessionRequest *r = (const Hyla__V1__ForkSessionRequest *)c->msg;
    double t0 = now_s();
    wsess *src = lookup_or_fail(w, c->call, r->session_id, "ForkSession");
    if (!src) return;
    if (!valid_id(r->new_session_id) || session_find(w, r->new_session_id)) {
        hyla_rpc_call_fail(c->call, valid_id(r->new_session_id) ? HYLA_RPC_ALREADY_EXISTS : HYLA_RPC_INVALID_ARGUMENT,
                           "ForkSession: new_session_id '%s' is %s", r->new_session_id ? r->new_session_id : "",
                           valid_id(r->new_session_id) ? "already loaded" : "invalid");
        return;
    }
    const char *bad = bad_sampling(r->sampling);
    if (bad) {
        hyla_rpc_call_fail(c->call, HYLA_RPC_INVALID_ARGUMENT, "ForkSession: %s", bad);
        return;
    }
    finish_export(w, src);
    hyla_snapshot *snap = NULL;
    hyla_status st = src->s ? hyla_session_export(src->s, &snap) : src->host ? hyla_snapshot_clone(src->host, &snap)
                                                                             : hyla_fail(HYLA_ERR_UNAVAILABLE, "no state");
    wsess *ws = NULL;
    if (st == HYLA_OK) {
        ws = calloc(1, sizeof *ws);
        HYLA_ASSERT(ws);
        st = hyla_session_import(w->rt, snap, &ws->s);
    }
    hyla_snapshot_destroy(snap);
    if (st != HYLA_OK) {
        fail_call(c->call, st, hyla_last_error());
        free(ws);
        return;
    }
    snprintf(ws->id, sizeof ws->id, "%s", r->new_session_id);
    ws->epoch = r->placement_epoch;
    hyla_session_set_tag(ws->s, ws);
    hyla_sampling cur = hyla_session_get_sampling(ws->s);
    if (r->sampling) cur = sampling_from(r->sampling);
    if (r->reseed) hyla_session_set_sampling(ws->s, cur, r->seed);
    else hyla_session_set_sampling_params(ws->s, cur);
    ws->last_used = now_s();
    ws->next = w->sessions;
    w->sessions = ws;
    reply_session(w, c->call, ws, t0);
}

static int append_encode(hyla_worker *w, append_job *a, size_t len, int32_t **ids, int *n);
static void append_add(hyla_worker *w, append_job *a, int32_t *ids, int n);

/* Append: the first message names the session. */
static void do_append_msg(hyla_worker *w, cmd *c) {
    const Hyla__V1__AppendRequest *r = (const Hyla__V1__AppendRequest *)c->msg;
    append_job *a = find_append(w, c->call);
    if (!a || a->released) return; /* a late message of a call already answered */
    if (!a->ws) { /* first message */
        if (!valid_id(r->session_id)) {
            append_finish(w, a, HYLA_RPC_INVALID_ARGUMENT, "Append: the first message must carry session_id");
            return;
        }
        wsess *ws = session_find(w, r->session_id);
        if (!ws) {
            append_finish(w, a, HYLA_RPC_NOT_FOUND, "Append: session %s is not loaded on worker %s", r->session_id,
                          w->worker_id);
            return;
        }
        if (ws->app || ws->gen) {
            append_finish(w, a, HYLA_RPC_FAILED_PRECONDITION, "Append: session %s is busy with another %s", ws->id,
                          ws->app ? "Append" : "Generate");
            return;
        }
        hyla_status st = make_resident(w, ws);
        if (st != HYLA_OK) {
            append_finish(w, a, hyla_rpc_code_from_status(st), "%s", hyla_last_error());
            return;
        }
        /* a document declared larger than the call's limit is refused before anything of it is
         * added, not once the limit's worth of it has been fed */
        if (r->total_tokens_hint > w->p.max_append_tokens) {
            append_finish(w, a, HYLA_RPC_RESOURCE_EXHAUSTED,
                          "Append: the document's declared %llu tokens (total_tokens_hint) exceed the limit of %llu "
                          "tokens per call (max_append_tokens); nothing was added to session %s",
                          (unsigned long long)r->total_tokens_hint, (unsigned long long)w->p.max_append_tokens, ws->id);
            return;
        }
        a->ws = ws;
        ws->app = a;
        a->t0 = a->last_progress = now_s();
        a->total_hint = r->total_tokens_hint ? r->total_tokens_hint : r->total_bytes_hint;
        if (r->add_bos && hyla_session_position(ws->s) == 0 && hyla_session_pending(ws->s) < 0 &&
            hyla_model_get_config(w->m)->bos_token_id >= 0) {
            a->toks = malloc(64 * sizeof *a->toks);
            HYLA_ASSERT(a->toks);
            a->cap = 64;
            a->toks[a->n++] = hyla_model_get_config(w->m)->bos_token_id;
            a->received++;
        }
    } else if (r->session_id && *r->session_id && strcmp(r->session_id, a->ws->id)) {
        append_finish(w, a, HYLA_RPC_INVALID_ARGUMENT, "Append: a later message names session %s, not %s", r->session_id,
                      a->ws->id);
        return;
    }
    wsess *ws = a->ws;
    ws->last_used = now_s();
    if (r->text.len && r->n_tokens) {
        append_finish(w, a, HYLA_RPC_INVALID_ARGUMENT, "Append: a chunk carries both text and tokens");
        return;
    }
    int32_t *ids = NULL;
    int n = 0;
    if (r->text.len) {
        if (!w->tok) {
            append_finish(w, a, HYLA_RPC_INVALID_ARGUMENT, "Append: model %s has no tokenizer for text (%s); send tokens",
                          w->model_name, w->tok_err);
            return;
        }
        if (a->tlen + r->text.len > APPEND_TEXT_HELD_MAX) {
            append_finish(w, a, HYLA_RPC_RESOURCE_EXHAUSTED,
                          "Append: over %d MiB of text with no point where the tokenizer may cut it; send it in "
                          "several Append calls, or as tokens",
                          APPEND_TEXT_HELD_MAX >> 20);
            return;
        }
        if (a->tlen + r->text.len > a->tcap) {
            a->tcap = (a->tlen + r->text.len) * 2;
            a->tbuf = realloc(a->tbuf, a->tcap);
            HYLA_ASSERT(a->tbuf);
        }
        memcpy(a->tbuf + a->tlen, r->text.data, r->text.len);
        a->tlen += r->text.len;
        size_t cut = hyla_tokenizer_safe_prefix(w->tok, a->tbuf, a->tlen);
        if (cut && !append_encode(w, a, cut, &ids, &n)) return;
    } else if (r->n_tokens) {
        int V = hyla_model_get_config(w->m)->vocab_size;
        for (size_t i = 0; i < r->n_tokens; i++)
            if (r->tokens[i] < 0 || r->tokens[i] >= V) {
                append_finish(w, a, HYLA_RPC_INVALID_ARGUMENT, "Append: tokens[%zu] = %d is outside the vocabulary [0, %d)",
                              i, r->tokens[i], V);
                return;
            }
        ids = malloc(r->n_tokens * sizeof *ids);
        HYLA_ASSERT(ids);
        memcpy(ids, r->tokens, r->n_tokens * sizeof *ids);
        n = (int)r->n_tokens;
    }
    append_add(w, a, ids, n);
}

/* Encode the first len bytes of the Append's held text into *ids; 0 when the call failed. */
static int append_encode(hyla_worker *w, append_job *a, size_t len, int32_t **ids, int *n) {
    if (hyla_tokenizer_encode(w->tok, a->tbuf, len, 0, ids, n) != HYLA_OK) {
        append_finish(w, a, HYLA_RPC_INTERNAL, "Append: %s", hyla_last_error());
        return 0;
    }
    memmove(a->tbuf, a->tbuf + len, a->tlen - len);
    a->tlen -= len;
    return 1;
}

/* Queue n ids (takes ownership of ids) for the Append's session, within the call's limit. */
static void append_add(hyla_worker *w, append_job *a, int32_t *ids, int n) {
    if (a->received + (uint64_t)n > w->p.max_append_tokens) {
        free(ids);
        append_finish(w, a, HYLA_RPC_RESOURCE_EXHAUSTED,
                      "Append: the document exceeds the limit of %llu tokens per call (max_append_tokens)",
                      (unsigned long long)w->p.max_append_tokens);
        return;
    }
    if (a->n + (size_t)n > a->cap) {
        size_t cap = a->cap ? a->cap : 1024;
        while (cap < a->n + (size_t)n) cap *= 2;
        a->toks = realloc(a->toks, cap * sizeof *a->toks);
        HYLA_ASSERT(a->toks);
        a->cap = cap;
    }
    if (n) memcpy(a->toks + a->n, ids, (size_t)n * sizeof *ids);
    a->n += (size_t)n;
    a->received += (uint64_t)n;
    free(ids);
    /* back-pressure: hold reads while much is queued */
    if (a->n > (size_t)w->p.prefill_budget * 64 && !a->held) {
        hyla_rpc_call_read_hold(a->call);
        a->held = 1;
    }
}

static void do_append_start(hyla_worker *w, cmd *c) {
    append_job *a = calloc(1, sizeof *a);
    HYLA_ASSERT(a);
    a->call = c->call;
    a->next_reg = w->appends;
    w->appends = a;
}

static void do_append_end(hyla_worker *w, cmd *c) {
    append_job *a = find_append(w, c->call);
    if (!a || a->released) return;
    if (!a->ws) {
        append_finish(w, a, HYLA_RPC_INVALID_ARGUMENT, "Append: the stream ended without a message naming the session");
        return;
    }
    if (a->tlen) { /* the rest of the text */
        int32_t *ids = NULL;
        int n = 0;
        if (!append_encode(w, a, a->tlen, &ids, &n)) return;
        append_add(w, a, ids, n);
        if (a->released) return;
    }
    a->half_closed = 1;
}

static void do_append_done(hyla_worker *w, cmd *c) {
    append_job *a = find_append(w, c->call);
    if (!a) return;
    a->done_seen = 1;
    if (a->released) unregister_append(w, a);
    /* else: the cancellation poll ends the job, then unregisters it */
}

static void do_generate(hyla_worker *w, cmd *c) {
    const Hyla__V1__GenerateRequest *r = (const Hyla__V1__GenerateRequest *)c->msg;
    wsess *ws = lookup_or_fail(w, c->call, r->session_id, "Generate");
    if (!ws) return;
    if (r->max_tokens < 1 || r->max_tokens > w->p.max_generate) {
        hyla_rpc_call_fail(c->call, HYLA_RPC_INVALID_ARGUMENT, "Generate: max_tokens must be in 1..%u (got %u)",
                           w->p.max_generate, r->max_tokens);
        return;
    }
    const char *bad = bad_sampling(r->sampling);
    if (bad) {
        hyla_rpc_call_fail(c->call, HYLA_RPC_INVALID_ARGUMENT, "Generate: %s", bad);
        return;
    }
    if (ws->app || ws->gen) {
        hyla_rpc_call_fail(c->call, HYLA_RPC_FAILED_PRECONDITION, "Generate: session %s is busy with another %s", ws->id,
                           ws->app ? "Append" : "Generate");
        return;
    }
    hyla_status st = make_resident(w, ws);
    if (st != HYLA_OK) {
        fail_call(c->call, st, hyla_last_error());
        return;
    }
    if (hyla_session_pending(ws->s) < 0) {
        hyla_rpc_call_fail(c->call, HYLA_RPC_FAILED_PRECONDITION, "Generate: session %s has no tokens yet; Append a prompt first",
                           ws->id);
        return;
    }
    if (r->sampling || r->reseed) {
        hyla_sampling cur = r->sampling ? sampling_from(r->sampling) : hyla_session_get_sampling(ws->s);
        if (r->reseed) hyla_session_set_sampling(ws->s, cur, r->seed);
        else hyla_session_set_sampling_params(ws->s, cur);
    }
    gen_job *g = calloc(1, sizeof *g);
    HYLA_ASSERT(g);
    g->call = c->call;
    g->max_tokens = r->max_tokens;
    g->ignore_eos = r->ignore_eos;
    if (r->n_stop) {
        g->stop = calloc(r->n_stop, sizeof *g->stop);
        for (size_t i = 0; i < r->n_stop; i++) {
            if (!r->stop[i][0]) continue;
            g->stop[g->n_stop++] = strdup(r->stop[i]);
            size_t l = strlen(r->stop[i]);
            if (l > g->max_stop_len) g->max_stop_len = l;
        }
    }
    if (r->n_stop_token_ids) {
        g->stop_ids = malloc(r->n_stop_token_ids * sizeof *g->stop_ids);
        memcpy(g->stop_ids, r->stop_token_ids, r->n_stop_token_ids * sizeof *g->stop_ids);
        g->n_stop_ids = r->n_stop_token_ids;
    }
    /* generated text continues the session's text: no start-of-text rule; specials are not text */
    if (w->tok && hyla_tokenizer_stream_create(w->tok, HYLA_TOK_SKIP_SPECIAL, &g->ds) != HYLA_OK) g->ds = NULL;
    ws->gen = g;
    ws->last_used = now_s();
}

/* A put finished on the I/O thread. */
static void do_put_done(hyla_worker *w, cmd *c) {
    wsess *ws = session_find(w, c->session);
    if (ws) ws->put_inflight--;
    if (c->status != HYLA_OK) {
        HYLA_WARN("snapshot of session %s failed: %s", c->session, c->err);
        if (ws) ws->snap_retry_at = now_s() + 2;
        if (w->draining) set_drain_error(w, c->session, c->err);
        if (c->call) fail_call(c->call, c->status, c->err);
        return;
    }
    if (w->draining && c->unload_after) set_drain_error(w, NULL, NULL);
    if (ws && c->info.version > ws->snap_version) {
        ws->snap_version = c->info.version;
        ws->snap_pos = c->info.position;
        hyla_snapshot_destroy(ws->layout);
        ws->layout = c->snap; /* layout (data NULL) of what was committed */
        c->snap = NULL;
    }
    Hyla__V1__SnapshotInfo si = HYLA__V1__SNAPSHOT_INFO__INIT;
    hyla_store_rpc_info_to_msg(&c->info, &si);
    if (c->unload_after && ws) drop_session(w, ws, "unloaded after its snapshot");
    if (c->call) {
        if (c->reply_kind == 2) {
            Hyla__V1__UnloadResponse r = HYLA__V1__UNLOAD_RESPONSE__INIT;
            r.snapshot = &si;
            hyla_rpc_call_reply(c->call, &r.base);
        } else {
            Hyla__V1__SnapshotResponse r = HYLA__V1__SNAPSHOT_RESPONSE__INIT;
            r.snapshot = &si;
            hyla_rpc_call_reply(c->call, &r.base);
        }
    }
}

/* Membership: the coordinator placed the session elsewhere (an epoch of 0 drops any). */
static void do_drop(hyla_worker *w, cmd *c) {
    wsess *ws = session_find(w, c->session);
    if (ws && (!c->epoch || ws->epoch <= c->epoch)) {
        HYLA_INFO("session %s dropped: placed elsewhere", ws->id);
        drop_session(w, ws, "placed on another worker");
    }
}

/* Membership: the operator drains this worker; the scheduler's drain step does the work. */
static void do_drain(hyla_worker *w) {
    if (w->draining) return;
    HYLA_INFO("draining: snapshotting %s", w->sessions ? "every session" : "nothing");
    w->draining = 1;
    int lb, le;
    hyla_model_layer_range(w->m, &lb, &le);
    if (lb != 0 && w->sessions) { /* only stage 0 snapshots (and drops) a pipeline's sessions */
        char why[256];
        snprintf(why, sizeof why,
                 "this worker is a later pipeline stage (layers %d:%d); its group's sessions are handed "
                 "over by draining the group's first stage",
                 lb, le);
        set_drain_error(w, w->sessions->id, why);
        HYLA_WARN("draining: %s", why);
    }
}

/* Execute and free a list of commands, in order. */
void run_commands(hyla_worker *w, cmd *list) {
    while (list) {
        cmd *c = list;
        list = list->next;
        switch (c->type) {
        case C_LOAD: do_load(w, c); break;
        case C_SNAPSHOT: do_snapshot(w, c); break;
        case C_UNLOAD: do_unload(w, c); break;
        case C_FORK: do_fork(w, c); break;
        case C_DESCRIBE: do_describe(w, c); break;
        case C_READ_TOKENS: do_read_tokens(w, c); break;
        case C_APPEND_START: do_append_start(w, c); break;
        case C_APPEND_MSG: do_append_msg(w, c); break;
        case C_APPEND_END: do_append_end(w, c); break;
        case C_APPEND_DONE: do_append_done(w, c); break;
        case C_GENERATE: do_generate(w, c); break;
        case C_GOT_SNAPSHOT: do_got_snapshot(w, c); break;
        case C_PUT_DONE: do_put_done(w, c); break;
        case C_DROP: do_drop(w, c); break;
        case C_DRAIN: do_drain(w); break;
        case C_STAGE_START: do_stage_start(w, c); break;
        case C_STAGE_MSG: do_stage_msg(w, c); break;
        case C_EXPORT: do_export(w, c); break;
        case C_STAGE_END: do_stage_end(w, c); break;
        case C_STAGE_DONE: do_stage_done(w, c); break;
        case C_WAKE: break;
        }
        free_cmd(c);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* lifecycle                                                                                   */

hyla_status hyla_worker_start(const hyla_worker_params *p, hyla_worker **out) {
    *out = NULL;
    if (!p->model_dir) return hyla_fail(HYLA_ERR_INVALID_ARG, "hyla-worker: --model is required");
    hyla_worker *w = calloc(1, sizeof *w);
    if (!w) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    w->p = *p;
    if (w->p.max_batch < 1) w->p.max_batch = 1;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    pthread_mutex_init(&w->io_mu, NULL);
    pthread_cond_init(&w->io_cv, NULL);
    pthread_mutex_init(&w->sum_mu, NULL);
    pthread_mutex_init(&w->exit_mu, NULL);
    pthread_cond_init(&w->exit_cv, NULL);
    hyla__v1__worker_load__init(&w->load);
    if (p->model_name) snprintf(w->model_name, sizeof w->model_name, "%s", p->model_name);
    else {
        const char *b = strrchr(p->model_dir, '/');
        size_t len = strlen(p->model_dir);
        while (b && b[1] == 0 && len > 1) { /* trailing slash */
            len--;
            b = NULL;
            for (size_t i = 0; i + 1 < len; i++)
                if (p->model_dir[i] == '/') b = p->model_dir + i;
        }
        snprintf(w->model_name, sizeof w->model_name, "%.*s", (int)(len - (size_t)(b ? b + 1 - p->model_dir : 0)),
                 b ? b + 1 : p->model_dir);
    }
    if (p->worker_id) snprintf(w->worker_id, sizeof w->worker_id, "%s", p->worker_id);
    hyla_model_params mp = hyla_model_default_params();
    mp.layer_begin = p->layer_begin;
    mp.layer_end = p->layer_end;
    hyla_status st = HYLA_OK;
    if (p->tp > 1) { /* the group owns every rank's backend, model and runtime; rank 0's serve */
        st = hyla_tp_open(p->model_dir, p->device, p->tp, &mp, &w->tp);
        if (st == HYLA_OK) w->be = hyla_tp_backend(w->tp), w->m = hyla_tp_model(w->tp), w->rt = hyla_tp_runtime(w->tp);
        else st = hyla_fail_wrap(st, "--tp %d", p->tp);
    } else {
        st = hyla_backend_create(p->device, &w->be);
        if (st == HYLA_OK) st = hyla_model_load(p->model_dir, w->be, &mp, &w->m);
        if (st == HYLA_OK) st = hyla_runtime_create(w->m, &w->rt);
    }
    if (st != HYLA_OK) {
        hyla_worker_destroy(w);
        return st;
    }
    const int chunk = hyla_runtime_prefill_chunk(w->rt);
    if (w->p.prefill_budget < chunk) w->p.prefill_budget = chunk; /* the model's chunk: aligned feeding needs one */
    if (p->token_log && (st = hyla_runtime_set_token_log(w->rt, (int)p->token_log)) != HYLA_OK) {
        hyla_worker_destroy(w);
        return hyla_fail_wrap(st, "--token-log");
    }
    if ((st = hyla_runtime_set_micro_batches(w->rt, p->micro_batches)) != HYLA_OK) {
        hyla_worker_destroy(w);
        return hyla_fail_wrap(st, "--micro-batches");
    }
    /* 0: micro-batches within each step only, no step ahead; 1: a whole model steps ahead on
     * a CPU too (the CPU's forward is synchronous, so there it only delays each send by a step:
     * tests use it to run the path). Unset: on GPUs, one or a tensor-parallel group */
    const char *lanes = getenv("HYLA_DECODE_LANES");
    w->lanes_on = !(lanes && !strcmp(lanes, "0"));
    w->ahead = w->lanes_on && (!strncmp(p->device, "cuda", 4) || (lanes && !strcmp(lanes, "1")));
    const char *incr = getenv("HYLA_SNAPSHOT_INCREMENTAL"); /* 0: every put exports and sends the whole state */
    w->incremental = !(incr && !strcmp(incr, "0"));
    if (p->prefill_piece && (st = hyla_runtime_set_prefill_piece(w->rt, p->prefill_piece)) != HYLA_OK) {
        hyla_worker_destroy(w);
        return hyla_fail_wrap(st, "--prefill-piece");
    }
    if (hyla_tokenizer_load(p->model_dir, hyla_model_get_config(w->m)->vocab_size, &w->tok) != HYLA_OK) {
        w->tok = NULL;
        snprintf(w->tok_err, sizeof w->tok_err, "%s", hyla_last_error());
        HYLA_WARN("no tokenizer for text: %s", w->tok_err);
    }
    {
        int lb, le;
        hyla_model_layer_range(w->m, &lb, &le);
        if (le < hyla_model_get_config(w->m)->num_layers) {
            hyla_runtime_set_downstream_ops(w->rt, &stage_downstream_ops, w);
            /* a prefill piece's hidden states travel in one StageForward message: keep it under
             * half the message limit */
            long rows = (long)p->max_message_bytes / 2 / ((long)hyla_model_get_config(w->m)->hidden_size * 4);
            rows = rows / chunk * chunk;
            if (rows < chunk) {
                hyla_worker_destroy(w);
                return hyla_fail(HYLA_ERR_INVALID_ARG,
                                 "--max-message-bytes %d: a stage message carries at least one prefill chunk of the "
                                 "model, %d rows of %d floats, in at most half the limit: at least %ld bytes",
                                 p->max_message_bytes, chunk, hyla_model_get_config(w->m)->hidden_size,
                                 2L * chunk * hyla_model_get_config(w->m)->hidden_size * 4);
            }
            /* and, unless the operator chose the piece, pieces small enough for the stages to
             * overlap: a two-stage pipeline on two H100s prefilled 131,072 tokens at 178 k tok/s
             * in pieces of 1024 or 2048, 167 k in 4096, 158 k in 8192 (BENCHMARKS.md) */
            if (!p->prefill_piece && !getenv("HYLA_PREFILL_PIECE") && rows > HYLA_PIPELINE_PIECE)
                rows = HYLA_PIPELINE_PIECE;
            if (rows < hyla_runtime_prefill_piece(w->rt)) {
                (void)hyla_runtime_set_prefill_piece(w->rt, (int)rows); /* in range: a multiple of the chunk */
                HYLA_INFO("prefill pieces of at most %ld tokens (a pipeline stage: stage messages up to %d bytes, "
                          "pieces the stages overlap)",
                          rows, p->max_message_bytes);
            }
            /* and a decode step's logits come back in one message: B x vocab floats */
            long bmax = (long)p->max_message_bytes / 2 / ((long)hyla_model_get_config(w->m)->vocab_size * 4);
            if (bmax < 1) bmax = 1;
            if (bmax < w->p.max_batch) {
                HYLA_INFO("decode batches of at most %ld sessions (pipeline stage messages up to %d bytes)", bmax,
                          p->max_message_bytes);
                w->p.max_batch = (int)bmax;
            }
        }
        if (p->next_stage) snprintf(w->next_stage, sizeof w->next_stage, "%s", p->next_stage);
    }
    hyla_rpc_server_params sp = hyla_rpc_server_default_params();
    sp.threads = p->rpc_threads > 0 ? p->rpc_threads : 2;
    sp.max_message_bytes = p->max_message_bytes;
    st = hyla_rpc_server_create(&sp, &w->srv);
#define ADD(name, kind, req, resp, fn) \
    if (st == HYLA_OK) st = hyla_rpc_server_add_method(w->srv, SVC name, kind, &req, &resp, fn, w)
    ADD("LoadSession", HYLA_RPC_UNARY, hyla__v1__load_session_request__descriptor, hyla__v1__worker_session_response__descriptor, h_load);
    ADD("Append", HYLA_RPC_BIDI, hyla__v1__append_request__descriptor, hyla__v1__append_progress__descriptor, h_append);
    ADD("Generate", HYLA_RPC_SERVER_STREAM, hyla__v1__generate_request__descriptor, hyla__v1__generate_response__descriptor, h_generate);
    ADD("Snapshot", HYLA_RPC_UNARY, hyla__v1__snapshot_request__descriptor, hyla__v1__snapshot_response__descriptor, h_snapshot);
    ADD("Unload", HYLA_RPC_UNARY, hyla__v1__unload_request__descriptor, hyla__v1__unload_response__descriptor, h_unload);
    ADD("ForkSession", HYLA_RPC_UNARY, hyla__v1__fork_session_request__descriptor, hyla__v1__worker_session_response__descriptor, h_fork);
    ADD("DescribeSession", HYLA_RPC_UNARY, hyla__v1__describe_session_request__descriptor, hyla__v1__worker_session_response__descriptor, h_describe);
    ADD("ReadTokens", HYLA_RPC_UNARY, hyla__v1__read_tokens_request__descriptor, hyla__v1__read_tokens_response__descriptor, h_read_tokens);
    ADD("ExportStage", HYLA_RPC_SERVER_STREAM, hyla__v1__export_stage_request__descriptor, hyla__v1__get_snapshot_response__descriptor, h_export);
    ADD("StageForward", HYLA_RPC_BIDI, hyla__v1__stage_forward_request__descriptor, hyla__v1__stage_forward_response__descriptor, h_stage);
#undef ADD
    if (st == HYLA_OK) st = worker_protect(w->srv, p->admin_key);
    if (st == HYLA_OK) st = worker_metrics_setup(w);
    if (st == HYLA_OK) st = hyla_rpc_server_listen(w->srv, p->listen, &w->port);
    if (st != HYLA_OK) {
        hyla_worker_destroy(w);
        return st;
    }
    if (p->advertise) snprintf(w->advertise, sizeof w->advertise, "%s", p->advertise);
    else {
        const char *colon = strrchr(p->listen, ':');
        int hl = colon ? (int)(colon - p->listen) : (int)strlen(p->listen);
        const char *host = p->listen;
        if (hl == 7 && !strncmp(host, "0.0.0.0", 7)) host = "127.0.0.1", hl = 9;
        snprintf(w->advertise, sizeof w->advertise, "%.*s:%d", hl, host, w->port);
    }
    if (pthread_create(&w->sched_th, NULL, scheduler_main, w) || pthread_create(&w->io_th, NULL, io_main, w)) {
        hyla_worker_destroy(w);
        return hyla_fail(HYLA_ERR_INTERNAL, "cannot start threads");
    }
    st = hyla_rpc_server_start(w->srv);
    if (st == HYLA_OK && p->coordinator) {
        hyla_rpc_client_params cp = hyla_rpc_client_default_params();
        st = hyla_rpc_client_create(p->coordinator, &cp, &w->coord);
        if (st == HYLA_OK) {
            if (pthread_create(&w->memb_th, NULL, membership_main, w) != 0) st = hyla_fail(HYLA_ERR_INTERNAL, "thread");
            else w->have_memb = 1;
        }
    }
    if (st != HYLA_OK) {
        hyla_worker_destroy(w);
        return st;
    }
    HYLA_INFO("serving model %s (%s) on %s, device %s; prefill pieces of up to %d tokens at multiples of %d", w->model_name,
              hyla_model_get_config(w->m)->model_type, w->advertise, p->device, hyla_runtime_prefill_piece(w->rt),
              hyla_runtime_prefill_chunk(w->rt));
    *out = w;
    return HYLA_OK;
}

int hyla_worker_port(const hyla_worker *w) { return w->port; }

void hyla_worker_request_stop(hyla_worker *w) {
    w->stop = 1; /* async-signal-safe; the waiters poll */
}

void hyla_worker_wait(hyla_worker *w) {
    double drained_at = 0;
    pthread_mutex_lock(&w->exit_mu);
    while (!w->stop) {
        /* drained: exit once the coordinator has seen it (else it would only learn from the
         * missing heartbeats, and call the worker dead rather than drained) */
        if (w->drained && (w->drain_acked || !w->have_memb)) break;
        if (w->drained && !drained_at) drained_at = now_s();
        if (drained_at && now_s() - drained_at > 10) {
            HYLA_WARN("drained, but the coordinator has not acknowledged it in 10 s: exiting anyway");
            break;
        }
        hyla_cond_wait_ms(&w->exit_cv, &w->exit_mu, 100);
    }
    pthread_mutex_unlock(&w->exit_mu);
}

void hyla_worker_destroy(hyla_worker *w) {
    if (!w) return;
    w->stop = 1;
    if (w->srv) hyla_rpc_server_shutdown(w->srv); /* calls in flight end; handlers post nothing more useful */
    pthread_mutex_lock(&w->mu);
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_mutex_lock(&w->io_mu);
    pthread_cond_broadcast(&w->io_cv);
    pthread_mutex_unlock(&w->io_mu);
    if (w->sched_th) pthread_join(w->sched_th, NULL);
    if (w->io_th) pthread_join(w->io_th, NULL);
    if (w->have_memb) pthread_join(w->memb_th, NULL);
    hyla_rpc_server_destroy(w->srv);
    hyla_rpc_client_destroy(w->store);
    hyla_rpc_client_destroy(w->coord);
    while (w->io_head) {
        io_item *it = w->io_head;
        w->io_head = it->next;
        hyla_snapshot_destroy(it->snap);
        hyla_snapshot_destroy(it->base);
        free(it);
    }
    for (size_t k = 0; k < w->n_sum; k++) free(w->sum[k].session_id);
    free(w->sum);
    hyla_tokenizer_free(w->tok);
    if (w->tp) {
        hyla_tp_close(w->tp);
    } else {
        hyla_runtime_free(w->rt);
        hyla_model_free(w->m);
        hyla_backend_destroy(w->be);
    }
    worker_metrics_free(w);
    free(w);
}
