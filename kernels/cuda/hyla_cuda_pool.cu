/* hyla_cuda_pool.cu — the GPU state pool behind ops->alloc / ops->free of the CUDA backend,
 * and the asynchronous snapshot/restore copies of hyla_cuda_pool.h.
 *
 * Slots: an allocation of at most HYLA_CUDA_POOL_SLOT_MAX bytes is rounded up to 256 bytes;
 * each rounded size is a class with a free list. Slots are carved from slabs (cudaMalloc'ed
 * once, never returned until the context dies). A freed slot is pushed on its class's free
 * list; reuse is safe without a sync because every user of device memory is ordered on the
 * one compute stream (hyla_cuda_impl.h) — the zero-fill of the reused slot runs after the
 * kernels that used it before. Copies on the copy stream (snapshot_begin, ops->capture_begin)
 * must be waited for before the slots they read are freed (documented in the headers).
 * Larger allocations go to cudaMalloc directly (freed after a stream sync).
 * A pointer -> (size, kind) hash map answers free(). Threading: one thread per context. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_cuda_impl.h"
#include "hyla_cuda_pool.h"
#include "hyla_log.h"
#include "hyla_thread.h"
#include "hyla_util.h"

typedef struct {
    size_t size;
    void **free_list;
    uint32_t n_free, cap;
    uint32_t n_live;
} pool_class;

typedef struct {
    uint8_t *base;
    size_t bytes, used;
} pool_slab;

typedef struct {
    uintptr_t key; /* 0 empty, 1 tombstone */
    size_t size;
    int cls;       /* class index, -1 for a big allocation */
} pool_entry;

struct hyla_cu_pool {
    pool_class *classes;
    int n_classes, cap_classes;
    pool_slab *slabs;
    int n_slabs, cap_slabs;
    pool_entry *map;
    size_t map_cap, map_used; /* used counts live entries and tombstones */
    uint64_t slab_bytes, slot_bytes, big_bytes;
    uint32_t n_big;
};

#define SLAB_MIN ((size_t)64 << 20)

extern "C" hyla_status cu_pool_create(hyla_cuda_ctx *c, hyla_cu_pool **out) {
    (void)c;
    hyla_cu_pool *p = (hyla_cu_pool *)calloc(1, sizeof *p);
    if (!p) return hyla_fail(HYLA_ERR_NOMEM, "cuda pool: out of host memory");
    p->map_cap = 1024;
    p->map = (pool_entry *)calloc(p->map_cap, sizeof *p->map);
    if (!p->map) {
        free(p);
        return hyla_fail(HYLA_ERR_NOMEM, "cuda pool: out of host memory");
    }
    *out = p;
    return HYLA_OK;
}

extern "C" void cu_pool_destroy(hyla_cuda_ctx *c, hyla_cu_pool *p) {
    if (!p) return;
    if (c->stream) cudaStreamSynchronize(c->stream);
    for (size_t i = 0; i < p->map_cap; i++)
        if (p->map[i].key > 1 && p->map[i].cls < 0) cudaFree((void *)p->map[i].key);
    for (int i = 0; i < p->n_slabs; i++) cudaFree(p->slabs[i].base);
    for (int i = 0; i < p->n_classes; i++) free(p->classes[i].free_list);
    free(p->classes);
    free(p->slabs);
    free(p->map);
    free(p);
}

static size_t map_hash(uintptr_t k, size_t cap) {
    uint64_t x = (uint64_t)k >> 8;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (size_t)x & (cap - 1);
}

static hyla_status map_put(hyla_cu_pool *p, uintptr_t key, size_t size, int cls);

static hyla_status map_grow(hyla_cu_pool *p) {
    size_t ncap = p->map_cap * 2;
    pool_entry *old = p->map;
    size_t ocap = p->map_cap;
    pool_entry *nm = (pool_entry *)calloc(ncap, sizeof *nm);
    if (!nm) return hyla_fail(HYLA_ERR_NOMEM, "cuda pool: out of host memory");
    p->map = nm;
    p->map_cap = ncap;
    p->map_used = 0;
    for (size_t i = 0; i < ocap; i++)
        if (old[i].key > 1) map_put(p, old[i].key, old[i].size, old[i].cls);
    free(old);
    return HYLA_OK;
}

static hyla_status map_put(hyla_cu_pool *p, uintptr_t key, size_t size, int cls) {
    if ((p->map_used + 1) * 2 > p->map_cap) HYLA_TRY(map_grow(p));
    size_t i = map_hash(key, p->map_cap);
    while (p->map[i].key > 1) i = (i + 1) & (p->map_cap - 1);
    if (p->map[i].key == 0) p->map_used++;
    p->map[i].key = key;
    p->map[i].size = size;
    p->map[i].cls = cls;
    return HYLA_OK;
}

static pool_entry *map_find(hyla_cu_pool *p, uintptr_t key) {
    size_t i = map_hash(key, p->map_cap);
    for (size_t n = 0; n < p->map_cap; n++) {
        if (p->map[i].key == key) return &p->map[i];
        if (p->map[i].key == 0) return NULL;
        i = (i + 1) & (p->map_cap - 1);
    }
    return NULL;
}

static int class_find(hyla_cu_pool *p, size_t size, int create) {
    for (int i = 0; i < p->n_classes; i++)
        if (p->classes[i].size == size) return i;
    if (!create) return -1;
    if (p->n_classes == p->cap_classes) {
        int nc = p->cap_classes ? p->cap_classes * 2 : 16;
        pool_class *n = (pool_class *)realloc(p->classes, (size_t)nc * sizeof *n);
        if (!n) return -1;
        p->classes = n;
        p->cap_classes = nc;
    }
    pool_class *k = &p->classes[p->n_classes];
    memset(k, 0, sizeof *k);
    k->size = size;
    return p->n_classes++;
}

/* Carve one slot of `size` from the slabs (a new slab if no tail fits). */
static hyla_status carve(hyla_cu_pool *p, size_t size, void **out) {
    for (int i = p->n_slabs - 1; i >= 0 && i >= p->n_slabs - 2; i--) {
        pool_slab *s = &p->slabs[i];
        if (s->bytes - s->used >= size) {
            *out = s->base + s->used;
            s->used += size;
            return HYLA_OK;
        }
    }
    if (p->n_slabs == p->cap_slabs) {
        int nc = p->cap_slabs ? p->cap_slabs * 2 : 16;
        pool_slab *n = (pool_slab *)realloc(p->slabs, (size_t)nc * sizeof *n);
        if (!n) return hyla_fail(HYLA_ERR_NOMEM, "cuda pool: out of host memory");
        p->slabs = n;
        p->cap_slabs = nc;
    }
    size_t bytes = size * 8 > SLAB_MIN ? size * 8 : SLAB_MIN;
    void *base = NULL;
    cudaError_t e = cudaMalloc(&base, bytes);
    if (e != cudaSuccess && bytes > size) { /* memory is tight: a slab of just this slot */
        cudaGetLastError();
        bytes = size;
        e = cudaMalloc(&base, bytes);
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        return hyla_fail(HYLA_ERR_NOMEM, "cuda pool: cudaMalloc of a %zu-byte slab failed: %s", bytes,
                         cudaGetErrorString(e));
    }
    pool_slab *s = &p->slabs[p->n_slabs++];
    s->base = (uint8_t *)base;
    s->bytes = bytes;
    s->used = size;
    p->slab_bytes += bytes;
    *out = base;
    return HYLA_OK;
}

static hyla_status class_push(pool_class *k, void *ptr) {
    if (k->n_free == k->cap) {
        uint32_t nc = k->cap ? k->cap * 2 : 16;
        void **n = (void **)realloc(k->free_list, nc * sizeof *n);
        if (!n) return hyla_fail(HYLA_ERR_NOMEM, "cuda pool: out of host memory");
        k->free_list = n;
        k->cap = nc;
    }
    k->free_list[k->n_free++] = ptr;
    return HYLA_OK;
}

extern "C" hyla_status cu_pool_alloc(hyla_cuda_ctx *c, size_t bytes, void **out) {
    hyla_cu_pool *p = c->pool;
    *out = NULL;
    size_t size = (bytes + 255) & ~(size_t)255;
    if (size == 0) size = 256;
    void *ptr = NULL;
    if (size > HYLA_CUDA_POOL_SLOT_MAX) {
        cudaError_t e = cudaMalloc(&ptr, size);
        if (e != cudaSuccess) {
            cudaGetLastError();
            return hyla_fail(HYLA_ERR_NOMEM, "alloc of %zu bytes on cuda:%d failed: %s", bytes, c->device,
                             cudaGetErrorString(e));
        }
        hyla_status s = map_put(p, (uintptr_t)ptr, size, -1);
        if (s != HYLA_OK) {
            cudaFree(ptr);
            return s;
        }
        p->big_bytes += size;
        p->n_big++;
    } else {
        int ci = class_find(p, size, 1);
        if (ci < 0) return hyla_fail(HYLA_ERR_NOMEM, "cuda pool: out of host memory");
        pool_class *k = &p->classes[ci];
        if (k->n_free) {
            ptr = k->free_list[--k->n_free];
        } else {
            HYLA_TRY(carve(p, size, &ptr));
        }
        hyla_status s = map_put(p, (uintptr_t)ptr, size, ci);
        if (s != HYLA_OK) {
            class_push(k, ptr);
            return s;
        }
        k->n_live++;
        p->slot_bytes += size;
    }
    CU_TRY(cudaMemsetAsync(ptr, 0, size, c->stream));
    *out = ptr;
    return HYLA_OK;
}

extern "C" void cu_pool_free(hyla_cuda_ctx *c, void *ptr) {
    hyla_cu_pool *p = c->pool;
    pool_entry *e = map_find(p, (uintptr_t)ptr);
    if (!e) {
        fprintf(stderr, "hyla: cuda free of %p, which this backend did not allocate\n", ptr);
        HYLA_ASSERT(!"free of a pointer the cuda backend did not allocate");
    }
    if (e->cls < 0) {
        cudaStreamSynchronize(c->stream); /* queued kernels may still use it */
        cudaFree(ptr);
        p->big_bytes -= e->size;
        p->n_big--;
    } else {
        pool_class *k = &p->classes[e->cls];
        if (class_push(k, ptr) != HYLA_OK) return; /* leak the slot rather than lose the entry */
        k->n_live--;
        p->slot_bytes -= e->size;
    }
    e->key = 1; /* tombstone */
}

/* ---------------------------------------------------------------- public pool API */

static hyla_cuda_ctx *cuda_ctx_of(hyla_backend *be) {
    if (!be || !be->ops || !be->ops->name || strcmp(be->ops->name, "cuda")) return NULL;
    return (hyla_cuda_ctx *)be->ctx;
}

extern "C" hyla_status hyla_cuda_pool_get_stats(hyla_backend *be, hyla_cuda_pool_stats *out) {
    hyla_cuda_ctx *c = cuda_ctx_of(be);
    memset(out, 0, sizeof *out);
    if (!c) return hyla_fail(HYLA_ERR_INVALID_ARG, "hyla_cuda_pool_get_stats: not a cuda backend");
    hyla_cu_pool *p = c->pool;
    out->slab_bytes = p->slab_bytes;
    out->slot_bytes = p->slot_bytes;
    out->big_bytes = p->big_bytes;
    out->n_slabs = (uint32_t)p->n_slabs;
    out->n_classes = (uint32_t)p->n_classes;
    out->n_big = p->n_big;
    uint64_t fb = 0;
    for (int i = 0; i < p->n_classes; i++) {
        out->n_live_slots += p->classes[i].n_live;
        out->n_free_slots += p->classes[i].n_free;
        fb += (uint64_t)p->classes[i].n_free * p->classes[i].size;
    }
    for (int i = 0; i < p->n_slabs; i++) fb += p->slabs[i].bytes - p->slabs[i].used;
    out->free_bytes = fb;
    return HYLA_OK;
}

extern "C" hyla_status hyla_cuda_pool_reserve(hyla_backend *be, size_t bytes, int n) {
    hyla_cuda_ctx *c = cuda_ctx_of(be);
    if (!c) return hyla_fail(HYLA_ERR_INVALID_ARG, "hyla_cuda_pool_reserve: not a cuda backend");
    size_t size = (bytes + 255) & ~(size_t)255;
    if (size == 0 || size > HYLA_CUDA_POOL_SLOT_MAX || n < 0)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "hyla_cuda_pool_reserve: %zu bytes x %d (slots hold at most %zu)",
                         bytes, n, (size_t)HYLA_CUDA_POOL_SLOT_MAX);
    hyla_cu_pool *p = c->pool;
    int ci = class_find(p, size, 1);
    if (ci < 0) return hyla_fail(HYLA_ERR_NOMEM, "cuda pool: out of host memory");
    while ((int)p->classes[ci].n_free < n) {
        void *ptr;
        HYLA_TRY(carve(p, size, &ptr));
        HYLA_TRY(class_push(&p->classes[ci], ptr));
    }
    return HYLA_OK;
}

extern "C" hyla_status cu_host_alloc(hyla_cuda_ctx *c, size_t bytes, void **out) {
    (void)c;
    *out = NULL;
    CU_TRY(cudaMallocHost(out, bytes ? bytes : 1));
    return HYLA_OK;
}

extern "C" void cu_host_free(hyla_cuda_ctx *c, void *p) {
    (void)c;
    if (p) cudaFreeHost(p);
}

extern "C" hyla_status hyla_cuda_host_alloc(hyla_backend *be, size_t bytes, void **out) {
    hyla_cuda_ctx *c = cuda_ctx_of(be);
    *out = NULL;
    if (!c) return hyla_fail(HYLA_ERR_INVALID_ARG, "hyla_cuda_host_alloc: not a cuda backend");
    return cu_host_alloc(c, bytes, out);
}

extern "C" void hyla_cuda_host_free(hyla_backend *be, void *p) { cu_host_free(cuda_ctx_of(be), p); }

/* ---- device -> pageable host copies ----
 * A copy into pageable memory (an export too large for a cached pinned buffer) would make the
 * driving thread wait for it, and page-locking a buffer for it stalls every CUDA call of the
 * process for about 0.45 s a GB. So a thread of its own copies it: it waits for the compute
 * stream's work queued before the call (an event), copies through a fixed pinned bounce buffer
 * on a stream of its own, half by half, and moves each half into the destination while the next
 * half is in flight. The bounce buffers (XB_BYTES each) are allocated once and kept. */
#define XB_BYTES ((size_t)32 << 20)
#define XB_KEEP 4
static pthread_mutex_t xb_mu = PTHREAD_MUTEX_INITIALIZER;
static void *xb_free[XB_KEEP];
static int xb_n;

typedef struct {
    void *dst;
    size_t at, len; /* bytes [at, at + len) of the half */
} xb_entry;

typedef struct {
    int device;
    cudaEvent_t after; /* the compute stream's work before the copy */
    int n;
    void **dst;
    const void **src;
    size_t *bytes;
    hyla_status st;
    char msg[512];
} pageable_job;

/* A large device -> pinned host batch whose copies a thread of its own hands to the driver:
 * cudaMemcpyBatchAsync costs the calling thread ~0.5 us per piece (a 32k-token SSE-H export is
 * ~3,100 KV pages, ~1.5 ms; 128k ~7 ms), which the caller (a decode loop) should not wait for. */
typedef struct {
    int device;
    size_t m;
    void **dst;
    const void **src;
    size_t *bytes;
    hyla_status st;
    char msg[160];
} issue_job;

struct hyla_cuda_copy {
    hyla_cuda_ctx *c;
    cudaEvent_t done;
    /* a copy into pageable memory: its thread, and whether it finished */
    pageable_job *pj;
    pthread_t th;
    int pj_done; /* __atomic builtins */
    /* a batch issued by its own thread (th): done is recorded once issued is set */
    issue_job *ij;
    int issued; /* __atomic builtins */
};

static void pj_fail(pageable_job *j, cudaError_t e, const char *what) {
    if (j->st != HYLA_OK) return;
    j->st = HYLA_ERR_DEVICE;
    snprintf(j->msg, sizeof j->msg, "copy into pageable memory: %s: %s", what, cudaGetErrorString(e));
}

/* The move out of a bounce half, in pieces of up to XB_PIECE bytes over up to XB_THREADS threads:
 * one thread moved ~1.5 GB/s (the destination is fresh pageable memory, so the move also faults
 * its pages in), which bounded a long document's export. */
#define XB_PIECE ((size_t)1 << 20)
#define XB_THREADS 4
typedef struct {
    uint8_t *half;
    const xb_entry *ent;
    int ne;
} xb_move;

static void xb_move_piece(void *ctx, size_t k, int tid) {
    (void)tid;
    const xb_move *mv = (const xb_move *)ctx;
    size_t at = k * XB_PIECE; /* byte k * XB_PIECE of the half's bytes, entry after entry */
    for (int i = 0; i < mv->ne; i++) {
        const xb_entry *e = &mv->ent[i];
        if (at >= e->len) {
            at -= e->len;
            continue;
        }
        size_t left = XB_PIECE;
        for (; i < mv->ne && left; i++, at = 0) { /* this piece may span the entry's end */
            const xb_entry *f = &mv->ent[i];
            size_t n = f->len - at < left ? f->len - at : left;
            memcpy((uint8_t *)f->dst + at, mv->half + f->at + at, n);
            left -= n;
        }
        return;
    }
}

/* Wait for half h's copies and move them out of the bounce buffer. */
static void pj_drain(pageable_job *j, cudaEvent_t ev, uint8_t *half, xb_entry *ent, int *ne) {
    if (!*ne) return;
    cudaError_t e = cudaEventSynchronize(ev);
    if (e != cudaSuccess) pj_fail(j, e, "cudaEventSynchronize");
    if (j->st == HYLA_OK) {
        size_t bytes = 0;
        for (int i = 0; i < *ne; i++) bytes += ent[i].len;
        xb_move mv = {half, ent, *ne};
        hyla_parallel_for(XB_THREADS, (bytes + XB_PIECE - 1) / XB_PIECE, xb_move_piece, &mv);
    }
    *ne = 0;
}

#define XB_ENTRIES 512
static void *pageable_main(void *arg) {
    hyla_cuda_copy *cp = (hyla_cuda_copy *)arg;
    pageable_job *j = cp->pj;
    cudaStream_t hs = NULL;
    cudaEvent_t ev[2] = {NULL, NULL};
    void *xb = NULL;
    xb_entry *ent[2] = {(xb_entry *)calloc(XB_ENTRIES, sizeof(xb_entry)), (xb_entry *)calloc(XB_ENTRIES, sizeof(xb_entry))};
    int ne[2] = {0, 0};
    cudaError_t e = cudaSetDevice(j->device);
    if (e != cudaSuccess) pj_fail(j, e, "cudaSetDevice");
    if (!ent[0] || !ent[1]) j->st = HYLA_ERR_NOMEM, snprintf(j->msg, sizeof j->msg, "copy into pageable memory: out of memory");
    pthread_mutex_lock(&xb_mu);
    if (xb_n) xb = xb_free[--xb_n];
    pthread_mutex_unlock(&xb_mu);
    if (j->st == HYLA_OK && !xb && (e = cudaMallocHost(&xb, XB_BYTES)) != cudaSuccess) pj_fail(j, e, "cudaMallocHost"), xb = NULL;
    if (j->st == HYLA_OK && (e = cudaStreamCreateWithFlags(&hs, cudaStreamNonBlocking)) != cudaSuccess) pj_fail(j, e, "cudaStreamCreate");
    for (int h = 0; h < 2 && j->st == HYLA_OK; h++)
        if ((e = cudaEventCreateWithFlags(&ev[h], cudaEventDisableTiming)) != cudaSuccess) pj_fail(j, e, "cudaEventCreate");
    if (j->st == HYLA_OK && (e = cudaStreamWaitEvent(hs, j->after, 0)) != cudaSuccess) pj_fail(j, e, "cudaStreamWaitEvent");
    const size_t H = XB_BYTES / 2;
    int h = 0;
    size_t used = 0; /* bytes of half h filled */
    for (int i = 0; i < j->n && j->st == HYLA_OK; i++)
        for (size_t off = 0; off < j->bytes[i] && j->st == HYLA_OK;) {
            if (used == H || ne[h] == XB_ENTRIES) { /* half h is full: send it, take the other */
                if ((e = cudaEventRecord(ev[h], hs)) != cudaSuccess) pj_fail(j, e, "cudaEventRecord");
                h ^= 1;
                pj_drain(j, ev[h], (uint8_t *)xb + (size_t)h * H, ent[h], &ne[h]);
                used = 0;
            }
            size_t len = j->bytes[i] - off < H - used ? j->bytes[i] - off : H - used;
            uint8_t *half = (uint8_t *)xb + (size_t)h * H;
            if ((e = cudaMemcpyAsync(half + used, (const uint8_t *)j->src[i] + off, len, cudaMemcpyDeviceToHost, hs)) !=
                cudaSuccess)
                pj_fail(j, e, "cudaMemcpyAsync");
            ent[h][ne[h]++] = (xb_entry){(uint8_t *)j->dst[i] + off, used, len};
            used += len;
            off += len;
        }
    if (j->st == HYLA_OK && ne[h] && (e = cudaEventRecord(ev[h], hs)) != cudaSuccess) pj_fail(j, e, "cudaEventRecord");
    if (j->st == HYLA_OK) { /* the older half first, then the last one */
        pj_drain(j, ev[h ^ 1], (uint8_t *)xb + (size_t)(h ^ 1) * H, ent[h ^ 1], &ne[h ^ 1]);
        pj_drain(j, ev[h], (uint8_t *)xb + (size_t)h * H, ent[h], &ne[h]);
    }
    if (hs) {
        cudaStreamSynchronize(hs); /* nothing may still write the bounce buffer once it is given back */
        cudaStreamDestroy(hs);
    }
    for (int k = 0; k < 2; k++)
        if (ev[k]) cudaEventDestroy(ev[k]);
    if (xb) {
        pthread_mutex_lock(&xb_mu);
        if (xb_n < XB_KEEP) xb_free[xb_n++] = xb, xb = NULL;
        pthread_mutex_unlock(&xb_mu);
        if (xb) cudaFreeHost(xb);
    }
    free(ent[0]);
    free(ent[1]);
    __atomic_store_n(&cp->pj_done, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* The destination of a device -> host copy is pageable (not page-locked, not mapped). */
static int host_pageable(const void *p) {
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return 1;
    }
    return a.type == cudaMemoryTypeUnregistered;
}

/* Start the copies of a device -> pageable host copy on a thread (see above). */
static hyla_status pageable_begin(hyla_cuda_ctx *c, int n, void *const *dst, const void *const *src, const size_t *bytes,
                                  hyla_cuda_copy *cp) {
    pageable_job *j = (pageable_job *)calloc(1, sizeof *j);
    if (!j) return hyla_fail(HYLA_ERR_NOMEM, "hyla_cuda async copy: out of host memory");
    j->device = c->device;
    j->n = n;
    j->dst = (void **)malloc(((size_t)n + 1) * sizeof *j->dst);
    j->src = (const void **)malloc(((size_t)n + 1) * sizeof *j->src);
    j->bytes = (size_t *)malloc(((size_t)n + 1) * sizeof *j->bytes);
    cudaError_t e = j->dst && j->src && j->bytes ? cudaEventCreateWithFlags(&j->after, cudaEventDisableTiming)
                                                 : cudaErrorMemoryAllocation;
    if (e == cudaSuccess) e = cudaEventRecord(j->after, c->stream); /* after the work queued so far */
    hyla_status st = e == cudaSuccess ? HYLA_OK : hyla_cuda_fail(e, "pageable copy: event", __FILE__, __LINE__);
    if (st == HYLA_OK) {
        for (int i = 0; i < n; i++) j->dst[i] = dst[i], j->src[i] = src[i], j->bytes[i] = bytes[i];
        cp->pj = j;
        __atomic_store_n(&cp->pj_done, 0, __ATOMIC_RELEASE);
        if (pthread_create(&cp->th, NULL, pageable_main, cp) != 0)
            st = hyla_fail(HYLA_ERR_RESOURCE, "hyla_cuda async copy: cannot start its thread");
    }
    if (st != HYLA_OK) {
        if (j->after) cudaEventDestroy(j->after);
        free(j->dst);
        free((void *)j->src);
        free(j->bytes);
        free(j);
        cp->pj = NULL;
    }
    return st;
}

static hyla_status pageable_wait(hyla_cuda_copy *cp) {
    pageable_job *j = cp->pj;
    pthread_join(cp->th, NULL);
    hyla_status st = j->st == HYLA_OK ? HYLA_OK : hyla_fail(j->st, "%s", j->msg);
    cudaEventDestroy(j->after);
    free(j->dst);
    free((void *)j->src);
    free(j->bytes);
    free(j);
    free(cp);
    return st;
}

/* Pieces at least this many (after merging) make a device -> host batch worth a thread. */
#define ISSUE_THREAD_MIN 256

/* The m copies on the copy stream: one batch call where the driver has it, else one by one. */
static void issue_copies(hyla_cuda_ctx *c, size_t m, void **bd, const void **bs, size_t *bz, cudaMemcpyKind kind,
                         hyla_status *st) {
    int batched = 0;
    if (m >= 8) {
        cudaMemcpyAttributes at;
        memset(&at, 0, sizeof at);
        at.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
        size_t at_idx = 0;
        const double t0 = hyla_now();
        if (cudaMemcpyBatchAsync(bd, bs, bz, m, &at, &at_idx, 1, c->copy_stream) == cudaSuccess) batched = 1;
        else (void)cudaGetLastError(); /* not supported here: clear it and copy one by one */
        HYLA_DEBUG("cuda copies: %zu pieces, batch call %.3f ms", m, (hyla_now() - t0) * 1e3);
    }
    for (size_t i = 0; !batched && i < m && *st == HYLA_OK; i++) {
        cudaError_t e = cudaMemcpyAsync(bd[i], bs[i], bz[i], kind, c->copy_stream);
        if (e != cudaSuccess) *st = hyla_cuda_fail(e, "cudaMemcpyAsync", __FILE__, __LINE__);
    }
}

static void *issue_main(void *arg) {
    hyla_cuda_copy *cp = (hyla_cuda_copy *)arg;
    issue_job *j = cp->ij;
    j->st = HYLA_OK;
    cudaError_t e = cudaSetDevice(j->device);
    if (e != cudaSuccess) j->st = hyla_cuda_fail(e, "cudaSetDevice", __FILE__, __LINE__);
    if (j->st == HYLA_OK) issue_copies(cp->c, j->m, j->dst, j->src, j->bytes, cudaMemcpyDeviceToHost, &j->st);
    if (j->st == HYLA_OK && (e = cudaEventRecord(cp->done, cp->c->copy_stream)) != cudaSuccess)
        j->st = hyla_cuda_fail(e, "cudaEventRecord(copy)", __FILE__, __LINE__);
    if (j->st != HYLA_OK) snprintf(j->msg, sizeof j->msg, "%s", hyla_last_error());
    free(j->dst);
    free((void *)j->src);
    free(j->bytes);
    __atomic_store_n(&cp->issued, 1, __ATOMIC_RELEASE);
    return NULL;
}

static hyla_status copy_begin(hyla_cuda_ctx *c, int n, void *const *dst, const void *const *src, const size_t *bytes,
                              cudaMemcpyKind kind, hyla_cuda_copy **out) {
    *out = NULL;
    if (n < 0) return hyla_fail(HYLA_ERR_INVALID_ARG, "hyla_cuda async copy: %d copies", n);
    HYLA_TRY(cu_graph_flush(c)); /* logged ops first: the copies are ordered after them */
    hyla_cuda_copy *cp = (hyla_cuda_copy *)calloc(1, sizeof *cp);
    if (!cp) return hyla_fail(HYLA_ERR_NOMEM, "hyla_cuda async copy: out of host memory");
    cp->c = c;
    if (kind == cudaMemcpyDeviceToHost && n > 0 && host_pageable(dst[0])) {
        hyla_status ps = pageable_begin(c, n, dst, src, bytes, cp);
        if (ps != HYLA_OK) {
            free(cp);
            return ps;
        }
        *out = cp;
        return HYLA_OK;
    }
    cudaEvent_t after = NULL;
    hyla_status st = HYLA_OK;
#define STEP(expr)                                                                    \
    do {                                                                              \
        cudaError_t e_ = (expr);                                                      \
        if (e_ != cudaSuccess && st == HYLA_OK) st = hyla_cuda_fail(e_, #expr, __FILE__, __LINE__); \
    } while (0)
    STEP(cudaEventCreateWithFlags(&cp->done, cudaEventDisableTiming));
    STEP(cudaEventCreateWithFlags(&after, cudaEventDisableTiming));
    if (st == HYLA_OK) {
        /* copies start after the compute work queued so far (it writes what we read, or reads
         * what we overwrite) */
        STEP(cudaEventRecord(after, c->stream));
        STEP(cudaStreamWaitEvent(c->copy_stream, after, 0));
        /* many pieces (a snapshot's KV pages: one per 64 tokens and layer) go as one batch call,
         * whose host cost does not grow per piece like cudaMemcpyAsync's; a driver without it
         * gets the loop. Pieces that continue the previous one at both ends (pages the pool
         * handed out one after another) go as one copy. */
        void **bd = (void **)malloc(((size_t)n + 1) * sizeof *bd);
        const void **bs = (const void **)malloc(((size_t)n + 1) * sizeof *bs);
        size_t *bz = (size_t *)malloc(((size_t)n + 1) * sizeof *bz), m = 0;
        if (!bd || !bs || !bz) st = hyla_fail(HYLA_ERR_NOMEM, "hyla_cuda async copy: out of host memory");
        for (int i = 0; st == HYLA_OK && i < n; i++) {
            if (!bytes[i]) continue;
            if (m && (char *)bd[m - 1] + bz[m - 1] == (char *)dst[i] &&
                (const char *)bs[m - 1] + bz[m - 1] == (const char *)src[i]) {
                bz[m - 1] += bytes[i];
                continue;
            }
            bd[m] = dst[i];
            bs[m] = src[i];
            bz[m++] = bytes[i];
        }
        /* device -> host batches of many pieces are issued by a thread (issue_main): nothing
         * on the compute stream waits for them, so done may be recorded later; uploads are
         * issued here, since the compute stream must wait for their done event now */
        if (st == HYLA_OK && kind == cudaMemcpyDeviceToHost && m >= ISSUE_THREAD_MIN) {
            issue_job *j = (issue_job *)calloc(1, sizeof *j);
            if (j) {
                j->device = c->device;
                j->m = m;
                j->dst = bd;
                j->src = bs;
                j->bytes = bz;
                cp->ij = j;
                if (pthread_create(&cp->th, NULL, issue_main, cp) == 0) {
                    *out = cp;
                    cudaEventDestroy(after); /* the copy stream already waits for it */
                    return HYLA_OK;
                }
                cp->ij = NULL;
                free(j);
            }
        }
        if (st == HYLA_OK) issue_copies(c, m, bd, bs, bz, kind, &st);
        free(bd);
        free((void *)bs);
        free(bz);
        STEP(cudaEventRecord(cp->done, c->copy_stream));
        if (kind == cudaMemcpyHostToDevice) STEP(cudaStreamWaitEvent(c->stream, cp->done, 0));
    }
#undef STEP
    if (after) cudaEventDestroy(after);
    if (st != HYLA_OK) {
        cudaStreamSynchronize(c->copy_stream);
        if (cp->done) cudaEventDestroy(cp->done);
        free(cp);
        return st;
    }
    *out = cp;
    return HYLA_OK;
}

static int copy_done(const hyla_cuda_copy *cp) {
    /* a failure counts as finished: copy_wait reports it */
    if (cp && cp->pj) return __atomic_load_n(&cp->pj_done, __ATOMIC_ACQUIRE);
    if (cp && cp->ij) {
        if (!__atomic_load_n(&cp->issued, __ATOMIC_ACQUIRE)) return 0;
        if (cp->ij->st != HYLA_OK) return 1;
    }
    return !cp || cudaEventQuery(cp->done) != cudaErrorNotReady;
}

static hyla_status copy_wait(hyla_cuda_copy *cp) {
    if (!cp) return HYLA_OK;
    if (cp->pj) return pageable_wait(cp);
    if (cp->ij) {
        pthread_join(cp->th, NULL);
        issue_job *j = cp->ij;
        if (j->st != HYLA_OK) {
            hyla_status st = hyla_fail(j->st, "%s", j->msg);
            cudaStreamSynchronize(cp->c->copy_stream); /* what was issued before the failure */
            cudaEventDestroy(cp->done);
            free(j);
            free(cp);
            return st;
        }
        free(j);
    }
    cudaError_t e = cudaEventSynchronize(cp->done);
    cudaEventDestroy(cp->done);
    free(cp);
    if (e != cudaSuccess) return hyla_cuda_fail(e, "cudaEventSynchronize(copy)", __FILE__, __LINE__);
    return HYLA_OK;
}

extern "C" hyla_status hyla_cuda_snapshot_begin(hyla_backend *be, int n, void *const *host_dst,
                                                const void *const *dev_src, const size_t *bytes,
                                                hyla_cuda_copy **out) {
    hyla_cuda_ctx *c = cuda_ctx_of(be);
    *out = NULL;
    if (!c) return hyla_fail(HYLA_ERR_INVALID_ARG, "hyla_cuda_snapshot_begin: not a cuda backend");
    return copy_begin(c, n, host_dst, dev_src, bytes, cudaMemcpyDeviceToHost, out);
}

extern "C" hyla_status hyla_cuda_restore_begin(hyla_backend *be, int n, void *const *dev_dst,
                                               const void *const *host_src, const size_t *bytes,
                                               hyla_cuda_copy **out) {
    hyla_cuda_ctx *c = cuda_ctx_of(be);
    *out = NULL;
    if (!c) return hyla_fail(HYLA_ERR_INVALID_ARG, "hyla_cuda_restore_begin: not a cuda backend");
    return copy_begin(c, n, dev_dst, host_src, bytes, cudaMemcpyHostToDevice, out);
}

extern "C" int hyla_cuda_copy_done(const hyla_cuda_copy *c) { return copy_done(c); }

extern "C" hyla_status hyla_cuda_copy_wait(hyla_cuda_copy *c) { return copy_wait(c); }

/* ops->capture_*: the tickets are hyla_cuda_copy objects behind the ops' opaque type */
extern "C" hyla_status cu_capture_begin(hyla_cuda_ctx *c, int n, void *const *host_dst, const void *const *src,
                                        const size_t *bytes, hyla_capture **out) {
    hyla_cuda_copy *cp = NULL;
    *out = NULL;
    HYLA_TRY(copy_begin(c, n, host_dst, src, bytes, cudaMemcpyDeviceToHost, &cp));
    *out = (hyla_capture *)cp;
    return HYLA_OK;
}

/* ops->upload_begin: the reverse of a capture, same ticket type (compute waits for it) */
extern "C" hyla_status cu_upload_begin(hyla_cuda_ctx *c, int n, void *const *dst, const void *const *host_src,
                                       const size_t *bytes, hyla_capture **out) {
    hyla_cuda_copy *cp = NULL;
    *out = NULL;
    HYLA_TRY(copy_begin(c, n, dst, host_src, bytes, cudaMemcpyHostToDevice, &cp));
    *out = (hyla_capture *)cp;
    return HYLA_OK;
}

extern "C" int cu_capture_done(hyla_cuda_ctx *c, hyla_capture *t) {
    (void)c;
    return copy_done((const hyla_cuda_copy *)t);
}

extern "C" hyla_status cu_capture_end(hyla_cuda_ctx *c, hyla_capture *t) {
    (void)c;
    return copy_wait((hyla_cuda_copy *)t);
}
