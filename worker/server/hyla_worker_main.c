/* hyla-worker — serves one model (or a layer range of it) on one device for the cluster.
 * See worker/server/hyla_worker.h for what it does; --help for how to run it. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_log.h"
#include "hyla_worker.h"

static hyla_worker *g_worker;

static void on_signal(int sig) {
    (void)sig;
    if (g_worker) hyla_worker_request_stop(g_worker);
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: hyla-worker --coordinator ADDR --listen ADDR --model DIR [options]\n"
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
            "  --id NAME              stable worker id (default: assigned by the coordinator)\n"
            "  --store ADDR           statestore address (default: the one the coordinator names)\n"
            "  --state-budget MB      resident session state beyond this evicts idle sessions (default: no limit)\n"
            "  --host-budget MB       evicted sessions kept in host memory up to this; beyond it, sessions\n"
            "                         durable in the store leave the worker (default 4096)\n"
            "  --snapshot-every K     durable snapshot every K tokens per session (default 1024; 0 = only on Pause)\n"
            "  --max-batch B          sessions per decode step (default 64)\n"
            "  --prefill-budget T     prefill tokens per scheduler step (default 1024)\n"
            "  --prefill-piece N      prompt tokens per forward pass, a multiple of 64 up to 8192 (default 1024,\n"
            "                         or $HYLA_PREFILL_PIECE; pipeline stages cap it to the message size)\n"
            "  --max-generate N       largest max_tokens a Generate may ask (default 65536)\n"
            "  --max-append-tokens N  largest document (tokens) one Append call may send (default 16777216)\n"
            "  --threads N            gRPC threads (default 2)\n"
            "  --max-message-bytes N  gRPC message limit of this worker's server and its clients (default\n"
            "                         16 MiB); a pipeline stage caps prefill pieces and decode batches to half\n"
            "                         of it\n"
            "  --next-stage ADDR      pipelines without a coordinator: the next stage's address\n"
            "                         (with a coordinator, it names the next stage)\n"
            "Logs go to stderr (HYLA_LOG=debug|info|warn|error). SIGINT/SIGTERM stop it.\n");
}

int main(int argc, char **argv) {
    hyla_worker_params p = hyla_worker_default_params();
    static struct option lo[] = {{"coordinator", 1, 0, 'c'}, {"listen", 1, 0, 'l'},     {"advertise", 1, 0, 'a'},
                                 {"model", 1, 0, 'm'},       {"model-name", 1, 0, 'n'}, {"device", 1, 0, 'd'},
                                 {"layers", 1, 0, 'L'},      {"id", 1, 0, 'i'},         {"store", 1, 0, 's'},
                                 {"state-budget", 1, 0, 'b'}, {"host-budget", 1, 0, 'H'}, {"snapshot-every", 1, 0, 'k'}, {"max-batch", 1, 0, 'B'},
                                 {"prefill-budget", 1, 0, 'P'}, {"max-generate", 1, 0, 'G'}, {"threads", 1, 0, 't'}, {"next-stage", 1, 0, 'N'},
                                 {"prefill-piece", 1, 0, 'R'}, {"max-message-bytes", 1, 0, 'M'}, {"max-append-tokens", 1, 0, 'A'}, {"help", 0, 0, 'h'},        {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case 'c': p.coordinator = optarg; break;
        case 'l': p.listen = optarg; break;
        case 'a': p.advertise = optarg; break;
        case 'm': p.model_dir = optarg; break;
        case 'n': p.model_name = optarg; break;
        case 'd': p.device = optarg; break;
        case 'L':
            if (sscanf(optarg, "%d:%d", &p.layer_begin, &p.layer_end) != 2 || p.layer_begin < 0 || p.layer_end <= p.layer_begin) {
                fprintf(stderr, "hyla-worker: --layers must be A:B with 0 <= A < B\n");
                return 2;
            }
            break;
        case 'i': p.worker_id = optarg; break;
        case 's': p.store = optarg; break;
        case 'b': p.state_budget_bytes = (uint64_t)(strtod(optarg, NULL) * 1024 * 1024); break;
        case 'H': p.host_budget_bytes = (uint64_t)(strtod(optarg, NULL) * 1024 * 1024); break;
        case 'k': p.snapshot_every = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 'B': p.max_batch = atoi(optarg); break;
        case 'P': p.prefill_budget = atoi(optarg); break;
        case 'R': p.prefill_piece = atoi(optarg); break;
        case 'G': p.max_generate = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 'A': p.max_append_tokens = strtoull(optarg, NULL, 10); break;
        case 't': p.rpc_threads = atoi(optarg); break;
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
    hyla_worker *w = NULL;
    if (hyla_worker_start(&p, &w) != HYLA_OK) {
        fprintf(stderr, "hyla-worker: %s\n", hyla_last_error());
        return 1;
    }
    g_worker = w;
    printf("hyla-worker listening on port %d\n", hyla_worker_port(w));
    fflush(stdout);
    hyla_worker_wait(w);
    g_worker = NULL;
    hyla_worker_destroy(w);
    return 0;
}
