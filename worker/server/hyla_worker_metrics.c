/* hyla_worker_metrics.c — what a worker tells an operator: gRPC requests (common/ops), tokens
 * and compute seconds of prefill and decode (tokens/s = rate of one over the other), sessions by
 * tier, state memory, snapshot puts and restores (bytes, latency, failures), the
 * grpc.health.v1 service, and readiness (false while draining or stopping).
 * Threading: updates come from the scheduler and I/O threads (the registry locks); the
 * collector runs on the metrics HTTP thread and reads the heartbeat summary under sum_mu. */
#include <stdio.h>
#include <stdlib.h>

#ifdef HYLA_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "hyla_probe.h"
#include "hyla_worker_impl.h"

struct worker_metrics {
    hyla_metric *tokens, *seconds, *sessions, *state_bytes, *state_budget, *calls, *queued;
    hyla_metric *snap_seconds, *snap_bytes, *snap_fail, *ready, *gpu_mem, *exp_bytes, *exp_state, *scratch, *snaps;
    int cuda_device; /* -1: not a cuda worker */
};

/* Device memory of a cuda worker (device-wide: every process's use counts), read with the
 * CUDA runtime on the scrape thread (the runtime is thread-safe; cudaSetDevice is per thread
 * and selects the primary context the backend already uses). */
static void collect_gpu(struct worker_metrics *m) {
#ifdef HYLA_HAVE_CUDA
    size_t free_b = 0, total_b = 0;
    if (m->cuda_device < 0 || cudaSetDevice(m->cuda_device) != cudaSuccess ||
        cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
        cudaGetLastError(); /* clear it: a failed scrape must not poison the backend's checks */
        return;
    }
    hyla_metric_set1(m->gpu_mem, "total", (double)total_b);
    hyla_metric_set1(m->gpu_mem, "free", (double)free_b);
    hyla_metric_set1(m->gpu_mem, "used", (double)(total_b - free_b));
#else
    (void)m;
#endif
}

int hyla_worker_ready(hyla_worker *w) {
    return !w->stop && !__atomic_load_n(&w->draining, __ATOMIC_RELAXED);
}

static int ready_cb(void *ud) { return hyla_worker_ready(ud); }

static void collect(hyla_metrics *r, void *ud) {
    (void)r;
    hyla_worker *w = ud;
    struct worker_metrics *m = w->met;
    pthread_mutex_lock(&w->sum_mu);
    Hyla__V1__WorkerLoad load = w->load;
    const size_t scratch = w->scratch_bytes, scratch_logits = w->scratch_logits_bytes;
    const int snap_in_flight = w->snap_in_flight, snap_waiting = w->snap_waiting;
    pthread_mutex_unlock(&w->sum_mu);
    hyla_metric_set1(m->snaps, "in_flight", snap_in_flight);
    hyla_metric_set1(m->snaps, "waiting", snap_waiting);
    hyla_metric_set1(m->scratch, "activations", (double)(scratch - scratch_logits));
    hyla_metric_set1(m->scratch, "logits", (double)scratch_logits);
    hyla_metric_set1(m->sessions, "gpu", load.sessions_gpu);
    hyla_metric_set1(m->sessions, "host", load.sessions_host);
    hyla_metric_set(m->state_bytes, NULL, (double)load.state_bytes);
    hyla_metric_set(m->state_budget, NULL, (double)load.state_budget_bytes);
    hyla_metric_set(m->calls, NULL, load.active_calls);
    hyla_metric_set(m->queued, NULL, load.queued_tokens);
    hyla_metric_set(m->ready, NULL, hyla_worker_ready(w));
    collect_gpu(m);
}

hyla_status worker_metrics_setup(hyla_worker *w) {
    static const char *const services[] = {"hyla.v1.Worker", NULL};
    HYLA_TRY(hyla_probe_health_register(w->srv, ready_cb, w, services));
    hyla_metrics *r = w->p.metrics;
    if (!r) return HYLA_OK;
    struct worker_metrics *m = calloc(1, sizeof *m);
    if (!m) return hyla_fail(HYLA_ERR_NOMEM, "worker metrics");
    w->met = m;
    hyla_probe_rpc_metrics(w->srv, r);
    static const char *const phase[] = {"phase"}, *const tier[] = {"tier"}, *const op[] = {"op"}, *const kind[] = {"kind"};
    m->tokens = hyla_metrics_counter(r, "hyla_worker_tokens_total", "Tokens computed, by phase (prefill, decode)", 1, phase);
    m->seconds = hyla_metrics_counter(r, "hyla_worker_compute_seconds_total",
                                      "Seconds spent in forward passes, by phase; tokens/s = rate(tokens) / rate(seconds)",
                                      1, phase);
    m->sessions = hyla_metrics_gauge(r, "hyla_worker_sessions", "Sessions held, by tier (gpu: the state pool, host: evicted)", 1, tier);
    m->state_bytes = hyla_metrics_gauge(r, "hyla_worker_state_bytes", "Session state bytes resident in the state pool (device memory on cuda)", 0, NULL);
    m->state_budget = hyla_metrics_gauge(r, "hyla_worker_state_budget_bytes", "State pool budget (0: unlimited)", 0, NULL);
    m->scratch = hyla_metrics_gauge(r, "hyla_worker_scratch_bytes",
                                    "The runtime's scratch, by kind (activations: a prefill piece's or a decode batch's "
                                    "rows with the mixers' scratch; logits: only rows whose logits are wanted)", 1, kind);
    m->calls = hyla_metrics_gauge(r, "hyla_worker_active_calls", "Append and Generate calls in progress", 0, NULL);
    m->queued = hyla_metrics_gauge(r, "hyla_worker_queued_prefill_tokens", "Prefill tokens waiting in the scheduler", 0, NULL);
    static const char *const state[] = {"state"};
    m->snaps = hyla_metrics_gauge(r, "hyla_worker_snapshots",
                                  "Sessions' snapshots by state (in_flight: an export or put under way; waiting: an "
                                  "auto-snapshot due but held back by --snapshot-concurrency)",
                                  1, state);
    m->snap_seconds = hyla_metrics_histogram(r, "hyla_worker_snapshot_seconds",
                                             "Snapshot transfer time to or from the statestore, by op (put, get)", 1, op,
                                             hyla_metrics_latency_bounds, hyla_metrics_n_latency_bounds);
    m->snap_bytes = hyla_metrics_counter(r, "hyla_worker_snapshot_bytes_total",
                                         "Snapshot bytes: put = bytes the store wrote, get = raw state bytes restored", 1, op);
    m->snap_fail = hyla_metrics_counter(r, "hyla_worker_snapshot_failures_total", "Snapshot puts and gets that failed", 1, op);
    m->exp_bytes = hyla_metrics_counter(r, "hyla_worker_snapshot_exported_bytes_total",
                                        "State bytes exported for durable puts (an incremental export leaves out the KV rows "
                                        "the session's durable version holds)", 0, NULL);
    m->exp_state = hyla_metrics_counter(r, "hyla_worker_snapshot_state_bytes_total",
                                        "State bytes of the snapshots put (whole, as restored)", 0, NULL);
    m->cuda_device = -1;
    if (w->p.device && sscanf(w->p.device, "cuda:%d", &m->cuda_device) != 1) m->cuda_device = -1;
    if (m->cuda_device >= 0)
        m->gpu_mem = hyla_metrics_gauge(r, "hyla_worker_gpu_memory_bytes",
                                        "Device memory of this worker's GPU (device-wide), by kind (total, free, used)", 1, kind);
    m->ready = hyla_metrics_gauge(r, "hyla_ready", "1 while the process takes new work, 0 while stopping or draining", 0, NULL);
    hyla_metrics_add_collector(r, collect, w);
    return HYLA_OK;
}

void worker_metrics_tokens(hyla_worker *w, const char *phase, uint64_t n, double seconds) {
    if (!w->met) return;
    hyla_metric_inc1(w->met->tokens, phase, (double)n);
    hyla_metric_inc1(w->met->seconds, phase, seconds);
}

void worker_metrics_snapshot(hyla_worker *w, const char *op, int ok, uint64_t bytes, double seconds) {
    if (!w->met) return;
    if (!ok) {
        hyla_metric_inc1(w->met->snap_fail, op, 1);
        return;
    }
    hyla_metric_observe1(w->met->snap_seconds, op, seconds);
    hyla_metric_inc1(w->met->snap_bytes, op, (double)bytes);
}

void worker_metrics_export(hyla_worker *w, const hyla_snapshot *snap) {
    if (!w->met) return;
    uint64_t held = 0;
    for (uint32_t i = 0; i < snap->n_parts; i++) held += snap->parts[i].nbytes - snap->parts[i].skip;
    hyla_metric_inc1(w->met->exp_bytes, NULL, (double)held);
    hyla_metric_inc1(w->met->exp_state, NULL, (double)hyla_snapshot_bytes(snap));
}

void worker_metrics_free(hyla_worker *w) {
    free(w->met);
    w->met = NULL;
}
