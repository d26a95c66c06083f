/* hyla_cuda_lte.cu — the LTE ops (learnable token eviction, docs/MODELS.md §5.1, [LTE-1..5]) on
 * the GPU: the scoring CNN, the cache update (eviction, retention, replacement) and attention over
 * sink ∪ retained ∪ window, for prefill and decode by the same kernels.
 *
 * The cache k, v rows are bf16 (ops->kv_dtype); everything else is fp32 as on the CPU.
 *
 * Scoring (the CNN) runs one thread per output value with the CPU's summation order (bias, taps,
 * channels), every product and sum rounded on its own (__fmul_rn/__fadd_rn: no FMA contraction),
 * the Swish's and the sigmoid's exponentials in double rounded once (hyla_exp_det), and the
 * un-rotation of the keys in double with RoPE's angles, sines and cosines from hyla_rope_det, as
 * the CPU computes them (kernels/hyla_detmath.h: libm's and CUDA's pow, sin, cos are not the same
 * functions). Given the same cached k, v the scores are the CPU's bits, so the retained members
 * and their order are the CPU's. A score depends only on its receptive field, so every position a call
 * needs is scored in one batch before the cache update: a token's score is known once h tokens
 * after it exist, and it is read only when it leaves the window, w > h tokens later.
 *
 * One call = one or more "steps"; a step is a set of jobs (a job: one session's consecutive new
 * tokens; decode: B jobs of one token; prefill: one job per piece of LT_PIECE tokens):
 *   1. scoring of the positions [m0, m1) each job makes due (lazy or eager, as cpu_lte.c), from
 *      the old cache rows and the new tokens' k, v rounded to bf16, into a score array;
 *   2. k_lte_sim, per (job, KV head): one warp walks the job's tokens in order doing exactly the
 *      CPU's evict/retain/replace decisions on the retained segment (kept in shared memory) and
 *      records, per token, the segment as its attention sees it (the position in each slot);
 *      the other warps round the new k, v to bf16 into scratch. It writes the segment's final
 *      scores, positions and count into the cache.
 *   3. k_lte_attn, per (token, KV head, up to 4 query heads of the group): the visible rows in
 *      the canonical order (sink, retained by slot, window oldest first), each resolved to an old
 *      cache row or a new row of the step, split over 8 warps in a fixed partition of the row
 *      list (each warp: row groups of D/8 lanes, an online softmax over a fixed slice), then the
 *      row groups and the warps merged in a fixed order. The rows a token sees and the order of
 *      every sum are functions of the token's position and the cache history alone, so prefill
 *      == decode, any piece size and any batching give the same bits.
 *   4. k_lte_write, per (job, KV head): the final cache contents (the segment slots that got a
 *      new occupant, the ring and sink rows of the new tokens, the ring rows' scores, meta).
 * meta[0] and meta[1] are functions of the position (lte_next_scored), so the host plans every
 * step without reading the device. The CUDA ops trust the caller that meta[0] equals the
 * position (the mixer guarantees it) instead of checking it as the CPU does.
 * Threading: one thread drives one context (hyla_ops.h); every launch is on c->stream. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_cuda_impl.h"
#include "hyla_detmath.h"

#define LT_THREADS 128
#define LT_ATT_WARPS 8     /* warps of an attention block */
#define LT_GC 4            /* query heads of a group per attention block */
#define LT_PIECE 1024      /* tokens of a prefill step (bounds the per-token records) */
#define LT_SCORE_ROWS 4096 /* CNN input rows per scoring launch (bounds the activations) */
#define LT_MAX_ROWS 10240  /* s + w + b: the visible rows' codes in shared memory */
#define LT_MAX_BUDGET 4096 /* the segment's scores and positions in shared memory */

struct lte_dev_cache {
    __nv_bfloat16 *k, *v; /* [Hk][R][D] */
    float *r;             /* [Hk][R] */
    int32_t *rpos;        /* [Hk][b] */
    int32_t *meta;        /* [2 + Hk] */
};

struct lte_geo {
    int Hk, D, s, w, b, R, h;
};

/* One session's new tokens in a step. */
struct lte_job {
    int z;      /* cache index */
    int pos0, n; /* positions pos0 .. pos0 + n - 1 */
    int tok0;   /* their rows in q, k, v, o */
    int loc0;   /* their rows in the step's scratch (bf16 k, v; per-token records) */
    int m0, m1; /* positions scored in this step: [m0, m1) (m1 = meta[1] afterwards) */
    int xrow;   /* the score of position p in [m0, m1) is row xrow + p - m0 of the score array;
                 * the CNN's input rows of the job are flat rows xrow .. xrow + m1 - m0 + 2h - 1 */
};

static lte_geo lte_geometry(const hyla_lte_params *p) {
    lte_geo g = {p->Hk, p->D, p->sink, p->window, p->budget, p->sink + p->window + p->budget, hyla_lte_half(p)};
    return g;
}

/* Largest channel count of the conv layers' outputs (hyla_lte_maxch: the input's too). */
static int lte_maxact(const hyla_lte_params *p) {
    int m = 0;
    for (int l = 1; l <= p->n_conv; l++)
        if (p->ch[l] > m) m = p->ch[l];
    return m;
}

/* The limits of the cache kernels (lte_score has none): head dims whose rows split into 16-byte
 * pieces over a power-of-two number of lanes, the codes of the visible rows and the segment in
 * shared memory. */
static hyla_status lte_check_cache(const char *op, const hyla_lte_params *p) {
    HYLA_TRY(hyla_lte_check(op, p));
    if (p->D != 16 && p->D != 32 && p->D != 64 && p->D != 128 && p->D != 256)
        return hyla_fail(HYLA_ERR_UNSUPPORTED, "%s: head dim %d (the CUDA LTE kernels take 16, 32, 64, 128 or 256)", op,
                         p->D);
    if (p->sink + p->window + p->budget > LT_MAX_ROWS || p->budget > LT_MAX_BUDGET)
        return hyla_fail(HYLA_ERR_UNSUPPORTED,
                         "%s: %d cache rows (sink + window + budget), budget %d: the CUDA kernels take at most %d rows "
                         "and a budget of %d",
                         op, p->sink + p->window + p->budget, p->budget, LT_MAX_ROWS, LT_MAX_BUDGET);
    return HYLA_OK;
}

/* meta[1] once the cache holds N tokens: the insert rule of cpu_lte.c (lazy: a batch is scored
 * when the position leaving the window is still needed as context; eager: every complete
 * position at once) as a function of N. */
static int lte_next_scored(const hyla_lte_params *p, int N) {
    int s = p->sink, w = p->window, h = hyla_lte_half(p);
    if (p->eager) return N - 1 - h >= s ? N - h : s;
    /* lazy: the first batch is due at t = s + w, then every w - 2h tokens (lte_check: > 0) */
    if (N <= s + w) return s;
    int d = w - 2 * h, k = (N - 1 - (s + w)) / d;
    return s + w + k * d - h;
}

__device__ __forceinline__ float lte_silu(float x) {
    return __fdiv_rn(x, __fadd_rn(1.0f, (float)hyla_exp_det(-(double)x))); /* cpu_lte.c's expression */
}

__device__ __forceinline__ int lte_pos_row(const lte_geo g, int pos) { return pos < g.s ? pos : g.s + (pos - g.s) % g.w; }

/* [LTE-2] one conv layer: out rows [nlo, nhi) of [T][Hk][cout] from in [T][Hk][cin]. Row t holds
 * position apos[t] (apos NULL: x0 + t); layers are zero at negative positions. */
__global__ void k_lte_conv(const float *in, int cin, float *out, int cout, const float *W, const float *Bv, int Hk,
                           int K, int dil, int nlo, int nhi, int x0, const int32_t *apos) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)(nhi - nlo) * Hk * cout) return;
    int o = (int)(i % cout);
    long long r = i / cout;
    int h = (int)(r % Hk), t = nlo + (int)(r / Hk), c = (K - 1) / 2;
    float *y = out + ((size_t)t * Hk + h) * cout + o;
    if ((apos ? apos[t] : x0 + t) < 0) {
        *y = 0.0f;
        return;
    }
    const float *w = W + ((size_t)(h * cout + o) * cin) * K;
    float acc = Bv[h * cout + o];
    for (int tap = 0; tap < K; tap++) {
        int ts = t + (tap - c) * dil;
        if ((apos ? apos[ts] : x0 + ts) < 0) continue;
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
    r[(size_t)(t - lo) * Hk + h] = (float)(1.0 / (1.0 + hyla_exp_det(-(double)acc)));
}

static unsigned blocks_for(long long n) { return (unsigned)((n + LT_THREADS - 1) / LT_THREADS); }

/* The CNN over x [T][Hk][2D] into r [T-2h][Hk]; a, b: [T][Hk][maxact] each. */
static hyla_status lte_cnn(hyla_cuda_ctx *c, const hyla_lte_params *p, const float *x, int T, int x0,
                           const int32_t *apos, float *r, float *a, float *b) {
    int Hk = p->Hk, K = p->kernel, dil = p->dilation, cc = (K - 1) / 2, lo = 0, hi = T, cin = p->ch[0];
    const float *in = x;
    for (int l = 0; l < p->n_conv; l++) {
        int cout = p->ch[l + 1], nlo = lo + cc * dil, nhi = hi - cc * dil;
        float *out = (l % 2 == 0) ? a : b;
        long long n = (long long)(nhi - nlo) * Hk * cout;
        if (n > 0) {
            k_lte_conv<<<blocks_for(n), LT_THREADS, 0, c->stream>>>(in, cin, out, cout, p->conv_w[l], p->conv_b[l], Hk,
                                                                     K, dil, nlo, nhi, x0, apos);
            CU_LAUNCH_CHECK("lte_conv");
        }
        in = out;
        cin = cout;
        lo = nlo;
        hi = nhi;
    }
    if (hi > lo) {
        k_lte_proj<<<blocks_for((long long)(hi - lo) * Hk), LT_THREADS, 0, c->stream>>>(in, cin, p->proj_w, p->proj_b,
                                                                                        Hk, lo, hi, r);
        CU_LAUNCH_CHECK("lte_proj");
    }
    return HYLA_OK;
}

extern "C" hyla_status cu_lte_score(void *ctx, const hyla_lte_params *p, const float *x, int T, int x0, float *r) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    HYLA_TRY(hyla_lte_check("lte_score", p));
    int h = hyla_lte_half(p);
    if (T < 2 * h + 1) return hyla_fail(HYLA_ERR_INVALID_ARG, "lte_score: %d rows, the receptive field needs %d", T, 2 * h + 1);
    size_t na = (size_t)T * p->Hk * hyla_lte_maxch(p);
    void *mem;
    HYLA_TRY(cu_scratch(c, SCR_ATTN, 2 * na * sizeof(float), &mem));
    float *a = (float *)mem;
    return lte_cnn(c, p, x, T, x0, NULL, r, a, a + na);
}

/* ------------------------------------------------------------------ a step's kernels */

/* Element j of the k (isv 0) or v row of position pos of job J, as the cache holds it (bf16):
 * an old cache row below J.pos0, else the new token's fp32 row rounded as the insert rounds it. */
__device__ __forceinline__ float lte_elem(const lte_job &J, const lte_dev_cache &c, lte_geo g, const float *k,
                                          const float *v, int isv, int kh, int pos, int j) {
    if (pos >= J.pos0) {
        const float *src = isv ? v : k;
        return __bfloat162float(__float2bfloat16_rn(src[((size_t)(J.tok0 + pos - J.pos0) * g.Hk + kh) * g.D + j]));
    }
    const __nv_bfloat16 *src = isv ? c.v : c.k;
    return __bfloat162float(src[((size_t)kh * g.R + lte_pos_row(g, pos)) * g.D + j]);
}

/* [LTE-1] The CNN input of the scoring jobs sj[0..): job J's rows are positions m0-h .. m1-1+h,
 * at flat rows xrow - gb .. of x [rows][Hk][2D] (un-rotated keys ‖ values; negative positions
 * zero) and apos [rows] (their positions). grid (blocks over the longest job, jobs). */
__global__ void k_lte_gather(const lte_job *jobs, const int32_t *sj, int gb, const lte_dev_cache *cs, lte_geo g,
                             const float *k, const float *v, double ln_theta, float *x, int32_t *apos) {
    const lte_job J = jobs[sj[blockIdx.y]];
    int T = J.m1 - J.m0 + 2 * g.h, D = g.D, half = D / 2;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)T * g.Hk * D) return;
    int j = (int)(i % D);
    long long rr = i / D;
    int kh = (int)(rr % g.Hk), t = (int)(rr / g.Hk), pos = J.m0 - g.h + t, lr = J.xrow - gb + t;
    float *xk = x + ((size_t)lr * g.Hk + kh) * 2 * D;
    if (kh == 0 && j == 0) apos[lr] = pos;
    if (pos < 0) {
        xk[j] = 0.0f;
        xk[D + j] = 0.0f;
        return;
    }
    const lte_dev_cache c = cs[J.z];
    xk[D + j] = lte_elem(J, c, g, k, v, 1, kh, pos, j);
    if (j < half) {
        double cs_, sn;
        hyla_rope_det(pos, j, D, ln_theta, &sn, &cs_); /* the CPU's bits (hyla_detmath.h) */
        double k0 = lte_elem(J, c, g, k, v, 0, kh, pos, j), k1 = lte_elem(J, c, g, k, v, 0, kh, pos, j + half);
        xk[j] = (float)__dadd_rn(__dmul_rn(k0, cs_), __dmul_rn(k1, sn));
        xk[j + half] = (float)__dsub_rn(__dmul_rn(k1, cs_), __dmul_rn(k0, sn));
    }
}

/* The segment's victim: the lowest score, the oldest position among equal scores (positions are
 * distinct, so the result does not depend on the reduction order). Every lane gets it. */
__device__ __forceinline__ void lte_argmin(const float *sr, const int32_t *sp, int b, int lane, float *mv, int *mi) {
    float bv = 0.0f;
    int bp = 0, bi = -1;
    for (int j = lane; j < b; j += 32) {
        float x = sr[j];
        int pp = sp[j];
        if (bi < 0 || x < bv || (x == bv && pp < bp)) bv = x, bp = pp, bi = j;
    }
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int op = __shfl_xor_sync(0xffffffffu, bp, o), oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (oi >= 0 && (bi < 0 || ov < bv || (ov == bv && op < bp))) bv = ov, bp = op, bi = oi;
    }
    *mv = bv;
    *mi = bi;
}

/* [LTE-3, LTE-4] grid (jobs, Hk), LT_THREADS threads; dynamic shared: the segment's scores and
 * positions [2][b]. Warp 0 walks the job's tokens: the position e = t - w leaving the window is
 * kept if r > 0.5 (appended while the segment has room, else it replaces the victim if it scores
 * strictly higher); after each token the segment (positions by slot) and its size go to refs
 * [loc][Hk][b] and cnts [loc][Hk]. The other warps round the new k, v to bf16 into kb, vb
 * [loc][Hk][D]. */
__global__ void k_lte_sim(const lte_job *jobs, const lte_dev_cache *cs, lte_geo g, const float *k, const float *v,
                          const float *scores, __nv_bfloat16 *kb, __nv_bfloat16 *vb, int32_t *refs, int32_t *cnts) {
    extern __shared__ float sm_seg[];
    const lte_job J = jobs[blockIdx.x];
    int kh = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, D = g.D;
    const lte_dev_cache c = cs[J.z];
    if (warp > 0) {
        int nth = blockDim.x - 32;
        for (long long e = threadIdx.x - 32; e < (long long)J.n * D; e += nth) {
            int u = (int)(e / D), x = (int)(e % D);
            size_t src = ((size_t)(J.tok0 + u) * g.Hk + kh) * D + x, dst = ((size_t)(J.loc0 + u) * g.Hk + kh) * D + x;
            kb[dst] = __float2bfloat16_rn(k[src]);
            vb[dst] = __float2bfloat16_rn(v[src]);
        }
        return;
    }
    float *sr = sm_seg;
    int32_t *sp = (int32_t *)(sm_seg + g.b);
    int base = g.s + g.w, cnt = c.meta[2 + kh];
    float *segr = c.r + (size_t)kh * g.R + base;
    int32_t *segp = c.rpos + (size_t)kh * g.b;
    for (int j = lane; j < cnt; j += 32) sr[j] = segr[j], sp[j] = segp[j];
    __syncwarp();
    float minv = 0.0f;
    int mini = -1;
    if (g.b > 0 && cnt == g.b) lte_argmin(sr, sp, g.b, lane, &minv, &mini);
    for (int i0 = 0; i0 < J.n; i0 += 32) {
        /* the scores of the next 32 tokens' leaving positions, loaded at once */
        int i = i0 + lane, e = -1;
        float re = 0.0f;
        if (i < J.n) {
            int t = J.pos0 + i;
            if (t >= g.s + g.w) {
                e = t - g.w;
                re = e >= J.m0 ? scores[(size_t)(J.xrow + e - J.m0) * g.Hk + kh]
                               : c.r[(size_t)kh * g.R + lte_pos_row(g, e)];
            }
        }
        int lim = J.n - i0 < 32 ? J.n - i0 : 32;
        for (int u = 0; u < lim; u++) {
            float r = __shfl_sync(0xffffffffu, re, u);
            int ee = __shfl_sync(0xffffffffu, e, u);
            if (ee >= 0 && r > 0.5f) {
                int slot = -1;
                if (cnt < g.b) slot = cnt++;
                else if (g.b > 0 && r > minv) slot = mini;
                if (slot >= 0) {
                    __syncwarp(); /* every lane has copied the previous token's segment */
                    if (lane == 0) sr[slot] = r, sp[slot] = ee;
                    __syncwarp();
                    if (cnt == g.b) lte_argmin(sr, sp, g.b, lane, &minv, &mini);
                }
            }
            int loc = J.loc0 + i0 + u;
            int32_t *ro = refs + ((size_t)loc * g.Hk + kh) * g.b;
            for (int j = lane; j < cnt; j += 32) ro[j] = sp[j];
            if (lane == 0) cnts[(size_t)loc * g.Hk + kh] = cnt;
        }
    }
    __syncwarp();
    for (int j = lane; j < cnt; j += 32) segr[j] = sr[j], segp[j] = sp[j];
    if (lane == 0) c.meta[2 + kh] = cnt;
}

__device__ __forceinline__ void lte_bf8(uint4 u, float *f) {
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&u;
#pragma unroll
    for (int e = 0; e < 4; e++) {
        float2 t = __bfloat1622float2(h[e]);
        f[2 * e] = t.x;
        f[2 * e + 1] = t.y;
    }
}

/* [LTE-5] o [tok][Hq][D] for the query heads q0 .. q0+LT_GC-1 of KV head kh's group: attention
 * over the visible rows of token loc (blockIdx.x) in the order sink, retained by slot, window
 * oldest first. grid (tokens, Hk, ceil(G / LT_GC)), LT_ATT_WARPS warps. Dynamic shared: the
 * rows' codes [n] (>= 0: row of the cache's head slab; < 0: -1 - row of kb, vb), reused for the
 * warps' partial outputs. Warp w takes rows [n·w/W, n·(w+1)/W); its lanes form 32/(D/8) row
 * groups of D/8 lanes (16 bytes of k and v each), group r taking rows r, r + 32/(D/8), ... of the
 * slice two at a time: an online softmax per group, then the groups (xor butterflies: the same
 * bits in every lane) and the warps (in order) merged. */
template <int D>
__global__ void __launch_bounds__(LT_ATT_WARPS * 32)
    k_lte_attn(const lte_job *jobs, int njob, const lte_dev_cache *cs, lte_geo g, const __nv_bfloat16 *kb,
               const __nv_bfloat16 *vb, const int32_t *refs, const int32_t *cnts, const float *q, int Hq, float scale,
               float *o) {
    constexpr int LPR = D / 8, RPW = 32 / LPR;
    extern __shared__ int sm_codes[];
    __shared__ float s_m[LT_ATT_WARPS][LT_GC], s_l[LT_ATT_WARPS][LT_GC];
    int loc = blockIdx.x, kh = blockIdx.y, G = Hq / g.Hk, q0 = blockIdx.z * LT_GC;
    int gq = G - q0 < LT_GC ? G - q0 : LT_GC;
    const lte_job J = jobs[njob == 1 ? 0 : loc];
    const lte_dev_cache c = cs[J.z];
    int u = loc - J.loc0, t = J.pos0 + u, N = t + 1;
    int ns = N < g.s ? N : g.s, nr = cnts[(size_t)loc * g.Hk + kh], lo = N - g.w > g.s ? N - g.w : g.s;
    int n = ns + nr + (N > lo ? N - lo : 0), base = g.s + g.w;
    int ringlo0 = J.pos0 - g.w > g.s ? J.pos0 - g.w : g.s;
    const int32_t *rf = refs + ((size_t)loc * g.Hk + kh) * g.b;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        int p;
        if (j < ns) {
            p = j;
        } else if (j < ns + nr) {
            p = rf[j - ns];
            if (p < ringlo0) { /* retained before this step: still in its slot */
                sm_codes[j] = kh * g.R + base + (j - ns);
                continue;
            }
        } else {
            p = lo + (j - ns - nr);
        }
        sm_codes[j] = p >= J.pos0 ? -1 - ((J.loc0 + p - J.pos0) * g.Hk + kh) : kh * g.R + lte_pos_row(g, p);
    }
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, rg = lane / LPR, sub = lane % LPR;
    float qv[LT_GC][8];
#pragma unroll
    for (int gi = 0; gi < LT_GC; gi++) {
        const float *qr = q + ((size_t)(J.tok0 + u) * Hq + (size_t)kh * G + q0 + gi) * D + sub * 8;
#pragma unroll
        for (int e = 0; e < 8; e++) qv[gi][e] = 0.0f;
        if (gi < gq)
#pragma unroll
            for (int e = 0; e < 8; e++) qv[gi][e] = qr[e];
    }
    float m[LT_GC], l[LT_GC], acc[LT_GC][8];
#pragma unroll
    for (int gi = 0; gi < LT_GC; gi++) {
        m[gi] = -INFINITY;
        l[gi] = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; e++) acc[gi][e] = 0.0f;
    }
    __syncthreads();
    int j0 = (int)((long long)n * warp / LT_ATT_WARPS), j1 = (int)((long long)n * (warp + 1) / LT_ATT_WARPS);
    const __nv_bfloat16 *ck = c.k, *cv = c.v;
    for (int jb = j0; jb < j1; jb += 2 * RPW) {
        int ja = jb + rg, jc = jb + RPW + rg;
        bool va = ja < j1, vc = jc < j1;
        uint4 ka = make_uint4(0, 0, 0, 0), xa = ka, kc = ka, xc = ka;
        if (va) {
            int code = sm_codes[ja];
            size_t off = (size_t)(code >= 0 ? code : -1 - code) * D + sub * 8;
            ka = *(const uint4 *)((code >= 0 ? ck : kb) + off);
            xa = *(const uint4 *)((code >= 0 ? cv : vb) + off);
        }
        if (vc) {
            int code = sm_codes[jc];
            size_t off = (size_t)(code >= 0 ? code : -1 - code) * D + sub * 8;
            kc = *(const uint4 *)((code >= 0 ? ck : kb) + off);
            xc = *(const uint4 *)((code >= 0 ? cv : vb) + off);
        }
        float fka[8], fkc[8], fva[8], fvc[8];
        lte_bf8(ka, fka);
        lte_bf8(kc, fkc);
        lte_bf8(xa, fva);
        lte_bf8(xc, fvc);
#pragma unroll
        for (int gi = 0; gi < LT_GC; gi++) {
            float da = 0.0f, dc = 0.0f;
#pragma unroll
            for (int e = 0; e < 8; e++) da += qv[gi][e] * fka[e], dc += qv[gi][e] * fkc[e];
#pragma unroll
            for (int ofs = LPR / 2; ofs > 0; ofs >>= 1) {
                da += __shfl_xor_sync(0xffffffffu, da, ofs);
                dc += __shfl_xor_sync(0xffffffffu, dc, ofs);
            }
            float sa = va ? da * scale : -INFINITY, sc = vc ? dc * scale : -INFINITY;
            float mn = fmaxf(m[gi], fmaxf(sa, sc));
            if (mn == -INFINITY) continue;
            float cr = expf(m[gi] - mn), pa = expf(sa - mn), pc = expf(sc - mn);
            l[gi] = l[gi] * cr + pa + pc;
#pragma unroll
            for (int e = 0; e < 8; e++) acc[gi][e] = acc[gi][e] * cr + pa * fva[e] + pc * fvc[e];
            m[gi] = mn;
        }
    }
    /* the warp's row groups, merged by xor butterflies (a + b == b + a: every lane the same bits) */
#pragma unroll
    for (int ofs = LPR; ofs < 32; ofs <<= 1) {
#pragma unroll
        for (int gi = 0; gi < LT_GC; gi++) {
            float om = __shfl_xor_sync(0xffffffffu, m[gi], ofs), ol = __shfl_xor_sync(0xffffffffu, l[gi], ofs);
            float M = fmaxf(m[gi], om);
            float fa = M == -INFINITY ? 0.0f : expf(m[gi] - M), fb = M == -INFINITY ? 0.0f : expf(om - M);
            l[gi] = l[gi] * fa + ol * fb;
#pragma unroll
            for (int e = 0; e < 8; e++) {
                float oa = __shfl_xor_sync(0xffffffffu, acc[gi][e], ofs);
                acc[gi][e] = acc[gi][e] * fa + oa * fb;
            }
            m[gi] = M;
        }
    }
    __syncthreads(); /* the codes are read: the region now holds the warps' partial outputs */
    float *s_acc = (float *)sm_codes; /* [W][LT_GC][D] */
    if (rg == 0) {
#pragma unroll
        for (int gi = 0; gi < LT_GC; gi++)
#pragma unroll
            for (int e = 0; e < 8; e++) s_acc[((size_t)warp * LT_GC + gi) * D + sub * 8 + e] = acc[gi][e];
    }
    if (lane == 0)
#pragma unroll
        for (int gi = 0; gi < LT_GC; gi++) s_m[warp][gi] = m[gi], s_l[warp][gi] = l[gi];
    __syncthreads();
    for (int idx = threadIdx.x; idx < gq * D; idx += blockDim.x) {
        int gi = idx / D, x = idx % D;
        float M = -INFINITY;
        for (int w = 0; w < LT_ATT_WARPS; w++) M = fmaxf(M, s_m[w][gi]);
        float L = 0.0f, O = 0.0f;
        for (int w = 0; w < LT_ATT_WARPS; w++) {
            float f = s_m[w][gi] == -INFINITY ? 0.0f : expf(s_m[w][gi] - M);
            L += s_l[w][gi] * f;
            O += s_acc[((size_t)w * LT_GC + gi) * D + x] * f;
        }
        o[((size_t)(J.tok0 + u) * Hq + (size_t)kh * G + q0 + gi) * D + x] = O / L;
    }
}

/* [LTE-3, LTE-4] The cache after the step: grid (jobs, Hk), LT_THREADS threads. First the
 * segment slots that got an occupant in this step (its k, v from the old ring or the step's new
 * rows), then — the old ring rows read — the new tokens' rows that stay (sink, the last w), the
 * ring rows' scores, meta[0] and meta[1]. */
__global__ void k_lte_write(const lte_job *jobs, const lte_dev_cache *cs, lte_geo g, const __nv_bfloat16 *kb,
                            const __nv_bfloat16 *vb, const float *scores) {
    const lte_job J = jobs[blockIdx.x];
    int kh = blockIdx.y, D = g.D, V = D / 8, base = g.s + g.w, Nend = J.pos0 + J.n;
    const lte_dev_cache c = cs[J.z];
    int ringlo0 = J.pos0 - g.w > g.s ? J.pos0 - g.w : g.s, cnt = c.meta[2 + kh];
    const int32_t *rp = c.rpos + (size_t)kh * g.b;
    uint4 *ck = (uint4 *)c.k, *cv = (uint4 *)c.v;
    const uint4 *nk = (const uint4 *)kb, *nv = (const uint4 *)vb;
    size_t slab = (size_t)kh * g.R;
    for (int e = threadIdx.x; e < cnt * V; e += blockDim.x) {
        int j = e / V, x = e % V, p = rp[j];
        if (p < ringlo0) continue; /* retained before this step */
        size_t dst = (slab + base + j) * V + x;
        if (p >= J.pos0) {
            size_t src = ((size_t)(J.loc0 + p - J.pos0) * g.Hk + kh) * V + x;
            ck[dst] = nk[src], cv[dst] = nv[src];
        } else {
            size_t src = (slab + lte_pos_row(g, p)) * V + x;
            ck[dst] = ck[src], cv[dst] = cv[src];
        }
    }
    __syncthreads();
    /* new rows that stay: the sink positions and the last w */
    int wlo = Nend - g.w > J.pos0 ? Nend - g.w : J.pos0, slo = J.pos0, shi = Nend < g.s ? Nend : g.s;
    int nsk = shi > slo ? shi - slo : 0, nwn = Nend - wlo;
    for (int e = threadIdx.x; e < (nsk + nwn) * V; e += blockDim.x) {
        int j = e / V, x = e % V, p = j < nsk ? slo + j : wlo + (j - nsk);
        if (j >= nsk && p < g.s) continue; /* a sink position: done above */
        size_t dst = (slab + lte_pos_row(g, p)) * V + x, src = ((size_t)(J.loc0 + p - J.pos0) * g.Hk + kh) * V + x;
        ck[dst] = nk[src], cv[dst] = nv[src];
    }
    /* scores of the rows in the sink and ring: new rows 0 until scored; rows scored now */
    int rlo = Nend - g.w > g.s ? Nend - g.w : g.s;
    for (int p = threadIdx.x + slo; p < shi; p += blockDim.x) c.r[slab + p] = 0.0f;
    for (int p = threadIdx.x + rlo; p < Nend; p += blockDim.x) {
        if (p < J.pos0 && !(p >= J.m0 && p < J.m1)) continue; /* an old row, not scored now */
        c.r[slab + lte_pos_row(g, p)] =
            p >= J.m0 && p < J.m1 ? scores[(size_t)(J.xrow + p - J.m0) * g.Hk + kh] : 0.0f;
    }
    if (kh == 0 && threadIdx.x == 0) {
        c.meta[0] = Nend;
        c.meta[1] = J.m1;
    }
}

/* ------------------------------------------------------------------ host side */

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

/* Scratch of a step: the bf16 k, v and the per-token records of `tok` tokens, the scores of
 * `srows` score rows and the CNN's activations of `xrows` input rows, carved from SCR_ATTN. */
struct lte_scr {
    __nv_bfloat16 *kb, *vb;
    int32_t *refs, *cnts, *apos;
    float *scores, *x, *a, *b;
};

static size_t al256(size_t n) { return (n + 255) & ~(size_t)255; }

static hyla_status lte_scratch(hyla_cuda_ctx *c, const hyla_lte_params *p, int tok, int srows, int xrows,
                               lte_scr *s) {
    size_t Hk = (size_t)p->Hk, D = (size_t)p->D, nkv = al256((size_t)tok * Hk * D * 2);
    size_t nref = al256((size_t)tok * Hk * p->budget * 4 + 4), ncnt = al256((size_t)tok * Hk * 4);
    size_t nsc = al256((size_t)srows * Hk * 4 + 4), nap = al256((size_t)xrows * 4 + 4);
    size_t nx = al256((size_t)xrows * Hk * p->ch[0] * 4 + 4), na = al256((size_t)xrows * Hk * lte_maxact(p) * 4 + 4);
    void *mem;
    HYLA_TRY(cu_scratch(c, SCR_ATTN, 2 * nkv + nref + ncnt + nsc + nap + nx + 2 * na, &mem));
    char *m = (char *)mem;
    s->kb = (__nv_bfloat16 *)m, m += nkv;
    s->vb = (__nv_bfloat16 *)m, m += nkv;
    s->refs = (int32_t *)m, m += nref;
    s->cnts = (int32_t *)m, m += ncnt;
    s->scores = (float *)m, m += nsc;
    s->apos = (int32_t *)m, m += nap;
    s->x = (float *)m, m += nx;
    s->a = (float *)m, m += na;
    s->b = (float *)m;
    return HYLA_OK;
}

/* Plan job j's scoring: [m0, m1) from its positions; xrow from the running flat row count. */
static void lte_plan_job(const hyla_lte_params *p, lte_job *J, int *rows) {
    J->m0 = lte_next_scored(p, J->pos0);
    J->m1 = lte_next_scored(p, J->pos0 + J->n);
    J->xrow = *rows;
    if (J->m1 > J->m0) *rows += J->m1 - J->m0 + 2 * hyla_lte_half(p);
}

/* The rows of the longest scoring launch group (groups: consecutive scoring jobs up to
 * LT_SCORE_ROWS input rows, at least one job). */
static int lte_group_rows(const hyla_lte_params *p, const lte_job *jobs, int njob) {
    int h = hyla_lte_half(p), best = 0, cur = 0;
    for (int j = 0; j < njob; j++) {
        if (jobs[j].m1 <= jobs[j].m0) continue;
        int T = jobs[j].m1 - jobs[j].m0 + 2 * h;
        if (cur > 0 && cur + T > LT_SCORE_ROWS) cur = 0;
        cur += T;
        if (cur > best) best = cur;
    }
    return best;
}

typedef void (*lte_attn_fn)(const lte_job *, int, const lte_dev_cache *, lte_geo, const __nv_bfloat16 *,
                            const __nv_bfloat16 *, const int32_t *, const int32_t *, const float *, int, float, float *);

static lte_attn_fn lte_attn_kernel(int D) {
    switch (D) {
    case 16: return k_lte_attn<16>;
    case 32: return k_lte_attn<32>;
    case 64: return k_lte_attn<64>;
    case 128: return k_lte_attn<128>;
    default: return k_lte_attn<256>;
    }
}

/* One step: jobs (host hj, device dj) [njob], their tokens' rows in the scratch 0..ntok-1;
 * sj: device indices of the scoring jobs (host hsj) [nsj]. */
static hyla_status lte_step(hyla_cuda_ctx *c, const hyla_lte_params *p, const lte_dev_cache *dc, const lte_job *hj,
                            const lte_job *dj, int njob, const int32_t *hsj, const int32_t *dsj, int nsj, int ntok,
                            const float *q, const float *k, const float *v, int Hq, float scale, float *o,
                            const lte_scr *s) {
    lte_geo g = lte_geometry(p);
    int h = g.h;
    /* 1. scoring, in groups of consecutive scoring jobs */
    for (int a = 0; a < nsj;) {
        int gb = hj[hsj[a]].xrow, rows = 0, e = a, tmax = 0;
        while (e < nsj) {
            int T = hj[hsj[e]].m1 - hj[hsj[e]].m0 + 2 * h;
            if (e > a && rows + T > LT_SCORE_ROWS) break;
            rows += T;
            if (T > tmax) tmax = T;
            e++;
        }
        k_lte_gather<<<dim3(blocks_for((long long)tmax * g.Hk * g.D), e - a), LT_THREADS, 0, c->stream>>>(
            dj, dsj + a, gb, dc, g, k, v, log((double)p->rope_theta), s->x, s->apos);
        CU_LAUNCH_CHECK("lte_gather");
        HYLA_TRY(lte_cnn(c, p, s->x, rows, 0, s->apos, s->scores + (size_t)gb * g.Hk, s->a, s->b));
        a = e;
    }
    /* 2. the cache decisions and the per-token records */
    k_lte_sim<<<dim3(njob, g.Hk), LT_THREADS, (size_t)2 * g.b * 4, c->stream>>>(dj, dc, g, k, v, s->scores, s->kb,
                                                                                s->vb, s->refs, s->cnts);
    CU_LAUNCH_CHECK("lte_sim");
    /* 3. attention */
    int G = Hq / g.Hk;
    size_t smem = (size_t)g.R * 4, part = (size_t)LT_ATT_WARPS * LT_GC * g.D * 4;
    if (part > smem) smem = part;
    lte_attn_kernel(g.D)<<<dim3(ntok, g.Hk, (G + LT_GC - 1) / LT_GC), LT_ATT_WARPS * 32, smem, c->stream>>>(
        dj, njob, dc, g, s->kb, s->vb, s->refs, s->cnts, q, Hq, scale, o);
    CU_LAUNCH_CHECK("lte_attn");
    /* 4. the cache's final rows */
    k_lte_write<<<dim3(njob, g.Hk), LT_THREADS, 0, c->stream>>>(dj, dc, g, s->kb, s->vb, s->scores);
    CU_LAUNCH_CHECK("lte_write");
    return HYLA_OK;
}

extern "C" hyla_status cu_lte_prefill(void *ctx, const hyla_lte_params *p, const float *q, const float *k,
                                      const float *v, int n, int Hq, int pos0, const hyla_lte_cache *cache,
                                      float scale, float *o) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    HYLA_TRY(lte_check_cache("lte_prefill", p));
    if (n < 0 || Hq <= 0 || Hq % p->Hk || pos0 < 0)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "lte_prefill: n=%d Hq=%d Hk=%d pos0=%d", n, Hq, p->Hk, pos0);
    if (n == 0) return HYLA_OK;
    /* one step per piece of LT_PIECE tokens; each piece's scores start at row 0 */
    int np = (n + LT_PIECE - 1) / LT_PIECE, srows = 0, xrows = 0;
    lte_job *hj = (lte_job *)malloc((size_t)np * (sizeof(lte_job) + sizeof(int32_t)));
    if (!hj) return hyla_fail(HYLA_ERR_RESOURCE, "lte_prefill: out of host memory");
    int32_t *hsj = (int32_t *)(hj + np);
    for (int i = 0; i < np; i++) {
        int rows = 0;
        lte_job *J = &hj[i];
        J->z = 0, J->pos0 = pos0 + i * LT_PIECE, J->n = n - i * LT_PIECE < LT_PIECE ? n - i * LT_PIECE : LT_PIECE;
        J->tok0 = i * LT_PIECE, J->loc0 = 0;
        lte_plan_job(p, J, &rows);
        hsj[i] = 0; /* relative to the piece's own job */
        if (rows > srows) srows = rows;
        int gr = lte_group_rows(p, J, 1);
        if (gr > xrows) xrows = gr;
    }
    lte_dev_cache *dc;
    void *dj, *dsj;
    lte_scr s;
    hyla_status st = lte_scratch(c, p, n < LT_PIECE ? n : LT_PIECE, srows, xrows, &s);
    if (st == HYLA_OK)
        st = cu_stage_reserve(c, sizeof(lte_dev_cache) + (size_t)np * (sizeof(lte_job) + sizeof(int32_t)), 3);
    if (st == HYLA_OK) st = lte_stage_caches(c, cache, 1, &dc);
    if (st == HYLA_OK) st = cu_stage(c, hj, (size_t)np * sizeof(lte_job), &dj);
    if (st == HYLA_OK) st = cu_stage(c, hsj, (size_t)np * sizeof(int32_t), &dsj);
    for (int i = 0; st == HYLA_OK && i < np; i++) {
        int scoring = hj[i].m1 > hj[i].m0;
        st = lte_step(c, p, dc, hj + i, (const lte_job *)dj + i, 1, hsj + i, (const int32_t *)dsj + i, scoring,
                      hj[i].n, q, k, v, Hq, scale, o, &s);
    }
    free(hj);
    return st;
}

extern "C" hyla_status cu_lte_decode(void *ctx, const hyla_lte_params *p, const float *q, const float *k,
                                     const float *v, int B, int Hq, const int32_t *pos, const hyla_lte_cache *cache,
                                     float scale, float *o) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    HYLA_TRY(lte_check_cache("lte_decode", p));
    if (B < 0 || Hq <= 0 || Hq % p->Hk) return hyla_fail(HYLA_ERR_INVALID_ARG, "lte_decode: B=%d Hq=%d Hk=%d", B, Hq, p->Hk);
    if (B == 0) return HYLA_OK;
    lte_job *hj = (lte_job *)malloc((size_t)B * (sizeof(lte_job) + sizeof(int32_t)));
    if (!hj) return hyla_fail(HYLA_ERR_RESOURCE, "lte_decode: out of host memory");
    int32_t *hsj = (int32_t *)(hj + B);
    int rows = 0, nsj = 0;
    for (int b = 0; b < B; b++) {
        if (pos[b] < 0) {
            free(hj);
            return hyla_fail(HYLA_ERR_INVALID_ARG, "lte_decode: session %d at position %d", b, (int)pos[b]);
        }
        lte_job *J = &hj[b];
        J->z = b, J->pos0 = pos[b], J->n = 1, J->tok0 = b, J->loc0 = b;
        lte_plan_job(p, J, &rows);
        if (J->m1 > J->m0) hsj[nsj++] = b;
    }
    lte_dev_cache *dc;
    void *dj, *dsj = NULL;
    lte_scr s;
    hyla_status st = lte_scratch(c, p, B, rows, lte_group_rows(p, hj, B), &s);
    if (st == HYLA_OK)
        st = cu_stage_reserve(c, (size_t)B * (sizeof(lte_dev_cache) + sizeof(lte_job) + sizeof(int32_t)), 3);
    if (st == HYLA_OK) st = lte_stage_caches(c, cache, B, &dc);
    if (st == HYLA_OK) st = cu_stage(c, hj, (size_t)B * sizeof(lte_job), &dj);
    if (st == HYLA_OK && nsj) st = cu_stage(c, hsj, (size_t)nsj * sizeof(int32_t), &dsj);
    if (st == HYLA_OK)
        st = lte_step(c, p, dc, hj, (const lte_job *)dj, B, hsj, (const int32_t *)dsj, nsj, B, q, k, v, Hq, scale, o,
                      &s);
    free(hj);
    return st;
}
