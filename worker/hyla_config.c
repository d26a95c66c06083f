/* hyla_config.c — config.json -> hyla_model_config (docs/MODELS.md §2).
 * Reads the keys every model has (vocabulary, width, depth, MLP, norm, special tokens), finds
 * the base mixer kind by model_type and the hybrid specs (`attn`, ...) by the registered mixers'
 * spec keys, and lets each mixer module parse its own keys (hyla_mixer.h). Errors name the file
 * and the key; values we do not implement are refused by name. */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_mixer.h"
#include "hyla_model.h"

/* ---- the reader (hyla_mixer.h) ---- */

static void keyname(const hyla_cfg *r, const char *key, char *buf, size_t n) {
    if (r->where && *r->where) snprintf(buf, n, "%s.%s", r->where, key);
    else snprintf(buf, n, "%s", key);
}

void hyla_cfg_fail(hyla_cfg *r, hyla_status code, const char *fmt, ...) {
    if (r->st != HYLA_OK) return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    r->st = hyla_fail(code, "%s: %s", r->path, msg);
}

static void type_error(hyla_cfg *r, const char *key, const char *what) {
    char k[96];
    keyname(r, key, k, sizeof k);
    hyla_cfg_fail(r, HYLA_ERR_FORMAT, "key '%s' must be %s", k, what);
}

int hyla_cfg_has(json_t *obj, const char *key) {
    json_t *v = json_object_get(obj, key);
    return v && !json_is_null(v);
}

static int is_integral(const json_t *v) {
    return json_is_integer(v) || (json_is_real(v) && floor(json_real_value(v)) == json_real_value(v));
}
static int is_number(const json_t *v) { return json_is_number(v); }
static int is_boolean(const json_t *v) { return json_is_boolean(v); }
static int is_string(const json_t *v) { return json_is_string(v); }

/* The value of key when present, not null and of the kind ok() accepts; else NULL (the caller's
 * default), with an error naming the key and `want` when it has another kind: every typed getter
 * reads a key this way. */
static json_t *typed(hyla_cfg *r, json_t *obj, const char *key, int (*ok)(const json_t *), const char *want) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return NULL;
    if (ok(v)) return v;
    type_error(r, key, want);
    return NULL;
}

int hyla_cfg_int(hyla_cfg *r, json_t *obj, const char *key, int dflt) {
    json_t *v = typed(r, obj, key, is_integral, "an integer");
    if (!v) return dflt;
    return json_is_integer(v) ? (int)json_integer_value(v) : (int)json_real_value(v);
}

double hyla_cfg_num(hyla_cfg *r, json_t *obj, const char *key, double dflt) {
    json_t *v = typed(r, obj, key, is_number, "a number");
    return v ? json_number_value(v) : dflt;
}

int hyla_cfg_bool(hyla_cfg *r, json_t *obj, const char *key, int dflt) {
    json_t *v = typed(r, obj, key, is_boolean, "true or false");
    return v ? json_is_true(v) : dflt;
}

const char *hyla_cfg_str(hyla_cfg *r, json_t *obj, const char *key, const char *dflt) {
    json_t *v = typed(r, obj, key, is_string, "a string");
    return v ? json_string_value(v) : dflt;
}

void hyla_cfg_positive(hyla_cfg *r, const char *key, int v) {
    if (v > 0) return;
    char k[96];
    keyname(r, key, k, sizeof k);
    hyla_cfg_fail(r, HYLA_ERR_FORMAT, "key '%s' must be a positive integer (got %d)", k, v);
}

void hyla_cfg_refuse(hyla_cfg *r, const char *key, const char *why) {
    char k[96];
    keyname(r, key, k, sizeof k);
    hyla_cfg_fail(r, HYLA_ERR_UNSUPPORTED, "key '%s': %s", k, why);
}

/* ---- config.json with Python's non-standard number tokens ---- */

/* transformers 5 writes a non-finite float as {"__float__": "Infinity" | "-Infinity" | "NaN"}:
 * such objects become null, as the bare tokens do. */
static json_t *decode_special_floats(json_t *v) {
    if (json_is_object(v)) {
        json_t *tag = json_object_get(v, "__float__");
        if (json_object_size(v) == 1 && json_is_string(tag)) {
            const char *t = json_string_value(tag);
            if (!strcmp(t, "Infinity") || !strcmp(t, "-Infinity") || !strcmp(t, "NaN")) return json_null();
        }
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x) {
            json_t *d = decode_special_floats(x);
            if (d != x) json_object_set_new(v, k, d);
        }
    } else if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++) {
            json_t *x = json_array_get(v, i), *d = decode_special_floats(x);
            if (d != x) json_array_set_new(v, i, d);
        }
    }
    return v;
}

static json_t *load_json_tokens(const char *path, json_error_t *err);

json_t *hyla_cfg_load_json(const char *path, json_error_t *err) {
    json_t *root = load_json_tokens(path, err);
    return root ? decode_special_floats(root) : NULL;
}

static json_t *load_json_tokens(const char *path, json_error_t *err) {
    json_t *root = json_load_file(path, 0, err);
    if (root) return root;
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = cap ? 2 * cap : 65536;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = nb;
        }
        size_t got = fread(buf + n, 1, 4096, f);
        n += got;
        if (got < 4096) break;
    }
    fclose(f);
    buf[n] = 0;
    /* outside strings, -Infinity / Infinity / NaN become null (padded with spaces) */
    int in_str = 0, changed = 0;
    for (size_t i = 0; i < n; i++) {
        char ch = buf[i];
        if (in_str) {
            if (ch == '\\' && i + 1 < n) i++;
            else if (ch == '"') in_str = 0;
            continue;
        }
        if (ch == '"') {
            in_str = 1;
            continue;
        }
        static const char *toks[3] = {"-Infinity", "Infinity", "NaN"};
        for (int t = 0; t < 3; t++) {
            size_t l = strlen(toks[t]);
            if (i + l <= n && !memcmp(buf + i, toks[t], l)) {
                memcpy(buf + i, "null", 4);
                memset(buf + i + 4, ' ', l - 4);
                i += l - 1;
                changed = 1;
                break;
            }
        }
    }
    if (changed) root = json_loads(buf, 0, err);
    free(buf);
    return root;
}

/* flash-linear-attention's layout (docs/MODELS.md §1) */
static const hyla_layout fla_layout = {
    .embed = "model.embeddings.weight",
    .layer_norm = "model.layers.%d.attn_norm.weight",
    .mixer = "model.layers.%d.attn.",
    .mlp_norm = "model.layers.%d.mlp_norm.weight",
    .mlp = "model.layers.%d.mlp.",
    .final_norm = "model.norm.weight",
    .lm_head = "lm_head.weight",
};

/* ---- config objects: the mixers' config structs, freed together ---- */

typedef struct owned {
    struct owned *next;
    _Alignas(16) unsigned char data[];
} owned;

static void *own_new(hyla_model_config *c, size_t bytes) {
    owned *o = calloc(1, sizeof *o + bytes);
    if (!o) return NULL;
    o->next = c->owned;
    c->owned = o;
    return o->data;
}

void hyla_model_config_free(hyla_model_config *c) {
    if (!c) return;
    for (owned *o = c->owned, *n; o; o = n) {
        n = o->next;
        free(o);
    }
    c->owned = NULL;
}

const char *hyla_model_config_layer_kind(const hyla_model_config *c, int i) {
    return i >= 0 && i < c->num_layers && c->mixer[i] ? c->mixer[i]->name : "?";
}

/* The layers a spec object lists (`where.layers`, already checked to be an array) run mixer mx
 * with config cfg; each must be a layer of the model that no other spec took. */
static void assign_layers(hyla_cfg *r, const char *where, json_t *layers, const hyla_mixer *mx, void *cfg,
                          hyla_model_config *c) {
    size_t i;
    json_t *l;
    json_array_foreach(layers, i, l) {
        if (!json_is_integer(l) || json_integer_value(l) < 0 || json_integer_value(l) >= c->num_layers) {
            hyla_cfg_fail(r, HYLA_ERR_FORMAT, "'%s.layers' has an entry outside [0, %d)", where, c->num_layers);
            return;
        }
        int li = (int)json_integer_value(l);
        if (c->mixer_cfg[li]) {
            hyla_cfg_fail(r, HYLA_ERR_FORMAT, "'%s.layers' lists layer %d, which another spec already took", where, li);
            return;
        }
        c->mixer[li] = mx;
        c->mixer_cfg[li] = cfg;
    }
}

/* The "layers" list of spec object `where`, or NULL after an error naming it: every kind of spec
 * is an object that lists its layers. */
static json_t *spec_layers(hyla_cfg *r, json_t *spec, const char *where) {
    if (!json_is_object(spec)) {
        hyla_cfg_fail(r, HYLA_ERR_FORMAT, "key '%s' must be an object or a list of objects", where);
        return NULL;
    }
    json_t *layers = json_object_get(spec, "layers");
    if (!json_is_array(layers)) {
        hyla_cfg_fail(r, HYLA_ERR_FORMAT, "key '%s.layers' must be a list of layer indices", where);
        return NULL;
    }
    return layers;
}

/* A spec (`attn`, ...): an object, or a list of objects (FLA accepts both), each with "layers". */
static void read_spec(hyla_cfg *r, json_t *root, const hyla_mixer *mx, json_t *spec, int idx, hyla_model_config *c) {
    char where[64];
    snprintf(where, sizeof where, idx < 0 ? "%s" : "%s[%d]", mx->spec_key, idx);
    json_t *layers = spec_layers(r, spec, where);
    if (!layers) return;
    void *cfg = own_new(c, mx->cfg_size);
    if (!cfg) {
        hyla_cfg_fail(r, HYLA_ERR_NOMEM, "out of memory");
        return;
    }
    hyla_cfg sub = {r->path, where, HYLA_OK};
    mx->parse(&sub, spec, c, cfg);
    if (sub.st != HYLA_OK) {
        if (r->st == HYLA_OK) r->st = sub.st;
        return;
    }
    (void)root;
    assign_layers(r, where, layers, mx, cfg, c);
}

/* A `statex` spec (our extension; docs/MODELS.md "StateX"): the listed layers keep the base kind,
 * parsed from the root keys overlaid by the spec's own keys (e.g. num_heads 1 for merged GLA heads,
 * state_size 512 for Mamba2). */
static void read_statex(hyla_cfg *r, json_t *root, const hyla_mixer *base, json_t *spec, int idx, hyla_model_config *c) {
    char where[64];
    snprintf(where, sizeof where, idx < 0 ? "statex" : "statex[%d]", idx);
    json_t *layers = spec_layers(r, spec, where);
    if (!layers) return;
    json_t *merged = json_deep_copy(root);
    void *cfg = own_new(c, base->cfg_size);
    if (!merged || !cfg || json_object_update(merged, spec) != 0) {
        json_decref(merged);
        hyla_cfg_fail(r, HYLA_ERR_NOMEM, "out of memory");
        return;
    }
    json_object_del(merged, "layers");
    hyla_cfg sub = {r->path, where, HYLA_OK};
    base->parse(&sub, merged, c, cfg);
    json_decref(merged);
    if (sub.st != HYLA_OK) {
        if (r->st == HYLA_OK) r->st = sub.st;
        return;
    }
    assign_layers(r, where, layers, base, cfg, c);
}

hyla_status hyla_model_config_load(const char *dir, hyla_model_config *c) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    memset(c, 0, sizeof *c);
    json_error_t jerr;
    json_t *root = hyla_cfg_load_json(path, &jerr);
    if (!root) {
        FILE *f = fopen(path, "r");
        if (!f) return hyla_fail(HYLA_ERR_NOT_FOUND, "%s: no such file (a model directory needs config.json)", path);
        fclose(f);
        return hyla_fail(HYLA_ERR_FORMAT, "%s: line %d: %s", path, jerr.line, jerr.text);
    }
    if (!json_is_object(root)) {
        json_decref(root);
        return hyla_fail(HYLA_ERR_FORMAT, "%s: not a JSON object", path);
    }
    hyla_cfg r = {path, "", HYLA_OK};
    const char *mt = hyla_cfg_str(&r, root, "model_type", NULL);
    if (!mt) {
        json_decref(root);
        return hyla_fail(HYLA_ERR_FORMAT, "%s: key 'model_type' is missing", path);
    }
    snprintf(c->model_type, sizeof c->model_type, "%s", mt);
    const hyla_mixer *base = NULL;
    char known[256] = "";
    for (int i = 0; hyla_mixers[i]; i++) {
        const hyla_mixer *mx = hyla_mixers[i];
        if (!mx->model_type) continue;
        if (!strcmp(mx->model_type, mt)) base = mx;
        size_t o = strlen(known);
        snprintf(known + o, sizeof known - o, "%s%s", o ? ", " : "", mx->model_type);
    }
    if (!base) {
        hyla_status st = hyla_fail(HYLA_ERR_UNSUPPORTED, "%s: unknown model_type '%s' (supported: %s)", path, mt, known);
        json_decref(root);
        return st;
    }

    c->vocab_size = hyla_cfg_int(&r, root, "vocab_size", 32000);
    c->hidden_size = hyla_cfg_int(&r, root, "hidden_size", 2048);
    c->num_layers = hyla_cfg_int(&r, root, "num_hidden_layers", 24);
    hyla_cfg_positive(&r, "vocab_size", c->vocab_size);
    hyla_cfg_positive(&r, "hidden_size", c->hidden_size);
    hyla_cfg_positive(&r, "num_hidden_layers", c->num_layers);
    if (r.st == HYLA_OK && c->num_layers > HYLA_MAX_LAYERS)
        hyla_cfg_fail(&r, HYLA_ERR_UNSUPPORTED, "num_hidden_layers %d exceeds %d", c->num_layers, HYLA_MAX_LAYERS);
    c->norm_eps = (float)hyla_cfg_num(&r, root, "norm_eps", 1e-6);
    c->tie_word_embeddings = hyla_cfg_bool(&r, root, "tie_word_embeddings", 0);
    c->bos_token_id = hyla_cfg_int(&r, root, "bos_token_id", -1);
    c->eos_token_id = hyla_cfg_int(&r, root, "eos_token_id", -1);
    double ratio = hyla_cfg_num(&r, root, "hidden_ratio", 4);
    c->intermediate_size = hyla_cfg_int(&r, root, "intermediate_size", 0);
    if (c->intermediate_size <= 0) {
        int f = (int)(c->hidden_size * ratio * 2 / 3);
        c->intermediate_size = 256 * ((f + 255) / 256);
    }
    const char *act = hyla_cfg_str(&r, root, "hidden_act", "swish");
    if (strcmp(act, "swish") && strcmp(act, "silu")) hyla_cfg_refuse(&r, "hidden_act", "only swish (SwiGLU) is supported");
    if (hyla_cfg_has(root, "attnres_block_size"))
        hyla_cfg_refuse(&r, "attnres_block_size", "attention residuals across layers are not supported (must be null)");
    c->layout = base->layout ? base->layout : &fla_layout;
    if (base->parse_model) base->parse_model(&r, root, c);
    if (r.st != HYLA_OK) goto done;

    /* the base kind at every layer, then the specs take their layers */
    void *bcfg = own_new(c, base->cfg_size);
    if (!bcfg) {
        hyla_cfg_fail(&r, HYLA_ERR_NOMEM, "out of memory");
        goto done;
    }
    base->parse(&r, root, c, bcfg);
    if (r.st != HYLA_OK) goto done;
    for (int i = 0; hyla_mixers[i] && r.st == HYLA_OK; i++) {
        const hyla_mixer *mx = hyla_mixers[i];
        if (!mx->spec_key || mx == base) continue;
        json_t *spec = json_object_get(root, mx->spec_key);
        if (!spec || json_is_null(spec)) continue;
        if (json_is_array(spec)) {
            size_t k;
            json_t *sp;
            json_array_foreach(spec, k, sp) read_spec(&r, root, mx, sp, (int)k, c);
        } else if (json_is_object(spec)) {
            read_spec(&r, root, mx, spec, -1, c);
        } else {
            hyla_cfg_fail(&r, HYLA_ERR_FORMAT, "key '%s' must be an object or a list of objects", mx->spec_key);
        }
    }
    json_t *sx = json_object_get(root, "statex");
    if (r.st == HYLA_OK && sx && !json_is_null(sx)) {
        if (json_is_array(sx)) {
            size_t k;
            json_t *sp;
            json_array_foreach(sx, k, sp) read_statex(&r, root, base, sp, (int)k, c);
        } else {
            read_statex(&r, root, base, sx, -1, c);
        }
    }
    for (int i = 0; i < c->num_layers; i++)
        if (!c->mixer_cfg[i]) {
            c->mixer[i] = base;
            c->mixer_cfg[i] = bcfg;
        }
    c->prefill_chunk = HYLA_PREFILL_CHUNK;
    for (int i = 0; r.st == HYLA_OK && i < c->num_layers; i++) {
        int a = c->mixer[i]->prefill_align ? c->mixer[i]->prefill_align(c->mixer_cfg[i]) : HYLA_PREFILL_CHUNK;
        /* powers of two (the kinds validate theirs): the largest is a multiple of every other */
        if (a < HYLA_PREFILL_CHUNK || a > HYLA_PREFILL_PIECE_MAX || (a & (a - 1)))
            hyla_cfg_fail(&r, HYLA_ERR_FORMAT, "layer %d (%s): prefill alignment %d is not a power of two in [%d, %d]",
                          i, c->mixer[i]->name, a, HYLA_PREFILL_CHUNK, HYLA_PREFILL_PIECE_MAX);
        else if (a > c->prefill_chunk) c->prefill_chunk = a;
    }
done:
    json_decref(root);
    if (r.st != HYLA_OK) hyla_model_config_free(c);
    return r.st;
}
