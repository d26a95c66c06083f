/* hyla_coord_cluster.c — the Cluster service, for operators: ListWorkers (workers and their
 * groups), ListClusterSessions (every tenant's sessions, by tier, group or tenant) and
 * DrainWorker (stop placing on a worker; its sessions leave through its heartbeats).
 *
 * Threading: ListWorkers and ListClusterSessions run inline on an rpc loop thread (memory only);
 * DrainWorker runs on a job thread because `wait` blocks until the worker is drained, the
 * call's deadline passes or the coordinator stops. Everything reads under c->mu. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hyla_coord_impl.h"
#include "hyla_log.h"

void coord_worker_info_locked(const hyla_coord *c, const cworker *w, Hyla__V1__WorkerInfo *wi, Hyla__V1__LayerRange *lr,
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
    wi->stage = coord_worker_stage_locked(c, w);
    wi->device = dev;
    wi->param_bytes = w->param_bytes;
    wi->state = (Hyla__V1__WorkerState)w->state;
    wi->load = load;
    wi->registered_unix_ms = w->registered_ms;
    wi->last_heartbeat_unix_ms = w->hb_ms;
    wi->epoch = w->epoch;
}

void coord_do_list_workers(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant) {
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
        coord_worker_info_locked(c, w, &wi[nw], &lr[nw], &dev[nw], &ld[nw]);
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
        int nm = coord_group_members_locked(c, w->group, mem);
        for (int k = 0; k < nm; k++)
            gids[ng * MAX_STAGES + (size_t)k] = mem[k]->id;
        g[ng].n_worker_ids = (size_t)nm;
        g[ng].worker_ids = &gids[ng * MAX_STAGES];
        g[ng].complete = coord_group_placeable_locked(c, w->group); /* complete, ready, and wired stage to stage */
        g[ng].sessions = coord_group_sessions_locked(c, w->group);
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

void coord_do_list_cluster_sessions(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant) {
    (void)tenant;
    const Hyla__V1__ListClusterSessionsRequest *q = (const Hyla__V1__ListClusterSessionsRequest *)m;
    cluster_arg a = {q->tier, NULL, q->tenant};
    char group[ID_MAX];
    if (q->worker_id && q->worker_id[0]) {
        pthread_mutex_lock(&c->mu);
        cworker *w = coord_worker_find(c, q->worker_id);
        if (w)
            coord_copy_str(group, sizeof group, w->group);
        pthread_mutex_unlock(&c->mu);
        if (!w) {
            coord_answer_error(call, hyla_fail(HYLA_ERR_NOT_FOUND, "worker '%s' not found", q->worker_id));
            return;
        }
        a.group = group;
    }
    coord_list_page(c, call, q->page_size, q->page_token, filter_cluster, &a, 1);
}

void coord_do_drain(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant) {
    (void)tenant;
    const Hyla__V1__DrainWorkerRequest *q = (const Hyla__V1__DrainWorkerRequest *)m;
    pthread_mutex_lock(&c->mu);
    cworker *w = q->worker_id ? coord_worker_find(c, q->worker_id) : NULL;
    if (!w) {
        pthread_mutex_unlock(&c->mu);
        coord_answer_error(call,
                           hyla_fail(HYLA_ERR_NOT_FOUND, "worker '%s' not found", q->worker_id ? q->worker_id : ""));
        return;
    }
    char group[ID_MAX];
    coord_copy_str(group, sizeof group, w->group);
    uint32_t before = coord_group_sessions_locked(c, group);
    if (w->state == HYLA__V1__WORKER_STATE__WORKER_READY) {
        w->state = HYLA__V1__WORKER_STATE__WORKER_DRAINING;
        HYLA_INFO("coordinator: draining worker %s (%u sessions)", w->id, before);
    }
    double deadline = hyla_now() + (double)hyla_rpc_call_deadline_ms(call) / 1000.0;
    int has_deadline = hyla_rpc_call_deadline_ms(call) >= 0;
    while (q->wait && coord_worker_find(c, q->worker_id) == w && w->state == HYLA__V1__WORKER_STATE__WORKER_DRAINING &&
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
    uint32_t remaining = w->state == HYLA__V1__WORKER_STATE__WORKER_DRAINING && coord_worker_find(c, q->worker_id) == w
                             ? w->sessions_reported
                             : coord_group_sessions_locked(c, group);
    Hyla__V1__WorkerInfo wi;
    Hyla__V1__LayerRange lr;
    Hyla__V1__Device dev;
    Hyla__V1__WorkerLoad ld;
    coord_worker_info_locked(c, w, &wi, &lr, &dev, &ld);
    Hyla__V1__DrainWorkerResponse r = HYLA__V1__DRAIN_WORKER_RESPONSE__INIT;
    r.worker = &wi;
    r.sessions_moved = before > remaining ? before - remaining : 0;
    r.sessions_remaining = remaining;
    r.last_error = w->drain_error;
    hyla_rpc_call_reply(call, &r.base);
    pthread_mutex_unlock(&c->mu);
}

