/* hyla_rpc_security.c — the process's transport security (hyla_rpc_set_security): the PEM
 * files read once at start-up, the gRPC server and channel credentials made from them, and the
 * default bearer key of clients.
 *
 * Threading: set once before any server or client exists, read-only afterwards. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc_security.h>

#include "hyla_log.h"
#include "hyla_rpc_impl.h"

static struct {
    char *bearer;
    char *cert, *key, *ca; /* PEM contents */
    int tls_server, tls_client, require_client_cert;
} sec;

static hyla_status read_pem(const char *path, const char *what, char **out) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return hyla_fail(HYLA_ERR_IO, "TLS %s %s: cannot open", what, path);
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    HYLA_ASSERT(buf);
    size_t r;
    while ((r = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += r;
        if (cap - n - 1 == 0) {
            cap *= 2;
            buf = realloc(buf, cap);
            HYLA_ASSERT(buf);
        }
    }
    int err = ferror(f);
    fclose(f);
    buf[n] = 0;
    if (err || n == 0 || !strstr(buf, "-----BEGIN")) {
        free(buf);
        return hyla_fail(HYLA_ERR_IO, "TLS %s %s: %s", what, path, err ? "read error" : "not a PEM file");
    }
    *out = buf;
    return HYLA_OK;
}

hyla_status hyla_rpc_set_security(const hyla_rpc_security *s) {
    HYLA_ASSERT(s);
    if ((s->tls_cert != NULL) != (s->tls_key != NULL))
        return hyla_fail(HYLA_ERR_INVALID_ARG, "TLS: --tls-cert and --tls-key go together");
    if (s->tls_require_client_cert && !s->tls_ca)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "mutual TLS needs --tls-ca (the CA of client certificates)");
    char *cert = NULL, *key = NULL, *ca = NULL;
    hyla_status st = HYLA_OK;
    if (s->tls_cert)
        st = read_pem(s->tls_cert, "certificate", &cert);
    if (st == HYLA_OK && s->tls_key)
        st = read_pem(s->tls_key, "key", &key);
    if (st == HYLA_OK && s->tls_ca)
        st = read_pem(s->tls_ca, "CA", &ca);
    if (st != HYLA_OK) {
        free(cert);
        free(key);
        free(ca);
        return st;
    }
    free(sec.bearer);
    free(sec.cert);
    free(sec.key);
    free(sec.ca);
    sec.bearer = s->bearer && s->bearer[0] ? strdup(s->bearer) : NULL;
    sec.cert = cert;
    sec.key = key;
    sec.ca = ca;
    sec.tls_server = cert != NULL;
    sec.tls_client = s->tls_client || cert || ca;
    sec.require_client_cert = s->tls_require_client_cert;
    return HYLA_OK;
}

int hyla_rpc_tls_enabled(void) { return sec.tls_server; }

const char *rpc_default_bearer(void) { return sec.bearer; }

grpc_server_credentials *rpc_server_credentials(void) {
    if (!sec.tls_server)
        return grpc_insecure_server_credentials_create();
    grpc_ssl_pem_key_cert_pair pair = {sec.key, sec.cert};
    return grpc_ssl_server_credentials_create_ex(
        sec.ca, &pair, 1,
        sec.require_client_cert ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
        NULL);
}

grpc_channel_credentials *rpc_channel_credentials(void) {
    if (!sec.tls_client)
        return grpc_insecure_credentials_create();
    grpc_ssl_pem_key_cert_pair pair = {sec.key, sec.cert};
    return grpc_ssl_credentials_create(sec.ca, sec.cert ? &pair : NULL, NULL, NULL);
}

hyla_status rpc_channel_credentials_ca(const char *ca_path, grpc_channel_credentials **out) {
    char *ca = NULL;
    HYLA_TRY(read_pem(ca_path, "CA", &ca));
    grpc_ssl_pem_key_cert_pair pair = {sec.key, sec.cert};
    *out = grpc_ssl_credentials_create(ca, sec.cert ? &pair : NULL, NULL, NULL);
    free(ca);
    return HYLA_OK;
}
