/* hyla_tokenizer.h — text <-> token ids, for every tool and server of hyla.
 *
 * Two kinds (docs/MODELS.md §7):
 *   - a model directory with tokenizer.json gets that tokenizer: BPE over byte-level pieces
 *     (GPT-2, Llama-3, Qwen2/3 split patterns) or SentencePiece-style BPE with `▁` and byte
 *     fallback (Llama-2, Mistral), NFC and the other normalizers such files use, added and
 *     special tokens matched in the text, the post-processor's BOS/EOS, and its decoder;
 *   - one without gets the byte-level tokenizer: id = byte, specials HYLA_TOK_BOS..UNK.
 *
 * Threading: a loaded tokenizer is immutable; encode and decode from any number of threads.
 * A decode stream belongs to one thread at a time. */
#ifndef HYLA_TOKENIZER_H
#define HYLA_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "hyla_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* the byte-level tokenizer's specials */
#define HYLA_TOK_BOS 256
#define HYLA_TOK_EOS 257
#define HYLA_TOK_PAD 258
#define HYLA_TOK_UNK 259
#define HYLA_TOK_BYTE_VOCAB 260

/* encode flags */
#define HYLA_TOK_ADD_SPECIAL 1u /* add the post-processor's tokens (e.g. Llama-2's BOS) */
/* decode flags */
#define HYLA_TOK_SKIP_SPECIAL 1u /* leave out tokens marked special (BOS, EOS, <|im_end|>, ...) */
#define HYLA_TOK_TEXT_START 2u   /* the ids start a text: apply the decoder's start rule (the
                                    SentencePiece decoders drop the text's leading space); leave
                                    it off when the ids continue earlier text, as generated
                                    tokens continue a prompt */

typedef struct hyla_tokenizer hyla_tokenizer;
typedef struct hyla_tokenizer_stream hyla_tokenizer_stream;

/* The tokenizer of the model in dir: dir/tokenizer.json when present (its ids must lie below
 * vocab_size), else the byte-level one (needs vocab_size >= HYLA_TOK_BYTE_VOCAB).
 * Caller frees with hyla_tokenizer_free. */
hyla_status hyla_tokenizer_load(const char *dir, int vocab_size, hyla_tokenizer **out);
/* The tokenizer.json at path. Caller frees with hyla_tokenizer_free. */
hyla_status hyla_tokenizer_load_file(const char *path, hyla_tokenizer **out);
void hyla_tokenizer_free(hyla_tokenizer *t); /* accepts NULL */

/* "byte-level", "bpe/byte-level" or "bpe/sentencepiece"; static string. */
const char *hyla_tokenizer_kind(const hyla_tokenizer *t);
/* One more than the largest id the tokenizer can produce. */
int hyla_tokenizer_n_ids(const hyla_tokenizer *t);
/* The id of the token whose text is exactly content (vocabulary or added tokens), or -1. */
int32_t hyla_tokenizer_token_id(const hyla_tokenizer *t, const char *content);
/* 1 when id is a special token (decoding with HYLA_TOK_SKIP_SPECIAL leaves it out). */
int hyla_tokenizer_is_special(const hyla_tokenizer *t, int32_t id);

/* Encode len bytes of UTF-8 text (invalid bytes are read as U+FFFD) with flags
 * (HYLA_TOK_ADD_SPECIAL). *ids: caller frees with free(); *n may be 0. */
hyla_status hyla_tokenizer_encode(const hyla_tokenizer *t, const char *text, size_t len, unsigned flags, int32_t **ids,
                                  int *n);

/* The length of the longest prefix of text[0..len) that encodes to the same ids apart from
 * the rest as within the whole (0 when none is known: encode the whole text at once). For a
 * text that arrives in pieces. */
size_t hyla_tokenizer_safe_prefix(const hyla_tokenizer *t, const char *text, size_t len);

/* Decode n ids with flags (HYLA_TOK_SKIP_SPECIAL, HYLA_TOK_TEXT_START) into valid UTF-8
 * (invalid byte sequences become U+FFFD). *text: NUL-terminated, caller frees with free();
 * *len excludes the NUL. Ids the tokenizer does not know decode to nothing. */
hyla_status hyla_tokenizer_decode(const hyla_tokenizer *t, const int32_t *ids, size_t n, unsigned flags, char **text,
                                  size_t *len);

/* A decoder fed one id at a time that emits only whole UTF-8 characters: a character split
 * across tokens comes out with the token that completes it. t is borrowed until the stream
 * is freed. Caller frees with hyla_tokenizer_stream_free. */
hyla_status hyla_tokenizer_stream_create(const hyla_tokenizer *t, unsigned flags, hyla_tokenizer_stream **out);
void hyla_tokenizer_stream_free(hyla_tokenizer_stream *s); /* accepts NULL */
/* Feed one id; returns the text now complete (*len bytes, possibly 0), borrowed until the
 * next call on s. */
const char *hyla_tokenizer_stream_push(hyla_tokenizer_stream *s, int32_t id, size_t *len);
/* End of the ids: returns what is held back (an incomplete character becomes U+FFFD),
 * borrowed until the next call on s; the stream then starts afresh as a continuation. */
const char *hyla_tokenizer_stream_flush(hyla_tokenizer_stream *s, size_t *len);

#ifdef __cplusplus
}
#endif
#endif
