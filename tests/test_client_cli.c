/* test_client_cli.c — the `hyla` CLI as users run it: build/bin/hyla as a subprocess against the
 * in-process fake server (test_client_fake.c) on loopback. Checks usage errors and --help,
 * the documented exit statuses, the scripting contract (create/fork print the id alone; generate
 * prints only the text; progress and statistics on stderr), the terminal progress bar (stderr on
 * a pty), a closed port, and an UNAVAILABLE mid-generate followed by a continuing generate.
 *
 * `test_client_cli python` (ctest test_client_python) instead runs client/python/
 * test_hyla_client.py and example.py against the fake; exit 77 (skipped) without a python3
 * that imports grpc and grpc_tools. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "hyla_cli.h"
#include "hyla_test.h"
#include "test_client_fake.h"

extern char **environ;

static fake_server *F;
static char ADDR[64];
static char HYLA[1024];
static char TMP[256];

#define OUTCAP (256 << 10)

typedef struct {
    int rc;
    char *out; /* stdout, NUL-terminated */
    char *err; /* stderr (or what the pty saw) */
} result;

static void result_free(result *r) {
    free(r->out);
    free(r->err);
    memset(r, 0, sizeof *r);
}

static char *slurp_fd(int fd) {
    char *b = calloc(OUTCAP + 1, 1);
    HYLA_ASSERT(b);
    size_t n = 0;
    lseek(fd, 0, SEEK_SET);
    for (;;) {
        ssize_t k = read(fd, b + n, OUTCAP - n);
        if (k <= 0)
            break;
        n += (size_t)k;
    }
    b[n] = 0;
    return b;
}

/* Run argv (argv[0] a path) with stdin from in_path (NULL: /dev/null), stdout and stderr
 * captured (stderr on a pty when pty != 0). env: extra "K=V" entries (NULL-terminated, may be
 * NULL); HYLA_SERVER and HYLA_TENANT are removed from the inherited environment. */
static void run_argv(result *r, const char *in_path, int pty, const char *const *env, char *const argv[]) {
    memset(r, 0, sizeof *r);
    char p1[300], p2[300];
    snprintf(p1, sizeof p1, "%s/out.XXXXXX", TMP);
    snprintf(p2, sizeof p2, "%s/err.XXXXXX", TMP);
    int fo = mkstemp(p1), fe = mkstemp(p2);
    HYLA_ASSERT(fo >= 0 && fe >= 0);
    unlink(p1);
    unlink(p2);
    int master = -1, slave = -1;
    if (pty) {
        master = posix_openpt(O_RDWR | O_NOCTTY);
        HYLA_ASSERT(master >= 0 && grantpt(master) == 0 && unlockpt(master) == 0);
        slave = open(ptsname(master), O_RDWR | O_NOCTTY);
        HYLA_ASSERT(slave >= 0);
    }
    /* environment */
    size_t n_env = 0;
    for (char **e = environ; *e; e++)
        n_env++;
    for (const char *const *e = env; e && *e; e++)
        n_env++;
    char **envp = calloc(n_env + 1, sizeof *envp);
    size_t k = 0;
    for (char **e = environ; *e; e++)
        if (strncmp(*e, "HYLA_SERVER=", 12) != 0 && strncmp(*e, "HYLA_TENANT=", 12) != 0)
            envp[k++] = *e;
    for (const char *const *e = env; e && *e; e++)
        envp[k++] = (char *)*e;
    envp[k] = NULL;

    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    HYLA_ASSERT(pid >= 0);
    if (pid == 0) {
        int in = open(in_path ? in_path : "/dev/null", O_RDONLY);
        if (in < 0)
            _exit(126);
        dup2(in, 0);
        dup2(fo, 1);
        dup2(pty ? slave : fe, 2);
        execve(argv[0], argv, envp);
        _exit(127);
    }
    free(envp);
    if (pty) {
        close(slave);
        char *b = calloc(OUTCAP + 1, 1);
        size_t n = 0;
        int status = 0, done = 0;
        for (;;) {
            struct pollfd pfd = {master, POLLIN, 0};
            int pr = poll(&pfd, 1, 50);
            if (pr > 0) {
                ssize_t got = read(master, b + n, OUTCAP - n);
                if (got > 0) {
                    n += (size_t)got;
                    continue;
                }
                if (done)
                    break; /* EIO: the slave is closed and drained */
            }
            if (!done && waitpid(pid, &status, WNOHANG) == pid)
                done = 1;
            else if (done && pr == 0)
                break;
        }
        b[n] = 0;
        r->err = b;
        close(master);
        r->rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    } else {
        int status = 0;
        waitpid(pid, &status, 0);
        r->rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        r->err = slurp_fd(fe);
    }
    r->out = slurp_fd(fo);
    close(fo);
    close(fe);
}

/* hyla ARGS... (NULL-terminated) */
static void hyla(result *r, const char *in_path, int pty, const char *const *env, ...) {
    char *argv[64];
    int n = 0;
    argv[n++] = HYLA;
    va_list ap;
    va_start(ap, env);
    const char *a;
    while ((a = va_arg(ap, const char *)) != NULL) {
        HYLA_ASSERT(n < 63);
        argv[n++] = (char *)a;
    }
    va_end(ap);
    argv[n] = NULL;
    run_argv(r, in_path, pty, env, argv);
}

#define S "--server", ADDR

#define CHECK_RUN(r, want_rc)                                                                               \
    CHECK_MSG((r).rc == (want_rc), "exit %d, want %d\n  stdout: %s\n  stderr: %s", (r).rc, (want_rc), (r).out, \
              (r).err)
#define CHECK_HAS(str, sub) CHECK_MSG(strstr((str), (sub)) != NULL, "'%s' lacks '%s'", (str), (sub))

static void write_file(const char *path, const char *data, size_t len) {
    FILE *f = fopen(path, "wb");
    HYLA_ASSERT(f);
    fwrite(data, 1, len, f);
    fclose(f);
}

static int is_session_line(const char *out) {
    /* "s-" + 16 hex + "\n" and nothing else */
    if (strlen(out) != 19 || strncmp(out, "s-", 2) != 0 || out[18] != '\n')
        return 0;
    for (int i = 2; i < 18; i++)
        if (!strchr("0123456789abcdef", out[i]))
            return 0;
    return 1;
}

/* create a session for tenant (NULL: none) with extra create options; returns its id (static). */
static const char *create(const char *tenant, const char *o1, const char *o2) {
    static char id[32];
    result r;
    if (tenant)
        hyla(&r, NULL, 0, NULL, S, "--tenant", tenant, "create", o1, o2, NULL);
    else
        hyla(&r, NULL, 0, NULL, S, "create", o1, o2, NULL);
    CHECK_RUN(r, 0);
    CHECK_MSG(is_session_line(r.out), "create printed '%s'", r.out);
    snprintf(id, sizeof id, "%.18s", r.out);
    result_free(&r);
    return id;
}

/* ---------------------------------------------------------------------------------------- */

static void test_parser(void) {
    /* the parser itself, without processes */
    char *argv[] = {"hyla", "generate", "s-1", "-n", "16", "--stop", "a", "--stop=bb", "--stop-id", "3",
                    "--temperature=0.5", "--seed", "0x10", "-q", NULL};
    hyla_cli_args a;
    char err[256];
    CHECK(hyla_cli_parse(14, argv, "h:1", "tt", &a, err, sizeof err) == HYLA_EXIT_OK);
    CHECK(a.cmd == HYLA_CMD_GENERATE && a.n_pos == 1 && strcmp(a.pos[0], "s-1") == 0);
    CHECK(a.has_max_tokens && a.max_tokens == 16 && a.n_stop == 2 && strcmp(a.stop[1], "bb") == 0);
    CHECK(a.n_stop_ids == 1 && a.stop_ids[0] == 3 && a.has_temperature && a.temperature == 0.5f);
    CHECK(a.has_seed && a.seed == 16 && a.quiet && strcmp(a.server, "h:1") == 0 && strcmp(a.tenant, "tt") == 0);
    hyla_cli_args_free(&a);

    char *argv2[] = {"hyla", "--server", "x:1", "append", "--", "s-1", "-", NULL};
    CHECK(hyla_cli_parse(7, argv2, NULL, NULL, &a, err, sizeof err) == HYLA_EXIT_OK);
    CHECK(a.cmd == HYLA_CMD_APPEND && a.n_pos == 2 && strcmp(a.pos[1], "-") == 0 && a.tenant == NULL);
    hyla_cli_args_free(&a);

    char *argv3[] = {"hyla", "pause", "--evict", "--help", "--bogus", NULL};
    CHECK(hyla_cli_parse(5, argv3, NULL, NULL, &a, err, sizeof err) == HYLA_EXIT_OK);
    CHECK(a.help && a.help_cmd == HYLA_CMD_PAUSE);
    hyla_cli_args_free(&a);

    char *argv4[] = {"hyla", "-n5", "generate", "s", NULL};
    CHECK(hyla_cli_parse(4, argv4, "h:1", NULL, &a, err, sizeof err) == HYLA_EXIT_OK && a.max_tokens == 5);
    hyla_cli_args_free(&a);

    char *argv5[] = {"hyla", "resume", "s", "--on", NULL};
    CHECK(hyla_cli_parse(4, argv5, "h:1", NULL, &a, err, sizeof err) == HYLA_EXIT_USAGE);
    CHECK_HAS(err, "--on needs a value");
    hyla_cli_args_free(&a);

    CHECK(hyla_cli_exit_code(HYLA_OK, HYLA_CODE_OK) == 0);
    CHECK(hyla_cli_exit_code(HYLA_ERR_NOT_FOUND, HYLA_CODE_NOT_FOUND) == HYLA_EXIT_NOT_FOUND);
    CHECK(hyla_cli_exit_code(HYLA_ERR_UNAVAILABLE, HYLA_CODE_DEADLINE_EXCEEDED) == HYLA_EXIT_UNAVAILABLE);
    CHECK(hyla_cli_exit_code(HYLA_ERR_PERMISSION, HYLA_CODE_PERMISSION_DENIED) == HYLA_EXIT_PERMISSION);
    CHECK(hyla_cli_exit_code(HYLA_ERR_RESOURCE, HYLA_CODE_RESOURCE_EXHAUSTED) == HYLA_EXIT_REJECTED);
    CHECK(hyla_cli_exit_code(HYLA_ERR_IO, HYLA_CODE_LOCAL) == HYLA_EXIT_ERROR);
    CHECK(hyla_cli_exit_code(HYLA_ERR_CORRUPT, HYLA_CODE_DATA_LOSS) == HYLA_EXIT_ERROR);

    /* progress lines */
    hyla_append_progress p;
    memset(&p, 0, sizeof p);
    p.tokens_ingested = 250;
    p.tokens_received = 300;
    p.total_tokens = 1000;
    p.tokens_per_second = 50;
    char line[256];
    hyla_cli_format_progress(line, sizeof line, "s-1", &p, 0);
    CHECK_MSG(strcmp(line, "append s-1: 250/1000 tokens (25.0%), 50 tokens/s, ETA 15s") == 0, "'%s'", line);
    hyla_cli_format_progress(line, sizeof line, "s-1", &p, 20);
    CHECK_MSG(strcmp(line, "[#####...............]  25.0% 250/1000 tok  50 tok/s  ETA 15s") == 0, "'%s'", line);
    p.total_tokens = 0; /* estimated from the bytes: 300 tokens for 600 of 1200 bytes -> ~600 */
    p.total_bytes = 1200;
    p.bytes_sent = 600;
    hyla_cli_format_progress(line, sizeof line, "s-1", &p, 0);
    CHECK_MSG(strcmp(line, "append s-1: 250/~600 tokens (41.7%), 50 tokens/s, ETA 7s") == 0, "'%s'", line);
    p.total_bytes = 0; /* unknown total: no percent, no ETA */
    hyla_cli_format_progress(line, sizeof line, "s-1", &p, 0);
    CHECK_MSG(strcmp(line, "append s-1: 250 tokens, 50 tokens/s") == 0, "'%s'", line);
    p.done = 1;
    p.tokens_ingested = 700;
    hyla_cli_format_progress(line, sizeof line, "s-1", &p, 10);
    CHECK_MSG(strcmp(line, "[##########] 100.0% 700/700 tok  50 tok/s") == 0, "'%s'", line);
}

static void test_usage(void) {
    result r;
    hyla(&r, NULL, 0, NULL, NULL);
    CHECK_RUN(r, 2);
    CHECK_HAS(r.err, "usage: hyla");
    CHECK(r.out[0] == 0);
    result_free(&r);

    hyla(&r, NULL, 0, NULL, "--help", NULL);
    CHECK_RUN(r, 0);
    CHECK_HAS(r.out, "Exit status");
    CHECK_HAS(r.out, "4  unavailable");
    result_free(&r);

    static const char *cmds[] = {"create", "append", "generate", "pause",  "resume", "migrate",
                                 "fork",   "rm",     "ls",       "show",   "status", "drain"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        char want[64];
        snprintf(want, sizeof want, "usage: hyla %s", cmds[i]);
        hyla(&r, NULL, 0, NULL, cmds[i], "--help", NULL);
        CHECK_RUN(r, 0);
        CHECK_MSG(strncmp(r.out, want, strlen(want)) == 0, "%s --help: '%.60s'", cmds[i], r.out);
        result_free(&r);
        hyla(&r, NULL, 0, NULL, "help", cmds[i], NULL);
        CHECK_RUN(r, 0);
        CHECK_MSG(strncmp(r.out, want, strlen(want)) == 0, "help %s: '%.60s'", cmds[i], r.out);
        result_free(&r);
    }

    static const struct {
        const char *args[8];
        const char *msg;
    } bad[] = {
        {{"frob"}, "unknown command 'frob'"},
        {{"help", "frob"}, "unknown command 'frob'"},
        {{"ls", "--frob"}, "unknown option '--frob'"},
        {{"generate", "s-1"}, "generate needs -n N"},
        {{"generate", "s-1", "-n", "0"}, "-n: '0' is not a token count"},
        {{"generate", "s-1", "-n", "x"}, "-n: 'x' is not a token count"},
        {{"generate", "s-1", "-n", "3", "--stop", ""}, "the stop sequence is empty"},
        {{"create", "--top-p", "2"}, "--top-p: '2' is not a number in [0, 1]"},
        {{"create", "--temperature", "-1"}, "--temperature: '-1' is not a number >= 0"},
        {{"create", "--seed", "-5"}, "--seed: '-5'"},
        {{"create", "--top-k", "1.5"}, "--top-k"},
        {{"pause"}, "pause expects SESSION, got 0"},
        {{"pause", "a", "b"}, "pause expects SESSION, got 2"},
        {{"append", "s-1"}, "append expects SESSION FILE|-"},
        {{"ls", "extra"}, "ls takes no arguments"},
        {{"pause", "s-1", "--to", "w-1"}, "option --to does not apply"},
        {{"ls", "--all", "--model", "m"}, "cannot be combined"},
        {{"--timeout", "0", "ls"}, "--timeout: '0'"},
        {{"--evict"}, "no command given"},
        {{"show", ""}, "argument 1 is empty"},
        {{"--tenant", "a b", "ls"}, "tenant"},
        {{"status", "--quiet=1"}, "--quiet takes no value"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *argv[16];
        int n = 0;
        argv[n++] = HYLA;
        argv[n++] = "--server";
        argv[n++] = ADDR;
        for (int k = 0; bad[i].args[k]; k++)
            argv[n++] = (char *)bad[i].args[k];
        argv[n] = NULL;
        run_argv(&r, NULL, 0, NULL, argv);
        CHECK_MSG(r.rc == 2 && strstr(r.err, bad[i].msg) && r.out[0] == 0, "case %zu (%s): exit %d, stderr '%s'", i,
                  bad[i].msg, r.rc, r.err);
        result_free(&r);
    }
    /* no server anywhere; then the environment supplies it */
    hyla(&r, NULL, 0, NULL, "ls", NULL);
    CHECK_RUN(r, 2);
    CHECK_HAS(r.err, "HYLA_SERVER");
    result_free(&r);
    char env_server[128];
    snprintf(env_server, sizeof env_server, "HYLA_SERVER=%s", ADDR);
    const char *env[] = {env_server, "HYLA_TENANT=env-tenant", NULL};
    hyla(&r, NULL, 0, env, "create", NULL);
    CHECK_RUN(r, 0);
    CHECK(is_session_line(r.out));
    char tenant[64] = "";
    char id[32];
    snprintf(id, sizeof id, "%.18s", r.out);
    CHECK(fake_session(F, id, NULL, tenant, sizeof tenant) && strcmp(tenant, "env-tenant") == 0);
    result_free(&r);
}

static void test_closed_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    HYLA_ASSERT(bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    close(fd);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", ntohs(a.sin_port));
    result r;
    hyla(&r, NULL, 0, NULL, "--server", addr, "create", NULL);
    CHECK_RUN(r, 4);
    CHECK(r.out[0] == 0);
    CHECK_HAS(r.err, "UNAVAILABLE");
    CHECK_HAS(r.err, addr);
    result_free(&r);
    hyla(&r, NULL, 0, NULL, "--server", addr, "generate", "s-0000000000000001", "-n", "3", NULL);
    CHECK_RUN(r, 4);
    result_free(&r);
}

static void test_session_commands(void) {
    result r;
    char path[300], tpath[300], want[128];
    snprintf(path, sizeof path, "%s/doc.txt", TMP);
    snprintf(tpath, sizeof tpath, "%s/ids.txt", TMP);
    char doc[3000];
    for (int i = 0; i < 3000; i++)
        doc[i] = (char)('a' + i % 26);
    write_file(path, doc, sizeof doc);
    write_file(tpath, "1 2 3,4\n5\n", 10);

    char id[32];
    snprintf(id, sizeof id, "%s", create("cli", "--seed", "4"));

    /* create: unknown model */
    hyla(&r, NULL, 0, NULL, S, "create", "--model", "nope", NULL);
    CHECK_RUN(r, 3);
    CHECK_HAS(r.err, "NOT_FOUND: model 'nope' is not served");
    CHECK(r.out[0] == 0);
    result_free(&r);

    /* append: a file, stdin, token ids; nothing on stdout */
    hyla(&r, NULL, 0, NULL, S, "--tenant", "cli", "append", id, path, NULL);
    CHECK_RUN(r, 0);
    CHECK(r.out[0] == 0);
    CHECK_HAS(r.err, "appended 3000 tokens");
    result_free(&r);
    fake_record rec;
    fake_get_record(F, &rec);
    CHECK(rec.append_bytes_hint == 3000 && strcmp(rec.tenant, "cli") == 0);
    hyla(&r, path, 0, NULL, S, "--tenant", "cli", "append", id, "-", "--bos", NULL);
    CHECK_RUN(r, 0);
    result_free(&r);
    fake_get_record(F, &rec);
    CHECK(rec.append_add_bos == 1);
    hyla(&r, NULL, 0, NULL, S, "--tenant", "cli", "-q", "append", id, "--tokens", tpath, NULL);
    CHECK_RUN(r, 0);
    CHECK(r.err[0] == 0 && r.out[0] == 0);
    result_free(&r);
    uint64_t pos = 0;
    CHECK(fake_session(F, id, &pos, NULL, 0) && pos == 6005);

    hyla(&r, NULL, 0, NULL, S, "--tenant", "cli", "append", id, "/nonexistent/doc", NULL);
    CHECK_RUN(r, 1);
    CHECK_HAS(r.err, "cannot open /nonexistent/doc");
    result_free(&r);
    hyla(&r, NULL, 0, NULL, S, "--tenant", "cli", "append", id, "--tokens", path, NULL);
    CHECK_RUN(r, 1);
    CHECK_HAS(r.err, "is not a token id");
    result_free(&r);
    hyla(&r, NULL, 0, NULL, S, "--tenant", "cli", "append", "s-00000000000000ff", path, NULL);
    CHECK_RUN(r, 3);
    result_free(&r);
    hyla(&r, NULL, 0, NULL, S, "--tenant", "intruder", "append", id, path, NULL);
    CHECK_RUN(r, 5);
    CHECK_HAS(r.err, "PERMISSION_DENIED");
    result_free(&r);

    /* append progress on a terminal: a bar redrawn with \r, ending at 100% */
    hyla(&r, NULL, 1, NULL, S, "--tenant", "cli", "append", id, path, NULL);
    CHECK_RUN(r, 0);
    CHECK_HAS(r.err, "\r[");
    CHECK_HAS(r.err, "100.0%");
    CHECK_HAS(r.err, "appended 3000 tokens");
    result_free(&r);
    pos += 3000;

    /* generate: only the text on stdout (no newline: stdout is not a terminal) */
    hyla(&r, NULL, 0, NULL, S, "--tenant", "cli", "generate", id, "-n", "12", NULL);
    CHECK_RUN(r, 0);
    fake_expected_text(pos, 4, 12, want);
    CHECK_MSG(strcmp(r.out, want) == 0, "stdout '%s' want '%s'", r.out, want);
    CHECK_HAS(r.err, "12 tokens");
    CHECK_HAS(r.err, "finish: length");
    result_free(&r);
    pos += 12;

    /* --ids: token ids on one line */
    hyla(&r, NULL, 0, NULL, S, "--tenant", "cli", "-q", "generate", id, "-n", "3", "--ids", NULL);
    CHECK_RUN(r, 0);
    fake_expected_text(pos, 4, 3, want);
    char ids[64];
    snprintf(ids, sizeof ids, "%d %d %d\n", want[0], want[1], want[2]);
    CHECK_MSG(strcmp(r.out, ids) == 0, "stdout '%s' want '%s'", r.out, ids);
    CHECK(r.err[0] == 0);
    result_free(&r);
    pos += 3;

    /* --stop: the text up to the first occurrence, not the match */
    fake_expected_text(pos, 4, 40, want);
    char stop[2] = {want[5], 0};
    size_t k = strcspn(want, stop);
    hyla(&r, NULL, 0, NULL, S, "--tenant", "cli", "generate", id, "-n", "40", "--stop", stop, NULL);
    CHECK_RUN(r, 0);
    CHECK_MSG(strlen(r.out) == k && strncmp(r.out, want, k) == 0, "stdout '%s' want %zu of '%s'", r.out, k, want);
    CHECK_HAS(r.err, "finish: stop");
    result_free(&r);
    pos += k + 1;

    /* sampling options are merged into the session's current sampling; --seed re-seeds */
    hyla(&r, NULL, 0, NULL, S, "--tenant", "cli", "generate", id, "-n", "2", "--top-k", "9", NULL);
    CHECK_RUN(r, 0);
    result_free(&r);
    hyla(&r, NULL, 0, NULL, S, "--tenant", "cli", "generate", id, "-n", "2", "--temperature", "0.5", "--seed", "7",
         NULL);
    CHECK_RUN(r, 0);
    fake_expected_text(pos + 2, 7, 2, want);
    CHECK_MSG(strcmp(r.out, want) == 0, "reseeded '%s' want '%s'", r.out, want);
    result_free(&r);
    fake_get_record(F, &rec);
    CHECK(rec.gen_has_sampling && rec.gen_temperature == 0.5f && rec.gen_top_k == 9 && rec.gen_reseed &&
          rec.gen_seed == 7);
    pos += 4;

    /* the worker dies after 4 tokens: exit 4, the 4 tokens on stdout, the count on stderr;
     * generate again continues after them */
    fake_fail_generate_after(F, 4);
    hyla(&r, NULL, 0, NULL, S, "--tenant", "cli", "generate", id, "-n", "10", NULL);
    CHECK_RUN(r, 4);
    fake_expected_text(pos, 7, 4, want);
    CHECK_MSG(strcmp(r.out, want) == 0, "stdout '%s' want '%s'", r.out, want);
    CHECK_HAS(r.err, "UNAVAILABLE");
    CHECK_HAS(r.err, "4 token(s) were delivered before the failure");
    CHECK_HAS(r.err, "call generate again");
    result_free(&r);
    hyla(&r, NULL, 0, NULL, S, "--tenant", "cli", "generate", id, "-n", "6", NULL);
    CHECK_RUN(r, 0);
    fake_expected_text(pos + 4, 7, 6, want);
    CHECK_MSG(strcmp(r.out, want) == 0, "continued '%s' want '%s'", r.out, want);
    result_free(&r);

    /* generate failures: unknown session, another tenant, the server's limit */
    hyla(&r, NULL, 0, NULL, S, "--tenant", "cli", "generate", "s-00000000000000ff", "-n", "3", NULL);
    CHECK_RUN(r, 3);
    result_free(&r);
    hyla(&r, NULL, 0, NULL, S, "--tenant", "intruder", "generate", id, "-n", "3", NULL);
    CHECK_RUN(r, 5);
    result_free(&r);
    hyla(&r, NULL, 0, NULL, S, "--tenant", "cli", "generate", id, "-n", "200000", NULL);
    CHECK_RUN(r, 6);
    CHECK_HAS(r.err, "INVALID_ARGUMENT: max_tokens");
    result_free(&r);

    /* pause, resume, migrate, fork, show */
    hyla(&r, NULL, 0, NULL, S, "--tenant", "cli", "pause", id, NULL);
    CHECK_RUN(r, 0);
    CHECK_HAS(r.out, "paused: snapshot version 1 at position");
    result_free(&r);
    hyla(&r, NULL, 0, NULL, S, "--tenant", "cli", "pause", id, "--evict", NULL);
    CHECK_RUN(r, 0);
    CHECK_HAS(r.out, "snapshot version 2");
    result_free(&r);
    hyla(&r, NULL, 0, NULL, S, "--tenant", "cli", "resume", id, "--on", "w-2", NULL);
    CHECK_RUN(r, 0);
    CHECK_HAS(r.out, "resumed: active on group g-2 (workers w-2)");
    result_free(&r);
    hyla(&r, NULL, 0, NULL, S, "--tenant", "cli", "migrate", id, NULL);
    CHECK_RUN(r, 0);
    CHECK_HAS(r.out, "migrated: group g-2 -> g-1 (workers w-1)");
    result_free(&r);
    fake_get_record(F, &rec);
    CHECK(rec.migrate_to[0] == 0);
    hyla(&r, NULL, 0, NULL, S, "--tenant", "cli", "migrate", id, "--to", "w-2", NULL);
    CHECK_RUN(r, 0);
    result_free(&r);
    fake_get_record(F, &rec);
    CHECK(strcmp(rec.migrate_to, "w-2") == 0);
    hyla(&r, NULL, 0, NULL, S, "--tenant", "cli", "migrate", id, "--to", "w-9", NULL);
    CHECK_RUN(r, 3);
    result_free(&r);
    hyla(&r, NULL, 0, NULL, S, "--tenant", "cli", "fork", id, "--seed", "12", NULL);
    CHECK_RUN(r, 0);
    CHECK(is_session_line(r.out) && strncmp(r.out, id, 18) != 0);
    char fork_id[32];
    snprintf(fork_id, sizeof fork_id, "%.18s", r.out);
    result_free(&r);
    hyla(&r, NULL, 0, NULL, S, "--tenant", "cli", "show", fork_id, NULL);
    CHECK_RUN(r, 0);
    CHECK_HAS(r.out, "seed         12");
    CHECK_HAS(r.out, id); /* parent */
    result_free(&r);

    /* ls: this tenant's sessions, every page; --ids prints them alone */
    hyla(&r, NULL, 0, NULL, S, "--tenant", "cli", "ls", "--ids", NULL);
    CHECK_RUN(r, 0);
    char both[128];
    snprintf(both, sizeof both, "%s\n%s\n", strcmp(id, fork_id) < 0 ? id : fork_id,
             strcmp(id, fork_id) < 0 ? fork_id : id);
    CHECK_MSG(strcmp(r.out, both) == 0, "ls --ids '%s' want '%s'", r.out, both);
    result_free(&r);
    hyla(&r, NULL, 0, NULL, S, "--tenant", "cli", "ls", NULL);
    CHECK_RUN(r, 0);
    CHECK_HAS(r.out, "SESSION");
    CHECK_HAS(r.out, fork_id);
    CHECK_HAS(r.err, "2 session(s)");
    result_free(&r);
    hyla(&r, NULL, 0, NULL, S, "ls", "--all", NULL);
    CHECK_RUN(r, 0);
    CHECK_HAS(r.out, "TENANT");
    CHECK_HAS(r.out, "env-tenant");
    result_free(&r);

    /* cluster: status, drain */
    hyla(&r, NULL, 0, NULL, S, "status", NULL);
    CHECK_RUN(r, 0);
    CHECK_HAS(r.out, "w-1");
    CHECK_HAS(r.out, "g-2");
    CHECK_HAS(r.out, "sessions: ");
    result_free(&r);
    hyla(&r, NULL, 0, NULL, S, "drain", "w-1", "--wait", "--timeout", "5", NULL);
    CHECK_RUN(r, 0);
    CHECK_HAS(r.out, "w-1 drained:");
    result_free(&r);
    fake_get_record(F, &rec);
    CHECK(rec.drain_wait == 0); /* --wait polls DrainWorker under its own deadline (test_e2e_drain) */
    hyla(&r, NULL, 0, NULL, "drain", "--help", NULL);
    CHECK_RUN(r, 0);
    CHECK_HAS(r.out, "--timeout SEC   with --wait: give up after SEC seconds (default 600)");
    hyla(&r, NULL, 0, NULL, S, "drain", "w-9", NULL);
    CHECK_RUN(r, 3);
    result_free(&r);

    /* rm: every argument is tried; the first failure decides the exit status */
    hyla(&r, NULL, 0, NULL, S, "--tenant", "cli", "rm", "s-00000000000000ff", fork_id, NULL);
    CHECK_RUN(r, 3);
    CHECK(!fake_session(F, fork_id, NULL, NULL, 0));
    result_free(&r);
    hyla(&r, NULL, 0, NULL, S, "--tenant", "cli", "rm", id, NULL);
    CHECK_RUN(r, 0);
    CHECK_HAS(r.err, "deleted");
    result_free(&r);
    hyla(&r, NULL, 0, NULL, S, "--tenant", "cli", "show", id, NULL);
    CHECK_RUN(r, 3);
    result_free(&r);
}

/* ---------------------------------------------------------------------------------------- */

static int find_python(char *out, size_t n) {
    const char *cands[] = {getenv("HYLA_PYTHON"), "/usr/bin/python3", "/usr/local/bin/python3", NULL};
    for (int i = 0; i < 3; i++) {
        if (!cands[i] || !cands[i][0] || access(cands[i], X_OK) != 0)
            continue;
        char *argv[] = {(char *)cands[i], "-c", "import grpc, grpc_tools.protoc", NULL};
        result r;
        run_argv(&r, NULL, 0, NULL, argv);
        int ok = r.rc == 0;
        result_free(&r);
        if (ok) {
            snprintf(out, n, "%s", cands[i]);
            return 1;
        }
    }
    return 0;
}

static int python_main(void) {
    char py[512];
    if (!find_python(py, sizeof py)) {
        printf("SKIP: no python3 that can 'import grpc, grpc_tools.protoc' (Debian: apt-get install "
               "python3-grpcio python3-grpc-tools; or set HYLA_PYTHON)\n");
        return 77;
    }
    const char *src = hyla_test_env("HYLA_SOURCE_DIR", "..");
    char script[1024], example[1024];
    snprintf(script, sizeof script, "%s/client/python/test_hyla_client.py", src);
    snprintf(example, sizeof example, "%s/client/python/example.py", src);

    fake_fail_generate_after(F, 3); /* test_hyla_client.py expects its first generate to fail */
    char *argv[] = {py, script, "--server", ADDR, NULL};
    result r;
    run_argv(&r, NULL, 0, NULL, argv);
    CHECK_RUN(r, 0);
    CHECK_HAS(r.out, "test_hyla_client.py: ok");
    result_free(&r);

    char *argv2[] = {py, example, "--server", ADDR, "--tenant", "example", "-n", "8", NULL};
    run_argv(&r, NULL, 0, NULL, argv2);
    CHECK_RUN(r, 0);
    CHECK_HAS(r.err, "paused: snapshot version 1");
    CHECK_HAS(r.err, "resumed on group");
    CHECK_HAS(r.err, "RESULT session=s-");
    CHECK_MSG(strlen(r.out) == 17, "example stdout '%s'", r.out); /* 8 + 8 tokens + newline */
    result_free(&r);

    /* the example against a closed port: exit 4 and a message naming UNAVAILABLE */
    char *argv3[] = {py, example, "--server", "127.0.0.1:1", NULL};
    run_argv(&r, NULL, 0, NULL, argv3);
    CHECK_RUN(r, 4);
    CHECK_HAS(r.err, "UNAVAILABLE");
    result_free(&r);
    return hyla_test_done("test_client_python");
}

int main(int argc, char **argv) {
    const char *bin = hyla_test_env("HYLA_BIN_DIR", "bin");
    snprintf(HYLA, sizeof HYLA, "%s/hyla", bin);
    snprintf(TMP, sizeof TMP, "/tmp/hyla-test-cli.XXXXXX");
    HYLA_ASSERT(mkdtemp(TMP));
    int port = 0;
    if (fake_start(NULL, &F, &port) != HYLA_OK) {
        fprintf(stderr, "test_client_cli: cannot start the fake server: %s\n", hyla_last_error());
        return 1;
    }
    snprintf(ADDR, sizeof ADDR, "127.0.0.1:%d", port);
    int rc;
    if (argc > 1 && strcmp(argv[1], "python") == 0) {
        rc = python_main();
    } else {
        if (access(HYLA, X_OK) != 0) {
            fprintf(stderr, "test_client_cli: %s is missing (build the hyla target)\n", HYLA);
            fake_stop(F);
            return 1;
        }
        test_parser();
        test_usage();
        test_closed_port();
        test_session_commands();
        rc = hyla_test_done("test_client_cli");
    }
    fake_stop(F);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", TMP);
    if (system(cmd) != 0)
        fprintf(stderr, "test_client_cli: could not remove %s\n", TMP);
    return rc;
}
