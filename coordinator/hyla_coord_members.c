/* hyla_coord_members.c — membership and the monitor: workers register and heartbeat; they form
 * groups (a whole-model worker is a group of one; layer-range workers of one model are assembled
 * into a pipeline whose ranges tile the model); a worker silent for dead_after_ms is dead.
 *
 * Invariants.
 *   - A worker's epoch changes at each registration; a heartbeat from an older epoch is told to
 *     register again, as is a pipeline stage whose next stage changed since it was told.
 *   - A heartbeat is the worker's word on what it holds: sessions the directory does not place
 *     on its group (or places under another epoch) are unloaded; the first heartbeat after a
 *     registration unplaces the sessions it should hold but does not (it restarted).
 *   - Sessions of a group without a complete set of live workers are unplaced (PAUSED, from
 *     their last durable snapshot) by the monitor, after a grace period at start so that workers
 *     can re-register after a coordinator restart. The next call that needs one places it again.
 *   - Sessions held busy by a call are never touched here: that call is changing their record.
 *
 * Threading: RegisterWorker and Heartbeat run inline on the rpc loop threads under c->mu (memory
 * only; the directory write of the epoch counter included). The monitor is one thread that wakes
 * every half heartbeat (20..500 ms). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hyla_coord_impl.h"
#include "hyla_thread.h"
#include "hyla_log.h"

cworker *coord_worker_find(const hyla_coord *c, const char *id) {
    for (size_t i = 0; i < c->n_workers; i++)
        if (strcmp(c->workers[i]->id, id) == 0)
            return c->workers[i];
    return NULL;
}

int coord_worker_alive(const cworker *w) {
    return w->state == HYLA__V1__WORKER_STATE__WORKER_READY || w->state == HYLA__V1__WORKER_STATE__WORKER_DRAINING;
}

static int by_layer(const void *a, const void *b) {
    const cworker *x = *(cworker *const *)a, *y = *(cworker *const *)b;
    return x->lb < y->lb ? -1 : x->lb > y->lb;
}

/* Live members of a group in stage (layer) order; returns their count. */
int coord_group_members_locked(const hyla_coord *c, const char *group, cworker **out) {
    int n = 0;
    for (size_t i = 0; i < c->n_workers && n < MAX_STAGES; i++)
        if (coord_worker_alive(c->workers[i]) && strcmp(c->workers[i]->group, group) == 0)
            out[n++] = c->workers[i];
    qsort(out, (size_t)n, sizeof *out, by_layer);
    return n;
}

/* Whether live members tile [0, num_layers) exactly. */
int coord_group_complete_locked(const hyla_coord *c, const char *group) {
    cworker *m[MAX_STAGES];
    int n = coord_group_members_locked(c, group, m);
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
int coord_group_placeable_locked(const hyla_coord *c, const char *group) {
    if (!coord_group_complete_locked(c, group))
        return 0;
    cworker *m[MAX_STAGES];
    int n = coord_group_members_locked(c, group, m);
    for (int i = 0; i < n; i++) {
        if (m[i]->state != HYLA__V1__WORKER_STATE__WORKER_READY)
            return 0;
        /* a pipeline stage must know its next stage (it learns it when it registers again) */
        if (strcmp(m[i]->told_next, i + 1 < n ? m[i + 1]->address : "") != 0)
            return 0;
    }
    return 1;
}

uint32_t coord_group_sessions_locked(const hyla_coord *c, const char *group) {
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
        if (o == w || !coord_worker_alive(o) || o->fingerprint != w->fingerprint || strncmp(o->group, "p-", 2) != 0)
            continue;
        if (coord_group_complete_locked(c, o->group))
            continue;
        cworker *m[MAX_STAGES];
        int n = coord_group_members_locked(c, o->group, m), overlap = 0;
        for (int k = 0; k < n; k++)
            if (m[k] != w && m[k]->lb < w->le && w->lb < m[k]->le)
                overlap = 1;
        if (!overlap && n < MAX_STAGES) {
            coord_copy_str(w->group, sizeof w->group, o->group);
            return;
        }
    }
    snprintf(w->group, sizeof w->group, "p-%.120s", w->id);
}

uint32_t coord_worker_stage_locked(const hyla_coord *c, const cworker *w) {
    cworker *m[MAX_STAGES];
    int n = coord_group_members_locked(c, w->group, m);
    for (int i = 0; i < n; i++)
        if (m[i] == w)
            return (uint32_t)i;
    return 0;
}

void coord_do_register(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant) {
    (void)tenant;
    const Hyla__V1__RegisterWorkerRequest *q = (const Hyla__V1__RegisterWorkerRequest *)m;
    if (!q->address || !q->address[0] || strlen(q->address) >= 256) {
        coord_answer_error(call,
                           hyla_fail(HYLA_ERR_INVALID_ARG, "field address: host:port of the Worker service required"));
        return;
    }
    if (!q->model || !q->model[0] || strlen(q->model) >= ID_MAX) {
        coord_answer_error(call, hyla_fail(HYLA_ERR_INVALID_ARG, "field model: 1..%d bytes required", ID_MAX - 1));
        return;
    }
    if (q->worker_id && strlen(q->worker_id) >= ID_MAX - 2) {
        coord_answer_error(call, hyla_fail(HYLA_ERR_INVALID_ARG, "field worker_id: at most %d bytes", ID_MAX - 3));
        return;
    }
    uint32_t lb = q->layers ? q->layers->begin : 0, le = q->layers ? q->layers->end : q->num_layers;
    if (q->num_layers == 0 || lb >= le || le > q->num_layers) {
        coord_answer_error(call,
                           hyla_fail(HYLA_ERR_INVALID_ARG, "field layers: [%u, %u) is not a non-empty range of [0, %u)",
                                     lb, le, q->num_layers));
        return;
    }
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < c->n_workers; i++) {
        const cworker *o = c->workers[i];
        if (coord_worker_alive(o) && strcmp(o->model, q->model) == 0 && o->fingerprint != q->model_fingerprint &&
            !(q->worker_id && strcmp(o->id, q->worker_id) == 0)) {
            pthread_mutex_unlock(&c->mu);
            coord_answer_error(
                call, hyla_fail(HYLA_ERR_MISMATCH,
                                "model '%s' is served by worker %s with fingerprint %016llx; this worker has %016llx",
                                q->model, o->id, (unsigned long long)o->fingerprint,
                                (unsigned long long)q->model_fingerprint));
            return;
        }
    }
    cworker *w = q->worker_id && q->worker_id[0] ? coord_worker_find(c, q->worker_id) : NULL;
    char old_group[ID_MAX] = "";
    if (w) {
        coord_copy_str(old_group, sizeof old_group, w->group);
        HYLA_INFO("coordinator: worker %s registers again (was epoch %llu at %s)", w->id, (unsigned long long)w->epoch,
                  w->address);
    } else {
        w = calloc(1, sizeof *w);
        HYLA_ASSERT(w);
        if (q->worker_id && q->worker_id[0])
            coord_copy_str(w->id, sizeof w->id, q->worker_id);
        else
            do
                snprintf(w->id, sizeof w->id, "w-%08llx", (unsigned long long)(hyla_rng_next(&c->rng) & 0xffffffffu));
            while (coord_worker_find(c, w->id));
        if (c->n_workers == c->cap_workers) {
            size_t cap = c->cap_workers ? 2 * c->cap_workers : 8;
            cworker **nw = realloc(c->workers, cap * sizeof *nw);
            HYLA_ASSERT(nw);
            c->workers = nw;
            c->cap_workers = cap;
        }
        c->workers[c->n_workers++] = w;
        w->registered_ms = coord_now_ms();
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
    coord_copy_str(w->address, sizeof w->address, q->address);
    coord_copy_str(w->model, sizeof w->model, q->model);
    coord_copy_str(w->version, sizeof w->version, q->version);
    w->fingerprint = q->model_fingerprint;
    w->num_layers = q->num_layers;
    w->lb = lb;
    w->le = le;
    w->param_bytes = q->param_bytes;
    w->state_budget = q->state_budget_bytes;
    w->max_generate = q->max_generate;
    if (q->device) {
        coord_copy_str(w->dev_name, sizeof w->dev_name, q->device->name);
        coord_copy_str(w->dev_desc, sizeof w->dev_desc, q->device->description);
        w->mem_total = q->device->memory_total_bytes;
        w->mem_free = q->device->memory_free_bytes;
    }
    hyla__v1__worker_load__init(&w->load);
    w->state = HYLA__V1__WORKER_STATE__WORKER_READY;
    w->drain_error[0] = 0;
    w->epoch = ++c->epoch_counter;
    w->hb_ms = coord_now_ms();
    w->hb_mono = hyla_now();
    w->reconcile = 1;
    assign_group_locked(c, w);
    if (old_group[0] && strcmp(old_group, w->group) != 0)
        for (size_t i = 0; i < c->n_sess; i++)
            if (strcmp(c->sess[i]->group, old_group) == 0 && !c->sess[i]->busy)
                coord_unplace_locked(c, c->sess[i], "its worker re-registered in another group");
    hyla_status st = hyla_coord_dir_set_counter(c->dir, c->epoch_counter);
    Hyla__V1__RegisterWorkerResponse r = HYLA__V1__REGISTER_WORKER_RESPONSE__INIT;
    r.worker_id = w->id;
    r.epoch = w->epoch;
    r.heartbeat_interval_ms = c->p.heartbeat_ms;
    r.heartbeat_timeout_ms = c->p.dead_after_ms;
    r.group_id = w->group;
    r.stage = coord_worker_stage_locked(c, w);
    char next_addr[256] = "";
    cworker *mem[MAX_STAGES];
    int nm = coord_group_members_locked(c, w->group, mem);
    if (r.stage + 1 < (uint32_t)nm)
        coord_copy_str(next_addr, sizeof next_addr, mem[r.stage + 1]->address);
    r.next_stage_address = next_addr;
    coord_copy_str(w->told_next, sizeof w->told_next, next_addr);
    r.store_address = c->store_addr;
    HYLA_INFO("coordinator: worker %s at %s serves %s layers [%u, %u) of %u (epoch %llu, group %s)", w->id, w->address,
              w->model, lb, le, w->num_layers, (unsigned long long)w->epoch, w->group);
    pthread_cond_broadcast(&c->cv);
    if (st != HYLA_OK) {
        w->state = HYLA__V1__WORKER_STATE__WORKER_DEAD;
        pthread_mutex_unlock(&c->mu);
        coord_answer_error(call, st);
        return;
    }
    hyla_rpc_call_reply(call, &r.base);
    pthread_mutex_unlock(&c->mu);
}

void coord_do_heartbeat(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant) {
    (void)tenant;
    const Hyla__V1__HeartbeatRequest *q = (const Hyla__V1__HeartbeatRequest *)m;
    if (!q->worker_id || !q->worker_id[0]) {
        coord_answer_error(call, hyla_fail(HYLA_ERR_INVALID_ARG, "field worker_id: required"));
        return;
    }
    Hyla__V1__HeartbeatResponse r = HYLA__V1__HEARTBEAT_RESPONSE__INIT;
    char **unload = calloc(q->n_sessions + 1, sizeof *unload);
    HYLA_ASSERT(unload);
    size_t n_unload = 0;
    pthread_mutex_lock(&c->mu);
    cworker *w = coord_worker_find(c, q->worker_id);
    if (!w || w->epoch != q->epoch || w->state == HYLA__V1__WORKER_STATE__WORKER_DEAD) {
        r.reregister = 1;
    } else {
        w->hb_ms = coord_now_ms();
        w->hb_mono = hyla_now();
        /* its pipeline changed (a stage joined or died): registering again tells it its next stage */
        char next_addr[256] = "";
        cworker *mem[MAX_STAGES];
        int nm = coord_group_members_locked(c, w->group, mem);
        uint32_t stage = coord_worker_stage_locked(c, w);
        if (stage + 1 < (uint32_t)nm)
            coord_copy_str(next_addr, sizeof next_addr, mem[stage + 1]->address);
        if (strcmp(next_addr, w->told_next) != 0)
            r.reregister = 1;
        if (q->load) {
            w->load = *q->load;
            w->load.base.unknown_fields = NULL;
            w->load.base.n_unknown_fields = 0;
        }
        w->sessions_reported = (uint32_t)q->n_sessions;
        coord_copy_str(w->drain_error, sizeof w->drain_error, q->drain_error);
        for (size_t i = 0; i < q->n_sessions; i++) {
            const Hyla__V1__WorkerSessionStatus *ws = q->sessions[i];
            if (!ws || !ws->session_id)
                continue;
            csess *s = coord_sess_find(c, ws->session_id);
            if (s && s->busy)
                continue; /* being placed right now: its record is about to change */
            if (!s || s->state != HYLA__V1__SESSION_STATE__SESSION_ACTIVE || strcmp(s->group, w->group) != 0 ||
                (ws->placement_epoch && ws->placement_epoch != s->epoch)) {
                unload[n_unload++] = ws->session_id;
                continue;
            }
            if (coord_worker_stage_locked(c, w) == 0) {
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
                    coord_unplace_locked(c, s, "its worker restarted without it");
            }
        }
        if (w->state == HYLA__V1__WORKER_STATE__WORKER_DRAINING || w->state == HYLA__V1__WORKER_STATE__WORKER_DRAINED)
            r.drain = 1;
        if (w->state == HYLA__V1__WORKER_STATE__WORKER_DRAINING && q->n_sessions == 0) {
            w->state = HYLA__V1__WORKER_STATE__WORKER_DRAINED;
            for (size_t i = 0; i < c->n_sess; i++)
                if (!c->sess[i]->busy && strcmp(c->sess[i]->group, w->group) == 0)
                    coord_unplace_locked(c, c->sess[i], "its worker drained");
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

/* The monitor: declares workers dead after dead_after_ms of silence and unplaces the sessions
 * of groups that lost a member. */
void *coord_monitor_main(void *arg) {
    hyla_coord *c = arg;
    uint32_t period = c->p.heartbeat_ms / 2;
    if (period < 20)
        period = 20;
    if (period > 500)
        period = 500;
    pthread_mutex_lock(&c->mu);
    double last = hyla_now();
    while (!c->stopping) {
        hyla_cond_wait_ms(&c->cv, &c->mu, (long)period);
        if (c->stopping)
            break;
        double now = hyla_now();
        /* Heartbeats are handled under c->mu, like this loop. If this thread ran late (c->mu held
         * by a slow directory fsync, or the process starved of CPU), the heartbeats that queued
         * meanwhile have not been counted yet: the lateness is the coordinator's silence, not the
         * workers', and must not declare a live worker dead (its sessions would fall back to
         * their last snapshot and lose what it had acknowledged since). */
        double late = now - last - (double)period / 1000.0;
        last = now;
        if (late > 0.05)
            for (size_t i = 0; i < c->n_workers; i++) {
                cworker *w = c->workers[i];
                w->hb_mono = w->hb_mono + late < now ? w->hb_mono + late : now;
            }
        for (size_t i = 0; i < c->n_workers; i++) {
            cworker *w = c->workers[i];
            if ((w->state == HYLA__V1__WORKER_STATE__WORKER_READY ||
                 w->state == HYLA__V1__WORKER_STATE__WORKER_DRAINING ||
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
                if (s->state == HYLA__V1__SESSION_STATE__SESSION_ACTIVE && !s->busy &&
                    !coord_group_complete_locked(c, s->group))
                    coord_unplace_locked(c, s, "its group lost a worker");
            }
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

