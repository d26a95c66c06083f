/* hyla_pretok.h — internal to text/: the split patterns of tokenizer.json pre-tokenizers,
 * written as hand-made matchers that give exactly the pieces the regular expressions give
 * (leftmost-first alternation, greedy quantifiers with backtracking, Oniguruma's Unicode \s,
 * \p{L} and \p{N}). */
#ifndef HYLA_PRETOK_H
#define HYLA_PRETOK_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    HYLA_SPLIT_NONE = 0,
    HYLA_SPLIT_GPT2,   /* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
    HYLA_SPLIT_LLAMA3, /* (?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
    HYLA_SPLIT_QWEN2,  /* as LLAMA3 with \p{N} (one digit) */
} hyla_split_kind;

/* The kind whose pattern is exactly re, or HYLA_SPLIT_NONE. */
hyla_split_kind hyla_split_from_regex(const char *re);

/* Split n code points (cp[], their HYLA_UC_* classes cls[]) into consecutive pieces, matches
 * and the gaps between them alike (the "Isolated" behaviour). ends[] (room for n) receives
 * each piece's end index; returns the piece count. */
size_t hyla_split(hyla_split_kind kind, const uint32_t *cp, const uint8_t *cls, size_t n, uint32_t *ends);

#endif
