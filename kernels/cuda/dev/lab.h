/* lab.h — what the kernel lab's programs share: the check macros (a failed CUDA call or backend
 * op prints the expression, file, line and message and exits 1: these are measuring programs,
 * not servers) and the seeded uniform generator of their inputs. */
#ifndef HYLA_CUDA_DEV_LAB_H
#define HYLA_CUDA_DEV_LAB_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "hyla_status.h"

#define CK(x)                                                                                                          \
    do {                                                                                                               \
        cudaError_t e_ = (x);                                                                                          \
        if (e_ != cudaSuccess) {                                                                                       \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));                       \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)
#define HK(x)                                                                                                          \
    do {                                                                                                               \
        if ((x) != HYLA_OK) {                                                                                          \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, hyla_last_error());                            \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

/* The programs' arguments are sizes (positive numbers): --help / -h prints the usage and exits 0,
 * anything else that is not a positive number prints it to stderr and exits 2 (rather than
 * running a size of 0). */
static inline void lab_args(int argc, char **argv, const char *usage) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("%s\n", usage);
            exit(0);
        }
        char *end;
        long v = strtol(argv[i], &end, 10);
        if (end == argv[i] || *end || v < 1) {
            fprintf(stderr, "%s: not a size: '%s'\n%s\n", argv[0], argv[i], usage);
            exit(2);
        }
    }
}

/* uniform in [0, 1), 24 bits, from the state *s (a 64-bit LCG) */
static inline float frand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffffff) / 16777216.0f;
}

#endif
