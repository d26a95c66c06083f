/* hyla_cuda_pool.h — the GPU state pool and asynchronous snapshot copies of the CUDA backend.
 *
 * The pool is what ops->alloc / ops->free of a "cuda" backend draw from: every allocation up
 * to HYLA_CUDA_POOL_SLOT_MAX bytes is a fixed slot of its (256-byte rounded) size class,
 * carved from large slabs of device memory; a freed slot goes back to its class's free list
 * and the next allocation of that size reuses it, so the serving loop never calls cudaMalloc
 * (which synchronizes the device). Recurrent states, SSE partition states and KV pages each
 * have one size per layer kind, so they form a handful of classes. Larger allocations (weights,
 * scratch) go straight to cudaMalloc. Slots are zero-filled on the compute stream.
 *
 * Snapshots and restores: ops->download / ops->upload (what hyla_session_export/import call
 * per state part and KV page) run on the copy stream, ordered against the compute stream by
 * events, through pinned bounce buffers (double-buffered, so the PCIe copy of one piece
 * overlaps the host copy of the next), or directly when the host memory is pinned. For copies
 * that overlap compute, hyla_cuda_snapshot_begin queues device->host copies
 * on a second stream, ordered after the work already queued on the compute stream, and
 * returns at once; compute queued later runs while the copies proceed. The destination must
 * be pinned host memory (hyla_cuda_host_alloc) for the copy to be truly asynchronous.
 * hyla_cuda_restore_begin is the reverse; later ops on the compute stream wait for it.
 * The bytes are the backend's own state layout (hyla_ops.h: fp32 states, bf16 KV pages), so
 * the session code converts KV dtype exactly as it does for ops->download.
 * The ops table exposes the same machinery to backend-independent code: ops->host_alloc /
 * host_free are hyla_cuda_host_alloc / _free, ops->capture_begin / capture_done / capture_end
 * are hyla_cuda_snapshot_begin / hyla_cuda_copy_done / hyla_cuda_copy_wait
 * (hyla_session_export_begin is built on them).
 *
 * These functions exist only in builds with the CUDA backend (HYLA_HAVE_CUDA); each fails
 * with HYLA_ERR_INVALID_ARG when given a backend that is not "cuda".
 * Threading: as hyla_ops.h — the thread that drives the backend. */
#ifndef HYLA_CUDA_POOL_H
#define HYLA_CUDA_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "hyla_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HYLA_CUDA_POOL_SLOT_MAX ((size_t)64 << 20) /* larger allocations bypass the pool */

typedef struct {
    uint64_t slab_bytes;  /* device memory held in slabs */
    uint64_t slot_bytes;  /* bytes in live slots */
    uint64_t free_bytes;  /* bytes in free slots (reusable) and uncarved slab tails */
    uint64_t big_bytes;   /* bytes in live allocations that bypass the pool */
    uint32_t n_slabs, n_classes, n_live_slots, n_free_slots, n_big;
} hyla_cuda_pool_stats;

hyla_status hyla_cuda_pool_get_stats(hyla_backend *be, hyla_cuda_pool_stats *out);
/* Make sure n free slots of `bytes` exist (carving new slabs if needed) so that later
 * allocations of that size are served without cudaMalloc. */
hyla_status hyla_cuda_pool_reserve(hyla_backend *be, size_t bytes, int n);

/* Page-locked host memory. Caller frees with hyla_cuda_host_free (accepts NULL). */
hyla_status hyla_cuda_host_alloc(hyla_backend *be, size_t bytes, void **out);
void hyla_cuda_host_free(hyla_backend *be, void *p);

typedef struct hyla_cuda_copy hyla_cuda_copy;
/* Queue n device->host copies (dev_src[i] -> host_dst[i], bytes[i]) after the work queued so
 * far on the compute stream. The arrays are borrowed for the call; the buffers until the copy
 * is waited for. The host buffers are all pinned or all pageable (host_dst[0] decides): pageable
 * ones are filled by a thread of the copy's own through a pinned bounce buffer, so the call
 * does not wait either way. *out: caller finishes with hyla_cuda_copy_wait. */
hyla_status hyla_cuda_snapshot_begin(hyla_backend *be, int n, void *const *host_dst, const void *const *dev_src,
                                     const size_t *bytes, hyla_cuda_copy **out);
/* Queue n host->device copies; ops queued after this call wait for them on the device. */
hyla_status hyla_cuda_restore_begin(hyla_backend *be, int n, void *const *dev_dst, const void *const *host_src,
                                    const size_t *bytes, hyla_cuda_copy **out);
/* 1 when the copies have finished, 0 while they run. */
int hyla_cuda_copy_done(const hyla_cuda_copy *c);
/* Wait for the copies, report their status and free c (accepts NULL). */
hyla_status hyla_cuda_copy_wait(hyla_cuda_copy *c);

#ifdef __cplusplus
}
#endif
#endif
