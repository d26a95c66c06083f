/* hyla_status.c — status names and the thread-local detail message.
 * Threading: the detail buffer is _Thread_local; no locks. */
#include "hyla_status.h"

#include <string.h>

static _Thread_local char g_detail[2048];

const char *hyla_status_str(hyla_status s) {
    static const char *names[HYLA_STATUS_COUNT] = {
        "ok",          "invalid argument", "not found",   "i/o error",
        "format error", "corrupt data",   "mismatch",    "unsupported",
        "out of memory", "device error",  "already exists", "resource exhausted",
        "permission denied", "unavailable", "cancelled",  "internal error",
    };
    if ((unsigned)s >= HYLA_STATUS_COUNT)
        return "unknown status";
    return names[s];
}

hyla_status hyla_fail(hyla_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_detail, sizeof g_detail, fmt, ap);
    va_end(ap);
    return s;
}

hyla_status hyla_fail_wrap(hyla_status s, const char *fmt, ...) {
    char prefix[1024], old[sizeof g_detail];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, g_detail, sizeof old);
    snprintf(g_detail, sizeof g_detail, "%s: %s", prefix, old[0] ? old : hyla_status_str(s));
    return s;
}

const char *hyla_last_error(void) { return g_detail[0] ? g_detail : "(no detail)"; }

void hyla_clear_error(void) { g_detail[0] = 0; }
