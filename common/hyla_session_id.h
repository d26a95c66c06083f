/* hyla_session_id.h — the one definition of a session id, for every module (coordinator,
 * workers, the statestore, clients).
 *
 * A session id is 1..HYLA_SESSION_ID_MAX bytes of printable ASCII without spaces (0x21..0x7e).
 * The coordinator assigns them ("s-" + 16 hex digits); every server checks the ids it is given
 * with hyla_session_id_check, byte for byte: an id never carries a NUL (the rpc layer refuses a
 * string field with a NUL byte before any handler sees it), so a C string holds all of it. */
#ifndef HYLA_SESSION_ID_H
#define HYLA_SESSION_ID_H

#include <string.h>

#include "hyla_status.h"

/* Longest session id in bytes (buffers hold HYLA_SESSION_ID_MAX + 1 with the NUL). */
#define HYLA_SESSION_ID_MAX 31

/* HYLA_OK if id is a valid session id; else HYLA_ERR_INVALID_ARG with a message naming `what`
 * (e.g. "field session_id") and the rule it broke. */
static inline hyla_status hyla_session_id_check(const char *id, const char *what) {
    size_t n = id ? strlen(id) : 0;
    if (n == 0 || n > HYLA_SESSION_ID_MAX)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "%s: a session id is 1..%d bytes (got %zu)", what,
                         HYLA_SESSION_ID_MAX, n);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)id[i] <= 0x20 || (unsigned char)id[i] >= 0x7f)
            return hyla_fail(HYLA_ERR_INVALID_ARG,
                             "%s: byte %zu of the session id is 0x%02x; ids are printable ASCII without spaces",
                             what, i, (unsigned char)id[i]);
    return HYLA_OK;
}

#endif
