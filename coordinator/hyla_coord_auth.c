/* hyla_coord_auth.c — authentication of the coordinator: the tenant key table, the verifier the
 * rpc server calls for every call, the per-service policies, and the Admin service.
 *
 * Keys on (params.admin_key set): every call carries `authorization: Bearer KEY`. The operator
 * key and the cluster credential derived from it (hyla_auth.h) are compared in constant time;
 * a tenant key "hk_<id>_<secret>" is looked up by id and its SHA-256(salt || key) compared with
 * the record's. Policies: Sessions = a tenant key; Cluster and Admin = the operator key;
 * Coordinator and StateStore = the cluster credential (or the operator key).
 *
 * Record "k/<id>" in the session directory (little-endian):
 *   "HYLK" | u32 format version (1) | u64 created unix ms | salt[16] | SHA-256[32] | tenant bytes
 * Readers refuse another magic or version, naming what they found.
 *
 * Threading: the table is read by loop threads (verify) under a read lock and changed by Admin
 * jobs under the write lock after the synced directory write, so a revoked key is refused from
 * the moment RevokeKey returns. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_auth.h"
#include "hyla_coord_impl.h"
#include "hyla_log.h"
#include "hyla_sha256.h"

#define KEY_MAGIC "HYLK"
#define KEY_VERSION 1u
#define KEY_FIXED (4 + 4 + 8 + HYLA_AUTH_SALT_BYTES + HYLA_AUTH_HASH_BYTES)

typedef struct {
    char id[HYLA_AUTH_ID_LEN + 1];
    char tenant[64];
    uint64_t created_ms;
    uint8_t salt[HYLA_AUTH_SALT_BYTES];
    uint8_t hash[HYLA_AUTH_HASH_BYTES];
} key_rec;

struct coord_keys {
    pthread_rwlock_t lock;
    char admin[HYLA_AUTH_KEY_MAX];
    char cluster[HYLA_AUTH_KEY_MAX];
    key_rec *recs; /* sorted by id */
    size_t n, cap;
};

static int key_equal(const char *a, const char *b) {
    size_t n = strlen(a);
    return n == strlen(b) && hyla_ct_equal(a, b, n);
}

static const char *rec_id_at(const void *arr, size_t i) { return ((const key_rec *)arr)[i].id; }

static long find_locked(const coord_keys *k, const char *id) { return coord_search_ids(k->recs, k->n, rec_id_at, id); }

static void insert_locked(coord_keys *k, const key_rec *r) {
    long at = find_locked(k, r->id);
    if (at >= 0) {
        k->recs[at] = *r;
        return;
    }
    size_t pos = (size_t)(-at - 1);
    if (k->n == k->cap) {
        size_t nc = k->cap ? 2 * k->cap : 16;
        key_rec *nr = realloc(k->recs, nc * sizeof *nr);
        HYLA_ASSERT(nr);
        k->recs = nr;
        k->cap = nc;
    }
    memmove(&k->recs[pos + 1], &k->recs[pos], (k->n - pos) * sizeof *k->recs);
    k->recs[pos] = *r;
    k->n++;
}

static int verify(void *ud, const char *key, hyla_rpc_principal *out) {
    coord_keys *k = ud;
    if (key_equal(key, k->admin)) {
        out->kind = HYLA_RPC_PRINCIPAL_OPERATOR;
        snprintf(out->name, sizeof out->name, "operator");
        return 1;
    }
    if (key_equal(key, k->cluster)) {
        out->kind = HYLA_RPC_PRINCIPAL_CLUSTER;
        snprintf(out->name, sizeof out->name, "cluster");
        return 1;
    }
    char id[HYLA_AUTH_ID_LEN + 1];
    if (!hyla_auth_tenant_key_id(key, id))
        return 0;
    int ok = 0;
    pthread_rwlock_rdlock(&k->lock);
    long at = find_locked(k, id);
    if (at >= 0) {
        const key_rec *r = &k->recs[at];
        uint8_t h[HYLA_AUTH_HASH_BYTES];
        hyla_auth_hash(r->salt, key, h);
        if (hyla_ct_equal(h, r->hash, sizeof h)) {
            ok = 1;
            out->kind = HYLA_RPC_PRINCIPAL_TENANT;
            snprintf(out->name, sizeof out->name, "%s", r->tenant);
            snprintf(out->key_id, sizeof out->key_id, "%s", r->id);
        }
    }
    pthread_rwlock_unlock(&k->lock);
    return ok;
}

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static size_t encode(const key_rec *r, uint8_t *out) {
    memcpy(out, KEY_MAGIC, 4);
    put_u32(out + 4, KEY_VERSION);
    put_u64(out + 8, r->created_ms);
    memcpy(out + 16, r->salt, HYLA_AUTH_SALT_BYTES);
    memcpy(out + 16 + HYLA_AUTH_SALT_BYTES, r->hash, HYLA_AUTH_HASH_BYTES);
    size_t tl = strlen(r->tenant);
    memcpy(out + KEY_FIXED, r->tenant, tl);
    return KEY_FIXED + tl;
}

static hyla_status load_fn(void *ud, const char *id, const void *val, size_t len) {
    coord_keys *k = ud;
    const uint8_t *v = val;
    if (len < KEY_FIXED + 1 || len >= KEY_FIXED + 64 || memcmp(v, KEY_MAGIC, 4) != 0)
        return hyla_fail(HYLA_ERR_FORMAT, "session directory: key record k/%s: no %s magic or bad size (%zu bytes)",
                         id, KEY_MAGIC, len);
    uint32_t ver = (uint32_t)v[4] | (uint32_t)v[5] << 8 | (uint32_t)v[6] << 16 | (uint32_t)v[7] << 24;
    if (ver != KEY_VERSION)
        return hyla_fail(HYLA_ERR_FORMAT, "session directory: key record k/%s: format version %u, this build reads %u",
                         id, ver, KEY_VERSION);
    key_rec r;
    memset(&r, 0, sizeof r);
    if (strlen(id) != HYLA_AUTH_ID_LEN)
        return hyla_fail(HYLA_ERR_FORMAT, "session directory: key record k/%s: id is not %d hex digits", id,
                         HYLA_AUTH_ID_LEN);
    memcpy(r.id, id, HYLA_AUTH_ID_LEN + 1);
    r.created_ms = get_u64(v + 8);
    memcpy(r.salt, v + 16, HYLA_AUTH_SALT_BYTES);
    memcpy(r.hash, v + 16 + HYLA_AUTH_SALT_BYTES, HYLA_AUTH_HASH_BYTES);
    memcpy(r.tenant, v + KEY_FIXED, len - KEY_FIXED);
    insert_locked(k, &r);
    return HYLA_OK;
}

hyla_status coord_auth_setup(hyla_coord *c) {
    if (!c->p.admin_key || !c->p.admin_key[0]) {
        HYLA_WARN("coordinator: DEVELOPMENT MODE: no --admin-key-file, so no authentication: any caller may act as "
                  "any tenant (x-hyla-tenant), read every session and register workers. Never expose this port.");
        return HYLA_OK;
    }
    coord_keys *k = calloc(1, sizeof *k);
    if (!k)
        return hyla_fail(HYLA_ERR_NOMEM, "coordinator: key table");
    pthread_rwlock_init(&k->lock, NULL);
    snprintf(k->admin, sizeof k->admin, "%s", c->p.admin_key);
    hyla_auth_cluster_credential(k->admin, k->cluster);
    c->keys = k;
    HYLA_TRY(hyla_coord_dir_scan_keys(c->dir, load_fn, k));
    HYLA_TRY(hyla_rpc_server_set_auth(c->srv, verify, k));
    HYLA_TRY(hyla_rpc_server_set_policy(c->srv, SVC_SESSIONS, HYLA_RPC_POLICY_TENANT));
    /* the models served are no secret of any tenant: the HTTP gateway's GET /v1/models answers
     * every valid key, the operator's too */
    HYLA_TRY(hyla_rpc_server_set_policy(c->srv, SVC_SESSIONS "ListModels", HYLA_RPC_POLICY_ANY));
    HYLA_TRY(hyla_rpc_server_set_policy(c->srv, SVC_CLUSTER, HYLA_RPC_POLICY_OPERATOR));
    HYLA_TRY(hyla_rpc_server_set_policy(c->srv, SVC_ADMIN, HYLA_RPC_POLICY_OPERATOR));
    HYLA_TRY(hyla_rpc_server_set_policy(c->srv, SVC_COORD, HYLA_RPC_POLICY_CLUSTER));
    HYLA_TRY(hyla_rpc_server_set_policy(c->srv, "/hyla.v1.StateStore/", HYLA_RPC_POLICY_CLUSTER));
    HYLA_INFO("coordinator: API keys required (%zu tenant key(s) in the directory)", k->n);
    return HYLA_OK;
}

void coord_auth_free(hyla_coord *c) {
    coord_keys *k = c->keys;
    if (!k)
        return;
    pthread_rwlock_destroy(&k->lock);
    free(k->recs);
    memset(k, 0, sizeof *k);
    free(k);
    c->keys = NULL;
}

static int keys_off(hyla_coord *c, hyla_rpc_call *call) {
    if (c->keys)
        return 0;
    hyla_rpc_call_fail(call, HYLA_RPC_FAILED_PRECONDITION,
                       "API keys are off: start hyla-coordinator with --admin-key-file FILE");
    return 1;
}

static void info_of(const key_rec *r, Hyla__V1__ApiKeyInfo *i) {
    hyla__v1__api_key_info__init(i);
    i->key_id = (char *)r->id;
    i->tenant = (char *)r->tenant;
    i->created_unix_ms = r->created_ms;
}

void coord_do_create_key(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant) {
    (void)tenant;
    const Hyla__V1__CreateKeyRequest *req = (const Hyla__V1__CreateKeyRequest *)m;
    if (keys_off(c, call))
        return;
    if (!hyla_auth_tenant_name_ok(req->tenant)) {
        hyla_rpc_call_fail(call, HYLA_RPC_INVALID_ARGUMENT,
                           "tenant '%s': 1..63 printable characters without spaces", req->tenant);
        return;
    }
    key_rec r;
    memset(&r, 0, sizeof r);
    char key[HYLA_AUTH_KEY_MAX];
    hyla_status st = hyla_auth_new_tenant_key(key, r.id);
    if (st == HYLA_OK && hyla_random_bytes(r.salt, sizeof r.salt) != 0)
        st = hyla_fail(HYLA_ERR_IO, "key salt: no randomness from the kernel");
    if (st != HYLA_OK) {
        coord_answer_error(call, st);
        return;
    }
    snprintf(r.tenant, sizeof r.tenant, "%s", req->tenant);
    r.created_ms = (uint64_t)coord_now_ms();
    hyla_auth_hash(r.salt, key, r.hash);
    uint8_t rec[KEY_FIXED + 64];
    size_t n = encode(&r, rec);
    st = hyla_coord_dir_put_key(c->dir, r.id, rec, n);
    if (st != HYLA_OK) {
        coord_answer_error(call, st);
        return;
    }
    pthread_rwlock_wrlock(&c->keys->lock);
    insert_locked(c->keys, &r);
    pthread_rwlock_unlock(&c->keys->lock);
    HYLA_INFO("coordinator: key %s created for tenant %s", r.id, r.tenant);
    Hyla__V1__CreateKeyResponse resp = HYLA__V1__CREATE_KEY_RESPONSE__INIT;
    Hyla__V1__ApiKeyInfo info;
    info_of(&r, &info);
    resp.key = key;
    resp.info = &info;
    hyla_rpc_call_reply(call, &resp.base);
    memset(key, 0, sizeof key);
}

void coord_do_revoke_key(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant) {
    (void)tenant;
    const Hyla__V1__RevokeKeyRequest *req = (const Hyla__V1__RevokeKeyRequest *)m;
    if (keys_off(c, call))
        return;
    char id[HYLA_AUTH_ID_LEN + 1];
    if (!hyla_auth_tenant_key_id(req->key_id, id))
        snprintf(id, sizeof id, "%s", req->key_id);
    pthread_rwlock_rdlock(&c->keys->lock);
    long at = find_locked(c->keys, id);
    key_rec r;
    if (at >= 0)
        r = c->keys->recs[at];
    pthread_rwlock_unlock(&c->keys->lock);
    if (at < 0) {
        hyla_rpc_call_fail(call, HYLA_RPC_NOT_FOUND, "no API key with id '%s'", req->key_id);
        return;
    }
    hyla_status st = hyla_coord_dir_delete_key(c->dir, r.id);
    if (st != HYLA_OK) {
        coord_answer_error(call, st);
        return;
    }
    pthread_rwlock_wrlock(&c->keys->lock);
    at = find_locked(c->keys, r.id);
    if (at >= 0) {
        memmove(&c->keys->recs[at], &c->keys->recs[at + 1], (c->keys->n - (size_t)at - 1) * sizeof *c->keys->recs);
        c->keys->n--;
    }
    pthread_rwlock_unlock(&c->keys->lock);
    HYLA_INFO("coordinator: key %s of tenant %s revoked", r.id, r.tenant);
    Hyla__V1__RevokeKeyResponse resp = HYLA__V1__REVOKE_KEY_RESPONSE__INIT;
    Hyla__V1__ApiKeyInfo info;
    info_of(&r, &info);
    resp.info = &info;
    hyla_rpc_call_reply(call, &resp.base);
}

void coord_do_list_keys(hyla_coord *c, hyla_rpc_call *call, const ProtobufCMessage *m, const char *tenant) {
    (void)tenant;
    const Hyla__V1__ListKeysRequest *req = (const Hyla__V1__ListKeysRequest *)m;
    if (keys_off(c, call))
        return;
    pthread_rwlock_rdlock(&c->keys->lock);
    size_t n = c->keys->n;
    key_rec *copy = calloc(n ? n : 1, sizeof *copy);
    Hyla__V1__ApiKeyInfo *infos = calloc(n ? n : 1, sizeof *infos);
    Hyla__V1__ApiKeyInfo **ptrs = calloc(n ? n : 1, sizeof *ptrs);
    HYLA_ASSERT(copy && infos && ptrs);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (!req->tenant[0] || strcmp(req->tenant, c->keys->recs[i].tenant) == 0)
            copy[k++] = c->keys->recs[i];
    pthread_rwlock_unlock(&c->keys->lock);
    for (size_t i = 0; i < k; i++) {
        info_of(&copy[i], &infos[i]);
        ptrs[i] = &infos[i];
    }
    Hyla__V1__ListKeysResponse resp = HYLA__V1__LIST_KEYS_RESPONSE__INIT;
    resp.n_keys = k;
    resp.keys = ptrs;
    hyla_rpc_call_reply(call, &resp.base);
    free(ptrs);
    free(infos);
    free(copy);
}
