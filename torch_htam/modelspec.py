"""Model specs for the CLI: "path/to/file.py", "path/to/file.py:fn" or "package.module:fn".

The function (default `get_model`) returns (model, example_inputs) and may take device/dtype.

    >>> model, inputs = load_model_spec("examples/gpt_block.py")
    >>> model, inputs = load_model_spec("examples/gpt_block.py:get_model")
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
from pathlib import Path

import torch


class ModelSpecError(ValueError):
    """A model spec that cannot be loaded; the message says why and what to write instead."""


def load_model_spec(spec: str, device: str | None = None, dtype: torch.dtype | None = None):
    """Import the spec's function and call it; returns (model, example_inputs as a tuple).

    device/dtype are passed only when given and when the function accepts them.
    """
    target, _, fn_name = _split(spec)
    module = _import(target, spec)
    fn = getattr(module, fn_name or "get_model", None)
    if not callable(fn):
        raise ModelSpecError(f"{target} has no function {fn_name or 'get_model'!r}: define "
                             "get_model() returning (model, example_inputs), or name the "
                             "function as FILE.py:FUNCTION")
    kwargs = {k: v for k, v in (("device", device), ("dtype", dtype)) if v is not None}
    params = inspect.signature(fn).parameters
    kwargs = {k: v for k, v in kwargs.items() if k in params}
    result = fn(**kwargs)
    if not (isinstance(result, (tuple, list)) and len(result) == 2
            and isinstance(result[0], torch.nn.Module)):
        raise ModelSpecError(f"{spec}: {fn.__name__}() must return (model, example_inputs), "
                             f"got {type(result).__name__}")
    model, inputs = result
    inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    return model, inputs


def _split(spec: str) -> tuple[str, str, str]:
    # "C:/x.py:fn" has two colons on Windows: split on the last one that follows ".py" or a module
    if spec.endswith(".py") or ":" not in spec:
        return spec, "", ""
    return spec.rpartition(":")


def _import(target: str, spec: str):
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise ModelSpecError(f"model file {target} does not exist (spec {spec!r})")
        mod_spec = importlib.util.spec_from_file_location(f"htam_model_{path.stem}", path)
        module = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(module)
        return module
    try:
        return importlib.import_module(target)
    except ImportError as e:
        raise ModelSpecError(f"cannot import {target!r} from spec {spec!r}: {e}. Give a .py path "
                             "or an importable module, e.g. mypkg.models:get_model") from e
