/* test_store_rpc.c — the StateStore gRPC service over loopback with a real RocksDB store:
 * put/get round trip bit-exact; an incremental put that sends only the new KV rows (shared
 * prefix from the base version) reads back complete and references the base's whole KV chunks,
 * one on a missing base version is refused naming it; a put under a refused epoch fails with the
 * hook's message and leaves the previous version; a version above the head is DATA_LOSS and a
 * full disk RESOURCE_EXHAUSTED (fault hook), a delete on it works; get of an unknown session is
 * NOT_FOUND; a client with a message limit below the 4 MiB pieces puts and gets in smaller pieces. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hyla_store_rpc.h"
#include "hyla_store_test.h"
#include "hyla_test.h"
#include "test_store_util.h"

static uint64_t min_epoch = 0;
static int commits = 0;

static hyla_status check_put(void *ud, const char *session, uint64_t epoch) {
    (void)ud;
    if (epoch < min_epoch)
        return hyla_fail(HYLA_ERR_PERMISSION, "session %s: placement epoch %llu is stale (current %llu)", session,
                         (unsigned long long)epoch, (unsigned long long)min_epoch);
    return HYLA_OK;
}
static void on_commit(void *ud, const char *session, uint64_t epoch, const hyla_snapshot_info *info) {
    (void)ud, (void)session, (void)epoch, (void)info;
    __atomic_add_fetch(&commits, 1, __ATOMIC_SEQ_CST);
}

int main(void) {
    char dir[] = "/tmp/hyla-test-store-rpc-XXXXXX";
    if (!mkdtemp(dir)) return 1;
    hyla_store *st = NULL;
    hyla_store_params sp = hyla_store_default_params();
    sp.codec.chunk_bytes = 32 << 10; /* 2 KV pages per chunk: an incremental put references whole ones */
    CHECK_OK(hyla_store_open(dir, &sp, &st));
    hyla_rpc_server *srv = NULL;
    CHECK_OK(hyla_rpc_server_create(NULL, &srv));
    hyla_store_rpc_hooks hooks = {check_put, on_commit, NULL};
    CHECK_OK(hyla_store_rpc_register(srv, st, &hooks));
    int port = 0;
    CHECK_OK(hyla_rpc_server_listen(srv, "127.0.0.1:0", &port));
    CHECK_OK(hyla_rpc_server_start(srv));
    char target[64];
    snprintf(target, sizeof target, "127.0.0.1:%d", port);
    hyla_rpc_client *c = NULL;
    CHECK_OK(hyla_rpc_client_create(target, NULL, &c));

    /* round trip */
    hyla_snapshot *a = tsu_make(1, 7, 300, 0xabcdef);
    hyla_snapshot_info info;
    CHECK_OK(hyla_store_rpc_put(c, "s-1", 1, a, 0, NULL, 10000, &info));
    CHECK(info.version == 1 && info.position == 300 && info.state_bytes == hyla_snapshot_bytes(a));
    hyla_snapshot *got = NULL;
    uint64_t v = 0;
    CHECK_OK(hyla_store_rpc_get(c, "s-1", 0, 10000, &got, &v));
    CHECK(v == 1 && got && hyla_snapshot_equal(a, got));
    hyla_snapshot_destroy(got);

    /* incremental: 300 -> 700 tokens, KV prefix not sent */
    hyla_status s;
    hyla_snapshot *b = tsu_make(2, 7, 700, 0xabcdef);
    CHECK_OK(hyla_store_rpc_put(c, "s-1", 1, b, 1, a, 10000, &info));
    CHECK(info.version == 2);
    CHECK_OK(hyla_store_rpc_get(c, "s-1", 2, 10000, &got, &v));
    CHECK_MSG(got && hyla_snapshot_equal(b, got), "incremental put did not read back bit-exact");
    hyla_snapshot_destroy(got);
    {
        /* the server referenced version 1's whole KV chunks (300 tokens: 2 of 128 per part) */
        hyla_manifest *m1 = NULL, *m2 = NULL;
        CHECK_OK(hyla_store_get_manifest(st, "s-1", 1, &m1, NULL));
        CHECK_OK(hyla_store_get_manifest(st, "s-1", 2, &m2, NULL));
        int same = 0;
        for (size_t i = 0; m1 && m2 && i < m1->n_chunks; i++)
            for (size_t j = 0; j < m2->n_chunks; j++)
                same += !memcmp(m1->chunks[i].key, m2->chunks[j].key, HYLA_CHUNK_KEY_BYTES) &&
                        m1->parts[m1->chunks[i].part].desc.kind == HYLA_PART_KV;
        CHECK_MSG(same == 4, "%d KV chunks of version 1 in version 2, expected 4", same);
        CHECK(info.chunks + 4 <= (m2 ? m2->n_chunks : 0));
        hyla_manifest_destroy(m1);
        hyla_manifest_destroy(m2);
    }
    /* a base version that does not exist: refused, naming it; the head stays */
    s = hyla_store_rpc_put(c, "s-1", 1, b, 99, a, 10000, NULL);
    CHECK_MSG(s == HYLA_ERR_NOT_FOUND && strstr(hyla_last_error(), "PutSnapshot s-1") &&
                  strstr(hyla_last_error(), "base version 99"),
              "%s: %s", hyla_status_str(s), hyla_last_error());

    /* stale epoch refused, previous version intact */
    min_epoch = 5;
    hyla_snapshot *c3 = tsu_make(3, 7, 800, 0xabcdef);
    s = hyla_store_rpc_put(c, "s-1", 4, c3, 0, NULL, 10000, NULL);
    CHECK(s == HYLA_ERR_PERMISSION && strstr(hyla_last_error(), "stale"));
    CHECK_OK(hyla_store_rpc_get(c, "s-1", 0, 10000, &got, &v));
    CHECK(v == 2 && got && hyla_snapshot_equal(b, got));
    hyla_snapshot_destroy(got);
    CHECK(commits == 2);

    /* a version the store numbered but no longer has: DATA_LOSS naming session and version */
    s = hyla_store_rpc_get(c, "s-1", 7, 10000, &got, &v);
    CHECK(s == HYLA_ERR_CORRUPT && got == NULL);
    CHECK_MSG(strstr(hyla_last_error(), "DATA_LOSS") && strstr(hyla_last_error(), "session s-1 version 7"), "%s",
              hyla_last_error());

    /* a full disk: RESOURCE_EXHAUSTED naming the store; the previous version stays; a delete
     * on the full store works */
    hyla_store_fault_write(1);
    s = hyla_store_rpc_put(c, "s-1", 6, c3, 0, NULL, 10000, NULL);
    hyla_store_fault_write(0);
    CHECK(s == HYLA_ERR_RESOURCE);
    CHECK_MSG(strstr(hyla_last_error(), "RESOURCE_EXHAUSTED") && strstr(hyla_last_error(), "out of disk space") &&
                  strstr(hyla_last_error(), dir),
              "%s", hyla_last_error());
    CHECK_OK(hyla_store_rpc_get(c, "s-1", 0, 10000, &got, &v));
    CHECK(v == 2 && got && hyla_snapshot_equal(b, got));
    hyla_snapshot_destroy(got);
    CHECK_OK(hyla_store_rpc_put(c, "s-full", 6, a, 0, NULL, 10000, NULL));
    hyla_store_fault_write(1);
    CHECK_OK(hyla_store_rpc_delete(c, "s-full", 0, 10000, NULL));
    hyla_store_fault_write(0);

    /* unknown session */
    s = hyla_store_rpc_get(c, "s-nope", 0, 10000, &got, &v);
    CHECK(s == HYLA_ERR_NOT_FOUND && got == NULL);

    /* a client with a 64 KiB message limit: its puts go in pieces of at most half that, and its
     * gets ask the server for such pieces (the server's own limit is 16 MiB); b is ~0.5 MB */
    {
        hyla_rpc_client_params cp = hyla_rpc_client_default_params();
        cp.max_message_bytes = 65536;
        hyla_rpc_client *small = NULL;
        CHECK_OK(hyla_rpc_client_create(target, &cp, &small));
        CHECK(hyla_snapshot_bytes(b) > 4 * 65536);
        hyla_snapshot_info si;
        CHECK_OK(hyla_store_rpc_put(small, "s-small", 9, b, 0, NULL, 10000, &si));
        CHECK_OK(hyla_store_rpc_get(small, "s-small", 0, 10000, &got, &v));
        CHECK_MSG(got && hyla_snapshot_equal(b, got), "a 64 KiB-limit client's put + get did not round-trip");
        hyla_snapshot_destroy(got);
        hyla_rpc_client_destroy(small);
    }

    /* delete */
    uint64_t nd = 0;
    CHECK_OK(hyla_store_rpc_delete(c, "s-1", 0, 10000, &nd));
    CHECK(nd >= 1);
    s = hyla_store_rpc_get(c, "s-1", 0, 10000, &got, &v);
    CHECK(s == HYLA_ERR_NOT_FOUND);

    hyla_snapshot_destroy(a);
    hyla_snapshot_destroy(b);
    hyla_snapshot_destroy(c3);
    hyla_rpc_client_destroy(c);
    hyla_rpc_server_destroy(srv);
    hyla_store_close(st);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) return 1;
    return hyla_test_done("test_store_rpc");
}
