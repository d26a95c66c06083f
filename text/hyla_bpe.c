/* hyla_bpe.c — encoding text with a loaded tokenizer.json (hyla_tokjson.c loads it).
 *
 * Encoding follows the Hugging Face tokenizers pipeline step by step, which is what "exact"
 * means here: added tokens that are not normalized are cut out of the raw text (leftmost,
 * longest); each remaining segment is normalized (NFC, Prepend, Replace) and cut again at
 * normalized added tokens; the pre-tokenizer splits it (the split patterns of hyla_pretok.c,
 * then the byte-level alphabet); BPE encodes each word: the word's symbols (bytes, or
 * characters with <0xHH> byte fallback and unknown-token fusing), then repeatedly the
 * lowest-ranked adjacent pair is merged, leftmost first on ties. Short words scan an array of
 * pair ranks; long ones (a SentencePiece-style text is a single word) use a heap, so no word
 * costs more than O(n log n). The post-processor's template adds BOS/EOS on request.
 *
 * Threading: encode reads the tokenizer only (hyla_tokjson.c filled it); scratch per call. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_tokenizer_impl.h"
#include "hyla_unicode.h"

/* ---- encoding ---- */

typedef struct {
    const hyla_tokenizer *t;
    hyla_ivec out;
    /* scratch, grown as needed */
    uint32_t *cp, *ends;
    uint8_t *cls;
    uint32_t *boff; /* [n+1] byte offset of each code point */
    size_t cap;
    int32_t *sym, *rank, *mid; /* BPE symbols, pair ranks, pair merge ids */
    int32_t *prev, *next;
    size_t scap;
    int oom;
    int segments; /* pieces of the text (added tokens, plain segments) handled so far */
} enc;

static int enc_reserve_syms(enc *e, size_t n) {
    if (n <= e->scap) return 1;
    size_t c = n * 2;
    int32_t *a = realloc(e->sym, c * sizeof *a);
    if (a) e->sym = a;
    int32_t *b = realloc(e->rank, c * sizeof *b);
    if (b) e->rank = b;
    int32_t *d = realloc(e->mid, c * sizeof *d);
    if (d) e->mid = d;
    int32_t *p = realloc(e->prev, c * sizeof *p);
    if (p) e->prev = p;
    int32_t *q = realloc(e->next, c * sizeof *q);
    if (q) e->next = q;
    if (!a || !b || !d || !p || !q) return 0;
    e->scap = c;
    return 1;
}

static void emit(enc *e, int32_t id) {
    if (!hyla_ivec_push(&e->out, id)) e->oom = 1;
}

/* merge by scanning an array of pair ranks: quick for short words */
static void merge_scan(enc *e, size_t m) {
    const hyla_mergemap *mm = &e->t->merges;
    int32_t *s = e->sym, *r = e->rank, *id = e->mid;
    for (size_t i = 0; i + 1 < m; i++) r[i] = hyla_mergemap_get(mm, s[i], s[i + 1], &id[i]);
    while (m > 1) {
        size_t best = 0;
        for (size_t i = 1; i + 1 < m; i++)
            if (r[i] < r[best]) best = i;
        if (r[best] == INT32_MAX) break;
        s[best] = id[best];
        memmove(s + best + 1, s + best + 2, (m - best - 2) * sizeof *s);
        memmove(r + best + 1, r + best + 2, (m - best - 2) * sizeof *r);
        memmove(id + best + 1, id + best + 2, (m - best - 2) * sizeof *id);
        m--;
        if (best + 1 < m) r[best] = hyla_mergemap_get(mm, s[best], s[best + 1], &id[best]);
        if (best > 0) r[best - 1] = hyla_mergemap_get(mm, s[best - 1], s[best], &id[best - 1]);
    }
    for (size_t i = 0; i < m; i++) emit(e, s[i]);
}

/* a binary min-heap of (rank, position) for long words */
typedef struct {
    int64_t *v; /* rank << 32 | pos */
    size_t n;
} heap;

static void heap_push(heap *h, int64_t x) {
    size_t i = h->n++;
    while (i) {
        size_t p = (i - 1) / 2;
        if (h->v[p] <= x) break;
        h->v[i] = h->v[p];
        i = p;
    }
    h->v[i] = x;
}

static int64_t heap_pop(heap *h) {
    int64_t top = h->v[0], x = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && h->v[c + 1] < h->v[c]) c++;
        if (x <= h->v[c]) break;
        h->v[i] = h->v[c];
        i = c;
    }
    h->v[i] = x;
    return top;
}

static void merge_heap(enc *e, size_t m) {
    const hyla_mergemap *mm = &e->t->merges;
    int32_t *s = e->sym, *pv = e->prev, *nx = e->next;
    heap h = {malloc(m * 3 * sizeof(int64_t) + 8), 0};
    size_t hcap = m * 3 + 1;
    if (!h.v) {
        e->oom = 1;
        return;
    }
    for (size_t i = 0; i < m; i++) pv[i] = (int32_t)i - 1, nx[i] = i + 1 < m ? (int32_t)i + 1 : -1;
    for (size_t i = 0; i + 1 < m; i++) {
        int32_t id, r = hyla_mergemap_get(mm, s[i], s[i + 1], &id);
        if (r != INT32_MAX) heap_push(&h, ((int64_t)r << 32) | (int64_t)i);
    }
    while (h.n) {
        int64_t top = heap_pop(&h);
        int32_t r = (int32_t)(top >> 32), pos = (int32_t)(top & 0xffffffff);
        if (s[pos] < 0 || nx[pos] < 0) continue; /* merged away, or last */
        int32_t right = nx[pos], id = 0;
        if (hyla_mergemap_get(mm, s[pos], s[right], &id) != r) continue; /* stale */
        s[pos] = id;
        s[right] = -1;
        nx[pos] = nx[right];
        if (nx[pos] >= 0) pv[nx[pos]] = pos;
        if (h.n + 2 > hcap) {
            hcap *= 2;
            int64_t *nv = realloc(h.v, hcap * sizeof *nv);
            if (!nv) {
                free(h.v);
                e->oom = 1;
                return;
            }
            h.v = nv;
        }
        if (pv[pos] >= 0) {
            int32_t rr = hyla_mergemap_get(mm, s[pv[pos]], s[pos], &id);
            if (rr != INT32_MAX) heap_push(&h, ((int64_t)rr << 32) | (int64_t)pv[pos]);
        }
        if (nx[pos] >= 0) {
            int32_t rr = hyla_mergemap_get(mm, s[pos], s[nx[pos]], &id);
            if (rr != INT32_MAX) heap_push(&h, ((int64_t)rr << 32) | (int64_t)pos);
        }
    }
    free(h.v);
    for (int32_t i = 0; i >= 0 && (size_t)i < m; i = nx[i]) emit(e, s[i]);
}

#define SCAN_MAX 48

/* BPE of w[0..len), a word or a piece of one no merge crosses */
static void encode_run(enc *e, const char *w, size_t len) {
    const hyla_tokenizer *t = e->t;
    if (!enc_reserve_syms(e, len + 1)) {
        e->oom = 1;
        return;
    }
    size_t m = 0;
    if (t->byte_level) {
        for (size_t i = 0; i < len; i++) {
            int32_t id = t->byte_id[(unsigned char)w[i]];
            if (id < 0) id = t->unk_id;
            if (id >= 0) e->sym[m++] = id;
        }
    } else {
        int32_t unk = -1; /* a pending (fused) unknown */
        for (size_t i = 0; i < len;) {
            uint32_t cp;
            size_t cl = hyla_utf8_next((const unsigned char *)w + i, len - i, &cp);
            int32_t id = hyla_strmap_get(&t->vocab, w + i, cl);
            if (id >= 0) {
                if (unk >= 0) e->sym[m++] = unk, unk = -1;
                e->sym[m++] = id;
            } else {
                int fb = t->byte_fallback;
                for (size_t k = 0; fb && k < cl; k++)
                    if (t->fallback_id[(unsigned char)w[i + k]] < 0) fb = 0;
                if (fb) {
                    for (size_t k = 0; k < cl; k++) e->sym[m++] = t->fallback_id[(unsigned char)w[i + k]];
                } else if (t->unk_id >= 0) {
                    if (unk >= 0 && !t->fuse_unk) e->sym[m++] = unk;
                    unk = t->unk_id;
                }
            }
            i += cl;
        }
        if (unk >= 0) e->sym[m++] = unk;
    }
    if (m <= SCAN_MAX) merge_scan(e, m);
    else merge_heap(e, m);
}

/* BPE of one word w[0..len) */
static void encode_word(enc *e, const char *w, size_t len) {
    const hyla_tokenizer *t = e->t;
    if (!len) return;
    if (t->ignore_merges) {
        int32_t id = hyla_strmap_get(&t->vocab, w, len);
        if (id >= 0) {
            emit(e, id);
            return;
        }
    }
    if (!t->cut_at_meta) {
        encode_run(e, w, len);
        return;
    }
    /* SentencePiece-style: a whole text is one word, but no token joins a character to a
     * following `▁`, so no merge crosses there and the pieces give the word's tokens (the
     * lowest-ranked pair of the word is the lowest of its piece; pieces do not interact) */
    size_t from = 0;
    for (size_t i = 1; i + 3 <= len; i++) {
        if (memcmp(w + i, META, 3) || (i >= 3 && !memcmp(w + i - 3, META, 3))) continue;
        encode_run(e, w + from, i - from);
        from = i;
    }
    encode_run(e, w + from, len - from);
}

static int enc_reserve(enc *e, size_t n) {
    if (n <= e->cap) return 1;
    size_t c = n * 2;
    uint32_t *a = realloc(e->cp, c * sizeof *a);
    if (a) e->cp = a;
    uint32_t *b = realloc(e->ends, c * sizeof *b);
    if (b) e->ends = b;
    uint8_t *d = realloc(e->cls, c);
    if (d) e->cls = d;
    uint32_t *o = realloc(e->boff, (c + 1) * sizeof *o);
    if (o) e->boff = o;
    if (!a || !b || !d || !o) return 0;
    e->cap = c;
    return 1;
}

static void split_level(enc *e, const char *s, int level, size_t begin, size_t end) {
    const hyla_tokenizer *t = e->t;
    if (level == t->n_split) {
        encode_word(e, s + e->boff[begin], e->boff[end] - e->boff[begin]);
        return;
    }
    size_t n = end - begin;
    uint32_t *ends = malloc((n + 1) * sizeof *ends);
    if (!ends) {
        e->oom = 1;
        return;
    }
    size_t np = hyla_split(t->split[level], e->cp + begin, e->cls + begin, n, ends);
    size_t from = begin;
    for (size_t k = 0; k < np; k++) {
        split_level(e, s, level + 1, from, begin + ends[k]);
        from = begin + ends[k];
    }
    free(ends);
}

/* Metaspace: spaces become the replacement, one is prepended by the scheme (unless the
 * segment starts with one), and the words are cut before each replacement */
static void encode_metaspace(enc *e, const char *s, size_t len, int at_start) {
    const hyla_tokenizer *t = e->t;
    size_t rl = strlen(t->meta_rep), n = 0, cnt = 0;
    for (size_t i = 0; i < len; i++) cnt += s[i] == ' ';
    char *w = malloc(len + (cnt + 1) * rl + 1);
    if (!w) {
        e->oom = 1;
        return;
    }
    int starts = len && (s[0] == ' ' || (len >= rl && !memcmp(s, t->meta_rep, rl)));
    if (!starts && (t->meta_scheme == HYLA_META_ALWAYS || (t->meta_scheme == HYLA_META_FIRST && at_start)))
        memcpy(w, t->meta_rep, rl), n = rl;
    for (size_t i = 0; i < len; i++) {
        if (s[i] == ' ') memcpy(w + n, t->meta_rep, rl), n += rl;
        else w[n++] = s[i];
    }
    if (!t->meta_split) {
        encode_word(e, w, n);
    } else {
        size_t from = 0;
        for (size_t i = 1; i + rl <= n; i++) {
            if (memcmp(w + i, t->meta_rep, rl)) continue;
            encode_word(e, w + from, i - from);
            from = i;
        }
        encode_word(e, w + from, n - from);
    }
    free(w);
}

/* pre-tokenize and encode a normalized segment that holds no added token */
static void encode_plain(enc *e, const char *s, size_t len) {
    const hyla_tokenizer *t = e->t;
    int at_start = e->segments++ == 0;
    if (t->meta) {
        encode_metaspace(e, s, len, at_start);
        return;
    }
    char *pre = NULL;
    if (t->prefix_space && len && s[0] != ' ') {
        if (!(pre = malloc(len + 1))) {
            e->oom = 1;
            return;
        }
        pre[0] = ' ';
        memcpy(pre + 1, s, len);
        s = pre, len++;
    }
    if (!t->n_split) {
        encode_word(e, s, len);
        free(pre);
        return;
    }
    if (!enc_reserve(e, len + 1)) {
        e->oom = 1;
        free(pre);
        return;
    }
    size_t n = 0;
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t cl;
        if (u[i] < 0x80) cp = u[i], cl = 1;
        else cl = hyla_utf8_next(u + i, len - i, &cp);
        e->cp[n] = cp;
        e->cls[n] = (uint8_t)hyla_uc_class(cp);
        e->boff[n] = (uint32_t)i;
        n++;
        i += cl;
    }
    e->boff[n] = (uint32_t)len;
    split_level(e, s, 0, 0, n);
    free(pre);
}

/* Leftmost-longest match of set in s[from..len): returns 1 with [*ms, *me) and the added index. */
static int find_added(const hyla_tokenizer *t, const hyla_added_set *set, const char *s, size_t from, size_t len,
                      size_t *ms, size_t *me, int32_t *which) {
    if (!set->n) return 0;
    for (size_t i = from; i < len; i++) {
        unsigned char b = (unsigned char)s[i];
        for (uint32_t k = set->first[b]; k < set->first[b + 1]; k++) {
            const hyla_added *a = &t->added[set->ids[k]];
            if (a->len <= len - i && !memcmp(s + i, a->content, a->len)) {
                *ms = i, *me = i + a->len, *which = set->ids[k];
                return 1;
            }
        }
    }
    return 0;
}

static int is_ws_at(const char *s, size_t n, size_t i, size_t *cl) {
    uint32_t cp;
    *cl = hyla_utf8_next((const unsigned char *)s + i, n - i, &cp);
    return (hyla_uc_class(cp) & HYLA_UC_WS) != 0;
}

static int is_word_cp(uint32_t cp) {
    int c = hyla_uc_class(cp);
    return (c & (HYLA_UC_L | HYLA_UC_N)) || cp == '_';
}

/* Cut s[0..len) at the added tokens of set; plain parts go to plain(e, part). */
static void split_added(enc *e, const hyla_added_set *set, const char *s, size_t len,
                        void (*plain)(enc *, const char *, size_t)) {
    const hyla_tokenizer *t = e->t;
    size_t start_off = 0, from = 0, ms, me;
    int32_t w;
    while (from < len && find_added(t, set, s, from, len, &ms, &me, &w)) {
        const hyla_added *a = &t->added[w];
        size_t start = ms, stop = me;
        from = me;
        if (a->single_word) {
            uint32_t cp;
            int before = 0, after = 0;
            if (start > 0) {
                size_t k = start - 1;
                while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
                hyla_utf8_next((const unsigned char *)s + k, len - k, &cp);
                before = is_word_cp(cp);
            }
            if (stop < len) {
                hyla_utf8_next((const unsigned char *)s + stop, len - stop, &cp);
                after = is_word_cp(cp);
            }
            if (before || after) continue;
        }
        if (a->lstrip) {
            size_t k = start;
            while (k > start_off) {
                size_t p = k - 1, cl;
                while (p > start_off && ((unsigned char)s[p] & 0xC0) == 0x80) p--;
                if (!is_ws_at(s, len, p, &cl)) break;
                k = p;
            }
            start = k;
        }
        if (a->rstrip) {
            size_t cl;
            while (stop < len && is_ws_at(s, len, stop, &cl)) stop += cl;
            from = stop;
        }
        if (start_off < start) plain(e, s + start_off, start - start_off);
        emit(e, a->id);
        e->segments++;
        start_off = stop;
    }
    if (start_off < len) plain(e, s + start_off, len - start_off);
}

static void encode_normalized(enc *e, const char *s, size_t len) {
    split_added(e, &e->t->added_norm, s, len, encode_plain);
}

static void encode_segment(enc *e, const char *s, size_t len) {
    char *norm;
    size_t nl;
    if (!e->t->n_norm) {
        encode_normalized(e, s, len);
        return;
    }
    if (hyla_tok_normalize(e->t, s, len, &norm, &nl) != HYLA_OK) {
        e->oom = 1;
        return;
    }
    encode_normalized(e, norm, nl);
    free(norm);
}

hyla_status hyla_bpe_encode(const hyla_tokenizer *t, const char *text, size_t len, unsigned flags, int32_t **ids,
                            int *n) {
    enc e = {.t = t};
    if (flags & HYLA_TOK_ADD_SPECIAL)
        for (int i = 0; i < t->n_post_pre; i++) emit(&e, t->post_pre[i]);
    split_added(&e, &t->added_raw, text, len, encode_segment);
    if (flags & HYLA_TOK_ADD_SPECIAL)
        for (int i = 0; i < t->n_post_post; i++) emit(&e, t->post_post[i]);
    free(e.cp), free(e.ends), free(e.cls), free(e.boff);
    free(e.sym), free(e.rank), free(e.mid), free(e.prev), free(e.next);
    if (e.oom || e.out.n > INT32_MAX) {
        free(e.out.v);
        return hyla_fail(HYLA_ERR_NOMEM, "encode: out of memory for %zu bytes of text", len);
    }
    if (!e.out.v && !(e.out.v = malloc(sizeof *e.out.v))) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    *ids = e.out.v;
    *n = (int)e.out.n;
    return HYLA_OK;
}
