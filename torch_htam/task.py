"""Tasks: one operator region of a model as a KernelBench-style problem.

A Task is what the search optimizes and what the cache is keyed by. Its `source` is a complete
KernelBench file (class Model / get_inputs / get_init_inputs); the region's weights are inputs, so
`get_init_inputs()` returns []. Its `graph` is the same region as an aten-level fx.GraphModule
(placeholders in input order, one output tuple), which proposers and the runtime read.

    >>> tasks = torch_htam.extract_tasks(model, (x,))     # built by torch_htam.extract
    >>> print(tasks[0].name, tasks[0].signature, tasks[0].count)
"""
from __future__ import annotations

import dataclasses
import json
import math
import operator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx

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
    (e.g. embedding indices must stay < vocab); None for floating inputs. positive: a floating
    input read as a variance (a batch norm's running_var), drawn as |x| so it is one.
    ranges: the declared size range (low, high), inclusive, of each dynamic dim, aligned with
    `dynamic` (OptimizeConfig.dynamic: batch 1-64); () when none was declared, and then
    verification only tries half and double the size (verify.shape_sets).
    """
    shape: tuple[int, ...]
    dtype: str
    stride: tuple[int, ...]
    dynamic: tuple[int, ...] = ()
    low: int | None = None
    high: int | None = None
    positive: bool = False
    ranges: tuple[tuple[int, int], ...] = ()

    def __post_init__(self):
        # A range belongs to one dynamic dim: a misaligned one would verify the wrong dim.
        if self.ranges and len(self.ranges) != len(self.dynamic):
            raise ValueError(f"TensorSpec.ranges {self.ranges} must give one (low, high) per dynamic "
                             f"dim {self.dynamic}")
        for d, (lo, hi) in zip(self.dynamic, self.ranges):
            if not 1 <= lo <= self.shape[d] <= hi:
                raise ValueError(f"TensorSpec dim {d}: range ({lo}, {hi}) must hold its size "
                                 f"{self.shape[d]}, with low >= 1")

    def range_of(self, dim: int) -> tuple[int, int] | None:
        """The declared (low, high) of `dim`, or None when it has none."""
        if not self.ranges or dim not in self.dynamic:
            return None
        return self.ranges[self.dynamic.index(dim)]

    def with_ranges(self, ranges: dict[int, tuple[int, int]]) -> "TensorSpec":
        """This spec with `ranges` ({dim: (low, high)}) as its dynamic dims, in dim order."""
        dims = tuple(sorted(ranges))
        return dataclasses.replace(self, dynamic=dims,
                                   ranges=tuple((int(ranges[d][0]), int(ranges[d][1])) for d in dims))

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
    def broadcast_dims(self) -> tuple[int, ...]:
        """Dims this tensor is expanded along (size > 1, stride 0: mask.expand_as(scores)); none for
        an empty tensor (whose strides mean nothing)."""
        if self.numel == 0:
            return ()
        return tuple(d for d, (n, st) in enumerate(zip(self.shape, self.stride)) if n > 1 and st == 0)

    def kernel_shape(self, shape: tuple[int, ...] | None = None) -> tuple[int, ...]:
        """The shape a kernel writes for this output (of `shape`, default the spec's): size 1 at the
        broadcast dims. The caller allocates that, dense, and returns its expand to the full shape
        (launcher.task_outputs), as torch's own expand is a view: one value per broadcast line.

            >>> TensorSpec((8, 12, 512, 512), "bool", (262144, 0, 512, 1)).kernel_shape()
            (8, 1, 512, 512)
        """
        shape = tuple(self.shape if shape is None else shape)
        return tuple(1 if d in self.broadcast_dims else n for d, n in enumerate(shape))

    @property
    def kernel_nbytes(self) -> int:
        """Bytes a kernel writes for this output (numel of kernel_shape)."""
        n = 1
        for s in self.kernel_shape():
            n *= s
        return n * torch.empty((), dtype=self.torch_dtype).element_size()

    @property
    def contiguous(self) -> bool:
        return row_major_strides(self.shape) == tuple(self.stride) or self.numel <= 1

    @property
    def channels_last(self) -> bool:
        """A 4-D [N, C, H, W] tensor stored N, H, W, C (and not also contiguous: C or H * W is 1)."""
        if len(self.shape) != 4 or self.contiguous:
            return False
        return self.stride == channels_last_strides(self.shape)

    @property
    def dim_order(self) -> tuple[int, ...] | None:
        """The dims, outermost to innermost in memory, where the tensor covers its memory once in
        some order: (0, 1, 2, 3) contiguous, (0, 2, 3, 1) channels-last, (0, 2, 1, 3) a [B, T, H, d]
        projection read as heads [B, H, T, d]. None where it does not (a slice, an expand), so no
        dense allocation has its strides. Size-1 dims may sit anywhere: their stride addresses nothing.

            >>> TensorSpec((1, 8, 1500, 64), "bfloat16", (768000, 64, 512, 1)).dim_order
            (0, 2, 1, 3)
        """
        return dense_order(self.shape, self.stride)

    def as_channels_last(self) -> "TensorSpec":
        """This 4-D spec with channels-last strides (a conv region's activations, extract.py)."""
        return dataclasses.replace(self, stride=channels_last_strides(self.shape))

    def as_row_major(self) -> "TensorSpec":
        """This spec with row-major (contiguous) strides (extract.row_major_boundary)."""
        return dataclasses.replace(self, stride=row_major_strides(self.shape))

    @staticmethod
    def of(t: torch.Tensor, dynamic: tuple[int, ...] = ()) -> "TensorSpec":
        return TensorSpec(tuple(t.shape), DTYPE_NAMES[t.dtype], tuple(t.stride()), dynamic)

    def to_json(self) -> dict[str, Any]:
        # NOTE: "ranges" only when declared, so a static spec's JSON is what it always was.
        return {"shape": list(self.shape), "dtype": self.dtype, "stride": list(self.stride),
                "dynamic": list(self.dynamic), "low": self.low, "high": self.high,
                "positive": self.positive,
                **({"ranges": [list(r) for r in self.ranges]} if self.ranges else {})}

    @staticmethod
    def from_json(d: dict[str, Any]) -> "TensorSpec":
        return TensorSpec(tuple(d["shape"]), d["dtype"], tuple(d["stride"]),
                          tuple(d.get("dynamic", ())), d.get("low"), d.get("high"),
                          bool(d.get("positive", False)),
                          tuple((int(lo), int(hi)) for lo, hi in d.get("ranges", ())))


def row_major_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Strides in elements of a contiguous tensor of `shape` (a size-0 dim steps as size 1).

        >>> row_major_strides((2, 3, 4))
        (12, 4, 1)
    """
    return order_strides(shape, tuple(range(len(shape))))


def channels_last_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Strides in elements of a dense [N, C, H, W] tensor stored N, H, W, C.

        >>> channels_last_strides((2, 3, 4, 5))
        (60, 1, 15, 3)
    """
    return order_strides(shape, (0, 2, 3, 1))


def order_strides(shape: tuple[int, ...], order: tuple[int, ...]) -> tuple[int, ...]:
    """Strides in elements of a dense tensor of `shape` whose dims lie in memory in `order`,
    outermost first (a size-0 dim steps as size 1).

        >>> order_strides((2, 3, 4), (0, 2, 1))
        (12, 1, 3)
    """
    strides, acc = [0] * len(shape), 1
    for d in reversed(order):
        strides[d] = acc
        acc *= max(shape[d], 1)
    return tuple(strides)


def dense_order(shape: tuple[int, ...], stride: tuple[int, ...]) -> tuple[int, ...] | None:
    """TensorSpec.dim_order of a tensor of `shape` and `stride`: the dims outermost first where it
    covers its memory once (row-major and channels-last preferred where size-1 dims leave a
    choice), else None.

        >>> dense_order((32, 64, 256), (16384, 1, 64)), dense_order((4, 8), (16, 1))
        ((0, 2, 1), None)
    """
    n = len(shape)
    if math.prod(shape) <= 1 or not stride:
        return tuple(range(n))
    for order in (tuple(range(n)), *([(0, 2, 3, 1)] if n == 4 else []), stride_order(stride)):
        dense = order_strides(shape, order)
        if all(size == 1 or a == b for size, a, b in zip(shape, stride, dense)):
            return order
    return None


def stride_order(stride: tuple[int, ...]) -> tuple[int, ...]:
    """The dims outermost to innermost by stride; of equal strides the lower dim is outer, as in a
    row-major tensor's size-1 dims.

        >>> stride_order((16384, 1, 64))
        (0, 2, 1)
    """
    return tuple(sorted(range(len(stride)), key=lambda d: (-stride[d], d)))


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
    example: a safetensors file of the region's real inputs at capture ("in0", "in1", ...: the
    model's own weights and activations), which verification runs besides random inputs; not part
    of the signature, and only for the process that wrote it (optimize keeps it in a temp dir).
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
    example: str | None = field(default=None, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "source": self.source,
                "inputs": [s.to_json() for s in self.inputs],
                "outputs": [s.to_json() for s in self.outputs],
                "signature": self.signature, "ops": self.ops, "count": self.count,
                "modules": self.modules, "flops": self.flops, "bytes": self.bytes,
                **({"example": self.example} if self.example else {})}

    @staticmethod
    def from_json(d: dict[str, Any]) -> "Task":
        return Task(d["name"], d["kind"], d["source"],
                    [TensorSpec.from_json(s) for s in d["inputs"]],
                    [TensorSpec.from_json(s) for s in d["outputs"]],
                    d["signature"], list(d["ops"]), d.get("count", 1), list(d.get("modules", [])),
                    d.get("flops", 0.0), d.get("bytes", 0.0), example=d.get("example"))


def target_name(t) -> str:
    """How a graph node's target is written in a task source and hashed in its signature."""
    return "getitem" if t is operator.getitem else str(t)


# ---- KernelBench source ----------------------------------------------------------------------

_HEADER = '''"""{title}

Generated by torch_htam from a captured model region (KernelBench format): the region's weights
are inputs, so get_init_inputs() returns [].
"""
import torch
import torch.nn as nn


def _rand(shape, stride, dtype, low=None, high=None, positive=False):
    # A tensor with exactly this shape and stride (views/broadcasts included) over fresh storage.
    # positive: a variance (a batch norm's running_var), which a negative value would make NaN.
    extent = 1 + sum((n - 1) * s for n, s in zip(shape, stride) if n > 0)
    if dtype == torch.bool:
        flat = torch.randint(0, 2, (extent,)).bool()
    elif dtype.is_floating_point:
        flat = torch.randn(extent, dtype=dtype)
        flat = flat.abs() if positive else flat
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
            elif n.target is operator.mul:   # a size: k * in0.size(d) (symbolic.size_node)
                body.append(f"{names[n]} = {_lit(args[0])} * {_lit(args[1])}")
            else:
                parts = [_lit(a) for a in args] + [f"{k}={_lit(v)}" for k, v in kwargs.items()]
                body.append(f"{names[n]} = torch.ops.{target_name(n.target)}({', '.join(parts)})")
        elif n.op == "output":
            outs = [names[o] for o in n.args[0]]
            body.append("return " + (outs[0] if len(outs) == 1 else "(" + ", ".join(outs) + ",)"))
        else:
            raise ValueError(f"cannot write {n.op} node {n.name} into a task source")
    params = ", ".join(f"in{i}" for i in range(len(inputs)))
    specs = [f"        _rand({s.shape}, {s.stride}, torch.{s.dtype}"
             + (f", {s.low}, {s.high}" if s.low is not None else "")
             + (", positive=True" if s.positive else "") + ")," for s in inputs]
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


# ---- task files ----------------------------------------------------------------------------

def exec_source(source: str, name: str) -> dict:
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
    ns = exec_source(task.source, task.name)
    return ns["Model"](*ns["get_init_inputs"]())



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
