/* hyla_codec.c — snapshot <-> manifest + chunk values, and the portable snapshot file.
 *
 * Invariants: a chunk's stored-form bytes are a fixed stride of its part (KV: whole pages), so
 * the same state always yields the same chunk keys; every value carries xxh64 of its header and
 * payload, every chunk reference carries xxh64 of its raw bytes, and the manifest ends with its
 * own xxh64 (the whole-snapshot checksum). Decoding checks all three and names the location of
 * any mismatch. Byte order on disk is little-endian throughout, keys big-endian.
 *
 * Threading: stateless apart from the fault-injection counters (atomics). Encoding and decoding
 * spread chunks over pthreads (hyla_parallel_for), each thread with its own zstd context and
 * scratch buffer. Errors from worker threads are collected under a mutex; the one with the lowest
 * chunk index is reported on the caller's thread. */
#include "hyla_codec.h"
#include "hyla_codec_test.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>
#define ZSTD_STATIC_LINKING_ONLY /* ZSTD_c_literalCompressionMode (stable since zstd 1.5.0) */
#include <zstd.h>
#include <zstd_errors.h>

#include "hyla_log.h"
#include "hyla_thread.h"
#include "hyla_util.h"

#define MANIFEST_MAGIC "HYLAMFST"
#define FILE_MAGIC "HYLASNAP"
#define TRAILER_MAGIC "HYLAEND"
#define CHUNK_MAGIC 0x4b435948u /* "HYCK" little-endian */
#define MANIFEST_HEADER_BYTES 128
#define MANIFEST_PART_BYTES 108
#define MANIFEST_CHUNK_BYTES 32
#define FILE_HEADER_BYTES 32
#define FILE_TRAILER_BYTES 32
#define CODEC_RAW 0
#define CODEC_ZSTD 1

/* ---------------------------------------------------------------- fault injection */

static atomic_long fault_zstd_countdown;
static atomic_long fault_write_countdown;

void hyla_codec_fault_zstd(long nth) { atomic_store(&fault_zstd_countdown, nth); }
void hyla_codec_fault_write(long nth) { atomic_store(&fault_write_countdown, nth); }

/* 1 when this call is the one to fail. */
static int fault_hit(atomic_long *c) {
    long v = atomic_load(c);
    while (v > 0) {
        if (atomic_compare_exchange_weak(c, &v, v - 1)) return v == 1;
    }
    return 0;
}

/* ---------------------------------------------------------------- params, errors of threads */

hyla_codec_params hyla_codec_default_params(void) {
    hyla_codec_params p;
    memset(&p, 0, sizeof p);
    p.chunk_bytes = 512u << 10;
    p.zstd_level = 1;
    p.min_gain_pct = 20;
    p.threads = 0;
    p.f32_as_bf16 = 0;
    p.shuffle = 1;
    p.fast_floats = 1;
    return p;
}

/* First error (lowest index) of a parallel run. */
typedef struct {
    pthread_mutex_t mu;
    size_t index;
    hyla_status status;
    char msg[1024];
} first_error;

static void first_error_init(first_error *e) {
    pthread_mutex_init(&e->mu, NULL);
    e->index = (size_t)-1;
    e->status = HYLA_OK;
    e->msg[0] = 0;
}

static void first_error_set(first_error *e, size_t index, hyla_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void first_error_set(first_error *e, size_t index, hyla_status st, const char *fmt, ...) {
    pthread_mutex_lock(&e->mu);
    if (index < e->index) {
        e->index = index;
        e->status = st;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->msg, sizeof e->msg, fmt, ap);
        va_end(ap);
    }
    pthread_mutex_unlock(&e->mu);
}

static hyla_status first_error_finish(first_error *e) {
    pthread_mutex_destroy(&e->mu);
    if (e->status != HYLA_OK) return hyla_fail(e->status, "%s", e->msg);
    return HYLA_OK;
}

/* ---------------------------------------------------------------- little helpers */

static void put_f32(uint8_t *p, float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    hyla_put_le32(p, u);
}
static float get_f32(const uint8_t *p) {
    uint32_t u = hyla_get_le32(p);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Byte shuffle: plane b holds byte b of every element (n elements of size e). SSE2 (the x86-64
 * baseline) for 2- and 4-byte elements: de-interleave even/odd bytes with mask/shift + packus. */
#if defined(__SSE2__)
#include <emmintrin.h>
#define HYLA_SSE2 1
#endif

static void shuffle_bytes(uint8_t *restrict dst, const uint8_t *restrict src, size_t n, size_t e) {
    size_t i = 0;
#ifdef HYLA_SSE2
    const __m128i m = _mm_set1_epi16(0x00ff);
    if (e == 2) {
        for (; i + 16 <= n; i += 16) {
            __m128i v0 = _mm_loadu_si128((const __m128i *)(src + 2 * i));
            __m128i v1 = _mm_loadu_si128((const __m128i *)(src + 2 * i + 16));
            _mm_storeu_si128((__m128i *)(dst + i), _mm_packus_epi16(_mm_and_si128(v0, m), _mm_and_si128(v1, m)));
            _mm_storeu_si128((__m128i *)(dst + n + i), _mm_packus_epi16(_mm_srli_epi16(v0, 8), _mm_srli_epi16(v1, 8)));
        }
    } else if (e == 4) {
        for (; i + 16 <= n; i += 16) {
            const uint8_t *p = src + 4 * i;
            __m128i v0 = _mm_loadu_si128((const __m128i *)p), v1 = _mm_loadu_si128((const __m128i *)(p + 16));
            __m128i v2 = _mm_loadu_si128((const __m128i *)(p + 32)), v3 = _mm_loadu_si128((const __m128i *)(p + 48));
            __m128i e0 = _mm_packus_epi16(_mm_and_si128(v0, m), _mm_and_si128(v1, m)); /* b0 b2 ... */
            __m128i e1 = _mm_packus_epi16(_mm_and_si128(v2, m), _mm_and_si128(v3, m));
            __m128i o0 = _mm_packus_epi16(_mm_srli_epi16(v0, 8), _mm_srli_epi16(v1, 8)); /* b1 b3 ... */
            __m128i o1 = _mm_packus_epi16(_mm_srli_epi16(v2, 8), _mm_srli_epi16(v3, 8));
            _mm_storeu_si128((__m128i *)(dst + i), _mm_packus_epi16(_mm_and_si128(e0, m), _mm_and_si128(e1, m)));
            _mm_storeu_si128((__m128i *)(dst + n + i), _mm_packus_epi16(_mm_and_si128(o0, m), _mm_and_si128(o1, m)));
            _mm_storeu_si128((__m128i *)(dst + 2 * n + i),
                             _mm_packus_epi16(_mm_srli_epi16(e0, 8), _mm_srli_epi16(e1, 8)));
            _mm_storeu_si128((__m128i *)(dst + 3 * n + i),
                             _mm_packus_epi16(_mm_srli_epi16(o0, 8), _mm_srli_epi16(o1, 8)));
        }
    }
#endif
    for (size_t b = 0; b < e; b++)
        for (size_t k = i; k < n; k++) dst[b * n + k] = src[k * e + b];
}

static void unshuffle_bytes(uint8_t *restrict dst, const uint8_t *restrict src, size_t n, size_t e) {
    size_t i = 0;
#ifdef HYLA_SSE2
    if (e == 2) {
        for (; i + 16 <= n; i += 16) {
            __m128i lo = _mm_loadu_si128((const __m128i *)(src + i)), hi = _mm_loadu_si128((const __m128i *)(src + n + i));
            _mm_storeu_si128((__m128i *)(dst + 2 * i), _mm_unpacklo_epi8(lo, hi));
            _mm_storeu_si128((__m128i *)(dst + 2 * i + 16), _mm_unpackhi_epi8(lo, hi));
        }
    } else if (e == 4) {
        for (; i + 16 <= n; i += 16) {
            __m128i b0 = _mm_loadu_si128((const __m128i *)(src + i));
            __m128i b1 = _mm_loadu_si128((const __m128i *)(src + n + i));
            __m128i b2 = _mm_loadu_si128((const __m128i *)(src + 2 * n + i));
            __m128i b3 = _mm_loadu_si128((const __m128i *)(src + 3 * n + i));
            __m128i t0 = _mm_unpacklo_epi8(b0, b1), t1 = _mm_unpackhi_epi8(b0, b1);
            __m128i u0 = _mm_unpacklo_epi8(b2, b3), u1 = _mm_unpackhi_epi8(b2, b3);
            uint8_t *p = dst + 4 * i;
            _mm_storeu_si128((__m128i *)p, _mm_unpacklo_epi16(t0, u0));
            _mm_storeu_si128((__m128i *)(p + 16), _mm_unpackhi_epi16(t0, u0));
            _mm_storeu_si128((__m128i *)(p + 32), _mm_unpacklo_epi16(t1, u1));
            _mm_storeu_si128((__m128i *)(p + 48), _mm_unpackhi_epi16(t1, u1));
        }
    }
#endif
    for (size_t b = 0; b < e; b++)
        for (size_t k = i; k < n; k++) dst[k * e + b] = src[b * n + k];
}

static int dtype_valid(uint32_t dt) { return dt < HYLA_DT_COUNT; }

/* Stored element size of a part (for the shuffle). */
static size_t stored_elem(uint32_t stored_dtype) { return hyla_dtype_size((hyla_dtype)stored_dtype); }

/* Location text "layer L part NAME (kind) chunk C/N". */
static void loc_text(char *buf, size_t n, const hyla_manifest *m, const hyla_chunk_ref *c) {
    const hyla_manifest_part *mp = &m->parts[c->part];
    if (mp->desc.layer == HYLA_SNAPSHOT_SESSION_LAYER) /* the session's own parts: no layer number */
        snprintf(buf, n, "session part %s (%s) chunk %u/%u", mp->desc.name,
                 hyla_part_kind_name((hyla_part_kind)mp->desc.kind), c->index, mp->n_chunks);
    else
        snprintf(buf, n, "layer %u part %s (%s) chunk %u/%u", mp->desc.layer, mp->desc.name,
                 hyla_part_kind_name((hyla_part_kind)mp->desc.kind), c->index, mp->n_chunks);
}

/* ---------------------------------------------------------------- chunk values */

/* Value layout (docs/STATE_FORMAT.md §3):
 *  0 u32 magic "HYCK" | 4 u8 codec | 5 u8 shuffle element size | 6 u16 0 | 8 u32 raw_len
 * 12 u32 payload_len | 16 u64 raw xxh64 | 24 u64 check = XXH64(payload, seed = XXH64(bytes 0..24, 0))
 * 32 payload */
static uint64_t value_check(const uint8_t *hdr, const uint8_t *payload, size_t plen) {
    uint64_t seed = XXH64(hdr, 24, 0);
    return XXH64(payload, plen, seed);
}

typedef struct {
    ZSTD_CCtx *cctx;
    int cctx_mode;    /* compression level the cctx is set up for; INT_MIN = none */
    int cctx_fast;    /* set up for fast_floats */
    ZSTD_DCtx *dctx;
    uint8_t *scratch;
    size_t scratch_len;
} thread_scratch;

static int scratch_reserve(thread_scratch *t, size_t n) {
    if (t->scratch_len >= n) return 1;
    free(t->scratch);
    t->scratch = malloc(n ? n : 1);
    t->scratch_len = t->scratch ? n : 0;
    return t->scratch != NULL;
}

static void scratch_free(thread_scratch *t, int n) {
    for (int i = 0; i < n; i++) {
        ZSTD_freeCCtx(t[i].cctx);
        ZSTD_freeDCtx(t[i].dctx);
        free(t[i].scratch);
    }
    free(t);
}

/* Encode raw bytes into a new value. Returns 0 on success, else writes err. */
static size_t value_bound(uint32_t raw_len) {
    size_t bound = ZSTD_compressBound(raw_len);
    return HYLA_CHUNK_HEADER_BYTES + (bound > raw_len ? bound : raw_len);
}

/* Encode raw bytes into v (value_bound(raw_len) bytes). Returns 0 on success, else writes err. */
static int encode_value(thread_scratch *ts, const uint8_t *raw, uint32_t raw_len, uint64_t raw_hash, size_t elem,
                        int is_float, const hyla_codec_params *p, uint8_t *v, size_t *out_len, char *err,
                        size_t errlen) {
    size_t bound = value_bound(raw_len) - HYLA_CHUNK_HEADER_BYTES;
    uint8_t codec = CODEC_RAW, shuf = 1;
    size_t plen = raw_len;
    if (p->zstd_level != 0 && raw_len > 0) {
        const uint8_t *in = raw;
        if (p->shuffle && elem > 1 && raw_len % elem == 0) {
            if (!scratch_reserve(ts, raw_len)) {
                snprintf(err, errlen, "out of memory for shuffle scratch");
                return -1;
            }
            shuffle_bytes(ts->scratch, raw, raw_len / elem, elem);
            in = ts->scratch;
            shuf = (uint8_t)elem;
        }
        int fast = p->fast_floats && shuf > 1 && is_float;
        if (!ts->cctx) {
            ts->cctx = ZSTD_createCCtx();
            ts->cctx_fast = -1;
        }
        if (ts->cctx && (ts->cctx_fast != fast || ts->cctx_mode != p->zstd_level)) {
            ZSTD_CCtx_reset(ts->cctx, ZSTD_reset_session_and_parameters);
            ZSTD_CCtx_setParameter(ts->cctx, ZSTD_c_compressionLevel, fast ? -100 : p->zstd_level);
            if (fast) ZSTD_CCtx_setParameter(ts->cctx, ZSTD_c_literalCompressionMode, ZSTD_ps_enable);
            ts->cctx_fast = fast;
            ts->cctx_mode = p->zstd_level;
        }
        size_t zr;
        if (fault_hit(&fault_zstd_countdown))
            zr = (size_t)-ZSTD_error_GENERIC;
        else if (!ts->cctx)
            zr = (size_t)-ZSTD_error_memory_allocation;
        else
            zr = ZSTD_compress2(ts->cctx, v + HYLA_CHUNK_HEADER_BYTES, bound, in, raw_len);
        if (ZSTD_isError(zr)) {
            snprintf(err, errlen, "zstd compress failed: %s", ZSTD_getErrorName(zr));
            return -1;
        }
        int gain = p->min_gain_pct > 0 ? (p->min_gain_pct < 100 ? p->min_gain_pct : 100) : 0;
        if (zr < raw_len && (uint64_t)zr * 100 <= (uint64_t)raw_len * (uint64_t)(100 - gain)) {
            codec = CODEC_ZSTD;
            plen = zr;
        } else {
            shuf = 1;
        }
    }
    if (codec == CODEC_RAW) memcpy(v + HYLA_CHUNK_HEADER_BYTES, raw, raw_len);
    hyla_put_le32(v, CHUNK_MAGIC);
    v[4] = codec;
    v[5] = shuf;
    v[6] = v[7] = 0;
    hyla_put_le32(v + 8, raw_len);
    hyla_put_le32(v + 12, (uint32_t)plen);
    hyla_put_le64(v + 16, raw_hash);
    hyla_put_le64(v + 24, value_check(v, v + HYLA_CHUNK_HEADER_BYTES, plen));
    *out_len = HYLA_CHUNK_HEADER_BYTES + plen;
    return 0;
}

/* A raw chunk's bytes leave for their destination in blocks of HASH_BLOCK: each block hashed
 * from the value, then copied from the cache to dst with SSE2 streaming stores where dst is
 * 16-byte aligned (fenced before the decode returns). dst is a restore's pinned buffer, read next
 * by a device copy, not by this core: plain stores would read each of its lines into the cache
 * before writing it, and a hash of dst would read them once more, so the host's memory moved a
 * chunk three or four times where it now moves it twice (the value read, dst written). A
 * shuffled chunk keeps its unshuffle into dst and the hash of dst: unshuffling a block into the
 * cache, hashing it there and streaming it out was slower on the development VM (2,634-2,966
 * against 2,851-3,579 MB/s, `hyla-bench store` codec_decode at zstd level 1, three rounds). */
#define HASH_BLOCK ((size_t)64 << 10)

static void stream_copy(uint8_t *dst, const uint8_t *src, size_t n) {
    size_t i = 0;
#ifdef HYLA_SSE2
    if (((uintptr_t)dst & 15) == 0)
        for (; i + 64 <= n; i += 64) {
            const __m128i a = _mm_loadu_si128((const __m128i *)(src + i));
            const __m128i b = _mm_loadu_si128((const __m128i *)(src + i + 16));
            const __m128i c = _mm_loadu_si128((const __m128i *)(src + i + 32));
            const __m128i d = _mm_loadu_si128((const __m128i *)(src + i + 48));
            _mm_stream_si128((__m128i *)(dst + i), a);
            _mm_stream_si128((__m128i *)(dst + i + 16), b);
            _mm_stream_si128((__m128i *)(dst + i + 32), c);
            _mm_stream_si128((__m128i *)(dst + i + 48), d);
        }
#endif
    if (i < n) memcpy(dst + i, src + i, n - i);
}

static void stream_fence(void) {
#ifdef HYLA_SSE2
    _mm_sfence();
#endif
}

/* A raw chunk's bytes into dst and their xxh64 (seed 0): each block hashed from the source, then
 * copied from the cache. */
static uint64_t copy_hash_raw(uint8_t *dst, const uint8_t *src, size_t n) {
    XXH64_state_t st;
    XXH64_reset(&st, 0);
    for (size_t off = 0; off < n; off += HASH_BLOCK) {
        const size_t m = n - off < HASH_BLOCK ? n - off : HASH_BLOCK;
        XXH64_update(&st, src + off, m);
        stream_copy(dst + off, src + off, m);
    }
    stream_fence();
    return XXH64_digest(&st);
}

/* Decode a value into dst (ref->raw_len bytes). */
static hyla_status decode_value(thread_scratch *ts, const uint8_t *val, size_t len, const hyla_chunk_ref *ref,
                                uint8_t *dst, char *err, size_t errlen) {
    if (len < HYLA_CHUNK_HEADER_BYTES) {
        snprintf(err, errlen, "truncated value: %zu bytes, shorter than the %d-byte chunk header", len,
                 HYLA_CHUNK_HEADER_BYTES);
        return HYLA_ERR_CORRUPT;
    }
    if (hyla_get_le32(val) != CHUNK_MAGIC) {
        snprintf(err, errlen, "not a chunk value (magic %08x)", hyla_get_le32(val));
        return HYLA_ERR_CORRUPT;
    }
    uint8_t codec = val[4], shuf = val[5];
    uint32_t raw_len = hyla_get_le32(val + 8), plen = hyla_get_le32(val + 12);
    if ((size_t)plen + HYLA_CHUNK_HEADER_BYTES != len) {
        snprintf(err, errlen, "%s value: %zu bytes, header says %zu",
                 (size_t)plen + HYLA_CHUNK_HEADER_BYTES > len ? "truncated" : "oversized", len,
                 (size_t)plen + HYLA_CHUNK_HEADER_BYTES);
        return HYLA_ERR_CORRUPT;
    }
    /* A raw value's payload is the chunk itself, verified below against the manifest's hash, so
     * its value check would read the bytes a third time to prove nothing more: only compressed
     * values (whose payload the decompressor must not trust) are checked here. */
    const uint64_t check = codec == CODEC_RAW ? hyla_get_le64(val + 24) : value_check(val, val + HYLA_CHUNK_HEADER_BYTES, plen);
    if (check != hyla_get_le64(val + 24)) {
        snprintf(err, errlen, "checksum mismatch (value xxh64 %016llx, stored %016llx)", (unsigned long long)check,
                 (unsigned long long)hyla_get_le64(val + 24));
        return HYLA_ERR_CORRUPT;
    }
    if (raw_len != ref->raw_len || hyla_get_le64(val + 16) != ref->raw_hash) {
        snprintf(err, errlen, "value is for another chunk (raw %u bytes xxh64 %016llx, manifest wants %u bytes %016llx)",
                 raw_len, (unsigned long long)hyla_get_le64(val + 16), ref->raw_len, (unsigned long long)ref->raw_hash);
        return HYLA_ERR_CORRUPT;
    }
    const uint8_t *payload = val + HYLA_CHUNK_HEADER_BYTES;
    uint64_t h; /* xxh64 of the decoded bytes */
    if (codec == CODEC_RAW) {
        if (plen != raw_len) {
            snprintf(err, errlen, "raw chunk with payload %u bytes for %u raw bytes", plen, raw_len);
            return HYLA_ERR_CORRUPT;
        }
        h = copy_hash_raw(dst, payload, raw_len);
    } else if (codec == CODEC_ZSTD) {
        if (shuf == 0 || (shuf > 1 && raw_len % shuf != 0)) {
            snprintf(err, errlen, "bad shuffle element size %u for %u bytes", shuf, raw_len);
            return HYLA_ERR_CORRUPT;
        }
        uint8_t *zdst = dst;
        if (shuf > 1) {
            if (!scratch_reserve(ts, raw_len)) {
                snprintf(err, errlen, "out of memory for a %u-byte chunk", raw_len);
                return HYLA_ERR_NOMEM;
            }
            zdst = ts->scratch;
        }
        if (!ts->dctx) ts->dctx = ZSTD_createDCtx();
        size_t zr;
        if (fault_hit(&fault_zstd_countdown))
            zr = (size_t)-ZSTD_error_GENERIC;
        else if (!ts->dctx)
            zr = (size_t)-ZSTD_error_memory_allocation;
        else
            zr = ZSTD_decompressDCtx(ts->dctx, zdst, raw_len, payload, plen);
        if (ZSTD_isError(zr) || zr != raw_len) {
            snprintf(err, errlen, "zstd decompress failed: %s",
                     ZSTD_isError(zr) ? ZSTD_getErrorName(zr) : "wrong decompressed size");
            return HYLA_ERR_CORRUPT;
        }
        if (shuf > 1) unshuffle_bytes(dst, zdst, raw_len / shuf, shuf);
        h = XXH64(dst, raw_len, 0);
    } else {
        snprintf(err, errlen, "unknown chunk codec %u", codec);
        return HYLA_ERR_CORRUPT;
    }
    if (h != ref->raw_hash) {
        snprintf(err, errlen, "checksum mismatch of decoded bytes (xxh64 %016llx, manifest %016llx)",
                 (unsigned long long)h, (unsigned long long)ref->raw_hash);
        return HYLA_ERR_CORRUPT;
    }
    return HYLA_OK;
}

hyla_status hyla_chunk_decode(const uint8_t *val, size_t len, const hyla_chunk_ref *ref, uint8_t *dst, char *err,
                              size_t errlen) {
    thread_scratch ts;
    memset(&ts, 0, sizeof ts);
    hyla_status st = decode_value(&ts, val, len, ref, dst, err, errlen);
    ZSTD_freeDCtx(ts.dctx);
    free(ts.scratch);
    return st;
}

/* ---------------------------------------------------------------- plan (encode side) */

static void make_key(uint8_t key[HYLA_CHUNK_KEY_BYTES], const uint8_t *raw, uint32_t len) {
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(raw, len));
    memcpy(key, c.digest, 16);
    key[16] = (uint8_t)(len >> 24);
    key[17] = (uint8_t)(len >> 16);
    key[18] = (uint8_t)(len >> 8);
    key[19] = (uint8_t)len;
}

/* Chunk stride of a part in stored bytes; *ppc = pages per chunk for KV parts. */
static uint64_t part_stride(const hyla_state_part *p, size_t selem, uint64_t stored_bytes, uint32_t target,
                            uint32_t *ppc) {
    *ppc = 0;
    if (p->kind == HYLA_PART_KV && p->page_tokens > 0) {
        uint64_t row = selem;
        for (uint32_t d = 1; d < p->ndim; d++) row *= p->shape[d];
        uint64_t page = row * p->page_tokens;
        if (page == 0) page = 1;
        uint64_t n = target / page;
        if (n < 1) n = 1;
        *ppc = (uint32_t)n;
        return n * page;
    }
    uint64_t s = target - target % selem;
    if (s == 0) s = selem;
    (void)stored_bytes;
    return s;
}

static const uint8_t *plan_part_bytes(const hyla_codec_plan *pl, uint32_t part) {
    if (pl->stored && pl->stored[part]) return pl->stored[part];
    return pl->snap->parts[part].data;
}

static int part_lossy(const hyla_codec_params *p, const hyla_state_part *sp) {
    return p->f32_as_bf16 && sp->dtype == HYLA_DT_F32;
}

static void plan_hash_fn(void *ctx, size_t i, int tid) {
    (void)tid;
    hyla_codec_plan *pl = ctx;
    if (pl->chunks[i].reused) return; /* key and hashes came from the base manifest */
    hyla_chunk_ref *r = &pl->chunks[i].ref;
    const uint8_t *raw = plan_part_bytes(pl, r->part) + r->raw_off;
    r->raw_hash = XXH64(raw, r->raw_len, 0);
    make_key(r->key, raw, r->raw_len);
}

typedef struct {
    hyla_codec_plan *pl;
    uint32_t part;
} conv_ctx;

static void conv_fn(void *ctx, size_t i, int tid) {
    (void)tid;
    conv_ctx *c = ctx;
    const hyla_state_part *sp = &c->pl->snap->parts[c->part];
    size_t n = sp->nbytes / 4;
    size_t blk = 1u << 20;
    size_t a = i * blk, b = a + blk < n ? a + blk : n;
    hyla_from_f32((uint16_t *)c->pl->stored[c->part] + a, HYLA_DT_BF16, (const float *)sp->data + a, b - a);
}

/* Serialize the manifest of a plan. */
static hyla_status plan_manifest(hyla_codec_plan *pl, const uint64_t *stored_bytes, const uint64_t *stride,
                                 const uint32_t *ppc, const uint32_t *nch) {
    const hyla_snapshot *s = pl->snap;
    size_t len = MANIFEST_HEADER_BYTES + (size_t)s->n_parts * MANIFEST_PART_BYTES + pl->n_chunks * MANIFEST_CHUNK_BYTES + 8;
    uint8_t *b = calloc(1, len);
    if (!b) return hyla_fail(HYLA_ERR_NOMEM, "manifest of %zu bytes", len);
    memcpy(b, MANIFEST_MAGIC, 8);
    hyla_put_le32(b + 8, s->format_version);
    hyla_put_le32(b + 12, 0);
    hyla_put_le64(b + 16, s->model_fingerprint);
    hyla_put_le64(b + 24, s->position);
    hyla_put_le64(b + 32, s->n_generated);
    hyla_put_le32(b + 40, (uint32_t)s->pending_token);
    put_f32(b + 44, s->sampler.temperature);
    hyla_put_le32(b + 48, (uint32_t)s->sampler.top_k);
    put_f32(b + 52, s->sampler.top_p);
    hyla_put_le64(b + 56, s->sampler.seed);
    for (int i = 0; i < 4; i++) hyla_put_le64(b + 64 + 8 * i, s->rng[i]);
    hyla_put_le32(b + 96, s->n_layers);
    hyla_put_le32(b + 100, s->n_parts);
    hyla_put_le64(b + 104, hyla_snapshot_bytes(s));
    hyla_put_le64(b + 112, pl->n_chunks);
    uint8_t *q = b + MANIFEST_HEADER_BYTES;
    size_t ci = 0;
    for (uint32_t i = 0; i < s->n_parts; i++) {
        const hyla_state_part *sp = &s->parts[i];
        hyla_put_le32(q, sp->layer);
        memcpy(q + 4, sp->name, HYLA_PART_NAME_MAX);
        hyla_put_le32(q + 20, sp->kind);
        hyla_put_le32(q + 24, sp->dtype);
        hyla_put_le32(q + 28, part_lossy(&pl->params, sp) ? HYLA_DT_BF16 : sp->dtype);
        hyla_put_le32(q + 32, sp->ndim);
        for (int d = 0; d < HYLA_PART_MAX_DIMS; d++) hyla_put_le64(q + 36 + 8 * d, d < (int)sp->ndim ? sp->shape[d] : 0);
        hyla_put_le32(q + 68, sp->page_tokens);
        hyla_put_le32(q + 72, ppc[i]);
        hyla_put_le64(q + 76, sp->nbytes);
        hyla_put_le64(q + 84, stored_bytes[i]);
        hyla_put_le64(q + 92, stride[i]);
        hyla_put_le32(q + 100, nch[i]);
        hyla_put_le32(q + 104, 0);
        q += MANIFEST_PART_BYTES;
        for (uint32_t c = 0; c < nch[i]; c++, ci++) {
            const hyla_chunk_ref *r = &pl->chunks[ci].ref;
            memcpy(q, r->key, HYLA_CHUNK_KEY_BYTES);
            hyla_put_le32(q + 20, r->raw_len);
            hyla_put_le64(q + 24, r->raw_hash);
            q += MANIFEST_CHUNK_BYTES;
        }
    }
    pl->checksum = XXH64(b, len - 8, 0);
    hyla_put_le64(b + len - 8, pl->checksum);
    pl->manifest = b;
    pl->manifest_len = len;
    return HYLA_OK;
}

static hyla_status check_params(const hyla_codec_params *p) {
    if (p->chunk_bytes < 4096 || p->chunk_bytes > (256u << 20))
        return hyla_fail(HYLA_ERR_INVALID_ARG, "codec: chunk_bytes %u outside 4 KiB .. 256 MiB", p->chunk_bytes);
    if (p->zstd_level > ZSTD_maxCLevel() || p->zstd_level < ZSTD_minCLevel())
        return hyla_fail(HYLA_ERR_INVALID_ARG, "codec: zstd level %d outside %d..%d", p->zstd_level, ZSTD_minCLevel(),
                         ZSTD_maxCLevel());
    return HYLA_OK;
}

/* The part of base with the same layer and name as sp (base->parts[hint] first), or NULL. */
static const hyla_manifest_part *base_part(const hyla_manifest *base, const hyla_state_part *sp, uint32_t hint) {
    if (hint < base->n_parts && base->parts[hint].desc.layer == sp->layer &&
        !strncmp(base->parts[hint].desc.name, sp->name, HYLA_PART_NAME_MAX))
        return &base->parts[hint];
    for (uint32_t j = 0; j < base->n_parts; j++)
        if (base->parts[j].desc.layer == sp->layer && !strncmp(base->parts[j].desc.name, sp->name, HYLA_PART_NAME_MAX))
            return &base->parts[j];
    return NULL;
}

/* How many leading chunks of part i (cut with stride/ppc into nch chunks of stored_bytes) can
 * be taken from base: only where the chunk provably holds the same bytes as base's chunk of the
 * same number. The part is stored as it is in memory on both sides (no lossy conversion), the
 * base part has the same kind and dtype and was cut with the same stride and pages per chunk,
 * and the chunk lies wholly inside the shared prefix with the same offset and length as the base
 * chunk: its bytes then equal the base's, and so do its key and hashes. */
static uint32_t reuse_count(const hyla_snapshot *s, const hyla_codec_params *p, const hyla_manifest *base,
                            const uint64_t *shared, uint32_t i, uint64_t stored_bytes, uint64_t stride, uint32_t ppc,
                            uint32_t nch, const hyla_manifest_part **bp_out) {
    *bp_out = NULL;
    if (!base || !shared || !shared[i]) return 0;
    const hyla_state_part *sp = &s->parts[i];
    const hyla_manifest_part *bp = base_part(base, sp, i);
    if (!bp || part_lossy(p, sp) || bp->desc.kind != sp->kind || bp->desc.dtype != sp->dtype ||
        bp->stored_dtype != sp->dtype || bp->chunk_bytes != stride || bp->pages_per_chunk != ppc)
        return 0;
    uint64_t lim = shared[i] < stored_bytes ? shared[i] : stored_bytes;
    uint32_t k = 0;
    for (; k < nch && k < bp->n_chunks; k++) {
        const hyla_chunk_ref *r = &base->chunks[bp->first_chunk + k];
        uint64_t off = (uint64_t)k * stride, left = stored_bytes - off;
        uint64_t len = left < stride ? left : stride;
        if (r->raw_off != off || r->raw_len != len || off + len > lim) break;
    }
    *bp_out = bp;
    return k;
}

/* Stored bytes and stride of part sp under p. */
static void part_layout(const hyla_codec_params *p, const hyla_state_part *sp, uint64_t *stored_bytes, uint64_t *stride,
                        uint32_t *ppc, uint32_t *nch) {
    int lossy = part_lossy(p, sp);
    size_t selem = lossy ? 2 : hyla_dtype_size((hyla_dtype)sp->dtype);
    *stored_bytes = lossy ? sp->nbytes / 2 : sp->nbytes;
    *stride = part_stride(sp, selem, *stored_bytes, p->chunk_bytes, ppc);
    *nch = (uint32_t)((*stored_bytes + *stride - 1) / *stride);
}

hyla_status hyla_codec_plan_reuse(const hyla_snapshot *s, const hyla_codec_params *pin, const hyla_manifest *base,
                                  const uint64_t *shared, uint64_t *filled_from) {
    hyla_codec_params p = pin ? *pin : hyla_codec_default_params();
    HYLA_TRY(check_params(&p));
    HYLA_TRY(hyla_snapshot_require_whole(s, "codec"));
    for (uint32_t i = 0; i < s->n_parts; i++) {
        const hyla_state_part *sp = &s->parts[i];
        filled_from[i] = 0;
        if (!dtype_valid(sp->dtype) || sp->ndim == 0 || sp->ndim > HYLA_PART_MAX_DIMS) continue; /* create refuses */
        uint64_t sb, stride;
        uint32_t ppc, nch;
        part_layout(&p, sp, &sb, &stride, &ppc, &nch);
        const hyla_manifest_part *bp;
        uint32_t k = reuse_count(s, &p, base, shared, i, sb, stride, ppc, nch, &bp);
        uint64_t end = (uint64_t)k * stride;
        filled_from[i] = end < sb ? end : sb; /* reuse only where stored form = memory form */
    }
    return HYLA_OK;
}

hyla_status hyla_codec_plan_create(const hyla_snapshot *s, const hyla_codec_params *pin, hyla_codec_plan **out) {
    return hyla_codec_plan_create_reusing(s, pin, NULL, NULL, out);
}

hyla_status hyla_codec_plan_create_reusing(const hyla_snapshot *s, const hyla_codec_params *pin,
                                           const hyla_manifest *base, const uint64_t *shared, hyla_codec_plan **out) {
    hyla_codec_params p = pin ? *pin : hyla_codec_default_params();
    HYLA_TRY(check_params(&p));
    if (s->format_version != HYLA_SNAPSHOT_FORMAT_VERSION)
        return hyla_fail(HYLA_ERR_UNSUPPORTED, "codec: snapshot format version %u, this build writes %u",
                         s->format_version, HYLA_SNAPSHOT_FORMAT_VERSION);
    HYLA_TRY(hyla_snapshot_require_whole(s, "codec"));
    hyla_codec_plan *pl = calloc(1, sizeof *pl);
    uint64_t *stored_bytes = calloc(s->n_parts + 1, sizeof *stored_bytes);
    uint64_t *stride = calloc(s->n_parts + 1, sizeof *stride);
    uint32_t *ppc = calloc(s->n_parts + 1, sizeof *ppc), *nch = calloc(s->n_parts + 1, sizeof *nch);
    hyla_status st = HYLA_OK;
    if (!pl || !stored_bytes || !stride || !ppc || !nch) {
        st = hyla_fail(HYLA_ERR_NOMEM, "codec plan");
        goto done;
    }
    pl->snap = s;
    pl->params = p;
    size_t total = 0;
    for (uint32_t i = 0; i < s->n_parts; i++) {
        const hyla_state_part *sp = &s->parts[i];
        if (!dtype_valid(sp->dtype) || sp->ndim == 0 || sp->ndim > HYLA_PART_MAX_DIMS) {
            st = hyla_fail(HYLA_ERR_INVALID_ARG, "codec: layer %u part %s: bad dtype %u or ndim %u", sp->layer,
                           sp->name, sp->dtype, sp->ndim);
            goto done;
        }
        part_layout(&p, sp, &stored_bytes[i], &stride[i], &ppc[i], &nch[i]);
        total += nch[i];
    }
    pl->n_chunks = total;
    pl->chunks = calloc(total + 1, sizeof *pl->chunks);
    pl->stored = calloc(s->n_parts + 1, sizeof *pl->stored);
    if (!pl->chunks || !pl->stored) {
        st = hyla_fail(HYLA_ERR_NOMEM, "codec plan: %zu chunks", total);
        goto done;
    }
    size_t ci = 0;
    for (uint32_t i = 0; i < s->n_parts; i++) {
        const hyla_state_part *sp = &s->parts[i];
        if (part_lossy(&p, sp) && sp->nbytes) {
            pl->stored[i] = malloc(stored_bytes[i]);
            if (!pl->stored[i]) {
                st = hyla_fail(HYLA_ERR_NOMEM, "codec: bf16 copy of layer %u part %s", sp->layer, sp->name);
                goto done;
            }
            conv_ctx cc = {pl, i};
            size_t n = sp->nbytes / 4;
            hyla_parallel_for(p.threads, (n + (1u << 20) - 1) >> 20, conv_fn, &cc);
        }
        const hyla_manifest_part *bp;
        uint32_t reuse = reuse_count(s, &p, base, shared, i, stored_bytes[i], stride[i], ppc[i], nch[i], &bp);
        for (uint32_t c = 0; c < nch[i]; c++, ci++) {
            hyla_chunk_ref *r = &pl->chunks[ci].ref;
            if (c < reuse) {
                *r = base->chunks[bp->first_chunk + c];
                pl->chunks[ci].reused = 1;
            }
            r->part = i;
            r->index = c;
            r->raw_off = (uint64_t)c * stride[i];
            uint64_t left = stored_bytes[i] - r->raw_off;
            r->raw_len = (uint32_t)(left < stride[i] ? left : stride[i]);
        }
    }
    hyla_parallel_for(p.threads, total, plan_hash_fn, pl);
    st = plan_manifest(pl, stored_bytes, stride, ppc, nch);
done:
    free(stored_bytes);
    free(stride);
    free(ppc);
    free(nch);
    if (st != HYLA_OK) {
        hyla_codec_plan_destroy(pl);
        return st;
    }
    *out = pl;
    return HYLA_OK;
}

typedef struct {
    uint8_t *buf;
    size_t cap;
    size_t live; /* values pointing into it */
} value_arena;

typedef struct {
    thread_scratch *ts;
    int nts;
    value_arena *arenas;
    uint32_t n_arenas;
} plan_impl;

typedef struct {
    hyla_codec_plan *pl;
    thread_scratch *ts;
    size_t *slot; /* offset of each chunk's value in the arena */
    uint8_t *arena;
    first_error err;
} enc_ctx;

static void enc_fn(void *ctx, size_t i, int tid) {
    enc_ctx *e = ctx;
    hyla_plan_chunk *c = &e->pl->chunks[i];
    if (!c->want || c->value) return;
    const hyla_state_part *sp = &e->pl->snap->parts[c->ref.part];
    if (c->reused) { /* its bytes in the snapshot are not the chunk's: the caller lost the base chunk */
        first_error_set(&e->err, i, HYLA_ERR_INTERNAL, "encoding layer %u part %s chunk %u: the chunk was taken from the "
                        "base version and its bytes are not in the snapshot", sp->layer, sp->name, c->ref.index);
        return;
    }
    size_t selem = part_lossy(&e->pl->params, sp) ? 2 : hyla_dtype_size((hyla_dtype)sp->dtype);
    int is_float = sp->dtype == HYLA_DT_F32 || sp->dtype == HYLA_DT_F16 || sp->dtype == HYLA_DT_BF16;
    char err[512];
    uint8_t *dst = e->arena + e->slot[i];
    if (encode_value(&e->ts[tid], plan_part_bytes(e->pl, c->ref.part) + c->ref.raw_off, c->ref.raw_len,
                     c->ref.raw_hash, selem, is_float, &e->pl->params, dst, &c->value_len, err, sizeof err) != 0)
        first_error_set(&e->err, i, HYLA_ERR_INTERNAL, "encoding layer %u part %s chunk %u: %s", sp->layer, sp->name,
                        c->ref.index, err);
    else
        c->value = dst;
}

hyla_status hyla_codec_plan_encode(hyla_codec_plan *pl) {
    plan_impl *im = pl->impl;
    if (!im) {
        im = pl->impl = calloc(1, sizeof *im);
        if (!im) return hyla_fail(HYLA_ERR_NOMEM, "codec: plan state");
    }
    int w = hyla_parallel_width(pl->params.threads, pl->n_chunks);
    if (im->nts < w) {
        thread_scratch *nt = realloc(im->ts, (size_t)w * sizeof *nt);
        if (!nt) return hyla_fail(HYLA_ERR_NOMEM, "codec: thread scratch");
        memset(nt + im->nts, 0, (size_t)(w - im->nts) * sizeof *nt);
        im->ts = nt;
        im->nts = w;
    }
    size_t *slot = malloc((pl->n_chunks + 1) * sizeof *slot);
    if (!slot) return hyla_fail(HYLA_ERR_NOMEM, "codec: slots");
    size_t need = 0, count = 0;
    for (size_t i = 0; i < pl->n_chunks; i++) {
        hyla_plan_chunk *c = &pl->chunks[i];
        if (!c->want || c->value) continue;
        slot[i] = need;
        need += (value_bound(c->ref.raw_len) + 63) & ~(size_t)63;
        count++;
    }
    if (count == 0) {
        free(slot);
        return HYLA_OK;
    }
    /* an arena with no live value and room enough, else a new one */
    uint32_t a = UINT32_MAX;
    for (uint32_t k = 0; k < im->n_arenas; k++)
        if (im->arenas[k].live == 0 && im->arenas[k].cap >= need) a = k;
    if (a == UINT32_MAX) {
        for (uint32_t k = 0; k < im->n_arenas && a == UINT32_MAX; k++)
            if (im->arenas[k].live == 0) { /* too small: replace */
                free(im->arenas[k].buf);
                im->arenas[k].buf = NULL;
                im->arenas[k].cap = 0;
                a = k;
            }
        if (a == UINT32_MAX) {
            value_arena *na = realloc(im->arenas, (im->n_arenas + 1) * sizeof *na);
            if (!na) {
                free(slot);
                return hyla_fail(HYLA_ERR_NOMEM, "codec: arenas");
            }
            im->arenas = na;
            a = im->n_arenas++;
            im->arenas[a].buf = NULL;
            im->arenas[a].cap = 0;
            im->arenas[a].live = 0;
        }
        im->arenas[a].buf = malloc(need);
        if (!im->arenas[a].buf) {
            free(slot);
            return hyla_fail(HYLA_ERR_NOMEM, "codec: %zu bytes for encoded chunks", need);
        }
        im->arenas[a].cap = need;
    }
    enc_ctx e;
    e.pl = pl;
    e.ts = im->ts;
    e.slot = slot;
    e.arena = im->arenas[a].buf;
    first_error_init(&e.err);
    hyla_parallel_for(pl->params.threads, pl->n_chunks, enc_fn, &e);
    for (size_t i = 0; i < pl->n_chunks; i++) {
        hyla_plan_chunk *c = &pl->chunks[i];
        if (c->value && c->value >= e.arena && c->value < e.arena + need) {
            c->arena = a;
            im->arenas[a].live++;
        }
    }
    free(slot);
    return first_error_finish(&e.err);
}

void hyla_codec_plan_release(hyla_codec_plan *pl, size_t i) {
    plan_impl *im = pl->impl;
    if (!pl->chunks[i].value || !im) return;
    im->arenas[pl->chunks[i].arena].live--;
    pl->chunks[i].value = NULL;
}

void hyla_codec_plan_destroy(hyla_codec_plan *pl) {
    if (!pl) return;
    plan_impl *im = pl->impl;
    if (im) {
        scratch_free(im->ts, im->nts);
        for (uint32_t k = 0; k < im->n_arenas; k++) free(im->arenas[k].buf);
        free(im->arenas);
        free(im);
    }
    free(pl->chunks);
    if (pl->stored && pl->snap)
        for (uint32_t i = 0; i < pl->snap->n_parts; i++) free(pl->stored[i]);
    free(pl->stored);
    free(pl->manifest);
    free(pl);
}

/* ---------------------------------------------------------------- manifest (decode side) */

void hyla_manifest_destroy(hyla_manifest *m) {
    if (!m) return;
    free(m->parts);
    free(m->chunks);
    free(m);
}

void hyla_manifest_keep_kind(hyla_manifest *m, uint32_t kind) {
    uint32_t np = 0;
    size_t nc = 0;
    uint64_t raw = 0;
    for (uint32_t i = 0; i < m->n_parts; i++) {
        hyla_manifest_part mp = m->parts[i];
        if (mp.desc.kind != kind) continue;
        for (uint32_t c = 0; c < mp.n_chunks; c++) { /* chunks lie part by part: nc <= their index */
            hyla_chunk_ref r = m->chunks[mp.first_chunk + c];
            r.part = np;
            m->chunks[nc + c] = r;
        }
        mp.first_chunk = (uint32_t)nc;
        nc += mp.n_chunks;
        raw += mp.desc.nbytes;
        m->parts[np++] = mp;
    }
    m->n_parts = np;
    m->n_chunks = nc;
    m->raw_bytes = raw;
}

static int mul_ok(uint64_t a, uint64_t b, uint64_t *r) {
    if (a && b > UINT64_MAX / a) return 0;
    *r = a * b;
    return 1;
}

hyla_status hyla_manifest_parse(const uint8_t *b, size_t len, const char *what, hyla_manifest **out) {
    if (len < 12 || memcmp(b, MANIFEST_MAGIC, 8) != 0)
        return hyla_fail(HYLA_ERR_FORMAT, "%s: manifest: %s", what,
                         len < 12 ? "truncated value (shorter than its header)" : "bad magic (not a hyla manifest)");
    uint32_t ver = hyla_get_le32(b + 8);
    if (ver != HYLA_SNAPSHOT_FORMAT_VERSION) {
        /* A newer format, or this one with its version field damaged: every format version ends
         * its manifest in the xxh64 of the bytes before it (docs/STATE_FORMAT.md §3), so a value
         * whose last 8 bytes do not match is damaged (DATA_LOSS), not new (FAILED_PRECONDITION) */
        if (len >= 20 && XXH64(b, len - 8, 0) != hyla_get_le64(b + len - 8))
            return hyla_fail(HYLA_ERR_CORRUPT,
                             "%s: manifest checksum mismatch (damaged: its format version field reads %u, this build "
                             "reads version %u, and its closing xxh64 does not match)",
                             what, ver, HYLA_SNAPSHOT_FORMAT_VERSION);
        return hyla_fail(HYLA_ERR_UNSUPPORTED, "%s: unknown snapshot format version %u (this build reads version %u)",
                         what, ver, HYLA_SNAPSHOT_FORMAT_VERSION);
    }
    if (len < MANIFEST_HEADER_BYTES + 8)
        return hyla_fail(HYLA_ERR_CORRUPT, "%s: manifest: truncated value (%zu bytes)", what, len);
    uint32_t n_parts = hyla_get_le32(b + 100);
    uint64_t n_chunks = hyla_get_le64(b + 112);
    uint64_t need = MANIFEST_HEADER_BYTES + 8;
    if (n_parts > (1u << 20) || n_chunks > (1ull << 32) ||
        (need += (uint64_t)n_parts * MANIFEST_PART_BYTES + n_chunks * MANIFEST_CHUNK_BYTES) != len)
        return hyla_fail(HYLA_ERR_CORRUPT, "%s: manifest: %s value: %zu bytes, its header implies %llu", what,
                         len < need ? "truncated" : "malformed", len, (unsigned long long)need);
    uint64_t sum = XXH64(b, len - 8, 0);
    if (sum != hyla_get_le64(b + len - 8))
        return hyla_fail(HYLA_ERR_CORRUPT, "%s: manifest checksum mismatch (xxh64 %016llx, stored %016llx)", what,
                         (unsigned long long)sum, (unsigned long long)hyla_get_le64(b + len - 8));
    hyla_manifest *m = calloc(1, sizeof *m);
    if (!m) return hyla_fail(HYLA_ERR_NOMEM, "manifest");
    m->parts = calloc(n_parts + 1, sizeof *m->parts);
    m->chunks = calloc(n_chunks + 1, sizeof *m->chunks);
    if (!m->parts || !m->chunks) {
        hyla_manifest_destroy(m);
        return hyla_fail(HYLA_ERR_NOMEM, "manifest of %u parts", n_parts);
    }
    hyla_snapshot *s = &m->meta;
    s->format_version = ver;
    s->model_fingerprint = hyla_get_le64(b + 16);
    s->position = hyla_get_le64(b + 24);
    s->n_generated = hyla_get_le64(b + 32);
    s->pending_token = (int32_t)hyla_get_le32(b + 40);
    s->sampler.temperature = get_f32(b + 44);
    s->sampler.top_k = (int32_t)hyla_get_le32(b + 48);
    s->sampler.top_p = get_f32(b + 52);
    s->sampler.seed = hyla_get_le64(b + 56);
    for (int i = 0; i < 4; i++) s->rng[i] = hyla_get_le64(b + 64 + 8 * i);
    s->n_layers = hyla_get_le32(b + 96);
    m->n_parts = n_parts;
    m->n_chunks = n_chunks;
    m->checksum = sum;
    const uint8_t *q = b + MANIFEST_HEADER_BYTES;
    size_t ci = 0;
    uint64_t raw_total = 0;
    hyla_status st = HYLA_OK;
    for (uint32_t i = 0; i < n_parts; i++) {
        hyla_manifest_part *mp = &m->parts[i];
        hyla_state_part *d = &mp->desc;
        d->layer = hyla_get_le32(q);
        memcpy(d->name, q + 4, HYLA_PART_NAME_MAX);
        d->kind = hyla_get_le32(q + 20);
        d->dtype = hyla_get_le32(q + 24);
        mp->stored_dtype = hyla_get_le32(q + 28);
        d->ndim = hyla_get_le32(q + 32);
        for (int k = 0; k < HYLA_PART_MAX_DIMS; k++) d->shape[k] = hyla_get_le64(q + 36 + 8 * k);
        d->page_tokens = hyla_get_le32(q + 68);
        mp->pages_per_chunk = hyla_get_le32(q + 72);
        d->nbytes = hyla_get_le64(q + 76);
        mp->stored_bytes = hyla_get_le64(q + 84);
        mp->chunk_bytes = hyla_get_le64(q + 92);
        mp->n_chunks = hyla_get_le32(q + 100);
        mp->first_chunk = (uint32_t)ci;
        q += MANIFEST_PART_BYTES;
        char name[HYLA_PART_NAME_MAX + 1];
        memcpy(name, d->name, HYLA_PART_NAME_MAX);
        name[HYLA_PART_NAME_MAX] = 0;
        if (d->name[HYLA_PART_NAME_MAX - 1] != 0 || d->ndim == 0 || d->ndim > HYLA_PART_MAX_DIMS ||
            !dtype_valid(d->dtype) || !dtype_valid(mp->stored_dtype) ||
            !(mp->stored_dtype == d->dtype || (d->dtype == HYLA_DT_F32 && mp->stored_dtype == HYLA_DT_BF16))) {
            st = hyla_fail(HYLA_ERR_FORMAT, "%s: layer %u part %s: malformed descriptor (ndim %u, dtype %u, stored %u)",
                           what, d->layer, name, d->ndim, d->dtype, mp->stored_dtype);
            goto fail;
        }
        if (d->kind == HYLA_PART_TOKENS && i + 1 != n_parts) { /* snapshots keep it last (hyla_snapshot.h) */
            st = hyla_fail(HYLA_ERR_FORMAT, "%s: the token log (part %u of %u) must be the last part", what, i, n_parts);
            goto fail;
        }
        uint64_t elems = 1, nb = 0, sb = 0;
        int ok = 1;
        for (uint32_t k = 0; k < d->ndim; k++) ok &= mul_ok(elems, d->shape[k], &elems);
        ok = ok && mul_ok(elems, hyla_dtype_size((hyla_dtype)d->dtype), &nb) &&
             mul_ok(elems, stored_elem(mp->stored_dtype), &sb);
        uint64_t want_chunks = mp->chunk_bytes ? (sb + mp->chunk_bytes - 1) / mp->chunk_bytes : 0;
        if (!ok || nb != d->nbytes || sb != mp->stored_bytes || mp->chunk_bytes == 0 ||
            mp->chunk_bytes % stored_elem(mp->stored_dtype) != 0 || want_chunks != mp->n_chunks ||
            ci + mp->n_chunks > n_chunks) {
            st = hyla_fail(HYLA_ERR_FORMAT,
                           "%s: layer %u part %s: sizes disagree (shape gives %llu bytes, descriptor %llu; %u chunks of "
                           "%llu bytes)",
                           what, d->layer, name, (unsigned long long)nb, (unsigned long long)d->nbytes, mp->n_chunks,
                           (unsigned long long)mp->chunk_bytes);
            goto fail;
        }
        raw_total += d->nbytes;
        for (uint32_t c = 0; c < mp->n_chunks; c++, ci++) {
            hyla_chunk_ref *r = &m->chunks[ci];
            r->part = i;
            r->index = c;
            r->raw_off = (uint64_t)c * mp->chunk_bytes;
            memcpy(r->key, q, HYLA_CHUNK_KEY_BYTES);
            r->raw_len = hyla_get_le32(q + 20);
            r->raw_hash = hyla_get_le64(q + 24);
            q += MANIFEST_CHUNK_BYTES;
            uint64_t left = mp->stored_bytes - r->raw_off;
            uint32_t klen = (uint32_t)r->key[16] << 24 | (uint32_t)r->key[17] << 16 | (uint32_t)r->key[18] << 8 | r->key[19];
            if (r->raw_len != (left < mp->chunk_bytes ? left : mp->chunk_bytes) || klen != r->raw_len) {
                st = hyla_fail(HYLA_ERR_FORMAT, "%s: layer %u part %s chunk %u: length %u does not fit the part", what,
                               d->layer, name, c, r->raw_len);
                goto fail;
            }
        }
    }
    if (ci != n_chunks || raw_total != hyla_get_le64(b + 104)) {
        st = hyla_fail(HYLA_ERR_FORMAT, "%s: manifest: chunk or byte totals disagree", what);
        goto fail;
    }
    m->raw_bytes = raw_total;
    *out = m;
    return HYLA_OK;
fail:
    hyla_manifest_destroy(m);
    return st;
}

hyla_status hyla_manifest_to_snapshot(const hyla_manifest *m, int alloc_data, hyla_snapshot **out) {
    hyla_snapshot *s = hyla_snapshot_create();
    if (!s) return hyla_fail(HYLA_ERR_NOMEM, "snapshot");
    for (uint32_t i = 0; i < m->n_parts; i++) {
        const hyla_state_part *d = &m->parts[i].desc;
        hyla_state_part *p;
        hyla_status st;
        if (alloc_data) {
            st = hyla_snapshot_add_part(s, d->layer, d->name, (hyla_part_kind)d->kind, (hyla_dtype)d->dtype, d->ndim,
                                        d->shape, d->page_tokens, &p);
        } else {
            /* layout only: reuse add_part with a 1-element shape, then patch the descriptor */
            uint64_t one = 1;
            st = hyla_snapshot_add_part(s, d->layer, d->name, (hyla_part_kind)d->kind, (hyla_dtype)d->dtype, 1, &one,
                                        d->page_tokens, &p);
            if (st == HYLA_OK) {
                free(p->data);
                p->data = NULL;
                p->ndim = d->ndim;
                memcpy(p->shape, d->shape, sizeof p->shape);
                p->nbytes = d->nbytes;
            }
        }
        if (st != HYLA_OK) {
            hyla_snapshot_destroy(s);
            return st;
        }
    }
    hyla_state_part *parts = s->parts;
    uint32_t n = s->n_parts, cap = s->cap_parts;
    *s = m->meta;
    s->parts = parts;
    s->n_parts = n;
    s->cap_parts = cap;
    *out = s;
    return HYLA_OK;
}

/* ---------------------------------------------------------------- decode / verify */

typedef struct {
    const hyla_manifest *m;
    hyla_chunk_fetch_fn fetch;
    hyla_chunk_release_fn release;
    void *fctx;
    const char *what;
    hyla_snapshot *out; /* NULL when verifying */
    hyla_chunk_done_fn done; /* streaming decode: told of every chunk verified (may be NULL) */
    void *done_ctx;
    thread_scratch *ts;
    uint8_t **conv;     /* per-thread bf16 / verify buffers */
    first_error err;
    hyla_report_fn report;
    void *report_ctx;
    pthread_mutex_t report_mu;
    double (*tm)[6]; /* HYLA_LOG=debug: per thread: fetch, decode, done seconds, chunks, first start, last end */
    double t0;
} dec_ctx;

static void dec_fn(void *ctx, size_t i, int tid) {
    dec_ctx *d = ctx;
    const hyla_chunk_ref *r = &d->m->chunks[i];
    const hyla_manifest_part *mp = &d->m->parts[r->part];
    char loc[256], err[512];
    const uint8_t *val = NULL;
    size_t len = 0;
    void *tok = NULL;
    double *tm = d->tm ? d->tm[tid] : NULL, ta = tm ? hyla_now() : 0, tb = 0, tc = 0;
    hyla_status st = d->fetch(d->fctx, d->m, i, &val, &len, &tok);
    if (tm) tb = hyla_now();
    if (st != HYLA_OK) {
        loc_text(loc, sizeof loc, d->m, r);
        snprintf(err, sizeof err, "%s", st == HYLA_ERR_NOT_FOUND ? "missing chunk" : hyla_last_error());
    } else {
        uint8_t *dst;
        int direct = d->out && mp->stored_dtype == mp->desc.dtype;
        if (direct)
            dst = (uint8_t *)d->out->parts[r->part].data + r->raw_off;
        else
            dst = d->conv[tid]; /* sized to the largest chunk by run_decode */
        if (!dst) {
            st = HYLA_ERR_NOMEM;
            snprintf(err, sizeof err, "out of memory");
        } else {
            st = decode_value(&d->ts[tid], val, len, r, dst, err, sizeof err);
            if (st == HYLA_OK && d->out && !direct) /* bf16 -> f32 */
                hyla_to_f32((float *)d->out->parts[r->part].data + r->raw_off / 2, dst, HYLA_DT_BF16, r->raw_len / 2);
        }
        if (tm) tc = hyla_now();
        if (st == HYLA_OK && d->done) /* in-memory bytes: f32 parts stored as bf16 take twice the room */
            d->done(d->done_ctx, r->part, direct ? r->raw_off : r->raw_off * 2,
                    direct ? (uint64_t)r->raw_len : (uint64_t)r->raw_len * 2);
        if (d->release) d->release(d->fctx, tok);
        if (st != HYLA_OK) loc_text(loc, sizeof loc, d->m, r);
        if (tm) {
            double te = hyla_now();
            tm[0] += tb - ta, tm[1] += tc - tb, tm[2] += te - tc, tm[3] += 1;
            if (tm[4] == 0) tm[4] = ta - d->t0;
            tm[5] = te - d->t0;
        }
    }
    if (st != HYLA_OK) {
        hyla_status es = st == HYLA_ERR_NOT_FOUND ? HYLA_ERR_NOT_FOUND : st;
        first_error_set(&d->err, i, es, "%s: %s: %s", d->what, loc, err);
        if (d->report) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s: %s: %s", d->what, loc, err);
            pthread_mutex_lock(&d->report_mu);
            d->report(d->report_ctx, msg);
            pthread_mutex_unlock(&d->report_mu);
        }
    }
}

/* Decoders kept between decodes: a decode on fresh zstd contexts and fresh scratch pays for
 * their allocation and for page faults on every byte of scratch, a large part of a restore's
 * time. Up to DEC_KEEP of them (zstd context + shuffle scratch up to DEC_KEEP_SCRATCH bytes)
 * stay for the next decode, on any thread. */
#define DEC_KEEP 64
#define DEC_KEEP_SCRATCH ((size_t)8 << 20)
static pthread_mutex_t dec_keep_mu = PTHREAD_MUTEX_INITIALIZER;
static thread_scratch dec_keep[DEC_KEEP];
static int dec_keep_n;

static void dec_take(thread_scratch *ts, int w) {
    pthread_mutex_lock(&dec_keep_mu);
    for (int t = 0; t < w && dec_keep_n > 0; t++) ts[t] = dec_keep[--dec_keep_n];
    pthread_mutex_unlock(&dec_keep_mu);
}

/* Keep what fits, free the rest (and ts). */
static void dec_give_back(thread_scratch *ts, int w) {
    pthread_mutex_lock(&dec_keep_mu);
    for (int t = 0; t < w; t++) {
        if (dec_keep_n == DEC_KEEP || ts[t].cctx || !ts[t].dctx) continue;
        if (ts[t].scratch_len > DEC_KEEP_SCRATCH) {
            free(ts[t].scratch);
            ts[t].scratch = NULL;
            ts[t].scratch_len = 0;
        }
        dec_keep[dec_keep_n++] = ts[t];
        memset(&ts[t], 0, sizeof ts[t]);
    }
    pthread_mutex_unlock(&dec_keep_mu);
    scratch_free(ts, w);
}

static hyla_status run_decode(dec_ctx *d, int threads) {
    int w = hyla_parallel_width(threads, d->m->n_chunks);
    uint64_t maxc = 0;
    int need_conv = !d->out; /* verifying decodes into them; so do parts stored as bf16 */
    for (uint32_t i = 0; i < d->m->n_parts; i++) {
        if (d->m->parts[i].chunk_bytes > maxc) maxc = d->m->parts[i].chunk_bytes;
        if (d->m->parts[i].stored_dtype != d->m->parts[i].desc.dtype) need_conv = 1;
    }
    d->ts = calloc((size_t)w, sizeof *d->ts);
    d->conv = calloc((size_t)w, sizeof *d->conv);
    if (!d->ts || !d->conv) {
        free(d->ts);
        free(d->conv);
        return hyla_fail(HYLA_ERR_NOMEM, "decode scratch");
    }
    dec_take(d->ts, w);
    /* conversion / verify buffers sized to the largest chunk */
    for (int t = 0; need_conv && t < w; t++) {
        d->conv[t] = malloc(maxc ? maxc : 1);
        if (!d->conv[t]) {
            for (int u = 0; u < t; u++) free(d->conv[u]);
            free(d->conv);
            dec_give_back(d->ts, w);
            return hyla_fail(HYLA_ERR_NOMEM, "decode scratch of %llu bytes", (unsigned long long)maxc);
        }
    }
    first_error_init(&d->err);
    pthread_mutex_init(&d->report_mu, NULL);
    if (hyla_log_get_level() == HYLA_LOG_DEBUG) d->tm = calloc((size_t)w, sizeof *d->tm);
    d->t0 = hyla_now();
    hyla_parallel_for(threads, d->m->n_chunks, dec_fn, d);
    if (d->tm) { /* where a decode's time went, thread by thread */
        const double wall = hyla_now() - d->t0;
        for (int t = 0; t < w; t++)
            HYLA_DEBUG("codec decode %zu chunks in %.3f ms: thread %d: %.0f chunks, fetch %.3f, decode %.3f, done %.3f ms, "
                       "first at %.3f, last end %.3f ms", (size_t)d->m->n_chunks, wall * 1e3, t, d->tm[t][3],
                       d->tm[t][0] * 1e3, d->tm[t][1] * 1e3, d->tm[t][2] * 1e3, d->tm[t][4] * 1e3, d->tm[t][5] * 1e3);
        free(d->tm);
        d->tm = NULL;
    }
    pthread_mutex_destroy(&d->report_mu);
    for (int t = 0; t < w; t++) free(d->conv[t]);
    free(d->conv);
    dec_give_back(d->ts, w);
    return first_error_finish(&d->err);
}

/* A decode of m's chunks, fetched (and released) through the caller's callbacks. */
static dec_ctx dec_ctx_of(const hyla_manifest *m, hyla_chunk_fetch_fn fetch, hyla_chunk_release_fn release, void *ctx,
                          const char *what) {
    dec_ctx d;
    memset(&d, 0, sizeof d);
    d.m = m;
    d.fetch = fetch;
    d.release = release;
    d.fctx = ctx;
    d.what = what;
    return d;
}

hyla_status hyla_codec_decode(const hyla_manifest *m, hyla_chunk_fetch_fn fetch, hyla_chunk_release_fn release,
                              void *ctx, const char *what, int threads, hyla_snapshot **out) {
    hyla_snapshot *s;
    HYLA_TRY(hyla_manifest_to_snapshot(m, 1, &s));
    dec_ctx d = dec_ctx_of(m, fetch, release, ctx, what);
    d.out = s;
    hyla_status st = run_decode(&d, threads);
    if (st != HYLA_OK) {
        hyla_snapshot_destroy(s);
        return st;
    }
    *out = s;
    return HYLA_OK;
}

hyla_status hyla_codec_decode_into(const hyla_manifest *m, hyla_chunk_fetch_fn fetch, hyla_chunk_release_fn release,
                                   void *ctx, const char *what, int threads, hyla_snapshot *dst,
                                   hyla_chunk_done_fn done, void *done_ctx) {
    if (dst->n_parts != m->n_parts)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "%s: decode target has %u parts, the manifest %u", what, dst->n_parts,
                         m->n_parts);
    for (uint32_t i = 0; i < m->n_parts; i++) {
        const hyla_state_part *a = &dst->parts[i], *b = &m->parts[i].desc;
        if (a->nbytes != b->nbytes || a->layer != b->layer || strcmp(a->name, b->name) || (!a->data && a->nbytes))
            return hyla_fail(HYLA_ERR_INVALID_ARG, "%s: decode target part %u (layer %u '%s', %llu bytes) is not the "
                             "manifest's (layer %u '%s', %llu bytes)", what, i, a->layer, a->name,
                             (unsigned long long)a->nbytes, b->layer, b->name, (unsigned long long)b->nbytes);
    }
    dec_ctx d = dec_ctx_of(m, fetch, release, ctx, what);
    d.out = dst;
    d.done = done;
    d.done_ctx = done_ctx;
    return run_decode(&d, threads);
}

hyla_status hyla_codec_verify(const hyla_manifest *m, hyla_chunk_fetch_fn fetch, hyla_chunk_release_fn release,
                              void *ctx, const char *what, int threads, hyla_report_fn report, void *report_ctx) {
    dec_ctx d = dec_ctx_of(m, fetch, release, ctx, what);
    d.report = report;
    d.report_ctx = report_ctx;
    return run_decode(&d, threads);
}

/* ---------------------------------------------------------------- range decode */

typedef struct {
    uint32_t part;     /* in dst */
    size_t chunk;      /* in base */
    uint64_t lo, hi;   /* stored bytes of the part to copy, within the chunk */
} range_task;

typedef struct {
    dec_ctx d; /* the chunks' source (dec_ctx_of) and the target, d.out; d.err */
    const range_task *tasks;
} range_ctx;

static void range_fn(void *ctx, size_t i, int tid) {
    (void)tid;
    const range_task *t = &((range_ctx *)ctx)->tasks[i];
    dec_ctx *d = &((range_ctx *)ctx)->d;
    const hyla_chunk_ref *r = &d->m->chunks[t->chunk];
    const hyla_manifest_part *mp = &d->m->parts[r->part];
    char loc[256], err[512];
    loc_text(loc, sizeof loc, d->m, r);
    const uint8_t *val = NULL;
    size_t len = 0;
    void *tok = NULL;
    hyla_status st = d->fetch(d->fctx, d->m, t->chunk, &val, &len, &tok);
    if (st != HYLA_OK) {
        first_error_set(&d->err, i, st, "%s: %s: %s", d->what, loc,
                        st == HYLA_ERR_NOT_FOUND ? "missing chunk" : hyla_last_error());
        return;
    }
    uint8_t *raw = malloc(r->raw_len ? r->raw_len : 1);
    if (!raw) {
        st = HYLA_ERR_NOMEM;
        snprintf(err, sizeof err, "out of memory");
    } else {
        st = hyla_chunk_decode(val, len, r, raw, err, sizeof err);
    }
    if (d->release) d->release(d->fctx, tok);
    if (st == HYLA_OK) {
        uint8_t *out = d->out->parts[t->part].data;
        const uint8_t *src = raw + (t->lo - r->raw_off);
        if (mp->stored_dtype == mp->desc.dtype)
            memcpy(out + t->lo, src, t->hi - t->lo);
        else /* f32 stored as bf16 */
            hyla_to_f32((float *)out + t->lo / 2, src, HYLA_DT_BF16, (t->hi - t->lo) / 2);
    } else {
        first_error_set(&d->err, i, st, "%s: %s: %s", d->what, loc, err);
    }
    free(raw);
}

hyla_status hyla_codec_decode_range(const hyla_manifest *m, hyla_chunk_fetch_fn fetch, hyla_chunk_release_fn release,
                                    void *ctx, const char *what, int threads, hyla_snapshot *dst, const uint64_t *from,
                                    const uint64_t *to) {
    HYLA_TRY(hyla_snapshot_require_whole(dst, "range decode target"));
    size_t n = 0, cap = 0;
    range_task *tasks = NULL;
    hyla_status st = HYLA_OK;
    for (uint32_t i = 0; i < dst->n_parts && st == HYLA_OK; i++) {
        if (from[i] >= to[i]) continue;
        const hyla_state_part *sp = &dst->parts[i];
        const hyla_manifest_part *mp = base_part(m, sp, i);
        size_t esz = dtype_valid(sp->dtype) ? hyla_dtype_size((hyla_dtype)sp->dtype) : 1;
        if (!mp) {
            st = hyla_fail(HYLA_ERR_NOT_FOUND, "%s: has no layer %u part '%s'", what, sp->layer, sp->name);
        } else if (mp->desc.kind != sp->kind || mp->desc.dtype != sp->dtype) {
            st = hyla_fail(HYLA_ERR_FORMAT, "%s: layer %u part '%s' is kind %u dtype %u, the snapshot's is kind %u dtype %u",
                           what, sp->layer, sp->name, mp->desc.kind, mp->desc.dtype, sp->kind, sp->dtype);
        } else if (mp->desc.nbytes < to[i] || sp->nbytes < to[i]) {
            st = hyla_fail(HYLA_ERR_FORMAT, "%s: layer %u part '%s' has %llu bytes, the snapshot %llu: fewer than the %llu shared",
                           what, sp->layer, sp->name, (unsigned long long)mp->desc.nbytes,
                           (unsigned long long)sp->nbytes, (unsigned long long)to[i]);
        } else if (from[i] % esz || to[i] % esz) {
            st = hyla_fail(HYLA_ERR_INVALID_ARG, "%s: layer %u part '%s': range %llu..%llu is not whole elements", what,
                           sp->layer, sp->name, (unsigned long long)from[i], (unsigned long long)to[i]);
        }
        if (st != HYLA_OK) break;
        /* in-memory bytes -> stored bytes (f32 stored as bf16 takes half) */
        uint64_t ratio = hyla_dtype_size((hyla_dtype)mp->desc.dtype) / stored_elem(mp->stored_dtype);
        uint64_t lo = from[i] / ratio, hi = to[i] / ratio;
        for (uint32_t c = 0; c < mp->n_chunks; c++) {
            const hyla_chunk_ref *r = &m->chunks[mp->first_chunk + c];
            uint64_t a = r->raw_off > lo ? r->raw_off : lo, b = r->raw_off + r->raw_len < hi ? r->raw_off + r->raw_len : hi;
            if (a >= b) continue;
            if (n == cap) {
                cap = cap ? 2 * cap : 16;
                range_task *nt = realloc(tasks, cap * sizeof *nt);
                if (!nt) {
                    st = hyla_fail(HYLA_ERR_NOMEM, "range decode tasks");
                    break;
                }
                tasks = nt;
            }
            tasks[n++] = (range_task){i, (size_t)mp->first_chunk + c, a, b};
        }
    }
    if (st == HYLA_OK && n) {
        range_ctx rc = {dec_ctx_of(m, fetch, release, ctx, what), tasks};
        rc.d.out = dst;
        first_error_init(&rc.d.err);
        hyla_parallel_for(threads, n, range_fn, &rc);
        st = first_error_finish(&rc.d.err);
    }
    free(tasks);
    return st;
}

/* ---------------------------------------------------------------- portable file */

/* File layout (docs/STATE_FORMAT.md §2):
 *   header  32: "HYLASNAP" | u32 file version | u32 header bytes (32) | u64 manifest bytes | u64 chunks
 *   manifest
 *   chunk values, manifest order, each self-delimiting (32-byte header + payload)
 *   trailer 32: "HYLAEND\0" | u64 file bytes | u64 bytes of chunk values |
 *               u64 xxh64(header ++ manifest ++ every value's check field ++ trailer[0..24]) */

static void file_header(uint8_t h[FILE_HEADER_BYTES], size_t manifest_len, size_t n_chunks) {
    memcpy(h, FILE_MAGIC, 8);
    hyla_put_le32(h + 8, HYLA_FILE_VERSION);
    hyla_put_le32(h + 12, FILE_HEADER_BYTES);
    hyla_put_le64(h + 16, manifest_len);
    hyla_put_le64(h + 24, n_chunks);
}

static uint64_t file_check(const uint8_t *hdr, const uint8_t *manifest, size_t mlen, const uint8_t *const *values,
                           size_t n, const uint8_t *trailer) {
    XXH64_state_t st;
    XXH64_reset(&st, 0);
    XXH64_update(&st, hdr, FILE_HEADER_BYTES);
    XXH64_update(&st, manifest, mlen);
    for (size_t i = 0; i < n; i++) XXH64_update(&st, values[i] + 24, 8);
    XXH64_update(&st, trailer, 24);
    return XXH64_digest(&st);
}

static hyla_status encode_plan_for_file(const hyla_snapshot *s, const hyla_codec_params *p, hyla_codec_plan **out,
                                        uint8_t hdr[FILE_HEADER_BYTES], uint8_t tr[FILE_TRAILER_BYTES]) {
    hyla_codec_plan *pl;
    HYLA_TRY(hyla_codec_plan_create(s, p, &pl));
    for (size_t i = 0; i < pl->n_chunks; i++) pl->chunks[i].want = 1;
    hyla_status st = hyla_codec_plan_encode(pl);
    if (st != HYLA_OK) {
        hyla_codec_plan_destroy(pl);
        return st;
    }
    file_header(hdr, pl->manifest_len, pl->n_chunks);
    uint64_t vbytes = 0;
    const uint8_t **vals = malloc((pl->n_chunks + 1) * sizeof *vals);
    if (!vals) {
        hyla_codec_plan_destroy(pl);
        return hyla_fail(HYLA_ERR_NOMEM, "file encode");
    }
    for (size_t i = 0; i < pl->n_chunks; i++) {
        vbytes += pl->chunks[i].value_len;
        vals[i] = pl->chunks[i].value;
    }
    memcpy(tr, TRAILER_MAGIC, 8);
    hyla_put_le64(tr + 8, FILE_HEADER_BYTES + pl->manifest_len + vbytes + FILE_TRAILER_BYTES);
    hyla_put_le64(tr + 16, vbytes);
    hyla_put_le64(tr + 24, file_check(hdr, pl->manifest, pl->manifest_len, vals, pl->n_chunks, tr));
    free(vals);
    *out = pl;
    return HYLA_OK;
}

hyla_status hyla_snapshot_encode_file_bytes(const hyla_snapshot *s, const hyla_codec_params *p, uint8_t **out,
                                            size_t *len) {
    hyla_codec_plan *pl;
    uint8_t hdr[FILE_HEADER_BYTES], tr[FILE_TRAILER_BYTES];
    HYLA_TRY(encode_plan_for_file(s, p, &pl, hdr, tr));
    size_t total = (size_t)hyla_get_le64(tr + 8);
    uint8_t *b = malloc(total);
    if (!b) {
        hyla_codec_plan_destroy(pl);
        return hyla_fail(HYLA_ERR_NOMEM, "file image of %zu bytes", total);
    }
    size_t o = 0;
    memcpy(b, hdr, FILE_HEADER_BYTES);
    o += FILE_HEADER_BYTES;
    memcpy(b + o, pl->manifest, pl->manifest_len);
    o += pl->manifest_len;
    for (size_t i = 0; i < pl->n_chunks; i++) {
        memcpy(b + o, pl->chunks[i].value, pl->chunks[i].value_len);
        o += pl->chunks[i].value_len;
    }
    memcpy(b + o, tr, FILE_TRAILER_BYTES);
    hyla_codec_plan_destroy(pl);
    *out = b;
    *len = total;
    return HYLA_OK;
}

static int write_all(int fd, const void *data, size_t len) {
    const uint8_t *p = data;
    while (len > 0) {
        if (fault_hit(&fault_write_countdown)) {
            errno = ENOSPC;
            return -1;
        }
        size_t n = len > (64u << 20) ? (64u << 20) : len;
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

hyla_status hyla_snapshot_save_file(const char *path, const hyla_snapshot *s, const hyla_codec_params *p) {
    hyla_codec_plan *pl;
    uint8_t hdr[FILE_HEADER_BYTES], tr[FILE_TRAILER_BYTES];
    hyla_status st = encode_plan_for_file(s, p, &pl, hdr, tr);
    if (st != HYLA_OK) return hyla_fail_wrap(st, "saving %s", path);
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        hyla_codec_plan_destroy(pl);
        return hyla_fail(HYLA_ERR_IO, "saving %s: create %s: %s", path, tmp, strerror(errno));
    }
    int bad = write_all(fd, hdr, FILE_HEADER_BYTES) || write_all(fd, pl->manifest, pl->manifest_len);
    for (size_t i = 0; !bad && i < pl->n_chunks; i++) bad = write_all(fd, pl->chunks[i].value, pl->chunks[i].value_len);
    if (!bad) bad = write_all(fd, tr, FILE_TRAILER_BYTES);
    const char *step = "write";
    if (!bad && fsync(fd) != 0) {
        bad = 1;
        step = "fsync";
    }
    int e = errno;
    close(fd);
    hyla_codec_plan_destroy(pl);
    if (bad) {
        unlink(tmp);
        return hyla_fail(HYLA_ERR_IO, "saving %s: %s %s: %s (the previous file, if any, is untouched)", path, step, tmp,
                         strerror(e));
    }
    if (rename(tmp, path) != 0) {
        e = errno;
        unlink(tmp);
        return hyla_fail(HYLA_ERR_IO, "saving %s: rename %s: %s", path, tmp, strerror(e));
    }
    char dirbuf[4096];
    snprintf(dirbuf, sizeof dirbuf, "%s", path);
    int dfd = open(dirname(dirbuf), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        int rc = fsync(dfd);
        e = errno;
        close(dfd);
        if (rc != 0) return hyla_fail(HYLA_ERR_IO, "saving %s: fsync directory: %s", path, strerror(e));
    }
    return HYLA_OK;
}

typedef struct {
    const uint8_t *base;
    size_t *off;  /* [n_chunks] value offsets */
    size_t *len;
} file_fetch_ctx;

static hyla_status file_fetch(void *ctx, const hyla_manifest *m, size_t i, const uint8_t **val, size_t *len,
                              void **tok) {
    (void)m;
    file_fetch_ctx *f = ctx;
    *val = f->base + f->off[i];
    *len = f->len[i];
    *tok = NULL;
    return HYLA_OK;
}

hyla_status hyla_snapshot_decode_file_bytes(const uint8_t *b, size_t len, const char *what, int threads,
                                            hyla_snapshot **out) {
    if (len < 16 || memcmp(b, FILE_MAGIC, 8) != 0)
        return hyla_fail(HYLA_ERR_FORMAT, "%s: not a hyla snapshot file (%s)", what,
                         len < 16 ? "too short" : "bad magic");
    uint32_t fv = hyla_get_le32(b + 8);
    if (fv != HYLA_FILE_VERSION)
        return hyla_fail(HYLA_ERR_UNSUPPORTED, "%s: unknown snapshot file version %u (this build reads version %u)",
                         what, fv, HYLA_FILE_VERSION);
    if (len < FILE_HEADER_BYTES + FILE_TRAILER_BYTES)
        return hyla_fail(HYLA_ERR_CORRUPT, "%s: truncated file (%zu bytes)", what, len);
    if (hyla_get_le32(b + 12) != FILE_HEADER_BYTES)
        return hyla_fail(HYLA_ERR_FORMAT, "%s: header size %u, expected %d", what, hyla_get_le32(b + 12),
                         FILE_HEADER_BYTES);
    uint64_t mlen = hyla_get_le64(b + 16), nch = hyla_get_le64(b + 24);
    if (mlen > len - FILE_HEADER_BYTES)
        return hyla_fail(HYLA_ERR_CORRUPT, "%s: truncated file (%zu bytes; its manifest alone is %llu)", what, len,
                         (unsigned long long)mlen);
    hyla_manifest *m;
    HYLA_TRY(hyla_manifest_parse(b + FILE_HEADER_BYTES, (size_t)mlen, what, &m));
    if (m->n_chunks != nch) {
        size_t mc = m->n_chunks;
        hyla_manifest_destroy(m);
        return hyla_fail(HYLA_ERR_FORMAT, "%s: header names %llu chunks, manifest %zu", what, (unsigned long long)nch, mc);
    }
    file_fetch_ctx f = {b, calloc(nch + 1, sizeof(size_t)), calloc(nch + 1, sizeof(size_t))};
    const uint8_t **vals = calloc(nch + 1, sizeof *vals);
    hyla_status st = HYLA_OK;
    if (!f.off || !f.len || !vals) {
        st = hyla_fail(HYLA_ERR_NOMEM, "%s: chunk index", what);
        goto done;
    }
    size_t o = FILE_HEADER_BYTES + (size_t)mlen;
    size_t end = len - FILE_TRAILER_BYTES;
    for (size_t i = 0; i < nch; i++) {
        char loc[256];
        if (o + HYLA_CHUNK_HEADER_BYTES > end || o + HYLA_CHUNK_HEADER_BYTES + hyla_get_le32(b + o + 12) > end) {
            loc_text(loc, sizeof loc, m, &m->chunks[i]);
            st = hyla_fail(HYLA_ERR_CORRUPT, "%s: %s: truncated value (the file ends inside it; %zu bytes in all)", what,
                           loc, len);
            goto done;
        }
        f.off[i] = o;
        f.len[i] = HYLA_CHUNK_HEADER_BYTES + hyla_get_le32(b + o + 12);
        vals[i] = b + o;
        o += f.len[i];
    }
    const uint8_t *tr = b + end;
    if (o != end || memcmp(tr, TRAILER_MAGIC, 8) != 0 || hyla_get_le64(tr + 8) != len) {
        st = hyla_fail(HYLA_ERR_CORRUPT, "%s: %s (file is %zu bytes, chunks end at %zu)", what,
                       o < end ? "trailing garbage or bad trailer" : "truncated file or bad trailer", len, o);
        goto done;
    }
    uint64_t chk = file_check(b, b + FILE_HEADER_BYTES, (size_t)mlen, vals, nch, tr);
    if (chk != hyla_get_le64(tr + 24)) {
        st = hyla_fail(HYLA_ERR_CORRUPT, "%s: file checksum mismatch (xxh64 %016llx, trailer %016llx)", what,
                       (unsigned long long)chk, (unsigned long long)hyla_get_le64(tr + 24));
        goto done;
    }
    st = hyla_codec_decode(m, file_fetch, NULL, &f, what, threads, out);
done:
    free(f.off);
    free(f.len);
    free(vals);
    hyla_manifest_destroy(m);
    return st;
}

hyla_status hyla_snapshot_load_file(const char *path, hyla_snapshot **out) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return hyla_fail(errno == ENOENT ? HYLA_ERR_NOT_FOUND : HYLA_ERR_IO, "%s: open: %s", path, strerror(errno));
    struct stat stbuf;
    if (fstat(fd, &stbuf) != 0) {
        int e = errno;
        close(fd);
        return hyla_fail(HYLA_ERR_IO, "%s: stat: %s", path, strerror(e));
    }
    size_t len = (size_t)stbuf.st_size;
    if (len == 0) {
        close(fd);
        return hyla_fail(HYLA_ERR_FORMAT, "%s: empty file, not a hyla snapshot", path);
    }
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED) return hyla_fail(HYLA_ERR_IO, "%s: mmap: %s", path, strerror(e));
    madvise(map, len, MADV_WILLNEED);
    char what[4200];
    snprintf(what, sizeof what, "file %s", path);
    hyla_status st = hyla_snapshot_decode_file_bytes(map, len, what, 0, out);
    munmap(map, len);
    return st;
}
