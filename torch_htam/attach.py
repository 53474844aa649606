"""Every attribute torch_htam sets on a user's model, set and taken back here and nowhere else.

    compiled(model, call, report)   model(...) runs `call` (a torch.compile of the model, with or
                                    without our kernels), as nn.Module.compile installs one
    forward(model, fwd, report)     model.forward is `fwd` (the replay of the captured graph)
    detach(model)                   what torch_htam set is gone; a compile the user installed
                                    before (model.compile()) is back
    suspended(model)                a block in which the model runs as detach leaves it, and
                                    after which everything torch_htam set is back
    leave(model, reason)            the model on its original path, with a report saying why

The attributes: `_compiled_call_impl` (what nn.Module.__call__ runs when set), `forward` (an
instance override), `htam_report`, `__getstate__` (copies and pickles run the original path),
and our bookkeeping, each named `_htam_*`.
"""
from __future__ import annotations

import contextlib
import functools
import logging
from typing import Callable

from torch import nn

log = logging.getLogger("torch_htam")

_OURS = ("_htam_backend", "_htam_compiled", "_htam_user_compiled", "_htam_original_forward")


def compiled(model: nn.Module, call: Callable, report, backend=None) -> nn.Module:
    """model(...) runs `call`. backend: the HtamBackend inside it (the report reads what it swapped)."""
    detach(model)
    user = model.__dict__.get("_compiled_call_impl")
    if user is not None:
        model._htam_user_compiled = user      # the user's own model.compile(): back on detach
    model._compiled_call_impl = call
    model._htam_compiled = True
    if backend is not None:
        model._htam_backend = backend
    model.htam_report = report
    model.__getstate__ = functools.partial(plain_state, model)
    return model


def forward(model: nn.Module, fwd: Callable, report) -> nn.Module:
    """model.forward is `fwd` (runtime.replay's), with its report."""
    detach(model)
    model._htam_original_forward = model.__dict__.get("forward")   # an instance override, if any
    model.__getstate__ = functools.partial(plain_state, model)
    model.forward = fwd
    model.htam_report = report
    return model


def detach(model: nn.Module) -> nn.Module:
    """Take back what compiled() / forward() set (a no-op on a model they never touched)."""
    d = model.__dict__
    if d.pop("_htam_compiled", None):
        d.pop("_htam_backend", None)
        model._compiled_call_impl = d.pop("_htam_user_compiled", None)
        d.pop("__getstate__", None)
    fwd = d.get("forward")
    if fwd is not None and getattr(fwd, "htam", None) is not None:
        prev = d.pop("_htam_original_forward", None)
        del d["forward"]
        d.pop("__getstate__", None)
        if prev is not None:
            model.forward = prev
    return model


@contextlib.contextmanager
def suspended(model: nn.Module):
    """Inside the block the model runs its original forward (detach); after it, everything
    torch_htam had set is back as it was, the same compiled call included, so nothing is
    compiled or decided again (precompile reads the original graph this way)."""
    d = model.__dict__
    keys = ("_compiled_call_impl", "forward", "htam_report", "__getstate__", *_OURS)
    saved = {k: d[k] for k in keys if k in d}
    detach(model)
    try:
        yield model
    finally:
        for k in keys:
            if k not in saved:
                d.pop(k, None)
        d.update(saved)


def leave(model: nn.Module, reason: str, tasks: list | None = None, report=None) -> nn.Module:
    """The model on its original path, and `model.htam_report.note` saying why.

        >>> leave(model, "no CUDA GPU").htam_report.note
        'no CUDA GPU'
    """
    from torch_htam.report import Report, TaskReport
    detach(model)
    report = report or Report()
    report.note = reason
    if tasks and not report.tasks:
        report.tasks = [TaskReport(t.name, t.signature, t.count, kind=t.kind) for t in tasks]
    model.htam_report = report
    log.info("torch_htam: %s", reason)
    return model


def plain_state(model: nn.Module) -> dict:
    """What copy.deepcopy and pickle (torch.save) take of a model we attached to: its state
    without our call or forward, so a copy runs its original forward (or the user's own compile).

    NOTE: the swapped forward is a closure over this model's graph, weights and kernel handles;
    copied along, it made a deep copy compute with the first model's weights whatever was done to
    the copy's (and torch.save failed on the closure). Optimize the copy to swap kernels into it.
    """
    state = dict(model.__dict__)
    for key in ("forward", "__getstate__", "htam_report", *_OURS):
        state.pop(key, None)
    if model.__dict__.get("_htam_compiled"):
        state["_compiled_call_impl"] = None   # a compiled call is bound to this model, not the copy
    if model.__dict__.get("_htam_original_forward") is not None:
        state["forward"] = model.__dict__["_htam_original_forward"]
    return state
