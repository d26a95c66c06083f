/* hyla_coord_port.c — sessions leave and enter a cluster as portable snapshot files
 * (docs/STATE_FORMAT.md §4, the file `hyla-state export` writes): ExportSession streams a
 * session's file out, ImportSession takes one in as a new session of the caller's tenant.
 *
 * Export. The session is taken for the call (coord_acquire); an active one first commits its
 * current state as a new version (coord_snapshot_now, as Pause does, without pausing it), so the
 * file is current (a paused one still resident has not changed since its Pause: its head is); a named version must be kept (ListSnapshots). The version is read from the
 * embedded store with every checksum verified, encoded as a file in memory, the session is
 * released, and the file goes out in pieces of EXPORT_PIECE bytes, never more than
 * EXPORT_QUEUE pieces queued ahead of gRPC flow control.
 *
 * Import. The pieces are gathered in memory up to params.max_import_bytes (RESOURCE_EXHAUSTED
 * naming the limit beyond). After the client's half-close a job thread decodes the file, which
 * checks everything the store checks (magic, file and format versions, sizes, every chunk and
 * manifest checksum): a damaged file is DATA_LOSS, a file this build cannot read
 * FAILED_PRECONDITION. Its model fingerprint must be one a live worker serves
 * (FAILED_PRECONDITION naming the models served otherwise). Then the session enters the
 * directory (ALREADY_EXISTS for a taken id; the tenant's quotas), the snapshot is committed as
 * its version 1 and the session is placed from it, where the worker checks the state's layout
 * against its model. Any failure after the session entered the directory removes it and its
 * snapshots again: a refused import leaves nothing behind.
 *
 * Threading: Export runs on a job thread (hyla_coord.c). Import's events run on rpc loop threads
 * (memory only: appending pieces); its work runs on one job thread started at the half-close,
 * which alone answers the call from then on. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hyla_coord_impl.h"
#include "hyla_log.h"

#define EXPORT_PIECE (1u << 20) /* bytes of the file per ExportSessionChunk */
#define EXPORT_QUEUE 8          /* pieces queued ahead of flow control before the sender waits */

/* ------------------------------------------------------------------------------------------ */
/* ExportSession                                                                               */

/* The file of session s (held busy): of `version`, or (0) of its current state, committing it
 * first when the session is active. *buf: caller frees with free(). */
static hyla_status export_file(hyla_coord *c, csess *s, uint64_t version, uint8_t **buf, size_t *len,
                               uint64_t *version_out, uint64_t *position) {
    if (version) {
        HYLA_TRY(coord_check_kept_version(c, s->id, version));
    } else {
        pthread_mutex_lock(&c->mu);
        /* paused and still resident: no call ran since its Pause, so the head is current */
        int active = s->state == HYLA__V1__SESSION_STATE__SESSION_ACTIVE && !s->paused;
        version = s->snap.version;
        pthread_mutex_unlock(&c->mu);
        if (active) {
            Hyla__V1__SnapshotInfo si = HYLA__V1__SNAPSHOT_INFO__INIT;
            hyla_status st = coord_snapshot_now(c, s, &si);
            if (st != HYLA_OK)
                return hyla_fail_wrap(st, "export of session %s: committing its current state", s->id);
            version = si.version;
        }
        if (!version)
            return hyla_fail(HYLA_ERR_NOT_FOUND, "export of session %s: it has no committed snapshot yet", s->id);
    }
    hyla_snapshot *snap = NULL;
    uint64_t got = 0;
    hyla_status st = hyla_store_get(c->store, s->id, version, 0, &snap, &got);
    if (st != HYLA_OK)
        return hyla_fail_wrap(st, "export of session %s version %llu", s->id, (unsigned long long)version);
    hyla_codec_params cp = hyla_codec_default_params();
    st = hyla_snapshot_encode_file_bytes(snap, &cp, buf, len);
    *position = snap->position;
    hyla_snapshot_destroy(snap);
    if (st != HYLA_OK)
        return hyla_fail_wrap(st, "export of session %s version %llu: encoding the file", s->id,
                              (unsigned long long)version);
    *version_out = got;
    return HYLA_OK;
}

void coord_do_export(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant) {
    const Hyla__V1__ExportSessionRequest *q = (const Hyla__V1__ExportSessionRequest *)m;
    hyla_status st = coord_check_session_id(q->session_id);
    if (st == HYLA_OK && !c->store)
        st = hyla_fail(HYLA_ERR_UNSUPPORTED, "ExportSession needs the coordinator's embedded store "
                                             "(this one uses the store at %s)", c->store_addr);
    csess *s = NULL;
    if (st == HYLA_OK)
        st = coord_acquire(c, q->session_id, tenant, &s);
    if (st != HYLA_OK) {
        coord_answer_error(call, st);
        return;
    }
    uint8_t *buf = NULL;
    size_t len = 0;
    uint64_t version = 0, position = 0;
    char model[ID_MAX];
    pthread_mutex_lock(&c->mu);
    coord_copy_str(model, sizeof model, s->model);
    pthread_mutex_unlock(&c->mu);
    st = export_file(c, s, q->version, &buf, &len, &version, &position);
    coord_release(c, s);
    if (st != HYLA_OK) {
        coord_answer_error(call, st);
        return;
    }
    size_t off = 0;
    int first = 1;
    while (st == HYLA_OK && (first || off < len)) {
        while (hyla_rpc_call_queued(call) >= EXPORT_QUEUE && !hyla_rpc_call_cancelled(call))
            usleep(1000);
        Hyla__V1__ExportSessionChunk k = HYLA__V1__EXPORT_SESSION_CHUNK__INIT;
        size_t n = len - off < EXPORT_PIECE ? len - off : EXPORT_PIECE;
        k.data.data = buf + off;
        k.data.len = n;
        if (first) {
            k.version = version;
            k.total_bytes = len;
            k.position = position;
            k.model = model;
        }
        st = hyla_rpc_call_send(call, &k.base);
        off += n;
        first = 0;
    }
    free(buf);
    if (st != HYLA_OK) {
        coord_answer_error(call, hyla_fail_wrap(st, "export of session %s", q->session_id));
        return;
    }
    HYLA_INFO("coordinator: session %s version %llu exported (%zu bytes)", q->session_id,
              (unsigned long long)version, len);
    hyla_rpc_call_reply(call, NULL);
}

/* ------------------------------------------------------------------------------------------ */
/* ImportSession                                                                               */

typedef struct {
    hyla_coord *c;
    hyla_rpc_call *call;
    char tenant[ID_MAX], id[SID_MAX], hint[ID_MAX];
    uint8_t *buf;
    size_t len, cap;
    int seen_first;
    pthread_mutex_t mu;
    int answered;    /* the handler failed the call */
    int job_started; /* the job answers the call */
} import_ctx;

static void import_ctx_free(void *p) {
    import_ctx *x = p;
    pthread_mutex_destroy(&x->mu);
    free(x->buf);
    free(x);
}

/* Fail the call from an event handler unless it was answered already. */
static void import_fail(import_ctx *x, hyla_status st) {
    pthread_mutex_lock(&x->mu);
    int skip = x->answered || x->job_started;
    x->answered = 1;
    pthread_mutex_unlock(&x->mu);
    if (!skip)
        coord_answer_error(x->call, st);
}

/* The id the import may take: valid, not in the directory and (with store) not in the store: a
 * leftover of a session the directory no longer knows. The store check reads RocksDB: not on a
 * loop thread. c->mu not held. */
static hyla_status import_check_id(hyla_coord *c, const char *id, int store) {
    HYLA_TRY(hyla_session_id_check(id, "field session_id"));
    pthread_mutex_lock(&c->mu);
    int taken = coord_sess_find(c, id) != NULL;
    pthread_mutex_unlock(&c->mu);
    if (taken)
        return hyla_fail(HYLA_ERR_EXISTS, "session %s already exists; import under another id", id);
    hyla_store_session_info si;
    if (store && hyla_store_info(c->store, id, &si) == HYLA_OK)
        return hyla_fail(HYLA_ERR_EXISTS,
                         "the store already holds %u snapshot version(s) under id %s, which no session "
                         "of the directory owns (hyla-state rm removes them); import under another id",
                         si.n_versions, id);
    return HYLA_OK;
}

/* The model a live worker serves whose fingerprint is fp, into model (ID_MAX bytes). */
static hyla_status import_model(hyla_coord *c, uint64_t fp, char *model) {
    char served[768] = "";
    int found = 0, any = 0;
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < c->n_workers; i++) {
        const cworker *w = c->workers[i];
        if (!coord_worker_alive(w))
            continue;
        any = 1;
        if (w->fingerprint == fp && !found) {
            coord_copy_str(model, ID_MAX, w->model);
            found = 1;
        }
        char one[ID_MAX + 32];
        snprintf(one, sizeof one, "%s (%016llx)", w->model, (unsigned long long)w->fingerprint);
        if (!strstr(served, one)) {
            size_t l = strlen(served);
            snprintf(served + l, sizeof served - l, "%s%s", l ? ", " : "", one);
        }
    }
    pthread_mutex_unlock(&c->mu);
    if (found)
        return HYLA_OK;
    if (!any)
        return hyla_fail(HYLA_ERR_UNAVAILABLE,
                         "no live worker serves any model, so the file's model (fingerprint %016llx) "
                         "cannot be checked; retry when workers are up",
                         (unsigned long long)fp);
    return hyla_fail(HYLA_ERR_MISMATCH,
                     "the file is a snapshot of another model (fingerprint %016llx); this cluster "
                     "serves %s",
                     (unsigned long long)fp, served);
}

/* Take the session out again after a failed import step (s is held busy; its snapshots too). */
static void import_undo(hyla_coord *c, csess *s, int stored) {
    char id[SID_MAX];
    coord_copy_str(id, sizeof id, s->id);
    if (stored && hyla_store_delete(c->store, id) != HYLA_OK)
        HYLA_WARN("coordinator: import of %s failed; removing its snapshots failed too: %s", id, hyla_last_error());
    pthread_mutex_lock(&c->mu);
    if (hyla_coord_dir_delete(c->dir, id) != HYLA_OK)
        HYLA_WARN("coordinator: import of %s failed; removing its directory entry failed too", id);
    coord_sess_drop_new_locked(c, s);
    pthread_mutex_unlock(&c->mu);
}

/* Decode, check and commit the file of x; place the new session. Answers nothing. *out: the
 * session, held busy (coord_release), on success. */
static hyla_status import_run(hyla_coord *c, import_ctx *x, csess **out) {
    *out = NULL;
    hyla_snapshot *snap = NULL;
    hyla_status st = hyla_snapshot_decode_file_bytes(x->buf, x->len, "the snapshot file", 0, &snap);
    free(x->buf);
    x->buf = NULL;
    if (st != HYLA_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", hyla_last_error());
        if (st == HYLA_ERR_FORMAT || st == HYLA_ERR_CORRUPT) /* damage: DATA_LOSS, whatever the byte */
            return hyla_fail(HYLA_ERR_CORRUPT, "%s; nothing was imported", msg);
        if (st == HYLA_ERR_UNSUPPORTED) /* a sound file this build cannot read */
            return hyla_fail(HYLA_ERR_MISMATCH, "%s; nothing was imported", msg);
        return hyla_fail(st, "%s; nothing was imported", msg);
    }
    char model[ID_MAX];
    st = import_model(c, snap->model_fingerprint, model);
    if (st == HYLA_OK && x->id[0])
        st = import_check_id(c, x->id, 1);
    if (st != HYLA_OK) {
        hyla_snapshot_destroy(snap);
        return st;
    }

    csess *s = coord_sess_new();
    pthread_mutex_lock(&c->mu);
    if (x->id[0] && coord_sess_find(c, x->id))
        st = hyla_fail(HYLA_ERR_EXISTS, "session %s already exists; import under another id", x->id);
    if (st == HYLA_OK)
        st = coord_quota_new_session_locked(c, x->tenant);
    if (st != HYLA_OK) {
        pthread_mutex_unlock(&c->mu);
        free(s);
        hyla_snapshot_destroy(snap);
        return st;
    }
    if (x->id[0])
        coord_copy_str(s->id, sizeof s->id, x->id);
    else
        coord_new_session_id_locked(c, s->id);
    coord_copy_str(s->tenant, sizeof s->tenant, x->tenant);
    coord_copy_str(s->model, sizeof s->model, model);
    s->temperature = snap->sampler.temperature;
    s->top_k = snap->sampler.top_k;
    s->top_p = snap->sampler.top_p;
    s->seed = snap->sampler.seed;
    s->position = snap->position;
    s->generated = snap->n_generated;
    coord_sess_insert_new_locked(c, s);
    pthread_mutex_unlock(&c->mu);

    uint64_t version = 0;
    st = hyla_store_put(c->store, s->id, snap, &version, NULL);
    uint64_t position = snap->position;
    hyla_snapshot_destroy(snap);
    if (st != HYLA_OK) {
        st = hyla_fail_wrap(st, "storing session %s", s->id);
        import_undo(c, s, 0);
        return st;
    }
    hyla_store_snapshot_info *info = NULL;
    size_t n = 0;
    hyla_status ist = hyla_store_snapshots(c->store, s->id, &info, &n);
    pthread_mutex_lock(&c->mu);
    s->snap.version = version;
    s->snap.position = position;
    if (ist == HYLA_OK && n > 0) {
        s->snap.state_bytes = info[n - 1].raw_bytes;
        s->snap.stored_bytes = info[n - 1].stored_bytes;
        s->snap.created_unix_ms = info[n - 1].time_us / 1000;
    }
    pthread_mutex_unlock(&c->mu);
    free(info);
    st = coord_place(c, s, x->hint[0] ? x->hint : NULL, NULL, version);
    if (st != HYLA_OK) {
        st = hyla_fail_wrap(st, "placing imported session %s", s->id);
        import_undo(c, s, 1);
        return st;
    }
    *out = s;
    return HYLA_OK;
}

static void *import_main(void *arg) {
    import_ctx *x = arg;
    hyla_coord *c = x->c;
    hyla_rpc_call *call = x->call;
    csess *s = NULL;
    size_t len = x->len;
    hyla_status st = import_run(c, x, &s);
    if (st != HYLA_OK) {
        coord_answer_error(call, st); /* x may be freed from here on */
    } else {
        HYLA_INFO("coordinator: tenant %s imported session %s (model %s, %zu bytes, position %llu)", s->tenant, s->id,
                  s->model, len, (unsigned long long)s->position);
        sess_view *v = coord_view_of(c, s);
        coord_release(c, s);
        hyla_rpc_call_reply(call, &v->s.base);
        free(v);
    }
    coord_job_done(c);
    return NULL;
}

void coord_h_import(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *msg, void *ud) {
    binding *b = ud;
    hyla_coord *c = b->c;
    import_ctx *x = hyla_rpc_call_user(call);
    switch (ev) {
    case HYLA_RPC_EV_START: {
        char tenant[ID_MAX];
        if (!coord_get_tenant(call, tenant))
            return;
        if (!c->store) {
            coord_answer_error(call, hyla_fail(HYLA_ERR_UNSUPPORTED, "ImportSession needs the coordinator's embedded "
                                                                     "store (this one uses the store at %s)",
                                               c->store_addr));
            return;
        }
        x = calloc(1, sizeof *x);
        HYLA_ASSERT(x);
        x->c = c;
        x->call = call;
        pthread_mutex_init(&x->mu, NULL);
        coord_copy_str(x->tenant, sizeof x->tenant, tenant);
        hyla_rpc_call_set_user(call, x, import_ctx_free);
        return;
    }
    case HYLA_RPC_EV_MESSAGE: {
        if (!x || x->answered)
            return;
        const Hyla__V1__ImportSessionRequest *q = (const Hyla__V1__ImportSessionRequest *)msg;
        const char *id = q->session_id ? q->session_id : "";
        if (!x->seen_first) {
            x->seen_first = 1;
            hyla_status st = HYLA_OK;
            if (id[0])
                st = import_check_id(c, id, 0);
            if (st == HYLA_OK && q->worker_hint && strlen(q->worker_hint) >= ID_MAX)
                st = hyla_fail(HYLA_ERR_INVALID_ARG, "field worker_hint: at most %d bytes", ID_MAX - 1);
            if (st == HYLA_OK) {
                pthread_mutex_lock(&c->mu);
                st = coord_quota_new_session_locked(c, x->tenant);
                pthread_mutex_unlock(&c->mu);
            }
            if (st != HYLA_OK) {
                import_fail(x, st);
                return;
            }
            coord_copy_str(x->id, sizeof x->id, id);
            coord_copy_str(x->hint, sizeof x->hint, q->worker_hint ? q->worker_hint : "");
        } else if (id[0] && strcmp(id, x->id) != 0) {
            import_fail(x, hyla_fail(HYLA_ERR_INVALID_ARG, "a later message names another session "
                                                           "(%s, the first named '%s')",
                                     id, x->id));
            return;
        }
        size_t n = q->data.len;
        if ((uint64_t)x->len + n > c->p.max_import_bytes) {
            import_fail(x, hyla_fail(HYLA_ERR_RESOURCE,
                                     "the file is larger than this coordinator's limit of %llu bytes "
                                     "(--max-import-bytes)",
                                     (unsigned long long)c->p.max_import_bytes));
            free(x->buf);
            x->buf = NULL;
            x->len = x->cap = 0;
            return;
        }
        if (x->len + n > x->cap) {
            size_t cap = x->cap ? x->cap : 1u << 20;
            while (cap < x->len + n)
                cap *= 2;
            uint8_t *nb = realloc(x->buf, cap);
            if (!nb) {
                import_fail(x, hyla_fail(HYLA_ERR_NOMEM, "out of memory holding %zu bytes of the file",
                                         x->len + n));
                return;
            }
            x->buf = nb;
            x->cap = cap;
        }
        if (n)
            memcpy(x->buf + x->len, q->data.data, n);
        x->len += n;
        return;
    }
    case HYLA_RPC_EV_HALF_CLOSE: {
        if (!x || x->answered)
            return;
        if (!x->len) {
            import_fail(x, hyla_fail(HYLA_ERR_INVALID_ARG, "the stream ended without any byte of a file"));
            return;
        }
        pthread_mutex_lock(&x->mu);
        x->job_started = 1;
        pthread_mutex_unlock(&x->mu);
        if (coord_spawn(c, import_main, x) != 0) {
            pthread_mutex_lock(&x->mu);
            x->job_started = 0;
            pthread_mutex_unlock(&x->mu);
            import_fail(x, hyla_fail(HYLA_ERR_RESOURCE, "coordinator: cannot start a thread for the call"));
        }
        return;
    }
    case HYLA_RPC_EV_DONE:
        if (x) /* unless answered or the job answers: nobody else will */
            import_fail(x, hyla_fail(HYLA_ERR_CANCELLED, "cancelled"));
        return;
    }
}
