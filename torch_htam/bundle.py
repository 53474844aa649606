"""Deployment bundles: a model's verified kernels for one GPU arch, applied later with no search.

    <bundle>/
      manifest.json                  format, arch, toolchain, torch_htam/torch versions, the tasks
      kernels/<signature>/           the cache entry layout (cache.py), each with its sha256 manifest
      htg.json                       the arch's HTG memory, when there is one
      launcher/<torch+cuda tag>/     the built C++ launcher, so a box without a compiler can run it

`load` on a machine of the same arch and toolchain applies the bundle's libraries after their
integrity check: no search, no LLM, no compiler. On another arch (or toolchain) it rebuilds from the
shipped sources with nvcc and re-verifies each kernel on this GPU before swapping it in; without a
compiler or a GPU the model stays on its original path and the report says why.

    >>> precompile(model, (x,), "bundle/")          # on the H100 box, after optimize filled the cache
    >>> model = load(model, "bundle/", (x,))         # in production
"""
from __future__ import annotations

import datetime
import json
import logging
import shutil
from pathlib import Path
from typing import Any, Callable

import torch

from torch_htam import paths, runtime
from torch_htam.cache import Entry, KernelCache, default_arch

log = logging.getLogger("torch_htam")

BUNDLE_FORMAT = 1


def _tasks(model, example_inputs):
    from torch_htam.extract import extract
    runtime.restore(model)   # an optimized model is captured through its original forward
    found = extract(model, tuple(example_inputs))
    return found, found.tasks


def precompile(model: torch.nn.Module, example_inputs: tuple, out_dir: str | Path, config: Any = None,
               ensure_kernels: Callable | None = None, cache: KernelCache | None = None,
               only: set[str] | None = None) -> Path:
    """Write a self-contained bundle of the cached kernels for this model's tasks.

    ensure_kernels(model, example_inputs, config): fills the cache first (the optimize pipeline);
    without it the bundle holds whatever the cache has. cache: default this GPU's arch cache.
    only: task signatures allowed in (optimize's end-to-end verdict); None: every usable kernel.

        >>> precompile(model, (x,), "bundle/", ensure_kernels=lambda m, x, c: optimize(m, x, c))
        PosixPath('bundle')
    """
    if ensure_kernels is not None:
        ensure_kernels(model, example_inputs, config)
    cache = cache or KernelCache(default_arch())
    cap, tasks = _tasks(model, example_inputs)
    if not tasks:
        raise RuntimeError("nothing to bundle: the model could not be captured ("
                           + "; ".join(cap.problems) + ")")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    target = KernelCache(cache.arch, root=out)
    target.clear()   # a bundle reflects one precompile, never a mix of two
    listed = []
    for t in tasks:
        entry = cache.get(t.signature)
        ok = entry is not None and entry.usable() and (only is None or t.signature in only)
        if ok:
            target.put_entry(entry)
        listed.append({"name": t.name, "signature": t.signature, "kind": t.kind, "count": t.count,
                       "kernel": ok, "speedup": entry.speedup if ok else None})
    htg = cache.root / "htg.json"
    if htg.is_file():
        shutil.copyfile(htg, out / "htg.json")
    from torch_htam import launcher
    launcher.ship(out / "launcher")
    from torch_htam.version import __version__
    manifest = {"format": BUNDLE_FORMAT, "arch": cache.arch, "toolchain": paths.toolchain_key(),
                "torch_htam": __version__, "torch": torch.__version__,
                "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "capture": cap.capture.method, "tasks": listed}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    n = sum(x["kernel"] for x in listed)
    log.info("torch_htam: bundle %s: %d of %d tasks have kernels for %s", out, n, len(listed), cache.arch)
    return out


def read_manifest(bundle_dir: str | Path) -> dict[str, Any]:
    path = Path(bundle_dir) / "manifest.json"
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path} is not a torch_htam bundle manifest ({e}); "
                         "write one with torch_htam.precompile") from e
    if manifest.get("format") != BUNDLE_FORMAT:
        raise ValueError(f"{path}: bundle format {manifest.get('format')} is not {BUNDLE_FORMAT}; "
                         "re-run precompile with this torch_htam version")
    return manifest


def load(model: torch.nn.Module, bundle_dir: str | Path, example_inputs: tuple,
         provider: runtime.Provider | None = None, arch: str | None = None) -> torch.nn.Module:
    """Apply a bundle to `model` (the same object comes back; see `model.htam_report`).

    arch: this machine's nvcc target (default: detected; without a GPU nothing is swapped).

        >>> model = torch_htam.load(model, "bundle/", (x,))
        >>> model.htam_report.swapped
        12
    """
    manifest = read_manifest(bundle_dir)
    here = arch or _gpu_arch()
    if here is None:
        return runtime.leave(model, "no CUDA GPU: the bundle is not applied, the model runs as is")
    cap, tasks = _tasks(model, example_inputs)
    if not tasks:
        return runtime.leave(model, "could not capture the model: " + "; ".join(cap.problems))
    bundle = KernelCache(manifest["arch"], root=bundle_dir)
    if manifest["arch"] == here and manifest["toolchain"] == paths.toolchain_key():
        if provider is None:
            from torch_htam import launcher
            launcher.adopt(Path(bundle_dir) / "launcher")
        from torch_htam.policy import admitted
        kernels = {t.signature: e for t in tasks if (e := admitted(bundle.get(t.signature), t)) is not None}
        return runtime.install(model, cap, kernels, provider=provider)
    built_for = f"{manifest['arch']} / {manifest['toolchain']}"
    if paths.nvcc_path() is None:
        return runtime.leave(model, f"bundle built for {built_for}, this machine is {here} / "
                             f"{paths.toolchain_key()}, and there is no nvcc to rebuild it", tasks)
    kernels, note = rebuild(bundle, tasks, here)
    model = runtime.install(model, cap, kernels, provider=provider)
    model.htam_report.note = "; ".join(x for x in (f"bundle built for {built_for}: {note}",
                                                    model.htam_report.note) if x)
    return model


def _gpu_arch() -> str | None:
    from torch_htam import gpu
    info = gpu.detect()
    return info.arch if info else None


def rebuild(bundle: KernelCache, tasks: list, arch: str) -> tuple[dict[str, Entry], str]:
    """Rebuild the bundle's sources for `arch`, re-verify them here, and cache the winners.

    Returns ({signature: local cache Entry}, a one-line summary). A kernel enters the local cache
    only if evaluation.evaluate passes on this GPU; with no GPU nothing is swapped.
    """
    from torch_htam.build import build_many
    wanted = [(t, e) for t in tasks if (e := bundle.get(t.signature)) is not None]
    if not wanted:
        return {}, "it has no intact kernel for this model"
    if _gpu_arch() is None:
        return {}, f"{len(wanted)} kernels need re-verification on a GPU, none swapped"
    from torch_htam.evaluation import evaluate
    local = KernelCache(arch)
    results = build_many([e.source for _, e in wanted], arch=arch)
    kernels, failed = {}, []
    for (task, entry), res in zip(wanted, results):
        ev = evaluate(task, entry.source) if res.ok else None
        if ev is None or not ev.correct:
            failed.append(f"{task.name}: {res.error if not res.ok else ev.reason}")
            continue
        meta = {**{k: entry.record.get(k) for k in ("tags", "params")},
                "proposer": entry.record.get("provenance", {}).get("proposer"),
                "rebuilt_from": entry.record.get("provenance", {}).get("arch")}
        kernels[task.signature] = local.put(task, entry.source, res.so_path, ev, meta)
    note = f"rebuilt and re-verified {len(kernels)} of {len(wanted)} kernels for {arch}"
    return kernels, note + (f" (failed: {'; '.join(failed)})" if failed else "")
