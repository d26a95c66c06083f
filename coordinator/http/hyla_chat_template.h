/* hyla_chat_template.h — chat templates: a model's conversation format (the `chat_template` of
 * its tokenizer_config.json) rendered from OpenAI-style messages into the prompt text.
 *
 * The renderer implements the subset of Jinja that chat templates use, with the environment
 * Hugging Face transformers' apply_chat_template uses (trim_blocks, lstrip_blocks, a single
 * trailing newline of the template dropped, the `tojson` filter without ASCII escaping): text,
 * {{ }}, {% if/elif/else %}, {% for %} (with `loop`, tuple targets, an `if` filter, `else`),
 * {% set %} (names and namespace attributes), whitespace control (`-`), comments; literals,
 * lists, dicts, attribute and item access, slices, `a if c else b`, the arithmetic, comparison,
 * `in`, `~` and boolean operators; the filters and tests chat templates use (trim, length,
 * tojson, defined, none, string, ...); the Python string and dict methods they call (split,
 * strip, startswith, get, items, ...); namespace() and raise_exception(). What it does not
 * know (macros, includes) fails with a message naming the line. docs/API.md "HTTP" lists it.
 *
 * Variables of a render: messages, add_generation_prompt, tools (none), documents (none), the
 * special tokens of the tokenizer_config.json (bos_token, eos_token, ...) and the caller's
 * extra variables.
 *
 * Threading: a template is immutable after load; renders may run on several threads at once. */
#ifndef HYLA_CHAT_TEMPLATE_H
#define HYLA_CHAT_TEMPLATE_H

#include <jansson.h>

#include "hyla_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hyla_chat_template hyla_chat_template;

/* Compile template source (Jinja text). specials: an object of extra variables every render
 * sees (e.g. {"bos_token": "<s>"}), may be NULL; copied. *out: caller frees with
 * hyla_chat_template_free. A syntax error fails with HYLA_ERR_FORMAT naming the line. */
hyla_status hyla_chat_template_create(const char *source, const json_t *specials, hyla_chat_template **out);

/* Load from a file: a tokenizer_config.json (its `chat_template`, a string or a list of
 * {name, template} from which "default" is taken, and its special tokens: bos_token, eos_token,
 * unk_token, pad_token, sep_token, cls_token, mask_token as strings or {"content": ...}) or any
 * other file, read as the template itself. A tokenizer_config.json without chat_template fails
 * with HYLA_ERR_NOT_FOUND. *out: caller frees with hyla_chat_template_free. */
hyla_status hyla_chat_template_load(const char *path, hyla_chat_template **out);

void hyla_chat_template_free(hyla_chat_template *t); /* accepts NULL */

/* The special token variable `name` ("eos_token", ...) of the template, or NULL. Borrowed until
 * hyla_chat_template_free. */
const char *hyla_chat_template_special(const hyla_chat_template *t, const char *name);

/* Render: messages is a JSON array of message objects (role, content, ...: any JSON the template
 * reads), add_generation_prompt as in transformers; extra (may be NULL) is an object of more
 * variables, overriding the specials. *out: NUL-terminated, caller frees with free(). A template
 * error (an undefined operation, raise_exception) fails with HYLA_ERR_INVALID_ARG and the
 * template's message. */
hyla_status hyla_chat_template_render(const hyla_chat_template *t, const json_t *messages, int add_generation_prompt,
                                      const json_t *extra, char **out);

#ifdef __cplusplus
}
#endif
#endif
