/* hyla_pretok.c — the split patterns as matchers; see hyla_pretok.h. Each match_* returns the
 * length of the pattern's match starting at i (0: no match there), following the regex
 * alternatives in order. Pure functions; thread-safe. */
#include "hyla_pretok.h"

#include <string.h>

#include "hyla_unicode.h"

#define GPT2_RE "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define LLAMA3_RE                                                                                          \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|" \
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define QWEN2_RE                                                                                       \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|" \
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

hyla_split_kind hyla_split_from_regex(const char *re) {
    if (!strcmp(re, GPT2_RE)) return HYLA_SPLIT_GPT2;
    if (!strcmp(re, LLAMA3_RE)) return HYLA_SPLIT_LLAMA3;
    if (!strcmp(re, QWEN2_RE)) return HYLA_SPLIT_QWEN2;
    return HYLA_SPLIT_NONE;
}

#define IS_L(k) (cls[k] & HYLA_UC_L)
#define IS_N(k) (cls[k] & HYLA_UC_N)
#define IS_S(k) (cls[k] & HYLA_UC_WS)
#define IS_O(k) (!(cls[k] & (HYLA_UC_L | HYLA_UC_N | HYLA_UC_WS))) /* [^\s\p{L}\p{N}] */
#define IS_NL(k) (cp[k] == '\r' || cp[k] == '\n')

static size_t run(const uint8_t *cls, size_t i, size_t n, int bit) {
    size_t j = i;
    while (j < n && (cls[j] & bit)) j++;
    return j - i;
}

static size_t run_other(const uint8_t *cls, size_t i, size_t n) {
    size_t j = i;
    while (j < n && IS_O(j)) j++;
    return j - i;
}

/* 's|'t|'re|'ve|'m|'ll|'d, case-sensitive or (with fold) case-insensitive */
static size_t contraction(const uint32_t *cp, size_t i, size_t n, int fold) {
    if (cp[i] != '\'' || i + 1 >= n) return 0;
    uint32_t d = cp[i + 1];
    if (fold) {
        if (d == 0x17F) d = 's'; /* LATIN SMALL LETTER LONG S folds to s */
        else if (d >= 'A' && d <= 'Z') d += 32;
    }
    if (d == 's' || d == 't' || d == 'm' || d == 'd') return 2;
    if (i + 2 >= n) return 0;
    uint32_t e = cp[i + 2];
    if (fold && e >= 'A' && e <= 'Z') e += 32;
    if ((d == 'r' && e == 'e') || (d == 'v' && e == 'e') || (d == 'l' && e == 'l')) return 3;
    return 0;
}

/* \s+(?!\S)|\s+ at i, given the whitespace run length k > 0 */
static size_t ws_tail(size_t i, size_t k, size_t n) { return (i + k == n || k == 1) ? k : k - 1; }

static size_t match_gpt2(const uint32_t *cp, const uint8_t *cls, size_t i, size_t n) {
    size_t m = contraction(cp, i, n, 0);
    if (m) return m;
    int sp = cp[i] == ' ' && i + 1 < n;
    if (sp && IS_L(i + 1)) return 1 + run(cls, i + 1, n, HYLA_UC_L);
    if (IS_L(i)) return run(cls, i, n, HYLA_UC_L);
    if (sp && IS_N(i + 1)) return 1 + run(cls, i + 1, n, HYLA_UC_N);
    if (IS_N(i)) return run(cls, i, n, HYLA_UC_N);
    if (sp && IS_O(i + 1)) return 1 + run_other(cls, i + 1, n);
    if (IS_O(i)) return run_other(cls, i, n);
    size_t k = run(cls, i, n, HYLA_UC_WS);
    return k ? ws_tail(i, k, n) : 0;
}

static size_t match_llama3(const uint32_t *cp, const uint8_t *cls, size_t i, size_t n, size_t max_digits) {
    size_t m = contraction(cp, i, n, 1);
    if (m) return m;
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    if (!IS_NL(i) && !IS_L(i) && !IS_N(i) && i + 1 < n && IS_L(i + 1)) return 1 + run(cls, i + 1, n, HYLA_UC_L);
    if (IS_L(i)) return run(cls, i, n, HYLA_UC_L);
    /* \p{N}{1,max} */
    if (IS_N(i)) {
        size_t k = run(cls, i, n, HYLA_UC_N);
        return k < max_digits ? k : max_digits;
    }
    /*  ?[^\s\p{L}\p{N}]+[\r\n]* */
    size_t j = 0;
    if (cp[i] == ' ' && i + 1 < n && IS_O(i + 1)) j = i + 1 + run_other(cls, i + 1, n);
    else if (IS_O(i)) j = i + run_other(cls, i, n);
    if (j) {
        while (j < n && IS_NL(j)) j++;
        return j - i;
    }
    size_t k = run(cls, i, n, HYLA_UC_WS);
    if (!k) return 0;
    /* \s*[\r\n]+: backtracking leaves \s* at the last line break of the run */
    for (size_t q = i + k; q-- > i;)
        if (IS_NL(q)) return q - i + 1;
    return ws_tail(i, k, n);
}

size_t hyla_split(hyla_split_kind kind, const uint32_t *cp, const uint8_t *cls, size_t n, uint32_t *ends) {
    size_t np = 0, i = 0, gap = 0; /* gap: code points skipped since the last piece */
    while (i < n) {
        size_t m;
        switch (kind) {
        case HYLA_SPLIT_GPT2: m = match_gpt2(cp, cls, i, n); break;
        case HYLA_SPLIT_LLAMA3: m = match_llama3(cp, cls, i, n, 3); break;
        case HYLA_SPLIT_QWEN2: m = match_llama3(cp, cls, i, n, 1); break;
        default: m = n - i; break;
        }
        if (!m) {
            i++, gap++;
            continue;
        }
        if (gap) ends[np++] = (uint32_t)i, gap = 0;
        i += m;
        ends[np++] = (uint32_t)i;
    }
    if (gap) ends[np++] = (uint32_t)n;
    return np;
}
