/* hyla_rpc_server.c — the server half of hyla_rpc.h: a completion-queue event loop on N threads
 * and one context per accepted call, driven by completion tags.
 *
 * Per-call state machine. A context is created for each grpc_server_request_call (ACCEPT tag).
 * When a call arrives it posts RECV_CLOSE_ON_SERVER (CLOSE tag) at once, then either reads the
 * one request (unary / server-streaming: RECV tag, START after it decodes) or delivers START
 * and keeps one RECV in flight (client-streaming / bidi). Sends go through a queue with at most
 * one SEND batch in flight (messages, then the status once the handler finished and the queue
 * is empty). The CLOSE completion ends the call for gRPC and delivers DONE.
 *
 * Invariants.
 *   - refs counts every batch in flight, the handler's hold (START .. reply/fail) and the loop
 *     thread working on the context; the context is freed when it drops to zero.
 *   - At most one batch per tag is in flight; all batches are started under c->mu.
 *   - Events of one call never overlap: in_handler marks a handler running; a DONE that
 *     arrives meanwhile is delivered when it returns (done_pending). MESSAGE cannot overlap
 *     another MESSAGE because the next RECV is posted only after the handler returned.
 *   - After DONE, no event. After the final status is decided (finishing), no MESSAGE.
 *
 * Threading. Loop threads run every completion and every handler. hyla_rpc_call_* functions
 * may be called from any thread while the caller holds the call (START .. reply/fail).
 * Lock order: a call's mu, then the server's mu (only for counters). */
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <grpc/grpc_security.h>

#include "hyla_log.h"
#include "hyla_rpc_impl.h"
#include "hyla_thread.h"
#include "hyla_util.h"

#define RPC_MAX_TRAILERS 8

typedef struct {
    char *path;
    hyla_rpc_kind kind;
    const ProtobufCMessageDescriptor *req, *resp;
    hyla_rpc_handler fn;
    void *ud;
} rpc_method;

struct hyla_rpc_server {
    rpc_tag t_shutdown;
    hyla_rpc_server_params p;
    grpc_server *srv;
    grpc_completion_queue *cq;
    pthread_t *threads;
    int n_threads;
    rpc_method *methods;
    int n_methods, cap_methods;
    int n_ports;
    hyla_rpc_verify_fn verify; /* NULL: no authentication */
    void *verify_ud;
    struct {
        char *prefix;
        hyla_rpc_policy policy;
    } policies[16];
    int n_policies;
    struct {
        char *key;
        hyla_rpc_principal_kind kind;
    } fixed[4]; /* hyla_rpc_server_accept_key */
    int n_fixed;

    pthread_mutex_t mu;
    pthread_cond_t cv; /* monotonic clock */
    int started, shutting_down, shutdown_tag_seen, shut_down;
    int live_calls;      /* contexts allocated (pending accepts included) */
    int accepts_pending; /* request_call posted, not completed */
    struct {
        void (*fn)(void *);
        void *arg;
    } cleanups[16];
    int n_cleanups;
    hyla_rpc_observer obs;
    void *obs_ud;
};

struct hyla_rpc_call {
    rpc_tag t_accept, t_recv, t_send, t_close;
    hyla_rpc_server *srv;
    const rpc_method *m; /* NULL: unknown method */
    grpc_call *call;
    grpc_call_details details;
    grpc_metadata_array req_md;
    char *path;
    rpc_kv *md;
    size_t n_md;
    hyla_rpc_principal principal;

    pthread_mutex_t mu;
    int refs;

    /* receive side */
    grpc_byte_buffer *recv_bb;
    int recv_inflight, recv_eof, read_hold;

    /* send side */
    rpc_out *q_head, *q_tail;
    size_t q_len;
    int send_inflight, send_is_status, initial_md_sent;
    int finishing;      /* the final status is decided */
    int status_started; /* the status batch was started */
    int broken;         /* a send failed: the call is dead for sending */
    hyla_rpc_code code;
    char *status_msg;
    rpc_kv trailers[RPC_MAX_TRAILERS];
    size_t n_trailers;
    grpc_metadata trailer_md[RPC_MAX_TRAILERS];

    /* lifecycle */
    int close_cancelled; /* out parameter of RECV_CLOSE_ON_SERVER */
    int closed;          /* RECV_CLOSE_ON_SERVER completed */
    int cancelled;       /* what hyla_rpc_call_cancelled reports */
    int started;         /* START delivered (or being delivered) */
    int user_hold;       /* the handler holds the call */
    int in_handler, done_pending, done_delivered;

    void *user;
    void (*user_free)(void *);
    double t0; /* accepted at (hyla_now), for the observer */
};

hyla_rpc_server_params hyla_rpc_server_default_params(void) {
    hyla_rpc_server_params p;
    memset(&p, 0, sizeof p);
    p.threads = 2;
    p.max_message_bytes = 16 << 20;
    p.shutdown_grace_ms = 2000;
    p.accept_depth = 16;
    return p;
}

/* ---------------------------------------------------------------------------------------- */
/* call contexts                                                                             */

static void call_free(hyla_rpc_call *c) {
    hyla_rpc_server *srv = c->srv;
    if (srv->obs && c->path)
        srv->obs(c->m ? c->path : "unknown", c->finishing ? c->code : HYLA_RPC_CANCELLED, hyla_now() - c->t0,
                 srv->obs_ud);
    if (c->user_free)
        c->user_free(c->user);
    if (c->recv_bb)
        grpc_byte_buffer_destroy(c->recv_bb);
    rpc_out_free_all(&c->q_head, &c->q_tail, &c->q_len);
    if (c->call)
        grpc_call_unref(c->call);
    grpc_call_details_destroy(&c->details);
    grpc_metadata_array_destroy(&c->req_md);
    rpc_kv_free(c->md, c->n_md);
    rpc_kv_clear(c->trailers, c->n_trailers);
    free(c->path);
    free(c->status_msg);
    pthread_mutex_destroy(&c->mu);
    free(c);
    hyla_count_down(&srv->mu, &srv->cv, &srv->live_calls);
}

/* Drop a reference taken under c->mu; frees the context at zero. Called with c->mu held;
 * returns with it released. */
static void call_unref_unlock(hyla_rpc_call *c) {
    HYLA_ASSERT(c->refs > 0);
    int last = --c->refs == 0;
    pthread_mutex_unlock(&c->mu);
    if (last)
        call_free(c);
}

static const char *call_name(const hyla_rpc_call *c) { return c->path ? c->path : "(call)"; }

/* Drop queued messages that are not in flight (the head is in flight when a message batch is). */
static void drop_unsent_locked(hyla_rpc_call *c) {
    if (c->send_inflight && !c->send_is_status && c->q_head) {
        rpc_out_free_after_head(&c->q_head, &c->q_tail, &c->q_len);
    } else if (!c->send_inflight || c->send_is_status) {
        rpc_out_free_all(&c->q_head, &c->q_tail, &c->q_len);
    }
}

/* Start the next send batch if none is in flight: a queued message, else the final status. */
static void kick_send_locked(hyla_rpc_call *c) {
    if (c->send_inflight || c->broken || c->closed)
        return;
    grpc_op ops[2];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    if (!c->initial_md_sent) {
        ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
        ops[n].data.send_initial_metadata.count = 0;
        n++;
    }
    grpc_slice details = grpc_empty_slice();
    int have_details = 0;
    if (c->q_head) {
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n].data.send_message.send_message = c->q_head->bb;
        n++;
        c->send_is_status = 0;
    } else if (c->finishing && !c->status_started) {
        for (size_t i = 0; i < c->n_trailers; i++) {
            c->trailer_md[i].key = grpc_slice_from_static_string(c->trailers[i].key);
            c->trailer_md[i].value = grpc_slice_from_static_string(c->trailers[i].value);
        }
        details = grpc_slice_from_copied_string(c->status_msg ? c->status_msg : "");
        have_details = 1;
        ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
        ops[n].data.send_status_from_server.status = (grpc_status_code)c->code;
        ops[n].data.send_status_from_server.status_details = &details;
        ops[n].data.send_status_from_server.trailing_metadata_count = c->n_trailers;
        ops[n].data.send_status_from_server.trailing_metadata = c->n_trailers ? c->trailer_md : NULL;
        n++;
        c->send_is_status = 1;
        c->status_started = 1;
    } else {
        return;
    }
    c->initial_md_sent = 1;
    c->send_inflight = 1;
    c->refs++;
    if (rpc_start_batch(c->call, ops, n, &c->t_send, c->send_is_status ? "send status" : "send message")) {
        c->send_inflight = 0;
        c->refs--; /* the caller holds another reference */
        c->broken = 1;
        rpc_out_free_all(&c->q_head, &c->q_tail, &c->q_len);
    }
    if (have_details)
        grpc_slice_unref(details);
}

/* Decide the final status (once); last, if not NULL, is queued before it (takes ownership). */
static void finish_locked(hyla_rpc_call *c, hyla_rpc_code code, const char *msg, grpc_byte_buffer *last) {
    if (c->finishing || c->closed) {
        if (last)
            grpc_byte_buffer_destroy(last);
        return;
    }
    c->finishing = 1;
    c->code = code;
    c->status_msg = strdup(msg ? msg : "");
    HYLA_ASSERT(c->status_msg);
    if (last)
        rpc_out_push(&c->q_head, &c->q_tail, &c->q_len, last);
    if (code != HYLA_RPC_OK)
        HYLA_DEBUG("rpc: %s -> %s: %s", call_name(c), hyla_rpc_code_name(code), c->status_msg);
    kick_send_locked(c);
}

/* This layer fails the call (malformed input): unsent messages are dropped, the handler (if it
 * started) sees cancelled and gets DONE when the status is out. */
static void abort_locked(hyla_rpc_call *c, hyla_rpc_code code, const char *msg) {
    c->cancelled = 1;
    if (!c->finishing)
        drop_unsent_locked(c);
    finish_locked(c, code, msg, NULL);
}

static void post_recv_locked(hyla_rpc_call *c) {
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &c->recv_bb;
    c->recv_inflight = 1;
    c->refs++;
    if (rpc_start_batch(c->call, &op, 1, &c->t_recv, "recv message")) {
        c->recv_inflight = 0;
        c->refs--;
        c->recv_eof = 1;
    }
}

static void maybe_post_recv_locked(hyla_rpc_call *c) {
    if (c->m && (c->m->kind & HYLA_RPC_CLIENT_STREAM) && c->started && !c->recv_inflight && !c->recv_eof &&
        !c->read_hold && !c->in_handler && !c->closed && !c->finishing && !c->done_delivered)
        post_recv_locked(c);
}

/* Run the handler for one event. Called with c->mu held, no handler running, and a reference
 * held by the caller; returns with c->mu held. Delivers a DONE that arrived meanwhile. */
static void dispatch_locked(hyla_rpc_call *c, hyla_rpc_event ev, const ProtobufCMessage *msg) {
    HYLA_ASSERT(!c->in_handler);
    c->in_handler = 1;
    if (ev == HYLA_RPC_EV_DONE)
        c->done_delivered = 1;
    pthread_mutex_unlock(&c->mu);
    c->m->fn(c, ev, msg, c->m->ud);
    pthread_mutex_lock(&c->mu);
    c->in_handler = 0;
    if (c->done_pending && !c->done_delivered) {
        c->done_pending = 0;
        c->in_handler = 1;
        c->done_delivered = 1;
        pthread_mutex_unlock(&c->mu);
        c->m->fn(c, HYLA_RPC_EV_DONE, NULL, c->m->ud);
        pthread_mutex_lock(&c->mu);
        c->in_handler = 0;
    }
    maybe_post_recv_locked(c);
}

static void maybe_done_locked(hyla_rpc_call *c) {
    if (!c->started || !c->closed || c->done_delivered)
        return;
    if (c->in_handler) {
        c->done_pending = 1;
        return;
    }
    dispatch_locked(c, HYLA_RPC_EV_DONE, NULL);
}

static void start_locked(hyla_rpc_call *c, const ProtobufCMessage *req) {
    c->started = 1;
    c->user_hold = 1;
    c->refs++; /* the handler's hold, released by reply/fail */
    dispatch_locked(c, HYLA_RPC_EV_START, req);
}

/* ---------------------------------------------------------------------------------------- */
/* completions                                                                               */

static void post_accept(hyla_rpc_server *srv);

static const rpc_method *find_method(const hyla_rpc_server *srv, const char *path) {
    for (int i = 0; i < srv->n_methods; i++)
        if (strcmp(srv->methods[i].path, path) == 0)
            return &srv->methods[i];
    return NULL;
}

static const char *principal_word(hyla_rpc_principal_kind k) {
    switch (k) {
    case HYLA_RPC_PRINCIPAL_TENANT: return "a tenant key";
    case HYLA_RPC_PRINCIPAL_CLUSTER: return "the cluster credential";
    case HYLA_RPC_PRINCIPAL_OPERATOR: return "the operator key";
    default: return "no key";
    }
}

/* Check the caller's bearer key against the policy of the method's service; on refusal the
 * final status is decided (UNAUTHENTICATED: no valid key; PERMISSION_DENIED: a valid key of a
 * kind the service does not accept). Returns 1 when the call may run. Called with c->mu held. */
static int authenticate_locked(hyla_rpc_call *c) {
    hyla_rpc_server *srv = c->srv;
    hyla_rpc_policy policy = HYLA_RPC_POLICY_CLUSTER;
    size_t best = 0;
    for (int i = 0; i < srv->n_policies; i++) {
        size_t n = strlen(srv->policies[i].prefix);
        if (n > best && strncmp(c->path, srv->policies[i].prefix, n) == 0) {
            best = n;
            policy = srv->policies[i].policy;
        }
    }
    const char *h = rpc_kv_find(c->md, c->n_md, HYLA_RPC_AUTH_KEY);
    char msg[512];
    if (!h || strncmp(h, "Bearer ", 7) != 0 || !h[7]) {
        snprintf(msg, sizeof msg, "%s: no API key (send metadata %s: Bearer KEY)", c->path, HYLA_RPC_AUTH_KEY);
        finish_locked(c, HYLA_RPC_UNAUTHENTICATED, msg, NULL);
        return 0;
    }
    hyla_rpc_principal pr;
    memset(&pr, 0, sizeof pr);
    if (strlen(h + 7) >= HYLA_RPC_KEY_MAX || !srv->verify(srv->verify_ud, h + 7, &pr) ||
        pr.kind == HYLA_RPC_PRINCIPAL_NONE) {
        snprintf(msg, sizeof msg, "%s: API key not valid (unknown or revoked)", c->path);
        finish_locked(c, HYLA_RPC_UNAUTHENTICATED, msg, NULL);
        return 0;
    }
    int ok = policy == HYLA_RPC_POLICY_ANY        ? 1
             : policy == HYLA_RPC_POLICY_TENANT   ? pr.kind == HYLA_RPC_PRINCIPAL_TENANT
             : policy == HYLA_RPC_POLICY_OPERATOR ? pr.kind == HYLA_RPC_PRINCIPAL_OPERATOR
                                                  : (pr.kind == HYLA_RPC_PRINCIPAL_CLUSTER ||
                                                     pr.kind == HYLA_RPC_PRINCIPAL_OPERATOR);
    if (!ok) {
        const char *need = policy == HYLA_RPC_POLICY_TENANT     ? "a tenant API key"
                           : policy == HYLA_RPC_POLICY_OPERATOR ? "the operator key"
                                                                : "the cluster credential";
        snprintf(msg, sizeof msg, "%s needs %s; the call carries %s", c->path, need, principal_word(pr.kind));
        finish_locked(c, HYLA_RPC_PERMISSION_DENIED, msg, NULL);
        return 0;
    }
    c->principal = pr;
    return 1;
}

static void on_accept(hyla_rpc_call *c, int ok) {
    hyla_rpc_server *srv = c->srv;
    pthread_mutex_lock(&srv->mu);
    srv->accepts_pending--;
    pthread_mutex_unlock(&srv->mu);
    if (!ok) { /* shutdown */
        call_free(c);
        return;
    }
    post_accept(srv);

    c->t0 = hyla_now();
    c->path = rpc_slice_strdup(c->details.method);
    if (rpc_kv_copy(c->req_md.metadata, c->req_md.count, &c->md, &c->n_md) != HYLA_OK)
        c->n_md = 0;
    c->m = find_method(srv, c->path);

    pthread_mutex_lock(&c->mu);
    c->refs++; /* this function's */
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    op.data.recv_close_on_server.cancelled = &c->close_cancelled;
    c->refs++;
    if (rpc_start_batch(c->call, &op, 1, &c->t_close, "recv close")) {
        /* Cannot happen for a fresh call; without CLOSE the call would never end. */
        c->refs--;
        c->closed = c->cancelled = 1;
        grpc_call_cancel(c->call, NULL);
    } else if (!c->m) {
        char msg[512];
        snprintf(msg, sizeof msg, "unknown method %s", c->path);
        finish_locked(c, HYLA_RPC_UNIMPLEMENTED, msg, NULL);
    } else if (srv->verify && !authenticate_locked(c)) {
        /* refused: the status is on its way, the handler never runs */
    } else if (c->m->kind & HYLA_RPC_CLIENT_STREAM) {
        start_locked(c, NULL);
    } else {
        post_recv_locked(c);
    }
    call_unref_unlock(c);
}

static void on_recv(hyla_rpc_call *c, int ok) {
    pthread_mutex_lock(&c->mu);
    c->recv_inflight = 0;
    grpc_byte_buffer *bb = c->recv_bb;
    c->recv_bb = NULL;
    char msg[512];

    if (!c->started) { /* the request of a unary or server-streaming call */
        if (c->closed || c->finishing) {
            if (bb)
                grpc_byte_buffer_destroy(bb);
        } else if (!bb) {
            if (ok) {
                snprintf(msg, sizeof msg, "missing request message %s", c->m->req->name);
                finish_locked(c, HYLA_RPC_INVALID_ARGUMENT, msg, NULL);
            }
        } else {
            pthread_mutex_unlock(&c->mu);
            size_t len = 0;
            ProtobufCMessage *req = rpc_unpack(c->m->req, bb, &len);
            grpc_byte_buffer_destroy(bb);
            pthread_mutex_lock(&c->mu);
            if (!req) {
                snprintf(msg, sizeof msg, "malformed request: %s", hyla_last_error());
                abort_locked(c, HYLA_RPC_INVALID_ARGUMENT, msg);
            } else if (!c->closed) {
                start_locked(c, req);
            }
            if (req)
                protobuf_c_message_free_unpacked(req, NULL);
        }
    } else if (!bb) { /* end of the client's stream */
        c->recv_eof = 1;
        if (ok && !c->closed && !c->finishing && !c->done_delivered)
            dispatch_locked(c, HYLA_RPC_EV_HALF_CLOSE, NULL);
    } else {
        pthread_mutex_unlock(&c->mu);
        size_t len = 0;
        ProtobufCMessage *m = rpc_unpack(c->m->req, bb, &len);
        grpc_byte_buffer_destroy(bb);
        pthread_mutex_lock(&c->mu);
        if (!m) {
            snprintf(msg, sizeof msg, "malformed request message: %s", hyla_last_error());
            abort_locked(c, HYLA_RPC_INVALID_ARGUMENT, msg);
        } else {
            if (!c->closed && !c->finishing && !c->done_delivered)
                dispatch_locked(c, HYLA_RPC_EV_MESSAGE, m);
            protobuf_c_message_free_unpacked(m, NULL);
        }
        maybe_post_recv_locked(c);
    }
    call_unref_unlock(c);
}

static void on_send(hyla_rpc_call *c, int ok) {
    pthread_mutex_lock(&c->mu);
    c->send_inflight = 0;
    if (!c->send_is_status && c->q_head)
        grpc_byte_buffer_destroy(rpc_out_pop(&c->q_head, &c->q_tail, &c->q_len));
    if (!ok) {
        c->broken = 1;
        rpc_out_free_all(&c->q_head, &c->q_tail, &c->q_len);
    } else {
        kick_send_locked(c);
    }
    call_unref_unlock(c);
}

static void on_close(hyla_rpc_call *c) {
    pthread_mutex_lock(&c->mu);
    c->closed = 1;
    if (c->close_cancelled)
        c->cancelled = 1;
    if (c->cancelled)
        drop_unsent_locked(c);
    maybe_done_locked(c);
    call_unref_unlock(c);
}

static void post_accept(hyla_rpc_server *srv) {
    hyla_rpc_call *c = calloc(1, sizeof *c);
    HYLA_ASSERT(c);
    c->srv = srv;
    c->t_accept = (rpc_tag){RPC_TAG_ACCEPT, c};
    c->t_recv = (rpc_tag){RPC_TAG_RECV, c};
    c->t_send = (rpc_tag){RPC_TAG_SEND, c};
    c->t_close = (rpc_tag){RPC_TAG_CLOSE, c};
    pthread_mutex_init(&c->mu, NULL);
    grpc_call_details_init(&c->details);
    grpc_metadata_array_init(&c->req_md);

    pthread_mutex_lock(&srv->mu);
    srv->live_calls++;
    if (srv->shutting_down) {
        pthread_mutex_unlock(&srv->mu);
        call_free(c);
        return;
    }
    grpc_call_error e =
        grpc_server_request_call(srv->srv, &c->call, &c->details, &c->req_md, srv->cq, srv->cq, &c->t_accept);
    if (e == GRPC_CALL_OK)
        srv->accepts_pending++;
    pthread_mutex_unlock(&srv->mu);
    if (e != GRPC_CALL_OK) {
        HYLA_ERROR("rpc: grpc_server_request_call refused: %s", grpc_call_error_to_string(e));
        call_free(c);
    }
}

static void *loop_main(void *arg) {
    hyla_rpc_server *srv = arg;
    rpc_on_loop_thread = 1;
    rpc_tag *t;
    int ok;
    while (rpc_cq_next(srv->cq, &t, &ok)) {
        switch (t->kind) {
        case RPC_TAG_ACCEPT: on_accept(t->owner, ok); break;
        case RPC_TAG_RECV: on_recv(t->owner, ok); break;
        case RPC_TAG_SEND: on_send(t->owner, ok); break;
        case RPC_TAG_CLOSE: on_close(t->owner); break;
        case RPC_TAG_SHUTDOWN:
            pthread_mutex_lock(&srv->mu);
            srv->shutdown_tag_seen = 1;
            pthread_cond_broadcast(&srv->cv);
            pthread_mutex_unlock(&srv->mu);
            break;
        default: HYLA_ASSERT(!"unknown rpc tag");
        }
    }
    return NULL;
}

/* ---------------------------------------------------------------------------------------- */
/* server                                                                                    */

hyla_status hyla_rpc_server_create(const hyla_rpc_server_params *params, hyla_rpc_server **out) {
    *out = NULL;
    hyla_rpc_server_params p = params ? *params : hyla_rpc_server_default_params();
    if (p.threads < 1 || p.threads > 256)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "rpc server: threads %d out of [1, 256]", p.threads);
    if (p.max_message_bytes <= 0)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "rpc server: max_message_bytes %d must be > 0",
                         p.max_message_bytes);
    if (p.accept_depth < 1)
        p.accept_depth = 1;
    if (p.shutdown_grace_ms < 0)
        p.shutdown_grace_ms = 0;
    hyla_rpc_server *s = calloc(1, sizeof *s);
    if (!s)
        return hyla_fail(HYLA_ERR_NOMEM, "rpc server");
    s->p = p;
    s->t_shutdown = (rpc_tag){RPC_TAG_SHUTDOWN, s};
    pthread_mutex_init(&s->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);

    rpc_grpc_ref();
    grpc_arg args[2];
    grpc_channel_args cargs = rpc_message_size_args(args, p.max_message_bytes);
    s->srv = grpc_server_create(&cargs, NULL);
    s->cq = grpc_completion_queue_create_for_next(NULL);
    grpc_server_register_completion_queue(s->srv, s->cq, NULL);
    *out = s;
    return HYLA_OK;
}

hyla_status hyla_rpc_server_add_method(hyla_rpc_server *s, const char *path, hyla_rpc_kind kind,
                                       const ProtobufCMessageDescriptor *req,
                                       const ProtobufCMessageDescriptor *resp, hyla_rpc_handler fn,
                                       void *ud) {
    HYLA_ASSERT(s && path && req && resp && fn);
    HYLA_ASSERT(kind >= HYLA_RPC_UNARY && kind <= HYLA_RPC_BIDI);
    if (s->started || s->shutting_down)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "rpc server: add_method %s after start", path);
    if (path[0] != '/')
        return hyla_fail(HYLA_ERR_INVALID_ARG, "rpc server: method path '%s' must start with '/'", path);
    if (find_method(s, path))
        return hyla_fail(HYLA_ERR_EXISTS, "rpc server: method %s registered twice", path);
    if (s->n_methods == s->cap_methods) {
        int cap = s->cap_methods ? 2 * s->cap_methods : 16;
        rpc_method *m = realloc(s->methods, (size_t)cap * sizeof *m);
        if (!m)
            return hyla_fail(HYLA_ERR_NOMEM, "rpc server: methods");
        s->methods = m;
        s->cap_methods = cap;
    }
    rpc_method *m = &s->methods[s->n_methods];
    m->path = strdup(path);
    if (!m->path)
        return hyla_fail(HYLA_ERR_NOMEM, "rpc server: methods");
    m->kind = kind;
    m->req = req;
    m->resp = resp;
    m->fn = fn;
    m->ud = ud;
    s->n_methods++;
    return HYLA_OK;
}

hyla_status hyla_rpc_server_listen(hyla_rpc_server *s, const char *addr, int *port) {
    HYLA_ASSERT(s && addr);
    if (s->started || s->shutting_down)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "rpc server: listen %s after start", addr);
    grpc_server_credentials *creds = rpc_server_credentials();
    int bound = grpc_server_add_http2_port(s->srv, addr, creds);
    grpc_server_credentials_release(creds);
    if (bound == 0)
        return hyla_fail(HYLA_ERR_IO, "rpc server: cannot listen on '%s' (in use, or not a valid address)",
                         addr);
    s->n_ports++;
    if (port)
        *port = bound;
    return HYLA_OK;
}

hyla_status hyla_rpc_server_set_auth(hyla_rpc_server *s, hyla_rpc_verify_fn fn, void *ud) {
    HYLA_ASSERT(s && fn);
    if (s->started)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "rpc server: set_auth after start");
    s->verify = fn;
    s->verify_ud = ud;
    return HYLA_OK;
}

hyla_status hyla_rpc_server_set_policy(hyla_rpc_server *s, const char *path_prefix, hyla_rpc_policy policy) {
    HYLA_ASSERT(s && path_prefix);
    if (s->started)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "rpc server: set_policy after start");
    int n = (int)(sizeof s->policies / sizeof s->policies[0]);
    if (s->n_policies >= n)
        return hyla_fail(HYLA_ERR_RESOURCE, "rpc server: more than %d policies", n);
    s->policies[s->n_policies].prefix = strdup(path_prefix);
    HYLA_ASSERT(s->policies[s->n_policies].prefix);
    s->policies[s->n_policies].policy = policy;
    s->n_policies++;
    return HYLA_OK;
}

static int fixed_verify(void *ud, const char *key, hyla_rpc_principal *out) {
    hyla_rpc_server *s = ud;
    size_t n = strlen(key);
    int found = -1;
    for (int i = 0; i < s->n_fixed; i++) { /* every key compared in full: time tells nothing */
        size_t m = strlen(s->fixed[i].key);
        volatile unsigned char acc = (unsigned char)(m != n);
        for (size_t j = 0; j < m; j++)
            acc |= (unsigned char)(s->fixed[i].key[j] ^ key[j < n ? j : 0]);
        if (!acc && found < 0)
            found = i;
    }
    if (found < 0)
        return 0;
    out->kind = s->fixed[found].kind;
    snprintf(out->name, sizeof out->name, "%s", out->kind == HYLA_RPC_PRINCIPAL_OPERATOR ? "operator" : "cluster");
    return 1;
}

hyla_status hyla_rpc_server_accept_key(hyla_rpc_server *s, const char *key, hyla_rpc_principal_kind kind) {
    HYLA_ASSERT(s && key);
    if (s->started || (s->verify && s->verify != fixed_verify))
        return hyla_fail(HYLA_ERR_INVALID_ARG, "rpc server: accept_key after start or with set_auth");
    if (s->n_fixed >= 4)
        return hyla_fail(HYLA_ERR_RESOURCE, "rpc server: more than 4 fixed keys");
    if (!key[0] || strlen(key) >= HYLA_RPC_KEY_MAX)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "rpc server: a fixed key is empty or longer than %d bytes",
                         HYLA_RPC_KEY_MAX - 1);
    s->fixed[s->n_fixed].key = strdup(key);
    HYLA_ASSERT(s->fixed[s->n_fixed].key);
    s->fixed[s->n_fixed].kind = kind;
    s->n_fixed++;
    s->verify = fixed_verify;
    s->verify_ud = s;
    return HYLA_OK;
}

const hyla_rpc_principal *hyla_rpc_call_principal(hyla_rpc_call *c) {
    return c->srv->verify ? &c->principal : NULL;
}

hyla_status hyla_rpc_server_start(hyla_rpc_server *s) {
    HYLA_ASSERT(s);
    if (s->started || s->shutting_down)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "rpc server: started twice");
    if (s->n_ports == 0)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "rpc server: start without a listening address");
    grpc_server_start(s->srv);
    s->threads = calloc((size_t)s->p.threads, sizeof *s->threads);
    if (!s->threads)
        return hyla_fail(HYLA_ERR_NOMEM, "rpc server: threads");
    for (int i = 0; i < s->p.threads; i++) {
        int e = pthread_create(&s->threads[i], NULL, loop_main, s);
        if (e != 0) {
            HYLA_ERROR("rpc server: pthread_create: %s", strerror(e));
            break;
        }
        s->n_threads++;
    }
    s->started = 1;
    if (s->n_threads == 0)
        return hyla_fail(HYLA_ERR_NOMEM, "rpc server: no loop thread could start");
    for (int i = 0; i < s->p.accept_depth; i++)
        post_accept(s);
    return HYLA_OK;
}

/* Wait on s->cv until *flag or the deadline (NULL: none); returns *flag. s->mu held. */
static int wait_flag_locked(hyla_rpc_server *s, const int *flag, const struct timespec *deadline) {
    while (!*flag) {
        if (deadline) {
            if (pthread_cond_timedwait(&s->cv, &s->mu, deadline) == ETIMEDOUT)
                return *flag;
        } else {
            pthread_cond_wait(&s->cv, &s->mu);
        }
    }
    return 1;
}

static struct timespec mono_in_ms(int64_t ms) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    t.tv_sec += (time_t)(ms / 1000);
    t.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (t.tv_nsec >= 1000000000L) {
        t.tv_sec++;
        t.tv_nsec -= 1000000000L;
    }
    return t;
}

void hyla_rpc_server_shutdown(hyla_rpc_server *s) {
    if (!s)
        return;
    HYLA_ASSERT(!rpc_on_loop_thread);
    pthread_mutex_lock(&s->mu);
    if (s->shutting_down) {
        while (!s->shut_down)
            pthread_cond_wait(&s->cv, &s->mu);
        pthread_mutex_unlock(&s->mu);
        return;
    }
    s->shutting_down = 1;
    pthread_mutex_unlock(&s->mu);

    grpc_server_shutdown_and_notify(s->srv, s->cq, &s->t_shutdown);
    if (s->n_threads == 0) {
        /* Never started: no loop thread; drain the queue here. */
        for (;;) {
            grpc_event ev = grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
            if (ev.type == GRPC_OP_COMPLETE && ev.tag == &s->t_shutdown)
                break;
        }
        s->shutdown_tag_seen = 1;
    }
    pthread_mutex_lock(&s->mu);
    struct timespec grace = mono_in_ms(s->p.shutdown_grace_ms);
    if (!wait_flag_locked(s, &s->shutdown_tag_seen, &grace)) {
        HYLA_INFO("rpc server: %d call(s) still running after %d ms: cancelling them", s->live_calls,
                  s->p.shutdown_grace_ms);
        pthread_mutex_unlock(&s->mu);
        grpc_server_cancel_all_calls(s->srv);
        pthread_mutex_lock(&s->mu);
    }
    /* Calls end when their handlers release them (reply/fail after DONE). */
    for (;;) {
        struct timespec t = mono_in_ms(5000);
        if (wait_flag_locked(s, &s->shutdown_tag_seen, &t))
            break;
        HYLA_WARN("rpc server: shutdown waits for %d call(s) whose handlers have not replied", s->live_calls);
    }
    while (s->live_calls > 0) {
        struct timespec t = mono_in_ms(5000);
        if (pthread_cond_timedwait(&s->cv, &s->mu, &t) == ETIMEDOUT)
            HYLA_WARN("rpc server: shutdown waits for %d call context(s)", s->live_calls);
    }
    pthread_mutex_unlock(&s->mu);

    grpc_server_destroy(s->srv);
    s->srv = NULL;
    grpc_completion_queue_shutdown(s->cq);
    for (int i = 0; i < s->n_threads; i++)
        pthread_join(s->threads[i], NULL);
    if (s->n_threads == 0) {
        while (grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
               GRPC_QUEUE_SHUTDOWN) {
        }
    }
    grpc_completion_queue_destroy(s->cq);
    s->cq = NULL;
    pthread_mutex_lock(&s->mu);
    s->shut_down = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

hyla_status hyla_rpc_server_add_cleanup(hyla_rpc_server *s, void (*fn)(void *), void *arg) {
    HYLA_ASSERT(s && fn);
    pthread_mutex_lock(&s->mu);
    hyla_status st = HYLA_OK;
    if (s->n_cleanups == (int)(sizeof s->cleanups / sizeof s->cleanups[0])) {
        st = hyla_fail(HYLA_ERR_RESOURCE, "rpc server: more than %d cleanups",
                       (int)(sizeof s->cleanups / sizeof s->cleanups[0]));
    } else {
        s->cleanups[s->n_cleanups].fn = fn;
        s->cleanups[s->n_cleanups].arg = arg;
        s->n_cleanups++;
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

void hyla_rpc_server_destroy(hyla_rpc_server *s) {
    if (!s)
        return;
    hyla_rpc_server_shutdown(s);
    for (int i = s->n_cleanups - 1; i >= 0; i--)
        s->cleanups[i].fn(s->cleanups[i].arg);
    for (int i = 0; i < s->n_methods; i++)
        free(s->methods[i].path);
    for (int i = 0; i < s->n_policies; i++)
        free(s->policies[i].prefix);
    for (int i = 0; i < s->n_fixed; i++)
        free(s->fixed[i].key);
    free(s->methods);
    free(s->threads);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
    rpc_grpc_unref();
}

void hyla_rpc_server_set_observer(hyla_rpc_server *s, hyla_rpc_observer fn, void *ud) {
    HYLA_ASSERT(s && !s->started);
    s->obs = fn;
    s->obs_ud = ud;
}

int hyla_rpc_server_live_calls(hyla_rpc_server *s) {
    pthread_mutex_lock(&s->mu);
    int n = s->live_calls - s->accepts_pending;
    pthread_mutex_unlock(&s->mu);
    return n;
}

/* ---------------------------------------------------------------------------------------- */
/* calls                                                                                     */

hyla_status hyla_rpc_call_send(hyla_rpc_call *c, const ProtobufCMessage *msg) {
    HYLA_ASSERT(c && msg);
    HYLA_ASSERT(msg->descriptor == c->m->resp);
    grpc_byte_buffer *bb;
    HYLA_TRY(rpc_pack(msg, c->srv->p.max_message_bytes, "response", &bb));
    pthread_mutex_lock(&c->mu);
    HYLA_ASSERT(c->user_hold);
    if (c->finishing || c->closed || c->cancelled || c->broken) {
        pthread_mutex_unlock(&c->mu);
        grpc_byte_buffer_destroy(bb);
        return hyla_fail(HYLA_ERR_CANCELLED, "%s: the call is over", call_name(c));
    }
    rpc_out_push(&c->q_head, &c->q_tail, &c->q_len, bb);
    kick_send_locked(c);
    pthread_mutex_unlock(&c->mu);
    return HYLA_OK;
}

/* Release the handler's hold after deciding the status. last: taken. */
static void release(hyla_rpc_call *c, hyla_rpc_code code, const char *msg, grpc_byte_buffer *last) {
    pthread_mutex_lock(&c->mu);
    HYLA_ASSERT(c->user_hold); /* a second reply/fail on one call is a programmer error */
    c->user_hold = 0;
    finish_locked(c, code, msg, last);
    call_unref_unlock(c);
}

void hyla_rpc_call_reply(hyla_rpc_call *c, const ProtobufCMessage *resp) {
    HYLA_ASSERT(c);
    grpc_byte_buffer *bb = NULL;
    if (resp) {
        HYLA_ASSERT(resp->descriptor == c->m->resp);
        if (rpc_pack(resp, c->srv->p.max_message_bytes, "response", &bb) != HYLA_OK) {
            release(c, HYLA_RPC_RESOURCE_EXHAUSTED, hyla_last_error(), NULL);
            return;
        }
    } else {
        /* a unary or client-streaming response is one message */
        HYLA_ASSERT(c->m->kind & HYLA_RPC_SERVER_STREAM);
    }
    release(c, HYLA_RPC_OK, "", bb);
}

void hyla_rpc_call_fail(hyla_rpc_call *c, hyla_rpc_code code, const char *fmt, ...) {
    HYLA_ASSERT(c && code != HYLA_RPC_OK && (unsigned)code < HYLA_RPC_CODE_COUNT);
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    release(c, code, msg, NULL);
}

void hyla_rpc_call_fail_status(hyla_rpc_call *c, hyla_status s, const char *detail) {
    hyla_rpc_code code = hyla_rpc_code_from_status(s);
    if (code == HYLA_RPC_OK) /* failing with HYLA_OK is a caller bug; do not report success */
        code = HYLA_RPC_INTERNAL;
    hyla_rpc_call_fail(c, code, "%s", detail ? detail : hyla_status_str(s));
}

hyla_status hyla_rpc_call_set_trailer(hyla_rpc_call *c, const char *key, const char *value) {
    HYLA_ASSERT(c && key && value);
    pthread_mutex_lock(&c->mu);
    hyla_status st = HYLA_OK;
    if (c->finishing)
        st = hyla_fail(HYLA_ERR_INVALID_ARG, "%s: trailer '%s' after the status", call_name(c), key);
    else if (c->n_trailers == RPC_MAX_TRAILERS)
        st = hyla_fail(HYLA_ERR_RESOURCE, "%s: more than %d trailers", call_name(c), RPC_MAX_TRAILERS);
    else if (!grpc_header_key_is_legal(grpc_slice_from_static_string(key)))
        st = hyla_fail(HYLA_ERR_INVALID_ARG, "%s: trailer key '%s' is not a legal header key", call_name(c),
                       key);
    else {
        c->trailers[c->n_trailers].key = strdup(key);
        c->trailers[c->n_trailers].value = strdup(value);
        HYLA_ASSERT(c->trailers[c->n_trailers].key && c->trailers[c->n_trailers].value);
        c->n_trailers++;
    }
    pthread_mutex_unlock(&c->mu);
    return st;
}

void hyla_rpc_call_read_hold(hyla_rpc_call *c) {
    pthread_mutex_lock(&c->mu);
    c->read_hold = 1;
    pthread_mutex_unlock(&c->mu);
}

void hyla_rpc_call_read_resume(hyla_rpc_call *c) {
    pthread_mutex_lock(&c->mu);
    c->read_hold = 0;
    maybe_post_recv_locked(c);
    pthread_mutex_unlock(&c->mu);
}

int hyla_rpc_call_cancelled(hyla_rpc_call *c) {
    pthread_mutex_lock(&c->mu);
    int v = c->cancelled || c->broken;
    pthread_mutex_unlock(&c->mu);
    return v;
}

int64_t hyla_rpc_call_deadline_ms(hyla_rpc_call *c) {
    gpr_timespec d = c->details.deadline;
    if (gpr_time_cmp(d, gpr_inf_future(d.clock_type)) == 0)
        return -1;
    gpr_timespec dm = gpr_convert_clock_type(d, GPR_CLOCK_MONOTONIC);
    int64_t ms = gpr_time_to_millis(gpr_time_sub(dm, gpr_now(GPR_CLOCK_MONOTONIC)));
    return ms < 0 ? 0 : ms;
}

const char *hyla_rpc_call_method(hyla_rpc_call *c) { return c->path; }

const char *hyla_rpc_call_metadata(hyla_rpc_call *c, const char *key) {
    return rpc_kv_find(c->md, c->n_md, key);
}

int hyla_rpc_call_max_message(const hyla_rpc_call *c) { return c->srv->p.max_message_bytes; }

size_t hyla_rpc_call_queued(hyla_rpc_call *c) {
    pthread_mutex_lock(&c->mu);
    size_t n = c->q_len;
    pthread_mutex_unlock(&c->mu);
    return n;
}

void hyla_rpc_call_set_user(hyla_rpc_call *c, void *user, void (*free_fn)(void *)) {
    pthread_mutex_lock(&c->mu);
    c->user = user;
    c->user_free = free_fn;
    pthread_mutex_unlock(&c->mu);
}

void *hyla_rpc_call_user(hyla_rpc_call *c) {
    pthread_mutex_lock(&c->mu);
    void *u = c->user;
    pthread_mutex_unlock(&c->mu);
    return u;
}
