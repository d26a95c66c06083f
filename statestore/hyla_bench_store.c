/* hyla_bench_store.c — `hyla-bench store`: durable pause (put into a fresh store, synced),
 * restore (get with every checksum verified), incremental pause (+N tokens, all recurrent and
 * partition states changed), and the portable file (save/load), for a synthetic session shaped
 * like a 1.3B SSE-H model: 15 SSE layers x 18 heads x (1 recurrent + 4 partitions) x 128x128
 * fp32 with short-conv tails, plus 3 attention layers' KV (18 kv heads x 128 dim, bf16 by
 * default) at 32k tokens. Data: seeded pseudo-random floats with per-row / per-channel scales
 * (random mantissas, structured exponents), like trained states, not zeros.
 * MB = 10^6 bytes; rates are bytes of state (in memory) per second of wall time.
 * Cases: codec_encode / codec_decode (memory to memory: cut, hash, shuffle, zstd and back, all
 * checksums), pause_whole (put into a fresh store, fsynced), restore (get, every checksum),
 * pause_incremental (+inc tokens, every recurrent/partition state changed), restore_incremental,
 * file_save / file_load (the portable file, fsynced), pause_since / pause_since_full_base (the
 * incremental put as the StateStore server gets it, without the KV prefixes: referencing the
 * base's chunks vs reading the whole base and putting the whole snapshot; see since_case).
 * Single-threaded driver; the codec uses --threads workers. */
#include "hyla_bench_store.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hyla_codec.h"
#include "hyla_log.h"
#include "hyla_snapshot.h"
#include "hyla_store.h"
#include "hyla_thread.h"
#include "hyla_util.h"

typedef struct {
    uint64_t tokens, inc_tokens;
    int kv_dtype;
    int sse_layers, attn_layers, heads, kv_heads, dk, partitions;
} shape_cfg;

/* Cheap seeded generator of "state-like" floats: uniform mantissa noise times a scale that
 * changes every row (128 values) and per channel. */
typedef struct {
    uint64_t s;
} fastrng;

static inline uint64_t fr_next(fastrng *r) {
    r->s ^= r->s << 13;
    r->s ^= r->s >> 7;
    r->s ^= r->s << 17;
    return r->s;
}

static void gen_f32(float *x, size_t n, uint64_t seed) {
    fastrng r = {seed * 0x9E3779B97F4A7C15ull | 1};
    float row = 1.0f;
    for (size_t i = 0; i < n; i++) {
        uint64_t u = fr_next(&r);
        if (i % 128 == 0) row = 0.001f + (float)(u >> 40) / (float)(1u << 24) * 0.5f;
        float chan = 0.5f + (float)((i * 2654435761u >> 7) % 16) * 0.125f;
        union { uint32_t u; float f; } v;
        v.u = 0x3f800000u | (uint32_t)(u & 0x7fffff); /* [1, 2) */
        x[i] = (v.f - 1.5f) * row * chan;
    }
}

static void gen_part(hyla_state_part *p, uint64_t seed, uint64_t row0) {
    size_t row = 1;
    for (uint32_t d = 1; d < p->ndim; d++) row *= p->shape[d];
    if (p->kind != HYLA_PART_KV) row = p->nbytes / hyla_dtype_size((hyla_dtype)p->dtype);
    size_t rows = p->kind == HYLA_PART_KV ? p->shape[0] : 1;
    float *buf = malloc(row * sizeof *buf);
    for (size_t t = row0; t < rows; t++) {
        gen_f32(buf, row, seed * 1000003u + t);
        uint8_t *dst = (uint8_t *)p->data + t * row * hyla_dtype_size((hyla_dtype)p->dtype);
        if (p->dtype == HYLA_DT_F32) memcpy(dst, buf, row * 4);
        else hyla_from_f32(dst, (hyla_dtype)p->dtype, buf, row);
    }
    free(buf);
}

/* The session at `tokens` KV tokens; recurrent/partition state seeded by `state_seed`; KV rows
 * depend only on (layer, row), so a longer context keeps the old pages. If prev is given, KV
 * rows are copied from it and only new rows generated. */
static hyla_snapshot *make_session(const shape_cfg *c, uint64_t tokens, uint64_t state_seed, const hyla_snapshot *prev) {
    hyla_snapshot *s = hyla_snapshot_create();
    s->model_fingerprint = 0x5E5E13B0ull;
    s->position = tokens;
    s->n_generated = tokens / 4;
    s->sampler.temperature = 0.8f;
    s->sampler.top_k = 50;
    s->sampler.top_p = 0.95f;
    s->sampler.seed = 1;
    for (int i = 0; i < 4; i++) s->rng[i] = state_seed * 31 + (uint64_t)i;
    int n_layers = c->sse_layers + c->attn_layers;
    int every = n_layers / (c->attn_layers ? c->attn_layers : 1); /* attention at layers every-1, 2*every-1, ... */
    uint64_t kvcnt = 0;
    for (int l = 0; l < n_layers; l++) {
        hyla_state_part *p;
        if (c->attn_layers && (l + 1) % every == 0 && kvcnt < (uint64_t)c->attn_layers) {
            kvcnt++;
            const char *names[2] = {"k", "v"};
            for (int j = 0; j < 2; j++) {
                uint64_t sh[3] = {tokens, (uint64_t)c->kv_heads, (uint64_t)c->dk};
                if (hyla_snapshot_add_part(s, (uint32_t)l, names[j], HYLA_PART_KV, (hyla_dtype)c->kv_dtype, 3, sh, 64, &p) != HYLA_OK) goto oom;
                uint64_t row0 = 0;
                const hyla_state_part *q = prev ? hyla_snapshot_find(prev, (uint32_t)l, names[j]) : NULL;
                if (q) {
                    row0 = q->shape[0] < tokens ? q->shape[0] : tokens;
                    memcpy(p->data, q->data, q->nbytes < p->nbytes ? q->nbytes : p->nbytes);
                }
                gen_part(p, (uint64_t)l * 2 + (uint64_t)j + 1, row0);
            }
        } else {
            uint64_t shS[3] = {(uint64_t)c->heads, (uint64_t)c->dk, (uint64_t)c->dk};
            uint64_t shP[4] = {(uint64_t)c->partitions, (uint64_t)c->heads, (uint64_t)c->dk, (uint64_t)c->dk};
            uint64_t shC[2] = {3, (uint64_t)c->heads * (uint64_t)c->dk};
            if (hyla_snapshot_add_part(s, (uint32_t)l, "S0", HYLA_PART_RECURRENT, HYLA_DT_F32, 3, shS, 0, &p) != HYLA_OK) goto oom;
            gen_part(p, state_seed * 1000 + (uint64_t)l * 8 + 1, 0);
            if (hyla_snapshot_add_part(s, (uint32_t)l, "Sp", HYLA_PART_PARTITION, HYLA_DT_F32, 4, shP, 0, &p) != HYLA_OK) goto oom;
            gen_part(p, state_seed * 1000 + (uint64_t)l * 8 + 2, 0);
            const char *cn[3] = {"conv_q", "conv_k", "conv_v"};
            for (int j = 0; j < 3; j++) {
                if (hyla_snapshot_add_part(s, (uint32_t)l, cn[j], HYLA_PART_RECURRENT, HYLA_DT_F32, 2, shC, 0, &p) != HYLA_OK) goto oom;
                gen_part(p, state_seed * 1000 + (uint64_t)l * 8 + 3 + (uint64_t)j, 0);
            }
        }
    }
    return s;
oom:
    fprintf(stderr, "hyla-bench store: %s\n", hyla_last_error());
    hyla_snapshot_destroy(s);
    return NULL;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: hyla-bench store [options]   (JSON lines on stdout; MB = 10^6 bytes of state)\n"
            "  --dir DIR          scratch directory for the store and file (default $TMPDIR or /tmp)\n"
            "  --tokens N         KV context (default 32768)\n"
            "  --inc-tokens N     tokens added before the incremental pause (default 512)\n"
            "  --sse-layers N     SSE layers (default 15; fewer: a larger KV share of the state)\n"
            "  --kv-dtype T       bf16 | f16 | f32 (default bf16)\n"
            "  --zstd-level N     default 1 (0 = no compression)\n"
            "  --chunk-kib N      chunk size (default: the codec's, 512)\n"
            "  --threads N        codec threads (default: all cores)\n"
            "  --bf16             store fp32 states as bf16 (lossy)\n"
            "  --plain-zstd       zstd at --zstd-level for float chunks too (no fast_floats)\n"
            "  --write-buffer-mib N  memtable size of the chunk column family (default 64)\n"
            "  --repeat N         repeat each measurement N times (default 1)\n"
            "  --small            a 1/8-size session (quick check)\n"
            "  Logs at warn level unless HYLA_LOG is set (HYLA_LOG=debug: each decode's time per codec\n"
            "  thread: fetching, decoding, handing on).\n");
}

static void emit(const char *name, const shape_cfg *c, const hyla_codec_params *cp, uint64_t state_bytes, double sec,
                 uint64_t bytes_written, uint64_t raw_written, int run) {
    printf("{\"bench\":\"store\",\"case\":\"%s\",\"run\":%d,\"tokens\":%" PRIu64 ",\"kv_dtype\":\"%s\",\"zstd_level\":%d,"
           "\"chunk_kib\":%u,\"threads\":%d,\"bf16\":%d,\"fast_floats\":%d,\"state_bytes\":%" PRIu64 ",\"seconds\":%.4f,\"mb_per_s\":%.1f",
           name, run, c->tokens, hyla_dtype_name((hyla_dtype)c->kv_dtype), cp->zstd_level, cp->chunk_bytes / 1024,
           cp->threads ? cp->threads : hyla_online_cores(), cp->f32_as_bf16, cp->fast_floats, state_bytes, sec,
           sec > 0 ? state_bytes / sec / 1e6 : 0.0);
    if (bytes_written) printf(",\"bytes_written\":%" PRIu64 ",\"raw_bytes_written\":%" PRIu64, bytes_written, raw_written);
    if (raw_written && bytes_written) printf(",\"compression_ratio\":%.3f", (double)raw_written / (double)bytes_written);
    printf("}\n");
    fflush(stdout);
}

/* The incremental pause as the StateStore server receives it: s2 without its KV prefixes (the
 * rows s1 has), on base version 1 = s1. Two ways, each into its own store holding s1:
 * pause_since_full_base (the base read and decoded whole, the prefixes copied in, a whole put:
 * O(session)) and pause_since (hyla_store_put_since: the base's chunks referenced, O(new)). */
static int since_case(const shape_cfg *c, const hyla_codec_params *cp, const hyla_store_params *sp, const char *base,
                      int run, const hyla_snapshot *s1, const hyla_snapshot *s2) {
    uint64_t *shared = calloc(s2->n_parts + 1, sizeof *shared), kv = 0;
    hyla_snapshot *g = NULL;
    if (!shared || hyla_snapshot_clone(s2, &g) != HYLA_OK) {
        free(shared);
        return 1;
    }
    for (uint32_t i = 0; i < s2->n_parts; i++) {
        const hyla_state_part *q = hyla_snapshot_find(s1, s2->parts[i].layer, s2->parts[i].name);
        if (s2->parts[i].kind == HYLA_PART_KV && q) shared[i] = q->nbytes;
        kv += shared[i];
    }
    uint64_t b2 = hyla_snapshot_bytes(s2);
    fprintf(stderr, "  incremental put on the server: %.1f MB of %.1f MB shared (%.1f%%)\n", kv / 1e6, b2 / 1e6,
            100.0 * (double)kv / (double)b2);
    int rc = 1;
    for (int way = 0; way < 2; way++) {
        char dbdir[700];
        snprintf(dbdir, sizeof dbdir, "%s/since%d_%d", base, way, run);
        hyla_store *st = NULL;
        hyla_store_put_stats ps;
        if (hyla_store_open(dbdir, sp, &st) != HYLA_OK || hyla_store_put(st, "bench", s1, NULL, NULL) != HYLA_OK) {
            hyla_store_close(st);
            goto out;
        }
        for (uint32_t i = 0; i < g->n_parts; i++) memset(g->parts[i].data, 0, shared[i]); /* not sent */
        double t = hyla_now();
        hyla_status s;
        if (way == 0) {
            hyla_snapshot *b = NULL;
            s = hyla_store_get(st, "bench", 1, 0, &b, NULL);
            for (uint32_t i = 0; s == HYLA_OK && i < g->n_parts; i++)
                if (shared[i]) memcpy(g->parts[i].data, hyla_snapshot_find(b, g->parts[i].layer, g->parts[i].name)->data, shared[i]);
            hyla_snapshot_destroy(b);
            if (s == HYLA_OK) s = hyla_store_put(st, "bench", g, NULL, &ps);
        } else {
            s = hyla_store_put_since(st, "bench", g, 1, shared, NULL, &ps);
        }
        double dt = hyla_now() - t;
        if (s != HYLA_OK) {
            hyla_store_close(st);
            goto out;
        }
        emit(way == 0 ? "pause_since_full_base" : "pause_since", c, cp, b2, dt, ps.bytes_written, ps.raw_bytes_written, run);
        fprintf(stderr, "  %s: plan %.3f s, encode %.3f s, write %.3f s, commit %.3f s\n",
                way == 0 ? "pause_since_full_base (put part)" : "pause_since", ps.seconds_plan, ps.seconds_encode,
                ps.seconds_write, ps.seconds_commit);
        hyla_snapshot *got = NULL;
        s = hyla_store_get(st, "bench", 2, 0, &got, NULL);
        int eq = s == HYLA_OK && (cp->f32_as_bf16 || hyla_snapshot_equal(got, s2));
        hyla_snapshot_destroy(got);
        hyla_store_close(st);
        if (!eq) {
            fprintf(stderr, "hyla-bench store: the incremental put did not read back equal\n");
            goto out;
        }
    }
    rc = 0;
out:
    hyla_snapshot_destroy(g);
    free(shared);
    return rc;
}

int hyla_bench_store(int argc, char **argv) {
    shape_cfg c = {32768, 512, HYLA_DT_BF16, 15, 3, 18, 18, 128, 4};
    hyla_codec_params cp = hyla_codec_default_params();
    const char *dir = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    int repeat = 1;
    uint64_t wbuf = hyla_store_default_params().write_buffer_bytes;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--dir") && has) dir = argv[++i];
        else if (!strcmp(a, "--tokens") && has) c.tokens = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(a, "--inc-tokens") && has) c.inc_tokens = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(a, "--sse-layers") && has) c.sse_layers = atoi(argv[++i]);
        else if (!strcmp(a, "--zstd-level") && has) cp.zstd_level = atoi(argv[++i]);
        else if (!strcmp(a, "--chunk-kib") && has) cp.chunk_bytes = (uint32_t)atoi(argv[++i]) * 1024u;
        else if (!strcmp(a, "--threads") && has) cp.threads = atoi(argv[++i]);
        else if (!strcmp(a, "--bf16")) cp.f32_as_bf16 = 1;
        else if (!strcmp(a, "--plain-zstd")) cp.fast_floats = 0;
        else if (!strcmp(a, "--write-buffer-mib") && has) wbuf = strtoull(argv[++i], NULL, 10) << 20;
        else if (!strcmp(a, "--repeat") && has) repeat = atoi(argv[++i]);
        else if (!strcmp(a, "--small")) {
            c.sse_layers = 2;
            c.attn_layers = 1;
            c.tokens = 8192;
        } else if (!strcmp(a, "--kv-dtype") && has) {
            const char *t = argv[++i];
            c.kv_dtype = !strcmp(t, "f32") ? HYLA_DT_F32 : !strcmp(t, "f16") ? HYLA_DT_F16 : HYLA_DT_BF16;
        } else {
            fprintf(stderr, "hyla-bench store: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (repeat < 1) repeat = 1;
    if (!getenv("HYLA_LOG")) hyla_log_set_level(HYLA_LOG_WARN); /* quiet unless asked (HYLA_LOG=debug) */
    char base[512], dbdir[600], file[600];
    snprintf(base, sizeof base, "%s/hyla_bench_store_%d", dir, (int)getpid());
    snprintf(file, sizeof file, "%s/session.hys", base);
    if (hyla_mkdirs(base) != HYLA_OK) {
        fprintf(stderr, "hyla-bench store: %s\n", hyla_last_error());
        return 1;
    }
    fprintf(stderr, "hyla-bench store: generating the session (%" PRIu64 " tokens)...\n", c.tokens);
    hyla_snapshot *s1 = make_session(&c, c.tokens, 1, NULL);
    hyla_snapshot *s2 = s1 ? make_session(&c, c.tokens + c.inc_tokens, 2, s1) : NULL;
    if (!s1 || !s2) return 1;
    uint64_t b1 = hyla_snapshot_bytes(s1), b2 = hyla_snapshot_bytes(s2), kv = 0;
    for (uint32_t i = 0; i < s1->n_parts; i++)
        if (s1->parts[i].kind == HYLA_PART_KV) kv += s1->parts[i].nbytes;
    fprintf(stderr, "hyla-bench store: state %.1f MB (%.1f MB recurrent+partition, %.1f MB KV), %u parts\n", b1 / 1e6,
            (b1 - kv) / 1e6, kv / 1e6, s1->n_parts);
    int rc = 0;
    for (int run = 0; run < repeat && rc == 0; run++) {
        /* the codec alone (memory to memory): cut + hash + shuffle + zstd, then the reverse */
        {
            uint8_t *img = NULL;
            size_t len = 0;
            hyla_snapshot *back = NULL;
            hyla_codec_plan *pl = NULL;
            double t = hyla_now();
            hyla_status cs = hyla_codec_plan_create(s1, &cp, &pl);
            uint64_t enc_bytes = 0;
            if (cs == HYLA_OK) {
                for (size_t k = 0; k < pl->n_chunks; k++) pl->chunks[k].want = 1;
                cs = hyla_codec_plan_encode(pl);
                for (size_t k = 0; cs == HYLA_OK && k < pl->n_chunks; k++) enc_bytes += pl->chunks[k].value_len;
            }
            double dt = hyla_now() - t;
            hyla_codec_plan_destroy(pl);
            if (cs != HYLA_OK || hyla_snapshot_encode_file_bytes(s1, &cp, &img, &len) != HYLA_OK) {
                fprintf(stderr, "hyla-bench store: %s\n", hyla_last_error());
                return 1;
            }
            emit("codec_encode", &c, &cp, b1, dt, enc_bytes, b1, run);
            t = hyla_now();
            if (hyla_snapshot_decode_file_bytes(img, len, "image", cp.threads, &back) != HYLA_OK) {
                fprintf(stderr, "hyla-bench store: %s\n", hyla_last_error());
                free(img);
                return 1;
            }
            dt = hyla_now() - t;
            emit("codec_decode", &c, &cp, b1, dt, 0, 0, run);
            hyla_snapshot_destroy(back);
            free(img);
        }
        snprintf(dbdir, sizeof dbdir, "%s/db%d", base, run);
        hyla_store_params sp = hyla_store_default_params();
        sp.codec = cp;
        sp.write_buffer_bytes = wbuf;
        hyla_store *st = NULL;
        hyla_store_put_stats ps;
        hyla_snapshot *got = NULL;
        if (hyla_store_open(dbdir, &sp, &st) != HYLA_OK) goto fail;
        /* durable pause, whole */
        double t = hyla_now();
        if (hyla_store_put(st, "bench", s1, NULL, &ps) != HYLA_OK) goto fail;
        double dt = hyla_now() - t;
        emit("pause_whole", &c, &cp, b1, dt, ps.bytes_written, ps.raw_bytes_written, run);
        fprintf(stderr, "  pause: plan %.3f s, encode %.3f s, write %.3f s, commit %.3f s\n", ps.seconds_plan,
                ps.seconds_encode, ps.seconds_write, ps.seconds_commit);
        /* restore */
        t = hyla_now();
        if (hyla_store_get(st, "bench", 0, s1->model_fingerprint, &got, NULL) != HYLA_OK) goto fail;
        dt = hyla_now() - t;
        if (!cp.f32_as_bf16 && !hyla_snapshot_equal(got, s1)) { /* bf16 storage is lossy */
            fprintf(stderr, "hyla-bench store: restored state differs!\n");
            rc = 1;
        }
        hyla_snapshot_destroy(got);
        got = NULL;
        emit("restore", &c, &cp, b1, dt, 0, 0, run);
        /* incremental pause: +inc tokens, all recurrent/partition states new */
        t = hyla_now();
        if (hyla_store_put(st, "bench", s2, NULL, &ps) != HYLA_OK) goto fail;
        dt = hyla_now() - t;
        emit("pause_incremental", &c, &cp, b2, dt, ps.bytes_written, ps.raw_bytes_written, run);
        t = hyla_now();
        if (hyla_store_get(st, "bench", 0, 0, &got, NULL) != HYLA_OK) goto fail;
        dt = hyla_now() - t;
        if (!cp.f32_as_bf16 && !hyla_snapshot_equal(got, s2)) {
            fprintf(stderr, "hyla-bench store: restored incremental state differs!\n");
            rc = 1;
        }
        hyla_snapshot_destroy(got);
        got = NULL;
        emit("restore_incremental", &c, &cp, b2, dt, 0, 0, run);
        hyla_store_close(st);
        st = NULL;
        if (since_case(&c, &cp, &sp, base, run, s1, s2) != 0) goto fail;
        /* portable file */
        t = hyla_now();
        if (hyla_snapshot_save_file(file, s1, &cp) != HYLA_OK) goto fail;
        dt = hyla_now() - t;
        emit("file_save", &c, &cp, b1, dt, 0, 0, run);
        t = hyla_now();
        if (hyla_snapshot_load_file(file, &got) != HYLA_OK) goto fail;
        dt = hyla_now() - t;
        if (!cp.f32_as_bf16 && !hyla_snapshot_equal(got, s1)) rc = 1;
        hyla_snapshot_destroy(got);
        emit("file_load", &c, &cp, b1, dt, 0, 0, run);
        continue;
    fail:
        fprintf(stderr, "hyla-bench store: %s\n", hyla_last_error());
        hyla_store_close(st);
        rc = 1;
    }
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", base);
    if (system(cmd) != 0) fprintf(stderr, "hyla-bench store: could not remove %s\n", base);
    hyla_snapshot_destroy(s1);
    hyla_snapshot_destroy(s2);
    return rc;
}
