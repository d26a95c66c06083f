/* hyla_bench_store.h — `hyla-bench store`: snapshot and restore throughput of the statestore
 * and the portable file for a session shaped like a 1.3B SSE-H model (JSON lines on stdout). */
#ifndef HYLA_BENCH_STORE_H
#define HYLA_BENCH_STORE_H

#ifdef __cplusplus
extern "C" {
#endif

/* argv[0] is "store". Returns the process exit status (0 ok, 1 failure, 2 usage). */
int hyla_bench_store(int argc, char **argv);

#ifdef __cplusplus
}
#endif
#endif
