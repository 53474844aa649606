"""Runtime: swap verified kernels into a captured graph, and install it behind guards in the model.

    swap(gm, sites, kernels)        every site (extract.Site) whose task has a kernel becomes one call
                                    launcher.fast_launch(handle, [inputs...], out_meta) (the
                                    htam::launch op when traced); the rest of
                                    the graph stays the original aten ops (that IS the fallback)
    install(model, found, ...)      the user's own model object, its forward replaced by a guarded
                                    wrapper: inputs as captured -> rewritten graph, else -> the
                                    original forward (counted in model.htam_report)
    restore(model)                  the original forward back

Where the rewritten graph gets its weights: through the model's own submodules, on every call, so
in-place updates and reassigned parameters are seen (one fetch through the modules' dicts,
_fetch_attrs: FX's own attribute chains cost ResNet-50 0.44 ms a call).

Dynamo captures (torch.export failed) are not installed: the model stays on its original path and
the report says why. NOTE: swapping those would mean running our graph inside a torch.compile of the
user's forward, whose recompiles, graph breaks and guards we would then own on top of theirs;
the kernels found for such a model are still cached and shipped in bundles.

    >>> model = install(model, extract(model, (x,)), {task.signature: cache.get(task.signature)})
    >>> model(x)                  # swapped kernels;  model(x_other_batch) -> original path
    >>> print(model.htam_report.format())
"""
from __future__ import annotations

import functools
import heapq
import logging
import operator
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from torch_htam import attach, fallback
from torch_htam.report import Report, TaskReport, TaskStatus  # noqa: F401 -- runtime.Report for callers

log = logging.getLogger("torch_htam")


# The report (Report, TaskReport, TaskStatus) is report.py's; runtime fills it in.


# ---- kernel providers ------------------------------------------------------------------------

@dataclass
class Provider:
    """How a swapped region runs.

    op: a torch op with the schema (int handle, Tensor[] inputs, int[] out_meta) -> Tensor[] and a
    fake impl; load: cache Entry or kernel object -> object with an int `.handle`, kept alive as
    long as the rewritten graph. Tests plug in a CPU stand-in with the same schema.
    """
    op: Callable
    load: Callable[[Any], Any]
    # (loaded kernel, task, kept buckets) -> None: readies a ranged kernel for its sizes (preplan)
    prepare: Callable[[Any, Any, list], None] | None = None


def launcher_provider() -> Provider:
    """The real path: launcher.Kernel(.so) called through launcher.fast_launch, which is
    torch.ops.htam.launch for anything traced (compile, export) and its cheaper binding in eager."""
    from torch_htam import fallback, launcher

    def load(kernel):
        if hasattr(kernel, "handle"):
            return kernel
        if getattr(kernel, "so_path", None) is None:
            raise RuntimeError(f"cache entry {kernel.signature[:16]} has no intact library "
                               f"({kernel.problem}); it must be rebuilt and re-verified first")
        return launcher.Kernel(str(kernel.so_path))

    launcher.get()   # builds/loads the C++ launcher once, registering torch.ops.htam.launch
    return Provider(fallback.fast_launch, load, preplan)


# ---- pre-planning -----------------------------------------------------------------------------

def planned_sizes(high: int) -> list[int]:
    """The batch sizes a ranged conv kernel plans for a batch of up to `high`: 2^k and 3 * 2^k,
    the slices batch_slice.cuh cuts every batch into.

        >>> planned_sizes(64)
        [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]
    """
    out, p = [], 1
    while p <= high:
        out += [p] + ([p + p // 2] if p >= 2 and p + p // 2 <= high else [])
        p *= 2
    return out


_PREPLANNED: dict[tuple[str, str], list[int]] = {}   # a cache: {(library, task): sizes readied in this process}


def preplan(kernel, task, buckets) -> list[int]:
    """Launch a ranged conv task's kernel once at every batch size it plans (planned_sizes, up to
    its buckets' top) on throw-away inputs, so cuDNN's plans are made at load, not on a served
    request (ResNet-50's convs: 0.68-0.97 s per kernel here, then 0.06-0.08 ms for any new batch
    size, where one plan per size cost 348-454 ms: bench/slice_plans.py, H100); the sizes launched (none
    for other tasks, without CUDA, or while a CUDA graph is captured). Once per library and task
    per process; a size the kernel refuses is left to the fallback at run time."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch_htam import verify
    so_path, lead = getattr(kernel, "so_path", None), verify.leading_dim(task)
    # NOTE: a conv kernel slices its batch only where the served range is the batch (dim 0,
    # proposer.match_task's batch_ranged); over any other dim it plans the sizes it meets
    if (task.kind != "conv" or not buckets or so_path is None or lead is None or lead[1] != 0
            or not torch.cuda.is_available() or torch.cuda.is_current_stream_capturing()):
        return []
    key = (str(so_path), task.signature)
    if key in _PREPLANNED:
        return _PREPLANNED[key]
    top = max(high for _, _, _, high in buckets)   # buckets: [input, dim, low, high] (kept_buckets)
    gen, done = torch.Generator().manual_seed(0), []
    with unset_fake_temporarily(), torch.no_grad():
        for n in planned_sizes(top):
            shapes = verify.shapes_at(task, n)
            if shapes is not None:
                kernel(*verify.make_set(task, shapes, gen, "cuda"))
                done.append(n)
    torch.cuda.synchronize()
    _PREPLANNED[key] = done
    return done


# ---- swap ------------------------------------------------------------------------------------

@dataclass
class Swapped:
    """One replaced region: its task, and how many graph nodes one kernel call replaced."""
    signature: str
    name: str
    nodes: int


def swap(gm: fx.GraphModule, sites: list, kernels: dict[str, Any],
         provider: Provider | None = None, force_layouts: bool = False) -> tuple[fx.GraphModule, list[Swapped]]:
    """A copy of `gm` with every site whose task has a kernel replaced by one launch call.

    sites: extract.Site of this graph (region + task), as extract found them; the runtime never
    partitions again. kernels: {task signature: cache Entry or kernel object}. The copy takes
    flat inputs and returns a flat tuple (no pytree, no export guards: install() guards). Load
    failures leave the region as it was; they are in `new_gm.htam_load_errors` ({signature: message}).
    Each loaded kernel's handle is registered with its task (fallback.py: a launch that fails runs
    the region); `new_gm.htam_handles` is {signature: handle}. force_layouts: every dense kernel
    input goes through a stride constraint (Inductor then lays the producer out that way, free
    where the producer's layout is still open); else only where the graph's own metadata says the
    producer's layout differs (the replay, where each constraint costs a call).

        >>> new_gm, swapped = swap(found.capture.graphs[0], found.sites_of(0), {t.signature: entry})
        >>> [s.name for s in swapped]
        ['gemm_linear_gelu']
    """
    from torch_htam.launcher import encode_out_meta

    provider = provider or launcher_provider()
    new, copied = _flat_copy(gm)
    loaded, errors, swapped = {}, {}, []
    replaced: dict[fx.Node, fx.Node] = {}
    for site in sites:
        task, sig = site.task, site.task.signature
        if sig not in kernels:
            continue
        region = _moved(site.region, copied)
        try:
            out_meta = encode_out_meta(task.outputs, _size_refs(task))
        except ValueError as e:   # a strided output: the launcher allocates contiguous ones
            errors.setdefault(sig, f"stays on PyTorch: {e}")
            continue
        if sig not in loaded and sig not in errors:
            try:
                loaded[sig] = provider.load(kernels[sig])
            except Exception as e:  # noqa: BLE001 -- a kernel that will not load is a fallback, not a crash
                errors[sig] = f"{type(e).__name__}: {e}"
                log.warning("torch_htam: kernel %s (%s) not loaded, region stays on PyTorch: %s",
                            sig[:16], task.name, errors[sig])
        if sig in loaded:
            handle = int(loaded[sig].handle)
            # a ranged kernel in a graph specialized to its example's sizes (inductor.HtamBackend's
            # twins) runs its static task as it comes
            buckets = kept_buckets(kernels[sig]) if any(s.ranges for s in task.inputs) else None
            fallback.register(handle, task, buckets)
            if provider.prepare is not None:
                provider.prepare(loaded[sig], task, buckets)
            _replace_region(new.graph, region, replaced, provider.op, handle, out_meta, task, force_layouts)
            swapped.append(Swapped(sig, task.name, len(region.nodes)))
    _stable_toposort(new.graph)
    new.graph.lint()
    new.recompile()
    new.htam_kernels = list(loaded.values())   # the kernels the graph's handles name, kept with it
    new.htam_load_errors = errors
    new.htam_handles = {sig: int(k.handle) for sig, k in loaded.items()}
    new.htam_plan = getattr(gm, "htam_plan", None)   # capture.export_graph's, for the backend
    return new, swapped


def _size_refs(task) -> list[dict] | None:
    """out_meta's references to input sizes for a ranged task (launcher.out_refs: each output's
    dynamic dims as multiples of an input's), None for a static task. An expanded output of
    dynamic size is not allocated from references: a ValueError (it stays on PyTorch)."""
    from torch_htam.launcher import out_refs
    refs = out_refs(task)
    if not any(refs):
        return None
    if any(s.broadcast_dims for s in task.outputs):
        raise ValueError("an expanded output of dynamic size")
    return refs


def kept_buckets(kernel) -> list | None:
    """The buckets ([input, dim, low, high]) a cache entry's kernel was verified in; None for a
    static task's kernel or a kernel object without a verdict."""
    return getattr(getattr(kernel, "evaluation", None), "buckets", None)


def _flat_copy(gm: fx.GraphModule) -> tuple[fx.GraphModule, dict[fx.Node, fx.Node]]:
    """gm's graph with plain flat calling convention and without export's own guard module, and
    the map from gm's nodes to the copy's."""
    g = fx.Graph()
    copied: dict[fx.Node, fx.Node] = {}
    g.output(g.graph_copy(gm.graph, copied))
    for n in list(g.nodes):
        if n.op == "call_module" and n.target == "_guards_fn" and not n.users:
            g.erase_node(n)
    return fx.GraphModule(gm, g), copied


def _moved(region, copied: dict):
    """The same region over the copied graph's nodes."""
    from torch_htam.partition import Region
    return Region([copied[n] for n in region.nodes], [copied[n] for n in region.inputs],
                  [copied[n] for n in region.outputs], region.kind,
                  copied.get(region.anchor) if region.anchor is not None else None)


def _replace_region(graph: fx.Graph, region, replaced: dict, op, handle: int, out_meta: list[int],
                    task=None, force_layouts: bool = False) -> None:
    """region.nodes -> launch(handle, inputs, out_meta) + one getitem per region output, and an
    expand after it for an expanded output (the kernel writes the tensor before the expand,
    TensorSpec.kernel_shape). task: the region's Task, whose specs say which inputs the kernel
    takes channels-last (a conv region's, extract.channels_last_boundary) and which outputs are
    expanded; None: all contiguous, none expanded.

    NOTE: a kernel is verified on its spec's strides, and its input's producer may lay it out
    otherwise once regions around it are swapped: a 1x1 conv kernel verified on NCHW input was
    handed the channels-last output of the swapped conv before it and returned HTAM_ERR_SHAPE
    inside the compiled model. So every dense input whose layout may differ is constrained."""
    inside = set(region.nodes)
    inputs = [replaced.get(a, a) for a in region.inputs]
    with graph.inserting_before(region.nodes[0]):
        for i, spec in enumerate(task.inputs if task is not None else ()):
            if _needs_strides(inputs[i], spec, force_layouts):
                inputs[i] = _force_strides(graph, inputs[i], spec)
    with graph.inserting_after(region.nodes[-1]):
        call = graph.call_function(op, (handle, inputs, out_meta))
    call.meta["val"] = [o.meta.get("val") for o in region.outputs]
    prev = call
    for i, o in enumerate(region.outputs):
        with graph.inserting_after(prev):
            item = graph.call_function(operator.getitem, (call, i))
        item.meta = dict(o.meta)
        spec = task.outputs[i] if task is not None else None
        val = o.meta.get("val")
        bdims = spec.broadcast_dims if spec is not None else ()
        # the launcher allocates the spec's dim order, which a channels-last or row-major task output
        # (extract.channels_last_boundary, row_major_boundary) may not share with the graph's
        if spec is not None and not bdims and spec.dim_order is not None and isinstance(val, torch.Tensor):
            item.meta["val"] = call.meta["val"][i] = _laid_out(val, spec.dim_order)
        if bdims:
            item.meta["val"] = _narrowed(o.meta.get("val"), bdims)
            call.meta["val"][i] = item.meta["val"]
            with graph.inserting_after(item):
                item = graph.call_function(torch.ops.aten.expand.default, (item, list(spec.shape)))
            item.meta = dict(o.meta)
        o.replace_all_uses_with(item, delete_user_cb=lambda u: u not in inside)
        replaced[o] = prev = item
    for n in reversed(region.nodes):   # users inside the region come later, so they go first
        graph.erase_node(n)


def _needs_strides(x, spec, always: bool) -> bool:
    """Whether input node x needs a stride constraint to reach the kernel as `spec` says: a
    channels-last spec always (the producer is usually NCHW), a contiguous one where `always` or
    where x's metadata says otherwise. Broadcast (stride 0) specs are left as they are."""
    if spec.channels_last:
        return True
    if not spec.contiguous or not isinstance(x, fx.Node):
        return False
    val = x.meta.get("val")
    return always or (isinstance(val, torch.Tensor) and any(
        n > 1 and a != b for n, a, b in zip(spec.shape, val.stride(), spec.stride)))


def _force_strides(graph: fx.Graph, x: fx.Node, spec) -> fx.Node:
    """x laid out with the spec's strides: prims.inductor_force_stride_order, a no-op on a tensor
    that has them and a copy otherwise in eager; inside Inductor it fixes the producer's layout
    to those strides where the producer's layout is still free (no copy), else copies. Where x's
    sizes are symbolic, the strides are the spec's layout over x's own sizes (symbolic.strides)."""
    import torch._inductor.inductor_prims  # noqa: F401 -- registers torch.ops.prims.inductor_force_stride_order
    from torch_htam import symbolic
    node = graph.call_function(torch.ops.prims.inductor_force_stride_order.default,
                               (x, symbolic.strides(graph, x, spec.stride)))
    val = x.meta.get("val")
    if isinstance(val, torch.Tensor):
        node.meta["val"] = val.contiguous(memory_format=torch.channels_last if spec.channels_last
                                          else torch.contiguous_format)
    return node


def _laid_out(val: torch.Tensor, order: tuple[int, ...]) -> torch.Tensor:
    """A meta value of val's shape and dtype, dense with its dims in memory in `order` (outermost
    first), as the launcher allocates it (sizes may be symbolic)."""
    inverse = sorted(range(len(order)), key=order.__getitem__)
    return val.new_empty_strided(val.shape, val.permute(order).contiguous().permute(inverse).stride())


def _narrowed(val, dims: tuple[int, ...]):
    """A meta value without its expand: size 1 at dims (None stays None)."""
    for d in dims if isinstance(val, torch.Tensor) else ():
        val = val.narrow(d, 0, 1)
    return val


def _stable_toposort(graph: fx.Graph) -> None:
    """Reorder nodes so every input precedes its users, keeping the original order otherwise.

    NOTE: the launch goes after the region's last node, but an outside user of an early region
    output may sit between region nodes; partition guarantees no cycle, so a valid order exists.
    """
    nodes = list(graph.nodes)
    pos = {n: i for i, n in enumerate(nodes)}
    if all(pos[a] < pos[n] for n in nodes for a in n.all_input_nodes):
        return
    indeg = {n: len(n.all_input_nodes) for n in nodes}
    ready = [(pos[n], n.name, n) for n in nodes if indeg[n] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, _, n = heapq.heappop(ready)
        order.append(n)
        for u in n.users:
            indeg[u] -= 1
            if indeg[u] == 0:
                heapq.heappush(ready, (pos[u], u.name, u))
    assert len(order) == len(nodes), "the rewritten graph has a cycle (partition bug)"
    if order[0] is not nodes[0]:
        nodes[0].prepend(order[0])
    for a, b in zip(order, order[1:]):
        a.append(b)


# ---- install / restore -----------------------------------------------------------------------

@dataclass(frozen=True)
class _Leaf:
    """What a flat input must look like for the rewritten graph to be valid for it."""
    shape: tuple | None = None
    stride: tuple | None = None
    dtype: torch.dtype | None = None
    device: torch.device | None = None
    value: Any = None                 # non-tensor leaves were specialized by export

    @staticmethod
    def of(x) -> "_Leaf":
        if isinstance(x, torch.Tensor):
            return _Leaf(tuple(x.shape), tuple(x.stride()), x.dtype, x.device)
        return _Leaf(value=x)

    def matches(self, x) -> bool:
        if self.dtype is None:
            return not isinstance(x, torch.Tensor) and type(x) is type(self.value) and x == self.value
        return (isinstance(x, torch.Tensor) and x.dtype == self.dtype and x.device == self.device
                and x.shape == self.shape and x.stride() == self.stride)


class HtamForward:
    """The model's new forward: guard, then the rewritten graph or the original forward.

    No host synchronization: the guard reads only tensor metadata, so CUDA graph capture and
    torch.compile see straight-line code.
    """

    def __init__(self, model, gm, in_spec, out_spec, leaves, original, report, weights):
        self.gm, self.in_spec, self.out_spec, self.leaves = gm, in_spec, out_spec, leaves
        self.original, self.report = original, report
        self.training = model.training
        # NOTE: torch's Python pytree costs ~20 us a call; the usual forward(x, y) with tensors
        # and a single tensor out skips it (a leaf's type is still checked by _Leaf.matches).
        self.positional = in_spec == pytree.tree_structure((tuple(range(len(leaves))), {}))
        self.single_out = out_spec == pytree.tree_structure(0)
        self.model_ref = model   # NOTE: a plain attribute, not a submodule: state_dict is untouched
        self.weights = weights    # () -> the graph's tensors now (the autograd guard reads them)

    def _why_not(self, args, kwargs) -> str | None:
        if self.model_ref.training != self.training:
            return "training mode"   # the graph was captured in the other mode (dropout, batch norm)
        if self.positional:
            flat = args
            if kwargs or len(args) != len(self.leaves):
                return "input structure"
        else:
            flat, spec = pytree.tree_flatten((args, kwargs))
            if spec != self.in_spec or len(flat) != len(self.leaves):
                return "input structure"
        if not all(leaf.matches(x) for leaf, x in zip(self.leaves, flat)):
            return "input shape/dtype/stride"
        if torch.is_grad_enabled() and (any(isinstance(x, torch.Tensor) and x.requires_grad for x in flat)
                                        or any(w.requires_grad for w in self.weights())):
            return "autograd"        # swapped kernels have no backward
        return None

    def __call__(self, *args, **kwargs):
        why = self._why_not(args, kwargs)
        if why is not None:
            self.report.fallback_calls += 1
            self.report.fallback_reasons[why] += 1
            return self.original(*args, **kwargs)
        self.report.fast_calls += 1
        outs = self.gm(*(args if self.positional else pytree.tree_leaves((args, kwargs))))
        return outs[0] if self.single_out else pytree.tree_unflatten(list(outs), self.out_spec)


def _attr_tensors(gm: fx.GraphModule) -> list[torch.Tensor]:
    out = []
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            obj = gm
            for part in n.target.split("."):
                obj = getattr(obj, part)
            if isinstance(obj, torch.Tensor):
                out.append(obj)
    return out


def _resolves(obj, target: str) -> bool:
    try:
        for part in target.split("."):
            obj = getattr(obj, part)
        return True
    except AttributeError:
        return False


def _hoist_constants(gm: fx.GraphModule, model: torch.nn.Module) -> None:
    """Move get_attr targets the user's model lacks to gm's top level.

    NOTE: export lifts tensor constants made inside forward onto the exported module's path (HF
    GPT-2 on an H100: 'h.0.attn.lifted_tensor_0'); once _bind_to_model puts the model's own
    submodules in place they would be gone (AttributeError at install). Hoisting keeps them on gm
    and never adds attributes to the user's modules (their state_dict stays as it was).
    """
    for i, n in enumerate(gm.graph.nodes):
        if n.op == "get_attr" and not _resolves(model, n.target):
            value = gm
            for part in n.target.split("."):
                value = getattr(value, part)
            name = f"_htam_const_{i}"
            setattr(gm, name, value)     # a plain attribute, not a buffer: no state_dict entry
            n.target = name
    gm.recompile()


def _bind_to_model(gm: fx.GraphModule, model: torch.nn.Module) -> None:
    """Make gm's get_attr nodes read the model's own submodules and tensors, live.

    ep.module() copies the attribute path (new empty modules holding the same tensors); swapping in
    the model's real submodules means `self.h[0].mlp.c_fc.weight` in gm IS the model's attribute,
    so in-place updates and reassignment (model.fc.weight = ...) are both seen.
    """
    for name in list(gm._modules):
        if isinstance(model._modules.get(name), torch.nn.Module):
            gm._modules[name] = model._modules[name]
    for store, own in ((gm._parameters, model._parameters), (gm._buffers, model._buffers)):
        for name in list(store):
            if own.get(name) is not None:
                store[name] = own[name]


def _attr_path(root: torch.nn.Module, name: str, target: str) -> str | None:
    """A Python expression reading `target` from `name` (= root) through each module's own dicts,
    as nn.Module.__getattr__ resolves it (instance dict, parameters, buffers, submodules); None
    when a step is none of these."""
    expr, obj = name, root
    for part in target.split("."):
        for store in ("__dict__", "_parameters", "_buffers", "_modules"):
            d = getattr(obj, store, None)
            if isinstance(d, dict) and part in d:
                expr, obj = f"{expr}.{store}[{part!r}]", d[part]
                break
        else:
            return None
    return expr if isinstance(obj, torch.Tensor) else None


def _fetch_attrs(gm: fx.GraphModule, model: torch.nn.Module) -> Callable[[], tuple] | None:
    """Replace gm's tensor get_attr nodes by one call that reads them all from the user's model
    (constants only gm holds, from gm); returns that call (None: gm reads no tensor attribute).

    NOTE: FX writes each get_attr as `getattr(self.layer1, "0").conv1.weight`, and every `.` on a
    module is a call of nn.Module.__getattr__. On an H100 host, ResNet-50's captured graph with no
    kernel swapped ran 6.39 ms against eager's 5.95 ms with the same GPU kernels (docs/RESULTS_LOG.md,
    captured-graph probe): its 320 weight reads. Dict reads are ~10x cheaper and still live
    (reassigning model.fc.weight or any submodule is seen next call). A read that no longer resolves
    that way (the model's structure changed), and tracing by torch.compile / export, take the
    getattr chain, which raises AttributeError as before for what is really gone.
    """
    nodes, exprs, roots = [], [], []
    for n in gm.graph.nodes:
        if n.op != "get_attr":
            continue
        root, name = (model, "m") if _resolves(model, n.target) else (gm, "gm")
        if (e := _attr_path(root, name, n.target)) is not None:
            nodes.append(n)
            exprs.append(e)
            roots.append((root, n.target.split(".")))
    if not nodes:
        return None

    def chains():
        out = []
        for obj, parts in roots:
            for part in parts:
                obj = getattr(obj, part)
            out.append(obj)
        return tuple(out)

    scope = {"gm": gm, "m": model, "chains": chains, "compiling": torch.compiler.is_compiling}
    exec("def _htam_fetch_attrs():\n"          # noqa: S102 -- code built from attribute names only
         "    if compiling():\n        return chains()\n"
         "    try:\n"
         f"        return ({', '.join(exprs)},)\n"
         "    except (KeyError, AttributeError):\n        return chains()\n", scope)
    fetch = scope["_htam_fetch_attrs"]
    fetch.__module__ = __name__
    last = [n for n in gm.graph.nodes if n.op == "placeholder"]
    where = gm.graph.inserting_after(last[-1]) if last else gm.graph.inserting_before(next(iter(gm.graph.nodes)))
    with where:
        got = gm.graph.call_function(fetch, ())
    for i, n in enumerate(nodes):
        with gm.graph.inserting_after(got):
            g = gm.graph.call_function(operator.getitem, (got, i))
        n.replace_all_uses_with(g)
        gm.graph.erase_node(n)
    gm.graph.lint()
    gm.recompile()
    return fetch


def _task_reports(tasks, kernels: dict[str, Any], swapped: list[Swapped], errors: dict[str, str],
                  unusable: dict[str, str]) -> list[TaskReport]:
    count = Counter(s.signature for s in swapped)
    out = []
    for t in tasks:
        k = kernels.get(t.signature)
        ev = getattr(k, "evaluation", None)
        status, detail = ((TaskStatus.SWAPPED, "") if count[t.signature]
                          else (TaskStatus.NOT_LOADED, errors[t.signature]) if t.signature in errors
                          else (TaskStatus.UNUSABLE, unusable[t.signature]) if t.signature in unusable
                          else (TaskStatus.NO_KERNEL if k is None else TaskStatus.NOT_FOUND, ""))
        out.append(TaskReport(t.name, t.signature, t.count,
                              speedup=(ev and ev.speedup) or getattr(k, "speedup", None),
                              policy=ev.policy.get("name", "") if ev else "", status=status,
                              vs_inductor=ev and ev.compile_speedup, detail=detail, kind=t.kind,
                              ref_ms=ev and ev.ref_ms, buckets=list(getattr(ev, "buckets", None) or []),
                              bucket_times=list(getattr(ev, "bucket_times", None) or []),
                              params=dict((getattr(k, "record", None) or {}).get("params") or {})))
    return out


def _split_usable(kernels: dict[str, Any], min_speedup: float) -> tuple[dict, dict[str, str]]:
    """(the kernels that may run, {signature: why not} of the others), by policy.why_not."""
    from torch_htam.policy import why_not
    ok, why = {}, {}
    for sig, k in kernels.items():
        if (w := why_not(k, None, min_speedup)) is None:
            ok[sig] = k
        else:
            why[sig] = w
    return ok, why


def install(model: torch.nn.Module, found, kernels: dict[str, Any], provider: Provider | None = None,
            min_speedup: float = 1.0) -> torch.nn.Module:
    """Swap `kernels` into the extracted graph and make it the model's forward, behind guards.

    found: extract.Extraction of this model. Returns the same model object (class, attributes,
    methods kept); `model.htam_report` says what was swapped and counts the calls that went to
    the original path.

        >>> model = install(model, extract(model, (x,)), {sig: entry})
        >>> model.htam_report.swapped
        12
    """
    restore(model)
    forward, report = replay(model, found, kernels, provider, min_speedup)
    if forward is None:
        return leave(model, report.note, found.tasks, report)
    return attach.forward(model, forward, report)


def replay(model: torch.nn.Module, found, kernels: dict[str, Any], provider: Provider | None = None,
           min_speedup: float = 1.0) -> tuple[Callable | None, Report]:
    """The forward install() would give `model` (the extracted graph with `kernels` swapped in,
    behind guards), without installing it: (forward, its report), or (None, a report whose note
    says why there is none). The model must be on its original forward.

        >>> fwd, report = replay(model, extract(model, (x,)), {sig: entry}); fwd(x)
    """
    capture, tasks = found.capture, found.tasks
    report = Report(method=capture.method)
    if capture.exported is None or len(capture.graphs) != 1:
        report.note = (f"capture method {capture.method!r} gives no single exported graph; "
                       "the model runs its original path (kernels stay cached)")
        return None, report
    usable, unusable = _split_usable(kernels, min_speedup)
    gm, swapped = swap(capture.graphs[0], found.sites_of(0), usable, provider)
    report.tasks = _task_reports(tasks, kernels, swapped, gm.htam_load_errors, unusable)
    report.swapped = len(swapped)
    if not swapped:
        report.note = "no region has a verified, faster kernel"
        return None, report
    _hoist_constants(gm, model)
    _bind_to_model(gm, model)
    fetch = _fetch_attrs(gm, model)
    fixed = tuple(_attr_tensors(gm))     # tensor attributes without a dict path, if any
    weights = (lambda: fetch() + fixed) if fetch else (lambda: fixed)
    src = capture.graphs[0]
    original = model.forward
    state = HtamForward(model, gm, src._in_spec, src._out_spec,
                        [_Leaf.of(x) for x in capture.inputs[0]], original, report, weights)

    # NOTE: a real function, not the object itself: torch.export reads forward.__code__, and
    # functools.wraps keeps the original signature (HF generate validates kwargs against it).
    @functools.wraps(original)
    def forward(*args, **kwargs):
        return state(*args, **kwargs)
    forward.htam = state
    return forward, report


# The model's attributes are attach.py's; these names stay for callers (torch_htam.restore).
leave = attach.leave
restore = attach.detach
