/* test_store_crash.c — kill -9 during snapshots. A child process commits snapshots of
 * deterministic states (session s, version v -> one state) to a store and reports each
 * acknowledged commit on a pipe; the parent SIGKILLs it at random moments (HYLA_CRASH_ROUNDS,
 * default 60), reopens the store and checks that every acknowledged snapshot is still there and
 * bit-exact, that no head points at an incomplete snapshot (every version of every session
 * decodes and verifies), and that reference counts are consistent. Same seed -> same run
 * (HYLA_CRASH_SEED). */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "hyla_log.h"
#include "hyla_store.h"
#include "hyla_test.h"
#include "test_store_util.h"

#define N_SESSIONS 3
#define KEEP 2

/* Odd rounds: every put sends its chunks around the WAL and flushes (the large-put path). */
static int g_round;

static hyla_store_params params(void) {
    hyla_store_params p = hyla_store_default_params();
    p.codec.chunk_bytes = 32 << 10;
    p.codec.threads = 2;
    p.keep_versions = KEEP;
    p.write_buffer_bytes = 4 << 20;
    p.nowal_bytes = g_round % 2 ? 0 : 32u << 20;
    return p;
}

/* The state of session s at version v. KV pages are shared between versions of a session. */
static hyla_snapshot *state_of(int s, uint64_t v) {
    return tsu_make((uint64_t)s * 100000 + v, (uint64_t)s + 1, 128 + (v % 16) * 64, 0xC0FFEE);
}

static void sid_of(char *b, size_t n, int s) { snprintf(b, n, "sess-%d", s); }

static void child(const char *dir, int wfd, uint64_t seed) {
    hyla_log_set_level(HYLA_LOG_WARN);
    hyla_store_params p = params();
    hyla_store *st = NULL;
    if (hyla_store_open(dir, &p, &st) != HYLA_OK) {
        fprintf(stderr, "child: open: %s\n", hyla_last_error());
        _exit(3);
    }
    hyla_rng r;
    hyla_rng_seed(&r, seed);
    for (uint64_t op = 0;; op++) {
        int s = (int)(hyla_rng_next(&r) % N_SESSIONS);
        char sid[32];
        sid_of(sid, sizeof sid, s);
        hyla_store_session_info info;
        uint64_t head = 0;
        if (hyla_store_info(st, sid, &info) == HYLA_OK) head = info.head_version;
        uint64_t v = head + 1, got = 0;
        hyla_snapshot *snap = state_of(s, v);
        if (hyla_store_put(st, sid, snap, &got, NULL) != HYLA_OK || got != v) {
            fprintf(stderr, "child: put %s v%llu: %s\n", sid, (unsigned long long)v, hyla_last_error());
            _exit(4);
        }
        hyla_snapshot_destroy(snap);
        char line[64];
        int n = snprintf(line, sizeof line, "%d %llu\n", s, (unsigned long long)v);
        if (write(wfd, line, (size_t)n) != n) _exit(5);
        if (op % 11 == 10) hyla_store_gc(st, NULL);
    }
}

int main(int argc, char **argv) {
    /* The child runs in a fresh image (exec of this program): a fork of a process that has
     * opened RocksDB inherits its thread pools without their threads, and a write that waits
     * for a background flush would then wait for ever. */
    if (argc == 5 && strcmp(argv[1], "--child") == 0) {
        child(argv[2], atoi(argv[3]), (uint64_t)strtoull(argv[4], NULL, 10));
        return 0;
    }
    char dir[256];
    snprintf(dir, sizeof dir, "%s/hyla_test_crash_%d", hyla_test_env("TMPDIR", "/tmp"), (int)getpid());
    int rounds = atoi(hyla_test_env("HYLA_CRASH_ROUNDS", "60"));
    uint64_t seed = (uint64_t)atoll(hyla_test_env("HYLA_CRASH_SEED", "12345"));
    hyla_rng r;
    hyla_rng_seed(&r, seed);
    uint64_t acked[N_SESSIONS] = {0};
    int total_acks = 0, kills = 0, mid = 0;
    double t0 = hyla_now();
    for (int round = 0; round < rounds; round++) {
        g_round = round;
        int fds[2];
        if (pipe(fds) != 0) return 1;
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            close(fds[0]);
            char fd_s[16], seed_s[32];
            snprintf(fd_s, sizeof fd_s, "%d", fds[1]);
            snprintf(seed_s, sizeof seed_s, "%llu", (unsigned long long)(seed * 1000 + (uint64_t)round));
            execl("/proc/self/exe", argv[0], "--child", dir, fd_s, seed_s, (char *)NULL);
            _exit(6);
        }
        close(fds[1]);
        /* Even rounds kill after a random 5..200 ms from the fork: before open, during recovery,
         * puts, commits or gc. Odd rounds first wait for the child's first acknowledged commit,
         * so that kills land among commits even on a loaded machine where opening the store
         * alone can take longer than 200 ms. */
        char buf[65536];
        size_t len = 0;
        ssize_t n;
        if (round % 2 == 1) {
            double t_wait = hyla_now();
            while (!memchr(buf, '\n', len) && hyla_now() - t_wait < 30.0) {
                struct pollfd pfd = {fds[0], POLLIN, 0};
                if (poll(&pfd, 1, 100) > 0) {
                    n = read(fds[0], buf + len, sizeof buf - 1 - len);
                    if (n <= 0) break;
                    len += (size_t)n;
                }
            }
        }
        long delay_us = 5000 + (long)(hyla_rng_next(&r) % 195000);
        struct timespec ts = {0, delay_us * 1000};
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        int status = 0;
        waitpid(pid, &status, 0);
        if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) kills++;
        else CHECK_MSG(0, "round %d: child exited on its own (status %d)", round, status);
        /* every line the child wrote before it died is in the pipe */
        while ((n = read(fds[0], buf + len, sizeof buf - 1 - len)) > 0) len += (size_t)n;
        close(fds[0]);
        buf[len] = 0;
        int acks = 0;
        for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
            int s;
            unsigned long long v;
            if (sscanf(line, "%d %llu", &s, &v) == 2 && s >= 0 && s < N_SESSIONS) {
                CHECK_MSG(v == acked[s] + 1, "ack %d %llu after %llu", s, v,
                          (unsigned long long)acked[s]);
                acked[s] = v;
                acks++;
            }
        }
        total_acks += acks;
        if (acks > 0) mid++;
        /* reopen and check */
        hyla_store_params p = params();
        hyla_store *st = NULL;
        CHECK_OK(hyla_store_open(dir, &p, &st));
        if (!st) break;
        for (int s = 0; s < N_SESSIONS; s++) {
            char sid[32];
            sid_of(sid, sizeof sid, s);
            hyla_store_session_info info;
            hyla_status is = hyla_store_info(st, sid, &info);
            if (acked[s] == 0 && is == HYLA_ERR_NOT_FOUND) continue;
            CHECK_MSG(is == HYLA_OK, "round %d: session %s lost (acked v%llu): %s", round, sid,
                      (unsigned long long)acked[s], hyla_last_error());
            if (is != HYLA_OK) continue;
            /* the head is the last acknowledged version or the one after it (committed, not yet acked) */
            CHECK_MSG(info.head_version == acked[s] || info.head_version == acked[s] + 1,
                      "round %d: %s head v%llu, acked v%llu", round, sid, (unsigned long long)info.head_version,
                      (unsigned long long)acked[s]);
            if (info.head_version > acked[s]) acked[s] = info.head_version; /* it will be the base from now on */
            uint64_t *vers = NULL;
            size_t nv = 0;
            CHECK_OK(hyla_store_versions(st, sid, &vers, &nv));
            int has_head = 0;
            for (size_t i = 0; i < nv; i++) {
                hyla_snapshot *got = NULL, *want = state_of(s, vers[i]);
                hyla_status gs = hyla_store_get(st, sid, vers[i], 0xC0FFEE, &got, NULL);
                CHECK_MSG(gs == HYLA_OK && hyla_snapshot_equal(got, want), "round %d: %s v%llu: %s", round, sid,
                          (unsigned long long)vers[i], gs == HYLA_OK ? "differs" : hyla_last_error());
                if (vers[i] == info.head_version) has_head = 1;
                hyla_snapshot_destroy(got);
                hyla_snapshot_destroy(want);
            }
            CHECK_MSG(has_head && nv >= 1 && nv <= KEEP, "round %d: %s has %zu versions", round, sid, nv);
            free(vers);
        }
        uint64_t problems = 0;
        hyla_status vs = hyla_store_verify(st, NULL, NULL, NULL, &problems);
        CHECK_MSG(vs == HYLA_OK && problems == 0, "round %d: verify: %s", round, hyla_last_error());
        hyla_store_close(st);
        if (hyla_test_failures) break;
    }
    printf("crash test: %d rounds, %d SIGKILLs, %d rounds with commits, %d acknowledged commits, %.1f s\n", rounds,
           kills, mid, total_acks, hyla_now() - t0);
    CHECK(kills >= 50 || rounds < 50);
    CHECK(mid >= rounds / 2); /* the kills landed among commits, not only before the first */
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return hyla_test_done("test_store_crash");
}
