/* hyla-worker — serves one model (or a layer range of it) on one device for the cluster.
 * See worker/server/hyla_worker.h for what it does; --help for how to run it. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_thread.h"
#include "hyla_runtime.h"
#include "hyla_tp.h"
#include "hyla_flagfile.h"
#include "hyla_log.h"
#include "hyla_auth.h"
#include "hyla_rpc.h"
#include "hyla_metrics.h"
#include "hyla_probe.h"
#include "hyla_util.h"
#include "hyla_worker.h"

static hyla_worker *g_worker;

static void on_signal(int sig) {
    (void)sig;
    if (g_worker) hyla_worker_request_stop(g_worker);
}

static int worker_ready(void *ud) { return hyla_worker_ready(ud); }

/* Write port to file atomically (a reader never sees half a number); 0 on failure (set). */
static int write_port(const char *file, int port) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", file);
    FILE *f = fopen(tmp, "w");
    if (!f || fprintf(f, "%d\n", port) < 0 || fclose(f) != 0 || rename(tmp, file) != 0) {
        hyla_fail(HYLA_ERR_IO, "cannot write the port file %s", file);
        return 0;
    }
    return 1;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: hyla-worker --model DIR [--coordinator ADDR] [--listen ADDR] [options]\n"
            "Serves a model on one device for the hyla cluster: registers with the coordinator,\n"
            "batches decode steps of all generating sessions, interleaves prefill under a token\n"
            "budget, snapshots sessions to the statestore, evicts idle sessions beyond a budget.\n"
            "  --coordinator ADDR     coordinator address (host:port); omit to run standalone\n"
            "  --listen ADDR          address of this worker's gRPC service (default 127.0.0.1:0)\n"
            "  --advertise ADDR       address the coordinator dials (default: listen host + bound port)\n"
            "  --model DIR            model directory (config.json + *.safetensors)\n"
            "  --model-name NAME      name clients use (default: the directory's base name)\n"
            "  --device DEV           cpu (default) or cuda:N\n"
            "  --layers A:B           serve layers [A, B) only (a pipeline stage)\n"
            "  --tp N                 tensor parallelism: split every layer's heads over N GPUs, DEV and the\n"
            "                         next N-1 (or N CPU backends), one process; default 1. Snapshots stay\n"
            "                         whole-model snapshots (a session moves between any splits). With\n"
            "                         --layers, a split pipeline stage (its rows then travel over gRPC)\n"
            "  --id NAME              stable worker id (default: assigned by the coordinator)\n"
            "  --store ADDR           statestore address (default: the one the coordinator names)\n"
            "  --state-budget MB      resident session state beyond this evicts idle sessions (default: no limit)\n"
            "  --host-budget MB       evicted sessions kept in host memory up to this; beyond it, sessions\n"
            "                         durable in the store leave the worker (default 4096)\n"
            "  --snapshot-every K     durable snapshot every K tokens per session (default 1024; 0 = only on Pause),\n"
            "                         taken between scheduler steps: a prompt fed while no session generates\n"
            "                         goes in whole prefill pieces, so its snapshots come every piece when\n"
            "                         that is longer. Each exports only the KV rows past the last durable version\n"
            "                         (HYLA_SNAPSHOT_INCREMENTAL=0: the whole state every time)\n"
            "  --snapshot-concurrency N  auto-snapshots in flight at once, exports and puts (default 4; 0 =\n"
            "                         no limit): when many sessions pass a snapshot point together the\n"
            "                         rest wait their turn and go on decoding, and the copies' buffers stay few\n"
            "  --max-batch B          sessions per decode step (default 64; when more generate, each step takes\n"
            "                         those decoded least recently); a whole-model worker on a GPU\n"
            "                         queues each step before it sends the last step's tokens\n"
            "                         (HYLA_DECODE_LANES=0: off; =1: on for a CPU worker too)\n"
            "  --micro-batches M      M from 1 to 16: a first pipeline stage decodes its sessions in up to\n"
            "                         min(M, 4) lanes (a lane keeps at least 8 sessions) whose steps overlap\n"
            "                         across the stages;\n"
            "                         with HYLA_DECODE_LANES=0 it cuts each step into M micro-batches instead\n"
            "                         (default 2; 1 = off)\n"
            "  --prefill-budget T     prefill tokens per scheduler step while sessions generate (default\n"
            "                         1024; at least the model's prefill chunk); with none generating, a step\n"
            "                         feeds up to a prefill piece\n"
            "  --prefill-piece N      prompt tokens per forward pass, a multiple of the model's prefill chunk (64;\n"
            "                         256 for SSE models: their prefill_window) up to 32768 (default 16384\n"
            "                         on a GPU, 32768 with --tp on GPUs, 1024 on the CPU, or $HYLA_PREFILL_PIECE;\n"
            "                         a pipeline stage with a next stage caps the default to 2048, so the\n"
            "                         stages overlap, and any piece to the message size)\n"
            "  --max-generate N       largest max_tokens a Generate may ask (default 65536)\n"
            "  --max-append-tokens N  largest document (tokens) one Append call may send (default 16777216)\n"
            "  --token-log N          generated tokens each session keeps for ReadTokens, 1..65536 (default\n"
            "                         65536: one whole Generate at the largest max_tokens; fewer saves host\n"
            "                         memory, 4 bytes a token, but a client may then be unable to read back\n"
            "                         what an interrupted Generate sent)\n"
            "  --threads N            gRPC threads (default 2)\n"
            "  --max-message-bytes N  gRPC message limit of this worker's server and its clients (default\n"
            "                         16 MiB); a pipeline stage caps prefill pieces and decode batches to half\n"
            "                         of it\n"
            "  --next-stage ADDR      pipelines without a coordinator: the next stage's address\n"
            "                         (with a coordinator, it names the next stage)\n"
            "  --admin-key-file FILE  join a keyed cluster: the coordinator's operator key file; this worker\n"
            "                         sends the cluster credential derived from it and its port refuses\n"
            "                         callers without it (without the flag: development mode, logged)\n"
            "  --tls-cert FILE        serve TLS with this PEM certificate chain (also the client certificate\n"
            "                         of this worker's own calls, for mutual TLS)\n"
            "  --tls-key FILE         the certificate's PEM private key\n"
            "  --tls-ca FILE          PEM CA: verify the coordinator, the store and other stages with it\n"
            "  --tls-require-client-cert  mutual TLS: this port refuses callers without a certificate of --tls-ca\n"
            "  --metrics ADDR         serve GET /metrics (Prometheus), /healthz and /readyz on ADDR\n"
            "  --metrics-port-file FILE  write the bound metrics port to FILE once serving\n"
            "  --log-format FMT       text (default) or json (one object per line)\n"
            "  --config FILE          read flags from FILE (`key = value` lines, keys = these flags' names);\n"
            "                         flags on the command line override it\n"
            "Logs go to stderr (HYLA_LOG=debug|info|warn|error). SIGINT/SIGTERM stop it.\n");
}

/* argv with --config FILE expanded (hyla_flagfile.h); freed at exit */
static int g_argc;
static char **g_argv;
static void free_args(void) { hyla_flagfile_free(g_argc, g_argv); }

/* --config FILE: every long option of lo is a key; the file's entries go before the command
 * line's flags, which override them. 0 on failure (printed). */
static int expand_config(int argc, char **argv, const struct option *lo, int *out_argc, char ***out_argv) {
    hyla_flag_spec spec[64];
    size_t n = 0;
    for (; lo[n].name && n < 64; n++) spec[n] = (hyla_flag_spec){lo[n].name, lo[n].has_arg != no_argument};
    if (hyla_flagfile_expand(argc, argv, spec, n, &g_argc, &g_argv) != HYLA_OK) {
        fprintf(stderr, "hyla-worker: %s\n", hyla_last_error());
        return 0;
    }
    atexit(free_args);
    *out_argc = g_argc;
    *out_argv = g_argv;
    return 1;
}

/* A whole-number option in [lo, hi] into *out; 0 (after saying so on stderr, naming the option
 * and the text) when optarg is not one. */
static int uint_opt(const char *name, const char *s, unsigned long long lo, unsigned long long hi, const char *what,
                    unsigned long long *out) {
    uint64_t v;
    if (!hyla_parse_u64(s, lo, hi, &v)) {
        fprintf(stderr, "hyla-worker: --%s must be %s from %llu to %llu, got '%s'\n", name, what, lo, hi, s);
        return 0;
    }
    *out = v;
    return 1;
}

/* A size in MiB (a number >= 0, fractions allowed) as bytes into *out; 0 after saying why. */
static int mib_opt(const char *name, const char *s, uint64_t *out) {
    double v;
    if (!hyla_parse_num(s, 0, 1e12, &v)) {
        fprintf(stderr, "hyla-worker: --%s must be a size in MiB (a number >= 0), got '%s'\n", name, s);
        return 0;
    }
    *out = (uint64_t)(v * 1024 * 1024);
    return 1;
}

int main(int argc, char **argv) {
    hyla_malloc_tune(); /* before any thread: chunk reads and writes on every core */
    hyla_worker_params p = hyla_worker_default_params();
    static struct option lo[] = {{"coordinator", 1, 0, 'c'}, {"listen", 1, 0, 'l'},     {"advertise", 1, 0, 'a'},
                                 {"model", 1, 0, 'm'},       {"model-name", 1, 0, 'n'}, {"device", 1, 0, 'd'},
                                 {"layers", 1, 0, 'L'},      {"id", 1, 0, 'i'},         {"store", 1, 0, 's'},
                                 {"state-budget", 1, 0, 'b'}, {"host-budget", 1, 0, 'H'}, {"snapshot-every", 1, 0, 'k'}, {"max-batch", 1, 0, 'B'},
                                 {"prefill-budget", 1, 0, 'P'}, {"max-generate", 1, 0, 'G'}, {"threads", 1, 0, 't'}, {"next-stage", 1, 0, 'N'},
                                 {"prefill-piece", 1, 0, 'R'}, {"max-message-bytes", 1, 0, 'M'}, {"max-append-tokens", 1, 0, 'A'}, {"help", 0, 0, 'h'},
                                 {"admin-key-file", 1, 0, 'K'}, {"tls-cert", 1, 0, 1001}, {"tls-key", 1, 0, 1002},
                                 {"tls-ca", 1, 0, 1003}, {"tls-require-client-cert", 0, 0, 1004},
                                 {"metrics", 1, 0, 1011}, {"metrics-port-file", 1, 0, 1012}, {"log-format", 1, 0, 1013}, {"token-log", 1, 0, 1014}, {"tp", 1, 0, 1015}, {"micro-batches", 1, 0, 1016},
                                 {"snapshot-concurrency", 1, 0, 1017},        {0, 0, 0, 0}};
    const char *admin_key_file = NULL;
    hyla_rpc_security sec;
    memset(&sec, 0, sizeof sec);
    const char *metrics_addr = NULL, *metrics_port_file = NULL;
    if (!expand_config(argc, argv, lo, &argc, &argv)) return 2;
    int c;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case 'c': p.coordinator = optarg; break;
        case 'l': p.listen = optarg; break;
        case 'a': p.advertise = optarg; break;
        case 'm': p.model_dir = optarg; break;
        case 'n': p.model_name = optarg; break;
        case 'd': p.device = optarg; break;
        case 1015: {
            char *e;
            long v = strtol(optarg, &e, 10);
            if (*e || v < 1 || v > HYLA_TP_MAX) {
                fprintf(stderr, "hyla-worker: --tp: '%s' must be a number from 1 to %d\n", optarg, HYLA_TP_MAX);
                return 2;
            }
            p.tp = (int)v;
            break;
        }
        case 'L':
            if (sscanf(optarg, "%d:%d", &p.layer_begin, &p.layer_end) != 2 || p.layer_begin < 0 || p.layer_end <= p.layer_begin) {
                fprintf(stderr, "hyla-worker: --layers must be A:B with 0 <= A < B\n");
                return 2;
            }
            break;
        case 'i': p.worker_id = optarg; break;
        case 's': p.store = optarg; break;
        case 'b':
            if (!mib_opt("state-budget", optarg, &p.state_budget_bytes)) return 2;
            break;
        case 'H':
            if (!mib_opt("host-budget", optarg, &p.host_budget_bytes)) return 2;
            break;
        case 'k':
        case 'B':
        case 'P':
        case 'R':
        case 'G':
        case 'A':
        case 't': {
            unsigned long long v;
            int ok = c == 'k'   ? uint_opt("snapshot-every", optarg, 0, UINT32_MAX, "a token count", &v)
                     : c == 'B' ? uint_opt("max-batch", optarg, 1, 65536, "a number of sessions", &v)
                     : c == 'P' ? uint_opt("prefill-budget", optarg, 1, INT32_MAX, "a token count", &v)
                     : c == 'R' ? uint_opt("prefill-piece", optarg, 1, INT32_MAX, "a token count", &v)
                     : c == 'G' ? uint_opt("max-generate", optarg, 1, UINT32_MAX, "a token count", &v)
                     : c == 'A' ? uint_opt("max-append-tokens", optarg, 1, UINT64_MAX, "a token count", &v)
                                : uint_opt("threads", optarg, 1, 256, "a number of threads", &v);
            if (!ok) return 2;
            if (c == 'k') p.snapshot_every = (uint32_t)v;
            else if (c == 'B') p.max_batch = (int)v;
            else if (c == 'P') p.prefill_budget = (int)v;
            else if (c == 'R') p.prefill_piece = (int)v;
            else if (c == 'G') p.max_generate = (uint32_t)v;
            else if (c == 'A') p.max_append_tokens = v;
            else p.rpc_threads = (int)v;
            break;
        }
        case 1017: {
            unsigned long long v;
            if (!uint_opt("snapshot-concurrency", optarg, 0, 65536, "a number of sessions", &v)) return 2;
            p.snapshot_concurrency = (uint32_t)v;
            break;
        }
        case 'N': p.next_stage = optarg; break;
        case 'M': {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (*end || end == optarg || v < 65536 || v > (1L << 30)) {
                fprintf(stderr, "hyla-worker: --max-message-bytes must be a number of bytes from 65536 to 1073741824, got '%s'\n",
                        optarg);
                return 2;
            }
            p.max_message_bytes = (int)v;
            break;
        }
        case 'K': admin_key_file = optarg; break;
        case 1016: {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (*end || end == optarg || v < 1 || v > HYLA_MICRO_BATCH_MAX) {
                fprintf(stderr, "hyla-worker: --micro-batches must be a number from 1 to %d, got '%s'\n", HYLA_MICRO_BATCH_MAX,
                        optarg);
                return 2;
            }
            p.micro_batches = (int)v;
            break;
        }
        case 1014: {
            char *end;
            unsigned long v = strtoul(optarg, &end, 10);
            if (*end || end == optarg || v < 1 || v > 65536) {
                fprintf(stderr, "hyla-worker: --token-log must be a token count from 1 to 65536, got '%s'\n", optarg);
                return 2;
            }
            p.token_log = (uint32_t)v;
            break;
        }
        case 1001: sec.tls_cert = optarg; break;
        case 1002: sec.tls_key = optarg; break;
        case 1003: sec.tls_ca = optarg; break;
        case 1004: sec.tls_require_client_cert = 1; break;
        case 1011: metrics_addr = optarg; break;
        case 1012: metrics_port_file = optarg; break;
        case 1013: {
            hyla_log_format f;
            if (!hyla_log_parse_format(optarg, &f)) {
                fprintf(stderr, "hyla-worker: --log-format: want text or json, got '%s'\n", optarg);
                return 2;
            }
            hyla_log_set_format(f);
            break;
        }
        case 'h': usage(stdout); return 0;
        default: fprintf(stderr, "hyla-worker: see --help\n"); return 2;
        }
    }
    if (optind < argc || !p.model_dir) {
        fprintf(stderr, "hyla-worker: --model is required (see --help)\n");
        return 2;
    }
    char prefix[160];
    snprintf(prefix, sizeof prefix, "worker%s%s", p.worker_id ? " " : "", p.worker_id ? p.worker_id : "");
    hyla_log_set_prefix(prefix);
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    char admin_key[HYLA_AUTH_KEY_MAX], cluster_cred[HYLA_AUTH_KEY_MAX];
    if (admin_key_file) {
        if (hyla_auth_load_admin_key(admin_key_file, 0, admin_key, NULL) != HYLA_OK) {
            fprintf(stderr, "hyla-worker: %s\n", hyla_last_error());
            return 2;
        }
        hyla_auth_cluster_credential(admin_key, cluster_cred);
        p.admin_key = admin_key;
        sec.bearer = cluster_cred; /* every call this worker makes: coordinator, store, stages */
    }
    if (hyla_rpc_set_security(&sec) != HYLA_OK) {
        fprintf(stderr, "hyla-worker: %s\n", hyla_last_error());
        return 2;
    }
    if (metrics_port_file && !metrics_addr) {
        fprintf(stderr, "hyla-worker: --metrics-port-file needs --metrics ADDR\n");
        return 2;
    }
    hyla_metrics *metrics = metrics_addr ? hyla_metrics_create() : NULL;
    p.metrics = metrics;
    hyla_worker *w = NULL;
    if (hyla_worker_start(&p, &w) != HYLA_OK) {
        fprintf(stderr, "hyla-worker: %s\n", hyla_last_error());
        hyla_metrics_destroy(metrics);
        return 1;
    }
    hyla_probe_http *ops = NULL;
    if (metrics_addr && (hyla_probe_http_start(metrics_addr, metrics, worker_ready, w, &ops) != HYLA_OK ||
                         (metrics_port_file && !write_port(metrics_port_file, hyla_probe_http_port(ops))))) {
        fprintf(stderr, "hyla-worker: %s\n", hyla_last_error());
        hyla_probe_http_stop(ops);
        hyla_worker_destroy(w);
        hyla_metrics_destroy(metrics);
        return 1;
    }
    g_worker = w;
    printf("hyla-worker listening on port %d\n", hyla_worker_port(w));
    fflush(stdout);
    hyla_worker_wait(w);
    g_worker = NULL;
    hyla_probe_http_stop(ops); /* its collector reads the worker */
    hyla_worker_destroy(w);
    hyla_metrics_destroy(metrics);
    return 0;
}
