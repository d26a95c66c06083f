/* hyla_coord.h — the hyla-coordinator server: the public Sessions and Cluster services, the
 * internal Coordinator service, and (by default) the embedded StateStore service.
 *
 * What it keeps:
 *   - worker membership (register, heartbeat; a worker silent for dead_after_ms is dead) and
 *     worker groups (a whole-model worker is a group of one; layer-range workers of one model
 *     are assembled into a pipeline whose ranges tile the model);
 *   - the session directory, persisted in its own RocksDB (DATA/directory): a restart loses
 *     no session;
 *   - the embedded statestore (DATA/store), served to workers as hyla.v1.StateStore.
 * What it does: places new and paused sessions on the least-loaded complete group, routes each
 * Sessions call to the owning group, and re-places sessions of dead workers lazily from their
 * last durable snapshot (the next call that needs the session places it).
 *
 * Threading: handlers run on the rpc loop threads and only touch memory under one lock;
 * anything that waits (calls to workers, store writes) runs on a thread per call. A monitor
 * thread declares dead workers. Ownership: hyla_coord_start returns a coordinator the caller
 * frees with hyla_coord_destroy. */
#ifndef HYLA_COORD_H
#define HYLA_COORD_H

#include <stdint.h>

#include "hyla_status.h"
#include "hyla_store.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hyla_coord hyla_coord;

/* Default of hyla_coord_params.max_import_bytes (--max-import-bytes). */
#define HYLA_COORD_IMPORT_MAX (1ull << 30)

typedef struct {
    const char *listen;          /* gRPC address (default "127.0.0.1:7000"; port 0 picks one) */
    const char *advertise;       /* address workers dial for the store (default: listen host + port) */
    const char *data_dir;        /* required: DATA/directory (sessions), DATA/store (snapshots) */
    int embed_store;             /* serve the StateStore from DATA/store (default 1) */
    const char *store_address;   /* when embed_store = 0: the StateStore workers should use */
    uint32_t heartbeat_ms;       /* heartbeat interval told to workers (default 1000) */
    uint32_t dead_after_ms;      /* silence after which a worker is dead (default 5000) */
    int rpc_threads;             /* gRPC loop threads (default 4) */
    int max_message_bytes;       /* gRPC message limit (default 16 MiB) */
    int64_t worker_timeout_ms;   /* deadline of unary calls to workers (default 60000) */
    const hyla_store_params *store; /* the embedded store's parameters (borrowed for hyla_coord_start);
                                       NULL: hyla_store_default_params() */
    const char *admin_key;       /* the operator key (--admin-key-file): API keys required on every
                                    call; NULL or "": development mode, no authentication */
    struct hyla_metrics *metrics; /* registry to fill (hyla_metrics.h), borrowed until destroy; NULL: none */
    /* per-tenant quotas (0 = no limit); over one, new work fails RESOURCE_EXHAUSTED naming it */
    uint32_t quota_sessions;     /* sessions in the directory */
    uint64_t quota_stored_bytes; /* bytes of the sessions' committed snapshots in the store */
    uint32_t quota_generations;  /* Generate calls running at once */
    uint64_t max_import_bytes;   /* largest snapshot file ImportSession takes (it is held in memory
                                    while checked); default HYLA_COORD_IMPORT_MAX (1 GiB); over it:
                                    RESOURCE_EXHAUSTED naming the limit */
} hyla_coord_params;

hyla_coord_params hyla_coord_default_params(void);

/* Open the data directory, load the session directory, start serving. Caller frees with
 * hyla_coord_destroy. Fails naming the directory or the address. */
hyla_status hyla_coord_start(const hyla_coord_params *p, hyla_coord **out);
/* The bound TCP port. */
int hyla_coord_port(const hyla_coord *c);
/* Block until hyla_coord_request_stop. */
void hyla_coord_wait(hyla_coord *c);
/* Ask hyla_coord_wait to return (async-signal-safe). */
void hyla_coord_request_stop(hyla_coord *c);
/* 1 while the coordinator takes new work, 0 once a stop was requested (readiness, health). */
int hyla_coord_ready(hyla_coord *c);
/* Stop serving (calls in flight get their grace period, then CANCELLED), join, free. Accepts NULL. */
void hyla_coord_destroy(hyla_coord *c);

#ifdef __cplusplus
}
#endif
#endif
