/* hyla_state.c — one session's state on the backend: the parts every held layer's mixer
 * declares (hyla_mixer.h), allocated from the model's layer specs. Fixed parts are allocated
 * (zero) at creation; paged parts grow a page of HYLA_KV_PAGE_TOKENS rows at a time as the
 * context grows and are never freed while the session lives (an export in flight may read
 * them). A layer may also keep a derived cache (NSA's compressed blocks), paged the same way,
 * which snapshots never hold. Threading: the thread that drives the backend. */
#include <stdlib.h>
#include <string.h>

#include "hyla_runtime_impl.h"

static uint64_t part_bytes(const hyla_part_spec *p, uint64_t rows) {
    uint64_t n = hyla_dtype_size(p->dtype);
    for (uint32_t d = 0; d < p->ndim; d++) n *= p->shape[d];
    return p->paged ? n * rows : n;
}

static hyla_status state_alloc(hyla_state *st, size_t bytes, void **out) {
    hyla_backend *be = hyla_model_backend(st->m);
    hyla_status s = be->ops->alloc(be->ctx, bytes, out);
    if (s != HYLA_OK) return hyla_fail_wrap(s, "allocating %zu bytes of session state", bytes);
    st->bytes += bytes;
    return HYLA_OK;
}

hyla_status hyla_state_create(const hyla_model *m, hyla_state **out) {
    *out = NULL;
    hyla_state *st = calloc(1, sizeof *st);
    if (!st || !(st->ls = calloc((size_t)m->cfg.num_layers, sizeof *st->ls))) {
        free(st);
        return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    }
    st->m = m;
    hyla_status s = HYLA_OK;
    for (int l = m->layer_begin; s == HYLA_OK && l < m->layer_end; l++) {
        const hyla_layer *ly = &m->layers[l];
        hyla_layer_state *ls = &st->ls[l];
        ls->owner = st;
        ls->layer = l;
        for (int i = 0; s == HYLA_OK && i < ly->n_parts; i++)
            if (!ly->parts[i].paged) s = state_alloc(st, (size_t)part_bytes(&ly->parts[i], 0), &ls->part[i].dev);
    }
    if (s != HYLA_OK) {
        hyla_state_free(st);
        return s;
    }
    *out = st;
    return HYLA_OK;
}

void hyla_state_free(hyla_state *st) {
    if (!st) return;
    const hyla_model *m = st->m;
    hyla_backend *be = hyla_model_backend(m);
    for (int l = m->layer_begin; l < m->layer_end; l++) {
        hyla_layer_state *ls = &st->ls[l];
        for (int i = 0; i < HYLA_MIXER_MAX_PARTS; i++) {
            hyla_part_state *p = &ls->part[i];
            be->ops->free(be->ctx, p->dev);
            for (int k = 0; k < p->n_pages; k++) be->ops->free(be->ctx, p->pages[k]);
            free(p->pages);
        }
        for (int k = 0; k < ls->derived.n_pages; k++) be->ops->free(be->ctx, ls->derived.pages[k]);
        free(ls->derived.pages);
    }
    free(st->ls);
    free(st);
}

/* Grow p to `need` pages of page_bytes each. */
static hyla_status grow_pages(hyla_state *st, hyla_part_state *p, int need, size_t page_bytes) {
    if (need <= p->n_pages) return HYLA_OK;
    if (need > p->cap_pages) {
        int cap = p->cap_pages ? p->cap_pages : 8;
        while (cap < need) cap *= 2;
        void **n = realloc(p->pages, (size_t)cap * sizeof *n);
        if (!n) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
        p->pages = n;
        p->cap_pages = cap;
    }
    while (p->n_pages < need) {
        HYLA_TRY(state_alloc(st, page_bytes, &p->pages[p->n_pages]));
        p->n_pages++;
    }
    return HYLA_OK;
}

hyla_status hyla_layer_state_reserve(hyla_layer_state *ls, int part, int64_t tokens) {
    hyla_state *st = ls->owner;
    const hyla_part_spec *spec = &st->m->layers[ls->layer].parts[part];
    HYLA_ASSERT(spec->paged);
    int need = (int)((tokens + HYLA_KV_PAGE_TOKENS - 1) / HYLA_KV_PAGE_TOKENS);
    return grow_pages(st, &ls->part[part], need, (size_t)part_bytes(spec, HYLA_KV_PAGE_TOKENS));
}

hyla_status hyla_layer_state_reserve_derived(hyla_layer_state *ls, size_t row_bytes, int64_t rows) {
    int need = (int)((rows + HYLA_KV_PAGE_TOKENS - 1) / HYLA_KV_PAGE_TOKENS);
    return grow_pages(ls->owner, &ls->derived, need, row_bytes * HYLA_KV_PAGE_TOKENS);
}
