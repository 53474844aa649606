"""`torch-htam bench`: eager vs torch.compile vs torch_htam, side by side in one process.

    >>> run_bench("bench/models.py:get_gpt2", OptimizeConfig(steps=2))

Prints a table (per task and end to end: time, speedup, share of eager time, fraction of
roofline, fallbacks), writes bench.json and bench.png into out_dir. The three arms are timed in
the same process on the same inputs, never against a figure from another run.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from torch_htam.policy import end_to_end_tolerance, rel_err  # noqa: F401 -- bench scripts import them here
from torch_htam.timing import ArmTime, paired_ratio, time_many


@dataclass
class BenchResult:
    model: str
    device: str
    arms: dict[str, ArmTime] = field(default_factory=dict)
    tasks: list[dict] = field(default_factory=list)
    max_rel_err: dict[str, float] = field(default_factory=dict)
    fallback_calls: int = 0
    note: str = ""
    swapped_by_arm: dict[str, int] = field(default_factory=dict)   # regions swapped per htam arm
    # our arms against eager on inputs they were not optimized on: {"fresh": {arm: err}, "batch2": ...}
    check_err: dict[str, dict[str, float]] = field(default_factory=dict)
    tolerance: float | None = None   # the bound those errors are held to (end_to_end_tolerance)

    @property
    def swapped(self) -> int:
        """Distinct tasks whose kernel runs in the optimized model (0: it runs the original forward)."""
        return sum(1 for t in self.tasks if t["status"] == "swapped")


def fresh_inputs(inputs: tuple, batch: int | None = None) -> tuple:
    """Inputs like `inputs` with new values: floats from randn_like, integers (token ids) uniform
    over [0, the example's max]; `batch` gives the first dim that size (rows of the example cycled).

        >>> [x.shape for x in fresh_inputs((ids,), batch=4)]      # ids: (8, 512) int64
        [torch.Size([4, 512])]
    """
    out = []
    for x in inputs:
        if isinstance(x, torch.Tensor) and x.dim() > 0 and batch is not None:
            x = x[torch.arange(batch, device=x.device) % x.shape[0]]
        if not isinstance(x, torch.Tensor) or x.dtype == torch.bool:
            out.append(x)
        elif x.is_floating_point():
            out.append(torch.randn_like(x))
        else:
            out.append(torch.randint_like(x, int(x.max()) + 1))
    return tuple(out)


def second_batch(inputs: tuple) -> int:
    """A batch size other than the example's: half of it, or 2 for a batch of 1."""
    b = next((x.shape[0] for x in inputs if isinstance(x, torch.Tensor) and x.dim() > 0), 1)
    return b // 2 if b > 1 else 2


def check_outputs(model, inputs: tuple, fns: dict) -> dict[str, dict[str, float]]:
    """Each arm in `fns` against eager on fresh values (the example's shapes) and at a second batch
    size (a new shape: torch.compile recompiles, the replay's guard runs the original forward):
    {"fresh": {arm: rel_err}, "batch2": {arm: rel_err}}."""
    out = {}
    for label, xs in (("fresh", fresh_inputs(inputs)), ("batch2", fresh_inputs(inputs, second_batch(inputs)))):
        with torch.inference_mode():
            ref = model(*xs).clone()
            # NOTE: cloned at once: a reduce-overhead arm's output is overwritten by its next replay
            out[label] = {arm: rel_err(fn(*xs).clone(), ref) for arm, fn in fns.items()}
    return out


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
                     "vs_inductor": ev.compile_speedup if ev else None,
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
    for ours, theirs in (("htam", "compile"), ("htam_ro", "compile_ro"), ("htam_replay", "eager")):
        if ours in res.arms and theirs in res.arms:
            paired = paired_ratio(res.arms[theirs].round_ms, res.arms[ours].round_ms)
            lines.append(f"{ours} vs {theirs}: {res.arms[theirs].median_ms / res.arms[ours].median_ms:.2f}x"
                         + (f" (by rounds {paired:.2f}x)" if paired is not None else "")
                         + f" ({res.swapped_by_arm.get(ours, 0)} regions swapped)")
    # vs eager / vs inductor: the region's kernel against PyTorch's and Inductor's code for it
    lines.append(f"{'task':36} {'x':>3} {'share':>6} {'ref ms':>8} {'ours ms':>8} {'vs eager':>8} "
                 f"{'vs inductor':>11} {'roof':>5}  status")
    for r in res.tasks:
        lines.append(f"{r['task'][:36]:36} {r['count']:3d} {f(r['share'], '{:.0%}'):>6} "
                     f"{f(r['ref_ms'], '{:.4f}'):>8} {f(r['kernel_ms'], '{:.4f}'):>8} "
                     f"{f(r['speedup'], '{:.2f}x'):>8} {f(r.get('vs_inductor'), '{:.2f}x'):>11} "
                     f"{_pct(r['roofline']):>5}  {r['status']}")
    for label, what in (("fresh", "fresh inputs"), ("batch2", "a second batch size")):
        if res.check_err.get(label):
            lines.append(f"rel err against eager on {what}: " + ", ".join(
                f"{arm} {err:.1e}" for arm, err in res.check_err[label].items())
                + (f" (tolerance {res.tolerance:.0e})" if res.tolerance is not None else ""))
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


# The arms of a benchmark: the user's alternatives first, then ours in the same modes.
ARMS = ("eager", "compile", "compile_ro", "htam_replay", "htam", "htam_ro")


def bench_model(model, inputs, name: str, config=None, iters: int = 50,
                arms: tuple[str, ...] = ARMS) -> BenchResult:
    """Time eager, torch.compile (default and reduce-overhead) and torch_htam (replay, and inside
    Inductor in both modes) on one model, every arm interleaved in this process.

    The search runs once (the first torch_htam arm) and fills the cache; the other arms reuse it.
    Each torch_htam arm optimizes its own copy of the model, so arms never share a forward.
    setup_s: compile seconds, or optimize seconds (search included for the first).
    """
    import copy
    import dataclasses
    import torch_htam
    from torch_htam import inductor
    from torch_htam.pipeline import OptimizeConfig
    cfg = config or OptimizeConfig()
    res = BenchResult(name, torch.cuda.get_device_name())
    with torch.inference_mode():
        ref = model(*inputs)
    fns, setup, reports = {}, {}, {}
    for arm in arms:
        t0 = time.perf_counter()
        if arm == "eager":
            fns[arm] = model
        elif arm in ("compile", "compile_ro"):
            fns[arm] = inductor.compile_with(model, None, "reduce-overhead" if arm == "compile_ro" else "default")
        else:
            mode = "reduce-overhead" if arm == "htam_ro" else "default"
            mine = torch_htam.optimize(copy.deepcopy(model), inputs,
                                       dataclasses.replace(cfg, compile=arm != "htam_replay", mode=mode))
            fns[arm], reports[arm] = mine, mine.htam_report
        with torch.inference_mode():
            for _ in range(3):   # compile, CUDA-graph warm-up and record happen here, untimed
                out = fns[arm](*inputs)
        torch.cuda.synchronize()
        setup[arm] = time.perf_counter() - t0
        res.max_rel_err[arm] = rel_err(out.clone(), ref)
        print(f"[bench] {name} {arm}: ready in {setup[arm]:.0f} s", file=sys.stderr, flush=True)
    # NOTE: short rounds (5 calls an arm) so that a slow spell of the host falls on both arms of a
    # pair (bench_models' paired ratios)
    res.arms = time_many(fns, inputs, iters, rounds=max(1, iters // 5))
    for arm, a in res.arms.items():
        a.setup_s = setup[arm]
    res.check_err = check_outputs(model, inputs, {a: fns[a] for a in reports})
    res.tolerance = end_to_end_tolerance(model)
    main = next((a for a in ("htam", "htam_replay", "htam_ro") if a in reports), None)
    if main is not None:
        report = reports[main]
        res.tasks = _task_rows(report, res.arms["eager"].median_ms)
        res.fallback_calls, res.note = report.fallback_calls, report.note
        res.swapped_by_arm = {a: r.swapped for a, r in reports.items()}
    for arm, r in reports.items():
        torch_htam.runtime.restore(fns[arm])
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
