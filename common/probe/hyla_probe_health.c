/* hyla_probe_health.c — grpc.health.v1.Health/Check on a hyla_rpc_server; see hyla_probe.h.
 * The answer is computed per call from the ready callback, so it flips to NOT_SERVING the
 * moment a drain or a stop begins. Runs on the server's loop threads; never blocks. */
#include <stdlib.h>
#include <string.h>

#include "grpc/health/v1/health.pb-c.h"
#include "hyla_probe.h"

typedef struct {
    hyla_probe_ready_fn ready;
    void *ud;
    char **services; /* NULL-terminated known names ("" is always known) */
} health;

static void health_free(void *p) {
    health *h = p;
    for (char **s = h->services; s && *s; s++) free(*s);
    free(h->services);
    free(h);
}

static void on_check(hyla_rpc_call *call, hyla_rpc_event ev, const ProtobufCMessage *msg, void *ud) {
    if (ev != HYLA_RPC_EV_START) return;
    const health *h = ud;
    const Grpc__Health__V1__HealthCheckRequest *q = (const Grpc__Health__V1__HealthCheckRequest *)msg;
    const char *name = q->service ? q->service : "";
    int known = !*name;
    for (char **s = h->services; !known && s && *s; s++) known = !strcmp(*s, name);
    if (!known) {
        hyla_rpc_call_fail(call, HYLA_RPC_NOT_FOUND, "health: unknown service '%s'", name);
        return;
    }
    Grpc__Health__V1__HealthCheckResponse r = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    r.status = !h->ready || h->ready(h->ud) ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
                                            : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
    hyla_rpc_call_reply(call, &r.base);
}

hyla_status hyla_probe_health_register(hyla_rpc_server *srv, hyla_probe_ready_fn ready, void *ud,
                                     const char *const *services) {
    health *h = calloc(1, sizeof *h);
    size_t n = 0;
    while (services && services[n]) n++;
    if (!h || !(h->services = calloc(n + 1, sizeof *h->services))) {
        free(h);
        return hyla_fail(HYLA_ERR_NOMEM, "health: out of memory");
    }
    h->ready = ready;
    h->ud = ud;
    for (size_t i = 0; i < n; i++)
        if (!(h->services[i] = strdup(services[i]))) {
            health_free(h);
            return hyla_fail(HYLA_ERR_NOMEM, "health: out of memory");
        }
    hyla_status st = hyla_rpc_server_add_method(srv, "/grpc.health.v1.Health/Check", HYLA_RPC_UNARY,
                                                &grpc__health__v1__health_check_request__descriptor,
                                                &grpc__health__v1__health_check_response__descriptor, on_check, h);
    if (st != HYLA_OK) {
        health_free(h);
        return st;
    }
    return hyla_rpc_server_add_cleanup(srv, health_free, h);
}
