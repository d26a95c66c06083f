/* hyla_linattn.h — pieces the linear-attention mixers (gla, gdn, sse, mamba2, dla) share: the common
 * config keys, the short causal convolution of q, k, v with its carried tails, and the keys,
 * weights, tensors and hyla-mkmodel keys of gated DeltaNet (gdn.c) and Mamba2 (mamba2.c), which
 * the DLA bases (dla.c) reuse. Private to worker/mixers/. */
#ifndef HYLA_LINATTN_H
#define HYLA_LINATTN_H

#include "hyla_mixer.h"

/* Short-conv parts conv_q, conv_k, conv_v ([K-1][C] fp32 each), appended to out[*n]. */
void hyla_lin_conv_parts(hyla_part_spec *out, int *n, int Ck, int Cv, int K);
/* S [H][dk][dv] fp32, then the conv parts when conv_size > 0; returns the count: the state of
 * every gla / gdn layer. */
int hyla_lin_parts(hyla_part_spec *out, int H, int dk, int dv, int conv_size);
/* The three conv weight tensors ([C][1][K], fp32 on the device) at offsets off[0..2]. */
void hyla_lin_conv_decls(hyla_decls *ds, const size_t off[3], int Ck, int Cv, int K);
/* x = silu(conv(x)) for q, k ([R][Ck]) and v ([R][Cv]) in place, tails in parts part0..part0+2 of
 * each session [CONV-1], in one ops->short_conv_multi; l2 > 0: then q's and k's heads of l2 are
 * L2-normalised (eps 1e-6, [GDN-2]) in the same op, as l2norm_rows would. src (NULL: in place):
 * the bf16 inputs of q, k and v (hyla_conv_part.src), the results into q, k, v. */
hyla_status hyla_lin_short_conv(const hyla_mixer_fwd *f, float *q, float *k, float *v, int Ck, int Cv,
                                float *const conv_w[3], int K, int part0, int l2, const void *const *src);
/* [NORM-1] f->out = (gated RMSNorm per head of o [R][H*dv], gate [R][H*dv] or NULL: plain) Wo^T
 * in one ops->gated_rmsnorm_linear (o may be overwritten): the end every gla / gdn forward shares,
 * marked as "lin: out norm, o proj". gate_bf16: gate holds bf16 rows (prompt rows on a backend with
 * rmsnorm_bf16: hyla_lin_gate_bf16). */
hyla_status hyla_lin_norm_out(const hyla_mixer_fwd *f, float *o, const float *gate, const float *norm_w,
                              const hyla_weight *Wo, int H, int dv, int gate_bf16);
/* Whether this forward's output gate projection [R][H*dv] is written as bf16 (HYLA_LINEAR_Y_BF16)
 * and read so by hyla_lin_norm_out: prompt rows on a backend with bf16 rows, dv % 4 == 0. */
int hyla_lin_gate_bf16(const hyla_mixer_fwd *f, int dv);
/* Refuse what no linear mixer implements (conv_bias). */
void hyla_lin_common_keys(hyla_cfg *r, json_t *obj);

/* Gated DeltaNet's keys (docs/MODELS.md §4.2). */
typedef struct {
    int H, dk, dv; /* num_heads, head_dim, head_dim * expand_v */
    int use_short_conv, conv_size, use_gate, allow_neg_eigval;
} hyla_gdn_keys;

/* Gated DeltaNet's weights, named as flash-linear-attention's GatedDeltaNet layer names them. */
typedef struct {
    hyla_weight *q, *k, *v, *o;   /* [H*dk][D], [H*dk][D], [H*dv][D], [D][H*dv] */
    hyla_weight *a_proj, *b_proj; /* [H][D] */
    float *A_log, *dt_bias;       /* [H] */
    hyla_weight *g_proj;          /* [H*dv][D] (use_gate) */
    float *o_norm;                /* [dv] */
    float *conv_w[3];             /* [C][K] q, k, v */
} hyla_gdn_w;

/* Reads GDN's keys from obj into *k (failures in r). */
void hyla_gdn_parse_keys(hyla_cfg *r, json_t *obj, hyla_gdn_keys *k);
/* Declares GDN's tensors for a hyla_gdn_w at byte offset `at` of the layer's weight struct. */
void hyla_gdn_decls(hyla_decls *ds, const hyla_gdn_keys *k, int D, size_t at);
/* hyla-mkmodel's GDN keys into obj; NULL (no refusal). */
const char *hyla_gdn_mk_config(json_t *obj, const hyla_mk_args *a);

/* Mamba2's keys (docs/MODELS.md §4.6). */
typedef struct {
    int H, P, N, G, K; /* heads, head dim, state size, groups, conv kernel */
    int I, Cc, Din;    /* H*P; conv channels I + 2GN; in_proj rows 2I + 2GN + H */
    int use_conv_bias, use_bias;
    int norm_groups;      /* groups of the gated RMSNorm: G (FLA, mamba_ssm) or 1 (transformers) */
    float dt_min, dt_max; /* time_step_limit */
} hyla_m2_keys;

/* Mamba2's weights, named as transformers' Mamba2 mixer names them. */
typedef struct {
    hyla_weight *in_proj;           /* [Din][D] */
    float *in_bias;                 /* [Din] (use_bias) */
    float *conv_w;                  /* [Cc][1][K] */
    float *conv_b;                  /* [Cc] (use_conv_bias) */
    float *dt_bias, *A_log, *Dskip; /* [H] */
    float *norm;                    /* [I] */
    hyla_weight *out_proj;          /* [D][I] */
    float *out_bias;                /* [D] (use_bias) */
} hyla_m2_w;

/* Tensor parallelism: divide c's heads and groups by T (NULL), else why not (hyla_mixer.h
 * tp_shard); and the split layout of the convolved channels [x | B | C] into seg. */
const char *hyla_m2_tp_shard(hyla_m2_keys *c, int T, char *why, size_t n);
void hyla_m2_seg_xbc(const hyla_m2_keys *c, int *seg);

/* The family's layout: `backbone.*` names, mixer-only layers. */
extern const hyla_layout hyla_m2_layout;
/* The family's model-level keys (layer_norm_epsilon). */
void hyla_m2_parse_model(hyla_cfg *r, json_t *root, hyla_model_config *mc);
/* Reads Mamba2's keys from obj (hidden size D) into *k (failures in r). */
void hyla_m2_parse_keys(hyla_cfg *r, json_t *obj, int D, hyla_m2_keys *k);
/* Declares Mamba2's tensors for a hyla_m2_w at byte offset `at` of the layer's weight struct. */
void hyla_m2_decls(hyla_decls *ds, const hyla_m2_keys *k, int D, size_t at);
/* hyla-mkmodel's Mamba2 keys into obj; NULL or why the arguments do not fit. */
const char *hyla_m2_mk_config(json_t *obj, const hyla_mk_args *a);

#endif
