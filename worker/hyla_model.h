/* hyla_model.h — model directories (config.json + safetensors) and the loaded model.
 *
 * A model is a stack of layers; each layer's mixer kind (gla, gdn, sse, attn, ...) comes from
 * the model_type and the hybrid specs such as `attn` (docs/MODELS.md §2); every kind is a
 * module behind the mixer interface (hyla_mixer.h). A loaded model is immutable: config and
 * weights. Scratch memory, snapshot buffers and the pipeline callback belong to a runtime
 * (hyla_runtime.h) that sessions run on. A loaded model may hold only a layer range
 * [layer_begin, layer_end) — one stage of a pipeline; the first stage also holds the
 * embedding, the last one the final norm and lm_head.
 *
 * Ownership: hyla_model_load returns a model the caller frees with hyla_model_free (after
 * every runtime on it); the backend is borrowed and must outlive the model. Threading: a
 * model is read-only after load. */
#ifndef HYLA_MODEL_H
#define HYLA_MODEL_H

#include <stdint.h>

#include "hyla_ops.h"
#include "hyla_status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct hyla_mixer; /* hyla_mixer.h */

#define HYLA_MAX_LAYERS 256
#define HYLA_PREFILL_CHUNK 64   /* prefill chunks are aligned to absolute positions */
#define HYLA_PREFILL_PIECE_DEFAULT 1024 /* tokens per prefill forward pass (a multiple of the chunk) */
#define HYLA_PREFILL_PIECE_MAX 32768 /* the largest piece a caller may choose (the default is the backend's) */
#define HYLA_PIPELINE_PIECE 2048 /* a stage with a downstream: default piece cap, so the stages overlap */
#define HYLA_KV_PAGE_TOKENS 64  /* tokens per KV page */

/* Where a model family keeps the tensors every layer has, and the embedding and head
 * (printf formats taking the layer index). The base mixer kind names its family's layout;
 * flash-linear-attention's is the default (docs/MODELS.md §1). */
typedef struct {
    const char *embed;      /* [V][D] */
    const char *layer_norm; /* the mixer's pre-norm [D] */
    const char *mixer;      /* prefix of the mixer's tensors, e.g. "model.layers.%d.attn." */
    const char *mlp_norm;   /* the MLP's pre-norm [D]; NULL: the family's layers have no MLP */
    const char *mlp;        /* prefix of the MLP's gate_proj, up_proj, down_proj */
    const char *final_norm; /* [D] */
    const char *lm_head;    /* [V][D] (absent with tied embeddings) */
} hyla_layout;

/* What config.json says, normalised: the keys every model has, and for each layer its mixer
 * kind and that kind's own config (parsed by the mixer module; opaque here). */
typedef struct {
    char model_type[32];
    int vocab_size, hidden_size, num_layers, intermediate_size;
    float norm_eps;
    int tie_word_embeddings;
    int bos_token_id, eos_token_id; /* -1 if absent */
    const hyla_layout *layout;
    const struct hyla_mixer *mixer[HYLA_MAX_LAYERS]; /* layer i's kind */
    const void *mixer_cfg[HYLA_MAX_LAYERS];          /* layer i's mixer config (shared by layers of one spec) */
    /* The model's prefill chunk: prompts are cut into forward passes at its multiples of absolute
     * positions (MODELS.md §3.1): HYLA_PREFILL_CHUNK, or the largest alignment a layer's kind
     * asks (hyla_mixer.prefill_align: SSE's prefill window), over every layer of the model,
     * whatever range a process holds, so the stages of a pipeline cut alike */
    int prefill_chunk;
    void *owned;                                     /* the config objects (freed by hyla_model_config_free) */
} hyla_model_config;

/* Parse and validate config.json of a model directory. Errors name the key. Caller frees with
 * hyla_model_config_free (also on failure). */
hyla_status hyla_model_config_load(const char *dir, hyla_model_config *out);
void hyla_model_config_free(hyla_model_config *c);
/* The mixer kind of layer i ("gla", "attn", ...). */
const char *hyla_model_config_layer_kind(const hyla_model_config *c, int i);

typedef struct hyla_model hyla_model;

typedef struct {
    int layer_begin; /* first layer held (default 0) */
    int layer_end;   /* one past the last layer held (default -1: all) */
    /* Tensor parallelism (docs/MULTIGPU.md §2): hold rank tp_rank's shard of tp_size (default 0
     * of 1: the whole model): each mixer's heads and the MLP's intermediate columns divided by
     * tp_size, the weights sliced to this rank's heads (column-parallel projections by rows,
     * row-parallel ones by columns, per-head vectors by heads; the rest replicated). Refused,
     * naming the key, where a size does not divide or a mixer kind cannot be split. */
    int tp_rank, tp_size;
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
/* Bytes of parameters held by this model on its backend (for placement and benchmarks). */
uint64_t hyla_model_param_bytes(const hyla_model *m);
/* The tensor-parallel shard this model holds: *rank of *size (0 of 1: the whole model). */
void hyla_model_tp(const hyla_model *m, int *rank, int *size);

#ifdef __cplusplus
}
#endif
#endif
