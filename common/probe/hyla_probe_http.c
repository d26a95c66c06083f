/* hyla_probe_http.c — the operator's HTTP endpoint (/metrics, /healthz, /readyz) and gRPC
 * request metrics; see hyla_probe.h. libmicrohttpd runs its own polling thread and a thread per
 * connection; a handler renders the registry (collectors run inside) and answers at once. */
#include "hyla_probe.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hyla_log.h"

struct hyla_probe_http {
    struct MHD_Daemon *d;
    hyla_metrics *m;
    hyla_probe_ready_fn ready;
    void *ud;
    int port;
};

static enum MHD_Result answer(struct MHD_Connection *conn, unsigned code, const char *type, char *body) {
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", type);
    enum MHD_Result ret = MHD_queue_response(conn, code, r);
    MHD_destroy_response(r);
    return ret;
}

static char *xstrdup(const char *s) {
    char *d = strdup(s);
    HYLA_ASSERT(d);
    return d;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    (void)upload;
    (void)con_cls;
    hyla_probe_http *h = cls;
    if (*upload_size) { /* no endpoint takes a body: discard it */
        *upload_size = 0;
        return MHD_YES;
    }
    if (strcmp(method, "GET") && strcmp(method, "HEAD"))
        return answer(conn, 405, "text/plain", xstrdup("only GET is served here\n"));
    if (!strcmp(url, "/metrics"))
        return answer(conn, 200, "text/plain; version=0.0.4; charset=utf-8", hyla_metrics_render(h->m));
    if (!strcmp(url, "/healthz")) return answer(conn, 200, "text/plain", xstrdup("ok\n"));
    if (!strcmp(url, "/readyz")) {
        int ready = !h->ready || h->ready(h->ud);
        return answer(conn, ready ? 200 : 503, "text/plain", xstrdup(ready ? "ready\n" : "draining\n"));
    }
    return answer(conn, 404, "text/plain", xstrdup("not found: try /metrics, /healthz or /readyz\n"));
}

static hyla_status parse_addr(const char *flag, const char *addr, struct sockaddr_storage *ss, socklen_t *len) {
    memset(ss, 0, sizeof *ss);
    const char *colon = strrchr(addr, ':');
    if (!colon || !colon[1])
        return hyla_fail(HYLA_ERR_INVALID_ARG, "%s %s: want HOST:PORT", flag, addr);
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end || port < 0 || port > 65535)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "%s %s: bad port", flag, addr);
    char host[256];
    size_t hn = (size_t)(colon - addr);
    if (hn >= sizeof host)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "%s %s: host too long", flag, addr);
    memcpy(host, addr, hn);
    host[hn] = 0;
    if (hn >= 2 && host[0] == '[' && host[hn - 1] == ']') {
        struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)ss;
        host[hn - 1] = 0;
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)port);
        if (inet_pton(AF_INET6, host + 1, &a6->sin6_addr) != 1)
            return hyla_fail(HYLA_ERR_INVALID_ARG, "%s %s: bad IPv6 address", flag, addr);
        *len = sizeof *a6;
        return HYLA_OK;
    }
    struct sockaddr_in *a4 = (struct sockaddr_in *)ss;
    a4->sin_family = AF_INET;
    a4->sin_port = htons((uint16_t)port);
    if (!hn || !strcmp(host, "0.0.0.0") || !strcmp(host, "*"))
        a4->sin_addr.s_addr = htonl(INADDR_ANY);
    else if (!strcmp(host, "localhost"))
        a4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    else if (inet_pton(AF_INET, host, &a4->sin_addr) != 1)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "%s %s: bad IPv4 address (use a numeric address)", flag, addr);
    *len = sizeof *a4;
    return HYLA_OK;
}

hyla_status hyla_probe_listen(const char *flag, const char *addr, int backlog, int *fd_out, int *port, int *ipv6) {
    *fd_out = -1;
    struct sockaddr_storage ss;
    socklen_t slen = 0;
    HYLA_TRY(parse_addr(flag, addr, &ss, &slen));
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(fd, (struct sockaddr *)&ss, slen) != 0 || listen(fd, backlog) != 0) {
        int err = errno;
        if (fd >= 0)
            close(fd);
        return hyla_fail(HYLA_ERR_IO, "%s %s: cannot listen there: %s", flag, addr, strerror(err));
    }
    struct sockaddr_storage bound;
    socklen_t blen = sizeof bound;
    *port = 0;
    if (getsockname(fd, (struct sockaddr *)&bound, &blen) == 0)
        *port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                  : ((struct sockaddr_in *)&bound)->sin_port);
    *ipv6 = ss.ss_family == AF_INET6;
    *fd_out = fd;
    return HYLA_OK;
}

void hyla_probe_mhd_log(void *cls, const char *fmt, va_list ap) {
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    msg[strcspn(msg, "\n")] = 0;
    HYLA_DEBUG("%s: %s", (const char *)cls, msg);
}

hyla_status hyla_probe_http_start(const char *addr, hyla_metrics *metrics, hyla_probe_ready_fn ready, void *ud,
                                hyla_probe_http **out) {
    *out = NULL;
    int fd, port, ipv6;
    HYLA_TRY(hyla_probe_listen("--metrics", addr, 64, &fd, &port, &ipv6));
    hyla_probe_http *h = calloc(1, sizeof *h);
    if (!h) {
        close(fd);
        return hyla_fail(HYLA_ERR_NOMEM, "metrics http: out of memory");
    }
    h->m = metrics;
    h->ready = ready;
    h->ud = ud;
    h->port = port;
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
    if (ipv6) flags |= MHD_USE_IPv6;
    h->d = MHD_start_daemon(flags, 0, NULL, NULL, on_request, h, MHD_OPTION_LISTEN_SOCKET, fd,
                            MHD_OPTION_CONNECTION_LIMIT, 32u, MHD_OPTION_CONNECTION_TIMEOUT, 30u,
                            MHD_OPTION_EXTERNAL_LOGGER, hyla_probe_mhd_log, (void *)"metrics http",
                            MHD_OPTION_END);
    if (!h->d) {
        close(fd);
        free(h);
        return hyla_fail(HYLA_ERR_IO, "--metrics %s: libmicrohttpd did not start", addr);
    }
    HYLA_INFO("metrics: serving /metrics, /healthz and /readyz on port %d", h->port);
    *out = h;
    return HYLA_OK;
}

int hyla_probe_http_port(const hyla_probe_http *h) { return h ? h->port : 0; }

void hyla_probe_http_stop(hyla_probe_http *h) {
    if (!h) return;
    if (h->d) MHD_stop_daemon(h->d);
    free(h);
}

/* ---- gRPC request metrics ---- */

typedef struct {
    hyla_metric *requests, *latency;
} rpc_met;

static void observe(const char *method, hyla_rpc_code code, double seconds, void *ud) {
    rpc_met *rm = ud;
    const char *lv[2] = {method, hyla_rpc_code_name(code)};
    hyla_metric_add(rm->requests, lv, 1);
    hyla_metric_observe1(rm->latency, method, seconds);
}

void hyla_probe_rpc_metrics(hyla_rpc_server *srv, hyla_metrics *metrics) {
    if (!metrics) return;
    rpc_met *rm = calloc(1, sizeof *rm);
    HYLA_ASSERT(rm);
    static const char *const l2[] = {"method", "code"};
    rm->requests = hyla_metrics_counter(metrics, "hyla_grpc_requests_total",
                                        "gRPC calls served, by method and final status code", 2, l2);
    rm->latency = hyla_metrics_histogram(metrics, "hyla_grpc_request_duration_seconds",
                                         "gRPC call duration from accept to end, by method", 1, l2,
                                         hyla_metrics_latency_bounds, hyla_metrics_n_latency_bounds);
    hyla_rpc_server_set_observer(srv, observe, rm);
    hyla_rpc_server_add_cleanup(srv, free, rm);
}

/* ---- disk usage ---- */

unsigned long long hyla_probe_dir_bytes(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    unsigned long long total = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat st;
        if (lstat(path, &st) != 0) continue;
        if (S_ISDIR(st.st_mode)) total += hyla_probe_dir_bytes(path);
        else if (S_ISREG(st.st_mode)) total += (unsigned long long)st.st_blocks * 512ull;
    }
    closedir(d);
    return total;
}
