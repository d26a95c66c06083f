/* hyla_store.c — session snapshots in RocksDB: content-addressed chunks with reference counts,
 * versioned manifests, per-session heads; see hyla_store.h and docs/STATE_FORMAT.md §4-6.
 *
 * Invariants (I1-I4 are what a crash may not break):
 *  I1 a head names a manifest that exists, and every chunk a manifest names exists;
 *  I2 R(key).refs = number of manifests naming the chunk (each manifest counted once);
 *  I3 a chunk is written (with R = 0) before any manifest naming it, in an earlier WAL record;
 *  I4 manifest, head and refcount changes of one operation go in one WriteBatch.
 * A chunk whose refs reach 0 is deleted only while holding gc_lock exclusively, so a put (which
 * holds it shared from "does this chunk exist?" to its commit) never names a deleted chunk.
 *
 * Threading: `db_lock` (rwlock) is held shared by every public call for as long as it uses the
 * RocksDB handle, and exclusively only to reopen that handle after a failed write (full disk,
 * see "space"). `mu` serializes every read-modify-write of heads and refcounts (commits, fork,
 * delete, chunk-batch writes); `gc_lock` (rwlock) is held shared by put/fork/delete and
 * exclusively by chunk deletion. Lock order: db_lock, gc_lock, mu. Gets read through a RocksDB
 * snapshot and take no lock beyond db_lock. One reclaim thread per writable store (maint_main)
 * retries a full store and returns deleted chunks' space; `reclaim_mu` keeps its passes and
 * hyla_store_gc apart (both change the blob GC cutoff). */
#include "hyla_store.h"
#include "hyla_store_test.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <fcntl.h>
#include <unistd.h>

#include <rocksdb/c.h>

#include "hyla_log.h"
#include "hyla_util.h"

#define STORE_FORMAT "hyla-statestore 1"
#define HEAD_MAGIC 0x44485948u /* "HYHD" */
#define HEAD_BYTES 32
#define REF_BYTES 16
#define TIME_BYTES 16
#define KEY_MAX (2 + HYLA_SESSION_ID_MAX + 8)
#define GROUP_BYTES (64u << 20) /* raw bytes encoded and written per chunk group */
#define BATCH_BYTES (32u << 20) /* encoded bytes per chunk WriteBatch */

enum { CF_DEFAULT = 0, CF_CHUNKS = 1, CF_META = 2, CF_COUNT = 3 };

struct hyla_store {
    char *dir;
    hyla_store_params p;
    rocksdb_t *db;
    rocksdb_options_t *opt;
    rocksdb_options_t *cf_opt[CF_COUNT];
    rocksdb_column_family_handle_t *cf[CF_COUNT];
    rocksdb_writeoptions_t *wo_commit, *wo_chunks, *wo_plain;
    rocksdb_readoptions_t *ro;
    pthread_mutex_t mu;
    pthread_rwlock_t gc_lock;
    uint64_t nowal_seq;   /* chunk batches written without the WAL (under mu) */
    uint64_t flushed_seq; /* nowal_seq covered by a completed flush (under mu) */
    /* disk-full handling and reclaim (see "space" below) */
    pthread_rwlock_t db_lock; /* shared by every call; exclusive to reopen the RocksDB handle */
    atomic_int full;          /* 1: a write ran out of space; puts wait for the reserve to be re-made */
    atomic_int broken;        /* 1: RocksDB stopped writes after a failed write; needs a reopen */
    atomic_ullong full_events; /* writes that found the disk full */
    uint64_t bg_base;         /* RocksDB's background-error count when the handle opened */
    int reserve_held;         /* the reserve file is in place (under db_lock exclusive, or at open) */
    char *reserve_path;
    pthread_mutex_t reclaim_mu; /* serializes reclaim passes and hyla_store_gc (blob GC options) */
    atomic_ullong garbage_bytes; /* encoded bytes of chunks deleted since the last reclaim pass */
    /* garbage collection since open (hyla_store_usage_info): */
    atomic_ullong gc_runs;          /* completed reclaim passes and hyla_store_gc calls */
    atomic_ullong gc_chunks_freed;  /* chunks deleted because no version references them */
    atomic_ullong gc_bytes_freed;   /* their encoded bytes */
    atomic_ullong versions_dropped; /* versions removed by retention (keep_versions) at puts */
    _Atomic double garbage_since; /* hyla_now() of the first of them; 0 when none */
    pthread_t maint;
    int maint_running;
    pthread_mutex_t maint_mu;
    pthread_cond_t maint_cv;
    int stopping; /* under maint_mu */
    char recovery_note[2048]; /* what WAL recovery dropped at open; "" when nothing */
};

/* ---------------------------------------------------------------- small helpers */

static atomic_long g_fault_write;

void hyla_store_fault_write(long nth) { atomic_store(&g_fault_write, nth); }

static uint64_t bg_errors(hyla_store *st);
uint64_t hyla_store_test_flush_background(hyla_store *st) {
    pthread_rwlock_rdlock(&st->db_lock);
    uint64_t n = 0;
    if (st->db) {
        rocksdb_flushoptions_t *fo = rocksdb_flushoptions_create();
        rocksdb_flushoptions_set_wait(fo, 0);
        for (int cf = CF_CHUNKS; cf <= CF_META; cf++) {
            char *err = NULL;
            rocksdb_flush_cf(st->db, fo, st->cf[cf], &err);
            rocksdb_free(err);
        }
        rocksdb_flushoptions_destroy(fo);
        /* done when a background job failed, or when both families' memtables were flushed */
        for (double t0 = hyla_now(); hyla_now() - t0 < 10 && bg_errors(st) == st->bg_base;) {
            uint64_t imm = 0, running = 0, v;
            for (int cf = CF_CHUNKS; cf <= CF_META; cf++)
                if (rocksdb_property_int_cf(st->db, st->cf[cf], "rocksdb.num-immutable-mem-table", &v) == 0) imm += v;
            rocksdb_property_int(st->db, "rocksdb.num-running-flushes", &running);
            if (!imm && !running) break;
            usleep(20000);
        }
        n = bg_errors(st) - st->bg_base;
    }
    pthread_rwlock_unlock(&st->db_lock);
    return n;
}

static int fault_write_hit(void) {
    long v = atomic_load(&g_fault_write);
    while (v > 0)
        if (atomic_compare_exchange_weak(&g_fault_write, &v, v - 1)) return v == 1;
    return 0;
}


/* RocksDB error -> status; frees err. */
static hyla_status rdb_fail(char *err, hyla_status s, const char *what, const char *dir) {
    hyla_status r = hyla_fail(s, "store %s: %s: %s", dir, what, err ? err : "unknown RocksDB error");
    rocksdb_free(err);
    return r;
}

static hyla_status check_session_id(const char *id) { return hyla_session_id_check(id, "session id"); }

/* Keys of the meta column family (docs/STATE_FORMAT.md §4). */
static size_t key_head(char *k, const char *sid) {
    size_t n = strlen(sid);
    k[0] = 'H';
    memcpy(k + 1, sid, n);
    return n + 1;
}
static size_t key_mprefix(char *k, const char *sid) {
    size_t n = strlen(sid);
    k[0] = 'M';
    memcpy(k + 1, sid, n);
    k[n + 1] = 0;
    return n + 2;
}
static size_t key_manifest(char *k, const char *sid, uint64_t ver) {
    size_t n = key_mprefix(k, sid);
    for (int i = 0; i < 8; i++) k[n + i] = (char)(ver >> (56 - 8 * i));
    return n + 8;
}
/* The commit record of a version: commit time and bytes written (docs/STATE_FORMAT.md §4). */
static size_t key_time(char *k, const char *sid, uint64_t ver) {
    size_t n = key_manifest(k, sid, ver);
    k[0] = 'T';
    return n;
}
static size_t key_ref(char *k, const uint8_t *ckey) {
    k[0] = 'R';
    memcpy(k + 1, ckey, HYLA_CHUNK_KEY_BYTES);
    return 1 + HYLA_CHUNK_KEY_BYTES;
}
static uint64_t ver_of_mkey(const char *k, size_t klen) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = v << 8 | (uint8_t)k[klen - 8 + i];
    return v;
}

typedef struct {
    uint64_t version, next, checksum;
} head_val;

static void head_encode(uint8_t b[HEAD_BYTES], const head_val *h) {
    hyla_put_le32(b, HEAD_MAGIC);
    hyla_put_le32(b + 4, 0);
    hyla_put_le64(b + 8, h->version);
    hyla_put_le64(b + 16, h->next);
    hyla_put_le64(b + 24, h->checksum);
}

/* Get from meta (or chunks) cf. *val: caller frees with rocksdb_free. NOT_FOUND if absent. */
static hyla_status db_get(hyla_store *st, const rocksdb_readoptions_t *ro, int cf, const char *k, size_t klen, char **val,
                          size_t *vlen) {
    char *err = NULL;
    *val = rocksdb_get_cf(st->db, ro ? ro : st->ro, st->cf[cf], k, klen, vlen, &err);
    if (err) return rdb_fail(err, HYLA_ERR_IO, "read", st->dir);
    if (!*val) return HYLA_ERR_NOT_FOUND;
    return HYLA_OK;
}

static hyla_status read_head(hyla_store *st, const rocksdb_readoptions_t *ro, const char *sid, head_val *h) {
    char k[KEY_MAX], *v;
    size_t vl;
    hyla_status s = db_get(st, ro, CF_META, k, key_head(k, sid), &v, &vl);
    if (s == HYLA_ERR_NOT_FOUND) return hyla_fail(HYLA_ERR_NOT_FOUND, "session %s: no such session in store %s", sid, st->dir);
    if (s != HYLA_OK) return s;
    hyla_status r = HYLA_OK;
    if (vl != HEAD_BYTES || hyla_get_le32((uint8_t *)v) != HEAD_MAGIC)
        r = hyla_fail(HYLA_ERR_CORRUPT, "session %s: head record is malformed (%zu bytes)", sid, vl);
    else {
        h->version = hyla_get_le64((uint8_t *)v + 8);
        h->next = hyla_get_le64((uint8_t *)v + 16);
        h->checksum = hyla_get_le64((uint8_t *)v + 24);
    }
    rocksdb_free(v);
    return r;
}

/* ---------------------------------------------------------------- space
 *
 * A full disk: RocksDB fails the write (and stops taking writes until it recovers), the store
 * answers HYLA_ERR_RESOURCE naming the directory and the free space, and marks itself `full`
 * and `broken`. The reserve file (params.reserve_bytes) holds space back: a delete or a GC on a
 * full store releases it and reopens RocksDB (which clears its stopped state), so space can
 * always be freed. A put on a full store first re-makes the reserve (failing RESOURCE while the
 * space is not there) and reopens RocksDB if needed, so writes resume by themselves once space
 * exists; the reclaim thread tries the same every tick. */

#define RESERVE_NAME "hyla-reserve"
#define MIB(x) ((double)(x) / 1048576.0)

static void disk_space(const char *dir, uint64_t *avail, uint64_t *total) {
    struct statvfs v;
    *avail = *total = 0;
    if (statvfs(dir, &v) == 0) {
        *avail = (uint64_t)v.f_bavail * v.f_frsize;
        *total = (uint64_t)v.f_blocks * v.f_frsize;
    }
}

static int is_nospace(const char *err) {
    return err && (strstr(err, "No space left") || strstr(err, "NoSpace") || strstr(err, "no space"));
}

/* HYLA_ERR_RESOURCE naming the store and its space; marks the store full (and broken: RocksDB
 * stops writes after a failed write until it is reopened). */
static hyla_status fail_nospace(hyla_store *st, const char *what, const char *detail) {
    uint64_t avail, total;
    disk_space(st->dir, &avail, &total);
    atomic_store(&st->full, 1);
    atomic_store(&st->broken, 1);
    atomic_fetch_add(&st->full_events, 1);
    return hyla_fail(HYLA_ERR_RESOURCE,
                     "store %s is out of disk space (%.1f MiB free of %.1f MiB; %.1f MiB reserved for deletes): %s: %s", st->dir,
                     MIB(avail), MIB(total), st->reserve_held ? MIB(st->p.reserve_bytes) : 0.0, what, detail);
}

/* A failed RocksDB write -> status (RESOURCE for a full disk); frees err. */
static hyla_status write_fail(hyla_store *st, char *err, const char *what) {
    if (is_nospace(err)) {
        hyla_status s = fail_nospace(st, what, err);
        rocksdb_free(err);
        return s;
    }
    return rdb_fail(err, HYLA_ERR_IO, what, st->dir);
}

/* commit: 1 = synced (commits), 2 = WAL without sync, 0 = chunk values (no WAL in durable mode). */
static hyla_status store_write(hyla_store *st, rocksdb_writebatch_t *b, int commit, const char *what) {
    if (st->p.read_only) return hyla_fail(HYLA_ERR_UNSUPPORTED, "store %s is open read-only", st->dir);
    if (fault_write_hit()) return fail_nospace(st, what, "write failed: No space left on device (injected fault)");
    char *err = NULL;
    rocksdb_write(st->db, commit == 1 ? st->wo_commit : commit == 2 ? st->wo_plain : st->wo_chunks, b, &err);
    if (err) return write_fail(st, err, what);
    return HYLA_OK;
}

/* Versions of a session, ascending, read through ro. *out: caller frees. */
static hyla_status list_versions(hyla_store *st, const rocksdb_readoptions_t *ro, const char *sid, uint64_t **out,
                                 size_t *n) {
    char pre[KEY_MAX];
    size_t pl = key_mprefix(pre, sid);
    rocksdb_iterator_t *it = rocksdb_create_iterator_cf(st->db, ro ? ro : st->ro, st->cf[CF_META]);
    size_t cap = 8, cnt = 0;
    uint64_t *v = malloc(cap * sizeof *v);
    hyla_status s = HYLA_OK;
    for (rocksdb_iter_seek(it, pre, pl); v && rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t kl;
        const char *k = rocksdb_iter_key(it, &kl);
        if (kl != pl + 8 || memcmp(k, pre, pl) != 0) break;
        if (cnt == cap) {
            uint64_t *nv = realloc(v, 2 * cap * sizeof *v);
            if (!nv) break;
            v = nv;
            cap *= 2;
        }
        v[cnt++] = ver_of_mkey(k, kl);
    }
    char *err = NULL;
    rocksdb_iter_get_error(it, &err);
    rocksdb_iter_destroy(it);
    if (err) s = rdb_fail(err, HYLA_ERR_IO, "iterate manifests", st->dir);
    else if (!v) s = hyla_fail(HYLA_ERR_NOMEM, "version list");
    if (s != HYLA_OK) {
        free(v);
        return s;
    }
    *out = v;
    *n = cnt;
    return HYLA_OK;
}

static hyla_status read_manifest(hyla_store *st, const rocksdb_readoptions_t *ro, const char *sid, uint64_t ver,
                                 hyla_manifest **out) {
    char k[KEY_MAX], *v, what[400];
    size_t vl;
    snprintf(what, sizeof what, "session %s version %llu", sid, (unsigned long long)ver);
    hyla_status s = db_get(st, ro, CF_META, k, key_manifest(k, sid, ver), &v, &vl);
    if (s == HYLA_ERR_NOT_FOUND) return hyla_fail(HYLA_ERR_NOT_FOUND, "%s: no such version", what);
    if (s != HYLA_OK) return s;
    s = hyla_manifest_parse((const uint8_t *)v, vl, what, out);
    rocksdb_free(v);
    return s;
}

/* ---------------------------------------------------------------- refcount deltas */

typedef struct {
    uint8_t key[HYLA_CHUNK_KEY_BYTES];
    int64_t delta;
    uint32_t value_len; /* for new R records */
} ref_delta;

typedef struct {
    ref_delta *d;
    size_t n, cap;
} delta_list;

static int delta_add(delta_list *l, const uint8_t *key, int64_t delta) {
    if (l->n == l->cap) {
        size_t c = l->cap ? l->cap * 2 : 256;
        ref_delta *nd = realloc(l->d, c * sizeof *nd);
        if (!nd) return -1;
        l->d = nd;
        l->cap = c;
    }
    memcpy(l->d[l->n].key, key, HYLA_CHUNK_KEY_BYTES);
    l->d[l->n].delta = delta;
    l->d[l->n].value_len = 0;
    l->n++;
    return 0;
}

static int cmp_delta(const void *a, const void *b) {
    return memcmp(((const ref_delta *)a)->key, ((const ref_delta *)b)->key, HYLA_CHUNK_KEY_BYTES);
}

/* Sort and merge equal keys (summing deltas). */
static void delta_merge(delta_list *l) {
    if (l->n == 0) return;
    qsort(l->d, l->n, sizeof *l->d, cmp_delta);
    size_t o = 0;
    for (size_t i = 1; i < l->n; i++) {
        if (!memcmp(l->d[i].key, l->d[o].key, HYLA_CHUNK_KEY_BYTES))
            l->d[o].delta += l->d[i].delta;
        else
            l->d[++o] = l->d[i];
    }
    l->n = o + 1;
}

/* Add `delta` once for each distinct chunk of a manifest. */
static int delta_add_manifest_keys(delta_list *l, const uint8_t (*keys)[HYLA_CHUNK_KEY_BYTES], size_t n, int64_t delta) {
    delta_list tmp = {0};
    for (size_t i = 0; i < n; i++)
        if (delta_add(&tmp, keys[i], 1)) {
            free(tmp.d);
            return -1;
        }
    delta_merge(&tmp); /* distinct */
    for (size_t i = 0; i < tmp.n; i++)
        if (delta_add(l, tmp.d[i].key, delta)) {
            free(tmp.d);
            return -1;
        }
    free(tmp.d);
    return 0;
}

static int delta_add_manifest(delta_list *l, const hyla_manifest *m, int64_t delta) {
    uint8_t(*keys)[HYLA_CHUNK_KEY_BYTES] = malloc((m->n_chunks + 1) * HYLA_CHUNK_KEY_BYTES);
    if (!keys) return -1;
    for (size_t i = 0; i < m->n_chunks; i++) memcpy(keys[i], m->chunks[i].key, HYLA_CHUNK_KEY_BYTES);
    int r = delta_add_manifest_keys(l, (const uint8_t(*)[HYLA_CHUNK_KEY_BYTES])keys, m->n_chunks, delta);
    free(keys);
    return r;
}

/* Apply merged deltas into batch b (caller holds mu). Keys whose refs become 0 are appended
 * to *zero. A +delta on a chunk with no R record is an invariant violation (I1). */
static hyla_status delta_apply(hyla_store *st, delta_list *l, rocksdb_writebatch_t *b, delta_list *zero,
                               const char *what) {
    for (size_t i = 0; i < l->n; i++) {
        if (l->d[i].delta == 0) continue;
        char k[KEY_MAX], *v;
        size_t vl, kl = key_ref(k, l->d[i].key);
        hyla_status s = db_get(st, NULL, CF_META, k, kl, &v, &vl);
        if (s == HYLA_ERR_NOT_FOUND) {
            if (l->d[i].delta > 0)
                return hyla_fail(HYLA_ERR_INTERNAL, "%s: a chunk to reference has no reference record", what);
            HYLA_WARN("%s: dropping a reference to a chunk without a reference record", what);
            continue;
        }
        if (s != HYLA_OK) return s;
        if (vl != REF_BYTES) {
            rocksdb_free(v);
            return hyla_fail(HYLA_ERR_CORRUPT, "%s: malformed reference record (%zu bytes)", what, vl);
        }
        uint8_t nv[REF_BYTES];
        memcpy(nv, v, REF_BYTES);
        rocksdb_free(v);
        int64_t refs = (int64_t)hyla_get_le64(nv) + l->d[i].delta;
        if (refs < 0) {
            HYLA_WARN("%s: reference count below zero; clamping", what);
            refs = 0;
        }
        hyla_put_le64(nv, (uint64_t)refs);
        rocksdb_writebatch_put_cf(b, st->cf[CF_META], k, kl, (const char *)nv, REF_BYTES);
        if (refs == 0 && zero && delta_add(zero, l->d[i].key, 0))
            return hyla_fail(HYLA_ERR_NOMEM, "gc candidates");
    }
    return HYLA_OK;
}

/* Delete the candidate chunks whose refs are still 0. Takes gc_lock exclusively. */
static hyla_status free_chunks(hyla_store *st, const delta_list *cand, uint64_t *n_freed, uint64_t *bytes_freed) {
    if (!cand || cand->n == 0) return HYLA_OK;
    pthread_rwlock_wrlock(&st->gc_lock);
    pthread_mutex_lock(&st->mu);
    rocksdb_writebatch_t *b = rocksdb_writebatch_create();
    uint64_t nf = 0, bf = 0;
    hyla_status s = HYLA_OK;
    for (size_t i = 0; i < cand->n && s == HYLA_OK; i++) {
        char k[KEY_MAX], *v;
        size_t vl, kl = key_ref(k, cand->d[i].key);
        s = db_get(st, NULL, CF_META, k, kl, &v, &vl);
        if (s == HYLA_ERR_NOT_FOUND) {
            s = HYLA_OK;
            continue;
        }
        if (s != HYLA_OK) break;
        if (vl == REF_BYTES && hyla_get_le64((uint8_t *)v) == 0) {
            rocksdb_writebatch_delete_cf(b, st->cf[CF_META], k, kl);
            rocksdb_writebatch_delete_cf(b, st->cf[CF_CHUNKS], (const char *)cand->d[i].key, HYLA_CHUNK_KEY_BYTES);
            nf++;
            bf += hyla_get_le32((uint8_t *)v + 8);
        }
        rocksdb_free(v);
    }
    if (s == HYLA_OK && nf) s = store_write(st, b, 2, "delete unreferenced chunks");
    rocksdb_writebatch_destroy(b);
    pthread_mutex_unlock(&st->mu);
    pthread_rwlock_unlock(&st->gc_lock);
    if (s == HYLA_OK) {
        if (n_freed) *n_freed += nf;
        if (bytes_freed) *bytes_freed += bf;
        atomic_fetch_add(&st->gc_chunks_freed, nf);
        atomic_fetch_add(&st->gc_bytes_freed, bf);
        if (nf) {
            atomic_fetch_add(&st->garbage_bytes, bf);
            double z = 0.0;
            atomic_compare_exchange_strong(&st->garbage_since, &z, hyla_now());
        }
    }
    return s;
}

/* Every R record with refs 0. */
static hyla_status zero_ref_keys(hyla_store *st, delta_list *out) {
    rocksdb_iterator_t *it = rocksdb_create_iterator_cf(st->db, st->ro, st->cf[CF_META]);
    hyla_status s = HYLA_OK;
    for (rocksdb_iter_seek(it, "R", 1); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t kl, vl;
        const char *k = rocksdb_iter_key(it, &kl);
        if (kl < 1 || k[0] != 'R') break;
        const char *v = rocksdb_iter_value(it, &vl);
        if (kl == 1 + HYLA_CHUNK_KEY_BYTES && vl == REF_BYTES && hyla_get_le64((const uint8_t *)v) == 0 &&
            delta_add(out, (const uint8_t *)k + 1, 0)) {
            s = hyla_fail(HYLA_ERR_NOMEM, "gc list");
            break;
        }
    }
    char *err = NULL;
    rocksdb_iter_get_error(it, &err);
    rocksdb_iter_destroy(it);
    if (err) return rdb_fail(err, HYLA_ERR_IO, "iterate reference records", st->dir);
    return s;
}

/* ---------------------------------------------------------------- open / close */

hyla_store_params hyla_store_default_params(void) {
    hyla_store_params p;
    memset(&p, 0, sizeof p);
    p.codec = hyla_codec_default_params();
    p.keep_versions = 2;
    p.create_if_missing = 1;
    p.sync = 1;
    p.gc_on_open = 1;
    p.write_buffer_bytes = 64ull << 20;
    p.read_only = 0;
    p.nowal_bytes = 32ull << 20;
    p.reserve_bytes = 64ull << 20;
    p.reclaim_after_ms = 30000;
    return p;
}

/* Close the RocksDB handle (the options and the store object stay). */
static void db_close(hyla_store *st) {
    for (int i = 0; i < CF_COUNT; i++) {
        if (st->cf[i]) rocksdb_column_family_handle_destroy(st->cf[i]);
        st->cf[i] = NULL;
    }
    if (st->db) rocksdb_close(st->db);
    st->db = NULL;
}

#define WAL_KEEP_MAX 3 /* wal-damaged-* folders kept; older ones are removed */

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Remove all but the newest WAL_KEEP_MAX - 1 wal-damaged-* folders (their links hold disk). */
static void wal_keep_prune(hyla_store *st) {
    DIR *d = opendir(st->dir);
    if (!d) return;
    char *names[256];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 256)
        if (!strncmp(e->d_name, "wal-damaged-", 12) && (names[n] = strdup(e->d_name))) n++;
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    for (int i = 0; i < n; i++) {
        if (i < n - (WAL_KEEP_MAX - 1)) {
            char sub[4096];
            snprintf(sub, sizeof sub, "%s/%s", st->dir, names[i]);
            DIR *sd = opendir(sub);
            if (sd) {
                while ((e = readdir(sd))) {
                    if (e->d_name[0] == '.') continue;
                    char f[8192];
                    snprintf(f, sizeof f, "%s/%s", sub, e->d_name);
                    unlink(f);
                }
                closedir(sd);
            }
            if (rmdir(sub) == 0) HYLA_WARN("store %s: removed %s (only the newest %d are kept)", st->dir, sub, WAL_KEEP_MAX);
        }
        free(names[i]);
    }
}

/* Hard-link the WAL files into DIR/wal-damaged-TIME/ before a recovery that may drop records,
 * so what was dropped stays on disk for inspection (links cost no space until RocksDB deletes
 * its own names). *n = files kept. */
static void wal_keep(hyla_store *st, char *sub, size_t cap, int *n) {
    *n = 0;
    wal_keep_prune(st);
    snprintf(sub, cap, "%s/wal-damaged-%012lld", st->dir, (long long)time(NULL));
    if (mkdir(sub, 0700) != 0 && errno != EEXIST) {
        HYLA_ERROR("store %s: cannot keep the damaged WAL: mkdir %s: %s", st->dir, sub, strerror(errno));
        return;
    }
    DIR *d = opendir(st->dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 5 || strcmp(e->d_name + l - 4, ".log") != 0) continue;
        char from[4096], to[4096];
        snprintf(from, sizeof from, "%s/%s", st->dir, e->d_name);
        snprintf(to, sizeof to, "%s/%s", sub, e->d_name);
        if (link(from, to) == 0) (*n)++;
        else HYLA_ERROR("store %s: cannot keep %s: %s", st->dir, from, strerror(errno));
    }
    closedir(d);
}

static rocksdb_t *rdb_open(hyla_store *st, int wal_mode, char **err) {
    static const char *names[CF_COUNT] = {"default", HYLA_STORE_CF_CHUNKS, HYLA_STORE_CF_META};
    rocksdb_options_set_wal_recovery_mode(st->opt, wal_mode);
    if (st->p.read_only)
        return rocksdb_open_for_read_only_column_families(st->opt, st->dir, CF_COUNT, names,
                                                          (const rocksdb_options_t *const *)st->cf_opt, st->cf, 0, err);
    return rocksdb_open_column_families(st->opt, st->dir, CF_COUNT, names, (const rocksdb_options_t *const *)st->cf_opt,
                                        st->cf, err);
}

/* Background flushes and compactions that failed since the handle opened (and the open's own). */
static uint64_t bg_errors(hyla_store *st) {
    uint64_t n = 0;
    if (st->db) rocksdb_property_int(st->db, "rocksdb.background-errors", &n);
    return n;
}

/* Open the RocksDB handle. WAL recovery: first with absolute consistency (any damaged record
 * refuses the open); on damage, the WAL files are kept aside (wal_keep) and the open is retried
 * with point-in-time recovery, which replays up to the damage and drops the rest. The drop is
 * logged as an error and kept in recovery_note; a session whose committed version was dropped
 * answers HYLA_ERR_CORRUPT naming it (view_manifest). */
static hyla_status db_open(hyla_store *st, int first) {
    char *err = NULL;
    st->db = rdb_open(st, 1 /* kAbsoluteConsistency */, &err);
    if (err && strstr(err, "Corruption")) {
        char sub[4096] = "";
        int kept = 0;
        if (!st->p.read_only) wal_keep(st, sub, sizeof sub, &kept);
        char note[sizeof st->recovery_note];
        snprintf(note, sizeof note,
                 "store %s: the write-ahead log is damaged (%s); recovered up to the damage, the writes after it are lost "
                 "(after a crash during a write, that write was never acknowledged)%s%s%s",
                 st->dir, err, kept ? "; the damaged log is kept in " : "", kept ? sub : "",
                 kept ? "" : " (the log could not be kept)");
        rocksdb_free(err);
        err = NULL;
        memset(st->cf, 0, sizeof st->cf);
        st->db = rdb_open(st, 2 /* kPointInTimeRecovery */, &err);
        if (!err) {
            snprintf(st->recovery_note, sizeof st->recovery_note, "%s", note);
            HYLA_ERROR("%s; sessions whose committed version was lost answer DATA_LOSS", note);
        }
    }
    if (err) {
        hyla_status s = is_nospace(err) ? fail_nospace(st, "open", err) : rdb_fail(err, HYLA_ERR_IO, "open", st->dir);
        if (is_nospace(err)) rocksdb_free(err);
        memset(st->cf, 0, sizeof st->cf);
        st->db = NULL;
        return s;
    }
    /* format marker */
    char *v;
    size_t vl;
    hyla_status s = db_get(st, NULL, CF_META, "F", 1, &v, &vl);
    if (s == HYLA_OK) {
        int ok = vl == strlen(STORE_FORMAT) && !memcmp(v, STORE_FORMAT, vl);
        if (!ok)
            s = hyla_fail(HYLA_ERR_UNSUPPORTED, "store %s: unknown store format '%.*s' (this build reads '%s')", st->dir,
                          (int)(vl < 64 ? vl : 64), v, STORE_FORMAT);
        rocksdb_free(v);
    } else if (s == HYLA_ERR_NOT_FOUND && !st->p.read_only) {
        rocksdb_writebatch_t *b = rocksdb_writebatch_create();
        rocksdb_writebatch_put_cf(b, st->cf[CF_META], "F", 1, STORE_FORMAT, strlen(STORE_FORMAT));
        s = store_write(st, b, 1, "write format marker");
        rocksdb_writebatch_destroy(b);
    } else if (s == HYLA_ERR_NOT_FOUND) {
        s = HYLA_OK; /* read-only view of an empty store */
    }
    if (s == HYLA_OK && st->p.gc_on_open && !st->p.read_only) {
        delta_list z = {0};
        hyla_status gs = zero_ref_keys(st, &z);
        uint64_t nf = 0;
        if (gs == HYLA_OK) gs = free_chunks(st, &z, &nf, NULL);
        if (nf) HYLA_INFO("store %s: deleted %llu unreferenced chunks left by an interrupted write", st->dir, (unsigned long long)nf);
        free(z.d);
        if (gs != HYLA_OK) {
            if (first && gs != HYLA_ERR_RESOURCE) s = gs;
            else HYLA_WARN("store %s: deleting unreferenced chunks: %s (retried by gc)", st->dir, hyla_last_error());
        }
    }
    if (s != HYLA_OK) db_close(st);
    else st->bg_base = bg_errors(st);
    return s;
}

/* The reserve file: p.reserve_bytes of disk held back for deletes on a full disk. */
static hyla_status reserve_make(hyla_store *st) {
    if (st->reserve_held) return HYLA_OK;
    if (!st->p.reserve_bytes) {
        st->reserve_held = 1;
        return HYLA_OK;
    }
    int fd = open(st->reserve_path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) return hyla_fail(HYLA_ERR_IO, "store %s: cannot create %s: %s", st->dir, st->reserve_path, strerror(errno));
    int e = posix_fallocate(fd, 0, (off_t)st->p.reserve_bytes);
    if (e == EOPNOTSUPP || e == EINVAL) { /* no fallocate here: write the blocks */
        static const char zero[65536];
        e = 0;
        for (uint64_t o = 0; o < st->p.reserve_bytes && !e; o += sizeof zero) {
            size_t n = st->p.reserve_bytes - o < sizeof zero ? (size_t)(st->p.reserve_bytes - o) : sizeof zero;
            if (pwrite(fd, zero, n, (off_t)o) != (ssize_t)n) e = errno ? errno : EIO;
        }
    }
    if (!e && fsync(fd) != 0) e = errno;
    close(fd);
    if (e) {
        unlink(st->reserve_path);
        uint64_t avail, total;
        disk_space(st->dir, &avail, &total);
        if (e == ENOSPC || e == EDQUOT)
            return hyla_fail(HYLA_ERR_RESOURCE,
                             "store %s is out of disk space (%.1f MiB free of %.1f MiB): no room for the %.1f MiB reserve "
                             "that keeps deletes possible; delete sessions or add space (writes resume by themselves)",
                             st->dir, MIB(avail), MIB(total), MIB(st->p.reserve_bytes));
        return hyla_fail(HYLA_ERR_IO, "store %s: reserve file %s: %s", st->dir, st->reserve_path, strerror(e));
    }
    st->reserve_held = 1;
    return HYLA_OK;
}

static void reserve_release(hyla_store *st) {
    if (st->reserve_held && st->p.reserve_bytes) {
        unlink(st->reserve_path);
        HYLA_WARN("store %s: disk full: released the %.1f MiB reserve so deletes and GC can run", st->dir,
                  MIB(st->p.reserve_bytes));
    }
    st->reserve_held = 0;
}

/* Make a full store usable again (caller holds db_lock exclusively). freeing: the caller is
 * about to free space (delete, GC): the reserve is given up for it. Otherwise the reserve must
 * be re-made first (RESOURCE while it does not fit). A RocksDB handle that stopped writes is
 * reopened. */
static hyla_status recover_locked(hyla_store *st, int freeing) {
    if (!atomic_load(&st->full) && st->db) return HYLA_OK;
    if (freeing) reserve_release(st);
    else HYLA_TRY(reserve_make(st));
    if (atomic_load(&st->broken) || !st->db) {
        db_close(st);
        hyla_status s = db_open(st, 0);
        if (s != HYLA_OK) {
            atomic_store(&st->full, 1);
            atomic_store(&st->broken, 1);
            return hyla_fail_wrap(s, "store %s: reopening after a failed write", st->dir);
        }
        atomic_store(&st->broken, 0);
    }
    if (st->reserve_held && atomic_load(&st->full)) {
        uint64_t avail, total;
        disk_space(st->dir, &avail, &total);
        atomic_store(&st->full, 0);
        HYLA_INFO("store %s: writes resumed (%.1f MiB free of %.1f MiB, %.1f MiB reserved)", st->dir, MIB(avail), MIB(total),
                  MIB(st->p.reserve_bytes));
    }
    return HYLA_OK;
}

/* Flush both column families (their WAL files become obsolete and are deleted) and compact
 * them, so chunks deleted since the last pass give their space back: blob files whose chunks
 * are all deleted are dropped once no table references them. Blob files that still hold live
 * chunks are left to RocksDB's blob GC (the oldest quarter) and to hyla_store_gc (every file),
 * so this pass rewrites only the small key tables. Caller holds db_lock shared. */
static void reclaim(hyla_store *st) {
    pthread_mutex_lock(&st->reclaim_mu);
    atomic_store(&st->garbage_bytes, 0);
    atomic_store(&st->garbage_since, 0.0);
    char *err = NULL;
    rocksdb_flushoptions_t *fo = rocksdb_flushoptions_create();
    rocksdb_flushoptions_set_wait(fo, 1);
    for (int cf = CF_CHUNKS; cf <= CF_META && !err; cf++) rocksdb_flush_cf(st->db, fo, st->cf[cf], &err);
    rocksdb_flushoptions_destroy(fo);
    if (err) {
        (void)write_fail(st, err, "reclaim: flush");
        HYLA_WARN("%s (retried)", hyla_last_error());
        atomic_store(&st->garbage_since, hyla_now()); /* try again a reclaim delay from now */
        pthread_mutex_unlock(&st->reclaim_mu);
        return;
    }
    const char *keys[1] = {"blob_garbage_collection_age_cutoff"};
    const char *none[1] = {"0.0"}, *normal[1] = {"0.25"};
    rocksdb_set_options_cf(st->db, st->cf[CF_CHUNKS], 1, keys, none, &err);
    rocksdb_free(err);
    err = NULL;
    /* CompactRange reports no error: a compaction that met a full disk shows as a new
     * background error, after which RocksDB compacts no more until it is reopened */
    uint64_t bg0 = 0, bg1 = 0;
    rocksdb_property_int(st->db, "rocksdb.background-errors", &bg0);
    rocksdb_compact_range_cf(st->db, st->cf[CF_CHUNKS], NULL, 0, NULL, 0);
    rocksdb_compact_range_cf(st->db, st->cf[CF_META], NULL, 0, NULL, 0);
    rocksdb_property_int(st->db, "rocksdb.background-errors", &bg1);
    rocksdb_set_options_cf(st->db, st->cf[CF_CHUNKS], 1, keys, normal, &err);
    rocksdb_free(err);
    if (bg1 > bg0) {
        HYLA_WARN("store %s: reclaim: a compaction failed (disk full?); reopening and retrying", st->dir);
        atomic_store(&st->broken, 1);
        atomic_store(&st->full, 1);
        atomic_store(&st->garbage_since, hyla_now());
    } else {
        atomic_fetch_add(&st->gc_runs, 1);
    }
    pthread_mutex_unlock(&st->reclaim_mu);
}

/* The reclaim thread: every tick, a full store tries to resume (reserve re-made, RocksDB
 * reopened) and chunks deleted at least reclaim_after_ms ago get their space back. */
static void *maint_main(void *arg) {
    hyla_store *st = arg;
    uint32_t tick = st->p.reclaim_after_ms ? st->p.reclaim_after_ms / 4 : 1000;
    if (tick < 20) tick = 20;
    if (tick > 1000) tick = 1000;
    pthread_mutex_lock(&st->maint_mu);
    while (!st->stopping) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += (long)(tick % 1000) * 1000000L;
        ts.tv_sec += tick / 1000 + ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&st->maint_cv, &st->maint_mu, &ts);
        if (st->stopping) break;
        pthread_mutex_unlock(&st->maint_mu);
        if (atomic_load(&st->full)) {
            pthread_rwlock_wrlock(&st->db_lock);
            /* quietly until the reserve fits; a stopped RocksDB is reopened meanwhile anyway, so
             * the reclaim below can free space */
            if (recover_locked(st, 0) != HYLA_OK && (atomic_load(&st->broken) || !st->db)) (void)recover_locked(st, 1);
            pthread_rwlock_unlock(&st->db_lock);
        }
        double since = atomic_load(&st->garbage_since);
        if (st->p.reclaim_after_ms && since > 0 && hyla_now() - since >= st->p.reclaim_after_ms / 1000.0) {
            pthread_rwlock_rdlock(&st->db_lock);
            if (st->db) reclaim(st);
            pthread_rwlock_unlock(&st->db_lock);
        }
        pthread_mutex_lock(&st->maint_mu);
    }
    pthread_mutex_unlock(&st->maint_mu);
    return NULL;
}

void hyla_store_close(hyla_store *st) {
    if (!st) return;
    if (st->maint_running) {
        pthread_mutex_lock(&st->maint_mu);
        st->stopping = 1;
        pthread_cond_signal(&st->maint_cv);
        pthread_mutex_unlock(&st->maint_mu);
        pthread_join(st->maint, NULL);
    }
    db_close(st);
    for (int i = 0; i < CF_COUNT; i++)
        if (st->cf_opt[i]) rocksdb_options_destroy(st->cf_opt[i]);
    if (st->opt) rocksdb_options_destroy(st->opt);
    if (st->wo_commit) rocksdb_writeoptions_destroy(st->wo_commit);
    if (st->wo_chunks) rocksdb_writeoptions_destroy(st->wo_chunks);
    if (st->wo_plain) rocksdb_writeoptions_destroy(st->wo_plain);
    if (st->ro) rocksdb_readoptions_destroy(st->ro);
    pthread_mutex_destroy(&st->mu);
    pthread_rwlock_destroy(&st->gc_lock);
    pthread_rwlock_destroy(&st->db_lock);
    pthread_mutex_destroy(&st->reclaim_mu);
    pthread_mutex_destroy(&st->maint_mu);
    pthread_cond_destroy(&st->maint_cv);
    free(st->reserve_path);
    free(st->dir);
    free(st);
}

hyla_status hyla_store_open(const char *dir, const hyla_store_params *pin, hyla_store **out) {
    hyla_store_params p = pin ? *pin : hyla_store_default_params();
    if (p.keep_versions < 1) p.keep_versions = 1;
    const char *mm = getenv("HYLA_STORE_MMAP_READS");
    if (mm && *mm) {
        if (strcmp(mm, "0") && strcmp(mm, "1"))
            return hyla_fail(HYLA_ERR_INVALID_ARG, "HYLA_STORE_MMAP_READS='%s': 0 or 1", mm);
        p.mmap_reads = mm[0] == '1';
    }
    struct stat sb;
    if (stat(dir, &sb) != 0) {
        if (!p.create_if_missing || p.read_only)
            return hyla_fail(HYLA_ERR_NOT_FOUND, "store %s: no such directory", dir);
        HYLA_TRY(hyla_mkdirs(dir));
    }
    hyla_store *st = calloc(1, sizeof *st);
    if (!st) return hyla_fail(HYLA_ERR_NOMEM, "store");
    pthread_mutex_init(&st->mu, NULL);
    pthread_rwlock_init(&st->gc_lock, NULL);
    pthread_rwlock_init(&st->db_lock, NULL);
    pthread_mutex_init(&st->reclaim_mu, NULL);
    pthread_mutex_init(&st->maint_mu, NULL);
    pthread_cond_init(&st->maint_cv, NULL);
    st->dir = strdup(dir);
    st->p = p;
    size_t rl = strlen(dir) + sizeof RESERVE_NAME + 2;
    st->reserve_path = malloc(rl);
    if (st->reserve_path) snprintf(st->reserve_path, rl, "%s/%s", dir, RESERVE_NAME);
    st->opt = rocksdb_options_create();
    rocksdb_options_set_create_if_missing(st->opt, (unsigned char)p.create_if_missing);
    rocksdb_options_set_create_missing_column_families(st->opt, 1);
    rocksdb_options_set_max_background_jobs(st->opt, 2);
    /* WAL files live until every column family with data in them has flushed; the meta family
     * takes small writes and would keep gigabytes of chunk values alive in old logs. Twice the
     * chunk memtable bounds the logs and makes RocksDB flush the family that holds them. */
    rocksdb_options_set_max_total_wal_size(st->opt, 2 * p.write_buffer_bytes);
    /* start writeback of blob/SST files while they are written (sync_file_range every 8 MiB), so
     * the fsync at the end of a large put has little left to do */
    rocksdb_options_set_bytes_per_sync(st->opt, 8ull << 20);
    /* RocksDB's own LOG gets only its start-up header: librocksdb 7.8 (Debian's build keeps its
     * assertions) aborts the process when it logs again after the LOG file met a full disk.
     * Failures reach the operator through this store's statuses and log lines instead. */
    rocksdb_options_set_info_log_level(st->opt, 4 /* FATAL_LEVEL */);
    /* a chunk's Get copies the value out of the page cache into RocksDB's read buffer and again
     * into the value it returns; through mmap the first copy is a pointer into the mapping */
    if (p.mmap_reads) rocksdb_options_set_allow_mmap_reads(st->opt, 1);
    for (int i = 0; i < CF_COUNT; i++) {
        st->cf_opt[i] = rocksdb_options_create();
        rocksdb_options_set_compression(st->cf_opt[i], rocksdb_no_compression);
    }
    rocksdb_options_t *co = st->cf_opt[CF_CHUNKS];
    rocksdb_options_set_enable_blob_files(co, 1);
    rocksdb_options_set_min_blob_size(co, 0);
    rocksdb_options_set_blob_file_size(co, 256ull << 20);
    rocksdb_options_set_blob_compression_type(co, rocksdb_no_compression);
    rocksdb_options_set_enable_blob_gc(co, 1);
    rocksdb_options_set_blob_gc_age_cutoff(co, 0.25);
    rocksdb_options_set_write_buffer_size(co, (size_t)p.write_buffer_bytes);
    rocksdb_options_set_max_write_buffer_number(co, 6);
    st->wo_commit = rocksdb_writeoptions_create();
    rocksdb_writeoptions_set_sync(st->wo_commit, (unsigned char)(p.sync != 0));
    st->wo_chunks = rocksdb_writeoptions_create();
    rocksdb_writeoptions_disable_WAL(st->wo_chunks, 1);
    st->wo_plain = rocksdb_writeoptions_create();
    st->ro = rocksdb_readoptions_create();
    if (!st->dir || !st->reserve_path) {
        hyla_store_close(st);
        return hyla_fail(HYLA_ERR_NOMEM, "store");
    }
    hyla_status s = db_open(st, 1);
    if (s == HYLA_OK && !p.read_only) {
        /* a store opened on a full disk still opens (reads, deletes); puts wait for the reserve */
        if (reserve_make(st) != HYLA_OK) {
            HYLA_WARN("%s", hyla_last_error());
            atomic_store(&st->full, 1);
        }
        if (pthread_create(&st->maint, NULL, maint_main, st) == 0) st->maint_running = 1;
        else s = hyla_fail(HYLA_ERR_NOMEM, "store %s: cannot start the reclaim thread", dir);
    }
    if (s != HYLA_OK) {
        hyla_store_close(st);
        return s;
    }
    *out = st;
    return HYLA_OK;
}

/* ---------------------------------------------------------------- put */

/* Chunk reads for the codec (gets, and the base of an incremental put). */
typedef struct {
    hyla_store *st;
    const rocksdb_readoptions_t *ro;
} fetch_ctx;

static hyla_status store_fetch(void *ctx, const hyla_manifest *m, size_t i, const uint8_t **val, size_t *len,
                               void **tok) {
    fetch_ctx *f = ctx;
    char *err = NULL;
    rocksdb_pinnableslice_t *ps =
        rocksdb_get_pinned_cf(f->st->db, f->ro, f->st->cf[CF_CHUNKS], (const char *)m->chunks[i].key, HYLA_CHUNK_KEY_BYTES, &err);
    if (err) {
        hyla_status s = hyla_fail(HYLA_ERR_IO, "read failed: %s", err);
        rocksdb_free(err);
        return s;
    }
    if (!ps) return HYLA_ERR_NOT_FOUND;
    *val = (const uint8_t *)rocksdb_pinnableslice_value(ps, len);
    *tok = ps;
    return HYLA_OK;
}

static void store_release(void *ctx, void *tok) {
    (void)ctx;
    if (tok) rocksdb_pinnableslice_destroy(tok);
}


static int cmp_idx_key(const void *a, const void *b, void *ctx) {
    const hyla_codec_plan *pl = ctx;
    size_t i = *(const size_t *)a, j = *(const size_t *)b;
    int c = memcmp(pl->chunks[i].ref.key, pl->chunks[j].ref.key, HYLA_CHUNK_KEY_BYTES);
    return c ? c : (i < j ? -1 : i > j);
}

static int cmp_size(const void *a, const void *b) {
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? -1 : x > y;
}

static int ref_exists(hyla_store *st, const uint8_t *ckey, hyla_status *err) {
    char k[KEY_MAX], *v;
    size_t vl;
    hyla_status s = db_get(st, NULL, CF_META, k, key_ref(k, ckey), &v, &vl);
    if (s == HYLA_OK) {
        rocksdb_free(v);
        return 1;
    }
    if (s != HYLA_ERR_NOT_FOUND) *err = s;
    return 0;
}

/* Write the encoded chunks need[a..b) that are still absent (caller holds gc_lock shared).
 * Every chunk goes with its R record (refs 0) in the same batch. */
static hyla_status write_chunks(hyla_store *st, hyla_codec_plan *pl, const size_t *need, size_t a, size_t b,
                                int nowal, delta_list *written, hyla_store_put_stats *ps) {
    hyla_status s = HYLA_OK;
    size_t i = a;
    while (i < b && s == HYLA_OK) {
        pthread_mutex_lock(&st->mu);
        rocksdb_writebatch_t *wb = rocksdb_writebatch_create(), *rb = rocksdb_writebatch_create();
        size_t bytes = 0, cnt = 0, raw = 0, first = i;
        for (; i < b && bytes < BATCH_BYTES; i++) {
            hyla_plan_chunk *c = &pl->chunks[need[i]];
            if (ref_exists(st, c->ref.key, &s)) continue; /* another put wrote it meanwhile */
            if (s != HYLA_OK) break;
            char k[KEY_MAX];
            uint8_t rv[REF_BYTES];
            hyla_put_le64(rv, 0);
            hyla_put_le32(rv + 8, (uint32_t)c->value_len);
            hyla_put_le32(rv + 12, 0);
            rocksdb_writebatch_put_cf(wb, st->cf[CF_CHUNKS], (const char *)c->ref.key, HYLA_CHUNK_KEY_BYTES,
                                      (const char *)c->value, c->value_len);
            rocksdb_writebatch_put_cf(nowal ? rb : wb, st->cf[CF_META], k, key_ref(k, c->ref.key),
                                      (const char *)rv, REF_BYTES);
            bytes += c->value_len;
            raw += c->ref.raw_len;
            cnt++;
        }
        /* large puts: chunk values skip the WAL (flushed before the commit, see flush_chunks);
         * their R records go through the WAL after them, so a crash leaves at worst an R record
         * without its chunk, which gc_on_open removes. Small puts: both in one WAL batch. */
        if (s == HYLA_OK && cnt) s = store_write(st, wb, nowal ? 0 : 2, "write chunks");
        if (s == HYLA_OK && cnt && nowal) {
            st->nowal_seq++;
            s = store_write(st, rb, 2, "write chunk records");
        }
        if (s == HYLA_OK) {
            for (size_t j = first; j < i; j++)
                if (delta_add(written, pl->chunks[need[j]].ref.key, 0)) s = hyla_fail(HYLA_ERR_NOMEM, "chunk list");
            ps->chunks_written += cnt;
            ps->bytes_written += bytes;
            ps->raw_bytes_written += raw;
        }
        rocksdb_writebatch_destroy(wb);
        rocksdb_writebatch_destroy(rb);
        pthread_mutex_unlock(&st->mu);
    }
    return s;
}

/* A chunk group written on its own thread while the next group is encoded. */
typedef struct {
    hyla_store *st;
    hyla_codec_plan *pl;
    const size_t *need;
    size_t a, b;
    int nowal;
    delta_list *written;
    hyla_store_put_stats *ps;
    hyla_status status;
    char msg[2048];
} write_job;

static void *write_job_run(void *arg) {
    write_job *j = arg;
    j->status = write_chunks(j->st, j->pl, j->need, j->a, j->b, j->nowal, j->written, j->ps);
    if (j->status != HYLA_OK) snprintf(j->msg, sizeof j->msg, "%s", hyla_last_error());
    return NULL;
}

/* Wait for the running write job (if any), release its values, and return its status. */
static hyla_status write_job_join(write_job *j, pthread_t *th, int *running) {
    if (!*running) return HYLA_OK;
    pthread_join(*th, NULL);
    *running = 0;
    for (size_t k = j->a; k < j->b; k++) hyla_codec_plan_release(j->pl, j->need[k]);
    if (j->status != HYLA_OK) return hyla_fail(j->status, "%s", j->msg);
    return HYLA_OK;
}

/* Make every chunk written so far durable (durable mode writes chunk values without the WAL):
 * flush the chunk column family's memtables to blob files and wait. Called after a put's
 * existence checks, so it also covers chunks of concurrent puts this put references. */
static hyla_status flush_chunks(hyla_store *st) {
    pthread_mutex_lock(&st->mu);
    uint64_t seq = st->nowal_seq, done = st->flushed_seq;
    pthread_mutex_unlock(&st->mu);
    if (done >= seq) return HYLA_OK; /* every chunk batch so far went through the WAL or was flushed */
    char *err = NULL;
    rocksdb_flushoptions_t *fo = rocksdb_flushoptions_create();
    rocksdb_flushoptions_set_wait(fo, 1);
    rocksdb_flush_cf(st->db, fo, st->cf[CF_CHUNKS], &err);
    rocksdb_flushoptions_destroy(fo);
    if (err) return write_fail(st, err, "flush chunks");
    pthread_mutex_lock(&st->mu);
    if (st->flushed_seq < seq) st->flushed_seq = seq;
    pthread_mutex_unlock(&st->mu);
    return HYLA_OK;
}

/* Commit the manifest of pl as the next version of sid (caller holds gc_lock shared). */
static hyla_status commit(hyla_store *st, const char *sid, hyla_codec_plan *pl, const hyla_manifest *fork_src,
                          const uint8_t *mbytes, size_t mlen, uint64_t mchecksum, int must_be_new, uint64_t *ver_out,
                          delta_list *zero, hyla_store_put_stats *ps) {
    pthread_mutex_lock(&st->mu);
    hyla_status s = HYLA_OK;
    head_val h = {0, 1, 0};
    uint64_t *vers = NULL;
    size_t nv = 0;
    delta_list dl = {0};
    rocksdb_writebatch_t *b = rocksdb_writebatch_create();
    char what[400];
    snprintf(what, sizeof what, "session %s", sid);
    s = read_head(st, NULL, sid, &h);
    if (s == HYLA_OK && must_be_new) {
        s = hyla_fail(HYLA_ERR_EXISTS, "session %s already exists", sid);
        goto done;
    }
    if (s == HYLA_ERR_NOT_FOUND) {
        h.version = 0;
        h.next = 1;
        s = HYLA_OK;
    }
    if (s != HYLA_OK) goto done;
    if ((s = list_versions(st, NULL, sid, &vers, &nv)) != HYLA_OK) goto done;
    uint64_t ver = h.next;
    /* references of the new manifest */
    int bad;
    if (pl) {
        uint8_t(*keys)[HYLA_CHUNK_KEY_BYTES] = malloc((pl->n_chunks + 1) * HYLA_CHUNK_KEY_BYTES);
        bad = !keys;
        for (size_t i = 0; !bad && i < pl->n_chunks; i++) memcpy(keys[i], pl->chunks[i].ref.key, HYLA_CHUNK_KEY_BYTES);
        bad = bad || delta_add_manifest_keys(&dl, (const uint8_t(*)[HYLA_CHUNK_KEY_BYTES])keys, pl->n_chunks, 1);
        free(keys);
    } else {
        bad = delta_add_manifest(&dl, fork_src, 1);
    }
    if (bad) {
        s = hyla_fail(HYLA_ERR_NOMEM, "reference list");
        goto done;
    }
    /* superseded versions beyond keep_versions */
    size_t drop = nv + 1 > st->p.keep_versions ? nv + 1 - st->p.keep_versions : 0;
    for (size_t i = 0; i < drop && i < nv; i++) {
        hyla_manifest *old = NULL;
        hyla_status rs = read_manifest(st, NULL, sid, vers[i], &old);
        if (rs == HYLA_OK) {
            if (delta_add_manifest(&dl, old, -1)) {
                hyla_manifest_destroy(old);
                s = hyla_fail(HYLA_ERR_NOMEM, "reference list");
                goto done;
            }
        } else {
            HYLA_WARN("%s: dropping unreadable version %llu without releasing its chunks: %s", what,
                      (unsigned long long)vers[i], hyla_last_error());
        }
        hyla_manifest_destroy(old);
        char k[KEY_MAX];
        rocksdb_writebatch_delete_cf(b, st->cf[CF_META], k, key_manifest(k, sid, vers[i]));
        rocksdb_writebatch_delete_cf(b, st->cf[CF_META], k, key_time(k, sid, vers[i]));
        if (ps) ps->versions_dropped++;
    }
    delta_merge(&dl);
    if ((s = delta_apply(st, &dl, b, zero, what)) != HYLA_OK) goto done;
    char k[KEY_MAX];
    rocksdb_writebatch_put_cf(b, st->cf[CF_META], k, key_manifest(k, sid, ver), (const char *)mbytes, mlen);
    uint8_t tv[TIME_BYTES];
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    hyla_put_le64(tv, (uint64_t)now.tv_sec * 1000000u + (uint64_t)now.tv_nsec / 1000u);
    hyla_put_le64(tv + 8, ps ? ps->bytes_written + mlen : 0);
    rocksdb_writebatch_put_cf(b, st->cf[CF_META], k, key_time(k, sid, ver), (const char *)tv, TIME_BYTES);
    head_val nh = {ver, ver + 1, mchecksum};
    uint8_t hb[HEAD_BYTES];
    head_encode(hb, &nh);
    rocksdb_writebatch_put_cf(b, st->cf[CF_META], k, key_head(k, sid), (const char *)hb, HEAD_BYTES);
    s = store_write(st, b, 1, "commit manifest and head");
    if (s == HYLA_OK && ver_out) *ver_out = ver;
done:
    rocksdb_writebatch_destroy(b);
    free(vers);
    free(dl.d);
    pthread_mutex_unlock(&st->mu);
    return s;
}

/* Plan an incremental put (caller holds gc_lock shared, so the base's chunks stay): read the
 * base manifest, choose the base chunks to reference, decode from the base only the shared bytes
 * not covered by them, then plan. */
static hyla_status plan_since(hyla_store *st, const char *sid, hyla_snapshot *snap, uint64_t base_version,
                              const uint64_t *shared, hyla_codec_plan **pl) {
    char what[400];
    snprintf(what, sizeof what, "session %s base version %llu", sid, (unsigned long long)base_version);
    if (!base_version)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "session %s: an incremental put needs a base version (0 given)", sid);
    HYLA_TRY(hyla_snapshot_require_whole(snap, "incremental put")); /* shared bytes are filled in place */
    hyla_manifest *base = NULL;
    hyla_status s = read_manifest(st, NULL, sid, base_version, &base);
    if (s == HYLA_ERR_NOT_FOUND)
        return hyla_fail(HYLA_ERR_NOT_FOUND, "session %s: base version %llu is not in store %s", sid,
                         (unsigned long long)base_version, st->dir);
    if (s != HYLA_OK) return s;
    uint64_t *from = calloc(snap->n_parts + 1, sizeof *from);
    if (!from) s = hyla_fail(HYLA_ERR_NOMEM, "put");
    for (uint32_t i = 0; s == HYLA_OK && i < snap->n_parts; i++) {
        const hyla_state_part *sp = &snap->parts[i];
        if (shared[i] > sp->nbytes)
            s = hyla_fail(HYLA_ERR_INVALID_ARG, "session %s: layer %u part '%s': %llu shared bytes, the part has %llu", sid,
                          sp->layer, sp->name, (unsigned long long)shared[i], (unsigned long long)sp->nbytes);
    }
    if (s == HYLA_OK) s = hyla_codec_plan_reuse(snap, &st->p.codec, base, shared, from);
    if (s == HYLA_OK) {
        fetch_ctx f = {st, st->ro};
        s = hyla_codec_decode_range(base, store_fetch, store_release, &f, what, st->p.codec.threads, snap, from, shared);
    }
    if (s == HYLA_OK) s = hyla_codec_plan_create_reusing(snap, &st->p.codec, base, shared, pl);
    free(from);
    hyla_manifest_destroy(base);
    return s;
}

/* A put: plan (from the whole snapshot, or with shared != NULL incrementally on base_version),
 * write the chunks the store lacks, commit. */
static hyla_status put_impl(hyla_store *st, const char *sid, hyla_snapshot *snap, uint64_t base_version,
                            const uint64_t *shared, uint64_t *version, hyla_store_put_stats *stats) {
    HYLA_TRY(check_session_id(sid));
    if (st->p.read_only) return hyla_fail(HYLA_ERR_UNSUPPORTED, "store %s is open read-only", st->dir);
    hyla_store_put_stats ps;
    memset(&ps, 0, sizeof ps);
    double t0 = hyla_now();
    hyla_codec_plan *pl = NULL;
    hyla_status s;
    if (shared) {
        /* held from reading the base manifest to the commit: its chunks cannot be freed meanwhile */
        pthread_rwlock_rdlock(&st->gc_lock);
        s = plan_since(st, sid, snap, base_version, shared, &pl);
        if (s != HYLA_OK) pthread_rwlock_unlock(&st->gc_lock);
    } else {
        s = hyla_codec_plan_create(snap, &st->p.codec, &pl);
    }
    if (s != HYLA_OK) return hyla_fail_wrap(s, "session %s: put", sid);
    double t1 = hyla_now();
    ps.seconds_plan = t1 - t0;
    ps.raw_bytes = hyla_snapshot_bytes(snap);
    ps.chunks = pl->n_chunks;
    size_t *order = malloc((pl->n_chunks + 1) * sizeof *order), *need = malloc((pl->n_chunks + 1) * sizeof *need);
    size_t n_need = 0;
    delta_list written = {0}, zero = {0};
    if (!order || !need) {
        if (shared) pthread_rwlock_unlock(&st->gc_lock);
        s = hyla_fail(HYLA_ERR_NOMEM, "put");
        goto out;
    }
    if (!shared) pthread_rwlock_rdlock(&st->gc_lock);
    /* which distinct chunks does the store lack? */
    for (size_t i = 0; i < pl->n_chunks; i++) order[i] = i;
    qsort_r(order, pl->n_chunks, sizeof *order, cmp_idx_key, pl);
    for (size_t j = 0; j < pl->n_chunks && s == HYLA_OK; j++) {
        size_t i = order[j];
        if (j > 0 && !memcmp(pl->chunks[order[j - 1]].ref.key, pl->chunks[i].ref.key, HYLA_CHUNK_KEY_BYTES)) continue;
        if (!ref_exists(st, pl->chunks[i].ref.key, &s) && s == HYLA_OK) {
            if (pl->chunks[i].reused) {
                const hyla_state_part *sp = &snap->parts[pl->chunks[i].ref.part];
                s = hyla_fail(HYLA_ERR_CORRUPT, "session %s base version %llu: layer %u part '%s' chunk %u is missing from store %s",
                              sid, (unsigned long long)base_version, sp->layer, sp->name, pl->chunks[i].ref.index, st->dir);
            } else {
                need[n_need++] = i;
            }
        }
    }
    /* keep manifest order for locality; encode and write in groups */
    qsort(need, n_need, sizeof *need, cmp_size);
    uint64_t need_raw = 0;
    for (size_t j = 0; j < n_need; j++) need_raw += pl->chunks[need[j]].ref.raw_len;
    int nowal = st->p.sync && need_raw >= st->p.nowal_bytes;
    /* refuse up front what cannot fit (WAL-path chunks are written twice: log, then blob file),
     * rather than drive RocksDB into its stopped state */
    if (s == HYLA_OK && n_need) {
        uint64_t avail, total, est = need_raw * (nowal ? 1 : 2) + (1ull << 20);
        disk_space(st->dir, &avail, &total);
        if (total && avail < est)
            s = hyla_fail(HYLA_ERR_RESOURCE,
                          "store %s is out of disk space: this snapshot needs about %.1f MiB, %.1f MiB free of %.1f MiB "
                          "(%.1f MiB more reserved for deletes)",
                          st->dir, MIB(est), MIB(avail), MIB(total), st->reserve_held ? MIB(st->p.reserve_bytes) : 0.0);
    }
    /* pipeline: encode group g+1 (on the codec threads) while group g is written */
    write_job job;
    pthread_t wth;
    int running = 0;
    double tw0 = hyla_now();
    for (size_t a = 0; a < n_need && s == HYLA_OK;) {
        size_t b = a, raw = 0;
        while (b < n_need && (raw < GROUP_BYTES || b == a)) raw += pl->chunks[need[b++]].ref.raw_len;
        for (size_t j = a; j < b; j++) pl->chunks[need[j]].want = 1;
        double te = hyla_now();
        s = hyla_codec_plan_encode(pl);
        ps.seconds_encode += hyla_now() - te;
        hyla_status js = write_job_join(&job, &wth, &running);
        if (s == HYLA_OK) s = js;
        if (s != HYLA_OK) break;
        job = (write_job){st, pl, need, a, b, nowal, &written, &ps, HYLA_OK, {0}};
        if (pthread_create(&wth, NULL, write_job_run, &job) == 0) {
            running = 1;
        } else {
            write_job_run(&job);
            for (size_t k = a; k < b; k++) hyla_codec_plan_release(pl, need[k]);
            if (job.status != HYLA_OK) s = hyla_fail(job.status, "%s", job.msg);
        }
        a = b;
    }
    hyla_status js = write_job_join(&job, &wth, &running);
    if (s == HYLA_OK) s = js;
    ps.seconds_write = hyla_now() - tw0 - ps.seconds_encode; /* writing not hidden behind encoding */
    if (s == HYLA_OK) {
        double tf = hyla_now();
        s = flush_chunks(st);
        ps.seconds_write += hyla_now() - tf;
    }
    if (s == HYLA_OK) {
        double tc = hyla_now();
        s = commit(st, sid, pl, NULL, pl->manifest, pl->manifest_len, pl->checksum, 0, &ps.version, &zero, &ps);
        ps.seconds_commit = hyla_now() - tc;
        ps.manifest_bytes = pl->manifest_len;
        ps.bytes_written += pl->manifest_len;
    }
    pthread_rwlock_unlock(&st->gc_lock);
    if (s != HYLA_OK) {
        /* chunks written by this failed put are unreferenced: delete them (best effort) */
        hyla_status fs = s;
        char msg[2048];
        snprintf(msg, sizeof msg, "%s", hyla_last_error());
        if (written.n) free_chunks(st, &written, NULL, NULL);
        s = hyla_fail(fs, "session %s: put failed, previous version kept: %s", sid, msg);
    } else if (zero.n) {
        hyla_status gs = free_chunks(st, &zero, &ps.chunks_freed, NULL);
        if (gs != HYLA_OK) HYLA_WARN("session %s: deleting unreferenced chunks: %s (hyla-state gc retries)", sid, hyla_last_error());
    }
out:
    free(order);
    free(need);
    free(written.d);
    free(zero.d);
    hyla_codec_plan_destroy(pl);
    if (s == HYLA_OK) {
        atomic_fetch_add(&st->versions_dropped, ps.versions_dropped);
        if (version) *version = ps.version;
        if (stats) *stats = ps;
    }
    return s;
}

/* ---------------------------------------------------------------- get */

/* A read view: a RocksDB snapshot + read options. */
typedef struct {
    const rocksdb_snapshot_t *snap;
    rocksdb_readoptions_t *ro;
} read_view;

static void view_open(hyla_store *st, read_view *v) {
    v->snap = rocksdb_create_snapshot(st->db);
    v->ro = rocksdb_readoptions_create();
    rocksdb_readoptions_set_snapshot(v->ro, v->snap);
    /* every chunk and manifest carries its own xxh64, checked on decode; RocksDB's CRC of blob
     * records on top would only cost time */
    rocksdb_readoptions_set_verify_checksums(v->ro, 0);
}

static void view_close(hyla_store *st, read_view *v) {
    rocksdb_readoptions_destroy(v->ro);
    rocksdb_release_snapshot(st->db, v->snap);
}

/* Resolve version 0 to the head and read + parse the manifest through v. */
static hyla_status view_manifest(hyla_store *st, read_view *v, const char *sid, uint64_t version, hyla_manifest **m,
                                 uint64_t *ver_out) {
    HYLA_TRY(check_session_id(sid));
    head_val h;
    HYLA_TRY(read_head(st, v->ro, sid, &h));
    uint64_t ver = version ? version : h.version;
    hyla_status s = read_manifest(st, v->ro, sid, ver, m);
    if (s == HYLA_ERR_NOT_FOUND && ver == h.version)
        return hyla_fail(HYLA_ERR_CORRUPT, "session %s version %llu: the head names it but its manifest is missing from store %s",
                         sid, (unsigned long long)ver, st->dir);
    if (s == HYLA_ERR_NOT_FOUND && ver > h.version)
        /* versions are numbered by this store only, so a caller naming one above the head was
         * told it was committed: the store lost it (see the startup log's WAL recovery) */
        return hyla_fail(HYLA_ERR_CORRUPT,
                         "session %s version %llu: committed but missing from store %s, whose newest version of the session is %llu%s%s",
                         sid, (unsigned long long)ver, st->dir, (unsigned long long)h.version,
                         st->recovery_note[0] ? "; at start-up: " : "", st->recovery_note);
    if (s != HYLA_OK) return s;
    if (ver == h.version && (*m)->checksum != h.checksum) {
        uint64_t mc = (*m)->checksum;
        hyla_manifest_destroy(*m);
        *m = NULL;
        return hyla_fail(HYLA_ERR_CORRUPT, "session %s version %llu: manifest checksum %016llx differs from the head's %016llx",
                         sid, (unsigned long long)ver, (unsigned long long)mc, (unsigned long long)h.checksum);
    }
    *ver_out = ver;
    return HYLA_OK;
}

static hyla_status get_manifest_impl(hyla_store *st, const char *sid, uint64_t version, hyla_manifest **out,
                                    uint64_t *version_out) {
    read_view v;
    view_open(st, &v);
    uint64_t ver = 0;
    hyla_status s = view_manifest(st, &v, sid, version, out, &ver);
    view_close(st, &v);
    if (s == HYLA_OK && version_out) *version_out = ver;
    return s;
}

/* The manifest of a get through v: version resolved, fingerprint checked; `what` (400 bytes)
 * receives the name for messages. */
static hyla_status get_manifest_checked(hyla_store *st, read_view *v, const char *sid, uint64_t version,
                                        uint64_t expected_fingerprint, hyla_manifest **m, uint64_t *ver, char *what) {
    *m = NULL;
    *ver = 0;
    snprintf(what, 400, "session %s", sid);
    hyla_status s = view_manifest(st, v, sid, version, m, ver);
    if (s != HYLA_OK) return s;
    snprintf(what, 400, "session %s version %llu", sid, (unsigned long long)*ver);
    if (expected_fingerprint && (*m)->meta.model_fingerprint != expected_fingerprint) {
        s = hyla_fail(HYLA_ERR_MISMATCH,
                      "%s: model fingerprint mismatch: the state was saved by model %016llx, this model is %016llx", what,
                      (unsigned long long)(*m)->meta.model_fingerprint, (unsigned long long)expected_fingerprint);
        hyla_manifest_destroy(*m);
        *m = NULL;
    }
    return s;
}

static hyla_status get_impl(hyla_store *st, const char *sid, uint64_t version, uint64_t expected_fingerprint,
                           hyla_snapshot **out, uint64_t *version_out, int only_token_log) {
    read_view v;
    view_open(st, &v);
    hyla_manifest *m = NULL;
    uint64_t ver = 0;
    char what[400];
    hyla_status s = get_manifest_checked(st, &v, sid, version, expected_fingerprint, &m, &ver, what);
    if (s == HYLA_OK && only_token_log) hyla_manifest_keep_kind(m, HYLA_PART_TOKENS);
    if (s == HYLA_OK) {
        fetch_ctx f = {st, v.ro};
        s = hyla_codec_decode(m, store_fetch, store_release, &f, what, st->p.codec.threads, out);
    }
    hyla_manifest_destroy(m);
    view_close(st, &v);
    if (s == HYLA_OK && version_out) *version_out = ver;
    return s;
}


/* ---------------------------------------------------------------- fork, delete */

static hyla_status fork_impl(hyla_store *st, const char *src, uint64_t src_version, const char *dst) {
    HYLA_TRY(check_session_id(src));
    HYLA_TRY(check_session_id(dst));
    if (st->p.read_only) return hyla_fail(HYLA_ERR_UNSUPPORTED, "store %s is open read-only", st->dir);
    pthread_rwlock_rdlock(&st->gc_lock);
    read_view v;
    view_open(st, &v);
    hyla_manifest *m = NULL;
    uint64_t ver = 0;
    hyla_status s = view_manifest(st, &v, src, src_version, &m, &ver);
    char *mv = NULL;
    size_t ml = 0;
    if (s == HYLA_OK) {
        char k[KEY_MAX];
        s = db_get(st, v.ro, CF_META, k, key_manifest(k, src, ver), &mv, &ml);
        if (s == HYLA_ERR_NOT_FOUND) s = hyla_fail(HYLA_ERR_NOT_FOUND, "session %s version %llu vanished", src, (unsigned long long)ver);
    }
    view_close(st, &v);
    if (s == HYLA_OK)
        s = commit(st, dst, NULL, m, (const uint8_t *)mv, ml, m->checksum, 1, NULL, NULL, NULL);
    pthread_rwlock_unlock(&st->gc_lock);
    rocksdb_free(mv);
    hyla_manifest_destroy(m);
    if (s != HYLA_OK) return hyla_fail_wrap(s, "fork %s -> %s", src, dst);
    return HYLA_OK;
}

static hyla_status delete_impl(hyla_store *st, const char *sid) {
    HYLA_TRY(check_session_id(sid));
    if (st->p.read_only) return hyla_fail(HYLA_ERR_UNSUPPORTED, "store %s is open read-only", st->dir);
    pthread_rwlock_rdlock(&st->gc_lock);
    pthread_mutex_lock(&st->mu);
    head_val h;
    uint64_t *vers = NULL;
    size_t nv = 0;
    delta_list dl = {0}, zero = {0};
    rocksdb_writebatch_t *b = rocksdb_writebatch_create();
    char what[400];
    snprintf(what, sizeof what, "session %s", sid);
    hyla_status s = read_head(st, NULL, sid, &h);
    if (s == HYLA_OK) s = list_versions(st, NULL, sid, &vers, &nv);
    for (size_t i = 0; s == HYLA_OK && i < nv; i++) {
        hyla_manifest *m = NULL;
        if (read_manifest(st, NULL, sid, vers[i], &m) == HYLA_OK) {
            if (delta_add_manifest(&dl, m, -1)) s = hyla_fail(HYLA_ERR_NOMEM, "delete");
        } else {
            HYLA_WARN("%s: deleting unreadable version %llu: %s", what, (unsigned long long)vers[i], hyla_last_error());
        }
        hyla_manifest_destroy(m);
        char k[KEY_MAX];
        rocksdb_writebatch_delete_cf(b, st->cf[CF_META], k, key_manifest(k, sid, vers[i]));
        rocksdb_writebatch_delete_cf(b, st->cf[CF_META], k, key_time(k, sid, vers[i]));
    }
    if (s == HYLA_OK) {
        delta_merge(&dl);
        s = delta_apply(st, &dl, b, &zero, what);
    }
    if (s == HYLA_OK) {
        char k[KEY_MAX];
        rocksdb_writebatch_delete_cf(b, st->cf[CF_META], k, key_head(k, sid));
        s = store_write(st, b, 1, "delete session");
    }
    rocksdb_writebatch_destroy(b);
    pthread_mutex_unlock(&st->mu);
    pthread_rwlock_unlock(&st->gc_lock);
    if (s == HYLA_OK && zero.n) {
        hyla_status gs = free_chunks(st, &zero, NULL, NULL);
        if (gs != HYLA_OK) HYLA_WARN("%s: deleting unreferenced chunks: %s", what, hyla_last_error());
    }
    free(vers);
    free(dl.d);
    free(zero.d);
    return s;
}

/* ---------------------------------------------------------------- list, info */

static hyla_status info_in_view(hyla_store *st, read_view *v, const char *sid, hyla_store_session_info *o) {
    memset(o, 0, sizeof *o);
    snprintf(o->id, sizeof o->id, "%s", sid);
    head_val h;
    HYLA_TRY(read_head(st, v->ro, sid, &h));
    o->head_version = h.version;
    uint64_t *vers = NULL;
    size_t nv = 0;
    HYLA_TRY(list_versions(st, v->ro, sid, &vers, &nv));
    free(vers);
    o->n_versions = (uint32_t)nv;
    hyla_manifest *m = NULL;
    hyla_status s = read_manifest(st, v->ro, sid, h.version, &m);
    if (s == HYLA_OK) {
        o->raw_bytes = m->raw_bytes;
        o->position = m->meta.position;
        o->model_fingerprint = m->meta.model_fingerprint;
        o->n_parts = m->n_parts;
        hyla_manifest_destroy(m);
    }
    return s;
}

static hyla_status info_impl(hyla_store *st, const char *sid, hyla_store_session_info *out) {
    HYLA_TRY(check_session_id(sid));
    read_view v;
    view_open(st, &v);
    hyla_status s = info_in_view(st, &v, sid, out);
    view_close(st, &v);
    return s;
}

/* Session ids (from head keys) through v. *ids: caller frees each and the array. */
static hyla_status list_ids(hyla_store *st, const rocksdb_readoptions_t *ro, char ***ids, size_t *n) {
    rocksdb_iterator_t *it = rocksdb_create_iterator_cf(st->db, ro, st->cf[CF_META]);
    size_t cap = 16, cnt = 0;
    char **a = malloc(cap * sizeof *a);
    hyla_status s = a ? HYLA_OK : hyla_fail(HYLA_ERR_NOMEM, "list");
    for (rocksdb_iter_seek(it, "H", 1); s == HYLA_OK && rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t kl;
        const char *k = rocksdb_iter_key(it, &kl);
        if (kl < 2 || k[0] != 'H') break;
        if (cnt == cap) {
            char **na = realloc(a, 2 * cap * sizeof *a);
            if (!na) {
                s = hyla_fail(HYLA_ERR_NOMEM, "list");
                break;
            }
            a = na;
            cap *= 2;
        }
        a[cnt] = strndup(k + 1, kl - 1);
        if (!a[cnt]) s = hyla_fail(HYLA_ERR_NOMEM, "list");
        else cnt++;
    }
    char *err = NULL;
    rocksdb_iter_get_error(it, &err);
    rocksdb_iter_destroy(it);
    if (err && s == HYLA_OK) s = rdb_fail(err, HYLA_ERR_IO, "iterate heads", st->dir);
    else rocksdb_free(err);
    if (s != HYLA_OK) {
        for (size_t i = 0; i < cnt; i++) free(a[i]);
        free(a);
        return s;
    }
    *ids = a;
    *n = cnt;
    return HYLA_OK;
}

static void free_ids(char **ids, size_t n) {
    for (size_t i = 0; i < n; i++) free(ids[i]);
    free(ids);
}

static hyla_status list_impl(hyla_store *st, hyla_store_session_info **out, size_t *n) {
    read_view v;
    view_open(st, &v);
    char **ids = NULL;
    size_t ni = 0;
    hyla_status s = list_ids(st, v.ro, &ids, &ni);
    hyla_store_session_info *a = NULL;
    if (s == HYLA_OK) {
        a = calloc(ni + 1, sizeof *a);
        if (!a) s = hyla_fail(HYLA_ERR_NOMEM, "list");
    }
    for (size_t i = 0; s == HYLA_OK && i < ni; i++) {
        if (info_in_view(st, &v, ids[i], &a[i]) != HYLA_OK) /* list what can be listed; verify reports */
            HYLA_WARN("session %s: %s", ids[i], hyla_last_error());
    }
    if (ids) free_ids(ids, ni);
    view_close(st, &v);
    if (s != HYLA_OK) {
        free(a);
        return s;
    }
    *out = a;
    *n = ni;
    return HYLA_OK;
}

static hyla_status versions_impl(hyla_store *st, const char *sid, uint64_t **out, size_t *n) {
    HYLA_TRY(check_session_id(sid));
    read_view v;
    view_open(st, &v);
    head_val h;
    hyla_status s = read_head(st, v.ro, sid, &h);
    if (s == HYLA_OK) s = list_versions(st, v.ro, sid, out, n);
    view_close(st, &v);
    return s;
}

static hyla_status snapshots_impl(hyla_store *st, const char *sid, hyla_store_snapshot_info **out, size_t *n) {
    HYLA_TRY(check_session_id(sid));
    *out = NULL;
    *n = 0;
    read_view v;
    view_open(st, &v);
    head_val h;
    uint64_t *vers = NULL;
    size_t nv = 0;
    hyla_store_snapshot_info *a = NULL;
    hyla_status s = read_head(st, v.ro, sid, &h);
    if (s == HYLA_OK) s = list_versions(st, v.ro, sid, &vers, &nv);
    if (s == HYLA_OK && !(a = calloc(nv + 1, sizeof *a))) s = hyla_fail(HYLA_ERR_NOMEM, "snapshot list");
    for (size_t i = 0; s == HYLA_OK && i < nv; i++) {
        hyla_store_snapshot_info *o = &a[i];
        o->version = vers[i];
        o->is_head = vers[i] == h.version;
        hyla_manifest *m = NULL;
        s = read_manifest(st, v.ro, sid, vers[i], &m);
        if (s != HYLA_OK) break;
        o->position = m->meta.position;
        o->n_generated = m->meta.n_generated;
        o->model_fingerprint = m->meta.model_fingerprint;
        o->raw_bytes = m->raw_bytes;
        /* encoded bytes of its distinct chunks, from their reference records */
        delta_list dl = {0};
        if (delta_add_manifest(&dl, m, 1)) s = hyla_fail(HYLA_ERR_NOMEM, "snapshot list");
        delta_merge(&dl);
        for (size_t j = 0; s == HYLA_OK && j < dl.n; j++) {
            char k[KEY_MAX], *val;
            size_t vl;
            hyla_status rs = db_get(st, v.ro, CF_META, k, key_ref(k, dl.d[j].key), &val, &vl);
            if (rs == HYLA_OK) {
                if (vl == REF_BYTES) o->stored_bytes += hyla_get_le32((const uint8_t *)val + 8);
                rocksdb_free(val);
            } else if (rs != HYLA_ERR_NOT_FOUND) {
                s = rs;
            }
        }
        free(dl.d);
        hyla_manifest_destroy(m);
        char k[KEY_MAX], *tv;
        size_t tl;
        hyla_status ts = db_get(st, v.ro, CF_META, k, key_time(k, sid, vers[i]), &tv, &tl);
        if (ts == HYLA_OK) {
            if (tl == TIME_BYTES) {
                o->time_us = (int64_t)hyla_get_le64((const uint8_t *)tv);
                o->written_bytes = hyla_get_le64((const uint8_t *)tv + 8);
            }
            rocksdb_free(tv);
        } else if (ts != HYLA_ERR_NOT_FOUND && s == HYLA_OK) {
            s = ts;
        }
    }
    view_close(st, &v);
    free(vers);
    if (s != HYLA_OK) {
        free(a);
        return s;
    }
    *out = a;
    *n = nv;
    return HYLA_OK;
}

/* ---------------------------------------------------------------- verify */

typedef struct {
    hyla_report_fn report;
    void *ctx;
    uint64_t problems;
    hyla_status first;
} verify_acc;

static void vreport(verify_acc *a, hyla_status s, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void vreport(verify_acc *a, hyla_status s, const char *fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    a->problems++;
    if (a->first == HYLA_OK) a->first = s;
    if (a->report) a->report(a->ctx, msg);
}

static void chunk_report(void *ctx, const char *msg) {
    verify_acc *a = ctx;
    a->problems++;
    if (a->report) a->report(a->ctx, msg);
}

static void verify_session(hyla_store *st, read_view *v, const char *sid, verify_acc *a, delta_list *refs) {
    head_val h;
    if (read_head(st, v->ro, sid, &h) != HYLA_OK) {
        vreport(a, HYLA_ERR_CORRUPT, "%s", hyla_last_error());
        return;
    }
    uint64_t *vers = NULL;
    size_t nv = 0;
    if (list_versions(st, v->ro, sid, &vers, &nv) != HYLA_OK) {
        vreport(a, HYLA_ERR_IO, "%s", hyla_last_error());
        return;
    }
    int head_found = 0;
    for (size_t i = 0; i < nv; i++) {
        hyla_manifest *m = NULL;
        if (vers[i] == h.version) head_found = 1;
        if (read_manifest(st, v->ro, sid, vers[i], &m) != HYLA_OK) {
            vreport(a, HYLA_ERR_CORRUPT, "%s", hyla_last_error());
            continue;
        }
        if (vers[i] == h.version) {
            if (m->checksum != h.checksum)
                vreport(a, HYLA_ERR_CORRUPT, "session %s: head names version %llu with checksum %016llx, manifest has %016llx",
                        sid, (unsigned long long)h.version, (unsigned long long)h.checksum, (unsigned long long)m->checksum);
        }
        if (vers[i] >= h.next)
            vreport(a, HYLA_ERR_CORRUPT, "session %s: version %llu is newer than the head allows (next %llu)", sid,
                    (unsigned long long)vers[i], (unsigned long long)h.next);
        char what[400];
        snprintf(what, sizeof what, "session %s version %llu", sid, (unsigned long long)vers[i]);
        fetch_ctx f = {st, v->ro};
        uint64_t before = a->problems;
        hyla_status s = hyla_codec_verify(m, store_fetch, store_release, &f, what, st->p.codec.threads, chunk_report, a);
        if (s != HYLA_OK && a->first == HYLA_OK) a->first = s;
        if (s != HYLA_OK && a->problems == before) vreport(a, s, "%s", hyla_last_error());
        if (refs && delta_add_manifest(refs, m, 1)) vreport(a, HYLA_ERR_NOMEM, "verify: out of memory");
        hyla_manifest_destroy(m);
    }
    if (!head_found)
        vreport(a, HYLA_ERR_CORRUPT, "session %s: head names version %llu, which does not exist", sid,
                (unsigned long long)h.version);
    free(vers);
}

static hyla_status verify_impl(hyla_store *st, const char *sid, hyla_report_fn report, void *ctx, uint64_t *problems) {
    verify_acc a = {report, ctx, 0, HYLA_OK};
    read_view v;
    view_open(st, &v);
    if (sid) {
        hyla_status s = check_session_id(sid);
        if (s == HYLA_OK) {
            head_val h;
            s = read_head(st, v.ro, sid, &h);
        }
        if (s != HYLA_OK) {
            view_close(st, &v);
            return s;
        }
        verify_session(st, &v, sid, &a, NULL);
    } else {
        char **ids = NULL;
        size_t n = 0;
        hyla_status s = list_ids(st, v.ro, &ids, &n);
        if (s != HYLA_OK) {
            view_close(st, &v);
            return s;
        }
        delta_list refs = {0};
        for (size_t i = 0; i < n; i++) verify_session(st, &v, ids[i], &a, &refs);
        free_ids(ids, n);
        /* reference counts: merge-join the expected counts with the R records */
        delta_merge(&refs);
        rocksdb_iterator_t *it = rocksdb_create_iterator_cf(st->db, v.ro, st->cf[CF_META]);
        size_t j = 0;
        for (rocksdb_iter_seek(it, "R", 1);; rocksdb_iter_next(it)) {
            const char *k = NULL, *val = NULL;
            size_t kl = 0, vl = 0;
            int valid = rocksdb_iter_valid(it);
            if (valid) {
                k = rocksdb_iter_key(it, &kl);
                if (kl < 1 || k[0] != 'R') valid = 0;
            }
            if (valid && kl != 1 + HYLA_CHUNK_KEY_BYTES) {
                vreport(&a, HYLA_ERR_CORRUPT, "reference record with a %zu-byte key", kl);
                continue;
            }
            /* expected keys smaller than the current record have no record */
            while (j < refs.n && (!valid || memcmp(refs.d[j].key, k + 1, HYLA_CHUNK_KEY_BYTES) < 0)) {
                vreport(&a, HYLA_ERR_CORRUPT, "chunk %02x%02x%02x%02x...: referenced by %lld manifest(s) but has no reference record",
                        refs.d[j].key[0], refs.d[j].key[1], refs.d[j].key[2], refs.d[j].key[3], (long long)refs.d[j].delta);
                j++;
            }
            if (!valid) break;
            val = rocksdb_iter_value(it, &vl);
            int64_t want = 0;
            if (j < refs.n && !memcmp(refs.d[j].key, k + 1, HYLA_CHUNK_KEY_BYTES)) want = refs.d[j++].delta;
            int64_t have = vl == REF_BYTES ? (int64_t)hyla_get_le64((const uint8_t *)val) : -1;
            if (have != want)
                vreport(&a, HYLA_ERR_CORRUPT, "chunk %02x%02x%02x%02x...: reference count %lld, but %lld manifest(s) name it",
                        (uint8_t)k[1], (uint8_t)k[2], (uint8_t)k[3], (uint8_t)k[4], (long long)have, (long long)want);
        }
        char *err = NULL;
        rocksdb_iter_get_error(it, &err);
        rocksdb_iter_destroy(it);
        if (err) vreport(&a, HYLA_ERR_IO, "iterate reference records: %s", err);
        rocksdb_free(err);
        free(refs.d);
    }
    view_close(st, &v);
    if (problems) *problems = a.problems;
    if (a.problems)
        return hyla_fail(a.first != HYLA_OK ? a.first : HYLA_ERR_CORRUPT, "store %s: verify found %llu problem(s)", st->dir,
                         (unsigned long long)a.problems);
    return HYLA_OK;
}

/* ---------------------------------------------------------------- gc, usage */

static hyla_status gc_impl(hyla_store *st, hyla_store_gc_stats *stats) {
    if (st->p.read_only) return hyla_fail(HYLA_ERR_UNSUPPORTED, "store %s is open read-only", st->dir);
    delta_list z = {0};
    uint64_t nf = 0, bf = 0;
    pthread_rwlock_wrlock(&st->gc_lock); /* no put may be between its existence check and commit */
    hyla_status s = zero_ref_keys(st, &z);
    pthread_rwlock_unlock(&st->gc_lock);
    if (s == HYLA_OK) s = free_chunks(st, &z, &nf, &bf);
    free(z.d);
    if (s != HYLA_OK) return s;
    if (stats) {
        stats->chunks_deleted = nf;
        stats->bytes_deleted = bf;
    }
    /* on a full disk, rewriting the live chunks has no room: the caller's reclaim pass drops
     * the blob files that hold only deleted chunks instead */
    if (atomic_load(&st->full)) return HYLA_OK;
    /* reclaim the space of deleted blobs: compact the chunk column family with blob GC of every file */
    pthread_mutex_lock(&st->reclaim_mu);
    const char *keys[1] = {"blob_garbage_collection_age_cutoff"};
    const char *full[1] = {"1.0"}, *normal[1] = {"0.25"};
    char *err = NULL;
    rocksdb_set_options_cf(st->db, st->cf[CF_CHUNKS], 1, keys, full, &err);
    if (err) {
        HYLA_WARN("store %s: cannot set blob GC cutoff: %s", st->dir, err);
        rocksdb_free(err);
        err = NULL;
    }
    rocksdb_flushoptions_t *fo = rocksdb_flushoptions_create();
    rocksdb_flushoptions_set_wait(fo, 1);
    rocksdb_flush_cf(st->db, fo, st->cf[CF_CHUNKS], &err);
    rocksdb_flushoptions_destroy(fo);
    if (err) {
        s = write_fail(st, err, "gc: flush");
        err = NULL;
        rocksdb_set_options_cf(st->db, st->cf[CF_CHUNKS], 1, keys, normal, &err);
        rocksdb_free(err);
        pthread_mutex_unlock(&st->reclaim_mu);
        return s;
    }
    rocksdb_compact_range_cf(st->db, st->cf[CF_CHUNKS], NULL, 0, NULL, 0);
    rocksdb_set_options_cf(st->db, st->cf[CF_CHUNKS], 1, keys, normal, &err);
    rocksdb_free(err);
    atomic_fetch_add(&st->gc_runs, 1);
    pthread_mutex_unlock(&st->reclaim_mu);
    return HYLA_OK;
}

static uint64_t dir_bytes(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    uint64_t n = 0;
    struct dirent *e;
    char path[4096];
    while ((e = readdir(d))) {
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode)) n += (uint64_t)sb.st_size;
    }
    closedir(d);
    return n;
}

static hyla_status usage_impl(hyla_store *st, hyla_store_usage_info *u) {
    memset(u, 0, sizeof *u);
    read_view v;
    view_open(st, &v);
    rocksdb_iterator_t *it = rocksdb_create_iterator_cf(st->db, v.ro, st->cf[CF_META]);
    for (rocksdb_iter_seek_to_first(it); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t kl, vl;
        const char *k = rocksdb_iter_key(it, &kl);
        const char *val = rocksdb_iter_value(it, &vl);
        if (kl < 1) continue;
        if (k[0] == 'H') u->sessions++;
        else if (k[0] == 'M') {
            u->versions++;
            if (vl >= 112) u->referenced_raw_bytes += hyla_get_le64((const uint8_t *)val + 104);
        } else if (k[0] == 'R' && kl == 1 + HYLA_CHUNK_KEY_BYTES && vl == REF_BYTES) {
            const uint8_t *ck = (const uint8_t *)k + 1;
            u->chunks++;
            u->chunk_raw_bytes += (uint32_t)ck[16] << 24 | (uint32_t)ck[17] << 16 | (uint32_t)ck[18] << 8 | ck[19];
            u->chunk_bytes += hyla_get_le32((const uint8_t *)val + 8);
        }
    }
    char *err = NULL;
    rocksdb_iter_get_error(it, &err);
    rocksdb_iter_destroy(it);
    view_close(st, &v);
    if (err) return rdb_fail(err, HYLA_ERR_IO, "usage", st->dir);
    u->disk_bytes = dir_bytes(st->dir);
    uint64_t total;
    disk_space(st->dir, &u->disk_free_bytes, &total);
    u->reserve_bytes = st->reserve_held ? st->p.reserve_bytes : 0;
    u->full = atomic_load(&st->full);
    u->full_events = atomic_load(&st->full_events);
    u->gc_runs = atomic_load(&st->gc_runs);
    u->gc_chunks_freed = atomic_load(&st->gc_chunks_freed);
    u->gc_bytes_freed = atomic_load(&st->gc_bytes_freed);
    u->versions_dropped = atomic_load(&st->versions_dropped);
    return HYLA_OK;
}

/* ---------------------------------------------------------------- public calls
 *
 * Every call holds db_lock shared while it uses the RocksDB handle; a call that writes first
 * lets a full store recover (recover_locked, under db_lock exclusive). Calls that free space
 * (delete, gc) give up the reserve for it and then reclaim at once. */

enum { K_READ, K_ALLOC, K_FREE };

/* A write first checks that RocksDB has not stopped behind the store's back: a background flush
 * or compaction that met a full disk (say, one the reopen after an earlier failure scheduled
 * while the disk was still full) stops every later write with that old error, even once space
 * is back. Such a handle is treated as after a failed write: reserve re-made, RocksDB reopened. */
static hyla_status enter(hyla_store *st, int kind) {
    int writes = kind != K_READ && !st->p.read_only;
    for (int pass = 0;; pass++) {
        if (!st->db || (writes && atomic_load(&st->full))) {
            pthread_rwlock_wrlock(&st->db_lock);
            hyla_status s = recover_locked(st, kind != K_ALLOC);
            pthread_rwlock_unlock(&st->db_lock);
            if (s != HYLA_OK && (kind == K_ALLOC || !st->db)) return s;
        }
        pthread_rwlock_rdlock(&st->db_lock);
        if (!st->db) {
            pthread_rwlock_unlock(&st->db_lock);
            return hyla_fail(HYLA_ERR_UNAVAILABLE, "store %s is not open (a reopen after a failed write failed; retried)",
                             st->dir);
        }
        if (writes && pass == 0 && bg_errors(st) > st->bg_base) {
            pthread_rwlock_unlock(&st->db_lock);
            HYLA_WARN("store %s: a background flush or compaction failed since the last open (disk full?); "
                      "reopening RocksDB before this write",
                      st->dir);
            atomic_store(&st->full, 1);
            atomic_store(&st->broken, 1);
            continue;
        }
        return HYLA_OK;
    }
}

static void leave(hyla_store *st, int kind, hyla_status s) {
    if (kind == K_FREE && s == HYLA_OK && (atomic_load(&st->full) || !st->reserve_held)) reclaim(st);
    pthread_rwlock_unlock(&st->db_lock);
}

#define STORE_CALL(kind, call)                     \
    do {                                           \
        HYLA_TRY(enter(st, kind));                 \
        hyla_status s_ = call;                     \
        leave(st, kind, s_);                       \
        return s_;                                 \
    } while (0)

hyla_status hyla_store_put(hyla_store *st, const char *sid, const hyla_snapshot *snap, uint64_t *version,
                           hyla_store_put_stats *stats) {
    /* a put without shared prefixes reads snap only */
    STORE_CALL(K_ALLOC, put_impl(st, sid, (hyla_snapshot *)snap, 0, NULL, version, stats));
}
hyla_status hyla_store_put_since(hyla_store *st, const char *sid, hyla_snapshot *snap, uint64_t base_version,
                                 const uint64_t *shared, uint64_t *version, hyla_store_put_stats *stats) {
    int any = 0;
    for (uint32_t i = 0; shared && i < snap->n_parts; i++) any |= shared[i] > 0;
    STORE_CALL(K_ALLOC, put_impl(st, sid, snap, base_version, any ? shared : NULL, version, stats));
}
hyla_status hyla_store_get(hyla_store *st, const char *sid, uint64_t version, uint64_t expected_fingerprint,
                           hyla_snapshot **out, uint64_t *version_out) {
    STORE_CALL(K_READ, get_impl(st, sid, version, expected_fingerprint, out, version_out, 0));
}
hyla_status hyla_store_get_token_log(hyla_store *st, const char *sid, uint64_t version, hyla_snapshot **out,
                                     uint64_t *version_out) {
    STORE_CALL(K_READ, get_impl(st, sid, version, 0, out, version_out, 1));
}
hyla_status hyla_store_get_manifest(hyla_store *st, const char *sid, uint64_t version, hyla_manifest **out,
                                    uint64_t *version_out) {
    STORE_CALL(K_READ, get_manifest_impl(st, sid, version, out, version_out));
}
hyla_status hyla_store_fork(hyla_store *st, const char *src, uint64_t src_version, const char *dst) {
    STORE_CALL(K_ALLOC, fork_impl(st, src, src_version, dst));
}
/* A call that frees space, retried once when it found the disk full (the retry gives up the
 * reserve and reopens RocksDB first). */
static hyla_status free_call(hyla_store *st, const char *sid, hyla_store_gc_stats *stats) {
    hyla_status s = HYLA_OK;
    for (int attempt = 0; attempt < 2; attempt++) {
        HYLA_TRY(enter(st, K_FREE));
        s = sid ? delete_impl(st, sid) : gc_impl(st, stats);
        leave(st, K_FREE, s);
        if (s != HYLA_ERR_RESOURCE) break;
    }
    return s;
}

hyla_status hyla_store_delete(hyla_store *st, const char *sid) { return free_call(st, sid, NULL); }
hyla_status hyla_store_info(hyla_store *st, const char *sid, hyla_store_session_info *out) {
    STORE_CALL(K_READ, info_impl(st, sid, out));
}
hyla_status hyla_store_list(hyla_store *st, hyla_store_session_info **out, size_t *n) {
    STORE_CALL(K_READ, list_impl(st, out, n));
}
hyla_status hyla_store_versions(hyla_store *st, const char *sid, uint64_t **out, size_t *n) {
    STORE_CALL(K_READ, versions_impl(st, sid, out, n));
}
hyla_status hyla_store_snapshots(hyla_store *st, const char *sid, hyla_store_snapshot_info **out, size_t *n) {
    STORE_CALL(K_READ, snapshots_impl(st, sid, out, n));
}
hyla_status hyla_store_verify(hyla_store *st, const char *sid, hyla_report_fn report, void *ctx, uint64_t *problems) {
    STORE_CALL(K_READ, verify_impl(st, sid, report, ctx, problems));
}
hyla_status hyla_store_gc(hyla_store *st, hyla_store_gc_stats *stats) { return free_call(st, NULL, stats); }
hyla_status hyla_store_usage(hyla_store *st, hyla_store_usage_info *u) { STORE_CALL(K_READ, usage_impl(st, u)); }

const char *hyla_store_recovery_note(const hyla_store *st) { return st->recovery_note; }

/* ---------------------------------------------------------------- streaming reads */

struct hyla_store_reader {
    hyla_store *st;
    read_view v;
    hyla_manifest *m;
    hyla_snapshot *layout; /* meta + parts, data NULL */
    uint64_t version;
    int chunks_read;       /* hyla_store_read_chunks was called */
    char what[400];
};

hyla_status hyla_store_read_open(hyla_store *st, const char *sid, uint64_t version, uint64_t expected_fingerprint,
                                 hyla_store_reader **out) {
    *out = NULL;
    hyla_store_reader *r = calloc(1, sizeof *r);
    if (!r) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    hyla_status s = enter(st, K_READ);
    if (s != HYLA_OK) {
        free(r);
        return s;
    }
    r->st = st;
    view_open(st, &r->v);
    s = get_manifest_checked(st, &r->v, sid, version, expected_fingerprint, &r->m, &r->version, r->what);
    if (s == HYLA_OK) s = hyla_manifest_to_snapshot(r->m, 0, &r->layout);
    if (s != HYLA_OK) {
        hyla_store_read_close(r);
        return s;
    }
    *out = r;
    return HYLA_OK;
}

const hyla_snapshot *hyla_store_read_layout(const hyla_store_reader *r) { return r->layout; }
uint64_t hyla_store_read_version(const hyla_store_reader *r) { return r->version; }

hyla_status hyla_store_read_chunks(hyla_store_reader *r, hyla_snapshot *dst, hyla_chunk_done_fn done, void *done_ctx) {
    HYLA_ASSERT(!r->chunks_read && "hyla_store_read_chunks: once per reader");
    r->chunks_read = 1;
    fetch_ctx f = {r->st, r->v.ro};
    return hyla_codec_decode_into(r->m, store_fetch, store_release, &f, r->what, r->st->p.codec.threads, dst, done,
                                  done_ctx);
}

void hyla_store_read_close(hyla_store_reader *r) {
    if (!r) return;
    hyla_snapshot_destroy(r->layout);
    hyla_manifest_destroy(r->m);
    view_close(r->st, &r->v);
    leave(r->st, K_READ, HYLA_OK);
    free(r);
}
