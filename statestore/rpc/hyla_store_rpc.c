/* hyla_store_rpc.c — StateStore service client and server; see hyla_store_rpc.h.
 *
 * Server invariants: a PutSnapshot call owns one put_ctx; its header arrives first, then data
 * pieces that must continue each part contiguously after its shared prefix, then commit; the
 * shared prefixes are referenced from the base version's chunks (hyla_store_put_since). The
 * blocking work (the put on the base version, the RocksDB commit, reading for GetSnapshot) runs on
 * a detached thread per call, never on an rpc loop thread. */
#include "hyla_store_rpc.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "hyla_api.h"
#include "hyla_log.h"
#include "hyla_thread.h"

#define PIECE_BYTES (4u << 20)

/* Bytes of part data per message: 4 MiB, or less where the sender's own message limit (half of
 * it, leaving room for the framing) or the reader's stated limit (`asked`, 0 = none) is smaller. */
static size_t piece_bytes(int own_limit, uint32_t asked) {
    size_t p = PIECE_BYTES;
    if (own_limit > 0 && (size_t)own_limit / 2 < p) p = (size_t)own_limit / 2;
    if (asked && asked < p) p = asked;
    return p < 4096 ? 4096 : p;
}
#define M_PUT "/hyla.v1.StateStore/PutSnapshot"
#define M_GET "/hyla.v1.StateStore/GetSnapshot"
#define M_DEL "/hyla.v1.StateStore/DeleteSnapshots"

static int64_t now_unix_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void hyla_store_rpc_info_from_stats(hyla_snapshot_info *info, const hyla_snapshot *snap,
                                    const hyla_store_put_stats *stats) {
    memset(info, 0, sizeof *info);
    info->version = stats->version;
    info->position = snap->position;
    info->state_bytes = hyla_snapshot_bytes(snap);
    info->stored_bytes = stats->bytes_written; /* refined by the server from usage if needed */
    info->written_bytes = stats->bytes_written;
    info->chunks = (uint32_t)stats->chunks_written;
    info->created_unix_ms = now_unix_ms();
}

void hyla_store_rpc_info_to_msg(const hyla_snapshot_info *info, Hyla__V1__SnapshotInfo *si) {
    si->version = info->version;
    si->position = info->position;
    si->state_bytes = info->state_bytes;
    si->stored_bytes = info->stored_bytes;
    si->written_bytes = info->written_bytes;
    si->chunks = info->chunks;
    si->created_unix_ms = info->created_unix_ms;
}

void hyla_store_rpc_info_from_msg(hyla_snapshot_info *info, const Hyla__V1__SnapshotInfo *si) {
    memset(info, 0, sizeof *info);
    if (!si) return;
    info->version = si->version;
    info->position = si->position;
    info->state_bytes = si->state_bytes;
    info->stored_bytes = si->stored_bytes;
    info->written_bytes = si->written_bytes;
    info->chunks = si->chunks;
    info->created_unix_ms = si->created_unix_ms;
}

/* ------------------------------------------------------------------------------------------ */
/* header <-> snapshot                                                                         */

static Hyla__V1__SnapshotHeader *header_from_snapshot(const char *session, uint64_t epoch, const hyla_snapshot *s,
                                                      uint64_t version, uint64_t base_version, const uint64_t *shared) {
    Hyla__V1__SnapshotHeader *h = calloc(1, sizeof *h);
    hyla__v1__snapshot_header__init(h);
    h->session_id = (char *)session;
    h->placement_epoch = epoch;
    h->version = version;
    h->base_version = base_version;
    h->format_version = s->format_version;
    h->model_fingerprint = s->model_fingerprint;
    h->position = s->position;
    h->n_generated = s->n_generated;
    h->pending_token = s->pending_token;
    h->temperature = s->sampler.temperature;
    h->top_k = s->sampler.top_k;
    h->top_p = s->sampler.top_p;
    h->seed = s->sampler.seed;
    h->n_rng = 4;
    h->rng = (uint64_t *)s->rng;
    h->n_layers = s->n_layers;
    h->n_parts = s->n_parts;
    h->parts = calloc(s->n_parts ? s->n_parts : 1, sizeof *h->parts);
    for (uint32_t i = 0; i < s->n_parts; i++) {
        const hyla_state_part *p = &s->parts[i];
        Hyla__V1__StatePartInfo *pi = calloc(1, sizeof *pi);
        hyla__v1__state_part_info__init(pi);
        pi->layer = p->layer;
        pi->name = (char *)p->name;
        pi->kind = p->kind;
        pi->dtype = (Hyla__V1__DType)p->dtype;
        pi->n_shape = p->ndim;
        pi->shape = (uint64_t *)p->shape;
        pi->page_tokens = p->page_tokens;
        pi->nbytes = p->nbytes;
        pi->shared_prefix_bytes = shared ? shared[i] : 0;
        h->parts[i] = pi;
    }
    return h;
}

static void header_free(Hyla__V1__SnapshotHeader *h) {
    if (!h) return;
    for (size_t i = 0; i < h->n_parts; i++) free(h->parts[i]);
    free(h->parts);
    free(h);
}

/* A snapshot with every part allocated (zeroed) from a received header; tails: a part with a
 * shared prefix holds only the bytes past it (its skip: a partial snapshot, hyla_snapshot.h). */
static hyla_status snapshot_from_header(const Hyla__V1__SnapshotHeader *h, int tails, hyla_snapshot **out) {
    *out = NULL;
    if (h->n_rng != 4) return hyla_fail(HYLA_ERR_FORMAT, "snapshot header: rng has %zu words, expected 4", h->n_rng);
    hyla_snapshot *s = hyla_snapshot_create();
    if (!s) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    s->format_version = h->format_version;
    s->model_fingerprint = h->model_fingerprint;
    s->position = h->position;
    s->n_generated = h->n_generated;
    s->pending_token = h->pending_token;
    s->sampler.temperature = h->temperature;
    s->sampler.top_k = h->top_k;
    s->sampler.top_p = h->top_p;
    s->sampler.seed = h->seed;
    memcpy(s->rng, h->rng, sizeof s->rng);
    for (size_t i = 0; i < h->n_parts; i++) {
        const Hyla__V1__StatePartInfo *pi = h->parts[i];
        if (!pi->name || pi->n_shape == 0 || pi->n_shape > HYLA_PART_MAX_DIMS || (uint32_t)pi->dtype >= HYLA_DT_COUNT) {
            hyla_snapshot_destroy(s);
            return hyla_fail(HYLA_ERR_FORMAT, "snapshot header: part %zu has a bad name, shape or dtype", i);
        }
        uint64_t n = hyla_dtype_size((hyla_dtype)pi->dtype);
        for (size_t d = 0; d < pi->n_shape; d++) {
            if (pi->shape[d] && n > UINT64_MAX / pi->shape[d]) n = UINT64_MAX;
            else n *= pi->shape[d];
        }
        if (n != pi->nbytes || n > (1ull << 40)) {
            hyla_snapshot_destroy(s);
            return hyla_fail(HYLA_ERR_FORMAT, "snapshot header: layer %u part '%s': nbytes %llu does not match its shape",
                             pi->layer, pi->name, (unsigned long long)pi->nbytes);
        }
        if (pi->kind == HYLA_PART_TOKENS && i + 1 != h->n_parts) { /* add_part keeps it last: indices would shift */
            hyla_snapshot_destroy(s);
            return hyla_fail(HYLA_ERR_FORMAT, "snapshot header: the token log (part %zu of %zu) must be the last part", i,
                             h->n_parts);
        }
        if (pi->shared_prefix_bytes > pi->nbytes) {
            hyla_snapshot_destroy(s);
            return hyla_fail(HYLA_ERR_FORMAT, "snapshot header: layer %u part '%s': shared prefix beyond the part",
                             pi->layer, pi->name);
        }
        hyla_status st = hyla_snapshot_add_part_tail(s, pi->layer, pi->name, (hyla_part_kind)pi->kind,
                                                     (hyla_dtype)pi->dtype, (uint32_t)pi->n_shape, pi->shape,
                                                     pi->page_tokens, tails ? pi->shared_prefix_bytes : 0, NULL);
        if (st != HYLA_OK) {
            hyla_snapshot_destroy(s);
            return st;
        }
    }
    s->n_layers = h->n_layers;
    *out = s;
    return HYLA_OK;
}

/* Point pd at bytes [off, off + piece) of part p (index i; off >= its skip), or up to its end,
 * with their checksum. */
static void fill_piece(Hyla__V1__PartData *pd, const hyla_state_part *p, uint32_t i, uint64_t off, size_t piece) {
    size_t len = p->nbytes - off < piece ? (size_t)(p->nbytes - off) : piece;
    pd->part_index = i;
    pd->offset = off;
    pd->data.data = (uint8_t *)p->data + (off - p->skip);
    pd->data.len = len;
    pd->xxh64 = XXH64(pd->data.data, len, 0);
}

/* ------------------------------------------------------------------------------------------ */
/* client                                                                                      */

hyla_status hyla_store_rpc_put(hyla_rpc_client *c, const char *session, uint64_t placement_epoch,
                               const hyla_snapshot *snap, uint64_t base_version, const hyla_snapshot *base,
                               int64_t timeout_ms, hyla_snapshot_info *info) {
    uint64_t *shared = calloc(snap->n_parts ? snap->n_parts : 1, sizeof *shared);
    if (!shared) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    if (base && base_version) {
        for (uint32_t i = 0; i < snap->n_parts; i++) {
            const hyla_state_part *p = &snap->parts[i];
            if (p->kind != HYLA_PART_KV) continue;
            const hyla_state_part *q = hyla_snapshot_find(base, p->layer, p->name);
            if (q && q->kind == p->kind && q->dtype == p->dtype && q->nbytes <= p->nbytes)
                shared[i] = q->nbytes; /* KV rows of earlier tokens never change */
        }
    }
    for (uint32_t i = 0; i < snap->n_parts; i++) /* a partial snapshot leaves out only what the base has */
        if (snap->parts[i].skip > shared[i]) {
            hyla_status s = hyla_fail(HYLA_ERR_INVALID_ARG,
                                      "PutSnapshot %s: layer %u part '%s' leaves out %llu bytes, base version %llu has %llu",
                                      session, snap->parts[i].layer, snap->parts[i].name,
                                      (unsigned long long)snap->parts[i].skip, (unsigned long long)base_version,
                                      (unsigned long long)shared[i]);
            free(shared);
            return s;
        }
    hyla_rpc_call_opts opts = {timeout_ms, NULL, NULL, 0};
    hyla_rpc_stream *st = NULL;
    hyla_status s = hyla_rpc_stream_open(c, M_PUT, &hyla__v1__put_snapshot_response__descriptor, &opts, &st);
    if (s != HYLA_OK) {
        free(shared);
        return s;
    }
    const size_t piece = piece_bytes(hyla_rpc_client_max_message(c), 0);
    Hyla__V1__PutSnapshotRequest req = HYLA__V1__PUT_SNAPSHOT_REQUEST__INIT;
    Hyla__V1__SnapshotHeader *h = header_from_snapshot(session, placement_epoch, snap, 0, base_version, shared);
    req.msg_case = HYLA__V1__PUT_SNAPSHOT_REQUEST__MSG_HEADER;
    req.header = h;
    s = hyla_rpc_stream_write(st, &req.base);
    header_free(h);
    Hyla__V1__PartData pd = HYLA__V1__PART_DATA__INIT;
    for (uint32_t i = 0; s == HYLA_OK && i < snap->n_parts; i++) {
        const hyla_state_part *p = &snap->parts[i];
        for (uint64_t off = shared[i]; s == HYLA_OK && off < p->nbytes; off += piece) {
            fill_piece(&pd, p, i, off, piece);
            req.msg_case = HYLA__V1__PUT_SNAPSHOT_REQUEST__MSG_DATA;
            req.data = &pd;
            s = hyla_rpc_stream_write(st, &req.base);
        }
    }
    free(shared);
    if (s == HYLA_OK) {
        req.msg_case = HYLA__V1__PUT_SNAPSHOT_REQUEST__MSG_COMMIT;
        req.commit = 1;
        s = hyla_rpc_stream_write(st, &req.base);
    }
    if (s == HYLA_OK) s = hyla_rpc_stream_close_send(st);
    ProtobufCMessage *resp = NULL;
    hyla_status rs = hyla_rpc_stream_read(st, &resp);
    if (rs != HYLA_OK || !resp) {
        hyla_rpc_result res;
        hyla_status fs = hyla_rpc_stream_finish(st, &res);
        hyla_rpc_stream_destroy(st);
        if (resp) protobuf_c_message_free_unpacked(resp, NULL);
        return fs != HYLA_OK ? fs : (rs != HYLA_OK ? rs : hyla_fail(HYLA_ERR_INTERNAL, "PutSnapshot: no response"));
    }
    Hyla__V1__PutSnapshotResponse *r = (Hyla__V1__PutSnapshotResponse *)resp;
    if (info) hyla_store_rpc_info_from_msg(info, r->snapshot);
    protobuf_c_message_free_unpacked(resp, NULL);
    s = hyla_rpc_stream_finish(st, NULL);
    hyla_rpc_stream_destroy(st);
    return s;
}

hyla_status hyla_store_rpc_recv_snapshot(hyla_rpc_stream *st, const char *what, hyla_snapshot **out,
                                         uint64_t *version_out) {
    *out = NULL;
    hyla_status s = HYLA_OK;
    hyla_snapshot *snap = NULL;
    uint64_t *got = NULL;
    while (s == HYLA_OK) {
        ProtobufCMessage *m = NULL;
        s = hyla_rpc_stream_read(st, &m);
        if (s != HYLA_OK || !m) break;
        Hyla__V1__GetSnapshotResponse *r = (Hyla__V1__GetSnapshotResponse *)m;
        if (r->msg_case == HYLA__V1__GET_SNAPSHOT_RESPONSE__MSG_HEADER && !snap) {
            s = snapshot_from_header(r->header, 1, &snap);
            if (s == HYLA_OK && version_out) *version_out = r->header->version;
            if (s == HYLA_OK && !(got = calloc(snap->n_parts ? snap->n_parts : 1, sizeof *got)))
                s = hyla_fail(HYLA_ERR_NOMEM, "out of memory");
            for (uint32_t i = 0; s == HYLA_OK && i < snap->n_parts; i++) got[i] = snap->parts[i].skip;
        } else if (r->msg_case == HYLA__V1__GET_SNAPSHOT_RESPONSE__MSG_DATA && snap) {
            const Hyla__V1__PartData *d = r->data;
            if (d->part_index >= snap->n_parts || d->offset != got[d->part_index] ||
                d->data.len > snap->parts[d->part_index].nbytes - d->offset)
                s = hyla_fail(HYLA_ERR_FORMAT, "%s: piece of part %u at offset %llu is out of order", what, d->part_index,
                              (unsigned long long)d->offset);
            else if (XXH64(d->data.data, d->data.len, 0) != d->xxh64)
                s = hyla_fail(HYLA_ERR_CORRUPT, "%s: piece of layer %u part '%s' at offset %llu: checksum mismatch", what,
                              snap->parts[d->part_index].layer, snap->parts[d->part_index].name,
                              (unsigned long long)d->offset);
            else {
                memcpy((uint8_t *)snap->parts[d->part_index].data + (d->offset - snap->parts[d->part_index].skip),
                       d->data.data, d->data.len);
                got[d->part_index] += d->data.len;
            }
        } else {
            s = hyla_fail(HYLA_ERR_FORMAT, "%s: unexpected message", what);
        }
        protobuf_c_message_free_unpacked(m, NULL);
    }
    if (s == HYLA_OK && !snap) s = hyla_fail(HYLA_ERR_FORMAT, "%s: the stream ended without a header", what);
    for (uint32_t i = 0; s == HYLA_OK && i < snap->n_parts; i++)
        if (got[i] != snap->parts[i].nbytes)
            s = hyla_fail(HYLA_ERR_FORMAT, "%s: layer %u part '%s' truncated: %llu of %llu bytes", what,
                          snap->parts[i].layer, snap->parts[i].name, (unsigned long long)got[i],
                          (unsigned long long)snap->parts[i].nbytes);
    free(got);
    if (s != HYLA_OK) {
        hyla_snapshot_destroy(snap);
        return s;
    }
    *out = snap;
    return HYLA_OK;
}

hyla_status hyla_store_rpc_get(hyla_rpc_client *c, const char *session, uint64_t version, int64_t timeout_ms,
                               hyla_snapshot **out, uint64_t *version_out) {
    *out = NULL;
    Hyla__V1__GetSnapshotRequest req = HYLA__V1__GET_SNAPSHOT_REQUEST__INIT;
    req.session_id = (char *)session;
    req.version = version;
    req.max_piece_bytes = (uint32_t)(hyla_rpc_client_max_message(c) / 2);
    hyla_rpc_call_opts opts = {timeout_ms, NULL, NULL, 0};
    hyla_rpc_stream *st = NULL;
    HYLA_TRY(hyla_rpc_stream_open(c, M_GET, &hyla__v1__get_snapshot_response__descriptor, &opts, &st));
    hyla_status s = hyla_rpc_stream_write(st, &req.base);
    if (s == HYLA_OK) s = hyla_rpc_stream_close_send(st);
    char what[300];
    snprintf(what, sizeof what, "GetSnapshot %s", session);
    if (s == HYLA_OK) s = hyla_store_rpc_recv_snapshot(st, what, out, version_out);
    if (s != HYLA_OK) hyla_rpc_stream_cancel(st);
    hyla_status fs = hyla_rpc_stream_finish(st, NULL);
    if (s == HYLA_OK && fs != HYLA_OK) {
        hyla_snapshot_destroy(*out);
        *out = NULL;
        s = fs;
    }
    hyla_rpc_stream_destroy(st);
    return s;
}

hyla_status hyla_store_rpc_delete(hyla_rpc_client *c, const char *session, uint64_t keep_from_version,
                                  int64_t timeout_ms, uint64_t *versions_deleted) {
    Hyla__V1__DeleteSnapshotsRequest req = HYLA__V1__DELETE_SNAPSHOTS_REQUEST__INIT;
    req.session_id = (char *)session;
    req.keep_from_version = keep_from_version;
    hyla_rpc_call_opts opts = {timeout_ms, NULL, NULL, 0};
    ProtobufCMessage *resp = NULL;
    HYLA_TRY(hyla_rpc_client_unary(c, M_DEL, &req.base, &hyla__v1__delete_snapshots_response__descriptor, &resp, &opts,
                                   NULL));
    if (versions_deleted) *versions_deleted = ((Hyla__V1__DeleteSnapshotsResponse *)resp)->versions_deleted;
    protobuf_c_message_free_unpacked(resp, NULL);
    return HYLA_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* server                                                                                      */

typedef struct {
    hyla_store *st;
    hyla_store_rpc_hooks hooks;
} server_ctx;

typedef struct {
    server_ctx *sc;
    hyla_rpc_call *call;
    char session[HYLA_SESSION_ID_MAX + 1];
    uint64_t epoch, base_version;
    hyla_snapshot *snap;
    uint64_t *shared, *got;
    int committed;
    hyla_status err; /* first error; the call fails with it at the end */
    char errmsg[512];
} put_ctx;

static void put_ctx_free(put_ctx *p) {
    if (!p) return;
    hyla_snapshot_destroy(p->snap);
    free(p->shared);
    free(p->got);
    free(p);
}

static void put_error(put_ctx *p, hyla_status s) {
    if (p->err != HYLA_OK) return;
    p->err = s;
    snprintf(p->errmsg, sizeof p->errmsg, "%s", hyla_last_error());
}

static void *put_thread(void *arg) {
    put_ctx *p = arg;
    server_ctx *sc = p->sc;
    hyla_status s = HYLA_OK;
    if (sc->hooks.check_put) s = sc->hooks.check_put(sc->hooks.ud, p->session, p->epoch);
    /* shared prefixes: referenced from the base version's chunks (only the bytes those do not
     * cover are decoded from it), so a put costs the new bytes, not the session's */
    int incremental = 0;
    for (uint32_t i = 0; s == HYLA_OK && i < p->snap->n_parts; i++) incremental |= p->shared[i] > 0;
    hyla_store_put_stats stats;
    memset(&stats, 0, sizeof stats);
    if (s == HYLA_OK && incremental) {
        s = hyla_store_put_since(sc->st, p->session, p->snap, p->base_version, p->shared, NULL, &stats);
        if (s != HYLA_OK) s = hyla_fail_wrap(s, "PutSnapshot %s: on base version %llu", p->session,
                                             (unsigned long long)p->base_version);
    } else if (s == HYLA_OK) {
        s = hyla_store_put(sc->st, p->session, p->snap, NULL, &stats);
    }
    if (s != HYLA_OK) {
        hyla_rpc_call_fail_status(p->call, s, hyla_last_error());
    } else {
        hyla_snapshot_info info;
        hyla_store_rpc_info_from_stats(&info, p->snap, &stats);
        if (sc->hooks.on_commit) sc->hooks.on_commit(sc->hooks.ud, p->session, p->epoch, &info);
        Hyla__V1__SnapshotInfo si = HYLA__V1__SNAPSHOT_INFO__INIT;
        hyla_store_rpc_info_to_msg(&info, &si);
        Hyla__V1__PutSnapshotResponse r = HYLA__V1__PUT_SNAPSHOT_RESPONSE__INIT;
        r.snapshot = &si;
        hyla_rpc_call_reply(p->call, &r.base);
    }
    put_ctx_free(p);
    return NULL;
}

static void spawn(void *(*fn)(void *), void *arg) {
    if (hyla_thread_start_detached(fn, arg) != 0) fn(arg); /* degrade to inline rather than drop the call */
}

static void on_put(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *msg, void *ud) {
    put_ctx *p = hyla_rpc_call_user(call);
    switch (ev) {
    case HYLA_RPC_EV_START:
        p = calloc(1, sizeof *p);
        HYLA_ASSERT(p);
        p->sc = ud;
        p->call = call;
        hyla_rpc_call_set_user(call, p, NULL);
        return;
    case HYLA_RPC_EV_MESSAGE: {
        const Hyla__V1__PutSnapshotRequest *r = (const Hyla__V1__PutSnapshotRequest *)msg;
        if (p->err != HYLA_OK || p->committed) return;
        if (r->msg_case == HYLA__V1__PUT_SNAPSHOT_REQUEST__MSG_HEADER) {
            if (p->snap) {
                put_error(p, hyla_fail(HYLA_ERR_INVALID_ARG, "PutSnapshot: a second header"));
                return;
            }
            const Hyla__V1__SnapshotHeader *h = r->header;
            if (!h->session_id || !*h->session_id || strlen(h->session_id) > HYLA_SESSION_ID_MAX) {
                put_error(p, hyla_fail(HYLA_ERR_INVALID_ARG, "PutSnapshot: header.session_id must be 1..%d bytes",
                                       HYLA_SESSION_ID_MAX));
                return;
            }
            snprintf(p->session, sizeof p->session, "%s", h->session_id);
            p->epoch = h->placement_epoch;
            p->base_version = h->base_version;
            hyla_status s = snapshot_from_header(h, 0, &p->snap);
            if (s != HYLA_OK) {
                put_error(p, s);
                return;
            }
            p->shared = calloc(h->n_parts + 1, sizeof *p->shared);
            p->got = calloc(h->n_parts + 1, sizeof *p->got);
            for (size_t i = 0; i < h->n_parts; i++) p->shared[i] = h->parts[i]->shared_prefix_bytes;
            if (!p->base_version)
                for (size_t i = 0; i < h->n_parts; i++)
                    if (p->shared[i]) {
                        put_error(p, hyla_fail(HYLA_ERR_INVALID_ARG, "PutSnapshot: shared prefix without a base_version"));
                        return;
                    }
        } else if (r->msg_case == HYLA__V1__PUT_SNAPSHOT_REQUEST__MSG_DATA) {
            const Hyla__V1__PartData *d = r->data;
            if (!p->snap) {
                put_error(p, hyla_fail(HYLA_ERR_INVALID_ARG, "PutSnapshot: data before the header"));
                return;
            }
            if (d->part_index >= p->snap->n_parts) {
                put_error(p, hyla_fail(HYLA_ERR_INVALID_ARG, "PutSnapshot: data.part_index %u out of range (%u parts)",
                                       d->part_index, p->snap->n_parts));
                return;
            }
            hyla_state_part *q = &p->snap->parts[d->part_index];
            uint64_t expect = p->shared[d->part_index] + p->got[d->part_index];
            if (d->offset != expect || d->data.len > q->nbytes - d->offset) {
                put_error(p, hyla_fail(HYLA_ERR_INVALID_ARG,
                                       "PutSnapshot %s: layer %u part '%s': piece at offset %llu (expected %llu) of %zu bytes does not fit",
                                       p->session, q->layer, q->name, (unsigned long long)d->offset,
                                       (unsigned long long)expect, d->data.len));
                return;
            }
            if (XXH64(d->data.data, d->data.len, 0) != d->xxh64) {
                put_error(p, hyla_fail(HYLA_ERR_CORRUPT, "PutSnapshot %s: layer %u part '%s' piece at offset %llu: checksum mismatch",
                                       p->session, q->layer, q->name, (unsigned long long)d->offset));
                return;
            }
            memcpy((uint8_t *)q->data + d->offset, d->data.data, d->data.len);
            p->got[d->part_index] += d->data.len;
        } else if (r->msg_case == HYLA__V1__PUT_SNAPSHOT_REQUEST__MSG_COMMIT) {
            if (!p->snap) {
                put_error(p, hyla_fail(HYLA_ERR_INVALID_ARG, "PutSnapshot: commit before the header"));
                return;
            }
            for (uint32_t i = 0; i < p->snap->n_parts; i++)
                if (p->shared[i] + p->got[i] != p->snap->parts[i].nbytes) {
                    put_error(p, hyla_fail(HYLA_ERR_INVALID_ARG, "PutSnapshot %s: layer %u part '%s' incomplete: %llu of %llu bytes",
                                           p->session, p->snap->parts[i].layer, p->snap->parts[i].name,
                                           (unsigned long long)(p->shared[i] + p->got[i]),
                                           (unsigned long long)p->snap->parts[i].nbytes));
                    return;
                }
            p->committed = 1;
        }
        return;
    }
    case HYLA_RPC_EV_HALF_CLOSE:
        hyla_rpc_call_set_user(call, NULL, NULL); /* before replying: the call may go away at once */
        if (p->err != HYLA_OK) {
            hyla_rpc_call_fail_status(call, p->err, p->errmsg);
            put_ctx_free(p);
        } else if (!p->committed) {
            hyla_rpc_call_fail(call, HYLA_RPC_INVALID_ARGUMENT, "PutSnapshot: the stream ended without commit");
            put_ctx_free(p);
        } else {
            spawn(put_thread, p); /* replies and frees */
        }
        return;
    case HYLA_RPC_EV_DONE:
        if (p) { /* cancelled before half-close */
            hyla_rpc_call_set_user(call, NULL, NULL);
            hyla_rpc_call_fail(call, HYLA_RPC_CANCELLED, "PutSnapshot cancelled");
            put_ctx_free(p);
        }
        return;
    }
}

/* A unary job about one session, run on its own thread: the first member of each job's context. */
typedef struct {
    server_ctx *sc;
    hyla_rpc_call *call;
    char session[HYLA_SESSION_ID_MAX + 1];
} session_job;

/* A zeroed job context of `size` bytes (a struct starting with session_job) for call about
 * session_id, or NULL when the id is not 1..HYLA_SESSION_ID_MAX bytes and the call has been
 * refused naming method: how every unary handler checks its request and starts. */
static void *session_job_new(hyla_rpc_call *call, const char *method, const char *session_id, void *ud, size_t size) {
    if (!session_id || !*session_id || strlen(session_id) > HYLA_SESSION_ID_MAX) {
        hyla_rpc_call_fail(call, HYLA_RPC_INVALID_ARGUMENT, "%s: session_id must be 1..%d bytes", method,
                           HYLA_SESSION_ID_MAX);
        return NULL;
    }
    session_job *j = calloc(1, size);
    HYLA_ASSERT(j);
    j->sc = ud;
    j->call = call;
    snprintf(j->session, sizeof j->session, "%s", session_id);
    return j;
}

/* Answer the job's call (reply, or s with the thread's last error) and free the job: how every
 * job thread ends. */
static void *session_job_end(void *job, hyla_status s, const ProtobufCMessage *reply) {
    session_job *j = job;
    if (s != HYLA_OK) hyla_rpc_call_fail_status(j->call, s, hyla_last_error());
    else hyla_rpc_call_reply(j->call, reply);
    free(job);
    return NULL;
}

typedef struct {
    session_job j;
    uint64_t version;
    uint32_t max_piece; /* the reader's limit on a piece (0: none) */
} get_ctx;

hyla_status hyla_store_rpc_send_snapshot(hyla_rpc_call *call, const char *session, const hyla_snapshot *snap,
                                         uint64_t version, uint32_t max_piece_bytes) {
    const size_t piece = piece_bytes(hyla_rpc_call_max_message(call), max_piece_bytes);
    Hyla__V1__GetSnapshotResponse r = HYLA__V1__GET_SNAPSHOT_RESPONSE__INIT;
    uint64_t *skip = calloc(snap->n_parts + 1, sizeof *skip); /* a partial snapshot's parts: their tails */
    if (!skip) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    for (uint32_t i = 0; i < snap->n_parts; i++) skip[i] = snap->parts[i].skip;
    Hyla__V1__SnapshotHeader *h = header_from_snapshot(session, 0, snap, version, 0, skip);
    free(skip);
    r.msg_case = HYLA__V1__GET_SNAPSHOT_RESPONSE__MSG_HEADER;
    r.header = h;
    hyla_status s = hyla_rpc_call_send(call, &r.base);
    header_free(h);
    Hyla__V1__PartData pd = HYLA__V1__PART_DATA__INIT;
    for (uint32_t i = 0; s == HYLA_OK && i < snap->n_parts; i++) {
        const hyla_state_part *p = &snap->parts[i];
        for (uint64_t off = p->skip; s == HYLA_OK && off < p->nbytes; off += piece) {
            while (hyla_rpc_call_queued(call) > 8 && !hyla_rpc_call_cancelled(call)) usleep(500);
            fill_piece(&pd, p, i, off, piece);
            r.msg_case = HYLA__V1__GET_SNAPSHOT_RESPONSE__MSG_DATA;
            r.data = &pd;
            s = hyla_rpc_call_send(call, &r.base);
        }
    }
    return s;
}

static void *get_thread(void *arg) {
    get_ctx *g = arg;
    hyla_snapshot *snap = NULL;
    uint64_t version = 0;
    hyla_status s = hyla_store_get(g->j.sc->st, g->j.session, g->version, 0, &snap, &version);
    if (s == HYLA_OK) s = hyla_store_rpc_send_snapshot(g->j.call, g->j.session, snap, version, g->max_piece);
    hyla_snapshot_destroy(snap);
    return session_job_end(g, s, NULL);
}

static void on_get(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *msg, void *ud) {
    if (ev != HYLA_RPC_EV_START) return;
    const Hyla__V1__GetSnapshotRequest *r = (const Hyla__V1__GetSnapshotRequest *)msg;
    get_ctx *g = session_job_new(call, "GetSnapshot", r->session_id, ud, sizeof *g);
    if (!g) return;
    g->version = r->version;
    g->max_piece = r->max_piece_bytes;
    spawn(get_thread, g);
}

typedef struct {
    session_job j;
    uint64_t keep_from;
} del_ctx;

static void *del_thread(void *arg) {
    del_ctx *d = arg;
    Hyla__V1__DeleteSnapshotsResponse r = HYLA__V1__DELETE_SNAPSHOTS_RESPONSE__INIT;
    hyla_status s = HYLA_OK;
    if (d->keep_from == 0) {
        uint64_t *v = NULL;
        size_t n = 0;
        s = hyla_store_versions(d->j.sc->st, d->j.session, &v, &n);
        free(v);
        if (s == HYLA_OK) s = hyla_store_delete(d->j.sc->st, d->j.session);
        r.versions_deleted = n;
    } else {
        s = hyla_fail(HYLA_ERR_UNSUPPORTED,
                      "DeleteSnapshots: keep_from_version > 0 is not supported (the store keeps its configured number of versions)");
    }
    return session_job_end(d, s, &r.base);
}

static void on_del(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *msg, void *ud) {
    if (ev != HYLA_RPC_EV_START) return;
    const Hyla__V1__DeleteSnapshotsRequest *r = (const Hyla__V1__DeleteSnapshotsRequest *)msg;
    del_ctx *d = session_job_new(call, "DeleteSnapshots", r->session_id, ud, sizeof *d);
    if (!d) return;
    d->keep_from = r->keep_from_version;
    spawn(del_thread, d);
}

hyla_status hyla_store_rpc_register(hyla_rpc_server *srv, hyla_store *st, const hyla_store_rpc_hooks *hooks) {
    server_ctx *sc = calloc(1, sizeof *sc); /* freed by the server's cleanup, after its last call */
    if (!sc) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    sc->st = st;
    if (hooks) sc->hooks = *hooks;
    hyla_status cs = hyla_rpc_server_add_cleanup(srv, free, sc);
    if (cs != HYLA_OK) {
        free(sc);
        return cs;
    }
    HYLA_TRY(hyla_rpc_server_add_method(srv, M_PUT, HYLA_RPC_CLIENT_STREAM, &hyla__v1__put_snapshot_request__descriptor,
                                        &hyla__v1__put_snapshot_response__descriptor, on_put, sc));
    HYLA_TRY(hyla_rpc_server_add_method(srv, M_GET, HYLA_RPC_SERVER_STREAM, &hyla__v1__get_snapshot_request__descriptor,
                                        &hyla__v1__get_snapshot_response__descriptor, on_get, sc));
    HYLA_TRY(hyla_rpc_server_add_method(srv, M_DEL, HYLA_RPC_UNARY, &hyla__v1__delete_snapshots_request__descriptor,
                                        &hyla__v1__delete_snapshots_response__descriptor, on_del, sc));
    return HYLA_OK;
}
