/* test_store.c — the RocksDB statestore: bit-exact round trip of every part kind, incremental
 * KV (only new pages are written: bytes counted), incremental puts referencing the base's chunks
 * (hyla_store_put_since: same manifest as a full put, refusals), fork (shares chunks, survives deleting the
 * parent), GC of superseded versions, every refusal (corrupt / missing / truncated chunk,
 * unknown format version, wrong fingerprint, wrong shape/dtype) provoked through RocksDB
 * directly with the message checked to name session, version, layer, part and chunk, failed
 * writes (fault hook) leaving the previous snapshot readable, concurrent puts, puts of
 * arena snapshots (as the runtime exports them), and streaming reads (hyla_store_read_*: every
 * byte reported once and final when reported, the same refusals). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <rocksdb/c.h>
#include <xxhash.h>

#include "hyla_codec_test.h"
#include "hyla_store.h"
#include "hyla_store_test.h"
#include "hyla_test.h"
#include "test_store_util.h"

static char root[256];
static int dir_no;

static void new_dir(char *buf, size_t n) { snprintf(buf, n, "%s/db%d", root, dir_no++); }

static hyla_store_params small_params(void) {
    hyla_store_params p = hyla_store_default_params();
    p.codec.chunk_bytes = 64 << 10; /* several chunks per part in small snapshots */
    p.write_buffer_bytes = 8 << 20;
    return p;
}

static hyla_store *open_store(const char *dir, const hyla_store_params *p) {
    hyla_store *st = NULL;
    CHECK_OK(hyla_store_open(dir, p, &st));
    if (!st) exit(1);
    return st;
}

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

static int verify_clean(hyla_store *st) {
    uint64_t problems = 0;
    hyla_status s = hyla_store_verify(st, NULL, NULL, NULL, &problems);
    if (s != HYLA_OK) fprintf(stderr, "verify: %s\n", hyla_last_error());
    return s == HYLA_OK && problems == 0;
}

static void test_roundtrip(void) {
    char dir[300];
    new_dir(dir, sizeof dir);
    hyla_store_params p = small_params();
    hyla_store *st = open_store(dir, &p);
    hyla_snapshot *a = tsu_make(1, 1, 700, 42), *b = tsu_make(2, 1, 900, 42);
    uint64_t v1 = 0, v2 = 0;
    hyla_store_put_stats ps;
    CHECK_OK(hyla_store_put(st, "s1", a, &v1, &ps));
    CHECK(v1 == 1);
    CHECK(ps.raw_bytes == hyla_snapshot_bytes(a) && ps.raw_bytes_written == ps.raw_bytes);
    CHECK_OK(hyla_store_put(st, "s1", b, &v2, NULL));
    CHECK(v2 == 2);
    CHECK(get_equals(st, "s1", 0, b));
    CHECK(get_equals(st, "s1", 1, a));
    CHECK(get_equals(st, "s1", 2, b));
    /* every part kind present */
    int kinds = 0;
    for (uint32_t i = 0; i < a->n_parts; i++) kinds |= 1 << a->parts[i].kind;
    CHECK(kinds == ((1 << HYLA_PART_RECURRENT) | (1 << HYLA_PART_PARTITION) | (1 << HYLA_PART_KV)));
    /* survives close / reopen */
    hyla_store_close(st);
    st = open_store(dir, &p);
    CHECK(get_equals(st, "s1", 0, b));
    hyla_store_session_info *l = NULL;
    size_t n = 0;
    CHECK_OK(hyla_store_list(st, &l, &n));
    CHECK(n == 1 && l && !strcmp(l[0].id, "s1") && l[0].head_version == 2 && l[0].n_versions == 2 &&
          l[0].raw_bytes == hyla_snapshot_bytes(b) && l[0].model_fingerprint == 42);
    free(l);
    CHECK(verify_clean(st));
    /* a missing session */
    hyla_snapshot *t = NULL;
    CHECK(hyla_store_get(st, "nobody", 0, 0, &t, NULL) == HYLA_ERR_NOT_FOUND);
    CHECK(strstr(hyla_last_error(), "nobody") != NULL);
    /* bad ids */
    CHECK(hyla_store_put(st, "", a, NULL, NULL) == HYLA_ERR_INVALID_ARG);
    CHECK(hyla_store_put(st, "a\nb", a, NULL, NULL) == HYLA_ERR_INVALID_ARG);
    /* read-only open sees the same, refuses writes */
    hyla_store_close(st);
    hyla_store_params ro = p;
    ro.read_only = 1;
    st = open_store(dir, &ro);
    CHECK(get_equals(st, "s1", 0, b));
    CHECK(hyla_store_put(st, "s2", a, NULL, NULL) == HYLA_ERR_UNSUPPORTED);
    hyla_store_close(st);
    /* bf16 option through the store */
    p.codec.f32_as_bf16 = 1;
    st = open_store(dir, &p);
    CHECK_OK(hyla_store_put(st, "lossy", a, NULL, NULL));
    CHECK_OK(hyla_store_get(st, "lossy", 0, 0, &t, NULL));
    if (t) {
        hyla_state_part *x = hyla_snapshot_find(t, 1, "Sp"), *y = hyla_snapshot_find(a, 1, "Sp");
        CHECK(x && y && x->dtype == HYLA_DT_F32);
        if (x && y) CHECK_CLOSE((float *)x->data, (float *)y->data, y->nbytes / 4, 1e-30, 1.0 / 256, "bf16 Sp");
        hyla_manifest *m = NULL;
        CHECK_OK(hyla_store_get_manifest(st, "lossy", 0, &m, NULL));
        CHECK(m && m->parts[3].stored_dtype == HYLA_DT_BF16 && m->parts[4].stored_dtype == HYLA_DT_BF16);
        hyla_manifest_destroy(m);
    }
    hyla_snapshot_destroy(t);
    hyla_store_close(st);
    hyla_snapshot_destroy(a);
    hyla_snapshot_destroy(b);
}

/* Expected raw bytes written by a put of `next` after `prev` (all non-KV parts changed; KV rows
 * identical up to prev's tokens): every non-KV byte + KV chunks from the first not full in prev. */
static uint64_t expected_incremental(const hyla_snapshot *prev, const hyla_snapshot *next, uint32_t chunk_bytes) {
    uint64_t n = 0;
    for (uint32_t i = 0; i < next->n_parts; i++) {
        const hyla_state_part *q = &next->parts[i];
        if (q->kind != HYLA_PART_KV) {
            n += q->nbytes;
            continue;
        }
        uint64_t row = q->nbytes / q->shape[0];
        uint64_t page = row * q->page_tokens;
        uint64_t stride = (chunk_bytes / page) * page;
        uint64_t full_old = prev->parts[i].nbytes / stride;
        n += q->nbytes - full_old * stride;
    }
    return n;
}

/* A put of an arena snapshot (parts in one caller buffer, as the runtime's exports are) is an
 * ordinary put: it reads back equal, incremental on a base like any other. */
/* The store read through mmap (hyla_store_params.mmap_reads, HYLA_STORE_MMAP_READS) gives back
 * what it was given, after a reopen too; the switch refuses what it does not know, naming it. */
static void test_mmap_reads(void) {
    char dir[300];
    new_dir(dir, sizeof dir);
    hyla_store_params p = small_params();
    p.mmap_reads = 1;
    p.nowal_bytes = 0; /* chunks straight to blob files: the gets read the files */
    hyla_store *st = open_store(dir, &p);
    hyla_snapshot *a = tsu_make(1, 1, 700, 7), *b = tsu_make(2, 1, 900, 7);
    uint64_t v = 0;
    CHECK_OK(hyla_store_put(st, "m1", a, &v, NULL));
    CHECK_OK(hyla_store_put(st, "m1", b, &v, NULL));
    CHECK(get_equals(st, "m1", 1, a));
    CHECK(get_equals(st, "m1", 2, b));
    hyla_store_close(st);
    setenv("HYLA_STORE_MMAP_READS", "1", 1);
    p.mmap_reads = 0;
    st = open_store(dir, &p);
    CHECK(get_equals(st, "m1", 1, a));
    CHECK(get_equals(st, "m1", 2, b));
    CHECK(verify_clean(st));
    hyla_store_close(st);
    setenv("HYLA_STORE_MMAP_READS", "yes", 1);
    hyla_store *bad = NULL;
    hyla_status s = hyla_store_open(dir, &p, &bad);
    CHECK_MSG(s == HYLA_ERR_INVALID_ARG && !bad && strstr(hyla_last_error(), "HYLA_STORE_MMAP_READS='yes'"),
              "HYLA_STORE_MMAP_READS=yes: expected a refusal naming it, got %s: %s", hyla_status_str(s),
              hyla_last_error());
    unsetenv("HYLA_STORE_MMAP_READS");
    hyla_snapshot_destroy(a);
    hyla_snapshot_destroy(b);
}

static void test_arena_put(void) {
    char dir[300];
    new_dir(dir, sizeof dir);
    hyla_store_params p = small_params();
    hyla_store *st = open_store(dir, &p);
    hyla_snapshot *a = tsu_make(1, 1, 700, 42), *b = tsu_make(2, 1, 900, 42);
    size_t need = tsu_arena_bytes(b);
    void *buf = aligned_alloc(64, need);
    hyla_snapshot *ab = tsu_arena_copy(b, buf, need, NULL, NULL);
    CHECK(ab && hyla_snapshot_equal(ab, b));
    uint64_t v = 0;
    hyla_store_put_stats ps;
    CHECK_OK(hyla_store_put(st, "s", a, &v, NULL));
    if (ab) CHECK_OK(hyla_store_put(st, "s", ab, &v, &ps));
    CHECK(v == 2 && ps.raw_bytes_written == expected_incremental(a, b, p.codec.chunk_bytes));
    CHECK(get_equals(st, "s", 2, b));
    CHECK(verify_clean(st));
    hyla_snapshot_destroy(ab);
    free(buf);
    hyla_store_close(st);
    hyla_snapshot_destroy(a);
    hyla_snapshot_destroy(b);
}

static void test_incremental(uint64_t nowal_bytes) {
    char dir[300];
    new_dir(dir, sizeof dir);
    hyla_store_params p = small_params();
    p.nowal_bytes = nowal_bytes;
    hyla_store *st = open_store(dir, &p);
    hyla_snapshot *a = tsu_make(10, 77, 2000, 1), *b = tsu_make(11, 77, 2512, 1);
    hyla_store_put_stats s1, s2, s3;
    CHECK_OK(hyla_store_put(st, "inc", a, NULL, &s1));
    CHECK_OK(hyla_store_put(st, "inc", b, NULL, &s2));
    uint64_t want = expected_incremental(a, b, p.codec.chunk_bytes);
    CHECK_MSG(s2.raw_bytes_written == want, "incremental put wrote %llu raw bytes, expected %llu (of %llu)",
              (unsigned long long)s2.raw_bytes_written, (unsigned long long)want, (unsigned long long)s2.raw_bytes);
    CHECK(s2.raw_bytes_written < s2.raw_bytes);
    CHECK(s2.bytes_written < s1.bytes_written);
    /* the same state again writes no chunk */
    CHECK_OK(hyla_store_put(st, "inc", b, NULL, &s3));
    CHECK(s3.chunks_written == 0 && s3.raw_bytes_written == 0 && s3.bytes_written == s3.manifest_bytes);
    CHECK(get_equals(st, "inc", 0, b));
    CHECK(verify_clean(st));
    hyla_store_close(st);
    hyla_snapshot_destroy(a);
    hyla_snapshot_destroy(b);
}

/* shared[i] = bytes of prev's KV part i (KV rows of earlier tokens never change), 0 elsewhere;
 * with all_same, also every other part (prev and next have equal non-KV parts). */
static uint64_t *kv_shared(const hyla_snapshot *prev, const hyla_snapshot *next, int all_same) {
    uint64_t *sh = calloc(next->n_parts + 1, sizeof *sh);
    for (uint32_t i = 0; i < next->n_parts; i++)
        if (next->parts[i].kind == HYLA_PART_KV || all_same) sh[i] = prev->parts[i].nbytes;
    return sh;
}

/* The bytes an incremental put does not send: anything (here a pattern, not zeros). */
static hyla_snapshot *garbled(const hyla_snapshot *s, const uint64_t *shared) {
    hyla_snapshot *g = NULL;
    CHECK_OK(hyla_snapshot_clone(s, &g));
    for (uint32_t i = 0; g && i < g->n_parts; i++) memset(g->parts[i].data, 0xA5, shared[i]);
    return g;
}

static int same_manifest(hyla_store *x, const char *sx, uint64_t vx, hyla_store *y, const char *sy, uint64_t vy) {
    hyla_manifest *a = NULL, *b = NULL;
    CHECK_OK(hyla_store_get_manifest(x, sx, vx, &a, NULL));
    CHECK_OK(hyla_store_get_manifest(y, sy, vy, &b, NULL));
    int eq = a && b && a->checksum == b->checksum && a->n_chunks == b->n_chunks;
    for (size_t i = 0; eq && i < a->n_chunks; i++) eq = !memcmp(a->chunks[i].key, b->chunks[i].key, HYLA_CHUNK_KEY_BYTES);
    hyla_manifest_destroy(a);
    hyla_manifest_destroy(b);
    return eq;
}

/* The codec alone: a plan taking chunks from the base manifest, with only the bytes
 * [filled_from, shared) filled in, has the same manifest bytes as a plan of the whole snapshot. */
static void test_plan_reusing(void) {
    hyla_codec_params cp = hyla_codec_default_params();
    cp.chunk_bytes = 32 << 10; /* 2 pages of 16 KiB per KV chunk, 16 chunks per KV part */
    hyla_snapshot *a = tsu_make(10, 77, 2000, 1), *b = tsu_make(11, 77, 2512, 1);
    uint64_t *sh = kv_shared(a, b, 0);
    hyla_codec_plan *pa = NULL, *pb = NULL, *pr = NULL;
    CHECK_OK(hyla_codec_plan_create(a, &cp, &pa));
    CHECK_OK(hyla_codec_plan_create(b, &cp, &pb));
    hyla_manifest *ma = NULL;
    if (pa) CHECK_OK(hyla_manifest_parse(pa->manifest, pa->manifest_len, "base", &ma));
    hyla_snapshot *g = garbled(b, sh);
    uint64_t from[16] = {0};
    CHECK(b->n_parts <= 16);
    CHECK_OK(hyla_codec_plan_reuse(g, &cp, ma, sh, from));
    for (uint32_t i = 0; i < b->n_parts; i++) {
        const hyla_state_part *q = &b->parts[i];
        uint64_t stride = 2 * 64 * q->nbytes / q->shape[0]; /* KV: 2 pages of 64 tokens */
        uint64_t want = q->kind == HYLA_PART_KV ? sh[i] / stride * stride : 0;
        CHECK_MSG(from[i] == want, "part %s: filled_from %llu, expected %llu", q->name, (unsigned long long)from[i],
                  (unsigned long long)want);
        memcpy((uint8_t *)g->parts[i].data + from[i], (const uint8_t *)q->data + from[i], sh[i] - from[i]);
    }
    CHECK_OK(hyla_codec_plan_create_reusing(g, &cp, ma, sh, &pr));
    if (pr && pb) {
        size_t reused = 0;
        for (size_t i = 0; i < pr->n_chunks; i++) reused += pr->chunks[i].reused;
        CHECK(reused == 2 * 15); /* 2000 tokens = 15 whole chunks of 128 tokens in each of k, v */
        CHECK(pr->manifest_len == pb->manifest_len && !memcmp(pr->manifest, pb->manifest, pb->manifest_len));
    }
    hyla_codec_plan_destroy(pa);
    hyla_codec_plan_destroy(pb);
    hyla_codec_plan_destroy(pr);
    hyla_manifest_destroy(ma);
    hyla_snapshot_destroy(g);
    hyla_snapshot_destroy(a);
    hyla_snapshot_destroy(b);
    free(sh);
}

/* hyla_store_put_since: the prefix is not in the snapshot, only base chunks cover it; the result
 * reads back bit for bit, its manifest equals a full put's, only the tail is written; refusals
 * leave the head as it was. lossy: fp32 parts stored as bf16, with shared claims on them too
 * (their prefix is decoded from the base instead of referenced). */
static void test_put_since(uint64_t nowal_bytes, int lossy) {
    char dir[300], dir2[300];
    new_dir(dir, sizeof dir);
    new_dir(dir2, sizeof dir2);
    hyla_store_params p = small_params();
    p.codec.chunk_bytes = 32 << 10;
    p.codec.f32_as_bf16 = lossy;
    p.nowal_bytes = nowal_bytes;
    hyla_store *st = open_store(dir, &p), *full = open_store(dir2, &p);
    /* lossy: the same seed, so the non-KV parts are equal too and may be claimed shared */
    hyla_snapshot *a = tsu_make(10, 77, 2000, 1), *b = tsu_make(lossy ? 10 : 11, 77, 2512, 1);
    uint64_t *sh = kv_shared(a, b, lossy);
    hyla_snapshot *g = garbled(b, sh);
    uint64_t v = 0;
    hyla_store_put_stats fs, ps;
    CHECK_OK(hyla_store_put(st, "inc", a, &v, NULL));
    CHECK_OK(hyla_store_put(full, "inc", a, NULL, NULL));
    CHECK_OK(hyla_store_put(full, "inc", b, NULL, &fs));
    CHECK_OK(hyla_store_put_since(st, "inc", g, 1, sh, &v, &ps));
    CHECK(v == 2);
    CHECK(same_manifest(st, "inc", 2, full, "inc", 2));
    if (!lossy) {
        CHECK(get_equals(st, "inc", 2, b));
        CHECK_MSG(ps.raw_bytes_written == expected_incremental(a, b, p.codec.chunk_bytes),
                  "put_since wrote %llu raw bytes, expected %llu", (unsigned long long)ps.raw_bytes_written,
                  (unsigned long long)expected_incremental(a, b, p.codec.chunk_bytes));
    } else {
        hyla_snapshot *want = NULL;
        CHECK_OK(hyla_store_get(full, "inc", 2, 0, &want, NULL));
        if (want) CHECK(get_equals(st, "inc", 2, want));
        hyla_snapshot_destroy(want);
    }
    CHECK(ps.chunks_written == fs.chunks_written && ps.raw_bytes_written == fs.raw_bytes_written);
    CHECK(ps.chunks == fs.chunks && ps.chunks_written < ps.chunks);
    /* refusals: a base whose part is shorter than the claim, a base that does not exist */
    hyla_snapshot *c = tsu_make(12, 77, 2600, 1);
    uint64_t *bad = kv_shared(b, c, 0);
    for (uint32_t i = 0; i < c->n_parts; i++)
        if (bad[i]) bad[i] += 64 * 256; /* 64 tokens beyond version 2's */
    hyla_status s = hyla_store_put_since(st, "inc", c, 2, bad, &v, NULL);
    CHECK_MSG(s == HYLA_ERR_FORMAT && strstr(hyla_last_error(), "session inc") &&
                  strstr(hyla_last_error(), "version 2") && strstr(hyla_last_error(), "layer 2 part 'k'"),
              "short base: %s: %s", hyla_status_str(s), hyla_last_error());
    uint64_t *ok = kv_shared(b, c, 0);
    s = hyla_store_put_since(st, "inc", c, 7, ok, &v, NULL);
    CHECK_MSG(s == HYLA_ERR_NOT_FOUND && strstr(hyla_last_error(), "session inc") &&
                  strstr(hyla_last_error(), "version 7"),
              "missing base: %s: %s", hyla_status_str(s), hyla_last_error());
    hyla_store_session_info info;
    CHECK_OK(hyla_store_info(st, "inc", &info));
    CHECK(info.head_version == 2);
    if (!lossy) CHECK(get_equals(st, "inc", 0, b));
    /* a third version on the second, then the first is dropped (keep_versions 2): still whole */
    CHECK_OK(hyla_store_put_since(st, "inc", c, 2, ok, &v, NULL));
    CHECK(v == 3);
    if (!lossy) CHECK(get_equals(st, "inc", 3, c));
    CHECK(verify_clean(st));
    hyla_store_close(st);
    hyla_store_close(full);
    hyla_snapshot_destroy(a);
    hyla_snapshot_destroy(b);
    hyla_snapshot_destroy(c);
    hyla_snapshot_destroy(g);
    free(sh);
    free(bad);
    free(ok);
}

static void test_fork_and_gc(void) {
    char dir[300];
    new_dir(dir, sizeof dir);
    hyla_store_params p = small_params();
    p.keep_versions = 2;
    hyla_store *st = open_store(dir, &p);
    hyla_snapshot *a = tsu_make(20, 20, 1000, 3);
    CHECK_OK(hyla_store_put(st, "parent", a, NULL, NULL));
    hyla_store_usage_info u0, u1, u2;
    CHECK_OK(hyla_store_usage(st, &u0));
    CHECK_OK(hyla_store_fork(st, "parent", 0, "child"));
    CHECK_OK(hyla_store_usage(st, &u1));
    CHECK(u1.chunks == u0.chunks && u1.chunk_bytes == u0.chunk_bytes); /* nothing copied */
    CHECK(u1.sessions == 2 && u1.versions == 2 && u1.referenced_raw_bytes == 2 * u0.referenced_raw_bytes);
    CHECK(hyla_store_fork(st, "parent", 0, "child") == HYLA_ERR_EXISTS);
    CHECK(hyla_store_fork(st, "nobody", 0, "x") == HYLA_ERR_NOT_FOUND);
    CHECK_OK(hyla_store_delete(st, "parent"));
    CHECK(get_equals(st, "child", 0, a));
    CHECK_OK(hyla_store_usage(st, &u2));
    CHECK(u2.chunks == u0.chunks && u2.sessions == 1);
    CHECK(verify_clean(st));
    hyla_snapshot *t = NULL;
    CHECK(hyla_store_get(st, "parent", 0, 0, &t, NULL) == HYLA_ERR_NOT_FOUND);
    /* superseded versions: 4 puts keep the last 2; chunks of dropped versions are deleted */
    for (int i = 0; i < 4; i++) {
        hyla_snapshot *x = tsu_make(100 + (uint64_t)i, 100 + (uint64_t)i, 300, 3);
        CHECK_OK(hyla_store_put(st, "child", x, NULL, NULL));
        hyla_snapshot_destroy(x);
    }
    uint64_t *vers = NULL;
    size_t nv = 0;
    CHECK_OK(hyla_store_versions(st, "child", &vers, &nv));
    CHECK(nv == 2 && vers && vers[0] == 4 && vers[1] == 5);
    free(vers);
    CHECK(hyla_store_get(st, "child", 1, 0, &t, NULL) == HYLA_ERR_NOT_FOUND);
    CHECK(verify_clean(st));
    hyla_store_usage_info u3;
    CHECK_OK(hyla_store_usage(st, &u3));
    hyla_manifest *m4 = NULL, *m5 = NULL;
    CHECK_OK(hyla_store_get_manifest(st, "child", 4, &m4, NULL));
    CHECK_OK(hyla_store_get_manifest(st, "child", 5, &m5, NULL));
    if (m4 && m5) CHECK_MSG(u3.chunks == m4->n_chunks + m5->n_chunks, "%llu chunks stored, versions have %zu + %zu",
                            (unsigned long long)u3.chunks, m4->n_chunks, m5->n_chunks);
    hyla_manifest_destroy(m4);
    hyla_manifest_destroy(m5);
    /* deleting the last session frees every chunk; gc compacts */
    CHECK_OK(hyla_store_delete(st, "child"));
    hyla_store_gc_stats gs;
    CHECK_OK(hyla_store_gc(st, &gs));
    CHECK_OK(hyla_store_usage(st, &u3));
    CHECK(u3.chunks == 0 && u3.sessions == 0 && u3.versions == 0);
    hyla_store_close(st);
    hyla_snapshot_destroy(a);
}

/* ---- refusals through RocksDB directly ---- */

typedef struct {
    rocksdb_t *db;
    rocksdb_options_t *o;
    rocksdb_column_family_handle_t *cf[3];
    rocksdb_readoptions_t *ro;
    rocksdb_writeoptions_t *wo;
} raw_db;

static void raw_open(raw_db *r, const char *dir) {
    r->o = rocksdb_options_create();
    const char *names[3] = {"default", HYLA_STORE_CF_CHUNKS, HYLA_STORE_CF_META};
    const rocksdb_options_t *opts[3] = {r->o, r->o, r->o};
    char *err = NULL;
    r->db = rocksdb_open_column_families(r->o, dir, 3, names, opts, r->cf, &err);
    if (err) {
        fprintf(stderr, "raw open: %s\n", err);
        exit(1);
    }
    r->ro = rocksdb_readoptions_create();
    r->wo = rocksdb_writeoptions_create();
}

static void raw_close(raw_db *r) {
    for (int i = 0; i < 3; i++) rocksdb_column_family_handle_destroy(r->cf[i]);
    rocksdb_close(r->db);
    rocksdb_options_destroy(r->o);
    rocksdb_readoptions_destroy(r->ro);
    rocksdb_writeoptions_destroy(r->wo);
}

/* DAMAGE_MANIFEST_VERSION: the manifest of a newer format (version 2, its checksum made anew);
 * DAMAGE_VERSION_FLIP: a version field damaged in place (the checksum no longer matches) */
typedef enum { DAMAGE_FLIP, DAMAGE_DELETE, DAMAGE_TRUNCATE, DAMAGE_MANIFEST_VERSION, DAMAGE_VERSION_FLIP } damage;
static int manifest_damage(damage d) { return d == DAMAGE_MANIFEST_VERSION || d == DAMAGE_VERSION_FLIP; }

/* Damage chunk `chunk` of (layer, part) of session's head, or its manifest. */
static void damage_store(const char *dir, const char *sid, uint64_t ver, uint32_t layer, const char *part,
                         uint32_t chunk, damage d) {
    hyla_store_params p = small_params();
    hyla_store *st = open_store(dir, &p);
    hyla_manifest *m = NULL;
    CHECK_OK(hyla_store_get_manifest(st, sid, ver, &m, NULL));
    hyla_store_close(st);
    if (!m) return;
    const uint8_t *key = NULL;
    for (size_t i = 0; i < m->n_chunks; i++) {
        const hyla_manifest_part *mp = &m->parts[m->chunks[i].part];
        if (mp->desc.layer == layer && !strcmp(mp->desc.name, part) && m->chunks[i].index == chunk) key = m->chunks[i].key;
    }
    CHECK(key != NULL);
    raw_db r;
    raw_open(&r, dir);
    char *err = NULL;
    size_t vl = 0;
    if (manifest_damage(d)) { /* the manifest, not a chunk */
        char k[300];
        size_t n = strlen(sid);
        k[0] = 'M';
        memcpy(k + 1, sid, n);
        k[n + 1] = 0;
        for (int i = 0; i < 8; i++) k[n + 2 + i] = (char)(ver >> (56 - 8 * i));
        char *v = rocksdb_get_cf(r.db, r.ro, r.cf[2], k, n + 10, &vl, &err);
        CHECK(v && !err);
        if (v) {
            v[8] = 2; /* format version 1 -> 2 */
            if (d == DAMAGE_MANIFEST_VERSION && vl > 8) {
                uint64_t x = XXH64(v, vl - 8, 0);
                for (int i = 0; i < 8; i++) v[vl - 8 + i] = (char)(x >> (8 * i));
            }
            rocksdb_put_cf(r.db, r.wo, r.cf[2], k, n + 10, v, vl, &err);
            rocksdb_free(v);
        }
    } else if (key) {
        char *v = rocksdb_get_cf(r.db, r.ro, r.cf[1], (const char *)key, HYLA_CHUNK_KEY_BYTES, &vl, &err);
        CHECK(v && !err && vl > 64);
        if (v) {
            if (d == DAMAGE_FLIP) {
                v[vl / 2] ^= 0x04;
                rocksdb_put_cf(r.db, r.wo, r.cf[1], (const char *)key, HYLA_CHUNK_KEY_BYTES, v, vl, &err);
            } else if (d == DAMAGE_TRUNCATE) {
                rocksdb_put_cf(r.db, r.wo, r.cf[1], (const char *)key, HYLA_CHUNK_KEY_BYTES, v, vl - 17, &err);
            } else {
                rocksdb_delete_cf(r.db, r.wo, r.cf[1], (const char *)key, HYLA_CHUNK_KEY_BYTES, &err);
            }
            rocksdb_free(v);
        }
    }
    CHECK(err == NULL);
    rocksdb_free(err);
    raw_close(&r);
    hyla_manifest_destroy(m);
}

static int msg_has(const char *msg, const char *needle, const char *what) {
    if (strstr(msg, needle)) return 1;
    fprintf(stderr, "%s: message '%s' lacks '%s'\n", what, msg, needle);
    return 0;
}

static int verify_found;
static char verify_msg[2048];
static void on_report(void *ctx, const char *msg) {
    (void)ctx;
    verify_found++;
    snprintf(verify_msg, sizeof verify_msg, "%s", msg);
}

static void refusal(const char *dir, const char *sid, damage d, hyla_status want, const char *reason) {
    damage_store(dir, sid, 1, 1, "Sp", 0, d);
    hyla_store_params p = small_params();
    hyla_store *st = open_store(dir, &p);
    hyla_snapshot *t = NULL;
    hyla_status s = hyla_store_get(st, sid, 0, 0, &t, NULL);
    CHECK_MSG(s == want, "%s: got %s (%s)", reason, hyla_status_str(s), hyla_last_error());
    CHECK(t == NULL);
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", hyla_last_error());
    char sv[300];
    snprintf(sv, sizeof sv, "session %s version 1", sid);
    CHECK(msg_has(msg, sv, reason));
    CHECK(msg_has(msg, reason, reason));
    if (!manifest_damage(d)) {
        CHECK(msg_has(msg, "layer 1 part Sp", reason));
        CHECK(msg_has(msg, "chunk 0/", reason));
    }
    /* a streaming read refuses it the same way (the manifest opens; the chunk fails) */
    hyla_store_reader *r = NULL;
    s = hyla_store_read_open(st, sid, 0, 0, &r);
    if (manifest_damage(d)) {
        CHECK_MSG(s == want && r == NULL, "stream open %s: got %s", reason, hyla_status_str(s));
    } else if (r) {
        CHECK_OK(s);
        const hyla_snapshot *l = hyla_store_read_layout(r);
        hyla_snapshot *dst = hyla_snapshot_create();
        for (uint32_t i = 0; i < l->n_parts; i++) {
            hyla_state_part *q;
            CHECK_OK(hyla_snapshot_add_part(dst, l->parts[i].layer, l->parts[i].name, (hyla_part_kind)l->parts[i].kind,
                                            (hyla_dtype)l->parts[i].dtype, l->parts[i].ndim, l->parts[i].shape,
                                            l->parts[i].page_tokens, &q));
        }
        s = hyla_store_read_chunks(r, dst, NULL, NULL);
        CHECK_MSG(s == want, "stream %s: got %s (%s)", reason, hyla_status_str(s), hyla_last_error());
        CHECK(msg_has(hyla_last_error(), sv, reason) && msg_has(hyla_last_error(), "layer 1 part Sp", reason) &&
              msg_has(hyla_last_error(), reason, reason));
        hyla_snapshot_destroy(dst);
        hyla_store_read_close(r);
    } else {
        CHECK_MSG(0, "stream open %s: %s", reason, hyla_last_error());
    }
    /* verify finds it too and names the same place */
    verify_found = 0;
    uint64_t problems = 0;
    CHECK(hyla_store_verify(st, sid, on_report, NULL, &problems) != HYLA_OK);
    CHECK(problems >= 1 && verify_found >= 1);
    CHECK(msg_has(verify_msg, manifest_damage(d) ? "format version" : "layer 1 part Sp", "verify"));
    /* another session is unaffected */
    hyla_snapshot_destroy(t);
    hyla_store_close(st);
}

static void test_refusals(void) {
    char dir[300];
    new_dir(dir, sizeof dir);
    hyla_store_params p = small_params();
    hyla_store *st = open_store(dir, &p);
    const char *sids[5] = {"flip", "gone", "short", "ver", "verflip"};
    hyla_snapshot *snaps[5];
    for (int i = 0; i < 5; i++) {
        snaps[i] = tsu_make(30 + (uint64_t)i, 30 + (uint64_t)i, 400, 99);
        CHECK_OK(hyla_store_put(st, sids[i], snaps[i], NULL, NULL));
    }
    hyla_snapshot *ok = tsu_make(50, 50, 400, 99);
    CHECK_OK(hyla_store_put(st, "ok", ok, NULL, NULL));
    /* wrong fingerprint */
    hyla_snapshot *t = NULL;
    CHECK(hyla_store_get(st, "ok", 0, 12345, &t, NULL) == HYLA_ERR_MISMATCH);
    CHECK(msg_has(hyla_last_error(), "session ok version 1", "fingerprint"));
    CHECK(msg_has(hyla_last_error(), "fingerprint", "fingerprint"));
    CHECK_OK(hyla_store_get(st, "ok", 0, 99, &t, NULL));
    /* wrong shape / dtype for the model: the runtime checks the layout it expects */
    if (t) {
        hyla_snapshot *model = tsu_make(0, 0, 0, 99);
        CHECK_OK(hyla_snapshot_check_layout(t, model));
        model->parts[1].shape[1] = 512; /* conv_q width */
        CHECK(hyla_snapshot_check_layout(t, model) == HYLA_ERR_MISMATCH);
        CHECK(msg_has(hyla_last_error(), "layer 0 part conv_q", "shape"));
        model->parts[1].shape[1] = 384;
        model->parts[4].dtype = HYLA_DT_F16;
        CHECK(hyla_snapshot_check_layout(t, model) == HYLA_ERR_MISMATCH);
        CHECK(msg_has(hyla_last_error(), "layer 2 part k", "dtype") && msg_has(hyla_last_error(), "dtype", "dtype"));
        hyla_snapshot_destroy(model);
    }
    hyla_snapshot_destroy(t);
    hyla_store_close(st);
    refusal(dir, "flip", DAMAGE_FLIP, HYLA_ERR_CORRUPT, "checksum mismatch");
    refusal(dir, "gone", DAMAGE_DELETE, HYLA_ERR_NOT_FOUND, "missing chunk");
    refusal(dir, "short", DAMAGE_TRUNCATE, HYLA_ERR_CORRUPT, "truncated value");
    refusal(dir, "ver", DAMAGE_MANIFEST_VERSION, HYLA_ERR_UNSUPPORTED, "format version 2");
    refusal(dir, "verflip", DAMAGE_VERSION_FLIP, HYLA_ERR_CORRUPT, "manifest checksum mismatch");
    st = open_store(dir, &p);
    CHECK(get_equals(st, "ok", 0, ok));
    hyla_store_close(st);
    for (int i = 0; i < 5; i++) hyla_snapshot_destroy(snaps[i]);
    hyla_snapshot_destroy(ok);
}

/* ---- streaming reads (hyla_store_read_*) ---- */

typedef struct {
    pthread_mutex_t mu;
    const hyla_snapshot *dst;  /* where the chunks land */
    const hyla_snapshot *want; /* what the bytes must be once reported */
    uint64_t got[16];          /* bytes reported per part */
    int bad;                   /* a range out of bounds, or reported before its bytes were final */
    int calls;
} stream_acc;

static void on_range(void *ctx, uint32_t part, uint64_t off, uint64_t len) {
    stream_acc *a = ctx;
    pthread_mutex_lock(&a->mu);
    a->calls++;
    if (part >= a->dst->n_parts || off + len > a->dst->parts[part].nbytes || part >= 16) a->bad = 1;
    else {
        a->got[part] += len;
        if (memcmp((const uint8_t *)a->dst->parts[part].data + off, (const uint8_t *)a->want->parts[part].data + off,
                   (size_t)len))
            a->bad = 1;
    }
    pthread_mutex_unlock(&a->mu);
}

/* A snapshot shaped like the reader's layout (zero-filled parts), the meta copied. */
static hyla_snapshot *layout_copy(const hyla_snapshot *l) {
    hyla_snapshot *c = hyla_snapshot_create();
    for (uint32_t i = 0; i < l->n_parts; i++) {
        const hyla_state_part *p = &l->parts[i];
        hyla_state_part *q;
        CHECK(p->data == NULL);
        CHECK_OK(hyla_snapshot_add_part(c, p->layer, p->name, (hyla_part_kind)p->kind, (hyla_dtype)p->dtype, p->ndim,
                                        p->shape, p->page_tokens, &q));
    }
    hyla_snapshot_copy_meta(c, l);
    return c;
}

/* One streaming read of sid into a fresh layout copy, checked against `want` (what
 * hyla_store_get returns): every byte reported once, and final when reported. */
static void stream_read_equals(hyla_store *st, const char *sid, const hyla_snapshot *want) {
    hyla_store_reader *r = NULL;
    CHECK_OK(hyla_store_read_open(st, sid, 0, want->model_fingerprint, &r));
    if (!r) return;
    CHECK(hyla_store_read_version(r) >= 1);
    hyla_snapshot *dst = layout_copy(hyla_store_read_layout(r));
    stream_acc a;
    memset(&a, 0, sizeof a);
    pthread_mutex_init(&a.mu, NULL);
    a.dst = dst;
    a.want = want;
    CHECK_OK(hyla_store_read_chunks(r, dst, on_range, &a));
    hyla_store_read_close(r);
    CHECK(!a.bad && a.calls > (int)want->n_parts); /* several chunks per part */
    for (uint32_t i = 0; i < dst->n_parts && i < 16; i++)
        CHECK_MSG(a.got[i] == dst->parts[i].nbytes, "part %u: %llu of %llu bytes reported", i,
                  (unsigned long long)a.got[i], (unsigned long long)dst->parts[i].nbytes);
    CHECK(hyla_snapshot_equal(dst, want));
    pthread_mutex_destroy(&a.mu);
    hyla_snapshot_destroy(dst);
}

static void test_stream_read(void) {
    char dir[300];
    new_dir(dir, sizeof dir);
    hyla_store_params p = small_params();
    hyla_store *st = open_store(dir, &p);
    hyla_snapshot *a = tsu_make(11, 11, 900, 77);
    CHECK_OK(hyla_store_put(st, "s", a, NULL, NULL));
    stream_read_equals(st, "s", a);
    /* a fingerprint of another model is refused at open, as by hyla_store_get */
    hyla_store_reader *r = NULL;
    CHECK(hyla_store_read_open(st, "s", 0, 78, &r) == HYLA_ERR_MISMATCH && r == NULL);
    CHECK(msg_has(hyla_last_error(), "session s version 1", "stream fingerprint"));
    CHECK(hyla_store_read_open(st, "nope", 0, 0, &r) == HYLA_ERR_NOT_FOUND && r == NULL);
    /* a target that is not laid out like the manifest is refused before any chunk is read */
    CHECK_OK(hyla_store_read_open(st, "s", 0, 0, &r));
    if (r) {
        hyla_snapshot *dst = layout_copy(hyla_store_read_layout(r));
        dst->parts[4].nbytes -= 2;
        CHECK(hyla_store_read_chunks(r, dst, NULL, NULL) == HYLA_ERR_INVALID_ARG);
        CHECK(msg_has(hyla_last_error(), "layer 2 'k'", "stream target"));
        dst->parts[4].nbytes += 2;
        hyla_snapshot_destroy(dst);
        hyla_store_read_close(r);
    }
    hyla_store_close(st);
    /* lossy fp32 parts (stored bf16): ranges are in the in-memory (f32) bytes */
    new_dir(dir, sizeof dir);
    p.codec.f32_as_bf16 = 1;
    st = open_store(dir, &p);
    CHECK_OK(hyla_store_put(st, "lossy", a, NULL, NULL));
    hyla_snapshot *want = NULL;
    CHECK_OK(hyla_store_get(st, "lossy", 0, 0, &want, NULL));
    if (want) stream_read_equals(st, "lossy", want);
    hyla_snapshot_destroy(want);
    hyla_store_close(st);
    hyla_snapshot_destroy(a);
}

static void test_failed_writes(uint64_t nowal_bytes) {
    char dir[300];
    new_dir(dir, sizeof dir);
    hyla_store_params p = small_params();
    p.nowal_bytes = nowal_bytes;
    hyla_store *st = open_store(dir, &p);
    hyla_snapshot *a = tsu_make(60, 60, 3000, 5), *b = tsu_make(61, 61, 3500, 5);
    CHECK_OK(hyla_store_put(st, "f", a, NULL, NULL));
    /* fail each RocksDB write of a put in turn (chunk batches, then the commit) */
    int failures = 0;
    for (long nth = 1; nth <= 50; nth++) {
        hyla_store_fault_write(nth);
        hyla_status s = hyla_store_put(st, "f", b, NULL, NULL);
        hyla_store_fault_write(0);
        if (s == HYLA_OK) {
            /* nth exceeded the number of writes of a put: done; restore v1-only state */
            CHECK(nth > 2);
            break;
        }
        failures++;
        CHECK(s == HYLA_ERR_RESOURCE);
        CHECK(msg_has(hyla_last_error(), "previous version kept", "fault"));
        CHECK(msg_has(hyla_last_error(), "out of disk space", "fault"));
        CHECK(get_equals(st, "f", 0, a));
        CHECK(verify_clean(st)); /* no leaked references */
        hyla_store_usage_info u;
        CHECK_OK(hyla_store_usage(st, &u));
        CHECK(u.versions == 1);
    }
    CHECK(failures >= 2);
    CHECK(get_equals(st, "f", 0, b));
    /* a zstd failure */
    hyla_snapshot *c = tsu_make(62, 62, 3600, 5);
    hyla_codec_fault_zstd(4);
    CHECK(hyla_store_put(st, "f", c, NULL, NULL) != HYLA_OK);
    hyla_codec_fault_zstd(0);
    CHECK(msg_has(hyla_last_error(), "zstd", "zstd fault"));
    CHECK(get_equals(st, "f", 0, b));
    CHECK(verify_clean(st));
    /* reopen: the failed puts left nothing behind */
    hyla_store_close(st);
    st = open_store(dir, &p);
    CHECK(get_equals(st, "f", 0, b));
    CHECK(get_equals(st, "f", 1, a));
    CHECK(verify_clean(st));
    hyla_store_close(st);
    hyla_snapshot_destroy(a);
    hyla_snapshot_destroy(b);
    hyla_snapshot_destroy(c);
}

/* ---- concurrency: puts of sessions sharing KV pages, forks, deletes and gc at once ---- */

typedef struct {
    hyla_store *st;
    int id;
    int ok;
} worker_arg;

static void *worker(void *p) {
    worker_arg *w = p;
    char sid[32], fid[32];
    snprintf(sid, sizeof sid, "w%d", w->id);
    w->ok = 1;
    for (int i = 0; i < 6; i++) {
        /* all workers share kv_seed 5: their KV chunks are the same content */
        hyla_snapshot *s = tsu_make((uint64_t)(w->id * 100 + i), 5, 500 + 64 * (uint64_t)i, 8);
        if (hyla_store_put(w->st, sid, s, NULL, NULL) != HYLA_OK) {
            fprintf(stderr, "worker %d put: %s\n", w->id, hyla_last_error());
            w->ok = 0;
        } else if (!get_equals(w->st, sid, 0, s)) {
            w->ok = 0;
        }
        snprintf(fid, sizeof fid, "w%d-fork%d", w->id, i);
        if (hyla_store_fork(w->st, sid, 0, fid) != HYLA_OK || (i % 2 && hyla_store_delete(w->st, fid) != HYLA_OK)) {
            fprintf(stderr, "worker %d fork/delete: %s\n", w->id, hyla_last_error());
            w->ok = 0;
        }
        if (w->id == 0 && hyla_store_gc(w->st, NULL) != HYLA_OK) w->ok = 0;
        hyla_snapshot_destroy(s);
    }
    return NULL;
}

static void test_concurrent(void) {
    char dir[300];
    new_dir(dir, sizeof dir);
    hyla_store_params p = small_params();
    p.codec.threads = 1;
    p.nowal_bytes = 200 << 10; /* a mix of both write paths */
    hyla_store *st = open_store(dir, &p);
    pthread_t th[4];
    worker_arg wa[4];
    for (int i = 0; i < 4; i++) {
        wa[i] = (worker_arg){st, i, 0};
        pthread_create(&th[i], NULL, worker, &wa[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK_MSG(wa[i].ok, "worker %d", i);
    }
    CHECK(verify_clean(st));
    hyla_store_usage_info u;
    CHECK_OK(hyla_store_usage(st, &u));
    CHECK(u.sessions == 4 + 4 * 3);
    hyla_store_close(st);
}

/* The snapshot list of a session under retention: the last keep_versions versions, each with
 * position, commit time and sizes. */
static void test_snapshot_list(void) {
    char dir[300];
    new_dir(dir, sizeof dir);
    hyla_store_params p = small_params();
    p.keep_versions = 3;
    hyla_store *st = open_store(dir, &p);
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    int64_t t0 = (int64_t)t.tv_sec * 1000000 + t.tv_nsec / 1000;
    for (uint64_t v = 1; v <= 5; v++) {
        hyla_snapshot *s = tsu_make(70 + v, 70, 512 * v, 9);
        uint64_t got = 0;
        CHECK_OK(hyla_store_put(st, "hist", s, &got, NULL));
        CHECK(got == v);
        hyla_snapshot_destroy(s);
    }
    clock_gettime(CLOCK_REALTIME, &t);
    int64_t t1 = (int64_t)t.tv_sec * 1000000 + t.tv_nsec / 1000;
    hyla_store_snapshot_info *l = NULL;
    size_t n = 0;
    CHECK_OK(hyla_store_snapshots(st, "hist", &l, &n));
    CHECK(n == 3); /* retention: versions 1 and 2 were GC'd */
    for (size_t i = 0; i < n && n == 3; i++) {
        uint64_t v = 3 + i;
        hyla_snapshot *s = tsu_make(70 + v, 70, 512 * v, 9);
        CHECK(l[i].version == v);
        CHECK(l[i].is_head == (v == 5));
        CHECK(l[i].position == 512 * v);
        CHECK(l[i].model_fingerprint == 9);
        CHECK(l[i].raw_bytes == hyla_snapshot_bytes(s));
        CHECK(l[i].time_us >= t0 && l[i].time_us <= t1);
        CHECK(i == 0 || l[i].time_us >= l[i - 1].time_us);
        CHECK(l[i].stored_bytes > 0 && l[i].written_bytes > 0);
        CHECK(l[i].written_bytes < l[i].stored_bytes); /* the KV prefix was shared, not rewritten */
        hyla_snapshot_destroy(s);
    }
    free(l);
    /* a fork's first version wrote nothing but its manifest records */
    CHECK_OK(hyla_store_fork(st, "hist", 4, "hist-fork"));
    CHECK_OK(hyla_store_snapshots(st, "hist-fork", &l, &n));
    CHECK(n == 1 && l[0].version == 1 && l[0].position == 2048 && l[0].written_bytes == 0 && l[0].is_head);
    free(l);
    CHECK_OK(hyla_store_delete(st, "hist"));
    CHECK(hyla_store_snapshots(st, "hist", &l, &n) == HYLA_ERR_NOT_FOUND);
    CHECK(verify_clean(st));
    hyla_store_close(st);
}

int main(void) {
    snprintf(root, sizeof root, "%s/hyla_test_store_%d", hyla_test_env("TMPDIR", "/tmp"), (int)getpid());
    hyla_mkdirs(root);
    test_roundtrip();
    test_mmap_reads();
    test_arena_put();
    test_incremental(32u << 20);
    test_incremental(0);
    test_plan_reusing();
    test_put_since(32u << 20, 0);
    test_put_since(0, 0);
    test_put_since(32u << 20, 1);
    test_fork_and_gc();
    test_refusals();
    test_stream_read();
    test_failed_writes(32u << 20); /* chunks through the WAL */
    test_failed_writes(0);         /* chunks around the WAL, then a flush */
    test_concurrent();
    test_snapshot_list();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root);
    return hyla_test_done("test_store");
}
