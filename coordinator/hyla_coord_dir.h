/* hyla_coord_dir.h — the coordinator's session directory on disk: one RocksDB database
 * (DIR/directory) holding a record per session and the epoch counter, so a coordinator restart
 * loses no session.
 *
 * Record format (value of key "s/<session id>"), little-endian:
 *   "HYLD" | u32 format version (1) | u64 placement epoch | packed hyla.v1.Session
 * Key "m/epoch": u64, the last epoch handed out (placement and worker epochs share it).
 * Readers refuse a record with another magic or version, naming what they found.
 *
 * Ownership: the directory owns its RocksDB handle; records passed in are borrowed for the call.
 * Threading: RocksDB is thread-safe; this module adds no state, callers serialize writes of one
 * session (the coordinator does all writes under its lock). */
#ifndef HYLA_COORD_DIR_H
#define HYLA_COORD_DIR_H

#include <stdint.h>

#include "hyla/v1/common.pb-c.h"
#include "hyla_status.h"
#include "hyla_store.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HYLA_COORD_DIR_MAGIC "HYLD"
#define HYLA_COORD_DIR_VERSION 1u

typedef struct hyla_coord_dir hyla_coord_dir;

/* Open (creating it if missing) the directory database at path. Caller frees with
 * hyla_coord_dir_close. */
hyla_status hyla_coord_dir_open(const char *path, hyla_coord_dir **out);
void hyla_coord_dir_close(hyla_coord_dir *d); /* accepts NULL */

/* Write the record of s (keyed by s->session_id) with its placement epoch, and the epoch counter
 * (when counter != 0), in one WriteBatch. sync: fsync the WAL before returning (placement
 * changes); without it the write survives a process crash but maybe not a power loss. */
hyla_status hyla_coord_dir_put(hyla_coord_dir *d, const Hyla__V1__Session *s, uint64_t epoch, uint64_t counter,
                               int sync);
/* Remove a session's record (synced). Removing an absent record is not an error. */
hyla_status hyla_coord_dir_delete(hyla_coord_dir *d, const char *session_id);

/* Store the epoch counter alone (synced). */
hyla_status hyla_coord_dir_set_counter(hyla_coord_dir *d, uint64_t counter);
/* The stored epoch counter (0 when never set). */
hyla_status hyla_coord_dir_get_counter(hyla_coord_dir *d, uint64_t *counter);

/* Called for every record in session-id order; s is borrowed until return. A non-OK status
 * stops the scan and is returned. */
typedef hyla_status (*hyla_coord_dir_fn)(void *ud, const Hyla__V1__Session *s, uint64_t epoch);
/* Read every record. A record that does not parse fails the scan with HYLA_ERR_FORMAT naming
 * its key and what was wrong (a coordinator must not start on a directory it misreads). */
hyla_status hyla_coord_dir_scan(hyla_coord_dir *d, hyla_coord_dir_fn fn, void *ud);

/* After the store's recovery dropped writes (hyla_store_recovery_note): log, as an error, every
 * session whose recorded snapshot version the store no longer has; *lost (may be NULL) = their
 * number. Such sessions answer DATA_LOSS when placed. store is borrowed for the call. */
hyla_status hyla_coord_dir_check_store(hyla_coord_dir *d, hyla_store *store, uint64_t *lost);

#ifdef __cplusplus
}
#endif
#endif
