/* hyla_bench_model.c — hyla-bench kernels / e2e: timings of the backend's ops and of whole
 * models, one JSON object per line on stdout.
 *
 * Method (docs/CUDA.md, BENCHMARKS.md): inputs are random (never zeros); each measurement
 * warms up, then runs batches of calls between backend syncs (a batch lasts >= 20 ms) and
 * reports the median batch's time per call, so launch gaps are included as the runtime would
 * see them. Derived rates use stated counts: bytes = what the op must read and write at
 * least once (inputs, outputs, states read and written); flops = the multiply-adds of the
 * algorithm as implemented (chunked form for prefill), x2.
 * CUDA-only references (a plain cuBLAS bf16 GEMM, the varlen batched prefill) come from
 * kernels/cuda/hyla_cuda_extra.h, declared weak so this file links without the CUDA backend.
 * Threading: single-threaded driver of one backend. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_bench_model.h"
#include "hyla_profile.h"
#include "hyla_model.h"
#include "hyla_ops.h"
#include "hyla_session.h"
#include "hyla_tp.h"
#include "hyla_util.h"

/* kernels/cuda/hyla_cuda_extra.h, weak: NULL in builds without the CUDA backend */
hyla_status hyla_cuda_device_info(hyla_backend *be, char *name, size_t name_len, int *sm_count, double *mem_gib)
    __attribute__((weak));
hyla_status hyla_cuda_bench_gemm_bf16(hyla_backend *be, int M, int N, int K, int iters, double *ms)
    __attribute__((weak));
hyla_status hyla_cuda_switches(hyla_backend *be, char *buf, size_t len) __attribute__((weak));
hyla_status hyla_cuda_prefill_varlen(hyla_backend *be, int gdn, int H, int dk, int dv, float scale, const float *q,
                                     const float *k, const float *v, const float *ga, const float *gb, float *o,
                                     int nseq, const int32_t *start, const int32_t *len, float *const *S)
    __attribute__((weak));
hyla_status hyla_cuda_set_sse_windows(hyla_backend *be, int on) __attribute__((weak));
hyla_status hyla_cuda_set_graphs(hyla_backend *be, int on) __attribute__((weak));
typedef struct { /* hyla_cuda_graph_stats of kernels/cuda/hyla_cuda_extra.h */
    uint64_t segments, ops, replays, captures, capture_failures, eager_segments, evictions;
    uint32_t cached;
} bench_graph_stats;
hyla_status hyla_cuda_get_graph_stats(hyla_backend *be, bench_graph_stats *out) __attribute__((weak));

static hyla_backend *be;
static const hyla_ops *O;
static void *CX;
static hyla_rng rng;
static char dev_name[128] = "cpu";
static char dev_switches[256]; /* the CUDA backend's kernel-form switches (empty on the CPU) */

/* Datasheet limits of the GPUs we run on (dense bf16 TFLOP/s, HBM TB/s), printed next to the
 * achieved figures; 0 for other devices (the fields are then left out). */
static void datasheet(double *tflops, double *tbps) {
    *tflops = *tbps = 0;
    if (strstr(dev_name, "H100") && strstr(dev_name, "HBM3")) *tflops = 989, *tbps = 3.35; /* H100 SXM */
    else if (strstr(dev_name, "H100")) *tflops = 756, *tbps = 2.0;                       /* H100 PCIe */
    else if (strstr(dev_name, "H200")) *tflops = 989, *tbps = 4.8;
}
static const char *dev_arg = "cpu";

#define DIE(...) HYLA_BENCH_DIE("hyla-bench", __VA_ARGS__)
#define TRY(call) HYLA_BENCH_TRY("hyla-bench", call)

/* ---------------------------------------------------------------- helpers */

static void *dalloc(size_t bytes) {
    void *p;
    TRY(O->alloc(CX, bytes ? bytes : 4, &p));
    return p;
}
/* device buffer of n floats ~ scale * N(0,1) (or uniform in [lo, hi] when lo < hi). The first
 * 2^24 values are fresh draws; a larger buffer continues with those draws rotated by a random
 * offset per piece, because drawing a 128k-token sequence's 1.2 G inputs one by one on the host
 * took longer than the benchmark (the kernels' speed does not depend on which draws repeat). */
static float *drand(size_t n, float scale, float lo, float hi) {
    const size_t piece = (size_t)1 << 22, fresh = (size_t)1 << 24;
    float *h = malloc((n < fresh ? n : fresh) * sizeof(float));
    float *d = dalloc(n * sizeof(float));
    size_t drawn = 0;
    for (size_t off = 0; off < n; off += piece) {
        size_t m = n - off < piece ? n - off : piece;
        if (off < fresh) {
            for (size_t i = 0; i < m; i++)
                h[off + i] = lo < hi ? lo + (hi - lo) * hyla_rng_uniform(&rng) : scale * hyla_rng_normal(&rng);
            drawn = off + m;
            TRY(O->upload(CX, d + off, h + off, m * sizeof(float)));
            continue;
        }
        size_t r = (size_t)(hyla_rng_uniform(&rng) * (double)drawn) % drawn, first = drawn - r < m ? drawn - r : m;
        TRY(O->upload(CX, d + off, h + r, first * sizeof(float)));
        if (first < m) TRY(O->upload(CX, d + off + first, h, (m - first) * sizeof(float)));
    }
    free(h);
    return d;
}
static void dfree(void *p) { O->free(CX, p); }

typedef void (*bench_fn)(void *ud);
/* Median time of one call in ms (batches of calls between syncs, see the file comment). */
static double timeit(bench_fn fn, void *ud) {
    fn(ud);
    TRY(O->sync(CX));
    double t0 = hyla_now();
    fn(ud);
    TRY(O->sync(CX));
    double one = hyla_now() - t0;
    int reps = one > 0 ? (int)(0.02 / one) + 1 : 100;
    if (reps > 1000) reps = 1000;
    int batches = one > 1.0 ? 3 : 5;
    double t[5];
    for (int b = 0; b < batches; b++) {
        t0 = hyla_now();
        for (int r = 0; r < reps; r++) fn(ud);
        TRY(O->sync(CX));
        t[b] = (hyla_now() - t0) / reps;
    }
    qsort(t, (size_t)batches, sizeof t[0], hyla_bench_cmpd);
    return t[batches / 2] * 1e3;
}

static int e2e_tp = 1;              /* hyla-bench e2e --tp */
static hyla_tp_group *e2e_grp;       /* its group (NULL: one device) */

static void emit_head(const char *bench) {
    printf("{\"bench\":\"%s\",\"device\":\"%s\",\"gpu\":\"%s\"", bench, dev_arg, dev_name);
    if (e2e_tp > 1) printf(",\"tp\":%d", e2e_tp);
    if (dev_switches[0]) printf(",\"cuda_switches\":\"%s\"", dev_switches);
}

/* CUDA graphs on or off on every rank (one device without --tp). */
static hyla_status set_graphs_all(int on) {
    for (int r = 0; r < e2e_tp; r++) HYLA_TRY(hyla_cuda_set_graphs(e2e_grp ? hyla_tp_rank_backend(e2e_grp, r) : be, on));
    return HYLA_OK;
}

/* ---------------------------------------------------------------- GEMM */

typedef struct {
    float *x, *y;
    hyla_weight *w;
    int M, K, N;
} lin_ud;
static void lin_run(void *u) {
    lin_ud *a = u;
    TRY(O->linear(CX, a->x, a->K, a->M, a->K, a->w, NULL, a->y, a->N, a->N, 0));
}
/* the same product as prompt rows (the path of prefill pieces) */
static void lin_prompt_run(void *u) {
    lin_ud *a = u;
    hyla_linear_out lo = {a->w, NULL, a->y, a->N, a->N, NULL, 0};
    TRY(O->linear_multi(CX, a->x, a->K, a->M, a->K, 1, &lo, 0, HYLA_LINEAR_PREFILL));
}

static hyla_weight *rand_weight(int N, int K) {
    size_t n = (size_t)N * K;
    uint16_t *h = malloc(n * 2);
    for (size_t i = 0; i < n; i++) h[i] = hyla_f32_to_bf16(0.02f * hyla_rng_normal(&rng));
    hyla_weight *w;
    TRY(O->weight_create(CX, h, HYLA_DT_BF16, N, K, &w));
    free(h);
    return w;
}

/* One layer's projections of a prefill piece as the runtime issues them (hyla_session.c): q, k,
 * v of the same x in one linear_multi, o alone, the MLP's gate and up in one, down alone; each as
 * prompt rows. Rows "linear_prompt_rows_call" per call and "linear_prompt_rows_layer" for the
 * four together (FLOPs over the sum of their times). */
typedef struct {
    float *x;
    int M, K, n;
    hyla_linear_out lo[HYLA_LINEAR_MULTI_MAX];
} multi_ud;
static void multi_run(void *u) {
    multi_ud *a = u;
    TRY(O->linear_multi(CX, a->x, a->K, a->M, a->K, a->n, a->lo, 0, HYLA_LINEAR_PREFILL));
}

static void bench_layer_projections(int M, int D, int F, double ref_tflops) {
    struct {
        const char *what;
        int K, n, N;
    } calls[4] = {{"q/k/v (one call)", D, 3, D}, {"o", D, 1, D}, {"mlp gate/up (one call)", D, 2, F}, {"mlp down", F, 1, D}};
    double sum_ms = 0, sum_fl = 0;
    for (int i = 0; i < 4; i++) {
        multi_ud a = {drand((size_t)M * calls[i].K, 1.0f, 0, 0), M, calls[i].K, calls[i].n, {{0}}};
        for (int j = 0; j < a.n; j++)
            a.lo[j] = (hyla_linear_out){rand_weight(calls[i].N, a.K), NULL, dalloc((size_t)M * calls[i].N * 4),
                                        calls[i].N, calls[i].N, NULL, 0};
        double ms = timeit(multi_run, &a), fl = 2.0 * M * (double)calls[i].N * a.K * a.n;
        sum_ms += ms;
        sum_fl += fl;
        double tf = fl / (ms * 1e-3) / 1e12;
        emit_head("linear_prompt_rows_call");
        printf(",\"shape\":\"%s\",\"M\":%d,\"K\":%d,\"N\":%d,\"outputs\":%d,\"ms\":%.4f,\"tflops\":%.2f", calls[i].what, M,
               a.K, calls[i].N, a.n, ms, tf);
        if (ref_tflops > 0) printf(",\"vs_cublas_bf16\":%.3f", tf / ref_tflops);
        printf("}\n");
        fflush(stdout);
        dfree(a.x);
        for (int j = 0; j < a.n; j++) {
            dfree(a.lo[j].y);
            O->weight_destroy(CX, (hyla_weight *)a.lo[j].W);
        }
    }
    double tf = sum_fl / (sum_ms * 1e-3) / 1e12;
    emit_head("linear_prompt_rows_layer");
    printf(",\"M\":%d,\"hidden\":%d,\"mlp\":%d,\"ms\":%.4f,\"tflops\":%.2f", M, D, F, sum_ms, tf);
    if (ref_tflops > 0) printf(",\"vs_cublas_bf16\":%.3f", tf / ref_tflops);
    printf("}\n");
    fflush(stdout);
}

static void bench_gemm(int quick) {
    double ref_tflops = 0;
    int big = quick ? 2048 : 8192;
    if (hyla_cuda_bench_gemm_bf16 && !strcmp(O->name, "cuda")) {
        double ms;
        TRY(hyla_cuda_bench_gemm_bf16(be, big, big, big, 10, &ms));
        ref_tflops = 2.0 * big * (double)big * big / (ms * 1e-3) / 1e12;
        emit_head("gemm_cublas_bf16");
        printf(",\"M\":%d,\"N\":%d,\"K\":%d,\"ms\":%.4f,\"tflops\":%.1f}\n", big, big, big, ms, ref_tflops);
        fflush(stdout);
    }
    struct {
        int M, K, N;
        const char *what;
    } shapes[] = {{big, big, big, "square"},
                  {4096, 2304, 2304, "proj q/k/v/o (1.3B)"},
                  {4096, 2304, 6144, "mlp gate/up (1.3B)"},
                  {4096, 6144, 2304, "mlp down (1.3B)"},
                  /* the 1.68B GDN model's 4k prompt (one piece): its value-width projections */
                  {4096, 2304, 4608, "prompt of 4096: v, gate (expand 2)"},
                  {4096, 4608, 2304, "prompt of 4096: o (expand 2)"},
                  {1024, 2304, 2304, "prefill piece of 1024: q/k/v/o"},
                  {1024, 2304, 6144, "prefill piece of 1024: mlp gate/up"},
                  {1024, 6144, 2304, "prefill piece of 1024: mlp down"},
                  {8192, 2304, 2304, "prefill piece of 8192: q/k/v/o"},
                  {8192, 2304, 4608, "prefill piece of 8192: v, gate (expand 2)"},
                  {8192, 4608, 2304, "prefill piece of 8192: o (expand 2)"},
                  {8192, 2304, 6144, "prefill piece of 8192: mlp gate/up"},
                  {8192, 6144, 2304, "prefill piece of 8192: mlp down"},
                  /* the 1.68B GDN model's prompt projections at a 16384-token piece, one GPU and a
                   * TP = 2 rank (half the heads, half the MLP): where the half-width calls lose
                   * against cuBLAS on the same shape */
                  {16384, 2304, 18, "piece of 16384: a, b gates"},
                  {16384, 2304, 9, "piece of 16384, TP = 2 rank: a, b gates"},
                  {16384, 2304, 2304, "piece of 16384: q, k"},
                  {16384, 2304, 1152, "piece of 16384, TP = 2 rank: q, k"},
                  {16384, 2304, 4608, "piece of 16384: v, gate"},
                  {16384, 4608, 2304, "piece of 16384: o"},
                  {16384, 2304, 2304, "piece of 16384, TP = 2 rank: o (K 2304)"},
                  {16384, 2304, 3072, "piece of 16384, TP = 2 rank: mlp gate/up"},
                  {16384, 3072, 2304, "piece of 16384, TP = 2 rank: mlp down"},
                  {64, 2304, 6144, "prefill chunk of 64 rows"},
                  {1, 2304, 6144, "decode B=1"},
                  {16, 2304, 6144, "decode B=16"},
                  {64, 2304, 6144, "decode B=64"},
                  {128, 2304, 6144, "decode B=128"},
                  {256, 2304, 6144, "decode B=256"},
                  {128, 6144, 2304, "decode B=128: mlp down"},
                  {256, 6144, 2304, "decode B=256: mlp down"},
                  {256, 2304, 2304, "decode B=256: q/k/o"},
                  {256, 2304, 4608, "decode B=256: v (expand 2)"},
                  /* a TP = 2 rank's decode projections at B = 256 (half the heads, half the MLP;
                   * the v / gate and o halves are the 2304 x 2304 shape above): against the whole
                   * model's, whether a half-width call takes half the time */
                  {256, 2304, 1152, "decode B=256, TP = 2 rank: q, k"},
                  {256, 2304, 3072, "decode B=256, TP = 2 rank: mlp gate/up"},
                  {256, 3072, 2304, "decode B=256, TP = 2 rank: mlp down"}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        int M = shapes[i].M, K = shapes[i].K, N = shapes[i].N;
        if (quick && M > 512) M = 512;
        lin_ud a = {drand((size_t)M * K, 1.0f, 0, 0), dalloc((size_t)M * N * 4), rand_weight(N, K), M, K, N};
        double ms = timeit(lin_run, &a);
        double fl = 2.0 * M * (double)N * K, bytes = (double)N * K * 2 + (double)M * K * 4 + (double)M * N * 4;
        double tf = fl / (ms * 1e-3) / 1e12;
        emit_head("linear");
        printf(",\"shape\":\"%s\",\"M\":%d,\"K\":%d,\"N\":%d,\"ms\":%.4f,\"tflops\":%.2f,\"gbps\":%.1f", shapes[i].what,
               M, K, N, ms, tf, bytes / (ms * 1e-3) / 1e9);
        if (ref_tflops > 0) printf(",\"vs_cublas_bf16\":%.3f", tf / ref_tflops);
        /* cuBLAS on the same shape (bf16 in and out, its own algorithm): what a GEMM without the
         * batch-invariance contract takes, for the rows a decode step has */
        double cms;
        if (ref_tflops > 0 && M <= 256 && hyla_cuda_bench_gemm_bf16(be, M, N, K, 20, &cms) == HYLA_OK)
            printf(",\"cublas_ms\":%.4f,\"vs_cublas_same_shape\":%.3f", cms, cms / ms);
        printf("}\n");
        fflush(stdout);
        if (M >= 512) { /* large shapes also as prompt rows (ops->linear_multi, HYLA_LINEAR_PREFILL) */
            ms = timeit(lin_prompt_run, &a);
            tf = fl / (ms * 1e-3) / 1e12;
            emit_head("linear_prompt_rows");
            printf(",\"shape\":\"%s\",\"M\":%d,\"K\":%d,\"N\":%d,\"ms\":%.4f,\"tflops\":%.2f", shapes[i].what, M, K, N,
                   ms, tf);
            if (ref_tflops > 0) printf(",\"vs_cublas_bf16\":%.3f", tf / ref_tflops);
            /* the prompt linears against cuBLAS on the same shape: cuBLAS with its own algorithm,
             * bf16 x in and bf16 out (no batch invariance, no fp32 x to convert, half the output
             * bytes) against the prompt-row path (fp32 x converted in a pass, fp32 out, the fixed
             * 1024-row algorithm) */
            if (ref_tflops > 0 && hyla_cuda_bench_gemm_bf16(be, M, N, K, 10, &cms) == HYLA_OK)
                printf(",\"cublas_ms\":%.4f,\"vs_cublas_same_shape\":%.3f", cms, cms / ms);
            printf("}\n");
            fflush(stdout);
        }
        dfree(a.x);
        dfree(a.y);
        O->weight_destroy(CX, a.w);
    }
    /* the 1.3B model's layer (hidden 2304, MLP 6144) for a 1024-token piece and a 4096-token one */
    bench_layer_projections(quick ? 256 : 1024, 2304, 6144, ref_tflops);
    if (!quick) bench_layer_projections(4096, 2304, 6144, ref_tflops);
}

/* ---------------------------------------------------------------- linear-attention prefill */

typedef struct {
    int gdn, n, H, dk, dv, nseq, varlen;
    float *q, *k, *v, *g, *b, *o, *S;
} pf_ud;
static void pf_run(void *u) {
    pf_ud *a = u;
    size_t sk = (size_t)a->n * a->H * a->dk, sv = (size_t)a->n * a->H * a->dv, sg = (size_t)a->n * a->H;
    size_t ss = (size_t)a->H * a->dk * a->dv;
    float scale = 1.0f / sqrtf((float)a->dk);
    if (a->varlen) {
        int32_t st[64], ln[64];
        float *Sp[64];
        for (int z = 0; z < a->nseq; z++) {
            st[z] = z * a->n;
            ln[z] = a->n;
            Sp[z] = a->S + z * ss;
        }
        TRY(hyla_cuda_prefill_varlen(be, a->gdn, a->H, a->dk, a->dv, scale, a->q, a->k, a->v, a->g,
                                     a->gdn ? a->b : NULL, a->o, a->nseq, st, ln, Sp));
        return;
    }
    for (int z = 0; z < a->nseq; z++) {
        size_t gz = a->gdn ? z * sg : z * sk;
        if (a->gdn)
            TRY(O->gdn_prefill(CX, a->q + z * sk, a->k + z * sk, a->v + z * sv, a->g + gz, a->b + z * sg, a->n, a->H,
                               a->dk, a->dv, scale, a->S + z * ss, a->o + z * sv));
        else
            TRY(O->gla_prefill(CX, a->q + z * sk, a->k + z * sk, a->v + z * sv, a->g + gz, a->n, a->H, a->dk, a->dv,
                               scale, a->S + z * ss, a->o + z * sv));
    }
}

/* flops of the chunked algorithm per (chunk of C tokens, head), x2 for multiply-adds */
static double chunk_flops(int gdn, int C, int dk, int dv) {
    double f = (double)C * C * dk      /* Q K^T */
               + (double)C * dk * dv   /* q~ S */
               + (double)C * C * dv    /* Aqk U */
               + (double)C * dk * dv;  /* k~^T U */
    if (gdn) f += (double)C * C * dk   /* K K^T */
                  + (double)C * C * dk /* W = T K */
                  + (double)C * C * dv /* U0 = T V */
                  + (double)C * dk * dv /* W S */
                  + (double)C * C * C / 3; /* forward substitution */
    return 2 * f;
}

/* Inputs of nseq sequences of n tokens, packed, and their states: q, k, v ~ N(0, 1) (GDN: q, k
 * unit-norm-ish, N(0, 1/dk)), log gates in a decaying range, beta in (0.05, 1), states N(0, 0.01).
 * (GDN's q and k are drawn twice, as they always were, so the inputs of earlier figures stay.) */
static pf_ud pf_new(int gdn, int n, int H, int dk, int dv, int nseq) {
    size_t tok = (size_t)n * nseq;
    pf_ud a = {gdn, n, H, dk, dv, nseq, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    a.q = drand(tok * H * dk, 1.0f, 0, 0);
    a.k = drand(tok * H * dk, 1.0f, 0, 0);
    if (gdn) {
        dfree(a.q);
        dfree(a.k);
        a.q = drand(tok * H * dk, 1.0f / sqrtf((float)dk), 0, 0);
        a.k = drand(tok * H * dk, 1.0f / sqrtf((float)dk), 0, 0);
    }
    a.v = drand(tok * H * dv, 1.0f, 0, 0);
    a.g = gdn ? drand(tok * H, 0, -0.3f, -0.01f) : drand(tok * H * dk, 0, -0.2f, -0.001f);
    a.b = gdn ? drand(tok * H, 0, 0.05f, 1.0f) : NULL;
    a.o = dalloc(tok * H * dv * 4);
    a.S = drand((size_t)nseq * H * dk * dv, 0.1f, 0, 0);
    return a;
}
static void pf_free(pf_ud *a) {
    dfree(a->q);
    dfree(a->k);
    dfree(a->v);
    dfree(a->g);
    if (a->b) dfree(a->b);
    dfree(a->o);
    dfree(a->S);
}

static void bench_prefill(int quick) {
    int n = quick ? 1024 : 8192, H = 16, dk = 128, dv = 128, nseq = 8;
    for (int gdn = 0; gdn < 2; gdn++) {
        size_t tok = (size_t)n * nseq;
        pf_ud a = pf_new(gdn, n, H, dk, dv, nseq);
        double fl = chunk_flops(gdn, 64, dk, dv) * (tok / 64.0) * H;
        double io = (double)tok * H * (2.0 * dk + 2.0 * dv + (gdn ? 2 : dk)) * 4;
        for (int mode = 0; mode < 3; mode++) {
            if (mode == 2 && (!hyla_cuda_prefill_varlen || strcmp(O->name, "cuda"))) continue;
            a.nseq = mode == 0 ? 1 : nseq;
            a.varlen = mode == 2;
            double ms = timeit(pf_run, &a);
            double f = mode == 0 ? fl / nseq : fl, b = mode == 0 ? io / nseq : io;
            emit_head(gdn ? "prefill_gdn" : "prefill_gla");
            printf(",\"seqs\":%d,\"tokens_per_seq\":%d,\"H\":%d,\"dk\":%d,\"dv\":%d,\"mode\":\"%s\",\"ms\":%.4f,"
                   "\"tokens_per_s\":%.0f,\"tflops\":%.2f,\"io_gbps\":%.1f}\n",
                   a.nseq, n, H, dk, dv, mode == 0 ? "one call" : mode == 1 ? "one call per sequence" : "varlen batch",
                   ms, a.nseq * (double)n / (ms * 1e-3), f / (ms * 1e-3) / 1e12, b / (ms * 1e-3) / 1e9);
            fflush(stdout);
        }
        pf_free(&a);
    }
}

/* One sequence per --ctx length (default 32k and 128k tokens), 18 heads, dk = dv = 128 (the 1.68B
 * GDN model's heads at dv 128): chunked GLA and GDN prefill of one op call, the kernels
 * deploy/compare-fla.sh times against flash-linear-attention's chunk kernels on the same sizes.
 * Inputs are fp32 here (the backend's activations); FLA's are bf16. */
static int seq_ctx[8] = {32768, 131072}, seq_nctx = 2;
static void bench_seq(int quick) {
    const int H = 18, dk = 128, dv = 128;
    int ctx1[1] = {2048}, *ns = quick ? ctx1 : seq_ctx, nn = quick ? 1 : seq_nctx;
    for (int i = 0; i < nn; i++)
        for (int gdn = 0; gdn < 2; gdn++) {
            size_t tok = (size_t)ns[i];
            pf_ud a = pf_new(gdn, ns[i], H, dk, dv, 1);
            double ms = timeit(pf_run, &a);
            double fl = chunk_flops(gdn, 64, dk, dv) * (tok / 64.0) * H;
            emit_head(gdn ? "seq_gdn" : "seq_gla");
            printf(",\"tokens\":%d,\"H\":%d,\"dk\":%d,\"dv\":%d,\"ms\":%.4f,\"tokens_per_s\":%.0f,\"tflops\":%.2f}\n",
                   ns[i], H, dk, dv, ms, tok / (ms * 1e-3), fl / (ms * 1e-3) / 1e12);
            fflush(stdout);
            pf_free(&a);
        }
}

/* ---------------------------------------------------------------- SSE vs GLA prefill */

typedef struct {
    int n, H, dk, dv, N, K, gdn;
    float *q1, *k1, *q2, *k2, *v, *ga, *gb, *w, *S0, *Sp, *o, *lg, *ba, *bb;
    int32_t *idx;
    int window; /* sse_prefill's */
} sse_ud;
static void sse_run(void *u) {
    sse_ud *a = u;
    float scale = 1.0f / sqrtf((float)a->dk);
    TRY(O->sse_prefill(CX, a->gdn ? HYLA_SSE_GDN : HYLA_SSE_GLA, a->q1, a->k1, a->q2, a->k2, a->v, a->ga, a->gb, a->ba,
                       a->bb, a->idx, a->w, a->n, a->H, a->dk, a->dv, a->N, a->K, scale, a->window, a->S0, a->Sp,
                       a->o));
}
static void gla_run(void *u) {
    sse_ud *a = u;
    float scale = 1.0f / sqrtf((float)a->dk);
    if (a->gdn)
        TRY(O->gdn_prefill(CX, a->q1, a->k1, a->v, a->ga, a->ba, a->n, a->H, a->dk, a->dv, scale, a->S0, a->o));
    else
        TRY(O->gla_prefill(CX, a->q1, a->k1, a->v, a->ga, a->n, a->H, a->dk, a->dv, scale, a->S0, a->o));
}

/* One row per SSE chunking (windows of the default HYLA_SSE_PREFILL_WINDOW tokens of the call,
 * windows of 64, and on the CUDA backend 64-token chunks of each partition without windows):
 * SSE prefill against the plain mixer's prefill of the same tokens (gla_run: GLA or GDN as
 * a->gdn says), key base_key. */
static void sse_vs_base(sse_ud *a, const char *bench, const char *base_key) {
    const int cuda = hyla_cuda_set_sse_windows && !strcmp(O->name, "cuda");
    double ms_base = timeit(gla_run, a);
    const int wins[3] = {HYLA_SSE_PREFILL_WINDOW, 64, 0};
    for (int i = 0; i < 3; i++) {
        const int win = wins[i];
        if (!win && !cuda) break;
        if (cuda) TRY(hyla_cuda_set_sse_windows(be, win != 0));
        a->window = win ? win : 64;
        double ms_sse = timeit(sse_run, a);
        char what[64];
        if (win) snprintf(what, sizeof what, "windows of %d tokens of the call", win);
        else snprintf(what, sizeof what, "64-token chunks of each partition");
        emit_head(bench);
        printf(",\"tokens\":%d,\"H\":%d,\"dk\":%d,\"dv\":%d,\"N\":%d,\"K\":%d,\"window\":%d,\"sse_chunks\":\"%s\","
               "\"ms_sse\":%.3f,\"%s\":%.3f,\"ratio\":%.2f}\n",
               a->n, a->H, a->dk, a->dv, a->N, a->K, win, what, ms_sse, base_key, ms_base, ms_sse / ms_base);
        fflush(stdout);
    }
    if (cuda) TRY(hyla_cuda_set_sse_windows(be, 1));
    a->window = HYLA_SSE_PREFILL_WINDOW;
}

static void bench_sse(int quick) {
    sse_ud a = {quick ? 2048 : 32768, 18, 128, 128, 4, 1, 0, NULL, NULL, NULL, NULL, NULL, NULL,
                NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, HYLA_SSE_PREFILL_WINDOW};
    size_t nk = (size_t)a.n * a.H * a.dk, nv = (size_t)a.n * a.H * a.dv;
    a.q1 = drand(nk, 0.1f, 0, 0);
    a.k1 = drand(nk, 0.1f, 0, 0);
    a.q2 = drand(nk, 0.1f, 0, 0);
    a.k2 = drand(nk, 0.1f, 0, 0);
    a.v = drand(nv, 1.0f, 0, 0);
    a.ga = drand(nk, 0, -0.2f, -0.001f);
    a.gb = drand(nk, 0, -0.2f, -0.001f);
    a.lg = drand((size_t)a.n * a.N, 1.0f, 0, 0);
    a.idx = dalloc((size_t)a.n * a.K * 4);
    a.w = dalloc((size_t)a.n * a.K * 4);
    TRY(O->sse_route(CX, a.lg, a.n, a.N, a.K, a.idx, a.w));
    a.S0 = drand((size_t)a.H * a.dk * a.dv, 0.1f, 0, 0);
    a.Sp = drand((size_t)a.N * a.H * a.dk * a.dv, 0.1f, 0, 0);
    a.o = dalloc(nv * 4);
    sse_vs_base(&a, "prefill_sse_vs_gla", "ms_gla");
    /* the GDN transition against GDN prefill: scalar gates and betas, keys of norm ~1 */
    float *gbufs[] = {a.q1, a.k1, a.q2, a.k2, a.ga, a.gb};
    for (size_t i = 0; i < sizeof gbufs / sizeof gbufs[0]; i++) dfree(gbufs[i]);
    a.gdn = 1;
    a.q1 = drand(nk, 1.0f / sqrtf((float)a.dk), 0, 0);
    a.k1 = drand(nk, 1.0f / sqrtf((float)a.dk), 0, 0);
    a.q2 = drand(nk, 1.0f / sqrtf((float)a.dk), 0, 0);
    a.k2 = drand(nk, 1.0f / sqrtf((float)a.dk), 0, 0);
    a.ga = drand((size_t)a.n * a.H, 0, -0.3f, -0.01f);
    a.gb = drand((size_t)a.n * a.H, 0, -0.3f, -0.01f);
    a.ba = drand((size_t)a.n * a.H, 0, 0.05f, 1.0f);
    a.bb = drand((size_t)a.n * a.H, 0, 0.05f, 1.0f);
    sse_vs_base(&a, "prefill_sse_gdn_vs_gdn", "ms_gdn");
    dfree(a.ba);
    dfree(a.bb);
    float *bufs[] = {a.q1, a.k1, a.q2, a.k2, a.v, a.ga, a.gb, a.lg, a.w, a.S0, a.Sp, a.o};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dfree(bufs[i]);
    dfree(a.idx);
}

/* ---------------------------------------------------------------- decode state update */

typedef struct {
    int kind, B, H, dk, dv, N, K; /* kind 0 gla, 1 gdn, 2 sse-gla */
    float *q, *k, *v, *g, *b, *o, *w;
    int32_t *idx;
    float **S, **Sp;
} dec_ud;
static void dec_run(void *u) {
    dec_ud *a = u;
    float scale = 1.0f / sqrtf((float)a->dk);
    if (a->kind == 0)
        TRY(O->gla_decode(CX, a->q, a->k, a->v, a->g, a->B, a->H, a->dk, a->dv, scale, a->S, a->o));
    else if (a->kind == 1)
        TRY(O->gdn_decode(CX, a->q, a->k, a->v, a->g, a->b, a->B, a->H, a->dk, a->dv, scale, a->S, a->o));
    else
        TRY(O->sse_decode(CX, HYLA_SSE_GLA, a->q, a->k, a->q, a->k, a->v, a->g, a->g, NULL, NULL, a->idx, a->w, a->B,
                          a->H, a->dk, a->dv, a->N, a->K, scale, a->S, a->Sp, a->o));
}

static void bench_decode(int quick) {
    int Bs[] = {1, 16, 64, 256};
    const char *names[] = {"decode_gla", "decode_gdn", "decode_sse_gla_n4k1"};
    for (int kind = 0; kind < 3; kind++)
        for (size_t bi = 0; bi < sizeof Bs / sizeof Bs[0]; bi++) {
            int B = Bs[bi];
            if (quick && B > 16) continue;
            dec_ud a = {kind, B, 18, 128, 128, 4, 1, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
            size_t nk = (size_t)B * a.H * a.dk, nv = (size_t)B * a.H * a.dv, ss = (size_t)a.H * a.dk * a.dv;
            a.q = drand(nk, 0.1f, 0, 0);
            a.k = drand(nk, 0.1f, 0, 0);
            a.v = drand(nv, 1.0f, 0, 0);
            a.g = kind == 1 ? drand((size_t)B * a.H, 0, -0.3f, -0.01f) : drand(nk, 0, -0.2f, -0.001f);
            a.b = drand((size_t)B * a.H, 0, 0.05f, 1.0f);
            a.o = dalloc(nv * 4);
            a.S = malloc(B * sizeof(float *));
            a.Sp = malloc(B * sizeof(float *));
            for (int b = 0; b < B; b++) {
                a.S[b] = drand(ss, 0.1f, 0, 0);
                a.Sp[b] = kind == 2 ? drand(ss * a.N, 0.1f, 0, 0) : NULL;
            }
            int32_t *hidx = malloc(B * 4);
            float *hw = malloc(B * 4);
            for (int b = 0; b < B; b++) {
                hidx[b] = b % a.N;
                hw[b] = 0.5f;
            }
            a.idx = dalloc(B * 4);
            a.w = dalloc(B * 4);
            TRY(O->upload(CX, a.idx, hidx, B * 4));
            TRY(O->upload(CX, a.w, hw, B * 4));
            double ms = timeit(dec_run, &a);
            int parts = kind == 2 ? 1 + a.K : 1;
            double bytes = (double)B * ss * 4 * 2 * parts + (double)B * a.H * (2.0 * a.dk * 4 + a.dv * 4 * 2);
            emit_head(names[kind]);
            printf(",\"B\":%d,\"H\":%d,\"dk\":%d,\"dv\":%d,\"ms\":%.4f,\"state_mb\":%.1f,\"gbps\":%.1f}\n", B, a.H, a.dk,
                   a.dv, ms, (double)B * ss * 4 * parts / 1e6, bytes / (ms * 1e-3) / 1e9);
            fflush(stdout);
            for (int b = 0; b < B; b++) {
                dfree(a.S[b]);
                if (a.Sp[b]) dfree(a.Sp[b]);
            }
            free(a.S);
            free(a.Sp);
            free(hidx);
            free(hw);
            float *bufs[] = {a.q, a.k, a.v, a.g, a.b, a.o, a.w};
            for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dfree(bufs[i]);
            dfree(a.idx);
        }
}

/* ---------------------------------------------------------------- attention */

typedef struct {
    int n, B, Hq, Hk, D, ctx;
    float *q, *k, *v, *o;
    hyla_kv_view *views;
    int32_t *pos;
} att_ud;
/* a prefill of n tokens at the end of a ctx-token context (ctx = n: from position 0) */
static void attp_run(void *u) {
    att_ud *a = u;
    TRY(O->attn_prefill(CX, a->q, a->k, a->v, a->n, a->Hq, a->Hk, a->D, a->ctx - a->n, &a->views[0], 0,
                        1.0f / sqrtf((float)a->D), a->o));
}
static void attd_run(void *u) {
    att_ud *a = u;
    TRY(O->attn_decode(CX, a->q, a->k, a->v, a->B, a->Hq, a->Hk, a->D, a->pos, a->views, 0, 1.0f / sqrtf((float)a->D),
                       a->o));
}

static hyla_kv_view make_view(int tokens, int Hk, int D, void *src_page) {
    int pt = 64, np = (tokens + pt - 1) / pt;
    size_t pb = (size_t)pt * Hk * D * hyla_dtype_size(O->kv_dtype);
    void **kp = malloc(np * sizeof(void *)), **vp = malloc(np * sizeof(void *));
    for (int p = 0; p < np; p++) {
        kp[p] = dalloc(pb);
        vp[p] = dalloc(pb);
        if (src_page) {
            TRY(O->copy(CX, kp[p], src_page, pb));
            TRY(O->copy(CX, vp[p], src_page, pb));
        }
    }
    hyla_kv_view v = {.k_pages = kp, .v_pages = vp, .n_pages = np, .page_tokens = pt};
    return v;
}
static void free_view(hyla_kv_view *v) {
    for (int p = 0; p < v->n_pages; p++) {
        dfree(v->k_pages[p]);
        dfree(v->v_pages[p]);
    }
    free((void *)v->k_pages);
    free((void *)v->v_pages);
}

/* One attention prefill call: n queries at the end of a ctx-token context (ctx = n: the whole
 * prompt from position 0, row "attn_prefill"; else row "attn_prefill_piece"). TFLOP/s count the
 * causal products: ctx - n + (n + 1) / 2 keys per query on average. */
static void bench_attn_prefill(int n, int ctx, int Hq, int Hk, int D) {
    att_ud a = {n, 1, Hq, Hk, D, ctx, NULL, NULL, NULL, NULL, NULL, NULL};
    a.q = drand((size_t)n * Hq * D, 1.0f, 0, 0);
    a.k = drand((size_t)n * Hk * D, 1.0f, 0, 0);
    a.v = drand((size_t)n * Hk * D, 1.0f, 0, 0);
    a.o = dalloc((size_t)n * Hq * D * 4);
    hyla_kv_view v = make_view(ctx, Hk, D, NULL);
    a.views = &v;
    double ms = timeit(attp_run, &a);
    double fl = 2.0 * 2.0 * (double)n * (ctx - n + (n + 1) / 2.0) * D * Hq;
    emit_head(ctx == n ? "attn_prefill" : "attn_prefill_piece");
    printf(",\"tokens\":%d", n);
    if (ctx != n) printf(",\"ctx\":%d", ctx);
    printf(",\"Hq\":%d,\"Hk\":%d,\"D\":%d,\"ms\":%.3f,\"tflops\":%.1f}\n", Hq, Hk, D, ms, fl / (ms * 1e-3) / 1e12);
    fflush(stdout);
    free_view(&v);
    dfree(a.q);
    dfree(a.k);
    dfree(a.v);
    dfree(a.o);
}

static void bench_attention(int quick) {
    int Hq = 18, Hk = 9, D = 128;
    int ns[] = {4096, 32768};
    for (int i = 0; i < 2; i++) bench_attn_prefill(quick ? ns[i] / 16 : ns[i], quick ? ns[i] / 16 : ns[i], Hq, Hk, D);
    /* a 1024-token piece at the end of a 4k / 32k context, 18 KV heads (the 1.3B sse-h model's
     * attention layers): what prefill through the runtime runs */
    for (int i = 0; i < 2; i++) bench_attn_prefill(quick ? 64 : 1024, quick ? ns[i] / 16 : ns[i], Hq, 18, D);
    /* head dim 64, 32 query heads on 8 KV heads (the LTE paper's 1.4B attention shape) */
    for (int i = 0; i < 2; i++) bench_attn_prefill(quick ? ns[i] / 16 : ns[i], quick ? ns[i] / 16 : ns[i], 32, 8, 64);
    int Bs[] = {1, 16, 64};
    int ctxs[] = {4096, 32768};
    size_t pb = (size_t)64 * Hk * D * hyla_dtype_size(O->kv_dtype);
    float *src = drand(pb / 4 + 1, 1.0f, 0, 0); /* random bytes for every page */
    for (size_t ci = 0; ci < 2; ci++)
        for (size_t bi = 0; bi < 3; bi++) {
            int B = Bs[bi], ctx = ctxs[ci];
            if (quick && (B > 16 || ctx > 4096)) continue;
            att_ud a = {1, B, Hq, Hk, D, ctx, NULL, NULL, NULL, NULL, NULL, NULL};
            a.q = drand((size_t)B * Hq * D, 1.0f, 0, 0);
            a.k = drand((size_t)B * Hk * D, 1.0f, 0, 0);
            a.v = drand((size_t)B * Hk * D, 1.0f, 0, 0);
            a.o = dalloc((size_t)B * Hq * D * 4);
            a.views = malloc(B * sizeof(hyla_kv_view));
            a.pos = malloc(B * sizeof(int32_t));
            for (int b = 0; b < B; b++) {
                a.views[b] = make_view(ctx + 1, Hk, D, src);
                a.pos[b] = ctx;
            }
            double ms = timeit(attd_run, &a);
            double bytes = (double)B * (ctx + 1) * Hk * D * 2 * hyla_dtype_size(O->kv_dtype);
            emit_head("attn_decode");
            printf(",\"B\":%d,\"ctx\":%d,\"Hq\":%d,\"Hk\":%d,\"D\":%d,\"ms\":%.4f,\"kv_gbps\":%.1f}\n", B, ctx, Hq, Hk, D,
                   ms, bytes / (ms * 1e-3) / 1e9);
            fflush(stdout);
            for (int b = 0; b < B; b++) free_view(&a.views[b]);
            free(a.views);
            free(a.pos);
            dfree(a.q);
            dfree(a.k);
            dfree(a.v);
            dfree(a.o);
        }
    dfree(src);
}

/* ---------------------------------------------------------------- row and elementwise ops */

/* The row and elementwise ops of a prefill piece of the 1.3B models (rows = tokens of the piece,
 * 1024; hidden 2304; 18 heads of 128; short convolutions over 3 x 2304 channels, kernel 4; MLP
 * 6144), each through the ops table, called as the runtime calls it (in place where it is).
 * bytes = what the op must read and write once (weights and tails included). Ops applied in
 * place over and over keep their values in range: silu's and short_conv's inputs are in
 * [20, 100], where silu(x) == x in fp32, and the convolution's taps are (0, ..., 0, 1) — values
 * decaying to denormals would time fp32 division's slow path instead. The tensors of one call
 * (10-40 MB) fit in the H100's 50 MB L2, so of_hbm may exceed 1. */
enum { EW_RMSNORM, EW_ADD_RMSNORM, EW_SHORT_CONV, EW_L2NORM, EW_GATED_RMSNORM, EW_SILU, EW_SWIGLU, EW_ADD,
       EW_SOFTMAX, EW_GLA_GATE, EW_GDN_GATES, EW_ROPE, EW_COPY, EW_N };
typedef struct {
    int op, n, D, H, hd, F, C, K;
    float *x, *xs, *y, *r, *w, *whd, *oh, *gh, *qh, *u, *o6, *ab, *bb, *alog, *dtb, *conv[3], *cw[3], *tails[3];
    int32_t *pos;
} ew_ud;
static void ew_run(void *u) {
    ew_ud *a = u;
    size_t nd = (size_t)a->n * a->D, nh = (size_t)a->n * a->H * a->hd;
    switch (a->op) {
    case EW_RMSNORM: TRY(O->rmsnorm(CX, a->x, a->w, a->y, a->n, a->D, 1e-6f)); break;
    case EW_ADD_RMSNORM: TRY(O->add_rmsnorm(CX, a->r, a->x, a->w, a->y, a->n, a->D, 1e-6f)); break;
    case EW_SHORT_CONV:
        for (int j = 0; j < 3; j++)
            TRY(O->short_conv(CX, a->conv[j], 1, a->n, a->C, a->cw[j], NULL, a->K, &a->tails[j], 1));
        break;
    case EW_L2NORM: TRY(O->l2norm_rows(CX, a->qh, a->n * a->H, a->hd, 1e-6f)); break;
    case EW_GATED_RMSNORM: TRY(O->gated_rmsnorm(CX, a->oh, a->gh, a->whd, a->oh, a->n * a->H, a->hd, 1e-6f)); break;
    case EW_SILU: TRY(O->silu(CX, a->xs, nd)); break;
    case EW_SWIGLU: TRY(O->swiglu(CX, a->u, a->u + (size_t)a->n * a->F, a->o6, (size_t)a->n * a->F)); break;
    case EW_ADD: TRY(O->add(CX, a->r, a->x, nd)); break;
    case EW_SOFTMAX: TRY(O->softmax_rows(CX, a->qh, a->n * a->H, a->hd)); break;
    case EW_GLA_GATE: TRY(O->gla_gate(CX, a->qh, nh, 16.0f, -INFINITY)); break;
    case EW_GDN_GATES:
        TRY(O->gdn_gates(CX, a->ab, a->H, a->bb, a->H, a->alog, a->dtb, a->ab, a->bb, a->n, a->H, 0));
        break;
    case EW_ROPE: TRY(O->rope(CX, a->qh, a->n, a->H, a->hd, a->pos, 10000.0f)); break;
    case EW_COPY: TRY(O->copy(CX, a->y, a->x, nd * sizeof(float))); break;
    }
}

static void bench_elementwise(int quick) {
    ew_ud a;
    memset(&a, 0, sizeof a);
    a.n = quick ? 64 : 1024;
    a.D = 2304, a.H = 18, a.hd = 128, a.F = 6144, a.C = 2304, a.K = 4;
    size_t nd = (size_t)a.n * a.D, nh = (size_t)a.n * a.H * a.hd, nf = (size_t)a.n * a.F;
    a.x = drand(nd, 1.0f, 0, 0);
    a.xs = drand(nd, 0, 20.0f, 100.0f);
    a.y = dalloc(nd * 4);
    a.r = drand(nd, 1.0f, 0, 0);
    a.w = drand(a.D, 1.0f, 0, 0);
    a.whd = drand(a.hd, 1.0f, 0, 0);
    a.oh = drand(nh, 1.0f, 0, 0);
    a.gh = drand(nh, 1.0f, 0, 0);
    a.qh = drand(nh, 1.0f, 0, 0);
    a.u = drand(2 * nf, 1.0f, 0, 0);
    a.o6 = dalloc(nf * 4);
    a.ab = drand((size_t)a.n * a.H, 1.0f, 0, 0);
    a.bb = drand((size_t)a.n * a.H, 1.0f, 0, 0);
    a.alog = drand(a.H, 0.5f, 0, 0);
    a.dtb = drand(a.H, 0.5f, 0, 0);
    float *taps = calloc((size_t)a.C * a.K, sizeof(float));
    for (int c = 0; c < a.C; c++) taps[(size_t)c * a.K + a.K - 1] = 1.0f;
    for (int j = 0; j < 3; j++) {
        a.conv[j] = drand((size_t)a.n * a.C, 0, 20.0f, 100.0f);
        a.cw[j] = dalloc((size_t)a.C * a.K * 4);
        TRY(O->upload(CX, a.cw[j], taps, (size_t)a.C * a.K * 4));
        a.tails[j] = drand((size_t)(a.K - 1) * a.C, 0, 20.0f, 100.0f);
    }
    free(taps);
    a.pos = malloc((size_t)a.n * sizeof(int32_t));
    for (int i = 0; i < a.n; i++) a.pos[i] = 4096 + i;
    double peak, hbm;
    datasheet(&peak, &hbm);
    for (int op = 0; op < EW_N; op++) {
        char shape[96];
        double bytes; /* floats read + written */
        const char *name = "";
        a.op = op;
        switch (op) {
        case EW_RMSNORM:
            name = "rmsnorm", bytes = 2.0 * nd + a.D;
            snprintf(shape, sizeof shape, "[%d][%d]", a.n, a.D);
            break;
        case EW_ADD_RMSNORM:
            name = "add_rmsnorm", bytes = 4.0 * nd + a.D;
            snprintf(shape, sizeof shape, "[%d][%d]", a.n, a.D);
            break;
        case EW_SHORT_CONV:
            name = "short_conv", bytes = 3.0 * (2.0 * a.n * a.C + (double)a.C * a.K + 2.0 * (a.K - 1) * a.C);
            snprintf(shape, sizeof shape, "3 x [%d][%d], K=%d, silu", a.n, a.C, a.K);
            break;
        case EW_L2NORM:
            name = "l2norm_rows", bytes = 2.0 * nh;
            snprintf(shape, sizeof shape, "[%d][%d]", a.n * a.H, a.hd);
            break;
        case EW_GATED_RMSNORM:
            name = "gated_rmsnorm", bytes = 3.0 * nh + a.hd;
            snprintf(shape, sizeof shape, "[%d][%d], y = o", a.n * a.H, a.hd);
            break;
        case EW_SILU:
            name = "silu", bytes = 2.0 * nd;
            snprintf(shape, sizeof shape, "[%d][%d]", a.n, a.D);
            break;
        case EW_SWIGLU:
            name = "swiglu", bytes = 3.0 * nf;
            snprintf(shape, sizeof shape, "[%d][%d]", a.n, a.F);
            break;
        case EW_ADD:
            name = "add", bytes = 3.0 * nd;
            snprintf(shape, sizeof shape, "[%d][%d]", a.n, a.D);
            break;
        case EW_SOFTMAX:
            name = "softmax_rows", bytes = 2.0 * nh;
            snprintf(shape, sizeof shape, "[%d][%d]", a.n * a.H, a.hd);
            break;
        case EW_GLA_GATE:
            name = "gla_gate", bytes = 2.0 * nh;
            snprintf(shape, sizeof shape, "[%d][%d]", a.n, a.H * a.hd);
            break;
        case EW_GDN_GATES:
            name = "gdn_gates", bytes = 4.0 * a.n * a.H + 2.0 * a.H;
            snprintf(shape, sizeof shape, "[%d][%d], in place", a.n, a.H);
            break;
        case EW_ROPE:
            name = "rope", bytes = 2.0 * nh + a.n;
            snprintf(shape, sizeof shape, "[%d][%d][%d]", a.n, a.H, a.hd);
            break;
        default:
            name = "copy", bytes = 2.0 * nd;
            snprintf(shape, sizeof shape, "[%d][%d]", a.n, a.D);
            break;
        }
        bytes *= 4;
        double ms = timeit(ew_run, &a), gbps = bytes / (ms * 1e-3) / 1e9;
        emit_head("elementwise");
        printf(",\"op\":\"%s\",\"shape\":\"%s\",\"mb\":%.2f,\"ms\":%.4f,\"gbps\":%.1f", name, shape, bytes / 1e6, ms,
               gbps);
        if (hbm > 0) printf(",\"hbm_tbps\":%.2f,\"of_hbm\":%.3f", hbm, gbps / (hbm * 1e3));
        printf("}\n");
        fflush(stdout);
    }
    float *bufs[] = {a.x, a.xs, a.y, a.r, a.w, a.whd, a.oh, a.gh, a.qh, a.u, a.o6, a.ab, a.bb, a.alog, a.dtb};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dfree(bufs[i]);
    for (int j = 0; j < 3; j++) {
        dfree(a.conv[j]);
        dfree(a.cw[j]);
        dfree(a.tails[j]);
    }
    free(a.pos);
}

/* ---------------------------------------------------------------- options */

/* ---------------------------------------------------------------- sparse attention (LTE, NSA) */

/* The attention layers of the 1.4B models of lte-hybrid-sparse-attention-token-eviction.txt
 * (Figure 4; appendix A): Hq 32, Hk 8, head dim 64; LTE s = 4, w = 768, b = 512 with the 3-layer
 * CNN (kernel 3, dilation 2, channels 128 -> 64 -> 32 -> 16); SWA window 1024; NSA Hq 32, Hk 2,
 * blocks of 64, 16 selected, window 512. Prefill: one sequence of N tokens from position 0.
 * Decode: B sessions, one token each at position ctx. Inputs random (N(0,1)). */
enum { SP_HQ = 32, SP_HK = 8, SP_D = 64, SP_NSA_HK = 2 };

/* Fill `bytes` of device memory at dst with random KV rows of the backend's KV dtype (one
 * random chunk, copied over and over). */
static void fill_kv(void *dst, size_t bytes) {
    size_t chunk = (size_t)1 << 22, n = chunk / hyla_dtype_size(O->kv_dtype);
    static void *src;
    if (!src) {
        float *h = malloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++) h[i] = hyla_rng_normal(&rng);
        if (O->kv_dtype != HYLA_DT_F32) { /* bf16: the upper half of each float, rounded to nearest */
            uint16_t *b = (uint16_t *)h;
            for (size_t i = 0; i < n; i++) {
                uint32_t u;
                memcpy(&u, &h[i], 4);
                b[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
            }
        }
        src = dalloc(chunk);
        TRY(O->upload(CX, src, h, chunk));
        free(h);
    }
    for (size_t off = 0; off < bytes; off += chunk)
        TRY(O->copy(CX, (char *)dst + off, src, bytes - off < chunk ? bytes - off : chunk));
}

/* Paged KV views of B sessions of `tokens` rows each, carved from two allocations (k, v); with
 * nsa_rows > 0 also a compressed-block cache of that many rows of [2][Hk][D] fp32 each. */
typedef struct {
    hyla_kv_view *v;
    void **ptrs;
    void *kbuf, *vbuf, *cbuf;
    int B;
} sp_views;
static sp_views sp_views_new(int B, int tokens, int Hk, int D, int nsa_rows, int fill) {
    sp_views s = {calloc((size_t)B, sizeof(hyla_kv_view)), NULL, NULL, NULL, NULL, B};
    int pt = 64, np = (tokens + pt - 1) / pt, cp = nsa_rows > 0 ? (nsa_rows + pt - 1) / pt : 0;
    size_t pb = (size_t)pt * Hk * D * hyla_dtype_size(O->kv_dtype), cb = (size_t)pt * 2 * Hk * D * sizeof(float);
    s.ptrs = malloc((size_t)B * (2 * np + cp + 1) * sizeof(void *));
    s.kbuf = dalloc((size_t)B * np * pb);
    s.vbuf = dalloc((size_t)B * np * pb);
    if (cp) s.cbuf = dalloc((size_t)B * cp * cb);
    if (fill) {
        fill_kv(s.kbuf, (size_t)B * np * pb);
        fill_kv(s.vbuf, (size_t)B * np * pb);
    }
    for (int b = 0; b < B; b++) {
        void **kp = s.ptrs + (size_t)b * (2 * np + cp), **vp = kp + np, **cpp = vp + np;
        for (int p = 0; p < np; p++) {
            kp[p] = (char *)s.kbuf + ((size_t)b * np + p) * pb;
            vp[p] = (char *)s.vbuf + ((size_t)b * np + p) * pb;
        }
        for (int p = 0; p < cp; p++) cpp[p] = (char *)s.cbuf + ((size_t)b * cp + p) * cb;
        s.v[b] = (hyla_kv_view){.k_pages = kp, .v_pages = vp, .n_pages = np, .page_tokens = pt,
                                .c_pages = cp ? cpp : NULL, .c_n_pages = cp, .c_valid = 0};
    }
    return s;
}
static void sp_views_free(sp_views *s) {
    dfree(s->kbuf);
    dfree(s->vbuf);
    if (s->cbuf) dfree(s->cbuf);
    free(s->ptrs);
    free(s->v);
}

/* An LTE layer's scoring CNN (random weights) and B caches. */
typedef struct {
    hyla_lte_params p;
    hyla_lte_cache *c;
    int B;
    size_t kv_bytes, r_bytes, rpos_bytes, meta_bytes;
} sp_lte;
static sp_lte sp_lte_new(int B) {
    sp_lte l = {{0}, calloc((size_t)B, sizeof(hyla_lte_cache)), B, 0, 0, 0, 0};
    hyla_lte_params *p = &l.p;
    p->Hk = SP_HK, p->D = SP_D, p->sink = 4, p->window = 768, p->budget = 512;
    p->n_conv = 3, p->kernel = 3, p->dilation = 2, p->rope_theta = 10000.0f;
    p->ch[0] = 2 * SP_D;
    for (int i = 1; i <= 3; i++) p->ch[i] = p->ch[i - 1] / 2;
    for (int i = 0; i < 3; i++) {
        float sc = 1.0f / sqrtf((float)(p->ch[i] * p->kernel));
        p->conv_w[i] = drand((size_t)SP_HK * p->ch[i + 1] * p->ch[i] * p->kernel, sc, 0, 0);
        p->conv_b[i] = drand((size_t)SP_HK * p->ch[i + 1], 0.1f, 0, 0);
    }
    p->proj_w = drand((size_t)SP_HK * p->ch[3], 1.0f / sqrtf((float)p->ch[3]), 0, 0);
    p->proj_b = drand(SP_HK, 0.1f, 0, 0);
    size_t rows = (size_t)p->sink + p->window + p->budget;
    l.kv_bytes = (size_t)SP_HK * rows * SP_D * hyla_dtype_size(O->kv_dtype);
    l.r_bytes = (size_t)SP_HK * rows * 4;
    l.rpos_bytes = (size_t)SP_HK * p->budget * 4;
    l.meta_bytes = (size_t)(2 + SP_HK) * 4;
    size_t zb = l.kv_bytes > l.r_bytes ? l.kv_bytes : l.r_bytes;
    void *z = calloc(1, zb);
    for (int b = 0; b < B; b++) {
        hyla_lte_cache *c = &l.c[b];
        c->k = dalloc(l.kv_bytes), c->v = dalloc(l.kv_bytes);
        c->r = dalloc(l.r_bytes), c->rpos = dalloc(l.rpos_bytes), c->meta = dalloc(l.meta_bytes);
        TRY(O->upload(CX, c->k, z, l.kv_bytes));
        TRY(O->upload(CX, c->v, z, l.kv_bytes));
        TRY(O->upload(CX, c->r, z, l.r_bytes));
        TRY(O->upload(CX, c->rpos, z, l.rpos_bytes));
        TRY(O->upload(CX, c->meta, z, l.meta_bytes));
    }
    free(z);
    return l;
}
/* Copy cache 0 into the others. */
static void sp_lte_clone(sp_lte *l) {
    for (int b = 1; b < l->B; b++) {
        TRY(O->copy(CX, l->c[b].k, l->c[0].k, l->kv_bytes));
        TRY(O->copy(CX, l->c[b].v, l->c[0].v, l->kv_bytes));
        TRY(O->copy(CX, l->c[b].r, l->c[0].r, l->r_bytes));
        TRY(O->copy(CX, l->c[b].rpos, l->c[0].rpos, l->rpos_bytes));
        TRY(O->copy(CX, l->c[b].meta, l->c[0].meta, l->meta_bytes));
    }
}
static void sp_lte_free(sp_lte *l) {
    for (int i = 0; i < 3; i++) dfree((void *)l->p.conv_w[i]), dfree((void *)l->p.conv_b[i]);
    dfree((void *)l->p.proj_w);
    dfree((void *)l->p.proj_b);
    for (int b = 0; b < l->B; b++) {
        dfree(l->c[b].k), dfree(l->c[b].v), dfree(l->c[b].r), dfree(l->c[b].rpos), dfree(l->c[b].meta);
    }
    free(l->c);
}

typedef struct {
    int kind; /* 0 full attention, 1 SWA, 2 LTE, 3 NSA */
    int n, B, Hq, Hk, D, window;
    float *q, *k, *v, *g, *o;
    sp_views *kv;
    sp_lte *lte;
    int32_t *pos;
    int advance; /* LTE decode: each call one position further (the cache's lazy scoring runs as
                  * in a real decode) */
} sp_ud;
static void sp_prefill_run(void *u) {
    sp_ud *a = u;
    float scale = 1.0f / sqrtf((float)a->D);
    if (a->kind <= 1)
        TRY(O->attn_prefill(CX, a->q, a->k, a->v, a->n, a->Hq, a->Hk, a->D, 0, &a->kv->v[0], a->window, scale, a->o));
    else if (a->kind == 2) {
        TRY(O->upload(CX, a->lte->c[0].meta, (int32_t[2 + SP_HK]){0}, a->lte->meta_bytes)); /* an empty cache */
        TRY(O->lte_prefill(CX, &a->lte->p, a->q, a->k, a->v, a->n, a->Hq, 0, &a->lte->c[0], scale, a->o));
    } else {
        a->kv->v[0].c_valid = 0; /* a fresh prompt: every block is compressed */
        TRY(O->nsa_prefill(CX, a->q, a->k, a->v, a->g, a->n, a->Hq, a->Hk, a->D, 0, &a->kv->v[0], 64, 16, a->window,
                           scale, a->o));
    }
}
static void sp_decode_run(void *u) {
    sp_ud *a = u;
    float scale = 1.0f / sqrtf((float)a->D);
    if (a->kind <= 1)
        TRY(O->attn_decode(CX, a->q, a->k, a->v, a->B, a->Hq, a->Hk, a->D, a->pos, a->kv->v, a->window, scale, a->o));
    else if (a->kind == 2) {
        TRY(O->lte_decode(CX, &a->lte->p, a->q, a->k, a->v, a->B, a->Hq, a->pos, a->lte->c, scale, a->o));
        if (a->advance)
            for (int b = 0; b < a->B; b++) a->pos[b]++;
    } else
        TRY(O->nsa_decode(CX, a->q, a->k, a->v, a->g, a->B, a->Hq, a->Hk, a->D, a->pos, a->kv->v, 64, 16, a->window,
                          scale, a->o));
}

/* ms of one call: timeit for short calls; a call of more than 1 s is timed once (its kernels
 * were loaded by the smaller sizes before it), one of 0.25-1 s once after a warm-up. */
static double sp_time(bench_fn fn, void *ud) {
    double t0 = hyla_now();
    fn(ud);
    TRY(O->sync(CX));
    double one = hyla_now() - t0;
    if (one > 1.0) return one * 1e3;
    t0 = hyla_now();
    fn(ud);
    TRY(O->sync(CX));
    one = hyla_now() - t0;
    return one > 0.25 ? one * 1e3 : timeit(fn, ud);
}

static const char *const sp_names[] = {"full", "swa", "lte", "nsa"};

static void sp_alloc_io(sp_ud *a, int rows, int Hq, int Hk, int D) {
    a->q = drand((size_t)rows * Hq * D, 1.0f, 0, 0);
    a->k = drand((size_t)rows * Hk * D, 1.0f, 0, 0);
    a->v = drand((size_t)rows * Hk * D, 1.0f, 0, 0);
    a->g = drand((size_t)rows * Hq * 3, 1.0f, 0, 0);
    a->o = dalloc((size_t)rows * Hq * D * 4);
}
static void sp_free_io(sp_ud *a) {
    dfree(a->q), dfree(a->k), dfree(a->v), dfree(a->g), dfree(a->o);
}

static int sp_ctx[8] = {4096, 32768, 131072}, sp_nctx = 3; /* --ctx */

static void bench_sparse(int quick, int nsa_only) {
    int *ctxs = sp_ctx, nctx = sp_nctx, B = 32, small[2] = {256, 1024};
    if (quick) ctxs = small, nctx = 2, B = 4;
    /* decode: B sessions at position ctx. LTE: the caches a prefill of min(ctx, 4096) tokens left
     * (cloned to every session), decoded from position ctx on (the cache has a fixed size, so a
     * step's work does not depend on the position once window and segment are full; the CPU
     * backend checks the position against the cache, so it decodes right after the prefill). */
    int fill = quick ? ctxs[0] : 4096;
    sp_lte lte = sp_lte_new(B);
    if (!nsa_only) {
        sp_ud a = {2, fill, 1, SP_HQ, SP_HK, SP_D, 0, NULL, NULL, NULL, NULL, NULL, NULL, &lte, NULL, 0};
        sp_alloc_io(&a, fill, SP_HQ, SP_HK, SP_D);
        sp_prefill_run(&a);
        TRY(O->sync(CX));
        sp_free_io(&a);
        sp_lte_clone(&lte);
    }
    for (int ci = 0; ci < nctx; ci++) {
        int ctx = ctxs[ci];
        for (int kind = nsa_only ? 3 : 0; kind < 5; kind++) {
            int k = kind < 4 ? kind : 3, nsa = k == 3, Hk = nsa ? SP_NSA_HK : SP_HK;
            int window = k == 1 ? 1024 : nsa ? (kind == 3 ? 512 : 0) : 0;
            if (k == 2 && strcmp(O->name, "cuda") && ctx != fill) continue;
            sp_ud a = {k, 1, B, SP_HQ, Hk, SP_D, window, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, k == 2};
            sp_alloc_io(&a, B, SP_HQ, Hk, SP_D);
            a.pos = malloc((size_t)B * sizeof(int32_t));
            for (int b = 0; b < B; b++) a.pos[b] = k == 2 ? (ctx > fill ? ctx : fill) : ctx;
            sp_views kv = {0};
            if (k == 2) a.lte = &lte;
            else kv = sp_views_new(B, ctx + 1, Hk, SP_D, nsa ? (ctx + 1) / 64 : 0, 1), a.kv = &kv;
            if (nsa) { /* the first call compresses every block; later steps find them cached */
                sp_decode_run(&a);
                for (int b = 0; b < B; b++) kv.v[b].c_valid = (ctx + 1) / 64;
            }
            double ms = sp_time(sp_decode_run, &a);
            emit_head("sparse_decode");
            printf(",\"mixer\":\"%s\",\"B\":%d,\"ctx\":%d,\"Hq\":%d,\"Hk\":%d,\"D\":%d,\"window\":%d,\"ms\":%.4f}\n",
                   sp_names[k], B, ctx, SP_HQ, Hk, SP_D, k == 2 ? 768 : window, ms);
            fflush(stdout);
            if (k != 2) sp_views_free(&kv);
            free(a.pos);
            sp_free_io(&a);
        }
    }
    /* prefill: full, SWA, LTE, NSA (window 512 and 0) */
    double lte_ms_per_tok = 0, nsa_ms = 0;
    int nsa_n = 0;
    for (int ci = 0; ci < nctx; ci++) {
        int n = ctxs[ci];
        for (int kind = nsa_only ? 3 : 0; kind < 5; kind++) {
            int k = kind < 4 ? kind : 3, nsa = k == 3, Hk = nsa ? SP_NSA_HK : SP_HK;
            int window = k == 1 ? 1024 : nsa ? (kind == 3 ? 512 : 0) : 0;
            if (k == 2 && lte_ms_per_tok * n > 20e3) { /* skip what would take > 20 s at the last size's rate */
                emit_head("sparse_prefill");
                printf(",\"mixer\":\"lte\",\"tokens\":%d,\"skipped\":\"over 20 s at %.3f ms/token\"}\n", n, lte_ms_per_tok);
                continue;
            }
            double nsa_est = nsa_n ? nsa_ms * ((double)n / nsa_n) * ((double)n / nsa_n) : 0;
            if (k == 3 && nsa_est > 20e3) { /* the compressed branch grows with the position: skip > 20 s */
                emit_head("sparse_prefill");
                printf(",\"mixer\":\"nsa\",\"tokens\":%d,\"window\":%d,\"skipped\":\"estimated %.0f s\"}\n", n, window,
                       nsa_est / 1e3);
                continue;
            }
            sp_ud a = {k, n, 1, SP_HQ, Hk, SP_D, window, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0};
            sp_alloc_io(&a, n, SP_HQ, Hk, SP_D);
            sp_views kv = {0};
            sp_lte pl = {0};
            if (k == 2) pl = sp_lte_new(1), a.lte = &pl;
            else kv = sp_views_new(1, n, Hk, SP_D, nsa ? n / 64 : 0, 0), a.kv = &kv;
            double ms = sp_time(sp_prefill_run, &a);
            if (k == 2) lte_ms_per_tok = ms / n;
            if (kind == 3) nsa_ms = ms, nsa_n = n;
            emit_head("sparse_prefill");
            printf(",\"mixer\":\"%s\",\"tokens\":%d,\"Hq\":%d,\"Hk\":%d,\"D\":%d,\"window\":%d,\"ms\":%.3f,"
                   "\"tokens_per_s\":%.0f}\n",
                   sp_names[k], n, SP_HQ, Hk, SP_D, k == 2 ? 768 : window, ms, n / (ms * 1e-3));
            fflush(stdout);
            if (k == 2) sp_lte_free(&pl);
            else sp_views_free(&kv);
            sp_free_io(&a);
        }
    }
    if (!nsa_only) {
        emit_head("sparse_lte_cache");
        printf(",\"bytes_per_session_layer\":%zu}\n", 2 * lte.kv_bytes + lte.r_bytes + lte.rpos_bytes + lte.meta_bytes);
    }
    sp_lte_free(&lte);
}

/* ---------------------------------------------------------------- Mamba2, StateX, DLA */

/* The benchmark shapes of Mamba2, StateX and DLA (BENCHMARKS.md): Mamba2-1.3B's SSD (d_model
 * 2048, expand 2: 64 heads of 64, state 128, one group); StateX's expansions (Mamba2 state 512; GLA with its 4 heads merged:
 * H 1, dk 1024, dv 2048, against the unmerged H 4, dk 256, dv 512 of a 2048-wide GLA); DLA with
 * K = 30 states over the Mamba2 layer above and over a gated DeltaNet layer of 16 heads with
 * dk 128, dv 256. Decode rates are compared with copy_gbps, the device-to-device copy rate
 * measured in the same process (bench_copy: 1 GiB, beyond the 50 MB L2; bytes read + written).
 * A shape the backend refuses (HYLA_ERR_UNSUPPORTED and the like) gives a row with "error"
 * instead of a time, and the bench goes on. */
enum { M2_H = 64, M2_P = 64, M2_G = 1, M2_N = 128, DLA_K = 30, DG_H = 16, DG_DK = 128, DG_DV = 256 };

static double copy_gbps; /* bench_copy's rate; 0 before it ran */

/* A row {"bench": bench, "shape": shape, "error": the backend's message} for a refused call. */
static void emit_error(const char *bench, const char *shape) {
    char msg[300];
    snprintf(msg, sizeof msg, "%s", hyla_last_error());
    for (char *p = msg; *p; p++)
        if (*p == '"' || *p == '\\' || (unsigned char)*p < 32) *p = '\'';
    emit_head(bench);
    printf(",\"shape\":\"%s\",\"error\":\"%s\"}\n", shape, msg);
    fflush(stdout);
}

/* n floats like drand's, drawn for at most 4M elements and repeated by device copies (large
 * inputs would otherwise spend seconds in the host's generator). */
static float *drand_rep(size_t n, float scale, float lo, float hi) {
    size_t piece = (size_t)1 << 22;
    if (n <= piece) return drand(n, scale, lo, hi);
    float *src = drand(piece, scale, lo, hi), *d = dalloc(n * sizeof(float));
    for (size_t off = 0; off < n; off += piece)
        TRY(O->copy(CX, d + off, src, (n - off < piece ? n - off : piece) * sizeof(float)));
    dfree(src);
    return d;
}

typedef struct {
    void *dst, *src;
    size_t bytes;
} copy_ud;
static void copy_run(void *u) {
    copy_ud *a = u;
    TRY(O->copy(CX, a->dst, a->src, a->bytes));
}

static void bench_copy(int quick) {
    size_t bytes = (size_t)(quick ? 64 : 1024) << 20;
    copy_ud a = {dalloc(bytes), dalloc(bytes), bytes};
    double ms = timeit(copy_run, &a), peak, hbm;
    copy_gbps = 2.0 * (double)bytes / (ms * 1e-3) / 1e9;
    datasheet(&peak, &hbm);
    emit_head("copy_bandwidth");
    printf(",\"mb\":%.0f,\"ms\":%.4f,\"gbps\":%.1f", bytes / 1e6, ms, copy_gbps);
    if (hbm > 0) printf(",\"hbm_tbps\":%.2f,\"of_hbm\":%.3f", hbm, copy_gbps / (hbm * 1e3));
    printf("}\n");
    fflush(stdout);
    dfree(a.dst);
    dfree(a.src);
}

/* GB/s of a decode row and its share of the copy rate */
static void print_rate(double bytes, double ms) {
    double gbps = bytes / (ms * 1e-3) / 1e9;
    printf(",\"gbps\":%.1f", gbps);
    if (copy_gbps > 0) printf(",\"copy_gbps\":%.1f,\"of_copy\":%.3f", copy_gbps, gbps / copy_gbps);
}

/* B sessions' states of ss floats each, one random state copied to all (ptrs: host [B]) */
static float *states_new(int B, size_t ss, float ***ptrs) {
    float *one = drand_rep(ss, 0.1f, 0, 0), *all = dalloc((size_t)B * ss * sizeof(float));
    *ptrs = malloc((size_t)B * sizeof(float *));
    for (int b = 0; b < B; b++) {
        TRY(O->copy(CX, all + (size_t)b * ss, one, ss * sizeof(float)));
        (*ptrs)[b] = all + (size_t)b * ss;
    }
    dfree(one);
    return all;
}

/* ---- SSD (Mamba2's mixer core) */

typedef struct {
    int n, H, P, G, N, ldx;
    float *xbc, *dt, *dt_bias, *A_log, *D, *S, *y;
    float **Sp; /* decode: host [n] */
} ssd_ud;
static hyla_status ssd_call(ssd_ud *a, int decode) {
    if (decode)
        return O->ssd_decode(CX, a->xbc, a->ldx, a->dt, a->H, a->dt_bias, a->A_log, a->D, 0.0f, INFINITY, a->n, a->H,
                             a->P, a->G, a->N, a->Sp, a->y);
    return O->ssd_prefill(CX, a->xbc, a->ldx, a->dt, a->H, a->dt_bias, a->A_log, a->D, 0.0f, INFINITY, a->n, a->H, a->P,
                          a->G, a->N, a->S, a->y);
}
static void ssd_pf_run(void *u) { TRY(ssd_call(u, 0)); }
static void ssd_dec_run(void *u) { TRY(ssd_call(u, 1)); }

/* rows x [H][P], B [G][N], C [G][N]; dt raw in [-4, -1] (softplus ~ 0.02-0.3), dt_bias 0,
 * A_log in [0, 2.7] (A in [-15, -1]), D 1 */
static ssd_ud ssd_new(int rows, int N) {
    ssd_ud a = {rows, M2_H, M2_P, M2_G, N, M2_H * M2_P + 2 * M2_G * N, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    a.xbc = drand_rep((size_t)rows * a.ldx, 0, -1.0f, 1.0f);
    a.dt = drand_rep((size_t)rows * a.H, 0, -4.0f, -1.0f);
    a.dt_bias = drand(a.H, 0, 0, 0);
    a.A_log = drand(a.H, 0, 0.0f, 2.7f);
    a.D = drand(a.H, 0, 1.0f, 1.0f + 1e-6f);
    a.y = dalloc((size_t)rows * a.H * a.P * sizeof(float));
    return a;
}
static void ssd_free(ssd_ud *a) {
    float *bufs[] = {a->xbc, a->dt, a->dt_bias, a->A_log, a->D, a->y};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dfree(bufs[i]);
}

/* SSD prefill of one sequence per length in ns (row "ssd_prefill"), then decode at each batch
 * (row "ssd_decode"); bench names carry the state size. */
static void bench_ssd(int N, const int *ns, int nn, const int *Bs, int nb) {
    char shape[96];
    for (int i = 0; i < nn; i++) {
        int n = ns[i];
        ssd_ud a = ssd_new(n, N);
        a.S = drand_rep((size_t)a.H * N * a.P, 0.1f, 0, 0);
        snprintf(shape, sizeof shape, "n=%d H=%d P=%d G=%d N=%d", n, a.H, a.P, a.G, N);
        if (ssd_call(&a, 0) != HYLA_OK) emit_error("ssd_prefill", shape);
        else {
            double ms = sp_time(ssd_pf_run, &a);
            /* the chunked form's products, as GLA's with dk = N, dv = P (64-token chunks) */
            double fl = chunk_flops(0, 64, N, a.P) * (n / 64.0) * a.H;
            emit_head("ssd_prefill");
            printf(",\"shape\":\"%s\",\"tokens\":%d,\"H\":%d,\"P\":%d,\"G\":%d,\"N\":%d,\"ms\":%.4f,"
                   "\"tokens_per_s\":%.0f,\"tflops_chunked\":%.2f}\n",
                   shape, n, a.H, a.P, a.G, N, ms, n / (ms * 1e-3), fl / (ms * 1e-3) / 1e12);
            fflush(stdout);
        }
        dfree(a.S);
        ssd_free(&a);
    }
    for (int i = 0; i < nb; i++) {
        int B = Bs[i];
        ssd_ud a = ssd_new(B, N);
        size_t ss = (size_t)a.H * N * a.P;
        float *all = states_new(B, ss, &a.Sp);
        snprintf(shape, sizeof shape, "B=%d H=%d P=%d G=%d N=%d", B, a.H, a.P, a.G, N);
        if (ssd_call(&a, 1) != HYLA_OK) emit_error("ssd_decode", shape);
        else {
            double ms = timeit(ssd_dec_run, &a);
            double bytes = (double)B * (2.0 * ss + a.ldx + a.H + (double)a.H * a.P) * 4;
            emit_head("ssd_decode");
            printf(",\"shape\":\"%s\",\"B\":%d,\"H\":%d,\"P\":%d,\"G\":%d,\"N\":%d,\"ms\":%.4f,\"state_mb\":%.1f", shape,
                   B, a.H, a.P, a.G, N, ms, B * ss * 4.0 / 1e6);
            print_rate(bytes, ms);
            printf("}\n");
            fflush(stdout);
        }
        dfree(all);
        free(a.Sp);
        ssd_free(&a);
    }
}

static void bench_mamba2(int quick) {
    int ns[] = {4096, 16384}, Bs[] = {1, 16, 64, 256}, qns[] = {256}, qBs[] = {1, 4};
    if (!copy_gbps) bench_copy(quick);
    if (quick) bench_ssd(M2_N, qns, 1, qBs, 2);
    else bench_ssd(M2_N, ns, 2, Bs, 4);
}

/* ---- GLA at StateX's merged shape */

typedef struct {
    int n, H, dk, dv;
    float *q, *k, *v, *g, *o, *S;
    float **Sp;
} glx_ud;
static hyla_status glx_call(glx_ud *a, int decode) {
    float scale = 1.0f / sqrtf((float)a->dk);
    if (decode) return O->gla_decode(CX, a->q, a->k, a->v, a->g, a->n, a->H, a->dk, a->dv, scale, a->Sp, a->o);
    return O->gla_prefill(CX, a->q, a->k, a->v, a->g, a->n, a->H, a->dk, a->dv, scale, a->S, a->o);
}
static void glx_pf_run(void *u) { TRY(glx_call(u, 0)); }
static void glx_dec_run(void *u) { TRY(glx_call(u, 1)); }
static glx_ud glx_new(int rows, int H, int dk, int dv) {
    glx_ud a = {rows, H, dk, dv, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    size_t nk = (size_t)rows * H * dk;
    a.q = drand_rep(nk, 0, -0.1f, 0.1f);
    a.k = drand_rep(nk, 0, -0.1f, 0.1f);
    a.v = drand_rep((size_t)rows * H * dv, 0, -1.0f, 1.0f);
    a.g = drand_rep(nk, 0, -0.2f, -0.001f);
    a.o = dalloc((size_t)rows * H * dv * sizeof(float));
    return a;
}
static void glx_free(glx_ud *a) {
    float *bufs[] = {a->q, a->k, a->v, a->g, a->o};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dfree(bufs[i]);
}

static void bench_gla_shape(int H, int dk, int dv, const int *ns, int nn, const int *Bs, int nb) {
    char shape[96];
    for (int i = 0; i < nn; i++) {
        glx_ud a = glx_new(ns[i], H, dk, dv);
        a.S = drand_rep((size_t)H * dk * dv, 0.1f, 0, 0);
        snprintf(shape, sizeof shape, "n=%d H=%d dk=%d dv=%d", ns[i], H, dk, dv);
        if (glx_call(&a, 0) != HYLA_OK) emit_error("gla_prefill", shape);
        else {
            double ms = sp_time(glx_pf_run, &a), fl = chunk_flops(0, 64, dk, dv) * (ns[i] / 64.0) * H;
            emit_head("gla_prefill");
            printf(",\"shape\":\"%s\",\"tokens\":%d,\"H\":%d,\"dk\":%d,\"dv\":%d,\"ms\":%.4f,\"tokens_per_s\":%.0f,"
                   "\"tflops_chunked\":%.2f}\n",
                   shape, ns[i], H, dk, dv, ms, ns[i] / (ms * 1e-3), fl / (ms * 1e-3) / 1e12);
            fflush(stdout);
        }
        dfree(a.S);
        glx_free(&a);
    }
    for (int i = 0; i < nb; i++) {
        int B = Bs[i];
        glx_ud a = glx_new(B, H, dk, dv);
        size_t ss = (size_t)H * dk * dv;
        float *all = states_new(B, ss, &a.Sp);
        snprintf(shape, sizeof shape, "B=%d H=%d dk=%d dv=%d", B, H, dk, dv);
        if (glx_call(&a, 1) != HYLA_OK) emit_error("gla_decode", shape);
        else {
            double ms = timeit(glx_dec_run, &a);
            double bytes = (double)B * (2.0 * ss + (double)H * (3.0 * dk + 2.0 * dv)) * 4;
            emit_head("gla_decode");
            printf(",\"shape\":\"%s\",\"B\":%d,\"H\":%d,\"dk\":%d,\"dv\":%d,\"ms\":%.4f,\"state_mb\":%.1f", shape, B, H,
                   dk, dv, ms, B * ss * 4.0 / 1e6);
            print_rate(bytes, ms);
            printf("}\n");
            fflush(stdout);
        }
        dfree(all);
        free(a.Sp);
        glx_free(&a);
    }
}

static void bench_statex(int quick) {
    int ns[] = {4096, 16384}, Bs[] = {1, 16, 64, 256}, qns[] = {256}, qBs[] = {1, 4};
    const int *pn = quick ? qns : ns, *pb = quick ? qBs : Bs, nn = quick ? 1 : 2, nb = quick ? 2 : 4;
    if (!copy_gbps) bench_copy(quick);
    bench_ssd(512, pn, nn, pb, nb);               /* StateX's Mamba2 layer: state 512 */
    bench_gla_shape(4, 256, 512, pn, nn, pb, nb); /* a 2048-wide GLA layer, 4 heads */
    bench_gla_shape(1, 1024, 2048, pn, nn, pb, nb); /* the same, heads merged (StateX) */
}

/* ---- DLA */

typedef struct {
    hyla_dla_params p;
    int n, mamba; /* tokens per session (prefill) or sessions (decode); base Mamba2 (no erase) */
    float *q, *k, *v, *g, *w, *lam, *o;
    hyla_dla_cache *c; /* host [sessions] */
    float *cS, *cI;
    int32_t *cn, *cm;
    int B;
} dla_ud;
static hyla_status dla_call(dla_ud *a, int decode) {
    float scale = a->mamba ? 1.0f : 1.0f / sqrtf((float)a->p.dk);
    const float *erase = a->mamba ? NULL : a->w;
    if (decode) return O->dla_decode(CX, &a->p, a->q, a->k, a->v, a->g, erase, a->w, a->lam, a->n, scale, a->c, a->o);
    return O->dla_prefill(CX, &a->p, a->q, a->k, a->v, a->g, erase, a->w, a->lam, a->n, scale, a->c, a->o);
}
static void dla_dec_run(void *u) { TRY(dla_call(u, 1)); }

/* inputs of `rows` tokens: q, k ~ U(-1, 1)/sqrt(dk) (GDN: keys of norm ~0.6), v ~ U(-1, 1),
 * g in [-0.01, -0.0001] (decays that keep states in range over thousands of timed calls),
 * write (beta / dt) in [0.05, 0.5], lam logits ~ U(-1, 1) */
static dla_ud dla_new(int mamba, int rows, float tau) {
    dla_ud a;
    memset(&a, 0, sizeof a);
    a.mamba = mamba;
    a.p = mamba ? (hyla_dla_params){M2_H, M2_N, M2_P, DLA_K, tau} : (hyla_dla_params){DG_H, DG_DK, DG_DV, DLA_K, tau};
    a.n = rows;
    size_t nk = (size_t)rows * a.p.H * a.p.dk, nh = (size_t)rows * a.p.H;
    float s = 1.0f / sqrtf((float)a.p.dk);
    a.q = drand_rep(nk, 0, -s, s);
    a.k = drand_rep(nk, 0, -s, s);
    a.v = drand_rep((size_t)rows * a.p.H * a.p.dv, 0, -1.0f, 1.0f);
    a.g = drand_rep(nh, 0, -0.01f, -0.0001f);
    a.w = drand_rep(nh, 0, 0.05f, 0.5f);
    a.lam = drand_rep(nh * DLA_K, 0, -1.0f, 1.0f);
    a.o = dalloc((size_t)rows * a.p.H * a.p.dv * sizeof(float));
    return a;
}
/* B caches (zero-filled), then dla_reset */
static void dla_reset(dla_ud *a, int m);
static void dla_caches(dla_ud *a, int B, int m) {
    const int H = a->p.H, K = a->p.K;
    size_t ss = (size_t)H * K * a->p.dk * a->p.dv;
    a->B = B;
    a->cS = dalloc((size_t)B * ss * sizeof(float));
    a->cn = dalloc((size_t)B * H * K * sizeof(int32_t));
    a->cI = dalloc((size_t)B * H * K * sizeof(float));
    a->cm = dalloc((size_t)B * H * sizeof(int32_t));
    a->c = calloc((size_t)B, sizeof(hyla_dla_cache));
    for (int b = 0; b < B; b++) {
        hyla_dla_cache *c = &a->c[b];
        c->S = a->cS + (size_t)b * ss;
        c->n = a->cn + (size_t)b * H * K;
        c->I = a->cI + (size_t)b * H * K;
        c->m = a->cm + (size_t)b * H;
    }
    dla_reset(a, m);
}
/* every cache holds m states per head (random, 16 tokens and a summed score of 4 each); the
 * slots past m are zero, as the cache's invariant wants */
static void dla_reset(dla_ud *a, int m) {
    const int H = a->p.H, K = a->p.K;
    size_t sz = (size_t)a->p.dk * a->p.dv, ss = (size_t)H * K * sz;
    float *one = m > 0 ? drand_rep((size_t)m * sz, 0.01f, 0, 0) : NULL, *hI = malloc((size_t)H * K * sizeof(float));
    int32_t *hn = malloc((size_t)H * K * sizeof(int32_t)), *hm = malloc((size_t)H * sizeof(int32_t));
    for (int h = 0; h < H; h++) {
        hm[h] = m;
        for (int i = 0; i < K; i++) hn[h * K + i] = i < m ? 16 : 0, hI[h * K + i] = i < m ? 4.0f : 0.0f;
    }
    for (int b = 0; b < a->B; b++) {
        hyla_dla_cache *c = &a->c[b];
        TRY(O->zero(CX, c->S, ss * sizeof(float)));
        for (int h = 0; h < H && m > 0; h++) TRY(O->copy(CX, c->S + (size_t)h * K * sz, one, (size_t)m * sz * sizeof(float)));
        TRY(O->upload(CX, c->n, hn, (size_t)H * K * sizeof(int32_t)));
        TRY(O->upload(CX, c->I, hI, (size_t)H * K * sizeof(float)));
        TRY(O->upload(CX, c->m, hm, (size_t)H * sizeof(int32_t)));
    }
    if (one) dfree(one);
    free(hI);
    free(hn);
    free(hm);
}
/* copy cache 0 into caches 1..B-1 */
static void dla_clone(dla_ud *a) {
    const int H = a->p.H, K = a->p.K;
    size_t ss = (size_t)H * K * a->p.dk * a->p.dv;
    for (int b = 1; b < a->B; b++) {
        TRY(O->copy(CX, a->c[b].S, a->c[0].S, ss * sizeof(float)));
        TRY(O->copy(CX, a->c[b].n, a->c[0].n, (size_t)H * K * sizeof(int32_t)));
        TRY(O->copy(CX, a->c[b].I, a->c[0].I, (size_t)H * K * sizeof(float)));
        TRY(O->copy(CX, a->c[b].m, a->c[0].m, (size_t)H * sizeof(int32_t)));
    }
}
static void dla_free(dla_ud *a) {
    float *bufs[] = {a->q, a->k, a->v, a->g, a->w, a->lam, a->o};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dfree(bufs[i]);
    if (a->c) {
        dfree(a->cS), dfree(a->cn), dfree(a->cI), dfree(a->cm);
        free(a->c);
    }
}
/* mean states in use over the heads of cache 0 */
static double dla_mean_m(dla_ud *a) {
    int32_t *hm = malloc((size_t)a->p.H * sizeof(int32_t));
    TRY(O->download(CX, hm, a->c[0].m, (size_t)a->p.H * sizeof(int32_t)));
    double s = 0;
    for (int h = 0; h < a->p.H; h++) s += hm[h];
    free(hm);
    return s / a->p.H;
}

static const char *dla_base_name(int mamba) { return mamba ? "mamba2" : "gdn"; }

/* One decode step of B sessions whose caches hold m states per head; tau decides what each
 * step does (a huge tau: the token merges into the newest state; 0: it opens a state, and a
 * full cache first merges its lowest-density pair). Bytes: the states in use read and written. */
static void dla_decode_row(int mamba, int B, int m, float tau, const char *what) {
    char shape[128];
    dla_ud a = dla_new(mamba, B, tau);
    dla_caches(&a, B, m);
    snprintf(shape, sizeof shape, "%s B=%d H=%d dk=%d dv=%d K=%d m=%d", dla_base_name(mamba), B, a.p.H, a.p.dk, a.p.dv,
             a.p.K, m);
    if (dla_call(&a, 1) != HYLA_OK) emit_error("dla_decode", shape);
    else {
        double ms = timeit(dla_dec_run, &a);
        double ss = (double)a.p.H * a.p.dk * a.p.dv * 4;
        emit_head("dla_decode");
        printf(",\"shape\":\"%s\",\"base\":\"%s\",\"B\":%d,\"H\":%d,\"dk\":%d,\"dv\":%d,\"K\":%d,\"m\":%d,\"step\":\"%s\","
               "\"m_after\":%.1f,\"ms\":%.4f,\"tokens_per_s\":%.0f",
               shape, dla_base_name(mamba), B, a.p.H, a.p.dk, a.p.dv, a.p.K, m, what, dla_mean_m(&a), ms,
               B / (ms * 1e-3));
        print_rate((double)B * 2.0 * ss * (m > 0 ? m : 1), ms);
        printf("}\n");
        fflush(stdout);
    }
    dla_free(&a);
}

/* the plain base's decode step at the same shape (GDN: gdn_decode; Mamba2: ssd_decode) */
typedef struct {
    int B;
    dla_ud *d;
    float **Sp;
} base_ud;
static void base_dec_run(void *u) {
    base_ud *a = u;
    dla_ud *d = a->d;
    TRY(O->gdn_decode(CX, d->q, d->k, d->v, d->g, d->w, a->B, d->p.H, d->p.dk, d->p.dv, 1.0f / sqrtf((float)d->p.dk),
                      a->Sp, d->o));
}
static void base_decode_row(int mamba, int B) {
    char shape[96];
    if (mamba) { /* the SSD row of bench_ssd at this batch */
        int Bs[] = {B};
        bench_ssd(M2_N, NULL, 0, Bs, 1);
        return;
    }
    dla_ud d = dla_new(0, B, 1.0f);
    base_ud a = {B, &d, NULL};
    size_t ss = (size_t)DG_H * DG_DK * DG_DV;
    float *all = states_new(B, ss, &a.Sp);
    snprintf(shape, sizeof shape, "gdn B=%d H=%d dk=%d dv=%d", B, DG_H, DG_DK, DG_DV);
    double ms = timeit(base_dec_run, &a);
    emit_head("gdn_decode");
    printf(",\"shape\":\"%s\",\"B\":%d,\"H\":%d,\"dk\":%d,\"dv\":%d,\"ms\":%.4f,\"tokens_per_s\":%.0f", shape, B, DG_H,
           DG_DK, DG_DV, ms, B / (ms * 1e-3));
    print_rate((double)B * (2.0 * ss + (double)DG_H * (3.0 * DG_DK + 2.0 * DG_DV)) * 4, ms);
    printf("}\n");
    fflush(stdout);
    dfree(all);
    free(a.Sp);
    dla_free(&d);
}

/* the plain base's prefill of one sequence of n tokens (GDN: gdn_prefill; Mamba2: ssd_prefill) */
static void gdnp_run(void *u) {
    dla_ud *d = u;
    TRY(O->gdn_prefill(CX, d->q, d->k, d->v, d->g, d->w, d->n, d->p.H, d->p.dk, d->p.dv, 1.0f / sqrtf((float)d->p.dk),
                       d->cS, d->o));
}
static void base_prefill_row(int mamba, int n) {
    if (mamba) {
        int ns[] = {n};
        bench_ssd(M2_N, ns, 1, NULL, 0);
        return;
    }
    dla_ud d = dla_new(0, n, 1.0f);
    d.cS = drand_rep((size_t)DG_H * DG_DK * DG_DV, 0.1f, 0, 0);
    double ms = sp_time(gdnp_run, &d);
    emit_head("gdn_prefill");
    printf(",\"shape\":\"gdn n=%d H=%d dk=%d dv=%d\",\"tokens\":%d,\"H\":%d,\"dk\":%d,\"dv\":%d,\"ms\":%.4f,"
           "\"tokens_per_s\":%.0f}\n",
           n, DG_H, DG_DK, DG_DV, n, DG_H, DG_DK, DG_DV, ms, n / (ms * 1e-3));
    fflush(stdout);
    dfree(d.cS);
    d.cS = NULL;
    dla_free(&d);
}

static int dla_ctx[8] = {4096, 16384, 65536}, dla_nctx = 3; /* --ctx for --only dla */
static double dla_tau = 0.6;                               /* --tau: hyla-mkmodel's default */
static double dla_budget_s = 15;                           /* --max-call-s */

static void bench_dla(int quick) {
    int Bs[] = {1, 64}, nb = quick ? 1 : 2;
    int qctx[] = {32, 64}, *ctxs = quick ? qctx : dla_ctx, nctx = quick ? 2 : dla_nctx;
    if (!copy_gbps) bench_copy(quick);
    for (int mamba = 0; mamba < 2; mamba++) {
        /* decode step cost at K = 30: one state, a full cache merging, a full cache opening */
        for (int i = 0; i < nb; i++) {
            int B = quick && Bs[i] > 1 ? 4 : Bs[i];
            base_decode_row(mamba, B);
            dla_decode_row(mamba, B, 1, 1e30f, "merge into the newest");
            dla_decode_row(mamba, B, DLA_K, 1e30f, "merge into the newest");
            dla_decode_row(mamba, B, DLA_K, 0.0f, "open a state (pair merge first)");
        }
        /* prefill of one session from an empty cache at each length, then decode from it */
        double s_per_tok = 0;
        for (int ci = 0; ci < nctx; ci++) {
            int n = ctxs[ci];
            char shape[128];
            base_prefill_row(mamba, n);
            snprintf(shape, sizeof shape, "%s n=%d tau=%g K=%d", dla_base_name(mamba), n, dla_tau, DLA_K);
            if (s_per_tok * n > dla_budget_s) {
                emit_head("dla_prefill");
                printf(",\"shape\":\"%s\",\"tokens\":%d,\"skipped\":\"estimated %.1f s > --max-call-s %.0f\"}\n", shape,
                       n, s_per_tok * n, dla_budget_s);
                fflush(stdout);
                continue;
            }
            dla_ud a = dla_new(mamba, n, (float)dla_tau);
            dla_caches(&a, 1, 0);
            TRY(O->sync(CX));
            /* timed once, from an empty cache (a second call would start from the first's cache;
             * the decode rows above loaded the kernel, which prefill shares) */
            double t0 = hyla_now();
            if (dla_call(&a, 0) != HYLA_OK) {
                emit_error("dla_prefill", shape);
                dla_free(&a);
                continue;
            }
            TRY(O->sync(CX));
            double sec = hyla_now() - t0, m_after = dla_mean_m(&a);
            s_per_tok = sec / n;
            emit_head("dla_prefill");
            printf(",\"shape\":\"%s\",\"base\":\"%s\",\"tokens\":%d,\"H\":%d,\"dk\":%d,\"dv\":%d,\"K\":%d,\"tau\":%g,"
                   "\"ms\":%.3f,\"tokens_per_s\":%.0f,\"m_after\":%.1f}\n",
                   shape, dla_base_name(mamba), n, a.p.H, a.p.dk, a.p.dv, DLA_K, dla_tau, sec * 1e3, n / sec, m_after);
            fflush(stdout);
            /* decode after this prefill: B sessions holding its cache */
            for (int i = 0; i < nb; i++) {
                int B = quick && Bs[i] > 1 ? 4 : Bs[i];
                dla_ud d = dla_new(mamba, B, (float)dla_tau);
                dla_caches(&d, B, 0);
                size_t ss = (size_t)a.p.H * DLA_K * a.p.dk * a.p.dv;
                TRY(O->copy(CX, d.c[0].S, a.c[0].S, ss * sizeof(float)));
                TRY(O->copy(CX, d.c[0].n, a.c[0].n, (size_t)a.p.H * DLA_K * sizeof(int32_t)));
                TRY(O->copy(CX, d.c[0].I, a.c[0].I, (size_t)a.p.H * DLA_K * sizeof(float)));
                TRY(O->copy(CX, d.c[0].m, a.c[0].m, (size_t)a.p.H * sizeof(int32_t)));
                dla_clone(&d);
                double ms = timeit(dla_dec_run, &d);
                emit_head("dla_decode_after_prefill");
                printf(",\"base\":\"%s\",\"ctx\":%d,\"B\":%d,\"tau\":%g,\"m\":%.1f,\"m_after\":%.1f,\"ms\":%.4f,"
                       "\"tokens_per_s\":%.0f}\n",
                       dla_base_name(mamba), n, B, dla_tau, m_after, dla_mean_m(&d), ms, B / (ms * 1e-3));
                fflush(stdout);
                dla_free(&d);
            }
            dla_free(&a);
        }
    }
}

static void open_device(const char *device) {
    dev_arg = device;
    TRY(hyla_backend_create(device, &be));
    O = be->ops;
    CX = be->ctx;
    if (!strcmp(O->name, "cuda") && hyla_cuda_device_info) {
        int sms = 0;
        double gib = 0;
        if (hyla_cuda_device_info(be, dev_name, sizeof dev_name, &sms, &gib) == HYLA_OK)
            fprintf(stderr, "hyla-bench: %s, %d SMs, %.1f GiB\n", dev_name, sms, gib);
        if (hyla_cuda_switches) (void)hyla_cuda_switches(be, dev_switches, sizeof dev_switches);
    }
}

int hyla_bench_kernels(int argc, char **argv) {
    const char *device = "cpu", *only = NULL;
    int quick = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc)
            device = argv[++i];
        else if (!strcmp(argv[i], "--only") && i + 1 < argc)
            only = argv[++i];
        else if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--ctx") && i + 1 < argc) {
            sp_nctx = hyla_bench_parse_list("--ctx", argv[i + 1], sp_ctx, 8);
            seq_nctx = hyla_bench_parse_list("--ctx", argv[i + 1], seq_ctx, 8);
            dla_nctx = hyla_bench_parse_list("--ctx", argv[++i], dla_ctx, 8);
        } else if (!strcmp(argv[i], "--tau") && i + 1 < argc)
            dla_tau = hyla_bench_num("--tau", argv[++i], 1e-9, 1e9, 0);
        else if (!strcmp(argv[i], "--max-call-s") && i + 1 < argc)
            dla_budget_s = hyla_bench_num("--max-call-s", argv[++i], 1e-3, 1e6, 0);
        else {
            int help;
            FILE *uf = hyla_bench_usage_to("kernels", argv[i], &help);
            fprintf(uf, "usage: hyla-bench kernels [--device cpu|cuda:N] [--quick] [--ctx LIST] [--tau T]\n"
                   "                          [--max-call-s S] [--only gemm|prefill|sse|decode|attn|\n"
                   "                          elementwise|sparse|nsa|mamba2|statex|dla|seq]\n"
                   "  JSON lines: GEMM through ops->linear (and a plain cuBLAS bf16 reference on cuda),\n"
                   "  chunked GLA/GDN prefill (8 x 8192 tokens, 16 heads, dk=dv=128), SSE n4k1 vs GLA\n"
                   "  prefill at 32k tokens, decode state updates at batch 1/16/64/256, attention\n"
                   "  prefill and decode, the row and elementwise ops of a 1024-token prefill piece of\n"
                   "  the 1.3B models (--only elementwise; GB/s of the bytes each must move).\n"
                   "  --only sparse (not in the default set): full attention, SWA (w 1024), LTE and NSA\n"
                   "  layers at the 1.4B laLTE/laNSA shapes, prefill and batch-32 decode at --ctx LIST\n"
                   "  (default 4096,32768,131072). --only nsa: the NSA rows of that group alone.\n"
                   "  --only mamba2 | statex | dla (not in the default set; each first measures the\n"
                   "  device-to-device copy rate of 1 GiB, which decode rows report as of_copy):\n"
                   "    mamba2: SSD prefill (one sequence of 4096 and 16384 tokens) and decode state\n"
                   "    update (B = 1/16/64/256) at Mamba2-1.3B's shapes (64 heads of 64, state 128,\n"
                   "    one group);\n"
                   "    statex: the same for state 512, and GLA prefill and decode for H 4, dk 256,\n"
                   "    dv 512 and its StateX merge H 1, dk 1024, dv 2048 (a refused shape gives a\n"
                   "    row with \"error\");\n"
                   "    dla: K = 30 over GDN (16 heads, dk 128, dv 256) and Mamba2 (as above): decode\n"
                   "    step of the plain base and of DLA with 1 or 30 states per head (B = 1, 64);\n"
                   "    prefill of one session at --ctx LIST (default 4096,16384,65536) with\n"
                   "    threshold --tau (default 0.6), plain and DLA, then DLA decode from that\n"
                   "    cache; a DLA prefill estimated over --max-call-s (default 15) is skipped.\n"
                   "  --only seq (not in the default set): chunked GLA and GDN prefill of one sequence\n"
                   "    per --ctx length (default 32768,131072), 18 heads, dk = dv = 128 (the kernels\n"
                   "    deploy/compare-fla.sh compares with flash-linear-attention's).\n"
                   "  --quick: small sizes (the default on cpu).\n");
            return help ? 0 : 2;
        }
    }
    if (only) {
        static const char *const modes[] = {"gemm", "prefill", "sse", "decode", "attn", "elementwise",
                                            "sparse", "nsa", "mamba2", "statex", "dla", "seq"};
        size_t i = 0;
        while (i < sizeof modes / sizeof modes[0] && strcmp(only, modes[i])) i++;
        if (i == sizeof modes / sizeof modes[0]) {
            fprintf(stderr, "hyla-bench kernels: unknown --only '%s' (see --help)\n", only);
            return 2;
        }
    }
    hyla_rng_seed(&rng, 1234);
    open_device(device);
    if (!strcmp(O->name, "cpu")) quick = 1;
    /* Kernel figures time launches one by one (the graph log would turn a timed batch of calls
     * into one graph): graphs off, as in the figures before graphs existed. */
    if (hyla_cuda_set_graphs && !strcmp(O->name, "cuda")) TRY(hyla_cuda_set_graphs(be, 0));
    if (!only || !strcmp(only, "gemm")) bench_gemm(quick);
    if (!only || !strcmp(only, "prefill")) bench_prefill(quick);
    if (!only || !strcmp(only, "sse")) bench_sse(quick);
    if (!only || !strcmp(only, "decode")) bench_decode(quick);
    if (!only || !strcmp(only, "attn")) bench_attention(quick);
    if (!only || !strcmp(only, "elementwise")) bench_elementwise(quick);
    if (only && (!strcmp(only, "sparse") || !strcmp(only, "nsa"))) bench_sparse(quick, !strcmp(only, "nsa"));
    if (only && !strcmp(only, "mamba2")) bench_mamba2(quick);
    if (only && !strcmp(only, "statex")) bench_statex(quick);
    if (only && !strcmp(only, "dla")) bench_dla(quick);
    if (only && !strcmp(only, "seq")) bench_seq(quick);
    hyla_backend_destroy(be);
    return 0;
}

/* ---------------------------------------------------------------- e2e */

static void rand_tokens(int32_t *t, int n, int vocab) {
    for (int i = 0; i < n; i++) t[i] = (int32_t)(hyla_rng_next(&rng) % (uint64_t)(vocab > 256 ? 256 : vocab));
}

/* Asynchronous export of ss[0] while the batch of B sessions keeps decoding (e2e_snapshot_async):
 *   begin_ms       host time of hyla_session_export_begin;
 *   until_done_ms  from begin until hyla_session_export_done first says 1, polled after each
 *                  decode step of the batch (so at least one step's time once a step is needed),
 *                  steps_until_done of them;
 *   end_ms         host time of hyla_session_export_end once done;
 *   decode_ms_per_step / _exporting  the batch's decode step without an export, and with an
 *                  export of session 0 always in flight (a new one begins as soon as one ends),
 *                  exports_completed of them in `steps` steps.
 * On the CPU backend the copies run inside export_end (hyla_ops.h), so nothing overlaps there. */
static void bench_async_export(hyla_model *m, hyla_session **ss, int B, int ctx, int steps, const char *model_dir) {
    const hyla_model_config *cfg = hyla_model_get_config(m);
    int32_t *out = malloc((size_t)B * 4);
    hyla_export *e = NULL;
    hyla_snapshot *snap = NULL;
    /* warm-up: decode (graphs) and one export (buffer cache, staging slots) */
    TRY(hyla_session_decode(ss, B, out, NULL));
    TRY(hyla_session_decode(ss, B, out, NULL));
    TRY(hyla_session_export_begin(ss[0], &e));
    TRY(hyla_session_decode(ss, B, out, NULL));
    TRY(hyla_session_export_end(e, &snap));
    hyla_snapshot_destroy(snap);
    TRY(O->sync(CX));
    double t0 = hyla_now();
    for (int st = 0; st < steps; st++) TRY(hyla_session_decode(ss, B, out, NULL));
    TRY(O->sync(CX));
    double plain = (hyla_now() - t0) / steps;
    double state = (double)hyla_session_state_bytes(ss[0]);
    /* one export, decode steps until it is done */
    t0 = hyla_now();
    TRY(hyla_session_export_begin(ss[0], &e));
    double begin_s = hyla_now() - t0;
    int k = 0;
    while (!hyla_session_export_done(e) && k < 100000) {
        TRY(hyla_session_decode(ss, B, out, NULL));
        k++;
    }
    double until_s = hyla_now() - t0;
    double te = hyla_now();
    TRY(hyla_session_export_end(e, &snap));
    double end_s = hyla_now() - te;
    hyla_snapshot_destroy(snap);
    /* decode with an export always in flight */
    TRY(O->sync(CX));
    int n_exp = 0;
    e = NULL;
    t0 = hyla_now();
    for (int st = 0; st < steps; st++) {
        if (!e) TRY(hyla_session_export_begin(ss[0], &e));
        TRY(hyla_session_decode(ss, B, out, NULL));
        if (hyla_session_export_done(e)) {
            TRY(hyla_session_export_end(e, &snap));
            hyla_snapshot_destroy(snap);
            e = NULL;
            n_exp++;
        }
    }
    TRY(O->sync(CX));
    double busy = (hyla_now() - t0) / steps;
    if (e) {
        TRY(hyla_session_export_end(e, &snap));
        hyla_snapshot_destroy(snap);
    }
    emit_head("e2e_snapshot_async");
    printf(",\"model\":\"%s\",\"type\":\"%s\",\"ctx\":%d,\"B\":%d,\"state_mb\":%.1f,\"begin_ms\":%.3f,"
           "\"until_done_ms\":%.3f,\"steps_until_done\":%d,\"end_ms\":%.3f,\"decode_ms_per_step\":%.3f,"
           "\"decode_ms_per_step_exporting\":%.3f,\"exports_completed\":%d,\"copies_overlap\":%s}\n",
           model_dir, cfg->model_type, ctx, B, state / 1e6, begin_s * 1e3, until_s * 1e3, k, end_s * 1e3, plain * 1e3,
           busy * 1e3, n_exp, strcmp(O->name, "cpu") ? "true" : "false");
    fflush(stdout);
    free(out);
}

/* The runtime's scratch after the measured call (rank 0's under tensor parallelism): activations
 * with the mixers' scratch, and logits, which only rows that want them reserve */
static void print_scratch(const hyla_runtime *rt) {
    size_t lb = 0, all = hyla_runtime_scratch_bytes(rt, &lb);
    printf(",\"scratch_mb\":%.1f,\"logits_scratch_mb\":%.2f", all / 1e6, lb / 1e6);
}

int hyla_bench_e2e(int argc, char **argv) {
    const char *device = "cpu", *model_dir = NULL;
    int prefill[8], np = 0, batches[8], nb = 0, ctxs[8], nc = 0, steps = 32;
    double max_state_gib = 60;
    const char *graphs = "on";
    int tp = 1, prefill_repeat = 1, turn = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc)
            device = argv[++i];
        else if (!strcmp(argv[i], "--turn") && i + 1 < argc)
            turn = (int)hyla_bench_num("--turn", argv[++i], 1, 1 << 20, 1);
        else if (!strcmp(argv[i], "--prefill-repeat") && i + 1 < argc)
            prefill_repeat = (int)hyla_bench_num("--prefill-repeat", argv[++i], 1, 16, 1);
        else if (!strcmp(argv[i], "--model") && i + 1 < argc)
            model_dir = argv[++i];
        else if (!strcmp(argv[i], "--tp") && i + 1 < argc)
            tp = (int)hyla_bench_num("--tp", argv[++i], 1, HYLA_TP_MAX, 1);
        else if (!strcmp(argv[i], "--prefill") && i + 1 < argc)
            np = hyla_bench_parse_list("--prefill", argv[++i], prefill, 8);
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc)
            nb = hyla_bench_parse_list("--batch", argv[++i], batches, 8);
        else if (!strcmp(argv[i], "--ctx") && i + 1 < argc)
            nc = hyla_bench_parse_list("--ctx", argv[++i], ctxs, 8);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc)
            steps = (int)hyla_bench_num("--steps", argv[++i], 1, 1e6, 1);
        else if (!strcmp(argv[i], "--max-state-gib") && i + 1 < argc)
            max_state_gib = hyla_bench_num("--max-state-gib", argv[++i], 1e-3, 1e6, 0);
        else if (!strcmp(argv[i], "--graphs") && i + 1 < argc)
            graphs = argv[++i];
        else {
            int help;
            FILE *uf = hyla_bench_usage_to("e2e", argv[i], &help);
            fprintf(uf, "usage: hyla-bench e2e --model DIR [--device cpu|cuda:N] [--prefill LIST (default 4096)]\n"
                   "                      [--batch LIST (default 1,16,64)] [--ctx LIST (default 16)] [--steps 32]\n"
                   "                      [--max-state-gib 60] [--prefill-repeat 1 (at most 16)]\n"
                   "                      [--graphs on|off|both] [--tp N] [--turn N]\n"
                   "  Prefill tokens/s of one session per --prefill length (with --prefill-repeat N: the\n"
                   "  median of N prefills, each a fresh session, and s_min / s_max); with --turn N also\n"
                   "  the time to feed that session N more tokens, a conversation's next turn at that\n"
                   "  context (the median of 3 turns one after another; an e2e_turn line); decode tokens/s of B sessions\n"
                   "  whose context has --ctx tokens (one session is prefilled, the others are imported\n"
                   "  from its snapshot). Skips a decode point whose session state exceeds --max-state-gib.\n"
                   "  --graphs (cuda): CUDA graphs for repeated op sequences on (default), off, or decode\n"
                   "  measured both ways; the prefill lines count the graph replays, captures and evictions\n"
                   "  of the timed prefill, the decode lines the launches per step (steps whose timing\n"
                   "  caught a graph capture are timed once more: \"retimed\":1). Also times the snapshot\n"
                   "  export and import of one session per --ctx,\n"
                   "  and the asynchronous export of one session while the first --batch keeps decoding.\n"
                   "  --tp N: split every layer over N devices (--device's GPU and the next N-1, or N CPU\n"
                   "  backends; worker/hyla_tp.h); each line then carries \"tp\":N.\n"
                   "  First measures the device-to-device copy rate (1 GiB on a GPU, 64 MiB on the CPU; a\n"
                   "  copy_bandwidth line); each decode line's of_copy is its bytes a second (weights and\n"
                   "  each session's whole state, counted once) over that rate (times N with --tp N).\n"
                   "  Make a model with hyla-mkmodel (random weights).\n");
            return help ? 0 : 2;
        }
    }
    if (!model_dir) DIE("e2e: --model DIR is required (hyla-mkmodel writes one)");
    if (tp < 1 || tp > HYLA_TP_MAX) DIE("e2e: --tp must be a number from 1 to %d", HYLA_TP_MAX);
    if (!np) np = hyla_bench_parse_list("(default)", "4096", prefill, 8);
    if (!nb) nb = hyla_bench_parse_list("(default)", "1,16,64", batches, 8);
    if (!nc) nc = hyla_bench_parse_list("(default)", "16", ctxs, 8);
    hyla_rng_seed(&rng, 99);
    hyla_tp_group *grp = NULL;
    if (tp > 1) {
        double tl = hyla_now();
        TRY(hyla_tp_open(model_dir, device, tp, NULL, &grp));
        dev_arg = device;
        be = hyla_tp_backend(grp);
        O = be->ops;
        CX = be->ctx;
        int sms = 0;
        double gib = 0;
        if (!strcmp(O->name, "cuda") && hyla_cuda_device_info) (void)hyla_cuda_device_info(be, dev_name, sizeof dev_name, &sms, &gib);
        if (!strcmp(O->name, "cuda") && hyla_cuda_switches) (void)hyla_cuda_switches(be, dev_switches, sizeof dev_switches);
        fprintf(stderr, "hyla-bench: %s split over %d ranks from %s in %.1f s\n", model_dir, tp, device, hyla_now() - tl);
    } else {
        open_device(device);
    }
    e2e_tp = tp;
    e2e_grp = grp;
    int is_cuda = !strcmp(O->name, "cuda") && hyla_cuda_set_graphs;
    int g_modes[2] = {1, 0}, n_modes = 1; /* graph settings to measure decode with */
    if (!strcmp(graphs, "off")) g_modes[0] = 0;
    else if (!strcmp(graphs, "both")) n_modes = 2;
    if (!is_cuda) n_modes = 1;
    if (is_cuda) TRY(set_graphs_all(g_modes[0]));
    hyla_model *m;
    hyla_runtime *rt;
    double t0 = hyla_now();
    if (grp) {
        m = hyla_tp_model(grp);
        rt = hyla_tp_runtime(grp);
    } else {
        hyla_model_params mp = hyla_model_default_params();
        TRY(hyla_model_load(model_dir, be, &mp, &m));
        TRY(hyla_runtime_create(m, &rt));
    }
    const hyla_model_config *cfg = hyla_model_get_config(m);
    double params = (double)hyla_model_param_bytes(m) * tp; /* a shard's times the ranks (~the whole) */
    fprintf(stderr, "hyla-bench: loaded %s (%s, %d layers, %.2f GB of parameters) in %.1f s\n", model_dir,
            cfg->model_type, cfg->num_layers, params / 1e9, hyla_now() - t0);
    /* the device-to-device copy rate (a copy_bandwidth line), which the decode lines' of_copy
     * compares with: the datasheet's bandwidth (of_hbm) is more than any copy reaches, so a decode
     * step's share of what the device can really move is read against this */
    bench_copy(!is_cuda);
    if (np > 0) { /* warm-up: a prompt of two pieces loads the kernels and builds the GEMM plans */
        int n = 2 * hyla_runtime_prefill_piece(rt) + 1;
        int32_t *tok = malloc((size_t)n * 4);
        rand_tokens(tok, n, cfg->vocab_size);
        hyla_session *s;
        TRY(hyla_session_create(rt, &s));
        TRY(hyla_session_feed(s, tok, n, NULL, NULL, NULL, NULL));
        TRY(O->sync(CX));
        hyla_session_free(s);
        free(tok);
    }
    for (int i = 0; i < np; i++) {
        int n = prefill[i];
        int32_t *tok = malloc((size_t)n * 4);
        rand_tokens(tok, n, cfg->vocab_size);
        /* --prefill-repeat: the median of that many timed prefills, each a fresh session (one
         * prompt's time moves by several percent between calls at 4k); the last call's graph
         * counts and profile */
        hyla_session *s = NULL;
        double secs[16];
        bench_graph_stats g0 = {0}, g1 = {0};
        for (int r = 0; r < prefill_repeat; r++) {
            if (s) hyla_session_free(s);
            TRY(hyla_session_create(rt, &s));
            TRY(O->sync(CX));
            if (is_cuda && hyla_cuda_get_graph_stats) TRY(hyla_cuda_get_graph_stats(be, &g0));
            hyla_prof_reset();
            t0 = hyla_now();
            TRY(hyla_session_feed(s, tok, n, NULL, NULL, NULL, NULL));
            TRY(O->sync(CX));
            secs[r] = hyla_now() - t0;
            if (is_cuda && hyla_cuda_get_graph_stats) TRY(hyla_cuda_get_graph_stats(be, &g1));
        }
        const double sec = hyla_bench_median(secs, prefill_repeat);
        emit_head("e2e_prefill");
        printf(",\"model\":\"%s\",\"type\":\"%s\",\"layers\":%d,\"hidden\":%d,\"tokens\":%d,\"s\":%.3f,"
               "\"tokens_per_s\":%.0f,\"param_gb\":%.3f,\"state_mb\":%.1f,\"graphs\":%d",
               model_dir, cfg->model_type, cfg->num_layers, cfg->hidden_size, n, sec, n / sec, params / 1e9,
               hyla_session_state_bytes(s) / 1e6, is_cuda ? g_modes[0] : 0);
        if (prefill_repeat > 1) {
            double lo = secs[0], hi = secs[0];
            for (int r = 1; r < prefill_repeat; r++) lo = secs[r] < lo ? secs[r] : lo, hi = secs[r] > hi ? secs[r] : hi;
            printf(",\"repeat\":%d,\"s_min\":%.4f,\"s_max\":%.4f", prefill_repeat, lo, hi);
        }
        /* 2 flops per parameter and token (parameters: bf16 on cuda, fp32 on the cpu backend);
         * attention's n^2 term is not counted */
        double tf = 2.0 * (params / (is_cuda ? 2.0 : 4.0)) * (n / sec) / 1e12, peak, hbm;
        datasheet(&peak, &hbm);
        printf(",\"tflops_2pn\":%.1f,\"piece\":%d,\"prefill_chunk\":%d", tf, hyla_runtime_prefill_piece(rt),
               hyla_runtime_prefill_chunk(rt));
        if (peak > 0) printf(",\"peak_bf16_tflops\":%.0f,\"of_peak\":%.3f", peak, tf / peak);
        print_scratch(rt);
        if (is_cuda && hyla_cuda_get_graph_stats) /* rank 0's (a tensor-parallel group's ranks run alike) */
            printf(",\"graph_replays\":%llu,\"captures\":%llu,\"evictions\":%llu",
                   (unsigned long long)(g1.replays - g0.replays), (unsigned long long)(g1.captures - g0.captures),
                   (unsigned long long)(g1.evictions - g0.evictions));
        hyla_prof_print_json(stdout); /* HYLA_PROFILE=1: where the time went (syncs included above) */
        printf("}\n");
        fflush(stdout);
        if (turn > 0) { /* the next turn at this context: a short piece behind a long prompt */
            int32_t *tt = malloc((size_t)turn * 4);
            double ts[3];
            for (int r = 0; r < 3; r++) {
                rand_tokens(tt, turn, cfg->vocab_size);
                TRY(O->sync(CX));
                t0 = hyla_now();
                TRY(hyla_session_feed(s, tt, turn, NULL, NULL, NULL, NULL));
                TRY(O->sync(CX));
                ts[r] = hyla_now() - t0;
            }
            double lo = ts[0], hi = ts[0];
            for (int r = 1; r < 3; r++) lo = ts[r] < lo ? ts[r] : lo, hi = ts[r] > hi ? ts[r] : hi;
            const double st = hyla_bench_median(ts, 3);
            emit_head("e2e_turn");
            printf(",\"model\":\"%s\",\"type\":\"%s\",\"ctx\":%d,\"tokens\":%d,\"s\":%.4f,\"tokens_per_s\":%.0f,"
                   "\"s_min\":%.4f,\"s_max\":%.4f}\n",
                   model_dir, cfg->model_type, n, turn, st, turn / st, lo, hi);
            fflush(stdout);
            free(tt);
        }
        hyla_session_free(s);
        free(tok);
    }
    for (int ci = 0; ci < nc; ci++)
        for (int bi = 0; bi < nb; bi++) {
            int ctx = ctxs[ci], B = batches[bi];
            int32_t *tok = malloc((size_t)(ctx > 1 ? ctx : 1) * 4);
            rand_tokens(tok, ctx > 1 ? ctx : 1, cfg->vocab_size);
            hyla_session *s0;
            TRY(hyla_session_create(rt, &s0));
            TRY(hyla_session_feed(s0, tok, ctx > 1 ? ctx : 1, NULL, NULL, NULL, NULL));
            double per = (double)hyla_session_state_bytes(s0);
            if (per * B / 1073741824.0 > max_state_gib) {
                fprintf(stderr, "hyla-bench: skip decode B=%d ctx=%d: %.1f GiB of state > %.0f\n", B, ctx,
                        per * B / 1073741824.0, max_state_gib);
                hyla_session_free(s0);
                free(tok);
                continue;
            }
            hyla_snapshot *snap;
            /* the first export of a size allocates the pinned snapshot buffer and the staging
             * slots (export_first_ms); the serving loop's exports find them cached (export_ms) */
            TRY(O->sync(CX));
            double te1 = hyla_now();
            TRY(hyla_session_export(s0, &snap));
            te1 = hyla_now() - te1;
            hyla_snapshot_destroy(snap);
            TRY(O->sync(CX));
            double te = hyla_now();
            TRY(hyla_session_export(s0, &snap));
            te = hyla_now() - te;
            hyla_session **ss = calloc(B, sizeof *ss);
            ss[0] = s0;
            for (int b = 1; b < B; b++) TRY(hyla_session_import(rt, snap, &ss[b]));
            if (bi == 0) { /* one session's snapshot round trip through the statestore format */
                hyla_session *tmp;
                TRY(O->sync(CX));
                double ti = hyla_now();
                TRY(hyla_session_import(rt, snap, &tmp));
                TRY(O->sync(CX));
                ti = hyla_now() - ti;
                hyla_session_free(tmp);
                emit_head("e2e_snapshot");
                printf(",\"model\":\"%s\",\"type\":\"%s\",\"ctx\":%d,\"state_mb\":%.1f,\"export_ms\":%.3f,"
                       "\"export_gbps\":%.2f,\"export_first_ms\":%.3f,\"import_ms\":%.3f,\"import_gbps\":%.2f}\n",
                       model_dir, cfg->model_type, ctx, per / 1e6, te * 1e3, per / te / 1e9, te1 * 1e3, ti * 1e3,
                       per / ti / 1e9);
                fflush(stdout);
            }
            hyla_snapshot_destroy(snap);
            if (bi == 0) bench_async_export(m, ss, B, ctx, steps, model_dir);
            int32_t *out = malloc(B * 4);
            for (int gm = 0; gm < n_modes; gm++) {
                if (is_cuda) TRY(set_graphs_all(g_modes[gm]));
                bench_graph_stats g0 = {0}, g1 = {0};
                TRY(hyla_session_decode(ss, B, out, NULL)); /* warm-up (twice: a graph is captured on the */
                TRY(hyla_session_decode(ss, B, out, NULL)); /* second sight of a step) */
                double sec = 0;
                int retimed = 0;
                for (int attempt = 0; attempt < 2; attempt++) {
                    TRY(O->sync(CX));
                    if (is_cuda && hyla_cuda_get_graph_stats) TRY(hyla_cuda_get_graph_stats(be, &g0));
                    hyla_prof_reset();
                    t0 = hyla_now();
                    for (int st = 0; st < steps; st++) TRY(hyla_session_decode(ss, B, out, NULL));
                    TRY(O->sync(CX));
                    sec = (hyla_now() - t0) / steps;
                    if (is_cuda && hyla_cuda_get_graph_stats) TRY(hyla_cuda_get_graph_stats(be, &g1));
                    /* a step's graph signature can change as the contexts grow (attention's page
                     * table past a power of two): a capture inside the timed steps would count
                     * it and the eager steps before it, so those steps are timed once more */
                    if (g1.captures == g0.captures) break;
                    retimed = 1;
                }
                double state = (double)hyla_session_state_bytes(ss[0]) * B;
                emit_head("e2e_decode");
                printf(",\"model\":\"%s\",\"type\":\"%s\",\"B\":%d,\"ctx\":%d,\"ms_per_step\":%.3f,\"tokens_per_s\":%.0f,"
                       "\"bytes_per_step_gb\":%.3f,\"gbps\":%.1f,\"graphs\":%d",
                       model_dir, cfg->model_type, B, ctx, sec * 1e3, B / sec, (params + state) / 1e9,
                       (params + state) / sec / 1e9, is_cuda ? g_modes[gm] : 0);
                double peak, hbm;
                datasheet(&peak, &hbm);
                if (hbm > 0) printf(",\"hbm_tbps\":%.2f,\"of_hbm\":%.3f", hbm, (params + state) / sec / 1e12 / hbm);
                if (copy_gbps > 0) /* a group's ranks each copy at this rate: of their sum */
                    printf(",\"copy_gbps\":%.1f,\"of_copy\":%.3f", copy_gbps * tp,
                           (params + state) / sec / 1e9 / (copy_gbps * tp));
                print_scratch(rt);
                if (is_cuda && hyla_cuda_get_graph_stats)
                    printf(",\"ops_per_step\":%.0f,\"graph_launches_per_step\":%.2f,\"captures\":%llu,\"retimed\":%d",
                           (double)(g1.ops - g0.ops) / steps, (double)(g1.replays - g0.replays) / steps,
                           (unsigned long long)(g1.captures - g0.captures), retimed);
                hyla_prof_print_json(stdout); /* HYLA_PROFILE=1: the timed steps' marks (syncs included) */
                printf("}\n");
                fflush(stdout);
            }
            if (is_cuda) TRY(set_graphs_all(g_modes[0]));
            for (int b = 0; b < B; b++) hyla_session_free(ss[b]);
            free(ss);
            free(out);
            free(tok);
        }
    if (grp) {
        hyla_tp_close(grp);
    } else {
        hyla_runtime_free(rt);
        hyla_model_free(m);
        hyla_backend_destroy(be);
    }
    return 0;
}
