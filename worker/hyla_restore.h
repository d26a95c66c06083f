/* hyla_restore.h — a session restored from a statestore straight onto the runtime's device, with
 * reading, checksums, decompression and the host -> device copies overlapped.
 *
 * hyla_restore_session is hyla_store_get followed by hyla_session_import, done as one pipeline:
 * the store's chunks are decoded on the codec's threads (every checksum verified) into one
 * buffer of the runtime's pinned snapshot buffers (hyla_snapbuf_get: page-locked on CUDA, kept
 * for the next export or restore), and each chunk, once verified, is handed to the device's copy
 * engine (hyla_session_import_ranges) while the next ones are decoded. The refusals are those of
 * both calls (a missing or corrupt chunk, another model's fingerprint, a part that does not fit
 * the model; that last one only after the store's read, which runs while the session is laid
 * out), and no byte reaches the device before its chunk's checksum has been checked; a
 * refused restore leaves no session. The first restore of a given size allocates its pinned
 * buffer (slow: page-locking); later ones reuse it. On a tensor-parallel runtime (which splits
 * the snapshot per rank) it is hyla_store_get + hyla_session_import, not overlapped.
 *
 * Threading: call on the thread that drives rt; it starts one thread for the store's read (which
 * runs the codec's threads) for the duration of the call. */
#ifndef HYLA_RESTORE_H
#define HYLA_RESTORE_H

#include <stdint.h>

#include "hyla_runtime.h"
#include "hyla_session.h"
#include "hyla_status.h"
#include "hyla_store.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    uint64_t bytes;       /* bytes of state (the snapshot's parts) */
    uint64_t ranges;      /* chunks handed to the device */
    uint64_t copy_calls;  /* hyla_session_import_ranges calls (batches of chunks) */
    double seconds_open;  /* manifest read and checked, pinned buffer, session laid out (the
                             store's read already runs while the session is laid out) */
    double seconds_read;  /* the store's read: every chunk fetched, verified, decoded */
    double seconds_total; /* until the session is ready (its copies done) */
    double seconds_tail;  /* from the read's end until the session is ready (the last copies, the
                             import's end) */
} hyla_restore_stats;

/* Restore version (0 = head) of session from st as a new session on rt. version_out and stats
 * may be NULL. *out: caller frees with hyla_session_free. */
hyla_status hyla_restore_session(hyla_runtime *rt, hyla_store *st, const char *session, uint64_t version,
                                 hyla_session **out, uint64_t *version_out, hyla_restore_stats *stats);

#ifdef __cplusplus
}
#endif
#endif
