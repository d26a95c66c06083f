/* test_gpu_e2e.c — whole tiny models on cuda:0 against the CPU reference backend, through the
 * runtime (worker/hyla_session.h), for gla-h, gdn, sse-h, sse-gdn, gdn-h (sliding-window
 * attention), mamba2-h and statex-mamba2 (state size 512: the chunked prefill as key slabs),
 * statex-gla (width 2048: GLA dk 1024, dv 2048 through the key slabs), lalte
 * (GDN + LTE attention), lansa (GDN + NSA), dla-gdn and dla-mamba2:
 *   1. prompt logits (150 tokens: two full chunks and a partial one) within tolerance of the
 *      CPU's, then greedy tokens: equal to the CPU's while the CPU's top-2 margin is clear
 *      (> LOGIT_MARGIN); at the first divergence the margin must be a near tie at the scale
 *      of that step's measured rounding (below LOGIT_MARGIN, or below NEAR_TIE_RMS times the
 *      rms of the two backends' logit differences at that step, whose histories are still
 *      equal: the largest of V such deviations is about 4 rms, and two of them can flip a
 *      pair whose margin is below their sum), and the comparison stops there (lalte and DLA with live
 *      boundaries: reported only, as the fp32 and bf16 values may retain other tokens or draw
 *      other boundaries; see test_arch);
 *   2. determinism and pause/resume on the GPU, bit for bit: the same run twice; "decode 20"
 *      == "decode 10, export, import, decode 10"; chunk-aligned pieces == one piece;
 *   3. batch invariance on the GPU, bit for bit: 3 and 40 sessions decoded together == each alone;
 *   4. GPU -> CPU and CPU -> GPU resume: a snapshot taken on one backend imports on the other
 *      and the continuation's logits stay within tolerance of the uninterrupted run (LTE
 *      caches' k, v rows are converted between the backends' KV types on import);
 *   5. CUDA graphs (on by default, so 1-4 run with them): decoding with graphs on == with
 *      graphs off, bit for bit (same kernels, same arguments), and graphs were replayed;
 *   6. asynchronous export on the GPU: begin, decode 12 more tokens on the same session (their
 *      kernels run while the copies may still be in flight), end == the synchronous export
 *      taken at begin, bit for bit; imported, it continues like the uninterrupted session
 *      (tokens and logits, bits), and so it does through the streaming import (asynchronous
 *      host -> device copies of ranges) and restored from a RocksDB store (hyla_restore_session).
 * Tolerance: logits are O(1..10); the GPU computes projections with bf16 operands (relative
 * error ~2^-9 per product) and chunked mixers with bf16 operands, so logits differ from the
 * fp32 CPU by ~1e-2 relative: rel L2 <= 5e-2 per step. Skips (77) without a usable GPU.
 * Arguments (optional): the archs to run, e.g. `test_gpu_e2e mamba2-h` (default: all). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_cuda_extra.h"
#include "hyla_restore.h"
#include "hyla_session.h"
#include "hyla_test.h"
#include "hyla_test_model.h"

#define LOGIT_TOL 5e-2
#define LOGIT_MARGIN 0.05
#define NEAR_TIE_RMS 8.0

static hyla_backend *cpu, *gpu;

static void make_model(const char *arch, const char *dir, const char *extra) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "rm -rf %s && %s/hyla-mkmodel --arch %s --layers 6 --hidden 128 --heads 4 --seed 7 %s --out %s "
             "2>/dev/null",
             dir, hyla_test_env("HYLA_BIN_DIR", "build/bin"), arch, extra ? extra : "", dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "cannot run: %s\n", cmd);
        exit(1);
    }
}

static double rms_diff(const float *a, const float *b, int n) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    return sqrt(ss / n);
}

static double top2_margin(const float *l, int V) {
    double a = -INFINITY, b = -INFINITY;
    for (int i = 0; i < V; i++) {
        if (l[i] > a) {
            b = a;
            a = l[i];
        } else if (l[i] > b) {
            b = l[i];
        }
    }
    return a - b;
}

static hyla_session *sess(hyla_runtime *m) {
    hyla_session *s = NULL;
    CHECK_OK(hyla_session_create(m, &s));
    hyla_sampling sp = {0, 0, 1};
    if (s) hyla_session_set_sampling(s, sp, 1);
    return s;
}

/* greedy decode n steps, tokens and logits [n][V] */
static void gen(hyla_session *s, int n, int32_t *tok, float *logits, int V) {
    for (int i = 0; i < n; i++)
        CHECK_OK(hyla_session_decode(&s, 1, &tok[i], logits ? logits + (size_t)i * V : NULL));
}

/* discrete: the model makes discrete choices from bf16-computed values (LTE's retained tokens,
 * DLA's boundaries and merges), so the GPU's choices may differ from the CPU's fp32 ones and the
 * comparisons with the CPU are reported, not enforced (test_gpu_ops shows that the same inputs
 * give the same choices); the GPU's own bit identities still are. */
static void test_arch(const char *arch, const char *extra, int discrete) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/gpu_e2e_%s%s", hyla_test_env("HYLA_BUILD_DIR", "/tmp"), arch,
             !strncmp(arch, "dla-", 4) && !discrete ? "_one_state" : "");
    /* SSE: windows of 64, so that pieces of 64 below are pieces of the model's prefill chunk (the
     * default window's pieces: test_gpu_ops "sse_plan", test_engine on the CPU) */
    char ex[256];
    snprintf(ex, sizeof ex, "%s%s", extra ? extra : "", !strncmp(arch, "sse", 3) ? " --prefill-window 64" : "");
    make_model(arch, dir, ex);
    hyla_runtime *mc = NULL, *mg = NULL;
    mc = test_load(dir, cpu, NULL);
    mg = test_load(dir, gpu, NULL);
    if (!mc || !mg) return;
    int V = hyla_model_get_config(test_model(mc))->vocab_size, T = 150, G = 24;
    int32_t *p = test_prompt(T, 11, V);
    printf("%s %s\n", arch, extra ? extra : "");

    /* 1. prompt logits and greedy tokens vs CPU */
    float *lc = malloc((size_t)T * V * 4), *lg = malloc((size_t)T * V * 4);
    hyla_session *sc = sess(mc), *sg = sess(mg);
    CHECK_OK(hyla_session_feed(sc, p, T, lc, NULL, NULL, NULL));
    CHECK_OK(hyla_session_feed(sg, p, T, lg, NULL, NULL, NULL));
    double r = hyla_test_rel_l2(lg, lc, (size_t)(T - 1) * V);
    int dla = !strncmp(arch, "dla-", 4) && discrete; /* LTE's prompt logits stay within tolerance */
    printf("  prompt logits (149 rows): rel L2 %.2e %s\n", r,
           r <= LOGIT_TOL ? "ok" : dla ? "(reported: DLA boundaries may differ)" : "FAIL");
    CHECK_MSG(dla || r <= LOGIT_TOL, "%s: prompt logits rel %.3e", arch, r);
    int32_t tc[24], tg[24];
    float *gc = malloc((size_t)G * V * 4), *gg = malloc((size_t)G * V * 4);
    gen(sc, G, tc, gc, V);
    gen(sg, G, tg, gg, V);
    /* LTE keeps or drops a token by comparing scores computed from the cached k, v: fp32 on the
     * CPU, bf16 on the GPU, so the two backends may retain different tokens (test_gpu_ops shows
     * that the same k, v give the same members) and their logits then differ by more than the
     * rounding tolerance. For lalte the greedy comparison is reported, not enforced; the prompt
     * logits, the GPU's own bit identities and cross-backend resume still are. */
    int same = 0;
    double worst = 0;
    for (int i = 0; i < G; i++) {
        double ri = hyla_test_rel_l2(gg + (size_t)i * V, gc + (size_t)i * V, V);
        if (ri > worst) worst = ri; /* this step's logits were computed from identical histories */
        if (tc[i] != tg[i]) {
            double mgn = top2_margin(gc + (size_t)i * V, V), rms = rms_diff(gg + (size_t)i * V, gc + (size_t)i * V, V);
            printf("  greedy tokens diverge at step %d (cpu %d, gpu %d, cpu top-2 margin %.3f, logit difference rms %.4f)\n",
                   i, tc[i], tg[i], mgn, rms);
            CHECK_MSG(discrete || mgn < LOGIT_MARGIN || mgn < NEAR_TIE_RMS * rms,
                      "%s: tokens diverge at step %d with a clear margin %.3f (logit difference rms %.4f)", arch, i, mgn, rms);
            break;
        }
        same++;
    }
    printf("  greedy: %d/%d tokens equal to the CPU run, logits rel L2 <= %.2e %s\n", same, G, worst,
           worst <= LOGIT_TOL ? "ok" : discrete ? "(reported: discrete choices may differ)" : "FAIL");
    CHECK_MSG(discrete || worst <= LOGIT_TOL, "%s: decode logits rel %.3e", arch, worst);
    hyla_session_free(sc);
    hyla_session_free(sg);

    /* 1b. prefill pieces of 64 tokens (skinny linears, one chunk per mixer call) give the logits
     * of the default piece (one 149-row forward: the large-M GEMM, multi-chunk mixer calls) */
    {
        float *l64 = malloc((size_t)T * V * 4);
        CHECK_OK(hyla_runtime_set_prefill_piece(mg, 64));
        hyla_session *s64 = sess(mg);
        CHECK_OK(hyla_session_feed(s64, p, T, l64, NULL, NULL, NULL));
        int ok = !memcmp(l64, lg, (size_t)(T - 1) * V * 4);
        printf("  prefill in 64-token pieces == one piece of %d: %s\n", T - 1, ok ? "bits" : "FAIL");
        CHECK_MSG(ok, "%s: GPU prefill pieces of 64 differ from one piece", arch);
        CHECK_OK(hyla_runtime_set_prefill_piece(mg, HYLA_PREFILL_PIECE_DEFAULT));
        hyla_session_free(s64);
        free(l64);
    }

    /* 2. determinism, chunk-aligned pieces, pause/resume on the GPU (bits) */
    {
        hyla_session *a = sess(mg), *b = sess(mg), *c = sess(mg);
        CHECK_OK(hyla_session_feed(a, p, T, NULL, NULL, NULL, NULL));
        CHECK_OK(hyla_session_feed(b, p, 65, NULL, NULL, NULL, NULL));
        CHECK_OK(hyla_session_feed(b, p + 65, 64, NULL, NULL, NULL, NULL));
        CHECK_OK(hyla_session_feed(b, p + 129, T - 129, NULL, NULL, NULL, NULL));
        CHECK_OK(hyla_session_feed(c, p, T, NULL, NULL, NULL, NULL));
        hyla_snapshot *sa = NULL, *sb = NULL;
        CHECK_OK(hyla_session_export(a, &sa));
        CHECK_OK(hyla_session_export(b, &sb));
        CHECK_MSG(sa && sb && hyla_snapshot_equal(sa, sb), "%s: GPU chunk-aligned pieces differ from one piece", arch);
        int32_t t1[20], t2[20];
        float *l1 = malloc((size_t)20 * V * 4), *l2 = malloc((size_t)20 * V * 4);
        gen(a, 20, t1, l1, V);
        gen(c, 10, t2, l2, V);
        hyla_snapshot *mid = NULL;
        CHECK_OK(hyla_session_export(c, &mid));
        hyla_session_free(c);
        c = NULL;
        CHECK_OK(hyla_session_import(mg, mid, &c));
        if (c) gen(c, 10, t2 + 10, l2 + (size_t)10 * V, V);
        int ok = !memcmp(t1, t2, sizeof t1) && !memcmp(l1, l2, (size_t)20 * V * 4);
        printf("  GPU pause/resume (decode 10, export, import, decode 10) == uninterrupted: %s\n", ok ? "bits" : "FAIL");
        CHECK_MSG(ok, "%s: GPU pause/resume differs", arch);
        /* GPU -> CPU: import mid on the CPU model, continue 10 */
        hyla_session *x = NULL;
        CHECK_OK(hyla_session_import(mc, mid, &x));
        if (x) {
            int32_t t3[10];
            float *l3 = malloc((size_t)10 * V * 4);
            gen(x, 10, t3, l3, V);
            int eq = 0;
            while (eq < 10 && t3[eq] == t1[10 + eq]) eq++;
            double rr = hyla_test_rel_l2(l3, l1 + (size_t)10 * V, (size_t)(eq > 0 ? eq : 1) * V);
            printf("  GPU -> CPU resume: %d/10 tokens equal to the GPU run, logits rel L2 %.2e %s\n", eq, rr,
                   rr <= LOGIT_TOL ? "ok" : dla ? "(reported)" : "FAIL");
            CHECK_MSG(dla || rr <= LOGIT_TOL, "%s: GPU->CPU continuation logits rel %.3e", arch, rr);
            if (eq < 10 && !dla)
                CHECK_MSG(top2_margin(l1 + (size_t)(10 + eq) * V, V) < LOGIT_MARGIN,
                          "%s: GPU->CPU continuation diverges with a clear margin", arch);
            free(l3);
            hyla_session_free(x);
        }
        /* CPU -> GPU: a CPU session's snapshot continues on the GPU */
        hyla_session *cs = sess(mc), *cg = NULL;
        CHECK_OK(hyla_session_feed(cs, p, T, NULL, NULL, NULL, NULL));
        hyla_snapshot *cm = NULL;
        CHECK_OK(hyla_session_export(cs, &cm));
        CHECK_OK(hyla_session_import(mg, cm, &cg));
        if (cg) {
            int32_t t4[10], t5[10];
            float *l4 = malloc((size_t)10 * V * 4), *l5 = malloc((size_t)10 * V * 4);
            gen(cs, 10, t4, l4, V);
            gen(cg, 10, t5, l5, V);
            int eq = 0;
            while (eq < 10 && t4[eq] == t5[eq]) eq++;
            double rr = hyla_test_rel_l2(l5, l4, (size_t)(eq > 0 ? eq : 1) * V);
            printf("  CPU -> GPU resume: %d/10 tokens equal to the CPU run, logits rel L2 %.2e %s\n", eq, rr,
                   rr <= LOGIT_TOL ? "ok" : dla ? "(reported)" : "FAIL");
            CHECK_MSG(dla || rr <= LOGIT_TOL, "%s: CPU->GPU continuation logits rel %.3e", arch, rr);
            free(l4);
            free(l5);
            hyla_session_free(cg);
        }
        hyla_snapshot_destroy(cm);
        hyla_session_free(cs);
        hyla_snapshot_destroy(mid);
        hyla_snapshot_destroy(sa);
        hyla_snapshot_destroy(sb);
        free(l1);
        free(l2);
        hyla_session_free(a);
        hyla_session_free(b);
        hyla_session_free(c);
    }

    /* 3. batch == alone on the GPU (bits): 3 sessions (the skinny linears), and 40 (from 33 rows
     * the linears take the warpgroup forms, launched to overlap the kernel ahead) */
    for (int NB = 3; NB <= 40; NB += 37) {
        hyla_session *bs[40], *ss[40];
        for (int i = 0; i < NB; i++) {
            const int off = 7 * (i % 3) + i / 3, len = 30 + 40 * (i % 3);
            bs[i] = sess(mg);
            ss[i] = sess(mg);
            CHECK_OK(hyla_session_feed(bs[i], p + off, len, NULL, NULL, NULL, NULL));
            CHECK_OK(hyla_session_feed(ss[i], p + off, len, NULL, NULL, NULL, NULL));
        }
        int ok = 1;
        float *lb = malloc((size_t)NB * V * 4), *ls = malloc((size_t)V * 4);
        for (int step = 0; step < 8; step++) {
            int32_t ob[40], os[40];
            CHECK_OK(hyla_session_decode(bs, NB, ob, lb));
            for (int i = 0; i < NB; i++) {
                CHECK_OK(hyla_session_decode(&ss[i], 1, &os[i], ls));
                ok &= ob[i] == os[i] && !memcmp(ls, lb + (size_t)i * V, (size_t)V * 4);
            }
        }
        printf("  GPU batch of %d == each alone (8 steps): %s\n", NB, ok ? "bits" : "FAIL");
        CHECK_MSG(ok, "%s: GPU batched decode of %d differs from single decode", arch, NB);
        for (int i = 0; i < NB; i++) {
            hyla_session_free(bs[i]);
            hyla_session_free(ss[i]);
        }
        free(lb);
        free(ls);
    }
    /* 5. graphs on == graphs off (bits), prefill and decode */
    {
        hyla_cuda_graph_stats g0, g1;
        CHECK_OK(hyla_cuda_get_graph_stats(gpu, &g0));
        hyla_session *on = sess(mg), *off = sess(mg);
        int32_t ton[16], toff[16];
        float *lon = malloc((size_t)16 * V * 4), *loff = malloc((size_t)16 * V * 4);
        CHECK_OK(hyla_session_feed(on, p, T, NULL, NULL, NULL, NULL));
        gen(on, 16, ton, lon, V);
        CHECK_OK(hyla_cuda_get_graph_stats(gpu, &g1));
        CHECK_OK(hyla_cuda_set_graphs(gpu, 0));
        CHECK_OK(hyla_session_feed(off, p, T, NULL, NULL, NULL, NULL));
        gen(off, 16, toff, loff, V);
        CHECK_OK(hyla_cuda_set_graphs(gpu, 1));
        int ok = !memcmp(ton, toff, sizeof ton) && !memcmp(lon, loff, (size_t)16 * V * 4);
        printf("  graphs on == off (prefill %d + decode 16): %s; %llu graph launches, %llu captures\n", T,
               ok ? "bits" : "FAIL", (unsigned long long)(g1.replays - g0.replays),
               (unsigned long long)(g1.captures - g0.captures));
        CHECK_MSG(ok, "%s: decode with CUDA graphs differs from decode without", arch);
        CHECK_MSG(g1.replays - g0.replays >= 10, "%s: decode steps were not replayed as graphs", arch);
        free(lon);
        free(loff);
        hyla_session_free(on);
        hyla_session_free(off);
    }
    /* 6. asynchronous export overlapping decode (bits) */
    {
        enum { NA = 12 };
        hyla_session *a = sess(mg), *r = NULL;
        CHECK_OK(hyla_session_feed(a, p, T, NULL, NULL, NULL, NULL));
        hyla_snapshot *ref = NULL, *snap = NULL;
        hyla_export *e = NULL;
        int32_t t1[NA], t2[NA];
        float *l1 = malloc((size_t)NA * V * 4), *l2 = malloc((size_t)NA * V * 4);
        CHECK_OK(hyla_session_export(a, &ref));
        CHECK_OK(hyla_session_export_begin(a, &e));
        int done_early = e ? hyla_session_export_done(e) : 1;
        gen(a, NA, t1, l1, V);
        if (e) CHECK_OK(hyla_session_export_end(e, &snap));
        int eq = ref && snap && hyla_snapshot_equal(ref, snap);
        if (snap) CHECK_OK(hyla_session_import(mg, snap, &r));
        int cont = 0;
        if (r) {
            gen(r, NA, t2, l2, V);
            cont = !memcmp(t1, t2, sizeof t1) && !memcmp(l1, l2, (size_t)NA * V * 4);
            hyla_session_free(r);
        }
        printf("  async export (begin, decode %d, end) == sync export at begin: %s; continues: %s%s\n", NA,
               eq ? "bits" : "FAIL", cont ? "bits" : "FAIL", done_early ? " (copies done at begin)" : "");
        CHECK_MSG(eq, "%s: GPU async export differs from the synchronous export at its position", arch);
        CHECK_MSG(cont, "%s: GPU async export continues differently", arch);
        /* the streaming import (asynchronous copies from the pinned snapshot, ranges in pieces
         * and in reverse order) and a restore through a RocksDB store continue the same way */
        int cont_stream = 0, cont_store = 0;
        if (snap) {
            r = test_streamed_import(mg, snap, 4096);
            if (r) {
                gen(r, NA, t2, l2, V);
                cont_stream = !memcmp(t1, t2, sizeof t1) && !memcmp(l1, l2, (size_t)NA * V * 4);
                hyla_session_free(r);
            }
            char sd[] = "/tmp/hyla-gpu-e2e-store-XXXXXX";
            hyla_store *st = NULL;
            hyla_store_params sp = hyla_store_default_params();
            sp.codec.chunk_bytes = 8192; /* many chunks: many copy batches */
            r = NULL;
            if (mkdtemp(sd) && hyla_store_open(sd, &sp, &st) == HYLA_OK) {
                CHECK_OK(hyla_store_put(st, "g", snap, NULL, NULL));
                CHECK_OK(hyla_restore_session(mg, st, "g", 0, &r, NULL, NULL));
                hyla_store_close(st);
            } else {
                CHECK_MSG(0, "cannot make a store in %s: %s", sd, hyla_last_error());
            }
            char cmd[128];
            snprintf(cmd, sizeof cmd, "rm -rf %s", sd);
            if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", sd);
            if (r) {
                gen(r, NA, t2, l2, V);
                cont_store = !memcmp(t1, t2, sizeof t1) && !memcmp(l1, l2, (size_t)NA * V * 4);
                hyla_session_free(r);
            }
        }
        printf("  streamed import continues: %s; restored from a store continues: %s\n", cont_stream ? "bits" : "FAIL",
               cont_store ? "bits" : "FAIL");
        CHECK_MSG(cont_stream, "%s: GPU streamed import continues differently", arch);
        CHECK_MSG(cont_store, "%s: GPU restore from a store continues differently", arch);
        hyla_snapshot_destroy(ref);
        hyla_snapshot_destroy(snap);
        free(l1);
        free(l2);
        hyla_session_free(a);
    }
    free(lc);
    free(lg);
    free(gc);
    free(gg);
    free(p);
    test_unload(mc);
    test_unload(mg);
}

static int n_only;
static char **only; /* argv: run only these archs (none: all) */
static int wanted(const char *arch) {
    for (int i = 0; i < n_only; i++)
        if (!strcmp(only[i], arch)) return 1;
    return n_only == 0;
}

int main(int argc, char **argv) {
    n_only = argc - 1;
    only = argv + 1;
    if (!hyla_cuda_available()) {
        printf("test_gpu_e2e: SKIPPED — no usable CUDA device (or the CUDA backend is not built)\n");
        return 77;
    }
    if (hyla_backend_create("cpu", &cpu) != HYLA_OK || hyla_backend_create("cuda:0", &gpu) != HYLA_OK) {
        fprintf(stderr, "test_gpu_e2e: %s\n", hyla_last_error());
        return 1;
    }
    if (wanted("gla-h")) test_arch("gla-h", NULL, 0);
    if (wanted("gdn")) test_arch("gdn", NULL, 0);
    if (wanted("sse-h")) test_arch("sse-h", NULL, 0);
    if (wanted("sse-gdn")) test_arch("sse-gdn", NULL, 0);
    if (wanted("gdn-h")) test_arch("gdn-h", "--window 40", 0);
    if (wanted("mamba2-h")) test_arch("mamba2-h", NULL, 0);
    if (wanted("statex-mamba2")) test_arch("statex-mamba2", NULL, 0);
    /* StateX's merged GLA heads at width 2048: 4 heads of dk 256, dv 512 merged into one of dk
     * 1024, dv 2048 at all 4 layers (the key-slab path) */
    if (wanted("statex-gla")) test_arch("statex-gla", "--hidden 2048 --layers 4", 0);
    /* LTE and NSA hybrids: a window, sink and budget small enough that 150 tokens evict, retain
     * and replace; blocks of 8, 4 selected, a window of 16 (as test_engine) */
    if (wanted("lalte")) test_arch("lalte", "--window 16 --sink 2 --budget 6", 1);
    if (wanted("lansa")) test_arch("lansa", "--window 16 --block-size 8 --block-counts 4", 0);
    /* DLA: thresholds where some tokens of this model open states (and caches fill and merge),
     * compared with the CPU as discrete; and a threshold no score reaches (one state per head, the
     * same choices on both backends), compared within tolerance */
    if (wanted("dla-gdn")) {
        test_arch("dla-gdn", "--dla-capacity 3 --dla-threshold 1.43", 1);
        /* seed 10 (mkmodel takes the last --seed): the CPU's 24 greedy steps all have a top-2 gap
         * >= 0.148; seed 7's step 4 is a near tie (0.060) that bf16 rounding flips */
        test_arch("dla-gdn", "--dla-capacity 3 --dla-threshold 1000 --seed 10", 0);
    }
    if (wanted("dla-mamba2")) {
        test_arch("dla-mamba2", "--dla-capacity 3 --dla-threshold 1.4", 1);
        test_arch("dla-mamba2", "--dla-capacity 3 --dla-threshold 1000", 0);
    }
    hyla_cuda_graph_stats gs;
    CHECK_OK(hyla_cuda_get_graph_stats(gpu, &gs));
    printf("graphs: %llu segments (%llu ops), %llu graph launches, %llu captures, %llu capture failures, %llu "
           "segments op by op, %llu evictions, %u cached\n",
           (unsigned long long)gs.segments, (unsigned long long)gs.ops, (unsigned long long)gs.replays,
           (unsigned long long)gs.captures, (unsigned long long)gs.capture_failures,
           (unsigned long long)gs.eager_segments, (unsigned long long)gs.evictions, gs.cached);
    hyla_backend_destroy(gpu);
    hyla_backend_destroy(cpu);
    return hyla_test_done("test_gpu_e2e");
}
