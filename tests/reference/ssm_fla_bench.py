#!/usr/bin/env python3
"""ssm_fla_bench.py: the peers of `hyla-bench kernels --only mamba2|statex` timed on the same
shapes on the GPU, one JSON line per measurement (like hyla-bench's), printed as soon as made:

  copy_bandwidth     a 1 GiB device-to-device copy (torch), bytes read + written;
  fla_ssd_prefill    flash-linear-attention's `chunk_simple_gla` (scalar per-head decay: the
                     SSD core of Mamba2 with q = C, k = B, v = dt'*x, g = a, scale 1), one
                     sequence of T tokens, 64 heads, head dim 64, state N (128; 512 for StateX),
                     fp32 and bf16 inputs (g and the states fp32); "core" = the kernel on prepared
                     operands, "with_prep" = also softplus/clamp of dt, a = -exp(A_log)*dt', v,
                     B and C broadcast to the heads and the D skip, in torch (what hyla's
                     ssd_prefill op does in one call);
  fla_ssd_decode     `fused_recurrent_simple_gla` with T = 1 over B sessions (fp32 state read
                     and the final state written), GB/s of the states + q, k, v, o;
  fla_gla_prefill /  `chunk_gla` / `fused_recurrent_gla` at H 4, dk 256, dv 512 and StateX's
  fla_gla_decode     merged H 1, dk 1024, dv 2048;
  hf_mamba2_mixer    transformers' Mamba2Mixer (Mamba2-1.3B: hidden 2048, 64 heads of 64, state
                     128, one group), one forward over T tokens; the row says which path it took
                     (mamba_ssm / causal_conv1d present or not: without them transformers runs
                     its pure-torch `torch_forward`).

Each shape is called once untimed (Triton compiles and autotunes there), then timed with CUDA
events (median of several calls). A shape that fails gives a row with "error".

    PYTHONPATH=/path/to/fla python3 tests/reference/ssm_fla_bench.py [--prefill 4096,16384]
        [--batch 1,16,64,256] [--skip-hf] [--only all|statex|statex-ssd]
"""
import argparse
import importlib.util
import json

from cuda_timing import warm_then_median

H, P, G = 64, 64, 1
GPU = ""


def emit(row):
    print(json.dumps(row), flush=True)


def timed(fn, reps):
    """Median ms of `reps` calls after one untimed call (compilation and autotuning)."""
    return warm_then_median(fn, reps)[1]


def guarded(bench, fields, measure):
    """measure() -> dict of results; errors become a row with "error"."""
    import torch
    row = {"bench": bench, "gpu": GPU}
    row.update(fields)
    try:
        row.update(measure())
    except Exception as e:  # noqa: BLE001 (out of memory, a Triton failure, a shape FLA refuses)
        row["error"] = repr(e)[:300]
    torch.cuda.empty_cache()
    emit(row)
    return row


def main():
    global GPU
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prefill", default="4096,16384")
    ap.add_argument("--batch", default="1,16,64,256")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--only", choices=("all", "statex", "statex-ssd"), default="all",
                    help="statex: only StateX's expanded shapes (GLA dk 1024, Mamba2 state 512); "
                         "statex-ssd: only Mamba2 at state 512")
    a = ap.parse_args()
    prefill = [int(x) for x in a.prefill.split(",") if x]
    batches = [int(x) for x in a.batch.split(",") if x]
    import torch
    import torch.nn.functional as F
    GPU = torch.cuda.get_device_name(0)
    dev, f32 = "cuda", torch.float32
    torch.manual_seed(0)
    emit({"bench": "versions", "gpu": GPU, "torch": torch.__version__,
          "mamba_ssm": importlib.util.find_spec("mamba_ssm") is not None,
          "causal_conv1d": importlib.util.find_spec("causal_conv1d") is not None})

    # copy rate
    def copy():
        n = 1 << 28
        x, y = torch.empty(n, device=dev, dtype=f32), torch.empty(n, device=dev, dtype=f32)
        ms = timed(lambda: y.copy_(x), 10)
        return {"ms": ms, "gbps": 2 * 4 * n / (ms * 1e-3) / 1e9}
    guarded("copy_bandwidth", {"mb": 4 * (1 << 28) / 1e6}, copy)

    from fla.ops.gla import chunk_gla, fused_recurrent_gla
    from fla.ops.simple_gla import chunk_simple_gla, fused_recurrent_simple_gla

    def ssd_decode(N, B):
        def m():
            q = torch.rand(B, 1, H, N, device=dev, dtype=f32) * 2 - 1
            k = torch.rand(B, 1, H, N, device=dev, dtype=f32) * 2 - 1
            v = torch.rand(B, 1, H, P, device=dev, dtype=f32) * 2 - 1
            g = -torch.rand(B, 1, H, device=dev, dtype=f32) * 0.5
            h0 = torch.randn(B, H, N, P, device=dev, dtype=f32) * 0.1
            ms = timed(lambda: fused_recurrent_simple_gla(q, k, v, g=g, scale=1.0, initial_state=h0,
                                                          output_final_state=True), 20)
            st = B * H * N * P * 4
            by = 2 * st + B * H * (2 * N + 2 * P + 1) * 4
            return {"ms": ms, "state_mb": st / 1e6, "gbps": by / (ms * 1e-3) / 1e9}
        guarded("fla_ssd_decode", {"B": B, "H": H, "P": P, "N": N}, m)

    def ssd_prefill(N, T, dt):
        def m():
            ldx = H * P + 2 * G * N
            xbc = torch.rand(T, ldx, device=dev, dtype=f32) * 2 - 1
            dtr = torch.rand(T, H, device=dev, dtype=f32) * 3 - 4
            dt_bias = torch.zeros(H, device=dev, dtype=f32)
            A_log = torch.rand(H, device=dev, dtype=f32) * 2.7
            D = torch.ones(H, device=dev, dtype=f32)
            h0 = torch.randn(1, H, N, P, device=dev, dtype=f32) * 0.1

            def prep():
                x = xbc[:, :H * P].view(1, T, H, P)
                Bm = xbc[:, H * P:H * P + G * N].view(1, T, G, 1, N).expand(1, T, G, H // G, N).reshape(1, T, H, N)
                Cm = xbc[:, H * P + G * N:].view(1, T, G, 1, N).expand(1, T, G, H // G, N).reshape(1, T, H, N)
                dtp = F.softplus(dtr + dt_bias).clamp(min=0.0).view(1, T, H)
                g = -torch.exp(A_log) * dtp
                v = x * dtp[..., None]
                return x, Cm.to(dt).contiguous(), Bm.to(dt).contiguous(), v.to(dt).contiguous(), g.contiguous()

            x, q, k, v, g = prep()
            core = timed(lambda: chunk_simple_gla(q, k, v, g=g, scale=1.0, initial_state=h0,
                                                  output_final_state=True), 5)

            def full():
                x, q, k, v, g = prep()
                y, ht = chunk_simple_gla(q, k, v, g=g, scale=1.0, initial_state=h0, output_final_state=True)
                return y.float() + D.view(1, 1, H, 1) * x
            wp = timed(full, 5)
            fl = 2 * (64 * 64 * N + 64 * N * P + 64 * 64 * P + 64 * N * P) * (T / 64) * H
            return {"ms_core": core, "ms_with_prep": wp, "tokens_per_s_core": T / (core * 1e-3),
                    "tokens_per_s_with_prep": T / (wp * 1e-3), "tflops_chunked_core": fl / (core * 1e-3) / 1e12}
        guarded("fla_ssd_prefill", {"tokens": T, "H": H, "P": P, "G": G, "N": N, "dtype": str(dt).split(".")[-1]}, m)

    def gla_prefill(Hh, dk, dv, T):
        def m():
            q = (torch.rand(1, T, Hh, dk, device=dev, dtype=f32) * 2 - 1) * 0.1
            k = (torch.rand(1, T, Hh, dk, device=dev, dtype=f32) * 2 - 1) * 0.1
            v = torch.rand(1, T, Hh, dv, device=dev, dtype=f32) * 2 - 1
            g = -(torch.rand(1, T, Hh, dk, device=dev, dtype=f32) * 0.199 + 0.001)
            h0 = torch.randn(1, Hh, dk, dv, device=dev, dtype=f32) * 0.1
            ms = timed(lambda: chunk_gla(q, k, v, g, scale=dk ** -0.5, initial_state=h0, output_final_state=True), 5)
            fl = 2 * (64 * 64 * dk + 64 * dk * dv + 64 * 64 * dv + 64 * dk * dv) * (T / 64) * Hh
            return {"ms": ms, "tokens_per_s": T / (ms * 1e-3), "tflops_chunked": fl / (ms * 1e-3) / 1e12}
        guarded("fla_gla_prefill", {"tokens": T, "H": Hh, "dk": dk, "dv": dv, "dtype": "float32"}, m)

    def gla_decode(Hh, dk, dv, B):
        def m():
            q = (torch.rand(B, 1, Hh, dk, device=dev, dtype=f32) * 2 - 1) * 0.1
            k = (torch.rand(B, 1, Hh, dk, device=dev, dtype=f32) * 2 - 1) * 0.1
            v = torch.rand(B, 1, Hh, dv, device=dev, dtype=f32) * 2 - 1
            g = -(torch.rand(B, 1, Hh, dk, device=dev, dtype=f32) * 0.199 + 0.001)
            h0 = torch.randn(B, Hh, dk, dv, device=dev, dtype=f32) * 0.1
            ms = timed(lambda: fused_recurrent_gla(q, k, v, gk=g, scale=dk ** -0.5, initial_state=h0,
                                                   output_final_state=True), 20)
            st = B * Hh * dk * dv * 4
            by = 2 * st + B * Hh * (3 * dk + 2 * dv) * 4
            return {"ms": ms, "state_mb": st / 1e6, "gbps": by / (ms * 1e-3) / 1e9}
        guarded("fla_gla_decode", {"B": B, "H": Hh, "dk": dk, "dv": dv}, m)

    # Mamba2-1.3B first (the headline shape), then StateX's shapes
    statex = a.only in ("statex", "statex-ssd")
    if not statex:
        for B in batches:
            ssd_decode(128, B)
        for T in prefill:
            ssd_prefill(128, T, torch.float32)
        for T in prefill:
            ssd_prefill(128, T, torch.bfloat16)
    gla_shapes = () if a.only == "statex-ssd" else ((1, 1024, 2048),) if statex else ((4, 256, 512), (1, 1024, 2048))
    for Hh, dk, dv in gla_shapes:
        for B in batches:
            gla_decode(Hh, dk, dv, B)
        for T in prefill:
            gla_prefill(Hh, dk, dv, T)
    for B in batches:
        ssd_decode(512, B)
    for T in prefill:
        ssd_prefill(512, T, torch.float32)
    for T in prefill if statex else ():
        ssd_prefill(512, T, torch.bfloat16)

    if a.skip_hf or statex:
        return
    # transformers' Mamba2 mixer (one layer, projections and conv included)
    for T in prefill[:1]:
        def hf():
            from transformers import Mamba2Config
            from transformers.models.mamba2 import modeling_mamba2 as mm
            cfg = Mamba2Config(hidden_size=2048, num_heads=64, head_dim=64, state_size=128, n_groups=1, expand=2,
                               num_hidden_layers=1, chunk_size=256, vocab_size=32000)
            mix = mm.Mamba2Mixer(cfg, layer_idx=0).to(dev)
            x = torch.randn(1, T, 2048, device=dev, dtype=f32)
            with torch.no_grad():
                ms = timed(lambda: mix(x), 3)
            return {"ms": ms, "tokens_per_s": T / (ms * 1e-3),
                    "fast_path": bool(getattr(mm, "is_fast_path_available", False))}
        guarded("hf_mamba2_mixer", {"tokens": T, "dtype": "float32",
                                    "what": "one Mamba2Mixer forward (in_proj, conv, SSD, gated norm, out_proj)"}, hf)


if __name__ == "__main__":
    main()
