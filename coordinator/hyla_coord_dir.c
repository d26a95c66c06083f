/* hyla_coord_dir.c — the session directory in RocksDB (see hyla_coord_dir.h for the format).
 * Every RocksDB call is checked; its error string becomes the detail of a HYLA_ERR_IO that
 * names the operation and the key. Threading: no state beyond the RocksDB handles. */
#include "hyla_coord_dir.h"

#include <rocksdb/c.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_log.h"
#include "hyla_util.h"

#define KEY_EPOCH "m/epoch"
#define SESSION_PREFIX "s/"

struct hyla_coord_dir {
    rocksdb_t *db;
    rocksdb_options_t *opts;
    rocksdb_writeoptions_t *wsync, *wnosync;
    rocksdb_readoptions_t *ropts;
    char *path;
};

/* Turn a RocksDB error string into a status (and free it). A full disk is HYLA_ERR_RESOURCE:
 * RocksDB stops writes then and resumes them by itself once space exists. */
static hyla_status rdb_check(char *err, const char *what, const char *key) {
    if (!err)
        return HYLA_OK;
    int nospace = strstr(err, "No space left") || strstr(err, "NoSpace");
    hyla_status st = hyla_fail(nospace ? HYLA_ERR_RESOURCE : HYLA_ERR_IO, "session directory: %s%s %s: %s", what,
                               nospace ? " (disk full; writes resume by themselves once space exists)" : "",
                               key ? key : "", err);
    rocksdb_free(err);
    return st;
}

void hyla_coord_dir_close(hyla_coord_dir *d) {
    if (!d)
        return;
    if (d->db)
        rocksdb_close(d->db);
    if (d->opts)
        rocksdb_options_destroy(d->opts);
    if (d->wsync)
        rocksdb_writeoptions_destroy(d->wsync);
    if (d->wnosync)
        rocksdb_writeoptions_destroy(d->wnosync);
    if (d->ropts)
        rocksdb_readoptions_destroy(d->ropts);
    free(d->path);
    free(d);
}

hyla_status hyla_coord_dir_open(const char *path, hyla_coord_dir **out) {
    *out = NULL;
    HYLA_TRY(hyla_mkdirs(path));
    hyla_coord_dir *d = calloc(1, sizeof *d);
    if (!d)
        return hyla_fail(HYLA_ERR_NOMEM, "session directory");
    d->path = strdup(path);
    d->opts = rocksdb_options_create();
    rocksdb_options_set_create_if_missing(d->opts, 1);
    rocksdb_options_set_keep_log_file_num(d->opts, 4);
    /* small records: a small memtable keeps the WAL (and its disk) small between flushes */
    rocksdb_options_set_write_buffer_size(d->opts, 4u << 20);
    /* librocksdb 7.8 aborts when it logs after its LOG file met a full disk: keep it quiet */
    rocksdb_options_set_info_log_level(d->opts, 4 /* FATAL_LEVEL */);
    d->wsync = rocksdb_writeoptions_create();
    rocksdb_writeoptions_set_sync(d->wsync, 1);
    d->wnosync = rocksdb_writeoptions_create();
    d->ropts = rocksdb_readoptions_create();
    char *err = NULL;
    d->db = rocksdb_open(d->opts, path, &err);
    if (err || !d->db) {
        hyla_status st = rdb_check(err, "open", path);
        if (st == HYLA_OK)
            st = hyla_fail(HYLA_ERR_IO, "session directory: cannot open %s", path);
        hyla_coord_dir_close(d);
        return st;
    }
    *out = d;
    return HYLA_OK;
}

hyla_status hyla_coord_dir_put(hyla_coord_dir *d, const Hyla__V1__Session *s, uint64_t epoch, uint64_t counter,
                               int sync) {
    HYLA_ASSERT(d && s && s->session_id && s->session_id[0]);
    size_t n = protobuf_c_message_get_packed_size(&s->base);
    uint8_t *val = malloc(16 + n);
    if (!val)
        return hyla_fail(HYLA_ERR_NOMEM, "session directory record");
    memcpy(val, HYLA_COORD_DIR_MAGIC, 4);
    hyla_put_le32(val + 4, HYLA_COORD_DIR_VERSION);
    hyla_put_le64(val + 8, epoch);
    protobuf_c_message_pack(&s->base, val + 16);
    char key[300];
    int kl = snprintf(key, sizeof key, SESSION_PREFIX "%s", s->session_id);
    HYLA_ASSERT(kl > 0 && (size_t)kl < sizeof key);
    rocksdb_writebatch_t *b = rocksdb_writebatch_create();
    rocksdb_writebatch_put(b, key, (size_t)kl, (const char *)val, 16 + n);
    uint8_t cv[8];
    if (counter) {
        hyla_put_le64(cv, counter);
        rocksdb_writebatch_put(b, KEY_EPOCH, strlen(KEY_EPOCH), (const char *)cv, 8);
    }
    char *err = NULL;
    rocksdb_write(d->db, sync ? d->wsync : d->wnosync, b, &err);
    rocksdb_writebatch_destroy(b);
    free(val);
    return rdb_check(err, "write", key);
}

/* Delete key prefix+id, synced: sessions and API keys are both removed this way. */
static hyla_status delete_prefixed(hyla_coord_dir *d, const char *prefix, const char *id, char *key, size_t cap) {
    int kl = snprintf(key, cap, "%s%s", prefix, id);
    HYLA_ASSERT(kl > 0 && (size_t)kl < cap);
    char *err = NULL;
    rocksdb_delete(d->db, d->wsync, key, (size_t)kl, &err);
    return rdb_check(err, "delete", key);
}

/* Every record under prefix, in key order, to each(ctx, key, value) until it fails; then the
 * iterator's own error: the scan of sessions and of API keys alike. */
static hyla_status scan_prefix(hyla_coord_dir *d, const char *prefix,
                               hyla_status (*each)(void *ctx, const char *k, size_t kl, const char *v, size_t vl),
                               void *ctx) {
    rocksdb_iterator_t *it = rocksdb_create_iterator(d->db, d->ropts);
    hyla_status st = HYLA_OK;
    size_t plen = strlen(prefix);
    for (rocksdb_iter_seek(it, prefix, plen); st == HYLA_OK && rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t kl, vl;
        const char *k = rocksdb_iter_key(it, &kl);
        if (kl < plen || memcmp(k, prefix, plen) != 0)
            break;
        const char *v = rocksdb_iter_value(it, &vl);
        st = each(ctx, k, kl, v, vl);
    }
    if (st == HYLA_OK) {
        char *err = NULL;
        rocksdb_iter_get_error(it, &err);
        st = rdb_check(err, "scan", prefix);
    }
    rocksdb_iter_destroy(it);
    return st;
}

hyla_status hyla_coord_dir_delete(hyla_coord_dir *d, const char *session_id) {
    char key[300];
    return delete_prefixed(d, SESSION_PREFIX, session_id, key, sizeof key);
}

hyla_status hyla_coord_dir_set_counter(hyla_coord_dir *d, uint64_t counter) {
    uint8_t cv[8];
    hyla_put_le64(cv, counter);
    char *err = NULL;
    rocksdb_put(d->db, d->wsync, KEY_EPOCH, strlen(KEY_EPOCH), (const char *)cv, 8, &err);
    return rdb_check(err, "write", KEY_EPOCH);
}

hyla_status hyla_coord_dir_get_counter(hyla_coord_dir *d, uint64_t *counter) {
    *counter = 0;
    size_t len = 0;
    char *err = NULL;
    char *v = rocksdb_get(d->db, d->ropts, KEY_EPOCH, strlen(KEY_EPOCH), &len, &err);
    HYLA_TRY(rdb_check(err, "read", KEY_EPOCH));
    if (!v)
        return HYLA_OK;
    hyla_status st = HYLA_OK;
    if (len != 8)
        st = hyla_fail(HYLA_ERR_FORMAT, "session directory %s: key %s holds %zu bytes, expected 8", d->path,
                       KEY_EPOCH, len);
    else
        *counter = hyla_get_le64((const uint8_t *)v);
    rocksdb_free(v);
    return st;
}

typedef struct {
    hyla_coord_dir *d;
    hyla_coord_dir_fn fn;
    hyla_coord_dir_key_fn key_fn;
    void *ud;
} scan_ctx;

static hyla_status scan_session(void *ctx, const char *k, size_t kl, const char *val, size_t vl) {
    scan_ctx *sc = ctx;
    hyla_coord_dir *d = sc->d;
    const uint8_t *v = (const uint8_t *)val;
    size_t plen = strlen(SESSION_PREFIX);
    char key[300];
    snprintf(key, sizeof key, "%.*s", (int)(kl < 290 ? kl : 290), k);
    if (vl < 16 || memcmp(v, HYLA_COORD_DIR_MAGIC, 4) != 0)
        return hyla_fail(HYLA_ERR_FORMAT, "session directory %s: record %s: no %s magic (%zu bytes)", d->path, key,
                         HYLA_COORD_DIR_MAGIC, vl);
    uint32_t ver = hyla_get_le32(v + 4);
    if (ver != HYLA_COORD_DIR_VERSION)
        return hyla_fail(HYLA_ERR_FORMAT, "session directory %s: record %s: format version %u, this build reads %u",
                         d->path, key, ver, HYLA_COORD_DIR_VERSION);
    uint64_t epoch = hyla_get_le64(v + 8);
    Hyla__V1__Session *s = hyla__v1__session__unpack(NULL, vl - 16, v + 16);
    hyla_status st;
    if (!s || !s->session_id || strcmp(s->session_id, key + plen) != 0) {
        st = hyla_fail(HYLA_ERR_FORMAT, "session directory %s: record %s does not decode as hyla.v1.Session%s",
                       d->path, key, s ? " of that id" : "");
    } else {
        st = sc->fn(sc->ud, s, epoch);
    }
    if (s)
        hyla__v1__session__free_unpacked(s, NULL);
    return st;
}

hyla_status hyla_coord_dir_scan(hyla_coord_dir *d, hyla_coord_dir_fn fn, void *ud) {
    scan_ctx sc = {d, fn, NULL, ud};
    return scan_prefix(d, SESSION_PREFIX, scan_session, &sc);
}

typedef struct {
    hyla_store *store;
    uint64_t lost;
} check_ctx;

static hyla_status check_one(void *ud, const Hyla__V1__Session *s, uint64_t epoch) {
    (void)epoch;
    check_ctx *c = ud;
    uint64_t want = s->last_snapshot ? s->last_snapshot->version : 0;
    if (!want)
        return HYLA_OK;
    hyla_store_session_info info;
    hyla_status st = hyla_store_info(c->store, s->session_id, &info);
    if (st == HYLA_OK && info.head_version >= want)
        return HYLA_OK;
    if (st != HYLA_OK && st != HYLA_ERR_NOT_FOUND && st != HYLA_ERR_CORRUPT)
        return st;
    c->lost++;
    if (st == HYLA_OK)
        HYLA_ERROR("session %s: its committed snapshot version %llu was lost by the store (whose newest version of it "
                   "is %llu); it answers DATA_LOSS",
                   s->session_id, (unsigned long long)want, (unsigned long long)info.head_version);
    else
        HYLA_ERROR("session %s: its committed snapshot version %llu was lost by the store (%s); it answers DATA_LOSS",
                   s->session_id, (unsigned long long)want, hyla_last_error());
    return HYLA_OK;
}

hyla_status hyla_coord_dir_check_store(hyla_coord_dir *d, hyla_store *store, uint64_t *lost) {
    check_ctx c = {store, 0};
    hyla_status st = hyla_coord_dir_scan(d, check_one, &c);
    if (lost)
        *lost = c.lost;
    return st;
}

#define KEY_PREFIX "k/"

hyla_status hyla_coord_dir_put_key(hyla_coord_dir *d, const char *id, const void *val, size_t len) {
    char key[128];
    int kl = snprintf(key, sizeof key, KEY_PREFIX "%s", id);
    HYLA_ASSERT(kl > 0 && (size_t)kl < sizeof key);
    char *err = NULL;
    rocksdb_put(d->db, d->wsync, key, (size_t)kl, val, len, &err);
    return rdb_check(err, "write", key);
}

hyla_status hyla_coord_dir_delete_key(hyla_coord_dir *d, const char *id) {
    char key[128];
    return delete_prefixed(d, KEY_PREFIX, id, key, sizeof key);
}

static hyla_status scan_key(void *ctx, const char *k, size_t kl, const char *v, size_t vl) {
    scan_ctx *sc = ctx;
    size_t plen = strlen(KEY_PREFIX);
    char id[128];
    snprintf(id, sizeof id, "%.*s", (int)(kl - plen < 100 ? kl - plen : 100), k + plen);
    return sc->key_fn(sc->ud, id, v, vl);
}

hyla_status hyla_coord_dir_scan_keys(hyla_coord_dir *d, hyla_coord_dir_key_fn fn, void *ud) {
    scan_ctx sc = {d, NULL, fn, ud};
    return scan_prefix(d, KEY_PREFIX, scan_key, &sc);
}
