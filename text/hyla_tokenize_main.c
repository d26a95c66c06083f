/* hyla_tokenize_main.c — hyla-tokenize: encode text to ids, decode ids to text, and measure
 * encoding speed, with a model's tokenizer (the same one hyla-run and hyla-worker use). */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hyla_tokenizer.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: hyla-tokenize (--model DIR | --tokenizer FILE) [options] (--text T | --file F | --decode \"ID ...\")\n"
            "\n"
            "Encode text to token ids (printed space-separated on one line) or decode ids to text, with the\n"
            "tokenizer hyla-run and hyla-worker use: DIR/tokenizer.json when the model has one, else the\n"
            "byte-level tokenizer (docs/MODELS.md section 7).\n"
            "\n"
            "  --model DIR        a model directory (tokenizer.json, config.json)\n"
            "  --tokenizer FILE   a tokenizer.json file\n"
            "  --text T           encode T\n"
            "  --file F           encode the contents of file F ('-' = stdin)\n"
            "  --decode \"I J\"     decode token ids (space or comma separated) and print the text\n"
            "  --special          encoding: add the post-processor's tokens (e.g. BOS)\n"
            "  --skip-special     decoding: leave out special tokens\n"
            "  --bench            encode the --text/--file input repeatedly for about a second of CPU time\n"
            "                     and print {\"bytes\", \"tokens\", \"seconds\", \"mb_per_s\"} as JSON (one core)\n"
            "  -h, --help         this text\n");
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap);
    for (;;) {
        if (!b) break;
        if (n == cap) {
            char *nb = realloc(b, cap *= 2);
            if (!nb) {
                free(b);
                b = NULL;
                break;
            }
            b = nb;
        }
        size_t r = fread(b + n, 1, cap - n, f);
        n += r;
        if (r == 0) break;
    }
    int err = ferror(f);
    if (f != stdin) fclose(f);
    if (err) {
        free(b);
        return NULL;
    }
    *len = n;
    return b;
}

/* vocab_size from DIR/config.json, or 0 when there is none */
static int model_vocab(const char *dir) {
    char p[4096];
    snprintf(p, sizeof p, "%s/config.json", dir);
    json_t *j = json_load_file(p, 0, NULL);
    int v = j ? (int)json_integer_value(json_object_get(j, "vocab_size")) : 0;
    json_decref(j);
    return v;
}

/* CPU time of this process: the figure is per core, whatever else the machine runs */
static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    const char *model = NULL, *tokfile = NULL, *text = NULL, *file = NULL, *decode = NULL;
    int special = 0, skip_special = 0, bench = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--special")) {
            special = 1;
        } else if (!strcmp(a, "--skip-special")) {
            skip_special = 1;
        } else if (!strcmp(a, "--bench")) {
            bench = 1;
        } else if (has && !strcmp(a, "--model")) {
            model = argv[++i];
        } else if (has && !strcmp(a, "--tokenizer")) {
            tokfile = argv[++i];
        } else if (has && !strcmp(a, "--text")) {
            text = argv[++i];
        } else if (has && !strcmp(a, "--file")) {
            file = argv[++i];
        } else if (has && !strcmp(a, "--decode")) {
            decode = argv[++i];
        } else {
            fprintf(stderr, "hyla-tokenize: %s '%s' (see --help)\n",
                    (!strncmp(a, "--", 2) && !has) ? "missing value for" : "unknown argument", a);
            return 2;
        }
    }
    if (!!model + !!tokfile != 1) {
        fprintf(stderr, "hyla-tokenize: give exactly one of --model DIR or --tokenizer FILE (see --help)\n");
        return 2;
    }
    if (!!text + !!file + !!decode != 1) {
        fprintf(stderr, "hyla-tokenize: give exactly one of --text, --file or --decode (see --help)\n");
        return 2;
    }
    if (bench && decode) {
        fprintf(stderr, "hyla-tokenize: --bench measures encoding; give --text or --file\n");
        return 2;
    }
    hyla_tokenizer *t = NULL;
    hyla_status st = model ? hyla_tokenizer_load(model, model_vocab(model) ? model_vocab(model) : INT_MAX, &t)
                           : hyla_tokenizer_load_file(tokfile, &t);
    if (st != HYLA_OK) {
        fprintf(stderr, "hyla-tokenize: %s\n", hyla_last_error());
        return 1;
    }
    int rc = 0;
    if (decode) {
        size_t cap = strlen(decode) / 2 + 1, n = 0;
        int32_t *ids = malloc(cap * sizeof *ids);
        const char *p = decode;
        while (ids && *p) {
            while (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n') p++;
            if (!*p) break;
            char *end;
            errno = 0;
            long v = strtol(p, &end, 10);
            if (end == p || errno || v < 0 || v > INT32_MAX || (*end && !strchr(" ,\t\n", *end))) {
                fprintf(stderr, "hyla-tokenize: --decode: '%.*s' is not a token id\n", (int)strcspn(p, " ,\t\n"), p);
                rc = 2;
                break;
            }
            if (v >= hyla_tokenizer_n_ids(t)) {
                fprintf(stderr, "hyla-tokenize: --decode: id %ld is outside the tokenizer's ids [0, %d)\n", v,
                        hyla_tokenizer_n_ids(t));
                rc = 2;
                break;
            }
            ids[n++] = (int32_t)v;
            p = end;
        }
        if (!rc) {
            char *out;
            size_t len;
            unsigned fl = HYLA_TOK_TEXT_START | (skip_special ? HYLA_TOK_SKIP_SPECIAL : 0);
            if (!ids || hyla_tokenizer_decode(t, ids, n, fl, &out, &len) != HYLA_OK) {
                fprintf(stderr, "hyla-tokenize: %s\n", hyla_last_error());
                rc = 1;
            } else {
                fwrite(out, 1, len, stdout);
                putchar('\n');
                free(out);
            }
        }
        free(ids);
        hyla_tokenizer_free(t);
        return rc;
    }
    size_t len = 0;
    char *buf = NULL;
    if (file) {
        buf = read_file(file, &len);
        if (!buf) {
            fprintf(stderr, "hyla-tokenize: --file %s: %s\n", file, strerror(errno ? errno : EIO));
            hyla_tokenizer_free(t);
            return 1;
        }
        text = buf;
    } else {
        len = strlen(text);
    }
    unsigned fl = special ? HYLA_TOK_ADD_SPECIAL : 0;
    int32_t *ids;
    int n;
    if (bench) {
        double t0 = now(), el = 0;
        size_t bytes = 0, toks = 0;
        do {
            if (hyla_tokenizer_encode(t, text, len, fl, &ids, &n) != HYLA_OK) break;
            free(ids);
            bytes += len, toks += (size_t)n;
            el = now() - t0;
        } while (el < 1.0);
        printf("{\"kind\": \"%s\", \"bytes\": %zu, \"tokens\": %zu, \"seconds\": %.3f, \"mb_per_s\": %.2f}\n",
               hyla_tokenizer_kind(t), bytes, toks, el, el > 0 ? bytes / el / 1e6 : 0.0);
    } else if (hyla_tokenizer_encode(t, text, len, fl, &ids, &n) != HYLA_OK) {
        fprintf(stderr, "hyla-tokenize: %s\n", hyla_last_error());
        rc = 1;
    } else {
        for (int i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
        putchar('\n');
        free(ids);
    }
    free(buf);
    hyla_tokenizer_free(t);
    return rc;
}
