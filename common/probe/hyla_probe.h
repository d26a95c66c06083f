/* hyla_probe.h — what an operator scrapes and probes, shared by hyla-coordinator and hyla-worker:
 *   - an HTTP endpoint (libmicrohttpd, its own thread per connection) serving
 *       GET /metrics  the registry in the Prometheus text format 0.0.4
 *       GET /healthz  200 while the process serves (liveness)
 *       GET /readyz   200 when ready for new work, 503 while draining or stopping (readiness)
 *   - gRPC request metrics of a hyla_rpc_server (requests by method and code, latency);
 *   - the grpc.health.v1.Health/Check service: SERVING, or NOT_SERVING while draining.
 * Threading: the readiness callback runs on HTTP and gRPC threads and must not block. */
#ifndef HYLA_PROBE_H
#define HYLA_PROBE_H

#include <stdarg.h>

#include "hyla_metrics.h"
#include "hyla_rpc.h"
#include "hyla_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Non-zero while the process takes new work (not draining, not stopping). */
typedef int (*hyla_probe_ready_fn)(void *ud);

typedef struct hyla_probe_http hyla_probe_http;

/* Serve /metrics, /healthz and /readyz on addr ("127.0.0.1:9100", "0.0.0.0:0", "[::1]:9100";
 * port 0 picks one). metrics and ready (may be NULL: always ready) are borrowed until stop.
 * Fails with HYLA_ERR_INVALID_ARG for a malformed address, HYLA_ERR_IO when it cannot listen.
 * Caller frees with hyla_probe_http_stop. */
hyla_status hyla_probe_http_start(const char *addr, hyla_metrics *metrics, hyla_probe_ready_fn ready, void *ud,
                                hyla_probe_http **out);
/* The bound TCP port. */
int hyla_probe_http_port(const hyla_probe_http *h);

/* A listening TCP socket (SO_REUSEADDR, this backlog) on addr, "HOST:PORT" with HOST an IPv4
 * address, [IPv6], localhost, or empty / * / 0.0.0.0 for any, PORT 0 for a free one: *fd (caller
 * closes it, or hands it to a daemon), *port the port bound, *ipv6 its family. Errors name flag
 * and addr ("--http 1.2.3.4:x: bad port"): every HTTP endpoint binds its own socket this way, so
 * a port in use is refused with the reason. */
hyla_status hyla_probe_listen(const char *flag, const char *addr, int backlog, int *fd, int *port, int *ipv6);
/* libmicrohttpd's own messages (a client that left, a malformed request) to the debug log, after
 * the prefix cls (a string): MHD_OPTION_EXTERNAL_LOGGER's function for every daemon. */
void hyla_probe_mhd_log(void *cls, const char *fmt, va_list ap);
/* Stop serving and free. Accepts NULL. */
void hyla_probe_http_stop(hyla_probe_http *h);

/* Count every call of srv in metrics, before hyla_rpc_server_start:
 *   hyla_grpc_requests_total{method,code}  and  hyla_grpc_request_duration_seconds{method}.
 * metrics borrowed until srv is destroyed. */
void hyla_probe_rpc_metrics(hyla_rpc_server *srv, hyla_metrics *metrics);

/* Register /grpc.health.v1.Health/Check on srv (before start): SERVING while ready(ud) is
 * non-zero, else NOT_SERVING; the service "" and "hyla.v1.Sessions" / "hyla.v1.Worker" (any name
 * in services, NULL-terminated) are known, other names get NOT_FOUND as the protocol asks. ud is
 * borrowed until srv is destroyed. */
hyla_status hyla_probe_health_register(hyla_rpc_server *srv, hyla_probe_ready_fn ready, void *ud,
                                     const char *const *services);

/* Bytes used by the files under dir (recursively; 0 if it cannot be read): store disk usage. */
unsigned long long hyla_probe_dir_bytes(const char *dir);

#ifdef __cplusplus
}
#endif
#endif
