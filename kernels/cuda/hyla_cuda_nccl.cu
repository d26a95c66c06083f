/* hyla_cuda_nccl.cu — NCCL links between the CUDA backends of processes on one host: the
 * transport of hidden states (and logits) between pipeline stages on different GPUs.
 *
 * A link is an NCCL communicator of `nranks` processes (a pipeline stage and the next: 2). Its
 * unique id is made by one side (hyla_cuda_nccl_id) and carried to the others by the caller
 * (the StageForward stream); every side then calls hyla_cuda_nccl_open with its rank. The
 * communicator is created non-blocking, so a peer that never joins costs a timeout and an
 * abort, not a hung thread. Sends and receives are queued on the backend's compute stream after
 * the ops logged so far (the graph log is flushed first), so they are ordered like every other
 * op: a receive into the activations is complete before the next layer reads them, a send
 * reads them after the layer that wrote them. Nothing is converted: the bytes that arrive are
 * the bytes that were sent, so a pipeline over NCCL gives the same bits as over gRPC.
 * Built with NCCL when CMake finds it (HYLA_HAVE_NCCL); otherwise every entry point answers
 * HYLA_ERR_UNSUPPORTED. Threading: one thread per backend, as every op; a link is used by the
 * thread that drives its backend. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hyla_cuda_extra.h"
#include "hyla_cuda_impl.h"

#include <unistd.h>

extern "C" hyla_status hyla_cuda_nccl_peer_key(hyla_backend *be, char *host, size_t host_len, char *dev, size_t dev_len) {
    if (!be || !be->ops || !be->ops->name || strcmp(be->ops->name, "cuda"))
        return hyla_fail(HYLA_ERR_INVALID_ARG, "hyla_cuda_nccl_peer_key: not a cuda backend");
    hyla_cuda_ctx *c = (hyla_cuda_ctx *)be->ctx;
    char boot[64] = "", name[128] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot, sizeof boot, f)) boot[0] = 0;
        fclose(f);
    }
    boot[strcspn(boot, "\n")] = 0;
    if (gethostname(name, sizeof name - 1) != 0) name[0] = 0;
    snprintf(host, host_len, "%s/%s", boot, name);
    CU_TRY(cudaDeviceGetPCIBusId(dev, (int)dev_len, c->device));
    return HYLA_OK;
}

#ifdef HYLA_HAVE_NCCL
#include <nccl.h>

struct hyla_nccl_link {
    ncclComm_t comm;
    int device;
    int nranks, rank;
    int broken; /* an operation failed or timed out: only close is allowed */
    /* receives beside the compute stream (hyla_cuda_nccl_recv_aside), made at the first */
    cudaStream_t aside;
    cudaEvent_t ordered;                 /* the compute stream's point the next one follows */
    cudaEvent_t done[HYLA_NCCL_ASIDE];   /* receive t's end, by ticket */
    void *dst[HYLA_NCCL_ASIDE];          /* receive t's buffer */
    unsigned next_ticket;
    /* sampling of a received buffer (hyla_cuda_nccl_sample_aside): its own stream, waiting only
     * for that buffer's receive, not for the later receives queued on `aside` */
    cudaStream_t sampling;
};

static hyla_cuda_ctx *nccl_ctx(hyla_backend *be) {
    if (!be || !be->ops || !be->ops->name || strcmp(be->ops->name, "cuda")) return NULL;
    return (hyla_cuda_ctx *)be->ctx;
}

static double mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static hyla_status nccl_fail(ncclResult_t r, const char *expr, const char *file, int line) {
    return hyla_fail(HYLA_ERR_DEVICE, "%s:%d: %s: NCCL error %d (%s)", file, line, expr, (int)r, ncclGetErrorString(r));
}

/* A non-blocking communicator answers ncclInProgress until the operation is queued, which
 * usually takes microseconds: poll without sleeping for the first 2 ms (a tensor-parallel decode
 * step queues two all-reduces per layer, so a sleep per call would dominate the step), then
 * every 200 us until the timeout. */
static hyla_status nccl_settle(hyla_nccl_link *l, ncclResult_t r, const char *expr, int timeout_ms) {
    double t0 = mono_ms();
    while (r == ncclInProgress) {
        double waited = mono_ms() - t0;
        if (waited > timeout_ms) {
            l->broken = 1;
            return hyla_fail(HYLA_ERR_UNAVAILABLE, "%s: the NCCL peer did not answer within %d ms", expr, timeout_ms);
        }
        if (waited > 2.0) {
            struct timespec ns = {0, 200000};
            nanosleep(&ns, NULL);
        }
        if (ncclCommGetAsyncError(l->comm, &r) != ncclSuccess) break;
    }
    if (r != ncclSuccess) {
        l->broken = 1;
        return nccl_fail(r, expr, __FILE__, __LINE__);
    }
    return HYLA_OK;
}

extern "C" hyla_status hyla_cuda_nccl_id(uint8_t id[HYLA_NCCL_ID_BYTES]) {
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess) return nccl_fail(r, "ncclGetUniqueId", __FILE__, __LINE__);
    static_assert(sizeof u == HYLA_NCCL_ID_BYTES, "NCCL unique id size");
    memcpy(id, &u, sizeof u);
    return HYLA_OK;
}

extern "C" hyla_status hyla_cuda_nccl_open(hyla_backend *be, const uint8_t id[HYLA_NCCL_ID_BYTES], int nranks, int rank,
                                           int timeout_ms, hyla_nccl_link **out) {
    *out = NULL;
    hyla_cuda_ctx *c = nccl_ctx(be);
    if (!c) return hyla_fail(HYLA_ERR_INVALID_ARG, "hyla_cuda_nccl_open: not a cuda backend");
    if (nranks < 2 || rank < 0 || rank >= nranks)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "hyla_cuda_nccl_open: rank %d of %d", rank, nranks);
    CU_TRY(cudaSetDevice(c->device));
    hyla_nccl_link *l = (hyla_nccl_link *)calloc(1, sizeof *l);
    if (!l) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    l->device = c->device;
    l->nranks = nranks;
    l->rank = rank;
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&l->comm, nranks, u, rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        free(l);
        return nccl_fail(r, "ncclCommInitRankConfig", __FILE__, __LINE__);
    }
    if (r == ncclInProgress) ncclCommGetAsyncError(l->comm, &r);
    hyla_status st = nccl_settle(l, r, "ncclCommInitRankConfig", timeout_ms);
    if (st != HYLA_OK) {
        hyla_cuda_nccl_close(l);
        return st;
    }
    *out = l;
    return HYLA_OK;
}

/* A send or receive may go on link l from backend be to `peer`: *c gets be's context. */
static hyla_status p2p_check(hyla_backend *be, hyla_nccl_link *l, int peer, const char *what, hyla_cuda_ctx **c) {
    *c = nccl_ctx(be);
    if (!*c || !l) return hyla_fail(HYLA_ERR_INVALID_ARG, "NCCL %s: not a cuda backend or no link", what);
    if (l->broken) return hyla_fail(HYLA_ERR_UNAVAILABLE, "NCCL link is broken (an earlier operation failed)");
    if (peer < 0 || peer >= l->nranks || peer == l->rank)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "NCCL %s: peer %d of %d (this is rank %d)", what, peer, l->nranks, l->rank);
    if (l->device != (*c)->device)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "NCCL link of device %d used on device %d", l->device, (*c)->device);
    return HYLA_OK;
}

static hyla_status nccl_p2p(hyla_backend *be, hyla_nccl_link *l, void *buf, size_t bytes, int peer, int send) {
    hyla_cuda_ctx *c;
    HYLA_TRY(p2p_check(be, l, peer, send ? "send" : "recv", &c));
    HYLA_TRY(cu_graph_flush(c)); /* stream order = call order */
    /* bytes as ncclChar; counts past 2^31 are fine for NCCL's size_t count */
    ncclResult_t r = send ? ncclSend(buf, bytes, ncclChar, peer, l->comm, c->stream)
                          : ncclRecv(buf, bytes, ncclChar, peer, l->comm, c->stream);
    if (r == ncclInProgress) ncclCommGetAsyncError(l->comm, &r);
    return nccl_settle(l, r, send ? "ncclSend" : "ncclRecv", 60000);
}

extern "C" hyla_status hyla_cuda_nccl_send(hyla_backend *be, hyla_nccl_link *l, const void *dev, size_t bytes, int peer) {
    return nccl_p2p(be, l, (void *)dev, bytes, peer, 1);
}

extern "C" hyla_status hyla_cuda_nccl_recv(hyla_backend *be, hyla_nccl_link *l, void *dev, size_t bytes, int peer) {
    return nccl_p2p(be, l, dev, bytes, peer, 0);
}

/* The link's side stream: a decode lane's logits arrive there while the compute stream runs the
 * next lane's layers. NCCL pairs a link's sends and receives in call order across streams; the
 * side stream first waits for the compute stream's ops called before, so the receive also
 * follows the send of the rows that produce those logits. */
extern "C" hyla_status hyla_cuda_nccl_recv_aside(hyla_backend *be, hyla_nccl_link *l, void *dev, size_t bytes, int peer,
                                                 int *ticket) {
    hyla_cuda_ctx *c;
    HYLA_TRY(p2p_check(be, l, peer, "recv", &c));
    HYLA_TRY(cu_graph_flush(c));
    if (!l->aside) {
        CU_TRY(cudaStreamCreateWithFlags(&l->aside, cudaStreamNonBlocking));
        CU_TRY(cudaStreamCreateWithFlags(&l->sampling, cudaStreamNonBlocking));
        CU_TRY(cudaEventCreateWithFlags(&l->ordered, cudaEventDisableTiming));
        for (int i = 0; i < HYLA_NCCL_ASIDE; i++) CU_TRY(cudaEventCreateWithFlags(&l->done[i], cudaEventDisableTiming));
    }
    CU_TRY(cudaEventRecord(l->ordered, c->stream));
    CU_TRY(cudaStreamWaitEvent(l->aside, l->ordered, 0));
    ncclResult_t r = ncclRecv(dev, bytes, ncclChar, peer, l->comm, l->aside);
    if (r == ncclInProgress) ncclCommGetAsyncError(l->comm, &r);
    HYLA_TRY(nccl_settle(l, r, "ncclRecv", 60000));
    int t = (int)(l->next_ticket++ % HYLA_NCCL_ASIDE);
    CU_TRY(cudaEventRecord(l->done[t], l->aside));
    l->dst[t] = dev;
    *ticket = t;
    return HYLA_OK;
}

extern "C" hyla_status hyla_cuda_nccl_join(hyla_backend *be, hyla_nccl_link *l, int ticket) {
    hyla_cuda_ctx *c = nccl_ctx(be);
    if (!c || !l || !l->aside || ticket < 0 || ticket >= HYLA_NCCL_ASIDE)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "NCCL join: no receive %d beside the compute stream", ticket);
    HYLA_TRY(cu_graph_flush(c));
    CU_TRY(cudaStreamWaitEvent(c->stream, l->done[ticket], 0));
    return HYLA_OK;
}

extern "C" hyla_status hyla_cuda_sample_on(hyla_backend *be, void *stream, const float *logits, int B, int V,
                                           const hyla_sampling *params, const float *u, int32_t *out);

extern "C" hyla_status hyla_cuda_nccl_sample_aside(hyla_backend *be, hyla_nccl_link *l, const float *logits, int B, int V,
                                                   const hyla_sampling *params, const float *u, int32_t *out) {
    if (!l || !l->aside || l->broken)
        return hyla_fail(HYLA_ERR_UNAVAILABLE, "NCCL link has no receives beside the compute stream to sample");
    int t = -1; /* the latest receive into these logits */
    for (unsigned i = 1; i <= HYLA_NCCL_ASIDE && i <= l->next_ticket && t < 0; i++) {
        int k = (int)((l->next_ticket - i) % HYLA_NCCL_ASIDE);
        if (l->dst[k] == logits) t = k;
    }
    if (t < 0) return hyla_fail(HYLA_ERR_INTERNAL, "NCCL: no receive beside the compute stream into these logits");
    CU_TRY(cudaStreamWaitEvent(l->sampling, l->done[t], 0));
    return hyla_cuda_sample_on(be, l->sampling, logits, B, V, params, u, out);
}

extern "C" hyla_status hyla_cuda_nccl_allreduce(hyla_backend *be, hyla_nccl_link *l, float *dev, size_t n) {
    hyla_cuda_ctx *c = nccl_ctx(be);
    if (!c || !l) return hyla_fail(HYLA_ERR_INVALID_ARG, "NCCL all-reduce: not a cuda backend or no link");
    if (l->broken) return hyla_fail(HYLA_ERR_UNAVAILABLE, "NCCL link is broken (an earlier operation failed)");
    if (l->device != c->device) return hyla_fail(HYLA_ERR_INVALID_ARG, "NCCL link of device %d used on device %d", l->device, c->device);
    HYLA_TRY(cu_graph_flush(c)); /* stream order = call order */
    /* in place; NCCL's reductions give every rank the same bits, so the replicated residual
     * stream (and the logits) stay identical across the group */
    ncclResult_t r = ncclAllReduce(dev, dev, n, ncclFloat, ncclSum, l->comm, c->stream);
    if (r == ncclInProgress) ncclCommGetAsyncError(l->comm, &r);
    return nccl_settle(l, r, "ncclAllReduce", 60000);
}

extern "C" void hyla_cuda_nccl_close(hyla_nccl_link *l) {
    if (!l) return;
    /* abort, not destroy: a peer that went away must not hang the close, and a link is only
     * closed when its stream is over or broken */
    if (l->comm) ncclCommAbort(l->comm);
    if (l->aside) {
        cudaSetDevice(l->device);
        for (int i = 0; i < HYLA_NCCL_ASIDE; i++) cudaEventDestroy(l->done[i]);
        cudaEventDestroy(l->ordered);
        cudaStreamDestroy(l->aside);
        cudaStreamDestroy(l->sampling);
    }
    free(l);
}

extern "C" int hyla_cuda_nccl_built(void) { return 1; }

#else /* no NCCL */

extern "C" hyla_status hyla_cuda_nccl_id(uint8_t id[HYLA_NCCL_ID_BYTES]) {
    (void)id;
    return hyla_fail(HYLA_ERR_UNSUPPORTED, "this build has no NCCL");
}
extern "C" hyla_status hyla_cuda_nccl_open(hyla_backend *be, const uint8_t id[HYLA_NCCL_ID_BYTES], int nranks, int rank,
                                           int timeout_ms, hyla_nccl_link **out) {
    (void)be, (void)id, (void)nranks, (void)rank, (void)timeout_ms;
    *out = NULL;
    return hyla_fail(HYLA_ERR_UNSUPPORTED, "this build has no NCCL");
}
extern "C" hyla_status hyla_cuda_nccl_send(hyla_backend *be, hyla_nccl_link *l, const void *dev, size_t bytes, int peer) {
    (void)be, (void)l, (void)dev, (void)bytes, (void)peer;
    return hyla_fail(HYLA_ERR_UNSUPPORTED, "this build has no NCCL");
}
extern "C" hyla_status hyla_cuda_nccl_recv(hyla_backend *be, hyla_nccl_link *l, void *dev, size_t bytes, int peer) {
    (void)be, (void)l, (void)dev, (void)bytes, (void)peer;
    return hyla_fail(HYLA_ERR_UNSUPPORTED, "this build has no NCCL");
}
extern "C" hyla_status hyla_cuda_nccl_recv_aside(hyla_backend *be, hyla_nccl_link *l, void *dev, size_t bytes, int peer,
                                                 int *ticket) {
    (void)be, (void)l, (void)dev, (void)bytes, (void)peer;
    *ticket = -1;
    return hyla_fail(HYLA_ERR_UNSUPPORTED, "this build has no NCCL");
}
extern "C" hyla_status hyla_cuda_nccl_join(hyla_backend *be, hyla_nccl_link *l, int ticket) {
    (void)be, (void)l, (void)ticket;
    return hyla_fail(HYLA_ERR_UNSUPPORTED, "this build has no NCCL");
}
extern "C" hyla_status hyla_cuda_nccl_sample_aside(hyla_backend *be, hyla_nccl_link *l, const float *logits, int B, int V,
                                                   const hyla_sampling *params, const float *u, int32_t *out) {
    (void)be, (void)l, (void)logits, (void)B, (void)V, (void)params, (void)u, (void)out;
    return hyla_fail(HYLA_ERR_UNSUPPORTED, "this build has no NCCL");
}
extern "C" hyla_status hyla_cuda_nccl_allreduce(hyla_backend *be, hyla_nccl_link *l, float *dev, size_t n) {
    (void)be, (void)l, (void)dev, (void)n;
    return hyla_fail(HYLA_ERR_UNSUPPORTED, "this build has no NCCL");
}
extern "C" void hyla_cuda_nccl_close(hyla_nccl_link *l) { (void)l; }
extern "C" int hyla_cuda_nccl_built(void) { return 0; }

#endif

/* Outside NCCL's #if: a tensor-parallel group drives each rank's backend from its own thread,
 * and CUDA's current device is per thread. */
extern "C" hyla_status hyla_cuda_flush(hyla_backend *be) {
    if (!be || strcmp(be->ops->name, "cuda")) return hyla_fail(HYLA_ERR_INVALID_ARG, "hyla_cuda_flush: not a cuda backend");
    return cu_graph_flush((hyla_cuda_ctx *)be->ctx);
}

extern "C" hyla_status hyla_cuda_bind_thread(hyla_backend *be) {
    if (!be || strcmp(be->ops->name, "cuda")) return hyla_fail(HYLA_ERR_INVALID_ARG, "hyla_cuda_bind_thread: not a cuda backend");
    CU_TRY(cudaSetDevice(((hyla_cuda_ctx *)be->ctx)->device));
    return HYLA_OK;
}
