/* hyla_metrics.h — a small metrics registry rendered in the Prometheus text exposition format
 * (version 0.0.4), shared by the coordinator and the workers.
 *
 * A registry holds families (counter, gauge, histogram), each with a fixed list of label
 * names; a family holds one series per distinct tuple of label values, created on first use.
 * Histograms have fixed upper bounds given at registration (+Inf is implicit). Collectors are
 * callbacks run at the start of every render, for values read from elsewhere at scrape time
 * (gauges of sessions, disk usage, GPU memory).
 *
 * Threading: every function is thread-safe (one mutex per registry). Collectors run inside
 * hyla_metrics_render without the registry lock held, one render at a time, and may set gauges.
 * Updates are cheap (a lock and a short list walk) but not free: keep them out of inner loops. */
#ifndef HYLA_METRICS_H
#define HYLA_METRICS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hyla_metrics hyla_metrics;
typedef struct hyla_metric hyla_metric;

#define HYLA_METRICS_MAX_LABELS 4
#define HYLA_METRICS_MAX_BUCKETS 24

/* An empty registry. Caller frees with hyla_metrics_destroy. Aborts only when out of memory. */
hyla_metrics *hyla_metrics_create(void);
/* Frees the registry and its families. Accepts NULL. */
void hyla_metrics_destroy(hyla_metrics *r);

/* Register a family. name: [a-zA-Z_:][a-zA-Z0-9_:]*; help: free text; labels: n_labels names
 * (at most HYLA_METRICS_MAX_LABELS, may be NULL when 0). Strings are copied. Registering a name
 * twice returns the existing family (same type and labels, asserted). The family is borrowed
 * until hyla_metrics_destroy. A NULL registry returns NULL, and every update of a NULL family is
 * a no-op, so code can be instrumented without checking whether metrics are on. */
hyla_metric *hyla_metrics_counter(hyla_metrics *r, const char *name, const char *help, size_t n_labels,
                                  const char *const *labels);
hyla_metric *hyla_metrics_gauge(hyla_metrics *r, const char *name, const char *help, size_t n_labels,
                                const char *const *labels);
/* bounds: n_bounds strictly increasing finite upper bounds (at most HYLA_METRICS_MAX_BUCKETS). */
hyla_metric *hyla_metrics_histogram(hyla_metrics *r, const char *name, const char *help, size_t n_labels,
                                    const char *const *labels, const double *bounds, size_t n_bounds);

/* values: one label value per label name (copied on first use; NULL when the family has no
 * labels). Counters: v >= 0 (asserted). */
void hyla_metric_add(hyla_metric *m, const char *const *values, double v);
/* Gauges only. */
void hyla_metric_set(hyla_metric *m, const char *const *values, double v);
/* Histograms only. */
void hyla_metric_observe(hyla_metric *m, const char *const *values, double v);
/* Gauges: drop every series (a collector that rebuilds a labelled gauge from scratch). */
void hyla_metric_clear(hyla_metric *m);

/* Shorthands for families with one label (or none: value NULL). */
void hyla_metric_inc1(hyla_metric *m, const char *value, double v);
void hyla_metric_set1(hyla_metric *m, const char *value, double v);
void hyla_metric_observe1(hyla_metric *m, const char *value, double v);

/* The current value of a counter or gauge series (0 if it does not exist): for tests. */
double hyla_metric_value(hyla_metric *m, const char *const *values);

/* Run fn(r, ud) at the start of every render (at most 16; ud borrowed until destroy). */
void hyla_metrics_add_collector(hyla_metrics *r, void (*fn)(hyla_metrics *r, void *ud), void *ud);

/* The exposition text of every family in registration order, series in creation order.
 * Caller frees with free(). Aborts only when out of memory. */
char *hyla_metrics_render(hyla_metrics *r);

/* Buckets for latencies in seconds: 1 ms .. 60 s. */
extern const double hyla_metrics_latency_bounds[];
extern const size_t hyla_metrics_n_latency_bounds;
/* Buckets for sizes in bytes: 4 KiB .. 4 GiB, powers of 4. */
extern const double hyla_metrics_bytes_bounds[];
extern const size_t hyla_metrics_n_bytes_bounds;

#ifdef __cplusplus
}
#endif
#endif
