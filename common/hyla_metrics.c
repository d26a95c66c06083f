/* hyla_metrics.c — see hyla_metrics.h. Families form a list in registration order, series a
 * list per family in creation order; label values are matched by string comparison (families
 * have few series: methods × codes, tiers). One mutex guards the whole registry; a second one
 * serialises renders so collectors never run twice at once. */
#include "hyla_metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_status.h"

typedef enum { K_COUNTER, K_GAUGE, K_HISTOGRAM } kind;

typedef struct series {
    char *values[HYLA_METRICS_MAX_LABELS];
    double v;                                     /* counter / gauge */
    unsigned long long buckets[HYLA_METRICS_MAX_BUCKETS]; /* histogram: per bucket, not cumulative */
    unsigned long long count;
    double sum;
    struct series *next;
} series;

struct hyla_metric {
    hyla_metrics *r;
    kind k;
    char *name, *help;
    char *labels[HYLA_METRICS_MAX_LABELS];
    size_t n_labels;
    double bounds[HYLA_METRICS_MAX_BUCKETS];
    size_t n_bounds;
    series *head, *tail;
    struct hyla_metric *next;
};

struct hyla_metrics {
    pthread_mutex_t mu, render_mu;
    hyla_metric *head, *tail;
    struct {
        void (*fn)(hyla_metrics *, void *);
        void *ud;
    } coll[16];
    int n_coll;
};

const double hyla_metrics_latency_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                              0.5,   1,      2.5,   5,    10,    30,   60};
const size_t hyla_metrics_n_latency_bounds = sizeof hyla_metrics_latency_bounds / sizeof(double);
const double hyla_metrics_bytes_bounds[] = {4096.0,        16384.0,        65536.0,         262144.0,
                                            1048576.0,     4194304.0,      16777216.0,      67108864.0,
                                            268435456.0,   1073741824.0,   4294967296.0};
const size_t hyla_metrics_n_bytes_bounds = sizeof hyla_metrics_bytes_bounds / sizeof(double);

static char *xstrdup(const char *s) {
    char *d = strdup(s ? s : "");
    HYLA_ASSERT(d);
    return d;
}

hyla_metrics *hyla_metrics_create(void) {
    hyla_metrics *r = calloc(1, sizeof *r);
    HYLA_ASSERT(r);
    pthread_mutex_init(&r->mu, NULL);
    pthread_mutex_init(&r->render_mu, NULL);
    return r;
}

void hyla_metrics_destroy(hyla_metrics *r) {
    if (!r) return;
    for (hyla_metric *m = r->head, *mn; m; m = mn) {
        mn = m->next;
        for (series *s = m->head, *sn; s; s = sn) {
            sn = s->next;
            for (size_t i = 0; i < m->n_labels; i++) free(s->values[i]);
            free(s);
        }
        for (size_t i = 0; i < m->n_labels; i++) free(m->labels[i]);
        free(m->name);
        free(m->help);
        free(m);
    }
    pthread_mutex_destroy(&r->mu);
    pthread_mutex_destroy(&r->render_mu);
    free(r);
}

static int valid_name(const char *s) {
    if (!s || !*s || (*s >= '0' && *s <= '9')) return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '_' ||
              *s == ':'))
            return 0;
    return 1;
}

static hyla_metric *reg(hyla_metrics *r, kind k, const char *name, const char *help, size_t n_labels,
                        const char *const *labels, const double *bounds, size_t n_bounds) {
    if (!r) return NULL;
    HYLA_ASSERT(valid_name(name) && n_labels <= HYLA_METRICS_MAX_LABELS && n_bounds <= HYLA_METRICS_MAX_BUCKETS);
    for (size_t i = 0; i < n_labels; i++) HYLA_ASSERT(valid_name(labels[i]) && strcmp(labels[i], "le"));
    for (size_t i = 0; i < n_bounds; i++) HYLA_ASSERT(isfinite(bounds[i]) && (i == 0 || bounds[i] > bounds[i - 1]));
    pthread_mutex_lock(&r->mu);
    for (hyla_metric *m = r->head; m; m = m->next)
        if (!strcmp(m->name, name)) {
            HYLA_ASSERT(m->k == k && m->n_labels == n_labels);
            pthread_mutex_unlock(&r->mu);
            return m;
        }
    hyla_metric *m = calloc(1, sizeof *m);
    HYLA_ASSERT(m);
    m->r = r;
    m->k = k;
    m->name = xstrdup(name);
    m->help = xstrdup(help);
    m->n_labels = n_labels;
    for (size_t i = 0; i < n_labels; i++) m->labels[i] = xstrdup(labels[i]);
    m->n_bounds = n_bounds;
    if (n_bounds) memcpy(m->bounds, bounds, n_bounds * sizeof *bounds);
    if (r->tail) r->tail->next = m;
    else r->head = m;
    r->tail = m;
    pthread_mutex_unlock(&r->mu);
    return m;
}

hyla_metric *hyla_metrics_counter(hyla_metrics *r, const char *name, const char *help, size_t n_labels,
                                  const char *const *labels) {
    return reg(r, K_COUNTER, name, help, n_labels, labels, NULL, 0);
}
hyla_metric *hyla_metrics_gauge(hyla_metrics *r, const char *name, const char *help, size_t n_labels,
                                const char *const *labels) {
    return reg(r, K_GAUGE, name, help, n_labels, labels, NULL, 0);
}
hyla_metric *hyla_metrics_histogram(hyla_metrics *r, const char *name, const char *help, size_t n_labels,
                                    const char *const *labels, const double *bounds, size_t n_bounds) {
    return reg(r, K_HISTOGRAM, name, help, n_labels, labels, bounds, n_bounds);
}

/* The series of values, created if create; called with the lock held. */
static series *find_locked(hyla_metric *m, const char *const *values, int create) {
    for (series *s = m->head; s; s = s->next) {
        size_t i = 0;
        while (i < m->n_labels && !strcmp(s->values[i], values[i] ? values[i] : "")) i++;
        if (i == m->n_labels) return s;
    }
    if (!create) return NULL;
    series *s = calloc(1, sizeof *s);
    HYLA_ASSERT(s);
    for (size_t i = 0; i < m->n_labels; i++) s->values[i] = xstrdup(values[i]);
    if (m->tail) m->tail->next = s;
    else m->head = s;
    m->tail = s;
    return s;
}

void hyla_metric_add(hyla_metric *m, const char *const *values, double v) {
    if (!m) return;
    HYLA_ASSERT(m->k != K_HISTOGRAM && (m->k == K_GAUGE || v >= 0));
    pthread_mutex_lock(&m->r->mu);
    find_locked(m, values, 1)->v += v;
    pthread_mutex_unlock(&m->r->mu);
}

void hyla_metric_set(hyla_metric *m, const char *const *values, double v) {
    if (!m) return;
    HYLA_ASSERT(m->k == K_GAUGE);
    pthread_mutex_lock(&m->r->mu);
    find_locked(m, values, 1)->v = v;
    pthread_mutex_unlock(&m->r->mu);
}

void hyla_metric_observe(hyla_metric *m, const char *const *values, double v) {
    if (!m) return;
    HYLA_ASSERT(m->k == K_HISTOGRAM);
    pthread_mutex_lock(&m->r->mu);
    series *s = find_locked(m, values, 1);
    size_t b = 0;
    while (b < m->n_bounds && v > m->bounds[b]) b++;
    if (b < m->n_bounds) s->buckets[b]++;
    s->count++;
    s->sum += v;
    pthread_mutex_unlock(&m->r->mu);
}

void hyla_metric_clear(hyla_metric *m) {
    if (!m) return;
    HYLA_ASSERT(m->k == K_GAUGE);
    pthread_mutex_lock(&m->r->mu);
    for (series *s = m->head, *sn; s; s = sn) {
        sn = s->next;
        for (size_t i = 0; i < m->n_labels; i++) free(s->values[i]);
        free(s);
    }
    m->head = m->tail = NULL;
    pthread_mutex_unlock(&m->r->mu);
}

void hyla_metric_inc1(hyla_metric *m, const char *value, double v) { hyla_metric_add(m, &value, v); }
void hyla_metric_set1(hyla_metric *m, const char *value, double v) { hyla_metric_set(m, &value, v); }
void hyla_metric_observe1(hyla_metric *m, const char *value, double v) { hyla_metric_observe(m, &value, v); }

double hyla_metric_value(hyla_metric *m, const char *const *values) {
    if (!m) return 0;
    pthread_mutex_lock(&m->r->mu);
    series *s = find_locked(m, values, 0);
    double v = s ? (m->k == K_HISTOGRAM ? (double)s->count : s->v) : 0;
    pthread_mutex_unlock(&m->r->mu);
    return v;
}

void hyla_metrics_add_collector(hyla_metrics *r, void (*fn)(hyla_metrics *, void *), void *ud) {
    if (!r) return;
    pthread_mutex_lock(&r->mu);
    HYLA_ASSERT(r->n_coll < 16);
    r->coll[r->n_coll].fn = fn;
    r->coll[r->n_coll++].ud = ud;
    pthread_mutex_unlock(&r->mu);
}

/* ---- rendering ---- */

typedef struct {
    char *p;
    size_t n, cap;
} buf;

static void put(buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(buf *b, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p + b->n, b->cap - b->n, fmt, ap);
        va_end(ap);
        HYLA_ASSERT(k >= 0);
        if ((size_t)k < b->cap - b->n) {
            b->n += (size_t)k;
            return;
        }
        b->cap = b->cap * 2 + (size_t)k + 1;
        b->p = realloc(b->p, b->cap);
        HYLA_ASSERT(b->p);
    }
}

/* s escaped for HELP (quote 0: \\ and \n) or a label value (quote 1: also \"). */
static void put_escaped(buf *b, const char *s, int quote) {
    for (; *s; s++) {
        if (*s == '\\') put(b, "\\\\");
        else if (*s == '\n') put(b, "\\n");
        else if (quote && *s == '"') put(b, "\\\"");
        else put(b, "%c", *s);
    }
}

/* A sample value as Prometheus parses it: integers without a fraction, otherwise the
 * shortest %g that reads back exactly; +Inf, -Inf, NaN. */
static void put_value(buf *b, double v) {
    if (isnan(v)) put(b, "NaN");
    else if (isinf(v)) put(b, v > 0 ? "+Inf" : "-Inf");
    else if (v == floor(v) && fabs(v) < 1e15) put(b, "%.0f", v);
    else {
        char t[64];
        snprintf(t, sizeof t, "%.15g", v);
        if (strtod(t, NULL) != v) snprintf(t, sizeof t, "%.17g", v);
        put(b, "%s", t);
    }
}

/* {a="x",b="y"[,le="..."]} or nothing when there are no labels and no le. */
static void put_labels(buf *b, const hyla_metric *m, const series *s, const char *le) {
    if (!m->n_labels && !le) return;
    put(b, "{");
    for (size_t i = 0; i < m->n_labels; i++) {
        put(b, "%s%s=\"", i ? "," : "", m->labels[i]);
        put_escaped(b, s->values[i], 1);
        put(b, "\"");
    }
    if (le) put(b, "%sle=\"%s\"", m->n_labels ? "," : "", le);
    put(b, "}");
}

char *hyla_metrics_render(hyla_metrics *r) {
    buf b = {NULL, 0, 0};
    b.cap = 4096;
    b.p = malloc(b.cap);
    HYLA_ASSERT(b.p);
    b.p[0] = 0;
    if (!r) return b.p;
    pthread_mutex_lock(&r->render_mu);
    pthread_mutex_lock(&r->mu);
    int n_coll = r->n_coll;
    pthread_mutex_unlock(&r->mu);
    for (int i = 0; i < n_coll; i++) r->coll[i].fn(r, r->coll[i].ud);
    pthread_mutex_lock(&r->mu);
    static const char *type[] = {"counter", "gauge", "histogram"};
    for (const hyla_metric *m = r->head; m; m = m->next) {
        put(&b, "# HELP %s ", m->name);
        put_escaped(&b, m->help, 0);
        put(&b, "\n# TYPE %s %s\n", m->name, type[m->k]);
        for (const series *s = m->head; s; s = s->next) {
            if (m->k != K_HISTOGRAM) {
                put(&b, "%s", m->name);
                put_labels(&b, m, s, NULL);
                put(&b, " ");
                put_value(&b, s->v);
                put(&b, "\n");
                continue;
            }
            unsigned long long cum = 0;
            for (size_t i = 0; i <= m->n_bounds; i++) {
                char le[64];
                if (i < m->n_bounds) {
                    buf lb = {le, 0, sizeof le};
                    put_value(&lb, m->bounds[i]);
                    cum += s->buckets[i];
                } else {
                    snprintf(le, sizeof le, "+Inf");
                    cum = s->count;
                }
                put(&b, "%s_bucket", m->name);
                put_labels(&b, m, s, le);
                put(&b, " %llu\n", cum);
            }
            put(&b, "%s_sum", m->name);
            put_labels(&b, m, s, NULL);
            put(&b, " ");
            put_value(&b, s->sum);
            put(&b, "\n%s_count", m->name);
            put_labels(&b, m, s, NULL);
            put(&b, " %llu\n", s->count);
        }
    }
    pthread_mutex_unlock(&r->mu);
    pthread_mutex_unlock(&r->render_mu);
    return b.p;
}
