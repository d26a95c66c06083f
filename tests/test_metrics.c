/* test_metrics.c — the metrics registry renders the Prometheus text format 0.0.4 exactly:
 * HELP/TYPE lines, label escaping, integer and fractional values, cumulative histogram buckets
 * with +Inf, _sum and _count; collectors run at render; concurrent updates are not lost. */
#include <pthread.h>

#include "hyla_metrics.h"
#include "hyla_status.h"
#include "hyla_test.h"

static void collect(hyla_metrics *r, void *ud) {
    (void)r;
    int *calls = ud;
    (*calls)++;
}

static hyla_metric *g_hot;
static void *hammer(void *arg) {
    (void)arg;
    for (int i = 0; i < 10000; i++) hyla_metric_inc1(g_hot, i % 2 ? "a" : "b", 1);
    return NULL;
}

int main(void) {
    hyla_metrics *r = hyla_metrics_create();
    static const char *const l2[] = {"method", "code"};
    hyla_metric *c = hyla_metrics_counter(r, "req_total", "Requests \\ served\nby method", 2, l2);
    hyla_metric *g = hyla_metrics_gauge(r, "temp", "A gauge", 0, NULL);
    const double b[] = {0.5, 1, 2.5};
    hyla_metric *h = hyla_metrics_histogram(r, "lat_seconds", "Latency", 1, l2, b, 3);
    CHECK(hyla_metrics_counter(r, "req_total", "again", 2, l2) == c); /* same family */
    const char *v1[] = {"/a.B/C", "OK"}, *v2[] = {"x\"y\\z\nw", "NOT_FOUND"};
    hyla_metric_add(c, v1, 1);
    hyla_metric_add(c, v1, 2);
    hyla_metric_add(c, v2, 1);
    hyla_metric_set(g, NULL, 0.25);
    hyla_metric_observe1(h, "m", 0.5); /* on a bound: counts in that bucket (le is <=) */
    hyla_metric_observe1(h, "m", 2);
    hyla_metric_observe1(h, "m", 7);
    int calls = 0;
    hyla_metrics_add_collector(r, collect, &calls);
    char *text = hyla_metrics_render(r);
    const char *want =
        "# HELP req_total Requests \\\\ served\\nby method\n"
        "# TYPE req_total counter\n"
        "req_total{method=\"/a.B/C\",code=\"OK\"} 3\n"
        "req_total{method=\"x\\\"y\\\\z\\nw\",code=\"NOT_FOUND\"} 1\n"
        "# HELP temp A gauge\n"
        "# TYPE temp gauge\n"
        "temp 0.25\n"
        "# HELP lat_seconds Latency\n"
        "# TYPE lat_seconds histogram\n"
        "lat_seconds_bucket{method=\"m\",le=\"0.5\"} 1\n"
        "lat_seconds_bucket{method=\"m\",le=\"1\"} 1\n"
        "lat_seconds_bucket{method=\"m\",le=\"2.5\"} 2\n"
        "lat_seconds_bucket{method=\"m\",le=\"+Inf\"} 3\n"
        "lat_seconds_sum{method=\"m\"} 9.5\n"
        "lat_seconds_count{method=\"m\"} 3\n";
    CHECK_MSG(!strcmp(text, want), "got:\n%s\nwant:\n%s", text, want);
    CHECK(calls == 1);
    free(text);
    CHECK(hyla_metric_value(c, v1) == 3);

    /* 0.1 must read back exactly; cleared gauges vanish */
    hyla_metric_set(g, NULL, 0.1);
    text = hyla_metrics_render(r);
    CHECK(strstr(text, "\ntemp 0.1\n") != NULL);
    free(text);
    hyla_metric_clear(g);
    text = hyla_metrics_render(r);
    CHECK(strstr(text, "\ntemp ") == NULL && strstr(text, "# TYPE temp gauge\n") != NULL);
    free(text);

    /* concurrent updates */
    g_hot = hyla_metrics_counter(r, "hot_total", "hot", 1, l2);
    pthread_t th[4];
    for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, hammer, NULL);
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    const char *a[] = {"a"}, *bb[] = {"b"};
    CHECK(hyla_metric_value(g_hot, a) == 20000 && hyla_metric_value(g_hot, bb) == 20000);

    /* a NULL registry and NULL families are no-ops */
    CHECK(hyla_metrics_counter(NULL, "x", "y", 0, NULL) == NULL);
    hyla_metric_add(NULL, NULL, 1);
    hyla_metrics_destroy(r);
    if (hyla_test_failures) return 1;
    printf("test_metrics: ok\n");
    return 0;
}
