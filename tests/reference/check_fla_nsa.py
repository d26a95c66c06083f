#!/usr/bin/env python3
"""check_fla_nsa.py: hyla_ref.py's NSA (nsa_attend, written from docs/MODELS.md 5.2) against
flash-linear-attention's own NSA on the same random inputs: its naive reference
(fla.ops.nsa.naive: compression, top-k selection, selection attention; the window branch by
plain torch since its naive code calls flash-attn) and, on a GPU, its Triton parallel_nsa.

Needs torch, einops and flash-linear-attention's source on PYTHONPATH (the GPU machine):
  PYTHONPATH=/path/to/fla python3 tests/reference/check_fla_nsa.py
Prints the largest absolute difference per comparison; exits 1 when one exceeds its bound.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hyla_ref as R  # noqa: E402


def window_ref(q, k, v, window, scale):
    T, Hq, hd = q.shape
    G = Hq // k.shape[1]
    o = torch.zeros_like(q)
    for p in range(T):
        lo = max(0, p - window + 1)
        for h in range(Hq):
            s = torch.softmax(k[lo:p + 1, h // G] @ q[p, h] * scale, -1)
            o[p, h] = s @ v[lo:p + 1, h // G]
    return o


def main():
    torch.manual_seed(7)
    T, Hq, Hk, hd, BS, S, W = 192, 16, 1, 32, 16, 4, 40
    scale = hd ** -0.5
    q = torch.randn(T, Hq, hd, dtype=torch.float64)
    k = torch.randn(T, Hk, hd, dtype=torch.float64)
    v = torch.randn(T, Hk, hd, dtype=torch.float64)
    g = torch.randn(T, Hq, 3, dtype=torch.float64)
    ours, margins = R.nsa_attend(q, k, v, g, BS, S, W, scale)
    print("hyla_ref nsa: %d selection boundaries, smallest score gap %.2e" % (len(margins), min(margins)))
    bad = 0
    from fla.ops.nsa.naive import naive_nsa_compression, naive_nsa_selection, naive_nsa_topk
    qb, kb, vb = q[None].float(), k[None].float(), v[None].float()
    gs = torch.sigmoid(g[None].float())
    # FLA's mean_pooling is a Triton kernel; T is a multiple of BS, so the plain mean is the same
    k_cmp, v_cmp = (x.view(1, T // BS, BS, Hk, hd).mean(2) for x in (kb, vb))
    o_cmp, _ = naive_nsa_compression(qb, k_cmp, v_cmp, BS, scale)
    idx = naive_nsa_topk(qb, k_cmp, S, BS, scale)
    o_slc = naive_nsa_selection(qb, kb, vb, idx, BS, scale)
    o_swa = window_ref(q.float(), k.float(), v.float(), W, scale)[None]
    fla = o_slc * gs[..., 1:2] + o_cmp * gs[..., 0:1] + o_swa * gs[..., 2:3]
    d = (fla[0].double() - ours).abs().max().item()
    print("FLA naive (fp32) vs hyla_ref (fp64): max |diff| %.2e" % d)
    bad |= d > 1e-4
    if torch.cuda.is_available():
        try:
            from fla.ops.nsa.parallel import parallel_nsa
            dev = "cuda"
            args = dict(block_size=BS, block_counts=S, window_size=W)
            gg = torch.sigmoid(g.float()).to(dev)
            o = parallel_nsa(q=q[None].float().to(dev), k=k[None].float().to(dev), v=v[None].float().to(dev),
                             g_cmp=gg[None, ..., 0], g_slc=gg[None, ..., 1], g_swa=gg[None, ..., 2], **args)
            d = (o[0].double().cpu() - ours).abs().max().item()
            print("FLA parallel_nsa (Triton, fp32 inputs) vs hyla_ref: max |diff| %.2e" % d)
            bad |= d > 5e-2
        except Exception as e:  # report, do not hide
            print("FLA parallel_nsa: could not run: %s: %s" % (type(e).__name__, e))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
