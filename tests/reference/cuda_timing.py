"""cuda_timing.py: the peer benchmarks' timer (nsa_fla_bench.py, ssm_fla_bench.py)."""


def warm_then_median(fn, reps, warmups=1):
    """Call fn `warmups` times (Triton compiles and autotunes there), then time `reps` calls with
    CUDA events: (seconds the warm-up calls took, median ms of the timed calls)."""
    import time
    import torch
    t0 = time.time()
    for _ in range(warmups):
        fn()
    torch.cuda.synchronize()
    warm = time.time() - t0
    t = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        t.append(a.elapsed_time(b))
    return warm, sorted(t)[len(t) // 2]
