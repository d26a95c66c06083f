/* hyla_ops.h — the one ops interface every compute backend implements.
 *
 * A backend is a table of function pointers plus a context (hyla_backend). The model
 * runtime (worker/hyla_model.c) composes these ops into layers; it never touches memory
 * through anything but these ops, so the CPU reference (kernels/cpu/) and the CUDA backend
 * (kernels/cuda/) are interchangeable at run time.
 *
 * Conventions (binding for every implementation):
 *   - "device pointer": memory from ops->alloc (host memory on the CPU backend, GPU memory on
 *     CUDA). Arguments typed `float *` / `void *` below are device pointers unless the comment
 *     says "host". Pointer arithmetic on device pointers is allowed (slices of a buffer).
 *   - Arrays of per-session pointers (`float *const *S`) are HOST arrays of device pointers.
 *   - Activations, gates and recurrent states are fp32. KV pages hold ops->kv_dtype elements.
 *   - Row-major everywhere. Shapes are written [outer]...[inner] next to each argument.
 *   - Every op returns HYLA_OK or a status with a detail (hyla_fail). An asynchronous backend
 *     may report a failure at the next op or at sync(); none aborts the process.
 *   - Ops are not thread-safe on one context: one thread drives one backend context.
 *
 * The exact math of each op is specified in docs/MODELS.md ("Operators"). Numbers in
 * brackets there ([GLA-1] ...) are cited in the implementations. */
#ifndef HYLA_OPS_H
#define HYLA_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "hyla_status.h"
#include "hyla_util.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A weight matrix W [rows][cols] (a PyTorch nn.Linear weight: rows = out_features), stored
 * however the backend likes (CPU: fp32; CUDA: bf16). Opaque. */
typedef struct hyla_weight hyla_weight;

/* Paged KV cache of one attention layer of one session.
 * Token t lives in page t / page_tokens, row t % page_tokens.
 * k_pages[p], v_pages[p]: device pointers to [page_tokens][n_kv_heads][head_dim] kv_dtype,
 * or NULL for a page that lies wholly outside every future window (sliding window: freed). */
typedef struct {
    void *const *k_pages; /* host array [n_pages] of device pointers */
    void *const *v_pages; /* host array [n_pages] of device pointers */
    int n_pages;          /* pages available (capacity = n_pages * page_tokens tokens) */
    int page_tokens;
    /* NSA only (NULL elsewhere): the compressed blocks, a cache derived from the KV and never
     * in snapshots. c_pages[i]: device pointer to blocks i*page_tokens.. as rows
     * [page_tokens][2][n_kv_heads][head_dim] fp32 (each block's mean key, then mean value).
     * Rows < c_valid hold their blocks; the op fills the rest up to the last block complete
     * after its tokens. NULL: the op derives every block it needs from the KV. */
    void *const *c_pages;
    int c_n_pages;
    int c_valid;
} hyla_kv_view;

/* Sampling parameters of one session. temperature <= 0 means greedy (argmax, lowest index on
 * ties). top_k <= 0 disables top-k; top_p >= 1 disables top-p. */
typedef struct {
    float temperature;
    int32_t top_k;
    float top_p;
} hyla_sampling;

typedef enum { HYLA_SSE_GLA = 0, HYLA_SSE_GDN = 1 } hyla_sse_transition;

/* One output of linear_multi: y [M][N] (row stride ldy) = x @ W^T (+ bias). */
#define HYLA_LINEAR_MULTI_MAX 10 /* an SSE layer's projections of xn: q, k, v, LoRA inputs, gates' inputs... */
#define HYLA_LINEAR_PREFILL 1 /* linear_multi flag: prompt rows (see linear_multi) */
#define HYLA_LINEAR_X_BF16 2  /* x is bf16 rows from rmsnorm_bf16 (prompt rows, or decode_bf16_rows) */
#define HYLA_LINEAR_Y_BF16 4  /* with HYLA_LINEAR_PREFILL: the outputs are bf16 (see linear_multi) */
#define HYLA_LINEAR_GATE_BF16 8 /* gated_rmsnorm_linear, with HYLA_LINEAR_PREFILL: gate is bf16 (see there) */
#define HYLA_LINEAR_ACC 16 /* swiglu_linear, gated_rmsnorm_linear: y += the result (linear's accumulate) */
typedef struct {
    const hyla_weight *W;
    const float *bias; /* [N] or NULL */
    float *y;
    int ldy, N;
    /* NULL: the call's x. Else this output's own rows x [M][K] (row stride K), without
     * HYLA_LINEAR_X_BF16: small linears of different inputs in one call (SSE's two LoRA terms) */
    const float *x;
    /* 1: this output adds onto y whatever the call's accumulate (0: as the call says), without
     * HYLA_LINEAR_PREFILL: linears that add and linears that write in one call */
    int acc;
} hyla_linear_out;

/* One tensor of short_conv_multi: as short_conv's x [B][n][C], w [C][K], bias [C] or NULL and
 * tails (a host array of B device pointers, each [K-1][C]); src (below). l2 > 0 (a divisor of C): then each
 * token's runs of l2 channels are L2-normalised, bit for bit l2norm_rows(x, B * n * C / l2, l2,
 * l2_eps) after the convolution (GDN's q and k heads; the GPU does it in the convolution's pass). */
#define HYLA_CONV_MULTI_MAX 3
/* SSE prefill's window by default (sse_prefill's window; the config key prefill_window): windows
 * of 64 leave a partition's chunks about a quarter full at N = 4, K = 1, windows of 256 about
 * two thirds (BENCHMARKS.md "SSE prefill windows of 256") */
#define HYLA_SSE_PREFILL_WINDOW 256
typedef struct {
    float *x;
    const float *w, *bias;
    float *const *tails;
    int C;
    int l2;       /* 0: none */
    float l2_eps;
    /* NULL: x is read and written in place. Else the inputs are bf16 rows src [B][n][C] (a prompt
     * GEMM's HYLA_LINEAR_Y_BF16 outputs), widened to fp32, and the results go to x; the tails take
     * the last K-1 inputs widened. Bit for bit: x = widen(src), then the convolution in place. */
    const void *src;
} hyla_conv_part;

/* ---- LTE (learnable token eviction; docs/MODELS.md §5.1, [LTE-1..5]) ---- */
#define HYLA_LTE_MAX_CONV 4 /* convolution layers of the scoring CNN */

/* The scoring CNN and the cache geometry of one LTE layer. Weights are fp32 device pointers in
 * PyTorch's grouped Conv1d layout (groups = Hk). */
typedef struct {
    int Hk, D;                  /* KV heads, head dim */
    int sink, window, budget;   /* s, w, b (w >= the receptive field) */
    int n_conv, kernel, dilation; /* conv layers (1..HYLA_LTE_MAX_CONV), odd kernel, dilation */
    int ch[HYLA_LTE_MAX_CONV + 1]; /* channels per head: ch[0] = 2*D (k‖v), ch[1..n_conv] */
    const float *conv_w[HYLA_LTE_MAX_CONV]; /* [Hk*ch[l+1]][ch[l]][kernel] */
    const float *conv_b[HYLA_LTE_MAX_CONV]; /* [Hk*ch[l+1]] */
    const float *proj_w, *proj_b; /* [Hk][ch[n_conv]], [Hk]: the per-head projection to a scalar */
    float rope_theta;           /* the keys' RoPE base (scoring reads un-rotated keys) */
    int eager;                  /* 0: lazy scoring (the default); 1: score each token as soon as its
                                 * receptive field is complete (same retained set, same outputs) */
} hyla_lte_params;

/* Half the scoring CNN's receptive field: a score needs this many tokens on each side. */
static inline int hyla_lte_half(const hyla_lte_params *p) { return p->n_conv * (p->kernel - 1) / 2 * p->dilation; }
/* The largest channel count of any layer of the scoring CNN. */
static inline int hyla_lte_maxch(const hyla_lte_params *p) {
    int m = 0;
    for (int l = 0; l <= p->n_conv; l++)
        if (p->ch[l] > m) m = p->ch[l];
    return m;
}
/* The check every backend applies to p before an LTE op: HYLA_ERR_INVALID_ARG naming the op. */
static inline hyla_status hyla_lte_check(const char *op, const hyla_lte_params *p) {
    int bad = p->Hk <= 0 || p->D <= 0 || p->D % 2 || p->sink < 0 || p->budget < 0 || p->n_conv < 1 ||
              p->n_conv > HYLA_LTE_MAX_CONV || p->kernel < 1 || p->kernel % 2 == 0 || p->dilation < 1 ||
              p->ch[0] != 2 * p->D;
    for (int l = 1; !bad && l <= p->n_conv; l++) bad = p->ch[l] <= 0 || !p->conv_w[l - 1] || !p->conv_b[l - 1];
    if (bad || !p->proj_w || !p->proj_b)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "%s: bad LTE parameters (Hk=%d D=%d convs=%d kernel=%d dilation=%d)", op,
                         p->Hk, p->D, p->n_conv, p->kernel, p->dilation);
    if (p->window < 2 * hyla_lte_half(p) + 1)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "%s: window %d is shorter than the receptive field %d", op, p->window,
                         2 * hyla_lte_half(p) + 1);
    return HYLA_OK;
}

/* The LTE cache of one layer of one session: fixed size, device pointers. Rows per head:
 * [0, s) the sink (positions 0..s-1), [s, s+w) the window ring (position p >= s in row
 * s + (p - s) % w), [s+w, s+w+b) the retained segment. Keys are stored rotated. */
typedef struct {
    void *k, *v;     /* [Hk][s+w+b][D] kv_dtype */
    float *r;        /* [Hk][s+w+b] retention scores (ring: 0 until scored; segment: the score) */
    int32_t *rpos;   /* [Hk][b] positions of the retained entries */
    int32_t *meta;   /* [2 + Hk]: tokens cached, the next position to score, retained count per head */
} hyla_lte_cache;

/* ---- DLA (dynamic linear attention over a pluggable base; docs/MODELS.md §4.7, [DLA-1..5]) ---- */
/* The geometry of one DLA layer. */
typedef struct {
    int H, dk, dv; /* heads; key and value dims of one state */
    int K;         /* capacity: at most K states per head (>= 2) */
    float tau;     /* boundary threshold: a token with score >= tau opens a new state */
} hyla_dla_params;

/* The DLA state cache of one layer of one session (device pointers). Per head, slots
 * 0..m[h]-1 hold the states in chronological order (slot 0 the oldest); slots past m[h] are 0. */
typedef struct {
    float *S;   /* [H][K][dk][dv] fp32 states */
    int32_t *n; /* [H][K] tokens summarised by each state */
    float *I;   /* [H][K] summed information scores of those tokens */
    int32_t *m; /* [H] states in use (0..K) */
} hyla_dla_cache;

/* A batch of device->host copies queued by capture_begin (backend-defined, opaque). */
typedef struct hyla_capture hyla_capture;

typedef struct hyla_ops {
    const char *name;     /* "cpu", "cuda" */
    hyla_dtype kv_dtype;  /* element type of KV pages */

    /* ---- memory ---- */
    hyla_status (*alloc)(void *ctx, size_t bytes, void **out); /* zero-filled */
    void (*free)(void *ctx, void *p);                          /* accepts NULL */
    hyla_status (*upload)(void *ctx, void *dst, const void *host_src, size_t bytes);
    hyla_status (*download)(void *ctx, void *host_dst, const void *src, size_t bytes);
    hyla_status (*copy)(void *ctx, void *dst, const void *src, size_t bytes);
    hyla_status (*zero)(void *ctx, void *dst, size_t bytes);
    hyla_status (*sync)(void *ctx); /* wait for all queued work; reports deferred errors */

    /* ---- weights ---- */
    /* Create W [rows][cols] from host memory of type dt (F32, F16, BF16). The host memory is
     * borrowed for the call only. Caller frees with weight_destroy. */
    hyla_status (*weight_create)(void *ctx, const void *host, hyla_dtype dt, int rows, int cols,
                                 hyla_weight **out);
    void (*weight_destroy)(void *ctx, hyla_weight *w); /* accepts NULL */

    /* ---- dense ops ---- */
    /* out[i] = table[ids[i]] : ids host [n], table W [vocab][D], out [n][D]. ids are checked. */
    hyla_status (*embed)(void *ctx, const hyla_weight *table, const int32_t *ids, int n, float *out);
    /* y = x @ W^T (+ bias) (+ y if accumulate): x [M][K] (row stride ldx), W [N][K], bias [N]
     * or NULL, y [M][N] (row stride ldy). Each row's result does not depend on M. */
    hyla_status (*linear)(void *ctx, const float *x, int ldx, int M, int K, const hyla_weight *W,
                          const float *bias, float *y, int ldy, int N, int accumulate);
    /* n (1..HYLA_LINEAR_MULTI_MAX) linears of the same x [M][K] (row stride ldx): with flags 0,
     * exactly n linear calls, bit for bit (outs[i].y must not overlap x or each other); a backend
     * may run them as one launch (CUDA: decode steps issue a few hundred small linears).
     * flags & HYLA_LINEAR_PREFILL: the rows are prompt rows (prefill pieces). A backend may then
     * use another method, as long as a row's result still depends only on that row and on the
     * call's output shapes (n and the Ns; not on M, the row's place, or the other rows) among
     * all calls with this flag — it need not equal the result without the flag (CUDA: cuBLAS
     * at a fixed row count, one GEMM an output; CPU: the same as linear).
     * flags & HYLA_LINEAR_X_BF16 (with HYLA_LINEAR_PREFILL, only on a backend with rmsnorm_bf16;
     * without it, decode rows where decode_bf16_rows(ctx, M, K) is 1): x points to bf16 rows
     * [M][ldx], ldx == K, written by rmsnorm_bf16.
     * flags & HYLA_LINEAR_Y_BF16 (likewise; no bias, no accumulate, ldy == N): each y is bf16
     * [M][N], the fp32 result rounded to nearest-even (a row's result still depends only on the
     * row: the MLP's gate and up, read by swiglu_linear as bf16).
     * An output with its own x (hyla_linear_out.x) is that linear of its rows, one with acc set
     * adds onto its y: the call is the calls of each distinct (x, accumulate) in turn, bit for
     * bit (hyla_linear_multi_by_x), which a backend may again run as one launch. */
    hyla_status (*linear_multi)(void *ctx, const float *x, int ldx, int M, int K, int n, const hyla_linear_out *outs,
                                int accumulate, int flags);
    /* The MLP's down projection of its SwiGLU: y [M][N] = (silu(gate) * up) @ W^T, gate and up
     * [M][K]. gate may be overwritten with silu(gate) * up. Bit for bit: swiglu(gate, up, gate)
     * then, without flags, linear(gate) or, with HYLA_LINEAR_PREFILL, linear_multi with that
     * flag and one output. A backend may do both at once (CUDA prompt rows: the product is
     * rounded to the GEMM's bf16 operand as it is formed, without the fp32 pass between).
     * flags HYLA_LINEAR_PREFILL | HYLA_LINEAR_X_BF16 (a backend with rmsnorm_bf16): gate and up
     * are bf16 [M][K] (linear_multi's HYLA_LINEAR_Y_BF16 outputs), widened to fp32 for the SwiGLU.
     * flags & HYLA_LINEAR_ACC: y += the result, as the linear's accumulate (the runtime adds a
     * prompt piece's MLP output straight onto the residual stream). */
    hyla_status (*swiglu_linear)(void *ctx, float *gate, const float *up, int M, int K, const hyla_weight *W, float *y,
                                 int N, int flags);
    /* A linear-attention mixer's end: y [M][N] = gated_rmsnorm(o, gate, w) @ W^T, where o and gate
     * are [M][H*D] (rows of M*H heads of D for the norm) and W is [N][H*D]. o may be overwritten
     * with the normed values. Bit for bit: gated_rmsnorm(o, gate, w, o, M * H, D, eps) then the
     * linear as in swiglu_linear (flags 0: linear; HYLA_LINEAR_PREFILL: linear_multi).
     * flags HYLA_LINEAR_PREFILL | HYLA_LINEAR_GATE_BF16 (a backend with rmsnorm_bf16): gate is bf16
     * [M][H*D] (linear_multi's HYLA_LINEAR_Y_BF16 output), widened for the norm.
     * flags & HYLA_LINEAR_ACC: y += the result (as swiglu_linear's). */
    hyla_status (*gated_rmsnorm_linear)(void *ctx, float *o, const float *gate, const float *w, int H, int D, float eps,
                                        int M, const hyla_weight *W, float *y, int N, int flags);
    /* y = x * rsqrt(mean(x^2) + eps) * w : x, y [n][D] (may alias), w [D]. */
    hyla_status (*rmsnorm)(void *ctx, const float *x, const float *w, float *y, int n, int D, float eps);
    /* residual += x; y = rmsnorm(residual) : all [n][D]. */
    hyla_status (*add_rmsnorm)(void *ctx, float *residual, const float *x, const float *w, float *y,
                               int n, int D, float eps);
    /* y += x : [n] */
    hyla_status (*add)(void *ctx, float *y, const float *x, size_t n);
    /* out = silu(gate) * up : [n] (out may alias gate or up). */
    hyla_status (*swiglu)(void *ctx, const float *gate, const float *up, float *out, size_t n);
    /* In-place x = silu(x) : [n]. */
    hyla_status (*silu)(void *ctx, float *x, size_t n);
    /* In-place x = max(logsigmoid(x) / normalizer, clamp_min) : [n]. clamp_min = -INFINITY for none. */
    hyla_status (*gla_gate)(void *ctx, float *x, size_t n, float normalizer, float clamp_min);
    /* In-place softmax over each row: x [rows][cols]. */
    hyla_status (*softmax_rows)(void *ctx, float *x, int rows, int cols);
    /* In-place x = x / sqrt(sum(x^2) + eps) per row: x [rows][cols]. [GDN-2] */
    hyla_status (*l2norm_rows)(void *ctx, float *x, int rows, int cols, float eps);
    /* GDN gates [GDN-1]: g[i][h] = -exp(A_log[h]) * softplus(a[i][h] + dt_bias[h]);
     * beta[i][h] = sigmoid(b[i][h]) * (allow_neg ? 2 : 1). a, b, g, beta [n][H]; A_log, dt_bias [H].
     * a_stride, b_stride: row strides of a and b (elements). g/beta may alias a/b. */
    hyla_status (*gdn_gates)(void *ctx, const float *a, int a_stride, const float *b, int b_stride,
                             const float *A_log, const float *dt_bias, float *g, float *beta, int n,
                             int H, int allow_neg);
    /* Rotary embedding, non-interleaved (rotate-half) [ATTN-1]: x [n][H][D] in place, token i at
     * absolute position pos[i] (host [n]). theta: base. */
    hyla_status (*rope)(void *ctx, float *x, int n, int H, int D, const int32_t *pos, float theta);
    /* Causal depthwise short convolution with carried tail [CONV-1]:
     * x [B][n][C] in place; w [C][K]; bias [C] or NULL; tails[b] [K-1][C] (host array of B device
     * pointers, updated to the last K-1 inputs); act_silu: apply silu after the convolution. */
    hyla_status (*short_conv)(void *ctx, float *x, int B, int n, int C, const float *w, const float *bias,
                              int K, float *const *tails, int act_silu);
    /* m (1..HYLA_CONV_MULTI_MAX) short_convs of the same B sessions and n tokens (q, k and v of a
     * linear-attention layer): bit for bit the m short_conv calls, in one launch where it can. */
    hyla_status (*short_conv_multi)(void *ctx, int m, const hyla_conv_part *p, int B, int n, int K, int act_silu);
    /* Per-head gated RMSNorm [NORM-1]: y = rmsnorm(o) * w * (g ? silu(g) : 1) over the last dim.
     * o, g, y [rows][D] (y may alias o), w [D]. */
    hyla_status (*gated_rmsnorm)(void *ctx, const float *o, const float *g, const float *w, float *y,
                                 int rows, int D, float eps);

    /* ---- mixers ---- (S: fp32 states [H][dk][dv]; scale multiplies q) */
    /* GLA [GLA-1] over n tokens of one sequence, chunked; S in/out. q,k,gk [n][H][dk];
     * v, o [n][H][dv]. Must equal n calls of gla_decode up to float rounding. */
    hyla_status (*gla_prefill)(void *ctx, const float *q, const float *k, const float *v, const float *gk,
                               int n, int H, int dk, int dv, float scale, float *S, float *o);
    /* One token for each of B sessions: q,k,gk [B][H][dk]; v, o [B][H][dv]; S host [B]. */
    hyla_status (*gla_decode)(void *ctx, const float *q, const float *k, const float *v, const float *gk,
                              int B, int H, int dk, int dv, float scale, float *const *S, float *o);
    /* Gated delta rule [GDN-3]: q,k [n][H][dk] (already l2-normalised), v,o [n][H][dv],
     * g, beta [n][H]. */
    hyla_status (*gdn_prefill)(void *ctx, const float *q, const float *k, const float *v, const float *g,
                               const float *beta, int n, int H, int dk, int dv, float scale, float *S,
                               float *o);
    hyla_status (*gdn_decode)(void *ctx, const float *q, const float *k, const float *v, const float *g,
                              const float *beta, int B, int H, int dk, int dv, float scale,
                              float *const *S, float *o);
    /* Causal softmax attention with GQA [ATTN-2] for n new tokens of one sequence at absolute
     * positions pos0..pos0+n-1. Writes k, v ([n][Hk][D], already rotated) into the cache,
     * then o [n][Hq][D] = attention of q [n][Hq][D] over cached positions
     * [max(0, p - window + 1), p] (window <= 0: no window). */
    hyla_status (*attn_prefill)(void *ctx, const float *q, const float *k, const float *v, int n, int Hq,
                                int Hk, int D, int pos0, const hyla_kv_view *kv, int window, float scale,
                                float *o);
    /* One token for each of B sessions: q [B][Hq][D], k,v [B][Hk][D]; pos host [B]; kv host [B]. */
    hyla_status (*attn_decode)(void *ctx, const float *q, const float *k, const float *v, int B, int Hq,
                               int Hk, int D, const int32_t *pos, const hyla_kv_view *kv, int window,
                               float scale, float *o);
    /* SSE routing [SSE-1]: logits [n][N] -> softmax -> top-K partitions.
     * idx [n][K] int32 (descending weight, lower index first on ties), w [n][K] their
     * softmax weights. All device pointers. */
    hyla_status (*sse_route)(void *ctx, const float *logits, int n, int N, int K, int32_t *idx, float *w);
    /* SSE mixer [SSE-2..4] over n tokens of one sequence.
     * q1,k1: always-selected partition inputs [n][H][dk]; q2,k2: sparse partitions [n][H][dk];
     * v [n][H][dv] shared. Transition GLA: ga = gk1 [n][H][dk], gb = gk2 [n][H][dk], beta* NULL.
     * Transition GDN: ga = g1 [n][H], gb = g2 [n][H], betaa = beta1 [n][H], betab = beta2 [n][H].
     * idx, w from sse_route ([n][K]). S0 [H][dk][dv] (always-selected), Sp [N][H][dk][dv].
     * o [n][H][dv]. Only selected partitions are decayed and written. May group tokens by
     * partition; must equal n calls of sse_decode up to float rounding. window (a multiple of 64):
     * the call's tokens are taken in windows of that many from its first token, a partition's
     * chunks cut at each window and every 64 of its tokens within one, so a call equals its
     * window-aligned pieces bit for bit (MODELS.md §4.3 "Prefill"). */
    hyla_status (*sse_prefill)(void *ctx, hyla_sse_transition tr, const float *q1, const float *k1,
                               const float *q2, const float *k2, const float *v, const float *ga,
                               const float *gb, const float *betaa, const float *betab,
                               const int32_t *idx, const float *w, int n, int H, int dk, int dv, int N,
                               int K, float scale, int window, float *S0, float *Sp, float *o);
    /* One token for each of B sessions (shapes as above with n -> B); S0, Sp host [B]. */
    hyla_status (*sse_decode)(void *ctx, hyla_sse_transition tr, const float *q1, const float *k1,
                              const float *q2, const float *k2, const float *v, const float *ga,
                              const float *gb, const float *betaa, const float *betab,
                              const int32_t *idx, const float *w, int B, int H, int dk, int dv, int N,
                              int K, float scale, float *const *S0, float *const *Sp, float *o);

    /* ---- sampling ---- [SAMPLE-1]
     * logits [B][V] (device); params, u (one uniform in [0,1) per row) and out are host [B].
     * Greedy rows ignore u. */
    hyla_status (*sample)(void *ctx, const float *logits, int B, int V, const hyla_sampling *params,
                          const float *u, int32_t *out);

    void (*destroy)(void *ctx);

    /* ---- host buffers and asynchronous capture (snapshots that overlap compute) ----
     * host_alloc: `bytes` of host memory that this backend copies to and from fastest (CUDA:
     * page-locked; CPU: 64-byte aligned malloc). Not zero-filled. Allocating and freeing may
     * be slow and synchronise the device (CUDA), so callers cache these buffers. Caller frees
     * with host_free (accepts NULL), on the thread that drives the context. */
    hyla_status (*host_alloc)(void *ctx, size_t bytes, void **out);
    void (*host_free)(void *ctx, void *p);
    /* capture_begin: queue n device->host copies src[i] -> host_dst[i] of bytes[i] each (0
     * allowed), ordered after every op queued so far, and return at once with a ticket in *out
     * (caller finishes it with capture_end). The arrays are borrowed for the call only.
     * Until the ticket has ended, the copies may run at any moment, so:
     *   - no later op may write (or free) the source memory: capture a copy (ops->copy, in
     *     stream order) of anything that later ops will change;
     *   - the caller must not read, write or free the host memory.
     * The CPU backend holds itself to the letter of this: it performs the copies in
     * capture_end, so code that lets later ops overwrite captured memory gets wrong bytes on
     * the CPU as well. */
    hyla_status (*capture_begin)(void *ctx, int n, void *const *host_dst, const void *const *src,
                                 const size_t *bytes, hyla_capture **out);
    /* 1 when the copies have finished (capture_end will not wait for the device), 0 while they
     * run. CPU backend: 0 at the first call for a ticket and 1 afterwards (its copies take no
     * device time; the first 0 lets callers' polling paths run on the CPU too). */
    int (*capture_done)(void *ctx, hyla_capture *t);
    /* Wait for the copies, free the ticket and report any copy failure (accepts NULL). After
     * it returns, the host memory holds the bytes the sources held when capture_begin was
     * called (given the rule above) and the sources may be written again. */
    hyla_status (*capture_end)(void *ctx, hyla_capture *t);

    /* ---- entries added later go here, at the end: the CUDA table (hyla_cuda_graph.cu) is
     * positional, so an entry it does not list stays NULL ---- */

    /* ---- LTE ---- (NULL in a backend that lacks them: the mixer refuses to run)
     * lte_score [LTE-2]: x [T][Hk][2D] the un-rotated k‖v of positions x0..x0+T-1 (rows of
     * negative positions are read as zero); r [T-2h][Hk] = the retention scores of positions
     * x0+h..x0+T-1-h, h = half the receptive field. A score depends only on its position's
     * receptive field, never on T or x0 (bit for bit). */
    hyla_status (*lte_score)(void *ctx, const hyla_lte_params *p, const float *x, int T, int x0, float *r);
    /* lte_prefill [LTE-3..5]: n tokens of one session at positions pos0.. (the cache holds
     * exactly pos0 tokens). For each token in order: insert k, v ([n][Hk][D], rotated) into the
     * cache (scoring, eviction, replacement), then o [n][Hq][D] = attention of q [n][Hq][D] over
     * sink ∪ retained ∪ window. Equal, bit for bit, to n calls of lte_decode. */
    hyla_status (*lte_prefill)(void *ctx, const hyla_lte_params *p, const float *q, const float *k, const float *v,
                               int n, int Hq, int pos0, const hyla_lte_cache *c, float scale, float *o);
    /* One token for each of B sessions: q [B][Hq][D], k, v [B][Hk][D]; pos, c host [B]. */
    hyla_status (*lte_decode)(void *ctx, const hyla_lte_params *p, const float *q, const float *k, const float *v,
                              int B, int Hq, const int32_t *pos, const hyla_lte_cache *c, float scale, float *o);

    /* ---- NSA ---- (native sparse attention, docs/MODELS.md §5.2 [NSA-1..4]; NULL in a backend
     * that lacks them: the mixer refuses to run)
     * nsa_prefill: n new tokens of one sequence at positions pos0..: writes k, v ([n][Hk][D],
     * rotated) into the paged cache as attn_prefill does, then o [n][Hq][D] = the gated sum of
     * three branches for each query q [n][Hq][D]: compressed attention over the mean-pooled
     * blocks of `block` tokens that lie wholly in its past, attention over the `counts` blocks
     * ranked highest by the compressed attention (averaged over the query group; the first,
     * current and previous blocks always), and sliding-window attention over the last `window`
     * tokens (window <= 0: none). g [n][Hq][3]: the gate logits (cmp, slc, swa), sigmoid inside.
     * Each query's output is computed by one routine, so prefill == decode bit for bit. */
    hyla_status (*nsa_prefill)(void *ctx, const float *q, const float *k, const float *v, const float *g, int n,
                               int Hq, int Hk, int D, int pos0, const hyla_kv_view *kv, int block, int counts,
                               int window, float scale, float *o);
    /* One token for each of B sessions: q [B][Hq][D], k, v [B][Hk][D], g [B][Hq][3]; pos, kv host [B]. */
    hyla_status (*nsa_decode)(void *ctx, const float *q, const float *k, const float *v, const float *g, int B,
                              int Hq, int Hk, int D, const int32_t *pos, const hyla_kv_view *kv, int block,
                              int counts, int window, float scale, float *o);

    /* ---- Mamba2 (SSD) ---- [M2-1..3] (docs/MODELS.md "Mamba2"; S: fp32 [H][N][P]) */
    /* dst [rows][cols] (row stride ldd) = src [rows][cols] (row stride lds), fp32; no overlap. */
    hyla_status (*copy2d)(void *ctx, float *dst, int ldd, const float *src, int lds, int rows, int cols);
    /* SSD [M2-1, M2-2] over n tokens of one sequence, chunked. Token t's row of xbc (row stride
     * ldx >= H*P + 2*G*N) holds x [H][P], then B [G][N], then C [G][N] (head h reads group
     * h / (H/G)); dt [n] rows of H raw values (row stride ld_dt). Per head:
     *   dt' = clamp(softplus(dt + dt_bias), dt_min, dt_max),  a = −exp(A_log)·dt',
     *   S = exp(a)·S + B ⊗ (dt'·x)  (S [N][P]),  y = C·S + Dskip·x.
     * S [H][N][P] in/out; y [n][H][P]. Equals n calls of ssd_decode up to float rounding. */
    hyla_status (*ssd_prefill)(void *ctx, const float *xbc, int ldx, const float *dt, int ld_dt, const float *dt_bias,
                               const float *A_log, const float *Dskip, float dt_min, float dt_max, int n, int H,
                               int P, int G, int N, float *S, float *y);
    /* One token for each of B sessions: xbc [B] rows, dt [B] rows, y [B][H][P]; S host [B]. */
    hyla_status (*ssd_decode)(void *ctx, const float *xbc, int ldx, const float *dt, int ld_dt, const float *dt_bias,
                              const float *A_log, const float *Dskip, float dt_min, float dt_max, int B, int H,
                              int P, int G, int N, float *const *S, float *y);
    /* Gated RMSNorm, gate before norm, per group [M2-3]: u = o ⊙ silu(z); each group of gs
     * elements of u is RMS-normalised; y = u_normed ⊙ w. o, y [rows][G*gs] (y may alias o);
     * z [rows] with row stride ldz; w [G*gs]. */
    hyla_status (*ssd_norm)(void *ctx, const float *o, const float *z, int ldz, const float *w, float *y, int rows,
                            int G, int gs, float eps);

    /* ---- DLA ---- (NULL in a backend that lacks them: the mixer refuses to run)
     * The base model's transition is given per token and head by three scalars, so one op serves
     * every base [DLA-1]: every state S_i <- exp(g) (S_i - e k (k^T S_i)), the token's own state
     * s = w k v^T. Gated DeltaNet: e = w = beta; Mamba2: e = 0 (erase NULL), w = dt, k = B,
     * v = x, q = C. For each token in order [DLA-2..5]: its information score against the newest
     * state, the transition of all states, merge into the newest state or open a new one (when
     * full, first merge the adjacent pair of lowest density), then
     * o = scale * sum_i softplus(lam[m-1-i]) q^T S_i.
     * q, k [n][H][dk]; v, o [n][H][dv]; g, erase, write [n][H]; lam [n][H][K] logits.
     * dla_prefill: n tokens of one session; equal, bit for bit, to n calls of dla_decode. */
    hyla_status (*dla_prefill)(void *ctx, const hyla_dla_params *p, const float *q, const float *k, const float *v,
                               const float *g, const float *erase, const float *write, const float *lam, int n,
                               float scale, const hyla_dla_cache *c, float *o);
    /* One token for each of B sessions: c host [B]. */
    hyla_status (*dla_decode)(void *ctx, const hyla_dla_params *p, const float *q, const float *k, const float *v,
                              const float *g, const float *erase, const float *write, const float *lam, int B,
                              float scale, const hyla_dla_cache *c, float *o);

    /* ---- Mamba2's gates and skip outside the SSD ops (DLA over Mamba2) ---- */
    /* [M2-1] per token and head, as ssd_prefill computes them: dtp = clamp(softplus(dt + dt_bias),
     * dt_min, dt_max) and a = −exp(A_log)·dtp. dt [n] rows of H (row stride ld_dt); a, dtp [n][H]. */
    hyla_status (*ssd_gates)(void *ctx, const float *dt, int ld_dt, const float *dt_bias, const float *A_log,
                             float dt_min, float dt_max, int n, int H, float *a, float *dtp);
    /* [M2-2]'s skip term: y [n][H][P] += Dskip[h]·x, x [n] rows of H*P (row stride ldx). */
    hyla_status (*ssd_skip)(void *ctx, float *y, const float *x, int ldx, const float *Dskip, int n, int H, int P);

    /* ---- asynchronous upload (restores that overlap the arrival of the state) ----
     * upload_begin: queue n host->device copies host_src[i] -> dst[i] of bytes[i] each (0
     * allowed), ordered after every op queued so far; every op queued later sees the copied
     * bytes. Returns at once with a ticket in *out, finished like a capture's (capture_done
     * polls it, capture_end waits for the copies, frees it and reports a copy failure). The
     * arrays are borrowed for the call only; the host memory until the ticket has ended (the
     * caller must not write or free it). Host memory from host_alloc is copied by the device
     * without a host copy (CUDA); other memory works, more slowly. The CPU backend copies at
     * once (its later ops run at once too). NULL in a backend that lacks it: callers fall back
     * to upload. */
    hyla_status (*upload_begin)(void *ctx, int n, void *const *dst, const void *const *host_src, const size_t *bytes,
                                hyla_capture **out);

    /* ---- GDN decode from the raw projections (NULL in a backend that lacks it: the mixer runs the
     * three ops) ----
     * Bit for bit l2norm_rows of q's and k's B * H rows (eps), gdn_gates(a, H, b, H, A_log, dt_bias,
     * a, b, B, H, allow_neg) and gdn_decode, in one kernel where the shape allows. q, k, a, b are
     * scratch: they may be left as they came or overwritten by the normalised rows and the gates. */
    hyla_status (*gdn_decode_raw)(void *ctx, float *q, float *k, const float *v, float *a, float *b, const float *A_log,
                                  const float *dt_bias, int allow_neg, float eps, int B, int H, int dk, int dv,
                                  float scale, float *const *S, float *o);

    /* ---- prompt rows' norms as the prompt GEMMs' operand (NULL in a backend that lacks it: the
     * runtime runs rmsnorm / add_rmsnorm and fp32 rows) ----
     * As add_rmsnorm(residual, x, w, y) (x != NULL) or rmsnorm(residual, w, y) (x == NULL), with y
     * [n][D] bf16: each value the fp32 result rounded to nearest-even. A backend has it only when
     * its prompt linears round x to bf16 that way (HYLA_LINEAR_X_BF16), so that the norm followed
     * by linear_multi(HYLA_LINEAR_PREFILL | HYLA_LINEAR_X_BF16) gives the bits of the fp32 norm
     * followed by linear_multi(HYLA_LINEAR_PREFILL): the fp32 rows are never written. Such a
     * backend also takes HYLA_LINEAR_Y_BF16, swiglu_linear's bf16 gate and up and the conv's bf16
     * sources (hyla_conv_part.src). CUDA has it; the CPU backend when created with
     * HYLA_CPU_BF16_ROWS=1 (tests/test_bf16rows.c; its default is the fp32 reference). */
    hyla_status (*rmsnorm_bf16)(void *ctx, float *residual, const float *x, const float *w, void *y, int n, int D,
                                float eps);

    /* ---- start the work queued so far without waiting for it (NULL: each op starts when called)
     * A backend that defers launches (CUDA logs stream-ordered ops for its graphs until an op that
     * needs their results) launches them now, so the device works while the host goes on: a
     * decode step posted on the whole model (hyla_session_decode_post) before its tokens are
     * needed. */
    hyla_status (*submit)(void *ctx);

    /* ---- SSE's feature maps in one launch (NULL in a backend that lacks it: the mixer runs the ops
     * one by one) ----
     * Bit for bit silu(v, nv); for each of q0, q1 softmax_rows (q_softmax) or silu over its
     * [rows][cols], then l2norm_rows(eps) when l2; the same for k0, k1 with k_softmax; and, where
     * g0 and g1 are not NULL, gla_gate(g0, ng, normalizer, clamp_min) and the same for g1, each
     * value first added its gate projection's bias where gb0 / gb1 are not NULL (gb[i % nb], nb
     * dividing ng, ng under 2^32: one fp32 add, the bits of the linear's own bias, whose pass over g
     * it saves). lora:
     * q1 and k1 hold LoRA terms on entry, not a set's values: first add(q1, q0), add(k1, k0) (the
     * term plus the projection, one fp32 add: the bits of the LoRA linear's accumulate onto a copy
     * of q0, without the copy), then the maps as above. Up to fifteen launches in one where the
     * shape allows (CUDA: cols % 4 == 0, cols <= 512, at most 2^23 floats in all, or any size with
     * lora: decode rows and short pieces, whose cost is the launches, and prompt pieces, where
     * the copy and the accumulate's read of y are what it saves). */
    hyla_status (*sse_maps)(void *ctx, float *v, size_t nv, float *q0, float *q1, float *k0, float *k1, int rows,
                            int cols, int q_softmax, int k_softmax, int l2, float eps, float *g0, float *g1, size_t ng,
                            const float *gb0, const float *gb1, int nb, float normalizer, float clamp_min, int lora);

    /* ---- decode rows' norms as the linears' operand (NULL: never) ----
     * 1 where linear_multi of M decode rows of x [M][K] (flags without HYLA_LINEAR_PREFILL) takes
     * x as bf16 rows from rmsnorm_bf16 (HYLA_LINEAR_X_BF16, ldx == K, no output of its own x):
     * the bits of the same call from the fp32 norm's rows, for any outputs. The runtime then has
     * the norms before the layers' projections and the LM head write bf16 rows (CUDA: rows on the
     * warpgroup path, whose linears round x to bf16 in a pass of their own otherwise). Depends only
     * on M and K, so every step of M rows takes the same path. */
    int (*decode_bf16_rows)(void *ctx, int M, int K);
} hyla_ops;

typedef struct {
    const hyla_ops *ops;
    void *ctx;
    /* tokens per prefill forward pass the backend runs best at (0: HYLA_PREFILL_PIECE_DEFAULT);
     * a runtime starts with it (worker/hyla_runtime.h). The CUDA backend: 16384, so prompt
     * projections run as GEMMs of many 1024-row blocks (docs/CUDA.md "Linear") */
    int prefill_piece;
} hyla_backend;

/* Create a backend for device "cpu" or "cuda:N". Fails with HYLA_ERR_UNSUPPORTED when CUDA was
 * not built, HYLA_ERR_DEVICE when no GPU is usable. Caller frees with hyla_backend_destroy. */
hyla_status hyla_backend_create(const char *device, hyla_backend **out);
void hyla_backend_destroy(hyla_backend *b); /* accepts NULL */
/* Whether a CUDA device is usable (compiled in and a GPU present). */
int hyla_cuda_available(void);

/* linear_multi of outputs with their own x or accumulate (hyla_linear_out.x, .acc) as the calls of
 * each distinct (x, accumulate) in turn (in order of first appearance), each through fn with
 * those outputs' x and acc cleared: what a backend does where it cannot run them as one launch.
 * hyla_linear_multi_has_x: whether any output has its own x or acc. */
typedef hyla_status (*hyla_linear_multi_fn)(void *ctx, const float *x, int ldx, int M, int K, int n,
                                            const hyla_linear_out *outs, int accumulate, int flags);
int hyla_linear_multi_has_x(const float *x, int n, const hyla_linear_out *outs);
hyla_status hyla_linear_multi_by_x(hyla_linear_multi_fn fn, void *ctx, const float *x, int ldx, int M, int K, int n,
                                   const hyla_linear_out *outs, int accumulate, int flags);

/* Backend constructors (kernels/cpu/, kernels/cuda/). */
hyla_status hyla_cpu_backend_create(int n_threads, hyla_backend **out);
hyla_status hyla_cuda_backend_create(int device, hyla_backend **out);

#ifdef __cplusplus
}
#endif
#endif
