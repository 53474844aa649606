"""Which drain rule keeps time_fn's side-stream guard without the host's noise.

For each task named, its reference (eager PyTorch) is timed 12 times by timing.time_fn per drain
floor, first on an idle host, then with every core kept busy by spinning processes (as while a
search's candidates build with nvcc beside the timing). Two floors (what each rep's drain has
subtracted), each with two statistics taken from the same repetitions:

- floor "sync": a synchronize() of the idle GPU; "launch": an empty kernel's launch, then the
  synchronize (timing._drain_floor_ms);
- stat "median": the reported time is max(events' median, drain's median); "p20": max(events'
  median, drain's 20th percentile) (timing.DRAIN_Q).

Per task and load it prints, per rule, the spread (max/min over the 12 timings) and how many of the
12 the drain decided by over 5%. Last, the side-stream cheat of tests/test_redteam.py (four 4096^2
matmuls on another stream) against the same work on the current stream, under each rule and load:
a rule that keeps the guard reports the hidden work at about the honest time.

    python3 docs/experiments/timing_noise/drain_rule.py bench/heldout/test/gemm_linear_48d646a876a8655f.py ...

Run from the repository root on a GPU machine.
"""
import contextlib
import multiprocessing as mp
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from noise_probe import load  # noqa: E402
from torch_htam import timing  # noqa: E402

OVER = 1.05   # the drain "decided" when it is over 5% past the events' median


def series(fn, make, n: int = 12) -> list[tuple[float, float, float]]:
    """n timings of fn, each as (events' median, drain median, drain p20) in ms, from the same reps."""
    got, original = [], timing.reported

    def keep(events, drains):
        got.append((statistics.median(events), statistics.median(drains), timing.quantile(drains, 0.2)))
        return original(events, drains)
    timing.reported = keep
    try:
        for _ in range(n):
            timing.time_fn(fn, make)
    finally:
        timing.reported = original
    return got


def sync_floor_ms(n: int = 20) -> float:
    """The drain's floor as a synchronize() of the idle GPU."""
    ts = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


FLOORS = {"sync": sync_floor_ms, "launch": timing._drain_floor_ms}


def all_rules(fn, make, n: int = 12) -> dict:
    """{"floor/stat": (reported ms per timing, timings the drain decided)}"""
    out, product = {}, timing._drain_floor_ms
    for floor, f in FLOORS.items():
        timing._drain_floor_ms = f
        try:
            got = series(fn, make, n)
        finally:
            timing._drain_floor_ms = product
        for name, i in (("median", 1), ("p20", 2)):
            out[f"{floor}/{name}"] = ([max(g[0], g[i]) for g in got], sum(g[i] > OVER * g[0] for g in got),
                                      statistics.median(g[0] for g in got))
    return out


def _spin(stop):
    while not stop.is_set():
        pass


@contextlib.contextmanager
def busy_host(on: bool):
    if not on:
        yield
        return
    stop = mp.Event()
    procs = [mp.Process(target=_spin, args=(stop,), daemon=True) for _ in range(os.cpu_count() or 1)]
    for p in procs:
        p.start()
    try:
        yield
    finally:
        stop.set()
        for p in procs:
            p.join()


def main(paths: list[str]) -> None:
    print("cpus", os.cpu_count(), torch.cuda.get_device_name(), "torch", torch.__version__)
    names = [f"{f}/{s}" for f in FLOORS for s in ("median", "p20")]
    print("per rule: max/min of the 12 reported times, timings the drain decided")
    print("| task | host | events us | " + " | ".join(names) + " |")
    print("|---|---|---|" + "---|" * len(names))
    for path in paths:
        model, x = load(path)
        for busy in (False, True):
            with torch.inference_mode(), busy_host(busy):
                r = all_rules(lambda s: model(*s), lambda: x)
            print(f"| {os.path.basename(path)[:40]} | {'busy' if busy else 'idle'} | "
                  f"{r[names[-1]][2] * 1e3:.1f} | "
                  + " | ".join(f"{max(r[k][0]) / min(r[k][0]):.3f}, {r[k][1]}/12" for k in names) + " |", flush=True)
    a = torch.randn(4096, 4096, device="cuda")
    side = torch.cuda.Stream()

    def on_side(s):
        with torch.cuda.stream(side):
            for _ in range(4):
                s[0] @ s[0]

    def on_main(s):
        for _ in range(4):
            s[0] @ s[0]
    print("\nside-stream cheat: per rule, the least hidden time over the most honest time")
    print("| cheat | host | hidden events ms | " + " | ".join(names) + " |")
    print("|---|---|---|" + "---|" * len(names))
    for busy in (False, True):
        with busy_host(busy):
            h = all_rules(on_side, lambda: (torch.randn_like(a),), n=3)
            o = all_rules(on_main, lambda: (torch.randn_like(a),), n=3)
        print(f"| four 4096^2 matmuls | {'busy' if busy else 'idle'} | {h[names[-1]][2]:.3f} | "
              + " | ".join(f"{min(h[k][0]) / max(o[k][0]):.3f}" for k in names) + " |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
