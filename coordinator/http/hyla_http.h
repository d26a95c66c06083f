/* hyla_http.h — the OpenAI-compatible HTTP front of a hyla cluster (docs/API.md "HTTP
 * (OpenAI-compatible)"): GET /v1/models, POST /v1/completions, POST /v1/chat/completions, with
 * server-sent events for `stream`, OpenAI-style JSON errors, and the `session_id` extension that
 * continues a durable session instead of a throw-away one.
 *
 * A gateway: it serves HTTP with libmicrohttpd and does its work through libhyla (client/hyla.h)
 * against a coordinator's gRPC Sessions and Cluster services — hyla-coordinator --http runs one
 * against itself — so it holds no cluster state of its own. Chat templates come from files given
 * at start (a tokenizer_config.json or a template file, per model or for every model).
 *
 * Threading: libmicrohttpd runs a thread per connection; every request is independent. */
#ifndef HYLA_HTTP_H
#define HYLA_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include "hyla_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hyla_http hyla_http;

typedef struct {
    const char *listen;                  /* "HOST:PORT" ("127.0.0.1:8080", "[::1]:8080"); port 0 picks
                                            one (hyla_http_port says which). Required. */
    const char *coordinator;             /* gRPC target of the Sessions API ("127.0.0.1:7000"). Required. */
    const char *const *chat_templates;   /* [n_chat_templates] "FILE" (every model) or "MODEL=FILE" */
    size_t n_chat_templates;
    size_t max_body_bytes;               /* largest request body (default 8 MiB; larger: 413) */
    uint32_t default_max_tokens;         /* chat completions without max_tokens (default 512) */
    unsigned connection_limit;           /* simultaneous connections (default 256) */
    const char *tls_ca;                  /* PEM CA of the coordinator's certificate when it serves TLS
                                            (copied); NULL: plain. Callers' `Authorization: Bearer KEY`
                                            headers are forwarded as their API keys. */
} hyla_http_params;

/* The defaults above, by value (listen and coordinator NULL). */
hyla_http_params hyla_http_default_params(void);

/* Load the chat templates, bind and start serving. params and the strings it points to are
 * copied. Fails with HYLA_ERR_INVALID_ARG (a malformed address), HYLA_ERR_IO (the address cannot
 * be bound), or the template file's error. *out: caller frees with hyla_http_stop. */
hyla_status hyla_http_start(const hyla_http_params *params, hyla_http **out);

/* The bound TCP port. */
int hyla_http_port(const hyla_http *h);

/* Stop serving (requests in flight are cut) and free. Accepts NULL. */
void hyla_http_stop(hyla_http *h);

#ifdef __cplusplus
}
#endif
#endif
