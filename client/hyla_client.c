/* hyla_client.c — libhyla (client/hyla.h): the Sessions and Cluster calls over common/rpc.
 *
 * Every call builds a protobuf-c request, runs it through hyla_rpc (unary, or a stream for
 * Append and Generate) with the client's deadline and the tenant metadata, and converts the
 * response into the plain structs of hyla.h, so no protobuf-c or gRPC type leaves this file.
 * Failures become a hyla_status with a detail message "<Call> <session>: <CODE>: <message>"
 * and the exact gRPC code in a thread-local (hyla_client_last_code).
 *
 * Append is a bidi stream. A helper thread writes the document (writes block under gRPC flow
 * control); responses arrive on the rpc client's loop thread, which only records them; the
 * caller's thread waits and runs the user's progress callback. So callbacks run on the caller's
 * thread, and a slow server never stalls progress reporting. Generate is a server stream read
 * on the caller's thread.
 *
 * Threading: a hyla_client holds only immutable settings and the thread-safe rpc client, so
 * calls from several threads run independently. */
#include "hyla.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hyla_api.h"
#include "hyla_rpc.h"
#include "hyla_util.h"

struct hyla_client {
    char *addr;
    char *tenant; /* "" when none is sent */
    hyla_client_params p;
    hyla_rpc_client *rpc;
};

static _Thread_local int tl_code = HYLA_CODE_OK;

#define M_SESSIONS "/hyla.v1.Sessions/"
#define M_CLUSTER "/hyla.v1.Cluster/"

/* ---------------------------------------------------------------------------------------- */
/* small helpers                                                                             */

static char *xstrdup(const char *s) {
    char *d = strdup(s ? s : "");
    HYLA_ASSERT(d);
    return d;
}

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    HYLA_ASSERT(p);
    return p;
}

/* A failure detected in the client, before gRPC. */
static hyla_status local_fail(hyla_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static hyla_status local_fail(hyla_status s, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    tl_code = HYLA_CODE_LOCAL;
    return hyla_fail(s, "%s", msg);
}

/* A call that ended with a non-OK gRPC status. what: "CreateSession", "Generate s-...". */
static hyla_status rpc_fail(const hyla_client *c, const char *what, const hyla_rpc_result *r, const char *extra) {
    tl_code = (int)r->code;
    const char *msg = r->message[0] ? r->message : "(no message)";
    int net = r->code == HYLA_RPC_UNAVAILABLE || r->code == HYLA_RPC_DEADLINE_EXCEEDED;
    return hyla_fail(hyla_rpc_status_from_code(r->code), "%s: %s: %s%s%s%s%s", what, hyla_rpc_code_name(r->code),
                     msg, net ? " (server " : "", net ? c->addr : "", net ? ")" : "", extra ? extra : "");
}

static hyla_status check_id(const char *call, const char *id) {
    if (!id || !id[0])
        return local_fail(HYLA_ERR_INVALID_ARG, "%s: the session id is empty", call);
    return HYLA_OK;
}

static hyla_rpc_call_opts call_opts(const hyla_client *c, int64_t timeout_ms) {
    hyla_rpc_call_opts o;
    memset(&o, 0, sizeof o);
    o.timeout_ms = timeout_ms;
    o.tenant = c->tenant[0] ? c->tenant : NULL;
    o.wait_for_ready = c->p.wait_for_ready;
    return o;
}

/* One unary call. *resp: caller frees with protobuf_c_message_free_unpacked. */
static hyla_status unary(hyla_client *c, const char *path, const char *what, const ProtobufCMessage *req,
                         const ProtobufCMessageDescriptor *desc, ProtobufCMessage **resp, int64_t timeout_ms) {
    hyla_rpc_call_opts o = call_opts(c, timeout_ms);
    hyla_rpc_result r;
    memset(&r, 0, sizeof r);
    hyla_status st = hyla_rpc_client_unary(c->rpc, path, req, desc, resp, &o, &r);
    if (st == HYLA_OK) {
        tl_code = HYLA_CODE_OK;
        return HYLA_OK;
    }
    if (r.code == HYLA_RPC_OK) { /* cannot happen per hyla_rpc.h; keep the detail if it does */
        tl_code = HYLA_CODE_LOCAL;
        return hyla_fail_wrap(st, "%s", what);
    }
    return rpc_fail(c, what, &r, NULL);
}

/* A unary Sessions call about one session: METHOD on M_SESSIONS, errors named "METHOD ID"; an
 * empty id is refused here, before anything is sent. */
static hyla_status session_unary(hyla_client *c, const char *method, const char *session_id,
                                 const ProtobufCMessage *req, const ProtobufCMessageDescriptor *desc,
                                 ProtobufCMessage **resp) {
    HYLA_TRY(check_id(method, session_id));
    char path[96], what[160];
    snprintf(path, sizeof path, M_SESSIONS "%s", method);
    snprintf(what, sizeof what, "%s %s", method, session_id);
    return unary(c, path, what, req, desc, resp, c->p.call_timeout_ms);
}

/* ---------------------------------------------------------------------------------------- */
/* names                                                                                     */

int hyla_client_last_code(void) { return tl_code; }

const char *hyla_client_code_name(int code) {
    if (code == HYLA_CODE_LOCAL)
        return "LOCAL";
    return hyla_rpc_code_name((hyla_rpc_code)code);
}

const char *hyla_tier_name(hyla_tier t) {
    switch (t) {
    case HYLA_TIER_GPU: return "gpu";
    case HYLA_TIER_HOST: return "host";
    case HYLA_TIER_STORE: return "store";
    default: return "unknown";
    }
}

const char *hyla_session_state_name(hyla_session_state s) {
    switch (s) {
    case HYLA_SESSION_ACTIVE: return "active";
    case HYLA_SESSION_PAUSED: return "paused";
    case HYLA_SESSION_MOVING: return "moving";
    case HYLA_SESSION_FAILED: return "failed";
    default: return "unknown";
    }
}

const char *hyla_finish_reason_name(hyla_finish_reason r) {
    switch (r) {
    case HYLA_FINISH_LENGTH: return "length";
    case HYLA_FINISH_STOP: return "stop";
    case HYLA_FINISH_EOS: return "eos";
    default: return "none";
    }
}

const char *hyla_worker_state_name(hyla_worker_state s) {
    switch (s) {
    case HYLA_WORKER_READY: return "ready";
    case HYLA_WORKER_DRAINING: return "draining";
    case HYLA_WORKER_DRAINED: return "drained";
    case HYLA_WORKER_DEAD: return "dead";
    default: return "unknown";
    }
}

/* ---------------------------------------------------------------------------------------- */
/* conversions (protobuf-c -> hyla.h)                                                        */

static hyla_sampling_params sampling_from_pb(const Hyla__V1__SamplingParams *p) {
    hyla_sampling_params s = {0, 0, 0};
    if (p) {
        s.temperature = p->temperature;
        s.top_k = p->top_k;
        s.top_p = p->top_p;
    }
    return s;
}

static void sampling_to_pb(const hyla_sampling_params *s, Hyla__V1__SamplingParams *p) {
    hyla__v1__sampling_params__init(p);
    p->temperature = s->temperature;
    p->top_k = s->top_k;
    p->top_p = s->top_p;
}

static hyla_snapshot_summary snapshot_from_pb(const Hyla__V1__SnapshotInfo *p) {
    hyla_snapshot_summary s;
    memset(&s, 0, sizeof s);
    if (p) {
        s.version = p->version;
        s.position = p->position;
        s.state_bytes = p->state_bytes;
        s.stored_bytes = p->stored_bytes;
        s.written_bytes = p->written_bytes;
        s.chunks = p->chunks;
        s.created_unix_ms = p->created_unix_ms;
    }
    return s;
}

static char **strv_dup(char *const *v, size_t n) {
    char **d = xcalloc(n, sizeof *d);
    for (size_t i = 0; i < n; i++)
        d[i] = xstrdup(v[i]);
    return d;
}

static void strv_free(char **v, size_t n) {
    if (!v)
        return;
    for (size_t i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

static hyla_tier tier_from_pb(int t) {
    return t >= HYLA_TIER_GPU && t <= HYLA_TIER_STORE ? (hyla_tier)t : HYLA_TIER_UNKNOWN;
}

static hyla_session_state session_state_from_pb(int s) {
    return s >= (int)HYLA_SESSION_ACTIVE && s <= (int)HYLA_SESSION_FAILED ? (hyla_session_state)s : HYLA_SESSION_UNKNOWN;
}

static hyla_worker_state worker_state_from_pb(int s) {
    return s >= (int)HYLA_WORKER_READY && s <= (int)HYLA_WORKER_DEAD ? (hyla_worker_state)s : HYLA_WORKER_UNKNOWN;
}

static void session_from_pb(const Hyla__V1__Session *p, hyla_session_info *s) {
    memset(s, 0, sizeof *s);
    s->id = xstrdup(p ? p->session_id : "");
    s->tenant = xstrdup(p ? p->tenant : "");
    s->model = xstrdup(p ? p->model : "");
    s->group_id = xstrdup(p ? p->group_id : "");
    s->parent_id = xstrdup(p ? p->parent_session_id : "");
    s->error = xstrdup(p ? p->error : "");
    if (!p) {
        s->worker_ids = xcalloc(1, sizeof *s->worker_ids);
        return;
    }
    s->state = session_state_from_pb((int)p->state);
    s->tier = tier_from_pb((int)p->tier);
    s->worker_ids = strv_dup(p->worker_ids, p->n_worker_ids);
    s->n_worker_ids = p->n_worker_ids;
    s->position = p->position;
    s->generated = p->generated;
    s->sampling = sampling_from_pb(p->sampling);
    s->seed = p->seed;
    s->last_snapshot = snapshot_from_pb(p->last_snapshot);
    s->created_unix_ms = p->created_unix_ms;
    s->updated_unix_ms = p->updated_unix_ms;
}

void hyla_session_info_clear(hyla_session_info *s) {
    if (!s)
        return;
    free(s->id);
    free(s->tenant);
    free(s->model);
    free(s->group_id);
    free(s->parent_id);
    free(s->error);
    strv_free(s->worker_ids, s->n_worker_ids);
    memset(s, 0, sizeof *s);
}

void hyla_session_list_clear(hyla_session_list *l) {
    if (!l)
        return;
    for (size_t i = 0; i < l->n; i++)
        hyla_session_info_clear(&l->items[i]);
    free(l->items);
    memset(l, 0, sizeof *l);
}

static void session_list_append(hyla_session_list *l, size_t *cap, Hyla__V1__Session *const *v, size_t n) {
    if (l->n + n > *cap) {
        size_t nc = *cap ? *cap : 16;
        while (nc < l->n + n)
            nc *= 2;
        hyla_session_info *items = realloc(l->items, nc * sizeof *items);
        HYLA_ASSERT(items);
        l->items = items;
        *cap = nc;
    }
    for (size_t i = 0; i < n; i++)
        session_from_pb(v[i], &l->items[l->n++]);
}

static void worker_from_pb(const Hyla__V1__WorkerInfo *p, hyla_worker_info *w) {
    memset(w, 0, sizeof *w);
    w->id = xstrdup(p->worker_id);
    w->address = xstrdup(p->address);
    w->model = xstrdup(p->model);
    w->model_fingerprint = p->model_fingerprint;
    w->num_layers = p->num_layers;
    if (p->layers) {
        w->layer_begin = p->layers->begin;
        w->layer_end = p->layers->end;
    }
    w->group_id = xstrdup(p->group_id);
    w->stage = p->stage;
    w->device = xstrdup(p->device ? p->device->name : "");
    w->device_description = xstrdup(p->device ? p->device->description : "");
    if (p->device) {
        w->memory_total_bytes = p->device->memory_total_bytes;
        w->memory_free_bytes = p->device->memory_free_bytes;
    }
    w->param_bytes = p->param_bytes;
    w->state = worker_state_from_pb((int)p->state);
    if (p->load) {
        w->sessions_gpu = p->load->sessions_gpu;
        w->sessions_host = p->load->sessions_host;
        w->active_calls = p->load->active_calls;
        w->state_bytes = p->load->state_bytes;
        w->state_budget_bytes = p->load->state_budget_bytes;
        w->tokens_per_second = p->load->tokens_per_second;
        w->queued_tokens = p->load->queued_tokens;
    }
    w->registered_unix_ms = p->registered_unix_ms;
    w->last_heartbeat_unix_ms = p->last_heartbeat_unix_ms;
    w->epoch = p->epoch;
}

static void worker_clear(hyla_worker_info *w) {
    free(w->id);
    free(w->address);
    free(w->model);
    free(w->group_id);
    free(w->device);
    free(w->device_description);
    memset(w, 0, sizeof *w);
}

void hyla_cluster_status_clear(hyla_cluster_status *st) {
    if (!st)
        return;
    for (size_t i = 0; i < st->n_workers; i++)
        worker_clear(&st->workers[i]);
    free(st->workers);
    for (size_t i = 0; i < st->n_groups; i++) {
        free(st->groups[i].id);
        free(st->groups[i].model);
        strv_free(st->groups[i].worker_ids, st->groups[i].n_worker_ids);
    }
    free(st->groups);
    memset(st, 0, sizeof *st);
}

/* ---------------------------------------------------------------------------------------- */
/* connection                                                                                */

hyla_client_params hyla_client_default_params(void) {
    hyla_client_params p;
    memset(&p, 0, sizeof p);
    p.call_timeout_ms = 60000;
    p.stream_timeout_ms = 0;
    p.wait_for_ready = 0;
    p.max_message_bytes = 16 << 20;
    p.append_chunk_bytes = 64 << 10;
    p.append_chunk_tokens = 16384;
    return p;
}

hyla_status hyla_client_connect(const char *addr, const char *tenant, const hyla_client_params *params,
                                hyla_client **out) {
    HYLA_ASSERT(out);
    *out = NULL;
    if (!addr || !addr[0])
        return local_fail(HYLA_ERR_INVALID_ARG, "connect: the server address is empty");
    if (!tenant)
        tenant = "";
    size_t tl = strlen(tenant);
    if (tl > 128)
        return local_fail(HYLA_ERR_INVALID_ARG, "connect: tenant is %zu bytes long (at most 128)", tl);
    for (size_t i = 0; i < tl; i++) {
        unsigned char ch = (unsigned char)tenant[i];
        if (ch <= 0x20 || ch >= 0x7f)
            return local_fail(HYLA_ERR_INVALID_ARG,
                              "connect: tenant '%s' has a character other than printable ASCII (byte %zu)", tenant,
                              i);
    }
    hyla_client_params p = params ? *params : hyla_client_default_params();
    hyla_client_params d = hyla_client_default_params();
    if (p.max_message_bytes <= 0)
        p.max_message_bytes = d.max_message_bytes;
    if (p.append_chunk_bytes == 0)
        p.append_chunk_bytes = d.append_chunk_bytes;
    if (p.append_chunk_tokens == 0)
        p.append_chunk_tokens = d.append_chunk_tokens;
    /* a chunk must fit in one message with room for the other fields */
    if (p.append_chunk_bytes > (size_t)p.max_message_bytes / 2)
        p.append_chunk_bytes = (size_t)p.max_message_bytes / 2;
    if (p.append_chunk_tokens > (size_t)p.max_message_bytes / 16)
        p.append_chunk_tokens = (size_t)p.max_message_bytes / 16;
    if (p.append_chunk_bytes == 0 || p.append_chunk_tokens == 0)
        return local_fail(HYLA_ERR_INVALID_ARG, "connect: max_message_bytes %d is too small", p.max_message_bytes);

    hyla_client *c = xcalloc(1, sizeof *c);
    c->addr = xstrdup(addr);
    c->tenant = xstrdup(tenant);
    c->p = p;
    c->p.api_key = c->p.tls_ca = NULL; /* borrowed from the caller: not kept */
    hyla_rpc_client_params rp = hyla_rpc_client_default_params();
    rp.max_message_bytes = p.max_message_bytes;
    rp.bearer = p.api_key ? p.api_key : ""; /* never the process's own credential */
    rp.tls_ca = p.tls_ca;
    hyla_status st = hyla_rpc_client_create(addr, &rp, &c->rpc);
    if (st != HYLA_OK) {
        tl_code = HYLA_CODE_LOCAL;
        hyla_fail_wrap(st, "connect to %s", addr);
        free(c->addr);
        free(c->tenant);
        free(c);
        return st;
    }
    tl_code = HYLA_CODE_OK;
    *out = c;
    return HYLA_OK;
}

void hyla_client_close(hyla_client *c) {
    if (!c)
        return;
    hyla_rpc_client_destroy(c->rpc);
    free(c->addr);
    free(c->tenant);
    free(c);
}

const char *hyla_client_address(const hyla_client *c) { return c->addr; }
const char *hyla_client_tenant(const hyla_client *c) { return c->tenant; }

/* ---------------------------------------------------------------------------------------- */
/* unary session calls                                                                       */

hyla_create_params hyla_create_default_params(void) {
    hyla_create_params p;
    memset(&p, 0, sizeof p);
    return p;
}

hyla_status hyla_client_create_session(hyla_client *c, const hyla_create_params *params,
                                       hyla_session_info *out) {
    HYLA_ASSERT(c && out);
    memset(out, 0, sizeof *out);
    hyla_create_params p = params ? *params : hyla_create_default_params();
    Hyla__V1__CreateSessionRequest req = HYLA__V1__CREATE_SESSION_REQUEST__INIT;
    Hyla__V1__SamplingParams sp;
    req.model = (char *)(p.model ? p.model : "");
    if (p.has_sampling) {
        sampling_to_pb(&p.sampling, &sp);
        req.sampling = &sp;
    }
    req.seed = p.seed;
    req.worker_hint = (char *)(p.worker_hint ? p.worker_hint : "");
    ProtobufCMessage *resp = NULL;
    HYLA_TRY(unary(c, M_SESSIONS "CreateSession", "CreateSession", &req.base, &hyla__v1__session__descriptor, &resp,
                   c->p.call_timeout_ms));
    session_from_pb((Hyla__V1__Session *)resp, out);
    protobuf_c_message_free_unpacked(resp, NULL);
    if (!out->id[0]) {
        hyla_session_info_clear(out);
        return local_fail(HYLA_ERR_FORMAT, "CreateSession: the server's response has no session id");
    }
    return HYLA_OK;
}

/* The session and snapshot a Pause or Migrate answers with, into the caller's optional outputs
 * (NULL: not wanted). */
static void session_snapshot_out(const Hyla__V1__Session *s, const Hyla__V1__SnapshotInfo *snap,
                                 hyla_session_info *session, hyla_snapshot_summary *snapshot) {
    if (session)
        session_from_pb(s, session);
    if (snapshot)
        *snapshot = snapshot_from_pb(snap);
}

hyla_status hyla_client_pause(hyla_client *c, const char *session_id, int evict, hyla_session_info *session,
                              hyla_snapshot_summary *snapshot) {
    HYLA_ASSERT(c);
    if (session)
        memset(session, 0, sizeof *session);
    if (snapshot)
        memset(snapshot, 0, sizeof *snapshot);
    Hyla__V1__PauseRequest req = HYLA__V1__PAUSE_REQUEST__INIT;
    req.session_id = (char *)session_id;
    req.evict = evict != 0;
    ProtobufCMessage *resp = NULL;
    HYLA_TRY(session_unary(c, "Pause", session_id, &req.base, &hyla__v1__pause_response__descriptor, &resp));
    Hyla__V1__PauseResponse *r = (Hyla__V1__PauseResponse *)resp;
    session_snapshot_out(r->session, r->snapshot, session, snapshot);
    protobuf_c_message_free_unpacked(resp, NULL);
    return HYLA_OK;
}

hyla_status hyla_client_resume(hyla_client *c, const char *session_id, const char *worker_hint,
                               hyla_session_info *out) {
    return hyla_client_resume_version(c, session_id, worker_hint, 0, out);
}

hyla_status hyla_client_resume_version(hyla_client *c, const char *session_id, const char *worker_hint,
                                       uint64_t version, hyla_session_info *out) {
    HYLA_ASSERT(c);
    if (out)
        memset(out, 0, sizeof *out);
    Hyla__V1__ResumeRequest req = HYLA__V1__RESUME_REQUEST__INIT;
    req.session_id = (char *)session_id;
    req.worker_hint = (char *)(worker_hint ? worker_hint : "");
    req.version = version;
    ProtobufCMessage *resp = NULL;
    HYLA_TRY(session_unary(c, "Resume", session_id, &req.base, &hyla__v1__session__descriptor, &resp));
    if (out)
        session_from_pb((Hyla__V1__Session *)resp, out);
    protobuf_c_message_free_unpacked(resp, NULL);
    return HYLA_OK;
}

hyla_status hyla_client_migrate(hyla_client *c, const char *session_id, const char *to_worker,
                                hyla_session_info *session, hyla_snapshot_summary *snapshot, char **from_group) {
    HYLA_ASSERT(c);
    if (session)
        memset(session, 0, sizeof *session);
    if (snapshot)
        memset(snapshot, 0, sizeof *snapshot);
    if (from_group)
        *from_group = NULL;
    Hyla__V1__MigrateRequest req = HYLA__V1__MIGRATE_REQUEST__INIT;
    req.session_id = (char *)session_id;
    req.to_worker = (char *)(to_worker ? to_worker : "");
    ProtobufCMessage *resp = NULL;
    HYLA_TRY(session_unary(c, "Migrate", session_id, &req.base, &hyla__v1__migrate_response__descriptor, &resp));
    Hyla__V1__MigrateResponse *r = (Hyla__V1__MigrateResponse *)resp;
    session_snapshot_out(r->session, r->snapshot, session, snapshot);
    if (from_group)
        *from_group = xstrdup(r->from_group_id);
    protobuf_c_message_free_unpacked(resp, NULL);
    return HYLA_OK;
}

hyla_fork_params hyla_fork_default_params(void) {
    hyla_fork_params p;
    memset(&p, 0, sizeof p);
    return p;
}

hyla_status hyla_client_fork(hyla_client *c, const char *session_id, const hyla_fork_params *params,
                             hyla_session_info *out) {
    HYLA_ASSERT(c && out);
    memset(out, 0, sizeof *out);
    hyla_fork_params p = params ? *params : hyla_fork_default_params();
    Hyla__V1__ForkRequest req = HYLA__V1__FORK_REQUEST__INIT;
    Hyla__V1__SamplingParams sp;
    req.session_id = (char *)session_id;
    if (p.has_sampling) {
        sampling_to_pb(&p.sampling, &sp);
        req.sampling = &sp;
    }
    req.reseed = p.reseed != 0;
    req.seed = p.seed;
    req.worker_hint = (char *)(p.worker_hint ? p.worker_hint : "");
    req.version = p.version;
    ProtobufCMessage *resp = NULL;
    HYLA_TRY(session_unary(c, "Fork", session_id, &req.base, &hyla__v1__session__descriptor, &resp));
    session_from_pb((Hyla__V1__Session *)resp, out);
    protobuf_c_message_free_unpacked(resp, NULL);
    if (!out->id[0]) {
        hyla_session_info_clear(out);
        return local_fail(HYLA_ERR_FORMAT, "Fork %s: the server's response has no session id", session_id);
    }
    return HYLA_OK;
}

hyla_status hyla_client_get_session(hyla_client *c, const char *session_id, hyla_session_info *out) {
    HYLA_ASSERT(c && out);
    memset(out, 0, sizeof *out);
    Hyla__V1__GetSessionRequest req = HYLA__V1__GET_SESSION_REQUEST__INIT;
    req.session_id = (char *)session_id;
    ProtobufCMessage *resp = NULL;
    HYLA_TRY(session_unary(c, "GetSession", session_id, &req.base, &hyla__v1__session__descriptor, &resp));
    session_from_pb((Hyla__V1__Session *)resp, out);
    protobuf_c_message_free_unpacked(resp, NULL);
    return HYLA_OK;
}

/* Pages end with an empty token; a server that repeats a token would loop forever: refuse. */
#define MAX_PAGES 100000

/* One page of a paged session listing: the response (freed by the pager), its sessions and the
 * token of the next page. */
typedef struct {
    ProtobufCMessage *resp;
    Hyla__V1__Session *const *sessions;
    size_t n;
    const char *next;
} session_page;

typedef hyla_status (*session_page_fn)(hyla_client *c, const void *arg, const char *token, session_page *pg);

/* Every page of a listing into out (emptied on failure): ListSessions and ListClusterSessions
 * page the same way, stopping when the token is empty or repeats. */
static hyla_status session_pages(hyla_client *c, const char *what, session_page_fn fetch, const void *arg,
                                 hyla_session_list *out) {
    memset(out, 0, sizeof *out);
    size_t cap = 0;
    char *token = xstrdup("");
    hyla_status st = HYLA_OK;
    for (int page = 0;; page++) {
        if (page == MAX_PAGES) {
            st = local_fail(HYLA_ERR_FORMAT, "%s: more than %d pages; the server's page tokens do not end", what,
                            MAX_PAGES);
            break;
        }
        session_page pg;
        st = fetch(c, arg, token, &pg);
        if (st != HYLA_OK)
            break;
        session_list_append(out, &cap, pg.sessions, pg.n);
        int again = pg.next && pg.next[0] && strcmp(pg.next, token) != 0;
        free(token);
        token = xstrdup(pg.next);
        protobuf_c_message_free_unpacked(pg.resp, NULL);
        if (!again)
            break;
    }
    free(token);
    if (st != HYLA_OK)
        hyla_session_list_clear(out);
    return st;
}

static hyla_status list_sessions_page(hyla_client *c, const void *arg, const char *token, session_page *pg) {
    const char *model = arg;
    Hyla__V1__ListSessionsRequest req = HYLA__V1__LIST_SESSIONS_REQUEST__INIT;
    req.model = (char *)(model ? model : "");
    req.page_token = (char *)token;
    ProtobufCMessage *resp = NULL;
    HYLA_TRY(unary(c, M_SESSIONS "ListSessions", "ListSessions", &req.base, &hyla__v1__list_sessions_response__descriptor,
                   &resp, c->p.call_timeout_ms));
    Hyla__V1__ListSessionsResponse *r = (Hyla__V1__ListSessionsResponse *)resp;
    *pg = (session_page){resp, r->sessions, r->n_sessions, r->next_page_token};
    return HYLA_OK;
}

hyla_status hyla_client_list_sessions(hyla_client *c, const char *model, hyla_session_list *out) {
    HYLA_ASSERT(c && out);
    return session_pages(c, "ListSessions", list_sessions_page, model, out);
}

hyla_status hyla_client_list_snapshots(hyla_client *c, const char *session_id, hyla_snapshot_version **out,
                                       size_t *n) {
    HYLA_ASSERT(c && out && n);
    *out = NULL;
    *n = 0;
    Hyla__V1__ListSnapshotsRequest req = HYLA__V1__LIST_SNAPSHOTS_REQUEST__INIT;
    req.session_id = (char *)session_id;
    ProtobufCMessage *resp = NULL;
    HYLA_TRY(session_unary(c, "ListSnapshots", session_id, &req.base, &hyla__v1__list_snapshots_response__descriptor,
                           &resp));
    const Hyla__V1__ListSnapshotsResponse *r = (const Hyla__V1__ListSnapshotsResponse *)resp;
    hyla_snapshot_version *v = calloc(r->n_snapshots ? r->n_snapshots : 1, sizeof *v);
    HYLA_ASSERT(v);
    for (size_t i = 0; i < r->n_snapshots; i++) {
        const Hyla__V1__SnapshotVersion *m = r->snapshots[i];
        v[i].version = m->version;
        v[i].position = m->position;
        v[i].generated = m->generated;
        v[i].created_unix_ms = m->created_unix_ms;
        v[i].state_bytes = m->state_bytes;
        v[i].stored_bytes = m->stored_bytes;
        v[i].head = m->head;
    }
    *n = r->n_snapshots;
    *out = v;
    protobuf_c_message_free_unpacked(resp, NULL);
    return HYLA_OK;
}

void hyla_read_result_clear(hyla_read_result *r) {
    if (!r)
        return;
    free(r->token_ids);
    free(r->text);
    memset(r, 0, sizeof *r);
}

hyla_status hyla_client_read_tokens(hyla_client *c, const char *session_id, uint64_t from_generated, uint32_t max_tokens,
                                    hyla_read_result *out) {
    HYLA_ASSERT(c && out);
    memset(out, 0, sizeof *out);
    HYLA_TRY(check_id("ReadTokens", session_id));
    Hyla__V1__ReadTokensRequest req = HYLA__V1__READ_TOKENS_REQUEST__INIT;
    req.session_id = (char *)session_id;
    req.from_generated = from_generated;
    req.max_tokens = max_tokens;
    ProtobufCMessage *resp = NULL;
    HYLA_TRY(session_unary(c, "ReadTokens", session_id, &req.base, &hyla__v1__read_tokens_response__descriptor, &resp));
    const Hyla__V1__ReadTokensResponse *r = (const Hyla__V1__ReadTokensResponse *)resp;
    out->token_ids = malloc((r->n_token_ids ? r->n_token_ids : 1) * sizeof *out->token_ids);
    out->text = malloc(r->text.len + 1);
    HYLA_ASSERT(out->token_ids && out->text);
    if (r->n_token_ids)
        memcpy(out->token_ids, r->token_ids, r->n_token_ids * sizeof *out->token_ids);
    out->n_tokens = r->n_token_ids;
    if (r->text.len)
        memcpy(out->text, r->text.data, r->text.len);
    out->text[r->text.len] = 0;
    out->text_len = r->text.len;
    out->from_generated = r->from_generated;
    out->generated = r->generated;
    out->first_available = r->first_available;
    protobuf_c_message_free_unpacked(resp, NULL);
    return HYLA_OK;
}

hyla_status hyla_client_delete_session(hyla_client *c, const char *session_id, uint64_t *snapshots_deleted) {
    HYLA_ASSERT(c);
    if (snapshots_deleted)
        *snapshots_deleted = 0;
    Hyla__V1__DeleteSessionRequest req = HYLA__V1__DELETE_SESSION_REQUEST__INIT;
    req.session_id = (char *)session_id;
    ProtobufCMessage *resp = NULL;
    HYLA_TRY(session_unary(c, "DeleteSession", session_id, &req.base, &hyla__v1__delete_session_response__descriptor,
                           &resp));
    if (snapshots_deleted)
        *snapshots_deleted = ((Hyla__V1__DeleteSessionResponse *)resp)->snapshots_deleted;
    protobuf_c_message_free_unpacked(resp, NULL);
    return HYLA_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* ExportSession, ImportSession, ListModels                                                  */

#define PORT_PIECE (1u << 20) /* file bytes per ImportSessionRequest */

hyla_status hyla_client_export_session(hyla_client *c, const char *session_id, uint64_t version, FILE *out,
                                       hyla_export_info *info) {
    HYLA_ASSERT(c && out);
    hyla_export_info got;
    memset(&got, 0, sizeof got);
    if (info)
        *info = got;
    HYLA_TRY(check_id("ExportSession", session_id));
    char what[160];
    snprintf(what, sizeof what, "ExportSession %s", session_id);
    Hyla__V1__ExportSessionRequest req = HYLA__V1__EXPORT_SESSION_REQUEST__INIT;
    req.session_id = (char *)session_id;
    req.version = version;
    hyla_rpc_call_opts o = call_opts(c, c->p.stream_timeout_ms);
    hyla_rpc_stream *s = NULL;
    hyla_status st = hyla_rpc_stream_open(c->rpc, M_SESSIONS "ExportSession",
                                          &hyla__v1__export_session_chunk__descriptor, &o, &s);
    if (st != HYLA_OK) {
        tl_code = HYLA_CODE_LOCAL;
        return hyla_fail_wrap(st, "%s", what);
    }
    if (hyla_rpc_stream_write(s, &req.base) == HYLA_OK)
        hyla_rpc_stream_close_send(s);
    int write_err = 0, bad = 0, first = 1;
    uint64_t total = 0;
    for (;;) {
        ProtobufCMessage *m = NULL;
        st = hyla_rpc_stream_read(s, &m);
        if (!m) {
            bad = st == HYLA_ERR_FORMAT;
            break;
        }
        const Hyla__V1__ExportSessionChunk *k = (const Hyla__V1__ExportSessionChunk *)m;
        if (first) {
            got.version = k->version;
            got.position = k->position;
            total = k->total_bytes;
            snprintf(got.model, sizeof got.model, "%s", k->model ? k->model : "");
            first = 0;
        }
        if (k->data.len && fwrite(k->data.data, 1, k->data.len, out) != k->data.len)
            write_err = errno ? errno : EIO;
        got.bytes += k->data.len;
        protobuf_c_message_free_unpacked(m, NULL);
        if (write_err) {
            hyla_rpc_stream_cancel(s);
            break;
        }
    }
    hyla_rpc_result r;
    memset(&r, 0, sizeof r);
    hyla_rpc_stream_finish(s, &r);
    hyla_rpc_stream_destroy(s);
    if (info)
        *info = got;
    if (write_err)
        return local_fail(HYLA_ERR_IO, "%s: writing the file: %s", what, strerror(write_err));
    if (r.code != HYLA_RPC_OK)
        return rpc_fail(c, what, &r, NULL);
    if (bad)
        return local_fail(HYLA_ERR_FORMAT, "%s: a response did not decode", what);
    if (first || got.bytes != total)
        return local_fail(HYLA_ERR_FORMAT, "%s: the server sent %llu of the file's %llu bytes", what,
                          (unsigned long long)got.bytes, (unsigned long long)total);
    tl_code = HYLA_CODE_OK;
    return HYLA_OK;
}

hyla_status hyla_client_export_session_file(hyla_client *c, const char *session_id, uint64_t version,
                                            const char *path, hyla_export_info *info) {
    HYLA_ASSERT(c && path);
    size_t pl = strlen(path) + 32;
    char *tmp = xcalloc(pl, 1);
    snprintf(tmp, pl, "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        hyla_status st = local_fail(HYLA_ERR_IO, "ExportSession %s: cannot write %s (through %s): %s",
                                    session_id ? session_id : "", path, tmp, strerror(errno));
        free(tmp);
        return st;
    }
    hyla_status st = hyla_client_export_session(c, session_id, version, f, info);
    if (st == HYLA_OK && (fflush(f) != 0 || fsync(fileno(f)) != 0))
        st = local_fail(HYLA_ERR_IO, "ExportSession %s: writing %s (through %s): %s", session_id, path, tmp,
                        strerror(errno));
    if (fclose(f) != 0 && st == HYLA_OK)
        st = local_fail(HYLA_ERR_IO, "ExportSession %s: writing %s (through %s): %s", session_id, path, tmp,
                        strerror(errno));
    if (st == HYLA_OK && rename(tmp, path) != 0)
        st = local_fail(HYLA_ERR_IO, "ExportSession %s: renaming %s to %s: %s", session_id, tmp, path,
                        strerror(errno));
    if (st != HYLA_OK) {
        unlink(tmp);
        free(tmp);
        return st;
    }
    char *dir = xstrdup(path);
    int dfd = open(dirname(dir), O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
        (void)fsync(dfd);
        close(dfd);
    }
    free(dir);
    free(tmp);
    tl_code = HYLA_CODE_OK;
    return HYLA_OK;
}

hyla_status hyla_client_import_session(hyla_client *c, FILE *in, const char *session_id, const char *worker_hint,
                                       hyla_session_info *out) {
    HYLA_ASSERT(c && in);
    if (out)
        memset(out, 0, sizeof *out);
    const char *id = session_id ? session_id : "";
    char what[160];
    snprintf(what, sizeof what, "ImportSession%s%s", id[0] ? " " : "", id);
    hyla_rpc_call_opts o = call_opts(c, c->p.stream_timeout_ms);
    hyla_rpc_stream *s = NULL;
    hyla_status st = hyla_rpc_stream_open(c->rpc, M_SESSIONS "ImportSession", &hyla__v1__session__descriptor, &o, &s);
    if (st != HYLA_OK) {
        tl_code = HYLA_CODE_LOCAL;
        return hyla_fail_wrap(st, "%s", what);
    }
    uint8_t *buf = xcalloc(PORT_PIECE, 1);
    int first = 1, read_err = 0, local = 0;
    char lerr[1024] = "";
    for (;;) {
        size_t n = fread(buf, 1, PORT_PIECE, in);
        if (n < PORT_PIECE && ferror(in)) {
            read_err = errno ? errno : EIO;
            hyla_rpc_stream_cancel(s);
            break;
        }
        if (n == 0 && !first)
            break;
        Hyla__V1__ImportSessionRequest req = HYLA__V1__IMPORT_SESSION_REQUEST__INIT;
        if (first) {
            req.session_id = (char *)id;
            req.worker_hint = (char *)(worker_hint ? worker_hint : "");
        }
        req.data.data = buf;
        req.data.len = n;
        first = 0;
        if (hyla_rpc_stream_write(s, &req.base) != HYLA_OK) {
            if (!hyla_rpc_stream_result(s, NULL)) { /* a local refusal: end the call */
                local = 1;
                snprintf(lerr, sizeof lerr, "%s", hyla_last_error());
                hyla_rpc_stream_cancel(s);
            }
            break; /* else the call is over: its status says why */
        }
        if (n < PORT_PIECE)
            break;
    }
    free(buf);
    if (!read_err && !local)
        hyla_rpc_stream_close_send(s);
    ProtobufCMessage *m = NULL;
    (void)hyla_rpc_stream_read(s, &m);
    hyla_rpc_result r;
    memset(&r, 0, sizeof r);
    hyla_rpc_stream_finish(s, &r);
    hyla_rpc_stream_destroy(s);
    if (read_err || local || r.code != HYLA_RPC_OK || !m) {
        if (m)
            protobuf_c_message_free_unpacked(m, NULL);
        if (read_err)
            return local_fail(HYLA_ERR_IO, "%s: reading the file: %s", what, strerror(read_err));
        if (local)
            return local_fail(HYLA_ERR_INVALID_ARG, "%s: %s", what, lerr);
        if (r.code != HYLA_RPC_OK)
            return rpc_fail(c, what, &r, NULL);
        return local_fail(HYLA_ERR_FORMAT, "%s: the server answered OK without a session", what);
    }
    if (out)
        session_from_pb((const Hyla__V1__Session *)m, out);
    protobuf_c_message_free_unpacked(m, NULL);
    tl_code = HYLA_CODE_OK;
    return HYLA_OK;
}

hyla_status hyla_client_import_session_file(hyla_client *c, const char *path, const char *session_id,
                                            const char *worker_hint, hyla_session_info *out) {
    HYLA_ASSERT(c && path);
    if (out)
        memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "rb");
    if (!f)
        return local_fail(HYLA_ERR_IO, "ImportSession: %s: %s", path, strerror(errno));
    hyla_status st = hyla_client_import_session(c, f, session_id, worker_hint, out);
    fclose(f);
    return st;
}

hyla_status hyla_client_list_models(hyla_client *c, hyla_model_info **out, size_t *n) {
    HYLA_ASSERT(c && out && n);
    *out = NULL;
    *n = 0;
    Hyla__V1__ListModelsRequest req = HYLA__V1__LIST_MODELS_REQUEST__INIT;
    ProtobufCMessage *resp = NULL;
    HYLA_TRY(unary(c, M_SESSIONS "ListModels", "ListModels", &req.base, &hyla__v1__list_models_response__descriptor,
                   &resp, c->p.call_timeout_ms));
    const Hyla__V1__ListModelsResponse *r = (const Hyla__V1__ListModelsResponse *)resp;
    hyla_model_info *v = xcalloc(r->n_models, sizeof *v);
    for (size_t i = 0; i < r->n_models; i++) {
        snprintf(v[i].name, sizeof v[i].name, "%s", r->models[i]->name ? r->models[i]->name : "");
        v[i].fingerprint = r->models[i]->fingerprint;
        v[i].ready_workers = r->models[i]->ready_workers;
        v[i].max_generate = r->models[i]->max_generate;
    }
    *n = r->n_models;
    *out = v;
    protobuf_c_message_free_unpacked(resp, NULL);
    return HYLA_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Append                                                                                    */

hyla_append_params hyla_append_default_params(void) {
    hyla_append_params p;
    memset(&p, 0, sizeof p);
    return p;
}

enum { SRC_TEXT, SRC_TOKENS, SRC_READER };

typedef struct {
    hyla_client *c;
    hyla_rpc_stream *s;
    const char *session_id;
    hyla_append_params p;
    double t0;

    int kind;
    const uint8_t *text;
    size_t len;
    const int32_t *ids;
    size_t n_ids;
    hyla_read_fn read;
    void *read_ud;

    pthread_mutex_t mu;
    pthread_cond_t cv;
    hyla_append_progress prog; /* the server's last report (+ client fields) */
    int prog_new;              /* prog changed since the caller last looked */
    int got_any;               /* at least one report */
    int stream_over;           /* the final NULL callback came */
    int writer_done;
    int writer_local_fail;     /* the source failed: writer_st + writer_err */
    hyla_status writer_st;
    char writer_err[1024];
    int cancel; /* the caller asked to stop */
} append_ctx;

/* On the rpc client's loop thread: record, never block. */
static void append_on_msg(hyla_rpc_stream *s, const ProtobufCMessage *msg, void *ud) {
    (void)s;
    append_ctx *a = ud;
    pthread_mutex_lock(&a->mu);
    if (msg) {
        const Hyla__V1__AppendProgress *m = (const Hyla__V1__AppendProgress *)msg;
        a->prog.tokens_received = m->tokens_received;
        a->prog.tokens_ingested = m->tokens_ingested;
        a->prog.total_tokens = m->total_tokens;
        a->prog.tokens_per_second = m->tokens_per_second;
        a->prog.position = m->position;
        a->prog.done = m->done;
        a->prog_new = 1;
        a->got_any = 1;
    } else {
        a->stream_over = 1;
    }
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
}

/* The writer's own failure (st, the thread's last error) recorded for the caller, and the call
 * ended: the append then reports it rather than the server's status. */
static void writer_fail(append_ctx *a, hyla_status st) {
    pthread_mutex_lock(&a->mu);
    a->writer_local_fail = 1;
    a->writer_st = st;
    snprintf(a->writer_err, sizeof a->writer_err, "%s", hyla_last_error());
    pthread_mutex_unlock(&a->mu);
    hyla_rpc_stream_cancel(a->s);
}

static void *append_writer(void *arg) {
    append_ctx *a = arg;
    const hyla_client_params *cp = &a->c->p;
    uint8_t *buf = NULL;
    if (a->kind == SRC_READER)
        buf = xcalloc(cp->append_chunk_bytes, 1);
    size_t off = 0;
    int first = 1, eof = 0;
    hyla_status st = HYLA_OK;
    while (!eof) {
        pthread_mutex_lock(&a->mu);
        int stop = a->cancel || a->stream_over;
        pthread_mutex_unlock(&a->mu);
        if (stop)
            break;
        Hyla__V1__AppendRequest req = HYLA__V1__APPEND_REQUEST__INIT;
        uint64_t sent = 0;
        if (first) {
            req.session_id = (char *)a->session_id;
            req.total_tokens_hint = a->p.total_tokens_hint;
            req.total_bytes_hint = a->p.total_bytes_hint;
            req.add_bos = a->p.add_bos != 0;
        }
        if (a->kind == SRC_TEXT) {
            size_t n = a->len - off < cp->append_chunk_bytes ? a->len - off : cp->append_chunk_bytes;
            req.text.data = (uint8_t *)a->text + off;
            req.text.len = n;
            off += n;
            sent = n;
            eof = off == a->len;
        } else if (a->kind == SRC_TOKENS) {
            size_t n = a->n_ids - off < cp->append_chunk_tokens ? a->n_ids - off : cp->append_chunk_tokens;
            req.tokens = (int32_t *)a->ids + off;
            req.n_tokens = n;
            off += n;
            sent = 4 * (uint64_t)n;
            eof = off == a->n_ids;
        } else {
            ssize_t n = a->read(buf, cp->append_chunk_bytes, a->read_ud);
            if (n < 0) {
                writer_fail(a, HYLA_ERR_IO);
                break;
            }
            if (n == 0) {
                eof = 1;
                if (!first)
                    break;
            }
            req.text.data = buf;
            req.text.len = (size_t)n;
            sent = (uint64_t)n;
        }
        if (!first && sent == 0)
            break;
        st = hyla_rpc_stream_write(a->s, &req.base);
        if (st != HYLA_OK) {
            if (!hyla_rpc_stream_result(a->s, NULL)) /* a local refusal (e.g. size): end the call */
                writer_fail(a, st);
            break; /* else: the call is over; its status tells why */
        }
        first = 0;
        pthread_mutex_lock(&a->mu);
        a->prog.bytes_sent += sent;
        pthread_mutex_unlock(&a->mu);
    }
    if (st == HYLA_OK)
        hyla_rpc_stream_close_send(a->s);
    free(buf);
    pthread_mutex_lock(&a->mu);
    a->writer_done = 1;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

static hyla_status append_run(hyla_client *c, append_ctx *a, hyla_append_progress *final) {
    if (final)
        memset(final, 0, sizeof *final);
    HYLA_TRY(check_id("Append", a->session_id));
    char what[160];
    snprintf(what, sizeof what, "Append %s", a->session_id);
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->cv, NULL);
    a->t0 = hyla_now();
    hyla_rpc_call_opts o = call_opts(c, c->p.stream_timeout_ms);
    hyla_status st = hyla_rpc_stream_open_async(c->rpc, M_SESSIONS "Append", &hyla__v1__append_progress__descriptor,
                                                &o, append_on_msg, a, &a->s);
    if (st != HYLA_OK) {
        tl_code = HYLA_CODE_LOCAL;
        hyla_fail_wrap(st, "%s", what);
        goto out;
    }
    pthread_t writer;
    int e = pthread_create(&writer, NULL, append_writer, a);
    if (e != 0) {
        hyla_rpc_stream_destroy(a->s);
        st = local_fail(HYLA_ERR_NOMEM, "%s: pthread_create: %s", what, strerror(e));
        goto out;
    }

    int cancelled_by_user = 0;
    pthread_mutex_lock(&a->mu);
    for (;;) {
        if (a->prog_new) {
            a->prog_new = 0;
            hyla_append_progress snap = a->prog;
            snap.elapsed_s = hyla_now() - a->t0;
            pthread_mutex_unlock(&a->mu);
            int stop = a->p.progress ? a->p.progress(&snap, a->p.progress_ud) : 0;
            pthread_mutex_lock(&a->mu);
            if (stop && !a->cancel) {
                a->cancel = 1;
                cancelled_by_user = 1;
                pthread_mutex_unlock(&a->mu);
                hyla_rpc_stream_cancel(a->s);
                pthread_mutex_lock(&a->mu);
            }
            continue;
        }
        if (a->stream_over && a->writer_done)
            break;
        pthread_cond_wait(&a->cv, &a->mu);
    }
    hyla_append_progress last = a->prog;
    last.elapsed_s = hyla_now() - a->t0;
    int local = a->writer_local_fail;
    hyla_status wst = a->writer_st;
    char werr[1024];
    snprintf(werr, sizeof werr, "%s", a->writer_err);
    pthread_mutex_unlock(&a->mu);
    pthread_join(writer, NULL);

    hyla_rpc_result r;
    memset(&r, 0, sizeof r);
    hyla_rpc_stream_result(a->s, &r);
    hyla_rpc_stream_destroy(a->s);
    if (final)
        *final = last;
    if (local) {
        st = local_fail(wst, "%s: %s", what, werr);
    } else if (cancelled_by_user) {
        st = local_fail(HYLA_ERR_CANCELLED, "%s: cancelled by the caller after %llu token(s) were ingested", what,
                        (unsigned long long)last.tokens_ingested);
    } else if (r.code != HYLA_RPC_OK) {
        char extra[160];
        snprintf(extra, sizeof extra, "; %llu token(s) were ingested before the failure",
                 (unsigned long long)last.tokens_ingested);
        st = rpc_fail(c, what, &r, last.tokens_ingested ? extra : NULL);
    } else {
        tl_code = HYLA_CODE_OK;
        st = HYLA_OK;
    }
out:
    pthread_cond_destroy(&a->cv);
    pthread_mutex_destroy(&a->mu);
    return st;
}

static void append_init(append_ctx *a, hyla_client *c, const char *session_id, const hyla_append_params *params) {
    memset(a, 0, sizeof *a);
    a->c = c;
    a->session_id = session_id;
    a->p = params ? *params : hyla_append_default_params();
}

hyla_status hyla_client_append_text(hyla_client *c, const char *session_id, const void *text, size_t len,
                                    const hyla_append_params *params, hyla_append_progress *final) {
    HYLA_ASSERT(c && (text || len == 0));
    append_ctx a;
    append_init(&a, c, session_id, params);
    a.kind = SRC_TEXT;
    a.text = text;
    a.len = len;
    if (!a.p.total_bytes_hint)
        a.p.total_bytes_hint = len;
    a.prog.total_bytes = a.p.total_bytes_hint;
    return append_run(c, &a, final);
}

hyla_status hyla_client_append_tokens(hyla_client *c, const char *session_id, const int32_t *ids, size_t n,
                                      const hyla_append_params *params, hyla_append_progress *final) {
    HYLA_ASSERT(c && (ids || n == 0));
    append_ctx a;
    append_init(&a, c, session_id, params);
    a.kind = SRC_TOKENS;
    a.ids = ids;
    a.n_ids = n;
    if (!a.p.total_tokens_hint)
        a.p.total_tokens_hint = n;
    a.prog.total_bytes = 4 * (uint64_t)n;
    return append_run(c, &a, final);
}

hyla_status hyla_client_append_reader(hyla_client *c, const char *session_id, hyla_read_fn read, void *ud,
                                      const hyla_append_params *params, hyla_append_progress *final) {
    HYLA_ASSERT(c && read);
    append_ctx a;
    append_init(&a, c, session_id, params);
    a.kind = SRC_READER;
    a.read = read;
    a.read_ud = ud;
    a.prog.total_bytes = a.p.total_bytes_hint;
    return append_run(c, &a, final);
}

/* ---------------------------------------------------------------------------------------- */
/* Generate                                                                                  */

hyla_generate_params hyla_generate_default_params(void) {
    hyla_generate_params p;
    memset(&p, 0, sizeof p);
    p.max_tokens = 128;
    return p;
}

static hyla_finish_reason finish_from_pb(int f) {
    return f >= HYLA_FINISH_LENGTH && f <= HYLA_FINISH_EOS ? (hyla_finish_reason)f : HYLA_FINISH_NONE;
}

hyla_status hyla_client_generate(hyla_client *c, const char *session_id, const hyla_generate_params *params,
                                 hyla_generate_result *result) {
    HYLA_ASSERT(c);
    hyla_generate_params dflt = hyla_generate_default_params();
    if (!params)
        params = &dflt;
    hyla_generate_result res;
    memset(&res, 0, sizeof res);
    res.server_delivered = -1;
    res.first_token_s = -1;
    if (result)
        *result = res;
    HYLA_TRY(check_id("Generate", session_id));
    char what[160];
    snprintf(what, sizeof what, "Generate %s", session_id);
    if (params->max_tokens == 0)
        return local_fail(HYLA_ERR_INVALID_ARG, "%s: max_tokens must be >= 1", what);
    for (size_t i = 0; i < params->n_stop; i++)
        if (!params->stop[i] || !params->stop[i][0])
            return local_fail(HYLA_ERR_INVALID_ARG, "%s: stop sequence %zu is empty", what, i);

    Hyla__V1__GenerateRequest req = HYLA__V1__GENERATE_REQUEST__INIT;
    Hyla__V1__SamplingParams sp;
    req.session_id = (char *)session_id;
    req.max_tokens = params->max_tokens;
    req.stop = (char **)params->stop;
    req.n_stop = params->n_stop;
    req.stop_token_ids = (int32_t *)params->stop_token_ids;
    req.n_stop_token_ids = params->n_stop_token_ids;
    if (params->has_sampling) {
        sampling_to_pb(&params->sampling, &sp);
        req.sampling = &sp;
    }
    req.reseed = params->reseed != 0;
    req.seed = params->seed;
    req.ignore_eos = params->ignore_eos != 0;

    double t0 = hyla_now();
    hyla_rpc_call_opts o = call_opts(c, c->p.stream_timeout_ms);
    hyla_rpc_stream *s = NULL;
    hyla_status st = hyla_rpc_stream_open(c->rpc, M_SESSIONS "Generate", &hyla__v1__generate_response__descriptor, &o,
                                          &s);
    if (st != HYLA_OK) {
        tl_code = HYLA_CODE_LOCAL;
        return hyla_fail_wrap(st, "%s", what);
    }
    int write_failed = 0;
    if (hyla_rpc_stream_write(s, &req.base) != HYLA_OK)
        write_failed = !hyla_rpc_stream_result(s, NULL); /* a local refusal; else the status says */
    if (write_failed) {
        char err[1024];
        snprintf(err, sizeof err, "%s", hyla_last_error());
        hyla_rpc_stream_destroy(s);
        return local_fail(HYLA_ERR_INVALID_ARG, "%s: %s", what, err);
    }
    hyla_rpc_stream_close_send(s);

    int cancelled = 0, bad = 0;
    for (;;) {
        ProtobufCMessage *m = NULL;
        st = hyla_rpc_stream_read(s, &m);
        if (!m) {
            bad = st == HYLA_ERR_FORMAT;
            break;
        }
        Hyla__V1__GenerateResponse *g = (Hyla__V1__GenerateResponse *)m;
        if (g->n_token_ids || g->text.len) {
            hyla_token_piece piece;
            piece.token_ids = g->token_ids;
            piece.n_token_ids = g->n_token_ids;
            piece.text = (const char *)g->text.data;
            piece.text_len = g->text.len;
            piece.position = g->position;
            piece.delivered = res.delivered;
            if (res.first_token_s < 0)
                res.first_token_s = hyla_now() - t0;
            res.delivered += (uint32_t)g->n_token_ids;
            res.position = g->position;
            if (params->on_token && params->on_token(&piece, params->ud)) {
                cancelled = 1;
                protobuf_c_message_free_unpacked(m, NULL);
                hyla_rpc_stream_cancel(s);
                break;
            }
        } else if (g->position) {
            res.position = g->position;
        }
        if (g->done) {
            res.finish = finish_from_pb((int)g->finish_reason);
            res.server_delivered = g->tokens_delivered;
        }
        protobuf_c_message_free_unpacked(m, NULL);
    }
    hyla_rpc_result r;
    memset(&r, 0, sizeof r);
    hyla_rpc_stream_finish(s, &r);
    if (r.code != HYLA_RPC_OK) {
        const char *tr = hyla_rpc_stream_trailer(s, HYLA_API_TOKENS_DELIVERED_KEY);
        char *end = NULL;
        long long v = tr ? strtoll(tr, &end, 10) : -1;
        if (tr && end != tr && *end == 0 && v >= 0)
            res.server_delivered = v;
        res.finish = HYLA_FINISH_NONE;
    }
    hyla_rpc_stream_destroy(s);
    res.elapsed_s = hyla_now() - t0;
    if (result)
        *result = res;

    if (cancelled)
        return local_fail(HYLA_ERR_CANCELLED, "%s: stopped by the caller after %u token(s)", what, res.delivered);
    if (r.code != HYLA_RPC_OK) {
        char extra[256];
        if (res.delivered)
            snprintf(extra, sizeof extra, "; %u token(s) were delivered before the failure%s", res.delivered,
                     r.code == HYLA_RPC_ABORTED ? "; the session kept them: call generate again to continue"
                     : r.code == HYLA_RPC_UNAVAILABLE
                         ? "; call generate again to continue (from the session's last durable state)"
                         : "");
        else
            extra[0] = 0;
        return rpc_fail(c, what, &r, extra);
    }
    if (bad)
        return local_fail(HYLA_ERR_FORMAT, "%s: a response did not decode", what);
    if (res.finish == HYLA_FINISH_NONE)
        return local_fail(HYLA_ERR_FORMAT, "%s: the server ended the stream without a final message (done)", what);
    tl_code = HYLA_CODE_OK;
    return HYLA_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Cluster                                                                                   */

static hyla_status cluster_sessions_page(hyla_client *c, hyla_tier tier, const char *worker, const char *tenant,
                                         uint32_t page_size, const char *token,
                                         Hyla__V1__ListClusterSessionsResponse **out) {
    Hyla__V1__ListClusterSessionsRequest req = HYLA__V1__LIST_CLUSTER_SESSIONS_REQUEST__INIT;
    req.tier = (Hyla__V1__Tier)tier;
    req.worker_id = (char *)(worker ? worker : "");
    req.tenant = (char *)(tenant ? tenant : "");
    req.page_size = page_size;
    req.page_token = (char *)token;
    ProtobufCMessage *resp = NULL;
    HYLA_TRY(unary(c, M_CLUSTER "ListClusterSessions", "ListClusterSessions", &req.base,
                   &hyla__v1__list_cluster_sessions_response__descriptor, &resp, c->p.call_timeout_ms));
    *out = (Hyla__V1__ListClusterSessionsResponse *)resp;
    return HYLA_OK;
}

hyla_status hyla_client_cluster_status(hyla_client *c, hyla_cluster_status *out) {
    HYLA_ASSERT(c && out);
    memset(out, 0, sizeof *out);
    Hyla__V1__ListWorkersRequest req = HYLA__V1__LIST_WORKERS_REQUEST__INIT;
    ProtobufCMessage *resp = NULL;
    HYLA_TRY(unary(c, M_CLUSTER "ListWorkers", "ListWorkers", &req.base, &hyla__v1__list_workers_response__descriptor,
                   &resp, c->p.call_timeout_ms));
    Hyla__V1__ListWorkersResponse *r = (Hyla__V1__ListWorkersResponse *)resp;
    out->workers = xcalloc(r->n_workers, sizeof *out->workers);
    for (size_t i = 0; i < r->n_workers; i++)
        worker_from_pb(r->workers[i], &out->workers[i]);
    out->n_workers = r->n_workers;
    out->groups = xcalloc(r->n_groups, sizeof *out->groups);
    for (size_t i = 0; i < r->n_groups; i++) {
        const Hyla__V1__WorkerGroup *g = r->groups[i];
        hyla_group_info *d = &out->groups[i];
        d->id = xstrdup(g->group_id);
        d->model = xstrdup(g->model);
        d->worker_ids = strv_dup(g->worker_ids, g->n_worker_ids);
        d->n_worker_ids = g->n_worker_ids;
        d->complete = g->complete;
        d->sessions = g->sessions;
    }
    out->n_groups = r->n_groups;
    protobuf_c_message_free_unpacked(resp, NULL);

    Hyla__V1__ListClusterSessionsResponse *cs = NULL;
    hyla_status st = cluster_sessions_page(c, HYLA_TIER_UNKNOWN, NULL, NULL, 1, "", &cs);
    if (st != HYLA_OK) {
        hyla_cluster_status_clear(out);
        return st;
    }
    out->sessions_gpu = cs->sessions_gpu;
    out->sessions_host = cs->sessions_host;
    out->sessions_store = cs->sessions_store;
    protobuf_c_message_free_unpacked(&cs->base, NULL);
    return HYLA_OK;
}

typedef struct {
    hyla_tier tier;
    const char *worker, *tenant;
} cluster_filter;

static hyla_status cluster_filter_page(hyla_client *c, const void *arg, const char *token, session_page *pg) {
    const cluster_filter *f = arg;
    Hyla__V1__ListClusterSessionsResponse *r = NULL;
    HYLA_TRY(cluster_sessions_page(c, f->tier, f->worker, f->tenant, 0, token, &r));
    *pg = (session_page){&r->base, r->sessions, r->n_sessions, r->next_page_token};
    return HYLA_OK;
}

hyla_status hyla_client_cluster_sessions(hyla_client *c, hyla_tier tier, const char *worker, const char *tenant,
                                         hyla_session_list *out) {
    HYLA_ASSERT(c && out);
    cluster_filter f = {tier, worker, tenant};
    return session_pages(c, "ListClusterSessions", cluster_filter_page, &f, out);
}

hyla_status hyla_client_drain_worker(hyla_client *c, const char *worker_id, int wait, hyla_drain_result *out) {
    HYLA_ASSERT(c);
    if (out)
        memset(out, 0, sizeof *out);
    if (!worker_id || !worker_id[0])
        return local_fail(HYLA_ERR_INVALID_ARG, "DrainWorker: the worker id is empty");
    Hyla__V1__DrainWorkerRequest req = HYLA__V1__DRAIN_WORKER_REQUEST__INIT;
    req.worker_id = (char *)worker_id;
    req.wait = wait != 0;
    char what[160];
    snprintf(what, sizeof what, "DrainWorker %s", worker_id);
    ProtobufCMessage *resp = NULL;
    HYLA_TRY(unary(c, M_CLUSTER "DrainWorker", what, &req.base, &hyla__v1__drain_worker_response__descriptor, &resp,
                   wait ? c->p.stream_timeout_ms : c->p.call_timeout_ms));
    Hyla__V1__DrainWorkerResponse *r = (Hyla__V1__DrainWorkerResponse *)resp;
    if (out) {
        out->state = r->worker ? worker_state_from_pb((int)r->worker->state) : HYLA_WORKER_UNKNOWN;
        out->sessions_moved = r->sessions_moved;
        out->sessions_remaining = r->sessions_remaining;
        snprintf(out->last_error, sizeof out->last_error, "%s", r->last_error ? r->last_error : "");
    }
    protobuf_c_message_free_unpacked(resp, NULL);
    return HYLA_OK;
}
