/* hyla_worker.h — the hyla-worker server: the Worker gRPC service over one loaded model.
 *
 * One scheduler thread owns the backend, the model and every session; gRPC handlers only
 * post commands to it. Each scheduler step batches the decode of every session with a
 * Generate in progress into one hyla_session_decode call (continuous batching) and feeds
 * prefill tokens of Append calls under a per-step token budget. Sessions beyond the state
 * budget are evicted (least recently used first) to host memory with a durable snapshot, and
 * restored transparently when addressed; every session is snapshotted durably at least every
 * `snapshot_every` tokens, so a crash of the worker costs at most that much work.
 *
 * A separate I/O thread talks to the statestore (snapshots) and a membership thread to the
 * coordinator (registration, heartbeats, snapshot reports). */
#ifndef HYLA_WORKER_H
#define HYLA_WORKER_H

#include <stdint.h>

#include "hyla_status.h"

typedef struct hyla_worker hyla_worker;

typedef struct {
    const char *model_dir;     /* required */
    const char *model_name;    /* default: the directory's base name */
    const char *device;        /* "cpu" (default) or "cuda:N" */
    int layer_begin, layer_end;/* layer range (default 0, -1 = all) */
    int tp;                    /* tensor parallelism: split each layer over this many GPUs from
                                  `device` on (or CPU backends); default 1 (worker/hyla_tp.h) */
    const char *listen;        /* Worker service address (default 127.0.0.1:0) */
    const char *advertise;     /* address the coordinator should dial (default: listen host + bound port) */
    const char *coordinator;   /* coordinator address; NULL: run without one (tests) */
    const char *store;         /* StateStore address; NULL: the one the coordinator names */
    const char *worker_id;     /* stable id; NULL: the coordinator assigns one */
    uint64_t state_budget_bytes;   /* resident state beyond this evicts idle sessions (0 = unlimited) */
    uint64_t host_budget_bytes;    /* host-tier sessions beyond this leave the worker (durable in the store; default 4 GiB) */
    uint32_t snapshot_every;   /* auto-snapshot every this many tokens (0 = never); default 1024 */
    uint32_t snapshot_concurrency; /* auto-snapshots (export or put) in flight at most (0 = no limit); default 4 */
    int max_batch;             /* sessions per decode step (default 64) */
    int prefill_budget;        /* prefill tokens per scheduler step while sessions generate (default 1024;
                                  with none generating, up to the runtime's prefill piece) */
    int prefill_piece;         /* tokens per prefill forward pass (0: the model's default; hyla_model.h) */
    uint32_t max_generate;     /* largest max_tokens accepted (default 65536) */
    uint64_t max_append_tokens;/* largest document one Append may send (default 1 << 24) */
    int rpc_threads;           /* gRPC completion-queue threads (default 2) */
    int max_message_bytes;     /* gRPC message limit (default 16 MiB) */
    const char *next_stage;    /* pipelines without a coordinator (tests): the next stage's address */
    const char *admin_key;     /* the cluster's operator key (--admin-key-file): this worker's port
                                  accepts only the cluster credential derived from it (and the
                                  key itself); NULL: development mode, no authentication */
    struct hyla_metrics *metrics; /* registry to fill (hyla_metrics.h), borrowed until destroy; NULL: none */
    uint32_t token_log;        /* generated tokens each session keeps for ReadTokens, 1..65536 (0: 65536) */
    int micro_batches;         /* a pipeline stage's micro-batches per decode step, 1..16 (default 2;
                                  1: off; hyla_runtime_set_micro_batches) */
} hyla_worker_params;

hyla_worker_params hyla_worker_default_params(void);

/* Load the model, start serving and (if a coordinator is set) register. Caller frees with
 * hyla_worker_destroy. */
hyla_status hyla_worker_start(const hyla_worker_params *p, hyla_worker **out);
/* The bound port of the Worker service. */
int hyla_worker_port(const hyla_worker *w);
/* Block until the worker should exit: stop requested, or drained after an operator's drain and
 * the coordinator has seen it drained (a heartbeat reporting no session was answered; at most
 * 10 s after it drained). */
void hyla_worker_wait(hyla_worker *w);
/* Ask the worker to stop (async-signal-safe). */
void hyla_worker_request_stop(hyla_worker *w);
/* 1 while the worker takes new work, 0 while draining or stopping (readiness, health). */
int hyla_worker_ready(hyla_worker *w);
/* Stop serving, join threads, free. Accepts NULL. */
void hyla_worker_destroy(hyla_worker *w);

#endif
