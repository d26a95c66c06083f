/* test_engine.c — the model runtime on the CPU backend, for every architecture:
 *   - prefill (chunked mixers) equals token-by-token decode (recurrent mixers) in logits;
 *   - feeding a document in pieces that end at chunk boundaries is bit-identical to one piece;
 *   - a decode batch of several sessions equals each session decoded alone, bit for bit;
 *   - same seed, same tokens (greedy and sampled); export -> import continues bit for bit;
 *   - asynchronous export (begin, decode on, end) == the synchronous export at begin, bit for
 *     bit, and continues like the uninterrupted session; two in flight at once, at a KV page
 *     boundary and mid-page, at position 0; snapshots destroyed on another thread; freeing a
 *     session with an export in flight aborts (the CPU backend performs captures at
 *     capture_end, so state overwritten by later decode steps would show here);
 *   - import refuses another model's snapshot and a part of the wrong shape, naming it;
 *   - the streaming import (ranges in pieces, any order) equals import for every architecture;
 *     a restore from a RocksDB store (hyla_restore_session) gives the stored state bit for bit
 *     and continues like the original; its refusals (another model, a chunk that fails to
 *     decode, missing or out-of-range bytes) leave no session;
 *   - the token log: the generated tokens read back, carried through export, the file codec and
 *     import (a snapshot without the log imports with an empty one), wrapping at
 *     HYLA_TOKEN_LOG_MAX; check_layout ignores it. */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "hyla_codec.h"
#include "hyla_codec_test.h"
#include "hyla_profile.h"
#include "hyla_restore.h"
#include "hyla_session.h"
#include "hyla_test.h"
#include "hyla_test_model.h"

static const char *ARCHS[] = {"gla", "gdn", "transformer", "sse", "sse-gdn", "sse-h", "gla-h", "gdn-h", "statex-gla",
                              /* sparse-attention hybrids */
                              "lalte", "lansa", "nsa",
                              /* Mamba2 (SSD) */
                              "mamba2", "mamba2-h", "statex-mamba2",

                              /* dynamic linear attention */
                              "dla-gdn", "dla-mamba2"};

static void make_model(const char *arch, const char *dir, const char *extra) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "rm -rf %s && %s/hyla-mkmodel --arch %s --layers 3 --hidden 64 --heads 4 --seed 5 %s --out %s 2>/dev/null",
             dir, hyla_test_env("HYLA_BIN_DIR", "build/bin"), arch, extra ? extra : "", dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "cannot run: %s\n", cmd);
        exit(1);
    }
}

static hyla_session *new_session(hyla_runtime *m, float temp, uint64_t seed) {
    hyla_session *s = NULL;
    CHECK_OK(hyla_session_create(m, &s));
    hyla_sampling sp = {temp, temp > 0 ? 40 : 0, temp > 0 ? 0.95f : 1.0f};
    hyla_session_set_sampling(s, sp, seed);
    return s;
}

static void gen(hyla_session *s, int n, int32_t *out) {
    for (int i = 0; i < n; i++) CHECK_OK(hyla_session_decode(&s, 1, &out[i], NULL));
}

static void *destroy_thread(void *snap) {
    hyla_snapshot_destroy(snap);
    return NULL;
}

/* Asynchronous export of a session fed n prompt tokens (position n - 1). */
static void check_async_export(hyla_runtime *m, const char *arch, const int32_t *p, int n) {
    enum { G = 12 };
    hyla_session *a = new_session(m, 0.8f, 3);
    CHECK_OK(hyla_session_feed(a, p, n, NULL, NULL, NULL, NULL));
    int64_t pos = hyla_session_position(a);
    hyla_snapshot *ref1 = NULL, *ref2 = NULL, *s1 = NULL, *s2 = NULL;
    hyla_export *e1 = NULL, *e2 = NULL;
    int32_t t[G], u[G];
    CHECK_OK(hyla_session_export(a, &ref1));
    CHECK_OK(hyla_session_export_begin(a, &e1));
    if (!e1 || !ref1) return;
    gen(a, 4, t); /* these steps overwrite the states e1 captures */
    CHECK_OK(hyla_session_export(a, &ref2));
    CHECK_OK(hyla_session_export_begin(a, &e2)); /* a second export in flight on the same session */
    gen(a, G - 4, t + 4);
    int polls = 0;
    while (!hyla_session_export_done(e1) && polls < 100) polls++;
    CHECK_MSG(polls < 100, "%s: export never reports done", arch);
    CHECK_OK(hyla_session_export_end(e1, &s1));
    CHECK_OK(hyla_session_export_end(e2, &s2));
    CHECK_MSG(s1 && s1->position == (uint64_t)pos && hyla_snapshot_equal(s1, ref1),
              "%s: export begun at %lld, ended %d tokens later, differs from the synchronous export", arch,
              (long long)pos, G);
    CHECK_MSG(s2 && hyla_snapshot_equal(s2, ref2), "%s: second export in flight differs from the synchronous one", arch);
    /* import and continue: the uninterrupted session's tokens and final state */
    hyla_session *c = NULL;
    if (s1) CHECK_OK(hyla_session_import(m, s1, &c));
    if (c) {
        gen(c, G, u);
        CHECK_MSG(!memcmp(t, u, sizeof t), "%s: async snapshot at %lld continues differently", arch, (long long)pos);
        hyla_snapshot *x = NULL, *y = NULL;
        CHECK_OK(hyla_session_export(a, &x));
        CHECK_OK(hyla_session_export(c, &y));
        CHECK_MSG(x && y && hyla_snapshot_equal(x, y), "%s: state after the resumed run differs", arch);
        hyla_snapshot_destroy(x);
        hyla_snapshot_destroy(y);
        hyla_session_free(c);
    }
    /* snapshots go back to the buffer cache from another thread (the worker's I/O thread) */
    pthread_t th;
    CHECK(pthread_create(&th, NULL, destroy_thread, s1) == 0);
    pthread_join(th, NULL);
    hyla_snapshot_destroy(s2);
    hyla_snapshot_destroy(ref1);
    hyla_snapshot_destroy(ref2);
    /* an export discarded at end */
    CHECK_OK(hyla_session_export_begin(a, &e1));
    if (e1) CHECK_OK(hyla_session_export_end(e1, NULL));
    hyla_session_free(a);
}

/* An incremental export since base (hyla_session_export_since; asynchronously when async) of a
 * session whose whole export is ref: the same parts, each KV part without the rows of the
 * tokens below base, its tail equal to ref's; every other part whole. Returns how many parts
 * left bytes out. */
static int check_since(hyla_session *a, const hyla_snapshot *ref, const char *arch, uint64_t base, int async) {
    hyla_snapshot *x = NULL;
    if (async) {
        hyla_export *e = NULL;
        CHECK_OK(hyla_session_export_begin_since(a, base, &e));
        if (e) CHECK_OK(hyla_session_export_end(e, &x));
    } else {
        CHECK_OK(hyla_session_export_since(a, base, &x));
    }
    if (!x) return 0;
    int partial = 0, ok = x->n_parts == ref->n_parts && x->position == ref->position && x->n_layers == ref->n_layers;
    uint64_t rows = base < ref->position ? base : ref->position;
    for (uint32_t i = 0; ok && i < x->n_parts; i++) {
        const hyla_state_part *p = &x->parts[i], *q = &ref->parts[i];
        uint64_t want = 0;
        if (q->kind == HYLA_PART_KV && q->page_tokens && q->shape[0]) want = q->nbytes / q->shape[0] * rows;
        ok = p->layer == q->layer && !strcmp(p->name, q->name) && p->nbytes == q->nbytes && p->skip == want &&
             !memcmp(p->data, (const uint8_t *)q->data + want, q->nbytes - want);
        partial += p->skip > 0;
    }
    CHECK_MSG(ok, "%s: export since %llu (%s) differs from the whole export's tails", arch, (unsigned long long)base,
              async ? "async" : "sync");
    CHECK_MSG((hyla_snapshot_require_whole(x, "test") == HYLA_OK) == (partial == 0), "%s: require_whole disagrees", arch);
    if (partial) { /* a partial snapshot is refused where whole parts are needed */
        hyla_session *r = NULL;
        CHECK(hyla_session_import(hyla_session_runtime(a), x, &r) == HYLA_ERR_INVALID_ARG && !r);
        hyla_snapshot *c = NULL;
        CHECK_OK(hyla_snapshot_clone(x, &c));
        CHECK_MSG(c && hyla_snapshot_equal(c, x), "%s: clone of a partial snapshot differs", arch);
        hyla_snapshot_destroy(c);
    }
    hyla_snapshot_destroy(x);
    return partial;
}

static void test_since(hyla_runtime *m, const char *arch, const int32_t *p, int n) {
    hyla_session *a = new_session(m, 0.8f, 3);
    CHECK_OK(hyla_session_feed(a, p, n, NULL, NULL, NULL, NULL));
    hyla_snapshot *ref = NULL;
    CHECK_OK(hyla_session_export(a, &ref));
    if (!ref) return;
    int kv = 0;
    for (uint32_t i = 0; i < ref->n_parts; i++)
        kv += ref->parts[i].kind == HYLA_PART_KV && ref->parts[i].page_tokens && ref->position > 0;
    uint64_t pos = ref->position, bases[] = {0, 1, 64, 100, pos - 1, pos, pos + 7};
    for (size_t b = 0; b < sizeof bases / sizeof *bases; b++) {
        int partial = check_since(a, ref, arch, bases[b], b & 1);
        CHECK_MSG(partial == (bases[b] && kv ? kv : 0), "%s: export since %llu left out %d parts, %d KV parts", arch,
                  (unsigned long long)bases[b], partial, kv);
    }
    hyla_snapshot_destroy(ref);
    hyla_session_free(a);
}

static void test_async(hyla_runtime *m, const char *arch, const int32_t *p, int T) {
    check_async_export(m, arch, p, 129); /* position 128: the last KV page is full */
    check_async_export(m, arch, p, T);   /* position T - 1: mid-page */
    test_since(m, arch, p, T);
    /* exports into pageable memory (those too large for a pinned buffer): the same bits */
    setenv("HYLA_EXPORT_PIN_MAX_MB", "0", 1);
    check_async_export(m, arch, p, T);
    test_since(m, arch, p, T);
    unsetenv("HYLA_EXPORT_PIN_MAX_MB");
    /* position 0: no KV rows yet */
    hyla_session *z = new_session(m, 0, 1);
    hyla_export *e = NULL;
    hyla_snapshot *a = NULL, *b = NULL;
    CHECK_OK(hyla_session_export(z, &a));
    CHECK_OK(hyla_session_export_begin(z, &e));
    if (e) CHECK_OK(hyla_session_export_end(e, &b));
    CHECK_MSG(a && b && hyla_snapshot_equal(a, b), "%s: async export of an empty session differs", arch);
    hyla_snapshot_destroy(a);
    hyla_snapshot_destroy(b);
    hyla_session_free(z);
}

static void test_arch(hyla_backend *be, const char *arch, const char *dir) {
    /* lalte: a window, sink and budget small enough that 150 tokens evict, retain and replace;
     * lansa, nsa: blocks of 8, 4 selected, a window of 16: 150 tokens select among 19 blocks;
     * dla-*: 4 states per head and a threshold of 1.4 (a random model's scores lie near sqrt(2), so
     * about a third of the tokens merge into the newest state and the rest open one) */
    const char *extra = strstr(arch, "-h")           ? "--window 40"
                        : !strcmp(arch, "lalte")     ? "--window 16 --sink 2 --budget 6"
                        : strstr(arch, "nsa") != NULL ? "--window 16 --block-size 8 --block-counts 4"
                        : !strncmp(arch, "dla-", 4)   ? "--dla-capacity 4 --dla-threshold 1.4"
                                                      : "";
    /* SSE: windows of 64 (pieces of 64 and 128 below; the default window of 256 in
     * test_sse_window) */
    char ex[160];
    snprintf(ex, sizeof ex, "%s%s", extra, !strncmp(arch, "sse", 3) ? " --prefill-window 64" : "");
    make_model(arch, dir, ex);
    hyla_runtime *m = test_load(dir, be, NULL);
    if (!m) return;
    const hyla_model_config *c = hyla_model_get_config(test_model(m));
    int V = c->vocab_size, T = 150;
    int32_t *p = test_prompt(T, 11, V);

    /* 0. logits scratch only where logits are wanted: a fresh runtime holds none, a prompt fed
     * without a logits buffer reserves none (8192 rows of a 152k vocabulary would be 5 GB), a
     * decode step its batch's rows, a prompt fed with a logits buffer its piece's */
    {
        CHECK(hyla_runtime_logit_rows(m) == 0);
        hyla_session *z = new_session(m, 0, 1);
        CHECK_OK(hyla_session_feed(z, p, T, NULL, NULL, NULL, NULL));
        CHECK_MSG(hyla_runtime_logit_rows(m) == 0, "%s: a prompt fed without logits reserved %d rows of them", arch,
                  hyla_runtime_logit_rows(m));
        CHECK_OK(hyla_session_step(&z, 1, NULL));
        CHECK_MSG(hyla_runtime_logit_rows(m) >= 1 && hyla_runtime_logit_rows(m) < T,
                  "%s: a decode step of one session reserved %d rows of logits", arch, hyla_runtime_logit_rows(m));
        hyla_session_free(z);
    }

    /* 1. prefill logits vs decode logits. Tolerance: chunked and recurrent forms sum the same
     * terms in different orders in fp32 through 3 layers; logits are O(10), so 2e-3 absolute
     * + 1e-3 relative is far below any real discrepancy (a wrong decay or missing term moves
     * logits by O(1)). */
    float *lp = malloc((size_t)T * V * sizeof(float)), *ld = malloc((size_t)T * V * sizeof(float));
    hyla_session *a = new_session(m, 0, 1), *b = new_session(m, 0, 1);
    int consumed = 0;
    CHECK_OK(hyla_session_feed(a, p, T, lp, &consumed, NULL, NULL));
    CHECK(consumed == T - 1);
    CHECK_OK(hyla_session_feed(b, p, 1, NULL, NULL, NULL, NULL));
    for (int i = 1; i < T; i++) {
        CHECK_OK(hyla_session_step(&b, 1, ld + (size_t)(i - 1) * V));
        CHECK_OK(hyla_session_feed(b, &p[i], 1, NULL, NULL, NULL, NULL)); /* only sets pending */
    }
    char what[128];
    snprintf(what, sizeof what, "%s: prefill vs decode logits", arch);
    CHECK_CLOSE(lp, ld, (size_t)(T - 1) * V, 2e-3, 1e-3, what);
    CHECK(hyla_session_position(a) == T - 1 && hyla_session_position(b) == T - 1);
    hyla_session_free(b);

    /* 1b. the prefill piece size changes nothing: pieces of 64 and 128 tokens give the logits of
     * every position and the state of the default (one 149-token piece), bit for bit */
    CHECK(hyla_runtime_prefill_piece(m) == HYLA_PREFILL_PIECE_DEFAULT);
    hyla_snapshot *s0 = NULL;
    CHECK_OK(hyla_session_export(a, &s0));
    for (int piece = 64; piece <= 128; piece += 64) {
        CHECK_OK(hyla_runtime_set_prefill_piece(m, piece));
        b = new_session(m, 0, 1);
        CHECK_OK(hyla_session_feed(b, p, T, ld, NULL, NULL, NULL));
        hyla_snapshot *s1 = NULL;
        CHECK_OK(hyla_session_export(b, &s1));
        CHECK_MSG(!memcmp(lp, ld, (size_t)(T - 1) * V * sizeof(float)) && s0 && s1 && hyla_snapshot_equal(s0, s1),
                  "%s: prefill pieces of %d tokens differ from one piece of %d (logits or state)", arch, piece, T - 1);
        hyla_snapshot_destroy(s1);
        hyla_session_free(b);
    }
    CHECK(hyla_runtime_set_prefill_piece(m, 100) == HYLA_ERR_INVALID_ARG);
    CHECK(hyla_runtime_set_prefill_piece(m, 0) == HYLA_ERR_INVALID_ARG);
    /* the largest piece a caller may choose, and one chunk past it */
    CHECK(HYLA_PREFILL_PIECE_MAX == 32768);
    CHECK_OK(hyla_runtime_set_prefill_piece(m, HYLA_PREFILL_PIECE_MAX));
    CHECK(hyla_runtime_set_prefill_piece(m, HYLA_PREFILL_PIECE_MAX + HYLA_PREFILL_CHUNK) == HYLA_ERR_INVALID_ARG);
    CHECK_OK(hyla_runtime_set_prefill_piece(m, HYLA_PREFILL_PIECE_DEFAULT));
    hyla_snapshot_destroy(s0);
    hyla_session_free(a);

    /* 2. pieces ending at chunk boundaries == one piece, bit for bit (states and tokens) */
    a = new_session(m, 0, 1);
    b = new_session(m, 0, 1);
    CHECK_OK(hyla_session_feed(a, p, T, NULL, NULL, NULL, NULL));
    CHECK_OK(hyla_session_feed(b, p, 65, NULL, NULL, NULL, NULL));      /* consumes 64 */
    CHECK_OK(hyla_session_feed(b, p + 65, 64, NULL, NULL, NULL, NULL)); /* consumes 64 more: 128 */
    CHECK_OK(hyla_session_feed(b, p + 129, T - 129, NULL, NULL, NULL, NULL));
    hyla_snapshot *sa = NULL, *sb = NULL;
    CHECK_OK(hyla_session_export(a, &sa));
    CHECK_OK(hyla_session_export(b, &sb));
    CHECK_MSG(sa && sb && hyla_snapshot_equal(sa, sb), "%s: chunk-aligned pieces differ from one piece", arch);
    hyla_snapshot_destroy(sb);

    /* 3. export/import continues bit for bit; same seed, same tokens; the streaming import, its
     * ranges in pieces and in reverse order, gives the same session */
    int32_t g1[24], g2[24];
    hyla_session *c1 = NULL, *c2 = test_streamed_import(m, sa, 7);
    CHECK_OK(hyla_session_import(m, sa, &c1));
    if (c1 && c2) {
        hyla_snapshot *x = NULL;
        CHECK_OK(hyla_session_export(c2, &x));
        CHECK_MSG(x && hyla_snapshot_equal(x, sa), "%s: streamed import differs from the snapshot", arch);
        hyla_snapshot_destroy(x);
        int32_t g3[24];
        gen(a, 24, g1);
        gen(c1, 24, g2);
        gen(c2, 24, g3);
        CHECK_MSG(!memcmp(g1, g2, sizeof g1), "%s: imported session continues differently", arch);
        CHECK_MSG(!memcmp(g1, g3, sizeof g1), "%s: stream-imported session continues differently", arch);
    }
    hyla_session_free(c1);
    hyla_session_free(c2);
    hyla_snapshot_destroy(sa);
    hyla_session_free(a);
    hyla_session_free(b);
    for (int pass = 0; pass < 2; pass++) {
        float temp = pass ? 0.9f : 0.0f;
        a = new_session(m, temp, 42);
        b = new_session(m, temp, 42);
        CHECK_OK(hyla_session_feed(a, p, 20, NULL, NULL, NULL, NULL));
        CHECK_OK(hyla_session_feed(b, p, 20, NULL, NULL, NULL, NULL));
        gen(a, 24, g1);
        gen(b, 24, g2);
        CHECK_MSG(!memcmp(g1, g2, sizeof g1), "%s: same seed gave different tokens (T=%.1f)", arch, temp);
        hyla_session_free(a);
        hyla_session_free(b);
    }

    test_async(m, arch, p, T);

    /* 4. batch decode == single decode, bit for bit */
    enum { NB = 3 };
    hyla_session *bs[NB], *ss[NB];
    for (int i = 0; i < NB; i++) {
        bs[i] = new_session(m, i == 1 ? 0.8f : 0.0f, (uint64_t)i);
        ss[i] = new_session(m, i == 1 ? 0.8f : 0.0f, (uint64_t)i);
        CHECK_OK(hyla_session_feed(bs[i], p + 7 * i, 30 + 20 * i, NULL, NULL, NULL, NULL));
        CHECK_OK(hyla_session_feed(ss[i], p + 7 * i, 30 + 20 * i, NULL, NULL, NULL, NULL));
    }
    for (int step = 0; step < 8; step++) {
        int32_t ob[NB], os[NB];
        CHECK_OK(hyla_session_decode(bs, NB, ob, NULL));
        for (int i = 0; i < NB; i++) CHECK_OK(hyla_session_decode(&ss[i], 1, &os[i], NULL));
        CHECK_MSG(!memcmp(ob, os, sizeof ob), "%s: batched decode differs from single decode at step %d", arch, step);
    }
    for (int i = 0; i < NB; i++) {
        hyla_snapshot *x = NULL, *y = NULL;
        CHECK_OK(hyla_session_export(bs[i], &x));
        CHECK_OK(hyla_session_export(ss[i], &y));
        CHECK_MSG(x && y && hyla_snapshot_equal(x, y), "%s: batched state differs for session %d", arch, i);
        hyla_snapshot_destroy(x);
        hyla_snapshot_destroy(y);
        hyla_session_free(bs[i]);
        hyla_session_free(ss[i]);
    }
    free(lp);
    free(ld);
    free(p);
    test_unload(m);
}

static void test_refusals(hyla_backend *be, const char *tmp) {
    char d1[512], d2[512];
    snprintf(d1, sizeof d1, "%s/r1", tmp);
    snprintf(d2, sizeof d2, "%s/r2", tmp);
    make_model("sse-h", d1, NULL);
    make_model("sse-h", d2, "--partitions 3");
    hyla_runtime *m1 = NULL, *m2 = NULL;
    m1 = test_load(d1, be, NULL);
    m2 = test_load(d2, be, NULL);
    if (!m1 || !m2) return;
    CHECK(hyla_model_fingerprint(test_model(m1)) != hyla_model_fingerprint(test_model(m2)));
    hyla_session *s = new_session(m1, 0, 0);
    int32_t *p = test_prompt(10, 3, 260);
    CHECK_OK(hyla_session_feed(s, p, 10, NULL, NULL, NULL, NULL));
    hyla_snapshot *snap = NULL;
    CHECK_OK(hyla_session_export(s, &snap));
    hyla_session *o = NULL;
    hyla_status st = hyla_session_import(m2, snap, &o);
    CHECK(st == HYLA_ERR_MISMATCH && strstr(hyla_last_error(), "another model"));
    CHECK(o == NULL);
    /* a part with the wrong shape, on the right model: the error names layer and part */
    hyla_state_part *sp = hyla_snapshot_find(snap, 0, "Sp");
    CHECK(sp != NULL);
    if (sp) {
        sp->shape[0] = 3;
        st = hyla_session_import(m1, snap, &o);
        CHECK(st == HYLA_ERR_MISMATCH && strstr(hyla_last_error(), "layer 0 part 'Sp'"));
        sp->shape[0] = 4;
    }
    snap->format_version = 99;
    st = hyla_session_import(m1, snap, &o);
    CHECK(st == HYLA_ERR_FORMAT && strstr(hyla_last_error(), "version 99"));
    /* bad token ids are refused before anything is fed */
    int32_t bad[2] = {5, 100000};
    int64_t pos = hyla_session_position(s);
    st = hyla_session_feed(s, bad, 2, NULL, NULL, NULL, NULL);
    CHECK(st == HYLA_ERR_INVALID_ARG && strstr(hyla_last_error(), "100000"));
    CHECK(hyla_session_position(s) == pos);
    free(p);
    hyla_snapshot_destroy(snap);
    hyla_session_free(s);
    test_unload(m1);
    test_unload(m2);
}

/* A session restored from a RocksDB store through the streaming path (hyla_restore_session):
 * bit for bit the stored state, and it continues like the original; an import missing bytes,
 * a range outside the parts, another model's snapshot and a chunk that fails to decode are
 * refused and leave no session. */
static void test_restore(hyla_backend *be, const char *tmp) {
    const char *archs[2] = {"sse-h", "gdn"};
    for (int ai = 0; ai < 2; ai++) {
        char d1[512], d2[512], sd[512];
        snprintf(d1, sizeof d1, "%s/rs_%s", tmp, archs[ai]);
        snprintf(d2, sizeof d2, "%s/rs2_%s", tmp, archs[ai]);
        snprintf(sd, sizeof sd, "%s/rs_store_%s", tmp, archs[ai]);
        make_model(archs[ai], d1, NULL);
        make_model(archs[ai], d2, "--intermediate 96");
        hyla_runtime *m = test_load(d1, be, NULL), *m2 = test_load(d2, be, NULL);
        if (!m || !m2) return;
        int V = hyla_model_get_config(test_model(m))->vocab_size;
        int32_t *p = test_prompt(150, 9, V);
        hyla_session *a = new_session(m, 0.8f, 5);
        CHECK_OK(hyla_session_feed(a, p, 150, NULL, NULL, NULL, NULL));
        int32_t g1[16], g2[16];
        gen(a, 5, g1); /* a token log, and a pending token */
        hyla_snapshot *want = NULL;
        CHECK_OK(hyla_session_export(a, &want));
        hyla_store_params sp = hyla_store_default_params();
        sp.codec.chunk_bytes = 4096; /* many chunks: many ranges in flight */
        sp.codec.min_gain_pct = 0;   /* every chunk compressed: the decode fault below hits one */
        hyla_store *st = NULL;
        CHECK_OK(hyla_store_open(sd, &sp, &st));
        if (!st || !want) return;
        CHECK_OK(hyla_store_put(st, "r", want, NULL, NULL));
        for (int rep = 0; rep < 2; rep++) { /* the second reuses the pinned buffer */
            hyla_session *r = NULL;
            uint64_t ver = 0;
            hyla_restore_stats rs;
            CHECK_OK(hyla_restore_session(m, st, "r", 0, &r, &ver, &rs));
            CHECK(ver == 1 && rs.bytes == hyla_snapshot_bytes(want) && rs.ranges > want->n_parts && rs.copy_calls >= 1);
            hyla_snapshot *got = NULL;
            if (r) CHECK_OK(hyla_session_export(r, &got));
            CHECK_MSG(got && hyla_snapshot_equal(got, want), "%s: restored state differs from the stored one", archs[ai]);
            hyla_snapshot_destroy(got);
            if (r && rep == 1) {
                gen(a, 16, g1);
                gen(r, 16, g2);
                CHECK_MSG(!memcmp(g1, g2, sizeof g1), "%s: restored session continues differently", archs[ai]);
            }
            hyla_session_free(r);
        }
        /* refusals */
        hyla_session *r = NULL;
        CHECK(hyla_restore_session(m2, st, "r", 0, &r, NULL, NULL) == HYLA_ERR_MISMATCH && r == NULL);
        CHECK(strstr(hyla_last_error(), "fingerprint") != NULL);
        CHECK(hyla_restore_session(m, st, "absent", 0, &r, NULL, NULL) == HYLA_ERR_NOT_FOUND && r == NULL);
        hyla_codec_fault_zstd(3);
        hyla_status e = hyla_restore_session(m, st, "r", 0, &r, NULL, NULL);
        hyla_codec_fault_zstd(0);
        CHECK_MSG(e == HYLA_ERR_CORRUPT && r == NULL, "%s: a chunk that fails to decode: %s (%s)", archs[ai],
                  hyla_status_str(e), hyla_last_error());
        CHECK(strstr(hyla_last_error(), "session r version 1") && strstr(hyla_last_error(), "chunk"));
        hyla_import *im = NULL;
        CHECK_OK(hyla_session_import_begin(m, want, &im));
        if (im) {
            uint32_t k = 0;
            uint64_t off = 0, len = want->parts[0].nbytes / 2;
            CHECK_OK(hyla_session_import_ranges(im, 1, &k, &off, &len));
            off = want->parts[0].nbytes;
            CHECK(hyla_session_import_ranges(im, 1, &k, &off, &len) == HYLA_ERR_INVALID_ARG);
            CHECK(hyla_session_import_end(im, &r) == HYLA_ERR_INVALID_ARG && r == NULL);
        }
        CHECK_OK(hyla_session_import_begin(m, want, &im));
        if (im) {
            uint32_t k = 0;
            uint64_t off = 0, len = want->parts[0].nbytes / 2;
            CHECK_OK(hyla_session_import_ranges(im, 1, &k, &off, &len));
            CHECK(hyla_session_import_end(im, &r) == HYLA_ERR_INTERNAL && r == NULL);
            CHECK(strstr(hyla_last_error(), "bytes arrived") != NULL);
        }
        CHECK_OK(hyla_session_import_begin(m, want, &im));
        hyla_session_import_abort(im);
        hyla_store_close(st);
        hyla_snapshot_destroy(want);
        hyla_session_free(a);
        free(p);
        test_unload(m);
        test_unload(m2);
    }
}

/* A snapshot through the portable file codec and back. Caller frees. */
static hyla_snapshot *codec_round_trip(const hyla_snapshot *s) {
    hyla_codec_params cp = hyla_codec_default_params();
    uint8_t *buf = NULL;
    size_t len = 0;
    hyla_snapshot *t = NULL;
    CHECK_OK(hyla_snapshot_encode_file_bytes(s, &cp, &buf, &len));
    if (buf) CHECK_OK(hyla_snapshot_decode_file_bytes(buf, len, "token log test", 1, &t));
    free(buf);
    return t;
}

static void test_token_log(hyla_backend *be, const char *tmp) {
    enum { G = 300, C = 20 };
    char dir[512];
    snprintf(dir, sizeof dir, "%s/tl", tmp);
    make_model("sse-h", dir, NULL);
    hyla_runtime *m = test_load(dir, be, NULL);
    if (!m) return;
    hyla_session *a = new_session(m, 0.8f, 11);
    int32_t *p = test_prompt(10, 4, 260);
    CHECK_OK(hyla_session_feed(a, p, 10, NULL, NULL, NULL, NULL));
    CHECK(hyla_session_log_first(a) == 0);
    int32_t t[G + C], r[G + C], u[C];
    CHECK(hyla_session_read_tokens(a, 0, G, r) == 0); /* nothing generated yet */
    gen(a, G, t);
    CHECK(hyla_session_log_first(a) == 0 && hyla_session_read_tokens(a, 0, G + C, r) == G && !memcmp(r, t, sizeof(int32_t) * G));
    CHECK(hyla_session_read_tokens(a, 250, 7, r) == 7 && !memcmp(r, t + 250, 7 * sizeof *r));
    CHECK(hyla_session_read_tokens(a, G, 5, r) == 0);
    /* export -> file codec -> import: the log comes along, consistent with generated */
    hyla_snapshot *snap = NULL;
    CHECK_OK(hyla_session_export(a, &snap));
    if (!snap) return;
    const int32_t *log = NULL;
    uint32_t n = 0;
    CHECK_OK(hyla_snapshot_token_log(snap, &log, &n));
    CHECK(n == G && log && !memcmp(log, t, sizeof(int32_t) * G));
    hyla_snapshot *back = codec_round_trip(snap);
    CHECK(back && hyla_snapshot_equal(snap, back));
    hyla_session *b = NULL;
    if (back) CHECK_OK(hyla_session_import(m, back, &b));
    if (b) {
        CHECK(hyla_session_generated(b) == G && hyla_session_log_first(b) == 0);
        CHECK(hyla_session_read_tokens(b, 0, G, r) == G && !memcmp(r, t, sizeof(int32_t) * G));
        gen(a, C, t + G);
        gen(b, C, u);
        CHECK(!memcmp(u, t + G, sizeof u)); /* the log changes nothing of the continuation */
        CHECK(hyla_session_read_tokens(b, 0, G + C, r) == G + C && !memcmp(r, t, sizeof(int32_t) * (G + C)));
    }
    /* the layout check ignores the log: a fresh session's snapshot has none */
    hyla_session *f = new_session(m, 0, 0);
    hyla_snapshot *fresh = NULL;
    CHECK_OK(hyla_session_export(f, &fresh));
    if (fresh) CHECK_OK(hyla_snapshot_check_layout(snap, fresh));
    if (fresh) CHECK(hyla_snapshot_find(fresh, HYLA_SNAPSHOT_SESSION_LAYER, HYLA_TOKEN_LOG_PART) == NULL);
    /* a snapshot of an older build (no log part) imports with an empty log */
    hyla_snapshot *old = codec_round_trip(snap);
    if (old) {
        CHECK(old->n_parts > 0 && old->parts[old->n_parts - 1].kind == HYLA_PART_TOKENS);
        old->n_parts--; /* the log is the last part: drop it (its data stays owned by the snapshot) */
        hyla_snapshot *old2 = codec_round_trip(old);
        old->n_parts++;
        hyla_session *o = NULL;
        if (old2) CHECK_OK(hyla_session_import(m, old2, &o));
        if (o) {
            CHECK(hyla_session_generated(o) == G && hyla_session_log_first(o) == G);
            CHECK(hyla_session_read_tokens(o, 0, G, r) == 0 && hyla_session_read_tokens(o, G - 1, 1, r) == 0);
            gen(o, C, u);
            CHECK(!memcmp(u, t + G, sizeof u));
            CHECK(hyla_session_log_first(o) == G && hyla_session_read_tokens(o, G, C, r) == C && !memcmp(r, u, sizeof u));
        }
        hyla_session_free(o);
        hyla_snapshot_destroy(old2);
    }
    hyla_snapshot_destroy(old);
    /* a full log wraps: a snapshot claiming HYLA_TOKEN_LOG_MAX + 5 generated tokens, with a full
     * log, keeps the last HYLA_TOKEN_LOG_MAX after more decoding */
    hyla_snapshot *big = codec_round_trip(fresh ? fresh : snap);
    if (big) {
        int32_t *full = NULL;
        big->n_generated = HYLA_TOKEN_LOG_MAX + 5;
        CHECK_OK(hyla_snapshot_add_token_log(big, HYLA_TOKEN_LOG_MAX, &full));
        CHECK(hyla_snapshot_add_token_log(big, 1, &full) == HYLA_ERR_INVALID_ARG);
        hyla_state_part *lp = hyla_snapshot_find(big, HYLA_SNAPSHOT_SESSION_LAYER, HYLA_TOKEN_LOG_PART);
        int32_t *d = lp ? lp->data : NULL;
        for (uint32_t i = 0; d && i < HYLA_TOKEN_LOG_MAX; i++) d[i] = (int32_t)(i % 200);
        CHECK_OK(hyla_snapshot_check_layout(big, fresh ? fresh : snap));
        hyla_session *w = NULL;
        CHECK_OK(hyla_session_import(m, big, &w));
        if (w) {
            int64_t g0 = HYLA_TOKEN_LOG_MAX + 5;
            CHECK(hyla_session_log_first(w) == 5);
            CHECK_OK(hyla_session_feed(w, p, 3, NULL, NULL, NULL, NULL));
            gen(w, 7, u);
            CHECK(hyla_session_generated(w) == g0 + 7 && hyla_session_log_first(w) == 12);
            CHECK(hyla_session_read_tokens(w, 11, 1, r) == 0);
            CHECK(hyla_session_read_tokens(w, 12, 1, r) == 1 && r[0] == 7); /* log index 7 */
            CHECK(hyla_session_read_tokens(w, g0 - 1, 8, r) == 8 && r[0] == (int32_t)((HYLA_TOKEN_LOG_MAX - 1) % 200) &&
                  !memcmp(r + 1, u, 7 * sizeof *u));
            hyla_snapshot *ws = NULL;
            CHECK_OK(hyla_session_export(w, &ws));
            const int32_t *wl = NULL;
            if (ws) CHECK_OK(hyla_snapshot_token_log(ws, &wl, &n));
            CHECK(ws && n == HYLA_TOKEN_LOG_MAX && wl[0] == 7 && !memcmp(wl + n - 7, u, 7 * sizeof *u));
            hyla_snapshot_destroy(ws);
        }
        hyla_session_free(w);
        /* a log longer than the tokens generated is refused */
        big->n_generated = 10;
        hyla_session *x = NULL;
        CHECK(hyla_session_import(m, big, &x) == HYLA_ERR_FORMAT && strstr(hyla_last_error(), "token log"));
        hyla_snapshot_destroy(big);
    }
    hyla_snapshot_destroy(fresh);
    hyla_snapshot_destroy(back);
    hyla_snapshot_destroy(snap);
    hyla_session_free(f);
    hyla_session_free(b);
    hyla_session_free(a);
    free(p);
    test_unload(m);
}

/* Pipeline: stage A holds layers [0, 2), stage B [2, L); A's downstream runs B's sessions
 * (found through the session tag). Tokens equal the one-model run bit for bit, and the
 * snapshots of the two stages merged restore on the unsplit model. */
typedef struct {
    hyla_session *b[4];
} pipe_ctx;

static hyla_status run_stage_b(void *ud, hyla_session *const *ss, int R, int decode, const float *hidden, float *logits) {
    (void)ud;
    hyla_session *bs[64];
    int n = decode ? R : 1;
    for (int i = 0; i < n; i++) bs[i] = hyla_session_tag(ss[i]);
    return hyla_stage_forward(bs, R, decode, hidden, logits);
}

static void test_pipeline(hyla_backend *be, const char *tmp) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/pipe", tmp);
    make_model("sse-h", dir, NULL);
    hyla_runtime *full = NULL, *ma = NULL, *mb = NULL;
    hyla_model_params pa = hyla_model_default_params(), pb = hyla_model_default_params();
    pa.layer_end = 2;
    pb.layer_begin = 2;
    full = test_load(dir, be, NULL);
    ma = test_load(dir, be, &pa);
    mb = test_load(dir, be, &pb);
    if (!full || !ma || !mb) return;
    CHECK(hyla_model_fingerprint(test_model(ma)) == hyla_model_fingerprint(test_model(full)));
    hyla_runtime_set_downstream(ma, run_stage_b, NULL);
    int32_t *p = test_prompt(100, 9, 260);
    hyla_session *f = new_session(full, 0.7f, 5), *a = new_session(ma, 0.7f, 5), *b = NULL;
    CHECK_OK(hyla_session_create(mb, &b));
    hyla_session_set_tag(a, b);
    CHECK_OK(hyla_session_feed(f, p, 100, NULL, NULL, NULL, NULL));
    CHECK_OK(hyla_session_feed(a, p, 100, NULL, NULL, NULL, NULL));
    int32_t g1[16], g2[16];
    gen(f, 16, g1);
    gen(a, 16, g2);
    CHECK_MSG(!memcmp(g1, g2, sizeof g1), "pipeline tokens differ from the single model");
    /* merge the stage snapshots and resume on the unsplit model */
    hyla_snapshot *sa = NULL, *sb = NULL, *sf = NULL;
    CHECK_OK(hyla_session_export(a, &sa));
    CHECK_OK(hyla_session_export(b, &sb));
    CHECK_OK(hyla_session_export(f, &sf));
    if (sa && sb && sf) {
        for (uint32_t i = 0; i < sb->n_parts; i++) {
            const hyla_state_part *q = &sb->parts[i];
            hyla_state_part *np = NULL;
            CHECK_OK(hyla_snapshot_add_part(sa, q->layer, q->name, (hyla_part_kind)q->kind, (hyla_dtype)q->dtype, q->ndim,
                                            q->shape, q->page_tokens, &np));
            if (np) memcpy(np->data, q->data, q->nbytes);
        }
        CHECK_MSG(hyla_snapshot_equal(sa, sf), "merged stage snapshots differ from the unsplit model's");
        hyla_session *r = NULL;
        CHECK_OK(hyla_session_import(full, sa, &r));
        if (r) {
            gen(f, 8, g1);
            gen(r, 8, g2);
            CHECK_MSG(!memcmp(g1, g2, 8 * sizeof *g1), "resume of merged pipeline snapshot differs");
            hyla_session_free(r);
        }
    }
    hyla_snapshot_destroy(sa);
    hyla_snapshot_destroy(sb);
    hyla_snapshot_destroy(sf);
    free(p);
    hyla_session_free(f);
    hyla_session_free(a);
    hyla_session_free(b);
    test_unload(full);
    test_unload(ma);
    test_unload(mb);
}

/* An asynchronous in-process downstream: a post copies the group's rows and queues it; finish
 * runs the queued groups in order on the next stage's sessions (the poster's session tags),
 * writing their logits where the post asked, like a remote stage whose answers are read later.
 * It counts what it saw: the most groups of a step and the most posts unanswered at once. */
#define AQ_MAX 32
typedef struct {
    hyla_session *ss[64];
    int R, decode;
    hyla_stage_group g;
    float *hidden, *logits;
} aq_job;
typedef struct {
    aq_job q[AQ_MAX];
    int n, D, max_in_flight, max_groups;
    int fail; /* finish fails every job it reads (a next stage that went away) */
} aq;

static hyla_status aq_post(void *ud, const hyla_downstream_step *s) {
    aq *d = ud;
    if (d->n == AQ_MAX) return hyla_fail(HYLA_ERR_INTERNAL, "test downstream: more than %d posts in flight", AQ_MAX);
    aq_job *j = &d->q[d->n++];
    int n = s->decode ? s->R : 1;
    for (int i = 0; i < n; i++) j->ss[i] = hyla_session_tag(s->ss[i]);
    j->R = s->R;
    j->decode = s->decode;
    j->g = (hyla_stage_group){s->group, s->groups, s->row_offset, s->total_rows};
    j->hidden = malloc((size_t)s->R * d->D * sizeof(float));
    if (!j->hidden) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    memcpy(j->hidden, s->hidden, (size_t)s->R * d->D * sizeof(float)); /* the poster reuses its rows */
    j->logits = s->logits;
    if (d->n > d->max_in_flight) d->max_in_flight = d->n;
    if (s->groups > d->max_groups) d->max_groups = s->groups;
    return HYLA_OK;
}

static hyla_status aq_finish(void *ud, int keep) {
    aq *d = ud;
    hyla_status st = HYLA_OK;
    while (d->n > keep) {
        aq_job j = d->q[0];
        memmove(d->q, d->q + 1, (size_t)(d->n - 1) * sizeof *d->q);
        d->n--;
        if (st == HYLA_OK && d->fail) st = hyla_fail(HYLA_ERR_UNAVAILABLE, "test downstream: the next stage went away");
        if (st == HYLA_OK) st = hyla_stage_forward_group(j.ss, j.R, j.decode, j.hidden, j.logits, &j.g);
        free(j.hidden);
    }
    return st;
}

static const hyla_downstream_ops aq_ops = {aq_post, NULL, aq_finish, NULL};

/* Append every part of `from` to `to` (merging the stages' snapshots into a whole-model one). */
static void merge_parts(hyla_snapshot *to, const hyla_snapshot *from) {
    for (uint32_t i = 0; i < from->n_parts; i++) {
        const hyla_state_part *q = &from->parts[i];
        hyla_state_part *np = NULL;
        CHECK_OK(hyla_snapshot_add_part(to, q->layer, q->name, (hyla_part_kind)q->kind, (hyla_dtype)q->dtype, q->ndim,
                                        q->shape, q->page_tokens, &np));
        if (np) memcpy(np->data, q->data, q->nbytes);
    }
}

/* Micro-batched pipelines: two and three stages over the asynchronous downstream, with 1, 2
 * and 3 micro-batches, decode a batch of 24 sessions (greedy and sampled, prompts of different
 * lengths, one of 300 tokens fed in 64-token pieces that are posted without waiting), then
 * decode them in M lanes (each posted before the others are collected; no other forward while
 * they are): the tokens equal the unsplit model's bit for bit; a feed after them returns with pieces still posted, and
 * the export (which finishes them first) of the stages' snapshots, merged, equals the unsplit
 * model's and continues like it. The downstream saw the groups asked for (24 rows: at most 3 of >= 8)
 * and up to HYLA_DOWNSTREAM_IN_FLIGHT prefill pieces in flight. The whole model's own lanes (one,
 * then two posted together) give its plain steps' tokens too. */
#define MB_NS 24
#define MB_STEPS 10
#define MB_LANE_STEPS 6
static void test_pipeline_micro(hyla_backend *be, const char *tmp) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/pipe-mb", tmp);
    make_model("sse-h", dir, "--prefill-window 64"); /* pieces of 64: several in flight */
    hyla_runtime *full = test_load(dir, be, NULL);
    if (!full) return;
    const hyla_model_config *cfg = hyla_model_get_config(test_model(full));
    int32_t *prompts[MB_NS], lens[MB_NS];
    for (int i = 0; i < MB_NS; i++) {
        lens[i] = i == 0 ? 300 : 20 + 7 * i;
        prompts[i] = test_prompt(lens[i], 40 + i, cfg->vocab_size);
    }
    /* the reference: the unsplit model decodes the same batch */
    hyla_session *f[MB_NS];
    int32_t ref[MB_STEPS + MB_LANE_STEPS][MB_NS], out[MB_NS], cont_ref[8];
    for (int i = 0; i < MB_NS; i++) {
        f[i] = new_session(full, i % 2 ? 0.8f : 0.0f, 100 + i);
        CHECK_OK(hyla_session_feed(f[i], prompts[i], lens[i], NULL, NULL, NULL, NULL));
    }
    for (int t = 0; t < MB_STEPS + MB_LANE_STEPS; t++) CHECK_OK(hyla_session_decode(f, MB_NS, ref[t], NULL));
    int32_t *extra = test_prompt(70, 77, cfg->vocab_size); /* fed after the decode, then exported */
    CHECK_OK(hyla_session_feed(f[3], extra, 70, NULL, NULL, NULL, NULL));
    hyla_snapshot *sf = NULL;
    CHECK_OK(hyla_session_export(f[3], &sf));
    gen(f[3], 8, cont_ref);
    static const int bounds[2][4] = {{0, 2, 3, 0}, {0, 1, 2, 3}};
    for (int P = 2; P <= 3; P++)
        for (int M = 1; M <= 3; M++) {
            hyla_runtime *st[3] = {NULL, NULL, NULL};
            aq *qs = calloc(2, sizeof *qs);
            hyla_session *ss[3][MB_NS];
            CHECK(qs != NULL);
            for (int k = 0; k < P; k++) {
                hyla_model_params mp = hyla_model_default_params();
                mp.layer_begin = bounds[P - 2][k];
                mp.layer_end = bounds[P - 2][k + 1];
                st[k] = test_load(dir, be, &mp);
                if (!st[k]) return;
                if (k < P - 1) {
                    qs[k].D = cfg->hidden_size;
                    hyla_runtime_set_downstream_ops(st[k], &aq_ops, &qs[k]);
                    CHECK_OK(hyla_runtime_set_micro_batches(st[k], M));
                }
            }
            CHECK_OK(hyla_runtime_set_prefill_piece(st[0], hyla_runtime_prefill_chunk(st[0])));
            for (int i = 0; i < MB_NS; i++) {
                ss[0][i] = new_session(st[0], i % 2 ? 0.8f : 0.0f, 100 + i);
                for (int k = 1; k < P; k++) CHECK_OK(hyla_session_create(st[k], &ss[k][i]));
                for (int k = 0; k + 1 < P; k++) hyla_session_set_tag(ss[k][i], ss[k + 1][i]);
                CHECK_OK(hyla_session_feed(ss[0][i], prompts[i], lens[i], NULL, NULL, NULL, NULL));
            }
            CHECK_MSG(qs[0].max_in_flight == HYLA_DOWNSTREAM_IN_FLIGHT,
                      "P=%d M=%d: %d prefill pieces in flight at most, expected %d", P, M, qs[0].max_in_flight,
                      HYLA_DOWNSTREAM_IN_FLIGHT);
            int same = 1;
            for (int t = 0; t < MB_STEPS; t++) {
                CHECK_OK(hyla_session_decode(ss[0], MB_NS, out, NULL));
                same &= !memcmp(out, ref[t], sizeof out);
            }
            CHECK_MSG(same, "P=%d M=%d: micro-batched pipeline tokens differ from the unsplit model", P, M);
            for (int k = 0; k + 1 < P; k++)
                CHECK_MSG(qs[k].max_groups == M, "P=%d M=%d: stage %d posted steps of %d groups", P, M, k,
                          qs[k].max_groups);
            CHECK(qs[0].n == 0 && (P < 3 || qs[1].n == 0)); /* a decode finishes what was posted */
            if (M >= 2) { /* then M decode lanes, sessions dealt round robin, posted before collected */
                hyla_session *lb[3][MB_NS];
                int ln[3] = {0, 0, 0}, idx[3][MB_NS];
                for (int i = 0; i < MB_NS; i++) {
                    idx[i % M][ln[i % M]] = i;
                    lb[i % M][ln[i % M]++] = ss[0][i];
                }
                qs[0].max_in_flight = 0;
                for (int k = 0; k < M; k++) CHECK_OK(hyla_session_decode_post(lb[k], ln[k], k, k * MB_NS, M * MB_NS));
                hyla_session *other = new_session(st[0], 0.0f, 1); /* no other forward while lanes are posted */
                CHECK(hyla_session_feed(other, prompts[1], lens[1], NULL, NULL, NULL, NULL) == HYLA_ERR_INTERNAL);
                hyla_session_free(other);
                CHECK(hyla_session_decode_collect(lb[0], ln[0], 3, out) == HYLA_ERR_INVALID_ARG); /* lane 3: idle */
                CHECK(hyla_session_decode_post(lb[0], ln[0], 0, 0, M * MB_NS) == HYLA_ERR_INVALID_ARG); /* posted */
                int lanes_same = 1;
                for (int t = 0; t < MB_LANE_STEPS; t++)
                    for (int k = 0; k < M; k++) {
                        CHECK_OK(hyla_session_decode_collect(lb[k], ln[k], k, out));
                        for (int j = 0; j < ln[k]; j++) lanes_same &= out[j] == ref[MB_STEPS + t][idx[k][j]];
                        if (t + 1 < MB_LANE_STEPS) CHECK_OK(hyla_session_decode_post(lb[k], ln[k], k, k * MB_NS, M * MB_NS));
                    }
                CHECK_MSG(lanes_same, "P=%d: tokens of %d decode lanes differ from the unsplit model", P, M);
                CHECK_MSG(qs[0].max_in_flight == M, "P=%d: %d lanes posted, %d steps in flight at most", P, M,
                          qs[0].max_in_flight);
            } else {
                for (int t = 0; t < MB_LANE_STEPS; t++) {
                    CHECK_OK(hyla_session_decode(ss[0], MB_NS, out, NULL));
                    CHECK(!memcmp(out, ref[MB_STEPS + t], sizeof out));
                }
            }
            /* a feed that wants no logits returns with its pieces posted; the export finishes them */
            CHECK_OK(hyla_session_feed(ss[0][3], extra, 70, NULL, NULL, NULL, NULL));
            CHECK_MSG(qs[0].n > 0, "P=%d M=%d: the feed left no piece posted", P, M);
            /* the stages' snapshots of one session, merged, are the unsplit model's */
            hyla_snapshot *parts[3] = {NULL, NULL, NULL};
            for (int k = 0; k < P; k++) CHECK_OK(hyla_session_export(ss[k][3], &parts[k]));
            if (parts[0] && parts[P - 1]) {
                for (int k = 1; k < P; k++) merge_parts(parts[0], parts[k]);
                CHECK_MSG(hyla_snapshot_equal(parts[0], sf), "P=%d M=%d: merged stage snapshots differ", P, M);
                hyla_session *r = NULL;
                int32_t cont[8];
                CHECK_OK(hyla_session_import(full, parts[0], &r));
                if (r) {
                    gen(r, 8, cont);
                    CHECK_MSG(!memcmp(cont, cont_ref, sizeof cont), "P=%d M=%d: resume of the merged snapshot differs", P,
                              M);
                    hyla_session_free(r);
                }
            }
            if (P == 3 && M == 2) { /* a failed answer fails the decode that posted, with its message */
                qs[1].fail = 1;
                hyla_status fs = hyla_session_decode(ss[0], MB_NS, out, NULL);
                CHECK_MSG(fs == HYLA_ERR_UNAVAILABLE && strstr(hyla_last_error(), "the next stage went away"),
                          "a failed downstream answer: %s", hyla_last_error());
                CHECK(qs[0].n == 0 && qs[1].n == 0); /* nothing left posted */
            }
            for (int k = 0; k < P; k++) {
                hyla_snapshot_destroy(parts[k]);
                for (int i = 0; i < MB_NS; i++) hyla_session_free(ss[k][i]);
            }
            for (int k = 0; k < P; k++) test_unload(st[k]);
            free(qs);
        }
    { /* the whole model's lanes (a worker's step ahead): posted on the device's queue, sampled
       * at collect; one lane of every session, then two lanes posted together */
        hyla_session *g[MB_NS], *lb[2][MB_NS];
        for (int i = 0; i < MB_NS; i++) {
            g[i] = new_session(full, i % 2 ? 0.8f : 0.0f, 100 + i);
            CHECK_OK(hyla_session_feed(g[i], prompts[i], lens[i], NULL, NULL, NULL, NULL));
            lb[i % 2][i / 2] = g[i];
        }
        int same = 1, t = 0;
        for (; t < MB_STEPS; t++) {
            CHECK_OK(hyla_session_decode_post(g, MB_NS, 0, 0, MB_NS));
            if (t == 0) {
                hyla_session *other = new_session(full, 0.0f, 1); /* no other forward while posted */
                CHECK(hyla_session_feed(other, prompts[1], lens[1], NULL, NULL, NULL, NULL) == HYLA_ERR_INTERNAL);
                hyla_session_free(other);
                CHECK(hyla_session_decode_post(g, MB_NS, 0, 0, MB_NS) == HYLA_ERR_INVALID_ARG); /* posted */
            }
            CHECK_OK(hyla_session_decode_collect(g, MB_NS, 0, out));
            same &= !memcmp(out, ref[t], sizeof out);
        }
        CHECK_MSG(same, "one lane of the whole model: tokens differ from its plain decode steps");
        same = 1;
        for (; t < MB_STEPS + MB_LANE_STEPS; t++) {
            for (int k = 0; k < 2; k++) CHECK_OK(hyla_session_decode_post(lb[k], MB_NS / 2, k, k * MB_NS / 2, MB_NS));
            for (int k = 0; k < 2; k++) {
                CHECK_OK(hyla_session_decode_collect(lb[k], MB_NS / 2, k, out));
                for (int j = 0; j < MB_NS / 2; j++) same &= out[j] == ref[t][2 * j + k];
            }
        }
        CHECK_MSG(same, "two lanes of the whole model: tokens differ from its plain decode steps");
        for (int i = 0; i < MB_NS; i++) hyla_session_free(g[i]);
    }
    hyla_snapshot_destroy(sf);
    free(extra);
    for (int i = 0; i < MB_NS; i++) {
        hyla_session_free(f[i]);
        free(prompts[i]);
    }
    test_unload(full);
}

/* hyla_session_free with an export in flight is a programmer error: it aborts (the copies
 * would read freed KV pages). The child process only frees (no OpenMP region after fork). */
static void test_free_in_flight(hyla_backend *be, const char *tmp) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/inflight", tmp);
    make_model("gla-h", dir, NULL);
    hyla_runtime *m = NULL;
    hyla_session *s = NULL;
    hyla_export *e = NULL;
    int32_t t[3] = {1, 2, 3};
    m = test_load(dir, be, NULL);
    if (!m) return;
    s = new_session(m, 0, 1);
    CHECK_OK(hyla_session_feed(s, t, 3, NULL, NULL, NULL, NULL));
    CHECK_OK(hyla_session_export_begin(s, &e));
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stderr)) _exit(4); /* the expected assertion message */
        hyla_session_free(s);
        _exit(0);
    }
    int st = 0;
    CHECK(pid > 0 && waitpid(pid, &st, 0) == pid);
    CHECK_MSG(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "freeing a session with an export in flight did not abort (status %d)",
              st);
    if (e) CHECK_OK(hyla_session_export_end(e, NULL));
    hyla_session_free(s);
    test_unload(m);
}

/* HYLA_PROFILE (hyla_profile.h): with profiling on, a prefill charges time to the forward's
 * marks (the mixers', the attention layers', the MLP's) and a decode step to the decode table;
 * off, nothing is printed; and the tokens are those of an unprofiled run. */
static void test_profile(hyla_backend *be, const char *tmp) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/prof", tmp);
    make_model("sse-h", dir, "--layers 6");
    hyla_runtime *m = test_load(dir, be, NULL);
    if (!m) return;
    int32_t *p = test_prompt(100, 3, hyla_model_get_config(test_model(m))->vocab_size);
    int32_t t0[4], t1[4];
    for (int on = 0; on < 2; on++) {
        hyla_prof_on = on;
        hyla_prof_reset();
        hyla_session *s = NULL;
        CHECK_OK(hyla_session_create(m, &s));
        CHECK_OK(hyla_session_feed(s, p, 100, NULL, NULL, NULL, NULL));
        for (int i = 0; i < 4; i++) CHECK_OK(hyla_session_decode(&s, 1, on ? &t1[i] : &t0[i], NULL));
        hyla_session_free(s);
    }
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    hyla_prof_print_json(f);
    fclose(f);
    CHECK_MSG(buf && strstr(buf, "\"prefill\":[{") && strstr(buf, "\"decode\":[{"), "profile: both tables filled: %s",
              buf ? buf : "(null)");
    const char *labels[] = {"\"sse: core\"", "\"attn: norms, rope, pages, core\"", "\"mlp: swiglu, down proj\"", "\"norm\""};
    for (int i = 0; buf && i < 4; i++) CHECK_MSG(strstr(buf, labels[i]) != NULL, "profile has no %s", labels[i]);
    free(buf);
    CHECK_MSG(memcmp(t0, t1, sizeof t0) == 0, "profiling changed the sampled tokens");
    hyla_prof_on = 0;
    buf = NULL;
    f = open_memstream(&buf, &len);
    hyla_prof_print_json(f);
    fclose(f);
    CHECK_MSG(len == 0, "profile off: printed %zu bytes", len);
    free(buf);
    free(p);
    test_unload(m);
}

/* laLTE's promise: the state of its lte layers does not grow with the context. A session at 40
 * and at 400 tokens exports lte parts of the same names, shapes and bytes (the GDN layers are
 * constant too); the counters say 400 tokens, retained counts within the budget (reached by some
 * head) and a scoring counter inside the window. */
static uint64_t lte_bytes(const hyla_snapshot *sn, uint64_t *all) {
    uint64_t b = 0;
    *all = 0;
    for (uint32_t i = 0; i < sn->n_parts; i++) {
        *all += sn->parts[i].nbytes;
        if (sn->parts[i].kind == HYLA_PART_LTE) b += sn->parts[i].nbytes;
    }
    return b;
}

static void test_lte_constant_state(hyla_backend *be, const char *tmp) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/lte-const", tmp);
    make_model("lalte", dir, "--window 16 --sink 2 --budget 6");
    hyla_runtime *m = test_load(dir, be, NULL);
    if (!m) return;
    int V = hyla_model_get_config(test_model(m))->vocab_size;
    int32_t *p = test_prompt(401, 3, V);
    hyla_snapshot *a = NULL, *b = NULL;
    hyla_session *s = new_session(m, 0, 1);
    CHECK_OK(hyla_session_feed(s, p, 41, NULL, NULL, NULL, NULL));
    CHECK_OK(hyla_session_export(s, &a));
    CHECK_OK(hyla_session_feed(s, p + 41, 360, NULL, NULL, NULL, NULL));
    CHECK_OK(hyla_session_export(s, &b));
    uint64_t ta, tb;
    CHECK(a && b && lte_bytes(a, &ta) > 0);
    CHECK_MSG(a && b && lte_bytes(a, &ta) == lte_bytes(b, &tb) && ta == tb,
              "lalte: state bytes at 40 tokens (%llu) and at 400 (%llu) differ", (unsigned long long)ta,
              (unsigned long long)tb);
    int full = 0;
    for (uint32_t i = 0; b && i < b->n_parts; i++) {
        const hyla_state_part *q = &b->parts[i];
        if (q->kind != HYLA_PART_LTE || strcmp(q->name, "meta")) continue;
        const int32_t *meta = q->data;
        CHECK_MSG(meta[0] == 400, "lalte layer %u: meta holds %d tokens, want 400", q->layer, (int)meta[0]);
        CHECK_MSG(meta[1] > 400 - 16 && meta[1] <= 400, "lalte layer %u: next position to score %d", q->layer, (int)meta[1]);
        for (uint64_t h = 2; h < q->shape[0]; h++) {
            CHECK_MSG(meta[h] >= 0 && meta[h] <= 6, "lalte layer %u: head %d retains %d (budget 6)", q->layer,
                      (int)h - 2, (int)meta[h]);
            full += meta[h] == 6;
        }
    }
    CHECK_MSG(full > 0, "lalte: no head filled its budget of 6 in 400 tokens");
    hyla_snapshot_destroy(a);
    hyla_snapshot_destroy(b);
    hyla_session_free(s);
    free(p);
    test_unload(m);
}

/* DLA (each base): with capacity 4 (threshold 1.4, see test_arch), 300 tokens fill every head's
 * cache; per head the counts of the states in use sum to the tokens fed, scores are finite and
 * non-negative, and the state bytes do not grow with the context. */
static void test_dla_cache(hyla_backend *be, const char *tmp, const char *arch) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s-cache", tmp, arch);
    make_model(arch, dir, "--dla-capacity 4 --dla-threshold 1.4");
    hyla_runtime *m = test_load(dir, be, NULL);
    if (!m) return;
    int V = hyla_model_get_config(test_model(m))->vocab_size;
    int32_t *p = test_prompt(301, 5, V); /* the last token fed waits for the next step */
    hyla_snapshot *a = NULL, *b = NULL;
    hyla_session *s = new_session(m, 0, 1);
    CHECK_OK(hyla_session_feed(s, p, 30, NULL, NULL, NULL, NULL));
    CHECK_OK(hyla_session_export(s, &a));
    CHECK_OK(hyla_session_feed(s, p + 30, 271, NULL, NULL, NULL, NULL));
    CHECK_OK(hyla_session_export(s, &b));
    CHECK(a && b && a->n_parts == b->n_parts);
    for (uint32_t i = 0; a && b && i < b->n_parts && i < a->n_parts; i++)
        CHECK_MSG(a->parts[i].nbytes == b->parts[i].nbytes, "%s: part %s grew from 30 to 300 tokens", arch,
                  b->parts[i].name);
    const int32_t *n = NULL, *mm = NULL;
    const float *I = NULL;
    int heads = 0, full = 0, merged = 0, dla_layers = 0;
    for (uint32_t i = 0; b && i < b->n_parts; i++) {
        const hyla_state_part *q = &b->parts[i];
        if (q->kind != HYLA_PART_DLA) continue;
        if (!strcmp(q->name, "n")) n = q->data, heads = (int)q->shape[0];
        if (!strcmp(q->name, "I")) I = q->data;
        if (!strcmp(q->name, "m")) mm = q->data;
        if (!n || !I || !mm) continue;
        dla_layers++;
        for (int h = 0; h < heads; h++) {
            int tot = 0;
            CHECK_MSG(mm[h] >= 1 && mm[h] <= 4, "%s layer %u head %d: %d states (capacity 4)", arch, q->layer,
                      h, (int)mm[h]);
            for (int j = 0; j < mm[h] && j < 4; j++) {
                tot += n[h * 4 + j];
                merged += n[h * 4 + j] > 1;
                CHECK_MSG(isfinite(I[h * 4 + j]) && I[h * 4 + j] >= 0, "%s layer %u head %d: score %g", arch, q->layer,
                          h, (double)I[h * 4 + j]);
            }
            full += mm[h] == 4;
            CHECK_MSG(tot == 300, "%s layer %u head %d: counts sum to %d, want 300", arch, q->layer, h, tot);
        }
        n = mm = NULL, I = NULL;
    }
    CHECK_MSG(dla_layers > 0 && full > 0 && merged > 0, "%s: %d layers, %d full heads, %d merged states", arch,
              dla_layers, full, merged);
    hyla_snapshot_destroy(a);
    hyla_snapshot_destroy(b);
    hyla_session_free(s);
    free(p);
    test_unload(m);
}

/* SSE's default prefill window (256 tokens): the model's prefill chunk is 256, so pieces are
 * multiples of it (64 refused, naming the window), and pieces of 256 and 512, and feeds that end
 * at multiples of 256, give the one-piece run's logits and state bit for bit; a model of windows
 * of 64 has other bits (its chunks are cut elsewhere) within rounding of them. */
static void test_sse_window(hyla_backend *be, const char *tmp) {
    char d256[512], d64[512];
    snprintf(d256, sizeof d256, "%s/sse-w256", tmp);
    snprintf(d64, sizeof d64, "%s/sse-w64", tmp);
    make_model("sse-h", d256, "--window 40");
    make_model("sse-h", d64, "--window 40 --prefill-window 64");
    hyla_runtime *m = test_load(d256, be, NULL), *m64 = test_load(d64, be, NULL);
    if (!m || !m64) return;
    const hyla_model_config *c = hyla_model_get_config(test_model(m));
    CHECK_MSG(c->prefill_chunk == 256 && hyla_runtime_prefill_chunk(m) == 256, "sse-h: prefill chunk %d, expected 256",
              c->prefill_chunk);
    CHECK(hyla_runtime_prefill_chunk(m64) == 64);
    CHECK(hyla_runtime_prefill_piece(m) % 256 == 0);
    CHECK(hyla_runtime_set_prefill_piece(m, 64) == HYLA_ERR_INVALID_ARG);
    CHECK_MSG(strstr(hyla_last_error(), "256") && strstr(hyla_last_error(), "prefill_window"),
              "the refusal of a 64-token piece does not name the window: %s", hyla_last_error());
    CHECK(hyla_runtime_set_prefill_piece(m, 384) == HYLA_ERR_INVALID_ARG);
    const int V = c->vocab_size, T = 700;
    int32_t *p = test_prompt(T, 21, V);
    float *l0 = malloc((size_t)T * V * sizeof(float)), *l1 = malloc((size_t)T * V * sizeof(float));
    hyla_session *a = new_session(m, 0, 1);
    CHECK_OK(hyla_session_feed(a, p, T, l0, NULL, NULL, NULL)); /* one piece of 699 */
    hyla_snapshot *s0 = NULL;
    CHECK_OK(hyla_session_export(a, &s0));
    for (int piece = 256; piece <= 512; piece += 256) {
        CHECK_OK(hyla_runtime_set_prefill_piece(m, piece));
        hyla_session *b = new_session(m, 0, 1);
        CHECK_OK(hyla_session_feed(b, p, T, l1, NULL, NULL, NULL));
        hyla_snapshot *s1 = NULL;
        CHECK_OK(hyla_session_export(b, &s1));
        CHECK_MSG(!memcmp(l0, l1, (size_t)(T - 1) * V * sizeof(float)) && s0 && s1 && hyla_snapshot_equal(s0, s1),
                  "sse-h, window 256: prefill pieces of %d tokens differ from one piece (logits or state)", piece);
        hyla_snapshot_destroy(s1);
        hyla_session_free(b);
    }
    CHECK_OK(hyla_runtime_set_prefill_piece(m, HYLA_PREFILL_PIECE_DEFAULT));
    /* feeds ending at 256 and 512 (the first consumes 256, its last token pending) */
    hyla_session *b = new_session(m, 0, 1);
    CHECK_OK(hyla_session_feed(b, p, 257, NULL, NULL, NULL, NULL));
    CHECK_OK(hyla_session_feed(b, p + 257, 256, NULL, NULL, NULL, NULL));
    CHECK_OK(hyla_session_feed(b, p + 513, T - 513, NULL, NULL, NULL, NULL));
    hyla_snapshot *s2 = NULL;
    CHECK_OK(hyla_session_export(b, &s2));
    CHECK_MSG(s0 && s2 && hyla_snapshot_equal(s0, s2), "sse-h, window 256: feeds ending at 256 and 512 differ from one feed");
    hyla_snapshot_destroy(s2);
    hyla_session_free(b);
    /* windows of 64: other chunks, the same model up to rounding */
    hyla_session *d = new_session(m64, 0, 1);
    CHECK_OK(hyla_session_feed(d, p, T, l1, NULL, NULL, NULL));
    CHECK_CLOSE(l1, l0, (size_t)(T - 1) * V, 2e-3, 1e-3, "sse-h: windows of 64 against 256, logits");
    CHECK_MSG(memcmp(l1, l0, (size_t)(T - 1) * V * sizeof(float)), "sse-h: windows of 64 and 256 gave the same bits");
    hyla_session_free(d);
    hyla_snapshot_destroy(s0);
    hyla_session_free(a);
    free(p), free(l0), free(l1);
    test_unload(m);
    test_unload(m64);
}

int main(void) {
    char tmp[] = "/tmp/hyla-test-engine-XXXXXX";
    if (!mkdtemp(tmp)) return 1;
    hyla_backend *be = NULL;
    CHECK_OK(hyla_backend_create("cpu", &be));
    for (size_t i = 0; i < sizeof ARCHS / sizeof *ARCHS; i++) {
        char dir[512];
        snprintf(dir, sizeof dir, "%s/%s", tmp, ARCHS[i]);
        test_arch(be, ARCHS[i], dir);
    }
    test_sse_window(be, tmp);
    test_refusals(be, tmp);
    test_restore(be, tmp);
    test_token_log(be, tmp);
    test_pipeline(be, tmp);
    test_pipeline_micro(be, tmp);
    test_free_in_flight(be, tmp);
    test_profile(be, tmp);
    test_lte_constant_state(be, tmp);
    test_dla_cache(be, tmp, "dla-gdn");
    test_dla_cache(be, tmp, "dla-mamba2");
    hyla_backend_destroy(be);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (system(cmd) != 0) return 1;
    return hyla_test_done("test_engine");
}
