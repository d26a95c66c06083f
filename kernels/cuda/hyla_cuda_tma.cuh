/* hyla_cuda_tma.cuh — mbarriers and the copy engine's bulk and tensor copies (sm_90), shared by
 * the kernels that stage tiles through them (the pipelined GDN pass, the warpgroup linear, the
 * chunked state pass k_chunk_b_wg), and the host's lookup of the driver's tensor-map encoder. */
#ifndef HYLA_CUDA_TMA_CUH
#define HYLA_CUDA_TMA_CUH

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <stdint.h>

/* mbarrier and bulk copies (sm_90): whole rows or boxes global -> shared by the copy engine,
 * completing on an mbarrier (transaction bytes): no per-16-byte issue cost in the threads */
__device__ __forceinline__ unsigned smem_u32(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(uint64_t *m, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(m)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t *m, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(m)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t *m, unsigned parity) {
    asm volatile("{\n .reg .pred P1;\n LAB_WAIT:\n mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n @P1 bra DONE;\n"
                 " bra LAB_WAIT;\n DONE:\n }\n" ::"r"(smem_u32(m)), "r"(parity) : "memory");
}
/* a plain arrival (no transaction bytes): a consumer telling the producer a stage is free */
__device__ __forceinline__ void mbar_arrive(uint64_t *m) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(m)) : "memory");
}
__device__ __forceinline__ void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
/* one box of a 2-D tensor map ({inner x, outer y}) */
__device__ __forceinline__ void tma_g2s_2d(void *dst, const CUtensorMap *map, int x, int y, uint64_t *m) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
                 "[%4];\n" ::"r"(smem_u32(dst)),
                 "l"((unsigned long long)map), "r"(x), "r"(y), "r"(smem_u32(m))
                 : "memory");
}
/* one box of a 3-D tensor map (the chunk's 64 rows of one head: {columns, head, row}) */
__device__ __forceinline__ void tma_g2s_3d(void *dst, const CUtensorMap *map, int x, int y, int zc, uint64_t *m) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, "
                 "%4}], [%5];\n" ::"r"(smem_u32(dst)),
                 "l"((unsigned long long)map), "r"(x), "r"(y), "r"(zc), "r"(smem_u32(m))
                 : "memory");
}
__device__ __forceinline__ void bulk_g2s(void *dst, const void *src, unsigned bytes, uint64_t *m) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(m))
                 : "memory");
}

/* The driver's cuTensorMapEncodeTiled, found once at run time (NULL: no tensor maps; callers
 * keep a path without them). */
static inline PFN_cuTensorMapEncodeTiled_v12000 cu_tensor_map_encoder(void) {
    static PFN_cuTensorMapEncodeTiled_v12000 enc;
    static int looked;
    if (!__atomic_load_n(&looked, __ATOMIC_ACQUIRE)) {
        void *fn = NULL;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) == cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            enc = (PFN_cuTensorMapEncodeTiled_v12000)fn;
        else
            (void)cudaGetLastError();
        __atomic_store_n(&looked, 1, __ATOMIC_RELEASE);
    }
    return enc;
}

#endif
