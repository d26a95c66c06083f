/* hyla_cuda_graph.cu — CUDA graphs for repeated op sequences (the decode step), behind the
 * unchanged ops interface, and the ops-table entries that order everything else after them.
 *
 * Why: a decode step of the 1.3B models is ~700–900 kernel launches issued one op at a time;
 * at batch 1 the step is bound by launch overhead, not by the GPU. The runtime calls the same
 * ops with the same device pointers step after step; only host-array contents change
 * (token ids, positions, the batch's state and KV page pointers).
 *
 * How: stream-ordered ops whose launches depend only on their arguments ("loggable": embed,
 * linear, the linears with a folded elementwise op, the row and elementwise ops, rope, short_conv,
 * the decode mixers, GLA/GDN prefill,
 * SSE routing and prefill (planned on the device), attn_decode, copy, zero) are not launched
 * when called but appended to a log: the op code,
 * its scalars and device pointers and the derived launch parameters (the entry, which is the
 * signature) plus the host arrays the op stages for its kernels (the entry's data). Any other
 * op (sample, download, upload, sync, alloc, free, attention prefill, weights, capture_begin,
 * the CUDA-only entry points) first flushes the log, so stream order is exactly the call order
 * (host_alloc/host_free and capture_done/capture_end queue nothing on the stream). A flush:
 *   - looks the segment's signature up in a small cache of instantiated graphs; on a hit it
 *     copies the entries' data into the graph's device parameter block (through the pinned
 *     staging ring, on the stream) and launches the graph, whose kernels read it there;
 *   - otherwise runs the entries one by one as before (data through the staging ring), and the
 *     second time a signature is seen it captures the entries into a graph instead (stream
 *     capture, relaxed mode; data read from the graph's own parameter block) and launches it.
 * Data never enters the signature, so positions advancing, other sessions of the same batch
 * size, and KV pages being appended all replay the same graph; launch parameters that data
 * would change (attention's number of 512-key splits, the page-table capacity, rounded up to
 * a power of two) are in the signature. Same kernels with the same arguments: results are
 * bit-identical with graphs on or off (tested end to end).
 *
 * Invariants: a graph bakes in scratch-buffer addresses, so it records c->scratch_gen at
 * capture and is dropped when a scratch buffer has moved since. A graph's parameter block is
 * rewritten by a copy on the stream, so after its previous launch has read it. A capture that fails (e.g. a
 * scratch buffer would have to grow, which syncs) is abandoned softly and the segment runs
 * eagerly. Argument errors are checked when an op is logged, so they return from the op call
 * as before; faults of the deferred launches surface at the flushing op (hyla_ops.h allows a
 * backend to report failures at the next op or at sync()).
 * Threading: one thread per context, as every op. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_cuda_dla.h"
#include "hyla_cuda_extra.h"
#include "hyla_cuda_impl.h"

/* ---------------------------------------------------------------- the logged ops
 *
 * Each loggable op is described once: a struct of its arguments (ga_<op>, the typed part of a
 * log entry, the launch parameters that data would change included) and its replay
 * (replay_<op>: the call the entry stands for). GRAPH_OPS lists them; the entry's union, the op
 * codes, the typed log_<op> that records an entry and the dispatch that replays one are
 * generated from the list. An entry's bytes are its signature: log_entry zeroes the entry before
 * the op's recorder fills its fields, so padding never differs. Host arrays the op's kernels
 * read (token ids, positions, state and page tables) are the entry's data, outside the
 * signature: `d` in a replay is where they are on the device. */

struct ga_embed { /* embed: ids (int32 [n]) are the data */
    const hyla_weight *table;
    float *out;
    const void *table_d; /* the weights' device address: a new upload at the same handle is another graph */
    int32_t n;
};
static hyla_status replay_embed(hyla_cuda_ctx *c, const ga_embed &a, const void *d) {
    return cu_embed_dev(c, a.table, (const int32_t *)d, a.n, a.out);
}

struct ga_linear {
    const float *x, *bias;
    const hyla_weight *W;
    float *y;
    const void *W_d;
    int32_t ldx, M, K, ldy, N, accumulate;
};
static hyla_status replay_linear(hyla_cuda_ctx *c, const ga_linear &a, const void *) {
    return cu_linear(c, a.x, a.ldx, a.M, a.K, a.W, a.bias, a.y, a.ldy, a.N, a.accumulate);
}

struct ga_linear_multi {
    const float *x;
    hyla_linear_out out[HYLA_LINEAR_MULTI_MAX];
    const void *W_d[HYLA_LINEAR_MULTI_MAX];
    int32_t ldx, M, K, n, accumulate, flags;
};
static hyla_status replay_linear_multi(hyla_cuda_ctx *c, const ga_linear_multi &a, const void *) {
    return cu_linear_multi(c, a.x, a.ldx, a.M, a.K, a.n, a.out, a.accumulate, a.flags);
}

/* Plain ops: the entry is the op's arguments as they are, the replay is the same call. Each is
 * described once, by its argument list (type, name), in the op's order in hyla_ops.h; the
 * entry's struct, its replay here and its recorder g_<op> below are generated from it. */
#define ARGS_rmsnorm(F) F(const float *, x) F(const float *, w) F(float *, y) F(int, n) F(int, D) F(float, eps)
#define ARGS_add_rmsnorm(F) \
    F(float *, residual) F(const float *, x) F(const float *, w) F(float *, y) F(int, n) F(int, D) F(float, eps)
#define ARGS_add(F) F(float *, y) F(const float *, x) F(size_t, n)
#define ARGS_swiglu(F) F(const float *, gate) F(const float *, up) F(float *, out) F(size_t, n)
#define ARGS_silu(F) F(float *, x) F(size_t, n)
#define ARGS_gla_gate(F) F(float *, x) F(size_t, n) F(float, normalizer) F(float, clamp_min)
#define ARGS_softmax_rows(F) F(float *, x) F(int, rows) F(int, cols)
#define ARGS_l2norm_rows(F) F(float *, x) F(int, rows) F(int, cols) F(float, eps)
#define ARGS_sse_maps(F)                                                                                              \
    F(float *, v) F(size_t, nv) F(float *, q0) F(float *, q1) F(float *, k0) F(float *, k1) F(int, rows) F(int, cols)   \
        F(int, q_softmax) F(int, k_softmax) F(int, l2) F(float, eps) F(float *, g0) F(float *, g1) F(size_t, ng)       \
            F(const float *, gb0) F(const float *, gb1) F(int, nb) F(float, normalizer) F(float, clamp_min) F(int, lora)
#define ARGS_gdn_gates(F)                                                                                             \
    F(const float *, a) F(int, a_stride) F(const float *, b) F(int, b_stride) F(const float *, A_log)                 \
    F(const float *, dt_bias) F(float *, g) F(float *, beta) F(int, n) F(int, H) F(int, allow_neg)
#define ARGS_rmsnorm_bf16(F) \
    F(float *, residual) F(const float *, x) F(const float *, w) F(void *, y) F(int, n) F(int, D) F(float, eps)
#define ARGS_gated_rmsnorm(F) \
    F(const float *, o) F(const float *, gate) F(const float *, w) F(float *, y) F(int, rows) F(int, D) F(float, eps)
#define PLAIN_OPS(P) \
    P(rmsnorm) P(add_rmsnorm) P(add) P(swiglu) P(silu) P(gla_gate) P(softmax_rows) P(l2norm_rows) P(gdn_gates) \
    P(gated_rmsnorm) P(rmsnorm_bf16) P(sse_maps)

#define GA_FIELD(t, n) t n;
#define GA_PARAM(t, n) , t n
#define GA_ARG(t, n) , n
#define GA_REPLAY_ARG(t, n) , e_.n
#define GA_SET(t, n) e_->n = n;
#define PLAIN_ENTRY(op)                                                                                               \
    struct ga_##op {                                                                                                  \
        ARGS_##op(GA_FIELD)                                                                                           \
    };                                                                                                                \
    static hyla_status replay_##op(hyla_cuda_ctx *c, const ga_##op &e_, const void *) {                               \
        return cu_##op(c ARGS_##op(GA_REPLAY_ARG));                                                                   \
    }
PLAIN_OPS(PLAIN_ENTRY)

/* Ops that end in a linear (an elementwise op folded into its operand): plain ops plus the
 * weights' device address (a new upload at the same handle is another graph), checked as a
 * linear of K_op inputs when logged. */
#define ARGS_swiglu_linear(F) \
    F(float *, gate) F(const float *, up) F(int, M) F(int, K) F(const hyla_weight *, W) F(float *, y) F(int, N) F(int, flags)
#define K_swiglu_linear K
#define ARGS_gated_rmsnorm_linear(F)                                                                                  \
    F(float *, o) F(const float *, gate) F(const float *, w) F(int, H) F(int, D) F(float, eps) F(int, M)              \
        F(const hyla_weight *, W) F(float *, y) F(int, N) F(int, flags)
#define K_gated_rmsnorm_linear (H * D)
#define LINEAR_OPS(P) P(swiglu_linear) P(gated_rmsnorm_linear)
#define LINEAR_ENTRY(op)                                                                                              \
    struct ga_##op {                                                                                                  \
        ARGS_##op(GA_FIELD) const void *W_d;                                                                          \
    };                                                                                                                \
    static hyla_status replay_##op(hyla_cuda_ctx *c, const ga_##op &e_, const void *) {                               \
        return cu_##op(c ARGS_##op(GA_REPLAY_ARG));                                                                   \
    }
LINEAR_OPS(LINEAR_ENTRY)

struct ga_rope { /* positions (int32 [n]) are the data */
    float *x;
    int32_t n, H, D;
    float theta;
};
static hyla_status replay_rope(hyla_cuda_ctx *c, const ga_rope &a, const void *d) {
    return cu_rope_dev(c, a.x, a.n, a.H, a.D, (const int32_t *)d, a.theta);
}

struct ga_short_conv { /* the sessions' tail pointers (float * [B]) are the data */
    float *x;
    const float *w, *bias;
    int32_t B, n, C, K, act_silu;
};
static hyla_status replay_short_conv(hyla_cuda_ctx *c, const ga_short_conv &a, const void *d) {
    return cu_short_conv_dev(c, a.x, a.B, a.n, a.C, a.w, a.bias, a.K, (float *const *)d, a.act_silu);
}

struct ga_short_conv_multi { /* the tensors' tail pointers (float * [m][B]) are the data */
    float *x[HYLA_CONV_MULTI_MAX];
    const float *w[HYLA_CONV_MULTI_MAX], *bias[HYLA_CONV_MULTI_MAX];
    int32_t C[HYLA_CONV_MULTI_MAX], l2[HYLA_CONV_MULTI_MAX];
    float l2_eps[HYLA_CONV_MULTI_MAX];
    const void *src[HYLA_CONV_MULTI_MAX];
    int32_t m, B, n, K, act_silu, tails16;
};
static hyla_status replay_short_conv_multi(hyla_cuda_ctx *c, const ga_short_conv_multi &a, const void *d) {
    hyla_conv_part p[HYLA_CONV_MULTI_MAX];
    for (int i = 0; i < a.m; i++)
        p[i] = (hyla_conv_part){a.x[i], a.w[i], a.bias[i], (float *const *)d + (size_t)i * a.B, a.C[i], a.l2[i],
                                a.l2_eps[i], a.src[i]};
    return cu_short_conv_multi_dev(c, a.m, p, a.B, a.n, a.K, a.act_silu, a.tails16);
}

/* The inputs and shape that GLA/GDN decode and prefill share: GLA (ga = gk) or GDN (ga = g,
 * gb = beta). Filled field by field (lin_io_set), as every entry, so padding stays zero. */
struct ga_lin_io {
    const float *q, *k, *v, *ga, *gb;
    float *o;
    int32_t gdn, H, dk, dv;
    float scale;
};
static void lin_io_set(ga_lin_io *io, int gdn, const float *q, const float *k, const float *v, const float *ga,
                       const float *gb, int H, int dk, int dv, float scale, float *o) {
    io->q = q;
    io->k = k;
    io->v = v;
    io->ga = ga;
    io->gb = gb;
    io->o = o;
    io->gdn = gdn;
    io->H = H;
    io->dk = dk;
    io->dv = dv;
    io->scale = scale;
}

struct ga_lin_decode { /* state pointers (float * [B]) are the data */
    ga_lin_io io;
    int32_t B, states16;
    int32_t raw, allow_neg; /* raw: cu_gdn_decode_raw's fused form (ga, gb: the projections a, b) */
    float eps;
    const float *A_log, *dt_bias;
};
static hyla_status replay_lin_decode(hyla_cuda_ctx *c, const ga_lin_decode &a, const void *d) {
    const ga_lin_io &x = a.io;
    if (a.raw)
        return cu_gdn_decode_raw_dev(c, x.q, x.k, x.v, x.ga, x.gb, a.A_log, a.dt_bias, a.allow_neg, a.eps, a.B, x.H,
                                     x.dk, x.dv, x.scale, (float *const *)d, x.o);
    return cu_lin_decode_dev(c, x.gdn, x.q, x.k, x.v, x.ga, x.gb, a.B, x.H, x.dk, x.dv, x.scale, (float *const *)d,
                             a.states16, x.o);
}

struct ga_lin_prefill { /* one sequence; the chunk tables and state pointer block are the data */
    ga_lin_io io;
    int32_t n, s_aligned;
};
static hyla_status replay_lin_prefill(hyla_cuda_ctx *c, const ga_lin_prefill &a, const void *d) {
    const ga_lin_io &x = a.io;
    return cu_lin_prefill1_dev(c, x.gdn, x.q, x.k, x.v, x.ga, x.gb, a.n, x.H, x.dk, x.dv, x.scale, d, a.s_aligned, x.o);
}

struct ga_sse_route {
    const float *logits;
    int32_t *idx;
    float *w;
    int32_t n, N, K;
};
static hyla_status replay_sse_route(hyla_cuda_ctx *c, const ga_sse_route &a, const void *) {
    return cu_sse_route(c, a.logits, a.n, a.N, a.K, a.idx, a.w);
}

/* The inputs, routes and shape that SSE decode and prefill share (filled by sse_io_set). */
struct ga_sse_io {
    const float *q1, *k1, *q2, *k2, *v, *ga, *gb, *betaa, *betab;
    const int32_t *idx;
    const float *w;
    float *o;
    int32_t tr, H, dk, dv, N, K;
    float scale;
};
static void sse_io_set(ga_sse_io *io, hyla_sse_transition tr, const float *q1, const float *k1, const float *q2,
                       const float *k2, const float *v, const float *ga, const float *gb, const float *betaa,
                       const float *betab, const int32_t *idx, const float *w, int H, int dk, int dv, int N, int K,
                       float scale, float *o) {
    io->q1 = q1;
    io->k1 = k1;
    io->q2 = q2;
    io->k2 = k2;
    io->v = v;
    io->ga = ga;
    io->gb = gb;
    io->betaa = betaa;
    io->betab = betab;
    io->idx = idx;
    io->w = w;
    io->o = o;
    io->tr = (int32_t)tr;
    io->H = H;
    io->dk = dk;
    io->dv = dv;
    io->N = N;
    io->K = K;
    io->scale = scale;
}

struct ga_sse_decode { /* S0 pointers then Sp pointers (float * [2B]) are the data */
    ga_sse_io io;
    int32_t B, states16;
};
static hyla_status replay_sse_decode(hyla_cuda_ctx *c, const ga_sse_decode &a, const void *d) {
    const ga_sse_io &x = a.io;
    float *const *S = (float *const *)d;
    return cu_sse_decode_dev(c, (hyla_sse_transition)x.tr, x.q1, x.k1, x.q2, x.k2, x.v, x.ga, x.gb, x.betaa, x.betab,
                             x.idx, x.w, a.B, x.H, x.dk, x.dv, x.N, x.K, x.scale, S, S + a.B, a.states16, x.o);
}

struct ga_sse_prefill { /* planned on the device: no data */
    ga_sse_io io;
    float *S0, *Sp;
    int32_t n, windows; /* the window in tokens, 0: plain chunks */
};
static hyla_status replay_sse_prefill(hyla_cuda_ctx *c, const ga_sse_prefill &a, const void *) {
    const ga_sse_io &x = a.io;
    return cu_sse_prefill_dev(c, (hyla_sse_transition)x.tr, x.q1, x.k1, x.q2, x.k2, x.v, x.ga, x.gb, x.betaa, x.betab,
                              x.idx, x.w, a.n, x.H, x.dk, x.dv, x.N, x.K, x.scale, a.windows, a.S0, a.Sp, x.o);
}

struct ga_attn_decode { /* the page tables and positions (cu_attn_decode_block) are the data */
    const float *q, *k, *v;
    float *o;
    uint64_t cap; /* page-table capacity, rounded up to a power of two */
    int32_t B, Hq, Hk, D, page_tokens, nsplit, window;
    float scale;
};
static hyla_status replay_attn_decode(hyla_cuda_ctx *c, const ga_attn_decode &a, const void *d) {
    return cu_attn_decode_dev(c, a.q, a.k, a.v, a.B, a.Hq, a.Hk, a.D, d, (size_t)a.cap, a.page_tokens, a.nsplit,
                              a.window, a.scale, a.o);
}

struct ga_copy {
    void *dst;
    const void *src;
    uint64_t bytes;
};
static hyla_status replay_copy(hyla_cuda_ctx *c, const ga_copy &a, const void *) {
    CU_TRY(cudaMemcpyAsync(a.dst, a.src, (size_t)a.bytes, cudaMemcpyDeviceToDevice, c->stream));
    return HYLA_OK;
}

struct ga_zero {
    void *dst;
    uint64_t bytes;
};
static hyla_status replay_zero(hyla_cuda_ctx *c, const ga_zero &a, const void *) {
    CU_TRY(cudaMemsetAsync(a.dst, 0, (size_t)a.bytes, c->stream));
    return HYLA_OK;
}

/* Mamba2 (SSD) */
struct ga_copy2d {
    float *dst;
    const float *src;
    int32_t ldd, lds, rows, cols;
};
static hyla_status replay_copy2d(hyla_cuda_ctx *c, const ga_copy2d &a, const void *) {
    return cu_copy2d(c, a.dst, a.ldd, a.src, a.lds, a.rows, a.cols);
}

struct ga_ssd_decode { /* the sessions' state pointers are the data */
    const float *xbc, *dt, *dt_bias, *A_log, *Dskip;
    float *y;
    int32_t ldx, ld_dt, B, H, P, G, N, states16;
    float dt_min, dt_max;
};
static hyla_status replay_ssd_decode(hyla_cuda_ctx *c, const ga_ssd_decode &a, const void *d) {
    return cu_ssd_decode_dev(c, a.xbc, a.ldx, a.dt, a.ld_dt, a.dt_bias, a.A_log, a.Dskip, a.dt_min, a.dt_max, a.B, a.H,
                             a.P, a.G, a.N, (float *const *)d, a.states16, a.y);
}

struct ga_ssd_norm {
    const float *o, *z, *w;
    float *y;
    int32_t ldz, rows, G, gs;
    float eps;
};
static hyla_status replay_ssd_norm(hyla_cuda_ctx *c, const ga_ssd_norm &a, const void *) {
    return cu_ssd_norm(c, a.o, a.z, a.ldz, a.w, a.y, a.rows, a.G, a.gs, a.eps);
}

/* a tensor-parallel one-shot sum (hyla_cuda_psum.cu): the kernels count the sums on the device,
 * so a graph replays it with no data */
struct ga_tp_sum {
    const void *os;
    float *x;
    uint64_t n;
    int j;
};
static hyla_status replay_tp_sum(hyla_cuda_ctx *c, const ga_tp_sum &a, const void *) {
    return cu_tp_sum(c, a.os, a.j, a.x, (size_t)a.n);
}

#define GRAPH_OPS(X)                                                                                                   \
    X(EMBED, embed)                                                                                                    \
    X(LINEAR, linear)                                                                                                  \
    X(LINEAR_MULTI, linear_multi)                                                                                      \
    X(SWIGLU_LINEAR, swiglu_linear)                                                                                    \
    X(GATED_RMSNORM_LINEAR, gated_rmsnorm_linear)                                                                      \
    X(RMSNORM, rmsnorm)                                                                                                \
    X(ADD_RMSNORM, add_rmsnorm)                                                                                        \
    X(ADD, add)                                                                                                        \
    X(SWIGLU, swiglu)                                                                                                  \
    X(SILU, silu)                                                                                                      \
    X(GLA_GATE, gla_gate)                                                                                              \
    X(SOFTMAX_ROWS, softmax_rows)                                                                                      \
    X(L2NORM_ROWS, l2norm_rows)                                                                                        \
    X(GDN_GATES, gdn_gates)                                                                                            \
    X(GATED_RMSNORM, gated_rmsnorm)                                                                                    \
    X(ROPE, rope)                                                                                                      \
    X(SHORT_CONV, short_conv)                                                                                          \
    X(SHORT_CONV_MULTI, short_conv_multi)                                                                              \
    X(LIN_DECODE, lin_decode)                                                                                          \
    X(LIN_PREFILL, lin_prefill)                                                                                        \
    X(SSE_ROUTE, sse_route)                                                                                            \
    X(SSE_DECODE, sse_decode)                                                                                          \
    X(SSE_PREFILL, sse_prefill)                                                                                        \
    X(ATTN_DECODE, attn_decode)                                                                                        \
    X(COPY, copy)                                                                                                      \
    X(ZERO, zero)                                                                                                      \
    /* Mamba2 (SSD) */                                                                                                 \
    X(COPY2D, copy2d)                                                                                                  \
    X(SSD_DECODE, ssd_decode)                                                                                          \
    X(SSD_NORM, ssd_norm)                                                                                              \
    X(TP_SUM, tp_sum)                                                                                                  \
    X(RMSNORM_BF16, rmsnorm_bf16)                                                                                      \
    X(SSE_MAPS, sse_maps)

enum {
    GOP_NONE,
#define X(OP, op) GOP_##OP,
    GRAPH_OPS(X)
#undef X
};

/* One logged op; every byte is part of the signature (entries are zeroed before filling). */
typedef struct {
    int32_t op;
    uint64_t data_len; /* bytes of host data the op's kernels read from the device */
    union {
#define X(OP, op) ga_##op op;
        GRAPH_OPS(X)
#undef X
    } a;
} gent;
static_assert(sizeof(gent) % 8 == 0, "the signature hash reads 8-byte words");

typedef struct {
    uint64_t hash;
    int n;
    gent *e;               /* [n] the signature */
    cudaGraphExec_t exec;
    void *pd;              /* device parameter block the graph's kernels read (entries' data) */
    size_t pbytes;
    uint64_t gen;          /* c->scratch_gen at capture */
    uint64_t last_use;
} gcached;

typedef struct {
    uint64_t hash;
    uint32_t seen, failed;
} gseen;

/* Instantiated graphs kept (LRU; HYLA_CUDA_GRAPH_CACHE, 1..4096). Enough for every segment of a
 * prefill piece: a tensor-parallel piece in two halves (worker/hyla_runtime.c) has four a layer,
 * and an eviction costs a stream sync (the graph's parameter block may be in flight) and a new
 * capture when the segment comes round again, every piece: with 48 kept, an 18-layer model's
 * two-GPU prefill in halves (72 segments a piece) evicted at every flush and ran at 99-115 k
 * tokens/s against 159-166 k with every segment kept. */
#define GCACHE_DEFAULT 256
#define GSEEN 1024   /* signatures remembered (direct-mapped) */
#define GMIN_OPS 3   /* shorter segments run eagerly */
#define GMAX_FAIL 2  /* a signature whose capture failed this often is never captured again */
#define GMAX_OPS 4096 /* longest segment (a decode step of the 1.3B models is ~300-560 ops) */
#define AL256(x) (((x) + 255) & ~(uint64_t)255)

struct hyla_cu_graphs {
    hyla_cuda_ctx *c;  /* the owner */
    gent *e;           /* the log [n] */
    uint64_t *off;     /* [n] offset of each entry's data in `data` */
    int n, cap;
    uint8_t *data;
    size_t data_used, data_cap;
    gcached *cache; /* [ncache] */
    int ncache;
    gseen seen[GSEEN];
    uint64_t tick;
    hyla_status deferred; /* a flush inside free() failed: reported by the next flush */
    hyla_cuda_graph_stats st;
};

/* ---------------------------------------------------------------- lifetime */

extern "C" hyla_status cu_graphs_create(hyla_cuda_ctx *c) {
    hyla_cu_graphs *g = (hyla_cu_graphs *)calloc(1, sizeof *g);
    if (!g) return hyla_fail(HYLA_ERR_NOMEM, "cuda graphs: out of host memory");
    int n = GCACHE_DEFAULT;
    const char *e = getenv("HYLA_CUDA_GRAPH_CACHE");
    if (e && *e) {
        char *end;
        long v = strtol(e, &end, 10);
        if (*end || v < 1 || v > 4096) {
            free(g);
            return hyla_fail(HYLA_ERR_INVALID_ARG, "HYLA_CUDA_GRAPH_CACHE='%s': graphs kept, 1..4096", e);
        }
        n = (int)v;
    }
    if (!(g->cache = (gcached *)calloc((size_t)n, sizeof *g->cache))) {
        free(g);
        return hyla_fail(HYLA_ERR_NOMEM, "cuda graphs: out of host memory");
    }
    g->ncache = n;
    g->c = c;
    c->graphs = g;
    return HYLA_OK;
}

static void cached_free(hyla_cuda_ctx *c, gcached *s) {
    if (s->exec) cudaStreamSynchronize(c->stream); /* a launch in flight reads s->pd */
    if (s->exec) cudaGraphExecDestroy(s->exec);
    if (s->pd) cudaFree(s->pd);
    free(s->e);
    memset(s, 0, sizeof *s);
}

extern "C" void cu_graphs_destroy(hyla_cuda_ctx *c) {
    hyla_cu_graphs *g = c->graphs;
    if (!g) return;
    for (int i = 0; i < g->ncache; i++) cached_free(c, &g->cache[i]);
    free(g->cache);
    free(g->e);
    free(g->off);
    free(g->data);
    free(g);
    c->graphs = NULL;
}

/* ---------------------------------------------------------------- the log */

static hyla_status flush_log(hyla_cuda_ctx *c, hyla_cu_graphs *g);

/* Append an entry with `data_len` bytes of data; *data (valid until the next append) receives
 * where to write them. */
static hyla_status log_entry(hyla_cu_graphs *g, int op, size_t data_len, gent **out, void **data) {
    if (g->n >= GMAX_OPS) { /* a sequence that never reaches a flushing op: cut it */
        hyla_status st = g->deferred != HYLA_OK ? g->deferred : flush_log(g->c, g);
        g->deferred = HYLA_OK;
        g->n = 0;
        g->data_used = 0;
        HYLA_TRY(st);
    }
    if (g->n == g->cap) {
        int nc = g->cap ? g->cap * 2 : 1024;
        gent *ne = (gent *)realloc(g->e, (size_t)nc * sizeof *ne);
        if (!ne) return hyla_fail(HYLA_ERR_NOMEM, "cuda graphs: out of host memory");
        g->e = ne;
        uint64_t *no = (uint64_t *)realloc(g->off, (size_t)nc * sizeof *no);
        if (!no) return hyla_fail(HYLA_ERR_NOMEM, "cuda graphs: out of host memory");
        g->off = no;
        g->cap = nc;
    }
    size_t need = g->data_used + AL256(data_len);
    if (need > g->data_cap) {
        size_t nc = g->data_cap ? g->data_cap : ((size_t)1 << 16);
        while (nc < need) nc *= 2;
        uint8_t *nd = (uint8_t *)realloc(g->data, nc);
        if (!nd) return hyla_fail(HYLA_ERR_NOMEM, "cuda graphs: out of host memory");
        g->data = nd;
        g->data_cap = nc;
    }
    gent *e = &g->e[g->n];
    memset(e, 0, sizeof *e);
    e->op = op;
    e->data_len = data_len;
    g->off[g->n] = g->data_used;
    if (data) *data = g->data + g->data_used;
    g->data_used += AL256(data_len);
    g->n++;
    *out = e;
    return HYLA_OK;
}

/* log_<op>(g, data_len, &args, &data): a zeroed entry of that op whose typed arguments the
 * caller fills; data as for log_entry (NULL where the op has none). */
#define X(OP, op)                                                                                                      \
    static hyla_status log_##op(hyla_cu_graphs *g, size_t data_len, ga_##op **args, void **data) {                     \
        gent *e;                                                                                                       \
        HYLA_TRY(log_entry(g, GOP_##OP, data_len, &e, data));                                                            \
        *args = &e->a.op;                                                                                              \
        return HYLA_OK;                                                                                                \
    }
GRAPH_OPS(X)
#undef X

static uint64_t sig_hash(const gent *e, int n) {
    const uint64_t *w = (const uint64_t *)e;
    size_t nw = (size_t)n * sizeof(gent) / 8;
    uint64_t h = 0x9e3779b97f4a7c15ull ^ (uint64_t)n;
    for (size_t i = 0; i < nw; i++) {
        h ^= w[i];
        h *= 0xff51afd7ed558ccdull;
        h ^= h >> 32;
    }
    return h;
}

/* ---------------------------------------------------------------- running an entry */

static hyla_status dispatch(hyla_cuda_ctx *c, const gent *e, const void *d) {
    switch (e->op) {
#define X(OP, op)                                                                                                      \
    case GOP_##OP: return replay_##op(c, e->a.op, d);
        GRAPH_OPS(X)
#undef X
    }
    return hyla_fail(HYLA_ERR_INTERNAL, "cuda graphs: unknown logged op %d", e->op);
}

/* ---------------------------------------------------------------- flush */

static size_t param_bytes(const gent *e, int n) {
    size_t t = 0;
    for (int j = 0; j < n; j++) t += AL256(e[j].data_len);
    return t ? t : 256;
}

static hyla_status run_eager(hyla_cuda_ctx *c, hyla_cu_graphs *g) {
    for (int j = 0; j < g->n; j++) {
        void *d = NULL;
        if (g->e[j].data_len) HYLA_TRY(cu_stage(c, g->data + g->off[j], (size_t)g->e[j].data_len, &d));
        HYLA_TRY(dispatch(c, &g->e[j], d));
    }
    g->st.eager_segments++;
    return HYLA_OK;
}

/* The log's data goes to the graph's parameter block through the staging ring, on the stream:
 * the previous launch of the same graph is done with the block before the copy lands, with no
 * host wait. The log's layout equals the block's (same entries, lengths and alignment). */
static hyla_status load_params(hyla_cuda_ctx *c, hyla_cu_graphs *g, gcached *s) {
    if (!g->data_used) return HYLA_OK;
    if (g->data_used > s->pbytes) return hyla_fail(HYLA_ERR_INTERNAL, "cuda graphs: parameter block too small");
    return cu_stage_to(c, g->data, g->data_used, s->pd);
}

static hyla_status replay(hyla_cuda_ctx *c, hyla_cu_graphs *g, gcached *s) {
    HYLA_TRY(load_params(c, g, s));
    CU_TRY(cudaGraphLaunch(s->exec, c->stream));
    s->last_use = ++g->tick;
    g->st.replays++;
    return HYLA_OK;
}

static gcached *cache_find(hyla_cu_graphs *g, uint64_t h) {
    for (int i = 0; i < g->ncache; i++) {
        gcached *s = &g->cache[i];
        if (s->exec && s->hash == h && s->n == g->n && !memcmp(s->e, g->e, (size_t)g->n * sizeof(gent))) return s;
    }
    return NULL;
}

static gcached *cache_slot(hyla_cuda_ctx *c, hyla_cu_graphs *g) {
    gcached *lru = &g->cache[0];
    for (int i = 0; i < g->ncache; i++) {
        if (!g->cache[i].exec) return &g->cache[i];
        if (g->cache[i].last_use < lru->last_use) lru = &g->cache[i];
    }
    cached_free(c, lru);
    g->st.evictions++;
    return lru;
}

/* Capture the log into a new cached graph. Returns HYLA_OK with *out = NULL when the capture
 * did not succeed for a reason that eager execution may not share (the caller runs eagerly). */
static hyla_status capture(hyla_cuda_ctx *c, hyla_cu_graphs *g, uint64_t h, gcached **out) {
    *out = NULL;
    gcached *s = cache_slot(c, g);
    s->pbytes = param_bytes(g->e, g->n);
    s->e = (gent *)malloc((size_t)g->n * sizeof(gent));
    if (!s->e) return hyla_fail(HYLA_ERR_NOMEM, "cuda graphs: out of host memory");
    memcpy(s->e, g->e, (size_t)g->n * sizeof(gent));
    s->n = g->n;
    s->hash = h;
    cudaError_t ce = cudaMalloc(&s->pd, s->pbytes);
    if (ce != cudaSuccess) {
        cudaGetLastError();
        cached_free(c, s);
        return HYLA_OK; /* no memory for a graph: run eagerly */
    }
    uint64_t gen = c->scratch_gen;
    hyla_status st = HYLA_OK;
    ce = cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeRelaxed);
    if (ce == cudaSuccess) {
        for (int j = 0; st == HYLA_OK && j < g->n; j++)
            st = dispatch(c, &g->e[j], g->e[j].data_len ? (const void *)((uint8_t *)s->pd + g->off[j]) : NULL);
        cudaGraph_t graph = NULL;
        cudaError_t ee = cudaStreamEndCapture(c->stream, &graph);
        if (ce == cudaSuccess) ce = ee;
        if (ce == cudaSuccess && st == HYLA_OK && graph) {
            cudaGraphExec_t ex = NULL;
            ce = cudaGraphInstantiate(&ex, graph, 0);
            if (ce == cudaSuccess) s->exec = ex;
        }
        if (graph) cudaGraphDestroy(graph);
    }
    if (ce != cudaSuccess || st != HYLA_OK || !s->exec || c->scratch_gen != gen) {
        cudaGetLastError(); /* capture errors are not sticky; clear the record */
        if (s->exec) {
            cudaGraphExecDestroy(s->exec);
            s->exec = NULL;
        }
        cached_free(c, s);
        g->st.capture_failures++;
        return HYLA_OK;
    }
    s->gen = gen;
    g->st.captures++;
    *out = s;
    return HYLA_OK;
}

static hyla_status flush_log(hyla_cuda_ctx *c, hyla_cu_graphs *g) {
    g->st.segments++;
    g->st.ops += (uint64_t)g->n;
    if (g->n < GMIN_OPS) return run_eager(c, g);
    uint64_t h = sig_hash(g->e, g->n);
    gcached *s = cache_find(g, h);
    if (s && s->gen != c->scratch_gen) { /* a scratch buffer it uses has moved */
        cached_free(c, s);
        s = NULL;
    }
    if (s) return replay(c, g, s);
    gseen *sn = &g->seen[h % GSEEN];
    if (sn->hash != h) {
        sn->hash = h;
        sn->seen = 0;
        sn->failed = 0;
    }
    if (++sn->seen >= 2 && sn->failed < GMAX_FAIL) {
        HYLA_TRY(capture(c, g, h, &s));
        if (s) return replay(c, g, s);
        sn->failed++;
    }
    return run_eager(c, g);
}

extern "C" hyla_status cu_graph_flush(hyla_cuda_ctx *c) {
    hyla_cu_graphs *g = c->graphs;
    if (!g) return HYLA_OK;
    hyla_status st = g->deferred;
    g->deferred = HYLA_OK;
    if (st == HYLA_OK && g->n) st = flush_log(c, g);
    g->n = 0;
    g->data_used = 0;
    return st;
}

/* ---------------------------------------------------------------- logging wrappers */

#define CTX hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx
#define LOGGING (c->graphs_on && c->graphs)

static hyla_status g_embed(void *ctx, const hyla_weight *table, const int32_t *ids, int n, float *out) {
    CTX;
    if (!LOGGING) return cu_embed(ctx, table, ids, n, out);
    if (n <= 0) return HYLA_OK;
    HYLA_TRY(cu_embed_check(table, ids, n));
    /* an embedding starts a forward pass (a prefill piece or a decode step): the segment before
     * it is complete, and cutting here makes every piece of a long prefill the same segment */
    HYLA_TRY(cu_graph_flush(c));
    ga_embed *a;
    void *d;
    HYLA_TRY(log_embed(c->graphs, (size_t)n * 4, &a, &d));
    a->table = table;
    a->out = out;
    a->table_d = table->d;
    a->n = n;
    memcpy(d, ids, (size_t)n * 4);
    return HYLA_OK;
}

static hyla_status g_linear(void *ctx, const float *x, int ldx, int M, int K, const hyla_weight *W, const float *bias,
                            float *y, int ldy, int N, int accumulate) {
    CTX;
    if (!LOGGING) return cu_linear(ctx, x, ldx, M, K, W, bias, y, ldy, N, accumulate);
    if (M <= 0) return HYLA_OK;
    HYLA_TRY(cu_linear_check(ldx, K, W, ldy, N));
    ga_linear *a;
    HYLA_TRY(log_linear(c->graphs, 0, &a, NULL));
    a->x = x;
    a->W = W;
    a->bias = bias;
    a->y = y;
    a->W_d = W->d;
    a->ldx = ldx;
    a->M = M;
    a->K = K;
    a->ldy = ldy;
    a->N = N;
    a->accumulate = accumulate;
    return HYLA_OK;
}

static hyla_status g_linear_multi(void *ctx, const float *x, int ldx, int M, int K, int n, const hyla_linear_out *outs,
                                  int accumulate, int flags) {
    CTX;
    if (!LOGGING) return cu_linear_multi(ctx, x, ldx, M, K, n, outs, accumulate, flags);
    if (M <= 0) return HYLA_OK;
    if (n < 1 || n > HYLA_LINEAR_MULTI_MAX)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "linear_multi: %d outputs (1..%d)", n, HYLA_LINEAR_MULTI_MAX);
    for (int j = 0; j < n; j++) HYLA_TRY(cu_linear_check(ldx, K, outs[j].W, outs[j].ldy, outs[j].N));
    HYLA_TRY(cu_linear_flags_check(c, flags, x, ldx, M, K, n, outs, accumulate));
    ga_linear_multi *a;
    HYLA_TRY(log_linear_multi(c->graphs, 0, &a, NULL));
    a->x = x;
    a->ldx = ldx;
    a->M = M;
    a->K = K;
    a->n = n;
    a->accumulate = accumulate;
    a->flags = flags;
    for (int j = 0; j < n; j++) { /* field by field: the struct's padding stays zero */
        a->out[j].W = outs[j].W;
        a->out[j].bias = outs[j].bias;
        a->out[j].y = outs[j].y;
        a->out[j].ldy = outs[j].ldy;
        a->out[j].N = outs[j].N;
        a->out[j].x = outs[j].x;
        a->out[j].acc = outs[j].acc;
        a->W_d[j] = outs[j].W->d;
    }
    return HYLA_OK;
}

/* The plain ops' recorders: run now when not logging, else log the arguments as the entry. */
#define PLAIN_RECORDER(op)                                                                                            \
    static hyla_status g_##op(void *ctx ARGS_##op(GA_PARAM)) {                                                        \
        CTX;                                                                                                          \
        if (!LOGGING) return cu_##op(ctx ARGS_##op(GA_ARG));                                                          \
        ga_##op *e_;                                                                                                  \
        HYLA_TRY(log_##op(c->graphs, 0, &e_, NULL));                                                                  \
        ARGS_##op(GA_SET) return HYLA_OK;                                                                             \
    }
PLAIN_OPS(PLAIN_RECORDER)

#define LINEAR_RECORDER(op)                                                                                           \
    static hyla_status g_##op(void *ctx ARGS_##op(GA_PARAM)) {                                                        \
        CTX;                                                                                                          \
        if (!LOGGING) return cu_##op(ctx ARGS_##op(GA_ARG));                                                          \
        if (M <= 0) return HYLA_OK;                                                                                   \
        HYLA_TRY(cu_linear_check(K_##op, K_##op, W, N, N));                                                           \
        HYLA_TRY(cu_fused_flags_check(#op, flags));                                                                   \
        ga_##op *e_;                                                                                                  \
        HYLA_TRY(log_##op(c->graphs, 0, &e_, NULL));                                                                  \
        ARGS_##op(GA_SET) e_->W_d = W->d;                                                                             \
        return HYLA_OK;                                                                                               \
    }
LINEAR_OPS(LINEAR_RECORDER)

static hyla_status g_rope(void *ctx, float *x, int n, int H, int D, const int32_t *pos, float theta) {
    CTX;
    if (!LOGGING) return cu_rope(ctx, x, n, H, D, pos, theta);
    if (n <= 0) return HYLA_OK;
    if (D % 2) return hyla_fail(HYLA_ERR_INVALID_ARG, "rope: head dim %d is odd", D);
    ga_rope *a;
    void *d;
    HYLA_TRY(log_rope(c->graphs, (size_t)n * 4, &a, &d));
    a->x = x;
    a->n = n;
    a->H = H;
    a->D = D;
    a->theta = theta;
    memcpy(d, pos, (size_t)n * 4);
    return HYLA_OK;
}

static hyla_status g_short_conv(void *ctx, float *x, int B, int n, int C, const float *w, const float *bias, int K,
                                float *const *tails, int act_silu) {
    CTX;
    if (!LOGGING) return cu_short_conv(ctx, x, B, n, C, w, bias, K, tails, act_silu);
    if (B <= 0 || n <= 0) return HYLA_OK;
    if (K < 1) return hyla_fail(HYLA_ERR_INVALID_ARG, "short_conv: kernel size %d", K);
    ga_short_conv *a;
    void *d;
    HYLA_TRY(log_short_conv(c->graphs, (size_t)B * sizeof(float *), &a, &d));
    a->x = x;
    a->w = w;
    a->bias = bias;
    a->B = B;
    a->n = n;
    a->C = C;
    a->K = K;
    a->act_silu = act_silu;
    memcpy(d, tails, (size_t)B * sizeof(float *));
    return HYLA_OK;
}

static hyla_status g_short_conv_multi(void *ctx, int m, const hyla_conv_part *p, int B, int n, int K, int act_silu) {
    CTX;
    if (!LOGGING) return cu_short_conv_multi(ctx, m, p, B, n, K, act_silu);
    HYLA_TRY(cu_short_conv_multi_check(m, p, K));
    if (B <= 0 || n <= 0) return HYLA_OK;
    ga_short_conv_multi *a;
    void *d;
    HYLA_TRY(log_short_conv_multi(c->graphs, (size_t)m * B * sizeof(float *), &a, &d));
    for (int i = 0; i < m; i++) {
        a->x[i] = p[i].x;
        a->w[i] = p[i].w;
        a->bias[i] = p[i].bias;
        a->C[i] = p[i].C;
        a->l2[i] = p[i].l2;
        a->l2_eps[i] = p[i].l2_eps;
        a->src[i] = p[i].src;
        memcpy((float **)d + (size_t)i * B, p[i].tails, (size_t)B * sizeof(float *));
    }
    a->m = m;
    a->B = B;
    a->n = n;
    a->K = K;
    a->act_silu = act_silu;
    a->tails16 = cu_conv_tails16(m, p, B);
    return HYLA_OK;
}

/* The logged decode entry; *out (when given): the entry, for the caller's further fields (the
 * raw GDN form) */
static hyla_status lin_decode(hyla_cuda_ctx *c, int gdn, const float *q, const float *k, const float *v,
                              const float *ga, const float *gb, int B, int H, int dk, int dv, float scale,
                              float *const *S, float *o, ga_lin_decode **out = NULL) {
    if (B <= 0) return HYLA_OK;
    if (dk > 256 && !cu_gla_slabs(gdn, dk))
        return hyla_fail(HYLA_ERR_UNSUPPORTED, "linear attention: key head dim %d > 256 is not supported on cuda for gdn", dk);
    if (H > 65535 || B > 65535) return hyla_fail(HYLA_ERR_UNSUPPORTED, "linear attention: H=%d B=%d", H, B);
    ga_lin_decode *a;
    void *d;
    HYLA_TRY(log_lin_decode(c->graphs, (size_t)B * sizeof(float *), &a, &d));
    lin_io_set(&a->io, gdn, q, k, v, ga, gb, H, dk, dv, scale, o);
    a->B = B;
    a->states16 = cu_states16(S, B);
    a->raw = 0;
    memcpy(d, S, (size_t)B * sizeof(float *));
    if (out) *out = a;
    return HYLA_OK;
}

static hyla_status g_gla_decode(void *ctx, const float *q, const float *k, const float *v, const float *gk, int B,
                                int H, int dk, int dv, float scale, float *const *S, float *o) {
    CTX;
    if (!LOGGING) return cu_gla_decode(ctx, q, k, v, gk, B, H, dk, dv, scale, S, o);
    return lin_decode(c, 0, q, k, v, gk, NULL, B, H, dk, dv, scale, S, o);
}

static hyla_status g_gdn_decode(void *ctx, const float *q, const float *k, const float *v, const float *g,
                                const float *beta, int B, int H, int dk, int dv, float scale, float *const *S,
                                float *o) {
    CTX;
    if (!LOGGING) return cu_gdn_decode(ctx, q, k, v, g, beta, B, H, dk, dv, scale, S, o);
    return lin_decode(c, 1, q, k, v, g, beta, B, H, dk, dv, scale, S, o);
}

static hyla_status g_gdn_decode_raw(void *ctx, float *q, float *k, const float *v, float *ga, float *gb,
                                    const float *A_log, const float *dt_bias, int allow_neg, float eps, int B, int H,
                                    int dk, int dv, float scale, float *const *S, float *o) {
    CTX;
    if (!LOGGING) return cu_gdn_decode_raw(ctx, q, k, v, ga, gb, A_log, dt_bias, allow_neg, eps, B, H, dk, dv, scale, S, o);
    if (B <= 0) return HYLA_OK;
    if (!cu_gdn_decode_raw_ok(q, k, v, o, B, H, dk, dv, cu_states16(S, B))) { /* the three ops, logged */
        HYLA_TRY(g_l2norm_rows(ctx, q, B * H, dk, eps));
        HYLA_TRY(g_l2norm_rows(ctx, k, B * H, dk, eps));
        HYLA_TRY(g_gdn_gates(ctx, ga, H, gb, H, A_log, dt_bias, ga, gb, B, H, allow_neg));
        return g_gdn_decode(ctx, q, k, v, ga, gb, B, H, dk, dv, scale, S, o);
    }
    /* the GDN decode entry (its states are 16-byte aligned: cu_gdn_decode_raw_ok), made raw */
    ga_lin_decode *a;
    HYLA_TRY(lin_decode(c, 1, q, k, v, ga, gb, B, H, dk, dv, scale, S, o, &a));
    a->raw = 1;
    a->allow_neg = allow_neg;
    a->eps = eps;
    a->A_log = A_log;
    a->dt_bias = dt_bias;
    return HYLA_OK;
}

static hyla_status g_sse_route(void *ctx, const float *logits, int n, int N, int K, int32_t *idx, float *w) {
    CTX;
    if (!LOGGING) return cu_sse_route(ctx, logits, n, N, K, idx, w);
    if (n <= 0) return HYLA_OK;
    if (K < 1 || K > N) return hyla_fail(HYLA_ERR_INVALID_ARG, "sse_route: top-%d of %d partitions", K, N);
    ga_sse_route *a;
    HYLA_TRY(log_sse_route(c->graphs, 0, &a, NULL));
    a->logits = logits;
    a->idx = idx;
    a->w = w;
    a->n = n;
    a->N = N;
    a->K = K;
    return HYLA_OK;
}

static hyla_status g_sse_decode(void *ctx, hyla_sse_transition tr, const float *q1, const float *k1, const float *q2,
                                const float *k2, const float *v, const float *ga, const float *gb,
                                const float *betaa, const float *betab, const int32_t *idx, const float *w, int B,
                                int H, int dk, int dv, int N, int K, float scale, float *const *S0,
                                float *const *Sp, float *o) {
    CTX;
    if (!LOGGING)
        return cu_sse_decode(ctx, tr, q1, k1, q2, k2, v, ga, gb, betaa, betab, idx, w, B, H, dk, dv, N, K, scale, S0,
                             Sp, o);
    if (B <= 0) return HYLA_OK;
    if (K < 1 || K > N) return hyla_fail(HYLA_ERR_INVALID_ARG, "sse_decode: top-%d of %d partitions", K, N);
    if (dk > 256) return hyla_fail(HYLA_ERR_UNSUPPORTED, "linear attention: key head dim %d > 256 is not supported on cuda", dk);
    if (H > 65535 || B > 65535) return hyla_fail(HYLA_ERR_UNSUPPORTED, "linear attention: H=%d B=%d", H, B);
    ga_sse_decode *a;
    void *d;
    HYLA_TRY(log_sse_decode(c->graphs, (size_t)B * 2 * sizeof(float *), &a, &d));
    sse_io_set(&a->io, tr, q1, k1, q2, k2, v, ga, gb, betaa, betab, idx, w, H, dk, dv, N, K, scale, o);
    a->B = B;
    a->states16 = cu_states16(S0, B) && cu_states16(Sp, B);
    memcpy(d, S0, (size_t)B * sizeof(float *));
    memcpy((float **)d + B, Sp, (size_t)B * sizeof(float *));
    return HYLA_OK;
}

static hyla_status g_attn_decode(void *ctx, const float *q, const float *k, const float *v, int B, int Hq, int Hk,
                                 int D, const int32_t *pos, const hyla_kv_view *kv, int window, float scale,
                                 float *o) {
    CTX;
    if (!LOGGING) return cu_attn_decode(ctx, q, k, v, B, Hq, Hk, D, pos, kv, window, scale, o);
    if (B <= 0) return HYLA_OK;
    size_t nptr;
    int nsplit;
    HYLA_TRY(cu_attn_decode_plan(B, Hq, Hk, D, pos, kv, window, &nptr, &nsplit));
    /* the page tables' capacity rounds up, so appending pages rarely changes the signature */
    size_t cap = 16;
    while (cap < nptr) cap *= 2;
    size_t bytes = cu_attn_decode_block_bytes(B, cap);
    ga_attn_decode *a;
    void *d;
    HYLA_TRY(log_attn_decode(c->graphs, bytes, &a, &d));
    a->q = q;
    a->k = k;
    a->v = v;
    a->o = o;
    a->B = B;
    a->Hq = Hq;
    a->Hk = Hk;
    a->D = D;
    a->page_tokens = kv[0].page_tokens;
    a->nsplit = nsplit;
    a->window = window;
    a->scale = scale;
    a->cap = cap;
    cu_attn_decode_block(d, B, cap, pos, kv);
    return HYLA_OK;
}

static hyla_status g_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    CTX;
    if (!bytes || dst == src) return HYLA_OK;
    if (!LOGGING) {
        CU_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->stream));
        return HYLA_OK;
    }
    ga_copy *a;
    HYLA_TRY(log_copy(c->graphs, 0, &a, NULL));
    a->dst = dst;
    a->src = src;
    a->bytes = bytes;
    return HYLA_OK;
}

extern "C" hyla_status cu_graph_tp_sum(hyla_cuda_ctx *c, const void *os, int j, float *x, size_t n) {
    if (!LOGGING) return cu_tp_sum(c, os, j, x, n);
    ga_tp_sum *a;
    HYLA_TRY(log_tp_sum(c->graphs, 0, &a, NULL));
    a->os = os;
    a->x = x;
    a->n = n;
    a->j = j;
    return HYLA_OK;
}

static hyla_status g_zero(void *ctx, void *dst, size_t bytes) {
    CTX;
    if (!bytes) return HYLA_OK;
    if (!LOGGING) {
        CU_TRY(cudaMemsetAsync(dst, 0, bytes, c->stream));
        return HYLA_OK;
    }
    ga_zero *a;
    HYLA_TRY(log_zero(c->graphs, 0, &a, NULL));
    a->dst = dst;
    a->bytes = bytes;
    return HYLA_OK;
}

/* ---------------------------------------------------------------- ops that flush first */

#define FLUSH HYLA_TRY(cu_graph_flush((hyla_cuda_ctx *)ctx))

static hyla_status f_alloc(void *ctx, size_t bytes, void **out) {
    *out = NULL;
    FLUSH;
    return cu_pool_alloc((hyla_cuda_ctx *)ctx, bytes, out);
}

static void f_free(void *ctx, void *p) {
    if (!p) return;
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    hyla_status st = cu_graph_flush(c); /* queued users of p are launched before p is reused */
    if (st != HYLA_OK && c->graphs && c->graphs->deferred == HYLA_OK) c->graphs->deferred = st;
    cu_pool_free(c, p);
}

static hyla_status f_upload(void *ctx, void *dst, const void *host_src, size_t bytes) {
    FLUSH;
    return cu_upload(ctx, dst, host_src, bytes);
}

static hyla_status f_download(void *ctx, void *host_dst, const void *src, size_t bytes) {
    FLUSH;
    /* small reads (logits) through the mapped readback buffer, off the copy engine */
    return cu_readback((hyla_cuda_ctx *)ctx, host_dst, src, bytes);
}

static hyla_status f_sync(void *ctx) {
    FLUSH;
    return cu_sync(ctx);
}

static hyla_status f_submit(void *ctx) {
    FLUSH;
    return HYLA_OK;
}

static hyla_status f_weight_create(void *ctx, const void *host, hyla_dtype dt, int rows, int cols, hyla_weight **out) {
    *out = NULL;
    FLUSH;
    return cu_weight_create(ctx, host, dt, rows, cols, out);
}

static void f_weight_destroy(void *ctx, hyla_weight *w) {
    if (!w) return;
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    hyla_status st = cu_graph_flush(c);
    if (st != HYLA_OK && c->graphs && c->graphs->deferred == HYLA_OK) c->graphs->deferred = st;
    cu_weight_destroy(ctx, w);
}

static hyla_status lin_prefill(hyla_cuda_ctx *c, int gdn, const float *q, const float *k, const float *v,
                               const float *ga, const float *gb, int n, int H, int dk, int dv, float scale, float *S,
                               float *o) {
    if (n <= 0) return HYLA_OK;
    if (H <= 0 || dk <= 0 || dv <= 0) return hyla_fail(HYLA_ERR_INVALID_ARG, "linear attention: H=%d dk=%d dv=%d", H, dk, dv);
    if (dk > 256 && !cu_gla_slabs(gdn, dk) && !cu_linattn_chunked_ok(c, gdn, H, dk, dv, 1))
        return hyla_fail(HYLA_ERR_UNSUPPORTED, "linear attention: key head dim %d > 256 is not supported on cuda for gdn", dk);
    ga_lin_prefill *a;
    void *d;
    HYLA_TRY(log_lin_prefill(c->graphs, cu_lin_prefill1_block(n, S, NULL), &a, &d));
    lin_io_set(&a->io, gdn, q, k, v, ga, gb, H, dk, dv, scale, o);
    a->n = n;
    a->s_aligned = ((uintptr_t)S & 15) == 0;
    cu_lin_prefill1_block(n, S, d);
    return HYLA_OK;
}

static hyla_status g_gla_prefill(void *ctx, const float *q, const float *k, const float *v, const float *gk, int n,
                                 int H, int dk, int dv, float scale, float *S, float *o) {
    CTX;
    if (!LOGGING) return cu_gla_prefill(ctx, q, k, v, gk, n, H, dk, dv, scale, S, o);
    return lin_prefill(c, 0, q, k, v, gk, NULL, n, H, dk, dv, scale, S, o);
}

static hyla_status g_gdn_prefill(void *ctx, const float *q, const float *k, const float *v, const float *g,
                                 const float *beta, int n, int H, int dk, int dv, float scale, float *S, float *o) {
    CTX;
    if (!LOGGING) return cu_gdn_prefill(ctx, q, k, v, g, beta, n, H, dk, dv, scale, S, o);
    return lin_prefill(c, 1, q, k, v, g, beta, n, H, dk, dv, scale, S, o);
}

static hyla_status f_attn_prefill(void *ctx, const float *q, const float *k, const float *v, int n, int Hq, int Hk,
                                  int D, int pos0, const hyla_kv_view *kv, int window, float scale, float *o) {
    FLUSH;
    return cu_attn_prefill(ctx, q, k, v, n, Hq, Hk, D, pos0, kv, window, scale, o);
}

/* SSE prefill planned on the device is stream-only, so it is logged too; the host planner
 * (N > 64, K > 8) syncs, so that path flushes and runs at once. */
static hyla_status g_sse_prefill(void *ctx, hyla_sse_transition tr, const float *q1, const float *k1, const float *q2,
                                 const float *k2, const float *v, const float *ga, const float *gb,
                                 const float *betaa, const float *betab, const int32_t *idx, const float *w, int n,
                                 int H, int dk, int dv, int N, int K, float scale, int window, float *S0, float *Sp,
                                 float *o) {
    CTX;
    if (n <= 0) return HYLA_OK;
    if (K < 1 || K > N) return hyla_fail(HYLA_ERR_INVALID_ARG, "sse_prefill: top-%d of %d partitions", K, N);
    if (window < 64 || window % 64)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "sse_prefill: window %d is not a positive multiple of 64", window);
    if (!LOGGING || !cu_sse_prefill_planned(c, tr, H, dk, dv, N, K)) {
        FLUSH;
        return cu_sse_prefill(ctx, tr, q1, k1, q2, k2, v, ga, gb, betaa, betab, idx, w, n, H, dk, dv, N, K, scale,
                              window, S0, Sp, o);
    }
    ga_sse_prefill *a;
    HYLA_TRY(log_sse_prefill(c->graphs, 0, &a, NULL));
    sse_io_set(&a->io, tr, q1, k1, q2, k2, v, ga, gb, betaa, betab, idx, w, H, dk, dv, N, K, scale, o);
    a->S0 = S0;
    a->Sp = Sp;
    a->n = n;
    a->windows = c->sse_windows ? window : 0;
    return HYLA_OK;
}

static hyla_status f_sample(void *ctx, const float *logits, int B, int V, const hyla_sampling *params, const float *u,
                            int32_t *out) {
    FLUSH;
    return cu_sample(ctx, logits, B, V, params, u, out);
}

static void f_destroy(void *ctx) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    if (c) cu_graph_flush(c);
    cu_destroy(ctx);
}

/* Host buffers touch no stream; a capture flushes the log itself (its copies are ordered after
 * every op called before it, logged or not). */
static hyla_status f_host_alloc(void *ctx, size_t bytes, void **out) {
    return cu_host_alloc((hyla_cuda_ctx *)ctx, bytes, out);
}

static void f_host_free(void *ctx, void *p) { cu_host_free((hyla_cuda_ctx *)ctx, p); }

static hyla_status f_capture_begin(void *ctx, int n, void *const *host_dst, const void *const *src,
                                   const size_t *bytes, hyla_capture **out) {
    return cu_capture_begin((hyla_cuda_ctx *)ctx, n, host_dst, src, bytes, out);
}

static hyla_status f_upload_begin(void *ctx, int n, void *const *dst, const void *const *host_src,
                                  const size_t *bytes, hyla_capture **out) {
    return cu_upload_begin((hyla_cuda_ctx *)ctx, n, dst, host_src, bytes, out);
}

static int f_capture_done(void *ctx, hyla_capture *t) { return cu_capture_done((hyla_cuda_ctx *)ctx, t); }

static hyla_status f_capture_end(void *ctx, hyla_capture *t) { return cu_capture_end((hyla_cuda_ctx *)ctx, t); }

/* ---- Mamba2 (SSD) ----
 * copy2d, ssd_decode and ssd_norm are logged; ssd_prefill flushes the log and runs at once (its
 * chunked path grows a scratch buffer with the piece, which a logged entry may not see move). */
static hyla_status g_copy2d(void *ctx, float *dst, int ldd, const float *src, int lds, int rows, int cols) {
    CTX;
    if (!LOGGING) return cu_copy2d(ctx, dst, ldd, src, lds, rows, cols);
    HYLA_TRY(cu_copy2d_check(ldd, lds, rows, cols));
    if (rows == 0 || cols == 0) return HYLA_OK;
    ga_copy2d *a;
    HYLA_TRY(log_copy2d(c->graphs, 0, &a, NULL));
    a->dst = dst;
    a->src = src;
    a->ldd = ldd;
    a->lds = lds;
    a->rows = rows;
    a->cols = cols;
    return HYLA_OK;
}

static hyla_status f_ssd_prefill(void *ctx, const float *xbc, int ldx, const float *dt, int ld_dt, const float *dt_bias,
                                 const float *A_log, const float *Dskip, float dt_min, float dt_max, int n, int H, int P,
                                 int G, int N, float *S, float *y) {
    CTX;
    HYLA_TRY(cu_graph_flush(c));
    return cu_ssd_prefill(ctx, xbc, ldx, dt, ld_dt, dt_bias, A_log, Dskip, dt_min, dt_max, n, H, P, G, N, S, y);
}

static hyla_status g_ssd_decode(void *ctx, const float *xbc, int ldx, const float *dt, int ld_dt, const float *dt_bias,
                                const float *A_log, const float *Dskip, float dt_min, float dt_max, int B, int H, int P,
                                int G, int N, float *const *S, float *y) {
    CTX;
    if (!LOGGING) return cu_ssd_decode(ctx, xbc, ldx, dt, ld_dt, dt_bias, A_log, Dskip, dt_min, dt_max, B, H, P, G, N, S, y);
    HYLA_TRY(cu_ssd_decode_check(B, ldx, ld_dt, H, P, G, N));
    if (B <= 0) return HYLA_OK;
    ga_ssd_decode *a;
    void *d;
    HYLA_TRY(log_ssd_decode(c->graphs, (size_t)B * sizeof(float *), &a, &d));
    a->xbc = xbc;
    a->dt = dt;
    a->dt_bias = dt_bias;
    a->A_log = A_log;
    a->Dskip = Dskip;
    a->y = y;
    a->ldx = ldx;
    a->ld_dt = ld_dt;
    a->B = B;
    a->H = H;
    a->P = P;
    a->G = G;
    a->N = N;
    a->states16 = cu_states16(S, B);
    a->dt_min = dt_min;
    a->dt_max = dt_max;
    memcpy(d, S, (size_t)B * sizeof(float *));
    return HYLA_OK;
}

static hyla_status g_ssd_norm(void *ctx, const float *o, const float *z, int ldz, const float *w, float *y, int rows,
                              int G, int gs, float eps) {
    CTX;
    if (!LOGGING) return cu_ssd_norm(ctx, o, z, ldz, w, y, rows, G, gs, eps);
    HYLA_TRY(cu_ssd_norm_check(ldz, rows, G, gs));
    if (rows == 0) return HYLA_OK;
    ga_ssd_norm *a;
    HYLA_TRY(log_ssd_norm(c->graphs, 0, &a, NULL));
    a->o = o;
    a->z = z;
    a->w = w;
    a->y = y;
    a->ldz = ldz;
    a->rows = rows;
    a->G = G;
    a->gs = gs;
    a->eps = eps;
    return HYLA_OK;
}

/* LTE and NSA (hyla_cuda_lte.cu, hyla_cuda_nsa.cu): not logged; they stage host arrays and pick launches
 * from host-side positions. */
static hyla_status f_lte_score(void *ctx, const hyla_lte_params *p, const float *x, int T, int x0, float *r) {
    FLUSH;
    return cu_lte_score(ctx, p, x, T, x0, r);
}

static hyla_status f_lte_prefill(void *ctx, const hyla_lte_params *p, const float *q, const float *k, const float *v,
                                 int n, int Hq, int pos0, const hyla_lte_cache *c, float scale, float *o) {
    FLUSH;
    return cu_lte_prefill(ctx, p, q, k, v, n, Hq, pos0, c, scale, o);
}

static hyla_status f_lte_decode(void *ctx, const hyla_lte_params *p, const float *q, const float *k, const float *v,
                                int B, int Hq, const int32_t *pos, const hyla_lte_cache *c, float scale, float *o) {
    FLUSH;
    return cu_lte_decode(ctx, p, q, k, v, B, Hq, pos, c, scale, o);
}

static hyla_status f_nsa_prefill(void *ctx, const float *q, const float *k, const float *v, const float *g, int n,
                                 int Hq, int Hk, int D, int pos0, const hyla_kv_view *kv, int block, int counts,
                                 int window, float scale, float *o) {
    FLUSH;
    return cu_nsa_prefill(ctx, q, k, v, g, n, Hq, Hk, D, pos0, kv, block, counts, window, scale, o);
}

static hyla_status f_nsa_decode(void *ctx, const float *q, const float *k, const float *v, const float *g, int B,
                                int Hq, int Hk, int D, const int32_t *pos, const hyla_kv_view *kv, int block,
                                int counts, int window, float scale, float *o) {
    FLUSH;
    return cu_nsa_decode(ctx, q, k, v, g, B, Hq, Hk, D, pos, kv, block, counts, window, scale, o);
}

static int f_decode_bf16_rows(void *ctx, int M, int K) { return cu_decode_bf16_rows((hyla_cuda_ctx *)ctx, M, K); }

extern "C" const hyla_ops hyla_cuda_ops_table = {
    /* name */ "cuda",
    /* kv_dtype */ HYLA_DT_BF16,
    f_alloc,
    f_free,
    f_upload,
    f_download,
    g_copy,
    g_zero,
    f_sync,
    f_weight_create,
    f_weight_destroy,
    g_embed,
    g_linear,
    g_linear_multi,
    g_swiglu_linear,
    g_gated_rmsnorm_linear,
    g_rmsnorm,
    g_add_rmsnorm,
    g_add,
    g_swiglu,
    g_silu,
    g_gla_gate,
    g_softmax_rows,
    g_l2norm_rows,
    g_gdn_gates,
    g_rope,
    g_short_conv,
    g_short_conv_multi,
    g_gated_rmsnorm,
    g_gla_prefill,
    g_gla_decode,
    g_gdn_prefill,
    g_gdn_decode,
    f_attn_prefill,
    g_attn_decode,
    g_sse_route,
    g_sse_prefill,
    g_sse_decode,
    f_sample,
    f_destroy,
    f_host_alloc,
    f_host_free,
    f_capture_begin,
    f_capture_done,
    f_capture_end,
    /* LTE, NSA (hyla_cuda_lte.cu, hyla_cuda_nsa.cu) */
    f_lte_score,
    f_lte_prefill,
    f_lte_decode,
    f_nsa_prefill,
    f_nsa_decode,
    /* Mamba2 (SSD) */
    g_copy2d,
    f_ssd_prefill,
    g_ssd_decode,
    g_ssd_norm,
    /* DLA, Mamba2's gates and skip (hyla_cuda_dla.cu; not logged: each flushes the log) */
    cu_dla_prefill,
    cu_dla_decode,
    cu_ssd_gates,
    cu_ssd_skip,
    /* asynchronous upload (hyla_cuda_pool.cu) */
    f_upload_begin,
    /* GDN decode from the raw projections */
    g_gdn_decode_raw,
    /* prompt rows' norms as the prompt GEMMs' bf16 operand */
    g_rmsnorm_bf16,
    /* launch what is logged, without waiting */
    f_submit,
    /* SSE's feature maps in one launch */
    g_sse_maps,
    /* decode rows' norms as the linears' bf16 operand */
    f_decode_bf16_rows,
};

/* ---------------------------------------------------------------- hyla_cuda_extra.h */

static hyla_cuda_ctx *graph_ctx(hyla_backend *be) {
    if (!be || !be->ops || !be->ops->name || strcmp(be->ops->name, "cuda")) return NULL;
    return (hyla_cuda_ctx *)be->ctx;
}

extern "C" hyla_status hyla_cuda_set_graphs(hyla_backend *be, int on) {
    hyla_cuda_ctx *c = graph_ctx(be);
    if (!c) return hyla_fail(HYLA_ERR_INVALID_ARG, "hyla_cuda_set_graphs: not a cuda backend");
    HYLA_TRY(cu_graph_flush(c));
    c->graphs_on = on ? 1 : 0;
    return HYLA_OK;
}

extern "C" hyla_status hyla_cuda_set_attn_split(hyla_backend *be, int keys) {
    hyla_cuda_ctx *c = graph_ctx(be);
    if (!c) return hyla_fail(HYLA_ERR_INVALID_ARG, "hyla_cuda_set_attn_split: not a cuda backend");
    if (!cu_attn_split_ok(keys))
        return hyla_fail(HYLA_ERR_INVALID_ARG, "hyla_cuda_set_attn_split: %d keys is not 0 or a multiple of 64 up to 2^24",
                         keys);
    HYLA_TRY(cu_graph_flush(c));
    c->attn_split_len = keys;
    return HYLA_OK;
}

extern "C" hyla_status hyla_cuda_set_attn_walk(hyla_backend *be, int min_blocks) {
    hyla_cuda_ctx *c = graph_ctx(be);
    if (!c) return hyla_fail(HYLA_ERR_INVALID_ARG, "hyla_cuda_set_attn_walk: not a cuda backend");
    if (min_blocks < 0)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "hyla_cuda_set_attn_walk: %d blocks is negative", min_blocks);
    HYLA_TRY(cu_graph_flush(c));
    c->attn_walk = min_blocks;
    return HYLA_OK;
}

extern "C" hyla_status hyla_cuda_set_attn_wg(hyla_backend *be, int on) {
    hyla_cuda_ctx *c = graph_ctx(be);
    if (!c) return hyla_fail(HYLA_ERR_INVALID_ARG, "hyla_cuda_set_attn_wg: not a cuda backend");
    HYLA_TRY(cu_graph_flush(c));
    c->attn_wg = on && c->hopper;
    return HYLA_OK;
}

extern "C" hyla_status hyla_cuda_set_attn_wg2(hyla_backend *be, int min_keys) {
    hyla_cuda_ctx *c = graph_ctx(be);
    if (!c) return hyla_fail(HYLA_ERR_INVALID_ARG, "hyla_cuda_set_attn_wg2: not a cuda backend");
    if (min_keys < 0) return hyla_fail(HYLA_ERR_INVALID_ARG, "hyla_cuda_set_attn_wg2: %d keys is negative", min_keys);
    HYLA_TRY(cu_graph_flush(c));
    c->attn_wg2 = min_keys;
    return HYLA_OK;
}

extern "C" hyla_status hyla_cuda_get_graph_stats(hyla_backend *be, hyla_cuda_graph_stats *out) {
    hyla_cuda_ctx *c = graph_ctx(be);
    memset(out, 0, sizeof *out);
    if (!c) return hyla_fail(HYLA_ERR_INVALID_ARG, "hyla_cuda_get_graph_stats: not a cuda backend");
    if (!c->graphs) return HYLA_OK;
    *out = c->graphs->st;
    out->cached = 0;
    for (int i = 0; i < c->graphs->ncache; i++) out->cached += c->graphs->cache[i].exec != NULL;
    return HYLA_OK;
}
