/* hyla_coord_sessions.c — the Sessions service's unary methods: CreateSession, GetSession,
 * ListSessions, DeleteSession, Pause, Resume, Migrate, Fork, ListSnapshots, ListModels
 * (docs/API.md describes each). Resume and Fork with a version read the coordinator's embedded
 * store: a rewind places the session from a kept version and commits it as the new head; a fork
 * from a version shares that version's chunks under the fork's id (hyla_store_fork) and places
 * the fork from it.
 *
 * Each handler validates its request, takes the session for the call (coord_acquire: one
 * placement-changing call per session at a time), does its Worker calls through the placement
 * functions, and answers once: a reply, or coord_answer_error with the status that failed.
 * Every path that took the session releases it before it returns.
 *
 * Threading: Get, List and ListModels run inline on an rpc loop thread (memory only); the others
 * run on a job thread each (hyla_coord.c). */
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

/* A new session whose placement failed: out of the table, this call's reference dropped, the
 * call answered with st. */
static void abandon_new(hyla_coord *c, hyla_rpc_call *call, csess *s, hyla_status st) {
    pthread_mutex_lock(&c->mu);
    coord_sess_drop_new_locked(c, s);
    pthread_mutex_unlock(&c->mu);
    coord_answer_error(call, st);
}

static void reply_view(hyla_coord *c, hyla_rpc_call *call, csess *s) {
    sess_view *v = coord_view_of(c, s);
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
    if (st == HYLA_OK)
        st = coord_quota_new_session_locked(c, tenant);
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
    coord_sess_insert_new_locked(c, s);
    pthread_mutex_unlock(&c->mu);

    st = coord_place(c, s, q->worker_hint, NULL, 0);
    if (st != HYLA_OK) {
        abandon_new(c, call, s, st);
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
    sess_view *v = coord_view_of(c, s);
    Hyla__V1__PauseResponse r = HYLA__V1__PAUSE_RESPONSE__INIT;
    r.session = &v->s;
    r.snapshot = &si;
    hyla_rpc_call_reply(call, &r.base);
    free(v);
    coord_release(c, s);
}

/* The kept version `version` of session id exists in the embedded store (a rewind or a fork
 * from a version needs it): HYLA_ERR_NOT_FOUND naming the kept range otherwise. */
hyla_status coord_check_kept_version(hyla_coord *c, const char *id, uint64_t version) {
    if (!c->store)
        return hyla_fail(HYLA_ERR_UNSUPPORTED,
                         "field version: choosing a snapshot version needs the coordinator's embedded store "
                         "(this one uses the store at %s)", c->store_addr);
    uint64_t *v = NULL;
    size_t n = 0;
    hyla_status st = hyla_store_versions(c->store, id, &v, &n);
    if (st == HYLA_ERR_NOT_FOUND)
        return hyla_fail(HYLA_ERR_NOT_FOUND, "field version: session %s has no snapshot yet", id);
    if (st != HYLA_OK)
        return hyla_fail_wrap(st, "listing the snapshots of session %s", id);
    int found = 0;
    for (size_t i = 0; i < n; i++)
        found |= v[i] == version;
    uint64_t lo = n ? v[0] : 0, hi = n ? v[n - 1] : 0;
    free(v);
    if (!found)
        return hyla_fail(HYLA_ERR_NOT_FOUND, "field version: session %s keeps no version %llu (kept: %llu..%llu)", id,
                         (unsigned long long)version, (unsigned long long)lo, (unsigned long long)hi);
    return HYLA_OK;
}

/* Rewind: s (held busy) leaves its group, is placed again from `version`, and that state is
 * committed as a new head version at once, so a worker failure or a restart resumes the
 * rewound conversation, not the newer one. The newer versions stay in the store as history
 * until retention drops them. */
static hyla_status rewind_to(hyla_coord *c, csess *s, const char *hint, uint64_t version) {
    HYLA_TRY(coord_check_kept_version(c, s->id, version));
    char ids[MAX_STAGES][ID_MAX];
    int active;
    uint64_t epoch;
    int n = coord_active_owners(c, s, ids, &active, &epoch);
    if (active) {
        coord_unload_on(c, ids, n, s->id, epoch);
        pthread_mutex_lock(&c->mu);
        coord_unplace_locked(c, s, "rewound");
        pthread_mutex_unlock(&c->mu);
    }
    HYLA_TRY(coord_place(c, s, hint, NULL, version));
    Hyla__V1__SnapshotInfo si = HYLA__V1__SNAPSHOT_INFO__INIT;
    hyla_status st = coord_snapshot_now(c, s, &si);
    if (st != HYLA_OK)
        return hyla_fail_wrap(st, "committing session %s rewound to version %llu", s->id, (unsigned long long)version);
    HYLA_INFO("coordinator: session %s rewound to version %llu (position %llu), committed as version %llu", s->id,
              (unsigned long long)version, (unsigned long long)si.position, (unsigned long long)si.version);
    return HYLA_OK;
}

/* A resident session s (held busy) whose call named a hint of another group moves there, as a
 * placement would have put it; the hint is a preference, so a failed move leaves it active where
 * it is (what: the call, for the log). */
static void move_to_hint(hyla_coord *c, csess *s, const char *hint, const char *what) {
    if (!hint || !*hint)
        return;
    pthread_mutex_lock(&c->mu);
    cworker *hw = coord_worker_find(c, hint);
    int other = hw && strcmp(hw->group, s->group) != 0;
    pthread_mutex_unlock(&c->mu);
    char from[ID_MAX];
    Hyla__V1__SnapshotInfo si;
    if (other && coord_move(c, s, hint, from, &si) != HYLA_OK)
        HYLA_WARN("coordinator: %s of %s: it stays on group %s: moving it to %s's group failed: %s", what, s->id,
                  s->group, hint, hyla_last_error());
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
    hyla_status st = coord_check_hint(c, q->worker_hint, s->model);
    if (st == HYLA_OK && q->version) {
        st = rewind_to(c, s, q->worker_hint, q->version);
    } else if (st == HYLA_OK && !active) {
        st = coord_place(c, s, q->worker_hint, NULL, version);
    } else if (st == HYLA_OK) {
        pthread_mutex_lock(&c->mu);
        if (s->paused) { /* still resident: resuming is a directory change */
            s->paused = 0;
            coord_persist_locked(c, s, 1, 0);
        }
        pthread_mutex_unlock(&c->mu);
        move_to_hint(c, s, q->worker_hint, "resume");
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
    sess_view *v = coord_view_of(c, s);
    Hyla__V1__MigrateResponse r = HYLA__V1__MIGRATE_RESPONSE__INIT;
    r.session = &v->s;
    r.from_group_id = from;
    r.snapshot = &si;
    hyla_rpc_call_reply(call, &r.base);
    free(v);
    coord_release(c, s);
}

/* Fork from a kept version of p (held busy): the store shares that version's chunks under
 * the fork's id (its version 1), and the fork is placed from it like a resumed session. */
static void fork_from_version(hyla_coord *c, hyla_rpc_call *call, csess *p, const char *hint, uint64_t version) {
    hyla_status st = coord_check_kept_version(c, p->id, version);
    if (st != HYLA_OK) {
        coord_answer_error(call, st);
        return;
    }
    csess *s = coord_sess_new();
    pthread_mutex_lock(&c->mu);
    coord_new_session_id_locked(c, s->id);
    coord_copy_str(s->tenant, sizeof s->tenant, p->tenant);
    coord_copy_str(s->model, sizeof s->model, p->model);
    coord_copy_str(s->parent, sizeof s->parent, p->id);
    s->temperature = p->temperature;
    s->top_k = p->top_k;
    s->top_p = p->top_p;
    s->seed = p->seed;
    coord_sess_insert_new_locked(c, s);
    pthread_mutex_unlock(&c->mu);
    st = hyla_store_fork(c->store, p->id, version, s->id);
    if (st != HYLA_OK)
        st = hyla_fail_wrap(st, "fork of session %s from version %llu", p->id, (unsigned long long)version);
    if (st == HYLA_OK) {
        /* the store's copy is the fork's committed version 1: the directory records it so that
         * a failure or a restart resumes the fork from it */
        hyla_store_snapshot_info *info = NULL;
        size_t n = 0;
        hyla_status ist = hyla_store_snapshots(c->store, s->id, &info, &n);
        pthread_mutex_lock(&c->mu);
        s->snap.version = 1;
        if (ist == HYLA_OK && n > 0) {
            s->snap.position = info[n - 1].position;
            s->snap.state_bytes = info[n - 1].raw_bytes;
            s->snap.stored_bytes = info[n - 1].stored_bytes;
            s->snap.created_unix_ms = info[n - 1].time_us / 1000;
        }
        pthread_mutex_unlock(&c->mu);
        free(info);
        st = coord_place(c, s, hint, NULL, 1);
        if (st != HYLA_OK)
            hyla_store_delete(c->store, s->id);
    }
    if (st != HYLA_OK) {
        abandon_new(c, call, s, st);
        return;
    }
    HYLA_INFO("coordinator: session %s forked from %s version %llu", s->id, p->id, (unsigned long long)version);
    reply_view(c, call, s);
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
    if (st == HYLA_OK && q->version && (q->sampling || q->reseed))
        st = hyla_fail(HYLA_ERR_INVALID_ARG, "field version: a fork from a version keeps that version's sampling "
                                             "and RNG; leave sampling and reseed unset");
    csess *p = NULL;
    if (st == HYLA_OK)
        st = coord_acquire(c, q->session_id, tenant, &p);
    if (st == HYLA_OK && (st = coord_check_hint(c, q->worker_hint, p->model)) != HYLA_OK)
        coord_release(c, p);
    if (st != HYLA_OK) {
        coord_answer_error(call, st);
        return;
    }
    if (q->version) {
        fork_from_version(c, call, p, q->worker_hint, q->version);
        coord_release(c, p);
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
    st = coord_quota_new_session_locked(c, p->tenant);
    if (st != HYLA_OK) {
        pthread_mutex_unlock(&c->mu);
        free(s);
        coord_release(c, p);
        coord_answer_error(call, st);
        return;
    }
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
    s->epoch = ++c->epoch_counter;
    coord_sess_insert_new_locked(c, s);
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
    if (st == HYLA_OK)
        move_to_hint(c, s, q->worker_hint, "fork");
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

void coord_do_list_snapshots(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant) {
    const Hyla__V1__ListSnapshotsRequest *q = (const Hyla__V1__ListSnapshotsRequest *)m;
    hyla_status st = coord_check_session_id(q->session_id);
    if (st == HYLA_OK) {
        pthread_mutex_lock(&c->mu);
        csess *s = coord_sess_find(c, q->session_id);
        int mine = s && strcmp(s->tenant, tenant) == 0;
        pthread_mutex_unlock(&c->mu);
        if (!s)
            st = hyla_fail(HYLA_ERR_NOT_FOUND, "session %s not found", q->session_id);
        else if (!mine)
            st = hyla_fail(HYLA_ERR_PERMISSION, "session %s belongs to another tenant", q->session_id);
        else if (!c->store)
            st = hyla_fail(HYLA_ERR_UNSUPPORTED, "ListSnapshots needs the coordinator's embedded store "
                                                 "(this one uses the store at %s)", c->store_addr);
    }
    if (st != HYLA_OK) {
        coord_answer_error(call, st);
        return;
    }
    hyla_store_snapshot_info *info = NULL;
    size_t n = 0;
    st = hyla_store_snapshots(c->store, q->session_id, &info, &n);
    if (st == HYLA_ERR_NOT_FOUND) { /* no snapshot yet: an empty history */
        st = HYLA_OK;
        n = 0;
    }
    if (st != HYLA_OK) {
        free(info);
        coord_answer_error(call, hyla_fail_wrap(st, "listing the snapshots of session %s", q->session_id));
        return;
    }
    Hyla__V1__SnapshotVersion *vs = calloc(n ? n : 1, sizeof *vs);
    Hyla__V1__SnapshotVersion **ps = calloc(n ? n : 1, sizeof *ps);
    HYLA_ASSERT(vs && ps);
    for (size_t i = 0; i < n; i++) {
        hyla__v1__snapshot_version__init(&vs[i]);
        vs[i].version = info[i].version;
        vs[i].position = info[i].position;
        vs[i].generated = info[i].n_generated;
        vs[i].created_unix_ms = info[i].time_us / 1000;
        vs[i].state_bytes = info[i].raw_bytes;
        vs[i].stored_bytes = info[i].stored_bytes;
        vs[i].head = info[i].is_head != 0;
        ps[i] = &vs[i];
    }
    Hyla__V1__ListSnapshotsResponse r = HYLA__V1__LIST_SNAPSHOTS_RESPONSE__INIT;
    r.n_snapshots = n;
    r.snapshots = ps;
    hyla_rpc_call_reply(call, &r.base);
    free(ps);
    free(vs);
    free(info);
}

static int cmp_model(const void *a, const void *b) {
    return strcmp((*(Hyla__V1__ModelInfo *const *)a)->name, (*(Hyla__V1__ModelInfo *const *)b)->name);
}

/* ListModels: the models of the workers not dead, each once, with its fingerprint, how many
 * such workers serve it and the largest max_tokens all of them take (the smallest --max-generate
 * of the first stages, which answer Generate; 0 when one did not say). Any valid key may ask
 * (hyla_coord_auth.c sets the policy). */
void coord_do_list_models(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant) {
    (void)m;
    (void)tenant;
    pthread_mutex_lock(&c->mu);
    size_t cap = c->n_workers ? c->n_workers : 1, n = 0;
    Hyla__V1__ModelInfo *mi = calloc(cap, sizeof *mi);
    Hyla__V1__ModelInfo **pm = calloc(cap, sizeof *pm);
    char (*names)[ID_MAX] = calloc(cap, ID_MAX);
    HYLA_ASSERT(mi && pm && names);
    for (size_t i = 0; i < c->n_workers; i++) {
        const cworker *w = c->workers[i];
        if (!coord_worker_alive(w) || !w->model[0])
            continue;
        size_t j = 0;
        while (j < n && strcmp(names[j], w->model) != 0)
            j++;
        if (j == n) {
            hyla__v1__model_info__init(&mi[n]);
            coord_copy_str(names[n], ID_MAX, w->model);
            mi[n].name = names[n];
            mi[n].fingerprint = w->fingerprint;
            mi[n].max_generate = UINT32_MAX;
            pm[n] = &mi[n];
            n++;
        }
        mi[j].ready_workers++;
        if (w->lb == 0 && (!w->max_generate || w->max_generate < mi[j].max_generate))
            mi[j].max_generate = w->max_generate; /* an older worker's 0: unknown for the model */
    }
    for (size_t j = 0; j < n; j++)
        if (mi[j].max_generate == UINT32_MAX) /* no first stage among them */
            mi[j].max_generate = 0;
    pthread_mutex_unlock(&c->mu);
    qsort(pm, n, sizeof *pm, cmp_model);
    Hyla__V1__ListModelsResponse r = HYLA__V1__LIST_MODELS_RESPONSE__INIT;
    r.n_models = n;
    r.models = pm;
    hyla_rpc_call_reply(call, &r.base);
    free(names);
    free(pm);
    free(mi);
}

/* The token log of a session in the store: its committed version's log (an empty log for a
 * session with no snapshot yet). Fills r's generated, first_available and tokens. */
static hyla_status read_tokens_stored(hyla_coord *c, const char *id, uint64_t version, uint64_t generated,
                                      const Hyla__V1__ReadTokensRequest *q, uint32_t max,
                                      Hyla__V1__ReadTokensResponse *r, int32_t **toks) {
    r->generated = r->first_available = generated;
    if (!version)
        return HYLA_OK;
    if (!c->store)
        return hyla_fail(HYLA_ERR_UNSUPPORTED, "ReadTokens of a session in the store needs the coordinator's embedded "
                                               "store (this one uses the store at %s); Resume it first", c->store_addr);
    hyla_snapshot *snap = NULL;
    hyla_status st = hyla_store_get_token_log(c->store, id, version, &snap, NULL);
    const int32_t *log = NULL;
    uint32_t n = 0;
    if (st == HYLA_OK)
        st = hyla_snapshot_token_log(snap, &log, &n);
    if (st != HYLA_OK) {
        hyla_snapshot_destroy(snap);
        return hyla_fail_wrap(st, "reading the token log of session %s version %llu", id, (unsigned long long)version);
    }
    r->generated = snap->n_generated;
    r->first_available = snap->n_generated - n;
    if (q->from_generated >= r->first_available && q->from_generated < r->generated) {
        uint64_t k = r->generated - q->from_generated;
        r->n_token_ids = k < max ? (size_t)k : max;
        *toks = malloc(r->n_token_ids * sizeof **toks);
        HYLA_ASSERT(*toks);
        memcpy(*toks, log + (q->from_generated - r->first_available), r->n_token_ids * sizeof **toks);
        r->token_ids = *toks;
    }
    hyla_snapshot_destroy(snap);
    return HYLA_OK;
}

/* ReadTokens: from the owning group's stage 0 for a resident session (it holds the log of the
 * last step), else from the committed snapshot. Runs on a job thread; takes no session lock (a
 * read changes nothing), so it answers during a Generate. */
void coord_do_read_tokens(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant) {
    const Hyla__V1__ReadTokensRequest *q = (const Hyla__V1__ReadTokensRequest *)m;
    hyla_status st = coord_check_session_id(q->session_id);
    if (st != HYLA_OK) {
        coord_answer_error(call, st);
        return;
    }
    char ids[MAX_STAGES][ID_MAX];
    int n_owners = 0, state = 0;
    uint64_t version = 0, generated = 0;
    pthread_mutex_lock(&c->mu);
    csess *s = coord_sess_find(c, q->session_id);
    int mine = s && strcmp(s->tenant, tenant) == 0;
    if (mine) {
        state = s->state;
        version = s->snap.version;
        generated = s->generated;
        if (state == HYLA__V1__SESSION_STATE__SESSION_ACTIVE)
            n_owners = coord_owners_locked(c, s, ids);
    }
    pthread_mutex_unlock(&c->mu);
    if (!s)
        st = hyla_fail(HYLA_ERR_NOT_FOUND, "session %s not found", q->session_id);
    else if (!mine)
        st = hyla_fail(HYLA_ERR_PERMISSION, "session %s belongs to another tenant", q->session_id);
    else if (state == HYLA__V1__SESSION_STATE__SESSION_MOVING ||
             (state == HYLA__V1__SESSION_STATE__SESSION_ACTIVE && n_owners < 1))
        st = hyla_fail(HYLA_ERR_UNAVAILABLE, "session %s is being placed; retry ReadTokens", q->session_id);
    if (st != HYLA_OK) {
        coord_answer_error(call, st);
        return;
    }
    uint32_t max = q->max_tokens && q->max_tokens <= HYLA_TOKEN_LOG_MAX ? q->max_tokens : HYLA_TOKEN_LOG_MAX;
    Hyla__V1__ReadTokensResponse local = HYLA__V1__READ_TOKENS_RESPONSE__INIT;
    const Hyla__V1__ReadTokensResponse *r = &local;
    ProtobufCMessage *wr = NULL;
    int32_t *toks = NULL;
    if (state == HYLA__V1__SESSION_STATE__SESSION_ACTIVE) {
        Hyla__V1__ReadTokensRequest wq = *q;
        wq.max_tokens = max;
        hyla_rpc_result res;
        st = coord_call_worker(c, ids[0], SVC_WORKER "ReadTokens", &wq.base, &hyla__v1__read_tokens_response__descriptor,
                               &wr, &res);
        if (st == HYLA_OK) {
            r = (const Hyla__V1__ReadTokensResponse *)wr;
        } else if (res.code == HYLA_RPC_NOT_FOUND) { /* the worker let it go to the store (host budget) */
            pthread_mutex_lock(&c->mu);
            const csess *now = coord_sess_find(c, q->session_id); /* s may be gone: look it up again */
            version = now ? now->snap.version : version;
            pthread_mutex_unlock(&c->mu);
            st = read_tokens_stored(c, q->session_id, version, generated, q, max, &local, &toks);
        } else {
            st = hyla_fail(res.code == HYLA_RPC_OK ? HYLA_ERR_INTERNAL : hyla_rpc_status_from_code(res.code),
                           "ReadTokens of session %s on worker %s: %s", q->session_id, ids[0], res.message);
        }
    } else {
        st = read_tokens_stored(c, q->session_id, version, generated, q, max, &local, &toks);
    }
    if (st != HYLA_OK)
        coord_answer_error(call, st);
    else if (q->from_generated < r->first_available)
        hyla_rpc_call_fail(call, HYLA_RPC_OUT_OF_RANGE,
                           "field from_generated: %llu is below first_available %llu: session %s keeps its last %llu "
                           "generated tokens (%u at most)",
                           (unsigned long long)q->from_generated, (unsigned long long)r->first_available, q->session_id,
                           (unsigned long long)(r->generated - r->first_available), HYLA_TOKEN_LOG_MAX);
    else {
        Hyla__V1__ReadTokensResponse out = *r;
        out.from_generated = q->from_generated;
        hyla_rpc_call_reply(call, &out.base);
    }
    if (wr)
        protobuf_c_message_free_unpacked(wr, NULL);
    free(toks);
}
