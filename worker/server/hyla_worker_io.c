/* hyla_worker_io.c — the worker's two threads that talk to other services.
 *
 * The I/O thread performs statestore calls (put, get) queued by the scheduler (io_post) and
 * reports committed snapshots to the coordinator, then posts the outcome back to the scheduler
 * as a command (C_PUT_DONE, C_GOT_SNAPSHOT): the scheduler never blocks on the store.
 * The membership thread registers with the coordinator and heartbeats: it reads the summary
 * the scheduler publishes under sum_mu and posts commands (drop, drain) when the coordinator
 * asks. Neither thread touches sessions. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hyla_worker_impl.h"

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
            post_cmd(w, c);
        }
        protobuf_c_message_free_unpacked(resp, NULL);
    } else {
        HYLA_DEBUG("ReportSnapshot %s: %s", it->session, hyla_last_error());
    }
}

void *io_main(void *arg) {
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
        double t0 = now_s();
        if (it->kind == 1) {
            if (st == HYLA_OK)
                st = hyla_store_rpc_put(w->store, it->session, it->epoch, it->snap, it->base_version, it->base,
                                        RPC_TIMEOUT_MS, &c->info);
            if (st == HYLA_OK) {
                c->snap = layout_of(it->snap);
                HYLA_DEBUG("session %s: version %llu durable at position %llu (put %.1f ms)", it->session,
                           (unsigned long long)c->info.version, (unsigned long long)c->info.position, (now_s() - t0) * 1e3);
                report_snapshot(w, it, &c->info);
                worker_metrics_export(w, it->snap);
            }
            worker_metrics_snapshot(w, "put", st == HYLA_OK, c->info.written_bytes, now_s() - t0);
        } else {
            if (st == HYLA_OK) st = hyla_store_rpc_get(w->store, it->session, it->version, RPC_TIMEOUT_MS, &c->snap, &c->version);
            worker_metrics_snapshot(w, "get", st == HYLA_OK, st == HYLA_OK ? hyla_snapshot_bytes(c->snap) : 0, now_s() - t0);
        }
        c->status = st;
        if (st != HYLA_OK) snprintf(c->err, sizeof c->err, "%s", hyla_last_error());
        post_cmd(w, c);
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
    char dname[64];
    if (w->p.tp > 1) snprintf(dname, sizeof dname, "%s tp=%d", w->p.device, w->p.tp);
    else snprintf(dname, sizeof dname, "%s", w->p.device);
    dev.name = dname;
    dev.tensor_parallel = (uint32_t)(w->p.tp > 1 ? w->p.tp : 1);
    char desc[128];
    snprintf(desc, sizeof desc, "%s backend, %d cores", hyla_model_backend(w->m)->ops->name, hyla_online_cores());
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
    r.max_generate = w->p.max_generate;
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

void *membership_main(void *arg) {
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
        if (st == HYLA_OK) {
            Hyla__V1__HeartbeatResponse *hr = (Hyla__V1__HeartbeatResponse *)resp;
            if (hr->reregister) registered = 0;
            if (hr->drain && !w->draining) post_cmd(w, new_cmd(C_DRAIN, NULL, NULL));
            if (hr->drain && last && !hr->reregister) {
                pthread_mutex_lock(&w->exit_mu);
                w->drain_acked = 1;
                pthread_cond_broadcast(&w->exit_cv);
                pthread_mutex_unlock(&w->exit_mu);
            }
            /* The coordinator judged the sessions as this heartbeat reported them: drop only the
             * placement it saw (or an older one), never one loaded since under a newer epoch
             * (re-placed on this worker while the heartbeat was in flight). */
            for (size_t i = 0; i < hr->n_unload_session_ids; i++) {
                cmd *c = new_cmd(C_DROP, NULL, NULL);
                snprintf(c->session, sizeof c->session, "%s", hr->unload_session_ids[i]);
                for (size_t k = 0; k < copy->n_sessions; k++)
                    if (copy->sessions[k] && copy->sessions[k]->session_id &&
                        strcmp(copy->sessions[k]->session_id, hr->unload_session_ids[i]) == 0)
                        c->epoch = copy->sessions[k]->placement_epoch;
                post_cmd(w, c);
            }
            protobuf_c_message_free_unpacked(resp, NULL);
        } else {
            HYLA_DEBUG("heartbeat: %s", hyla_last_error());
        }
        hyla__v1__heartbeat_request__free_unpacked(copy, NULL);
        sleep_ms(w, w->hb_interval_ms);
    }
    return NULL;
}
