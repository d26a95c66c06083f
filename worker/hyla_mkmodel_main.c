/* hyla-mkmodel — writes a model directory (config.json + model.safetensors) with
 * deterministic random weights, for tests, the demo and benchmarks.
 *
 * Same arguments => byte-identical files (weights come from hyla_rng seeded by --seed, in a
 * fixed tensor order). Initialisation keeps activations O(1) and logits peaked enough that
 * greedy decoding is not decided by rounding noise (docs/MODELS.md lists the tensors). */
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_mixer.h"
#include "hyla_model.h"
#include "hyla_safetensors.h"
#include "hyla_util.h"

typedef struct {
    const char *arch;
    int layers, hidden, heads, vocab, kv_heads, window, partitions, topk, head_dim, intermediate;
    uint64_t seed;
    hyla_dtype dtype;
    const char *out;
    int short_conv; /* -1: arch default */
    /* LTE */
    int sink, budget; /* -1 / 0: the mixer's default */
    /* NSA */
    int nsa_block, nsa_counts; /* 0: the mixer's default */
    /* DLA */
    int dla_capacity;     /* 0: the mixer's default */
    double dla_threshold; /* < 0: the mixer's default */
    int prefill_window;   /* SSE; 0: the mixer's default */
} opts;

typedef struct {
    hyla_st_entry *e;
    int n, cap;
    hyla_rng rng;
    hyla_dtype dtype;
} tensors;

static void usage(FILE *f) {
    fprintf(f,
            "usage: hyla-mkmodel --arch ARCH --layers L --hidden D --heads H [options] --out DIR\n"
            "Writes DIR/config.json and DIR/model.safetensors with deterministic random weights.\n"
            "  --arch ARCH        gla | gdn | transformer | sse | sse-gdn | sse-h | gla-h | gdn-h |\n"
            "                     statex-gla | lalte | lansa | nsa | mamba2 | mamba2-h |\n"
            "                     statex-mamba2 | dla-gdn | dla-mamba2\n"
            "                     (-h: softmax attention at every 6th layer, i %% 6 == 5; with fewer\n"
            "                     than 6 layers, at layer L/2; statex-: StateX's expanded states at\n"
            "                     4 layers, one every L/4 from the first: GLA heads merged into one,\n"
            "                     Mamba2 state_size 128 -> 512; lalte / lansa: GDN with LTE / NSA\n"
            "                     attention at every odd layer, 1:1; nsa: native sparse attention at\n"
            "                     every layer;\n"
            "                     dla-gdn / dla-mamba2: dynamic linear attention over gated\n"
            "                     DeltaNet / Mamba2)\n"
            "  --layers L         number of layers\n"
            "  --hidden D         model width\n"
            "  --heads H          heads of the linear mixer and of attention\n"
            "  --vocab V          vocabulary size (default 260: byte-level tokenizer + 4 specials)\n"
            "  --seed S           weight seed (default 0)\n"
            "  --dtype T          f32 | bf16 | f16 (default f32)\n"
            "  --kv-heads K       attention KV heads (default: H/2 when H is even, else H)\n"
            "  --window W         attention sliding window in tokens (default: full attention;\n"
            "                     lte: 768; nsa: 512)\n"
            "  --sink S           lte: attention sink tokens (default 4)\n"
            "  --budget B         lte: retained out-of-window tokens per KV head (default 512)\n"
            "  --block-size N     nsa: tokens per block (default 64)\n"
            "  --block-counts N   nsa: blocks selected per query (default 16)\n"
            "  --dla-capacity K   dla: states per head (default 30)\n"
            "  --dla-threshold T  dla: information score that opens a new state (default 0.6)\n"
            "  --head-dim K       key head dim of gdn/sse/nsa (default D/H)\n"
            "  --partitions N     SSE partitions (default 4)\n"
            "  --topk K           SSE partitions selected per token (default 1; sse-gdn: 2)\n"
            "  --prefill-window W SSE: prefill_window, the windows (tokens) that cut a partition's prefill\n"
            "                     chunks; a power of two from 64 (default: the key left out, 256)\n"
            "  --intermediate F   MLP width (default 2*D)\n"
            "  --short-conv 0|1   short convolution in gla/gdn layers (default: gla 0, gdn 1)\n"
            "  --out DIR          output directory (created)\n");
}

static float *add_tensor(tensors *t, const char *name, int ndim, int64_t d0, int64_t d1, int64_t d2) {
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 64;
        t->e = realloc(t->e, (size_t)t->cap * sizeof *t->e);
        HYLA_ASSERT(t->e);
    }
    hyla_st_entry *e = &t->e[t->n++];
    memset(e, 0, sizeof *e);
    e->name = strdup(name);
    e->ndim = ndim;
    e->shape[0] = d0;
    e->shape[1] = d1;
    e->shape[2] = d2;
    size_t n = (size_t)d0 * (size_t)(ndim > 1 ? d1 : 1) * (size_t)(ndim > 2 ? d2 : 1);
    e->dtype = HYLA_DT_F32;
    float *data = malloc(n * sizeof(float));
    HYLA_ASSERT(data);
    e->data = data;
    return data;
}

static size_t numel(const hyla_st_entry *e) {
    size_t n = 1;
    for (int i = 0; i < e->ndim; i++) n *= (size_t)e->shape[i];
    return n;
}

/* W [out][in] ~ U(-a, a), a = gain * sqrt(3 / in): unit-variance outputs for unit inputs. */
static void matrix(tensors *t, const char *name, int out, int in, float gain) {
    float *w = add_tensor(t, name, 2, out, in, 0);
    float a = gain * sqrtf(3.0f / (float)in);
    for (size_t i = 0; i < (size_t)out * in; i++) w[i] = a * (2 * hyla_rng_uniform(&t->rng) - 1);
}
static void vector(tensors *t, const char *name, int n, float base, float spread) {
    float *w = add_tensor(t, name, 1, n, 0, 0);
    for (int i = 0; i < n; i++) w[i] = base + spread * (2 * hyla_rng_uniform(&t->rng) - 1);
}

/* the layout's names are formats taking the layer index */
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
#define NM(...) (snprintf(nm, sizeof nm, __VA_ARGS__), nm)

/* One tensor a mixer declares (hyla_mixer.h), drawn by its init kind. */
static void declared(tensors *t, const hyla_tensor_decl *d) {
    if (d->init == HYLA_INIT_MATRIX) {
        matrix(t, d->name[0], (int)d->shape[0], (int)d->shape[1], d->p0);
        return;
    }
    if (d->init == HYLA_INIT_VECTOR && d->ndim == 1) {
        vector(t, d->name[0], (int)d->shape[0], d->p0, d->p1);
        return;
    }
    float *w = add_tensor(t, d->name[0], d->ndim, d->shape[0], d->shape[1], d->shape[2]);
    size_t n = numel(&t->e[t->n - 1]);
    int K = d->ndim == 3 ? (int)d->shape[2] : 1;
    for (size_t i = 0; i < n; i++) {
        float u = hyla_rng_uniform(&t->rng);
        switch (d->init) {
        case HYLA_INIT_VECTOR: w[i] = d->p0 + d->p1 * (2 * u - 1); break;
        case HYLA_INIT_CONV: w[i] = 0.5f * (2 * u - 1) + ((int)(i % (size_t)K) == K - 1 ? 0.5f : 0); break;
        case HYLA_INIT_A_LOG: w[i] = logf(1.0f + 15.0f * u); break; /* A = U(1, 16) */
        case HYLA_INIT_DT_BIAS: {
            /* dt log-uniform in [0.001, 0.1], stored as softplus^-1(dt) (FLA's init) */
            float dt = expf(logf(0.001f) + u * (logf(0.1f) - logf(0.001f)));
            w[i] = dt + logf(-expm1f(-dt));
            break;
        }
        default: HYLA_ASSERT(!"unknown init kind");
        }
    }
}

/* The architectures: a base mixer kind (and its variant), optionally with "-h": softmax attention
 * layers from an `attn` spec at every 6th layer (i % 6 == 5), or at L/2 with fewer than 6. */
typedef struct {
    const char *arch, *mixer, *variant;
    const char *statex; /* StateX: base keys overridden at 4 expanded layers (JSON object), or NULL */
    const char *sparse; /* a spec kind placed at every odd layer (1:1 interleaving), or NULL */
} mk_arch;
static const mk_arch ARCHS[] = {
    {"gla", "gla", NULL, NULL, NULL},
    {"gdn", "gdn", NULL, NULL, NULL},
    {"transformer", "attn", NULL, NULL, NULL},
    {"sse", "sse", NULL, NULL, NULL},
    {"sse-gdn", "sse", "gdn", NULL, NULL},
    /* StateX (statex-post-training-state-expansion.txt §4.1, §4.4): all heads of a GLA layer
     * merged into one, at one layer of every L/4 from the first */
    {"statex-gla", "gla", NULL, "{\"num_heads\": 1}", NULL},
    /* laLTE (lte-hybrid-sparse-attention-token-eviction.txt §3.2): GDN and LTE layers 1:1 */
    {"lalte", "gdn", NULL, NULL, "lte"},
    /* laNSA (same paper, §3.2) and an all-NSA model (flash-linear-attention's model_type "nsa") */
    {"lansa", "gdn", NULL, NULL, "nsa"},
    {"nsa", "nsa", NULL, NULL, NULL},
    /* Mamba2 (SSD); StateX for Mamba2: state_size 128 -> 512 at the expanded layers */
    {"mamba2", "mamba2", NULL, NULL, NULL},
    {"statex-mamba2", "mamba2", NULL, "{\"state_size\": 512}", NULL},
    /* dynamic linear attention (dla-dynamic-linear-attention.txt) over gated DeltaNet and Mamba2 */
    {"dla-gdn", "dla-gdn", NULL, NULL, NULL},
    {"dla-mamba2", "dla-mamba2", NULL, NULL, NULL},
};

static int write_config(const opts *o, const hyla_mixer *base, const mk_arch *a, int hybrid, int F) {
    int D = o->hidden, H = o->heads, L = o->layers;
    json_t *cfg = json_object();
    json_object_set_new(cfg, "model_type", json_string(base->model_type));
    json_object_set_new(cfg, "vocab_size", json_integer(o->vocab));
    json_object_set_new(cfg, "hidden_size", json_integer(D));
    json_object_set_new(cfg, "num_hidden_layers", json_integer(L));
    json_object_set_new(cfg, "num_heads", json_integer(H));
    json_object_set_new(cfg, "intermediate_size", json_integer(F));
    json_object_set_new(cfg, "hidden_act", json_string("swish"));
    json_object_set_new(cfg, "norm_eps", json_real(1e-6));
    json_object_set_new(cfg, "tie_word_embeddings", json_false());
    json_object_set_new(cfg, "bos_token_id", json_integer(256));
    json_object_set_new(cfg, "eos_token_id", json_integer(257));
    hyla_mk_args ma = {D, H, o->kv_heads, o->window, o->partitions, o->topk, o->head_dim, o->short_conv, a->variant, 0,
                       o->sink, o->budget, o->nsa_block, o->nsa_counts, o->dla_capacity, o->dla_threshold,
                       o->prefill_window};
    const char *why = base->mk_config(cfg, &ma);
    if (!why && a->statex) {
        json_t *spec = json_loads(a->statex, 0, NULL), *layers = json_array();
        HYLA_ASSERT(spec);
        int m = L / 4 > 0 ? L / 4 : 1;
        for (int i = 0, n = 0; i < L && n < 4; i += m, n++) json_array_append_new(layers, json_integer(i));
        json_object_set_new(spec, "layers", layers);
        json_object_set_new(cfg, "statex", spec);
    }
    if (!why && a->sparse) {
        const hyla_mixer *sp = hyla_mixer_find(a->sparse);
        json_t *spec = json_object(), *layers = json_array();
        for (int i = 1; i < L; i += 2) json_array_append_new(layers, json_integer(i));
        json_object_set_new(spec, "layers", layers);
        hyla_mk_args sa = ma;
        sa.variant = NULL;
        sa.spec = 1;
        sa.head_dim = 0;
        why = sp->mk_config(spec, &sa);
        json_object_set_new(cfg, sp->spec_key, spec);
    }
    if (!why && hybrid) {
        const hyla_mixer *attn = hyla_mixer_find("attn");
        json_t *spec = json_object(), *layers = json_array();
        int n = 0;
        for (int i = 0; i < L; i++)
            if (i % 6 == 5) json_array_append_new(layers, json_integer(i)), n++;
        if (!n) json_array_append_new(layers, json_integer(L / 2));
        json_object_set_new(spec, "layers", layers);
        ma.variant = NULL;
        ma.spec = 1;
        why = attn->mk_config(spec, &ma);
        json_object_set_new(cfg, attn->spec_key, spec);
    }
    if (why) {
        fprintf(stderr, "hyla-mkmodel: %s\n", why);
        json_decref(cfg);
        return 2;
    }
    hyla_status st = hyla_mkdirs(o->out);
    if (st != HYLA_OK) {
        fprintf(stderr, "hyla-mkmodel: %s\n", hyla_last_error());
        json_decref(cfg);
        return 1;
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", o->out);
    char *txt = json_dumps(cfg, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(cfg);
    size_t tl = strlen(txt);
    txt = realloc(txt, tl + 2);
    txt[tl] = '\n';
    txt[tl + 1] = 0;
    st = hyla_write_file_atomic(path, txt, tl + 1);
    free(txt);
    if (st != HYLA_OK) {
        fprintf(stderr, "hyla-mkmodel: %s\n", hyla_last_error());
        return 1;
    }
    return 0;
}

static int mk(const opts *o) {
    int D = o->hidden, H = o->heads, L = o->layers, V = o->vocab;
    int F = o->intermediate > 0 ? o->intermediate : 2 * D;
    size_t al = strlen(o->arch);
    int hybrid = al > 2 && !strcmp(o->arch + al - 2, "-h");
    const mk_arch *a = NULL;
    for (size_t i = 0; i < sizeof ARCHS / sizeof ARCHS[0]; i++)
        if (strlen(ARCHS[i].arch) == al - (hybrid ? 2 : 0) && !strncmp(ARCHS[i].arch, o->arch, al - (hybrid ? 2 : 0)))
            a = &ARCHS[i];
    const hyla_mixer *base = a ? hyla_mixer_find(a->mixer) : NULL;
    if (!base) {
        fprintf(stderr, "hyla-mkmodel: unknown --arch '%s'\n", o->arch);
        return 2;
    }
    if (hybrid && (!strcmp(base->name, "attn") || !strcmp(base->name, "nsa") || a->sparse)) {
        fprintf(stderr, "hyla-mkmodel: --arch %s has no -h variant\n", a->arch);
        return 2;
    }
    int kvh = o->kv_heads > 0 ? o->kv_heads : (H % 2 == 0 ? H / 2 : H);
    if (D % H || H % kvh) {
        fprintf(stderr, "hyla-mkmodel: --hidden %d must be divisible by --heads %d, and heads by kv heads %d\n", D, H, kvh);
        return 2;
    }
    if (L < 1 || L > HYLA_MAX_LAYERS) {
        fprintf(stderr, "hyla-mkmodel: --layers must be in 1..%d\n", HYLA_MAX_LAYERS);
        return 2;
    }
    int rc = write_config(o, base, a, hybrid, F);
    if (rc) return rc;
    /* the layers' tensors come from the mixers' declarations of the config just written */
    hyla_model_config mc;
    hyla_status st = hyla_model_config_load(o->out, &mc);
    if (st != HYLA_OK) {
        fprintf(stderr, "hyla-mkmodel: %s\n", hyla_last_error());
        return 1;
    }

    /* ---- weights (fixed order) ---- */
    tensors t = {0};
    hyla_rng_seed(&t.rng, o->seed);
    char nm[320];
    const hyla_layout *lay = mc.layout;
    {
        float *E = add_tensor(&t, lay->embed, 2, V, D, 0);
        for (size_t i = 0; i < (size_t)V * D; i++) E[i] = hyla_rng_normal(&t.rng);
    }
    hyla_tensor_decl *decls = malloc(HYLA_MIXER_MAX_TENSORS * sizeof *decls);
    HYLA_ASSERT(decls);
    for (int i = 0; i < L; i++) {
        vector(&t, NM(lay->layer_norm, i), D, 1.0f, 0.1f);
        int nd = mc.mixer[i]->tensors(&mc, mc.mixer_cfg[i], i, decls);
        for (int k = 0; k < nd; k++) declared(&t, &decls[k]);
        if (!lay->mlp_norm) continue; /* mixer-only layers */
        char pre[160];
        snprintf(pre, sizeof pre, lay->mlp, i);
        vector(&t, NM(lay->mlp_norm, i), D, 1.0f, 0.1f);
        matrix(&t, NM("%sgate_proj.weight", pre), F, D, 1.0f);
        matrix(&t, NM("%sup_proj.weight", pre), F, D, 1.0f);
        matrix(&t, NM("%sdown_proj.weight", pre), D, F, 0.5f);
    }
    free(decls);
    vector(&t, lay->final_norm, D, 1.0f, 0.1f);
    matrix(&t, lay->lm_head, V, D, 4.0f); /* logits std ~4: peaked distributions */
    hyla_model_config_free(&mc);

    /* convert to the requested dtype */
    for (int i = 0; i < t.n; i++) {
        if (o->dtype == HYLA_DT_F32) continue;
        size_t n = numel(&t.e[i]);
        void *c = malloc(n * 2);
        HYLA_ASSERT(c);
        hyla_from_f32(c, o->dtype, t.e[i].data, n);
        free((void *)t.e[i].data);
        t.e[i].data = c;
        t.e[i].dtype = o->dtype;
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", o->out);
    st = hyla_st_write(path, t.e, t.n);
    uint64_t params = 0;
    for (int i = 0; i < t.n; i++) {
        params += numel(&t.e[i]);
        free((void *)t.e[i].name);
        free((void *)t.e[i].data);
    }
    free(t.e);
    if (st != HYLA_OK) {
        fprintf(stderr, "hyla-mkmodel: %s\n", hyla_last_error());
        return 1;
    }
    fprintf(stderr, "hyla-mkmodel: wrote %s (%s, %d layers, hidden %d, %.2fM parameters)\n", o->out, o->arch, L, D,
            params / 1e6);
    return 0;
}


/* The whole number text of option name in [lo, hi]; exits 2 naming both when it is not one. */
static long long mk_int(const char *name, const char *text, long long lo, long long hi) {
    long long v;
    if (!hyla_parse_int(text, lo, hi, &v)) {
        fprintf(stderr, "hyla-mkmodel: --%s must be a whole number from %lld to %lld, got '%s'\n", name, lo, hi, text);
        exit(2);
    }
    return v;
}

int main(int argc, char **argv) {
    opts o = {0};
    o.vocab = 260;
    o.dtype = HYLA_DT_F32;
    o.short_conv = -1;
    o.sink = -1;
    o.dla_threshold = -1;
    static struct option lo[] = {{"arch", 1, 0, 'a'},     {"layers", 1, 0, 'l'},     {"hidden", 1, 0, 'd'},
                                 {"heads", 1, 0, 'H'},    {"vocab", 1, 0, 'v'},      {"seed", 1, 0, 's'},
                                 {"dtype", 1, 0, 't'},    {"kv-heads", 1, 0, 'k'},   {"window", 1, 0, 'w'},
                                 {"head-dim", 1, 0, 'K'}, {"partitions", 1, 0, 'n'}, {"topk", 1, 0, 'p'},
                                 {"intermediate", 1, 0, 'f'}, {"short-conv", 1, 0, 'c'}, {"out", 1, 0, 'o'},
                                 {"sink", 1, 0, 'S'},     {"budget", 1, 0, 'B'},
                                 {"block-size", 1, 0, 'z'}, {"block-counts", 1, 0, 'N'},
                                 {"dla-capacity", 1, 0, 'D'}, {"dla-threshold", 1, 0, 'T'},
                                 {"prefill-window", 1, 0, 'W'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case 'a': o.arch = optarg; break;
        case 'l': o.layers = (int)mk_int("layers", optarg, 1, 100000); break;
        case 'd': o.hidden = (int)mk_int("hidden", optarg, 1, 1 << 20); break;
        case 'H': o.heads = (int)mk_int("heads", optarg, 1, 1 << 16); break;
        case 'v': o.vocab = (int)mk_int("vocab", optarg, 2, 1 << 24); break;
        case 's': o.seed = (uint64_t)mk_int("seed", optarg, 0, INT64_MAX); break;
        case 't':
            if (!strcmp(optarg, "f32")) o.dtype = HYLA_DT_F32;
            else if (!strcmp(optarg, "bf16")) o.dtype = HYLA_DT_BF16;
            else if (!strcmp(optarg, "f16")) o.dtype = HYLA_DT_F16;
            else {
                fprintf(stderr, "hyla-mkmodel: --dtype must be f32, bf16 or f16\n");
                return 2;
            }
            break;
        case 'k': o.kv_heads = (int)mk_int("kv-heads", optarg, 1, 1 << 16); break;
        case 'w': o.window = (int)mk_int("window", optarg, 0, INT32_MAX); break;
        case 'K': o.head_dim = (int)mk_int("head-dim", optarg, 1, 1 << 16); break;
        case 'n': o.partitions = (int)mk_int("partitions", optarg, 1, 1 << 16); break;
        case 'p': o.topk = (int)mk_int("topk", optarg, 1, 1 << 16); break;
        case 'f': o.intermediate = (int)mk_int("intermediate", optarg, 1, 1 << 24); break;
        case 'c': o.short_conv = (int)mk_int("short-conv", optarg, 0, 1); break;
        case 'o': o.out = optarg; break;
        case 'S': o.sink = (int)mk_int("sink", optarg, 0, INT32_MAX); break;
        case 'B': o.budget = (int)mk_int("budget", optarg, 1, INT32_MAX); break;
        case 'z': o.nsa_block = (int)mk_int("block-size", optarg, 1, 1 << 16); break;
        case 'N': o.nsa_counts = (int)mk_int("block-counts", optarg, 1, 1 << 16); break;
        case 'D': o.dla_capacity = (int)mk_int("dla-capacity", optarg, 1, INT32_MAX); break;
        case 'W': o.prefill_window = (int)mk_int("prefill-window", optarg, 1, INT32_MAX); break;
        case 'T': {
            double v;
            if (!hyla_parse_num(optarg, 0, 1e30, &v)) {
                fprintf(stderr, "hyla-mkmodel: --dla-threshold must be a number >= 0, got '%s'\n", optarg);
                return 2;
            }
            o.dla_threshold = v;
            break;
        }
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "hyla-mkmodel: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    if (!o.arch || o.layers <= 0 || o.hidden <= 0 || o.heads <= 0 || !o.out) {
        fprintf(stderr, "hyla-mkmodel: --arch, --layers, --hidden, --heads and --out are required\n");
        usage(stderr);
        return 2;
    }
    if (o.vocab < 2) {
        fprintf(stderr, "hyla-mkmodel: --vocab must be at least 2\n");
        return 2;
    }
    if (o.prefill_window && strncmp(o.arch, "sse", 3)) {
        fprintf(stderr, "hyla-mkmodel: --prefill-window is an SSE key; arch %s has no SSE layers\n", o.arch);
        return 2;
    }
    return mk(&o);
}
