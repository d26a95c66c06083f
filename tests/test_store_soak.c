/* test_store_soak.c — space comes back while the store runs. Four clients each create a
 * session, put a few growing versions (incremental KV), and delete it, over and over, for
 * HYLA_SOAK_SECONDS (default 20); the disk use (store directory, reserve excluded) and the
 * process's resident memory are sampled every half second and printed. Asserted: the disk use
 * of the second half of the load stays within a bound of the first half's (deleted sessions'
 * bytes come back during the load, not at a restart), and a few seconds after the last delete
 * the store is back to within a small bound of an empty store; memory does not keep growing. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hyla_log.h"
#include "hyla_store.h"
#include "hyla_test.h"
#include "test_store_util.h"

#define CLIENTS 4
#define VERSIONS 3

static hyla_store *g_st;
static atomic_int g_stop;
static atomic_long g_puts, g_deletes, g_errors;

static void *client(void *arg) {
    int c = (int)(intptr_t)arg;
    for (uint64_t round = 0; !atomic_load(&g_stop); round++) {
        char sid[64];
        snprintf(sid, sizeof sid, "soak-%d-%llu", c, (unsigned long long)round);
        uint64_t seed = (uint64_t)c * 1000003u + round;
        for (int v = 0; v < VERSIONS; v++) {
            hyla_snapshot *s = tsu_make(seed * 16 + (uint64_t)v, seed, 1024 + 512 * (uint64_t)v, 5);
            if (hyla_store_put(g_st, sid, s, NULL, NULL) == HYLA_OK) atomic_fetch_add(&g_puts, 1);
            else {
                fprintf(stderr, "put %s: %s\n", sid, hyla_last_error());
                atomic_fetch_add(&g_errors, 1);
            }
            hyla_snapshot_destroy(s);
        }
        if (hyla_store_delete(g_st, sid) == HYLA_OK) atomic_fetch_add(&g_deletes, 1);
        else {
            fprintf(stderr, "delete %s: %s\n", sid, hyla_last_error());
            atomic_fetch_add(&g_errors, 1);
        }
    }
    return NULL;
}

static double rss_mib(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, res = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &res) != 2) res = 0;
        fclose(f);
    }
    return (double)res * (double)sysconf(_SC_PAGESIZE) / 1048576.0;
}

static double disk_mib(void) {
    hyla_store_usage_info u;
    if (hyla_store_usage(g_st, &u) != HYLA_OK) return -1;
    return (double)(u.disk_bytes - u.reserve_bytes) / 1048576.0;
}

int main(void) {
    hyla_log_set_level(HYLA_LOG_WARN);
    double seconds = atof(hyla_test_env("HYLA_SOAK_SECONDS", "20"));
    char dir[256];
    snprintf(dir, sizeof dir, "%s/hyla_test_soak_%d", hyla_test_env("TMPDIR", "/tmp"), (int)getpid());
    hyla_store_params p = hyla_store_default_params();
    p.codec.chunk_bytes = 256 << 10;
    p.codec.threads = 2;
    p.write_buffer_bytes = 8 << 20;
    p.reserve_bytes = 8 << 20;
    p.reclaim_after_ms = (uint32_t)atoi(hyla_test_env("HYLA_SOAK_RECLAIM_MS", "1000")); /* 0: see it fail */
    CHECK_OK(hyla_store_open(dir, &p, &g_st));
    if (!g_st) return 1;
    double empty = disk_mib();
    pthread_t th[CLIENTS];
    for (int c = 0; c < CLIENTS; c++) pthread_create(&th[c], NULL, client, (void *)(intptr_t)c);
    enum { MAXS = 4096 };
    static double t_s[MAXS], disk_s[MAXS], rss_s[MAXS];
    int n = 0;
    double t0 = hyla_now();
    printf("soak: %d clients, %.0f s; t_s disk_mib rss_mib puts deletes\n", CLIENTS, seconds);
    while (hyla_now() - t0 < seconds && n < MAXS) {
        usleep(500000);
        t_s[n] = hyla_now() - t0;
        disk_s[n] = disk_mib();
        rss_s[n] = rss_mib();
        printf("soak: %6.1f %8.1f %8.1f %6ld %6ld\n", t_s[n], disk_s[n], rss_s[n], atomic_load(&g_puts),
               atomic_load(&g_deletes));
        n++;
    }
    atomic_store(&g_stop, 1);
    for (int c = 0; c < CLIENTS; c++) pthread_join(th[c], NULL);
    /* after the load: every session was deleted; the space comes back within the reclaim delay */
    double te = hyla_now(), after = 0;
    do {
        usleep(250000);
        after = disk_mib();
    } while (after > empty + 4.0 && hyla_now() - te < p.reclaim_after_ms / 1000.0 + 10);
    double settle = hyla_now() - te;
    printf("soak: empty store %.1f MiB; %.1f MiB %.1f s after the last delete; rss %.1f MiB; %ld puts, %ld deletes, %ld errors\n",
           empty, after, settle, rss_mib(), atomic_load(&g_puts), atomic_load(&g_deletes), atomic_load(&g_errors));
    CHECK(atomic_load(&g_errors) == 0);
    CHECK(atomic_load(&g_deletes) >= CLIENTS);
    CHECK_MSG(after <= empty + 4.0, "store holds %.1f MiB after deleting everything (empty: %.1f MiB)", after, empty);
    /* during the load: the second half holds no more than the first half plus a margin (a store
     * that kept deleted sessions' bytes until a restart grows all along) */
    double max1 = 0, max2 = 0, rss1 = 0, rss2 = 0;
    for (int i = 0; i < n; i++) {
        if (i < n / 2) {
            if (disk_s[i] > max1) max1 = disk_s[i];
            if (rss_s[i] > rss1) rss1 = rss_s[i];
        } else {
            if (disk_s[i] > max2) max2 = disk_s[i];
            if (rss_s[i] > rss2) rss2 = rss_s[i];
        }
    }
    printf("soak: max disk %.1f / %.1f MiB, max rss %.1f / %.1f MiB (first / second half)\n", max1, max2, rss1, rss2);
    CHECK_MSG(n < 8 || max2 <= 1.5 * max1 + 32.0, "disk grows under load: %.1f MiB, then %.1f MiB", max1, max2);
    CHECK_MSG(n < 8 || rss2 <= 1.5 * rss1 + 64.0, "memory grows under load: %.1f MiB, then %.1f MiB", rss1, rss2);
    hyla_store_close(g_st);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return hyla_test_done("test_store_soak");
}
