/* test_store_space.c — storage faults of the statestore: a full disk (injected write failures,
 * and a real small tmpfs when this process may mount one) answers HYLA_ERR_RESOURCE naming the
 * store and its space and keeps every acknowledged version readable; deletes still work on the
 * full disk (the reserve); puts resume by themselves once space exists; a damaged write-ahead
 * log (truncated, or bytes flipped) after acknowledged writes is reported at open (recovery
 * note, the damaged log kept aside) and the lost version answers HYLA_ERR_CORRUPT naming
 * session and version, never NOT_FOUND; a background flush that met the full disk (RocksDB
 * stopped, no call failed) does not fail the puts after space is back. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hyla_log.h"
#include "hyla_store.h"
#include "hyla_store_test.h"
#include "hyla_test.h"
#include "test_store_util.h"

static char root[256];
static int dir_no;

static void new_dir(char *buf, size_t n) { snprintf(buf, n, "%s/db%d", root, dir_no++); }

static int has(const char *msg, const char *needle) {
    if (strstr(msg, needle)) return 1;
    fprintf(stderr, "message lacks '%s': %s\n", needle, msg);
    return 0;
}

static hyla_store_params params(void) {
    hyla_store_params p = hyla_store_default_params();
    p.codec.chunk_bytes = 64 << 10;
    p.codec.threads = 2;
    p.write_buffer_bytes = 2 << 20;
    p.reserve_bytes = 4 << 20;
    p.reclaim_after_ms = 200;
    return p;
}

/* Session i's state: about 1.1 MiB, distinct per i. */
static hyla_snapshot *state(int i) { return tsu_make(1000 + (uint64_t)i, 1000 + (uint64_t)i, 2048, 77); }

static int get_equals(hyla_store *st, const char *sid, uint64_t ver, const hyla_snapshot *want) {
    hyla_snapshot *got = NULL;
    hyla_status s = hyla_store_get(st, sid, ver, 0, &got, NULL);
    if (s != HYLA_OK) {
        fprintf(stderr, "get %s v%llu: %s\n", sid, (unsigned long long)ver, hyla_last_error());
        return 0;
    }
    int eq = hyla_snapshot_equal(got, want);
    hyla_snapshot_destroy(got);
    return eq;
}

static int file_exists(const char *dir, const char *name) {
    char p[600];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    struct stat sb;
    return stat(p, &sb) == 0;
}

/* Injected full-disk failures: RESOURCE, previous version kept, delete works, puts resume. */
static void test_injected(void) {
    char dir[300];
    new_dir(dir, sizeof dir);
    hyla_store_params p = params();
    hyla_store *st = NULL;
    CHECK_OK(hyla_store_open(dir, &p, &st));
    if (!st) return;
    CHECK(file_exists(dir, "hyla-reserve"));
    hyla_snapshot *a = state(1), *b = state(2), *c = state(3);
    CHECK_OK(hyla_store_put(st, "a", a, NULL, NULL));
    CHECK_OK(hyla_store_put(st, "b", b, NULL, NULL));
    hyla_store_fault_write(1);
    hyla_status s = hyla_store_put(st, "a", c, NULL, NULL);
    hyla_store_fault_write(0);
    CHECK(s == HYLA_ERR_RESOURCE);
    CHECK(has(hyla_last_error(), "out of disk space") && has(hyla_last_error(), dir) &&
          has(hyla_last_error(), "MiB free of") && has(hyla_last_error(), "previous version kept"));
    CHECK(get_equals(st, "a", 0, a));
    /* a delete on the (possibly still) full store: the reserve is given up for it if so,
     * RocksDB reopened. (The reclaim thread may already have resumed writes: the injected
     * failure left the disk with room.) */
    CHECK_OK(hyla_store_delete(st, "b"));
    CHECK(hyla_store_info(st, "b", &(hyla_store_session_info){0}) == HYLA_ERR_NOT_FOUND);
    /* the next put (re-making the reserve if it was given up) goes through */
    hyla_store_usage_info u;
    CHECK_OK(hyla_store_put(st, "a", c, NULL, NULL));
    CHECK(file_exists(dir, "hyla-reserve"));
    CHECK_OK(hyla_store_usage(st, &u));
    CHECK(u.full == 0 && u.reserve_bytes == p.reserve_bytes && u.full_events >= 1);
    CHECK(get_equals(st, "a", 0, c));
    CHECK(get_equals(st, "a", 1, a));
    /* a delete whose own write fails with a full disk is retried with the reserve released */
    CHECK_OK(hyla_store_put(st, "b", b, NULL, NULL));
    hyla_store_fault_write(1);
    CHECK_OK(hyla_store_delete(st, "b"));
    hyla_store_fault_write(0);
    CHECK(hyla_store_info(st, "b", &(hyla_store_session_info){0}) == HYLA_ERR_NOT_FOUND);
    CHECK_OK(hyla_store_put(st, "b", b, NULL, NULL));
    CHECK(hyla_store_verify(st, NULL, NULL, NULL, NULL) == HYLA_OK);
    hyla_store_close(st);
    hyla_snapshot_destroy(a);
    hyla_snapshot_destroy(b);
    hyla_snapshot_destroy(c);
}

/* Fill a file until the filesystem is full; returns its bytes. */
static uint64_t ballast(const char *path) {
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (fd < 0) return 0;
    static char buf[1 << 16];
    memset(buf, 0x5a, sizeof buf);
    uint64_t n = 0;
    for (;;) {
        ssize_t w = write(fd, buf, sizeof buf);
        if (w <= 0) break;
        n += (uint64_t)w;
    }
    fsync(fd);
    close(fd);
    return n;
}

static void delete_range(hyla_store *st, int a, int b) {
    char sid[32];
    for (int i = a; i < b; i++) {
        snprintf(sid, sizeof sid, "s%d", i);
        CHECK_OK(hyla_store_delete(st, sid));
    }
}

/* Wait (up to 10 s) until the filesystem has `bytes` free; the free bytes then. */
static uint64_t wait_free(hyla_store *st, uint64_t bytes) {
    hyla_store_usage_info u;
    double t0 = hyla_now();
    do {
        usleep(100000);
        CHECK_OK(hyla_store_usage(st, &u));
    } while (u.disk_free_bytes < bytes && hyla_now() - t0 < 10);
    return u.disk_free_bytes;
}

/* Wait until the space-reclaim passes that deletes scheduled have run (gc_runs past runs0) and
 * no other has followed for quiet_ms: a pass flushes the chunk memtable, so what the caller puts
 * next stays in it only once they are over (a fixed sleep was too short on a loaded machine). */
static void wait_reclaimed(hyla_store *st, uint64_t runs0, int quiet_ms) {
    hyla_store_usage_info u;
    double t0 = hyla_now(), tl = t0;
    uint64_t last = runs0;
    for (;;) {
        usleep(50000);
        CHECK_OK(hyla_store_usage(st, &u));
        if (u.gc_runs != last) last = u.gc_runs, tl = hyla_now();
        if (last > runs0 && hyla_now() - tl > quiet_ms / 1000.0) return;
        if (hyla_now() - t0 > 20) {
            CHECK_MSG(0, "no reclaim pass after the deletes in 20 s (%llu runs)", (unsigned long long)last);
            return;
        }
    }
}

/* A tmpfs of size_mib under root/name (mnt), with a store in mnt/store (dir; *st, NULL when the
 * open failed) and the path of a ballast file beside it (bal). 0 when no tmpfs can be mounted here:
 * SKIP printed for `what`. */
static int tmpfs_store(const char *name, int size_mib, const char *what, char mnt[300], char dir[400],
                       char bal[400], hyla_store **st) {
    snprintf(mnt, 300, "%s/%s", root, name);
    mkdir(mnt, 0700);
    char opt[32];
    snprintf(opt, sizeof opt, "size=%dm", size_mib);
    if (mount("tmpfs", mnt, "tmpfs", 0, opt) != 0) {
        printf("SKIP %s on tmpfs: cannot mount one here (%s); the injected-fault test covers the logic\n", what,
               strerror(errno));
        return 0;
    }
    snprintf(dir, 400, "%s/store", mnt);
    snprintf(bal, 400, "%s/ballast", mnt);
    hyla_store_params p = params();
    *st = NULL;
    CHECK_OK(hyla_store_open(dir, &p, st));
    return 1;
}

/* A real full disk: a small tmpfs. */
static void test_tmpfs(void) {
    char mnt[300], bal[400], dir[400];
    hyla_store *st;
    if (!tmpfs_store("tmpfs", 40, "full-disk test", mnt, dir, bal, &st)) return;
    hyla_store_params p = params();
    if (!st) goto out;
    enum { MAXS = 64 };
    hyla_snapshot *snaps[MAXS] = {0};
    int n = 0;
    hyla_status s = HYLA_OK;
    char sid[32], msg[2048] = "";
    /* put distinct sessions until the disk is full */
    for (; n < MAXS; n++) {
        snaps[n] = state(n);
        snprintf(sid, sizeof sid, "s%d", n);
        s = hyla_store_put(st, sid, snaps[n], NULL, NULL);
        if (s != HYLA_OK) {
            snprintf(msg, sizeof msg, "%s", hyla_last_error());
            break;
        }
    }
    printf("tmpfs: %d sessions stored before the disk was full: %s\n", n, msg);
    CHECK(n >= 16 && n < MAXS);
    if (n < 16) goto done;
    CHECK(s == HYLA_ERR_RESOURCE);
    CHECK(has(msg, "out of disk space") && has(msg, dir) && has(msg, "MiB free"));
    for (int i = 0; i < n; i++) {
        snprintf(sid, sizeof sid, "s%d", i);
        CHECK_MSG(get_equals(st, sid, 0, snaps[i]), "session %s unreadable on the full disk", sid);
    }
    /* take the rest of the disk too: even the RocksDB write of a delete finds no room */
    hyla_store_usage_info u;
    CHECK_OK(hyla_store_usage(st, &u));
    uint64_t events = u.full_events, runs = u.gc_runs;
    /* make a little room (the reclaim pass after it empties the memtable), then a small session
     * whose chunks stay in the memtable (and the WAL): no garbage, so no reclaim flushes it */
    delete_range(st, 0, 4);
    wait_free(st, 2u << 20);
    wait_reclaimed(st, runs, 3 * p.reclaim_after_ms);
    hyla_snapshot *small = tsu_make(99, 99, 256, 77);
    CHECK_OK(hyla_store_put(st, "small", small, NULL, NULL));
    uint64_t bb = ballast(bal);
    printf("tmpfs: ballast of %.1f MiB fills the disk\n", bb / 1048576.0);
    /* a GC must flush the chunk memtable: RocksDB itself hits the full disk and stops writes;
     * the GC is retried with the reserve released, and works */
    CHECK_OK(hyla_store_gc(st, NULL));
    CHECK_OK(hyla_store_usage(st, &u));
    CHECK_MSG(u.full_events > events, "RocksDB never saw the full disk (%llu events)", (unsigned long long)u.full_events);
    CHECK(get_equals(st, "small", 0, small));
    hyla_snapshot_destroy(small);
    CHECK_OK(hyla_store_delete(st, "small"));
    delete_range(st, 4, 8);
    /* space exists again (ballast gone, deleted chunks reclaimed): puts resume by themselves */
    unlink(bal);
    wait_free(st, 8u << 20);
    snprintf(sid, sizeof sid, "s%d", n);
    CHECK_OK(hyla_store_put(st, sid, snaps[n], NULL, NULL));
    CHECK(get_equals(st, sid, 0, snaps[n]));
    for (int i = 8; i <= n; i++) {
        snprintf(sid, sizeof sid, "s%d", i);
        CHECK_MSG(get_equals(st, sid, 0, snaps[i]), "session %s lost", sid);
    }
    CHECK_OK(hyla_store_usage(st, &u));
    CHECK(u.full == 0 && u.reserve_bytes == p.reserve_bytes);
    /* make room, then fill the disk behind the store's back and free it again: the put in
     * between fails, the next one works. The reclaim passes of the deletes are waited for before
     * the ballast: one still running after it freed room that the put then found */
    runs = u.gc_runs;
    delete_range(st, 8, 12);
    printf("tmpfs: %.1f MiB free after deleting 4 more sessions\n", wait_free(st, 6u << 20) / 1048576.0);
    wait_reclaimed(st, runs, 3 * p.reclaim_after_ms);
    bb = ballast(bal);
    snprintf(sid, sizeof sid, "late");
    s = hyla_store_put(st, sid, snaps[0], NULL, NULL);
    CHECK(s == HYLA_ERR_RESOURCE);
    unlink(bal);
    CHECK_OK(hyla_store_put(st, sid, snaps[0], NULL, NULL));
    CHECK(hyla_store_verify(st, NULL, NULL, NULL, NULL) == HYLA_OK);
    /* delete everything: the space comes back without a restart */
    delete_range(st, 12, n + 1);
    CHECK_OK(hyla_store_delete(st, "late"));
    double t0 = hyla_now();
    do {
        usleep(100000);
        CHECK_OK(hyla_store_usage(st, &u));
    } while (u.disk_bytes > p.reserve_bytes + (6u << 20) && hyla_now() - t0 < 10);
    printf("tmpfs: %.1f MiB on disk %.1f s after deleting everything (reserve %.1f MiB)\n", u.disk_bytes / 1048576.0,
           hyla_now() - t0, p.reserve_bytes / 1048576.0);
    CHECK(u.disk_bytes <= p.reserve_bytes + (6u << 20));
done:
    hyla_store_close(st);
    for (int i = 0; i < MAXS; i++) hyla_snapshot_destroy(snaps[i]);
out:
    if (umount2(mnt, MNT_DETACH) != 0) fprintf(stderr, "umount %s: %s\n", mnt, strerror(errno));
}

/* A background flush that meets the full disk stops RocksDB without any call of the store
 * failing: once space is back, the next put must still work (the store reopens RocksDB rather
 * than fail with the stale error). */
static void test_tmpfs_background(void) {
    char mnt[300], bal[400], dir[400];
    hyla_store *st;
    if (!tmpfs_store("tmpfs-bg", 24, "background-flush test", mnt, dir, bal, &st)) return;
    hyla_store_params p = params();
    if (!st) goto out;
    /* small sessions: their chunks and commits stay in the memtables (and the WAL) */
    hyla_snapshot *a = tsu_make(7, 7, 256, 77), *b = tsu_make(8, 8, 256, 77);
    CHECK_OK(hyla_store_put(st, "a", a, NULL, NULL));
    uint64_t bb = ballast(bal);
    uint64_t failed = hyla_store_test_flush_background(st);
    printf("tmpfs-bg: ballast of %.1f MiB, then a background flush: %llu failed background job(s)\n", bb / 1048576.0,
           (unsigned long long)failed);
    CHECK_MSG(failed > 0, "the background flush did not meet the full disk");
    unlink(bal);
    /* space is back, nothing told the store: the put works, what was acknowledged is there */
    CHECK_OK(hyla_store_put(st, "b", b, NULL, NULL));
    CHECK(get_equals(st, "a", 0, a));
    CHECK(get_equals(st, "b", 0, b));
    hyla_store_close(st);
    st = NULL;
    CHECK_OK(hyla_store_open(dir, &p, &st));
    if (st) {
        CHECK(get_equals(st, "a", 0, a));
        CHECK(get_equals(st, "b", 0, b));
        hyla_store_close(st);
    }
    hyla_snapshot_destroy(a);
    hyla_snapshot_destroy(b);
out:
    if (umount2(mnt, MNT_DETACH) != 0) fprintf(stderr, "umount %s: %s\n", mnt, strerror(errno));
}

/* The newest WAL file of dir ("" when none). */
static void newest_log(const char *dir, char *out, size_t cap) {
    out[0] = 0;
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char best[256] = "";
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l > 4 && !strcmp(e->d_name + l - 4, ".log") && strcmp(e->d_name, best) > 0)
            snprintf(best, sizeof best, "%s", e->d_name);
    }
    closedir(d);
    if (best[0]) snprintf(out, cap, "%s/%s", dir, best);
}

static int has_damaged_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    int found = 0;
    while ((e = readdir(d)))
        if (!strncmp(e->d_name, "wal-damaged-", 12)) found = 1;
    closedir(d);
    return found;
}

/* Damage the WAL after acknowledged writes: mode 0 truncates inside the last commit, mode 1
 * flips bytes in it. */
static void test_wal_damage(int mode) {
    char dir[300];
    new_dir(dir, sizeof dir);
    hyla_store_params p = params();
    p.nowal_bytes = 1ull << 40;        /* every chunk through the WAL */
    p.write_buffer_bytes = 64ull << 20; /* and one WAL file for the whole test */
    hyla_store *st = NULL;
    CHECK_OK(hyla_store_open(dir, &p, &st));
    if (!st) return;
    hyla_snapshot *a = state(10), *b = state(11), *c = state(12);
    CHECK_OK(hyla_store_put(st, "w", a, NULL, NULL));
    off_t before = 0;
    char log[600];
    newest_log(dir, log, sizeof log);
    struct stat sb;
    if (stat(log, &sb) == 0) before = sb.st_size;
    uint64_t v2 = 0, v1b = 0;
    CHECK_OK(hyla_store_put(st, "w", b, &v2, NULL));        /* acknowledged: synced */
    CHECK_OK(hyla_store_put(st, "other", c, &v1b, NULL));   /* acknowledged too */
    CHECK(v2 == 2 && v1b == 1);
    hyla_store_close(st);
    newest_log(dir, log, sizeof log);
    CHECK(stat(log, &sb) == 0 && sb.st_size > before);
    if (mode == 0) {
        CHECK(truncate(log, before + (sb.st_size - before) / 4) == 0); /* cut inside v2 of w */
    } else {
        int fd = open(log, O_RDWR);
        CHECK(fd >= 0);
        unsigned char junk[64];
        memset(junk, 0xA5, sizeof junk);
        off_t at = before + (sb.st_size - before) / 4;
        CHECK(pwrite(fd, junk, sizeof junk, at) == (ssize_t)sizeof junk);
        fsync(fd);
        close(fd);
    }
    st = NULL;
    CHECK_OK(hyla_store_open(dir, &p, &st)); /* opens: the loss is reported, not a refusal */
    if (!st) return;
    const char *note = hyla_store_recovery_note(st);
    printf("wal damage (%s): note: %s\n", mode ? "flipped bytes" : "truncated", note);
    CHECK(has(note, "write-ahead log is damaged") && has(note, "wal-damaged-"));
    CHECK(has_damaged_dir(dir));
    /* the version before the damage is intact */
    CHECK(get_equals(st, "w", 1, a));
    /* the lost version: DATA_LOSS (CORRUPT) naming session and version, never NOT_FOUND */
    hyla_snapshot *got = NULL;
    hyla_status s = hyla_store_get(st, "w", 2, 0, &got, NULL);
    CHECK(s == HYLA_ERR_CORRUPT);
    CHECK(has(hyla_last_error(), "session w version 2") && has(hyla_last_error(), "committed but missing"));
    hyla_snapshot_destroy(got);
    /* the store goes on: new puts, verify clean */
    CHECK_OK(hyla_store_put(st, "w", c, NULL, NULL));
    CHECK(get_equals(st, "w", 0, c));
    CHECK(hyla_store_verify(st, NULL, NULL, NULL, NULL) == HYLA_OK);
    hyla_store_close(st);
    /* a clean reopen reports nothing */
    CHECK_OK(hyla_store_open(dir, &p, &st));
    if (st) CHECK(hyla_store_recovery_note(st)[0] == 0);
    hyla_store_close(st);
    hyla_snapshot_destroy(a);
    hyla_snapshot_destroy(b);
    hyla_snapshot_destroy(c);
}

int main(void) {
    hyla_log_set_level(getenv("HYLA_LOG") ? HYLA_LOG_INFO : HYLA_LOG_ERROR);
    snprintf(root, sizeof root, "%s/hyla_test_space_%d", hyla_test_env("TMPDIR", "/tmp"), (int)getpid());
    CHECK_OK(hyla_mkdirs(root));
    test_injected();
    test_wal_damage(0);
    test_wal_damage(1);
    test_tmpfs();
    test_tmpfs_background();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root);
    return hyla_test_done("test_store_space");
}
