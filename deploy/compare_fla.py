#!/usr/bin/env python3
"""Side by side: flash-linear-attention's Hugging Face model and hyla on the same checkpoint.

Used by deploy/compare-fla.sh on a GPU machine with torch, transformers, triton and FLA's source
on PYTHONPATH. Subcommands:

  make  --out DIR                 a random Gated DeltaNet checkpoint of the 1.68B shape (18 layers,
                                  hidden 2304, 18 heads of 128, expand_v 2, short conv, MLP 6144,
                                  vocab 32000), saved by FLA's save_pretrained in bf16
  fla   --model DIR --prefill N,... --batch B,... --out FILE
                                  FLA's timings (JSON lines like hyla-bench's): prefill of one
                                  sequence of N tokens (one forward with use_cache, logits of the
                                  last position only, after an untimed forward of the same length),
                                  decode steps of B sequences after a 16-token prompt (the model's
                                  own cache), both in bf16
  kernels --seq N,... [--profile] --out FILE
                                  FLA's chunk kernels alone (chunk_gla, chunk_gated_delta_rule): one
                                  sequence of N tokens, 18 heads, dk = dv = 128, bf16 q, k, v, fp32
                                  gates, an fp32 initial state and the final state out (the shape of
                                  `hyla-bench kernels --only seq`, whose inputs are fp32)
  table --fla FILE --hyla FILE [--png FILE]
                                  one table of both (and a plot of prefill tokens/s against length)
"""
import argparse
import json
import sys
import time


def untie_keys():
    """transformers 5 reads a model class's _tied_weights_keys as a dict {target: source}; FLA's
    classes may still declare the older list, which save_pretrained and from_pretrained then fail
    on. The checkpoint's embeddings are untied (tie_word_embeddings=False): nothing is tied."""
    from fla.models import GatedDeltaNetForCausalLM
    if isinstance(getattr(GatedDeltaNetForCausalLM, "_tied_weights_keys", None), list):
        GatedDeltaNetForCausalLM._tied_weights_keys = {}


def cmd_make(a):
    import torch
    from fla.models import GatedDeltaNetConfig, GatedDeltaNetForCausalLM
    untie_keys()
    torch.manual_seed(0)
    cfg = GatedDeltaNetConfig(hidden_size=2304, num_hidden_layers=18, num_heads=18, head_dim=128, expand_v=2,
                              use_short_conv=True, intermediate_size=6144, vocab_size=32000,
                              bos_token_id=1, eos_token_id=2, fuse_cross_entropy=False, tie_word_embeddings=False)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):  # random init on the GPU: seconds, not minutes
        m = GatedDeltaNetForCausalLM(cfg).to(torch.bfloat16)
    m.save_pretrained(a.out, safe_serialization=True)
    n = sum(p.numel() for p in m.parameters())
    print("wrote %s: %.2fB parameters" % (a.out, n / 1e9), file=sys.stderr)


def sync_time(fn, reps):
    import torch
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps


def cmd_fla(a):
    import torch
    from transformers import AutoModelForCausalLM
    import fla  # registers the model types
    untie_keys()
    m = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16).cuda().eval()
    gpu = torch.cuda.get_device_name(0)
    head = {"gpu": gpu, "fla_version": getattr(fla, "__version__", "?"), "torch": torch.__version__}
    out = open(a.out, "w")
    with torch.no_grad():
        for n in [int(x) for x in a.prefill.split(",") if x]:
            ids = torch.randint(3, 32000, (1, n), device="cuda")
            # Prefill as a server would run it: one forward over the prompt with use_cache (the
            # recurrent and conv states kept for decoding), logits of the last position only.
            # A first untimed forward at the same length compiles and autotunes the kernels.
            def fwd():
                return m(ids, use_cache=True, logits_to_keep=1)
            try:
                fwd()
                sec = sync_time(fwd, 2 if n <= 32768 else 1)
                row = dict(head, bench="fla_prefill", tokens=n, s=sec, tokens_per_s=n / sec, use_cache=True,
                           logits_to_keep=1, peak_gib=torch.cuda.max_memory_allocated() / 2**30)
            except Exception as e:  # e.g. out of memory at the longest lengths
                row = dict(head, bench="fla_prefill", tokens=n, error=str(e)[:200])
            torch.cuda.empty_cache()
            print(json.dumps(row), file=out, flush=True)
            print(json.dumps(row), file=sys.stderr, flush=True)
        for B in [int(x) for x in a.batch.split(",") if x]:
            ids = torch.randint(3, 32000, (B, 16), device="cuda")
            o = m(ids, use_cache=True, logits_to_keep=1)
            pkv, nxt = o.past_key_values, o.logits[:, -1:].argmax(-1)

            def step():
                nonlocal pkv, nxt
                r = m(nxt, past_key_values=pkv, use_cache=True)
                pkv, nxt = r.past_key_values, r.logits[:, -1:].argmax(-1)
            step()
            sec = sync_time(step, a.steps)
            row = dict(head, bench="fla_decode", B=B, ctx=16, ms_per_step=sec * 1e3, tokens_per_s=B / sec)
            print(json.dumps(row), file=out, flush=True)
            print(json.dumps(row), file=sys.stderr, flush=True)


def cmd_kernels(a):
    import torch
    import fla
    from fla.ops.gla import chunk_gla
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    H, dk, dv = 18, 128, 128
    head = {"gpu": torch.cuda.get_device_name(0), "fla_version": getattr(fla, "__version__", "?")}
    out = open(a.out, "w")
    torch.manual_seed(0)
    for n in [int(x) for x in a.seq.split(",") if x]:
        for gdn in (0, 1):
            dev, bf = "cuda", torch.bfloat16
            qs = dk ** -0.5 if gdn else 1.0  # GDN: unit-norm-ish q, k (as hyla-bench's rows)
            q = (torch.randn(1, n, H, dk, device=dev) * qs).to(bf)
            k = (torch.randn(1, n, H, dk, device=dev) * qs).to(bf)
            v = torch.randn(1, n, H, dv, device=dev).to(bf)
            s0 = torch.randn(1, H, dk, dv, device=dev) * 0.1
            if gdn:
                g = torch.empty(1, n, H, device=dev).uniform_(-0.3, -0.01)
                beta = torch.empty(1, n, H, device=dev).uniform_(0.05, 1.0).to(bf)
                fn = lambda: chunk_gated_delta_rule(q, k, v, g, beta, scale=dk ** -0.5, initial_state=s0,
                                                    output_final_state=True)
            else:
                g = torch.empty(1, n, H, dk, device=dev).uniform_(-0.2, -0.001)
                fn = lambda: chunk_gla(q, k, v, g, scale=dk ** -0.5, initial_state=s0, output_final_state=True)
            with torch.no_grad():
                for _ in range(3):  # compile and autotune
                    fn()
                ts = []
                for _ in range(5):
                    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    reps = 10
                    e0.record()
                    for _ in range(reps):
                        fn()
                    e1.record()
                    torch.cuda.synchronize()
                    ts.append(e0.elapsed_time(e1) / reps)
            ts.sort()
            row = dict(head, bench="fla_seq_gdn" if gdn else "fla_seq_gla", tokens=n, H=H, dk=dk, dv=dv,
                       ms=ts[len(ts) // 2], inputs="bf16")
            if a.profile:  # where FLA's time goes: GPU time per kernel of one call (torch.profiler)
                from torch.profiler import profile, ProfilerActivity
                with torch.no_grad(), profile(activities=[ProfilerActivity.CUDA]) as prof:
                    fn()
                    torch.cuda.synchronize()
                ks = [(e.key, e.device_time_total / 1e3) for e in prof.key_averages() if e.device_time_total > 0]
                row["kernels_ms"] = sorted(ks, key=lambda x: -x[1])[:12]
            print(json.dumps(row), file=out, flush=True)
            print(json.dumps(row), file=sys.stderr, flush=True)
            del q, k, v, g, s0
            torch.cuda.empty_cache()


def rows(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip().startswith("{")]


def short_error(r):
    """A failed point as a table cell: out of memory named as such, other errors cut short."""
    e = r.get("error")
    if not e:
        return "-"
    return "out of memory" if "out of memory" in e.lower() else e[:60]


def cmd_table(a):
    fla, hy = rows(a.fla), rows(a.hyla)
    fp = {r["tokens"]: r for r in fla if r["bench"] == "fla_prefill"}
    hp = {r["tokens"]: r for r in hy if r["bench"] == "e2e_prefill"}
    print("| | flash-linear-attention | hyla | hyla / FLA |")
    print("|---|---|---|---|")
    for n in sorted(set(fp) | set(hp)):
        f, h = fp.get(n, {}), hp.get(n, {})
        ft, ht = f.get("tokens_per_s"), h.get("tokens_per_s")
        print("| prefill %d tokens | %s | %s | %s |" % (
            n, "%.1f k tok/s" % (ft / 1e3) if ft else short_error(f), "%.1f k tok/s" % (ht / 1e3) if ht else short_error(h),
            "%.2f x" % (ht / ft) if ft and ht else "-"))
    fd = {r["B"]: r for r in fla if r["bench"] == "fla_decode"}
    hd = {r["B"]: r for r in hy if r["bench"] == "e2e_decode" and r.get("ctx") == 16 and r.get("graphs", 1) == 1}
    for B in sorted(set(fd) | set(hd)):
        f, h = fd.get(B, {}), hd.get(B, {})
        print("| decode B = %d, ctx 16 | %s | %s | %s |" % (
            B, "%.2f ms/step" % f["ms_per_step"] if f else "-", "%.2f ms/step" % h["ms_per_step"] if h else "-",
            "%.1f x faster" % (f["ms_per_step"] / h["ms_per_step"]) if f and h else "-"))
    fk = {(r["bench"][8:], r["tokens"]): r for r in fla if r["bench"].startswith("fla_seq_")}
    hk = {(r["bench"][4:], r["tokens"]): r for r in hy if r["bench"].startswith("seq_")}
    for key in sorted(set(fk) | set(hk), key=lambda t: (t[0], t[1])):
        f, h = fk.get(key, {}), hk.get(key, {})
        print("| chunked %s kernel, one sequence of %d tokens, 18 heads of 128 | %s | %s | %s |" % (
            key[0].upper(), key[1], "%.2f ms" % f["ms"] if f else "-", "%.2f ms" % h["ms"] if h else "-",
            "%.2f x FLA's time" % (h["ms"] / f["ms"]) if f and h else "-"))
    if a.png:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("(matplotlib missing: no plot)", file=sys.stderr)
            return
        fig, ax = plt.subplots(figsize=(6, 4))
        for name, d in (("flash-linear-attention", fp), ("hyla", hp)):
            xs = sorted(n for n in d if d[n].get("tokens_per_s"))
            line, = ax.plot(xs, [d[n]["tokens_per_s"] / 1e3 for n in xs], marker="o", label=name)
            for n in sorted(n for n in d if d[n].get("error")):  # a length that failed: marked on the axis
                ax.plot([n], [0], marker="x", markersize=9, color=line.get_color(), clip_on=False)
                ax.annotate("%s: %s" % ("FLA" if name.startswith("flash") else name, short_error(d[n])), (n, 0), textcoords="offset points",
                            xytext=(-4, 8), ha="right", fontsize=8, color=line.get_color())
        ax.set_xscale("log", base=2)
        ticks = sorted(set(fp) | set(hp))
        ax.set_xticks(ticks, ["%dM" % (n >> 20) if n >= 1 << 20 and n % (1 << 20) == 0 else
                              "%dk" % (n // 1024) if n >= 1024 else str(n) for n in ticks])
        ax.set_ylim(bottom=0)
        ax.set_xlabel("prompt tokens (one sequence)")
        ax.set_ylabel("prefill k tokens/s")
        ax.set_title("1.68B Gated DeltaNet, bf16, %s" % (hy[0].get("gpu", "GPU") if hy else "GPU"))
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(a.png, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sp = ap.add_subparsers(dest="cmd", required=True)
    p = sp.add_parser("make")
    p.add_argument("--out", required=True)
    p = sp.add_parser("fla")
    p.add_argument("--model", required=True)
    p.add_argument("--prefill", default="4096,32768,131072,524288,1048576")
    p.add_argument("--batch", default="1,64")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--out", required=True)
    p = sp.add_parser("kernels")
    p.add_argument("--seq", default="32768,131072")
    p.add_argument("--profile", action="store_true", help="also each kernel's GPU time in one call")
    p.add_argument("--out", required=True)
    p = sp.add_parser("table")
    p.add_argument("--fla", required=True)
    p.add_argument("--hyla", required=True)
    p.add_argument("--png")
    a = ap.parse_args()
    {"make": cmd_make, "fla": cmd_fla, "kernels": cmd_kernels, "table": cmd_table}[a.cmd](a)


if __name__ == "__main__":
    main()
