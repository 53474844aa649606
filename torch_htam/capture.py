"""Capture: a model -> aten-level fx graphs, without ever raising on a model we cannot read.

First torch.export(strict=False): one whole-model graph. When that fails (data-dependent
branches, .item(), outputs export cannot flatten such as some cache objects), fall back to Dynamo:
a backend receives each graph between graph breaks and re-exports it with the same
torch.export call, so both paths hand partition the same IR (functional aten ops, meta['val'] set).

Each graph is `ExportedProgram.module()`: runnable, parameters as get_attr nodes, placeholders
are the flattened user inputs (`Capture.inputs[i]` holds real values for them). In-place ops on
intermediates (`nn.ReLU(inplace=True)`, `out += identity`) are rewritten to their out-of-place
twins (functionalize), so they join regions exactly as the out-of-place ops do.

    >>> cap = capture(model, (x,))
    >>> cap.method, len(cap.graphs), cap.problems
    ('export', 1, [])
"""
from __future__ import annotations

import contextlib
import functools
import io
import logging
import operator
import re
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from torch_htam.decompose import decompose_losses
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
        with _quiet_torch():
            ep = torch.export.export(model, args, kwargs, strict=False)
        gm = ep.module()
        _prepare(gm)
        return Capture([gm], "export", [], ep, [tuple(pytree.tree_leaves((args, kwargs)))])
    except Exception as e:  # noqa: BLE001 -- any failure means "try the next path", reported below
        export_problem = f"torch.export failed ({type(e).__name__}: {_first_line(e)})"
        data_dependent = isinstance(e, torch.fx.experimental.symbolic_shapes.GuardOnDataDependentSymNode)
    cap = _capture_dynamo(model, args, kwargs)
    cap.problems.insert(0, export_problem)
    if data_dependent and cap.graphs:
        cap.problems.insert(1, "the model branches on tensor values: only the branch the example "
                               "inputs took is captured, and code on other branches is neither "
                               "planned nor optimized (it runs on PyTorch)")
    return cap


def _prepare(gm: fx.GraphModule) -> None:
    """What every captured graph goes through before partition."""
    simplify_attention_masks(gm)
    decompose_losses(gm)
    functionalize(gm)


@contextlib.contextmanager
def _quiet_torch():
    """Keep torch's own failure output off the user's terminal while we try a capture path.

    NOTE: a failed torch.export prints the partial graph to stderr (torch/export/_trace.py) and
    symbolic_shapes logs a warning; the failure is ours to report, in one line, in .problems.
    """
    quiet = logging.getLogger("torch.fx.experimental.symbolic_shapes")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        quiet.setLevel(level)


def _capture_dynamo(model, args, kwargs) -> Capture:
    """Run the model once under a Dynamo backend that re-exports every graph it is handed."""
    cap = Capture(method="dynamo")

    def backend(gm: fx.GraphModule, example_inputs):
        sub, problem = export_graph(gm, example_inputs)
        if sub is not None:
            cap.graphs.append(sub)
            cap.inputs.append(tuple(example_inputs))
        elif problem:
            cap.problems.append(f"graph {len(cap.graphs)} of Dynamo: {problem}")
        return gm.forward

    try:
        with torch.no_grad(), _quiet_torch():
            torch.compile(model, backend=backend, dynamic=False)(*args, **kwargs)
    except Exception as e:  # noqa: BLE001
        cap.problems.append(f"the model could not be run under Dynamo ({type(e).__name__}: {_first_line(e)})")
    finally:
        torch._dynamo.reset()
    if not cap.graphs:
        cap.method = "none"
        cap.problems.append("nothing could be captured: no task can be made from this model")
    return cap


def export_graph(gm: fx.GraphModule, example_inputs) -> tuple[fx.GraphModule | None, str]:
    """A graph Dynamo made, re-exported to the aten IR partition reads: (graph, "") or (None, why).

    NOTE: Dynamo graphs take parameters as inputs (inlined nn modules), so the re-export sees them
    as user inputs; partition treats placeholders and get_attr alike. A graph of no ops gives
    (None, "").
    """
    try:
        with _quiet_torch():
            ep = torch.export.export(gm, tuple(example_inputs), strict=False)
    except Exception as e:  # noqa: BLE001 -- the caller keeps the graph as it is
        return None, f"could not be exported ({type(e).__name__}: {_first_line(e)})"
    if not any(n.op == "call_function" for n in ep.graph.nodes):
        return None, ""
    sub = ep.module()
    _restore_module_names(sub, gm)
    _prepare(sub)
    return sub, ""


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


# ---- functionalization ---------------------------------------------------------------------

def functionalize(gm: fx.GraphModule) -> int:
    """Rewrite each in-place aten op on an intermediate (`relu_`, `add_`, `hardtanh_`) into its
    out-of-place twin; returns how many were rewritten.

    Exact only where nothing else can see the write, so an op is rewritten when the tensor it
    writes (its `self`) is a fresh result of an earlier op (not a graph input, weight or view),
    and every other reader of that tensor runs before it and makes no view of it. Then readers
    before saw the old value and readers after read the op's own result, as they do now. Writes
    to inputs, weights or views stay as they are (and stay outside regions).

        >>> functionalize(gm)    # torchvision ResNet: every relu_ and `out += identity`
        33
    """
    nodes = list(gm.graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    done = 0
    for n in nodes:
        twin = _out_of_place_twin(n)
        if twin is None or not n.args or not isinstance(n.args[0], fx.Node):
            continue
        x = n.args[0]
        others = [u for u in x.users if u is not n]
        if not _fresh(x) or any(order[u] > order[n] or not _fresh(u) for u in others):
            continue
        with gm.graph.inserting_before(n):
            new = gm.graph.call_function(twin, n.args, n.kwargs)
        new.meta = dict(n.meta)
        n.replace_all_uses_with(new)
        gm.graph.erase_node(n)
        order[new] = order[n]
        done += 1
    if done:
        gm.graph.lint()
        gm.recompile()
    return done


def _out_of_place_twin(n: fx.Node):
    """aten.relu_.default -> aten.relu.default: the functional overload of an op that writes only
    its first argument; None for anything else."""
    t = n.target
    if n.op != "call_function" or not isinstance(t, torch._ops.OpOverload) or t.namespace != "aten":
        return None
    args = t._schema.arguments
    writes = [a for a in args if a.alias_info is not None and a.alias_info.is_write]
    name = t.overloadpacket.__name__
    if len(writes) != 1 or writes[0] is not args[0] or not name.endswith("_") or name.startswith("_"):
        return None
    packet = getattr(torch.ops.aten, name[:-1], None)
    twin = getattr(packet, t._overloadname, None) if packet is not None else None
    if twin is None or twin._schema.is_mutable or len(twin._schema.arguments) != len(args):
        return None
    return twin


def _fresh(n: fx.Node) -> bool:
    """n's value is new memory of its own: an op result that aliases none of its inputs."""
    if n.op != "call_function":
        return False
    if n.target is operator.getitem:
        return _fresh(n.args[0])
    schema = getattr(n.target, "_schema", None)
    return schema is not None and not schema.is_mutable and all(r.alias_info is None for r in schema.returns)


# ---- recording values ------------------------------------------------------------------------

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


# ---- declared dynamic dims -------------------------------------------------------------------

@dataclass(frozen=True)
class Symbol:
    """One declared dynamic size of a captured graph: the placeholder dims that are it (the batch
    dim of x and of its mask), their size in the example call and the declared range. names: the
    model's own words for those dims ("input 0 dim 0"), for messages."""
    dims: tuple[tuple[int, int], ...]   # (placeholder index, dim)
    example: int
    low: int
    high: int
    names: tuple[str, ...] = ()

    def __str__(self) -> str:
        return " = ".join(self.names or [f"placeholder {p} dim {d}" for p, d in self.dims]) \
            + f" in [{self.low}, {self.high}]"


@dataclass
class DynamicDims:
    """Which dims of a captured graph's nodes follow one Symbol, found by running the graph at other
    sizes of it (dynamic_dims). dims: node -> {dim: (low, high)}, a dim of size k * example spanning
    k * the symbol's range (B, or B * S flattened). broken: the nodes that do not run at another
    size (a view with the example's size written into it) or whose sizes do not follow it linearly
    (a strided conv's output, a slice to a literal end): a region holding one stays static.
    downstream: the nodes that read a broken one (directly or not), whose sizes say nothing."""
    symbol: Symbol
    dims: dict[fx.Node, dict[int, tuple[int, int]]] = field(default_factory=dict)
    broken: set[fx.Node] = field(default_factory=set)
    downstream: set[fx.Node] = field(default_factory=set)


def symbols(declared: dict[int, tuple[int, dict[int, tuple[int, int]]]], flat_inputs: tuple) -> list[Symbol]:
    """The Symbols of a graph's declared placeholder dims: {placeholder index: (the model input
    it is, {dim: (low, high)})} (extract.declared_dims).

    NOTE: dims with the same example size and the same range are taken for one size (x and its
    mask share the batch); run apart, each would meet the other at a broadcast and fail there.
    """
    groups: dict[tuple[int, int, int], list[tuple[int, int, int]]] = {}
    for p, (i, dims) in sorted(declared.items()):
        for d, (low, high) in sorted(dims.items()):
            groups.setdefault((int(flat_inputs[p].shape[d]), int(low), int(high)), []).append((p, d, i))
    return [Symbol(tuple((p, d) for p, d, _ in dims), e, lo, hi,
                   tuple(f"input {i} dim {d}" for _, d, i in dims)) for (e, lo, hi), dims in groups.items()]


def dynamic_dims(gm: fx.GraphModule, flat_inputs: tuple, symbol: Symbol) -> DynamicDims:
    """Which node dims follow `symbol`: the graph runs on meta tensors (no memory, no compute) with
    the symbol's dims at two other sizes, and a dim of size n (n = k * example) follows it when it
    is k * size at both; a dim whose size stays is static. Sizes above the example, since a slice
    to the example's length clamps there and shows.

        >>> dd = dynamic_dims(gm, flat, Symbol(((0, 0),), 64, 1, 2048))
        >>> dd.dims[x_node], dd.dims[linear_node]
        ({0: (1, 2048)}, {0: (1, 2048)})
    """
    e = symbol.example
    base = _ShapeProbe(gm, flat_inputs, symbol, e).run_all()
    probes = [_ShapeProbe(gm, flat_inputs, symbol, p) for p in (2 * e + 1, 3 * e + 2)]
    runs = [p.run_all() for p in probes]
    out = DynamicDims(symbol, broken=set().union(*(p.failed for p in probes)),
                      downstream=set().union(*(p.downstream for p in probes)))
    for n, v in base.items():
        if n in out.downstream:
            continue
        shapes = [_shapes(v)] + [_shapes(r.get(n)) for r in runs]
        follow = _following(shapes, e, [p.size for p in probes])
        if follow is None:
            out.broken.add(n)
        elif follow and isinstance(v, torch.Tensor):
            out.dims[n] = {d: (k * symbol.low, k * symbol.high) for d, k in follow.items()}
    return out


def _following(shapes: list[list[tuple]], example: int, sizes: list[int]) -> dict[int, int] | None:
    """{dim: k} of the dims that are k * size in every probe (first tensor of a node's value);
    None when some dim changes otherwise, or the tensors change in number or rank."""
    base, *probed = shapes
    if any(len(p) != len(base) or any(len(a) != len(b) for a, b in zip(p, base)) for p in probed):
        return None
    follow: dict[int, int] = {}
    for t, shape in enumerate(base):
        for d, n in enumerate(shape):
            got = [p[t][d] for p in probed]
            if all(g == n for g in got):
                continue
            if n % example or any(g != n // example * s for g, s in zip(got, sizes)):
                return None
            if t == 0:
                follow[d] = n // example
    return follow


def _shapes(v) -> list[tuple]:
    return [tuple(t.shape) for t in _tensor_leaves(v)]


class _ShapeProbe(fx.Interpreter):
    """Runs a graph on meta tensors with a Symbol's placeholder dims at `size`. A node that fails
    there is recorded in `failed` and gives its example-shaped meta value, so the run goes on.

    NOTE: every node reading a failed one is recorded in `downstream`: its value mixes the
    example's size (the stand-in) with the probe's, which may still broadcast (a [1, 16] stand-in
    against [129, 16]) and look like a dim that follows the size where the real one would not.
    """

    def __init__(self, gm, flat_inputs, symbol: Symbol, size: int):
        super().__init__(gm)
        self.size, self.failed, self.downstream = size, set(), set()
        resized = {p: {} for p, _ in symbol.dims}
        for p, d in symbol.dims:
            resized[p][d] = size
        self.args = [_meta(x, resized.get(p, {})) if isinstance(x, torch.Tensor) else x
                     for p, x in enumerate(flat_inputs)]
        self.values: dict[fx.Node, Any] = {}

    def run_all(self) -> dict[fx.Node, Any]:
        with torch.no_grad():
            self.run(*self.args, enable_io_processing=False)
        return self.values

    def run_node(self, n):
        as_meta = functools.partial(pytree.tree_map, lambda v: _meta(v) if isinstance(v, torch.Tensor) else v)
        if any(a in self.failed or a in self.downstream for a in n.all_input_nodes):
            self.downstream.add(n)
        try:
            out = as_meta(super().run_node(n))
        except Exception:   # noqa: BLE001 -- a node that cannot run at this size: recorded
            if n not in self.downstream:   # else the stand-in's fault, not its own
                self.failed.add(n)
            out = as_meta(n.meta.get("val"))
        self.values[n] = out
        return out


def _meta(t: torch.Tensor, sizes: dict[int, int] | None = None) -> torch.Tensor:
    """A meta tensor like t (dense, in t's dim order) with the dims in `sizes` resized."""
    if t.device.type == "meta" and not sizes:
        return t
    shape = [sizes.get(d, n) for d, n in enumerate(t.shape)] if sizes else list(t.shape)
    order = sorted(range(t.dim()), key=lambda d: (t.stride(d), -d))
    strides, acc = [0] * t.dim(), 1
    for d in order:
        strides[d] = acc
        acc *= max(shape[d], 1)
    return torch.empty_strided(shape, strides, dtype=t.dtype, device="meta")
