/* hyla_coord_relay.c — the relayed streams: Generate (server streaming) and Append (client
 * streaming) are opened on the session's owner (stage 0 of its group) and relayed both ways.
 *
 * A relay joins two calls: the client's (hyla_rpc_call) and an async stream to the worker
 * (hyla_rpc_stream). The worker's messages are forwarded as they come; the worker's final status
 * ends the client's call with the same code, and a failure carries the trailer
 * x-hyla-tokens-delivered (the tokens the client was sent). A client that goes away cancels the
 * worker stream. Append buffers the client's chunks in a queue that a job thread writes to the
 * worker with back-pressure: past APPEND_QUEUE_HOLD chunks, reading from the client pauses.
 *
 * Invariants: a relay is reference-counted (the call's user data, the opening job, the worker
 * stream); the client's call is finished exactly once (released). The session is held busy only
 * while the stream is opened (placement), not while it runs.
 * Threading: rpc loop threads deliver client events and worker messages; one job thread per
 * relay opens the worker stream (and, for Append, writes the chunks). r->mu and c->mu are never
 * held together. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hyla_coord_impl.h"
#include "hyla_log.h"
#include "hyla_thread.h"

#define APPEND_QUEUE_HOLD 8   /* client chunks buffered before reading from the client pauses */
#define APPEND_QUEUE_RESUME 2

typedef struct {
    hyla_coord *c;
    hyla_rpc_call *call;
    hyla_rpc_stream *ws; /* destroyed with the relay, so a writer holding a reference can use it */
    ProtobufCMessage *req; /* Generate: the request, for the job */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;
    int ws_over;    /* the worker's call ended (its final callback ran) */
    int released;   /* the call was replied/failed */
    int cancelled;  /* the client's call ended (DONE) */
    uint32_t delivered;
    uint64_t last_position; /* the session's position in the worker's last message */
    uint64_t last_generated; /* Generate: the session's generated count in the worker's last message */
    uint64_t epoch;         /* placement epoch the worker stream was opened under */
    int have_position;
    char session[SID_MAX], tenant[ID_MAX], owner[ID_MAX];
    /* Append: client chunks waiting for the writer job */
    struct chunk {
        struct chunk *next;
        size_t len;
        uint8_t data[];
    } *head, *tail;
    int qlen, half_closed, held, job_started;
    int quota_gen; /* counted in the tenant's running Generate calls */
} relay;

static relay *relay_new(hyla_coord *c, hyla_rpc_call *call) {
    relay *r = calloc(1, sizeof *r);
    HYLA_ASSERT(r);
    r->c = c;
    r->call = call;
    r->refs = 1; /* the call's user data */
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    pthread_mutex_lock(&c->mu);
    c->relays++;
    pthread_mutex_unlock(&c->mu);
    return r;
}

static void relay_unref(void *p) {
    relay *r = p;
    pthread_mutex_lock(&r->mu);
    int last = --r->refs == 0;
    pthread_mutex_unlock(&r->mu);
    if (!last)
        return;
    while (r->head) {
        struct chunk *k = r->head;
        r->head = k->next;
        free(k);
    }
    if (r->req)
        protobuf_c_message_free_unpacked(r->req, NULL);
    hyla_rpc_stream_destroy(r->ws); /* may run inside the stream's own final callback: allowed */
    hyla_coord *c = r->c;
    if (r->quota_gen)
        coord_quota_generate_leave(c, r->tenant);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    free(r);
    hyla_count_down(&c->mu, &c->cv, &c->relays);
}

/* Finish the client's call once (r->mu held; released around the rpc call). */
static void relay_finish_locked(relay *r, hyla_rpc_code code, const char *msg) {
    if (r->released)
        return;
    r->released = 1;
    hyla_rpc_call *call = r->call;
    pthread_mutex_unlock(&r->mu);
    if (code == HYLA_RPC_OK) {
        hyla_rpc_call_reply(call, NULL);
    } else {
        char n[32];
        snprintf(n, sizeof n, "%u", r->delivered);
        hyla_rpc_call_set_trailer(call, HYLA_API_TOKENS_DELIVERED_KEY, n);
        hyla_rpc_call_fail(call, code, "%s", msg);
    }
    pthread_mutex_lock(&r->mu);
}

/* Finish the client's call once with a coordinator-side failure (the status on this thread) and
 * cancel the worker's call if it is open (r->mu held). */
static void relay_fail_locked(relay *r, hyla_status st) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", hyla_last_error());
    relay_finish_locked(r, coord_rpc_code(st), msg);
    /* the worker's call must end too, or its session stays busy with a call nobody feeds */
    r->cancelled = 1;
    if (r->ws && !r->ws_over)
        hyla_rpc_stream_cancel(r->ws);
    pthread_cond_broadcast(&r->cv);
}

/* After a Generate the client cancelled (or whose deadline passed): the worker's final status
 * never reaches us (we cancelled its call too), and it may have sampled tokens after the last
 * one we saw. Ask it, once it has stopped, what the session holds. */
typedef struct {
    hyla_coord *c;
    char session[SID_MAX], owner[ID_MAX];
    uint64_t epoch;
} refresh_job;

static void *refresh_main(void *arg) {
    refresh_job *j = arg;
    hyla_coord *c = j->c;
    for (int tries = 0; tries < 100; tries++) { /* the worker ends the job at its next step */
        Hyla__V1__DescribeSessionRequest q = HYLA__V1__DESCRIBE_SESSION_REQUEST__INIT;
        q.session_id = j->session;
        ProtobufCMessage *resp = NULL;
        hyla_rpc_result res;
        if (coord_call_worker(c, j->owner, SVC_WORKER "DescribeSession", &q.base,
                              &hyla__v1__worker_session_response__descriptor, &resp, &res) != HYLA_OK)
            break;
        const Hyla__V1__WorkerSessionStatus *ws = ((const Hyla__V1__WorkerSessionResponse *)resp)->session;
        int busy = ws && ws->busy, done = 0;
        if (ws && !busy) {
            pthread_mutex_lock(&c->mu);
            csess *cs = coord_sess_find(c, j->session);
            if (cs && cs->epoch == j->epoch && ws->placement_epoch == j->epoch) {
                cs->position = ws->position;
                cs->generated = ws->generated;
            }
            pthread_mutex_unlock(&c->mu);
            done = 1;
        }
        protobuf_c_message_free_unpacked(resp, NULL);
        if (done || !ws)
            break;
        struct timespec t = {0, 10 * 1000000L};
        nanosleep(&t, NULL);
    }
    free(j);
    coord_job_done(c);
    return NULL;
}

/* Worker responses -> the client. msg NULL: the worker's call is over. */
static void relay_on_worker(hyla_rpc_stream *ws, const ProtobufCMessage *msg, void *ud) {
    relay *r = ud;
    pthread_mutex_lock(&r->mu);
    if (msg) {
        if (msg->descriptor == &hyla__v1__generate_response__descriptor) {
            const Hyla__V1__GenerateResponse *g = (const Hyla__V1__GenerateResponse *)msg;
            r->delivered += (uint32_t)g->n_token_ids;
            r->last_position = g->position;
            r->last_generated = g->generated;
            r->have_position = 1;
        } else if (msg->descriptor == &hyla__v1__append_progress__descriptor) {
            r->last_position = ((const Hyla__V1__AppendProgress *)msg)->position;
            r->have_position = 1;
        }
        if (!r->released && hyla_rpc_call_send(r->call, msg) != HYLA_OK)
            hyla_rpc_stream_cancel(ws); /* the client is gone */
        pthread_mutex_unlock(&r->mu);
        return;
    }
    hyla_rpc_result res;
    hyla_rpc_stream_result(ws, &res);
    r->ws_over = 1;
    int have = r->have_position;
    uint64_t pos = r->last_position, generated = r->last_generated, epoch = r->epoch;
    int is_generate = r->req != NULL;
    /* A Generate the client cancelled: the worker may have sent tokens after the last one that
     * reached us; its trailer says how many the session kept in all. */
    const char *kept_s = is_generate && res.code != HYLA_RPC_OK
                             ? hyla_rpc_stream_trailer(ws, HYLA_API_TOKENS_DELIVERED_KEY) : NULL;
    uint64_t kept = kept_s ? strtoull(kept_s, NULL, 10) : 0;
    if (kept_s && have && kept > r->delivered) {
        pos += kept - r->delivered;
        generated += kept - r->delivered;
    }
    relay_finish_locked(r, res.code, res.message);
    refresh_job *rj = NULL;
    if (is_generate && r->cancelled && r->owner[0]) {
        rj = calloc(1, sizeof *rj);
        HYLA_ASSERT(rj);
        rj->c = r->c;
        coord_copy_str(rj->session, sizeof rj->session, r->session);
        coord_copy_str(rj->owner, sizeof rj->owner, r->owner);
        rj->epoch = epoch;
    }
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    if (have) { /* keep the directory current without waiting for a heartbeat (c->mu after r->mu is released) */
        pthread_mutex_lock(&r->c->mu);
        csess *cs = coord_sess_find(r->c, r->session);
        if (cs && cs->epoch == epoch) { /* not re-placed (Migrate, failure) meanwhile */
            cs->position = pos;
            if (is_generate && generated) /* the worker's count: heartbeats report the same one */
                cs->generated = generated;
        }
        pthread_mutex_unlock(&r->c->mu);
    }
    if (rj && coord_spawn(r->c, refresh_main, rj) != 0)
        free(rj); /* the next heartbeat corrects the record instead */
    relay_unref(r); /* the stream's reference */
}

/* Open the worker stream of a relay (no lock held); on failure finishes the call. */
static int relay_open(relay *r, const char *method, const ProtobufCMessageDescriptor *resp_desc) {
    hyla_coord *c = r->c;
    char owner[ID_MAX];
    csess *s = NULL;
    hyla_status st = coord_acquire(c, r->session, r->tenant, &s);
    uint64_t epoch = 0;
    if (st == HYLA_OK) {
        st = coord_ensure_active(c, s, owner, &epoch);
        pthread_mutex_lock(&c->mu);
        if (st == HYLA_OK && s->paused) { /* a call on a paused session resumes it */
            s->paused = 0;
            coord_persist_locked(c, s, 0, 0);
        }
        pthread_mutex_unlock(&c->mu);
        coord_release(c, s);
    }
    hyla_rpc_client *cl = NULL;
    if (st == HYLA_OK) {
        pthread_mutex_lock(&c->mu);
        cworker *w = coord_worker_find(c, owner);
        cl = w ? w->client : NULL;
        pthread_mutex_unlock(&c->mu);
        if (!cl)
            st = hyla_fail(HYLA_ERR_UNAVAILABLE, "worker %s vanished", owner);
    }
    pthread_mutex_lock(&r->mu);
    r->epoch = epoch;
    if (st == HYLA_OK)
        coord_copy_str(r->owner, sizeof r->owner, owner);
    if (st == HYLA_OK && r->cancelled)
        st = hyla_fail(HYLA_ERR_CANCELLED, "cancelled");
    if (st == HYLA_OK) {
        hyla_rpc_call_opts o = {0, NULL, NULL, 0};
        int64_t left = hyla_rpc_call_deadline_ms(r->call);
        o.timeout_ms = left < 0 ? 0 : (left == 0 ? 1 : left);
        r->refs++; /* the stream's, dropped by its final callback */
        if (hyla_rpc_stream_open_async(cl, method, resp_desc, &o, relay_on_worker, r, &r->ws) != HYLA_OK) {
            r->ws = NULL;
            r->refs--;
            st = hyla_fail_wrap(HYLA_ERR_INTERNAL, "opening %s", method);
        }
    }
    if (st != HYLA_OK)
        relay_fail_locked(r, st);
    pthread_mutex_unlock(&r->mu);
    return st == HYLA_OK;
}

static void *generate_main(void *arg) {
    relay *r = arg;
    hyla_coord *c = r->c;
    if (relay_open(r, SVC_WORKER "Generate", &hyla__v1__generate_response__descriptor)) {
        hyla_rpc_stream_write(r->ws, r->req); /* never blocks: one message */
        hyla_rpc_stream_close_send(r->ws);
    }
    relay_unref(r); /* the job's */
    coord_job_done(c);
    return NULL;
}

void coord_h_generate(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *msg, void *ud) {
    binding *b = ud;
    if (ev == HYLA_RPC_EV_DONE) {
        relay *r = hyla_rpc_call_user(call);
        if (r && hyla_rpc_call_cancelled(call)) {
            pthread_mutex_lock(&r->mu);
            r->cancelled = 1;
            if (r->ws)
                hyla_rpc_stream_cancel(r->ws);
            pthread_cond_broadcast(&r->cv);
            pthread_mutex_unlock(&r->mu);
        }
        return;
    }
    if (ev != HYLA_RPC_EV_START)
        return;
    const Hyla__V1__GenerateRequest *q = (const Hyla__V1__GenerateRequest *)msg;
    char tenant[ID_MAX];
    if (!coord_get_tenant(call, tenant))
        return;
    hyla_status st = coord_check_session_id(q->session_id);
    if (st == HYLA_OK && q->max_tokens == 0)
        st = hyla_fail(HYLA_ERR_INVALID_ARG, "field max_tokens: must be >= 1");
    if (st == HYLA_OK)
        st = coord_check_sampling(q->sampling);
    for (size_t i = 0; i < q->n_stop && st == HYLA_OK; i++)
        if (!q->stop[i] || !q->stop[i][0])
            st = hyla_fail(HYLA_ERR_INVALID_ARG, "field stop[%zu]: a stop sequence may not be empty", i);
    if (st == HYLA_OK)
        st = coord_quota_generate_enter(b->c, tenant);
    if (st != HYLA_OK) {
        coord_answer_error(call, st);
        return;
    }
    relay *r = relay_new(b->c, call);
    r->quota_gen = 1; /* relay_unref leaves the quota */
    coord_copy_str(r->session, sizeof r->session, q->session_id);
    coord_copy_str(r->tenant, sizeof r->tenant, tenant);
    r->req = hyla_rpc_message_dup(msg);
    r->refs++; /* the job's */
    hyla_rpc_call_set_user(call, r, relay_unref);
    if (coord_spawn(b->c, generate_main, r) != 0) {
        relay_unref(r);
        pthread_mutex_lock(&r->mu);
        relay_fail_locked(r, hyla_fail(HYLA_ERR_RESOURCE, "coordinator: cannot start a thread for the call"));
        pthread_mutex_unlock(&r->mu);
    }
}

static void *append_main(void *arg) {
    relay *r = arg;
    hyla_coord *c = r->c;
    if (relay_open(r, SVC_WORKER "Append", &hyla__v1__append_progress__descriptor)) {
        for (;;) {
            pthread_mutex_lock(&r->mu);
            while (!r->head && !r->half_closed && !r->cancelled && !r->ws_over)
                pthread_cond_wait(&r->cv, &r->mu);
            hyla_rpc_stream *ws = r->ws_over ? NULL : r->ws;
            struct chunk *k = NULL;
            if (ws && !r->cancelled && r->head) {
                k = r->head;
                r->head = k->next;
                if (!r->head)
                    r->tail = NULL;
                r->qlen--;
            }
            int resume = r->held && r->qlen <= APPEND_QUEUE_RESUME && !r->released;
            if (resume)
                r->held = 0;
            int close = ws && !k && r->half_closed && !r->cancelled;
            /* r->ws lives as long as the relay, and this job holds a reference to it; the write
             * may block (back-pressure), so not under r->mu, which the stream's callbacks take. */
            pthread_mutex_unlock(&r->mu);
            if (resume)
                hyla_rpc_call_read_resume(r->call);
            if (!ws || (!k && !close))
                break;
            if (close) {
                hyla_rpc_stream_close_send(ws);
                break;
            }
            hyla_status st = hyla_rpc_stream_write_raw(ws, k->data, k->len);
            free(k);
            if (st != HYLA_OK)
                break; /* the worker's call is over: its final callback finishes ours */
        }
    }
    relay_unref(r);
    coord_job_done(c);
    return NULL;
}

void coord_h_append(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *msg, void *ud) {
    binding *b = ud;
    relay *r = hyla_rpc_call_user(call);
    switch (ev) {
    case HYLA_RPC_EV_START: {
        char tenant[ID_MAX];
        if (!coord_get_tenant(call, tenant))
            return;
        hyla_status qs = coord_quota_check_bytes(b->c, tenant);
        if (qs != HYLA_OK) {
            coord_answer_error(call, qs);
            return;
        }
        r = relay_new(b->c, call);
        coord_copy_str(r->tenant, sizeof r->tenant, tenant);
        hyla_rpc_call_set_user(call, r, relay_unref);
        return;
    }
    case HYLA_RPC_EV_MESSAGE: {
        if (!r)
            return;
        const Hyla__V1__AppendRequest *q = (const Hyla__V1__AppendRequest *)msg;
        pthread_mutex_lock(&r->mu);
        if (r->released) {
            pthread_mutex_unlock(&r->mu);
            return;
        }
        if (!r->job_started) {
            if (hyla_session_id_check(q->session_id, "Append: the first message's session_id") != HYLA_OK) {
                relay_fail_locked(r, HYLA_ERR_INVALID_ARG);
                pthread_mutex_unlock(&r->mu);
                return;
            }
            coord_copy_str(r->session, sizeof r->session, q->session_id);
        } else if (q->session_id && q->session_id[0] && strcmp(q->session_id, r->session) != 0) {
            relay_fail_locked(r, hyla_fail(HYLA_ERR_INVALID_ARG, "Append: a later message names another session"));
            pthread_mutex_unlock(&r->mu);
            return;
        }
        size_t n = protobuf_c_message_get_packed_size(msg);
        struct chunk *k = malloc(sizeof *k + n);
        HYLA_ASSERT(k);
        k->next = NULL;
        k->len = n;
        protobuf_c_message_pack(msg, k->data);
        if (r->tail)
            r->tail->next = k;
        else
            r->head = k;
        r->tail = k;
        r->qlen++;
        if (r->qlen >= APPEND_QUEUE_HOLD && !r->held) {
            r->held = 1;
            hyla_rpc_call_read_hold(call);
        }
        pthread_cond_broadcast(&r->cv);
        int start = !r->job_started;
        if (start) {
            r->job_started = 1;
            r->refs++; /* the job's */
        }
        pthread_mutex_unlock(&r->mu);
        if (start && coord_spawn(b->c, append_main, r) != 0) {
            relay_unref(r);
            pthread_mutex_lock(&r->mu);
            relay_fail_locked(r, hyla_fail(HYLA_ERR_RESOURCE, "coordinator: cannot start a thread for the call"));
            pthread_mutex_unlock(&r->mu);
        }
        return;
    }
    case HYLA_RPC_EV_HALF_CLOSE:
        if (!r)
            return;
        pthread_mutex_lock(&r->mu);
        r->half_closed = 1;
        if (!r->job_started)
            relay_fail_locked(r, hyla_fail(HYLA_ERR_INVALID_ARG,
                                           "Append: the stream ended without a message naming the session"));
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
        return;
    case HYLA_RPC_EV_DONE:
        if (!r)
            return;
        pthread_mutex_lock(&r->mu);
        if (hyla_rpc_call_cancelled(call)) {
            r->cancelled = 1;
            if (r->ws)
                hyla_rpc_stream_cancel(r->ws);
        }
        if (!r->job_started) /* nobody else will release it */
            relay_fail_locked(r, hyla_fail(HYLA_ERR_CANCELLED, "cancelled"));
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
        return;
    }
}
