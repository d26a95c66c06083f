/* hyla_sha256.h — SHA-256 (FIPS 180-4), for hashing API keys and deriving the cluster credential.
 *
 * A small implementation of our own so the key store depends on no crypto library; speed does not
 * matter here (a few hashes per call at most). Thread-safe: no global state. */
#ifndef HYLA_SHA256_H
#define HYLA_SHA256_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HYLA_SHA256_BYTES 32

typedef struct {
    uint32_t h[8];
    uint64_t len; /* bytes hashed so far */
    uint8_t buf[64];
    size_t n; /* bytes in buf */
} hyla_sha256_ctx;

void hyla_sha256_init(hyla_sha256_ctx *c);
void hyla_sha256_update(hyla_sha256_ctx *c, const void *data, size_t len);
void hyla_sha256_final(hyla_sha256_ctx *c, uint8_t out[HYLA_SHA256_BYTES]);
/* One-shot digest of data. */
void hyla_sha256(const void *data, size_t len, uint8_t out[HYLA_SHA256_BYTES]);

/* Lower-case hex of n bytes into out (2n+1 bytes with the NUL). */
void hyla_hex(const uint8_t *bytes, size_t n, char *out);
/* Constant-time comparison of n bytes: 1 when equal. */
int hyla_ct_equal(const void *a, const void *b, size_t n);
/* n bytes from the kernel's random source (getrandom). Returns 0, or -1 when none could be read. */
int hyla_random_bytes(void *out, size_t n);

#ifdef __cplusplus
}
#endif
#endif
