/* hyla_api.h — the table of every method of the hyla.v1 services: its gRPC path, whether the
 * request and/or the response are streams, and the protobuf-c descriptors of both messages.
 *
 * protoc-c knows the services' methods and message types but drops the `stream` keywords;
 * this table adds them, so servers register methods and clients open calls from one source.
 * tests/test_rpc_fuzz.c checks it against the generated service descriptors.
 *
 * Everything here is static const data: thread-safe, nothing to free. */
#ifndef HYLA_API_H
#define HYLA_API_H

#include <protobuf-c/protobuf-c.h>

#include "hyla/v1/admin.pb-c.h"
#include "hyla/v1/cluster.pb-c.h"
#include "hyla/v1/common.pb-c.h"
#include "hyla/v1/coordinator.pb-c.h"
#include "hyla/v1/sessions.pb-c.h"
#include "hyla/v1/statestore.pb-c.h"
#include "hyla/v1/worker.pb-c.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Metadata key carrying the tenant on every call of the public services (docs/API.md). */
#define HYLA_API_TENANT_KEY "x-hyla-tenant"
/* The tenant of calls that carry no x-hyla-tenant. */
#define HYLA_API_DEFAULT_TENANT "default"
/* Metadata key of the bearer API key ("Bearer KEY"), docs/API.md "Authentication". */
#define HYLA_API_AUTH_KEY "authorization"
/* Trailing metadata of a Generate that ended early: tokens already delivered (decimal). */
#define HYLA_API_TOKENS_DELIVERED_KEY "x-hyla-tokens-delivered"

typedef struct {
    const char *path;          /* "/hyla.v1.Sessions/CreateSession" */
    const char *service;       /* "hyla.v1.Sessions" */
    const char *name;          /* "CreateSession" */
    int client_streaming;      /* request is a stream */
    int server_streaming;      /* response is a stream */
    const ProtobufCMessageDescriptor *input;
    const ProtobufCMessageDescriptor *output;
    int internal;              /* 1: Coordinator, Worker, StateStore (not for clients) */
} hyla_api_method;

/* All methods, terminated by an entry with path == NULL. */
extern const hyla_api_method hyla_api_methods[];
/* Number of entries before the terminator. */
int hyla_api_method_count(void);
/* The method with this path, or NULL. Borrowed (static). */
const hyla_api_method *hyla_api_find(const char *path);

/* The generated service descriptors, terminated by NULL. */
extern const ProtobufCServiceDescriptor *const hyla_api_services[];

#ifdef __cplusplus
}
#endif
#endif
