/* hyla-run — the offline runner: prefill a prompt, generate, print; save and load session
 * state. stdout carries only the output (text, or ids with --ids); progress, statistics and
 * errors go to stderr. Exit status: 0 success, 1 runtime failure, 2 usage error. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hyla_codec.h"
#include "hyla_log.h"
#include "hyla_session.h"
#include "hyla_tp.h"
#include "hyla_tokenizer.h"
#include "hyla_util.h"
#if __has_include("hyla_store.h")
#include "hyla_store.h"
#define HAVE_STORE 1
#endif

static void usage(FILE *f) {
    fprintf(f,
            "usage: hyla-run --model DIR (--prompt TEXT | --prompt-file F | --prompt-ids \"ID ...\")\n"
            "                --max-tokens N [options]\n"
            "       hyla-run --model DIR --load-state FILE [--prompt...] --max-tokens N [options]\n"
            "Prefills the prompt, generates N tokens and prints the text on stdout.\n"
            "  --model DIR          model directory (config.json + *.safetensors)\n"
            "  --prompt TEXT        prompt text (the model's tokenizer.json, else byte-level)\n"
            "  --prompt-file F      prompt text read from F ('-' for stdin)\n"
            "  --prompt-ids \"I J\"   prompt as token ids, space separated (bypasses the tokenizer)\n"
            "  --max-tokens N       tokens to generate (required; 0 = only prefill)\n"
            "  --seed S             sampling seed (default 0; a loaded state keeps its RNG unless given)\n"
            "  --temperature T      0 = greedy (default 0)\n"
            "  --top-k K            keep the K most probable tokens (default 0 = off)\n"
            "  --top-p P            nucleus sampling mass (default 1 = off)\n"
            "  --ignore-eos         do not stop at the model's eos token\n"
            "  --ids                print generated token ids (space separated, one line) instead of text\n"
            "  --save-state FILE    write the session state after generation (portable snapshot file)\n"
            "  --load-state FILE    start from a saved state instead of an empty session; a prompt then\n"
            "                       continues it\n"
#ifdef HAVE_STORE
            "  --store DIR          with --save-state/--load-state ID: use the RocksDB statestore at DIR,\n"
            "                       where ID is a session id (a file path otherwise)\n"
            "  --session ID         with --store: resume session ID from the store if it is there (else\n"
            "                       start it), and save it there after generation\n"
#endif
            "  --dump-logits FILE   write the logits of every consumed prompt position (and of the first\n"
            "                       generation step, which consumes the last prompt token) as\n"
            "                       little-endian float32 [positions][vocab]\n"
            "  --device DEV         cpu (default) or cuda:N\n"
            "  --tp N               tensor parallelism: split every layer's heads over N backends (cuda:K\n"
            "                       and the next N-1 GPUs, or N CPU backends); default 1. Snapshots are\n"
            "                       whole-model snapshots, so a state saved under one N loads under any\n"
            "                       other; the tokens match N = 1's within floating-point rounding\n"
            "  --prefill-piece N    prompt tokens per forward pass, a multiple of the model's prefill chunk (64;\n"
            "                       256 for SSE models: their prefill_window) up to 32768 (default 16384 on a\n"
            "                       GPU, 32768 with --tp on GPUs, 1024 on the CPU, or $HYLA_PREFILL_PIECE);\n"
            "                       the output is the same for every N\n"
            "  --quiet, -q          no progress or statistics on stderr\n");
}

typedef struct {
    double t0, last;
    int quiet;
} progress_ctx;

static int on_progress(void *ud, int64_t done, int64_t total) {
    progress_ctx *p = ud;
    double now = hyla_now();
    if (p->quiet || total < 256) return 0;
    if (done < total && now - p->last < 0.5) return 0;
    p->last = now;
    double el = now - p->t0;
    fprintf(stderr, "hyla-run: prefill %lld/%lld tokens (%.0f tok/s)\n", (long long)done, (long long)total,
            el > 0 ? done / el : 0.0);
    return 0;
}

static int parse_ids(const char *s, int32_t **out, int *n) {
    int cap = 64;
    *out = malloc((size_t)cap * sizeof **out);
    *n = 0;
    while (*s) {
        while (*s == ' ' || *s == '\t' || *s == '\n' || *s == ',') s++;
        if (!*s) break;
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 0 || v > 0x7fffffff) {
            fprintf(stderr, "hyla-run: --prompt-ids: '%.20s' is not a token id\n", s);
            return 0;
        }
        if (*n == cap) *out = realloc(*out, (size_t)(cap *= 2) * sizeof **out);
        (*out)[(*n)++] = (int32_t)v;
        s = end;
    }
    return 1;
}

static char *read_all(const char *path, size_t *len) {
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    size_t r;
    while ((r = fread(buf + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) buf = realloc(buf, cap *= 2);
    }
    if (f != stdin) fclose(f);
    *len = n;
    return buf;
}

#define FAIL(...)                                       \
    do {                                                \
        fprintf(stderr, "hyla-run: " __VA_ARGS__);      \
        fprintf(stderr, "\n");                          \
        rc = 1;                                         \
        goto out;                                       \
    } while (0)

int main(int argc, char **argv) {
    const char *model_dir = NULL, *prompt = NULL, *prompt_file = NULL, *prompt_ids = NULL, *save = NULL, *load = NULL,
               *dump = NULL, *device = "cpu", *store_dir = NULL, *session_id = NULL;
    long max_tokens = -1;
    uint64_t seed = 0;
    int seed_set = 0, samp_set = 0, want_ids = 0, ignore_eos = 0, quiet = 0, piece = 0, tp = 1;
    hyla_sampling sp = {0.0f, 0, 1.0f};
    static struct option lo[] = {{"model", 1, 0, 'm'},       {"prompt", 1, 0, 'p'},     {"prompt-file", 1, 0, 'f'},
                                 {"prompt-ids", 1, 0, 'i'},  {"max-tokens", 1, 0, 'n'}, {"seed", 1, 0, 's'},
                                 {"temperature", 1, 0, 't'}, {"top-k", 1, 0, 'k'},      {"top-p", 1, 0, 'P'},
                                 {"ids", 0, 0, 'I'},         {"save-state", 1, 0, 'S'}, {"load-state", 1, 0, 'L'},
                                 {"dump-logits", 1, 0, 'D'}, {"device", 1, 0, 'd'},     {"ignore-eos", 0, 0, 'E'},
                                 {"quiet", 0, 0, 'q'},       {"store", 1, 0, 'B'}, {"session", 1, 0, 'X'},      {"help", 0, 0, 'h'},
                                 {"prefill-piece", 1, 0, 'R'}, {"tp", 1, 0, 'T'},
                                 {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "hq", lo, NULL)) != -1) {
        char *end = NULL;
        switch (c) {
        case 'm': model_dir = optarg; break;
        case 'p': prompt = optarg; break;
        case 'f': prompt_file = optarg; break;
        case 'i': prompt_ids = optarg; break;
        case 'n':
            max_tokens = strtol(optarg, &end, 10);
            if (*end || max_tokens < 0) {
                fprintf(stderr, "hyla-run: --max-tokens must be a non-negative integer\n");
                return 2;
            }
            break;
        case 's':
        case 't':
        case 'k':
        case 'P': { /* seeds over the whole 64-bit range; the sampling ranges of hyla.h */
            uint64_t u = 0;
            double v = 0;
            int ok = c == 's'   ? hyla_parse_u64(optarg, 0, UINT64_MAX, &u)
                     : c == 'k' ? hyla_parse_u64(optarg, 0, 1000000000, &u)
                                : hyla_parse_num(optarg, 0, c == 'P' ? 1 : 1e30, &v);
            if (!ok) {
                fprintf(stderr, "hyla-run: --%s must be %s, got '%s'\n",
                        c == 's' ? "seed" : c == 't' ? "temperature" : c == 'k' ? "top-k" : "top-p",
                        c == 's'   ? "a whole number >= 0"
                        : c == 't' ? "a number >= 0"
                        : c == 'k' ? "a whole number >= 0 (0: off)"
                                   : "a number in [0, 1]",
                        optarg);
                return 2;
            }
            if (c == 's') seed = u, seed_set = 1;
            else if (c == 't') sp.temperature = (float)v, samp_set = 1;
            else if (c == 'k') sp.top_k = (int)u, samp_set = 1;
            else sp.top_p = (float)v, samp_set = 1;
            break;
        }
        case 'I': want_ids = 1; break;
        case 'S': save = optarg; break;
        case 'L': load = optarg; break;
        case 'D': dump = optarg; break;
        case 'd': device = optarg; break;
        case 'R':
            piece = (int)strtol(optarg, &end, 10);
            if (*end || piece < HYLA_PREFILL_CHUNK || piece > HYLA_PREFILL_PIECE_MAX || piece % HYLA_PREFILL_CHUNK) {
                fprintf(stderr, "hyla-run: --prefill-piece: '%s' must be a multiple of %d in [%d, %d]\n", optarg,
                        HYLA_PREFILL_CHUNK, HYLA_PREFILL_CHUNK, HYLA_PREFILL_PIECE_MAX);
                return 2;
            }
            break;
        case 'T':
            tp = (int)strtol(optarg, &end, 10);
            if (*end || tp < 1 || tp > HYLA_TP_MAX) {
                fprintf(stderr, "hyla-run: --tp: '%s' must be a number from 1 to %d\n", optarg, HYLA_TP_MAX);
                return 2;
            }
            break;
        case 'E': ignore_eos = 1; break;
        case 'q': quiet = 1; break;
        case 'B': store_dir = optarg; break;
        case 'X': session_id = optarg; break;
        case 'h': usage(stdout); return 0;
        default: fprintf(stderr, "hyla-run: see --help for the options\n"); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "hyla-run: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!model_dir || max_tokens < 0) {
        fprintf(stderr, "hyla-run: --model and --max-tokens are required (see --help)\n");
        return 2;
    }
    if ((prompt != NULL) + (prompt_file != NULL) + (prompt_ids != NULL) > 1) {
        fprintf(stderr, "hyla-run: give at most one of --prompt, --prompt-file, --prompt-ids\n");
        return 2;
    }
    if (session_id && !store_dir) {
        fprintf(stderr, "hyla-run: --session needs --store DIR\n");
        return 2;
    }
    if (session_id && (load || save)) {
        fprintf(stderr, "hyla-run: --session replaces --load-state/--save-state; give one or the other\n");
        return 2;
    }
    if (!prompt && !prompt_file && !prompt_ids && !load && !session_id) {
        fprintf(stderr, "hyla-run: a prompt (--prompt, --prompt-file or --prompt-ids) or --load-state is required\n");
        return 2;
    }
    if (sp.top_p <= 0 || sp.top_p > 1) {
        fprintf(stderr, "hyla-run: --top-p must be in (0, 1]\n");
        return 2;
    }
#ifndef HAVE_STORE
    if (store_dir) {
        fprintf(stderr, "hyla-run: --store is not available in this build\n");
        return 2;
    }
#endif
    if (quiet) hyla_log_set_level(HYLA_LOG_WARN);

    int rc = 0;
    hyla_backend *be = NULL;
    hyla_model *m = NULL;
    hyla_runtime *rt = NULL;
    hyla_tp_group *group = NULL; /* --tp > 1: owns be, m and rt */
    hyla_session *s = NULL;
    hyla_tokenizer *tok = NULL;
    hyla_tokenizer_stream *dstream = NULL;
    hyla_snapshot *snap = NULL;
    int32_t *ids = NULL;
    float *logits = NULL;
    FILE *dumpf = NULL;
    int n_ids = 0;
#ifdef HAVE_STORE
    hyla_store *store = NULL;
#endif

    double t_load = hyla_now();
    if (tp > 1) {
        if (hyla_tp_open(model_dir, device, tp, NULL, &group) != HYLA_OK) FAIL("--tp %d: %s", tp, hyla_last_error());
        be = hyla_tp_backend(group), m = hyla_tp_model(group), rt = hyla_tp_runtime(group);
    } else {
        if (hyla_backend_create(device, &be) != HYLA_OK) FAIL("device %s: %s", device, hyla_last_error());
        if (hyla_model_load(model_dir, be, NULL, &m) != HYLA_OK) FAIL("%s", hyla_last_error());
        if (hyla_runtime_create(m, &rt) != HYLA_OK) FAIL("%s", hyla_last_error());
    }
    if (piece && hyla_runtime_set_prefill_piece(rt, piece) != HYLA_OK) FAIL("--prefill-piece %d: %s", piece, hyla_last_error());
    const hyla_model_config *cfg = hyla_model_get_config(m);
    if (!quiet)
        fprintf(stderr, "hyla-run: loaded %s (%s, %d layers) on %s%s in %.2f s\n", model_dir, cfg->model_type,
                cfg->num_layers, device, tp > 1 ? " and the next ranks of the tensor-parallel group" : "",
                hyla_now() - t_load);

#ifdef HAVE_STORE
    if (store_dir) {
        hyla_store_params stp = hyla_store_default_params();
        if (hyla_store_open(store_dir, &stp, &store) != HYLA_OK) FAIL("store %s: %s", store_dir, hyla_last_error());
    }
#endif
#ifdef HAVE_STORE
    if (session_id) {
        hyla_store_session_info info;
        hyla_status st = hyla_store_info(store, session_id, &info);
        if (st == HYLA_OK) load = session_id;
        else if (st != HYLA_ERR_NOT_FOUND) FAIL("store %s: session '%s': %s", store_dir, session_id, hyla_last_error());
        else if (!prompt && !prompt_file && !prompt_ids)
            FAIL("session '%s' is not in %s; give a prompt to start it", session_id, store_dir);
        save = session_id;
    }
#endif
    if (load) {
#ifdef HAVE_STORE
        if (store) {
            if (hyla_store_get(store, load, 0, hyla_model_fingerprint(m), &snap, NULL) != HYLA_OK)
                FAIL("loading session '%s' from %s: %s", load, store_dir, hyla_last_error());
        } else
#endif
            if (hyla_snapshot_load_file(load, &snap) != HYLA_OK)
            FAIL("loading state %s: %s", load, hyla_last_error());
        if (hyla_session_import(rt, snap, &s) != HYLA_OK) FAIL("loading state %s: %s", load, hyla_last_error());
        hyla_snapshot_destroy(snap);
        snap = NULL;
        if (samp_set || seed_set) {
            hyla_sampling cur = hyla_session_get_sampling(s);
            if (samp_set) cur = sp;
            if (seed_set) hyla_session_set_sampling(s, cur, seed);
            else hyla_session_set_sampling_params(s, cur);
        }
        if (!quiet)
            fprintf(stderr, "hyla-run: resumed state at position %lld\n", (long long)hyla_session_position(s));
    } else {
        if (hyla_session_create(rt, &s) != HYLA_OK) FAIL("%s", hyla_last_error());
        hyla_session_set_sampling(s, sp, seed);
    }

    if (prompt_ids) {
        if (!parse_ids(prompt_ids, &ids, &n_ids)) {
            rc = 2;
            goto out;
        }
        if (n_ids == 0) FAIL("--prompt-ids holds no token ids");
    } else if (prompt || prompt_file) {
        if (hyla_tokenizer_load(model_dir, cfg->vocab_size, &tok) != HYLA_OK) FAIL("%s", hyla_last_error());
        size_t len = 0;
        char *text = NULL;
        if (prompt_file) {
            text = read_all(prompt_file, &len);
            if (!text) FAIL("--prompt-file %s: cannot read", prompt_file);
        }
        /* a fresh session's text gets the post-processor's tokens (BOS); a resumed one continues */
        hyla_status st = hyla_tokenizer_encode(tok, text ? text : prompt, text ? len : strlen(prompt),
                                               load ? 0 : HYLA_TOK_ADD_SPECIAL, &ids, &n_ids);
        free(text);
        if (st != HYLA_OK) FAIL("%s", hyla_last_error());
        if (n_ids == 0) FAIL("the prompt is empty");
    }
    if (!tok && !want_ids) {
        if (hyla_tokenizer_load(model_dir, cfg->vocab_size, &tok) != HYLA_OK)
            FAIL("%s (use --ids to print token ids)", hyla_last_error());
    }
    /* generated text continues the prompt: no start-of-text rule; specials are not text */
    if (!want_ids && hyla_tokenizer_stream_create(tok, HYLA_TOK_SKIP_SPECIAL, &dstream) != HYLA_OK)
        FAIL("%s", hyla_last_error());

    size_t V = (size_t)cfg->vocab_size;
    if (dump) {
        dumpf = fopen(dump, "wb");
        if (!dumpf) FAIL("--dump-logits %s: cannot create", dump);
    }
    double t_prefill = hyla_now();
    if (n_ids > 0) {
        int consumed = 0;
        if (dump && !(logits = malloc(((size_t)n_ids + 1) * V * sizeof(float)))) FAIL("out of memory");
        progress_ctx pc = {t_prefill, t_prefill, quiet};
        if (hyla_session_feed(s, ids, n_ids, logits, &consumed, on_progress, &pc) != HYLA_OK)
            FAIL("prefill: %s", hyla_last_error());
        if (dump && consumed && fwrite(logits, sizeof(float) * V, (size_t)consumed, dumpf) != (size_t)consumed)
            FAIL("--dump-logits %s: write failed", dump);
        double el = hyla_now() - t_prefill;
        if (!quiet && consumed)
            fprintf(stderr, "hyla-run: prefill %d tokens in %.3f s (%.0f tok/s)\n", consumed, el, el > 0 ? consumed / el : 0.0);
    }

    double t_gen = hyla_now();
    float *step_logits = dump ? malloc(V * sizeof(float)) : NULL;
    long produced = 0;
    for (long i = 0; i < max_tokens; i++) {
        int32_t t;
        if (hyla_session_decode(&s, 1, &t, (dump && i == 0) ? step_logits : NULL) != HYLA_OK) {
            free(step_logits);
            FAIL("generation step %ld: %s", i, hyla_last_error());
        }
        if (dump && i == 0 && fwrite(step_logits, sizeof(float), V, dumpf) != V) {
            free(step_logits);
            FAIL("--dump-logits %s: write failed", dump);
        }
        produced++;
        if (want_ids) {
            printf(i ? " %d" : "%d", t);
        } else {
            size_t nb;
            const char *b = hyla_tokenizer_stream_push(dstream, t, &nb);
            fwrite(b, 1, nb, stdout);
        }
        fflush(stdout);
        if (!ignore_eos && t == cfg->eos_token_id) break;
    }
    free(step_logits);
    if (dstream) {
        size_t nb;
        const char *b = hyla_tokenizer_stream_flush(dstream, &nb);
        fwrite(b, 1, nb, stdout);
    }
    if (want_ids || produced) printf("\n");
    fflush(stdout);
    double el = hyla_now() - t_gen;
    if (!quiet && produced)
        fprintf(stderr, "hyla-run: generated %ld tokens in %.3f s (%.1f tok/s)\n", produced, el, el > 0 ? produced / el : 0.0);

    if (save) {
        if (hyla_session_export(s, &snap) != HYLA_OK) FAIL("saving state: %s", hyla_last_error());
#ifdef HAVE_STORE
        if (store) {
            uint64_t version = 0;
            if (hyla_store_put(store, save, snap, &version, NULL) != HYLA_OK)
                FAIL("saving session '%s' to %s: %s", save, store_dir, hyla_last_error());
            if (!quiet)
                fprintf(stderr, "hyla-run: saved session '%s' version %llu (position %lld) in %s\n", save,
                        (unsigned long long)version, (long long)hyla_session_position(s), store_dir);
        } else
#endif
        {
            if (hyla_snapshot_save_file(save, snap, NULL) != HYLA_OK) FAIL("saving state to %s: %s", save, hyla_last_error());
            if (!quiet)
                fprintf(stderr, "hyla-run: saved state (position %lld, %.2f MB raw) to %s\n",
                        (long long)hyla_session_position(s), hyla_snapshot_bytes(snap) / 1e6, save);
        }
    }
out:
    if (dumpf && fclose(dumpf) != 0 && rc == 0) {
        fprintf(stderr, "hyla-run: --dump-logits %s: write failed\n", dump);
        rc = 1;
    }
    free(ids);
    free(logits);
    hyla_snapshot_destroy(snap);
    hyla_session_free(s);
#ifdef HAVE_STORE
    hyla_store_close(store);
#endif
    hyla_tokenizer_stream_free(dstream);
    hyla_tokenizer_free(tok);
    if (group) {
        hyla_tp_close(group);
    } else {
        hyla_runtime_free(rt);
        hyla_model_free(m);
        hyla_backend_destroy(be);
    }
    return rc;
}
