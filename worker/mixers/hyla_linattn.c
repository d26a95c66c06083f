/* hyla_linattn.c — see hyla_linattn.h. */
#include <stdio.h>

#include "hyla_linattn.h"
#include "hyla_profile.h"

void hyla_lin_conv_parts(hyla_part_spec *out, int *n, int Ck, int Cv, int K) {
    static const char *names[3] = {"conv_q", "conv_k", "conv_v"};
    for (int j = 0; j < 3; j++)
        out[(*n)++] = (hyla_part_spec){.kind = HYLA_PART_RECURRENT,
                                       .dtype = HYLA_DT_F32,
                                       .ndim = 2,
                                       .shape = {(uint64_t)K - 1, (uint64_t)(j == 2 ? Cv : Ck)}};
    for (int j = 0; j < 3; j++) snprintf(out[*n - 3 + j].name, sizeof out[0].name, "%s", names[j]);
}

int hyla_lin_parts(hyla_part_spec *out, int H, int dk, int dv, int conv_size) {
    int n = 0;
    out[n++] = (hyla_part_spec){"S", HYLA_PART_RECURRENT, HYLA_DT_F32, 3, {(uint64_t)H, (uint64_t)dk, (uint64_t)dv}, 0, {0}};
    if (conv_size > 0) hyla_lin_conv_parts(out, &n, H * dk, H * dv, conv_size);
    return n;
}

void hyla_lin_conv_decls(hyla_decls *ds, const size_t off[3], int Ck, int Cv, int K) {
    static const char *cn[3] = {"q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight"};
    for (int j = 0; j < 3; j++)
        hyla_decl(ds, cn[j], HYLA_TENSOR_VECTOR, off[j], 3, j == 2 ? Cv : Ck, 1, K, HYLA_INIT_CONV, 0, 0);
}

hyla_status hyla_lin_short_conv(const hyla_mixer_fwd *f, float *q, float *k, float *v, int Ck, int Cv,
                                float *const conv_w[3], int K, int part0, int l2, const void *const *src) {
    float *x[3] = {q, k, v}, *tail[3];
    hyla_conv_part p[3];
    for (int j = 0; j < 3; j++) {
        float *const *tails;
        if (f->decode) {
            tails = (float *const *)hyla_mixer_gather(f, j, part0 + j);
        } else {
            tail[j] = f->st[0]->part[part0 + j].dev;
            tails = &tail[j];
        }
        p[j] = (hyla_conv_part){x[j], conv_w[j], NULL, tails, j == 2 ? Cv : Ck, j == 2 ? 0 : l2, 1e-6f,
                                src ? src[j] : NULL};
    }
    /* decode: R sessions of one token; prefill: one session's piece of R tokens */
    const int B = f->decode ? f->R : 1, n = f->decode ? 1 : f->R;
    return f->o->short_conv_multi(f->ctx, 3, p, B, n, K, 1);
}

int hyla_lin_gate_bf16(const hyla_mixer_fwd *f, int dv) { return !f->decode && f->xn_bf16 && dv % 4 == 0; }

hyla_status hyla_lin_norm_out(const hyla_mixer_fwd *f, float *o, const float *gate, const float *norm_w,
                              const hyla_weight *Wo, int H, int dv, int gate_bf16) {
    /* one op: prompt rows go from the norm straight to the projection's bf16 operand */
    const int fl = (f->decode ? 0 : HYLA_LINEAR_PREFILL | (gate && gate_bf16 ? HYLA_LINEAR_GATE_BF16 : 0)) |
                   (f->out_acc ? HYLA_LINEAR_ACC : 0);
    HYLA_TRY(f->o->gated_rmsnorm_linear(f->ctx, o, gate, norm_w, H, dv, f->mc->norm_eps, f->R, Wo, f->out,
                                        f->mc->hidden_size, fl));
    HYLA_MIXER_MARK(f, "lin: out norm, o proj");
    return HYLA_OK;
}

void hyla_lin_common_keys(hyla_cfg *r, json_t *obj) {
    if (hyla_cfg_bool(r, obj, "conv_bias", 0)) hyla_cfg_refuse(r, "conv_bias", "short convolutions with bias are not supported");
}
