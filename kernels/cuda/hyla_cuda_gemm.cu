/* hyla_cuda_gemm.cu — the batch-invariant "skinny" linear for M <= 256 rows (every linear the
 * runtime issues: prefill pieces of <= 64 tokens, decode batches of <= 256 sessions).
 *
 * y[M][N] = x[M][K] W[N][K]^T (+ bias) (+ y): x fp32 rounded to bf16 (by a conversion kernel,
 * or while staged in shared memory for M <= 16), W bf16, bf16 tensor-core products (mma.sync
 * m16n8k16) with fp32 accumulation.
 * A block owns 64 output columns and one K slice; K is cut into S slices where S depends on
 * N and K only (enough blocks to cover the GPU), the slices' fp32 partials are summed in slice
 * order (by a second kernel; by the last block to finish an output tile with
 * HYLA_CUDA_LINEAR=fused|fusedsmall). So the arithmetic that produces y[m][n] — which products, in
 * which order, in which instructions — does not depend on M or on the other rows: a session's
 * logits are bit-identical whether it is decoded alone or in a batch (hyla_ops.h: "each row's
 * result does not depend on M"). Weights stream through once per 128-row block.
 * Threading: launched on the context's stream. */
#include "hyla_cuda_impl.h"
#include "hyla_cuda_mma.cuh"

#define SK_N 64 /* output columns per block */
#define SK_K 64 /* K per shared-memory tile */
#define SK_LD 72

template <int MT>
__global__ void __launch_bounds__(128) k_skinny(const float *__restrict__ x, int ldx, int M, int K,
                                                const __nv_bfloat16 *__restrict__ W, int N, int kchunk,
                                                float *__restrict__ part) {
    __shared__ __align__(16) __nv_bfloat16 Ws[SK_N * SK_LD];
    __shared__ __align__(16) __nv_bfloat16 Xs[MT * 16 * SK_LD];
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, tq = lane & 3;
    const int n0 = blockIdx.x * SK_N, s = blockIdx.y, m0 = blockIdx.z * MT * 16;
    const int kbeg = s * kchunk, kend = kbeg + kchunk < K ? kbeg + kchunk : K;
    const bool vecw = (K & 7) == 0, vecx = (ldx & 3) == 0 && (((uintptr_t)x) & 15) == 0;
    float acc[MT][2][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mt][nt][e] = 0.0f;
    for (int kt = kbeg; kt < kend; kt += SK_K) {
        /* W tile: 64 rows x 64 k, 16-byte pieces */
        for (int c = tid; c < SK_N * 8; c += 128) {
            int r = c >> 3, kk = (c & 7) * 8, n = n0 + r, k = kt + kk;
            uint4 v = make_uint4(0, 0, 0, 0);
            if (n < N) {
                const __nv_bfloat16 *src = W + (size_t)n * K + k;
                if (vecw && k + 8 <= kend) {
                    v = *(const uint4 *)src;
                } else {
                    unsigned short tmp[8];
                    for (int j = 0; j < 8; j++)
                        tmp[j] = (k + j < kend) ? ((const unsigned short *)src)[j] : (unsigned short)0;
                    v = make_uint4(tmp[0] | (tmp[1] << 16), tmp[2] | (tmp[3] << 16), tmp[4] | (tmp[5] << 16),
                                   tmp[6] | (tmp[7] << 16));
                }
            }
            *(uint4 *)(Ws + r * SK_LD + kk) = v;
        }
        /* x tile: MT*16 rows x 64 k, fp32 -> bf16 */
        for (int c = tid; c < MT * 16 * 16; c += 128) {
            int r = c >> 4, kk = (c & 15) * 4, m = m0 + r, k = kt + kk;
            float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
            if (m < M) {
                const float *src = x + (size_t)m * ldx + k;
                if (vecx && k + 4 <= kend) {
                    v = *(const float4 *)src;
                } else {
                    v.x = k < kend ? src[0] : 0.f;
                    v.y = k + 1 < kend ? src[1] : 0.f;
                    v.z = k + 2 < kend ? src[2] : 0.f;
                    v.w = k + 3 < kend ? src[3] : 0.f;
                }
            }
            uint2 pk = make_uint2(pack_bf16x2(v.x, v.y), pack_bf16x2(v.z, v.w));
            *(uint2 *)(Xs + r * SK_LD + kk) = pk;
        }
        __syncthreads();
#pragma unroll
        for (int kc = 0; kc < SK_K / 16; kc++) {
            uint32_t bf[2][2];
#pragma unroll
            for (int nt = 0; nt < 2; nt++) ld_frag_b_nk(bf[nt], Ws + (16 * w + nt * 8) * SK_LD + kc * 16, SK_LD);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                uint32_t af[4];
                ld_frag_a(af, Xs + (mt * 16) * SK_LD + kc * 16, SK_LD);
#pragma unroll
                for (int nt = 0; nt < 2; nt++) mma_bf16_16816(acc[mt][nt], af, bf[nt]);
            }
        }
        __syncthreads();
    }
    float *out = part + (size_t)s * M * N;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int m = m0 + mt * 16 + g + (e >> 1) * 8, n = n0 + 16 * w + nt * 8 + 2 * tq + (e & 1);
                if (m < M && n < N) out[(size_t)m * N + n] = acc[mt][nt][e];
            }
}

/* v2 (K % 8 == 0): x pre-converted to bf16 [M][K]; tiles arrive by cp.async, two stages deep,
 * fragments by ldmatrix. Same products in the same order per output as v1's contract: the
 * result of a row still depends only on that row (and N, K).
 * XF (M <= 16, decode): x is read as fp32 (row stride ldx) and rounded to bf16 while staged,
 * instead of by a separate conversion kernel: one launch less per linear, and the same bf16
 * values (round to nearest even either way), so the same bits. For larger M every block would
 * convert all M rows again, so those keep the conversion kernel. */
template <int MT, bool XF>
__global__ void __launch_bounds__(128) k_skinny2(const __nv_bfloat16 *__restrict__ xb, const float *__restrict__ xf,
                                                 int ldx, int vecx, int M, int K,
                                                 const __nv_bfloat16 *__restrict__ W, int N, int kchunk,
                                                 float *__restrict__ part, int S, int *cnt, const float *bias, float *y,
                                                 int ldy, int accumulate) {
    __shared__ int last;
    __shared__ __align__(16) __nv_bfloat16 Ws[2][SK_N * SK_LD];
    __shared__ __align__(16) __nv_bfloat16 Xs[2][MT * 16 * SK_LD];
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, tq = lane & 3;
    const int n0 = blockIdx.x * SK_N, s = blockIdx.y, m0 = blockIdx.z * MT * 16;
    const int kbeg = s * kchunk, kend = kbeg + kchunk < K ? kbeg + kchunk : K;
    const int nk = (kend - kbeg + SK_K - 1) / SK_K;
    float acc[MT][2][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mt][nt][e] = 0.0f;
    auto stage = [&](int buf, int kt) {
#pragma unroll
        for (int q = 0; q < SK_N * 8 / 128; q++) {
            int c = tid + q * 128, r = c >> 3, kk = (c & 7) * 8, n = n0 + r, k = kt + kk;
            bool ok = n < N && k < kend;
            cp_async16(&Ws[buf][r * SK_LD + kk], ok ? (const void *)(W + (size_t)n * K + k) : (const void *)W,
                       ok ? 16 : 0);
        }
#pragma unroll
        for (int q = 0; q < MT * 16 * 8 / 128; q++) {
            int c = tid + q * 128, r = c >> 3, kk = (c & 7) * 8, m = m0 + r, k = kt + kk;
            bool ok = m < M && k < kend;
            if (XF) { /* k < kend implies k + 8 <= kend: K % 8 == 0 and slices are multiples of 64 */
                float v[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
                if (ok) {
                    const float *src = xf + (size_t)m * ldx + k;
                    if (vecx) {
                        float4 a = *(const float4 *)src, b = *(const float4 *)(src + 4);
                        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
                    } else {
#pragma unroll
                        for (int j = 0; j < 8; j++) v[j] = src[j];
                    }
                }
                *(uint4 *)&Xs[buf][r * SK_LD + kk] = make_uint4(pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3]),
                                                               pack_bf16x2(v[4], v[5]), pack_bf16x2(v[6], v[7]));
            } else {
                cp_async16(&Xs[buf][r * SK_LD + kk], ok ? (const void *)(xb + (size_t)m * K + k) : (const void *)xb,
                           ok ? 16 : 0);
            }
        }
        cp_async_commit();
    };
    if (nk > 0) stage(0, kbeg);
    for (int it = 0; it < nk; it++) {
        if (it + 1 < nk) {
            stage((it + 1) & 1, kbeg + (it + 1) * SK_K);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const __nv_bfloat16 *ws = Ws[it & 1], *xs = Xs[it & 1];
#pragma unroll
        for (int kc = 0; kc < SK_K / 16; kc++) {
            uint32_t bf[2][2];
            ldsm_frag_b2_nk(bf, ws + (16 * w) * SK_LD + kc * 16, SK_LD);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                uint32_t af[4];
                ldsm_frag_a(af, xs + (mt * 16) * SK_LD + kc * 16, SK_LD);
#pragma unroll
                for (int nt = 0; nt < 2; nt++) mma_bf16_16816(acc[mt][nt], af, bf[nt]);
            }
        }
        __syncthreads();
    }
    if (S == 1) { /* one slice: finish here, same arithmetic as the reduction */
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int m = m0 + mt * 16 + g + (e >> 1) * 8, n = n0 + 16 * w + nt * 8 + 2 * tq + (e & 1);
                    if (m < M && n < N) {
                        float v = acc[mt][nt][e];
                        if (bias) v += bias[n];
                        float *yp = y + (size_t)m * ldy + n;
                        *yp = accumulate ? *yp + v : v;
                    }
                }
        return;
    }
    float *out = part + (size_t)s * M * N;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int m = m0 + mt * 16 + g + (e >> 1) * 8, n = n0 + 16 * w + nt * 8 + 2 * tq + (e & 1);
                if (m < M && n < N) out[(size_t)m * N + n] = acc[mt][nt][e];
            }
    if (!cnt) return; /* the reduction kernel sums the slices */
    /* the last slice to finish this output tile sums all slices in slice order (deterministic) */
    __threadfence();
    __syncthreads();
    int tile = blockIdx.z * gridDim.x + blockIdx.x;
    if (tid == 0) last = atomicAdd(&cnt[tile], 1) == S - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    const size_t total = (size_t)M * N;
    for (int x = tid; x < MT * 16 * SK_N; x += 128) {
        int m = m0 + x / SK_N, n = n0 + x % SK_N;
        if (m >= M || n >= N) continue;
        size_t i = (size_t)m * N + n;
        float v = __ldcg(part + i);
        for (int q = 1; q < S; q++) v += __ldcg(part + (size_t)q * total + i);
        if (bias) v += bias[n];
        float *yp = y + (size_t)m * ldy + n;
        *yp = accumulate ? *yp + v : v;
    }
    if (tid == 0) cnt[tile] = 0; /* ready for the next launch on this stream */
}

/* y = sum_s part[s] (in s order) + bias + (acc ? y : 0) */
__global__ void k_skinny_reduce(const float *__restrict__ part, int S, int M, int N, const float *bias, float *y,
                                int ldy, int accumulate) {
    size_t total = (size_t)M * N;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        size_t m = i / N, n = i - m * N;
        float v = part[i];
        for (int s = 1; s < S; s++) v += part[(size_t)s * total + i];
        if (bias) v += bias[n];
        float *yp = y + m * ldy + n;
        *yp = accumulate ? *yp + v : v;
    }
}

extern "C" hyla_status cu_skinny_linear(hyla_cuda_ctx *c, const float *x, int ldx, int M, int K, const hyla_weight *W,
                                        const float *bias, float *y, int ldy, int N, int accumulate) {
    /* slices: enough blocks for ~4 per SM, from N and K only */
    int ntiles = (N + SK_N - 1) / SK_N;
    int ktiles = (K + SK_K - 1) / SK_K;
    int S = (4 * c->sm_count + ntiles - 1) / ntiles;
    if (S > 16) S = 16;
    if (S > ktiles) S = ktiles;
    if (S < 1) S = 1;
    int kchunk = (ktiles + S - 1) / S * SK_K;
    S = (K + kchunk - 1) / kchunk;
    void *scr;
    HYLA_TRY(cu_scratch(c, SCR_LINEAR, (size_t)S * M * N * sizeof(float), &scr));
    float *part = (float *)scr;
    int MT = M <= 16 ? 1 : M <= 32 ? 2 : M <= 64 ? 4 : 8;
    dim3 grid(ntiles, S, (M + MT * 16 - 1) / (MT * 16));
    if (K % 8 == 0 && !c->skinny_v1) {
        const __nv_bfloat16 *xbb = NULL;
        const bool xf = MT == 1 && !c->skinny_xconv; /* M <= 16: convert x inside the kernel */
        const int vecx = ldx % 4 == 0 && ((uintptr_t)x & 15) == 0;
        if (!xf) {
            void *xb;
            HYLA_TRY(cu_scratch(c, SCR_XB, (size_t)M * K * 2, &xb));
            HYLA_TRY(cu_f32_to_bf16_rows(c, x, ldx, M, K, (__nv_bfloat16 *)xb));
            xbb = (const __nv_bfloat16 *)xb;
        }
        if (MT > 4) { /* 64 rows per block (static shared memory); more blocks along M */
            MT = 4;
            grid.z = (M + 63) / 64;
        }
        size_t tiles = (size_t)grid.x * grid.z;
        const bool fused = c->skinny_fused == 1 || (c->skinny_fused == 2 && M <= 16);
        if (fused && c->tile_cnt_n < tiles) { /* completion counters, zero between launches */
            size_t n = tiles < 65536 ? 65536 : tiles;
            CU_TRY(cudaStreamSynchronize(c->stream));
            CU_TRY(cudaFree(c->tile_cnt));
            c->tile_cnt = NULL;
            c->tile_cnt_n = 0;
            c->scratch_gen++;
            CU_TRY(cudaMalloc((void **)&c->tile_cnt, n * sizeof(int)));
            CU_TRY(cudaMemsetAsync(c->tile_cnt, 0, n * sizeof(int), c->stream));
            c->tile_cnt_n = n;
        }
        /* Measured on H100 (docs/CUDA.md): the fused "last block reduces" epilogue was slower than
         * a separate reduction over the whole GPU (M=64: 48 us vs 31 us), so it is off. */
        int *cnt = fused ? c->tile_cnt : NULL;
        switch (MT) {
        case 1:
            if (xf)
                k_skinny2<1, true><<<grid, 128, 0, c->stream>>>(xbb, x, ldx, vecx, M, K, W->d, N, kchunk, part, S, cnt,
                                                                bias, y, ldy, accumulate);
            else
                k_skinny2<1, false><<<grid, 128, 0, c->stream>>>(xbb, x, ldx, vecx, M, K, W->d, N, kchunk, part, S,
                                                                 cnt, bias, y, ldy, accumulate);
            break;
        case 2:
            k_skinny2<2, false><<<grid, 128, 0, c->stream>>>(xbb, x, ldx, vecx, M, K, W->d, N, kchunk, part, S, cnt,
                                                             bias, y, ldy, accumulate);
            break;
        default:
            k_skinny2<4, false><<<grid, 128, 0, c->stream>>>(xbb, x, ldx, vecx, M, K, W->d, N, kchunk, part, S, cnt,
                                                             bias, y, ldy, accumulate);
            break;
        }
        CU_LAUNCH_CHECK("skinny linear v2");
        if (S == 1 || cnt) return HYLA_OK;
    } else switch (MT) {
    case 1: k_skinny<1><<<grid, 128, 0, c->stream>>>(x, ldx, M, K, W->d, N, kchunk, part); break;
    case 2: k_skinny<2><<<grid, 128, 0, c->stream>>>(x, ldx, M, K, W->d, N, kchunk, part); break;
    case 4: k_skinny<4><<<grid, 128, 0, c->stream>>>(x, ldx, M, K, W->d, N, kchunk, part); break;
    default: k_skinny<8><<<grid, 128, 0, c->stream>>>(x, ldx, M, K, W->d, N, kchunk, part); break;
    }
    CU_LAUNCH_CHECK("skinny linear");
    size_t total = (size_t)M * N;
    size_t blocks = (total + 255) / 256;
    if (blocks > 65535u * 8) blocks = 65535u * 8;
    k_skinny_reduce<<<(unsigned)blocks, 256, 0, c->stream>>>(part, S, M, N, bias, y, ldy, accumulate);
    CU_LAUNCH_CHECK("skinny reduce");
    return HYLA_OK;
}
