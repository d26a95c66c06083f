/* hyla_coordinator_main.c — `hyla-coordinator --listen ADDR --data DIR [options]`.
 * Parses flags, starts the coordinator (hyla_coord.h) and, with --http, the OpenAI-compatible
 * HTTP gateway (http/hyla_http.h) as a client of the coordinator's own gRPC address; waits for
 * SIGINT/SIGTERM, shuts down cleanly (calls in flight get a grace period). Exit status 0 on a
 * clean stop, 1 on a startup failure (the message names the directory or address), 2 on bad
 * usage. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "hyla_thread.h"

#include "hyla_auth.h"
#include "hyla_coord.h"
#include "hyla_http.h"
#include "hyla_rpc.h"
#include "hyla_flagfile.h"
#include "hyla_log.h"
#include "hyla_metrics.h"
#include "hyla_probe.h"

static hyla_coord *g_coord;

static void on_signal(int sig) {
    (void)sig;
    if (g_coord)
        hyla_coord_request_stop(g_coord);
}

/* Every flag main() parses, as a --config key (keep in step with the parser below). */
static const hyla_flag_spec k_flags[] = {
    {"listen", 1},       {"data", 1},          {"advertise", 1},         {"no-store", 0},      {"store-address", 1},
    {"heartbeat-ms", 1}, {"dead-after-ms", 1}, {"threads", 1},           {"max-message-bytes", 1},
    {"port-file", 1},    {"http", 1},          {"http-port-file", 1},    {"chat-template", 1}, {"log", 1},
    {"log-format", 1},   {"metrics", 1},       {"metrics-port-file", 1}, {"quota-sessions", 1},
    {"quota-stored-bytes", 1}, {"quota-generations", 1}, {"store-reserve-bytes", 1}, {"store-reclaim-ms", 1},
    {"keep-versions", 1},      {"admin-key-file", 1},   {"tls-cert", 1},          {"tls-key", 1},
    {"tls-ca", 1},             {"max-import-bytes", 1},
};

/* "N", "NK", "NM", "NG", "NT" (powers of 1024) into *out; 0 if malformed. */
static int parse_bytes(const char *s, uint64_t *out) {
    char *end = NULL;
    unsigned long long v = s && *s >= '0' && *s <= '9' ? strtoull(s, &end, 10) : 0;
    if (!end || end == s) return 0;
    int shift = 0;
    if (*end) {
        const char *u = "KMGT", *k = strchr(u, *end);
        if (!k || end[1]) return 0;
        shift = 10 * (int)(k - u + 1);
    }
    if (shift && v > (~0ull >> shift)) return 0;
    *out = (uint64_t)v << shift;
    return 1;
}

/* argv with --config FILE expanded; freed at exit */
static int g_argc;
static char **g_argv;
static void free_args(void) { hyla_flagfile_free(g_argc, g_argv); }

static int coord_ready(void *ud) { return hyla_coord_ready(ud); }

static void usage(FILE *f) {
    fprintf(f,
            "usage: hyla-coordinator --data DIR [--listen ADDR] [options]\n"
            "  --listen ADDR          gRPC address (default 127.0.0.1:7000; port 0 picks one)\n"
            "  --data DIR             session directory (DIR/directory) and embedded store (DIR/store)\n"
            "  --advertise ADDR       address workers dial for the store (default: listen host + port)\n"
            "  --no-store             do not embed the statestore; give workers --store-address\n"
            "  --store-address ADDR   the StateStore workers use when the store is not embedded\n"
            "  --heartbeat-ms N       heartbeat interval told to workers (default 1000)\n"
            "  --dead-after-ms N      silence after which a worker is dead (default 5000)\n"
            "  --threads N            gRPC threads (default 4)\n"
            "  --max-message-bytes N  gRPC message limit (default 16777216)\n"
            "  --store-reserve-bytes N  disk held back for deletes on a full disk (default 67108864; 0: none)\n"
            "  --store-reclaim-ms N   deleted snapshots' disk space returns about this long after (default 30000)\n"
            "  --keep-versions N      snapshot versions kept per session (default 2)\n"
            "  --port-file FILE       write the bound port to FILE once serving (for scripts)\n"
            "  --http ADDR            also serve the OpenAI-compatible HTTP API on ADDR (e.g. 127.0.0.1:8080;\n"
            "                         port 0 picks one): GET /v1/models, POST /v1/completions,\n"
            "                         POST /v1/chat/completions (docs/API.md \"HTTP\")\n"
            "  --http-port-file FILE  write the bound HTTP port to FILE once serving\n"
            "  --chat-template [MODEL=]FILE  chat template for /v1/chat/completions: a tokenizer_config.json\n"
            "                         (its chat_template and special tokens) or a Jinja template file; for\n"
            "                         MODEL only, or every model without one of its own (repeatable)\n"
            "  --admin-key-file FILE  require API keys: the operator key is read from FILE (a new random\n"
            "                         one is written there, mode 0600, when FILE is missing); tenants'\n"
            "                         keys come from hyla-admin; workers join with the same FILE.\n"
            "                         Without it: development mode, no authentication (logged loudly)\n"
            "  --tls-cert FILE        serve TLS with this PEM certificate chain (with --tls-key)\n"
            "  --tls-key FILE         the certificate's PEM private key\n"
            "  --tls-ca FILE          PEM CA that this process's own calls to workers verify them with\n"
            "  --log LEVEL            debug|info|warn|error (default: HYLA_LOG or info)\n"
            "  --log-format FMT       text (default) or json (one object per line)\n"
            "  --metrics ADDR         serve GET /metrics (Prometheus), /healthz and /readyz on ADDR\n"
            "  --metrics-port-file FILE  write the bound metrics port to FILE once serving\n"
            "  --quota-sessions N     per tenant: at most N sessions (default 0 = no limit)\n"
            "  --quota-stored-bytes N per tenant: new sessions and Append refused once its snapshots occupy\n"
            "                         N bytes in the store (suffix K, M, G, T: powers of 1024; 0 = no limit)\n"
            "  --quota-generations N  per tenant: at most N Generate calls at once (0 = no limit)\n"
            "  --max-import-bytes N   largest snapshot file ImportSession takes (held in memory while\n"
            "                         checked; suffix K, M, G, T; default 1G)\n"
            "  --config FILE          read flags from FILE (`key = value` lines, keys = these flags' names,\n"
            "                         `no-store = true`); flags on the command line override it\n");
}

static int parse_u(const char *s, const char *flag, long lo, long hi, long *out) {
    char *end = NULL;
    long v = s ? strtol(s, &end, 10) : 0;
    if (!s || !*s || *end || v < lo || v > hi) {
        fprintf(stderr, "hyla-coordinator: %s wants an integer in [%ld, %ld], got '%s'\n", flag, lo, hi, s ? s : "");
        return 0;
    }
    *out = v;
    return 1;
}

/* Write port to file atomically (a reader never sees half a number). */
static int write_port(const char *file, int port) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", file);
    FILE *f = fopen(tmp, "w");
    if (!f || fprintf(f, "%d\n", port) < 0 || fclose(f) != 0 || rename(tmp, file) != 0) {
        fprintf(stderr, "hyla-coordinator: cannot write the port file %s\n", file);
        return 0;
    }
    return 1;
}

int main(int argc, char **argv) {
    hyla_malloc_tune(); /* before any thread: chunk reads and writes on every core */
    hyla_coord_params p = hyla_coord_default_params();
    hyla_store_params sp = hyla_store_default_params();
    p.store = &sp;
    const char *port_file = NULL, *http_port_file = NULL, *metrics_addr = NULL, *metrics_port_file = NULL;
    hyla_http_params hp = hyla_http_default_params();
    const char *templates[64];
    size_t n_templates = 0;
    const char *admin_key_file = NULL;
    hyla_rpc_security sec;
    memset(&sec, 0, sizeof sec);
    hyla_log_set_prefix("coordinator");
    if (hyla_flagfile_expand(argc, argv, k_flags, sizeof k_flags / sizeof k_flags[0], &g_argc, &g_argv) != HYLA_OK) {
        fprintf(stderr, "hyla-coordinator: %s\n", hyla_last_error());
        return 2;
    }
    atexit(free_args);
    argc = g_argc;
    argv = g_argv;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        long n;
#define NEEDV()                                                                  \
    do {                                                                         \
        if (!v) {                                                                \
            fprintf(stderr, "hyla-coordinator: %s needs a value\n", a);          \
            return 2;                                                            \
        }                                                                        \
        i++;                                                                     \
    } while (0)
        if (!strcmp(a, "--listen")) { NEEDV(); p.listen = v; }
        else if (!strcmp(a, "--data")) { NEEDV(); p.data_dir = v; }
        else if (!strcmp(a, "--advertise")) { NEEDV(); p.advertise = v; }
        else if (!strcmp(a, "--no-store")) p.embed_store = 0;
        else if (!strcmp(a, "--store-address")) { NEEDV(); p.store_address = v; }
        else if (!strcmp(a, "--heartbeat-ms")) { NEEDV(); if (!parse_u(v, a, 10, 600000, &n)) return 2; p.heartbeat_ms = (uint32_t)n; }
        else if (!strcmp(a, "--dead-after-ms")) { NEEDV(); if (!parse_u(v, a, 20, 3600000, &n)) return 2; p.dead_after_ms = (uint32_t)n; }
        else if (!strcmp(a, "--threads")) { NEEDV(); if (!parse_u(v, a, 1, 256, &n)) return 2; p.rpc_threads = (int)n; }
        else if (!strcmp(a, "--max-message-bytes")) { NEEDV(); if (!parse_u(v, a, 1024, 1L << 30, &n)) return 2; p.max_message_bytes = (int)n; }
        else if (!strcmp(a, "--store-reserve-bytes")) { NEEDV(); if (!parse_u(v, a, 0, 1L << 40, &n)) return 2; sp.reserve_bytes = (uint64_t)n; }
        else if (!strcmp(a, "--store-reclaim-ms")) { NEEDV(); if (!parse_u(v, a, 0, 86400000, &n)) return 2; sp.reclaim_after_ms = (uint32_t)n; }
        else if (!strcmp(a, "--keep-versions")) { NEEDV(); if (!parse_u(v, a, 1, 1000000, &n)) return 2; sp.keep_versions = (uint32_t)n; }
        else if (!strcmp(a, "--port-file")) { NEEDV(); port_file = v; }
        else if (!strcmp(a, "--http")) { NEEDV(); hp.listen = v; }
        else if (!strcmp(a, "--http-port-file")) { NEEDV(); http_port_file = v; }
        else if (!strcmp(a, "--metrics")) { NEEDV(); metrics_addr = v; }
        else if (!strcmp(a, "--quota-sessions")) { NEEDV(); if (!parse_u(v, a, 0, 100000000, &n)) return 2; p.quota_sessions = (uint32_t)n; }
        else if (!strcmp(a, "--quota-generations")) { NEEDV(); if (!parse_u(v, a, 0, 1000000, &n)) return 2; p.quota_generations = (uint32_t)n; }
        else if (!strcmp(a, "--quota-stored-bytes")) {
            NEEDV();
            if (!parse_bytes(v, &p.quota_stored_bytes)) { fprintf(stderr, "hyla-coordinator: --quota-stored-bytes wants bytes (e.g. 1073741824 or 1G), got '%s'\n", v); return 2; }
        }
        else if (!strcmp(a, "--max-import-bytes")) {
            NEEDV();
            if (!parse_bytes(v, &p.max_import_bytes) || p.max_import_bytes == 0) { fprintf(stderr, "hyla-coordinator: --max-import-bytes wants bytes > 0 (e.g. 1073741824 or 1G), got '%s'\n", v); return 2; }
        }
        else if (!strcmp(a, "--metrics-port-file")) { NEEDV(); metrics_port_file = v; }
        else if (!strcmp(a, "--log-format")) {
            NEEDV();
            hyla_log_format f;
            if (!hyla_log_parse_format(v, &f)) { fprintf(stderr, "hyla-coordinator: --log-format: want text or json, got '%s'\n", v); return 2; }
            hyla_log_set_format(f);
        }
        else if (!strcmp(a, "--chat-template")) {
            NEEDV();
            if (n_templates == sizeof templates / sizeof templates[0]) { fprintf(stderr, "hyla-coordinator: too many --chat-template\n"); return 2; }
            templates[n_templates++] = v;
        }
        else if (!strcmp(a, "--admin-key-file")) { NEEDV(); admin_key_file = v; }
        else if (!strcmp(a, "--tls-cert")) { NEEDV(); sec.tls_cert = v; }
        else if (!strcmp(a, "--tls-key")) { NEEDV(); sec.tls_key = v; }
        else if (!strcmp(a, "--tls-ca")) { NEEDV(); sec.tls_ca = v; }
        else if (!strcmp(a, "--log")) {
            NEEDV();
            hyla_log_level l = !strcmp(v, "debug") ? HYLA_LOG_DEBUG : !strcmp(v, "info") ? HYLA_LOG_INFO
                             : !strcmp(v, "warn") ? HYLA_LOG_WARN : !strcmp(v, "error") ? HYLA_LOG_ERROR : HYLA_LOG_OFF;
            if (l == HYLA_LOG_OFF) { fprintf(stderr, "hyla-coordinator: --log: unknown level '%s'\n", v); return 2; }
            hyla_log_set_level(l);
        }
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else { fprintf(stderr, "hyla-coordinator: unknown argument '%s'\n", a); usage(stderr); return 2; }
#undef NEEDV
    }
    if (!p.data_dir) {
        fprintf(stderr, "hyla-coordinator: --data DIR is required\n");
        usage(stderr);
        return 2;
    }
    if ((n_templates || http_port_file) && !hp.listen) {
        fprintf(stderr, "hyla-coordinator: --chat-template and --http-port-file need --http ADDR\n");
        return 2;
    }
    if (!p.embed_store && !p.store_address)
        fprintf(stderr, "hyla-coordinator: warning: --no-store without --store-address: workers get no store\n");

    char admin_key[HYLA_AUTH_KEY_MAX], cluster_cred[HYLA_AUTH_KEY_MAX];
    if (admin_key_file) {
        int created = 0;
        if (hyla_auth_load_admin_key(admin_key_file, 1, admin_key, &created) != HYLA_OK) {
            fprintf(stderr, "hyla-coordinator: %s\n", hyla_last_error());
            return 1;
        }
        if (created)
            HYLA_INFO("wrote a new operator key to %s (mode 0600)", admin_key_file);
        hyla_auth_cluster_credential(admin_key, cluster_cred);
        p.admin_key = admin_key;
        sec.bearer = cluster_cred; /* the coordinator's own calls to workers */
    }
    if (hyla_rpc_set_security(&sec) != HYLA_OK) {
        fprintf(stderr, "hyla-coordinator: %s\n", hyla_last_error());
        return 2;
    }
    if (!sec.tls_cert)
        HYLA_WARN("coordinator: no --tls-cert: gRPC traffic (keys included) travels unencrypted");
    if (metrics_port_file && !metrics_addr) {
        fprintf(stderr, "hyla-coordinator: --metrics-port-file needs --metrics ADDR\n");
        return 2;
    }
    hyla_metrics *metrics = metrics_addr ? hyla_metrics_create() : NULL;
    p.metrics = metrics;
    hyla_status st = hyla_coord_start(&p, &g_coord);
    if (st != HYLA_OK) {
        fprintf(stderr, "hyla-coordinator: %s\n", hyla_last_error());
        hyla_metrics_destroy(metrics);
        return 1;
    }
    hyla_probe_http *ops = NULL;
    if (metrics_addr &&
        (hyla_probe_http_start(metrics_addr, metrics, coord_ready, g_coord, &ops) != HYLA_OK ||
         (metrics_port_file && !write_port(metrics_port_file, hyla_probe_http_port(ops))))) {
        fprintf(stderr, "hyla-coordinator: %s\n", hyla_last_error());
        hyla_probe_http_stop(ops);
        hyla_coord_destroy(g_coord);
        hyla_metrics_destroy(metrics);
        return 1;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    hyla_http *http = NULL;
    if (hp.listen) {
        /* the gateway is a client of this coordinator's own gRPC address */
        char self[300];
        const char *lc = strrchr(p.listen, ':');
        size_t hn = lc ? (size_t)(lc - p.listen) : 0;
        int any = hn == 0 || (hn == 7 && !strncmp(p.listen, "0.0.0.0", 7)) || (hn == 4 && !strncmp(p.listen, "[::]", 4));
        snprintf(self, sizeof self, "%.*s:%d", any ? 9 : (int)hn, any ? "127.0.0.1" : p.listen, hyla_coord_port(g_coord));
        hp.coordinator = self;
        hp.tls_ca = sec.tls_ca; /* the gateway dials this coordinator like any client */
        hp.chat_templates = templates;
        hp.n_chat_templates = n_templates;
        st = hyla_http_start(&hp, &http);
        if (st != HYLA_OK) {
            fprintf(stderr, "hyla-coordinator: %s\n", hyla_last_error());
            hyla_probe_http_stop(ops);
            hyla_coord_destroy(g_coord);
            hyla_metrics_destroy(metrics);
            return 1;
        }
    }
    if ((port_file && !write_port(port_file, hyla_coord_port(g_coord))) ||
        (http_port_file && !write_port(http_port_file, hyla_http_port(http)))) {
        hyla_http_stop(http);
        hyla_probe_http_stop(ops);
        hyla_coord_destroy(g_coord);
        hyla_metrics_destroy(metrics);
        return 1;
    }
    hyla_coord_wait(g_coord);
    HYLA_INFO("stopping");
    hyla_http_stop(http);
    hyla_probe_http_stop(ops); /* its collector reads the coordinator */
    hyla_coord_destroy(g_coord);
    hyla_metrics_destroy(metrics);
    return 0;
}
