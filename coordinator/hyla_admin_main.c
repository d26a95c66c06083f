/* hyla_admin_main.c — `hyla-admin`: the operator's tool for tenant API keys (the Admin service).
 *
 *   hyla-admin --server ADDR --admin-key-file FILE key create --tenant T   prints the new key alone
 *   hyla-admin ... key revoke KEY_ID|KEY
 *   hyla-admin ... key ls [--tenant T]                                     id, tenant, created
 *
 * The operator key is read from FILE (never created here) and sent as the bearer. Exit status:
 * 0 success, 1 the call failed (the message names the gRPC code), 2 bad usage. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hyla_api.h"
#include "hyla_auth.h"
#include "hyla_rpc.h"

static void usage(FILE *f) {
    fprintf(f, "usage: hyla-admin [--server ADDR] --admin-key-file FILE [--tls-ca FILE [--tls-cert FILE --tls-key FILE]]\n"
               "                  key COMMAND\n"
               "  key create --tenant T      issue a key for tenant T; prints the key alone on stdout\n"
               "  key revoke KEY_ID|KEY      revoke a key: its calls fail UNAUTHENTICATED from now on\n"
               "  key ls [--tenant T]        list keys: id, tenant, creation time (never the keys)\n"
               "  --server ADDR              the coordinator (default $HYLA_SERVER or 127.0.0.1:7000)\n"
               "  --admin-key-file FILE      the coordinator's --admin-key-file (default $HYLA_ADMIN_KEY_FILE)\n"
               "  --tls-ca FILE              the coordinator serves TLS: verify it with this PEM CA\n"
               "                             (default $HYLA_TLS_CA)\n"
               "  --tls-cert FILE            with --tls-key: a client certificate (PEM) for a coordinator\n"
               "                             that asks for one (mutual TLS)\n"
               "  --tls-key FILE             the private key of --tls-cert (PEM)\n");
}

static int call(hyla_rpc_client *cl, const char *method, const ProtobufCMessage *req,
                const ProtobufCMessageDescriptor *rd, ProtobufCMessage **resp) {
    hyla_rpc_call_opts o;
    memset(&o, 0, sizeof o);
    o.timeout_ms = 15000;
    hyla_rpc_result res;
    if (hyla_rpc_client_unary(cl, method, req, rd, resp, &o, &res) != HYLA_OK) {
        fprintf(stderr, "hyla-admin: %s: %s\n", hyla_rpc_code_name(res.code), res.message);
        return 0;
    }
    return 1;
}

static void print_info(const Hyla__V1__ApiKeyInfo *i) {
    char when[64] = "";
    time_t t = (time_t)(i->created_unix_ms / 1000);
    struct tm tm;
    if (gmtime_r(&t, &tm))
        strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    printf("%s  %-24s  %s\n", i->key_id, i->tenant, when);
}

int main(int argc, char **argv) {
    const char *server = getenv("HYLA_SERVER"), *key_file = getenv("HYLA_ADMIN_KEY_FILE"), *tenant = NULL;
    hyla_rpc_security sec;
    memset(&sec, 0, sizeof sec);
    sec.tls_ca = getenv("HYLA_TLS_CA");
    if (sec.tls_ca && !sec.tls_ca[0])
        sec.tls_ca = NULL;
    const char *pos[4];
    int n_pos = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int takes = !strcmp(a, "--server") || !strcmp(a, "--admin-key-file") || !strcmp(a, "--tenant") ||
                    !strcmp(a, "--tls-ca") || !strcmp(a, "--tls-cert") || !strcmp(a, "--tls-key");
        if (takes && !v) {
            fprintf(stderr, "hyla-admin: %s needs a value\n", a);
            return 2;
        }
        if (!strcmp(a, "--server")) server = v;
        else if (!strcmp(a, "--admin-key-file")) key_file = v;
        else if (!strcmp(a, "--tenant")) tenant = v;
        else if (!strcmp(a, "--tls-ca")) sec.tls_ca = v;
        else if (!strcmp(a, "--tls-cert")) sec.tls_cert = v;
        else if (!strcmp(a, "--tls-key")) sec.tls_key = v;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if (a[0] == '-' && a[1]) { fprintf(stderr, "hyla-admin: unknown option '%s'\n", a); usage(stderr); return 2; }
        else if (n_pos < 4) pos[n_pos++] = a;
        else { fprintf(stderr, "hyla-admin: too many arguments\n"); return 2; }
        if (takes)
            i++;
    }
    if (n_pos < 2 || strcmp(pos[0], "key") != 0) {
        usage(stderr);
        return 2;
    }
    if (!key_file) {
        fprintf(stderr, "hyla-admin: --admin-key-file FILE is required (the coordinator's)\n");
        return 2;
    }
    char admin_key[HYLA_AUTH_KEY_MAX];
    if (hyla_auth_load_admin_key(key_file, 0, admin_key, NULL) != HYLA_OK) {
        fprintf(stderr, "hyla-admin: %s\n", hyla_last_error());
        return 2;
    }
    sec.bearer = admin_key;
    if (hyla_rpc_set_security(&sec) != HYLA_OK) {
        fprintf(stderr, "hyla-admin: %s\n", hyla_last_error());
        return 2;
    }
    hyla_rpc_client *cl = NULL;
    if (hyla_rpc_client_create(server && server[0] ? server : "127.0.0.1:7000", NULL, &cl) != HYLA_OK) {
        fprintf(stderr, "hyla-admin: %s\n", hyla_last_error());
        return 2;
    }
    int rc = 0;
    ProtobufCMessage *resp = NULL;
    if (!strcmp(pos[1], "create") && n_pos == 2) {
        if (!tenant) {
            fprintf(stderr, "hyla-admin: key create needs --tenant T\n");
            rc = 2;
        } else {
            Hyla__V1__CreateKeyRequest req = HYLA__V1__CREATE_KEY_REQUEST__INIT;
            req.tenant = (char *)tenant;
            if (call(cl, "/hyla.v1.Admin/CreateKey", &req.base, &hyla__v1__create_key_response__descriptor, &resp))
                printf("%s\n", ((Hyla__V1__CreateKeyResponse *)resp)->key);
            else
                rc = 1;
        }
    } else if (!strcmp(pos[1], "revoke") && n_pos == 3) {
        Hyla__V1__RevokeKeyRequest req = HYLA__V1__REVOKE_KEY_REQUEST__INIT;
        req.key_id = (char *)pos[2];
        if (call(cl, "/hyla.v1.Admin/RevokeKey", &req.base, &hyla__v1__revoke_key_response__descriptor, &resp)) {
            const Hyla__V1__RevokeKeyResponse *r = (const Hyla__V1__RevokeKeyResponse *)resp;
            fprintf(stderr, "revoked %s (tenant %s)\n", r->info ? r->info->key_id : pos[2], r->info ? r->info->tenant : "?");
        } else {
            rc = 1;
        }
    } else if (!strcmp(pos[1], "ls") && n_pos == 2) {
        Hyla__V1__ListKeysRequest req = HYLA__V1__LIST_KEYS_REQUEST__INIT;
        req.tenant = (char *)(tenant ? tenant : "");
        if (call(cl, "/hyla.v1.Admin/ListKeys", &req.base, &hyla__v1__list_keys_response__descriptor, &resp)) {
            const Hyla__V1__ListKeysResponse *r = (const Hyla__V1__ListKeysResponse *)resp;
            for (size_t i = 0; i < r->n_keys; i++)
                print_info(r->keys[i]);
        } else {
            rc = 1;
        }
    } else {
        usage(stderr);
        rc = 2;
    }
    if (resp)
        protobuf_c_message_free_unpacked(resp, NULL);
    hyla_rpc_client_destroy(cl);
    return rc;
}
