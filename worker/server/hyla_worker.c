/* hyla_worker.c — the Worker service: scheduler, session table, snapshots, membership.
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
#include "hyla_worker.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hyla_api.h"
#include "hyla_log.h"
#include "hyla_rpc.h"
#include "hyla_session.h"
#include "hyla_store_rpc.h"
#include "hyla_tokenizer.h"
#include <xxhash.h>

#define SVC "/hyla.v1.Worker/"
#define COORD "/hyla.v1.Coordinator/"
#define RPC_TIMEOUT_MS 30000
/* text an Append may hold before its tokenizer finds a cut point (a SentencePiece-style
 * tokenizer cuts nowhere: the whole text is encoded when the stream ends) */
#define APPEND_TEXT_HELD_MAX (64 << 20)

/* ------------------------------------------------------------------------------------------ */
/* jobs and sessions                                                                           */

struct wsess;
/* An Append call. Registered from its START until both its release (reply/fail) and its DONE
 * have happened, so late events of a released call are recognised and ignored. */
typedef struct append_job {
    hyla_rpc_call *call;
    struct wsess *ws;         /* the session, once the first message named it */
    int released, done_seen;
    struct append_job *next_reg;
    int32_t *toks;            /* received, not yet fed: [n] */
    size_t n, cap;
    uint64_t received, ingested, total_hint;
    int started;              /* first message seen */
    int half_closed;
    int held;                 /* read_hold active (back-pressure) */
    double t0, last_progress;
    char *tbuf;               /* text received and not yet encoded: [tlen]; the tokenizer cuts
                                 only where encoding apart gives the same ids */
    size_t tlen, tcap;
} append_job;


typedef struct {
    hyla_rpc_call *call;
    uint32_t max_tokens, delivered;
    char **stop;
    size_t n_stop, max_stop_len;
    int32_t *stop_ids;
    size_t n_stop_ids;
    int ignore_eos;
    char *text;               /* generated text so far (whole UTF-8 characters) */
    size_t text_len, text_cap, text_sent;
    hyla_tokenizer_stream *ds; /* decodes the tokens; NULL without a tokenizer */
} gen_job;

typedef struct wsess {
    char id[128];
    uint64_t epoch;           /* placement epoch */
    hyla_session *s;          /* resident (TIER_GPU); NULL when evicted */
    hyla_snapshot *host;      /* evicted copy (TIER_HOST), or NULL */
    uint64_t snap_version;    /* last durable version (0: none) */
    uint64_t snap_pos;        /* position it covers */
    hyla_snapshot *layout;    /* part sizes of the last durable version (data NULL): for incremental KV */
    int put_inflight;
    hyla_export *exp;         /* auto-snapshot begun, not yet ended (finish_export) */
    double snap_retry_at;     /* an auto-snapshot failed: do not retry before this time */
    double last_used;
    append_job *app;
    gen_job *gen;
    struct wsess *next;
} wsess;

/* ------------------------------------------------------------------------------------------ */
/* commands                                                                                    */

typedef enum {
    C_LOAD, C_SNAPSHOT, C_UNLOAD, C_FORK, C_DESCRIBE, C_APPEND_START, C_APPEND_MSG, C_APPEND_END, C_APPEND_DONE,
    C_GENERATE,
    C_GOT_SNAPSHOT, /* I/O -> scheduler: a snapshot read for C_LOAD (or an error) */
    C_PUT_DONE,     /* I/O -> scheduler: a put finished (or failed) */
    C_DROP,         /* membership -> scheduler: forget a session (placed elsewhere) */
    C_DRAIN,        /* membership -> scheduler: snapshot everything, then stop */
    C_EXPORT,       /* ExportStage: this stage's parts (and those after it) of a session */
    C_STAGE_START,  /* StageForward (this worker is stage k > 0): a call starts */
    C_STAGE_MSG,    /* ... one step of hidden states */
    C_STAGE_END,    /* ... the previous stage half-closed */
    C_STAGE_DONE,   /* ... the call is over */
    C_WAKE,
} cmd_type;

/* A StageForward call from the previous pipeline stage (registered like Append calls). */
typedef struct stage_call {
    hyla_rpc_call *call;
    int released, done_seen;
    struct stage_call *next;
} stage_call;

typedef struct cmd {
    cmd_type type;
    hyla_rpc_call *call;
    ProtobufCMessage *msg;     /* owned copy of the request (protobuf_c_message_free_unpacked) */
    char session[128];
    uint64_t epoch, version;
    hyla_snapshot *snap;       /* C_GOT_SNAPSHOT */
    hyla_status status;        /* C_GOT_SNAPSHOT / C_PUT_DONE */
    char err[512];
    hyla_snapshot_info info;   /* C_PUT_DONE */
    int unload_after;          /* C_PUT_DONE: the put was for an Unload / eviction */
    int reply_kind;            /* C_PUT_DONE: 0 none, 1 SnapshotResponse, 2 UnloadResponse */
    struct cmd *next;
} cmd;

/* I/O work items */
typedef struct io_item {
    int kind;                  /* 1 put, 2 get */
    char session[128];
    uint64_t epoch, version, base_version;
    hyla_snapshot *snap;       /* put: owned */
    hyla_snapshot *base;       /* put: layout of base (owned) */
    hyla_rpc_call *call;       /* reply target after completion (passed back) */
    int unload_after, reply_kind;
    struct io_item *next;
} io_item;

struct hyla_worker {
    hyla_worker_params p;
    char model_name[256], worker_id[128], group_id[128], store_addr[256], advertise[256];
    hyla_backend *be;
    hyla_model *m;
    hyla_runtime *rt; /* the runtime every session of this worker runs on */
    hyla_tokenizer *tok; /* NULL when the model has no tokenizer (tok_err says why) */
    char tok_err[512];
    hyla_rpc_server *srv;
    int port;
    uint64_t epoch;      /* incarnation from registration */
    uint32_t hb_interval_ms;

    pthread_t sched_th, io_th, memb_th;
    int have_memb;
    volatile sig_atomic_t stop;
    int draining, drained; /* drained: written under exit_mu */
    int drain_acked;       /* the coordinator answered a heartbeat that reported no session after
                              the drain (exit_mu); the worker exits only then (or after 10 s) */

    pthread_mutex_t mu;  /* command queue */
    pthread_cond_t cv;
    cmd *q_head, *q_tail;

    pthread_mutex_t io_mu;
    pthread_cond_t io_cv;
    io_item *io_head, *io_tail;
    hyla_rpc_client *store; /* I/O thread only */
    hyla_rpc_client *coord; /* membership + I/O threads (thread-safe) */

    /* scheduler-owned */
    wsess *sessions;
    append_job *appends; /* registry of Append calls */
    stage_call *stage_calls; /* registry of StageForward calls from the previous stage */
    /* pipeline: this worker's downstream (scheduler thread only, except next_stage under sum_mu) */
    char next_stage[256];
    char next_open[256];
    hyla_rpc_client *next_client;
    hyla_rpc_stream *next_stream;
    uint64_t stage_step;
    uint64_t host_bytes;
    double tok_window_t0;
    uint64_t tok_window;

    /* summary for heartbeats */
    pthread_mutex_t sum_mu;
    Hyla__V1__WorkerSessionStatus *sum;
    size_t n_sum;
    Hyla__V1__WorkerLoad load;
    char drain_error[512]; /* draining: why the last handover failed ("" after one succeeds) */

    pthread_mutex_t exit_mu;
    pthread_cond_t exit_cv;
};

hyla_worker_params hyla_worker_default_params(void) {
    hyla_worker_params p;
    memset(&p, 0, sizeof p);
    p.device = "cpu";
    p.layer_end = -1;
    p.listen = "127.0.0.1:0";
    p.snapshot_every = 1024;
    p.max_batch = 64;
    p.prefill_budget = 1024; /* one default prefill piece (hyla_model.h) per scheduler step */
    p.max_generate = 65536;
    p.max_append_tokens = 1u << 24;
    p.rpc_threads = 2;
    p.max_message_bytes = 16 << 20;
    p.host_budget_bytes = 1ull << 32;
    return p;
}

static double now_s(void) { return hyla_now(); }


static void post(hyla_worker *w, cmd *c) {
    pthread_mutex_lock(&w->mu);
    c->next = NULL;
    if (w->q_tail) w->q_tail->next = c;
    else w->q_head = c;
    w->q_tail = c;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static cmd *new_cmd(cmd_type t, hyla_rpc_call *call, const ProtobufCMessage *msg) {
    cmd *c = calloc(1, sizeof *c);
    HYLA_ASSERT(c);
    c->type = t;
    c->call = call;
    if (msg) c->msg = hyla_rpc_message_dup(msg);
    return c;
}

static void free_cmd(cmd *c) {
    if (!c) return;
    if (c->msg) protobuf_c_message_free_unpacked(c->msg, NULL);
    hyla_snapshot_destroy(c->snap);
    free(c);
}

static void io_post(hyla_worker *w, io_item *it) {
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
    post(ud, new_cmd(t, call, msg));
}
static void h_load(hyla_rpc_call *c, hyla_rpc_event e, const ProtobufCMessage *m, void *ud) { h_unary(c, e, m, ud, C_LOAD); }
static void h_snapshot(hyla_rpc_call *c, hyla_rpc_event e, const ProtobufCMessage *m, void *ud) { h_unary(c, e, m, ud, C_SNAPSHOT); }
static void h_unload(hyla_rpc_call *c, hyla_rpc_event e, const ProtobufCMessage *m, void *ud) { h_unary(c, e, m, ud, C_UNLOAD); }
static void h_fork(hyla_rpc_call *c, hyla_rpc_event e, const ProtobufCMessage *m, void *ud) { h_unary(c, e, m, ud, C_FORK); }
static void h_describe(hyla_rpc_call *c, hyla_rpc_event e, const ProtobufCMessage *m, void *ud) { h_unary(c, e, m, ud, C_DESCRIBE); }

static void h_export(hyla_rpc_call *c, hyla_rpc_event e, const ProtobufCMessage *m, void *ud) { h_unary(c, e, m, ud, C_EXPORT); }

static void h_generate(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *msg, void *ud) {
    hyla_worker *w = ud;
    if (ev == HYLA_RPC_EV_START) post(w, new_cmd(C_GENERATE, call, msg));
    else if (ev == HYLA_RPC_EV_DONE) post(w, new_cmd(C_WAKE, NULL, NULL)); /* let the scheduler see a cancel */
}

static void h_append(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *msg, void *ud) {
    hyla_worker *w = ud;
    switch (ev) {
    case HYLA_RPC_EV_START: post(w, new_cmd(C_APPEND_START, call, NULL)); break;
    case HYLA_RPC_EV_MESSAGE: post(w, new_cmd(C_APPEND_MSG, call, msg)); break;
    case HYLA_RPC_EV_HALF_CLOSE: post(w, new_cmd(C_APPEND_END, call, NULL)); break;
    case HYLA_RPC_EV_DONE: post(w, new_cmd(C_APPEND_DONE, call, NULL)); break;
    }
}

static void h_stage(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *msg, void *ud) {
    hyla_worker *w = ud;
    switch (ev) {
    case HYLA_RPC_EV_START: post(w, new_cmd(C_STAGE_START, call, NULL)); break;
    case HYLA_RPC_EV_MESSAGE: post(w, new_cmd(C_STAGE_MSG, call, msg)); break;
    case HYLA_RPC_EV_HALF_CLOSE: post(w, new_cmd(C_STAGE_END, call, NULL)); break;
    case HYLA_RPC_EV_DONE: post(w, new_cmd(C_STAGE_DONE, call, NULL)); break;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* scheduler helpers                                                                           */

/* Draining: remember why handing a session over failed (heartbeats carry it to the coordinator,
 * whose DrainWorker answer shows it to the operator); NULL clears it after a success. */
static void set_drain_error(hyla_worker *w, const char *session, const char *err) {
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

static wsess *find(hyla_worker *w, const char *id) {
    for (wsess *s = w->sessions; s; s = s->next)
        if (!strcmp(s->id, id)) return s;
    return NULL;
}

static void fail_call(hyla_rpc_call *call, hyla_status st, const char *msg) {
    if (call) hyla_rpc_call_fail_status(call, st, msg);
}

static void free_append(append_job *a) {
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
static void append_finish(hyla_worker *w, append_job *a, hyla_rpc_code code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void append_finish(hyla_worker *w, append_job *a, hyla_rpc_code code, const char *fmt, ...) {
    if (a->released) return;
    a->released = 1;
    if (a->ws && a->ws->app == a) a->ws->app = NULL;
    a->ws = NULL;
    if (code == HYLA_RPC_OK) {
        hyla_rpc_call_reply(a->call, NULL);
    } else {
        char msg[1024];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        hyla_rpc_call_fail(a->call, code, "%s", msg);
    }
    if (a->done_seen) unregister_append(w, a);
}
static void free_gen(gen_job *g) {
    if (!g) return;
    for (size_t i = 0; i < g->n_stop; i++) free(g->stop[i]);
    free(g->stop);
    free(g->stop_ids);
    free(g->text);
    hyla_tokenizer_stream_free(g->ds);
    free(g);
}

/* Snapshot layout (parts without data) for incremental puts. */
static hyla_snapshot *layout_of(const hyla_snapshot *s) {
    hyla_snapshot *l = hyla_snapshot_create();
    if (!l) return NULL;
    l->parts = calloc(s->n_parts ? s->n_parts : 1, sizeof *l->parts);
    if (!l->parts) {
        free(l);
        return NULL;
    }
    memcpy(l->parts, s->parts, s->n_parts * sizeof *l->parts);
    for (uint32_t i = 0; i < s->n_parts; i++) l->parts[i].data = NULL;
    l->n_parts = l->cap_parts = s->n_parts;
    return l;
}

static void finish_export(hyla_worker *w, wsess *ws);

static void drop_session(hyla_worker *w, wsess *ws, const char *why) {
    finish_export(w, ws); /* before the session is freed; its put is queued as it would have been */
    if (ws->app) append_finish(w, ws->app, HYLA_RPC_ABORTED, "session %s: %s", ws->id, why);
    if (ws->gen) {
        char n[32];
        snprintf(n, sizeof n, "%u", ws->gen->delivered);
        hyla_rpc_call_set_trailer(ws->gen->call, HYLA_API_TOKENS_DELIVERED_KEY, n);
        hyla_rpc_call_fail(ws->gen->call, HYLA_RPC_UNAVAILABLE, "session %s: %s after %u tokens", ws->id, why,
                           ws->gen->delivered);
        free_gen(ws->gen);
    }
    if (ws->s) {
        hyla_session_free(ws->s);
    }
    if (ws->host) w->host_bytes -= hyla_snapshot_bytes(ws->host);
    hyla_snapshot_destroy(ws->host);
    hyla_snapshot_destroy(ws->layout);
    wsess **pp = &w->sessions;
    while (*pp != ws) pp = &(*pp)->next;
    *pp = ws->next;
    free(ws);
}

/* Make a session resident (restore an evicted host copy). */
static hyla_status make_resident(hyla_worker *w, wsess *ws) {
    if (ws->s) return HYLA_OK;
    if (!ws->host) return hyla_fail(HYLA_ERR_UNAVAILABLE, "session %s is not resident on this worker", ws->id);
    HYLA_TRY(hyla_session_import(w->rt, ws->host, &ws->s));
    w->host_bytes -= hyla_snapshot_bytes(ws->host);
    hyla_snapshot_destroy(ws->host);
    ws->host = NULL;
    HYLA_DEBUG("session %s restored from host memory", ws->id);
    return HYLA_OK;
}

/* Export a resident session and queue a durable put. */
static int holds_all_layers(const hyla_worker *w);
static hyla_status gather_downstream(hyla_worker *w, const wsess *ws, hyla_snapshot *snap);
static hyla_status queue_put(hyla_worker *w, wsess *ws, hyla_snapshot *snap, hyla_rpc_call *call, int reply_kind,
                             int unload_after);
static hyla_status start_put(hyla_worker *w, wsess *ws, hyla_rpc_call *call, int reply_kind, int unload_after) {
    finish_export(w, ws);
    int lb, le;
    hyla_model_layer_range(w->m, &lb, &le);
    if (lb != 0)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "session %s: snapshots are taken by pipeline stage 0, not this stage", ws->id);
    hyla_snapshot *snap = NULL;
    if (ws->s) HYLA_TRY(hyla_session_export(ws->s, &snap));
    else if (ws->host) HYLA_TRY(hyla_snapshot_clone(ws->host, &snap));
    else return hyla_fail(HYLA_ERR_UNAVAILABLE, "session %s has no state here", ws->id);
    return queue_put(w, ws, snap, call, reply_kind, unload_after);
}

/* Queue a durable put of snap (owned; for a pipeline, the later stages' parts are gathered
 * first). The I/O thread replies to call, if any, when it is committed. */
static hyla_status queue_put(hyla_worker *w, wsess *ws, hyla_snapshot *snap, hyla_rpc_call *call, int reply_kind,
                             int unload_after) {
    if (!holds_all_layers(w)) {
        hyla_status st = gather_downstream(w, ws, snap);
        if (st != HYLA_OK) {
            hyla_snapshot_destroy(snap);
            return st;
        }
    }
    io_item *it = calloc(1, sizeof *it);
    HYLA_ASSERT(it);
    it->kind = 1;
    snprintf(it->session, sizeof it->session, "%s", ws->id);
    it->epoch = ws->epoch;
    it->snap = snap;
    it->base_version = ws->snap_version;
    it->base = ws->layout ? layout_of(ws->layout) : NULL;
    it->call = call;
    it->reply_kind = reply_kind;
    it->unload_after = unload_after;
    ws->put_inflight++;
    io_post(w, it);
    return HYLA_OK;
}

/* End ws's pending auto-snapshot export, if any (waits for its copies), and queue its durable
 * put exactly as the synchronous auto-snapshot does. */
static void finish_export(hyla_worker *w, wsess *ws) {
    if (!ws->exp) return;
    hyla_snapshot *snap = NULL;
    hyla_status st = hyla_session_export_end(ws->exp, &snap);
    ws->exp = NULL;
    if (st == HYLA_OK) st = queue_put(w, ws, snap, NULL, 0, 0);
    if (st != HYLA_OK) {
        HYLA_WARN("snapshot of %s: %s (retrying in 2 s)", ws->id, hyla_last_error());
        ws->snap_retry_at = now_s() + 2;
    }
}

static void fill_status(hyla_worker *w, const wsess *ws, Hyla__V1__WorkerSessionStatus *st) {
    (void)w;
    hyla__v1__worker_session_status__init(st);
    st->session_id = (char *)ws->id;
    st->tier = ws->s ? HYLA__V1__TIER__TIER_GPU : ws->host ? HYLA__V1__TIER__TIER_HOST : HYLA__V1__TIER__TIER_STORE;
    if (ws->s) {
        st->position = (uint64_t)hyla_session_position(ws->s);
        st->generated = (uint64_t)hyla_session_generated(ws->s);
    } else if (ws->host) {
        st->position = ws->host->position;
        st->generated = ws->host->n_generated;
    }
    st->snapshot_version = ws->snap_version;
    st->placement_epoch = ws->epoch;
    st->busy = ws->app || ws->gen;
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
        s.top_k = sp->top_k;
        s.top_p = (sp->top_p <= 0 || sp->top_p >= 1) ? 1.0f : sp->top_p;
    }
    return s;
}

static const char *bad_sampling(const Hyla__V1__SamplingParams *sp) {
    if (!sp) return NULL;
    if (!isfinite(sp->temperature) || sp->temperature < 0) return "sampling.temperature must be >= 0";
    if (sp->top_k < 0) return "sampling.top_k must be >= 0";
    if (!isfinite(sp->top_p) || sp->top_p < 0 || sp->top_p > 1) return "sampling.top_p must be in [0, 1]";
    return NULL;
}

static int valid_id(const char *id) { return id && *id && strlen(id) < 128; }

/* ------------------------------------------------------------------------------------------ */
/* commands on the scheduler                                                                   */

static void do_load(hyla_worker *w, cmd *c) {
    const Hyla__V1__LoadSessionRequest *r = (const Hyla__V1__LoadSessionRequest *)c->msg;
    double t0 = now_s();
    if (!valid_id(r->session_id)) {
        hyla_rpc_call_fail(c->call, HYLA_RPC_INVALID_ARGUMENT, "LoadSession: session_id must be 1..127 bytes");
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
    wsess *ws = find(w, r->session_id);
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
    wsess *ws = find(w, c->session);
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

static wsess *lookup_or_fail(hyla_worker *w, hyla_rpc_call *call, const char *id, const char *what) {
    if (!valid_id(id)) {
        hyla_rpc_call_fail(call, HYLA_RPC_INVALID_ARGUMENT, "%s: session_id must be 1..127 bytes", what);
        return NULL;
    }
    wsess *ws = find(w, id);
    if (!ws) hyla_rpc_call_fail(call, HYLA_RPC_NOT_FOUND, "%s: session %s is not loaded on worker %s", what, id, w->worker_id);
    return ws;
}

static void do_snapshot(hyla_worker *w, cmd *c) {
    const Hyla__V1__SnapshotRequest *r = (const Hyla__V1__SnapshotRequest *)c->msg;
    wsess *ws = lookup_or_fail(w, c->call, r->session_id, "Snapshot");
    if (!ws) return;
    hyla_status st = start_put(w, ws, c->call, 1, 0);
    if (st != HYLA_OK) fail_call(c->call, st, hyla_last_error());
}

static void do_unload(hyla_worker *w, cmd *c) {
    const Hyla__V1__UnloadRequest *r = (const Hyla__V1__UnloadRequest *)c->msg;
    wsess *ws = lookup_or_fail(w, c->call, r->session_id, "Unload");
    if (!ws) return;
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

static void do_fork(hyla_worker *w, cmd *c) {
    const Hyla__V1__ForkSessionRequest *r = (const Hyla__V1__ForkSessionRequest *)c->msg;
    double t0 = now_s();
    wsess *src = lookup_or_fail(w, c->call, r->session_id, "ForkSession");
    if (!src) return;
    if (!valid_id(r->new_session_id) || find(w, r->new_session_id)) {
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
        wsess *ws = find(w, r->session_id);
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
    wsess *ws = find(w, c->session);
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

/* Deliver one sampled token; returns 1 when the job is finished (replied). */
static int deliver(hyla_worker *w, wsess *ws, int32_t tok) {
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
    Hyla__V1__GenerateResponse r = HYLA__V1__GENERATE_RESPONSE__INIT;
    r.n_token_ids = 1;
    r.token_ids = &tok;
    r.text.data = (uint8_t *)g->text + g->text_sent;
    r.text.len = send_to > g->text_sent ? send_to - g->text_sent : 0;
    r.position = (uint64_t)hyla_session_position(ws->s);
    g->text_sent = send_to > g->text_sent ? send_to : g->text_sent;
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
    if (hyla_rpc_call_send(g->call, &r.base) != HYLA_OK) {
        /* the client went away: end the job (the call reports its own status) */
        hyla_rpc_call_fail(g->call, HYLA_RPC_CANCELLED, "Generate cancelled");
        free_gen(g);
        ws->gen = NULL;
        return 1;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* pipelines                                                                                   */

static int holds_all_layers(const hyla_worker *w) {
    int b, e;
    hyla_model_layer_range(w->m, &b, &e);
    return b == 0 && e == hyla_model_get_config(w->m)->num_layers;
}

static void close_next(hyla_worker *w) {
    hyla_rpc_stream_destroy(w->next_stream);
    w->next_stream = NULL;
    hyla_rpc_client_destroy(w->next_client);
    w->next_client = NULL;
    w->next_open[0] = 0;
}

/* The engine's downstream callback (scheduler thread): send R rows to the next stage over a
 * long-lived StageForward stream and wait for its answer (with the logits when asked). */
static hyla_status stage_downstream(void *ud, hyla_session *const *ss, int R, int decode, const float *hidden,
                                    float *logits) {
    hyla_worker *w = ud;
    char addr[256];
    pthread_mutex_lock(&w->sum_mu);
    snprintf(addr, sizeof addr, "%s", w->next_stage);
    pthread_mutex_unlock(&w->sum_mu);
    if (!addr[0]) return hyla_fail(HYLA_ERR_UNAVAILABLE, "this worker holds only part of the model and no next stage is known yet");
    if (w->next_stream && strcmp(addr, w->next_open)) close_next(w);
    hyla_status st = HYLA_OK;
    if (!w->next_stream) {
        hyla_rpc_client_params cp = hyla_rpc_client_default_params();
        cp.max_message_bytes = w->p.max_message_bytes;
        st = hyla_rpc_client_create(addr, &cp, &w->next_client);
        hyla_rpc_call_opts o = {0, NULL, NULL, 1};
        if (st == HYLA_OK)
            st = hyla_rpc_stream_open(w->next_client, SVC "StageForward", &hyla__v1__stage_forward_response__descriptor, &o,
                                      &w->next_stream);
        if (st != HYLA_OK) {
            close_next(w);
            return hyla_fail_wrap(st, "opening StageForward to %s", addr);
        }
        snprintf(w->next_open, sizeof w->next_open, "%s", addr);
    }
    const hyla_model_config *cfg = hyla_model_get_config(w->m);
    int n_items = decode ? R : 1;
    Hyla__V1__StageItem *items = calloc((size_t)n_items, sizeof *items);
    Hyla__V1__StageItem **ip = calloc((size_t)n_items, sizeof *ip);
    HYLA_ASSERT(items && ip);
    for (int i = 0; i < n_items; i++) {
        hyla__v1__stage_item__init(&items[i]);
        wsess *ws = hyla_session_tag(ss[i]);
        items[i].session_id = ws->id;
        items[i].position = (uint64_t)hyla_session_position(ss[i]);
        items[i].n_tokens = decode ? 1 : (uint32_t)R;
        items[i].decode = decode;
        ip[i] = &items[i];
    }
    Hyla__V1__StageForwardRequest rq = HYLA__V1__STAGE_FORWARD_REQUEST__INIT;
    rq.step = ++w->stage_step;
    rq.n_items = (size_t)n_items;
    rq.items = ip;
    rq.dtype = HYLA__V1__DTYPE__DTYPE_F32;
    rq.hidden_size = (uint32_t)cfg->hidden_size;
    rq.hidden.data = (uint8_t *)hidden;
    rq.hidden.len = (size_t)R * cfg->hidden_size * sizeof(float);
    rq.xxh64 = XXH64(hidden, rq.hidden.len, 0);
    rq.want_logits = logits != NULL;
    st = hyla_rpc_stream_write(w->next_stream, &rq.base);
    free(items);
    free(ip);
    ProtobufCMessage *m = NULL;
    if (st == HYLA_OK) st = hyla_rpc_stream_read(w->next_stream, &m);
    if (st == HYLA_OK && !m) st = hyla_fail(HYLA_ERR_UNAVAILABLE, "the next stage (%s) ended the StageForward stream", addr);
    if (st != HYLA_OK) {
        close_next(w);
        return hyla_fail_wrap(st, "StageForward to %s", addr);
    }
    Hyla__V1__StageForwardResponse *r = (Hyla__V1__StageForwardResponse *)m;
    for (size_t i = 0; st == HYLA_OK && i < r->n_results; i++)
        if (r->results[i]->error && *r->results[i]->error)
            st = hyla_fail(HYLA_ERR_UNAVAILABLE, "next stage %s: session %s: %s", addr, r->results[i]->session_id,
                           r->results[i]->error);
    size_t want = (size_t)R * cfg->vocab_size * sizeof(float);
    if (st == HYLA_OK && r->step != rq.step)
        st = hyla_fail(HYLA_ERR_INTERNAL, "next stage %s answered step %llu to step %llu", addr,
                       (unsigned long long)r->step, (unsigned long long)rq.step);
    if (st == HYLA_OK && logits) {
        if (r->logits.len != want)
            st = hyla_fail(HYLA_ERR_FORMAT, "next stage %s returned %zu bytes of logits, expected %zu", addr, r->logits.len, want);
        else
            memcpy(logits, r->logits.data, want);
    }
    protobuf_c_message_free_unpacked(m, NULL);
    return st;
}

static stage_call *find_stage_call(hyla_worker *w, hyla_rpc_call *call) {
    for (stage_call *c = w->stage_calls; c; c = c->next)
        if (c->call == call) return c;
    return NULL;
}

static void unregister_stage_call(hyla_worker *w, stage_call *sc) {
    stage_call **pp = &w->stage_calls;
    while (*pp && *pp != sc) pp = &(*pp)->next;
    if (*pp) *pp = sc->next;
    free(sc);
}

static void stage_release(hyla_worker *w, stage_call *sc, hyla_rpc_code code, const char *msg) {
    if (sc->released) return;
    sc->released = 1;
    if (code == HYLA_RPC_OK) hyla_rpc_call_reply(sc->call, NULL);
    else hyla_rpc_call_fail(sc->call, code, "%s", msg);
    if (sc->done_seen) unregister_stage_call(w, sc);
}

/* One step from the previous stage: run our layers (and, through our own downstream, the rest). */
static void do_stage_msg(hyla_worker *w, cmd *c) {
    stage_call *sc = find_stage_call(w, c->call);
    if (!sc || sc->released) return;
    const Hyla__V1__StageForwardRequest *r = (const Hyla__V1__StageForwardRequest *)c->msg;
    const hyla_model_config *cfg = hyla_model_get_config(w->m);
    char err[512] = "";
    size_t rows = 0;
    for (size_t i = 0; i < r->n_items; i++) rows += r->items[i]->n_tokens;
    int decode = r->n_items > 0 && r->items[0]->decode;
    if (!r->n_items || r->dtype != HYLA__V1__DTYPE__DTYPE_F32 || r->hidden_size != (uint32_t)cfg->hidden_size ||
        r->hidden.len != rows * cfg->hidden_size * sizeof(float) || (decode && rows != r->n_items) ||
        (!decode && r->n_items != 1) || rows > 1024)
        snprintf(err, sizeof err, "StageForward: step %llu is malformed (items %zu, rows %zu, hidden %zu bytes)",
                 (unsigned long long)r->step, r->n_items, rows, r->hidden.len);
    else if (XXH64(r->hidden.data, r->hidden.len, 0) != r->xxh64)
        snprintf(err, sizeof err, "StageForward: step %llu: hidden states checksum mismatch", (unsigned long long)r->step);
    if (err[0]) {
        stage_release(w, sc, HYLA_RPC_INVALID_ARGUMENT, err);
        return;
    }
    hyla_session **ss = calloc(r->n_items, sizeof *ss);
    Hyla__V1__StageResult *res = calloc(r->n_items, sizeof *res);
    Hyla__V1__StageResult **rp = calloc(r->n_items, sizeof *rp);
    char (*errs)[256] = calloc(r->n_items, sizeof *errs);
    HYLA_ASSERT(ss && res && rp && errs);
    int bad = 0;
    for (size_t i = 0; i < r->n_items; i++) {
        hyla__v1__stage_result__init(&res[i]);
        res[i].session_id = r->items[i]->session_id;
        res[i].token = -1;
        rp[i] = &res[i];
        wsess *ws = find(w, r->items[i]->session_id ? r->items[i]->session_id : "");
        if (!ws || make_resident(w, ws) != HYLA_OK)
            snprintf(errs[i], sizeof errs[i], "session is not loaded on stage worker %s", w->worker_id);
        else if ((uint64_t)hyla_session_position(ws->s) != r->items[i]->position)
            snprintf(errs[i], sizeof errs[i], "position %llu here, %llu at the previous stage",
                     (unsigned long long)hyla_session_position(ws->s), (unsigned long long)r->items[i]->position);
        else {
            ss[i] = ws->s;
            ws->last_used = now_s();
        }
        if (errs[i][0]) {
            res[i].error = errs[i];
            bad = 1;
        }
    }
    float *logits = NULL;
    Hyla__V1__StageForwardResponse resp = HYLA__V1__STAGE_FORWARD_RESPONSE__INIT;
    resp.step = r->step;
    resp.n_results = r->n_items;
    resp.results = rp;
    if (!bad) {
        if (r->want_logits) logits = malloc(rows * cfg->vocab_size * sizeof(float));
        hyla_status st = hyla_stage_forward(ss, (int)rows, decode, (const float *)r->hidden.data, logits);
        if (st != HYLA_OK) {
            char msg[1024];
            snprintf(msg, sizeof msg, "stage worker %s: %s", w->worker_id, hyla_last_error());
            free(logits);
            free(ss), free(res), free(rp), free(errs);
            stage_release(w, sc, hyla_rpc_code_from_status(st), msg);
            return;
        }
        w->tok_window += rows;
        if (logits) {
            resp.logits.data = (uint8_t *)logits;
            resp.logits.len = rows * cfg->vocab_size * sizeof(float);
        }
    }
    if (hyla_rpc_call_send(sc->call, &resp.base) != HYLA_OK) stage_release(w, sc, HYLA_RPC_CANCELLED, "StageForward cancelled");
    free(logits);
    free(ss), free(res), free(rp), free(errs);
}

/* Fetch the parts the later stages hold for ws and append them to snap (scheduler thread). */
static hyla_status gather_downstream(hyla_worker *w, const wsess *ws, hyla_snapshot *snap) {
    char addr[256];
    pthread_mutex_lock(&w->sum_mu);
    snprintf(addr, sizeof addr, "%s", w->next_stage);
    pthread_mutex_unlock(&w->sum_mu);
    if (!addr[0]) return hyla_fail(HYLA_ERR_UNAVAILABLE, "session %s: no next pipeline stage known", ws->id);
    hyla_rpc_client *c = NULL;
    hyla_rpc_client_params cp = hyla_rpc_client_default_params();
    cp.max_message_bytes = w->p.max_message_bytes;
    HYLA_TRY(hyla_rpc_client_create(addr, &cp, &c));
    Hyla__V1__ExportStageRequest rq = HYLA__V1__EXPORT_STAGE_REQUEST__INIT;
    rq.session_id = (char *)ws->id;
    rq.max_piece_bytes = (uint32_t)(w->p.max_message_bytes / 2); /* what this stage can receive */
    rq.position = snap->position;
    hyla_rpc_call_opts o = {RPC_TIMEOUT_MS, NULL, NULL, 0};
    hyla_rpc_stream *st = NULL;
    hyla_snapshot *down = NULL;
    hyla_status s = hyla_rpc_stream_open(c, SVC "ExportStage", &hyla__v1__get_snapshot_response__descriptor, &o, &st);
    if (s == HYLA_OK) s = hyla_rpc_stream_write(st, &rq.base);
    if (s == HYLA_OK) s = hyla_rpc_stream_close_send(st);
    char what[512];
    snprintf(what, sizeof what, "ExportStage %s from %s", ws->id, addr);
    if (s == HYLA_OK) s = hyla_store_rpc_recv_snapshot(st, what, &down, NULL);
    if (st) {
        hyla_status fs = hyla_rpc_stream_finish(st, NULL);
        if (s == HYLA_OK) s = fs;
        hyla_rpc_stream_destroy(st);
    }
    hyla_rpc_client_destroy(c);
    for (uint32_t i = 0; s == HYLA_OK && i < down->n_parts; i++) {
        const hyla_state_part *q = &down->parts[i];
        hyla_state_part *np = NULL;
        if (hyla_snapshot_find(snap, q->layer, q->name)) continue;
        s = hyla_snapshot_add_part(snap, q->layer, q->name, (hyla_part_kind)q->kind, (hyla_dtype)q->dtype, q->ndim, q->shape,
                                   q->page_tokens, &np);
        if (s == HYLA_OK) memcpy(np->data, q->data, q->nbytes);
    }
    hyla_snapshot_destroy(down);
    return s;
}

static void do_export(hyla_worker *w, cmd *c) {
    const Hyla__V1__ExportStageRequest *r = (const Hyla__V1__ExportStageRequest *)c->msg;
    wsess *ws = lookup_or_fail(w, c->call, r->session_id, "ExportStage");
    if (!ws) return;
    finish_export(w, ws);
    hyla_status st = make_resident(w, ws);
    if (st != HYLA_OK) {
        fail_call(c->call, st, hyla_last_error());
        return;
    }
    if ((uint64_t)hyla_session_position(ws->s) != r->position) {
        hyla_rpc_call_fail(c->call, HYLA_RPC_FAILED_PRECONDITION, "ExportStage %s: position %llu here, %llu at stage 0",
                           ws->id, (unsigned long long)hyla_session_position(ws->s), (unsigned long long)r->position);
        return;
    }
    hyla_snapshot *snap = NULL;
    st = hyla_session_export(ws->s, &snap);
    if (st == HYLA_OK && !holds_all_layers(w)) {
        int lb, le;
        hyla_model_layer_range(w->m, &lb, &le);
        if (le < hyla_model_get_config(w->m)->num_layers) st = gather_downstream(w, ws, snap);
    }
    if (st == HYLA_OK) st = hyla_store_rpc_send_snapshot(c->call, ws->id, snap, 0, r->max_piece_bytes);
    hyla_snapshot_destroy(snap);
    if (st != HYLA_OK) fail_call(c->call, st, hyla_last_error());
    else hyla_rpc_call_reply(c->call, NULL);
}

/* ------------------------------------------------------------------------------------------ */
/* the scheduler                                                                               */

/* Bytes of state the resident sessions hold now (KV grows with the context, so it is summed
 * afresh rather than tracked). */
static uint64_t resident_bytes(const hyla_worker *w) {
    uint64_t n = 0;
    for (const wsess *s = w->sessions; s; s = s->next)
        if (s->s) n += hyla_session_state_bytes(s->s);
    return n;
}

static void publish_summary(hyla_worker *w, uint32_t queued_tokens) {
    size_t n = 0;
    for (wsess *s = w->sessions; s; s = s->next) n++;
    Hyla__V1__WorkerSessionStatus *sum = calloc(n ? n : 1, sizeof *sum);
    char **ids = calloc(n ? n : 1, sizeof *ids);
    size_t i = 0;
    uint32_t gpu = 0, host = 0, calls = 0;
    for (wsess *s = w->sessions; s; s = s->next, i++) {
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
    pthread_mutex_unlock(&w->sum_mu);
}

/* Over the state budget, idle sessions leave the device pool for host memory (after a durable
 * put when the store does not already cover their position). Over the host budget, host-tier
 * sessions whose durable snapshot covers them leave this worker altogether: the coordinator
 * re-places them from the store when they are next addressed. Least recently used first. */
static void evict_if_needed(hyla_worker *w) {
    while (w->p.state_budget_bytes && resident_bytes(w) > w->p.state_budget_bytes) {
        wsess *victim = NULL;
        for (wsess *s = w->sessions; s; s = s->next)
            if (s->s && !s->app && !s->gen && (!victim || s->last_used < victim->last_used)) victim = s;
        if (!victim) break;
        finish_export(w, victim);
        /* the host copy is an ordinary snapshot (a clone): exported snapshots hold pinned
         * buffers, which are for snapshots on their way to the store */
        hyla_snapshot *snap = NULL, *host = NULL;
        if (hyla_session_export(victim->s, &snap) != HYLA_OK || hyla_snapshot_clone(snap, &host) != HYLA_OK) {
            HYLA_WARN("evicting %s: %s", victim->id, hyla_last_error());
            hyla_snapshot_destroy(snap);
            break;
        }
        if (snap->position != victim->snap_pos || !victim->snap_version) {
            if (queue_put(w, victim, snap, NULL, 0, 0) != HYLA_OK)
                HYLA_WARN("evicting %s: durable snapshot not queued: %s", victim->id, hyla_last_error());
        } else {
            hyla_snapshot_destroy(snap);
        }
        snap = host;
        hyla_session_free(victim->s);
        victim->s = NULL;
        victim->host = snap;
        w->host_bytes += hyla_snapshot_bytes(snap);
        HYLA_INFO("session %s evicted to host memory (state budget %llu bytes)", victim->id,
                  (unsigned long long)w->p.state_budget_bytes);
    }
    while (w->p.host_budget_bytes && w->host_bytes > w->p.host_budget_bytes) {
        wsess *victim = NULL;
        for (wsess *s = w->sessions; s; s = s->next)
            if (s->host && !s->put_inflight && s->snap_version && s->snap_pos == s->host->position && !s->app &&
                !s->gen && (!victim || s->last_used < victim->last_used))
                victim = s;
        if (!victim) break;
        HYLA_INFO("session %s unloaded: host budget %llu bytes; version %llu in the store covers it", victim->id,
                  (unsigned long long)w->p.host_budget_bytes, (unsigned long long)victim->snap_version);
        drop_session(w, victim, "unloaded to the store");
    }
}

static void process_commands(hyla_worker *w, cmd *list) {
    while (list) {
        cmd *c = list;
        list = list->next;
        switch (c->type) {
        case C_LOAD: do_load(w, c); break;
        case C_SNAPSHOT: do_snapshot(w, c); break;
        case C_UNLOAD: do_unload(w, c); break;
        case C_FORK: do_fork(w, c); break;
        case C_DESCRIBE: do_describe(w, c); break;
        case C_APPEND_START: do_append_start(w, c); break;
        case C_APPEND_MSG: do_append_msg(w, c); break;
        case C_APPEND_END: do_append_end(w, c); break;
        case C_APPEND_DONE: do_append_done(w, c); break;
        case C_GENERATE: do_generate(w, c); break;
        case C_GOT_SNAPSHOT: do_got_snapshot(w, c); break;
        case C_PUT_DONE: do_put_done(w, c); break;
        case C_DROP: {
            wsess *ws = find(w, c->session);
            if (ws && (!c->epoch || ws->epoch <= c->epoch)) {
                HYLA_INFO("session %s dropped: placed elsewhere", ws->id);
                drop_session(w, ws, "placed on another worker");
            }
            break;
        }
        case C_DRAIN:
            if (!w->draining) {
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
            break;
        case C_STAGE_START: {
            stage_call *sc = calloc(1, sizeof *sc);
            HYLA_ASSERT(sc);
            sc->call = c->call;
            sc->next = w->stage_calls;
            w->stage_calls = sc;
            break;
        }
        case C_STAGE_MSG: do_stage_msg(w, c); break;
        case C_EXPORT: do_export(w, c); break;
        case C_STAGE_END: {
            stage_call *sc = find_stage_call(w, c->call);
            if (sc) stage_release(w, sc, HYLA_RPC_OK, "");
            break;
        }
        case C_STAGE_DONE: {
            stage_call *sc = find_stage_call(w, c->call);
            if (sc) {
                sc->done_seen = 1;
                if (sc->released) unregister_stage_call(w, sc);
                else stage_release(w, sc, HYLA_RPC_CANCELLED, "StageForward cancelled");
            }
            break;
        }
        case C_WAKE: break;
        }
        free_cmd(c);
    }
}

static void *scheduler_main(void *arg) {
    hyla_worker *w = arg;
    hyla_session **batch = malloc((size_t)w->p.max_batch * sizeof *batch);
    wsess **bws = malloc((size_t)w->p.max_batch * sizeof *bws);
    int32_t *out = malloc((size_t)w->p.max_batch * sizeof *out);
    HYLA_ASSERT(batch && bws && out);
    w->tok_window_t0 = now_s();
    double last_pub = 0;
    while (!w->stop) {
        pthread_mutex_lock(&w->mu);
        cmd *list = w->q_head;
        w->q_head = w->q_tail = NULL;
        pthread_mutex_unlock(&w->mu);
        int commands = list != NULL; /* may have changed the session table: publish it at once */
        process_commands(w, list);

        /* cancelled calls end their jobs */
        for (wsess *s = w->sessions; s; s = s->next) {
            if (s->gen && hyla_rpc_call_cancelled(s->gen->call)) {
                hyla_rpc_call_fail(s->gen->call, HYLA_RPC_CANCELLED, "Generate cancelled after %u tokens", s->gen->delivered);
                free_gen(s->gen);
                s->gen = NULL;
            }
        }
        for (append_job *a = w->appends, *next; a; a = next) {
            next = a->next_reg;
            if (!a->released && hyla_rpc_call_cancelled(a->call))
                append_finish(w, a, HYLA_RPC_CANCELLED, "Append cancelled");
        }

        int worked = 0;
        /* decode: one batched step over every generating session */
        int B = 0;
        for (wsess *s = w->sessions; s && B < w->p.max_batch; s = s->next)
            if (s->gen && s->s) {
                bws[B] = s;
                batch[B++] = s->s;
            }
        if (B) {
            hyla_status st = hyla_session_decode(batch, B, out, NULL);
            worked = 1;
            if (st != HYLA_OK) {
                char msg[1024];
                snprintf(msg, sizeof msg, "%s", hyla_last_error());
                HYLA_ERROR("decode step of %d sessions failed: %s", B, msg);
                for (int i = 0; i < B; i++) {
                    char n[32];
                    snprintf(n, sizeof n, "%u", bws[i]->gen->delivered);
                    hyla_rpc_call_set_trailer(bws[i]->gen->call, HYLA_API_TOKENS_DELIVERED_KEY, n);
                    fail_call(bws[i]->gen->call, st, msg);
                    free_gen(bws[i]->gen);
                    bws[i]->gen = NULL;
                }
            } else {
                w->tok_window += (uint64_t)B;
                for (int i = 0; i < B; i++) {
                    bws[i]->last_used = now_s();
                    deliver(w, bws[i], out[i]);
                }
            }
        }

        /* prefill under the per-step token budget */
        int budget = w->p.prefill_budget;
        uint32_t queued = 0;
        for (wsess *s = w->sessions; s; s = s->next) {
            append_job *a = s->app;
            if (!a) continue;
            if (a->n && budget > 0 && s->s) {
                /* Feed so that the session's position lands on a multiple of the prefill chunk:
                 * then the pieces are those of one uninterrupted feed, bit for bit. Only the
                 * tail of a finished stream is fed unaligned. */
                int n;
                if (a->half_closed && a->n <= (size_t)budget) {
                    n = (int)a->n;
                } else {
                    int64_t p0 = hyla_session_position(s->s) + (hyla_session_pending(s->s) >= 0);
                    int64_t first = ((1 - p0) % HYLA_PREFILL_CHUNK + HYLA_PREFILL_CHUNK) % HYLA_PREFILL_CHUNK;
                    if (first == 0) first = HYLA_PREFILL_CHUNK;
                    int64_t avail = a->n < (size_t)budget ? (int64_t)a->n : budget;
                    n = avail < first ? 0 : (int)(first + (avail - first) / HYLA_PREFILL_CHUNK * HYLA_PREFILL_CHUNK);
                }
                if (n == 0) goto progress;
                int consumed = 0;
                hyla_status st = hyla_session_feed(s->s, a->toks, n, NULL, &consumed, NULL, NULL);
                worked = 1;
                if (st != HYLA_OK) {
                    append_finish(w, a, hyla_rpc_code_from_status(st), "%s", hyla_last_error());
                    continue;
                }
                memmove(a->toks, a->toks + n, (a->n - (size_t)n) * sizeof *a->toks);
                a->n -= (size_t)n;
                a->ingested += (uint64_t)n;
                budget -= n;
                w->tok_window += (uint64_t)n;
                s->last_used = now_s();
                if (a->held && a->n < (size_t)w->p.prefill_budget * 16) {
                    hyla_rpc_call_read_resume(a->call);
                    a->held = 0;
                }
            }
        progress:
            queued += (uint32_t)a->n;
            double t = now_s();
            int done = a->half_closed && a->n == 0;
            if (done || t - a->last_progress > 0.2) {
                Hyla__V1__AppendProgress pr = HYLA__V1__APPEND_PROGRESS__INIT;
                pr.tokens_received = a->received;
                pr.tokens_ingested = a->ingested;
                pr.total_tokens = a->total_hint;
                pr.tokens_per_second = t > a->t0 ? a->ingested / (t - a->t0) : 0;
                pr.position = (uint64_t)hyla_session_position(s->s) + (hyla_session_pending(s->s) >= 0);
                pr.done = done;
                a->last_progress = t;
                if (done) {
                    hyla_rpc_call_send(a->call, &pr.base);
                    append_finish(w, a, HYLA_RPC_OK, " ");
                } else if (a->ingested) {
                    hyla_rpc_call_send(a->call, &pr.base);
                }
            }
        }

        /* auto-snapshots every K tokens (begun here, ended once their copies are done); drain
         * snapshots everything idle */
        int lb0, le0;
        hyla_model_layer_range(w->m, &lb0, &le0);
        int whole = holds_all_layers(w);
        for (wsess *s = w->sessions; s && lb0 == 0; s = s->next) {
            if (s->exp && hyla_session_export_done(s->exp)) finish_export(w, s);
            if (!s->s || s->put_inflight || s->exp) continue;
            uint64_t pos = (uint64_t)hyla_session_position(s->s);
            int due = w->p.snapshot_every && pos >= s->snap_pos + w->p.snapshot_every && now_s() >= s->snap_retry_at;
            int drain = w->draining && !s->app && !s->gen && now_s() >= s->snap_retry_at;
            if (due && !drain && whole) {
                if (hyla_session_export_begin(s->s, &s->exp) != HYLA_OK) {
                    HYLA_WARN("snapshot of %s: %s (retrying in 2 s)", s->id, hyla_last_error());
                    s->snap_retry_at = now_s() + 2;
                }
            } else if (due || drain) {
                if (start_put(w, s, NULL, 0, drain) != HYLA_OK) {
                    HYLA_WARN("snapshot of %s: %s (retrying in 2 s)", s->id, hyla_last_error());
                    if (drain) set_drain_error(w, s->id, hyla_last_error());
                    s->snap_retry_at = now_s() + 2;
                }
            }
        }
        if (w->draining && !w->drained) {
            int left = 0;
            for (wsess *s = w->sessions; s; s = s->next) left++;
            if (!left) {
                HYLA_INFO("drained: every session is durable in the store");
                pthread_mutex_lock(&w->exit_mu);
                w->drained = 1;
                pthread_cond_broadcast(&w->exit_cv);
                pthread_mutex_unlock(&w->exit_mu);
            }
        }
        /* nothing to overlap with: end the pending exports now rather than after a sleep */
        if (!worked)
            for (wsess *s = w->sessions; s; s = s->next) finish_export(w, s);
        evict_if_needed(w);
        double t = now_s();
        if (t - last_pub > 0.2 || worked || commands) {
            publish_summary(w, queued);
            last_pub = t;
        }
        if (!worked) {
            pthread_mutex_lock(&w->mu);
            if (!w->q_head && !w->stop) {
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_nsec += 50 * 1000000;
                if (ts.tv_nsec >= 1000000000) {
                    ts.tv_sec++;
                    ts.tv_nsec -= 1000000000;
                }
                pthread_cond_timedwait(&w->cv, &w->mu, &ts);
            }
            pthread_mutex_unlock(&w->mu);
        }
    }
    /* shutdown: end every job, free sessions */
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
    free(batch);
    free(bws);
    free(out);
    return NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* I/O thread: statestore and snapshot reports                                                 */

static hyla_status ensure_store(hyla_worker *w) {
    if (w->store) return HYLA_OK;
    const char *addr = w->p.store ? w->p.store : w->store_addr;
    if (!addr || !*addr) return hyla_fail(HYLA_ERR_UNAVAILABLE, "no statestore address (no coordinator registration yet)");
    hyla_rpc_client_params cp = hyla_rpc_client_default_params();
    cp.max_message_bytes = w->p.max_message_bytes;
    return hyla_rpc_client_create(addr, &cp, &w->store);
}

static void report_snapshot(hyla_worker *w, const io_item *it, const hyla_snapshot_info *info) {
    if (!w->coord) return;
    Hyla__V1__ReportSnapshotRequest r = HYLA__V1__REPORT_SNAPSHOT_REQUEST__INIT;
    Hyla__V1__SnapshotInfo si = HYLA__V1__SNAPSHOT_INFO__INIT;
    hyla_store_rpc_info_to_msg(info, &si);
    r.worker_id = w->worker_id;
    r.epoch = w->epoch;
    r.session_id = (char *)it->session;
    r.placement_epoch = it->epoch;
    r.snapshot = &si;
    hyla_rpc_call_opts o = {5000, NULL, NULL, 0};
    ProtobufCMessage *resp = NULL;
    if (hyla_rpc_client_unary(w->coord, COORD "ReportSnapshot", &r.base, &hyla__v1__report_snapshot_response__descriptor,
                              &resp, &o, NULL) == HYLA_OK) {
        if (((Hyla__V1__ReportSnapshotResponse *)resp)->stale) {
            cmd *c = new_cmd(C_DROP, NULL, NULL);
            snprintf(c->session, sizeof c->session, "%s", it->session);
            c->epoch = it->epoch;
            post(w, c);
        }
        protobuf_c_message_free_unpacked(resp, NULL);
    } else {
        HYLA_DEBUG("ReportSnapshot %s: %s", it->session, hyla_last_error());
    }
}

static void *io_main(void *arg) {
    hyla_worker *w = arg;
    for (;;) {
        pthread_mutex_lock(&w->io_mu);
        while (!w->io_head && !w->stop) pthread_cond_wait(&w->io_cv, &w->io_mu);
        io_item *it = w->io_head;
        if (it) {
            w->io_head = it->next;
            if (!w->io_head) w->io_tail = NULL;
        }
        pthread_mutex_unlock(&w->io_mu);
        if (!it) break; /* stop and nothing queued */
        cmd *c = new_cmd(it->kind == 1 ? C_PUT_DONE : C_GOT_SNAPSHOT, it->call, NULL);
        snprintf(c->session, sizeof c->session, "%s", it->session);
        c->epoch = it->epoch;
        c->reply_kind = it->reply_kind;
        c->unload_after = it->unload_after;
        hyla_status st = ensure_store(w);
        if (it->kind == 1) {
            if (st == HYLA_OK)
                st = hyla_store_rpc_put(w->store, it->session, it->epoch, it->snap, it->base_version, it->base,
                                        RPC_TIMEOUT_MS, &c->info);
            if (st == HYLA_OK) {
                c->snap = layout_of(it->snap);
                HYLA_DEBUG("session %s: version %llu durable at position %llu", it->session,
                           (unsigned long long)c->info.version, (unsigned long long)c->info.position);
                report_snapshot(w, it, &c->info);
            }
        } else {
            if (st == HYLA_OK) st = hyla_store_rpc_get(w->store, it->session, it->version, RPC_TIMEOUT_MS, &c->snap, &c->version);
        }
        c->status = st;
        if (st != HYLA_OK) snprintf(c->err, sizeof c->err, "%s", hyla_last_error());
        post(w, c);
        hyla_snapshot_destroy(it->snap);
        hyla_snapshot_destroy(it->base);
        free(it);
    }
    return NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* membership                                                                                  */

static hyla_status do_register(hyla_worker *w) {
    const hyla_model_config *cfg = hyla_model_get_config(w->m);
    int lb, le;
    hyla_model_layer_range(w->m, &lb, &le);
    Hyla__V1__RegisterWorkerRequest r = HYLA__V1__REGISTER_WORKER_REQUEST__INIT;
    Hyla__V1__LayerRange lr = HYLA__V1__LAYER_RANGE__INIT;
    Hyla__V1__Device dev = HYLA__V1__DEVICE__INIT;
    lr.begin = (uint32_t)lb;
    lr.end = (uint32_t)le;
    dev.name = (char *)w->p.device;
    char desc[128];
    snprintf(desc, sizeof desc, "%s backend, %ld cores", hyla_model_backend(w->m)->ops->name, sysconf(_SC_NPROCESSORS_ONLN));
    dev.description = desc;
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE), avail = sysconf(_SC_AVPHYS_PAGES);
    dev.memory_total_bytes = (uint64_t)pages * (uint64_t)psz;
    dev.memory_free_bytes = (uint64_t)avail * (uint64_t)psz;
    r.worker_id = w->worker_id;
    r.address = w->advertise;
    r.model = w->model_name;
    r.model_fingerprint = hyla_model_fingerprint(w->m);
    r.num_layers = (uint32_t)cfg->num_layers;
    r.layers = &lr;
    r.device = &dev;
    r.param_bytes = hyla_model_param_bytes(w->m);
    r.state_budget_bytes = w->p.state_budget_bytes;
    r.version = "hyla 0.1";
    hyla_rpc_call_opts o = {5000, NULL, NULL, 0};
    ProtobufCMessage *resp = NULL;
    HYLA_TRY(hyla_rpc_client_unary(w->coord, COORD "RegisterWorker", &r.base, &hyla__v1__register_worker_response__descriptor,
                                   &resp, &o, NULL));
    Hyla__V1__RegisterWorkerResponse *rr = (Hyla__V1__RegisterWorkerResponse *)resp;
    if (rr->worker_id && *rr->worker_id) snprintf(w->worker_id, sizeof w->worker_id, "%s", rr->worker_id);
    w->epoch = rr->epoch;
    w->hb_interval_ms = rr->heartbeat_interval_ms ? rr->heartbeat_interval_ms : 1000;
    snprintf(w->group_id, sizeof w->group_id, "%s", rr->group_id ? rr->group_id : "");
    pthread_mutex_lock(&w->sum_mu);
    snprintf(w->next_stage, sizeof w->next_stage, "%s", rr->next_stage_address ? rr->next_stage_address : "");
    pthread_mutex_unlock(&w->sum_mu);
    if (!w->p.store && rr->store_address && *rr->store_address)
        snprintf(w->store_addr, sizeof w->store_addr, "%s", rr->store_address);
    HYLA_INFO("registered as %s (epoch %llu, group %s, stage %u) with %s", w->worker_id, (unsigned long long)w->epoch,
              w->group_id, rr->stage, w->p.coordinator);
    protobuf_c_message_free_unpacked(resp, NULL);
    return HYLA_OK;
}

static void sleep_ms(hyla_worker *w, uint32_t ms) {
    for (uint32_t t = 0; t < ms && !w->stop; t += 20) usleep(20000);
}

static void *membership_main(void *arg) {
    hyla_worker *w = arg;
    int registered = 0;
    while (!w->stop) {
        if (!registered) {
            if (do_register(w) == HYLA_OK) registered = 1;
            else {
                HYLA_WARN("cannot register with %s: %s (retrying)", w->p.coordinator, hyla_last_error());
                sleep_ms(w, 1000);
                continue;
            }
        }
        Hyla__V1__HeartbeatRequest r = HYLA__V1__HEARTBEAT_REQUEST__INIT;
        r.worker_id = w->worker_id;
        r.epoch = w->epoch;
        pthread_mutex_lock(&w->exit_mu);
        int drained = w->drained; /* read before the summary, which is published after it is set */
        pthread_mutex_unlock(&w->exit_mu);
        pthread_mutex_lock(&w->sum_mu);
        Hyla__V1__WorkerLoad load = w->load;
        r.load = &load;
        Hyla__V1__WorkerSessionStatus **ptrs = calloc(w->n_sum ? w->n_sum : 1, sizeof *ptrs);
        for (size_t i = 0; i < w->n_sum; i++) ptrs[i] = &w->sum[i];
        r.n_sessions = w->n_sum;
        r.sessions = ptrs;
        r.drain_error = w->drain_error;
        int last = drained && w->n_sum == 0; /* tells the coordinator it is drained */
        size_t n = protobuf_c_message_get_packed_size(&r.base);
        uint8_t *buf = malloc(n ? n : 1);
        protobuf_c_message_pack(&r.base, buf);
        pthread_mutex_unlock(&w->sum_mu);
        free(ptrs);
        Hyla__V1__HeartbeatRequest *copy = hyla__v1__heartbeat_request__unpack(NULL, n, buf);
        free(buf);
        hyla_rpc_call_opts o = {3000, NULL, NULL, 0};
        ProtobufCMessage *resp = NULL;
        hyla_status st = hyla_rpc_client_unary(w->coord, COORD "Heartbeat", &copy->base,
                                               &hyla__v1__heartbeat_response__descriptor, &resp, &o, NULL);
        hyla__v1__heartbeat_request__free_unpacked(copy, NULL);
        if (st == HYLA_OK) {
            Hyla__V1__HeartbeatResponse *hr = (Hyla__V1__HeartbeatResponse *)resp;
            if (hr->reregister) registered = 0;
            if (hr->drain && !w->draining) post(w, new_cmd(C_DRAIN, NULL, NULL));
            if (hr->drain && last && !hr->reregister) {
                pthread_mutex_lock(&w->exit_mu);
                w->drain_acked = 1;
                pthread_cond_broadcast(&w->exit_cv);
                pthread_mutex_unlock(&w->exit_mu);
            }
            for (size_t i = 0; i < hr->n_unload_session_ids; i++) {
                cmd *c = new_cmd(C_DROP, NULL, NULL);
                snprintf(c->session, sizeof c->session, "%s", hr->unload_session_ids[i]);
                post(w, c);
            }
            protobuf_c_message_free_unpacked(resp, NULL);
        } else {
            HYLA_DEBUG("heartbeat: %s", hyla_last_error());
        }
        sleep_ms(w, w->hb_interval_ms);
    }
    return NULL;
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
    if (w->p.prefill_budget < HYLA_PREFILL_CHUNK) w->p.prefill_budget = HYLA_PREFILL_CHUNK; /* aligned feeding needs a chunk */
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
    hyla_status st = hyla_backend_create(p->device, &w->be);
    hyla_model_params mp = hyla_model_default_params();
    mp.layer_begin = p->layer_begin;
    mp.layer_end = p->layer_end;
    if (st == HYLA_OK) st = hyla_model_load(p->model_dir, w->be, &mp, &w->m);
    if (st == HYLA_OK) st = hyla_runtime_create(w->m, &w->rt);
    if (st != HYLA_OK) {
        hyla_worker_destroy(w);
        return st;
    }
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
            hyla_runtime_set_downstream(w->rt, stage_downstream, w);
            /* a prefill piece's hidden states travel in one StageForward message: keep it under
             * half the message limit */
            long rows = (long)p->max_message_bytes / 2 / ((long)hyla_model_get_config(w->m)->hidden_size * 4);
            rows = rows / HYLA_PREFILL_CHUNK * HYLA_PREFILL_CHUNK;
            if (rows < HYLA_PREFILL_CHUNK) rows = HYLA_PREFILL_CHUNK;
            if (rows < hyla_runtime_prefill_piece(w->rt)) {
                (void)hyla_runtime_set_prefill_piece(w->rt, (int)rows); /* in range: a multiple of the chunk */
                HYLA_INFO("prefill pieces of at most %ld tokens (pipeline stage messages up to %d bytes)", rows,
                          p->max_message_bytes);
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
    ADD("ExportStage", HYLA_RPC_SERVER_STREAM, hyla__v1__export_stage_request__descriptor, hyla__v1__get_snapshot_response__descriptor, h_export);
    ADD("StageForward", HYLA_RPC_BIDI, hyla__v1__stage_forward_request__descriptor, hyla__v1__stage_forward_response__descriptor, h_stage);
#undef ADD
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
    HYLA_INFO("serving model %s (%s) on %s, device %s", w->model_name, hyla_model_get_config(w->m)->model_type, w->advertise,
              p->device);
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
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&w->exit_cv, &w->exit_mu, &ts);
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
    hyla_runtime_free(w->rt);
    hyla_model_free(w->m);
    hyla_backend_destroy(w->be);
    free(w);
}
