/* hyla_model_impl.h — the loaded model's private structs, shared by hyla_model.c (loading),
 * hyla_runtime.c (the forward) and hyla_state.c (session state). Not a public header; it knows
 * nothing of sessions. */
#ifndef HYLA_MODEL_IMPL_H
#define HYLA_MODEL_IMPL_H

#include "hyla_mixer.h"
#include "hyla_model.h"

/* One layer's parameters on the backend. */
typedef struct {
    const hyla_mixer *mixer;
    const void *cfg;                    /* the mixer's config (owned by the model's config) */
    void *w;                            /* the mixer's weight struct (mixer->w_size bytes) */
    hyla_part_spec parts[HYLA_MIXER_MAX_PARTS];
    int n_parts;
    /* The parts of the whole (unsplit) layer: == parts unless the model is a tensor-parallel
     * shard, where a split part differs in one dimension (hyla_tp.c merges and splits by it). */
    hyla_part_spec full_parts[HYLA_MIXER_MAX_PARTS];
    float *attn_norm, *mlp_norm;        /* [D] */
    hyla_weight *mlp_gate, *mlp_up;     /* [F][D] */
    hyla_weight *mlp_down;              /* [D][F] */
} hyla_layer;

struct hyla_model {
    hyla_model_config cfg;
    hyla_backend *be;
    char dir[4096];
    int layer_begin, layer_end;
    int tp_rank, tp_size; /* the shard held (0 of 1: the whole model) */
    hyla_layer layers[HYLA_MAX_LAYERS];
    hyla_weight *embed;   /* [V][D] (first stage, or tied head) */
    hyla_weight *lm_head; /* [V][D] (last stage); == embed when tied */
    float *final_norm;    /* [D] */
    uint64_t fingerprint;
    uint64_t param_bytes;
    /* what to free at the end: device allocations, weights, host blocks */
    void **allocs;
    int n_allocs, cap_allocs;
    hyla_weight **weights;
    int n_weights, cap_weights;
    void **host;
    int n_host, cap_host;
};

#endif
