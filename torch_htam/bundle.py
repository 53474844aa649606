"""Deployment bundles: a model's verified kernels for one GPU arch, applied later with no search.

    <bundle>/
      manifest.json                  format, arch, toolchain, torch_htam/torch versions, how the
                                     model runs ("run": torch.compile with the kernels inside, and
                                     its mode, or the replay of the captured graph), the tasks
                                     (each: kernel or not, and its golden record's file, sha256,
                                     seed, device and precision policy); written last
      kernels/<signature>/           the cache entry layout (cache.py), each with its sha256 manifest
        golden.safetensors           inputs and reference outputs recorded at precompile (golden.py);
                                     its sha256 is in the bundle manifest (the entry's covers the rest)
      htg.json                       the arch's HTG memory, when there is one
      inductor/artifacts.bin         Inductor's compiled code for the model (torch.compile's cache
                                     artifacts), when the model runs under torch.compile; the
                                     manifest's "inductor" names the stack it is valid for
      launcher/<torch+cuda tag>/     the built C++ launcher, so a box without a compiler can run it
      lib/<name>/<hash>.so           the libraries of ours the kernels link (csrc: cuDNN's attention,
                                     CUTLASS's conv), loaded before the kernels (preload_libraries)

`load` runs the model the way the optimized model ran (the manifest's "run"; under torch.compile,
with the bundle's Inductor code loaded when this machine has the same torch, Triton, CUDA and GPU,
so the first call compiles nothing). On a machine of the same arch and toolchain it applies the
bundle's libraries after their integrity check and a golden check (each kernel run on its
recorded inputs on this GPU and judged against the recorded outputs under its policy's
tolerance): no search, no LLM, no compiler. On another arch (or toolchain) it rebuilds from the
shipped sources with nvcc and re-verifies each kernel on this GPU before swapping it in; without
a compiler or a GPU the model stays on its original path and the report says why. A bundle holds
at least one kernel, or Inductor's code for a model that runs torch.compile alone
(errors.EmptyBundleError otherwise).

    >>> precompile(model, (x,), "bundle/")          # on the H100 box, after optimize filled the cache
    >>> precompile(model, (x,), "bundle/", arch="sm_90a")   # no GPU: the kernels cached for sm_90a
    >>> model = load(model, "bundle/", (x,))         # in production
    >>> model.htam_report.note
    'golden check: 5 of 5 kernels passed in 0.8 s'
"""
from __future__ import annotations

import ctypes
import datetime
import functools
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import torch

from torch_htam import paths, runtime
from torch_htam.cache import Entry, KernelCache, sha256_file
from torch_htam.policy import why_not
from torch_htam.report import TaskStatus

log = logging.getLogger("torch_htam")

BUNDLE_FORMAT = 2   # 2: a golden record per kernel (golden.py)

# How a bundle's model runs when the manifest does not say (bundles written before "run" existed).
REPLAY = {"compile": False}
INDUCTOR_FILE = "inductor/artifacts.bin"
# our libraries (build.OUR_LIBRARIES) loaded into this process from bundles, by file name (a cache:
# a library is loaded once per process, and its kernels find it by that name, its soname)
_PRELOADED: dict[str, ctypes.CDLL] = {}


def run_of(model: torch.nn.Module) -> dict[str, Any]:
    """How an optimized model runs, as the manifest's "run" records it: {"compile": True, "mode":
    torch.compile's mode, "reexport": Inductor takes our re-exported graph even with no kernel in
    it, "options": Inductor config on top of the mode's (decide.LAYOUT_OPTIONS), where any} (our
    kernels inside Inductor's graph) or REPLAY (the captured graph)."""
    b = model.__dict__.get("_htam_backend")
    if b is None:
        return dict(REPLAY)
    run = {"compile": True, "mode": b.mode, "reexport": b.keep_reexport}
    return run | {"options": b.options} if b.options else run


def with_dynamic(run: dict[str, Any], dynamic: dict | None, at_example: dict | None,
                 by_bucket: dict | None = None, at_example_kernels: bool = False,
                 bucket_arms: list[dict] | None = None, upto: int | None = None) -> dict[str, Any]:
    """`run` recording the declared dynamic sizes (OptimizeConfig.dynamic) the bundle serves, as
    JSON ({"0": {"0": [1, 64]}}): its tasks are the ranged ones, and load() compiles the model
    with those dims dynamic. at_example: the Inductor options of torch.compile's graph for the
    example's own sizes, which serves them (serving.ExampleSplit; {}: plain torch.compile), as
    optimize left the model; None: the dynamic graph serves them too. by_bucket: the Inductor
    options of the graph without our kernels that serves the sizes outside their buckets
    (serving.BucketSplit), or None where the kernels' graph serves every size.
    at_example_kernels: that example's graph runs the bundle's kernels too (their static twins,
    extract.static_twin). bucket_arms: [{"kernels": [signature, ...], "sizes": [n, ...]}], sizes
    outside the kernels' common buckets served by a graph of just the kernels kept there
    (BucketSplit.more, decide.Trials.bucket_arm). upto: the largest size the kernels serve (above
    it they lost to the graph without them, decide.Trials.range_cut), None: every size."""
    if not dynamic:
        return run
    return run | {"dynamic": {str(i): {str(d): list(r) for d, r in dims.items()} for i, dims in dynamic.items()},
                  "at_example": at_example, "by_bucket": by_bucket, "at_example_kernels": at_example_kernels,
                  "bucket_arms": bucket_arms or [], "upto": upto}


def with_dynamic_of(run: dict[str, Any], dynamic: dict | None, model: torch.nn.Module) -> dict[str, Any]:
    """with_dynamic for an optimized model: the splits its decision serves the sizes with."""
    return with_dynamic(run, dynamic, at_example_of(model), by_bucket_of(model), at_example_kernels_of(model),
                        bucket_arms_of(model), getattr(_decided(model, "chosen"), "upto", None))


def _decided(model: torch.nn.Module, field: str):
    """An optimized model's decision's `field` (decide.Decision), or None."""
    return getattr(getattr(getattr(model, "htam_report", None), "decision", None), field, None)


def at_example_of(model: torch.nn.Module) -> dict | None:
    """with_dynamic's at_example for an optimized model: the Inductor options of the graph that
    serves its example's own sizes (its decision's at_example, serving.ExampleSplit), or None
    where the chosen arm serves them too."""
    static = _decided(model, "at_example")
    return None if static is None else dict(static.options)


def at_example_kernels_of(model: torch.nn.Module) -> bool:
    """with_dynamic's at_example_kernels for an optimized model: whether the graph serving its
    example's own sizes runs its kernels too (decide.Trials.at_example)."""
    static = _decided(model, "at_example")
    return bool(static is not None and static.kernels)


def by_bucket_of(model: torch.nn.Module) -> dict | None:
    """with_dynamic's by_bucket for an optimized model: the Inductor options of the arm that serves
    the sizes outside its kernels' buckets (its decision's by_bucket, serving.BucketSplit), or None."""
    base = _decided(model, "by_bucket")
    return None if base is None else dict(base.options)


def bucket_arms_of(model: torch.nn.Module) -> list[dict]:
    """with_dynamic's bucket_arms for an optimized model: its decision's (decide.Decision.bucket_arms)."""
    return [{"kernels": list(arm.kernels), "sizes": sorted(sizes)} for arm, sizes in _decided(model, "bucket_arms") or []]


def dynamic_of(run: dict[str, Any]) -> dict[int, dict[int, tuple[int, int]]] | None:
    """The declared dynamic sizes a manifest's run records (with_dynamic), or None."""
    d = run.get("dynamic")
    return {int(i): {int(k): tuple(r) for k, r in dims.items()} for i, dims in d.items()} if d else None


def _tasks(model, example_inputs, dynamic: dict | None = None):
    from torch_htam.extract import extract
    runtime.restore(model)   # an optimized model is captured through its original forward
    found = extract(model, tuple(example_inputs), dynamic=dynamic)
    return found, found.tasks


def _removes_its_folder_on_failure(fn: Callable) -> Callable:
    """A precompile that fails leaves no folder it created (out_dir, or its first missing parent)
    behind: an empty or half-written folder would look like a bundle. A folder that existed before
    is left where it was."""
    @functools.wraps(fn)
    def wrapper(model, example_inputs, out_dir, *args, **kwargs):
        made = next((p for p in reversed((Path(out_dir), *Path(out_dir).parents))
                     if not p.exists()), None)
        try:
            return fn(model, example_inputs, out_dir, *args, **kwargs)
        except BaseException:
            if made is not None:
                shutil.rmtree(made, ignore_errors=True)
            raise
    return wrapper


@_removes_its_folder_on_failure
def precompile(model: torch.nn.Module, example_inputs: tuple, out_dir: str | Path, config: Any = None,
               ensure_kernels: Callable | None = None, cache: KernelCache | None = None,
               only: set[str] | None = None, arch: str | None = None,
               run: dict[str, Any] | None = None, inductor_code: bytes | None = None) -> Path:
    """Write a self-contained bundle of the cached kernels for this model's tasks, each with its
    golden record (golden.py), recorded by running the task's reference where the model is.

    ensure_kernels(model, example_inputs, config): fills the cache first (the optimize pipeline);
    without it the bundle holds whatever the cache has. cache: default the cache of `arch`, else of
    this GPU's arch, else of $HTAM_ARCH. only: task signatures allowed in (optimize's end-to-end
    verdict); None: every usable kernel. run: how load() runs the model (run_of(optimized model));
    None: REPLAY. inductor_code: Inductor's cache artifacts for a compiled run
    (inductor.save_artifacts, on the GPU that timed it), valid for inductor.stack() of this
    process. Raises errors.EmptyBundleError, writing nothing, when no kernel qualifies and there is
    no Inductor code either: a bundle has a kernel, or torch.compile's code for the model.

        >>> precompile(model, (x,), "bundle/", ensure_kernels=lambda m, x, c: optimize(m, x, c))
        PosixPath('bundle')
        >>> precompile(model_on_cpu, (x,), "bundle/", arch="sm_90a")   # no GPU: what is cached
    """
    from torch_htam.errors import EmptyBundleError
    if ensure_kernels is not None:
        ensure_kernels(model, example_inputs, config)
    cache = cache or KernelCache(bundle_arch(arch))
    cap, tasks = _tasks(model, example_inputs, dynamic_of(run or {}))
    if not tasks:
        raise RuntimeError("nothing to bundle: the model could not be captured ("
                           + "; ".join(cap.problems) + ")")
    entries = {t.signature: e for t in tasks if why_not(e := cache.get(t.signature)) is None}
    chosen = [t for t in tasks if t.signature in entries and (only is None or t.signature in only)]
    # NOTE: where torch.compile alone was the fastest model, a bundle of its Inductor code is still
    # worth deploying: the server skips the cold compile (bench/bench_deploy.py times it).
    compiled = inductor_code is not None and bool((run or REPLAY).get("compile"))
    if not chosen and not compiled:
        raise EmptyBundleError(_empty_reason(cache, tasks, entries, only))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # A bundle reflects one precompile, never a mix of two; without a manifest nothing loads it, so
    # a precompile that fails half way leaves no bundle that looks whole.
    (out / "manifest.json").unlink(missing_ok=True)
    target = KernelCache(cache.arch, root=out)
    target.clear()
    device = _device(model, example_inputs)
    goldens, failed = _write_goldens(target, [(t, entries[t.signature]) for t in chosen], device)
    if chosen and not goldens and not compiled:
        target.clear()
        raise EmptyBundleError(f"no kernel to bundle for {cache.arch}: the golden record of every "
                               f"kernel failed on {device} ("
                               + "; ".join(failed.values()) + ")")
    listed = [_task_row(t, entries.get(t.signature), goldens, failed) for t in tasks]
    _copy_memory(cache, out)
    libraries = _copy_libraries(out, [entries[t.signature] for t in chosen if t.signature in goldens], cache.arch)
    from torch_htam import launcher
    launcher.ship(out / "launcher")
    from torch_htam.version import __version__
    manifest = {"format": BUNDLE_FORMAT, "arch": cache.arch, "toolchain": paths.toolchain_key(),
                "torch_htam": __version__, "torch": torch.__version__,
                "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "capture": cap.capture.method, "run": run or dict(REPLAY),
                "example_shapes": _shapes(example_inputs),
                "inductor": _write_inductor(out, inductor_code) if compiled else None,
                "libraries": libraries, "tasks": listed}
    tmp = out / ".manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=1))
    os.replace(tmp, out / "manifest.json")   # last: its presence means the bundle is whole
    log.info("torch_htam: bundle %s: %d of %d tasks have kernels for %s", out, len(goldens), len(listed),
             cache.arch)
    return out


def _write_goldens(target: KernelCache, chosen: list, device) -> tuple[dict[str, dict], dict[str, str]]:
    """Copy each (task, entry) into the bundle with its golden record, made on `device`; a kernel
    whose record fails is left out, with why. ({signature: manifest golden}, {signature: why})."""
    from torch_htam import golden
    goldens, failed = {}, {}
    for t, source_entry in chosen:
        entry = target.put_entry(source_entry)
        policy = golden.policy_of(entry)
        try:
            golden.save(entry.path / golden.FILE, golden.record(t, policy, device), t, policy, device)
        except Exception as e:  # noqa: BLE001 -- a kernel without its record is left out, not the bundle
            failed[t.signature] = f"{type(e).__name__}: {str(e).strip()[:200]}"
            log.warning("torch_htam: bundle: %s left out: its golden record could not be made on %s: %s",
                        t.name, device, failed[t.signature])
            target.remove(t.signature)
            continue
        goldens[t.signature] = {"file": f"kernels/{t.signature}/{golden.FILE}",
                                "sha256": sha256_file(entry.path / golden.FILE),
                                "seed": golden.GOLDEN_SEED, "dist": golden.GOLDEN_DIST,
                                "device": torch.device(device).type, "policy": policy.to_json()}
    return goldens, failed


def _task_row(t, entry: Entry | None, goldens: dict[str, dict], failed: dict[str, str]) -> dict:
    """The manifest's row for one of the model's tasks."""
    ok = t.signature in goldens
    return ({"name": t.name, "signature": t.signature, "kind": t.kind, "count": t.count,
             "kernel": ok, "speedup": entry.speedup if ok else None, "golden": goldens.get(t.signature)}
            | ({"left_out": failed[t.signature]} if t.signature in failed else {}))


def _copy_memory(cache: KernelCache, out: Path) -> None:
    """The expert's HTG memory (else an older cache-level one) travels with the bundle."""
    htg = next((p for p in (paths.memory_path(cache.arch, "expert"), cache.root / "htg.json")
                if p.is_file()), None)
    if htg is not None:
        shutil.copyfile(htg, out / "htg.json")


def _copy_libraries(out: Path, entries: list[Entry], arch: str) -> dict[str, str]:
    """The libraries of ours the bundled kernels link (cuDNN's attention, CUTLASS's conv), copied
    to out/lib/<name>/: {name: path in the bundle}. A server loads them before the kernels
    (preload_libraries); without them a kernel's link to the build machine's cache fails there."""
    from torch_htam import build
    libs: dict[str, str] = {}
    for name in sorted({n for e in entries for n in build.libraries_used(e.source)}):
        so = build.library_path(name, arch)
        if so.is_file():
            rel = f"lib/{name}/{so.name}"
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(so, out / rel)
            libs[name] = rel
    return libs


def preload_libraries(bundle_dir: str | Path, manifest: dict) -> str:
    """Load the bundle's libraries (manifest "libraries") into this process, so the kernels that
    link them find them by their soname wherever the bundle sits; '' or what failed to load."""
    failed = []
    for name, rel in (manifest.get("libraries") or {}).items():
        path = Path(bundle_dir) / rel
        if path.name in _PRELOADED:
            continue
        try:
            _PRELOADED[path.name] = ctypes.CDLL(str(path.resolve()), mode=os.RTLD_GLOBAL)
        except OSError as e:
            failed.append(f"the {name} library did not load ({e}): kernels that link it are left out")
    return "; ".join(failed)


def _write_inductor(out: Path, inductor_code: bytes) -> dict:
    """Inductor's cache artifacts into the bundle; the manifest's record of them."""
    from torch_htam import inductor
    path = out / INDUCTOR_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(inductor_code)
    return {"file": INDUCTOR_FILE, "sha256": sha256_file(path), "stack": inductor.stack(),
            "stable_launches": inductor.stable_launches_record()}


def bundle_arch(arch: str | None = None) -> str:
    """The arch to bundle for: `arch`, else this GPU's, else $HTAM_ARCH; a clear error without any."""
    arch = arch or _gpu_arch() or os.environ.get("HTAM_ARCH")
    if not arch:
        raise RuntimeError("no CUDA GPU detected: pass arch= (e.g. 'sm_90a'; `torch-htam precompile "
                           "--arch`) to bundle the kernels already cached for that arch, or run "
                           "precompile on a GPU of the arch to deploy to")
    return arch


def _empty_reason(cache: KernelCache, tasks: list, entries: dict, only: set[str] | None) -> str:
    head = f"no kernel to bundle for {cache.arch}: "
    if not entries:
        return head + (f"the cache at {cache.root} has no verified kernel for this model's {len(tasks)} "
                       f"tasks; run `torch-htam optimize` on a GPU of that arch first")
    return head + (f"the cache has verified kernels for {len(entries)} of this model's {len(tasks)} tasks, "
                   "but optimize kept none of them (the model was not faster end to end with them, "
                   "see model.htam_report); there is nothing worth deploying")


def _device(model: torch.nn.Module, example_inputs) -> torch.device:
    """Where the model runs: its example inputs' device, else its parameters', else the CPU."""
    from torch.utils import _pytree as pytree
    for x in pytree.tree_leaves(tuple(example_inputs)):
        if isinstance(x, torch.Tensor):
            return x.device
    p = next(iter(model.parameters()), None)
    return p.device if p is not None else torch.device("cpu")


def read_manifest(bundle_dir: str | Path) -> dict[str, Any]:
    path = Path(bundle_dir) / "manifest.json"
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path} is not a torch_htam bundle manifest ({e}); "
                         "write one with torch_htam.precompile") from e
    fmt = manifest.get("format")
    if fmt == 1:
        raise ValueError(f"{path}: bundle format 1 has no golden records, which load now checks every "
                         "kernel against before swapping it in: re-make the bundle with "
                         "torch_htam.precompile (or `torch-htam precompile`) with this torch_htam version")
    if fmt != BUNDLE_FORMAT:
        raise ValueError(f"{path}: bundle format {fmt} is not {BUNDLE_FORMAT}; "
                         "re-make it with precompile with this torch_htam version")
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
    cap, tasks = _tasks(model, example_inputs, dynamic_of(manifest.get("run", REPLAY)))
    if not tasks:
        return runtime.leave(model, "could not capture the model: " + "; ".join(cap.problems))
    problems = _unmatched(manifest, tasks, example_inputs)   # what the bundle and this model disagree on
    if problems:
        log.warning("torch_htam: %s", problems)
    bundle = KernelCache(manifest["arch"], root=bundle_dir)
    if manifest["arch"] == here and manifest["toolchain"] == paths.toolchain_key():
        if provider is None:
            from torch_htam import launcher
            launcher.adopt(Path(bundle_dir) / "launcher")
        from torch_htam.policy import admitted
        kernels = {t.signature: e for t in tasks if (e := admitted(bundle.get(t.signature), t)) is not None}
        problems = "; ".join(x for x in (problems, preload_libraries(bundle_dir, manifest)) if x)
        passed, failed, note, dead = golden_check(bundle_dir, manifest, kernels,
                                                  provider or runtime.launcher_provider(),
                                                  _device(model, example_inputs))
        if dead:
            model = runtime.leave(model, note + "; nothing swapped: the CUDA context is lost, "
                                  "restart the process", tasks)
        else:
            model = _install(model, cap, passed, manifest, provider, bundle_dir, example_inputs)
            model.htam_report.note = "; ".join(x for x in (problems, note, model.htam_report.note) if x)
        for t in model.htam_report.tasks:
            if t.signature in failed:
                t.status, t.detail = TaskStatus.GOLDEN_FAILED, failed[t.signature]
        return model
    built_for = f"{manifest['arch']} / {manifest['toolchain']}"
    if paths.nvcc_path() is None:
        return runtime.leave(model, f"bundle built for {built_for}, this machine is {here} / "
                             f"{paths.toolchain_key()}, and there is no nvcc to rebuild it", tasks)
    kernels, note = rebuild(bundle, tasks, here)
    model = _install(model, cap, kernels, manifest, provider, bundle_dir, example_inputs)
    model.htam_report.note = "; ".join(x for x in (problems, f"bundle built for {built_for}: {note}",
                                                    model.htam_report.note) if x)
    return model


def _shapes(example_inputs) -> list:
    """The example inputs' shapes as the manifest records them (None for what is no tensor)."""
    return [list(x.shape) if isinstance(x, torch.Tensor) else None for x in example_inputs]


def _unmatched(manifest: dict, tasks: list, example_inputs) -> str:
    """Where some of the bundle's kernels match no region of the model called with these example
    inputs, how many and what to do ("" where all match). NOTE: a task's signature holds its
    shapes, a ranged task's too (its example's size in each declared dim), so a bundle loaded with
    example inputs of other shapes than its precompile's swaps nothing, and only this line says so."""
    kept = [r["signature"] for r in manifest.get("tasks", []) if r.get("kernel")]
    here = {t.signature for t in tasks}
    missing = sum(sig not in here for sig in kept)
    if not missing:
        return ""
    line = f"{missing} of the bundle's {len(kept)} kernels match no region of the model called with these inputs"
    theirs, ours = manifest.get("example_shapes"), _shapes(example_inputs)
    if theirs is not None and theirs != ours:
        line += (f" (input shapes {ours}; it was precompiled at {theirs}): load it with the example inputs"
                 " it was precompiled with")
    return line


def _install(model: torch.nn.Module, cap, kernels: dict, manifest: dict,
             provider: runtime.Provider | None, bundle_dir: str | Path, example_inputs: tuple) -> torch.nn.Module:
    """The kernels on the model's path the bundle records: inside torch.compile (compiled on the
    first call, as torch.compile does; with declared dynamic sizes, here, on the example inputs
    with those dims marked, in the caller's grad mode, so that the graph serves their ranges) or
    in the replay of the captured graph. provider: None is each path's own (the launcher op
    inside Inductor's graph, its cheaper binding in the replay)."""
    run = manifest.get("run", REPLAY)
    if not run.get("compile"):
        return runtime.install(model, cap, kernels, provider=provider)
    # NOTE: a compiled run stays compiled with no kernel left (none bundled, or none passed its
    # golden check): optimize's guard timed that base (torch.compile, or Inductor on our re-exported
    # graph where "reexport" says so) as the floor of this model.
    from torch_htam import inductor
    note = _load_inductor_code(bundle_dir, manifest)
    model = inductor.install(model, cap, kernels, run.get("mode", "default"), provider=provider,
                             keep_reexport=run.get("reexport", False), options=run.get("options"))
    model.htam_report.note = "; ".join(x for x in (model.htam_report.note, note) if x)
    if cap.capture.dynamic:
        from torch_htam.capture import marked
        model(*marked(tuple(example_inputs), cap.capture.dynamic))
        from torch_htam.serving import (BucketSplit, entries_kept_sizes, has_conv, prime, served_sizes, size_one_inputs,
                                        split_at_example)
        found = (served_sizes(entries_kept_sizes(list(kernels.values()), cap.capture.dynamic), cap.capture.dynamic,
                              run.get("upto")) if run.get("by_bucket") is not None and kernels else None)
        if found is not None:   # the sizes outside the kernels' buckets on the graph without them
            base = inductor.compile_with(model, None, run.get("mode", "default"), run["by_bucket"] or None)
            ranged = marked(tuple(example_inputs), cap.capture.dynamic)
            base(*ranged)
            more = _bucket_arms(model, kernels, run, provider, ranged)
            model._compiled_call_impl = BucketSplit(model._compiled_call_impl, base, *found, more=more)
        if run.get("at_example") is not None:
            from torch_htam.extract import static_twins
            twins = static_twins(cap.tasks, kernels) if run.get("at_example_kernels") else {}
            mode, options = run.get("mode", "default"), run["at_example"] or None
            static = (inductor.compile_with(model, inductor.HtamBackend(twins, mode, provider, options=options, twins=True))
                      if twins else inductor.compile_with(model, None, mode, options))
            model._compiled_call_impl = split_at_example(static, model._compiled_call_impl,
                                                         tuple(example_inputs), cap.capture.dynamic)
            model(*example_inputs)   # the example's graph, compiled here rather than on a request
        for args in size_one_inputs(tuple(example_inputs), cap.capture.dynamic):
            model(*args)   # Dynamo's graph for size 1, here too (decide.Trials.warm_size_one)
        if has_conv(cap.capture.graphs):   # each conv size's planning, here too (decide.Trials.prime_sizes)
            prime(model, tuple(example_inputs), cap.capture.dynamic, lambda next_s: True)
    return model


def _bucket_arms(model: torch.nn.Module, kernels: dict, run: dict, provider, marked_inputs: tuple) -> tuple:
    """BucketSplit.more from run["bucket_arms"]: each a graph of its kernels (compiled here on the
    marked example inputs), for its sizes; one with a kernel the bundle no longer has is left out
    (its sizes run the base)."""
    from torch_htam import inductor
    more = []
    for rec in run.get("bucket_arms") or []:
        if not all(s in kernels for s in rec["kernels"]):
            continue
        b = inductor.HtamBackend({s: kernels[s] for s in rec["kernels"]}, run.get("mode", "default"), provider,
                                 keep_reexport=run.get("reexport", False), options=run.get("options"))
        call = inductor.compile_with(model, b)
        call(*marked_inputs)
        more.append((frozenset(rec["sizes"]), call))
    return tuple(more)


def _load_inductor_code(bundle_dir: str | Path, manifest: dict) -> str:
    """Load the bundle's Inductor code into this process's caches when it was compiled for this
    stack; a line for the report either way."""
    from torch_htam import inductor
    code = manifest.get("inductor")
    if not code:
        return "torch.compile compiles on the first call (the bundle has no Inductor code)"
    here = inductor.stack()
    if code.get("stack") != here:
        theirs = code.get("stack") or {}
        diff = ", ".join(f"{k} {theirs.get(k)} here {v}" for k, v in here.items() if theirs.get(k) != v)
        return f"torch.compile compiles on the first call: the bundle's Inductor code is for another stack ({diff})"
    # the same stack: our launches checked under the C++ wrapper there hold here (inductor.warm_main)
    inductor.adopt_stable_launches(code.get("stable_launches"))
    path = Path(bundle_dir) / code["file"]
    if not path.is_file() or sha256_file(path) != code.get("sha256"):
        return "torch.compile compiles on the first call: the bundle's Inductor code is missing or altered"
    try:
        inductor.load_artifacts(path.read_bytes())
    except Exception as e:  # noqa: BLE001 -- a cache that will not load costs a compile, nothing more
        return f"torch.compile compiles on the first call: its cache artifacts did not load ({type(e).__name__}: {e})"
    return "Inductor code loaded from the bundle"


def golden_check(bundle_dir: str | Path, manifest: dict, kernels: dict[str, Entry],
                 provider: runtime.Provider, device) -> tuple[dict[str, Entry], dict[str, str], str, bool]:
    """Run each bundled kernel on its golden record here before it is swapped in (golden.check).

    Returns (the kernels that passed, {signature: why it failed}, a one-line summary with the time
    the whole check took, dead): dead when a kernel crashed the CUDA context, after which nothing
    else is checked (nor may anything be swapped in this process).

        >>> passed, failed, note, dead = golden_check("bundle/", manifest, kernels, provider, "cuda")
        >>> note
        'golden check: 5 of 5 kernels passed in 0.8 s'
    """
    from torch_htam import golden
    listed = {t["signature"]: t.get("golden") or {} for t in manifest.get("tasks", [])}
    passed, failed, dead = {}, {}, False
    t0 = time.perf_counter()
    for sig, entry in kernels.items():
        if dead:
            failed[sig] = "not checked: an earlier kernel crashed the CUDA context"
            continue
        if getattr(entry, "so_path", None) is None:
            passed[sig] = entry   # needs a rebuild: install reports it and swaps nothing for it
            continue
        info, path = listed.get(sig, {}), Path(bundle_dir) / "kernels" / sig / golden.FILE
        if not path.is_file():
            why = f"no golden record ({path.name} missing); re-make the bundle with precompile"
        elif info.get("sha256") != sha256_file(path):
            why = f"{path.name} does not match the bundle manifest's sha256 (corrupt or altered)"
        else:
            try:
                why = golden.check(provider, entry, golden.read(path, entry.task, device))
            except Exception as e:  # noqa: BLE001 -- an unreadable record fails this kernel only
                why = f"unreadable golden record: {type(e).__name__}: {str(e).strip()[:200]}"
        if why is None:
            passed[sig] = entry
            continue
        failed[sig] = why
        dead = why.startswith("crash")
        log.warning("torch_htam: bundle kernel %s (%s) not swapped in: golden check failed: %s",
                    sig[:16], entry.name, why)
    n = len([s for s in passed if kernels[s].so_path is not None])
    note = f"golden check: {n} of {n + len(failed)} kernels passed in {time.perf_counter() - t0:.1f} s"
    return passed, failed, note, dead


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
