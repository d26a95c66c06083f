/* hyla_status.h — the runtime-error channel shared by every module.
 *
 * Three channels, never mixed (docs/ARCHITECTURE.md):
 *   - programmer bugs    -> HYLA_ASSERT (prints file, line, expression; aborts)
 *   - runtime failures   -> hyla_status + a detail message (hyla_last_error())
 *   - gRPC               -> a gRPC status code built from the two above (common/hyla_rpc.h)
 *
 * The detail message is thread-local: a function that returns a status other than
 * HYLA_OK has set it with hyla_fail(); the caller may read it until the next failing
 * call on the same thread, or prefix it with more context via hyla_fail_wrap(). */
#ifndef HYLA_STATUS_H
#define HYLA_STATUS_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    HYLA_OK = 0,
    HYLA_ERR_INVALID_ARG,   /* a parameter is out of range or malformed */
    HYLA_ERR_NOT_FOUND,     /* file, tensor, session, version ... does not exist */
    HYLA_ERR_IO,            /* the OS refused a read/write/open/fsync */
    HYLA_ERR_FORMAT,        /* a file or message does not parse */
    HYLA_ERR_CORRUPT,       /* a checksum does not match */
    HYLA_ERR_MISMATCH,      /* model fingerprint, dtype or shape differs from what is expected */
    HYLA_ERR_UNSUPPORTED,   /* a valid request we do not implement (yet) */
    HYLA_ERR_NOMEM,         /* an allocation failed */
    HYLA_ERR_DEVICE,        /* CUDA / cuBLAS / NCCL reported an error */
    HYLA_ERR_EXISTS,        /* the thing to create is already there */
    HYLA_ERR_RESOURCE,      /* a configured limit was exceeded */
    HYLA_ERR_PERMISSION,    /* the caller may not touch this object */
    HYLA_ERR_UNAVAILABLE,   /* nobody can serve this now; retry later */
    HYLA_ERR_CANCELLED,     /* the operation was cancelled */
    HYLA_ERR_INTERNAL,      /* an invariant of a foreign library broke */
    HYLA_STATUS_COUNT
} hyla_status;

/* Static string naming the status, e.g. "HYLA_ERR_CORRUPT" -> "corrupt". */
const char *hyla_status_str(hyla_status s);

/* Record a detail message for status s on this thread and return s. */
hyla_status hyla_fail(hyla_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prefix the current detail message with more context ("loading x: <old>") and return s. */
hyla_status hyla_fail_wrap(hyla_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The detail message of the last failure on this thread; borrowed until the next hyla_fail. */
const char *hyla_last_error(void);
void hyla_clear_error(void);

/* Programmer bugs: print and abort. Always on (not compiled out in release builds). */
#define HYLA_ASSERT(expr)                                                              \
    do {                                                                               \
        if (!(expr)) {                                                                 \
            fprintf(stderr, "hyla: assertion failed at %s:%d: %s\n", __FILE__, __LINE__, \
                    #expr);                                                            \
            abort();                                                                   \
        }                                                                              \
    } while (0)

/* Propagate a failing status. */
#define HYLA_TRY(call)                      \
    do {                                    \
        hyla_status hyla_try_s_ = (call);   \
        if (hyla_try_s_ != HYLA_OK)         \
            return hyla_try_s_;             \
    } while (0)

#ifdef __cplusplus
}
#endif
#endif
