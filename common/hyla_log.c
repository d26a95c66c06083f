/* hyla_log.c — see hyla_log.h. The level is read once from HYLA_LOG on first use. */
#include "hyla_log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int g_level = -1;
static char g_prefix[64] = "hyla";
static int g_format = HYLA_LOG_TEXT;

void hyla_log_set_format(hyla_log_format f) { g_format = (int)f; }
int hyla_log_parse_format(const char *s, hyla_log_format *out) {
    if (s && !strcmp(s, "text")) *out = HYLA_LOG_TEXT;
    else if (s && !strcmp(s, "json")) *out = HYLA_LOG_JSON;
    else return 0;
    return 1;
}

/* s as the inside of a JSON string (quotes, backslashes and control bytes escaped; other bytes
 * as they are, so UTF-8 passes through). */
static void json_escape(char *out, size_t cap, const char *s) {
    size_t n = 0;
    for (; *s && n + 7 < cap; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') {
            out[n++] = '\\';
            out[n++] = (char)ch;
        } else if (ch == '\n') {
            out[n++] = '\\';
            out[n++] = 'n';
        } else if (ch < 0x20) {
            n += (size_t)snprintf(out + n, cap - n, "\\u%04x", ch);
        } else {
            out[n++] = (char)ch;
        }
    }
    out[n] = 0;
}

static void init_level(void) {
    const char *e = getenv("HYLA_LOG");
    g_level = HYLA_LOG_INFO;
    if (!e) return;
    if (!strcmp(e, "debug")) g_level = HYLA_LOG_DEBUG;
    else if (!strcmp(e, "warn")) g_level = HYLA_LOG_WARN;
    else if (!strcmp(e, "error")) g_level = HYLA_LOG_ERROR;
    else if (!strcmp(e, "off")) g_level = HYLA_LOG_OFF;
}

void hyla_log_set_level(hyla_log_level lvl) { g_level = (int)lvl; }
hyla_log_level hyla_log_get_level(void) {
    if (g_level < 0) init_level();
    return (hyla_log_level)g_level;
}
void hyla_log_set_prefix(const char *prefix) { snprintf(g_prefix, sizeof g_prefix, "%s", prefix); }

void hyla_log(hyla_log_level lvl, const char *fmt, ...) {
    if (g_level < 0) init_level();
    if ((int)lvl < g_level) return;
    static const char *tag[] = {"debug", "info", "warn", "error"};
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    if (g_format == HYLA_LOG_JSON) {
        char em[4200], ep[140];
        json_escape(em, sizeof em, msg);
        json_escape(ep, sizeof ep, g_prefix);
        fprintf(stderr, "{\"ts\":\"%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ\",\"level\":\"%s\",\"component\":\"%s\",\"msg\":\"%s\"}\n",
                tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000,
                tag[lvl], ep, em);
        return;
    }
    fprintf(stderr, "%02d:%02d:%02d.%03ld %s %s: %s\n", tm.tm_hour, tm.tm_min, tm.tm_sec,
            ts.tv_nsec / 1000000, g_prefix, tag[lvl], msg);
}
