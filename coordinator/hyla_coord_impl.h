/* hyla_coord_impl.h — the coordinator's private header: the state every coordinator file shares
 * and the functions they call across files. Not installed; include only from coordinator/.
 *
 * Files (one job each; each says its invariants and threading at its top):
 *   hyla_coord.c          lifecycle, the method table, job threads, the one error answer
 *   hyla_coord_table.c    the session table in memory, its views, its persistence (directory)
 *   hyla_coord_members.c  worker registration, heartbeats, groups, the monitor thread
 *   hyla_coord_place.c    placement: choosing a group, calls to workers, place/move/snapshot
 *   hyla_coord_sessions.c the Sessions service's unary handlers (Create ... Fork)
 *   hyla_coord_relay.c    the relayed streams (Generate, Append)
 *   hyla_coord_cluster.c  the Cluster service (ListWorkers, ListClusterSessions, DrainWorker)
 *   hyla_coord_snapshots.c committed snapshots: ReportSnapshot and the embedded store's hooks
 *   hyla_coord_port.c     ExportSession / ImportSession: sessions leave and enter as portable files
 *   hyla_coord_dir.c      the session directory on disk (RocksDB)
 *
 * Errors. Inside the coordinator a failure travels as a hyla_status with its detail message
 * (hyla_fail, thread-local); the gRPC code is chosen once, where a handler answers
 * (coord_answer_error). Relayed streams pass the worker's own final code through unchanged.
 *
 * Locking. One mutex (hyla_coord.mu) guards workers, sessions and the epoch counter; functions
 * named *_locked expect it held. It is never held across a network call. */
#ifndef HYLA_COORD_IMPL_H
#define HYLA_COORD_IMPL_H

#include <pthread.h>
#include <signal.h>
#include <stdint.h>

#include "hyla_api.h"
#include "hyla_coord.h"
#include "hyla_coord_dir.h"
#include "hyla_rpc.h"
#include "hyla_session_id.h"
#include "hyla_store.h"
#include "hyla_store_rpc.h"
#include "hyla_util.h"

#define SVC_SESSIONS "/hyla.v1.Sessions/"
#define SVC_CLUSTER "/hyla.v1.Cluster/"
#define SVC_COORD "/hyla.v1.Coordinator/"
#define SVC_WORKER "/hyla.v1.Worker/"
#define SVC_ADMIN "/hyla.v1.Admin/"
#define ID_MAX 128 /* worker ids, tenants, models, groups (with the NUL) */
#define SID_MAX (HYLA_SESSION_ID_MAX + 1) /* session ids (with the NUL) */
#define MAX_STAGES 16
#define PAGE_DEFAULT 100
#define PAGE_MAX 1000

typedef Hyla__V1__Session Session;

/* A registered worker (a member of one group). */
typedef struct {
    char id[ID_MAX], address[256], model[ID_MAX], version[64];
    uint64_t fingerprint, param_bytes, state_budget;
    uint32_t num_layers, lb, le;
    uint32_t max_generate; /* its --max-generate (0: not told, an older worker) */
    char dev_name[64], dev_desc[256];
    uint64_t mem_total, mem_free;
    int state; /* Hyla__V1__WorkerState */
    uint64_t epoch;
    int64_t registered_ms, hb_ms;
    double hb_mono;
    Hyla__V1__WorkerLoad load; /* scalar fields only */
    char group[ID_MAX];
    char told_next[256]; /* next stage's address as told at registration */
    int reconcile; /* the first heartbeat after registration reconciles its sessions */
    uint32_t sessions_reported;
    char drain_error[512]; /* its last heartbeat's drain_error: why a handover failed (DrainWorker) */
    hyla_rpc_client *client; /* to its Worker service */
} cworker;

/* A session's directory record in memory. state is ACTIVE (on group under epoch), PAUSED (in the
 * store only) or MOVING (a call is placing it); Session.state shows PAUSED also for an ACTIVE
 * session with `paused` set (its resident copy shows in tier and group_id). */
typedef struct {
    char id[SID_MAX], tenant[ID_MAX], model[ID_MAX], group[ID_MAX], parent[SID_MAX];
    int state, tier;
    uint64_t position, generated, seed, epoch;
    float temperature, top_p;
    int32_t top_k;
    Hyla__V1__SnapshotInfo snap; /* scalar fields only */
    int64_t created_ms, updated_ms;
    char error[256];
    int busy, refs, deleted;
    int paused; /* ACTIVE but paused by Pause without evict: shown PAUSED, still resident */
} csess;

typedef struct coord_keys coord_keys;

/* One served method: its handler and where it runs. */
typedef struct {
    hyla_coord *c;
    void (*fn)(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *req, const char *tenant);
    int inline_call; /* run on the loop thread (memory only) */
} binding;

struct hyla_coord {
    hyla_coord_params p;
    char listen[256], advertise[256], store_addr[256], data_dir[1024];
    hyla_rpc_server *srv;
    int port;
    hyla_coord_dir *dir;
    hyla_store *store;

    pthread_mutex_t mu;
    pthread_cond_t cv; /* session busy flags, job count, worker changes */
    cworker **workers;
    size_t n_workers, cap_workers;
    csess **sess; /* sorted by id */
    size_t n_sess, cap_sess;
    uint64_t epoch_counter;
    hyla_rng rng;
    double started_mono;
    int stopping, jobs;
    pthread_t monitor;
    int monitor_started;
    hyla_rpc_client **retired;
    size_t n_retired;
    int stop_pipe[2];
    binding bindings[32];
    int n_bindings;
    hyla_store_rpc_hooks hooks; /* borrowed by the StateStore service */
    int relays;                 /* relayed streams alive (their worker streams must end first) */
    coord_keys *keys;           /* API keys (hyla_coord_auth.c); NULL: development mode, no keys */
    volatile sig_atomic_t stop_requested; /* hyla_coord_request_stop ran: readiness is false */
    struct coord_metrics *met;  /* metric families (hyla_coord_metrics.c); NULL without metrics */
    struct coord_quota *quota;  /* per-tenant running Generate calls (hyla_coord_quota.c) */
};

/* A Session message built from a csess; references only its own storage. */
typedef struct {
    Session s;
    Hyla__V1__SamplingParams sp;
    Hyla__V1__SnapshotInfo si;
    char *wids[MAX_STAGES];
    char wid_store[MAX_STAGES][ID_MAX];
    csess copy;
} sess_view;

typedef int (*sess_filter)(const hyla_coord *c, const csess *s, const void *arg);

/* ---- hyla_coord_quota.c: per-tenant limits (RESOURCE_EXHAUSTED naming the limit) ---- */
hyla_status coord_quota_init(hyla_coord *c);
void coord_quota_free(hyla_coord *c);
/* A new session (Create, Fork) for tenant: its session count and stored bytes. c->mu held. */
hyla_status coord_quota_new_session_locked(const hyla_coord *c, const char *tenant);
/* New input (Append): the tenant's stored bytes. Takes c->mu. */
hyla_status coord_quota_check_bytes(hyla_coord *c, const char *tenant);
/* A Generate call starts / ends (every successful enter is matched by one leave). No lock held. */
hyla_status coord_quota_generate_enter(hyla_coord *c, const char *tenant);
void coord_quota_generate_leave(hyla_coord *c, const char *tenant);

/* ---- hyla_coord_metrics.c: metrics, health, readiness ---- */
/* Register grpc.health.v1 and, with p.metrics, the families and the collector (before start). */
hyla_status coord_metrics_setup(hyla_coord *c);
/* The embedded store committed a snapshot (any thread). */
void coord_metrics_on_commit(hyla_coord *c, const hyla_snapshot_info *info);
void coord_metrics_free(hyla_coord *c);

/* ---- hyla_coord.c: lifecycle, jobs, answers ---- */
/* The gRPC code of a coordinator failure: the one mapping (hyla_rpc_code_from_status). */
hyla_rpc_code coord_rpc_code(hyla_status st);
/* Answer a call with st's gRPC code and the detail message of the failure on this thread. */
void coord_answer_error(hyla_rpc_call *call, hyla_status st);
/* Start fn(arg) on a detached thread counted in c->jobs; 0 on success. */
int coord_spawn(hyla_coord *c, void *(*fn)(void *), void *arg);
/* A job thread ends (the last thing it does). */
void coord_job_done(hyla_coord *c);
/* The caller's tenant into out (ID_MAX bytes): the tenant of its API key when keys are on, else
 * x-hyla-tenant (default "default"); 0 once the call has been answered INVALID_ARGUMENT for a
 * malformed header (every handler refuses it the same way). */
int coord_get_tenant(hyla_rpc_call *call, char *out);

/* ---- hyla_coord_auth.c: API keys, the verifier and the Admin service ---- */
/* Turn authentication on when params.admin_key is set (else log the development-mode warning):
 * load the key records, set the verifier and the per-service policies. Before the server starts. */
hyla_status coord_auth_setup(hyla_coord *c);
void coord_auth_free(hyla_coord *c);
void coord_do_create_key(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant);
void coord_do_revoke_key(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant);
void coord_do_list_keys(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant);

/* ---- hyla_coord_table.c: the session table ---- */
int64_t coord_now_ms(void);
void coord_copy_str(char *dst, size_t cap, const char *src);
long coord_sess_search(const hyla_coord *c, const char *id);
/* Index of id among n entries sorted by id (id_at(arr, i): the i-th entry's id), or -(insertion
 * point) - 1: the session table and the key table are searched alike. */
long coord_search_ids(const void *arr, size_t n, const char *(*id_at)(const void *arr, size_t i), const char *id);
csess *coord_sess_find(const hyla_coord *c, const char *id);
void coord_sess_insert_locked(hyla_coord *c, csess *s);
void coord_sess_unref_locked(csess *s);
void coord_sess_remove_locked(hyla_coord *c, csess *s);
/* A session a call creates (Create, Fork, Import) enters the table busy and MOVING, holding the
 * call's reference; if it cannot be placed, drop_new takes it out again, wakes waiters and drops
 * that reference (both with c->mu held). */
void coord_sess_insert_new_locked(hyla_coord *c, csess *s);
void coord_sess_drop_new_locked(hyla_coord *c, csess *s);
csess *coord_sess_new(void);
void coord_new_session_id_locked(hyla_coord *c, char *out);
hyla_status coord_acquire(hyla_coord *c, const char *id, const char *tenant, csess **out);
void coord_release(hyla_coord *c, csess *s);
void coord_view_make_locked(const hyla_coord *c, const csess *s, sess_view *v);
/* A reply-ready copy of s, taken under c->mu so it is consistent: the answer of every handler that
 * returns a Session. Caller frees with free(). */
sess_view *coord_view_of(hyla_coord *c, const csess *s);
hyla_status coord_persist_locked(hyla_coord *c, csess *s, int sync, int counter);
void coord_unplace_locked(hyla_coord *c, csess *s, const char *why);
hyla_status coord_load_session_fn(void *ud, const Session *m, uint64_t epoch);
void coord_list_page(hyla_coord *c, hyla_rpc_call *call, uint32_t page_size, const char *page_token, sess_filter f,
                     const void *arg, int cluster);

/* ---- hyla_coord_members.c: workers, groups, monitor ---- */
cworker *coord_worker_find(const hyla_coord *c, const char *id);
int coord_worker_alive(const cworker *w);
int coord_group_members_locked(const hyla_coord *c, const char *group, cworker **out);
int coord_group_complete_locked(const hyla_coord *c, const char *group);
int coord_group_placeable_locked(const hyla_coord *c, const char *group);
uint32_t coord_group_sessions_locked(const hyla_coord *c, const char *group);
uint32_t coord_worker_stage_locked(const hyla_coord *c, const cworker *w);
void *coord_monitor_main(void *arg);
void coord_do_register(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant);
void coord_do_heartbeat(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant);

/* A call's worker hint checked: NOT_FOUND (no such worker), INVALID_ARGUMENT (another model). */
hyla_status coord_check_hint(hyla_coord *c, const char *hint, const char *model);
/* ---- hyla_coord_place.c: placement ---- */
hyla_status coord_resolve_model_locked(const hyla_coord *c, const char *want, char *out);
hyla_status coord_call_worker(hyla_coord *c, const char *wid, const char *method, const ProtobufCMessage *req,
                              const ProtobufCMessageDescriptor *rd, ProtobufCMessage **resp, hyla_rpc_result *res);
int coord_owners_locked(const hyla_coord *c, const csess *s, char ids[MAX_STAGES][ID_MAX]);
/* Under c->mu: *active (s is ACTIVE), its owners into ids (none when not active), *epoch; returns
 * the owner count: one consistent view to act on once the lock is dropped. */
int coord_active_owners(hyla_coord *c, const csess *s, char ids[MAX_STAGES][ID_MAX], int *active, uint64_t *epoch);
void coord_unload_on(hyla_coord *c, char ids[MAX_STAGES][ID_MAX], int n, const char *sid, uint64_t epoch);
hyla_status coord_place(hyla_coord *c, csess *s, const char *hint, const char *exclude, uint64_t snapshot_version);
hyla_status coord_ensure_active(hyla_coord *c, csess *s, char *owner, uint64_t *epoch);
hyla_status coord_snapshot_now(hyla_coord *c, csess *s, Hyla__V1__SnapshotInfo *out);
hyla_status coord_move(hyla_coord *c, csess *s, const char *to_worker, char *from, Hyla__V1__SnapshotInfo *si);

/* ---- hyla_coord_sessions.c: the Sessions service ---- */
hyla_status coord_check_sampling(const Hyla__V1__SamplingParams *sp);
hyla_status coord_check_session_id(const char *id);
void coord_do_create(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant);
void coord_do_get(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant);
void coord_do_list(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant);
void coord_do_delete(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant);
void coord_do_pause(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant);
void coord_do_resume(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant);
void coord_do_migrate(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant);
void coord_do_fork(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant);
void coord_do_list_snapshots(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant);
/* The kept version `version` of session id exists in the embedded store: HYLA_ERR_NOT_FOUND
 * naming the kept range otherwise, HYLA_ERR_UNSUPPORTED without an embedded store. */
hyla_status coord_check_kept_version(hyla_coord *c, const char *id, uint64_t version);
void coord_do_list_models(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant);
void coord_do_read_tokens(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant);

/* ---- hyla_coord_port.c: ExportSession and ImportSession (the portable snapshot file) ---- */
void coord_do_export(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant);
void coord_h_import(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *msg, void *ud);

/* ---- hyla_coord_relay.c: Generate and Append ---- */
void coord_h_generate(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *msg, void *ud);
void coord_h_append(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *msg, void *ud);

/* ---- hyla_coord_cluster.c: the Cluster service ---- */
void coord_worker_info_locked(const hyla_coord *c, const cworker *w, Hyla__V1__WorkerInfo *wi,
                              Hyla__V1__LayerRange *lr, Hyla__V1__Device *dev, Hyla__V1__WorkerLoad *load);
void coord_do_list_workers(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant);
void coord_do_list_cluster_sessions(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant);
void coord_do_drain(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant);

/* ---- hyla_coord_snapshots.c: committed snapshots ---- */
int coord_note_snapshot_locked(hyla_coord *c, const char *sid, uint64_t placement_epoch,
                               const Hyla__V1__SnapshotInfo *si);
void coord_do_report_snapshot(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant);
hyla_status coord_store_check_put(void *ud, const char *session, uint64_t placement_epoch);
void coord_store_on_commit(void *ud, const char *session, uint64_t placement_epoch, const hyla_snapshot_info *info);

#endif
