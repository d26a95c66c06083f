/* hyla_store_rpc.h — the StateStore gRPC service (proto/hyla/v1/statestore.proto) on both
 * sides: the client calls workers use to write and read snapshots, and the server that serves
 * an embedded hyla_store (the coordinator by default, or a separate hyla-statestore).
 *
 * Wire form: a header (session meta + part descriptors) then the parts' bytes in pieces of at
 * most 4 MiB, each with its xxh64 checked on receipt, then commit. A put may name a base
 * version and, per part, a shared prefix (KV pages already stored) that it does not send; the
 * server takes those bytes from the base version. The store's own checksums and content
 * addressing then make the commit cost only the new bytes on disk.
 *
 * Threading: the client functions block and may run on any thread except an rpc loop thread;
 * the server handlers never block a loop thread (puts and gets run on their own threads). */
#ifndef HYLA_STORE_RPC_H
#define HYLA_STORE_RPC_H

#include <stdint.h>

#include "hyla_rpc.h"
#include "hyla_snapshot.h"
#include "hyla_store.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a committed snapshot cost (mirror of hyla.v1.SnapshotInfo). */
typedef struct {
    uint64_t version;
    uint64_t position;
    uint64_t state_bytes;   /* raw bytes of all parts */
    uint64_t stored_bytes;  /* encoded bytes of this version's chunks (shared ones counted) */
    uint64_t written_bytes; /* bytes this put wrote */
    uint32_t chunks;        /* chunks this put wrote */
    int64_t created_unix_ms;
} hyla_snapshot_info;

/* ---- client ---- */

/* Write snap as the next version of session. base (may be NULL) is the snapshot committed as
 * base_version, used only for its part sizes: KV parts send only the bytes beyond the base's
 * (their earlier rows never change). info may be NULL. Returns when durable. */
hyla_status hyla_store_rpc_put(hyla_rpc_client *c, const char *session, uint64_t placement_epoch,
                               const hyla_snapshot *snap, uint64_t base_version, const hyla_snapshot *base,
                               int64_t timeout_ms, hyla_snapshot_info *info);

/* Read version (0 = latest) of session. *out: caller frees with hyla_snapshot_destroy.
 * version_out may be NULL. */
hyla_status hyla_store_rpc_get(hyla_rpc_client *c, const char *session, uint64_t version, int64_t timeout_ms,
                               hyla_snapshot **out, uint64_t *version_out);

/* Delete versions below keep_from_version (0: all) of session. */
hyla_status hyla_store_rpc_delete(hyla_rpc_client *c, const char *session, uint64_t keep_from_version,
                                  int64_t timeout_ms, uint64_t *versions_deleted);

/* Read a GetSnapshotResponse stream (header, then pieces) already opened and half-closed by the
 * caller; `what` names the source in errors. *out: caller frees with hyla_snapshot_destroy. */
hyla_status hyla_store_rpc_recv_snapshot(hyla_rpc_stream *st, const char *what, hyla_snapshot **out,
                                         uint64_t *version_out);
/* Send snap on a server call as a GetSnapshotResponse stream (header, then pieces of <= 4 MiB,
 * <= half the server's message limit and <= max_piece_bytes (the reader's limit from its request;
 * 0 = none), each with its xxh64), waiting while more than a few messages are queued. Does not
 * finish the call. */
hyla_status hyla_store_rpc_send_snapshot(hyla_rpc_call *call, const char *session, const hyla_snapshot *snap,
                                         uint64_t version, uint32_t max_piece_bytes);

/* ---- server ---- */

typedef struct {
    /* Called before a put commits: return HYLA_OK to allow it, else a status (e.g.
     * HYLA_ERR_PERMISSION for a stale placement epoch) whose detail the client sees. May be NULL. */
    hyla_status (*check_put)(void *ud, const char *session, uint64_t placement_epoch);
    /* Called after a put committed (e.g. to update a session directory). May be NULL. */
    void (*on_commit)(void *ud, const char *session, uint64_t placement_epoch, const hyla_snapshot_info *info);
    void *ud;
} hyla_store_rpc_hooks;

/* Register the StateStore methods on srv (before hyla_rpc_server_start), serving st. st and
 * hooks are borrowed and must outlive the server. */
hyla_status hyla_store_rpc_register(hyla_rpc_server *srv, hyla_store *st, const hyla_store_rpc_hooks *hooks);

/* Conversions between snapshots, store statistics and the hyla.v1.SnapshotInfo message
 * (shared by the store service, the workers and the coordinator). */
void hyla_store_rpc_info_from_stats(hyla_snapshot_info *info, const hyla_snapshot *snap,
                                    const hyla_store_put_stats *stats);
struct Hyla__V1__SnapshotInfo;
/* Fill msg (already initialised) from info. No allocation. */
void hyla_store_rpc_info_to_msg(const hyla_snapshot_info *info, struct Hyla__V1__SnapshotInfo *msg);
/* info from msg (NULL msg: all zero). */
void hyla_store_rpc_info_from_msg(hyla_snapshot_info *info, const struct Hyla__V1__SnapshotInfo *msg);

#ifdef __cplusplus
}
#endif
#endif
