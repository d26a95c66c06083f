/* hyla-bench — benchmarks with JSON output (one JSON object per line on stdout; progress on
 * stderr). Subcommands are implemented next to the code they measure:
 *   store    statestore/hyla_bench_store.c  snapshot/restore MB/s, compression ratio
 *   kernels  worker/hyla_bench_model.c      per-op and per-mixer timings on a device
 *   e2e      worker/hyla_bench_model.c      prefill and decode tokens/s of whole models
 *   restore  worker/hyla_bench_restore.c    resume from the statestore vs prefill again
 * Timings live here and in BENCHMARKS.md, never in test asserts. */
#include <stdio.h>
#include <string.h>

#include "hyla_thread.h"

#if __has_include("hyla_bench_store.h")
#include "hyla_bench_store.h"
#define HAVE_BENCH_STORE 1
#endif
#if __has_include("hyla_bench_model.h")
#include "hyla_bench_model.h"
#define HAVE_BENCH_MODEL 1
#endif
#if __has_include("hyla_bench_restore.h")
#include "hyla_bench_restore.h"
#define HAVE_BENCH_RESTORE 1
#endif

static void usage(FILE *f) {
    fprintf(f,
            "usage: hyla-bench SUBCOMMAND [options]   (JSON results on stdout)\n"
            "subcommands:\n"
#ifdef HAVE_BENCH_STORE
            "  store     snapshot and restore throughput of the statestore\n"
#endif
#ifdef HAVE_BENCH_MODEL
            "  kernels   per-op and per-mixer timings (--device cpu|cuda:N)\n"
            "  e2e       prefill and decode tokens/s of a model configuration\n"
#endif
#ifdef HAVE_BENCH_RESTORE
            "  restore   resuming a session from the statestore vs prefilling it again\n"
#endif
            "run 'hyla-bench SUBCOMMAND --help' for its options\n");
}

int main(int argc, char **argv) {
    hyla_malloc_tune(); /* before any thread: chunk reads and writes on every core */
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
#ifdef HAVE_BENCH_STORE
    if (!strcmp(argv[1], "store")) return hyla_bench_store(argc - 1, argv + 1);
#endif
#ifdef HAVE_BENCH_MODEL
    if (!strcmp(argv[1], "kernels")) return hyla_bench_kernels(argc - 1, argv + 1);
    if (!strcmp(argv[1], "e2e")) return hyla_bench_e2e(argc - 1, argv + 1);
#endif
#ifdef HAVE_BENCH_RESTORE
    if (!strcmp(argv[1], "restore")) return hyla_bench_restore(argc - 1, argv + 1);
#endif
    fprintf(stderr, "hyla-bench: unknown subcommand '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
