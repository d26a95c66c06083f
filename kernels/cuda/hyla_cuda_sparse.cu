/* hyla_cuda_sparse.cu — the LTE ops (learnable token eviction, docs/MODELS.md §5.1, [LTE-1..5])
 * on the GPU (NSA: hyla_cuda_nsa.cu). Correctness-first ports of the CPU reference
 * (kernels/cpu/cpu_lte.c); no tensor cores yet.
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
 * Threading: one thread drives one context (hyla_ops.h); every launch is on c->stream. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_cuda_impl.h"

#define SP_THREADS 128

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
