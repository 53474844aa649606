"""A kernel that fails at run time costs that call one region, not the model.

Every swapped region's kernel is registered here with its task when it is loaded (runtime.swap).
A launch that raises (a nonzero return code: HTAM_ERR_SHAPE for inputs it was not verified on, a
cuDNN status) runs the task's reference region on the same inputs instead, returns outputs laid out
as the launch would have (out_meta), counts the call against the kernel and logs it once. The
end-to-end decision reads the counts and drops a kernel that failed during its trial.

    >>> outs = run_or_fallback(handle, inputs, out_meta, launcher.extension().launch)
    >>> failures()            # {handle: calls that ran the region instead}

A failure that leaves the CUDA context unusable (an illegal address) is raised as it is: nothing
can run on that device after it.
"""
from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from torch_htam import launcher
from torch_htam.errors import is_crash_message

log = logging.getLogger("torch_htam")


@dataclass
class _Region:
    """The region a kernel handle stands for: its task, and the reference built on first need."""
    task: Any
    ref: Any = field(default=None, repr=False)

    def matches(self, inputs: list[torch.Tensor]) -> bool:
        specs = self.task.inputs
        return len(specs) == len(inputs) and all(
            tuple(x.shape) == tuple(s.shape) and x.dtype == s.torch_dtype for x, s in zip(inputs, specs))

    def run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        if self.ref is None:
            from torch_htam.task import load_reference
            self.ref = load_reference(self.task).to(inputs[0].device).eval()
        out = self.ref(*inputs)
        return list(out) if isinstance(out, (tuple, list)) else [out]


# NOTE: caches keyed by the launcher's kernel handle, as the launcher's own table is: a process
# loads each kernel library once and graphs compiled from it name it by handle.
_REGIONS: dict[int, list[_Region]] = {}
_FAILED: Counter = Counter()


def register(handle: int, task) -> None:
    """Let `handle`'s failures run `task`'s reference region (one handle may serve several tasks
    with one source; the inputs' shapes pick the task)."""
    regions = _REGIONS.setdefault(int(handle), [])
    if all(r.task.signature != task.signature for r in regions):
        regions.append(_Region(task))


def failures(handles=None) -> dict[int, int]:
    """{handle: calls that ran the region instead}, for `handles` (default all) that failed."""
    return {h: n for h, n in _FAILED.items() if n and (handles is None or h in handles)}


def run_or_fallback(handle: int, inputs: list[torch.Tensor], out_meta: list[int],
                    launch: Callable) -> list[torch.Tensor]:
    """launch(handle, inputs, out_meta), or where it raises, the registered region's reference on
    the same inputs, in out_meta's dtypes, shapes and layouts."""
    try:
        return launch(handle, inputs, out_meta)
    except RuntimeError as e:
        region = next((r for r in _REGIONS.get(int(handle), ()) if r.matches(inputs)), None)
        if region is None or is_crash_message(str(e)):
            raise
        if not _FAILED[handle]:
            log.warning("torch_htam: kernel for %s (%s) failed at run time, its region runs instead "
                        "(logged once; the report counts the calls): %s", region.task.name,
                        region.task.signature[:12], str(e).splitlines()[0][:300])
        _FAILED[handle] += 1
        with torch.no_grad():
            return _as_launched(region.run(inputs), out_meta)


def checked_launch(handle: int, inputs: list[torch.Tensor], out_meta: list[int]) -> list[torch.Tensor]:
    """The launcher extension's launch, where a kernel that fails runs its region instead: what
    Inductor's generated code calls (inductor.direct_call)."""
    return run_or_fallback(handle, inputs, out_meta, launcher.extension().launch)


def fast_launch(handle: int, inputs: list[torch.Tensor], out_meta: list[int]) -> list[torch.Tensor]:
    """launcher.fast_launch for swapped regions: checked_launch in plain eager (the replay), the
    htam::launch op for anything traced. NOTE: verification calls launcher.fast_launch itself,
    where a failing kernel must fail, not run its region."""
    if launcher.plain_eager(inputs):
        return checked_launch(handle, inputs, out_meta)
    return torch.ops.htam.launch.default(handle, inputs, out_meta)


def _as_launched(outs: list[torch.Tensor], out_meta: list[int]) -> list[torch.Tensor]:
    """Reference outputs as the launch returns them: fresh tensors of out_meta's dtype, shape (an
    expanded output narrowed to the kernel's shape) and memory format."""
    metas = launcher.decode_out_meta(out_meta)
    if len(outs) != len(metas):
        raise RuntimeError(f"torch_htam fallback: the region gave {len(outs)} outputs, the launch "
                           f"expects {len(metas)}")
    res = []
    for o, (dtype, shape, fmt) in zip(outs, metas):
        o = o[tuple(slice(0, n) for n in shape)] if o.dim() == len(shape) else o.reshape(shape)
        res.append(torch.empty(shape, dtype=dtype, device=o.device, memory_format=fmt).copy_(o))
    return res
