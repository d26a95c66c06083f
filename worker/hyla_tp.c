/* hyla_tp.c — tensor-parallel groups inside one process: the ranks' threads, the sum over the
 * group that the runtimes call twice per layer, and the snapshot join and cut (hyla_tp.h).
 *
 * The sum on the CPU backend: each rank posts its buffer and waits for all; each then adds the
 * T buffers in rank order into a private copy (so every rank gets the same bits), waits again
 * (nobody overwrites a buffer another is still reading) and copies its sum back. A failed rank
 * marks the group aborted and wakes the waiters, whose sums then fail: a rank never waits for a
 * partner that has returned. On CUDA (hyla_tp_group_create says which sum takes which rows):
 * one-shot sums, kernels that meet on the device and are logged into the CUDA graphs (decode
 * steps, short pieces); peer sums by copy engines, sequenced across the ranks' threads here
 * (psum_begin, psum_join), for the halves of a prefill piece that overlap their sums with
 * compute (hyla_runtime.c, run_layers_wave); NCCL's all-reduce on the compute stream (one
 * communicator for the group, joined by every rank's thread at creation) for larger sums of two
 * ranks. Ranks 1..T-1 each have a thread for the group's life (bound to its GPU at every job,
 * cheap); hyla_tp_run hands them a job and runs rank 0 on the caller's thread. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_log.h"
#include "hyla_thread.h"
#include "hyla_model_impl.h"
#include "hyla_runtime_impl.h"
#include "hyla_tp.h"

/* kernels/cuda/hyla_cuda_extra.h, weak: NULL in builds without the CUDA backend */
typedef struct hyla_nccl_link hyla_nccl_link;
hyla_status hyla_cuda_nccl_id(uint8_t id[128]) __attribute__((weak));
hyla_status hyla_cuda_nccl_open(hyla_backend *be, const uint8_t id[128], int nranks, int rank, int timeout_ms,
                                hyla_nccl_link **out) __attribute__((weak));
hyla_status hyla_cuda_nccl_allreduce(hyla_backend *be, hyla_nccl_link *l, float *dev, size_t n) __attribute__((weak));
typedef struct hyla_cuda_psum hyla_cuda_psum;
hyla_status hyla_cuda_psum_open(hyla_backend *const *be, int T, size_t oneshot_max, hyla_cuda_psum **out)
    __attribute__((weak));
hyla_status hyla_cuda_psum_oneshot(hyla_cuda_psum *p, int rank, int j, float *x, size_t n) __attribute__((weak));
size_t hyla_cuda_psum_oneshot_max(const hyla_cuda_psum *p) __attribute__((weak));
float *hyla_cuda_psum_oneshot_buf(hyla_cuda_psum *p, int rank, int j) __attribute__((weak));
void hyla_cuda_psum_set_push_min(hyla_cuda_psum *p, size_t floats) __attribute__((weak));
hyla_status hyla_cuda_flush(hyla_backend *be) __attribute__((weak));
hyla_status hyla_cuda_set_gemm_wg_min(hyla_backend *be, int rows) __attribute__((weak));
hyla_status hyla_cuda_psum_ready(hyla_cuda_psum *p, int rank, unsigned seq, float *buf, float *acc, size_t n)
    __attribute__((weak));
hyla_status hyla_cuda_psum_issue(hyla_cuda_psum *p, int rank, unsigned seq) __attribute__((weak));
hyla_status hyla_cuda_psum_join(hyla_cuda_psum *p, int rank, unsigned seq) __attribute__((weak));
void hyla_cuda_psum_reset(hyla_cuda_psum *p) __attribute__((weak));
void hyla_cuda_psum_close(hyla_cuda_psum *p) __attribute__((weak));
void hyla_cuda_nccl_close(hyla_nccl_link *l) __attribute__((weak));
hyla_status hyla_cuda_bind_thread(hyla_backend *be) __attribute__((weak));

#define TP_JOIN_TIMEOUT_MS 30000
#define ONESHOT_ROWS 1024 /* rows of hidden states a one-shot sum takes (decode batches, short pieces) */

typedef struct {
    struct hyla_tp_group *g;
    int rank;
    unsigned psum_seq; /* the next peer sum's number (this rank's thread only) */
} rank_ref;

struct hyla_tp_group {
    int T, cuda;
    hyla_runtime *rt[HYLA_TP_MAX];
    rank_ref ref[HYLA_TP_MAX];
    hyla_nccl_link *link[HYLA_TP_MAX];
    uint8_t nccl_id[128];
    /* the CPU sum's rendezvous */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived;
    unsigned generation;
    atomic_int aborted;
    /* the spinning rendezvous before each NCCL all-reduce */
    atomic_int sarrived;
    atomic_uint sgen;
    float *buf[HYLA_TP_MAX];
    size_t n[HYLA_TP_MAX];
    /* the CPU's sums onto x: each rank's two partial buffers (backend memory, ONESHOT_ROWS rows) */
    float *onto[HYLA_TP_MAX][2];
    /* the peer sums that overlap compute (hyla_cuda_psum; NULL: none): how many sums each rank
     * has made ready and has issued, so that no rank waits for an event not yet recorded */
    hyla_cuda_psum *psum;
    atomic_uint pready[HYLA_TP_MAX], pissued[HYLA_TP_MAX];
    /* the ranks' threads (1..T-1), started once: hyla_tp_run posts a job and waits */
    pthread_t th[HYLA_TP_MAX];
    int n_threads;
    pthread_mutex_t jmu;
    pthread_cond_t jcv, dcv;
    unsigned job_gen;
    int job_pending, quit;
    struct rank_job *jobs;
    /* what hyla_tp_open made (freed by hyla_tp_close) */
    hyla_backend *own_be[HYLA_TP_MAX];
    hyla_model *own_m[HYLA_TP_MAX];
    int owned;
};

/* All ranks meet; HYLA_ERR_CANCELLED once the group is aborted. */
static hyla_status rendezvous(struct hyla_tp_group *g) {
    pthread_mutex_lock(&g->mu);
    unsigned gen = g->generation;
    if (!g->aborted && ++g->arrived == g->T) {
        g->arrived = 0;
        g->generation++;
        pthread_cond_broadcast(&g->cv);
    } else {
        while (gen == g->generation && !g->aborted) pthread_cond_wait(&g->cv, &g->mu);
    }
    int ab = g->aborted;
    pthread_mutex_unlock(&g->mu);
    return ab ? hyla_fail(HYLA_ERR_CANCELLED, "another rank of the tensor-parallel group failed") : HYLA_OK;
}

static void abort_group(struct hyla_tp_group *g) {
    pthread_mutex_lock(&g->mu);
    g->aborted = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

/* The CPU sums' meeting: every rank arrives with its count of n values, which must agree. */
static hyla_status cpu_meet(rank_ref *r, size_t n) {
    struct hyla_tp_group *g = r->g;
    g->n[r->rank] = n;
    HYLA_TRY(rendezvous(g));
    for (int t = 0; t < g->T; t++)
        if (g->n[t] != n) {
            abort_group(g);
            return hyla_fail(HYLA_ERR_INTERNAL, "tensor-parallel sum: rank %d sums %zu values, rank %d %zu", r->rank, n,
                             t, g->n[t]);
        }
    return HYLA_OK;
}

static hyla_status cpu_allreduce(void *ud, float *buf, size_t n) {
    rank_ref *r = ud;
    struct hyla_tp_group *g = r->g;
    g->buf[r->rank] = buf;
    HYLA_TRY(cpu_meet(r, n));
    float *sum = malloc((n ? n : 1) * sizeof *sum);
    if (!sum) {
        abort_group(g);
        return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    }
    memcpy(sum, g->buf[0], n * sizeof *sum);
    for (int t = 1; t < g->T; t++) {
        const float *b = g->buf[t];
        for (size_t i = 0; i < n; i++) sum[i] += b[i];
    }
    hyla_status st = rendezvous(g);
    if (st == HYLA_OK) memcpy(buf, sum, n * sizeof *sum);
    free(sum);
    return st;
}

/* The CPU's sum onto x (hyla_runtime_set_allreduce_onto): once every rank has arrived (its
 * partial is in its buffer j), each adds the ranks' buffers j in rank order onto its x, as
 * cpu_allreduce's sum and then the norm's add would. One meeting a sum: a rank writes its buffer
 * j again two sums later, after the next sum's meeting, which no rank reaches before it has
 * read this one. */
static hyla_status cpu_allreduce_onto(void *ud, int j, float *x, size_t n) {
    rank_ref *r = ud;
    struct hyla_tp_group *g = r->g;
    HYLA_TRY(cpu_meet(r, n));
    for (size_t i = 0; i < n; i++) {
        float v = g->onto[0][j][i];
        for (int t = 1; t < g->T; t++) v += g->onto[t][j][i];
        x[i] = x[i] + v;
    }
    return HYLA_OK;
}

/* Every rank's thread reaches the all-reduce before any queues it. One process drives all the
 * GPUs, and a CUDA call that synchronises (cudaFree, a first-time allocation or plan) on one
 * rank's thread while another GPU's all-reduce kernel already waits for this rank would never
 * return: the partner kernel waits for a call this thread has not made. After the rendezvous
 * every rank queues its all-reduce at once, so a kernel in flight always has its partners. A
 * spin, not a sleep: the ranks arrive within microseconds of each other, twice per layer. */
static hyla_status spin_rendezvous(struct hyla_tp_group *g) {
    unsigned gen = atomic_load(&g->sgen);
    if (atomic_fetch_add(&g->sarrived, 1) == g->T - 1) {
        atomic_store(&g->sarrived, 0);
        atomic_fetch_add(&g->sgen, 1);
        return HYLA_OK;
    }
    for (unsigned spins = 0; atomic_load(&g->sgen) == gen; spins++) {
        if (atomic_load(&g->aborted))
            return hyla_fail(HYLA_ERR_CANCELLED, "another rank of the tensor-parallel group failed");
        if (spins > 4096) sched_yield();
    }
    return HYLA_OK;
}

/* Before a rank's thread waits for another's: launch what its graph log holds. A one-shot sum
 * (below) logged here may be what the other rank's GPU, and so a CUDA call the other thread is
 * blocked in, waits for. */
static hyla_status flush_own(rank_ref *r) {
    return r->g->cuda && hyla_cuda_flush ? hyla_cuda_flush(r->g->rt[r->rank]->be) : HYLA_OK;
}

static hyla_status nccl_allreduce(void *ud, float *buf, size_t n) {
    rank_ref *r = ud;
    HYLA_TRY(flush_own(r));
    HYLA_TRY(spin_rendezvous(r->g));
    return hyla_cuda_nccl_allreduce(r->g->rt[r->rank]->be, r->g->link[r->rank], buf, n);
}

/* Until every rank's counter has passed seq (wrap-safe), or the group is aborted. */
static hyla_status spin_until(struct hyla_tp_group *g, atomic_uint *count, unsigned seq) {
    for (int t = 0; t < g->T; t++)
        for (unsigned spins = 0; (int)(atomic_load(&count[t]) - (seq + 1)) < 0; spins++) {
            if (atomic_load(&g->aborted))
                return hyla_fail(HYLA_ERR_CANCELLED, "another rank of the tensor-parallel group failed");
            if (spins > 4096) sched_yield();
        }
    return HYLA_OK;
}

/* The sums begun beside the compute stream (hyla_runtime_set_allreduce_aside): on CUDA the peer
 * sums (ready, every rank ready, issue; the join after every rank issued), the ticket the sum's
 * number; on the CPU the sum at once. */
static hyla_status psum_begin(void *ud, float *buf, size_t n, float *acc, int *ticket) {
    rank_ref *r = ud;
    struct hyla_tp_group *g = r->g;
    unsigned seq = r->psum_seq++;
    hyla_status st = hyla_cuda_psum_ready(g->psum, r->rank, seq, buf, acc, n);
    if (st == HYLA_OK) {
        atomic_store(&g->pready[r->rank], seq + 1);
        st = spin_until(g, g->pready, seq);
    }
    if (st == HYLA_OK) st = hyla_cuda_psum_issue(g->psum, r->rank, seq);
    if (st != HYLA_OK) {
        abort_group(g);
        return st;
    }
    atomic_store(&g->pissued[r->rank], seq + 1);
    *ticket = (int)seq;
    return HYLA_OK;
}

static hyla_status psum_join(void *ud, int ticket) {
    rank_ref *r = ud;
    unsigned seq = (unsigned)ticket;
    HYLA_TRY(flush_own(r));
    HYLA_TRY(spin_until(r->g, r->g->pissued, seq));
    return hyla_cuda_psum_join(r->g->psum, r->rank, seq);
}

/* A sum waited for at once through the peer sums: begun and joined. */
static hyla_status psum_allreduce(void *ud, float *buf, size_t n) {
    int ticket;
    HYLA_TRY(psum_begin(ud, buf, n, NULL, &ticket));
    return psum_join(ud, ticket);
}

/* A sum waited for at once as one kernel of the rank's stream (hyla_cuda_psum_oneshot), onto x
 * from the group's buffer j where the rank's partial was written: no host call between the
 * ranks, so it stays inside the step's CUDA graph; the ranks' kernels meet on the device. No
 * rendezvous: a rank's thread never waits for another's with logged work unlaunched (flush_own),
 * so every kernel a GPU waits for is launched or will be. The runtime takes the blocking sum
 * below for what does not fit the buffers. */
static hyla_status oneshot_onto(void *ud, int j, float *x, size_t n) {
    rank_ref *r = ud;
    return hyla_cuda_psum_oneshot(r->g->psum, r->rank, j, x, n);
}

/* The blocking sum beside the one-shot sums, for sums larger than their buffers: NCCL's with
 * two ranks (the same bits, faster for whole pieces), the peer sums with more. */
static hyla_status oneshot_allreduce(void *ud, float *buf, size_t n) {
    rank_ref *r = ud;
    return r->g->T == 2 ? nccl_allreduce(ud, buf, n) : psum_allreduce(ud, buf, n);
}

static hyla_status cpu_allreduce_begin(void *ud, float *buf, size_t n, float *acc, int *ticket) {
    *ticket = -1;
    HYLA_TRY(cpu_allreduce(ud, buf, n));
    if (acc) /* the add the norm after the sum would make: acc + sum, value by value */
        for (size_t i = 0; i < n; i++) acc[i] += buf[i];
    return HYLA_OK;
}

static hyla_status cpu_allreduce_join(void *ud, int ticket) {
    (void)ud, (void)ticket;
    return HYLA_OK;
}

int hyla_tp_size(const hyla_tp_group *g) { return g->T; }
int hyla_tp_group_size(const struct hyla_tp_group *g) { return g->T; }
hyla_runtime *hyla_tp_group_runtime(const struct hyla_tp_group *g, int r) { return g->rt[r]; }

typedef struct rank_job {
    struct hyla_tp_group *g;
    int rank;
    hyla_tp_fn fn;
    void *ud;
    hyla_status st;
    char msg[512];
} rank_job;

static void run_rank(rank_job *j) {
    hyla_status st = HYLA_OK;
    if (j->g->cuda) st = hyla_cuda_bind_thread(j->g->rt[j->rank]->be);
    if (st == HYLA_OK) st = j->fn(j->ud, j->rank);
    /* the job's logged work is launched before the job counts as done (after a failure too):
     * another rank's GPU may wait for it (a one-shot sum) while that rank's thread waits for
     * the job's end */
    if (j->g->cuda && hyla_cuda_flush) {
        hyla_status fs = hyla_cuda_flush(j->g->rt[j->rank]->be);
        if (st == HYLA_OK) st = fs;
    }
    if (st != HYLA_OK) {
        snprintf(j->msg, sizeof j->msg, "%s", hyla_last_error());
        abort_group(j->g);
    }
    j->st = st;
}

typedef struct {
    struct hyla_tp_group *g;
    int rank;
} thread_arg;

/* Rank r's thread: waits for each posted job, runs its part, reports done. */
static void *rank_thread(void *arg) {
    thread_arg a = *(thread_arg *)arg;
    free(arg);
    struct hyla_tp_group *g = a.g;
    unsigned seen = 0;
    pthread_mutex_lock(&g->jmu);
    for (;;) {
        while (!g->quit && g->job_gen == seen) pthread_cond_wait(&g->jcv, &g->jmu);
        if (g->quit) break;
        seen = g->job_gen;
        rank_job *j = &g->jobs[a.rank];
        pthread_mutex_unlock(&g->jmu);
        run_rank(j);
        pthread_mutex_lock(&g->jmu);
        if (--g->job_pending == 0) pthread_cond_signal(&g->dcv);
    }
    pthread_mutex_unlock(&g->jmu);
    return NULL;
}

hyla_status hyla_tp_run(hyla_tp_group *g, hyla_tp_fn fn, void *ud) {
    rank_job jobs[HYLA_TP_MAX];
    atomic_store(&g->aborted, 0);
    g->arrived = 0;
    atomic_store(&g->sarrived, 0);
    for (int t = 0; t < g->T; t++) jobs[t] = (rank_job){g, t, fn, ud, HYLA_OK, ""};
    pthread_mutex_lock(&g->jmu);
    g->jobs = jobs;
    g->job_pending = g->T - 1;
    g->job_gen++;
    pthread_cond_broadcast(&g->jcv);
    pthread_mutex_unlock(&g->jmu);
    run_rank(&jobs[0]);
    pthread_mutex_lock(&g->jmu);
    while (g->job_pending > 0) pthread_cond_wait(&g->dcv, &g->jmu);
    g->jobs = NULL;
    pthread_mutex_unlock(&g->jmu);
    /* the first failure that is not another rank's echo */
    int first = -1;
    for (int t = 0; t < g->T && first < 0; t++)
        if (jobs[t].st != HYLA_OK && jobs[t].st != HYLA_ERR_CANCELLED) first = t;
    for (int t = 0; t < g->T && first < 0; t++)
        if (jobs[t].st != HYLA_OK) first = t;
    if (first < 0) return HYLA_OK;
    /* a failed job may leave the ranks at different peer-sum numbers: wait out what was queued
     * and number from 0 again (no rank is inside a sum between jobs) */
    if (g->psum) {
        hyla_cuda_psum_reset(g->psum);
        for (int t = 0; t < g->T; t++) {
            g->ref[t].psum_seq = 0;
            atomic_store(&g->pready[t], 0);
            atomic_store(&g->pissued[t], 0);
            hyla_runtime_reset_allreduce_onto(g->rt[t]);
        }
    }
    return hyla_fail(jobs[first].st, "tensor-parallel rank %d: %s", first, jobs[first].msg);
}

static void stop_threads(struct hyla_tp_group *g) {
    pthread_mutex_lock(&g->jmu);
    g->quit = 1;
    pthread_cond_broadcast(&g->jcv);
    pthread_mutex_unlock(&g->jmu);
    for (int t = 1; t <= g->n_threads; t++) pthread_join(g->th[t], NULL);
    g->n_threads = 0;
}

static hyla_status join_nccl(void *ud, int rank) {
    struct hyla_tp_group *g = ud;
    return hyla_cuda_nccl_open(g->rt[rank]->be, g->nccl_id, g->T, rank, TP_JOIN_TIMEOUT_MS, &g->link[rank]);
}

hyla_status hyla_tp_group_create(hyla_runtime *const *rts, int T, hyla_tp_group **out) {
    *out = NULL;
    if (T < 2 || T > HYLA_TP_MAX)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "a tensor-parallel group has 2 to %d ranks, not %d", HYLA_TP_MAX, T);
    int ncuda = 0;
    for (int t = 0; t < T; t++) {
        int rank, size;
        hyla_model_tp(rts[t]->m, &rank, &size);
        if (rank != t || size != T)
            return hyla_fail(HYLA_ERR_INVALID_ARG, "runtime %d of the group is on shard %d of %d, not %d of %d", t, rank,
                             size, t, T);
        if (rts[t]->m->fingerprint != rts[0]->m->fingerprint)
            return hyla_fail(HYLA_ERR_MISMATCH, "the group's runtimes are on different models");
        if (rts[t]->tp) return hyla_fail(HYLA_ERR_INVALID_ARG, "runtime %d is in a tensor-parallel group already", t);
        if (rts[t]->m->layer_begin != rts[0]->m->layer_begin || rts[t]->m->layer_end != rts[0]->m->layer_end)
            return hyla_fail(HYLA_ERR_INVALID_ARG, "the group's runtimes hold different layer ranges");
        const char *be = rts[t]->be->ops->name;
        if (!strcmp(be, "cuda")) ncuda++;
        else if (strcmp(be, "cpu"))
            return hyla_fail(HYLA_ERR_UNSUPPORTED, "tensor parallelism on the %s backend is not supported", be);
    }
    if (ncuda && ncuda != T)
        return hyla_fail(HYLA_ERR_UNSUPPORTED, "a tensor-parallel group is all cpu or all cuda, not a mix");
    if (ncuda && (!hyla_cuda_nccl_open || !hyla_cuda_bind_thread))
        return hyla_fail(HYLA_ERR_UNSUPPORTED, "this build has no CUDA backend");
    struct hyla_tp_group *g = calloc(1, sizeof *g);
    if (!g) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    g->T = T;
    g->cuda = ncuda > 0;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    pthread_mutex_init(&g->jmu, NULL);
    pthread_cond_init(&g->jcv, NULL);
    pthread_cond_init(&g->dcv, NULL);
    for (int t = 0; t < T; t++) {
        g->rt[t] = rts[t];
        g->ref[t] = (rank_ref){g, t, 0};
        /* a rank's half-width decode linears of 33-64 rows run faster on the skinny kernel's
         * cluster form than on the warpgroup one's (1.68B GDN, TP = 2: B = 64 7 % per step), those
         * of 65 and more on the warpgroup forms with a producer warp (B = 96 / 128 9 % / 11 %
         * shorter than from 129 on 2 x H200); the same bits */
        if (g->cuda && hyla_cuda_set_gemm_wg_min) (void)hyla_cuda_set_gemm_wg_min(rts[t]->be, 65);
    }
    hyla_status st = HYLA_OK;
    for (int t = 1; st == HYLA_OK && t < T; t++) {
        thread_arg *a = malloc(sizeof *a);
        if (a) *a = (thread_arg){g, t};
        if (!a || pthread_create(&g->th[t], NULL, rank_thread, a)) {
            free(a);
            st = hyla_fail(HYLA_ERR_INTERNAL, "could not start the thread of tensor-parallel rank %d", t);
        } else {
            g->n_threads = t;
        }
    }
    if (g->cuda) {
        st = hyla_cuda_nccl_id(g->nccl_id);
        if (st == HYLA_OK) st = hyla_tp_run(g, join_nccl, g);
    }
    if (st != HYLA_OK) {
        hyla_tp_group_free(g);
        return hyla_fail_wrap(st, "joining the tensor-parallel group");
    }
    /* Prefill pieces in two halves whose sums overlap the other half's work (hyla_runtime.h),
     * on CUDA through the peer sums (hyla_cuda_psum.cu: copy engines, no SMs taken from the
     * compute), for every model: on two H100s the halves prefilled 128k tokens of the 1.68B GDN
     * model 9 % faster than whole pieces and, since their sums add onto x, those of the 1.3B
     * SSE-H model (attention KV) 3.5 % faster (118.6 k against 114.6 k tokens/s; BENCHMARKS.md
     * "SSE-GLA's split form, TP halves' sums onto x"). HYLA_TP_WAVE=0 turns the halves off, 1
     * on (the same bits).
     * The sums waited for at once (decode steps, short pieces): one-shot sums (kernels on
     * each rank's stream, inside the CUDA graphs, onto x from the partials where they were
     * written: pulled by one kernel, or from HYLA_TP_PUSH_MIN bytes, default 512 KiB, pushed
     * into the peers' buffers and added there; the same bits) up to ONESHOT_ROWS rows, NCCL
     * (two ranks) or peer sums above.
     * Every sum of the group then rounds alike (rank order, wherever a float falls in the
     * buffer): the halves and whole pieces must, or a prompt's bits would depend on its
     * pieces. NCCL's all-reduce is rank order only for two ranks (a + b = b + a); with more it
     * adds in an order of its own (at T = 4 its sums differ from the peer sums in every arch,
     * test_tp cuda4). HYLA_TP_SUM=oneshot|peer|nccl chooses (nccl with T > 2 gives up that
     * invariance; for measuring). Without peer access between the GPUs: NCCL, pieces whole,
     * and said. */
    const char *wave = getenv("HYLA_TP_WAVE"), *sum = getenv("HYLA_TP_SUM"), *push = getenv("HYLA_TP_PUSH_MIN");
    long long push_min = -1; /* bytes from which a one-shot sum takes the push form (-1: the default) */
    if (push && *push) {
        char *end = NULL;
        push_min = strtoll(push, &end, 10);
        if (*end || push_min < 0) {
            hyla_tp_group_free(g);
            return hyla_fail(HYLA_ERR_INVALID_ARG, "HYLA_TP_PUSH_MIN='%s': a number of bytes (0 or more)", push);
        }
    }
    int overlap = 1;
    if (wave && *wave) {
        if (strcmp(wave, "0") && strcmp(wave, "1")) {
            hyla_tp_group_free(g);
            return hyla_fail(HYLA_ERR_INVALID_ARG, "HYLA_TP_WAVE='%s': 0 (whole pieces) or 1 (halves)", wave);
        }
        overlap = wave[0] == '1';
    }
    enum { SUM_NCCL, SUM_PEER, SUM_ONESHOT } mode = SUM_ONESHOT;
    if (sum && *sum) {
        if (!strcmp(sum, "nccl")) mode = SUM_NCCL;
        else if (!strcmp(sum, "peer")) mode = SUM_PEER;
        else if (strcmp(sum, "oneshot")) {
            hyla_tp_group_free(g);
            return hyla_fail(HYLA_ERR_INVALID_ARG, "HYLA_TP_SUM='%s': oneshot, peer or nccl", sum);
        }
    }
    if ((overlap || mode != SUM_NCCL) && g->cuda) {
        hyla_backend *bes[HYLA_TP_MAX];
        for (int t = 0; t < T; t++) bes[t] = rts[t]->be;
        size_t oneshot = mode == SUM_ONESHOT ? (size_t)ONESHOT_ROWS * (size_t)rts[0]->m->cfg.hidden_size : 0;
        if (hyla_cuda_psum_open && hyla_cuda_psum_open(bes, T, oneshot, &g->psum) == HYLA_OK) {
            if (push_min >= 0) hyla_cuda_psum_set_push_min(g->psum, (size_t)push_min / sizeof(float));
        } else {
            hyla_log(HYLA_LOG_WARN, "tensor-parallel sums through NCCL only, prefill pieces whole%s: %s",
                     T > 2 ? " (with more than two ranks a row's sum may round differently with the batch's size)"
                           : "",
                     hyla_cuda_psum_open ? hyla_last_error() : "no CUDA backend in this build");
            g->psum = NULL;
            overlap = 0;
            mode = SUM_NCCL;
        }
    }
    hyla_allreduce_fn blocking = !g->cuda               ? cpu_allreduce
                                 : mode == SUM_ONESHOT ? oneshot_allreduce
                                 : mode == SUM_PEER    ? psum_allreduce
                                                       : nccl_allreduce;
    for (int t = 0; t < T; t++) {
        hyla_runtime_set_allreduce(rts[t], blocking, &g->ref[t]);
        if (mode == SUM_ONESHOT && g->psum)
            hyla_runtime_set_allreduce_onto(rts[t], oneshot_onto, hyla_cuda_psum_oneshot_buf(g->psum, t, 0),
                                             hyla_cuda_psum_oneshot_buf(g->psum, t, 1),
                                             hyla_cuda_psum_oneshot_max(g->psum));
        if (!g->cuda) { /* the CPU's sums onto x, into buffers of the group's */
            const size_t max = (size_t)ONESHOT_ROWS * (size_t)rts[t]->m->cfg.hidden_size;
            for (int j = 0; j < 2; j++)
                if (rts[t]->be->ops->alloc(rts[t]->be->ctx, max * sizeof(float), (void **)&g->onto[t][j]) != HYLA_OK) {
                    hyla_status st = hyla_fail_wrap(HYLA_ERR_NOMEM, "tensor-parallel sum buffers of rank %d", t);
                    hyla_tp_group_free(g);
                    return st;
                }
            hyla_runtime_set_allreduce_onto(rts[t], cpu_allreduce_onto, g->onto[t][0], g->onto[t][1], max);
        }
        if (overlap)
            hyla_runtime_set_allreduce_aside(rts[t], g->cuda ? psum_begin : cpu_allreduce_begin,
                                             g->cuda ? psum_join : cpu_allreduce_join);
        rts[t]->tp = g;
        rts[t]->tp_rank = t;
    }
    /* A GPU group's prefill pieces: T times the backend's piece, up to HYLA_PREFILL_PIECE_MAX. A
     * rank's projections are 1/T as wide, so at one GPU's piece they run as smaller GEMMs, and
     * each piece's fixed costs (norms on every rank, the sums, the launches) weigh T times as
     * much. On two H200s, pieces of 32768 against 16384 took the 128k-token prefill from 1.67 x
     * to 1.72 x one GPU's rate for the 1.68B GDN model and from 1.65 x to 1.76 x for the 1.3B
     * SSE-H model, while one GPU was level or slower at 32768 (BENCHMARKS.md "Issue 19 on two
     * H200s"). Pieces do not change the bits. HYLA_PREFILL_PIECE (read by each runtime) and an
     * operator's --prefill-piece (set on the group's runtime afterwards) win. */
    const char *pe = getenv("HYLA_PREFILL_PIECE");
    if (g->cuda && !(pe && *pe))
        for (int t = 0; t < T; t++) {
            long piece = (long)hyla_runtime_prefill_piece(rts[t]) * T;
            (void)hyla_runtime_set_prefill_piece(rts[t], piece > HYLA_PREFILL_PIECE_MAX ? HYLA_PREFILL_PIECE_MAX : (int)piece);
        }
    *out = g;
    return HYLA_OK;
}

void hyla_tp_group_free(hyla_tp_group *g) {
    if (!g) return;
    stop_threads(g);
    for (int t = 0; t < g->T; t++) {
        if (g->rt[t]->allreduce_ud == &g->ref[t]) {
            hyla_runtime_set_allreduce(g->rt[t], NULL, NULL);
            hyla_runtime_set_allreduce_aside(g->rt[t], NULL, NULL);
            hyla_runtime_set_allreduce_onto(g->rt[t], NULL, NULL, NULL, 0);
        }
        if (g->rt[t]->tp == g) g->rt[t]->tp = NULL;
        if (g->link[t]) hyla_cuda_nccl_close(g->link[t]);
        for (int j = 0; j < 2; j++)
            if (g->onto[t][j]) g->rt[t]->be->ops->free(g->rt[t]->be->ctx, g->onto[t][j]);
    }
    if (g->psum) hyla_cuda_psum_close(g->psum);
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->jcv);
    pthread_cond_destroy(&g->dcv);
    pthread_mutex_destroy(&g->jmu);
    free(g);
}

hyla_status hyla_tp_open(const char *dir, const char *device, int T, const hyla_model_params *params, hyla_tp_group **out) {
    *out = NULL;
    if (T < 2 || T > HYLA_TP_MAX)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "tensor-parallel size %d: must be 2 to %d", T, HYLA_TP_MAX);
    int first = 0, cuda = !strncmp(device, "cuda", 4);
    if (cuda) {
        const char *c = strchr(device, ':');
        first = c ? atoi(c + 1) : 0;
    } else if (strcmp(device, "cpu")) {
        return hyla_fail(HYLA_ERR_INVALID_ARG, "tensor parallelism needs device cpu or cuda:N, not '%s'", device);
    }
    hyla_backend *be[HYLA_TP_MAX] = {NULL};
    hyla_model *m[HYLA_TP_MAX] = {NULL};
    hyla_runtime *rt[HYLA_TP_MAX] = {NULL};
    hyla_status st = HYLA_OK;
    for (int t = 0; st == HYLA_OK && t < T; t++) {
        char dev[32];
        snprintf(dev, sizeof dev, cuda ? "cuda:%d" : "cpu", first + t);
        hyla_model_params mp = params ? *params : hyla_model_default_params();
        mp.tp_rank = t;
        mp.tp_size = T;
        st = hyla_backend_create(dev, &be[t]);
        if (st != HYLA_OK) st = hyla_fail_wrap(st, "tensor-parallel rank %d on %s", t, dev);
        if (st == HYLA_OK) st = hyla_model_load(dir, be[t], &mp, &m[t]);
        if (st == HYLA_OK) st = hyla_runtime_create(m[t], &rt[t]);
    }
    hyla_tp_group *g = NULL;
    if (st == HYLA_OK) st = hyla_tp_group_create(rt, T, &g);
    if (st != HYLA_OK) {
        for (int t = 0; t < T; t++) {
            hyla_runtime_free(rt[t]);
            hyla_model_free(m[t]);
            hyla_backend_destroy(be[t]);
        }
        return st;
    }
    g->owned = 1;
    for (int t = 0; t < T; t++) {
        g->own_be[t] = be[t];
        g->own_m[t] = m[t];
    }
    if (cuda && hyla_cuda_bind_thread) hyla_cuda_bind_thread(be[0]); /* the caller drives rank 0 */
    *out = g;
    return HYLA_OK;
}

void hyla_tp_close(hyla_tp_group *g) {
    if (!g) return;
    if (!g->owned) {
        hyla_tp_group_free(g);
        return;
    }
    hyla_runtime *rt[HYLA_TP_MAX];
    hyla_backend *be[HYLA_TP_MAX];
    hyla_model *m[HYLA_TP_MAX];
    int T = g->T;
    for (int t = 0; t < T; t++) rt[t] = g->rt[t], be[t] = g->own_be[t], m[t] = g->own_m[t];
    hyla_tp_group_free(g);
    for (int t = 0; t < T; t++) {
        if (be[t] && hyla_cuda_bind_thread && !strcmp(be[t]->ops->name, "cuda")) hyla_cuda_bind_thread(be[t]);
        hyla_runtime_free(rt[t]);
        hyla_model_free(m[t]);
        hyla_backend_destroy(be[t]);
    }
}

hyla_backend *hyla_tp_backend(const hyla_tp_group *g) { return g->rt[0]->be; }
hyla_model *hyla_tp_model(const hyla_tp_group *g) { return (hyla_model *)g->rt[0]->m; }
hyla_runtime *hyla_tp_runtime(const hyla_tp_group *g) { return g->rt[0]; }
hyla_backend *hyla_tp_rank_backend(const hyla_tp_group *g, int r) { return g->rt[r]->be; }
hyla_runtime *hyla_tp_rank_runtime(const hyla_tp_group *g, int r) { return g->rt[r]; }

/* ------------------------------------------------------------------------------------------ */
/* Snapshots */

/* The split dimension of part (layer, name) in snapshot terms (a paged part's rows follow its
 * token dimension), -1 when the part is whole on every rank; *spec_out: the shard's spec.
 * HYLA_ERR_MISMATCH when the model has no such part. */
static hyla_status part_axis(const hyla_model *m, uint32_t layer, const char *name, int *axis,
                             const hyla_part_spec **shard_spec, const hyla_part_spec **full_spec) {
    if ((int)layer < m->layer_begin || (int)layer >= m->layer_end)
        return hyla_fail(HYLA_ERR_MISMATCH, "snapshot part '%s' of layer %u: the model holds layers %d..%d", name, layer,
                         m->layer_begin, m->layer_end - 1);
    const hyla_layer *ly = &m->layers[layer];
    for (int i = 0; i < ly->n_parts; i++) {
        if (strcmp(ly->parts[i].name, name)) continue;
        const hyla_part_spec *s = &ly->parts[i], *f = &ly->full_parts[i];
        *axis = -1;
        for (uint32_t d = 0; d < s->ndim; d++)
            if (s->shape[d] != f->shape[d]) *axis = (int)d + (s->paged ? 1 : 0);
        *shard_spec = s;
        *full_spec = f;
        return HYLA_OK;
    }
    return hyla_fail(HYLA_ERR_MISMATCH, "layer %u (%s) has no state part '%s'", layer, ly->mixer->name, name);
}

/* Whether part p has the shape spec s describes (a paged part: any token count). */
static int fits(const hyla_state_part *p, const hyla_part_spec *s) {
    uint32_t off = s->paged ? 1 : 0;
    if (p->ndim != s->ndim + off || p->kind != (uint32_t)s->kind) return 0;
    for (uint32_t d = 0; d < s->ndim; d++)
        if (p->shape[d + off] != s->shape[d]) return 0;
    return 1;
}

/* A shard part's runs before its split dimension (*outer) and bytes per entry of it (*inner). */
static void runs(const hyla_state_part *p, int axis, size_t *outer, size_t *inner) {
    size_t o = 1, c = hyla_dtype_size((hyla_dtype)p->dtype);
    for (int d = 0; d < axis; d++) o *= (size_t)p->shape[d];
    for (uint32_t d = (uint32_t)axis + 1; d < p->ndim; d++) c *= (size_t)p->shape[d];
    *outer = o;
    *inner = c;
}

/* Parts of model state (the token log aside, which only rank 0's export carries), first. */
static uint32_t model_parts(const hyla_snapshot *s) {
    uint32_t n = 0;
    while (n < s->n_parts && s->parts[n].kind != HYLA_PART_TOKENS) n++;
    return n;
}

/* One part's share of one rank, joined into the merged part (the merge's copies, run in
 * parallel: the ranks' shares of a part are disjoint). */
typedef struct {
    const hyla_part_spec *ss;
    size_t outer, inner;
    int64_t len;
    void *dst;
    const void *src;
    int rank;
} merge_copy;

typedef struct {
    const merge_copy *c;
    int T;
} merge_job;

static void merge_one(void *ctx, size_t i, int tid) {
    (void)tid;
    const merge_job *j = ctx;
    const merge_copy *c = &j->c[i];
    hyla_tp_join(c->ss->tp_seg, c->outer, c->len, c->inner, j->T, c->rank, c->dst, c->src);
}

/* The merge: the parts' shapes checked and laid out first, so that the whole snapshot can be one
 * arena from rt's export buffers (rt given: reused pinned memory, nothing zero-filled or faulted
 * in page by page, as an export's), then the ranks' shares copied on the parallel loop's
 * threads. A two-GPU export of 44.5 MB spent ~9 ms in this join on one thread into fresh
 * zero-filled memory, on the decode step that ended the export. */
static hyla_status merge_rt(hyla_runtime *rt, const hyla_model *const *models, const hyla_snapshot *const *shards, int T,
                            hyla_snapshot **out) {
    *out = NULL;
    if (T < 1 || T > HYLA_TP_MAX) return hyla_fail(HYLA_ERR_INVALID_ARG, "merge of %d shards", T);
    for (int t = 0; t < T; t++) HYLA_TRY(hyla_snapshot_require_whole(shards[t], "tensor-parallel merge"));
    for (int t = 0; t < T; t++) {
        int rank, size;
        hyla_model_tp(models[t], &rank, &size);
        if (rank != t || size != T)
            return hyla_fail(HYLA_ERR_INVALID_ARG, "shard %d of the merge is on model shard %d of %d", t, rank, size);
        if (model_parts(shards[t]) != model_parts(shards[0]) || shards[t]->position != shards[0]->position)
            return hyla_fail(HYLA_ERR_MISMATCH, "the shards' snapshots differ in parts or position (rank %d)", t);
    }
    uint32_t np = model_parts(shards[0]);
    int *axes = malloc((np ? np : 1) * sizeof *axes);
    const hyla_part_spec **specs = malloc((np ? np : 1) * sizeof *specs);
    merge_copy *copies = malloc(((size_t)np * (size_t)T + 1) * sizeof *copies);
    if (!axes || !specs || !copies) {
        free(axes), free(specs), free(copies);
        return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    }
    hyla_status st = HYLA_OK;
    uint64_t arena = 0;
    for (uint32_t i = 0; st == HYLA_OK && i < np; i++) {
        const hyla_state_part *p0 = &shards[0]->parts[i];
        const hyla_part_spec *fs;
        if ((st = part_axis(models[0], p0->layer, p0->name, &axes[i], &specs[i], &fs)) != HYLA_OK) break;
        for (int t = 0; t < T && st == HYLA_OK; t++) {
            const hyla_state_part *pt = &shards[t]->parts[i];
            if (strcmp(pt->name, p0->name) || pt->layer != p0->layer || !fits(pt, specs[i]) || pt->nbytes != p0->nbytes ||
                pt->dtype != p0->dtype)
                st = hyla_fail(HYLA_ERR_MISMATCH, "layer %u part '%s' of rank %d does not fit shard %d of %d", p0->layer,
                               p0->name, t, t, T);
        }
        if (st != HYLA_OK) break;
        uint64_t whole = p0->nbytes;
        if (axes[i] >= 0 && p0->shape[axes[i]])
            whole = p0->nbytes / p0->shape[axes[i]] *
                    (uint64_t)hyla_tp_whole_len(specs[i]->tp_seg, (int64_t)p0->shape[axes[i]], T);
        arena += hyla_snapshot_arena_piece(whole);
    }
    const int32_t *tok = NULL;
    uint32_t ntok = 0;
    if (st == HYLA_OK) st = hyla_snapshot_token_log(shards[0], &tok, &ntok);
    if (ntok) arena += hyla_snapshot_arena_piece((uint64_t)ntok * sizeof(int32_t));
    hyla_snapshot *w = NULL;
    if (st == HYLA_OK && rt && arena) {
        st = hyla_export_snapshot_new(rt, (size_t)arena, &w);
    } else if (st == HYLA_OK && !(w = hyla_snapshot_create())) {
        st = hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    }
    if (st == HYLA_OK) hyla_snapshot_copy_meta(w, shards[0]);
    size_t nc = 0;
    for (uint32_t i = 0; st == HYLA_OK && i < np; i++) {
        const hyla_state_part *p0 = &shards[0]->parts[i];
        uint64_t shape[HYLA_PART_MAX_DIMS];
        memcpy(shape, p0->shape, sizeof shape);
        int axis = axes[i];
        if (axis >= 0) shape[axis] = (uint64_t)hyla_tp_whole_len(specs[i]->tp_seg, (int64_t)p0->shape[axis], T);
        hyla_state_part *wp;
        if ((st = hyla_snapshot_add_part(w, p0->layer, p0->name, (hyla_part_kind)p0->kind, (hyla_dtype)p0->dtype,
                                         p0->ndim, shape, p0->page_tokens, &wp)) != HYLA_OK)
            break;
        if (axis < 0) {
            memcpy(wp->data, p0->data, p0->nbytes);
            continue;
        }
        size_t outer, inner;
        runs(p0, axis, &outer, &inner);
        for (int t = 0; t < T; t++)
            copies[nc++] = (merge_copy){specs[i], outer, inner, (int64_t)p0->shape[axis], wp->data,
                                        shards[t]->parts[i].data, t};
    }
    if (st == HYLA_OK && nc) {
        merge_job j = {copies, T};
        hyla_parallel_for(0, nc, merge_one, &j);
    }
    if (st == HYLA_OK && ntok) {
        int32_t *d;
        if ((st = hyla_snapshot_add_token_log(w, ntok, &d)) == HYLA_OK) memcpy(d, tok, ntok * sizeof *d);
    }
    free(axes), free(specs), free(copies);
    if (st != HYLA_OK) {
        hyla_snapshot_destroy(w);
        return st;
    }
    *out = w;
    return HYLA_OK;
}

hyla_status hyla_tp_snapshot_merge(const hyla_model *const *models, const hyla_snapshot *const *shards, int T,
                                   hyla_snapshot **out) {
    return merge_rt(NULL, models, shards, T, out);
}

hyla_status hyla_tp_snapshot_merge_into_export(hyla_runtime *rt, const hyla_model *const *models,
                                               const hyla_snapshot *const *shards, int T, hyla_snapshot **out) {
    return merge_rt(rt, models, shards, T, out);
}

/* Whether part p of a whole-model snapshot goes to shard m (the token log aside: a pipeline
 * stage takes only its layers, as hyla_session_import does). */
static int split_takes(const hyla_model *m, const hyla_state_part *p) {
    if (p->kind == HYLA_PART_TOKENS) return 0;
    return p->layer == HYLA_SNAPSHOT_SESSION_LAYER || ((int)p->layer >= m->layer_begin && (int)p->layer < m->layer_end);
}

/* The cut: the parts checked and laid out first, so that with rt the shard's snapshot is one
 * arena from rt's export buffers (reused pinned memory: nothing zero-filled, and the import
 * uploads from page-locked memory), then each part's share copied. */
static hyla_status split_rt(hyla_runtime *rt, const hyla_model *m, const hyla_snapshot *whole, hyla_snapshot **out) {
    *out = NULL;
    if (whole->model_fingerprint && whole->model_fingerprint != m->fingerprint)
        return hyla_fail(HYLA_ERR_MISMATCH, "the snapshot is of another model (fingerprint %016llx, the model's %016llx)",
                         (unsigned long long)whole->model_fingerprint, (unsigned long long)m->fingerprint);
    int T = m->tp_size, r = m->tp_rank;
    hyla_status st = HYLA_OK;
    uint64_t arena = 0;
    for (uint32_t i = 0; rt && st == HYLA_OK && i < whole->n_parts; i++) {
        const hyla_state_part *p = &whole->parts[i];
        if (!split_takes(m, p)) continue;
        int axis;
        const hyla_part_spec *ss, *fs;
        if ((st = part_axis(m, p->layer, p->name, &axis, &ss, &fs)) != HYLA_OK) break;
        uint64_t n = p->nbytes;
        if (axis >= 0 && p->shape[axis]) n = p->nbytes / p->shape[axis] * ss->shape[axis - (ss->paged ? 1 : 0)];
        arena += hyla_snapshot_arena_piece(n);
    }
    const int32_t *tok = NULL;
    uint32_t ntok = 0;
    if (st == HYLA_OK) st = hyla_snapshot_token_log(whole, &tok, &ntok);
    if (ntok) arena += hyla_snapshot_arena_piece((uint64_t)ntok * sizeof(int32_t));
    HYLA_TRY(st);
    hyla_snapshot *s = NULL;
    if (rt && arena) HYLA_TRY(hyla_export_snapshot_new(rt, (size_t)arena, &s));
    else if (!(s = hyla_snapshot_create())) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    hyla_snapshot_copy_meta(s, whole);
    for (uint32_t i = 0; st == HYLA_OK && i < whole->n_parts; i++) {
        const hyla_state_part *p = &whole->parts[i];
        if (!split_takes(m, p)) continue;
        int axis;
        const hyla_part_spec *ss, *fs;
        if ((st = part_axis(m, p->layer, p->name, &axis, &ss, &fs)) != HYLA_OK) break;
        if (!fits(p, fs)) {
            st = hyla_fail(HYLA_ERR_MISMATCH, "layer %u part '%s' does not have the whole layer's shape", p->layer, p->name);
            break;
        }
        uint64_t shape[HYLA_PART_MAX_DIMS];
        memcpy(shape, p->shape, sizeof shape);
        if (axis >= 0) shape[axis] = ss->shape[axis - (ss->paged ? 1 : 0)];
        hyla_state_part *sp;
        if ((st = hyla_snapshot_add_part(s, p->layer, p->name, (hyla_part_kind)p->kind, (hyla_dtype)p->dtype, p->ndim,
                                         shape, p->page_tokens, &sp)) != HYLA_OK)
            break;
        if (axis < 0) {
            memcpy(sp->data, p->data, p->nbytes);
            continue;
        }
        size_t outer, inner;
        runs(sp, axis, &outer, &inner);
        hyla_tp_cut(ss->tp_seg, outer, (int64_t)sp->shape[axis], inner, T, r, p->data, sp->data);
    }
    if (st == HYLA_OK && ntok) {
        int32_t *d;
        if ((st = hyla_snapshot_add_token_log(s, ntok, &d)) == HYLA_OK) memcpy(d, tok, ntok * sizeof *d);
    }
    if (st != HYLA_OK) {
        hyla_snapshot_destroy(s);
        return st;
    }
    *out = s;
    return HYLA_OK;
}

hyla_status hyla_tp_snapshot_split(const hyla_model *m, const hyla_snapshot *whole, hyla_snapshot **out) {
    return split_rt(NULL, m, whole, out);
}

hyla_status hyla_tp_snapshot_split_for_import(hyla_runtime *rt, const hyla_snapshot *whole, hyla_snapshot **out) {
    return split_rt(rt, rt->m, whole, out);
}
