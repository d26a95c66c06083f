/* hyla_rpc_common.c — what servers and clients share: the status-code mapping (the one place
 * hyla_status meets grpc_status_code), gRPC library references, message packing with size
 * limits, decoding that never trusts its input, metadata copies.
 * Threading: stateless apart from gRPC's own init count; everything is thread-safe. */
#include "hyla_rpc_impl.h"

#include <grpc/status.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_log.h"

_Thread_local int rpc_on_loop_thread = 0;

/* hyla_rpc_code mirrors grpc_status_code value for value; the casts in this module rely on it. */
_Static_assert((int)HYLA_RPC_OK == (int)GRPC_STATUS_OK, "code values");
_Static_assert((int)HYLA_RPC_CANCELLED == (int)GRPC_STATUS_CANCELLED, "code values");
_Static_assert((int)HYLA_RPC_INVALID_ARGUMENT == (int)GRPC_STATUS_INVALID_ARGUMENT, "code values");
_Static_assert((int)HYLA_RPC_DEADLINE_EXCEEDED == (int)GRPC_STATUS_DEADLINE_EXCEEDED, "code values");
_Static_assert((int)HYLA_RPC_NOT_FOUND == (int)GRPC_STATUS_NOT_FOUND, "code values");
_Static_assert((int)HYLA_RPC_PERMISSION_DENIED == (int)GRPC_STATUS_PERMISSION_DENIED, "code values");
_Static_assert((int)HYLA_RPC_RESOURCE_EXHAUSTED == (int)GRPC_STATUS_RESOURCE_EXHAUSTED, "code values");
_Static_assert((int)HYLA_RPC_FAILED_PRECONDITION == (int)GRPC_STATUS_FAILED_PRECONDITION, "code values");
_Static_assert((int)HYLA_RPC_UNIMPLEMENTED == (int)GRPC_STATUS_UNIMPLEMENTED, "code values");
_Static_assert((int)HYLA_RPC_INTERNAL == (int)GRPC_STATUS_INTERNAL, "code values");
_Static_assert((int)HYLA_RPC_UNAVAILABLE == (int)GRPC_STATUS_UNAVAILABLE, "code values");
_Static_assert((int)HYLA_RPC_DATA_LOSS == (int)GRPC_STATUS_DATA_LOSS, "code values");
_Static_assert((int)HYLA_RPC_UNAUTHENTICATED == (int)GRPC_STATUS_UNAUTHENTICATED, "code values");

const char *hyla_rpc_code_name(hyla_rpc_code code) {
    static const char *names[HYLA_RPC_CODE_COUNT] = {
        "OK",        "CANCELLED",        "UNKNOWN",           "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
        "NOT_FOUND", "ALREADY_EXISTS",   "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",     "UNIMPLEMENTED",    "INTERNAL",
        "UNAVAILABLE", "DATA_LOSS",      "UNAUTHENTICATED",
    };
    if ((unsigned)code >= HYLA_RPC_CODE_COUNT)
        return "UNKNOWN_CODE";
    return names[code];
}

/* The mapping. Servers: a handler's hyla_status becomes this code. Keep docs/API.md in step. */
hyla_rpc_code hyla_rpc_code_from_status(hyla_status s) {
    switch (s) {
    case HYLA_OK: return HYLA_RPC_OK;
    case HYLA_ERR_INVALID_ARG: return HYLA_RPC_INVALID_ARGUMENT;
    case HYLA_ERR_NOT_FOUND: return HYLA_RPC_NOT_FOUND;
    case HYLA_ERR_IO: return HYLA_RPC_INTERNAL;              /* the server's disk, not the caller */
    case HYLA_ERR_FORMAT: return HYLA_RPC_FAILED_PRECONDITION; /* stored data we cannot read */
    case HYLA_ERR_CORRUPT: return HYLA_RPC_DATA_LOSS;
    case HYLA_ERR_MISMATCH: return HYLA_RPC_FAILED_PRECONDITION; /* e.g. snapshot of another model */
    case HYLA_ERR_UNSUPPORTED: return HYLA_RPC_UNIMPLEMENTED;
    case HYLA_ERR_NOMEM: return HYLA_RPC_RESOURCE_EXHAUSTED;
    case HYLA_ERR_DEVICE: return HYLA_RPC_INTERNAL;
    case HYLA_ERR_EXISTS: return HYLA_RPC_ALREADY_EXISTS;
    case HYLA_ERR_RESOURCE: return HYLA_RPC_RESOURCE_EXHAUSTED;
    case HYLA_ERR_PERMISSION: return HYLA_RPC_PERMISSION_DENIED;
    case HYLA_ERR_UNAVAILABLE: return HYLA_RPC_UNAVAILABLE;
    case HYLA_ERR_CANCELLED: return HYLA_RPC_CANCELLED;
    case HYLA_ERR_INTERNAL: return HYLA_RPC_INTERNAL;
    default: return HYLA_RPC_UNKNOWN;
    }
}

/* Clients: a gRPC code becomes this hyla_status (the exact code stays in hyla_rpc_result). */
hyla_status hyla_rpc_status_from_code(hyla_rpc_code code) {
    switch (code) {
    case HYLA_RPC_OK: return HYLA_OK;
    case HYLA_RPC_CANCELLED: return HYLA_ERR_CANCELLED;
    case HYLA_RPC_INVALID_ARGUMENT: return HYLA_ERR_INVALID_ARG;
    case HYLA_RPC_OUT_OF_RANGE: return HYLA_ERR_INVALID_ARG;
    case HYLA_RPC_DEADLINE_EXCEEDED: return HYLA_ERR_UNAVAILABLE;
    case HYLA_RPC_NOT_FOUND: return HYLA_ERR_NOT_FOUND;
    case HYLA_RPC_ALREADY_EXISTS: return HYLA_ERR_EXISTS;
    case HYLA_RPC_PERMISSION_DENIED: return HYLA_ERR_PERMISSION;
    case HYLA_RPC_UNAUTHENTICATED: return HYLA_ERR_PERMISSION;
    case HYLA_RPC_RESOURCE_EXHAUSTED: return HYLA_ERR_RESOURCE;
    case HYLA_RPC_FAILED_PRECONDITION: return HYLA_ERR_MISMATCH;
    case HYLA_RPC_ABORTED: return HYLA_ERR_UNAVAILABLE;
    case HYLA_RPC_UNIMPLEMENTED: return HYLA_ERR_UNSUPPORTED;
    case HYLA_RPC_UNAVAILABLE: return HYLA_ERR_UNAVAILABLE;
    case HYLA_RPC_DATA_LOSS: return HYLA_ERR_CORRUPT;
    case HYLA_RPC_INTERNAL:
    case HYLA_RPC_UNKNOWN:
    default: return HYLA_ERR_INTERNAL;
    }
}

void rpc_grpc_ref(void) { grpc_init(); }
void rpc_grpc_unref(void) { grpc_shutdown(); }

static hyla_status check_size(size_t len, int max_bytes, const char *what) {
    if (max_bytes > 0 && len > (size_t)max_bytes)
        return hyla_fail(HYLA_ERR_RESOURCE, "%s of %zu bytes exceeds max_message_bytes (%d)", what, len,
                         max_bytes);
    return HYLA_OK;
}

hyla_status rpc_pack(const ProtobufCMessage *msg, int max_bytes, const char *what, grpc_byte_buffer **out) {
    *out = NULL;
    size_t len = protobuf_c_message_get_packed_size(msg);
    char label[256];
    snprintf(label, sizeof label, "%s %s", what, msg->descriptor->name);
    HYLA_TRY(check_size(len, max_bytes, label));
    grpc_slice s = grpc_slice_malloc(len);
    size_t n = protobuf_c_message_pack(msg, GRPC_SLICE_START_PTR(s));
    HYLA_ASSERT(n == len);
    *out = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return HYLA_OK;
}

hyla_status rpc_pack_raw(const void *data, size_t len, int max_bytes, const char *what,
                         grpc_byte_buffer **out) {
    *out = NULL;
    HYLA_TRY(check_size(len, max_bytes, what));
    grpc_slice s = grpc_slice_from_copied_buffer((const char *)data, len);
    *out = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return HYLA_OK;
}

/* Whether a decoded message (and every sub-message) could be encoded again: protobuf-c keeps
 * an unknown field whose over-long tag varint decodes to field number 0, then refuses the
 * encoding of it. */
static int reencodable(const ProtobufCMessage *m, int depth) {
    if (depth > 100) /* protobuf-c itself bounds nesting well below this */
        return 0;
    for (unsigned i = 0; i < m->n_unknown_fields; i++)
        if (m->unknown_fields[i].tag == 0)
            return 0;
    const ProtobufCMessageDescriptor *d = m->descriptor;
    const char *base = (const char *)m;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (f->type != PROTOBUF_C_TYPE_MESSAGE)
            continue;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *)(base + f->quantifier_offset);
            ProtobufCMessage *const *a = *(ProtobufCMessage *const *const *)(base + f->offset);
            for (size_t k = 0; k < n; k++)
                if (a[k] && !reencodable(a[k], depth + 1))
                    return 0;
        } else {
            if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
                *(const uint32_t *)(base + f->quantifier_offset) != f->id)
                continue;
            const ProtobufCMessage *sub = *(ProtobufCMessage *const *)(base + f->offset);
            if (sub && !reencodable(sub, depth + 1))
                return 0;
        }
    }
    return 1;
}

/* Read a varint at *p (< end); 0 when it runs past end or over 10 bytes. */
static int wire_varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
    *v = 0;
    for (int shift = 0; shift < 70 && *p < end; shift += 7) {
        uint8_t b = *(*p)++;
        *v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            return 1;
    }
    return 0;
}

/* The first string field (of d or of a sub-message, at any depth) whose bytes hold a NUL, or
 * NULL. protobuf-c decodes a string into a C string, so a NUL would silently cut it short: an
 * id "a\0b" would act on "a". Runs on bytes protobuf-c has already decoded, so the wire is
 * well formed; anything unexpected ends the walk (the decoded message stands). */
static const ProtobufCFieldDescriptor *wire_nul_string(const ProtobufCMessageDescriptor *d, const uint8_t *p,
                                                        size_t len, int depth) {
    const uint8_t *end = p + len;
    while (p < end && depth < 100) {
        uint64_t tag, v;
        if (!wire_varint(&p, end, &tag))
            return NULL;
        switch (tag & 7) {
        case 0:
            if (!wire_varint(&p, end, &v))
                return NULL;
            break;
        case 1:
            p += 8;
            break;
        case 5:
            p += 4;
            break;
        case 2: {
            if (!wire_varint(&p, end, &v) || v > (uint64_t)(end - p))
                return NULL;
            const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field(d, (unsigned)(tag >> 3));
            if (f && f->type == PROTOBUF_C_TYPE_STRING && memchr(p, 0, (size_t)v))
                return f;
            if (f && f->type == PROTOBUF_C_TYPE_MESSAGE) {
                const ProtobufCFieldDescriptor *g = wire_nul_string(f->descriptor, p, (size_t)v, depth + 1);
                if (g)
                    return g;
            }
            p += v;
            break;
        }
        default:
            return NULL;
        }
    }
    return NULL;
}

hyla_status hyla_rpc_unpack(const ProtobufCMessageDescriptor *desc, const void *data, size_t len,
                            ProtobufCMessage **out) {
    HYLA_ASSERT(desc && out && (data || len == 0));
    *out = NULL;
    ProtobufCMessage *m = protobuf_c_message_unpack(desc, NULL, len, data);
    if (m && !reencodable(m, 0)) {
        protobuf_c_message_free_unpacked(m, NULL);
        m = NULL;
    }
    if (!m)
        return hyla_fail(HYLA_ERR_FORMAT, "%zu bytes do not decode as %s", len, desc->name);
    const ProtobufCFieldDescriptor *f = wire_nul_string(desc, data, len, 0);
    if (f) {
        protobuf_c_message_free_unpacked(m, NULL);
        return hyla_fail(HYLA_ERR_INVALID_ARG, "field %s (in %s) holds a NUL byte; strings may not", f->name,
                         desc->name);
    }
    *out = m;
    return HYLA_OK;
}

ProtobufCMessage *rpc_unpack(const ProtobufCMessageDescriptor *desc, grpc_byte_buffer *bb, size_t *len_out) {
    grpc_byte_buffer_reader r;
    if (!grpc_byte_buffer_reader_init(&r, bb)) { /* fails only for undecompressable payloads */
        hyla_fail(HYLA_ERR_FORMAT, "a %s payload that does not decompress", desc->name);
        return NULL;
    }
    grpc_slice s = grpc_byte_buffer_reader_readall(&r);
    grpc_byte_buffer_reader_destroy(&r);
    size_t len = GRPC_SLICE_LENGTH(s);
    if (len_out)
        *len_out = len;
    ProtobufCMessage *m = NULL;
    hyla_rpc_unpack(desc, GRPC_SLICE_START_PTR(s), len, &m);
    grpc_slice_unref(s);
    return m;
}

gpr_timespec rpc_deadline_from_ms(int64_t ms) {
    if (ms <= 0)
        return gpr_inf_future(GPR_CLOCK_REALTIME);
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(ms, GPR_TIMESPAN));
}

char *rpc_slice_strdup(grpc_slice s) {
    size_t n = GRPC_SLICE_LENGTH(s);
    char *p = malloc(n + 1);
    HYLA_ASSERT(p);
    memcpy(p, GRPC_SLICE_START_PTR(s), n);
    p[n] = 0;
    return p;
}

void rpc_out_push(rpc_out **head, rpc_out **tail, size_t *len, grpc_byte_buffer *bb) {
    rpc_out *o = malloc(sizeof *o);
    HYLA_ASSERT(o);
    o->next = NULL;
    o->bb = bb;
    if (*tail)
        (*tail)->next = o;
    else
        *head = o;
    *tail = o;
    (*len)++;
}

grpc_byte_buffer *rpc_out_pop(rpc_out **head, rpc_out **tail, size_t *len) {
    rpc_out *o = *head;
    if (!o)
        return NULL;
    *head = o->next;
    if (!*head)
        *tail = NULL;
    (*len)--;
    grpc_byte_buffer *bb = o->bb;
    free(o);
    return bb;
}

void rpc_out_free_after_head(rpc_out **head, rpc_out **tail, size_t *len) {
    if (!*head)
        return;
    rpc_out *rest = (*head)->next, *rest_tail = NULL;
    size_t n = 0;
    (*head)->next = NULL;
    *tail = *head;
    *len = 1;
    rpc_out_free_all(&rest, &rest_tail, &n);
}

void rpc_out_free_all(rpc_out **head, rpc_out **tail, size_t *len) {
    rpc_out *o = *head;
    while (o) {
        rpc_out *next = o->next;
        grpc_byte_buffer_destroy(o->bb);
        free(o);
        o = next;
    }
    *head = *tail = NULL;
    *len = 0;
}

hyla_status rpc_kv_copy(const grpc_metadata *md, size_t n, rpc_kv **out, size_t *n_out) {
    *out = NULL;
    *n_out = 0;
    if (n == 0)
        return HYLA_OK;
    rpc_kv *kv = calloc(n, sizeof *kv);
    if (!kv)
        return hyla_fail(HYLA_ERR_NOMEM, "metadata copy");
    for (size_t i = 0; i < n; i++) {
        kv[i].key = rpc_slice_strdup(md[i].key);
        kv[i].value = rpc_slice_strdup(md[i].value);
    }
    *out = kv;
    *n_out = n;
    return HYLA_OK;
}

void rpc_kv_clear(rpc_kv *kv, size_t n) {
    for (size_t i = 0; i < n; i++) {
        free(kv[i].key);
        free(kv[i].value);
    }
}

void rpc_kv_free(rpc_kv *kv, size_t n) {
    rpc_kv_clear(kv, n);
    free(kv);
}

grpc_channel_args rpc_message_size_args(grpc_arg args[2], int max_bytes) {
    memset(args, 0, 2 * sizeof *args);
    args[0].type = GRPC_ARG_INTEGER;
    args[0].key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[0].value.integer = max_bytes;
    args[1].type = GRPC_ARG_INTEGER;
    args[1].key = (char *)GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
    args[1].value.integer = max_bytes;
    return (grpc_channel_args){2, args};
}

int rpc_cq_next(grpc_completion_queue *cq, rpc_tag **tag, int *ok) {
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            return 0;
        if (ev.type != GRPC_OP_COMPLETE)
            continue;
        *tag = ev.tag;
        *ok = ev.success;
        return 1;
    }
}

const char *rpc_kv_find(const rpc_kv *kv, size_t n, const char *key) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(kv[i].key, key) == 0)
            return kv[i].value;
    return NULL;
}

int rpc_start_batch(grpc_call *call, const grpc_op *ops, size_t n, rpc_tag *tag, const char *what) {
    grpc_call_error e = grpc_call_start_batch(call, ops, n, tag, NULL);
    if (e != GRPC_CALL_OK) {
        HYLA_ERROR("rpc: grpc_call_start_batch(%s) refused: %s", what, grpc_call_error_to_string(e));
        return 1;
    }
    return 0;
}

ProtobufCMessage *hyla_rpc_message_dup(const ProtobufCMessage *m) {
    size_t n = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = malloc(n ? n : 1);
    HYLA_ASSERT(buf);
    protobuf_c_message_pack(m, buf);
    ProtobufCMessage *copy = protobuf_c_message_unpack(m->descriptor, NULL, n, buf);
    free(buf);
    HYLA_ASSERT(copy);
    return copy;
}
