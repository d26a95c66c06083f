/* hyla_worker_impl.h — the hyla-worker program's private types and the functions its files
 * share. Not a public header: only the program's own files include it.
 *
 * Files of the program, one job each:
 *   hyla_worker.c        lifecycle, the gRPC handlers (copy the request into a command) and the
 *                        commands they post, executed on the scheduler thread
 *   hyla_worker_sched.c  the scheduler thread: one loop of named steps, Generate's token output
 *   hyla_worker_pool.c   the session table and its tiers (device, host, store): puts, exports,
 *                        eviction
 *   hyla_worker_stage.c  pipelines: the downstream callback, StageForward calls, ExportStage
 *   hyla_worker_io.c     the I/O thread (statestore) and the membership thread (coordinator)
 * Threads: every function here runs on the scheduler thread unless its comment names another. */
#ifndef HYLA_WORKER_IMPL_H
#define HYLA_WORKER_IMPL_H

#include <pthread.h>
#include <signal.h>
#include <stdint.h>

#include "hyla_tp.h"
#include "hyla_api.h"
#include "hyla_log.h"
#include "hyla_rpc.h"
#include "hyla_session.h"
#include "hyla_store_rpc.h"
#include "hyla_thread.h"
#include "hyla_session_id.h"
#include "hyla_tokenizer.h"
#include "hyla_util.h"
#include "hyla_worker.h"
#include "hyla_worker_sched.h"

#define SVC "/hyla.v1.Worker/"
#define COORD "/hyla.v1.Coordinator/"
#define RPC_TIMEOUT_MS 30000

/* ------------------------------------------------------------------------------------------ */
/* jobs and sessions                                                                           */

struct wsess;
/* An Append call. Registered from its START until both its release (reply/fail) and its DONE
 * have happened, so late events of a released call are recognised and ignored. */
typedef struct append_job {
    hyla_rpc_call *call;
    struct wsess *ws;         /* the session, once the first message named it */
    int released, done_seen;
    struct append_job *next_reg;
    int32_t *toks;            /* received, not yet fed: [n] */
    size_t n, cap;
    uint64_t received, ingested, total_hint;
    int started;              /* first message seen */
    int half_closed;
    int held;                 /* read_hold active (back-pressure) */
    double t0, last_progress;
    char *tbuf;               /* text received and not yet encoded: [tlen]; the tokenizer cuts
                                 only where encoding apart gives the same ids */
    size_t tlen, tcap;
} append_job;

/* text an Append may hold before its tokenizer finds a cut point (a SentencePiece-style
 * tokenizer cuts nowhere: the whole text is encoded when the stream ends) */
#define APPEND_TEXT_HELD_MAX (64 << 20)


typedef struct {
    hyla_rpc_call *call;
    uint32_t max_tokens, delivered;
    char **stop;
    size_t n_stop, max_stop_len;
    int32_t *stop_ids;
    size_t n_stop_ids;
    int ignore_eos;
    char *text;               /* generated text so far (whole UTF-8 characters) */
    size_t text_len, text_cap, text_sent;
    hyla_tokenizer_stream *ds; /* decodes the tokens; NULL without a tokenizer */
    int gone;                 /* a send failed while the session's next step was already posted
                                 (decode lanes): the job ends at that step's token */
} gen_job;

typedef struct wsess {
    char id[128];
    uint64_t epoch;           /* placement epoch */
    hyla_session *s;          /* resident (TIER_GPU); NULL when evicted */
    hyla_snapshot *host;      /* evicted copy (TIER_HOST), or NULL */
    uint64_t snap_version;    /* last durable version (0: none) */
    uint64_t snap_pos;        /* position it covers */
    hyla_snapshot *layout;    /* part sizes of the last durable version (data NULL): for incremental KV */
    int put_inflight;
    hyla_export *exp;         /* auto-snapshot begun, not yet ended (finish_export) */
    uint64_t exp_base;        /* the base position of exp, an incremental export (incremental_base) */
    double exp_t0;            /* when exp began */
    double snap_retry_at;     /* an auto-snapshot failed: do not retry before this time */
    double last_used;
    append_job *app;
    gen_job *gen;
    int in_lane;              /* its decode step is posted in a lane (hyla_worker_sched.c) */
    uint64_t last_step;       /* the decode step (worker's count, from 1) it last took part in; 0: none */
    struct wsess *next;
} wsess;

/* ------------------------------------------------------------------------------------------ */
/* commands                                                                                    */

typedef enum {
    C_LOAD, C_SNAPSHOT, C_UNLOAD, C_FORK, C_DESCRIBE, C_READ_TOKENS, C_APPEND_START, C_APPEND_MSG, C_APPEND_END, C_APPEND_DONE,
    C_GENERATE,
    C_GOT_SNAPSHOT, /* I/O -> scheduler: a snapshot read for C_LOAD (or an error) */
    C_PUT_DONE,     /* I/O -> scheduler: a put finished (or failed) */
    C_DROP,         /* membership -> scheduler: forget a session (placed elsewhere) */
    C_DRAIN,        /* membership -> scheduler: snapshot everything, then stop */
    C_EXPORT,       /* ExportStage: this stage's parts (and those after it) of a session */
    C_STAGE_START,  /* StageForward (this worker is stage k > 0): a call starts */
    C_STAGE_MSG,    /* ... one step of hidden states */
    C_STAGE_END,    /* ... the previous stage half-closed */
    C_STAGE_DONE,   /* ... the call is over */
    C_WAKE,
} cmd_type;

/* The answer to one micro-batch of a step, held until the step's last group (a middle stage
 * over gRPC: the logits of every group arrive when its own downstream finishes). */
typedef struct {
    uint64_t step;
    size_t n;           /* items */
    char **ids, **errs; /* [n] each; errs[i] NULL: the item is fine */
    float *logits;      /* [rows][vocab] or NULL; filled by the step's finish */
    size_t logits_len;  /* bytes */
} stage_held;

/* A StageForward call from the previous pipeline stage (registered like Append calls). */
typedef struct stage_call {
    hyla_rpc_call *call;
    int released, done_seen;
    stage_held held[HYLA_MICRO_BATCH_MAX];
    int n_held;
    int max_groups; /* the most micro-batches of a step seen on this call (logged as it grows) */
    struct stage_call *next;
} stage_call;

typedef struct cmd {
    cmd_type type;
    hyla_rpc_call *call;
    ProtobufCMessage *msg;     /* owned copy of the request (protobuf_c_message_free_unpacked) */
    char session[128];
    uint64_t epoch, version;
    hyla_snapshot *snap;       /* C_GOT_SNAPSHOT */
    hyla_status status;        /* C_GOT_SNAPSHOT / C_PUT_DONE */
    char err[512];
    hyla_snapshot_info info;   /* C_PUT_DONE */
    int unload_after;          /* C_PUT_DONE: the put was for an Unload / eviction */
    int reply_kind;            /* C_PUT_DONE: 0 none, 1 SnapshotResponse, 2 UnloadResponse */
    struct cmd *next;
} cmd;

/* I/O work items */
typedef struct io_item {
    int kind;                  /* 1 put, 2 get */
    char session[128];
    uint64_t epoch, version, base_version;
    hyla_snapshot *snap;       /* put: owned */
    hyla_snapshot *base;       /* put: layout of base (owned) */
    hyla_rpc_call *call;       /* reply target after completion (passed back) */
    int unload_after, reply_kind;
    struct io_item *next;
} io_item;

struct hyla_worker {
    hyla_worker_params p;
    char model_name[256], worker_id[128], group_id[128], store_addr[256], advertise[256];
    hyla_backend *be;
    hyla_model *m;
    hyla_runtime *rt; /* the runtime every session of this worker runs on */
    int lanes_on;      /* decode lanes allowed (HYLA_DECODE_LANES != 0; hyla_worker_sched.c) */
    int ahead;         /* a whole-model worker keeps its next decode step queued on the device while
                          it sends the last step's tokens (on a GPU, or HYLA_DECODE_LANES=1) */
    int incremental;   /* durable puts export only the KV rows past the durable version
                          (HYLA_SNAPSHOT_INCREMENTAL != 0; incremental_base) */
    hyla_tp_group *tp; /* --tp > 1: the group that owns be, m, rt and the other ranks (NULL: none) */
    hyla_tokenizer *tok; /* NULL when the model has no tokenizer (tok_err says why) */
    char tok_err[512];
    hyla_rpc_server *srv;
    int port;
    uint64_t epoch;      /* incarnation from registration */
    uint32_t hb_interval_ms;

    pthread_t sched_th, io_th, memb_th;
    int have_memb;
    volatile sig_atomic_t stop;
    int draining, drained; /* drained: written under exit_mu */
    int drain_acked;       /* the coordinator answered a heartbeat that reported no session after
                              the drain (exit_mu); the worker exits only then (or after 10 s) */

    pthread_mutex_t mu;  /* command queue */
    pthread_cond_t cv;
    cmd *q_head, *q_tail;

    pthread_mutex_t io_mu;
    pthread_cond_t io_cv;
    io_item *io_head, *io_tail;
    hyla_rpc_client *store; /* I/O thread only */
    hyla_rpc_client *coord; /* membership + I/O threads (thread-safe) */

    /* scheduler-owned */
    wsess *sessions;
    append_job *appends; /* registry of Append calls */
    stage_call *stage_calls; /* registry of StageForward calls from the previous stage */
    /* pipeline: this worker's downstream (scheduler thread only, except next_stage under sum_mu) */
    char next_stage[256];
    char next_open[256];
    hyla_rpc_client *next_client;
    hyla_rpc_stream *next_stream;
    uint64_t stage_step;
    /* posted steps awaiting their answers on next_stream, oldest first (stage_finish) */
    struct {
        uint64_t step;
        int rows;
        float *logits; /* host [rows][vocab] to fill, or NULL */
        int aside;     /* NCCL: the ticket of its logits' receive beside the compute stream (-1: none) */
    } next_wait[HYLA_MICRO_BATCH_MAX + HYLA_DOWNSTREAM_IN_FLIGHT];
    int n_next_wait;
    /* NCCL between stages on one host (hyla_worker_stage.c; NULL: none, the rows go over gRPC) */
    struct hyla_nccl_link *next_nccl;  /* to the next stage, over next_stream (rank 0 of 2) */
    char nccl_refused[256];            /* next stage address that declined or failed a link */
    struct hyla_nccl_link *prev_nccl;  /* from the previous stage (rank 1 of 2) ... */
    hyla_rpc_call *prev_nccl_call;     /* ... over this StageForward call */
    uint64_t host_bytes;
    double tok_window_t0;
    uint64_t decode_steps;  /* decode steps and lane posts so far (wsess.last_step) */
    uint64_t tok_window;

    /* summary for heartbeats */
    pthread_mutex_t sum_mu;
    Hyla__V1__WorkerSessionStatus *sum;
    size_t n_sum;
    Hyla__V1__WorkerLoad load;
    size_t scratch_bytes, scratch_logits_bytes; /* the runtime's scratch (hyla_runtime_scratch_bytes) */
    int snap_in_flight, snap_waiting; /* auto-snapshots under way / due but held back (--snapshot-concurrency) */
    char drain_error[512]; /* draining: why the last handover failed ("" after one succeeds) */

    pthread_mutex_t exit_mu;
    pthread_cond_t exit_cv;

    struct worker_metrics *met; /* metric families (hyla_worker_metrics.c); NULL without metrics */
};

static inline double now_s(void) { return hyla_now(); }

/* hyla_worker.c: the command queue (any thread) */
void post_cmd(hyla_worker *w, cmd *c);
cmd *new_cmd(cmd_type t, hyla_rpc_call *call, const ProtobufCMessage *msg);
void free_cmd(cmd *c);
void io_post(hyla_worker *w, io_item *it);
/* hyla_worker.c: commands and the jobs of calls */
void run_commands(hyla_worker *w, cmd *list);
void fail_call(hyla_rpc_call *call, hyla_status st, const char *msg);
wsess *lookup_or_fail(hyla_worker *w, hyla_rpc_call *call, const char *id, const char *what);
void free_append(append_job *a);
void append_finish(hyla_worker *w, append_job *a, hyla_rpc_code code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void free_gen(gen_job *g);

/* hyla_worker_sched.c */
void *scheduler_main(void *arg);
void set_drain_error(hyla_worker *w, const char *session, const char *err);

/* hyla_worker_pool.c */
wsess *session_find(hyla_worker *w, const char *id);
void drop_session(hyla_worker *w, wsess *ws, const char *why);
/* End the session's Append / Generate call with code, keeping exactly what it delivered. */
void end_jobs(hyla_worker *w, wsess *ws, hyla_rpc_code code, const char *why);
hyla_status make_resident(hyla_worker *w, wsess *ws);
hyla_snapshot *layout_of(const hyla_snapshot *s);
hyla_status start_put(hyla_worker *w, wsess *ws, hyla_rpc_call *call, int reply_kind, int unload_after);
/* snap: an export since base_pos (0: whole), hyla_session_export_since. */
hyla_status queue_put(hyla_worker *w, wsess *ws, hyla_snapshot *snap, uint64_t base_pos, hyla_rpc_call *call,
                      int reply_kind, int unload_after);
/* The position an export of ws for its next durable put may start its KV rows from (its
 * durable version's; 0: export whole). */
uint64_t incremental_base(const hyla_worker *w, const wsess *ws);
void finish_export(hyla_worker *w, wsess *ws);
void fill_status(hyla_worker *w, const wsess *ws, Hyla__V1__WorkerSessionStatus *st);
uint64_t resident_bytes(const hyla_worker *w);
void evict_if_needed(hyla_worker *w);

/* hyla_worker_stage.c */
int holds_all_layers(const hyla_worker *w);
void close_next(hyla_worker *w);
extern const hyla_downstream_ops stage_downstream_ops; /* the runtime's downstream: the next stage */
hyla_status gather_downstream(hyla_worker *w, const wsess *ws, hyla_snapshot *snap, uint64_t base_pos);
void do_stage_start(hyla_worker *w, cmd *c);
void do_stage_msg(hyla_worker *w, cmd *c);
void do_stage_end(hyla_worker *w, cmd *c);
void do_stage_done(hyla_worker *w, cmd *c);
void do_export(hyla_worker *w, cmd *c);

/* hyla_worker_metrics.c (any thread; no-ops without metrics) */
hyla_status worker_metrics_setup(hyla_worker *w); /* before the server starts */
void worker_metrics_tokens(hyla_worker *w, const char *phase, uint64_t n, double seconds);
void worker_metrics_snapshot(hyla_worker *w, const char *op, int ok, uint64_t bytes, double seconds);
/* A durable put of snap committed: the bytes its export held, and the whole state's. */
void worker_metrics_export(hyla_worker *w, const hyla_snapshot *snap);
void worker_metrics_free(hyla_worker *w);

/* hyla_worker_io.c */
void *io_main(void *arg);
void *membership_main(void *arg);

#endif
