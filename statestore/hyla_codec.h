/* hyla_codec.h — a session snapshot <-> bytes: chunks, byte shuffle, zstd, xxh64 checksums,
 * and the portable snapshot file (`hyla-run --save-state FILE`, `hyla-state export/import`).
 *
 * docs/STATE_FORMAT.md specifies every byte. In short: each part is cut into chunks of a fixed
 * stride (KV parts: a fixed number of whole pages per chunk, so chunk boundaries do not move
 * when the context grows); each chunk is byte-shuffled by element size, compressed with zstd and
 * carries two xxh64 checksums (of its raw bytes and of its encoded value) and a 128-bit content
 * address. A manifest (session meta + part descriptors + chunk references, with its own xxh64,
 * which is the whole-snapshot checksum) describes the snapshot. Chunks are encoded and decoded
 * in parallel on `threads` pthreads.
 *
 * Upper layer: hyla_snapshot_save_file / hyla_snapshot_load_file. Lower layer (used by the
 * RocksDB store, statestore/hyla_store.c): plan + encode values, parse manifest + decode.
 *
 * Threading: every function is safe to call from several threads on different objects; each
 * call may start its own worker threads and joins them before returning. Decoders (a zstd
 * context and shuffle scratch each, up to 64) are kept between decode calls of the process, so
 * a restore does not allocate and fault in fresh ones each time. */
#ifndef HYLA_CODEC_H
#define HYLA_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "hyla_snapshot.h"
#include "hyla_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Version of the portable file container ("HYLASNAP"); the snapshot format version
 * (HYLA_SNAPSHOT_FORMAT_VERSION) is recorded separately in the manifest. */
#define HYLA_FILE_VERSION 1u
#define HYLA_CHUNK_KEY_BYTES 20   /* XXH3-128 of the raw chunk bytes (16, big-endian) + raw length (4, BE) */
#define HYLA_CHUNK_HEADER_BYTES 32

typedef struct {
    uint32_t chunk_bytes; /* target raw bytes per chunk; default 512 KiB (a restore decodes chunks on
                             every core: smaller chunks spread a small state over more of them);
                             4 KiB .. 256 MiB */
    int zstd_level;       /* default 1; 0 stores chunks uncompressed; negative = zstd fast levels */
    int threads;          /* worker threads; 0 (default) = online cores */
    int f32_as_bf16;      /* 1: store fp32 parts as bf16 (lossy; recorded per part). Default 0 */
    int shuffle;          /* 1 (default): byte-shuffle by element size before zstd */
    int min_gain_pct;     /* a chunk is stored compressed only when zstd saves at least this share of
                             its bytes (default 20): fp32 recurrent states save ~14 % and decode at
                             ~1 GB/s a core, so they are stored raw and restore at copy speed; bf16
                             KV saves ~32 % and stays compressed. 0: whenever it saves a byte */
    int fast_floats;      /* 1 (default): compress shuffled float chunks with zstd's fastest match
                             finder and Huffman-coded literals forced on, instead of zstd_level:
                             float states have almost no long matches, so this keeps level 1's ratio
                             (measured 1.47 vs 1.46 on bf16 KV) at ~2.5x its speed. Output is an
                             ordinary zstd frame either way. 0: plain zstd at zstd_level */
} hyla_codec_params;

hyla_codec_params hyla_codec_default_params(void);

/* ---- portable file ---- */

/* Write s to path durably (PATH.tmp.<pid>, write, fsync, rename, fsync dir). p may be NULL
 * (defaults). On failure the previous file at path, if any, is left untouched. */
hyla_status hyla_snapshot_save_file(const char *path, const hyla_snapshot *s, const hyla_codec_params *p);
/* Read and verify every checksum of a snapshot file. *out: caller frees with
 * hyla_snapshot_destroy. Refuses (HYLA_ERR_FORMAT / CORRUPT / UNSUPPORTED) with a message naming
 * the file, layer, part and chunk. */
hyla_status hyla_snapshot_load_file(const char *path, hyla_snapshot **out);
/* Same, reading from memory (len bytes borrowed); `what` names the source in messages. */
hyla_status hyla_snapshot_decode_file_bytes(const uint8_t *buf, size_t len, const char *what, int threads,
                                            hyla_snapshot **out);
/* Encode to the file format in memory. *out: caller frees with free(). */
hyla_status hyla_snapshot_encode_file_bytes(const hyla_snapshot *s, const hyla_codec_params *p, uint8_t **out,
                                            size_t *len);

/* ---- lower layer: manifests and chunks (for the store) ---- */

/* One chunk of a part, as referenced by a manifest. */
typedef struct {
    uint32_t part;                      /* index of the part in the manifest */
    uint32_t index;                     /* chunk number within the part */
    uint64_t raw_off;                   /* offset in the part's stored-form bytes */
    uint32_t raw_len;                   /* stored-form bytes in this chunk */
    uint64_t raw_hash;                  /* xxh64 (seed 0) of those bytes */
    uint8_t key[HYLA_CHUNK_KEY_BYTES];  /* content address */
} hyla_chunk_ref;

/* A part descriptor as recorded in a manifest. */
typedef struct {
    hyla_state_part desc;    /* layer, name, kind, dtype, shape, page_tokens, nbytes; data = NULL */
    uint32_t stored_dtype;   /* dtype of the stored bytes (BF16 when an F32 part was stored lossy) */
    uint32_t pages_per_chunk;/* KV parts: whole pages per chunk; 0 otherwise */
    uint64_t stored_bytes;   /* bytes of the part in stored form */
    uint64_t chunk_bytes;    /* stride of chunks in stored bytes (the last one may be shorter) */
    uint32_t first_chunk;    /* index of its first chunk in hyla_manifest.chunks */
    uint32_t n_chunks;
} hyla_manifest_part;

typedef struct {
    hyla_snapshot meta;      /* session meta; parts NULL, n_parts 0 (see parts below) */
    hyla_manifest_part *parts;
    uint32_t n_parts;
    hyla_chunk_ref *chunks;  /* all chunks, part by part */
    size_t n_chunks;
    uint64_t raw_bytes;      /* sum of the parts' in-memory bytes */
    uint64_t checksum;       /* xxh64 of the manifest bytes = the whole-snapshot checksum */
} hyla_manifest;

/* Encoding plan: chunk references and hashes of a snapshot, then the encoded chunk values of
 * the chunks the caller asks for. Borrows the snapshot until destroyed. */
typedef struct {
    hyla_chunk_ref ref;
    int want;           /* caller sets 1 for chunks whose value hyla_codec_plan_encode must build */
    uint8_t *value;     /* encoded chunk value (header + payload), owned by the plan */
    size_t value_len;
    uint32_t arena;     /* internal: which value arena holds it */
    int reused;         /* 1: ref copied from a base manifest (hyla_codec_plan_create_reusing); its bytes
                           in the snapshot were not read and it cannot be encoded */
} hyla_plan_chunk;

typedef struct {
    const hyla_snapshot *snap;  /* borrowed */
    hyla_codec_params params;
    hyla_plan_chunk *chunks;    /* [n_chunks], manifest order */
    size_t n_chunks;
    uint8_t *manifest;          /* encoded manifest, owned */
    size_t manifest_len;
    uint64_t checksum;          /* manifest checksum */
    uint8_t **stored;           /* [n_parts] stored-form copies of converted parts, or NULL */
    void *impl;                 /* internal: per-thread zstd contexts and scratch, value arenas */
} hyla_codec_plan;

/* Cut s into chunks, hash them (in parallel) and build the manifest. Caller frees with
 * hyla_codec_plan_destroy. */
hyla_status hyla_codec_plan_create(const hyla_snapshot *s, const hyla_codec_params *p, hyla_codec_plan **out);
/* Incremental plans: when the first shared[i] bytes of part i are known to equal the part of
 * the same layer and name in the snapshot that `base` describes (KV rows of earlier tokens never
 * change), leading chunks there need not be read or hashed: their references are copied from
 * base. Chunk c of part i is taken from base only where that provably gives the same reference:
 * neither side stores the part lossy (stored dtype = dtype), the base part has the same kind and
 * dtype and was cut with the same stride and pages per chunk, and the chunk lies wholly inside
 * [0, shared[i]) with the same offset and length as the base's chunk c. Only a leading run is
 * taken. The resulting plan and manifest are byte-identical to hyla_codec_plan_create's for the
 * snapshot with its shared prefixes filled in.
 *
 * hyla_codec_plan_reuse writes filled_from[i] (n_parts entries, byte offsets in the part's
 * in-memory bytes): the end of the run taken from base; 0 where nothing is. The snapshot's own
 * bytes of part i are read from filled_from[i] on, so before hyla_codec_plan_create_reusing the
 * caller makes bytes [filled_from[i], shared[i]) final (hyla_codec_decode_range); bytes below
 * filled_from[i] may be anything. base and shared may be NULL (no reuse); shared has n_parts
 * entries. base is read during the call only. s must be whole (no part skips bytes). */
hyla_status hyla_codec_plan_reuse(const hyla_snapshot *s, const hyla_codec_params *p, const hyla_manifest *base,
                                  const uint64_t *shared, uint64_t *filled_from);
/* As hyla_codec_plan_create, taking chunks from base as hyla_codec_plan_reuse decides for the
 * same arguments (those chunks have reused = 1). Caller frees with hyla_codec_plan_destroy. */
hyla_status hyla_codec_plan_create_reusing(const hyla_snapshot *s, const hyla_codec_params *p,
                                           const hyla_manifest *base, const uint64_t *shared, hyla_codec_plan **out);
/* Build the values of every chunk with want != 0 (in parallel). Values of one call share one
 * allocation (an arena) that is reused by a later call once every value in it was released, so
 * encoding group after group (encode, write, release) touches fresh memory only once. */
hyla_status hyla_codec_plan_encode(hyla_codec_plan *plan);
/* Free one chunk's value early (after it was written). */
void hyla_codec_plan_release(hyla_codec_plan *plan, size_t i);
void hyla_codec_plan_destroy(hyla_codec_plan *plan); /* accepts NULL */

/* Parse and check a manifest (magic, format version, checksum, sizes). `what` names the source
 * in messages ("session s1 version 3"). *out: caller frees with hyla_manifest_destroy. */
hyla_status hyla_manifest_parse(const uint8_t *buf, size_t len, const char *what, hyla_manifest **out);
void hyla_manifest_destroy(hyla_manifest *m); /* accepts NULL */
/* Keep only the parts of m of the given kind (and their chunks), in order; the meta stays. For
 * reading one part without the rest (hyla_store_get_token_log). */
void hyla_manifest_keep_kind(hyla_manifest *m, uint32_t kind);
/* A snapshot with the manifest's meta and parts allocated (zero-filled), or layout only
 * (data NULL) when alloc_data is 0 — for hyla_snapshot_check_layout. Caller frees. */
hyla_status hyla_manifest_to_snapshot(const hyla_manifest *m, int alloc_data, hyla_snapshot **out);

/* Fetch the stored value of chunk i. On success *val and *len are valid until release(*token) is
 * called (release may be NULL). Return HYLA_ERR_NOT_FOUND for a missing chunk. Called from
 * several threads at once. */
typedef hyla_status (*hyla_chunk_fetch_fn)(void *ctx, const hyla_manifest *m, size_t i, const uint8_t **val,
                                           size_t *len, void **token);
typedef void (*hyla_chunk_release_fn)(void *ctx, void *token);

/* Decode every chunk into a new snapshot, verifying each checksum. Refusals name
 * `what`, layer, part and chunk. *out: caller frees with hyla_snapshot_destroy. */
hyla_status hyla_codec_decode(const hyla_manifest *m, hyla_chunk_fetch_fn fetch, hyla_chunk_release_fn release,
                              void *ctx, const char *what, int threads, hyla_snapshot **out);
/* Streaming decode: every chunk into dst, a snapshot the caller laid out like m (the same parts
 * in the same order with the same nbytes, data set: e.g. carved from pinned memory; else
 * HYLA_ERR_INVALID_ARG), verifying each checksum. As each chunk's bytes are decoded and
 * verified, done(done_ctx, part, off, len) is called from the decode thread that did it
 * (concurrently from several: it must be thread-safe and quick): bytes [off, off + len) of
 * dst->parts[part].data are final. Each byte is reported once; a failed chunk is not reported.
 * On failure dst holds some chunks (the caller discards it). done may be NULL. */
typedef void (*hyla_chunk_done_fn)(void *ctx, uint32_t part, uint64_t off, uint64_t len);
hyla_status hyla_codec_decode_into(const hyla_manifest *m, hyla_chunk_fetch_fn fetch, hyla_chunk_release_fn release,
                                   void *ctx, const char *what, int threads, hyla_snapshot *dst,
                                   hyla_chunk_done_fn done, void *done_ctx);
/* Check every chunk without building a snapshot. Calls report(msg) for every problem found
 * (report may be NULL); returns HYLA_OK when none, else the status of the first problem. */
typedef void (*hyla_report_fn)(void *ctx, const char *msg);
hyla_status hyla_codec_verify(const hyla_manifest *m, hyla_chunk_fetch_fn fetch, hyla_chunk_release_fn release,
                              void *ctx, const char *what, int threads, hyla_report_fn report, void *report_ctx);

/* Decode only bytes [from[i], to[i]) (in-memory byte offsets, whole elements) of every part i of
 * dst from the snapshot m describes, matching parts by layer and name: just the chunks that
 * cover them are fetched, decoded and verified (in parallel); no other byte of dst is written.
 * A part of m stored lossy (f32 as bf16) gives its decoded values back as f32. Refusals:
 * HYLA_ERR_NOT_FOUND (m has no such part), HYLA_ERR_FORMAT (another kind or dtype, or fewer than
 * to[i] bytes), naming `what`, layer and part; chunk failures as hyla_codec_decode's. dst is
 * borrowed and whole (no part skips bytes); parts with from[i] >= to[i] are left alone. */
hyla_status hyla_codec_decode_range(const hyla_manifest *m, hyla_chunk_fetch_fn fetch, hyla_chunk_release_fn release,
                                    void *ctx, const char *what, int threads, hyla_snapshot *dst, const uint64_t *from,
                                    const uint64_t *to);

/* Decode one chunk value into dst (ref->raw_len bytes), checking the value's own header and
 * checksum and then the raw checksum against ref. On failure writes a reason (without the
 * location) into err and returns HYLA_ERR_CORRUPT or HYLA_ERR_FORMAT. Thread-safe. */
hyla_status hyla_chunk_decode(const uint8_t *val, size_t len, const hyla_chunk_ref *ref, uint8_t *dst, char *err,
                              size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
