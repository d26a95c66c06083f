/* hyla_coord.c — the coordinator: membership, the session directory, placement, routing.
 *
 * State. Everything lives in memory under one lock (c->mu): workers, sessions (sorted by id)
 * and the epoch counter; the session directory on disk (hyla_coord_dir) mirrors the sessions
 * and is written under the same lock, so memory and disk never disagree in order.
 *
 * Invariants.
 *   - A session is ACTIVE with a group and a placement epoch, or PAUSED (tier STORE) with
 *     neither; MOVING only while a call places it. Placement epochs only grow (one counter,
 *     persisted with the record that uses it), so a stale owner is always recognisable.
 *   - Placement-changing operations on one session are serialized by its `busy` flag (taken
 *     by acquire_session, on call threads only); the lock is never held across a network call.
 *   - Sessions of a group without a complete set of live workers are unplaced (PAUSED, from
 *     their last durable snapshot) by the monitor, after a grace period at start so that workers
 *     can re-register after a coordinator restart. The next call that needs one places it again.
 *
 * Threading. rpc loop threads run the handlers of memory-only calls (Get/List, the Cluster
 * listing, the Coordinator service) inline; calls that wait on workers or disk-heavy work run on
 * a detached job thread each (c->jobs counts them; shutdown waits for them). Relayed streams
 * (Generate, Append) use an async client stream towards the worker; Append adds a job thread
 * that writes the client's chunks with back-pressure. A monitor thread checks heartbeats. */
#include "hyla_coord.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hyla_api.h"
#include "hyla_coord_dir.h"
#include "hyla_log.h"
#include "hyla_rpc.h"
#include "hyla_store.h"
#include "hyla_store_rpc.h"
#include "hyla_util.h"

#define SVC_SESSIONS "/hyla.v1.Sessions/"
#define SVC_CLUSTER "/hyla.v1.Cluster/"
#define SVC_COORD "/hyla.v1.Coordinator/"
#define SVC_WORKER "/hyla.v1.Worker/"
#define ID_MAX 128
#define SID_MAX 32
#define MAX_STAGES 16
#define PAGE_DEFAULT 100
#define PAGE_MAX 1000
#define APPEND_QUEUE_HOLD 8   /* client chunks buffered before reading from the client pauses */
#define APPEND_QUEUE_RESUME 2

typedef Hyla__V1__Session Session;

typedef struct {
    char id[ID_MAX], address[256], model[ID_MAX], version[64];
    uint64_t fingerprint, param_bytes, state_budget;
    uint32_t num_layers, lb, le;
    char dev_name[64], dev_desc[256];
    uint64_t mem_total, mem_free;
    int state; /* Hyla__V1__WorkerState */
    uint64_t epoch;
    int64_t registered_ms, hb_ms;
    double hb_mono;
    Hyla__V1__WorkerLoad load; /* scalar fields only */
    char group[ID_MAX];
    char told_next[256]; /* next stage's address as told at registration */
    int reconcile; /* the first heartbeat after registration reconciles its sessions */
    uint32_t sessions_reported;
    char drain_error[512]; /* its last heartbeat's drain_error: why a handover failed (DrainWorker) */
    hyla_rpc_client *client; /* to its Worker service */
} cworker;

typedef struct {
    char id[SID_MAX], tenant[ID_MAX], model[ID_MAX], group[ID_MAX], parent[SID_MAX];
    int state, tier;
    uint64_t position, generated, seed, epoch;
    float temperature, top_p;
    int32_t top_k;
    Hyla__V1__SnapshotInfo snap; /* scalar fields only */
    int64_t created_ms, updated_ms;
    char error[256];
    int busy, refs, deleted;
} csess;

typedef struct {
    hyla_coord *c;
    void (*fn)(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *req, const char *tenant);
    int inline_call; /* run on the loop thread (memory only) */
} binding;

struct hyla_coord {
    hyla_coord_params p;
    char listen[256], advertise[256], store_addr[256], data_dir[1024];
    hyla_rpc_server *srv;
    int port;
    hyla_coord_dir *dir;
    hyla_store *store;

    pthread_mutex_t mu;
    pthread_cond_t cv; /* session busy flags, job count, worker changes */
    cworker **workers;
    size_t n_workers, cap_workers;
    csess **sess; /* sorted by id */
    size_t n_sess, cap_sess;
    uint64_t epoch_counter;
    hyla_rng rng;
    double started_mono;
    int stopping, jobs;
    pthread_t monitor;
    int monitor_started;
    hyla_rpc_client **retired;
    size_t n_retired;
    int stop_pipe[2];
    binding bindings[32];
    int n_bindings;
    hyla_store_rpc_hooks hooks; /* borrowed by the StateStore service */
    int relays;                 /* relayed streams alive (their worker streams must end first) */
};

static int64_t now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static void copy_str(char *dst, size_t cap, const char *src) { snprintf(dst, cap, "%s", src ? src : ""); }

/* ------------------------------------------------------------------------------------------ */
/* sessions in memory                                                                          */

/* Index of id, or -(insertion point) - 1. */
static long sess_search(const hyla_coord *c, const char *id) {
    size_t lo = 0, hi = c->n_sess;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int r = strcmp(c->sess[mid]->id, id);
        if (r == 0)
            return (long)mid;
        if (r < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -(long)lo - 1;
}

static csess *sess_find(const hyla_coord *c, const char *id) {
    long i = sess_search(c, id);
    return i >= 0 ? c->sess[i] : NULL;
}

static void sess_insert_locked(hyla_coord *c, csess *s) {
    long i = sess_search(c, s->id);
    HYLA_ASSERT(i < 0);
    size_t at = (size_t)(-i - 1);
    if (c->n_sess == c->cap_sess) {
        size_t cap = c->cap_sess ? 2 * c->cap_sess : 64;
        csess **n = realloc(c->sess, cap * sizeof *n);
        HYLA_ASSERT(n);
        c->sess = n;
        c->cap_sess = cap;
    }
    memmove(c->sess + at + 1, c->sess + at, (c->n_sess - at) * sizeof *c->sess);
    c->sess[at] = s;
    c->n_sess++;
    s->refs++;
}

static void sess_unref_locked(csess *s) {
    if (--s->refs == 0)
        free(s);
}

static void sess_remove_locked(hyla_coord *c, csess *s) {
    long i = sess_search(c, s->id);
    if (i < 0)
        return;
    memmove(c->sess + i, c->sess + i + 1, (c->n_sess - (size_t)i - 1) * sizeof *c->sess);
    c->n_sess--;
    s->deleted = 1;
    sess_unref_locked(s);
}

static csess *sess_new(void) {
    csess *s = calloc(1, sizeof *s);
    HYLA_ASSERT(s);
    hyla__v1__snapshot_info__init(&s->snap);
    s->state = HYLA__V1__SESSION_STATE__SESSION_PAUSED;
    s->tier = HYLA__V1__TIER__TIER_STORE;
    s->created_ms = s->updated_ms = now_ms();
    return s;
}

static void new_session_id_locked(hyla_coord *c, char *out) {
    do
        snprintf(out, SID_MAX, "s-%016llx", (unsigned long long)hyla_rng_next(&c->rng));
    while (sess_find(c, out));
}

/* Take a session for a placement-changing operation: waits while another holds it. Checks the
 * tenant. On failure returns NULL with *code and msg set. Release with release_session. */
static csess *acquire_session(hyla_coord *c, const char *id, const char *tenant, hyla_rpc_code *code, char *msg,
                              size_t cap) {
    pthread_mutex_lock(&c->mu);
    csess *s = sess_find(c, id);
    if (!s) {
        *code = HYLA_RPC_NOT_FOUND;
        snprintf(msg, cap, "session %s not found", id);
        pthread_mutex_unlock(&c->mu);
        return NULL;
    }
    if (tenant && strcmp(s->tenant, tenant) != 0) {
        *code = HYLA_RPC_PERMISSION_DENIED;
        snprintf(msg, cap, "session %s belongs to another tenant", id);
        pthread_mutex_unlock(&c->mu);
        return NULL;
    }
    s->refs++;
    while (s->busy && !s->deleted)
        pthread_cond_wait(&c->cv, &c->mu);
    if (s->deleted) {
        sess_unref_locked(s);
        *code = HYLA_RPC_NOT_FOUND;
        snprintf(msg, cap, "session %s was deleted", id);
        pthread_mutex_unlock(&c->mu);
        return NULL;
    }
    s->busy = 1;
    pthread_mutex_unlock(&c->mu);
    return s;
}

static void release_session(hyla_coord *c, csess *s) {
    pthread_mutex_lock(&c->mu);
    s->busy = 0;
    pthread_cond_broadcast(&c->cv);
    sess_unref_locked(s);
    pthread_mutex_unlock(&c->mu);
}

/* ------------------------------------------------------------------------------------------ */
/* workers and groups                                                                          */

static cworker *worker_find(const hyla_coord *c, const char *id) {
    for (size_t i = 0; i < c->n_workers; i++)
        if (strcmp(c->workers[i]->id, id) == 0)
            return c->workers[i];
    return NULL;
}

static int worker_alive(const cworker *w) {
    return w->state == HYLA__V1__WORKER_STATE__WORKER_READY || w->state == HYLA__V1__WORKER_STATE__WORKER_DRAINING;
}

static int by_layer(const void *a, const void *b) {
    const cworker *x = *(cworker *const *)a, *y = *(cworker *const *)b;
    return x->lb < y->lb ? -1 : x->lb > y->lb;
}

/* Live members of a group in stage (layer) order; returns their count. */
static int group_members_locked(const hyla_coord *c, const char *group, cworker **out) {
    int n = 0;
    for (size_t i = 0; i < c->n_workers && n < MAX_STAGES; i++)
        if (worker_alive(c->workers[i]) && strcmp(c->workers[i]->group, group) == 0)
            out[n++] = c->workers[i];
    qsort(out, (size_t)n, sizeof *out, by_layer);
    return n;
}

/* Whether live members tile [0, num_layers) exactly. */
static int group_complete_locked(const hyla_coord *c, const char *group) {
    cworker *m[MAX_STAGES];
    int n = group_members_locked(c, group, m);
    if (n == 0)
        return 0;
    uint32_t next = 0;
    for (int i = 0; i < n; i++) {
        if (m[i]->lb != next || m[i]->fingerprint != m[0]->fingerprint)
            return 0;
        next = m[i]->le;
    }
    return next == m[0]->num_layers;
}

/* A complete group whose members all take new sessions. */
static int group_placeable_locked(const hyla_coord *c, const char *group) {
    if (!group_complete_locked(c, group))
        return 0;
    cworker *m[MAX_STAGES];
    int n = group_members_locked(c, group, m);
    for (int i = 0; i < n; i++) {
        if (m[i]->state != HYLA__V1__WORKER_STATE__WORKER_READY)
            return 0;
        /* a pipeline stage must know its next stage (it learns it when it registers again) */
        if (strcmp(m[i]->told_next, i + 1 < n ? m[i + 1]->address : "") != 0)
            return 0;
    }
    return 1;
}

static uint32_t group_sessions_locked(const hyla_coord *c, const char *group) {
    uint32_t n = 0;
    for (size_t i = 0; i < c->n_sess; i++)
        if (c->sess[i]->state == HYLA__V1__SESSION_STATE__SESSION_ACTIVE && strcmp(c->sess[i]->group, group) == 0)
            n++;
    return n;
}

/* The group a new worker joins: its own for a whole model; else a pipeline of its model whose
 * live members do not overlap its range (or a new one). */
static void assign_group_locked(hyla_coord *c, cworker *w) {
    if (w->lb == 0 && w->le == w->num_layers) {
        snprintf(w->group, sizeof w->group, "g-%.120s", w->id);
        return;
    }
    for (size_t i = 0; i < c->n_workers; i++) {
        cworker *o = c->workers[i];
        if (o == w || !worker_alive(o) || o->fingerprint != w->fingerprint || strncmp(o->group, "p-", 2) != 0)
            continue;
        if (group_complete_locked(c, o->group))
            continue;
        cworker *m[MAX_STAGES];
        int n = group_members_locked(c, o->group, m), overlap = 0;
        for (int k = 0; k < n; k++)
            if (m[k] != w && m[k]->lb < w->le && w->lb < m[k]->le)
                overlap = 1;
        if (!overlap && n < MAX_STAGES) {
            copy_str(w->group, sizeof w->group, o->group);
            return;
        }
    }
    snprintf(w->group, sizeof w->group, "p-%.120s", w->id);
}

static uint32_t worker_stage_locked(const hyla_coord *c, const cworker *w) {
    cworker *m[MAX_STAGES];
    int n = group_members_locked(c, w->group, m);
    for (int i = 0; i < n; i++)
        if (m[i] == w)
            return (uint32_t)i;
    return 0;
}

/* Resolve the model of a request: empty means "the only model served". */
static hyla_rpc_code resolve_model_locked(const hyla_coord *c, const char *want, char *out, char *msg, size_t cap) {
    if (want && want[0]) {
        for (size_t i = 0; i < c->n_workers; i++)
            if (strcmp(c->workers[i]->model, want) == 0) {
                copy_str(out, ID_MAX, want);
                return HYLA_RPC_OK;
            }
        snprintf(msg, cap, "no worker serves model '%s'", want);
        return HYLA_RPC_NOT_FOUND;
    }
    char models[1024] = "";
    int n = 0;
    for (size_t i = 0; i < c->n_workers; i++) {
        const cworker *w = c->workers[i];
        if (!worker_alive(w))
            continue;
        int seen = 0;
        for (size_t j = 0; j < i; j++)
            if (worker_alive(c->workers[j]) && strcmp(c->workers[j]->model, w->model) == 0)
                seen = 1;
        if (seen)
            continue;
        if (n++ == 0)
            copy_str(out, ID_MAX, w->model);
        size_t l = strlen(models);
        snprintf(models + l, sizeof models - l, "%s%s", l ? ", " : "", w->model);
    }
    if (n == 1)
        return HYLA_RPC_OK;
    if (n == 0) {
        snprintf(msg, cap, "no live worker serves any model");
        return HYLA_RPC_UNAVAILABLE;
    }
    snprintf(msg, cap, "field model: the cluster serves several models (%s); name one", models);
    return HYLA_RPC_INVALID_ARGUMENT;
}

/* The least-loaded placeable group of model (or hint's group), other than exclude. */
static hyla_rpc_code pick_group_locked(const hyla_coord *c, const char *model, const char *hint, const char *exclude,
                                       char *out, char *msg, size_t cap) {
    if (hint && hint[0]) {
        const cworker *w = worker_find(c, hint);
        if (!w) {
            snprintf(msg, cap, "worker '%s' not found", hint);
            return HYLA_RPC_NOT_FOUND;
        }
        if (strcmp(w->model, model) != 0) {
            snprintf(msg, cap, "worker '%s' serves model '%s', not '%s'", hint, w->model, model);
            return HYLA_RPC_INVALID_ARGUMENT;
        }
        if (exclude && strcmp(w->group, exclude) == 0) {
            snprintf(msg, cap, "worker '%s' already holds the session", hint);
            return HYLA_RPC_INVALID_ARGUMENT;
        }
        if (group_placeable_locked(c, w->group)) {
            copy_str(out, ID_MAX, w->group);
            return HYLA_RPC_OK;
        }
        /* a hint that cannot serve now falls back to any group */
    }
    /* least loaded: groups whose state memory is not over its budget first, then the fewest
     * sessions, then the fewest calls in progress, then the group id */
    const char *best = NULL;
    uint32_t best_load = 0;
    uint32_t best_calls = 0;
    int best_full = 0;
    int any = 0;
    for (size_t i = 0; i < c->n_workers; i++) {
        const cworker *w = c->workers[i];
        if (strcmp(w->model, model) != 0)
            continue;
        any = 1;
        if (!group_placeable_locked(c, w->group) || (exclude && strcmp(w->group, exclude) == 0))
            continue;
        uint32_t load = group_sessions_locked(c, w->group), calls = w->load.active_calls;
        int full = w->load.state_budget_bytes && w->load.state_bytes >= w->load.state_budget_bytes;
        if (!best || full < best_full ||
            (full == best_full && (load < best_load || (load == best_load && calls < best_calls) ||
                                   (load == best_load && calls == best_calls && strcmp(w->group, best) < 0)))) {
            best = w->group;
            best_load = load;
            best_calls = calls;
            best_full = full;
        }
    }
    if (best) {
        copy_str(out, ID_MAX, best);
        return HYLA_RPC_OK;
    }
    if (!any) {
        snprintf(msg, cap, "no worker serves model '%s'", model);
        return HYLA_RPC_NOT_FOUND;
    }
    snprintf(msg, cap, "no live worker group can take a session of model '%s'%s", model,
             exclude ? " (other than its current one)" : "");
    return HYLA_RPC_UNAVAILABLE;
}

/* ------------------------------------------------------------------------------------------ */
/* views and persistence                                                                       */

typedef struct {
    Session s;
    Hyla__V1__SamplingParams sp;
    Hyla__V1__SnapshotInfo si;
    char *wids[MAX_STAGES];
    char wid_store[MAX_STAGES][ID_MAX];
    csess copy;
} sess_view;

/* Fill v from s (c->mu held); v references only its own storage. */
static void view_make_locked(const hyla_coord *c, const csess *s, sess_view *v) {
    v->copy = *s;
    const csess *k = &v->copy;
    hyla__v1__session__init(&v->s);
    hyla__v1__sampling_params__init(&v->sp);
    v->si = k->snap;
    v->sp.temperature = k->temperature;
    v->sp.top_k = k->top_k;
    v->sp.top_p = k->top_p;
    v->s.session_id = v->copy.id;
    v->s.tenant = v->copy.tenant;
    v->s.model = v->copy.model;
    v->s.state = (Hyla__V1__SessionState)k->state;
    v->s.tier = (Hyla__V1__Tier)k->tier;
    v->s.group_id = v->copy.group;
    v->s.position = k->position;
    v->s.generated = k->generated;
    v->s.sampling = &v->sp;
    v->s.seed = k->seed;
    v->s.last_snapshot = &v->si;
    v->s.parent_session_id = v->copy.parent;
    v->s.created_unix_ms = k->created_ms;
    v->s.updated_unix_ms = k->updated_ms;
    v->s.error = v->copy.error;
    if (c && k->group[0]) {
        cworker *m[MAX_STAGES];
        int n = group_members_locked(c, k->group, m);
        for (int i = 0; i < n; i++) {
            copy_str(v->wid_store[i], ID_MAX, m[i]->id);
            v->wids[i] = v->wid_store[i];
        }
        v->s.n_worker_ids = (size_t)n;
        v->s.worker_ids = v->wids;
    }
}

/* Write s's record (c->mu held). counter: also persist the epoch counter. */
static hyla_status persist_locked(hyla_coord *c, csess *s, int sync, int counter) {
    s->updated_ms = now_ms();
    sess_view *v = malloc(sizeof *v);
    HYLA_ASSERT(v);
    view_make_locked(NULL, s, v);
    hyla_status st = hyla_coord_dir_put(c->dir, &v->s, s->epoch, counter ? c->epoch_counter : 0, sync);
    free(v);
    if (st != HYLA_OK)
        HYLA_ERROR("coordinator: %s", hyla_last_error());
    return st;
}

/* Take a session off its group: it waits in the store for its next placement. */
static void unplace_locked(hyla_coord *c, csess *s, const char *why) {
    if (s->state != HYLA__V1__SESSION_STATE__SESSION_ACTIVE)
        return;
    HYLA_INFO("coordinator: session %s leaves group %s (%s); it resumes from snapshot version %llu", s->id, s->group,
              why, (unsigned long long)s->snap.version);
    s->state = HYLA__V1__SESSION_STATE__SESSION_PAUSED;
    s->tier = HYLA__V1__TIER__TIER_STORE;
    s->group[0] = 0;
    if (s->snap.version) {
        s->position = s->snap.position;
    } else {
        s->position = 0;
        s->generated = 0;
    }
    persist_locked(c, s, 1, 0);
}

static hyla_status load_session_fn(void *ud, const Session *m, uint64_t epoch) {
    hyla_coord *c = ud;
    if (strlen(m->session_id) >= SID_MAX)
        return hyla_fail(HYLA_ERR_FORMAT, "session directory: session id '%s' is too long", m->session_id);
    csess *s = sess_new();
    copy_str(s->id, sizeof s->id, m->session_id);
    copy_str(s->tenant, sizeof s->tenant, m->tenant);
    copy_str(s->model, sizeof s->model, m->model);
    copy_str(s->group, sizeof s->group, m->group_id);
    copy_str(s->parent, sizeof s->parent, m->parent_session_id);
    copy_str(s->error, sizeof s->error, m->error);
    s->state = m->state;
    s->tier = m->tier;
    if (s->state == HYLA__V1__SESSION_STATE__SESSION_MOVING) { /* a placement the crash interrupted */
        s->state = HYLA__V1__SESSION_STATE__SESSION_PAUSED;
        s->tier = HYLA__V1__TIER__TIER_STORE;
        s->group[0] = 0;
    }
    s->position = m->position;
    s->generated = m->generated;
    s->seed = m->seed;
    s->epoch = epoch;
    if (m->sampling) {
        s->temperature = m->sampling->temperature;
        s->top_k = m->sampling->top_k;
        s->top_p = m->sampling->top_p;
    }
    if (m->last_snapshot) {
        s->snap = *m->last_snapshot;
        s->snap.base.unknown_fields = NULL;
        s->snap.base.n_unknown_fields = 0;
    }
    s->created_ms = m->created_unix_ms;
    s->updated_ms = m->updated_unix_ms;
    sess_insert_locked(c, s);
    if (epoch > c->epoch_counter)
        c->epoch_counter = epoch;
    return HYLA_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* calls to workers                                                                            */

/* Unary call to a worker (no lock held). */
static hyla_status call_worker(hyla_coord *c, const char *wid, const char *method, const ProtobufCMessage *req,
                               const ProtobufCMessageDescriptor *rd, ProtobufCMessage **resp, hyla_rpc_result *res) {
    pthread_mutex_lock(&c->mu);
    cworker *w = worker_find(c, wid);
    hyla_rpc_client *cl = w && worker_alive(w) ? w->client : NULL;
    pthread_mutex_unlock(&c->mu);
    if (!cl) {
        res->code = HYLA_RPC_UNAVAILABLE;
        snprintf(res->message, sizeof res->message, "worker %s is not live", wid);
        return hyla_fail(HYLA_ERR_UNAVAILABLE, "%s", res->message);
    }
    hyla_rpc_call_opts o = {c->p.worker_timeout_ms, NULL, NULL, 0};
    return hyla_rpc_client_unary(cl, method, req, rd, resp, &o, res);
}

/* Members (ids, in stage order) of s's group; returns their count (c->mu held). */
static int owners_locked(const hyla_coord *c, const csess *s, char ids[MAX_STAGES][ID_MAX]) {
    cworker *m[MAX_STAGES];
    int n = s->group[0] ? group_members_locked(c, s->group, m) : 0;
    for (int i = 0; i < n; i++)
        copy_str(ids[i], ID_MAX, m[i]->id);
    return n;
}

static void unload_on(hyla_coord *c, char ids[MAX_STAGES][ID_MAX], int n, const char *sid, uint64_t epoch) {
    for (int i = 0; i < n; i++) {
        Hyla__V1__UnloadRequest u = HYLA__V1__UNLOAD_REQUEST__INIT;
        u.session_id = (char *)sid;
        u.placement_epoch = epoch;
        ProtobufCMessage *r = NULL;
        hyla_rpc_result res;
        if (call_worker(c, ids[i], SVC_WORKER "Unload", &u.base, &hyla__v1__unload_response__descriptor, &r, &res) ==
            HYLA_OK)
            protobuf_c_message_free_unpacked(r, NULL);
        else
            HYLA_DEBUG("coordinator: unload %s on %s: %s", sid, ids[i], res.message);
    }
}

/* Place s (held busy by the caller) on a group: the hint's, else the least loaded other than
 * exclude; restore snapshot_version there (0: a new empty session). On failure the session is
 * left as it was. */
static hyla_rpc_code place_session(hyla_coord *c, csess *s, const char *hint, const char *exclude,
                                   uint64_t snapshot_version, char *msg, size_t cap) {
    char group[ID_MAX], ids[MAX_STAGES][ID_MAX];
    pthread_mutex_lock(&c->mu);
    hyla_rpc_code code = pick_group_locked(c, s->model, hint, exclude, group, msg, cap);
    int n = 0;
    uint64_t epoch = 0;
    if (code == HYLA_RPC_OK) {
        cworker *m[MAX_STAGES];
        n = group_members_locked(c, group, m);
        for (int i = 0; i < n; i++)
            copy_str(ids[i], ID_MAX, m[i]->id);
        epoch = ++c->epoch_counter;
    }
    Hyla__V1__SamplingParams sp = HYLA__V1__SAMPLING_PARAMS__INIT;
    sp.temperature = s->temperature;
    sp.top_k = s->top_k;
    sp.top_p = s->top_p;
    uint64_t seed = s->seed;
    pthread_mutex_unlock(&c->mu);
    if (code != HYLA_RPC_OK)
        return code;

    uint64_t position = 0, generated = 0;
    int tier = HYLA__V1__TIER__TIER_GPU;
    for (int i = 0; i < n; i++) {
        Hyla__V1__LoadSessionRequest q = HYLA__V1__LOAD_SESSION_REQUEST__INIT;
        q.session_id = s->id;
        q.placement_epoch = epoch;
        q.snapshot_version = snapshot_version;
        q.sampling = &sp;
        q.seed = seed;
        q.stage = (uint32_t)i;
        ProtobufCMessage *r = NULL;
        hyla_rpc_result res;
        if (call_worker(c, ids[i], SVC_WORKER "LoadSession", &q.base, &hyla__v1__worker_session_response__descriptor,
                        &r, &res) != HYLA_OK) {
            hyla_rpc_code rc = res.code == HYLA_RPC_OK ? HYLA_RPC_INTERNAL : res.code;
            if (rc == HYLA_RPC_NOT_FOUND && snapshot_version > 0) {
                /* the store acknowledged this version (the directory recorded it): it lost it */
                snprintf(msg, cap, "session %s: its committed snapshot version %llu is missing from the store: %.700s",
                         s->id, (unsigned long long)snapshot_version, res.message);
                rc = HYLA_RPC_DATA_LOSS;
            } else {
                snprintf(msg, cap, "placing session %s on worker %.120s: %.700s", s->id, ids[i], res.message);
            }
            unload_on(c, ids, i, s->id, epoch);
            return rc;
        }
        const Hyla__V1__WorkerSessionResponse *wr = (const Hyla__V1__WorkerSessionResponse *)r;
        if (i == 0 && wr->session) {
            position = wr->session->position;
            generated = wr->session->generated;
            if (wr->session->tier)
                tier = wr->session->tier;
        }
        protobuf_c_message_free_unpacked(r, NULL);
    }
    pthread_mutex_lock(&c->mu);
    copy_str(s->group, sizeof s->group, group);
    s->epoch = epoch;
    s->state = HYLA__V1__SESSION_STATE__SESSION_ACTIVE;
    s->tier = tier;
    s->position = position;
    s->generated = generated;
    s->error[0] = 0;
    hyla_status st = persist_locked(c, s, 1, 1);
    pthread_mutex_unlock(&c->mu);
    if (st != HYLA_OK) {
        snprintf(msg, cap, "%s", hyla_last_error());
        return HYLA_RPC_INTERNAL;
    }
    HYLA_INFO("coordinator: session %s placed on group %s (epoch %llu, snapshot %llu, position %llu)", s->id, group,
              (unsigned long long)epoch, (unsigned long long)snapshot_version, (unsigned long long)position);
    return HYLA_RPC_OK;
}

/* Make sure s (held busy) is resident where the directory says: an ACTIVE session is checked
 * with DescribeSession (a worker may have lost it), a PAUSED one is placed again. */
static hyla_rpc_code ensure_active(hyla_coord *c, csess *s, char *owner, uint64_t *epoch, char *msg, size_t cap) {
    char ids[MAX_STAGES][ID_MAX];
    pthread_mutex_lock(&c->mu);
    int active = s->state == HYLA__V1__SESSION_STATE__SESSION_ACTIVE;
    int n = active ? owners_locked(c, s, ids) : 0;
    uint64_t ep = s->epoch;
    pthread_mutex_unlock(&c->mu);
    if (active && n > 0) {
        Hyla__V1__DescribeSessionRequest q = HYLA__V1__DESCRIBE_SESSION_REQUEST__INIT;
        q.session_id = s->id;
        ProtobufCMessage *r = NULL;
        hyla_rpc_result res;
        hyla_status st = call_worker(c, ids[0], SVC_WORKER "DescribeSession", &q.base,
                                     &hyla__v1__worker_session_response__descriptor, &r, &res);
        int ok = 0;
        if (st == HYLA_OK) {
            const Hyla__V1__WorkerSessionResponse *wr = (const Hyla__V1__WorkerSessionResponse *)r;
            ok = wr->session && (wr->session->placement_epoch == ep || wr->session->placement_epoch == 0);
            protobuf_c_message_free_unpacked(r, NULL);
        }
        if (ok) {
            copy_str(owner, ID_MAX, ids[0]);
            *epoch = ep;
            return HYLA_RPC_OK;
        }
        pthread_mutex_lock(&c->mu);
        unplace_locked(c, s, st == HYLA_OK ? "its worker holds another placement" : res.message);
        pthread_mutex_unlock(&c->mu);
    } else if (active) {
        pthread_mutex_lock(&c->mu);
        unplace_locked(c, s, "its group has no live worker");
        pthread_mutex_unlock(&c->mu);
    }
    pthread_mutex_lock(&c->mu);
    uint64_t version = s->snap.version;
    pthread_mutex_unlock(&c->mu);
    hyla_rpc_code code = place_session(c, s, NULL, NULL, version, msg, cap);
    if (code != HYLA_RPC_OK)
        return code;
    pthread_mutex_lock(&c->mu);
    n = owners_locked(c, s, ids);
    *epoch = s->epoch;
    pthread_mutex_unlock(&c->mu);
    if (n == 0) {
        snprintf(msg, cap, "session %s: its group vanished while placing it", s->id);
        return HYLA_RPC_UNAVAILABLE;
    }
    copy_str(owner, ID_MAX, ids[0]);
    return HYLA_RPC_OK;
}

/* A durable snapshot of an ACTIVE s (held busy) now, on its owner. */
static hyla_rpc_code snapshot_now(hyla_coord *c, csess *s, Hyla__V1__SnapshotInfo *out, char *msg, size_t cap) {
    char ids[MAX_STAGES][ID_MAX];
    pthread_mutex_lock(&c->mu);
    int n = owners_locked(c, s, ids);
    uint64_t epoch = s->epoch;
    pthread_mutex_unlock(&c->mu);
    if (n == 0) {
        snprintf(msg, cap, "session %s: no live worker holds it", s->id);
        return HYLA_RPC_UNAVAILABLE;
    }
    /* stage 0 gathers the later stages' parts (Worker.ExportStage) into one whole-model snapshot */
    Hyla__V1__SnapshotRequest q = HYLA__V1__SNAPSHOT_REQUEST__INIT;
    q.session_id = s->id;
    q.placement_epoch = epoch;
    ProtobufCMessage *r = NULL;
    hyla_rpc_result res;
    if (call_worker(c, ids[0], SVC_WORKER "Snapshot", &q.base, &hyla__v1__snapshot_response__descriptor, &r, &res) !=
        HYLA_OK) {
        snprintf(msg, cap, "snapshot of session %s on worker %.120s: %.700s", s->id, ids[0], res.message);
        return res.code;
    }
    const Hyla__V1__SnapshotResponse *sr = (const Hyla__V1__SnapshotResponse *)r;
    pthread_mutex_lock(&c->mu);
    if (sr->snapshot && sr->snapshot->version >= s->snap.version) {
        s->snap = *sr->snapshot;
        s->snap.base.unknown_fields = NULL;
        s->snap.base.n_unknown_fields = 0;
        s->position = sr->snapshot->position;
    }
    *out = s->snap;
    persist_locked(c, s, 1, 0);
    pthread_mutex_unlock(&c->mu);
    protobuf_c_message_free_unpacked(r, NULL);
    return HYLA_RPC_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* jobs                                                                                        */

typedef struct {
    binding *b;
    hyla_rpc_call *call;
    ProtobufCMessage *req;
    char tenant[ID_MAX];
} job;


static void job_done(hyla_coord *c) {
    pthread_mutex_lock(&c->mu);
    c->jobs--;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static void *job_main(void *arg) {
    job *j = arg;
    hyla_coord *c = j->b->c;
    j->b->fn(c, j->call, j->req, j->tenant);
    protobuf_c_message_free_unpacked(j->req, NULL);
    free(j);
    job_done(c);
    return NULL;
}

/* Start fn(arg) on a detached thread counted in c->jobs. */
static int spawn(hyla_coord *c, void *(*fn)(void *), void *arg) {
    pthread_mutex_lock(&c->mu);
    c->jobs++;
    pthread_mutex_unlock(&c->mu);
    pthread_t t;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    int e = pthread_create(&t, &a, fn, arg);
    pthread_attr_destroy(&a);
    if (e != 0) {
        job_done(c);
        return -1;
    }
    return 0;
}

/* The caller's tenant (x-hyla-tenant, default "default"). */
static int get_tenant(hyla_rpc_call *call, char *out) {
    const char *t = hyla_rpc_call_metadata(call, HYLA_API_TENANT_KEY);
    if (!t) {
        copy_str(out, ID_MAX, HYLA_API_DEFAULT_TENANT);
        return 1;
    }
    size_t n = strlen(t);
    if (n == 0 || n >= ID_MAX)
        return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)t[i] <= ' ' || (unsigned char)t[i] >= 0x7f)
            return 0;
    copy_str(out, ID_MAX, t);
    return 1;
}

/* Handler of unary methods: validate the tenant, then run inline or on a job thread. */
static void h_unary(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *msg, void *ud) {
    if (ev != HYLA_RPC_EV_START)
        return;
    binding *b = ud;
    char tenant[ID_MAX];
    if (!get_tenant(call, tenant)) {
        hyla_rpc_call_fail(call, HYLA_RPC_INVALID_ARGUMENT,
                           "metadata %s: 1..%d printable characters without spaces", HYLA_API_TENANT_KEY, ID_MAX - 1);
        return;
    }
    if (b->inline_call) {
        b->fn(b->c, call, msg, tenant);
        return;
    }
    job *j = calloc(1, sizeof *j);
    HYLA_ASSERT(j);
    j->b = b;
    j->call = call;
    j->req = hyla_rpc_message_dup(msg);
    copy_str(j->tenant, sizeof j->tenant, tenant);
    if (spawn(b->c, job_main, j) != 0) {
        protobuf_c_message_free_unpacked(j->req, NULL);
        free(j);
        hyla_rpc_call_fail(call, HYLA_RPC_RESOURCE_EXHAUSTED, "coordinator: cannot start a thread for the call");
    }
}

static int valid_sampling(const Hyla__V1__SamplingParams *sp, char *msg, size_t cap) {
    if (!sp)
        return 1;
    if (!isfinite(sp->temperature) || sp->temperature < 0) {
        snprintf(msg, cap, "field sampling.temperature: %g must be finite and >= 0", (double)sp->temperature);
        return 0;
    }
    if (!isfinite(sp->top_p) || sp->top_p < 0 || sp->top_p > 1) {
        snprintf(msg, cap, "field sampling.top_p: %g must be in [0, 1]", (double)sp->top_p);
        return 0;
    }
    if (sp->top_k < 0) {
        snprintf(msg, cap, "field sampling.top_k: %d must be >= 0", sp->top_k);
        return 0;
    }
    return 1;
}

static int valid_session_id(const char *id) {
    size_t n = id ? strlen(id) : 0;
    return n > 0 && n < SID_MAX;
}

static void fail_bad_id(hyla_rpc_call *call) {
    hyla_rpc_call_fail(call, HYLA_RPC_INVALID_ARGUMENT, "field session_id: 1..%d bytes required", SID_MAX - 1);
}
#define REQUIRE_ID(call, id)          \
    do {                              \
        if (!valid_session_id(id)) {  \
            fail_bad_id(call);        \
            return;                   \
        }                             \
    } while (0)

/* The session a request names, acquired for this call (release_session when done), or NULL
 * once the call has been failed with the reason: a malformed id, no such session, another
 * tenant's, deleted meanwhile. */
static csess *acquire_for_call(hyla_coord *c, hyla_rpc_call *call, const char *id, const char *tenant) {
    if (!valid_session_id(id)) {
        fail_bad_id(call);
        return NULL;
    }
    char msg[1024];
    hyla_rpc_code code;
    csess *s = acquire_session(c, id, tenant, &code, msg, sizeof msg);
    if (!s) hyla_rpc_call_fail(call, code, "%s", msg);
    return s;
}

static void reply_view(hyla_coord *c, hyla_rpc_call *call, csess *s) {
    sess_view *v = malloc(sizeof *v);
    HYLA_ASSERT(v);
    pthread_mutex_lock(&c->mu);
    view_make_locked(c, s, v);
    pthread_mutex_unlock(&c->mu);
    hyla_rpc_call_reply(call, &v->s.base);
    free(v);
}

/* ------------------------------------------------------------------------------------------ */
/* Sessions                                                                                    */

static void do_create(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant) {
    const Hyla__V1__CreateSessionRequest *q = (const Hyla__V1__CreateSessionRequest *)m;
    char msg[1024];
    if (!valid_sampling(q->sampling, msg, sizeof msg)) {
        hyla_rpc_call_fail(call, HYLA_RPC_INVALID_ARGUMENT, "%s", msg);
        return;
    }
    csess *s = sess_new();
    pthread_mutex_lock(&c->mu);
    hyla_rpc_code code = resolve_model_locked(c, q->model, s->model, msg, sizeof msg);
    if (code != HYLA_RPC_OK) {
        pthread_mutex_unlock(&c->mu);
        free(s);
        hyla_rpc_call_fail(call, code, "%s", msg);
        return;
    }
    new_session_id_locked(c, s->id);
    copy_str(s->tenant, sizeof s->tenant, tenant);
    if (q->sampling) {
        s->temperature = q->sampling->temperature;
        s->top_k = q->sampling->top_k;
        s->top_p = q->sampling->top_p;
    }
    s->seed = q->seed;
    s->state = HYLA__V1__SESSION_STATE__SESSION_MOVING;
    s->busy = 1;
    sess_insert_locked(c, s);
    s->refs++; /* this call's */
    pthread_mutex_unlock(&c->mu);

    code = place_session(c, s, q->worker_hint, NULL, 0, msg, sizeof msg);
    if (code != HYLA_RPC_OK) {
        pthread_mutex_lock(&c->mu);
        sess_remove_locked(c, s);
        s->busy = 0;
        pthread_cond_broadcast(&c->cv);
        sess_unref_locked(s);
        pthread_mutex_unlock(&c->mu);
        hyla_rpc_call_fail(call, code, "%s", msg);
        return;
    }
    HYLA_INFO("coordinator: tenant %s created session %s (model %s)", tenant, s->id, s->model);
    reply_view(c, call, s);
    release_session(c, s);
}

static void do_get(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant) {
    const Hyla__V1__GetSessionRequest *q = (const Hyla__V1__GetSessionRequest *)m;
    REQUIRE_ID(call, q->session_id);
    sess_view *v = malloc(sizeof *v);
    HYLA_ASSERT(v);
    pthread_mutex_lock(&c->mu);
    csess *s = sess_find(c, q->session_id);
    int mine = s && strcmp(s->tenant, tenant) == 0;
    if (mine)
        view_make_locked(c, s, v);
    pthread_mutex_unlock(&c->mu);
    if (!s)
        hyla_rpc_call_fail(call, HYLA_RPC_NOT_FOUND, "session %s not found", q->session_id);
    else if (!mine)
        hyla_rpc_call_fail(call, HYLA_RPC_PERMISSION_DENIED, "session %s belongs to another tenant", q->session_id);
    else
        hyla_rpc_call_reply(call, &v->s.base);
    free(v);
}

typedef int (*sess_filter)(const hyla_coord *c, const csess *s, const void *arg);

/* Reply with one page of sessions passing filter, in id order after page_token. */
static void list_page(hyla_coord *c, hyla_rpc_call *call, uint32_t page_size, const char *page_token, sess_filter f,
                      const void *arg, int cluster) {
    if (page_size > PAGE_MAX) {
        hyla_rpc_call_fail(call, HYLA_RPC_INVALID_ARGUMENT, "field page_size: %u exceeds the maximum %d", page_size,
                           PAGE_MAX);
        return;
    }
    if (page_size == 0)
        page_size = PAGE_DEFAULT;
    if (page_token && page_token[0] && (strncmp(page_token, "after:", 6) != 0 || strlen(page_token) > 6 + SID_MAX)) {
        hyla_rpc_call_fail(call, HYLA_RPC_INVALID_ARGUMENT, "field page_token: '%.64s' was not issued by this server",
                           page_token);
        return;
    }
    const char *after = page_token && page_token[0] ? page_token + 6 : NULL;
    sess_view *views = calloc(page_size, sizeof *views);
    Session **ptrs = calloc(page_size, sizeof *ptrs);
    HYLA_ASSERT(views && ptrs);
    char next[SID_MAX + 8] = "";
    uint64_t counts[4] = {0, 0, 0, 0};
    pthread_mutex_lock(&c->mu);
    size_t start = 0;
    if (after) {
        long i = sess_search(c, after);
        start = i >= 0 ? (size_t)i + 1 : (size_t)(-i - 1);
    }
    uint32_t n = 0;
    for (size_t i = start; i < c->n_sess; i++) {
        const csess *s = c->sess[i];
        if (!f(c, s, arg))
            continue;
        if (n == page_size) {
            snprintf(next, sizeof next, "after:%s", views[n - 1].copy.id);
            break;
        }
        view_make_locked(c, s, &views[n]);
        ptrs[n] = &views[n].s;
        n++;
    }
    if (cluster)
        for (size_t i = 0; i < c->n_sess; i++) {
            int t = c->sess[i]->state == HYLA__V1__SESSION_STATE__SESSION_ACTIVE ? c->sess[i]->tier
                                                                                 : HYLA__V1__TIER__TIER_STORE;
            if (t >= 0 && t < 4)
                counts[t]++;
        }
    pthread_mutex_unlock(&c->mu);
    if (cluster) {
        Hyla__V1__ListClusterSessionsResponse r = HYLA__V1__LIST_CLUSTER_SESSIONS_RESPONSE__INIT;
        r.n_sessions = n;
        r.sessions = ptrs;
        r.next_page_token = next;
        r.sessions_gpu = counts[HYLA__V1__TIER__TIER_GPU];
        r.sessions_host = counts[HYLA__V1__TIER__TIER_HOST];
        r.sessions_store = counts[HYLA__V1__TIER__TIER_STORE];
        hyla_rpc_call_reply(call, &r.base);
    } else {
        Hyla__V1__ListSessionsResponse r = HYLA__V1__LIST_SESSIONS_RESPONSE__INIT;
        r.n_sessions = n;
        r.sessions = ptrs;
        r.next_page_token = next;
        hyla_rpc_call_reply(call, &r.base);
    }
    free(ptrs);
    free(views);
}

typedef struct {
    const char *tenant, *model;
} list_arg;

static int filter_tenant(const hyla_coord *c, const csess *s, const void *arg) {
    (void)c;
    const list_arg *a = arg;
    return strcmp(s->tenant, a->tenant) == 0 && (!a->model[0] || strcmp(s->model, a->model) == 0);
}

static void do_list(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant) {
    const Hyla__V1__ListSessionsRequest *q = (const Hyla__V1__ListSessionsRequest *)m;
    list_arg a = {tenant, q->model ? q->model : ""};
    list_page(c, call, q->page_size, q->page_token, filter_tenant, &a, 0);
}

static void do_delete(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant) {
    const Hyla__V1__DeleteSessionRequest *q = (const Hyla__V1__DeleteSessionRequest *)m;
    csess *s = acquire_for_call(c, call, q->session_id, tenant);
    if (!s) return;
    char msg[1024];
    char ids[MAX_STAGES][ID_MAX];
    pthread_mutex_lock(&c->mu);
    int n = s->state == HYLA__V1__SESSION_STATE__SESSION_ACTIVE ? owners_locked(c, s, ids) : 0;
    uint64_t epoch = s->epoch;
    pthread_mutex_unlock(&c->mu);
    unload_on(c, ids, n, s->id, epoch); /* best effort: heartbeats unload leftovers */
    uint64_t deleted = 0;
    if (c->store) {
        uint64_t *versions = NULL;
        size_t nv = 0;
        if (hyla_store_versions(c->store, s->id, &versions, &nv) == HYLA_OK)
            deleted = nv;
        free(versions);
        hyla_status st = hyla_store_delete(c->store, s->id);
        if (st != HYLA_OK && st != HYLA_ERR_NOT_FOUND) {
            snprintf(msg, sizeof msg, "deleting the snapshots of session %s: %s", s->id, hyla_last_error());
            release_session(c, s);
            hyla_rpc_call_fail(call, hyla_rpc_code_from_status(st), "%s", msg);
            return;
        }
    }
    pthread_mutex_lock(&c->mu);
    hyla_status st = hyla_coord_dir_delete(c->dir, s->id);
    if (st == HYLA_OK)
        sess_remove_locked(c, s);
    else
        snprintf(msg, sizeof msg, "%s", hyla_last_error());
    pthread_mutex_unlock(&c->mu);
    release_session(c, s);
    if (st != HYLA_OK) {
        hyla_rpc_call_fail(call, HYLA_RPC_INTERNAL, "%s", msg);
        return;
    }
    HYLA_INFO("coordinator: session %s deleted (%llu snapshot versions)", q->session_id, (unsigned long long)deleted);
    Hyla__V1__DeleteSessionResponse r = HYLA__V1__DELETE_SESSION_RESPONSE__INIT;
    r.snapshots_deleted = deleted;
    hyla_rpc_call_reply(call, &r.base);
}

static void do_pause(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant) {
    const Hyla__V1__PauseRequest *q = (const Hyla__V1__PauseRequest *)m;
    csess *s = acquire_for_call(c, call, q->session_id, tenant);
    if (!s) return;
    char msg[1024];
    hyla_rpc_code code;
    Hyla__V1__SnapshotInfo si = HYLA__V1__SNAPSHOT_INFO__INIT;
    pthread_mutex_lock(&c->mu);
    int active = s->state == HYLA__V1__SESSION_STATE__SESSION_ACTIVE;
    si = s->snap;
    pthread_mutex_unlock(&c->mu);
    if (active) {
        code = snapshot_now(c, s, &si, msg, sizeof msg);
        if (code != HYLA_RPC_OK) {
            release_session(c, s);
            hyla_rpc_call_fail(call, code, "%s", msg);
            return;
        }
        if (q->evict) {
            char ids[MAX_STAGES][ID_MAX];
            pthread_mutex_lock(&c->mu);
            int n = owners_locked(c, s, ids);
            uint64_t epoch = s->epoch;
            pthread_mutex_unlock(&c->mu);
            unload_on(c, ids, n, s->id, epoch);
            pthread_mutex_lock(&c->mu);
            unplace_locked(c, s, "paused with evict");
            pthread_mutex_unlock(&c->mu);
        }
    }
    sess_view *v = malloc(sizeof *v);
    HYLA_ASSERT(v);
    pthread_mutex_lock(&c->mu);
    view_make_locked(c, s, v);
    pthread_mutex_unlock(&c->mu);
    Hyla__V1__PauseResponse r = HYLA__V1__PAUSE_RESPONSE__INIT;
    r.session = &v->s;
    r.snapshot = &si;
    hyla_rpc_call_reply(call, &r.base);
    free(v);
    release_session(c, s);
}

static void do_resume(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant) {
    const Hyla__V1__ResumeRequest *q = (const Hyla__V1__ResumeRequest *)m;
    csess *s = acquire_for_call(c, call, q->session_id, tenant);
    if (!s) return;
    char msg[1024];
    hyla_rpc_code code;
    pthread_mutex_lock(&c->mu);
    int active = s->state == HYLA__V1__SESSION_STATE__SESSION_ACTIVE;
    uint64_t version = s->snap.version;
    pthread_mutex_unlock(&c->mu);
    code = HYLA_RPC_OK;
    if (!active)
        code = place_session(c, s, q->worker_hint, NULL, version, msg, sizeof msg);
    if (code == HYLA_RPC_OK)
        reply_view(c, call, s);
    else
        hyla_rpc_call_fail(call, code, "%s", msg);
    release_session(c, s);
}

/* Move s (held busy) to to_worker's group, or to any other group when to_worker is NULL or
 * empty: a durable snapshot on the old group, placement from it, unload from the old group.
 * from (ID_MAX bytes) receives the old group, *si the snapshot that carried the state. */
static hyla_rpc_code move_session(hyla_coord *c, csess *s, const char *to_worker, char *from,
                                  Hyla__V1__SnapshotInfo *si, char *msg, size_t cap) {
    char ids[MAX_STAGES][ID_MAX];
    pthread_mutex_lock(&c->mu);
    int active = s->state == HYLA__V1__SESSION_STATE__SESSION_ACTIVE;
    copy_str(from, ID_MAX, s->group);
    int n = owners_locked(c, s, ids);
    uint64_t old_epoch = s->epoch;
    *si = s->snap;
    pthread_mutex_unlock(&c->mu);
    hyla_rpc_code code = HYLA_RPC_OK;
    if (active)
        code = snapshot_now(c, s, si, msg, cap);
    if (code == HYLA_RPC_OK)
        code = place_session(c, s, to_worker, active ? from : NULL, si->version, msg, cap);
    if (code == HYLA_RPC_OK && active)
        unload_on(c, ids, n, s->id, old_epoch);
    return code;
}

static void do_migrate(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant) {
    const Hyla__V1__MigrateRequest *q = (const Hyla__V1__MigrateRequest *)m;
    csess *s = acquire_for_call(c, call, q->session_id, tenant);
    if (!s) return;
    char msg[1024];
    hyla_rpc_code code;
    char from[ID_MAX];
    Hyla__V1__SnapshotInfo si;
    code = move_session(c, s, q->to_worker, from, &si, msg, sizeof msg);
    if (code != HYLA_RPC_OK) {
        release_session(c, s);
        hyla_rpc_call_fail(call, code, "%s", msg);
        return;
    }
    sess_view *v = malloc(sizeof *v);
    HYLA_ASSERT(v);
    pthread_mutex_lock(&c->mu);
    view_make_locked(c, s, v);
    pthread_mutex_unlock(&c->mu);
    Hyla__V1__MigrateResponse r = HYLA__V1__MIGRATE_RESPONSE__INIT;
    r.session = &v->s;
    r.from_group_id = from;
    r.snapshot = &si;
    hyla_rpc_call_reply(call, &r.base);
    free(v);
    release_session(c, s);
}

static void do_fork(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant) {
    const Hyla__V1__ForkRequest *q = (const Hyla__V1__ForkRequest *)m;
    REQUIRE_ID(call, q->session_id);
    char msg[1024], owner[ID_MAX];
    if (!valid_sampling(q->sampling, msg, sizeof msg)) {
        hyla_rpc_call_fail(call, HYLA_RPC_INVALID_ARGUMENT, "%s", msg);
        return;
    }
    hyla_rpc_code code;
    csess *p = acquire_session(c, q->session_id, tenant, &code, msg, sizeof msg);
    if (!p) {
        hyla_rpc_call_fail(call, code, "%s", msg);
        return;
    }
    uint64_t epoch;
    char ids[MAX_STAGES][ID_MAX];
    int n_owners = 0;
    code = ensure_active(c, p, owner, &epoch, msg, sizeof msg);
    if (code == HYLA_RPC_OK) {
        pthread_mutex_lock(&c->mu);
        n_owners = owners_locked(c, p, ids);
        pthread_mutex_unlock(&c->mu);
        if (n_owners < 1) {
            code = HYLA_RPC_UNAVAILABLE;
            snprintf(msg, sizeof msg, "fork of session %s: no live worker holds it", p->id);
        }
    }
    if (code != HYLA_RPC_OK) {
        release_session(c, p);
        hyla_rpc_call_fail(call, code, "%s", msg);
        return;
    }
    csess *s = sess_new();
    pthread_mutex_lock(&c->mu);
    new_session_id_locked(c, s->id);
    copy_str(s->tenant, sizeof s->tenant, p->tenant);
    copy_str(s->model, sizeof s->model, p->model);
    copy_str(s->parent, sizeof s->parent, p->id);
    copy_str(s->group, sizeof s->group, p->group);
    s->temperature = q->sampling ? q->sampling->temperature : p->temperature;
    s->top_k = q->sampling ? q->sampling->top_k : p->top_k;
    s->top_p = q->sampling ? q->sampling->top_p : p->top_p;
    s->seed = q->reseed ? q->seed : p->seed;
    s->position = p->position;
    s->generated = p->generated;
    s->state = HYLA__V1__SESSION_STATE__SESSION_MOVING;
    s->busy = 1;
    s->epoch = ++c->epoch_counter;
    sess_insert_locked(c, s);
    s->refs++;
    pthread_mutex_unlock(&c->mu);

    Hyla__V1__ForkSessionRequest fq = HYLA__V1__FORK_SESSION_REQUEST__INIT;
    fq.session_id = p->id;
    fq.new_session_id = s->id;
    fq.placement_epoch = s->epoch;
    fq.sampling = q->sampling;
    fq.reseed = q->reseed;
    fq.seed = q->seed;
    ProtobufCMessage *r = NULL;
    hyla_rpc_result res;
    /* every stage forks the part of the state it holds (stage 0 last: its answer describes the
     * session); a failure unloads what was already forked */
    hyla_status st = HYLA_OK;
    for (int i = n_owners - 1; i >= 1 && st == HYLA_OK; i--) {
        ProtobufCMessage *ri = NULL;
        st = call_worker(c, ids[i], SVC_WORKER "ForkSession", &fq.base, &hyla__v1__worker_session_response__descriptor,
                         &ri, &res);
        if (ri)
            protobuf_c_message_free_unpacked(ri, NULL);
        if (st != HYLA_OK)
            unload_on(c, ids, n_owners, s->id, s->epoch);
    }
    if (st == HYLA_OK) {
        st = call_worker(c, ids[0], SVC_WORKER "ForkSession", &fq.base, &hyla__v1__worker_session_response__descriptor,
                         &r, &res);
        if (st != HYLA_OK)
            unload_on(c, ids, n_owners, s->id, s->epoch);
    }
    pthread_mutex_lock(&c->mu);
    if (st == HYLA_OK) {
        const Hyla__V1__WorkerSessionResponse *wr = (const Hyla__V1__WorkerSessionResponse *)r;
        if (wr->session) {
            s->position = wr->session->position;
            s->generated = wr->session->generated;
        }
        s->state = HYLA__V1__SESSION_STATE__SESSION_ACTIVE;
        s->tier = HYLA__V1__TIER__TIER_GPU;
        if (persist_locked(c, s, 1, 1) != HYLA_OK) {
            st = HYLA_ERR_INTERNAL;
            res.code = HYLA_RPC_INTERNAL;
            snprintf(res.message, sizeof res.message, "%s", hyla_last_error());
        }
    }
    if (st != HYLA_OK)
        sess_remove_locked(c, s);
    pthread_mutex_unlock(&c->mu);
    if (r)
        protobuf_c_message_free_unpacked(r, NULL);
    if (st == HYLA_OK && q->worker_hint && *q->worker_hint) {
        /* the hint names another group: move the fork there (a preference: on failure it stays) */
        pthread_mutex_lock(&c->mu);
        cworker *hw = worker_find(c, q->worker_hint);
        int other = hw && strcmp(hw->group, s->group) != 0;
        pthread_mutex_unlock(&c->mu);
        char from[ID_MAX], mmsg[1024];
        Hyla__V1__SnapshotInfo si;
        if (other && move_session(c, s, q->worker_hint, from, &si, mmsg, sizeof mmsg) != HYLA_RPC_OK)
            HYLA_WARN("coordinator: fork %s stays on group %s: moving it to %s's group failed: %s", s->id, s->group,
                      q->worker_hint, mmsg);
    }
    if (st == HYLA_OK) {
        HYLA_INFO("coordinator: session %s forked from %s", s->id, p->id);
        reply_view(c, call, s);
    } else {
        hyla_rpc_call_fail(call, res.code == HYLA_RPC_OK ? HYLA_RPC_INTERNAL : res.code, "fork of session %s: %s",
                           p->id, res.message);
    }
    release_session(c, s);
    release_session(c, p);
}

/* ---- relayed streams (Generate, Append) ---- */

typedef struct {
    hyla_coord *c;
    hyla_rpc_call *call;
    hyla_rpc_stream *ws; /* destroyed with the relay, so a writer holding a reference can use it */
    ProtobufCMessage *req; /* Generate: the request, for the job */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;
    int ws_over;    /* the worker's call ended (its final callback ran) */
    int released;   /* the call was replied/failed */
    int cancelled;  /* the client's call ended (DONE) */
    uint32_t delivered;
    uint64_t last_position; /* the session's position in the worker's last message */
    uint64_t epoch;         /* placement epoch the worker stream was opened under */
    int have_position;
    char session[SID_MAX], tenant[ID_MAX];
    /* Append: client chunks waiting for the writer job */
    struct chunk {
        struct chunk *next;
        size_t len;
        uint8_t data[];
    } *head, *tail;
    int qlen, half_closed, held, job_started;
} relay;

static relay *relay_new(hyla_coord *c, hyla_rpc_call *call) {
    relay *r = calloc(1, sizeof *r);
    HYLA_ASSERT(r);
    r->c = c;
    r->call = call;
    r->refs = 1; /* the call's user data */
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    pthread_mutex_lock(&c->mu);
    c->relays++;
    pthread_mutex_unlock(&c->mu);
    return r;
}

static void relay_unref(void *p) {
    relay *r = p;
    pthread_mutex_lock(&r->mu);
    int last = --r->refs == 0;
    pthread_mutex_unlock(&r->mu);
    if (!last)
        return;
    while (r->head) {
        struct chunk *k = r->head;
        r->head = k->next;
        free(k);
    }
    if (r->req)
        protobuf_c_message_free_unpacked(r->req, NULL);
    hyla_rpc_stream_destroy(r->ws); /* may run inside the stream's own final callback: allowed */
    hyla_coord *c = r->c;
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    free(r);
    pthread_mutex_lock(&c->mu);
    c->relays--;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

/* Finish the client's call once (r->mu held; released around the rpc call). */
static void relay_finish_locked(relay *r, hyla_rpc_code code, const char *msg) {
    if (r->released)
        return;
    r->released = 1;
    hyla_rpc_call *call = r->call;
    pthread_mutex_unlock(&r->mu);
    if (code == HYLA_RPC_OK) {
        hyla_rpc_call_reply(call, NULL);
    } else {
        char n[32];
        snprintf(n, sizeof n, "%u", r->delivered);
        hyla_rpc_call_set_trailer(call, HYLA_API_TOKENS_DELIVERED_KEY, n);
        hyla_rpc_call_fail(call, code, "%s", msg);
    }
    pthread_mutex_lock(&r->mu);
}

/* Worker responses -> the client. msg NULL: the worker's call is over. */
static void relay_on_worker(hyla_rpc_stream *ws, const ProtobufCMessage *msg, void *ud) {
    relay *r = ud;
    pthread_mutex_lock(&r->mu);
    if (msg) {
        if (msg->descriptor == &hyla__v1__generate_response__descriptor) {
            const Hyla__V1__GenerateResponse *g = (const Hyla__V1__GenerateResponse *)msg;
            r->delivered += (uint32_t)g->n_token_ids;
            r->last_position = g->position;
            r->have_position = 1;
        } else if (msg->descriptor == &hyla__v1__append_progress__descriptor) {
            r->last_position = ((const Hyla__V1__AppendProgress *)msg)->position;
            r->have_position = 1;
        }
        if (!r->released && hyla_rpc_call_send(r->call, msg) != HYLA_OK)
            hyla_rpc_stream_cancel(ws); /* the client is gone */
        pthread_mutex_unlock(&r->mu);
        return;
    }
    hyla_rpc_result res;
    hyla_rpc_stream_result(ws, &res);
    r->ws_over = 1;
    int have = r->have_position;
    uint64_t pos = r->last_position, delivered = r->delivered, epoch = r->epoch;
    relay_finish_locked(r, res.code, res.message);
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    if (have) { /* keep the directory current without waiting for a heartbeat (c->mu after r->mu is released) */
        pthread_mutex_lock(&r->c->mu);
        csess *cs = sess_find(r->c, r->session);
        if (cs && cs->epoch == epoch) { /* not re-placed (Migrate, failure) meanwhile */
            cs->position = pos;
            cs->generated += delivered;
        }
        pthread_mutex_unlock(&r->c->mu);
    }
    relay_unref(r); /* the stream's reference */
}

/* Open the worker stream of a relay (no lock held); on failure finishes the call. */
static int relay_open(relay *r, const char *method, const ProtobufCMessageDescriptor *resp_desc) {
    hyla_coord *c = r->c;
    char msg[1024], owner[ID_MAX];
    hyla_rpc_code code;
    csess *s = acquire_session(c, r->session, r->tenant, &code, msg, sizeof msg);
    uint64_t epoch = 0;
    if (s) {
        code = ensure_active(c, s, owner, &epoch, msg, sizeof msg);
        release_session(c, s);
    }
    hyla_rpc_client *cl = NULL;
    if (code == HYLA_RPC_OK) {
        pthread_mutex_lock(&c->mu);
        cworker *w = worker_find(c, owner);
        cl = w ? w->client : NULL;
        pthread_mutex_unlock(&c->mu);
        if (!cl) {
            code = HYLA_RPC_UNAVAILABLE;
            snprintf(msg, sizeof msg, "worker %s vanished", owner);
        }
    }
    pthread_mutex_lock(&r->mu);
    r->epoch = epoch;
    if (code == HYLA_RPC_OK && r->cancelled) {
        code = HYLA_RPC_CANCELLED;
        snprintf(msg, sizeof msg, "cancelled");
    }
    if (code == HYLA_RPC_OK) {
        hyla_rpc_call_opts o = {0, NULL, NULL, 0};
        int64_t left = hyla_rpc_call_deadline_ms(r->call);
        o.timeout_ms = left < 0 ? 0 : (left == 0 ? 1 : left);
        r->refs++; /* the stream's, dropped by its final callback */
        if (hyla_rpc_stream_open_async(cl, method, resp_desc, &o, relay_on_worker, r, &r->ws) != HYLA_OK) {
            r->ws = NULL;
            r->refs--;
            code = HYLA_RPC_INTERNAL;
            snprintf(msg, sizeof msg, "%s", hyla_last_error());
        }
    }
    if (code != HYLA_RPC_OK)
        relay_finish_locked(r, code, msg);
    pthread_mutex_unlock(&r->mu);
    return code == HYLA_RPC_OK;
}

static void *generate_main(void *arg) {
    relay *r = arg;
    hyla_coord *c = r->c;
    if (relay_open(r, SVC_WORKER "Generate", &hyla__v1__generate_response__descriptor)) {
        hyla_rpc_stream_write(r->ws, r->req); /* never blocks: one message */
        hyla_rpc_stream_close_send(r->ws);
    }
    relay_unref(r); /* the job's */
    job_done(c);
    return NULL;
}

static void h_generate(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *msg, void *ud) {
    binding *b = ud;
    if (ev == HYLA_RPC_EV_DONE) {
        relay *r = hyla_rpc_call_user(call);
        if (r && hyla_rpc_call_cancelled(call)) {
            pthread_mutex_lock(&r->mu);
            r->cancelled = 1;
            if (r->ws)
                hyla_rpc_stream_cancel(r->ws);
            pthread_cond_broadcast(&r->cv);
            pthread_mutex_unlock(&r->mu);
        }
        return;
    }
    if (ev != HYLA_RPC_EV_START)
        return;
    const Hyla__V1__GenerateRequest *q = (const Hyla__V1__GenerateRequest *)msg;
    char tenant[ID_MAX];
    if (!get_tenant(call, tenant)) {
        hyla_rpc_call_fail(call, HYLA_RPC_INVALID_ARGUMENT, "metadata %s: malformed", HYLA_API_TENANT_KEY);
        return;
    }
    REQUIRE_ID(call, q->session_id);
    if (q->max_tokens == 0) {
        hyla_rpc_call_fail(call, HYLA_RPC_INVALID_ARGUMENT, "field max_tokens: must be >= 1");
        return;
    }
    char bad[512];
    if (!valid_sampling(q->sampling, bad, sizeof bad)) {
        hyla_rpc_call_fail(call, HYLA_RPC_INVALID_ARGUMENT, "%s", bad);
        return;
    }
    relay *r = relay_new(b->c, call);
    copy_str(r->session, sizeof r->session, q->session_id);
    copy_str(r->tenant, sizeof r->tenant, tenant);
    r->req = hyla_rpc_message_dup(msg);
    r->refs++; /* the job's */
    hyla_rpc_call_set_user(call, r, relay_unref);
    if (spawn(b->c, generate_main, r) != 0) {
        relay_unref(r);
        pthread_mutex_lock(&r->mu);
        relay_finish_locked(r, HYLA_RPC_RESOURCE_EXHAUSTED, "coordinator: cannot start a thread for the call");
        pthread_mutex_unlock(&r->mu);
    }
}

static void *append_main(void *arg) {
    relay *r = arg;
    hyla_coord *c = r->c;
    if (relay_open(r, SVC_WORKER "Append", &hyla__v1__append_progress__descriptor)) {
        for (;;) {
            pthread_mutex_lock(&r->mu);
            while (!r->head && !r->half_closed && !r->cancelled && !r->ws_over)
                pthread_cond_wait(&r->cv, &r->mu);
            hyla_rpc_stream *ws = r->ws_over ? NULL : r->ws;
            struct chunk *k = NULL;
            if (ws && !r->cancelled && r->head) {
                k = r->head;
                r->head = k->next;
                if (!r->head)
                    r->tail = NULL;
                r->qlen--;
            }
            int resume = r->held && r->qlen <= APPEND_QUEUE_RESUME && !r->released;
            if (resume)
                r->held = 0;
            int close = ws && !k && r->half_closed && !r->cancelled;
            /* r->ws lives as long as the relay, and this job holds a reference to it; the write
             * may block (back-pressure), so not under r->mu, which the stream's callbacks take. */
            pthread_mutex_unlock(&r->mu);
            if (resume)
                hyla_rpc_call_read_resume(r->call);
            if (!ws || (!k && !close))
                break;
            if (close) {
                hyla_rpc_stream_close_send(ws);
                break;
            }
            hyla_status st = hyla_rpc_stream_write_raw(ws, k->data, k->len);
            free(k);
            if (st != HYLA_OK)
                break; /* the worker's call is over: its final callback finishes ours */
        }
    }
    relay_unref(r);
    job_done(c);
    return NULL;
}

static void h_append(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *msg, void *ud) {
    binding *b = ud;
    relay *r = hyla_rpc_call_user(call);
    switch (ev) {
    case HYLA_RPC_EV_START: {
        char tenant[ID_MAX];
        if (!get_tenant(call, tenant)) {
            hyla_rpc_call_fail(call, HYLA_RPC_INVALID_ARGUMENT, "metadata %s: malformed", HYLA_API_TENANT_KEY);
            return;
        }
        r = relay_new(b->c, call);
        copy_str(r->tenant, sizeof r->tenant, tenant);
        hyla_rpc_call_set_user(call, r, relay_unref);
        return;
    }
    case HYLA_RPC_EV_MESSAGE: {
        if (!r)
            return;
        const Hyla__V1__AppendRequest *q = (const Hyla__V1__AppendRequest *)msg;
        pthread_mutex_lock(&r->mu);
        if (r->released) {
            pthread_mutex_unlock(&r->mu);
            return;
        }
        if (!r->job_started) {
            if (!valid_session_id(q->session_id)) {
                relay_finish_locked(r, HYLA_RPC_INVALID_ARGUMENT,
                                    "Append: the first message must carry session_id (1..31 bytes)");
                pthread_mutex_unlock(&r->mu);
                return;
            }
            copy_str(r->session, sizeof r->session, q->session_id);
        } else if (q->session_id && q->session_id[0] && strcmp(q->session_id, r->session) != 0) {
            relay_finish_locked(r, HYLA_RPC_INVALID_ARGUMENT, "Append: a later message names another session");
            pthread_mutex_unlock(&r->mu);
            return;
        }
        size_t n = protobuf_c_message_get_packed_size(msg);
        struct chunk *k = malloc(sizeof *k + n);
        HYLA_ASSERT(k);
        k->next = NULL;
        k->len = n;
        protobuf_c_message_pack(msg, k->data);
        if (r->tail)
            r->tail->next = k;
        else
            r->head = k;
        r->tail = k;
        r->qlen++;
        if (r->qlen >= APPEND_QUEUE_HOLD && !r->held) {
            r->held = 1;
            hyla_rpc_call_read_hold(call);
        }
        pthread_cond_broadcast(&r->cv);
        int start = !r->job_started;
        if (start) {
            r->job_started = 1;
            r->refs++; /* the job's */
        }
        pthread_mutex_unlock(&r->mu);
        if (start && spawn(b->c, append_main, r) != 0) {
            relay_unref(r);
            pthread_mutex_lock(&r->mu);
            relay_finish_locked(r, HYLA_RPC_RESOURCE_EXHAUSTED, "coordinator: cannot start a thread for the call");
            pthread_mutex_unlock(&r->mu);
        }
        return;
    }
    case HYLA_RPC_EV_HALF_CLOSE:
        if (!r)
            return;
        pthread_mutex_lock(&r->mu);
        r->half_closed = 1;
        if (!r->job_started)
            relay_finish_locked(r, HYLA_RPC_INVALID_ARGUMENT,
                                "Append: the stream ended without a message naming the session");
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
        return;
    case HYLA_RPC_EV_DONE:
        if (!r)
            return;
        pthread_mutex_lock(&r->mu);
        if (hyla_rpc_call_cancelled(call)) {
            r->cancelled = 1;
            if (r->ws)
                hyla_rpc_stream_cancel(r->ws);
        }
        if (!r->job_started) /* nobody else will release it */
            relay_finish_locked(r, HYLA_RPC_CANCELLED, "cancelled");
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
        return;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Cluster                                                                                     */

static void worker_info_locked(const hyla_coord *c, const cworker *w, Hyla__V1__WorkerInfo *wi, Hyla__V1__LayerRange *lr,
                               Hyla__V1__Device *dev, Hyla__V1__WorkerLoad *load) {
    hyla__v1__worker_info__init(wi);
    hyla__v1__layer_range__init(lr);
    hyla__v1__device__init(dev);
    *load = w->load;
    lr->begin = w->lb;
    lr->end = w->le;
    dev->name = (char *)w->dev_name;
    dev->description = (char *)w->dev_desc;
    dev->memory_total_bytes = w->mem_total;
    dev->memory_free_bytes = w->mem_free;
    wi->worker_id = (char *)w->id;
    wi->address = (char *)w->address;
    wi->model = (char *)w->model;
    wi->model_fingerprint = w->fingerprint;
    wi->num_layers = w->num_layers;
    wi->layers = lr;
    wi->group_id = (char *)w->group;
    wi->stage = worker_stage_locked(c, w);
    wi->device = dev;
    wi->param_bytes = w->param_bytes;
    wi->state = (Hyla__V1__WorkerState)w->state;
    wi->load = load;
    wi->registered_unix_ms = w->registered_ms;
    wi->last_heartbeat_unix_ms = w->hb_ms;
    wi->epoch = w->epoch;
}

static void do_list_workers(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant) {
    (void)tenant;
    const Hyla__V1__ListWorkersRequest *q = (const Hyla__V1__ListWorkersRequest *)m;
    pthread_mutex_lock(&c->mu);
    size_t n = c->n_workers;
    Hyla__V1__WorkerInfo *wi = calloc(n + 1, sizeof *wi);
    Hyla__V1__WorkerInfo **wp = calloc(n + 1, sizeof *wp);
    Hyla__V1__LayerRange *lr = calloc(n + 1, sizeof *lr);
    Hyla__V1__Device *dev = calloc(n + 1, sizeof *dev);
    Hyla__V1__WorkerLoad *ld = calloc(n + 1, sizeof *ld);
    Hyla__V1__WorkerGroup *g = calloc(n + 1, sizeof *g);
    Hyla__V1__WorkerGroup **gp = calloc(n + 1, sizeof *gp);
    char **gids = calloc((n + 1) * MAX_STAGES, sizeof *gids);
    HYLA_ASSERT(wi && wp && lr && dev && ld && g && gp && gids);
    size_t nw = 0, ng = 0;
    for (size_t i = 0; i < n; i++) {
        const cworker *w = c->workers[i];
        if (q->model && q->model[0] && strcmp(w->model, q->model) != 0)
            continue;
        worker_info_locked(c, w, &wi[nw], &lr[nw], &dev[nw], &ld[nw]);
        wp[nw] = &wi[nw];
        nw++;
        int seen = 0;
        for (size_t k = 0; k < ng; k++)
            if (strcmp(g[k].group_id, w->group) == 0)
                seen = 1;
        if (seen)
            continue;
        hyla__v1__worker_group__init(&g[ng]);
        g[ng].group_id = (char *)w->group;
        g[ng].model = (char *)w->model;
        cworker *mem[MAX_STAGES];
        int nm = group_members_locked(c, w->group, mem);
        for (int k = 0; k < nm; k++)
            gids[ng * MAX_STAGES + (size_t)k] = mem[k]->id;
        g[ng].n_worker_ids = (size_t)nm;
        g[ng].worker_ids = &gids[ng * MAX_STAGES];
        g[ng].complete = group_placeable_locked(c, w->group); /* complete, ready, and wired stage to stage */
        g[ng].sessions = group_sessions_locked(c, w->group);
        gp[ng] = &g[ng];
        ng++;
    }
    Hyla__V1__ListWorkersResponse r = HYLA__V1__LIST_WORKERS_RESPONSE__INIT;
    r.n_workers = nw;
    r.workers = wp;
    r.n_groups = ng;
    r.groups = gp;
    hyla_rpc_call_reply(call, &r.base); /* packs at once: safe under the lock */
    pthread_mutex_unlock(&c->mu);
    free(wi), free(wp), free(lr), free(dev), free(ld), free(g), free(gp), free(gids);
}

typedef struct {
    int tier;
    const char *group, *tenant;
} cluster_arg;

static int filter_cluster(const hyla_coord *c, const csess *s, const void *arg) {
    (void)c;
    const cluster_arg *a = arg;
    int tier = s->state == HYLA__V1__SESSION_STATE__SESSION_ACTIVE ? s->tier : HYLA__V1__TIER__TIER_STORE;
    if (a->tier && tier != a->tier)
        return 0;
    if (a->group && strcmp(s->group, a->group) != 0)
        return 0;
    if (a->tenant && a->tenant[0] && strcmp(s->tenant, a->tenant) != 0)
        return 0;
    return 1;
}

static void do_list_cluster_sessions(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant) {
    (void)tenant;
    const Hyla__V1__ListClusterSessionsRequest *q = (const Hyla__V1__ListClusterSessionsRequest *)m;
    cluster_arg a = {q->tier, NULL, q->tenant};
    char group[ID_MAX];
    if (q->worker_id && q->worker_id[0]) {
        pthread_mutex_lock(&c->mu);
        cworker *w = worker_find(c, q->worker_id);
        if (w)
            copy_str(group, sizeof group, w->group);
        pthread_mutex_unlock(&c->mu);
        if (!w) {
            hyla_rpc_call_fail(call, HYLA_RPC_NOT_FOUND, "worker '%s' not found", q->worker_id);
            return;
        }
        a.group = group;
    }
    list_page(c, call, q->page_size, q->page_token, filter_cluster, &a, 1);
}

static void do_drain(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant) {
    (void)tenant;
    const Hyla__V1__DrainWorkerRequest *q = (const Hyla__V1__DrainWorkerRequest *)m;
    pthread_mutex_lock(&c->mu);
    cworker *w = q->worker_id ? worker_find(c, q->worker_id) : NULL;
    if (!w) {
        pthread_mutex_unlock(&c->mu);
        hyla_rpc_call_fail(call, HYLA_RPC_NOT_FOUND, "worker '%s' not found", q->worker_id ? q->worker_id : "");
        return;
    }
    char group[ID_MAX];
    copy_str(group, sizeof group, w->group);
    uint32_t before = group_sessions_locked(c, group);
    if (w->state == HYLA__V1__WORKER_STATE__WORKER_READY) {
        w->state = HYLA__V1__WORKER_STATE__WORKER_DRAINING;
        HYLA_INFO("coordinator: draining worker %s (%u sessions)", w->id, before);
    }
    double deadline = hyla_now() + (double)hyla_rpc_call_deadline_ms(call) / 1000.0;
    int has_deadline = hyla_rpc_call_deadline_ms(call) >= 0;
    while (q->wait && worker_find(c, q->worker_id) == w && w->state == HYLA__V1__WORKER_STATE__WORKER_DRAINING &&
           !c->stopping && !hyla_rpc_call_cancelled(call) && (!has_deadline || hyla_now() < deadline)) {
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        t.tv_nsec += 50 * 1000000L;
        if (t.tv_nsec >= 1000000000L) {
            t.tv_sec++;
            t.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&c->cv, &c->mu, &t);
    }
    /* while it drains, the sessions it still holds (its last heartbeat): the directory keeps
     * them on its group until it is drained */
    uint32_t remaining = w->state == HYLA__V1__WORKER_STATE__WORKER_DRAINING && worker_find(c, q->worker_id) == w
                             ? w->sessions_reported
                             : group_sessions_locked(c, group);
    Hyla__V1__WorkerInfo wi;
    Hyla__V1__LayerRange lr;
    Hyla__V1__Device dev;
    Hyla__V1__WorkerLoad ld;
    worker_info_locked(c, w, &wi, &lr, &dev, &ld);
    Hyla__V1__DrainWorkerResponse r = HYLA__V1__DRAIN_WORKER_RESPONSE__INIT;
    r.worker = &wi;
    r.sessions_moved = before > remaining ? before - remaining : 0;
    r.sessions_remaining = remaining;
    r.last_error = w->drain_error;
    hyla_rpc_call_reply(call, &r.base);
    pthread_mutex_unlock(&c->mu);
}

/* ------------------------------------------------------------------------------------------ */
/* Coordinator (worker membership)                                                             */

static void do_register(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant) {
    (void)tenant;
    const Hyla__V1__RegisterWorkerRequest *q = (const Hyla__V1__RegisterWorkerRequest *)m;
    if (!q->address || !q->address[0] || strlen(q->address) >= 256) {
        hyla_rpc_call_fail(call, HYLA_RPC_INVALID_ARGUMENT, "field address: host:port of the Worker service required");
        return;
    }
    if (!q->model || !q->model[0] || strlen(q->model) >= ID_MAX) {
        hyla_rpc_call_fail(call, HYLA_RPC_INVALID_ARGUMENT, "field model: 1..%d bytes required", ID_MAX - 1);
        return;
    }
    if (q->worker_id && strlen(q->worker_id) >= ID_MAX - 2) {
        hyla_rpc_call_fail(call, HYLA_RPC_INVALID_ARGUMENT, "field worker_id: at most %d bytes", ID_MAX - 3);
        return;
    }
    uint32_t lb = q->layers ? q->layers->begin : 0, le = q->layers ? q->layers->end : q->num_layers;
    if (q->num_layers == 0 || lb >= le || le > q->num_layers) {
        hyla_rpc_call_fail(call, HYLA_RPC_INVALID_ARGUMENT, "field layers: [%u, %u) is not a non-empty range of [0, %u)",
                           lb, le, q->num_layers);
        return;
    }
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < c->n_workers; i++) {
        const cworker *o = c->workers[i];
        if (worker_alive(o) && strcmp(o->model, q->model) == 0 && o->fingerprint != q->model_fingerprint &&
            !(q->worker_id && strcmp(o->id, q->worker_id) == 0)) {
            pthread_mutex_unlock(&c->mu);
            hyla_rpc_call_fail(call, HYLA_RPC_FAILED_PRECONDITION,
                               "model '%s' is served by worker %s with fingerprint %016llx; this worker has %016llx",
                               q->model, o->id, (unsigned long long)o->fingerprint,
                               (unsigned long long)q->model_fingerprint);
            return;
        }
    }
    cworker *w = q->worker_id && q->worker_id[0] ? worker_find(c, q->worker_id) : NULL;
    char old_group[ID_MAX] = "";
    if (w) {
        copy_str(old_group, sizeof old_group, w->group);
        HYLA_INFO("coordinator: worker %s registers again (was epoch %llu at %s)", w->id, (unsigned long long)w->epoch,
                  w->address);
    } else {
        w = calloc(1, sizeof *w);
        HYLA_ASSERT(w);
        if (q->worker_id && q->worker_id[0])
            copy_str(w->id, sizeof w->id, q->worker_id);
        else
            do
                snprintf(w->id, sizeof w->id, "w-%08llx", (unsigned long long)(hyla_rng_next(&c->rng) & 0xffffffffu));
            while (worker_find(c, w->id));
        if (c->n_workers == c->cap_workers) {
            size_t cap = c->cap_workers ? 2 * c->cap_workers : 8;
            cworker **nw = realloc(c->workers, cap * sizeof *nw);
            HYLA_ASSERT(nw);
            c->workers = nw;
            c->cap_workers = cap;
        }
        c->workers[c->n_workers++] = w;
        w->registered_ms = now_ms();
    }
    if (!w->client || strcmp(w->address, q->address) != 0) {
        if (w->client) {
            hyla_rpc_client **nr = realloc(c->retired, (c->n_retired + 1) * sizeof *nr);
            HYLA_ASSERT(nr);
            c->retired = nr;
            c->retired[c->n_retired++] = w->client;
        }
        hyla_rpc_client_params cp = hyla_rpc_client_default_params();
        cp.max_message_bytes = c->p.max_message_bytes;
        w->client = NULL;
        if (hyla_rpc_client_create(q->address, &cp, &w->client) != HYLA_OK)
            HYLA_WARN("coordinator: worker %s: %s", w->id, hyla_last_error());
    }
    copy_str(w->address, sizeof w->address, q->address);
    copy_str(w->model, sizeof w->model, q->model);
    copy_str(w->version, sizeof w->version, q->version);
    w->fingerprint = q->model_fingerprint;
    w->num_layers = q->num_layers;
    w->lb = lb;
    w->le = le;
    w->param_bytes = q->param_bytes;
    w->state_budget = q->state_budget_bytes;
    if (q->device) {
        copy_str(w->dev_name, sizeof w->dev_name, q->device->name);
        copy_str(w->dev_desc, sizeof w->dev_desc, q->device->description);
        w->mem_total = q->device->memory_total_bytes;
        w->mem_free = q->device->memory_free_bytes;
    }
    hyla__v1__worker_load__init(&w->load);
    w->state = HYLA__V1__WORKER_STATE__WORKER_READY;
    w->drain_error[0] = 0;
    w->epoch = ++c->epoch_counter;
    w->hb_ms = now_ms();
    w->hb_mono = hyla_now();
    w->reconcile = 1;
    assign_group_locked(c, w);
    if (old_group[0] && strcmp(old_group, w->group) != 0)
        for (size_t i = 0; i < c->n_sess; i++)
            if (strcmp(c->sess[i]->group, old_group) == 0 && !c->sess[i]->busy)
                unplace_locked(c, c->sess[i], "its worker re-registered in another group");
    hyla_status st = hyla_coord_dir_set_counter(c->dir, c->epoch_counter);
    Hyla__V1__RegisterWorkerResponse r = HYLA__V1__REGISTER_WORKER_RESPONSE__INIT;
    r.worker_id = w->id;
    r.epoch = w->epoch;
    r.heartbeat_interval_ms = c->p.heartbeat_ms;
    r.heartbeat_timeout_ms = c->p.dead_after_ms;
    r.group_id = w->group;
    r.stage = worker_stage_locked(c, w);
    char next_addr[256] = "";
    cworker *mem[MAX_STAGES];
    int nm = group_members_locked(c, w->group, mem);
    if (r.stage + 1 < (uint32_t)nm)
        copy_str(next_addr, sizeof next_addr, mem[r.stage + 1]->address);
    r.next_stage_address = next_addr;
    copy_str(w->told_next, sizeof w->told_next, next_addr);
    r.store_address = c->store_addr;
    HYLA_INFO("coordinator: worker %s at %s serves %s layers [%u, %u) of %u (epoch %llu, group %s)", w->id, w->address,
              w->model, lb, le, w->num_layers, (unsigned long long)w->epoch, w->group);
    pthread_cond_broadcast(&c->cv);
    if (st != HYLA_OK) {
        w->state = HYLA__V1__WORKER_STATE__WORKER_DEAD;
        pthread_mutex_unlock(&c->mu);
        hyla_rpc_call_fail_status(call, st, hyla_last_error());
        return;
    }
    hyla_rpc_call_reply(call, &r.base);
    pthread_mutex_unlock(&c->mu);
}

static void do_heartbeat(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant) {
    (void)tenant;
    const Hyla__V1__HeartbeatRequest *q = (const Hyla__V1__HeartbeatRequest *)m;
    if (!q->worker_id || !q->worker_id[0]) {
        hyla_rpc_call_fail(call, HYLA_RPC_INVALID_ARGUMENT, "field worker_id: required");
        return;
    }
    Hyla__V1__HeartbeatResponse r = HYLA__V1__HEARTBEAT_RESPONSE__INIT;
    char **unload = calloc(q->n_sessions + 1, sizeof *unload);
    HYLA_ASSERT(unload);
    size_t n_unload = 0;
    pthread_mutex_lock(&c->mu);
    cworker *w = worker_find(c, q->worker_id);
    if (!w || w->epoch != q->epoch || w->state == HYLA__V1__WORKER_STATE__WORKER_DEAD) {
        r.reregister = 1;
    } else {
        w->hb_ms = now_ms();
        w->hb_mono = hyla_now();
        /* its pipeline changed (a stage joined or died): registering again tells it its next stage */
        char next_addr[256] = "";
        cworker *mem[MAX_STAGES];
        int nm = group_members_locked(c, w->group, mem);
        uint32_t stage = worker_stage_locked(c, w);
        if (stage + 1 < (uint32_t)nm)
            copy_str(next_addr, sizeof next_addr, mem[stage + 1]->address);
        if (strcmp(next_addr, w->told_next) != 0)
            r.reregister = 1;
        if (q->load) {
            w->load = *q->load;
            w->load.base.unknown_fields = NULL;
            w->load.base.n_unknown_fields = 0;
        }
        w->sessions_reported = (uint32_t)q->n_sessions;
        copy_str(w->drain_error, sizeof w->drain_error, q->drain_error);
        for (size_t i = 0; i < q->n_sessions; i++) {
            const Hyla__V1__WorkerSessionStatus *ws = q->sessions[i];
            if (!ws || !ws->session_id)
                continue;
            csess *s = sess_find(c, ws->session_id);
            if (s && s->busy)
                continue; /* being placed right now: its record is about to change */
            if (!s || s->state != HYLA__V1__SESSION_STATE__SESSION_ACTIVE || strcmp(s->group, w->group) != 0 ||
                (ws->placement_epoch && ws->placement_epoch != s->epoch)) {
                unload[n_unload++] = ws->session_id;
                continue;
            }
            if (worker_stage_locked(c, w) == 0) {
                s->position = ws->position;
                s->generated = ws->generated;
                if (ws->tier)
                    s->tier = ws->tier;
            }
        }
        if (w->reconcile) { /* sessions it should hold but does not (it restarted) */
            w->reconcile = 0;
            for (size_t i = 0; i < c->n_sess; i++) {
                csess *s = c->sess[i];
                if (s->busy || s->state != HYLA__V1__SESSION_STATE__SESSION_ACTIVE || strcmp(s->group, w->group) != 0)
                    continue;
                int held = 0;
                for (size_t k = 0; k < q->n_sessions && !held; k++)
                    held = q->sessions[k] && q->sessions[k]->session_id &&
                           strcmp(q->sessions[k]->session_id, s->id) == 0;
                if (!held)
                    unplace_locked(c, s, "its worker restarted without it");
            }
        }
        if (w->state == HYLA__V1__WORKER_STATE__WORKER_DRAINING || w->state == HYLA__V1__WORKER_STATE__WORKER_DRAINED)
            r.drain = 1;
        if (w->state == HYLA__V1__WORKER_STATE__WORKER_DRAINING && q->n_sessions == 0) {
            w->state = HYLA__V1__WORKER_STATE__WORKER_DRAINED;
            for (size_t i = 0; i < c->n_sess; i++)
                if (!c->sess[i]->busy && strcmp(c->sess[i]->group, w->group) == 0)
                    unplace_locked(c, c->sess[i], "its worker drained");
            HYLA_INFO("coordinator: worker %s drained", w->id);
            pthread_cond_broadcast(&c->cv);
        }
    }
    r.n_unload_session_ids = n_unload;
    r.unload_session_ids = unload;
    hyla_rpc_call_reply(call, &r.base);
    pthread_mutex_unlock(&c->mu);
    free(unload);
}

/* A committed snapshot (from ReportSnapshot or the embedded store's commit hook). Returns
 * whether it is stale. c->mu held. */
static int note_snapshot_locked(hyla_coord *c, const char *sid, uint64_t placement_epoch,
                                const Hyla__V1__SnapshotInfo *si) {
    csess *s = sess_find(c, sid);
    if (!s)
        return 1;
    if (placement_epoch && placement_epoch < s->epoch)
        return 1;
    if (si && si->version > s->snap.version) {
        s->snap = *si;
        s->snap.base.unknown_fields = NULL;
        s->snap.base.n_unknown_fields = 0;
        if (si->position > s->position)
            s->position = si->position;
        persist_locked(c, s, 0, 0);
    }
    return 0;
}

static void do_report_snapshot(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant) {
    (void)tenant;
    const Hyla__V1__ReportSnapshotRequest *q = (const Hyla__V1__ReportSnapshotRequest *)m;
    REQUIRE_ID(call, q->session_id);
    pthread_mutex_lock(&c->mu);
    int known = sess_find(c, q->session_id) != NULL;
    int stale = note_snapshot_locked(c, q->session_id, q->placement_epoch, q->snapshot);
    pthread_mutex_unlock(&c->mu);
    if (!known) {
        hyla_rpc_call_fail(call, HYLA_RPC_NOT_FOUND, "session %s not found", q->session_id);
        return;
    }
    Hyla__V1__ReportSnapshotResponse r = HYLA__V1__REPORT_SNAPSHOT_RESPONSE__INIT;
    r.stale = stale;
    hyla_rpc_call_reply(call, &r.base);
}

/* ---- embedded store hooks ---- */

static hyla_status store_check_put(void *ud, const char *session, uint64_t placement_epoch) {
    hyla_coord *c = ud;
    pthread_mutex_lock(&c->mu);
    csess *s = sess_find(c, session);
    hyla_status st = HYLA_OK;
    if (!s)
        st = hyla_fail(HYLA_ERR_NOT_FOUND, "session %s is not in the directory", session);
    else if (placement_epoch < s->epoch)
        st = hyla_fail(HYLA_ERR_PERMISSION, "session %s: placement epoch %llu is stale (current %llu)", session,
                       (unsigned long long)placement_epoch, (unsigned long long)s->epoch);
    pthread_mutex_unlock(&c->mu);
    return st;
}

static void store_on_commit(void *ud, const char *session, uint64_t placement_epoch, const hyla_snapshot_info *info) {
    hyla_coord *c = ud;
    Hyla__V1__SnapshotInfo si = HYLA__V1__SNAPSHOT_INFO__INIT;
    hyla_store_rpc_info_to_msg(info, &si);
    pthread_mutex_lock(&c->mu);
    note_snapshot_locked(c, session, placement_epoch, &si);
    pthread_mutex_unlock(&c->mu);
}

/* ------------------------------------------------------------------------------------------ */
/* monitor                                                                                     */

static void *monitor_main(void *arg) {
    hyla_coord *c = arg;
    uint32_t period = c->p.heartbeat_ms / 2;
    if (period < 20)
        period = 20;
    if (period > 500)
        period = 500;
    pthread_mutex_lock(&c->mu);
    while (!c->stopping) {
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        t.tv_sec += period / 1000;
        t.tv_nsec += (long)(period % 1000) * 1000000L;
        if (t.tv_nsec >= 1000000000L) {
            t.tv_sec++;
            t.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&c->cv, &c->mu, &t);
        if (c->stopping)
            break;
        double now = hyla_now();
        for (size_t i = 0; i < c->n_workers; i++) {
            cworker *w = c->workers[i];
            if ((w->state == HYLA__V1__WORKER_STATE__WORKER_READY || w->state == HYLA__V1__WORKER_STATE__WORKER_DRAINING ||
                 w->state == HYLA__V1__WORKER_STATE__WORKER_DRAINED) &&
                (now - w->hb_mono) * 1000.0 > (double)c->p.dead_after_ms) {
                w->state = HYLA__V1__WORKER_STATE__WORKER_DEAD;
                HYLA_WARN("coordinator: worker %s (%s) missed heartbeats for %u ms: dead", w->id, w->address,
                          c->p.dead_after_ms);
                pthread_cond_broadcast(&c->cv);
            }
        }
        /* Sessions whose group cannot serve them any more; at start, workers get a grace period
         * to re-register before their sessions are taken off them. */
        if ((now - c->started_mono) * 1000.0 > (double)c->p.dead_after_ms)
            for (size_t i = 0; i < c->n_sess; i++) {
                csess *s = c->sess[i];
                if (s->state == HYLA__V1__SESSION_STATE__SESSION_ACTIVE && !s->busy && !group_complete_locked(c, s->group))
                    unplace_locked(c, s, "its group lost a worker");
            }
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* lifecycle                                                                                   */

hyla_coord_params hyla_coord_default_params(void) {
    hyla_coord_params p;
    memset(&p, 0, sizeof p);
    p.listen = "127.0.0.1:7000";
    p.embed_store = 1;
    p.heartbeat_ms = 1000;
    p.dead_after_ms = 5000;
    p.rpc_threads = 4;
    p.max_message_bytes = 16 << 20;
    p.worker_timeout_ms = 60000;
    return p;
}

static hyla_status add(hyla_coord *c, const char *path, void (*fn)(hyla_coord *, hyla_rpc_call *, const ProtobufCMessage *,
                                                                   const char *),
                       int inline_call, hyla_rpc_handler handler) {
    const hyla_api_method *m = hyla_api_find(path);
    HYLA_ASSERT(m && c->n_bindings < (int)(sizeof c->bindings / sizeof c->bindings[0]));
    binding *b = &c->bindings[c->n_bindings++];
    b->c = c;
    b->fn = fn;
    b->inline_call = inline_call;
    hyla_rpc_kind kind = (hyla_rpc_kind)((m->client_streaming ? HYLA_RPC_CLIENT_STREAM : 0) |
                                         (m->server_streaming ? HYLA_RPC_SERVER_STREAM : 0));
    return hyla_rpc_server_add_method(c->srv, path, kind, m->input, m->output, handler ? handler : h_unary, b);
}

hyla_status hyla_coord_start(const hyla_coord_params *params, hyla_coord **out) {
    *out = NULL;
    hyla_coord_params p = params ? *params : hyla_coord_default_params();
    if (!p.data_dir || !p.data_dir[0])
        return hyla_fail(HYLA_ERR_INVALID_ARG, "hyla-coordinator: --data DIR is required");
    if (!p.listen || !p.listen[0])
        return hyla_fail(HYLA_ERR_INVALID_ARG, "hyla-coordinator: --listen ADDR is empty");
    if (p.heartbeat_ms == 0)
        p.heartbeat_ms = 1000;
    if (p.dead_after_ms < 2 * p.heartbeat_ms)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "hyla-coordinator: dead_after_ms %u must be at least twice the heartbeat (%u ms)",
                         p.dead_after_ms, p.heartbeat_ms);
    if (p.worker_timeout_ms <= 0)
        p.worker_timeout_ms = 60000;
    hyla_coord *c = calloc(1, sizeof *c);
    if (!c)
        return hyla_fail(HYLA_ERR_NOMEM, "coordinator");
    c->p = p;
    c->stop_pipe[0] = c->stop_pipe[1] = -1;
    copy_str(c->listen, sizeof c->listen, p.listen);
    copy_str(c->data_dir, sizeof c->data_dir, p.data_dir);
    c->p.listen = c->listen;
    c->p.data_dir = c->data_dir;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    uint64_t seed = (uint64_t)now_ms() ^ ((uint64_t)getpid() << 32);
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        uint64_t r;
        if (read(fd, &r, sizeof r) == (ssize_t)sizeof r)
            seed ^= r;
        close(fd);
    }
    hyla_rng_seed(&c->rng, seed);
    c->started_mono = hyla_now();

    char path[1100];
    hyla_status st = hyla_mkdirs(p.data_dir);
    snprintf(path, sizeof path, "%s/directory", p.data_dir);
    if (st == HYLA_OK)
        st = hyla_coord_dir_open(path, &c->dir);
    if (st == HYLA_OK)
        st = hyla_coord_dir_get_counter(c->dir, &c->epoch_counter);
    if (st == HYLA_OK)
        st = hyla_coord_dir_scan(c->dir, load_session_fn, c);
    if (st == HYLA_OK && p.embed_store) {
        snprintf(path, sizeof path, "%s/store", p.data_dir);
        hyla_store_params sp = p.store ? *p.store : hyla_store_default_params();
        st = hyla_store_open(path, &sp, &c->store);
        if (st == HYLA_OK && hyla_store_recovery_note(c->store)[0])
            st = hyla_coord_dir_check_store(c->dir, c->store, NULL);
    }
    if (st == HYLA_OK && pipe(c->stop_pipe) != 0)
        st = hyla_fail(HYLA_ERR_IO, "pipe: %s", strerror(errno));
    hyla_rpc_server_params rp = hyla_rpc_server_default_params();
    rp.threads = p.rpc_threads > 0 ? p.rpc_threads : 4;
    rp.max_message_bytes = p.max_message_bytes;
    if (st == HYLA_OK)
        st = hyla_rpc_server_create(&rp, &c->srv);
    if (st == HYLA_OK) {
        st = add(c, SVC_SESSIONS "CreateSession", do_create, 0, NULL);
        if (st == HYLA_OK) st = add(c, SVC_SESSIONS "GetSession", do_get, 1, NULL);
        if (st == HYLA_OK) st = add(c, SVC_SESSIONS "ListSessions", do_list, 1, NULL);
        if (st == HYLA_OK) st = add(c, SVC_SESSIONS "DeleteSession", do_delete, 0, NULL);
        if (st == HYLA_OK) st = add(c, SVC_SESSIONS "Pause", do_pause, 0, NULL);
        if (st == HYLA_OK) st = add(c, SVC_SESSIONS "Resume", do_resume, 0, NULL);
        if (st == HYLA_OK) st = add(c, SVC_SESSIONS "Migrate", do_migrate, 0, NULL);
        if (st == HYLA_OK) st = add(c, SVC_SESSIONS "Fork", do_fork, 0, NULL);
        if (st == HYLA_OK) st = add(c, SVC_SESSIONS "Generate", NULL, 0, h_generate);
        if (st == HYLA_OK) st = add(c, SVC_SESSIONS "Append", NULL, 0, h_append);
        if (st == HYLA_OK) st = add(c, SVC_CLUSTER "ListWorkers", do_list_workers, 1, NULL);
        if (st == HYLA_OK) st = add(c, SVC_CLUSTER "ListClusterSessions", do_list_cluster_sessions, 1, NULL);
        if (st == HYLA_OK) st = add(c, SVC_CLUSTER "DrainWorker", do_drain, 0, NULL);
        if (st == HYLA_OK) st = add(c, SVC_COORD "RegisterWorker", do_register, 1, NULL);
        if (st == HYLA_OK) st = add(c, SVC_COORD "Heartbeat", do_heartbeat, 1, NULL);
        if (st == HYLA_OK) st = add(c, SVC_COORD "ReportSnapshot", do_report_snapshot, 1, NULL);
    }
    if (st == HYLA_OK && c->store) {
        c->hooks.check_put = store_check_put;
        c->hooks.on_commit = store_on_commit;
        c->hooks.ud = c;
        st = hyla_store_rpc_register(c->srv, c->store, &c->hooks);
    }
    if (st == HYLA_OK)
        st = hyla_rpc_server_listen(c->srv, p.listen, &c->port);
    if (st == HYLA_OK) {
        if (p.advertise && p.advertise[0]) {
            copy_str(c->advertise, sizeof c->advertise, p.advertise);
        } else {
            const char *colon = strrchr(p.listen, ':');
            int hl = colon ? (int)(colon - p.listen) : (int)strlen(p.listen);
            const char *host = p.listen;
            if ((hl == 7 && strncmp(host, "0.0.0.0", 7) == 0) || (hl == 4 && strncmp(host, "[::]", 4) == 0))
                host = "127.0.0.1", hl = 9;
            snprintf(c->advertise, sizeof c->advertise, "%.*s:%d", hl, host, c->port);
        }
        if (c->store)
            copy_str(c->store_addr, sizeof c->store_addr, c->advertise);
        else
            copy_str(c->store_addr, sizeof c->store_addr, p.store_address);
    }
    if (st == HYLA_OK)
        st = hyla_rpc_server_start(c->srv);
    if (st == HYLA_OK) {
        if (pthread_create(&c->monitor, NULL, monitor_main, c) != 0)
            st = hyla_fail(HYLA_ERR_INTERNAL, "coordinator: cannot start the monitor thread");
        else
            c->monitor_started = 1;
    }
    if (st != HYLA_OK) {
        hyla_coord_destroy(c);
        return st;
    }
    HYLA_INFO("coordinator: serving on %s (advertised %s), %zu sessions in %s/directory, store %s", c->listen,
              c->advertise, c->n_sess, p.data_dir, c->store ? "embedded" : (c->store_addr[0] ? c->store_addr : "none"));
    *out = c;
    return HYLA_OK;
}

int hyla_coord_port(const hyla_coord *c) { return c->port; }

void hyla_coord_wait(hyla_coord *c) {
    char b;
    while (read(c->stop_pipe[0], &b, 1) < 0 && errno == EINTR) {
    }
}

void hyla_coord_request_stop(hyla_coord *c) {
    char b = 1;
    ssize_t r = write(c->stop_pipe[1], &b, 1);
    (void)r;
}

void hyla_coord_destroy(hyla_coord *c) {
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    c->stopping = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (c->monitor_started)
        pthread_join(c->monitor, NULL);
    hyla_rpc_server_destroy(c->srv); /* calls end; jobs release theirs */
    pthread_mutex_lock(&c->mu);
    while (c->jobs > 0 || c->relays > 0) /* relays end when their worker streams do */
        pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
    for (size_t i = 0; i < c->n_workers; i++) {
        hyla_rpc_client_destroy(c->workers[i]->client);
        free(c->workers[i]);
    }
    for (size_t i = 0; i < c->n_retired; i++)
        hyla_rpc_client_destroy(c->retired[i]);
    free(c->retired);
    free(c->workers);
    for (size_t i = 0; i < c->n_sess; i++)
        free(c->sess[i]);
    free(c->sess);
    hyla_store_close(c->store);
    hyla_coord_dir_close(c->dir);
    if (c->stop_pipe[0] >= 0)
        close(c->stop_pipe[0]);
    if (c->stop_pipe[1] >= 0)
        close(c->stop_pipe[1]);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
}
