/* test_rpc_coord.c — hyla-coordinator over real gRPC on loopback, with a real RocksDB.
 *
 * The workers here are test doubles of the Worker service (no model): each serves LoadSession,
 * Unload, DescribeSession, Snapshot, ForkSession, Generate and Append from a table of sessions,
 * registers with the coordinator and heartbeats from its own thread, exactly as hyla-worker
 * does. That isolates the coordinator: membership, the directory, placement, routing, relays,
 * failure handling and restarts (the end-to-end tests with real workers are tests/cluster.cmake).
 *
 * Part 1 runs the coordinator in-process (hyla_coord.h). Part 2 runs the hyla-coordinator
 * binary, kills it with SIGKILL and restarts it on the same data directory.
 * Threading: each fake worker has an rpc server (handlers inline) and a heartbeat thread. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "hyla_api.h"
#include "hyla_coord.h"
#include "hyla_rpc.h"
#include "hyla_test.h"

static void sleep_ms(int ms) {
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

/* ---------------------------------------------------------------------------------------- */
/* a fake worker                                                                             */

typedef struct {
    char id[32];
    uint64_t epoch, position, generated, snap_version;
} fsess;

typedef struct {
    char name[32], model[32];
    uint64_t fingerprint;
    hyla_rpc_server *srv;
    int port;
    hyla_rpc_client *coord;
    char worker_id[64];
    uint64_t epoch;
    pthread_mutex_t mu;
    fsess sess[64];
    int n_sess;
    int loads, unloads, drains, gen_cancelled;
    atomic_int beating, stop, retarget_port, full; /* full: report state memory over budget */
    pthread_t hb;
    uint32_t hb_ms;
} fworker;

static fsess *ffind(fworker *w, const char *id) {
    for (int i = 0; i < w->n_sess; i++)
        if (strcmp(w->sess[i].id, id) == 0)
            return &w->sess[i];
    return NULL;
}

static void fdrop(fworker *w, const char *id) {
    fsess *s = ffind(w, id);
    if (s)
        *s = w->sess[--w->n_sess];
}

static void status_of(const fsess *s, Hyla__V1__WorkerSessionStatus *st) {
    hyla__v1__worker_session_status__init(st);
    st->session_id = (char *)s->id;
    st->tier = HYLA__V1__TIER__TIER_GPU;
    st->position = s->position;
    st->generated = s->generated;
    st->snapshot_version = s->snap_version;
    st->placement_epoch = s->epoch;
}

static void reply_session(hyla_rpc_call *call, const fsess *s) {
    Hyla__V1__WorkerSessionStatus st;
    status_of(s, &st);
    Hyla__V1__WorkerSessionResponse r = HYLA__V1__WORKER_SESSION_RESPONSE__INIT;
    r.session = &st;
    hyla_rpc_call_reply(call, &r.base);
}

static void w_load(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *m, void *ud) {
    if (ev != HYLA_RPC_EV_START)
        return;
    fworker *w = ud;
    const Hyla__V1__LoadSessionRequest *q = (const Hyla__V1__LoadSessionRequest *)m;
    pthread_mutex_lock(&w->mu);
    fsess *s = ffind(w, q->session_id);
    if (!s) {
        s = &w->sess[w->n_sess++];
        memset(s, 0, sizeof *s);
        snprintf(s->id, sizeof s->id, "%s", q->session_id);
    }
    s->epoch = q->placement_epoch;
    s->snap_version = q->snapshot_version;
    /* a restored session resumes at its snapshot's position: 10 tokens per version here */
    s->position = q->snapshot_version * 10;
    w->loads++;
    reply_session(call, s);
    pthread_mutex_unlock(&w->mu);
}

static void w_unload(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *m, void *ud) {
    if (ev != HYLA_RPC_EV_START)
        return;
    fworker *w = ud;
    const Hyla__V1__UnloadRequest *q = (const Hyla__V1__UnloadRequest *)m;
    pthread_mutex_lock(&w->mu);
    fdrop(w, q->session_id);
    w->unloads++;
    pthread_mutex_unlock(&w->mu);
    Hyla__V1__UnloadResponse r = HYLA__V1__UNLOAD_RESPONSE__INIT;
    hyla_rpc_call_reply(call, &r.base);
}

static void w_describe(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *m, void *ud) {
    if (ev != HYLA_RPC_EV_START)
        return;
    fworker *w = ud;
    const Hyla__V1__DescribeSessionRequest *q = (const Hyla__V1__DescribeSessionRequest *)m;
    pthread_mutex_lock(&w->mu);
    fsess *s = ffind(w, q->session_id);
    if (s)
        reply_session(call, s);
    else
        hyla_rpc_call_fail(call, HYLA_RPC_NOT_FOUND, "session %s is not loaded on %s", q->session_id, w->name);
    pthread_mutex_unlock(&w->mu);
}

static void w_snapshot(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *m, void *ud) {
    if (ev != HYLA_RPC_EV_START)
        return;
    fworker *w = ud;
    const Hyla__V1__SnapshotRequest *q = (const Hyla__V1__SnapshotRequest *)m;
    pthread_mutex_lock(&w->mu);
    fsess *s = ffind(w, q->session_id);
    if (!s) {
        hyla_rpc_call_fail(call, HYLA_RPC_NOT_FOUND, "session %s is not loaded", q->session_id);
    } else {
        s->snap_version++;
        s->position = s->snap_version * 10;
        Hyla__V1__SnapshotInfo si = HYLA__V1__SNAPSHOT_INFO__INIT;
        si.version = s->snap_version;
        si.position = s->position;
        si.state_bytes = 4096;
        si.stored_bytes = 1000;
        si.written_bytes = 1000;
        si.chunks = 1;
        Hyla__V1__SnapshotResponse r = HYLA__V1__SNAPSHOT_RESPONSE__INIT;
        r.snapshot = &si;
        hyla_rpc_call_reply(call, &r.base);
    }
    pthread_mutex_unlock(&w->mu);
}

static void w_fork(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *m, void *ud) {
    if (ev != HYLA_RPC_EV_START)
        return;
    fworker *w = ud;
    const Hyla__V1__ForkSessionRequest *q = (const Hyla__V1__ForkSessionRequest *)m;
    pthread_mutex_lock(&w->mu);
    fsess *p = ffind(w, q->session_id);
    if (!p) {
        hyla_rpc_call_fail(call, HYLA_RPC_NOT_FOUND, "session %s is not loaded", q->session_id);
    } else {
        fsess *s = &w->sess[w->n_sess++];
        *s = *p;
        snprintf(s->id, sizeof s->id, "%s", q->new_session_id);
        s->epoch = q->placement_epoch;
        s->snap_version = 0;
        reply_session(call, s);
    }
    pthread_mutex_unlock(&w->mu);
}

typedef struct {
    fworker *w;
    hyla_rpc_call *call;
} slow_gen;

/* A long Generate streamed from a thread until the call is cancelled. */
static void *slow_generate(void *arg) {
    slow_gen *g = arg;
    int32_t tok = 1;
    while (!hyla_rpc_call_cancelled(g->call)) {
        Hyla__V1__GenerateResponse r = HYLA__V1__GENERATE_RESPONSE__INIT;
        r.n_token_ids = 1;
        r.token_ids = &tok;
        if (hyla_rpc_call_send(g->call, &r.base) != HYLA_OK)
            break;
        sleep_ms(5);
    }
    pthread_mutex_lock(&g->w->mu);
    g->w->gen_cancelled++;
    pthread_mutex_unlock(&g->w->mu);
    hyla_rpc_call_fail(g->call, HYLA_RPC_CANCELLED, "cancelled");
    free(g);
    return NULL;
}

static void w_generate(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *m, void *ud) {
    if (ev != HYLA_RPC_EV_START)
        return;
    fworker *w = ud;
    const Hyla__V1__GenerateRequest *q = (const Hyla__V1__GenerateRequest *)m;
    if (q->max_tokens >= 100000) {
        slow_gen *g = calloc(1, sizeof *g);
        g->w = w;
        g->call = call;
        pthread_t t;
        pthread_create(&t, NULL, slow_generate, g);
        pthread_detach(t);
        return;
    }
    pthread_mutex_lock(&w->mu);
    fsess *s = ffind(w, q->session_id);
    if (!s) {
        pthread_mutex_unlock(&w->mu);
        hyla_rpc_call_fail(call, HYLA_RPC_NOT_FOUND, "session %s is not loaded", q->session_id);
        return;
    }
    for (uint32_t i = 0; i < q->max_tokens; i++) {
        int32_t tok = (int32_t)(s->position % 1000);
        s->position++;
        s->generated++;
        Hyla__V1__GenerateResponse r = HYLA__V1__GENERATE_RESPONSE__INIT;
        r.n_token_ids = 1;
        r.token_ids = &tok;
        r.text.data = (uint8_t *)"x";
        r.text.len = 1;
        r.position = s->position;
        if (i + 1 == q->max_tokens) {
            r.done = 1;
            r.finish_reason = HYLA__V1__FINISH_REASON__FINISH_LENGTH;
            r.tokens_delivered = q->max_tokens;
        }
        hyla_rpc_call_send(call, &r.base);
    }
    pthread_mutex_unlock(&w->mu);
    hyla_rpc_call_reply(call, NULL);
}

typedef struct {
    char session[32];
    uint64_t got;
    int failed;
} fappend;

static void w_append(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *m, void *ud) {
    fworker *w = ud;
    fappend *a = hyla_rpc_call_user(call);
    switch (ev) {
    case HYLA_RPC_EV_START:
        hyla_rpc_call_set_user(call, calloc(1, sizeof(fappend)), free);
        break;
    case HYLA_RPC_EV_MESSAGE: {
        const Hyla__V1__AppendRequest *q = (const Hyla__V1__AppendRequest *)m;
        if (a->failed)
            break;
        if (!a->session[0])
            snprintf(a->session, sizeof a->session, "%s", q->session_id);
        pthread_mutex_lock(&w->mu);
        fsess *s = ffind(w, a->session);
        if (!s) {
            pthread_mutex_unlock(&w->mu);
            a->failed = 1;
            hyla_rpc_call_fail(call, HYLA_RPC_NOT_FOUND, "session %s is not loaded", a->session);
            break;
        }
        uint64_t n = q->n_tokens + q->text.len;
        s->position += n;
        a->got += n;
        Hyla__V1__AppendProgress p = HYLA__V1__APPEND_PROGRESS__INIT;
        p.tokens_received = a->got;
        p.tokens_ingested = a->got;
        p.position = s->position;
        pthread_mutex_unlock(&w->mu);
        hyla_rpc_call_send(call, &p.base);
        break;
    }
    case HYLA_RPC_EV_HALF_CLOSE:
        if (!a->failed) {
            Hyla__V1__AppendProgress p = HYLA__V1__APPEND_PROGRESS__INIT;
            p.tokens_received = a->got;
            p.tokens_ingested = a->got;
            p.done = 1;
            a->failed = 1; /* released */
            hyla_rpc_call_send(call, &p.base);
            hyla_rpc_call_reply(call, NULL);
        }
        break;
    case HYLA_RPC_EV_DONE:
        if (!a->failed) {
            a->failed = 1;
            hyla_rpc_call_fail(call, HYLA_RPC_CANCELLED, "cancelled");
        }
        break;
    }
}

static int fw_register(fworker *w) {
    Hyla__V1__RegisterWorkerRequest r = HYLA__V1__REGISTER_WORKER_REQUEST__INIT;
    Hyla__V1__LayerRange lr = HYLA__V1__LAYER_RANGE__INIT;
    Hyla__V1__Device dev = HYLA__V1__DEVICE__INIT;
    lr.begin = 0;
    lr.end = 4;
    dev.name = "cpu";
    dev.description = "test double";
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", w->port);
    r.worker_id = w->name;
    r.address = addr;
    r.model = w->model;
    r.model_fingerprint = w->fingerprint;
    r.num_layers = 4;
    r.layers = &lr;
    r.device = &dev;
    r.version = "test";
    ProtobufCMessage *resp = NULL;
    hyla_rpc_call_opts o = {3000, NULL, NULL, 0};
    if (hyla_rpc_client_unary(w->coord, "/hyla.v1.Coordinator/RegisterWorker", &r.base,
                              &hyla__v1__register_worker_response__descriptor, &resp, &o, NULL) != HYLA_OK)
        return 0;
    Hyla__V1__RegisterWorkerResponse *rr = (Hyla__V1__RegisterWorkerResponse *)resp;
    snprintf(w->worker_id, sizeof w->worker_id, "%s", rr->worker_id);
    w->epoch = rr->epoch;
    w->hb_ms = rr->heartbeat_interval_ms;
    protobuf_c_message_free_unpacked(resp, NULL);
    return 1;
}

static void *fw_heartbeat(void *arg) {
    fworker *w = arg;
    int registered = 0;
    while (!atomic_load(&w->stop)) {
        int rp = atomic_exchange(&w->retarget_port, 0);
        if (rp) { /* only this thread uses w->coord, so only it may replace it */
            hyla_rpc_client_destroy(w->coord);
            char target[64];
            snprintf(target, sizeof target, "127.0.0.1:%d", rp);
            w->coord = NULL;
            CHECK_OK(hyla_rpc_client_create(target, NULL, &w->coord));
            registered = 0;
        }
        if (!atomic_load(&w->beating)) {
            sleep_ms(20);
            continue;
        }
        if (!registered) {
            registered = fw_register(w);
            if (!registered) {
                sleep_ms(50);
                continue;
            }
        }
        Hyla__V1__HeartbeatRequest r = HYLA__V1__HEARTBEAT_REQUEST__INIT;
        Hyla__V1__WorkerLoad load = HYLA__V1__WORKER_LOAD__INIT;
        Hyla__V1__WorkerSessionStatus st[64], *sp[64];
        pthread_mutex_lock(&w->mu);
        for (int i = 0; i < w->n_sess; i++) {
            status_of(&w->sess[i], &st[i]);
            sp[i] = &st[i];
        }
        r.n_sessions = (size_t)w->n_sess;
        load.sessions_gpu = (uint32_t)w->n_sess;
        if (atomic_load(&w->full)) {
            load.state_budget_bytes = 1000;
            load.state_bytes = 2000;
        }
        /* serialize under the lock: the statuses point into the table */
        r.worker_id = w->worker_id;
        r.epoch = w->epoch;
        r.load = &load;
        r.sessions = sp;
        size_t n = protobuf_c_message_get_packed_size(&r.base);
        uint8_t *buf = malloc(n + 1);
        protobuf_c_message_pack(&r.base, buf);
        pthread_mutex_unlock(&w->mu);
        Hyla__V1__HeartbeatRequest *copy = hyla__v1__heartbeat_request__unpack(NULL, n, buf);
        free(buf);
        ProtobufCMessage *resp = NULL;
        hyla_rpc_call_opts o = {2000, NULL, NULL, 0};
        if (hyla_rpc_client_unary(w->coord, "/hyla.v1.Coordinator/Heartbeat", &copy->base,
                                  &hyla__v1__heartbeat_response__descriptor, &resp, &o, NULL) == HYLA_OK) {
            Hyla__V1__HeartbeatResponse *hr = (Hyla__V1__HeartbeatResponse *)resp;
            if (hr->reregister)
                registered = 0;
            pthread_mutex_lock(&w->mu);
            for (size_t i = 0; i < hr->n_unload_session_ids; i++)
                fdrop(w, hr->unload_session_ids[i]);
            if (hr->drain) { /* a drained worker snapshots and hands everything back */
                w->drains++;
                w->n_sess = 0;
            }
            pthread_mutex_unlock(&w->mu);
            protobuf_c_message_free_unpacked(resp, NULL);
        }
        hyla__v1__heartbeat_request__free_unpacked(copy, NULL);
        sleep_ms((int)(w->hb_ms ? w->hb_ms : 100));
    }
    return NULL;
}

static fworker *fw_start(const char *name, const char *model, int coord_port) {
    fworker *w = calloc(1, sizeof *w);
    snprintf(w->name, sizeof w->name, "%s", name);
    snprintf(w->model, sizeof w->model, "%s", model);
    w->fingerprint = 0x1234;
    pthread_mutex_init(&w->mu, NULL);
    CHECK_OK(hyla_rpc_server_create(NULL, &w->srv));
#define W(n, k, i, o, f) \
    CHECK_OK(hyla_rpc_server_add_method(w->srv, "/hyla.v1.Worker/" n, k, &i, &o, f, w))
    W("LoadSession", HYLA_RPC_UNARY, hyla__v1__load_session_request__descriptor, hyla__v1__worker_session_response__descriptor, w_load);
    W("Unload", HYLA_RPC_UNARY, hyla__v1__unload_request__descriptor, hyla__v1__unload_response__descriptor, w_unload);
    W("DescribeSession", HYLA_RPC_UNARY, hyla__v1__describe_session_request__descriptor, hyla__v1__worker_session_response__descriptor, w_describe);
    W("Snapshot", HYLA_RPC_UNARY, hyla__v1__snapshot_request__descriptor, hyla__v1__snapshot_response__descriptor, w_snapshot);
    W("ForkSession", HYLA_RPC_UNARY, hyla__v1__fork_session_request__descriptor, hyla__v1__worker_session_response__descriptor, w_fork);
    W("Generate", HYLA_RPC_SERVER_STREAM, hyla__v1__generate_request__descriptor, hyla__v1__generate_response__descriptor, w_generate);
    W("Append", HYLA_RPC_BIDI, hyla__v1__append_request__descriptor, hyla__v1__append_progress__descriptor, w_append);
#undef W
    CHECK_OK(hyla_rpc_server_listen(w->srv, "127.0.0.1:0", &w->port));
    CHECK_OK(hyla_rpc_server_start(w->srv));
    char target[64];
    snprintf(target, sizeof target, "127.0.0.1:%d", coord_port);
    CHECK_OK(hyla_rpc_client_create(target, NULL, &w->coord));
    atomic_store(&w->beating, 1);
    pthread_create(&w->hb, NULL, fw_heartbeat, w);
    return w;
}

/* Point the worker at another coordinator port (after a coordinator restart). */
static void fw_retarget(fworker *w, int coord_port) { atomic_store(&w->retarget_port, coord_port); }

static void fw_stop(fworker *w) {
    atomic_store(&w->stop, 1);
    pthread_join(w->hb, NULL);
    hyla_rpc_server_destroy(w->srv);
    hyla_rpc_client_destroy(w->coord);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

static int fw_holds(fworker *w, const char *id) {
    pthread_mutex_lock(&w->mu);
    int h = ffind(w, id) != NULL;
    pthread_mutex_unlock(&w->mu);
    return h;
}

/* ---------------------------------------------------------------------------------------- */
/* client helpers                                                                            */

static hyla_rpc_client *g_cl;

static hyla_status call(const char *method, const ProtobufCMessage *req, const ProtobufCMessageDescriptor *rd,
                        ProtobufCMessage **resp, const char *tenant, hyla_rpc_result *res) {
    hyla_rpc_call_opts o = {10000, tenant, NULL, 0};
    return hyla_rpc_client_unary(g_cl, method, req, rd, resp, &o, res);
}

static Hyla__V1__Session *create(const char *tenant, const char *model, const char *hint, hyla_rpc_result *res) {
    Hyla__V1__CreateSessionRequest q = HYLA__V1__CREATE_SESSION_REQUEST__INIT;
    q.model = (char *)model;
    q.worker_hint = (char *)hint;
    q.seed = 7;
    ProtobufCMessage *m = NULL;
    call("/hyla.v1.Sessions/CreateSession", &q.base, &hyla__v1__session__descriptor, &m, tenant, res);
    return (Hyla__V1__Session *)m;
}

static Hyla__V1__Session *get(const char *tenant, const char *id, hyla_rpc_result *res) {
    Hyla__V1__GetSessionRequest q = HYLA__V1__GET_SESSION_REQUEST__INIT;
    q.session_id = (char *)id;
    ProtobufCMessage *m = NULL;
    call("/hyla.v1.Sessions/GetSession", &q.base, &hyla__v1__session__descriptor, &m, tenant, res);
    return (Hyla__V1__Session *)m;
}

static Hyla__V1__ListWorkersResponse *list_workers(void) {
    Hyla__V1__ListWorkersRequest q = HYLA__V1__LIST_WORKERS_REQUEST__INIT;
    ProtobufCMessage *m = NULL;
    CHECK_OK(call("/hyla.v1.Cluster/ListWorkers", &q.base, &hyla__v1__list_workers_response__descriptor, &m, NULL, NULL));
    return (Hyla__V1__ListWorkersResponse *)m;
}

static int worker_state(const char *id) {
    Hyla__V1__ListWorkersResponse *r = list_workers();
    int st = -1;
    for (size_t i = 0; r && i < r->n_workers; i++)
        if (strcmp(r->workers[i]->worker_id, id) == 0)
            st = r->workers[i]->state;
    if (r)
        protobuf_c_message_free_unpacked(&r->base, NULL);
    return st;
}

static int wait_worker_state(const char *id, int state, int ms) {
    for (int t = 0; t < ms; t += 50) {
        if (worker_state(id) == state)
            return 1;
        sleep_ms(50);
    }
    return 0;
}

static int session_state(const char *tenant, const char *id) {
    Hyla__V1__Session *s = get(tenant, id, NULL);
    int st = s ? (int)s->state : -1;
    if (s)
        protobuf_c_message_free_unpacked(&s->base, NULL);
    return st;
}

/* Generate n tokens; returns tokens received (-1 on failure). */
static int generate(const char *tenant, const char *id, uint32_t n, hyla_rpc_result *res) {
    hyla_rpc_call_opts o = {10000, tenant, NULL, 0};
    hyla_rpc_stream *s = NULL;
    CHECK_OK(hyla_rpc_stream_open(g_cl, "/hyla.v1.Sessions/Generate", &hyla__v1__generate_response__descriptor, &o, &s));
    Hyla__V1__GenerateRequest q = HYLA__V1__GENERATE_REQUEST__INIT;
    q.session_id = (char *)id;
    q.max_tokens = n;
    CHECK_OK(hyla_rpc_stream_write(s, &q.base));
    CHECK_OK(hyla_rpc_stream_close_send(s));
    int got = 0, done = 0;
    for (;;) {
        ProtobufCMessage *m = NULL;
        if (hyla_rpc_stream_read(s, &m) != HYLA_OK || !m)
            break;
        Hyla__V1__GenerateResponse *g = (Hyla__V1__GenerateResponse *)m;
        got += (int)g->n_token_ids;
        if (g->done)
            done = g->tokens_delivered == n && g->finish_reason == HYLA__V1__FINISH_REASON__FINISH_LENGTH;
        protobuf_c_message_free_unpacked(m, NULL);
    }
    hyla_status st = hyla_rpc_stream_finish(s, res);
    hyla_rpc_stream_destroy(s);
    return st == HYLA_OK && done ? got : -1;
}

/* ---------------------------------------------------------------------------------------- */
/* part 1: in-process coordinator                                                            */

static hyla_coord *start_coord(const char *dir) {
    hyla_coord_params p = hyla_coord_default_params();
    p.listen = "127.0.0.1:0";
    p.data_dir = dir;
    p.heartbeat_ms = 100;
    p.dead_after_ms = 1500; /* generous: a loaded CI machine may stall a heartbeat thread */
    p.worker_timeout_ms = 5000;
    hyla_coord *c = NULL;
    CHECK_OK(hyla_coord_start(&p, &c));
    if (!c)
        exit(1);
    return c;
}

static void connect_to(int port) {
    char target[64];
    snprintf(target, sizeof target, "127.0.0.1:%d", port);
    hyla_rpc_client_destroy(g_cl);
    g_cl = NULL;
    CHECK_OK(hyla_rpc_client_create(target, NULL, &g_cl));
}

static void test_in_process(const char *dir) {
    hyla_coord *c = start_coord(dir);
    int port = hyla_coord_port(c);
    connect_to(port);
    hyla_rpc_result res;

    /* no worker yet */
    Hyla__V1__Session *s = create("acme", "", NULL, &res);
    CHECK(s == NULL && res.code == HYLA_RPC_UNAVAILABLE);
    s = create("acme", "tiny", NULL, &res);
    CHECK(s == NULL && res.code == HYLA_RPC_NOT_FOUND && strstr(res.message, "tiny"));

    fworker *wa = fw_start("wa", "tiny", port), *wb = fw_start("wb", "tiny", port);
    CHECK(wait_worker_state("wa", HYLA__V1__WORKER_STATE__WORKER_READY, 6000));
    CHECK(wait_worker_state("wb", HYLA__V1__WORKER_STATE__WORKER_READY, 6000));
    Hyla__V1__ListWorkersResponse *lw = list_workers();
    CHECK(lw && lw->n_workers == 2 && lw->n_groups == 2);
    for (size_t i = 0; lw && i < lw->n_groups; i++)
        CHECK(lw->groups[i]->complete && lw->groups[i]->n_worker_ids == 1);
    if (lw)
        protobuf_c_message_free_unpacked(&lw->base, NULL);

    /* a worker of the same model with another fingerprint is refused */
    {
        hyla_rpc_client *cc = NULL;
        char target[64];
        snprintf(target, sizeof target, "127.0.0.1:%d", port);
        CHECK_OK(hyla_rpc_client_create(target, NULL, &cc));
        Hyla__V1__RegisterWorkerRequest r = HYLA__V1__REGISTER_WORKER_REQUEST__INIT;
        r.worker_id = "wz";
        r.address = "127.0.0.1:1";
        r.model = "tiny";
        r.model_fingerprint = 0x9999;
        r.num_layers = 4;
        ProtobufCMessage *m = NULL;
        CHECK(hyla_rpc_client_unary(cc, "/hyla.v1.Coordinator/RegisterWorker", &r.base,
                                    &hyla__v1__register_worker_response__descriptor, &m, NULL, &res) != HYLA_OK);
        CHECK(res.code == HYLA_RPC_FAILED_PRECONDITION);
        r.model_fingerprint = 0x1234;
        r.num_layers = 0;
        CHECK(hyla_rpc_client_unary(cc, "/hyla.v1.Coordinator/RegisterWorker", &r.base,
                                    &hyla__v1__register_worker_response__descriptor, &m, NULL, &res) != HYLA_OK);
        CHECK(res.code == HYLA_RPC_INVALID_ARGUMENT && strstr(res.message, "layers"));
        Hyla__V1__HeartbeatRequest h = HYLA__V1__HEARTBEAT_REQUEST__INIT;
        h.worker_id = "nobody";
        CHECK_OK(hyla_rpc_client_unary(cc, "/hyla.v1.Coordinator/Heartbeat", &h.base,
                                       &hyla__v1__heartbeat_response__descriptor, &m, NULL, &res));
        CHECK(m && ((Hyla__V1__HeartbeatResponse *)m)->reregister);
        if (m)
            protobuf_c_message_free_unpacked(m, NULL);
        hyla_rpc_client_destroy(cc);
    }

    /* placement: least loaded, alternating */
    char ids[4][32];
    int on_a = 0, on_b = 0;
    for (int i = 0; i < 4; i++) {
        s = create("acme", "", NULL, &res);
        CHECK_MSG(s != NULL, "create: %s %s", hyla_rpc_code_name(res.code), res.message);
        if (!s)
            continue;
        snprintf(ids[i], sizeof ids[i], "%s", s->session_id);
        CHECK(strncmp(s->session_id, "s-", 2) == 0 && strlen(s->session_id) == 18);
        CHECK(s->state == HYLA__V1__SESSION_STATE__SESSION_ACTIVE && strcmp(s->tenant, "acme") == 0);
        CHECK(strcmp(s->model, "tiny") == 0 && s->n_worker_ids == 1 && s->sampling);
        if (s->n_worker_ids == 1) {
            on_a += strcmp(s->worker_ids[0], "wa") == 0;
            on_b += strcmp(s->worker_ids[0], "wb") == 0;
        }
        protobuf_c_message_free_unpacked(&s->base, NULL);
    }
    CHECK_MSG(on_a == 2 && on_b == 2, "placement %d/%d", on_a, on_b);
    /* hint */
    s = create("acme", "tiny", "wb", &res);
    CHECK(s && s->n_worker_ids == 1 && strcmp(s->worker_ids[0], "wb") == 0);
    char hinted[32];
    snprintf(hinted, sizeof hinted, "%s", s ? s->session_id : "");
    if (s)
        protobuf_c_message_free_unpacked(&s->base, NULL);
    s = create("acme", "tiny", "nope", &res);
    CHECK(!s && res.code == HYLA_RPC_NOT_FOUND);
    /* bad sampling */
    {
        Hyla__V1__CreateSessionRequest q = HYLA__V1__CREATE_SESSION_REQUEST__INIT;
        Hyla__V1__SamplingParams sp = HYLA__V1__SAMPLING_PARAMS__INIT;
        sp.top_p = 2.0f;
        q.sampling = &sp;
        ProtobufCMessage *m = NULL;
        CHECK(call("/hyla.v1.Sessions/CreateSession", &q.base, &hyla__v1__session__descriptor, &m, "acme", &res) !=
              HYLA_OK);
        CHECK(res.code == HYLA_RPC_INVALID_ARGUMENT && strstr(res.message, "top_p"));
    }

    /* tenants */
    s = get("other", ids[0], &res);
    CHECK(!s && res.code == HYLA_RPC_PERMISSION_DENIED);
    s = get("acme", "s-0000000000000000", &res);
    CHECK(!s && res.code == HYLA_RPC_NOT_FOUND);
    s = get("acme", "", &res);
    CHECK(!s && res.code == HYLA_RPC_INVALID_ARGUMENT && strstr(res.message, "session_id"));
    s = get("bad tenant", ids[0], &res);
    CHECK(!s && res.code == HYLA_RPC_INVALID_ARGUMENT && strstr(res.message, "x-hyla-tenant"));
    s = get(NULL, ids[0], &res); /* no metadata: tenant "default" */
    CHECK(!s && res.code == HYLA_RPC_PERMISSION_DENIED);
    /* the handlers that acquire a session (Pause, Resume, Migrate, DeleteSession): a missing id,
     * an unknown one and another tenant's are refused with the reason, and nothing changes */
    {
        const char *bad[3] = {"", "s-0000000000000000", ids[0]};
        const char *who[3] = {"acme", "acme", "other"};
        const hyla_rpc_code want[3] = {HYLA_RPC_INVALID_ARGUMENT, HYLA_RPC_NOT_FOUND, HYLA_RPC_PERMISSION_DENIED};
        const char *says[3] = {"session_id", "not found", "another tenant"};
        for (int k = 0; k < 3; k++) {
            Hyla__V1__PauseRequest pq = HYLA__V1__PAUSE_REQUEST__INIT;
            Hyla__V1__ResumeRequest rq = HYLA__V1__RESUME_REQUEST__INIT;
            Hyla__V1__MigrateRequest mq = HYLA__V1__MIGRATE_REQUEST__INIT;
            Hyla__V1__DeleteSessionRequest dq = HYLA__V1__DELETE_SESSION_REQUEST__INIT;
            pq.session_id = rq.session_id = mq.session_id = dq.session_id = (char *)bad[k];
            const struct {
                const char *method;
                ProtobufCMessage *q;
                const ProtobufCMessageDescriptor *rd;
            } calls[4] = {{"/hyla.v1.Sessions/Pause", &pq.base, &hyla__v1__pause_response__descriptor},
                          {"/hyla.v1.Sessions/Resume", &rq.base, &hyla__v1__session__descriptor},
                          {"/hyla.v1.Sessions/Migrate", &mq.base, &hyla__v1__migrate_response__descriptor},
                          {"/hyla.v1.Sessions/DeleteSession", &dq.base, &hyla__v1__delete_session_response__descriptor}};
            for (int x = 0; x < 4; x++) {
                ProtobufCMessage *m = NULL;
                CHECK_MSG(call(calls[x].method, calls[x].q, calls[x].rd, &m, who[k], &res) != HYLA_OK &&
                              res.code == want[k] && strstr(res.message, says[k]),
                          "%s with session_id '%s' as %s: code %d, '%s'", calls[x].method, bad[k], who[k], (int)res.code,
                          res.message);
                if (m)
                    protobuf_c_message_free_unpacked(m, NULL);
            }
        }
        CHECK(session_state("acme", ids[0]) >= 0); /* still there */
    }

    /* listing with pages */
    {
        Hyla__V1__ListSessionsRequest q = HYLA__V1__LIST_SESSIONS_REQUEST__INIT;
        q.page_size = 3;
        ProtobufCMessage *m = NULL;
        CHECK_OK(call("/hyla.v1.Sessions/ListSessions", &q.base, &hyla__v1__list_sessions_response__descriptor, &m,
                      "acme", NULL));
        Hyla__V1__ListSessionsResponse *l = (Hyla__V1__ListSessionsResponse *)m;
        CHECK(l && l->n_sessions == 3 && l->next_page_token[0]);
        char tok[64] = "";
        if (l)
            snprintf(tok, sizeof tok, "%s", l->next_page_token);
        int sorted = l && strcmp(l->sessions[0]->session_id, l->sessions[1]->session_id) < 0;
        CHECK(sorted);
        if (m)
            protobuf_c_message_free_unpacked(m, NULL);
        q.page_token = tok;
        CHECK_OK(call("/hyla.v1.Sessions/ListSessions", &q.base, &hyla__v1__list_sessions_response__descriptor, &m,
                      "acme", NULL));
        l = (Hyla__V1__ListSessionsResponse *)m;
        CHECK(l && l->n_sessions == 2 && !l->next_page_token[0]);
        if (m)
            protobuf_c_message_free_unpacked(m, NULL);
        CHECK_OK(call("/hyla.v1.Sessions/ListSessions", &q.base, &hyla__v1__list_sessions_response__descriptor, &m,
                      "other", NULL));
        l = (Hyla__V1__ListSessionsResponse *)m;
        CHECK(l && l->n_sessions == 0);
        if (m)
            protobuf_c_message_free_unpacked(m, NULL);
        q.page_token = "garbage";
        CHECK(call("/hyla.v1.Sessions/ListSessions", &q.base, &hyla__v1__list_sessions_response__descriptor, &m,
                   "acme", &res) != HYLA_OK && res.code == HYLA_RPC_INVALID_ARGUMENT);
        q.page_token = "";
        q.page_size = 5000;
        CHECK(call("/hyla.v1.Sessions/ListSessions", &q.base, &hyla__v1__list_sessions_response__descriptor, &m,
                   "acme", &res) != HYLA_OK && res.code == HYLA_RPC_INVALID_ARGUMENT);
    }

    /* Generate and Append through the coordinator */
    CHECK(generate("acme", ids[0], 5, &res) == 5);
    CHECK(generate("other", ids[0], 5, &res) == -1 && res.code == HYLA_RPC_PERMISSION_DENIED);
    CHECK(generate("acme", ids[0], 0, &res) == -1 && res.code == HYLA_RPC_INVALID_ARGUMENT);
    {
        hyla_rpc_call_opts o = {10000, "acme", NULL, 0};
        hyla_rpc_stream *st = NULL;
        CHECK_OK(hyla_rpc_stream_open(g_cl, "/hyla.v1.Sessions/Append", &hyla__v1__append_progress__descriptor, &o, &st));
        int32_t toks[16];
        for (int i = 0; i < 16; i++)
            toks[i] = i;
        for (int k = 0; k < 40; k++) {
            Hyla__V1__AppendRequest q = HYLA__V1__APPEND_REQUEST__INIT;
            q.session_id = k == 0 ? ids[1] : "";
            q.n_tokens = 16;
            q.tokens = toks;
            CHECK_OK(hyla_rpc_stream_write(st, &q.base));
        }
        CHECK_OK(hyla_rpc_stream_close_send(st));
        uint64_t last = 0;
        int done = 0, msgs = 0;
        for (;;) {
            ProtobufCMessage *m = NULL;
            if (hyla_rpc_stream_read(st, &m) != HYLA_OK || !m)
                break;
            Hyla__V1__AppendProgress *p = (Hyla__V1__AppendProgress *)m;
            last = p->tokens_ingested;
            done |= p->done;
            msgs++;
            protobuf_c_message_free_unpacked(m, NULL);
        }
        CHECK_OK(hyla_rpc_stream_finish(st, &res));
        CHECK_MSG(last == 640 && done && msgs == 41, "append: %llu tokens, done %d, %d messages",
                  (unsigned long long)last, done, msgs);
        hyla_rpc_stream_destroy(st);
        /* an Append whose first message names no session */
        CHECK_OK(hyla_rpc_stream_open(g_cl, "/hyla.v1.Sessions/Append", &hyla__v1__append_progress__descriptor, &o, &st));
        Hyla__V1__AppendRequest q = HYLA__V1__APPEND_REQUEST__INIT;
        CHECK_OK(hyla_rpc_stream_write(st, &q.base));
        CHECK(hyla_rpc_stream_finish(st, &res) != HYLA_OK && res.code == HYLA_RPC_INVALID_ARGUMENT);
        hyla_rpc_stream_destroy(st);
    }

    /* a client cancel reaches the worker through the coordinator */
    {
        hyla_rpc_call_opts o = {10000, "acme", NULL, 0};
        hyla_rpc_stream *st = NULL;
        CHECK_OK(hyla_rpc_stream_open(g_cl, "/hyla.v1.Sessions/Generate", &hyla__v1__generate_response__descriptor, &o, &st));
        Hyla__V1__GenerateRequest q = HYLA__V1__GENERATE_REQUEST__INIT;
        q.session_id = ids[0];
        q.max_tokens = 1000000;
        CHECK_OK(hyla_rpc_stream_write(st, &q.base));
        CHECK_OK(hyla_rpc_stream_close_send(st));
        for (int k = 0; k < 3; k++) {
            ProtobufCMessage *m = NULL;
            CHECK_OK(hyla_rpc_stream_read(st, &m));
            if (m)
                protobuf_c_message_free_unpacked(m, NULL);
        }
        hyla_rpc_stream_cancel(st);
        CHECK(hyla_rpc_stream_finish(st, &res) == HYLA_ERR_CANCELLED);
        hyla_rpc_stream_destroy(st);
        int seen = 0;
        for (int t = 0; t < 100 && !seen; t++) {
            pthread_mutex_lock(&wa->mu);
            seen = wa->gen_cancelled + 0;
            pthread_mutex_unlock(&wa->mu);
            pthread_mutex_lock(&wb->mu);
            seen += wb->gen_cancelled;
            pthread_mutex_unlock(&wb->mu);
            if (!seen)
                sleep_ms(20);
        }
        CHECK_MSG(seen == 1, "the worker did not see the client's cancel");
    }

    /* Pause (evict) and Resume */
    {
        Hyla__V1__PauseRequest q = HYLA__V1__PAUSE_REQUEST__INIT;
        q.session_id = ids[2];
        q.evict = 1;
        ProtobufCMessage *m = NULL;
        CHECK_OK(call("/hyla.v1.Sessions/Pause", &q.base, &hyla__v1__pause_response__descriptor, &m, "acme", &res));
        Hyla__V1__PauseResponse *p = (Hyla__V1__PauseResponse *)m;
        CHECK(p && p->snapshot && p->snapshot->version == 1 && p->snapshot->state_bytes == 4096);
        CHECK(p && p->session && p->session->state == HYLA__V1__SESSION_STATE__SESSION_PAUSED &&
              p->session->tier == HYLA__V1__TIER__TIER_STORE && p->session->n_worker_ids == 0);
        if (m)
            protobuf_c_message_free_unpacked(m, NULL);
        CHECK(!fw_holds(wa, ids[2]) && !fw_holds(wb, ids[2]));
        Hyla__V1__ResumeRequest r = HYLA__V1__RESUME_REQUEST__INIT;
        r.session_id = ids[2];
        r.worker_hint = "wa";
        CHECK_OK(call("/hyla.v1.Sessions/Resume", &r.base, &hyla__v1__session__descriptor, &m, "acme", &res));
        s = (Hyla__V1__Session *)m;
        CHECK(s && s->state == HYLA__V1__SESSION_STATE__SESSION_ACTIVE && s->position == 10 &&
              s->last_snapshot && s->last_snapshot->version == 1);
        if (m)
            protobuf_c_message_free_unpacked(m, NULL);
        CHECK(fw_holds(wa, ids[2]));
    }

    /* Migrate to the other worker, then to "any other" */
    {
        Hyla__V1__MigrateRequest q = HYLA__V1__MIGRATE_REQUEST__INIT;
        q.session_id = ids[2];
        q.to_worker = "wb";
        ProtobufCMessage *m = NULL;
        CHECK_OK(call("/hyla.v1.Sessions/Migrate", &q.base, &hyla__v1__migrate_response__descriptor, &m, "acme", &res));
        Hyla__V1__MigrateResponse *r = (Hyla__V1__MigrateResponse *)m;
        CHECK(r && strcmp(r->from_group_id, "g-wa") == 0 && r->session && strcmp(r->session->group_id, "g-wb") == 0);
        CHECK(r && r->snapshot && r->snapshot->version == 2);
        if (m)
            protobuf_c_message_free_unpacked(m, NULL);
        CHECK(fw_holds(wb, ids[2]) && !fw_holds(wa, ids[2]));
        q.to_worker = "wb";
        CHECK(call("/hyla.v1.Sessions/Migrate", &q.base, &hyla__v1__migrate_response__descriptor, &m, "acme", &res) !=
                  HYLA_OK &&
              res.code == HYLA_RPC_INVALID_ARGUMENT);
        q.to_worker = "";
        CHECK_OK(call("/hyla.v1.Sessions/Migrate", &q.base, &hyla__v1__migrate_response__descriptor, &m, "acme", &res));
        r = (Hyla__V1__MigrateResponse *)m;
        CHECK(r && r->session && strcmp(r->session->group_id, "g-wa") == 0);
        if (m)
            protobuf_c_message_free_unpacked(m, NULL);
    }

    /* Fork */
    char forked[32] = "";
    {
        Hyla__V1__ForkRequest q = HYLA__V1__FORK_REQUEST__INIT;
        q.session_id = ids[0];
        ProtobufCMessage *m = NULL;
        CHECK_OK(call("/hyla.v1.Sessions/Fork", &q.base, &hyla__v1__session__descriptor, &m, "acme", &res));
        s = (Hyla__V1__Session *)m;
        CHECK(s && strcmp(s->parent_session_id, ids[0]) == 0 && strcmp(s->session_id, ids[0]) != 0 &&
              s->state == HYLA__V1__SESSION_STATE__SESSION_ACTIVE);
        if (s)
            snprintf(forked, sizeof forked, "%s", s->session_id);
        if (m)
            protobuf_c_message_free_unpacked(m, NULL);
        CHECK(generate("acme", forked, 3, &res) == 3);
    }

    /* DeleteSession */
    {
        Hyla__V1__DeleteSessionRequest q = HYLA__V1__DELETE_SESSION_REQUEST__INIT;
        q.session_id = forked;
        ProtobufCMessage *m = NULL;
        CHECK(call("/hyla.v1.Sessions/DeleteSession", &q.base, &hyla__v1__delete_session_response__descriptor, &m,
                   "other", &res) != HYLA_OK &&
              res.code == HYLA_RPC_PERMISSION_DENIED);
        CHECK_OK(call("/hyla.v1.Sessions/DeleteSession", &q.base, &hyla__v1__delete_session_response__descriptor, &m,
                      "acme", &res));
        if (m)
            protobuf_c_message_free_unpacked(m, NULL);
        CHECK(session_state("acme", forked) == -1);
        CHECK(!fw_holds(wa, forked) && !fw_holds(wb, forked));
    }

    /* Cluster: sessions by tier */
    {
        Hyla__V1__ListClusterSessionsRequest q = HYLA__V1__LIST_CLUSTER_SESSIONS_REQUEST__INIT;
        ProtobufCMessage *m = NULL;
        CHECK_OK(call("/hyla.v1.Cluster/ListClusterSessions", &q.base,
                      &hyla__v1__list_cluster_sessions_response__descriptor, &m, NULL, &res));
        Hyla__V1__ListClusterSessionsResponse *l = (Hyla__V1__ListClusterSessionsResponse *)m;
        CHECK(l && l->n_sessions == 5 && l->sessions_gpu == 5 && l->sessions_store == 0);
        if (m)
            protobuf_c_message_free_unpacked(m, NULL);
        q.worker_id = "wb";
        CHECK_OK(call("/hyla.v1.Cluster/ListClusterSessions", &q.base,
                      &hyla__v1__list_cluster_sessions_response__descriptor, &m, NULL, &res));
        l = (Hyla__V1__ListClusterSessionsResponse *)m;
        for (size_t i = 0; l && i < l->n_sessions; i++)
            CHECK(strcmp(l->sessions[i]->group_id, "g-wb") == 0);
        if (m)
            protobuf_c_message_free_unpacked(m, NULL);
        q.worker_id = "nobody";
        CHECK(call("/hyla.v1.Cluster/ListClusterSessions", &q.base, &hyla__v1__list_cluster_sessions_response__descriptor,
                   &m, NULL, &res) != HYLA_OK &&
              res.code == HYLA_RPC_NOT_FOUND);
    }

    /* a worker stops heartbeating: dead, its sessions go back to the store, and the next
     * Generate places them on the other worker */
    atomic_store(&wa->beating, 0);
    CHECK(wait_worker_state("wa", HYLA__V1__WORKER_STATE__WORKER_DEAD, 6000));
    char on_a_id[32] = "";
    for (int i = 0; i < 4; i++) {
        int tries = 0;
        Hyla__V1__Session *x = NULL;
        while (tries++ < 40) { /* the monitor unplaces within a period */
            x = get("acme", ids[i], NULL);
            if (x && x->state != HYLA__V1__SESSION_STATE__SESSION_ACTIVE)
                break;
            if (x && strcmp(x->group_id, "g-wa") != 0)
                break;
            if (x)
                protobuf_c_message_free_unpacked(&x->base, NULL);
            x = NULL;
            sleep_ms(50);
        }
        if (x) {
            if (x->state == HYLA__V1__SESSION_STATE__SESSION_PAUSED)
                snprintf(on_a_id, sizeof on_a_id, "%s", x->session_id);
            protobuf_c_message_free_unpacked(&x->base, NULL);
        }
    }
    CHECK_MSG(on_a_id[0], "no session left the dead worker");
    if (on_a_id[0]) {
        CHECK(generate("acme", on_a_id, 4, &res) == 4);
        CHECK(fw_holds(wb, on_a_id));
        s = get("acme", on_a_id, NULL);
        CHECK(s && strcmp(s->group_id, "g-wb") == 0);
        if (s)
            protobuf_c_message_free_unpacked(&s->base, NULL);
    }
    /* the dead worker comes back: it re-registers and is told to drop stale sessions */
    atomic_store(&wa->beating, 1);
    CHECK(wait_worker_state("wa", HYLA__V1__WORKER_STATE__WORKER_READY, 6000));
    sleep_ms(400);
    if (on_a_id[0])
        CHECK(!fw_holds(wa, on_a_id));

    /* drain wb: the coordinator tells it; it hands its sessions back */
    {
        Hyla__V1__DrainWorkerRequest q = HYLA__V1__DRAIN_WORKER_REQUEST__INIT;
        q.worker_id = "wb";
        q.wait = 1;
        ProtobufCMessage *m = NULL;
        CHECK_OK(call("/hyla.v1.Cluster/DrainWorker", &q.base, &hyla__v1__drain_worker_response__descriptor, &m, NULL,
                      &res));
        Hyla__V1__DrainWorkerResponse *r = (Hyla__V1__DrainWorkerResponse *)m;
        CHECK(r && r->worker && r->worker->state == HYLA__V1__WORKER_STATE__WORKER_DRAINED && r->sessions_remaining == 0);
        CHECK(r && r->sessions_moved >= 1);
        if (m)
            protobuf_c_message_free_unpacked(m, NULL);
        pthread_mutex_lock(&wb->mu);
        CHECK(wb->drains > 0);
        pthread_mutex_unlock(&wb->mu);
        s = create("acme", "", "wb", &res); /* the hint cannot serve: any other group */
        CHECK(s && s->n_worker_ids == 1 && strcmp(s->worker_ids[0], "wa") == 0);
        if (s)
            protobuf_c_message_free_unpacked(&s->base, NULL);
        q.worker_id = "nobody";
        CHECK(call("/hyla.v1.Cluster/DrainWorker", &q.base, &hyla__v1__drain_worker_response__descriptor, &m, NULL,
                   &res) != HYLA_OK &&
              res.code == HYLA_RPC_NOT_FOUND);
    }

    /* restart the coordinator on the same directory: nothing lost */
    hyla_coord_destroy(c);
    c = start_coord(dir);
    port = hyla_coord_port(c);
    connect_to(port);
    for (int i = 0; i < 4; i++) {
        s = get("acme", ids[i], &res);
        CHECK_MSG(s != NULL, "after restart %s: %s", ids[i], res.message);
        if (s)
            protobuf_c_message_free_unpacked(&s->base, NULL);
    }
    s = get("acme", hinted, &res);
    CHECK(s != NULL);
    if (s)
        protobuf_c_message_free_unpacked(&s->base, NULL);
    CHECK(session_state("acme", forked) == -1); /* deleted stays deleted */
    fw_retarget(wa, port);
    fw_retarget(wb, port);
    CHECK(wait_worker_state("wa", HYLA__V1__WORKER_STATE__WORKER_READY, 6000));
    CHECK(generate("acme", ids[1], 2, &res) == 2);

    /* placement prefers groups with state memory to spare: w0 and w1 hold no session and w0
     * sorts first, but w0 (and wb) report their state budgets used up, so new sessions go to w1 */
    {
        fworker *w0 = fw_start("w0", "tiny", port), *w1 = fw_start("w1", "tiny", port);
        atomic_store(&w0->full, 1);
        atomic_store(&wb->full, 1);
        CHECK(wait_worker_state("w0", HYLA__V1__WORKER_STATE__WORKER_READY, 6000));
        CHECK(wait_worker_state("w1", HYLA__V1__WORKER_STATE__WORKER_READY, 6000));
        sleep_ms(500); /* a few heartbeats carry the loads */
        s = create("acme", "", NULL, &res);
        CHECK_MSG(s && s->n_worker_ids == 1 && strcmp(s->worker_ids[0], "w1") == 0, "placed on %s, want w1 (w0 is full)",
                  s && s->n_worker_ids ? s->worker_ids[0] : "?");
        if (s)
            protobuf_c_message_free_unpacked(&s->base, NULL);
        atomic_store(&wb->full, 0);
        fw_stop(w0);
        fw_stop(w1);
    }

    fw_stop(wa);
    fw_stop(wb);
    hyla_coord_destroy(c);
    hyla_rpc_client_destroy(g_cl);
    g_cl = NULL;
}

/* ---------------------------------------------------------------------------------------- */
/* part 2: the binary, killed and restarted                                                  */

static pid_t spawn_coord(const char *bin, const char *dir, const char *port_file) {
    unlink(port_file);
    pid_t pid = fork();
    if (pid == 0) {
        execl(bin, bin, "--listen", "127.0.0.1:0", "--data", dir, "--port-file", port_file, "--heartbeat-ms", "100",
              "--dead-after-ms", "1500", "--log", "warn", (char *)NULL);
        _exit(127);
    }
    return pid;
}

static int read_port(const char *port_file) {
    for (int t = 0; t < 200; t++) {
        FILE *f = fopen(port_file, "r");
        int port = 0;
        if (f) {
            if (fscanf(f, "%d", &port) != 1)
                port = 0;
            fclose(f);
        }
        if (port > 0)
            return port;
        sleep_ms(50);
    }
    return 0;
}

static void test_process(const char *dir) {
    const char *bindir = getenv("HYLA_BIN_DIR");
    char bin[1024];
    snprintf(bin, sizeof bin, "%s/hyla-coordinator", bindir ? bindir : "bin");
    if (access(bin, X_OK) != 0) {
        printf("test_rpc_coord: %s not built: skipping the process test\n", bin);
        return;
    }
    char port_file[1100];
    snprintf(port_file, sizeof port_file, "%s.port", dir);
    pid_t pid = spawn_coord(bin, dir, port_file);
    int port = read_port(port_file);
    CHECK_MSG(port > 0, "hyla-coordinator did not start");
    if (port <= 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return;
    }
    connect_to(port);
    fworker *w = fw_start("wp", "tiny", port);
    CHECK(wait_worker_state("wp", HYLA__V1__WORKER_STATE__WORKER_READY, 6000));
    hyla_rpc_result res;
    char ids[3][32];
    for (int i = 0; i < 3; i++) {
        Hyla__V1__Session *s = create("t1", "", NULL, &res);
        CHECK_MSG(s != NULL, "%s", res.message);
        snprintf(ids[i], sizeof ids[i], "%s", s ? s->session_id : "");
        if (s)
            protobuf_c_message_free_unpacked(&s->base, NULL);
    }
    /* kill -9: the directory must hold every acknowledged session */
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    pid = spawn_coord(bin, dir, port_file);
    port = read_port(port_file);
    CHECK(port > 0);
    connect_to(port);
    fw_retarget(w, port);
    for (int i = 0; i < 3; i++) {
        Hyla__V1__Session *s = get("t1", ids[i], &res);
        CHECK_MSG(s && strcmp(s->tenant, "t1") == 0, "%s after kill -9: %s", ids[i], res.message);
        if (s)
            protobuf_c_message_free_unpacked(&s->base, NULL);
    }
    CHECK(wait_worker_state("wp", HYLA__V1__WORKER_STATE__WORKER_READY, 6000));
    CHECK(generate("t1", ids[0], 3, &res) == 3);
    /* a clean stop */
    kill(pid, SIGTERM);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "exit status %d", status);
    fw_stop(w);
    hyla_rpc_client_destroy(g_cl);
    g_cl = NULL;
    /* usage errors */
    pid = fork();
    if (pid == 0) {
        int devnull = open("/dev/null", 1);
        dup2(devnull, 2);
        execl(bin, bin, "--listen", "127.0.0.1:0", (char *)NULL);
        _exit(127);
    }
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 2);
}

int main(void) {
    char dir[] = "/tmp/hyla_coord_test_XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    char d1[256], d2[256];
    snprintf(d1, sizeof d1, "%s/inproc", dir);
    snprintf(d2, sizeof d2, "%s/proc", dir);
    test_in_process(d1);
    test_process(d2);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "test_rpc_coord: could not remove %s\n", dir);
    return hyla_test_done("test_rpc_coord");
}
