/* hyla_tokenizer_impl.h — internal to text/: the tokenizer's struct, shared by
 * hyla_tokenizer.c (the public entry points, the byte-level kind, decoding) and hyla_bpe.c
 * (tokenizer.json: loading and encoding). */
#ifndef HYLA_TOKENIZER_IMPL_H
#define HYLA_TOKENIZER_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "hyla_pretok.h"
#include "hyla_tokenizer.h"

enum { HYLA_TOKK_BYTES = 0, HYLA_TOKK_BPE = 1 };
enum { HYLA_META_ALWAYS = 0, HYLA_META_FIRST, HYLA_META_NEVER };

/* string -> id, open addressing; keys live in a blob */
typedef struct {
    uint32_t *slot; /* [cap] index+1 into keys, 0 = empty */
    uint32_t cap;
    uint32_t *koff, *klen; /* [n] */
    int32_t *kid;          /* [n] */
    uint32_t n, nmax;
    char *blob;
    size_t blob_len, blob_cap;
} hyla_strmap;

/* (left id, right id) -> (rank, merged id) */
typedef struct {
    uint64_t *key; /* [cap] (left << 32 | right) + 1, 0 = empty */
    int32_t *rank, *id;
    uint32_t cap, n;
} hyla_mergemap;

typedef enum { HYLA_NORM_NFC = 1, HYLA_NORM_PREPEND, HYLA_NORM_REPLACE } hyla_norm_kind;
typedef struct {
    hyla_norm_kind kind;
    char *a, *b; /* PREPEND: a = text; REPLACE: a = pattern, b = content */
} hyla_norm_step;

/* added tokens matched in one pass: candidates by first byte, longest first */
typedef struct {
    int32_t *ids;     /* [n] into the added-token table, ordered by first byte then length desc */
    uint32_t first[257]; /* ids[first[b] .. first[b+1]) start with byte b */
    uint32_t n;
} hyla_added_set;

typedef struct {
    int32_t id;
    char *content;      /* as matched (normalized tokens: normalized content) */
    size_t len;
    int special, single_word, lstrip, rstrip, normalized;
} hyla_added;

struct hyla_tokenizer {
    int kind;
    int n_ids;   /* 1 + largest id */
    /* decoding: each id's bytes after the decoder's per-token steps; blob-backed */
    uint32_t *dec_off, *dec_len; /* [n_ids] */
    char *dec_blob;
    uint8_t *special;            /* [n_ids] */
    int strip_start;             /* decoder drops this many leading spaces of a text */
    /* tokenizer.json */
    hyla_strmap vocab;           /* byte-level models: keys are the raw bytes */
    hyla_mergemap merges;
    hyla_norm_step norm[8];
    int n_norm;
    hyla_split_kind split[4];
    int n_split;
    int byte_level;              /* pieces are mapped through the GPT-2 byte alphabet */
    int meta;                    /* Metaspace pre-tokenizer: spaces -> meta_rep, a leading one */
    char meta_rep[8];
    int meta_scheme, meta_split; /* HYLA_META_ALWAYS/FIRST/NEVER; cut before each meta_rep */
    char *meta_dec;              /* the Metaspace decoder's replacement (owned) */
    int prefix_space;            /* ByteLevel add_prefix_space */
    int32_t byte_id[256];        /* byte-level: id of each byte's symbol (-1: none) */
    int32_t fallback_id[256];    /* byte_fallback: id of <0xHH> (-1: none) */
    int byte_fallback, fuse_unk, ignore_merges;
    int cut_at_meta;             /* no token has `▁` after another character: BPE may run on
                                    the pieces of a word cut before such a `▁` */
    int32_t unk_id;              /* -1: none */
    hyla_added *added;
    int n_added;
    hyla_added_set added_raw, added_norm; /* matched before / after normalization */
    int32_t *post_pre, *post_post;        /* TemplateProcessing ids around $A */
    int n_post_pre, n_post_post;
};

#define META "\xe2\x96\x81" /* U+2581, SentencePiece's space */

/* hyla_tokjson.c */
hyla_status hyla_tokjson_load(const char *path, hyla_tokenizer *t);
void hyla_tokjson_free(hyla_tokenizer *t);
int32_t hyla_tokjson_token_id(const hyla_tokenizer *t, const char *content);
/* Apply the normalizer to s[0..len); *out: caller frees with free(). */
hyla_status hyla_tok_normalize(const hyla_tokenizer *t, const char *s, size_t len, char **out, size_t *out_len);

/* hyla_bpe.c */
hyla_status hyla_bpe_encode(const hyla_tokenizer *t, const char *text, size_t len, unsigned flags, int32_t **ids,
                            int *n);
int32_t hyla_strmap_get(const hyla_strmap *m, const char *s, size_t len);

/* a growing id list */
typedef struct {
    int32_t *v;
    size_t n, cap;
} hyla_ivec;

static inline int hyla_ivec_push(hyla_ivec *a, int32_t x) {
    if (a->n == a->cap) {
        size_t nc = a->cap ? a->cap * 2 : 256;
        int32_t *nv = (int32_t *)realloc(a->v, nc * sizeof *nv);
        if (!nv) return 0;
        a->v = nv, a->cap = nc;
    }
    a->v[a->n++] = x;
    return 1;
}

static inline uint32_t hyla_mix64(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return (uint32_t)k;
}

/* rank of the merge (a, b), or INT32_MAX; *id the merged token */
static inline int32_t hyla_mergemap_get(const hyla_mergemap *m, int32_t a, int32_t b, int32_t *id) {
    uint64_t k = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    uint32_t mask = m->cap - 1, h = hyla_mix64(k) & mask;
    for (;;) {
        uint64_t e = m->key[h];
        if (e == k) {
            *id = m->id[h];
            return m->rank[h];
        }
        if (!e) return INT32_MAX;
        h = (h + 1) & mask;
    }
}

#endif
