#!/usr/bin/env python3
"""check_transformers_gdn.py: our reference gated delta rule against Hugging Face transformers'.

Compares hyla_ref.gdn_recurrent and hyla_ref.gdn_chunked (the WY form), which were written
from docs/MODELS.md [GDN-2], [GDN-3], with the pure-torch gated delta rule of transformers'
Qwen3-Next model (torch_recurrent_gated_delta_rule, torch_chunk_gated_delta_rule in
transformers.models.qwen3_next.modeling_qwen3_next), and our gated RMSNorm [NORM-1] with
Qwen3NextRMSNormGated, on random inputs, CPU only, in well under a minute.

Conventions matched (from that file): inputs q, k [B, T, H, dk], v [B, T, H, dv], g and beta
[B, T, H]; g is the log decay (state *= exp(g)); with use_qk_l2norm_in_kernel=True q and k are
divided by sqrt(sum x^2 + 1e-6) (our [GDN-2]); the scale dk^-1/2 multiplies q; the state is
[B, H, dk, dv] with o = q S (our S ∈ R^{dk×dv}); transformers computes in float32 whatever
the input dtype, so we report our float64 reference against it and our float32 reference
against it (like for like).

Needs only torch and transformers (and hyla_ref.py next to this file, which needs numpy, a
dependency of transformers). Prints one JSON object; exit status 1 if any relative error
exceeds 1e-4 (fp32 rounding over <= 300 steps is ~1e-6; a convention mismatch is O(1)).

  python3 tests/reference/check_transformers_gdn.py
"""
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hyla_ref as R  # noqa: E402

TOL_REL = 1e-4


def errs(ours, theirs):
    a, b = ours.double(), theirs.double()
    d = (a - b).abs().max().item()
    return {"max_abs": d, "max_rel": d / max(b.abs().max().item(), 1e-30)}


def ours_batched(fn, q, k, v, g, beta, S0, dtype):
    """Runs our per-sequence reference over a batch; q, k are l2-normalised as [GDN-2]."""
    outs, states = [], []
    dk = q.shape[-1]
    for b in range(q.shape[0]):
        qq, kk = R.l2norm(q[b].to(dtype)), R.l2norm(k[b].to(dtype))
        o, S = fn(qq, kk, v[b].to(dtype), g[b].to(dtype), beta[b].to(dtype), S0[b].to(dtype), dk ** -0.5)
        outs.append(o)
        states.append(S)
    return torch.stack(outs), torch.stack(states)


def main():
    t0 = time.time()
    import transformers
    from transformers.models.qwen3_next import modeling_qwen3_next as QN

    torch.manual_seed(0)
    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))
    report = {"transformers": transformers.__version__, "torch": torch.__version__,
              "functions": ["torch_recurrent_gated_delta_rule", "torch_chunk_gated_delta_rule", "Qwen3NextRMSNormGated"],
              "cases": []}
    worst = 0.0
    cases = [
        # name, B, T, H, dk, dv, beta scale, initial state
        ("T=150 (3 chunks, ragged), beta in (0,1), zero initial state", 2, 150, 3, 16, 32, 1.0, False),
        ("T=150, beta in (0,1), random initial state", 2, 150, 3, 16, 32, 1.0, True),
        ("T=300, dk=64 dv=64, beta in (0,2) (allow_neg_eigval)", 1, 300, 2, 64, 64, 2.0, True),
        ("T=1 (a decode step), random initial state", 2, 1, 4, 32, 16, 1.0, True),
    ]
    for name, B, T, H, dk, dv, bs, init in cases:
        q = torch.randn(B, T, H, dk)
        k = torch.randn(B, T, H, dk)
        v = torch.randn(B, T, H, dv)
        g = -torch.exp(torch.randn(B, T, H)) * 0.3  # log decay, as -exp(A_log)*softplus(.)
        beta = torch.sigmoid(torch.randn(B, T, H)) * bs
        S0 = torch.randn(B, H, dk, dv) * 0.5 if init else torch.zeros(B, H, dk, dv)
        hf_rec_o, hf_rec_S = QN.torch_recurrent_gated_delta_rule(
            q, k, v, g=g, beta=beta, initial_state=S0.clone(), output_final_state=True, use_qk_l2norm_in_kernel=True)
        hf_chk_o, hf_chk_S = QN.torch_chunk_gated_delta_rule(
            q, k, v, g=g, beta=beta, chunk_size=64, initial_state=S0.clone(), output_final_state=True,
            use_qk_l2norm_in_kernel=True)
        case = {"case": name}
        for dt_name, dt in (("f64", torch.float64), ("f32", torch.float32)):
            rec_o, rec_S = ours_batched(R.gdn_recurrent, q, k, v, g, beta, S0, dt)
            chk_o, chk_S = ours_batched(R.gdn_chunked, q, k, v, g, beta, S0, dt)
            for nm, a, b in (("ours_recurrent_%s vs hf_recurrent: o" % dt_name, rec_o, hf_rec_o),
                             ("ours_recurrent_%s vs hf_recurrent: S" % dt_name, rec_S, hf_rec_S),
                             ("ours_chunked_%s vs hf_chunked: o" % dt_name, chk_o, hf_chk_o),
                             ("ours_chunked_%s vs hf_chunked: S" % dt_name, chk_S, hf_chk_S),
                             ("ours_chunked_%s vs hf_recurrent: o" % dt_name, chk_o, hf_rec_o)):
                e = errs(a, b)
                case[nm] = e
                worst = max(worst, e["max_rel"])
        e = errs(hf_chk_o, hf_rec_o)
        case["hf_chunked vs hf_recurrent: o"] = e
        report["cases"].append(case)
    # gated RMSNorm [NORM-1]: RMSNorm(o; w) * silu(z), norm before gate, weight multiplies
    dv = 32
    o = torch.randn(50, dv)
    z = torch.randn(50, dv)
    norm = QN.Qwen3NextRMSNormGated(dv, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.1 * torch.randn(dv))
        hf = norm(o, z)
    ours = R.gated_rmsnorm(o.double(), norm.weight.detach().double(), z.double(), 1e-6)
    e = errs(ours, hf)
    worst = max(worst, e["max_rel"])
    report["gated_rmsnorm ours_f64 vs Qwen3NextRMSNormGated"] = e
    report["worst_max_rel"] = worst
    report["tolerance_rel"] = TOL_REL
    report["pass"] = worst <= TOL_REL
    report["seconds"] = round(time.time() - t0, 2)
    print(json.dumps(report, indent=1))
    return 0 if report["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
