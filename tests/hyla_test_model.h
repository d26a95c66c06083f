/* hyla_test_model.h — a model and the runtime its sessions run on, loaded and freed together
 * (tests that drive sessions need both; the model stays reachable through the runtime). */
#ifndef HYLA_TEST_MODEL_H
#define HYLA_TEST_MODEL_H

#include <stdlib.h>

#include "hyla_runtime.h"
#include "hyla_session.h"
#include "hyla_test.h"

/* Load dir on be (params may be NULL) and create its runtime; NULL (with a CHECK failure
 * recorded) when either fails. */
static inline hyla_runtime *test_load(const char *dir, hyla_backend *be, const hyla_model_params *params) {
    hyla_model *m = NULL;
    hyla_runtime *rt = NULL;
    CHECK_OK(hyla_model_load(dir, be, params, &m));
    if (!m) return NULL;
    CHECK_OK(hyla_runtime_create(m, &rt));
    if (!rt) hyla_model_free(m);
    return rt;
}

static inline hyla_model *test_model(hyla_runtime *rt) { return (hyla_model *)hyla_runtime_model(rt); }

static inline void test_unload(hyla_runtime *rt) {
    if (!rt) return;
    hyla_model *m = test_model(rt);
    hyla_runtime_free(rt);
    hyla_model_free(m);
}

/* n random token ids below min(vocab, 256) from seed; caller frees. */
static inline int32_t *test_prompt(int n, uint64_t seed, int vocab) {
    int32_t *t = malloc((size_t)n * sizeof *t);
    hyla_rng r;
    hyla_rng_seed(&r, seed);
    for (int i = 0; i < n; i++) t[i] = (int32_t)(hyla_rng_next(&r) % (uint64_t)(vocab < 256 ? vocab : 256));
    return t;
}

/* hyla_session_import_begin / _ranges / _end with every part cut into pieces of `piece` bytes,
 * given last piece first, three ranges per call. NULL on failure. */
static inline hyla_session *test_streamed_import(hyla_runtime *rt, const hyla_snapshot *snap, uint64_t piece) {
    hyla_import *im = NULL;
    CHECK_OK(hyla_session_import_begin(rt, snap, &im));
    if (!im) return NULL;
    uint32_t part[3];
    uint64_t off[3], len[3];
    int n = 0;
    for (uint32_t k = snap->n_parts; k-- > 0;) {
        for (uint64_t e = snap->parts[k].nbytes; e > 0;) {
            uint64_t o = e > piece ? e - piece : 0;
            part[n] = k, off[n] = o, len[n] = e - o;
            if (++n == 3) {
                CHECK_OK(hyla_session_import_ranges(im, n, part, off, len));
                n = 0;
            }
            e = o;
        }
    }
    if (n) CHECK_OK(hyla_session_import_ranges(im, n, part, off, len));
    hyla_session *s = NULL;
    CHECK_OK(hyla_session_import_end(im, &s));
    return s;
}

#endif
