"""Per-call host time of the backend's re-exported graph against torch.compile, on the CPU.

A model of many small layers (a 40-block 4-channel conv + BN + ReLU net, [1, 4, 4, 4] input) makes
each call cost its Python, not its math. Three arms, timed interleaved in one process: torch.compile,
Inductor on our re-exported graph as the backend makes it (inductor.flat_codegen), and the same with
torch.export's pytree codegen left on (what Inductor wraps in a per-call flatten / unflatten):

    python3 scripts/host_cost.py [--blocks 40] [--rounds 30]

CPU machine; prints one median per arm (us a call).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from torch_htam import inductor  # noqa: E402


class Net(nn.Module):
    def __init__(self, blocks: int, c: int = 4):
        super().__init__()
        self.b = nn.ModuleList(nn.Sequential(nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU())
                               for _ in range(blocks))

    def forward(self, x):
        for m in self.b:
            x = x + m(x)
        return x


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--calls", type=int, default=100, help="calls per arm per round")
    a = ap.parse_args()
    torch.set_num_threads(1)
    x = torch.randn(1, 4, 4, 4)
    flat = inductor.flat_codegen
    with torch.inference_mode():
        arms = {"torch.compile": inductor.compile_with(Net(a.blocks).eval(), None)}
        inductor.flat_codegen = lambda gm: None     # export's pytree codegen stays on the graph
        try:
            old = inductor.compile_with(Net(a.blocks).eval(), inductor.HtamBackend({}, keep_reexport=True))
            old(x)                                  # compiles now, with the codegen left on
        finally:
            inductor.flat_codegen = flat
        arms["re-export, export's pytree codegen"] = old
        arms["re-export (the backend's)"] = inductor.compile_with(Net(a.blocks).eval(),
                                                                  inductor.HtamBackend({}, keep_reexport=True))
        for f in arms.values():
            for _ in range(30):
                f(x)
        times: dict[str, list[float]] = {k: [] for k in arms}
        for _ in range(a.rounds):
            for k, f in arms.items():
                t0 = time.perf_counter()
                for _ in range(a.calls):
                    f(x)
                times[k].append((time.perf_counter() - t0) / a.calls * 1e6)
    for k, v in times.items():
        print(f"{k:36} {statistics.median(v):8.1f} us a call (median of {a.rounds} rounds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
