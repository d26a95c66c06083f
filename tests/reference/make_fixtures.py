#!/usr/bin/env python3
"""make_fixtures.py: writes the golden conformance fixtures tests/fixtures/<name>.json.

For each fixture: build a tiny model (hyla-mkmodel with fixed arguments, or a make_tiny.py
preset for configurations mkmodel's CLI cannot express), run the PyTorch reference
(hyla_ref.py, float64, token-by-token recurrence) on a fixed 80-token prompt (prefill crosses
the 64-token chunk boundary), and store the logits of every prompt position (float32,
base64) and 16 greedy tokens. The weights seed is chosen deterministically: the first of
SEEDS whose run has no fragile decision, i.e. every SSE routing (and NSA selection) decision
has a top-K margin >= MIN_ROUTE_MARGIN (fp32 cannot flip it), every DLA merge/open decision a
margin >= MIN_DLA_MARGIN (|score - tau|, and the gap between the two lowest pair densities of
a full-cache merge), every greedy step a top-2 logit gap >= MIN_GREEDY_GAP, and no eos among
the greedy tokens.

Needs torch (Debian: /usr/bin/python3 with python3-torch) and a built hyla-mkmodel:
  /usr/bin/python3 tests/reference/make_fixtures.py [--bin-dir build/bin] [--only NAME ...]
"""
import argparse
import base64
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hyla_ref as R  # noqa: E402
import make_tiny  # noqa: E402
from safetensors_np import load_model_dir, weights_digest  # noqa: E402

PROMPT = [int(t) for t in np.random.RandomState(2024).randint(0, 256, 80)]
N_GREEDY = 16
SEEDS = list(range(1, 40))
MIN_ROUTE_MARGIN = 1e-4
# DLA: a merge/open decision compares an fp32 score with tau and pair densities with each other;
# a margin of 1e-3 is far beyond the few-ulp differences between platforms and backends
MIN_DLA_MARGIN = 1e-3
MIN_GREEDY_GAP = 1e-3


def mk(arch, layers, *extra):
    return {"kind": "hyla-mkmodel", "arch": arch,
            "args": ["--arch", arch, "--layers", str(layers), "--hidden", "64", "--heads", "4", "--vocab", "260"] + list(extra)}


def tiny(preset, dtype="F32", shards=1):
    return {"kind": "make_tiny", "preset": preset, "dtype": dtype, "shards": shards}


FIXTURES = {
    "gla": (mk("gla", 2), "hyla-mkmodel GLA"),
    "gdn": (mk("gdn", 2), "hyla-mkmodel gated DeltaNet"),
    "transformer": (mk("transformer", 2), "hyla-mkmodel softmax attention, GQA 4:2"),
    "sse": (mk("sse", 3), "hyla-mkmodel SSE, GLA transition, top-1 of 4 partitions"),
    "sse-gdn": (mk("sse-gdn", 3), "hyla-mkmodel SSE, GDN transition, top-2 of 4 partitions"),
    "sse-h": (mk("sse-h", 4, "--window", "24"), "hyla-mkmodel SSE with an attention layer (layer 2), sliding window 24"),
    "gla-h": (mk("gla-h", 4), "hyla-mkmodel GLA with an attention layer (layer 2), full attention"),
    "gdn-h-bf16": (mk("gdn-h", 4, "--window", "40", "--dtype", "bf16"), "hyla-mkmodel GDN with an attention layer, window 40, BF16 weights"),
    "statex-gla": (mk("statex-gla", 4), "hyla-mkmodel StateX GLA: every layer's heads merged into one (4 expanded of 4)"),
    # sparse-attention hybrids
    "lalte": (mk("lalte", 4, "--window", "16", "--sink", "2", "--budget", "6"),
              "hyla-mkmodel laLTE: GDN and LTE layers 1:1, window 16, sink 2, budget 6 (96 tokens evict, retain and replace)"),
    "lansa": (mk("lansa", 4, "--window", "16", "--block-size", "8", "--block-counts", "4"),
              "hyla-mkmodel laNSA: GDN and NSA layers 1:1, blocks of 8, 4 selected, window 16"),
    "nsa": (mk("nsa", 2, "--window", "12", "--block-size", "4", "--block-counts", "5"),
            "hyla-mkmodel NSA (model_type nsa): blocks of 4, 5 selected, window 12"),
    # dynamic linear attention: a random model's scores crowd around sqrt(2), so a threshold there
    # puts many decisions within fp32 reach of flipping; a threshold in the upper tail (a few
    # percent of the tokens open a state, the rest merge) leaves few near it, and capacity 3 still
    # makes full-cache merges (MIN_DLA_MARGIN)
    "dla-gdn": (mk("dla-gdn", 2, "--dla-capacity", "3", "--dla-threshold", "1.5"),
                "hyla-mkmodel DLA over GDN: capacity 3, threshold 1.5"),
    "dla-mamba2": (mk("dla-mamba2", 2, "--dla-capacity", "3", "--dla-threshold", "1.47"),
                   "hyla-mkmodel DLA over Mamba2: capacity 3, threshold 1.47"),
    "x-gla-conv": (tiny("x-gla-conv", "BF16", 2), "make_tiny GLA: short conv, no output gate, clamp_min; BF16 weights in 2 shards"),
    "x-gdn-plain": (tiny("x-gdn-plain", "F16"), "make_tiny GDN: no conv, no output gate, allow_neg_eigval, expand_v 1; F16 weights"),
    "x-transformer": (tiny("x-transformer"), "make_tiny transformer: GQA 4:1, qkv bias, qk_norm, window 20, rope_theta 500, tied embeddings"),
    "x-sse-sparse": (tiny("x-sse-sparse"), "make_tiny SSE-GLA: N=6, K=2, lora_target sparse, q softmax, expand_v 2, windowed GQA attention layer with bias"),
    "x-sse-gdn-k2": (tiny("x-sse-gdn-k2"), "make_tiny SSE-GDN: N=4, K=2, lora rank 4, no output gate"),
    # Mamba2 (SSD)
    "mamba2": (mk("mamba2", 2), "hyla-mkmodel Mamba2: 4 heads of 32, 2 groups, state 128, conv bias"),
    "mamba2-h": (mk("mamba2-h", 4), "hyla-mkmodel Mamba2 with an attention layer (layer 2)"),
    "statex-mamba2": (mk("statex-mamba2", 5), "hyla-mkmodel StateX Mamba2: state 512 at layers 0-3, 128 at layer 4"),
}


def build(gen, seed, out, bin_dir):
    if gen["kind"] == "hyla-mkmodel":
        cmd = [os.path.join(bin_dir, "hyla-mkmodel")] + gen["args"] + ["--seed", str(seed), "--out", out]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        g = dict(gen)
        g["args"] = gen["args"] + ["--seed", str(seed)]
        return g
    make_tiny.make(gen["preset"], out, seed=seed, dtype=gen["dtype"], shards=gen["shards"])
    g = dict(gen)
    g["seed"] = seed
    return g


def f32b64(a):
    a = np.ascontiguousarray(a, dtype="<f4")
    return {"shape": list(a.shape), "encoding": "float32-le-base64", "data": base64.b64encode(a.tobytes()).decode()}


def run_one(name, gen, desc, bin_dir, tmp):
    for seed in SEEDS:
        mdir = os.path.join(tmp, "%s-%d" % (name, seed))
        g = build(gen, seed, mdir, bin_dir)
        model = R.Model(mdir, torch.float64)
        if model.unused:
            print("  %s: unused tensors %s" % (name, model.unused), file=sys.stderr)
        plog, greedy, gaps = R.generate(model, PROMPT, N_GREEDY, "recurrent")
        margins = model.route_margins()
        mm = min(margins) if margins else None
        eos = model.cfg.get("eos_token_id")
        why = []
        min_margin = MIN_DLA_MARGIN if name.startswith("dla-") else MIN_ROUTE_MARGIN
        if mm is not None and mm < min_margin:
            why.append("routing margin %.1e" % mm)
        if min(gaps) < MIN_GREEDY_GAP:
            why.append("greedy gap %.1e" % min(gaps))
        if eos is not None and eos in greedy:
            why.append("eos in greedy")
        if why:
            print("  %s seed %d rejected: %s" % (name, seed, ", ".join(why)))
            continue
        # agreement numbers of the reference with itself, for docs/TESTING.md
        chunked = R.Session(model).forward(PROMPT, "chunked").numpy()
        m32 = R.Model(mdir, torch.float32)
        f32 = R.Session(m32).forward(PROMPT, "recurrent").double().numpy()
        # top logit per greedy step (for the near-tie band in compare_fixture.py)
        s = R.Session(model)
        last = s.forward(PROMPT)[-1]
        top = []
        for t in greedy:
            top.append(float(last.max()))
            last = s.forward([t])[-1]
        _, w = load_model_dir(mdir)
        with open(os.path.join(mdir, "config.json")) as f:
            cfg = json.load(f)
        fx = {
            "format": "hyla-conformance-fixture", "version": 1,
            "name": name, "description": desc,
            "generator": g,
            "config": cfg,
            "mixers": model.kinds(),
            "weights_digest": weights_digest(w),
            "prompt_ids": PROMPT,
            "reference": {"impl": "tests/reference/hyla_ref.py", "torch": torch.__version__, "dtype": "float64",
                          "prefill": "recurrent (token by token)", "decode": "recurrent"},
            "logits": f32b64(plog),
            "greedy": greedy,
            "greedy_top2_gap": [round(x, 6) for x in gaps],
            "greedy_top_logit": [round(x, 6) for x in top],
            "eos_token_id": eos,
            "self_check": {
                "min_route_margin": mm,
                "chunked_vs_recurrent_max_abs": float(np.abs(chunked - plog).max()),
                "ref_fp32_vs_fp64_max_abs": float(np.abs(f32 - plog).max()),
                "max_abs_logit": float(np.abs(plog).max()),
            },
        }
        print("  %s: seed %d, greedy %s, min route margin %s, chunked-vs-recurrent %.1e, fp32-vs-fp64 %.1e"
              % (name, seed, greedy, "%.1e" % mm if mm is not None else "-", fx["self_check"]["chunked_vs_recurrent_max_abs"],
                 fx["self_check"]["ref_fp32_vs_fp64_max_abs"]))
        return fx
    raise RuntimeError("%s: no seed in %s gives a robust fixture" % (name, SEEDS))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin-dir", default=os.path.join(HERE, "..", "..", "build", "bin"))
    ap.add_argument("--out-dir", default=os.path.join(HERE, "..", "fixtures"))
    ap.add_argument("--only", nargs="*")
    a = ap.parse_args()
    torch.set_num_threads(1)
    os.makedirs(a.out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, (gen, desc) in FIXTURES.items():
            if a.only and name not in a.only:
                continue
            fx = run_one(name, gen, desc, a.bin_dir, tmp)
            p = os.path.join(a.out_dir, name + ".json")
            with open(p, "w") as f:
                json.dump(fx, f, indent=1)
                f.write("\n")
            print("wrote %s (%d bytes)" % (p, os.path.getsize(p)))


if __name__ == "__main__":
    main()
