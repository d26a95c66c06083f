/* hyla_cuda_graph.cu — CUDA graphs for repeated op sequences (the decode step), behind the
 * unchanged ops interface, and the ops-table entries that order everything else after them.
 *
 * Why: a decode step of the 1.3B models is ~700–900 kernel launches issued one op at a time;
 * at batch 1 the step is bound by launch overhead, not by the GPU. The runtime calls the same
 * ops with the same device pointers step after step; only host-array contents change
 * (token ids, positions, the batch's state and KV page pointers).
 *
 * How: stream-ordered ops whose launches depend only on their arguments ("loggable": embed,
 * linear, the row and elementwise ops, rope, short_conv, the decode mixers, GLA/GDN prefill,
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

#include "hyla_cuda_extra.h"
#include "hyla_cuda_impl.h"

enum {
    GOP_EMBED = 1,
    GOP_LINEAR,
    GOP_RMSNORM,
    GOP_ADD_RMSNORM,
    GOP_ADD,
    GOP_SWIGLU,
    GOP_SILU,
    GOP_GLA_GATE,
    GOP_SOFTMAX,
    GOP_L2NORM,
    GOP_GDN_GATES,
    GOP_ROPE,
    GOP_SHORT_CONV,
    GOP_GATED_RMSNORM,
    GOP_LIN_DECODE,
    GOP_SSE_ROUTE,
    GOP_SSE_DECODE,
    GOP_ATTN_DECODE,
    GOP_COPY,
    GOP_ZERO,
    GOP_LIN_PREFILL,
    GOP_SSE_PREFILL,
    GOP_LINEAR_MULTI,
    /* Mamba2 (SSD) */
    GOP_COPY2D,
    GOP_SSD_DECODE,
    GOP_SSD_NORM,
};

/* One logged op; every byte is part of the signature (entries are zeroed before filling). */
typedef struct {
    int32_t op;
    int32_t i[14];
    float f[4];
    const void *p[17];
    uint64_t z[2];
    uint64_t data_len; /* bytes of host data the op's kernels read from the device */
} gent;

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

#define GCACHE 48    /* instantiated graphs kept (LRU) */
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
    gcached cache[GCACHE];
    gseen seen[GSEEN];
    uint64_t tick;
    hyla_status deferred; /* a flush inside free() failed: reported by the next flush */
    hyla_cuda_graph_stats st;
};

/* ---------------------------------------------------------------- lifetime */

extern "C" hyla_status cu_graphs_create(hyla_cuda_ctx *c) {
    hyla_cu_graphs *g = (hyla_cu_graphs *)calloc(1, sizeof *g);
    if (!g) return hyla_fail(HYLA_ERR_NOMEM, "cuda graphs: out of host memory");
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
    for (int i = 0; i < GCACHE; i++) cached_free(c, &g->cache[i]);
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
static hyla_status log_add(hyla_cu_graphs *g, int op, size_t data_len, gent **out, void **data) {
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
    const int *I = e->i;
    const float *F = e->f;
    const void *const *P = e->p;
    switch (e->op) {
    case GOP_EMBED:
        return cu_embed_dev(c, (const hyla_weight *)P[0], (const int32_t *)d, I[0], (float *)P[1]);
    case GOP_LINEAR:
        return cu_linear(c, (const float *)P[0], I[0], I[1], I[2], (const hyla_weight *)P[1], (const float *)P[2],
                         (float *)P[3], I[3], I[4], I[5]);
    case GOP_LINEAR_MULTI: {
        hyla_linear_out o[HYLA_LINEAR_MULTI_MAX];
        for (int j = 0; j < I[3]; j++)
            o[j] = hyla_linear_out{(const hyla_weight *)P[1 + 4 * j], (const float *)P[2 + 4 * j], (float *)P[3 + 4 * j],
                                   I[5 + 2 * j], I[6 + 2 * j]};
        return cu_linear_multi(c, (const float *)P[0], I[0], I[1], I[2], I[3], o, I[4], I[13]);
    }
    case GOP_RMSNORM:
        return cu_rmsnorm(c, (const float *)P[0], (const float *)P[1], (float *)P[2], I[0], I[1], F[0]);
    case GOP_ADD_RMSNORM:
        return cu_add_rmsnorm(c, (float *)P[0], (const float *)P[1], (const float *)P[2], (float *)P[3], I[0], I[1],
                              F[0]);
    case GOP_ADD: return cu_add(c, (float *)P[0], (const float *)P[1], (size_t)e->z[0]);
    case GOP_SWIGLU:
        return cu_swiglu(c, (const float *)P[0], (const float *)P[1], (float *)P[2], (size_t)e->z[0]);
    case GOP_SILU: return cu_silu(c, (float *)P[0], (size_t)e->z[0]);
    case GOP_GLA_GATE: return cu_gla_gate(c, (float *)P[0], (size_t)e->z[0], F[0], F[1]);
    case GOP_SOFTMAX: return cu_softmax_rows(c, (float *)P[0], I[0], I[1]);
    case GOP_L2NORM: return cu_l2norm_rows(c, (float *)P[0], I[0], I[1], F[0]);
    case GOP_GDN_GATES:
        return cu_gdn_gates(c, (const float *)P[0], I[0], (const float *)P[1], I[1], (const float *)P[2],
                            (const float *)P[3], (float *)P[4], (float *)P[5], I[2], I[3], I[4]);
    case GOP_GATED_RMSNORM:
        return cu_gated_rmsnorm(c, (const float *)P[0], (const float *)P[1], (const float *)P[2], (float *)P[3], I[0],
                                I[1], F[0]);
    case GOP_ROPE: return cu_rope_dev(c, (float *)P[0], I[0], I[1], I[2], (const int32_t *)d, F[0]);
    case GOP_SHORT_CONV:
        return cu_short_conv_dev(c, (float *)P[0], I[0], I[1], I[2], (const float *)P[1], (const float *)P[2], I[3],
                                 (float *const *)d, I[4]);
    case GOP_LIN_DECODE:
        return cu_lin_decode_dev(c, I[0], (const float *)P[0], (const float *)P[1], (const float *)P[2],
                                 (const float *)P[3], (const float *)P[4], I[1], I[2], I[3], I[4], F[0],
                                 (float *const *)d, I[5], (float *)P[5]);
    case GOP_SSE_ROUTE: return cu_sse_route(c, (const float *)P[0], I[0], I[1], I[2], (int32_t *)P[1], (float *)P[2]);
    case GOP_SSE_DECODE: {
        float *const *d0 = (float *const *)d;
        return cu_sse_decode_dev(c, (hyla_sse_transition)I[0], (const float *)P[0], (const float *)P[1],
                                 (const float *)P[2], (const float *)P[3], (const float *)P[4], (const float *)P[5],
                                 (const float *)P[6], (const float *)P[7], (const float *)P[8], (const int32_t *)P[9],
                                 (const float *)P[10], I[1], I[2], I[3], I[4], I[5], I[6], F[0], d0, d0 + I[1], I[7],
                                 (float *)P[11]);
    }
    case GOP_ATTN_DECODE:
        return cu_attn_decode_dev(c, (const float *)P[0], (const float *)P[1], (const float *)P[2], I[0], I[1], I[2],
                                  I[3], d, (size_t)e->z[0], I[4], I[5], I[6], F[0], (float *)P[3]);
    case GOP_LIN_PREFILL:
        return cu_lin_prefill1_dev(c, I[0], (const float *)P[0], (const float *)P[1], (const float *)P[2],
                                   (const float *)P[3], (const float *)P[4], I[1], I[2], I[3], I[4], F[0], d, I[5],
                                   (float *)P[5]);
    case GOP_SSE_PREFILL:
        return cu_sse_prefill_dev(c, (hyla_sse_transition)I[0], (const float *)P[0], (const float *)P[1],
                                  (const float *)P[2], (const float *)P[3], (const float *)P[4], (const float *)P[5],
                                  (const float *)P[6], (const float *)P[7], (const float *)P[8], (const int32_t *)P[9],
                                  (const float *)P[10], I[1], I[2], I[3], I[4], I[5], I[6], F[0], I[7], (float *)P[12],
                                  (float *)P[13], (float *)P[11]);
    case GOP_COPY:
        CU_TRY(cudaMemcpyAsync((void *)P[0], P[1], (size_t)e->z[0], cudaMemcpyDeviceToDevice, c->stream));
        return HYLA_OK;
    case GOP_ZERO:
        CU_TRY(cudaMemsetAsync((void *)P[0], 0, (size_t)e->z[0], c->stream));
        return HYLA_OK;
    /* Mamba2 (SSD) */
    case GOP_COPY2D: return cu_copy2d(c, (float *)P[0], I[0], (const float *)P[1], I[1], I[2], I[3]);
    case GOP_SSD_DECODE:
        return cu_ssd_decode_dev(c, (const float *)P[0], I[0], (const float *)P[1], I[1], (const float *)P[2],
                                 (const float *)P[3], (const float *)P[4], F[0], F[1], I[2], I[3], I[4], I[5], I[6],
                                 (float *const *)d, (float *)P[5]);
    case GOP_SSD_NORM:
        return cu_ssd_norm(c, (const float *)P[0], (const float *)P[1], I[0], (const float *)P[2], (float *)P[3], I[1],
                           I[2], I[3], F[0]);
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
    for (int i = 0; i < GCACHE; i++) {
        gcached *s = &g->cache[i];
        if (s->exec && s->hash == h && s->n == g->n && !memcmp(s->e, g->e, (size_t)g->n * sizeof(gent))) return s;
    }
    return NULL;
}

static gcached *cache_slot(hyla_cuda_ctx *c, hyla_cu_graphs *g) {
    gcached *lru = &g->cache[0];
    for (int i = 0; i < GCACHE; i++) {
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
    gent *e;
    void *d;
    HYLA_TRY(log_add(c->graphs, GOP_EMBED, (size_t)n * 4, &e, &d));
    e->p[0] = table;
    e->p[1] = out;
    e->p[2] = table->d; /* the signature holds the weights' device address, not only the handle's */
    e->i[0] = n;
    memcpy(d, ids, (size_t)n * 4);
    return HYLA_OK;
}

static hyla_status g_linear(void *ctx, const float *x, int ldx, int M, int K, const hyla_weight *W, const float *bias,
                            float *y, int ldy, int N, int accumulate) {
    CTX;
    if (!LOGGING) return cu_linear(ctx, x, ldx, M, K, W, bias, y, ldy, N, accumulate);
    if (M <= 0) return HYLA_OK;
    HYLA_TRY(cu_linear_check(ldx, K, W, ldy, N));
    gent *e;
    HYLA_TRY(log_add(c->graphs, GOP_LINEAR, 0, &e, NULL));
    e->p[0] = x;
    e->p[1] = W;
    e->p[2] = bias;
    e->p[3] = y;
    e->p[4] = W->d;
    e->i[0] = ldx;
    e->i[1] = M;
    e->i[2] = K;
    e->i[3] = ldy;
    e->i[4] = N;
    e->i[5] = accumulate;
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
    gent *e;
    HYLA_TRY(log_add(c->graphs, GOP_LINEAR_MULTI, 0, &e, NULL));
    /* p: x, then (W, bias, y, W->d) per output (16 + 1 <= 17); i: ldx, M, K, n, acc, (ldy, N) per
     * output, flags in i[13] */
    e->p[0] = x;
    e->i[0] = ldx;
    e->i[1] = M;
    e->i[2] = K;
    e->i[3] = n;
    e->i[4] = accumulate;
    e->i[13] = flags;
    for (int j = 0; j < n; j++) {
        e->p[1 + 4 * j] = outs[j].W;
        e->p[2 + 4 * j] = outs[j].bias;
        e->p[3 + 4 * j] = outs[j].y;
        e->p[4 + 4 * j] = outs[j].W->d;
        e->i[5 + 2 * j] = outs[j].ldy;
        e->i[6 + 2 * j] = outs[j].N;
    }
    return HYLA_OK;
}

static hyla_status g_rmsnorm(void *ctx, const float *x, const float *w, float *y, int n, int D, float eps) {
    CTX;
    if (!LOGGING) return cu_rmsnorm(ctx, x, w, y, n, D, eps);
    gent *e;
    HYLA_TRY(log_add(c->graphs, GOP_RMSNORM, 0, &e, NULL));
    e->p[0] = x;
    e->p[1] = w;
    e->p[2] = y;
    e->i[0] = n;
    e->i[1] = D;
    e->f[0] = eps;
    return HYLA_OK;
}

static hyla_status g_add_rmsnorm(void *ctx, float *residual, const float *x, const float *w, float *y, int n, int D,
                                 float eps) {
    CTX;
    if (!LOGGING) return cu_add_rmsnorm(ctx, residual, x, w, y, n, D, eps);
    gent *e;
    HYLA_TRY(log_add(c->graphs, GOP_ADD_RMSNORM, 0, &e, NULL));
    e->p[0] = residual;
    e->p[1] = x;
    e->p[2] = w;
    e->p[3] = y;
    e->i[0] = n;
    e->i[1] = D;
    e->f[0] = eps;
    return HYLA_OK;
}

static hyla_status g_elem(hyla_cuda_ctx *c, int op, void *p0, const void *p1, const void *p2, size_t n, float f0,
                          float f1) {
    gent *e;
    HYLA_TRY(log_add(c->graphs, op, 0, &e, NULL));
    e->p[0] = p0;
    e->p[1] = p1;
    e->p[2] = p2;
    e->z[0] = n;
    e->f[0] = f0;
    e->f[1] = f1;
    return HYLA_OK;
}

static hyla_status g_add(void *ctx, float *y, const float *x, size_t n) {
    CTX;
    if (!LOGGING) return cu_add(ctx, y, x, n);
    return g_elem(c, GOP_ADD, y, x, NULL, n, 0, 0);
}

static hyla_status g_swiglu(void *ctx, const float *gate, const float *up, float *out, size_t n) {
    CTX;
    if (!LOGGING) return cu_swiglu(ctx, gate, up, out, n);
    return g_elem(c, GOP_SWIGLU, (void *)gate, up, out, n, 0, 0);
}

static hyla_status g_silu(void *ctx, float *x, size_t n) {
    CTX;
    if (!LOGGING) return cu_silu(ctx, x, n);
    return g_elem(c, GOP_SILU, x, NULL, NULL, n, 0, 0);
}

static hyla_status g_gla_gate(void *ctx, float *x, size_t n, float normalizer, float clamp_min) {
    CTX;
    if (!LOGGING) return cu_gla_gate(ctx, x, n, normalizer, clamp_min);
    return g_elem(c, GOP_GLA_GATE, x, NULL, NULL, n, normalizer, clamp_min);
}

static hyla_status g_rows(hyla_cuda_ctx *c, int op, float *x, int rows, int cols, float f0) {
    gent *e;
    HYLA_TRY(log_add(c->graphs, op, 0, &e, NULL));
    e->p[0] = x;
    e->i[0] = rows;
    e->i[1] = cols;
    e->f[0] = f0;
    return HYLA_OK;
}

static hyla_status g_softmax_rows(void *ctx, float *x, int rows, int cols) {
    CTX;
    if (!LOGGING) return cu_softmax_rows(ctx, x, rows, cols);
    return g_rows(c, GOP_SOFTMAX, x, rows, cols, 0);
}

static hyla_status g_l2norm_rows(void *ctx, float *x, int rows, int cols, float eps) {
    CTX;
    if (!LOGGING) return cu_l2norm_rows(ctx, x, rows, cols, eps);
    return g_rows(c, GOP_L2NORM, x, rows, cols, eps);
}

static hyla_status g_gdn_gates(void *ctx, const float *a, int a_stride, const float *b, int b_stride,
                               const float *A_log, const float *dt_bias, float *g, float *beta, int n, int H,
                               int allow_neg) {
    CTX;
    if (!LOGGING) return cu_gdn_gates(ctx, a, a_stride, b, b_stride, A_log, dt_bias, g, beta, n, H, allow_neg);
    gent *e;
    HYLA_TRY(log_add(c->graphs, GOP_GDN_GATES, 0, &e, NULL));
    e->p[0] = a;
    e->p[1] = b;
    e->p[2] = A_log;
    e->p[3] = dt_bias;
    e->p[4] = g;
    e->p[5] = beta;
    e->i[0] = a_stride;
    e->i[1] = b_stride;
    e->i[2] = n;
    e->i[3] = H;
    e->i[4] = allow_neg;
    return HYLA_OK;
}

static hyla_status g_gated_rmsnorm(void *ctx, const float *o, const float *gt, const float *w, float *y, int rows,
                                   int D, float eps) {
    CTX;
    if (!LOGGING) return cu_gated_rmsnorm(ctx, o, gt, w, y, rows, D, eps);
    gent *e;
    HYLA_TRY(log_add(c->graphs, GOP_GATED_RMSNORM, 0, &e, NULL));
    e->p[0] = o;
    e->p[1] = gt;
    e->p[2] = w;
    e->p[3] = y;
    e->i[0] = rows;
    e->i[1] = D;
    e->f[0] = eps;
    return HYLA_OK;
}

static hyla_status g_rope(void *ctx, float *x, int n, int H, int D, const int32_t *pos, float theta) {
    CTX;
    if (!LOGGING) return cu_rope(ctx, x, n, H, D, pos, theta);
    if (n <= 0) return HYLA_OK;
    if (D % 2) return hyla_fail(HYLA_ERR_INVALID_ARG, "rope: head dim %d is odd", D);
    gent *e;
    void *d;
    HYLA_TRY(log_add(c->graphs, GOP_ROPE, (size_t)n * 4, &e, &d));
    e->p[0] = x;
    e->i[0] = n;
    e->i[1] = H;
    e->i[2] = D;
    e->f[0] = theta;
    memcpy(d, pos, (size_t)n * 4);
    return HYLA_OK;
}

static hyla_status g_short_conv(void *ctx, float *x, int B, int n, int C, const float *w, const float *bias, int K,
                                float *const *tails, int act_silu) {
    CTX;
    if (!LOGGING) return cu_short_conv(ctx, x, B, n, C, w, bias, K, tails, act_silu);
    if (B <= 0 || n <= 0) return HYLA_OK;
    if (K < 1) return hyla_fail(HYLA_ERR_INVALID_ARG, "short_conv: kernel size %d", K);
    gent *e;
    void *d;
    HYLA_TRY(log_add(c->graphs, GOP_SHORT_CONV, (size_t)B * sizeof(float *), &e, &d));
    e->p[0] = x;
    e->p[1] = w;
    e->p[2] = bias;
    e->i[0] = B;
    e->i[1] = n;
    e->i[2] = C;
    e->i[3] = K;
    e->i[4] = act_silu;
    memcpy(d, tails, (size_t)B * sizeof(float *));
    return HYLA_OK;
}

static hyla_status lin_decode(hyla_cuda_ctx *c, int gdn, const float *q, const float *k, const float *v,
                              const float *ga, const float *gb, int B, int H, int dk, int dv, float scale,
                              float *const *S, float *o) {
    if (B <= 0) return HYLA_OK;
    if (dk > 256) return hyla_fail(HYLA_ERR_UNSUPPORTED, "linear attention: key head dim %d > 256 is not supported on cuda", dk);
    if (H > 65535 || B > 65535) return hyla_fail(HYLA_ERR_UNSUPPORTED, "linear attention: H=%d B=%d", H, B);
    gent *e;
    void *d;
    HYLA_TRY(log_add(c->graphs, GOP_LIN_DECODE, (size_t)B * sizeof(float *), &e, &d));
    e->p[0] = q;
    e->p[1] = k;
    e->p[2] = v;
    e->p[3] = ga;
    e->p[4] = gb;
    e->p[5] = o;
    e->i[0] = gdn;
    e->i[1] = B;
    e->i[2] = H;
    e->i[3] = dk;
    e->i[4] = dv;
    e->i[5] = cu_states16(S, B);
    e->f[0] = scale;
    memcpy(d, S, (size_t)B * sizeof(float *));
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

static hyla_status g_sse_route(void *ctx, const float *logits, int n, int N, int K, int32_t *idx, float *w) {
    CTX;
    if (!LOGGING) return cu_sse_route(ctx, logits, n, N, K, idx, w);
    if (n <= 0) return HYLA_OK;
    if (K < 1 || K > N) return hyla_fail(HYLA_ERR_INVALID_ARG, "sse_route: top-%d of %d partitions", K, N);
    gent *e;
    HYLA_TRY(log_add(c->graphs, GOP_SSE_ROUTE, 0, &e, NULL));
    e->p[0] = logits;
    e->p[1] = idx;
    e->p[2] = w;
    e->i[0] = n;
    e->i[1] = N;
    e->i[2] = K;
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
    gent *e;
    void *d;
    HYLA_TRY(log_add(c->graphs, GOP_SSE_DECODE, (size_t)B * 2 * sizeof(float *), &e, &d));
    const void *ps[12] = {q1, k1, q2, k2, v, ga, gb, betaa, betab, idx, w, o};
    memcpy(e->p, ps, sizeof ps);
    e->i[0] = (int)tr;
    e->i[1] = B;
    e->i[2] = H;
    e->i[3] = dk;
    e->i[4] = dv;
    e->i[5] = N;
    e->i[6] = K;
    e->i[7] = cu_states16(S0, B) && cu_states16(Sp, B);
    e->f[0] = scale;
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
    gent *e;
    void *d;
    HYLA_TRY(log_add(c->graphs, GOP_ATTN_DECODE, bytes, &e, &d));
    e->p[0] = q;
    e->p[1] = k;
    e->p[2] = v;
    e->p[3] = o;
    e->i[0] = B;
    e->i[1] = Hq;
    e->i[2] = Hk;
    e->i[3] = D;
    e->i[4] = kv[0].page_tokens;
    e->i[5] = nsplit;
    e->i[6] = window;
    e->f[0] = scale;
    e->z[0] = cap;
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
    return g_elem(c, GOP_COPY, dst, src, NULL, bytes, 0, 0);
}

static hyla_status g_zero(void *ctx, void *dst, size_t bytes) {
    CTX;
    if (!bytes) return HYLA_OK;
    if (!LOGGING) {
        CU_TRY(cudaMemsetAsync(dst, 0, bytes, c->stream));
        return HYLA_OK;
    }
    return g_elem(c, GOP_ZERO, dst, NULL, NULL, bytes, 0, 0);
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
    return cu_download(ctx, host_dst, src, bytes);
}

static hyla_status f_sync(void *ctx) {
    FLUSH;
    return cu_sync(ctx);
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
    if (dk > 256 && !cu_linattn_chunked_ok(c, gdn, H, dk, dv, 1))
        return hyla_fail(HYLA_ERR_UNSUPPORTED, "linear attention: key head dim %d > 256 is not supported on cuda", dk);
    gent *e;
    void *d;
    HYLA_TRY(log_add(c->graphs, GOP_LIN_PREFILL, cu_lin_prefill1_block(n, S, NULL), &e, &d));
    e->p[0] = q;
    e->p[1] = k;
    e->p[2] = v;
    e->p[3] = ga;
    e->p[4] = gb;
    e->p[5] = o;
    e->i[0] = gdn;
    e->i[1] = n;
    e->i[2] = H;
    e->i[3] = dk;
    e->i[4] = dv;
    e->i[5] = ((uintptr_t)S & 15) == 0;
    e->f[0] = scale;
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
 * (token-loop mode, N > 64) syncs, so that path flushes and runs at once. */
static hyla_status g_sse_prefill(void *ctx, hyla_sse_transition tr, const float *q1, const float *k1, const float *q2,
                                 const float *k2, const float *v, const float *ga, const float *gb,
                                 const float *betaa, const float *betab, const int32_t *idx, const float *w, int n,
                                 int H, int dk, int dv, int N, int K, float scale, float *S0, float *Sp, float *o) {
    CTX;
    if (n <= 0) return HYLA_OK;
    if (K < 1 || K > N) return hyla_fail(HYLA_ERR_INVALID_ARG, "sse_prefill: top-%d of %d partitions", K, N);
    if (!LOGGING || c->prefill_mode != 0 || c->sse_host_plan || !cu_sse_prefill_planned(c, tr, H, dk, dv, N, K)) {
        FLUSH;
        return cu_sse_prefill(ctx, tr, q1, k1, q2, k2, v, ga, gb, betaa, betab, idx, w, n, H, dk, dv, N, K, scale, S0,
                              Sp, o);
    }
    gent *e;
    HYLA_TRY(log_add(c->graphs, GOP_SSE_PREFILL, 0, &e, NULL));
    const void *ps[14] = {q1, k1, q2, k2, v, ga, gb, betaa, betab, idx, w, o, S0, Sp};
    memcpy(e->p, ps, sizeof ps);
    e->i[0] = (int)tr;
    e->i[1] = n;
    e->i[2] = H;
    e->i[3] = dk;
    e->i[4] = dv;
    e->i[5] = N;
    e->i[6] = K;
    e->i[7] = c->sse_windows;
    e->f[0] = scale;
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
    gent *e;
    HYLA_TRY(log_add(c->graphs, GOP_COPY2D, 0, &e, NULL));
    e->p[0] = dst;
    e->p[1] = src;
    e->i[0] = ldd;
    e->i[1] = lds;
    e->i[2] = rows;
    e->i[3] = cols;
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
    gent *e;
    void *d;
    HYLA_TRY(log_add(c->graphs, GOP_SSD_DECODE, (size_t)B * sizeof(float *), &e, &d));
    e->p[0] = xbc;
    e->p[1] = dt;
    e->p[2] = dt_bias;
    e->p[3] = A_log;
    e->p[4] = Dskip;
    e->p[5] = y;
    e->i[0] = ldx;
    e->i[1] = ld_dt;
    e->i[2] = B;
    e->i[3] = H;
    e->i[4] = P;
    e->i[5] = G;
    e->i[6] = N;
    e->f[0] = dt_min;
    e->f[1] = dt_max;
    memcpy(d, S, (size_t)B * sizeof(float *));
    return HYLA_OK;
}

static hyla_status g_ssd_norm(void *ctx, const float *o, const float *z, int ldz, const float *w, float *y, int rows,
                              int G, int gs, float eps) {
    CTX;
    if (!LOGGING) return cu_ssd_norm(ctx, o, z, ldz, w, y, rows, G, gs, eps);
    HYLA_TRY(cu_ssd_norm_check(ldz, rows, G, gs));
    if (rows == 0) return HYLA_OK;
    gent *e;
    HYLA_TRY(log_add(c->graphs, GOP_SSD_NORM, 0, &e, NULL));
    e->p[0] = o;
    e->p[1] = z;
    e->p[2] = w;
    e->p[3] = y;
    e->i[0] = ldz;
    e->i[1] = rows;
    e->i[2] = G;
    e->i[3] = gs;
    e->f[0] = eps;
    return HYLA_OK;
}

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
    /* Mamba2 (SSD) */
    g_copy2d,
    f_ssd_prefill,
    g_ssd_decode,
    g_ssd_norm,
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

extern "C" hyla_status hyla_cuda_get_graph_stats(hyla_backend *be, hyla_cuda_graph_stats *out) {
    hyla_cuda_ctx *c = graph_ctx(be);
    memset(out, 0, sizeof *out);
    if (!c) return hyla_fail(HYLA_ERR_INVALID_ARG, "hyla_cuda_get_graph_stats: not a cuda backend");
    if (!c->graphs) return HYLA_OK;
    *out = c->graphs->st;
    out->cached = 0;
    for (int i = 0; i < GCACHE; i++) out->cached += c->graphs->cache[i].exec != NULL;
    return HYLA_OK;
}
