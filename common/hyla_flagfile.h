/* hyla_flagfile.h — `--config FILE` for the server binaries: every command-line flag may be
 * written as a key in FILE, and flags given on the command line override the file.
 *
 * File format (docs/OPERATIONS.md, "Configuration file"): one `key = value` per line; the key
 * is the flag's name without the leading dashes (`listen`, `heartbeat-ms`); `#` starts a
 * comment line; blank lines are ignored; the value may be wrapped in double quotes; a flag that
 * takes no value is written `key = true` (`false` leaves it out). A key may repeat where its
 * flag does (`chat-template`).
 *
 * hyla_flagfile_expand rewrites argv: the file's entries become `--key value` arguments placed
 * before the command-line ones (so a parser that lets the last occurrence win gives the command
 * line precedence), and `--config FILE` / `--config=FILE` is removed. Not thread-safe (called
 * once from main). */
#ifndef HYLA_FLAGFILE_H
#define HYLA_FLAGFILE_H

#include "hyla_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A flag a program accepts: its name without dashes and whether it takes a value. */
typedef struct {
    const char *name;
    int has_value;
} hyla_flag_spec;

/* known: n_known flags; a key not among them, a value given to a flag without one, a missing
 * value or a malformed line fails with HYLA_ERR_INVALID_ARG naming FILE:LINE and the key; an
 * unreadable file fails with HYLA_ERR_IO naming it. Without --config, *out_argv is a copy of
 * argv. *out_argv (argc entries + NULL): caller frees with hyla_flagfile_free. */
hyla_status hyla_flagfile_expand(int argc, char **argv, const hyla_flag_spec *known, size_t n_known, int *out_argc,
                                 char ***out_argv);
void hyla_flagfile_free(int argc, char **argv);

#ifdef __cplusplus
}
#endif
#endif
