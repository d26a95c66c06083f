/* hyla_model.h — model directories (config.json + safetensors) and the loaded model.
 *
 * A model is a stack of layers; each layer's mixer kind (gla, gdn, sse, attn) comes from the
 * model_type and the hybrid `attn` spec (docs/MODELS.md §2). A loaded model may hold only a
 * layer range [layer_begin, layer_end) — one stage of a pipeline; the first stage also holds
 * the embedding, the last one the final norm and lm_head.
 *
 * Ownership: hyla_model_load returns a model the caller frees with hyla_model_free; the
 * backend is borrowed and must outlive the model. Threading: a model is read-only after
 * load; sessions of one model may be driven from one thread at a time (the backend's). */
#ifndef HYLA_MODEL_H
#define HYLA_MODEL_H

#include <stdint.h>

#include "hyla_ops.h"
#include "hyla_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { HYLA_MIXER_GLA = 0, HYLA_MIXER_GDN = 1, HYLA_MIXER_SSE = 2, HYLA_MIXER_ATTN = 3 } hyla_mixer_kind;
const char *hyla_mixer_name(hyla_mixer_kind k);

#define HYLA_MAX_LAYERS 256
#define HYLA_PREFILL_CHUNK 64   /* prefill chunks are aligned to absolute positions */
#define HYLA_PREFILL_PIECE_DEFAULT 1024 /* tokens per prefill forward pass (a multiple of the chunk) */
#define HYLA_PREFILL_PIECE_MAX 8192
#define HYLA_KV_PAGE_TOKENS 64  /* tokens per KV page */

/* Everything config.json says, normalised (defaults applied, derived sizes computed). */
typedef struct {
    char model_type[32];
    int vocab_size, hidden_size, num_layers, intermediate_size;
    float norm_eps;
    int tie_word_embeddings;
    int bos_token_id, eos_token_id; /* -1 if absent */
    hyla_mixer_kind mixer[HYLA_MAX_LAYERS];

    /* linear mixer (gla / gdn / sse) */
    int num_heads, head_k_dim, head_v_dim;
    int use_short_conv, conv_size, use_output_gate;
    float gate_logit_normalizer, clamp_min; /* clamp_min = -INFINITY when absent */
    int gate_low_rank_dim;
    int allow_neg_eigval;
    /* sse */
    int sse_partitions, sse_topk, sse_transition; /* hyla_sse_transition */
    int sse_lora_rank, sse_lora_on_sparse, sse_q_softmax, sse_k_softmax;

    /* attention (transformer, or the layers in the attn spec) */
    int attn_heads, attn_kv_heads, attn_head_dim, attn_window; /* window 0 = full */
    float rope_theta;
    int qkv_bias, qk_norm;
} hyla_model_config;

/* Parse and validate config.json of a model directory. Errors name the key. */
hyla_status hyla_model_config_load(const char *dir, hyla_model_config *out);

typedef struct hyla_model hyla_model;

typedef struct {
    int layer_begin; /* first layer held (default 0) */
    int layer_end;   /* one past the last layer held (default -1: all) */
} hyla_model_params;
hyla_model_params hyla_model_default_params(void);

/* Load (and validate) a model directory onto a backend. Errors name the file, the tensor and
 * what was expected. Caller frees with hyla_model_free. */
hyla_status hyla_model_load(const char *dir, hyla_backend *be, const hyla_model_params *params, hyla_model **out);
void hyla_model_free(hyla_model *m); /* accepts NULL */

const hyla_model_config *hyla_model_get_config(const hyla_model *m);
hyla_backend *hyla_model_backend(const hyla_model *m);
/* 64-bit fingerprint of the normalised config and every tensor's name, dtype and shape.
 * Snapshots carry it; a restore onto another model is refused. Independent of the layer range. */
uint64_t hyla_model_fingerprint(const hyla_model *m);
void hyla_model_layer_range(const hyla_model *m, int *begin, int *end);
/* Tokens a prefill forward pass takes at most (docs/MODELS.md §3.1): a multiple of
 * HYLA_PREFILL_CHUNK in [HYLA_PREFILL_CHUNK, HYLA_PREFILL_PIECE_MAX]. Larger pieces run the
 * projections as larger GEMMs; the results are the same bits for any piece size (pieces stay
 * aligned to chunk boundaries and every op's rows are independent of how many it gets).
 * Default HYLA_PREFILL_PIECE_DEFAULT, or the environment variable HYLA_PREFILL_PIECE at load.
 * Scratch memory grows with it (activations of that many rows, logits included). */
hyla_status hyla_model_set_prefill_piece(hyla_model *m, int tokens);
int hyla_model_prefill_piece(const hyla_model *m);
/* Bytes of parameters held by this model on its backend (for placement and benchmarks). */
uint64_t hyla_model_param_bytes(const hyla_model *m);

#ifdef __cplusplus
}
#endif
#endif
