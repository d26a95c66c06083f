/* hyla_tokjson.c — loading tokenizer.json (jansson) into the tokenizer's tables: the
 * vocabulary and merge maps, the normalizer, pre-tokenizer, post-processor and decoder steps,
 * the added tokens, and every id's decoded bytes. hyla_bpe.c encodes with what this fills.
 *
 * Invariants: merges are keyed by the pair of ids; a byte-level vocabulary is keyed by raw
 * bytes (the byte alphabet is undone here), so words are looked up without remapping; what
 * is not understood is refused, naming it, rather than approximated.
 * Threading: fills one tokenizer once; the result is read-only. */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "hyla_tokenizer_impl.h"
#include "hyla_unicode.h"

/* ---- string -> id ---- */

static uint64_t hash_bytes(const char *s, size_t len) { return XXH3_64bits(s, len); }

static int strmap_init(hyla_strmap *m, uint32_t nmax) {
    memset(m, 0, sizeof *m);
    m->cap = 1;
    while (m->cap < nmax * 2 + 16) m->cap <<= 1;
    m->slot = calloc(m->cap, sizeof *m->slot);
    m->koff = malloc(nmax * sizeof *m->koff);
    m->klen = malloc(nmax * sizeof *m->klen);
    m->kid = malloc(nmax * sizeof *m->kid);
    m->nmax = nmax;
    return m->slot && m->koff && m->klen && m->kid;
}

static void strmap_free(hyla_strmap *m) {
    free(m->slot), free(m->koff), free(m->klen), free(m->kid), free(m->blob);
    memset(m, 0, sizeof *m);
}

int32_t hyla_strmap_get(const hyla_strmap *m, const char *s, size_t len) {
    if (!m->cap) return -1;
    uint32_t mask = m->cap - 1, h = (uint32_t)hash_bytes(s, len) & mask;
    for (;;) {
        uint32_t e = m->slot[h];
        if (!e) return -1;
        e--;
        if (m->klen[e] == len && !memcmp(m->blob + m->koff[e], s, len)) return m->kid[e];
        h = (h + 1) & mask;
    }
}

/* Insert (or overwrite) s -> id. Returns 0 when out of memory. */
static int strmap_put(hyla_strmap *m, const char *s, size_t len, int32_t id) {
    uint32_t mask = m->cap - 1, h = (uint32_t)hash_bytes(s, len) & mask;
    for (;;) {
        uint32_t e = m->slot[h];
        if (!e) break;
        e--;
        if (m->klen[e] == len && !memcmp(m->blob + m->koff[e], s, len)) {
            m->kid[e] = id;
            return 1;
        }
        h = (h + 1) & mask;
    }
    if (m->n == m->nmax) return 0;
    if (m->blob_len + len > m->blob_cap) {
        size_t nc = (m->blob_cap ? m->blob_cap * 2 : 1 << 20) + len;
        char *nb = realloc(m->blob, nc);
        if (!nb) return 0;
        m->blob = nb, m->blob_cap = nc;
    }
    memcpy(m->blob + m->blob_len, s, len);
    m->koff[m->n] = (uint32_t)m->blob_len;
    m->klen[m->n] = (uint32_t)len;
    m->kid[m->n] = id;
    m->blob_len += len;
    m->slot[h] = ++m->n;
    return 1;
}

/* ---- (left, right) -> (rank, id) ---- */

static int mergemap_init(hyla_mergemap *m, uint32_t nmax) {
    memset(m, 0, sizeof *m);
    m->cap = 1;
    while (m->cap < nmax * 2 + 16) m->cap <<= 1;
    m->key = calloc(m->cap, sizeof *m->key);
    m->rank = malloc(m->cap * sizeof *m->rank);
    m->id = malloc(m->cap * sizeof *m->id);
    return m->key && m->rank && m->id;
}

static void mergemap_free(hyla_mergemap *m) {
    free(m->key), free(m->rank), free(m->id);
    memset(m, 0, sizeof *m);
}

static void mergemap_put(hyla_mergemap *m, int32_t a, int32_t b, int32_t rank, int32_t id) {
    uint64_t k = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    uint32_t mask = m->cap - 1, h = hyla_mix64(k) & mask;
    while (m->key[h] && m->key[h] != k) h = (h + 1) & mask;
    if (!m->key[h]) m->n++;
    m->key[h] = k, m->rank[h] = rank, m->id[h] = id;
}

/* ---- the GPT-2 byte alphabet ---- */

static void byte_alphabet(uint32_t byte_cp[256], int16_t cp_byte[324]) {
    int n = 0;
    for (int i = 0; i < 324; i++) cp_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        byte_cp[b] = printable ? (uint32_t)b : (uint32_t)(256 + n++);
        cp_byte[byte_cp[b]] = (int16_t)b;
    }
}

/* The raw bytes of a byte-level token string into out (room: len); returns the length, or -1
 * when a character is outside the alphabet. */
static long unmap_bytes(const int16_t cp_byte[324], const char *s, size_t len, char *out) {
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        i += hyla_utf8_next((const unsigned char *)s + i, len - i, &cp);
        if (cp >= 324 || cp_byte[cp] < 0) return -1;
        out[o++] = (char)cp_byte[cp];
    }
    return (long)o;
}


/* 1 when s holds `▁` right after a character other than `▁` */
static int meta_inside(const char *s, size_t len) {
    for (size_t i = 1; i + 3 <= len; i++)
        if (!memcmp(s + i, META, 3) && !(i >= 3 && !memcmp(s + i - 3, META, 3))) return 1;
    return 0;
}

/* ---- loading ---- */

#define LFAIL(...) return hyla_fail(HYLA_ERR_FORMAT, __VA_ARGS__)
#define LUNSUP(...) return hyla_fail(HYLA_ERR_UNSUPPORTED, __VA_ARGS__)

static const char *jtype(json_t *o) {
    const char *s = json_string_value(json_object_get(o, "type"));
    return s ? s : "";
}

static int jbool(json_t *o, const char *key) { return json_is_true(json_object_get(o, key)); }

static hyla_status load_normalizer(hyla_tokenizer *t, json_t *n) {
    if (!n || json_is_null(n)) return HYLA_OK;
    const char *ty = jtype(n);
    if (!strcmp(ty, "Sequence")) {
        json_t *list = json_object_get(n, "normalizers"), *x;
        size_t i;
        if (!json_is_array(list)) LFAIL("normalizer: Sequence without a 'normalizers' list");
        json_array_foreach(list, i, x) HYLA_TRY(load_normalizer(t, x));
        return HYLA_OK;
    }
    if (t->n_norm == (int)(sizeof t->norm / sizeof t->norm[0])) LUNSUP("normalizer: more than 8 steps");
    hyla_norm_step *st = &t->norm[t->n_norm];
    if (!strcmp(ty, "NFC")) {
        st->kind = HYLA_NORM_NFC;
    } else if (!strcmp(ty, "Prepend")) {
        const char *p = json_string_value(json_object_get(n, "prepend"));
        if (!p) LFAIL("normalizer: Prepend without a 'prepend' string");
        st->kind = HYLA_NORM_PREPEND;
        st->a = strdup(p);
    } else if (!strcmp(ty, "Replace")) {
        const char *p = json_string_value(json_object_get(json_object_get(n, "pattern"), "String"));
        const char *c = json_string_value(json_object_get(n, "content"));
        if (!p || !c) LUNSUP("normalizer: Replace supports a String pattern and a content string only");
        if (!*p) LFAIL("normalizer: Replace with an empty pattern");
        st->kind = HYLA_NORM_REPLACE;
        st->a = strdup(p);
        st->b = strdup(c);
    } else {
        LUNSUP("normalizer type '%s' is not supported (NFC, Prepend, Replace, Sequence are)", ty);
    }
    t->n_norm++;
    return HYLA_OK;
}

/* Metaspace's replacement and prepend scheme (older files: add_prefix_space) */
static hyla_status metaspace_params(json_t *p, char rep[8], int *scheme) {
    const char *r = json_string_value(json_object_get(p, "replacement"));
    if (!r) r = META;
    if (!*r || strlen(r) > 7) LFAIL("Metaspace: replacement '%s' is not one character", r);
    strcpy(rep, r);
    const char *ps = json_string_value(json_object_get(p, "prepend_scheme"));
    if (ps) {
        if (!strcmp(ps, "always")) *scheme = HYLA_META_ALWAYS;
        else if (!strcmp(ps, "first")) *scheme = HYLA_META_FIRST;
        else if (!strcmp(ps, "never")) *scheme = HYLA_META_NEVER;
        else LUNSUP("Metaspace: prepend_scheme '%s' is not always, first or never", ps);
    } else {
        json_t *aps = json_object_get(p, "add_prefix_space");
        *scheme = (!aps || json_is_true(aps)) ? HYLA_META_ALWAYS : HYLA_META_NEVER;
    }
    return HYLA_OK;
}

static hyla_status load_pretok(hyla_tokenizer *t, json_t *p) {
    if (!p || json_is_null(p)) return HYLA_OK;
    const char *ty = jtype(p);
    if (!strcmp(ty, "Sequence")) {
        json_t *list = json_object_get(p, "pretokenizers"), *x;
        size_t i;
        if (!json_is_array(list)) LFAIL("pre_tokenizer: Sequence without a 'pretokenizers' list");
        json_array_foreach(list, i, x) HYLA_TRY(load_pretok(t, x));
        return HYLA_OK;
    }
    if (t->byte_level || t->meta) LUNSUP("pre_tokenizer: a step after ByteLevel or Metaspace is not supported");
    if (!strcmp(ty, "Split")) {
        const char *re = json_string_value(json_object_get(json_object_get(p, "pattern"), "Regex"));
        const char *beh = json_string_value(json_object_get(p, "behavior"));
        if (!re) LUNSUP("pre_tokenizer: Split supports Regex patterns only");
        if (!beh || strcmp(beh, "Isolated") || jbool(p, "invert"))
            LUNSUP("pre_tokenizer: Split supports behavior Isolated without invert only (found %s)", beh ? beh : "none");
        hyla_split_kind k = hyla_split_from_regex(re);
        if (!k) LUNSUP("pre_tokenizer: Split pattern %s is not one of the GPT-2, Llama-3 or Qwen2 patterns", re);
        if (t->n_split == 4) LUNSUP("pre_tokenizer: more than 4 splits");
        t->split[t->n_split++] = k;
    } else if (!strcmp(ty, "ByteLevel")) {
        t->byte_level = 1;
        t->prefix_space = jbool(p, "add_prefix_space");
        if (t->prefix_space && t->n_split) LUNSUP("pre_tokenizer: ByteLevel add_prefix_space after a Split");
        json_t *ur = json_object_get(p, "use_regex");
        if (!ur || json_is_true(ur)) {
            if (t->n_split == 4) LUNSUP("pre_tokenizer: more than 4 splits");
            t->split[t->n_split++] = HYLA_SPLIT_GPT2;
        }
    } else if (!strcmp(ty, "Metaspace")) {
        if (t->n_split) LUNSUP("pre_tokenizer: Metaspace after a Split is not supported");
        HYLA_TRY(metaspace_params(p, t->meta_rep, &t->meta_scheme));
        t->meta = 1;
        t->meta_split = json_object_get(p, "split") ? jbool(p, "split") : 1;
    } else {
        LUNSUP("pre_tokenizer type '%s' is not supported (Split, ByteLevel, Metaspace, Sequence are)", ty);
    }
    return HYLA_OK;
}

static hyla_status load_post(hyla_tokenizer *t, json_t *p) {
    if (!p || json_is_null(p)) return HYLA_OK;
    const char *ty = jtype(p);
    if (!strcmp(ty, "Sequence")) {
        json_t *list = json_object_get(p, "processors"), *x;
        size_t i;
        if (!json_is_array(list)) LFAIL("post_processor: Sequence without a 'processors' list");
        json_array_foreach(list, i, x) HYLA_TRY(load_post(t, x));
        return HYLA_OK;
    }
    if (!strcmp(ty, "ByteLevel")) return HYLA_OK; /* offsets only */
    if (strcmp(ty, "TemplateProcessing"))
        LUNSUP("post_processor type '%s' is not supported (TemplateProcessing, ByteLevel, Sequence are)", ty);
    json_t *single = json_object_get(p, "single"), *specials = json_object_get(p, "special_tokens"), *x;
    if (!json_is_array(single)) LFAIL("post_processor: TemplateProcessing without a 'single' template");
    size_t i;
    int seen_a = 0;
    hyla_ivec pre = {0}, post = {0};
    json_array_foreach(single, i, x) {
        json_t *sp = json_object_get(x, "SpecialToken");
        if (json_object_get(x, "Sequence")) {
            seen_a = 1;
            continue;
        }
        const char *name = json_string_value(json_object_get(sp, "id"));
        json_t *st = name ? json_object_get(specials, name) : NULL, *ids = json_object_get(st, "ids"), *v;
        if (!json_is_array(ids)) {
            free(pre.v), free(post.v);
            LFAIL("post_processor: template token %s is not in special_tokens", name ? name : "(unnamed)");
        }
        size_t k;
        json_array_foreach(ids, k, v) {
            if (!hyla_ivec_push(seen_a ? &post : &pre, (int32_t)json_integer_value(v))) {
                free(pre.v), free(post.v);
                return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
            }
        }
    }
    free(t->post_pre), free(t->post_post);
    t->post_pre = pre.v, t->n_post_pre = (int)pre.n;
    t->post_post = post.v, t->n_post_post = (int)post.n;
    return HYLA_OK;
}

/* decoder steps applied to each token's text */
enum { DEC_BYTELEVEL = 1, DEC_REPLACE, DEC_BYTEFALLBACK };
typedef struct {
    int kind;
    const char *a, *b;
} dec_step;

static hyla_status load_decoder(hyla_tokenizer *t, json_t *d, dec_step *steps, int *n) {
    if (!d || json_is_null(d)) return HYLA_OK;
    const char *ty = jtype(d);
    if (!strcmp(ty, "Sequence")) {
        json_t *list = json_object_get(d, "decoders"), *x;
        size_t i;
        if (!json_is_array(list)) LFAIL("decoder: Sequence without a 'decoders' list");
        json_array_foreach(list, i, x) HYLA_TRY(load_decoder(t, x, steps, n));
        return HYLA_OK;
    }
    if (*n >= 8) LUNSUP("decoder: more than 8 steps");
    if (!strcmp(ty, "ByteLevel")) {
        steps[(*n)++] = (dec_step){DEC_BYTELEVEL, NULL, NULL};
    } else if (!strcmp(ty, "Replace")) {
        const char *p = json_string_value(json_object_get(json_object_get(d, "pattern"), "String"));
        const char *c = json_string_value(json_object_get(d, "content"));
        if (!p || !*p || !c) LUNSUP("decoder: Replace supports a non-empty String pattern and a content string only");
        steps[(*n)++] = (dec_step){DEC_REPLACE, p, c};
    } else if (!strcmp(ty, "ByteFallback")) {
        steps[(*n)++] = (dec_step){DEC_BYTEFALLBACK, NULL, NULL};
    } else if (!strcmp(ty, "Metaspace")) {
        char r[8];
        int scheme;
        HYLA_TRY(metaspace_params(d, r, &scheme));
        t->meta_dec = strdup(r);
        steps[(*n)++] = (dec_step){DEC_REPLACE, t->meta_dec, " "};
        if (scheme != HYLA_META_NEVER) t->strip_start = 1;
    } else if (!strcmp(ty, "Fuse")) {
        /* joining the tokens is what decoding does anyway */
    } else if (!strcmp(ty, "Strip")) {
        const char *c = json_string_value(json_object_get(d, "content"));
        if (!c || strcmp(c, " ") || json_integer_value(json_object_get(d, "stop")) != 0)
            LUNSUP("decoder: Strip supports content ' ' with stop 0 only");
        t->strip_start = (int)json_integer_value(json_object_get(d, "start"));
    } else {
        LUNSUP("decoder type '%s' is not supported (ByteLevel, Replace, ByteFallback, Fuse, Strip, Sequence are)", ty);
    }
    return HYLA_OK;
}

/* Apply the normalizer to s[0..len); *out: caller frees with free(). */
hyla_status hyla_tok_normalize(const hyla_tokenizer *t, const char *s, size_t len, char **out, size_t *out_len) {
    char *cur = malloc(len + 1);
    if (!cur) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    memcpy(cur, s, len);
    size_t cl = len;
    for (int k = 0; k < t->n_norm; k++) {
        const hyla_norm_step *st = &t->norm[k];
        char *nx = NULL;
        size_t nl = 0;
        if (st->kind == HYLA_NORM_NFC) {
            if (hyla_nfc_quick(cur, cl)) continue;
            hyla_status rs = hyla_nfc(cur, cl, &nx, &nl);
            if (rs != HYLA_OK) {
                free(cur);
                return rs;
            }
        } else if (st->kind == HYLA_NORM_PREPEND) {
            if (!cl) continue;
            size_t pl = strlen(st->a);
            if (!(nx = malloc(cl + pl + 1))) break;
            memcpy(nx, st->a, pl);
            memcpy(nx + pl, cur, cl);
            nl = cl + pl;
        } else {
            size_t pl = strlen(st->a), rl = strlen(st->b), cnt = 0;
            for (size_t i = 0; i + pl <= cl;)
                if (!memcmp(cur + i, st->a, pl)) cnt++, i += pl;
                else i++;
            if (!cnt) continue;
            if (!(nx = malloc(cl + cnt * rl + 1))) break;
            for (size_t i = 0; i < cl;) {
                if (i + pl <= cl && !memcmp(cur + i, st->a, pl)) {
                    memcpy(nx + nl, st->b, rl);
                    nl += rl, i += pl;
                } else {
                    nx[nl++] = cur[i++];
                }
            }
        }
        free(cur);
        cur = nx, cl = nl;
    }
    if (!cur) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    *out = cur;
    *out_len = cl;
    return HYLA_OK;
}

static int cmp_added(const void *pa, const void *pb, void *ctx) {
    const hyla_added *A = ctx;
    const hyla_added *a = &A[*(const int32_t *)pa], *b = &A[*(const int32_t *)pb];
    unsigned char fa = (unsigned char)a->content[0], fb = (unsigned char)b->content[0];
    if (fa != fb) return fa < fb ? -1 : 1;
    if (a->len != b->len) return a->len > b->len ? -1 : 1;
    return 0;
}

static hyla_status build_added_set(hyla_tokenizer *t, hyla_added_set *set, int normalized) {
    memset(set, 0, sizeof *set);
    set->ids = malloc(((size_t)t->n_added + 1) * sizeof *set->ids);
    if (!set->ids) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].normalized == normalized && t->added[i].len) set->ids[set->n++] = i;
    qsort_r(set->ids, set->n, sizeof *set->ids, cmp_added, t->added);
    uint32_t k = 0;
    for (int b = 0; b < 256; b++) {
        set->first[b] = k;
        while (k < set->n && (unsigned char)t->added[set->ids[k]].content[0] == b) k++;
    }
    set->first[256] = set->n;
    return HYLA_OK;
}

static hyla_status load_added(hyla_tokenizer *t, json_t *list) {
    if (!list || json_is_null(list)) return HYLA_OK;
    if (!json_is_array(list)) LFAIL("added_tokens is not a list");
    t->added = calloc(json_array_size(list) + 1, sizeof *t->added);
    if (!t->added) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    size_t i;
    json_t *x;
    json_array_foreach(list, i, x) {
        const char *c = json_string_value(json_object_get(x, "content"));
        json_t *id = json_object_get(x, "id");
        if (!c || !json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) > INT32_MAX / 2)
            LFAIL("added_tokens[%zu]: needs a content string and a non-negative id", i);
        hyla_added *a = &t->added[t->n_added++];
        a->id = (int32_t)json_integer_value(id);
        a->special = jbool(x, "special");
        a->single_word = jbool(x, "single_word");
        a->lstrip = jbool(x, "lstrip");
        a->rstrip = jbool(x, "rstrip");
        a->normalized = jbool(x, "normalized");
        if (a->normalized) {
            HYLA_TRY(hyla_tok_normalize(t, c, strlen(c), &a->content, &a->len));
        } else {
            a->content = strdup(c);
            a->len = strlen(c);
        }
        if (!a->content) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    }
    HYLA_TRY(build_added_set(t, &t->added_raw, 0));
    return build_added_set(t, &t->added_norm, 1);
}

/* Apply the decoder steps to one token's text; returns the length written to out (room: 4*len+4). */
static size_t decode_token(const dec_step *steps, int n, const int16_t cp_byte[324], const char *s, size_t len,
                           char *out, char *tmp) {
    memcpy(out, s, len);
    size_t l = len;
    for (int k = 0; k < n; k++) {
        const dec_step *st = &steps[k];
        if (st->kind == DEC_BYTELEVEL) {
            long r = unmap_bytes(cp_byte, out, l, tmp);
            if (r >= 0) memcpy(out, tmp, (size_t)r), l = (size_t)r;
        } else if (st->kind == DEC_BYTEFALLBACK) {
            if (l == 6 && !memcmp(out, "<0x", 3) && out[5] == '>') {
                char hex[3] = {out[3], out[4], 0}, *end;
                long v = strtol(hex, &end, 16);
                if (*end == 0 && end == hex + 2) out[0] = (char)v, l = 1;
            }
        } else {
            size_t pl = strlen(st->a), rl = strlen(st->b), o = 0;
            for (size_t i = 0; i < l;) {
                if (i + pl <= l && !memcmp(out + i, st->a, pl)) memcpy(tmp + o, st->b, rl), o += rl, i += pl;
                else tmp[o++] = out[i++];
            }
            memcpy(out, tmp, o);
            l = o;
        }
    }
    return l;
}

static hyla_status load_json(hyla_tokenizer *t, json_t *root) {
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model)) LFAIL("no 'model' object");
    const char *mt = json_string_value(json_object_get(model, "type"));
    if (mt && strcmp(mt, "BPE")) LUNSUP("model type '%s' is not supported (BPE is)", mt);
    json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
    if (!json_is_object(vocab) || !json_is_array(merges)) LFAIL("model: BPE needs a 'vocab' object and a 'merges' list");
    json_t *dr = json_object_get(model, "dropout");
    if (dr && !json_is_null(dr) && json_number_value(dr) != 0.0) LUNSUP("model: BPE dropout is not supported");
    const char *cs = json_string_value(json_object_get(model, "continuing_subword_prefix"));
    const char *ew = json_string_value(json_object_get(model, "end_of_word_suffix"));
    if ((cs && *cs) || (ew && *ew)) LUNSUP("model: continuing_subword_prefix / end_of_word_suffix are not supported");
    t->byte_fallback = jbool(model, "byte_fallback");
    t->fuse_unk = jbool(model, "fuse_unk");
    t->ignore_merges = jbool(model, "ignore_merges");

    HYLA_TRY(load_normalizer(t, json_object_get(root, "normalizer")));
    HYLA_TRY(load_pretok(t, json_object_get(root, "pre_tokenizer")));
    HYLA_TRY(load_post(t, json_object_get(root, "post_processor")));
    dec_step steps[8];
    int n_steps = 0;
    HYLA_TRY(load_decoder(t, json_object_get(root, "decoder"), steps, &n_steps));
    HYLA_TRY(load_added(t, json_object_get(root, "added_tokens")));

    uint32_t byte_cp[256];
    int16_t cp_byte[324];
    byte_alphabet(byte_cp, cp_byte);

    /* vocabulary */
    size_t nv = json_object_size(vocab);
    if (!strmap_init(&t->vocab, (uint32_t)nv + 1)) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    int32_t max_id = -1;
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) {
        json_int_t id = json_integer_value(val);
        if (!json_is_integer(val) || id < 0 || id > INT32_MAX / 2) LFAIL("model.vocab['%s']: the id is not a valid integer", key);
        if (id > max_id) max_id = (int32_t)id;
    }
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].id > max_id) max_id = t->added[i].id;
    t->n_ids = max_id + 1;
    const char **tok_str = calloc((size_t)t->n_ids, sizeof *tok_str); /* borrowed from the JSON */
    if (!tok_str) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    char *raw = NULL;
    size_t raw_cap = 0;
    int vocab_oom = 0;
    t->cut_at_meta = !t->byte_level;
    json_object_foreach(vocab, key, val) {
        int32_t id = (int32_t)json_integer_value(val);
        size_t kl = strlen(key);
        tok_str[id] = key;
        if (t->cut_at_meta && meta_inside(key, kl)) t->cut_at_meta = 0;
        if (t->byte_level) {
            if (kl > raw_cap) {
                raw_cap = kl * 2;
                char *nr = realloc(raw, raw_cap);
                if (!nr) {
                    vocab_oom = 1;
                    break;
                }
                raw = nr;
            }
            long rl = unmap_bytes(cp_byte, key, kl, raw);
            if (rl < 0) continue; /* outside the alphabet: BPE cannot produce it */
            if (!strmap_put(&t->vocab, raw, (size_t)rl, id)) {
                vocab_oom = 1;
                break;
            }
        } else if (!strmap_put(&t->vocab, key, kl, id)) {
            vocab_oom = 1;
            break;
        }
    }
    free(raw);
    if (vocab_oom) {
        free(tok_str);
        return hyla_fail(HYLA_ERR_NOMEM, "out of memory for the vocabulary");
    }
    for (int i = 0; i < t->n_added; i++) tok_str[t->added[i].id] = t->added[i].content;

    /* symbols for bytes */
    for (int b = 0; b < 256; b++) {
        char one = (char)b;
        t->byte_id[b] = t->byte_level ? hyla_strmap_get(&t->vocab, &one, 1) : -1;
        char fb[8];
        snprintf(fb, sizeof fb, "<0x%02X>", b);
        t->fallback_id[b] = hyla_strmap_get(&t->vocab, fb, strlen(fb));
    }
    const char *unk = json_string_value(json_object_get(model, "unk_token"));
    t->unk_id = unk ? hyla_strmap_get(&t->vocab, unk, strlen(unk)) : -1;
    if (unk && t->unk_id < 0) {
        free(tok_str);
        LFAIL("model: unk_token '%s' is not in the vocabulary", unk);
    }

    /* merges */
    if (!mergemap_init(&t->merges, (uint32_t)json_array_size(merges) + 1)) {
        free(tok_str);
        return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    }
    size_t i;
    json_t *mg;
    char *buf = NULL;
    size_t buf_cap = 0;
    hyla_status st = HYLA_OK;
    json_array_foreach(merges, i, mg) {
        const char *a, *b;
        size_t al, bl;
        if (json_is_string(mg)) {
            const char *s = json_string_value(mg), *sp = strchr(s, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                st = hyla_fail(HYLA_ERR_FORMAT, "model.merges[%zu] '%s' is not two tokens separated by one space", i, s);
                break;
            }
            a = s, al = (size_t)(sp - s), b = sp + 1, bl = strlen(b);
        } else if (json_is_array(mg) && json_array_size(mg) == 2 && json_is_string(json_array_get(mg, 0)) &&
                   json_is_string(json_array_get(mg, 1))) {
            a = json_string_value(json_array_get(mg, 0)), al = strlen(a);
            b = json_string_value(json_array_get(mg, 1)), bl = strlen(b);
        } else {
            st = hyla_fail(HYLA_ERR_FORMAT, "model.merges[%zu] is neither \"a b\" nor [\"a\", \"b\"]", i);
            break;
        }
        if (al + bl + 1 > buf_cap) {
            buf_cap = (al + bl + 1) * 2;
            char *nb = realloc(buf, buf_cap);
            if (!nb) {
                st = hyla_fail(HYLA_ERR_NOMEM, "out of memory");
                break;
            }
            buf = nb;
        }
        int32_t ia, ib, im;
        if (t->byte_level) {
            long ra = unmap_bytes(cp_byte, a, al, buf), rb = ra < 0 ? -1 : unmap_bytes(cp_byte, b, bl, buf + ra);
            if (ra < 0 || rb < 0) {
                st = hyla_fail(HYLA_ERR_FORMAT, "model.merges[%zu]: a token outside the byte-level alphabet", i);
                break;
            }
            ia = hyla_strmap_get(&t->vocab, buf, (size_t)ra);
            ib = hyla_strmap_get(&t->vocab, buf + ra, (size_t)rb);
            im = hyla_strmap_get(&t->vocab, buf, (size_t)(ra + rb));
        } else {
            memcpy(buf, a, al), memcpy(buf + al, b, bl);
            ia = hyla_strmap_get(&t->vocab, a, al);
            ib = hyla_strmap_get(&t->vocab, b, bl);
            im = hyla_strmap_get(&t->vocab, buf, al + bl);
        }
        if (ia < 0 || ib < 0 || im < 0) {
            st = hyla_fail(HYLA_ERR_FORMAT, "model.merges[%zu]: '%.*s' + '%.*s' or their merge is not in the vocabulary", i,
                           (int)al, a, (int)bl, b);
            break;
        }
        mergemap_put(&t->merges, ia, ib, (int32_t)i, im);
    }
    free(buf);

    /* decoding table */
    if (st == HYLA_OK) {
        size_t total = 0;
        for (int32_t id = 0; id < t->n_ids; id++)
            if (tok_str[id]) total += strlen(tok_str[id]) * 4 + 4;
        t->dec_off = calloc((size_t)t->n_ids, sizeof *t->dec_off);
        t->dec_len = calloc((size_t)t->n_ids, sizeof *t->dec_len);
        t->special = calloc((size_t)t->n_ids, 1);
        t->dec_blob = malloc(total + 1);
        char *tmp = malloc(4096 * 4 + 4), *one = malloc(4096 * 4 + 4);
        if (!t->dec_off || !t->dec_len || !t->special || !t->dec_blob || !tmp || !one) {
            st = hyla_fail(HYLA_ERR_NOMEM, "out of memory");
        } else {
            size_t off = 0;
            for (int32_t id = 0; id < t->n_ids; id++) {
                if (!tok_str[id]) continue;
                size_t l = strlen(tok_str[id]);
                if (l > 4096) {
                    st = hyla_fail(HYLA_ERR_UNSUPPORTED, "token %d is longer than 4096 bytes", id);
                    break;
                }
                size_t dl = decode_token(steps, n_steps, cp_byte, tok_str[id], l, one, tmp);
                memcpy(t->dec_blob + off, one, dl);
                t->dec_off[id] = (uint32_t)off, t->dec_len[id] = (uint32_t)dl;
                off += dl;
            }
            for (int k = 0; k < t->n_added; k++) t->special[t->added[k].id] = (uint8_t)t->added[k].special;
        }
        free(tmp), free(one);
    }
    free(tok_str);
    return st;
}

hyla_status hyla_tokjson_load(const char *path, hyla_tokenizer *t) {
    /* one read, then parse from memory (jansson reads files a character at a time) */
    FILE *f = fopen(path, "rb");
    if (!f) return hyla_fail(HYLA_ERR_IO, "%s: %s", path, strerror(errno));
    char *buf = NULL;
    long size = -1;
    if (fseek(f, 0, SEEK_END) == 0 && (size = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0)
        buf = malloc((size_t)size + 1);
    size_t got = buf ? fread(buf, 1, (size_t)size, f) : 0;
    int rerr = ferror(f);
    fclose(f);
    if (!buf || rerr || got != (size_t)size) {
        free(buf);
        return hyla_fail(buf ? HYLA_ERR_IO : HYLA_ERR_NOMEM, "%s: cannot read it whole", path);
    }
    json_error_t err;
    json_t *root = json_loadb(buf, (size_t)size, 0, &err);
    free(buf);
    if (!root) return hyla_fail(HYLA_ERR_FORMAT, "%s: line %d: %s", path, err.line, err.text);
    t->kind = HYLA_TOKK_BPE;
    t->unk_id = -1;
    hyla_status st = json_is_object(root) ? load_json(t, root) : hyla_fail(HYLA_ERR_FORMAT, "not a JSON object");
    json_decref(root);
    if (st != HYLA_OK) return hyla_fail_wrap(st, "%s", path);
    return HYLA_OK;
}

void hyla_tokjson_free(hyla_tokenizer *t) {
    strmap_free(&t->vocab);
    mergemap_free(&t->merges);
    for (int i = 0; i < t->n_norm; i++) free(t->norm[i].a), free(t->norm[i].b);
    free(t->meta_dec);
    for (int i = 0; i < t->n_added; i++) free(t->added[i].content);
    free(t->added);
    free(t->added_raw.ids), free(t->added_norm.ids);
    free(t->post_pre), free(t->post_post);
}

int32_t hyla_tokjson_token_id(const hyla_tokenizer *t, const char *content) {
    size_t len = strlen(content);
    for (int i = 0; i < t->n_added; i++)
        if (!t->added[i].normalized && t->added[i].len == len && !memcmp(t->added[i].content, content, len))
            return t->added[i].id;
    if (!t->byte_level) return hyla_strmap_get(&t->vocab, content, len);
    uint32_t byte_cp[256];
    int16_t cp_byte[324];
    byte_alphabet(byte_cp, cp_byte);
    char *raw = malloc(len + 1);
    if (!raw) return -1;
    long rl = unmap_bytes(cp_byte, content, len, raw);
    int32_t id = rl < 0 ? -1 : hyla_strmap_get(&t->vocab, raw, (size_t)rl);
    free(raw);
    return id;
}
