/* hyla_cli.c — the `hyla` command line over libhyla: argument parsing, help texts, one function
 * per subcommand, the append progress display and the exit statuses.
 *
 * Scripting contract: results on stdout (create and fork print the new id alone; generate
 * prints only the generated text, flushed piece by piece); progress, statistics and errors on
 * stderr; the exit status says what happened (HYLA_EXIT_* in hyla_cli.h, listed in --help).
 *
 * Single-threaded apart from libhyla's own threads; parsing has no global state. */
#include "hyla_cli.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "hyla_util.h"

/* ---------------------------------------------------------------------------------------- */
/* help                                                                                      */

static const char *const cmd_names[HYLA_CMD_COUNT] = {
    [HYLA_CMD_NONE] = "", [HYLA_CMD_CREATE] = "create", [HYLA_CMD_APPEND] = "append",
    [HYLA_CMD_GENERATE] = "generate", [HYLA_CMD_PAUSE] = "pause", [HYLA_CMD_RESUME] = "resume",
    [HYLA_CMD_MIGRATE] = "migrate", [HYLA_CMD_FORK] = "fork", [HYLA_CMD_RM] = "rm",
    [HYLA_CMD_LS] = "ls", [HYLA_CMD_SHOW] = "show", [HYLA_CMD_STATUS] = "status",
    [HYLA_CMD_DRAIN] = "drain", [HYLA_CMD_HELP] = "help", [HYLA_CMD_SNAPSHOTS] = "snapshots",
    [HYLA_CMD_EXPORT] = "export", [HYLA_CMD_IMPORT] = "import",
    [HYLA_CMD_READ] = "read",
};

static const char usage_main[] =
    "usage: hyla [--server ADDR] [--tenant T] [--timeout SEC] [-q] COMMAND [ARGS...]\n"
    "\n"
    "The command-line client of a hyla cluster (talks to hyla-coordinator over gRPC).\n"
    "\n"
    "Commands:\n"
    "  create [--model NAME] [--temperature T] [--top-k K] [--top-p P] [--seed S] [--on WORKER]\n"
    "                           new empty session; prints its id alone on stdout\n"
    "  append SESSION FILE|-    feed a document (a file, or - for stdin) into a session\n"
    "  generate SESSION -n N [--temperature T] [--top-k K] [--top-p P] [--seed S] [--stop STR]...\n"
    "                           generate up to N tokens; only the text goes to stdout, as it comes\n"
    "  pause SESSION [--evict]  write a durable snapshot of the session\n"
    "  resume SESSION [--on WORKER] [--version V]\n"
    "                           place a paused session on a worker group again; --version V:\n"
    "                           rewind it to its kept snapshot version V\n"
    "  migrate SESSION [--to WORKER]  move a session to WORKER's group, or to any other group\n"
    "  fork SESSION [--temperature T ...] [--seed S] [--on WORKER] [--version V]\n"
    "                           copy a session's state (or its snapshot version V) into a new\n"
    "                           one; prints its id alone\n"
    "  snapshots SESSION        list the snapshot versions kept of a session\n"
    "  export SESSION FILE|- [--version V]\n"
    "                           write a session's portable snapshot file (to move it to another\n"
    "                           cluster serving the same model)\n"
    "  import FILE|- [--as ID] [--on WORKER]\n"
    "                           a new session from a snapshot file; prints its id alone\n"
    "  read SESSION [--from N] [-n N] [--ids]\n"
    "                           print generated tokens again (after an interrupted generate)\n"
    "  show SESSION             describe a session\n"
    "  rm SESSION...            delete sessions and their snapshots\n"
    "  ls [--model NAME] [--all] [--ids]   list sessions\n"
    "  status [--wait]          workers, worker groups and sessions by tier; --wait: first\n"
    "                           until a worker group can take sessions (--timeout, default 60 s)\n"
    "  drain WORKER [--wait]    move a worker's sessions to other groups, place none on it;\n"
    "                           --wait: until it is drained (--timeout, default 600 s)\n"
    "  help [COMMAND]           this text, or a command's (also: hyla COMMAND --help)\n"
    "\n"
    "Options (before or after the command):\n"
    "  --server ADDR   coordinator address, e.g. 127.0.0.1:7000 (default: $HYLA_SERVER)\n"
    "  --tenant T      tenant of every call (default: $HYLA_TENANT; without either, none is sent\n"
    "                  and the server uses the tenant \"default\"); ignored by a coordinator that\n"
    "                  requires keys: the key names the tenant\n"
    "  --api-key K     API key sent on every call (default: $HYLA_API_KEY); required when the\n"
    "                  coordinator runs with --admin-key-file (hyla-admin key create issues them)\n"
    "  --tls-ca FILE   the coordinator serves TLS: verify it with this PEM CA (default: $HYLA_TLS_CA)\n"
    "  --timeout SEC   deadline of each call, except append and generate, which have none\n"
    "                  (default 60); for drain --wait, the deadline of the whole wait (default 600)\n"
    "  -q, --quiet     no progress or statistics on stderr (errors are still printed)\n"
    "  -h, --help      help\n"
    "\n"
    "Results go to stdout; progress, statistics and errors go to stderr.\n"
    "\n"
    "Exit status:\n"
    "  0  success\n"
    "  1  error (a local file, INTERNAL, DATA_LOSS, ...)\n"
    "  2  usage error\n"
    "  3  not found (NOT_FOUND: no such session, worker or model)\n"
    "  4  unavailable (UNAVAILABLE, DEADLINE_EXCEEDED, ABORTED: the coordinator or the session's\n"
    "     worker cannot serve now, the session was paused or moved mid-call, or drain --wait ran\n"
    "     out of time; retrying may help)\n"
    "  5  permission denied (PERMISSION_DENIED: the session belongs to another tenant;\n"
    "     UNAUTHENTICATED: no valid API key)\n"
    "  6  request refused (INVALID_ARGUMENT, OUT_OF_RANGE, RESOURCE_EXHAUSTED,\n"
    "     FAILED_PRECONDITION, ALREADY_EXISTS)\n";

static const char *const cmd_help[HYLA_CMD_COUNT] = {
    [HYLA_CMD_CREATE] =
        "usage: hyla create [--model NAME] [--temperature T] [--top-k K] [--top-p P] [--seed S]\n"
        "                   [--on WORKER]\n"
        "\n"
        "Create an empty session (position 0) and print its id alone on stdout.\n"
        "\n"
        "  --model NAME      the model (may be omitted when the cluster serves one model)\n"
        "  --temperature T   sampling defaults of the session's generate calls; T = 0: greedy.\n"
        "  --top-k K         Without any of the three the session is greedy; options not given\n"
        "  --top-p P         are 0 (off)\n"
        "  --seed S          seed of the session's sampling RNG (default 0)\n"
        "  --on WORKER       place it on WORKER's group if that group can serve it\n"
        "\n"
        "Example:  S=$(hyla create --model tiny --temperature 0.8 --seed 42)\n",
    [HYLA_CMD_APPEND] =
        "usage: hyla append SESSION FILE|- [--tokens] [--bos] [--no-progress]\n"
        "\n"
        "Feed a document into the session (streamed in chunks; the model ingests it in order).\n"
        "FILE - reads stdin. Returns when every token is ingested. Progress goes to stderr: a bar\n"
        "(percent, tokens/s, ETA) when stderr is a terminal, else a line every 2 seconds and a\n"
        "final summary. Nothing is printed on stdout.\n"
        "\n"
        "  --tokens        the input holds token ids (decimal, separated by spaces, newlines or\n"
        "                  commas) instead of text\n"
        "  --bos           prepend the model's BOS token (only when the session is at position 0)\n"
        "  --no-progress   no progress display (the final summary stays unless -q)\n"
        "\n"
        "Example:  hyla append $S book.txt\n"
        "          curl -s https://example.org/doc.txt | hyla append $S -\n",
    [HYLA_CMD_GENERATE] =
        "usage: hyla generate SESSION -n N [--temperature T] [--top-k K] [--top-p P] [--seed S]\n"
        "                     [--stop STR]... [--stop-id ID]... [--ignore-eos] [--ids]\n"
        "\n"
        "Generate up to N tokens. Only the generated text goes to stdout, flushed piece by piece\n"
        "(a newline is added at the end only when stdout is a terminal); statistics (tokens,\n"
        "tokens/s, finish reason) go to stderr. On a terminal, control bytes other than newline\n"
        "and tab are shown as \\xNN (a model with random weights generates any byte); a pipe or\n"
        "a file gets the bytes exactly as generated.\n"
        "\n"
        "  -n, --max-tokens N  tokens to generate at most (required, >= 1)\n"
        "  --temperature T     change the session's sampling from now on (T = 0: greedy);\n"
        "  --top-k K           options not given keep the session's current values\n"
        "  --top-p P\n"
        "  --seed S            re-seed the session's sampling RNG with S first\n"
        "  --stop STR          stop when STR is generated (repeatable; STR is not printed)\n"
        "  --stop-id ID        stop after token ID (repeatable; the token is printed)\n"
        "  --ignore-eos        do not stop at the model's end-of-sequence token\n"
        "  --ids               print token ids (space-separated, one line) instead of text\n"
        "\n"
        "If the session is paused, migrated or its worker fails mid-way, the command exits with\n"
        "status 4 and stderr says how many tokens were delivered: the session kept exactly those,\n"
        "so running generate again continues with no gap (after a worker failure, from its last\n"
        "durable snapshot: `hyla show` gives its generated count; drop what you received beyond\n"
        "it). After a cancel, or a coordinator restart, the session may hold more tokens than you\n"
        "received: `hyla read SESSION --from RECEIVED` prints them.\n"
        "\n"
        "Example:  hyla generate $S -n 64 --stop $'\\n\\n'\n",
    [HYLA_CMD_PAUSE] =
        "usage: hyla pause SESSION [--evict]\n"
        "\n"
        "Write a durable snapshot of the session; returns once it is committed. Prints the\n"
        "snapshot version, its position and sizes on stdout.\n"
        "\n"
        "  --evict   also drop the worker's copy now (else it stays resident until memory\n"
        "            pressure evicts it)\n",
    [HYLA_CMD_RESUME] =
        "usage: hyla resume SESSION [--on WORKER] [--version V]\n"
        "\n"
        "Place a paused session on a worker group again (append and generate also do this on\n"
        "their own). Prints where it now lives on stdout.\n"
        "\n"
        "  --on WORKER   prefer WORKER's group (else the least-loaded group)\n"
        "  --version V   rewind: the session continues from its snapshot version V (one that\n"
        "                `hyla snapshots` lists), whether it is paused or active; tokens after V\n"
        "                are forgotten. V's state is committed as a new version at once; the\n"
        "                later versions stay listed until retention (--keep-versions) drops them\n",
    [HYLA_CMD_MIGRATE] =
        "usage: hyla migrate SESSION [--to WORKER]\n"
        "\n"
        "Move the session's state to another worker group through a durable snapshot. Prints\n"
        "the old and the new group on stdout.\n"
        "\n"
        "  --to WORKER   the group of this worker (default: any group other than the current)\n",
    [HYLA_CMD_FORK] =
        "usage: hyla fork SESSION [--temperature T] [--top-k K] [--top-p P] [--seed S] [--on WORKER]\n"
        "                 [--version V]\n"
        "\n"
        "Create a new session whose state is a copy of SESSION's current state; print the new\n"
        "id alone on stdout. Without --seed the fork continues the parent's RNG stream, so both\n"
        "produce the same continuation until their inputs differ.\n"
        "\n"
        "  --temperature T   the fork's sampling; options not given keep the parent's values\n"
        "  --top-k K\n"
        "  --top-p P\n"
        "  --seed S          re-seed the fork's RNG with S\n"
        "  --on WORKER       place the fork on WORKER's group if it can serve it\n"
        "  --version V       fork SESSION's snapshot version V (`hyla snapshots` lists them)\n"
        "                    instead of its current state; the fork keeps V's sampling and RNG\n"
        "                    (not with --temperature, --top-k, --top-p or --seed)\n",
    [HYLA_CMD_RM] =
        "usage: hyla rm SESSION...\n"
        "\n"
        "Delete sessions and all their snapshots. Every SESSION is tried; the exit status is\n"
        "that of the first failure.\n",
    [HYLA_CMD_LS] =
        "usage: hyla ls [--model NAME] [--all] [--ids]\n"
        "\n"
        "List this tenant's sessions, ordered by id: id, state, tier, model, position, tokens\n"
        "generated, last snapshot version, workers.\n"
        "\n"
        "  --model NAME   only sessions of this model\n"
        "  --all          every tenant's sessions (the operators' Cluster service), with a\n"
        "                 tenant column\n"
        "  --ids          print the session ids only, one per line\n",
    [HYLA_CMD_SHOW] =
        "usage: hyla show SESSION\n"
        "\n"
        "Print every field the coordinator knows of a session, one per line.\n",
    [HYLA_CMD_STATUS] =
        "usage: hyla status [--wait] [--timeout SEC]\n"
        "\n"
        "Print the cluster's workers (state, model, layers, device, memory, load), their groups\n"
        "and the number of sessions in each tier (gpu, host, store) over all tenants.\n"
        "\n"
        "  --wait          first wait until the coordinator answers and a worker group is complete\n"
        "                  (it can take sessions): the step between starting the processes and\n"
        "                  `hyla create`\n"
        "  --timeout SEC   with --wait: give up after SEC seconds (default 60) with exit status 4\n",
    [HYLA_CMD_DRAIN] =
        "usage: hyla drain WORKER [--wait] [--timeout SEC]\n"
        "\n"
        "Stop placing sessions on WORKER and have it hand its sessions over: it snapshots each to\n"
        "the store and drops it, and the session continues on another group when next used (one\n"
        "that is appending or generating goes when that call ends). Prints how many sessions were\n"
        "moved and how many remain.\n"
        "\n"
        "  --wait          return only when the worker is drained (holds no session); while\n"
        "                  waiting, the number of sessions left goes to stderr every 5 s (not -q)\n"
        "  --timeout SEC   with --wait: give up after SEC seconds (default 600) with exit status 4\n"
        "                  and an error naming the sessions left and the worker's last handover\n"
        "                  error; the worker stays draining. Without --wait: the call's deadline\n"
        "                  (default 60)\n"
        "\n"
        "With --wait the exit status is 0 once the worker is drained, 4 when SEC pass first, 1 when\n"
        "the worker dies (stops sending heartbeats) before it is seen drained: sessions it still\n"
        "held continue from their last durable snapshot. Interrupting the wait does not stop the\n"
        "drain; running drain --wait again waits again.\n"
        "\n"
        "Example:  hyla drain gpu3 --wait --timeout 1800\n",
    [HYLA_CMD_HELP] = "usage: hyla help [COMMAND]\n",
    [HYLA_CMD_SNAPSHOTS] =
        "usage: hyla snapshots SESSION\n"
        "\n"
        "List the durable snapshot versions the store keeps of SESSION (the last N, the\n"
        "coordinator's --keep-versions), oldest first: version, position, tokens generated,\n"
        "commit time (UTC), state bytes, stored bytes; the head is marked with *.\n"
        "`hyla resume SESSION --version V` rewinds to one, `hyla fork SESSION --version V`\n"
        "copies one into a new session.\n",
    [HYLA_CMD_EXPORT] =
        "usage: hyla export SESSION FILE|- [--version V]\n"
        "\n"
        "Write SESSION's portable snapshot file (docs/STATE_FORMAT.md, the file hyla-state and\n"
        "hyla-run read) to FILE, or to stdout for -. An active session first commits its current\n"
        "state as a new snapshot version and stays active; the file holds that version. FILE is\n"
        "written whole or not at all (FILE.tmp.PID, then renamed). `hyla import` takes the file\n"
        "into any cluster that serves the same model.\n"
        "\n"
        "  --version V   export the kept snapshot version V instead (`hyla snapshots` lists them)\n"
        "\n"
        "Example:  hyla export s-0123456789abcdef chat.hys\n",
    [HYLA_CMD_IMPORT] =
        "usage: hyla import FILE|- [--as ID] [--on WORKER]\n"
        "\n"
        "Create a session of your tenant from a portable snapshot file (FILE, or stdin for -), as\n"
        "`hyla export` writes it, and place it so that generate continues where the exported\n"
        "session was. Prints the new session's id alone on stdout. The file is checked whole\n"
        "first: a damaged file (exit 1, DATA_LOSS), a file of another model (exit 6,\n"
        "FAILED_PRECONDITION) or a taken id (exit 6, ALREADY_EXISTS) is refused and leaves nothing.\n"
        "\n"
        "  --as ID       the new session's id (default: the cluster chooses one, as create does;\n"
        "                the file does not carry the exported session's id)\n"
        "  --on WORKER   place it on WORKER's group\n"
        "\n"
        "Example:  hyla --server other:7000 import chat.hys --as s-0123456789abcdef\n",
    [HYLA_CMD_READ] =
        "usage: hyla read SESSION [--from N] [-n N] [--ids]\n"
        "\n"
        "Print the session's generated tokens again, from its token log (by default the last\n"
        "65536 generated tokens; the worker's --token-log; kept in every snapshot). Text goes to stdout as `generate`\n"
        "prints it (control bytes escaped on a terminal); stderr says which tokens they were\n"
        "and the session's generated count (a session paused in the store gives no text: use\n"
        "--ids, or resume it first). For a generate that was cut off (exit status 4, or\n"
        "a cancel): if stderr or `hyla show` gives generated > the tokens you received, read\n"
        "the rest with --from RECEIVED; then `generate` continues with no gap.\n"
        "\n"
        "  --from N            the first token wanted, counted over the session's generated\n"
        "                      tokens (0 = its first; default 0)\n"
        "  -n, --max-tokens N  at most N tokens (default: all, up to 65536)\n"
        "  --ids               print token ids (space-separated, one line) instead of text\n"
        "\n"
        "A --from below the oldest token the log keeps fails with exit status 6 (OUT_OF_RANGE;\n"
        "the message names the first available); a --from at or past the generated count\n"
        "prints nothing.\n"
        "\n"
        "Example:  hyla read $S --from 120 --ids\n",
};

static void print_help(FILE *f, hyla_cli_cmd cmd) {
    if (cmd > HYLA_CMD_NONE && cmd < HYLA_CMD_COUNT && cmd_help[cmd]) {
        fputs(cmd_help[cmd], f);
        fputs("\nCommon options: --server ADDR, --tenant T, --timeout SEC, -q (see hyla --help).\n", f);
    } else {
        fputs(usage_main, f);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* parsing                                                                                   */

enum {
    O_SERVER, O_TENANT, O_TIMEOUT, O_QUIET, O_HELP, O_MODEL, O_TEMPERATURE, O_TOP_K, O_TOP_P, O_SEED,
    O_ON, O_TO, O_N, O_STOP, O_STOP_ID, O_IGNORE_EOS, O_IDS, O_EVICT, O_WAIT, O_TOKENS, O_BOS,
    O_NO_PROGRESS, O_ALL, O_VERSION, O_API_KEY, O_TLS_CA, O_AS, O_FROM, O_COUNT
};

#define C(x) (1u << HYLA_CMD_##x)
#define C_ALL 0xffffffffu

static const struct {
    const char *lng;
    char shrt;
    int arg;
    unsigned cmds; /* commands that accept it */
} opt_spec[O_COUNT] = {
    [O_SERVER] = {"server", 0, 1, C_ALL},
    [O_TENANT] = {"tenant", 0, 1, C_ALL},
    [O_API_KEY] = {"api-key", 0, 1, C_ALL},
    [O_TLS_CA] = {"tls-ca", 0, 1, C_ALL},
    [O_TIMEOUT] = {"timeout", 0, 1, C_ALL},
    [O_QUIET] = {"quiet", 'q', 0, C_ALL},
    [O_HELP] = {"help", 'h', 0, C_ALL},
    [O_MODEL] = {"model", 0, 1, C(CREATE) | C(LS)},
    [O_TEMPERATURE] = {"temperature", 0, 1, C(CREATE) | C(GENERATE) | C(FORK)},
    [O_TOP_K] = {"top-k", 0, 1, C(CREATE) | C(GENERATE) | C(FORK)},
    [O_TOP_P] = {"top-p", 0, 1, C(CREATE) | C(GENERATE) | C(FORK)},
    [O_SEED] = {"seed", 0, 1, C(CREATE) | C(GENERATE) | C(FORK)},
    [O_ON] = {"on", 0, 1, C(CREATE) | C(RESUME) | C(FORK) | C(IMPORT)},
    [O_TO] = {"to", 0, 1, C(MIGRATE)},
    [O_N] = {"max-tokens", 'n', 1, C(GENERATE) | C(READ)},
    [O_STOP] = {"stop", 0, 1, C(GENERATE)},
    [O_STOP_ID] = {"stop-id", 0, 1, C(GENERATE)},
    [O_IGNORE_EOS] = {"ignore-eos", 0, 0, C(GENERATE)},
    [O_IDS] = {"ids", 0, 0, C(GENERATE) | C(LS) | C(READ)},
    [O_EVICT] = {"evict", 0, 0, C(PAUSE)},
    [O_WAIT] = {"wait", 0, 0, C(DRAIN) | C(STATUS)},
    [O_TOKENS] = {"tokens", 0, 0, C(APPEND)},
    [O_BOS] = {"bos", 0, 0, C(APPEND)},
    [O_NO_PROGRESS] = {"no-progress", 0, 0, C(APPEND)},
    [O_ALL] = {"all", 0, 0, C(LS)},
    [O_VERSION] = {"version", 0, 1, C(RESUME) | C(FORK) | C(EXPORT)},
    [O_AS] = {"as", 0, 1, C(IMPORT)},
    [O_FROM] = {"from", 0, 1, C(READ)},
};

/* Positional arguments of each command: min, max (-1: any), and their names for messages. */
static const struct {
    int min, max;
    const char *names;
} pos_spec[HYLA_CMD_COUNT] = {
    [HYLA_CMD_CREATE] = {0, 0, ""},
    [HYLA_CMD_APPEND] = {2, 2, "SESSION FILE|-"},
    [HYLA_CMD_GENERATE] = {1, 1, "SESSION"},
    [HYLA_CMD_PAUSE] = {1, 1, "SESSION"},
    [HYLA_CMD_RESUME] = {1, 1, "SESSION"},
    [HYLA_CMD_MIGRATE] = {1, 1, "SESSION"},
    [HYLA_CMD_FORK] = {1, 1, "SESSION"},
    [HYLA_CMD_RM] = {1, -1, "SESSION..."},
    [HYLA_CMD_LS] = {0, 0, ""},
    [HYLA_CMD_SHOW] = {1, 1, "SESSION"},
    [HYLA_CMD_STATUS] = {0, 0, ""},
    [HYLA_CMD_DRAIN] = {1, 1, "WORKER"},
    [HYLA_CMD_HELP] = {0, 1, "[COMMAND]"},
    [HYLA_CMD_SNAPSHOTS] = {1, 1, "SESSION"},
    [HYLA_CMD_EXPORT] = {2, 2, "SESSION FILE|-"},
    [HYLA_CMD_IMPORT] = {1, 1, "FILE|-"},
    [HYLA_CMD_READ] = {1, 1, "SESSION"},
};

static hyla_cli_cmd find_cmd(const char *s) {
    for (int i = HYLA_CMD_NONE + 1; i < HYLA_CMD_COUNT; i++)
        if (strcmp(cmd_names[i], s) == 0)
            return (hyla_cli_cmd)i;
    return HYLA_CMD_NONE;
}

static int parse_double(const char *s, double *out) {
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (!s[0] || end == s || *end || errno || !isfinite(v))
        return 0;
    *out = v;
    return 1;
}

static int parse_u64(const char *s, uint64_t *out) {
    if (!s[0] || s[0] < '0' || s[0] > '9')
        return 0;
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (*end || errno)
        return 0;
    *out = v;
    return 1;
}

static int parse_i64(const char *s, int64_t *out) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!s[0] || end == s || *end || errno)
        return 0;
    *out = v;
    return 1;
}

/* Remember the first error only. */
static void set_err(char *err, size_t n, int *have, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void set_err(char *err, size_t n, int *have, const char *fmt, ...) {
    if (*have)
        return;
    *have = 1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
}

/* Apply option o with value v (NULL for flags). */
static void apply_opt(hyla_cli_args *a, int o, const char *name, const char *v, char *err, size_t n, int *have) {
    double d;
    uint64_t u;
    int64_t i;
    switch (o) {
    case O_SERVER: a->server = v; break;
    case O_TENANT: a->tenant = v; break;
    case O_API_KEY: a->api_key = v; break;
    case O_TLS_CA: a->tls_ca = v; break;
    case O_TIMEOUT:
        if (!parse_double(v, &d) || d <= 0)
            set_err(err, n, have, "%s: '%s' is not a number of seconds > 0", name, v);
        else
            a->timeout_s = d;
        break;
    case O_QUIET: a->quiet = 1; break;
    case O_HELP: a->help = 1; break;
    case O_MODEL: a->model = v; break;
    case O_TEMPERATURE:
        if (!parse_double(v, &d) || d < 0)
            set_err(err, n, have, "%s: '%s' is not a number >= 0", name, v);
        a->has_temperature = 1;
        a->temperature = (float)d;
        break;
    case O_TOP_K:
        if (!parse_i64(v, &i) || i < 0 || i > INT32_MAX)
            set_err(err, n, have, "%s: '%s' is not an integer >= 0", name, v);
        a->has_top_k = 1;
        a->top_k = (int32_t)i;
        break;
    case O_TOP_P:
        if (!parse_double(v, &d) || d < 0 || d > 1)
            set_err(err, n, have, "%s: '%s' is not a number in [0, 1]", name, v);
        a->has_top_p = 1;
        a->top_p = (float)d;
        break;
    case O_SEED:
        if (!parse_u64(v, &u))
            set_err(err, n, have, "%s: '%s' is not an unsigned 64-bit integer", name, v);
        a->has_seed = 1;
        a->seed = u;
        break;
    case O_ON:
    case O_TO:
        if (!v[0])
            set_err(err, n, have, "%s: the worker id is empty", name);
        a->worker = v;
        break;
    case O_N:
        if (!parse_u64(v, &u) || u < 1 || u > UINT32_MAX)
            set_err(err, n, have, "%s: '%s' is not a token count in [1, %u]", name, v, UINT32_MAX);
        a->has_max_tokens = 1;
        a->max_tokens = (uint32_t)u;
        break;
    case O_STOP:
        if (!v[0])
            set_err(err, n, have, "%s: the stop sequence is empty", name);
        a->stop[a->n_stop++] = v;
        break;
    case O_STOP_ID:
        if (!parse_i64(v, &i) || i < 0 || i > INT32_MAX)
            set_err(err, n, have, "%s: '%s' is not a token id", name, v);
        a->stop_ids[a->n_stop_ids++] = (int32_t)i;
        break;
    case O_IGNORE_EOS: a->ignore_eos = 1; break;
    case O_IDS: a->ids = 1; break;
    case O_EVICT: a->evict = 1; break;
    case O_WAIT: a->wait = 1; break;
    case O_TOKENS: a->tokens = 1; break;
    case O_BOS: a->bos = 1; break;
    case O_NO_PROGRESS: a->no_progress = 1; break;
    case O_ALL: a->all = 1; break;
    case O_VERSION:
        if (!parse_u64(v, &u) || u == 0)
            set_err(err, n, have, "%s: '%s' is not a snapshot version (an integer >= 1)", name, v);
        a->version = u;
        break;
    case O_AS:
        if (!v[0])
            set_err(err, n, have, "%s: the session id is empty", name);
        a->as_id = v;
        break;
    case O_FROM:
        if (!parse_u64(v, &u))
            set_err(err, n, have, "%s: '%s' is not a token index (an integer >= 0)", name, v);
        a->from = u;
        break;
    default: HYLA_ASSERT(!"unknown option id");
    }
}

void hyla_cli_args_free(hyla_cli_args *a) {
    if (!a)
        return;
    free(a->stop);
    free(a->stop_ids);
    free(a->pos);
    memset(a, 0, sizeof *a);
}

int hyla_cli_parse(int argc, char **argv, const char *env_server, const char *env_tenant, hyla_cli_args *a,
                   char *err, size_t errlen) {
    memset(a, 0, sizeof *a);
    err[0] = 0;
    int have_err = 0;
    size_t cap = argc > 0 ? (size_t)argc : 1;
    a->stop = calloc(cap, sizeof *a->stop);
    a->stop_ids = calloc(cap, sizeof *a->stop_ids);
    a->pos = calloc(cap, sizeof *a->pos);
    int *seen = calloc(cap, sizeof *seen); /* option ids in order, checked once the command is known */
    const char **seen_name = calloc(cap, sizeof *seen_name);
    HYLA_ASSERT(a->stop && a->stop_ids && a->pos && seen && seen_name);
    int n_seen = 0, end_opts = 0;

    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!end_opts && strcmp(arg, "--") == 0) {
            end_opts = 1;
            continue;
        }
        if (!end_opts && arg[0] == '-' && arg[1]) {
            int o = -1;
            const char *val = NULL;
            char name[64];
            if (arg[1] == '-') {
                const char *eq = strchr(arg + 2, '=');
                size_t len = eq ? (size_t)(eq - (arg + 2)) : strlen(arg + 2);
                for (int k = 0; k < O_COUNT; k++)
                    if (strlen(opt_spec[k].lng) == len && strncmp(opt_spec[k].lng, arg + 2, len) == 0)
                        o = k;
                snprintf(name, sizeof name, "--%.*s", (int)(len < 48 ? len : 48), arg + 2);
                if (o >= 0 && eq) {
                    if (!opt_spec[o].arg) {
                        set_err(err, errlen, &have_err, "%s takes no value", name);
                        continue;
                    }
                    val = eq + 1;
                }
            } else {
                for (int k = 0; k < O_COUNT; k++)
                    if (opt_spec[k].shrt && opt_spec[k].shrt == arg[1])
                        o = k;
                snprintf(name, sizeof name, "-%c", arg[1]);
                if (o >= 0 && arg[2]) {
                    if (!opt_spec[o].arg) {
                        set_err(err, errlen, &have_err, "unknown option '%s'", arg);
                        continue;
                    }
                    val = arg + 2; /* -n16 */
                }
            }
            if (o < 0) {
                set_err(err, errlen, &have_err, "unknown option '%s'", arg);
                continue;
            }
            if (opt_spec[o].arg && !val) {
                if (i + 1 >= argc) {
                    set_err(err, errlen, &have_err, "%s needs a value", name);
                    continue;
                }
                val = argv[++i];
            }
            seen[n_seen] = o;
            seen_name[n_seen++] = opt_spec[o].lng;
            apply_opt(a, o, name, val, err, errlen, &have_err);
            continue;
        }
        if (a->cmd == HYLA_CMD_NONE) {
            a->cmd = find_cmd(arg);
            if (a->cmd == HYLA_CMD_NONE)
                set_err(err, errlen, &have_err, "unknown command '%s'", arg);
            if (a->cmd == HYLA_CMD_NONE)
                a->cmd = HYLA_CMD_COUNT; /* remember that one was given */
            continue;
        }
        a->pos[a->n_pos++] = arg;
    }
    if (a->cmd == HYLA_CMD_COUNT)
        a->cmd = HYLA_CMD_NONE;

    if (a->cmd == HYLA_CMD_HELP) {
        a->help = 1;
        a->help_cmd = a->n_pos ? find_cmd(a->pos[0]) : HYLA_CMD_NONE;
        if (a->n_pos && a->help_cmd == HYLA_CMD_NONE) {
            snprintf(err, errlen, "help: unknown command '%s'", a->pos[0]);
            free(seen);
            free(seen_name);
            return HYLA_EXIT_USAGE;
        }
    } else if (a->help) {
        a->help_cmd = a->cmd;
    }
    if (a->help) { /* help wins over every other complaint */
        free(seen);
        free(seen_name);
        err[0] = 0;
        return HYLA_EXIT_OK;
    }
    if (!have_err && a->cmd == HYLA_CMD_NONE)
        set_err(err, errlen, &have_err, "no command given");
    if (!have_err) {
        for (int k = 0; k < n_seen; k++)
            if (!(opt_spec[seen[k]].cmds & (1u << a->cmd))) {
                set_err(err, errlen, &have_err, "%s: option --%s does not apply to this command", cmd_names[a->cmd],
                        seen_name[k]);
                break;
            }
    }
    if (!have_err) {
        int mn = pos_spec[a->cmd].min, mx = pos_spec[a->cmd].max;
        if (a->n_pos < mn || (mx >= 0 && a->n_pos > mx)) {
            if (mx == 0)
                set_err(err, errlen, &have_err, "%s takes no arguments (got '%s')", cmd_names[a->cmd], a->pos[0]);
            else
                set_err(err, errlen, &have_err, "%s expects %s, got %d argument(s)", cmd_names[a->cmd],
                        pos_spec[a->cmd].names, a->n_pos);
        }
    }
    if (!have_err) {
        for (int k = 0; k < a->n_pos; k++)
            if (!a->pos[k][0])
                set_err(err, errlen, &have_err, "%s: argument %d is empty", cmd_names[a->cmd], k + 1);
    }
    if (!have_err && a->cmd == HYLA_CMD_GENERATE && !a->has_max_tokens)
        set_err(err, errlen, &have_err, "generate needs -n N (the most tokens to generate)");
    if (!have_err && a->cmd == HYLA_CMD_LS && a->all && a->model)
        set_err(err, errlen, &have_err, "ls: --model and --all cannot be combined");
    if (!a->server && env_server && env_server[0])
        a->server = env_server;
    if (!a->tenant && env_tenant && env_tenant[0])
        a->tenant = env_tenant;
    if (!have_err && (!a->server || !a->server[0]))
        set_err(err, errlen, &have_err, "no server address: give --server ADDR or set HYLA_SERVER");
    free(seen);
    free(seen_name);
    return have_err ? HYLA_EXIT_USAGE : HYLA_EXIT_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* output helpers                                                                            */

int hyla_cli_exit_code(hyla_status st, int code) {
    if (st == HYLA_OK)
        return HYLA_EXIT_OK;
    switch (code) {
    case HYLA_CODE_NOT_FOUND: return HYLA_EXIT_NOT_FOUND;
    case HYLA_CODE_UNAVAILABLE:
    case HYLA_CODE_DEADLINE_EXCEEDED:
    case HYLA_CODE_ABORTED: return HYLA_EXIT_UNAVAILABLE; /* paused or moved mid-call: call again */
    case HYLA_CODE_PERMISSION_DENIED:
    case HYLA_CODE_UNAUTHENTICATED: return HYLA_EXIT_PERMISSION;
    case HYLA_CODE_INVALID_ARGUMENT:
    case HYLA_CODE_OUT_OF_RANGE:
    case HYLA_CODE_RESOURCE_EXHAUSTED:
    case HYLA_CODE_FAILED_PRECONDITION:
    case HYLA_CODE_ALREADY_EXISTS: return HYLA_EXIT_REJECTED;
    default: return HYLA_EXIT_ERROR;
    }
}

static const char *human_bytes(uint64_t b, char *buf, size_t n) {
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(buf, n, "%llu B", (unsigned long long)b);
    else
        snprintf(buf, n, "%.1f %s", v, units[u]);
    return buf;
}

static void human_duration(double s, char *buf, size_t n) {
    if (!(s >= 0) || s > 1e7) {
        snprintf(buf, n, "?");
        return;
    }
    long t = (long)(s + 0.5);
    if (t < 60)
        snprintf(buf, n, "%lds", t);
    else if (t < 3600)
        snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
    else
        snprintf(buf, n, "%ldh%02ldm", t / 3600, (t % 3600) / 60);
}

void hyla_cli_format_progress(char *buf, size_t n, const char *session, const hyla_append_progress *p, int bar) {
    /* The expected total: the server's, else an estimate from the bytes sent so far. */
    uint64_t total = p->total_tokens;
    int estimated = 0;
    if (!total && p->total_bytes && p->bytes_sent && p->tokens_received) {
        total = (uint64_t)((double)p->tokens_received * (double)p->total_bytes / (double)p->bytes_sent + 0.5);
        estimated = 1;
    }
    if (p->done)
        total = p->tokens_ingested, estimated = 0;
    if (total && total < p->tokens_ingested)
        total = p->tokens_ingested;
    double rate = p->tokens_per_second > 0 ? p->tokens_per_second
                  : p->elapsed_s > 0      ? (double)p->tokens_ingested / p->elapsed_s
                                          : 0;
    double frac = total ? (double)p->tokens_ingested / (double)total : 0;
    char eta[32] = "";
    if (total && !p->done && rate > 0)
        human_duration((double)(total - p->tokens_ingested) / rate, eta, sizeof eta);
    char tot[48] = "";
    if (total)
        snprintf(tot, sizeof tot, "/%s%llu", estimated ? "~" : "", (unsigned long long)total);

    if (bar > 0) {
        char cells[256];
        if (bar > (int)sizeof cells - 1)
            bar = (int)sizeof cells - 1;
        int full = total ? (int)(frac * bar + 0.5) : 0;
        for (int i = 0; i < bar; i++)
            cells[i] = i < full ? '#' : total ? '.' : ' ';
        cells[bar] = 0;
        char pct[16] = "   ?  ";
        if (total)
            snprintf(pct, sizeof pct, "%5.1f%%", 100 * frac);
        snprintf(buf, n, "[%s] %s %llu%s tok  %.0f tok/s%s%s", cells, pct, (unsigned long long)p->tokens_ingested,
                 tot, rate, eta[0] ? "  ETA " : "", eta);
    } else {
        char pct[24] = "";
        if (total)
            snprintf(pct, sizeof pct, " (%.1f%%)", 100 * frac);
        snprintf(buf, n, "append %s: %llu%s tokens%s, %.0f tokens/s%s%s%s", session,
                 (unsigned long long)p->tokens_ingested, tot, pct, rate, eta[0] ? ", ETA " : "", eta,
                 p->done ? ", done" : "");
    }
}

static int fail(const char *cmd, hyla_status st) {
    fprintf(stderr, "hyla %s: %s\n", cmd, hyla_last_error());
    return hyla_cli_exit_code(st, hyla_client_last_code());
}

static const char *time_str(int64_t unix_ms, char *buf, size_t n) {
    if (unix_ms <= 0) {
        snprintf(buf, n, "-");
        return buf;
    }
    time_t t = (time_t)(unix_ms / 1000);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(buf, n, "%Y-%m-%d %H:%M:%SZ", &tm);
    return buf;
}

static void join_ids(char **v, size_t n, char *buf, size_t cap) {
    buf[0] = 0;
    size_t off = 0;
    for (size_t i = 0; i < n && off < cap; i++)
        off += (size_t)snprintf(buf + off, cap - off, "%s%s", i ? "," : "", v[i]);
    if (!n)
        snprintf(buf, cap, "-");
}

/* ---------------------------------------------------------------------------------------- */
/* commands                                                                                  */

typedef struct {
    const hyla_cli_args *a;
    hyla_client *c;
} run_ctx;

static int cmd_create(run_ctx *r) {
    const hyla_cli_args *a = r->a;
    hyla_create_params p = hyla_create_default_params();
    p.model = a->model;
    p.has_sampling = a->has_temperature || a->has_top_k || a->has_top_p;
    p.sampling.temperature = a->temperature;
    p.sampling.top_k = a->top_k;
    p.sampling.top_p = a->top_p;
    p.seed = a->seed;
    p.worker_hint = a->worker;
    hyla_session_info s;
    hyla_status st = hyla_client_create_session(r->c, &p, &s);
    if (st != HYLA_OK)
        return fail("create", st);
    printf("%s\n", s.id);
    fflush(stdout);
    if (!a->quiet) {
        char w[512];
        join_ids(s.worker_ids, s.n_worker_ids, w, sizeof w);
        fprintf(stderr, "hyla: created %s: model %s, group %s (workers %s)\n", s.id, s.model,
                s.group_id[0] ? s.group_id : "-", w);
    }
    hyla_session_info_clear(&s);
    return HYLA_EXIT_OK;
}

/* Sampling for generate/fork: the session's current values with the given options on top. */
static hyla_status merged_sampling(run_ctx *r, const char *id, hyla_sampling_params *out) {
    const hyla_cli_args *a = r->a;
    hyla_session_info s;
    HYLA_TRY(hyla_client_get_session(r->c, id, &s));
    *out = s.sampling;
    hyla_session_info_clear(&s);
    if (a->has_temperature)
        out->temperature = a->temperature;
    if (a->has_top_k)
        out->top_k = a->top_k;
    if (a->has_top_p)
        out->top_p = a->top_p;
    return HYLA_OK;
}

typedef struct {
    const char *session;
    int mode; /* 0 none, 1 bar (terminal), 2 lines */
    double last_print;
    int drawn;
} progress_ui;

static int on_progress(const hyla_append_progress *p, void *ud) {
    progress_ui *u = ud;
    double now = hyla_now();
    char line[512];
    if (u->mode == 1) {
        if (!p->done && u->drawn && now - u->last_print < 0.1)
            return 0;
        hyla_cli_format_progress(line, sizeof line, u->session, p, 30);
        fprintf(stderr, "\r%s\033[K", line);
        fflush(stderr);
        u->drawn = 1;
        u->last_print = now;
    } else if (u->mode == 2) {
        if (p->done || now - u->last_print < 2.0)
            return 0; /* the final summary says it */
        hyla_cli_format_progress(line, sizeof line, u->session, p, 0);
        fprintf(stderr, "%s\n", line);
        u->last_print = now;
    }
    return 0;
}

typedef struct {
    int fd;
    const char *name;
} input_file;

static ssize_t read_input(void *buf, size_t cap, void *ud) {
    const input_file *in = ud;
    for (;;) {
        ssize_t n = read(in->fd, buf, cap);
        if (n >= 0)
            return n;
        if (errno != EINTR) {
            hyla_fail(HYLA_ERR_IO, "reading %s: %s", in->name, strerror(errno));
            return -1;
        }
    }
}

/* Read the whole input (token id lists are small next to their text). *out: caller frees. */
static hyla_status read_all(int fd, const char *name, char **out, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap + 1);
    HYLA_ASSERT(b);
    for (;;) {
        if (n == cap) {
            cap *= 2;
            b = realloc(b, cap + 1);
            HYLA_ASSERT(b);
        }
        ssize_t k = read(fd, b + n, cap - n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0) {
            free(b);
            return hyla_fail(HYLA_ERR_IO, "reading %s: %s", name, strerror(errno));
        }
        if (k == 0)
            break;
        n += (size_t)k;
    }
    b[n] = 0;
    *out = b;
    *len = n;
    return HYLA_OK;
}

static hyla_status parse_token_ids(const char *text, const char *name, int32_t **ids, size_t *n) {
    size_t cap = 1024, k = 0;
    int32_t *v = malloc(cap * sizeof *v);
    HYLA_ASSERT(v);
    const char *p = text;
    size_t line = 1;
    for (;;) {
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r' || *p == ',') {
            if (*p == '\n')
                line++;
            p++;
        }
        if (!*p)
            break;
        char *end = NULL;
        errno = 0;
        long long x = strtoll(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT32_MAX ||
            (*end && *end != ' ' && *end != '\t' && *end != '\n' && *end != '\r' && *end != ',')) {
            free(v);
            return hyla_fail(HYLA_ERR_FORMAT, "%s line %zu: '%.20s' is not a token id", name, line, p);
        }
        if (k == cap) {
            cap *= 2;
            v = realloc(v, cap * sizeof *v);
            HYLA_ASSERT(v);
        }
        v[k++] = (int32_t)x;
        p = end;
    }
    *ids = v;
    *n = k;
    return HYLA_OK;
}

static int cmd_append(run_ctx *r) {
    const hyla_cli_args *a = r->a;
    const char *id = a->pos[0], *file = a->pos[1];
    int is_stdin = strcmp(file, "-") == 0;
    const char *name = is_stdin ? "stdin" : file;
    int fd = is_stdin ? 0 : open(file, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "hyla append: cannot open %s: %s\n", file, strerror(errno));
        return HYLA_EXIT_ERROR;
    }
    struct stat sb;
    uint64_t size = 0;
    if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode))
        size = (uint64_t)sb.st_size;

    progress_ui ui = {id, 0, 0, 0};
    if (!a->quiet && !a->no_progress)
        ui.mode = isatty(2) ? 1 : 2;
    ui.last_print = hyla_now();
    hyla_append_params p = hyla_append_default_params();
    p.add_bos = a->bos;
    p.progress = on_progress;
    p.progress_ud = &ui;
    hyla_append_progress fin;
    hyla_status st;
    if (a->tokens) {
        char *text = NULL;
        size_t len = 0;
        int32_t *ids = NULL;
        size_t n = 0;
        st = read_all(fd, name, &text, &len);
        if (st == HYLA_OK)
            st = parse_token_ids(text, name, &ids, &n);
        free(text);
        if (st != HYLA_OK) {
            if (!is_stdin)
                close(fd);
            fprintf(stderr, "hyla append: %s\n", hyla_last_error());
            return HYLA_EXIT_ERROR;
        }
        st = hyla_client_append_tokens(r->c, id, ids, n, &p, &fin);
        free(ids);
    } else {
        p.total_bytes_hint = size;
        input_file in = {fd, name};
        st = hyla_client_append_reader(r->c, id, read_input, &in, &p, &fin);
    }
    if (!is_stdin)
        close(fd);
    if (ui.mode == 1 && ui.drawn)
        fputc('\n', stderr);
    if (st != HYLA_OK)
        return fail("append", st);
    if (!a->quiet)
        fprintf(stderr, "hyla: appended %llu tokens to %s in %.2f s (%.0f tokens/s); position %llu\n",
                (unsigned long long)fin.tokens_ingested, id, fin.elapsed_s,
                fin.elapsed_s > 0 ? (double)fin.tokens_ingested / fin.elapsed_s : 0.0,
                (unsigned long long)fin.position);
    return HYLA_EXIT_OK;
}

typedef struct {
    int ids;
    int any;
    char last; /* last byte written to stdout */
    int out_err;
    int escape; /* stdout is a terminal: control bytes are written as \xNN */
} gen_ui;

/* Write text to stdout; with escape, control bytes other than newline and tab become \xNN so
 * that what a model generates cannot drive the terminal. */
static void write_text(const char *t, size_t n, int escape) {
    if (!escape) {
        fwrite(t, 1, n, stdout);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char b = (unsigned char)t[i];
        if ((b < 0x20 && b != '\n' && b != '\t') || b == 0x7f)
            printf("\\x%02x", b);
        else
            fputc(b, stdout);
    }
}

static int on_token(const hyla_token_piece *t, void *ud) {
    gen_ui *g = ud;
    if (g->ids) {
        for (size_t i = 0; i < t->n_token_ids; i++) {
            printf("%s%d", g->any ? " " : "", (int)t->token_ids[i]);
            g->any = 1;
        }
    } else if (t->text_len) {
        write_text(t->text, t->text_len, g->escape);
        g->any = 1;
        g->last = t->text[t->text_len - 1];
    }
    if (fflush(stdout) != 0 || ferror(stdout)) {
        g->out_err = errno ? errno : EIO;
        return 1;
    }
    return 0;
}

static int cmd_generate(run_ctx *r) {
    const hyla_cli_args *a = r->a;
    const char *id = a->pos[0];
    hyla_generate_params p = hyla_generate_default_params();
    p.max_tokens = a->max_tokens;
    p.stop = a->stop;
    p.n_stop = a->n_stop;
    p.stop_token_ids = a->stop_ids;
    p.n_stop_token_ids = a->n_stop_ids;
    p.ignore_eos = a->ignore_eos;
    p.reseed = a->has_seed;
    p.seed = a->seed;
    if (a->has_temperature || a->has_top_k || a->has_top_p) {
        hyla_status st = merged_sampling(r, id, &p.sampling);
        if (st != HYLA_OK)
            return fail("generate", st);
        p.has_sampling = 1;
    }
    gen_ui g = {a->ids, 0, '\n', 0, isatty(1)};
    p.on_token = on_token;
    p.ud = &g;
    hyla_generate_result res;
    hyla_status st = hyla_client_generate(r->c, id, &p, &res);
    if (g.ids && g.any)
        fputc('\n', stdout);
    else if (!g.ids && g.any && g.last != '\n' && isatty(1))
        fputc('\n', stdout);
    fflush(stdout);
    if (g.out_err) {
        fprintf(stderr, "hyla generate: writing stdout: %s (%u tokens were generated)\n", strerror(g.out_err),
                res.delivered);
        return HYLA_EXIT_ERROR;
    }
    if (st != HYLA_OK)
        return fail("generate", st);
    if (!a->quiet) {
        double gen_s = res.first_token_s >= 0 ? res.elapsed_s - res.first_token_s : 0;
        fprintf(stderr, "hyla: %u tokens in %.2f s (first after %.3f s, then %.1f tokens/s); finish: %s; position %llu\n",
                res.delivered, res.elapsed_s, res.first_token_s >= 0 ? res.first_token_s : 0.0,
                res.delivered > 1 && gen_s > 0 ? (res.delivered - 1) / gen_s : 0.0, hyla_finish_reason_name(res.finish),
                (unsigned long long)res.position);
    }
    return HYLA_EXIT_OK;
}

static int cmd_pause(run_ctx *r) {
    const char *id = r->a->pos[0];
    hyla_session_info s;
    hyla_snapshot_summary snap;
    hyla_status st = hyla_client_pause(r->c, id, r->a->evict, &s, &snap);
    if (st != HYLA_OK)
        return fail("pause", st);
    char b1[32], b2[32], b3[32];
    printf("%s paused: snapshot version %llu at position %llu; state %s, stored %s (this version wrote %s in %u "
           "chunk%s)\n",
           id, (unsigned long long)snap.version, (unsigned long long)snap.position,
           human_bytes(snap.state_bytes, b1, sizeof b1), human_bytes(snap.stored_bytes, b2, sizeof b2),
           human_bytes(snap.written_bytes, b3, sizeof b3), snap.chunks, snap.chunks == 1 ? "" : "s");
    hyla_session_info_clear(&s);
    return HYLA_EXIT_OK;
}

static void print_placement(const char *verb, const hyla_session_info *s) {
    char w[512];
    join_ids(s->worker_ids, s->n_worker_ids, w, sizeof w);
    printf("%s %s: %s on group %s (workers %s), tier %s, position %llu\n", s->id, verb,
           hyla_session_state_name(s->state), s->group_id[0] ? s->group_id : "-", w, hyla_tier_name(s->tier),
           (unsigned long long)s->position);
}

static int cmd_resume(run_ctx *r) {
    hyla_session_info s;
    hyla_status st = hyla_client_resume_version(r->c, r->a->pos[0], r->a->worker, r->a->version, &s);
    if (st != HYLA_OK)
        return fail("resume", st);
    print_placement(r->a->version ? "rewound" : "resumed", &s);
    hyla_session_info_clear(&s);
    return HYLA_EXIT_OK;
}

static int cmd_migrate(run_ctx *r) {
    hyla_session_info s;
    hyla_snapshot_summary snap;
    char *from = NULL;
    hyla_status st = hyla_client_migrate(r->c, r->a->pos[0], r->a->worker, &s, &snap, &from);
    if (st != HYLA_OK)
        return fail("migrate", st);
    char w[512];
    join_ids(s.worker_ids, s.n_worker_ids, w, sizeof w);
    printf("%s migrated: group %s -> %s (workers %s) through snapshot version %llu at position %llu\n", s.id,
           from[0] ? from : "-", s.group_id[0] ? s.group_id : "-", w, (unsigned long long)snap.version,
           (unsigned long long)snap.position);
    free(from);
    hyla_session_info_clear(&s);
    return HYLA_EXIT_OK;
}

static int cmd_fork(run_ctx *r) {
    const hyla_cli_args *a = r->a;
    hyla_fork_params p = hyla_fork_default_params();
    if (a->has_temperature || a->has_top_k || a->has_top_p) {
        hyla_status st = merged_sampling(r, a->pos[0], &p.sampling);
        if (st != HYLA_OK)
            return fail("fork", st);
        p.has_sampling = 1;
    }
    p.reseed = a->has_seed;
    p.seed = a->seed;
    p.worker_hint = a->worker;
    p.version = a->version;
    hyla_session_info s;
    hyla_status st = hyla_client_fork(r->c, a->pos[0], &p, &s);
    if (st != HYLA_OK)
        return fail("fork", st);
    printf("%s\n", s.id);
    fflush(stdout);
    if (!a->quiet)
        fprintf(stderr, "hyla: forked %s from %s at position %llu\n", s.id, a->pos[0], (unsigned long long)s.position);
    hyla_session_info_clear(&s);
    return HYLA_EXIT_OK;
}

static int cmd_snapshots(run_ctx *r) {
    hyla_snapshot_version *v = NULL;
    size_t n = 0;
    hyla_status st = hyla_client_list_snapshots(r->c, r->a->pos[0], &v, &n);
    if (st != HYLA_OK)
        return fail("snapshots", st);
    printf("%-9s %12s %10s %-20s %12s %12s\n", "VERSION", "POSITION", "GENERATED", "COMMITTED (UTC)", "STATE", "STORED");
    for (size_t i = 0; i < n; i++) {
        char when[32] = "-";
        if (v[i].created_unix_ms > 0) {
            time_t t = (time_t)(v[i].created_unix_ms / 1000);
            struct tm tm;
            gmtime_r(&t, &tm);
            strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
        }
        char ver[32];
        snprintf(ver, sizeof ver, "%llu%s", (unsigned long long)v[i].version, v[i].head ? "*" : "");
        printf("%-9s %12llu %10llu %-20s %12llu %12llu\n", ver, (unsigned long long)v[i].position,
               (unsigned long long)v[i].generated, when, (unsigned long long)v[i].state_bytes,
               (unsigned long long)v[i].stored_bytes);
    }
    free(v);
    return HYLA_EXIT_OK;
}

static int cmd_export(run_ctx *r) {
    const char *id = r->a->pos[0], *path = r->a->pos[1];
    hyla_export_info info;
    hyla_status st = strcmp(path, "-") == 0 ? hyla_client_export_session(r->c, id, r->a->version, stdout, &info)
                                            : hyla_client_export_session_file(r->c, id, r->a->version, path, &info);
    if (st != HYLA_OK)
        return fail("export", st);
    if (!r->a->quiet) {
        char b[32];
        fprintf(stderr, "hyla: exported %s (model %s) version %llu at position %llu to %s: %s\n", id, info.model,
                (unsigned long long)info.version, (unsigned long long)info.position,
                strcmp(path, "-") == 0 ? "stdout" : path, human_bytes(info.bytes, b, sizeof b));
    }
    return HYLA_EXIT_OK;
}

static int cmd_import(run_ctx *r) {
    const char *path = r->a->pos[0];
    hyla_session_info s;
    hyla_status st = strcmp(path, "-") == 0
                         ? hyla_client_import_session(r->c, stdin, r->a->as_id, r->a->worker, &s)
                         : hyla_client_import_session_file(r->c, path, r->a->as_id, r->a->worker, &s);
    if (st != HYLA_OK)
        return fail("import", st);
    printf("%s\n", s.id);
    fflush(stdout);
    if (!r->a->quiet)
        fprintf(stderr, "hyla: imported %s (model %s) at position %llu, %s on group %s\n", s.id, s.model,
                (unsigned long long)s.position, hyla_session_state_name(s.state), s.group_id[0] ? s.group_id : "-");
    hyla_session_info_clear(&s);
    return HYLA_EXIT_OK;
}

static int cmd_read(run_ctx *r) {
    const hyla_cli_args *a = r->a;
    hyla_read_result res;
    hyla_status st = hyla_client_read_tokens(r->c, a->pos[0], a->from, a->has_max_tokens ? a->max_tokens : 0, &res);
    if (st != HYLA_OK) {
        hyla_read_result_clear(&res);
        return fail("read", st);
    }
    if (a->ids) {
        for (size_t i = 0; i < res.n_tokens; i++)
            printf("%s%d", i ? " " : "", (int)res.token_ids[i]);
        if (res.n_tokens)
            fputc('\n', stdout);
    } else if (res.text_len) {
        write_text(res.text, res.text_len, isatty(1));
        if (isatty(1) && res.text[res.text_len - 1] != '\n')
            fputc('\n', stdout);
    } else if (res.n_tokens) {
        fprintf(stderr, "hyla read: no text for these %zu tokens (the session is in the store, or its model has no "
                        "tokenizer); --ids prints them\n", res.n_tokens);
    }
    if (!a->quiet)
        fprintf(stderr, "hyla: tokens %llu..%llu of %llu generated (the log keeps %llu on)\n",
                (unsigned long long)res.from_generated, (unsigned long long)(res.from_generated + res.n_tokens),
                (unsigned long long)res.generated, (unsigned long long)res.first_available);
    hyla_read_result_clear(&res);
    return HYLA_EXIT_OK;
}

static int cmd_rm(run_ctx *r) {
    int rc = HYLA_EXIT_OK;
    for (int i = 0; i < r->a->n_pos; i++) {
        uint64_t n = 0;
        hyla_status st = hyla_client_delete_session(r->c, r->a->pos[i], &n);
        if (st != HYLA_OK) {
            int e = fail("rm", st);
            if (rc == HYLA_EXIT_OK)
                rc = e;
            continue;
        }
        if (!r->a->quiet)
            fprintf(stderr, "hyla: deleted %s (%llu snapshot(s))\n", r->a->pos[i], (unsigned long long)n);
    }
    return rc;
}

static int cmd_ls(run_ctx *r) {
    const hyla_cli_args *a = r->a;
    hyla_session_list l;
    hyla_status st = a->all ? hyla_client_cluster_sessions(r->c, HYLA_TIER_UNKNOWN, NULL, NULL, &l)
                            : hyla_client_list_sessions(r->c, a->model, &l);
    if (st != HYLA_OK)
        return fail("ls", st);
    if (a->ids) {
        for (size_t i = 0; i < l.n; i++)
            printf("%s\n", l.items[i].id);
    } else {
        if (a->all)
            printf("%-20s %-12s ", "SESSION", "TENANT");
        else
            printf("%-20s ", "SESSION");
        printf("%-7s %-6s %-16s %10s %9s %5s %s\n", "STATE", "TIER", "MODEL", "POSITION", "GENERATED", "SNAP",
               "WORKERS");
        for (size_t i = 0; i < l.n; i++) {
            const hyla_session_info *s = &l.items[i];
            char w[512];
            join_ids(s->worker_ids, s->n_worker_ids, w, sizeof w);
            printf("%-20s ", s->id);
            if (a->all)
                printf("%-12s ", s->tenant);
            printf("%-7s %-6s %-16s %10llu %9llu %5llu %s\n", hyla_session_state_name(s->state),
                   hyla_tier_name(s->tier), s->model, (unsigned long long)s->position,
                   (unsigned long long)s->generated, (unsigned long long)s->last_snapshot.version, w);
        }
    }
    if (!a->quiet && !a->ids)
        fprintf(stderr, "hyla: %zu session(s)\n", l.n);
    hyla_session_list_clear(&l);
    return HYLA_EXIT_OK;
}

static int cmd_show(run_ctx *r) {
    hyla_session_info s;
    hyla_status st = hyla_client_get_session(r->c, r->a->pos[0], &s);
    if (st != HYLA_OK)
        return fail("show", st);
    char w[512], t1[48], t2[48], t3[48], b1[32], b2[32];
    join_ids(s.worker_ids, s.n_worker_ids, w, sizeof w);
    printf("session      %s\n", s.id);
    printf("tenant       %s\n", s.tenant);
    printf("model        %s\n", s.model);
    printf("state        %s\n", hyla_session_state_name(s.state));
    printf("tier         %s\n", hyla_tier_name(s.tier));
    printf("group        %s\n", s.group_id[0] ? s.group_id : "-");
    printf("workers      %s\n", w);
    printf("position     %llu\n", (unsigned long long)s.position);
    printf("generated    %llu\n", (unsigned long long)s.generated);
    printf("sampling     temperature %g, top-k %d, top-p %g\n", (double)s.sampling.temperature, (int)s.sampling.top_k,
           (double)s.sampling.top_p);
    printf("seed         %llu\n", (unsigned long long)s.seed);
    if (s.last_snapshot.version)
        printf("snapshot     version %llu at position %llu, state %s, stored %s, %s\n",
               (unsigned long long)s.last_snapshot.version, (unsigned long long)s.last_snapshot.position,
               human_bytes(s.last_snapshot.state_bytes, b1, sizeof b1),
               human_bytes(s.last_snapshot.stored_bytes, b2, sizeof b2),
               time_str(s.last_snapshot.created_unix_ms, t3, sizeof t3));
    else
        printf("snapshot     none\n");
    printf("parent       %s\n", s.parent_id[0] ? s.parent_id : "-");
    printf("created      %s\n", time_str(s.created_unix_ms, t1, sizeof t1));
    printf("updated      %s\n", time_str(s.updated_unix_ms, t2, sizeof t2));
    if (s.error[0])
        printf("error        %s\n", s.error);
    hyla_session_info_clear(&s);
    return HYLA_EXIT_OK;
}

#define STATUS_WAIT_DEFAULT_S 60.0 /* --timeout of status --wait when none is given */
#define STATUS_POLL_S 0.2
#define STATUS_POLL_TIMEOUT_MS 2000 /* the deadline of each poll */

static int any_group_complete(const hyla_cluster_status *cs) {
    for (size_t i = 0; i < cs->n_groups; i++)
        if (cs->groups[i].complete)
            return 1;
    return 0;
}

static void sleep_s(double s);

static int cmd_status(run_ctx *r) {
    hyla_cluster_status cs;
    hyla_status st = hyla_client_cluster_status(r->c, &cs);
    if (r->a->wait) { /* until the coordinator answers and some group can take a session */
        double limit = r->a->timeout_s > 0 ? r->a->timeout_s : STATUS_WAIT_DEFAULT_S, t0 = hyla_now();
        while (st != HYLA_OK || !any_group_complete(&cs)) {
            if (st != HYLA_OK) {
                int code = hyla_client_last_code();
                if (code != HYLA_CODE_UNAVAILABLE && code != HYLA_CODE_DEADLINE_EXCEEDED)
                    return fail("status", st);
            } else {
                hyla_cluster_status_clear(&cs);
            }
            if (hyla_now() - t0 >= limit) {
                fprintf(stderr, "hyla status: no worker group can take sessions after %g s%s\n", limit,
                        st != HYLA_OK ? " (the coordinator does not answer)" : "");
                return HYLA_EXIT_UNAVAILABLE;
            }
            sleep_s(STATUS_POLL_S);
            st = hyla_client_cluster_status(r->c, &cs);
        }
    }
    if (st != HYLA_OK)
        return fail("status", st);
    printf("%-14s %-9s %-14s %-9s %-8s %-8s %19s %9s %8s %10s\n", "WORKER", "STATE", "MODEL", "LAYERS", "GROUP",
           "DEVICE", "MEMORY FREE/TOTAL", "GPU+HOST", "CALLS", "TOKENS/S");
    for (size_t i = 0; i < cs.n_workers; i++) {
        const hyla_worker_info *w = &cs.workers[i];
        char layers[32], mem[48], f[32], t[32], sess[24];
        snprintf(layers, sizeof layers, "%u-%u/%u", w->layer_begin, w->layer_end, w->num_layers);
        snprintf(mem, sizeof mem, "%s/%s", human_bytes(w->memory_free_bytes, f, sizeof f),
                 human_bytes(w->memory_total_bytes, t, sizeof t));
        snprintf(sess, sizeof sess, "%u+%u", w->sessions_gpu, w->sessions_host);
        printf("%-14s %-9s %-14s %-9s %-8s %-8s %19s %9s %8u %10.1f\n", w->id, hyla_worker_state_name(w->state),
               w->model, layers, w->group_id[0] ? w->group_id : "-", w->device[0] ? w->device : "-", mem, sess,
               w->active_calls, w->tokens_per_second);
    }
    if (!cs.n_workers)
        printf("(no workers)\n");
    printf("\n%-10s %-14s %-9s %8s  %s\n", "GROUP", "MODEL", "COMPLETE", "SESSIONS", "WORKERS (stage order)");
    for (size_t i = 0; i < cs.n_groups; i++) {
        const hyla_group_info *g = &cs.groups[i];
        char w[512];
        join_ids(g->worker_ids, g->n_worker_ids, w, sizeof w);
        printf("%-10s %-14s %-9s %8u  %s\n", g->id, g->model, g->complete ? "yes" : "no", g->sessions, w);
    }
    if (!cs.n_groups)
        printf("(no groups)\n");
    printf("\nsessions: %llu gpu, %llu host, %llu store (all tenants)\n", (unsigned long long)cs.sessions_gpu,
           (unsigned long long)cs.sessions_host, (unsigned long long)cs.sessions_store);
    hyla_cluster_status_clear(&cs);
    return HYLA_EXIT_OK;
}

/* drain --wait polls DrainWorker without the server-side wait (which has no progress to show),
 * so the CLI can report progress, keep its own deadline and say what is left when it passes.
 * Each poll also re-marks the worker draining, should a restarted coordinator have forgotten. */
#define DRAIN_WAIT_DEFAULT_S 600.0 /* --timeout of drain --wait when none is given */
#define DRAIN_POLL_S 0.25
#define DRAIN_PROGRESS_S 5.0
#define DRAIN_POLL_TIMEOUT_MS 10000 /* the deadline of each poll */

static void sleep_s(double s) {
    if (s <= 0)
        return;
    struct timespec t = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&t, &t) != 0 && errno == EINTR) {
    }
}

static int cmd_drain(run_ctx *r) {
    const hyla_cli_args *a = r->a;
    const char *id = a->pos[0];
    hyla_drain_result d;
    hyla_status st = hyla_client_drain_worker(r->c, id, 0, &d);
    if (st != HYLA_OK)
        return fail("drain", st);
    if (!a->wait || d.state != HYLA_WORKER_DRAINING) {
        if (a->wait && d.state != HYLA_WORKER_DRAINED) {
            fprintf(stderr, "hyla drain: %s is %s, it cannot be drained (%u session(s) on its group)\n", id,
                    hyla_worker_state_name(d.state), d.sessions_remaining);
            return HYLA_EXIT_ERROR;
        }
        printf("%s %s: %u session(s) moved, %u remaining\n", id, hyla_worker_state_name(d.state), d.sessions_moved,
               d.sessions_remaining);
        return HYLA_EXIT_OK;
    }
    double limit = a->timeout_s > 0 ? a->timeout_s : DRAIN_WAIT_DEFAULT_S;
    double t0 = hyla_now(), last_report = t0;
    uint32_t start = d.sessions_remaining + d.sessions_moved, left = d.sessions_remaining;
    char handover_err[sizeof d.last_error], poll_err[512] = "";
    snprintf(handover_err, sizeof handover_err, "%s", d.last_error);
    for (;;) {
        double now = hyla_now();
        if (now - t0 >= limit) {
            fprintf(stderr,
                    "hyla drain: %s is not drained after %g s: %u session(s) still on it, %u handed over; it stays "
                    "draining (drain --wait again to keep waiting)\n",
                    id, limit, left, start > left ? start - left : 0);
            if (handover_err[0])
                fprintf(stderr, "hyla drain: last handover error reported by %s: %s\n", id, handover_err);
            else
                fprintf(stderr, "hyla drain: %s reported no handover error (a session that is appending or "
                                "generating is handed over when that call ends)\n", id);
            if (poll_err[0])
                fprintf(stderr, "hyla drain: the last poll failed: %s\n", poll_err);
            return HYLA_EXIT_UNAVAILABLE;
        }
        if (!a->quiet && now - last_report >= DRAIN_PROGRESS_S) {
            fprintf(stderr, "hyla: draining %s: %u session(s) left, %u handed over, %.0f s of %g s%s%s%s%s\n", id, left,
                    start > left ? start - left : 0, now - t0, limit, handover_err[0] ? "; last handover error: " : "",
                    handover_err, poll_err[0] ? "; last poll failed: " : "", poll_err);
            last_report = now;
        }
        sleep_s(fmin(DRAIN_POLL_S, limit - (now - t0)));
        st = hyla_client_drain_worker(r->c, id, 0, &d);
        if (st != HYLA_OK) {
            int code = hyla_client_last_code();
            if (code != HYLA_CODE_UNAVAILABLE && code != HYLA_CODE_DEADLINE_EXCEEDED)
                return fail("drain", st);
            snprintf(poll_err, sizeof poll_err, "%s", hyla_last_error()); /* the coordinator may come back */
            continue;
        }
        poll_err[0] = 0;
        left = d.sessions_remaining;
        if (start < left)
            start = left;
        if (d.last_error[0])
            snprintf(handover_err, sizeof handover_err, "%s", d.last_error);
        if (d.state == HYLA_WORKER_DRAINED)
            break;
        if (d.state != HYLA_WORKER_DRAINING) {
            if (d.state == HYLA_WORKER_DEAD)
                fprintf(stderr,
                        "hyla drain: %s is dead: it stopped sending heartbeats before it was seen drained; the "
                        "session(s) it had not handed over continue from their last durable snapshot\n",
                        id);
            else
                fprintf(stderr, "hyla drain: %s is %s, no longer draining\n", id, hyla_worker_state_name(d.state));
            if (handover_err[0])
                fprintf(stderr, "hyla drain: last handover error reported by %s: %s\n", id, handover_err);
            return HYLA_EXIT_ERROR;
        }
    }
    printf("%s %s: %u session(s) moved, %u remaining\n", id, hyla_worker_state_name(d.state), start > left ? start - left : 0,
           left);
    return HYLA_EXIT_OK;
}

int hyla_cli_main(int argc, char **argv) {
    hyla_cli_args a;
    char err[512];
    int rc = hyla_cli_parse(argc, argv, getenv("HYLA_SERVER"), getenv("HYLA_TENANT"), &a, err, sizeof err);
    if (rc == HYLA_EXIT_OK && a.help) {
        print_help(stdout, a.help_cmd);
        hyla_cli_args_free(&a);
        return HYLA_EXIT_OK;
    }
    if (rc != HYLA_EXIT_OK) {
        if (argc <= 1) {
            print_help(stderr, HYLA_CMD_NONE);
        } else {
            fprintf(stderr, "hyla: %s\n", err);
            if (a.cmd != HYLA_CMD_NONE)
                fprintf(stderr, "Try 'hyla %s --help'.\n", cmd_names[a.cmd]);
            else
                fprintf(stderr, "Try 'hyla --help'.\n");
        }
        hyla_cli_args_free(&a);
        return HYLA_EXIT_USAGE;
    }

    hyla_client_params p = hyla_client_default_params();
    p.api_key = a.api_key ? a.api_key : getenv("HYLA_API_KEY");
    p.tls_ca = a.tls_ca ? a.tls_ca : getenv("HYLA_TLS_CA");
    if (p.tls_ca && !p.tls_ca[0])
        p.tls_ca = NULL;
    if (a.timeout_s > 0)
        p.call_timeout_ms = (int64_t)(a.timeout_s * 1000 + 0.5);
    if (a.cmd == HYLA_CMD_DRAIN && a.wait && (a.timeout_s <= 0 || p.call_timeout_ms > DRAIN_POLL_TIMEOUT_MS))
        p.call_timeout_ms = DRAIN_POLL_TIMEOUT_MS; /* each poll; --timeout bounds the whole wait */
    if (a.cmd == HYLA_CMD_STATUS && a.wait && (a.timeout_s <= 0 || p.call_timeout_ms > STATUS_POLL_TIMEOUT_MS))
        p.call_timeout_ms = STATUS_POLL_TIMEOUT_MS;
    hyla_client *c = NULL;
    hyla_status st = hyla_client_connect(a.server, a.tenant, &p, &c);
    if (st != HYLA_OK) {
        fprintf(stderr, "hyla: %s\n", hyla_last_error());
        hyla_cli_args_free(&a);
        return st == HYLA_ERR_INVALID_ARG ? HYLA_EXIT_USAGE : HYLA_EXIT_ERROR;
    }
    run_ctx r = {&a, c};
    switch (a.cmd) {
    case HYLA_CMD_CREATE: rc = cmd_create(&r); break;
    case HYLA_CMD_APPEND: rc = cmd_append(&r); break;
    case HYLA_CMD_GENERATE: rc = cmd_generate(&r); break;
    case HYLA_CMD_PAUSE: rc = cmd_pause(&r); break;
    case HYLA_CMD_RESUME: rc = cmd_resume(&r); break;
    case HYLA_CMD_MIGRATE: rc = cmd_migrate(&r); break;
    case HYLA_CMD_FORK: rc = cmd_fork(&r); break;
    case HYLA_CMD_RM: rc = cmd_rm(&r); break;
    case HYLA_CMD_LS: rc = cmd_ls(&r); break;
    case HYLA_CMD_SHOW: rc = cmd_show(&r); break;
    case HYLA_CMD_SNAPSHOTS: rc = cmd_snapshots(&r); break;
    case HYLA_CMD_EXPORT: rc = cmd_export(&r); break;
    case HYLA_CMD_IMPORT: rc = cmd_import(&r); break;
    case HYLA_CMD_READ: rc = cmd_read(&r); break;
    case HYLA_CMD_STATUS: rc = cmd_status(&r); break;
    case HYLA_CMD_DRAIN: rc = cmd_drain(&r); break;
    default: HYLA_ASSERT(!"unhandled command");
    }
    fflush(stdout);
    hyla_client_close(c);
    hyla_cli_args_free(&a);
    return rc;
}
