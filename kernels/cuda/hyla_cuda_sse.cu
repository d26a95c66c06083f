/* hyla_cuda_sse.cu — sparse state expansion (MODELS.md 4.3) on the GPU: routing, the
 * partition-grouped prefill and the decode that touches only the selected partitions.
 *
 * Prefill (the paper's varlen method): a planner kernel lists for every partition the tokens
 * that selected it (ascending) and builds the chunk tables on the GPU (no host sync; the host
 * planner, one sync per call, remains for the token-loop mode and N > 64). The always-selected
 * sequence (all n tokens: q1, k1, v, ga, betaa) and each partition's subsequence (w-scaled q2,
 * k2, and v, gb, betab of those tokens) are packed rows: the fused GLA/GDN kernels read them
 * through the plan's row map; otherwise (host plan, kernels A and B) one gather kernel copies
 * them. The chunked kernels run all 1 + N sequences in one launch; a combine kernel adds, for each token,
 * the always-selected output and its K partition outputs in route order (deterministic).
 * Unselected partitions are neither decayed nor written, so this equals the token loop up to
 * rounding. By default a partition's subsequence is cut into chunks where its tokens cross a
 * window of the call (sse_prefill's window, 256 tokens by default) and every 64 rows within one
 * (as the CPU backend does), so a call equals its window-aligned pieces bit for bit;
 * hyla_cuda_set_sse_windows(be, 0) cuts it into plain 64-token chunks instead (equal to the
 * token loop up to rounding). Decode: the recurrent kernel with slots {S0, Sp[idx[b][0..K-1]]}.
 * Threading: launched on the context's stream. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_cuda_impl.h"

/* [SSE-1] softmax over N, then the K largest (descending, lower index first on ties) */
__global__ void k_sse_route(const float *logits, int n, int N, int K, int32_t *idx, float *w) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n) return;
    const float *l = logits + (size_t)t * N;
    float m = -INFINITY;
    for (int i = 0; i < N; i++) m = fmaxf(m, l[i]);
    float s = 0.0f;
    for (int i = 0; i < N; i++) s += expf(l[i] - m);
    float inv = 1.0f / s;
    for (int j = 0; j < K; j++) {
        int best = -1;
        float bv = -1.0f;
        for (int i = 0; i < N; i++) {
            bool taken = false;
            for (int q = 0; q < j; q++) taken |= idx[(size_t)t * K + q] == i;
            if (taken) continue;
            float p = expf(l[i] - m) * inv;
            if (p > bv) {
                bv = p;
                best = i;
            }
        }
        idx[(size_t)t * K + j] = best;
        w[(size_t)t * K + j] = bv;
    }
}

extern "C" hyla_status cu_sse_route(void *ctx, const float *logits, int n, int N, int K, int32_t *idx, float *w) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    if (n <= 0) return HYLA_OK;
    if (K < 1 || K > N) return hyla_fail(HYLA_ERR_INVALID_ARG, "sse_route: top-%d of %d partitions", K, N);
    k_sse_route<<<cu_blocks(n, 128), 128, 0, c->stream>>>(logits, n, N, K, idx, w);
    CU_LAUNCH_CHECK("sse_route");
    return HYLA_OK;
}

/* Packed row r: r < n is token r of the always-selected sequence; r >= n is a sparse row
 * with src[r - n] = t * K + j (token t, route slot j). gdn: gates are [row][H]. */
struct GatherArgs {
    int n, H, dk, dv, K, gdn;
    const float *q1, *k1, *q2, *k2, *v, *ga, *gb, *betaa, *betab, *w;
    const int32_t *src;
    float *pq, *pk, *pv, *pga, *pgb;
};

__global__ void k_sse_gather(GatherArgs a, size_t rows) {
    const int H = a.H, dk = a.dk, dv = a.dv;
    size_t per = (size_t)H * (2 * dk + dv) + (a.gdn ? 2 * H : (size_t)H * dk);
    size_t total = rows * per;
    for (size_t x = (size_t)blockIdx.x * blockDim.x + threadIdx.x; x < total; x += (size_t)gridDim.x * blockDim.x) {
        size_t r = x / per, e = x % per;
        size_t t;
        float wt = 1.0f;
        int sparse = r >= (size_t)a.n;
        if (!sparse) {
            t = r;
        } else {
            int sv = a.src[r - a.n];
            t = (size_t)(sv / a.K);
            wt = a.w[sv];
        }
        size_t hk = (size_t)H * dk, hv = (size_t)H * dv;
        if (e < hk) {
            a.pq[r * hk + e] = (sparse ? a.q2 : a.q1)[t * hk + e] * wt;
        } else if (e < 2 * hk) {
            e -= hk;
            a.pk[r * hk + e] = (sparse ? a.k2 : a.k1)[t * hk + e] * wt;
        } else if (e < 2 * hk + hv) {
            e -= 2 * hk;
            a.pv[r * hv + e] = a.v[t * hv + e];
        } else if (a.gdn) {
            e -= 2 * hk + hv;
            if (e < (size_t)H)
                a.pga[r * H + e] = (sparse ? a.gb : a.ga)[t * H + e];
            else
                a.pgb[r * H + e - H] = (sparse ? a.betab : a.betaa)[t * H + e - H];
        } else {
            e -= 2 * hk + hv;
            a.pga[r * hk + e] = (sparse ? a.gb : a.ga)[t * hk + e];
        }
    }
}

/* o[t] = po[t] + sum_j po[prow[t][j]] */
__global__ void k_sse_combine(const float *po, const int32_t *prow, int n, int K, size_t hv, float *o) {
    size_t total = (size_t)n * hv;
    for (size_t x = (size_t)blockIdx.x * blockDim.x + threadIdx.x; x < total; x += (size_t)gridDim.x * blockDim.x) {
        size_t t = x / hv, e = x % hv;
        float acc = po[x];
        for (int j = 0; j < K; j++) {
            int r = prow[t * K + j];
            if (r >= 0) acc += po[(size_t)r * hv + e];
        }
        o[x] = acc;
    }
}

static unsigned grid_of(size_t n) {
    size_t b = (n + 255) / 256;
    if (b > 65535u * 8) b = 65535u * 8;
    return (unsigned)(b ? b : 1);
}

/* k_sse_combine by rows, four floats a thread: token t's routes read once a block, no 64-bit
 * division an element (which bound the flat form at ~1.8 TB/s on an H200), and each float's sum
 * the flat form's (po[t], then each route's row in slot order) */
#define COMBINE_T 128
__global__ void __launch_bounds__(COMBINE_T) k_sse_combine4(const float4 *po, const int32_t *prow, int n, int K,
                                                            int hv4, float4 *o) {
    const int e = blockIdx.x * COMBINE_T + threadIdx.x;
    if (e >= hv4) return;
    for (int t = blockIdx.y; t < n; t += gridDim.y) {
        float4 acc = po[(size_t)t * hv4 + e];
        for (int j = 0; j < K; j++) {
            const int r = prow[(size_t)t * K + j];
            if (r >= 0) {
                const float4 p = po[(size_t)r * hv4 + e];
                acc.x += p.x, acc.y += p.y, acc.z += p.z, acc.w += p.w;
            }
        }
        o[(size_t)t * hv4 + e] = acc;
    }
}

static hyla_status sse_combine(hyla_cuda_ctx *c, const float *po, const int32_t *prow, int n, int K, size_t hv,
                               float *o) {
    if (hv % 4 == 0 && hv / 4 <= (size_t)INT_MAX && ((uintptr_t)po & 15) == 0 && ((uintptr_t)o & 15) == 0) {
        const int hv4 = (int)(hv / 4);
        const dim3 grid((unsigned)((hv4 + COMBINE_T - 1) / COMBINE_T), (unsigned)(n < 65535 ? n : 65535));
        k_sse_combine4<<<grid, COMBINE_T, 0, c->stream>>>((const float4 *)po, prow, n, K, hv4, (float4 *)o);
    } else {
        k_sse_combine<<<grid_of((size_t)n * hv), 256, 0, c->stream>>>(po, prow, n, K, hv, o);
    }
    CU_LAUNCH_CHECK("sse_combine");
    return HYLA_OK;
}

/* ---------------------------------------------------------------- device plan
 *
 * The partition grouping of a prefill call computed on the GPU from the routes, so the call
 * needs no host sync (and can sit in a CUDA graph): one block of PLAN_T threads
 *   1. counts each partition's (token, slot) pairs and their offsets in the packed buffer;
 *   2. gives each pair its place, tokens ascending within a partition (over tiles of pairs: a
 *      warp's ranks by one match, then the warps' counts scanned per partition);
 *   3. marks the packed rows that start a chunk (the always-selected sequence every 64 tokens
 *      of the call; a partition's rows where a new window of the call begins and every 64 rows
 *      within one, or every 64 rows without windows) and scans the marks into chunk ids;
 *   4. writes the chunk tables (first row, length), each sequence's first chunk and count, the
 *      chunk total and the sequences' state pointers.
 * The result equals the host planner's tables (sse_prefill_host), so the chunked kernels
 * compute the same bits. Kernel A is launched on an upper bound of the chunk count; the table
 * entries past the real count are empty chunks (length 0) that no sequence lists, so kernel B
 * never reads them. Routes outside [0, N) are skipped (prow = -1): they cannot come from
 * sse_route. */
#define PLAN_T 1024
#define PLAN_MAXN 64 /* partitions the plan handles (more: the host planner) */
#define PLAN_MAXK 8

struct PlanArgs {
    const int32_t *idx;
    int n, N, K, windows;
    float *S0, *Sp;
    size_t sstride;          /* H*dk*dv */
    int32_t *src, *prow;     /* [nk] */
    int32_t *rowc;           /* [R + 1] chunks started before each packed row */
    int32_t *tok0, *len;     /* [ub] */
    int ub;                  /* table entries: an upper bound of the chunk count (kernel A's grid) */
    int32_t *c0, *nc;        /* [1 + N] */
    int32_t *ncount;         /* [1] */
    float **S;               /* [1 + N] */
};

__device__ __forceinline__ int plan_part_of(const int *off, int N, int q) { /* off[p] <= q < off[p+1] */
    int p = 0;
    while (p + 1 < N && off[p + 1] <= q) p++;
    return p;
}

/* Chunk starts (step 3). A packed row r starts a chunk: the always-selected rows every 64 tokens
 * of the call; a partition's rows every 64 rows from the last "window start" at or before them,
 * where a window start is the partition's first row or, with windows, a row whose token lies in
 * another window of a.windows tokens of the call than the row before (a partition's tokens
 * ascend, and a token selects a partition once, so the rows of one window are contiguous).
 * Without windows only the first row starts one: every 64 rows of the subsequence. Each thread
 * walks PLAN_RPT consecutive rows (a pass covers PLAN_T * PLAN_RPT), carrying the last window
 * start and the chunk count in from the threads before it by two block scans, so no row searches
 * for its window's first row. */
#define PLAN_RPT 16

/* the window of the call that pair s = t K + j's token lies in (wl: log2 of a power-of-two W, else
 * -1): integer division, by shifts where it can (K = 1 is the usual route count) */
__device__ __forceinline__ int plan_window(int s, int K, int W, int wl) {
    const int t = K == 1 ? s : s / K;
    return wl >= 0 ? t >> wl : t / W;
}

/* Inclusive scan over a warp's lanes in order: max, or sum */
template <bool MAX> __device__ __forceinline__ int plan_warp_scan(int x) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x = MAX ? (y > x ? y : x) : x + y;
    }
    return x;
}

/* Exclusive scan over the block's threads in order (max with identity -1, or sum with 0); *total:
 * the whole block's. sh: 32 ints of the caller's, free again once every thread has returned
 * (the next call on another array may follow at once: its barriers order the reads). */
template <bool MAX> __device__ __forceinline__ int plan_block_scan(int v, int *sh, int *total) {
    static_assert(PLAN_T == 1024, "one warp scans the 32 warps' totals");
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, id = MAX ? -1 : 0;
    const int x = plan_warp_scan<MAX>(v);
    if (lane == 31) sh[wid] = x;
    __syncthreads();
    if (wid == 0) sh[lane] = plan_warp_scan<MAX>(sh[lane]);
    __syncthreads();
    const int before = wid ? sh[wid - 1] : id;
    int xe = __shfl_up_sync(0xffffffffu, x, 1);
    if (lane == 0) xe = id;
    *total = sh[31];
    return MAX ? (before > xe ? before : xe) : before + xe;
}

__global__ void __launch_bounds__(PLAN_T) k_sse_plan(PlanArgs a) {
    __shared__ int cnt[PLAN_MAXN], off[PLAN_MAXN + 1], base[PLAN_MAXN];
    __shared__ int wc[PLAN_MAXN][PLAN_T / 32];
    __shared__ int shm[PLAN_T / 32], shs[PLAN_T / 32];
    const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
    const int n = a.n, N = a.N, K = a.K;
    const int nk = n * K;
    const unsigned lt = (1u << lane) - 1u;
    for (int p = tid; p < N; p += PLAN_T) cnt[p] = 0;
    for (int i = tid; i < nk; i += PLAN_T) a.src[i] = 0; /* rows no route fills read token 0 (never used) */
    __syncthreads();
#pragma unroll 4 /* the routes' loads of several tiles in flight */
    for (int i0 = 0; i0 < nk; i0 += PLAN_T) { /* a warp's lanes of one partition add once */
        const int i = i0 + tid, p = i < nk ? a.idx[i] : -1;
        const unsigned same = __match_any_sync(0xffffffffu, p);
        if (p >= 0 && p < N && lane == __ffs(same) - 1) atomicAdd(&cnt[p], __popc(same)); /* integer counts */
    }
    __syncthreads();
    if (tid == 0) {
        int s = 0;
        for (int p = 0; p < N; p++) {
            off[p] = s;
            base[p] = 0;
            s += cnt[p];
        }
        off[N] = s;
    }
    __syncthreads();
    /* 2. places: the (token, slot) pairs in pair order i = t K + j, PLAN_T a tile. A pair's place
     * in its partition is the number of the partition's pairs before it, in pair order, which is
     * token order (a token selects a partition once): a warp ranks its pairs of each partition by
     * one match, warp p scans partition p's warp counts after the earlier tiles'. A partition
     * repeated in a token's routes keeps its last slot; the earlier ones, and routes outside
     * [0, N), get no place (prow -1). */
    for (int i0 = 0; i0 < nk; i0 += PLAN_T) {
        const int i = i0 + tid;
        int p = i < nk ? a.idx[i] : -1;
        if (p >= N) p = -1;
        if (p >= 0 && K > 1) {
            const int t = i / K;
            for (int j2 = i - t * K + 1; j2 < K; j2++)
                if (a.idx[(size_t)t * K + j2] == p) p = -1;
        }
        const unsigned same = __match_any_sync(0xffffffffu, p);
        const int rank = __popc(same & lt);
        for (int q = lane; q < N; q += 32) wc[q][wid] = 0;
        __syncwarp();
        if (p >= 0 && rank == 0) wc[p][wid] = __popc(same);
        __syncthreads();
        for (int q = wid; q < N; q += PLAN_T / 32) { /* warp q: exclusive scan of partition q's warp
                                                        * counts, after the earlier tiles */
            const int v = wc[q][lane], b = base[q], x = plan_warp_scan<false>(v);
            wc[q][lane] = b + x - v;
            __syncwarp();
            if (lane == 31) base[q] = b + x;
        }
        __syncthreads();
        if (i < nk) {
            if (p < 0) {
                a.prow[i] = -1;
            } else {
                const int pos = off[p] + wc[p][wid] + rank;
                a.src[pos] = i;
                a.prow[i] = n + pos;
            }
        }
        __syncthreads();
    }
    /* 3. chunk starts -> ids (rows of skipped routes lie past off[N] and are never read) */
    const int Rv = n + off[N];
    const int wl = a.windows > 0 && !(a.windows & (a.windows - 1)) ? __ffs(a.windows) - 1 : -1;
    int ws_in = -1, NC = 0; /* the last window start and the chunks before this pass */
    for (int b0 = 0; b0 < Rv; b0 += PLAN_T * PLAN_RPT) {
        const int r0 = b0 + tid * PLAN_RPT;
        /* window starts among this thread's rows */
        unsigned wm = 0;
        int lw = -1;
        if (r0 < Rv && r0 + PLAN_RPT > n) {
            const int qa = (r0 > n ? r0 : n) - n;
            int p = plan_part_of(off, N, qa);
            int prev = qa > 0 && a.windows ? plan_window(a.src[qa - 1], K, a.windows, wl) : -1;
#pragma unroll
            for (int i = 0; i < PLAN_RPT; i++) {
                const int r = r0 + i;
                if (r < n || r >= Rv) continue;
                const int q = r - n;
                while (p + 1 < N && off[p + 1] <= q) p++;
                const int win = a.windows ? plan_window(a.src[q], K, a.windows, wl) : 0;
                if (q == off[p] || (a.windows && win != prev)) {
                    wm |= 1u << i;
                    lw = q;
                }
                prev = win;
            }
        }
        int tmax, tsum;
        int last = plan_block_scan<true>(lw, shm, &tmax);
        if (ws_in > last) last = ws_in;
        unsigned fm = 0;
        int cnt_t = 0;
#pragma unroll
        for (int i = 0; i < PLAN_RPT; i++) {
            const int r = r0 + i;
            if (r >= Rv) break;
            int f;
            if (r < n) {
                f = r % 64 == 0;
            } else {
                if (wm >> i & 1u) last = r - n;
                f = (r - n - last) % 64 == 0;
            }
            fm |= (unsigned)f << i;
            cnt_t += f;
        }
        int id = NC + plan_block_scan<false>(cnt_t, shs, &tsum);
#pragma unroll
        for (int i = 0; i < PLAN_RPT; i++) {
            const int r = r0 + i;
            if (r >= Rv) break;
            a.rowc[r] = id;
            if (fm >> i & 1u) a.tok0[id++] = r;
        }
        if (tmax > ws_in) ws_in = tmax;
        NC += tsum;
    }
    __syncthreads(); /* step 4 reads other threads' rowc and tok0 */
    /* 4. lengths (a chunk runs to the next one's first row or its sequence's end: walked by
     * chunk, a few hundred, not by row) and sequence tables */
    for (int id = tid; id < NC; id += PLAN_T) {
        const int r = a.tok0[id];
        const int send = r < n ? n : n + off[plan_part_of(off, N, r - n) + 1];
        const int next = id + 1 < NC ? a.tok0[id + 1] : Rv;
        a.len[id] = (next < send ? next : send) - r;
    }
    for (int x = NC + tid; x < a.ub; x += PLAN_T) { /* padding: empty chunks that no sequence lists */
        a.tok0[x] = 0;
        a.len[x] = 0;
    }
    if (tid == 0) {
        a.ncount[0] = NC;
        a.c0[0] = 0;
        a.nc[0] = n < Rv ? a.rowc[n] : NC; /* chunks started before the first sparse row */
        a.S[0] = a.S0;
    }
    for (int p = tid; p < N; p += PLAN_T) {
        int r0 = n + off[p], r1 = n + off[p + 1];
        int c0 = r0 < Rv ? a.rowc[r0] : NC, c1 = r1 < Rv ? a.rowc[r1] : NC;
        a.c0[1 + p] = c0;
        a.nc[1 + p] = c1 - c0;
        a.S[1 + p] = a.Sp + (size_t)p * a.sstride;
    }
}

/* The packed copies of the rows (k_sse_gather) for the kernels that cannot read through the row
 * map: q, k, v, o, gates (and GDN's beta) packed over `rows` rows in SCR_SSE; *po receives the
 * packed output the chunked pass writes, *g the gather's arguments (its packed inputs). */
static hyla_status sse_gather(hyla_cuda_ctx *c, int gdn, const float *q1, const float *k1, const float *q2,
                              const float *k2, const float *v, const float *ga, const float *gb, const float *betaa,
                              const float *betab, const float *w, const int32_t *src, int n, int H, int dk, int dv,
                              int K, size_t rows, GatherArgs *g, float **po) {
    size_t hk = (size_t)H * dk, hv = (size_t)H * dv, gsz = gdn ? (size_t)H : hk;
    size_t bytes = rows * (2 * hk + 2 * hv + gsz + (gdn ? (size_t)H : 0)) * 4;
    void *scr;
    HYLA_TRY(cu_scratch(c, SCR_SSE, bytes, &scr));
    memset(g, 0, sizeof *g);
    g->n = n;
    g->H = H;
    g->dk = dk;
    g->dv = dv;
    g->K = K;
    g->gdn = gdn;
    g->q1 = q1;
    g->k1 = k1;
    g->q2 = q2;
    g->k2 = k2;
    g->v = v;
    g->ga = ga;
    g->gb = gb;
    g->betaa = betaa;
    g->betab = betab;
    g->w = w;
    g->src = src;
    float *p = (float *)scr;
    g->pq = p;
    p += rows * hk;
    g->pk = p;
    p += rows * hk;
    g->pv = p;
    p += rows * hv;
    *po = p;
    p += rows * hv;
    g->pga = p;
    p += rows * gsz;
    g->pgb = gdn ? p : NULL;
    size_t per = (size_t)H * (2 * dk + dv) + (gdn ? 2 * (size_t)H : hk);
    k_sse_gather<<<grid_of(rows * per), 256, 0, c->stream>>>(*g, rows);
    CU_LAUNCH_CHECK("sse gather");
    return HYLA_OK;
}

/* An upper bound of a call's chunk count: the always-selected sequence's ceil(n / 64), and for the
 * partitions at most nk rows, each (partition, window) holding at most W tokens (a token selects
 * a partition once) in ceil(count / 64) chunks: at most nk / 64 + one a nonempty (partition,
 * window), and at most W / 64 a (partition, window). Without windows: plain 64-row chunks. */
static size_t sse_chunk_bound(int n, size_t nk, int N, int W) {
    const size_t nw = ((size_t)n + 63) / 64;
    if (!W) return nw + (nk + 63) / 64 + N;
    const size_t pw = (size_t)N * (((size_t)n + W - 1) / W), c = ((size_t)W + 63) / 64;
    size_t b = nk;
    if (nk / 64 + pw < b) b = nk / 64 + pw;
    if (pw * c < b) b = pw * c;
    return nw + b;
}

/* Whether the device plan handles this call (else the host planner). */
static int plan_ok(hyla_cuda_ctx *c, int gdn, int H, int dk, int dv, int N, int K) {
    return N <= PLAN_MAXN && K <= PLAN_MAXK && cu_linattn_chunked_ok(c, gdn, H, dk, dv, 1 + N);
}

extern "C" hyla_status cu_sse_prefill_dev(hyla_cuda_ctx *c, hyla_sse_transition tr, const float *q1,
                                          const float *k1, const float *q2, const float *k2, const float *v,
                                          const float *ga, const float *gb, const float *betaa, const float *betab,
                                          const int32_t *idx, const float *w, int n, int H, int dk, int dv, int N,
                                          int K, float scale, int windows, float *S0, float *Sp, float *o) {
    if (n <= 0) return HYLA_OK;
    const int gdn = tr == HYLA_SSE_GDN;
    const size_t nk = (size_t)n * K, rows = (size_t)n + nk;
    const size_t ub = sse_chunk_bound(n, nk, N, windows);
    /* plan scratch: ints src, prow [nk], rowc [rows + 1], tok0, len [ub], c0, nc [1 + N], count; then pointers */
    size_t nint = 2 * nk + rows + 1 + 2 * ub + 2 * (size_t)(1 + N) + 1;
    size_t pbytes = ((nint * 4 + 15) & ~(size_t)15) + (size_t)(1 + N) * sizeof(float *);
    void *pl;
    HYLA_TRY(cu_scratch(c, SCR_PLAN, pbytes, &pl));
    PlanArgs pa;
    memset(&pa, 0, sizeof pa);
    pa.idx = idx;
    pa.n = n;
    pa.N = N;
    pa.K = K;
    pa.windows = windows;
    pa.S0 = S0;
    pa.Sp = Sp;
    pa.sstride = (size_t)H * dk * dv;
    int32_t *ip = (int32_t *)pl;
    pa.src = ip;
    pa.prow = ip + nk;
    pa.rowc = ip + 2 * nk;
    pa.tok0 = pa.rowc + rows + 1;
    pa.len = pa.tok0 + ub;
    pa.ub = (int)ub;
    pa.c0 = pa.len + ub;
    pa.nc = pa.c0 + 1 + N;
    pa.ncount = pa.nc + 1 + N;
    pa.S = (float **)((uint8_t *)pl + ((nint * 4 + 15) & ~(size_t)15));
    k_sse_plan<<<1, PLAN_T, 0, c->stream>>>(pa);
    CU_LAUNCH_CHECK("sse plan");
    size_t hv = (size_t)H * dv;
    if (cu_lin_fused_ok(c, gdn, dk)) {
        /* the fused kernels read the rows through the plan's row map: no packed copies (GLA's
         * kernels A and B reading through it were slower than the gather, kernels/cuda/dev;
         * they keep the gather below where the fused kernels do not apply) */
        void *scr;
        HYLA_TRY(cu_scratch(c, SCR_SSE, rows * hv * 4, &scr));
        float *po = (float *)scr;
        hyla_cu_rowmap rm = {pa.src, n, K, w, q2, k2, gb, betab};
        HYLA_TRY(cu_linattn_chunked_rm(c, gdn, H, dk, dv, scale, q1, k1, v, ga, betaa, po, (int)ub,
                                       1 + N, pa.tok0, pa.len, pa.c0, pa.nc, pa.S, &rm, 0));
        return sse_combine(c, po, pa.prow, n, K, hv, o);
    }
    GatherArgs g;
    float *po;
    HYLA_TRY(sse_gather(c, gdn, q1, k1, q2, k2, v, ga, gb, betaa, betab, w, pa.src, n, H, dk, dv, K, rows, &g, &po));
    HYLA_TRY(cu_linattn_chunked_dev(c, gdn, H, dk, dv, scale, g.pq, g.pk, g.pv, g.pga, g.pgb, po, (int)ub, 1 + N,
                                    pa.tok0, pa.len, pa.c0, pa.nc, pa.S, (long long)rows));
    return sse_combine(c, po, pa.prow, n, K, hv, o);
}

extern "C" int cu_sse_prefill_planned(hyla_cuda_ctx *c, hyla_sse_transition tr, int H, int dk, int dv, int N, int K) {
    return plan_ok(c, tr == HYLA_SSE_GDN, H, dk, dv, N, K);
}

static hyla_status sse_prefill_host(hyla_cuda_ctx *c, hyla_sse_transition tr, const float *q1, const float *k1,
                                    const float *q2, const float *k2, const float *v, const float *ga,
                                    const float *gb, const float *betaa, const float *betab, const int32_t *idx,
                                    const float *w, int n, int H, int dk, int dv, int N, int K, float scale,
                                    int W, float *S0, float *Sp, float *o);

extern "C" hyla_status cu_sse_prefill(void *ctx, hyla_sse_transition tr, const float *q1, const float *k1,
                                      const float *q2, const float *k2, const float *v, const float *ga,
                                      const float *gb, const float *betaa, const float *betab, const int32_t *idx,
                                      const float *w, int n, int H, int dk, int dv, int N, int K, float scale,
                                      int window, float *S0, float *Sp, float *o) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    if (n <= 0) return HYLA_OK;
    if (K < 1 || K > N) return hyla_fail(HYLA_ERR_INVALID_ARG, "sse_prefill: top-%d of %d partitions", K, N);
    if (window < 64 || window % 64)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "sse_prefill: window %d is not a positive multiple of 64", window);
    const int W = c->sse_windows ? window : 0;
    if (plan_ok(c, tr == HYLA_SSE_GDN, H, dk, dv, N, K))
        return cu_sse_prefill_dev(c, tr, q1, k1, q2, k2, v, ga, gb, betaa, betab, idx, w, n, H, dk, dv, N, K, scale, W,
                                  S0, Sp, o);
    return sse_prefill_host(c, tr, q1, k1, q2, k2, v, ga, gb, betaa, betab, idx, w, n, H, dk, dv, N, K, scale, W, S0,
                            Sp, o);
}

/* The host planner: routes to the host (one sync), the same tables built there. Used for the
 * shapes the device plan does not take (N > 64, K > 8). */
static hyla_status sse_prefill_host(hyla_cuda_ctx *c, hyla_sse_transition tr, const float *q1, const float *k1,
                                    const float *q2, const float *k2, const float *v, const float *ga,
                                    const float *gb, const float *betaa, const float *betab, const int32_t *idx,
                                    const float *w, int n, int H, int dk, int dv, int N, int K, float scale,
                                    int W, float *S0, float *Sp, float *o) {
    const int gdn = tr == HYLA_SSE_GDN;
    /* routes to the host: per-partition token lists */
    size_t nk = (size_t)n * K;
    int32_t *hidx = (int32_t *)malloc(nk * 4 * 3 + (size_t)(N + 1) * 2 * 4 + 16);
    if (!hidx) return hyla_fail(HYLA_ERR_NOMEM, "sse_prefill: out of host memory");
    int32_t *src = hidx + nk, *prow = src + nk, *cnt = prow + nk, *off = cnt + (N + 1);
    hyla_status st = HYLA_OK;
    cudaError_t e = cudaMemcpyAsync(hidx, idx, nk * 4, cudaMemcpyDeviceToHost, c->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    if (e != cudaSuccess) {
        free(hidx);
        return hyla_cuda_fail(e, "cudaMemcpyAsync(sse routes)", __FILE__, __LINE__);
    }
    memset(cnt, 0, (size_t)(N + 1) * 4);
    for (size_t i = 0; i < nk; i++) {
        if (hidx[i] < 0 || hidx[i] >= N) {
            int bad = hidx[i];
            free(hidx);
            return hyla_fail(HYLA_ERR_INVALID_ARG, "sse_prefill: route %d of token %zu is outside [0, %d)", bad,
                             i / K, N);
        }
        cnt[hidx[i]]++;
    }
    off[0] = 0;
    for (int p = 0; p < N; p++) off[p + 1] = off[p] + cnt[p];
    memset(cnt, 0, (size_t)(N + 1) * 4);
    for (size_t t = 0; t < (size_t)n; t++)
        for (int j = 0; j < K; j++) {
            int p = hidx[t * K + j];
            int pos = off[p] + cnt[p]++;
            src[pos] = (int32_t)(t * K + j);
            prow[t * K + j] = n + pos;
        }
    size_t rows = (size_t)n + nk;
    void *d_src, *d_prow;
    st = cu_stage(c, src, nk * 4, &d_src);
    if (st != HYLA_OK) {
        free(hidx);
        return st;
    }
    size_t hv = (size_t)H * dv;
    GatherArgs ga_;
    float *po;
    st = sse_gather(c, gdn, q1, k1, q2, k2, v, ga, gb, betaa, betab, w, (const int32_t *)d_src, n, H, dk, dv, K, rows,
                    &ga_, &po);
    if (st != HYLA_OK) {
        free(hidx);
        return st;
    }
    /* sequences: 0 = always-selected (S0), 1 + p = partition p (Sp + p*H*dk*dv) */
    int nseq = 1 + N;
    int32_t *sstart = (int32_t *)malloc((size_t)nseq * 2 * 4);
    float **sptr = (float **)malloc((size_t)nseq * sizeof(float *));
    if (!sstart || !sptr) {
        free(sstart);
        free(sptr);
        free(hidx);
        return hyla_fail(HYLA_ERR_NOMEM, "sse_prefill: out of host memory");
    }
    int32_t *slen = sstart + nseq;
    sstart[0] = 0;
    slen[0] = n;
    sptr[0] = S0;
    for (int q = 0; q < N; q++) {
        sstart[1 + q] = n + off[q];
        slen[1 + q] = off[q + 1] - off[q];
        sptr[1 + q] = Sp + (size_t)q * H * dk * dv;
    }
    /* chunks: the always-selected sequence in 64-token pieces of the call; partition q's
     * subsequence cut where its tokens cross a window boundary and every 64 rows within a window
     * (as the CPU backend does, so a call equals its window-aligned pieces bit for bit) */
    int32_t *nck = (int32_t *)calloc((size_t)nseq, sizeof(int32_t));
    int32_t *cklen = (int32_t *)malloc(((size_t)(n + 63) / 64 + nk + 1) * sizeof(int32_t));
    if (!nck || !cklen) {
        free(nck);
        free(cklen);
        free(sstart);
        free(sptr);
        free(hidx);
        return hyla_fail(HYLA_ERR_NOMEM, "sse_prefill: out of host memory");
    }
    size_t ncl = 0;
    for (int t0 = 0; t0 < n; t0 += 64) {
        cklen[ncl++] = n - t0 < 64 ? n - t0 : 64;
        nck[0]++;
    }
    for (int q = 0; q < N; q++) {
        int run = 0, win = -1;
        for (int r = off[q]; r < off[q + 1]; r++) {
            int t = src[r] / K;
            if ((W ? t / W : 0) != win || run == 64) { /* a new window, or 64 rows of this one */
                if (run) {
                    cklen[ncl++] = run;
                    nck[1 + q]++;
                }
                run = 0;
                win = W ? t / W : 0;
            }
            run++;
        }
        if (run) {
            cklen[ncl++] = run;
            nck[1 + q]++;
        }
    }
    hyla_cu_linattn_batch b;
    memset(&b, 0, sizeof b);
    if (W) { /* else: each subsequence in plain 64-token chunks (fewer, fuller chunks) */
        b.h_nck = nck;
        b.h_cklen = cklen;
    }
    b.gdn = gdn;
    b.H = H;
    b.dk = dk;
    b.dv = dv;
    b.scale = scale;
    b.q = ga_.pq;
    b.k = ga_.pk;
    b.v = ga_.pv;
    b.ga = ga_.pga;
    b.gb = ga_.pgb;
    b.o = po;
    b.nseq = nseq;
    b.h_start = sstart;
    b.h_len = slen;
    b.h_S = sptr;
    st = cu_linattn_prefill_batch(c, &b);
    free(nck);
    free(cklen);
    free(sstart);
    free(sptr);
    /* staged only now: the batch's own staging may wrap the ring */
    if (st == HYLA_OK) st = cu_stage(c, prow, nk * 4, &d_prow);
    free(hidx);
    HYLA_TRY(st);
    return sse_combine(c, po, (const int32_t *)d_prow, n, K, hv, o);
}

extern "C" hyla_status cu_sse_decode_dev(hyla_cuda_ctx *c, hyla_sse_transition tr, const float *q1, const float *k1,
                                         const float *q2, const float *k2, const float *v, const float *ga,
                                         const float *gb, const float *betaa, const float *betab, const int32_t *idx,
                                         const float *w, int B, int H, int dk, int dv, int N, int K, float scale,
                                         float *const *d_S0, float *const *d_Sp, int states16, float *o) {
    if (B <= 0) return HYLA_OK;
    hyla_cu_linrec r;
    cu_linrec_plain(&r, tr == HYLA_SSE_GDN, H, dk, dv, scale, 1, q1, k1, v, ga, betaa, o, d_S0, states16);
    r.N = N;
    r.K = K;
    r.q2 = q2;
    r.k2 = k2;
    r.gb = gb;
    r.betab = betab;
    r.Sp = d_Sp;
    r.idx = idx;
    r.w = w;
    return cu_lin_recurrent(c, &r, B);
}

extern "C" hyla_status cu_sse_decode(void *ctx, hyla_sse_transition tr, const float *q1, const float *k1,
                                     const float *q2, const float *k2, const float *v, const float *ga,
                                     const float *gb, const float *betaa, const float *betab, const int32_t *idx,
                                     const float *w, int B, int H, int dk, int dv, int N, int K, float scale,
                                     float *const *S0, float *const *Sp, float *o) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    if (B <= 0) return HYLA_OK;
    if (K < 1 || K > N) return hyla_fail(HYLA_ERR_INVALID_ARG, "sse_decode: top-%d of %d partitions", K, N);
    void *d0, *dp;
    HYLA_TRY(cu_stage_reserve(c, (size_t)B * 2 * sizeof(float *), 2));
    HYLA_TRY(cu_stage(c, S0, (size_t)B * sizeof(float *), &d0));
    HYLA_TRY(cu_stage(c, Sp, (size_t)B * sizeof(float *), &dp));
    return cu_sse_decode_dev(c, tr, q1, k1, q2, k2, v, ga, gb, betaa, betab, idx, w, B, H, dk, dv, N, K, scale,
                             (float *const *)d0, (float *const *)dp, cu_states16(S0, B) && cu_states16(Sp, B), o);
}
