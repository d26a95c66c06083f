/* hyla_http.c — the OpenAI-compatible HTTP gateway (hyla_http.h).
 *
 * One request: libmicrohttpd collects the body (up to max_body_bytes) on the connection's
 * thread; the handler parses and validates it (400 naming the field), then drives the Sessions
 * API through libhyla: GetSession of a session named by `session_id`, or CreateSession (which
 * resolves the model: 404 unknown, 503 nothing live; a throw-away session, deleted when the
 * request ends), the chat template rendered, Append (the prompt), Generate.
 * Non-streaming requests answer when Generate returns. Streaming ones are answered at once with
 * an event stream: a producer thread runs Generate and queues server-sent events; libmicrohttpd's
 * content reader (which may block in thread-per-connection mode) sends them; a client that goes
 * away cancels the Generate. gRPC failures become HTTP statuses in one place (http_status_of).
 *
 * Text: generated pieces may end inside a UTF-8 sequence; a decoder keeps the incomplete tail
 * for the next piece and replaces invalid bytes with U+FFFD exactly as Python's
 * bytes.decode('utf-8', 'replace') does, so every JSON string sent is valid UTF-8.
 *
 * Chat on a durable session: the session holds the conversation so far, so `messages` carry
 * only the turns to add. Their text is the template's rendering after an earlier assistant turn
 * (rendered with a placeholder history and cut after the placeholder's turn-closing text), and
 * after each reply the gateway appends what the template closes an assistant turn with, unless
 * the reply's own end-of-turn token already produced it. docs/API.md documents this.
 *
 * Threading: no shared mutable state besides what libmicrohttpd owns; templates are read-only. */
#include "hyla_http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "hyla.h"
#include "hyla_chat_template.h"
#include "hyla_log.h"
#include "hyla_probe.h"

/* A placeholder assistant turn: found in a rendering to cut what comes after it. */
#define TURN_ANCHOR "\001hyla-turn\001"

typedef struct {
    char *model; /* NULL: every model */
    hyla_chat_template *tpl;
} tpl_entry;

struct hyla_http {
    struct MHD_Daemon *d;
    char *coordinator;
    char *tls_ca; /* NULL: plain gRPC to the coordinator */
    tpl_entry *tpls;
    size_t n_tpls;
    size_t max_body;
    uint32_t default_max_tokens;
    int port;
};

hyla_http_params hyla_http_default_params(void) {
    hyla_http_params p;
    memset(&p, 0, sizeof p);
    p.max_body_bytes = 8u << 20;
    p.default_max_tokens = 512;
    p.connection_limit = 256;
    return p;
}

/* ------------------------------------------------------------------------------------------ */
/* Byte buffers and UTF-8                                                                      */

typedef struct {
    char *s;
    size_t n, cap;
    int oom;
} buf;

static void buf_add(buf *b, const void *s, size_t n) {
    if (b->oom)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *o = realloc(b->s, cap);
        if (!o) {
            b->oom = 1;
            return;
        }
        b->s = o;
        b->cap = cap;
    }
    if (n)
        memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

static void buf_str(buf *b, const char *s) { buf_add(b, s, strlen(s)); }

/* The valid continuation-byte range after lead byte b0 at position k (1-based). */
static void utf8_range(unsigned char b0, int k, unsigned char *lo, unsigned char *hi) {
    *lo = 0x80;
    *hi = 0xbf;
    if (k == 1) {
        if (b0 == 0xe0) *lo = 0xa0;
        else if (b0 == 0xed) *hi = 0x9f;
        else if (b0 == 0xf0) *lo = 0x90;
        else if (b0 == 0xf4) *hi = 0x8f;
    }
}

/* Decode s[0..n) into out, replacing each maximal invalid subpart with U+FFFD (Python's
 * 'replace'). Unless final, an incomplete sequence at the end is left unconsumed. Returns the
 * bytes consumed. */
static size_t utf8_clean(const char *s, size_t n, int final, buf *out) {
    static const char fffd[] = "\xef\xbf\xbd";
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        unsigned char b0 = u[i];
        int need = b0 < 0x80 ? 0 : (b0 >= 0xc2 && b0 <= 0xdf) ? 1 : (b0 >= 0xe0 && b0 <= 0xef) ? 2
                 : (b0 >= 0xf0 && b0 <= 0xf4) ? 3 : -1;
        if (need == 0) {
            buf_add(out, s + i, 1);
            i++;
            continue;
        }
        if (need < 0) {
            buf_add(out, fffd, 3);
            i++;
            continue;
        }
        int k = 1;
        while (k <= need && i + (size_t)k < n) {
            unsigned char lo, hi;
            utf8_range(b0, k, &lo, &hi);
            if (u[i + k] < lo || u[i + k] > hi)
                break;
            k++;
        }
        if (k == need + 1) {
            buf_add(out, s + i, (size_t)k);
            i += (size_t)k;
        } else if (i + (size_t)k >= n && !final) {
            return i; /* incomplete so far: wait for more */
        } else {
            buf_add(out, fffd, 3);
            i += (size_t)k;
        }
    }
    return n;
}

/* ------------------------------------------------------------------------------------------ */
/* Errors                                                                                      */

typedef struct {
    unsigned status;
    const char *type;
    const char *code; /* may be NULL */
    const char *param;
    char message[1024];
} http_err;

__attribute__((format(printf, 5, 6))) static int set_err(http_err *e, unsigned status, const char *code,
                                                         const char *param, const char *fmt, ...) {
    e->status = status;
    e->type = status == 401 ? "authentication_error" : status == 403 ? "permission_error"
            : status == 404 ? "not_found_error" : status == 409 ? "conflict_error"
            : status == 429 ? "rate_limit_error" : status >= 500 ? (status == 503 ? "service_unavailable" : "server_error")
            : "invalid_request_error";
    e->code = code;
    e->param = param;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return 0;
}

/* The HTTP status of a failed libhyla call (its gRPC code). */
static unsigned http_status_of(int code) {
    switch (code) {
    case HYLA_CODE_INVALID_ARGUMENT: case HYLA_CODE_OUT_OF_RANGE: case HYLA_CODE_LOCAL: return 400;
    case HYLA_CODE_UNAUTHENTICATED: return 401;
    case HYLA_CODE_PERMISSION_DENIED: return 403;
    case HYLA_CODE_NOT_FOUND: return 404;
    case HYLA_CODE_FAILED_PRECONDITION: case HYLA_CODE_ALREADY_EXISTS: case HYLA_CODE_ABORTED: return 409;
    case HYLA_CODE_RESOURCE_EXHAUSTED: return 429;
    case HYLA_CODE_UNIMPLEMENTED: return 501;
    case HYLA_CODE_UNAVAILABLE: return 503;
    case HYLA_CODE_DEADLINE_EXCEEDED: return 504;
    default: return 500;
    }
}

static int call_err(http_err *e, const char *what) {
    int code = hyla_client_last_code();
    return set_err(e, http_status_of(code), hyla_client_code_name(code), NULL, "%s: %s", what, hyla_last_error());
}

static json_t *err_json(const http_err *e) {
    return json_pack("{s:{s:s, s:s, s:s?, s:s?}}", "error", "message", e->message, "type", e->type, "param", e->param,
                     "code", e->code);
}

static enum MHD_Result send_json(struct MHD_Connection *conn, unsigned status, json_t *j) {
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!s)
        s = strdup("{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\"}}");
    if (!s)
        return MHD_NO;
    size_t n = strlen(s);
    struct MHD_Response *r = MHD_create_response_from_buffer(n, s, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(s);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "application/json");
    enum MHD_Result ret = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result send_err(struct MHD_Connection *conn, const http_err *e) {
    return send_json(conn, e->status, err_json(e));
}

/* ------------------------------------------------------------------------------------------ */
/* Requests                                                                                    */

typedef struct {
    int chat;
    char *model;              /* resolved model name */
    json_t *prompt;           /* completions: string or array of token ids (borrowed from body) */
    json_t *messages;         /* chat: normalised messages (owned) */
    uint32_t max_tokens;
    const char *max_tokens_key; /* the request's name for it: max_tokens or max_completion_tokens */
    float temperature, top_p;
    int has_seed;
    uint64_t seed;
    const char *stop[4];
    size_t n_stop;
    int stream, include_usage, ignore_eos;
    const char *session_id;   /* NULL, "new" or an id */
    const char *tenant;
} creq;

static int get_num(json_t *body, const char *key, double lo, double hi, double *out, int *present, http_err *e) {
    json_t *v = json_object_get(body, key);
    *present = v && !json_is_null(v);
    if (!*present)
        return 1;
    if (!json_is_number(v))
        return set_err(e, 400, "invalid_type", key, "'%s' must be a number", key);
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi))
        return set_err(e, 400, "invalid_value", key, "'%s' must be in [%g, %g], got %g", key, lo, hi, d);
    *out = d;
    return 1;
}

/* Flatten message content parts ([{"type":"text","text":...}]) into a string, as chat templates
 * written for string content expect. */
static json_t *normalize_messages(json_t *msgs, http_err *e) {
    if (!json_is_array(msgs) || json_array_size(msgs) == 0) {
        set_err(e, 400, "invalid_value", "messages", "'messages' must be a non-empty array");
        return NULL;
    }
    json_t *out = json_array();
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        if (!json_is_object(m) || !json_is_string(json_object_get(m, "role"))) {
            set_err(e, 400, "invalid_value", "messages", "messages[%zu] must be an object with a string 'role'", i);
            json_decref(out);
            return NULL;
        }
        /* the roles of OpenAI's chat API; a template would otherwise render any string as a turn */
        static const char *const roles[] = {"system", "developer", "user", "assistant", "tool"};
        const char *role = json_string_value(json_object_get(m, "role"));
        size_t ri = 0;
        while (ri < sizeof roles / sizeof roles[0] && strcmp(role, roles[ri])) ri++;
        if (ri == sizeof roles / sizeof roles[0]) {
            set_err(e, 400, "invalid_value", "messages",
                    "messages[%zu].role '%.64s' is not one of system, developer, user, assistant, tool", i, role);
            json_decref(out);
            return NULL;
        }
        json_t *c = json_deep_copy(m);
        json_t *content = json_object_get(m, "content");
        if (json_is_array(content)) {
            buf b = {0};
            size_t k;
            json_t *part;
            json_array_foreach(content, k, part) {
                const char *type = json_string_value(json_object_get(part, "type"));
                const char *text = json_string_value(json_object_get(part, "text"));
                if (!type || strcmp(type, "text") || !text) {
                    if (type && !strcmp(type, "text"))
                        set_err(e, 400, "invalid_type", "messages", "messages[%zu].content[%zu].text must be a string", i, k);
                    else
                        set_err(e, 400, "invalid_value", "messages", "messages[%zu].content[%zu]: only text parts are supported", i, k);
                    free(b.s);
                    json_decref(c);
                    json_decref(out);
                    return NULL;
                }
                buf_str(&b, text);
            }
            json_object_set_new(c, "content", json_stringn(b.s ? b.s : "", b.n));
            free(b.s);
        } else if (!content || json_is_null(content)) {
            json_object_set_new(c, "content", json_string(""));
        } else if (!json_is_string(content)) {
            set_err(e, 400, "invalid_type", "messages", "messages[%zu].content must be a string or an array of text parts", i);
            json_decref(c);
            json_decref(out);
            return NULL;
        }
        json_array_append_new(out, c);
    }
    return out;
}

/* Parse and validate the body of a completions or chat request. */
static int parse_creq(const hyla_http *h, json_t *body, int chat, creq *r, http_err *e) {
    memset(r, 0, sizeof *r);
    r->chat = chat;
    if (!json_is_object(body))
        return set_err(e, 400, "invalid_json", NULL, "the request body must be a JSON object");
    json_t *v = json_object_get(body, "model");
    if (v && !json_is_null(v) && !json_is_string(v))
        return set_err(e, 400, "invalid_type", "model", "'model' must be a string");
    r->model = json_is_string(v) && *json_string_value(v) ? strdup(json_string_value(v)) : NULL;
    if (chat) {
        r->messages = normalize_messages(json_object_get(body, "messages"), e);
        if (!r->messages)
            return 0;
        json_t *tools = json_object_get(body, "tools");
        if (json_array_size(tools) > 0)
            return set_err(e, 400, "unsupported_parameter", "tools", "'tools' is not supported");
    } else {
        r->prompt = json_object_get(body, "prompt");
        if (json_is_array(r->prompt) && json_array_size(r->prompt) == 1 && json_is_string(json_array_get(r->prompt, 0)))
            r->prompt = json_array_get(r->prompt, 0);
        if (json_is_array(r->prompt)) {
            size_t i;
            json_t *t;
            json_array_foreach(r->prompt, i, t) {
                if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) > INT32_MAX)
                    return set_err(e, 400, "invalid_value", "prompt",
                                   "'prompt' must be a string, an array of one string, or an array of token ids");
            }
        } else if (!json_is_string(r->prompt)) {
            return set_err(e, 400, "invalid_value", "prompt",
                           "'prompt' must be a string, an array of one string, or an array of token ids");
        }
        if (json_is_true(json_object_get(body, "echo")))
            return set_err(e, 400, "unsupported_parameter", "echo", "'echo' is not supported");
        v = json_object_get(body, "suffix");
        if (v && !json_is_null(v))
            return set_err(e, 400, "unsupported_parameter", "suffix", "'suffix' is not supported");
        v = json_object_get(body, "best_of");
        if (v && !json_is_null(v) && !(json_is_integer(v) && json_integer_value(v) == 1))
            return set_err(e, 400, "unsupported_parameter", "best_of", "'best_of' must be 1");
    }
    v = json_object_get(body, "logprobs");
    if (v && !json_is_null(v) && !json_is_false(v))
        return set_err(e, 400, "unsupported_parameter", "logprobs", "'logprobs' is not supported");
    v = json_object_get(body, "n");
    if (v && !json_is_null(v) && !(json_is_integer(v) && json_integer_value(v) == 1))
        return set_err(e, 400, "unsupported_parameter", "n", "'n' must be 1");

    /* chat: max_completion_tokens, the newer name, wins over max_tokens when both are given */
    const char *mt_key = chat ? "max_completion_tokens" : "max_tokens";
    v = json_object_get(body, mt_key);
    if (chat && (!v || json_is_null(v))) {
        mt_key = "max_tokens";
        v = json_object_get(body, mt_key);
    }
    if (v && !json_is_null(v)) {
        if (!json_is_integer(v))
            return set_err(e, 400, "invalid_type", mt_key, "'%s' must be an integer", mt_key);
        if (json_integer_value(v) < 1 || json_integer_value(v) > UINT32_MAX)
            return set_err(e, 400, "invalid_value", mt_key, "'%s' must be an integer >= 1", mt_key);
        r->max_tokens = (uint32_t)json_integer_value(v);
        r->max_tokens_key = mt_key;
    } else {
        r->max_tokens_key = mt_key;
        r->max_tokens = chat ? h->default_max_tokens : 16; /* OpenAI's default for completions */
    }
    double d = 1;
    int present;
    if (!get_num(body, "temperature", 0, 2, &d, &present, e))
        return 0;
    r->temperature = present ? (float)d : 1.0f;
    d = 1;
    if (!get_num(body, "top_p", 0, 1, &d, &present, e))
        return 0;
    /* OpenAI's top_p 0 keeps the most probable token alone; the Sessions API reads 0 as "off"
       (proto3 has no unset), so 0 travels as the smallest positive float, whose nucleus is the
       top token (the sampler always keeps one) */
    r->top_p = !present ? 1.0f : d > 0 ? (float)d : FLT_MIN;
    v = json_object_get(body, "seed");
    if (v && !json_is_null(v)) {
        if (!json_is_integer(v))
            return set_err(e, 400, "invalid_type", "seed", "'seed' must be an integer");
        r->has_seed = 1;
        r->seed = (uint64_t)json_integer_value(v);
    }
    v = json_object_get(body, "stop");
    if (json_is_string(v)) {
        r->stop[r->n_stop++] = json_string_value(v);
    } else if (json_is_array(v)) {
        if (json_array_size(v) > 4)
            return set_err(e, 400, "invalid_value", "stop", "'stop' takes at most 4 sequences");
        size_t i;
        json_t *s;
        json_array_foreach(v, i, s) {
            if (!json_is_string(s))
                return set_err(e, 400, "invalid_type", "stop", "'stop' must be a string or an array of strings");
            r->stop[r->n_stop++] = json_string_value(s);
        }
    } else if (v && !json_is_null(v)) {
        return set_err(e, 400, "invalid_type", "stop", "'stop' must be a string or an array of strings");
    }
    for (size_t i = 0; i < r->n_stop; i++)
        if (!*r->stop[i])
            return set_err(e, 400, "invalid_value", "stop", "'stop' sequences must not be empty");
    v = json_object_get(body, "stream");
    if (v && !json_is_null(v) && !json_is_boolean(v))
        return set_err(e, 400, "invalid_type", "stream", "'stream' must be a boolean");
    r->stream = json_is_true(v);
    r->include_usage = json_is_true(json_object_get(json_object_get(body, "stream_options"), "include_usage"));
    v = json_object_get(body, "ignore_eos");
    if (v && !json_is_null(v) && !json_is_boolean(v))
        return set_err(e, 400, "invalid_type", "ignore_eos", "'ignore_eos' must be a boolean");
    r->ignore_eos = json_is_true(v);
    v = json_object_get(body, "session_id");
    if (v && !json_is_null(v)) {
        if (!json_is_string(v) || !*json_string_value(v))
            return set_err(e, 400, "invalid_type", "session_id", "'session_id' must be a session id or \"new\"");
        r->session_id = json_string_value(v);
    }
    /* no tokens for a new session: nothing to complete (a session named by session_id may
     * continue from what it holds) */
    if (!chat && json_is_array(r->prompt) && json_array_size(r->prompt) == 0 &&
        (!r->session_id || !strcmp(r->session_id, "new")))
        return set_err(e, 400, "invalid_value", "prompt", "'prompt' is empty and no session_id names a session to continue");
    return 1;
}

static void creq_clear(creq *r) {
    free(r->model);
    json_decref(r->messages);
    memset(r, 0, sizeof *r);
}

static const hyla_chat_template *template_for(const hyla_http *h, const char *model) {
    const hyla_chat_template *any = NULL;
    for (size_t i = 0; i < h->n_tpls; i++) {
        if (h->tpls[i].model && model && !strcmp(h->tpls[i].model, model))
            return h->tpls[i].tpl;
        if (!h->tpls[i].model)
            any = h->tpls[i].tpl;
    }
    return any;
}

/* The models served now (workers not dead), as a JSON array of names: ListModels, which every
   valid key may call (a tenant's or the operator's), unlike the Cluster service. */
static json_t *served_models(hyla_client *c, http_err *e) {
    hyla_model_info *mi = NULL;
    size_t n = 0;
    if (hyla_client_list_models(c, &mi, &n) != HYLA_OK) {
        call_err(e, "listing the models");
        return NULL;
    }
    json_t *models = json_array();
    for (size_t i = 0; i < n; i++)
        if (mi[i].name[0])
            json_array_append_new(models, json_string(mi[i].name));
    free(mi);
    return models;
}

/* The text after TURN_ANCHOR in t's rendering of [user, assistant(anchor)] + more. */
static char *after_anchor(const hyla_chat_template *t, json_t *more, int gen, http_err *e) {
    json_t *msgs = json_pack("[{s:s, s:s}, {s:s, s:s}]", "role", "user", "content", "", "role", "assistant", "content",
                             TURN_ANCHOR);
    if (more)
        json_array_extend(msgs, more);
    char *out = NULL;
    hyla_status st = hyla_chat_template_render(t, msgs, gen, NULL, &out);
    json_decref(msgs);
    if (st != HYLA_OK) {
        set_err(e, 400, "chat_template_error", "messages", "%s", hyla_last_error());
        return NULL;
    }
    char *a = strstr(out, TURN_ANCHOR);
    if (!a) {
        free(out);
        set_err(e, 400, "chat_template_error", "session_id",
                "this chat template does not show an assistant turn's content verbatim; it cannot continue a session");
        return NULL;
    }
    char *rest = strdup(a + strlen(TURN_ANCHOR));
    free(out);
    return rest;
}

/* ------------------------------------------------------------------------------------------ */
/* A completion job (shared by the plain and the streaming path)                               */

typedef struct job job;
typedef void (*emit_fn)(job *j, const char *text, size_t n);

struct job {
    const hyla_http *h;
    json_t *doc;              /* the request body (creq's strings point into it) */
    creq r;
    hyla_client *c;
    char session[64];
    int keep;                 /* the session outlives the request (session_id named or "new") */
    int throwaway;            /* delete the session when the job ends: a session the caller did
                                 not ask to keep, or a "new" one whose id the caller never got */
    const hyla_chat_template *tpl;
    char id[48];
    int64_t created;
    uint64_t prompt_tokens;
    buf raw;                  /* generated bytes not yet decoded (an incomplete UTF-8 tail) */
    buf all_raw;              /* every generated byte (for the turn closer) */
    buf text;                 /* decoded text (non-streaming) */
    hyla_generate_result res;
    emit_fn emit;             /* decoded text goes here */
    /* streaming */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    buf out;                  /* SSE bytes queued for the client */
    size_t out_off;
    int done, cancelled, thread_started;
    pthread_t th;
    int client_fd;            /* the HTTP client's socket (-1: unknown), watched while the
                                 handler's own thread appends the prompt or generates */
};

/* The client has closed its end of the connection: a read would see the end of the stream (or
   an error). While the handler's thread is inside an Append or a Generate nothing else reads the
   socket, so a prompt or a completion whose client went away would run to its end for nobody.
   (A client that half-closes after its request looks gone too; HTTP clients do not.) */
static int client_gone(const job *j) {
    if (j->client_fd < 0)
        return 0;
    char c;
    ssize_t r = recv(j->client_fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* hyla_append_params.progress of a prompt: non-zero (cancel the Append) once the client is gone */
static int prompt_progress(const hyla_append_progress *p, void *ud) {
    const job *j = ud;
    if (!client_gone(j))
        return 0;
    HYLA_INFO("http: %s: the client went away; its prompt's Append stops after %llu tokens", j->id,
              (unsigned long long)p->tokens_ingested);
    return 1;
}

/* Delete a throw-away session. A Generate just cancelled may keep it busy for a moment
   (FAILED_PRECONDITION): retry for up to two seconds. */
static void delete_throwaway(hyla_client *c, const char *session) {
    for (int attempt = 0;; attempt++) {
        if (hyla_client_delete_session(c, session, NULL) == HYLA_OK)
            return;
        if (hyla_client_last_code() != HYLA_CODE_FAILED_PRECONDITION || attempt >= 40) {
            HYLA_WARN("http: deleting the throw-away session %s: %s", session, hyla_last_error());
            return;
        }
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

static void job_free(job *j) {
    if (!j)
        return;
    if (j->throwaway && j->session[0] && j->c)
        delete_throwaway(j->c, j->session);
    hyla_client_close(j->c);
    creq_clear(&j->r);
    json_decref(j->doc);
    free(j->raw.s);
    free(j->all_raw.s);
    free(j->text.s);
    free(j->out.s);
    if (j->thread_started) {
        pthread_mutex_destroy(&j->mu);
        pthread_cond_destroy(&j->cv);
    }
    free(j);
}

static void random_hex(char *out, size_t n) {
    static const char hex[] = "0123456789abcdef";
    unsigned char b[32];
    int fd = open("/dev/urandom", O_RDONLY);
    size_t got = 0;
    if (fd >= 0) {
        ssize_t k = read(fd, b, sizeof b);
        got = k > 0 ? (size_t)k : 0;
        close(fd);
    }
    for (size_t i = got; i < sizeof b; i++)
        b[i] = (unsigned char)(rand() ^ (int)time(NULL));
    for (size_t i = 0; i < n && i < 2 * sizeof b; i++)
        out[i] = hex[(b[i / 2] >> (i % 2 ? 0 : 4)) & 15];
    out[n] = 0;
}

/* Everything before Generate: the model, the session, the prompt appended. On failure fills e. */
/* The caller's API key (Authorization: Bearer KEY), forwarded to the coordinator; NULL: none. */
static const char *bearer_of(struct MHD_Connection *conn) {
    const char *a = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
    return a && strncmp(a, "Bearer ", 7) == 0 ? a + 7 : NULL;
}

static int job_prepare(job *j, const char *tenant, const char *api_key, http_err *e) {
    creq *r = &j->r;
    hyla_client_params cp = hyla_client_default_params();
    cp.api_key = api_key;
    cp.tls_ca = j->h->tls_ca;
    if (hyla_client_connect(j->h->coordinator, tenant, &cp, &j->c) != HYLA_OK)
        return set_err(e, 400, "invalid_tenant", NULL, "%s", hyla_last_error());
    hyla_session_info si;
    memset(&si, 0, sizeof si);
    int continuing = r->session_id && strcmp(r->session_id, "new");
    if (continuing) {
        if (hyla_client_get_session(j->c, r->session_id, &si) != HYLA_OK) {
            int code = hyla_client_last_code();
            return set_err(e, http_status_of(code), code == HYLA_CODE_NOT_FOUND ? "session_not_found"
                                                    : hyla_client_code_name(code), "session_id", "%s", hyla_last_error());
        }
        if (r->model && strcmp(r->model, si.model)) {
            set_err(e, 400, "model_mismatch", "model", "session %s serves model '%s', not '%s'", si.id, si.model, r->model);
            hyla_session_info_clear(&si);
            return 0;
        }
        free(r->model);
        r->model = strdup(si.model);
        snprintf(j->session, sizeof j->session, "%s", si.id);
        j->keep = 1;
    } else {
        /* CreateSession resolves the model (none named: the only one served) and says when
           nothing serves it; a throw-away session costs one directory entry */
        hyla_create_params p = hyla_create_default_params();
        p.model = r->model;
        p.has_sampling = 1;
        p.sampling.temperature = r->temperature;
        p.sampling.top_p = r->top_p;
        if (r->has_seed) {
            p.seed = r->seed;
        } else {
            char hx[17];
            random_hex(hx, 16);
            p.seed = strtoull(hx, NULL, 16);
        }
        hyla_session_info out;
        if (hyla_client_create_session(j->c, &p, &out) != HYLA_OK) {
            int code = hyla_client_last_code();
            if (code == HYLA_CODE_NOT_FOUND)
                return set_err(e, 404, "model_not_found", "model", "the model '%s' does not exist (GET /v1/models lists "
                               "the models served): %s", r->model ? r->model : "", hyla_last_error());
            if (code == HYLA_CODE_UNAVAILABLE)
                return set_err(e, 503, "no_workers", "model", "no live worker can take the request now: %s",
                               hyla_last_error());
            if (code == HYLA_CODE_INVALID_ARGUMENT && !r->model)
                return set_err(e, 400, "model_required", "model", "'model' is required: %s", hyla_last_error());
            return call_err(e, "creating a session");
        }
        snprintf(j->session, sizeof j->session, "%s", out.id);
        free(r->model);
        r->model = strdup(out.model);
        hyla_session_info_clear(&out);
        j->throwaway = 1; /* until the caller has been told the id of a "new" one */
        j->keep = r->session_id != NULL;
    }
    /* max_tokens against what the model's workers generate in one call (their --max-generate):
       refused here, before the prompt is appended, rather than by the worker once the prompt is
       in (streamed: after the response has begun). A listing that fails leaves it to the worker. */
    hyla_model_info *mi = NULL;
    size_t nm = 0;
    if (hyla_client_list_models(j->c, &mi, &nm) == HYLA_OK) {
        uint32_t lim = 0;
        for (size_t i = 0; i < nm; i++)
            if (!strcmp(mi[i].name, r->model))
                lim = mi[i].max_generate;
        free(mi);
        if (lim && r->max_tokens > lim) {
            hyla_session_info_clear(&si);
            return set_err(e, 400, "invalid_value", r->max_tokens_key,
                           "'%s' is %u, over the %u tokens model '%s' generates for one request (hyla-worker "
                           "--max-generate)",
                           r->max_tokens_key, r->max_tokens, lim, r->model);
        }
    }

    /* the prompt text */
    char *text = NULL;
    if (r->chat) {
        j->tpl = template_for(j->h, r->model);
        if (!j->tpl) {
            hyla_session_info_clear(&si);
            return set_err(e, 400, "chat_template_missing", "model",
                           "model '%s' has no chat template; start hyla-coordinator with --chat-template [MODEL=]FILE "
                           "(its tokenizer_config.json), or use /v1/completions", r->model);
        }
        if (continuing && si.position > 0) {
            char *closer = after_anchor(j->tpl, NULL, 0, e);
            char *rest = closer ? after_anchor(j->tpl, r->messages, 1, e) : NULL;
            if (!rest) {
                free(closer);
                hyla_session_info_clear(&si);
                return 0;
            }
            size_t cl = strlen(closer);
            text = strdup(!strncmp(rest, closer, cl) ? rest + cl : rest);
            free(closer);
            free(rest);
        } else {
            if (hyla_chat_template_render(j->tpl, r->messages, 1, NULL, &text) != HYLA_OK) {
                hyla_session_info_clear(&si);
                return set_err(e, 400, "chat_template_error", "messages", "%s", hyla_last_error());
            }
        }
    }
    hyla_session_info_clear(&si);

    hyla_append_params ap = hyla_append_default_params();
    /* BOS before a text prompt, as a tokenizer adds it (the worker adds it only at position 0);
       chat templates write their own, and token-id prompts are taken as they are */
    ap.add_bos = !r->chat && json_is_string(r->prompt);
    ap.progress = prompt_progress;
    ap.progress_ud = j;
    hyla_append_progress fin;
    memset(&fin, 0, sizeof fin);
    hyla_status st = HYLA_OK;
    if (r->chat) {
        st = hyla_client_append_text(j->c, j->session, text, strlen(text), &ap, &fin);
    } else if (json_is_string(r->prompt)) {
        st = hyla_client_append_text(j->c, j->session, json_string_value(r->prompt), json_string_length(r->prompt), &ap, &fin);
    } else {
        size_t n = json_array_size(r->prompt);
        int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
        if (!ids) {
            free(text);
            return set_err(e, 500, "out_of_memory", NULL, "out of memory");
        }
        for (size_t i = 0; i < n; i++)
            ids[i] = (int32_t)json_integer_value(json_array_get(r->prompt, i));
        st = hyla_client_append_tokens(j->c, j->session, ids, n, &ap, &fin);
        free(ids);
    }
    free(text);
    if (st != HYLA_OK)
        return call_err(e, "appending the prompt");
    j->prompt_tokens = fin.tokens_received;
    return 1;
}

static int on_piece(const hyla_token_piece *p, void *ud) {
    job *j = ud;
    if (j->thread_started) {
        pthread_mutex_lock(&j->mu);
        int cancelled = j->cancelled;
        pthread_mutex_unlock(&j->mu);
        if (cancelled)
            return 1;
    } else if (client_gone(j)) { /* a plain response: the handler's thread generates */
        HYLA_INFO("http: %s: the client went away; its completion stops", j->id);
        return 1;
    }
    buf_add(&j->all_raw, p->text, p->text_len);
    buf_add(&j->raw, p->text, p->text_len);
    buf clean = {0};
    size_t used = utf8_clean(j->raw.s ? j->raw.s : "", j->raw.n, 0, &clean);
    memmove(j->raw.s, j->raw.s + used, j->raw.n - used);
    j->raw.n -= used;
    if (clean.n)
        j->emit(j, clean.s, clean.n);
    free(clean.s);
    return 0;
}

/* Generate, then flush the decoder and close the assistant turn of a durable chat session. */
static hyla_status job_generate(job *j) {
    creq *r = &j->r;
    hyla_generate_params g = hyla_generate_default_params();
    g.max_tokens = r->max_tokens;
    g.stop = r->stop;
    g.n_stop = r->n_stop;
    g.has_sampling = 1;
    g.sampling.temperature = r->temperature;
    g.sampling.top_p = r->top_p;
    g.reseed = r->has_seed;
    g.seed = r->seed;
    g.ignore_eos = r->ignore_eos;
    g.on_token = on_piece;
    g.ud = j;
    hyla_status st = hyla_client_generate(j->c, j->session, &g, &j->res);
    buf clean = {0};
    utf8_clean(j->raw.s ? j->raw.s : "", j->raw.n, 1, &clean);
    j->raw.n = 0;
    if (clean.n)
        j->emit(j, clean.s, clean.n);
    free(clean.s);
    if (st != HYLA_OK)
        return st;
    if (r->chat && j->keep) {
        http_err e;
        char *closer = after_anchor(j->tpl, NULL, 0, &e);
        if (closer) {
            /* the reply's end-of-turn token may have written the start of the closer already */
            size_t cl = strlen(closer), k = cl;
            while (k > 0 && !(j->all_raw.n >= k && !memcmp(j->all_raw.s + j->all_raw.n - k, closer, k)))
                k--;
            hyla_append_params ap = hyla_append_default_params();
            hyla_status as = cl > k ? hyla_client_append_text(j->c, j->session, closer + k, cl - k, &ap, NULL) : HYLA_OK;
            free(closer);
            if (as != HYLA_OK)
                return as;
        }
    }
    return HYLA_OK;
}

static const char *finish_name(hyla_finish_reason f) { return f == HYLA_FINISH_LENGTH ? "length" : "stop"; }

static json_t *usage_json(const job *j) {
    return json_pack("{s:I, s:I, s:I}", "prompt_tokens", (json_int_t)j->prompt_tokens, "completion_tokens",
                     (json_int_t)j->res.delivered, "total_tokens", (json_int_t)(j->prompt_tokens + j->res.delivered));
}

static void add_session_field(const job *j, json_t *o) {
    if (j->keep && j->session[0])
        json_object_set_new(o, "session_id", json_string(j->session));
}

/* ------------------------------------------------------------------------------------------ */
/* Plain responses                                                                             */

static void emit_plain(job *j, const char *text, size_t n) { buf_add(&j->text, text, n); }

static json_t *plain_response(job *j) {
    json_t *choice;
    const char *txt = j->text.s ? j->text.s : "";
    if (j->r.chat)
        choice = json_pack("{s:i, s:{s:s, s:s%}, s:n, s:s}", "index", 0, "message", "role", "assistant", "content", txt,
                           j->text.n, "logprobs", "finish_reason", finish_name(j->res.finish));
    else
        choice = json_pack("{s:i, s:s%, s:n, s:s}", "index", 0, "text", txt, j->text.n, "logprobs", "finish_reason",
                           finish_name(j->res.finish));
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:[o], s:o}", "id", j->id, "object",
                          j->r.chat ? "chat.completion" : "text_completion", "created", (json_int_t)j->created, "model",
                          j->r.model, "choices", choice, "usage", usage_json(j));
    add_session_field(j, o);
    return o;
}

/* ------------------------------------------------------------------------------------------ */
/* Server-sent events                                                                          */

static void sse_push(job *j, json_t *o) {
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    pthread_mutex_lock(&j->mu);
    if (s) {
        buf_str(&j->out, "data: ");
        buf_str(&j->out, s);
        buf_str(&j->out, "\n\n");
    }
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    free(s);
}

static json_t *chunk(job *j, json_t *delta_or_text, const char *finish) {
    json_t *choice = j->r.chat ? json_pack("{s:i, s:o, s:n, s:s?}", "index", 0, "delta", delta_or_text, "logprobs",
                                           "finish_reason", finish)
                               : json_pack("{s:i, s:o, s:n, s:s?}", "index", 0, "text", delta_or_text, "logprobs",
                                           "finish_reason", finish);
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:[o]}", "id", j->id, "object",
                          j->r.chat ? "chat.completion.chunk" : "text_completion", "created", (json_int_t)j->created,
                          "model", j->r.model, "choices", choice);
    add_session_field(j, o);
    return o;
}

static void emit_sse(job *j, const char *text, size_t n) {
    json_t *t = json_stringn(text, n);
    sse_push(j, chunk(j, j->r.chat ? json_pack("{s:o}", "content", t) : t, NULL));
}

static void *stream_main(void *arg) {
    job *j = arg;
    if (j->r.chat)
        sse_push(j, chunk(j, json_pack("{s:s, s:s}", "role", "assistant", "content", ""), NULL));
    hyla_status st = job_generate(j);
    pthread_mutex_lock(&j->mu);
    int cancelled = j->cancelled;
    pthread_mutex_unlock(&j->mu);
    if (st == HYLA_OK) {
        sse_push(j, chunk(j, j->r.chat ? json_object() : json_string(""), finish_name(j->res.finish)));
        if (j->r.include_usage) {
            json_t *u = json_pack("{s:s, s:s, s:I, s:s, s:[], s:o}", "id", j->id, "object",
                                  j->r.chat ? "chat.completion.chunk" : "text_completion", "created",
                                  (json_int_t)j->created, "model", j->r.model, "choices", "usage", usage_json(j));
            add_session_field(j, u);
            sse_push(j, u);
        }
    } else if (!cancelled) {
        http_err e;
        call_err(&e, "generating");
        sse_push(j, err_json(&e));
    }
    /* the throw-away session goes before the stream ends, so a client that reads to the end
       never sees it listed */
    if (j->throwaway && j->session[0]) {
        delete_throwaway(j->c, j->session);
        j->session[0] = 0;
    }
    pthread_mutex_lock(&j->mu);
    buf_str(&j->out, "data: [DONE]\n\n");
    j->done = 1;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    return NULL;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *out, size_t max) {
    (void)pos;
    job *j = cls;
    pthread_mutex_lock(&j->mu);
    while (j->out.n == j->out_off && !j->done)
        pthread_cond_wait(&j->cv, &j->mu);
    ssize_t k;
    if (j->out.n > j->out_off) {
        size_t n = j->out.n - j->out_off;
        if (n > max)
            n = max;
        memcpy(out, j->out.s + j->out_off, n);
        j->out_off += n;
        if (j->out_off == j->out.n)
            j->out.n = j->out_off = 0;
        k = (ssize_t)n;
    } else {
        k = MHD_CONTENT_READER_END_OF_STREAM;
    }
    pthread_mutex_unlock(&j->mu);
    return k;
}

/* The response is done with (sent, or the client went away): stop the producer and free. */
static void stream_free(void *cls) {
    job *j = cls;
    pthread_mutex_lock(&j->mu);
    j->cancelled = 1;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    pthread_join(j->th, NULL);
    job_free(j);
}

/* ------------------------------------------------------------------------------------------ */
/* Routes                                                                                      */

static enum MHD_Result handle_completion(hyla_http *h, struct MHD_Connection *conn, const char *body, size_t n,
                                         int chat) {
    http_err e;
    json_error_t jerr;
    json_t *doc = json_loadb(body ? body : "", n, 0, &jerr);
    if (!doc) {
        set_err(&e, 400, "invalid_json", NULL, "the request body is not valid JSON: %s (line %d, column %d)", jerr.text,
                jerr.line, jerr.column);
        return send_err(conn, &e);
    }
    job *j = calloc(1, sizeof *j);
    if (!j) {
        json_decref(doc);
        set_err(&e, 500, "out_of_memory", NULL, "out of memory");
        return send_err(conn, &e);
    }
    j->doc = doc; /* the request's strings (prompt, stop, session_id) point into it */
    j->h = h;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    j->client_fd = ci ? ci->connect_fd : -1;
    j->created = (int64_t)time(NULL);
    strcpy(j->id, chat ? "chatcmpl-" : "cmpl-");
    random_hex(j->id + strlen(j->id), 24);
    const char *tenant = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Hyla-Tenant");
    if (!parse_creq(h, doc, chat, &j->r, &e) || !job_prepare(j, tenant, bearer_of(conn), &e)) {
        enum MHD_Result ret = send_err(conn, &e);
        job_free(j);
        return ret;
    }
    if (!j->r.stream) {
        j->emit = emit_plain;
        enum MHD_Result ret;
        if (job_generate(j) != HYLA_OK) {
            call_err(&e, "generating");
            ret = send_err(conn, &e);
        } else {
            if (j->keep)
                j->throwaway = 0;
            ret = send_json(conn, 200, plain_response(j));
        }
        job_free(j);
        return ret;
    }
    j->emit = emit_sse;
    if (j->keep)
        j->throwaway = 0; /* every chunk carries the id */
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->thread_started = 1;
    if (pthread_create(&j->th, NULL, stream_main, j) != 0) {
        job_free(j);
        set_err(&e, 500, "internal", NULL, "cannot start a thread");
        return send_err(conn, &e);
    }
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, j, stream_free);
    if (!r) {
        stream_free(j);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    enum MHD_Result ret = MHD_queue_response(conn, 200, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result handle_models(hyla_http *h, struct MHD_Connection *conn, const char *one) {
    http_err e;
    hyla_client *c = NULL;
    const char *tenant = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Hyla-Tenant");
    hyla_client_params cp = hyla_client_default_params();
    cp.api_key = bearer_of(conn);
    cp.tls_ca = h->tls_ca;
    if (hyla_client_connect(h->coordinator, tenant, &cp, &c) != HYLA_OK) {
        set_err(&e, 400, "invalid_tenant", NULL, "%s", hyla_last_error());
        return send_err(conn, &e);
    }
    json_t *models = served_models(c, &e);
    hyla_client_close(c);
    if (!models)
        return send_err(conn, &e);
    json_t *data = json_array();
    size_t i;
    json_t *m;
    json_t *found = NULL;
    json_array_foreach(models, i, m) {
        json_t *o = json_pack("{s:O, s:s, s:i, s:s}", "id", m, "object", "model", "created", 0, "owned_by", "hyla");
        if (one && !strcmp(one, json_string_value(m)))
            found = json_incref(o);
        json_array_append_new(data, o);
    }
    json_decref(models);
    if (one) {
        json_decref(data);
        if (!found) {
            set_err(&e, 404, "model_not_found", "model", "the model '%s' does not exist", one);
            return send_err(conn, &e);
        }
        return send_json(conn, 200, found);
    }
    return send_json(conn, 200, json_pack("{s:s, s:o}", "object", "list", "data", data));
}

typedef struct {
    buf body;
    int too_big;
} conn_state;

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    hyla_http *h = cls;
    conn_state *cs = *con_cls;
    if (!cs) {
        cs = calloc(1, sizeof *cs);
        if (!cs)
            return MHD_NO;
        *con_cls = cs;
        return MHD_YES;
    }
    if (*upload_size) {
        if (cs->body.n + *upload_size > h->max_body)
            cs->too_big = 1;
        else
            buf_add(&cs->body, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    http_err e;
    int is_get = !strcmp(method, "GET"), is_post = !strcmp(method, "POST");
    if (cs->too_big || cs->body.oom) {
        set_err(&e, 413, "request_too_large", NULL, "the request body is over the limit of %zu bytes", h->max_body);
        return send_err(conn, &e);
    }
    if (!strcmp(url, "/v1/models") || !strncmp(url, "/v1/models/", 11)) {
        if (!is_get) {
            set_err(&e, 405, "method_not_allowed", NULL, "%s %s: use GET", method, url);
            return send_err(conn, &e);
        }
        return handle_models(h, conn, url[10] == '/' ? url + 11 : NULL);
    }
    int chat = !strcmp(url, "/v1/chat/completions");
    if (chat || !strcmp(url, "/v1/completions")) {
        if (!is_post) {
            set_err(&e, 405, "method_not_allowed", NULL, "%s %s: use POST", method, url);
            return send_err(conn, &e);
        }
        return handle_completion(h, conn, cs->body.s, cs->body.n, chat);
    }
    set_err(&e, 404, "unknown_url", NULL, "unknown path %s %s (served: GET /v1/models, POST /v1/completions, "
            "POST /v1/chat/completions)", method, url);
    return send_err(conn, &e);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)cls;
    (void)conn;
    (void)toe;
    conn_state *cs = *con_cls;
    if (cs) {
        free(cs->body.s);
        free(cs);
        *con_cls = NULL;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Start and stop                                                                              */

hyla_status hyla_http_start(const hyla_http_params *params, hyla_http **out) {
    *out = NULL;
    if (!params || !params->listen || !params->coordinator)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "http: listen and coordinator addresses are required");
    hyla_http *h = calloc(1, sizeof *h);
    if (!h)
        return hyla_fail(HYLA_ERR_NOMEM, "http: out of memory");
    h->coordinator = strdup(params->coordinator);
    h->tls_ca = params->tls_ca ? strdup(params->tls_ca) : NULL;
    h->max_body = params->max_body_bytes ? params->max_body_bytes : 8u << 20;
    h->default_max_tokens = params->default_max_tokens ? params->default_max_tokens : 512;
    h->tpls = calloc(params->n_chat_templates + 1, sizeof *h->tpls);
    if (!h->coordinator || !h->tpls) {
        hyla_http_stop(h);
        return hyla_fail(HYLA_ERR_NOMEM, "http: out of memory");
    }
    for (size_t i = 0; i < params->n_chat_templates; i++) {
        const char *spec = params->chat_templates[i], *eq = strchr(spec, '=');
        const char *file = eq ? eq + 1 : spec;
        tpl_entry *t = &h->tpls[h->n_tpls++];
        t->model = eq ? strndup(spec, (size_t)(eq - spec)) : NULL;
        hyla_status st = hyla_chat_template_load(file, &t->tpl);
        if (st != HYLA_OK) {
            hyla_http_stop(h);
            return hyla_fail_wrap(st, "--chat-template %s", spec);
        }
    }
    /* our own listening socket: a port another process listens on is refused here, with the
       reason, rather than shared through the reuse options libmicrohttpd would set */
    int fd, ipv6;
    hyla_status lst = hyla_probe_listen("--http", params->listen, 128, &fd, &h->port, &ipv6);
    if (lst != HYLA_OK) {
        hyla_http_stop(h);
        return lst;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
    if (ipv6)
        flags |= MHD_USE_IPv6;
    unsigned limit = params->connection_limit ? params->connection_limit : 256;
    h->d = MHD_start_daemon(flags, 0, NULL, NULL, on_request, h, MHD_OPTION_LISTEN_SOCKET, fd,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL, MHD_OPTION_CONNECTION_LIMIT, limit,
                            MHD_OPTION_EXTERNAL_LOGGER, hyla_probe_mhd_log, (void *)"http", MHD_OPTION_END);
    if (!h->d) {
        close(fd);
        hyla_http_stop(h);
        return hyla_fail(HYLA_ERR_IO, "--http %s: libmicrohttpd did not start", params->listen);
    }
    HYLA_INFO("http: serving the OpenAI-compatible API on port %d (Sessions API at %s, %zu chat template(s))", h->port,
              h->coordinator, h->n_tpls);
    *out = h;
    return HYLA_OK;
}

int hyla_http_port(const hyla_http *h) { return h ? h->port : 0; }

void hyla_http_stop(hyla_http *h) {
    if (!h)
        return;
    if (h->d)
        MHD_stop_daemon(h->d);
    for (size_t i = 0; i < h->n_tpls; i++) {
        free(h->tpls[i].model);
        hyla_chat_template_free(h->tpls[i].tpl);
    }
    free(h->tpls);
    free(h->coordinator);
    free(h->tls_ca);
    free(h);
}
