/* hyla_cuda_sse.cu — sparse state expansion (MODELS.md 4.3) on the GPU: routing, the
 * partition-grouped prefill and the decode that touches only the selected partitions.
 *
 * Prefill (the paper's varlen method): the routes are brought to the host (one sync per call),
 * which lists for every partition the tokens that selected it (ascending). One gather kernel
 * packs the always-selected sequence (all n tokens: q1, k1, v, ga, betaa) followed by each
 * partition's subsequence (w-scaled q2, k2, and v, gb, betab of those tokens); the chunked
 * kernels run all 1 + N sequences in one launch pair; a combine kernel adds, for each token,
 * the always-selected output and its K partition outputs in route order (deterministic).
 * Unselected partitions are neither decayed nor written, so this equals the token loop up to
 * rounding. By default a partition's subsequence is cut into chunks where its tokens cross a
 * 64-token window of the call (as the CPU backend does), so a call equals its 64-token pieces
 * bit for bit; hyla_cuda_set_sse_windows(be, 0) cuts it into plain 64-token chunks instead
 * (about 4x fewer chunks at N=4, K=1 for long calls; equal to the token loop up to rounding). Decode: the recurrent kernel with slots {S0, Sp[idx[b][0..K-1]]}.
 * Threading: launched on the context's stream. */
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

extern "C" hyla_status cu_sse_prefill(void *ctx, hyla_sse_transition tr, const float *q1, const float *k1,
                                      const float *q2, const float *k2, const float *v, const float *ga,
                                      const float *gb, const float *betaa, const float *betab, const int32_t *idx,
                                      const float *w, int n, int H, int dk, int dv, int N, int K, float scale,
                                      float *S0, float *Sp, float *o) {
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)ctx;
    if (n <= 0) return HYLA_OK;
    if (K < 1 || K > N) return hyla_fail(HYLA_ERR_INVALID_ARG, "sse_prefill: top-%d of %d partitions", K, N);
    const int gdn = tr == HYLA_SSE_GDN;
    if (c->prefill_mode == 1) {
        void *d_p;
        float *ptrs[2] = {S0, Sp};
        HYLA_TRY(cu_stage(c, ptrs, sizeof ptrs, &d_p));
        hyla_cu_linrec r;
        memset(&r, 0, sizeof r);
        r.gdn = gdn;
        r.H = H;
        r.dk = dk;
        r.dv = dv;
        r.ntok = n;
        r.N = N;
        r.K = K;
        r.scale = scale;
        r.q1 = q1;
        r.k1 = k1;
        r.ga = ga;
        r.betaa = betaa;
        r.q2 = q2;
        r.k2 = k2;
        r.gb = gb;
        r.betab = betab;
        r.v = v;
        r.o = o;
        r.S0 = (float *const *)d_p;
        r.Sp = (float *const *)d_p + 1;
        r.idx = idx;
        r.w = w;
        r.states16 = ((uintptr_t)S0 & 15) == 0 && ((uintptr_t)Sp & 15) == 0;
        return cu_lin_recurrent(c, &r, 1);
    }
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
    /* packed buffers */
    size_t hk = (size_t)H * dk, hv = (size_t)H * dv, gsz = gdn ? (size_t)H : hk;
    size_t bytes = rows * (2 * hk + 2 * hv + gsz + (gdn ? (size_t)H : 0)) * 4;
    void *scr;
    st = cu_scratch(c, SCR_SSE, bytes, &scr);
    if (st != HYLA_OK) {
        free(hidx);
        return st;
    }
    GatherArgs ga_;
    memset(&ga_, 0, sizeof ga_);
    ga_.n = n;
    ga_.H = H;
    ga_.dk = dk;
    ga_.dv = dv;
    ga_.K = K;
    ga_.gdn = gdn;
    ga_.q1 = q1;
    ga_.k1 = k1;
    ga_.q2 = q2;
    ga_.k2 = k2;
    ga_.v = v;
    ga_.ga = ga;
    ga_.gb = gb;
    ga_.betaa = betaa;
    ga_.betab = betab;
    ga_.w = w;
    ga_.src = (const int32_t *)d_src;
    float *p = (float *)scr;
    ga_.pq = p;
    p += rows * hk;
    ga_.pk = p;
    p += rows * hk;
    ga_.pv = p;
    p += rows * hv;
    float *po = p;
    p += rows * hv;
    ga_.pga = p;
    p += rows * gsz;
    ga_.pgb = gdn ? p : NULL;
    size_t per = (size_t)H * (2 * dk + dv) + (gdn ? 2 * (size_t)H : hk);
    k_sse_gather<<<grid_of(rows * per), 256, 0, c->stream>>>(ga_, rows);
    e = cudaGetLastError();
    if (e != cudaSuccess) {
        free(hidx);
        return hyla_cuda_fail(e, "k_sse_gather<<<>>>", __FILE__, __LINE__);
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
    /* chunks: the always-selected sequence in 64-token windows of the call; partition q's
     * subsequence cut where its tokens cross a window boundary (as the CPU backend does, so a
     * call equals its 64-token pieces bit for bit) */
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
            if (t / 64 != win) {
                if (run) {
                    cklen[ncl++] = run;
                    nck[1 + q]++;
                }
                run = 0;
                win = t / 64;
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
    if (c->sse_windows) { /* else: each subsequence in plain 64-token chunks (fewer, fuller chunks) */
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
    k_sse_combine<<<grid_of((size_t)n * hv), 256, 0, c->stream>>>(po, (const int32_t *)d_prow, n, K, hv, o);
    CU_LAUNCH_CHECK("sse_combine");
    return HYLA_OK;
}

extern "C" hyla_status cu_sse_decode_dev(hyla_cuda_ctx *c, hyla_sse_transition tr, const float *q1, const float *k1,
                                         const float *q2, const float *k2, const float *v, const float *ga,
                                         const float *gb, const float *betaa, const float *betab, const int32_t *idx,
                                         const float *w, int B, int H, int dk, int dv, int N, int K, float scale,
                                         float *const *d_S0, float *const *d_Sp, int states16, float *o) {
    if (B <= 0) return HYLA_OK;
    hyla_cu_linrec r;
    memset(&r, 0, sizeof r);
    r.gdn = tr == HYLA_SSE_GDN;
    r.H = H;
    r.dk = dk;
    r.dv = dv;
    r.ntok = 1;
    r.N = N;
    r.K = K;
    r.scale = scale;
    r.q1 = q1;
    r.k1 = k1;
    r.ga = ga;
    r.betaa = betaa;
    r.q2 = q2;
    r.k2 = k2;
    r.gb = gb;
    r.betab = betab;
    r.v = v;
    r.o = o;
    r.S0 = d_S0;
    r.Sp = d_Sp;
    r.idx = idx;
    r.w = w;
    r.states16 = states16;
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
