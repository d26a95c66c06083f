/* hyla_bench_restore.h — `hyla-bench restore` (worker/hyla_bench_restore.c): restoring a
 * session from the statestore to the device against prefilling its tokens again. Prints one
 * JSON object per context length on stdout (progress on stderr) and returns the process exit
 * status (1 when the restored session or the re-prefill does not match the original). */
#ifndef HYLA_BENCH_RESTORE_H
#define HYLA_BENCH_RESTORE_H

int hyla_bench_restore(int argc, char **argv);

#endif
