/* hyla_linattn.h — pieces the linear-attention mixers (gla, gdn, sse) share: the common config
 * keys, the short causal convolution of q, k, v with its carried tails, and the output norm +
 * projection. Private to worker/mixers/. */
#ifndef HYLA_LINATTN_H
#define HYLA_LINATTN_H

#include "hyla_mixer.h"

/* Short-conv parts conv_q, conv_k, conv_v ([K-1][C] fp32 each), appended to out[*n]. */
void hyla_lin_conv_parts(hyla_part_spec *out, int *n, int Ck, int Cv, int K);
/* The three conv weight tensors ([C][1][K], fp32 on the device) at offsets off[0..2]. */
void hyla_lin_conv_decls(hyla_decls *ds, const size_t off[3], int Ck, int Cv, int K);
/* x = silu(conv(x)) for q, k ([R][Ck]) and v ([R][Cv]) in place, tails in parts part0..part0+2 of
 * each session [CONV-1]. */
hyla_status hyla_lin_short_conv(const hyla_mixer_fwd *f, float *q, float *k, float *v, int Ck, int Cv,
                                float *const conv_w[3], int K, int part0);
/* Refuse what no linear mixer implements (conv_bias). */
void hyla_lin_common_keys(hyla_cfg *r, json_t *obj);

#endif
