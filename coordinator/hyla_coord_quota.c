/* hyla_coord_quota.c — per-tenant limits: sessions in the directory, bytes their committed
 * snapshots occupy in the store, and Generate calls running at once (hyla_coord_params
 * quota_*; 0 = no limit). A call over a limit fails RESOURCE_EXHAUSTED naming the tenant, the
 * limit, its flag and the current use. Only new work is refused — CreateSession and
 * ForkSession (sessions, stored bytes), Append (stored bytes), Generate (concurrent calls) —
 * never a snapshot, a Pause or a Delete, so nothing committed is lost and a tenant over its
 * limit can always free space.
 * Stored bytes are the sum over the tenant's sessions of the head version's stored_bytes (the
 * compressed size of the whole version, shared chunks counted in each session that uses them):
 * an upper bound of what deleting them frees.
 * Threading: the session and byte checks run under c->mu (the caller holds it); the
 * generation counts have their own lock, taken with no other lock held. */
#include <stdlib.h>
#include <string.h>

#include "hyla_coord_impl.h"

struct coord_quota {
    pthread_mutex_t mu;
    struct qgen {
        char tenant[ID_MAX];
        uint32_t running;
    } *gens;
    size_t n_gens, cap_gens;
};

static void usage_locked(const hyla_coord *c, const char *tenant, uint64_t *sessions, uint64_t *bytes) {
    *sessions = *bytes = 0;
    for (size_t i = 0; i < c->n_sess; i++) {
        const csess *s = c->sess[i];
        if (s->deleted || strcmp(s->tenant, tenant)) continue;
        (*sessions)++;
        *bytes += s->snap.stored_bytes;
    }
}

static hyla_status bytes_over(const hyla_coord *c, const char *tenant, uint64_t bytes) {
    if (c->p.quota_stored_bytes && bytes >= c->p.quota_stored_bytes)
        return hyla_fail(HYLA_ERR_RESOURCE,
                         "quota: tenant %s stores %llu bytes of snapshots, at or over its limit of %llu "
                         "(--quota-stored-bytes); delete sessions to free space",
                         tenant, (unsigned long long)bytes, (unsigned long long)c->p.quota_stored_bytes);
    return HYLA_OK;
}

hyla_status coord_quota_new_session_locked(const hyla_coord *c, const char *tenant) {
    if (!c->p.quota_sessions && !c->p.quota_stored_bytes) return HYLA_OK;
    uint64_t n, bytes;
    usage_locked(c, tenant, &n, &bytes);
    if (c->p.quota_sessions && n >= c->p.quota_sessions)
        return hyla_fail(HYLA_ERR_RESOURCE,
                         "quota: tenant %s has %llu sessions, its limit is %u (--quota-sessions); delete one first",
                         tenant, (unsigned long long)n, c->p.quota_sessions);
    return bytes_over(c, tenant, bytes);
}

hyla_status coord_quota_check_bytes(hyla_coord *c, const char *tenant) {
    if (!c->p.quota_stored_bytes) return HYLA_OK;
    uint64_t n, bytes;
    pthread_mutex_lock(&c->mu);
    usage_locked(c, tenant, &n, &bytes);
    pthread_mutex_unlock(&c->mu);
    return bytes_over(c, tenant, bytes);
}

hyla_status coord_quota_generate_enter(hyla_coord *c, const char *tenant) {
    struct coord_quota *q = c->quota;
    if (!c->p.quota_generations || !q) return HYLA_OK;
    pthread_mutex_lock(&q->mu);
    struct qgen *g = NULL;
    for (size_t i = 0; i < q->n_gens && !g; i++)
        if (!strcmp(q->gens[i].tenant, tenant)) g = &q->gens[i];
    if (!g) {
        if (q->n_gens == q->cap_gens) {
            size_t cap = q->cap_gens ? q->cap_gens * 2 : 16;
            struct qgen *ng = realloc(q->gens, cap * sizeof *ng);
            if (!ng) {
                pthread_mutex_unlock(&q->mu);
                return hyla_fail(HYLA_ERR_NOMEM, "quota: out of memory");
            }
            q->gens = ng;
            q->cap_gens = cap;
        }
        g = &q->gens[q->n_gens++];
        coord_copy_str(g->tenant, sizeof g->tenant, tenant);
        g->running = 0;
    }
    hyla_status st = HYLA_OK;
    if (g->running >= c->p.quota_generations)
        st = hyla_fail(HYLA_ERR_RESOURCE,
                       "quota: tenant %s has %u Generate calls running, its limit is %u (--quota-generations); "
                       "retry when one ends",
                       tenant, g->running, c->p.quota_generations);
    else
        g->running++;
    pthread_mutex_unlock(&q->mu);
    return st;
}

void coord_quota_generate_leave(hyla_coord *c, const char *tenant) {
    struct coord_quota *q = c->quota;
    if (!c->p.quota_generations || !q) return;
    pthread_mutex_lock(&q->mu);
    for (size_t i = 0; i < q->n_gens; i++)
        if (!strcmp(q->gens[i].tenant, tenant)) {
            HYLA_ASSERT(q->gens[i].running > 0);
            if (--q->gens[i].running == 0) q->gens[i] = q->gens[--q->n_gens]; /* forget idle tenants */
            break;
        }
    pthread_mutex_unlock(&q->mu);
}

hyla_status coord_quota_init(hyla_coord *c) {
    struct coord_quota *q = calloc(1, sizeof *q);
    if (!q) return hyla_fail(HYLA_ERR_NOMEM, "quota: out of memory");
    pthread_mutex_init(&q->mu, NULL);
    c->quota = q;
    return HYLA_OK;
}

void coord_quota_free(hyla_coord *c) {
    struct coord_quota *q = c->quota;
    if (!q) return;
    pthread_mutex_destroy(&q->mu);
    free(q->gens);
    free(q);
    c->quota = NULL;
}
