/* hyla.h — libhyla, the C client of a hyla cluster (the Sessions and Cluster services of
 * proto/hyla/v1/ as served by hyla-coordinator).
 *
 * A client is a connection to one coordinator address for one tenant. Every call is blocking
 * and returns a hyla_status; on failure the detail message (hyla_last_error(), thread-local)
 * reads "<Call> <session>: <GRPC_CODE>: <server message>", and hyla_client_last_code() gives
 * the gRPC status code of the last call made on this thread. The two streaming calls (append,
 * generate) report progress through callbacks that run on the calling thread.
 *
 * Ownership words used below: "caller frees with X" (the caller owns the result), "borrowed
 * until Y" (valid until Y, do not free), "copied" (the library keeps its own copy).
 *
 * Threading: a hyla_client may be used from several threads at once; each call is independent.
 * Result structs are owned by the caller and not shared with the library.
 *
 * No gRPC or protobuf-c type appears here; link the hyla_client library (CMake target
 * hyla_client), which brings hyla_rpc, hyla_proto and hyla_common. docs/CLIENTS.md has a tour. */
#ifndef HYLA_CLIENT_H
#define HYLA_CLIENT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "hyla_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------ */
/* Connection                                                                                  */

typedef struct hyla_client hyla_client;

typedef struct {
    int64_t call_timeout_ms;   /* deadline of each unary call (create, pause, ls, ...); <= 0: none.
                                  Default 60000. */
    int64_t stream_timeout_ms; /* deadline of append, generate and drain --wait; <= 0: none
                                  (default). */
    int wait_for_ready;        /* 1: a call made while the server is unreachable waits for it
                                  (until its deadline); 0 (default): fails at once with
                                  UNAVAILABLE. */
    int max_message_bytes;     /* largest message sent or received (default 16 MiB) */
    size_t append_chunk_bytes; /* text bytes per Append message (default 64 KiB) */
    size_t append_chunk_tokens;/* token ids per Append message (default 16384) */
    const char *api_key;       /* the tenant's API key, sent as "authorization: Bearer KEY" on
                                  every call (copied at connect); NULL or "" (default): none,
                                  for a coordinator in development mode. The tenant then comes
                                  from the key: the server ignores `tenant`. A gateway that
                                  forwards its callers' keys connects once per key. */
    const char *tls_ca;        /* PEM file of the CA that signed the coordinator's certificate:
                                  connect with TLS (read at connect); NULL (default): plain */
} hyla_client_params;

/* The defaults above, by value. */
hyla_client_params hyla_client_default_params(void);

/* A client of the coordinator at addr ("127.0.0.1:7000", "[::1]:7000", "unix:/path", any gRPC
 * target). tenant: sent as x-hyla-tenant on every call; NULL or "": none is sent (the server
 * then uses tenant "default"); otherwise printable ASCII without spaces, at most 128 bytes.
 * addr and tenant are copied; params may be NULL (defaults). The connection is made lazily: an
 * unreachable server shows up as UNAVAILABLE on the first call, not here. Fails with
 * HYLA_ERR_INVALID_ARG for an empty address or a malformed tenant.
 * *out: caller frees with hyla_client_close. */
hyla_status hyla_client_connect(const char *addr, const char *tenant, const hyla_client_params *params,
                                hyla_client **out);

/* Close the connection and free the client. No call may be in progress. Accepts NULL. */
void hyla_client_close(hyla_client *c);

/* The address and tenant given to connect. Borrowed until hyla_client_close. tenant: "" if none. */
const char *hyla_client_address(const hyla_client *c);
const char *hyla_client_tenant(const hyla_client *c);

/* ------------------------------------------------------------------------------------------ */
/* Errors                                                                                      */

/* Canonical gRPC status codes (same numbers as gRPC's), for hyla_client_last_code(). */
enum {
    HYLA_CODE_LOCAL = -1, /* the call failed in the client before it reached gRPC (bad argument) */
    HYLA_CODE_OK = 0,
    HYLA_CODE_CANCELLED = 1,
    HYLA_CODE_UNKNOWN = 2,
    HYLA_CODE_INVALID_ARGUMENT = 3,
    HYLA_CODE_DEADLINE_EXCEEDED = 4,
    HYLA_CODE_NOT_FOUND = 5,
    HYLA_CODE_ALREADY_EXISTS = 6,
    HYLA_CODE_PERMISSION_DENIED = 7,
    HYLA_CODE_RESOURCE_EXHAUSTED = 8,
    HYLA_CODE_FAILED_PRECONDITION = 9,
    HYLA_CODE_ABORTED = 10,
    HYLA_CODE_OUT_OF_RANGE = 11,
    HYLA_CODE_UNIMPLEMENTED = 12,
    HYLA_CODE_INTERNAL = 13,
    HYLA_CODE_UNAVAILABLE = 14,
    HYLA_CODE_DATA_LOSS = 15,
    HYLA_CODE_UNAUTHENTICATED = 16,
};

/* The gRPC code of the last libhyla call on this thread: HYLA_CODE_OK after a success,
 * HYLA_CODE_LOCAL when it failed before reaching gRPC. */
int hyla_client_last_code(void);
/* "UNAVAILABLE", "NOT_FOUND", ... ; "LOCAL" for HYLA_CODE_LOCAL. Static string. */
const char *hyla_client_code_name(int code);

/* ------------------------------------------------------------------------------------------ */
/* Sessions: plain result structs                                                              */

typedef enum {
    HYLA_TIER_UNKNOWN = 0,
    HYLA_TIER_GPU = 1,   /* resident in a worker's state pool */
    HYLA_TIER_HOST = 2,  /* evicted to host memory on its worker */
    HYLA_TIER_STORE = 3, /* only in the durable store */
} hyla_tier;

typedef enum {
    HYLA_SESSION_UNKNOWN = 0,
    HYLA_SESSION_ACTIVE = 1,
    HYLA_SESSION_PAUSED = 2,
    HYLA_SESSION_MOVING = 3,
    HYLA_SESSION_FAILED = 4,
} hyla_session_state;

typedef enum {
    HYLA_FINISH_NONE = 0,      /* the call did not finish (failed or cancelled) */
    HYLA_FINISH_LENGTH = 1,    /* max_tokens reached */
    HYLA_FINISH_STOP = 2,      /* a stop sequence or stop token */
    HYLA_FINISH_EOS = 3,       /* the model's end-of-sequence token */
} hyla_finish_reason;

/* "gpu", "host", "store", "unknown" etc. Static strings. */
const char *hyla_tier_name(hyla_tier t);
const char *hyla_session_state_name(hyla_session_state s);
const char *hyla_finish_reason_name(hyla_finish_reason r);

/* temperature <= 0: greedy; top_k <= 0: off; top_p <= 0 or >= 1: off. */
typedef struct {
    float temperature;
    int32_t top_k;
    float top_p;
} hyla_sampling_params;

typedef struct {
    uint64_t version;       /* 1, 2, ... ; 0 = no snapshot yet */
    uint64_t position;      /* tokens the snapshot covers */
    uint64_t state_bytes;   /* raw bytes of the state */
    uint64_t stored_bytes;  /* bytes the version occupies in the store (compressed) */
    uint64_t written_bytes; /* bytes written by this version alone */
    uint32_t chunks;        /* chunks written by this version */
    int64_t created_unix_ms;
} hyla_snapshot_summary;

/* A session as the coordinator describes it. Every string is non-NULL ("" when empty) and
 * owned by the struct: caller frees the contents with hyla_session_info_clear. */
typedef struct {
    char *id;               /* "s-" + 16 hex digits */
    char *tenant;
    char *model;
    hyla_session_state state;
    hyla_tier tier;
    char *group_id;         /* "" when paused */
    char **worker_ids;      /* [n_worker_ids], pipeline stage order */
    size_t n_worker_ids;
    uint64_t position;      /* tokens consumed by the model */
    uint64_t generated;     /* tokens sampled over the session's life */
    hyla_sampling_params sampling; /* current sampling parameters */
    uint64_t seed;
    hyla_snapshot_summary last_snapshot;
    char *parent_id;        /* fork: the parent session; "" otherwise */
    int64_t created_unix_ms;
    int64_t updated_unix_ms;
    char *error;            /* HYLA_SESSION_FAILED: why */
} hyla_session_info;

/* Free the contents and zero the struct. Accepts NULL and a zeroed struct. */
void hyla_session_info_clear(hyla_session_info *s);

typedef struct {
    hyla_session_info *items; /* [n] */
    size_t n;
} hyla_session_list;

/* Free every item and the array; zero the struct. Accepts NULL and a zeroed struct. */
void hyla_session_list_clear(hyla_session_list *l);

/* ------------------------------------------------------------------------------------------ */
/* Sessions: calls                                                                             */

typedef struct {
    const char *model;       /* NULL or "": the cluster's only model */
    int has_sampling;        /* 0: greedy defaults */
    hyla_sampling_params sampling;  /* the session's sampling defaults (when has_sampling) */
    uint64_t seed;           /* RNG seed */
    const char *worker_hint; /* NULL: least-loaded group; else place on this worker's group */
} hyla_create_params;

hyla_create_params hyla_create_default_params(void);

/* CreateSession. params: borrowed for the call (NULL: defaults). *out: caller frees with
 * hyla_session_info_clear; out->id is the new session's id. */
hyla_status hyla_client_create_session(hyla_client *c, const hyla_create_params *params,
                                       hyla_session_info *out);

/* Progress of an append, as the server last reported it plus what the client sent. */
typedef struct {
    uint64_t tokens_received;  /* tokens the server has received (after tokenization) */
    uint64_t tokens_ingested;  /* tokens fed to the model */
    uint64_t total_tokens;     /* expected total (server's, from the hints); 0 = unknown */
    double tokens_per_second;  /* the server's ingestion rate */
    uint64_t position;         /* session position after ingestion so far */
    int done;                  /* the server's last message: everything was ingested */
    uint64_t bytes_sent;       /* text bytes (or token ids * 4) the client has written */
    uint64_t total_bytes;      /* the document's size when known (0 = unknown, e.g. a pipe) */
    double elapsed_s;          /* since the call started */
} hyla_append_progress;

/* Called on the caller's thread each time the server reports progress (and once at the end
 * with done set). p: borrowed until return. Return 0 to go on, non-zero to cancel the append
 * (the call then returns HYLA_ERR_CANCELLED; what the server ingested so far stays ingested). */
typedef int (*hyla_append_progress_fn)(const hyla_append_progress *p, void *ud);

/* A text source for hyla_client_append_reader: fill buf with up to cap bytes; return the count,
 * 0 at the end of the document, -1 on error (after hyla_fail). Runs on a libhyla thread, one
 * call at a time. */
typedef ssize_t (*hyla_read_fn)(void *buf, size_t cap, void *ud);

typedef struct {
    uint64_t total_tokens_hint; /* expected size for progress (0 = unknown) */
    uint64_t total_bytes_hint;  /* expected text size (0: the text length when known) */
    int add_bos;                /* prepend BOS (only when the session is at position 0) */
    hyla_append_progress_fn progress;
    void *progress_ud;
} hyla_append_params;

hyla_append_params hyla_append_default_params(void);

/* Append (a bidi stream): text bytes are sent in chunks of params.append_chunk_bytes, progress
 * comes back through params->progress. text: borrowed for the call (len 0 allowed). The call
 * returns when the server has ingested everything. final (may be NULL): the last progress.
 * Errors: NOT_FOUND (session), PERMISSION_DENIED (another tenant's), RESOURCE_EXHAUSTED
 * (document over the server's limit), UNAVAILABLE, ... as hyla_status + detail. */
hyla_status hyla_client_append_text(hyla_client *c, const char *session_id, const void *text, size_t len,
                                    const hyla_append_params *params, hyla_append_progress *final);
/* The same with token ids. ids: borrowed for the call. */
hyla_status hyla_client_append_tokens(hyla_client *c, const char *session_id, const int32_t *ids, size_t n,
                                      const hyla_append_params *params, hyla_append_progress *final);
/* The same with text read from read(ud) until it returns 0 (a file, a pipe). If the call fails
 * while read is blocked, append returns after read returns. A read error ends the call with
 * read's status. */
hyla_status hyla_client_append_reader(hyla_client *c, const char *session_id, hyla_read_fn read, void *ud,
                                      const hyla_append_params *params, hyla_append_progress *final);

/* One message of a Generate stream: usually one token. */
typedef struct {
    const int32_t *token_ids; /* [n_token_ids] */
    size_t n_token_ids;
    const char *text;         /* their text (text_len bytes, not NUL-terminated; whole UTF-8
                                 characters: a character split over tokens comes with the
                                 piece of the token that completes it) */
    size_t text_len;
    uint64_t position;        /* session position after these tokens */
    uint32_t delivered;       /* tokens this call delivered before this piece */
} hyla_token_piece;

/* Called on the caller's thread for each piece. piece: borrowed until return. Return 0 to go on,
 * non-zero to stop (the call is cancelled; generate returns HYLA_ERR_CANCELLED). */
typedef int (*hyla_token_fn)(const hyla_token_piece *piece, void *ud);

typedef struct {
    uint32_t max_tokens;             /* >= 1 (default 128) */
    const char *const *stop;         /* [n_stop] stop sequences (text; the match is not delivered) */
    size_t n_stop;
    const int32_t *stop_token_ids;   /* [n_stop_token_ids] (the stop token is delivered) */
    size_t n_stop_token_ids;
    int has_sampling;                /* 1: sampling becomes the session's from now on */
    hyla_sampling_params sampling;
    int reseed;                      /* 1: re-seed the session's RNG with seed */
    uint64_t seed;
    int ignore_eos;                  /* 1: do not stop at the model's EOS */
    hyla_token_fn on_token;          /* may be NULL */
    void *ud;
} hyla_generate_params;

hyla_generate_params hyla_generate_default_params(void);

typedef struct {
    uint32_t delivered;            /* tokens this call delivered to on_token (client's count) */
    hyla_finish_reason finish;     /* HYLA_FINISH_NONE when the call did not complete */
    uint64_t position;             /* session position after the last piece (0: no piece) */
    int64_t server_delivered;      /* the server's count: from the last message, or from the
                                      x-hyla-tokens-delivered trailer of a failed call; -1 unknown */
    double elapsed_s;              /* the call's duration */
    double first_token_s;          /* time to the first piece; -1 if none */
} hyla_generate_result;

/* Generate (a server stream). params: borrowed for the call (NULL: defaults). result (may be
 * NULL) is filled on success and on failure. On UNAVAILABLE (the session's worker died or the
 * session was migrated mid-stream, or the coordinator is unreachable) result->delivered says how
 * many tokens arrived before the failure, and calling generate again continues the session:
 * right after those tokens when a migration interrupted it, from its last durable snapshot when
 * its worker died (hyla_client_get_session's position says where; decoding is deterministic, so
 * tokens after that snapshot come again identically). Tokens delivered before a CANCELLED or
 * DEADLINE_EXCEEDED stay in the session. INVALID_ARGUMENT names the field (max_tokens, ...). */
hyla_status hyla_client_generate(hyla_client *c, const char *session_id, const hyla_generate_params *params,
                                 hyla_generate_result *result);

/* Pause: write a durable snapshot and return once it is committed. evict: also drop the
 * worker's copy now. session, snapshot: may be NULL; *session: caller frees with
 * hyla_session_info_clear. */
hyla_status hyla_client_pause(hyla_client *c, const char *session_id, int evict, hyla_session_info *session,
                              hyla_snapshot_summary *snapshot);

/* Resume: place a paused session again; worker_hint (NULL or "": least loaded) prefers that
 * worker's group. *out (may be NULL): caller frees with hyla_session_info_clear. */
hyla_status hyla_client_resume(hyla_client *c, const char *session_id, const char *worker_hint,
                               hyla_session_info *out);

/* Resume from a kept version (ListSnapshots): rewind. version 0 is hyla_client_resume. The
 * version's state becomes the session's and is committed as a new head version; the later
 * versions stay in the store's history until retention drops them (docs/API.md, "Rewind").
 * *out (may be NULL): caller frees with hyla_session_info_clear. */
hyla_status hyla_client_resume_version(hyla_client *c, const char *session_id, const char *worker_hint,
                                       uint64_t version, hyla_session_info *out);

/* Migrate to to_worker's group, or (NULL or "") to any other group. session, snapshot,
 * from_group: may be NULL; *session: caller frees with hyla_session_info_clear; *from_group:
 * caller frees with free(). */
hyla_status hyla_client_migrate(hyla_client *c, const char *session_id, const char *to_worker,
                                hyla_session_info *session, hyla_snapshot_summary *snapshot, char **from_group);

typedef struct {
    int has_sampling;        /* 1: the fork's sampling; 0: the parent's */
    hyla_sampling_params sampling;
    int reseed;              /* 1: re-seed the fork's RNG with seed; 0: it continues the parent's
                                RNG stream (both continuations identical) */
    uint64_t seed;
    const char *worker_hint; /* NULL: anywhere */
    uint64_t version;        /* 0: the parent's current state; else a kept version of the parent
                                (ListSnapshots), with its own sampling and RNG (has_sampling and
                                reseed must then be 0) */
} hyla_fork_params;

hyla_fork_params hyla_fork_default_params(void);

/* Fork: a new session with a copy of this one's state. params may be NULL. *out: caller frees
 * with hyla_session_info_clear; out->id is the fork's id. */
hyla_status hyla_client_fork(hyla_client *c, const char *session_id, const hyla_fork_params *params,
                             hyla_session_info *out);

/* GetSession. *out: caller frees with hyla_session_info_clear. */
hyla_status hyla_client_get_session(hyla_client *c, const char *session_id, hyla_session_info *out);

/* ListSessions of this client's tenant, every page, ordered by id. model: filter (NULL: all).
 * *out: caller frees with hyla_session_list_clear. */
hyla_status hyla_client_list_sessions(hyla_client *c, const char *model, hyla_session_list *out);

/* One kept durable version of a session (ListSnapshots). */
typedef struct {
    uint64_t version;
    uint64_t position;        /* tokens the session had consumed */
    uint64_t generated;
    int64_t created_unix_ms;  /* commit time; 0: unknown */
    uint64_t state_bytes;     /* raw bytes of state */
    uint64_t stored_bytes;    /* encoded bytes of its chunks */
    int head;                 /* 1: the committed head */
} hyla_snapshot_version;

/* ListSnapshots: the versions the store keeps of a session, ascending by version (none yet:
 * *n = 0). *out: caller frees with free(). */
hyla_status hyla_client_list_snapshots(hyla_client *c, const char *session_id, hyla_snapshot_version **out,
                                       size_t *n);

/* Tokens read back from a session's token log (ReadTokens). */
typedef struct {
    int32_t *token_ids;       /* [n_tokens]: generated indices from_generated .. + n_tokens - 1 */
    size_t n_tokens;
    uint64_t from_generated;  /* as asked */
    uint64_t generated;       /* the session's Session.generated now */
    uint64_t first_available; /* the oldest generated index the log holds */
    char *text;               /* their text, NUL-terminated ("" without a tokenizer, or when read
                                 from the store: the ids are the exact record) */
    size_t text_len;
} hyla_read_result;

/* ReadTokens: up to max_tokens (0: the server's limit, 65536) generated tokens of the session
 * from generated index from_generated on; none when from_generated >= generated. A
 * from_generated below the log's first kept token fails HYLA_ERR_INVALID_ARG with
 * hyla_client_last_code() OUT_OF_RANGE, the message naming first_available. After an interrupted
 * Generate that delivered R tokens: if generated > R, read from R and append; if generated < R,
 * drop the last R - generated received (docs/API.md). *out: caller frees with
 * hyla_read_result_clear (also on failure). */
hyla_status hyla_client_read_tokens(hyla_client *c, const char *session_id, uint64_t from_generated, uint32_t max_tokens,
                                    hyla_read_result *out);
void hyla_read_result_clear(hyla_read_result *r); /* accepts NULL; leaves it empty */

/* DeleteSession: forget the session and its snapshots. snapshots_deleted may be NULL. */
hyla_status hyla_client_delete_session(hyla_client *c, const char *session_id, uint64_t *snapshots_deleted);

/* What an export wrote. */
typedef struct {
    uint64_t version;   /* the session's version the file holds */
    uint64_t position;  /* its position (tokens consumed) */
    uint64_t bytes;     /* bytes of the file */
    char model[128];    /* the session's model (NUL-terminated) */
} hyla_export_info;

/* ExportSession: write the session's portable snapshot file (docs/STATE_FORMAT.md §4) to out,
 * a stream open for writing (borrowed; not closed or flushed). version 0: the current state (an
 * active session commits it first, staying active); else a kept version (ListSnapshots). On
 * failure part of the file may have been written to out. info may be NULL. Deadline:
 * params.stream_timeout_ms. */
hyla_status hyla_client_export_session(hyla_client *c, const char *session_id, uint64_t version, FILE *out,
                                       hyla_export_info *info);
/* The same into the file at path, written as PATH.tmp.<pid>, fsync'ed and renamed over PATH:
 * on failure nothing at path changes. */
hyla_status hyla_client_export_session_file(hyla_client *c, const char *session_id, uint64_t version,
                                            const char *path, hyla_export_info *info);

/* ImportSession: a new session of this client's tenant from a portable snapshot file read from
 * in (borrowed; read to its end). session_id: the new session's id (NULL or "": the cluster
 * chooses one). worker_hint: NULL or "": any group. The server refuses a damaged file
 * (DATA_LOSS), a file of another model or one this build cannot read (FAILED_PRECONDITION), a
 * taken id (ALREADY_EXISTS), a file over its --max-import-bytes or a tenant over quota
 * (RESOURCE_EXHAUSTED); a refused import leaves nothing behind. *out (may be NULL): caller frees
 * with hyla_session_info_clear. */
hyla_status hyla_client_import_session(hyla_client *c, FILE *in, const char *session_id, const char *worker_hint,
                                       hyla_session_info *out);
/* The same from the file at path. */
hyla_status hyla_client_import_session_file(hyla_client *c, const char *path, const char *session_id,
                                            const char *worker_hint, hyla_session_info *out);

/* A model the cluster serves now (ListModels). */
typedef struct {
    char name[128];         /* NUL-terminated */
    uint64_t fingerprint;   /* what snapshot files of it record */
    uint32_t ready_workers; /* workers serving it that are not dead */
    uint32_t max_generate;  /* the largest max_tokens a Generate may ask on any of them (0: unknown) */
} hyla_model_info;

/* ListModels (any valid key, tenant or operator), ordered by name. *out: caller frees with
 * free(). */
hyla_status hyla_client_list_models(hyla_client *c, hyla_model_info **out, size_t *n);

/* ------------------------------------------------------------------------------------------ */
/* Cluster (operators)                                                                         */

typedef enum {
    HYLA_WORKER_UNKNOWN = 0,
    HYLA_WORKER_READY = 1,
    HYLA_WORKER_DRAINING = 2,
    HYLA_WORKER_DRAINED = 3,
    HYLA_WORKER_DEAD = 4,
} hyla_worker_state;

const char *hyla_worker_state_name(hyla_worker_state s);

/* A worker as of its last heartbeat. Strings non-NULL, owned by the struct. */
typedef struct {
    char *id;
    char *address;
    char *model;
    uint64_t model_fingerprint;
    uint32_t num_layers;        /* layers of the whole model */
    uint32_t layer_begin, layer_end; /* [begin, end) held by this worker */
    char *group_id;
    uint32_t stage;
    char *device;               /* "cpu", "cuda:0" */
    char *device_description;
    uint64_t memory_total_bytes, memory_free_bytes;
    uint64_t param_bytes;
    hyla_worker_state state;
    uint32_t sessions_gpu, sessions_host, active_calls;
    uint64_t state_bytes, state_budget_bytes;
    double tokens_per_second;
    uint32_t queued_tokens;
    int64_t registered_unix_ms, last_heartbeat_unix_ms;
    uint64_t epoch;
} hyla_worker_info;

typedef struct {
    char *id;
    char *model;
    char **worker_ids; /* [n_worker_ids], stage order */
    size_t n_worker_ids;
    int complete;      /* every layer is held by a live worker */
    uint32_t sessions;
} hyla_group_info;

typedef struct {
    hyla_worker_info *workers; /* [n_workers] */
    size_t n_workers;
    hyla_group_info *groups;   /* [n_groups] */
    size_t n_groups;
    uint64_t sessions_gpu, sessions_host, sessions_store; /* all tenants */
} hyla_cluster_status;

/* Free the contents and zero the struct. Accepts NULL and a zeroed struct. */
void hyla_cluster_status_clear(hyla_cluster_status *st);

/* ListWorkers + the session counts by tier of ListClusterSessions. *out: caller frees with
 * hyla_cluster_status_clear. */
hyla_status hyla_client_cluster_status(hyla_client *c, hyla_cluster_status *out);

/* ListClusterSessions (all tenants), every page. tier: HYLA_TIER_UNKNOWN = all; worker, tenant:
 * filters (NULL: all). *out: caller frees with hyla_session_list_clear. */
hyla_status hyla_client_cluster_sessions(hyla_client *c, hyla_tier tier, const char *worker, const char *tenant,
                                         hyla_session_list *out);

typedef struct {
    hyla_worker_state state;     /* the worker's state after the call */
    uint32_t sessions_moved;
    uint32_t sessions_remaining;
    char last_error[512];        /* why the worker's last handover failed, as it reported it;
                                    "" when none failed since its last success */
} hyla_drain_result;

/* DrainWorker: stop placing sessions on the worker and hand its sessions over. wait: return only
 * when it holds none (deadline: stream_timeout_ms). out may be NULL. */
hyla_status hyla_client_drain_worker(hyla_client *c, const char *worker_id, int wait, hyla_drain_result *out);

#ifdef __cplusplus
}
#endif
#endif
