/* hyla_rpc.h — the one gRPC pattern of every hyla binary: servers and clients over the gRPC C
 * core (<grpc/grpc.h>, completion queues) with protobuf-c messages.
 *
 * Purpose. The coordinator, the workers, the CLI and the tests all speak gRPC through this
 * module and nothing else. It owns the completion-queue event loops, the per-call state
 * machines, deadlines, cancellation, message size limits, status codes and shutdown, so a
 * service only writes handlers and a client only writes calls.
 *
 * Server model (event-driven, never blocks the loop). A server runs N completion-queue threads.
 * Each accepted call gets a context driven by completion tags (recv, send, close). The method's
 * handler sees the call as a sequence of events, never two at once for one call:
 *
 *     START       once, first. Unary and server-streaming methods: msg = the decoded request.
 *                 Client-streaming and bidi methods: msg = NULL.
 *     MESSAGE     client-streaming / bidi: one decoded request message (in order).
 *     HALF_CLOSE  client-streaming / bidi: the client sent its last message.
 *     DONE        once, last: the call is over for gRPC (status sent, or cancelled: client
 *                 cancel, deadline, transport failure, server shutdown, malformed message).
 *                 hyla_rpc_call_cancelled() says which.
 *
 * msg is borrowed until the handler returns (copy what you keep). Handlers run on the loop's
 * threads and must not block for long; slow work goes to your own threads, which may call
 * hyla_rpc_call_send / _reply / _fail at any time. Every START is matched by exactly one
 * hyla_rpc_call_reply or hyla_rpc_call_fail (also after DONE: it then sends nothing); that call
 * releases the handler's hold on the call, which stays valid until then. Sends are queued and
 * never block; the queue drains as gRPC flow control allows (hyla_rpc_call_queued tells its
 * depth, for back-pressure). A request that does not decode never reaches the handler: the
 * client gets INVALID_ARGUMENT naming the message type, and the server keeps serving. Unknown
 * methods get UNIMPLEMENTED. Messages above the configured limit get RESOURCE_EXHAUSTED.
 *
 * Client model. A client is a channel plus one completion-queue thread. A stream is one call of
 * any kind: write requests (queued; blocks only when max_queued_writes are pending, and never on
 * a loop thread), close_send, read responses (blocking; or delivered to a callback with
 * hyla_rpc_stream_open_async), finish (the final status). hyla_rpc_client_unary wraps that for
 * unary calls. Deadlines and the tenant come with hyla_rpc_call_opts; a call whose opts.metadata
 * has its own "authorization" pair sends that instead of the client's bearer (a gateway
 * forwarding its caller's key).
 *
 * Status codes. hyla_rpc_code has the canonical gRPC values (so no gRPC header leaks out of
 * this module). hyla_rpc_code_from_status / hyla_rpc_status_from_code are the one mapping
 * between hyla_status and gRPC codes; docs/API.md lists it.
 *
 * Threading. Servers, clients and streams are thread-safe unless a function says otherwise.
 * Blocking stream functions (read, finish, write when the queue is full) must not be called
 * from a loop thread (a handler or a stream callback): that is a programmer error (asserted).
 *
 * Transport. HTTP/2, insecure by default; TLS (and mutual TLS) for every listener and channel
 * of the process once hyla_rpc_set_security names certificates.
 *
 * Authentication. A server given a verifier (hyla_rpc_server_set_auth) checks every call before
 * its handler runs: the bearer key of the `authorization` metadata is mapped to a principal
 * (tenant, cluster or operator) and compared with the policy of the method's service
 * (hyla_rpc_server_set_policy). A call without a valid key ends UNAUTHENTICATED, a valid key of
 * the wrong kind PERMISSION_DENIED; handlers read the principal (hyla_rpc_call_principal), never
 * a header. Clients send the process's bearer (hyla_rpc_set_security) unless their params or the
 * call's opts name another. */
#ifndef HYLA_RPC_H
#define HYLA_RPC_H

#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "hyla_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------ */
/* Status codes                                                                                */

/* The canonical gRPC status codes (same numbers as grpc_status_code). */
typedef enum {
    HYLA_RPC_OK = 0,
    HYLA_RPC_CANCELLED = 1,
    HYLA_RPC_UNKNOWN = 2,
    HYLA_RPC_INVALID_ARGUMENT = 3,
    HYLA_RPC_DEADLINE_EXCEEDED = 4,
    HYLA_RPC_NOT_FOUND = 5,
    HYLA_RPC_ALREADY_EXISTS = 6,
    HYLA_RPC_PERMISSION_DENIED = 7,
    HYLA_RPC_RESOURCE_EXHAUSTED = 8,
    HYLA_RPC_FAILED_PRECONDITION = 9,
    HYLA_RPC_ABORTED = 10,
    HYLA_RPC_OUT_OF_RANGE = 11,
    HYLA_RPC_UNIMPLEMENTED = 12,
    HYLA_RPC_INTERNAL = 13,
    HYLA_RPC_UNAVAILABLE = 14,
    HYLA_RPC_DATA_LOSS = 15,
    HYLA_RPC_UNAUTHENTICATED = 16,
    HYLA_RPC_CODE_COUNT
} hyla_rpc_code;

/* "NOT_FOUND", ... (static string; "UNKNOWN_CODE" outside the range). */
const char *hyla_rpc_code_name(hyla_rpc_code code);
/* The gRPC code a server sends for a hyla_status (docs/API.md, "Status codes"). */
hyla_rpc_code hyla_rpc_code_from_status(hyla_status s);
/* The hyla_status a client reports for a gRPC code. */
hyla_status hyla_rpc_status_from_code(hyla_rpc_code code);

/* The outcome of a call as the client saw it. */
typedef struct {
    hyla_rpc_code code;
    char message[1024]; /* the status message (truncated), "" if none */
} hyla_rpc_result;

/* Request and response shapes. Values are bit flags: 1 = request stream, 2 = response stream. */
typedef enum {
    HYLA_RPC_UNARY = 0,
    HYLA_RPC_CLIENT_STREAM = 1,
    HYLA_RPC_SERVER_STREAM = 2,
    HYLA_RPC_BIDI = 3,
} hyla_rpc_kind;

/* Decode len bytes as a desc message, the way servers and clients of this module do: what
 * protobuf-c accepts but could not encode again (unknown fields numbered 0, which protobuf-c
 * reads from over-long tag varints) is refused too. Fails with HYLA_ERR_FORMAT naming the type.
 * *out: caller frees with protobuf_c_message_free_unpacked(*out, NULL). Thread-safe. */
hyla_status hyla_rpc_unpack(const ProtobufCMessageDescriptor *desc, const void *data, size_t len,
                            ProtobufCMessage **out);

/* A deep copy of m (packed and unpacked again): for requests a handler hands to another
 * thread. Caller frees with protobuf_c_message_free_unpacked(copy, NULL). Aborts only when out
 * of memory. */
ProtobufCMessage *hyla_rpc_message_dup(const ProtobufCMessage *m);

/* Metadata key of the tenant on public calls (docs/API.md). */
#define HYLA_RPC_TENANT_KEY "x-hyla-tenant"
/* Metadata key of the bearer key ("Bearer KEY"). */
#define HYLA_RPC_AUTH_KEY "authorization"
/* Longest key or principal name accepted, bytes with the NUL. */
#define HYLA_RPC_KEY_MAX 160
#define HYLA_RPC_PRINCIPAL_MAX 64

/* ------------------------------------------------------------------------------------------ */
/* Security of the process: TLS and the default bearer                                         */

typedef struct {
    const char *bearer;       /* sent on calls of clients that name none; NULL: none */
    const char *tls_cert;     /* PEM file: this process's certificate chain (servers; and clients
                                 for mutual TLS); NULL: no TLS */
    const char *tls_key;      /* PEM file: its private key */
    const char *tls_ca;       /* PEM file: CA that clients verify servers with (and servers verify
                                 client certificates with); NULL: the system's roots */
    int tls_client;           /* clients use TLS (set when any tls_* is given) */
    int tls_require_client_cert; /* servers refuse TLS clients without a certificate of tls_ca */
} hyla_rpc_security;

/* Set the process's security for servers and clients created afterwards: files are read now
 * (HYLA_ERR_IO naming a file that cannot be read). Call once at start-up, before any server or
 * client exists; sec is copied. Not thread-safe with server/client creation. */
hyla_status hyla_rpc_set_security(const hyla_rpc_security *sec);
/* Whether listeners of this process use TLS. */
int hyla_rpc_tls_enabled(void);

/* ------------------------------------------------------------------------------------------ */
/* Server                                                                                      */

typedef struct hyla_rpc_server hyla_rpc_server;
typedef struct hyla_rpc_call hyla_rpc_call;

typedef struct {
    int threads;           /* completion-queue threads (default 2) */
    int max_message_bytes; /* largest message received or sent, bytes (default 16 MiB) */
    int shutdown_grace_ms; /* shutdown lets calls run this long, then cancels them (default 2000) */
    int accept_depth;      /* calls requested from gRPC ahead of arrival (default 16) */
} hyla_rpc_server_params;

hyla_rpc_server_params hyla_rpc_server_default_params(void);

typedef enum {
    HYLA_RPC_EV_START = 0,
    HYLA_RPC_EV_MESSAGE = 1,
    HYLA_RPC_EV_HALF_CLOSE = 2,
    HYLA_RPC_EV_DONE = 3,
} hyla_rpc_event;

/* A method's handler (see "Server model" above). msg: borrowed until return, NULL except for
 * START of unary / server-streaming methods and MESSAGE. ud: as given to add_method. */
typedef void (*hyla_rpc_handler)(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *msg,
                                 void *ud);

/* A server with no methods and no ports. Caller frees with hyla_rpc_server_destroy.
 * params may be NULL (defaults). */
hyla_status hyla_rpc_server_create(const hyla_rpc_server_params *params, hyla_rpc_server **out);

/* Register a method before start. path: "/package.Service/Method" (copied). req/resp: the
 * protobuf-c descriptors of the request and response messages (static data). Fails with
 * HYLA_ERR_EXISTS for a path registered twice, HYLA_ERR_INVALID_ARG after start. */
hyla_status hyla_rpc_server_add_method(hyla_rpc_server *s, const char *path, hyla_rpc_kind kind,
                                       const ProtobufCMessageDescriptor *req,
                                       const ProtobufCMessageDescriptor *resp, hyla_rpc_handler fn,
                                       void *ud);

/* Listen on addr ("127.0.0.1:0", "0.0.0.0:7000", "[::1]:7000", "unix:/path") before start,
 * with TLS when the process has a certificate (hyla_rpc_set_security), else insecure. *port (may be NULL) receives the bound TCP port (the chosen one for port 0).
 * Fails with HYLA_ERR_IO naming the address when it cannot bind. May be called more than once. */
hyla_status hyla_rpc_server_listen(hyla_rpc_server *s, const char *addr, int *port);

/* Start serving: the loop threads start and calls are accepted. */
hyla_status hyla_rpc_server_start(hyla_rpc_server *s);

/* Stop accepting calls; let calls in flight run for shutdown_grace_ms, then cancel them (their
 * handlers see DONE with cancelled set and must still reply or fail); wait until every call is
 * released, then stop the loop threads. Idempotent; blocks; not from a loop thread. */
void hyla_rpc_server_shutdown(hyla_rpc_server *s);

/* Shut down if needed, then free. Accepts NULL. */
void hyla_rpc_server_destroy(hyla_rpc_server *s);

/* Who called (set by the server's verifier). */
typedef enum {
    HYLA_RPC_PRINCIPAL_NONE = 0,     /* no authentication configured on the server */
    HYLA_RPC_PRINCIPAL_TENANT = 1,   /* a tenant's API key: name = the tenant */
    HYLA_RPC_PRINCIPAL_CLUSTER = 2,  /* the cluster credential (workers, stages) */
    HYLA_RPC_PRINCIPAL_OPERATOR = 3, /* the operator key */
} hyla_rpc_principal_kind;

typedef struct {
    hyla_rpc_principal_kind kind;
    char name[HYLA_RPC_PRINCIPAL_MAX]; /* tenant, or "cluster" / "operator" */
    char key_id[32];                   /* the key's id when a tenant key ("" otherwise) */
} hyla_rpc_principal;

/* Who may call the methods of a service. */
typedef enum {
    HYLA_RPC_POLICY_TENANT = 0,   /* a tenant key (the public API) */
    HYLA_RPC_POLICY_CLUSTER = 1,  /* the cluster credential or the operator key (internal services) */
    HYLA_RPC_POLICY_OPERATOR = 2, /* the operator key only */
    HYLA_RPC_POLICY_ANY = 3,      /* any valid key: tenant, cluster or operator (read-only listings
                                     every caller may see, e.g. the models served) */
} hyla_rpc_policy;

/* A verifier: map a bearer key to a principal. Returns 1 and fills *out for a valid key, 0 for
 * an unknown or revoked one. Runs on loop threads for every call: memory only, thread-safe. */
typedef int (*hyla_rpc_verify_fn)(void *ud, const char *key, hyla_rpc_principal *out);

/* Turn authentication on, before start: every call is verified by fn (ud borrowed for the
 * server's life) and checked against its service's policy. */
hyla_status hyla_rpc_server_set_auth(hyla_rpc_server *s, hyla_rpc_verify_fn fn, void *ud);
/* Turn authentication on with a built-in verifier that accepts fixed keys (servers without a key
 * table: workers, a standalone statestore): key (copied) authenticates as kind. Up to 4 keys;
 * not with hyla_rpc_server_set_auth. Before start. */
hyla_status hyla_rpc_server_accept_key(hyla_rpc_server *s, const char *key, hyla_rpc_principal_kind kind);
/* The policy of methods whose path starts with path_prefix ("/hyla.v1.Sessions/"), before
 * start; the longest matching prefix wins; methods without one get HYLA_RPC_POLICY_CLUSTER.
 * At most 16 prefixes (copied). */
hyla_status hyla_rpc_server_set_policy(hyla_rpc_server *s, const char *path_prefix, hyla_rpc_policy policy);

/* Run fn(arg) once in hyla_rpc_server_destroy, after every call ended and the loop threads
 * stopped, in reverse order of registration: for method user data that lives as long as the
 * server (takes ownership of arg through fn). At most 16. */
hyla_status hyla_rpc_server_add_cleanup(hyla_rpc_server *s, void (*fn)(void *), void *arg);

/* Observer of finished calls (metrics): fn(method, code, seconds, ud) runs once per accepted
 * call when its context is freed, on a loop thread or the thread that released it last; must
 * not block. method is the registered path, or "unknown" for an unregistered one; code is
 * CANCELLED for a call that ended without a status. Set before start; ud borrowed until
 * destroy. */
typedef void (*hyla_rpc_observer)(const char *method, hyla_rpc_code code, double seconds, void *ud);
void hyla_rpc_server_set_observer(hyla_rpc_server *s, hyla_rpc_observer fn, void *ud);

/* Calls accepted and not yet released (diagnostics and tests). */
int hyla_rpc_server_live_calls(hyla_rpc_server *s);

/* ---- a server call (valid from START until the handler's reply/fail returns) ---- */

/* Queue a response message (server-streaming / bidi; also allowed before the final reply of
 * other kinds for symmetry, though a unary client reads only the first). The message is packed
 * at once: the caller keeps ownership of msg. Never blocks. Fails with HYLA_ERR_CANCELLED once the
 * call is over or finished, HYLA_ERR_RESOURCE when the packed size exceeds max_message_bytes. */
hyla_status hyla_rpc_call_send(hyla_rpc_call *call, const ProtobufCMessage *msg);

/* Finish with OK after queueing resp (the unary / client-streaming response; NULL for streaming
 * responses that are complete). Releases the handler's hold: the call must not be used after. */
void hyla_rpc_call_reply(hyla_rpc_call *call, const ProtobufCMessage *resp);

/* Finish with a non-OK code and a message naming the field, object or limit (printf format).
 * Messages already queued are sent first. Releases the handler's hold. */
void hyla_rpc_call_fail(hyla_rpc_call *call, hyla_rpc_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Finish with the code of a hyla_status (hyla_rpc_code_from_status) and detail as the message
 * (usually hyla_last_error()). Releases the handler's hold. */
void hyla_rpc_call_fail_status(hyla_rpc_call *call, hyla_status s, const char *detail);

/* Add a trailing metadata pair to the final status (copied; at most 8; before reply/fail). */
hyla_status hyla_rpc_call_set_trailer(hyla_rpc_call *call, const char *key, const char *value);

/* Client-streaming / bidi flow control: after read_hold (typically inside MESSAGE) no further
 * MESSAGE or HALF_CLOSE is delivered until read_resume. Either may be called from any thread. */
void hyla_rpc_call_read_hold(hyla_rpc_call *call);
void hyla_rpc_call_read_resume(hyla_rpc_call *call);

/* Non-zero once the call can no longer succeed: client cancelled, deadline passed, transport
 * failed, server shutdown, or this layer failed it (malformed message). */
int hyla_rpc_call_cancelled(hyla_rpc_call *call);

/* Milliseconds left before the client's deadline; -1 when the call has none. */
int64_t hyla_rpc_call_deadline_ms(hyla_rpc_call *call);

/* "/package.Service/Method". Borrowed for the life of the call. */
const char *hyla_rpc_call_method(hyla_rpc_call *call);

/* The authenticated caller, or NULL when the server has no verifier. Borrowed for the life of
 * the call. */
const hyla_rpc_principal *hyla_rpc_call_principal(hyla_rpc_call *call);

/* Value of request metadata key (lower-case), or NULL. Borrowed for the life of the call. */
const char *hyla_rpc_call_metadata(hyla_rpc_call *call, const char *key);

/* Response messages queued and not yet accepted by gRPC flow control. */
size_t hyla_rpc_call_queued(hyla_rpc_call *call);
/* The server's max_message_bytes (what this call may send). */
int hyla_rpc_call_max_message(const hyla_rpc_call *call);

/* Per-call user data. free_fn (may be NULL) runs once when the call context is freed (after
 * DONE and after the handler's reply/fail), on whichever thread releases it last. */
void hyla_rpc_call_set_user(hyla_rpc_call *call, void *user, void (*free_fn)(void *));
void *hyla_rpc_call_user(hyla_rpc_call *call);

/* ------------------------------------------------------------------------------------------ */
/* Client                                                                                      */

typedef struct hyla_rpc_client hyla_rpc_client;
typedef struct hyla_rpc_stream hyla_rpc_stream;

typedef struct {
    int max_message_bytes; /* largest message sent or received, bytes (default 16 MiB) */
    int max_queued_writes; /* stream_write blocks while this many are pending (default 16) */
    int max_queued_reads;  /* responses buffered before reading pauses (default 16) */
    const char *bearer;    /* key sent on every call (copied); NULL: the process's
                              (hyla_rpc_set_security); "": none */
    const char *tls_ca;    /* PEM file: this client uses TLS and verifies the server with this CA;
                              NULL: the process's setting (hyla_rpc_set_security) */
} hyla_rpc_client_params;

hyla_rpc_client_params hyla_rpc_client_default_params(void);

typedef struct {
    int64_t timeout_ms;          /* deadline relative to the call's start; <= 0: none */
    const char *tenant;          /* sent as x-hyla-tenant; NULL: not sent */
    const char *const *metadata; /* more pairs: key, value, key, value, ..., NULL; or NULL */
    int wait_for_ready;          /* queue the call while the server is unreachable (until the
                                    deadline) instead of failing with UNAVAILABLE at once */
} hyla_rpc_call_opts;

/* A client of target ("127.0.0.1:7000", "unix:/path", any gRPC target string); connects lazily.
 * params may be NULL. Caller frees with hyla_rpc_client_destroy. */
hyla_status hyla_rpc_client_create(const char *target, const hyla_rpc_client_params *params,
                                   hyla_rpc_client **out);
/* The client's max_message_bytes (the largest message it sends or receives). */
int hyla_rpc_client_max_message(const hyla_rpc_client *c);

/* Free the client. Every stream must have been destroyed (asserted). Accepts NULL. */
void hyla_rpc_client_destroy(hyla_rpc_client *c);

/* One unary call. req: borrowed for the call. *resp: the decoded response of type resp_desc;
 * caller frees with protobuf_c_message_free_unpacked(*resp, NULL); NULL on failure. opts and res
 * may be NULL. Returns hyla_rpc_status_from_code(res->code), with a detail message naming the
 * method, the code and the server's message. */
hyla_status hyla_rpc_client_unary(hyla_rpc_client *c, const char *method, const ProtobufCMessage *req,
                                  const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **resp,
                                  const hyla_rpc_call_opts *opts, hyla_rpc_result *res);

/* Start a call of any kind whose responses are read with hyla_rpc_stream_read. method and opts
 * are copied. Caller frees with hyla_rpc_stream_destroy. */
hyla_status hyla_rpc_stream_open(hyla_rpc_client *c, const char *method,
                                 const ProtobufCMessageDescriptor *resp_desc,
                                 const hyla_rpc_call_opts *opts, hyla_rpc_stream **out);

/* Stream callback: msg is a response (borrowed until return), or NULL once, last, when the call
 * is over (hyla_rpc_stream_result then tells the outcome). Runs on the client's loop thread;
 * must not block. */
typedef void (*hyla_rpc_stream_fn)(hyla_rpc_stream *s, const ProtobufCMessage *msg, void *ud);

/* Like hyla_rpc_stream_open, but responses go to fn instead of a read queue. fn is not called
 * after hyla_rpc_stream_destroy returns. Caller frees with hyla_rpc_stream_destroy. */
hyla_status hyla_rpc_stream_open_async(hyla_rpc_client *c, const char *method,
                                       const ProtobufCMessageDescriptor *resp_desc,
                                       const hyla_rpc_call_opts *opts, hyla_rpc_stream_fn fn, void *ud,
                                       hyla_rpc_stream **out);

/* Queue a request message (packed at once: the caller keeps msg). Blocks while
 * max_queued_writes are pending (except on a loop thread). Fails with HYLA_ERR_RESOURCE when the
 * packed size exceeds max_message_bytes, with HYLA_ERR_INVALID_ARG after close_send, and with
 * the call's status once the call is over. */
hyla_status hyla_rpc_stream_write(hyla_rpc_stream *s, const ProtobufCMessage *msg);
/* The same with bytes sent as they are (relays, and tests of malformed input). data is copied. */
hyla_status hyla_rpc_stream_write_raw(hyla_rpc_stream *s, const void *data, size_t len);

/* No more requests (half-close), after the queued ones. Idempotent. */
hyla_status hyla_rpc_stream_close_send(hyla_rpc_stream *s);

/* Next response. *out: a decoded message of resp_desc, caller frees with
 * protobuf_c_message_free_unpacked(*out, NULL); or NULL at the end of the stream, where the
 * return value is the call's final status (HYLA_OK when the server finished with OK). A response
 * that does not decode cancels the call and returns HYLA_ERR_FORMAT. Blocks. Not for async
 * streams. */
hyla_status hyla_rpc_stream_read(hyla_rpc_stream *s, ProtobufCMessage **out);

/* Half-close if not done, discard unread responses, wait for the final status. res may be NULL.
 * Returns hyla_rpc_status_from_code(code) with a detail message. Blocks. */
hyla_status hyla_rpc_stream_finish(hyla_rpc_stream *s, hyla_rpc_result *res);

/* Cancel the call (the server's handler sees DONE with cancelled set). Never blocks. */
void hyla_rpc_stream_cancel(hyla_rpc_stream *s);

/* Whether the call is over and, if so, its outcome in *res (may be NULL). Never blocks. */
int hyla_rpc_stream_result(hyla_rpc_stream *s, hyla_rpc_result *res);

/* Value of a trailing metadata key of the final status, or NULL (also before the end).
 * Borrowed until hyla_rpc_stream_destroy. */
const char *hyla_rpc_stream_trailer(hyla_rpc_stream *s, const char *key);

/* Cancel if not over, wait for a callback in progress (unless called from it), free. Accepts
 * NULL. */
void hyla_rpc_stream_destroy(hyla_rpc_stream *s);

#ifdef __cplusplus
}
#endif
#endif
