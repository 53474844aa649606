"""Shipped kernels: verified kernels in torch_htam/shipped/, rendered, built and re-verified on the
user's GPU.

    shipped/<name>/
      task.json       Task.to_json() of the region it implements (its signature is the cache key)
      record.json     the record it had where it was found (evaluation, params, provenance)
      kernel.cu       only for a kernel the expert cannot render (an LLM's): its source

A kernel the expert found is shipped as its task and configuration (record.json's params) and
rendered here by today's generators, so a fix to a kernel template reaches it; the configuration
is what the search found, the code is what the templates are now.

A shipped kernel never enters the cache on its shipped record: `install_shipped` builds it for this arch and runs
evaluation.evaluate here, and only a correct kernel is cached, with the evaluation measured here.
Outcomes are remembered per source hash in <arch dir>/shipped.json so a rejected one is not rebuilt
and re-timed on every optimize() call.

    >>> install_shipped(KernelCache("sm_90a"), "sm_90a")
    {'gelu_tanh_f32_4096': 'cached (1.31x)'}
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch_htam.cache import KernelCache
from torch_htam.task import Task

log = logging.getLogger("torch_htam")


def shipped_dir() -> Path:
    """$HTAM_SHIPPED_DIR, else torch_htam/shipped/ (inside the package, so wheels ship it)."""
    env = os.environ.get("HTAM_SHIPPED_DIR")
    return Path(env) if env else Path(__file__).resolve().parent / "shipped"


@dataclass
class ShippedKernel:
    """folder's kernel. source: kernel.cu's text, else the expert's rendering of record["params"]
    for the task (ValueError when today's expert no longer takes that configuration)."""
    name: str
    task: Task
    record: dict[str, Any]
    folder: Path

    @functools.cached_property
    def source(self) -> str:
        own = self.folder / "kernel.cu"
        if own.exists():
            return own.read_text()
        return render_expert(self.task, self.record.get("params"))

    @property
    def source_sha(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()


def render_expert(task: Task, params: dict[str, Any] | None) -> str:
    """The expert's source for `task` at `params` (the task's graph rebuilt from its source)."""
    from torch_htam.extract import task_from_source
    from torch_htam.policy import policy_for
    from torch_htam.proposers.expert.ir import Unsupported
    from torch_htam.proposers.expert.proposer import match_task
    if not params:
        raise ValueError("no kernel.cu and no params to render")
    region = task_from_source(task.source, task.name)
    try:
        return match_task(region, policy_for(region)).render(dict(params))
    except (Unsupported, KeyError, TypeError) as e:
        raise ValueError(f"the expert no longer renders these params: {e}") from e


def list_shipped(directory: str | Path | None = None) -> list[ShippedKernel]:
    """Every complete shipped-kernel folder; incomplete or unreadable ones are skipped with a warning."""
    d = Path(directory) if directory is not None else shipped_dir()
    if not d.is_dir():
        return []
    found = []
    for sub in sorted(p for p in d.iterdir() if p.is_dir()):
        try:
            found.append(ShippedKernel(sub.name, Task.from_json(json.loads((sub / "task.json").read_text())),
                                       json.loads((sub / "record.json").read_text()), sub))
        except (OSError, ValueError, KeyError) as e:
            log.warning("torch_htam: shipped kernel %s skipped: needs task.json and record.json (%s)", sub, e)
    return found


def install_shipped(cache: KernelCache, arch: str | None = None,
                    directory: str | Path | None = None, only: set[str] | None = None) -> dict[str, str]:
    """Build, re-verify and cache the shipped kernels this cache lacks; {name: outcome}.
    only: the task signatures wanted (a model's): the others are not built (each costs a build
    and a verification, seconds, out of optimize's budget).

    Needs nvcc and a GPU (verification runs here); without them nothing is cached.
    """
    from torch_htam import gpu, paths
    arch = arch or cache.arch
    todo = [s for s in list_shipped(directory) if cache.get(s.task.signature) is None
            and (only is None or s.task.signature in only)]
    memo_path = cache.root / "shipped.json"
    memo = _read_memo(memo_path)
    outcomes = {}
    todo = [s for s in todo if _renders(s, outcomes)]
    todo = [s for s in todo if memo.get(s.name, {}).get("source_sha") != s.source_sha]
    if not todo:
        return outcomes
    if gpu.detect() is None or paths.nvcc_path() is None:
        why = "no GPU to re-verify on" if gpu.detect() is None else "no nvcc"
        return {**outcomes, **{s.name: f"not installed: {why}" for s in todo}}
    from torch_htam.build import build_many
    from torch_htam.evaluation import evaluate
    for k, res in zip(todo, build_many([s.source for s in todo], arch=arch)):
        if not res.ok:
            outcomes[k.name] = f"build failed: {res.error}"
        else:
            ev = evaluate(k.task, k.source)
            if not ev.correct:
                outcomes[k.name] = f"rejected: {ev.reason} {ev.detail}".strip()
            else:
                prov = k.record.get("provenance", {})
                cache.put(k.task, k.source, res.so_path, ev,
                          {"tags": k.record.get("tags", []), "params": k.record.get("params", {}),
                           "proposer": f"shipped:{k.name}", "found_by": prov.get("proposer"),
                           "found_on": prov.get("gpu")})
                outcomes[k.name] = f"cached ({ev.speedup:.2f}x)" if ev.speedup else "cached"
        if not outcomes[k.name].startswith("cached"):
            memo[k.name] = {"source_sha": k.source_sha, "outcome": outcomes[k.name]}
            log.info("torch_htam: shipped kernel %s: %s", k.name, outcomes[k.name])
    memo_path.parent.mkdir(parents=True, exist_ok=True)
    memo_path.write_text(json.dumps(memo, indent=1, sort_keys=True))
    return outcomes


def _renders(k: ShippedKernel, outcomes: dict[str, str]) -> bool:
    """Whether k has a source; where it has none, why goes into outcomes (and the log)."""
    try:
        k.source
        return True
    except ValueError as e:
        outcomes[k.name] = f"not installed: {e}"
        log.info("torch_htam: shipped kernel %s: %s", k.name, outcomes[k.name])
        return False


def _read_memo(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def write_shipped(directory: str | Path, name: str, entry) -> Path:
    """Copy a verified cache entry into a shipped-kernel folder (how torch_htam/shipped/ entries are
    added). The expert's kernels are written as their configuration (rendered at install); any other
    proposer's as their source.

        >>> write_shipped("torch_htam/shipped", "gelu_tanh_f32_8x4096", KernelCache("sm_90a").get(sig))
    """
    if entry.problem is not None:
        raise ValueError(f"entry {entry.signature[:16]} is not intact: {entry.problem}")
    out = Path(directory) / name
    out.mkdir(parents=True, exist_ok=True)
    prov = entry.record.get("provenance", {})
    if (prov.get("found_by") or prov.get("proposer")) != "expert" or not entry.record.get("params"):
        (out / "kernel.cu").write_text(entry.source)
    (out / "task.json").write_text(json.dumps(entry.record["task"], indent=1))
    (out / "record.json").write_text(json.dumps(
        {k: v for k, v in entry.record.items() if k != "task"}, indent=1, sort_keys=True))
    return out
