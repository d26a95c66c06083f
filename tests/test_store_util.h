/* test_store_util.h — synthetic snapshots for the statestore tests: a small hybrid model's
 * state (gla layer with short-conv tails, sse layer with partitions, attention layer with KV
 * pages), filled deterministically from a seed so a parent and a child process can build the
 * same state independently. Header-only; include once per test program. */
#ifndef TEST_STORE_UTIL_H
#define TEST_STORE_UTIL_H

#include <stdint.h>
#include <string.h>

#include "hyla_snapshot.h"
#include "hyla_util.h"

/* Fill n fp32 values with structure: a per-row scale, smooth trend and noise. */
static inline void tsu_fill_f32(float *x, size_t n, hyla_rng *r) {
    float scale = 0.01f + hyla_rng_uniform(r);
    for (size_t i = 0; i < n; i++) {
        if (i % 128 == 0) scale = 0.01f + hyla_rng_uniform(r);
        x[i] = scale * (hyla_rng_normal(r) + 0.1f * (float)(i % 17));
    }
}

static inline void tsu_fill(hyla_state_part *p, hyla_rng *r) {
    size_t esz = hyla_dtype_size((hyla_dtype)p->dtype);
    size_t n = p->nbytes / esz;
    if (p->dtype == HYLA_DT_F32) {
        tsu_fill_f32(p->data, n, r);
    } else if (p->dtype == HYLA_DT_BF16 || p->dtype == HYLA_DT_F16) {
        float buf[256];
        for (size_t i = 0; i < n; i += 256) {
            size_t m = n - i < 256 ? n - i : 256;
            tsu_fill_f32(buf, m, r);
            hyla_from_f32((uint8_t *)p->data + i * esz, (hyla_dtype)p->dtype, buf, m);
        }
    } else {
        for (size_t i = 0; i < p->nbytes; i++) ((uint8_t *)p->data)[i] = (uint8_t)hyla_rng_next(r);
    }
}

/* A snapshot of the small hybrid model at `tokens` KV tokens; state seeded by `seed`.
 * KV rows [0, tokens) depend only on (kv_seed, row), so growing the context keeps old pages. */
static inline hyla_snapshot *tsu_make(uint64_t seed, uint64_t kv_seed, uint64_t tokens, uint64_t fingerprint) {
    hyla_snapshot *s = hyla_snapshot_create();
    hyla_rng r;
    hyla_rng_seed(&r, seed);
    s->model_fingerprint = fingerprint;
    s->position = tokens;
    s->n_generated = tokens / 3;
    s->pending_token = (int32_t)(tokens % 1000);
    s->sampler.temperature = 0.7f;
    s->sampler.top_k = 40;
    s->sampler.top_p = 0.9f;
    s->sampler.seed = seed;
    for (int i = 0; i < 4; i++) s->rng[i] = hyla_rng_next(&r);
    hyla_state_part *p;
    uint64_t sh_S[3] = {4, 32, 32}, sh_conv[2] = {3, 384}, sh_Sp[4] = {3, 4, 32, 32}, sh_kv[3] = {tokens, 2, 64};
    hyla_snapshot_add_part(s, 0, "S", HYLA_PART_RECURRENT, HYLA_DT_F32, 3, sh_S, 0, &p);
    tsu_fill(p, &r);
    hyla_snapshot_add_part(s, 0, "conv_q", HYLA_PART_RECURRENT, HYLA_DT_F32, 2, sh_conv, 0, &p);
    tsu_fill(p, &r);
    hyla_snapshot_add_part(s, 1, "S0", HYLA_PART_RECURRENT, HYLA_DT_F32, 3, sh_S, 0, &p);
    tsu_fill(p, &r);
    hyla_snapshot_add_part(s, 1, "Sp", HYLA_PART_PARTITION, HYLA_DT_F32, 4, sh_Sp, 0, &p);
    tsu_fill(p, &r);
    const char *kvn[2] = {"k", "v"};
    for (int j = 0; j < 2; j++) {
        hyla_snapshot_add_part(s, 2, kvn[j], HYLA_PART_KV, HYLA_DT_BF16, 3, sh_kv, 64, &p);
        size_t row = 2 * 64;
        for (uint64_t t = 0; t < tokens; t++) {
            hyla_rng rr;
            hyla_rng_seed(&rr, kv_seed * 1000003u + t * 2 + (uint64_t)j);
            float buf[128];
            tsu_fill_f32(buf, row, &rr);
            hyla_from_f32((uint16_t *)p->data + t * row, HYLA_DT_BF16, buf, row);
        }
    }
    return s;
}

/* Bytes of arena a copy of s needs (hyla_snapshot_create_arena). */
static inline size_t tsu_arena_bytes(const hyla_snapshot *s) {
    size_t n = 0;
    for (uint32_t i = 0; i < s->n_parts; i++) n += (size_t)hyla_snapshot_arena_piece(s->parts[i].nbytes);
    return n;
}

/* A copy of s whose parts are carved from the arena [base, base + bytes); NULL when out of
 * memory. release(ctx, base) is called when the copy is destroyed. */
static inline hyla_snapshot *tsu_arena_copy(const hyla_snapshot *s, void *base, size_t bytes,
                                            hyla_snapshot_release_fn release, void *ctx) {
    hyla_snapshot *c = hyla_snapshot_create_arena(base, bytes, release, ctx);
    if (!c) return NULL;
    c->model_fingerprint = s->model_fingerprint;
    c->position = s->position;
    c->n_generated = s->n_generated;
    c->pending_token = s->pending_token;
    c->sampler = s->sampler;
    memcpy(c->rng, s->rng, sizeof c->rng);
    for (uint32_t i = 0; i < s->n_parts; i++) {
        const hyla_state_part *p = &s->parts[i];
        hyla_state_part *q = NULL;
        if (hyla_snapshot_add_part(c, p->layer, p->name, (hyla_part_kind)p->kind, (hyla_dtype)p->dtype, p->ndim,
                                   p->shape, p->page_tokens, &q) != HYLA_OK) {
            hyla_snapshot_destroy(c);
            return NULL;
        }
        memcpy(q->data, p->data, p->nbytes);
    }
    c->n_layers = s->n_layers;
    return c;
}

#endif
