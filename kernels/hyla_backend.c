/* hyla_backend.c — picks a backend by device name ("cpu", "cuda", "cuda:N").
 * The CUDA constructor exists only when the CUDA backend is built (HYLA_HAVE_CUDA). */
#include <stdlib.h>
#include <string.h>

#include "hyla_ops.h"

#ifndef HYLA_HAVE_CUDA
hyla_status hyla_cuda_backend_create(int device, hyla_backend **out) {
    (void)device;
    *out = NULL;
    return hyla_fail(HYLA_ERR_UNSUPPORTED, "this build has no CUDA backend (nvcc was not found at build time)");
}
int hyla_cuda_available(void) { return 0; }
#endif

hyla_status hyla_backend_create(const char *device, hyla_backend **out) {
    *out = NULL;
    if (!device || !strcmp(device, "cpu")) {
        const char *t = getenv("HYLA_CPU_THREADS");
        return hyla_cpu_backend_create(t ? atoi(t) : 0, out);
    }
    if (!strncmp(device, "cuda", 4)) {
        int idx = 0;
        if (device[4] == ':') {
            char *end;
            long v = strtol(device + 5, &end, 10);
            if (*end || end == device + 5 || v < 0)
                return hyla_fail(HYLA_ERR_INVALID_ARG, "device '%s': expected cuda:N with N >= 0", device);
            idx = (int)v;
        } else if (device[4]) {
            return hyla_fail(HYLA_ERR_INVALID_ARG, "device '%s': expected cpu, cuda or cuda:N", device);
        }
        return hyla_cuda_backend_create(idx, out);
    }
    return hyla_fail(HYLA_ERR_INVALID_ARG, "device '%s': expected cpu, cuda or cuda:N", device);
}

void hyla_backend_destroy(hyla_backend *b) {
    if (!b) return;
    if (b->ops && b->ops->destroy) b->ops->destroy(b->ctx);
    free(b);
}
