/* hyla_store.h — durable, versioned, checksummed session snapshots in RocksDB.
 *
 * A store is a RocksDB directory with two column families: "chunks" (encoded chunk values,
 * content-addressed by XXH3-128 of the raw bytes + length; blob files on, RocksDB compression off)
 * and "meta" (manifests, per-session heads, chunk reference counts). A put writes the chunks the
 * store does not have yet, then the manifest, the head and the reference-count updates in ONE
 * synced WriteBatch: after a crash the head names the previous complete snapshot or the new one.
 * Unchanged chunks (KV pages from earlier versions, forks) are referenced, not rewritten; an
 * incremental put (hyla_store_put_since) references a base version's chunks without reading them.
 * docs/STATE_FORMAT.md §5-9 specifies keys, values, the commit protocol, GC and storage faults.
 *
 * Threading: a hyla_store handle is safe to use from many threads at once. Puts of different
 * sessions encode and write their chunks in parallel; commits (manifest + head + refcounts),
 * forks and deletes serialize on one mutex for a few milliseconds; gets and verifies read a
 * consistent RocksDB snapshot and never block puts. Deleting unreferenced chunks excludes puts
 * briefly (a reader-writer lock). One process at a time may open a directory (RocksDB's LOCK).
 * A writable store runs one background thread (full-disk recovery, space reclaim); a reopen of
 * RocksDB after a full disk waits for the calls in flight.
 *
 * Session ids: 1..255 bytes, no NUL or control characters. Versions count from 1 per session
 * and are never reused while the session exists; version 0 in calls means "the head".
 *
 * Typical use (hyla-run --store DIR --session ID):
 *   hyla_store *st;  HYLA_TRY(hyla_store_open(dir, NULL, &st));
 *   save:    hyla_store_put(st, id, snap, &version, NULL);
 *   restore: hyla_store_get(st, id, 0, model_fingerprint, &snap, NULL);
 *            hyla_snapshot_check_layout(snap, fresh_session_snapshot);   then import it
 *   hyla_store_close(st);
 * (the portable file: hyla_snapshot_save_file / hyla_snapshot_load_file in hyla_codec.h) */
#ifndef HYLA_STORE_H
#define HYLA_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "hyla_codec.h"
#include "hyla_snapshot.h"
#include "hyla_session_id.h"
#include "hyla_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hyla_store hyla_store;

typedef struct {
    hyla_codec_params codec;  /* chunking, zstd level, threads, bf16 option */
    uint32_t keep_versions;   /* versions kept per session (>= 1, default 2); older ones are GC'd at put */
    int create_if_missing;    /* default 1 */
    int sync;                 /* default 1: commits fsync the WAL (a put that returns is durable) */
    int gc_on_open;           /* default 1: delete chunks left unreferenced by a crashed put */
    uint64_t write_buffer_bytes; /* memtable size of the chunks column family (6 of them); default 64 MiB */
    int read_only;            /* default 0: 1 opens without writing anything (inspection tools) */
    uint64_t nowal_bytes;     /* durable puts writing at least this many new raw bytes send chunk values
                                 around the WAL and flush them to blob files before the commit (one
                                 disk write instead of two); smaller puts use the WAL. Default 32 MiB */
    uint64_t reserve_bytes;   /* default 64 MiB: disk space held back in DIR/hyla-reserve. On a full disk
                                 a delete or GC releases it so space can always be freed; puts fail
                                 HYLA_ERR_RESOURCE until it can be re-made, then resume by themselves.
                                 0: no reserve */
    uint32_t reclaim_after_ms; /* default 30000: a background thread returns the disk space of deleted
                                  chunks (flush + compaction) about this long after they were deleted,
                                  and retries a full store; 0: only hyla_store_gc reclaims */
    int mmap_reads;           /* default 0: 1 reads the store's files through mmap (RocksDB's
                                 allow_mmap_reads), which may spare a copy of each chunk out of the
                                 page cache; HYLA_STORE_MMAP_READS=0|1 overrides it at open */
} hyla_store_params;

hyla_store_params hyla_store_default_params(void);

/* Open (or create) the store in dir. *out: caller closes with hyla_store_close.
 * A damaged write-ahead log does not refuse the open: recovery replays it up to the damage,
 * keeps the damaged files in DIR/wal-damaged-TIME/, logs an error and records it (below); a
 * session whose committed version was lost then answers HYLA_ERR_CORRUPT naming it. A store on
 * a full disk opens (reads and deletes work; puts answer HYLA_ERR_RESOURCE until space exists). */
hyla_status hyla_store_open(const char *dir, const hyla_store_params *p, hyla_store **out);
void hyla_store_close(hyla_store *st); /* accepts NULL */

/* What WAL recovery dropped when the store was opened, "" when nothing. Borrowed until close. */
const char *hyla_store_recovery_note(const hyla_store *st);

typedef struct {
    uint64_t version;          /* version number assigned */
    uint64_t raw_bytes;        /* bytes of state in the snapshot */
    uint64_t chunks;           /* chunks referenced by the manifest */
    uint64_t chunks_written;   /* chunks this put had to write (the rest existed) */
    uint64_t raw_bytes_written;/* raw bytes of those chunks */
    uint64_t bytes_written;    /* encoded bytes of those chunks + manifest: what went to RocksDB */
    uint64_t manifest_bytes;
    uint64_t versions_dropped; /* superseded versions removed by this put */
    uint64_t chunks_freed;     /* chunks deleted because no version references them any more */
    double seconds_plan;       /* cutting + hashing */
    double seconds_encode;     /* shuffle + zstd */
    double seconds_write;      /* chunk writes */
    double seconds_commit;     /* synced manifest + head batch */
} hyla_store_put_stats;

/* Persist snap as the next version of session (creating the session). Durable when it
 * returns HYLA_OK (with params.sync). On failure the previous head is intact and readable.
 * HYLA_ERR_RESOURCE: the disk is full (the message names the store and the free space).
 * version and stats may be NULL. snap is borrowed for the call. */
hyla_status hyla_store_put(hyla_store *st, const char *session, const hyla_snapshot *snap, uint64_t *version,
                           hyla_store_put_stats *stats);

/* Incremental put: persist snap as the next version of session, where the first shared[i] bytes
 * of part i (shared: snap->n_parts entries, each at most the part's nbytes) are NOT in snap
 * (their content there is anything) but equal the first shared[i] bytes of the part with the
 * same layer and name of version base_version (>= 1) of the same session — as KV rows of
 * earlier tokens do. The chunks of base_version that lie wholly in those prefixes are referenced
 * without being read or hashed (hyla_codec_plan_create_reusing); only the shared bytes they do
 * not cover are decoded from the base's chunks (hyla_codec_decode_range) into snap; the rest
 * is a put: the committed manifest is byte-identical to hyla_store_put's of the filled snapshot.
 * The store's chunk-deletion lock is held shared from reading the base manifest to the commit,
 * so the base's chunks stay. Cost: O(new bytes), not O(session). All shared[i] 0 (or shared
 * NULL): the same as hyla_store_put.
 * Refusals, naming session, base version, layer and part; the previous head is intact:
 * HYLA_ERR_NOT_FOUND (no such base version, or the base lacks the part), HYLA_ERR_FORMAT (the
 * base part is shorter than shared[i], or of another kind or dtype), HYLA_ERR_CORRUPT (a base
 * chunk is missing or damaged), HYLA_ERR_INVALID_ARG (shared[i] beyond the part, base_version 0).
 * snap is borrowed for the call and written to: bytes of the shared prefixes may be filled in
 * (which bytes is unspecified), nothing else changes; its parts are whole (a partial snapshot,
 * hyla_snapshot_require_whole, is refused INVALID_ARG: the prefix bytes need a place). shared is borrowed for the call. version
 * and stats may be NULL; stats.seconds_plan includes reading the base manifest and decoding
 * from the base; chunks referenced from the base count as existing (not written). */
hyla_status hyla_store_put_since(hyla_store *st, const char *session, hyla_snapshot *snap, uint64_t base_version,
                                 const uint64_t *shared, uint64_t *version, hyla_store_put_stats *stats);

/* Read version (0 = head) of session, verifying every checksum. A version the store committed
 * but no longer has (the head's manifest, or a version above the head) is HYLA_ERR_CORRUPT
 * naming session and version, not NOT_FOUND. expected_fingerprint: refuse
 * (HYLA_ERR_MISMATCH) a snapshot of another model; 0 = do not check. version_out may be NULL.
 * *out: caller frees with hyla_snapshot_destroy. Refusals name session, version, layer, part,
 * chunk. */
hyla_status hyla_store_get(hyla_store *st, const char *session, uint64_t version, uint64_t expected_fingerprint,
                           hyla_snapshot **out, uint64_t *version_out);

/* ---- streaming reads: a get whose chunks land where the caller wants, as they are verified ----
 * open reads and checks the manifest (as hyla_store_get: version 0 = head, the same refusals,
 * expected_fingerprint 0 = not checked) and holds a consistent view of the store until close;
 * the layout (the snapshot's meta and parts, every part's data NULL) tells the caller what to
 * lay out; read_chunks then decodes every chunk into the caller's snapshot on the codec's
 * threads, verifying every checksum, and reports each chunk as it is final (hyla_codec.h,
 * hyla_codec_decode_into: the contract of dst and done). This is how a restore overlaps
 * reading, decompression and the copies to a device (worker/hyla_restore.h).
 * open and close on the same thread (a reader holds the store's lock shared, as every call
 * does for its duration: keep it open only for the read, and call nothing on the store that
 * writes from that thread meanwhile); read_chunks once, from any thread, in between.
 * *out: caller closes with hyla_store_read_close. */
typedef struct hyla_store_reader hyla_store_reader;
hyla_status hyla_store_read_open(hyla_store *st, const char *session, uint64_t version, uint64_t expected_fingerprint,
                                 hyla_store_reader **out);
/* Borrowed until close. */
const hyla_snapshot *hyla_store_read_layout(const hyla_store_reader *r);
uint64_t hyla_store_read_version(const hyla_store_reader *r);
hyla_status hyla_store_read_chunks(hyla_store_reader *r, hyla_snapshot *dst, hyla_chunk_done_fn done, void *done_ctx);
void hyla_store_read_close(hyla_store_reader *r); /* accepts NULL */

/* As hyla_store_get, but the snapshot holds the session meta and only the token log part (if
 * any; hyla_snapshot_token_log reads it): the chunks of the state are not read. */
hyla_status hyla_store_get_token_log(hyla_store *st, const char *session, uint64_t version, hyla_snapshot **out,
                                     uint64_t *version_out);

/* The parsed manifest of version (0 = head) without reading chunks (for `show`).
 * *out: caller frees with hyla_manifest_destroy. */
hyla_status hyla_store_get_manifest(hyla_store *st, const char *session, uint64_t version, hyla_manifest **out,
                                    uint64_t *version_out);

/* Create new_session whose version 1 is src_session's src_version (0 = head), sharing its
 * chunks (no chunk is copied). HYLA_ERR_EXISTS when new_session exists. */
hyla_status hyla_store_fork(hyla_store *st, const char *src_session, uint64_t src_version, const char *new_session);

/* Remove a session and all its versions; chunks no other session references are deleted.
 * Works on a full disk (the reserve is released for it); the space comes back at once then,
 * else within params.reclaim_after_ms. */
hyla_status hyla_store_delete(hyla_store *st, const char *session);

typedef struct {
    char id[HYLA_SESSION_ID_MAX + 1];
    uint64_t head_version;
    uint32_t n_versions;
    uint64_t raw_bytes;          /* of the head */
    uint64_t position;           /* of the head */
    uint64_t model_fingerprint;  /* of the head */
    uint32_t n_parts;            /* of the head */
} hyla_store_session_info;

/* All sessions, sorted by id. *out: caller frees with free(). */
hyla_status hyla_store_list(hyla_store *st, hyla_store_session_info **out, size_t *n);
/* One session's info. HYLA_ERR_NOT_FOUND when absent. */
hyla_status hyla_store_info(hyla_store *st, const char *session, hyla_store_session_info *out);
/* The versions of a session, ascending. *out: caller frees with free(). */
hyla_status hyla_store_versions(hyla_store *st, const char *session, uint64_t **out, size_t *n);

typedef struct {
    uint64_t version;
    int is_head;
    uint64_t position;          /* tokens the session had consumed */
    uint64_t n_generated;
    uint64_t model_fingerprint;
    int64_t time_us;            /* commit time, Unix microseconds; 0: unknown (committed by an older build) */
    uint64_t raw_bytes;         /* bytes of state */
    uint64_t stored_bytes;      /* encoded bytes of its chunks (a chunk shared with other versions counts in each) */
    uint64_t written_bytes;     /* bytes its put wrote: new chunks + manifest (0 for a fork, or unknown) */
} hyla_store_snapshot_info;

/* The versions of a session that the store keeps (the last params.keep_versions; older ones
 * are GC'd at each put), ascending. *out: caller frees with free(). NOT_FOUND: no such session. */
hyla_status hyla_store_snapshots(hyla_store *st, const char *session, hyla_store_snapshot_info **out, size_t *n);

/* Re-read and check every chunk of every version of session (NULL: of all sessions, and also
 * the reference counts and heads of the whole store). report(ctx, msg) is called for every
 * problem (may be NULL). *problems (may be NULL) = their number. Returns HYLA_OK when none. */
hyla_status hyla_store_verify(hyla_store *st, const char *session, hyla_report_fn report, void *ctx,
                              uint64_t *problems);

typedef struct {
    uint64_t chunks_deleted;
    uint64_t bytes_deleted;      /* encoded bytes of the deleted chunks */
} hyla_store_gc_stats;

/* Delete every chunk no version references, then compact so the disk space comes back.
 * stats may be NULL. */
hyla_status hyla_store_gc(hyla_store *st, hyla_store_gc_stats *stats);

typedef struct {
    uint64_t sessions;
    uint64_t versions;
    uint64_t chunks;            /* distinct chunks stored */
    uint64_t chunk_raw_bytes;   /* their raw bytes */
    uint64_t chunk_bytes;       /* their encoded bytes (what they occupy before RocksDB overhead) */
    uint64_t referenced_raw_bytes; /* raw bytes of all versions, counting shared chunks once per version */
    uint64_t disk_bytes;        /* files in the store directory (the reserve file included) */
    uint64_t disk_free_bytes;   /* free space on the store's filesystem */
    uint64_t reserve_bytes;     /* held in the reserve file now (0 while released on a full disk) */
    int full;                   /* 1: puts are refused until space exists */
    uint64_t full_events;       /* RocksDB writes that found the disk full since open */
    /* garbage collection since open: */
    uint64_t gc_runs;           /* completed space-reclaim passes (the background thread's, and after
                                   deletes on a full disk) and hyla_store_gc calls */
    uint64_t gc_chunks_freed;   /* chunks deleted because no version references them any more */
    uint64_t gc_bytes_freed;    /* their encoded bytes: what the reclaim passes give back */
    uint64_t versions_dropped;  /* versions removed by retention (keep_versions) at puts */
} hyla_store_usage_info;

hyla_status hyla_store_usage(hyla_store *st, hyla_store_usage_info *out);

/* Column family names and key prefixes (docs/STATE_FORMAT.md §5), for tools and tests that
 * open the RocksDB directory themselves. */
#define HYLA_STORE_CF_CHUNKS "chunks"
#define HYLA_STORE_CF_META "meta"

#ifdef __cplusplus
}
#endif
#endif
