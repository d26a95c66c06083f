/* hyla_cuda_nsa.cu — native sparse attention on the GPU (docs/MODELS.md §5.2, [NSA-1..4]; the
 * CPU reference is kernels/cpu/cpu_nsa.c).
 *
 * The paged KV cache is bf16, as attention's. The compressed blocks (the mean of each complete
 * block, summed in the CPU's order, fp32) live in the view's derived cache: a call fills only the
 * blocks its tokens complete (k_nsa_compress, one thread block per (session, block, KV head)),
 * so a decode step reads the compressed rows, its selected blocks and its window of the KV and
 * nothing else (a view without a cache gets all its blocks derived into scratch).
 *
 * k_nsa_group: one thread block of 256 per (token, KV head) — the token's whole query group,
 * one routine for prefill and decode, so prefill == decode and batch == alone bit for bit, and
 * the piece size (which only decides which tokens share a launch) never changes a bit. Each of
 * the three branches is the same three passes over its rows, in tiles of 128 rows staged in
 * shared memory: logits (thread per row, the group's queries at once from a transposed copy of
 * q), softmax statistics (warp per query: max, then the normaliser in double, lane-strided
 * partial sums combined by a fixed xor butterfly), then P·V (thread per (column, 4 queries)).
 * Logits and probabilities of a branch sit in per-task global scratch [G][rows].
 *   - Compressed branch: every product and sum rounded on its own (`__fmul_rn`/`__fadd_rn`) in
 *     the CPU's order (dot products over the head dim in order, P·V over blocks in order), the
 *     exponential in double rounded once. Only the normaliser's summation order differs from the
 *     CPU's sequential double sum, so a probability can differ only where e/sum lies within a
 *     double rounding of a float boundary, and the block scores (summed over the group in the
 *     CPU's order) and hence the selection are the CPU's given the same keys, except at true
 *     near-ties (two scores within an ulp) and where CUDA's double exp and glibc's expf round
 *     differently.
 *   - Selection: `counts` rounds of a block-wide argmax (score descending, then the lower block
 *     index; first, current and previous block forced with score 1), then sorted ascending, so
 *     only the last selected block can be the current, partial one.
 *   - Selected and window branches: fp32 with FMA, expf, the normaliser in double; another
 *     summation order than the CPU's (within the attention tolerance).
 *   - The gates: o = σ(g_slc)·o_slc + σ(g_cmp)·o_cmp (+ σ(g_swa)·o_swa), rounded as the CPU.
 * Prefill launches cover as many tokens as fit the scratch cap (NSA_SCRATCH_CAP).
 * Threading: one thread drives one context (hyla_ops.h); every launch is on c->stream. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_cuda_impl.h"
#include "hyla_cuda_mma.cuh"

#define NSA_PUT_THREADS 128
#define NSA_MAX_COUNTS 256
#define NSA_NT 256 /* threads of k_nsa_group */
#define NSA_TR 128 /* rows per shared-memory tile */
#define NSA_LQ 8   /* queries per thread in the logits pass */
#define NSA_OQ 4   /* queries per accumulator chunk in the P·V pass */
#define NSA_OCH 4  /* chunks per thread: G·D <= NSA_NT·NSA_OQ·NSA_OCH */
#define NSA_SCRATCH_CAP ((size_t)256 << 20)

/* The page tables of the calls' sessions: session z's k pages at ptr[off[z]], v pages at
 * ptr[off[z] + n_pages[z]]; its page size in pt[z]. */
struct nsa_tab {
    void *const *ptr;
    const int32_t *off, *pt;
    const int32_t *pos; /* decode: [B] positions; prefill: NULL (token i at pos0 + i, session 0) */
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

/* The rows of one branch: 0 compressed blocks 0.., 1 the selected blocks' keys (sel sorted
 * ascending: row r is key r % BS of block sel[r / BS]), 2 the window lo.. */
enum { NSA_CMP = 0, NSA_SLC = 1, NSA_SWA = 2 };

/* One task's view of its session: the page tables read once. */
struct nsa_job {
    int z, h, Hk, D, BS, G, Gp, lo;
    const int *sel;       /* shared, sorted */
    void *const *kpages;  /* the session's k pages, then (npages on) its v pages */
    int npages, pt;       /* pages per table, tokens per page */
    void *const *cpages;  /* the session's compressed pages, cpt blocks each */
    int cpt;
    const void **rp;      /* shared [NSA_TR]: the row addresses of the tile being staged */
};

/* The address of row `row` (k: isv 0, v: isv 1) of branch `mode`. */
__device__ __forceinline__ const void *nsa_src(const nsa_job &j, int mode, int row, int isv) {
    if (mode == NSA_CMP)
        return (const float *)j.cpages[row / j.cpt] + (((size_t)(row % j.cpt) * 2 + isv) * j.Hk + j.h) * j.D;
    int kp = mode == NSA_SLC ? j.sel[row / j.BS] * j.BS + row % j.BS : j.lo + row;
    return (const __nv_bfloat16 *)j.kpages[isv * j.npages + kp / j.pt] + ((size_t)(kp % j.pt) * j.Hk + j.h) * j.D;
}

/* Stage rows j0..j0+nr-1 (k: isv 0, v: isv 1) of branch `mode` as fp32 in dst [NSA_TR][D + 1]:
 * the row addresses first (a thread per row, into j.rp), then the elements, every thread's
 * loads independent of each other. Callers put a barrier before (j.rp and dst are free) and
 * after (dst is filled). */
__device__ void nsa_load_tile(const nsa_job &j, int mode, int j0, int nr, int isv, float *dst) {
    int tid = threadIdx.x, D = j.D, ld = D + 1;
    if (tid < nr) j.rp[tid] = nsa_src(j, mode, j0 + tid, isv);
    __syncthreads();
    if (mode == NSA_CMP) {
#pragma unroll 4
        for (int e = tid; e < nr * D; e += NSA_NT) {
            int r = e / D, x = e - r * D;
            dst[(size_t)r * ld + x] = ((const float *)j.rp[r])[x];
        }
    } else {
#pragma unroll 4
        for (int e = tid; e < nr * D; e += NSA_NT) {
            int r = e / D, x = e - r * D;
            dst[(size_t)r * ld + x] = __bfloat162float(((const __nv_bfloat16 *)j.rp[r])[x]);
        }
    }
}

/* Logits L[gi][r] = (q_gi · k_r)·scale of the n rows of a branch. EXACT: the CPU's rounding
 * and order (products and sums rounded on their own, over the head dim in order). */
template <bool EXACT>
__device__ void nsa_logits(const nsa_job &j, int mode, int n, float scale, const float *qsT,
                           float *tile, float *L, int ldl) {
    int tid = threadIdx.x, r = tid % NSA_TR, sub = tid / NSA_TR, ld = j.D + 1;
    for (int j0 = 0; j0 < n; j0 += NSA_TR) {
        int nr = n - j0 < NSA_TR ? n - j0 : NSA_TR;
        __syncthreads(); /* the previous tile's readers are done */
        nsa_load_tile(j, mode, j0, nr, 0, tile);
        __syncthreads();
        if (r >= nr) continue;
        const float *kr = tile + (size_t)r * ld;
        for (int gb = sub * NSA_LQ; gb < j.G; gb += (NSA_NT / NSA_TR) * NSA_LQ) {
            float acc[NSA_LQ];
#pragma unroll
            for (int u = 0; u < NSA_LQ; u++) acc[u] = 0.0f;
            for (int x = 0; x < j.D; x++) {
                float kx = kr[x];
                float4 a = *(const float4 *)(qsT + (size_t)x * j.Gp + gb);
                float4 b = *(const float4 *)(qsT + (size_t)x * j.Gp + gb + 4);
                float qv[NSA_LQ] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
                for (int u = 0; u < NSA_LQ; u++)
                    acc[u] = EXACT ? __fadd_rn(acc[u], __fmul_rn(qv[u], kx)) : fmaf(qv[u], kx, acc[u]);
            }
#pragma unroll
            for (int u = 0; u < NSA_LQ; u++)
                if (gb + u < j.G) L[(size_t)(gb + u) * ldl + j0 + r] = EXACT ? __fmul_rn(acc[u], scale) : acc[u] * scale;
        }
    }
    __syncthreads();
}

/* Softmax statistics of each query's n logits, warp per query: the max, e = exp(l − max) in
 * place, the normaliser in double (lane-strided partial sums, then a fixed xor butterfly: every
 * lane ends with the same bits). EXACT: e in double rounded once, then the probabilities
 * e / sum in place (the compressed branch, whose probabilities score the blocks); otherwise
 * expf and ginv[gi] = 1 / sum. */
template <bool EXACT>
__device__ void nsa_stats(const nsa_job &j, int n, float *L, int ldl, float *ginv) {
    int lane = threadIdx.x & 31;
    for (int gi = threadIdx.x >> 5; gi < j.G; gi += NSA_NT / 32) {
        float *l = L + (size_t)gi * ldl;
        float m = -INFINITY;
        for (int c = lane; c < n; c += 32) m = fmaxf(m, l[c]);
        for (int s = 16; s > 0; s >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, s));
        double sum = 0;
        for (int c = lane; c < n; c += 32) {
            float e = EXACT ? (float)exp((double)__fsub_rn(l[c], m)) : expf(l[c] - m);
            l[c] = e;
            sum += e;
        }
        for (int s = 16; s > 0; s >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, s);
        if (EXACT)
            for (int c = lane; c < n; c += 32) l[c] = (float)((double)l[c] / sum);
        else if (lane == 0)
            ginv[gi] = (float)(1.0 / sum);
    }
    __syncthreads();
}

__device__ __forceinline__ float nsa_sigm(float x) { return (float)(1.0 / (1.0 + exp(-(double)x))); }

/* P·V of a branch's n rows with the weights in L, thread per (column x, chunks of NSA_OQ
 * queries), rows in order; then into o [G][D] (global, the token's group): the compressed
 * branch stores its output, the selected one combines σ(g_slc)·o_slc + σ(g_cmp)·o_cmp, the
 * window adds σ(g_swa)·o_swa. Each thread reads back only what it wrote. */
template <bool EXACT>
__device__ void nsa_out(const nsa_job &j, int mode, int n, const float *L, int ldl,
                        const float *ginv, float *tile, float *pt, const float *g, float *o) {
    int tid = threadIdx.x, D = j.D, ld = D + 1, nos = NSA_NT / D, x = tid % D, osub = tid / D;
    float acc[NSA_OCH * NSA_OQ];
#pragma unroll
    for (int u = 0; u < NSA_OCH * NSA_OQ; u++) acc[u] = 0.0f;
    for (int j0 = 0; j0 < n; j0 += NSA_TR) {
        int nr = n - j0 < NSA_TR ? n - j0 : NSA_TR;
        __syncthreads();
        nsa_load_tile(j, mode, j0, nr, 1, tile);
        for (int e = tid; e < j.G * nr; e += NSA_NT) {
            int gi = e / nr, r = e % nr;
            pt[(size_t)r * j.Gp + gi] = L[(size_t)gi * ldl + j0 + r];
        }
        __syncthreads();
        if (osub >= nos) continue;
        for (int r = 0; r < nr; r++) {
            float vx = tile[(size_t)r * ld + x];
#pragma unroll
            for (int ch = 0; ch < NSA_OCH; ch++) {
                int gb = (osub + ch * nos) * NSA_OQ;
                if (gb >= j.G) break;
                float4 pp = *(const float4 *)(pt + (size_t)r * j.Gp + gb);
                float *a = acc + ch * NSA_OQ;
                if (EXACT) {
                    a[0] = __fadd_rn(a[0], __fmul_rn(pp.x, vx));
                    a[1] = __fadd_rn(a[1], __fmul_rn(pp.y, vx));
                    a[2] = __fadd_rn(a[2], __fmul_rn(pp.z, vx));
                    a[3] = __fadd_rn(a[3], __fmul_rn(pp.w, vx));
                } else {
                    a[0] = fmaf(pp.x, vx, a[0]);
                    a[1] = fmaf(pp.y, vx, a[1]);
                    a[2] = fmaf(pp.z, vx, a[2]);
                    a[3] = fmaf(pp.w, vx, a[3]);
                }
            }
        }
    }
    if (osub < nos) {
#pragma unroll
        for (int ch = 0; ch < NSA_OCH; ch++) {
            int gb = (osub + ch * nos) * NSA_OQ;
            if (gb >= j.G) break;
#pragma unroll
            for (int u = 0; u < NSA_OQ; u++) {
                int gi = gb + u;
                if (gi >= j.G) break;
                float *oi = o + (size_t)gi * D + x;
                float r = acc[ch * NSA_OQ + u];
                if (mode == NSA_CMP) {
                    *oi = r; /* this head's compressed output, until the branches are summed */
                } else {
                    float br = n > 0 ? r * ginv[gi] : 0.0f;
                    const float *gg = g + (size_t)gi * 3;
                    if (mode == NSA_SLC)
                        *oi = __fadd_rn(__fmul_rn(br, nsa_sigm(gg[1])), __fmul_rn(*oi, nsa_sigm(gg[0])));
                    else
                        *oi = __fadd_rn(*oi, __fmul_rn(br, nsa_sigm(gg[2])));
                }
            }
        }
    }
    __syncthreads();
}

/* Tensor-core forms of the selected and window branches (query group <= 16, hd a multiple of
 * 16): bf16 q (rounded once), bf16 K/V rows as cached, bf16 weights e = exp(l − max), fp32
 * accumulation, mma.sync m16n8k16 (hyla_cuda_mma.cuh); the group padded to 16 queries. */

/* Stage rows j0..j0+nr-1 of branch `mode` as bf16 in dst [NSA_TR][D + 8] (16-byte copies), the
 * rows up to the next multiple of 16 zeroed (they enter P·V with weight 0). */
__device__ void nsa_load_tile16(const nsa_job &j, int mode, int j0, int nr, int isv, __nv_bfloat16 *dst) {
    int tid = threadIdx.x, D8 = j.D / 8, ld = j.D + 8, nr16 = (nr + 15) & ~15;
    if (tid < nr) j.rp[tid] = nsa_src(j, mode, j0 + tid, isv);
    __syncthreads();
#pragma unroll 4
    for (int e = tid; e < nr * D8; e += NSA_NT) {
        int r = e / D8, c = e - r * D8;
        *(uint4 *)(dst + (size_t)r * ld + c * 8) = *(const uint4 *)((const __nv_bfloat16 *)j.rp[r] + c * 8);
    }
    for (int e = tid; e < (nr16 - nr) * D8; e += NSA_NT) {
        int r = nr + e / D8, c = e % D8;
        *(uint4 *)(dst + (size_t)r * ld + c * 8) = make_uint4(0, 0, 0, 0);
    }
}

/* Logits L[gi][r] = (q_gi · k_r)·scale: warp w takes rows 16w..16w+15 of each tile (two n8
 * tiles), k16 steps over the head dim. q16: [16][D + 8] bf16. */
__device__ void nsa_logits_tc(const nsa_job &j, int mode, int n, float scale, const __nv_bfloat16 *q16,
                              __nv_bfloat16 *t16, float *L, int ldl) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tt = lane & 3, ld = j.D + 8;
    for (int j0 = 0; j0 < n; j0 += NSA_TR) {
        int nr = n - j0 < NSA_TR ? n - j0 : NSA_TR, n0 = warp * 16;
        __syncthreads();
        nsa_load_tile16(j, mode, j0, nr, 0, t16);
        __syncthreads();
        if (n0 >= nr) continue;
        float c[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
        for (int k0 = 0; k0 < j.D; k0 += 16) {
            uint32_t a[4], b[2];
            ld_frag_a(a, q16 + k0, ld);
            ld_frag_b_nk(b, t16 + (size_t)n0 * ld + k0, ld);
            mma_bf16_16816(c[0], a, b);
            ld_frag_b_nk(b, t16 + (size_t)(n0 + 8) * ld + k0, ld);
            mma_bf16_16816(c[1], a, b);
        }
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    int qi = g + 8 * hf, r = n0 + nt * 8 + 2 * tt + e;
                    if (qi < j.G && r < nr) L[(size_t)qi * ldl + j0 + r] = c[nt][2 * hf + e] * scale;
                }
    }
    __syncthreads();
}

/* P·V with the weights e in L (rounded to bf16), warp w takes the n8 column tiles w, w + 8, ..
 * of the output; rows in order, k16 steps. Then, as nsa_out: o = σ(g_slc)·o_slc·(1/sum) +
 * σ(g_cmp)·o_cmp, or o += σ(g_swa)·o_swa·(1/sum). */
__device__ void nsa_out_tc(const nsa_job &j, int mode, int n, const float *L, int ldl, const float *ginv,
                           __nv_bfloat16 *t16, const float *g, float *o) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gq = lane >> 2, tt = lane & 3, ld = j.D + 8;
    int D8 = j.D / 8;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
    for (int j0 = 0; j0 < n; j0 += NSA_TR) {
        int nr = n - j0 < NSA_TR ? n - j0 : NSA_TR, nr16 = (nr + 15) & ~15;
        __syncthreads();
        nsa_load_tile16(j, mode, j0, nr, 1, t16);
        __syncthreads();
        for (int k0 = 0; k0 < nr16; k0 += 16) {
            float pv[8];
#pragma unroll
            for (int u = 0; u < 8; u++) { /* (query gq or gq + 8, row k0 + 2tt (+1) or k0 + 8 + 2tt (+1)) */
                int qi = gq + 8 * ((u >> 1) & 1), r = k0 + 2 * tt + (u & 1) + 8 * (u >> 2);
                pv[u] = qi < j.G && r < nr ? L[(size_t)qi * ldl + j0 + r] : 0.0f;
            }
            uint32_t a[4] = {pack_bf16x2(pv[0], pv[1]), pack_bf16x2(pv[2], pv[3]), pack_bf16x2(pv[4], pv[5]),
                             pack_bf16x2(pv[6], pv[7])};
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int nt = warp + 8 * i;
                if (nt >= D8) break;
                uint32_t b[2];
                ld_frag_b_kn(b, t16 + (size_t)k0 * ld + nt * 8, ld);
                mma_bf16_16816(acc[i], a, b);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int nt = warp + 8 * i;
        if (nt >= D8) break;
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            int qi = gq + 8 * hf;
            if (qi >= j.G) continue;
            const float *gg = g + (size_t)qi * 3;
#pragma unroll
            for (int e = 0; e < 2; e++) {
                float *oi = o + (size_t)qi * j.D + nt * 8 + 2 * tt + e;
                float br = n > 0 ? acc[i][2 * hf + e] * ginv[qi] : 0.0f;
                if (mode == NSA_SLC)
                    *oi = __fadd_rn(__fmul_rn(br, nsa_sigm(gg[1])), __fmul_rn(*oi, nsa_sigm(gg[0])));
                else
                    *oi = __fadd_rn(*oi, __fmul_rn(br, nsa_sigm(gg[2])));
            }
        }
    }
    __syncthreads();
}

/* [NSA-3] The `want` highest block scores S[0..nb) (score descending, then the lower index) into
 * sel, in selection order; S's taken entries are set to −1. */
__device__ void nsa_select(float *S, int nb, int want, int *sel) {
    __shared__ float wv[NSA_NT / 32];
    __shared__ int wi[NSA_NT / 32];
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    for (int k = 0; k < want; k++) {
        float bv = -1.0f;
        int bi = -1;
        for (int c = tid; c < nb; c += NSA_NT) { /* ascending: a tie keeps the lower index */
            float v = S[c];
            if (v >= 0.0f && v > bv) bv = v, bi = c;
        }
        for (int s = 16; s > 0; s >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, s);
            int oi = __shfl_xor_sync(0xffffffffu, bi, s);
            if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) bv = ov, bi = oi;
        }
        if (lane == 0) wv[warp] = bv, wi[warp] = bi;
        __syncthreads();
        if (tid == 0) {
            for (int w = 1; w < NSA_NT / 32; w++)
                if (wi[w] >= 0 && (bi < 0 || wv[w] > bv || (wv[w] == bv && wi[w] < bi))) bv = wv[w], bi = wi[w];
            sel[k] = bi;
            S[bi] = -1.0f; /* taken */
        }
        __syncthreads();
    }
}

/* [NSA-1..4] one (token, KV head) task: grid (tokens of this launch, Hk), token i0 + blockIdx.x.
 * scratch: per task `per` floats: L [G][ldl] (logits, then weights, of one branch at a time),
 * S [nb] block scores. Dynamic shared: qsT [D][Gp], tile [NSA_TR][D + 1], pt [NSA_TR][Gp],
 * ginv [Gp]. */
__global__ void __launch_bounds__(NSA_NT, 2)
    k_nsa_group(nsa_tab t, const float *q, const float *g, int Hq, int Hk, int D, int BS, int counts, int window,
                float scale, float *scratch, size_t per, int ldl, int i0, float *o) {
    extern __shared__ __align__(16) float sm[];
    __shared__ int sel[NSA_MAX_COUNTS], srt[NSA_MAX_COUNTS];
    int i = i0 + blockIdx.x, h = blockIdx.y, tid = threadIdx.x, z = nsa_sess(t, i), p = nsa_pos(t, i);
    int G = Hq / Hk, Gp = (G + 7) & ~7, nc = (p + 1) / BS, nb = p / BS + 1, cur = p / BS;
    float *qsT = sm, *tile = qsT + (size_t)D * Gp, *pt = tile + (size_t)NSA_TR * (D + 1), *ginv = pt + (size_t)NSA_TR * Gp;
    __nv_bfloat16 *q16 = (__nv_bfloat16 *)(ginv + Gp), *t16 = (__nv_bfloat16 *)tile;
    bool tc = G <= 16 && D % 16 == 0;
    float *L = scratch + ((size_t)blockIdx.x * Hk + h) * per, *S = L + (size_t)G * ldl;
    size_t qo = (size_t)i * Hq + (size_t)h * G;
    const float *gq = g + qo * 3;
    float *oq = o + qo * D;
    for (int e = tid; e < D * Gp; e += NSA_NT) {
        int x = e / Gp, gi = e % Gp;
        qsT[e] = gi < G ? q[(qo + gi) * D + x] : 0.0f;
    }
    if (tc)
        for (int e = tid; e < 16 * D; e += NSA_NT) {
            int gi = e / D, x = e - gi * D;
            q16[gi * (D + 8) + x] = __float2bfloat16_rn(gi < G ? q[(qo + gi) * D + x] : 0.0f);
        }
    __shared__ const void *rp[NSA_TR];
    int off = t.off[z];
    nsa_job j = {z, h, Hk, D, BS, G, Gp, 0, srt, t.ptr + off, (t.off[z + 1] - off) / 2, t.pt[z], t.cptr + t.cpoff[z],
                 t.cpt[z], rp};
    /* [NSA-2] compressed attention, the CPU's arithmetic */
    nsa_logits<true>(j, NSA_CMP, nc, scale, qsT, tile, L, ldl);
    nsa_stats<true>(j, nc, L, ldl, ginv);
    /* [NSA-3] block scores: the group's mean probability (summed in the CPU's order), the
     * first, current and previous blocks forced */
    for (int c = tid; c < nb; c += NSA_NT) {
        float s = 0.0f;
        if (c < nc)
            for (int gi = 0; gi < G; gi++) s = __fadd_rn(s, L[(size_t)gi * ldl + c]);
        s = __fdiv_rn(s, (float)G);
        if (c == 0 || c == cur || c == cur - 1) s = 1.0f;
        S[c] = s;
    }
    nsa_out<true>(j, NSA_CMP, nc, L, ldl, ginv, tile, pt, gq, oq); /* ends with a barrier */
    int want = counts < nb ? counts : nb;
    nsa_select(S, nb, want, sel);
    if (tid < want) { /* ascending block order: only the last can be the current, partial one */
        int me = sel[tid], r = 0;
        for (int k = 0; k < want; k++) r += sel[k] < me;
        srt[r] = me;
    }
    __syncthreads();
    int nk = 0;
    for (int k = 0; k < want; k++) nk += srt[k] == cur ? p - cur * BS + 1 : BS;
    for (int br = NSA_SLC; br <= NSA_SWA; br++) {
        if (br == NSA_SWA && window <= 0) break;
        if (br == NSA_SWA) j.lo = p - window + 1 > 0 ? p - window + 1 : 0;
        int nr = br == NSA_SLC ? nk : p - j.lo + 1;
        if (tc)
            nsa_logits_tc(j, br, nr, scale, q16, t16, L, ldl);
        else
            nsa_logits<false>(j, br, nr, scale, qsT, tile, L, ldl);
        nsa_stats<false>(j, nr, L, ldl, ginv);
        if (tc)
            nsa_out_tc(j, br, nr, L, ldl, ginv, t16, gq, oq);
        else
            nsa_out<false>(j, br, nr, L, ldl, ginv, tile, pt, gq, oq);
    }
}

static hyla_status nsa_run(hyla_cuda_ctx *c, const char *op, const float *q, const float *k, const float *v,
                           const float *g, int n, int Hq, int Hk, int D, int pos0, const int32_t *pos,
                           const hyla_kv_view *kv, int nkv, int block, int counts, int window, float scale, float *o) {
    if (n < 0 || Hq <= 0 || Hk <= 0 || Hq % Hk || D <= 0 || block <= 0 || counts <= 0 || counts > NSA_MAX_COUNTS)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "%s: n=%d Hq=%d Hk=%d D=%d block=%d counts=%d (at most %d)", op, n, Hq, Hk,
                         D, block, counts, NSA_MAX_COUNTS);
    int G = Hq / Hk;
    if (D > NSA_NT || (size_t)((NSA_NT / D) * NSA_OQ) * NSA_OCH < (size_t)G)
        return hyla_fail(HYLA_ERR_INVALID_ARG,
                         "%s: head dim %d with %d query heads per KV head: the CUDA kernel takes a head dim of at "
                         "most %d and at most %d query heads per KV head at this head dim",
                         op, D, G, NSA_NT, D <= NSA_NT ? (NSA_NT / D) * NSA_OQ * NSA_OCH : 0);
    if (n == 0) return HYLA_OK;
    int pmax = 0, nptr = 0, ncp = 0, newmax = 0;
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
    /* per-task scratch: L [G][ldl], the rows of the longest branch, and S [nbmax] */
    int nbmax = pmax / block + 1, ldl = nbmax;
    long kslc = (long)counts * block < pmax + 1 ? (long)counts * block : pmax + 1;
    int kwin = window < pmax + 1 ? window : pmax + 1;
    if (kslc > ldl) ldl = (int)kslc;
    if (kwin > ldl) ldl = kwin;
    size_t per = (size_t)G * ldl + nbmax;
    /* tokens per launch: as many as the scratch cap holds (decode: all B at once) */
    size_t chunk = NSA_SCRATCH_CAP / (per * Hk * sizeof(float));
    if (pos || chunk < 1) chunk = pos ? (size_t)n : 1;
    if (chunk > (size_t)n) chunk = n;
    void *mem;
    HYLA_TRY(cu_scratch(c, SCR_ATTN, (scf + chunk * Hk * per) * sizeof(float), &mem));
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
        for (int pg = 0; pg < kv[z].n_pages; pg++)
            ptr[at + pg] = kv[z].k_pages[pg], ptr[at + kv[z].n_pages + pg] = kv[z].v_pages[pg];
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
    k_nsa_put<<<n, NSA_PUT_THREADS, 0, c->stream>>>(t, k, v, Hk, D);
    CU_LAUNCH_CHECK("nsa_put");
    /* only the blocks completed since the cache was last filled: a decode step reads the KV
     * of its selected blocks and window alone */
    if (newmax > 0) {
        k_nsa_compress<<<dim3(newmax, nkv, Hk), NSA_PUT_THREADS, 0, c->stream>>>(t, Hk, D, block);
        CU_LAUNCH_CHECK("nsa_compress");
    }
    int Gp = (G + 7) & ~7;
    size_t smem = ((size_t)D * Gp + (size_t)NSA_TR * (D + 1) + (size_t)NSA_TR * Gp + Gp) * sizeof(float) +
                  (size_t)16 * (D + 8) * sizeof(__nv_bfloat16);
    /* (with the static arrays, the paper's shape is just under the 48 KiB a launch gets unasked) */
    CU_TRY(cudaFuncSetAttribute(k_nsa_group, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    for (int i0 = 0; i0 < n; i0 += (int)chunk) {
        int cnt = n - i0 < (int)chunk ? n - i0 : (int)chunk;
        k_nsa_group<<<dim3(cnt, Hk), NSA_NT, smem, c->stream>>>(t, q, g, Hq, Hk, D, block, counts, window, scale, scr,
                                                               per, ldl, i0, o);
        CU_LAUNCH_CHECK("nsa_group");
    }
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
