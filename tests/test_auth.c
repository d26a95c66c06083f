/* test_auth.c — authentication pieces that need no cluster, and a probe for the e2e tests.
 *
 *   test_auth              SHA-256 against the FIPS 180-4 vectors; key shapes; the admin key file
 *                          (created 0600, read back, refused when malformed); the rpc layer's
 *                          central check on a real gRPC server on loopback: no key and an unknown
 *                          key -> UNAUTHENTICATED, a key of the wrong kind -> PERMISSION_DENIED
 *                          (the handler never runs), the right key -> the handler sees the
 *                          principal; a per-call authorization pair replaces the client's bearer.
 *   test_auth probe ADDR METHOD [KEY]
 *                          call METHOD (any hyla.v1 method) with an empty request and KEY as the
 *                          bearer (none without KEY); print the gRPC code name. Env HYLA_TLS_CA,
 *                          HYLA_TLS_CERT/HYLA_TLS_KEY: TLS (and a client certificate). */
#include <sys/stat.h>
#include <unistd.h>

#include "hyla_api.h"
#include "hyla_auth.h"
#include "hyla_rpc.h"
#include "hyla_sha256.h"
#include "hyla_test.h"

static int probe(const char *addr, const char *method, const char *key) {
    const hyla_api_method *m = hyla_api_find(method);
    if (!m) {
        fprintf(stderr, "probe: unknown method %s\n", method);
        return 2;
    }
    hyla_rpc_security sec;
    memset(&sec, 0, sizeof sec);
    sec.tls_ca = getenv("HYLA_TLS_CA");
    sec.tls_cert = getenv("HYLA_TLS_CERT");
    sec.tls_key = getenv("HYLA_TLS_KEY");
    sec.bearer = key;
    if (hyla_rpc_set_security(&sec) != HYLA_OK) {
        fprintf(stderr, "probe: %s\n", hyla_last_error());
        return 2;
    }
    hyla_rpc_client *c = NULL;
    if (hyla_rpc_client_create(addr, NULL, &c) != HYLA_OK) {
        fprintf(stderr, "probe: %s\n", hyla_last_error());
        return 2;
    }
    hyla_rpc_call_opts o;
    memset(&o, 0, sizeof o);
    o.timeout_ms = 10000;
    hyla_rpc_stream *s = NULL;
    hyla_rpc_result res;
    memset(&res, 0, sizeof res);
    if (hyla_rpc_stream_open(c, method, m->output, &o, &s) == HYLA_OK) {
        uint8_t empty = 0;
        if (!m->client_streaming)
            hyla_rpc_stream_write_raw(s, &empty, 0);
        hyla_rpc_stream_close_send(s);
        ProtobufCMessage *r = NULL;
        while (hyla_rpc_stream_read(s, &r) == HYLA_OK && r)
            protobuf_c_message_free_unpacked(r, NULL);
        hyla_rpc_stream_finish(s, &res);
        hyla_rpc_stream_destroy(s);
    }
    printf("%s\n", hyla_rpc_code_name(res.code));
    fprintf(stderr, "probe %s %s: %s: %s\n", addr, method, hyla_rpc_code_name(res.code), res.message);
    hyla_rpc_client_destroy(c);
    return 0;
}

static void test_sha256(void) {
    static const struct {
        const char *in, *hex;
    } v[] = {
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        uint8_t d[32];
        char hex[65];
        hyla_sha256(v[i].in, strlen(v[i].in), d);
        hyla_hex(d, 32, hex);
        CHECK_MSG(strcmp(hex, v[i].hex) == 0, "sha256(\"%s\") = %s", v[i].in, hex);
    }
    /* one million 'a', fed in uneven pieces: exercises the block buffer across updates */
    hyla_sha256_ctx c;
    hyla_sha256_init(&c);
    char a[997];
    memset(a, 'a', sizeof a);
    size_t left = 1000000;
    while (left) {
        size_t n = left < sizeof a ? left : sizeof a;
        hyla_sha256_update(&c, a, n);
        left -= n;
    }
    uint8_t d[32];
    char hex[65];
    hyla_sha256_final(&c, d);
    hyla_hex(d, 32, hex);
    CHECK(strcmp(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0") == 0);
}

static void test_keys(void) {
    char key[HYLA_AUTH_KEY_MAX], id[HYLA_AUTH_ID_LEN + 1], id2[HYLA_AUTH_ID_LEN + 1];
    CHECK_OK(hyla_auth_new_tenant_key(key, id));
    CHECK(hyla_auth_tenant_key_id(key, id2) && strcmp(id, id2) == 0);
    CHECK(!hyla_auth_tenant_key_id("hk_short", id2));
    char key2[HYLA_AUTH_KEY_MAX];
    CHECK_OK(hyla_auth_new_tenant_key(key2, id2));
    CHECK(strcmp(key, key2) != 0);
    uint8_t s1[16] = {1}, s2[16] = {2}, h1[32], h2[32];
    hyla_auth_hash(s1, key, h1);
    hyla_auth_hash(s2, key, h2);
    CHECK(memcmp(h1, h2, 32) != 0); /* salted: the same key hashes differently */
    char c1[HYLA_AUTH_KEY_MAX], c2[HYLA_AUTH_KEY_MAX];
    hyla_auth_cluster_credential("hyla-op-aaaaaaaaaaaaaaaa", c1);
    hyla_auth_cluster_credential("hyla-op-aaaaaaaaaaaaaaab", c2);
    CHECK(strncmp(c1, "hyla-cluster-", 13) == 0 && strcmp(c1, c2) != 0);
    CHECK(hyla_auth_tenant_name_ok("acme") && !hyla_auth_tenant_name_ok("a b") && !hyla_auth_tenant_name_ok(""));

    char dir[] = "/tmp/hyla-test-auth.XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[256];
    snprintf(path, sizeof path, "%s/admin.key", dir);
    char k1[HYLA_AUTH_KEY_MAX], k2[HYLA_AUTH_KEY_MAX];
    int created = 0;
    CHECK(hyla_auth_load_admin_key(path, 0, k1, NULL) == HYLA_ERR_IO); /* missing, not created */
    CHECK_OK(hyla_auth_load_admin_key(path, 1, k1, &created));
    CHECK(created == 1);
    struct stat st;
    CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0600);
    CHECK_OK(hyla_auth_load_admin_key(path, 1, k2, &created));
    CHECK(created == 0 && strcmp(k1, k2) == 0);
    FILE *f = fopen(path, "w");
    fputs("short\n", f);
    fclose(f);
    CHECK(hyla_auth_load_admin_key(path, 1, k2, NULL) == HYLA_ERR_FORMAT);
    unlink(path);
    rmdir(dir);
}

/* ---- the central check on a real server ---- */

static int verify(void *ud, const char *key, hyla_rpc_principal *out) {
    (void)ud;
    if (strcmp(key, "tenant-key-acme") == 0) {
        out->kind = HYLA_RPC_PRINCIPAL_TENANT;
        snprintf(out->name, sizeof out->name, "acme");
        return 1;
    }
    if (strcmp(key, "the-cluster-key") == 0) {
        out->kind = HYLA_RPC_PRINCIPAL_CLUSTER;
        snprintf(out->name, sizeof out->name, "cluster");
        return 1;
    }
    return 0;
}

static int g_handled;

static void h_get(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *msg, void *ud) {
    (void)msg;
    (void)ud;
    if (ev != HYLA_RPC_EV_START)
        return;
    __atomic_add_fetch(&g_handled, 1, __ATOMIC_SEQ_CST);
    const hyla_rpc_principal *p = hyla_rpc_call_principal(call);
    Hyla__V1__Session s = HYLA__V1__SESSION__INIT;
    s.tenant = (char *)(p ? p->name : "(none)");
    hyla_rpc_call_reply(call, &s.base);
}

static hyla_rpc_code call_get(hyla_rpc_client *c, const char *path, const char *const *md, char *tenant) {
    Hyla__V1__GetSessionRequest req = HYLA__V1__GET_SESSION_REQUEST__INIT;
    hyla_rpc_call_opts o;
    memset(&o, 0, sizeof o);
    o.timeout_ms = 5000;
    o.metadata = md;
    ProtobufCMessage *resp = NULL;
    hyla_rpc_result res;
    hyla_rpc_client_unary(c, path, &req.base, &hyla__v1__session__descriptor, &resp, &o, &res);
    if (resp) {
        snprintf(tenant, 64, "%s", ((Hyla__V1__Session *)resp)->tenant);
        protobuf_c_message_free_unpacked(resp, NULL);
    }
    return res.code;
}

static void test_server_check(void) {
    hyla_rpc_server *s = NULL;
    CHECK_OK(hyla_rpc_server_create(NULL, &s));
    CHECK_OK(hyla_rpc_server_add_method(s, "/hyla.v1.Sessions/GetSession", HYLA_RPC_UNARY,
                                        &hyla__v1__get_session_request__descriptor, &hyla__v1__session__descriptor,
                                        h_get, NULL));
    CHECK_OK(hyla_rpc_server_add_method(s, "/hyla.v1.StateStore/GetSession", HYLA_RPC_UNARY,
                                        &hyla__v1__get_session_request__descriptor, &hyla__v1__session__descriptor,
                                        h_get, NULL));
    CHECK_OK(hyla_rpc_server_set_auth(s, verify, NULL));
    CHECK_OK(hyla_rpc_server_set_policy(s, "/hyla.v1.Sessions/", HYLA_RPC_POLICY_TENANT));
    int port = 0;
    CHECK_OK(hyla_rpc_server_listen(s, "127.0.0.1:0", &port));
    CHECK_OK(hyla_rpc_server_start(s));
    char addr[64], tenant[64] = "";
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);

    hyla_rpc_client_params cp = hyla_rpc_client_default_params();
    hyla_rpc_client *none = NULL, *acme = NULL, *bad = NULL;
    CHECK_OK(hyla_rpc_client_create(addr, NULL, &none));
    cp.bearer = "tenant-key-acme";
    CHECK_OK(hyla_rpc_client_create(addr, &cp, &acme));
    cp.bearer = "nope";
    CHECK_OK(hyla_rpc_client_create(addr, &cp, &bad));

    const char *spoof[] = {HYLA_RPC_TENANT_KEY, "other", NULL};
    CHECK(call_get(none, "/hyla.v1.Sessions/GetSession", NULL, tenant) == HYLA_RPC_UNAUTHENTICATED);
    CHECK(call_get(bad, "/hyla.v1.Sessions/GetSession", NULL, tenant) == HYLA_RPC_UNAUTHENTICATED);
    CHECK(call_get(acme, "/hyla.v1.StateStore/GetSession", NULL, tenant) == HYLA_RPC_PERMISSION_DENIED);
    CHECK(g_handled == 0);
    CHECK(call_get(acme, "/hyla.v1.Sessions/GetSession", spoof, tenant) == HYLA_RPC_OK);
    CHECK_MSG(strcmp(tenant, "acme") == 0, "principal %s", tenant);
    const char *cluster_md[] = {HYLA_RPC_AUTH_KEY, "Bearer the-cluster-key", NULL};
    CHECK(call_get(acme, "/hyla.v1.StateStore/GetSession", cluster_md, tenant) == HYLA_RPC_OK);
    CHECK(strcmp(tenant, "cluster") == 0);
    CHECK(call_get(none, "/hyla.v1.Sessions/GetSession", cluster_md, tenant) == HYLA_RPC_PERMISSION_DENIED);
    CHECK(g_handled == 2);
    hyla_rpc_client_destroy(none);
    hyla_rpc_client_destroy(acme);
    hyla_rpc_client_destroy(bad);
    hyla_rpc_server_destroy(s);
}

int main(int argc, char **argv) {
    if (argc >= 4 && strcmp(argv[1], "probe") == 0)
        return probe(argv[2], argv[3], argc >= 5 ? argv[4] : NULL);
    test_sha256();
    test_keys();
    test_server_check();
    return hyla_test_failures ? 1 : 0;
}
