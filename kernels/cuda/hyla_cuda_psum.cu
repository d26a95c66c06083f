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
 * pushes that slice into every other rank's partial. With an acc (the prefill halves' residual
 * x) the rank-order sum is added onto slice s of its own acc instead (acc + sum, one rounding)
 * and that acc slice is pushed into every other rank's acc: no rank writes its partial, which
 * the others only read, and each acc slice s is written by rank s alone. Every float of the result is the same
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
 * so the pushes never overwrite what another rank still has to read.
 *
 * The one-shot sum (hyla_cuda_psum_oneshot; the sums waited for at once, up to oneshot_max
 * floats: decode steps and short pieces) is one or two kernels on the rank's compute stream and no host
 * call between the ranks, so it is logged into the CUDA graphs like any op and a decode step
 * stays one graph. Each rank has two exchange buffers of T slots (slot s: rank s's partial), and
 * the op that makes a rank's partial writes it straight into its own slot of buffer j
 * (hyla_cuda_psum_oneshot_buf: the runtime hands it to the mixer or MLP as its output). Up to
 * push_min floats the sum is pulled: the kernel, once that op has finished, writes the sum's number
 * into a flag of every rank (peer stores, system-scope release), waits until every rank's flag
 * holds the number, then adds the T ranks' buffers j in rank order (reading the peers' over
 * NVLink in place) and that sum onto x: the same bits as the peer sums with an acc. The number
 * is on the device (each rank counts its sums), so a graph replays it. Larger sums are pushed
 * (k_os_push, k_os_local below): each rank stores its partial into its slot of every other
 * rank's buffer j, then adds its own buffer's slots; the same arithmetic. The caller alternates j
 * between consecutive sums, so two buffers suffice: a rank writes buffer j again for sum e + 2
 * (or stores into a peer's buffer j) only after its kernel of sum e + 1 saw every rank's flag of
 * e + 1, which each rank raises after its kernels of sum e, the last readers of buffer j, have
 * finished. A rank's kernels wait
 * for the others' only on the device, so no rank's thread may make a CUDA call that waits for
 * its GPU while logged work of its own is unlaunched (worker/hyla_tp.c, flush_own): every kernel
 * a GPU spins for is launched or will be. A wait longer than ~20 s traps (a lost rank would
 * otherwise hang the group's GPUs). */
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
    float *acc[HYLA_PSUM_SLOTS]; /* where the sum is added (NULL: into buf) */
    size_t n[HYLA_PSUM_SLOTS];
    float *recv;     /* [T - 1][cap] the pulled slices */
    size_t cap;      /* floats per pulled slice */
    /* the one-shot sum: exchange buffers [2][T][oneshot_max] (buffer j, slot s: rank s's
     * partial) and the control words (this rank's device memory; flags are written by every
     * rank) */
    float *xbuf;
    struct os_ctl *ctl;
} psum_rank;

/* One rank's control words of the one-shot sum (device memory). */
struct os_ctl {
    unsigned epoch;                  /* sums done by this rank (kernel B's last block counts) */
    unsigned summed;                 /* blocks of the sum done, for the last block's duty */
    unsigned pushed;                 /* blocks of the push done (k_os_push) */
    unsigned flag[PSUM_MAX_RANKS];   /* flag[s]: the latest sum whose partial rank s has shared */
};

/* What a rank's one-shot kernels need (kernel parameters, by value). */
typedef struct {
    int T, rank;
    struct os_ctl *ctl;                  /* this rank's */
    unsigned *peer_flag[PSUM_MAX_RANKS]; /* &ctl_s->flag[rank] of every rank s (this one too) */
    float *xbuf[PSUM_MAX_RANKS];         /* every rank's exchange buffers [2][T][cap] */
    size_t cap;
    size_t push_min; /* sums of at least this many floats take the push form (host side only) */
} os_args;

/* The push form from 512 KiB a sum (hyla_cuda_psum_set_push_min): on two H200s, 64 and 256 rows
 * of the 1.68B GDN and 1.3B SSE-H models decode 0.5-3 % faster with it and one row 5-7 % slower
 * (BENCHMARKS.md "The one-shot sum in one kernel"). */
#define PSUM_PUSH_MIN_DEFAULT ((size_t)131072)

struct hyla_cuda_psum {
    int T;
    psum_rank r[PSUM_MAX_RANKS];
    size_t oneshot_max; /* floats (0: no one-shot sums) */
    os_args os[PSUM_MAX_RANKS];
};

typedef struct {
    const float *src[PSUM_MAX_RANKS];
    float *dst;
    size_t n;
    int T, acc;
} psum_add_args;

/* dst[i] = src[0][i] + src[1][i] + ... in rank order, then with acc dst[i] + that sum (one more
 * rounding: the residual's add); four floats a thread where every pointer is 16-byte aligned
 * (the caller checks), the same additions either way. */
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
            if (a.acc) {
                const float4 d = ((const float4 *)a.dst)[i];
                v.x = d.x + v.x, v.y = d.y + v.y, v.z = d.z + v.z, v.w = d.w + v.w;
            }
            ((float4 *)a.dst)[i] = v;
        }
    } else {
        for (; i < a.n; i += stride) {
            float v = a.src[0][i];
            for (int t = 1; t < a.T; t++) v += a.src[t][i];
            a.dst[i] = a.acc ? a.dst[i] + v : v;
        }
    }
}

__device__ __forceinline__ void st_release_sys(unsigned *p, unsigned v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned ld_acquire_sys(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

/* Rank u's exchange buffer j, slot s (rank s's partial). */
__host__ __device__ __forceinline__ float *os_slot(const os_args &a, int u, int j, int s) {
    return a.xbuf[u] + ((size_t)j * a.T + s) * a.cap;
}

/* The wait for every rank's flag of sum e (thread 0 of a block). */
__device__ __forceinline__ void os_wait_flags(const os_args &a, unsigned e) {
    long long t0 = clock64();
    for (int s = 0; s < a.T; s++)
        while ((int)(ld_acquire_sys(&a.ctl->flag[s]) - e) < 0) {
            if (clock64() - t0 > (1ll << 35)) {
                printf("hyla: tensor-parallel sum %u: rank %d waited ~20 s for rank %d\n", e, a.rank, s);
                __trap();
            }
        }
    __threadfence_system();
}

/* x [n4] += the ranks' partials (src(s): rank s's) added in rank order, then the sum onto x
 * (x + ((p0 + p1) + ...)); the last block to finish counts sum e. */
template <typename Src>
__device__ __forceinline__ void os_add_count(const os_args &a, float4 *x, size_t n4, unsigned e, Src src) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (size_t)gridDim.x * blockDim.x) {
        float4 v = __ldcg((const float4 *)src(0) + i);
        for (int s = 1; s < a.T; s++) {
            float4 w = __ldcg((const float4 *)src(s) + i);
            v.x += w.x, v.y += w.y, v.z += w.z, v.w += w.w;
        }
        float4 r = x[i];
        x[i] = make_float4(r.x + v.x, r.y + v.y, r.z + v.z, r.w + v.w);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(&a.ctl->summed, 1u) == gridDim.x - 1) {
            a.ctl->summed = 0;
            a.ctl->epoch = e;
        }
    }
}

/* The push form of the one-shot sum, for larger sums: the pulls of k_os_onto cross NVLink as
 * reads, one round trip each, where stores stream. Kernel A copies the rank's partial (its own
 * slot of buffer j) into the same slot of every other rank's buffer j, and its last block, once
 * every block's stores are out (system fence), raises the sum's number in every rank's flag for
 * this rank. Kernel B waits for every rank's flag and adds the T slots of its own buffer j in
 * rank order onto x: k_os_onto's arithmetic on the same values, so the same bits. Two kernels,
 * since a block that waits must not wait for blocks of its own grid that may not have started. */
__global__ void k_os_push(os_args a, int j, size_t n4) {
    pdl_trigger();
    pdl_wait();
    const unsigned e = a.ctl->epoch + 1;
    const float4 *src = (const float4 *)os_slot(a, a.rank, j, a.rank);
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (size_t)gridDim.x * blockDim.x) {
        const float4 v = __ldcg(src + i);
        for (int s = 0; s < a.T; s++)
            if (s != a.rank) ((float4 *)os_slot(a, s, j, a.rank))[i] = v;
    }
    __threadfence_system(); /* each thread's stores reach the peers before the block counts in */
    __syncthreads();
    if (threadIdx.x == 0) {
        if (atomicAdd(&a.ctl->pushed, 1u) == gridDim.x - 1) {
            a.ctl->pushed = 0;
            __threadfence_system();
            for (int s = 0; s < a.T; s++) st_release_sys(a.peer_flag[s], e);
        }
    }
}

__global__ void k_os_local(os_args a, int j, float4 *x, size_t n4) {
    pdl_trigger();
    pdl_wait();
    const unsigned e = a.ctl->epoch + 1;
    if (threadIdx.x == 0) os_wait_flags(a, e);
    __syncthreads();
    os_add_count(a, x, n4, e, [&](int s) { return os_slot(a, a.rank, j, s); });
}

/* The one-shot sum onto x: once the partial's producer has finished (pdl_wait), the sum's number
 * goes into every rank's flag for this rank (the partial, in exchange buffer j, is complete);
 * every block waits until every rank's flag holds the number, then adds the T
 * buffers' floats in rank order and that sum onto x (x + ((p0 + p1) + ...): the rounding of
 * the sum and then of the residual's add, as when the sum lands in the partial and the norm
 * after it adds the partial onto x); the last block to finish counts the sum. */
__global__ void k_os_onto(os_args a, int j, float4 *x, size_t n4) {
    /* the kernels after it may launch now: they wait for this one before they read, and the
     * linear after the norm streams its weights meanwhile, while this kernel waits for the
     * other ranks (TP = 2, 1.68B GDN: B = 1 -3 to -4 %, B = 64 -1 to -2 %, against letting
     * them launch only once the flags are in) */
    pdl_trigger();
    pdl_wait();
    const unsigned e = a.ctl->epoch + 1;
    if (threadIdx.x == 0) {
        /* every block raises it (the same number): a block that spins below has raised it
         * itself, whichever blocks the GPU has started */
        __threadfence_system();
        for (int s = 0; s < a.T; s++) st_release_sys(a.peer_flag[s], e);
        os_wait_flags(a, e);
    }
    __syncthreads();
    os_add_count(a, x, n4, e, [&](int s) { return os_slot(a, s, j, s); });
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

/* Wait until every rank's compute and side streams are idle (a rank's kernels read the other
 * ranks' exchange buffers, so nothing of any rank may change or go before). Leaves the current
 * device as it was. */
static void psum_quiesce(hyla_cuda_psum *p) {
    int prev = 0;
    cudaGetDevice(&prev);
    for (int t = 0; t < p->T; t++) {
        psum_rank *r = &p->r[t];
        if (!r->c) continue;
        cudaSetDevice(r->device);
        if (r->side) cudaStreamSynchronize(r->side);
        cudaStreamSynchronize(r->c->stream);
    }
    cudaSetDevice(prev);
}

extern "C" void hyla_cuda_psum_reset(hyla_cuda_psum *p) {
    if (!p) return;
    /* a failed job may have left the ranks at different one-shot numbers: wait out the queued
     * work (every rank's log was launched at the job's end, so a kernel waiting for a sum some
     * rank never queued traps after its timeout) and count from 0 again */
    psum_quiesce(p);
    struct os_ctl zero;
    memset(&zero, 0, sizeof zero);
    for (int t = 0; t < p->T; t++) /* unified addressing: the copy finds each rank's device */
        if (p->r[t].ctl) cudaMemcpy(p->r[t].ctl, &zero, sizeof zero, cudaMemcpyHostToDevice);
}

extern "C" void hyla_cuda_psum_close(hyla_cuda_psum *p) {
    if (!p) return;
    psum_quiesce(p);
    int prev = 0;
    cudaGetDevice(&prev);
    for (int t = 0; t < p->T; t++) {
        psum_rank *r = &p->r[t];
        if (!r->c) continue;
        cudaSetDevice(r->device);
        for (int k = 0; k < HYLA_PSUM_SLOTS; k++) {
            if (r->ready[k]) cudaEventDestroy(r->ready[k]);
            if (r->done[k]) cudaEventDestroy(r->done[k]);
        }
        if (r->side) cudaStreamDestroy(r->side);
        cudaFree(r->recv);
        cudaFree(r->xbuf);
        cudaFree(r->ctl);
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
    if (p->oneshot_max) {
        CU_TRY(cudaMalloc((void **)&r->xbuf, 2 * (size_t)p->T * p->oneshot_max * sizeof(float)));
        CU_TRY(cudaMalloc((void **)&r->ctl, sizeof *r->ctl));
        CU_TRY(cudaMemset(r->ctl, 0, sizeof *r->ctl));
    }
    return HYLA_OK;
}

extern "C" hyla_status hyla_cuda_psum_open(hyla_backend *const *be, int T, size_t oneshot_max, hyla_cuda_psum **out) {
    *out = NULL;
    if (T < 2 || T > PSUM_MAX_RANKS)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "peer sums: %d ranks (2..%d)", T, PSUM_MAX_RANKS);
    hyla_cuda_psum *p = (hyla_cuda_psum *)calloc(1, sizeof *p);
    if (!p) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    p->T = T;
    p->oneshot_max = (oneshot_max + 3) & ~(size_t)3;
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
    if (st == HYLA_OK)
        for (int t = 0; t < T && st == HYLA_OK; t++) {
            cudaSetDevice(p->r[t].device);
            if (cudaDeviceSynchronize() != cudaSuccess) st = hyla_fail(HYLA_ERR_INTERNAL, "peer sums: setting up cuda:%d", p->r[t].device);
        }
    for (int t = 0; t < T && p->oneshot_max; t++) {
        os_args *a = &p->os[t];
        a->T = T;
        a->rank = t;
        a->ctl = p->r[t].ctl;
        a->cap = p->oneshot_max;
        a->push_min = PSUM_PUSH_MIN_DEFAULT;
        for (int u = 0; u < T; u++) {
            a->peer_flag[u] = p->r[u].ctl ? &p->r[u].ctl->flag[t] : NULL;
            a->xbuf[u] = p->r[u].xbuf;
        }
    }
    cudaSetDevice(prev);
    if (st != HYLA_OK) {
        hyla_cuda_psum_close(p);
        return st;
    }
    *out = p;
    return HYLA_OK;
}

extern "C" hyla_status hyla_cuda_psum_ready(hyla_cuda_psum *p, int rank, unsigned seq, float *buf, float *acc,
                                            size_t n) {
    psum_rank *r = &p->r[rank];
    int k = (int)(seq % HYLA_PSUM_SLOTS);
    HYLA_TRY(cu_graph_flush(r->c)); /* the partial's ops are queued before the event */
    CU_TRY(cudaEventRecord(r->ready[k], r->c->stream));
    r->buf[k] = buf;
    r->acc[k] = acc;
    r->n[k] = n;
    return HYLA_OK;
}

extern "C" hyla_status hyla_cuda_psum_issue(hyla_cuda_psum *p, int rank, unsigned seq) {
    psum_rank *r = &p->r[rank];
    int k = (int)(seq % HYLA_PSUM_SLOTS), T = p->T;
    size_t n = r->n[k], lo, hi;
    for (int t = 0; t < T; t++) {
        if (p->r[t].n[k] != n)
            return hyla_fail(HYLA_ERR_INTERNAL, "peer sum %u: rank %d sums %zu floats, rank %d %zu", seq, rank, n, t,
                             p->r[t].n[k]);
        if (!p->r[t].acc[k] != !r->acc[k])
            return hyla_fail(HYLA_ERR_INTERNAL, "peer sum %u: rank %d adds onto its acc, rank %d not", seq,
                             r->acc[k] ? rank : t, r->acc[k] ? t : rank);
    }
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
    /* with acc: the slice of this rank's own partial is a term, the sum lands in its acc slice,
     * and the pushes below carry that slice into every other rank's acc */
    psum_add_args a;
    memset(&a, 0, sizeof a);
    const int acc = r->acc[k] != NULL;
    a.dst = (acc ? r->acc[k] : r->buf[k]) + lo;
    a.n = len;
    a.T = T;
    a.acc = acc;
    int aligned = ((uintptr_t)a.dst % 16) == 0 && ((uintptr_t)(r->buf[k] + lo) % 16) == 0;
    for (int t = 0, j = 0; t < T; t++) {
        if (t == rank) {
            a.src[t] = r->buf[k] + lo;
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
                CU_TRY(cudaMemcpyPeerAsync((acc ? p->r[t].acc[k] : p->r[t].buf[k]) + lo, p->r[t].device, a.dst,
                                           r->device, len * sizeof(float), r->side));
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

/* The one-shot sum's launch on the compute stream (the graph log replays this). */
extern "C" hyla_status cu_tp_sum(hyla_cuda_ctx *c, const void *os, int j, float *x, size_t n) {
    const os_args *a = (const os_args *)os;
    size_t n4 = n / 4;
    unsigned blocks = cu_blocks(n4 ? n4 : 1, 256);
    if (blocks > 264) blocks = 264;
    if (n >= a->push_min) {
        HYLA_TRY(cu_launch_pdl(c, k_os_push, dim3(blocks), 256, 0, *a, j, n4));
        HYLA_TRY(cu_launch_pdl(c, k_os_local, dim3(blocks), 256, 0, *a, j, (float4 *)x, n4));
        CU_LAUNCH_CHECK("k_os_push, k_os_local");
        return HYLA_OK;
    }
    HYLA_TRY(cu_launch_pdl(c, k_os_onto, dim3(blocks), 256, 0, *a, j, (float4 *)x, n4));
    CU_LAUNCH_CHECK("k_os_onto");
    return HYLA_OK;
}

extern "C" size_t hyla_cuda_psum_oneshot_max(const hyla_cuda_psum *p) { return p ? p->oneshot_max : 0; }

extern "C" void hyla_cuda_psum_set_push_min(hyla_cuda_psum *p, size_t floats) {
    for (int t = 0; p && t < p->T; t++) p->os[t].push_min = floats;
}

extern "C" float *hyla_cuda_psum_oneshot_buf(hyla_cuda_psum *p, int rank, int j) {
    if (!p || !p->oneshot_max || rank < 0 || rank >= p->T || (j != 0 && j != 1)) return NULL;
    return os_slot(p->os[rank], rank, j, rank);
}

extern "C" hyla_status hyla_cuda_psum_oneshot(hyla_cuda_psum *p, int rank, int j, float *x, size_t n) {
    if (!p->oneshot_max || n > p->oneshot_max || n % 4 || (uintptr_t)x % 16 || (j != 0 && j != 1))
        return hyla_fail(HYLA_ERR_INVALID_ARG,
                         "one-shot sum of %zu floats from buffer %d onto %p: at most %zu, a multiple of 4, 16-byte "
                         "aligned, buffer 0 or 1",
                         n, j, (void *)x, p->oneshot_max);
    return cu_graph_tp_sum(p->r[rank].c, &p->os[rank], j, x, n);
}
