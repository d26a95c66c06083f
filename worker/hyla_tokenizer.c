/* hyla_tokenizer.c — see hyla_tokenizer.h. */
#include "hyla_tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

struct hyla_tokenizer {
    int vocab_size;
};

hyla_status hyla_tokenizer_load(const char *dir, int vocab_size, hyla_tokenizer **out) {
    *out = NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (access(path, F_OK) == 0)
        return hyla_fail(HYLA_ERR_UNSUPPORTED,
                         "%s: tokenizer.json is not supported yet; pass token ids with --prompt-ids", path);
    if (vocab_size < HYLA_TOK_BYTE_VOCAB)
        return hyla_fail(HYLA_ERR_UNSUPPORTED,
                         "%s: the byte-level tokenizer needs vocab_size >= %d (model has %d); pass --prompt-ids", dir,
                         HYLA_TOK_BYTE_VOCAB, vocab_size);
    hyla_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    t->vocab_size = vocab_size;
    *out = t;
    return HYLA_OK;
}

void hyla_tokenizer_free(hyla_tokenizer *t) { free(t); }

hyla_status hyla_tokenizer_encode(const hyla_tokenizer *t, const char *text, size_t len, int32_t **ids, int *n) {
    (void)t;
    *ids = malloc((len ? len : 1) * sizeof **ids);
    if (!*ids) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < len; i++) (*ids)[i] = (unsigned char)text[i];
    *n = (int)len;
    return HYLA_OK;
}

size_t hyla_tokenizer_decode(const hyla_tokenizer *t, int32_t id, char *buf, size_t cap) {
    (void)t;
    if (id < 0 || id > 255 || cap < 1) return 0;
    buf[0] = (char)id;
    return 1;
}
