/* test_client_fake.c — the fake Sessions + Cluster server of test_client_fake.h.
 *
 * Every handler answers at once on the loop thread (the fake does no real work), under the
 * fake's one mutex. Append keeps a per-call state (hyla_rpc_call_set_user) and answers each
 * message with a progress report; Generate queues all its messages at START and finishes. */
#include "test_client_fake.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_api.h"
#include "hyla_rpc.h"

#define MAX_SESSIONS 256

typedef struct {
    int used;
    char id[24];
    char tenant[64];
    char model[64];
    int paused;
    int group; /* 1 or 2 */
    uint64_t position, generated, seed;
    float temperature, top_p;
    int32_t top_k;
    uint64_t version;
    char parent[24];
} fsession;

struct fake_server {
    hyla_rpc_server *srv;
    pthread_mutex_t mu;
    char models[4][64];
    int n_models;
    fsession s[MAX_SESSIONS];
    uint64_t next_id;
    int fail_gen_after;
    int fail_append_after;
    uint64_t max_append_tokens;
    int drained[3];
    fake_record rec;
};

void fake_expected_text(uint64_t pos, uint64_t seed, int n, char *out) {
    for (int i = 0; i < n; i++)
        out[i] = (char)('a' + (31 * (pos + (uint64_t)i) + seed) % 26);
    out[n] = 0;
}

static const char *tenant_of(hyla_rpc_call *call) {
    const char *t = hyla_rpc_call_metadata(call, HYLA_API_TENANT_KEY);
    return t ? t : HYLA_API_DEFAULT_TENANT;
}

static void record_tenant(fake_server *f, hyla_rpc_call *call) {
    const char *t = hyla_rpc_call_metadata(call, HYLA_API_TENANT_KEY);
    snprintf(f->rec.tenant, sizeof f->rec.tenant, "%s", t ? t : "");
}

/* Find a session for this call (f->mu held); on failure the call is failed and NULL returned. */
static fsession *lookup(fake_server *f, hyla_rpc_call *call, const char *id) {
    if (!id || !id[0]) {
        hyla_rpc_call_fail(call, HYLA_RPC_INVALID_ARGUMENT, "session_id: required");
        return NULL;
    }
    for (int i = 0; i < MAX_SESSIONS; i++)
        if (f->s[i].used && strcmp(f->s[i].id, id) == 0) {
            if (strcmp(f->s[i].tenant, tenant_of(call)) != 0) {
                hyla_rpc_call_fail(call, HYLA_RPC_PERMISSION_DENIED, "session %s belongs to another tenant", id);
                return NULL;
            }
            return &f->s[i];
        }
    hyla_rpc_call_fail(call, HYLA_RPC_NOT_FOUND, "session %s not found", id);
    return NULL;
}

static fsession *new_session(fake_server *f) {
    for (int i = 0; i < MAX_SESSIONS; i++)
        if (!f->s[i].used) {
            memset(&f->s[i], 0, sizeof f->s[i]);
            f->s[i].used = 1;
            snprintf(f->s[i].id, sizeof f->s[i].id, "s-%016llx", (unsigned long long)f->next_id++);
            return &f->s[i];
        }
    return NULL;
}

/* pb views of a session; strings point into fs or static storage, valid while f->mu is held */
typedef struct {
    Hyla__V1__Session s;
    Hyla__V1__SamplingParams sp;
    Hyla__V1__SnapshotInfo snap;
    char *workers[1];
    char group[8], worker[8];
} pb_session;

static uint64_t state_bytes(const fsession *fs) { return 4096 + fs->position; }

static void to_pb(const fsession *fs, pb_session *o) {
    hyla__v1__session__init(&o->s);
    hyla__v1__sampling_params__init(&o->sp);
    hyla__v1__snapshot_info__init(&o->snap);
    o->s.session_id = (char *)fs->id;
    o->s.tenant = (char *)fs->tenant;
    o->s.model = (char *)fs->model;
    o->s.state = fs->paused ? HYLA__V1__SESSION_STATE__SESSION_PAUSED : HYLA__V1__SESSION_STATE__SESSION_ACTIVE;
    o->s.tier = fs->paused ? HYLA__V1__TIER__TIER_STORE : HYLA__V1__TIER__TIER_GPU;
    snprintf(o->group, sizeof o->group, "g-%d", fs->group);
    snprintf(o->worker, sizeof o->worker, "w-%d", fs->group);
    o->workers[0] = o->worker;
    if (!fs->paused) {
        o->s.group_id = o->group;
        o->s.n_worker_ids = 1;
        o->s.worker_ids = o->workers;
    }
    o->s.position = fs->position;
    o->s.generated = fs->generated;
    o->sp.temperature = fs->temperature;
    o->sp.top_k = fs->top_k;
    o->sp.top_p = fs->top_p;
    o->s.sampling = &o->sp;
    o->s.seed = fs->seed;
    o->snap.version = fs->version;
    o->snap.position = fs->position;
    o->snap.state_bytes = state_bytes(fs);
    o->snap.stored_bytes = state_bytes(fs) / 2;
    o->snap.written_bytes = state_bytes(fs) / 4;
    o->snap.chunks = 1;
    o->s.last_snapshot = &o->snap;
    o->s.parent_session_id = (char *)fs->parent;
    o->s.created_unix_ms = 1700000000000;
    o->s.updated_unix_ms = 1700000000000;
}

/* ---------------------------------------------------------------------------------------- */
/* Sessions                                                                                  */

static void h_create(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *msg, void *ud) {
    if (ev != HYLA_RPC_EV_START)
        return;
    fake_server *f = ud;
    const Hyla__V1__CreateSessionRequest *r = (const void *)msg;
    pthread_mutex_lock(&f->mu);
    record_tenant(f, call);
    const char *model = r->model;
    if (!model[0]) {
        if (f->n_models != 1) {
            pthread_mutex_unlock(&f->mu);
            hyla_rpc_call_fail(call, HYLA_RPC_INVALID_ARGUMENT, "model: required (the cluster serves %d models)",
                               f->n_models);
            return;
        }
        model = f->models[0];
    }
    int known = 0;
    for (int i = 0; i < f->n_models; i++)
        known |= strcmp(f->models[i], model) == 0;
    if (!known) {
        pthread_mutex_unlock(&f->mu);
        hyla_rpc_call_fail(call, HYLA_RPC_NOT_FOUND, "model '%s' is not served", model);
        return;
    }
    fsession *fs = new_session(f);
    if (!fs) {
        pthread_mutex_unlock(&f->mu);
        hyla_rpc_call_fail(call, HYLA_RPC_RESOURCE_EXHAUSTED, "too many sessions");
        return;
    }
    snprintf(fs->tenant, sizeof fs->tenant, "%s", tenant_of(call));
    snprintf(fs->model, sizeof fs->model, "%s", model);
    fs->seed = r->seed;
    if (r->sampling) {
        fs->temperature = r->sampling->temperature;
        fs->top_k = r->sampling->top_k;
        fs->top_p = r->sampling->top_p;
    }
    fs->group = strcmp(r->worker_hint, "w-2") == 0 ? 2 : 1;
    pb_session o;
    to_pb(fs, &o);
    hyla_rpc_call_reply(call, &o.s.base);
    pthread_mutex_unlock(&f->mu);
}

typedef struct {
    fake_server *f;
    char id[24];
    int finished;
    int messages;
    uint64_t received, total;
    double t0;
} append_state;

static void append_finish_fail(append_state *st, hyla_rpc_call *call, hyla_rpc_code code, const char *msg) {
    st->finished = 1;
    hyla_rpc_call_fail(call, code, "%s", msg);
}

static void h_append(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *msg, void *ud) {
    fake_server *f = ud;
    append_state *st = hyla_rpc_call_user(call);
    if (ev == HYLA_RPC_EV_START) {
        st = calloc(1, sizeof *st);
        st->f = f;
        hyla_rpc_call_set_user(call, st, free);
        pthread_mutex_lock(&f->mu);
        record_tenant(f, call);
        f->rec.append_messages = 0;
        pthread_mutex_unlock(&f->mu);
        return;
    }
    if (st->finished)
        return;
    if (ev == HYLA_RPC_EV_DONE) { /* cancelled before we finished */
        append_finish_fail(st, call, HYLA_RPC_CANCELLED, "cancelled");
        return;
    }
    pthread_mutex_lock(&f->mu);
    if (ev == HYLA_RPC_EV_MESSAGE) {
        const Hyla__V1__AppendRequest *r = (const void *)msg;
        f->rec.append_messages++;
        if (st->messages == 0) {
            if (!r->session_id[0]) {
                pthread_mutex_unlock(&f->mu);
                append_finish_fail(st, call, HYLA_RPC_INVALID_ARGUMENT, "session_id: required in the first message");
                return;
            }
            fsession *fs = lookup(f, call, r->session_id);
            if (!fs) {
                st->finished = 1; /* lookup failed the call */
                pthread_mutex_unlock(&f->mu);
                return;
            }
            snprintf(st->id, sizeof st->id, "%s", r->session_id);
            f->rec.append_bytes_hint = r->total_bytes_hint;
            f->rec.append_tokens_hint = r->total_tokens_hint;
            f->rec.append_add_bos = r->add_bos;
            st->total = r->total_tokens_hint ? r->total_tokens_hint : r->total_bytes_hint;
        } else if (r->session_id[0] && strcmp(r->session_id, st->id) != 0) {
            pthread_mutex_unlock(&f->mu);
            append_finish_fail(st, call, HYLA_RPC_INVALID_ARGUMENT, "session_id: differs from the first message");
            return;
        }
        st->messages++;
        if (r->text.len && r->n_tokens) {
            pthread_mutex_unlock(&f->mu);
            append_finish_fail(st, call, HYLA_RPC_INVALID_ARGUMENT, "text and tokens: both set in one message");
            return;
        }
        if (f->fail_append_after >= 0 && st->messages > f->fail_append_after) {
            f->fail_append_after = -1;
            pthread_mutex_unlock(&f->mu);
            append_finish_fail(st, call, HYLA_RPC_UNAVAILABLE, "worker w-1 is gone");
            return;
        }
        uint64_t n = r->text.len + r->n_tokens;
        if (st->received + n > f->max_append_tokens) {
            char m[128];
            snprintf(m, sizeof m, "document exceeds max_append_tokens (%llu)",
                     (unsigned long long)f->max_append_tokens);
            pthread_mutex_unlock(&f->mu);
            append_finish_fail(st, call, HYLA_RPC_RESOURCE_EXHAUSTED, m);
            return;
        }
        fsession *fs = lookup(f, call, st->id);
        if (!fs) { /* deleted meanwhile */
            st->finished = 1;
            pthread_mutex_unlock(&f->mu);
            return;
        }
        st->received += n;
        fs->position += n;
        fs->paused = 0;
        Hyla__V1__AppendProgress p = HYLA__V1__APPEND_PROGRESS__INIT;
        p.tokens_received = p.tokens_ingested = st->received;
        p.total_tokens = st->total;
        p.tokens_per_second = 1000;
        p.position = fs->position;
        hyla_rpc_call_send(call, &p.base);
        pthread_mutex_unlock(&f->mu);
        return;
    }
    /* HALF_CLOSE */
    uint64_t pos = 0;
    for (int i = 0; i < MAX_SESSIONS; i++)
        if (f->s[i].used && strcmp(f->s[i].id, st->id) == 0)
            pos = f->s[i].position;
    pthread_mutex_unlock(&f->mu);
    if (st->messages == 0) {
        append_finish_fail(st, call, HYLA_RPC_INVALID_ARGUMENT, "session_id: no message was sent");
        return;
    }
    Hyla__V1__AppendProgress p = HYLA__V1__APPEND_PROGRESS__INIT;
    p.tokens_received = p.tokens_ingested = st->received;
    p.total_tokens = st->total ? st->total : st->received;
    p.tokens_per_second = 1000;
    p.position = pos;
    p.done = 1;
    hyla_rpc_call_send(call, &p.base);
    st->finished = 1;
    hyla_rpc_call_reply(call, NULL);
}

static void h_generate(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *msg, void *ud) {
    if (ev != HYLA_RPC_EV_START)
        return;
    fake_server *f = ud;
    const Hyla__V1__GenerateRequest *r = (const void *)msg;
    pthread_mutex_lock(&f->mu);
    record_tenant(f, call);
    f->rec.gen_max_tokens = r->max_tokens;
    f->rec.gen_has_sampling = r->sampling != NULL;
    if (r->sampling) {
        f->rec.gen_temperature = r->sampling->temperature;
        f->rec.gen_top_k = r->sampling->top_k;
        f->rec.gen_top_p = r->sampling->top_p;
    }
    f->rec.gen_reseed = r->reseed;
    f->rec.gen_seed = r->seed;
    f->rec.gen_n_stop = (int)r->n_stop;
    snprintf(f->rec.gen_stop0, sizeof f->rec.gen_stop0, "%s", r->n_stop ? r->stop[0] : "");
    f->rec.gen_ignore_eos = r->ignore_eos;
    fsession *fs = lookup(f, call, r->session_id);
    if (!fs) {
        pthread_mutex_unlock(&f->mu);
        return;
    }
    if (r->max_tokens == 0 || r->max_tokens > 100000) {
        pthread_mutex_unlock(&f->mu);
        hyla_rpc_call_fail(call, HYLA_RPC_INVALID_ARGUMENT, "max_tokens: %u is outside [1, 100000]", r->max_tokens);
        return;
    }
    if (r->sampling) {
        fs->temperature = r->sampling->temperature;
        fs->top_k = r->sampling->top_k;
        fs->top_p = r->sampling->top_p;
    }
    if (r->reseed)
        fs->seed = r->seed;
    fs->paused = 0;
    int fail_after = f->fail_gen_after;
    f->fail_gen_after = -1;
    uint32_t delivered = 0;
    Hyla__V1__FinishReason finish = HYLA__V1__FINISH_REASON__FINISH_LENGTH;
    while (delivered < r->max_tokens) {
        if (fail_after >= 0 && (int)delivered == fail_after) {
            char v[32];
            snprintf(v, sizeof v, "%u", delivered);
            hyla_rpc_call_set_trailer(call, HYLA_API_TOKENS_DELIVERED_KEY, v);
            pthread_mutex_unlock(&f->mu);
            hyla_rpc_call_fail(call, HYLA_RPC_UNAVAILABLE, "worker w-%d stopped heartbeating", fs->group);
            return;
        }
        char text[2];
        fake_expected_text(fs->position, fs->seed, 1, text);
        int32_t tok = (int32_t)(unsigned char)text[0];
        int is_stop_text = 0;
        for (size_t k = 0; k < r->n_stop; k++)
            is_stop_text |= strcmp(r->stop[k], text) == 0;
        fs->position++;
        fs->generated++;
        if (is_stop_text) { /* the match is not delivered */
            finish = HYLA__V1__FINISH_REASON__FINISH_STOP;
            break;
        }
        int is_stop_id = 0;
        for (size_t k = 0; k < r->n_stop_token_ids; k++)
            is_stop_id |= r->stop_token_ids[k] == tok;
        Hyla__V1__GenerateResponse g = HYLA__V1__GENERATE_RESPONSE__INIT;
        g.n_token_ids = 1;
        g.token_ids = &tok;
        g.text.data = (uint8_t *)text;
        g.text.len = 1;
        g.position = fs->position;
        delivered++;
        if (is_stop_id || delivered == r->max_tokens) {
            g.done = 1;
            g.finish_reason = is_stop_id ? HYLA__V1__FINISH_REASON__FINISH_STOP : HYLA__V1__FINISH_REASON__FINISH_LENGTH;
            g.tokens_delivered = delivered;
            hyla_rpc_call_send(call, &g.base);
            pthread_mutex_unlock(&f->mu);
            hyla_rpc_call_reply(call, NULL);
            return;
        }
        hyla_rpc_call_send(call, &g.base);
    }
    Hyla__V1__GenerateResponse g = HYLA__V1__GENERATE_RESPONSE__INIT;
    g.position = fs->position;
    g.done = 1;
    g.finish_reason = finish;
    g.tokens_delivered = delivered;
    hyla_rpc_call_send(call, &g.base);
    pthread_mutex_unlock(&f->mu);
    hyla_rpc_call_reply(call, NULL);
}

static void h_pause(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *msg, void *ud) {
    if (ev != HYLA_RPC_EV_START)
        return;
    fake_server *f = ud;
    const Hyla__V1__PauseRequest *r = (const void *)msg;
    pthread_mutex_lock(&f->mu);
    record_tenant(f, call);
    fsession *fs = lookup(f, call, r->session_id);
    if (fs) {
        fs->version++;
        if (r->evict)
            fs->paused = 1;
        pb_session o;
        to_pb(fs, &o);
        Hyla__V1__PauseResponse resp = HYLA__V1__PAUSE_RESPONSE__INIT;
        resp.session = &o.s;
        resp.snapshot = &o.snap;
        hyla_rpc_call_reply(call, &resp.base);
    }
    pthread_mutex_unlock(&f->mu);
}

static void h_resume(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *msg, void *ud) {
    if (ev != HYLA_RPC_EV_START)
        return;
    fake_server *f = ud;
    const Hyla__V1__ResumeRequest *r = (const void *)msg;
    pthread_mutex_lock(&f->mu);
    record_tenant(f, call);
    snprintf(f->rec.resume_hint, sizeof f->rec.resume_hint, "%s", r->worker_hint);
    fsession *fs = lookup(f, call, r->session_id);
    if (fs) {
        fs->paused = 0;
        if (strcmp(r->worker_hint, "w-2") == 0)
            fs->group = 2;
        else if (strcmp(r->worker_hint, "w-1") == 0)
            fs->group = 1;
        pb_session o;
        to_pb(fs, &o);
        hyla_rpc_call_reply(call, &o.s.base);
    }
    pthread_mutex_unlock(&f->mu);
}

static void h_migrate(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *msg, void *ud) {
    if (ev != HYLA_RPC_EV_START)
        return;
    fake_server *f = ud;
    const Hyla__V1__MigrateRequest *r = (const void *)msg;
    pthread_mutex_lock(&f->mu);
    record_tenant(f, call);
    snprintf(f->rec.migrate_to, sizeof f->rec.migrate_to, "%s", r->to_worker);
    fsession *fs = lookup(f, call, r->session_id);
    if (fs) {
        int to = fs->group == 1 ? 2 : 1;
        if (r->to_worker[0]) {
            if (strcmp(r->to_worker, "w-1") == 0)
                to = 1;
            else if (strcmp(r->to_worker, "w-2") == 0)
                to = 2;
            else
                to = 0;
        }
        if (!to) {
            hyla_rpc_call_fail(call, HYLA_RPC_NOT_FOUND, "worker '%s' not found", r->to_worker);
        } else {
            char from[8];
            snprintf(from, sizeof from, "g-%d", fs->group);
            fs->group = to;
            fs->paused = 0;
            fs->version++;
            pb_session o;
            to_pb(fs, &o);
            Hyla__V1__MigrateResponse resp = HYLA__V1__MIGRATE_RESPONSE__INIT;
            resp.session = &o.s;
            resp.from_group_id = from;
            resp.snapshot = &o.snap;
            hyla_rpc_call_reply(call, &resp.base);
        }
    }
    pthread_mutex_unlock(&f->mu);
}

static void h_fork(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *msg, void *ud) {
    if (ev != HYLA_RPC_EV_START)
        return;
    fake_server *f = ud;
    const Hyla__V1__ForkRequest *r = (const void *)msg;
    pthread_mutex_lock(&f->mu);
    record_tenant(f, call);
    fsession *fs = lookup(f, call, r->session_id);
    if (fs) {
        fsession *n = new_session(f);
        if (!n) {
            hyla_rpc_call_fail(call, HYLA_RPC_RESOURCE_EXHAUSTED, "too many sessions");
        } else {
            char id[24];
            snprintf(id, sizeof id, "%s", n->id);
            *n = *fs;
            snprintf(n->id, sizeof n->id, "%s", id);
            snprintf(n->parent, sizeof n->parent, "%s", fs->id);
            n->version = 0;
            n->generated = 0;
            if (r->sampling) {
                n->temperature = r->sampling->temperature;
                n->top_k = r->sampling->top_k;
                n->top_p = r->sampling->top_p;
            }
            if (r->reseed)
                n->seed = r->seed;
            pb_session o;
            to_pb(n, &o);
            hyla_rpc_call_reply(call, &o.s.base);
        }
    }
    pthread_mutex_unlock(&f->mu);
}

static void h_get(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *msg, void *ud) {
    if (ev != HYLA_RPC_EV_START)
        return;
    fake_server *f = ud;
    const Hyla__V1__GetSessionRequest *r = (const void *)msg;
    pthread_mutex_lock(&f->mu);
    record_tenant(f, call);
    fsession *fs = lookup(f, call, r->session_id);
    if (fs) {
        pb_session o;
        to_pb(fs, &o);
        hyla_rpc_call_reply(call, &o.s.base);
    }
    pthread_mutex_unlock(&f->mu);
}

/* Sessions matching a filter, in id order (ids grow with creation, and slots are reused, so
 * sort). tenant NULL: all tenants. */
static int matching(fake_server *f, const char *tenant, const char *model, fsession **out) {
    int n = 0;
    for (int i = 0; i < MAX_SESSIONS; i++) {
        fsession *fs = &f->s[i];
        if (!fs->used || (tenant && strcmp(fs->tenant, tenant) != 0) || (model && model[0] && strcmp(fs->model, model)))
            continue;
        int j = n++;
        while (j > 0 && strcmp(out[j - 1]->id, fs->id) > 0) {
            out[j] = out[j - 1];
            j--;
        }
        out[j] = fs;
    }
    return n;
}

#define PAGE 2 /* small pages make the client's pagination visible */

static void h_list(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *msg, void *ud) {
    if (ev != HYLA_RPC_EV_START)
        return;
    fake_server *f = ud;
    const Hyla__V1__ListSessionsRequest *r = (const void *)msg;
    pthread_mutex_lock(&f->mu);
    record_tenant(f, call);
    f->rec.list_calls++;
    static fsession *all[MAX_SESSIONS]; /* under f->mu */
    int n = matching(f, tenant_of(call), r->model, all);
    int start = 0;
    while (r->page_token[0] && start < n && strcmp(all[start]->id, r->page_token) < 0)
        start++;
    int count = n - start < PAGE ? n - start : PAGE;
    pb_session o[PAGE];
    Hyla__V1__Session *ptrs[PAGE];
    for (int i = 0; i < count; i++) {
        to_pb(all[start + i], &o[i]);
        ptrs[i] = &o[i].s;
    }
    Hyla__V1__ListSessionsResponse resp = HYLA__V1__LIST_SESSIONS_RESPONSE__INIT;
    resp.n_sessions = (size_t)count;
    resp.sessions = ptrs;
    resp.next_page_token = (char *)(start + count < n ? all[start + count]->id : "");
    hyla_rpc_call_reply(call, &resp.base);
    pthread_mutex_unlock(&f->mu);
}

static void h_delete(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *msg, void *ud) {
    if (ev != HYLA_RPC_EV_START)
        return;
    fake_server *f = ud;
    const Hyla__V1__DeleteSessionRequest *r = (const void *)msg;
    pthread_mutex_lock(&f->mu);
    record_tenant(f, call);
    fsession *fs = lookup(f, call, r->session_id);
    if (fs) {
        Hyla__V1__DeleteSessionResponse resp = HYLA__V1__DELETE_SESSION_RESPONSE__INIT;
        resp.snapshots_deleted = fs->version;
        fs->used = 0;
        hyla_rpc_call_reply(call, &resp.base);
    }
    pthread_mutex_unlock(&f->mu);
}

/* ---------------------------------------------------------------------------------------- */
/* Cluster                                                                                   */

static void h_workers(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *msg, void *ud) {
    (void)msg;
    if (ev != HYLA_RPC_EV_START)
        return;
    fake_server *f = ud;
    pthread_mutex_lock(&f->mu);
    Hyla__V1__WorkerInfo w[2];
    Hyla__V1__WorkerInfo *wp[2];
    Hyla__V1__Device d[2];
    Hyla__V1__LayerRange lr[2];
    Hyla__V1__WorkerLoad ld[2];
    Hyla__V1__WorkerGroup g[2];
    Hyla__V1__WorkerGroup *gp[2];
    static char *ids[2] = {"w-1", "w-2"}, *gids[2] = {"g-1", "g-2"}, *addrs[2] = {"127.0.0.1:7101", "127.0.0.1:7102"};
    for (int i = 0; i < 2; i++) {
        hyla__v1__worker_info__init(&w[i]);
        hyla__v1__device__init(&d[i]);
        hyla__v1__layer_range__init(&lr[i]);
        hyla__v1__worker_load__init(&ld[i]);
        hyla__v1__worker_group__init(&g[i]);
        w[i].worker_id = ids[i];
        w[i].address = addrs[i];
        w[i].model = f->models[0];
        w[i].num_layers = 6;
        lr[i].begin = 0;
        lr[i].end = 6;
        w[i].layers = &lr[i];
        w[i].group_id = gids[i];
        d[i].name = "cpu";
        d[i].description = "fake";
        d[i].memory_total_bytes = 1 << 30;
        d[i].memory_free_bytes = 1 << 29;
        w[i].device = &d[i];
        w[i].state = f->drained[i + 1] ? HYLA__V1__WORKER_STATE__WORKER_DRAINED : HYLA__V1__WORKER_STATE__WORKER_READY;
        for (int k = 0; k < MAX_SESSIONS; k++)
            if (f->s[k].used && !f->s[k].paused && f->s[k].group == i + 1)
                ld[i].sessions_gpu++;
        w[i].load = &ld[i];
        wp[i] = &w[i];
        g[i].group_id = gids[i];
        g[i].model = f->models[0];
        g[i].n_worker_ids = 1;
        g[i].worker_ids = &ids[i];
        g[i].complete = 1;
        g[i].sessions = ld[i].sessions_gpu;
        gp[i] = &g[i];
    }
    Hyla__V1__ListWorkersResponse resp = HYLA__V1__LIST_WORKERS_RESPONSE__INIT;
    resp.n_workers = 2;
    resp.workers = wp;
    resp.n_groups = 2;
    resp.groups = gp;
    hyla_rpc_call_reply(call, &resp.base);
    pthread_mutex_unlock(&f->mu);
}

static void h_cluster_sessions(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *msg, void *ud) {
    if (ev != HYLA_RPC_EV_START)
        return;
    fake_server *f = ud;
    const Hyla__V1__ListClusterSessionsRequest *r = (const void *)msg;
    pthread_mutex_lock(&f->mu);
    static fsession *all[MAX_SESSIONS];
    int n = matching(f, r->tenant[0] ? r->tenant : NULL, NULL, all);
    int start = 0;
    while (r->page_token[0] && start < n && strcmp(all[start]->id, r->page_token) < 0)
        start++;
    int size = r->page_size ? (int)r->page_size : PAGE;
    if (size > PAGE)
        size = PAGE;
    int count = n - start < size ? n - start : size;
    pb_session o[PAGE];
    Hyla__V1__Session *ptrs[PAGE];
    for (int i = 0; i < count; i++) {
        to_pb(all[start + i], &o[i]);
        ptrs[i] = &o[i].s;
    }
    Hyla__V1__ListClusterSessionsResponse resp = HYLA__V1__LIST_CLUSTER_SESSIONS_RESPONSE__INIT;
    resp.n_sessions = (size_t)count;
    resp.sessions = ptrs;
    resp.next_page_token = (char *)(start + count < n ? all[start + count]->id : "");
    for (int i = 0; i < MAX_SESSIONS; i++) {
        if (!f->s[i].used)
            continue;
        if (f->s[i].paused)
            resp.sessions_store++;
        else
            resp.sessions_gpu++;
    }
    hyla_rpc_call_reply(call, &resp.base);
    pthread_mutex_unlock(&f->mu);
}

static void h_drain(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *msg, void *ud) {
    if (ev != HYLA_RPC_EV_START)
        return;
    fake_server *f = ud;
    const Hyla__V1__DrainWorkerRequest *r = (const void *)msg;
    pthread_mutex_lock(&f->mu);
    f->rec.drain_wait = r->wait;
    int w = strcmp(r->worker_id, "w-1") == 0 ? 1 : strcmp(r->worker_id, "w-2") == 0 ? 2 : 0;
    if (!w) {
        pthread_mutex_unlock(&f->mu);
        hyla_rpc_call_fail(call, HYLA_RPC_NOT_FOUND, "worker '%s' not found", r->worker_id);
        return;
    }
    uint32_t moved = 0;
    for (int i = 0; i < MAX_SESSIONS; i++)
        if (f->s[i].used && f->s[i].group == w) {
            f->s[i].group = 3 - w;
            moved++;
        }
    f->drained[w] = 1;
    Hyla__V1__WorkerInfo wi = HYLA__V1__WORKER_INFO__INIT;
    wi.worker_id = (char *)r->worker_id;
    wi.state = HYLA__V1__WORKER_STATE__WORKER_DRAINED;
    Hyla__V1__DrainWorkerResponse resp = HYLA__V1__DRAIN_WORKER_RESPONSE__INIT;
    resp.worker = &wi;
    resp.sessions_moved = moved;
    hyla_rpc_call_reply(call, &resp.base);
    pthread_mutex_unlock(&f->mu);
}

/* ---------------------------------------------------------------------------------------- */

hyla_status fake_start(const char *const *models, fake_server **out, int *port) {
    static const char *const dflt[] = {"tiny", NULL};
    *out = NULL;
    fake_server *f = calloc(1, sizeof *f);
    if (!f)
        return hyla_fail(HYLA_ERR_NOMEM, "fake server");
    pthread_mutex_init(&f->mu, NULL);
    for (const char *const *m = models ? models : dflt; *m && f->n_models < 4; m++)
        snprintf(f->models[f->n_models++], sizeof f->models[0], "%s", *m);
    f->next_id = 0x1000;
    f->fail_gen_after = -1;
    f->fail_append_after = -1;
    f->max_append_tokens = 1 << 24;
    static const struct {
        const char *path;
        hyla_rpc_handler fn;
    } h[] = {
        {"/hyla.v1.Sessions/CreateSession", h_create}, {"/hyla.v1.Sessions/Append", h_append},
        {"/hyla.v1.Sessions/Generate", h_generate},    {"/hyla.v1.Sessions/Pause", h_pause},
        {"/hyla.v1.Sessions/Resume", h_resume},        {"/hyla.v1.Sessions/Migrate", h_migrate},
        {"/hyla.v1.Sessions/Fork", h_fork},            {"/hyla.v1.Sessions/GetSession", h_get},
        {"/hyla.v1.Sessions/ListSessions", h_list},    {"/hyla.v1.Sessions/DeleteSession", h_delete},
        {"/hyla.v1.Cluster/ListWorkers", h_workers},   {"/hyla.v1.Cluster/ListClusterSessions", h_cluster_sessions},
        {"/hyla.v1.Cluster/DrainWorker", h_drain},
    };
    hyla_status st = hyla_rpc_server_create(NULL, &f->srv);
    for (size_t i = 0; st == HYLA_OK && i < sizeof h / sizeof h[0]; i++) {
        const hyla_api_method *m = hyla_api_find(h[i].path);
        HYLA_ASSERT(m);
        hyla_rpc_kind kind = (hyla_rpc_kind)((m->client_streaming ? 1 : 0) | (m->server_streaming ? 2 : 0));
        st = hyla_rpc_server_add_method(f->srv, m->path, kind, m->input, m->output, h[i].fn, f);
    }
    if (st == HYLA_OK)
        st = hyla_rpc_server_listen(f->srv, "127.0.0.1:0", port);
    if (st == HYLA_OK)
        st = hyla_rpc_server_start(f->srv);
    if (st != HYLA_OK) {
        fake_stop(f);
        return st;
    }
    *out = f;
    return HYLA_OK;
}

void fake_stop(fake_server *f) {
    if (!f)
        return;
    hyla_rpc_server_destroy(f->srv);
    pthread_mutex_destroy(&f->mu);
    free(f);
}

void fake_fail_generate_after(fake_server *f, int n) {
    pthread_mutex_lock(&f->mu);
    f->fail_gen_after = n;
    pthread_mutex_unlock(&f->mu);
}

void fake_fail_append_after(fake_server *f, int messages) {
    pthread_mutex_lock(&f->mu);
    f->fail_append_after = messages;
    pthread_mutex_unlock(&f->mu);
}

void fake_set_max_append_tokens(fake_server *f, uint64_t n) {
    pthread_mutex_lock(&f->mu);
    f->max_append_tokens = n;
    pthread_mutex_unlock(&f->mu);
}

void fake_get_record(fake_server *f, fake_record *out) {
    pthread_mutex_lock(&f->mu);
    *out = f->rec;
    pthread_mutex_unlock(&f->mu);
}

int fake_session(fake_server *f, const char *id, uint64_t *position, char *tenant, size_t tenant_len) {
    pthread_mutex_lock(&f->mu);
    int found = 0;
    for (int i = 0; i < MAX_SESSIONS; i++)
        if (f->s[i].used && strcmp(f->s[i].id, id) == 0) {
            found = 1;
            if (position)
                *position = f->s[i].position;
            if (tenant)
                snprintf(tenant, tenant_len, "%s", f->s[i].tenant);
        }
    pthread_mutex_unlock(&f->mu);
    return found;
}
