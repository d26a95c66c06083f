/* test_store_codec.c — the portable snapshot file: bit-exact round trip of every part kind
 * (recurrent, partition, kv) at several chunk sizes and zstd levels, the bf16 option (lossy,
 * recorded), and refusals of damaged files (flipped byte, truncation, unknown versions),
 * each message naming the part; arena snapshots (parts carved from one caller buffer, a
 * release callback at destroy): layout, no zero-fill, overflow to ordinary parts, the codec
 * and the file unchanged, clones ordinary. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "hyla_codec.h"
#include "hyla_codec_test.h"
#include "hyla_test.h"
#include "test_store_util.h"

static char dir[256];

static void path_of(char *buf, size_t n, const char *name) { snprintf(buf, n, "%s/%s", dir, name); }

static void test_roundtrip(void) {
    hyla_snapshot *s = tsu_make(1, 1, 1000, 0x1234);
    int levels[3] = {1, 0, 3};
    uint32_t chunks[3] = {4096, 64 << 10, 2u << 20};
    for (int li = 0; li < 3; li++)
        for (int ci = 0; ci < 3; ci++) {
            hyla_codec_params p = hyla_codec_default_params();
            p.zstd_level = levels[li];
            p.chunk_bytes = chunks[ci];
            p.threads = ci + 1;
            char path[512];
            path_of(path, sizeof path, "rt.hys");
            CHECK_OK(hyla_snapshot_save_file(path, s, &p));
            hyla_snapshot *t = NULL;
            CHECK_OK(hyla_snapshot_load_file(path, &t));
            CHECK_MSG(t && hyla_snapshot_equal(s, t), "level %d chunk %u", levels[li], chunks[ci]);
            hyla_snapshot_destroy(t);
        }
    /* empty KV (0 tokens) */
    hyla_snapshot *e = tsu_make(2, 2, 0, 7);
    uint8_t *buf;
    size_t len;
    CHECK_OK(hyla_snapshot_encode_file_bytes(e, NULL, &buf, &len));
    hyla_snapshot *t = NULL;
    CHECK_OK(hyla_snapshot_decode_file_bytes(buf, len, "mem", 2, &t));
    CHECK(t && hyla_snapshot_equal(e, t));
    hyla_snapshot_destroy(t);
    free(buf);
    hyla_snapshot_destroy(e);
    hyla_snapshot_destroy(s);
}

/* Chunks are stored compressed only when zstd saves min_gain_pct of their bytes: fp32 values of
 * full-entropy mantissas save little and are stored raw by default, bf16 values of the same
 * distribution save more and stay compressed; min_gain_pct 0 compresses both. */
static void test_min_gain(void) {
    enum { N = 1 << 16 };
    hyla_snapshot *s = hyla_snapshot_create();
    uint64_t shape[1] = {N};
    hyla_state_part *f = NULL, *b = NULL;
    CHECK_OK(hyla_snapshot_add_part(s, 0, "S", HYLA_PART_RECURRENT, HYLA_DT_F32, 1, shape, 0, &f));
    CHECK_OK(hyla_snapshot_add_part(s, 0, "k", HYLA_PART_RECURRENT, HYLA_DT_BF16, 1, shape, 0, &b));
    hyla_rng r;
    hyla_rng_seed(&r, 11);
    for (int i = 0; f && b && i < N; i++) {
        float v = hyla_rng_normal(&r);
        ((float *)f->data)[i] = v;
        ((uint16_t *)b->data)[i] = hyla_f32_to_bf16(v);
    }
    for (int gain = 20; gain >= 0; gain -= 20) {
        hyla_codec_params p = hyla_codec_default_params();
        CHECK(p.min_gain_pct == 20);
        p.min_gain_pct = gain;
        hyla_codec_plan *pl = NULL;
        CHECK_OK(hyla_codec_plan_create(s, &p, &pl));
        if (!pl) break;
        for (size_t i = 0; i < pl->n_chunks; i++) pl->chunks[i].want = 1;
        CHECK_OK(hyla_codec_plan_encode(pl));
        int raw_f32 = 0, raw_bf16 = 0, n_f32 = 0, n_bf16 = 0;
        for (size_t i = 0; i < pl->n_chunks; i++) {
            int raw = pl->chunks[i].value && pl->chunks[i].value[4] == 0; /* the value's codec byte */
            if (pl->chunks[i].ref.part == 0) raw_f32 += raw, n_f32++;
            else raw_bf16 += raw, n_bf16++;
        }
        if (gain) CHECK_MSG(raw_f32 == n_f32 && raw_bf16 == 0, "min gain %d %%: %d of %d f32 chunks raw, %d of %d bf16",
                            gain, raw_f32, n_f32, raw_bf16, n_bf16);
        else CHECK_MSG(raw_f32 == 0 && raw_bf16 == 0, "min gain 0: %d f32 and %d bf16 chunks raw", raw_f32, raw_bf16);
        /* each chunk value decodes to its bytes: raw values (hashed and copied block by block)
         * and shuffled zstd ones (decompressed, unshuffled, hashed); a flipped payload byte
         * and a header claiming more raw bytes than the chunk holds are refused, and nothing is
         * written past the chunk's bytes */
        for (size_t i = 0; i < pl->n_chunks; i++) {
            hyla_plan_chunk *pc = &pl->chunks[i];
            const hyla_chunk_ref *ref = &pc->ref;
            const uint8_t *src = (const uint8_t *)(ref->part == 0 ? f->data : b->data) + ref->raw_off;
            uint8_t *out = malloc(ref->raw_len + 64);
            char err[256];
            memset(out + ref->raw_len, 0xA5, 64);
            CHECK_OK(hyla_chunk_decode(pc->value, pc->value_len, ref, out, err, sizeof err));
            CHECK_MSG(!memcmp(out, src, ref->raw_len), "chunk %zu (%s) decodes to its bytes", i,
                      pc->value[4] == 0 ? "raw" : "zstd");
            /* into a destination off the 16-byte grid too (a raw value's copy then takes memcpy,
             * not the streaming stores) */
            uint8_t *odd = malloc(ref->raw_len + 1);
            CHECK_OK(hyla_chunk_decode(pc->value, pc->value_len, ref, odd + 1, err, sizeof err));
            CHECK_MSG(!memcmp(odd + 1, src, ref->raw_len), "chunk %zu decodes to its bytes at an odd address", i);
            free(odd);
            uint8_t *v = malloc(pc->value_len);
            memcpy(v, pc->value, pc->value_len);
            v[pc->value_len - 7] ^= 0x10;
            hyla_status st = hyla_chunk_decode(v, pc->value_len, ref, out, err, sizeof err);
            CHECK_MSG(st == HYLA_ERR_CORRUPT && strstr(err, "checksum"), "chunk %zu, a payload byte flipped: %s", i, err);
            memcpy(v, pc->value, pc->value_len);
            hyla_put_le32(v + 8, ref->raw_len + 64); /* raw_len in the header */
            st = hyla_chunk_decode(v, pc->value_len, ref, out, err, sizeof err);
            CHECK_MSG(st == HYLA_ERR_CORRUPT, "chunk %zu, raw length in the header changed: %s", i, err);
            int intact = 1;
            for (int k = 0; k < 64; k++) intact &= out[ref->raw_len + k] == 0xA5;
            CHECK_MSG(intact, "chunk %zu: nothing written past its %u bytes", i, ref->raw_len);
            free(v);
            free(out);
        }
        hyla_codec_plan_destroy(pl);
        /* either way the file reads back bit for bit */
        char path[512];
        path_of(path, sizeof path, "gain.hys");
        CHECK_OK(hyla_snapshot_save_file(path, s, &p));
        hyla_snapshot *t = NULL;
        CHECK_OK(hyla_snapshot_load_file(path, &t));
        CHECK_MSG(t && hyla_snapshot_equal(s, t), "min gain %d: round trip", gain);
        hyla_snapshot_destroy(t);
    }
    hyla_snapshot_destroy(s);
}

static void test_bf16(void) {
    hyla_snapshot *s = tsu_make(3, 3, 200, 9);
    hyla_codec_params p = hyla_codec_default_params();
    p.f32_as_bf16 = 1;
    uint8_t *buf, *buf32;
    size_t len, len32;
    CHECK_OK(hyla_snapshot_encode_file_bytes(s, &p, &buf, &len));
    CHECK_OK(hyla_snapshot_encode_file_bytes(s, NULL, &buf32, &len32));
    CHECK_MSG(len < len32, "bf16 file %zu bytes, fp32 %zu", len, len32);
    hyla_snapshot *t = NULL;
    CHECK_OK(hyla_snapshot_decode_file_bytes(buf, len, "mem", 0, &t));
    if (t) {
        CHECK(t->n_parts == s->n_parts);
        for (uint32_t i = 0; i < s->n_parts; i++) {
            hyla_state_part *a = &s->parts[i], *b = &t->parts[i];
            CHECK(a->dtype == b->dtype && a->nbytes == b->nbytes);
            if (a->dtype == HYLA_DT_F32) {
                /* bf16 keeps 8 mantissa bits: relative error <= 2^-8 */
                CHECK_CLOSE((float *)b->data, (float *)a->data, a->nbytes / 4, 1e-30, 1.0 / 256, a->name);
            } else {
                CHECK(!memcmp(a->data, b->data, a->nbytes));
            }
        }
    }
    hyla_snapshot_destroy(t);
    free(buf);
    free(buf32);
    hyla_snapshot_destroy(s);
}

/* Load a damaged copy; expect failure whose message contains every needle. */
static void expect_refusal(const uint8_t *img, size_t len, hyla_status want, const char *n1, const char *n2,
                           const char *what) {
    hyla_snapshot *t = NULL;
    hyla_status st = hyla_snapshot_decode_file_bytes(img, len, "file X", 0, &t);
    CHECK_MSG(st == want, "%s: got %s (%s), want %s", what, hyla_status_str(st), hyla_last_error(),
              hyla_status_str(want));
    CHECK(t == NULL);
    const char *msg = hyla_last_error();
    CHECK_MSG(!n1 || strstr(msg, n1), "%s: message '%s' lacks '%s'", what, msg, n1);
    CHECK_MSG(!n2 || strstr(msg, n2), "%s: message '%s' lacks '%s'", what, msg, n2);
    hyla_snapshot_destroy(t);
}

static void test_refusals(void) {
    hyla_snapshot *s = tsu_make(4, 4, 300, 11);
    hyla_codec_params p = hyla_codec_default_params();
    p.chunk_bytes = 16384;
    uint8_t *buf;
    size_t len;
    CHECK_OK(hyla_snapshot_encode_file_bytes(s, &p, &buf, &len));
    uint8_t *c = malloc(len);
    /* flip a byte in the last chunk value (layer 2 part v): 40 bytes before the trailer */
    memcpy(c, buf, len);
    c[len - 32 - 40] ^= 0x10;
    expect_refusal(c, len, HYLA_ERR_CORRUPT, "layer 2 part v", "checksum", "flipped byte");
    /* truncated file */
    expect_refusal(buf, len - 100, HYLA_ERR_CORRUPT, "truncated", "layer 2 part v", "truncated");
    /* unknown file version */
    memcpy(c, buf, len);
    c[8] = 9;
    expect_refusal(c, len, HYLA_ERR_UNSUPPORTED, "file version 9", NULL, "file version");
    /* unknown snapshot format version (manifest at offset 32, version at +8, its length at 16),
     * the manifest's closing checksum made anew: a newer format */
    memcpy(c, buf, len);
    c[32 + 8] = 2;
    {
        uint64_t ml = 0;
        for (int i = 0; i < 8; i++) ml |= (uint64_t)c[16 + i] << (8 * i);
        uint64_t x = XXH64(c + 32, ml - 8, 0);
        for (int i = 0; i < 8; i++) c[32 + ml - 8 + i] = (uint8_t)(x >> (8 * i));
    }
    expect_refusal(c, len, HYLA_ERR_UNSUPPORTED, "format version 2", NULL, "format version");
    /* the same field damaged in place (the checksum left as it was): damage, not a newer format */
    memcpy(c, buf, len);
    c[32 + 8] = 2;
    expect_refusal(c, len, HYLA_ERR_CORRUPT, "manifest checksum mismatch", "format version field reads 2",
                   "damaged version field");
    /* not a snapshot */
    expect_refusal((const uint8_t *)"hello world, not a snapshot file at all", 40, HYLA_ERR_FORMAT, "not a hyla", NULL,
                   "magic");
    /* a snapshot whose last part is the session's token log, truncated: the damage is named as
     * the session's part, not as a layer (the token log's layer number is a sentinel) */
    {
        hyla_snapshot *tl = tsu_make(4, 4, 300, 11);
        int32_t *toks;
        CHECK_OK(hyla_snapshot_add_token_log(tl, 4096, &toks));
        for (int i = 0; i < 4096; i++) toks[i] = i * 7919;
        uint8_t *tb;
        size_t tlen;
        CHECK_OK(hyla_snapshot_encode_file_bytes(tl, &p, &tb, &tlen));
        expect_refusal(tb, tlen - 100, HYLA_ERR_CORRUPT, "session part tokens", "truncated", "truncated token log");
        CHECK_MSG(!strstr(hyla_last_error(), "4294967295"), "the token log named by its sentinel layer: %s",
                  hyla_last_error());
        free(tb);
        hyla_snapshot_destroy(tl);
    }
    /* a manifest byte flipped */
    memcpy(c, buf, len);
    c[32 + 30] ^= 1;
    expect_refusal(c, len, HYLA_ERR_CORRUPT, "manifest checksum", NULL, "manifest");
    free(c);
    free(buf);
    /* the file path appears in load_file errors */
    char path[512];
    path_of(path, sizeof path, "missing.hys");
    hyla_snapshot *t = NULL;
    CHECK(hyla_snapshot_load_file(path, &t) == HYLA_ERR_NOT_FOUND);
    CHECK(strstr(hyla_last_error(), "missing.hys") != NULL);
    hyla_snapshot_destroy(s);
}

static void test_failed_write_keeps_old(void) {
    hyla_snapshot *a = tsu_make(5, 5, 100, 1), *b = tsu_make(6, 6, 200, 1);
    char path[512];
    path_of(path, sizeof path, "keep.hys");
    CHECK_OK(hyla_snapshot_save_file(path, a, NULL));
    hyla_codec_fault_write(2);
    CHECK(hyla_snapshot_save_file(path, b, NULL) == HYLA_ERR_IO);
    hyla_codec_fault_write(0);
    hyla_codec_fault_zstd(3);
    CHECK(hyla_snapshot_save_file(path, b, NULL) != HYLA_OK);
    CHECK(strstr(hyla_last_error(), "zstd") != NULL);
    hyla_codec_fault_zstd(0);
    hyla_snapshot *t = NULL;
    CHECK_OK(hyla_snapshot_load_file(path, &t));
    CHECK(t && hyla_snapshot_equal(a, t));
    hyla_snapshot_destroy(t);
    hyla_snapshot_destroy(a);
    hyla_snapshot_destroy(b);
}

static void test_layout(void) {
    hyla_snapshot *a = tsu_make(7, 7, 100, 5), *b = tsu_make(8, 8, 300, 5);
    CHECK_OK(hyla_snapshot_check_layout(a, b)); /* KV token counts may differ */
    b->model_fingerprint = 6;
    CHECK(hyla_snapshot_check_layout(a, b) == HYLA_ERR_MISMATCH);
    CHECK(strstr(hyla_last_error(), "fingerprint") != NULL);
    b->model_fingerprint = 5;
    b->parts[3].shape[1] = 5;
    CHECK(hyla_snapshot_check_layout(a, b) == HYLA_ERR_MISMATCH);
    CHECK(strstr(hyla_last_error(), "layer 1 part Sp") != NULL && strstr(hyla_last_error(), "shape"));
    b->parts[3].shape[1] = 4;
    b->parts[0].dtype = HYLA_DT_BF16;
    CHECK(hyla_snapshot_check_layout(a, b) == HYLA_ERR_MISMATCH);
    CHECK(strstr(hyla_last_error(), "layer 0 part S") != NULL && strstr(hyla_last_error(), "dtype"));
    hyla_snapshot_destroy(a);
    hyla_snapshot_destroy(b);
}

typedef struct {
    int calls;
    void *base;
} release_log;

static void on_release(void *ctx, void *base) {
    release_log *r = ctx;
    r->calls++;
    r->base = base;
}

static void test_arena(void) {
    CHECK(hyla_snapshot_arena_piece(0) == 64 && hyla_snapshot_arena_piece(1) == 64 &&
          hyla_snapshot_arena_piece(64) == 64 && hyla_snapshot_arena_piece(65) == 128);
    hyla_snapshot *s = tsu_make(4, 4, 300, 0x77);
    size_t need = tsu_arena_bytes(s);
    uint8_t *buf = aligned_alloc(64, need + 4096);
    memset(buf, 0xA5, need + 4096); /* the arena is not zero-filled: parts keep what is there */
    release_log rl = {0, NULL};
    hyla_snapshot *a = hyla_snapshot_create_arena(buf, need, on_release, &rl);
    CHECK(a != NULL);
    if (!a) return;
    /* parts in order, 64-byte aligned, inside the arena, not zero-filled */
    uint64_t shape[1] = {10};
    hyla_state_part *p = NULL;
    CHECK_OK(hyla_snapshot_add_part(a, 0, "x", HYLA_PART_RECURRENT, HYLA_DT_F32, 1, shape, 0, &p));
    CHECK(p && (uint8_t *)p->data == buf && ((const uint8_t *)p->data)[0] == 0xA5);
    hyla_snapshot_destroy(a);
    CHECK(rl.calls == 1 && rl.base == buf);

    rl.calls = 0;
    a = tsu_arena_copy(s, buf, need, on_release, &rl);
    CHECK(a && hyla_snapshot_equal(a, s));
    if (!a) return;
    size_t off = 0;
    for (uint32_t i = 0; i < a->n_parts; i++) {
        CHECK_MSG((uint8_t *)a->parts[i].data == buf + off, "part %u not carved in order", i);
        off += (size_t)hyla_snapshot_arena_piece(a->parts[i].nbytes);
    }
    CHECK(off == need);
    /* the arena is full: a further part is an ordinary zero-filled one */
    uint64_t sh2[2] = {3, 5};
    CHECK_OK(hyla_snapshot_add_part(a, 3, "extra", HYLA_PART_RECURRENT, HYLA_DT_F32, 2, sh2, 0, &p));
    if (p) {
        CHECK((uint8_t *)p->data < buf || (uint8_t *)p->data >= buf + need + 4096);
        int zero = 1;
        for (uint64_t i = 0; i < p->nbytes; i++) zero &= ((uint8_t *)p->data)[i] == 0;
        CHECK(zero);
        ((float *)p->data)[7] = 1.5f;
    }
    /* the codec and the portable file see an ordinary snapshot */
    uint8_t *img;
    size_t len;
    CHECK_OK(hyla_snapshot_encode_file_bytes(a, NULL, &img, &len));
    hyla_snapshot *t = NULL;
    CHECK_OK(hyla_snapshot_decode_file_bytes(img, len, "mem", 0, &t));
    CHECK_MSG(t && hyla_snapshot_equal(a, t), "arena snapshot does not round-trip through the file format");
    hyla_snapshot_destroy(t);
    free(img);
    char path[512];
    path_of(path, sizeof path, "arena.hys");
    CHECK_OK(hyla_snapshot_save_file(path, a, NULL));
    t = NULL;
    CHECK_OK(hyla_snapshot_load_file(path, &t));
    CHECK(t && hyla_snapshot_equal(a, t));
    hyla_snapshot_destroy(t);
    /* a clone is ordinary: its destroy releases nothing, and it outlives the arena */
    hyla_snapshot *c = NULL;
    CHECK_OK(hyla_snapshot_clone(a, &c));
    CHECK(c && hyla_snapshot_equal(a, c));
    for (uint32_t i = 0; c && i < c->n_parts; i++)
        CHECK((uint8_t *)c->parts[i].data < buf || (uint8_t *)c->parts[i].data >= buf + need + 4096);
    CHECK(rl.calls == 0);
    hyla_snapshot_destroy(a);
    CHECK(rl.calls == 1 && rl.base == buf);
    memset(buf, 0, need + 4096);
    CHECK(c && c->n_parts == s->n_parts + 1 && ((float *)hyla_snapshot_find(c, 3, "extra")->data)[7] == 1.5f);
    hyla_snapshot_destroy(c);
    CHECK(rl.calls == 1);
    /* NULL release is allowed */
    a = tsu_arena_copy(s, buf, need, NULL, NULL);
    CHECK(a && hyla_snapshot_equal(a, s));
    hyla_snapshot_destroy(a);
    free(buf);
    hyla_snapshot_destroy(s);
}

int main(void) {
    snprintf(dir, sizeof dir, "%s/hyla_test_codec_%d", hyla_test_env("TMPDIR", "/tmp"), (int)getpid());
    hyla_mkdirs(dir);
    test_roundtrip();
    test_min_gain();
    test_bf16();
    test_refusals();
    test_failed_write_keeps_old();
    test_layout();
    test_arena();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return hyla_test_done("test_store_codec");
}
