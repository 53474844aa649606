"""What the host-time experiments (launch_replays/host_profile.py, site_host/site_host.py) share:
served vision bf16 at one batch, and per-forward times (f: a model's call, x: its inputs; us).
Run from the repository root, bench/ on the path."""
import copy
import os
import time

import torch


def served_vision():
    """(the model, a copy of it, inputs at batch $B, default 16): bench/serve_models.py's row."""
    import serve_models
    model, _, _, make_inputs = serve_models.make("vision:bf16")
    with torch.inference_mode():
        x = make_inputs(int(os.environ.get("B", "16")))
    return model, copy.deepcopy(model), x


def issue_us(f, x, n: int = 30) -> float:
    """The host's time to issue one forward: n calls back to back without waiting on the GPU,
    divided by n; the median of 7 such runs."""
    out = []
    for _ in range(7):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            f(*x)
        out.append((time.perf_counter() - t) / n * 1e6)
        torch.cuda.synchronize()
    return sorted(out)[3]


def synced_us(f, x, n: int) -> float:
    """The median of n forwards, each from an idle GPU to its end (synchronized on both sides)."""
    out = []
    for _ in range(n):
        torch.cuda.synchronize()
        t = time.perf_counter()
        f(*x)
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t) * 1e6)
    return sorted(out)[n // 2]
