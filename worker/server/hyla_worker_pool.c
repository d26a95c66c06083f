/* hyla_worker_pool.c — the session table and its tiers: resident on the device (TIER_GPU), an
 * evicted copy in host memory (TIER_HOST), or only in the store. Durable puts are queued to the
 * I/O thread from here, whether a call asked for them, an auto-snapshot or an eviction.
 *
 * Invariants: a session has at most one pending auto-snapshot export (ws->exp); whatever needs
 * its state at once or frees it ends that export first (finish_export), so its put is queued as
 * a synchronous export would have queued it. put_inflight counts puts not yet answered by the
 * I/O thread; host_bytes is the sum of the host copies' sizes.
 * Threading: scheduler thread only. */
#include <stdlib.h>
#include <string.h>

#include "hyla_worker_impl.h"

wsess *session_find(hyla_worker *w, const char *id) {
    for (wsess *s = w->sessions; s; s = s->next)
        if (!strcmp(s->id, id)) return s;
    return NULL;
}

/* Snapshot layout (parts without data) for incremental puts. */
hyla_snapshot *layout_of(const hyla_snapshot *s) {
    hyla_snapshot *l = hyla_snapshot_create();
    if (!l) return NULL;
    l->parts = calloc(s->n_parts ? s->n_parts : 1, sizeof *l->parts);
    if (!l->parts) {
        free(l);
        return NULL;
    }
    memcpy(l->parts, s->parts, s->n_parts * sizeof *l->parts);
    for (uint32_t i = 0; i < s->n_parts; i++) l->parts[i].data = NULL;
    l->n_parts = l->cap_parts = s->n_parts;
    return l;
}

/* End the session's Append or Generate call at a token boundary, failing it with code: the
 * session keeps exactly what the call delivered (every sampled token was sent; an Append's fed
 * tokens stay, the ones not yet fed are dropped and a last progress message says how many were
 * ingested). The Generate trailer carries the count delivered. */
void end_jobs(hyla_worker *w, wsess *ws, hyla_rpc_code code, const char *why) {
    if (ws->app) {
        append_job *a = ws->app;
        if (ws->s && !a->released) {
            Hyla__V1__AppendProgress pr = HYLA__V1__APPEND_PROGRESS__INIT;
            pr.tokens_received = a->received;
            pr.tokens_ingested = a->ingested;
            pr.total_tokens = a->total_hint;
            pr.position = (uint64_t)hyla_session_position(ws->s);
            hyla_rpc_call_send(a->call, &pr.base);
        }
        append_finish(w, a, code, "session %s: %s after %llu tokens ingested", ws->id, why,
                      (unsigned long long)a->ingested);
    }
    if (ws->gen) {
        char n[32];
        snprintf(n, sizeof n, "%u", ws->gen->delivered);
        hyla_rpc_call_set_trailer(ws->gen->call, HYLA_API_TOKENS_DELIVERED_KEY, n);
        hyla_rpc_call_fail(ws->gen->call, code, "session %s: %s after %u tokens", ws->id, why, ws->gen->delivered);
        free_gen(ws->gen);
        ws->gen = NULL;
    }
}

void drop_session(hyla_worker *w, wsess *ws, const char *why) {
    finish_export(w, ws); /* before the session is freed; its put is queued as it would have been */
    end_jobs(w, ws, HYLA_RPC_UNAVAILABLE, why);
    if (ws->s) {
        hyla_session_free(ws->s);
    }
    if (ws->host) w->host_bytes -= hyla_snapshot_bytes(ws->host);
    hyla_snapshot_destroy(ws->host);
    hyla_snapshot_destroy(ws->layout);
    wsess **pp = &w->sessions;
    while (*pp != ws) pp = &(*pp)->next;
    *pp = ws->next;
    free(ws);
}

/* Make a session resident (restore an evicted host copy). */
hyla_status make_resident(hyla_worker *w, wsess *ws) {
    if (ws->s) return HYLA_OK;
    if (!ws->host) return hyla_fail(HYLA_ERR_UNAVAILABLE, "session %s is not resident on this worker", ws->id);
    HYLA_TRY(hyla_session_import(w->rt, ws->host, &ws->s));
    w->host_bytes -= hyla_snapshot_bytes(ws->host);
    hyla_snapshot_destroy(ws->host);
    ws->host = NULL;
    HYLA_DEBUG("session %s restored from host memory", ws->id);
    return HYLA_OK;
}

uint64_t incremental_base(const hyla_worker *w, const wsess *ws) {
    if (!w->incremental || !ws->s || !ws->snap_version || !ws->layout) return 0;
    uint64_t pos = (uint64_t)hyla_session_position(ws->s);
    return ws->snap_pos <= pos ? ws->snap_pos : 0;
}

hyla_status start_put(hyla_worker *w, wsess *ws, hyla_rpc_call *call, int reply_kind, int unload_after) {
    finish_export(w, ws);
    int lb, le;
    hyla_model_layer_range(w->m, &lb, &le);
    if (lb != 0)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "session %s: snapshots are taken by pipeline stage 0, not this stage", ws->id);
    hyla_snapshot *snap = NULL;
    uint64_t base = incremental_base(w, ws);
    if (ws->s) HYLA_TRY(hyla_session_export_since(ws->s, base, &snap));
    else if (ws->host) HYLA_TRY(hyla_snapshot_clone(ws->host, &snap));
    else return hyla_fail(HYLA_ERR_UNAVAILABLE, "session %s has no state here", ws->id);
    return queue_put(w, ws, snap, ws->s ? base : 0, call, reply_kind, unload_after);
}

/* Queue a durable put of snap (owned; an export since base_pos; for a pipeline, the later
 * stages' parts are gathered first, since the same position). The I/O thread replies to call,
 * if any, when it is committed. The put's base is the session's durable version: the KV rows
 * a partial snapshot leaves out are that version's (incremental_base). */
hyla_status queue_put(hyla_worker *w, wsess *ws, hyla_snapshot *snap, uint64_t base_pos, hyla_rpc_call *call,
                      int reply_kind, int unload_after) {
    if (!holds_all_layers(w)) {
        hyla_status st = gather_downstream(w, ws, snap, base_pos);
        if (st != HYLA_OK) {
            hyla_snapshot_destroy(snap);
            return st;
        }
    }
    io_item *it = calloc(1, sizeof *it);
    HYLA_ASSERT(it);
    it->kind = 1;
    snprintf(it->session, sizeof it->session, "%s", ws->id);
    it->epoch = ws->epoch;
    it->snap = snap;
    it->base_version = ws->snap_version;
    it->base = ws->layout ? layout_of(ws->layout) : NULL;
    it->call = call;
    it->reply_kind = reply_kind;
    it->unload_after = unload_after;
    ws->put_inflight++;
    io_post(w, it);
    return HYLA_OK;
}

/* End ws's pending auto-snapshot export, if any (waits for its copies), and queue its durable
 * put exactly as the synchronous auto-snapshot does. */
void finish_export(hyla_worker *w, wsess *ws) {
    if (!ws->exp) return;
    hyla_snapshot *snap = NULL;
    double t0 = now_s();
    hyla_status st = hyla_session_export_end(ws->exp, &snap);
    ws->exp = NULL;
    HYLA_DEBUG("snapshot of %s: export ended %.1f ms after it began (waited %.1f ms)", ws->id, (now_s() - ws->exp_t0) * 1e3,
               (now_s() - t0) * 1e3);
    if (st == HYLA_OK) st = queue_put(w, ws, snap, ws->exp_base, NULL, 0, 0);
    if (st != HYLA_OK) {
        HYLA_WARN("snapshot of %s: %s (retrying in 2 s)", ws->id, hyla_last_error());
        ws->snap_retry_at = now_s() + 2;
    }
}

void fill_status(hyla_worker *w, const wsess *ws, Hyla__V1__WorkerSessionStatus *st) {
    (void)w;
    hyla__v1__worker_session_status__init(st);
    st->session_id = (char *)ws->id;
    st->tier = ws->s ? HYLA__V1__TIER__TIER_GPU : ws->host ? HYLA__V1__TIER__TIER_HOST : HYLA__V1__TIER__TIER_STORE;
    if (ws->s) {
        st->position = (uint64_t)hyla_session_position(ws->s);
        st->generated = (uint64_t)hyla_session_generated(ws->s);
    } else if (ws->host) {
        st->position = ws->host->position;
        st->generated = ws->host->n_generated;
    }
    st->snapshot_version = ws->snap_version;
    st->placement_epoch = ws->epoch;
    st->busy = ws->app || ws->gen;
}

/* Bytes of state the resident sessions hold now (KV grows with the context, so it is summed
 * afresh rather than tracked). */
uint64_t resident_bytes(const hyla_worker *w) {
    uint64_t n = 0;
    for (const wsess *s = w->sessions; s; s = s->next)
        if (s->s) n += hyla_session_state_bytes(s->s);
    return n;
}

/* Over the state budget, idle sessions leave the device pool for host memory (after a durable
 * put when the store does not already cover their position). Over the host budget, host-tier
 * sessions whose durable snapshot covers them leave this worker altogether: the coordinator
 * re-places them from the store when they are next addressed. Least recently used first. */
void evict_if_needed(hyla_worker *w) {
    while (w->p.state_budget_bytes && resident_bytes(w) > w->p.state_budget_bytes) {
        wsess *victim = NULL;
        for (wsess *s = w->sessions; s; s = s->next)
            if (s->s && !s->app && !s->gen && (!victim || s->last_used < victim->last_used)) victim = s;
        if (!victim) break;
        finish_export(w, victim);
        /* the host copy is an ordinary snapshot (a clone): exported snapshots hold pinned
         * buffers, which are for snapshots on their way to the store */
        hyla_snapshot *snap = NULL, *host = NULL;
        if (hyla_session_export(victim->s, &snap) != HYLA_OK || hyla_snapshot_clone(snap, &host) != HYLA_OK) {
            HYLA_WARN("evicting %s: %s", victim->id, hyla_last_error());
            hyla_snapshot_destroy(snap);
            break;
        }
        if (snap->position != victim->snap_pos || !victim->snap_version) {
            if (queue_put(w, victim, snap, 0, NULL, 0, 0) != HYLA_OK)
                HYLA_WARN("evicting %s: durable snapshot not queued: %s", victim->id, hyla_last_error());
        } else {
            hyla_snapshot_destroy(snap);
        }
        snap = host;
        hyla_session_free(victim->s);
        victim->s = NULL;
        victim->host = snap;
        w->host_bytes += hyla_snapshot_bytes(snap);
        HYLA_INFO("session %s evicted to host memory (state budget %llu bytes)", victim->id,
                  (unsigned long long)w->p.state_budget_bytes);
    }
    while (w->p.host_budget_bytes && w->host_bytes > w->p.host_budget_bytes) {
        wsess *victim = NULL;
        for (wsess *s = w->sessions; s; s = s->next)
            if (s->host && !s->put_inflight && s->snap_version && s->snap_pos == s->host->position && !s->app &&
                !s->gen && (!victim || s->last_used < victim->last_used))
                victim = s;
        if (!victim) break;
        HYLA_INFO("session %s unloaded: host budget %llu bytes; version %llu in the store covers it", victim->id,
                  (unsigned long long)w->p.host_budget_bytes, (unsigned long long)victim->snap_version);
        drop_session(w, victim, "unloaded to the store");
    }
}
