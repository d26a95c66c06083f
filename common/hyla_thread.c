/* hyla_thread.c — see hyla_thread.h. hyla_parallel_for hands items out through one atomic
 * counter, so uneven items balance across threads. Its threads are a process-wide pool started on
 * first use and kept: starting 31 threads per call (each with a fresh 8 MiB stack mapping, unmapped
 * again at exit with a TLB shootdown on every core) cost a 44 MB restore more than its decoding.
 * One call at a time owns the pool; a call made while another owns it starts threads of its own
 * for that call, as before. */
#include "hyla_thread.h"

#include <malloc.h>
#include <stdint.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int hyla_malloc_tune(void) {
    const char *e = getenv("HYLA_MALLOC_TUNE");
    if (e && !strcmp(e, "0")) return 0;
    /* 32 MiB is glibc's largest mmap threshold on 64-bit systems */
    int ok = mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1;
    ok &= mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1;
    return ok;
}

int hyla_online_cores(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (int)n;
}

int hyla_parallel_width(int threads, size_t n) {
    int t = threads > 0 ? threads : hyla_online_cores();
    if (t > 64) t = 64;
    if ((size_t)t > n) t = (int)n;
    return t < 1 ? 1 : t;
}

typedef struct {
    void (*fn)(void *ctx, size_t i, int tid);
    void *ctx;
    size_t n;
    atomic_size_t next;
} par_job;

typedef struct {
    par_job *job;
    int tid;
} par_arg;

static void *par_worker(void *a) {
    par_arg *pa = a;
    for (;;) {
        size_t i = atomic_fetch_add(&pa->job->next, 1);
        if (i >= pa->job->n) break;
        pa->job->fn(pa->job->ctx, i, pa->tid);
    }
    return NULL;
}

/* The pool. Thread t (1..63) runs part of the job of every generation while t < width. */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    int n;           /* pool threads started: tids 1..n */
    unsigned gen;    /* bumped for every job */
    par_job *job;
    int width;       /* the job's threads, the caller's (tid 0) included */
    int active;      /* pool threads still working on the job */
    int busy;        /* a call owns the pool */
    int atfork;      /* the fork handler is registered */
} g_pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, NULL, 0, 0, 0, 0};

static unsigned g_start_gen[65]; /* the generation before the job a thread was started for */

static void *pool_main(void *arg) {
    int tid = (int)(intptr_t)arg;
    pthread_mutex_lock(&g_pool.mu);
    unsigned seen = g_start_gen[tid];
    for (;;) {
        while (g_pool.gen == seen) pthread_cond_wait(&g_pool.work, &g_pool.mu);
        seen = g_pool.gen;
        if (tid >= g_pool.width) continue;
        par_arg a = {g_pool.job, tid};
        pthread_mutex_unlock(&g_pool.mu);
        par_worker(&a);
        pthread_mutex_lock(&g_pool.mu);
        if (--g_pool.active == 0) pthread_cond_signal(&g_pool.done);
    }
    return NULL;
}

/* A forked child has only the forking thread: it starts a pool of its own if it needs one. */
static void pool_after_fork(void) {
    pthread_mutex_init(&g_pool.mu, NULL);
    pthread_cond_init(&g_pool.work, NULL);
    pthread_cond_init(&g_pool.done, NULL);
    g_pool.n = g_pool.active = g_pool.busy = g_pool.width = 0;
    g_pool.job = NULL;
}

/* The call's own threads, for a call made while another owns the pool. */
static void parallel_spawn(par_job *job, int w) {
    par_arg args[64];
    pthread_t th[64];
    int started = 0;
    for (int t = 1; t < w; t++) {
        args[t].job = job;
        args[t].tid = t;
        if (pthread_create(&th[t], NULL, par_worker, &args[t]) != 0) break; /* run with fewer */
        started = t;
    }
    args[0].job = job;
    args[0].tid = 0;
    par_worker(&args[0]);
    for (int t = 1; t <= started; t++) pthread_join(th[t], NULL);
}

void hyla_parallel_for(int threads, size_t n, void (*fn)(void *ctx, size_t i, int tid), void *ctx) {
    if (n == 0) return;
    int w = hyla_parallel_width(threads, n);
    par_job job = {fn, ctx, n, 0};
    if (w == 1) {
        par_arg a = {&job, 0};
        par_worker(&a);
        return;
    }
    pthread_mutex_lock(&g_pool.mu);
    if (g_pool.busy) {
        pthread_mutex_unlock(&g_pool.mu);
        parallel_spawn(&job, w);
        return;
    }
    g_pool.busy = 1;
    if (!g_pool.atfork) g_pool.atfork = pthread_atfork(NULL, NULL, pool_after_fork) == 0;
    while (g_pool.n < w - 1) { /* started detached, kept for the life of the process */
        pthread_t t;
        pthread_attr_t at;
        if (pthread_attr_init(&at) != 0) break;
        g_start_gen[g_pool.n + 1] = g_pool.gen;
        int ok = pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED) == 0 &&
                 pthread_create(&t, &at, pool_main, (void *)(intptr_t)(g_pool.n + 1)) == 0;
        pthread_attr_destroy(&at);
        if (!ok) break; /* run with fewer */
        g_pool.n++;
    }
    if (w > g_pool.n + 1) w = g_pool.n + 1;
    g_pool.job = &job;
    g_pool.width = w;
    g_pool.active = w - 1;
    g_pool.gen++;
    pthread_cond_broadcast(&g_pool.work);
    pthread_mutex_unlock(&g_pool.mu);
    par_arg a = {&job, 0};
    par_worker(&a);
    pthread_mutex_lock(&g_pool.mu);
    while (g_pool.active) pthread_cond_wait(&g_pool.done, &g_pool.mu);
    g_pool.job = NULL;
    g_pool.busy = 0;
    pthread_mutex_unlock(&g_pool.mu);
}

int hyla_thread_start_detached(void *(*fn)(void *), void *arg) {
    pthread_t t;
    pthread_attr_t a;
    int e = pthread_attr_init(&a);
    if (e != 0) return e;
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    e = pthread_create(&t, &a, fn, arg);
    pthread_attr_destroy(&a);
    return e;
}

void hyla_cond_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, long ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(cv, mu, &ts);
}

void hyla_count_down(pthread_mutex_t *mu, pthread_cond_t *cv, int *count) {
    pthread_mutex_lock(mu);
    (*count)--;
    pthread_cond_broadcast(cv);
    pthread_mutex_unlock(mu);
}
