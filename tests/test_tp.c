/* test_tp.c — tensor parallelism on the CPU backend (worker/hyla_tp.h), for the kinds that can
 * be split (every kind we serve, in every hybrid hyla-mkmodel makes), with two ranks in one process, driven through
 * the ordinary session calls on rank 0's runtime:
 *   - prompt logits are the unsplit model's within 1e-4 + 1e-4 relative (the sums over ranks round
 *     differently), and the greedy tokens are the unsplit model's;
 *   - snapshots are whole-model snapshots: the split session's has the unsplit layout and
 *     continues on one rank with the same tokens, and one rank's continues split
 *     (TP = 2 -> TP = 1 -> TP = 2); cutting and joining a snapshot move bytes only;
 *   - within the split, sampled at T = 0.9: pause/resume and a decode batch of two give the
 *     tokens of each session alone; sessions are refused on another rank's runtime;
 *   - within the split, a 300-token piece (run as two halves whose sums overlap the other
 *     half's work, HYLA_TP_WAVE=1) gives the logits of 64-token pieces, bit for bit; by default
 *     GDN and SSE-H (paged KV) run it in halves, HYLA_TP_WAVE=0 whole, 1 in halves, all with
 *     the same logits; HYLA_TP_SUM refuses a value it does not know;
 *   - refusals name the reason: heads (or KV heads) not divisible by the split, a kind that cannot
 *     be split, another model's snapshot;
 *   - sse-h: the streaming import is refused on the split runtime, and hyla_restore_session from a
 *     RocksDB store (its two-step path there) continues with the same tokens.
 * Four ranks (models with 4 KV heads; the archs whose heads split in four) run the same checks
 * after the two-rank ones on the CPU, and `test_tp cuda4` on cuda:0..3: there every sum is a
 * peer sum (rank order), so the 300-token piece in halves equals 64-token pieces (with
 * HYLA_TP_SUM=nccl the whole pieces' sums are NCCL's, round differently, and it fails).
 * `test_tp cuda` runs the same on cuda:0 and cuda:1, first checking that a kernel whose
 * launch needs an opt-in shared-memory attribute (the large-M linear), used first on cuda:0,
 * then runs on cuda:1 with the same bits: the attribute is the device's, not the process's, and
 * after the archs runs GDN and SSE-H again with every one-shot sum in its push form
 * (HYLA_TP_PUSH_MIN=0). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hyla_restore.h"
#include "hyla_session.h"
#include "hyla_test.h"
#include "hyla_test_model.h"
#include "hyla_tp.h"

enum { TMAX = 4, N = 40, G = 12, H1 = 6, NW = 300 };
static int T = 2; /* ranks: 2, or 4 for `test_tp cuda4` */

static const char *ARCHS[] = {"gla",    "gdn",    "transformer", "gdn-h",   "gla-h",         "sse",     "sse-gdn",
                              "sse-h",  "nsa",    "lansa",       "lalte",   "mamba2",        "mamba2-h", "statex-mamba2",
                              "dla-gdn", "dla-mamba2"};

static void make_model(const char *arch, const char *dir) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "rm -rf %s && %s/hyla-mkmodel --arch %s --layers 3 --hidden 64 --heads 4 %s%s--seed 7 --out %s 2>/dev/null",
             dir, hyla_test_env("HYLA_BIN_DIR", "build/bin"), arch, T > 2 ? "--kv-heads 4 " : "",
             /* SSE: windows of 64, so that the 300-token piece splits into halves and 64-token pieces */
             !strncmp(arch, "sse", 3) ? "--prefill-window 64 " : "", dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "cannot run: %s\n", cmd);
        exit(1);
    }
}

static hyla_session *new_session(hyla_runtime *rt, float temp) {
    hyla_session *s = NULL;
    CHECK_OK(hyla_session_create(rt, &s));
    hyla_sampling sp = {temp, temp > 0 ? 40 : 0, temp > 0 ? 0.95f : 1.0f};
    if (s) hyla_session_set_sampling(s, sp, 5);
    return s;
}

/* Feed the prompt (logits may be NULL), decode G tokens, exporting before step H1 (mid may be
 * NULL); with reload, the session is freed after the export and the rest decoded from it. */
static void run(hyla_runtime *rt, const int32_t *p, float temp, float *logits, int32_t *tok, hyla_snapshot **mid,
                int reload) {
    hyla_session *s = new_session(rt, temp);
    if (!s) return;
    CHECK_OK(hyla_session_feed(s, p, N, logits, NULL, NULL, NULL));
    for (int i = 0; s && i < G; i++) {
        if (i == H1 && mid) {
            CHECK_OK(hyla_session_export(s, mid));
            if (reload && *mid) {
                hyla_session_free(s);
                s = NULL;
                CHECK_OK(hyla_session_import(rt, *mid, &s));
                if (!s) return;
            }
        }
        CHECK_OK(hyla_session_decode(&s, 1, &tok[i], NULL));
    }
    hyla_session_free(s);
}

/* Decode H1 .. G-1 from a snapshot taken before step H1. */
static void resume(hyla_runtime *rt, const hyla_snapshot *mid, int32_t *tok) {
    hyla_session *s = NULL;
    CHECK_OK(hyla_session_import(rt, mid, &s));
    for (int i = H1; s && i < G; i++) CHECK_OK(hyla_session_decode(&s, 1, &tok[i], NULL));
    hyla_session_free(s);
}

static const char *g_dev = "cpu"; /* or "cuda": the unsplit model on cuda:0, the ranks on cuda:0, 1 */
static double g_tol = 1e-4;

/* kernels/cuda/hyla_cuda_extra.h: the kernel-form switches of a backend, and the rows from which
 * the warpgroup linear runs (CUDA builds) */
hyla_status hyla_cuda_switches(hyla_backend *be, char *buf, size_t len) __attribute__((weak));
hyla_status hyla_cuda_set_gemm_wg_min(hyla_backend *be, int rows) __attribute__((weak));

static void check_arch(const char *arch) {
    char dir[256];
    snprintf(dir, sizeof dir, "%s/tp_%s", hyla_test_env("HYLA_TMP", "/tmp"), arch);
    make_model(arch, dir);
    int cuda = !strcmp(g_dev, "cuda");
    hyla_backend *be1 = NULL;
    hyla_runtime *rts[TMAX] = {NULL};
    CHECK_OK(hyla_backend_create(cuda ? "cuda:0" : "cpu", &be1));
    hyla_runtime *rt1 = be1 ? test_load(dir, be1, NULL) : NULL;
    if (!rt1) return;
    int V = hyla_model_get_config(test_model(rt1))->vocab_size;
    int32_t *p = test_prompt(N, 11, V);
    size_t nl = (size_t)(N - 1) * V;
    float *l1 = malloc(nl * sizeof *l1), *lt = malloc(nl * sizeof *lt);
    int32_t tok1[G], tokt[G], tok[G];
    hyla_snapshot *mid1 = NULL, *midt = NULL;
    run(rt1, p, 0, l1, tok1, &mid1, 0);

    hyla_tp_group *g = NULL;
    hyla_status ost = hyla_tp_open(dir, cuda ? "cuda:0" : "cpu", T, NULL, &g);
    if (ost == HYLA_ERR_UNSUPPORTED && T > 2) { /* the test models have 4 heads, some 2 KV heads */
        printf("  %s: not split in %d (%s)\n", arch, T, hyla_last_error());
        goto out;
    }
    CHECK_OK(ost);
    if (!g || !mid1) goto out;
    for (int r = 0; r < T; r++) rts[r] = hyla_tp_rank_runtime(g, r);
    if (cuda && hyla_cuda_switches && !getenv("HYLA_CUDA_GEMM_WG_MIN")) {
        /* the warpgroup linear from 33 decode rows on one GPU, from 65 on a rank (its half-width
         * linears' faster form) */
        char s1[256] = "", sr[256] = "";
        CHECK_OK(hyla_cuda_switches(be1, s1, sizeof s1));
        CHECK_OK(hyla_cuda_switches(hyla_tp_rank_backend(g, T - 1), sr, sizeof sr));
        CHECK_MSG(strstr(s1, "gemm_wg_min=33 ") && strstr(sr, "gemm_wg_min=65 "),
                  "%s: switches of the unsplit model '%s', of a rank '%s'", arch, s1, sr);
        CHECK_MSG(hyla_cuda_set_gemm_wg_min(be1, 0) == HYLA_ERR_INVALID_ARG && strstr(hyla_last_error(), "0 rows"),
                  "hyla_cuda_set_gemm_wg_min(0): %s", hyla_last_error());
    }

    /* the split model against the unsplit one */
    run(rts[0], p, 0, lt, tokt, &midt, 0);
    if (!strcmp(g_dev, "cpu")) {
        CHECK_CLOSE(lt, l1, nl, g_tol, g_tol, arch);
    } else { /* as GPU-vs-GPU comparisons elsewhere: the largest difference against the largest logit */
        double md = 0, mx = 0;
        for (size_t i = 0; i < nl; i++) {
            double d = fabs((double)lt[i] - l1[i]);
            md = d > md ? d : md;
            mx = fabs(l1[i]) > mx ? fabs(l1[i]) : mx;
        }
        printf("  %s: prompt logits, split vs whole: max abs %.3g, relative to the largest %.3g\n", arch, md, md / mx);
        CHECK_MSG(md <= g_tol * mx, "%s: split logits differ from the whole model's by %.3g of the largest", arch, md / mx);
    }
    CHECK_MSG(!memcmp(tokt, tok1, sizeof tok1), "%s: greedy tokens of the split model differ from one rank's", arch);
    if (!midt) goto out;
    /* TP = 2 -> TP = 1 and TP = 1 -> TP = 2 */
    CHECK_OK(hyla_snapshot_check_layout(midt, mid1));
    resume(rt1, midt, tok);
    CHECK_MSG(!memcmp(tok + H1, tok1 + H1, (G - H1) * sizeof *tok), "%s: the split run's snapshot does not continue on one rank",
              arch);
    resume(rts[0], mid1, tok);
    CHECK_MSG(!memcmp(tok + H1, tok1 + H1, (G - H1) * sizeof *tok), "%s: one rank's snapshot does not continue split", arch);
    /* restore from a store onto the split: the streaming import is refused on a split runtime,
     * so hyla_restore_session takes the two-step path there, and continues the same */
    if (!strcmp(arch, "sse-h") && !cuda) {
        hyla_import *im = NULL;
        CHECK(hyla_session_import_begin(rts[0], mid1, &im) == HYLA_ERR_UNSUPPORTED && im == NULL);
        CHECK(strstr(hyla_last_error(), "tensor-parallel") != NULL);
        char sd[300];
        snprintf(sd, sizeof sd, "%s/tp_store_%d", hyla_test_env("HYLA_TMP", "/tmp"), (int)getpid());
        hyla_store *st = NULL;
        CHECK_OK(hyla_store_open(sd, NULL, &st));
        hyla_session *s = NULL;
        if (st) {
            CHECK_OK(hyla_store_put(st, "tp", mid1, NULL, NULL));
            CHECK_OK(hyla_restore_session(rts[0], st, "tp", 0, &s, NULL, NULL));
            hyla_store_close(st);
        }
        for (int i = H1; s && i < G; i++) CHECK_OK(hyla_session_decode(&s, 1, &tok[i], NULL));
        CHECK_MSG(s && !memcmp(tok + H1, tok1 + H1, (G - H1) * sizeof *tok),
                  "%s: restored from a store onto the split, the session continues differently", arch);
        hyla_session_free(s);
        char cmd[400];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", sd);
        CHECK(system(cmd) == 0);
    }
    /* cutting and joining move bytes only */
    {
        hyla_snapshot *parts[TMAX] = {NULL}, *again = NULL;
        const hyla_model *ms[TMAX] = {NULL};
        int all = 1;
        for (int r = 0; r < T; r++) ms[r] = test_model(rts[r]);
        for (int r = 0; r < T; r++) CHECK_OK(hyla_tp_snapshot_split(ms[r], midt, &parts[r]));
        for (int r = 0; r < T; r++) all &= parts[r] != NULL;
        if (all) CHECK_OK(hyla_tp_snapshot_merge(ms, (const hyla_snapshot *const *)parts, T, &again));
        CHECK_MSG(again && hyla_snapshot_equal(again, midt), "%s: split then merge changed the snapshot", arch);
        hyla_snapshot_destroy(again);
        for (int r = 0; r < T; r++) hyla_snapshot_destroy(parts[r]);
    }
    /* within one split, sampled: pause/resume and batching give the same tokens */
    {
        int32_t a[G], b[G], c[2][G];
        hyla_snapshot *m2 = NULL;
        run(rts[0], p, 0.9f, NULL, a, NULL, 0);
        run(rts[0], p, 0.9f, NULL, b, &m2, 1);
        CHECK_MSG(!memcmp(a, b, sizeof a), "%s T=0.9: split pause/resume changed the tokens", arch);
        hyla_snapshot_destroy(m2);
        hyla_session *ss[2] = {new_session(rts[0], 0.9f), new_session(rts[0], 0)};
        if (ss[0] && ss[1]) {
            CHECK_OK(hyla_session_feed(ss[0], p, N, NULL, NULL, NULL, NULL));
            CHECK_OK(hyla_session_feed(ss[1], p, N, NULL, NULL, NULL, NULL));
            for (int i = 0; i < G; i++) {
                int32_t o[2];
                CHECK_OK(hyla_session_decode(ss, 2, o, NULL));
                c[0][i] = o[0], c[1][i] = o[1];
            }
            CHECK_MSG(!memcmp(c[0], a, sizeof a) && !memcmp(c[1], tok1, sizeof tok1),
                      "%s: a split decode batch of two differs from each alone", arch);
            CHECK_MSG(hyla_session_state_bytes(ss[0]) > 0, "%s: state bytes", arch);
        }
        hyla_session_free(ss[0]);
        hyla_session_free(ss[1]);
        /* the same batch posted as the group's lane (a worker's step ahead) and collected: the
         * same tokens; nothing else runs on the group while it is posted, on any rank */
        hyla_session *sl[2] = {new_session(rts[0], 0.9f), new_session(rts[0], 0)};
        if (sl[0] && sl[1]) {
            CHECK_OK(hyla_session_feed(sl[0], p, N, NULL, NULL, NULL, NULL));
            CHECK_OK(hyla_session_feed(sl[1], p, N, NULL, NULL, NULL, NULL));
            int same = 1;
            for (int i = 0; i < G; i++) {
                int32_t o[2];
                CHECK_OK(hyla_session_decode_post(sl, 2, 0, 0, 2));
                if (i == 1) {
                    hyla_session *other = new_session(rts[0], 0);
                    hyla_status fs = other ? hyla_session_feed(other, p, N, NULL, NULL, NULL, NULL) : HYLA_ERR_NOMEM;
                    CHECK_MSG(fs == HYLA_ERR_INTERNAL, "%s: a feed on the split while a lane is posted: %s", arch,
                              hyla_status_str(fs));
                    hyla_session_free(other);
                    CHECK(hyla_session_decode_post(sl, 2, 0, 0, 2) == HYLA_ERR_INVALID_ARG); /* posted */
                }
                CHECK_OK(hyla_session_decode_collect(sl, 2, 0, o));
                same &= o[0] == a[i] && o[1] == tok1[i];
            }
            CHECK_MSG(same, "%s: the split's decode lane gives other tokens than its plain steps", arch);
        }
        hyla_session_free(sl[0]);
        hyla_session_free(sl[1]);
    }
    if (!getenv("HYLA_PREFILL_PIECE")) {
        /* a GPU group's prefill pieces are T times one GPU's, up to the largest (a rank's
         * projections, 1/T as wide, then run as GEMMs of one GPU's size); a CPU group keeps the
         * backend's */
        long want = (long)hyla_runtime_prefill_piece(rt1) * (cuda ? T : 1);
        if (want > HYLA_PREFILL_PIECE_MAX) want = HYLA_PREFILL_PIECE_MAX;
        for (int r = 0; r < T; r++)
            CHECK_MSG(hyla_runtime_prefill_piece(rts[r]) == want, "%s: rank %d's prefill piece is %d, not %ld", arch, r,
                      hyla_runtime_prefill_piece(rts[r]), want);
    }

    /* within one split, prefill pieces: a piece of NW tokens runs as two halves whose sums
     * travel while the other half computes (hyla_runtime.c, run_layers_wave); its logits are
     * those of pieces of one chunk (no halves), bit for bit */
    {
        int32_t *pw = test_prompt(NW, 13, V);
        size_t nw = (size_t)(NW - 1) * V;
        float *la = malloc(nw * sizeof *la), *lb = malloc(nw * sizeof *lb);
        hyla_session *sa = new_session(rts[0], 0), *sb = NULL;
        long waves = hyla_runtime_wave_pieces(rts[0]);
        if (sa && pw && la && lb) CHECK_OK(hyla_session_feed(sa, pw, NW, la, NULL, NULL, NULL));
        CHECK_MSG(hyla_runtime_wave_pieces(rts[0]) > waves, "%s: a %d-token piece did not run as two halves", arch, NW);
        int piece = hyla_runtime_prefill_piece(rts[0]);
        CHECK_OK(hyla_runtime_set_prefill_piece(rts[0], 64));
        waves = hyla_runtime_wave_pieces(rts[0]);
        if ((sb = new_session(rts[0], 0)) && pw && la && lb) CHECK_OK(hyla_session_feed(sb, pw, NW, lb, NULL, NULL, NULL));
        CHECK(hyla_runtime_wave_pieces(rts[0]) == waves);
        CHECK_OK(hyla_runtime_set_prefill_piece(rts[0], piece));
        CHECK_MSG(la && lb && !memcmp(la, lb, nw * sizeof *la),
                  "%s: a piece in two halves with overlapped sums differs from pieces of 64 tokens", arch);
        hyla_session_free(sa);
        hyla_session_free(sb);
        free(la);
        free(lb);
        free(pw);
    }
    {
        hyla_session *s = NULL;
        CHECK(hyla_session_create(rts[1], &s) == HYLA_ERR_INVALID_ARG && strstr(hyla_last_error(), "rank 0"));
        hyla_session_free(s);
    }
    printf("  %s: logits within tolerance of one rank, same greedy tokens, snapshots cross the split\n", arch);

out:
    hyla_snapshot_destroy(midt); /* exported on the group's rank 0: destroyed before it is closed */
    hyla_tp_close(g);
    hyla_snapshot_destroy(mid1);
    free(l1);
    free(lt);
    free(p);
    test_unload(rt1);
    hyla_backend_destroy(be1);
}

static void expect_refusal(const char *arch, int size, const char *needle, const char *edit) {
    char dir[256];
    snprintf(dir, sizeof dir, "%s/tp_%s", hyla_test_env("HYLA_TMP", "/tmp"), arch);
    make_model(arch, dir);
    if (edit) { /* a sed expression on config.json */
        char cmd[600];
        snprintf(cmd, sizeof cmd, "sed -i '%s' %s/config.json", edit, dir);
        CHECK(system(cmd) == 0);
    }
    hyla_backend *be = NULL;
    CHECK_OK(hyla_backend_create("cpu", &be));
    hyla_model_params mp = hyla_model_default_params();
    mp.tp_size = size;
    hyla_model *m = NULL;
    hyla_status st = hyla_model_load(dir, be, &mp, &m);
    CHECK_MSG(st == HYLA_ERR_UNSUPPORTED && strstr(hyla_last_error(), needle),
              "%s split %d: expected a refusal naming '%s', got %s: %s", arch, size, needle, hyla_status_str(st),
              hyla_last_error());
    hyla_model_free(m);
    hyla_backend_destroy(be);
}

/* The CUDA backend's thread binding (a backend's ops run on the thread's current device), as
 * worker/hyla_tp.c reaches it: present in CUDA builds. */
hyla_status hyla_cuda_bind_thread(hyla_backend *be) __attribute__((weak));

/* A 256 x 2304 -> 6144 linear (k_gemm_big's 128x128 tiles: opt-in shared memory) on cuda:0, then
 * the same on cuda:1 from the same thread, bound to each device in turn (as a tensor-parallel
 * rank's thread is): both run, same bits. Must be the process's first large-M linear. */
static void second_gpu_linear(hyla_backend *b0, hyla_backend *b1) {
    enum { M = 256, K = 2304, NO = 6144 };
    hyla_rng rng;
    hyla_rng_seed(&rng, 77);
    float *w = malloc((size_t)NO * K * sizeof *w), *x = malloc((size_t)M * K * sizeof *x);
    float *y[2] = {malloc((size_t)M * NO * sizeof(float)), malloc((size_t)M * NO * sizeof(float))};
    for (size_t i = 0; i < (size_t)NO * K; i++) w[i] = 0.02f * hyla_rng_normal(&rng);
    for (size_t i = 0; i < (size_t)M * K; i++) x[i] = hyla_rng_normal(&rng);
    hyla_backend *bs[2] = {b0, b1};
    for (int d = 0; d < 2; d++) {
        hyla_backend *b = bs[d];
        CHECK_OK(hyla_cuda_bind_thread(b));
        hyla_weight *W = NULL;
        void *dx = NULL, *dy = NULL;
        CHECK_OK(b->ops->weight_create(b->ctx, w, HYLA_DT_F32, NO, K, &W));
        CHECK_OK(b->ops->alloc(b->ctx, (size_t)M * K * sizeof(float), &dx));
        CHECK_OK(b->ops->alloc(b->ctx, (size_t)M * NO * sizeof(float), &dy));
        if (W && dx && dy) {
            CHECK_OK(b->ops->upload(b->ctx, dx, x, (size_t)M * K * sizeof(float)));
            hyla_status st = b->ops->linear(b->ctx, dx, K, M, K, W, NULL, dy, NO, NO, 0);
            if (st == HYLA_OK) st = b->ops->sync(b->ctx);
            CHECK_MSG(st == HYLA_OK, "large-M linear on cuda:%d after cuda:0: %s", d, hyla_last_error());
            CHECK_OK(b->ops->download(b->ctx, y[d], dy, (size_t)M * NO * sizeof(float)));
        }
        b->ops->free(b->ctx, dy);
        b->ops->free(b->ctx, dx);
        b->ops->weight_destroy(b->ctx, W);
    }
    CHECK_OK(hyla_cuda_bind_thread(b0));
    CHECK_MSG(!memcmp(y[0], y[1], (size_t)M * NO * sizeof(float)), "the large-M linear differs between cuda:0 and cuda:1");
    printf("  large-M linear on cuda:1 after its first use on cuda:0: runs, same bits\n");
    free(w), free(x), free(y[0]), free(y[1]);
}

/* The group's switches (CPU): HYLA_TP_SUM, HYLA_TP_WAVE and HYLA_TP_PUSH_MIN refuse what they do not know, naming
 * it; a 300-token piece runs in halves by default (models with paged state too), whole with
 * HYLA_TP_WAVE=0, in halves with 1, and its logits are the same bits every way. */
static void check_switches(const char *arch) {
    char dir[256];
    snprintf(dir, sizeof dir, "%s/tp_switches", hyla_test_env("HYLA_TMP", "/tmp"));
    make_model(arch, dir);
    hyla_tp_group *g = NULL;
    setenv("HYLA_TP_SUM", "fast", 1);
    hyla_status st = hyla_tp_open(dir, "cpu", 2, NULL, &g);
    CHECK_MSG(st == HYLA_ERR_INVALID_ARG && g == NULL && strstr(hyla_last_error(), "HYLA_TP_SUM='fast'"),
              "HYLA_TP_SUM=fast: expected a refusal naming it, got %s: %s", hyla_status_str(st), hyla_last_error());
    hyla_tp_close(g);
    unsetenv("HYLA_TP_SUM");
    setenv("HYLA_TP_WAVE", "yes", 1);
    g = NULL;
    st = hyla_tp_open(dir, "cpu", 2, NULL, &g);
    CHECK_MSG(st == HYLA_ERR_INVALID_ARG && g == NULL && strstr(hyla_last_error(), "HYLA_TP_WAVE='yes'"),
              "HYLA_TP_WAVE=yes: expected a refusal naming it, got %s: %s", hyla_status_str(st), hyla_last_error());
    hyla_tp_close(g);
    unsetenv("HYLA_TP_WAVE");
    setenv("HYLA_TP_PUSH_MIN", "lots", 1);
    g = NULL;
    st = hyla_tp_open(dir, "cpu", 2, NULL, &g);
    CHECK_MSG(st == HYLA_ERR_INVALID_ARG && g == NULL && strstr(hyla_last_error(), "HYLA_TP_PUSH_MIN='lots'"),
              "HYLA_TP_PUSH_MIN=lots: expected a refusal naming it, got %s: %s", hyla_status_str(st),
              hyla_last_error());
    hyla_tp_close(g);
    unsetenv("HYLA_TP_PUSH_MIN");
    float *l[3] = {NULL, NULL, NULL};
    long waves[3] = {0, 0, 0};
    int32_t *pw = NULL;
    size_t nw = 0;
    for (int k = 0; k < 3; k++) {
        if (k) setenv("HYLA_TP_WAVE", k == 1 ? "0" : "1", 1);
        g = NULL;
        CHECK_OK(hyla_tp_open(dir, "cpu", 2, NULL, &g));
        if (!g) break;
        hyla_runtime *rt = hyla_tp_rank_runtime(g, 0);
        int V = hyla_model_get_config(test_model(rt))->vocab_size;
        if (!pw) pw = test_prompt(NW, 17, V), nw = (size_t)(NW - 1) * V;
        l[k] = malloc(nw * sizeof(float));
        hyla_session *s = new_session(rt, 0);
        if (s && l[k]) CHECK_OK(hyla_session_feed(s, pw, NW, l[k], NULL, NULL, NULL));
        waves[k] = hyla_runtime_wave_pieces(rt);
        hyla_session_free(s);
        hyla_tp_close(g);
    }
    unsetenv("HYLA_TP_WAVE");
    CHECK_MSG(waves[0] > 0 && waves[1] == 0 && waves[2] > 0,
              "%s: HYLA_TP_WAVE: pieces in halves %ld by default (expected some), %ld with 0, %ld with 1", arch,
              waves[0], waves[1], waves[2]);
    CHECK_MSG(l[0] && l[1] && l[2] && !memcmp(l[0], l[1], nw * sizeof(float)) && !memcmp(l[0], l[2], nw * sizeof(float)),
              "%s: HYLA_TP_WAVE: the whole piece's logits differ from the halves'", arch);
    printf("  switches (%s): HYLA_TP_SUM and HYLA_TP_WAVE refuse unknown values; pieces in halves by default, "
           "whole with HYLA_TP_WAVE=0, halves with 1, same logits\n",
           arch);
    free(l[0]), free(l[1]), free(l[2]), free(pw);
}

int main(int argc, char **argv) {
    if (argc > 1) g_dev = argv[1];
    if (!strcmp(g_dev, "cuda4")) { /* four ranks: the sums of more than two (peer sums) */
        g_dev = "cuda";
        T = 4;
    }
    if (!strcmp(g_dev, "cuda")) {
        hyla_backend *b[TMAX] = {NULL};
        int have = 1;
        for (int d = 0; d < T && have; d++) {
            char name[16];
            snprintf(name, sizeof name, "cuda:%d", d);
            have = hyla_backend_create(name, &b[d]) == HYLA_OK;
        }
        if (have && hyla_cuda_bind_thread && T == 2) second_gpu_linear(b[0], b[1]);
        for (int d = TMAX - 1; d >= 0; d--) hyla_backend_destroy(b[d]);
        if (!have) {
            printf("test_tp %s: SKIPPED — needs %d usable CUDA devices (and the CUDA backend)\n", T > 2 ? "cuda4" : "cuda",
                   T);
            return 77;
        }
        /* the GPU rounds linear inputs to bf16: a sum that rounds differently can move one by an
         * ulp, and tiny random models amplify it (test_gpu_e2e's GPU-vs-CPU bound) */
        g_tol = 2e-2;
    }
    if (hyla_cuda_set_gemm_wg_min) { /* what a group does to each rank, refused for a CPU backend */
        hyla_backend *cb = NULL;
        CHECK_OK(hyla_backend_create("cpu", &cb));
        if (cb) {
            CHECK_MSG(hyla_cuda_set_gemm_wg_min(cb, 65) == HYLA_ERR_INVALID_ARG &&
                          strstr(hyla_last_error(), "not a cuda backend"),
                      "hyla_cuda_set_gemm_wg_min on the CPU backend: %s", hyla_last_error());
            hyla_backend_destroy(cb);
        }
    }
    /* the halves in every arch (the default: check_switches) */
    setenv("HYLA_TP_WAVE", "1", 1);
    for (size_t a = 0; a < sizeof ARCHS / sizeof *ARCHS; a++) {
        check_arch(ARCHS[a]);
    }
    if (!strcmp(g_dev, "cuda") && T == 2) { /* every one-shot sum in the push form (the test
                                              * models' sums are below its default size) */
        setenv("HYLA_TP_PUSH_MIN", "0", 1);
        printf("one-shot sums pushed:\n");
        check_arch("gdn");
        check_arch("sse-h");
        unsetenv("HYLA_TP_PUSH_MIN");
    }
    if (strcmp(g_dev, "cpu")) return hyla_test_done("test_tp");
    /* four ranks on the CPU: the same checks (the archs whose heads split in four) */
    T = 4;
    printf("four ranks:\n");
    for (size_t a = 0; a < sizeof ARCHS / sizeof *ARCHS; a++) check_arch(ARCHS[a]);
    T = 2;
    unsetenv("HYLA_TP_WAVE");
    check_switches("gdn");
    check_switches("sse-h");
    expect_refusal("gdn", 3, "num_heads 4 is not divisible by 3", NULL);
    expect_refusal("gdn-h", 4, "num_kv_heads 2 is not divisible by 4", NULL);
    expect_refusal("statex-gla", 2, "num_heads 1 is not divisible by 2", NULL);
    /* transformers' Mamba2 convention: the gated RMSNorm spans all inner channels */
    expect_refusal("mamba2", 2, "cannot be split", "s/\"norm_before_gate\": *false/\"norm_grouped\": false/");
    return hyla_test_done("test_tp");
}
