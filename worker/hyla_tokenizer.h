/* hyla_tokenizer.h — text <-> token ids. Today: the byte-level tokenizer of docs/MODELS.md §7
 * (id = byte, specials 256..259). A model directory with tokenizer.json is refused for text
 * until a BPE reader exists; token ids (--prompt-ids) always work. Thread-safe (no state). */
#ifndef HYLA_TOKENIZER_H
#define HYLA_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "hyla_status.h"

#define HYLA_TOK_BOS 256
#define HYLA_TOK_EOS 257
#define HYLA_TOK_PAD 258
#define HYLA_TOK_UNK 259
#define HYLA_TOK_BYTE_VOCAB 260

typedef struct hyla_tokenizer hyla_tokenizer;

/* Tokenizer for the model in dir. Caller frees with hyla_tokenizer_free. */
hyla_status hyla_tokenizer_load(const char *dir, int vocab_size, hyla_tokenizer **out);
void hyla_tokenizer_free(hyla_tokenizer *t); /* accepts NULL */
/* Encode len bytes of text. *ids: caller frees with free(). */
hyla_status hyla_tokenizer_encode(const hyla_tokenizer *t, const char *text, size_t len, int32_t **ids, int *n);
/* Append the bytes of token id to buf (capacity cap); returns the byte count (0 for specials). */
size_t hyla_tokenizer_decode(const hyla_tokenizer *t, int32_t id, char *buf, size_t cap);

#endif
