/* hyla_flagfile.c — see hyla_flagfile.h. The new argv owns copies of every string. */
#include "hyla_flagfile.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char **v;
    int n, cap;
} vec;

static int push(vec *a, const char *s, size_t len) {
    if (a->n + 2 > a->cap) {
        int cap = a->cap ? a->cap * 2 : 16;
        char **v = realloc(a->v, (size_t)cap * sizeof *v);
        if (!v) return 0;
        a->v = v;
        a->cap = cap;
    }
    char *d = strndup(s, len);
    if (!d) return 0;
    a->v[a->n++] = d;
    a->v[a->n] = NULL;
    return 1;
}

void hyla_flagfile_free(int argc, char **argv) {
    if (!argv) return;
    for (int i = 0; i < argc; i++) free(argv[i]);
    free(argv);
}

static char *trim(char *s) {
    while (isspace((unsigned char)*s)) s++;
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1])) s[--n] = 0;
    return s;
}

static hyla_status read_file(const char *file, const hyla_flag_spec *known, size_t n_known, vec *a) {
    FILE *f = fopen(file, "r");
    if (!f) return hyla_fail(HYLA_ERR_IO, "--config %s: cannot open: %s", file, strerror(errno));
    char line[8192];
    int ln = 0;
    hyla_status st = HYLA_OK;
    while (st == HYLA_OK && fgets(line, sizeof line, f)) {
        ln++;
        if (!strchr(line, '\n') && !feof(f)) {
            st = hyla_fail(HYLA_ERR_INVALID_ARG, "%s:%d: line longer than %zu bytes", file, ln, sizeof line - 2);
            break;
        }
        char *s = trim(line);
        if (!*s || *s == '#') continue;
        char *eq = strchr(s, '=');
        if (!eq) {
            st = hyla_fail(HYLA_ERR_INVALID_ARG, "%s:%d: want `key = value`, got '%s'", file, ln, s);
            break;
        }
        *eq = 0;
        char *key = trim(s), *val = trim(eq + 1);
        size_t vl = strlen(val);
        if (vl >= 2 && val[0] == '"' && val[vl - 1] == '"') {
            val[vl - 1] = 0;
            val++;
        }
        const hyla_flag_spec *k = NULL;
        for (size_t i = 0; i < n_known && !k; i++)
            if (!strcmp(known[i].name, key)) k = &known[i];
        if (!k || !strcmp(key, "config")) {
            st = hyla_fail(HYLA_ERR_INVALID_ARG, "%s:%d: unknown key '%s' (keys are the flags' names, see --help)", file,
                           ln, key);
            break;
        }
        char flag[300];
        snprintf(flag, sizeof flag, "--%s", key);
        if (!k->has_value) {
            if (!strcmp(val, "false")) continue;
            if (strcmp(val, "true")) {
                st = hyla_fail(HYLA_ERR_INVALID_ARG, "%s:%d: %s takes no value: write `%s = true` or `false`", file, ln,
                               key, key);
                break;
            }
            if (!push(a, flag, strlen(flag))) st = hyla_fail(HYLA_ERR_NOMEM, "--config: out of memory");
            continue;
        }
        if (!*val) {
            st = hyla_fail(HYLA_ERR_INVALID_ARG, "%s:%d: %s needs a value", file, ln, key);
            break;
        }
        if (!push(a, flag, strlen(flag)) || !push(a, val, strlen(val)))
            st = hyla_fail(HYLA_ERR_NOMEM, "--config: out of memory");
    }
    if (st == HYLA_OK && ferror(f)) st = hyla_fail(HYLA_ERR_IO, "--config %s: read error", file);
    fclose(f);
    return st;
}

hyla_status hyla_flagfile_expand(int argc, char **argv, const hyla_flag_spec *known, size_t n_known, int *out_argc,
                                 char ***out_argv) {
    *out_argc = 0;
    *out_argv = NULL;
    vec a = {NULL, 0, 0};
    hyla_status st = HYLA_OK;
    const char *file = NULL;
    int skip = -1; /* index of --config's value */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--")) break;
        if (!strcmp(argv[i], "--config")) {
            if (i + 1 >= argc) return hyla_fail(HYLA_ERR_INVALID_ARG, "--config needs a file");
            file = argv[i + 1];
            skip = i + 1;
        } else if (!strncmp(argv[i], "--config=", 9)) {
            file = argv[i] + 9;
        }
    }
    if (!push(&a, argv[0], strlen(argv[0]))) st = hyla_fail(HYLA_ERR_NOMEM, "--config: out of memory");
    if (st == HYLA_OK && file) st = read_file(file, known, n_known, &a);
    for (int i = 1; st == HYLA_OK && i < argc; i++) {
        if (i == skip || (skip == i + 1 && !strcmp(argv[i], "--config")) || !strncmp(argv[i], "--config=", 9)) continue;
        if (!push(&a, argv[i], strlen(argv[i]))) st = hyla_fail(HYLA_ERR_NOMEM, "--config: out of memory");
    }
    if (st != HYLA_OK) {
        hyla_flagfile_free(a.n, a.v);
        return st;
    }
    *out_argc = a.n;
    *out_argv = a.v;
    return HYLA_OK;
}
