/* cpu_impl.h — private structs and helpers of the CPU reference backend, shared by
 * cpu_backend.c (memory, weights, dense ops, sampling, the ops table) and cpu_mixers.c
 * (GLA, GDN, SSE, attention). Not a public header: everything outside kernels/cpu/ goes
 * through hyla_ops.h.
 *
 * Invariants: device pointers are plain host memory (64-byte aligned, zero-filled at
 * alloc); weights are fp32, packed in panels of 8 rows (struct hyla_weight).
 * Threading: one thread drives one context (the hyla_ops rule); inside an op, work is
 * spread over ctx->nt OpenMP threads. */
#ifndef HYLA_CPU_IMPL_H
#define HYLA_CPU_IMPL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "hyla_ops.h"

/* Output features per weight panel (see cpu_linear). */
#define CPU_PANEL 8

struct hyla_weight {
    int rows, cols; /* PyTorch nn.Linear layout: rows = out_features */
    size_t pstride; /* floats from one panel to the next: cpu_panel_stride(cols) */
    float *packed;  /* [ceil(rows/8)] panels of [cols][8] fp32: element (r, k) at
                       packed[(r/8)*pstride + k*8 + r%8]; rows past `rows` are zero */
};

/* cols*8 plus one cache line, so panels read side by side fall in different cache sets. */
static inline size_t cpu_panel_stride(int cols) { return (size_t)cols * CPU_PANEL + 16; }

typedef struct {
    int nt;               /* OpenMP threads used by every parallel region */
    void *scratch;        /* grows on demand, never shrinks: no allocation in steady state */
    size_t scratch_bytes;
    int bf16_rows;        /* HYLA_CPU_BF16_ROWS=1 at creation: the bf16 prompt rows (cpu_backend.c) */
    double capture_s;     /* HYLA_CPU_CAPTURE_MS at creation: how long a capture's copies take (cpu_backend.c) */
} cpu_ctx;

/* A scratch region of at least `bytes` bytes (64-byte aligned), valid until the next call.
 * Ops call it once and carve the region; it is never used by two ops at once. */
hyla_status cpu_scratch(cpu_ctx *c, size_t bytes, void **out);

/* Round a byte count up to a multiple of 64 so carved sub-buffers stay aligned. */
static inline size_t cpu_align64(size_t n) { return (n + 63) & ~(size_t)63; }

static inline float cpu_silu(float x) { return x / (1.0f + expf(-x)); }

/* ---- mixers (cpu_mixers.c); signatures as in hyla_ops.h ---- */
hyla_status cpu_gla_prefill(void *ctx, const float *q, const float *k, const float *v, const float *gk,
                            int n, int H, int dk, int dv, float scale, float *S, float *o);
hyla_status cpu_gla_decode(void *ctx, const float *q, const float *k, const float *v, const float *gk,
                           int B, int H, int dk, int dv, float scale, float *const *S, float *o);
hyla_status cpu_gdn_prefill(void *ctx, const float *q, const float *k, const float *v, const float *g,
                            const float *beta, int n, int H, int dk, int dv, float scale, float *S,
                            float *o);
hyla_status cpu_gdn_decode(void *ctx, const float *q, const float *k, const float *v, const float *g,
                           const float *beta, int B, int H, int dk, int dv, float scale,
                           float *const *S, float *o);
hyla_status cpu_attn_prefill(void *ctx, const float *q, const float *k, const float *v, int n, int Hq,
                             int Hk, int D, int pos0, const hyla_kv_view *kv, int window, float scale,
                             float *o);
hyla_status cpu_attn_decode(void *ctx, const float *q, const float *k, const float *v, int B, int Hq,
                            int Hk, int D, const int32_t *pos, const hyla_kv_view *kv, int window,
                            float scale, float *o);
hyla_status cpu_sse_route(void *ctx, const float *logits, int n, int N, int K, int32_t *idx, float *w);
hyla_status cpu_sse_prefill(void *ctx, hyla_sse_transition tr, const float *q1, const float *k1,
                            const float *q2, const float *k2, const float *v, const float *ga,
                            const float *gb, const float *betaa, const float *betab,
                            const int32_t *idx, const float *w, int n, int H, int dk, int dv, int N,
                            int K, float scale, int window, float *S0, float *Sp, float *o);
hyla_status cpu_sse_decode(void *ctx, hyla_sse_transition tr, const float *q1, const float *k1,
                           const float *q2, const float *k2, const float *v, const float *ga,
                           const float *gb, const float *betaa, const float *betab,
                           const int32_t *idx, const float *w, int B, int H, int dk, int dv, int N,
                           int K, float scale, float *const *S0, float *const *Sp, float *o);

/* ---- LTE (cpu_lte.c); signatures as in hyla_ops.h ---- */
hyla_status cpu_lte_score(void *ctx, const hyla_lte_params *p, const float *x, int T, int x0, float *r);
hyla_status cpu_lte_prefill(void *ctx, const hyla_lte_params *p, const float *q, const float *k, const float *v,
                            int n, int Hq, int pos0, const hyla_lte_cache *c, float scale, float *o);
hyla_status cpu_lte_decode(void *ctx, const hyla_lte_params *p, const float *q, const float *k, const float *v,
                           int B, int Hq, const int32_t *pos, const hyla_lte_cache *c, float scale, float *o);

/* ---- NSA (cpu_nsa.c); signatures as in hyla_ops.h ---- */
hyla_status cpu_nsa_prefill(void *ctx, const float *q, const float *k, const float *v, const float *g, int n, int Hq,
                            int Hk, int D, int pos0, const hyla_kv_view *kv, int block, int counts, int window,
                            float scale, float *o);
hyla_status cpu_nsa_decode(void *ctx, const float *q, const float *k, const float *v, const float *g, int B, int Hq,
                           int Hk, int D, const int32_t *pos, const hyla_kv_view *kv, int block, int counts,
                           int window, float scale, float *o);

/* ---- Mamba2 (cpu_mamba2.c); signatures as in hyla_ops.h ---- */
hyla_status cpu_copy2d(void *ctx, float *dst, int ldd, const float *src, int lds, int rows, int cols);
hyla_status cpu_ssd_prefill(void *ctx, const float *xbc, int ldx, const float *dt, int ld_dt, const float *dt_bias,
                            const float *A_log, const float *Dskip, float dt_min, float dt_max, int n, int H, int P,
                            int G, int N, float *S, float *y);
hyla_status cpu_ssd_decode(void *ctx, const float *xbc, int ldx, const float *dt, int ld_dt, const float *dt_bias,
                           const float *A_log, const float *Dskip, float dt_min, float dt_max, int B, int H, int P,
                           int G, int N, float *const *S, float *y);
hyla_status cpu_ssd_norm(void *ctx, const float *o, const float *z, int ldz, const float *w, float *y, int rows, int G,
                         int gs, float eps);
hyla_status cpu_ssd_gates(void *ctx, const float *dt, int ld_dt, const float *dt_bias, const float *A_log, float dt_min,
                          float dt_max, int n, int H, float *a, float *dtp);
hyla_status cpu_ssd_skip(void *ctx, float *y, const float *x, int ldx, const float *Dskip, int n, int H, int P);

/* ---- DLA (cpu_dla.c); signatures as in hyla_ops.h ---- */
hyla_status cpu_dla_prefill(void *ctx, const hyla_dla_params *p, const float *q, const float *k, const float *v,
                            const float *g, const float *erase, const float *write, const float *lam, int n,
                            float scale, const hyla_dla_cache *c, float *o);
hyla_status cpu_dla_decode(void *ctx, const hyla_dla_params *p, const float *q, const float *k, const float *v,
                           const float *g, const float *erase, const float *write, const float *lam, int B,
                           float scale, const hyla_dla_cache *c, float *o);
/* [DLA-2] the information score of the token state w k v^T against state S [dk][dv] of a head
 * holding m states (tests compare it with their own). */
float cpu_dla_score(const hyla_dla_params *p, const float *S, int m, const float *k, const float *v, float w);

#endif
