/* hyla_cuda_gdn_fused.cu — GDN's fused chunked prefill: kernels A and B in one pass per
 * (sequence, head, 128 value columns), the state in mma accumulators (k_gdn_fused), in the forms
 * chosen by shape (cu_gdn_fused_launch); the pipelined form is in hyla_cuda_gdn_pipe.cu.
 * Threading: launched on the context's stream. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_cuda_linattn.cuh"
#include "hyla_cuda_tma.cuh"

/* ---- fused GDN prefill: kernels A and B in one ----
 * One block of 16 warps per (sequence, head, 128 value columns) walks the sequence's chunks in
 * order with the state in fp32 mma accumulators, as kernel B does, and computes each chunk's
 * kernel-A quantities itself in shared memory: nothing but q, k, v, g, beta is read from
 * global memory and nothing but o (and the state at the end) is written. Per chunk:
 *   stage  the chunk's fp32 rows arrive by cp.async into a staging area (issued while the
 *          previous chunk was still computing: right after its staging was consumed);
 *   (b)    warp 0: cumulative log decay bc by a warp scan, per-row factors;
 *   (c)    K, Q -> bf16;  (d) K K^T, Q K^T on tensor cores -> A = tril(diag(beta) K K^T G, -1):
 *          its diagonal 16x16 blocks in fp32, bf16(-A) below them (into T's place), and
 *          Aqk = scale tril(Q K^T G) in bf16 (G = e^(bc_t - bc_s) for s <= t);
 *   (e)    warps 0-3 invert the diagonal 16x16 blocks of I + A (a lane per column, the column
 *          in registers) while warps 4-15 form beta e^b K, beta V, q~ = scale e^b q and
 *          k~^T = (e^(bC - b) k)^T from the fp32 staging; then the next chunk is staged;
 *   (f')   W = T (beta e^b K) and U0 = T (beta V) without forming T: each warp solves
 *          (I + A) X = B for its own 16 columns of B = [beta e^b K | beta V] by blocked forward
 *          substitution on tensor cores (W to its place in R2, U0 to an fp32 tile over R1, read
 *          at the start of (i));
 *   (i)    each group of 4 warps (32 value columns): U = U0 - W S, O = q~ S + Aqk U,
 *          S = e^(bC) S + k~^T U.
 * bf16 operands, fp32 accumulation: the results agree with kernels A and B up to rounding
 * (kernels/cuda/dev/NOTES.md variant 8 for the earlier form that formed T in fp32). Sequences
 * with SSE row maps read their rows through chunk_row. Shared memory for dk = 128: 99 KB staging
 * + 127 KB tiles, one block per SM. */
#define FU_T 512

/* -DHYLA_FUSED_PROFILE (diagnostic builds only): block (0,0,0) records clock64() at the phase
 * boundaries of its chunk 20 and the first such launch prints them; in the split form's chunk
 * part (MODE 1) thread 0 of block (0,0,0) sums each interval over its run of chunks instead and
 * the first launch prints the means a chunk. */
#ifdef HYLA_FUSED_PROFILE
__device__ long long g_fprof_t[20];
__device__ int g_fprof_once, g_fprof_m1_once;
#define FPROF(k)                                                                                                       \
    if (!MODE && cc == 20 && tid == 0 && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0) g_fprof_t[k] = clock64(); \
    if (MODE && fp1) {                                                                                                 \
        long long t_ = clock64();                                                                                      \
        fp1_acc[k] += t_ - fp1_last;                                                                                   \
        fp1_last = t_;                                                                                                 \
    }
#else
#define FPROF(k)
#endif

template <int DKP, int WS = 0>
struct FusedSmem {
    static constexpr int LDK = DKP + 8, LDV = 136;
    /* the U0 tile [64][U0LD] fp32 (U0 = T beta V for the block's 128 value columns; the row
     * stride 132 makes the transposed writes of phase (f') conflict-free) over R1 */
    static constexpr int U0LD = 132;
    static constexpr size_t U0SZ = (size_t)CH * U0LD * 4;
    /* staging: Kst, Qst [64][DKP], Vst [64][128], Gst, Bst, Wr [64] fp32 */
    static constexpr size_t STG = ((size_t)2 * CH * DKP + (size_t)CH * 128 + 3 * CH) * 4;
    /* R1: Kb [64][LDK] (-> beta e^b K) and Vb [64][LDV]; in the state pass SbT [4][32][LDK];
     * between them the U0 tile (R1 unchanged at DKP = 128, larger below) */
    static constexpr size_t R1a = (size_t)CH * LDK * 2 + (size_t)CH * LDV * 2, R1b = (size_t)4 * 32 * LDK * 2;
    static constexpr size_t R1c = R1a > R1b ? R1a : R1b;
    static constexpr size_t R1 = R1c > U0SZ ? R1c : U0SZ;
    static constexpr size_t QB = (size_t)CH * LDK * 2; /* Qb: q, then q~ */
    static constexpr size_t KT = (size_t)DKP * 72 * 2; /* k~^T [DKP][72] */
    static constexpr size_t AQ = (size_t)CH * 72 * 2;  /* Aqk [64][72], and T [64][72] */
    /* R2: Af [64][65] fp32 (only its diagonal 16x16 blocks); once T is done W [64][LDK] and UT
     * [4][32][72] (WS: UT at the end of R2, so that T, W and the rest of R2 are one free span in
     * the O phase) */
    static constexpr size_t R2a = (size_t)CH * 65 * 4,
                            R2b = (size_t)CH * LDK * 2 + (size_t)4 * 32 * 72 * 2;
    static constexpr size_t R2 = R2a > R2b ? R2a : R2b;
    static constexpr size_t UTSZ = (size_t)4 * 32 * 72 * 2, UTOFF = WS ? R2 - UTSZ : (size_t)CH * LDK * 2;
    /* WS: the O tile [64][128] fp32 of the chunk spans OPAD (a pad before T), T and R2 up to UT */
    static constexpr size_t OB = (size_t)CH * 128 * 4;
    static constexpr size_t OPAD = WS && OB > AQ + UTOFF ? OB - AQ - UTOFF : 0;
    static constexpr size_t SM = (size_t)6 * CH * 4 + 16; /* bc be fq fm fk dec, an mbarrier */
    static constexpr size_t TOTAL = STG + R1 + QB + KT + 2 * AQ + OPAD + R2 + SM;
    static_assert(UTOFF >= (size_t)CH * LDK * 2, "UT overlaps W");
    static_assert(!WS || OPAD + AQ + UTOFF >= OB, "O tile overlaps UT");
    static_assert((STG + R1 + QB + KT + AQ) % 16 == 0 && OPAD % 16 == 0 && UTOFF % 16 == 0, "alignment");
    static_assert(U0SZ <= R1 && STG % 16 == 0, "U0 tile");
};

/* barrier among the block's compute warps: all threads, or (WS) warps 0-15 only */
template <int WS>
__device__ __forceinline__ void fu_sync() {
    if (WS)
        nb_sync(1, FU_T);
    else
        __syncthreads();
}
#define FU_FULL 2  /* producer -> compute: the chunk's staging landed and the previous O tile is read
                    * out into the producers' registers */
#define FU_EMPTY 3 /* compute -> producer: the staging area is consumed */
#define FU_OREADY 4 /* compute -> producer: the chunk's O tile is in shared memory */
/* producer warps of the WS form: a warpgroup of 4 (one per SM sub-partition); threads of the
 * block: the 16 compute warps and these */
#define FU_PW(ws) ((ws) ? 4 : 0)
#define FU_WTN(ws) (FU_T + 32 * FU_PW(ws))

#ifdef HYLA_FUSED_PROFILE
#define FPROFP(k)                                                                                                      \
    if (cc == 20 && threadIdx.x == FU_T && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0) g_fprof_t[k] = clock64();
#else
#define FPROFP(k)
#endif

/* The producer warps of the WS form (warps 16-19, warp pw owning the chunk rows [16 pw, 16 pw +
 * 16)): they stage v, g, beta and the row weights of chunk c+1 (cp.async 16-byte pieces, a row
 * of v per instruction; the row sources of the warp's rows computed once per chunk and broadcast
 * by shuffles; q and k too for the first chunk, later the compute warps issue those) as soon as
 * the compute warps release the staging area; then each reads its 16 rows of chunk c's O tile
 * into registers, waits for its copies, opens the next chunk (FULL) and only then issues the o
 * stores (one 512-byte row per st.global.v4), so the compute warps never wait for their issue.
 * The values are those of the plain staging and o stores. Needs vec (dk % 4 == 0, dv % 4 == 0,
 * 16-byte aligned q, k, v) and o 16-byte aligned. The forms with one producer warp or with the
 * producers staging q, k too were slower (kernels/cuda/dev/NOTES.md variants 5, 6). */
template <int DKP>
__device__ __forceinline__ void fu_producer(const ChunkArgs &a, float *Kst, float *Qst, float *Vst, float *Gst,
                                            float *Bst, float *Wr, const float *Ob, int c0, int nc, int h, int jb,
                                            int pw, int lane) {
    constexpr int NPW = 4;
    constexpr int WT = FU_T + 32 * NPW, RW = CH / NPW, NS = (RW + 31) / 32; /* rows per warp, row slots per lane */
    constexpr int PR = DKP / 4, RPI = 32 / PR; /* 16-byte pieces per q/k row, rows per instruction */
    static_assert(NS <= 2 && RW % RPI == 0 && (RW % 32 == 0 || 32 % RW == 0), "producer row split");
    const int H = a.H, dk = a.dk, dv = a.dv, r0 = pw * RW;
    auto stage = [&](int c) {
        const int tok0 = a.ck_tok0[c], len = a.ck_len[c];
        long long rtok[NS];
        int rfl[NS]; /* rows r0 + lane (+ 32): source token, flags (1: in the chunk, 2: sparse) */
#pragma unroll
        for (int hf = 0; hf < NS; hf++) {
            const int u = lane + 32 * hf, t = r0 + u;
            int sp = 0;
            float wt = 0.0f;
            const bool ok = u < RW && t < len;
            size_t tok = ok ? chunk_row(a, tok0 + t, sp, wt) : 0;
            rtok[hf] = (long long)tok;
            rfl[hf] = (ok ? 1 : 0) | (sp ? 2 : 0);
            if (u < RW) {
                cp_async4(Gst + t, ok ? (sp ? a.g2 : a.ga) + tok * H + h : a.ga, ok ? 4 : 0);
                cp_async4(Bst + t, ok ? (sp ? a.b2 : a.gb) + tok * H + h : a.gb, ok ? 4 : 0);
                Wr[t] = ok ? wt : 0.0f;
            }
        }
#pragma unroll 4
        for (int u0 = 0; u0 < (c == c0 ? RW : 0); u0 += RPI) { /* q, k: the first chunk only */
            const int u = u0 + lane / PR, t = r0 + u, i = (lane % PR) * 4;
            const long long tk = __shfl_sync(0xffffffffu, NS > 1 && u0 >= 32 ? rtok[NS - 1] : rtok[0], u & 31);
            const int fl = __shfl_sync(0xffffffffu, NS > 1 && u0 >= 32 ? rfl[NS - 1] : rfl[0], u & 31);
            const bool ok = (fl & 1) && i < dk;
            const size_t off = ((size_t)tk * H + h) * dk + i;
            cp_async16(Qst + t * DKP + i, ok ? ((fl & 2) ? a.q2 : a.q) + off : a.q, ok ? 16 : 0);
            cp_async16(Kst + t * DKP + i, ok ? ((fl & 2) ? a.k2 : a.k) + off : a.k, ok ? 16 : 0);
        }
        const bool okv = jb + 4 * lane < dv;
#pragma unroll 4
        for (int u = 0; u < RW; u++) {
            const long long tk = __shfl_sync(0xffffffffu, NS > 1 && u >= 32 ? rtok[NS - 1] : rtok[0], u & 31);
            const int fl = __shfl_sync(0xffffffffu, NS > 1 && u >= 32 ? rfl[NS - 1] : rfl[0], u & 31);
            const bool ok = (fl & 1) && okv;
            cp_async16(Vst + (r0 + u) * 128 + 4 * lane, ok ? a.v + ((size_t)tk * H + h) * dv + jb + 4 * lane : a.v,
                       ok ? 16 : 0);
        }
        cp_async_commit();
    };
    stage(c0);
    cp_async_wait<0>();
    nb_arrive(FU_FULL, WT);
    const bool okc = jb + 4 * lane < dv;
    for (int cc = 0; cc < nc; cc++) {
        const int c = c0 + cc;
        if (cc + 1 < nc) {
            nb_sync(FU_EMPTY, WT);
            FPROFP(12);
            stage(c + 1);
            FPROFP(13);
        }
        const int tok0 = a.ck_tok0[c], len = a.ck_len[c];
        float *orow = a.o + ((size_t)tok0 * H + h) * dv + jb + 4 * lane;
        nb_sync(FU_OREADY, WT);
        FPROFP(14);
        /* the O tile: row t's 16-byte piece p at p ^ 2(t mod 4) */
        /* the warp's rows to registers, the next chunk opened, then the stores */
        float4 ov[RW];
#pragma unroll
        for (int u = 0; u < RW; u++) {
            const int t = r0 + u;
            ov[u] = *(const float4 *)(Ob + t * 128 + ((lane ^ ((t & 3) << 1)) << 2));
        }
        FPROFP(15);
        if (cc + 1 < nc) {
            cp_async_wait<0>();
            FPROFP(17);
            nb_arrive(FU_FULL, WT);
        }
#pragma unroll
        for (int u = 0; u < RW; u++)
            if (r0 + u < len && okc) *(float4 *)(orow + (size_t)(r0 + u) * H * dv) = ov[u];
        FPROFP(16);
    }
}

/* The split form's chunk part may take its rows by the copy engine (M = FuMaps: tensor maps over
 * q, k, v, boxes of one head's 64 rows, one mbarrier) instead of per-thread cp.async pieces
 * (M = FuNoMaps, every other form). */
struct FuNoMaps {
    int unused;
};
struct FuMaps {
    CUtensorMap q, k, v;
};

template <int DKP, int MODE, int WS = 0, class M = FuNoMaps>
__global__ void __launch_bounds__(FU_WTN(WS), 1) k_gdn_fused(ChunkArgs a, const __grid_constant__ M tmaps) {
    static_assert(!(MODE && WS), "the WS form is the fused pass only");
    constexpr bool TMA = std::is_same<M, FuMaps>::value;
    typedef FusedSmem<DKP, WS> L;
    constexpr int WT = FU_WTN(WS); /* threads at the producer/compute handshakes */
    constexpr int LDK = L::LDK, LDV = L::LDV, MT = DKP / 16, MTW = (MT + 3) / 4, NB = DKP / 16;
    extern __shared__ __align__(16) unsigned char smem[];
    float *Kst = (float *)smem, *Qst = Kst + CH * DKP, *Vst = Qst + CH * DKP;
    float *Gst = Vst + CH * 128, *Bst = Gst + CH, *Wr = Bst + CH;
    unsigned char *sp_ = smem + L::STG;
    __nv_bfloat16 *R1 = (__nv_bfloat16 *)sp_;
    __nv_bfloat16 *Kb = R1, *Mb = R1, *Vb = R1 + CH * LDK;
    float *U0t = (float *)R1; /* the U0 tile [64][L::U0LD] fp32, from (f') to the start of (i) */
    sp_ += L::R1;
    __nv_bfloat16 *Qb = (__nv_bfloat16 *)sp_;
    sp_ += L::QB;
    __nv_bfloat16 *KtT = (__nv_bfloat16 *)sp_;
    sp_ += L::KT;
    __nv_bfloat16 *Aq = (__nv_bfloat16 *)sp_;
    sp_ += L::AQ;
    float *Ob = (float *)sp_; /* WS: the O tile [64][128] over OPAD, T and R2 up to UT */
    sp_ += L::OPAD;
    __nv_bfloat16 *Tb = (__nv_bfloat16 *)sp_;
    sp_ += L::AQ;
    float *Af = (float *)sp_;
    __nv_bfloat16 *Wb = (__nv_bfloat16 *)sp_, *UTall = (__nv_bfloat16 *)(sp_ + L::UTOFF);
    sp_ += L::R2;
    float *bc = (float *)sp_, *be = bc + CH, *fq = be + CH, *fm = fq + CH, *fk = fm + CH, *decp = fk + CH;
    uint64_t *stg_bar = (uint64_t *)(bc + 6 * CH); /* TMA: the staging's rows landed */

    /* (not const: the WS form re-derives them per phase, see FU_REFRESH) */
    int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, tq = lane & 3;
    int gq = w >> 2, wq = w & 3;
    /* MODE 0: block (value block, head, sequence); MODE 1: block (chunk, head, value block) */
    const int h = blockIdx.y, z = MODE ? 0 : blockIdx.z, H = a.H, dk = a.dk, dv = a.dv;
    const int jb = (MODE ? blockIdx.z : blockIdx.x) * 128;
    int j0 = jb + gq * 32;
    bool active = j0 < dv;
    const int c0 = MODE ? (int)blockIdx.x * a.split_cpb : a.seq_c0[z],
              nc = MODE ? min(a.split_cpb, a.split_nc - c0) : a.seq_nc[z];
    if (nc <= 0) return; /* nothing selected this sequence: the state stays untouched */
    if (WS && w >= FU_T / 32) { /* the producer warp(s) */
        fu_producer<DKP>(a, Kst, Qst, Vst, Gst, Bst, Wr, Ob, c0, nc, h, jb, w - FU_T / 32, lane);
        return;
    }
    float *S = MODE ? NULL : a.S[z] + (size_t)h * dk * dv;
    const bool vec = a.vec4 && dv % 4 == 0;

    /* cp.async of chunk c's q and k rows in 16-byte pieces (vec4 inputs), not committed: part of
     * stage() and, in the WS form, what the compute warps issue themselves (stage_qk) */
    auto stage_qk_issue = [&](int c) {
        const int tok0 = a.ck_tok0[c], len = a.ck_len[c];
        for (int x = tid; x < CH * DKP / 4; x += FU_T) {
            int t = x / (DKP / 4), i = (x % (DKP / 4)) * 4, sp = 0;
            float wt;
            bool ok = t < len && i < dk;
            size_t tok = ok ? chunk_row(a, tok0 + t, sp, wt) : 0;
            size_t off = (tok * H + h) * dk + i;
            cp_async16(Qst + t * DKP + i, ok ? (sp ? a.q2 : a.q) + off : a.q, ok ? 16 : 0);
            cp_async16(Kst + t * DKP + i, ok ? (sp ? a.k2 : a.k) + off : a.k, ok ? 16 : 0);
        }
    };
    auto stage = [&](int c) {
        const int tok0 = a.ck_tok0[c], len = a.ck_len[c];
        if constexpr (TMA) { /* q, k, v by three boxes; rows past len zeroed at (a) */
            if (tid == 0) {
                mbar_expect_tx(stg_bar, (unsigned)(CH * (2 * DKP + 128) * 4));
                tma_g2s_3d(Qst, &tmaps.q, 0, h, tok0, stg_bar);
                tma_g2s_3d(Kst, &tmaps.k, 0, h, tok0, stg_bar);
                tma_g2s_3d(Vst, &tmaps.v, jb, h, tok0, stg_bar);
            }
            if (tid < CH) {
                const int t = tid;
                const bool ok = t < len;
                cp_async4(Gst + t, ok ? a.ga + (size_t)(tok0 + t) * H + h : a.ga, ok ? 4 : 0);
                cp_async4(Bst + t, ok ? a.gb + (size_t)(tok0 + t) * H + h : a.gb, ok ? 4 : 0);
                Wr[t] = ok ? 1.0f : 0.0f;
            }
            cp_async_commit();
            return;
        }
        if (vec) {
            stage_qk_issue(c);
            for (int x = tid; x < CH * 32; x += FU_T) {
                int t = x >> 5, j = (x & 31) * 4, sp = 0;
                float wt;
                bool ok = t < len && jb + j < dv;
                size_t tok = ok ? chunk_row(a, tok0 + t, sp, wt) : 0;
                cp_async16(Vst + t * 128 + j, ok ? a.v + (tok * H + h) * dv + jb + j : a.v, ok ? 16 : 0);
            }
            if (tid < CH) {
                int t = tid, sp = 0;
                float wt = 0.0f;
                bool ok = t < len;
                size_t tok = ok ? chunk_row(a, tok0 + t, sp, wt) : 0;
                cp_async4(Gst + t, ok ? (sp ? a.g2 : a.ga) + tok * H + h : a.ga, ok ? 4 : 0);
                cp_async4(Bst + t, ok ? (sp ? a.b2 : a.gb) + tok * H + h : a.gb, ok ? 4 : 0);
                Wr[t] = ok ? wt : 0.0f;
            }
            cp_async_commit();
        } else {
            for (int x = tid; x < CH * DKP; x += FU_T) {
                int t = x / DKP, i = x % DKP, sp = 0;
                float wt, qv = 0.0f, kv = 0.0f;
                if (t < len && i < dk) {
                    size_t off = (chunk_row(a, tok0 + t, sp, wt) * H + h) * dk + i;
                    qv = (sp ? a.q2 : a.q)[off];
                    kv = (sp ? a.k2 : a.k)[off];
                }
                Qst[t * DKP + i] = qv;
                Kst[t * DKP + i] = kv;
            }
            for (int x = tid; x < CH * 128; x += FU_T) {
                int t = x >> 7, j = x & 127, sp = 0;
                float wt, vv = 0.0f;
                if (t < len && jb + j < dv) vv = a.v[(chunk_row(a, tok0 + t, sp, wt) * H + h) * dv + jb + j];
                Vst[t * 128 + j] = vv;
            }
            if (tid < CH) {
                int t = tid, sp = 0;
                float wt = 0.0f, gv = 0.0f, bv = 0.0f;
                if (t < len) {
                    size_t tok = chunk_row(a, tok0 + t, sp, wt);
                    gv = (sp ? a.g2 : a.ga)[tok * H + h];
                    bv = (sp ? a.b2 : a.gb)[tok * H + h];
                }
                Gst[t] = gv;
                Bst[t] = bv;
                Wr[t] = t < len ? wt : 0.0f;
            }
        }
    };

    /* WS: the compute warps stage q and k of chunk c */
    auto stage_qk = [&](int c) {
        stage_qk_issue(c);
        cp_async_commit();
    };
    float sacc[MTW][4][4];
    state_load<MT>(sacc, S, !MODE, wq, g, tq, j0, dk, dv);
    if constexpr (TMA) {
        if (tid == 0) {
            mbar_init(stg_bar, 1);
            asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        }
        __syncthreads();
    }
    if (!WS) stage(c0);
#ifdef HYLA_FUSED_PROFILE
    const bool fp1 = MODE && tid == 0 && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0;
    long long fp1_acc[12] = {0}, fp1_last = clock64();
#endif
    /* WS (96 registers with 17 warps): the thread's indices are re-derived at each chunk and made
     * opaque at the phase starts, so the compiler recomputes the per-lane fragment addresses there
     * instead of keeping ~20 of them live (spilled) through the chunk loop */
#define FU_REFRESH                                                                                                     \
    if (WS) asm volatile("" : "+r"(tid), "+r"(lane), "+r"(w), "+r"(g), "+r"(tq), "+r"(gq), "+r"(wq))
    for (int cc = 0; cc < nc; cc++) {
        if (WS) {
            asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tid));
            lane = tid & 31;
            w = tid >> 5;
            g = lane >> 2;
            tq = lane & 3;
            gq = w >> 2;
            wq = w & 3;
            j0 = jb + gq * 32;
            active = j0 < dv;
        }
        const int c = c0 + cc, tok0 = WS ? 0 : a.ck_tok0[c], len = WS ? 0 : a.ck_len[c];
        FPROF(0);
        if (WS) {
            cp_async_wait<0>(); /* this thread's own q, k pieces (staged after EMPTY) */
            nb_sync(FU_FULL, WT); /* (a) staging landed, the previous O tile read out */
        } else {
            cp_async_wait<0>();
            if constexpr (TMA) {
                mbar_wait(stg_bar, (unsigned)cc & 1u);
                if (len < CH) { /* rows past the chunk (the next sequence's) read as zero */
                    constexpr int per = (2 * DKP + 128) / 4;
                    for (int x = tid; x < (CH - len) * per; x += FU_T) {
                        const int t = len + x / per, u = x % per;
                        float *row = u < DKP / 4 ? Qst + t * DKP : u < DKP / 2 ? Kst + t * DKP : Vst + t * 128;
                        const int off = u < DKP / 4 ? u : u < DKP / 2 ? u - DKP / 4 : u - DKP / 2;
                        ((float4 *)row)[off] = make_float4(0.f, 0.f, 0.f, 0.f);
                    }
                    fence_proxy_async_smem(); /* before a later chunk's copy into these rows */
                }
            }
            __syncthreads(); /* (a) this chunk's staging is visible; the previous chunk's tiles are dead */
        }
        FPROF(1);
        /* (b) cumulative log decay (rows past len have g = 0, beta = 0) and per-row factors */
        if (w == 0) gdn_chunk_decay(Gst, Bst, a.scale, lane, bc, be, fq, fm, fk, decp);
        /* (c) K, Q (weighted rows of a row map) -> bf16; T above the diagonal blocks = 0 */
#pragma unroll 2
        for (int x = tid; x < CH * DKP / 4; x += FU_T) {
            int t = x / (DKP / 4), i = (x % (DKP / 4)) * 4;
            float wt = Wr[t];
            float4 kv = *(const float4 *)(Kst + t * DKP + i), qv = *(const float4 *)(Qst + t * DKP + i);
            *(uint2 *)(Kb + t * LDK + i) =
                make_uint2(pack_bf16x2(kv.x * wt, kv.y * wt), pack_bf16x2(kv.z * wt, kv.w * wt));
            *(uint2 *)(Qb + t * LDK + i) =
                make_uint2(pack_bf16x2(qv.x * wt, qv.y * wt), pack_bf16x2(qv.z * wt, qv.w * wt));
        }
        fu_sync<WS>();
        FPROF(2);
        FU_REFRESH;
        /* (d) K K^T and Q K^T: warp (rows 16 wq.., columns 16 gq..) */
        {
            float kk[2][4], qk[2][4];
            frag_zero(kk);
            frag_zero(qk);
            if (gq <= wq) {
#pragma unroll
                for (int kc = 0; kc < DKP / 16; kc++) {
                    uint32_t ak[4], aq[4], bf[2][2];
                    ldsm_frag_a(ak, Kb + (16 * wq) * LDK + kc * 16, LDK);
                    ldsm_frag_a(aq, Qb + (16 * wq) * LDK + kc * 16, LDK);
                    ldsm_frag_b2_nk(bf, Kb + (16 * gq) * LDK + kc * 16, LDK);
#pragma unroll
                    for (int n = 0; n < 2; n++) {
                        mma_bf16_16816(kk[n], ak, bf[n]);
                        mma_bf16_16816(qk[n], aq, bf[n]);
                    }
                }
            }
#pragma unroll
            for (int n = 0; n < 2; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int r = 16 * wq + g + (e >> 1) * 8, s = 16 * gq + n * 8 + 2 * tq + (e & 1);
                    float gam = (s <= r) ? expf(bc[r] - bc[s]) : 0.0f;
                    if (gq == wq) /* A's diagonal blocks in fp32 for (e) */
                        Af[r * 65 + s] = (s < r) ? be[r] * gam * kk[n][e] : 0.0f;
                    else if (gq < wq) /* -A below the diagonal blocks in bf16, for (f') */
                        Tb[r * 72 + s] = __float2bfloat16_rn(-(be[r] * gam * kk[n][e]));
                    Aq[r * 72 + s] = __float2bfloat16_rn(a.scale * gam * qk[n][e]);
                }
        }
        fu_sync<WS>();
        FPROF(3);
        FU_REFRESH;
        /* (e) diagonal blocks of T (warps 0-3) || the operand tiles (warps 4-15) */
        if (w < 4) {
            const int s = lane & 15;
            float x[16];
            gdn_diag_inverse_col(Af + (16 * w) * 65 + 16 * w, 65, s, x);
            if (lane < 16) {
#pragma unroll
                for (int t = 0; t < 16; t++) {
                    Tb[(16 * w + t) * 72 + 16 * w + s] = __float2bfloat16_rn(x[t]);
                }
            }
        } else {
            const int ht = tid - 128, HT = FU_T - 128;
            for (int x = ht; x < CH * DKP / 4; x += HT) {
                int t = x / (DKP / 4), i = (x % (DKP / 4)) * 4;
                float wt = Wr[t], f = fm[t], fqq = fq[t];
                float4 kv = *(const float4 *)(Kst + t * DKP + i), qv = *(const float4 *)(Qst + t * DKP + i);
                kv.x *= wt;
                kv.y *= wt;
                kv.z *= wt;
                kv.w *= wt;
                qv.x *= wt;
                qv.y *= wt;
                qv.z *= wt;
                qv.w *= wt;
                *(uint2 *)(Mb + t * LDK + i) = make_uint2(pack_bf16x2(kv.x * f, kv.y * f), pack_bf16x2(kv.z * f, kv.w * f));
                *(uint2 *)(Qb + t * LDK + i) =
                    make_uint2(pack_bf16x2(qv.x * fqq, qv.y * fqq), pack_bf16x2(qv.z * fqq, qv.w * fqq));
            }
            for (int x = ht; x < CH * 32; x += HT) {
                int t = x >> 5, j = (x & 31) * 4;
                float4 vv = *(const float4 *)(Vst + t * 128 + j);
                float f = be[t];
                *(uint2 *)(Vb + t * LDV + j) = make_uint2(pack_bf16x2(vv.x * f, vv.y * f), pack_bf16x2(vv.z * f, vv.w * f));
            }
            for (int x = ht; x < (CH / 2) * DKP; x += HT) {
                int t = 2 * (x / DKP), i = x % DKP;
                float k0 = Kst[t * DKP + i] * Wr[t] * fk[t], k1 = Kst[(t + 1) * DKP + i] * Wr[t + 1] * fk[t + 1];
                *(uint32_t *)(KtT + i * 72 + t) = pack_bf16x2(k0, k1);
            }
        }
        fu_sync<WS>();
        FPROF(4);
        if (WS) {
            if (cc + 1 < nc) nb_arrive(FU_EMPTY, WT); /* the producer stages the next chunk */
            if (cc + 1 < nc) stage_qk(c + 1); /* ... and these warps its q, k */
        } else if (cc + 1 < nc)
            stage(c + 1); /* the staging area is free: the next chunk streams in now */
        FPROF(5);
        FU_REFRESH;
        float u0[4][4]; /* U0 = T (beta V), rows 16 wq.., the group's columns j0.. (C fragments) */
        {
            /* (f') W = T (beta e^b K) and U0 = T (beta V) without forming T: X = (I + A)^-1 B for
             * B = [Mb | Vb] by blocked forward substitution on tensor cores,
             *     X_i = T_ii (B_i - sum_{j<i} A_ij X_j),  i = 0..3 (row blocks of 16),
             * in transposed form so that each warp keeps all of it in registers: warp w owns the
             * 16-column slab w of B (slabs 0..NB-1: key columns 16w.. of Mb -> W; NB..NB+7: value
             * columns 16(w - NB).. of Vb -> U0; a value slab wholly past dv is skipped, and with
             * DKP < 128 warps NB+8.. have none). Per block row i, with m = the slab's column and
             * n = the row inside block i (two n8 tiles: rows 16i..16i+7 and 16i+8..16i+15):
             *     acc^T = B_i^T + sum_{j<i} X_j^T (-A_ij)^T      (m16 x n16, fp32)
             *     X_i^T = bf16(acc^T) T_ii^T                      (m16 x n16, fp32)
             * Fragments (lane = 4g + t; PTX m16n8k16 layouts, see hyla_cuda_mma.cuh):
             *   xf[i] (A operand, m16 x k16, k = row in block i), by ldsm_frag_a_kn on the slab:
             *     xf[i][0] = (col g,   rows 16i+2t, +1)    xf[i][1] = (col g+8, rows 16i+2t, +1)
             *     xf[i][2] = (col g,   rows 16i+8+2t, +1)  xf[i][3] = (col g+8, rows 16i+8+2t, +1)
             *   (low half = the lower row); once X_i is formed xf[i] holds bf16(X_i^T) in the same
             *   places, so the registers of B_i turn into those of X_i (16 in all, throughout);
             *   acc[nt] / xo[nt] (C, m16 x n8, tile nt = rows 16i+8nt..): [0], [1] = (col g,
             *     rows 16i+8nt+2t, +1), [2], [3] = (col g+8, the same rows); so acc[nt][0..1] =
             *     xf[i][2nt] and acc[nt][2..3] = xf[i][2nt+1] (the flash-attention register reuse:
             *     C fragments of the two n8 tiles are the A fragment of the next k16 step);
             *   B operand (k = row 16j+k of the block column, n = row 16i+n): (-A_ij)^T (k, n) =
             *     -A[16i+n][16j+k] = Tb[(16i+n)*72 + 16j+k] ((d) writes bf16(-A) there), and
             *     T_ii^T (k, n) = T_ii[n][k] = Tb[(16i+n)*72 + 16i+k] ((e)): both "[n][k]" tiles,
             *     ldsm_frag_b2_nk, b[0] = rows 16i..16i+7, b[1] = rows 16i+8...
             * Outputs: X_i^T element (col m, row r) goes to Wb[r][16w + m] (bf16, the value of
             * xf[i]) or to the U0 tile [r][16(w - NB) + m] (fp32); both writes are transposed
             * (rows 2t, cols g: the tile's stride 132 makes them conflict-free).
             * Numerics: A below the diagonal blocks, the right-hand side and every X_j fed to later
             * block rows are bf16 (forming T in fp32 and rounding it once gives other bits within
             * the chunked tolerance); every form (WS = 0, 1, split, k_gdn_pipe) shares this code:
             * the same bits.
             * The U0 tile lies over R1 (Kb/Mb, Vb), so every warp loads its whole B first. */
            const int vs = w - NB;
            const bool kslab = w < NB, run = kslab || (vs < 8 && jb + 16 * vs < dv);
            uint32_t xf[4][4];
            if (run) {
                const __nv_bfloat16 *src = kslab ? Mb + 16 * w : Vb + 16 * vs;
                const int ld = kslab ? LDK : LDV;
#pragma unroll
                for (int i = 0; i < 4; i++) ldsm_frag_a_kn(xf[i], src + (16 * i) * ld, ld);
            } else /* defined values (undefined ones cost spills, as u0 in (i)) */
#pragma unroll
                for (int i = 0; i < 4; i++)
#pragma unroll
                    for (int e = 0; e < 4; e++) xf[i][e] = 0u;
            fu_sync<WS>(); /* every warp holds its B: R1 is free for the U0 tile (Af is dead since (e)) */
            FPROF(6);
            if (run) {
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    float xo[2][4];
                    fs_block_row(xf, Tb, i, xo);
#pragma unroll
                    for (int nt = 0; nt < 2; nt++)
#pragma unroll
                        for (int e = 0; e < 4; e++) { /* (col g + 8(e/2), row 16i + 8nt + 2t + e%2) */
                            const int r = 16 * i + 8 * nt + 2 * tq + (e & 1), m = g + 8 * (e >> 1);
                            if (kslab)
                                ((unsigned short *)Wb)[r * LDK + 16 * w + m] =
                                    (unsigned short)(xf[i][2 * nt + (e >> 1)] >> (16 * (e & 1)));
                            else
                                U0t[r * L::U0LD + 16 * vs + m] = xo[nt][e];
                        }
                }
            }
            FPROF(7);
            fu_sync<WS>(); /* W and the U0 tile complete */
            FPROF(8);
        }
        if (MODE) {
            /* the chunk's tiles for kernel B, in its layouts: the same values the fused pass
             * uses, so kernel B computes the same bits */
            const size_t ch = (size_t)c * H + h;
            if (jb == 0) {
                __nv_bfloat16 *qo = a.qt + ch * CH * DKP, *wo = a.wt + ch * CH * DKP, *ko = a.ktT + ch * DKP * CH;
                for (int x = tid; x < CH * DKP / 8; x += FU_T) {
                    int t = x / (DKP / 8), i = (x % (DKP / 8)) * 8;
                    *(uint4 *)(qo + (size_t)x * 8) = *(const uint4 *)(Qb + t * LDK + i);
                    *(uint4 *)(wo + (size_t)x * 8) = *(const uint4 *)(Wb + t * LDK + i);
                }
                for (int x = tid; x < DKP * CH / 8; x += FU_T) {
                    int i = x / (CH / 8), t = (x % (CH / 8)) * 8;
                    *(uint4 *)(ko + (size_t)x * 8) = *(const uint4 *)(KtT + i * 72 + t);
                }
                __nv_bfloat16 *ao = a.aqk + ch * CH * CH;
                for (int x = tid; x < CH * CH / 8; x += FU_T) {
                    int t = x >> 3, s8 = (x & 7) * 8;
                    *(uint4 *)(ao + (size_t)x * 8) = *(const uint4 *)(Aq + t * 72 + s8);
                }
                if (tid == 0) a.dec[ch * DKP] = decp[0];
            }
            { /* U0 from the tile (the values the fused pass reads); 16-byte stores where dv % 4 == 0
               * (the scratch's tiles start 256-aligned, rows of dv floats, the tile's of 132) */
                float *uo = a.u0 + ch * CH * dv;
                if (dv % 4 == 0) {
                    for (int x = tid; x < CH * 32; x += FU_T) {
                        const int t = x >> 5, jj = (x & 31) * 4;
                        if (jb + jj < dv)
                            *(float4 *)(uo + (size_t)t * dv + jb + jj) = *(const float4 *)(U0t + t * L::U0LD + jj);
                    }
                } else {
                    for (int x = tid; x < CH * 128; x += FU_T) {
                        const int t = x >> 7, jj = x & 127;
                        if (jb + jj < dv) uo[(size_t)t * dv + jb + jj] = U0t[t * L::U0LD + jj];
                    }
                }
            }
            FPROF(9);
            continue; /* the next chunk's staging is in flight since (e); the loop's barrier
                       * keeps its tiles until every thread has copied these out */
        }
        FU_REFRESH;
        /* (i) the state pass of this group's 32 value columns */
        __nv_bfloat16 *SbT = R1 + gq * 32 * LDK, *UT = UTall + gq * 32 * 72;
        {
            if (active) /* u0[n][e] = U0 (row 16 wq + g + 8(e/2), column j0 - jb + 8n + 2 tq + e%2), as (h)
                         * leaves it; a 16-column slab wholly past dv was not formed: 0 */
#pragma unroll
                for (int n = 0; n < 4; n++) {
                    const bool ok = jb + 16 * (2 * gq + (n >> 1)) < dv;
#pragma unroll
                    for (int e = 0; e < 4; e += 2) {
                        const int t = 16 * wq + g + (e >> 1) * 8, col = gq * 32 + n * 8 + 2 * tq;
                        const float2 uv = ok ? *(const float2 *)(U0t + t * L::U0LD + col) : make_float2(0.0f, 0.0f);
                        u0[n][e] = uv.x;
                        u0[n][e + 1] = uv.y;
                    }
                }
            else /* defined values: undefined ones here made the WS forms spill */
#pragma unroll
                for (int n = 0; n < 4; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) u0[n][e] = 0.0f;
            fu_sync<WS>(); /* the U0 tile is read: R1 takes S^T */
        }
        if (active) {
            state_to_sbt<MT>(sacc, SbT, LDK, wq, g, tq);
        }
        fu_sync<WS>();
        FPROF(9);
        if (WS && active) { /* U = U0 - W S, one 16-column half at a time (8 accumulators less
                             * live; each accumulator's products in the same order) */
#pragma unroll
            for (int hb = 0; hb < 2; hb++) {
                float uacc[2][4];
                frag_zero(uacc);
#pragma unroll
                for (int kc = 0; kc < DKP / 16; kc++) {
                    uint32_t af[4], bf[2][2];
                    ldsm_frag_a(af, Wb + (16 * wq) * LDK + kc * 16, LDK);
                    ldsm_frag_b2_nk(bf, SbT + (hb * 16) * LDK + kc * 16, LDK);
                    mma_bf16_16816(uacc[0], af, bf[0]);
                    mma_bf16_16816(uacc[1], af, bf[1]);
                }
#pragma unroll
                for (int n = 0; n < 2; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int t = 16 * wq + g + (e >> 1) * 8, jj = (2 * hb + n) * 8 + 2 * tq + (e & 1);
                        UT[jj * 72 + t] = __float2bfloat16_rn(u0[2 * hb + n][e] - uacc[n][e]);
                    }
            }
        } else if (active) { /* U = U0 - W S for rows 16 wq.. */
            float uacc[4][4];
            frag_zero(uacc);
            mma_16x32<DKP>(uacc, Wb + (16 * wq) * LDK, LDK, SbT, LDK);
#pragma unroll
            for (int n = 0; n < 4; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int t = 16 * wq + g + (e >> 1) * 8, jj = n * 8 + 2 * tq + (e & 1);
                    UT[jj * 72 + t] = __float2bfloat16_rn(u0[n][e] - uacc[n][e]);
                }
        }
        fu_sync<WS>();
        FPROF(10);
        if (active) {
            /* O = q~ S + Aqk U */
            float oacc[4][4];
            frag_zero(oacc);
            mma_16x32<DKP>(oacc, Qb + (16 * wq) * LDK, LDK, SbT, LDK);
            mma_16x32<CH>(oacc, Aq + (16 * wq) * 72, 72, UT, 72);
            if (WS) { /* to the O tile (16-byte pieces XOR 2(t mod 4)); the producer stores it */
#pragma unroll
                for (int n = 0; n < 4; n++)
#pragma unroll
                    for (int e = 0; e < 4; e += 2) {
                        int t = 16 * wq + g + (e >> 1) * 8, col = gq * 32 + n * 8 + 2 * tq;
                        *(float2 *)(Ob + t * 128 + (((col >> 2) ^ ((t & 3) << 1)) << 2) + (col & 3)) =
                            make_float2(oacc[n][e], oacc[n][e + 1]);
                    }
                nb_arrive(FU_OREADY, WT);
            } else
#pragma unroll
                for (int n = 0; n < 4; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int t = 16 * wq + g + (e >> 1) * 8, j = j0 + n * 8 + 2 * tq + (e & 1);
                        if (t < len && j < dv) a.o[((size_t)(tok0 + t) * H + h) * dv + j] = oacc[n][e];
                    }
            /* S = e^(bC) S + k~^T U */
            const float d = decp[0];
#pragma unroll
            for (int mi = 0; mi < MTW; mi++) {
                int mt = wq + 4 * mi;
                if (mt < MT) {
                    state_decay(sacc[mi], d, d);
                    mma_16x32<CH>(sacc[mi], KtT + (mt * 16) * 72, 72, UT, 72);
                }
            }
        } else if (WS)
            nb_arrive(FU_OREADY, WT); /* a group past dv: nothing of the O tile */
        FPROF(11);
    }
#undef FU_REFRESH
    if (WS) { /* the state's address again rather than kept live through the chunk loop */
        float *const *Sv = a.S;
        asm volatile("" : "+l"(Sv));
        S = Sv[z] + (size_t)h * dk * dv;
    }
#ifdef HYLA_FUSED_PROFILE
    if (fp1 && atomicAdd(&g_fprof_m1_once, 1) == 0) {
        const double n = nc;
        printf("chunk part profile (k_gdn_fused MODE 1, cycles per chunk, mean of %d chunks): wait %.0f decay+cvt %.0f "
               "kk/qk %.0f inv+tiles %.0f stage %.0f fs-load %.0f fs-subst %.0f fs-wait %.0f write-out %.0f\n",
               nc, fp1_acc[1] / n, fp1_acc[2] / n, fp1_acc[3] / n, fp1_acc[4] / n, fp1_acc[5] / n, fp1_acc[6] / n,
               fp1_acc[7] / n, fp1_acc[8] / n, fp1_acc[9] / n);
    }
#endif
    if (MODE) return;
    state_store<MT>(sacc, S, !MODE, wq, g, tq, j0, dk, dv);
#ifdef HYLA_FUSED_PROFILE
    if (!MODE && nc > 21 && tid == 0 && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 &&
        atomicAdd(&g_fprof_once, 1) == 0) {
        long long *p = g_fprof_t;
        /* (f'): B loads + barrier, warp 0's substitution, the wait for the other warps; sbt
         * includes the U0 tile read and its barrier */
        printf("fused profile (cycles, chunk 20): wait %lld bc+cvt %lld kk/qk %lld inv+tiles %lld stage %lld "
               "fs-load %lld fs-subst %lld fs-wait %lld u0+sbt %lld u %lld o+s %lld total %lld\n",
               p[1] - p[0], p[2] - p[1], p[3] - p[2], p[4] - p[3], p[5] - p[4], p[6] - p[5], p[7] - p[6],
               p[8] - p[7], p[9] - p[8], p[10] - p[9], p[11] - p[10], p[11] - p[0]);
        if (WS) /* the producer (warp 16), from the compute warps' chunk start: staging issue, OREADY
                 * passed, O tile read out, copies landed, o stores issued */
            printf("fused WS=%d producer (cycles from chunk 20's start): stage issue %lld..%lld, O tile %lld..%lld, "
                   "o stores issued %lld, staging landed %lld\n",
                   WS, p[12] - p[0], p[13] - p[0], p[14] - p[0], p[15] - p[0], p[16] - p[0], p[17] - p[0]);
    }
#endif
}

/* ================================================================ host side */

static size_t fused_smem(int dkp) {
    if (dkp > 128) return (size_t)-1;
    return dkp_dispatch<128>(dkp, [](auto D) { return FusedSmem<decltype(D)::value>::TOTAL; });
}

/* The chunk part's tensor maps (FuMaps: q, k, v as {columns, head, row}, boxes of one head's 64
 * rows, DKP key or 128 value columns, out-of-range elements zero); 0 where they cannot be made
 * (a row map, unaligned rows, no driver encoder): then cp.async pieces. */
static int fused_maps(FuMaps *m, const ChunkArgs &ca, int dkp) {
    PFN_cuTensorMapEncodeTiled_v12000 enc = cu_tensor_map_encoder();
    if (!enc || ca.rsrc || !ca.vec4 || ca.dv % 4 || ca.nrows <= 0 || ca.nrows > 0x7fffffffLL) return 0;
    const cuuint32_t es[3] = {1, 1, 1};
    const float *src[3] = {ca.q, ca.k, ca.v};
    CUtensorMap *dst[3] = {&m->q, &m->k, &m->v};
    for (int x = 0; x < 3; x++) {
        const cuuint64_t cols = x < 2 ? (cuuint64_t)ca.dk : (cuuint64_t)ca.dv;
        const cuuint64_t dim[3] = {cols, (cuuint64_t)ca.H, (cuuint64_t)ca.nrows};
        const cuuint64_t str[2] = {cols * 4, cols * 4 * (cuuint64_t)ca.H};
        const cuuint32_t box[3] = {x < 2 ? (cuuint32_t)dkp : 128u, 1u, (cuuint32_t)CH};
        if (enc(dst[x], CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, (void *)src[x], dim, str, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
            return 0;
    }
    return 1;
}

/* GDN runs the fused kernel for dk <= 128. The choice depends on the shapes only, so every call
 * of a sequence (and each of its 64-token pieces) takes the same path. */
extern "C" int cu_gdn_fused_ok(hyla_cuda_ctx *c, int dk) {
    const int dkp = pow2_dkp(dk);
    return dkp <= 128 && fused_smem(dkp) <= c->smem_optin && smem_b(dkp, 1, 1) <= c->smem_optin;
}

/* GDN's fused pass, one form per shape class, all with the same bits (the forms measured
 * against them: kernels/cuda/dev/NOTES.md):
 * - q, k, v 16-byte aligned, dv % 4 == 0, in an sm_90a build: the pipelined kernel k_gdn_pipe
 *   (12 warps: chunk warps form chunk c+1's tiles beside the state warps' pass over chunk c;
 *   rows by tensor-map copies, or one bulk copy per row through SSE's row map; H100: 8 x 8192
 *   varlen 0.95-0.96 ms, SSE-GDN 32k 5.35 ms);
 * - otherwise, aligned (a plain sm_90 build): the warp-specialised k_gdn_fused<.., WS = 1> (a
 *   producer warpgroup stages v, g, beta of the next chunk and stores o from a shared-memory O
 *   tile while the compute warps issue its q, k right after releasing the staging; 1.47-1.53 ms);
 * - otherwise k_gdn_fused<.., WS = 0> (every warp stages);
 * - split (few long sequences, where one block per (sequence, head) would leave most SMs idle):
 *   the fused pass's chunk part over all chunks in parallel (mode 1, tiles to the scratch), then
 *   kernel B. */
template <int DKP>
static hyla_status launch_fused_dkp(hyla_cuda_ctx *c, const ChunkArgs &ca, int NC, int nseq, int split) {
    const size_t sm = FusedSmem<DKP, 0>::TOTAL;
    const unsigned ncb = cu_blocks(ca.dv, 128);
    if (!split) {
        int launched = 0;
        HYLA_TRY(cu_gdn_pipe_launch(c, ca, nseq, &launched));
        if (launched) return HYLA_OK;
    }
    if (!split && ca.vec4 && ca.dv % 4 == 0 && ((uintptr_t)ca.o & 15) == 0 && FusedSmem<DKP, 1>::TOTAL <= c->smem_optin)
        return cu_launch_dyn(c, k_gdn_fused<DKP, 0, 1>, dim3(ncb, ca.H, nseq), FU_WTN(1), FusedSmem<DKP, 1>::TOTAL, ca,
                             FuNoMaps{});
    if (!split) return cu_launch_dyn(c, k_gdn_fused<DKP, 0, 0>, dim3(ncb, ca.H, nseq), FU_T, sm, ca, FuNoMaps{});
    /* runs of consecutive chunks a block (cu_split_runs; one 32k sequence, 18 heads: 2.06 ms
     * with one chunk a block, 1.96 / 1.94 / 1.92 with runs of 2 / 4 / 8) */
    ChunkArgs cb = ca;
    const unsigned gx = cu_split_runs(c, cb, NC, (size_t)NC * ca.H * ncb);
    FuMaps fmap;
    if (fused_maps(&fmap, ca, DKP))
        HYLA_TRY(cu_launch_dyn(c, k_gdn_fused<DKP, 1, 0, FuMaps>, dim3(gx, ca.H, ncb), FU_T, sm, cb, fmap));
    else
        HYLA_TRY(cu_launch_dyn(c, k_gdn_fused<DKP, 1, 0>, dim3(gx, ca.H, ncb), FU_T, sm, cb, FuNoMaps{}));
    return cu_chunk_b_launch(c, ca, nseq, 1);
}

hyla_status cu_gdn_fused_launch(hyla_cuda_ctx *c, const ChunkArgs &ca, int NC, int nseq, int split) {
    return dkp_dispatch<128>(ca.dkp, [&](auto D) { return launch_fused_dkp<decltype(D)::value>(c, ca, NC, nseq, split); });
}
