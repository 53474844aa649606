"""Seed kernels: verified sources shipped in csrc_cache/, built and re-verified on the user's GPU.

    csrc_cache/<name>/
      kernel.cu       the kernel source (torch_htam/csrc/htam_abi.h ABI)
      task.json       Task.to_json() of the region it implements (its signature is the cache key)
      record.json     the record it had where it was found (evaluation, provenance), for reference

A seed never enters the cache on its shipped record: `seed_cache` builds it for this arch and runs
evaluation.evaluate here, and only a correct kernel is cached, with the evaluation measured here.
Outcomes are remembered per source hash in <arch dir>/seeds.json so a rejected seed is not rebuilt
and re-timed on every optimize() call.

    >>> seed_cache(KernelCache("sm_90a"), "sm_90a")
    {'gelu_tanh_f32_4096': 'cached (1.31x)'}
"""
from __future__ import annotations

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


def seeds_dir() -> Path:
    """$HTAM_SEEDS_DIR, else torch_htam/csrc_cache/ (inside the package, so wheels ship it)."""
    env = os.environ.get("HTAM_SEEDS_DIR")
    return Path(env) if env else Path(__file__).resolve().parent / "csrc_cache"


@dataclass
class Seed:
    name: str
    task: Task
    source: str
    record: dict[str, Any]

    @property
    def source_sha(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()


def list_seeds(directory: str | Path | None = None) -> list[Seed]:
    """Every complete seed folder; incomplete or unreadable ones are skipped with a warning."""
    d = Path(directory) if directory is not None else seeds_dir()
    if not d.is_dir():
        return []
    seeds = []
    for sub in sorted(p for p in d.iterdir() if p.is_dir()):
        try:
            seeds.append(Seed(sub.name, Task.from_json(json.loads((sub / "task.json").read_text())),
                              (sub / "kernel.cu").read_text(),
                              json.loads((sub / "record.json").read_text())))
        except (OSError, ValueError, KeyError) as e:
            log.warning("torch_htam: seed %s skipped: needs kernel.cu, task.json, record.json (%s)",
                        sub, e)
    return seeds


def seed_cache(cache: KernelCache, arch: str | None = None,
               directory: str | Path | None = None) -> dict[str, str]:
    """Build, re-verify and cache the shipped seeds this cache lacks; {seed name: outcome}.

    Needs nvcc and a GPU (verification runs here); without them nothing is cached.
    """
    from torch_htam import gpu, paths
    arch = arch or cache.arch
    todo = [s for s in list_seeds(directory) if cache.get(s.task.signature) is None]
    memo_path = cache.root / "seeds.json"
    memo = _read_memo(memo_path)
    todo = [s for s in todo if memo.get(s.name, {}).get("source_sha") != s.source_sha]
    if not todo:
        return {}
    if gpu.detect() is None or paths.nvcc_path() is None:
        why = "no GPU to re-verify on" if gpu.detect() is None else "no nvcc"
        return {s.name: f"not seeded: {why}" for s in todo}
    from torch_htam.build import build_many
    from torch_htam.evaluation import evaluate
    outcomes = {}
    for seed, res in zip(todo, build_many([s.source for s in todo], arch=arch)):
        if not res.ok:
            outcomes[seed.name] = f"build failed: {res.error}"
        else:
            ev = evaluate(seed.task, seed.source)
            if not ev.correct:
                outcomes[seed.name] = f"rejected: {ev.reason} {ev.detail}".strip()
            else:
                prov = seed.record.get("provenance", {})
                cache.put(seed.task, seed.source, res.so_path, ev,
                          {"tags": seed.record.get("tags", []), "params": seed.record.get("params", {}),
                           "proposer": f"seed:{seed.name}", "found_by": prov.get("proposer"),
                           "found_on": prov.get("gpu")})
                outcomes[seed.name] = f"cached ({ev.speedup:.2f}x)" if ev.speedup else "cached"
        if not outcomes[seed.name].startswith("cached"):
            memo[seed.name] = {"source_sha": seed.source_sha, "outcome": outcomes[seed.name]}
            log.info("torch_htam: seed %s: %s", seed.name, outcomes[seed.name])
    memo_path.parent.mkdir(parents=True, exist_ok=True)
    memo_path.write_text(json.dumps(memo, indent=1, sort_keys=True))
    return outcomes


def _read_memo(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def write_seed(directory: str | Path, name: str, entry) -> Path:
    """Copy a verified cache entry into a seed folder (how csrc_cache/ entries are added).

        >>> write_seed("torch_htam/csrc_cache", "gelu_tanh_f32_8x4096", KernelCache("sm_90a").get(sig))
    """
    if entry.problem is not None:
        raise ValueError(f"entry {entry.signature[:16]} is not intact: {entry.problem}")
    out = Path(directory) / name
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernel.cu").write_text(entry.source)
    (out / "task.json").write_text(json.dumps(entry.record["task"], indent=1))
    (out / "record.json").write_text(json.dumps(
        {k: v for k, v in entry.record.items() if k != "task"}, indent=1, sort_keys=True))
    return out
