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

Graph breaks, recompiles on new shapes, training (autograd) and no_grad / inference_mode behave as
they do under torch.compile: Dynamo decides what to compile and when; a graph whose inputs need
gradients is handed to Inductor unswapped (our kernels have no backward).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.fx as fx

log = logging.getLogger("torch_htam")

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@dataclass
class GraphRecord:
    """One graph Dynamo compiled: how many sites it had, which tasks ran our kernels, or why none."""
    sites: int = 0
    swapped: list[str] = field(default_factory=list)   # task names, one per swapped site
    note: str = ""


class HtamBackend:
    """The backend object torch.compile calls as backend(gm, example_inputs) -> callable.

    kernels: {task signature: cache Entry or kernel object}; None reads this GPU's cache (every
    verified kernel admitted under the task's precision policy). mode: Inductor's mode, as in
    torch.compile(mode=...). inductor=False hands the swapped graph back to run as it is (tests,
    and a way to see the swap without Inductor). records: one GraphRecord per compiled graph.
    """

    def __init__(self, kernels: dict[str, Any] | None = None, mode: str = "default",
                 provider=None, min_speedup: float = 1.0, inductor: bool = True):
        if mode not in MODES:
            raise ValueError(f"mode={mode!r}: use one of {', '.join(MODES)} (torch.compile's modes)")
        self.kernels, self.mode, self.provider = kernels, mode, provider
        self.min_speedup, self.inductor = min_speedup, inductor
        self.records: list[GraphRecord] = []
        self._alive: list = []   # NOTE: launch handles are raw pointers into these loaded kernels

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
        return compile_fx(graph, example_inputs, config_patches=self._inductor_options())

    def _inductor_options(self) -> dict:
        if self.mode == "default":
            return {}
        from torch._inductor import list_mode_options
        return dict(list_mode_options(self.mode))

    def _swap(self, gm: fx.GraphModule, example_inputs: list, record: GraphRecord) -> fx.GraphModule:
        from torch_htam import runtime
        from torch_htam.capture import Capture, export_graph
        from torch_htam.extract import from_capture
        if not all(isinstance(x, torch.Tensor) for x in example_inputs):
            record.note = "symbolic sizes (dynamic shapes): left to Inductor"
            return gm
        if torch.is_grad_enabled() and any(x.requires_grad for x in example_inputs):
            record.note = "inputs need gradients (kernels have no backward): left to Inductor"
            return gm
        sub, problem = export_graph(gm, example_inputs)
        if sub is None:
            record.note = problem
            return gm
        found = from_capture(Capture([sub], "dynamo", inputs=[tuple(example_inputs)]))
        record.sites = len(found.sites)
        kernels = self._kernels_for(found.tasks)
        if not kernels:
            record.note = "no site has a verified kernel"
            return gm
        new, swapped = runtime.swap(sub, found.sites, kernels, self.provider or op_provider())
        self._alive.append(new.htam_kernels)
        record.swapped = [s.name for s in swapped]
        if new.htam_load_errors:
            record.note = "; ".join(f"{sig[:12]}: {e}" for sig, e in new.htam_load_errors.items())
        return new if swapped else gm

    def _kernels_for(self, tasks: list) -> dict[str, Any]:
        if self.kernels is not None:
            return {t.signature: self.kernels[t.signature] for t in tasks if t.signature in self.kernels}
        from torch_htam import gpu
        from torch_htam.cache import KernelCache
        from torch_htam.policy import admitted
        info = gpu.detect()
        if info is None:
            return {}
        cache = KernelCache(info.arch)
        return {t.signature: e for t in tasks
                if (e := admitted(cache.get(t.signature), t)) is not None and e.usable(self.min_speedup)}


def backend(kernels: dict[str, Any] | None = None, mode: str = "default", **kw) -> HtamBackend:
    """torch.compile's backend= for torch_htam: Inductor plus our verified kernels.

        >>> model = torch.compile(model, backend=torch_htam.backend(mode="reduce-overhead"))
    """
    return HtamBackend(kernels, mode, **kw)


def op_provider():
    """The launcher's own op in the graph (what Inductor sees as an opaque extern kernel)."""
    from torch_htam import launcher
    from torch_htam.runtime import Provider, launcher_provider
    launcher.get()
    return Provider(torch.ops.htam.launch.default, launcher_provider().load)
