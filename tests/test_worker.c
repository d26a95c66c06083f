/* test_worker.c — a real hyla-worker process over loopback gRPC with a real RocksDB statestore
 * (served in this process through statestore/rpc), driven through the Worker service:
 *   - Append + Generate 32 + Snapshot + Generate 32 equals `hyla-run` generating 64;
 *   - Unload, LoadSession from the snapshot (new epoch), Generate 32 equals the second half;
 *   - two sessions generating at once (batched decode) each equal their solo runs;
 *   - ForkSession continues identically without reseed;
 *   - auto-snapshots taken while generating (asynchronous exports) each restore and continue
 *     exactly like the uninterrupted run;
 *   - a heartbeat answered "unload" for the placement it reported, after the session was
 *     re-placed on the worker under a newer epoch, leaves the newer placement (a fake
 *     coordinator holds that answer until the test has re-placed it);
 *   - errors: unknown session NOT_FOUND, max_tokens 0 INVALID_ARGUMENT, bad token id
 *     INVALID_ARGUMENT, Generate before any Append FAILED_PRECONDITION.
 * The model is a 4-layer sse-h, or the hyla-mkmodel arch given as the argument (test_worker_mamba2
 * runs mamba2-h). */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "hyla_api.h"
#include "hyla_rpc.h"
#include "hyla_store_rpc.h"
#include "hyla_test.h"

static hyla_rpc_client *wc;

/* Start a hyla-worker with extra arguments (its log to the file `log` when not NULL); returns its
 * pid and port (0 on failure). */
static pid_t spawn_worker_log(const char *bin_dir, const char *const *args, int *port, FILE **out, const char *log) {
    int pfd[2];
    if (pipe(pfd) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(pfd[1], 1);
        if (log && !freopen(log, "w", stderr)) _exit(126);
        close(pfd[0]);
        char worker[512];
        snprintf(worker, sizeof worker, "%s/hyla-worker", bin_dir);
        const char *argv[32] = {worker};
        int k = 1;
        for (int i = 0; args[i] && k < 31; i++) argv[k++] = args[i];
        argv[k] = NULL;
        execv(worker, (char *const *)argv);
        _exit(127);
    }
    close(pfd[1]);
    *out = fdopen(pfd[0], "r");
    *port = 0;
    char line[256];
    while (fgets(line, sizeof line, *out))
        if (sscanf(line, "hyla-worker listening on port %d", port) == 1) break;
    return pid;
}
static pid_t spawn_worker(const char *bin_dir, const char *const *args, int *port, FILE **out) {
    return spawn_worker_log(bin_dir, args, port, out, NULL);
}
static const char *bin;
static char model[256];

/* A counter's value from the /metrics of the worker whose metrics port is in port_file (-1: none). */
static double scrape(const char *port_file, const char *name) {
    FILE *f = fopen(port_file, "r");
    int port = 0;
    if (!f) return -1;
    if (fscanf(f, "%d", &port) != 1) port = 0;
    fclose(f);
    char cmd[256], line[1024];
    snprintf(cmd, sizeof cmd, "curl -sf http://127.0.0.1:%d/metrics", port);
    FILE *p = port ? popen(cmd, "r") : NULL;
    double v = -1;
    size_t n = strlen(name);
    while (p && fgets(line, sizeof line, p))
        if (!strncmp(line, name, n) && line[n] == ' ') v = atof(line + n + 1);
    if (p) pclose(p);
    return v;
}

#define W(m) "/hyla.v1.Worker/" m

static hyla_status load(const char *id, uint64_t epoch, uint64_t version, float temp, uint64_t seed) {
    Hyla__V1__LoadSessionRequest r = HYLA__V1__LOAD_SESSION_REQUEST__INIT;
    Hyla__V1__SamplingParams sp = HYLA__V1__SAMPLING_PARAMS__INIT;
    sp.temperature = temp;
    r.session_id = (char *)id;
    r.placement_epoch = epoch;
    r.snapshot_version = version;
    r.sampling = &sp;
    r.seed = seed;
    ProtobufCMessage *resp = NULL;
    hyla_rpc_call_opts o = {20000, NULL, NULL, 0};
    hyla_status s = hyla_rpc_client_unary(wc, W("LoadSession"), &r.base, &hyla__v1__worker_session_response__descriptor,
                                          &resp, &o, NULL);
    if (resp) protobuf_c_message_free_unpacked(resp, NULL);
    return s;
}

static int append_no_hint; /* append() leaves total_tokens_hint at 0 */

static hyla_status append(const char *id, const int32_t *toks, int n) {
    hyla_rpc_stream *st = NULL;
    hyla_rpc_call_opts o = {30000, NULL, NULL, 0};
    HYLA_TRY(hyla_rpc_stream_open(wc, W("Append"), &hyla__v1__append_progress__descriptor, &o, &st));
    /* in three chunks, to exercise the job across messages */
    int cuts[4] = {0, n / 3, 2 * n / 3, n};
    hyla_status s = HYLA_OK;
    for (int i = 0; i < 3 && s == HYLA_OK; i++) {
        Hyla__V1__AppendRequest r = HYLA__V1__APPEND_REQUEST__INIT;
        r.session_id = (char *)id;
        r.tokens = (int32_t *)toks + cuts[i];
        r.n_tokens = (size_t)(cuts[i + 1] - cuts[i]);
        r.total_tokens_hint = append_no_hint ? 0 : (uint64_t)n;
        s = hyla_rpc_stream_write(st, &r.base);
    }
    if (s == HYLA_OK) s = hyla_rpc_stream_close_send(st);
    int done = 0;
    while (s == HYLA_OK) {
        ProtobufCMessage *m = NULL;
        s = hyla_rpc_stream_read(st, &m);
        if (s != HYLA_OK || !m) break;
        Hyla__V1__AppendProgress *p = (Hyla__V1__AppendProgress *)m;
        if (p->done) done = p->tokens_ingested == (uint64_t)n;
        protobuf_c_message_free_unpacked(m, NULL);
    }
    hyla_status f = hyla_rpc_stream_finish(st, NULL);
    hyla_rpc_stream_destroy(st);
    if (s == HYLA_OK) s = f;
    if (s == HYLA_OK && !done) s = hyla_fail(HYLA_ERR_INTERNAL, "Append ended without done");
    return s;
}

/* The worker's position of session id (DescribeSession), -1 when it did not answer. */
static long long position_of(const char *id) {
    Hyla__V1__DescribeSessionRequest dq = HYLA__V1__DESCRIBE_SESSION_REQUEST__INIT;
    dq.session_id = (char *)id;
    hyla_rpc_call_opts o = {20000, NULL, NULL, 0};
    ProtobufCMessage *resp = NULL;
    long long pos = -1;
    if (hyla_rpc_client_unary(wc, W("DescribeSession"), &dq.base, &hyla__v1__worker_session_response__descriptor, &resp,
                              &o, NULL) == HYLA_OK &&
        resp) {
        const Hyla__V1__WorkerSessionResponse *wr = (const Hyla__V1__WorkerSessionResponse *)resp;
        pos = wr->session ? (long long)wr->session->position : -1;
    }
    if (resp) protobuf_c_message_free_unpacked(resp, NULL);
    return pos;
}

/* A worker of its own for one check: spawned with args and made the one wc talks to; side_end
 * points wc back, stops the worker (SIGTERM, waited for) and closes its output. */
typedef struct {
    pid_t pid;
    FILE *out;
    hyla_rpc_client *keep;
} side_worker;
static void side_begin(const char *const *args, side_worker *sw) {
    int port = 0;
    sw->out = NULL;
    sw->pid = spawn_worker(bin, args, &port, &sw->out);
    CHECK(port > 0);
    sw->keep = wc;
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    CHECK_OK(hyla_rpc_client_create(addr, NULL, &wc));
}
static void side_end(side_worker *sw) {
    hyla_rpc_client_destroy(wc);
    wc = sw->keep;
    kill(sw->pid, SIGTERM);
    waitpid(sw->pid, NULL, 0);
    if (sw->out) fclose(sw->out);
}

static hyla_status generate(const char *id, uint32_t n, int32_t *out, int *got) {
    Hyla__V1__GenerateRequest r = HYLA__V1__GENERATE_REQUEST__INIT;
    r.session_id = (char *)id;
    r.max_tokens = n;
    r.ignore_eos = 1;
    hyla_rpc_stream *st = NULL;
    hyla_rpc_call_opts o = {30000, NULL, NULL, 0};
    HYLA_TRY(hyla_rpc_stream_open(wc, W("Generate"), &hyla__v1__generate_response__descriptor, &o, &st));
    hyla_status s = hyla_rpc_stream_write(st, &r.base);
    if (s == HYLA_OK) s = hyla_rpc_stream_close_send(st);
    *got = 0;
    while (s == HYLA_OK) {
        ProtobufCMessage *m = NULL;
        s = hyla_rpc_stream_read(st, &m);
        if (s != HYLA_OK || !m) break;
        Hyla__V1__GenerateResponse *g = (Hyla__V1__GenerateResponse *)m;
        for (size_t i = 0; i < g->n_token_ids && *got < (int)n; i++) out[(*got)++] = g->token_ids[i];
        protobuf_c_message_free_unpacked(m, NULL);
    }
    hyla_status f = hyla_rpc_stream_finish(st, NULL);
    hyla_rpc_stream_destroy(st);
    return s == HYLA_OK ? f : s;
}

/* The session's status on the worker wc talks to (DescribeSession): the tokens it has generated
 * and its last durable snapshot version (both 0: unknown, none or failed). */
static void describe(const char *id, uint64_t *generated, uint64_t *version) {
    Hyla__V1__DescribeSessionRequest dq = HYLA__V1__DESCRIBE_SESSION_REQUEST__INIT;
    dq.session_id = (char *)id;
    ProtobufCMessage *resp = NULL;
    hyla_rpc_call_opts o = {20000, NULL, NULL, 0};
    *generated = *version = 0;
    if (hyla_rpc_client_unary(wc, W("DescribeSession"), &dq.base, &hyla__v1__worker_session_response__descriptor, &resp,
                              &o, NULL) == HYLA_OK && resp) {
        const Hyla__V1__WorkerSessionResponse *wr = (const Hyla__V1__WorkerSessionResponse *)resp;
        if (wr->session) *generated = wr->session->generated, *version = wr->session->snapshot_version;
        protobuf_c_message_free_unpacked(resp, NULL);
    }
}
static uint64_t generated_of(const char *id) {
    uint64_t g, v;
    describe(id, &g, &v);
    return g;
}
static uint64_t snapshot_version(const char *id) {
    uint64_t g, v;
    describe(id, &g, &v);
    return v;
}

static hyla_status snapshot(const char *id, uint64_t *version) {
    Hyla__V1__SnapshotRequest r = HYLA__V1__SNAPSHOT_REQUEST__INIT;
    r.session_id = (char *)id;
    ProtobufCMessage *resp = NULL;
    hyla_rpc_call_opts o = {30000, NULL, NULL, 0};
    HYLA_TRY(hyla_rpc_client_unary(wc, W("Snapshot"), &r.base, &hyla__v1__snapshot_response__descriptor, &resp, &o, NULL));
    *version = ((Hyla__V1__SnapshotResponse *)resp)->snapshot->version;
    protobuf_c_message_free_unpacked(resp, NULL);
    return HYLA_OK;
}

static hyla_status unload(const char *id) {
    Hyla__V1__UnloadRequest r = HYLA__V1__UNLOAD_REQUEST__INIT;
    r.session_id = (char *)id;
    ProtobufCMessage *resp = NULL;
    hyla_rpc_call_opts o = {30000, NULL, NULL, 0};
    HYLA_TRY(hyla_rpc_client_unary(wc, W("Unload"), &r.base, &hyla__v1__unload_response__descriptor, &resp, &o, NULL));
    protobuf_c_message_free_unpacked(resp, NULL);
    return HYLA_OK;
}

/* hyla-run reference: prompt ids, temperature, seed, n tokens -> ids */
static int reference(const int32_t *p, int np, float temp, uint64_t seed, int n, int32_t *out) {
    char ids[8192];
    size_t o = 0;
    for (int i = 0; i < np; i++) o += (size_t)snprintf(ids + o, sizeof ids - o, "%d ", p[i]);
    char cmd[12000];
    snprintf(cmd, sizeof cmd, "%s/hyla-run --model %s --prompt-ids \"%s\" --max-tokens %d --temperature %g --seed %llu --ids --ignore-eos --quiet",
             bin, model, ids, n, temp, (unsigned long long)seed);
    FILE *f = popen(cmd, "r");
    if (!f) return 0;
    int k = 0;
    while (k < n && fscanf(f, "%d", &out[k]) == 1) k++;
    pclose(f);
    return k;
}

typedef struct {
    const char *id;
    int32_t out[40];
    int got;
    hyla_status st;
} gen_arg;
typedef struct {
    char id[32];
    int n, got;
    int32_t out[200];
    hyla_status st;
    int done; /* __atomic: the call returned */
} fair_arg;
static hyla_status snapshot(const char *id, uint64_t *version);
static void *snap_thread(void *arg) {
    uint64_t v = 0;
    CHECK_OK(snapshot((const char *)arg, &v));
    return NULL;
}
static void *fair_thread(void *arg) {
    fair_arg *g = arg;
    g->st = generate(g->id, (uint32_t)g->n, g->out, &g->got);
    __atomic_store_n(&g->done, 1, __ATOMIC_RELEASE);
    return NULL;
}
static void *gen_thread(void *arg) {
    gen_arg *g = arg;
    g->st = generate(g->id, 40, g->out, &g->got);
    return NULL;
}

/* Micro-batched pipelines of real processes: two stages (layers 0:2, 2:4) and three (0:1, 1:3,
 * 3:4) with --micro-batches 1, 2 and 3; stage 0 feeds in 64-token pieces (--prefill-piece 64:
 * a 300-token prompt is five pieces posted without waiting). 24 sessions (greedy and sampled,
 * prompts of 40..300 tokens) generate 40 tokens at once, so decode steps of up to 24 rows are
 * cut into up to 3 groups of >= 8 (three stages, HYLA_DECODE_LANES=0), or run in M decode lanes
 * (two stages); each session's tokens equal hyla-run's solo run bit for bit (the unsplit model,
 * any batch), so they are the same for every M and every split. The next stage logs the groups it
 * saw (M of them when M > 1), the first stage the lanes it used; with two stages the first also
 * snapshots every session every 16 tokens while it decodes in lanes (a session due sits out one
 * lane step and is snapshotted meanwhile). A Snapshot of a session on the
 * micro-batched pipeline (ExportStage gathers the later stages' parts) restores on the whole
 * worker and continues like the uninterrupted run (pause + resume on another split). */
enum { MB_NS = 24, MB_NT = 40, MB_MORE = 12 };
static void test_pipeline_micro(const char *store_addr, const char *dir) {
    static int32_t prompts[MB_NS][300], refs[MB_NS][MB_NT + MB_MORE];
    int lens[MB_NS];
    for (int i = 0; i < MB_NS; i++) {
        lens[i] = i == 0 ? 300 : 40 + 11 * i;
        for (int t = 0; t < lens[i]; t++) prompts[i][t] = (t * 31 + 7 * i + 3) % 256;
        CHECK(reference(prompts[i], lens[i], i % 2 ? 0.8f : 0.0f, 11 + i, MB_NT + MB_MORE, refs[i]) == MB_NT + MB_MORE);
    }
    hyla_rpc_client *whole = wc;
    static const char *splits[2][3] = {{"0:2", "2:4", NULL}, {"0:1", "1:3", "3:4"}};
    for (int P = 2; P <= 3; P++)
        for (int M = 1; M <= 3; M++) {
            pid_t pid[3] = {0, 0, 0};
            int port[3] = {0, 0, 0};
            FILE *out[3] = {NULL, NULL, NULL};
            hyla_rpc_client *cl[3] = {NULL, NULL, NULL};
            char mb[8], log[3][400], next[64] = "";
            if (P == 3) setenv("HYLA_DECODE_LANES", "0", 1); /* micro-batches within each step */
            snprintf(mb, sizeof mb, "%d", M);
            for (int k = P - 1; k >= 0; k--) { /* the last stage first: each names its next */
                const char *args[20] = {"--model", model, "--layers", splits[P - 2][k], "--listen", "127.0.0.1:0",
                                        "--micro-batches", mb};
                int n = 8;
                if (k < P - 1) args[n++] = "--next-stage", args[n++] = next;
                if (k == 0) args[n++] = "--store", args[n++] = store_addr, args[n++] = "--prefill-piece", args[n++] = "64";
                if (k == 0 && P == 2) /* sessions sit out a lane step for their auto-snapshots */
                    args[n++] = "--snapshot-every", args[n++] = "16";
                args[n] = NULL;
                snprintf(log[k], sizeof log[k], "%s/mb-p%d-m%d-s%d.log", dir, P, M, k);
                pid[k] = spawn_worker_log(bin, args, &port[k], &out[k], log[k]);
                CHECK(port[k] > 0);
                if (k == 0) unsetenv("HYLA_DECODE_LANES");
                snprintf(next, sizeof next, "127.0.0.1:%d", port[k]);
                CHECK_OK(hyla_rpc_client_create(next, NULL, &cl[k]));
            }
            char ids[MB_NS][32];
            for (int i = 0; i < MB_NS; i++) {
                snprintf(ids[i], sizeof ids[i], "mb%d%d-%d", P, M, i);
                for (int k = P - 1; k >= 0; k--) {
                    wc = cl[k];
                    CHECK_OK(load(ids[i], 1, 0, i % 2 ? 0.8f : 0.0f, 11 + i));
                }
                CHECK_OK(append(ids[i], prompts[i], lens[i]));
            }
            uint64_t v0[MB_NS];
            wc = cl[0];
            for (int i = 0; i < MB_NS; i++) v0[i] = snapshot_version(ids[i]);
            gen_arg g[MB_NS];
            pthread_t th[MB_NS];
            for (int i = 0; i < MB_NS; i++) {
                g[i] = (gen_arg){.id = ids[i]};
                pthread_create(&th[i], NULL, gen_thread, &g[i]);
            }
            int same = 1;
            for (int i = 0; i < MB_NS; i++) {
                pthread_join(th[i], NULL);
                CHECK_MSG(g[i].st == HYLA_OK && g[i].got == MB_NT, "P=%d M=%d session %d: %s", P, M, i,
                          g[i].st == HYLA_OK ? "short" : hyla_status_str(g[i].st));
                same &= !memcmp(g[i].out, refs[i], sizeof g[i].out);
            }
            CHECK_MSG(same, "P=%d M=%d: a session's tokens on the micro-batched pipeline differ from hyla-run's", P, M);
            if (P == 2) { /* auto-snapshots went on while the sessions decoded (40 tokens: >= 2 each) */
                wc = cl[0];
                int more = 0;
                for (int tries = 0; tries < 40 && !more; tries++) {
                    for (int i = 0; i < MB_NS && !more; i++) more = snapshot_version(ids[i]) >= v0[i] + 2;
                    if (!more) usleep(50000);
                }
                CHECK_MSG(more, "P=2 M=%d: no session took two auto-snapshots while decoding", M);
            }
            if (P == 2) { /* the lanes stage 0 used */
                char want[64], line[512];
                snprintf(want, sizeof want, "decode in %d lanes", M);
                FILE *f = fopen(log[0], "r");
                int seen = 0, lanes = 0;
                while (f && fgets(line, sizeof line, f)) {
                    if (strstr(line, want)) seen = 1;
                    if (strstr(line, "lanes (")) lanes = 1;
                }
                if (f) fclose(f);
                CHECK_MSG(M == 1 ? !lanes : seen, "P=2 M=%d: stage 0 did not decode in %d lanes", M, M);
            }
            for (int k = 1; k < P && P == 3; k++) { /* the groups every later stage saw */
                char want[64], line[512];
                snprintf(want, sizeof want, "(group 0 of %d)", M);
                FILE *f = fopen(log[k], "r");
                int seen = 0, more = 0;
                while (f && fgets(line, sizeof line, f)) {
                    if (strstr(line, want)) seen = 1;
                    if (strstr(line, "micro-batches (group")) more++;
                }
                if (f) fclose(f);
                CHECK_MSG(M == 1 ? more == 0 : seen, "P=%d M=%d: stage %d saw no step in %d micro-batches", P, M, k, M);
            }
            /* pause (a snapshot of all stages) and resume on the whole worker */
            uint64_t pv = 0;
            int got = 0;
            int32_t more[MB_MORE];
            wc = cl[0];
            CHECK_OK(snapshot(ids[5], &pv));
            wc = whole;
            CHECK_OK(load(ids[5], 1, pv, 0, 0));
            CHECK_OK(generate(ids[5], MB_MORE, more, &got));
            CHECK_MSG(got == MB_MORE && !memcmp(more, refs[5] + MB_NT, sizeof more),
                      "P=%d M=%d: the pipeline's snapshot restored on the whole worker continues differently", P, M);
            CHECK_OK(unload(ids[5]));
            for (int k = 0; k < P; k++) {
                hyla_rpc_client_destroy(cl[k]);
                kill(pid[k], SIGTERM);
                waitpid(pid[k], NULL, 0);
                if (out[k]) fclose(out[k]);
            }
        }
    wc = whole;
}

/* A fake coordinator for the heartbeat-unload race: it registers the worker (heartbeat every
 * 50 ms) and, when a heartbeat reports session "s-h" under placement epoch 1, holds its answer
 * until the test has re-placed s-h on the worker under epoch 2, then answers "unload s-h" (what a
 * coordinator says to a stale report). The later heartbeats are counted. */
static pthread_mutex_t fc_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t fc_cv = PTHREAD_COND_INITIALIZER;
static int fc_seen_old, fc_release, fc_after; /* s-h@1 reported; answer it; heartbeats after that */
static char fc_store[64];

static void fc_register(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *msg, void *ud) {
    (void)msg;
    (void)ud;
    if (ev != HYLA_RPC_EV_START) return;
    Hyla__V1__RegisterWorkerResponse r = HYLA__V1__REGISTER_WORKER_RESPONSE__INIT;
    r.worker_id = "wh";
    r.epoch = 1;
    r.heartbeat_interval_ms = 50;
    r.heartbeat_timeout_ms = 10000;
    r.group_id = "g-wh";
    r.next_stage_address = "";
    r.store_address = fc_store;
    hyla_rpc_call_reply(call, &r.base);
}

static void fc_heartbeat(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *msg, void *ud) {
    (void)ud;
    if (ev != HYLA_RPC_EV_START) return;
    const Hyla__V1__HeartbeatRequest *q = (const Hyla__V1__HeartbeatRequest *)msg;
    uint64_t ep = 0;
    for (size_t i = 0; i < q->n_sessions; i++)
        if (q->sessions[i] && q->sessions[i]->session_id && !strcmp(q->sessions[i]->session_id, "s-h"))
            ep = q->sessions[i]->placement_epoch;
    Hyla__V1__HeartbeatResponse r = HYLA__V1__HEARTBEAT_RESPONSE__INIT;
    char *ids[1] = {"s-h"};
    pthread_mutex_lock(&fc_mu);
    int hold = ep == 1 && !fc_seen_old;
    if (hold) {
        fc_seen_old = 1;
        pthread_cond_broadcast(&fc_cv);
        while (!fc_release) pthread_cond_wait(&fc_cv, &fc_mu); /* the test re-places s-h meanwhile */
        r.n_unload_session_ids = 1;
        r.unload_session_ids = ids;
    } else if (fc_seen_old && fc_release) {
        fc_after++;
        pthread_cond_broadcast(&fc_cv);
    }
    pthread_mutex_unlock(&fc_mu);
    hyla_rpc_call_reply(call, &r.base);
}

static void fc_report(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *msg, void *ud) {
    (void)msg;
    (void)ud;
    if (ev != HYLA_RPC_EV_START) return;
    Hyla__V1__ReportSnapshotResponse r = HYLA__V1__REPORT_SNAPSHOT_RESPONSE__INIT;
    hyla_rpc_call_reply(call, &r.base);
}

/* Wait (up to ms) until cond() holds under fc_mu. */
static int fc_wait(int (*cond)(void), int ms) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    t.tv_sec += ms / 1000;
    pthread_mutex_lock(&fc_mu);
    int rc = 0;
    while (!cond() && rc == 0) rc = pthread_cond_timedwait(&fc_cv, &fc_mu, &t);
    int ok = cond();
    pthread_mutex_unlock(&fc_mu);
    return ok;
}
static int fc_cond_seen(void) { return fc_seen_old; }
static int fc_cond_two_after(void) { return fc_after >= 2; }

int main(int argc, char **argv) {
    const char *arch = argc > 1 ? argv[1] : "sse-h"; /* the model's hyla-mkmodel arch */
    /* --state-budget below holds one session but not two: a 300-token sse-h session is ~140 KB,
     * a mamba2-h one ~290 KB (three layers of S [4][128][32] fp32 and the conv tails) */
    const char *state_budget = strcmp(arch, "sse-h") ? "0.4" : "0.15";
    signal(SIGPIPE, SIG_IGN);
    bin = hyla_test_env("HYLA_BIN_DIR", "build/bin");
    char dir[] = "/tmp/hyla-test-worker-XXXXXX";
    if (!mkdtemp(dir)) return 1;
    snprintf(model, sizeof model, "%s/model", dir);
    char cmd[1024];
    /* SSE: windows of 64, so that the pipeline's first stage at a 64 KiB message limit can carry a
     * prefill chunk (128 rows of hidden 64) */
    snprintf(cmd, sizeof cmd, "%s/hyla-mkmodel --arch %s --layers 4 --hidden 64 --heads 4 --seed 2 %s--out %s 2>/dev/null",
             bin, arch, !strncmp(arch, "sse", 3) ? "--prefill-window 64 " : "", model);
    if (system(cmd) != 0) return 1;

    /* the statestore, in this process */
    char dbdir[300];
    snprintf(dbdir, sizeof dbdir, "%s/db", dir);
    hyla_store *store = NULL;
    hyla_store_params spar = hyla_store_default_params();
    spar.keep_versions = 1000; /* the auto-snapshot check below reads every version */
    CHECK_OK(hyla_store_open(dbdir, &spar, &store));
    hyla_rpc_server *srv = NULL;
    CHECK_OK(hyla_rpc_server_create(NULL, &srv));
    CHECK_OK(hyla_store_rpc_register(srv, store, NULL));
    int sport = 0;
    CHECK_OK(hyla_rpc_server_listen(srv, "127.0.0.1:0", &sport));
    CHECK_OK(hyla_rpc_server_start(srv));

    /* the worker process */
    char store_addr[64];
    snprintf(store_addr, sizeof store_addr, "127.0.0.1:%d", sport);
    const char *wargs[] = {"--model", model, "--store", store_addr, "--listen", "127.0.0.1:0", "--snapshot-every", "100", NULL};
    FILE *wout = NULL;
    int wport = 0;
    char wlog[300];
    snprintf(wlog, sizeof wlog, "%s/worker.log", dir);
    /* this worker decodes one step ahead (a GPU worker's default; HYLA_DECODE_LANES=1 on the
     * CPU): every check on it below runs through the posted lane, the others' workers do not */
    setenv("HYLA_DECODE_LANES", "1", 1);
    pid_t pid = spawn_worker_log(bin, wargs, &wport, &wout, wlog);
    unsetenv("HYLA_DECODE_LANES");
    CHECK(wport > 0);
    if (wport <= 0) {
        kill(pid, SIGKILL);
        return hyla_test_done("test_worker");
    }
    char waddr[64];
    snprintf(waddr, sizeof waddr, "127.0.0.1:%d", wport);
    CHECK_OK(hyla_rpc_client_create(waddr, NULL, &wc));

    int32_t prompt[300];
    for (int i = 0; i < 300; i++) prompt[i] = (i * 37 + 11) % 256;
    int32_t ref[64], a[64], b[32];
    int got = 0;
    CHECK(reference(prompt, 300, 0.8f, 7, 64, ref) == 64);

    /* 32 + snapshot + 32 == 64 */
    CHECK_OK(load("s-a", 1, 0, 0.8f, 7));
    CHECK_OK(append("s-a", prompt, 300));
    CHECK_OK(generate("s-a", 32, a, &got));
    CHECK(got == 32);
    uint64_t v = 0;
    CHECK_OK(snapshot("s-a", &v));
    CHECK(v >= 1);
    CHECK_OK(generate("s-a", 32, a + 32, &got));
    CHECK_MSG(!memcmp(a, ref, sizeof ref), "worker's 32 + 32 differs from hyla-run's 64");

    /* unload, restore from the snapshot under a new epoch, continue */
    CHECK_OK(unload("s-a"));
    CHECK_OK(load("s-a", 2, v, 0, 0));
    CHECK_OK(generate("s-a", 32, b, &got));
    CHECK_MSG(!memcmp(b, ref + 32, sizeof b), "restored session continues differently");

    /* two sessions generating at once == their solo runs */
    int32_t r1[40], r2[40];
    CHECK(reference(prompt, 120, 0.0f, 1, 40, r1) == 40);
    CHECK(reference(prompt + 50, 200, 0.9f, 3, 40, r2) == 40);
    CHECK_OK(load("s-b", 1, 0, 0.0f, 1));
    CHECK_OK(load("s-c", 1, 0, 0.9f, 3));
    CHECK_OK(append("s-b", prompt, 120));
    CHECK_OK(append("s-c", prompt + 50, 200));
    gen_arg g1 = {"s-b", {0}, 0, 0}, g2 = {"s-c", {0}, 0, 0};
    pthread_t t1, t2;
    pthread_create(&t1, NULL, gen_thread, &g1);
    pthread_create(&t2, NULL, gen_thread, &g2);
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    CHECK_OK(g1.st);
    CHECK_OK(g2.st);
    CHECK_MSG(g1.got == 40 && !memcmp(g1.out, r1, sizeof r1), "batched session b differs from its solo run");
    CHECK_MSG(g2.got == 40 && !memcmp(g2.out, r2, sizeof r2), "batched session c differs from its solo run");
    /* a prompt appended while another session decodes one step ahead: the whole model's lane
     * step feeds it between its collect and its post (the runtime refuses a forward while a lane
     * is posted, so a feed at the wrong time would fail the Append); both give their solo runs */
    {
        int32_t r3[40], r4[40];
        CHECK(reference(prompt, 150, 0.0f, 5, 40, r3) == 40);
        CHECK(reference(prompt + 20, 280, 0.7f, 6, 40, r4) == 40);
        CHECK_OK(load("s-g", 1, 0, 0.0f, 5));
        CHECK_OK(load("s-h", 1, 0, 0.7f, 6));
        CHECK_OK(append("s-g", prompt, 150));
        gen_arg g3 = {"s-g", {0}, 0, 0};
        pthread_t t3;
        pthread_create(&t3, NULL, gen_thread, &g3);
        usleep(2000);
        hyla_status as = append("s-h", prompt + 20, 280);
        pthread_join(t3, NULL);
        CHECK_MSG(as == HYLA_OK, "an Append while another session decodes ahead: %s", hyla_last_error());
        CHECK_OK(g3.st);
        CHECK_MSG(g3.got == 40 && !memcmp(g3.out, r3, sizeof r3), "a session decoding beside an Append differs");
        int32_t h[40];
        CHECK_OK(generate("s-h", 40, h, &got));
        CHECK_MSG(got == 40 && !memcmp(h, r4, sizeof r4), "a session appended beside a decoding one differs");
    }
    {
        FILE *f = fopen(wlog, "r");
        char line[512];
        int ahead = 0;
        while (f && fgets(line, sizeof line, f)) ahead |= strstr(line, "decode one step ahead") != NULL;
        if (f) fclose(f);
        CHECK_MSG(ahead, "the worker with HYLA_DECODE_LANES=1 did not decode one step ahead (%s)", wlog);
    }

    /* fork without reseed: both continue identically */
    {
        Hyla__V1__ForkSessionRequest r = HYLA__V1__FORK_SESSION_REQUEST__INIT;
        r.session_id = "s-c";
        r.new_session_id = "s-d";
        r.placement_epoch = 1;
        ProtobufCMessage *resp = NULL;
        hyla_rpc_call_opts o = {20000, NULL, NULL, 0};
        CHECK_OK(hyla_rpc_client_unary(wc, W("ForkSession"), &r.base, &hyla__v1__worker_session_response__descriptor,
                                       &resp, &o, NULL));
        if (resp) protobuf_c_message_free_unpacked(resp, NULL);
        int32_t x[8], y[8];
        CHECK_OK(generate("s-c", 8, x, &got));
        CHECK_OK(generate("s-d", 8, y, &got));
        CHECK_MSG(!memcmp(x, y, sizeof x), "fork continues differently from its parent");
    }

    /* errors */
    hyla_status s = generate("s-nope", 4, b, &got);
    CHECK_MSG(s == HYLA_ERR_NOT_FOUND, "unknown session: %s", hyla_last_error());
    s = generate("s-a", 0, b, &got);
    CHECK_MSG(s == HYLA_ERR_INVALID_ARG && strstr(hyla_last_error(), "max_tokens"), "%s", hyla_last_error());
    int32_t bad[2] = {1, 99999};
    s = append("s-a", bad, 2);
    CHECK_MSG(s == HYLA_ERR_INVALID_ARG && strstr(hyla_last_error(), "99999"), "%s", hyla_last_error());
    CHECK_OK(load("s-e", 1, 0, 0, 0));
    s = generate("s-e", 4, b, &got);
    CHECK_MSG(s != HYLA_OK && strstr(hyla_last_error(), "Append a prompt first"), "generate before append: %s",
              hyla_last_error());
    /* the worker is still serving */
    CHECK_OK(generate("s-a", 2, b, &got));

    /* --max-append-tokens: a document declared larger is refused before anything is added; one
     * that only turns out larger is refused when it passes the limit, and the error says what
     * the call had added (it stays: an Append is not a transaction) */
    {
        const char *a7[] = {"--model", model, "--listen", "127.0.0.1:0", "--max-append-tokens", "100", NULL};
        side_worker w7;
        side_begin(a7, &w7);
        CHECK_OK(load("s-m", 1, 0, 0, 0));
        s = append("s-m", prompt, 300);
        CHECK_MSG(s != HYLA_OK && strstr(hyla_last_error(), "declared 300 tokens") &&
                      strstr(hyla_last_error(), "max_append_tokens") && strstr(hyla_last_error(), "nothing was added"),
                  "an Append declaring 300 tokens over a limit of 100: %s", hyla_last_error());
        long long pos = position_of("s-m");
        CHECK_MSG(pos == 0, "the refused Append left the session at position %lld", pos);
        append_no_hint = 1;
        s = append("s-m", prompt, 300);
        append_no_hint = 0;
        char err[1024];
        snprintf(err, sizeof err, "%s", hyla_last_error());
        CHECK_MSG(s != HYLA_OK && strstr(err, "exceeds the limit of 100 tokens"), "300 tokens over a limit of 100: %s", err);
        pos = position_of("s-m");
        char at[64];
        snprintf(at, sizeof at, "is at position %lld)", pos);
        CHECK_MSG(pos >= 0 && pos <= 100 && (pos == 0 || strstr(err, at)),
                  "after the refusal the session is at %lld; the error said: %s", pos, err);
        side_end(&w7);
    }

    /* a two-stage pipeline: layers [0, 2) on one worker, [2, 4) on another, hidden states over
     * StageForward; tokens equal the one-worker run */
    {
        FILE *o1 = NULL, *o2 = NULL;
        int p1 = 0, p2 = 0;
        const char *a2[] = {"--model", model, "--layers", "2:4", "--listen", "127.0.0.1:0", NULL};
        pid_t pid2 = spawn_worker(bin, a2, &p2, &o2);
        char next[64];
        snprintf(next, sizeof next, "127.0.0.1:%d", p2);
        const char *a1[] = {"--model", model, "--layers", "0:2", "--next-stage", next, "--listen", "127.0.0.1:0",
                            "--store", store_addr, NULL};
        pid_t pid1 = spawn_worker(bin, a1, &p1, &o1);
        CHECK(p1 > 0 && p2 > 0);
        hyla_rpc_client *keep = wc, *c2 = NULL;
        char addr[64];
        snprintf(addr, sizeof addr, "127.0.0.1:%d", p2);
        CHECK_OK(hyla_rpc_client_create(addr, NULL, &c2));
        wc = c2;
        CHECK_OK(load("s-p", 1, 0, 0.8f, 7));
        snprintf(addr, sizeof addr, "127.0.0.1:%d", p1);
        CHECK_OK(hyla_rpc_client_create(addr, NULL, &wc));
        CHECK_OK(load("s-p", 1, 0, 0.8f, 7));
        CHECK_OK(append("s-p", prompt, 300));
        int32_t pp[64];
        CHECK_OK(generate("s-p", 64, pp, &got));
        CHECK_MSG(got == 64 && !memcmp(pp, ref, sizeof ref), "two-stage pipeline differs from one worker");
        /* a snapshot of the split session gathers both stages' parts; it restores on the
         * one-worker process (another split) and continues like the uninterrupted run */
        uint64_t pv = 0;
        int32_t more[16], ref80[80];
        CHECK(reference(prompt, 300, 0.8f, 7, 80, ref80) == 80);
        CHECK_OK(snapshot("s-p", &pv));
        hyla_rpc_client *pipe_c = wc;
        wc = keep;
        CHECK_OK(load("s-p", 1, pv, 0, 0));
        CHECK_OK(generate("s-p", 16, more, &got));
        CHECK_MSG(got == 16 && !memcmp(more, ref80 + 64, sizeof more), "pipeline snapshot restored on one worker differs");
        wc = pipe_c;
        hyla_rpc_client_destroy(wc);
        hyla_rpc_client_destroy(c2);
        wc = keep;
        kill(pid1, SIGTERM);
        kill(pid2, SIGTERM);
        waitpid(pid1, NULL, 0);
        waitpid(pid2, NULL, 0);
        fclose(o1);
        fclose(o2);
    }

    if (!strcmp(arch, "sse-h")) test_pipeline_micro(store_addr, dir); /* (once: the split is what it tests) */

    /* a state budget smaller than two sessions: the idle one is evicted (to host memory, with a
     * durable snapshot) and restored transparently when addressed, continuing bit for bit */
    {
        const char *a3[] = {"--model", model, "--store", store_addr, "--listen", "127.0.0.1:0", "--state-budget", state_budget, NULL};
        side_worker w3;
        side_begin(a3, &w3);
        int32_t e1[16], e2[8];
        CHECK_OK(load("s-x", 1, 0, 0.8f, 7));
        CHECK_OK(append("s-x", prompt, 300));
        CHECK_OK(generate("s-x", 8, e1, &got));
        CHECK_OK(load("s-y", 1, 0, 0.0f, 1));
        CHECK_OK(append("s-y", prompt, 120));
        CHECK_OK(generate("s-y", 8, e2, &got));
        Hyla__V1__DescribeSessionRequest dq = HYLA__V1__DESCRIBE_SESSION_REQUEST__INIT;
        dq.session_id = "s-x";
        ProtobufCMessage *resp = NULL;
        hyla_rpc_call_opts o = {20000, NULL, NULL, 0};
        CHECK_OK(hyla_rpc_client_unary(wc, W("DescribeSession"), &dq.base, &hyla__v1__worker_session_response__descriptor,
                                       &resp, &o, NULL));
        if (resp) {
            const Hyla__V1__WorkerSessionResponse *wr = (const Hyla__V1__WorkerSessionResponse *)resp;
            CHECK_MSG(wr->session && wr->session->tier == HYLA__V1__TIER__TIER_HOST, "idle session not evicted (tier %d)",
                      wr->session ? (int)wr->session->tier : -1);
            protobuf_c_message_free_unpacked(resp, NULL);
        }
        CHECK_OK(generate("s-x", 8, e1 + 8, &got));
        CHECK_MSG(!memcmp(e1, ref, sizeof e1), "evicted and restored session continues differently");
        side_end(&w3);
    }

    /* a host budget too: an evicted session whose durable snapshot covers it leaves the worker
     * (NOT_FOUND there); loading its head version elsewhere continues bit for bit */
    {
        const char *a4[] = {"--model", model, "--store", store_addr, "--listen", "127.0.0.1:0", "--state-budget", state_budget,
                            "--host-budget", "0.01", NULL};
        side_worker w4;
        side_begin(a4, &w4);
        int32_t e1[16], e2[8];
        CHECK_OK(load("s-u", 1, 0, 0.8f, 7));
        CHECK_OK(append("s-u", prompt, 300));
        CHECK_OK(generate("s-u", 8, e1, &got));
        CHECK_OK(load("s-v", 1, 0, 0.0f, 1));
        CHECK_OK(append("s-v", prompt, 120));
        CHECK_OK(generate("s-v", 8, e2, &got));
        hyla_status ds = HYLA_OK;
        for (int i = 0; i < 100; i++) { /* the durable put completes asynchronously */
            Hyla__V1__DescribeSessionRequest dq = HYLA__V1__DESCRIBE_SESSION_REQUEST__INIT;
            dq.session_id = "s-u";
            ProtobufCMessage *resp = NULL;
            hyla_rpc_call_opts o = {20000, NULL, NULL, 0};
            ds = hyla_rpc_client_unary(wc, W("DescribeSession"), &dq.base, &hyla__v1__worker_session_response__descriptor,
                                       &resp, &o, NULL);
            if (resp) protobuf_c_message_free_unpacked(resp, NULL);
            if (ds == HYLA_ERR_NOT_FOUND) break;
            usleep(50000);
        }
        CHECK_MSG(ds == HYLA_ERR_NOT_FOUND, "session over the host budget still on the worker");
        hyla_store_session_info si;
        CHECK_OK(hyla_store_info(store, "s-u", &si));
        CHECK_OK(load("s-u", 2, si.head_version, 0, 0));
        CHECK_OK(generate("s-u", 8, e1 + 8, &got));
        CHECK_MSG(!memcmp(e1, ref, sizeof e1), "session unloaded to the store continues differently");
        side_end(&w4);
    }

    /* more sessions generating than a step takes (--max-batch 2, four sessions): each step takes
     * those decoded least recently, so the four advance together and, when the first finishes,
     * the others are nearly done (the table's order, newest first, used to leave the two oldest
     * waiting until the newest had finished); with plain steps and one step ahead; every
     * session's tokens are its solo run's. The four calls are made while a Snapshot holds the
     * scheduler (its copies take 0.8 s: HYLA_CPU_CAPTURE_MS), so they start together. */
    for (int ahead = 0; ahead < 2; ahead++) {
        enum { FN = 4, FT = 150 };
        static int32_t fref[FN][FT];
        for (int i = 0; i < FN; i++) CHECK(reference(prompt + 7 * i, 50, 0.0f, 30 + i, FT, fref[i]) == FT);
        const char *a9[] = {"--model", model, "--store", store_addr, "--listen", "127.0.0.1:0", "--max-batch", "2",
                            "--snapshot-every", "0", NULL};
        setenv("HYLA_DECODE_LANES", ahead ? "1" : "0", 1);
        setenv("HYLA_CPU_CAPTURE_MS", "800", 1); /* the Snapshot below holds the scheduler 0.8 s */
        side_worker w9;
        side_begin(a9, &w9);
        unsetenv("HYLA_DECODE_LANES");
        unsetenv("HYLA_CPU_CAPTURE_MS");
        fair_arg fa[FN];
        pthread_t ft[FN];
        for (int i = 0; i < FN; i++) {
            snprintf(fa[i].id, sizeof fa[i].id, "s-fair%d%d", ahead, i);
            CHECK_OK(load(fa[i].id, 1, 0, 0.0f, 30 + i));
            CHECK_OK(append(fa[i].id, prompt + 7 * i, 50));
        }
        /* the four Generate calls arrive while a Snapshot's export holds the scheduler, so they
         * start together, whatever the threads' timing */
        pthread_t st9;
        pthread_create(&st9, NULL, snap_thread, fa[0].id);
        usleep(200000);
        for (int i = 0; i < FN; i++) {
            fa[i].n = FT;
            fa[i].done = 0;
            pthread_create(&ft[i], NULL, fair_thread, &fa[i]);
        }
        pthread_join(st9, NULL);
        int first = -1;
        for (int tries = 0; tries < 20000 && first < 0; tries++) {
            for (int i = 0; i < FN && first < 0; i++)
                if (__atomic_load_n(&fa[i].done, __ATOMIC_ACQUIRE)) first = i;
            if (first < 0) usleep(500);
        }
        int least = FT;
        for (int i = 0; i < FN; i++) {
            int g = (int)generated_of(fa[i].id);
            if (i != first && g < least) least = g;
        }
        for (int i = 0; i < FN; i++) pthread_join(ft[i], NULL);
        CHECK_MSG(first >= 0 && least >= FT * 2 / 3,
                  "ahead=%d, --max-batch 2: when one session had its %d tokens another had %d", ahead, FT, least);
        int same = 1;
        for (int i = 0; i < FN; i++) same &= fa[i].st == HYLA_OK && fa[i].got == FT && !memcmp(fa[i].out, fref[i], sizeof fref[i]);
        CHECK_MSG(same, "ahead=%d: a session of an oversubscribed worker differs from its solo run", ahead);
        side_end(&w9);
    }

    /* an auto-snapshot whose copies take 60 s (the CPU backend's HYLA_CPU_CAPTURE_MS, as a GPU's
     * copies of a long document's KV take seconds): the Generate that follows the Append is served
     * while they run (the idle scheduler used to wait for them, so the call ran past its 30 s
     * deadline), and the snapshot is then still in flight (no durable version) */
    {
        const char *a8[] = {"--model", model, "--store", store_addr, "--listen", "127.0.0.1:0", "--snapshot-every", "8",
                            NULL};
        setenv("HYLA_CPU_CAPTURE_MS", "60000", 1);
        side_worker w8;
        side_begin(a8, &w8);
        unsetenv("HYLA_CPU_CAPTURE_MS");
        int32_t r8[4], o8[4];
        CHECK(reference(prompt, 60, 0.0f, 8, 4, r8) == 4);
        CHECK_OK(load("s-slow", 1, 0, 0.0f, 8));
        CHECK_OK(append("s-slow", prompt, 60));
        usleep(100000); /* the scheduler has begun the snapshot and gone idle */
        hyla_status gs = generate("s-slow", 4, o8, &got);
        CHECK_MSG(gs == HYLA_OK, "a Generate beside an auto-snapshot's slow copies: %s", hyla_last_error());
        CHECK_MSG(got == 4 && !memcmp(o8, r8, sizeof r8), "generating beside a slow snapshot copy differs");
        CHECK_MSG(snapshot_version("s-slow") == 0, "the slow auto-snapshot was durable before its copies could end");
        kill(w8.pid, SIGKILL); /* a stop would end the pending export first, waiting out its copies */
        side_end(&w8);
    }

    /* --snapshot-concurrency 1: six sessions generating at once pass their snapshot points
     * together, yet one auto-snapshot at a time is begun (the worker's debug log: never a second
     * export begun before the last one's put is durable); the others go on decoding (one step
     * ahead: a due session sits out a step only when its snapshot begins; one put at a time
     * bounds how many they take), each takes one, and each gives its solo run's tokens; the
     * hyla_worker_snapshots gauge never reads two under way */
    {
        enum { CN = 6 };
        static int32_t cref[CN][40];
        for (int i = 0; i < CN; i++)
            CHECK(reference(prompt + 10 * i, 60, i % 2 ? 0.8f : 0.0f, 20 + i, 40, cref[i]) == 40);
        char clog[320];
        snprintf(clog, sizeof clog, "%s/concurrency.log", dir);
        char cport[320];
        snprintf(cport, sizeof cport, "%s/metrics-port-cc", dir);
        const char *a6[] = {"--model", model, "--store", store_addr, "--listen", "127.0.0.1:0", "--snapshot-every", "8",
                            "--snapshot-concurrency", "1", "--metrics", "127.0.0.1:0", "--metrics-port-file", cport,
                            NULL};
        setenv("HYLA_DECODE_LANES", "1", 1);
        setenv("HYLA_LOG", "debug", 1);
        FILE *o6 = NULL;
        int p6 = 0;
        pid_t pid6 = spawn_worker_log(bin, a6, &p6, &o6, clog);
        unsetenv("HYLA_DECODE_LANES");
        unsetenv("HYLA_LOG");
        CHECK(p6 > 0);
        hyla_rpc_client *keep = wc;
        char addr[64];
        snprintf(addr, sizeof addr, "127.0.0.1:%d", p6);
        CHECK_OK(hyla_rpc_client_create(addr, NULL, &wc));
        gen_arg cg[CN];
        pthread_t ct[CN];
        char cid[CN][16];
        for (int i = 0; i < CN; i++) {
            snprintf(cid[i], sizeof cid[i], "s-cc%d", i);
            CHECK_OK(load(cid[i], 1, 0, i % 2 ? 0.8f : 0.0f, 20 + i));
            CHECK_OK(append(cid[i], prompt + 10 * i, 60));
        }
        for (int i = 0; i < CN; i++) {
            cg[i] = (gen_arg){.id = cid[i]};
            pthread_create(&ct[i], NULL, gen_thread, &cg[i]);
        }
        int same = 1, snapped = 1;
        double most_m = -1; /* the gauge while they decode: never two under way */
        for (int k = 0; k < 5; k++) {
            double v = scrape(cport, "hyla_worker_snapshots{state=\"in_flight\"}");
            if (v > most_m) most_m = v;
        }
        CHECK_MSG(most_m >= 0 && most_m <= 1, "hyla_worker_snapshots{state=\"in_flight\"} read %.0f", most_m);
        CHECK_MSG(scrape(cport, "hyla_worker_snapshots{state=\"waiting\"}") >= 0, "no hyla_worker_snapshots waiting gauge");
        for (int i = 0; i < CN; i++) {
            pthread_join(ct[i], NULL);
            same &= cg[i].st == HYLA_OK && cg[i].got == 40 && !memcmp(cg[i].out, cref[i], sizeof cref[i]);
        }
        CHECK_MSG(same, "--snapshot-concurrency 1: a session's tokens differ from its solo run");
        for (int i = 0, tries = 0; i < CN && tries < 100; tries++) { /* the last puts may still be on their way */
            if (snapshot_version(cid[i]) >= 1) i++;
            else usleep(50000);
        }
        for (int i = 0; i < CN; i++) snapped &= snapshot_version(cid[i]) >= 1;
        CHECK_MSG(snapped, "--snapshot-concurrency 1: a session took no auto-snapshot");
        hyla_rpc_client_destroy(wc);
        wc = keep;
        kill(pid6, SIGTERM);
        waitpid(pid6, NULL, 0);
        fclose(o6);
        FILE *f = fopen(clog, "r");
        char line[1024];
        int in_flight = 0, most = 0, begun = 0;
        while (f && fgets(line, sizeof line, f)) {
            if (strstr(line, "export begun")) begun++, in_flight++;
            if (strstr(line, "durable at position")) in_flight--;
            if (in_flight > most) most = in_flight;
        }
        if (f) fclose(f);
        CHECK_MSG(begun >= CN && most == 1, "--snapshot-concurrency 1: %d exports begun, up to %d in flight (%s)", begun,
                  most, clog);
    }

    /* auto-snapshots every 8 tokens while generating: each is exported asynchronously (begun,
     * then ended after later decode steps of the same session). Every version the store holds
     * restores on the other worker and continues exactly like the uninterrupted run. */
    {
        FILE *o5 = NULL;
        int p5 = 0;
        char mport[320];
        snprintf(mport, sizeof mport, "%s/metrics-port", dir);
        const char *a5[] = {"--model", model, "--store", store_addr, "--listen", "127.0.0.1:0", "--snapshot-every", "8",
                            "--metrics", "127.0.0.1:0", "--metrics-port-file", mport, NULL};
        pid_t pid5 = spawn_worker(bin, a5, &p5, &o5);
        CHECK(p5 > 0);
        hyla_rpc_client *keep = wc;
        char addr[64];
        snprintf(addr, sizeof addr, "127.0.0.1:%d", p5);
        CHECK_OK(hyla_rpc_client_create(addr, NULL, &wc));
        enum { NG = 120 };
        int32_t gref[NG], gq[NG], rest[NG];
        CHECK(reference(prompt, 300, 0.8f, 7, NG, gref) == NG);
        CHECK_OK(load("s-q", 1, 0, 0.8f, 7));
        CHECK_OK(append("s-q", prompt, 300));
        /* four calls of 30 tokens; between them the puts settle, so every call starts with a
         * snapshot due and takes at least one while it decodes, however slow the store is */
        for (int r = 0, total = 0; r < 4; r++) {
            CHECK_OK(generate("s-q", NG / 4, gq + total, &got));
            total += got;
            size_t last = (size_t)-1;
            for (int i = 0, stable = 0; i < 200 && stable < 6; i++) {
                uint64_t *vv = NULL;
                size_t n = 0;
                /* the first put may not be committed yet: no such session is 0 versions */
                hyla_status vs = hyla_store_versions(store, "s-q", &vv, &n);
                CHECK_MSG(vs == HYLA_OK || vs == HYLA_ERR_NOT_FOUND, "store versions of s-q: %s", hyla_last_error());
                if (vs != HYLA_OK) n = 0;
                free(vv);
                stable = n == last ? stable + 1 : 0;
                last = n;
                usleep(50000);
            }
            if (r == 3) CHECK_MSG(total == NG && !memcmp(gq, gref, sizeof gref), "generation with auto-snapshots differs");
        }
        /* after the first, each durable put exported only the KV rows past the version before it */
        double exported = scrape(mport, "hyla_worker_snapshot_exported_bytes_total"),
               whole = scrape(mport, "hyla_worker_snapshot_state_bytes_total");
        printf("auto-snapshots: %.0f of %.0f state bytes exported\n", exported, whole);
        CHECK_MSG(whole > 0 && exported > 0 && exported <= whole, "exported bytes %.0f, state bytes %.0f", exported, whole);
        if (!strcmp(arch, "sse-h")) CHECK_MSG(exported < whole, "auto-snapshots exported the whole KV every time");
        hyla_rpc_client_destroy(wc);
        kill(pid5, SIGTERM); /* ends the pending export and its put before exiting */
        waitpid(pid5, NULL, 0);
        fclose(o5);
        wc = keep;
        uint64_t *vers = NULL;
        size_t nv = 0;
        CHECK_OK(hyla_store_versions(store, "s-q", &vers, &nv));
        int mid = 0;
        uint64_t epoch = 1;
        for (size_t i = 0; i < nv; i++) {
            hyla_snapshot *sv = NULL;
            CHECK_OK(hyla_store_get(store, "s-q", vers[i], 0, &sv, NULL));
            if (!sv) continue;
            int g = (int)sv->n_generated;
            hyla_snapshot_destroy(sv);
            if (g <= 0 || g >= NG || mid >= 6) continue; /* taken after the prompt, or at the very end */
            mid++;
            CHECK_OK(load("s-q", epoch++, vers[i], 0, 0));
            CHECK_OK(generate("s-q", (uint32_t)(NG - g), rest, &got));
            CHECK_MSG(got == NG - g && !memcmp(rest, gref + g, (size_t)(NG - g) * sizeof *rest),
                      "auto-snapshot version %llu (after %d generated tokens) continues differently",
                      (unsigned long long)vers[i], g);
        }
        free(vers);
        printf("auto-snapshots: %zu versions, %d taken while generating checked: each continues bit for bit\n", nv, mid);
        CHECK_MSG(mid >= 2, "only %d auto-snapshots were taken during generation", mid);
        CHECK_OK(unload("s-q"));
    }

    /* a heartbeat answered "unload" for the placement it reported (epoch 1) after the session was
     * re-placed on this worker under epoch 2: the worker keeps the newer placement */
    {
        hyla_rpc_server *fc = NULL;
        CHECK_OK(hyla_rpc_server_create(NULL, &fc));
        CHECK_OK(hyla_rpc_server_add_method(fc, "/hyla.v1.Coordinator/RegisterWorker", HYLA_RPC_UNARY,
                                            &hyla__v1__register_worker_request__descriptor,
                                            &hyla__v1__register_worker_response__descriptor, fc_register, NULL));
        CHECK_OK(hyla_rpc_server_add_method(fc, "/hyla.v1.Coordinator/Heartbeat", HYLA_RPC_UNARY,
                                            &hyla__v1__heartbeat_request__descriptor,
                                            &hyla__v1__heartbeat_response__descriptor, fc_heartbeat, NULL));
        CHECK_OK(hyla_rpc_server_add_method(fc, "/hyla.v1.Coordinator/ReportSnapshot", HYLA_RPC_UNARY,
                                            &hyla__v1__report_snapshot_request__descriptor,
                                            &hyla__v1__report_snapshot_response__descriptor, fc_report, NULL));
        int fport = 0;
        CHECK_OK(hyla_rpc_server_listen(fc, "127.0.0.1:0", &fport));
        CHECK_OK(hyla_rpc_server_start(fc));
        snprintf(fc_store, sizeof fc_store, "%s", store_addr);
        char faddr[64];
        snprintf(faddr, sizeof faddr, "127.0.0.1:%d", fport);
        const char *a6[] = {"--model", model, "--store", store_addr, "--listen", "127.0.0.1:0", "--coordinator", faddr,
                            "--id", "wh", "--snapshot-every", "0", NULL};
        side_worker w6;
        side_begin(a6, &w6);
        CHECK_OK(load("s-h", 1, 0, 0.8f, 7));
        CHECK_MSG(fc_wait(fc_cond_seen, 20000), "no heartbeat reported s-h under epoch 1");
        CHECK_OK(load("s-h", 2, 0, 0.8f, 7)); /* re-placed here while that heartbeat is unanswered */
        pthread_mutex_lock(&fc_mu);
        fc_release = 1;
        pthread_cond_broadcast(&fc_cv);
        pthread_mutex_unlock(&fc_mu);
        /* the drop is queued before the next heartbeat is sent, so a DescribeSession after two
         * more heartbeats is served after it (one command queue, in order) */
        CHECK_MSG(fc_wait(fc_cond_two_after, 20000), "no heartbeats after the unload answer");
        Hyla__V1__DescribeSessionRequest hq = HYLA__V1__DESCRIBE_SESSION_REQUEST__INIT;
        hq.session_id = "s-h";
        ProtobufCMessage *hr = NULL;
        hyla_rpc_call_opts ho = {20000, NULL, NULL, 0};
        hyla_rpc_result hres;
        hyla_status hst = hyla_rpc_client_unary(wc, W("DescribeSession"), &hq.base,
                                                &hyla__v1__worker_session_response__descriptor, &hr, &ho, &hres);
        const Hyla__V1__WorkerSessionStatus *hs = hst == HYLA_OK ? ((Hyla__V1__WorkerSessionResponse *)hr)->session : NULL;
        CHECK_MSG(hs && hs->placement_epoch == 2,
                  "the unload of the stale placement (epoch 1) dropped the newer placement 2: %s",
                  hst == HYLA_OK ? "wrong epoch" : hres.message);
        if (hr) protobuf_c_message_free_unpacked(hr, NULL);
        CHECK_OK(append("s-h", prompt, 100));
        int32_t h[8];
        CHECK_OK(generate("s-h", 8, h, &got));
        CHECK(got == 8);
        side_end(&w6);
        hyla_rpc_server_destroy(fc);
    }

    hyla_rpc_client_destroy(wc);
    kill(pid, SIGTERM);
    int wst = 0;
    waitpid(pid, &wst, 0);
    CHECK_MSG(WIFEXITED(wst) && WEXITSTATUS(wst) == 0, "worker did not exit cleanly on SIGTERM (status %d)", wst);
    fclose(wout);
    hyla_rpc_server_destroy(srv);
    hyla_store_close(store);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) return 1;
    return hyla_test_done("test_worker");
}
