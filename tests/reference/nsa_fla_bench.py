#!/usr/bin/env python3
"""nsa_fla_bench.py: flash-linear-attention's Triton `parallel_nsa` timed at the shapes of
`hyla-bench kernels --only sparse` (the laNSA 1.4B layer: 32 query heads, 2 KV heads of 64 dims,
blocks of 64, 16 selected), in bf16 on the GPU, one JSON line per measurement (like hyla-bench's;
the median of the timed calls after two untimed ones, which compile and autotune the Triton kernels
for the shape — warmup_s says how long those took):

  prefill: one sequence of N tokens (q, k, v of N tokens);
  decode:  B sequences, one query each over a cache of ctx + 1 tokens (how FLA's NSA model
           decodes: parallel_nsa over the cached k, v, compressing every block again each step).

Window: 0 (flash-attn, which parallel_nsa calls for the window branch, is not installed on the
machine we run on; hyla's NSA is timed with window 0 too, and with 512).

    PYTHONPATH=/path/to/fla python3 tests/reference/nsa_fla_bench.py [--ctx 4096,32768,131072] [--batch 32]
"""
import argparse
import json

from cuda_timing import warm_then_median

HQ, H, D, BS, S = 32, 2, 64, 64, 16


def timed(fn, reps):
    """(seconds of the first two calls: Triton's compilation and autotuning, median ms after them)."""
    return warm_then_median(fn, reps, warmups=2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ctx", default="4096,32768,131072")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--max-prefill", type=int, default=131072)
    a = ap.parse_args()
    import torch
    from fla.ops.nsa.parallel import parallel_nsa
    gpu = torch.cuda.get_device_name(0)
    dev, dt = "cuda", torch.bfloat16
    torch.manual_seed(0)

    def run(B, TQ, TK):
        q = torch.randn(B, TQ, HQ, D, device=dev, dtype=dt)
        k = torch.randn(B, TK, H, D, device=dev, dtype=dt)
        v = torch.randn(B, TK, H, D, device=dev, dtype=dt)
        g = [torch.rand(B, TQ, HQ, device=dev, dtype=dt) for _ in range(3)]
        return lambda: parallel_nsa(q, k, v, g[0], g[1], g[2], block_size=BS, block_counts=S, window_size=0)

    for n in [int(x) for x in a.ctx.split(",") if x]:
        if n <= a.max_prefill:
            try:
                warm, ms = timed(run(1, n, n), 3 if n > 32768 else 5)
                row = {"bench": "fla_nsa_prefill", "gpu": gpu, "tokens": n, "window": 0, "ms": ms,
                       "warmup_s": round(warm, 2)}
            except Exception as e:  # noqa: BLE001 (out of memory, a Triton failure)
                row = {"bench": "fla_nsa_prefill", "gpu": gpu, "tokens": n, "error": repr(e)[:300]}
                torch.cuda.empty_cache()
            print(json.dumps(row), flush=True)
    for n in [int(x) for x in a.ctx.split(",") if x]:
        try:
            warm, ms = timed(run(a.batch, 1, n + 1), 10)
            row = {"bench": "fla_nsa_decode", "gpu": gpu, "B": a.batch, "ctx": n, "window": 0, "ms": ms,
                   "warmup_s": round(warm, 2)}
        except Exception as e:  # noqa: BLE001
            row = {"bench": "fla_nsa_decode", "gpu": gpu, "B": a.batch, "ctx": n, "error": repr(e)[:300]}
            torch.cuda.empty_cache()
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
