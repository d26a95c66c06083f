/* hyla_rpc_client.c — the client half of hyla_rpc.h: a channel, one completion-queue thread,
 * and one context per call (a "stream", whatever the method's kind).
 *
 * Per-call state machine. Opening a stream creates the call and starts three batches at once:
 * SEND_INITIAL_METADATA (START tag), RECV_STATUS_ON_CLIENT (CLOSE tag, completes when the call
 * is over) and RECV_INITIAL_METADATA + RECV_MESSAGE (RECV tag). Writes go through a queue with at
 * most one SEND batch in flight (messages, then SEND_CLOSE_FROM_CLIENT once close_send was asked
 * and the queue is empty). Responses go to a bounded read queue (blocking reads; the next RECV
 * is posted only while the queue has room, which is the back-pressure) or to a callback.
 *
 * Invariants.
 *   - refs counts batches in flight and the user's handle; the context is freed at zero.
 *   - At most one batch per tag in flight; batches start under s->mu.
 *   - Async streams: the callback runs on the loop thread only, so callbacks of one stream
 *     never overlap; the final NULL callback comes after the status and after the last message.
 *
 * Threading. Any thread may use a stream; blocking functions are refused on loop threads.
 * A client's loop thread is its only thread. Lock order: a stream's mu, then the client's mu. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>

#include "hyla_log.h"
#include "hyla_rpc_impl.h"
#include "hyla_thread.h"

struct hyla_rpc_client {
    hyla_rpc_client_params p;
    char *target;
    char *bearer; /* "Bearer KEY" sent on every call, or NULL */
    grpc_channel *ch;
    grpc_completion_queue *cq;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int live;         /* stream contexts not yet freed */
    int user_streams; /* streams not yet destroyed by the user */
};

struct hyla_rpc_stream {
    rpc_tag t_start, t_recv, t_send, t_close;
    hyla_rpc_client *cl;
    grpc_call *call;
    char *method;
    const ProtobufCMessageDescriptor *resp_desc;
    hyla_rpc_stream_fn fn;
    void *ud;

    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;
    int user_hold;

    /* request metadata (kept alive for the call) */
    grpc_metadata *md;
    size_t n_md;

    /* receive side */
    grpc_metadata_array init_md;
    int init_md_posted;
    grpc_byte_buffer *recv_bb;
    int recv_inflight, recv_eof, discard;
    rpc_out *in_head, *in_tail;
    size_t in_len;

    /* send side */
    rpc_out *q_head, *q_tail;
    size_t q_len;
    int send_inflight, send_is_close, close_requested, close_started, broken;

    /* status */
    grpc_metadata_array trailing;
    grpc_status_code status;
    grpc_slice status_details;
    int status_done;
    hyla_rpc_code code;
    char *message;
    rpc_kv *trailers;
    size_t n_trailers;

    /* callbacks */
    int cb_running, done_delivered, detached;
    pthread_t cb_thread;
};

hyla_rpc_client_params hyla_rpc_client_default_params(void) {
    hyla_rpc_client_params p;
    memset(&p, 0, sizeof p);
    p.max_message_bytes = 16 << 20;
    p.max_queued_writes = 16;
    p.max_queued_reads = 16;
    return p;
}

/* ---------------------------------------------------------------------------------------- */
/* stream contexts                                                                           */

static void stream_free(hyla_rpc_stream *s) {
    hyla_rpc_client *cl = s->cl;
    if (s->recv_bb)
        grpc_byte_buffer_destroy(s->recv_bb);
    rpc_out_free_all(&s->in_head, &s->in_tail, &s->in_len);
    rpc_out_free_all(&s->q_head, &s->q_tail, &s->q_len);
    if (s->call)
        grpc_call_unref(s->call);
    for (size_t i = 0; i < s->n_md; i++) {
        grpc_slice_unref(s->md[i].key);
        grpc_slice_unref(s->md[i].value);
    }
    free(s->md);
    grpc_metadata_array_destroy(&s->init_md);
    grpc_metadata_array_destroy(&s->trailing);
    grpc_slice_unref(s->status_details);
    rpc_kv_free(s->trailers, s->n_trailers);
    free(s->message);
    free(s->method);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
    hyla_count_down(&cl->mu, &cl->cv, &cl->live);
}

static void stream_unref_unlock(hyla_rpc_stream *s) {
    HYLA_ASSERT(s->refs > 0);
    int last = --s->refs == 0;
    pthread_mutex_unlock(&s->mu);
    if (last)
        stream_free(s);
}

static void kick_send_locked(hyla_rpc_stream *s) {
    if (s->send_inflight || s->broken || s->status_done)
        return;
    grpc_op op;
    memset(&op, 0, sizeof op);
    if (s->q_head) {
        op.op = GRPC_OP_SEND_MESSAGE;
        op.data.send_message.send_message = s->q_head->bb;
        s->send_is_close = 0;
    } else if (s->close_requested && !s->close_started) {
        op.op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
        s->send_is_close = 1;
        s->close_started = 1;
    } else {
        return;
    }
    s->send_inflight = 1;
    s->refs++;
    if (rpc_start_batch(s->call, &op, 1, &s->t_send, s->send_is_close ? "send close" : "send message")) {
        s->send_inflight = 0;
        s->refs--;
        s->broken = 1;
        rpc_out_free_all(&s->q_head, &s->q_tail, &s->q_len);
    }
}

static void post_recv_locked(hyla_rpc_stream *s) {
    grpc_op ops[2];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    if (!s->init_md_posted) {
        ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
        ops[n].data.recv_initial_metadata.recv_initial_metadata = &s->init_md;
        n++;
    }
    ops[n].op = GRPC_OP_RECV_MESSAGE;
    ops[n].data.recv_message.recv_message = &s->recv_bb;
    n++;
    s->recv_inflight = 1;
    s->refs++;
    if (rpc_start_batch(s->call, ops, n, &s->t_recv, "recv message")) {
        s->recv_inflight = 0;
        s->refs--;
        s->recv_eof = 1;
        grpc_call_cancel(s->call, NULL);
        return;
    }
    s->init_md_posted = 1;
}

static void maybe_post_recv_locked(hyla_rpc_stream *s) {
    if (s->recv_inflight || s->recv_eof)
        return;
    if (s->fn || s->discard || s->in_len < (size_t)s->cl->p.max_queued_reads)
        post_recv_locked(s);
}

/* Run the callback (s->mu held; released around the call). */
static void deliver_locked(hyla_rpc_stream *s, const ProtobufCMessage *msg) {
    if (s->detached)
        return;
    s->cb_running = 1;
    s->cb_thread = pthread_self();
    pthread_mutex_unlock(&s->mu);
    s->fn(s, msg, s->ud);
    pthread_mutex_lock(&s->mu);
    s->cb_running = 0;
    pthread_cond_broadcast(&s->cv);
}

static void maybe_done_locked(hyla_rpc_stream *s) {
    if (s->fn && s->status_done && s->recv_eof && !s->done_delivered) {
        s->done_delivered = 1;
        deliver_locked(s, NULL);
    }
}

/* A response that does not decode: the call ends with INTERNAL naming the type. */
static void bad_response_locked(hyla_rpc_stream *s, size_t len) {
    char msg[512];
    snprintf(msg, sizeof msg, "malformed response: %zu bytes do not decode as %s", len, s->resp_desc->name);
    grpc_call_cancel_with_status(s->call, GRPC_STATUS_INTERNAL, msg, NULL);
    s->discard = 1;
}

/* ---------------------------------------------------------------------------------------- */
/* completions                                                                               */

static void on_start(hyla_rpc_stream *s) {
    pthread_mutex_lock(&s->mu);
    stream_unref_unlock(s);
}

static void on_recv(hyla_rpc_stream *s) {
    pthread_mutex_lock(&s->mu);
    s->recv_inflight = 0;
    grpc_byte_buffer *bb = s->recv_bb;
    s->recv_bb = NULL;
    if (!bb) {
        s->recv_eof = 1;
    } else if (s->discard) {
        grpc_byte_buffer_destroy(bb);
    } else if (s->fn) {
        pthread_mutex_unlock(&s->mu);
        size_t len = 0;
        ProtobufCMessage *m = rpc_unpack(s->resp_desc, bb, &len);
        grpc_byte_buffer_destroy(bb);
        pthread_mutex_lock(&s->mu);
        if (!m) {
            bad_response_locked(s, len);
        } else {
            deliver_locked(s, m);
            protobuf_c_message_free_unpacked(m, NULL);
        }
    } else {
        rpc_out_push(&s->in_head, &s->in_tail, &s->in_len, bb);
    }
    maybe_post_recv_locked(s);
    maybe_done_locked(s);
    pthread_cond_broadcast(&s->cv);
    stream_unref_unlock(s);
}

static void on_send(hyla_rpc_stream *s, int ok) {
    pthread_mutex_lock(&s->mu);
    s->send_inflight = 0;
    if (!s->send_is_close) {
        grpc_byte_buffer *bb = rpc_out_pop(&s->q_head, &s->q_tail, &s->q_len);
        if (bb)
            grpc_byte_buffer_destroy(bb);
    }
    if (!ok) {
        s->broken = 1;
        rpc_out_free_all(&s->q_head, &s->q_tail, &s->q_len);
    } else {
        kick_send_locked(s);
    }
    pthread_cond_broadcast(&s->cv);
    stream_unref_unlock(s);
}

static void on_status(hyla_rpc_stream *s) {
    pthread_mutex_lock(&s->mu);
    s->status_done = 1;
    s->code = (unsigned)s->status < HYLA_RPC_CODE_COUNT ? (hyla_rpc_code)s->status : HYLA_RPC_UNKNOWN;
    s->message = rpc_slice_strdup(s->status_details);
    if (rpc_kv_copy(s->trailing.metadata, s->trailing.count, &s->trailers, &s->n_trailers) != HYLA_OK)
        s->n_trailers = 0;
    /* Unsent requests are moot now; the one in flight completes on its own. */
    if (s->send_inflight && !s->send_is_close && s->q_head) {
        rpc_out_free_after_head(&s->q_head, &s->q_tail, &s->q_len);
    } else if (!s->send_inflight) {
        rpc_out_free_all(&s->q_head, &s->q_tail, &s->q_len);
    }
    if (s->code != HYLA_RPC_OK)
        HYLA_DEBUG("rpc: %s <- %s: %s", s->method, hyla_rpc_code_name(s->code), s->message);
    maybe_done_locked(s);
    pthread_cond_broadcast(&s->cv);
    stream_unref_unlock(s);
}

static void *client_loop(void *arg) {
    hyla_rpc_client *c = arg;
    rpc_on_loop_thread = 1;
    rpc_tag *t;
    int ok;
    while (rpc_cq_next(c->cq, &t, &ok)) {
        switch (t->kind) {
        case RPC_TAG_START: on_start(t->owner); break;
        case RPC_TAG_RECV: on_recv(t->owner); break;
        case RPC_TAG_SEND: on_send(t->owner, ok); break;
        case RPC_TAG_CLOSE: on_status(t->owner); break;
        default: HYLA_ASSERT(!"unknown rpc tag");
        }
    }
    return NULL;
}

/* ---------------------------------------------------------------------------------------- */
/* client                                                                                    */

int hyla_rpc_client_max_message(const hyla_rpc_client *c) { return c->p.max_message_bytes; }

hyla_status hyla_rpc_client_create(const char *target, const hyla_rpc_client_params *params,
                                   hyla_rpc_client **out) {
    *out = NULL;
    HYLA_ASSERT(target);
    hyla_rpc_client_params p = params ? *params : hyla_rpc_client_default_params();
    if (p.max_message_bytes <= 0)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "rpc client: max_message_bytes %d must be > 0",
                         p.max_message_bytes);
    if (p.max_queued_writes < 1)
        p.max_queued_writes = 1;
    if (p.max_queued_reads < 1)
        p.max_queued_reads = 1;
    if (!target[0])
        return hyla_fail(HYLA_ERR_INVALID_ARG, "rpc client: empty target address");
    rpc_grpc_ref(); /* before any gRPC object, credentials included */
    grpc_channel_credentials *creds = NULL;
    if (p.tls_ca && p.tls_ca[0]) {
        hyla_status cst = rpc_channel_credentials_ca(p.tls_ca, &creds);
        if (cst != HYLA_OK) {
            rpc_grpc_unref();
            return cst;
        }
    } else {
        creds = rpc_channel_credentials();
    }
    hyla_rpc_client *c = calloc(1, sizeof *c);
    if (!c) {
        grpc_channel_credentials_release(creds);
        rpc_grpc_unref();
        return hyla_fail(HYLA_ERR_NOMEM, "rpc client");
    }
    c->p = p;
    c->target = strdup(target);
    const char *key = p.bearer ? p.bearer : rpc_default_bearer();
    c->p.bearer = c->p.tls_ca = NULL; /* not kept: borrowed from the caller */
    if (key && key[0]) {
        size_t n = strlen(key) + 8;
        c->bearer = malloc(n);
        HYLA_ASSERT(c->bearer);
        snprintf(c->bearer, n, "Bearer %s", key);
    }
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);

    grpc_arg args[2];
    grpc_channel_args cargs = rpc_message_size_args(args, p.max_message_bytes);
    c->ch = grpc_channel_create(target, creds, &cargs);
    grpc_channel_credentials_release(creds);
    c->cq = grpc_completion_queue_create_for_next(NULL);
    int e = pthread_create(&c->thread, NULL, client_loop, c);
    if (e != 0) {
        grpc_channel_destroy(c->ch);
        grpc_completion_queue_shutdown(c->cq);
        while (grpc_completion_queue_next(c->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
               GRPC_QUEUE_SHUTDOWN) {
        }
        grpc_completion_queue_destroy(c->cq);
        rpc_grpc_unref();
        free(c->target);
        free(c->bearer);
        free(c);
        return hyla_fail(HYLA_ERR_NOMEM, "rpc client: pthread_create: %s", strerror(e));
    }
    *out = c;
    return HYLA_OK;
}

void hyla_rpc_client_destroy(hyla_rpc_client *c) {
    if (!c)
        return;
    HYLA_ASSERT(!rpc_on_loop_thread);
    pthread_mutex_lock(&c->mu);
    if (c->user_streams != 0)
        HYLA_ERROR("rpc client %s: destroyed with %d stream(s) not destroyed", c->target, c->user_streams);
    HYLA_ASSERT(c->user_streams == 0);
    while (c->live > 0) /* destroyed streams whose last batches are completing */
        pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
    grpc_channel_destroy(c->ch);
    grpc_completion_queue_shutdown(c->cq);
    pthread_join(c->thread, NULL);
    grpc_completion_queue_destroy(c->cq);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c->target);
    free(c->bearer);
    free(c);
    rpc_grpc_unref();
}

/* ---------------------------------------------------------------------------------------- */
/* streams                                                                                   */

static hyla_status add_md(hyla_rpc_stream *s, size_t *cap, const char *key, const char *value) {
    grpc_slice k = grpc_slice_from_copied_string(key);
    if (!grpc_header_key_is_legal(k)) {
        grpc_slice_unref(k);
        return hyla_fail(HYLA_ERR_INVALID_ARG, "rpc: metadata key '%s' is not a legal header key", key);
    }
    grpc_slice v = grpc_slice_from_copied_string(value);
    if (!grpc_is_binary_header(k) && !grpc_header_nonbin_value_is_legal(v)) {
        grpc_slice_unref(k);
        grpc_slice_unref(v);
        return hyla_fail(HYLA_ERR_INVALID_ARG, "rpc: metadata value of '%s' has illegal characters", key);
    }
    if (s->n_md == *cap) {
        size_t nc = *cap ? 2 * *cap : 4;
        grpc_metadata *m = realloc(s->md, nc * sizeof *m);
        HYLA_ASSERT(m);
        s->md = m;
        *cap = nc;
    }
    memset(&s->md[s->n_md], 0, sizeof s->md[s->n_md]);
    s->md[s->n_md].key = k;
    s->md[s->n_md].value = v;
    s->n_md++;
    return HYLA_OK;
}

static hyla_status open_common(hyla_rpc_client *c, const char *method, const ProtobufCMessageDescriptor *resp_desc,
                               const hyla_rpc_call_opts *opts, hyla_rpc_stream_fn fn, void *ud,
                               hyla_rpc_stream **out) {
    *out = NULL;
    HYLA_ASSERT(c && method && resp_desc);
    hyla_rpc_call_opts o;
    memset(&o, 0, sizeof o);
    if (opts)
        o = *opts;
    if (method[0] != '/')
        return hyla_fail(HYLA_ERR_INVALID_ARG, "rpc: method path '%s' must start with '/'", method);

    hyla_rpc_stream *s = calloc(1, sizeof *s);
    if (!s)
        return hyla_fail(HYLA_ERR_NOMEM, "rpc stream");
    s->cl = c;
    s->t_start = (rpc_tag){RPC_TAG_START, s};
    s->t_recv = (rpc_tag){RPC_TAG_RECV, s};
    s->t_send = (rpc_tag){RPC_TAG_SEND, s};
    s->t_close = (rpc_tag){RPC_TAG_CLOSE, s};
    s->method = strdup(method);
    s->resp_desc = resp_desc;
    s->fn = fn;
    s->ud = ud;
    s->status_details = grpc_empty_slice();
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    grpc_metadata_array_init(&s->init_md);
    grpc_metadata_array_init(&s->trailing);

    size_t cap = 0;
    hyla_status st = HYLA_OK;
    if (o.tenant)
        st = add_md(s, &cap, HYLA_RPC_TENANT_KEY, o.tenant);
    int own_auth = 0;
    for (const char *const *kv = o.metadata; kv && kv[0]; kv += 2)
        if (strcmp(kv[0], HYLA_RPC_AUTH_KEY) == 0)
            own_auth = 1;
    if (st == HYLA_OK && !own_auth && c->bearer)
        st = add_md(s, &cap, HYLA_RPC_AUTH_KEY, c->bearer);
    for (const char *const *kv = o.metadata; st == HYLA_OK && kv && kv[0]; kv += 2) {
        if (!kv[1]) {
            st = hyla_fail(HYLA_ERR_INVALID_ARG, "rpc: metadata key '%s' without a value", kv[0]);
            break;
        }
        st = add_md(s, &cap, kv[0], kv[1]);
    }
    pthread_mutex_lock(&c->mu);
    c->live++;
    pthread_mutex_unlock(&c->mu);
    if (st != HYLA_OK) {
        stream_free(s);
        return st;
    }

    grpc_slice mslice = grpc_slice_from_copied_string(method);
    s->call = grpc_channel_create_call(c->ch, NULL, GRPC_PROPAGATE_DEFAULTS, c->cq, mslice, NULL,
                                       rpc_deadline_from_ms(o.timeout_ms), NULL);
    grpc_slice_unref(mslice);
    if (!s->call) {
        stream_free(s);
        return hyla_fail(HYLA_ERR_INTERNAL, "rpc: cannot create a call of %s on %s", method, c->target);
    }

    pthread_mutex_lock(&s->mu);
    s->refs = 1; /* the user's handle */
    s->user_hold = 1;
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_SEND_INITIAL_METADATA;
    op.data.send_initial_metadata.count = s->n_md;
    op.data.send_initial_metadata.metadata = s->md;
    if (o.wait_for_ready)
        op.flags = GRPC_INITIAL_METADATA_WAIT_FOR_READY | GRPC_INITIAL_METADATA_WAIT_FOR_READY_EXPLICITLY_SET;
    s->refs++;
    int bad = rpc_start_batch(s->call, &op, 1, &s->t_start, "send initial metadata");
    if (bad)
        s->refs--;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    op.data.recv_status_on_client.trailing_metadata = &s->trailing;
    op.data.recv_status_on_client.status = &s->status;
    op.data.recv_status_on_client.status_details = &s->status_details;
    s->refs++;
    if (rpc_start_batch(s->call, &op, 1, &s->t_close, "recv status")) {
        /* Without a status batch the call cannot end: report it as over now. */
        s->refs--;
        s->status_done = 1;
        s->recv_eof = 1;
        s->code = HYLA_RPC_INTERNAL;
        s->message = strdup("the gRPC core refused to start the call");
        bad = 1;
    }
    if (bad)
        grpc_call_cancel(s->call, NULL);
    else
        post_recv_locked(s);
    pthread_mutex_unlock(&s->mu);

    pthread_mutex_lock(&c->mu);
    c->user_streams++;
    pthread_mutex_unlock(&c->mu);
    *out = s;
    return HYLA_OK;
}

hyla_status hyla_rpc_stream_open(hyla_rpc_client *c, const char *method,
                                 const ProtobufCMessageDescriptor *resp_desc,
                                 const hyla_rpc_call_opts *opts, hyla_rpc_stream **out) {
    return open_common(c, method, resp_desc, opts, NULL, NULL, out);
}

hyla_status hyla_rpc_stream_open_async(hyla_rpc_client *c, const char *method,
                                       const ProtobufCMessageDescriptor *resp_desc,
                                       const hyla_rpc_call_opts *opts, hyla_rpc_stream_fn fn, void *ud,
                                       hyla_rpc_stream **out) {
    HYLA_ASSERT(fn);
    return open_common(c, method, resp_desc, opts, fn, ud, out);
}

/* The call's final status as a hyla_status with a detail message (s->mu held, status_done). */
static hyla_status final_status_locked(hyla_rpc_stream *s) {
    if (s->code == HYLA_RPC_OK)
        return HYLA_OK;
    return hyla_fail(hyla_rpc_status_from_code(s->code), "%s: %s: %s", s->method, hyla_rpc_code_name(s->code),
                     s->message && s->message[0] ? s->message : "(no message)");
}

static hyla_status write_bb(hyla_rpc_stream *s, grpc_byte_buffer *bb) {
    pthread_mutex_lock(&s->mu);
    HYLA_ASSERT(s->user_hold);
    hyla_status st = HYLA_OK;
    if (s->status_done) {
        st = final_status_locked(s);
        if (st == HYLA_OK)
            st = hyla_fail(HYLA_ERR_CANCELLED, "%s: the call is over", s->method);
    } else if (s->close_requested) {
        st = hyla_fail(HYLA_ERR_INVALID_ARG, "%s: write after close_send", s->method);
    } else if (s->broken) {
        st = hyla_fail(HYLA_ERR_UNAVAILABLE, "%s: the call failed while sending", s->method);
    }
    if (st != HYLA_OK) {
        pthread_mutex_unlock(&s->mu);
        grpc_byte_buffer_destroy(bb);
        return st;
    }
    rpc_out_push(&s->q_head, &s->q_tail, &s->q_len, bb);
    kick_send_locked(s);
    if (!rpc_on_loop_thread) {
        while (s->q_len >= (size_t)s->cl->p.max_queued_writes && !s->status_done && !s->broken)
            pthread_cond_wait(&s->cv, &s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return HYLA_OK;
}

hyla_status hyla_rpc_stream_write(hyla_rpc_stream *s, const ProtobufCMessage *msg) {
    HYLA_ASSERT(s && msg);
    grpc_byte_buffer *bb;
    HYLA_TRY(rpc_pack(msg, s->cl->p.max_message_bytes, "request", &bb));
    return write_bb(s, bb);
}

hyla_status hyla_rpc_stream_write_raw(hyla_rpc_stream *s, const void *data, size_t len) {
    HYLA_ASSERT(s && (data || len == 0));
    grpc_byte_buffer *bb;
    HYLA_TRY(rpc_pack_raw(data, len, s->cl->p.max_message_bytes, "raw request", &bb));
    return write_bb(s, bb);
}

hyla_status hyla_rpc_stream_close_send(hyla_rpc_stream *s) {
    HYLA_ASSERT(s);
    pthread_mutex_lock(&s->mu);
    s->close_requested = 1;
    kick_send_locked(s);
    pthread_mutex_unlock(&s->mu);
    return HYLA_OK;
}

hyla_status hyla_rpc_stream_read(hyla_rpc_stream *s, ProtobufCMessage **out) {
    HYLA_ASSERT(s && out && !s->fn);
    HYLA_ASSERT(!rpc_on_loop_thread); /* blocking on a loop thread would stall it */
    *out = NULL;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        grpc_byte_buffer *bb = rpc_out_pop(&s->in_head, &s->in_tail, &s->in_len);
        if (bb) {
            maybe_post_recv_locked(s);
            pthread_mutex_unlock(&s->mu);
            size_t len = 0;
            ProtobufCMessage *m = rpc_unpack(s->resp_desc, bb, &len);
            grpc_byte_buffer_destroy(bb);
            if (m) {
                *out = m;
                return HYLA_OK;
            }
            pthread_mutex_lock(&s->mu);
            bad_response_locked(s, len);
            pthread_mutex_unlock(&s->mu);
            return hyla_fail(HYLA_ERR_FORMAT, "%s: malformed response: %zu bytes do not decode as %s",
                             s->method, len, s->resp_desc->name);
        }
        if (s->recv_eof && s->status_done) {
            hyla_status st = final_status_locked(s);
            pthread_mutex_unlock(&s->mu);
            return st;
        }
        maybe_post_recv_locked(s);
        pthread_cond_wait(&s->cv, &s->mu);
    }
}

hyla_status hyla_rpc_stream_finish(hyla_rpc_stream *s, hyla_rpc_result *res) {
    HYLA_ASSERT(s);
    HYLA_ASSERT(!rpc_on_loop_thread);
    pthread_mutex_lock(&s->mu);
    s->close_requested = 1;
    kick_send_locked(s);
    s->discard = 1;
    rpc_out_free_all(&s->in_head, &s->in_tail, &s->in_len);
    maybe_post_recv_locked(s);
    while (!s->status_done)
        pthread_cond_wait(&s->cv, &s->mu);
    if (res) {
        res->code = s->code;
        snprintf(res->message, sizeof res->message, "%s", s->message ? s->message : "");
    }
    hyla_status st = final_status_locked(s);
    pthread_mutex_unlock(&s->mu);
    return st;
}

void hyla_rpc_stream_cancel(hyla_rpc_stream *s) {
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    if (!s->status_done)
        grpc_call_cancel(s->call, NULL);
    pthread_mutex_unlock(&s->mu);
}

int hyla_rpc_stream_result(hyla_rpc_stream *s, hyla_rpc_result *res) {
    pthread_mutex_lock(&s->mu);
    int done = s->status_done;
    if (done && res) {
        res->code = s->code;
        snprintf(res->message, sizeof res->message, "%s", s->message ? s->message : "");
    }
    pthread_mutex_unlock(&s->mu);
    return done;
}

const char *hyla_rpc_stream_trailer(hyla_rpc_stream *s, const char *key) {
    pthread_mutex_lock(&s->mu);
    const char *v = s->status_done ? rpc_kv_find(s->trailers, s->n_trailers, key) : NULL;
    pthread_mutex_unlock(&s->mu);
    return v;
}

void hyla_rpc_stream_destroy(hyla_rpc_stream *s) {
    if (!s)
        return;
    hyla_rpc_client *c = s->cl;
    pthread_mutex_lock(&s->mu);
    HYLA_ASSERT(s->user_hold);
    s->user_hold = 0;
    if (!s->status_done)
        grpc_call_cancel(s->call, NULL);
    s->detached = 1;
    s->discard = 1;
    rpc_out_free_all(&s->in_head, &s->in_tail, &s->in_len);
    while (s->cb_running && !pthread_equal(s->cb_thread, pthread_self()))
        pthread_cond_wait(&s->cv, &s->mu);
    stream_unref_unlock(s);
    pthread_mutex_lock(&c->mu);
    c->user_streams--;
    pthread_mutex_unlock(&c->mu);
}

/* ---------------------------------------------------------------------------------------- */
/* unary                                                                                     */

hyla_status hyla_rpc_client_unary(hyla_rpc_client *c, const char *method, const ProtobufCMessage *req,
                                  const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **resp,
                                  const hyla_rpc_call_opts *opts, hyla_rpc_result *res) {
    HYLA_ASSERT(c && method && req && resp_desc && resp);
    *resp = NULL;
    hyla_rpc_result local;
    if (!res)
        res = &local;
    res->code = HYLA_RPC_OK;
    res->message[0] = 0;

    hyla_rpc_stream *s = NULL;
    hyla_status st = hyla_rpc_stream_open(c, method, resp_desc, opts, &s);
    if (st == HYLA_OK)
        st = hyla_rpc_stream_write(s, req);
    if (st == HYLA_OK)
        st = hyla_rpc_stream_close_send(s);
    if (st != HYLA_OK && s && hyla_rpc_stream_result(s, NULL)) {
        /* the write failed because the call is over: report the server's status */
        st = hyla_rpc_stream_finish(s, res);
    } else if (st != HYLA_OK) {
        res->code = hyla_rpc_code_from_status(st);
        snprintf(res->message, sizeof res->message, "%s", hyla_last_error());
    } else {
        ProtobufCMessage *m = NULL;
        st = hyla_rpc_stream_read(s, &m);
        if (st == HYLA_OK && !m)
            st = hyla_fail(HYLA_ERR_INTERNAL, "%s: the server sent OK without a response", method);
        hyla_status fs = hyla_rpc_stream_finish(s, res);
        if (st == HYLA_OK && fs != HYLA_OK)
            st = fs;
        if (st == HYLA_OK) {
            *resp = m;
        } else {
            if (m)
                protobuf_c_message_free_unpacked(m, NULL);
            if (res->code == HYLA_RPC_OK) { /* a local failure (e.g. malformed response) */
                res->code = hyla_rpc_code_from_status(st);
                snprintf(res->message, sizeof res->message, "%s", hyla_last_error());
            }
        }
    }
    if (st != HYLA_OK && res->code != HYLA_RPC_OK)
        st = hyla_fail(hyla_rpc_status_from_code(res->code), "%s: %s: %s", method, hyla_rpc_code_name(res->code),
                       res->message[0] ? res->message : "(no message)");
    hyla_rpc_stream_destroy(s);
    return st;
}
