/* hyla_bench_restore.c — `hyla-bench restore`: resuming a session from the statestore against
 * prefilling its tokens again, on one device, in one run.
 *
 * For each --ctx N: one session is prefilled with N random tokens (timed: prefill_s), exported
 * (hyla_session_export) and put into a real store (RocksDB through hyla_store_put, synced, the
 * default codec: chunking, XXH3, zstd level 1 on every core). Then the restore from the store,
 * hyla_restore_session (RocksDB read, every checksum verified, decompression on the codec's
 * threads straight into pinned memory, each chunk handed to the copy engine as it is verified,
 * all overlapped) and a device sync: once cold (restore_cold_s: its pinned buffer is allocated),
 * then --repeat times (restore_s, the median). For comparison the two-step path, --repeat
 * times: hyla_store_get into malloc'ed memory, then hyla_session_import (legacy_*). The same
 * tokens are then prefilled again in a fresh session (reprefill_s), which is what a resume
 * without a snapshot costs. Not included: the gRPC hop between a remote statestore and the
 * worker. The store's files were just written, so RocksDB reads hit the OS page cache (the
 * usual case for a session paused on the same host; a cold disk read adds its own time).
 *
 * Checks, reported in the JSON (and a non-zero exit status when one fails): the restored
 * session and the original give the same logits, bit for bit, for their next decode step; the
 * re-prefilled session's snapshot equals the first one (prefill is deterministic).
 *
 * For reference, measured in the same process: pinned host -> device bandwidth (ops->host_alloc
 * memory through ops->upload) and pageable (malloc) host -> device bandwidth (ops->upload's
 * bounce buffers), both on a buffer the size of the snapshot (at most 1 GiB); and the decode
 * step of the session alone, and with an asynchronous export of it always in flight
 * (hyla_session_export_begin / _end), as e2e_snapshot_async does for a batch.
 * Rates: GB = 10^9 bytes of state (in memory) per second. Single-threaded driver. */
#include "hyla_bench_restore.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hyla_bench_model.h"
#include "hyla_log.h"
#include "hyla_model.h"
#include "hyla_ops.h"
#include "hyla_restore.h"
#include "hyla_session.h"
#include "hyla_store.h"
#include "hyla_thread.h"
#include "hyla_util.h"

/* kernels/cuda/hyla_cuda_extra.h, weak: NULL in builds without the CUDA backend */
hyla_status hyla_cuda_device_info(hyla_backend *be, char *name, size_t name_len, int *sm_count, double *mem_gib)
    __attribute__((weak));

#define RDIE(...) HYLA_BENCH_DIE("hyla-bench restore", __VA_ARGS__)
#define RTRY(call) HYLA_BENCH_TRY("hyla-bench restore", call)

typedef struct {
    hyla_backend *be;
    const hyla_ops *O;
    void *cx;
    char gpu[128];
    const char *device;
} rb_dev;


/* Host -> device GB/s of `bytes` from host memory h (best of 5 after a warm-up). */
static double h2d_gbps(rb_dev *d, const void *h, void *dst, size_t bytes) {
    double best = 1e30;
    RTRY(d->O->upload(d->cx, dst, h, bytes));
    RTRY(d->O->sync(d->cx));
    for (int i = 0; i < 5; i++) {
        double t = hyla_now();
        RTRY(d->O->upload(d->cx, dst, h, bytes));
        RTRY(d->O->sync(d->cx));
        t = hyla_now() - t;
        if (t < best) best = t;
    }
    return bytes / best / 1e9;
}

static void bandwidths(rb_dev *d, uint64_t snap_bytes, double *pinned, double *pageable, size_t *used) {
    size_t n = snap_bytes < ((size_t)1 << 30) ? (size_t)snap_bytes : ((size_t)1 << 30);
    if (n < ((size_t)64 << 20)) n = (size_t)64 << 20;
    void *dst, *hp = NULL;
    RTRY(d->O->alloc(d->cx, n, &dst));
    RTRY(d->O->host_alloc(d->cx, n, &hp));
    memset(hp, 0x5a, n);
    *pinned = h2d_gbps(d, hp, dst, n);
    d->O->host_free(d->cx, hp);
    void *hm = malloc(n);
    if (!hm) RDIE("out of host memory (%zu bytes)", n);
    memset(hm, 0x5a, n);
    *pageable = h2d_gbps(d, hm, dst, n);
    free(hm);
    d->O->free(d->cx, dst);
    *used = n;
}

/* Decode step of session s alone, and with an export of s always in flight (a new one begins
 * as soon as one ends). Of the steps with an export in flight: the host time of
 * hyla_session_export_begin (begin_ms, mean), the mean step (decode only) of the steps at which
 * an export began (step_begin_ms) and of the others (step_other_ms): a cost per export shows in
 * the first, contention with the copies in the second. */
typedef struct {
    double plain_ms, busy_ms, begin_ms, end_ms, step_begin_ms, step_other_ms;
    int n_exp;
} export_costs;

static void decode_vs_export(rb_dev *d, hyla_session *s, int steps, export_costs *x) {
    int32_t out;
    hyla_export *e = NULL;
    hyla_snapshot *snap = NULL;
    memset(x, 0, sizeof *x);
    RTRY(hyla_session_decode(&s, 1, &out, NULL));
    RTRY(hyla_session_export_begin(s, &e)); /* warm: buffer cache, staging slots */
    RTRY(hyla_session_decode(&s, 1, &out, NULL));
    RTRY(hyla_session_export_end(e, &snap));
    hyla_snapshot_destroy(snap);
    RTRY(d->O->sync(d->cx));
    double t = hyla_now();
    for (int i = 0; i < steps; i++) RTRY(hyla_session_decode(&s, 1, &out, NULL));
    RTRY(d->O->sync(d->cx));
    x->plain_ms = (hyla_now() - t) / steps * 1e3;
    e = NULL;
    int nb = 0, no = 0, ne = 0;
    t = hyla_now();
    for (int i = 0; i < steps; i++) {
        int began = 0;
        if (!e) {
            double tb = hyla_now();
            RTRY(hyla_session_export_begin(s, &e));
            x->begin_ms += (hyla_now() - tb) * 1e3;
            began = 1;
        }
        double ts = hyla_now();
        RTRY(hyla_session_decode(&s, 1, &out, NULL));
        ts = (hyla_now() - ts) * 1e3;
        if (began) x->step_begin_ms += ts, nb++;
        else x->step_other_ms += ts, no++;
        if (hyla_session_export_done(e)) {
            double te = hyla_now();
            RTRY(hyla_session_export_end(e, &snap));
            hyla_snapshot_destroy(snap);
            x->end_ms += (hyla_now() - te) * 1e3;
            ne++;
            e = NULL;
            x->n_exp++;
        }
    }
    /* each decode returned its token, so the steps are done; ops->sync would also wait for the
     * export still in flight (the copy stream), which is not the steps' time */
    x->busy_ms = (hyla_now() - t) / steps * 1e3;
    RTRY(d->O->sync(d->cx));
    if (nb) x->begin_ms /= nb, x->step_begin_ms /= nb;
    if (no) x->step_other_ms /= no;
    if (ne) x->end_ms /= ne;
    if (e) {
        RTRY(hyla_session_export_end(e, &snap));
        hyla_snapshot_destroy(snap);
    }
}

static double feed_timed(rb_dev *d, hyla_runtime *rt, const int32_t *tok, int n, hyla_session **out) {
    RTRY(hyla_session_create(rt, out));
    RTRY(d->O->sync(d->cx));
    double t = hyla_now();
    RTRY(hyla_session_feed(*out, tok, n, NULL, NULL, NULL, NULL));
    RTRY(d->O->sync(d->cx));
    return hyla_now() - t;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: hyla-bench restore --model DIR [--device cpu|cuda:N] [--ctx LIST (default 32768)]\n"
            "                          [--store DIR] [--repeat 3 (at most 16)] [--threads N] [--zstd-level N]\n"
            "                          [--chunk-bytes N] [--decode-steps 32]\n"
            "  Per --ctx: prefill one session, put its snapshot into a RocksDB store under --store\n"
            "  (default $TMPDIR or /tmp; removed afterwards), then time restoring it from the store\n"
            "  to the device (read + checksums + decompression + host -> device, overlapped;\n"
            "  median of --repeat; also the two-step get + import) against prefilling the same\n"
            "  tokens again. Also the pinned and pageable host -> device bandwidth, and decode\n"
            "  with an export always in flight (the steps' own time, with the host time of each\n"
            "  export's begin). JSON lines. Logs at warn level unless HYLA_LOG is set (HYLA_LOG=debug:\n"
            "  each export begin's parts and the copy batches, timed; each restore's read span and\n"
            "  import end, and the codec threads' fetch and decode times). restore_tail_s: from the\n"
            "  store's read ending to the session being ready.\n");
}

int hyla_bench_restore(int argc, char **argv) {
    const char *model_dir = NULL, *store_base = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    rb_dev d = {.device = "cpu"};
    int ctxs[8], nc = 0, repeat = 3, steps = 32;
    hyla_codec_params cp = hyla_codec_default_params();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (!strcmp(a, "--model") && has) model_dir = argv[++i];
        else if (!strcmp(a, "--device") && has) d.device = argv[++i];
        else if (!strcmp(a, "--ctx") && has) nc = hyla_bench_parse_list("--ctx", argv[++i], ctxs, 8);
        else if (!strcmp(a, "--store") && has) store_base = argv[++i];
        else if (!strcmp(a, "--repeat") && has) repeat = (int)hyla_bench_num("--repeat", argv[++i], 1, 16, 1);
        else if (!strcmp(a, "--threads") && has) cp.threads = (int)hyla_bench_num("--threads", argv[++i], 0, 1024, 1);
        else if (!strcmp(a, "--zstd-level") && has) cp.zstd_level = (int)hyla_bench_num("--zstd-level", argv[++i], -131072, 22, 1);
        else if (!strcmp(a, "--chunk-bytes") && has) cp.chunk_bytes = (uint32_t)hyla_bench_num("--chunk-bytes", argv[++i], 4096, 256 << 20, 1);
        else if (!strcmp(a, "--decode-steps") && has) steps = (int)hyla_bench_num("--decode-steps", argv[++i], 1, 1e6, 1);
        else {
            usage(strcmp(a, "--help") && strcmp(a, "-h") ? stderr : stdout);
            return strcmp(a, "--help") && strcmp(a, "-h") ? 2 : 0;
        }
    }
    if (!model_dir) {
        usage(stderr);
        return 2;
    }
    if (!nc) nc = hyla_bench_parse_list("(default)", "32768", ctxs, 8);
    if (repeat < 1) repeat = 1;
    if (repeat > 16) repeat = 16;
    if (steps < 1) steps = 1;
    if (!getenv("HYLA_LOG")) hyla_log_set_level(HYLA_LOG_WARN); /* quiet unless asked (HYLA_LOG=debug) */
    snprintf(d.gpu, sizeof d.gpu, "cpu");
    RTRY(hyla_backend_create(d.device, &d.be));
    d.O = d.be->ops;
    d.cx = d.be->ctx;
    if (!strcmp(d.O->name, "cuda") && hyla_cuda_device_info) {
        int sms;
        double gib;
        RTRY(hyla_cuda_device_info(d.be, d.gpu, sizeof d.gpu, &sms, &gib));
    }
    hyla_model *m;
    hyla_model_params mp = hyla_model_default_params();
    RTRY(hyla_model_load(model_dir, d.be, &mp, &m));
    hyla_runtime *rt;
    RTRY(hyla_runtime_create(m, &rt));
    const hyla_model_config *cfg = hyla_model_get_config(m);
    uint64_t fp = hyla_model_fingerprint(m);
    char base[600], dbdir[700];
    snprintf(base, sizeof base, "%s/hyla_bench_restore_%d", store_base, (int)getpid());
    RTRY(hyla_mkdirs(base));
    hyla_rng rng;
    hyla_rng_seed(&rng, 7);
    int rc = 0;
    { /* warm-up: a prompt of two pieces loads the kernels and builds the GEMM plans */
        int n = 2 * hyla_runtime_prefill_piece(rt) + 1;
        int32_t *tok = malloc((size_t)n * 4);
        for (int i = 0; i < n; i++) tok[i] = (int32_t)(hyla_rng_next(&rng) % (uint64_t)cfg->vocab_size);
        hyla_session *s;
        feed_timed(&d, rt, tok, n, &s);
        hyla_session_free(s);
        free(tok);
    }
    for (int ci = 0; ci < nc; ci++) {
        int n = ctxs[ci];
        if (n < 2) n = 2;
        int32_t *tok = malloc((size_t)n * 4);
        for (int i = 0; i < n; i++) tok[i] = (int32_t)(hyla_rng_next(&rng) % (uint64_t)cfg->vocab_size);
        fprintf(stderr, "hyla-bench restore: %s, %d tokens: prefill\n", cfg->model_type, n);
        hyla_session *s0;
        double prefill_s = feed_timed(&d, rt, tok, n, &s0);
        hyla_snapshot *snap;
        RTRY(hyla_session_export(s0, &snap));
        uint64_t bytes = hyla_snapshot_bytes(snap), kv = 0;
        for (uint32_t i = 0; i < snap->n_parts; i++)
            if (snap->parts[i].kind == HYLA_PART_KV) kv += snap->parts[i].nbytes;
        /* into the store */
        snprintf(dbdir, sizeof dbdir, "%s/db%d", base, ci);
        hyla_store_params sp = hyla_store_default_params();
        sp.codec = cp;
        hyla_store *st;
        hyla_store_put_stats ps;
        RTRY(hyla_store_open(dbdir, &sp, &st));
        double t = hyla_now();
        RTRY(hyla_store_put(st, "bench", snap, NULL, &ps));
        double put_s = hyla_now() - t;
        /* restore from the store, streaming: once cold, then --repeat times */
        hyla_session *s1 = NULL;
        hyla_restore_stats rst;
        RTRY(d.O->sync(d.cx));
        double tc = hyla_now();
        RTRY(hyla_restore_session(rt, st, "bench", 0, &s1, NULL, &rst));
        RTRY(d.O->sync(d.cx));
        double cold_s = hyla_now() - tc;
        double tot_v[16], open_v[16], read_v[16], tail_v[16];
        for (int r = 0; r < repeat; r++) {
            hyla_session_free(s1);
            s1 = NULL;
            RTRY(d.O->sync(d.cx));
            double t0 = hyla_now();
            RTRY(hyla_restore_session(rt, st, "bench", 0, &s1, NULL, &rst));
            RTRY(d.O->sync(d.cx));
            tot_v[r] = hyla_now() - t0;
            open_v[r] = rst.seconds_open;
            read_v[r] = rst.seconds_read;
            tail_v[r] = rst.seconds_tail;
        }
        double best = tot_v[0];
        for (int r = 1; r < repeat; r++)
            if (tot_v[r] < best) best = tot_v[r];
        double restore_s = hyla_bench_median(tot_v, repeat), open_s = hyla_bench_median(open_v, repeat),
               read_s = hyla_bench_median(read_v, repeat), tail_s = hyla_bench_median(tail_v, repeat);
        /* the two-step path: get into malloc'ed memory, then import */
        double get_v[16], imp_v[16], leg_v[16];
        for (int r = 0; r < repeat; r++) {
            hyla_session *sl = NULL;
            RTRY(d.O->sync(d.cx));
            hyla_snapshot *got;
            double t0 = hyla_now();
            RTRY(hyla_store_get(st, "bench", 0, fp, &got, NULL));
            double t1 = hyla_now();
            RTRY(hyla_session_import(rt, got, &sl));
            RTRY(d.O->sync(d.cx));
            double t2 = hyla_now();
            hyla_snapshot_destroy(got);
            hyla_session_free(sl);
            get_v[r] = t1 - t0, imp_v[r] = t2 - t1, leg_v[r] = t2 - t0;
        }
        double get_s = hyla_bench_median(get_v, repeat), imp_s = hyla_bench_median(imp_v, repeat),
               legacy_s = hyla_bench_median(leg_v, repeat);
        hyla_store_close(st);
        /* the restored session continues exactly as the original */
        int V = cfg->vocab_size;
        float *la = malloc((size_t)V * 4), *lb = malloc((size_t)V * 4);
        int32_t ta, tb;
        RTRY(hyla_session_decode(&s0, 1, &ta, la));
        RTRY(hyla_session_decode(&s1, 1, &tb, lb));
        int same_logits = ta == tb && !memcmp(la, lb, (size_t)V * 4);
        free(la);
        free(lb);
        /* re-prefill the same tokens */
        fprintf(stderr, "hyla-bench restore: %d tokens: re-prefill\n", n);
        hyla_session *s2;
        double reprefill_s = feed_timed(&d, rt, tok, n, &s2);
        hyla_snapshot *snap2;
        RTRY(hyla_session_export(s2, &snap2));
        int same_state = hyla_snapshot_equal(snap, snap2);
        hyla_snapshot_destroy(snap2);
        hyla_session_free(s2);
        if (!same_logits || !same_state) rc = 1;
        /* references: host -> device bandwidth; decode while exporting */
        double pinned, pageable;
        size_t bw_bytes;
        export_costs xc;
        bandwidths(&d, bytes, &pinned, &pageable, &bw_bytes);
        decode_vs_export(&d, s1, steps, &xc);
        printf("{\"bench\":\"restore\",\"device\":\"%s\",\"gpu\":\"%s\",\"model\":\"%s\",\"type\":\"%s\","
               "\"layers\":%d,\"hidden\":%d,\"ctx\":%d,\"state_bytes\":%" PRIu64 ",\"kv_bytes\":%" PRIu64
               ",\"stored_bytes\":%" PRIu64 ",\"put_s\":%.4f,\"repeat\":%d,\"restore_s\":%.4f,\"restore_best_s\":%.4f,"
               "\"restore_cold_s\":%.4f,\"restore_open_s\":%.4f,\"restore_read_s\":%.4f,\"restore_tail_s\":%.4f,\"restore_ranges\":%" PRIu64
               ",\"restore_copy_calls\":%" PRIu64 ",\"restore_gbps\":%.2f,\"prefill_s\":%.4f,"
               "\"reprefill_s\":%.4f,\"reprefill_over_restore\":%.1f,\"pinned_h2d_gbps\":%.2f,"
               "\"pageable_h2d_gbps\":%.2f,\"h2d_test_bytes\":%zu,\"restore_of_pinned\":%.3f,"
               "\"legacy_get_s\":%.4f,\"legacy_import_s\":%.4f,\"legacy_restore_s\":%.4f,"
               "\"codec_threads\":%d,\"zstd_level\":%d,\"chunk_bytes\":%u,\"decode_ms\":%.3f,"
               "\"decode_ms_exporting\":%.3f,\"exports_completed\":%d,\"decode_steps\":%d,"
               "\"export_begin_ms\":%.3f,\"export_end_ms\":%.3f,\"step_ms_export_began\":%.3f,"
               "\"step_ms_export_running\":%.3f,"
               "\"same_logits\":%s,\"reprefill_same_state\":%s}\n",
               d.device, d.gpu, model_dir, cfg->model_type, cfg->num_layers, cfg->hidden_size, n, bytes, kv,
               ps.bytes_written, put_s, repeat, restore_s, best, cold_s, open_s, read_s, tail_s, rst.ranges, rst.copy_calls,
               bytes / restore_s / 1e9, prefill_s, reprefill_s, reprefill_s / restore_s, pinned, pageable, bw_bytes,
               bytes / restore_s / 1e9 / pinned, get_s, imp_s, legacy_s, cp.threads ? cp.threads : hyla_online_cores(),
               cp.zstd_level, cp.chunk_bytes, xc.plain_ms, xc.busy_ms, xc.n_exp, steps, xc.begin_ms, xc.end_ms, xc.step_begin_ms,
               xc.step_other_ms, same_logits ? "true" : "false",
               same_state ? "true" : "false");
        fflush(stdout);
        hyla_snapshot_destroy(snap);
        hyla_session_free(s0);
        hyla_session_free(s1);
        free(tok);
    }
    char cmd[800];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", base);
    if (system(cmd) != 0) fprintf(stderr, "hyla-bench restore: could not remove %s\n", base);
    hyla_runtime_free(rt);
    hyla_model_free(m);
    hyla_backend_destroy(d.be);
    return rc;
}
