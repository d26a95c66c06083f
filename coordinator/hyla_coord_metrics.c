/* hyla_coord_metrics.c — what the coordinator tells an operator: the metric families it
 * registers (gRPC requests through common/ops, sessions by state and tier, workers by state,
 * committed snapshots, the data directory's disk usage and the embedded store's contents), the
 * grpc.health.v1 service and readiness (false once a stop has begun).
 * Threading: the collector runs on the metrics HTTP thread and takes c->mu briefly to count
 * sessions and workers; the store is read outside it (hyla_store is thread-safe). */
#include <stdio.h>
#include <stdlib.h>

#include "hyla_coord_impl.h"
#include "hyla_probe.h"

struct coord_metrics {
    hyla_metric *sessions, *workers, *disk, *store_sessions, *store_versions, *store_chunks, *store_chunk_bytes;
    hyla_metric *snaps, *snap_written, *snap_state_bytes, *ready;
    hyla_metric *gc_runs, *gc_bytes, *gc_chunks, *versions_dropped;
    /* the store's garbage-collection counts at the last scrape (they only grow while it is open):
     * each scrape adds the difference to the counters above. Collector thread only. */
    uint64_t last_gc_runs, last_gc_bytes, last_gc_chunks, last_versions_dropped;
};

/* Add to counter m what *last lacks of now. */
static void counter_catch_up(hyla_metric *m, uint64_t *last, uint64_t now) {
    if (now > *last) hyla_metric_add(m, NULL, (double)(now - *last));
    *last = now;
}

static const char *enum_name(const ProtobufCEnumDescriptor *d, int v) {
    const ProtobufCEnumValue *e = protobuf_c_enum_descriptor_get_value(d, v);
    return e ? e->name : "unknown";
}

int hyla_coord_ready(hyla_coord *c) {
    pthread_mutex_lock(&c->mu);
    int ready = !c->stopping && !c->stop_requested;
    pthread_mutex_unlock(&c->mu);
    return ready;
}

static int ready_cb(void *ud) { return hyla_coord_ready(ud); }

static void collect(hyla_metrics *r, void *ud) {
    (void)r;
    hyla_coord *c = ud;
    struct coord_metrics *m = c->met;
    /* counts[state][tier] of the directory, workers by state */
    enum { NS = 5, NT = 4, NW = 5 };
    unsigned cnt[NS][NT] = {{0}}, wcnt[NW] = {0};
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < c->n_sess; i++) {
        const csess *s = c->sess[i];
        if (s->deleted) continue;
        cnt[s->state >= 0 && s->state < NS ? s->state : 0][s->tier >= 0 && s->tier < NT ? s->tier : 0]++;
    }
    for (size_t i = 0; i < c->n_workers; i++) {
        int st = c->workers[i]->state;
        wcnt[st >= 0 && st < NW ? st : 0]++;
    }
    pthread_mutex_unlock(&c->mu);
    hyla_metric_clear(m->sessions);
    for (int s = 1; s < NS; s++)
        for (int t = 0; t < NT; t++) {
            if (!cnt[s][t] && t) continue; /* every state shows, with tier "none" at least */
            const char *lv[2] = {enum_name(&hyla__v1__session_state__descriptor, s),
                                 t ? enum_name(&hyla__v1__tier__descriptor, t) : "TIER_UNSPECIFIED"};
            hyla_metric_set(m->sessions, lv, cnt[s][t]);
        }
    for (int w = 1; w < NW; w++) hyla_metric_set1(m->workers, enum_name(&hyla__v1__worker_state__descriptor, w), wcnt[w]);
    char path[1200];
    snprintf(path, sizeof path, "%s/directory", c->data_dir);
    hyla_metric_set1(m->disk, "directory", (double)hyla_probe_dir_bytes(path));
    if (c->store) {
        snprintf(path, sizeof path, "%s/store", c->data_dir);
        hyla_metric_set1(m->disk, "store", (double)hyla_probe_dir_bytes(path));
        hyla_store_usage_info u;
        if (hyla_store_usage(c->store, &u) == HYLA_OK) {
            hyla_metric_set(m->store_sessions, NULL, (double)u.sessions);
            hyla_metric_set(m->store_versions, NULL, (double)u.versions);
            hyla_metric_set(m->store_chunks, NULL, (double)u.chunks);
            hyla_metric_set(m->store_chunk_bytes, NULL, (double)u.chunk_bytes);
            counter_catch_up(m->gc_runs, &m->last_gc_runs, u.gc_runs);
            counter_catch_up(m->gc_bytes, &m->last_gc_bytes, u.gc_bytes_freed);
            counter_catch_up(m->gc_chunks, &m->last_gc_chunks, u.gc_chunks_freed);
            counter_catch_up(m->versions_dropped, &m->last_versions_dropped, u.versions_dropped);
        }
    }
    hyla_metric_set(m->ready, NULL, hyla_coord_ready(c));
}

hyla_status coord_metrics_setup(hyla_coord *c) {
    static const char *const services[] = {"hyla.v1.Sessions", "hyla.v1.Cluster", "hyla.v1.Coordinator", NULL};
    HYLA_TRY(hyla_probe_health_register(c->srv, ready_cb, c, services));
    hyla_metrics *r = c->p.metrics;
    if (!r) return HYLA_OK;
    struct coord_metrics *m = calloc(1, sizeof *m);
    if (!m) return hyla_fail(HYLA_ERR_NOMEM, "coordinator metrics");
    c->met = m;
    hyla_probe_rpc_metrics(c->srv, r);
    static const char *const st_tier[] = {"state", "tier"}, *const one[] = {"state"}, *const what[] = {"dir"};
    m->sessions = hyla_metrics_gauge(r, "hyla_coord_sessions", "Sessions in the directory by state and tier", 2, st_tier);
    m->workers = hyla_metrics_gauge(r, "hyla_coord_workers", "Registered workers by state", 1, one);
    m->disk = hyla_metrics_gauge(r, "hyla_coord_disk_bytes",
                                 "Disk used by the data directory's session directory and embedded store", 1, what);
    m->store_sessions = hyla_metrics_gauge(r, "hyla_store_sessions", "Sessions in the embedded store", 0, NULL);
    m->store_versions = hyla_metrics_gauge(r, "hyla_store_versions",
                                           "Snapshot versions kept in the embedded store (older ones are garbage-collected)", 0, NULL);
    m->store_chunks = hyla_metrics_gauge(r, "hyla_store_chunks", "Distinct chunks in the embedded store", 0, NULL);
    m->store_chunk_bytes = hyla_metrics_gauge(r, "hyla_store_chunk_bytes",
                                              "Encoded bytes of the embedded store's chunks (before RocksDB overhead)", 0, NULL);
    m->snaps = hyla_metrics_counter(r, "hyla_store_snapshots_committed_total", "Snapshots the embedded store committed", 0, NULL);
    m->snap_written = hyla_metrics_counter(r, "hyla_store_snapshot_written_bytes_total",
                                           "Bytes the embedded store wrote for committed snapshots", 0, NULL);
    m->snap_state_bytes = hyla_metrics_histogram(r, "hyla_store_snapshot_state_bytes",
                                                 "Raw state bytes of each committed snapshot", 0, NULL,
                                                 hyla_metrics_bytes_bounds, hyla_metrics_n_bytes_bounds);
    m->gc_runs = hyla_metrics_counter(r, "hyla_store_gc_runs_total",
                                      "Space-reclaim passes and garbage collections the embedded store completed", 0, NULL);
    m->gc_bytes = hyla_metrics_counter(r, "hyla_store_gc_reclaimed_bytes_total",
                                       "Encoded bytes of chunks the embedded store deleted because no version "
                                       "references them (their disk space returns at the next reclaim pass)", 0, NULL);
    m->gc_chunks = hyla_metrics_counter(r, "hyla_store_gc_chunks_deleted_total",
                                        "Chunks the embedded store deleted because no version references them", 0, NULL);
    m->versions_dropped = hyla_metrics_counter(r, "hyla_store_versions_dropped_total",
                                               "Snapshot versions the embedded store dropped by retention (--keep-versions)",
                                               0, NULL);
    m->ready = hyla_metrics_gauge(r, "hyla_ready", "1 while the process takes new work, 0 while stopping or draining", 0, NULL);
    hyla_metrics_add_collector(r, collect, c);
    return HYLA_OK;
}

void coord_metrics_on_commit(hyla_coord *c, const hyla_snapshot_info *info) {
    struct coord_metrics *m = c->met;
    if (!m) return;
    hyla_metric_add(m->snaps, NULL, 1);
    hyla_metric_add(m->snap_written, NULL, (double)info->written_bytes);
    hyla_metric_observe(m->snap_state_bytes, NULL, (double)info->state_bytes);
}

void coord_metrics_free(hyla_coord *c) {
    free(c->met);
    c->met = NULL;
}
