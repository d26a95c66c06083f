/* test_client.c — libhyla (client/hyla.h) against the in-process fake Sessions/Cluster server
 * of test_client_fake.c, over real gRPC on loopback: every call, the Append and Generate
 * streams (progress, chunking, cancellation, UNAVAILABLE mid-stream with the delivered count
 * and a continuing Generate), error-code mapping and messages, pagination, tenants, deadlines,
 * a closed port, and concurrent calls on one client. */
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "hyla.h"
#include "hyla_test.h"
#include "hyla_util.h"
#include "test_client_fake.h"

static fake_server *F;
static char ADDR[64];

#define CHECK_ERR(expr, status, code)                                                                      \
    do {                                                                                                   \
        hyla_status s_ = (expr);                                                                           \
        int c_ = hyla_client_last_code();                                                                  \
        CHECK_MSG(s_ == (status) && c_ == (code), "%s -> %s / %s (%s), want %s / %s", #expr, hyla_status_str(s_), \
                  hyla_client_code_name(c_), hyla_last_error(), hyla_status_str(status), hyla_client_code_name(code)); \
    } while (0)

#define CHECK_HAS(str, sub) CHECK_MSG(strstr((str), (sub)) != NULL, "'%s' lacks '%s'", (str), (sub))

/* A TCP port with nothing listening: bind port 0, read it, close. */
static int closed_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    HYLA_ASSERT(bind(fd, (struct sockaddr *)&a, sizeof a) == 0);
    HYLA_ASSERT(getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    close(fd);
    return ntohs(a.sin_port);
}

static hyla_client *connect_as(const char *tenant) {
    hyla_client *c = NULL;
    CHECK_OK(hyla_client_connect(ADDR, tenant, NULL, &c));
    HYLA_ASSERT(c);
    return c;
}

static char *new_session(hyla_client *c, uint64_t seed) {
    hyla_create_params p = hyla_create_default_params();
    p.seed = seed;
    hyla_session_info s;
    CHECK_OK(hyla_client_create_session(c, &p, &s));
    char *id = strdup(s.id ? s.id : "");
    hyla_session_info_clear(&s);
    return id;
}

static void test_connect_errors(void) {
    hyla_client *c = (hyla_client *)1;
    CHECK_ERR(hyla_client_connect("", NULL, NULL, &c), HYLA_ERR_INVALID_ARG, HYLA_CODE_LOCAL);
    CHECK(c == NULL);
    CHECK_ERR(hyla_client_connect("127.0.0.1:1", "a b", NULL, &c), HYLA_ERR_INVALID_ARG, HYLA_CODE_LOCAL);
    CHECK_HAS(hyla_last_error(), "tenant");
    CHECK(strcmp(hyla_client_code_name(HYLA_CODE_UNAVAILABLE), "UNAVAILABLE") == 0);
    CHECK(strcmp(hyla_client_code_name(HYLA_CODE_LOCAL), "LOCAL") == 0);
    CHECK(strcmp(hyla_tier_name(HYLA_TIER_STORE), "store") == 0);
    CHECK(strcmp(hyla_finish_reason_name(HYLA_FINISH_EOS), "eos") == 0);
    hyla_client_close(NULL);
    hyla_session_info_clear(NULL);
    hyla_session_list_clear(NULL);
    hyla_cluster_status_clear(NULL);
}

/* Every kind of call against a port where nothing listens: UNAVAILABLE naming the address. */
static void test_closed_port(void) {
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", closed_port());
    hyla_client *c = NULL;
    CHECK_OK(hyla_client_connect(addr, "t1", NULL, &c)); /* lazy: no error yet */
    hyla_session_info s;
    CHECK_ERR(hyla_client_create_session(c, NULL, &s), HYLA_ERR_UNAVAILABLE, HYLA_CODE_UNAVAILABLE);
    CHECK_HAS(hyla_last_error(), "CreateSession: UNAVAILABLE");
    CHECK_HAS(hyla_last_error(), addr);
    hyla_generate_params gp = hyla_generate_default_params();
    hyla_generate_result gr;
    CHECK_ERR(hyla_client_generate(c, "s-0", &gp, &gr), HYLA_ERR_UNAVAILABLE, HYLA_CODE_UNAVAILABLE);
    CHECK(gr.delivered == 0 && gr.finish == HYLA_FINISH_NONE);
    CHECK_ERR(hyla_client_append_text(c, "s-0", "abc", 3, NULL, NULL), HYLA_ERR_UNAVAILABLE, HYLA_CODE_UNAVAILABLE);
    hyla_cluster_status cs;
    CHECK_ERR(hyla_client_cluster_status(c, &cs), HYLA_ERR_UNAVAILABLE, HYLA_CODE_UNAVAILABLE);
    hyla_client_close(c);
}

/* A server that accepts TCP connections but never speaks HTTP/2: the deadline ends the call. */
static void test_deadline(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    HYLA_ASSERT(bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, 16) == 0);
    HYLA_ASSERT(getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", ntohs(a.sin_port));
    hyla_client_params p = hyla_client_default_params();
    p.call_timeout_ms = 300;
    hyla_client *c = NULL;
    CHECK_OK(hyla_client_connect(addr, NULL, &p, &c));
    double t0 = hyla_now();
    hyla_session_list l;
    hyla_status st = hyla_client_list_sessions(c, NULL, &l);
    double dt = hyla_now() - t0;
    int code = hyla_client_last_code();
    CHECK_MSG(st == HYLA_ERR_UNAVAILABLE && (code == HYLA_CODE_DEADLINE_EXCEEDED || code == HYLA_CODE_UNAVAILABLE),
              "%s %s: %s", hyla_status_str(st), hyla_client_code_name(code), hyla_last_error());
    CHECK_MSG(dt < 10, "the 300 ms deadline took %.1f s", dt);
    hyla_client_close(c);
    close(fd);
}

static void test_create_get_delete(void) {
    hyla_client *c = connect_as("t1");
    CHECK(strcmp(hyla_client_tenant(c), "t1") == 0 && strcmp(hyla_client_address(c), ADDR) == 0);
    hyla_create_params p = hyla_create_default_params();
    p.has_sampling = 1;
    p.sampling.temperature = 0.7f;
    p.sampling.top_k = 40;
    p.sampling.top_p = 0.9f;
    p.seed = 42;
    p.worker_hint = "w-2";
    hyla_session_info s;
    CHECK_OK(hyla_client_create_session(c, &p, &s));
    CHECK(hyla_client_last_code() == HYLA_CODE_OK);
    CHECK(s.id && strlen(s.id) == 18 && strncmp(s.id, "s-", 2) == 0);
    CHECK(strcmp(s.tenant, "t1") == 0 && strcmp(s.model, "tiny") == 0);
    CHECK(s.state == HYLA_SESSION_ACTIVE && s.tier == HYLA_TIER_GPU);
    CHECK(strcmp(s.group_id, "g-2") == 0 && s.n_worker_ids == 1 && strcmp(s.worker_ids[0], "w-2") == 0);
    CHECK(s.seed == 42 && s.sampling.top_k == 40 && fabsf(s.sampling.temperature - 0.7f) < 1e-6f);
    fake_record rec;
    fake_get_record(F, &rec);
    CHECK(strcmp(rec.tenant, "t1") == 0);

    hyla_session_info g;
    CHECK_OK(hyla_client_get_session(c, s.id, &g));
    CHECK(strcmp(g.id, s.id) == 0 && g.position == 0 && g.parent_id && g.parent_id[0] == 0 && g.error);
    hyla_session_info_clear(&g);
    CHECK(g.id == NULL);

    /* errors: unknown model, unknown session, another tenant's session, empty id */
    p = hyla_create_default_params();
    p.model = "nope";
    hyla_session_info bad;
    CHECK_ERR(hyla_client_create_session(c, &p, &bad), HYLA_ERR_NOT_FOUND, HYLA_CODE_NOT_FOUND);
    CHECK_HAS(hyla_last_error(), "CreateSession: NOT_FOUND: model 'nope' is not served");
    CHECK(bad.id == NULL);
    CHECK_ERR(hyla_client_get_session(c, "s-00000000000000ff", &g), HYLA_ERR_NOT_FOUND, HYLA_CODE_NOT_FOUND);
    CHECK_HAS(hyla_last_error(), "GetSession s-00000000000000ff: NOT_FOUND");
    hyla_client *other = connect_as("t2");
    CHECK_ERR(hyla_client_get_session(other, s.id, &g), HYLA_ERR_PERMISSION, HYLA_CODE_PERMISSION_DENIED);
    CHECK_ERR(hyla_client_delete_session(other, s.id, NULL), HYLA_ERR_PERMISSION, HYLA_CODE_PERMISSION_DENIED);
    CHECK_ERR(hyla_client_get_session(c, "", &g), HYLA_ERR_INVALID_ARG, HYLA_CODE_LOCAL);
    hyla_client_close(other);

    uint64_t n = 99;
    CHECK_OK(hyla_client_pause(c, s.id, 0, NULL, NULL));
    CHECK_OK(hyla_client_delete_session(c, s.id, &n));
    CHECK(n == 1);
    CHECK_ERR(hyla_client_delete_session(c, s.id, &n), HYLA_ERR_NOT_FOUND, HYLA_CODE_NOT_FOUND);
    hyla_session_info_clear(&s);
    hyla_client_close(c);
}

typedef struct {
    int calls;
    uint64_t last_ingested;
    int monotone;
    int saw_done;
    int done_was_last;
    int cancel_at; /* cancel on this call (1-based); 0: never */
    uint64_t total_bytes;
} prog_rec;

static int on_prog(const hyla_append_progress *p, void *ud) {
    prog_rec *r = ud;
    r->calls++;
    if (p->tokens_ingested < r->last_ingested)
        r->monotone = 0;
    r->last_ingested = p->tokens_ingested;
    r->done_was_last = 0;
    if (p->done)
        r->saw_done = r->done_was_last = 1;
    r->total_bytes = p->total_bytes;
    return r->cancel_at && r->calls == r->cancel_at;
}

typedef struct {
    const char *data;
    size_t len, off, step;
    int fail_at; /* return -1 once off >= fail_at (0: never) */
} mem_reader;

static ssize_t read_mem(void *buf, size_t cap, void *ud) {
    mem_reader *m = ud;
    if (m->fail_at && m->off >= (size_t)m->fail_at) {
        hyla_fail(HYLA_ERR_IO, "reading the test input: disk on fire");
        return -1;
    }
    size_t n = m->len - m->off;
    if (n > m->step)
        n = m->step;
    if (n > cap)
        n = cap;
    memcpy(buf, m->data + m->off, n);
    m->off += n;
    return (ssize_t)n;
}

static void test_append(void) {
    hyla_client_params cp = hyla_client_default_params();
    cp.append_chunk_bytes = 100;
    cp.append_chunk_tokens = 16384;
    hyla_client *c = NULL;
    CHECK_OK(hyla_client_connect(ADDR, "t1", &cp, &c));
    char *id = new_session(c, 0);
    char doc[1000];
    for (int i = 0; i < 1000; i++)
        doc[i] = (char)('A' + i % 26);

    /* text in 100-byte chunks: 10 messages, progress after each, done last */
    prog_rec r = {0, 0, 1, 0, 0, 0, 0};
    hyla_append_params ap = hyla_append_default_params();
    ap.add_bos = 1;
    ap.progress = on_prog;
    ap.progress_ud = &r;
    hyla_append_progress fin;
    CHECK_OK(hyla_client_append_text(c, id, doc, sizeof doc, &ap, &fin));
    /* Progress reports are coalesced on the caller's thread: on a loaded machine every server
     * message may have arrived before the first report, so only >= 1 call is guaranteed. */
    CHECK_MSG(r.calls >= 1 && r.monotone && r.saw_done && r.done_was_last, "calls %d monotone %d done %d/%d", r.calls,
              r.monotone, r.saw_done, r.done_was_last);
    CHECK(fin.done && fin.tokens_ingested == 1000 && fin.position == 1000 && fin.bytes_sent == 1000);
    CHECK(fin.total_bytes == 1000 && r.total_bytes == 1000 && fin.elapsed_s >= 0);
    fake_record rec;
    fake_get_record(F, &rec);
    CHECK_MSG(rec.append_messages == 10, "%d messages", rec.append_messages);
    CHECK(rec.append_bytes_hint == 1000 && rec.append_add_bos == 1);

    /* token ids: 40000 in chunks of 16384 -> 3 messages; the hint is the count */
    int32_t *ids = calloc(40000, sizeof *ids);
    CHECK_OK(hyla_client_append_tokens(c, id, ids, 40000, NULL, &fin));
    free(ids);
    CHECK(fin.tokens_ingested == 40000 && fin.position == 41000);
    fake_get_record(F, &rec);
    CHECK(rec.append_messages == 3 && rec.append_tokens_hint == 40000 && rec.append_add_bos == 0);

    /* an empty document still names the session, and succeeds */
    CHECK_OK(hyla_client_append_text(c, id, NULL, 0, NULL, &fin));
    CHECK(fin.done && fin.tokens_ingested == 0 && fin.position == 41000);

    /* a reader (a pipe-like source of 7-byte reads) */
    mem_reader m = {doc, 500, 0, 7, 0};
    memset(&r, 0, sizeof r);
    r.monotone = 1;
    ap = hyla_append_default_params();
    ap.progress = on_prog;
    ap.progress_ud = &r;
    CHECK_OK(hyla_client_append_reader(c, id, read_mem, &m, &ap, &fin));
    CHECK(fin.tokens_ingested == 500 && fin.position == 41500 && fin.bytes_sent == 500 && r.saw_done);
    uint64_t pos = 0;
    CHECK(fake_session(F, id, &pos, NULL, 0) && pos == 41500);

    /* a reader failing half-way: its status and message, LOCAL */
    m = (mem_reader){doc, 500, 0, 50, 200};
    CHECK_ERR(hyla_client_append_reader(c, id, read_mem, &m, NULL, &fin), HYLA_ERR_IO, HYLA_CODE_LOCAL);
    CHECK_HAS(hyla_last_error(), "disk on fire");

    /* the progress callback cancels */
    memset(&r, 0, sizeof r);
    r.monotone = 1;
    r.cancel_at = 1;
    ap.progress_ud = &r;
    CHECK_ERR(hyla_client_append_text(c, id, doc, sizeof doc, &ap, &fin), HYLA_ERR_CANCELLED, HYLA_CODE_LOCAL);
    CHECK(r.calls >= 1);

    /* server-side failures */
    CHECK_ERR(hyla_client_append_text(c, "s-00000000000000ff", doc, 10, NULL, NULL), HYLA_ERR_NOT_FOUND,
              HYLA_CODE_NOT_FOUND);
    CHECK_HAS(hyla_last_error(), "Append s-00000000000000ff: NOT_FOUND");
    hyla_client *other = connect_as("t2");
    CHECK_ERR(hyla_client_append_text(other, id, doc, 10, NULL, NULL), HYLA_ERR_PERMISSION,
              HYLA_CODE_PERMISSION_DENIED);
    hyla_client_close(other);
    fake_fail_append_after(F, 2);
    CHECK_ERR(hyla_client_append_text(c, id, doc, sizeof doc, NULL, &fin), HYLA_ERR_UNAVAILABLE,
              HYLA_CODE_UNAVAILABLE);
    CHECK_HAS(hyla_last_error(), "worker w-1 is gone");
    CHECK_HAS(hyla_last_error(), "200 token(s) were ingested before the failure");
    CHECK(fin.tokens_ingested == 200);
    fake_set_max_append_tokens(F, 300);
    CHECK_ERR(hyla_client_append_text(c, id, doc, sizeof doc, NULL, NULL), HYLA_ERR_RESOURCE,
              HYLA_CODE_RESOURCE_EXHAUSTED);
    CHECK_HAS(hyla_last_error(), "max_append_tokens (300)");
    fake_set_max_append_tokens(F, 1 << 24);
    CHECK_ERR(hyla_client_append_text(c, NULL, doc, 1, NULL, NULL), HYLA_ERR_INVALID_ARG, HYLA_CODE_LOCAL);
    free(id);
    hyla_client_close(c);
}

typedef struct {
    char text[4096];
    size_t len;
    uint32_t pieces;
    int order_ok;
    uint64_t last_pos;
    int stop_after; /* stop (cancel) after this many pieces; 0: never */
} gen_rec;

static int on_tok(const hyla_token_piece *p, void *ud) {
    gen_rec *g = ud;
    if (p->delivered != g->pieces || p->n_token_ids != 1 || p->text_len != 1 ||
        (g->last_pos && p->position != g->last_pos + 1) || p->token_ids[0] != (unsigned char)p->text[0])
        g->order_ok = 0;
    memcpy(g->text + g->len, p->text, p->text_len);
    g->len += p->text_len;
    g->text[g->len] = 0;
    g->last_pos = p->position;
    g->pieces++;
    return g->stop_after && (int)g->pieces == g->stop_after;
}

static void test_generate(void) {
    hyla_client *c = connect_as("t1");
    char *id = new_session(c, 5);
    CHECK_OK(hyla_client_append_text(c, id, "hello", 5, NULL, NULL));
    char want[256];

    gen_rec g;
    memset(&g, 0, sizeof g);
    g.order_ok = 1;
    hyla_generate_params p = hyla_generate_default_params();
    p.max_tokens = 10;
    p.on_token = on_tok;
    p.ud = &g;
    hyla_generate_result res;
    CHECK_OK(hyla_client_generate(c, id, &p, &res));
    fake_expected_text(5, 5, 10, want);
    CHECK_MSG(strcmp(g.text, want) == 0, "got '%s' want '%s'", g.text, want);
    CHECK(g.order_ok && g.pieces == 10);
    CHECK(res.delivered == 10 && res.finish == HYLA_FINISH_LENGTH && res.server_delivered == 10 &&
          res.position == 15 && res.first_token_s >= 0 && res.elapsed_s >= res.first_token_s);
    fake_record rec;
    fake_get_record(F, &rec);
    CHECK(rec.gen_max_tokens == 10 && !rec.gen_has_sampling && !rec.gen_reseed && rec.gen_n_stop == 0);

    /* UNAVAILABLE after 3 tokens: the count, the trailer, a message that says what to do; then
     * generate again continues right after the delivered tokens */
    fake_fail_generate_after(F, 3);
    memset(&g, 0, sizeof g);
    g.order_ok = 1;
    p.max_tokens = 8;
    CHECK_ERR(hyla_client_generate(c, id, &p, &res), HYLA_ERR_UNAVAILABLE, HYLA_CODE_UNAVAILABLE);
    CHECK(res.delivered == 3 && res.server_delivered == 3 && res.finish == HYLA_FINISH_NONE && res.position == 18);
    CHECK_HAS(hyla_last_error(), "Generate ");
    CHECK_HAS(hyla_last_error(), "UNAVAILABLE: worker w-1 stopped heartbeating");
    CHECK_HAS(hyla_last_error(), "3 token(s) were delivered before the failure");
    CHECK_HAS(hyla_last_error(), "call generate again");
    fake_expected_text(15, 5, 3, want);
    CHECK_MSG(strcmp(g.text, want) == 0, "got '%s' want '%s'", g.text, want);
    memset(&g, 0, sizeof g);
    g.order_ok = 1;
    p.max_tokens = 5;
    CHECK_OK(hyla_client_generate(c, id, &p, &res));
    fake_expected_text(18, 5, 5, want);
    CHECK_MSG(strcmp(g.text, want) == 0, "continued '%s' want '%s'", g.text, want);
    CHECK(res.position == 23);

    /* a stop sequence: the fake stops at the first token equal to it and does not deliver it */
    fake_expected_text(23, 5, 4, want);
    char stop[2] = {want[3], 0};
    int k = (int)(strchr(want, want[3]) - want); /* first occurrence */
    const char *stops[] = {stop};
    memset(&g, 0, sizeof g);
    g.order_ok = 1;
    p.max_tokens = 20;
    p.stop = stops;
    p.n_stop = 1;
    CHECK_OK(hyla_client_generate(c, id, &p, &res));
    CHECK_MSG(res.finish == HYLA_FINISH_STOP && res.delivered == (uint32_t)k, "finish %s delivered %u want %d",
              hyla_finish_reason_name(res.finish), res.delivered, k);
    fake_get_record(F, &rec);
    CHECK(rec.gen_n_stop == 1 && strcmp(rec.gen_stop0, stop) == 0);
    p.stop = NULL;
    p.n_stop = 0;

    /* sampling override, reseed, ignore_eos and a stop id reach the server */
    hyla_session_info s;
    CHECK_OK(hyla_client_get_session(c, id, &s));
    fake_expected_text(s.position, 77, 2, want);
    int32_t stop_id = (unsigned char)want[1];
    p.has_sampling = 1;
    p.sampling.temperature = 0.5f;
    p.sampling.top_k = 7;
    p.sampling.top_p = 0.25f;
    p.reseed = 1;
    p.seed = 77;
    p.ignore_eos = 1;
    p.stop_token_ids = &stop_id;
    p.n_stop_token_ids = 1;
    memset(&g, 0, sizeof g);
    g.order_ok = 1;
    CHECK_OK(hyla_client_generate(c, id, &p, &res));
    CHECK(res.finish == HYLA_FINISH_STOP && res.delivered == (want[0] == want[1] ? 1u : 2u));
    fake_get_record(F, &rec);
    CHECK(rec.gen_has_sampling && rec.gen_temperature == 0.5f && rec.gen_top_k == 7 && rec.gen_top_p == 0.25f);
    CHECK(rec.gen_reseed && rec.gen_seed == 77 && rec.gen_ignore_eos);
    hyla_session_info_clear(&s);
    CHECK_OK(hyla_client_get_session(c, id, &s));
    CHECK(s.seed == 77 && s.sampling.top_k == 7);
    hyla_session_info_clear(&s);
    p = hyla_generate_default_params();
    p.on_token = on_tok;
    p.ud = &g;

    /* the callback stops after 2 pieces */
    memset(&g, 0, sizeof g);
    g.order_ok = 1;
    g.stop_after = 2;
    p.max_tokens = 50;
    CHECK_ERR(hyla_client_generate(c, id, &p, &res), HYLA_ERR_CANCELLED, HYLA_CODE_LOCAL);
    CHECK(res.delivered == 2 && g.pieces == 2);

    /* invalid arguments: local (0) and the server's (over its limit), unknown session */
    p.max_tokens = 0;
    CHECK_ERR(hyla_client_generate(c, id, &p, &res), HYLA_ERR_INVALID_ARG, HYLA_CODE_LOCAL);
    p.max_tokens = 200000;
    CHECK_ERR(hyla_client_generate(c, id, &p, &res), HYLA_ERR_INVALID_ARG, HYLA_CODE_INVALID_ARGUMENT);
    CHECK_HAS(hyla_last_error(), "max_tokens");
    p.max_tokens = 3;
    CHECK_ERR(hyla_client_generate(c, "s-00000000000000ff", &p, &res), HYLA_ERR_NOT_FOUND, HYLA_CODE_NOT_FOUND);
    CHECK(res.delivered == 0);
    const char *empty[] = {""};
    p.stop = empty;
    p.n_stop = 1;
    CHECK_ERR(hyla_client_generate(c, id, &p, &res), HYLA_ERR_INVALID_ARG, HYLA_CODE_LOCAL);
    free(id);
    hyla_client_close(c);
}

static void test_pause_resume_migrate_fork(void) {
    hyla_client *c = connect_as(NULL); /* no tenant: the server's "default" */
    char *id = new_session(c, 1);
    fake_record rec;
    fake_get_record(F, &rec);
    CHECK(rec.tenant[0] == 0);
    char tenant[64];
    CHECK(fake_session(F, id, NULL, tenant, sizeof tenant) && strcmp(tenant, "default") == 0);
    CHECK_OK(hyla_client_append_text(c, id, "0123456789", 10, NULL, NULL));

    hyla_session_info s;
    hyla_snapshot_summary snap;
    CHECK_OK(hyla_client_pause(c, id, 0, &s, &snap));
    CHECK(snap.version == 1 && snap.position == 10 && snap.state_bytes == 4106 && snap.stored_bytes == 2053);
    CHECK(snap.chunks == 1 && s.state == HYLA_SESSION_ACTIVE && s.last_snapshot.version == 1);
    hyla_session_info_clear(&s);
    CHECK_OK(hyla_client_pause(c, id, 1, &s, &snap));
    CHECK(snap.version == 2 && s.state == HYLA_SESSION_PAUSED && s.tier == HYLA_TIER_STORE && s.group_id[0] == 0 &&
          s.n_worker_ids == 0);
    hyla_session_info_clear(&s);

    CHECK_OK(hyla_client_resume(c, id, "w-2", &s));
    CHECK(s.state == HYLA_SESSION_ACTIVE && strcmp(s.group_id, "g-2") == 0 && strcmp(s.worker_ids[0], "w-2") == 0);
    fake_get_record(F, &rec);
    CHECK(strcmp(rec.resume_hint, "w-2") == 0);
    hyla_session_info_clear(&s);
    CHECK_OK(hyla_client_resume(c, id, NULL, NULL));

    char *from = NULL;
    CHECK_OK(hyla_client_migrate(c, id, NULL, &s, &snap, &from));
    CHECK(from && strcmp(from, "g-2") == 0 && strcmp(s.group_id, "g-1") == 0 && snap.version == 3);
    fake_get_record(F, &rec);
    CHECK(rec.migrate_to[0] == 0);
    free(from);
    hyla_session_info_clear(&s);
    CHECK_OK(hyla_client_migrate(c, id, "w-2", NULL, NULL, NULL));
    fake_get_record(F, &rec);
    CHECK(strcmp(rec.migrate_to, "w-2") == 0);
    CHECK_ERR(hyla_client_migrate(c, id, "w-9", &s, &snap, &from), HYLA_ERR_NOT_FOUND, HYLA_CODE_NOT_FOUND);
    CHECK(from == NULL && s.id == NULL);
    CHECK_HAS(hyla_last_error(), "worker 'w-9' not found");

    hyla_fork_params fp = hyla_fork_default_params();
    CHECK_OK(hyla_client_fork(c, id, &fp, &s));
    CHECK(strcmp(s.id, id) != 0 && strcmp(s.parent_id, id) == 0 && s.position == 10 && s.seed == 1);
    hyla_session_info_clear(&s);
    fp.reseed = 1;
    fp.seed = 9;
    fp.has_sampling = 1;
    fp.sampling.temperature = 1.5f;
    CHECK_OK(hyla_client_fork(c, id, &fp, &s));
    CHECK(s.seed == 9 && s.sampling.temperature == 1.5f);
    hyla_session_info_clear(&s);
    CHECK_ERR(hyla_client_fork(c, "s-00000000000000ff", NULL, &s), HYLA_ERR_NOT_FOUND, HYLA_CODE_NOT_FOUND);
    free(id);
    hyla_client_close(c);
}

static void test_list_and_cluster(void) {
    hyla_client *c = connect_as("lister");
    char *ids[5];
    for (int i = 0; i < 5; i++)
        ids[i] = new_session(c, (uint64_t)i);
    fake_record before, after;
    fake_get_record(F, &before);
    hyla_session_list l;
    CHECK_OK(hyla_client_list_sessions(c, NULL, &l));
    fake_get_record(F, &after);
    CHECK_MSG(l.n == 5, "%zu sessions", l.n);
    CHECK_MSG(after.list_calls - before.list_calls == 3, "%d pages", after.list_calls - before.list_calls);
    for (size_t i = 0; i < l.n && i < 5; i++)
        CHECK(strcmp(l.items[i].id, ids[i]) == 0 && strcmp(l.items[i].tenant, "lister") == 0);
    hyla_session_list_clear(&l);
    CHECK(l.items == NULL && l.n == 0);
    CHECK_OK(hyla_client_list_sessions(c, "other-model", &l));
    CHECK(l.n == 0);
    hyla_session_list_clear(&l);
    hyla_client *nobody = connect_as("nobody");
    CHECK_OK(hyla_client_list_sessions(nobody, NULL, &l));
    CHECK(l.n == 0);
    hyla_session_list_clear(&l);
    hyla_client_close(nobody);

    CHECK_OK(hyla_client_cluster_sessions(c, HYLA_TIER_UNKNOWN, NULL, "lister", &l));
    CHECK(l.n == 5);
    hyla_session_list_clear(&l);
    CHECK_OK(hyla_client_pause(c, ids[0], 1, NULL, NULL));

    hyla_cluster_status cs;
    CHECK_OK(hyla_client_cluster_status(c, &cs));
    CHECK(cs.n_workers == 2 && cs.n_groups == 2);
    if (cs.n_workers == 2) {
        CHECK(strcmp(cs.workers[0].id, "w-1") == 0 && strcmp(cs.workers[1].group_id, "g-2") == 0);
        CHECK(cs.workers[0].state == HYLA_WORKER_READY && strcmp(cs.workers[0].device, "cpu") == 0);
        CHECK(cs.workers[0].layer_end == 6 && cs.workers[0].num_layers == 6 && cs.workers[0].memory_total_bytes);
        CHECK(strcmp(cs.groups[1].worker_ids[0], "w-2") == 0 && cs.groups[1].complete);
    }
    CHECK(cs.sessions_store >= 1 && cs.sessions_gpu >= 4);
    hyla_cluster_status_clear(&cs);
    CHECK(cs.workers == NULL);

    hyla_drain_result d;
    CHECK_OK(hyla_client_drain_worker(c, "w-1", 1, &d));
    CHECK(d.state == HYLA_WORKER_DRAINED && d.sessions_moved >= 4 && d.sessions_remaining == 0);
    fake_get_record(F, &after);
    CHECK(after.drain_wait == 1);
    CHECK_ERR(hyla_client_drain_worker(c, "w-9", 0, &d), HYLA_ERR_NOT_FOUND, HYLA_CODE_NOT_FOUND);
    CHECK_ERR(hyla_client_drain_worker(c, "", 0, &d), HYLA_ERR_INVALID_ARG, HYLA_CODE_LOCAL);
    for (int i = 0; i < 5; i++) {
        CHECK_OK(hyla_client_delete_session(c, ids[i], NULL));
        free(ids[i]);
    }
    hyla_client_close(c);
}

/* One client, several threads generating on their own sessions at once. */
typedef struct {
    hyla_client *c;
    int ok;
} thread_arg;

static void *gen_thread(void *arg) {
    thread_arg *t = arg;
    t->ok = 1;
    for (int round = 0; round < 10; round++) {
        hyla_create_params cp = hyla_create_default_params();
        cp.seed = (uint64_t)round;
        hyla_session_info s;
        if (hyla_client_create_session(t->c, &cp, &s) != HYLA_OK) {
            t->ok = 0;
            return NULL;
        }
        gen_rec g;
        memset(&g, 0, sizeof g);
        g.order_ok = 1;
        hyla_generate_params p = hyla_generate_default_params();
        p.max_tokens = 20;
        p.on_token = on_tok;
        p.ud = &g;
        hyla_generate_result res;
        char want[32];
        fake_expected_text(0, (uint64_t)round, 20, want);
        if (hyla_client_generate(t->c, s.id, &p, &res) != HYLA_OK || strcmp(g.text, want) != 0 || !g.order_ok ||
            hyla_client_last_code() != HYLA_CODE_OK)
            t->ok = 0;
        hyla_client_delete_session(t->c, s.id, NULL);
        hyla_session_info_clear(&s);
    }
    return NULL;
}

static void test_threads(void) {
    hyla_client *c = connect_as("threads");
    pthread_t th[4];
    thread_arg a[4];
    for (int i = 0; i < 4; i++) {
        a[i].c = c;
        pthread_create(&th[i], NULL, gen_thread, &a[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK_MSG(a[i].ok, "thread %d", i);
    }
    hyla_client_close(c);
}

int main(void) {
    int port = 0;
    if (fake_start(NULL, &F, &port) != HYLA_OK) {
        fprintf(stderr, "test_client: cannot start the fake server: %s\n", hyla_last_error());
        return 1;
    }
    snprintf(ADDR, sizeof ADDR, "127.0.0.1:%d", port);
    test_connect_errors();
    test_closed_port();
    test_deadline();
    test_create_get_delete();
    test_append();
    test_generate();
    test_pause_resume_migrate_fork();
    test_list_and_cluster();
    test_threads();
    fake_stop(F);
    return hyla_test_done("test_client");
}
