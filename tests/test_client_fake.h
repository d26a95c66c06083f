/* test_client_fake.h — a small in-process stand-in for hyla-coordinator's public services
 * (Sessions + Cluster) over the real hyla_rpc server on 127.0.0.1:0, for the client tests
 * (tests/test_client.c, tests/test_client_cli.c) while the real coordinator does not exist.
 *
 * It is not a model: a session's "model" emits the token ('a' + (31*position + seed) % 26) as
 * a one-byte text piece, Append counts one token per text byte (or per token id). It does keep
 * sessions, tenants, positions, snapshot versions, placement on two workers (w-1 in g-1, w-2 in
 * g-2) and pages ListSessions two at a time, so every client call has something to check.
 * Knobs make calls fail the way the real cluster can (worker death mid-Generate, ...).
 *
 * Threading: handlers run on the rpc server's loop threads; the fake's state has one mutex.
 * Knobs and recorded requests are read and written under it through the functions below. */
#ifndef TEST_CLIENT_FAKE_H
#define TEST_CLIENT_FAKE_H

#include <stdint.h>

#include "hyla_status.h"

typedef struct fake_server fake_server;

/* Start on 127.0.0.1:0. models: the served model names (NULL-terminated; NULL: {"tiny"}).
 * *port: the bound port. Caller frees with fake_stop. */
hyla_status fake_start(const char *const *models, fake_server **out, int *port);
void fake_stop(fake_server *f);

/* The next Generate call delivers n tokens, then fails with UNAVAILABLE and the trailer
 * x-hyla-tokens-delivered (one-shot; -1: off). */
void fake_fail_generate_after(fake_server *f, int n);
/* The next Append fails with UNAVAILABLE after this many messages (one-shot; -1: off). */
void fake_fail_append_after(fake_server *f, int messages);
/* Append refuses documents over this many tokens with RESOURCE_EXHAUSTED (default 1 << 24). */
void fake_set_max_append_tokens(fake_server *f, uint64_t n);

/* What the last calls carried (for checks that the client sends what it was given). */
typedef struct {
    char tenant[64];              /* x-hyla-tenant of the last call ("" if absent) */
    int append_messages;          /* messages of the last Append */
    uint64_t append_bytes_hint;   /* its total_bytes_hint */
    uint64_t append_tokens_hint;  /* its total_tokens_hint */
    int append_add_bos;
    uint32_t gen_max_tokens;      /* the last GenerateRequest */
    int gen_has_sampling;
    float gen_temperature;
    int32_t gen_top_k;
    float gen_top_p;
    int gen_reseed;
    uint64_t gen_seed;
    int gen_n_stop;
    char gen_stop0[32];
    int gen_ignore_eos;
    int list_calls;               /* ListSessions calls so far (pagination) */
    char migrate_to[64];
    char resume_hint[64];
    int drain_wait;
} fake_record;

void fake_get_record(fake_server *f, fake_record *out);

/* A session's position and tenant ("" / 0 when unknown). Returns 1 if it exists. */
int fake_session(fake_server *f, const char *id, uint64_t *position, char *tenant, size_t tenant_len);

/* The text the fake model emits from position pos with seed for n tokens (n+1 bytes incl. NUL). */
void fake_expected_text(uint64_t pos, uint64_t seed, int n, char *out);

#endif
