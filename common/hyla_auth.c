/* hyla_auth.c — operator key file, tenant key shapes, salted hashes and the cluster credential
 * (hyla_auth.h). */
#include "hyla_auth.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hyla_sha256.h"

static int printable_word(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] <= ' ' || (unsigned char)s[i] >= 0x7f)
            return 0;
    return 1;
}

static hyla_status write_new_key(const char *path, char out[HYLA_AUTH_KEY_MAX]) {
    uint8_t r[32];
    if (hyla_random_bytes(r, sizeof r) != 0)
        return hyla_fail(HYLA_ERR_IO, "admin key: no randomness from the kernel: %s", strerror(errno));
    char hex[65];
    hyla_hex(r, sizeof r, hex);
    snprintf(out, HYLA_AUTH_KEY_MAX, "hyla-op-%s", hex);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return hyla_fail(HYLA_ERR_IO, "admin key file %s: cannot create: %s", path, strerror(errno));
    char line[HYLA_AUTH_KEY_MAX + 1];
    int n = snprintf(line, sizeof line, "%s\n", out);
    ssize_t w = write(fd, line, (size_t)n);
    int ok = w == n && fsync(fd) == 0;
    int e = errno;
    close(fd);
    if (!ok) {
        unlink(path);
        return hyla_fail(HYLA_ERR_IO, "admin key file %s: cannot write: %s", path, strerror(e));
    }
    return HYLA_OK;
}

hyla_status hyla_auth_load_admin_key(const char *path, int create, char out[HYLA_AUTH_KEY_MAX], int *created) {
    if (created)
        *created = 0;
    out[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f && errno == ENOENT && create) {
        HYLA_TRY(write_new_key(path, out));
        if (created)
            *created = 1;
        return HYLA_OK;
    }
    if (!f)
        return hyla_fail(HYLA_ERR_IO, "admin key file %s: cannot open: %s", path, strerror(errno));
    char buf[HYLA_AUTH_KEY_MAX + 64];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *s = buf;
    while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r')
        s++;
    size_t len = strlen(s);
    while (len > 0 && (s[len - 1] == ' ' || s[len - 1] == '\t' || s[len - 1] == '\n' || s[len - 1] == '\r'))
        len--;
    if (len < 16 || len >= HYLA_AUTH_KEY_MAX || !printable_word(s, len))
        return hyla_fail(HYLA_ERR_FORMAT,
                         "admin key file %s: expected one key of 16..%d printable characters without spaces "
                         "(found %zu characters)",
                         path, HYLA_AUTH_KEY_MAX - 1, len);
    memcpy(out, s, len);
    out[len] = 0;
    return HYLA_OK;
}

void hyla_auth_cluster_credential(const char *admin_key, char out[HYLA_AUTH_KEY_MAX]) {
    static const char domain[] = "hyla cluster credential v1\n";
    hyla_sha256_ctx c;
    hyla_sha256_init(&c);
    hyla_sha256_update(&c, domain, sizeof domain - 1);
    hyla_sha256_update(&c, admin_key, strlen(admin_key));
    uint8_t d[HYLA_SHA256_BYTES];
    hyla_sha256_final(&c, d);
    char hex[2 * HYLA_SHA256_BYTES + 1];
    hyla_hex(d, sizeof d, hex);
    snprintf(out, HYLA_AUTH_KEY_MAX, "hyla-cluster-%s", hex);
}

hyla_status hyla_auth_new_tenant_key(char key[HYLA_AUTH_KEY_MAX], char id[HYLA_AUTH_ID_LEN + 1]) {
    uint8_t r[HYLA_AUTH_ID_LEN / 2 + 32];
    if (hyla_random_bytes(r, sizeof r) != 0)
        return hyla_fail(HYLA_ERR_IO, "tenant key: no randomness from the kernel: %s", strerror(errno));
    char secret[65];
    hyla_hex(r, HYLA_AUTH_ID_LEN / 2, id);
    hyla_hex(r + HYLA_AUTH_ID_LEN / 2, 32, secret);
    snprintf(key, HYLA_AUTH_KEY_MAX, "hk_%s_%s", id, secret);
    return HYLA_OK;
}

int hyla_auth_tenant_key_id(const char *key, char id[HYLA_AUTH_ID_LEN + 1]) {
    if (strncmp(key, "hk_", 3) != 0 || strlen(key) != 3 + HYLA_AUTH_ID_LEN + 1 + 64 || key[3 + HYLA_AUTH_ID_LEN] != '_')
        return 0;
    for (int i = 0; i < HYLA_AUTH_ID_LEN; i++) {
        char ch = key[3 + i];
        if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f')))
            return 0;
    }
    memcpy(id, key + 3, HYLA_AUTH_ID_LEN);
    id[HYLA_AUTH_ID_LEN] = 0;
    return 1;
}

void hyla_auth_hash(const uint8_t salt[HYLA_AUTH_SALT_BYTES], const char *key, uint8_t out[HYLA_AUTH_HASH_BYTES]) {
    hyla_sha256_ctx c;
    hyla_sha256_init(&c);
    hyla_sha256_update(&c, salt, HYLA_AUTH_SALT_BYTES);
    hyla_sha256_update(&c, key, strlen(key));
    hyla_sha256_final(&c, out);
}

int hyla_auth_tenant_name_ok(const char *s) {
    size_t n = strlen(s);
    return n > 0 && n < 64 && printable_word(s, n);
}
