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
    size_t pl = strlen(prefix);
    if (pl > sizeof g_detail - 3) pl = sizeof g_detail - 3;
    memcpy(g_detail, prefix, pl);
    memcpy(g_detail + pl, ": ", 2);
    const char *rest = old[0] ? old : hyla_status_str(s);
    size_t rl = strlen(rest), room = sizeof g_detail - pl - 3;
    if (rl > room) rl = room;
    memcpy(g_detail + pl + 2, rest, rl);
    g_detail[pl + 2 + rl] = 0;
    return s;
}

const char *hyla_last_error(void) { return g_detail[0] ? g_detail : "(no detail)"; }

void hyla_clear_error(void) { g_detail[0] = 0; }
