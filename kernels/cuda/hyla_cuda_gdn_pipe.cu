/* hyla_cuda_gdn_pipe.cu — the pipelined fused GDN pass (k_gdn_pipe): chunk warps form chunk
 * c+1's tiles while state warps run chunk c's state pass, rows staged by tensor-map or bulk
 * copies. The fused form wherever it applies in an sm_90a build (cu_gdn_pipe_launch).
 * Threading: launched on the context's stream. */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_cuda_linattn.cuh"
#include "hyla_cuda_tma.cuh"

/* ---- fused GDN, pipelined: the chunk part of chunk c+1 beside the state pass of chunk c ----
 * k_gdn_pipe (the fused form in sm_90a builds, plain rows and SSE's row map alike; docs/CUDA.md
 * "Pipelined GDN pass", kernels/cuda/dev/NOTES.md variants 11-12): the same tiles, products and
 * bits as k_gdn_fused, with the block's 12 warps split in two
 * roles that run concurrently:
 *   warps 0-7 ("chunk warps") stage the chunks — three tensor-map bulk copies per chunk (q, k, v
 *     boxes of 64 rows of one head) on an mbarrier, or one bulk copy per row where there is no
 *     map (a row map, or the row count unknown); g, beta by 4-byte cp.async — and form chunk
 *     c+1's tiles: (b) cumulative decay; (c) one pass over the staging: K, Q in bf16 for (d), beta
 *     V, and beta e^b K, q~, k~ kept in registers; the next chunk's copies issued; (d) K K^T, Q K^T
 *     on the 10 lower 16x16 blocks (warp w block w; of blocks 8, 9 warps 0, 1 the K K^T, warps 2, 3
 *     the Q K^T); (e) diagonal inverses, beta e^b K and q~ written over K and Q; (f') W by forward
 *     substitution (warp w = key slab w);
 *   warps 8-11 ("state warps", one warpgroup) run the state pass of chunk c: warp 8 + w owns
 *     the value slabs 2w and 2w+1 (32 value columns) and keeps S^T (its 32 value rows x DKP keys,
 *     fp32) in registers, so it needs nobody else's part of the state: per slab and 16-token
 *     block, U0^T by forward substitution for the slab (the value-slab half of (f'), same code)
 *     and U^T = U0^T - S^T W^T; then O^T = S^T q~^T + U^T Aqk^T (16 tokens at a time, stored to o
 *     from registers) and S^T = e^(bC) S^T + U^T k~, with A operands from registers (S^T and U^T
 *     packed to bf16 as the other forms round S and U) and B operands the other forms' tiles
 *     ([n][k]: W, q~, Aqk; k~ row-major through ldmatrix.trans). In O and the S update each B
 *     fragment read from shared memory feeds both slabs, which halves those reads against one
 *     slab per warp (the shared-memory traffic that bounded the 16-warp form, NOTES.md).
 * Registers (setmaxnreg, sm_90a): launched at 168 per thread, the chunk warpgroups drop to 128
 * and the state warpgroup rises to 240 (S^T alone is 128).
 * Each element is the same sum of the same bf16 products in the same order as in k_gdn_fused
 * (a product and its transpose), so the results are bit-identical (tested with the WS forms).
 * Hand-off (named barriers, bar.arrive by one role, bar.sync by the other, 384 threads):
 *   GP_TILES chunk warps -> state warps: chunk c's tiles are complete;
 *   GP_VB / GP_TV / GP_W / GP_QAK state -> chunk warps: beta V, T, W, then q~/Aqk/k~ of the
 *   chunk before are read, so the next chunk's may be written (single buffers), except q (raw,
 *   then q~) which alternates between two buffers by chunk parity. Aqk's and k~'s values are held
 *   in the chunk warps' registers from (c)/(d) until GP_QAK. Shared memory (dk = 128): 97 KB fp32
 *   staging + 126 KB tiles, one block per SM; 384 threads. */
/* The A fragment of S^T (one slab, keys 16 kc..16 kc + 15) in bf16: pairs with the bits of
 * pack_bf16x2, packed per use by a volatile cvt from the fp32 state xor an opaque zero (z, read
 * from shared memory where it is used), so ptxas can neither share the packs of one phase's
 * blocks nor hoist them out of a loop, which would keep 64 packed registers of two slabs live
 * beside S^T's 128 */
template <int NKT>
__device__ __forceinline__ void st_frag(uint32_t (&sa)[4], const float (&st)[NKT][4], int kc, uint32_t z) {
#pragma unroll
    for (int r = 0; r < 4; r++) {
        const float lo = __uint_as_float(__float_as_uint(st[2 * kc + (r >> 1)][2 * (r & 1)]) ^ z);
        const float hi = __uint_as_float(__float_as_uint(st[2 * kc + (r >> 1)][2 * (r & 1) + 1]) ^ z);
        asm volatile("cvt.rn.bf16x2.f32 %0, %2, %1;\n" : "=r"(sa[r]) : "f"(lo), "f"(hi));
    }
}
__device__ __forceinline__ uint32_t opaque_zero(const float *p) { return *(const volatile uint32_t *)p; }
#define GP_T 384 /* 8 chunk warps (two warpgroups) + 4 state warps (one warpgroup) */
#define GP_C 256 /* threads of the chunk warps (0-7) */
/* Registers: the block is launched with 168 per thread (64K / 384); the chunk warpgroups give
 * 40 each back (128, what their code needs without spilling) and the state warpgroup takes
 * them (168 + 2 x 40 = 248; 240 asked): S^T of 32 value rows is 128 registers per thread.
 * setmaxnreg is an sm_90a instruction: built for plain sm_90 the kernel keeps 168 everywhere
 * (the state warps then spill) and the host does not pick it by default (HYLA_CUDA_SM90A). */
#ifdef HYLA_CUDA_SM90A
#define GP_BUILT_SM90A 1
#else
#define GP_BUILT_SM90A 0
#endif
/* (c)'s load batches: q, k pieces and beta V pieces loaded together before their stores */
#ifndef GP_CB
#define GP_CB 4
#endif
#ifndef GP_VBATCH
#define GP_VBATCH 8
#endif
#define GP_CREG 128
#define GP_SREG 240
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define GP_SETMAXNREG(act, n) asm volatile("setmaxnreg." act ".sync.aligned.u32 %0;\n" ::"n"(n))
#else
#define GP_SETMAXNREG(act, n)
#endif
#define GP_BC 1    /* chunk warps among themselves */
#define GP_TILES 2 /* chunk -> state warps */
#define GP_TV 3    /* state -> chunk warps: T, beta V read */
#define GP_W 4     /* state -> chunk warps: W read */
#define GP_QAK 5   /* state -> chunk warps: q~, Aqk, k~^T read */
#define GP_VB 6    /* state -> chunk warps: beta V read (into registers) */

/* tensor maps of q, k, v ({dk or dv, H, rows}, boxes {DKP or 128, 1, 64}); use = 0: row copies */
struct PipeMaps {
    CUtensorMap q, k, v;
    int use;
};
template <int DKP, int VW>
struct PipeSmem {
    static constexpr int LDK = DKP + 8, LDV = VW + 8;
    static constexpr size_t STG = ((size_t)2 * CH * DKP + (size_t)CH * VW + 3 * CH) * 4;
    static constexpr size_t TK = (size_t)CH * LDK * 2; /* Kb/Mb, Qbuf[2], Wb, k~ */
    static constexpr size_t TV = (size_t)CH * LDV * 2; /* Vb */
    static constexpr size_t AQ = (size_t)CH * 72 * 2;  /* Aqk, T */
    static constexpr size_t AF = (size_t)4 * 16 * 17 * 4; /* A's diagonal blocks, fp32 */
    static constexpr size_t SM = (size_t)(5 * CH + 4) * 4 + 16; /* bc be fq fm fk, decp[2] (+2), the mbarrier */
    static constexpr size_t TOTAL = STG + 5 * TK + TV + 2 * AQ + AF + SM;
    static_assert(STG % 16 == 0 && TK % 16 == 0 && TV % 16 == 0 && AQ % 16 == 0 && AF % 16 == 0,
                  "alignment");
};

#ifdef HYLA_FUSED_PROFILE
__device__ long long g_pprof_t[24];
__device__ int g_pprof_once;
/* clock64 with a memory clobber, so that it is read after a preceding bar.sync completes */
__device__ __forceinline__ long long gp_clock() {
    long long t;
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(t)::"memory");
    return t;
}
#define GPROF(k, who)                                                                                                  \
    if (cc == 20 && tid == (who) && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0) g_pprof_t[k] = gp_clock();
#else
#define GPROF(k, who)
#endif

template <int DKP, int VW>
__global__ void __launch_bounds__(GP_T, 1) k_gdn_pipe(ChunkArgs a, const __grid_constant__ PipeMaps pm) {
    typedef PipeSmem<DKP, VW> L;
    constexpr int NS = VW / 64; /* value slabs of 16 columns per state warp */
    static_assert(VW == 64 || VW == 128, "value blocks of 64 or 128 columns");
    constexpr int LDK = L::LDK, LDV = L::LDV, NB = DKP / 16, NKT = DKP / 8;
    constexpr int QI = CH * DKP / 4 / GP_C; /* 4-element pieces of a q or k tile per chunk thread */
    extern __shared__ __align__(128) unsigned char smem[];
    float *Kst = (float *)smem, *Qst = Kst + CH * DKP, *Vst = Qst + CH * DKP;
    float *Gst = Vst + CH * VW, *Bst = Gst + CH, *Wr = Bst + CH;
    unsigned char *sp_ = smem + L::STG;
    __nv_bfloat16 *Kb = (__nv_bfloat16 *)sp_, *Mb = Kb; /* K (c)-(d), then beta e^b K (e)-(f') */
    sp_ += L::TK;
    __nv_bfloat16 *Qbuf = (__nv_bfloat16 *)sp_; /* [2]: chunk parity; q (c)-(d), then q~ */
    sp_ += 2 * L::TK;
    __nv_bfloat16 *Wb = (__nv_bfloat16 *)sp_;
    sp_ += L::TK;
    __nv_bfloat16 *Vb = (__nv_bfloat16 *)sp_;
    sp_ += L::TV;
    __nv_bfloat16 *Kt = (__nv_bfloat16 *)sp_; /* k~ = e^(bC-b) K, row-major (the B operand of S^T += U^T k~) */
    sp_ += L::TK;
    __nv_bfloat16 *Aq = (__nv_bfloat16 *)sp_;
    sp_ += L::AQ;
    __nv_bfloat16 *Tb = (__nv_bfloat16 *)sp_;
    sp_ += L::AQ;
    float *Af = (float *)sp_; /* [4][16][17] */
    sp_ += L::AF;
    float *bc = (float *)sp_, *be = bc + CH, *fq = be + CH, *fm = fq + CH, *fk = fm + CH, *decp = fk + CH; /* decp[2] */

    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, tq = lane & 3;
    const int h = blockIdx.y, z = blockIdx.z, H = a.H, dk = a.dk, dv = a.dv, jb = blockIdx.x * VW;
    const int c0 = a.seq_c0[z], nc = a.seq_nc[z];
    if (nc <= 0) return; /* nothing selected this sequence: the state stays untouched */

    if (w < GP_C / 32) {
        /* ================= chunk warps ================= */
        GP_SETMAXNREG("dec", GP_CREG);
        uint64_t *mbar = (uint64_t *)(decp + 4);
        /* stage chunk c (its ld-th load: mbarrier phase ld): one bulk copy per row of q, k, v
         * (thread t of 0-191: row t % 64 of q, k or v) completing on the mbarrier; rows past len
         * zeroed by the thread instead; g, beta by 4-byte cp.async (threads 192-255). Columns
         * past dk (q, k) and past the block's value columns (v) stay zero from the start. */
        auto stage = [&](int tok0, int len) {
            const int nrows = len < CH ? len : CH, vcols = dv - jb < VW ? dv - jb : VW;
            if (pm.use) { /* three boxes (OOB columns and rows read as zero); rows past len
                           * inside the tensor are zeroed at (a) */
                if (tid == 0) {
                    mbar_expect_tx(mbar, (unsigned)(CH * (2 * DKP + VW) * 4));
                    tma_g2s_3d(Qst, &pm.q, 0, h, tok0, mbar);
                    tma_g2s_3d(Kst, &pm.k, 0, h, tok0, mbar);
                    tma_g2s_3d(Vst, &pm.v, jb, h, tok0, mbar);
                }
            } else if (tid == 0)
                mbar_expect_tx(mbar, (unsigned)nrows * (unsigned)(2 * dk + vcols) * 4u);
            if (pm.use) {
            } else if (tid < 3 * CH) {
                const int t = tid & (CH - 1), kind = tid >> 6; /* 0 q, 1 k, 2 v */
                float *dst = kind == 0 ? Qst + t * DKP : kind == 1 ? Kst + t * DKP : Vst + t * VW;
                if (t < len) {
                    int sp = 0;
                    float wt;
                    const size_t tok = chunk_row(a, tok0 + t, sp, wt);
                    const float *src = kind == 2 ? a.v + (tok * H + h) * dv + jb
                                                 : (kind == 0 ? (sp ? a.q2 : a.q) : (sp ? a.k2 : a.k)) + (tok * H + h) * dk;
                    bulk_g2s(dst, src, (unsigned)(kind == 2 ? vcols : dk) * 4u, mbar);
                } else {
                    for (int u = 0; u < (kind == 2 ? VW : DKP) / 4; u++) ((float4 *)dst)[u] = make_float4(0.f, 0.f, 0.f, 0.f);
                    fence_proxy_async_smem(); /* before a later chunk's bulk copy to this row */
                }
            }
            if (tid >= 3 * CH) {
                const int t = tid - 3 * CH;
                int sp = 0;
                float wt = 0.0f;
                const bool ok = t < len;
                const size_t tok = ok ? chunk_row(a, tok0 + t, sp, wt) : 0;
                cp_async4(Gst + t, ok ? (sp ? a.g2 : a.ga) + tok * H + h : a.ga, ok ? 4 : 0);
                cp_async4(Bst + t, ok ? (sp ? a.b2 : a.gb) + tok * H + h : a.gb, ok ? 4 : 0);
                Wr[t] = ok ? wt : 0.0f;
                cp_async_commit();
            }
        };
        /* the staging zeroed (padding columns stay zero), Aqk above the diagonal blocks zero for
         * every chunk ((d) writes the rest) */
        for (int x = tid; x < (2 * CH * DKP + CH * VW) / 4; x += GP_C) ((float4 *)Kst)[x] = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int x = tid; x < CH * CH; x += GP_C) {
            int r = x >> 6, s = x & 63;
            if ((s >> 4) > (r >> 4)) Aq[r * 72 + s] = __float2bfloat16_rn(0.0f);
        }
        if (tid == 0) {
            mbar_init(mbar, 1);
            ((uint32_t *)decp)[2] = 0u; /* the state warps' opaque zero */
        }
        fence_proxy_async_smem();
        nb_sync(GP_BC, GP_C);
        int curlen = a.ck_len[c0];
        stage(a.ck_tok0[c0], curlen);
        for (int cc = 0; cc < nc; cc++) {
            const int c = c0 + cc;
            __nv_bfloat16 *Qb = Qbuf + (cc & 1) * (L::TK / 2);
            GPROF(0, 0);
            /* the next chunk's table entries, loaded long before stage() needs them */
            const int ntok0 = cc + 1 < nc ? a.ck_tok0[c + 1] : 0, nlen = cc + 1 < nc ? a.ck_len[c + 1] : 0;
            mbar_wait(mbar, (unsigned)cc & 1u);
            cp_async_wait<0>();
            if (pm.use && curlen < CH) { /* rows past the chunk (the next sequence's) read as zero */
                for (int x = tid; x < (CH - curlen) * (2 * DKP + VW) / 4; x += GP_C) {
                    const int per = (2 * DKP + VW) / 4, t = curlen + x / per, u = x % per;
                    float *row = u < DKP / 4 ? Qst + t * DKP : u < DKP / 2 ? Kst + t * DKP : Vst + t * VW;
                    const int off = u < DKP / 4 ? u : u < DKP / 2 ? u - DKP / 4 : u - DKP / 2;
                    ((float4 *)row)[off] = make_float4(0.f, 0.f, 0.f, 0.f);
                }
                fence_proxy_async_smem(); /* before the next bulk copies to these rows */
            }
            nb_sync(GP_BC, GP_C); /* (a) the chunk's staging is visible */
            GPROF(1, 0);
            /* (b) cumulative log decay and per-row factors (k_gdn_fused's (b)) */
            if (w == 0) gdn_chunk_decay(Gst, Bst, a.scale, lane, bc, be, fq, fm, fk, decp + (cc & 1));
            nb_sync(GP_BC, GP_C);
            if (cc) nb_sync(GP_VB, GP_T); /* the state warps hold beta V of chunk c-1 */
            GPROF(2, 0);
            /* (c) one pass over the staging: K, Q (weighted rows) -> bf16 for (d); beta e^b K and
             * q~ (k_gdn_fused's (e) values) kept in registers until (d) is done, k~ until GP_QAK;
             * beta V */
            /* loads in batches of CB pieces before their stores (the compiler keeps the loads
             * after earlier stores to shared memory, which may alias: one round trip per batch,
             * not per piece) */
            constexpr int CB = QI < GP_CB ? QI : GP_CB; /* QI is 1 for dk <= 16 */
            static_assert(QI % CB == 0, "(c) batches");
            uint2 mbr[QI], qtr[QI], ktr[QI];
#pragma unroll
            for (int u0 = 0; u0 < QI; u0 += CB) {
                float4 kv[CB], qv[CB];
                float wt[CB], f[CB], fqq[CB], fkk[CB];
#pragma unroll
                for (int b = 0; b < CB; b++) {
                    const int x = tid + (u0 + b) * GP_C, t = x / (DKP / 4), i = (x % (DKP / 4)) * 4;
                    wt[b] = Wr[t];
                    f[b] = fm[t];
                    fqq[b] = fq[t];
                    fkk[b] = fk[t];
                    kv[b] = *(const float4 *)(Kst + t * DKP + i);
                    qv[b] = *(const float4 *)(Qst + t * DKP + i);
                }
#pragma unroll
                for (int b = 0; b < CB; b++) {
                    const int u = u0 + b, x = tid + u * GP_C, t = x / (DKP / 4), i = (x % (DKP / 4)) * 4;
                    float4 k4 = kv[b], q4 = qv[b];
                    k4.x *= wt[b];
                    k4.y *= wt[b];
                    k4.z *= wt[b];
                    k4.w *= wt[b];
                    q4.x *= wt[b];
                    q4.y *= wt[b];
                    q4.z *= wt[b];
                    q4.w *= wt[b];
                    *(uint2 *)(Kb + t * LDK + i) = make_uint2(pack_bf16x2(k4.x, k4.y), pack_bf16x2(k4.z, k4.w));
                    *(uint2 *)(Qb + t * LDK + i) = make_uint2(pack_bf16x2(q4.x, q4.y), pack_bf16x2(q4.z, q4.w));
                    mbr[u] = make_uint2(pack_bf16x2(k4.x * f[b], k4.y * f[b]), pack_bf16x2(k4.z * f[b], k4.w * f[b]));
                    qtr[u] = make_uint2(pack_bf16x2(q4.x * fqq[b], q4.y * fqq[b]), pack_bf16x2(q4.z * fqq[b], q4.w * fqq[b]));
                    ktr[u] = make_uint2(pack_bf16x2(k4.x * fkk[b], k4.y * fkk[b]), pack_bf16x2(k4.z * fkk[b], k4.w * fkk[b]));
                }
            }
            constexpr int VQ = VW / 4, VQS = VW == 128 ? 5 : 4; /* 4-column pieces of a row of v (2^VQS) */
            constexpr int VBT = CH * VQ / GP_C < GP_VBATCH ? CH * VQ / GP_C : GP_VBATCH;
            static_assert(CH * VQ % (GP_C * VBT) == 0, "beta V batches");
#pragma unroll 1
            for (int x0 = tid; x0 < CH * VQ; x0 += GP_C * VBT) {
                float4 vv[VBT];
                float f[VBT];
#pragma unroll
                for (int b = 0; b < VBT; b++) {
                    const int x = x0 + b * GP_C;
                    vv[b] = *(const float4 *)(Vst + (x >> VQS) * VW + (x & (VQ - 1)) * 4);
                    f[b] = be[x >> VQS];
                }
#pragma unroll
                for (int b = 0; b < VBT; b++) {
                    const int x = x0 + b * GP_C, t = x >> VQS, j = (x & (VQ - 1)) * 4;
                    *(uint2 *)(Vb + t * LDV + j) =
                        make_uint2(pack_bf16x2(vv[b].x * f[b], vv[b].y * f[b]), pack_bf16x2(vv[b].z * f[b], vv[b].w * f[b]));
                }
            }
            nb_sync(GP_BC, GP_C); /* the staging is consumed */
            GPROF(3, 0);
            if (cc + 1 < nc) stage(ntok0, nlen); /* the next chunk streams in now */
            GPROF(4, 0);
            if (cc) nb_sync(GP_TV, GP_T); /* the state warps have read T of chunk c-1 */
            GPROF(5, 0);
            /* (d) K K^T and Q K^T on the 10 lower 16x16 blocks (row block rb, column block cb):
             * warp w takes block w, and of blocks 8 and 9 warps 0, 1 the K K^T and warps 2, 3 the
             * Q K^T (at most three products per warp); A's diagonal blocks in fp32 (Af), -A below
             * them in bf16 (T's place), Aqk's values kept in registers until GP_QAK */
            uint32_t aqr[2][4];
#pragma unroll
            for (int rep = 0; rep < 2; rep++) {
                const int bi = rep ? 8 + (w & 1) : w;
                const bool dokk = !rep || w < 2, doqk = !rep || (w >= 2 && w < 4);
#pragma unroll
                for (int e = 0; e < 4; e++) aqr[rep][e] = 0u;
                if (dokk || doqk) {
                    const int rb = (bi >= 1) + (bi >= 3) + (bi >= 6), cb = bi - rb * (rb + 1) / 2;
                    float kk[2][4], qk[2][4];
                    frag_zero(kk);
                    frag_zero(qk);
#pragma unroll
                    for (int kc = 0; kc < DKP / 16; kc++) {
                        uint32_t ak[4], aq[4], bf[2][2];
                        if (dokk) ldsm_frag_a(ak, Kb + (16 * rb) * LDK + kc * 16, LDK);
                        if (doqk) ldsm_frag_a(aq, Qb + (16 * rb) * LDK + kc * 16, LDK);
                        ldsm_frag_b2_nk(bf, Kb + (16 * cb) * LDK + kc * 16, LDK);
#pragma unroll
                        for (int n = 0; n < 2; n++) {
                            if (dokk) mma_bf16_16816(kk[n], ak, bf[n]);
                            if (doqk) mma_bf16_16816(qk[n], aq, bf[n]);
                        }
                    }
                    if (rep == 0) GPROF(18, 0);
                    if (rep == 1) GPROF(21, 0);
                    /* the epilogue: every value it reads from shared memory loaded first (eight
                     * loads in flight together instead of a load-store chain per element, which
                     * the compiler keeps in order since Af and Tb may alias bc and be), the
                     * off-diagonal T pairs stored as one 32-bit word */
                    const int r0 = 16 * rb + g, s0 = 16 * cb + 2 * tq;
                    const float bcr[2] = {bc[r0], bc[r0 + 8]}, ber[2] = {be[r0], be[r0 + 8]};
                    const float bcs[4] = {bc[s0], bc[s0 + 1], bc[s0 + 8], bc[s0 + 9]};
                    float av[2][4], tv[2][4];
#pragma unroll
                    for (int n = 0; n < 2; n++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const int r = r0 + (e >> 1) * 8, s = s0 + n * 8 + (e & 1);
                            const float gam = (s <= r) ? expf(bcr[e >> 1] - bcs[2 * n + (e & 1)]) : 0.0f;
                            tv[n][e] = (cb == rb) ? ((s < r) ? ber[e >> 1] * gam * kk[n][e] : 0.0f)
                                                  : -(ber[e >> 1] * gam * kk[n][e]);
                            av[n][e] = a.scale * gam * qk[n][e];
                        }
                    if (dokk) {
                        if (cb == rb) {
#pragma unroll
                            for (int n = 0; n < 2; n++)
#pragma unroll
                                for (int e = 0; e < 4; e++)
                                    Af[rb * 272 + (g + (e >> 1) * 8) * 17 + n * 8 + 2 * tq + (e & 1)] = tv[n][e];
                        } else {
#pragma unroll
                            for (int n = 0; n < 2; n++)
#pragma unroll
                                for (int h2 = 0; h2 < 2; h2++)
                                    *(uint32_t *)(Tb + (r0 + 8 * h2) * 72 + s0 + n * 8) = pack_bf16x2(tv[n][2 * h2], tv[n][2 * h2 + 1]);
                        }
                    }
                    if (doqk)
#pragma unroll
                        for (int n = 0; n < 2; n++) {
                            aqr[rep][2 * n] = pack_bf16x2(av[n][0], av[n][1]);
                            aqr[rep][2 * n + 1] = pack_bf16x2(av[n][2], av[n][3]);
                        }
                    if (rep == 0) GPROF(20, 0);
                }
            }
            GPROF(19, 0);
            nb_sync(GP_BC, GP_C);
            GPROF(6, 0);
            /* (e) diagonal blocks of T (warps 0-3); beta e^b K over K and q~ over q (every thread) */
            if (w < 4) {
                const int s = lane & 15;
                float x[16];
                gdn_diag_inverse_col(Af + w * 272, 17, s, x);
                if (lane < 16) {
#pragma unroll
                    for (int t = 0; t < 16; t++) Tb[(16 * w + t) * 72 + 16 * w + s] = __float2bfloat16_rn(x[t]);
                }
            }
#pragma unroll
            for (int u = 0; u < QI; u++) {
                const int x = tid + u * GP_C, t = x / (DKP / 4), i = (x % (DKP / 4)) * 4;
                *(uint2 *)(Mb + t * LDK + i) = mbr[u];
                *(uint2 *)(Qb + t * LDK + i) = qtr[u];
            }
            nb_sync(GP_BC, GP_C); /* T, beta e^b K, q~ complete */
            GPROF(7, 0);
            /* (f') W = T (beta e^b K): k_gdn_fused's forward substitution, key slab w */
            uint32_t xf[4][4];
            if (w < NB) {
#pragma unroll
                for (int i = 0; i < 4; i++) ldsm_frag_a_kn(xf[i], Mb + 16 * w + (16 * i) * LDK, LDK);
            }
            if (cc) nb_sync(GP_W, GP_T); /* the state warps have read W of chunk c-1 */
            GPROF(8, 0);
            if (w < NB) {
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    float xo[2][4];
                    fs_block_row(xf, Tb, i, xo);
#pragma unroll
                    for (int nt = 0; nt < 2; nt++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const int r = 16 * i + 8 * nt + 2 * tq + (e & 1), m = g + 8 * (e >> 1);
                            ((unsigned short *)Wb)[r * LDK + 16 * w + m] =
                                (unsigned short)(xf[i][2 * nt + (e >> 1)] >> (16 * (e & 1)));
                        }
                }
            }
            GPROF(9, 0);
            if (cc) nb_sync(GP_QAK, GP_T); /* the state warps are done with chunk c-1 */
            GPROF(10, 0);
#pragma unroll
            for (int u = 0; u < QI; u++) {
                const int x = tid + u * GP_C, t = x / (DKP / 4), i = (x % (DKP / 4)) * 4;
                *(uint2 *)(Kt + t * LDK + i) = ktr[u];
            }
#pragma unroll
            for (int rep = 0; rep < 2; rep++) {
                const int bi = rep ? 8 + (w & 1) : w;
                if (!rep || (w >= 2 && w < 4)) { /* the warps that formed these Aqk values */
                    const int rb = (bi >= 1) + (bi >= 3) + (bi >= 6), cb = bi - rb * (rb + 1) / 2;
#pragma unroll
                    for (int n = 0; n < 2; n++)
#pragma unroll
                        for (int e = 0; e < 4; e += 2) {
                            int r = 16 * rb + g + (e >> 1) * 8, s = 16 * cb + n * 8 + 2 * tq;
                            *(uint32_t *)(Aq + r * 72 + s) = aqr[rep][2 * n + (e >> 1)];
                        }
                }
            }
            nb_arrive(GP_TILES, GP_T); /* chunk c's tiles are complete */
            GPROF(11, 0);
            curlen = nlen;
        }
    } else {
        /* ================= state warps ================= */
        GP_SETMAXNREG("inc", GP_SREG);
        /* warp 8 + sw owns the value slabs 2 sw and 2 sw + 1 (32 value columns from j0): each B
         * fragment read from shared memory feeds both slabs' products. A slab past dv runs on
         * zeros (its staged columns are zero) and stores nothing: no branch on it, since values
         * loaded and used under two such branches stay live through the whole loop in ptxas */
        const int sw = w - GP_C / 32, j0 = jb + 16 * NS * sw;
        float *S = a.S[z] + (size_t)h * dk * dv;
        float st[NS][NKT][4]; /* S^T of slab s: (value j0 + 16 s + g + 8(e/2), key 8 kt + 2 tq + e%2) */
#pragma unroll
        for (int s = 0; s < NS; s++)
#pragma unroll
            for (int kt = 0; kt < NKT; kt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int i = 8 * kt + 2 * tq + (e & 1), j = j0 + 16 * s + g + 8 * (e >> 1);
                    st[s][kt][e] = (i < dk && j < dv) ? S[(size_t)i * dv + j] : 0.0f;
                }
        for (int cc = 0; cc < nc; cc++) {
            const int c = c0 + cc;
            const __nv_bfloat16 *Qb = Qbuf + (cc & 1) * (L::TK / 2);
            GPROF(12, GP_C);
            nb_sync(GP_TILES, GP_T);
            GPROF(13, GP_C);
            const int tok0 = a.ck_tok0[c], len = a.ck_len[c];
            /* per 16-token block i: U0^T by k_gdn_fused's (f') for each value slab (its C
             * fragments u0[s][nt]: value row, token 16i + 8nt + ..), then U^T = U0^T - S^T W^T for
             * the block, kept as the bf16 A fragment ua[s][i] (k = the block's tokens) */
            uint32_t ua[NS][4][4];
#pragma unroll
            for (int s = 0; s < NS; s++) { /* one slab after the other, slab 1's V fragments loaded
                                            * after slab 0's U: 16 live registers fewer */
                uint32_t xf[4][4];
#pragma unroll
                for (int i = 0; i < 4; i++) ldsm_frag_a_kn(xf[i], Vb + 16 * NS * sw + 16 * s + (16 * i) * LDV, LDV);
                if (s == NS - 1 && cc + 1 < nc) nb_arrive(GP_VB, GP_T); /* beta V is in registers */
                /* S^T W^T for the chunk's four token blocks in one sweep over the keys (eight
                 * independent accumulator chains, each S^T pair packed once), then the blocks'
                 * forward substitution and U^T = U0^T - S^T W^T */
                float acc[4][2][4];
                frag_zero(acc);
                const uint32_t zz = opaque_zero(decp + 2);
#pragma unroll
                for (int kc = 0; kc < NB; kc++) {
                    uint32_t sa[4];
                    st_frag(sa, st[s], kc, zz);
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        uint32_t bf[2][2];
                        ldsm_frag_b2_nk(bf, Wb + (16 * i) * LDK + 16 * kc, LDK);
                        mma_bf16_16816(acc[i][0], sa, bf[0]);
                        mma_bf16_16816(acc[i][1], sa, bf[1]);
                    }
                }
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    float u0[2][4];
                    fs_block_row(xf, Tb, i, u0);
                    ua[s][i][0] = pack_bf16x2(u0[0][0] - acc[i][0][0], u0[0][1] - acc[i][0][1]);
                    ua[s][i][1] = pack_bf16x2(u0[0][2] - acc[i][0][2], u0[0][3] - acc[i][0][3]);
                    ua[s][i][2] = pack_bf16x2(u0[1][0] - acc[i][1][0], u0[1][1] - acc[i][1][1]);
                    ua[s][i][3] = pack_bf16x2(u0[1][2] - acc[i][1][2], u0[1][3] - acc[i][1][3]);
                }
            }
            if (cc + 1 < nc) nb_arrive(GP_TV, GP_T);
            GPROF(14, GP_C);
            GPROF(15, GP_C);
            if (cc + 1 < nc) nb_arrive(GP_W, GP_T);
            {
                /* O^T = S^T q~^T + U^T Aqk^T, 32 tokens at a time (eight accumulator chains),
                 * stored from registers */
#pragma unroll 1
                for (int hf = 0; hf < 2; hf++) {
                    float oa[NS][4][4];
                    frag_zero(oa);
                    const uint32_t zz = opaque_zero(decp + 2);
#pragma unroll
                    for (int kc = 0; kc < NB; kc++) {
                        uint32_t sa[NS][4];
#pragma unroll
                        for (int s = 0; s < NS; s++) st_frag(sa[s], st[s], kc, zz);
#pragma unroll
                        for (int q2 = 0; q2 < 2; q2++) {
                            uint32_t bf[2][2];
                            ldsm_frag_b2_nk(bf, Qb + (32 * hf + 16 * q2) * LDK + 16 * kc, LDK);
#pragma unroll
                            for (int s = 0; s < NS; s++) {
                                mma_bf16_16816(oa[s][2 * q2], sa[s], bf[0]);
                                mma_bf16_16816(oa[s][2 * q2 + 1], sa[s], bf[1]);
                            }
                        }
                    }
#pragma unroll
                    for (int kc = 0; kc < CH / 16; kc++) {
#pragma unroll
                        for (int q2 = 0; q2 < 2; q2++) {
                            uint32_t bf[2][2];
                            ldsm_frag_b2_nk(bf, Aq + (32 * hf + 16 * q2) * 72 + 16 * kc, 72);
#pragma unroll
                            for (int s = 0; s < NS; s++) {
                                mma_bf16_16816(oa[s][2 * q2], ua[s][kc], bf[0]);
                                mma_bf16_16816(oa[s][2 * q2 + 1], ua[s][kc], bf[1]);
                            }
                        }
                    }
#pragma unroll
                    for (int s = 0; s < NS; s++)
#pragma unroll
                        for (int n = 0; n < 4; n++)
#pragma unroll
                            for (int e = 0; e < 4; e++) {
                                int t = 32 * hf + 8 * n + 2 * tq + (e & 1), j = j0 + 16 * s + g + 8 * (e >> 1);
                                if (t < len && j < dv) a.o[((size_t)(tok0 + t) * H + h) * dv + j] = oa[s][n][e];
                            }
                }
                GPROF(16, GP_C);
                /* S^T = e^(bC) S^T + U^T k~ */
                const float d = decp[cc & 1];
#pragma unroll
                for (int s = 0; s < NS; s++)
#pragma unroll
                    for (int kt = 0; kt < NKT; kt++)
#pragma unroll
                        for (int e = 0; e < 4; e++) st[s][kt][e] *= d;
#pragma unroll
                for (int kc = 0; kc < CH / 16; kc++) {
#pragma unroll
                    for (int nb = 0; nb < NB; nb++) {
                        uint32_t bf[2][2];
                        ldsm_frag_b2_kn(bf, Kt + (16 * kc) * LDK + 16 * nb, LDK);
#pragma unroll
                        for (int s = 0; s < NS; s++) {
                            mma_bf16_16816(st[s][2 * nb], ua[s][kc], bf[0]);
                            mma_bf16_16816(st[s][2 * nb + 1], ua[s][kc], bf[1]);
                        }
                    }
                }
            }
            if (cc + 1 < nc) nb_arrive(GP_QAK, GP_T);
            GPROF(17, GP_C);
        }
        float *const *Sv = a.S;
        asm volatile("" : "+l"(Sv));
        S = Sv[z] + (size_t)h * dk * dv;
        /* the store's indices from an opaque zero: computed here, not kept live through the
         * chunk loop from the load above (~40 registers of addresses and predicates) */
        const int zo = (int)opaque_zero(decp + 2), tqz = tq + zo, j0z = j0 + g + zo;
#pragma unroll
        for (int s = 0; s < NS; s++)
#pragma unroll
            for (int kt = 0; kt < NKT; kt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int i = 8 * kt + 2 * tqz + (e & 1), j = j0z + 16 * s + 8 * (e >> 1);
                    if (i < dk && j < dv) S[(size_t)i * dv + j] = st[s][kt][e];
                }
    }
#ifdef HYLA_FUSED_PROFILE
    __syncthreads();
    if (nc > 21 && tid == 0 && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && atomicAdd(&g_pprof_once, 1) == 0) {
        long long *p = g_pprof_t, t0 = p[0];
        printf("pipe profile (cycles from the chunk warps' start of chunk 20): chunk warps: staged %lld, (b) %lld, "
               "(c) %lld, stage issued %lld, TV %lld, (d) %lld, (e) %lld, W %lld, (f') %lld, QAK %lld, tiles %lld; state "
               "warps (chunk 20): wait from %lld to %lld, U0+U %lld (%lld), O %lld, S %lld\n",
               p[1] - t0, p[2] - t0, p[3] - t0, p[4] - t0, p[5] - t0, p[6] - t0, p[7] - t0, p[8] - t0, p[9] - t0,
               p[10] - t0, p[11] - t0, p[12] - t0, p[13] - t0, p[14] - t0, p[15] - t0, p[16] - t0, p[17] - t0);
        printf("pipe profile: warp 0 in (d): block 0 products %lld, epilogue %lld; second product %lld, all done %lld\n",
               p[18] - t0, p[20] - t0, p[21] - t0, p[19] - t0);
    }
#endif
}

/* ================================================================ host side */

/* The pipelined pass's tensor maps of q, k, v (3-D: {columns, head, row}; boxes of one head's 64
 * rows, DKP key columns or the block's VW value columns; out-of-range elements read as zero), through the
 * driver's cuTensorMapEncodeTiled (found once at run time; without it the kernel copies rows).
 * Returns 0 where a map cannot be made (then rows). */
static int pipe_maps(PipeMaps *pm, const ChunkArgs &ca, int dkp, int vw) {
    PFN_cuTensorMapEncodeTiled_v12000 enc = cu_tensor_map_encoder();
    if (!enc || ca.nrows <= 0 || ca.nrows > 0x7fffffffLL) return 0;
    const cuuint32_t es[3] = {1, 1, 1};
    const float *src[3] = {ca.q, ca.k, ca.v};
    CUtensorMap *dst[3] = {&pm->q, &pm->k, &pm->v};
    for (int x = 0; x < 3; x++) {
        const cuuint64_t cols = x < 2 ? (cuuint64_t)ca.dk : (cuuint64_t)ca.dv;
        const cuuint64_t dim[3] = {cols, (cuuint64_t)ca.H, (cuuint64_t)ca.nrows};
        const cuuint64_t str[2] = {cols * 4, cols * 4 * (cuuint64_t)ca.H};
        const cuuint32_t box[3] = {x < 2 ? (cuuint32_t)dkp : (cuuint32_t)vw, 1u, (cuuint32_t)CH};
        if (enc(dst[x], CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, (void *)src[x], dim, str, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
            return 0;
    }
    return 1;
}

template <int DKP, int VW>
static hyla_status launch_pipe_vw(hyla_cuda_ctx *c, const ChunkArgs &ca, int nseq, int *launched) {
    typedef PipeSmem<DKP, VW> L;
    if (!(GP_BUILT_SM90A && ca.vec4 && ca.dv % 4 == 0 && L::TOTAL <= c->smem_optin)) return HYLA_OK;
    PipeMaps pm;
    memset(&pm, 0, sizeof pm);
    pm.use = !ca.rsrc && ca.nrows > 0 && pipe_maps(&pm, ca, DKP, VW); /* else one bulk copy per row */
    HYLA_TRY(cu_launch_dyn(c, k_gdn_pipe<DKP, VW>, dim3(cu_blocks(ca.dv, VW), ca.H, nseq), GP_T, L::TOTAL, ca, pm));
    *launched = 1;
    return HYLA_OK;
}

/* Value blocks of 128 columns, or of 64 where the 128-column blocks would leave more than half
 * the SMs idle (a few long sequences): twice the blocks, each state warp with half the columns,
 * so the chain of chunks is shorter; the chunk tiles are formed by each value block, and every
 * column's arithmetic is the same (the same bits). HYLA_CUDA_GDN_PIPE_VW = 64 | 128 forces one. */
template <int DKP>
static hyla_status launch_pipe(hyla_cuda_ctx *c, const ChunkArgs &ca, int nseq, int *launched) {
    *launched = 0;
    const long blocks128 = (long)cu_blocks(ca.dv, 128) * ca.H * nseq;
    const int vw = c->gdn_pipe_vw ? c->gdn_pipe_vw : 2 * blocks128 <= c->sm_count ? 64 : 128;
    if (vw == 64) return launch_pipe_vw<DKP, 64>(c, ca, nseq, launched);
    return launch_pipe_vw<DKP, 128>(c, ca, nseq, launched);
}

hyla_status cu_gdn_pipe_launch(hyla_cuda_ctx *c, const ChunkArgs &ca, int nseq, int *launched) {
    return dkp_dispatch<128>(ca.dkp, [&](auto D) { return launch_pipe<decltype(D)::value>(c, ca, nseq, launched); });
}
