/* hyla_cuda_psum.cu — the sum of a tensor-parallel group's partial outputs over the GPUs of one
 * process through their copy engines (hyla_cuda_extra.h, "Peer sums").
 *
 * Why not NCCL's all-reduce here: a sum that travels while the GPU computes (the split prefill's
 * two halves, worker/hyla_runtime.c) should not take SMs from the compute, and NCCL's all-reduce
 * runs as kernels whose blocks hold SMs while they wait for the peer. Here the bytes move by peer
 * copies (cudaMemcpyPeerAsync over NVLink: copy engines, no SMs) and the only kernel is the
 * addition of one slice, a few tens of microseconds. A sum waited for at once is slower this
 * way than NCCL's (a two-GPU prefill without the halves: 143 k against 149 k tokens/s), so the
 * blocking sums stay NCCL's.
 *
 * A sum of n floats over T ranks: the floats are cut into T slices (rank s owns slice s). Rank s,
 * on its side stream, pulls slice s of every other rank's partial into its receive buffer, adds
 * the T slices in rank order (((p0 + p1) + p2) + ...) into slice s of its own partial, then
 * pushes that slice into every other rank's partial. Every float of the result is the same
 * rank-order sum on every rank, whatever n or the float's position: the bits do not depend on
 * how many rows a sum carries (with T = 2 they are also the bits of NCCL's sum: a + b = b + a).
 *
 * Ordering, all by events: a rank's partial is complete at its `ready` event (its compute
 * stream); rank s's side stream waits for every rank's ready event of the sum before pulling;
 * its `done` event follows its pushes; a rank's compute stream joins by waiting for every rank's
 * done event. The host calls must be ordered across the ranks' threads (an event waited for
 * before it is recorded would be no wait at all): every rank's ready before any rank's issue,
 * every rank's issue before any rank's join (worker/hyla_tp.c sequences them). A slice of rank
 * r's partial is read by one rank's pull and written by that rank's push only after its pull,
 * so the pushes never overwrite what another rank still has to read. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_cuda_extra.h"
#include "hyla_cuda_impl.h"

#define PSUM_MAX_RANKS 8

typedef struct {
    int device;
    hyla_cuda_ctx *c;
    cudaStream_t side;
    cudaEvent_t ready[HYLA_PSUM_SLOTS], done[HYLA_PSUM_SLOTS];
    float *buf[HYLA_PSUM_SLOTS]; /* the partial of the sum in each slot */
    size_t n[HYLA_PSUM_SLOTS];
    float *recv;     /* [T - 1][cap] the pulled slices */
    size_t cap;      /* floats per pulled slice */
} psum_rank;

struct hyla_cuda_psum {
    int T;
    psum_rank r[PSUM_MAX_RANKS];
};

typedef struct {
    const float *src[PSUM_MAX_RANKS];
    float *dst;
    size_t n;
    int T;
} psum_add_args;

/* dst[i] = src[0][i] + src[1][i] + ... in rank order; four floats a thread where every pointer
 * is 16-byte aligned (the caller checks), the same additions either way. */
template <int V4>
__global__ void k_psum_add(psum_add_args a) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (V4) {
        for (; i < a.n / 4; i += stride) {
            float4 v = ((const float4 *)a.src[0])[i];
            for (int t = 1; t < a.T; t++) {
                float4 w = ((const float4 *)a.src[t])[i];
                v.x += w.x, v.y += w.y, v.z += w.z, v.w += w.w;
            }
            ((float4 *)a.dst)[i] = v;
        }
    } else {
        for (; i < a.n; i += stride) {
            float v = a.src[0][i];
            for (int t = 1; t < a.T; t++) v += a.src[t][i];
            a.dst[i] = v;
        }
    }
}

static hyla_cuda_ctx *cuda_ctx(hyla_backend *be) {
    if (!be || !be->ops || !be->ops->name || strcmp(be->ops->name, "cuda")) return NULL;
    return (hyla_cuda_ctx *)be->ctx;
}

/* Slice s of n floats over T ranks: [lo, hi), cut at multiples of 4 floats. */
static void slice_of(size_t n, int T, int s, size_t *lo, size_t *hi) {
    *lo = s ? (n * (size_t)s / (size_t)T) & ~(size_t)3 : 0;
    *hi = s + 1 < T ? (n * (size_t)(s + 1) / (size_t)T) & ~(size_t)3 : n;
}

extern "C" void hyla_cuda_psum_reset(hyla_cuda_psum *p) {
    if (!p) return;
    for (int t = 0; t < p->T; t++)
        if (p->r[t].side) cudaStreamSynchronize(p->r[t].side);
}

extern "C" void hyla_cuda_psum_close(hyla_cuda_psum *p) {
    if (!p) return;
    int prev = 0;
    cudaGetDevice(&prev);
    for (int t = 0; t < p->T; t++) {
        psum_rank *r = &p->r[t];
        if (!r->c) continue;
        cudaSetDevice(r->device);
        if (r->side) cudaStreamSynchronize(r->side);
        for (int k = 0; k < HYLA_PSUM_SLOTS; k++) {
            if (r->ready[k]) cudaEventDestroy(r->ready[k]);
            if (r->done[k]) cudaEventDestroy(r->done[k]);
        }
        if (r->side) cudaStreamDestroy(r->side);
        cudaFree(r->recv);
    }
    cudaSetDevice(prev);
    free(p);
}

static hyla_status psum_open_rank(hyla_cuda_psum *p, int t) {
    psum_rank *r = &p->r[t];
    CU_TRY(cudaSetDevice(r->device));
    for (int u = 0; u < p->T; u++) {
        if (u == t) continue;
        int can = 0;
        CU_TRY(cudaDeviceCanAccessPeer(&can, r->device, p->r[u].device));
        if (!can)
            return hyla_fail(HYLA_ERR_UNSUPPORTED, "cuda:%d cannot access cuda:%d's memory (no peer access)", r->device,
                             p->r[u].device);
        cudaError_t e = cudaDeviceEnablePeerAccess(p->r[u].device, 0);
        if (e == cudaErrorPeerAccessAlreadyEnabled) (void)cudaGetLastError();
        else CU_TRY(e);
    }
    CU_TRY(cudaStreamCreateWithFlags(&r->side, cudaStreamNonBlocking));
    for (int k = 0; k < HYLA_PSUM_SLOTS; k++) {
        CU_TRY(cudaEventCreateWithFlags(&r->ready[k], cudaEventDisableTiming));
        CU_TRY(cudaEventCreateWithFlags(&r->done[k], cudaEventDisableTiming));
    }
    return HYLA_OK;
}

extern "C" hyla_status hyla_cuda_psum_open(hyla_backend *const *be, int T, hyla_cuda_psum **out) {
    *out = NULL;
    if (T < 2 || T > PSUM_MAX_RANKS)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "peer sums: %d ranks (2..%d)", T, PSUM_MAX_RANKS);
    hyla_cuda_psum *p = (hyla_cuda_psum *)calloc(1, sizeof *p);
    if (!p) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    p->T = T;
    for (int t = 0; t < T; t++) {
        p->r[t].c = cuda_ctx(be[t]);
        if (!p->r[t].c) {
            free(p);
            return hyla_fail(HYLA_ERR_INVALID_ARG, "peer sums: rank %d is not a cuda backend", t);
        }
        p->r[t].device = p->r[t].c->device;
    }
    int prev = 0;
    cudaGetDevice(&prev);
    hyla_status st = HYLA_OK;
    for (int t = 0; t < T && st == HYLA_OK; t++) st = psum_open_rank(p, t);
    cudaSetDevice(prev);
    if (st != HYLA_OK) {
        hyla_cuda_psum_close(p);
        return st;
    }
    *out = p;
    return HYLA_OK;
}

extern "C" hyla_status hyla_cuda_psum_ready(hyla_cuda_psum *p, int rank, unsigned seq, float *buf, size_t n) {
    psum_rank *r = &p->r[rank];
    int k = (int)(seq % HYLA_PSUM_SLOTS);
    HYLA_TRY(cu_graph_flush(r->c)); /* the partial's ops are queued before the event */
    CU_TRY(cudaEventRecord(r->ready[k], r->c->stream));
    r->buf[k] = buf;
    r->n[k] = n;
    return HYLA_OK;
}

extern "C" hyla_status hyla_cuda_psum_issue(hyla_cuda_psum *p, int rank, unsigned seq) {
    psum_rank *r = &p->r[rank];
    int k = (int)(seq % HYLA_PSUM_SLOTS), T = p->T;
    size_t n = r->n[k], lo, hi;
    for (int t = 0; t < T; t++)
        if (p->r[t].n[k] != n)
            return hyla_fail(HYLA_ERR_INTERNAL, "peer sum %u: rank %d sums %zu floats, rank %d %zu", seq, rank, n, t,
                             p->r[t].n[k]);
    slice_of(n, T, rank, &lo, &hi);
    size_t len = hi - lo;
    if (len > r->cap) { /* grow the receive buffer: nothing of ours reads it after the side stream */
        CU_TRY(cudaStreamSynchronize(r->side));
        CU_TRY(cudaFree(r->recv));
        r->recv = NULL;
        r->cap = 0;
        size_t cap = (len + 1023) & ~(size_t)1023;
        CU_TRY(cudaMalloc((void **)&r->recv, (size_t)(T - 1) * cap * sizeof(float)));
        r->cap = cap;
    }
    for (int t = 0; t < T; t++) CU_TRY(cudaStreamWaitEvent(r->side, p->r[t].ready[k], 0));
    psum_add_args a;
    memset(&a, 0, sizeof a);
    a.dst = r->buf[k] + lo;
    a.n = len;
    a.T = T;
    int aligned = ((uintptr_t)a.dst % 16) == 0;
    for (int t = 0, j = 0; t < T; t++) {
        if (t == rank) {
            a.src[t] = a.dst;
            continue;
        }
        float *into = r->recv + (size_t)j++ * r->cap;
        if (len)
            CU_TRY(cudaMemcpyPeerAsync(into, r->device, p->r[t].buf[k] + lo, p->r[t].device, len * sizeof(float), r->side));
        a.src[t] = into;
        aligned &= ((uintptr_t)(p->r[t].buf[k] + lo) % 16) == 0;
    }
    if (len) {
        int v4 = aligned && len % 4 == 0;
        size_t work = v4 ? len / 4 : len;
        int threads = 256, blocks = (int)((work + threads - 1) / threads);
        if (blocks > 1024) blocks = 1024;
        if (v4) k_psum_add<1><<<blocks, threads, 0, r->side>>>(a);
        else k_psum_add<0><<<blocks, threads, 0, r->side>>>(a);
        CU_LAUNCH_CHECK("k_psum_add");
        for (int t = 0; t < T; t++)
            if (t != rank)
                CU_TRY(cudaMemcpyPeerAsync(p->r[t].buf[k] + lo, p->r[t].device, a.dst, r->device, len * sizeof(float),
                                           r->side));
    }
    CU_TRY(cudaEventRecord(r->done[k], r->side));
    return HYLA_OK;
}

extern "C" hyla_status hyla_cuda_psum_join(hyla_cuda_psum *p, int rank, unsigned seq) {
    psum_rank *r = &p->r[rank];
    int k = (int)(seq % HYLA_PSUM_SLOTS);
    HYLA_TRY(cu_graph_flush(r->c));
    for (int t = 0; t < p->T; t++) CU_TRY(cudaStreamWaitEvent(r->c->stream, p->r[t].done[k], 0));
    return HYLA_OK;
}
