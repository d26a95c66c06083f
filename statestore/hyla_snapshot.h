/* hyla_snapshot.h — a session snapshot in memory: session meta plus every layer's state parts.
 *
 * This is the boundary between the model runtime (which exports/imports it, worker/hyla_session.c)
 * and the statestore (which encodes, checksums, compresses and persists it, statestore/). Each
 * mixer declares its parts (kind, dtype, shape); docs/MODELS.md §8 lists them and
 * docs/STATE_FORMAT.md specifies how they are written.
 *
 * Ownership: a snapshot owns its parts' data (host memory). Not thread-safe; one owner (who
 * may hand it to another thread, e.g. an I/O thread that destroys it).
 *
 * Arena snapshots (hyla_snapshot_create_arena): the parts' data is carved from one buffer the
 * caller provides (e.g. pinned host memory the device copies into directly), and a release
 * callback gives the buffer back when the snapshot is destroyed. Everything else (find, equal,
 * the codec, the store) sees an ordinary snapshot. */
#ifndef HYLA_SNAPSHOT_H
#define HYLA_SNAPSHOT_H

#include <stddef.h>
#include <stdint.h>

#include "hyla_status.h"
#include "hyla_util.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HYLA_SNAPSHOT_FORMAT_VERSION 1u
#define HYLA_PART_NAME_MAX 16
#define HYLA_PART_MAX_DIMS 4

typedef enum {
    HYLA_PART_RECURRENT = 1, /* GLA/GDN state per head, short-conv tails */
    HYLA_PART_PARTITION = 2, /* SSE partitions [N][H][dk][dv] */
    HYLA_PART_KV = 3,        /* attention keys or values [tokens][Hk][hd], in pages */
    HYLA_PART_LTE = 4,       /* reserved: laLTE token-eviction cache */
    HYLA_PART_DLA = 5,       /* DLA state cache: states, counts, scores, states in use */
    HYLA_PART_TOKENS = 6,    /* the session's token log (not model state): see below */
} hyla_part_kind;

/* The token log: the session's most recent generated tokens, so that a client can read back what
 * it did not receive (Sessions.ReadTokens, docs/API.md). It travels as one part of kind
 * HYLA_PART_TOKENS named HYLA_TOKEN_LOG_PART on layer HYLA_SNAPSHOT_SESSION_LAYER, dtype I32,
 * shape [n], 1 <= n <= min(n_generated, HYLA_TOKEN_LOG_MAX): the tokens with generated indices
 * n_generated - n .. n_generated - 1, oldest first. Absent (older snapshots, or nothing generated
 * yet): an empty log. It is not model state: hyla_snapshot_check_layout ignores it. */
#define HYLA_TOKEN_LOG_MAX 65536u /* tokens kept: one whole Generate at its max_tokens limit */
#define HYLA_TOKEN_LOG_PART "tokens"
#define HYLA_SNAPSHOT_SESSION_LAYER 0xFFFFFFFFu

const char *hyla_part_kind_name(hyla_part_kind k);

typedef struct {
    uint32_t layer;
    char name[HYLA_PART_NAME_MAX]; /* "S", "Sp", "S0", "conv_q", "k", "v" ... NUL-terminated */
    uint32_t kind;                 /* hyla_part_kind */
    uint32_t dtype;                /* hyla_dtype */
    uint32_t ndim;
    uint64_t shape[HYLA_PART_MAX_DIMS];
    uint32_t page_tokens; /* KV parts: tokens per page (shape[0] = tokens); 0 otherwise */
    uint64_t nbytes;      /* = product(shape) * dtype size */
    uint64_t skip;        /* bytes at the front of the part this snapshot does not hold: 0 for a whole
                             part; an incremental export (a partial snapshot) leaves out KV rows its
                             base version already has. data holds bytes [skip, nbytes) */
    void *data;           /* host memory, owned by the snapshot: byte `skip` of the part */
} hyla_state_part;

/* Sampler settings saved with the session (mirror of hyla_sampling plus the seed). */
typedef struct {
    float temperature;
    int32_t top_k;
    float top_p;
    uint64_t seed;
} hyla_snapshot_sampler;

typedef struct {
    uint32_t format_version;    /* HYLA_SNAPSHOT_FORMAT_VERSION */
    uint64_t model_fingerprint; /* hyla_model_fingerprint() of the model that produced it */
    uint64_t position;          /* tokens consumed by the model (absolute position of the next) */
    uint64_t n_generated;       /* tokens sampled so far in this session */
    int32_t pending_token;      /* sampled but not yet fed to the model; -1 if none */
    hyla_snapshot_sampler sampler;
    uint64_t rng[4];            /* hyla_rng state */
    uint32_t n_layers;
    uint32_t n_parts;
    hyla_state_part *parts;     /* [n_parts], ordered by (layer, declaration order) */
    uint32_t cap_parts;
    struct hyla_snapshot_arena *arena; /* private (hyla_snapshot.c): NULL unless created with
                                          hyla_snapshot_create_arena; never copy it by value */
} hyla_snapshot;

/* Caller frees with hyla_snapshot_destroy. */
hyla_snapshot *hyla_snapshot_create(void);
/* Destroys s, its parts' data and, for an arena snapshot, gives the arena back: release(ctx,
 * base) is called exactly once, on the calling thread. Accepts NULL. */
void hyla_snapshot_destroy(hyla_snapshot *s);

/* Bytes of arena a part of `nbytes` takes: nbytes rounded up to a multiple of 64, at least 64.
 * An arena for parts p1..pn needs the sum of their pieces. */
uint64_t hyla_snapshot_arena_piece(uint64_t nbytes);
typedef void (*hyla_snapshot_release_fn)(void *ctx, void *base);
/* A snapshot whose parts' data is carved, in the order they are added, from the `bytes` of
 * memory at `base` (64-byte aligned; each part starts on a multiple of 64 bytes from base).
 * Parts carved from the arena are NOT zero-filled (the caller overwrites them, e.g. by a device
 * copy); a part that does not fit in the rest of the arena is allocated and zero-filled as in
 * an ordinary snapshot. `base` is borrowed until the snapshot is destroyed, which calls
 * release(release_ctx, base) once (release may be NULL). Returns NULL when out of memory
 * (then release is not called and the buffer stays the caller's). Caller frees with
 * hyla_snapshot_destroy. */
hyla_snapshot *hyla_snapshot_create_arena(void *base, size_t bytes, hyla_snapshot_release_fn release,
                                          void *release_ctx);

/* Append a part with zero-filled data of the given shape (arena snapshots: see above); returns
 * it (borrowed until the snapshot is destroyed or another part is added). The token log stays
 * the last part: a part added after it goes before it. */
hyla_status hyla_snapshot_add_part(hyla_snapshot *s, uint32_t layer, const char *name, hyla_part_kind kind,
                                   hyla_dtype dtype, uint32_t ndim, const uint64_t *shape,
                                   uint32_t page_tokens, hyla_state_part **out);
/* Append a part that holds only its bytes [skip, nbytes) (a partial snapshot's tail, skip <=
 * nbytes); otherwise as hyla_snapshot_add_part. */
hyla_status hyla_snapshot_add_part_tail(hyla_snapshot *s, uint32_t layer, const char *name, hyla_part_kind kind,
                                        hyla_dtype dtype, uint32_t ndim, const uint64_t *shape, uint32_t page_tokens,
                                        uint64_t skip, hyla_state_part **out);
/* A partial snapshot (a part with skip > 0) is only put to a store together with the base
 * version that holds the bytes it leaves out (hyla_store_rpc_put); everything that needs whole
 * parts refuses it: HYLA_OK for a whole snapshot, else HYLA_ERR_INVALID_ARG naming `what` and the
 * first partial part. */
hyla_status hyla_snapshot_require_whole(const hyla_snapshot *s, const char *what);
/* The part (layer, name), or NULL. Borrowed. */
hyla_state_part *hyla_snapshot_find(const hyla_snapshot *s, uint32_t layer, const char *name);
/* Copy src's session metadata (format version, fingerprint, position, generated count, pending
 * token, sampler, RNG, layer count) into dst; parts and arena stay dst's own. */
void hyla_snapshot_copy_meta(hyla_snapshot *dst, const hyla_snapshot *src);
/* Deep copy, always an ordinary (malloc'ed) snapshot, also of an arena snapshot. Caller frees
 * with hyla_snapshot_destroy. */
hyla_status hyla_snapshot_clone(const hyla_snapshot *s, hyla_snapshot **out);
/* Whether two snapshots are identical bit for bit (meta and every part). */
int hyla_snapshot_equal(const hyla_snapshot *a, const hyla_snapshot *b);
/* Add the token log part of n >= 1 tokens; *data (borrowed like the part) receives its [n] int32
 * to fill, oldest first. HYLA_ERR_INVALID_ARG when n > HYLA_TOKEN_LOG_MAX or s has one already. */
hyla_status hyla_snapshot_add_token_log(hyla_snapshot *s, uint32_t n, int32_t **data);
/* The token log of s: *tokens (borrowed until s is destroyed; NULL when *n is 0) and *n. A
 * malformed log part (wrong dtype or shape, more tokens than n_generated or than
 * HYLA_TOKEN_LOG_MAX) is HYLA_ERR_FORMAT naming what is wrong; no part: HYLA_OK with *n = 0. */
hyla_status hyla_snapshot_token_log(const hyla_snapshot *s, const int32_t **tokens, uint32_t *n);
/* Total bytes of the parts (nbytes, whether held or skipped). */
uint64_t hyla_snapshot_bytes(const hyla_snapshot *s);
/* Check that `got` fits the layout of `expected_layout` (e.g. the snapshot a freshly created
 * session of the model exports): the model fingerprint (unless either is 0), then the same parts
 * in the same order with the same layer, name, kind, dtype, ndim, shape and page size. A KV
 * part's token count (shape[0]) may differ; token log parts (HYLA_PART_TOKENS) are skipped. Data is not read (expected_layout's may be NULL).
 * On mismatch returns HYLA_ERR_MISMATCH with a message naming layer, part, and what differs. */
hyla_status hyla_snapshot_check_layout(const hyla_snapshot *got, const hyla_snapshot *expected_layout);

#ifdef __cplusplus
}
#endif
#endif
