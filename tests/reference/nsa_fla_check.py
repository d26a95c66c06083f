#!/usr/bin/env python3
"""nsa_fla_check.py: a `model_type: "nsa"` checkpoint saved by flash-linear-attention itself,
run by FLA and by hyla-run, compared.

Needs torch, transformers, einops and FLA's source on PYTHONPATH (the GPU machine), and hyla-run:

    PYTHONPATH=/path/to/fla python3 tests/reference/nsa_fla_check.py --out DIR --hyla-run build/bin/hyla-run

Builds a tiny random model with FLA's NSAConfig / NSAForCausalLM (2 layers, hidden 256, 16 query
heads sharing 1 KV head of 32 dims: FLA's kernels need a query group of at least 16; blocks of
16, 4 selected, window 32; vocabulary 260) in float32 and saves it with save_pretrained. Then:

  - FLA, reference path: the model's forward with its `parallel_nsa` call replaced by FLA's naive
    NSA (fla/ops/nsa/naive.py: compression, top-k, selection) plus the window branch in plain
    torch (FLA's naive and parallel code call flash-attn for it, which the machine lacks);
  - FLA, parallel path: the model as saved, Triton `parallel_nsa` (the window branch again in
    plain torch), when Triton runs;
  - hyla-run --device cpu and --device cuda:0 on the unchanged directory.

Then, to explain how far hyla's GPU run is from FLA (the CUDA backend keeps bf16 weights, rounds
each linear's input to bf16 and caches bf16 keys and values; the CPU keeps fp32): FLA's reference
path again with (a) the weights rounded to bf16, (b) that plus every linear's input and the keys
and values rounded to bf16 (an emulation of hyla's CUDA numerics), (c) the whole model in bf16,
and FLA's Triton path with (c); each against the fp32 reference and against hyla's GPU logits,
with the block selections of every layer, token and KV head compared to the fp32 reference's
(selection flips); and hyla-run on the checkpoint saved in bf16, on both devices.

For each it compares the logits of a 100-token prompt (hyla-run --dump-logits) against the
reference path: max |diff|, that over max |logit|, and how many positions agree on the argmax;
and 16 greedy tokens (hyla-run --ids; FLA by re-running the whole sequence each step). Prints
one JSON line per comparison as soon as it is made (hyla-run first, then FLA's slower paths) and
writes them to DIR/nsa_fla_check.jsonl. Exits 1 when the CPU logits are off by more than 1e-3
relative or a greedy stream of the CPU differs.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

VOCAB, T, STEPS = 260, 100, 16
CFG = dict(hidden_size=256, num_hidden_layers=2, num_heads=16, num_kv_heads=1, head_dim=32, block_size=16,
           block_counts=4, window_size=32, vocab_size=VOCAB, bos_token_id=256, eos_token_id=257,
           fuse_cross_entropy=False, initializer_range=0.1)


def swa_torch(q, k, v, causal=True, window_size=(-1, 0), **kw):
    """flash_attn_func's causal sliding window (GQA) in plain torch, float32."""
    import torch
    B, Tq, HQ, K = q.shape
    G = HQ // k.shape[2]
    kk, vv = (x.float().repeat_interleave(G, dim=2) for x in (k, v))
    s = torch.einsum("bthd,bshd->bhts", q.float(), kk) * (K ** -0.5)
    i = torch.arange(Tq, device=q.device)[:, None] + (k.shape[1] - Tq)
    j = torch.arange(k.shape[1], device=q.device)[None, :]
    allow = (j <= i) & (j >= i - window_size[0])
    s = s.masked_fill(~allow, float("-inf"))
    return torch.einsum("bhts,bshd->bthd", torch.softmax(s, -1), vv).to(q.dtype)


SEL = None       # a list: naive_parallel_nsa appends each layer's sorted block indices to it
KV_BF16 = False  # naive_parallel_nsa rounds k and v to bf16 first (hyla's CUDA KV cache)


def naive_parallel_nsa(q, k, v, g_cmp=None, g_slc=None, g_swa=None, block_size=64, block_counts=16,
                       window_size=0, cu_seqlens=None, **kw):
    """FLA's naive NSA (its own compression, top-k and selection code), the signature of parallel_nsa."""
    import torch
    from fla.ops.nsa.naive import naive_nsa_compression, naive_nsa_selection, naive_nsa_topk
    assert cu_seqlens is None
    if KV_BF16:
        k, v = k.to(torch.bfloat16), v.to(torch.bfloat16)
    B, Tn, H, K = k.shape
    scale = K ** -0.5
    nb = (Tn + block_size - 1) // block_size
    pad = nb * block_size - Tn
    # mean pooling of complete blocks (a partial last block is never visible to a query)
    k_cmp, v_cmp = (torch.nn.functional.pad(x.float(), (0, 0, 0, 0, 0, pad)).view(B, nb, block_size, H, K).mean(2)
                    for x in (k, v))
    o_cmp, _ = naive_nsa_compression(q.float(), k_cmp, v_cmp, block_size, scale)
    idx = naive_nsa_topk(q.float(), k_cmp, block_counts, block_size, scale)
    if SEL is not None:
        SEL.append(idx.sort(-1).values.cpu())
    o = naive_nsa_selection(q.float(), k.float(), v.float(), idx, block_size, scale) * g_slc.unsqueeze(-1)
    o = o + o_cmp * g_cmp.unsqueeze(-1)
    if window_size and window_size > 0:
        o = o + swa_torch(q.float(), k.float(), v.float(), window_size=(window_size - 1, 0)) * g_swa.unsqueeze(-1)
    return o.to(q.dtype)


def fla_logits(model, ids, dev):
    import torch
    with torch.no_grad():
        return model(torch.tensor([ids], device=dev)).logits[0].float().cpu().numpy()


def fla_greedy(model, ids, dev, steps):
    out, seq = [], list(ids)
    for _ in range(steps):
        t = int(np.argmax(fla_logits(model, seq, dev)[-1]))
        out.append(t)
        seq.append(t)
    return out


def variant(model, ids, dev, lin_bf16=False, kv_bf16=False, greedy=0):
    """FLA's logits (and `greedy` tokens) with every F.linear input and/or the NSA keys and values
    rounded to bf16; returns (logits, selections of the prompt's forward, greedy ids)."""
    import torch
    import torch.nn.functional as F
    global SEL, KV_BF16
    orig = F.linear
    if lin_bf16:
        F.linear = lambda x, w, b=None: orig(x.to(torch.bfloat16).to(x.dtype), w, b)
    SEL, KV_BF16 = [], kv_bf16
    try:
        lg = fla_logits(model, ids, dev)
        sel, SEL = SEL, None
        ids_out = fla_greedy(model, ids, dev, greedy) if greedy else None
    finally:
        F.linear, SEL, KV_BF16 = orig, None, False
    return lg, sel, ids_out


def flips(ref_sel, sel):
    """(layer, token, KV head) rows whose selected block set differs from the reference's."""
    n = tot = 0
    first = None
    for a, b in zip(ref_sel, sel):
        d = (a != b).any(-1)[0]  # [T, H]
        n += int(d.sum())
        tot += d.numel()
        t = d.any(-1).nonzero()
        if len(t) and (first is None or int(t[0]) < first):
            first = int(t[0])
    return {"selection_rows": tot, "selection_flips": n, "first_flip_position": first}


def hyla(run, model_dir, ids, device, out, tag=""):
    dump = os.path.join(out, "hyla%s.%s.f32" % (tag, device.replace(":", "")))
    base = [run, "--model", model_dir, "--prompt-ids", " ".join(map(str, ids)), "--device", device, "--quiet"]
    r = subprocess.run(base + ["--max-tokens", "1", "--dump-logits", dump], capture_output=True, text=True)
    if r.returncode:
        return None, None, r.stderr.strip()[-400:]
    logits = np.fromfile(dump, dtype="<f4").reshape(-1, VOCAB)
    r = subprocess.run(base + ["--max-tokens", str(STEPS), "--ids", "--ignore-eos"], capture_output=True, text=True)
    if r.returncode:
        return logits, None, r.stderr.strip()[-400:]
    return logits, [int(x) for x in r.stdout.split()], None


def compare(name, ref, ref_ids, got, got_ids, err):
    row = {"check": name}
    if err:
        row["error"] = err
    if got is not None:
        n = min(len(ref), len(got))
        d = np.abs(ref[:n].astype(np.float64) - got[:n])
        row.update(positions=int(n), max_abs=float(d.max()), max_rel=float(d.max() / np.abs(ref[:n]).max()),
                   argmax_agree=int((ref[:n].argmax(-1) == got[:n].argmax(-1)).sum()))
    if got_ids is not None and ref_ids is not None:
        div = next((i for i, (a, b) in enumerate(zip(ref_ids, got_ids)) if a != b), None)
        row.update(greedy_equal=got_ids == ref_ids, first_divergence=div, greedy=got_ids)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--hyla-run", required=True)
    ap.add_argument("--devices", default="cpu,cuda:0")
    a = ap.parse_args()
    import torch
    import fla.layers.nsa as fla_nsa_layer
    import fla.ops.nsa.parallel as fla_parallel
    from fla.models import NSAConfig, NSAForCausalLM

    os.makedirs(a.out, exist_ok=True)
    t0 = time.time()
    jl = open(os.path.join(a.out, "nsa_fla_check.jsonl"), "w")

    def emit(row):  # each row as soon as it exists: a time limit keeps what was done
        row["t_s"] = round(time.time() - t0, 1)
        print(json.dumps(row), flush=True)
        jl.write(json.dumps(row) + "\n")
        jl.flush()

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = NSAForCausalLM(NSAConfig(**CFG)).float().eval().to(dev)
    # FLA's models name tied weights in a list; transformers 5 reads a dict {target: source}
    for mod in model.modules():
        t = getattr(mod, "_tied_weights_keys", None)
        if isinstance(t, list):
            mod._tied_weights_keys = {k: "model.embeddings.weight" for k in t}
    mdir = os.path.join(a.out, "nsa-fla")
    model.save_pretrained(mdir, safe_serialization=True)
    with open(os.path.join(mdir, "config.json")) as f:
        saved = json.load(f)
    emit({"check": "saved", "model_type": saved.get("model_type"), "keys": sorted(saved)})
    ids = [int(t) for t in np.random.RandomState(7).randint(0, 256, T)]

    # hyla first (seconds): its outputs exist even if FLA's slower paths run out of time
    got = {d: hyla(a.hyla_run, mdir, ids, d, a.out) for d in [x for x in a.devices.split(",") if x]}
    emit({"check": "hyla-run", "ok": {d: g[2] is None for d, g in got.items()},
          "errors": {d: g[2] for d, g in got.items() if g[2]}})

    real_parallel = fla_nsa_layer.parallel_nsa
    fla_nsa_layer.parallel_nsa = naive_parallel_nsa
    ref = fla_logits(model, ids, dev)
    bad = False
    for d, (lg, _, err) in got.items():  # logits first, greedy below
        row = compare("hyla-run --device %s vs FLA reference: prompt logits" % d, ref, None, lg, None, err)
        emit(row)
        if d == "cpu":
            bad |= bool(err) or row.get("max_rel", 1) > 1e-3
    ref_ids = fla_greedy(model, ids, dev, STEPS)
    emit({"check": "fla_reference greedy", "greedy": ref_ids})
    for d, (_, gi, err) in got.items():
        row = compare("hyla-run --device %s vs FLA reference: greedy" % d, ref, ref_ids, None, gi, err)
        emit(row)
        if d == "cpu":
            bad |= not row.get("greedy_equal", False)

    # bf16: how far rounding alone moves FLA's own reference path (naive NSA, fp32 arithmetic)
    import copy
    _, ref_sel, _ = variant(model, ids, dev)
    gpu = got.get("cuda:0", (None, None, "not run"))
    m_w = copy.deepcopy(model)
    for prm in m_w.parameters():
        prm.data = prm.data.to(torch.bfloat16).float()
    m_b = copy.deepcopy(model).to(torch.bfloat16)
    studies = [("FLA reference, weights rounded to bf16", m_w, dict()),
               ("FLA reference, hyla-CUDA emulation (bf16 weights, linear inputs, k and v)", m_w,
                dict(lin_bf16=True, kv_bf16=True, greedy=STEPS)),
               ("FLA reference, model in bf16", m_b, dict())]
    emul = None
    for name, mdl, kw in studies:
        try:
            lg, sel, gi = variant(mdl, ids, dev, **kw)
        except Exception as e:  # noqa: BLE001
            emit({"check": name, "error": repr(e)[:400]})
            continue
        row = compare(name + " vs fp32 reference", ref, ref_ids if gi else None, lg, gi, None)
        row.update(flips(ref_sel, sel))
        emit(row)
        if gpu[0] is not None:
            emit(compare("hyla-run --device cuda:0 vs " + name, lg, gi, gpu[0], gpu[1], None))
        if kw.get("lin_bf16"):
            emul = lg
    # the checkpoint saved in bf16, run by hyla on both devices
    mdir_b = os.path.join(a.out, "nsa-fla-bf16")
    m_b.save_pretrained(mdir_b, safe_serialization=True)
    got_b = {d: hyla(a.hyla_run, mdir_b, ids, d, a.out, ".bf16") for d in got}
    for d, (lg, gi, err) in got_b.items():
        emit(compare("hyla-run --device %s, bf16 checkpoint, vs fp32 reference" % d, ref, ref_ids, lg, gi, err))
        if got[d][0] is not None and lg is not None:
            emit(compare("hyla-run --device %s, bf16 checkpoint, vs the fp32 checkpoint on %s" % (d, d), got[d][0],
                         got[d][1], lg, gi, None))
    if emul is not None and "cpu" in got_b and got_b["cpu"][0] is not None:
        emit(compare("hyla-run --device cpu, bf16 checkpoint, vs the hyla-CUDA emulation", emul, None,
                     got_b["cpu"][0], None, None))

    fla_parallel.flash_attn_func = swa_torch  # flash-attn is not installed: the window in plain torch
    fla_nsa_layer.parallel_nsa = real_parallel
    if dev == "cuda":
        for name, mdl in (("fla_parallel_nsa (Triton, fp32)", model), ("fla_parallel_nsa (Triton, bf16 model)", m_b)):
            try:
                par = fla_logits(mdl, ids, dev)
                emit(compare(name + " vs reference: prompt logits", ref, None, par, None, None))
                if gpu[0] is not None and mdl is m_b:
                    emit(compare("hyla-run --device cuda:0 vs " + name, par, None, gpu[0], None, None))
                emit(compare(name + " vs reference: greedy", ref, ref_ids, None, fla_greedy(mdl, ids, dev, STEPS),
                             None))
            except Exception as e:  # noqa: BLE001 (Triton may fail to compile on a machine)
                emit({"check": name + " vs reference", "error": repr(e)[:400]})
    jl.close()
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
