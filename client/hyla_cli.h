/* hyla_cli.h — the `hyla` command line (client/hyla_cli.c), split from main() so that tests can
 * call the parser and the progress formatter directly. Internal to client/ and tests/. */
#ifndef HYLA_CLI_H
#define HYLA_CLI_H

#include <stddef.h>
#include <stdint.h>

#include "hyla.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Exit statuses (documented in `hyla --help`). */
enum {
    HYLA_EXIT_OK = 0,
    HYLA_EXIT_ERROR = 1,       /* any other failure (local I/O, INTERNAL, DATA_LOSS, ...) */
    HYLA_EXIT_USAGE = 2,       /* bad command line */
    HYLA_EXIT_NOT_FOUND = 3,   /* NOT_FOUND: no such session, worker or model */
    HYLA_EXIT_UNAVAILABLE = 4, /* UNAVAILABLE or DEADLINE_EXCEEDED: retrying may help */
    HYLA_EXIT_PERMISSION = 5,  /* PERMISSION_DENIED: another tenant's session */
    HYLA_EXIT_REJECTED = 6,    /* INVALID_ARGUMENT, OUT_OF_RANGE, RESOURCE_EXHAUSTED,
                                  FAILED_PRECONDITION, ALREADY_EXISTS: the server refused the
                                  request as given */
};

typedef enum {
    HYLA_CMD_NONE = 0,
    HYLA_CMD_CREATE,
    HYLA_CMD_APPEND,
    HYLA_CMD_GENERATE,
    HYLA_CMD_PAUSE,
    HYLA_CMD_RESUME,
    HYLA_CMD_MIGRATE,
    HYLA_CMD_FORK,
    HYLA_CMD_RM,
    HYLA_CMD_LS,
    HYLA_CMD_SHOW,
    HYLA_CMD_STATUS,
    HYLA_CMD_DRAIN,
    HYLA_CMD_HELP,
    HYLA_CMD_SNAPSHOTS,
    HYLA_CMD_EXPORT,
    HYLA_CMD_IMPORT,
    HYLA_CMD_READ,
    HYLA_CMD_COUNT
} hyla_cli_cmd;

/* A parsed command line. Strings are borrowed from argv or the environment; arrays are owned:
 * caller frees with hyla_cli_args_free. */
typedef struct {
    hyla_cli_cmd cmd;
    hyla_cli_cmd help_cmd;   /* help requested (--help, `help CMD`): for this command, NONE = all */
    int help;
    const char *server;      /* --server, else $HYLA_SERVER */
    const char *tenant;      /* --tenant, else $HYLA_TENANT; NULL: none */
    double timeout_s;        /* --timeout; 0: the default */
    int quiet;               /* -q */
    const char *model;       /* create --model, ls --model */
    const char *worker;      /* create/resume/fork --on, migrate --to */
    int has_temperature, has_top_k, has_top_p, has_seed;
    float temperature;
    int32_t top_k;
    float top_p;
    uint64_t seed;
    int has_max_tokens;
    uint32_t max_tokens;     /* generate -n, read -n */
    const char **stop;       /* [n_stop] generate --stop */
    size_t n_stop;
    int32_t *stop_ids;       /* [n_stop_ids] generate --stop-id */
    size_t n_stop_ids;
    int ignore_eos;          /* generate --ignore-eos */
    int ids;                 /* generate/read --ids: print token ids; ls --ids: print session ids only */
    int evict, wait, tokens, bos, no_progress, all;
    const char **pos;        /* [n_pos] positional arguments after the command */
    int n_pos;
    uint64_t version;        /* resume/fork/export --version; 0: none (the head) */
    const char *api_key;     /* --api-key, else $HYLA_API_KEY (hyla_cli_main); NULL: none */
    const char *tls_ca;      /* --tls-ca, else $HYLA_TLS_CA (hyla_cli_main); NULL: plain */
    const char *as_id;       /* import --as: the new session's id; NULL: the cluster chooses */
    uint64_t from;           /* read --from: the first generated index wanted (default 0) */
} hyla_cli_args;

/* Parse argv (argv[0] is the program). env_server / env_tenant: the values of $HYLA_SERVER and
 * $HYLA_TENANT (may be NULL). Returns HYLA_EXIT_OK, or HYLA_EXIT_USAGE with a one-line reason in
 * err. *a: caller frees with hyla_cli_args_free (also after a usage error). */
int hyla_cli_parse(int argc, char **argv, const char *env_server, const char *env_tenant, hyla_cli_args *a,
                   char *err, size_t errlen);
void hyla_cli_args_free(hyla_cli_args *a);

/* The exit status for a failed libhyla call (its status and hyla_client_last_code()). */
int hyla_cli_exit_code(hyla_status st, int code);

/* One line of append progress: bar != 0: a terminal bar of that many cells, else a plain line.
 * Writes at most n bytes (NUL-terminated) into buf. */
void hyla_cli_format_progress(char *buf, size_t n, const char *session, const hyla_append_progress *p, int bar);

/* The whole CLI: parse, connect, run, print. Returns the exit status. */
int hyla_cli_main(int argc, char **argv);

#ifdef __cplusplus
}
#endif
#endif
