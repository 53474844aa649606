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
    dynamic: dict | None = None                         # the declared dims the graphs have symbolic
                                                        # (extract.check_dynamic's); None: static


def capture(model: torch.nn.Module, example_inputs: tuple, example_kwargs: dict | None = None,
            dynamic: dict[int, dict[int, tuple[int, int]]] | None = None) -> Capture:
    """Capture `model` at aten level. Never raises for a model it cannot capture: see .problems.

    dynamic: the declared dynamic dims (extract.check_dynamic): the model is captured through
    Dynamo with those dims marked dynamic, as torch.compile will run it, so the graphs' sizes are
    symbols over the declared ranges (export_graph) and the tasks the runtime finds in the
    compiled model are the ones searched here.

        >>> cap = capture(model.eval(), (torch.randint(0, 128, (2, 16)),))
        >>> gm = cap.graphs[0]        # fx.GraphModule, every node has meta['val']
    """
    args, kwargs = tuple(example_inputs), dict(example_kwargs or {})
    if dynamic:
        cap = _capture_dynamo(model, marked(args, dynamic), kwargs, dynamic=True)
        if cap.graphs and not cap.problems:
            cap.dynamic = dynamic
            return cap
        static = capture(model, args, kwargs)
        static.problems.insert(0, "the declared dynamic sizes could not be kept (" + "; ".join(cap.problems)
                               + "): every task is at the example's sizes")
        return static
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


def marked(args: tuple, dynamic: dict[int, dict[int, tuple[int, int]]]) -> tuple:
    """The example inputs with their declared dims marked dynamic over their ranges, for Dynamo:
    the first torch.compile call with them makes graphs that serve the range (no recompile per
    size). Each marked input is an alias (x.detach(): same storage), so the user's own tensors
    carry no mark (a mark makes every later compile of them dynamic, or fail where the model
    fixes that size)."""
    out = list(args)
    for i, dims in dynamic.items():
        out[i] = args[i] if args[i].requires_grad else args[i].detach()
        for d, (low, high) in dims.items():
            torch._dynamo.mark_dynamic(out[i], d, min=low, max=high)
    return tuple(out)


def _prepare(gm: fx.GraphModule) -> None:
    """What every captured graph goes through before partition."""
    _drop_local_hooks(gm)
    simplify_attention_masks(gm)
    decompose_losses(gm)
    functionalize(gm)


def _drop_local_hooks(gm: fx.GraphModule) -> None:
    """Drop what ExportedProgram.module() sets on the graph module as local functions: hooks that
    switch nn.Module graph inputs on and off around each call (nothing for our graphs: tensor
    inputs only), and train() / eval() overrides that raise. NOTE: Inductor's FX graph cache
    pickles the graph module's __dict__ and hooks, and a local function does not pickle: every
    compile of a re-exported graph warned "Failed to pickle cache key" and missed that cache.
    Export's input-constraint check (a module-level function) stays."""
    for hooks in (gm._forward_pre_hooks, gm._forward_hooks):
        for key, fn in list(hooks.items()):
            if "<locals>" in getattr(fn, "__qualname__", ""):
                del hooks[key]
                gm._forward_hooks_always_called.pop(key, None)
    for name in ("train", "eval"):
        if "<locals>" in getattr(gm.__dict__.get(name), "__qualname__", ""):
            del gm.__dict__[name]


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


def _capture_dynamo(model, args, kwargs, dynamic: bool = False) -> Capture:
    """Run the model once under a Dynamo backend that re-exports every graph it is handed.
    dynamic: the dims marked dynamic on the inputs (mark_dynamic) stay so; else every size is
    static."""
    cap = Capture(method="dynamo")

    def backend(gm: fx.GraphModule, example_inputs):
        sub, problem = export_graph(gm, example_inputs)
        if sub is not None:
            cap.graphs.append(sub)
            plan = sub.htam_plan
            cap.inputs.append(plan.tensors(example_inputs) if plan is not None else tuple(example_inputs))
        elif problem:
            cap.problems.append(f"graph {len(cap.graphs)} of Dynamo: {problem}")
        return gm.forward

    try:
        with torch.no_grad(), _quiet_torch():
            torch.compile(model, backend=backend, dynamic=None if dynamic else False)(*args, **kwargs)
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

    A graph with symbolic sizes (dynamic shapes) is exported with those dims dynamic over their
    ranges and takes its tensor inputs only (symbolic.SizedCall: a size input is read off a tensor
    that carries it); `graph.htam_plan` is then the symbolic.ExportPlan, else None.

    NOTE: Dynamo graphs take parameters as inputs (inlined nn modules), so the re-export sees them
    as user inputs; partition treats placeholders and get_attr alike. A graph of no ops gives
    (None, "").
    """
    from torch_htam import symbolic
    plan = symbolic.export_plan(gm, example_inputs)
    if isinstance(plan, str):
        return None, f"could not be exported with dynamic sizes: {plan}"
    try:
        with _quiet_torch():
            if plan is None:
                ep = torch.export.export(gm, tuple(example_inputs), strict=False)
            else:
                ep = _export_sized(gm, plan, example_inputs)
    except Exception as e:  # noqa: BLE001 -- the caller keeps the graph as it is
        return None, f"could not be exported ({type(e).__name__}: {_first_line(e)})"
    if not any(n.op == "call_function" for n in ep.graph.nodes):
        return None, ""
    sub = _unguarded_module(ep)
    _restore_module_names(sub, gm)
    _prepare(sub)
    sub.htam_plan = plan
    return sub, ""


def _unguarded_module(ep) -> fx.GraphModule:
    """ep.module() without the `_guards_fn` submodule that checks its inputs on each call (Dynamo
    guards the graph this re-export compiles into; export's pre-hook still checks the inputs). Its
    forward is a local function, which Inductor's FX graph cache cannot pickle (_drop_local_hooks)."""
    try:
        return ep.module(check_guards=False)
    except TypeError:    # a torch whose module() has no check_guards generates no such submodule
        return ep.module()


def _export_sized(gm: fx.GraphModule, plan, example_inputs):
    """gm exported with the plan's dims dynamic over their ranges. Where export reports a range
    violated (on CUDA, the serve bench's decoder did, over a range its Dynamo graph holds; the CPU
    export did not), it is exported again letting export narrow the range: the tasks then carry
    the range export kept and sizes outside it run the original region.
    NOTE: in a tracing context of its own: inside Dynamo's, export's guards on its own inputs land
    in the calling frame's and fail there. And on aliases of the inputs: Dynamo hands over the
    caller's own tensors, and export strips their dynamic marks when it is done (the next compile
    of them would be static)."""
    from torch_htam import symbolic
    tensors = tuple(x.detach() for x in plan.tensors(example_inputs))
    with torch._guards.tracing(None):
        try:
            return torch.export.export(symbolic.SizedCall(gm, plan), tensors,
                                       dynamic_shapes=plan.dynamic_shapes(), strict=False)
        except torch._dynamo.exc.UserError as e:
            if "Constraints violated" not in str(e):
                raise
        return torch.export.export(symbolic.SizedCall(gm, plan), tensors,
                                   dynamic_shapes=plan.dynamic_shapes(refinable=True), strict=False)


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
