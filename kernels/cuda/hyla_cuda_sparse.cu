/* hyla_cuda_sparse.cu — the LTE ops (learnable token eviction, docs/MODELS.md §5.1, [LTE-1..5])
 * and the NSA ops (native sparse attention, §5.2, [NSA-1..4]) on the GPU. Correctness-first
 * ports of the CPU reference (kernels/cpu/cpu_lte.c, cpu_nsa.c); no tensor cores yet.
 *
 * LTE. The cache k, v rows are bf16 (ops->kv_dtype); everything else is fp32 as on the CPU.
 *   - Scoring (the CNN) runs one thread per output value with the CPU's summation order
 *     (bias, taps, channels), every product and sum rounded on its own (__fmul_rn/__fadd_rn:
 *     no FMA contraction), the Swish's and the sigmoid's exponentials in double and rounded once,
 *     and the un-rotation of the keys in double as the CPU does. Given the same cached k, v the
 *     scores are therefore the CPU's bits, up to the libm-vs-CUDA accuracy of double exp, pow,
 *     sin and cos (a float result can differ only when the double value lies within a few
 *     double ulps of a float rounding boundary), so the retained members and their order are
 *     the CPU's. Ties and the 0.5 threshold are decided by the same comparisons: kept when
 *     r > 0.5, the victim is the lowest score with the oldest position among equal scores,
 *     replaced only when the newcomer scores strictly higher.
 *   - meta[0] (tokens cached) and meta[1] (the next position to score) are functions of the
 *     position alone (lte_next_scored); the host derives them instead of reading the device,
 *     so no op waits for the GPU. The kernels still write them, so the bytes equal the CPU's.
 *     The CUDA ops therefore trust the caller that meta[0] equals the position (the mixer
 *     guarantees it) instead of checking it as the CPU does.
 *   - Per token: lazy scoring (when due) → the fused eviction/replacement/insert kernel (one
 *     block per (session, KV head)) → attention over sink ∪ retained ∪ window (one block per
 *     (session, query head); the scores of the visible rows in shared memory). Prefill runs
 *     these per token in order (the cache changes after every token), so prefill == decode
 *     bit for bit.
 * NSA. The paged KV cache is bf16 as attention's. The compressed blocks (the mean of each
 *   complete block, summed in the CPU's order, fp32) live in the view's derived cache: a call
 *   fills only the blocks its tokens complete (one thread block per (session, block, KV head)),
 *   so a decode step reads the compressed rows, the selected blocks and the window of the KV
 *   and nothing else (a view without a cache gets all its blocks derived into scratch); then
 *   one block per (token, KV head) runs the query group's compressed attention
 *   (logits and the double normaliser summed in the CPU's order, so the block selection is the
 *   CPU's up to exp's accuracy), the selection (ties to the lower block index), and the
 *   selected and window attentions, gated. Prefill and decode run the same kernels.
 * Threading: one thread drives one context (hyla_ops.h); every launch is on c->stream. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_cuda_impl.h"

#define SP_THREADS 128
#define NSA_MAX_COUNTS 256

/* ------------------------------------------------------------------ LTE */

struct lte_dev_cache {
    __nv_bfloat16 *k, *v; /* [Hk][R][D] */
    float *r;             /* [Hk][R] */
    int32_t *rpos;        /* [Hk][b] */
    int32_t *meta;        /* [2 + Hk] */
};

struct lte_geo {
    int Hk, D, s, w, b, R;
};

static int lte_half(const hyla_lte_params *p) { return p->n_conv * (p->kernel - 1) / 2 * p->dilation; }

static lte_geo lte_geometry(const hyla_lte_params *p) {
    lte_geo g = {p->Hk, p->D, p->sink, p->window, p->budget, p->sink + p->window + p->budget};
    return g;
}

static int lte_maxch(const hyla_lte_params *p) {
    int m = 0;
    for (int l = 0; l <= p->n_conv; l++)
        if (p->ch[l] > m) m = p->ch[l];
    return m;
}

static hyla_status lte_check(const char *op, const hyla_lte_params *p) {
    int bad = p->Hk <= 0 || p->D <= 0 || p->D % 2 || p->sink < 0 || p->budget < 0 || p->n_conv < 1 ||
              p->n_conv > HYLA_LTE_MAX_CONV || p->kernel < 1 || p->kernel % 2 == 0 || p->dilation < 1 ||
              p->ch[0] != 2 * p->D;
    for (int l = 1; !bad && l <= p->n_conv; l++) bad = p->ch[l] <= 0 || !p->conv_w[l - 1] || !p->conv_b[l - 1];
    if (bad || !p->proj_w || !p->proj_b)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "%s: bad LTE parameters (Hk=%d D=%d convs=%d kernel=%d dilation=%d)", op,
                         p->Hk, p->D, p->n_conv, p->kernel, p->dilation);
    if (p->window < 2 * lte_half(p) + 1)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "%s: window %d is shorter than the receptive field %d", op, p->window,
                         2 * lte_half(p) + 1);
    /* the attention keeps the visible rows' scores in shared memory */
    if ((size_t)(p->sink + p->window + p->budget) * sizeof(float) > 40 * 1024)
        return hyla_fail(HYLA_ERR_UNSUPPORTED, "%s: %d cache rows (sink + window + budget) exceed the CUDA kernel's %d",
                         op, p->sink + p->window + p->budget, 10240);
    return HYLA_OK;
}

/* meta[1] once the cache holds N tokens: the insert rule of cpu_lte.c (lazy: a batch is scored
 * when the position leaving the window is still needed as context; eager: every complete
 * position at once) as a function of N. */
static int lte_next_scored(const hyla_lte_params *p, int N) {
    int s = p->sink, w = p->window, h = lte_half(p);
    if (p->eager) return N - 1 - h >= s ? N - h : s;
    /* lazy: the first batch is due at t = s + w, then every w - 2h tokens (lte_check: > 0) */
    if (N <= s + w) return s;
    int d = w - 2 * h, k = (N - 1 - (s + w)) / d;
    return s + w + k * d - h;
}

__device__ __forceinline__ float lte_silu(float x) {
    return __fdiv_rn(x, __fadd_rn(1.0f, (float)exp(-(double)x))); /* x / (1 + expf(-x)), rounded once */
}

__device__ __forceinline__ int lte_pos_row(const lte_geo g, int pos) { return pos < g.s ? pos : g.s + (pos - g.s) % g.w; }

/* [LTE-2] one conv layer: out rows [nlo, nhi) of [T][Hk][cout] from in [T][Hk][cin]. */
__global__ void k_lte_conv(const float *in, int cin, float *out, int cout, const float *W, const float *Bv, int Hk,
                           int K, int dil, int nlo, int nhi, int x0) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)(nhi - nlo) * Hk * cout) return;
    int o = (int)(i % cout);
    long long r = i / cout;
    int h = (int)(r % Hk), t = nlo + (int)(r / Hk), c = (K - 1) / 2;
    float *y = out + ((size_t)t * Hk + h) * cout + o;
    if (x0 + t < 0) {
        *y = 0.0f;
        return;
    }
    const float *w = W + ((size_t)(h * cout + o) * cin) * K;
    float acc = Bv[h * cout + o];
    for (int tap = 0; tap < K; tap++) {
        int ts = t + (tap - c) * dil;
        if (x0 + ts < 0) continue;
        const float *xi = in + ((size_t)ts * Hk + h) * cin;
        for (int j = 0; j < cin; j++) acc = __fadd_rn(acc, __fmul_rn(w[(size_t)j * K + tap], xi[j]));
    }
    *y = lte_silu(acc);
}

/* [LTE-2] the per-head projection and sigmoid: r [(t - lo)][Hk] for rows [lo, hi). */
__global__ void k_lte_proj(const float *in, int cin, const float *pw, const float *pb, int Hk, int lo, int hi,
                           float *r) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (hi - lo) * Hk) return;
    int h = i % Hk, t = lo + i / Hk;
    const float *xi = in + ((size_t)t * Hk + h) * cin;
    float acc = pb[h];
    for (int j = 0; j < cin; j++) acc = __fadd_rn(acc, __fmul_rn(pw[(size_t)h * cin + j], xi[j]));
    r[(size_t)(t - lo) * Hk + h] = (float)(1.0 / (1.0 + exp(-(double)acc)));
}

static unsigned blocks_for(long long n) { return (unsigned)((n + SP_THREADS - 1) / SP_THREADS); }

/* The CNN over x [T][Hk][2D] (positions x0..) into r [T-2h][Hk]; a, b: [T][Hk][maxch] each. */
static hyla_status lte_cnn(hyla_cuda_ctx *c, const hyla_lte_params *p, const float *x, int T, int x0, float *r,
                           float *a, float *b) {
    int Hk = p->Hk, K = p->kernel, dil = p->dilation, cc = (K - 1) / 2, lo = 0, hi = T, cin = p->ch[0];
    const float *in = x;
    for (int l = 0; l < p->n_conv; l++) {
        int cout = p->ch[l + 1], nlo = lo + cc * dil, nhi = hi - cc * dil;
        float *out = (l % 2 == 0) ? a : b;
        long long n = (long long)(nhi - nlo) * Hk * cout;
        k_lte_conv<<<blocks_for(n), SP_THREADS, 0, c->stream>>>(in, cin, out, cout, p->conv_w[l], p->conv_b[l], Hk, K,
                                                                 dil, nlo, nhi, x0);
        CU_LAUNCH_CHECK("lte_conv");
        in = out;
        cin = cout;
        lo = nlo;
        hi = nhi;
    }
    k_lte_proj<<<blocks_for((long long)(hi - lo) * Hk), SP_THREADS, 0, c->stream>>>(in, cin, p->proj_w, p->proj_b, Hk,
                                                                                    lo, hi, r);
    CU_LAUNCH_CHECK("lte_proj");
    return HYLA_OK;
}

static size_t cnn_floats(const hyla_lte_params *p, int T) { return 2 * (size_t)T * p->Hk * lte_maxch(p); }

extern "C" hyla_status cu_lte_score(void *ctx, const hyla_lte_params *p, const float *x, int T, int x0, float *r) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    HYLA_TRY(lte_check("lte_score", p));
    int h = lte_half(p);
    if (T < 2 * h + 1) return hyla_fail(HYLA_ERR_INVALID_ARG, "lte_score: %d rows, the receptive field needs %d", T, 2 * h + 1);
    void *mem;
    HYLA_TRY(cu_scratch(c, SCR_ATTN, cnn_floats(p, T) * sizeof(float), &mem));
    float *a = (float *)mem;
    return lte_cnn(c, p, x, T, x0, r, a, a + (size_t)T * p->Hk * lte_maxch(p));
}

/* [LTE-1] gather the un-rotated keys and the values of positions lo-h .. lo-h+T-1 from the
 * cache into x [T][Hk][2D] (negative positions: zero). */
__global__ void k_lte_gather(const lte_dev_cache *cs, int ci, lte_geo g, int x0, int T, float theta, float *x) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    int D = g.D, half = D / 2;
    if (i >= (long long)T * g.Hk * D) return;
    int j = (int)(i % D);
    long long rr = i / D;
    int kh = (int)(rr % g.Hk), t = (int)(rr / g.Hk), pos = x0 + t;
    float *xk = x + ((size_t)t * g.Hk + kh) * 2 * D;
    if (pos < 0) {
        xk[j] = 0.0f;
        xk[D + j] = 0.0f;
        return;
    }
    lte_dev_cache c = cs[ci];
    size_t row = ((size_t)kh * g.R + lte_pos_row(g, pos)) * D;
    xk[D + j] = __bfloat162float(c.v[row + j]);
    if (j < half) {
        double ang = (double)pos * pow((double)theta, -2.0 * j / D);
        double cs_ = cos(ang), sn = sin(ang);
        double k0 = __bfloat162float(c.k[row + j]), k1 = __bfloat162float(c.k[row + j + half]);
        xk[j] = (float)__dadd_rn(__dmul_rn(k0, cs_), __dmul_rn(k1, sn));
        xk[j + half] = (float)__dsub_rn(__dmul_rn(k1, cs_), __dmul_rn(k0, sn));
    }
}

__global__ void k_lte_scatter(const lte_dev_cache *cs, int ci, lte_geo g, int lo, int hi, const float *r) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (hi - lo + 1) * g.Hk) return;
    int kh = i % g.Hk, t = lo + i / g.Hk;
    cs[ci].r[(size_t)kh * g.R + lte_pos_row(g, t)] = r[i];
}

/* Score positions [lo, hi] of cache ci (of the device array cs) from its rows [lo-h, hi+h]. */
static hyla_status lte_score_range(hyla_cuda_ctx *c, const hyla_lte_params *p, const lte_dev_cache *cs, int ci, int lo,
                                   int hi) {
    lte_geo g = lte_geometry(p);
    int h = lte_half(p), T = hi - lo + 1 + 2 * h;
    size_t nx = (size_t)T * p->Hk * p->ch[0], na = (size_t)T * p->Hk * lte_maxch(p);
    void *mem;
    HYLA_TRY(cu_scratch(c, SCR_ATTN, (nx + 2 * na + (size_t)T * p->Hk) * sizeof(float), &mem));
    float *x = (float *)mem, *a = x + nx, *b = a + na, *r = b + na;
    k_lte_gather<<<blocks_for((long long)T * p->Hk * p->D), SP_THREADS, 0, c->stream>>>(cs, ci, g, lo - h, T,
                                                                                         p->rope_theta, x);
    CU_LAUNCH_CHECK("lte_gather");
    HYLA_TRY(lte_cnn(c, p, x, T, lo - h, r, a, b));
    k_lte_scatter<<<blocks_for((long long)(hi - lo + 1) * p->Hk), SP_THREADS, 0, c->stream>>>(cs, ci, g, lo, hi, r);
    CU_LAUNCH_CHECK("lte_scatter");
    return HYLA_OK;
}

/* [LTE-3, LTE-4] Insert the token of session b at pos[b] (k, v [B][Hk][D] fp32): the position
 * leaving the ring is kept or dropped, then the new row is written. One block per (b, head). */
__global__ void k_lte_insert(const lte_dev_cache *cs, lte_geo g, const int32_t *pos, int pos_add, const int32_t *m1,
                             int m1_add, const float *k, const float *v, int krow0) {
    int b = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
    lte_dev_cache c = cs[pos ? b : 0];
    int t = (pos ? pos[b] : 0) + pos_add, D = g.D, base = g.s + g.w;
    __shared__ float s_sc[SP_THREADS];
    __shared__ int s_ix[SP_THREADS];
    __shared__ int s_slot;
    if (t >= g.s + g.w) {
        int e = t - g.w, row = lte_pos_row(g, e);
        float r = c.r[(size_t)h * g.R + row];
        int n = c.meta[2 + h];
        __syncthreads(); /* every thread has read r and n before thread 0 may write them */
        if (r > 0.5f) {
            int32_t *rp = c.rpos + (size_t)h * g.b;
            const float *seg = c.r + (size_t)h * g.R + base;
            if (n < g.b) {
                if (tid == 0) s_slot = n;
            } else if (g.b > 0) {
                /* the lowest score, the oldest position among equals */
                int best = -1;
                for (int i = tid; i < g.b; i += blockDim.x)
                    if (best < 0 || seg[i] < seg[best] || (seg[i] == seg[best] && rp[i] < rp[best])) best = i;
                s_ix[tid] = best;
                s_sc[tid] = best >= 0 ? seg[best] : 0.0f;
                __syncthreads();
                for (int st = blockDim.x / 2; st > 0; st >>= 1) {
                    if (tid < st) {
                        int o = s_ix[tid + st], me = s_ix[tid];
                        if (o >= 0 && (me < 0 || s_sc[tid + st] < s_sc[tid] ||
                                       (s_sc[tid + st] == s_sc[tid] && rp[o] < rp[me]))) {
                            s_ix[tid] = o;
                            s_sc[tid] = s_sc[tid + st];
                        }
                    }
                    __syncthreads();
                }
                if (tid == 0) s_slot = r > s_sc[0] ? s_ix[0] : -1;
            } else if (tid == 0) {
                s_slot = -1;
            }
            __syncthreads();
            int slot = s_slot;
            if (slot >= 0) {
                size_t src = ((size_t)h * g.R + row) * D, dst = ((size_t)h * g.R + base + slot) * D;
                for (int x = tid; x < D; x += blockDim.x) c.k[dst + x] = c.k[src + x], c.v[dst + x] = c.v[src + x];
                if (tid == 0) {
                    c.r[(size_t)h * g.R + base + slot] = r;
                    rp[slot] = e;
                    if (n < g.b) c.meta[2 + h] = n + 1;
                }
            }
            __syncthreads();
        }
    }
    int row = lte_pos_row(g, t);
    size_t dst = ((size_t)h * g.R + row) * D, src = ((size_t)(krow0 + b) * g.Hk + h) * D;
    for (int x = tid; x < D; x += blockDim.x) {
        c.k[dst + x] = __float2bfloat16_rn(k[src + x]);
        c.v[dst + x] = __float2bfloat16_rn(v[src + x]);
    }
    if (tid == 0) {
        c.r[(size_t)h * g.R + row] = 0.0f;
        if (h == 0) {
            c.meta[0] = t + 1;
            c.meta[1] = (m1 ? m1[b] : 0) + m1_add;
        }
    }
}

__device__ float block_max(float v, float *red) {
    int tid = threadIdx.x;
    red[tid] = v;
    __syncthreads();
    for (int st = blockDim.x / 2; st > 0; st >>= 1) {
        if (tid < st) red[tid] = fmaxf(red[tid], red[tid + st]);
        __syncthreads();
    }
    float r = red[0];
    __syncthreads();
    return r;
}

__device__ float block_sum(float v, float *red) {
    int tid = threadIdx.x;
    red[tid] = v;
    __syncthreads();
    for (int st = blockDim.x / 2; st > 0; st >>= 1) {
        if (tid < st) red[tid] += red[tid + st];
        __syncthreads();
    }
    float r = red[0];
    __syncthreads();
    return r;
}

/* [LTE-5] o [B][Hq][D] (rows qrow0 + b) = attention of each query over the visible rows of its
 * KV head: the sink, the retained segment by slot, the window oldest first. One block per
 * (b, query head); dynamic shared memory: the scores [R] and q [D]. */
__global__ void k_lte_attend(const lte_dev_cache *cs, lte_geo g, const int32_t *pos, int pos_add, const float *q,
                             int Hq, int qrow0, float scale, float *o) {
    extern __shared__ float sm[];
    __shared__ float red[SP_THREADS];
    int b = blockIdx.x, qh = blockIdx.y, tid = threadIdx.x, D = g.D;
    int kh = qh / (Hq / g.Hk);
    lte_dev_cache c = cs[pos ? b : 0];
    int N = (pos ? pos[b] : 0) + pos_add + 1;
    float *sc = sm, *qs = sm + g.R;
    const float *qr = q + ((size_t)(qrow0 + b) * Hq + qh) * D;
    for (int x = tid; x < D; x += blockDim.x) qs[x] = qr[x];
    int ns = N < g.s ? N : g.s, nr = c.meta[2 + kh], lo = N - g.w > g.s ? N - g.w : g.s;
    int n = ns + nr + (N > lo ? N - lo : 0), base = g.s + g.w;
    __syncthreads();
    const __nv_bfloat16 *K = c.k + (size_t)kh * g.R * D, *V = c.v + (size_t)kh * g.R * D;
    float m = -INFINITY;
    for (int j = tid; j < n; j += blockDim.x) {
        int rw = j < ns ? j : j < ns + nr ? base + (j - ns) : lte_pos_row(g, lo + (j - ns - nr));
        const __nv_bfloat16 *kr = K + (size_t)rw * D;
        float d = 0.0f;
        for (int x = 0; x < D; x++) d += qs[x] * __bfloat162float(kr[x]);
        sc[j] = d * scale;
        m = fmaxf(m, sc[j]);
    }
    m = block_max(m, red);
    float part = 0.0f;
    for (int j = tid; j < n; j += blockDim.x) part += (sc[j] = expf(sc[j] - m));
    float inv = 1.0f / block_sum(part, red);
    for (int x = tid; x < D; x += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < n; j++) {
            int rw = j < ns ? j : j < ns + nr ? base + (j - ns) : lte_pos_row(g, lo + (j - ns - nr));
            acc += sc[j] * __bfloat162float(V[(size_t)rw * D + x]);
        }
        o[((size_t)(qrow0 + b) * Hq + qh) * D + x] = acc * inv;
    }
}

static hyla_status lte_stage_caches(hyla_cuda_ctx *c, const hyla_lte_cache *cs, int B, lte_dev_cache **out) {
    lte_dev_cache *h = (lte_dev_cache *)malloc((size_t)B * sizeof *h);
    if (!h) return hyla_fail(HYLA_ERR_RESOURCE, "lte: out of host memory for %d caches", B);
    for (int b = 0; b < B; b++) {
        if (!cs[b].k || !cs[b].v || !cs[b].r || !cs[b].rpos || !cs[b].meta) {
            free(h);
            return hyla_fail(HYLA_ERR_INVALID_ARG, "lte: cache %d is incomplete", b);
        }
        h[b] = lte_dev_cache{(__nv_bfloat16 *)cs[b].k, (__nv_bfloat16 *)cs[b].v, cs[b].r, cs[b].rpos, cs[b].meta};
    }
    void *d;
    hyla_status st = cu_stage(c, h, (size_t)B * sizeof *h, &d);
    free(h);
    *out = (lte_dev_cache *)d;
    return st;
}

static size_t lte_attend_smem(const hyla_lte_params *p) {
    return ((size_t)p->sink + p->window + p->budget + p->D) * sizeof(float);
}

extern "C" hyla_status cu_lte_prefill(void *ctx, const hyla_lte_params *p, const float *q, const float *k,
                                      const float *v, int n, int Hq, int pos0, const hyla_lte_cache *cache,
                                      float scale, float *o) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    HYLA_TRY(lte_check("lte_prefill", p));
    if (n < 0 || Hq <= 0 || Hq % p->Hk || pos0 < 0)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "lte_prefill: n=%d Hq=%d Hk=%d pos0=%d", n, Hq, p->Hk, pos0);
    if (n == 0) return HYLA_OK;
    lte_dev_cache *dc;
    HYLA_TRY(lte_stage_caches(c, cache, 1, &dc));
    lte_geo g = lte_geometry(p);
    int h = lte_half(p);
    size_t smem = lte_attend_smem(p);
    for (int i = 0; i < n; i++) {
        int t = pos0 + i, m = lte_next_scored(p, t), m_after = lte_next_scored(p, t + 1);
        if (!p->eager && t >= p->sink + p->window && m <= t - p->window + h) HYLA_TRY(lte_score_range(c, p, dc, 0, m, t - 1 - h));
        k_lte_insert<<<dim3(1, p->Hk), SP_THREADS, 0, c->stream>>>(dc, g, NULL, t, NULL, m_after, k, v, i);
        CU_LAUNCH_CHECK("lte_insert");
        if (p->eager && t - h >= m) HYLA_TRY(lte_score_range(c, p, dc, 0, m, t - h));
        k_lte_attend<<<dim3(1, Hq), SP_THREADS, smem, c->stream>>>(dc, g, NULL, t, q, Hq, i, scale, o);
        CU_LAUNCH_CHECK("lte_attend");
    }
    return HYLA_OK;
}

extern "C" hyla_status cu_lte_decode(void *ctx, const hyla_lte_params *p, const float *q, const float *k,
                                     const float *v, int B, int Hq, const int32_t *pos, const hyla_lte_cache *cache,
                                     float scale, float *o) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    HYLA_TRY(lte_check("lte_decode", p));
    if (B < 0 || Hq <= 0 || Hq % p->Hk) return hyla_fail(HYLA_ERR_INVALID_ARG, "lte_decode: B=%d Hq=%d Hk=%d", B, Hq, p->Hk);
    if (B == 0) return HYLA_OK;
    int h = lte_half(p);
    int32_t *hm = (int32_t *)malloc((size_t)B * sizeof *hm);
    if (!hm) return hyla_fail(HYLA_ERR_RESOURCE, "lte_decode: out of host memory");
    for (int b = 0; b < B; b++) {
        if (pos[b] < 0) {
            free(hm);
            return hyla_fail(HYLA_ERR_INVALID_ARG, "lte_decode: session %d at position %d", b, (int)pos[b]);
        }
        hm[b] = lte_next_scored(p, pos[b] + 1);
    }
    lte_dev_cache *dc;
    void *dpos, *dm;
    hyla_status st = cu_stage_reserve(c, (size_t)B * (sizeof(lte_dev_cache) + 2 * sizeof(int32_t)) + 3 * 256, 3);
    if (st == HYLA_OK) st = lte_stage_caches(c, cache, B, &dc);
    if (st == HYLA_OK) st = cu_stage(c, pos, (size_t)B * sizeof(int32_t), &dpos);
    if (st == HYLA_OK) st = cu_stage(c, hm, (size_t)B * sizeof(int32_t), &dm);
    free(hm);
    HYLA_TRY(st);
    lte_geo g = lte_geometry(p);
    /* lazy scoring of the sessions whose batch is due (before their eviction) */
    for (int b = 0; b < B && !p->eager; b++) {
        int t = pos[b], m = lte_next_scored(p, t);
        if (t >= p->sink + p->window && m <= t - p->window + h) HYLA_TRY(lte_score_range(c, p, dc, b, m, t - 1 - h));
    }
    k_lte_insert<<<dim3(B, p->Hk), SP_THREADS, 0, c->stream>>>(dc, g, (const int32_t *)dpos, 0, (const int32_t *)dm, 0,
                                                              k, v, 0);
    CU_LAUNCH_CHECK("lte_insert");
    for (int b = 0; b < B && p->eager; b++) {
        int t = pos[b], m = lte_next_scored(p, t);
        if (t - h >= m) HYLA_TRY(lte_score_range(c, p, dc, b, m, t - h));
    }
    k_lte_attend<<<dim3(B, Hq), SP_THREADS, lte_attend_smem(p), c->stream>>>(dc, g, (const int32_t *)dpos, 0, q, Hq, 0,
                                                                            scale, o);
    CU_LAUNCH_CHECK("lte_attend");
    return HYLA_OK;
}

/* ------------------------------------------------------------------ NSA */

/* The page tables of the calls' sessions: session z's k pages at ptr[off[z]], v pages at
 * ptr[off[z] + n_pages[z]]; its page size in pt[z]. */
struct nsa_tab {
    void *const *ptr;
    const int32_t *off, *pt;
    const int32_t *pos;  /* decode: [B] positions; prefill: NULL (token i at pos0 + i, session 0) */
    /* the compressed blocks of session z: block c's row [2][Hk][D] fp32 (mean k, then mean v)
     * is row c % cpt[z] of page cptr[cpoff[z] + c / cpt[z]]; rows < cvalid[z] hold their values
     * already, rows cvalid[z]..nc[z]-1 are filled by k_nsa_compress */
    void *const *cptr;
    const int32_t *cpoff, *cpt, *cvalid, *nc;
    int pos0;
};

__device__ __forceinline__ int nsa_sess(const nsa_tab &t, int i) { return t.pos ? i : 0; }
__device__ __forceinline__ int nsa_pos(const nsa_tab &t, int i) { return t.pos ? t.pos[i] : t.pos0 + i; }

__device__ __forceinline__ __nv_bfloat16 *nsa_row(const nsa_tab &t, int z, int isv, int pos, int Hk, int D, int h) {
    int pt = t.pt[z], off = t.off[z];
    /* the v table follows the k table; each holds (off[z + 1] - off[z]) / 2 pages */
    int npages = (t.off[z + 1] - off) / 2;
    __nv_bfloat16 *page = (__nv_bfloat16 *)t.ptr[off + isv * npages + pos / pt];
    return page + ((size_t)(pos % pt) * Hk + h) * D;
}

__device__ __forceinline__ float *nsa_crow(const nsa_tab &t, int z, int c, int isv, int Hk, int D, int h) {
    int cpt = t.cpt[z];
    float *page = (float *)t.cptr[t.cpoff[z] + c / cpt];
    return page + (((size_t)(c % cpt) * 2 + isv) * Hk + h) * D;
}

/* Write token i's k, v ([n][Hk][D] fp32) into its cache row (bf16). */
__global__ void k_nsa_put(nsa_tab t, const float *k, const float *v, int Hk, int D) {
    int i = blockIdx.x, z = nsa_sess(t, i), p = nsa_pos(t, i);
    for (int e = threadIdx.x; e < Hk * D; e += blockDim.x) {
        nsa_row(t, z, 0, p, Hk, D, 0)[e] = __float2bfloat16_rn(k[(size_t)i * Hk * D + e]);
        nsa_row(t, z, 1, p, Hk, D, 0)[e] = __float2bfloat16_rn(v[(size_t)i * Hk * D + e]);
    }
}

/* [NSA-1] compressed block cvalid[z] + blockIdx.x of session z, head h: the mean of its keys
 * and values, summed in order, into its cache row. grid (new blocks, sessions, Hk). */
__global__ void k_nsa_compress(nsa_tab t, int Hk, int D, int BS) {
    int z = blockIdx.y, c = t.cvalid[z] + blockIdx.x, h = blockIdx.z;
    if (c >= t.nc[z]) return;
    float *kc = nsa_crow(t, z, c, 0, Hk, D, h), *vc = nsa_crow(t, z, c, 1, Hk, D, h);
    for (int x = threadIdx.x; x < D; x += blockDim.x) {
        float sk = 0.0f, sv = 0.0f;
        for (int j = c * BS; j < (c + 1) * BS; j++) {
            sk = __fadd_rn(sk, __bfloat162float(nsa_row(t, z, 0, j, Hk, D, h)[x]));
            sv = __fadd_rn(sv, __bfloat162float(nsa_row(t, z, 1, j, Hk, D, h)[x]));
        }
        kc[x] = __fdiv_rn(sk, (float)BS);
        vc[x] = __fdiv_rn(sv, (float)BS);
    }
}

/* Softmax attention of q (shared, [D]) over nk keys of session z, head h at positions given by
 * key_pos (selected blocks or the window): out (shared [D]). sc: global scratch [nk]. */
__device__ void nsa_attend(const nsa_tab &t, int z, int h, int Hk, int D, const float *qs, int nk, const int *sel,
                           int nsel, int BS, int p, int wlo, float scale, float *sc, float *red, float *out) {
    int tid = threadIdx.x;
    if (nk == 0) {
        for (int x = tid; x < D; x += blockDim.x) out[x] = 0.0f;
        __syncthreads();
        return;
    }
    float m = -INFINITY;
    for (int j = tid; j < nk; j += blockDim.x) {
        int kp = sel ? sel[j / BS] * BS + j % BS : wlo + j;
        const __nv_bfloat16 *kr = nsa_row(t, z, 0, kp, Hk, D, h);
        float d = 0.0f;
        for (int x = 0; x < D; x++) d += qs[x] * __bfloat162float(kr[x]);
        sc[j] = d * scale;
        m = fmaxf(m, sc[j]);
    }
    m = block_max(m, red);
    float part = 0.0f;
    for (int j = tid; j < nk; j += blockDim.x) part += (sc[j] = expf(sc[j] - m));
    float inv = 1.0f / block_sum(part, red);
    for (int x = tid; x < D; x += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < nk; j++) {
            int kp = sel ? sel[j / BS] * BS + j % BS : wlo + j;
            acc += sc[j] * __bfloat162float(nsa_row(t, z, 1, kp, Hk, D, h)[x]);
        }
        out[x] = acc * inv;
    }
    __syncthreads();
    (void)nsel;
    (void)p;
}

/* [NSA-1..4] one (token, KV head) task: grid (tokens, Hk). scratch: per task `per` floats
 * (probs [G][nbmax], score [nbmax], keys [kmax]). Dynamic shared: q, oc, os, ow [D] each. */
__global__ void k_nsa_task(nsa_tab t, const float *q, const float *g, int Hq, int Hk, int D, int BS, int counts,
                           int window, float scale, float *scratch, size_t per,
                           float *o) {
    extern __shared__ float sm[];
    __shared__ float red[SP_THREADS];
    __shared__ int sel[NSA_MAX_COUNTS];
    __shared__ float s_bv[SP_THREADS];
    __shared__ int s_bi[SP_THREADS];
    __shared__ double s_sum;
    int i = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, z = nsa_sess(t, i), p = nsa_pos(t, i);
    int G = Hq / Hk, nc = (p + 1) / BS, nb = p / BS + 1, cur = p / BS;
    float *qs = sm, *os = sm + D, *ow = sm + 2 * D;
    float *mem = scratch + ((size_t)i * Hk + h) * per;
    float *score = mem, *probs = mem + nb, *sc = probs + (size_t)G * nb;
    size_t qo = (size_t)i * Hq + (size_t)h * G;
    for (int c = tid; c < nb; c += blockDim.x) score[c] = 0.0f;
    __syncthreads();
    /* [NSA-2] compressed attention per query of the group (the CPU's order throughout) */
    for (int gi = 0; gi < G; gi++) {
        const float *qi = q + (qo + gi) * D;
        float *pr = probs + (size_t)gi * nb;
        for (int c = tid; c < nc; c += blockDim.x) {
            const float *kr = nsa_crow(t, z, c, 0, Hk, D, h);
            float s = 0.0f;
            for (int x = 0; x < D; x++) s = __fadd_rn(s, __fmul_rn(qi[x], kr[x]));
            pr[c] = __fmul_rn(s, scale);
        }
        __syncthreads();
        if (tid == 0) {
            float m = -INFINITY;
            for (int c = 0; c < nc; c++)
                if (pr[c] > m) m = pr[c];
            double sum = 0;
            for (int c = 0; c < nc; c++) sum += (pr[c] = (float)exp((double)__fsub_rn(pr[c], m)));
            s_sum = sum;
        }
        __syncthreads();
        double sum = s_sum;
        for (int c = tid; c < nc; c += blockDim.x) pr[c] = (float)(pr[c] / sum);
        __syncthreads();
        float *oi = o + (qo + gi) * D;
        for (int x = tid; x < D; x += blockDim.x) {
            float acc = 0.0f;
            for (int c = 0; c < nc; c++) acc = __fadd_rn(acc, __fmul_rn(pr[c], nsa_crow(t, z, c, 1, Hk, D, h)[x]));
            oi[x] = acc; /* this head's compressed output, until the branches are summed */
        }
        for (int c = tid; c < nc; c += blockDim.x) score[c] = __fadd_rn(score[c], pr[c]);
        __syncthreads();
    }
    /* [NSA-3] selection: mean probability, first/current/previous forced; ties to the lower index */
    for (int c = tid; c < nb; c += blockDim.x) {
        score[c] = __fdiv_rn(score[c], (float)G);
        if (c == 0 || c == cur || c == cur - 1) score[c] = 1.0f;
    }
    __syncthreads();
    int want = counts < nb ? counts : nb;
    for (int kk = 0; kk < want; kk++) {
        int bi = -1;
        float bv = 0.0f;
        for (int c = tid; c < nb; c += blockDim.x)
            if (score[c] >= 0.0f && (bi < 0 || score[c] > bv)) bi = c, bv = score[c];
        s_bi[tid] = bi;
        s_bv[tid] = bv;
        __syncthreads();
        for (int st = blockDim.x / 2; st > 0; st >>= 1) {
            if (tid < st) {
                int ob = s_bi[tid + st], me = s_bi[tid];
                if (ob >= 0 && (me < 0 || s_bv[tid + st] > s_bv[tid] || (s_bv[tid + st] == s_bv[tid] && ob < me)))
                    s_bi[tid] = ob, s_bv[tid] = s_bv[tid + st];
            }
            __syncthreads();
        }
        if (tid == 0) {
            sel[kk] = s_bi[0];
            score[s_bi[0]] = -1.0f; /* taken */
        }
        __syncthreads();
    }
    /* selected keys in selection order: every selected block is complete but the current one */
    int nk = 0;
    for (int j = 0; j < want; j++) nk += sel[j] == cur ? p - cur * BS + 1 : BS;
    __syncthreads(); /* every thread has counted from sel before thread 0 reorders it */
    /* key j of the list: block sel[j / BS] holds keys j..; the current block is only partial,
     * so order the list with it last to keep the j / BS mapping */
    if (tid == 0) {
        for (int j = 0; j < want; j++)
            if (sel[j] == cur) {
                for (int r = j; r + 1 < want; r++) sel[r] = sel[r + 1];
                sel[want - 1] = cur;
                break;
            }
    }
    __syncthreads();
    int lo = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
    for (int gi = 0; gi < G; gi++) {
        for (int x = tid; x < D; x += blockDim.x) qs[x] = q[(qo + gi) * D + x];
        __syncthreads();
        nsa_attend(t, z, h, Hk, D, qs, nk, sel, want, BS, p, 0, scale, sc, red, os);
        if (window > 0) nsa_attend(t, z, h, Hk, D, qs, p - lo + 1, NULL, 0, BS, p, lo, scale, sc, red, ow);
        const float *gg = g + (qo + gi) * 3;
        float gc = (float)(1.0 / (1.0 + exp(-(double)gg[0]))), gs = (float)(1.0 / (1.0 + exp(-(double)gg[1])));
        float gw = (float)(1.0 / (1.0 + exp(-(double)gg[2])));
        float *oi = o + (qo + gi) * D;
        for (int x = tid; x < D; x += blockDim.x) {
            float r = os[x] * gs + oi[x] * gc;
            if (window > 0) r += ow[x] * gw;
            oi[x] = r;
        }
        __syncthreads();
    }
}

static hyla_status nsa_run(hyla_cuda_ctx *c, const char *op, const float *q, const float *k, const float *v,
                           const float *g, int n, int Hq, int Hk, int D, int pos0, const int32_t *pos,
                           const hyla_kv_view *kv, int nkv, int block, int counts, int window, float scale, float *o) {
    if (n < 0 || Hq <= 0 || Hk <= 0 || Hq % Hk || D <= 0 || block <= 0 || counts <= 0 || counts > NSA_MAX_COUNTS)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "%s: n=%d Hq=%d Hk=%d D=%d block=%d counts=%d (at most %d)", op, n, Hq, Hk,
                         D, block, counts, NSA_MAX_COUNTS);
    if (n == 0) return HYLA_OK;
    int G = Hq / Hk, pmax = 0, nptr = 0, ncp = 0, newmax = 0;
    size_t scf = 0; /* scratch floats of the compressed blocks of sessions without a cache */
    for (int i = 0; i < n; i++) {
        int p = pos ? pos[i] : pos0 + i;
        if (p < 0) return hyla_fail(HYLA_ERR_INVALID_ARG, "%s: token %d at position %d", op, i, p);
        if (p > pmax) pmax = p;
    }
    for (int z = 0; z < nkv; z++) {
        const hyla_kv_view *w = &kv[z];
        int hi = pos ? pos[z] : pos0 + n - 1, nc = (hi + 1) / block;
        if (w->page_tokens <= 0 || hi / w->page_tokens >= w->n_pages)
            return hyla_fail(HYLA_ERR_RESOURCE, "%s: position %d is beyond the cache", op, hi);
        for (int pg = 0; pg <= hi / w->page_tokens; pg++)
            if (!w->k_pages[pg] || !w->v_pages[pg])
                return hyla_fail(HYLA_ERR_INVALID_ARG, "%s: page %d is not allocated", op, pg);
        nptr += 2 * w->n_pages;
        if (w->c_pages) {
            if (w->c_valid < 0 || (nc > 0 && (nc - 1) / w->page_tokens >= w->c_n_pages))
                return hyla_fail(HYLA_ERR_RESOURCE, "%s: %d compressed blocks need more than the %d cache pages", op,
                                 nc, w->c_n_pages);
            ncp += w->c_n_pages;
            int valid = w->c_valid < nc ? w->c_valid : nc;
            if (nc - valid > newmax) newmax = nc - valid;
        } else {
            ncp += 1;
            scf += (size_t)nc * 2 * Hk * D;
            if (nc > newmax) newmax = nc;
        }
    }
    /* host tables: kv pointers [nptr], compressed pointers [ncp], then the ints off [nkv + 1],
     * pt, cpoff, cpt, cvalid, nc [nkv] each */
    int nbmax = pmax / block + 1, kmax = counts * block > window ? counts * block : window;
    if (kmax > pmax + 1) kmax = pmax + 1;
    size_t per = (size_t)(G + 1) * nbmax + kmax + 1;
    void *mem;
    HYLA_TRY(cu_scratch(c, SCR_ATTN, (scf + (size_t)n * Hk * per) * sizeof(float), &mem));
    float *cscr = (float *)mem, *scr = cscr + scf;
    size_t ints = (size_t)6 * nkv + 1, np = (size_t)nptr + ncp;
    void **ptr = (void **)malloc(np * sizeof(void *) + ints * sizeof(int32_t) + 16);
    if (!ptr) return hyla_fail(HYLA_ERR_RESOURCE, "%s: out of host memory", op);
    void **cptr = ptr + nptr;
    int32_t *off = (int32_t *)(ptr + np), *pt = off + nkv + 1, *cpoff = pt + nkv, *cpt = cpoff + nkv;
    int32_t *cvalid = cpt + nkv, *ncz = cvalid + nkv;
    int at = 0, cat = 0;
    size_t sat = 0;
    for (int z = 0; z < nkv; z++) {
        off[z] = at;
        for (int pg = 0; pg < kv[z].n_pages; pg++) ptr[at + pg] = kv[z].k_pages[pg], ptr[at + kv[z].n_pages + pg] = kv[z].v_pages[pg];
        at += 2 * kv[z].n_pages;
        pt[z] = kv[z].page_tokens;
        ncz[z] = ((pos ? pos[z] : pos0 + n - 1) + 1) / block;
        cpoff[z] = cat;
        if (kv[z].c_pages) {
            for (int pg = 0; pg < kv[z].c_n_pages; pg++) cptr[cat + pg] = kv[z].c_pages[pg];
            cat += kv[z].c_n_pages;
            cpt[z] = kv[z].page_tokens;
            cvalid[z] = kv[z].c_valid < ncz[z] ? kv[z].c_valid : ncz[z];
        } else { /* one scratch page holding all its blocks, all derived in this call */
            cptr[cat++] = cscr + sat;
            sat += (size_t)ncz[z] * 2 * Hk * D;
            cpt[z] = ncz[z] > 0 ? ncz[z] : 1;
            cvalid[z] = 0;
        }
    }
    off[nkv] = at;
    void *dptr, *dint, *dpos = NULL;
    hyla_status st = cu_stage_reserve(c, np * sizeof(void *) + ints * sizeof(int32_t) + (size_t)n * 4 + 768, 3);
    if (st == HYLA_OK) st = cu_stage(c, ptr, np * sizeof(void *), &dptr);
    if (st == HYLA_OK) st = cu_stage(c, off, ints * sizeof(int32_t), &dint);
    if (st == HYLA_OK && pos) st = cu_stage(c, pos, (size_t)n * sizeof(int32_t), &dpos);
    free(ptr);
    HYLA_TRY(st);
    int32_t *di = (int32_t *)dint;
    nsa_tab t = {(void *const *)dptr, di, di + nkv + 1, (const int32_t *)dpos, (void *const *)dptr + nptr,
                 di + 2 * nkv + 1, di + 3 * nkv + 1, di + 4 * nkv + 1, di + 5 * nkv + 1, pos0};
    k_nsa_put<<<n, SP_THREADS, 0, c->stream>>>(t, k, v, Hk, D);
    CU_LAUNCH_CHECK("nsa_put");
    /* only the blocks completed since the cache was last filled: a decode step reads the KV
     * of its selected blocks and window alone */
    if (newmax > 0) {
        k_nsa_compress<<<dim3(newmax, nkv, Hk), SP_THREADS, 0, c->stream>>>(t, Hk, D, block);
        CU_LAUNCH_CHECK("nsa_compress");
    }
    size_t smem = 3 * (size_t)D * sizeof(float);
    k_nsa_task<<<dim3(n, Hk), SP_THREADS, smem, c->stream>>>(t, q, g, Hq, Hk, D, block, counts, window, scale, scr,
                                                            per, o);
    CU_LAUNCH_CHECK("nsa_task");
    return HYLA_OK;
}

extern "C" hyla_status cu_nsa_prefill(void *ctx, const float *q, const float *k, const float *v, const float *g, int n,
                                      int Hq, int Hk, int D, int pos0, const hyla_kv_view *kv, int block, int counts,
                                      int window, float scale, float *o) {
    if (pos0 < 0) return hyla_fail(HYLA_ERR_INVALID_ARG, "nsa_prefill: pos0=%d", pos0);
    return nsa_run((hyla_cuda_ctx *)ctx, "nsa_prefill", q, k, v, g, n, Hq, Hk, D, pos0, NULL, kv, 1, block, counts,
                   window, scale, o);
}

extern "C" hyla_status cu_nsa_decode(void *ctx, const float *q, const float *k, const float *v, const float *g, int B,
                                     int Hq, int Hk, int D, const int32_t *pos, const hyla_kv_view *kv, int block,
                                     int counts, int window, float scale, float *o) {
    return nsa_run((hyla_cuda_ctx *)ctx, "nsa_decode", q, k, v, g, B, Hq, Hk, D, 0, pos, kv, B, block, counts, window,
                   scale, o);
}
