/* hyla_linear_multi.c — what every backend's linear_multi shares (hyla_ops.h): outputs with
 * their own x or their own accumulate, split into one call per (x, accumulate). Its own small library, linked by the CPU backend and by
 * the CUDA one (whose kernel-lab programs link it without the rest). */
#include "hyla_ops.h"

int hyla_linear_multi_has_x(const float *x, int n, const hyla_linear_out *outs) {
    for (int j = 0; j < n; j++)
        if ((outs[j].x && outs[j].x != x) || outs[j].acc) return 1;
    return 0;
}

hyla_status hyla_linear_multi_by_x(hyla_linear_multi_fn fn, void *ctx, const float *x, int ldx, int M, int K, int n,
                                   const hyla_linear_out *outs, int accumulate, int flags) {
    if (n < 1 || n > HYLA_LINEAR_MULTI_MAX)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "linear_multi: %d outputs (1..%d)", n, HYLA_LINEAR_MULTI_MAX);
    if (flags & HYLA_LINEAR_X_BF16)
        for (int j = 0; j < n; j++)
            if (outs[j].x && outs[j].x != x)
                return hyla_fail(HYLA_ERR_INVALID_ARG, "linear_multi: output %d has its own x with bf16 rows", j);
    int done[HYLA_LINEAR_MULTI_MAX] = {0};
    for (int j = 0; j < n; j++) {
        if (done[j]) continue;
        const float *xj = outs[j].x && outs[j].x != x ? outs[j].x : x;
        const int aj = accumulate || outs[j].acc;
        hyla_linear_out g[HYLA_LINEAR_MULTI_MAX];
        int m = 0;
        for (int i = j; i < n; i++) {
            const float *xi = outs[i].x && outs[i].x != x ? outs[i].x : x;
            if (done[i] || xi != xj || (accumulate || outs[i].acc) != aj) continue;
            g[m] = outs[i];
            g[m].x = NULL;
            g[m++].acc = 0;
            done[i] = 1;
        }
        HYLA_TRY(fn(ctx, xj, xj == x ? ldx : K, M, K, m, g, aj, flags));
    }
    return HYLA_OK;
}

