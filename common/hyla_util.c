/* hyla_util.c — see hyla_util.h. */
#include "hyla_util.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

double hyla_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

hyla_status hyla_read_file(const char *path, uint8_t **out, size_t *len) {
    *out = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return hyla_fail(errno == ENOENT ? HYLA_ERR_NOT_FOUND : HYLA_ERR_IO, "%s: %s", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0) goto io;
    long n = ftell(f);
    if (n < 0 || fseek(f, 0, SEEK_SET) != 0) goto io;
    uint8_t *buf = malloc((size_t)n + 1);
    if (!buf) {
        fclose(f);
        return hyla_fail(HYLA_ERR_NOMEM, "%s: cannot allocate %ld bytes", path, n);
    }
    if (n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        goto io;
    }
    buf[n] = 0;
    fclose(f);
    *out = buf;
    *len = (size_t)n;
    return HYLA_OK;
io:
    {
        int e = errno;
        fclose(f);
        return hyla_fail(HYLA_ERR_IO, "%s: read failed: %s", path, strerror(e));
    }
}

static hyla_status fsync_dir_of(const char *path) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", path);
    const char *dir = dirname(tmp);
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return hyla_fail(HYLA_ERR_IO, "%s: open directory: %s", dir, strerror(errno));
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    if (rc != 0) return hyla_fail(HYLA_ERR_IO, "%s: fsync directory: %s", dir, strerror(e));
    return HYLA_OK;
}

hyla_status hyla_write_file_atomic(const char *path, const void *data, size_t len) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return hyla_fail(HYLA_ERR_IO, "%s: create: %s", tmp, strerror(errno));
    const uint8_t *p = data;
    size_t left = len;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0) {
            if (errno == EINTR) continue;
            int e = errno;
            close(fd);
            unlink(tmp);
            return hyla_fail(HYLA_ERR_IO, "%s: write: %s", tmp, strerror(e));
        }
        p += w;
        left -= (size_t)w;
    }
    if (fsync(fd) != 0) {
        int e = errno;
        close(fd);
        unlink(tmp);
        return hyla_fail(HYLA_ERR_IO, "%s: fsync: %s", tmp, strerror(e));
    }
    close(fd);
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return hyla_fail(HYLA_ERR_IO, "rename %s -> %s: %s", tmp, path, strerror(e));
    }
    return fsync_dir_of(path);
}

hyla_status hyla_mkdirs(const char *path) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", path);
    size_t n = strlen(tmp);
    for (size_t i = 1; i <= n; i++) {
        if (tmp[i] == '/' || tmp[i] == 0) {
            char c = tmp[i];
            tmp[i] = 0;
            if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
                return hyla_fail(HYLA_ERR_IO, "mkdir %s: %s", tmp, strerror(errno));
            tmp[i] = c;
        }
    }
    return HYLA_OK;
}

float hyla_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    union { uint32_t u; float f; } v;
    if (exp == 0) {
        if (mant == 0) {
            v.u = sign;
        } else { /* subnormal */
            float f = ldexpf((float)mant, -24);
            return sign ? -f : f;
        }
    } else if (exp == 31) {
        v.u = sign | 0x7f800000u | (mant << 13);
    } else {
        v.u = sign | ((exp + 112) << 23) | (mant << 13);
    }
    return v.f;
}

uint16_t hyla_f32_to_f16(float f) {
    union { uint32_t u; float f; } v;
    v.f = f;
    uint32_t sign = (v.u >> 16) & 0x8000;
    uint32_t x = v.u & 0x7fffffff;
    if (x > 0x7f800000) return (uint16_t)(sign | 0x7e00);
    if (x >= 0x477ff000) return (uint16_t)(sign | 0x7c00); /* overflow -> inf */
    if (x < 0x38800000) { /* subnormal or zero */
        float a = fabsf(f);
        uint32_t m = (uint32_t)lrintf(a * 16777216.0f); /* 2^24 */
        return (uint16_t)(sign | m);
    }
    uint32_t exp = ((x >> 23) - 112) << 10;
    uint32_t mant = (x >> 13) & 0x3ff;
    uint32_t rest = x & 0x1fff;
    uint32_t h = exp | mant;
    if (rest > 0x1000 || (rest == 0x1000 && (mant & 1))) h++;
    return (uint16_t)(sign | h);
}

size_t hyla_dtype_size(hyla_dtype dt) {
    switch (dt) {
    case HYLA_DT_F32: return 4;
    case HYLA_DT_F16: return 2;
    case HYLA_DT_BF16: return 2;
    case HYLA_DT_I32: return 4;
    case HYLA_DT_I64: return 8;
    case HYLA_DT_U8: return 1;
    default: return 0;
    }
}

const char *hyla_dtype_name(hyla_dtype dt) {
    switch (dt) {
    case HYLA_DT_F32: return "F32";
    case HYLA_DT_F16: return "F16";
    case HYLA_DT_BF16: return "BF16";
    case HYLA_DT_I32: return "I32";
    case HYLA_DT_I64: return "I64";
    case HYLA_DT_U8: return "U8";
    default: return "?";
    }
}

void hyla_to_f32(float *dst, const void *src, hyla_dtype st, size_t n) {
    switch (st) {
    case HYLA_DT_F32: memcpy(dst, src, n * 4); break;
    case HYLA_DT_BF16: {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++) dst[i] = hyla_bf16_to_f32(s[i]);
        break;
    }
    case HYLA_DT_F16: {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++) dst[i] = hyla_f16_to_f32(s[i]);
        break;
    }
    default: HYLA_ASSERT(!"hyla_to_f32: unsupported dtype");
    }
}

void hyla_from_f32(void *dst, hyla_dtype dt, const float *src, size_t n) {
    switch (dt) {
    case HYLA_DT_F32: memcpy(dst, src, n * 4); break;
    case HYLA_DT_BF16: {
        uint16_t *d = dst;
        for (size_t i = 0; i < n; i++) d[i] = hyla_f32_to_bf16(src[i]);
        break;
    }
    case HYLA_DT_F16: {
        uint16_t *d = dst;
        for (size_t i = 0; i < n; i++) d[i] = hyla_f32_to_f16(src[i]);
        break;
    }
    default: HYLA_ASSERT(!"hyla_from_f32: unsupported dtype");
    }
}

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void hyla_rng_seed(hyla_rng *r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t hyla_rng_next(hyla_rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

float hyla_rng_uniform(hyla_rng *r) { return (float)(hyla_rng_next(r) >> 40) * (1.0f / 16777216.0f); }

float hyla_rng_normal(hyla_rng *r) {
    double u1 = ((hyla_rng_next(r) >> 11) + 1.0) * (1.0 / 9007199254740993.0);
    double u2 = (hyla_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

int hyla_parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out) {
    if (!s || s[0] < '0' || s[0] > '9') return 0;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end || errno || v < lo || v > hi) return 0;
    *out = v;
    return 1;
}

int hyla_parse_int(const char *s, long long lo, long long hi, long long *out) {
    if (!s || !((s[0] >= '0' && s[0] <= '9') || (s[0] == '-' && lo < 0))) return 0;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (*end || errno || v < lo || v > hi) return 0;
    *out = v;
    return 1;
}

int hyla_parse_num(const char *s, double lo, double hi, double *out) {
    if (!s || !*s) return 0;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (*end || errno || !isfinite(v) || v < lo || v > hi) return 0;
    *out = v;
    return 1;
}

