"""Model specs for the CLI: "path/to/file.py", "path/to/file.py:fn" or "package.module:fn".

The function (default `get_model`) returns (model, example_inputs) and may take device/dtype.

    >>> model, inputs = load_model_spec("examples/gpt_block.py")
    >>> model, inputs = load_model_spec("examples/gpt_block.py:get_model", device="cpu")

Every way loading can fail raises ModelSpecError with a one-line message for the user: a device
this machine does not have, a missing file, a syntax error (file:line), an import that fails while
the file runs, get_model() raising (the original exception is its __cause__), a wrong return value;
check_runs: the model raising on its own example inputs. A `module:function` spec imports with the
current directory on the import path, as `python -m` does (sys.path is restored after).
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
import traceback
from pathlib import Path

import torch


class ModelSpecError(ValueError):
    """A model spec that cannot be loaded; the message says why and what to write instead."""


def check_device(device: str) -> str:
    """`device` if this machine has it, else ModelSpecError saying what to pass instead."""
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as e:
        raise ModelSpecError(f"--device {device}: not a device torch knows ({e}); "
                             "use cuda, cuda:N or cpu") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ModelSpecError(f"--device {device}: no CUDA device is available here "
                                 "(torch.cuda.is_available() is False); use --device cpu to plan, "
                                 "or run on a GPU machine")
        n = torch.cuda.device_count()
        if dev.index is not None and dev.index >= n:
            raise ModelSpecError(f"--device {device}: this machine has {n} CUDA device(s) "
                                 f"(cuda:0 to cuda:{n - 1})")
    return device


def default_device(device: str | None = None) -> str:
    """`device` (checked), else cuda when there is one: the kernels run on a GPU."""
    if device:
        return check_device(device)
    return "cuda" if torch.cuda.is_available() else "cpu"


def load_model(spec: str, device: str | None = None):
    """(model, example_inputs, device) of a spec on `device` (checked), else cuda if there is one,
    else cpu: what every CLI command that loads a model calls. Raises ModelSpecError only."""
    device = default_device(device)
    model, inputs = load_model_spec(spec, device=device)
    return model, inputs, device


def load_model_spec(spec: str, device: str | None = None, dtype: torch.dtype | None = None):
    """Import the spec's function and call it; returns (model, example_inputs as a tuple).

    device/dtype are passed only when given and when the function accepts them; a device this
    machine lacks is refused before the file is imported.
    """
    if device is not None:
        check_device(device)
    target, _, fn_name = _split(spec)
    module = _import(target, spec)
    fn = getattr(module, fn_name or "get_model", None)
    if not callable(fn):
        raise ModelSpecError(f"{target} has no function {fn_name or 'get_model'!r}: define "
                             "get_model() returning (model, example_inputs), or name the "
                             "function as FILE.py:FUNCTION")
    kwargs = {k: v for k, v in (("device", device), ("dtype", dtype)) if v is not None}
    try:
        params = inspect.signature(fn).parameters
        kwargs = {k: v for k, v in kwargs.items() if k in params}
    except (TypeError, ValueError):   # no signature to read (a builtin): pass nothing
        kwargs = {}
    name = getattr(fn, "__name__", fn_name or "get_model")
    try:
        result = fn(**kwargs)
    except Exception as e:  # noqa: BLE001 -- the user's function failed: say so, keep the cause
        raise ModelSpecError(f"{spec}: {name}() raised {type(e).__name__}: {e}"
                             f"{_where(e, getattr(module, '__file__', None))}") from e
    if not (isinstance(result, (tuple, list)) and len(result) == 2
            and isinstance(result[0], torch.nn.Module)):
        raise ModelSpecError(f"{spec}: {name}() must return (model, example_inputs), "
                             f"got {type(result).__name__}")
    model, inputs = result
    inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    return model, inputs


def check_runs(model: torch.nn.Module, inputs: tuple, spec: str) -> None:
    """ModelSpecError if the model raises on its own example inputs (a forward that cannot run is
    no model to plan or optimize: say why, not that nothing was captured)."""
    try:
        with torch.no_grad():
            model(*inputs)
    except Exception as e:  # noqa: BLE001 -- the user's model failed: say so, keep the cause
        module = sys.modules.get(type(model).__module__)
        msg = " ".join(str(e).split())
        raise ModelSpecError(f"{spec}: the model raised {type(e).__name__} on its example inputs: "
                             f"{msg}{_where(e, getattr(module, '__file__', None))}; fix the model "
                             "or the inputs its get_model() returns") from e


def _split(spec: str) -> tuple[str, str, str]:
    # "C:/x.py:fn" has two colons on Windows: split on the last one that follows ".py" or a module
    if spec.endswith(".py") or ":" not in spec:
        return spec, "", ""
    return spec.rpartition(":")


def _where(e: BaseException, file: str | None = None) -> str:
    """' (at FILE:LINE)': the innermost frame of the traceback in `file` (the model's module) when
    there is one there, else the innermost frame; '' without a traceback."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if not f.filename.startswith("<frozen")]
    if file:
        mine = [f for f in frames if Path(f.filename).resolve() == Path(file).resolve()]
        frames = mine or frames
    return f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""


def _syntax(e: SyntaxError, target: str) -> ModelSpecError:
    where = f"{e.filename or target}:{e.lineno}" if e.lineno else (e.filename or target)
    return ModelSpecError(f"{where}: {e.msg} (could not import the model file)")


def _import(target: str, spec: str):
    if target.endswith(".py"):
        return _import_file(Path(target), target, spec)
    try:
        with _cwd_on_path():
            return importlib.import_module(target)
    except ModuleNotFoundError as e:
        if e.name and (target == e.name or target.startswith(e.name + ".")):   # the spec's own
            raise ModelSpecError(f"cannot import {target!r} from spec {spec!r}: {e}. Give a .py path "
                                 "or an importable module, e.g. mypkg.models:get_model") from e
        raise _import_error(e, target) from e
    except Exception as e:  # noqa: BLE001
        raise _import_error(e, target) from e


@contextlib.contextmanager
def _cwd_on_path():
    """The current directory first on sys.path while a `module:function` spec imports, as under
    `python -m` (the `torch-htam` script's sys.path has its own folder instead); removed after,
    so the rest of the process imports as it did."""
    cwd = os.getcwd()
    if "" in sys.path or cwd in sys.path:
        yield
        return
    sys.path.insert(0, cwd)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(cwd)


def _import_file(path: Path, target: str, spec: str):
    """The model file as a module registered in sys.modules (importlib's recipe).

    NOTE: torch.compile's Dynamo imports a traced function's module by name to guard its globals;
    a file loaded without registering it failed there ("No module named 'htam_model_gpt_block'").
    The name carries a hash of the path, so two files with one stem stay two modules.
    """
    if not path.is_file():
        raise ModelSpecError(f"model file {target} does not exist (spec {spec!r})")
    name = f"htam_model_{path.stem}_{hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:8]}"
    mod_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(mod_spec)
    sys.modules[name] = module
    try:
        mod_spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 -- the file's top-level code failed, not get_model()
        del sys.modules[name]
        raise _import_error(e, target) from e
    return module


def _import_error(e: Exception, target: str) -> ModelSpecError:
    """What failed while importing the model's module, said as the user needs it."""
    if isinstance(e, SyntaxError):
        return _syntax(e, target)
    if isinstance(e, ImportError):
        return ModelSpecError(f"could not import {target}: {e}{_where(e)}")
    return ModelSpecError(f"could not import {target}: its top-level code raised "
                          f"{type(e).__name__}: {e}{_where(e)}")
