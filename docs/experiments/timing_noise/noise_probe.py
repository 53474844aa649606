"""Which of time_fn's two series (CUDA events, host drain) carries the noise of a machine's
timings of small kernels. For each held-out test task whose table's reference took under 30 us,
the task's reference (eager PyTorch, as the evaluator times it) is timed 12 times with
timing.time_fn; per task it prints the spread (max/min) of the 12 event medians, of the 12 drain
medians, of the 12 reported medians (max of the two), and how often the drain decided.

    python3 docs/experiments/timing_noise/noise_probe.py bench/results/anytime_table-*.json

Run from the repository root on a GPU machine; prints a table and the host's CPU facts.
"""
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.getcwd())
from torch_htam import timing  # noqa: E402


def tiny_tasks(files: list[str], under_ms: float = 0.03) -> list[str]:
    paths = []
    for f in files:
        for t in json.load(open(f))["tables"]:
            refs = [r["ref_ms"] for r in t["rows"] if r["ref_ms"]]
            if refs and statistics.median(refs) < under_ms:
                paths.append(f"bench/heldout/test/{t['task']}.py")
    return sorted(set(paths))


def load(path: str):
    """A KernelBench task file's model (eval, on the GPU) and its inputs (tensors moved there)."""
    ns: dict = {}
    exec(compile(open(path).read(), path, "exec"), ns)
    args = ns["get_init_inputs"]() if "get_init_inputs" in ns else []
    model = ns["Model"](*args).cuda().eval()
    return model, [x.cuda() if isinstance(x, torch.Tensor) else x for x in ns["get_inputs"]()]


def main(files: list[str]) -> None:
    print("cpus", os.cpu_count(), "load", os.getloadavg(), torch.cuda.get_device_name())
    print("| task | event max/min | drain max/min | reported max/min | drain decided | event us | drain us |")
    print("|---|---|---|---|---|---|---|")
    for path in tiny_tasks(files):
        model, x = load(path)
        ts = []
        with torch.inference_mode():
            for _ in range(12):
                ts.append(timing.time_fn(lambda s: model(*s), lambda: x))
        ev, dr, med = ([getattr(t, a) for t in ts] for a in ("event_ms", "drain_ms", "median_ms"))
        print(f"| {os.path.basename(path)[:40]} | {max(ev) / min(ev):.3f} | {max(dr) / max(min(dr), 1e-6):.3f} | "
              f"{max(med) / min(med):.3f} | {sum(d > e for d, e in zip(dr, ev))}/12 | "
              f"{statistics.median(ev) * 1e3:.1f} | {statistics.median(dr) * 1e3:.1f} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
