/* test_rpc.c — common/rpc/ end to end: a real gRPC server on 127.0.0.1:<ephemeral> in this
 * process, serving the Echo test service (tests/proto/test_rpc.proto), and the hyla_rpc client.
 *
 * Covers: unary OK and error codes, unknown methods, server streaming (blocking and async
 * reads), client streaming (with read_hold / read_resume), bidi, deadlines, client cancellation
 * seen by the server, message size limits on both sides, malformed request bytes (the server
 * answers INVALID_ARGUMENT and keeps serving), concurrent callers, and shutdown with calls in
 * flight (held calls and a producer thread) completing cleanly.
 *
 * Threading: the server's handlers run on its loop threads; helper threads stand for a
 * worker's scheduler (they send and reply from outside the loop). */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hyla_rpc.h"
#include "hyla_test.h"
#include "test_rpc.pb-c.h"

#define M_UNARY "/hyla.test.Echo/Unary"
#define M_SSTREAM "/hyla.test.Echo/ServerStream"
#define M_CSTREAM "/hyla.test.Echo/ClientStream"
#define M_BIDI "/hyla.test.Echo/Bidi"
#define M_HANG "/hyla.test.Echo/Hang"

typedef Hyla__Test__EchoRequest EchoRequest;
typedef Hyla__Test__EchoReply EchoReply;
#define REQ_DESC (&hyla__test__echo_request__descriptor)
#define REP_DESC (&hyla__test__echo_reply__descriptor)

static atomic_int g_done_cancelled;  /* DONE events with cancelled set */
static atomic_int g_done_total;      /* DONE events */
static atomic_int g_hang_started;    /* Hang calls that reached START */
static atomic_int g_producers;       /* helper threads still running */

static void sleep_ms(int ms) {
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Wait until *v >= target or ms pass; returns whether it got there. */
static int wait_atomic(atomic_int *v, int target, int ms) {
    double end = now_s() + ms / 1000.0;
    while (atomic_load(v) < target) {
        if (now_s() > end)
            return 0;
        sleep_ms(2);
    }
    return 1;
}

/* Wait until *v == 0 or ms pass. */
static int wait_zero(atomic_int *v, int ms) {
    double end = now_s() + ms / 1000.0;
    while (atomic_load(v) != 0) {
        if (now_s() > end)
            return 0;
        sleep_ms(2);
    }
    return 1;
}

/* ---------------------------------------------------------------------------------------- */
/* the Echo service                                                                          */

static void count_done(hyla_rpc_call *call) {
    atomic_fetch_add(&g_done_total, 1);
    if (hyla_rpc_call_cancelled(call))
        atomic_fetch_add(&g_done_cancelled, 1);
}

typedef struct {
    hyla_rpc_call *call;
    int delay_ms, count, fail_code;
    char text[64];
} job;

static void *unary_later(void *arg) {
    job *j = arg;
    sleep_ms(j->delay_ms);
    EchoReply r = HYLA__TEST__ECHO_REPLY__INIT;
    r.text = j->text;
    hyla_rpc_call_reply(j->call, &r.base); /* after a cancel this sends nothing, and releases */
    free(j);
    atomic_fetch_sub(&g_producers, 1);
    return NULL;
}

static void *produce(void *arg) {
    job *j = arg;
    int i = 0;
    for (; i < j->count; i++) {
        EchoReply r = HYLA__TEST__ECHO_REPLY__INIT;
        r.text = j->text;
        r.index = i;
        if (hyla_rpc_call_send(j->call, &r.base) != HYLA_OK)
            break; /* the call is over (cancelled, shutdown) */
        if (j->delay_ms)
            sleep_ms(j->delay_ms);
    }
    if (i < j->count)
        hyla_rpc_call_fail(j->call, HYLA_RPC_CANCELLED, "producer stopped at %d", i);
    else if (j->fail_code)
        hyla_rpc_call_fail(j->call, (hyla_rpc_code)j->fail_code, "asked to fail after %d replies", i);
    else
        hyla_rpc_call_reply(j->call, NULL);
    free(j);
    atomic_fetch_sub(&g_producers, 1);
    return NULL;
}

static void spawn(void *(*fn)(void *), job *j) {
    pthread_t t;
    atomic_fetch_add(&g_producers, 1);
    HYLA_ASSERT(pthread_create(&t, NULL, fn, j) == 0);
    pthread_detach(t);
}

static job *new_job(hyla_rpc_call *call, const EchoRequest *q) {
    job *j = calloc(1, sizeof *j);
    HYLA_ASSERT(j);
    j->call = call;
    j->delay_ms = q->delay_ms;
    j->count = q->count;
    j->fail_code = q->fail_code;
    snprintf(j->text, sizeof j->text, "%s", q->text);
    return j;
}

static void h_unary(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *msg, void *ud) {
    (void)ud;
    if (ev == HYLA_RPC_EV_DONE) {
        count_done(call);
        return;
    }
    if (ev != HYLA_RPC_EV_START)
        return;
    const EchoRequest *q = (const EchoRequest *)msg;
    if (q->fail_code) {
        hyla_rpc_call_fail(call, (hyla_rpc_code)q->fail_code, "asked to fail: %s", q->text);
        return;
    }
    if (q->delay_ms > 0) {
        spawn(unary_later, new_job(call, q));
        return;
    }
    EchoReply r = HYLA__TEST__ECHO_REPLY__INIT;
    r.text = q->text;
    const char *tenant = hyla_rpc_call_metadata(call, HYLA_RPC_TENANT_KEY);
    r.tenant = (char *)(tenant ? tenant : "");
    r.deadline_ms = hyla_rpc_call_deadline_ms(call);
    uint8_t *buf = NULL;
    if (q->reply_bytes > 0) {
        buf = calloc((size_t)q->reply_bytes, 1);
        r.payload.data = buf;
        r.payload.len = (size_t)q->reply_bytes;
    }
    r.count = (int32_t)q->payload.len;
    hyla_rpc_call_reply(call, &r.base);
    free(buf);
}

static void h_sstream(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *msg, void *ud) {
    (void)ud;
    if (ev == HYLA_RPC_EV_DONE) {
        count_done(call);
        return;
    }
    if (ev != HYLA_RPC_EV_START)
        return;
    const EchoRequest *q = (const EchoRequest *)msg;
    if (q->delay_ms > 0) { /* a producer outside the loop, like a scheduler */
        spawn(produce, new_job(call, q));
        return;
    }
    for (int i = 0; i < q->count; i++) {
        EchoReply r = HYLA__TEST__ECHO_REPLY__INIT;
        r.text = q->text;
        r.index = i;
        if (hyla_rpc_call_send(call, &r.base) != HYLA_OK)
            break;
    }
    if (q->fail_code)
        hyla_rpc_call_fail(call, (hyla_rpc_code)q->fail_code, "asked to fail after %d replies", q->count);
    else
        hyla_rpc_call_reply(call, NULL);
}

typedef struct {
    char text[4096];
    int count;
    hyla_rpc_call *call;
    int delay_ms;
} acc;

static void *resume_later(void *arg) {
    acc *a = arg;
    sleep_ms(a->delay_ms);
    hyla_rpc_call_read_resume(a->call);
    atomic_fetch_sub(&g_producers, 1);
    return NULL;
}

static void h_cstream(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *msg, void *ud) {
    (void)ud;
    acc *a = hyla_rpc_call_user(call);
    switch (ev) {
    case HYLA_RPC_EV_START:
        a = calloc(1, sizeof *a);
        a->call = call;
        hyla_rpc_call_set_user(call, a, free);
        break;
    case HYLA_RPC_EV_MESSAGE: {
        const EchoRequest *q = (const EchoRequest *)msg;
        if (q->fail_code) {
            hyla_rpc_call_fail(call, (hyla_rpc_code)q->fail_code, "asked to fail at message %d", a->count);
            a->call = NULL;
            break;
        }
        if (!a->call)
            break;
        strncat(a->text, q->text, sizeof a->text - strlen(a->text) - 1);
        a->count++;
        if (q->delay_ms > 0) { /* back-pressure: stop reading for a while */
            hyla_rpc_call_read_hold(call);
            a->delay_ms = q->delay_ms;
            pthread_t t;
            atomic_fetch_add(&g_producers, 1);
            HYLA_ASSERT(pthread_create(&t, NULL, resume_later, a) == 0);
            pthread_detach(t);
        }
        break;
    }
    case HYLA_RPC_EV_HALF_CLOSE:
        if (a->call) {
            EchoReply r = HYLA__TEST__ECHO_REPLY__INIT;
            r.text = a->text;
            r.count = a->count;
            hyla_rpc_call_reply(call, &r.base);
            a->call = NULL;
        }
        break;
    case HYLA_RPC_EV_DONE:
        count_done(call);
        if (a->call) { /* cancelled before we answered: release */
            hyla_rpc_call_fail(call, HYLA_RPC_CANCELLED, "cancelled");
            a->call = NULL;
        }
        break;
    }
}

static void h_bidi(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *msg, void *ud) {
    (void)ud;
    intptr_t released = (intptr_t)hyla_rpc_call_user(call);
    switch (ev) {
    case HYLA_RPC_EV_START: break;
    case HYLA_RPC_EV_MESSAGE: {
        const EchoRequest *q = (const EchoRequest *)msg;
        EchoReply r = HYLA__TEST__ECHO_REPLY__INIT;
        r.text = q->text;
        r.index = q->count;
        hyla_rpc_call_send(call, &r.base);
        break;
    }
    case HYLA_RPC_EV_HALF_CLOSE:
        if (!released) {
            hyla_rpc_call_set_user(call, (void *)1, NULL);
            hyla_rpc_call_reply(call, NULL);
        }
        break;
    case HYLA_RPC_EV_DONE:
        count_done(call);
        if (!released) {
            hyla_rpc_call_set_user(call, (void *)1, NULL);
            hyla_rpc_call_fail(call, HYLA_RPC_CANCELLED, "cancelled");
        }
        break;
    }
}

static void h_hang(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *msg, void *ud) {
    (void)ud;
    (void)msg;
    if (ev == HYLA_RPC_EV_START) {
        atomic_fetch_add(&g_hang_started, 1); /* before "ready" reaches the client */
        EchoReply r = HYLA__TEST__ECHO_REPLY__INIT;
        r.text = "ready";
        hyla_rpc_call_send(call, &r.base);
    } else if (ev == HYLA_RPC_EV_DONE) {
        count_done(call);
        hyla_rpc_call_fail(call, HYLA_RPC_CANCELLED, "hang ended");
    }
}

static hyla_rpc_server *start_server(int max_bytes, int grace_ms, int *port) {
    hyla_rpc_server_params p = hyla_rpc_server_default_params();
    p.threads = 3;
    p.max_message_bytes = max_bytes;
    p.shutdown_grace_ms = grace_ms;
    hyla_rpc_server *s = NULL;
    CHECK_OK(hyla_rpc_server_create(&p, &s));
    if (!s)
        exit(1);
    CHECK_OK(hyla_rpc_server_add_method(s, M_UNARY, HYLA_RPC_UNARY, REQ_DESC, REP_DESC, h_unary, NULL));
    CHECK_OK(hyla_rpc_server_add_method(s, M_SSTREAM, HYLA_RPC_SERVER_STREAM, REQ_DESC, REP_DESC, h_sstream, NULL));
    CHECK_OK(hyla_rpc_server_add_method(s, M_CSTREAM, HYLA_RPC_CLIENT_STREAM, REQ_DESC, REP_DESC, h_cstream, NULL));
    CHECK_OK(hyla_rpc_server_add_method(s, M_BIDI, HYLA_RPC_BIDI, REQ_DESC, REP_DESC, h_bidi, NULL));
    CHECK_OK(hyla_rpc_server_add_method(s, M_HANG, HYLA_RPC_SERVER_STREAM, REQ_DESC, REP_DESC, h_hang, NULL));
    CHECK(hyla_rpc_server_add_method(s, M_HANG, HYLA_RPC_UNARY, REQ_DESC, REP_DESC, h_hang, NULL) ==
          HYLA_ERR_EXISTS);
    CHECK_OK(hyla_rpc_server_listen(s, "127.0.0.1:0", port));
    CHECK(*port > 0);
    CHECK_OK(hyla_rpc_server_start(s));
    CHECK(hyla_rpc_server_add_method(s, "/x.Y/Z", HYLA_RPC_UNARY, REQ_DESC, REP_DESC, h_unary, NULL) ==
          HYLA_ERR_INVALID_ARG);
    return s;
}

static hyla_rpc_client *connect_client(int port, int max_bytes) {
    char target[64];
    snprintf(target, sizeof target, "127.0.0.1:%d", port);
    hyla_rpc_client_params p = hyla_rpc_client_default_params();
    p.max_message_bytes = max_bytes;
    hyla_rpc_client *c = NULL;
    CHECK_OK(hyla_rpc_client_create(target, &p, &c));
    if (!c)
        exit(1);
    return c;
}

/* ---------------------------------------------------------------------------------------- */
/* the tests                                                                                 */

static void test_mapping(void) {
    /* every hyla_status maps to a code and (mostly) back */
    for (int s = 0; s < HYLA_STATUS_COUNT; s++) {
        hyla_rpc_code c = hyla_rpc_code_from_status((hyla_status)s);
        CHECK(c < HYLA_RPC_CODE_COUNT && c != HYLA_RPC_UNKNOWN);
        CHECK((s == HYLA_OK) == (c == HYLA_RPC_OK));
    }
    CHECK(hyla_rpc_code_from_status(HYLA_ERR_NOT_FOUND) == HYLA_RPC_NOT_FOUND);
    CHECK(hyla_rpc_code_from_status(HYLA_ERR_PERMISSION) == HYLA_RPC_PERMISSION_DENIED);
    CHECK(hyla_rpc_code_from_status(HYLA_ERR_INVALID_ARG) == HYLA_RPC_INVALID_ARGUMENT);
    CHECK(hyla_rpc_code_from_status(HYLA_ERR_RESOURCE) == HYLA_RPC_RESOURCE_EXHAUSTED);
    CHECK(hyla_rpc_code_from_status(HYLA_ERR_UNAVAILABLE) == HYLA_RPC_UNAVAILABLE);
    CHECK(hyla_rpc_code_from_status(HYLA_ERR_CORRUPT) == HYLA_RPC_DATA_LOSS);
    for (int c = 0; c < HYLA_RPC_CODE_COUNT; c++)
        CHECK((hyla_rpc_status_from_code((hyla_rpc_code)c) == HYLA_OK) == (c == HYLA_RPC_OK));
    const hyla_status round[] = {HYLA_ERR_INVALID_ARG, HYLA_ERR_NOT_FOUND, HYLA_ERR_CORRUPT,
                                 HYLA_ERR_UNSUPPORTED, HYLA_ERR_EXISTS, HYLA_ERR_RESOURCE,
                                 HYLA_ERR_PERMISSION, HYLA_ERR_UNAVAILABLE, HYLA_ERR_CANCELLED,
                                 HYLA_ERR_INTERNAL, HYLA_ERR_MISMATCH};
    for (size_t i = 0; i < sizeof round / sizeof round[0]; i++)
        CHECK_MSG(hyla_rpc_status_from_code(hyla_rpc_code_from_status(round[i])) == round[i], "%s",
                  hyla_status_str(round[i]));
    CHECK(strcmp(hyla_rpc_code_name(HYLA_RPC_RESOURCE_EXHAUSTED), "RESOURCE_EXHAUSTED") == 0);
    CHECK(strcmp(hyla_rpc_code_name((hyla_rpc_code)99), "UNKNOWN_CODE") == 0);
}

static void test_unary(hyla_rpc_client *c) {
    EchoRequest q = HYLA__TEST__ECHO_REQUEST__INIT;
    q.text = "hello";
    hyla_rpc_call_opts o = {0};
    o.tenant = "acme";
    o.timeout_ms = 5000;
    ProtobufCMessage *m = NULL;
    hyla_rpc_result res;
    CHECK_OK(hyla_rpc_client_unary(c, M_UNARY, &q.base, REP_DESC, &m, &o, &res));
    CHECK(res.code == HYLA_RPC_OK);
    EchoReply *r = (EchoReply *)m;
    CHECK(r && strcmp(r->text, "hello") == 0);
    CHECK(r && strcmp(r->tenant, "acme") == 0);
    /* the server reads the remaining time off its own clock; gRPC rounds the deadline it puts
     * on the wire up, so a few milliseconds over the 5000 asked for are seen under load */
    CHECK_MSG(r && r->deadline_ms > 3000 && r->deadline_ms <= 5100, "deadline_ms %lld",
              r ? (long long)r->deadline_ms : -2LL);
    if (m)
        protobuf_c_message_free_unpacked(m, NULL);

    /* no deadline, no tenant, extra metadata */
    const char *md[] = {"x-test-a", "1", NULL};
    hyla_rpc_call_opts o2 = {0};
    o2.metadata = md;
    CHECK_OK(hyla_rpc_client_unary(c, M_UNARY, &q.base, REP_DESC, &m, &o2, NULL));
    r = (EchoReply *)m;
    CHECK(r && r->deadline_ms == -1 && strcmp(r->tenant, "") == 0);
    if (m)
        protobuf_c_message_free_unpacked(m, NULL);

    /* a bad metadata key is refused locally */
    const char *bad[] = {"Bad Key", "1", NULL};
    o2.metadata = bad;
    CHECK(hyla_rpc_client_unary(c, M_UNARY, &q.base, REP_DESC, &m, &o2, &res) == HYLA_ERR_INVALID_ARG);
    CHECK(m == NULL && res.code == HYLA_RPC_INVALID_ARGUMENT);

    /* error codes travel with their message */
    const struct {
        int code;
        hyla_status st;
    } errs[] = {{HYLA_RPC_NOT_FOUND, HYLA_ERR_NOT_FOUND},
                {HYLA_RPC_PERMISSION_DENIED, HYLA_ERR_PERMISSION},
                {HYLA_RPC_INVALID_ARGUMENT, HYLA_ERR_INVALID_ARG},
                {HYLA_RPC_RESOURCE_EXHAUSTED, HYLA_ERR_RESOURCE},
                {HYLA_RPC_UNAVAILABLE, HYLA_ERR_UNAVAILABLE},
                {HYLA_RPC_FAILED_PRECONDITION, HYLA_ERR_MISMATCH},
                {HYLA_RPC_DATA_LOSS, HYLA_ERR_CORRUPT},
                {HYLA_RPC_INTERNAL, HYLA_ERR_INTERNAL}};
    for (size_t i = 0; i < sizeof errs / sizeof errs[0]; i++) {
        q.fail_code = errs[i].code;
        q.text = "field session_id";
        hyla_status st = hyla_rpc_client_unary(c, M_UNARY, &q.base, REP_DESC, &m, NULL, &res);
        CHECK_MSG(st == errs[i].st, "%s: got %s", hyla_rpc_code_name((hyla_rpc_code)errs[i].code),
                  hyla_status_str(st));
        CHECK(res.code == (hyla_rpc_code)errs[i].code);
        CHECK_MSG(strstr(res.message, "asked to fail: field session_id") != NULL, "message '%s'", res.message);
        CHECK(strstr(hyla_last_error(), hyla_rpc_code_name(res.code)) != NULL);
        CHECK(m == NULL);
    }

    /* unknown method and unknown service */
    q.fail_code = 0;
    CHECK(hyla_rpc_client_unary(c, "/hyla.test.Echo/Nope", &q.base, REP_DESC, &m, NULL, &res) ==
          HYLA_ERR_UNSUPPORTED);
    CHECK(res.code == HYLA_RPC_UNIMPLEMENTED && strstr(res.message, "/hyla.test.Echo/Nope"));
    CHECK(hyla_rpc_client_unary(c, "/no.Such/Service", &q.base, REP_DESC, &m, NULL, &res) ==
          HYLA_ERR_UNSUPPORTED);
}

static void test_server_stream(hyla_rpc_client *c) {
    EchoRequest q = HYLA__TEST__ECHO_REQUEST__INIT;
    q.text = "s";
    q.count = 200;
    hyla_rpc_stream *s = NULL;
    CHECK_OK(hyla_rpc_stream_open(c, M_SSTREAM, REP_DESC, NULL, &s));
    CHECK_OK(hyla_rpc_stream_write(s, &q.base));
    CHECK_OK(hyla_rpc_stream_close_send(s));
    int n = 0, in_order = 1;
    for (;;) {
        ProtobufCMessage *m = NULL;
        hyla_status st = hyla_rpc_stream_read(s, &m);
        CHECK_OK(st);
        if (!m)
            break;
        if (((EchoReply *)m)->index != n)
            in_order = 0;
        n++;
        protobuf_c_message_free_unpacked(m, NULL);
    }
    CHECK_MSG(n == 200, "got %d", n);
    CHECK(in_order);
    hyla_rpc_result res;
    CHECK_OK(hyla_rpc_stream_finish(s, &res));
    CHECK(res.code == HYLA_RPC_OK);
    hyla_rpc_stream_destroy(s);

    /* replies, then an error status: the replies arrive, then read returns the status */
    q.count = 5;
    q.fail_code = HYLA_RPC_ABORTED;
    CHECK_OK(hyla_rpc_stream_open(c, M_SSTREAM, REP_DESC, NULL, &s));
    CHECK_OK(hyla_rpc_stream_write(s, &q.base));
    CHECK_OK(hyla_rpc_stream_close_send(s));
    n = 0;
    hyla_status st;
    for (;;) {
        ProtobufCMessage *m = NULL;
        st = hyla_rpc_stream_read(s, &m);
        if (!m)
            break;
        n++;
        protobuf_c_message_free_unpacked(m, NULL);
    }
    CHECK(n == 5);
    CHECK(st == HYLA_ERR_UNAVAILABLE);
    CHECK(hyla_rpc_stream_result(s, &res) && res.code == HYLA_RPC_ABORTED);
    CHECK(strstr(res.message, "after 5 replies") != NULL);
    hyla_rpc_stream_destroy(s);

    /* finish without reading everything discards the rest */
    q.count = 1000;
    q.fail_code = 0;
    CHECK_OK(hyla_rpc_stream_open(c, M_SSTREAM, REP_DESC, NULL, &s));
    CHECK_OK(hyla_rpc_stream_write(s, &q.base));
    CHECK_OK(hyla_rpc_stream_finish(s, &res));
    hyla_rpc_stream_destroy(s);
}

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n, done, in_order;
    hyla_rpc_result res;
} async_state;

static void on_async(hyla_rpc_stream *s, const ProtobufCMessage *msg, void *ud) {
    async_state *a = ud;
    pthread_mutex_lock(&a->mu);
    if (msg) {
        if (((const EchoReply *)msg)->index != a->n)
            a->in_order = 0;
        a->n++;
    } else {
        hyla_rpc_stream_result(s, &a->res);
        a->done = 1;
        pthread_cond_broadcast(&a->cv);
    }
    pthread_mutex_unlock(&a->mu);
}

static void test_async(hyla_rpc_client *c) {
    async_state a = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 1, {0, ""}};
    EchoRequest q = HYLA__TEST__ECHO_REQUEST__INIT;
    q.text = "a";
    q.count = 300;
    hyla_rpc_stream *s = NULL;
    CHECK_OK(hyla_rpc_stream_open_async(c, M_SSTREAM, REP_DESC, NULL, on_async, &a, &s));
    CHECK_OK(hyla_rpc_stream_write(s, &q.base));
    CHECK_OK(hyla_rpc_stream_close_send(s));
    pthread_mutex_lock(&a.mu);
    while (!a.done)
        pthread_cond_wait(&a.cv, &a.mu);
    pthread_mutex_unlock(&a.mu);
    CHECK_MSG(a.n == 300, "async got %d", a.n);
    CHECK(a.in_order);
    CHECK(a.res.code == HYLA_RPC_OK);
    hyla_rpc_stream_destroy(s);

    /* destroy while messages still flow: no callback after destroy returns */
    async_state b = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 1, {0, ""}};
    q.count = 100000;
    CHECK_OK(hyla_rpc_stream_open_async(c, M_SSTREAM, REP_DESC, NULL, on_async, &b, &s));
    CHECK_OK(hyla_rpc_stream_write(s, &q.base));
    CHECK_OK(hyla_rpc_stream_close_send(s));
    while (1) {
        pthread_mutex_lock(&b.mu);
        int n = b.n;
        pthread_mutex_unlock(&b.mu);
        if (n >= 10)
            break;
        sleep_ms(1);
    }
    hyla_rpc_stream_destroy(s);
    pthread_mutex_lock(&b.mu);
    int after = b.n;
    pthread_mutex_unlock(&b.mu);
    sleep_ms(50);
    pthread_mutex_lock(&b.mu);
    CHECK(b.n == after);
    pthread_mutex_unlock(&b.mu);
}

static void test_client_stream(hyla_rpc_client *c) {
    hyla_rpc_stream *s = NULL;
    CHECK_OK(hyla_rpc_stream_open(c, M_CSTREAM, REP_DESC, NULL, &s));
    char expect[4096] = "";
    for (int i = 0; i < 60; i++) {
        EchoRequest q = HYLA__TEST__ECHO_REQUEST__INIT;
        char t[8];
        snprintf(t, sizeof t, "%d,", i);
        q.text = t;
        q.delay_ms = (i % 20 == 0) ? 30 : 0; /* the server holds reading now and then */
        strcat(expect, t);
        CHECK_OK(hyla_rpc_stream_write(s, &q.base));
    }
    CHECK_OK(hyla_rpc_stream_close_send(s));
    CHECK(hyla_rpc_stream_write(s, &(EchoRequest)HYLA__TEST__ECHO_REQUEST__INIT.base) == HYLA_ERR_INVALID_ARG);
    ProtobufCMessage *m = NULL;
    CHECK_OK(hyla_rpc_stream_read(s, &m));
    EchoReply *r = (EchoReply *)m;
    CHECK(r && r->count == 60);
    CHECK_MSG(r && strcmp(r->text, expect) == 0, "text '%s'", r ? r->text : "");
    if (m)
        protobuf_c_message_free_unpacked(m, NULL);
    CHECK_OK(hyla_rpc_stream_read(s, &m));
    CHECK(m == NULL);
    CHECK_OK(hyla_rpc_stream_finish(s, NULL));
    hyla_rpc_stream_destroy(s);

    /* the server fails mid-stream: later writes report the status */
    CHECK_OK(hyla_rpc_stream_open(c, M_CSTREAM, REP_DESC, NULL, &s));
    EchoRequest q = HYLA__TEST__ECHO_REQUEST__INIT;
    q.text = "x";
    CHECK_OK(hyla_rpc_stream_write(s, &q.base));
    q.fail_code = HYLA_RPC_OUT_OF_RANGE;
    CHECK_OK(hyla_rpc_stream_write(s, &q.base));
    hyla_rpc_result res;
    CHECK(hyla_rpc_stream_finish(s, &res) == HYLA_ERR_INVALID_ARG);
    CHECK(res.code == HYLA_RPC_OUT_OF_RANGE && strstr(res.message, "at message 1"));
    CHECK(hyla_rpc_stream_write(s, &q.base) == HYLA_ERR_INVALID_ARG); /* after close (finish) */
    hyla_rpc_stream_destroy(s);
}

static void test_bidi(hyla_rpc_client *c) {
    hyla_rpc_stream *s = NULL;
    CHECK_OK(hyla_rpc_stream_open(c, M_BIDI, REP_DESC, NULL, &s));
    int ok = 1;
    for (int i = 0; i < 50; i++) {
        EchoRequest q = HYLA__TEST__ECHO_REQUEST__INIT;
        q.text = "ping";
        q.count = i;
        CHECK_OK(hyla_rpc_stream_write(s, &q.base));
        ProtobufCMessage *m = NULL;
        CHECK_OK(hyla_rpc_stream_read(s, &m));
        if (!m || ((EchoReply *)m)->index != i || strcmp(((EchoReply *)m)->text, "ping") != 0)
            ok = 0;
        if (m)
            protobuf_c_message_free_unpacked(m, NULL);
    }
    CHECK(ok);
    CHECK_OK(hyla_rpc_stream_close_send(s));
    ProtobufCMessage *m = NULL;
    CHECK_OK(hyla_rpc_stream_read(s, &m));
    CHECK(m == NULL);
    hyla_rpc_result res;
    CHECK_OK(hyla_rpc_stream_finish(s, &res));
    CHECK(res.code == HYLA_RPC_OK);
    hyla_rpc_stream_destroy(s);

    /* writes queued ahead of reads (pipelined), more than max_queued_reads */
    CHECK_OK(hyla_rpc_stream_open(c, M_BIDI, REP_DESC, NULL, &s));
    for (int i = 0; i < 100; i++) {
        EchoRequest q = HYLA__TEST__ECHO_REQUEST__INIT;
        q.text = "p";
        q.count = i;
        CHECK_OK(hyla_rpc_stream_write(s, &q.base));
    }
    CHECK_OK(hyla_rpc_stream_close_send(s));
    int n = 0;
    for (;;) {
        CHECK_OK(hyla_rpc_stream_read(s, &m));
        if (!m)
            break;
        if (((EchoReply *)m)->index != n)
            ok = 0;
        n++;
        protobuf_c_message_free_unpacked(m, NULL);
    }
    CHECK(n == 100 && ok);
    hyla_rpc_stream_destroy(s);
}

static void test_deadline(hyla_rpc_client *c) {
    int before = atomic_load(&g_done_cancelled);
    EchoRequest q = HYLA__TEST__ECHO_REQUEST__INIT;
    q.text = "slow";
    q.delay_ms = 1500;
    hyla_rpc_call_opts o = {0};
    o.timeout_ms = 100;
    ProtobufCMessage *m = NULL;
    hyla_rpc_result res;
    double t0 = now_s();
    hyla_status st = hyla_rpc_client_unary(c, M_UNARY, &q.base, REP_DESC, &m, &o, &res);
    double dt = now_s() - t0;
    CHECK(st == HYLA_ERR_UNAVAILABLE);
    CHECK_MSG(res.code == HYLA_RPC_DEADLINE_EXCEEDED, "code %s", hyla_rpc_code_name(res.code));
    CHECK_MSG(dt < 1.2, "deadline took %.3f s", dt); /* well before the server's reply */
    CHECK(m == NULL);
    /* the server's handler learns it (DONE with cancelled) */
    CHECK_MSG(wait_atomic(&g_done_cancelled, before + 1, 3000), "server did not see the deadline");
}

static void test_cancel(hyla_rpc_client *c) {
    int before = atomic_load(&g_done_cancelled);
    int started = atomic_load(&g_hang_started);
    hyla_rpc_stream *s = NULL;
    CHECK_OK(hyla_rpc_stream_open(c, M_HANG, REP_DESC, NULL, &s));
    EchoRequest q = HYLA__TEST__ECHO_REQUEST__INIT;
    CHECK_OK(hyla_rpc_stream_write(s, &q.base));
    CHECK_OK(hyla_rpc_stream_close_send(s));
    ProtobufCMessage *m = NULL;
    CHECK_OK(hyla_rpc_stream_read(s, &m)); /* "ready": the handler holds the call now */
    CHECK(m && strcmp(((EchoReply *)m)->text, "ready") == 0);
    if (m)
        protobuf_c_message_free_unpacked(m, NULL);
    CHECK(atomic_load(&g_hang_started) == started + 1);
    hyla_rpc_stream_cancel(s);
    hyla_status st = hyla_rpc_stream_read(s, &m);
    CHECK(m == NULL && st == HYLA_ERR_CANCELLED);
    hyla_rpc_result res;
    CHECK(hyla_rpc_stream_finish(s, &res) == HYLA_ERR_CANCELLED && res.code == HYLA_RPC_CANCELLED);
    hyla_rpc_stream_destroy(s);
    CHECK_MSG(wait_atomic(&g_done_cancelled, before + 1, 3000), "server did not see the cancel");

    /* destroying an open stream cancels it too */
    before = atomic_load(&g_done_cancelled);
    CHECK_OK(hyla_rpc_stream_open(c, M_HANG, REP_DESC, NULL, &s));
    CHECK_OK(hyla_rpc_stream_write(s, &q.base));
    CHECK_OK(hyla_rpc_stream_read(s, &m));
    if (m)
        protobuf_c_message_free_unpacked(m, NULL);
    hyla_rpc_stream_destroy(s);
    CHECK_MSG(wait_atomic(&g_done_cancelled, before + 1, 3000), "server did not see the destroy");
}

static void test_sizes(int port) {
    /* this server: 64 KiB; the client allows 1 MiB */
    hyla_rpc_client *c = connect_client(port, 1 << 20);
    EchoRequest q = HYLA__TEST__ECHO_REQUEST__INIT;
    q.text = "big";
    uint8_t *buf = calloc(100000, 1);
    q.payload.data = buf;
    q.payload.len = 100000;
    ProtobufCMessage *m = NULL;
    hyla_rpc_result res;
    hyla_status st = hyla_rpc_client_unary(c, M_UNARY, &q.base, REP_DESC, &m, NULL, &res);
    CHECK(st == HYLA_ERR_RESOURCE);
    CHECK_MSG(res.code == HYLA_RPC_RESOURCE_EXHAUSTED, "code %s", hyla_rpc_code_name(res.code));
    CHECK_MSG(strstr(res.message, "65536") != NULL, "message does not name the limit: '%s'", res.message);

    /* just under the limit passes */
    q.payload.len = 60000;
    CHECK_OK(hyla_rpc_client_unary(c, M_UNARY, &q.base, REP_DESC, &m, NULL, &res));
    CHECK(m && ((EchoReply *)m)->count == 60000);
    if (m)
        protobuf_c_message_free_unpacked(m, NULL);

    /* a response over the server's limit */
    q.payload.len = 0;
    q.reply_bytes = 100000;
    st = hyla_rpc_client_unary(c, M_UNARY, &q.base, REP_DESC, &m, NULL, &res);
    CHECK(st == HYLA_ERR_RESOURCE && res.code == HYLA_RPC_RESOURCE_EXHAUSTED);
    CHECK_MSG(strstr(res.message, "max_message_bytes (65536)") != NULL, "message '%s'", res.message);
    hyla_rpc_client_destroy(c);

    /* the client's own limit: refused before sending, naming the limit */
    c = connect_client(port, 1024);
    q.reply_bytes = 0;
    q.payload.len = 2000;
    st = hyla_rpc_client_unary(c, M_UNARY, &q.base, REP_DESC, &m, NULL, &res);
    CHECK(st == HYLA_ERR_RESOURCE && res.code == HYLA_RPC_RESOURCE_EXHAUSTED);
    CHECK_MSG(strstr(res.message, "max_message_bytes (1024)") != NULL, "message '%s'", res.message);
    /* and a response over the client's limit */
    q.payload.len = 0;
    q.reply_bytes = 4000;
    st = hyla_rpc_client_unary(c, M_UNARY, &q.base, REP_DESC, &m, NULL, &res);
    CHECK_MSG(res.code == HYLA_RPC_RESOURCE_EXHAUSTED, "code %s: %s", hyla_rpc_code_name(res.code), res.message);
    hyla_rpc_client_destroy(c);
    free(buf);
}

static void test_malformed(hyla_rpc_client *c) {
    static const uint8_t garbage[][12] = {
        {0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f},               /* string of length 2^32 - 1 */
        {0x08},                                             /* varint cut short */
        {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, /* tag varint too long */
        {0x0b, 0x10, 0x01},                                 /* start-group wire type */
        {0x12, 0x05, 'a'},                                  /* bytes longer than the message */
    };
    static const size_t glen[] = {6, 1, 11, 3, 3};
    for (size_t g = 0; g < sizeof glen / sizeof glen[0]; g++) {
        const char *methods[] = {M_UNARY, M_SSTREAM};
        for (int k = 0; k < 2; k++) {
            hyla_rpc_stream *s = NULL;
            CHECK_OK(hyla_rpc_stream_open(c, methods[k], REP_DESC, NULL, &s));
            CHECK_OK(hyla_rpc_stream_write_raw(s, garbage[g], glen[g]));
            hyla_rpc_result res;
            hyla_status st = hyla_rpc_stream_finish(s, &res);
            CHECK_MSG(st == HYLA_ERR_INVALID_ARG && res.code == HYLA_RPC_INVALID_ARGUMENT,
                      "garbage %zu on %s: %s '%s'", g, methods[k], hyla_rpc_code_name(res.code), res.message);
            CHECK_MSG(strstr(res.message, "hyla.test.EchoRequest") != NULL, "message '%s'", res.message);
            hyla_rpc_stream_destroy(s);
        }
    }
    /* mid-stream garbage on a client stream and on a bidi stream */
    const char *smethods[] = {M_CSTREAM, M_BIDI};
    for (int k = 0; k < 2; k++) {
        hyla_rpc_stream *s = NULL;
        CHECK_OK(hyla_rpc_stream_open(c, smethods[k], REP_DESC, NULL, &s));
        EchoRequest q = HYLA__TEST__ECHO_REQUEST__INIT;
        q.text = "fine";
        CHECK_OK(hyla_rpc_stream_write(s, &q.base));
        CHECK_OK(hyla_rpc_stream_write_raw(s, garbage[0], glen[0]));
        hyla_rpc_result res;
        CHECK(hyla_rpc_stream_finish(s, &res) == HYLA_ERR_INVALID_ARG);
        CHECK_MSG(res.code == HYLA_RPC_INVALID_ARGUMENT && strstr(res.message, "malformed"), "%s: '%s'",
                  smethods[k], res.message);
        hyla_rpc_stream_destroy(s);
    }
    /* a unary call with no request message at all */
    hyla_rpc_stream *s = NULL;
    CHECK_OK(hyla_rpc_stream_open(c, M_UNARY, REP_DESC, NULL, &s));
    hyla_rpc_result res;
    CHECK(hyla_rpc_stream_finish(s, &res) == HYLA_ERR_INVALID_ARG);
    CHECK_MSG(strstr(res.message, "missing request") != NULL, "'%s'", res.message);
    hyla_rpc_stream_destroy(s);
    /* an empty message is a valid proto3 message (all defaults) */
    CHECK_OK(hyla_rpc_stream_open(c, M_UNARY, REP_DESC, NULL, &s));
    CHECK_OK(hyla_rpc_stream_write_raw(s, "", 0));
    ProtobufCMessage *m = NULL;
    CHECK_OK(hyla_rpc_stream_read(s, &m));
    CHECK(m != NULL);
    if (m)
        protobuf_c_message_free_unpacked(m, NULL);
    CHECK_OK(hyla_rpc_stream_finish(s, NULL));
    hyla_rpc_stream_destroy(s);

    /* the server still serves */
    EchoRequest q = HYLA__TEST__ECHO_REQUEST__INIT;
    q.text = "still here";
    CHECK_OK(hyla_rpc_client_unary(c, M_UNARY, &q.base, REP_DESC, &m, NULL, NULL));
    CHECK(m && strcmp(((EchoReply *)m)->text, "still here") == 0);
    if (m)
        protobuf_c_message_free_unpacked(m, NULL);
}

typedef struct {
    hyla_rpc_client *c;
    int ok;
} conc_arg;

static void *concurrent_caller(void *arg) {
    conc_arg *a = arg;
    for (int i = 0; i < 150; i++) {
        EchoRequest q = HYLA__TEST__ECHO_REQUEST__INIT;
        char t[32];
        snprintf(t, sizeof t, "c%d", i);
        q.text = t;
        q.fail_code = (i % 7 == 0) ? HYLA_RPC_NOT_FOUND : 0;
        ProtobufCMessage *m = NULL;
        hyla_status st = hyla_rpc_client_unary(a->c, M_UNARY, &q.base, REP_DESC, &m, NULL, NULL);
        if (q.fail_code ? st != HYLA_ERR_NOT_FOUND : (st != HYLA_OK || strcmp(((EchoReply *)m)->text, t) != 0))
            a->ok = 0;
        if (m)
            protobuf_c_message_free_unpacked(m, NULL);
    }
    return NULL;
}

static void test_concurrent(hyla_rpc_client *c) {
    pthread_t t[4];
    conc_arg a[4];
    for (int i = 0; i < 4; i++) {
        a[i].c = c;
        a[i].ok = 1;
        pthread_create(&t[i], NULL, concurrent_caller, &a[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        CHECK(a[i].ok);
    }
}

static void test_shutdown_in_flight(void) {
    int port = 0;
    hyla_rpc_server *srv = start_server(1 << 20, 300, &port);
    hyla_rpc_client *c = connect_client(port, 1 << 20);
    int started = atomic_load(&g_hang_started);
    hyla_rpc_stream *hang[3], *prod = NULL, *cs = NULL;
    EchoRequest q = HYLA__TEST__ECHO_REQUEST__INIT;
    for (int i = 0; i < 3; i++) {
        CHECK_OK(hyla_rpc_stream_open(c, M_HANG, REP_DESC, NULL, &hang[i]));
        CHECK_OK(hyla_rpc_stream_write(hang[i], &q.base));
        CHECK_OK(hyla_rpc_stream_close_send(hang[i]));
    }
    /* a producer thread streaming until the call is cancelled */
    q.count = 1000000;
    q.delay_ms = 5;
    CHECK_OK(hyla_rpc_stream_open(c, M_SSTREAM, REP_DESC, NULL, &prod));
    CHECK_OK(hyla_rpc_stream_write(prod, &q.base));
    CHECK_OK(hyla_rpc_stream_close_send(prod));
    ProtobufCMessage *m = NULL;
    CHECK_OK(hyla_rpc_stream_read(prod, &m));
    if (m)
        protobuf_c_message_free_unpacked(m, NULL);
    /* a client stream left open (no half-close) */
    CHECK_OK(hyla_rpc_stream_open(c, M_CSTREAM, REP_DESC, NULL, &cs));
    EchoRequest one = HYLA__TEST__ECHO_REQUEST__INIT;
    one.text = "open";
    CHECK_OK(hyla_rpc_stream_write(cs, &one.base));
    CHECK(wait_atomic(&g_hang_started, started + 3, 3000));
    sleep_ms(50);
    CHECK(hyla_rpc_server_live_calls(srv) == 5);

    double t0 = now_s();
    hyla_rpc_server_shutdown(srv);
    double dt = now_s() - t0;
    CHECK_MSG(dt < 5.0, "shutdown took %.2f s", dt);
    CHECK(hyla_rpc_server_live_calls(srv) == 0);
    hyla_rpc_server_shutdown(srv); /* idempotent */

    for (int i = 0; i < 3; i++) {
        hyla_rpc_result res;
        CHECK(hyla_rpc_stream_finish(hang[i], &res) != HYLA_OK);
        CHECK_MSG(res.code == HYLA_RPC_CANCELLED || res.code == HYLA_RPC_UNAVAILABLE, "hang %d: %s", i,
                  hyla_rpc_code_name(res.code));
        hyla_rpc_stream_destroy(hang[i]);
    }
    hyla_rpc_result res;
    CHECK(hyla_rpc_stream_finish(prod, &res) != HYLA_OK);
    hyla_rpc_stream_destroy(prod);
    CHECK(hyla_rpc_stream_finish(cs, &res) != HYLA_OK);
    hyla_rpc_stream_destroy(cs);

    /* new calls fail with UNAVAILABLE, not a hang */
    EchoRequest p = HYLA__TEST__ECHO_REQUEST__INIT;
    hyla_rpc_call_opts o = {0};
    o.timeout_ms = 2000;
    CHECK(hyla_rpc_client_unary(c, M_UNARY, &p.base, REP_DESC, &m, &o, &res) != HYLA_OK);
    CHECK_MSG(res.code == HYLA_RPC_UNAVAILABLE || res.code == HYLA_RPC_DEADLINE_EXCEEDED, "%s",
              hyla_rpc_code_name(res.code));
    hyla_rpc_client_destroy(c);
    hyla_rpc_server_destroy(srv);
    CHECK_MSG(wait_zero(&g_producers, 3000), "%d helper thread(s) still running", atomic_load(&g_producers));
}

static int g_cleanup_order[4], g_n_cleanups;
static void cleanup_fn(void *arg) { g_cleanup_order[g_n_cleanups++] = (int)(intptr_t)arg; }

static void test_lifecycle_edges(void) {
    /* a server never started, and one that cannot bind; cleanups run at destroy, last first */
    hyla_rpc_server *s = NULL;
    CHECK_OK(hyla_rpc_server_create(NULL, &s));
    CHECK_OK(hyla_rpc_server_add_cleanup(s, cleanup_fn, (void *)1));
    CHECK_OK(hyla_rpc_server_add_cleanup(s, cleanup_fn, (void *)2));
    CHECK(g_n_cleanups == 0);
    hyla_rpc_server_destroy(s);
    CHECK(g_n_cleanups == 2 && g_cleanup_order[0] == 2 && g_cleanup_order[1] == 1);
    CHECK_OK(hyla_rpc_server_create(NULL, &s));
    CHECK(hyla_rpc_server_start(s) == HYLA_ERR_INVALID_ARG); /* no address */
    CHECK(hyla_rpc_server_listen(s, "256.1.1.1:1", NULL) == HYLA_ERR_IO);
    hyla_rpc_server_destroy(s);
    hyla_rpc_server_destroy(NULL);
    hyla_rpc_client_destroy(NULL);
    hyla_rpc_stream_destroy(NULL);
    hyla_rpc_server_params bad = hyla_rpc_server_default_params();
    bad.threads = 0;
    CHECK(hyla_rpc_server_create(&bad, &s) == HYLA_ERR_INVALID_ARG && s == NULL);

    /* a client of an address nobody listens on: UNAVAILABLE, quickly */
    hyla_rpc_client *c = NULL;
    CHECK_OK(hyla_rpc_client_create("127.0.0.1:1", NULL, &c));
    EchoRequest q = HYLA__TEST__ECHO_REQUEST__INIT;
    ProtobufCMessage *m = NULL;
    hyla_rpc_result res;
    hyla_rpc_call_opts o = {0};
    o.timeout_ms = 3000;
    CHECK(hyla_rpc_client_unary(c, M_UNARY, &q.base, REP_DESC, &m, &o, &res) == HYLA_ERR_UNAVAILABLE);
    CHECK_MSG(res.code == HYLA_RPC_UNAVAILABLE, "%s", hyla_rpc_code_name(res.code));
    /* wait_for_ready waits until the deadline instead */
    o.timeout_ms = 200;
    o.wait_for_ready = 1;
    CHECK(hyla_rpc_client_unary(c, M_UNARY, &q.base, REP_DESC, &m, &o, &res) == HYLA_ERR_UNAVAILABLE);
    CHECK_MSG(res.code == HYLA_RPC_DEADLINE_EXCEEDED, "%s", hyla_rpc_code_name(res.code));
    hyla_rpc_client_destroy(c);
}

int main(void) {
    test_mapping();

    int port = 0;
    hyla_rpc_server *srv = start_server(1 << 20, 2000, &port);
    hyla_rpc_client *c = connect_client(port, 1 << 20);
    test_unary(c);
    test_server_stream(c);
    test_async(c);
    test_client_stream(c);
    test_bidi(c);
    test_deadline(c);
    test_cancel(c);
    test_malformed(c);
    test_concurrent(c);
    hyla_rpc_client_destroy(c);
    hyla_rpc_server_destroy(srv);

    int sport = 0;
    hyla_rpc_server *small = start_server(65536, 2000, &sport);
    test_sizes(sport);
    hyla_rpc_server_destroy(small);

    test_shutdown_in_flight();
    test_lifecycle_edges();
    /* every helper thread has ended (they release their calls before exiting) */
    CHECK_MSG(wait_zero(&g_producers, 3000), "%d helper thread(s) still running", atomic_load(&g_producers));
    return hyla_test_done("test_rpc");
}
