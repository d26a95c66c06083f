/* hyla_worker_stage.c — pipelines: a worker loaded with a layer range is one stage.
 *
 * Stage 0 drives a session; the runtime's downstream callback (stage_downstream) sends each
 * step's hidden states to the next stage over one long-lived StageForward stream and waits for
 * the answer (the logits, when asked). A later stage runs its layers on the rows it receives
 * (do_stage_msg) and, through its own downstream, the rest. Snapshots are whole-model: stage 0
 * gathers the later stages' parts with ExportStage at the snapshot's position.
 * Threading: scheduler thread only (next_stage is read under sum_mu: membership writes it). */
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "hyla_worker_impl.h"

int holds_all_layers(const hyla_worker *w) {
    int b, e;
    hyla_model_layer_range(w->m, &b, &e);
    return b == 0 && e == hyla_model_get_config(w->m)->num_layers;
}

void close_next(hyla_worker *w) {
    hyla_rpc_stream_destroy(w->next_stream);
    w->next_stream = NULL;
    hyla_rpc_client_destroy(w->next_client);
    w->next_client = NULL;
    w->next_open[0] = 0;
}

/* The engine's downstream callback (scheduler thread): send R rows to the next stage over a
 * long-lived StageForward stream and wait for its answer (with the logits when asked). */
hyla_status stage_downstream(void *ud, hyla_session *const *ss, int R, int decode, const float *hidden,
                                    float *logits) {
    hyla_worker *w = ud;
    char addr[256];
    pthread_mutex_lock(&w->sum_mu);
    snprintf(addr, sizeof addr, "%s", w->next_stage);
    pthread_mutex_unlock(&w->sum_mu);
    if (!addr[0]) return hyla_fail(HYLA_ERR_UNAVAILABLE, "this worker holds only part of the model and no next stage is known yet");
    if (w->next_stream && strcmp(addr, w->next_open)) close_next(w);
    hyla_status st = HYLA_OK;
    if (!w->next_stream) {
        hyla_rpc_client_params cp = hyla_rpc_client_default_params();
        cp.max_message_bytes = w->p.max_message_bytes;
        st = hyla_rpc_client_create(addr, &cp, &w->next_client);
        hyla_rpc_call_opts o = {0, NULL, NULL, 1};
        if (st == HYLA_OK)
            st = hyla_rpc_stream_open(w->next_client, SVC "StageForward", &hyla__v1__stage_forward_response__descriptor, &o,
                                      &w->next_stream);
        if (st != HYLA_OK) {
            close_next(w);
            return hyla_fail_wrap(st, "opening StageForward to %s", addr);
        }
        snprintf(w->next_open, sizeof w->next_open, "%s", addr);
    }
    const hyla_model_config *cfg = hyla_model_get_config(w->m);
    int n_items = decode ? R : 1;
    Hyla__V1__StageItem *items = calloc((size_t)n_items, sizeof *items);
    Hyla__V1__StageItem **ip = calloc((size_t)n_items, sizeof *ip);
    HYLA_ASSERT(items && ip);
    for (int i = 0; i < n_items; i++) {
        hyla__v1__stage_item__init(&items[i]);
        wsess *ws = hyla_session_tag(ss[i]);
        items[i].session_id = ws->id;
        items[i].position = (uint64_t)hyla_session_position(ss[i]);
        items[i].n_tokens = decode ? 1 : (uint32_t)R;
        items[i].decode = decode;
        ip[i] = &items[i];
    }
    Hyla__V1__StageForwardRequest rq = HYLA__V1__STAGE_FORWARD_REQUEST__INIT;
    rq.step = ++w->stage_step;
    rq.n_items = (size_t)n_items;
    rq.items = ip;
    rq.dtype = HYLA__V1__DTYPE__DTYPE_F32;
    rq.hidden_size = (uint32_t)cfg->hidden_size;
    rq.hidden.data = (uint8_t *)hidden;
    rq.hidden.len = (size_t)R * cfg->hidden_size * sizeof(float);
    rq.xxh64 = XXH64(hidden, rq.hidden.len, 0);
    rq.want_logits = logits != NULL;
    st = hyla_rpc_stream_write(w->next_stream, &rq.base);
    free(items);
    free(ip);
    ProtobufCMessage *m = NULL;
    if (st == HYLA_OK) st = hyla_rpc_stream_read(w->next_stream, &m);
    if (st == HYLA_OK && !m) st = hyla_fail(HYLA_ERR_UNAVAILABLE, "the next stage (%s) ended the StageForward stream", addr);
    if (st != HYLA_OK) {
        close_next(w);
        return hyla_fail_wrap(st, "StageForward to %s", addr);
    }
    Hyla__V1__StageForwardResponse *r = (Hyla__V1__StageForwardResponse *)m;
    for (size_t i = 0; st == HYLA_OK && i < r->n_results; i++)
        if (r->results[i]->error && *r->results[i]->error)
            st = hyla_fail(HYLA_ERR_UNAVAILABLE, "next stage %s: session %s: %s", addr, r->results[i]->session_id,
                           r->results[i]->error);
    size_t want = (size_t)R * cfg->vocab_size * sizeof(float);
    if (st == HYLA_OK && r->step != rq.step)
        st = hyla_fail(HYLA_ERR_INTERNAL, "next stage %s answered step %llu to step %llu", addr,
                       (unsigned long long)r->step, (unsigned long long)rq.step);
    if (st == HYLA_OK && logits) {
        if (r->logits.len != want)
            st = hyla_fail(HYLA_ERR_FORMAT, "next stage %s returned %zu bytes of logits, expected %zu", addr, r->logits.len, want);
        else
            memcpy(logits, r->logits.data, want);
    }
    protobuf_c_message_free_unpacked(m, NULL);
    return st;
}

static stage_call *find_stage_call(hyla_worker *w, hyla_rpc_call *call) {
    for (stage_call *c = w->stage_calls; c; c = c->next)
        if (c->call == call) return c;
    return NULL;
}

static void unregister_stage_call(hyla_worker *w, stage_call *sc) {
    stage_call **pp = &w->stage_calls;
    while (*pp && *pp != sc) pp = &(*pp)->next;
    if (*pp) *pp = sc->next;
    free(sc);
}

static void stage_release(hyla_worker *w, stage_call *sc, hyla_rpc_code code, const char *msg) {
    if (sc->released) return;
    sc->released = 1;
    if (code == HYLA_RPC_OK) hyla_rpc_call_reply(sc->call, NULL);
    else hyla_rpc_call_fail(sc->call, code, "%s", msg);
    if (sc->done_seen) unregister_stage_call(w, sc);
}

/* The previous stage opened a StageForward call. */
void do_stage_start(hyla_worker *w, cmd *c) {
    stage_call *sc = calloc(1, sizeof *sc);
    HYLA_ASSERT(sc);
    sc->call = c->call;
    sc->next = w->stage_calls;
    w->stage_calls = sc;
}

/* The previous stage half-closed: answer OK. */
void do_stage_end(hyla_worker *w, cmd *c) {
    stage_call *sc = find_stage_call(w, c->call);
    if (sc) stage_release(w, sc, HYLA_RPC_OK, "");
}

/* The call is over (answered, or cancelled by the previous stage). */
void do_stage_done(hyla_worker *w, cmd *c) {
    stage_call *sc = find_stage_call(w, c->call);
    if (sc) {
        sc->done_seen = 1;
        if (sc->released) unregister_stage_call(w, sc);
        else stage_release(w, sc, HYLA_RPC_CANCELLED, "StageForward cancelled");
    }
}

/* One step from the previous stage: run our layers (and, through our own downstream, the rest). */
void do_stage_msg(hyla_worker *w, cmd *c) {
    stage_call *sc = find_stage_call(w, c->call);
    if (!sc || sc->released) return;
    const Hyla__V1__StageForwardRequest *r = (const Hyla__V1__StageForwardRequest *)c->msg;
    const hyla_model_config *cfg = hyla_model_get_config(w->m);
    char err[512] = "";
    size_t rows = 0;
    for (size_t i = 0; i < r->n_items; i++) rows += r->items[i]->n_tokens;
    int decode = r->n_items > 0 && r->items[0]->decode;
    if (!r->n_items || r->dtype != HYLA__V1__DTYPE__DTYPE_F32 || r->hidden_size != (uint32_t)cfg->hidden_size ||
        r->hidden.len != rows * cfg->hidden_size * sizeof(float) || (decode && rows != r->n_items) ||
        (!decode && r->n_items != 1) || rows > 1024)
        snprintf(err, sizeof err, "StageForward: step %llu is malformed (items %zu, rows %zu, hidden %zu bytes)",
                 (unsigned long long)r->step, r->n_items, rows, r->hidden.len);
    else if (XXH64(r->hidden.data, r->hidden.len, 0) != r->xxh64)
        snprintf(err, sizeof err, "StageForward: step %llu: hidden states checksum mismatch", (unsigned long long)r->step);
    if (err[0]) {
        stage_release(w, sc, HYLA_RPC_INVALID_ARGUMENT, err);
        return;
    }
    hyla_session **ss = calloc(r->n_items, sizeof *ss);
    Hyla__V1__StageResult *res = calloc(r->n_items, sizeof *res);
    Hyla__V1__StageResult **rp = calloc(r->n_items, sizeof *rp);
    char (*errs)[256] = calloc(r->n_items, sizeof *errs);
    HYLA_ASSERT(ss && res && rp && errs);
    int bad = 0;
    for (size_t i = 0; i < r->n_items; i++) {
        hyla__v1__stage_result__init(&res[i]);
        res[i].session_id = r->items[i]->session_id;
        res[i].token = -1;
        rp[i] = &res[i];
        wsess *ws = session_find(w, r->items[i]->session_id ? r->items[i]->session_id : "");
        if (!ws || make_resident(w, ws) != HYLA_OK)
            snprintf(errs[i], sizeof errs[i], "session is not loaded on stage worker %s", w->worker_id);
        else if ((uint64_t)hyla_session_position(ws->s) != r->items[i]->position)
            snprintf(errs[i], sizeof errs[i], "position %llu here, %llu at the previous stage",
                     (unsigned long long)hyla_session_position(ws->s), (unsigned long long)r->items[i]->position);
        else {
            ss[i] = ws->s;
            ws->last_used = now_s();
        }
        if (errs[i][0]) {
            res[i].error = errs[i];
            bad = 1;
        }
    }
    float *logits = NULL;
    Hyla__V1__StageForwardResponse resp = HYLA__V1__STAGE_FORWARD_RESPONSE__INIT;
    resp.step = r->step;
    resp.n_results = r->n_items;
    resp.results = rp;
    if (!bad) {
        if (r->want_logits) logits = malloc(rows * cfg->vocab_size * sizeof(float));
        hyla_status st = hyla_stage_forward(ss, (int)rows, decode, (const float *)r->hidden.data, logits);
        if (st != HYLA_OK) {
            char msg[1024];
            snprintf(msg, sizeof msg, "stage worker %s: %s", w->worker_id, hyla_last_error());
            free(logits);
            free(ss), free(res), free(rp), free(errs);
            stage_release(w, sc, hyla_rpc_code_from_status(st), msg);
            return;
        }
        w->tok_window += rows;
        if (logits) {
            resp.logits.data = (uint8_t *)logits;
            resp.logits.len = rows * cfg->vocab_size * sizeof(float);
        }
    }
    if (hyla_rpc_call_send(sc->call, &resp.base) != HYLA_OK) stage_release(w, sc, HYLA_RPC_CANCELLED, "StageForward cancelled");
    free(logits);
    free(ss), free(res), free(rp), free(errs);
}

/* Fetch the parts the later stages hold for ws and append them to snap (scheduler thread). */
hyla_status gather_downstream(hyla_worker *w, const wsess *ws, hyla_snapshot *snap) {
    char addr[256];
    pthread_mutex_lock(&w->sum_mu);
    snprintf(addr, sizeof addr, "%s", w->next_stage);
    pthread_mutex_unlock(&w->sum_mu);
    if (!addr[0]) return hyla_fail(HYLA_ERR_UNAVAILABLE, "session %s: no next pipeline stage known", ws->id);
    hyla_rpc_client *c = NULL;
    hyla_rpc_client_params cp = hyla_rpc_client_default_params();
    cp.max_message_bytes = w->p.max_message_bytes;
    HYLA_TRY(hyla_rpc_client_create(addr, &cp, &c));
    Hyla__V1__ExportStageRequest rq = HYLA__V1__EXPORT_STAGE_REQUEST__INIT;
    rq.session_id = (char *)ws->id;
    rq.max_piece_bytes = (uint32_t)(w->p.max_message_bytes / 2); /* what this stage can receive */
    rq.position = snap->position;
    hyla_rpc_call_opts o = {RPC_TIMEOUT_MS, NULL, NULL, 0};
    hyla_rpc_stream *st = NULL;
    hyla_snapshot *down = NULL;
    hyla_status s = hyla_rpc_stream_open(c, SVC "ExportStage", &hyla__v1__get_snapshot_response__descriptor, &o, &st);
    if (s == HYLA_OK) s = hyla_rpc_stream_write(st, &rq.base);
    if (s == HYLA_OK) s = hyla_rpc_stream_close_send(st);
    char what[512];
    snprintf(what, sizeof what, "ExportStage %s from %s", ws->id, addr);
    if (s == HYLA_OK) s = hyla_store_rpc_recv_snapshot(st, what, &down, NULL);
    if (st) {
        hyla_status fs = hyla_rpc_stream_finish(st, NULL);
        if (s == HYLA_OK) s = fs;
        hyla_rpc_stream_destroy(st);
    }
    hyla_rpc_client_destroy(c);
    for (uint32_t i = 0; s == HYLA_OK && i < down->n_parts; i++) {
        const hyla_state_part *q = &down->parts[i];
        hyla_state_part *np = NULL;
        if (hyla_snapshot_find(snap, q->layer, q->name)) continue;
        s = hyla_snapshot_add_part(snap, q->layer, q->name, (hyla_part_kind)q->kind, (hyla_dtype)q->dtype, q->ndim, q->shape,
                                   q->page_tokens, &np);
        if (s == HYLA_OK) memcpy(np->data, q->data, q->nbytes);
    }
    hyla_snapshot_destroy(down);
    return s;
}

void do_export(hyla_worker *w, cmd *c) {
    const Hyla__V1__ExportStageRequest *r = (const Hyla__V1__ExportStageRequest *)c->msg;
    wsess *ws = lookup_or_fail(w, c->call, r->session_id, "ExportStage");
    if (!ws) return;
    finish_export(w, ws);
    hyla_status st = make_resident(w, ws);
    if (st != HYLA_OK) {
        fail_call(c->call, st, hyla_last_error());
        return;
    }
    if ((uint64_t)hyla_session_position(ws->s) != r->position) {
        hyla_rpc_call_fail(c->call, HYLA_RPC_FAILED_PRECONDITION, "ExportStage %s: position %llu here, %llu at stage 0",
                           ws->id, (unsigned long long)hyla_session_position(ws->s), (unsigned long long)r->position);
        return;
    }
    hyla_snapshot *snap = NULL;
    st = hyla_session_export(ws->s, &snap);
    if (st == HYLA_OK && !holds_all_layers(w)) {
        int lb, le;
        hyla_model_layer_range(w->m, &lb, &le);
        if (le < hyla_model_get_config(w->m)->num_layers) st = gather_downstream(w, ws, snap);
    }
    if (st == HYLA_OK) st = hyla_store_rpc_send_snapshot(c->call, ws->id, snap, 0, r->max_piece_bytes);
    hyla_snapshot_destroy(snap);
    if (st != HYLA_OK) fail_call(c->call, st, hyla_last_error());
    else hyla_rpc_call_reply(c->call, NULL);
}
