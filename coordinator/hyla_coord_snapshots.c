/* hyla_coord_snapshots.c — committed snapshots: a worker reports each durable snapshot
 * (ReportSnapshot), or the embedded store tells the coordinator as it commits one; the directory
 * then records the newest version, which is where a session resumes after a failure.
 *
 * The embedded store also asks before each put whether the writer's placement epoch is current
 * (coord_store_check_put): a stale owner (the session was re-placed meanwhile) cannot overwrite
 * the state of the current one.
 * Threading: rpc loop threads (ReportSnapshot inline) and the store service's threads; all under
 * c->mu. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_coord_impl.h"
#include "hyla_log.h"

/* A committed snapshot (from ReportSnapshot or the embedded store's commit hook). Returns
 * whether it is stale. c->mu held. */
int coord_note_snapshot_locked(hyla_coord *c, const char *sid, uint64_t placement_epoch,
                               const Hyla__V1__SnapshotInfo *si) {
    csess *s = coord_sess_find(c, sid);
    if (!s)
        return 1;
    if (placement_epoch && placement_epoch < s->epoch)
        return 1;
    if (si && si->version > s->snap.version) {
        s->snap = *si;
        s->snap.base.unknown_fields = NULL;
        s->snap.base.n_unknown_fields = 0;
        if (si->position > s->position)
            s->position = si->position;
        coord_persist_locked(c, s, 0, 0);
    }
    return 0;
}

void coord_do_report_snapshot(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant) {
    (void)tenant;
    const Hyla__V1__ReportSnapshotRequest *q = (const Hyla__V1__ReportSnapshotRequest *)m;
    hyla_status st = coord_check_session_id(q->session_id);
    if (st != HYLA_OK) {
        coord_answer_error(call, st);
        return;
    }
    pthread_mutex_lock(&c->mu);
    int known = coord_sess_find(c, q->session_id) != NULL;
    int stale = coord_note_snapshot_locked(c, q->session_id, q->placement_epoch, q->snapshot);
    pthread_mutex_unlock(&c->mu);
    if (!known) {
        coord_answer_error(call, hyla_fail(HYLA_ERR_NOT_FOUND, "session %s not found", q->session_id));
        return;
    }
    Hyla__V1__ReportSnapshotResponse r = HYLA__V1__REPORT_SNAPSHOT_RESPONSE__INIT;
    r.stale = stale;
    hyla_rpc_call_reply(call, &r.base);
}

hyla_status coord_store_check_put(void *ud, const char *session, uint64_t placement_epoch) {
    hyla_coord *c = ud;
    pthread_mutex_lock(&c->mu);
    csess *s = coord_sess_find(c, session);
    hyla_status st = HYLA_OK;
    if (!s)
        st = hyla_fail(HYLA_ERR_NOT_FOUND, "session %s is not in the directory", session);
    else if (placement_epoch < s->epoch)
        st = hyla_fail(HYLA_ERR_PERMISSION, "session %s: placement epoch %llu is stale (current %llu)", session,
                       (unsigned long long)placement_epoch, (unsigned long long)s->epoch);
    pthread_mutex_unlock(&c->mu);
    return st;
}

void coord_store_on_commit(void *ud, const char *session, uint64_t placement_epoch, const hyla_snapshot_info *info) {
    hyla_coord *c = ud;
    Hyla__V1__SnapshotInfo si = HYLA__V1__SNAPSHOT_INFO__INIT;
    hyla_store_rpc_info_to_msg(info, &si);
    pthread_mutex_lock(&c->mu);
    coord_note_snapshot_locked(c, session, placement_epoch, &si);
    pthread_mutex_unlock(&c->mu);
    coord_metrics_on_commit(c, info);
}

/* ------------------------------------------------------------------------------------------ */
