/* test_tp.c — tensor parallelism on the CPU backend (worker/hyla_tp.h), for the kinds that can
 * be split (gla, gdn, attention and their hybrids), with two ranks in one process:
 *   - the ranks compute the same logits, bit for bit, and sample the same tokens (greedy and
 *     T = 0.9): no broadcast is needed;
 *   - their prompt logits are the unsplit model's within 1e-4 + 1e-4 relative (the sums over ranks
 *     round differently), and the greedy tokens are the unsplit model's;
 *   - snapshots: the ranks' exports merge into a whole-model snapshot with the unsplit model's
 *     layout, which an unsplit session imports and continues with the split run's tokens; the
 *     unsplit model's snapshot split over two ranks continues with the unsplit run's tokens
 *     (TP = 2 -> TP = 1 -> TP = 2); split then merge gives back the same bytes;
 *   - refusals name the reason: heads (or KV heads) not divisible by the split, a kind that cannot
 *     be split, another model's snapshot. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_session.h"
#include "hyla_test.h"
#include "hyla_test_model.h"
#include "hyla_tp.h"

enum { T = 2, N = 40, G = 12, H1 = 6 };

static const char *ARCHS[] = {"gla", "gdn", "transformer", "gdn-h", "gla-h"};

static void make_model(const char *arch, const char *dir) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "rm -rf %s && %s/hyla-mkmodel --arch %s --layers 3 --hidden 64 --heads 4 --seed 7 --out %s 2>/dev/null", dir,
             hyla_test_env("HYLA_BIN_DIR", "build/bin"), arch, dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "cannot run: %s\n", cmd);
        exit(1);
    }
}

static int32_t *prompt(int n, int vocab) {
    int32_t *t = malloc((size_t)n * sizeof *t);
    hyla_rng r;
    hyla_rng_seed(&r, 11);
    for (int i = 0; i < n; i++) t[i] = (int32_t)(hyla_rng_next(&r) % (uint64_t)(vocab < 256 ? vocab : 256));
    return t;
}

/* What every rank does in one hyla_tp_run, and what it leaves. */
typedef struct {
    hyla_runtime *rt[T];
    hyla_session *s[T];
    const int32_t *p;
    float temp;
    float *logits[T];      /* [N-1][V] prompt logits */
    int32_t tok[T][G];
    hyla_snapshot *snap[T];
    int from, to;          /* decode steps from..to-1 */
} job;

static hyla_status rank_feed(void *ud, int r) {
    job *j = ud;
    HYLA_TRY(hyla_session_create(j->rt[r], &j->s[r]));
    hyla_sampling sp = {j->temp, j->temp > 0 ? 40 : 0, j->temp > 0 ? 0.95f : 1.0f};
    hyla_session_set_sampling(j->s[r], sp, 5);
    return hyla_session_feed(j->s[r], j->p, N, j->logits[r], NULL, NULL, NULL);
}

static hyla_status rank_decode(void *ud, int r) {
    job *j = ud;
    for (int i = j->from; i < j->to; i++) HYLA_TRY(hyla_session_decode(&j->s[r], 1, &j->tok[r][i], NULL));
    return HYLA_OK;
}

static hyla_status rank_export(void *ud, int r) {
    job *j = ud;
    return hyla_session_export(j->s[r], &j->snap[r]);
}

static hyla_status rank_import(void *ud, int r) {
    job *j = ud;
    hyla_session_free(j->s[r]);
    j->s[r] = NULL;
    return hyla_session_import(j->rt[r], j->snap[r], &j->s[r]);
}

static void unsplit_run(hyla_runtime *rt, const int32_t *p, float temp, float *logits, int32_t *tok,
                        hyla_snapshot **mid) {
    hyla_session *s = NULL;
    CHECK_OK(hyla_session_create(rt, &s));
    hyla_sampling sp = {temp, temp > 0 ? 40 : 0, temp > 0 ? 0.95f : 1.0f};
    hyla_session_set_sampling(s, sp, 5);
    CHECK_OK(hyla_session_feed(s, p, N, logits, NULL, NULL, NULL));
    for (int i = 0; i < G; i++) {
        if (i == H1 && mid) CHECK_OK(hyla_session_export(s, mid));
        CHECK_OK(hyla_session_decode(&s, 1, &tok[i], NULL));
    }
    hyla_session_free(s);
}

static void check_arch(const char *arch, float temp) {
    char dir[256];
    snprintf(dir, sizeof dir, "%s/tp_%s", hyla_test_env("HYLA_TMP", "/tmp"), arch);
    make_model(arch, dir);
    hyla_backend *be1 = NULL, *be[T] = {NULL};
    CHECK_OK(hyla_backend_create("cpu", &be1));
    hyla_runtime *rt1 = test_load(dir, be1, NULL);
    if (!rt1) return;
    int V = hyla_model_get_config(test_model(rt1))->vocab_size;
    int32_t *p = prompt(N, V);
    float *l1 = malloc((size_t)(N - 1) * V * sizeof *l1);
    int32_t tok1[G];
    hyla_snapshot *mid1 = NULL;
    unsplit_run(rt1, p, temp, l1, tok1, &mid1);

    job j;
    memset(&j, 0, sizeof j);
    j.p = p;
    j.temp = temp;
    for (int r = 0; r < T; r++) {
        CHECK_OK(hyla_backend_create("cpu", &be[r]));
        hyla_model_params mp = hyla_model_default_params();
        mp.tp_rank = r;
        mp.tp_size = T;
        j.rt[r] = test_load(dir, be[r], &mp);
        j.logits[r] = malloc((size_t)(N - 1) * V * sizeof(float));
    }
    hyla_tp_group *g = NULL;
    if (j.rt[0] && j.rt[1]) CHECK_OK(hyla_tp_group_create(j.rt, T, &g));
    if (!g) goto out;

    /* prompt, then the first H1 tokens, export, the rest */
    CHECK_OK(hyla_tp_run(g, rank_feed, &j));
    CHECK_MSG(!memcmp(j.logits[0], j.logits[1], (size_t)(N - 1) * V * sizeof(float)),
              "%s: the two ranks' prompt logits differ", arch);
    CHECK_CLOSE(j.logits[0], l1, (size_t)(N - 1) * V, 1e-4, 1e-4, arch);
    j.from = 0, j.to = H1;
    CHECK_OK(hyla_tp_run(g, rank_decode, &j));
    CHECK_OK(hyla_tp_run(g, rank_export, &j));
    j.from = H1, j.to = G;
    CHECK_OK(hyla_tp_run(g, rank_decode, &j));
    CHECK_MSG(!memcmp(j.tok[0], j.tok[1], sizeof j.tok[0]), "%s T=%.1f: the ranks sampled different tokens", arch, temp);
    if (temp == 0) CHECK_MSG(!memcmp(j.tok[0], tok1, sizeof tok1), "%s: greedy tokens differ from the unsplit model's", arch);

    /* TP = 2 -> TP = 1: the merged snapshot on the unsplit model continues the split run */
    const hyla_model *ms[T] = {test_model(j.rt[0]), test_model(j.rt[1])};
    hyla_snapshot *whole = NULL;
    CHECK_OK(hyla_tp_snapshot_merge(ms, (const hyla_snapshot *const *)j.snap, T, &whole));
    if (whole) {
        CHECK_OK(hyla_snapshot_check_layout(whole, mid1));
        hyla_session *s = NULL;
        CHECK_OK(hyla_session_import(rt1, whole, &s));
        int32_t tok[G];
        for (int i = H1; s && i < G; i++) CHECK_OK(hyla_session_decode(&s, 1, &tok[i], NULL));
        CHECK_MSG(s && !memcmp(tok + H1, j.tok[0] + H1, (G - H1) * sizeof *tok),
                  "%s T=%.1f: the merged snapshot does not continue the split run on one rank", arch, temp);
        hyla_session_free(s);
        /* split then merge: the same bytes */
        hyla_snapshot *parts[T] = {NULL};
        for (int r = 0; r < T; r++) CHECK_OK(hyla_tp_snapshot_split(ms[r], whole, &parts[r]));
        hyla_snapshot *again = NULL;
        if (parts[0] && parts[1]) CHECK_OK(hyla_tp_snapshot_merge(ms, (const hyla_snapshot *const *)parts, T, &again));
        CHECK_MSG(again && hyla_snapshot_equal(again, whole), "%s: split then merge changed the snapshot", arch);
        hyla_snapshot_destroy(again);
        for (int r = 0; r < T; r++) hyla_snapshot_destroy(parts[r]);
    }
    hyla_snapshot_destroy(whole);

    /* TP = 1 -> TP = 2: the unsplit model's snapshot split over the ranks continues the unsplit run */
    for (int r = 0; r < T; r++) {
        hyla_snapshot_destroy(j.snap[r]);
        j.snap[r] = NULL;
        CHECK_OK(hyla_tp_snapshot_split(ms[r], mid1, &j.snap[r]));
    }
    if (j.snap[0] && j.snap[1]) {
        CHECK_OK(hyla_tp_run(g, rank_import, &j));
        j.from = H1, j.to = G;
        memset(j.tok, 0xff, sizeof j.tok);
        CHECK_OK(hyla_tp_run(g, rank_decode, &j));
        CHECK_MSG(!memcmp(j.tok[0] + H1, tok1 + H1, (G - H1) * sizeof *tok1),
                  "%s T=%.1f: the split snapshot does not continue the unsplit run", arch, temp);
    }
    printf("  %s T=%.1f: ranks agree, logits within tolerance of one rank, snapshots cross the split\n", arch, temp);

out:
    hyla_tp_group_free(g);
    for (int r = 0; r < T; r++) {
        hyla_session_free(j.s[r]);
        hyla_snapshot_destroy(j.snap[r]);
        free(j.logits[r]);
        test_unload(j.rt[r]);
        hyla_backend_destroy(be[r]);
    }
    hyla_snapshot_destroy(mid1);
    free(l1);
    free(p);
    test_unload(rt1);
    hyla_backend_destroy(be1);
}

static void expect_refusal(const char *arch, int size, const char *needle) {
    char dir[256];
    snprintf(dir, sizeof dir, "%s/tp_%s", hyla_test_env("HYLA_TMP", "/tmp"), arch);
    make_model(arch, dir);
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

int main(void) {
    for (size_t a = 0; a < sizeof ARCHS / sizeof *ARCHS; a++) {
        check_arch(ARCHS[a], 0.0f);
        check_arch(ARCHS[a], 0.9f);
    }
    expect_refusal("gdn", 3, "num_heads 4 is not divisible by 3");
    expect_refusal("gdn-h", 4, "num_kv_heads 2 is not divisible by 4");
    expect_refusal("mamba2", 2, "cannot be split");
    return hyla_test_done("test_tp");
}
