#!/usr/bin/env python3
"""make_tiny.py: writes tiny random hyla models (config.json + safetensors) with numpy only.

An independent writer of the format in docs/MODELS.md, used to develop and self-test the
PyTorch reference and to build conformance fixtures for configurations hyla-mkmodel's CLI
cannot express (short conv on GLA, no output gate, bf16/fp16 weights, sharded files, GQA with
qkv bias and qk_norm, K=2 routing, lora_target "sparse", a list of attn specs ...).

Weights come from numpy's legacy RandomState (MT19937), whose stream is stable across numpy
versions, drawn in a fixed order, so the same preset and seed give the same bytes anywhere.

  make_tiny.py --preset NAME --out DIR [--seed S] [--dtype F32|BF16|F16] [--shards N]
  make_tiny.py --list
"""
import argparse
import copy
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_np import write_safetensors  # noqa: E402

BASE = {"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 260, "num_heads": 4,
        "hidden_ratio": 4, "intermediate_size": 128, "hidden_act": "swish", "norm_eps": 1e-6,
        "tie_word_embeddings": False, "bos_token_id": 256, "eos_token_id": 257}

PRESETS = {
    # stand-ins for hyla-mkmodel's arches (development before it existed)
    "gla": {"model_type": "gla", "expand_k": 0.5, "expand_v": 1.0, "use_output_gate": True,
            "use_short_conv": False, "gate_low_rank_dim": 16, "gate_logit_normalizer": 16},
    "gdn": {"model_type": "gated_deltanet", "head_dim": 16, "expand_v": 2, "use_gate": True,
            "use_short_conv": True, "conv_size": 4},
    "transformer": {"model_type": "transformer", "num_heads": 4, "num_kv_heads": 2},
    "sse": {"model_type": "sse", "head_dim": 16, "expand_v": 1.0, "num_sparse_partition": 4,
            "num_writer": 1, "num_reader": 1, "sse_transition": "gla", "lora_rank": 8},
    "sse-gdn": {"model_type": "sse", "head_dim": 16, "expand_v": 1.0, "num_sparse_partition": 4,
                "num_writer": 1, "num_reader": 1, "sse_transition": "gdn", "lora_rank": 8},
    "sse-h": {"model_type": "sse", "num_hidden_layers": 3, "head_dim": 16, "num_sparse_partition": 4,
              "num_writer": 1, "num_reader": 1, "sse_transition": "gla", "lora_rank": 8,
              "attn": {"layers": [2], "num_heads": 4, "num_kv_heads": 2, "window_size": 24, "rope_theta": 10000}},
    "gla-h": {"model_type": "gla", "num_hidden_layers": 3,
              "attn": {"layers": [1], "num_heads": 4, "num_kv_heads": 4, "window_size": None, "rope_theta": 10000}},
    # extra coverage of keys hyla-mkmodel does not expose
    "x-gla-conv": {"model_type": "gla", "expand_k": 0.5, "expand_v": 1.0, "use_output_gate": False,
                   "use_short_conv": True, "conv_size": 4, "clamp_min": -0.05, "gate_low_rank_dim": 8},
    "x-gdn-plain": {"model_type": "gated_deltanet", "head_dim": 16, "expand_v": 1, "use_gate": False,
                    "use_short_conv": False, "allow_neg_eigval": True},
    "x-transformer": {"model_type": "transformer", "num_heads": 4, "num_kv_heads": 1, "qkv_bias": True,
                      "qk_norm": True, "window_size": 20, "rope_theta": 500.0, "tie_word_embeddings": True},
    "x-sse-sparse": {"model_type": "sse", "num_hidden_layers": 3, "head_dim": 16, "expand_v": 2.0,
                     "num_sparse_partition": 6, "num_writer": 2, "num_reader": 2, "sse_transition": "gla",
                     "lora_rank": 8, "lora_target": "sparse", "use_q_softmax": True, "gate_low_rank_dim": 8,
                     "attn": [{"layers": [1], "num_heads": 2, "num_kv_heads": 1, "window_size": 16,
                               "rope_theta": 10000, "qkv_bias": True}]},
    "x-sse-gdn-k2": {"model_type": "sse", "head_dim": 16, "expand_v": 1.0, "num_sparse_partition": 4,
                     "num_writer": 2, "num_reader": 2, "sse_transition": "gdn", "lora_rank": 4,
                     "use_output_gate": False},
}


def config_for(preset, layers=None, hidden=None, heads=None, vocab=None):
    c = dict(BASE)
    c.update(copy.deepcopy(PRESETS[preset]))
    for k, v in (("num_hidden_layers", layers), ("hidden_size", hidden), ("num_heads", heads), ("vocab_size", vocab)):
        if v is not None:
            c[k] = v
    return c


def attn_specs(cfg):
    a = cfg.get("attn")
    return [] if a is None else (a if isinstance(a, list) else [a])


def tensor_list(cfg):
    """[(name, shape, kind)] in a fixed order; kind picks the initialiser."""
    D, V, L, H = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"], cfg["num_heads"]
    F = cfg.get("intermediate_size") or 256 * ((int(D * cfg.get("hidden_ratio", 4) * 2 / 3) + 255) // 256)
    mt = cfg["model_type"]
    out = [("model.embeddings.weight", (V, D), "emb")]
    attn_of = {}
    for s in attn_specs(cfg):
        for i in s["layers"]:
            attn_of[i] = s
    for i in range(L):
        p = "model.layers.%d." % i
        a = p + "attn."
        out.append((p + "attn_norm.weight", (D,), "norm"))
        if mt == "transformer" or i in attn_of:
            s = cfg if mt == "transformer" else attn_of[i]
            Hq = s["num_heads"]
            Hk = s.get("num_kv_heads") or Hq
            hd = D // Hq
            out += [(a + "q_proj.weight", (Hq * hd, D), "lin"), (a + "k_proj.weight", (Hk * hd, D), "lin"),
                    (a + "v_proj.weight", (Hk * hd, D), "lin")]
            if s.get("qkv_bias"):
                out += [(a + n + "_proj.bias", (h * hd,), "bias") for n, h in (("q", Hq), ("k", Hk), ("v", Hk))]
            out.append((a + "o_proj.weight", (D, Hq * hd), "lin"))
            if mt == "transformer" and s.get("qk_norm"):
                out += [(a + "q_norm.weight", (hd,), "norm"), (a + "k_norm.weight", (hd,), "norm")]
        elif mt == "gla":
            dk, dv = int(D * cfg.get("expand_k", 0.5)) // H, int(D * cfg.get("expand_v", 1.0)) // H
            r = cfg.get("gate_low_rank_dim", 16)
            out += [(a + "q_proj.weight", (H * dk, D), "lin"), (a + "k_proj.weight", (H * dk, D), "lin"),
                    (a + "v_proj.weight", (H * dv, D), "lin"), (a + "gk_proj.0.weight", (r, D), "lin"),
                    (a + "gk_proj.1.weight", (H * dk, r), "lin"), (a + "gk_proj.1.bias", (H * dk,), "gkbias")]
            if cfg.get("use_output_gate", True):
                out += [(a + "g_proj.weight", (H * dv, D), "lin"), (a + "g_norm_swish_gate.weight", (dv,), "norm")]
            else:
                out.append((a + "g_norm.weight", (dv,), "norm"))
            out.append((a + "o_proj.weight", (D, H * dv), "lin"))
            if cfg.get("use_short_conv", False):
                K = cfg.get("conv_size", 4)
                out += [(a + n + "_conv1d.weight", (c, 1, K), "conv") for n, c in (("q", H * dk), ("k", H * dk), ("v", H * dv))]
        elif mt == "gated_deltanet":
            dk = cfg.get("head_dim", 256)
            dv = int(dk * cfg.get("expand_v", 2))
            out += [(a + "q_proj.weight", (H * dk, D), "lin"), (a + "k_proj.weight", (H * dk, D), "lin"),
                    (a + "v_proj.weight", (H * dv, D), "lin"), (a + "a_proj.weight", (H, D), "lin"),
                    (a + "b_proj.weight", (H, D), "lin"), (a + "A_log", (H,), "alog"), (a + "dt_bias", (H,), "dtbias")]
            if cfg.get("use_short_conv", True):
                K = cfg.get("conv_size", 4)
                out += [(a + n + "_conv1d.weight", (c, 1, K), "conv") for n, c in (("q", H * dk), ("k", H * dk), ("v", H * dv))]
            if cfg.get("use_gate", True):
                out.append((a + "g_proj.weight", (H * dv, D), "lin"))
            out += [(a + "o_norm.weight", (dv,), "norm"), (a + "o_proj.weight", (D, H * dv), "lin")]
        elif mt == "sse":
            dk = cfg.get("head_dim", 64)
            dv = int(dk * cfg.get("expand_v", 1.0))
            N = cfg.get("num_sparse_partition", 4)
            lr = cfg.get("lora_rank") or dv
            r = cfg.get("gate_low_rank_dim", 16)
            out += [(a + "q_proj.weight", (H * dk, D), "lin"), (a + "k_proj.weight", (H * dk, D), "lin"),
                    (a + "v_proj.weight", (H * dv, D), "lin"),
                    (a + "lora_q_proj.0.weight", (lr, D), "lin"), (a + "lora_q_proj.1.weight", (H * dk, lr), "lin"),
                    (a + "lora_k_proj.0.weight", (lr, D), "lin"), (a + "lora_k_proj.1.weight", (H * dk, lr), "lin"),
                    (a + "e_proj.weight", (N, D), "router")]
            if cfg.get("sse_transition", "gla") == "gla":
                for j in (0, 1):
                    out += [(a + "gk_proj.%d.0.weight" % j, (r, D), "lin"), (a + "gk_proj.%d.1.weight" % j, (H * dk, r), "lin"),
                            (a + "gk_proj.%d.1.bias" % j, (H * dk,), "gkbias")]
            else:
                out += [(a + "a_proj.weight", (2 * H, D), "lin"), (a + "b_proj.weight", (2 * H, D), "lin"),
                        (a + "A_log", (2 * H,), "alog"), (a + "dt_bias", (2 * H,), "dtbias")]
            if cfg.get("use_output_gate", True):
                out += [(a + "g_proj.0.weight", (dv, D), "lin"), (a + "g_proj.1.weight", (H * dv, dv), "lin")]
            out += [(a + "o_norm.weight", (dv,), "norm"), (a + "o_proj.weight", (D, H * dv), "lin")]
        else:
            raise ValueError("unknown model_type %r" % mt)
        out += [(p + "mlp_norm.weight", (D,), "norm"), (p + "mlp.gate_proj.weight", (F, D), "lin"),
                (p + "mlp.up_proj.weight", (F, D), "lin"), (p + "mlp.down_proj.weight", (D, F), "lin")]
    out.append(("model.norm.weight", (D,), "norm"))
    if not cfg.get("tie_word_embeddings", False):
        out.append(("lm_head.weight", (V, D), "lin"))
    return out


def init_tensor(rng, shape, kind):
    n = int(np.prod(shape))
    if kind == "emb":
        a = rng.standard_normal(n)
    elif kind == "norm":
        a = 1.0 + 0.1 * rng.standard_normal(n)
    elif kind == "lin":
        a = rng.standard_normal(n) / np.sqrt(shape[-1])
    elif kind == "router":  # confident routing: larger logits, wider top-K margins
        a = 3.0 * rng.standard_normal(n) / np.sqrt(shape[-1])
    elif kind == "bias":
        a = 0.1 * rng.standard_normal(n)
    elif kind == "gkbias":
        a = rng.uniform(-1.0, 3.0, n)
    elif kind == "alog":
        a = np.log(rng.uniform(1.0, 16.0, n))
    elif kind == "dtbias":
        dt = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), n))
        a = dt + np.log(-np.expm1(-dt))  # inverse softplus
    elif kind == "conv":
        a = rng.standard_normal(n) / np.sqrt(shape[-1])
    else:
        raise ValueError(kind)
    return a.reshape(shape).astype(np.float32)


def make(preset, out, seed=0, dtype="F32", shards=1, **dims):
    cfg = config_for(preset, **dims)
    rng = np.random.RandomState(seed)
    tensors = [(n, init_tensor(rng, s, k)) for n, s, k in tensor_list(cfg)]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    if shards <= 1:
        write_safetensors(os.path.join(out, "model.safetensors"), tensors, dtype)
    else:
        wm = {}
        per = (len(tensors) + shards - 1) // shards
        for s in range(shards):
            fn = "model-%05d-of-%05d.safetensors" % (s + 1, shards)
            part = tensors[s * per:(s + 1) * per]
            write_safetensors(os.path.join(out, fn), part, dtype)
            for n, _ in part:
                wm[n] = fn
        with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": wm}, f, indent=2)
    return cfg


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset")
    ap.add_argument("--out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="F32", choices=["F32", "BF16", "F16"])
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--hidden", type=int)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--vocab", type=int)
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args()
    if a.list:
        print("\n".join(PRESETS))
        return
    if not a.preset or not a.out:
        ap.error("--preset and --out are required")
    make(a.preset, a.out, a.seed, a.dtype, a.shards, layers=a.layers, hidden=a.hidden, heads=a.heads, vocab=a.vocab)


if __name__ == "__main__":
    sys.exit(main())
