/* test_store_tool.c — the hyla-state tool end to end: ls (one session per line, id first),
 * show, verify, export -> the portable file (loads bit-exact), import (and refusal of a damaged
 * file), rm, gc, du, and exit statuses (0 ok, 1 failure with a message, 2 usage). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "hyla_store.h"
#include "hyla_test.h"
#include "test_store_util.h"

static char tool[512], dir[300], out[65536];

/* Run the tool with args; stdout+stderr into out; returns the exit status. */
static int run(const char *args) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' --db '%s/db' %s 2>&1", tool, dir, args);
    FILE *f = popen(cmd, "r");
    if (!f) return -1;
    size_t n = fread(out, 1, sizeof out - 1, f);
    out[n] = 0;
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int main(void) {
    snprintf(tool, sizeof tool, "%s/hyla-state", hyla_test_env("HYLA_BIN_DIR", "build/bin"));
    if (access(tool, X_OK) != 0) {
        fprintf(stderr, "skip: %s not built\n", tool);
        return 77;
    }
    snprintf(dir, sizeof dir, "%s/hyla_test_tool_%d", hyla_test_env("TMPDIR", "/tmp"), (int)getpid());
    hyla_mkdirs(dir);
    char db[400], file[400];
    snprintf(db, sizeof db, "%s/db", dir);
    snprintf(file, sizeof file, "%s/alpha.hys", dir);
    hyla_snapshot *a = tsu_make(1, 1, 500, 77), *b = tsu_make(2, 2, 700, 77);
    hyla_store *st = NULL;
    CHECK_OK(hyla_store_open(db, NULL, &st));
    if (!st) return 1;
    CHECK_OK(hyla_store_put(st, "alpha", a, NULL, NULL));
    CHECK_OK(hyla_store_put(st, "beta", b, NULL, NULL));
    CHECK_OK(hyla_store_put(st, "beta", a, NULL, NULL));
    hyla_store_close(st);

    CHECK(run("ls") == 0);
    CHECK_MSG(!strncmp(out, "alpha\t", 6) && strstr(out, "\nbeta\thead=2\tversions=2\t"), "ls: %s", out);
    int lines = 0;
    for (char *p = out; *p; p++) lines += *p == '\n';
    CHECK(lines == 2);
    CHECK(run("show beta --version 1") == 0);
    CHECK_MSG(strstr(out, "version 1") && strstr(out, "partition") && strstr(out, "conv_q") &&
                  strstr(out, "model_fingerprint 000000000000004d"),
              "show: %s", out);
    CHECK(run("verify") == 0 && strstr(out, "ok: 2 sessions"));
    CHECK(run("verify alpha") == 0);
    CHECK_MSG(run("snapshots beta") == 0 && !strncmp(out, "1\tposition=", 11) && strstr(out, "\n2*\tposition=") &&
                  strstr(out, "\ttime=20") && strstr(out, "\twritten="),
              "snapshots: %s", out);
    CHECK(run("snapshots nobody") == 1 && strstr(out, "nobody"));
    CHECK(run("verify nobody") == 1 && strstr(out, "nobody"));
    char args[1024];
    snprintf(args, sizeof args, "export alpha '%s'", file);
    CHECK_MSG(run(args) == 0, "export: %s", out);
    hyla_snapshot *t = NULL;
    CHECK_OK(hyla_snapshot_load_file(file, &t));
    CHECK(t && hyla_snapshot_equal(a, t));
    hyla_snapshot_destroy(t);
    snprintf(args, sizeof args, "import '%s' --session gamma", file);
    CHECK_MSG(run(args) == 0 && strstr(out, "session gamma version 1"), "import: %s", out);
    snprintf(args, sizeof args, "import '%s'", file); /* id from the file name */
    CHECK_MSG(run(args) == 0 && strstr(out, "session alpha version 2"), "import: %s", out);
    /* a damaged file is refused, naming the place */
    FILE *f = fopen(file, "r+b");
    CHECK(f != NULL);
    if (f) {
        fseek(f, -200, SEEK_END);
        int c = fgetc(f);
        fseek(f, -200, SEEK_END);
        fputc(c ^ 0x20, f);
        fclose(f);
    }
    snprintf(args, sizeof args, "import '%s' --session delta", file);
    CHECK_MSG(run(args) == 1 && strstr(out, "refusing") && strstr(out, "layer 2 part v"), "damaged import: %s", out);
    CHECK(run("rm gamma") == 0);
    CHECK(run("rm gamma") == 1 && strstr(out, "gamma"));
    CHECK(run("ls") == 0 && !strstr(out, "gamma") && !strstr(out, "delta"));
    CHECK(run("gc") == 0 && strstr(out, "gc: deleted"));
    CHECK(run("du") == 0 && strstr(out, "sessions 2") && strstr(out, "disk_free_bytes") && strstr(out, "full 0"));
    CHECK(run("verify") == 0);
    CHECK(run("frobnicate") == 2);
    CHECK(run("show") == 2);
    /* numbers that are not numbers in range: exit 2 naming the option (they were read as 0) */
    CHECK_MSG(run("show beta --version abc") == 2 && strstr(out, "--version must be"), "--version abc: %s", out);
    CHECK_MSG(run("export beta /dev/null --zstd-level 99") == 2 && strstr(out, "--zstd-level must be"), "%s", out);
    CHECK_MSG(run("export beta /dev/null --chunk-kib 0") == 2 && strstr(out, "--chunk-kib must be"), "%s", out);
    CHECK_MSG(run("ls --threads -1") == 2 && strstr(out, "--threads must be"), "%s", out);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' ls >/dev/null 2>&1", tool);
    int s = system(cmd);
    CHECK(WIFEXITED(s) && WEXITSTATUS(s) == 2);
    snprintf(cmd, sizeof cmd, "'%s' --help | grep -q 'export SESSION FILE'", tool);
    CHECK(system(cmd) == 0);
    /* a missing store is an error, not a new empty store */
    snprintf(cmd, sizeof cmd, "'%s' --db '%s/nowhere' ls >/dev/null 2>&1", tool, dir);
    s = system(cmd);
    CHECK(WIFEXITED(s) && WEXITSTATUS(s) == 1);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    hyla_snapshot_destroy(a);
    hyla_snapshot_destroy(b);
    return hyla_test_done("test_store_tool");
}
