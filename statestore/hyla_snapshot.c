/* hyla_snapshot.c — in-memory snapshot container; see hyla_snapshot.h. Single owner, no locks.
 * Invariant: a part's data lies inside the arena (when there is one) exactly when it was carved
 * from it; every other part's data was calloc'ed and is freed with the snapshot. */
#include "hyla_snapshot.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct hyla_snapshot_arena {
    uint8_t *base;
    size_t bytes, used;
    hyla_snapshot_release_fn release;
    void *release_ctx;
};

static int in_arena(const struct hyla_snapshot_arena *a, const void *p) {
    return a && (const uint8_t *)p >= a->base && (const uint8_t *)p < a->base + a->bytes;
}

const char *hyla_part_kind_name(hyla_part_kind k) {
    switch (k) {
    case HYLA_PART_RECURRENT: return "recurrent";
    case HYLA_PART_PARTITION: return "partition";
    case HYLA_PART_KV: return "kv";
    case HYLA_PART_LTE: return "lte";
    case HYLA_PART_DLA: return "dla";
    case HYLA_PART_TOKENS: return "tokens";
    default: return "unknown";
    }
}

hyla_snapshot *hyla_snapshot_create(void) {
    hyla_snapshot *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->format_version = HYLA_SNAPSHOT_FORMAT_VERSION;
    s->pending_token = -1;
    return s;
}

hyla_snapshot *hyla_snapshot_create_arena(void *base, size_t bytes, hyla_snapshot_release_fn release,
                                          void *release_ctx) {
    HYLA_ASSERT(base && ((uintptr_t)base & 63) == 0);
    hyla_snapshot *s = hyla_snapshot_create();
    struct hyla_snapshot_arena *a = calloc(1, sizeof *a);
    if (!s || !a) {
        free(s);
        free(a);
        return NULL;
    }
    a->base = base;
    a->bytes = bytes;
    a->release = release;
    a->release_ctx = release_ctx;
    s->arena = a;
    return s;
}

uint64_t hyla_snapshot_arena_piece(uint64_t nbytes) { return nbytes ? (nbytes + 63) & ~(uint64_t)63 : 64; }

void hyla_snapshot_destroy(hyla_snapshot *s) {
    if (!s) return;
    for (uint32_t i = 0; i < s->n_parts; i++)
        if (!in_arena(s->arena, s->parts[i].data)) free(s->parts[i].data);
    free(s->parts);
    if (s->arena && s->arena->release) s->arena->release(s->arena->release_ctx, s->arena->base);
    free(s->arena);
    free(s);
}

hyla_status hyla_snapshot_add_part(hyla_snapshot *s, uint32_t layer, const char *name, hyla_part_kind kind,
                                   hyla_dtype dtype, uint32_t ndim, const uint64_t *shape,
                                   uint32_t page_tokens, hyla_state_part **out) {
    return hyla_snapshot_add_part_tail(s, layer, name, kind, dtype, ndim, shape, page_tokens, 0, out);
}

hyla_status hyla_snapshot_add_part_tail(hyla_snapshot *s, uint32_t layer, const char *name, hyla_part_kind kind,
                                        hyla_dtype dtype, uint32_t ndim, const uint64_t *shape, uint32_t page_tokens,
                                        uint64_t skip, hyla_state_part **out) {
    if (ndim == 0 || ndim > HYLA_PART_MAX_DIMS)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "part %s of layer %u: %u dims (1..%d allowed)", name, layer,
                         ndim, HYLA_PART_MAX_DIMS);
    if (strlen(name) >= HYLA_PART_NAME_MAX)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "part name '%s' longer than %d bytes", name, HYLA_PART_NAME_MAX - 1);
    if (s->n_parts == s->cap_parts) {
        uint32_t cap = s->cap_parts ? s->cap_parts * 2 : 16;
        hyla_state_part *p = realloc(s->parts, cap * sizeof *p);
        if (!p) return hyla_fail(HYLA_ERR_NOMEM, "snapshot: cannot grow part table to %u", cap);
        s->parts = p;
        s->cap_parts = cap;
    }
    hyla_state_part *p = &s->parts[s->n_parts];
    memset(p, 0, sizeof *p);
    p->layer = layer;
    strcpy(p->name, name);
    p->kind = kind;
    p->dtype = dtype;
    p->ndim = ndim;
    uint64_t n = 1;
    for (uint32_t d = 0; d < ndim; d++) {
        p->shape[d] = shape[d];
        n *= shape[d];
    }
    p->page_tokens = page_tokens;
    p->nbytes = n * hyla_dtype_size(dtype);
    if (skip > p->nbytes)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "part %s of layer %u: skipping %llu of its %llu bytes", name, layer,
                         (unsigned long long)skip, (unsigned long long)p->nbytes);
    p->skip = skip;
    uint64_t held = p->nbytes - skip;
    struct hyla_snapshot_arena *a = s->arena;
    uint64_t piece = hyla_snapshot_arena_piece(held);
    if (a && piece <= a->bytes - a->used) { /* carved, not zero-filled (hyla_snapshot.h) */
        p->data = a->base + a->used;
        a->used += piece;
    } else {
        p->data = calloc(1, held ? held : 1);
    }
    if (!p->data)
        return hyla_fail(HYLA_ERR_NOMEM, "snapshot: cannot allocate %llu bytes for layer %u part %s",
                         (unsigned long long)held, layer, name);
    s->n_parts++;
    if (layer != HYLA_SNAPSHOT_SESSION_LAYER && layer + 1 > s->n_layers) s->n_layers = layer + 1;
    /* the token log stays last (parts are ordered by layer; its layer is the session's), so a
     * snapshot merged from pipeline stages equals the one-model snapshot */
    if (kind != HYLA_PART_TOKENS && s->n_parts >= 2 && s->parts[s->n_parts - 2].kind == HYLA_PART_TOKENS) {
        hyla_state_part t = s->parts[s->n_parts - 2];
        s->parts[s->n_parts - 2] = *p;
        s->parts[s->n_parts - 1] = t;
        p = &s->parts[s->n_parts - 2];
    }
    if (out) *out = p;
    return HYLA_OK;
}

hyla_status hyla_snapshot_require_whole(const hyla_snapshot *s, const char *what) {
    for (uint32_t i = 0; i < s->n_parts; i++)
        if (s->parts[i].skip)
            return hyla_fail(HYLA_ERR_INVALID_ARG,
                             "%s: a partial snapshot (an incremental export: layer %u part '%s' leaves out its first %llu "
                             "bytes) needs its base version",
                             what, s->parts[i].layer, s->parts[i].name, (unsigned long long)s->parts[i].skip);
    return HYLA_OK;
}

hyla_state_part *hyla_snapshot_find(const hyla_snapshot *s, uint32_t layer, const char *name) {
    for (uint32_t i = 0; i < s->n_parts; i++)
        if (s->parts[i].layer == layer && !strcmp(s->parts[i].name, name)) return &s->parts[i];
    return NULL;
}

void hyla_snapshot_copy_meta(hyla_snapshot *dst, const hyla_snapshot *src) {
    dst->format_version = src->format_version;
    dst->model_fingerprint = src->model_fingerprint;
    dst->position = src->position;
    dst->n_generated = src->n_generated;
    dst->pending_token = src->pending_token;
    dst->sampler = src->sampler;
    memcpy(dst->rng, src->rng, sizeof dst->rng);
    dst->n_layers = src->n_layers;
}

hyla_status hyla_snapshot_clone(const hyla_snapshot *s, hyla_snapshot **out) {
    hyla_snapshot *c = hyla_snapshot_create();
    if (!c) return hyla_fail(HYLA_ERR_NOMEM, "snapshot clone");
    hyla_state_part *parts = c->parts;
    *c = *s;
    c->parts = parts;
    c->n_parts = c->cap_parts = 0;
    c->arena = NULL; /* a clone is an ordinary snapshot */
    for (uint32_t i = 0; i < s->n_parts; i++) {
        const hyla_state_part *p = &s->parts[i];
        hyla_state_part *q;
        hyla_status st = hyla_snapshot_add_part_tail(c, p->layer, p->name, (hyla_part_kind)p->kind, (hyla_dtype)p->dtype,
                                                     p->ndim, p->shape, p->page_tokens, p->skip, &q);
        if (st != HYLA_OK) {
            hyla_snapshot_destroy(c);
            return st;
        }
        memcpy(q->data, p->data, p->nbytes - p->skip);
    }
    c->n_layers = s->n_layers;
    *out = c;
    return HYLA_OK;
}

int hyla_snapshot_equal(const hyla_snapshot *a, const hyla_snapshot *b) {
    if (a->format_version != b->format_version || a->model_fingerprint != b->model_fingerprint ||
        a->position != b->position || a->n_generated != b->n_generated ||
        a->pending_token != b->pending_token || memcmp(&a->sampler, &b->sampler, sizeof a->sampler) != 0 ||
        memcmp(a->rng, b->rng, sizeof a->rng) != 0 || a->n_parts != b->n_parts || a->n_layers != b->n_layers)
        return 0;
    for (uint32_t i = 0; i < a->n_parts; i++) {
        const hyla_state_part *p = &a->parts[i], *q = &b->parts[i];
        if (p->layer != q->layer || strcmp(p->name, q->name) || p->kind != q->kind || p->dtype != q->dtype ||
            p->ndim != q->ndim || memcmp(p->shape, q->shape, sizeof p->shape) || p->page_tokens != q->page_tokens ||
            p->nbytes != q->nbytes || p->skip != q->skip || memcmp(p->data, q->data, p->nbytes - p->skip))
            return 0;
    }
    return 1;
}

uint64_t hyla_snapshot_bytes(const hyla_snapshot *s) {
    uint64_t n = 0;
    for (uint32_t i = 0; i < s->n_parts; i++) n += s->parts[i].nbytes;
    return n;
}

static void shape_text(char *buf, size_t n, const hyla_state_part *p) {
    size_t o = 0;
    buf[0] = 0;
    for (uint32_t d = 0; d < p->ndim && o < n; d++)
        o += (size_t)snprintf(buf + o, n - o, "%s%llu", d ? "," : "[", (unsigned long long)p->shape[d]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

hyla_status hyla_snapshot_add_token_log(hyla_snapshot *s, uint32_t n, int32_t **data) {
    *data = NULL;
    if (n == 0 || n > HYLA_TOKEN_LOG_MAX)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "token log of %u tokens: must be 1..%u", n, HYLA_TOKEN_LOG_MAX);
    if (hyla_snapshot_find(s, HYLA_SNAPSHOT_SESSION_LAYER, HYLA_TOKEN_LOG_PART))
        return hyla_fail(HYLA_ERR_INVALID_ARG, "the snapshot has a token log already");
    uint64_t shape[1] = {n};
    hyla_state_part *p = NULL;
    HYLA_TRY(hyla_snapshot_add_part(s, HYLA_SNAPSHOT_SESSION_LAYER, HYLA_TOKEN_LOG_PART, HYLA_PART_TOKENS, HYLA_DT_I32,
                                    1, shape, 0, &p));
    *data = p->data;
    return HYLA_OK;
}

hyla_status hyla_snapshot_token_log(const hyla_snapshot *s, const int32_t **tokens, uint32_t *n) {
    *tokens = NULL;
    *n = 0;
    const hyla_state_part *p = hyla_snapshot_find(s, HYLA_SNAPSHOT_SESSION_LAYER, HYLA_TOKEN_LOG_PART);
    if (!p) return HYLA_OK;
    if (p->kind != HYLA_PART_TOKENS || p->dtype != HYLA_DT_I32 || p->ndim != 1 || p->shape[0] == 0 ||
        p->shape[0] > HYLA_TOKEN_LOG_MAX || p->shape[0] > s->n_generated || p->nbytes != p->shape[0] * 4)
        return hyla_fail(HYLA_ERR_FORMAT,
                         "token log part: kind %u dtype %u ndim %u of %llu tokens, expected kind tokens, i32, 1..%llu "
                         "tokens (min of %u and the %llu generated)",
                         p->kind, p->dtype, p->ndim, (unsigned long long)p->shape[0],
                         (unsigned long long)(s->n_generated < HYLA_TOKEN_LOG_MAX ? s->n_generated : HYLA_TOKEN_LOG_MAX),
                         HYLA_TOKEN_LOG_MAX, (unsigned long long)s->n_generated);
    *tokens = p->data;
    *n = (uint32_t)p->shape[0];
    return HYLA_OK;
}

/* The parts of s that are model state (all but the token log), for check_layout. */
static uint32_t model_parts(const hyla_snapshot *s, const hyla_state_part **out) {
    uint32_t n = 0;
    for (uint32_t i = 0; i < s->n_parts; i++)
        if (s->parts[i].kind != HYLA_PART_TOKENS) out[n++] = &s->parts[i];
    return n;
}

/* Part i of the model parts of got (gp, gn) against those of the layout (ep, en). */
static hyla_status check_part(const hyla_state_part *const *gp, uint32_t gn, const hyla_state_part *const *ep,
                              uint32_t en, uint32_t i) {
    {
        if (i >= gn) {
            const hyla_state_part *e = ep[i];
            return hyla_fail(HYLA_ERR_MISMATCH, "layer %u part %s: missing from the state (it has %u parts, expected %u)",
                             e->layer, e->name, gn, en);
        }
        const hyla_state_part *g = gp[i];
        if (i >= en)
            return hyla_fail(HYLA_ERR_MISMATCH, "layer %u part %s: not expected (the model has %u parts)", g->layer,
                             g->name, en);
        const hyla_state_part *e = ep[i];
        if (g->layer != e->layer || strcmp(g->name, e->name) != 0)
            return hyla_fail(HYLA_ERR_MISMATCH, "part #%u: state has layer %u part %s where the model has layer %u part %s",
                             i, g->layer, g->name, e->layer, e->name);
        if (g->kind != e->kind)
            return hyla_fail(HYLA_ERR_MISMATCH, "layer %u part %s: kind %s, expected %s", g->layer, g->name,
                             hyla_part_kind_name((hyla_part_kind)g->kind), hyla_part_kind_name((hyla_part_kind)e->kind));
        if (g->dtype != e->dtype)
            return hyla_fail(HYLA_ERR_MISMATCH, "layer %u part %s: dtype %s, expected %s", g->layer, g->name,
                             hyla_dtype_name((hyla_dtype)g->dtype), hyla_dtype_name((hyla_dtype)e->dtype));
        int bad = g->ndim != e->ndim || g->page_tokens != e->page_tokens;
        for (uint32_t d = 0; !bad && d < g->ndim; d++)
            if (g->shape[d] != e->shape[d] && !(d == 0 && g->kind == HYLA_PART_KV)) bad = 1;
        if (bad) {
            char a[128], b[128];
            shape_text(a, sizeof a, g);
            shape_text(b, sizeof b, e);
            return hyla_fail(HYLA_ERR_MISMATCH, "layer %u part %s: shape %s (page %u), expected %s (page %u)%s", g->layer,
                             g->name, a, g->page_tokens, b, e->page_tokens,
                             g->kind == HYLA_PART_KV ? "; the token count may differ" : "");
        }
    }
    return HYLA_OK;
}

hyla_status hyla_snapshot_check_layout(const hyla_snapshot *got, const hyla_snapshot *exp) {
    if (got->model_fingerprint && exp->model_fingerprint && got->model_fingerprint != exp->model_fingerprint)
        return hyla_fail(HYLA_ERR_MISMATCH, "model fingerprint mismatch: state is from model %016llx, expected %016llx",
                         (unsigned long long)got->model_fingerprint, (unsigned long long)exp->model_fingerprint);
    const hyla_state_part **gp = malloc((got->n_parts + 1) * sizeof *gp), **ep = malloc((exp->n_parts + 1) * sizeof *ep);
    if (!gp || !ep) {
        free(gp);
        free(ep);
        return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    }
    uint32_t gn = model_parts(got, gp), en = model_parts(exp, ep);
    hyla_status st = HYLA_OK;
    for (uint32_t i = 0; st == HYLA_OK && (i < gn || i < en); i++) st = check_part(gp, gn, ep, en, i);
    free(gp);
    free(ep);
    return st;
}
