"""torch_htam: make PyTorch models faster with generated, verified CUDA kernels.

    >>> import torch_htam
    >>> fast = torch_htam.optimize(model, (x,))        # verified kernels swapped in, same object
    >>> print(fast.htam_report.format())
    >>> tasks = torch_htam.extract_tasks(model, (x,))  # the regions, as KernelBench-style tasks
    >>> torch_htam.evaluate(tasks[0], cuda_source)     # build + verify + time one candidate
    >>> torch_htam.load(model, "bundle/", (x,))        # a precompiled bundle, no search/compiler

Names resolve lazily, so `import torch_htam` is quick and needs no GPU.
"""
from __future__ import annotations

import importlib

from torch_htam.version import __version__

_LAZY = {
    "Evaluation": "torch_htam.evaluation", "Precision": "torch_htam.policy",
    "Task": "torch_htam.task", "TensorSpec": "torch_htam.task", "backend": "torch_htam.inductor",
    "optimize": "torch_htam.pipeline", "precompile": "torch_htam.pipeline",
    "OptimizeConfig": "torch_htam.config", "extract_tasks": "torch_htam.extract",
    "evaluate": "torch_htam.evaluation", "load": "torch_htam.bundle",
    "Report": "torch_htam.runtime", "restore": "torch_htam.runtime",
    "capture": "torch_htam.capture",
}

__all__ = [*_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        mod = importlib.import_module(_LAZY[name])
        return getattr(mod, name)
    if name in ("runtime", "cache", "build", "search", "htg"):
        return importlib.import_module(f"torch_htam.{name}")
    raise AttributeError(f"module 'torch_htam' has no attribute {name!r}")
