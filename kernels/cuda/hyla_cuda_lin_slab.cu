/* hyla_cuda_lin_slab.cu — GLA with keys wider than the chunked and recurrent kernels take
 * (dk > 256: StateX's merged heads, H = 1 with dk up to 1024 and dv up to 2048; Mamba2's state
 * 512, which is GLA with a broadcast decay), run as key slabs through those kernels. Decode
 * takes slabs from dk > 128 on: the decode kernel `k_lin_dec` keeps at most 128 key rows per
 * block in registers, and dk 129..256 would otherwise run `k_lin_rec`, about half as fast.
 *
 * GLA's state rows are independent: S[i][:] = e^(g_i) S[i][:] + k_i v, and the output is a sum
 * over the key rows, o = Σ_i q_i S[i][:]. So a head of dk keys is nsl heads of dks = dk / nsl
 * keys (dks <= 128) whose outputs are summed. q, k, the gates and the state need no copy: row t
 * of [n][H][dk] is row t of [n][H·nsl][dks], and S [H][dk][dv] is S [H·nsl][dks][dv]. Only v
 * (each slab-head reads its head's row) is expanded into scratch [rows][H·nsl][dv], and the
 * slab-heads' outputs go to scratch [rows][H·nsl][dv], summed per (row, head) in slab order
 * s = 0, 1, ... (a fixed order: the bits depend on the shape only).
 *
 * Invariants: the slab-heads run the existing kernels (k_lin_dec for decode; the fused GLA pass or
 * kernels A and B for prefill, by the same choice as any dk <= 128 call; the token loop where
 * those do not apply), so each state element gets those kernels' arithmetic, a call equals its
 * 64-token pieces and a varlen batch equals its sequences alone, bit for bit, as those kernels
 * do. Only shapes that were refused before (GLA, dk > 256) come here. GDN's delta rule couples
 * the key rows (k·S before the update), so GDN is not split this way.
 * Threading: launched on the context's stream; the scratch (SCR_SLAB) is reused by the next
 * call in stream order. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_cuda_impl.h"

/* vx[rh][s][j] = v[rh][j] for the nsl slabs s: rh = row * H + head over RH pairs. */
__global__ void __launch_bounds__(256) k_slab_expand(const float *__restrict__ v, float *__restrict__ vx, long long RH,
                                                     int nsl, int dv) {
    int j = blockIdx.x * 256 + threadIdx.x;
    if (j >= dv) return;
    for (long long rh = blockIdx.y; rh < RH; rh += gridDim.y) {
        float x = v[rh * dv + j];
        float *d = vx + rh * nsl * dv + j;
        for (int s = 0; s < nsl; s++) d[(size_t)s * dv] = x;
    }
}

/* o[rh][j] = Σ_s part[rh][s][j], s ascending. */
__global__ void __launch_bounds__(256) k_slab_sum(const float *__restrict__ part, float *__restrict__ o, long long RH,
                                                  int nsl, int dv) {
    int j = blockIdx.x * 256 + threadIdx.x;
    if (j >= dv) return;
    for (long long rh = blockIdx.y; rh < RH; rh += gridDim.y) {
        const float *p = part + rh * nsl * dv + j;
        float acc = p[0];
        for (int s = 1; s < nsl; s++) acc += p[(size_t)s * dv];
        o[rh * dv + j] = acc;
    }
}

static dim3 slab_grid(long long RH, int dv) { return dim3(cu_blocks((size_t)dv, 256), (unsigned)(RH < 65535 ? RH : 65535)); }

/* Slabs of at most 128 keys that divide dk evenly. */
static int slab_count(int dk) {
    int nsl = (dk + 127) / 128;
    while (dk % nsl) nsl++;
    return nsl;
}

extern "C" int cu_gla_slabs(int gdn, int dk) { return gdn || dk <= 256 ? 0 : slab_count(dk); }

extern "C" int cu_gla_dec_slabs(int gdn, int dk) { return gdn || dk <= 128 ? 0 : slab_count(dk); }

/* Scratch for `rows` rows: vx and part, [rows][H·nsl][dv] each, 256-byte aligned. */
static hyla_status slab_scratch(hyla_cuda_ctx *c, long long rows, int H, int nsl, int dv, float **vx, float **part) {
    size_t each = ((size_t)rows * H * nsl * dv * sizeof(float) + 255) & ~(size_t)255;
    void *scr;
    HYLA_TRY(cu_scratch(c, SCR_SLAB, 2 * each, &scr));
    *vx = (float *)scr;
    *part = (float *)((uint8_t *)scr + each);
    return HYLA_OK;
}

static hyla_status slab_expand(hyla_cuda_ctx *c, const float *v, float *vx, long long RH, int nsl, int dv) {
    if (RH <= 0) return HYLA_OK;
    k_slab_expand<<<slab_grid(RH, dv), 256, 0, c->stream>>>(v, vx, RH, nsl, dv);
    CU_LAUNCH_CHECK("gla key slabs: expand v");
    return HYLA_OK;
}

static hyla_status slab_sum(hyla_cuda_ctx *c, const float *part, float *o, long long RH, int nsl, int dv) {
    if (RH <= 0) return HYLA_OK;
    k_slab_sum<<<slab_grid(RH, dv), 256, 0, c->stream>>>(part, o, RH, nsl, dv);
    CU_LAUNCH_CHECK("gla key slabs: sum");
    return HYLA_OK;
}

static hyla_status slab_dims(int H, int dk, int nsl) {
    if ((long long)H * nsl > 65535)
        return hyla_fail(HYLA_ERR_UNSUPPORTED, "gla: %d heads of key dim %d (%d key slabs each) exceed 65535 slab-heads",
                         H, dk, nsl);
    return HYLA_OK;
}

/* The slab-heads' inputs for `rows` rows: the shape checked, scratch taken, v expanded. */
static hyla_status slab_begin(hyla_cuda_ctx *c, const float *v, long long rows, int H, int dk, int nsl, int dv,
                              float **vx, float **part) {
    HYLA_TRY(slab_dims(H, dk, nsl));
    HYLA_TRY(slab_scratch(c, rows, H, nsl, dv, vx, part));
    return slab_expand(c, v, *vx, rows * H, nsl, dv);
}

extern "C" hyla_status cu_gla_slab_decode(hyla_cuda_ctx *c, const float *q, const float *k, const float *v,
                                          const float *gk, int B, int H, int dk, int dv, float scale,
                                          float *const *d_S, int states16, float *o) {
    const int nsl = cu_gla_dec_slabs(0, dk), dks = dk / nsl;
    if (B <= 0) return HYLA_OK;
    float *vx, *part;
    HYLA_TRY(slab_begin(c, v, B, H, dk, nsl, dv, &vx, &part));
    hyla_cu_linrec r;
    cu_linrec_plain(&r, 0, H * nsl, dks, dv, scale, 1, q, k, vx, gk, NULL, part, d_S, states16);
    HYLA_TRY(cu_lin_recurrent(c, &r, B));
    return slab_sum(c, part, o, (long long)B * H, nsl, dv);
}

extern "C" hyla_status cu_gla_slab_prefill1(hyla_cuda_ctx *c, const float *q, const float *k, const float *v,
                                            const float *gk, int n, int H, int dk, int dv, float scale,
                                            const void *d_blk, int states16, float *o) {
    const int nsl = cu_gla_slabs(0, dk), dks = dk / nsl;
    if (n <= 0) return HYLA_OK;
    float *vx, *part;
    HYLA_TRY(slab_begin(c, v, n, H, dk, nsl, dv, &vx, &part));
    /* cu_lin_prefill1_dev with the slab-heads: the chunked kernels, or the token loop */
    HYLA_TRY(cu_lin_prefill1_dev(c, 0, q, k, vx, gk, NULL, n, H * nsl, dks, dv, scale, d_blk, states16, part));
    return slab_sum(c, part, o, (long long)n * H, nsl, dv);
}

extern "C" hyla_status cu_gla_slab_batch(hyla_cuda_ctx *c, const hyla_cu_linattn_batch *b) {
    const int H = b->H, dv = b->dv, nsl = cu_gla_slabs(0, b->dk);
    long long rows = 0; /* rows the packed inputs hold: up to the end of the last sequence */
    for (int z = 0; z < b->nseq; z++)
        if (b->h_len[z] > 0 && (long long)b->h_start[z] + b->h_len[z] > rows) rows = (long long)b->h_start[z] + b->h_len[z];
    if (rows <= 0) return HYLA_OK;
    float *vx, *part;
    HYLA_TRY(slab_begin(c, b->v, rows, H, b->dk, nsl, dv, &vx, &part));
    hyla_cu_linattn_batch s = *b;
    s.H = H * nsl;
    s.dk = b->dk / nsl;
    s.v = vx;
    s.o = part;
    HYLA_TRY(cu_linattn_prefill_batch(c, &s));
    /* only the sequences' rows of o are written (rows between sequences are not the call's) */
    for (int z = 0; z < b->nseq; z++) {
        if (b->h_len[z] <= 0) continue;
        size_t off = (size_t)b->h_start[z] * H;
        HYLA_TRY(slab_sum(c, part + off * nsl * dv, b->o + off * dv, (long long)b->h_len[z] * H, nsl, dv));
    }
    return HYLA_OK;
}
