/* hyla_tokenizer.c — the public tokenizer: loading (tokenizer.json through hyla_bpe.c, else
 * the byte-level kind), decoding whole id lists and decode streams.
 *
 * Decoding: every id's bytes are precomputed at load (the decoder's per-token steps: byte
 * alphabet, `▁` -> space, <0xHH> -> the byte); a text is their concatenation, read as UTF-8
 * with each maximal invalid subpart replaced by U+FFFD, less the decoder's leading strip. A
 * stream holds back an incomplete character until the token that completes it arrives.
 * Threading: see hyla_tokenizer.h. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "hyla_tokenizer_impl.h"
#include "hyla_unicode.h"

static hyla_tokenizer *tok_new(void) {
    hyla_tokenizer *t = calloc(1, sizeof *t);
    if (t) t->unk_id = -1;
    return t;
}

hyla_status hyla_tokenizer_load_file(const char *path, hyla_tokenizer **out) {
    *out = NULL;
    hyla_tokenizer *t = tok_new();
    if (!t) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    hyla_status st = hyla_tokjson_load(path, t);
    if (st != HYLA_OK) {
        hyla_tokenizer_free(t);
        return st;
    }
    *out = t;
    return HYLA_OK;
}

hyla_status hyla_tokenizer_load(const char *dir, int vocab_size, hyla_tokenizer **out) {
    *out = NULL;
    char path[4096];
    struct stat sb;
    if (snprintf(path, sizeof path, "%s/tokenizer.json", dir) >= (int)sizeof path)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "model directory path is too long");
    if (stat(path, &sb) == 0) {
        hyla_tokenizer *t;
        HYLA_TRY(hyla_tokenizer_load_file(path, &t));
        if (vocab_size > 0 && t->n_ids > vocab_size) {
            hyla_tokenizer_free(t);
            return hyla_fail(HYLA_ERR_MISMATCH, "%s: token ids reach %d but the model's vocab_size is %d", path,
                             t->n_ids - 1, vocab_size);
        }
        *out = t;
        return HYLA_OK;
    }
    if (vocab_size < HYLA_TOK_BYTE_VOCAB)
        return hyla_fail(HYLA_ERR_UNSUPPORTED,
                         "%s: no tokenizer.json, and the byte-level tokenizer needs vocab_size >= %d (model has %d); "
                         "pass token ids",
                         dir, HYLA_TOK_BYTE_VOCAB, vocab_size);
    hyla_tokenizer *t = tok_new();
    if (!t) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    t->kind = HYLA_TOKK_BYTES;
    t->n_ids = HYLA_TOK_BYTE_VOCAB;
    *out = t;
    return HYLA_OK;
}

void hyla_tokenizer_free(hyla_tokenizer *t) {
    if (!t) return;
    if (t->kind == HYLA_TOKK_BPE) hyla_tokjson_free(t);
    free(t->dec_off), free(t->dec_len), free(t->dec_blob), free(t->special);
    free(t);
}

const char *hyla_tokenizer_kind(const hyla_tokenizer *t) {
    if (t->kind == HYLA_TOKK_BYTES) return "byte-level";
    return t->byte_level ? "bpe/byte-level" : "bpe/sentencepiece";
}

int hyla_tokenizer_n_ids(const hyla_tokenizer *t) { return t->n_ids; }

int32_t hyla_tokenizer_token_id(const hyla_tokenizer *t, const char *content) {
    if (t->kind == HYLA_TOKK_BYTES) {
        static const char *names[] = {"<bos>", "<eos>", "<pad>", "<unk>"};
        for (int i = 0; i < 4; i++)
            if (!strcmp(content, names[i])) return HYLA_TOK_BOS + i;
        size_t l = strlen(content);
        return l == 1 ? (unsigned char)content[0] : -1;
    }
    return hyla_tokjson_token_id(t, content);
}

int hyla_tokenizer_is_special(const hyla_tokenizer *t, int32_t id) {
    if (id < 0 || id >= t->n_ids) return 0;
    if (t->kind == HYLA_TOKK_BYTES) return id >= 256;
    return t->special[id];
}

hyla_status hyla_tokenizer_encode(const hyla_tokenizer *t, const char *text, size_t len, unsigned flags, int32_t **ids,
                                  int *n) {
    *ids = NULL;
    *n = 0;
    if (len > (size_t)INT32_MAX) return hyla_fail(HYLA_ERR_RESOURCE, "encode: %zu bytes of text is over 2 GiB", len);
    if (t->kind == HYLA_TOKK_BPE) return hyla_bpe_encode(t, text, len, flags, ids, n);
    /* the byte-level kind has no post-processor: HYLA_TOK_ADD_SPECIAL adds nothing (a BOS
     * comes from the model's config where a caller wants one) */
    int32_t *v = malloc((len + 1) * sizeof *v);
    if (!v) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    size_t k = 0;
    for (size_t i = 0; i < len; i++) v[k++] = (unsigned char)text[i];
    *ids = v;
    *n = (int)k;
    return HYLA_OK;
}

size_t hyla_tokenizer_safe_prefix(const hyla_tokenizer *t, const char *text, size_t len) {
    if (t->kind == HYLA_TOKK_BYTES) return len;
    /* Cut after a line break that an ASCII letter follows: the split patterns end a piece
     * there and NFC cannot join across it. Anything else that may see the whole text
     * (Prepend and Replace normalizers, a prefix space, a pre-tokenizer-less model such as
     * SentencePiece-style BPE, added tokens holding a line break) makes every cut unsafe. */
    if (!t->n_split || t->prefix_space) return 0;
    for (int i = 0; i < t->n_norm; i++)
        if (t->norm[i].kind != HYLA_NORM_NFC) return 0;
    for (int i = 0; i < t->n_added; i++)
        if (memchr(t->added[i].content, '\n', t->added[i].len)) return 0;
    for (size_t p = len; p-- > 2;) {
        unsigned char c = (unsigned char)text[p];
        if (text[p - 1] != '\n' || !((c | 32) >= 'a' && (c | 32) <= 'z')) continue;
        /* GPT-2's \s+(?!\S) reads a whitespace run at the end of a text differently */
        unsigned char b = (unsigned char)text[p - 2];
        int gpt2 = 0;
        for (int k = 0; k < t->n_split; k++) gpt2 |= t->split[k] == HYLA_SPLIT_GPT2;
        if (b <= ' ' && gpt2) continue;
        return p;
    }
    return 0;
}

/* The bytes of one id (before UTF-8 repair), borrowed from t; NULL/0 for none. */
static const char *id_bytes(const hyla_tokenizer *t, int32_t id, unsigned flags, size_t *len, char *one) {
    *len = 0;
    if (id < 0 || id >= t->n_ids) return NULL;
    if ((flags & HYLA_TOK_SKIP_SPECIAL) && hyla_tokenizer_is_special(t, id)) return NULL;
    if (t->kind == HYLA_TOKK_BYTES) {
        if (id > 255) return NULL;
        one[0] = (char)id;
        *len = 1;
        return one;
    }
    *len = t->dec_len[id];
    return t->dec_blob + t->dec_off[id];
}

/* ---- UTF-8 repair into a growing buffer ---- */

typedef struct {
    char *p;
    size_t n, cap;
} sbuf;

static int sbuf_add(sbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t nc = (b->cap ? b->cap * 2 : 256) + n;
        char *np = realloc(b->p, nc);
        if (!np) return 0;
        b->p = np, b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 1;
}

/* Bytes an invalid sequence at s (n left) spans: the maximal prefix of a valid sequence, at least 1. */
static size_t invalid_span(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t need = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    size_t k = 1;
    while (need && k < need && k < n && (s[k] & 0xC0) == 0x80) {
        if (k == 1 && ((c == 0xE0 && s[1] < 0xA0) || (c == 0xED && s[1] > 0x9F) || (c == 0xF0 && s[1] < 0x90) ||
                       (c == 0xF4 && s[1] > 0x8F)))
            break;
        k++;
    }
    return k;
}

/* Append s[0..n) as valid UTF-8; with final == 0 an incomplete character at the end is not
 * consumed. Returns the bytes consumed, or (size_t)-1 when out of memory. */
static size_t repair(sbuf *b, const char *s, size_t n, int final) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        int bad;
        size_t ok = hyla_utf8_valid_prefix(u + i, n - i, &bad);
        if (ok && !sbuf_add(b, s + i, ok)) return (size_t)-1;
        i += ok;
        if (i == n) break;
        if (!bad && !final) break; /* incomplete: wait for more bytes */
        i += invalid_span(u + i, n - i);
        if (!sbuf_add(b, "\xEF\xBF\xBD", 3)) return (size_t)-1;
    }
    return i;
}

hyla_status hyla_tokenizer_decode(const hyla_tokenizer *t, const int32_t *ids, size_t n, unsigned flags, char **text,
                                  size_t *len) {
    *text = NULL;
    *len = 0;
    sbuf raw = {0}, out = {0};
    char one[1];
    for (size_t i = 0; i < n; i++) {
        size_t l;
        const char *p = id_bytes(t, ids[i], flags, &l, one);
        if (l && !sbuf_add(&raw, p, l)) goto oom;
    }
    if (repair(&out, raw.p ? raw.p : "", raw.n, 1) == (size_t)-1 || !sbuf_add(&out, "", 0)) goto oom;
    free(raw.p);
    size_t skip = 0;
    if (flags & HYLA_TOK_TEXT_START)
        while ((int)skip < t->strip_start && skip < out.n && out.p[skip] == ' ') skip++;
    memmove(out.p, out.p + skip, out.n - skip + 1);
    *text = out.p;
    *len = out.n - skip;
    return HYLA_OK;
oom:
    free(raw.p), free(out.p);
    return hyla_fail(HYLA_ERR_NOMEM, "decode: out of memory");
}

/* ---- streams ---- */

struct hyla_tokenizer_stream {
    const hyla_tokenizer *t;
    unsigned flags;
    int strip_left;  /* leading spaces still to drop */
    sbuf pend, out;  /* bytes of an incomplete character; the text returned last */
};

hyla_status hyla_tokenizer_stream_create(const hyla_tokenizer *t, unsigned flags, hyla_tokenizer_stream **out) {
    *out = calloc(1, sizeof **out);
    if (!*out) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    (*out)->t = t;
    (*out)->flags = flags;
    (*out)->strip_left = (flags & HYLA_TOK_TEXT_START) ? t->strip_start : 0;
    return HYLA_OK;
}

void hyla_tokenizer_stream_free(hyla_tokenizer_stream *s) {
    if (!s) return;
    free(s->pend.p), free(s->out.p);
    free(s);
}

static const char *stream_emit(hyla_tokenizer_stream *s, int final, size_t *len) {
    s->out.n = 0;
    size_t used = repair(&s->out, s->pend.p ? s->pend.p : "", s->pend.n, final);
    if (used == (size_t)-1) used = s->pend.n, s->out.n = 0; /* out of memory: drop rather than stall */
    if (used && s->pend.n > used) memmove(s->pend.p, s->pend.p + used, s->pend.n - used);
    s->pend.n -= used;
    size_t skip = 0;
    while (s->strip_left > 0 && skip < s->out.n && s->out.p[skip] == ' ') skip++, s->strip_left--;
    if (skip < s->out.n) s->strip_left = 0;
    *len = s->out.n - skip;
    return s->out.p ? s->out.p + skip : "";
}

const char *hyla_tokenizer_stream_push(hyla_tokenizer_stream *s, int32_t id, size_t *len) {
    char one[1];
    size_t l;
    const char *p = id_bytes(s->t, id, s->flags, &l, one);
    if (l && !sbuf_add(&s->pend, p, l)) {
        *len = 0;
        return "";
    }
    return stream_emit(s, 0, len);
}

const char *hyla_tokenizer_stream_flush(hyla_tokenizer_stream *s, size_t *len) {
    const char *r = stream_emit(s, 1, len);
    s->strip_left = 0;
    return r;
}
