/* hyla_thread.h — the thread helpers every module uses: a parallel loop over pthreads, the
 * count of online cores, detached threads, and a bounded wait on a condition variable.
 *
 * Threading: every function is thread-safe. hyla_parallel_for keeps a process-wide pool of threads
 * (started on first use, kept for the life of the process); a call made while another call owns
 * the pool starts threads of its own. */
#ifndef HYLA_THREAD_H
#define HYLA_THREAD_H

#include <pthread.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Processors online (at least 1). */
int hyla_online_cores(void);

/* Threads hyla_parallel_for uses for n items: threads (0 = online cores), at most 64 and n,
 * at least 1. */
int hyla_parallel_width(int threads, size_t n);

/* Run fn(ctx, i, tid) for i in [0, n) on hyla_parallel_width(threads, n) threads, tid in
 * [0, width): per-thread scratch can be indexed by tid. The caller's thread is tid 0; returns
 * when every item is done. If a thread cannot be started, fewer run. */
void hyla_parallel_for(int threads, size_t n, void (*fn)(void *ctx, size_t i, int tid), void *ctx);

/* Start fn(arg) on a detached thread (nobody joins it). Returns 0, or the pthread_create error
 * number, in which case fn was not started and arg is still the caller's. */
int hyla_thread_start_detached(void *(*fn)(void *), void *arg);

/* pthread_cond_timedwait for at most ms milliseconds on a condition variable with the default
 * clock (CLOCK_REALTIME). The caller holds mu; returns with mu held, woken or timed out (the
 * caller re-checks its predicate). */
void hyla_cond_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, long ms);

/* Keep large blocks in the allocator instead of fresh mappings: glibc serves each allocation of
 * 128 KiB and more (RocksDB's buffer for every chunk read, zstd and codec scratch) with its
 * own mmap, which faults in every page and whose munmap interrupts every other core running the
 * process for a TLB shootdown, a cost that grows with the threads reading at once. This raises
 * the mmap threshold to 32 MiB and keeps freed memory (trim threshold 1 GiB). Call once at the
 * start of a program's main, before threads start; HYLA_MALLOC_TUNE=0 in the environment keeps
 * glibc's defaults. Returns whether it changed them. */
int hyla_malloc_tune(void);

/* Lock mu, decrement *count, wake cv's waiters, unlock: a finished job or freed context tells a
 * shutdown that waits for its count to reach zero. */
void hyla_count_down(pthread_mutex_t *mu, pthread_cond_t *cv, int *count);

#ifdef __cplusplus
}
#endif

#endif
