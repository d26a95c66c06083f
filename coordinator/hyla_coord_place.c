/* hyla_coord_place.c — placement: which group a session goes to, and the Worker calls that put
 * it there, check it, snapshot it and move it.
 *
 * A new or paused session goes to the least-loaded placeable group of its model (complete, all
 * members READY and wired stage to stage): groups under their state-memory budget first, then
 * the fewest sessions, the fewest calls in progress, the group id. A worker hint is a preference:
 * a hinted group that cannot serve now falls back to any group. Placing restores a snapshot
 * version on every stage (0: a new empty session) under a fresh placement epoch; a stage that
 * refuses unloads the stages already loaded, and the session is left as it was.
 *
 * Invariants: the session is held busy by the caller (coord_acquire) for every function here
 * but coord_call_worker; c->mu is taken only around memory, never across a Worker call.
 * Errors: hyla_status with the detail message; a worker's gRPC code becomes a status through
 * hyla_rpc_status_from_code. Threading: call threads (job threads, relay jobs). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_coord_impl.h"
#include "hyla_log.h"

/* Resolve the model of a request into out (ID_MAX bytes): empty means "the only model served". */
hyla_status coord_resolve_model_locked(const hyla_coord *c, const char *want, char *out) {
    if (want && want[0]) {
        for (size_t i = 0; i < c->n_workers; i++)
            if (strcmp(c->workers[i]->model, want) == 0) {
                coord_copy_str(out, ID_MAX, want);
                return HYLA_OK;
            }
        return hyla_fail(HYLA_ERR_NOT_FOUND, "no worker serves model '%s'", want);
    }
    char models[1024] = "";
    int n = 0;
    for (size_t i = 0; i < c->n_workers; i++) {
        const cworker *w = c->workers[i];
        if (!coord_worker_alive(w))
            continue;
        int seen = 0;
        for (size_t j = 0; j < i; j++)
            if (coord_worker_alive(c->workers[j]) && strcmp(c->workers[j]->model, w->model) == 0)
                seen = 1;
        if (seen)
            continue;
        if (n++ == 0)
            coord_copy_str(out, ID_MAX, w->model);
        size_t l = strlen(models);
        snprintf(models + l, sizeof models - l, "%s%s", l ? ", " : "", w->model);
    }
    if (n == 1)
        return HYLA_OK;
    if (n == 0) {
        return hyla_fail(HYLA_ERR_UNAVAILABLE, "no live worker serves any model");
    }
    return hyla_fail(HYLA_ERR_INVALID_ARG, "field model: the cluster serves several models (%s); name one", models);
}

/* A worker hint a call names: NOT_FOUND when no such worker is registered, INVALID_ARGUMENT when
 * it serves another model. Whether its group can take the session now is placement's business
 * (a hint is a preference), but a hint that cannot mean anything is the caller's mistake. */
static hyla_status hint_worker_locked(const hyla_coord *c, const char *hint, const char *model, const cworker **w) {
    *w = coord_worker_find(c, hint);
    if (!*w)
        return hyla_fail(HYLA_ERR_NOT_FOUND, "worker '%s' not found", hint);
    if (strcmp((*w)->model, model) != 0)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "worker '%s' serves model '%s', not '%s'", hint, (*w)->model, model);
    return HYLA_OK;
}

hyla_status coord_check_hint(hyla_coord *c, const char *hint, const char *model) {
    if (!hint || !hint[0])
        return HYLA_OK;
    const cworker *w;
    pthread_mutex_lock(&c->mu);
    hyla_status st = hint_worker_locked(c, hint, model, &w);
    pthread_mutex_unlock(&c->mu);
    return st;
}

/* The least-loaded placeable group of model (or hint's group), other than exclude. */
static hyla_status pick_group_locked(const hyla_coord *c, const char *model, const char *hint, const char *exclude,
                                     char *out) {
    if (hint && hint[0]) {
        const cworker *w;
        HYLA_TRY(hint_worker_locked(c, hint, model, &w));
        if (exclude && strcmp(w->group, exclude) == 0) {
            return hyla_fail(HYLA_ERR_INVALID_ARG, "worker '%s' already holds the session", hint);
        }
        if (coord_group_placeable_locked(c, w->group)) {
            coord_copy_str(out, ID_MAX, w->group);
            return HYLA_OK;
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
        if (!coord_group_placeable_locked(c, w->group) || (exclude && strcmp(w->group, exclude) == 0))
            continue;
        uint32_t load = coord_group_sessions_locked(c, w->group), calls = w->load.active_calls;
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
        coord_copy_str(out, ID_MAX, best);
        return HYLA_OK;
    }
    if (!any) {
        return hyla_fail(HYLA_ERR_NOT_FOUND, "no worker serves model '%s'", model);
    }
    return hyla_fail(HYLA_ERR_UNAVAILABLE, "no live worker group can take a session of model '%s'%s", model,
                     exclude ? " (other than its current one)" : "");
}

/* Unary call to a worker (no lock held). */
hyla_status coord_call_worker(hyla_coord *c, const char *wid, const char *method, const ProtobufCMessage *req,
                              const ProtobufCMessageDescriptor *rd, ProtobufCMessage **resp, hyla_rpc_result *res) {
    pthread_mutex_lock(&c->mu);
    cworker *w = coord_worker_find(c, wid);
    hyla_rpc_client *cl = w && coord_worker_alive(w) ? w->client : NULL;
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
int coord_owners_locked(const hyla_coord *c, const csess *s, char ids[MAX_STAGES][ID_MAX]) {
    cworker *m[MAX_STAGES];
    int n = s->group[0] ? coord_group_members_locked(c, s->group, m) : 0;
    for (int i = 0; i < n; i++)
        coord_copy_str(ids[i], ID_MAX, m[i]->id);
    return n;
}

void coord_unload_on(hyla_coord *c, char ids[MAX_STAGES][ID_MAX], int n, const char *sid, uint64_t epoch) {
    for (int i = 0; i < n; i++) {
        Hyla__V1__UnloadRequest u = HYLA__V1__UNLOAD_REQUEST__INIT;
        u.session_id = (char *)sid;
        u.placement_epoch = epoch;
        ProtobufCMessage *r = NULL;
        hyla_rpc_result res;
        if (coord_call_worker(c, ids[i], SVC_WORKER "Unload", &u.base, &hyla__v1__unload_response__descriptor, &r,
                              &res) == HYLA_OK)
            protobuf_c_message_free_unpacked(r, NULL);
        else
            HYLA_DEBUG("coordinator: unload %s on %s: %s", sid, ids[i], res.message);
    }
}

/* Place s (held busy by the caller) on a group: the hint's, else the least loaded other than
 * exclude; restore snapshot_version there (0: a new empty session). On failure the session is
 * left as it was. */
hyla_status coord_place(hyla_coord *c, csess *s, const char *hint, const char *exclude, uint64_t snapshot_version) {
    char group[ID_MAX], ids[MAX_STAGES][ID_MAX];
    pthread_mutex_lock(&c->mu);
    hyla_status code = pick_group_locked(c, s->model, hint, exclude, group);
    int n = 0;
    uint64_t epoch = 0;
    if (code == HYLA_OK) {
        cworker *m[MAX_STAGES];
        n = coord_group_members_locked(c, group, m);
        for (int i = 0; i < n; i++)
            coord_copy_str(ids[i], ID_MAX, m[i]->id);
        epoch = ++c->epoch_counter;
    }
    Hyla__V1__SamplingParams sp = HYLA__V1__SAMPLING_PARAMS__INIT;
    sp.temperature = s->temperature;
    sp.top_k = s->top_k;
    sp.top_p = s->top_p;
    uint64_t seed = s->seed;
    pthread_mutex_unlock(&c->mu);
    if (code != HYLA_OK)
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
        if (coord_call_worker(c, ids[i], SVC_WORKER "LoadSession", &q.base,
                              &hyla__v1__worker_session_response__descriptor, &r, &res) != HYLA_OK) {
            coord_unload_on(c, ids, i, s->id, epoch); /* before the failure: it may fail too */
            hyla_status fs = res.code == HYLA_RPC_OK ? HYLA_ERR_INTERNAL : hyla_rpc_status_from_code(res.code);
            if (fs == HYLA_ERR_NOT_FOUND && snapshot_version > 0)
                /* the store acknowledged this version (the directory recorded it), so it lost it:
                 * DATA_LOSS, not NOT_FOUND */
                return hyla_fail(HYLA_ERR_CORRUPT, "session %s: its committed snapshot version %llu is missing from the store: %.700s",
                                 s->id, (unsigned long long)snapshot_version, res.message);
            return hyla_fail(fs, "placing session %s on worker %.120s: %.700s", s->id, ids[i], res.message);
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
    coord_copy_str(s->group, sizeof s->group, group);
    s->epoch = epoch;
    s->state = HYLA__V1__SESSION_STATE__SESSION_ACTIVE;
    s->paused = 0;
    s->tier = tier;
    s->position = position;
    s->generated = generated;
    s->error[0] = 0;
    hyla_status st = coord_persist_locked(c, s, 1, 1);
    pthread_mutex_unlock(&c->mu);
    if (st != HYLA_OK)
        return hyla_fail_wrap(HYLA_ERR_INTERNAL, "placing session %s", s->id);
    HYLA_INFO("coordinator: session %s placed on group %s (epoch %llu, snapshot %llu, position %llu)", s->id, group,
              (unsigned long long)epoch, (unsigned long long)snapshot_version, (unsigned long long)position);
    return HYLA_OK;
}

int coord_active_owners(hyla_coord *c, const csess *s, char ids[MAX_STAGES][ID_MAX], int *active, uint64_t *epoch) {
    pthread_mutex_lock(&c->mu);
    *active = s->state == HYLA__V1__SESSION_STATE__SESSION_ACTIVE;
    int n = *active ? coord_owners_locked(c, s, ids) : 0;
    *epoch = s->epoch;
    pthread_mutex_unlock(&c->mu);
    return n;
}

/* Make sure s (held busy) is resident where the directory says: an ACTIVE session is checked
 * with DescribeSession (a worker may have lost it), a PAUSED one is placed again. */
hyla_status coord_ensure_active(hyla_coord *c, csess *s, char *owner, uint64_t *epoch) {
    char ids[MAX_STAGES][ID_MAX];
    int active;
    uint64_t ep;
    int n = coord_active_owners(c, s, ids, &active, &ep);
    if (active && n > 0) {
        Hyla__V1__DescribeSessionRequest q = HYLA__V1__DESCRIBE_SESSION_REQUEST__INIT;
        q.session_id = s->id;
        ProtobufCMessage *r = NULL;
        hyla_rpc_result res;
        hyla_status st = coord_call_worker(c, ids[0], SVC_WORKER "DescribeSession", &q.base,
                                           &hyla__v1__worker_session_response__descriptor, &r, &res);
        int ok = 0;
        if (st == HYLA_OK) {
            const Hyla__V1__WorkerSessionResponse *wr = (const Hyla__V1__WorkerSessionResponse *)r;
            ok = wr->session && (wr->session->placement_epoch == ep || wr->session->placement_epoch == 0);
            protobuf_c_message_free_unpacked(r, NULL);
        }
        if (ok) {
            coord_copy_str(owner, ID_MAX, ids[0]);
            *epoch = ep;
            return HYLA_OK;
        }
        pthread_mutex_lock(&c->mu);
        coord_unplace_locked(c, s, st == HYLA_OK ? "its worker holds another placement" : res.message);
        pthread_mutex_unlock(&c->mu);
    } else if (active) {
        /* Just after a restart its workers may not have registered again yet: the monitor's
         * grace period applies here too, or the session would fall back to its snapshot and
         * lose what its worker still holds. */
        if ((hyla_now() - c->started_mono) * 1000.0 <= (double)c->p.dead_after_ms)
            return hyla_fail(HYLA_ERR_UNAVAILABLE,
                             "session %s: the workers of group %s have not registered since the coordinator "
                             "started; retry",
                             s->id, s->group);
        pthread_mutex_lock(&c->mu);
        coord_unplace_locked(c, s, "its group has no live worker");
        pthread_mutex_unlock(&c->mu);
    }
    pthread_mutex_lock(&c->mu);
    uint64_t version = s->snap.version;
    pthread_mutex_unlock(&c->mu);
    HYLA_TRY(coord_place(c, s, NULL, NULL, version));
    pthread_mutex_lock(&c->mu);
    n = coord_owners_locked(c, s, ids);
    *epoch = s->epoch;
    pthread_mutex_unlock(&c->mu);
    if (n == 0)
        return hyla_fail(HYLA_ERR_UNAVAILABLE, "session %s: its group vanished while placing it", s->id);
    coord_copy_str(owner, ID_MAX, ids[0]);
    return HYLA_OK;
}

/* A durable snapshot of an ACTIVE s (held busy) now, on its owner. */
hyla_status coord_snapshot_now(hyla_coord *c, csess *s, Hyla__V1__SnapshotInfo *out) {
    char ids[MAX_STAGES][ID_MAX];
    pthread_mutex_lock(&c->mu);
    int n = coord_owners_locked(c, s, ids);
    uint64_t epoch = s->epoch;
    pthread_mutex_unlock(&c->mu);
    if (n == 0)
        return hyla_fail(HYLA_ERR_UNAVAILABLE, "session %s: no live worker holds it", s->id);
    /* stage 0 gathers the later stages' parts (Worker.ExportStage) into one whole-model snapshot */
    Hyla__V1__SnapshotRequest q = HYLA__V1__SNAPSHOT_REQUEST__INIT;
    q.session_id = s->id;
    q.placement_epoch = epoch;
    ProtobufCMessage *r = NULL;
    hyla_rpc_result res;
    if (coord_call_worker(c, ids[0], SVC_WORKER "Snapshot", &q.base, &hyla__v1__snapshot_response__descriptor, &r,
                          &res) != HYLA_OK)
        return hyla_fail(hyla_rpc_status_from_code(res.code), "snapshot of session %s on worker %.120s: %.700s", s->id,
                         ids[0], res.message);
    const Hyla__V1__SnapshotResponse *sr = (const Hyla__V1__SnapshotResponse *)r;
    pthread_mutex_lock(&c->mu);
    if (sr->snapshot && sr->snapshot->version >= s->snap.version) {
        s->snap = *sr->snapshot;
        s->snap.base.unknown_fields = NULL;
        s->snap.base.n_unknown_fields = 0;
        s->position = sr->snapshot->position;
    }
    *out = s->snap;
    coord_persist_locked(c, s, 1, 0);
    pthread_mutex_unlock(&c->mu);
    protobuf_c_message_free_unpacked(r, NULL);
    return HYLA_OK;
}

/* Move s (held busy) to to_worker's group, or to any other group when to_worker is NULL or
 * empty: a durable snapshot on the old group, placement from it, unload from the old group.
 * from (ID_MAX bytes) receives the old group, *si the snapshot that carried the state. */
hyla_status coord_move(hyla_coord *c, csess *s, const char *to_worker, char *from, Hyla__V1__SnapshotInfo *si) {
    char ids[MAX_STAGES][ID_MAX];
    pthread_mutex_lock(&c->mu);
    int active = s->state == HYLA__V1__SESSION_STATE__SESSION_ACTIVE;
    coord_copy_str(from, ID_MAX, s->group);
    int n = coord_owners_locked(c, s, ids);
    uint64_t old_epoch = s->epoch;
    *si = s->snap;
    pthread_mutex_unlock(&c->mu);
    if (active)
        HYLA_TRY(coord_snapshot_now(c, s, si));
    HYLA_TRY(coord_place(c, s, to_worker, active ? from : NULL, si->version));
    if (active)
        coord_unload_on(c, ids, n, s->id, old_epoch);
    return HYLA_OK;
}
