"""`torch-htam bench`: eager vs torch.compile vs torch_htam, side by side in one process.

    >>> run_bench("bench/models.py:get_gpt2", OptimizeConfig(steps=2))

Prints a table (per task and end to end: time, speedup, share of eager time, fraction of
roofline, fallbacks), writes bench.json and bench.png into out_dir. The three arms are timed in
the same process on the same inputs, never against a figure from another run.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch


@dataclass
class ArmTime:
    median_ms: float
    p20_ms: float
    p80_ms: float
    setup_s: float = 0.0     # compile / optimize time before the first timed call


@dataclass
class BenchResult:
    model: str
    device: str
    arms: dict[str, ArmTime] = field(default_factory=dict)
    tasks: list[dict] = field(default_factory=list)
    max_rel_err: dict[str, float] = field(default_factory=dict)
    fallback_calls: int = 0
    note: str = ""

    @property
    def swapped(self) -> int:
        """Distinct tasks whose kernel runs in the optimized model (0: it runs the original forward)."""
        return sum(1 for t in self.tasks if t["status"] == "swapped")


def time_model(fn, inputs: tuple, iters: int = 50, warmup: int = 5) -> ArmTime:
    """Median of `iters` calls, each bracketed by CUDA events, after `warmup` calls (ms)."""
    return _arm(_times(fn, inputs, iters, warmup))


def time_pair(fn_a, fn_b, inputs: tuple, iters: int = 50, rounds: int = 5) -> tuple[ArmTime, ArmTime]:
    """Two callables timed in alternating rounds of iters/rounds calls each, so that clock and
    thermal drift over the run hit both alike (ms).

        >>> eager, ours = time_pair(model.forward.htam.original, model, (x,))
    """
    a, b = [], []
    per = max(1, iters // rounds)
    for _ in range(rounds):
        a += _times(fn_a, inputs, per, warmup=1)
        b += _times(fn_b, inputs, per, warmup=1)
    return _arm(a), _arm(b)


def _times(fn, inputs: tuple, iters: int, warmup: int) -> list[float]:
    with torch.inference_mode():
        for _ in range(warmup):
            fn(*inputs)
        torch.cuda.synchronize()
        times = []
        for _ in range(iters):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn(*inputs)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
    return times


def _arm(times: list[float]) -> ArmTime:
    if len(times) < 2:
        return ArmTime(times[0], times[0], times[0])
    q = statistics.quantiles(times, n=5)
    return ArmTime(statistics.median(times), q[0], q[-1])


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64 (METHOD.md: fp32 lands far under 1e-3)."""
    out, ref = out.double(), ref.double()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def _task_rows(report, eager_ms: float) -> list[dict]:
    from torch_htam.cache import KernelCache
    cache = KernelCache()
    rows = []
    for t in report.tasks:
        e = cache.get(t.signature)
        ev = e.evaluation if e is not None else None
        ref_ms = ev.ref_ms if ev else None
        rows.append({"task": t.name, "signature": t.signature, "count": t.count,
                     "status": t.status, "speedup": t.speedup,
                     "ref_ms": ref_ms, "kernel_ms": ev.kernel_ms if ev else None,
                     "share": (ref_ms * t.count / eager_ms) if ref_ms else None,
                     "roofline": ev.roofline_fraction if ev else None})
    return rows


def format_table(res: BenchResult) -> str:
    f = lambda v, fmt: (fmt.format(v) if v is not None else "-")   # noqa: E731
    eager = res.arms["eager"].median_ms
    lines = [f"{res.model} on {res.device}",
             f"{'arm':12} {'ms':>9} {'p20-p80':>15} {'vs eager':>9} {'setup s':>8} {'rel err':>9}"]
    for name, a in res.arms.items():
        lines.append(f"{name:12} {a.median_ms:9.3f} {a.p20_ms:7.3f}-{a.p80_ms:<7.3f} "
                     f"{eager / a.median_ms:8.2f}x {a.setup_s:8.1f} "
                     f"{f(res.max_rel_err.get(name), '{:.1e}'):>9}")
    if "htam" in res.arms and not res.swapped:
        # NOTE: a Llama run read 1.18x this way with both arms on the same code (spread 6.4-10.8 ms)
        lines.append("htam runs the original forward (nothing swapped): its difference to eager is "
                     "this run's noise")
    if "compile" in res.arms and "htam" in res.arms:
        lines.append(f"torch_htam vs torch.compile: "
                     f"{res.arms['compile'].median_ms / res.arms['htam'].median_ms:.2f}x")
    lines.append(f"{'task':36} {'x':>3} {'share':>6} {'ref ms':>8} {'ours ms':>8} {'speedup':>8} "
                 f"{'roof':>5}  status")
    for r in res.tasks:
        lines.append(f"{r['task'][:36]:36} {r['count']:3d} {f(r['share'], '{:.0%}'):>6} "
                     f"{f(r['ref_ms'], '{:.4f}'):>8} {f(r['kernel_ms'], '{:.4f}'):>8} "
                     f"{f(r['speedup'], '{:.2f}x'):>8} {_pct(r['roofline']):>5}  {r['status']}")
    lines.append(f"fallback calls: {res.fallback_calls}" + (f"  note: {res.note}" if res.note else ""))
    return "\n".join(lines)


def _pct(x: float | None) -> str:
    """0.42 -> '42%'; tiny launch-bound fractions read '<1%' rather than a misleading '0%'."""
    if x is None:
        return "-"
    return "<1%" if 0 < x < 0.005 else f"{x:.0%}"


def _chart(res: BenchResult, path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no PNG chart written", file=sys.stderr)
        return
    names = list(res.arms)
    ms = [res.arms[n].median_ms for n in names]
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.bar(names, ms, color=["#888", "#48c", "#e73"][: len(names)])
    ax.set_ylabel("ms per forward (median)")
    ax.set_title(res.model, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def bench_model(model, inputs, name: str, config=None, iters: int = 50,
                compile_mode: str | None = None) -> BenchResult:
    """Time eager, torch.compile and torch_htam on one model, in this order, in this process."""
    from torch_htam.version import __version__
    res = BenchResult(name, torch.cuda.get_device_name())
    with torch.inference_mode():
        ref = model(*inputs)
    res.arms["eager"] = time_model(model, inputs, iters)

    t0 = time.perf_counter()
    compiled = torch.compile(model, mode=compile_mode)
    with torch.inference_mode():
        out = compiled(*inputs)
    setup = time.perf_counter() - t0
    res.max_rel_err["compile"] = rel_err(out, ref)
    res.arms["compile"] = time_model(compiled, inputs, iters)
    res.arms["compile"].setup_s = setup
    del compiled
    torch._dynamo.reset()

    t0 = time.perf_counter()
    model = torch_htam.optimize(model, inputs, config)
    setup = time.perf_counter() - t0
    with torch.inference_mode():
        out = model(*inputs)
    res.max_rel_err["htam"] = rel_err(out, ref)
    # Eager again, interleaved with ours: the first eager figure is from minutes earlier, before
    # compile and search heated the GPU. With nothing swapped both arms run the original forward,
    # and their difference is the run's noise (an H100 run read 0.90x that way before this).
    state = getattr(model.forward, "htam", None)
    original = state.original if state is not None else model
    res.arms["eager"], res.arms["htam"] = time_pair(original, model, inputs, iters)
    res.arms["htam"].setup_s = setup
    report = model.htam_report
    res.tasks = _task_rows(report, res.arms["eager"].median_ms)
    res.fallback_calls, res.note = report.fallback_calls, report.note
    torch_htam.runtime.restore(model)
    return res


def run_bench(spec: str, config=None, out_dir: str = "htam_bench", iters: int = 50,
              device: str = "cuda") -> int:
    """CLI entry: load MODEL_SPEC on `device`, bench it, print the table, write JSON and PNG."""
    from torch_htam.modelspec import load_model_spec
    if not torch.cuda.is_available() or not device.startswith("cuda"):
        print(f"torch-htam bench times CUDA kernels: it needs a CUDA GPU and a cuda device "
              f"(torch sees {torch.cuda.device_count()} GPU(s), device={device!r})", file=sys.stderr)
        return 2
    model, inputs = load_model_spec(spec, device=device)
    res = bench_model(model, inputs, spec, config, iters)
    print(format_table(res))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(asdict(res), indent=1))
    _chart(res, out / "bench.png")
    print(f"wrote {out / 'bench.json'} and {out / 'bench.png'}")
    return 0
