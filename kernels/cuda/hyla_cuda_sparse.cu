/* hyla_cuda_sparse.cu — the NSA ops (native sparse attention, docs/MODELS.md §5.2, [NSA-1..4])
 * on the GPU. Correctness-first ports of the CPU reference (kernels/cpu/cpu_nsa.c); no tensor
 * cores yet. (The LTE ops are in hyla_cuda_lte.cu.)
 *
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
