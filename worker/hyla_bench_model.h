/* hyla_bench_model.h — the model-side subcommands of hyla-bench (worker/hyla_bench_main.c):
 *   kernels  per-op and per-mixer timings on one device (--device cpu | cuda:N)
 *   e2e      prefill and decode tokens/s of a model directory (hyla-mkmodel makes one)
 * Each prints one JSON object per measurement on stdout (progress on stderr) and returns the
 * process exit status. Timings never feed test asserts; BENCHMARKS.md records them. */
#ifndef HYLA_BENCH_MODEL_H
#define HYLA_BENCH_MODEL_H

int hyla_bench_kernels(int argc, char **argv);
int hyla_bench_e2e(int argc, char **argv);

#endif
