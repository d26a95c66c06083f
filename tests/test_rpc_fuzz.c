/* test_rpc_fuzz.c — malformed protobuf never crashes a hyla process: every decode path of a
 * public service takes bytes from the network.
 *
 * 1. The method table (proto/hyla_api.c) matches the generated service descriptors.
 * 2. protobuf-c decode paths: for every hyla.v1 message reachable from a service, random
 *    messages are built by reflection, packed (a decode of the packing must give the same
 *    bytes again), then mutated (bit flips, byte sets, inserts, deletes, truncation, range
 *    copies, huge length prefixes, splices) and decoded, by protobuf_c_message_unpack (no crash)
 *    and by hyla_rpc_unpack (what it accepts must re-encode and decode again). A string field
 *    holding a NUL byte, at any depth, is refused naming the field.
 * 3. Server decode paths: a real server on 127.0.0.1:0 registers every hyla.v1 method; mutated
 *    bytes go to random methods as raw messages; every call must end OK or INVALID_ARGUMENT, and
 *    the server must still answer a valid call at the end.
 *
 * Bounded time: HYLA_FUZZ_SECONDS (default 8) split between 2 and 3; HYLA_FUZZ_SEED picks the
 * seed (printed, so a failure can be replayed). Threading: one client thread, the server's loop. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "hyla_api.h"
#include "hyla_rpc.h"
#include "hyla_test.h"

static uint64_t g_rng;

static uint64_t rnd(void) { /* xorshift64* */
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return g_rng * 0x2545F4914F6CDD1DULL;
}
static uint32_t rndn(uint32_t n) { return n ? (uint32_t)(rnd() % n) : 0; }

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* ---------------------------------------------------------------------------------------- */
/* the message types                                                                         */

#define MAX_DESCS 128
static const ProtobufCMessageDescriptor *g_descs[MAX_DESCS];
static int g_n_descs;

static void collect(const ProtobufCMessageDescriptor *d) {
    for (int i = 0; i < g_n_descs; i++)
        if (g_descs[i] == d)
            return;
    HYLA_ASSERT(g_n_descs < MAX_DESCS);
    g_descs[g_n_descs++] = d;
    for (unsigned i = 0; i < d->n_fields; i++)
        if (d->fields[i].type == PROTOBUF_C_TYPE_MESSAGE)
            collect(d->fields[i].descriptor);
}

static void test_table(void) {
    int n_service_methods = 0;
    for (int s = 0; hyla_api_services[s]; s++) {
        const ProtobufCServiceDescriptor *sd = hyla_api_services[s];
        for (unsigned i = 0; i < sd->n_methods; i++) {
            char path[256];
            snprintf(path, sizeof path, "/%s/%s", sd->name, sd->methods[i].name);
            const hyla_api_method *m = hyla_api_find(path);
            CHECK_MSG(m != NULL, "%s missing from hyla_api_methods", path);
            if (m) {
                CHECK_MSG(m->input == sd->methods[i].input && m->output == sd->methods[i].output,
                          "%s: message types differ from the .proto", path);
                CHECK(strcmp(m->service, sd->name) == 0 && strcmp(m->name, sd->methods[i].name) == 0);
            }
            n_service_methods++;
        }
    }
    CHECK_MSG(n_service_methods == hyla_api_method_count(), "%d methods in .proto, %d in the table",
              n_service_methods, hyla_api_method_count());
    CHECK(hyla_api_find("/hyla.v1.Sessions/Nope") == NULL);
    const hyla_api_method *gen = hyla_api_find("/hyla.v1.Sessions/Generate");
    CHECK(gen && !gen->client_streaming && gen->server_streaming && !gen->internal);
    const hyla_api_method *app = hyla_api_find("/hyla.v1.Sessions/Append");
    CHECK(app && app->client_streaming && app->server_streaming);
    for (int i = 0; hyla_api_methods[i].path; i++) {
        collect(hyla_api_methods[i].input);
        collect(hyla_api_methods[i].output);
    }
    printf("test_rpc_fuzz: %d methods, %d message types\n", hyla_api_method_count(), g_n_descs);
}

/* ---------------------------------------------------------------------------------------- */
/* random messages by reflection (freed with protobuf_c_message_free_unpacked)               */

static char *rnd_string(void) {
    size_t n = rndn(4) == 0 ? 0 : rndn(24);
    char *s = malloc(n + 1);
    HYLA_ASSERT(s);
    for (size_t i = 0; i < n; i++)
        s[i] = (char)(' ' + rndn(95));
    s[n] = 0;
    return s;
}

static void rnd_value(const ProtobufCFieldDescriptor *f, void *p, int depth);

static ProtobufCMessage *gen_message(const ProtobufCMessageDescriptor *d, int depth) {
    ProtobufCMessage *m = calloc(1, d->sizeof_message);
    HYLA_ASSERT(m);
    d->message_init(m);
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (rndn(3) == 0)
            continue;
        if (f->type == PROTOBUF_C_TYPE_MESSAGE && depth >= 3)
            continue;
        char *base = (char *)m;
        if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
            uint32_t *oneof_case = (uint32_t *)(base + f->quantifier_offset);
            if (*oneof_case)
                continue;
            *oneof_case = f->id;
            rnd_value(f, base + f->offset, depth);
        } else if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = rndn(4), esz;
            switch (f->type) {
            case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_SFIXED64:
            case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64: case PROTOBUF_C_TYPE_DOUBLE:
                esz = 8; break;
            case PROTOBUF_C_TYPE_STRING: case PROTOBUF_C_TYPE_MESSAGE: esz = sizeof(void *); break;
            case PROTOBUF_C_TYPE_BYTES: esz = sizeof(ProtobufCBinaryData); break;
            case PROTOBUF_C_TYPE_BOOL: esz = sizeof(protobuf_c_boolean); break;
            default: esz = 4; break;
            }
            if (n == 0)
                continue;
            char *arr = calloc(n, esz);
            HYLA_ASSERT(arr);
            for (size_t k = 0; k < n; k++)
                rnd_value(f, arr + k * esz, depth);
            *(size_t *)(base + f->quantifier_offset) = n;
            *(void **)(base + f->offset) = arr;
        } else {
            if (f->label == PROTOBUF_C_LABEL_OPTIONAL && f->quantifier_offset &&
                f->type != PROTOBUF_C_TYPE_MESSAGE && f->type != PROTOBUF_C_TYPE_STRING)
                *(protobuf_c_boolean *)(base + f->quantifier_offset) = 1;
            rnd_value(f, base + f->offset, depth);
        }
    }
    return m;
}

static void rnd_value(const ProtobufCFieldDescriptor *f, void *p, int depth) {
    uint64_t r = rnd();
    if (rndn(4) == 0) /* small values are common in real messages */
        r &= 0xff;
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32: case PROTOBUF_C_TYPE_SINT32: case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_UINT32: case PROTOBUF_C_TYPE_FIXED32:
        *(uint32_t *)p = (uint32_t)r; break;
    case PROTOBUF_C_TYPE_ENUM: {
        const ProtobufCEnumDescriptor *e = f->descriptor;
        *(int32_t *)p = rndn(5) == 0 ? (int32_t)r : e->values[rndn(e->n_values)].value;
        break;
    }
    case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64:
        *(uint64_t *)p = r; break;
    case PROTOBUF_C_TYPE_FLOAT: *(float *)p = (float)(int32_t)r / 7.0f; break;
    case PROTOBUF_C_TYPE_DOUBLE: *(double *)p = (double)(int64_t)r / 7.0; break;
    case PROTOBUF_C_TYPE_BOOL: *(protobuf_c_boolean *)p = (protobuf_c_boolean)(r & 1); break;
    case PROTOBUF_C_TYPE_STRING: *(char **)p = rnd_string(); break;
    case PROTOBUF_C_TYPE_BYTES: {
        ProtobufCBinaryData *b = p;
        b->len = rndn(3) == 0 ? 0 : rndn(64);
        b->data = b->len ? malloc(b->len) : NULL;
        for (size_t i = 0; i < b->len; i++)
            b->data[i] = (uint8_t)rnd();
        break;
    }
    case PROTOBUF_C_TYPE_MESSAGE:
        *(ProtobufCMessage **)p = gen_message(f->descriptor, depth + 1);
        break;
    }
}

static uint8_t *pack(const ProtobufCMessage *m, size_t *len) {
    *len = protobuf_c_message_get_packed_size(m);
    uint8_t *b = malloc(*len ? *len : 1);
    HYLA_ASSERT(b);
    size_t n = protobuf_c_message_pack(m, b);
    HYLA_ASSERT(n == *len);
    return b;
}

/* ---------------------------------------------------------------------------------------- */
/* mutations                                                                                 */

#define MAX_FUZZ 4096

static size_t put_varint(uint8_t *p, uint64_t v) {
    size_t n = 0;
    do {
        p[n] = (uint8_t)(v & 0x7f);
        v >>= 7;
        if (v)
            p[n] |= 0x80;
        n++;
    } while (v);
    return n;
}

/* Mutate buf[0..*len) in place (capacity MAX_FUZZ). other: bytes of another message to splice. */
static void mutate(uint8_t *buf, size_t *len, const uint8_t *other, size_t olen) {
    int rounds = 1 + (int)rndn(4);
    for (int r = 0; r < rounds; r++) {
        size_t n = *len;
        switch (rndn(9)) {
        case 0: /* flip a bit */
            if (n) buf[rndn((uint32_t)n)] ^= (uint8_t)(1u << rndn(8));
            break;
        case 1: /* set a byte to an interesting value */
            if (n) {
                static const uint8_t v[] = {0x00, 0xff, 0x7f, 0x80, 0x01, 0x0a, 0x12, 0x08, 0x0b, 0x0c};
                buf[rndn((uint32_t)n)] = v[rndn(sizeof v)];
            }
            break;
        case 2: /* insert random bytes */
            if (n < MAX_FUZZ - 16) {
                size_t at = rndn((uint32_t)n + 1), k = 1 + rndn(8);
                memmove(buf + at + k, buf + at, n - at);
                for (size_t i = 0; i < k; i++)
                    buf[at + i] = (uint8_t)rnd();
                *len = n + k;
            }
            break;
        case 3: /* delete a range */
            if (n) {
                size_t at = rndn((uint32_t)n), k = 1 + rndn((uint32_t)(n - at));
                memmove(buf + at, buf + at + k, n - at - k);
                *len = n - k;
            }
            break;
        case 4: /* truncate */
            *len = rndn((uint32_t)n + 1);
            break;
        case 5: /* copy a range over another place */
            if (n > 2) {
                size_t a = rndn((uint32_t)n), b = rndn((uint32_t)n), k = 1 + rndn((uint32_t)(n - (a > b ? a : b)));
                memmove(buf + b, buf + a, k);
            }
            break;
        case 6: /* a field with a huge or negative length prefix */
            if (n < MAX_FUZZ - 24) {
                size_t at = rndn((uint32_t)n + 1);
                uint8_t tmp[24];
                size_t k = 0;
                tmp[k++] = (uint8_t)((1 + rndn(20)) << 3 | 2); /* field 1..20, length-delimited */
                static const uint64_t lens[] = {0x7fffffffULL, 0xffffffffULL, 0xffffffffffffffffULL,
                                                0x100000000ULL, 1u << 20, 3};
                k += put_varint(tmp + k, lens[rndn(6)]);
                memmove(buf + at + k, buf + at, n - at);
                memcpy(buf + at, tmp, k);
                *len = n + k;
            }
            break;
        case 7: /* splice: the head of this message and the tail of another */
            if (olen) {
                size_t a = rndn((uint32_t)n + 1), b = rndn((uint32_t)olen + 1);
                size_t k = olen - b;
                if (a + k > MAX_FUZZ)
                    k = MAX_FUZZ - a;
                memcpy(buf + a, other + b, k);
                *len = a + k;
            }
            break;
        case 8: /* a random wire type for a random field (groups, reserved types 6/7) */
            if (n < MAX_FUZZ - 12) {
                size_t at = rndn((uint32_t)n + 1);
                uint8_t tmp[12];
                size_t k = put_varint(tmp, (uint64_t)(1 + rndn(40)) << 3 | rndn(8));
                tmp[k++] = (uint8_t)rnd();
                memmove(buf + at + k, buf + at, n - at);
                memcpy(buf + at, tmp, k);
                *len = n + k;
            }
            break;
        }
    }
}

/* Decode the raw protobuf-c way (must not crash), then the hyla_rpc way: what that accepts
 * must re-encode and decode again. Returns 1 when hyla_rpc_unpack accepted it. */
static int decode_check(const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len) {
    ProtobufCMessage *raw = protobuf_c_message_unpack(d, NULL, len, buf);
    if (raw)
        protobuf_c_message_free_unpacked(raw, NULL);
    ProtobufCMessage *m = NULL;
    if (hyla_rpc_unpack(d, buf, len, &m) != HYLA_OK) {
        CHECK(m == NULL);
        return 0;
    }
    CHECK(raw != NULL);
    size_t n;
    uint8_t *again = pack(m, &n);
    ProtobufCMessage *m2 = NULL;
    CHECK_MSG(hyla_rpc_unpack(d, again, n, &m2) == HYLA_OK, "%s: re-encoding of a decoded message does not decode",
              d->name);
    if (m2)
        protobuf_c_message_free_unpacked(m2, NULL);
    free(again);
    protobuf_c_message_free_unpacked(m, NULL);
    return 1;
}

/* A string field whose bytes hold a NUL is refused (INVALID_ARG, naming the field): protobuf-c
 * would decode it into a shorter C string, and "id\0more" would act on "id". For every string
 * field of every message, at the top level and one message deep, a random valid message gets
 * that field appended once with a NUL inside (refused) and once without (accepted). */
static void test_nul_strings(void) {
    static const uint8_t with_nul[] = {'s', '-', '1', 0, 'x', 'y'}, clean[] = {'s', '-', '1', 'x', 'y'};
    long refused = 0;
    for (int i = 0; i < g_n_descs; i++) {
        const ProtobufCMessageDescriptor *d = g_descs[i];
        for (unsigned f = 0; f < d->n_fields; f++) {
            const ProtobufCFieldDescriptor *fd = &d->fields[f];
            const ProtobufCFieldDescriptor *inner = NULL; /* the string field one level down */
            if (fd->type == PROTOBUF_C_TYPE_MESSAGE) {
                const ProtobufCMessageDescriptor *sd = fd->descriptor;
                for (unsigned g = 0; g < sd->n_fields && !inner; g++)
                    if (sd->fields[g].type == PROTOBUF_C_TYPE_STRING)
                        inner = &sd->fields[g];
                if (!inner)
                    continue;
            } else if (fd->type != PROTOBUF_C_TYPE_STRING) {
                continue;
            }
            for (int nul = 0; nul < 2; nul++) {
                const uint8_t *v = nul ? with_nul : clean;
                size_t vn = nul ? sizeof with_nul : sizeof clean;
                ProtobufCMessage *m = gen_message(d, 0);
                size_t len;
                uint8_t *packed = pack(m, &len);
                protobuf_c_message_free_unpacked(m, NULL);
                uint8_t buf[MAX_FUZZ];
                if (len > MAX_FUZZ - 64) {
                    free(packed);
                    continue;
                }
                memcpy(buf, packed, len);
                free(packed);
                size_t n = len;
                n += put_varint(buf + n, ((uint64_t)fd->id << 3) | 2);
                if (inner) { /* a sub-message holding only the string */
                    uint8_t sub[32];
                    size_t sn = put_varint(sub, ((uint64_t)inner->id << 3) | 2);
                    sn += put_varint(sub + sn, vn);
                    memcpy(sub + sn, v, vn);
                    sn += vn;
                    n += put_varint(buf + n, sn);
                    memcpy(buf + n, sub, sn);
                    n += sn;
                } else {
                    n += put_varint(buf + n, vn);
                    memcpy(buf + n, v, vn);
                    n += vn;
                }
                ProtobufCMessage *out = NULL;
                hyla_status st = hyla_rpc_unpack(d, buf, n, &out);
                if (nul) {
                    CHECK_MSG(st == HYLA_ERR_INVALID_ARG && out == NULL, "%s.%s%s%s: a NUL byte was accepted",
                              d->name, fd->name, inner ? "." : "", inner ? inner->name : "");
                    CHECK_MSG(st != HYLA_OK && strstr(hyla_last_error(), inner ? inner->name : fd->name),
                              "%s: the refusal does not name the field: %s", d->name, hyla_last_error());
                    refused++;
                } else {
                    CHECK_MSG(st == HYLA_OK, "%s.%s: a clean string was refused: %s", d->name, fd->name,
                              hyla_last_error());
                }
                if (out)
                    protobuf_c_message_free_unpacked(out, NULL);
            }
        }
    }
    CHECK(refused > 10);
    printf("test_rpc_fuzz: %ld string fields with a NUL byte refused\n", refused);
}

static void fuzz_unpack(double seconds) {
    static uint8_t buf[MAX_FUZZ], other[MAX_FUZZ];
    double end = now_s() + seconds;
    long iters = 0, decoded = 0, roundtrip_bad = 0;
    while (now_s() < end) {
        for (int k = 0; k < 50; k++, iters++) {
            const ProtobufCMessageDescriptor *d = g_descs[rndn((uint32_t)g_n_descs)];
            ProtobufCMessage *m = gen_message(d, 0);
            size_t len;
            uint8_t *packed = pack(m, &len);
            protobuf_c_message_free_unpacked(m, NULL);
            /* a valid packing decodes and packs to the same bytes */
            ProtobufCMessage *back = protobuf_c_message_unpack(d, NULL, len, packed);
            CHECK_MSG(back != NULL, "%s: a valid packing does not decode", d->name);
            if (back) {
                size_t n2;
                uint8_t *re = pack(back, &n2);
                if (n2 != len || memcmp(re, packed, len) != 0)
                    roundtrip_bad++;
                free(re);
                protobuf_c_message_free_unpacked(back, NULL);
            }
            if (len > MAX_FUZZ / 2)
                len = MAX_FUZZ / 2;
            memcpy(buf, packed, len);
            free(packed);
            /* another message's bytes for splices */
            ProtobufCMessage *o = gen_message(g_descs[rndn((uint32_t)g_n_descs)], 0);
            size_t olen;
            uint8_t *op = pack(o, &olen);
            protobuf_c_message_free_unpacked(o, NULL);
            if (olen > MAX_FUZZ / 2)
                olen = MAX_FUZZ / 2;
            memcpy(other, op, olen);
            free(op);

            for (int t = 0; t < 8; t++) {
                size_t l = len;
                uint8_t work[MAX_FUZZ];
                memcpy(work, buf, l);
                mutate(work, &l, other, olen);
                decoded += decode_check(d, work, l);
            }
            /* pure noise */
            size_t l = rndn(64);
            for (size_t i = 0; i < l; i++)
                buf[i] = (uint8_t)rnd();
            decoded += decode_check(d, buf, l);
        }
    }
    CHECK_MSG(roundtrip_bad == 0, "%ld valid messages did not re-pack to the same bytes", roundtrip_bad);
    printf("test_rpc_fuzz: unpack: %ld messages, %ld x 9 decodes, %ld decoded\n", iters, iters, decoded);
}

/* ---------------------------------------------------------------------------------------- */
/* through a server                                                                          */

static atomic_long g_handled;

static void any_handler(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *msg, void *ud) {
    const hyla_api_method *m = ud;
    (void)msg;
    intptr_t released = (intptr_t)hyla_rpc_call_user(call);
    ProtobufCMessage *out = calloc(1, m->output->sizeof_message);
    m->output->message_init(out);
    switch (ev) {
    case HYLA_RPC_EV_START:
        atomic_fetch_add(&g_handled, 1);
        if (!m->client_streaming) {
            if (m->server_streaming) {
                hyla_rpc_call_send(call, out);
                hyla_rpc_call_reply(call, NULL);
            } else {
                hyla_rpc_call_reply(call, out);
            }
            hyla_rpc_call_set_user(call, (void *)1, NULL); /* not read again: released */
        }
        break;
    case HYLA_RPC_EV_MESSAGE:
        if (m->server_streaming)
            hyla_rpc_call_send(call, out);
        break;
    case HYLA_RPC_EV_HALF_CLOSE:
        if (!released) {
            hyla_rpc_call_set_user(call, (void *)1, NULL);
            hyla_rpc_call_reply(call, m->server_streaming ? NULL : out);
        }
        break;
    case HYLA_RPC_EV_DONE:
        if (m->client_streaming && !released) {
            hyla_rpc_call_set_user(call, (void *)1, NULL);
            hyla_rpc_call_fail(call, HYLA_RPC_CANCELLED, "done");
        }
        break;
    }
    free(out);
}

static void fuzz_server(double seconds) {
    hyla_rpc_server_params sp = hyla_rpc_server_default_params();
    sp.max_message_bytes = 1 << 16;
    hyla_rpc_server *srv = NULL;
    CHECK_OK(hyla_rpc_server_create(&sp, &srv));
    for (int i = 0; hyla_api_methods[i].path; i++) {
        const hyla_api_method *m = &hyla_api_methods[i];
        hyla_rpc_kind kind = (hyla_rpc_kind)((m->client_streaming ? HYLA_RPC_CLIENT_STREAM : 0) |
                                             (m->server_streaming ? HYLA_RPC_SERVER_STREAM : 0));
        CHECK_OK(hyla_rpc_server_add_method(srv, m->path, kind, m->input, m->output, any_handler, (void *)m));
    }
    int port = 0;
    CHECK_OK(hyla_rpc_server_listen(srv, "127.0.0.1:0", &port));
    CHECK_OK(hyla_rpc_server_start(srv));
    char target[64];
    snprintf(target, sizeof target, "127.0.0.1:%d", port);
    hyla_rpc_client *c = NULL;
    CHECK_OK(hyla_rpc_client_create(target, NULL, &c));

    static uint8_t buf[MAX_FUZZ], other[MAX_FUZZ];
    size_t other_len = 0;
    long calls = 0, n_ok = 0, n_invalid = 0, n_other = 0;
    double end = now_s() + seconds;
    while (now_s() < end) {
        const hyla_api_method *m = &hyla_api_methods[rndn((uint32_t)hyla_api_method_count())];
        hyla_rpc_stream *s = NULL;
        hyla_rpc_call_opts o = {0};
        o.timeout_ms = 5000;
        CHECK_OK(hyla_rpc_stream_open(c, m->path, m->output, &o, &s));
        if (!s)
            break;
        int n_msgs = m->client_streaming ? 1 + (int)rndn(4) : 1;
        for (int k = 0; k < n_msgs; k++) {
            ProtobufCMessage *msg = gen_message(m->input, 0);
            size_t len;
            uint8_t *packed = pack(msg, &len);
            protobuf_c_message_free_unpacked(msg, NULL);
            if (len > MAX_FUZZ / 2)
                len = MAX_FUZZ / 2;
            memcpy(buf, packed, len);
            free(packed);
            if (rndn(3) != 0)
                mutate(buf, &len, other, other_len);
            memcpy(other, buf, len);
            other_len = len;
            if (hyla_rpc_stream_write_raw(s, buf, len) != HYLA_OK)
                break; /* the server already failed the call */
        }
        hyla_rpc_result res;
        hyla_rpc_stream_finish(s, &res);
        hyla_rpc_stream_destroy(s);
        calls++;
        if (res.code == HYLA_RPC_OK)
            n_ok++;
        else if (res.code == HYLA_RPC_INVALID_ARGUMENT)
            n_invalid++;
        else {
            n_other++;
            CHECK_MSG(0, "%s: unexpected %s: %s", m->path, hyla_rpc_code_name(res.code), res.message);
        }
    }
    printf("test_rpc_fuzz: server: %ld calls, %ld OK, %ld INVALID_ARGUMENT, %ld other, %ld handled\n", calls,
           n_ok, n_invalid, n_other, (long)atomic_load(&g_handled));
    CHECK(n_ok > 0 && n_invalid > 0);

    /* still serving */
    Hyla__V1__GetSessionRequest q = HYLA__V1__GET_SESSION_REQUEST__INIT;
    q.session_id = "s-0";
    ProtobufCMessage *resp = NULL;
    CHECK_OK(hyla_rpc_client_unary(c, "/hyla.v1.Sessions/GetSession", &q.base, &hyla__v1__session__descriptor,
                                   &resp, NULL, NULL));
    CHECK(resp != NULL);
    if (resp)
        protobuf_c_message_free_unpacked(resp, NULL);
    hyla_rpc_client_destroy(c);
    hyla_rpc_server_destroy(srv);
}

int main(void) {
    double seconds = atof(hyla_test_env("HYLA_FUZZ_SECONDS", "8"));
    if (seconds <= 0)
        seconds = 8;
    if (seconds > 20)
        seconds = 20;
    const char *seed_env = getenv("HYLA_FUZZ_SEED");
    uint64_t seed = seed_env ? strtoull(seed_env, NULL, 0) : (uint64_t)time(NULL) * 2654435761ULL;
    if (!seed)
        seed = 1;
    g_rng = seed;
    printf("test_rpc_fuzz: seed %llu (HYLA_FUZZ_SEED), %.1f s\n", (unsigned long long)seed, seconds);
    test_table();
    test_nul_strings();
    fuzz_unpack(seconds * 0.5);
    fuzz_server(seconds * 0.5);
    return hyla_test_done("test_rpc_fuzz");
}
