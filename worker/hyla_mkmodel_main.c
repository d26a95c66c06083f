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
            "  --arch ARCH        gla | gdn | transformer | sse | sse-gdn | sse-h | gla-h | gdn-h\n"
            "                     (-h: softmax attention at every 6th layer, i %% 6 == 5; with fewer\n"
            "                     than 6 layers, at layer L/2)\n"
            "  --layers L         number of layers\n"
            "  --hidden D         model width\n"
            "  --heads H          heads of the linear mixer and of attention\n"
            "  --vocab V          vocabulary size (default 260: byte-level tokenizer + 4 specials)\n"
            "  --seed S           weight seed (default 0)\n"
            "  --dtype T          f32 | bf16 | f16 (default f32)\n"
            "  --kv-heads K       attention KV heads (default: H/2 when H is even, else H)\n"
            "  --window W         attention sliding window in tokens (default: full attention)\n"
            "  --head-dim K       key head dim of gdn/sse (default D/H)\n"
            "  --partitions N     SSE partitions (default 4)\n"
            "  --topk K           SSE partitions selected per token (default 1; sse-gdn: 2)\n"
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

#define NM(...) (snprintf(nm, sizeof nm, __VA_ARGS__), nm)

static void gate_lowrank(tensors *t, const char *prefix, int r, int D, int out) {
    char nm[256];
    matrix(t, NM("%s.0.weight", prefix), r, D, 1.0f);
    matrix(t, NM("%s.1.weight", prefix), out, r, 1.0f);
    /* bias ~ +2: sigmoid ~ 0.88 -> per-token log-decay ~ -0.13/16: slow decay, long memory */
    vector(t, NM("%s.1.bias", prefix), out, 2.0f, 1.0f);
}

static void gdn_decay(tensors *t, const char *prefix, int n) {
    char nm[256];
    /* A_log = log(U(1, 16)); dt_bias = softplus^-1(dt), dt log-uniform in [0.001, 0.1] (FLA's init) */
    float *A = add_tensor(t, NM("%s.A_log", prefix), 1, n, 0, 0);
    for (int i = 0; i < n; i++) A[i] = logf(1.0f + 15.0f * hyla_rng_uniform(&t->rng));
    float *dt = add_tensor(t, NM("%s.dt_bias", prefix), 1, n, 0, 0);
    for (int i = 0; i < n; i++) {
        float u = hyla_rng_uniform(&t->rng);
        float d = expf(logf(0.001f) + u * (logf(0.1f) - logf(0.001f)));
        dt[i] = d + logf(-expm1f(-d));
    }
}

static int mk(const opts *o) {
    int D = o->hidden, H = o->heads, L = o->layers, V = o->vocab;
    int F = o->intermediate > 0 ? o->intermediate : 2 * D;
    int hybrid = strlen(o->arch) > 2 && !strcmp(o->arch + strlen(o->arch) - 2, "-h");
    char base[32];
    snprintf(base, sizeof base, "%.*s", (int)strlen(o->arch) - (hybrid ? 2 : 0), o->arch);
    int is_sse_gdn = !strcmp(base, "sse-gdn");
    if (is_sse_gdn) snprintf(base, sizeof base, "sse");
    if (strcmp(base, "gla") && strcmp(base, "gdn") && strcmp(base, "transformer") && strcmp(base, "sse")) {
        fprintf(stderr, "hyla-mkmodel: unknown --arch '%s'\n", o->arch);
        return 2;
    }
    if (!strcmp(base, "transformer") && hybrid) {
        fprintf(stderr, "hyla-mkmodel: --arch transformer has no -h variant\n");
        return 2;
    }
    int kvh = o->kv_heads > 0 ? o->kv_heads : (H % 2 == 0 ? H / 2 : H);
    if (D % H || H % kvh) {
        fprintf(stderr, "hyla-mkmodel: --hidden %d must be divisible by --heads %d, and heads by kv heads %d\n", D, H, kvh);
        return 2;
    }
    int attn_layer[HYLA_MAX_LAYERS] = {0};
    int n_attn = 0;
    if (!strcmp(base, "transformer")) {
        for (int i = 0; i < L; i++) attn_layer[i] = 1;
    } else if (hybrid) {
        for (int i = 0; i < L; i++)
            if (i % 6 == 5) attn_layer[i] = 1, n_attn++;
        if (!n_attn) attn_layer[L / 2] = 1, n_attn = 1;
    }
    if (L < 1 || L > HYLA_MAX_LAYERS) {
        fprintf(stderr, "hyla-mkmodel: --layers must be in 1..%d\n", HYLA_MAX_LAYERS);
        return 2;
    }

    /* ---- config.json ---- */
    json_t *cfg = json_object();
    const char *mt = !strcmp(base, "gla") ? "gla" : !strcmp(base, "gdn") ? "gated_deltanet" : !strcmp(base, "sse") ? "sse" : "transformer";
    json_object_set_new(cfg, "model_type", json_string(mt));
    json_object_set_new(cfg, "vocab_size", json_integer(V));
    json_object_set_new(cfg, "hidden_size", json_integer(D));
    json_object_set_new(cfg, "num_hidden_layers", json_integer(L));
    json_object_set_new(cfg, "num_heads", json_integer(H));
    json_object_set_new(cfg, "intermediate_size", json_integer(F));
    json_object_set_new(cfg, "hidden_act", json_string("swish"));
    json_object_set_new(cfg, "norm_eps", json_real(1e-6));
    json_object_set_new(cfg, "tie_word_embeddings", json_false());
    json_object_set_new(cfg, "bos_token_id", json_integer(256));
    json_object_set_new(cfg, "eos_token_id", json_integer(257));
    int dk = 0, dv = 0, conv = 0, N = o->partitions > 0 ? o->partitions : 4;
    int K = o->topk > 0 ? o->topk : (is_sse_gdn ? 2 : 1);
    int r = 16;
    if (!strcmp(base, "gla")) {
        dk = D / 2 / H;
        dv = D / H;
        conv = o->short_conv >= 0 ? o->short_conv : 0;
        if ((D / 2) % H) {
            fprintf(stderr, "hyla-mkmodel: gla needs hidden/2 divisible by heads\n");
            return 2;
        }
        json_object_set_new(cfg, "expand_k", json_real(0.5));
        json_object_set_new(cfg, "expand_v", json_real(1.0));
        json_object_set_new(cfg, "use_output_gate", json_true());
        json_object_set_new(cfg, "gate_low_rank_dim", json_integer(r));
        json_object_set_new(cfg, "gate_logit_normalizer", json_integer(16));
        json_object_set_new(cfg, "use_short_conv", json_boolean(conv));
        json_object_set_new(cfg, "conv_size", json_integer(4));
    } else if (!strcmp(base, "gdn") || !strcmp(base, "sse")) {
        dk = o->head_dim > 0 ? o->head_dim : D / H;
        int gdn = !strcmp(base, "gdn");
        dv = gdn ? 2 * dk : dk;
        json_object_set_new(cfg, "head_dim", json_integer(dk));
        json_object_set_new(cfg, "expand_v", json_real(gdn ? 2.0 : 1.0));
        if (gdn) {
            conv = o->short_conv >= 0 ? o->short_conv : 1;
            json_object_set_new(cfg, "use_gate", json_true());
            json_object_set_new(cfg, "use_short_conv", json_boolean(conv));
            json_object_set_new(cfg, "conv_size", json_integer(4));
        } else {
            json_object_set_new(cfg, "use_output_gate", json_true());
            json_object_set_new(cfg, "use_short_conv", json_false());
            json_object_set_new(cfg, "num_sparse_partition", json_integer(N));
            json_object_set_new(cfg, "num_writer", json_integer(K));
            json_object_set_new(cfg, "num_reader", json_integer(K));
            json_object_set_new(cfg, "sse_transition", json_string(is_sse_gdn ? "gdn" : "gla"));
            json_object_set_new(cfg, "gate_low_rank_dim", json_integer(r));
            json_object_set_new(cfg, "gate_logit_normalizer", json_integer(16));
            json_object_set_new(cfg, "lora_rank", json_integer(dv));
            json_object_set_new(cfg, "lora_target", json_string("always"));
            json_object_set_new(cfg, "use_q_softmax", json_false());
            json_object_set_new(cfg, "use_k_softmax", json_true());
        }
    } else {
        json_object_set_new(cfg, "num_kv_heads", json_integer(kvh));
        json_object_set_new(cfg, "rope_theta", json_real(10000.0));
        if (o->window > 0) json_object_set_new(cfg, "window_size", json_integer(o->window));
        json_object_set_new(cfg, "qkv_bias", json_false());
    }
    if (hybrid) {
        json_t *spec = json_object(), *layers = json_array();
        for (int i = 0; i < L; i++)
            if (attn_layer[i]) json_array_append_new(layers, json_integer(i));
        json_object_set_new(spec, "layers", layers);
        json_object_set_new(spec, "num_heads", json_integer(H));
        json_object_set_new(spec, "num_kv_heads", json_integer(kvh));
        json_object_set_new(spec, "window_size", o->window > 0 ? json_integer(o->window) : json_null());
        json_object_set_new(spec, "rope_theta", json_real(10000.0));
        json_object_set_new(spec, "qkv_bias", json_false());
        json_object_set_new(cfg, "attn", spec);
    }

    hyla_status st = hyla_mkdirs(o->out);
    if (st != HYLA_OK) {
        fprintf(stderr, "hyla-mkmodel: %s\n", hyla_last_error());
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

    /* ---- weights (fixed order) ---- */
    tensors t = {0};
    hyla_rng_seed(&t.rng, o->seed);
    char nm[320];
    {
        float *E = add_tensor(&t, "model.embeddings.weight", 2, V, D, 0);
        for (size_t i = 0; i < (size_t)V * D; i++) E[i] = hyla_rng_normal(&t.rng);
    }
    int hd = D / H;
    for (int i = 0; i < L; i++) {
        vector(&t, NM("model.layers.%d.attn_norm.weight", i), D, 1.0f, 0.1f);

        char pre[64];
        snprintf(pre, sizeof pre, "model.layers.%d.attn", i);
        if (attn_layer[i]) {
            matrix(&t, NM("%s.q_proj.weight", pre), H * hd, D, 1.0f);
            matrix(&t, NM("%s.k_proj.weight", pre), kvh * hd, D, 1.0f);
            matrix(&t, NM("%s.v_proj.weight", pre), kvh * hd, D, 1.0f);
            matrix(&t, NM("%s.o_proj.weight", pre), D, H * hd, 0.5f);
        } else {
            matrix(&t, NM("%s.q_proj.weight", pre), H * dk, D, 1.0f);
            matrix(&t, NM("%s.k_proj.weight", pre), H * dk, D, 1.0f);
            matrix(&t, NM("%s.v_proj.weight", pre), H * dv, D, 1.0f);
            if (conv) {
                const char *cn[3] = {"q_conv1d", "k_conv1d", "v_conv1d"};
                int ch[3] = {H * dk, H * dk, H * dv};
                for (int j = 0; j < 3; j++) {
                    float *w = add_tensor(&t, NM("%s.%s.weight", pre, cn[j]), 3, ch[j], 1, 4);
                    for (int c = 0; c < ch[j] * 4; c++) w[c] = 0.5f * (2 * hyla_rng_uniform(&t.rng) - 1) + (c % 4 == 3 ? 0.5f : 0);
                }
            }
            if (!strcmp(base, "gla")) {
                gate_lowrank(&t, NM("%s.gk_proj", pre), r, D, H * dk);
                matrix(&t, NM("%s.g_proj.weight", pre), H * dv, D, 1.0f);
                vector(&t, NM("%s.g_norm_swish_gate.weight", pre), dv, 1.0f, 0.1f);
            } else if (!strcmp(base, "gdn")) {
                matrix(&t, NM("%s.a_proj.weight", pre), H, D, 1.0f);
                matrix(&t, NM("%s.b_proj.weight", pre), H, D, 1.0f);
                gdn_decay(&t, pre, H);
                matrix(&t, NM("%s.g_proj.weight", pre), H * dv, D, 1.0f);
                vector(&t, NM("%s.o_norm.weight", pre), dv, 1.0f, 0.1f);
            } else { /* sse */
                matrix(&t, NM("%s.lora_q_proj.0.weight", pre), dv, D, 1.0f);
                matrix(&t, NM("%s.lora_q_proj.1.weight", pre), H * dk, dv, 0.3f);
                matrix(&t, NM("%s.lora_k_proj.0.weight", pre), dv, D, 1.0f);
                matrix(&t, NM("%s.lora_k_proj.1.weight", pre), H * dk, dv, 0.3f);
                matrix(&t, NM("%s.e_proj.weight", pre), N, D, 2.0f);
                if (is_sse_gdn) {
                    matrix(&t, NM("%s.a_proj.weight", pre), 2 * H, D, 1.0f);
                    matrix(&t, NM("%s.b_proj.weight", pre), 2 * H, D, 1.0f);
                    gdn_decay(&t, pre, 2 * H);
                } else {
                    gate_lowrank(&t, NM("%s.gk_proj.0", pre), r, D, H * dk);
                    gate_lowrank(&t, NM("%s.gk_proj.1", pre), r, D, H * dk);
                }
                matrix(&t, NM("%s.g_proj.0.weight", pre), dv, D, 1.0f);
                matrix(&t, NM("%s.g_proj.1.weight", pre), H * dv, dv, 1.0f);
                vector(&t, NM("%s.o_norm.weight", pre), dv, 1.0f, 0.1f);
            }
            matrix(&t, NM("%s.o_proj.weight", pre), D, H * dv, 0.5f);
        }
        vector(&t, NM("model.layers.%d.mlp_norm.weight", i), D, 1.0f, 0.1f);
        matrix(&t, NM("model.layers.%d.mlp.gate_proj.weight", i), F, D, 1.0f);
        matrix(&t, NM("model.layers.%d.mlp.up_proj.weight", i), F, D, 1.0f);
        matrix(&t, NM("model.layers.%d.mlp.down_proj.weight", i), D, F, 0.5f);
    }
    vector(&t, "model.norm.weight", D, 1.0f, 0.1f);
    matrix(&t, "lm_head.weight", V, D, 4.0f); /* logits std ~4: peaked distributions */

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

int main(int argc, char **argv) {
    opts o = {0};
    o.vocab = 260;
    o.dtype = HYLA_DT_F32;
    o.short_conv = -1;
    static struct option lo[] = {{"arch", 1, 0, 'a'},     {"layers", 1, 0, 'l'},     {"hidden", 1, 0, 'd'},
                                 {"heads", 1, 0, 'H'},    {"vocab", 1, 0, 'v'},      {"seed", 1, 0, 's'},
                                 {"dtype", 1, 0, 't'},    {"kv-heads", 1, 0, 'k'},   {"window", 1, 0, 'w'},
                                 {"head-dim", 1, 0, 'K'}, {"partitions", 1, 0, 'n'}, {"topk", 1, 0, 'p'},
                                 {"intermediate", 1, 0, 'f'}, {"short-conv", 1, 0, 'c'}, {"out", 1, 0, 'o'},
                                 {"help", 0, 0, 'h'},     {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case 'a': o.arch = optarg; break;
        case 'l': o.layers = atoi(optarg); break;
        case 'd': o.hidden = atoi(optarg); break;
        case 'H': o.heads = atoi(optarg); break;
        case 'v': o.vocab = atoi(optarg); break;
        case 's': o.seed = strtoull(optarg, NULL, 10); break;
        case 't':
            if (!strcmp(optarg, "f32")) o.dtype = HYLA_DT_F32;
            else if (!strcmp(optarg, "bf16")) o.dtype = HYLA_DT_BF16;
            else if (!strcmp(optarg, "f16")) o.dtype = HYLA_DT_F16;
            else {
                fprintf(stderr, "hyla-mkmodel: --dtype must be f32, bf16 or f16\n");
                return 2;
            }
            break;
        case 'k': o.kv_heads = atoi(optarg); break;
        case 'w': o.window = atoi(optarg); break;
        case 'K': o.head_dim = atoi(optarg); break;
        case 'n': o.partitions = atoi(optarg); break;
        case 'p': o.topk = atoi(optarg); break;
        case 'f': o.intermediate = atoi(optarg); break;
        case 'c': o.short_conv = atoi(optarg) != 0; break;
        case 'o': o.out = optarg; break;
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
    return mk(&o);
}
