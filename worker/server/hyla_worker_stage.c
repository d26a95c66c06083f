/* hyla_worker_stage.c — pipelines: a worker loaded with a layer range is one stage.
 *
 * Stage 0 drives a session; the runtime's downstream (stage_downstream_ops) posts each step's
 * hidden states (a decode step in micro-batches: one message per group) to the next stage over
 * one long-lived StageForward stream without waiting, and stage_finish reads the answers (the
 * logits, when asked) in order when the runtime needs them (next_wait: the steps awaited). A
 * later stage runs its layers on the rows it receives (do_stage_msg) and, through its own
 * downstream, the rest. Snapshots are whole-model: stage 0 gathers the later stages' parts with
 * ExportStage at the snapshot's position.
 * NCCL: when this stage and the next run on different GPUs of one host (CUDA builds with NCCL;
 * HYLA_STAGE_NCCL=0 turns it off), the first message of a new StageForward stream is a handshake
 * offering an NCCL link; once accepted, each group's hidden rows travel over the link on the
 * backends' streams (stage_post_dev), and the logits of a whole step once after its last group,
 * while the stream keeps carrying the step, the items and the per-item results. Within a step
 * both sides queue every row transfer before the one logits transfer, so the two streams never
 * wait on each other; the next stage posts its transfers even when an item fails, so the link
 * stays paired; a broken stream aborts the link on both sides. The bytes are those the gRPC path
 * sends, so tokens are the same bits.
 * Threading: scheduler thread only (next_stage is read under sum_mu: membership writes it). */
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "hyla_worker_impl.h"
#ifdef HYLA_HAVE_CUDA
#include "hyla_cuda_extra.h"
#endif

#define NCCL_OPEN_TIMEOUT_MS 30000

int holds_all_layers(const hyla_worker *w) {
    int b, e;
    hyla_model_layer_range(w->m, &b, &e);
    return b == 0 && e == hyla_model_get_config(w->m)->num_layers;
}

/* Whether this worker may use NCCL links at all. */
static int nccl_wanted(const hyla_worker *w) {
#ifdef HYLA_HAVE_CUDA
    const char *e = getenv("HYLA_STAGE_NCCL");
    if (e && !strcmp(e, "0")) return 0;
    return hyla_cuda_nccl_built() && w->be->ops->name && !strcmp(w->be->ops->name, "cuda");
#else
    (void)w;
    return 0;
#endif
}

static void close_link(struct hyla_nccl_link **l) {
#ifdef HYLA_HAVE_CUDA
    hyla_cuda_nccl_close(*l);
#endif
    *l = NULL;
}

void close_next(hyla_worker *w) {
    close_link(&w->next_nccl);
    hyla_rpc_stream_destroy(w->next_stream);
    w->next_stream = NULL;
    hyla_rpc_client_destroy(w->next_client);
    w->next_client = NULL;
    w->next_open[0] = 0;
    w->n_next_wait = 0; /* their answers went with the stream */
}

/* Offer the next stage an NCCL link over the just-opened stream and join it when accepted. A
 * refusal or a failure leaves the stream on gRPC (a failed join closes the stream: the caller
 * opens a plain one). */
static hyla_status offer_link(hyla_worker *w, const char *addr) {
#ifdef HYLA_HAVE_CUDA
    Hyla__V1__StageForwardRequest rq = HYLA__V1__STAGE_FORWARD_REQUEST__INIT;
    uint8_t id[HYLA_NCCL_ID_BYTES];
    char host[256], dev[64];
    if (hyla_cuda_nccl_peer_key(w->be, host, sizeof host, dev, sizeof dev) != HYLA_OK || hyla_cuda_nccl_id(id) != HYLA_OK) {
        HYLA_WARN("no NCCL link to the next stage %s (%s): stages talk over gRPC", addr, hyla_last_error());
        snprintf(w->nccl_refused, sizeof w->nccl_refused, "%s", addr);
        return HYLA_OK;
    }
    rq.step = ++w->stage_step;
    rq.nccl_id.data = id;
    rq.nccl_id.len = sizeof id;
    rq.nccl_host = host;
    rq.nccl_device = dev;
    hyla_status st = hyla_rpc_stream_write(w->next_stream, &rq.base);
    ProtobufCMessage *m = NULL;
    if (st == HYLA_OK) st = hyla_rpc_stream_read(w->next_stream, &m);
    if (st == HYLA_OK && !m) st = hyla_fail(HYLA_ERR_UNAVAILABLE, "the next stage (%s) ended the StageForward stream", addr);
    if (st != HYLA_OK) return hyla_fail_wrap(st, "NCCL handshake with %s", addr);
    int accepted = ((Hyla__V1__StageForwardResponse *)m)->nccl_accepted;
    protobuf_c_message_free_unpacked(m, NULL);
    if (!accepted) {
        HYLA_INFO("the next stage %s declined an NCCL link: stages talk over gRPC", addr);
        snprintf(w->nccl_refused, sizeof w->nccl_refused, "%s", addr);
        return HYLA_OK;
    }
    st = hyla_cuda_nccl_open(w->be, id, 2, 0, NCCL_OPEN_TIMEOUT_MS, &w->next_nccl);
    if (st != HYLA_OK) {
        snprintf(w->nccl_refused, sizeof w->nccl_refused, "%s", addr);
        return hyla_fail_wrap(st, "joining the NCCL link to %s", addr);
    }
    HYLA_INFO("NCCL link to the next stage %s (GPU %s): hidden states travel over NCCL", addr, dev);
    return HYLA_OK;
#else
    (void)w, (void)addr;
    return HYLA_OK;
#endif
}

/* The StageForward stream to the next stage, opened (with an NCCL link when one can be had)
 * unless it is already open to the current address. */
static hyla_status ensure_next(hyla_worker *w, char *addr, size_t addr_len) {
    pthread_mutex_lock(&w->sum_mu);
    snprintf(addr, addr_len, "%s", w->next_stage);
    pthread_mutex_unlock(&w->sum_mu);
    if (!addr[0]) return hyla_fail(HYLA_ERR_UNAVAILABLE, "this worker holds only part of the model and no next stage is known yet");
    if (w->next_stream && strcmp(addr, w->next_open)) close_next(w);
    if (w->next_stream) return HYLA_OK;
    hyla_status st = HYLA_OK;
    for (int attempt = 0; attempt < 2 && !w->next_stream; attempt++) {
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
        if (nccl_wanted(w) && strcmp(w->nccl_refused, addr) && (st = offer_link(w, addr)) != HYLA_OK) {
            HYLA_WARN("%s: stages talk over gRPC", hyla_last_error());
            close_next(w); /* the stream may hold a half-done handshake: start a plain one */
        }
    }
    return w->next_stream ? HYLA_OK : hyla_fail_wrap(st, "opening StageForward to %s", addr);
}

/* A StageForward request of the next posted group: its items (prefill: one item of R rows;
 * decode: R items), the micro-batch fields (only for a step of several groups, so a whole step's
 * message is the one an older stage sends) and the fields both transports send (F32 rows of
 * hidden_size). *items_out, *ip_out: caller frees both with free() once rq is written. */
static void stage_request(hyla_worker *w, const hyla_downstream_step *s, Hyla__V1__StageForwardRequest *rq,
                          Hyla__V1__StageItem **items_out, Hyla__V1__StageItem ***ip_out) {
    int n_items = s->decode ? s->R : 1;
    Hyla__V1__StageItem *items = calloc((size_t)n_items, sizeof *items);
    Hyla__V1__StageItem **ip = calloc((size_t)n_items, sizeof *ip);
    HYLA_ASSERT(items && ip);
    for (int i = 0; i < n_items; i++) {
        hyla__v1__stage_item__init(&items[i]);
        wsess *ws = hyla_session_tag(s->ss[i]);
        items[i].session_id = ws->id;
        items[i].position = (uint64_t)hyla_session_position(s->ss[i]);
        items[i].n_tokens = s->decode ? 1 : (uint32_t)s->R;
        items[i].decode = s->decode;
        ip[i] = &items[i];
    }
    *items_out = items;
    *ip_out = ip;
    hyla__v1__stage_forward_request__init(rq);
    rq->step = ++w->stage_step;
    rq->n_items = (size_t)n_items;
    rq->items = ip;
    rq->dtype = HYLA__V1__DTYPE__DTYPE_F32;
    rq->hidden_size = (uint32_t)hyla_model_get_config(w->m)->hidden_size;
    rq->want_logits = s->want_logits;
    if (s->groups > 1) {
        rq->group = (uint32_t)s->group;
        rq->groups = (uint32_t)s->groups;
        rq->row_offset = (uint32_t)s->row_offset;
        rq->total_rows = (uint32_t)s->total_rows;
    }
}

/* Read the answer to step `step`: per-item errors become a failure. Frees the message. */
static hyla_status read_answer(hyla_worker *w, const char *addr, uint64_t step, Hyla__V1__StageForwardResponse **out) {
    *out = NULL;
    ProtobufCMessage *m = NULL;
    hyla_status st = hyla_rpc_stream_read(w->next_stream, &m);
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
    if (st == HYLA_OK && r->step != step)
        st = hyla_fail(HYLA_ERR_INTERNAL, "next stage %s answered step %llu to step %llu", addr,
                       (unsigned long long)r->step, (unsigned long long)step);
    *out = r;
    return st;
}

/* Remember a posted step whose answer a later stage_finish reads. */
static hyla_status await_answer(hyla_worker *w, uint64_t step, int rows, float *logits, int aside) {
    int cap = (int)(sizeof w->next_wait / sizeof w->next_wait[0]);
    if (w->n_next_wait == cap) return hyla_fail(HYLA_ERR_INTERNAL, "more than %d StageForward steps in flight", cap);
    w->next_wait[w->n_next_wait].step = step;
    w->next_wait[w->n_next_wait].rows = rows;
    w->next_wait[w->n_next_wait].logits = logits;
    w->next_wait[w->n_next_wait].aside = aside;
    w->n_next_wait++;
    return HYLA_OK;
}

/* The runtime's device post (scheduler thread): over an NCCL link when the next stage accepted
 * one, else *handled = 0 and stage_post takes the step. Per group: the control message, then
 * the rows over the link; after the last group of a step that wants logits, one receive of
 * the whole step's logits. The next stage posts its side in the same order (all rows first,
 * then the logits), so the two streams never wait on each other. */
static hyla_status stage_post_dev(void *ud, const hyla_downstream_step *s, int *handled) {
    hyla_worker *w = ud;
    *handled = 0;
    if (!nccl_wanted(w)) return HYLA_OK;
    char addr[256];
    HYLA_TRY(ensure_next(w, addr, sizeof addr));
    if (!w->next_nccl) return HYLA_OK;
    *handled = 1;
#ifdef HYLA_HAVE_CUDA
    const hyla_model_config *cfg = hyla_model_get_config(w->m);
    Hyla__V1__StageItem *items, **ip;
    Hyla__V1__StageForwardRequest rq;
    stage_request(w, s, &rq, &items, &ip);
    rq.hidden_over_nccl = 1;
    /* the control message first: the next stage posts its receive when the message arrives, and
     * NCCL does not queue a send (a non-blocking communicator answers "in progress", the first
     * time while the pair connects) before the peer's receive is posted */
    hyla_status st = hyla_rpc_stream_write(w->next_stream, &rq.base);
    free(items);
    free(ip);
    if (st == HYLA_OK)
        st = hyla_cuda_nccl_send(w->be, w->next_nccl, s->hidden, (size_t)s->R * cfg->hidden_size * sizeof(float), 1);
    int aside = -1;
    size_t lbytes = (size_t)s->total_rows * cfg->vocab_size * sizeof(float);
    if (st == HYLA_OK && s->logits && s->logits_aside)
        st = hyla_cuda_nccl_recv_aside(w->be, w->next_nccl, s->logits, lbytes, 1, &aside);
    else if (st == HYLA_OK && s->logits)
        st = hyla_cuda_nccl_recv(w->be, w->next_nccl, s->logits, lbytes, 1);
    if (st == HYLA_OK) st = await_answer(w, rq.step, s->R, NULL, aside);
    if (st != HYLA_OK) {
        close_next(w); /* the link may be out of step */
        return hyla_fail_wrap(st, "StageForward over NCCL to %s", addr);
    }
    return HYLA_OK;
#else
    (void)s;
    return hyla_fail(HYLA_ERR_INTERNAL, "an NCCL link in a build without CUDA");
#endif
}

/* The runtime's host post (scheduler thread): one message of the group's rows on the
 * long-lived StageForward stream; its answer (with the logits when asked) is read by
 * stage_finish. */
static hyla_status stage_post(void *ud, const hyla_downstream_step *s) {
    hyla_worker *w = ud;
    char addr[256];
    HYLA_TRY(ensure_next(w, addr, sizeof addr));
    const hyla_model_config *cfg = hyla_model_get_config(w->m);
    Hyla__V1__StageItem *items, **ip;
    Hyla__V1__StageForwardRequest rq;
    stage_request(w, s, &rq, &items, &ip);
    rq.hidden.data = (uint8_t *)s->hidden;
    rq.hidden.len = (size_t)s->R * cfg->hidden_size * sizeof(float);
    rq.xxh64 = XXH64(s->hidden, rq.hidden.len, 0);
    hyla_status st = hyla_rpc_stream_write(w->next_stream, &rq.base);
    free(items);
    free(ip);
    if (st == HYLA_OK) st = await_answer(w, rq.step, s->R, s->logits, -1);
    if (st != HYLA_OK) {
        close_next(w);
        return hyla_fail_wrap(st, "StageForward to %s", addr);
    }
    return HYLA_OK;
}

/* The runtime's finish (scheduler thread): read the answers of posted steps, oldest first,
 * until `keep` remain. The first failure is returned after the other answers due have been read
 * (the stream stays in step); a broken stream, or any failure over an NCCL link (logits may be
 * half-received), closes the stream and drops what was awaited. */
static hyla_status stage_finish(void *ud, int keep) {
    hyla_worker *w = ud;
    const hyla_model_config *cfg = hyla_model_get_config(w->m);
    char addr[256], first[1024] = "";
    snprintf(addr, sizeof addr, "%s", w->next_open);
    hyla_status err = HYLA_OK;
    while (w->n_next_wait > keep && w->next_stream) {
        uint64_t step = w->next_wait[0].step;
        int rows = w->next_wait[0].rows;
        float *logits = w->next_wait[0].logits;
        int aside = w->next_wait[0].aside;
        memmove(&w->next_wait[0], &w->next_wait[1], (size_t)(w->n_next_wait - 1) * sizeof w->next_wait[0]);
        w->n_next_wait--;
        Hyla__V1__StageForwardResponse *r = NULL;
        hyla_status st = read_answer(w, addr, step, &r);
        size_t want = (size_t)rows * cfg->vocab_size * sizeof(float);
        if (st == HYLA_OK && logits) {
            if (r->logits.len != want)
                st = hyla_fail(HYLA_ERR_FORMAT, "next stage %s returned %zu bytes of logits, expected %zu", addr,
                               r->logits.len, want);
            else
                memcpy(logits, r->logits.data, want);
        }
        if (r) protobuf_c_message_free_unpacked(&r->base, NULL);
#ifdef HYLA_HAVE_CUDA
        /* the logits received beside the compute stream: what reads them next waits for them */
        if (st == HYLA_OK && aside >= 0 && w->next_nccl) st = hyla_cuda_nccl_join(w->be, w->next_nccl, aside);
#endif
        if (st != HYLA_OK && err == HYLA_OK) {
            err = st;
            snprintf(first, sizeof first, "%s", hyla_last_error());
        }
        if (st != HYLA_OK && w->next_nccl) close_next(w);
    }
    if (!w->next_stream) w->n_next_wait = 0;
    return err == HYLA_OK ? HYLA_OK : hyla_fail(err, "%s", first);
}

/* The runtime's sampling of a lane whose logits came over the link, on the link's side stream. */
static hyla_status stage_sample_aside(void *ud, const float *logits, int B, int V, const hyla_sampling *sp,
                                      const float *u, int32_t *out) {
    hyla_worker *w = ud;
#ifdef HYLA_HAVE_CUDA
    if (!w->next_nccl) return hyla_fail(HYLA_ERR_UNAVAILABLE, "the NCCL link to the next stage is closed");
    return hyla_cuda_nccl_sample_aside(w->be, w->next_nccl, logits, B, V, sp, u, out);
#else
    (void)w, (void)logits, (void)B, (void)V, (void)sp, (void)u, (void)out;
    return hyla_fail(HYLA_ERR_INTERNAL, "an NCCL link in a build without CUDA");
#endif
}

const hyla_downstream_ops stage_downstream_ops = {stage_post, stage_post_dev, stage_finish, stage_sample_aside};

static stage_call *find_stage_call(hyla_worker *w, hyla_rpc_call *call) {
    for (stage_call *c = w->stage_calls; c; c = c->next)
        if (c->call == call) return c;
    return NULL;
}

static void held_free(stage_held *h) {
    for (size_t i = 0; i < h->n; i++) {
        free(h->ids[i]);
        free(h->errs[i]);
    }
    free(h->ids);
    free(h->errs);
    free(h->logits);
    memset(h, 0, sizeof *h);
}

static void held_clear(stage_call *sc) {
    for (int i = 0; i < sc->n_held; i++) held_free(&sc->held[i]);
    sc->n_held = 0;
}

static void unregister_stage_call(hyla_worker *w, stage_call *sc) {
    if (w->prev_nccl_call == sc->call) {
        close_link(&w->prev_nccl);
        w->prev_nccl_call = NULL;
    }
    stage_call **pp = &w->stage_calls;
    while (*pp && *pp != sc) pp = &(*pp)->next;
    if (*pp) *pp = sc->next;
    held_clear(sc);
    free(sc);
}

static void stage_release(hyla_worker *w, stage_call *sc, hyla_rpc_code code, const char *msg) {
    if (sc->released) return;
    sc->released = 1;
    held_clear(sc);
    if (w->prev_nccl_call == sc->call) { /* the previous stage aborts its side when the call ends */
        close_link(&w->prev_nccl);
        w->prev_nccl_call = NULL;
    }
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

/* A handshake from the previous stage: accept an NCCL link when this worker can join it from
 * another GPU of the same host, answer, and join. */
static void stage_handshake(hyla_worker *w, stage_call *sc, const Hyla__V1__StageForwardRequest *r) {
    Hyla__V1__StageForwardResponse resp = HYLA__V1__STAGE_FORWARD_RESPONSE__INIT;
    resp.step = r->step;
    const char *why = NULL;
#ifdef HYLA_HAVE_CUDA
    char host[256] = "", dev[64] = "";
    if (!nccl_wanted(w)) why = "this worker has no NCCL or no GPU, or HYLA_STAGE_NCCL=0";
    else if (w->tp) why = "this stage is split over several GPUs (--tp): its rows arrive over gRPC";
    else if (r->nccl_id.len != HYLA_NCCL_ID_BYTES) why = "the offered NCCL id has the wrong size";
    else if (w->prev_nccl) why = "this stage already has an NCCL link from a previous stage";
    else if (hyla_cuda_nccl_peer_key(w->be, host, sizeof host, dev, sizeof dev) != HYLA_OK) why = hyla_last_error();
    else if (!r->nccl_host || strcmp(r->nccl_host, host)) why = "the previous stage runs on another host";
    else if (r->nccl_device && !strcmp(r->nccl_device, dev)) why = "the previous stage runs on the same GPU";
#else
    why = "this worker was built without CUDA";
#endif
    resp.nccl_accepted = why == NULL;
    if (hyla_rpc_call_send(sc->call, &resp.base) != HYLA_OK) {
        stage_release(w, sc, HYLA_RPC_CANCELLED, "StageForward cancelled");
        return;
    }
    if (why) {
        HYLA_INFO("declined an NCCL link from the previous stage: %s", why);
        return;
    }
#ifdef HYLA_HAVE_CUDA
    hyla_status st = hyla_cuda_nccl_open(w->be, r->nccl_id.data, 2, 1, NCCL_OPEN_TIMEOUT_MS, &w->prev_nccl);
    if (st != HYLA_OK) {
        char msg[768];
        snprintf(msg, sizeof msg, "stage worker %s: joining the NCCL link: %s", w->worker_id, hyla_last_error());
        stage_release(w, sc, HYLA_RPC_UNAVAILABLE, msg);
        return;
    }
    w->prev_nccl_call = sc->call;
    HYLA_INFO("NCCL link from the previous stage (GPU %s): hidden states travel over NCCL", dev);
#endif
}

/* Send a held answer (its logits filled by the step's finish) and free it. */
static hyla_status send_held(stage_call *sc, stage_held *h) {
    Hyla__V1__StageResult *res = calloc(h->n ? h->n : 1, sizeof *res);
    Hyla__V1__StageResult **rp = calloc(h->n ? h->n : 1, sizeof *rp);
    HYLA_ASSERT(res && rp);
    for (size_t i = 0; i < h->n; i++) {
        hyla__v1__stage_result__init(&res[i]);
        res[i].session_id = h->ids[i];
        res[i].token = -1;
        if (h->errs[i]) res[i].error = h->errs[i];
        rp[i] = &res[i];
    }
    Hyla__V1__StageForwardResponse resp = HYLA__V1__STAGE_FORWARD_RESPONSE__INIT;
    resp.step = h->step;
    resp.n_results = h->n;
    resp.results = rp;
    if (h->logits) {
        resp.logits.data = (uint8_t *)h->logits;
        resp.logits.len = h->logits_len;
    }
    hyla_status st = hyla_rpc_call_send(sc->call, &resp.base);
    free(res);
    free(rp);
    held_free(h);
    return st;
}

/* One step (or one micro-batch of a step) from the previous stage: run our layers (and,
 * through our own downstream, the rest). A message is answered once its work is queued; a
 * middle stage over gRPC whose step wants logits holds the answers of a step's groups until
 * the last group (their logits come with its own downstream's finish). Over NCCL the rows of
 * each group are received at the group's rows of the stage input, and the logits of the whole
 * step go back once, after the last group. */
void do_stage_msg(hyla_worker *w, cmd *c) {
    stage_call *sc = find_stage_call(w, c->call);
    if (!sc || sc->released) return;
    const Hyla__V1__StageForwardRequest *r = (const Hyla__V1__StageForwardRequest *)c->msg;
    const hyla_model_config *cfg = hyla_model_get_config(w->m);
    if (!r->n_items && r->nccl_id.len) {
        stage_handshake(w, sc, r);
        return;
    }
    int nccl = r->hidden_over_nccl;
    char err[512] = "";
    size_t rows = 0;
    for (size_t i = 0; i < r->n_items; i++) rows += r->items[i]->n_tokens;
    int decode = r->n_items > 0 && r->items[0]->decode;
    size_t groups = r->groups ? r->groups : 1, group = r->group, off = r->row_offset;
    size_t total = r->total_rows ? r->total_rows : rows;
    int last_group = group + 1 == groups;
    int lb, le;
    hyla_model_layer_range(w->m, &lb, &le);
    int has_down = le < cfg->num_layers;
    size_t hidden_len = nccl ? 0 : rows * cfg->hidden_size * sizeof(float);
    if (nccl && (!w->prev_nccl || w->prev_nccl_call != sc->call))
        snprintf(err, sizeof err, "StageForward: step %llu is over NCCL but this call has no NCCL link",
                 (unsigned long long)r->step);
    else if (!r->n_items || r->dtype != HYLA__V1__DTYPE__DTYPE_F32 || r->hidden_size != (uint32_t)cfg->hidden_size ||
             r->hidden.len != hidden_len || (decode && rows != r->n_items) || (!decode && r->n_items != 1) ||
             rows > HYLA_PREFILL_PIECE_MAX)
        snprintf(err, sizeof err, "StageForward: step %llu is malformed (items %zu, rows %zu, hidden %zu bytes)",
                 (unsigned long long)r->step, r->n_items, rows, r->hidden.len);
    else if (groups > HYLA_MICRO_BATCH_MAX || group >= groups || off + rows > total || total > HYLA_PREFILL_PIECE_MAX ||
             (groups > 1 && !decode) || (groups == 1 && (off || total != rows)) ||
             (!last_group && groups - 1 - group > total - off - rows))
        snprintf(err, sizeof err,
                 "StageForward: step %llu is a malformed micro-batch (group %zu of %zu, rows %zu at row %zu of %zu)",
                 (unsigned long long)r->step, group, groups, rows, off, total);
    else if (!nccl && XXH64(r->hidden.data, r->hidden.len, 0) != r->xxh64)
        snprintf(err, sizeof err, "StageForward: step %llu: hidden states checksum mismatch", (unsigned long long)r->step);
    if (err[0]) {
        stage_release(w, sc, HYLA_RPC_INVALID_ARGUMENT, err);
        return;
    }
    if (groups > 1 && (int)groups > sc->max_groups) {
        sc->max_groups = (int)groups;
        HYLA_INFO("StageForward: a decode step of %zu rows in micro-batches (group %zu of %zu)", total, group, groups);
    }
    /* over NCCL, the rows are received first whatever happens next, so the link stays paired */
    float *x_dev = NULL, *logits_dev = NULL;
#ifdef HYLA_HAVE_CUDA
    if (nccl) {
        hyla_status st =
            hyla_runtime_stage_buffers(w->rt, (int)total, r->want_logits ? (int)total : 0, &x_dev, &logits_dev);
        if (st == HYLA_OK)
            st = hyla_cuda_nccl_recv(w->be, w->prev_nccl, x_dev + off * cfg->hidden_size,
                                     rows * cfg->hidden_size * sizeof(float), 0);
        if (st != HYLA_OK) {
            char msg[768];
            snprintf(msg, sizeof msg, "stage worker %s: receiving over NCCL: %s", w->worker_id, hyla_last_error());
            stage_release(w, sc, hyla_rpc_code_from_status(st), msg);
            return;
        }
    }
#else
    (void)logits_dev;
#endif
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
    /* a middle stage over gRPC holds a step's answers until its last group (see above) */
    int hold = !nccl && r->want_logits && has_down && groups > 1;
    float *logits = NULL;
    Hyla__V1__StageForwardResponse resp = HYLA__V1__STAGE_FORWARD_RESPONSE__INIT;
    resp.step = r->step;
    resp.n_results = r->n_items;
    resp.results = rp;
    hyla_stage_group g = {(int)group, (int)groups, (int)off, (int)total};
    hyla_status st = HYLA_OK;
    if (!bad && nccl) {
        /* make_resident may have restored a session: the rows must still be where they arrived */
        float *x2 = NULL, *l2 = NULL;
        st = hyla_runtime_stage_buffers(w->rt, (int)total, r->want_logits ? (int)total : 0, &x2, &l2);
        if (st == HYLA_OK && x2 != x_dev) st = hyla_fail(HYLA_ERR_INTERNAL, "the stage buffers moved under a received step");
        if (st == HYLA_OK) st = hyla_stage_forward_dev_group(ss, (int)rows, decode, r->want_logits, &g);
    } else if (!bad) {
        if (r->want_logits && !(logits = malloc(rows * cfg->vocab_size * sizeof(float))))
            st = hyla_fail(HYLA_ERR_NOMEM, "out of memory (logits of %zu rows)", rows);
        if (st == HYLA_OK) st = hyla_stage_forward_group(ss, (int)rows, decode, (const float *)r->hidden.data, logits, &g);
    } else if (has_down && last_group) {
        st = hyla_runtime_finish(w->rt); /* the step's earlier groups were posted on */
    }
#ifdef HYLA_HAVE_CUDA
    /* the logits of the whole step go back over the link after its last group, even when an item
     * failed (the previous stage is waiting for them; the item's error tells it they are not to
     * be used); a failed forward ends the call instead, and the previous stage aborts its side
     * of the link */
    if (nccl && r->want_logits && last_group && st == HYLA_OK) {
        st = hyla_cuda_nccl_send(w->be, w->prev_nccl, logits_dev, total * cfg->vocab_size * sizeof(float), 0);
        if (st != HYLA_OK) st = hyla_fail_wrap(st, "sending logits over NCCL");
    }
#endif
    if (st != HYLA_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "stage worker %s: %s", w->worker_id, hyla_last_error());
        free(logits);
        free(ss), free(res), free(rp), free(errs);
        stage_release(w, sc, hyla_rpc_code_from_status(st), msg);
        return;
    }
    if (!bad) w->tok_window += rows;
    if (hold && !last_group) { /* answered with the last group */
        HYLA_ASSERT(sc->n_held < HYLA_MICRO_BATCH_MAX);
        stage_held *h = &sc->held[sc->n_held++];
        h->step = r->step;
        h->n = r->n_items;
        h->ids = calloc(h->n, sizeof *h->ids);
        h->errs = calloc(h->n, sizeof *h->errs);
        HYLA_ASSERT(h->ids && h->errs);
        for (size_t i = 0; i < h->n; i++) {
            h->ids[i] = strdup(r->items[i]->session_id ? r->items[i]->session_id : "");
            h->errs[i] = errs[i][0] ? strdup(errs[i]) : NULL;
            HYLA_ASSERT(h->ids[i] && (!errs[i][0] || h->errs[i]));
        }
        h->logits = bad ? NULL : logits; /* filled when the step finishes */
        h->logits_len = bad ? 0 : rows * cfg->vocab_size * sizeof(float);
        if (bad) free(logits);
        free(ss), free(res), free(rp), free(errs);
        return;
    }
    for (int i = 0; i < sc->n_held; i++)
        if (send_held(sc, &sc->held[i]) != HYLA_OK) { /* (send_held freed the ones sent) */
            held_clear(sc);
            stage_release(w, sc, HYLA_RPC_CANCELLED, "StageForward cancelled");
            free(logits);
            free(ss), free(res), free(rp), free(errs);
            return;
        }
    sc->n_held = 0;
    if (!bad && logits) {
        resp.logits.data = (uint8_t *)logits;
        resp.logits.len = rows * cfg->vocab_size * sizeof(float);
    }
    if (hyla_rpc_call_send(sc->call, &resp.base) != HYLA_OK) stage_release(w, sc, HYLA_RPC_CANCELLED, "StageForward cancelled");
    free(logits);
    free(ss), free(res), free(rp), free(errs);
}

/* Fetch the parts the later stages hold for ws and append them to snap (scheduler thread). */
hyla_status gather_downstream(hyla_worker *w, const wsess *ws, hyla_snapshot *snap, uint64_t base_pos) {
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
    rq.base_position = base_pos;
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
        s = hyla_snapshot_add_part_tail(snap, q->layer, q->name, (hyla_part_kind)q->kind, (hyla_dtype)q->dtype, q->ndim,
                                        q->shape, q->page_tokens, q->skip, &np);
        if (s == HYLA_OK) memcpy(np->data, q->data, q->nbytes - q->skip);
    }
    hyla_snapshot_destroy(down);
    return s;
}

void do_export(hyla_worker *w, cmd *c) {
    const Hyla__V1__ExportStageRequest *r = (const Hyla__V1__ExportStageRequest *)c->msg;
    wsess *ws = lookup_or_fail(w, c->call, r->session_id, "ExportStage");
    if (!ws) return;
    finish_export(w, ws);
    hyla_status st = hyla_runtime_finish(w->rt); /* the later stages at rest (a no-op between steps) */
    if (st == HYLA_OK) st = make_resident(w, ws);
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
    if (r->base_position > r->position) {
        hyla_rpc_call_fail(c->call, HYLA_RPC_INVALID_ARGUMENT, "ExportStage %s: base position %llu beyond position %llu",
                           ws->id, (unsigned long long)r->base_position, (unsigned long long)r->position);
        return;
    }
    st = hyla_session_export_since(ws->s, r->base_position, &snap);
    if (st == HYLA_OK && !holds_all_layers(w)) {
        int lb, le;
        hyla_model_layer_range(w->m, &lb, &le);
        if (le < hyla_model_get_config(w->m)->num_layers) st = gather_downstream(w, ws, snap, r->base_position);
    }
    if (st == HYLA_OK) st = hyla_store_rpc_send_snapshot(c->call, ws->id, snap, 0, r->max_piece_bytes);
    hyla_snapshot_destroy(snap);
    if (st != HYLA_OK) fail_call(c->call, st, hyla_last_error());
    else hyla_rpc_call_reply(c->call, NULL);
}
