/* hyla_coord_table.c — the session table: every session's record in memory, sorted by id, and
 * its mirror in the session directory on disk (hyla_coord_dir).
 *
 * Invariants.
 *   - A session is ACTIVE with a group and a placement epoch, or PAUSED (tier STORE) with
 *     neither; MOVING only while a call places it. Placement epochs only grow (one counter,
 *     persisted with the record that uses it), so a stale owner is always recognisable.
 *   - Records are written to the directory under c->mu, so memory and disk never disagree in
 *     order. A restart loads the directory back (coord_load_session_fn); a placement the crash
 *     interrupted (MOVING) comes back PAUSED.
 *   - Placement-changing operations on one session are serialized by its `busy` flag (taken by
 *     coord_acquire, on call threads only). A csess is reference-counted: the table holds one
 *     reference, each acquirer another, so a Delete never frees a record a call still reads.
 *
 * Threading: everything here runs under c->mu except coord_acquire/coord_release, which take it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hyla_coord_impl.h"
#include "hyla_log.h"

int64_t coord_now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

void coord_copy_str(char *dst, size_t cap, const char *src) { snprintf(dst, cap, "%s", src ? src : ""); }

long coord_search_ids(const void *arr, size_t n, const char *(*id_at)(const void *arr, size_t i), const char *id) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int r = strcmp(id_at(arr, mid), id);
        if (r == 0)
            return (long)mid;
        if (r < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -(long)lo - 1;
}

static const char *sess_id_at(const void *arr, size_t i) { return ((csess *const *)arr)[i]->id; }

/* Index of id, or -(insertion point) - 1. */
long coord_sess_search(const hyla_coord *c, const char *id) { return coord_search_ids(c->sess, c->n_sess, sess_id_at, id); }

csess *coord_sess_find(const hyla_coord *c, const char *id) {
    long i = coord_sess_search(c, id);
    return i >= 0 ? c->sess[i] : NULL;
}

void coord_sess_insert_locked(hyla_coord *c, csess *s) {
    long i = coord_sess_search(c, s->id);
    HYLA_ASSERT(i < 0);
    size_t at = (size_t)(-i - 1);
    if (c->n_sess == c->cap_sess) {
        size_t cap = c->cap_sess ? 2 * c->cap_sess : 64;
        csess **n = realloc(c->sess, cap * sizeof *n);
        HYLA_ASSERT(n);
        c->sess = n;
        c->cap_sess = cap;
    }
    memmove(c->sess + at + 1, c->sess + at, (c->n_sess - at) * sizeof *c->sess);
    c->sess[at] = s;
    c->n_sess++;
    s->refs++;
}

void coord_sess_unref_locked(csess *s) {
    if (--s->refs == 0)
        free(s);
}

void coord_sess_remove_locked(hyla_coord *c, csess *s) {
    long i = coord_sess_search(c, s->id);
    if (i < 0)
        return;
    memmove(c->sess + i, c->sess + i + 1, (c->n_sess - (size_t)i - 1) * sizeof *c->sess);
    c->n_sess--;
    s->deleted = 1;
    coord_sess_unref_locked(s);
}

csess *coord_sess_new(void) {
    csess *s = calloc(1, sizeof *s);
    HYLA_ASSERT(s);
    hyla__v1__snapshot_info__init(&s->snap);
    s->state = HYLA__V1__SESSION_STATE__SESSION_PAUSED;
    s->tier = HYLA__V1__TIER__TIER_STORE;
    s->created_ms = s->updated_ms = coord_now_ms();
    return s;
}

void coord_new_session_id_locked(hyla_coord *c, char *out) {
    do
        snprintf(out, SID_MAX, "s-%016llx", (unsigned long long)hyla_rng_next(&c->rng));
    while (coord_sess_find(c, out));
}

/* Take a session for a placement-changing operation: waits while another holds it. Checks the
 * tenant. On failure *out is NULL and the status names why (no such session, another tenant's,
 * deleted meanwhile). Release with coord_release. */
hyla_status coord_acquire(hyla_coord *c, const char *id, const char *tenant, csess **out) {
    *out = NULL;
    pthread_mutex_lock(&c->mu);
    csess *s = coord_sess_find(c, id);
    if (!s) {
        pthread_mutex_unlock(&c->mu);
        return hyla_fail(HYLA_ERR_NOT_FOUND, "session %s not found", id);
    }
    if (tenant && strcmp(s->tenant, tenant) != 0) {
        pthread_mutex_unlock(&c->mu);
        return hyla_fail(HYLA_ERR_PERMISSION, "session %s belongs to another tenant", id);
    }
    s->refs++;
    while (s->busy && !s->deleted)
        pthread_cond_wait(&c->cv, &c->mu);
    if (s->deleted) {
        coord_sess_unref_locked(s);
        pthread_mutex_unlock(&c->mu);
        return hyla_fail(HYLA_ERR_NOT_FOUND, "session %s was deleted", id);
    }
    s->busy = 1;
    pthread_mutex_unlock(&c->mu);
    *out = s;
    return HYLA_OK;
}

void coord_release(hyla_coord *c, csess *s) {
    pthread_mutex_lock(&c->mu);
    s->busy = 0;
    pthread_cond_broadcast(&c->cv);
    coord_sess_unref_locked(s);
    pthread_mutex_unlock(&c->mu);
}

/* Fill v from s (c->mu held); v references only its own storage. */
sess_view *coord_view_of(hyla_coord *c, const csess *s) {
    sess_view *v = malloc(sizeof *v);
    HYLA_ASSERT(v);
    pthread_mutex_lock(&c->mu);
    coord_view_make_locked(c, s, v);
    pthread_mutex_unlock(&c->mu);
    return v;
}

void coord_sess_insert_new_locked(hyla_coord *c, csess *s) {
    s->state = HYLA__V1__SESSION_STATE__SESSION_MOVING;
    s->busy = 1;
    coord_sess_insert_locked(c, s);
    s->refs++; /* the creating call's */
}

void coord_sess_drop_new_locked(hyla_coord *c, csess *s) {
    coord_sess_remove_locked(c, s);
    s->busy = 0;
    pthread_cond_broadcast(&c->cv);
    coord_sess_unref_locked(s);
}

void coord_view_make_locked(const hyla_coord *c, const csess *s, sess_view *v) {
    v->copy = *s;
    const csess *k = &v->copy;
    hyla__v1__session__init(&v->s);
    hyla__v1__sampling_params__init(&v->sp);
    v->si = k->snap;
    v->sp.temperature = k->temperature;
    v->sp.top_k = k->top_k;
    v->sp.top_p = k->top_p;
    v->s.session_id = v->copy.id;
    v->s.tenant = v->copy.tenant;
    v->s.model = v->copy.model;
    v->s.state = (Hyla__V1__SessionState)k->state;
    if (k->paused && k->state == HYLA__V1__SESSION_STATE__SESSION_ACTIVE)
        v->s.state = HYLA__V1__SESSION_STATE__SESSION_PAUSED; /* tier and group_id show the resident copy */
    v->s.tier = (Hyla__V1__Tier)k->tier;
    v->s.group_id = v->copy.group;
    v->s.position = k->position;
    v->s.generated = k->generated;
    v->s.sampling = &v->sp;
    v->s.seed = k->seed;
    v->s.last_snapshot = &v->si;
    v->s.parent_session_id = v->copy.parent;
    v->s.created_unix_ms = k->created_ms;
    v->s.updated_unix_ms = k->updated_ms;
    v->s.error = v->copy.error;
    if (c && k->group[0]) {
        cworker *m[MAX_STAGES];
        int n = coord_group_members_locked(c, k->group, m);
        for (int i = 0; i < n; i++) {
            coord_copy_str(v->wid_store[i], ID_MAX, m[i]->id);
            v->wids[i] = v->wid_store[i];
        }
        v->s.n_worker_ids = (size_t)n;
        v->s.worker_ids = v->wids;
    }
}

/* Write s's record (c->mu held). counter: also persist the epoch counter. */
hyla_status coord_persist_locked(hyla_coord *c, csess *s, int sync, int counter) {
    s->updated_ms = coord_now_ms();
    sess_view *v = malloc(sizeof *v);
    HYLA_ASSERT(v);
    coord_view_make_locked(NULL, s, v);
    hyla_status st = hyla_coord_dir_put(c->dir, &v->s, s->epoch, counter ? c->epoch_counter : 0, sync);
    free(v);
    if (st != HYLA_OK)
        HYLA_ERROR("coordinator: %s", hyla_last_error());
    return st;
}

/* Take a session off its group: it waits in the store for its next placement. */
void coord_unplace_locked(hyla_coord *c, csess *s, const char *why) {
    if (s->state != HYLA__V1__SESSION_STATE__SESSION_ACTIVE)
        return;
    HYLA_INFO("coordinator: session %s leaves group %s (%s); it resumes from snapshot version %llu", s->id, s->group,
              why, (unsigned long long)s->snap.version);
    s->state = HYLA__V1__SESSION_STATE__SESSION_PAUSED;
    s->tier = HYLA__V1__TIER__TIER_STORE;
    s->group[0] = 0;
    s->paused = 0;
    if (s->snap.version) {
        s->position = s->snap.position;
    } else {
        s->position = 0;
        s->generated = 0;
    }
    coord_persist_locked(c, s, 1, 0);
}

hyla_status coord_load_session_fn(void *ud, const Session *m, uint64_t epoch) {
    hyla_coord *c = ud;
    if (strlen(m->session_id) >= SID_MAX)
        return hyla_fail(HYLA_ERR_FORMAT, "session directory: session id '%s' is too long", m->session_id);
    csess *s = coord_sess_new();
    coord_copy_str(s->id, sizeof s->id, m->session_id);
    coord_copy_str(s->tenant, sizeof s->tenant, m->tenant);
    coord_copy_str(s->model, sizeof s->model, m->model);
    coord_copy_str(s->group, sizeof s->group, m->group_id);
    coord_copy_str(s->parent, sizeof s->parent, m->parent_session_id);
    coord_copy_str(s->error, sizeof s->error, m->error);
    s->state = m->state;
    s->tier = m->tier;
    /* paused (a resident copy is not trusted across a restart) or a placement the crash interrupted */
    if (s->state != HYLA__V1__SESSION_STATE__SESSION_ACTIVE) {
        s->state = HYLA__V1__SESSION_STATE__SESSION_PAUSED;
        s->tier = HYLA__V1__TIER__TIER_STORE;
        s->group[0] = 0;
    }
    s->position = m->position;
    s->generated = m->generated;
    s->seed = m->seed;
    s->epoch = epoch;
    if (m->sampling) {
        s->temperature = m->sampling->temperature;
        s->top_k = m->sampling->top_k;
        s->top_p = m->sampling->top_p;
    }
    if (m->last_snapshot) {
        s->snap = *m->last_snapshot;
        s->snap.base.unknown_fields = NULL;
        s->snap.base.n_unknown_fields = 0;
    }
    s->created_ms = m->created_unix_ms;
    s->updated_ms = m->updated_unix_ms;
    coord_sess_insert_locked(c, s);
    if (epoch > c->epoch_counter)
        c->epoch_counter = epoch;
    return HYLA_OK;
}

/* Reply with one page of sessions passing filter, in id order after page_token. */
void coord_list_page(hyla_coord *c, hyla_rpc_call *call, uint32_t page_size, const char *page_token, sess_filter f,
                     const void *arg, int cluster) {
    if (page_size > PAGE_MAX) {
        coord_answer_error(call, hyla_fail(HYLA_ERR_INVALID_ARG, "field page_size: %u exceeds the maximum %d",
                                           page_size, PAGE_MAX));
        return;
    }
    if (page_size == 0)
        page_size = PAGE_DEFAULT;
    if (page_token && page_token[0] && (strncmp(page_token, "after:", 6) != 0 || strlen(page_token) > 6 + SID_MAX)) {
        coord_answer_error(call, hyla_fail(HYLA_ERR_INVALID_ARG,
                                           "field page_token: '%.64s' was not issued by this server", page_token));
        return;
    }
    const char *after = page_token && page_token[0] ? page_token + 6 : NULL;
    sess_view *views = calloc(page_size, sizeof *views);
    Session **ptrs = calloc(page_size, sizeof *ptrs);
    HYLA_ASSERT(views && ptrs);
    char next[SID_MAX + 8] = "";
    uint64_t counts[4] = {0, 0, 0, 0};
    pthread_mutex_lock(&c->mu);
    size_t start = 0;
    if (after) {
        long i = coord_sess_search(c, after);
        start = i >= 0 ? (size_t)i + 1 : (size_t)(-i - 1);
    }
    uint32_t n = 0;
    for (size_t i = start; i < c->n_sess; i++) {
        const csess *s = c->sess[i];
        if (!f(c, s, arg))
            continue;
        if (n == page_size) {
            snprintf(next, sizeof next, "after:%s", views[n - 1].copy.id);
            break;
        }
        coord_view_make_locked(c, s, &views[n]);
        ptrs[n] = &views[n].s;
        n++;
    }
    if (cluster)
        for (size_t i = 0; i < c->n_sess; i++) {
            int t = c->sess[i]->state == HYLA__V1__SESSION_STATE__SESSION_ACTIVE ? c->sess[i]->tier
                                                                                 : HYLA__V1__TIER__TIER_STORE;
            if (t >= 0 && t < 4)
                counts[t]++;
        }
    pthread_mutex_unlock(&c->mu);
    if (cluster) {
        Hyla__V1__ListClusterSessionsResponse r = HYLA__V1__LIST_CLUSTER_SESSIONS_RESPONSE__INIT;
        r.n_sessions = n;
        r.sessions = ptrs;
        r.next_page_token = next;
        r.sessions_gpu = counts[HYLA__V1__TIER__TIER_GPU];
        r.sessions_host = counts[HYLA__V1__TIER__TIER_HOST];
        r.sessions_store = counts[HYLA__V1__TIER__TIER_STORE];
        hyla_rpc_call_reply(call, &r.base);
    } else {
        Hyla__V1__ListSessionsResponse r = HYLA__V1__LIST_SESSIONS_RESPONSE__INIT;
        r.n_sessions = n;
        r.sessions = ptrs;
        r.next_page_token = next;
        hyla_rpc_call_reply(call, &r.base);
    }
    free(ptrs);
    free(views);
}
