#!/usr/bin/env python3
"""Checkpoints saved by flash-linear-attention itself, loaded by hyla: one per naming variant.

Run on a machine with a GPU, torch, transformers and flash-linear-attention's source on
PYTHONPATH (FLA's models run Triton kernels). For each variant it builds a small random model
with FLA's own classes, saves it with save_pretrained (safetensors), runs FLA's forward on a
fixed prompt in float32 and writes:

    OUT/<name>/            the checkpoint (config.json + model.safetensors)
    OUT/<name>.prompt      the prompt ids, space separated
    OUT/<name>.fla.f32     FLA's logits, little-endian float32 [positions][vocab]

Then compare with hyla-run's --dump-logits (same layout) using --compare:

    python3 fla_checkpoints.py --out DIR                       # build and run FLA
    hyla-run --model DIR/<name> --prompt-ids "$(cat DIR/<name>.prompt)" --max-tokens 1 \\
        --dump-logits DIR/<name>.hyla.f32 --device cuda:0
    python3 fla_checkpoints.py --out DIR --compare             # prints max |diff| per variant

Variants: GLA fused and unfused output norm, GLA with short convolutions and no output gate,
GDN with and without gate / conv, tied embeddings, a GLA hybrid with an attention layer.
"""
import argparse
import json
import os
import sys

import numpy as np

VOCAB, D, L, H, T = 260, 128, 2, 4, 96


def variants():
    return {
        "gla-fused": ("gla", dict(fuse_norm=True)),
        "gla-unfused": ("gla", dict(fuse_norm=False)),
        "gla-conv-nogate": ("gla", dict(use_short_conv=True, use_output_gate=False)),
        "gla-tied": ("gla", dict(tie_word_embeddings=True)),
        "gla-hybrid": ("gla", dict(attn={"layers": [1], "num_heads": 4, "num_kv_heads": 2, "window_size": None,
                                         "rope_theta": 10000.0, "qkv_bias": False})),
        "gdn": ("gated_deltanet", dict(head_dim=32, num_heads=4)),
        "gdn-nogate-noconv": ("gated_deltanet", dict(head_dim=32, num_heads=4, use_gate=False, use_short_conv=False)),
        "gdn-unfused": ("gated_deltanet", dict(head_dim=32, num_heads=4, fuse_norm=False)),
    }


def build(out):
    import torch
    from fla.models import GatedDeltaNetConfig, GatedDeltaNetForCausalLM, GLAConfig, GLAForCausalLM

    torch.manual_seed(0)
    prompt = [int(t) for t in np.random.RandomState(7).randint(0, 256, T)]
    report = {}
    for name, (mt, kw) in variants().items():
        common = dict(vocab_size=VOCAB, hidden_size=D, num_hidden_layers=L, bos_token_id=256, eos_token_id=257,
                      initializer_range=0.1)
        if mt == "gla":
            cfg = GLAConfig(num_heads=H, **common, **kw)
            model = GLAForCausalLM(cfg)
        else:
            cfg = GatedDeltaNetConfig(**common, **kw)
            model = GatedDeltaNetForCausalLM(cfg)
        model = model.cuda().float().eval()
        # FLA's models name tied weights in a list; transformers 5 reads a dict {target: source}
        for mod in model.modules():
            t = getattr(mod, "_tied_weights_keys", None)
            if isinstance(t, list):
                mod._tied_weights_keys = {k: "model.embeddings.weight" for k in t}
        d = os.path.join(out, name)
        model.save_pretrained(d, safe_serialization=True)
        with torch.no_grad():
            logits = model(torch.tensor([prompt], device="cuda")).logits[0].float().cpu().numpy()
        logits.astype("<f4").tofile(os.path.join(out, name + ".fla.f32"))
        with open(os.path.join(out, name + ".prompt"), "w") as f:
            f.write(" ".join(map(str, prompt)))
        report[name] = {"model_type": mt, "keys": kw}
        print("built", name, file=sys.stderr)
    with open(os.path.join(out, "variants.json"), "w") as f:
        json.dump(report, f, indent=1)


def compare(out):
    rows = {}
    for name in variants():
        a = os.path.join(out, name + ".fla.f32")
        b = os.path.join(out, name + ".hyla.f32")
        if not (os.path.exists(a) and os.path.exists(b)):
            rows[name] = "missing"
            continue
        x = np.fromfile(a, "<f4").reshape(-1, VOCAB)
        y = np.fromfile(b, "<f4").reshape(-1, VOCAB)[: x.shape[0]]
        diff = np.abs(x - y)
        rows[name] = {"max_abs": float(diff.max()), "max_rel": float((diff / (np.abs(x) + 1e-3)).max()),
                      "argmax_agree": float((x.argmax(1) == y.argmax(1)).mean()), "logit_scale": float(np.abs(x).max())}
    print(json.dumps(rows, indent=1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--compare", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    compare(a.out) if a.compare else build(a.out)


if __name__ == "__main__":
    main()
