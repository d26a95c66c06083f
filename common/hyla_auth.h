/* hyla_auth.h — API keys: the operator key file, tenant keys, their salted hashes, and the
 * cluster credential derived from the operator key (docs/OPERATIONS.md, "Keys").
 *
 * Key shapes (printable, no spaces, fit HYLA_AUTH_KEY_MAX):
 *   operator key   "hyla-op-" + 64 hex       (random, in the --admin-key-file)
 *   tenant key     "hk_" + 16 hex id + "_" + 64 hex secret
 *   cluster cred.  "hyla-cluster-" + hex(SHA-256("hyla cluster credential v1\n" + operator key))
 * A tenant key's id names its record in the store; the store keeps SHA-256(salt || key) with a
 * random 16-byte salt, never the key. Thread-safe: no global state. */
#ifndef HYLA_AUTH_H
#define HYLA_AUTH_H

#include <stddef.h>
#include <stdint.h>

#include "hyla_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HYLA_AUTH_KEY_MAX 128   /* bytes with the NUL */
#define HYLA_AUTH_ID_LEN 16     /* hex characters of a tenant key's id */
#define HYLA_AUTH_SALT_BYTES 16
#define HYLA_AUTH_HASH_BYTES 32

/* Read the operator key from path; when the file does not exist and create is set, write a new
 * random key there (mode 0600, *created = 1). Whitespace around the key is dropped. Fails with
 * HYLA_ERR_IO naming the file, HYLA_ERR_FORMAT when it holds no usable key (under 16 or over
 * HYLA_AUTH_KEY_MAX-1 printable characters). created may be NULL. */
hyla_status hyla_auth_load_admin_key(const char *path, int create, char out[HYLA_AUTH_KEY_MAX], int *created);

/* The cluster credential of an operator key (workers and stages authenticate with it). */
void hyla_auth_cluster_credential(const char *admin_key, char out[HYLA_AUTH_KEY_MAX]);

/* A new random tenant key and its id (HYLA_AUTH_ID_LEN hex + NUL). HYLA_ERR_IO when the kernel
 * gives no randomness. */
hyla_status hyla_auth_new_tenant_key(char key[HYLA_AUTH_KEY_MAX], char id[HYLA_AUTH_ID_LEN + 1]);
/* The id of a tenant key into id; 0 when key does not have the tenant key shape. */
int hyla_auth_tenant_key_id(const char *key, char id[HYLA_AUTH_ID_LEN + 1]);

/* SHA-256(salt || key). */
void hyla_auth_hash(const uint8_t salt[HYLA_AUTH_SALT_BYTES], const char *key, uint8_t out[HYLA_AUTH_HASH_BYTES]);

/* Whether s is a valid tenant name: 1..63 printable ASCII characters without spaces. */
int hyla_auth_tenant_name_ok(const char *s);

#ifdef __cplusplus
}
#endif
#endif
