"""`torch-htam plan MODEL`: which regions a model has, as tasks, and where eager time goes.

Prints one row per distinct task (signature, kind, ops, input shapes, count), the share of eager
time when CUDA is present (each task's reference timed with CUDA events on random inputs, times
its count), whether the built-in proposer has a path for it (and if not, why, on the next line),
a footer with the shares of FLOPs and bytes in tasks with a path (coverage.py), and a line for what
could not be captured. --export writes the KernelBench files; --json prints the same as one JSON
object instead. A spec that cannot be loaded, or a model that fails on its own example inputs,
raises modelspec.ModelSpecError; an --export folder that cannot be written raises PlanError.

    >>> run_plan("examples/gpt_block.py", export_dir="kb_tasks")
    0
"""
from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path
from typing import TextIO

from torch_htam import coverage as coverage_module
from torch_htam import ops
from torch_htam.extract import extract
from torch_htam.modelspec import check_runs, load_model
from torch_htam.task import Task, exec_source, export_tasks

OPS_WIDTH = 48
LINE_WIDTH = 120   # a reason without a path is wrapped to this width ...
WHY_LINES = 4      # ... in at most this many lines (--json has it whole)


class PlanError(Exception):
    """An --export folder that cannot be written; the CLI prints `error: <message>`, exit 1."""


def run_plan(spec: str, export_dir: str | None = None, device: str | None = None,
             out: TextIO | None = None, json_out: bool = False) -> int:
    """Print the plan of a model spec; return the exit code (0 ok, 2 nothing captured).

    json_out: print one JSON object and nothing else on `out` (plan_json); the export line then
    goes to stderr. A spec or device that cannot be used raises ModelSpecError (one line, for the
    user): the CLI reports it as `error: ...` like every other command that loads a model.
    """
    out = out or sys.stdout   # NOTE: read at call time; a default arg would pin the import-time stream
    if export_dir:
        check_export_dir(export_dir)   # before the capture, which can take minutes
    model, inputs, device = load_model(spec, device)
    found = extract(model, inputs)
    tasks = found.tasks
    if not found.capture.graphs:
        check_runs(model, inputs, spec)   # nothing captured: say so if the model itself fails
    shares = eager_shares(tasks, device) if device.startswith("cuda") else None
    cov = coverage(tasks)
    problems = list(found.problems)
    if found.capture.graphs and not tasks:
        problems.append("the graph has no region worth a kernel (no GEMM, conv, attention, "
                        "row-wise or elementwise ops on tensors)")
    if json_out:
        print(json.dumps(plan_json(tasks, cov, found.capture.method, problems, shares)), file=out)
    else:
        print(format_plan(tasks, shares, found.capture.method, cov), file=out)
        for p in problems:
            print(f"not captured: {p}", file=out)
    if export_dir and tasks:
        try:
            paths = export_tasks(tasks, export_dir)
        except OSError as e:
            raise PlanError(f"--export {export_dir}: cannot write the task files there "
                            f"({e.strerror or e}); give a writable folder") from None
        print(f"wrote {len(paths)} KernelBench files and tasks.json to {export_dir}",
              file=sys.stderr if json_out else out)
    return 0 if tasks else 2


def format_plan(tasks: list[Task], shares: list[float] | None = None, method: str = "export",
                cov: dict | None = None) -> str:
    """The plan table as text (one row per task, most costly first). With `cov` (coverage()), a
    path column, the reason under each task without a path, and a footer with the shares."""
    path = "  path" if cov else ""
    head = f"{'signature':16}  {'kind':11}  {'count':>5}  {'eager':>6}{path}  {'ops':{OPS_WIDTH}}  inputs"
    rows = [f"{len(tasks)} tasks (capture: {method})", head, "-" * len(head)]
    for i, t in enumerate(tasks):
        share = f"{100 * shares[i]:5.1f}%" if shares else "     -"
        names = compute_ops(t)
        names = names if len(names) <= OPS_WIDTH else names[:OPS_WIDTH - 3] + "..."
        shapes = " ".join("x".join(map(str, s.shape)) or "()" for s in t.inputs)
        has = f"  {'yes' if cov['tasks'][i]['path'] else 'no':4}" if cov else ""
        rows.append(f"{t.signature:16}  {t.kind:11}  {t.count:>5}  {share:>6}{has}  {names:{OPS_WIDTH}}  {shapes}")
        if cov and not cov["tasks"][i]["path"]:
            rows.extend(_wrap_why(cov["tasks"][i]["why"]))
    if cov and tasks:   # no task: no share of anything to report
        rows.append(f"built-in proposer has a path for {cov['with_path']} of {len(tasks)} tasks: "
                    f"{100 * cov['flops']:.1f}% of FLOPs, {100 * cov['bytes']:.1f}% of bytes")
    return "\n".join(rows)


def _wrap_why(why: str) -> list[str]:
    """The reason a task has no path, under its row, wrapped; cut at the end (the error's type and
    message come first) only past WHY_LINES lines."""
    lines = textwrap.wrap(why, LINE_WIDTH, initial_indent=" " * 18 + "no path: ",
                          subsequent_indent=" " * 27)
    if len(lines) > WHY_LINES:
        lines = lines[:WHY_LINES]
        lines[-1] = lines[-1][:LINE_WIDTH - 28].rstrip() + " ... (whole reason: --json)"
    return lines


def coverage(tasks: list[Task]) -> dict:
    """coverage.coverage with each reason whole."""
    # NOTE: coverage.py cuts reasons at WHY_WIDTH for one-line use; plan wraps them in the table
    # and keeps them whole in --json, where a cut error loses what it says.
    width, coverage_module.WHY_WIDTH = coverage_module.WHY_WIDTH, sys.maxsize
    try:
        return coverage_module.coverage(tasks)
    finally:
        coverage_module.WHY_WIDTH = width


def check_export_dir(path: str) -> None:
    """PlanError unless `path` is a folder this process can write, or can be made as one."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise PlanError(f"--export {path}: exists and is not a folder; give a folder (it is made "
                        "if missing)")
    parent = next(a for a in (p, *p.parents) if a.exists())   # NOTE: "." at the latest
    if not parent.is_dir():
        raise PlanError(f"--export {path}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PlanError(f"--export {path}: {parent} is not writable; give a writable folder")


def compute_ops(task: Task) -> str:
    """The task's compute ops, comma-separated, once each: views and no-ops are free in a kernel."""
    return ",".join(dict.fromkeys(o for o in map(ops.packet_of, task.ops)
                                  if (row := ops.info(o)) is None or row.category not in ops.FREE))


def plan_json(tasks: list[Task], cov: dict, method: str, problems: list[str],
              shares: list[float] | None = None) -> dict:
    """The plan as one JSON-able object: {"capture", "tasks": [coverage row + ops, inputs, eager],
    "coverage": {"flops", "bytes"}, "problems"}. flops and bytes of a row are times its count."""
    rows = []
    for i, (t, row) in enumerate(zip(tasks, cov["tasks"])):
        rows.append(dict(row, ops=compute_ops(t).split(",") if t.ops else [],
                         inputs=[list(s.shape) for s in t.inputs],
                         eager=shares[i] if shares else None))
    return {"capture": method, "tasks": rows,
            "coverage": {"flops": cov["flops"], "bytes": cov["bytes"]}, "problems": problems}


def eager_shares(tasks: list[Task], device: str, iters: int = 20) -> list[float]:
    """Each task's share of the summed eager time: count * median CUDA-event time of its reference."""
    times = [t.count * time_reference(t, device, iters) for t in tasks]
    total = sum(times) or 1.0
    return [x / total for x in times]


def time_reference(task: Task, device: str, iters: int = 20) -> float:
    """Median milliseconds of one call of the task's reference on random inputs (CUDA events)."""
    from torch_htam.timing import time_model
    ns = exec_source(task.source, task.name)
    model = ns["Model"](*ns["get_init_inputs"]()).to(device)
    inputs = tuple(x.to(device) for x in ns["get_inputs"]())
    return time_model(model, inputs, iters=iters, warmup=3).median_ms
