/* hyla_profile.c — see hyla_profile.h. */
#include "hyla_profile.h"

#include <stdlib.h>
#include <string.h>

#include "hyla_util.h"

#define PROF_MAX 64

typedef struct {
    const char *label;
    double s;
    long calls;
} prof_ent;

int hyla_prof_on;
static int g_init;
/* per thread: a tensor-parallel group's ranks each run on their own thread (rank 0 on the
 * caller's), so the caller's table is rank 0's and the ranks' marks do not mix */
static _Thread_local prof_ent g_tab[2][PROF_MAX]; /* [decode] */
static _Thread_local int g_n[2];
static _Thread_local double g_t;

void hyla_prof_init(void) {
    if (g_init) return;
    g_init = 1;
    const char *e = getenv("HYLA_PROFILE");
    hyla_prof_on = e && !strcmp(e, "1");
}

void hyla_prof_begin(const hyla_ops *o, void *ctx) {
    o->sync(ctx);
    g_t = hyla_now();
}

void hyla_prof_mark(const hyla_ops *o, void *ctx, int decode, const char *label) {
    o->sync(ctx);
    double t = hyla_now(), dt = t - g_t;
    g_t = t;
    int d = decode ? 1 : 0, i;
    for (i = 0; i < g_n[d]; i++)
        if (g_tab[d][i].label == label || !strcmp(g_tab[d][i].label, label)) break;
    if (i == g_n[d]) {
        if (g_n[d] == PROF_MAX) return;
        g_tab[d][g_n[d]++] = (prof_ent){label, 0, 0};
    }
    g_tab[d][i].s += dt;
    g_tab[d][i].calls++;
}

void hyla_prof_reset(void) { g_n[0] = g_n[1] = 0; }

void hyla_prof_print_json(FILE *f) {
    if (!hyla_prof_on) return;
    fprintf(f, ",\"profile\":{");
    for (int d = 0; d < 2; d++) {
        double sum = 0;
        for (int i = 0; i < g_n[d]; i++) sum += g_tab[d][i].s;
        fprintf(f, "%s\"%s\":[", d ? "," : "", d ? "decode" : "prefill");
        for (int i = 0; i < g_n[d]; i++)
            fprintf(f, "%s{\"label\":\"%s\",\"ms\":%.3f,\"calls\":%ld,\"share\":%.3f}", i ? "," : "", g_tab[d][i].label,
                    g_tab[d][i].s * 1e3, g_tab[d][i].calls, sum > 0 ? g_tab[d][i].s / sum : 0.0);
        fprintf(f, "]");
    }
    fprintf(f, "}");
}
