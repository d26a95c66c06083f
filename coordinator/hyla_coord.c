/* hyla_coord.c — the coordinator's lifecycle and wiring: it opens the data directory (session
 * directory, embedded store), binds every method of the Sessions, Cluster and Coordinator
 * services to its handler, starts the monitor, and shuts all of it down in order.
 *
 * Methods. A unary method runs inline on an rpc loop thread when it touches only memory (Get,
 * List, the Cluster listings, the Coordinator service), else on a detached job thread
 * (c->jobs counts them; shutdown waits for them and for relayed streams). The tenant
 * (the API key's when keys are on, else x-hyla-tenant) is checked before any handler runs;
 * authentication itself happens in the rpc layer (hyla_coord_auth.c sets it up).
 *
 * Errors. coord_answer_error is where a failure becomes a gRPC code (coord_rpc_code, the one
 * mapping); handlers call it once, with the hyla_status that failed and its detail message.
 * The per-file design notes are at the top of each hyla_coord_*.c (list in hyla_coord_impl.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hyla_coord_impl.h"
#include "hyla_log.h"
#include "hyla_thread.h"

hyla_rpc_code coord_rpc_code(hyla_status st) { return hyla_rpc_code_from_status(st); }

void coord_answer_error(hyla_rpc_call *call, hyla_status st) {
    HYLA_ASSERT(st != HYLA_OK);
    hyla_rpc_call_fail(call, coord_rpc_code(st), "%s", hyla_last_error());
}

typedef struct {
    binding *b;
    hyla_rpc_call *call;
    ProtobufCMessage *req;
    char tenant[ID_MAX];
} job;

void coord_job_done(hyla_coord *c) {
    hyla_count_down(&c->mu, &c->cv, &c->jobs);
}

static void *job_main(void *arg) {
    job *j = arg;
    hyla_coord *c = j->b->c;
    j->b->fn(c, j->call, j->req, j->tenant);
    protobuf_c_message_free_unpacked(j->req, NULL);
    free(j);
    coord_job_done(c);
    return NULL;
}

int coord_spawn(hyla_coord *c, void *(*fn)(void *), void *arg) {
    pthread_mutex_lock(&c->mu);
    c->jobs++;
    pthread_mutex_unlock(&c->mu);
    if (hyla_thread_start_detached(fn, arg) != 0) {
        coord_job_done(c);
        return -1;
    }
    return 0;
}

int coord_get_tenant(hyla_rpc_call *call, char *out) {
    const hyla_rpc_principal *pr = hyla_rpc_call_principal(call);
    if (pr) { /* keys on: the key names the tenant, never a header */
        coord_copy_str(out, ID_MAX, pr->kind == HYLA_RPC_PRINCIPAL_TENANT ? pr->name : "");
        return 1;
    }
    const char *t = hyla_rpc_call_metadata(call, HYLA_API_TENANT_KEY);
    if (!t) {
        coord_copy_str(out, ID_MAX, HYLA_API_DEFAULT_TENANT);
        return 1;
    }
    size_t n = strlen(t);
    int ok = n > 0 && n < ID_MAX;
    for (size_t i = 0; ok && i < n; i++)
        ok = (unsigned char)t[i] > ' ' && (unsigned char)t[i] < 0x7f;
    if (!ok) {
        coord_answer_error(call, hyla_fail(HYLA_ERR_INVALID_ARG, "metadata %s: 1..%d printable characters without spaces",
                                           HYLA_API_TENANT_KEY, ID_MAX - 1));
        return 0;
    }
    coord_copy_str(out, ID_MAX, t);
    return 1;
}

/* Handler of unary methods: validate the tenant, then run inline or on a job thread. */
static void h_unary(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *msg, void *ud) {
    if (ev != HYLA_RPC_EV_START)
        return;
    binding *b = ud;
    char tenant[ID_MAX];
    if (!coord_get_tenant(call, tenant))
        return;
    if (b->inline_call) {
        b->fn(b->c, call, msg, tenant);
        return;
    }
    job *j = calloc(1, sizeof *j);
    HYLA_ASSERT(j);
    j->b = b;
    j->call = call;
    j->req = hyla_rpc_message_dup(msg);
    coord_copy_str(j->tenant, sizeof j->tenant, tenant);
    if (coord_spawn(b->c, job_main, j) != 0) {
        protobuf_c_message_free_unpacked(j->req, NULL);
        free(j);
        coord_answer_error(call, hyla_fail(HYLA_ERR_RESOURCE, "coordinator: cannot start a thread for the call"));
    }
}

hyla_coord_params hyla_coord_default_params(void) {
    hyla_coord_params p;
    memset(&p, 0, sizeof p);
    p.listen = "127.0.0.1:7000";
    p.embed_store = 1;
    p.heartbeat_ms = 1000;
    p.dead_after_ms = 5000;
    p.rpc_threads = 4;
    p.max_message_bytes = 16 << 20;
    p.worker_timeout_ms = 60000;
    p.max_import_bytes = HYLA_COORD_IMPORT_MAX;
    return p;
}

static hyla_status add(hyla_coord *c, const char *path,
                       void (*fn)(hyla_coord *, hyla_rpc_call *, const ProtobufCMessage *, const char *),
                       int inline_call, hyla_rpc_handler handler) {
    const hyla_api_method *m = hyla_api_find(path);
    HYLA_ASSERT(m && c->n_bindings < (int)(sizeof c->bindings / sizeof c->bindings[0]));
    binding *b = &c->bindings[c->n_bindings++];
    b->c = c;
    b->fn = fn;
    b->inline_call = inline_call;
    hyla_rpc_kind kind = (hyla_rpc_kind)((m->client_streaming ? HYLA_RPC_CLIENT_STREAM : 0) |
                                         (m->server_streaming ? HYLA_RPC_SERVER_STREAM : 0));
    return hyla_rpc_server_add_method(c->srv, path, kind, m->input, m->output, handler ? handler : h_unary, b);
}

/* Every method served, with its handler: unary ones by fn (inline: memory only), streams by
 * their own event handler. */
static const struct {
    const char *path;
    void (*fn)(hyla_coord *, hyla_rpc_call *, const ProtobufCMessage *, const char *);
    int inline_call;
    hyla_rpc_handler stream;
} methods[] = {
    {SVC_SESSIONS "CreateSession", coord_do_create, 0, NULL},
    {SVC_SESSIONS "GetSession", coord_do_get, 1, NULL},
    {SVC_SESSIONS "ListSessions", coord_do_list, 1, NULL},
    {SVC_SESSIONS "DeleteSession", coord_do_delete, 0, NULL},
    {SVC_SESSIONS "Pause", coord_do_pause, 0, NULL},
    {SVC_SESSIONS "Resume", coord_do_resume, 0, NULL},
    {SVC_SESSIONS "Migrate", coord_do_migrate, 0, NULL},
    {SVC_SESSIONS "Fork", coord_do_fork, 0, NULL},
    {SVC_SESSIONS "ListSnapshots", coord_do_list_snapshots, 0, NULL},
    {SVC_SESSIONS "ExportSession", coord_do_export, 0, NULL},
    {SVC_SESSIONS "ImportSession", NULL, 0, coord_h_import},
    {SVC_SESSIONS "ListModels", coord_do_list_models, 1, NULL},
    {SVC_SESSIONS "ReadTokens", coord_do_read_tokens, 0, NULL},
    {SVC_SESSIONS "Generate", NULL, 0, coord_h_generate},
    {SVC_SESSIONS "Append", NULL, 0, coord_h_append},
    {SVC_CLUSTER "ListWorkers", coord_do_list_workers, 1, NULL},
    {SVC_CLUSTER "ListClusterSessions", coord_do_list_cluster_sessions, 1, NULL},
    {SVC_CLUSTER "DrainWorker", coord_do_drain, 0, NULL},
    {SVC_COORD "RegisterWorker", coord_do_register, 1, NULL},
    {SVC_COORD "Heartbeat", coord_do_heartbeat, 1, NULL},
    {SVC_COORD "ReportSnapshot", coord_do_report_snapshot, 1, NULL},
    {SVC_ADMIN "CreateKey", coord_do_create_key, 0, NULL},
    {SVC_ADMIN "RevokeKey", coord_do_revoke_key, 0, NULL},
    {SVC_ADMIN "ListKeys", coord_do_list_keys, 1, NULL},
};

hyla_status hyla_coord_start(const hyla_coord_params *params, hyla_coord **out) {
    *out = NULL;
    hyla_coord_params p = params ? *params : hyla_coord_default_params();
    if (!p.data_dir || !p.data_dir[0])
        return hyla_fail(HYLA_ERR_INVALID_ARG, "hyla-coordinator: --data DIR is required");
    if (!p.listen || !p.listen[0])
        return hyla_fail(HYLA_ERR_INVALID_ARG, "hyla-coordinator: --listen ADDR is empty");
    if (p.heartbeat_ms == 0)
        p.heartbeat_ms = 1000;
    if (p.dead_after_ms < 2 * p.heartbeat_ms)
        return hyla_fail(HYLA_ERR_INVALID_ARG,
                         "hyla-coordinator: dead_after_ms %u must be at least twice the heartbeat (%u ms)",
                         p.dead_after_ms, p.heartbeat_ms);
    if (p.worker_timeout_ms <= 0)
        p.worker_timeout_ms = 60000;
    if (p.max_import_bytes == 0)
        p.max_import_bytes = HYLA_COORD_IMPORT_MAX;
    hyla_coord *c = calloc(1, sizeof *c);
    if (!c)
        return hyla_fail(HYLA_ERR_NOMEM, "coordinator");
    c->p = p;
    c->stop_pipe[0] = c->stop_pipe[1] = -1;
    coord_copy_str(c->listen, sizeof c->listen, p.listen);
    coord_copy_str(c->data_dir, sizeof c->data_dir, p.data_dir);
    c->p.listen = c->listen;
    c->p.data_dir = c->data_dir;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    uint64_t seed = (uint64_t)coord_now_ms() ^ ((uint64_t)getpid() << 32);
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        uint64_t r;
        if (read(fd, &r, sizeof r) == (ssize_t)sizeof r)
            seed ^= r;
        close(fd);
    }
    hyla_rng_seed(&c->rng, seed);
    c->started_mono = hyla_now();

    char path[1100];
    hyla_status st = hyla_mkdirs(p.data_dir);
    snprintf(path, sizeof path, "%s/directory", p.data_dir);
    if (st == HYLA_OK)
        st = hyla_coord_dir_open(path, &c->dir);
    if (st == HYLA_OK)
        st = hyla_coord_dir_get_counter(c->dir, &c->epoch_counter);
    if (st == HYLA_OK)
        st = hyla_coord_dir_scan(c->dir, coord_load_session_fn, c);
    if (st == HYLA_OK && p.embed_store) {
        snprintf(path, sizeof path, "%s/store", p.data_dir);
        hyla_store_params sp = p.store ? *p.store : hyla_store_default_params();
        st = hyla_store_open(path, &sp, &c->store);
        if (st == HYLA_OK && hyla_store_recovery_note(c->store)[0])
            st = hyla_coord_dir_check_store(c->dir, c->store, NULL);
    }
    if (st == HYLA_OK && pipe(c->stop_pipe) != 0)
        st = hyla_fail(HYLA_ERR_IO, "pipe: %s", strerror(errno));
    hyla_rpc_server_params rp = hyla_rpc_server_default_params();
    rp.threads = p.rpc_threads > 0 ? p.rpc_threads : 4;
    rp.max_message_bytes = p.max_message_bytes;
    if (st == HYLA_OK)
        st = hyla_rpc_server_create(&rp, &c->srv);
    if (st == HYLA_OK) {
        for (size_t i = 0; i < sizeof methods / sizeof methods[0] && st == HYLA_OK; i++)
            st = add(c, methods[i].path, methods[i].fn, methods[i].inline_call, methods[i].stream);
    }
    if (st == HYLA_OK)
        st = coord_auth_setup(c);
    if (st == HYLA_OK && c->store) {
        c->hooks.check_put = coord_store_check_put;
        c->hooks.on_commit = coord_store_on_commit;
        c->hooks.ud = c;
        st = hyla_store_rpc_register(c->srv, c->store, &c->hooks);
    }
    if (st == HYLA_OK)
        st = coord_quota_init(c);
    if (st == HYLA_OK)
        st = coord_metrics_setup(c);
    if (st == HYLA_OK)
        st = hyla_rpc_server_listen(c->srv, p.listen, &c->port);
    if (st == HYLA_OK) {
        if (p.advertise && p.advertise[0]) {
            coord_copy_str(c->advertise, sizeof c->advertise, p.advertise);
        } else {
            const char *colon = strrchr(p.listen, ':');
            int hl = colon ? (int)(colon - p.listen) : (int)strlen(p.listen);
            const char *host = p.listen;
            if ((hl == 7 && strncmp(host, "0.0.0.0", 7) == 0) || (hl == 4 && strncmp(host, "[::]", 4) == 0))
                host = "127.0.0.1", hl = 9;
            snprintf(c->advertise, sizeof c->advertise, "%.*s:%d", hl, host, c->port);
        }
        if (c->store)
            coord_copy_str(c->store_addr, sizeof c->store_addr, c->advertise);
        else
            coord_copy_str(c->store_addr, sizeof c->store_addr, p.store_address);
    }
    if (st == HYLA_OK)
        st = hyla_rpc_server_start(c->srv);
    if (st == HYLA_OK) {
        if (pthread_create(&c->monitor, NULL, coord_monitor_main, c) != 0)
            st = hyla_fail(HYLA_ERR_INTERNAL, "coordinator: cannot start the monitor thread");
        else
            c->monitor_started = 1;
    }
    if (st != HYLA_OK) {
        hyla_coord_destroy(c);
        return st;
    }
    HYLA_INFO("coordinator: serving on %s (advertised %s), %zu sessions in %s/directory, store %s", c->listen,
              c->advertise, c->n_sess, p.data_dir, c->store ? "embedded" : (c->store_addr[0] ? c->store_addr : "none"));
    *out = c;
    return HYLA_OK;
}

int hyla_coord_port(const hyla_coord *c) { return c->port; }

void hyla_coord_wait(hyla_coord *c) {
    char b;
    while (read(c->stop_pipe[0], &b, 1) < 0 && errno == EINTR) {
    }
}

void hyla_coord_request_stop(hyla_coord *c) {
    char b = 1;
    c->stop_requested = 1;
    ssize_t r = write(c->stop_pipe[1], &b, 1);
    (void)r;
}

void hyla_coord_destroy(hyla_coord *c) {
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    c->stopping = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (c->monitor_started)
        pthread_join(c->monitor, NULL);
    hyla_rpc_server_destroy(c->srv); /* calls end; jobs release theirs */
    pthread_mutex_lock(&c->mu);
    while (c->jobs > 0 || c->relays > 0) /* relays end when their worker streams do */
        pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
    for (size_t i = 0; i < c->n_workers; i++) {
        hyla_rpc_client_destroy(c->workers[i]->client);
        free(c->workers[i]);
    }
    for (size_t i = 0; i < c->n_retired; i++)
        hyla_rpc_client_destroy(c->retired[i]);
    free(c->retired);
    free(c->workers);
    for (size_t i = 0; i < c->n_sess; i++)
        free(c->sess[i]);
    free(c->sess);
    hyla_store_close(c->store);
    coord_auth_free(c);
    hyla_coord_dir_close(c->dir);
    if (c->stop_pipe[0] >= 0)
        close(c->stop_pipe[0]);
    if (c->stop_pipe[1] >= 0)
        close(c->stop_pipe[1]);
    coord_metrics_free(c);
    coord_quota_free(c);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
}
