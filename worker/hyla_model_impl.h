/* hyla_model_impl.h — private structs of the model runtime, shared by hyla_model.c (loading)
 * and hyla_session.c (state and forward). Not a public header. */
#ifndef HYLA_MODEL_IMPL_H
#define HYLA_MODEL_IMPL_H

#include "hyla_model.h"
#include "hyla_session.h"
#include "hyla_safetensors.h"

/* One layer's parameters on the backend. Pointers not used by the layer's mixer are NULL. */
typedef struct {
    hyla_mixer_kind kind;
    float *attn_norm, *mlp_norm;        /* [D] */
    hyla_weight *mlp_gate, *mlp_up;     /* [F][D] */
    hyla_weight *mlp_down;              /* [D][F] */

    hyla_weight *q, *k, *v, *o;         /* linear mixers: [H*dk][D], [H*dk][D], [H*dv][D], [D][H*dv]; attn: Hq/Hk */
    float *q_bias, *k_bias, *v_bias;    /* attn qkv_bias: [Hq*hd], [Hk*hd], [Hk*hd] */
    float *q_norm, *k_norm;             /* attn qk_norm: [hd] */
    hyla_weight *gk_a[2], *gk_b[2];     /* GLA gk_proj (index 0), SSE-GLA gk_proj.0 / .1: [r][D], [H*dk][r] */
    float *gk_bias[2];                  /* [H*dk] */
    hyla_weight *a_proj, *b_proj;       /* GDN: [H][D]; SSE-GDN: [2H][D] */
    float *A_log, *dt_bias;             /* GDN: [H]; SSE-GDN: [2H] */
    hyla_weight *g_proj;                /* output gate: GLA/GDN [H*dv][D]; SSE g_proj.0 [dv][D] */
    hyla_weight *g_proj2;               /* SSE g_proj.1 [H*dv][dv] */
    float *o_norm;                      /* [dv] */
    hyla_weight *lora_q_a, *lora_q_b;   /* SSE: [rank][D], [H*dk][rank] */
    hyla_weight *lora_k_a, *lora_k_b;
    hyla_weight *e_proj;                /* SSE: [N][D] */
    float *conv_w[3];                   /* short conv q, k, v: [C][K] */
} hyla_layer;

/* Scratch activations for up to `rows` rows (prefill chunk or decode batch). */
enum { HYLA_NBUF = 14 }; /* buf[13] holds a mixer/MLP output */
typedef struct {
    int rows;         /* capacity in rows */
    size_t width;     /* floats per row of each buf[] */
    float *x;         /* residual stream [rows][D] */
    float *xn;        /* normed input [rows][D] */
    float *buf[HYLA_NBUF];
    float *logits;    /* [rows][V] */
    int32_t *sse_idx; /* [rows][K] */
    float *sse_w;     /* [rows][K] */
} hyla_scratch;

/* Pinned host buffers for exported snapshots (hyla_session.c), created at the first export. */
typedef struct hyla_snapbufs hyla_snapbufs;

struct hyla_model {
    hyla_model_config cfg;
    hyla_backend *be;
    char dir[4096];
    int layer_begin, layer_end;
    int prefill_piece; /* tokens per prefill forward (hyla_model_set_prefill_piece) */
    hyla_layer layers[HYLA_MAX_LAYERS];
    hyla_weight *embed;   /* [V][D] (first stage, or tied head) */
    hyla_weight *lm_head; /* [V][D] (last stage); == embed when tied */
    float *final_norm;    /* [D] */
    hyla_downstream_fn downstream; /* remaining pipeline stages (NULL: this model holds the last layer) */
    void *downstream_ud;
    uint64_t fingerprint;
    uint64_t param_bytes;
    hyla_scratch sc;
    /* device allocations to free at the end */
    void **allocs;
    int n_allocs, cap_allocs;
    hyla_weight **weights;
    int n_weights, cap_weights;
    hyla_snapbufs *snapbufs; /* NULL until the first export */
};

/* Make sure the scratch holds `rows` rows (reallocates when it grows). */
hyla_status hyla_model_scratch_reserve(hyla_model *m, int rows);
/* Free the model's snapshot buffers (hyla_model_free; aborts if a snapshot still holds one). */
void hyla_snapbufs_destroy(hyla_model *m);

#endif
