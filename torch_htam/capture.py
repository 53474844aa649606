"""Capture: a model -> aten-level fx graphs, without ever raising on a model we cannot read.

First torch.export(strict=False): one whole-model graph. When that fails (data-dependent
branches, .item(), outputs export cannot flatten such as some cache objects), fall back to Dynamo:
a backend receives each graph between graph breaks and re-exports it with the same
torch.export call, so both paths hand partition the same IR (functional aten ops, meta['val'] set).

Each graph is `ExportedProgram.module()`: runnable, parameters as get_attr nodes, placeholders
are the flattened user inputs (`Capture.inputs[i]` holds real values for them).

    >>> cap = capture(model, (x,))
    >>> cap.method, len(cap.graphs), cap.problems
    ('export', 1, [])
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from torch_htam.graph_simplify import simplify_attention_masks


@dataclass
class Capture:
    """What capture found. method: "export" | "dynamo" | "none"."""
    graphs: list[fx.GraphModule] = field(default_factory=list)
    method: str = "none"
    problems: list[str] = field(default_factory=list)   # human-readable, one line each
    exported: Any = None                                # the ExportedProgram (export path only)
    inputs: list[tuple] = field(default_factory=list)   # real flat placeholder values per graph


def capture(model: torch.nn.Module, example_inputs: tuple, example_kwargs: dict | None = None) -> Capture:
    """Capture `model` at aten level. Never raises for a model it cannot capture: see .problems.

        >>> cap = capture(model.eval(), (torch.randint(0, 128, (2, 16)),))
        >>> gm = cap.graphs[0]        # fx.GraphModule, every node has meta['val']
    """
    args, kwargs = tuple(example_inputs), dict(example_kwargs or {})
    try:
        ep = torch.export.export(model, args, kwargs, strict=False)
        gm = ep.module()
        simplify_attention_masks(gm)
        return Capture([gm], "export", [], ep, [tuple(pytree.tree_leaves((args, kwargs)))])
    except Exception as e:  # noqa: BLE001 -- any failure means "try the next path", reported below
        export_problem = f"torch.export failed ({type(e).__name__}: {_first_line(e)})"
    cap = _capture_dynamo(model, args, kwargs)
    cap.problems.insert(0, export_problem)
    return cap


def _capture_dynamo(model, args, kwargs) -> Capture:
    """Run the model once under a Dynamo backend that re-exports every graph it is handed."""
    cap = Capture(method="dynamo")

    def backend(gm: fx.GraphModule, example_inputs):
        # NOTE: Dynamo graphs take parameters as inputs (inlined nn modules), so the re-export
        # sees them as user inputs; partition treats placeholders and get_attr alike.
        try:
            ep = torch.export.export(gm, tuple(example_inputs), strict=False)
            if any(n.op == "call_function" for n in ep.graph.nodes):
                sub = ep.module()
                _restore_module_names(sub, gm)
                simplify_attention_masks(sub)
                cap.graphs.append(sub)
                cap.inputs.append(tuple(example_inputs))
        except Exception as e:  # noqa: BLE001 -- one bad piece must not lose the others
            cap.problems.append(f"graph {len(cap.graphs)} of Dynamo could not be exported "
                                f"({type(e).__name__}: {_first_line(e)})")
        return gm.forward

    try:
        with torch.no_grad():
            torch.compile(model, backend=backend, dynamic=False)(*args, **kwargs)
    except Exception as e:  # noqa: BLE001
        cap.problems.append(f"the model could not be run under Dynamo ({type(e).__name__}: {_first_line(e)})")
    finally:
        torch._dynamo.reset()
    if not cap.graphs:
        cap.method = "none"
        cap.problems.append("nothing could be captured: no task can be made from this model")
    return cap


def _restore_module_names(sub: fx.GraphModule, dynamo_gm: fx.GraphModule) -> None:
    """Re-export loses the user's module paths; copy them back from Dynamo's own nodes.

    Dynamo records nn_module_stack like {"...": ("L['self'].h[0].mlp", cls)}; we keep the
    clean dotted path "h.0.mlp". Re-exported nodes keep Dynamo's stack under their own keys when
    torch preserves it (2.11+), so we clean whatever paths are there.
    """
    for n in sub.graph.nodes:
        stack = n.meta.get("nn_module_stack")
        if not stack:
            continue
        clean = {k: (_clean_path(path), cls) for k, (path, cls) in stack.items()
                 if isinstance(cls, str) and "<locals>" not in cls}
        n.meta["nn_module_stack"] = clean


def _clean_path(path: str) -> str:
    # "L['self'].h[0].mlp" -> "h.0.mlp";  "L['s'].l" -> "l";  "getattr(L['self'].h, '0')" -> "h.0"
    path = re.sub(r"getattr\((.*?), '([^']*)'\)", r"\1.\2", path)
    path = re.sub(r"L\['[^']*'\]\.?", "", path)
    path = re.sub(r"\[(\d+)\]", r".\1", path)
    path = re.sub(r"\['([^']*)'\]", r".\1", path)
    return path.strip(".")


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    line = text.splitlines()[0] if text else ""
    return line[:300]


class _Recorder(fx.Interpreter):
    """Runs a graph and keeps every node's value as it was when the node produced it.

    NOTE: captured graphs keep in-place ops (nn.ReLU(inplace=True) -> aten.relu_, `out += x` ->
    aten.add_): they overwrite the tensor an earlier node produced, e.g. a batch_norm's output. So
    before a node writes to an argument, every recorded value on that storage is swapped for a
    copy; the run itself keeps the live tensors, so it computes exactly what the model computes.
    """

    def __init__(self, gm):
        super().__init__(gm, garbage_collect_values=False)
        self.values: dict[fx.Node, Any] = {}
        self.on_storage: dict[int, list[fx.Node]] = {}   # storage address -> nodes recorded on it

    def run_node(self, n):
        for t in _written_tensors(n, self.env):
            self._freeze(_storage_key(t))
        self.values[n] = out = super().run_node(n)
        for t in _tensor_leaves(out):
            self.on_storage.setdefault(_storage_key(t), []).append(n)
        return out

    def _freeze(self, key: int) -> None:
        for m in self.on_storage.pop(key, []):
            self.values[m] = pytree.tree_map(
                lambda v: v.clone() if isinstance(v, torch.Tensor) and _storage_key(v) == key else v,
                self.values[m])


def _written_tensors(n: fx.Node, env: dict) -> list[torch.Tensor]:
    """The tensors n overwrites: arguments its aten schema marks as written (Tensor(a!))."""
    schema = getattr(n.target, "_schema", None) if n.op == "call_function" else None
    if schema is None or not schema.is_mutable:
        return []
    out = []
    for i, arg in enumerate(schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        a = n.args[i] if i < len(n.args) else n.kwargs.get(arg.name)
        nodes = []
        fx.node.map_arg(a, nodes.append)
        out += [t for m in nodes for t in _tensor_leaves(env.get(m))]
    return out


def _tensor_leaves(x) -> list[torch.Tensor]:
    return [v for v in pytree.tree_leaves(x) if isinstance(v, torch.Tensor)]


def _storage_key(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):   # sparse/nested tensors: no one storage to alias
        return id(t)


def record_values(gm: fx.GraphModule, flat_inputs: tuple) -> dict[fx.Node, Any]:
    """Run a captured graph on real (flat) inputs; return every node's value as it produced it
    (a later in-place op in the graph does not change it).

        >>> vals = record_values(cap.graphs[0], cap.inputs[0])
        >>> vals[some_node].shape
    """
    rec = _Recorder(gm)
    with torch.no_grad():
        rec.run(*flat_inputs, enable_io_processing=False)
    return rec.values
