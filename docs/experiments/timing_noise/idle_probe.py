"""Does a GPU left idle (as it is while a search's candidates build) time a small kernel slower?
One held-out task's reference (eager, ~6-12 us) is timed with timing.time_fn 10 times in each of
three conditions: back to back; each after IDLE_S seconds of GPU idle; each after that idle and then
WARM_MS of GPU busy (torch.cuda._sleep) before time_fn. Prints the event and reported medians.

    python3 docs/experiments/timing_noise/idle_probe.py bench/heldout/test/gemm_linear_c31e44aed24e9038.py ...
"""
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.dirname(__file__))
from noise_probe import load  # noqa: E402
from torch_htam import timing  # noqa: E402

IDLE_S, WARM_MS = 3.0, 50.0


def run(model, x, idle: bool, warm: bool) -> list:
    out = []
    for _ in range(10):
        if idle:
            torch.cuda.synchronize()
            time.sleep(IDLE_S)
        if warm:
            torch.cuda._sleep(timing._sleep_cycles(WARM_MS))
        out.append(timing.time_fn(lambda s: model(*s), lambda: x))
    return out


def main(paths: list[str]) -> None:
    print("| task | condition | event us (median of 10) | event max/min | reported us | reported max/min |")
    print("|---|---|---|---|---|---|")
    for path in paths:
        model, x = load(path)
        with torch.inference_mode():
            for name, idle, warm in (("back to back", False, False), (f"after {IDLE_S:.0f} s idle", True, False),
                                     (f"idle, then {WARM_MS:.0f} ms busy", True, True)):
                ts = run(model, x, idle, warm)
                ev, med = [t.event_ms * 1e3 for t in ts], [t.median_ms * 1e3 for t in ts]
                print(f"| {os.path.basename(path)[:32]} | {name} | {statistics.median(ev):.1f} | "
                      f"{max(ev) / min(ev):.2f} | {statistics.median(med):.1f} | {max(med) / min(med):.2f} |",
                      flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
