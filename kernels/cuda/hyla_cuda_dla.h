/* hyla_cuda_dla.h — the DLA ops of the CUDA backend (hyla_cuda_dla.cu) and Mamba2's gates and
 * skip outside the SSD ops, which DLA over Mamba2 uses; signatures as in hyla_ops.h. Each one
 * flushes the graph log first (none is logged). Internal to kernels/cuda/. */
#ifndef HYLA_CUDA_DLA_H
#define HYLA_CUDA_DLA_H

#include "hyla_ops.h"

#ifdef __cplusplus
extern "C" {
#endif
hyla_status cu_dla_prefill(void *ctx, const hyla_dla_params *p, const float *q, const float *k, const float *v,
                           const float *g, const float *erase, const float *write, const float *lam, int n,
                           float scale, const hyla_dla_cache *c, float *o);
hyla_status cu_dla_decode(void *ctx, const hyla_dla_params *p, const float *q, const float *k, const float *v,
                          const float *g, const float *erase, const float *write, const float *lam, int B,
                          float scale, const hyla_dla_cache *c, float *o);
hyla_status cu_ssd_gates(void *ctx, const float *dt, int ld_dt, const float *dt_bias, const float *A_log,
                         float dt_min, float dt_max, int n, int H, float *a, float *dtp);
hyla_status cu_ssd_skip(void *ctx, float *y, const float *x, int ldx, const float *Dskip, int n, int H, int P);
#ifdef __cplusplus
}
#endif

#endif
