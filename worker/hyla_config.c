/* hyla_config.c — config.json -> hyla_model_config (docs/MODELS.md §2, §4, §5).
 * Applies the flash-linear-attention defaults, derives head sizes, decides each layer's mixer
 * kind, and refuses keys whose non-default values we do not implement, naming the key. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "hyla_model.h"

const char *hyla_mixer_name(hyla_mixer_kind k) {
    switch (k) {
    case HYLA_MIXER_GLA: return "gla";
    case HYLA_MIXER_GDN: return "gdn";
    case HYLA_MIXER_SSE: return "sse";
    case HYLA_MIXER_ATTN: return "attn";
    }
    return "?";
}

typedef struct {
    const char *path;
    json_t *root;
    hyla_status st;
} cfg_reader;

/* Integer key with default; errors when present with the wrong type. */
static int get_int(cfg_reader *r, json_t *obj, const char *key, int dflt) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return dflt;
    if (json_is_integer(v)) return (int)json_integer_value(v);
    if (json_is_real(v) && floor(json_real_value(v)) == json_real_value(v)) return (int)json_real_value(v);
    if (r->st == HYLA_OK) r->st = hyla_fail(HYLA_ERR_FORMAT, "%s: key '%s' must be an integer", r->path, key);
    return dflt;
}
static double get_num(cfg_reader *r, json_t *obj, const char *key, double dflt) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return dflt;
    if (json_is_number(v)) return json_number_value(v);
    if (r->st == HYLA_OK) r->st = hyla_fail(HYLA_ERR_FORMAT, "%s: key '%s' must be a number", r->path, key);
    return dflt;
}
static int get_bool(cfg_reader *r, json_t *obj, const char *key, int dflt) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return dflt;
    if (json_is_boolean(v)) return json_is_true(v);
    if (r->st == HYLA_OK) r->st = hyla_fail(HYLA_ERR_FORMAT, "%s: key '%s' must be true or false", r->path, key);
    return dflt;
}
static const char *get_str(cfg_reader *r, json_t *obj, const char *key, const char *dflt) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return dflt;
    if (json_is_string(v)) return json_string_value(v);
    if (r->st == HYLA_OK) r->st = hyla_fail(HYLA_ERR_FORMAT, "%s: key '%s' must be a string", r->path, key);
    return dflt;
}
static void need_positive(cfg_reader *r, const char *key, int v) {
    if (v <= 0 && r->st == HYLA_OK)
        r->st = hyla_fail(HYLA_ERR_FORMAT, "%s: key '%s' must be a positive integer (got %d)", r->path, key, v);
}
static void refuse(cfg_reader *r, const char *key, const char *why) {
    if (r->st == HYLA_OK) r->st = hyla_fail(HYLA_ERR_UNSUPPORTED, "%s: key '%s': %s", r->path, key, why);
}

/* The attn spec: an object, or a list of objects (FLA accepts both). */
static void read_attn_spec(cfg_reader *r, json_t *spec, hyla_model_config *c, int idx) {
    char ctx[64];
    snprintf(ctx, sizeof ctx, idx < 0 ? "attn" : "attn[%d]", idx);
    json_t *layers = json_object_get(spec, "layers");
    if (!json_is_array(layers)) {
        if (r->st == HYLA_OK) r->st = hyla_fail(HYLA_ERR_FORMAT, "%s: key '%s.layers' must be a list of layer indices", r->path, ctx);
        return;
    }
    int heads = get_int(r, spec, "num_heads", -1);
    if (heads <= 0 && r->st == HYLA_OK)
        r->st = hyla_fail(HYLA_ERR_FORMAT, "%s: key '%s.num_heads' is required and must be positive", r->path, ctx);
    int kv = get_int(r, spec, "num_kv_heads", heads);
    int window = get_int(r, spec, "window_size", 0);
    double theta = get_num(r, spec, "rope_theta", 10000.0);
    int bias = get_bool(r, spec, "qkv_bias", 0);
    if (r->st != HYLA_OK) return;
    if (c->attn_heads && (c->attn_heads != heads || c->attn_kv_heads != kv || c->attn_window != window ||
                          c->rope_theta != (float)theta || c->qkv_bias != bias)) {
        refuse(r, ctx, "several attn specs with different settings are not supported");
        return;
    }
    c->attn_heads = heads;
    c->attn_kv_heads = kv;
    c->attn_window = window;
    c->rope_theta = (float)theta;
    c->qkv_bias = bias;
    size_t i;
    json_t *l;
    json_array_foreach(layers, i, l) {
        if (!json_is_integer(l) || json_integer_value(l) < 0 || json_integer_value(l) >= c->num_layers) {
            if (r->st == HYLA_OK)
                r->st = hyla_fail(HYLA_ERR_FORMAT, "%s: '%s.layers' has an entry outside [0, %d)", r->path, ctx, c->num_layers);
            return;
        }
        int li = (int)json_integer_value(l);
        if (c->mixer[li] == HYLA_MIXER_ATTN) {
            if (r->st == HYLA_OK) r->st = hyla_fail(HYLA_ERR_FORMAT, "%s: '%s.layers' lists layer %d twice", r->path, ctx, li);
            return;
        }
        c->mixer[li] = HYLA_MIXER_ATTN;
    }
}

hyla_status hyla_model_config_load(const char *dir, hyla_model_config *c) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    memset(c, 0, sizeof *c);
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
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
    cfg_reader r = {path, root, HYLA_OK};
    const char *mt = get_str(&r, root, "model_type", NULL);
    if (!mt) {
        json_decref(root);
        return hyla_fail(HYLA_ERR_FORMAT, "%s: key 'model_type' is missing", path);
    }
    snprintf(c->model_type, sizeof c->model_type, "%s", mt);
    hyla_mixer_kind base;
    if (!strcmp(mt, "gla")) base = HYLA_MIXER_GLA;
    else if (!strcmp(mt, "gated_deltanet")) base = HYLA_MIXER_GDN;
    else if (!strcmp(mt, "sse")) base = HYLA_MIXER_SSE;
    else if (!strcmp(mt, "transformer")) base = HYLA_MIXER_ATTN;
    else {
        hyla_status st = hyla_fail(HYLA_ERR_UNSUPPORTED,
                                   "%s: unknown model_type '%s' (supported: gla, gated_deltanet, sse, transformer)", path, mt);
        json_decref(root);
        return st;
    }

    c->vocab_size = get_int(&r, root, "vocab_size", 32000);
    c->hidden_size = get_int(&r, root, "hidden_size", 2048);
    c->num_layers = get_int(&r, root, "num_hidden_layers", 24);
    need_positive(&r, "vocab_size", c->vocab_size);
    need_positive(&r, "hidden_size", c->hidden_size);
    need_positive(&r, "num_hidden_layers", c->num_layers);
    if (r.st == HYLA_OK && c->num_layers > HYLA_MAX_LAYERS)
        r.st = hyla_fail(HYLA_ERR_UNSUPPORTED, "%s: num_hidden_layers %d exceeds %d", path, c->num_layers, HYLA_MAX_LAYERS);
    c->norm_eps = (float)get_num(&r, root, "norm_eps", 1e-6);
    c->tie_word_embeddings = get_bool(&r, root, "tie_word_embeddings", 0);
    c->bos_token_id = get_int(&r, root, "bos_token_id", -1);
    c->eos_token_id = get_int(&r, root, "eos_token_id", -1);
    double ratio = get_num(&r, root, "hidden_ratio", 4);
    c->intermediate_size = get_int(&r, root, "intermediate_size", 0);
    if (c->intermediate_size <= 0) {
        int f = (int)(c->hidden_size * ratio * 2 / 3);
        c->intermediate_size = 256 * ((f + 255) / 256);
    }
    const char *act = get_str(&r, root, "hidden_act", "swish");
    if (strcmp(act, "swish") && strcmp(act, "silu")) refuse(&r, "hidden_act", "only swish (SwiGLU) is supported");
    if (r.st != HYLA_OK) goto done;
    for (int i = 0; i < c->num_layers; i++) c->mixer[i] = base;
    int D = c->hidden_size;
    c->clamp_min = -INFINITY;

    if (base == HYLA_MIXER_ATTN) {
        c->attn_heads = get_int(&r, root, "num_heads", 32);
        c->attn_kv_heads = get_int(&r, root, "num_kv_heads", c->attn_heads);
        c->attn_window = get_int(&r, root, "window_size", 0);
        c->rope_theta = (float)get_num(&r, root, "rope_theta", 10000.0);
        c->qkv_bias = get_bool(&r, root, "qkv_bias", 0);
        c->qk_norm = get_bool(&r, root, "qk_norm", 0);
    } else {
        c->num_heads = get_int(&r, root, "num_heads", base == HYLA_MIXER_GLA ? 4 : 6);
        need_positive(&r, "num_heads", c->num_heads);
        if (r.st != HYLA_OK) goto done;
        int H = c->num_heads;
        c->use_short_conv = get_bool(&r, root, "use_short_conv", base == HYLA_MIXER_GDN);
        c->conv_size = get_int(&r, root, "conv_size", 4);
        c->gate_logit_normalizer = (float)get_num(&r, root, "gate_logit_normalizer", 16);
        c->gate_low_rank_dim = get_int(&r, root, "gate_low_rank_dim", 16);
        c->allow_neg_eigval = get_bool(&r, root, "allow_neg_eigval", 0);
        if (base == HYLA_MIXER_GLA) {
            double ek = get_num(&r, root, "expand_k", 0.5), ev = get_num(&r, root, "expand_v", 1.0);
            int kd = (int)(D * ek), vd = (int)(D * ev);
            if (kd % H || vd % H) {
                if (r.st == HYLA_OK)
                    r.st = hyla_fail(HYLA_ERR_FORMAT, "%s: hidden_size*expand_k (%d) and hidden_size*expand_v (%d) must be divisible by num_heads (%d)",
                                     path, kd, vd, H);
                goto done;
            }
            c->head_k_dim = kd / H;
            c->head_v_dim = vd / H;
            c->use_output_gate = get_bool(&r, root, "use_output_gate", 1);
            json_t *cm = json_object_get(root, "clamp_min");
            if (cm && !json_is_null(cm)) c->clamp_min = (float)get_num(&r, root, "clamp_min", 0);
            if (json_object_get(root, "feature_map") && !json_is_null(json_object_get(root, "feature_map")))
                refuse(&r, "feature_map", "only null (no feature map) is supported");
            if (get_bool(&r, root, "use_gv", 0)) refuse(&r, "use_gv", "must be false");
            if (!get_bool(&r, root, "use_gk", 1)) refuse(&r, "use_gk", "must be true");
            int kvh = get_int(&r, root, "num_kv_heads", H);
            if (kvh != H) refuse(&r, "num_kv_heads", "GLA with num_kv_heads != num_heads is not supported");
            if (!get_bool(&r, root, "elementwise_affine", 1)) refuse(&r, "elementwise_affine", "must be true");
            const char *gfn = get_str(&r, root, "hidden_act", "swish");
            (void)gfn;
        } else {
            c->head_k_dim = get_int(&r, root, "head_dim", base == HYLA_MIXER_SSE ? 64 : 256);
            double ev = get_num(&r, root, "expand_v", base == HYLA_MIXER_SSE ? 1.0 : 2.0);
            c->head_v_dim = (int)(c->head_k_dim * ev);
            need_positive(&r, "head_dim", c->head_k_dim);
            if (r.st == HYLA_OK && fabs(c->head_k_dim * ev - c->head_v_dim) > 1e-6)
                r.st = hyla_fail(HYLA_ERR_FORMAT, "%s: head_dim*expand_v must be an integer", path);
            int nvh = get_int(&r, root, "num_v_heads", H);
            if (nvh != H) refuse(&r, "num_v_heads", "num_v_heads != num_heads is not supported");
            c->use_output_gate = get_bool(&r, root, base == HYLA_MIXER_GDN ? "use_gate" : "use_output_gate", 1);
            if (base == HYLA_MIXER_SSE) {
                c->sse_partitions = get_int(&r, root, "num_sparse_partition", 4);
                c->sse_topk = get_int(&r, root, "num_writer", 1);
                int reader = get_int(&r, root, "num_reader", c->sse_topk);
                need_positive(&r, "num_sparse_partition", c->sse_partitions);
                need_positive(&r, "num_writer", c->sse_topk);
                if (reader != c->sse_topk) refuse(&r, "num_reader", "must equal num_writer");
                if (r.st == HYLA_OK && c->sse_topk > c->sse_partitions)
                    r.st = hyla_fail(HYLA_ERR_FORMAT, "%s: num_writer (%d) exceeds num_sparse_partition (%d)", path,
                                     c->sse_topk, c->sse_partitions);
                const char *tr = get_str(&r, root, "sse_transition", "gla");
                if (!strcmp(tr, "gla")) c->sse_transition = HYLA_SSE_GLA;
                else if (!strcmp(tr, "gdn")) c->sse_transition = HYLA_SSE_GDN;
                else refuse(&r, "sse_transition", "must be \"gla\" or \"gdn\"");
                c->sse_lora_rank = get_int(&r, root, "lora_rank", c->head_v_dim);
                need_positive(&r, "lora_rank", c->sse_lora_rank);
                const char *lt = get_str(&r, root, "lora_target", "always");
                if (!strcmp(lt, "always")) c->sse_lora_on_sparse = 0;
                else if (!strcmp(lt, "sparse")) c->sse_lora_on_sparse = 1;
                else refuse(&r, "lora_target", "must be \"always\" or \"sparse\"");
                c->sse_q_softmax = get_bool(&r, root, "use_q_softmax", 0);
                c->sse_k_softmax = get_bool(&r, root, "use_k_softmax", 1);
                if (c->use_short_conv) refuse(&r, "use_short_conv", "SSE layers have no short convolution");
            }
        }
        if (c->use_short_conv) need_positive(&r, "conv_size", c->conv_size);
        if (get_bool(&r, root, "conv_bias", 0)) refuse(&r, "conv_bias", "short convolutions with bias are not supported");
        if (r.st != HYLA_OK) goto done;
        json_t *attn = json_object_get(root, "attn");
        if (attn && !json_is_null(attn)) {
            if (json_is_object(attn)) read_attn_spec(&r, attn, c, -1);
            else if (json_is_array(attn)) {
                size_t i;
                json_t *sp;
                json_array_foreach(attn, i, sp) read_attn_spec(&r, sp, c, (int)i);
            } else if (r.st == HYLA_OK)
                r.st = hyla_fail(HYLA_ERR_FORMAT, "%s: key 'attn' must be an object or a list of objects", path);
        }
    }
    if (r.st != HYLA_OK) goto done;
    for (int i = 0; i < c->num_layers; i++) {
        if (c->mixer[i] != HYLA_MIXER_ATTN) continue;
        if (c->attn_heads <= 0 || D % c->attn_heads) {
            r.st = hyla_fail(HYLA_ERR_FORMAT, "%s: hidden_size %d is not divisible by the attention num_heads %d", path, D,
                             c->attn_heads);
            goto done;
        }
        if (c->attn_kv_heads <= 0 || c->attn_heads % c->attn_kv_heads) {
            r.st = hyla_fail(HYLA_ERR_FORMAT, "%s: attention num_heads %d is not a multiple of num_kv_heads %d", path,
                             c->attn_heads, c->attn_kv_heads);
            goto done;
        }
        c->attn_head_dim = D / c->attn_heads;
        if (c->attn_head_dim % 2) {
            r.st = hyla_fail(HYLA_ERR_FORMAT, "%s: attention head dim %d must be even for RoPE", path, c->attn_head_dim);
            goto done;
        }
        if (c->attn_window < 0) c->attn_window = 0;
        break;
    }
done:
    json_decref(root);
    return r.st;
}
