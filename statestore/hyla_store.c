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
 * Threading: `mu` serializes every read-modify-write of heads and refcounts (commits, fork,
 * delete, chunk-batch writes); `gc_lock` (rwlock) is held shared by put/fork/delete and
 * exclusively by chunk deletion. Lock order: gc_lock, then mu. Gets read through a RocksDB
 * snapshot and take no lock. */
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
#include <sys/stat.h>
#include <unistd.h>

#include <rocksdb/c.h>

#include "hyla_log.h"
#include "hyla_util.h"

#define STORE_FORMAT "hyla-statestore 1"
#define HEAD_MAGIC 0x44485948u /* "HYHD" */
#define HEAD_BYTES 32
#define REF_BYTES 16
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
};

/* ---------------------------------------------------------------- small helpers */

static atomic_long g_fault_write;

void hyla_store_fault_write(long nth) { atomic_store(&g_fault_write, nth); }

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

static hyla_status check_session_id(const char *id) {
    if (!id) return hyla_fail(HYLA_ERR_INVALID_ARG, "session id is NULL");
    size_t n = strlen(id);
    if (n == 0 || n > HYLA_SESSION_ID_MAX)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "session id of %zu bytes (1..%d allowed)", n, HYLA_SESSION_ID_MAX);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)id[i] < 0x20 || id[i] == 0x7f)
            return hyla_fail(HYLA_ERR_INVALID_ARG, "session id has a control character at byte %zu", i);
    return HYLA_OK;
}

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

/* commit: 1 = synced (commits), 2 = WAL without sync, 0 = chunk values (no WAL in durable mode). */
static hyla_status store_write(hyla_store *st, rocksdb_writebatch_t *b, int commit, const char *what) {
    if (st->p.read_only) return hyla_fail(HYLA_ERR_UNSUPPORTED, "store %s is open read-only", st->dir);
    if (fault_write_hit())
        return hyla_fail(HYLA_ERR_IO, "store %s: %s: write failed: No space left on device (injected fault)", st->dir, what);
    char *err = NULL;
    rocksdb_write(st->db, commit == 1 ? st->wo_commit : commit == 2 ? st->wo_plain : st->wo_chunks, b, &err);
    if (err) return rdb_fail(err, HYLA_ERR_IO, what, st->dir);
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
    return p;
}

void hyla_store_close(hyla_store *st) {
    if (!st) return;
    for (int i = 0; i < CF_COUNT; i++)
        if (st->cf[i]) rocksdb_column_family_handle_destroy(st->cf[i]);
    if (st->db) rocksdb_close(st->db);
    for (int i = 0; i < CF_COUNT; i++)
        if (st->cf_opt[i]) rocksdb_options_destroy(st->cf_opt[i]);
    if (st->opt) rocksdb_options_destroy(st->opt);
    if (st->wo_commit) rocksdb_writeoptions_destroy(st->wo_commit);
    if (st->wo_chunks) rocksdb_writeoptions_destroy(st->wo_chunks);
    if (st->wo_plain) rocksdb_writeoptions_destroy(st->wo_plain);
    if (st->ro) rocksdb_readoptions_destroy(st->ro);
    pthread_mutex_destroy(&st->mu);
    pthread_rwlock_destroy(&st->gc_lock);
    free(st->dir);
    free(st);
}

hyla_status hyla_store_open(const char *dir, const hyla_store_params *pin, hyla_store **out) {
    hyla_store_params p = pin ? *pin : hyla_store_default_params();
    if (p.keep_versions < 1) p.keep_versions = 1;
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
    st->dir = strdup(dir);
    st->p = p;
    st->opt = rocksdb_options_create();
    rocksdb_options_set_create_if_missing(st->opt, (unsigned char)p.create_if_missing);
    rocksdb_options_set_create_missing_column_families(st->opt, 1);
    rocksdb_options_set_max_background_jobs(st->opt, 2);
    rocksdb_options_set_max_total_wal_size(st->opt, 1ull << 30);
    /* start writeback of blob/SST files while they are written (sync_file_range every 8 MiB), so
     * the fsync at the end of a large put has little left to do */
    rocksdb_options_set_bytes_per_sync(st->opt, 8ull << 20);
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
    const char *names[CF_COUNT] = {"default", HYLA_STORE_CF_CHUNKS, HYLA_STORE_CF_META};
    char *err = NULL;
    if (p.read_only)
        st->db = rocksdb_open_for_read_only_column_families(st->opt, dir, CF_COUNT, names,
                                                            (const rocksdb_options_t *const *)st->cf_opt, st->cf, 0, &err);
    else
        st->db = rocksdb_open_column_families(st->opt, dir, CF_COUNT, names, (const rocksdb_options_t *const *)st->cf_opt,
                                              st->cf, &err);
    if (err) {
        hyla_status s = rdb_fail(err, HYLA_ERR_IO, "open", dir);
        memset(st->cf, 0, sizeof st->cf);
        st->db = NULL;
        hyla_store_close(st);
        return s;
    }
    st->wo_commit = rocksdb_writeoptions_create();
    rocksdb_writeoptions_set_sync(st->wo_commit, (unsigned char)(p.sync != 0));
    st->wo_chunks = rocksdb_writeoptions_create();
    rocksdb_writeoptions_disable_WAL(st->wo_chunks, 1);
    st->wo_plain = rocksdb_writeoptions_create();
    st->ro = rocksdb_readoptions_create();
    /* format marker */
    char *v;
    size_t vl;
    hyla_status s = db_get(st, NULL, CF_META, "F", 1, &v, &vl);
    if (s == HYLA_OK) {
        int ok = vl == strlen(STORE_FORMAT) && !memcmp(v, STORE_FORMAT, vl);
        if (!ok)
            s = hyla_fail(HYLA_ERR_UNSUPPORTED, "store %s: unknown store format '%.*s' (this build reads '%s')", dir,
                          (int)(vl < 64 ? vl : 64), v, STORE_FORMAT);
        rocksdb_free(v);
    } else if (s == HYLA_ERR_NOT_FOUND && !p.read_only) {
        rocksdb_writebatch_t *b = rocksdb_writebatch_create();
        rocksdb_writebatch_put_cf(b, st->cf[CF_META], "F", 1, STORE_FORMAT, strlen(STORE_FORMAT));
        char *e2 = NULL;
        rocksdb_write(st->db, st->wo_commit, b, &e2);
        rocksdb_writebatch_destroy(b);
        s = e2 ? rdb_fail(e2, HYLA_ERR_IO, "write format marker", dir) : HYLA_OK;
    } else if (s == HYLA_ERR_NOT_FOUND) {
        s = HYLA_OK; /* read-only view of an empty store */
    }
    if (s == HYLA_OK && p.gc_on_open && !p.read_only) {
        delta_list z = {0};
        s = zero_ref_keys(st, &z);
        uint64_t nf = 0;
        if (s == HYLA_OK) s = free_chunks(st, &z, &nf, NULL);
        if (nf) HYLA_INFO("store %s: deleted %llu unreferenced chunks left by an interrupted write", dir, (unsigned long long)nf);
        free(z.d);
    }
    if (s != HYLA_OK) {
        hyla_store_close(st);
        return s;
    }
    *out = st;
    return HYLA_OK;
}

/* ---------------------------------------------------------------- put */

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
    if (err) return rdb_fail(err, HYLA_ERR_IO, "flush chunks", st->dir);
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
        if (ps) ps->versions_dropped++;
    }
    delta_merge(&dl);
    if ((s = delta_apply(st, &dl, b, zero, what)) != HYLA_OK) goto done;
    char k[KEY_MAX];
    rocksdb_writebatch_put_cf(b, st->cf[CF_META], k, key_manifest(k, sid, ver), (const char *)mbytes, mlen);
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

hyla_status hyla_store_put(hyla_store *st, const char *sid, const hyla_snapshot *snap, uint64_t *version,
                           hyla_store_put_stats *stats) {
    HYLA_TRY(check_session_id(sid));
    if (st->p.read_only) return hyla_fail(HYLA_ERR_UNSUPPORTED, "store %s is open read-only", st->dir);
    hyla_store_put_stats ps;
    memset(&ps, 0, sizeof ps);
    double t0 = hyla_now();
    hyla_codec_plan *pl = NULL;
    hyla_status s = hyla_codec_plan_create(snap, &st->p.codec, &pl);
    if (s != HYLA_OK) return hyla_fail_wrap(s, "session %s: put", sid);
    double t1 = hyla_now();
    ps.seconds_plan = t1 - t0;
    ps.raw_bytes = hyla_snapshot_bytes(snap);
    ps.chunks = pl->n_chunks;
    size_t *order = malloc((pl->n_chunks + 1) * sizeof *order), *need = malloc((pl->n_chunks + 1) * sizeof *need);
    size_t n_need = 0;
    delta_list written = {0}, zero = {0};
    if (!order || !need) {
        s = hyla_fail(HYLA_ERR_NOMEM, "put");
        goto out;
    }
    pthread_rwlock_rdlock(&st->gc_lock);
    /* which distinct chunks does the store lack? */
    for (size_t i = 0; i < pl->n_chunks; i++) order[i] = i;
    qsort_r(order, pl->n_chunks, sizeof *order, cmp_idx_key, pl);
    for (size_t j = 0; j < pl->n_chunks && s == HYLA_OK; j++) {
        size_t i = order[j];
        if (j > 0 && !memcmp(pl->chunks[order[j - 1]].ref.key, pl->chunks[i].ref.key, HYLA_CHUNK_KEY_BYTES)) continue;
        if (!ref_exists(st, pl->chunks[i].ref.key, &s) && s == HYLA_OK) need[n_need++] = i;
    }
    /* keep manifest order for locality; encode and write in groups */
    qsort(need, n_need, sizeof *need, cmp_size);
    uint64_t need_raw = 0;
    for (size_t j = 0; j < n_need; j++) need_raw += pl->chunks[need[j]].ref.raw_len;
    int nowal = st->p.sync && need_raw >= st->p.nowal_bytes;
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
        if (version) *version = ps.version;
        if (stats) *stats = ps;
    }
    return s;
}

/* ---------------------------------------------------------------- get */

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
    HYLA_TRY(read_manifest(st, v->ro, sid, ver, m));
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

hyla_status hyla_store_get_manifest(hyla_store *st, const char *sid, uint64_t version, hyla_manifest **out,
                                    uint64_t *version_out) {
    read_view v;
    view_open(st, &v);
    uint64_t ver = 0;
    hyla_status s = view_manifest(st, &v, sid, version, out, &ver);
    view_close(st, &v);
    if (s == HYLA_OK && version_out) *version_out = ver;
    return s;
}

hyla_status hyla_store_get(hyla_store *st, const char *sid, uint64_t version, uint64_t expected_fingerprint,
                           hyla_snapshot **out, uint64_t *version_out) {
    read_view v;
    view_open(st, &v);
    hyla_manifest *m = NULL;
    uint64_t ver = 0;
    hyla_status s = view_manifest(st, &v, sid, version, &m, &ver);
    char what[400];
    snprintf(what, sizeof what, "session %s version %llu", sid, (unsigned long long)ver);
    if (s == HYLA_OK && expected_fingerprint && m->meta.model_fingerprint != expected_fingerprint)
        s = hyla_fail(HYLA_ERR_MISMATCH,
                      "%s: model fingerprint mismatch: the state was saved by model %016llx, this model is %016llx", what,
                      (unsigned long long)m->meta.model_fingerprint, (unsigned long long)expected_fingerprint);
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

hyla_status hyla_store_fork(hyla_store *st, const char *src, uint64_t src_version, const char *dst) {
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

hyla_status hyla_store_delete(hyla_store *st, const char *sid) {
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

hyla_status hyla_store_info(hyla_store *st, const char *sid, hyla_store_session_info *out) {
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

hyla_status hyla_store_list(hyla_store *st, hyla_store_session_info **out, size_t *n) {
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

hyla_status hyla_store_versions(hyla_store *st, const char *sid, uint64_t **out, size_t *n) {
    HYLA_TRY(check_session_id(sid));
    read_view v;
    view_open(st, &v);
    head_val h;
    hyla_status s = read_head(st, v.ro, sid, &h);
    if (s == HYLA_OK) s = list_versions(st, v.ro, sid, out, n);
    view_close(st, &v);
    return s;
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

hyla_status hyla_store_verify(hyla_store *st, const char *sid, hyla_report_fn report, void *ctx, uint64_t *problems) {
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

hyla_status hyla_store_gc(hyla_store *st, hyla_store_gc_stats *stats) {
    if (st->p.read_only) return hyla_fail(HYLA_ERR_UNSUPPORTED, "store %s is open read-only", st->dir);
    delta_list z = {0};
    uint64_t nf = 0, bf = 0;
    pthread_rwlock_wrlock(&st->gc_lock); /* no put may be between its existence check and commit */
    hyla_status s = zero_ref_keys(st, &z);
    pthread_rwlock_unlock(&st->gc_lock);
    if (s == HYLA_OK) s = free_chunks(st, &z, &nf, &bf);
    free(z.d);
    if (s != HYLA_OK) return s;
    /* reclaim the space of deleted blobs: compact the chunk column family with blob GC of every file */
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
        rocksdb_free(err);
        err = NULL;
    }
    rocksdb_compact_range_cf(st->db, st->cf[CF_CHUNKS], NULL, 0, NULL, 0);
    rocksdb_set_options_cf(st->db, st->cf[CF_CHUNKS], 1, keys, normal, &err);
    rocksdb_free(err);
    if (stats) {
        stats->chunks_deleted = nf;
        stats->bytes_deleted = bf;
    }
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

hyla_status hyla_store_usage(hyla_store *st, hyla_store_usage_info *u) {
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
    return HYLA_OK;
}
