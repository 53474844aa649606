"""A torch.compile backend: verified kernels inside Inductor's graph.

Dynamo hands each graph (between graph breaks) to the backend. The backend re-exports it to the
same aten IR that extract reads, swaps every site whose task has a verified kernel for the
launcher's custom op (opaque to Inductor, with a fake impl, like vLLM's fused ops), and gives the
rest to Inductor (`compile_fx`), which fuses the glue between our kernels and, in
"reduce-overhead" mode, wraps the whole graph in CUDA graphs. A graph it cannot re-export goes to
Inductor as it is: the backend is never less than torch.compile, only more where a kernel wins.

    >>> fast = torch.compile(model, backend=torch_htam.backend())     # kernels from the cache
    >>> fast(x)
    >>> torch_htam.backend(mode="reduce-overhead")                       # Inductor's CUDA graphs

(`torch_htam.backend` is this module's `backend()`; the module is named for what it plugs into.)
Graph breaks, recompiles on new shapes, training (autograd) and no_grad / inference_mode behave as
they do under torch.compile: Dynamo decides what to compile and when; a graph whose inputs need
gradients is handed to Inductor unswapped (our kernels have no backward). A graph with symbolic
sizes (dynamic shapes) is re-exported with them (capture.export_graph), its regions' tasks ranged
over them; a kernel verified over that range runs where the size falls in a bucket it was kept
for, and its region elsewhere (fallback.py), with no recompile.
"""
from __future__ import annotations

import functools
import itertools
import json
import logging
import operator
import os
import re
import subprocess
import sys
import threading
import time
import types
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch._inductor.config  # WRAPPER_OPTIONS reads what this torch can set
import torch.fx as fx
from torch.utils import _pytree as pytree

from torch_htam import policy
from torch_htam.config import MODES  # torch.compile's modes, validated in config

log = logging.getLogger("torch_htam")



@dataclass
class GraphRecord:
    """One graph Dynamo compiled: how many sites it had, which tasks ran our kernels, or why none."""
    sites: int = 0
    swapped: list[str] = field(default_factory=list)   # task signatures, one per swapped site
    note: str = ""
    cpp_wrapper: bool = False   # compiled with Inductor's C++ wrapper (_inductor_options)
    # where the mode or options asked for that wrapper and this graph's launches kept it from it
    # (unstable_launch): why, in words; "" otherwise
    python_wrapper_why: str = ""


class HtamBackend:
    """The backend object torch.compile calls as backend(gm, example_inputs) -> callable.

    kernels: {task signature: cache Entry or kernel object}; None reads this GPU's cache (every
    verified kernel admitted under the task's precision policy). mode: Inductor's mode, as in
    torch.compile(mode=...). inductor=False hands the swapped graph back to run as it is (tests,
    and a way to see the swap without Inductor). options: Inductor config on top of the mode's, as
    torch.compile(options=...) takes it (e.g. {"layout_optimization": False}). keep_reexport: hand
    Inductor the re-exported graph (functionalized, constant attention masks folded) even where no
    kernel is swapped, instead of Dynamo's graph as it is. records: one GraphRecord per compiled graph.
    """

    def __init__(self, kernels: dict[str, Any] | None = None, mode: str = "default",
                 provider=None, min_speedup: float = 1.0, inductor: bool = True,
                 options: dict[str, Any] | None = None, keep_reexport: bool = False, twins: bool = False):
        if mode not in MODES:
            raise ValueError(f"mode={mode!r}: use one of {', '.join(MODES)} (torch.compile's modes)")
        self.kernels, self.mode, self.provider = kernels, mode, provider
        self.min_speedup, self.inductor, self.options = min_speedup, inductor, dict(options or {})
        self.keep_reexport = keep_reexport
        # kernels keyed by their ranged tasks' static twins (extract.static_twin): for the graph
        # specialized to the example's sizes, whose tasks are static
        self.twins = twins
        self.records: list[GraphRecord] = []
        self._alive: list = []   # the loaded kernels the compiled graphs' handles name
        self.handles: dict[str, int] = {}   # {task signature: kernel handle} of what was swapped

    def __call__(self, gm: fx.GraphModule, example_inputs: list) -> Callable:
        record = GraphRecord()
        self.records.append(record)
        try:
            graph = self._swap(gm, example_inputs, record)
        except Exception as e:  # noqa: BLE001 -- any failure here: Inductor compiles the graph as is
            log.warning("torch_htam backend: graph left to Inductor (%s: %s)", type(e).__name__, e)
            record.note = f"left to Inductor: {type(e).__name__}: {e}"
            graph = gm
        if not self.inductor:
            return graph.forward
        from torch._inductor.compile_fx import compile_fx
        options = self._inductor_options(graph if record.swapped else None, record)
        record.cpp_wrapper = any(bool(options.get(k)) for k in CPP_WRAPPER_KEYS)
        return compile_fx(graph, example_inputs, config_patches=options)

    def _inductor_options(self, swapped: fx.GraphModule | None = None, record: GraphRecord | None = None) -> dict:
        """The mode's Inductor config and the backend's options; on a graph with our kernels in it
        (swapped), the C++ wrapper's only where every launch in it is rewritten for that wrapper
        (stable_launches; the graph is changed then), else those options are left out and
        record.python_wrapper_why says why.

        NOTE: on an H200 (torch 2.11) Inductor's C++ wrapper calling htam::launch
        ((int, Tensor[], int[]) -> Tensor[]) for a one-output kernel crashed the process with a
        segmentation fault, which no try can catch: its C++ took the one-element list it gets back
        from Python for a bare tensor and read a null handle (pytorch#190551, fixed in later
        torch)."""
        options = mode_options(self.mode) | self.options
        if swapped is None or not any(options.get(k) for k in CPP_WRAPPER_KEYS):
            return options
        schema = getattr(getattr(self.provider, "op", None), "_schema", None)   # None: the launcher's own
        why = (unstable_launch(swapped) if schema is None or schema.name == "htam::launch"
               else f"the launches call {schema.name}, which has no form that wrapper calls without Python")
        if why is None and _rewrite_launches(swapped):
            return options
        if record is not None:
            record.python_wrapper_why = why
        return {k: v for k, v in options.items() if k not in CPP_WRAPPER_KEYS}

    def _swap(self, gm: fx.GraphModule, example_inputs: list, record: GraphRecord) -> fx.GraphModule:
        from torch_htam import runtime, symbolic
        from torch_htam.capture import Capture, export_graph
        from torch_htam.extract import from_capture
        if not all(isinstance(x, (torch.Tensor, torch.SymInt)) for x in example_inputs):
            record.note = "inputs other than tensors and sizes: left to Inductor"
            return gm
        if torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs):
            record.note = "inputs need gradients (kernels have no backward): left to Inductor"
            return gm
        if self._only_ranged() and symbolic.export_plan(gm, example_inputs) is None:
            # NOTE: a static graph beside a dynamic one (torch.compile's own graph for size 1)
            # has only static tasks, and a ranged task's signature holds its ranges: no kernel
            # given here can match, so the re-export and extraction would be spent for nothing
            record.note = "static sizes, and every kernel given serves a declared range: left to Inductor"
            return gm
        sub, problem = export_graph(gm, example_inputs)
        if sub is None:
            record.note = problem
            return gm
        plan = sub.htam_plan   # symbolic sizes: the re-export takes the tensors only
        tensors = plan.tensors(example_inputs) if plan is not None else tuple(example_inputs)
        found = from_capture(Capture([sub], "dynamo", inputs=[tensors]))
        record.sites = len(found.sites)
        kernels = self._kernels_for(found.tasks)
        if not kernels:
            record.note = record.note or (found.problems[0] if found.problems and not found.sites
                                          else "no site has a verified kernel")
            if self.keep_reexport:
                return self._as_dynamo(gm, sub, example_inputs)
            return gm
        new, swapped = runtime.swap(sub, found.sites, kernels, self.provider or op_provider(),
                                    force_layouts=self.inductor)
        self._alive.append(new.htam_kernels)
        self.handles.update(new.htam_handles)
        record.swapped = [s.signature for s in swapped]
        if new.htam_load_errors:
            record.note = "; ".join(f"{sig[:12]}: {e}" for sig, e in new.htam_load_errors.items())
        return self._as_dynamo(gm, new, example_inputs) if swapped or self.keep_reexport else gm

    def _only_ranged(self) -> bool:
        """Every kernel given is a ranged task's (verified per bucket of sizes); False where the
        kernels come from the cache or one is not (a static task's, an object without a verdict),
        and where the re-export is kept even without a kernel."""
        from torch_htam.runtime import kept_buckets
        return (not self.keep_reexport and not self.twins and bool(self.kernels)
                and all(kept_buckets(k) for k in self.kernels.values()))

    @staticmethod
    def _as_dynamo(gm: fx.GraphModule, new: fx.GraphModule, example_inputs: list) -> fx.GraphModule:
        """`new` taking Dynamo's inputs as `gm` does (its size inputs back, where it has them),
        with what AOTAutograd reads off Dynamo's graph."""
        from torch_htam import symbolic
        sizes = new.htam_plan is not None
        flat_codegen(new, recompile=not sizes)   # with_size_inputs recompiles it once, flat
        if sizes:
            new = symbolic.with_size_inputs(new, example_inputs)
        carry_dynamo_meta(gm, new)
        as_dynamo_inputs(new)
        return new

    def _kernels_for(self, tasks: list) -> dict[str, Any]:
        if self.kernels is not None:
            return {t.signature: self.kernels[t.signature] for t in tasks if t.signature in self.kernels}
        from torch_htam import gpu
        from torch_htam.cache import KernelCache
        info = gpu.detect()
        if info is None:
            return {}
        cache = KernelCache(info.arch)
        return {t.signature: e for t in tasks if policy.why_not(e := cache.get(t.signature), t, self.min_speedup,
                                                                 against_inductor=True) is None}


def flat_codegen(gm: fx.GraphModule, recompile: bool = True) -> None:
    """Drop the pytree handling torch.export gives a graph's calls, where its output is a flat
    tuple or list: Dynamo calls the graph with a flat list of tensors and sizes, which flattening
    leaves as it is, and indexes the outputs, a tuple or a list alike.

    NOTE: Inductor compiles a graph with export's pytree codegen behind a wrapper that flattens
    the inputs and rebuilds the outputs on every call (compile_fx.handle_dynamo_export_graph):
    about 1.3 us per input in Python; a model's parameters and buffers are inputs. A 40-block conv
    net (scripts/host_cost.py, 2-core CPU machine) ran 1035 us a call through the re-exported
    graph with that wrapper, 851 us without it, 843 us under torch.compile.
    """
    info = getattr(gm.graph._codegen, "pytree_info", None)
    if info is None:
        return
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output").args[0]
    if info.out_spec is not None:
        if not isinstance(out, (tuple, list)):
            return
        flat = pytree.tree_structure(type(out)(range(len(out))))
        if info.out_spec != flat:
            return
    gm.graph._codegen = fx.graph.CodeGen()
    if recompile:   # False: the caller recompiles it
        gm.recompile()


def as_dynamo_inputs(gm: fx.GraphModule) -> None:
    """Each placeholder's value under "example_value", where Dynamo's graphs keep it, not "val".

    NOTE: Inductor takes a graph whose placeholders carry "val" for an exported one, and under its
    C++ wrapper makes its inputs from those values with every size input None
    (compile_fx._extract_inputs_from_exported_gm, torch 2.11-2.14). The generated C++ then took
    one input fewer than Dynamo passes and read the served size (a 0-dim tensor) as the next
    tensor: the served decoder's SIGSEGV (bench_serve-20261128-045423), reproduced on an H200 with
    a one-kernel graph. With Dynamo's key, Inductor fakes the inputs Dynamo hands it, as it does
    for Dynamo's own graphs.
    """
    for n in gm.graph.nodes:
        if n.op == "placeholder" and "val" in n.meta:
            n.meta["example_value"] = n.meta.pop("val")


def carry_dynamo_meta(dynamo_gm: fx.GraphModule, new: fx.GraphModule) -> None:
    """Give the swapped graph what AOTAutograd reads off Dynamo's graph to know which inputs are
    parameters: the graph's meta (dynamo_compile_id), _param_name_to_source, and per placeholder
    its _dynamo_source and meta["tensor_dict"] (which marks a static input).

    NOTE: without it every input looks like user data: in reduce-overhead mode Inductor's CUDA
    graphs then copy each parameter into the graph's own buffer before every replay (GPT-2 bf16,
    H100: 149 device-to-device copies, 0.37 ms a call, bench/results/bench_swaps-20261123-230801.json).
    The copies stayed (bench_swaps-20261123-233052.json) while this gave up on a module with
    buffers of its own, which the lifted constants are; it now gives them sources (not yet
    re-measured on a GPU; tests/test_inductor.py checks what AOTAutograd reads). The re-export
    keeps Dynamo's inputs in order, so placeholders pair up by position.
    """
    from torch._dynamo.source import ConstantSource
    old = [n for n in dynamo_gm.graph.nodes if n.op == "placeholder"]
    ours = [n for n in new.graph.nodes if n.op == "placeholder"]
    if len(old) != len(ours) or not hasattr(dynamo_gm, "_param_name_to_source"):
        return   # not paired one to one: leave the graph unmarked (correct, only slower)
    for o, n in zip(old, ours):
        if hasattr(o, "_dynamo_source"):
            n._dynamo_source = o._dynamo_source
        if "tensor_dict" in o.meta:
            n.meta["tensor_dict"] = o.meta["tensor_dict"]
    for k, v in dynamo_gm.meta.items():
        new.meta.setdefault(k, v)
    # NOTE: the re-export lifts tensor constants made inside forward (GPT-2's attention: two per
    # layer) into buffers of the new module; AOTAutograd wants a source for each of the module's
    # own tensors, and takes them as static inputs, which constants are.
    sources = dict(dynamo_gm._param_name_to_source)
    for name, _ in [*new.named_parameters(remove_duplicate=False), *new.named_buffers(remove_duplicate=False)]:
        sources.setdefault(name, ConstantSource(f"htam_constant:{name}"))
    new._param_name_to_source = sources


# The kernel-use rule is policy.why_not's; this name stays for callers.
beats_inductor = policy.beats_inductor


def backend(kernels: dict[str, Any] | None = None, mode: str = "default", **kw) -> HtamBackend:
    """torch.compile's backend= for torch_htam: Inductor plus our verified kernels.

        >>> model = torch.compile(model, backend=torch_htam.backend(mode="reduce-overhead"))
    """
    return HtamBackend(kernels, mode, **kw)


def op_provider():
    """The launcher's own op in the graph (what Inductor sees as an opaque extern kernel)."""
    from torch_htam.runtime import Provider, launcher_provider
    replay = launcher_provider()   # loads the launcher, which registers torch.ops.htam.launch
    direct_call()
    return Provider(torch.ops.htam.launch.default, replay.load, replay.prepare)


@functools.cache
def direct_call() -> bool:
    """Make Inductor's Python wrapper call htam::launch through the launcher's own binding
    (`extern_kernels.htam_launch(handle, [inputs], [out_meta])`) instead of
    `torch.ops.htam.launch.default(...)`. True where this torch has the hook.

    NOTE: a swapped site's host time is what decides a host-bound model (ResNet-50 at batch 32
    under torch.compile's default mode spends more time on the host than on the GPU). The op
    through the dispatcher costs ~9 us more host time per call than the binding (H100,
    docs/RESULTS_LOG.md, probe_overhead), and Inductor's compiled code needs nothing the
    dispatcher adds: it runs real CUDA tensors, outside tracing.
    """
    from torch_htam import fallback, launcher
    launcher.extension()   # registers the op
    return emit_direct(torch.ops.htam.launch.default, fallback.checked_launch, "htam_launch")


def emit_direct(op, fn: Callable, name: str) -> bool:
    """Have Inductor's generated Python call `fn` (as `extern_kernels.<name>`, same arguments)
    where the graph calls `op`; False where this torch has no such hook (the op is called).

    Graphs still hold the op (its fake impl, layout constraints and cache keys are untouched);
    only the emitted call changes, and only in the Python wrapper (cpp_wrapper and the FX wrapper
    call the op). Code Inductor cached calls the name, so `fn` is set before any graph runs; code
    it cached before the hook was set calls the op (the same kernel, more host time).
    """
    try:
        from torch._inductor.codegen import custom_extern_kernel_codegen as registry
        from torch._inductor.select_algorithm import extern_kernels
    except ImportError:
        return False
    setattr(extern_kernels, name, fn)

    def emit(node, writeline) -> None:
        args = ", ".join([*node.codegen_args(), *node.codegen_kwargs()])
        writeline(f"{node.get_name()} = extern_kernels.{name}({args})")

    codegen = getattr(registry, "CustomCodegen", None)
    entry = codegen(python=emit) if codegen is not None else {"python": emit}
    registry.CUSTOM_EXTERN_KERNEL_CODEGEN[python_kernel_name(op)] = entry
    return True


def python_kernel_name(op) -> str:
    """What Inductor's FallbackKernel calls an op in generated Python (ir.set_python_kernel_name)."""
    return f"{op.__module__.replace('._ops.', '.ops.')}.{op.__name__}"


# ---- Inductor's C++ wrapper: its header built ahead, our launches checked under it -------------

# A C++-wrapper graph compiles against a precompiled header of torch's C++ API, which Inductor
# builds in its cache folder the first time (precompiled_headers/): once per host, by
# warm_cpp_wrapper's process while the search runs (73 s on 16 cores of an H100 host). NOTE: on a
# fresh H100 machine a ResNet-18 bf16's C++-wrapper arm took 64 s to compile against 11 s for its
# Python-wrapper floor, and the decision then had no time left to time it (zoo-20261127-125906).
# The first C++ compile of each process costs as much again: warm_vec_isa.
WARM_MARKER = "htam_cpp_wrapper_warm"   # in Inductor's cache folder: cleared with its headers
CPP_WRAPPER_KEYS = ("cpp_wrapper",)      # the Inductor config that makes its wrapper C++
# At -O0: the generated C++ only makes the calls, so -O0 costs no call time (GPT-2 / ResNet-18 bf16
# on an H100: 0.412 / 1.155 ms synced against 0.424 / 1.182 ms at -O1) and compiles faster
# (ResNet-18: 4.95 s against 11.17 s, each after a first C++ compile in the process;
# host_wrapper-20261128-012814). A torch without the setting compiles at its default.
WRAPPER_OPTIONS = {"cpp_wrapper": True,
                   **({"aot_inductor.compile_wrapper_opt_level": "O0"}
                      if hasattr(torch._inductor.config.aot_inductor, "compile_wrapper_opt_level") else {})}
CANARY_CU = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc", "canary.cu")


def stable_launches(gm: fx.GraphModule) -> bool:
    """Every htam::launch in gm as a launch_o<N> (launcher.stable_args), which Inductor's C++
    wrapper calls through the dispatcher without Python; False, gm untouched, where any launch
    cannot be: more inputs, outputs or dims than the op's slots, or a ranged kernel whose buckets
    the launcher does not hold (fallback.set_in_launcher: it then checks them before each launch).
    A failed launch_o<N>, or one outside its kernel's buckets, runs its region through
    fallback.after_failed_launch, as the Python wrapper's checked_launch does.
    False too until warm_cpp_wrapper's process has run such launches on this torch and launcher
    (stable_launches_checked): a crash in Inductor's generated C++ is no error a try can catch.
    Launches with symbolic sizes (a declared or Dynamo-found dynamic dim) are rewritten alike; their
    graph reaches Inductor with Dynamo's placeholder values (as_dynamo_inputs), without which the
    C++ wrapper misread its inputs.

        >>> stable_launches(gm)    # launch(h, [x, w], [2, 2, 64, 256]) + getitem(., 0) -> launch_o1(h, 2, 2, 64, 256, 0, ..., x, w, None, ...)
        True
    """
    return unstable_launch(gm) is None and _rewrite_launches(gm)


def _rewrite_launches(gm: fx.GraphModule) -> bool:
    """stable_launches' rewrite, once unstable_launch found none in the way; True."""
    from torch_htam import launcher
    _failure_hook()
    for n in _launch_sites(gm):
        outputs, args = launcher.stable_args(*n.args)   # read now: an earlier rewrite may replace an input
        n.target, n.args = launcher.stable_op(outputs), args
        if outputs == 1:     # a Tensor, not a list: its getitem(., 0) users read it directly
            for item in list(n.users):
                n.meta["val"] = item.meta.get("val", n.meta["val"][0])
                item.replace_all_uses_with(n)
                gm.graph.erase_node(item)
        else:
            n.meta["val"] = tuple(n.meta["val"])
    gm.recompile()
    return True


def unstable_launch(gm: fx.GraphModule) -> str | None:
    """Why not every htam::launch in gm can become a launch_o<N> (stable_launches), in words; None
    where each can. Sets each ranged kernel's buckets in the launcher (fallback.set_in_launcher)
    on the way, as the rewrite needs them."""
    from torch_htam import fallback, launcher
    if not stable_launches_checked():
        return ("our launches are not yet checked under it on this torch (warm_cpp_wrapper's process "
                "had not finished when this graph compiled)")
    for n in _launch_sites(gm):
        if launcher.stable_args(*n.args) is None:
            return (f"kernel {n.args[0]}'s launch has more inputs, outputs or dims than launch_o<N>'s slots "
                    f"({launcher.STABLE_INPUTS} inputs, {launcher.STABLE_OUTPUTS} outputs, {launcher.STABLE_META_SLOTS - 2} dims)")
        if not all(u.target is operator.getitem for u in n.users):
            return f"kernel {n.args[0]}'s outputs are used as a list, not each by index"
        if not fallback.set_in_launcher(n.args[0]):
            return f"kernel {n.args[0]}'s buckets could not be set in the launcher (logged)"
    return None


def _launch_sites(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is torch.ops.htam.launch.default]


@functools.cache
def _failure_hook() -> None:
    from torch_htam import fallback, launcher
    launcher.extension().set_failure_hook(fallback.after_failed_launch)


def _markers() -> tuple[str, str]:
    """(the header's marker, the checked launches' marker) in Inductor's cache folder; the second
    names this torch and this launcher's sources, which a check holds for."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir
    from torch_htam import launcher
    tag = re.sub(r"[^\w.+-]", "_", f"{torch.__version__}-{launcher.source_hash()[:16]}")
    return os.path.join(cache_dir(), WARM_MARKER), os.path.join(cache_dir(), f"htam_stable_launch_ok-{tag}")


def header_built() -> bool:
    """Whether the C++ wrapper's precompiled header is built for this Inductor cache folder (by
    warm_cpp_wrapper's process)."""
    return os.path.exists(_markers()[0])


def cpp_wrapper_warmed() -> bool:
    """Whether the header is built (header_built) and this process has found its CPU vector ISA
    (warm_vec_isa): what a C++-wrapper compile waits for beyond its own work."""
    return header_built() and vec_isa_found()


@functools.cache
def warm_vec_isa() -> threading.Thread:
    """Inductor's CPU vector ISA for this process, found in a daemon thread started on the first
    call (the thread is cached: one per process). Every process's first C++ compile finds it,
    building and loading a test library per candidate ISA in Python subprocesses, and keeps it in
    memory only, so the header's marker saves none of it. NOTE: on 16 cores of an H100 host the
    first C++-wrapper compile of a process took 63.3 / 54.1 / 53.3 s (ResNet-18 / GPT-2 / BERT
    bf16, header already built) against 13.6 / 4.8 / 5.2 s for their Python-wrapper floors, and
    the next C++-wrapper compile of the same graph 4.1 / 4.6 / 6.0 s (a probe of
    torch.compile(cpp_wrapper=True) in fresh processes on one cache folder, torch 2.11); the
    search's minute hides it."""
    def find() -> None:
        try:
            from torch._inductor import cpu_vec_isa
            cpu_vec_isa.pick_vec_isa()
        except Exception as e:  # noqa: BLE001 -- the compile that needs it finds it itself
            log.info("torch_htam: no early look for the CPU vector ISA (%s: %s)", type(e).__name__, e)
    thread = threading.Thread(target=find, name="htam-vec-isa", daemon=True)
    thread.started_at = time.monotonic()
    thread.start()
    return thread


def vec_isa_found() -> bool:
    """Whether warm_vec_isa's thread has finished in this process."""
    return warm_vec_isa.cache_info().currsize > 0 and not warm_vec_isa().is_alive()


def vec_isa_ran_s() -> float | None:
    """Seconds since warm_vec_isa's thread started in this process (None: not started)."""
    if not warm_vec_isa.cache_info().currsize:
        return None
    return time.monotonic() - warm_vec_isa().started_at


WRAPPER_EXTRAS = "htam_cpp_wrapper_warm_extra_s.json"   # in Inductor's cache folder, beside the marker
WRAPPER_EXTRAS_KEPT = 3


def wrapper_extras() -> list[float]:
    """The last WRAPPER_EXTRAS_KEPT C++-wrapper arms' compile seconds beyond their floor's, on this
    host with the header built and the process's vector ISA found (cpp_wrapper_warmed,
    note_wrapper_extra); [] where none was recorded or the record is unreadable."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir
    try:
        with open(os.path.join(cache_dir(), WRAPPER_EXTRAS)) as f:
            seen = json.load(f)
        return [float(x) for x in seen if isinstance(x, (int, float)) and x >= 0][-WRAPPER_EXTRAS_KEPT:]
    except (OSError, ValueError, TypeError):
        return []


def note_wrapper_extra(seconds: float) -> None:
    """Record one C++-wrapper arm's compile seconds beyond its floor's, compiled warm
    (cpp_wrapper_warmed): the host's own figure replaces decide.WRAPPER_WARM_EXTRA_S for the next
    decisions. Best effort: a record that cannot be written changes nothing."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir
    path = os.path.join(cache_dir(), WRAPPER_EXTRAS)
    try:
        tmp = f"{path}.{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump([*wrapper_extras(), round(max(seconds, 0.0), 2)][-WRAPPER_EXTRAS_KEPT:], f)
        os.replace(tmp, path)
    except OSError as e:
        log.info("torch_htam: the C++ wrapper's compile time not recorded (%s)", e)


def stable_launches_checked() -> bool:
    """Whether warm_cpp_wrapper's process ran launch_o1 and launch_o2 right from a graph compiled
    with the C++ wrapper, on this torch and launcher (check_stable_launches)."""
    return os.path.exists(_markers()[1])


def stable_launches_record() -> str | None:
    """For a bundle: the launcher sources' hash where our launches were checked under the C++
    wrapper here (stable_launches_checked), else None."""
    from torch_htam import launcher
    return launcher.source_hash() if stable_launches_checked() else None


def adopt_stable_launches(record: str | None) -> bool:
    """A bundle's stable_launches_record, on a server of the bundle's stack (bundle.load checks
    it): the check holds here where the launcher's sources are the same, and is marked so; the
    server's first compile then keeps the C++ wrapper the decision timed."""
    from torch_htam import launcher
    if record is None or record != launcher.source_hash():
        return False
    open(_markers()[1], "w").close()
    return True


def warm_cpp_wrapper(popen=subprocess.Popen) -> subprocess.Popen | None:
    """In a background process (warm_main): build the C++ wrapper's precompiled header (a one-line
    CUDA graph compiled with it), then check our launches under it (check_stable_launches), each
    unless done for this Inductor cache folder already. The process is left to finish on its own
    (a second compile waits on Inductor's lock for the header, then reads it). None where nothing
    was started."""
    markers = _markers()
    if all(os.path.exists(m) for m in markers):
        return None
    try:
        return popen([sys.executable, "-c", "import sys; from torch_htam import inductor; "
                      "inductor.warm_main(*sys.argv[1:])", *markers], stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError as e:
        log.info("torch_htam: no warm-up of Inductor's C++ wrapper (%s)", e)
        return None


def warm_main(header_marker: str, stable_marker: str) -> None:
    """warm_cpp_wrapper's process: each step that is not done yet, its marker written when done.
    A step that crashes the process (as pytorch#190551 did) writes no marker."""
    if not os.path.exists(header_marker):
        f = torch.compile(lambda x: torch.sin(x) + 1, options=dict(WRAPPER_OPTIONS))
        f(torch.ones(8, device="cuda"))
        torch.cuda.synchronize()
        open(header_marker, "w").close()
    if not os.path.exists(stable_marker) and check_stable_launches():
        open(stable_marker, "w").close()


def check_stable_launches() -> bool:
    """The canary kernel (csrc/canary.cu: a + b, and a * b given a second output) launched as
    launch_o1 and launch_o2 from a graph compiled with the C++ wrapper: whether both gave the right
    outputs. Where Inductor's C++ mishandles them the process crashes here, not in the user's."""
    from torch_htam import build, launcher
    res = build.build(open(CANARY_CU).read())
    if not res.ok:
        log.info("torch_htam: the canary kernel did not build (%s)", res.error)
        return False
    handle = launcher.Kernel(res.so_path).handle

    def slots(out_meta: list[int]) -> list[int]:
        n, args = launcher.stable_args(handle, [], out_meta)
        return list(args[1:1 + n * launcher.STABLE_META_SLOTS])
    one, two = slots([0, 1, 8]), slots([0, 1, 8, 0, 1, 8])    # one and two fp32 outputs of 8

    def canary(a, b):
        s = launcher.stable_op(1)(handle, *one, a, b)
        p, q = launcher.stable_op(2)(handle, *two, a, b)
        return s * 2, p + q
    a, b = torch.arange(8.0, device="cuda"), torch.full((8,), 3.0, device="cuda")
    s, pq = torch.compile(canary, options=dict(WRAPPER_OPTIONS), fullgraph=True)(a, b)
    return bool(torch.equal(s, (a + b) * 2) and torch.equal(pq, a + b + a * b))


def cpp_wrapper_hazards(graphs: list[fx.GraphModule]) -> list[str]:
    """The ops of `graphs` that Inductor's C++ wrapper could crash on: a call that returns a list
    of one tensor and that Inductor runs as a fallback (no lowering of its own), which torch 2.11's
    C++ wrapper reads as a bare tensor, a null handle (pytorch#190551; htam::launch of a one-output
    kernel is one, and so may be a user's custom op). Lowered ops (aten.split, unbind: views
    inside Inductor) are no hazard; where this torch does not say what it lowers, every such op
    is one."""
    from torch._inductor import lowering
    lowered, fallbacks = getattr(lowering, "lowerings", {}), getattr(lowering, "fallbacks", ())
    out = []
    for gm in graphs:
        for n in gm.graph.nodes:
            op, val = n.target, n.meta.get("val")
            if (n.op == "call_function" and isinstance(op, torch._ops.OpOverload)
                    and isinstance(val, (list, tuple)) and len(val) == 1
                    and any(isinstance(r.type, torch.ListType) for r in op._schema.returns)
                    and (op not in lowered or op in fallbacks)):
                out.append(str(op))
    return list(dict.fromkeys(out))


# ---- on the user's own model ------------------------------------------------------------------

_CALLS = itertools.count()


def mode_options(mode: str) -> dict[str, Any]:
    """Inductor's config for a torch.compile mode ({} for the default)."""
    if mode == "default":
        return {}
    from torch._inductor import list_mode_options
    return dict(list_mode_options(mode))


def compile_with(model: torch.nn.Module, b: HtamBackend | None, mode: str = "default",
                 options: dict[str, Any] | None = None) -> Callable:
    """torch.compile of the model's call with backend `b` (None: Inductor alone, in `mode`, with
    `options`: Inductor config on top of the mode's), as nn.Module.compile makes it, through a call
    of its own.

    NOTE: Dynamo keeps its compiled code, and counts recompiles against its limit (8), per code
    object. nn.Module._call_impl is one code object for every module in the process, so the end
    to end guard's trial compiles (and a user's other compiled models) would share one limit and,
    past it, silently run eager. Each compile here gets a fresh code object instead.

    NOTE: the fresh function runs with the globals of the model's forward. Dynamo starts tracing
    at it and inlines forward; where the two frames' globals differ, torch 2.11 re-imports the
    inlined frame's module by its name, which fails for a model loaded from a file and never
    registered in sys.modules (KernelBench's harness, plugin loaders, notebooks; pytorch#181243).
    With forward's own globals nothing is re-imported, as when torch.compile starts at forward.
    """
    if b is not None and options:
        raise ValueError("compile_with: with a backend, Inductor options go on it: HtamBackend(options=...)")
    call = fresh_call(model)
    if b is None and options:   # NOTE: torch.compile takes a mode or options, not both
        return torch.compile(call, options=mode_options(mode) | options)
    if b is None:
        return torch.compile(call, mode=None if mode == "default" else mode)
    return torch.compile(call, backend=b)


def fresh_call(model: torch.nn.Module) -> Callable:
    """`lambda *a, **k: model._call_impl(*a, **k)` as a function with a code object of its own
    (htam_call_N) and the globals of the model's forward (see compile_with)."""
    def call(*args, **kwargs):
        return model._call_impl(*args, **kwargs)
    forward = getattr(type(model).forward, "__globals__", None)
    code = call.__code__.replace(co_name=f"htam_call_{next(_CALLS)}")
    fn = types.FunctionType(code, forward if isinstance(forward, dict) else call.__globals__,
                            code.co_name, None, call.__closure__)
    return fn


def install(model: torch.nn.Module, found, kernels: dict[str, Any], mode: str = "default",
            provider=None, min_speedup: float = 1.0, compiled: Callable | None = None,
            backend_obj: HtamBackend | None = None, keep_reexport: bool = False,
            options: dict[str, Any] | None = None) -> torch.nn.Module:
    """Make `model(...)` run torch.compile with our kernels, on the user's own object (what
    nn.Module.compile does), and report it. compiled / backend_obj: a compile made already
    (optimize's end-to-end guard timed it), reused so the model is not compiled again.
    keep_reexport, options: HtamBackend's, where backend_obj is not given.

        >>> model = install(model, extract(model, (x,)), {sig: entry}, mode="reduce-overhead")
        >>> model(x); model.htam_report.format()
    """
    from torch_htam import attach, runtime
    attach.detach(model)
    usable, unusable = runtime._split_usable(kernels, min_speedup)
    b = backend_obj or HtamBackend(usable, mode, provider=provider, keep_reexport=keep_reexport, options=options)
    report = runtime.Report(method=f"{found.capture.method} + inductor ({b.mode})")
    report.tasks = runtime._task_reports(found.tasks, kernels, [], {}, unusable)
    for t in report.tasks:
        if t.signature in usable:
            t.status = runtime.TaskStatus.READY
    return attach.compiled(model, compiled or compile_with(model, b), report, b)


def sync_report(model: torch.nn.Module) -> None:
    """Bring model.htam_report up to what the backend swapped in the graphs compiled so far."""
    from torch_htam import runtime
    b, report = model.__dict__.get("_htam_backend"), getattr(model, "htam_report", None)
    if b is None or report is None:
        return
    sigs = [s for r in b.records for s in r.swapped]
    report.swapped = len(sigs)
    for t in report.tasks:
        if t.signature in sigs:
            t.status = runtime.TaskStatus.SWAPPED
    notes = [r.note for r in b.records if r.note]
    if notes and not report.note:
        report.note = "; ".join(dict.fromkeys(notes))


# ---- Inductor's compiled code, carried by a bundle ----------------------------------------------

def stack() -> dict[str, str | None]:
    """What Inductor's compiled code is valid for: torch, Triton, CUDA, the GPU and torch's matmul
    precision settings. A bundle's cache artifacts are loaded only on the same stack (bundle.load)."""
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    # NOTE: Inductor's FX graph cache key holds these three: code compiled under other settings
    # misses, and the first call compiles. Named here, the load note says which one differs.
    m = torch.backends.cuda.matmul
    matmul = (f"fp32_precision={m.fp32_precision} fp16_reduction={m.allow_fp16_reduced_precision_reduction} "
              f"bf16_reduction={m.allow_bf16_reduced_precision_reduction}")
    return {"torch": torch.__version__, "triton": triton_version, "cuda": torch.version.cuda, "gpu": gpu,
            "matmul": matmul}


def save_artifacts() -> bytes | None:
    """Everything Inductor compiled (or read from its caches) in this process so far, serialized
    (torch.compiler.save_cache_artifacts); None when there is nothing."""
    saved = torch.compiler.save_cache_artifacts()
    return None if saved is None else saved[0]


def load_artifacts(data: bytes) -> None:
    """Put artifacts from save_artifacts into this process's Inductor caches, so the next compile
    of the same graphs on the same stack reads its code instead of generating it."""
    torch.compiler.load_cache_artifacts(data)
