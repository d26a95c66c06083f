/* hyla_thread.c — see hyla_thread.h. hyla_parallel_for hands items out through one atomic
 * counter, so uneven items balance across threads; the threads live for one call. */
#include "hyla_thread.h"

#include <malloc.h>
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

void hyla_parallel_for(int threads, size_t n, void (*fn)(void *ctx, size_t i, int tid), void *ctx) {
    if (n == 0) return;
    int w = hyla_parallel_width(threads, n);
    par_job job = {fn, ctx, n, 0};
    par_arg args[64];
    pthread_t th[64];
    int started = 0;
    for (int t = 1; t < w; t++) {
        args[t].job = &job;
        args[t].tid = t;
        if (pthread_create(&th[t], NULL, par_worker, &args[t]) != 0) break; /* run with fewer */
        started = t;
    }
    args[0].job = &job;
    args[0].tid = 0;
    par_worker(&args[0]);
    for (int t = 1; t <= started; t++) pthread_join(th[t], NULL);
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
