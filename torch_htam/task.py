"""Tasks: one operator region of a model as a KernelBench-style problem.

A Task is what the search optimizes and what the cache is keyed by. Its `source` is a complete
KernelBench file (class Model / get_inputs / get_init_inputs); the region's weights are inputs, so
`get_init_inputs()` returns []. Its `graph` is the same region as an aten-level fx.GraphModule
(placeholders in input order, one output tuple), which proposers and the runtime read.

    >>> tasks = torch_htam.extract_tasks(model, (x,))
    >>> print(tasks[0].name, tasks[0].signature, tasks[0].count)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

# dtype <-> name used in specs, records and the kernel ABI (csrc/htam_abi.h codes).
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "float64": torch.float64, "int64": torch.int64, "int32": torch.int32, "bool": torch.bool,
    "int8": torch.int8, "uint8": torch.uint8,
}
DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}


@dataclass(frozen=True)
class TensorSpec:
    """Shape/dtype/layout of one task input or output.

    shape, stride: in elements. dynamic: indices of dims that vary at run time (batch, sequence);
    verification tries a second size for them. low/high: value range for integer inputs
    (e.g. embedding indices must stay < vocab); None for floating inputs.
    """
    shape: tuple[int, ...]
    dtype: str
    stride: tuple[int, ...]
    dynamic: tuple[int, ...] = ()
    low: int | None = None
    high: int | None = None

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=self.torch_dtype).element_size()

    @property
    def contiguous(self) -> bool:
        expect, acc = [], 1
        for s in reversed(self.shape):
            expect.append(acc)
            acc *= max(s, 1)
        return tuple(reversed(expect)) == tuple(self.stride) or self.numel <= 1

    @staticmethod
    def of(t: torch.Tensor, dynamic: tuple[int, ...] = ()) -> "TensorSpec":
        return TensorSpec(tuple(t.shape), DTYPE_NAMES[t.dtype], tuple(t.stride()), dynamic)

    def to_json(self) -> dict[str, Any]:
        return {"shape": list(self.shape), "dtype": self.dtype, "stride": list(self.stride),
                "dynamic": list(self.dynamic), "low": self.low, "high": self.high}

    @staticmethod
    def from_json(d: dict[str, Any]) -> "TensorSpec":
        return TensorSpec(tuple(d["shape"]), d["dtype"], tuple(d["stride"]),
                          tuple(d.get("dynamic", ())), d.get("low"), d.get("high"))


@dataclass
class Task:
    """One region as a KernelBench-style task.

    kind: "elementwise" | "rowwise" | "gemm" | "conv" | "attention" | "other".
    ops: aten op names in graph order, e.g. ["aten.addmm.default", "aten.gelu.default"].
    signature: stable hex hash of normalized graph + input specs + constants (no names, no ids).
    count: how many places in the model the region occurs; modules: qualified module names.
    flops, bytes: minimum work and traffic (each input read once, each output written once) for
    the roofline; bytes in bytes.
    graph: aten fx.GraphModule of the region (not serialized; rebuilt from `source` when needed).
    """
    name: str
    kind: str
    source: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    signature: str
    ops: list[str]
    count: int = 1
    modules: list[str] = field(default_factory=list)
    flops: float = 0.0
    bytes: float = 0.0
    graph: Any = field(default=None, repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "source": self.source,
                "inputs": [s.to_json() for s in self.inputs],
                "outputs": [s.to_json() for s in self.outputs],
                "signature": self.signature, "ops": self.ops, "count": self.count,
                "modules": self.modules, "flops": self.flops, "bytes": self.bytes}

    @staticmethod
    def from_json(d: dict[str, Any]) -> "Task":
        return Task(d["name"], d["kind"], d["source"],
                    [TensorSpec.from_json(s) for s in d["inputs"]],
                    [TensorSpec.from_json(s) for s in d["outputs"]],
                    d["signature"], list(d["ops"]), d.get("count", 1), list(d.get("modules", [])),
                    d.get("flops", 0.0), d.get("bytes", 0.0))


# ---- building tasks from graphs ------------------------------------------------------------
# Below: region -> Task (graph, signature, KernelBench source, cost), model -> deduplicated
# tasks, and KernelBench file -> Task. Imports of capture/partition stay inside functions so the
# contracts above load without them.

import hashlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import operator  # noqa: E402
from pathlib import Path  # noqa: E402

import torch.fx as fx  # noqa: E402

# FLOPs per element of the output for non-GEMM ops (the "1-few per element" of the roofline);
# ops not listed count 1. Views and no-ops count 0.
ELEMENT_FLOPS = {"gelu": 8, "silu": 4, "sigmoid": 4, "tanh": 4, "erf": 4, "exp": 2,
                 "softmax": 5, "_softmax": 5, "log_softmax": 5, "_log_softmax": 5,
                 "_safe_softmax": 5, "layer_norm": 8, "native_layer_norm": 8, "rms_norm": 5,
                 "group_norm": 8, "batch_norm": 2, "_native_batch_norm_legit_no_training": 2}


def region_graph(gm: fx.GraphModule, region) -> fx.GraphModule:
    """The region as its own GraphModule: placeholders in region.inputs order, one output tuple.

        >>> g = region_graph(gm, region); g(*inputs)   # -> tuple of region.outputs values
    """
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for i, a in enumerate(region.inputs):
        p = g.placeholder(f"in{i}")
        p.meta["val"] = a.meta.get("val")
        env[a] = p
    for n in region.nodes:
        env[n] = g.node_copy(n, lambda a: env[a])
    g.output(tuple(env[o] for o in region.outputs))
    g.lint()
    return fx.GraphModule(torch.nn.Module(), g)


def graph_signature(graph: fx.GraphModule, inputs: list[TensorSpec]) -> str:
    """sha256[:16] of op targets, argument structure, constants and input specs (no names/ids).

        >>> graph_signature(task.graph, task.inputs)
        '3f9c0a1b2d4e5f60'
    """
    index: dict[fx.Node, tuple] = {}
    items: list = [[(s.shape, s.dtype, s.stride) for s in inputs]]
    for n in graph.graph.nodes:
        if n.op == "placeholder":
            index[n] = ("in", len(index))
            continue
        index[n] = ("n", len(index))
        norm = fx.node.map_arg((n.args, n.kwargs), lambda a: index[a])
        items.append([n.op, _target_name(n.target), _normalize(norm)])
    return hashlib.sha256(json.dumps(items, default=str).encode()).hexdigest()[:16]


def _normalize(x):
    """Constants in a hashable, run-independent form (devices vary, so they hash as 'device')."""
    if isinstance(x, dict):
        return sorted((k, _normalize(v)) for k, v in x.items())
    if isinstance(x, (list, tuple)):
        return [_normalize(v) for v in x]
    if isinstance(x, torch.device):
        return "device"
    if isinstance(x, float):
        return repr(x)
    if isinstance(x, (torch.dtype, torch.memory_format, torch.layout)):
        return str(x)
    return x


def _target_name(t) -> str:
    return "getitem" if t is operator.getitem else str(t)


def region_to_task(gm: fx.GraphModule, region, values: dict | None = None, name: str | None = None) -> Task:
    """Build the Task of one region of a captured graph.

    values: real node values (capture.record_values) give integer inputs their true range
    [low, high); without them integer inputs get [0, 2).

        >>> task = region_to_task(gm, partition(gm)[0])
        >>> task.signature, [s.shape for s in task.inputs]
    """
    graph = region_graph(gm, region)
    inputs = [_spec(a, values) for a in region.inputs]
    outputs = [_spec(o, None) for o in region.outputs]
    ops = [str(n.target) for n in region.nodes if n.op == "call_function"
           and n.target is not operator.getitem]
    sig = graph_signature(graph, inputs)
    task = Task(name or f"{region.kind}_{_short_ops(region)}", region.kind, "", inputs, outputs,
                sig, ops, 1, _modules(region.nodes))
    task.flops = float(sum(_node_flops(n) for n in region.nodes))
    task.bytes = float(sum(_distinct_bytes(s) for s in inputs + outputs))
    task.graph = graph
    task.source = kernelbench_source(graph, inputs, title=f"{task.name}: {' -> '.join(ops)}")
    return task


def _spec(n: fx.Node, values: dict | None) -> TensorSpec:
    val = n.meta.get("val")
    if not isinstance(val, torch.Tensor):
        raise ValueError(f"region boundary {n.name} is not a tensor ({type(val).__name__})")
    if val.dtype not in DTYPE_NAMES:
        raise ValueError(f"{n.name} has dtype {val.dtype}, which tasks do not support")
    spec = TensorSpec.of(val)
    if val.dtype.is_floating_point:
        return spec
    low, high = 0, 2
    real = values.get(n) if values else None
    if isinstance(real, torch.Tensor) and real.numel() and val.dtype != torch.bool:
        low, high = int(real.min()), int(real.max()) + 1
    return TensorSpec(spec.shape, spec.dtype, spec.stride, (), low, high)


def _short_ops(region) -> str:
    from torch_htam.partition import COMPUTE, category, op_name
    names = [op_name(n) for n in region.nodes if category(n) in COMPUTE]
    return "_".join(dict.fromkeys(names))[:60]


def _modules(nodes) -> list[str]:
    """Innermost module qualname of every node, first seen first (e.g. "h.0.mlp.c_fc")."""
    found: list[str] = []
    for n in nodes:
        stack = n.meta.get("nn_module_stack") or {}
        paths = [p for p, _ in stack.values() if p]
        if paths and paths[-1] not in found:
            found.append(paths[-1])
    return found


def _shape(n) -> tuple:
    v = n.meta.get("val") if isinstance(n, fx.Node) else None
    return tuple(v.shape) if isinstance(v, torch.Tensor) else ()


def _node_flops(n: fx.Node) -> int:
    """Minimum FLOPs of one node: 2*M*N*K for GEMMs, its conv analog, a few per element else."""
    from torch_htam.partition import ANCHOR, ROWWISE, ELEMENTWISE, category, op_name
    cat, name = category(n), op_name(n)
    out = n.meta.get("val")
    numel = out.numel() if isinstance(out, torch.Tensor) else 0
    if cat == ANCHOR:
        if "conv" in name:
            w = _shape(n.args[1])   # (C_out, C_in/groups, *kernel)
            return 2 * numel * math.prod(w[1:])
        if "scaled_dot_product" in name:
            q, k, v = (_shape(a) for a in n.args[:3])   # (..., L, E), (..., S, E), (..., S, Ev)
            batch = math.prod(q[:-2])
            causal = n.kwargs.get("is_causal", n.args[5] if len(n.args) > 5 else False)
            f = 2 * batch * q[-2] * k[-2] * (q[-1] + v[-1])
            return f // 2 if causal else f
        a = n.args[1] if name in ("addmm", "baddbmm", "addbmm") else n.args[0]
        return 2 * numel * _shape(a)[-1]   # K = last dim of the left operand
    if cat == ROWWISE:
        return ELEMENT_FLOPS.get(name, 1) * math.prod(_shape(n.args[0]))
    if cat == ELEMENTWISE:
        return ELEMENT_FLOPS.get(name, 1) * numel
    return 0


def _distinct_bytes(s: TensorSpec) -> int:
    # broadcast (stride-0) dims read the same bytes again: count them once
    n = math.prod(d for d, st in zip(s.shape, s.stride) if st != 0) if s.numel else 0
    return n * torch.empty((), dtype=s.torch_dtype).element_size()


# ---- KernelBench source ----------------------------------------------------------------------

_HEADER = '''"""{title}

Generated by torch_htam from a captured model region (KernelBench format): the region's weights
are inputs, so get_init_inputs() returns [].
"""
import torch
import torch.nn as nn


def _rand(shape, stride, dtype, low=None, high=None):
    # A tensor with exactly this shape and stride (views/broadcasts included) over fresh storage.
    extent = 1 + sum((n - 1) * s for n, s in zip(shape, stride) if n > 0)
    if dtype == torch.bool:
        flat = torch.randint(0, 2, (extent,)).bool()
    elif dtype.is_floating_point:
        flat = torch.randn(extent, dtype=dtype)
    else:
        flat = torch.randint(low, high, (extent,), dtype=dtype)
    return flat.as_strided(shape, stride)


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, {params}):
{body}


def get_inputs():
    return [
{inputs}
    ]


def get_init_inputs():
    return []
'''


def kernelbench_source(graph: fx.GraphModule, inputs: list[TensorSpec], title: str = "task") -> str:
    """A KernelBench file whose Model.forward calls torch.ops.aten.* exactly as `graph` does.

    forward returns one tensor for a single-output region, else a tuple in output order.
    """
    names: dict[fx.Node, str] = {}
    body: list[str] = []
    for n in graph.graph.nodes:
        if n.op == "placeholder":
            names[n] = f"in{len(names)}"
        elif n.op == "call_function":
            names[n] = f"v{len(names)}"
            args = fx.node.map_arg(n.args, lambda a: _Ref(names[a]))
            kwargs = fx.node.map_arg(n.kwargs, lambda a: _Ref(names[a]))
            if n.target is operator.getitem:
                body.append(f"{names[n]} = {_lit(args[0])}[{_lit(args[1])}]")
            else:
                parts = [_lit(a) for a in args] + [f"{k}={_lit(v)}" for k, v in kwargs.items()]
                body.append(f"{names[n]} = torch.ops.{_target_name(n.target)}({', '.join(parts)})")
        elif n.op == "output":
            outs = [names[o] for o in n.args[0]]
            body.append("return " + (outs[0] if len(outs) == 1 else "(" + ", ".join(outs) + ",)"))
        else:
            raise ValueError(f"cannot write {n.op} node {n.name} into a task source")
    params = ", ".join(f"in{i}" for i in range(len(inputs)))
    specs = [f"        _rand({s.shape}, {s.stride}, torch.{s.dtype}"
             + (f", {s.low}, {s.high}" if s.low is not None else "") + ")," for s in inputs]
    # NOTE: constants (devices) in the graph come from the capture device; `in0.device` keeps
    # the reference runnable wherever its inputs live.
    return _HEADER.format(title=title, params=params, body="\n".join("        " + b for b in body),
                          inputs="\n".join(specs))


class _Ref(str):
    """A variable name inside an argument structure (printed bare, not quoted)."""


def _lit(x) -> str:
    if isinstance(x, _Ref):
        return str(x)
    if isinstance(x, (list, tuple)):
        inner = ", ".join(_lit(v) for v in x)
        return f"[{inner}]" if isinstance(x, list) else f"({inner}{',' if len(x) == 1 else ''})"
    if isinstance(x, float):
        return f"float('{x}')" if math.isinf(x) or math.isnan(x) else repr(x)
    if isinstance(x, (torch.dtype, torch.layout, torch.memory_format)):
        return str(x)   # "torch.float32", "torch.strided", "torch.contiguous_format"
    if isinstance(x, torch.device):
        return "in0.device"
    if isinstance(x, (bool, int, str, type(None))):
        return repr(x)
    raise ValueError(f"cannot write constant {x!r} ({type(x).__name__}) into a task source")


# ---- model -> tasks, files <-> tasks -------------------------------------------------------

def tasks_from_capture(cap) -> list[Task]:
    """Deduplicated tasks of every captured graph, most expensive first (see extract_tasks)."""
    from torch_htam.capture import record_values
    from torch_htam.partition import partition
    by_sig: dict[str, Task] = {}
    for gm, flat in zip(cap.graphs, cap.inputs):
        values = record_values(gm, flat)
        for region in partition(gm):
            try:
                task = region_to_task(gm, region, values)
            except ValueError as e:
                cap.problems.append(f"region {[n.name for n in region.nodes]} skipped: {e}")
                continue
            seen = by_sig.get(task.signature)
            if seen is None:
                by_sig[task.signature] = task
            else:   # identical layer: one task, counted and attributed to every module
                seen.count += 1
                seen.modules += [m for m in task.modules if m not in seen.modules]
    return sorted(by_sig.values(), key=lambda t: (-estimated_seconds(t) * t.count, t.signature))


def extract_tasks(model: torch.nn.Module, example_inputs: tuple, example_kwargs: dict | None = None) -> list[Task]:
    """Capture, partition and deduplicate: one Task per distinct region, most costly first.

    Never raises for a model that cannot be captured: it returns [] (capture.capture says why).

        >>> tasks = extract_tasks(model.eval(), (idx,))
        >>> [(t.kind, t.count) for t in tasks][:2]
        [('gemm', 12), ('attention', 12)]
    """
    from torch_htam.capture import capture
    return tasks_from_capture(capture(model, example_inputs, example_kwargs))


def estimated_seconds(task: Task, gpu=None) -> float:
    """Roofline lower bound of one call: max(flops / peak FLOP/s, bytes / bandwidth).

    Uses the detected GPU; without one, the H100 rates from torch_htam.gpu (only the order of
    tasks depends on it).
    """
    from torch_htam import gpu as gpu_mod
    info = gpu if gpu is not None else gpu_mod.detect()
    flops_rate = (info.fp32_flops if info and info.fp32_flops else gpu_mod._PEAKS[(9, 0)][1])
    bandwidth = info.mem_bandwidth if info else 3.35e12
    return max(task.flops / flops_rate, task.bytes / bandwidth)


def _exec_source(source: str, name: str) -> dict:
    namespace: dict = {"__name__": f"htam_task_{name}"}
    exec(compile(source, f"<task {name}>", "exec"), namespace)
    for needed in ("Model", "get_inputs", "get_init_inputs"):
        if needed not in namespace:
            raise ValueError(f"task source {name!r} defines no {needed}: a KernelBench file needs "
                             "class Model, get_inputs() and get_init_inputs()")
    return namespace


def load_reference(task: Task) -> torch.nn.Module:
    """The task's reference model: exec task.source, return Model(*get_init_inputs()).

        >>> ref = load_reference(task); ref(*[x.cuda() for x in get_inputs()])
    """
    ns = _exec_source(task.source, task.name)
    return ns["Model"](*ns["get_init_inputs"]())


def task_from_source(source: str, name: str | None = None) -> Task:
    """One Task covering the whole forward of a KernelBench file (e.g. from KernelBench itself).

    The kind follows its ops (a GEMM/conv/attention anchor wins, then row-wise, else elementwise);
    dynamic dims are empty, integer inputs keep the range seen in get_inputs().

        >>> task = task_from_source(Path("19_ReLU.py").read_text(), "19_ReLU")
    """
    from torch_htam.capture import record_values
    from torch_htam.partition import ANCHOR_KINDS, ROWWISE, Region, category, op_name
    name = name or "task"
    ns = _exec_source(source, name)
    model = ns["Model"](*ns["get_init_inputs"]()).eval()
    inputs = tuple(ns["get_inputs"]())
    gm = torch.export.export(model, inputs, strict=False).module()
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    # user inputs first (as get_inputs() lists them), then the weights Model built
    ins = [n for op in ("placeholder", "get_attr") for n in gm.graph.nodes if n.op == op and n.users]
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    outs = list(dict.fromkeys(a for a in out_node.all_input_nodes))
    anchor = next((n for n in nodes if op_name(n) in ANCHOR_KINDS), None)
    row = next((n for n in nodes if category(n) == ROWWISE), None)
    kind = ANCHOR_KINDS[op_name(anchor)] if anchor else "rowwise" if row else "elementwise"
    region = Region(nodes, ins, outs, kind, anchor or row)
    # NOTE: weights Model built in __init__ become task inputs here, so the generated source
    # (not the original file) is the reference that matches task.inputs.
    return region_to_task(gm, region, record_values(gm, inputs), name=name)


def export_tasks(tasks: list[Task], directory: str | Path) -> list[Path]:
    """Write <name>_<signature>.py KernelBench files and a tasks.json index; return the paths.

        >>> export_tasks(tasks, "kb_tasks/")
    """
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths, index = [], []
    for t in tasks:
        p = out / f"{t.name}_{t.signature}.py"
        p.write_text(t.source)
        paths.append(p)
        index.append({**t.to_json(), "file": p.name})
    (out / "tasks.json").write_text(json.dumps(index, indent=1))
    return paths
