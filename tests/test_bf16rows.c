/* test_bf16rows.c — the bf16 prompt rows on the CPU backend (HYLA_CPU_BF16_ROWS=1, which takes the
 * CUDA backend's rmsnorm_bf16 / HYLA_LINEAR_X_BF16 / Y_BF16 / GATE_BF16 paths: kernels/cpu/cpu_backend.c), so
 * that the runtime's and the mixers' bf16 plumbing runs in CI, for the kinds whose prompt rows take
 * it (gdn: q, k, v from bf16 conv sources, gla, sse-h, gdn-h, dla-gdn, mamba2-h), and with it the
 * output projections that add onto the residual themselves (hyla_mixer_fwd.out_acc, HYLA_LINEAR_ACC:
 * one runtime, not the tensor-parallel ranks):
 *   - the backend offers rmsnorm_bf16 only when asked, and refuses bf16 rows without it;
 *   - a 300-token prompt fed as one piece gives the logits of 64-token pieces, bit for bit;
 *   - those logits are within 5e-2 (relative L2) of the fp32 backend's, and the greedy tokens
 *     after the prompt are the fp32 backend's in most positions (bf16 rounding at op boundaries);
 *   - in a tensor-parallel group of two CPU ranks (with the env set when its backends are created)
 *     the piece runs as two halves (run_layers_wave: the bf16 rows of half B at their offsets) and
 *     gives the logits of 64-token pieces within the group, bit for bit;
 *   - decode steps take the norms' bf16 rows too (ops->decode_bf16_rows): a batch gives each
 *     session's bits alone, and the logits stay within 5e-2 of the fp32 backend's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_session.h"
#include "hyla_test.h"
#include "hyla_test_model.h"
#include "hyla_tp.h"

enum { NW = 300 };

static const char *ARCHS[] = {"gdn", "gla", "sse-h", "gdn-h", "dla-gdn", "mamba2-h"};

static void make_model(const char *arch, const char *dir) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "rm -rf %s && %s/hyla-mkmodel --arch %s --layers 3 --hidden 64 --heads 4 --seed 7 %s--out %s 2>/dev/null", dir,
             hyla_test_env("HYLA_BIN_DIR", "build/bin"), arch,
             !strncmp(arch, "sse", 3) ? "--prefill-window 64 " : "", dir); /* SSE: 64-token pieces too */
    if (system(cmd) != 0) {
        fprintf(stderr, "cannot run: %s\n", cmd);
        exit(1);
    }
}

/* logits of the prompt's positions 1..NW-1 fed as one call, with the runtime's piece set to `piece` */
static void feed(hyla_runtime *rt, const int32_t *p, int piece, float *logits) {
    int keep = hyla_runtime_prefill_piece(rt);
    CHECK_OK(hyla_runtime_set_prefill_piece(rt, piece));
    hyla_session *s = NULL;
    CHECK_OK(hyla_session_create(rt, &s));
    if (s) CHECK_OK(hyla_session_feed(s, p, NW, logits, NULL, NULL, NULL));
    hyla_session_free(s);
    CHECK_OK(hyla_runtime_set_prefill_piece(rt, keep));
}

/* Decode rows through the norms' bf16 rows (this backend's decode_bf16_rows: every row count):
 * three sessions decoded together give each one's tokens and logits alone, bit for bit, and the
 * first step's logits (the same history on both backends) are within 5e-2 of the fp32 backend's
 * (a projection reading the bf16 rows as fp32 would not be). */
static void check_decode(const char *arch, hyla_runtime *r16, hyla_runtime *r32, const int32_t *p, int V) {
    enum { NB = 3, STEPS = 6 };
    hyla_session *bs[NB], *ss[NB], *fs[NB];
    for (int i = 0; i < NB; i++) {
        CHECK_OK(hyla_session_create(r16, &bs[i]));
        CHECK_OK(hyla_session_create(r16, &ss[i]));
        CHECK_OK(hyla_session_create(r32, &fs[i]));
        if (!bs[i] || !ss[i] || !fs[i]) return;
        CHECK_OK(hyla_session_feed(bs[i], p + 5 * i, 40 + 30 * i, NULL, NULL, NULL, NULL));
        CHECK_OK(hyla_session_feed(ss[i], p + 5 * i, 40 + 30 * i, NULL, NULL, NULL, NULL));
        CHECK_OK(hyla_session_feed(fs[i], p + 5 * i, 40 + 30 * i, NULL, NULL, NULL, NULL));
    }
    float *lb = malloc((size_t)NB * V * 4), *ls = malloc((size_t)V * 4), *lf = malloc((size_t)NB * V * 4);
    int same = 1;
    double rel = 0;
    for (int step = 0; step < STEPS; step++) {
        int32_t ob[NB], os, of[NB];
        CHECK_OK(hyla_session_decode(bs, NB, ob, lb));
        if (step == 0) {
            CHECK_OK(hyla_session_decode(fs, NB, of, lf));
            rel = hyla_test_rel_l2(lb, lf, (size_t)NB * V);
        }
        for (int i = 0; i < NB; i++) {
            CHECK_OK(hyla_session_decode(&ss[i], 1, &os, ls));
            same &= ob[i] == os && !memcmp(ls, lb + (size_t)i * V, (size_t)V * 4);
        }
    }
    CHECK_MSG(same, "%s: bf16 decode rows, a batch of %d != each alone (bits)", arch, NB);
    CHECK_MSG(rel <= 5e-2, "%s: bf16 decode rows against fp32: rel L2 %.3g", arch, rel);
    printf("  %s: decode from bf16 rows, batch of %d == alone (bits), rel L2 %.2e against fp32\n", arch, NB, rel);
    for (int i = 0; i < NB; i++) {
        hyla_session_free(bs[i]);
        hyla_session_free(ss[i]);
        hyla_session_free(fs[i]);
    }
    free(lb);
    free(ls);
    free(lf);
}

static void check_arch(const char *arch, hyla_backend *b16, hyla_backend *b32) {
    char dir[256];
    snprintf(dir, sizeof dir, "%s/bf16rows_%s", hyla_test_env("HYLA_TMP", "/tmp"), arch);
    make_model(arch, dir);
    hyla_runtime *r16 = test_load(dir, b16, NULL), *r32 = test_load(dir, b32, NULL);
    if (!r16 || !r32) return;
    const int V = hyla_model_get_config(test_model(r16))->vocab_size;
    int32_t *p = test_prompt(NW, 13, V);
    const size_t nl = (size_t)(NW - 1) * V;
    float *a = malloc(nl * sizeof *a), *b = malloc(nl * sizeof *b), *f = malloc(nl * sizeof *f);
    feed(r16, p, 1024, a);
    feed(r16, p, 64, b);
    feed(r32, p, 1024, f);
    CHECK_MSG(!memcmp(a, b, nl * sizeof *a), "%s: bf16 rows, one piece of %d tokens != pieces of 64 (bits)", arch, NW);
    const double rel = hyla_test_rel_l2(a, f, nl);
    int agree = 0;
    for (int t = 0; t < NW - 1; t++) {
        int ia = 0, jf = 0;
        for (int v = 1; v < V; v++) {
            if (a[(size_t)t * V + v] > a[(size_t)t * V + ia]) ia = v;
            if (f[(size_t)t * V + v] > f[(size_t)t * V + jf]) jf = v;
        }
        agree += ia == jf;
    }
    CHECK_MSG(rel <= 5e-2 && agree >= (NW - 1) * 9 / 10, "%s: bf16 rows against fp32: rel L2 %.3g, argmax %d of %d", arch,
              rel, agree, NW - 1);
    /* two CPU ranks in halves (this process has HYLA_CPU_BF16_ROWS=1: the group's backends take it) */
    hyla_tp_group *g = NULL;
    setenv("HYLA_TP_WAVE", "1", 1); /* halves for every kind (read when the group opens) */
    hyla_status st = hyla_tp_open(dir, "cpu", 2, NULL, &g);
    unsetenv("HYLA_TP_WAVE");
    if (st == HYLA_ERR_UNSUPPORTED) {
        printf("  %s: not split in 2 (%s)\n", arch, hyla_last_error());
    } else {
        CHECK_OK(st);
        hyla_runtime *rt = g ? hyla_tp_rank_runtime(g, 0) : NULL;
        if (rt) {
            CHECK_MSG(hyla_tp_rank_backend(g, 1)->ops->rmsnorm_bf16 != NULL, "%s: a rank's backend lacks bf16 rows", arch);
            long w0 = hyla_runtime_wave_pieces(rt);
            feed(rt, p, 1024, a);
            const int halves = hyla_runtime_wave_pieces(rt) > w0;
            feed(rt, p, 64, b);
            CHECK_MSG(halves, "%s: the %d-token piece did not run in halves", arch, NW);
            CHECK_MSG(!memcmp(a, b, nl * sizeof *a), "%s: TP = 2, bf16 rows: one piece in halves != pieces of 64 (bits)",
                      arch);
            printf("  %s: pieces equal (one runtime; TP = 2 in halves), rel L2 %.2e against fp32, argmax %d/%d\n", arch,
                   rel, agree, NW - 1);
        }
        hyla_tp_group_free(g);
    }
    check_decode(arch, r16, r32, p, V);
    free(a);
    free(b);
    free(f);
    free(p);
    test_unload(r16);
    test_unload(r32);
}

int main(void) {
    hyla_backend *b32 = NULL, *b16 = NULL;
    unsetenv("HYLA_CPU_BF16_ROWS");
    CHECK_OK(hyla_backend_create("cpu", &b32));
    CHECK_MSG(b32 && b32->ops->rmsnorm_bf16 == NULL, "the CPU backend offers bf16 rows unasked");
    if (b32) { /* bf16 rows refused where not offered */
        float x[8] = {0}, y[8];
        hyla_linear_out o = {NULL, NULL, y, 1, 1, NULL, 0};
        CHECK(b32->ops->linear_multi(b32->ctx, x, 8, 1, 8, 1, &o, 0, HYLA_LINEAR_PREFILL | HYLA_LINEAR_X_BF16) ==
              HYLA_ERR_INVALID_ARG);
        CHECK(strstr(hyla_last_error(), "HYLA_CPU_BF16_ROWS") != NULL);
        CHECK_MSG(b32->ops->decode_bf16_rows == NULL, "the CPU backend takes bf16 decode rows unasked");
        CHECK(b32->ops->linear_multi(b32->ctx, x, 8, 1, 8, 1, &o, 0, HYLA_LINEAR_X_BF16) == HYLA_ERR_INVALID_ARG);
    }
    setenv("HYLA_CPU_BF16_ROWS", "1", 1);
    CHECK_OK(hyla_backend_create("cpu", &b16));
    CHECK_MSG(b16 && b16->ops->rmsnorm_bf16 != NULL, "HYLA_CPU_BF16_ROWS=1: no rmsnorm_bf16");
    if (b16 && b32)
        for (size_t i = 0; i < sizeof ARCHS / sizeof ARCHS[0]; i++) check_arch(ARCHS[i], b16, b32);
    hyla_backend_destroy(b16);
    hyla_backend_destroy(b32);
    return hyla_test_done("test_bf16rows");
}
