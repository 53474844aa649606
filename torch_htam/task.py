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
