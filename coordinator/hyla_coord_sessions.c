/* hyla_coord_sessions.c — the Sessions service's unary methods: CreateSession, GetSession,
 * ListSessions, DeleteSession, Pause, Resume, Migrate, Fork (docs/API.md describes each).
 *
 * Each handler validates its request, takes the session for the call (coord_acquire: one
 * placement-changing call per session at a time), does its Worker calls through the placement
 * functions, and answers once: a reply, or coord_answer_error with the status that failed.
 * Every path that took the session releases it before it returns.
 *
 * Threading: Get and List run inline on an rpc loop thread (memory only); the others run on a
 * job thread each (hyla_coord.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_coord_impl.h"
#include "hyla_log.h"

hyla_status coord_check_sampling(const Hyla__V1__SamplingParams *sp) {
    if (!sp)
        return HYLA_OK;
    if (!isfinite(sp->temperature) || sp->temperature < 0)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "field sampling.temperature: %g must be finite and >= 0",
                         (double)sp->temperature);
    if (!isfinite(sp->top_p) || sp->top_p < 0 || sp->top_p > 1)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "field sampling.top_p: %g must be in [0, 1]", (double)sp->top_p);
    return HYLA_OK;
}

hyla_status coord_check_session_id(const char *id) { return hyla_session_id_check(id, "field session_id"); }

/* The session a request names, acquired for this call (coord_release when done), or NULL
 * once the call has been answered with the reason: a malformed id, no such session, another
 * tenant's, deleted meanwhile. */
static csess *acquire_for_call(hyla_coord *c, hyla_rpc_call *call, const char *id, const char *tenant) {
    csess *s = NULL;
    hyla_status st = coord_check_session_id(id);
    if (st == HYLA_OK)
        st = coord_acquire(c, id, tenant, &s);
    if (st != HYLA_OK)
        coord_answer_error(call, st);
    return s;
}

static void reply_view(hyla_coord *c, hyla_rpc_call *call, csess *s) {
    sess_view *v = malloc(sizeof *v);
    HYLA_ASSERT(v);
    pthread_mutex_lock(&c->mu);
    coord_view_make_locked(c, s, v);
    pthread_mutex_unlock(&c->mu);
    hyla_rpc_call_reply(call, &v->s.base);
    free(v);
}

void coord_do_create(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant) {
    const Hyla__V1__CreateSessionRequest *q = (const Hyla__V1__CreateSessionRequest *)m;
    hyla_status st = coord_check_sampling(q->sampling);
    if (st != HYLA_OK) {
        coord_answer_error(call, st);
        return;
    }
    csess *s = coord_sess_new();
    pthread_mutex_lock(&c->mu);
    st = coord_resolve_model_locked(c, q->model, s->model);
    if (st != HYLA_OK) {
        pthread_mutex_unlock(&c->mu);
        free(s);
        coord_answer_error(call, st);
        return;
    }
    coord_new_session_id_locked(c, s->id);
    coord_copy_str(s->tenant, sizeof s->tenant, tenant);
    if (q->sampling) {
        s->temperature = q->sampling->temperature;
        s->top_k = q->sampling->top_k > 0 ? q->sampling->top_k : 0; /* <= 0: top-k off */
        s->top_p = q->sampling->top_p;
    }
    s->seed = q->seed;
    s->state = HYLA__V1__SESSION_STATE__SESSION_MOVING;
    s->busy = 1;
    coord_sess_insert_locked(c, s);
    s->refs++; /* this call's */
    pthread_mutex_unlock(&c->mu);

    st = coord_place(c, s, q->worker_hint, NULL, 0);
    if (st != HYLA_OK) {
        pthread_mutex_lock(&c->mu);
        coord_sess_remove_locked(c, s);
        s->busy = 0;
        pthread_cond_broadcast(&c->cv);
        coord_sess_unref_locked(s);
        pthread_mutex_unlock(&c->mu);
        coord_answer_error(call, st);
        return;
    }
    HYLA_INFO("coordinator: tenant %s created session %s (model %s)", tenant, s->id, s->model);
    reply_view(c, call, s);
    coord_release(c, s);
}

void coord_do_get(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant) {
    const Hyla__V1__GetSessionRequest *q = (const Hyla__V1__GetSessionRequest *)m;
    hyla_status st = coord_check_session_id(q->session_id);
    if (st != HYLA_OK) {
        coord_answer_error(call, st);
        return;
    }
    sess_view *v = malloc(sizeof *v);
    HYLA_ASSERT(v);
    pthread_mutex_lock(&c->mu);
    csess *s = coord_sess_find(c, q->session_id);
    int mine = s && strcmp(s->tenant, tenant) == 0;
    if (mine)
        coord_view_make_locked(c, s, v);
    pthread_mutex_unlock(&c->mu);
    if (!s)
        coord_answer_error(call, hyla_fail(HYLA_ERR_NOT_FOUND, "session %s not found", q->session_id));
    else if (!mine)
        coord_answer_error(call, hyla_fail(HYLA_ERR_PERMISSION, "session %s belongs to another tenant", q->session_id));
    else
        hyla_rpc_call_reply(call, &v->s.base);
    free(v);
}

typedef struct {
    const char *tenant, *model;
} list_arg;

static int filter_tenant(const hyla_coord *c, const csess *s, const void *arg) {
    (void)c;
    const list_arg *a = arg;
    return strcmp(s->tenant, a->tenant) == 0 && (!a->model[0] || strcmp(s->model, a->model) == 0);
}

void coord_do_list(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant) {
    const Hyla__V1__ListSessionsRequest *q = (const Hyla__V1__ListSessionsRequest *)m;
    list_arg a = {tenant, q->model ? q->model : ""};
    coord_list_page(c, call, q->page_size, q->page_token, filter_tenant, &a, 0);
}

void coord_do_delete(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant) {
    const Hyla__V1__DeleteSessionRequest *q = (const Hyla__V1__DeleteSessionRequest *)m;
    csess *s = acquire_for_call(c, call, q->session_id, tenant);
    if (!s)
        return;
    char ids[MAX_STAGES][ID_MAX];
    pthread_mutex_lock(&c->mu);
    int n = s->state == HYLA__V1__SESSION_STATE__SESSION_ACTIVE ? coord_owners_locked(c, s, ids) : 0;
    uint64_t epoch = s->epoch;
    pthread_mutex_unlock(&c->mu);
    coord_unload_on(c, ids, n, s->id, epoch); /* best effort: heartbeats unload leftovers */
    uint64_t deleted = 0;
    if (c->store) {
        uint64_t *versions = NULL;
        size_t nv = 0;
        if (hyla_store_versions(c->store, s->id, &versions, &nv) == HYLA_OK)
            deleted = nv;
        free(versions);
        hyla_status st = hyla_store_delete(c->store, s->id);
        if (st != HYLA_OK && st != HYLA_ERR_NOT_FOUND) {
            st = hyla_fail_wrap(st, "deleting the snapshots of session %s", s->id);
            coord_release(c, s);
            coord_answer_error(call, st); /* a full disk is RESOURCE_EXHAUSTED, not INTERNAL */
            return;
        }
    }
    pthread_mutex_lock(&c->mu);
    hyla_status st = hyla_coord_dir_delete(c->dir, s->id);
    if (st == HYLA_OK)
        coord_sess_remove_locked(c, s);
    pthread_mutex_unlock(&c->mu);
    coord_release(c, s);
    if (st != HYLA_OK) {
        coord_answer_error(call, HYLA_ERR_INTERNAL);
        return;
    }
    HYLA_INFO("coordinator: session %s deleted (%llu snapshot versions)", q->session_id, (unsigned long long)deleted);
    Hyla__V1__DeleteSessionResponse r = HYLA__V1__DELETE_SESSION_RESPONSE__INIT;
    r.snapshots_deleted = deleted;
    hyla_rpc_call_reply(call, &r.base);
}

void coord_do_pause(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant) {
    const Hyla__V1__PauseRequest *q = (const Hyla__V1__PauseRequest *)m;
    csess *s = acquire_for_call(c, call, q->session_id, tenant);
    if (!s)
        return;
    Hyla__V1__SnapshotInfo si = HYLA__V1__SNAPSHOT_INFO__INIT;
    pthread_mutex_lock(&c->mu);
    int active = s->state == HYLA__V1__SESSION_STATE__SESSION_ACTIVE;
    si = s->snap;
    pthread_mutex_unlock(&c->mu);
    if (active) {
        hyla_status st = coord_snapshot_now(c, s, &si);
        if (st != HYLA_OK) {
            coord_release(c, s);
            coord_answer_error(call, st);
            return;
        }
        if (q->evict) {
            char ids[MAX_STAGES][ID_MAX];
            pthread_mutex_lock(&c->mu);
            int n = coord_owners_locked(c, s, ids);
            uint64_t epoch = s->epoch;
            pthread_mutex_unlock(&c->mu);
            coord_unload_on(c, ids, n, s->id, epoch);
            pthread_mutex_lock(&c->mu);
            coord_unplace_locked(c, s, "paused with evict");
            pthread_mutex_unlock(&c->mu);
        } else {
            pthread_mutex_lock(&c->mu);
            s->paused = 1;
            coord_persist_locked(c, s, 1, 0);
            pthread_mutex_unlock(&c->mu);
        }
    }
    sess_view *v = malloc(sizeof *v);
    HYLA_ASSERT(v);
    pthread_mutex_lock(&c->mu);
    coord_view_make_locked(c, s, v);
    pthread_mutex_unlock(&c->mu);
    Hyla__V1__PauseResponse r = HYLA__V1__PAUSE_RESPONSE__INIT;
    r.session = &v->s;
    r.snapshot = &si;
    hyla_rpc_call_reply(call, &r.base);
    free(v);
    coord_release(c, s);
}

void coord_do_resume(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant) {
    const Hyla__V1__ResumeRequest *q = (const Hyla__V1__ResumeRequest *)m;
    csess *s = acquire_for_call(c, call, q->session_id, tenant);
    if (!s)
        return;
    pthread_mutex_lock(&c->mu);
    int active = s->state == HYLA__V1__SESSION_STATE__SESSION_ACTIVE;
    uint64_t version = s->snap.version;
    pthread_mutex_unlock(&c->mu);
    hyla_status st = HYLA_OK;
    if (!active) {
        st = coord_place(c, s, q->worker_hint, NULL, version);
    } else {
        pthread_mutex_lock(&c->mu);
        if (s->paused) { /* still resident: resuming is a directory change */
            s->paused = 0;
            coord_persist_locked(c, s, 1, 0);
        }
        pthread_mutex_unlock(&c->mu);
    }
    if (st == HYLA_OK)
        reply_view(c, call, s);
    else
        coord_answer_error(call, st);
    coord_release(c, s);
}

void coord_do_migrate(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant) {
    const Hyla__V1__MigrateRequest *q = (const Hyla__V1__MigrateRequest *)m;
    csess *s = acquire_for_call(c, call, q->session_id, tenant);
    if (!s)
        return;
    char from[ID_MAX];
    Hyla__V1__SnapshotInfo si;
    hyla_status st = coord_move(c, s, q->to_worker, from, &si);
    if (st != HYLA_OK) {
        coord_release(c, s);
        coord_answer_error(call, st);
        return;
    }
    sess_view *v = malloc(sizeof *v);
    HYLA_ASSERT(v);
    pthread_mutex_lock(&c->mu);
    coord_view_make_locked(c, s, v);
    pthread_mutex_unlock(&c->mu);
    Hyla__V1__MigrateResponse r = HYLA__V1__MIGRATE_RESPONSE__INIT;
    r.session = &v->s;
    r.from_group_id = from;
    r.snapshot = &si;
    hyla_rpc_call_reply(call, &r.base);
    free(v);
    coord_release(c, s);
}

/* Fork: every stage of the parent's group forks the part of the state it holds, then the fork
 * moves to the hinted worker's group if one is named. */
void coord_do_fork(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant) {
    const Hyla__V1__ForkRequest *q = (const Hyla__V1__ForkRequest *)m;
    char owner[ID_MAX];
    hyla_status st = coord_check_session_id(q->session_id);
    if (st == HYLA_OK)
        st = coord_check_sampling(q->sampling);
    csess *p = NULL;
    if (st == HYLA_OK)
        st = coord_acquire(c, q->session_id, tenant, &p);
    if (st != HYLA_OK) {
        coord_answer_error(call, st);
        return;
    }
    uint64_t epoch;
    char ids[MAX_STAGES][ID_MAX];
    int n_owners = 0;
    st = coord_ensure_active(c, p, owner, &epoch);
    if (st == HYLA_OK) {
        pthread_mutex_lock(&c->mu);
        n_owners = coord_owners_locked(c, p, ids);
        pthread_mutex_unlock(&c->mu);
        if (n_owners < 1)
            st = hyla_fail(HYLA_ERR_UNAVAILABLE, "fork of session %s: no live worker holds it", p->id);
    }
    if (st != HYLA_OK) {
        coord_release(c, p);
        coord_answer_error(call, st);
        return;
    }
    csess *s = coord_sess_new();
    pthread_mutex_lock(&c->mu);
    coord_new_session_id_locked(c, s->id);
    coord_copy_str(s->tenant, sizeof s->tenant, p->tenant);
    coord_copy_str(s->model, sizeof s->model, p->model);
    coord_copy_str(s->parent, sizeof s->parent, p->id);
    coord_copy_str(s->group, sizeof s->group, p->group);
    s->temperature = q->sampling ? q->sampling->temperature : p->temperature;
    s->top_k = q->sampling ? (q->sampling->top_k > 0 ? q->sampling->top_k : 0) : p->top_k;
    s->top_p = q->sampling ? q->sampling->top_p : p->top_p;
    s->seed = q->reseed ? q->seed : p->seed;
    s->position = p->position;
    s->generated = p->generated;
    s->state = HYLA__V1__SESSION_STATE__SESSION_MOVING;
    s->busy = 1;
    s->epoch = ++c->epoch_counter;
    coord_sess_insert_locked(c, s);
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
    st = HYLA_OK;
    for (int i = n_owners - 1; i >= 1 && st == HYLA_OK; i--) {
        ProtobufCMessage *ri = NULL;
        st = coord_call_worker(c, ids[i], SVC_WORKER "ForkSession", &fq.base,
                               &hyla__v1__worker_session_response__descriptor, &ri, &res);
        if (ri)
            protobuf_c_message_free_unpacked(ri, NULL);
        if (st != HYLA_OK)
            coord_unload_on(c, ids, n_owners, s->id, s->epoch);
    }
    if (st == HYLA_OK) {
        st = coord_call_worker(c, ids[0], SVC_WORKER "ForkSession", &fq.base,
                               &hyla__v1__worker_session_response__descriptor, &r, &res);
        if (st != HYLA_OK)
            coord_unload_on(c, ids, n_owners, s->id, s->epoch);
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
        if (coord_persist_locked(c, s, 1, 1) != HYLA_OK) {
            st = HYLA_ERR_INTERNAL;
            res.code = HYLA_RPC_INTERNAL;
            snprintf(res.message, sizeof res.message, "%s", hyla_last_error());
        }
    }
    if (st != HYLA_OK)
        coord_sess_remove_locked(c, s);
    pthread_mutex_unlock(&c->mu);
    if (r)
        protobuf_c_message_free_unpacked(r, NULL);
    if (st == HYLA_OK && q->worker_hint && *q->worker_hint) {
        /* the hint names another group: move the fork there (a preference: on failure it stays) */
        pthread_mutex_lock(&c->mu);
        cworker *hw = coord_worker_find(c, q->worker_hint);
        int other = hw && strcmp(hw->group, s->group) != 0;
        pthread_mutex_unlock(&c->mu);
        char from[ID_MAX];
        Hyla__V1__SnapshotInfo si;
        if (other && coord_move(c, s, q->worker_hint, from, &si) != HYLA_OK)
            HYLA_WARN("coordinator: fork %s stays on group %s: moving it to %s's group failed: %s", s->id, s->group,
                      q->worker_hint, hyla_last_error());
    }
    if (st == HYLA_OK) {
        HYLA_INFO("coordinator: session %s forked from %s", s->id, p->id);
        reply_view(c, call, s);
    } else {
        coord_answer_error(call, hyla_fail(res.code == HYLA_RPC_OK ? HYLA_ERR_INTERNAL
                                                                   : hyla_rpc_status_from_code(res.code),
                                           "fork of session %s: %s", p->id, res.message));
    }
    coord_release(c, s);
    coord_release(c, p);
}
