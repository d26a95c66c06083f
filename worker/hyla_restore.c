/* hyla_restore.c — hyla_restore_session (hyla_restore.h): the store's streaming read feeding a
 * streaming import.
 *
 * Two threads: a reader thread runs hyla_store_read_chunks (which fans out to the codec's
 * threads); each chunk it verifies is appended to a queue (mutex + condition variable). The
 * calling thread, which drives the runtime, lays out the pinned snapshot, begins the import,
 * then takes whatever the queue holds, in batches, and queues their device copies with
 * hyla_session_import_ranges until the reader is done; then the import ends (waits for the
 * copies). Invariant: a range enters the queue only after its chunk's checksum was verified, and
 * the snapshot's memory is given back only after the import has ended or aborted (the copies
 * read it until then). */
#include "hyla_restore.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_log.h"
#include "hyla_model.h"
#include "hyla_runtime_impl.h"
#include "hyla_util.h"

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint32_t *part; /* [cap] the ranges reported so far */
    uint64_t *off, *len;
    size_t n, cap;
    int oom;       /* a range could not be queued: the restore fails */
    int finished;  /* the reader returned */
    hyla_status st;
    char msg[1024]; /* the reader's failure detail (its thread's error slot is its own) */
    double t_read; /* seconds the reader took */
    double t_end;  /* when it returned (hyla_now) */
    hyla_store_reader *r;
    hyla_snapshot *snap;
} range_queue;

static void on_chunk(void *ctx, uint32_t part, uint64_t off, uint64_t len) {
    range_queue *q = ctx;
    pthread_mutex_lock(&q->mu);
    if (q->n == q->cap) {
        size_t cap = q->cap ? q->cap * 2 : 256;
        uint32_t *p = realloc(q->part, cap * sizeof *p);
        if (p) q->part = p;
        uint64_t *o = realloc(q->off, cap * sizeof *o);
        if (o) q->off = o;
        uint64_t *l = realloc(q->len, cap * sizeof *l);
        if (l) q->len = l;
        if (p && o && l) q->cap = cap;
    }
    if (q->n < q->cap) {
        q->part[q->n] = part;
        q->off[q->n] = off;
        q->len[q->n] = len;
        q->n++;
        pthread_cond_signal(&q->cv);
    } else {
        q->oom = 1;
    }
    pthread_mutex_unlock(&q->mu);
}

static void *reader_main(void *arg) {
    range_queue *q = arg;
    double t = hyla_now();
    hyla_status st = hyla_store_read_chunks(q->r, q->snap, on_chunk, q);
    pthread_mutex_lock(&q->mu);
    q->st = st;
    if (st != HYLA_OK) snprintf(q->msg, sizeof q->msg, "%s", hyla_last_error());
    q->t_end = hyla_now();
    q->t_read = q->t_end - t;
    q->finished = 1;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

/* An arena snapshot shaped like layout (meta and parts), its data carved from one of the
 * runtime's pinned snapshot buffers (not zero-filled: every byte will be decoded into). */
static hyla_status pinned_like(hyla_runtime *rt, const hyla_snapshot *layout, hyla_snapshot **out) {
    *out = NULL;
    uint64_t arena = 0;
    for (uint32_t i = 0; i < layout->n_parts; i++) arena += hyla_snapshot_arena_piece(layout->parts[i].nbytes);
    uint8_t *base;
    HYLA_TRY(hyla_snapbuf_get(rt, (size_t)arena, &base));
    hyla_snapshot *s = hyla_snapshot_create_arena(base, (size_t)arena, hyla_snapbuf_release, hyla_runtime_snapbufs(rt));
    if (!s) {
        hyla_snapbuf_release(hyla_runtime_snapbufs(rt), base);
        return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    }
    for (uint32_t i = 0; i < layout->n_parts; i++) {
        const hyla_state_part *p = &layout->parts[i];
        hyla_state_part *q;
        hyla_status st = hyla_snapshot_add_part(s, p->layer, p->name, (hyla_part_kind)p->kind, (hyla_dtype)p->dtype,
                                                p->ndim, p->shape, p->page_tokens, &q);
        if (st != HYLA_OK) {
            hyla_snapshot_destroy(s);
            return st;
        }
    }
    hyla_snapshot_copy_meta(s, layout); /* parts and the arena stay s's own */
    *out = s;
    return HYLA_OK;
}

/* Hand the queue's ranges to the import as they come, until the reader is done. */
static hyla_status pump(range_queue *q, hyla_import *im, hyla_restore_stats *rs) {
    size_t taken = 0, cap = 0;
    uint32_t *part = NULL;
    uint64_t *off = NULL, *len = NULL;
    hyla_status st = HYLA_OK;
    for (;;) {
        pthread_mutex_lock(&q->mu);
        while (taken == q->n && !q->finished) pthread_cond_wait(&q->cv, &q->mu);
        size_t n = q->n - taken;
        int done = q->finished && n == 0, oom = q->oom;
        if (n > cap) {
            size_t c = n > 2 * cap ? n : 2 * cap;
            uint32_t *p = realloc(part, c * sizeof *p);
            if (p) part = p;
            uint64_t *o = realloc(off, c * sizeof *o);
            if (o) off = o;
            uint64_t *l = realloc(len, c * sizeof *l);
            if (l) len = l;
            if (p && o && l) cap = c;
            else oom = 1;
        }
        if (!oom && n) {
            memcpy(part, q->part + taken, n * sizeof *part);
            memcpy(off, q->off + taken, n * sizeof *off);
            memcpy(len, q->len + taken, n * sizeof *len);
            taken += n;
        }
        pthread_mutex_unlock(&q->mu);
        if (oom) {
            st = hyla_fail(HYLA_ERR_NOMEM, "restore: out of memory queueing chunks");
            break;
        }
        if (n && st == HYLA_OK) {
            /* in part and offset order: the chunks of a part that arrived together are then
             * neighbours in memory on both sides, and go to the device as one copy. Insertion
             * sort: the codec deals chunks out in manifest order (part, then offset) and they
             * arrive within about a thread count of it, so a batch is nearly sorted already. */
            for (size_t i = 1; i < n; i++)
                for (size_t j = i; j > 0 && (part[j - 1] > part[j] || (part[j - 1] == part[j] && off[j - 1] > off[j])); j--) {
                    uint32_t tp = part[j];
                    uint64_t to = off[j], tl = len[j];
                    part[j] = part[j - 1], off[j] = off[j - 1], len[j] = len[j - 1];
                    part[j - 1] = tp, off[j - 1] = to, len[j - 1] = tl;
                }
            st = hyla_session_import_ranges(im, (int)n, part, off, len);
            rs->ranges += n;
            rs->copy_calls++;
        }
        if (done) break;
    }
    free(part);
    free(off);
    free(len);
    return st;
}

hyla_status hyla_restore_session(hyla_runtime *rt, hyla_store *st, const char *session, uint64_t version,
                                 hyla_session **out, uint64_t *version_out, hyla_restore_stats *stats) {
    *out = NULL;
    hyla_restore_stats rs;
    memset(&rs, 0, sizeof rs);
    double t0 = hyla_now();
    if (rt->tp) { /* a tensor-parallel group splits the whole snapshot per rank: the two-step path */
        hyla_snapshot *snap = NULL;
        uint64_t ver = 0;
        HYLA_TRY(hyla_store_get(st, session, version, hyla_model_fingerprint(hyla_runtime_model(rt)), &snap, &ver));
        hyla_status s = hyla_session_import(rt, snap, out);
        rs.bytes = hyla_snapshot_bytes(snap);
        hyla_snapshot_destroy(snap);
        if (s != HYLA_OK) return s;
        rs.seconds_total = hyla_now() - t0;
        if (stats) *stats = rs;
        if (version_out) *version_out = ver;
        return HYLA_OK;
    }
    hyla_store_reader *r = NULL;
    HYLA_TRY(hyla_store_read_open(st, session, version, hyla_model_fingerprint(hyla_runtime_model(rt)), &r));
    range_queue q;
    memset(&q, 0, sizeof q);
    q.r = r;
    hyla_import *im = NULL;
    double tp = 0;
    hyla_status s = pinned_like(rt, hyla_store_read_layout(r), &q.snap);
    if (s == HYLA_OK) {
        rs.bytes = hyla_snapshot_bytes(q.snap);
        pthread_mutex_init(&q.mu, NULL);
        pthread_cond_init(&q.cv, NULL);
        pthread_t th;
        /* the reader starts before the import is laid out: the session's allocations (one per
         * KV page, each zero-filled) overlap the first chunks' decoding, which only writes the
         * pinned buffer; nothing is copied to the device before begin has checked the layout */
        if (pthread_create(&th, NULL, reader_main, &q) != 0) {
            s = hyla_fail(HYLA_ERR_RESOURCE, "restore: cannot start the reader thread");
        } else {
            hyla_status ps = hyla_session_import_begin(rt, q.snap, &im);
            rs.seconds_open = hyla_now() - t0;
            if (ps == HYLA_OK) ps = pump(&q, im, &rs);
            tp = hyla_now();
            if (ps != HYLA_OK) { /* the reader runs to its end (its threads cannot be stopped) */
                pthread_mutex_lock(&q.mu);
                while (!q.finished) pthread_cond_wait(&q.cv, &q.mu);
                pthread_mutex_unlock(&q.mu);
            }
            pthread_join(th, NULL);
            /* the reader's refusal names session, version, layer, part and chunk: it comes first */
            s = q.st != HYLA_OK ? hyla_fail(q.st, "%s", q.msg) : ps;
        }
        pthread_cond_destroy(&q.cv);
        pthread_mutex_destroy(&q.mu);
        rs.seconds_read = q.t_read;
    }
    hyla_session *sess = NULL;
    const double tj = hyla_now();
    if (s == HYLA_OK) s = hyla_session_import_end(im, &sess);
    else hyla_session_import_abort(im);
    const double te = hyla_now();
    hyla_snapshot_destroy(q.snap); /* the copies that read it are done */
    uint64_t ver = hyla_store_read_version(r);
    hyla_store_read_close(r);
    HYLA_DEBUG("restore %s: read %.3f..%.3f ms, ranges handed on until %.3f, import end %.3f..%.3f, closed %.3f ms "
               "(%llu copy calls)", session, (q.t_end - q.t_read - t0) * 1e3, (q.t_end - t0) * 1e3, (tp - t0) * 1e3,
               (tj - t0) * 1e3, (te - t0) * 1e3, (hyla_now() - t0) * 1e3, (unsigned long long)rs.copy_calls);
    free(q.part);
    free(q.off);
    free(q.len);
    if (s != HYLA_OK) return s;
    const double t1 = hyla_now();
    rs.seconds_total = t1 - t0;
    rs.seconds_tail = t1 - q.t_end;
    if (stats) *stats = rs;
    if (version_out) *version_out = ver;
    *out = sess;
    return HYLA_OK;
}
