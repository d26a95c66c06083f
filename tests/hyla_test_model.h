/* hyla_test_model.h — a model and the runtime its sessions run on, loaded and freed together
 * (tests that drive sessions need both; the model stays reachable through the runtime). */
#ifndef HYLA_TEST_MODEL_H
#define HYLA_TEST_MODEL_H

#include "hyla_runtime.h"
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

#endif
