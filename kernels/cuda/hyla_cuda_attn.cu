/* hyla_cuda_attn.cu — causal softmax attention with GQA and sliding window over paged bf16
 * KV (MODELS.md 5, [ATTN-2]).
 *
 * KV layout (hyla_ops.h): token p of a session lives in page p / page_tokens, row
 * p % page_tokens; a page is [page_tokens][Hk][D] bf16. New k, v are rounded to bf16 and
 * written into their pages first; queries then read only the cache, so prefill and decode see
 * the same bf16 keys and values.
 *
 * Prefill (D = 32, 64, 128, 256): flash-attention style, each warp owns 16 query rows; key tiles of
 * 64 tokens are gathered from their pages into shared memory; S = Q K^T and O += P V run on
 * tensor cores (bf16, fp32 accumulation) with an online softmax in fp32 (max subtraction, exp
 * rescaling). k_attn_flash2 (hyla_cuda_attn_flash.cuh): 4 warps per 64 queries, tiles streamed
 * by cp.async into two buffers (kernels/cuda/dev/NOTES.md: the plain-load and 8-warp forms it was
 * measured against).
 * Calls whose keys reach past the split length (8192 keys; hyla_cuda_set_attn_split) cut them
 * into splits at absolute positions, one block per (query block, head, split), merged per row
 * in split order by k_flash_combine; or, calls of many blocks on k_attn_wg, each block walks
 * all its rows' splits and merges them itself, the same bits (hyla_cuda_set_attn_walk).
 * Decode, and prefill for other head dims: split-K ("flash decoding"): one block per
 * (query, head, key split) runs an online softmax over blocks of 256 keys on CUDA cores and
 * writes (max, sum, acc); a combine kernel merges the splits in split order. All reductions
 * run in a fixed order: results are deterministic.
 * Threading: launched on the context's stream. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_cuda_attn_flash.cuh"
#include "hyla_cuda_impl.h"
#include "hyla_cuda_mma.cuh"
#include "hyla_log.h"

/* ---------------------------------------------------------------- KV write */

/* token t of this call (position pos[t] or pos0 + t) -> its page row, for k and v */
__global__ void k_kv_write(const float *k, const float *v, int n, int Hk, int D, int pos0, const int32_t *pos,
                           void *const *kp, void *const *vp, const int32_t *tab_off, int pt) {
    size_t per = (size_t)Hk * D;
    size_t total = (size_t)n * per;
    for (size_t x = (size_t)blockIdx.x * blockDim.x + threadIdx.x; x < total; x += (size_t)gridDim.x * blockDim.x) {
        size_t t = x / per, e = x % per;
        int p = pos ? pos[t] : pos0 + (int)t;
        int base = tab_off ? tab_off[t] : 0;
        __nv_bfloat16 *kd = (__nv_bfloat16 *)kp[base + p / pt], *vd = (__nv_bfloat16 *)vp[base + p / pt];
        size_t off = (size_t)(p % pt) * per + e;
        kd[off] = __float2bfloat16_rn(k[x]);
        vd[off] = __float2bfloat16_rn(v[x]);
    }
}

/* The prompt's rows (positions pos0 + t) by rows, four values a thread: the page pointers read
 * once a thread and 8-byte stores, where the flat form divides 64-bit indices and stores two bytes
 * an element (1.65 TB/s for a 16k-token piece of the 1.3B SSE-H model's attention on an H200).
 * The same roundings. Needs per % 4 == 0, k and v 16-byte and every page 8-byte aligned. */
#define KVW_T 128
__global__ void __launch_bounds__(KVW_T) k_kv_write4(const float4 *k, const float4 *v, int n, int per4, int pos0,
                                                     void *const *kp, void *const *vp, int pt) {
    const int e = blockIdx.x * KVW_T + threadIdx.x;
    if (e >= per4) return;
    for (int t = blockIdx.y; t < n; t += gridDim.y) {
        const int p = pos0 + t;
        const size_t off = (size_t)(p % pt) * per4 + e, x = (size_t)t * per4 + e;
        const float4 a = k[x], b = v[x];
        __nv_bfloat162 ka[2] = {__floats2bfloat162_rn(a.x, a.y), __floats2bfloat162_rn(a.z, a.w)},
                       va[2] = {__floats2bfloat162_rn(b.x, b.y), __floats2bfloat162_rn(b.z, b.w)};
        reinterpret_cast<uint2 *>(kp[p / pt])[off] = *reinterpret_cast<const uint2 *>(ka);
        reinterpret_cast<uint2 *>(vp[p / pt])[off] = *reinterpret_cast<const uint2 *>(va);
    }
}

/* ---------------------------------------------------------------- split-K rows kernel */

#define AR_T 128
#define AR_KB 256
#define AR_MAXD 512
#define AD_SPLIT 512 /* decode: keys per split (fixed, so batching does not change a session's result) */

struct AttnRows {
    const float *q;    /* [nq][Hq][D] */
    int nq, Hq, Hk, D, window;
    float scale;
    int pos0;          /* prefill: query qi at pos0 + qi (pos == NULL) */
    const int32_t *pos;     /* decode: [nq] */
    const int32_t *tab_off; /* decode: [nq] offset into the page tables; prefill: NULL (0) */
    const int32_t *ptok;    /* decode: [nq] page_tokens; prefill: NULL (use pt) */
    int pt;
    void *const *kp, *const *vp;
    int split_len, nsplit;
    float *part; /* [nq][Hq][nsplit][D + 2] */
};

/* VEC: D % 8 == 0 and 128 % (D/8) == 0: keys and values move in 16-byte pieces; for P V the
 * block splits into G = 128/(D/8) groups of D/8 threads, group q summing keys q, q+G, ...
 * (merged in group order at the end). Otherwise one 2-byte element at a time. */
template <bool VEC, int KL>
__global__ void __launch_bounds__(AR_T) k_attn_rows(AttnRows a) {
    __shared__ __align__(16) float qs[AR_MAXD];
    __shared__ float sc[AR_KB];
    __shared__ float red[AR_T / 32];
    __shared__ __align__(16) float comb[VEC ? 1024 : 1];
    const int s = blockIdx.x, h = blockIdx.y, qi = blockIdx.z, tid = threadIdx.x;
    const int D = a.D, G = a.Hq / a.Hk, hk = h / G;
    const int qpos = a.pos ? a.pos[qi] : a.pos0 + qi;
    const int base = a.tab_off ? a.tab_off[qi] : 0;
    const int pt = a.ptok ? a.ptok[qi] : a.pt;
    int lo = a.window > 0 ? qpos - a.window + 1 : 0;
    if (lo < 0) lo = 0;
    int k0 = lo + s * a.split_len, k1 = k0 + a.split_len - 1;
    if (k1 > qpos) k1 = qpos;
    float *out = a.part + (((size_t)qi * a.Hq + h) * a.nsplit + s) * (D + 2);
    for (int d = tid; d < D; d += AR_T) qs[d] = a.q[((size_t)qi * a.Hq + h) * D + d] * a.scale;
    __syncthreads();
    float m = -INFINITY, l = 0.0f;
    const size_t rowsz = (size_t)a.Hk * D;
    /* VEC: this thread's 8 dims and key group */
    const int D8 = D / 8, NG = VEC ? AR_T / D8 : 1, grp = VEC ? tid / D8 : 0, d0 = VEC ? (tid % D8) * 8 : 0;
    float acc8[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    float acc[AR_MAXD / AR_T];
#pragma unroll
    for (int r = 0; r < AR_MAXD / AR_T; r++) acc[r] = 0.0f;
    for (int kb = k0; kb <= k1; kb += AR_KB) {
        int nk = k1 - kb + 1 < AR_KB ? k1 - kb + 1 : AR_KB;
        if (KL) { /* KL lanes a key, 8 dims each: one coalesced row a key */
            constexpr int L = KL ? KL : 1;
            const int lane = tid % L, kg = tid / L, NKG = AR_T / L;
            const float4 q0 = *(const float4 *)(qs + lane * 8), q1 = *(const float4 *)(qs + lane * 8 + 4);
#pragma unroll 4
            for (int i0 = 0; i0 < nk; i0 += NKG) {
                const int i = i0 + kg, p = kb + i;
                float dot = 0.0f;
                if (i < nk) {
                    const __nv_bfloat16 *kr =
                        (const __nv_bfloat16 *)a.kp[base + p / pt] + (size_t)(p % pt) * rowsz + (size_t)hk * D + lane * 8;
                    uint4 u = *(const uint4 *)kr;
                    const __nv_bfloat162 *b2 = (const __nv_bfloat162 *)&u;
                    float2 f0 = __bfloat1622float2(b2[0]), f1 = __bfloat1622float2(b2[1]);
                    float2 f2 = __bfloat1622float2(b2[2]), f3 = __bfloat1622float2(b2[3]);
                    dot = q0.x * f0.x + q0.y * f0.y + q0.z * f1.x + q0.w * f1.y + q1.x * f2.x + q1.y * f2.y + q1.z * f3.x +
                          q1.w * f3.y;
                }
#pragma unroll
                for (int o = L / 2; o; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
                if (i < nk && lane == 0) sc[i] = dot;
            }
        } else for (int i = tid; i < nk; i += AR_T) {
            int p = kb + i;
            const __nv_bfloat16 *kr = (const __nv_bfloat16 *)a.kp[base + p / pt] + (size_t)(p % pt) * rowsz + (size_t)hk * D;
            float dot = 0.0f;
            if (VEC) {
                for (int c = 0; c < D8; c++) {
                    uint4 u = *(const uint4 *)(kr + c * 8);
                    const __nv_bfloat162 *b2 = (const __nv_bfloat162 *)&u;
                    const float4 q0 = *(const float4 *)(qs + c * 8), q1 = *(const float4 *)(qs + c * 8 + 4);
                    float2 f0 = __bfloat1622float2(b2[0]), f1 = __bfloat1622float2(b2[1]);
                    float2 f2 = __bfloat1622float2(b2[2]), f3 = __bfloat1622float2(b2[3]);
                    dot += q0.x * f0.x + q0.y * f0.y + q0.z * f1.x + q0.w * f1.y + q1.x * f2.x + q1.y * f2.y +
                           q1.z * f3.x + q1.w * f3.y;
                }
            } else {
                for (int d = 0; d < D; d++) dot += qs[d] * __bfloat162float(kr[d]);
            }
            sc[i] = dot;
        }
        __syncthreads();
        float mb = -INFINITY;
        for (int i = tid; i < nk; i += AR_T) mb = fmaxf(mb, sc[i]);
        for (int o = 16; o; o >>= 1) mb = fmaxf(mb, __shfl_xor_sync(0xffffffffu, mb, o));
        if ((tid & 31) == 0) red[tid >> 5] = mb;
        __syncthreads();
        mb = red[0];
        for (int i = 1; i < AR_T / 32; i++) mb = fmaxf(mb, red[i]);
        float mn = fmaxf(m, mb);
        float corr = expf(m - mn); /* m = -inf on the first block: 0 */
        __syncthreads();
        for (int i = tid; i < nk; i += AR_T) sc[i] = expf(sc[i] - mn);
        __syncthreads();
        float ls = 0.0f;
        for (int i = 0; i < nk; i++) ls += sc[i]; /* same order in every thread */
        l = l * corr + ls;
        if (VEC) {
#pragma unroll
            for (int e = 0; e < 8; e++) acc8[e] *= corr;
            for (int i = grp; i < nk; i += NG) {
                int p = kb + i;
                const __nv_bfloat16 *vr =
                    (const __nv_bfloat16 *)a.vp[base + p / pt] + (size_t)(p % pt) * rowsz + (size_t)hk * D + d0;
                uint4 u = *(const uint4 *)vr;
                const __nv_bfloat162 *b2 = (const __nv_bfloat162 *)&u;
                float pi = sc[i];
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float2 f = __bfloat1622float2(b2[e]);
                    acc8[2 * e] += pi * f.x;
                    acc8[2 * e + 1] += pi * f.y;
                }
            }
        } else {
#pragma unroll
            for (int r = 0; r < AR_MAXD / AR_T; r++) {
                int d = tid + r * AR_T;
                if (d < D) {
                    float a2 = acc[r] * corr;
                    for (int i = 0; i < nk; i++) {
                        int p = kb + i;
                        const __nv_bfloat16 *vr =
                            (const __nv_bfloat16 *)a.vp[base + p / pt] + (size_t)(p % pt) * rowsz + (size_t)hk * D;
                        a2 += sc[i] * __bfloat162float(vr[d]);
                    }
                    acc[r] = a2;
                }
            }
        }
        m = mn;
        __syncthreads();
    }
    if (VEC) {
#pragma unroll
        for (int e = 0; e < 8; e++) comb[grp * D + d0 + e] = acc8[e];
        __syncthreads();
        for (int d = tid; d < D; d += AR_T) {
            float v = 0.0f;
            for (int q = 0; q < NG; q++) v += comb[q * D + d];
            out[d] = v;
        }
    } else {
#pragma unroll
        for (int r = 0; r < AR_MAXD / AR_T; r++) {
            int d = tid + r * AR_T;
            if (d < D) out[d] = acc[r];
        }
    }
    if (tid == 0) {
        out[D] = m;
        out[D + 1] = l;
    }
}

static bool rows_vec(int D) { return D % 8 == 0 && D <= 1024 && AR_T % (D / 8) == 0 && (AR_T / (D / 8)) * D <= 1024; }

/* The arguments prefill and decode give k_attn_rows alike; pos0 (prefill) or pos, tab_off,
 * ptok (decode) are the caller's to set. */
static AttnRows rows_args(const float *q, int nq, int Hq, int Hk, int D, int window, float scale, int pt,
                          void *const *kp, void *const *vp, int split_len, int nsplit, void *part) {
    AttnRows a;
    memset(&a, 0, sizeof a);
    a.q = q;
    a.nq = nq;
    a.Hq = Hq;
    a.Hk = Hk;
    a.D = D;
    a.window = window;
    a.scale = scale;
    a.pt = pt;
    a.kp = kp;
    a.vp = vp;
    a.split_len = split_len;
    a.nsplit = nsplit;
    a.part = (float *)part;
    return a;
}

__global__ void k_attn_combine(const float *part, int nq, int Hq, int D, int nsplit, float *o) {
    const int h = blockIdx.x, qi = blockIdx.y;
    const float *p = part + ((size_t)qi * Hq + h) * nsplit * (D + 2);
    float M = -INFINITY;
    for (int s = 0; s < nsplit; s++) M = fmaxf(M, p[(size_t)s * (D + 2) + D]);
    float L = 0.0f;
    for (int s = 0; s < nsplit; s++) {
        float ms = p[(size_t)s * (D + 2) + D];
        if (ms > -INFINITY) L += expf(ms - M) * p[(size_t)s * (D + 2) + D + 1];
    }
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float acc = 0.0f;
        for (int s = 0; s < nsplit; s++) {
            float ms = p[(size_t)s * (D + 2) + D];
            if (ms > -INFINITY) acc += expf(ms - M) * p[(size_t)s * (D + 2) + d];
        }
        o[((size_t)qi * Hq + h) * D + d] = acc / L;
    }
}

/* k_attn_rows over a's queries and splits, then k_attn_combine of their partials into o
 * [nq][Hq][D]. */
static hyla_status rows_launch(hyla_cuda_ctx *c, const AttnRows &a, float *o) {
    const dim3 grid(a.nsplit, a.Hq, a.nq);
    /* heads of 128 and 64: a key's row read by 16 (8) lanes together */
    if (rows_vec(a.D) && a.D == 128)
        k_attn_rows<true, 16><<<grid, AR_T, 0, c->stream>>>(a);
    else if (rows_vec(a.D) && a.D == 64)
        k_attn_rows<true, 8><<<grid, AR_T, 0, c->stream>>>(a);
    else if (rows_vec(a.D))
        k_attn_rows<true, 0><<<grid, AR_T, 0, c->stream>>>(a);
    else
        k_attn_rows<false, 0><<<grid, AR_T, 0, c->stream>>>(a);
    CU_LAUNCH_CHECK("attn rows");
    k_attn_combine<<<dim3(a.Hq, a.nq), 128, 0, c->stream>>>(a.part, a.nq, a.Hq, a.D, a.nsplit, o);
    CU_LAUNCH_CHECK("attn combine");
    return HYLA_OK;
}

/* ---------------------------------------------------------------- flash prefill (tensor cores) */

/* The flash kernel k_attn_flash2 and its tile step are in hyla_cuda_attn_flash.cuh (the kernel
 * lab runs the same code in its other forms). */

/* Row qi (position pos0 + qi) of a split flash prefill: its splits s_lo..s_hi (those holding
 * keys of its window) merged in split order by fa_fold_ml (k_attn_wg's walk merges them so too),
 * o = O / L. */
__global__ void k_flash_combine(const float *part, int Hq, int D, int nsplit, int split_len, int pos0, int window,
                                float *o) {
    const int h = blockIdx.x, qi = blockIdx.y, p = pos0 + qi;
    const int s_hi = p / split_len, lo = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0, s_lo = lo / split_len;
    const float *pp = part + ((size_t)qi * Hq + h) * nsplit * (D + 2);
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float M = -INFINITY, L = 0.0f, acc = 0.0f;
        for (int s = s_lo; s <= s_hi; s++) {
            const float *ps = pp + (size_t)s * (D + 2);
            float a = 0.0f, b = 0.0f;
            const int k = fa_fold_ml(M, L, ps[D], ps[D + 1], a, b);
            acc = fa_fold_x(k, acc, ps[d], a, b);
        }
        o[((size_t)qi * Hq + h) * D + d] = fa_fold_out(acc, L);
    }
}

/* ---------------------------------------------------------------- host side */

static unsigned grid_of(size_t n) {
    size_t b = (n + 255) / 256;
    if (b > 65535u * 8) b = 65535u * 8;
    return (unsigned)(b ? b : 1);
}

static hyla_status check_view(const hyla_kv_view *kv, int lo, int hi, const char *what, int b) {
    if (kv->page_tokens <= 0) return hyla_fail(HYLA_ERR_INVALID_ARG, "%s: session %d: page_tokens %d", what, b, kv->page_tokens);
    if (hi / kv->page_tokens >= kv->n_pages)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "%s: session %d: position %d needs page %d of %d", what, b, hi,
                         hi / kv->page_tokens, kv->n_pages);
    for (int p = lo / kv->page_tokens; p <= hi / kv->page_tokens; p++)
        if (!kv->k_pages[p] || !kv->v_pages[p])
            return hyla_fail(HYLA_ERR_INVALID_ARG, "%s: session %d: page %d (positions %d..%d) is not allocated",
                             what, b, p, p * kv->page_tokens, (p + 1) * kv->page_tokens - 1);
    return HYLA_OK;
}

/* Flash prefill for the head dims it is built for: k_attn_wg (Hopper's warpgroup products, D = 64,
 * 128 and, without a window, 256, unless HYLA_CUDA_ATTN_WG=0) or k_attn_flash2 (4 warps per 64
 * queries, K/V tiles by cp.async into two buffers). Each is piece-invariant; they agree within rounding, not bit for bit
 * (test_gpu_ops "attn pieces"), so the kernel is part of what a prefill's bits depend on, as the
 * GPU kind is. */
/* k_attn_wg's pages of 2^lg rows (the kernel shifts instead of dividing); -1: pt is no power of two */
static int page_shift(int pt) {
    int lg = -1;
    if (pt > 0 && !(pt & (pt - 1)))
        for (lg = 0; (1 << lg) < pt; lg++) {
        }
    return lg;
}

template <int D>
static hyla_status flash_launch(hyla_cuda_ctx *c, unsigned ng, int Hq, int nsplit, const float *q, int n, int Hk,
                                int pos0, int window, float scale, void *const *kp, void *const *vp, int pt, float *o,
                                int split_len, float *part) {
    const dim3 grid(cu_blocks(ng, 64), Hq, nsplit);
    if constexpr (D == 256) {
        /* two warpgroups sharing each K/V tile (the form needs rows of whole 128-byte swizzle
         * groups a pass: 256 threads at D = 256), for every call without a window whatever its
         * size, so a row's bits do not depend on the piece; with a window the halves' key ranges
         * differ, and k_attn_flash2 below takes it */
        if (c->attn_wg && window <= 0) {
            const int lg = page_shift(pt);
            /* K, V buffers, two Q tiles and the walk's (M, L) a row: 194 KB */
            const size_t sm = (size_t)6 * FA_BK * D * 2 + 2 * FA_BQ * 8 + 1024;
            return cu_launch_dyn(c, k_attn_wg<D, 2>, dim3(cu_blocks(ng, 128), Hq, nsplit), 256, sm, q, n, Hq, Hk,
                                 pos0, window, scale, kp, vp, pt, lg, o, split_len, nsplit, part);
        }
    }
    if constexpr (D >= 64 && D <= 128) { /* k_attn_wg's head dims */
        if (c->attn_wg) {
            const int lg = page_shift(pt);
            if constexpr (D == 128) {
                /* two warpgroups sharing each K/V tile, for calls of 2048 queries and more without
                 * a window whose queries see c->attn_wg2 keys on average (the same bits). Measured on an
                 * H100 (BENCHMARKS.md "Attention: two warpgroups a block"): 355 against 340
                 * TFLOP/s for 32k queries from position 0, but 7 % slower for 4096 from 0, equal
                 * for a 1024-query piece at a 32k context, where one warpgroup stays. */
                if (window <= 0 && c->attn_wg2 > 0 && ng >= 2048 && (long long)pos0 + ng / 2 >= c->attn_wg2) {
                    /* K, V buffers, two Q tiles and the walk's (M, L) a row */
                    const size_t sm = (size_t)6 * FA_BK * D * 2 + 2 * FA_BQ * 8 + 1024;
                    return cu_launch_dyn(c, k_attn_wg<D, 2>, dim3(cu_blocks(ng, 128), Hq, nsplit), 256, sm, q, n, Hq,
                                         Hk, pos0, window, scale, kp, vp, pt, lg, o, split_len, nsplit, part);
                }
            }
            /* 2 buffers of K and V, swizzled (D = 64: and the Q tile); the walk's (M, L) a row; the
             * alignment */
            const size_t sm = (size_t)(D == 64 ? 5 : 4) * FA_BK * D * 2 + FA_BQ * 8 + 1024;
            return cu_launch_dyn(c, k_attn_wg<D, 1>, grid, 128, sm, q, n, Hq, Hk, pos0, window, scale, kp, vp, pt, lg,
                                 o, split_len, nsplit, part);
        }
    }
    const size_t sm = (size_t)4 * FA_BK * (D + 8) * 2; /* 2 buffers of K and V; Q staged in one */
    return cu_launch_dyn(c, k_attn_flash2<D, 4>, grid, 128, sm, q, n, Hq, Hk, pos0, window, scale, kp, vp, pt, o,
                         split_len, nsplit, part);
}

extern "C" hyla_status cu_attn_prefill(void *ctx, const float *q, const float *k, const float *v, int n, int Hq,
                                       int Hk, int D, int pos0, const hyla_kv_view *kv, int window, float scale,
                                       float *o) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    if (n <= 0) return HYLA_OK;
    if (Hk <= 0 || Hq % Hk || D <= 0 || D > AR_MAXD || pos0 < 0)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "attn_prefill: Hq=%d Hk=%d D=%d pos0=%d", Hq, Hk, D, pos0);
    int lo = window > 0 ? pos0 - window + 1 : 0;
    if (lo < 0) lo = 0;
    HYLA_TRY(check_view(kv, lo, pos0 + n - 1, "attn_prefill", 0));
    /* page tables: k pointers then v pointers */
    int np = kv->n_pages;
    void **tab = (void **)malloc((size_t)2 * np * sizeof(void *));
    if (!tab) return hyla_fail(HYLA_ERR_NOMEM, "attn_prefill: out of host memory");
    memcpy(tab, kv->k_pages, (size_t)np * sizeof(void *));
    memcpy(tab + np, kv->v_pages, (size_t)np * sizeof(void *));
    void *d_tab;
    hyla_status st = cu_stage(c, tab, (size_t)2 * np * sizeof(void *), &d_tab);
    free(tab);
    HYLA_TRY(st);
    void *const *kp = (void *const *)d_tab, *const *vp = (void *const *)d_tab + np;
    const size_t per = (size_t)Hk * D;
    int vec = per % 4 == 0 && per / 4 <= (size_t)INT_MAX && ((uintptr_t)k & 15) == 0 && ((uintptr_t)v & 15) == 0;
    for (int i = 0; vec && i < np; i++) vec = ((uintptr_t)kv->k_pages[i] & 7) == 0 && ((uintptr_t)kv->v_pages[i] & 7) == 0;
    if (vec) {
        const int per4 = (int)(per / 4);
        const dim3 grid((unsigned)((per4 + KVW_T - 1) / KVW_T), (unsigned)(n < 65535 ? n : 65535));
        k_kv_write4<<<grid, KVW_T, 0, c->stream>>>((const float4 *)k, (const float4 *)v, n, per4, pos0, kp, vp,
                                                   kv->page_tokens);
    } else {
        k_kv_write<<<grid_of(per * n), 256, 0, c->stream>>>(k, v, n, Hk, D, pos0, NULL, kp, vp, NULL, kv->page_tokens);
    }
    CU_LAUNCH_CHECK("kv write");
    if (D == 32 || D == 64 || D == 128 || D == 256) {
        const int L = c->attn_split_len;
        /* k_attn_wg's walk (calls without a window whose keys reach past a split, of at least
         * c->attn_walk blocks of 64 queries over the heads): each block runs all its rows'
         * splits, merged as k_flash_combine merges them (the same bits), so no partials are
         * written, read and combined; calls of fewer blocks take the splits' parallelism */
        if (L && (pos0 + n - 1) / L > 0 && c->attn_wg && window <= 0 && D >= 64 && c->attn_walk > 0 &&
            (long long)cu_blocks(n, FA_BQ) * Hq >= c->attn_walk) {
            const int pt = kv->page_tokens;
            if (D == 64) return flash_launch<64>(c, n, Hq, 1, q, n, Hk, pos0, window, scale, kp, vp, pt, o, L, NULL);
            if (D == 128) return flash_launch<128>(c, n, Hq, 1, q, n, Hk, pos0, window, scale, kp, vp, pt, o, L, NULL);
            return flash_launch<256>(c, n, Hq, 1, q, n, Hk, pos0, window, scale, kp, vp, pt, o, L, NULL);
        }
        /* queries in groups (multiples of the query block) so the partials stay under 256 MiB */
        int group = n;
        void *scr = NULL;
        if (L && (pos0 + n - 1) / L > 0) { /* partials only where some group has two splits or more */
            const int nsplit_max = (pos0 + n - 1) / L + 1;
            const size_t per_q = (size_t)Hq * nsplit_max * (D + 2) * 4;
            size_t g = ((size_t)256 << 20) / per_q / FA_BQ * FA_BQ;
            group = g < FA_BQ ? FA_BQ : (g > (size_t)n ? n : (int)g);
            HYLA_TRY(cu_scratch(c, SCR_ATTN, per_q * group, &scr));
        }
        for (int g0 = 0; g0 < n; g0 += group) {
            const int ng = n - g0 < group ? n - g0 : group, gp0 = pos0 + g0;
            const int nsplit = L ? (gp0 + ng - 1) / L + 1 : 1;
            const int Lg = nsplit > 1 ? L : 0; /* keys in one split: the direct pass, the same bits */
            const float *qg = q + (size_t)g0 * Hq * D;
            float *og = o + (size_t)g0 * Hq * D, *part = (float *)scr;
            if (D == 32)
                HYLA_TRY(flash_launch<32>(c, ng, Hq, nsplit, qg, ng, Hk, gp0, window, scale, kp, vp,
                                          kv->page_tokens, og, Lg, part));
            else if (D == 64)
                HYLA_TRY(flash_launch<64>(c, ng, Hq, nsplit, qg, ng, Hk, gp0, window, scale, kp, vp,
                                          kv->page_tokens, og, Lg, part));
            else if (D == 128)
                HYLA_TRY(flash_launch<128>(c, ng, Hq, nsplit, qg, ng, Hk, gp0, window, scale, kp, vp,
                                           kv->page_tokens, og, Lg, part));
            else /* D = 256: attention layers of hidden / heads = 256 */
                HYLA_TRY(flash_launch<256>(c, ng, Hq, nsplit, qg, ng, Hk, gp0, window, scale, kp, vp,
                                           kv->page_tokens, og, Lg, part));
            if (Lg) {
                k_flash_combine<<<dim3(Hq, ng), D, 0, c->stream>>>(part, Hq, D, nsplit, L, gp0, window, og);
                CU_LAUNCH_CHECK("attn flash combine");
            }
        }
        return HYLA_OK;
    }
    /* split-K rows, queries in groups so the partials stay bounded */
    int span = window > 0 && window < pos0 + n ? window : pos0 + n;
    int split_len = 1024;
    int nsplit = (span + split_len - 1) / split_len;
    size_t per_q = (size_t)Hq * nsplit * (D + 2) * 4;
    int group = (int)(((size_t)256 << 20) / per_q);
    if (group < 1) group = 1;
    if (group > 65535) group = 65535;
    if (group > n) group = n;
    void *scr;
    HYLA_TRY(cu_scratch(c, SCR_ATTN, per_q * group, &scr));
    for (int q0 = 0; q0 < n; q0 += group) {
        int nq = n - q0 < group ? n - q0 : group;
        AttnRows a = rows_args(q + (size_t)q0 * Hq * D, nq, Hq, Hk, D, window, scale, kv->page_tokens, kp, vp,
                               split_len, nsplit, scr);
        a.pos0 = pos0 + q0;
        HYLA_TRY(rows_launch(c, a, o + (size_t)q0 * Hq * D));
    }
    return HYLA_OK;
}

/* Checks of attn_decode's arguments (host): every needed page exists. *nptr: pages over all
 * sessions; *nsplit: 512-key splits of the longest span. */
extern "C" hyla_status cu_attn_decode_plan(int B, int Hq, int Hk, int D, const int32_t *pos, const hyla_kv_view *kv,
                                           int window, size_t *nptr, int *nsplit) {
    if (Hk <= 0 || Hq % Hk || D <= 0 || D > AR_MAXD)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "attn_decode: Hq=%d Hk=%d D=%d", Hq, Hk, D);
    size_t np = 0;
    int maxspan = 1;
    for (int b = 0; b < B; b++) {
        if (pos[b] < 0) return hyla_fail(HYLA_ERR_INVALID_ARG, "attn_decode: session %d: position %d", b, pos[b]);
        int lo = window > 0 ? pos[b] - window + 1 : 0;
        if (lo < 0) lo = 0;
        HYLA_TRY(check_view(&kv[b], lo, pos[b], "attn_decode", b));
        if (kv[b].page_tokens != kv[0].page_tokens)
            return hyla_fail(HYLA_ERR_UNSUPPORTED, "attn_decode: sessions with different page sizes in one batch");
        np += (size_t)kv[b].n_pages;
        if (pos[b] - lo + 1 > maxspan) maxspan = pos[b] - lo + 1;
    }
    *nptr = np;
    *nsplit = (maxspan + AD_SPLIT - 1) / AD_SPLIT;
    return HYLA_OK;
}

/* The staged block of attn_decode: k tables [cap], v tables [cap] (same offsets), then int32
 * tab_off [B], pos [B], page_tokens [B]. cap >= the pages of all sessions (the rest unused). */
extern "C" size_t cu_attn_decode_block_bytes(int B, size_t cap) {
    return cap * 2 * sizeof(void *) + (size_t)B * 3 * sizeof(int32_t);
}
extern "C" void cu_attn_decode_block(void *blk, int B, size_t cap, const int32_t *pos, const hyla_kv_view *kv) {
    void **kt = (void **)blk, **vt = kt + cap;
    int32_t *toff = (int32_t *)(vt + cap), *hpos = toff + B, *hpt = hpos + B;
    size_t at = 0;
    for (int b = 0; b < B; b++) {
        toff[b] = (int32_t)at;
        hpos[b] = pos[b];
        hpt[b] = kv[b].page_tokens;
        memcpy(kt + at, kv[b].k_pages, (size_t)kv[b].n_pages * sizeof(void *));
        memcpy(vt + at, kv[b].v_pages, (size_t)kv[b].n_pages * sizeof(void *));
        at += (size_t)kv[b].n_pages;
    }
    if (at < cap) { /* unused tail: defined bytes (graphs compare nothing here, but keep it clean) */
        memset(kt + at, 0, (cap - at) * sizeof(void *));
        memset(vt + at, 0, (cap - at) * sizeof(void *));
    }
}

/* attn_decode with its block already on the device (d_blk, laid out as above). */
extern "C" hyla_status cu_attn_decode_dev(hyla_cuda_ctx *c, const float *q, const float *k, const float *v, int B,
                                          int Hq, int Hk, int D, const void *d_blk, size_t cap, int page_tokens,
                                          int nsplit, int window, float scale, float *o) {
    if (B <= 0) return HYLA_OK;
    void *const *kp = (void *const *)d_blk, *const *vp = (void *const *)d_blk + cap;
    const int32_t *d_toff = (const int32_t *)((void *const *)d_blk + 2 * cap);
    const int32_t *d_pos = d_toff + B, *d_pt = d_pos + B;
    k_kv_write<<<grid_of((size_t)B * Hk * D), 256, 0, c->stream>>>(k, v, B, Hk, D, 0, d_pos, kp, vp, d_toff,
                                                                   page_tokens);
    CU_LAUNCH_CHECK("kv write");
    /* Splits of a fixed length: a session's splits (and so its result) do not depend on the
     * other sessions of the batch. Sessions with shorter spans leave their last splits empty. */
    void *scr;
    HYLA_TRY(cu_scratch(c, SCR_ATTN, (size_t)B * Hq * nsplit * (D + 2) * 4, &scr));
    AttnRows a = rows_args(q, B, Hq, Hk, D, window, scale, page_tokens, kp, vp, AD_SPLIT, nsplit, scr);
    a.pos = d_pos;
    a.tab_off = d_toff;
    a.ptok = d_pt;
    return rows_launch(c, a, o);
}

extern "C" hyla_status cu_attn_decode(void *ctx, const float *q, const float *k, const float *v, int B, int Hq,
                                      int Hk, int D, const int32_t *pos, const hyla_kv_view *kv, int window,
                                      float scale, float *o) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    if (B <= 0) return HYLA_OK;
    size_t nptr;
    int nsplit;
    HYLA_TRY(cu_attn_decode_plan(B, Hq, Hk, D, pos, kv, window, &nptr, &nsplit));
    size_t bytes = cu_attn_decode_block_bytes(B, nptr);
    void *blk = malloc(bytes);
    if (!blk) return hyla_fail(HYLA_ERR_NOMEM, "attn_decode: out of host memory");
    cu_attn_decode_block(blk, B, nptr, pos, kv);
    void *d_blk;
    hyla_status st = cu_stage(c, blk, bytes, &d_blk);
    free(blk);
    HYLA_TRY(st);
    return cu_attn_decode_dev(c, q, k, v, B, Hq, Hk, D, d_blk, nptr, kv[0].page_tokens, nsplit, window, scale, o);
}
