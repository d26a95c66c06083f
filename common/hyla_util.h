/* hyla_util.h — small helpers every module uses: clocks, whole-file I/O, atomic file
 * replacement, little-endian byte order, number formats (bf16/fp16 <-> fp32), and the seeded RNG whose state is
 * part of a session. No global state; all functions are thread-safe. */
#ifndef HYLA_UTIL_H
#define HYLA_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "hyla_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Monotonic seconds. */
double hyla_now(void);

/* Read a whole file. *out: caller frees with free(). Fails with an error naming the path. */
hyla_status hyla_read_file(const char *path, uint8_t **out, size_t *len);
/* Write a file durably: PATH.tmp.<pid>, write, fsync, rename over PATH, fsync the directory. */
hyla_status hyla_write_file_atomic(const char *path, const void *data, size_t len);
/* mkdir -p */
hyla_status hyla_mkdirs(const char *path);

/* Command-line numbers, strictly: the whole text is one decimal number within [lo, hi], else 0
 * (a caller names the option and the text in its own error). hyla_parse_u64 takes no sign;
 * hyla_parse_int a leading '-' only where lo < 0; hyla_parse_num any finite number. */
int hyla_parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out);
int hyla_parse_int(const char *s, long long lo, long long hi, long long *out);
int hyla_parse_num(const char *s, double lo, double hi, double *out);

/* Little-endian integers in byte buffers: every on-disk format (snapshot files, store keys and
 * records, safetensors headers) is little-endian whatever the host's byte order. */
static inline void hyla_put_le32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void hyla_put_le64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint32_t hyla_get_le32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static inline uint64_t hyla_get_le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* Number formats. bf16 is the upper half of an fp32 (round-to-nearest-even on the way down). */
static inline float hyla_bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)h << 16;
    return v.f;
}
static inline uint16_t hyla_f32_to_bf16(float f) {
    union { uint32_t u; float f; } v;
    v.f = f;
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40); /* quiet NaN */
    uint32_t rounding = 0x7fffu + ((v.u >> 16) & 1u);
    return (uint16_t)((v.u + rounding) >> 16);
}
float hyla_f16_to_f32(uint16_t h);
uint16_t hyla_f32_to_f16(float f);

/* Element types used by model files, tensors and snapshots. Values are stored on disk. */
typedef enum {
    HYLA_DT_F32 = 0,
    HYLA_DT_F16 = 1,
    HYLA_DT_BF16 = 2,
    HYLA_DT_I32 = 3,
    HYLA_DT_I64 = 4,
    HYLA_DT_U8 = 5,
    HYLA_DT_COUNT
} hyla_dtype;
size_t hyla_dtype_size(hyla_dtype dt);
const char *hyla_dtype_name(hyla_dtype dt);
/* Convert n elements of src (type st) into fp32. */
void hyla_to_f32(float *dst, const void *src, hyla_dtype st, size_t n);
/* Convert n fp32 elements into dt (F32, F16 or BF16). */
void hyla_from_f32(void *dst, hyla_dtype dt, const float *src, size_t n);

/* xoshiro256** — the RNG of sampling. Its 4 words are saved in every session snapshot. */
typedef struct {
    uint64_t s[4];
} hyla_rng;
void hyla_rng_seed(hyla_rng *r, uint64_t seed); /* splitmix64 expansion */
uint64_t hyla_rng_next(hyla_rng *r);
/* Uniform in [0, 1) with 24 random bits (exactly representable as float). */
float hyla_rng_uniform(hyla_rng *r);
/* Standard normal (Box-Muller, uses two draws). */
float hyla_rng_normal(hyla_rng *r);

#ifdef __cplusplus
}
#endif
#endif
