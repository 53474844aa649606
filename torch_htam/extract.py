"""One path from a model to its tasks: capture -> partition -> tasks -> dedupe -> cost.

optimize, plan, precompile, load and the runtime all start here, so they agree on which regions a
model has, what each region's task is (its signature, its input value ranges) and which tasks come
first. The runtime swaps kernels into the `sites` found here and never partitions again.

    >>> found = extract(model, (x,))
    >>> [(t.kind, t.count) for t in found.tasks][:2]         # distinct tasks, costliest first
    [('gemm', 12), ('rowwise', 25)]
    >>> found.sites[0].region.nodes, found.sites[0].task     # where each task occurs
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import operator
from dataclasses import dataclass, field

import torch
import torch.fx as fx

from torch_htam import attn_pattern, ops, symbolic
from torch_htam.capture import Capture, capture, record_values
from torch_htam.ops import ANCHOR, COMPUTE, ELEMENTWISE, ROWWISE
from torch_htam.partition import Region, category, op_name, partition
from torch_htam.task import (DTYPE_NAMES, Task, TensorSpec, dense_order, exec_source, kernelbench_source,
                             target_name)


@dataclass
class Site:
    """One place a task occurs: a region of captured graph `graph` (index into capture.graphs)."""
    graph: int
    region: Region
    task: Task


@dataclass
class Extraction:
    """What extract found. tasks: distinct, costliest first (cost()); sites: every region that
    became a task, in graph order; problems: what could not be captured or made a task, one line
    each (capture's problems first)."""
    capture: Capture
    tasks: list[Task] = field(default_factory=list)
    sites: list[Site] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    # NOTE: the real input values of each task's first site (weights and activations of the
    # example call), by signature; verification runs them besides random inputs. Not persisted.
    values: dict[str, list[torch.Tensor]] = field(default_factory=dict, repr=False)

    def sites_of(self, graph: int) -> list[Site]:
        return [s for s in self.sites if s.graph == graph]


def extract(model: torch.nn.Module, example_inputs: tuple, example_kwargs: dict | None = None,
            dynamic: dict | None = None) -> Extraction:
    """Capture `model` and make its tasks. Never raises for a model it cannot capture: `.tasks` is
    then empty and `.problems` says why.

    dynamic: OptimizeConfig.dynamic, {input index: {dim: (low, high)}}: the regions those dims
    reach get tasks over the range (capture's symbolic sizes, symbolic_region); a ConfigError when a range
    does not hold the example's size.

        >>> found = extract(model.eval(), (idx,))
        >>> found = extract(model.eval(), (x,), dynamic={0: {0: (1, 64)}})    # batch 1-64
    """
    args = tuple(example_inputs)
    declared = check_dynamic(dynamic, args) if dynamic else None
    return from_capture(capture(model, args, example_kwargs, declared))


def extract_tasks(model: torch.nn.Module, example_inputs: tuple, example_kwargs: dict | None = None,
                  dynamic: dict | None = None) -> list[Task]:
    """The model's distinct tasks, costliest first (see extract).

        >>> tasks = torch_htam.extract_tasks(model.eval(), (idx,))
        >>> [(t.kind, t.count) for t in tasks][:2]
        [('gemm', 12), ('attention', 12)]
    """
    return extract(model, example_inputs, example_kwargs, dynamic).tasks


def from_capture(cap: Capture) -> Extraction:
    """Partition every captured graph, make one task per region and merge identical ones.

    The example call is replayed once per graph (capture.record_values) so integer inputs get
    their true value range (embedding indices stay below the vocabulary) and each task keeps its
    real input values. A region whose boundary is not a plain tensor is skipped and said so. In a
    graph with symbolic sizes (dynamic shapes) a region's task is ranged over the dims that follow
    a dynamic size (symbolic_region); one that cannot be is skipped and said so.
    """
    found = Extraction(cap, problems=list(cap.problems))
    by_sig: dict[str, Task] = {}
    for gi, (gm, flat) in enumerate(zip(cap.graphs, cap.inputs)):
        values = record_values(gm, flat)
        regions = partition(gm)
        # group norm regions beside convs are posed channels-last, their [N, H * W, C] tokens
        # row-major (group_norm_boundary); the regions reading those tokens (a UNet attention's
        # q/k/v GEMMs) take them row-major too
        convs = runs_convs(gm)
        norms = [group_norm_boundary(r) if convs else (set(), set()) for r in regions]
        tokens_all = set().union(*(t for _, t in norms))
        for region, (norm_cl, _) in zip(regions, norms):
            where = f"region {[n.name for n in region.nodes]}"
            if not region.outputs:   # dead code the capture kept (HF mask arithmetic): no task
                found.problems.append(f"{where} skipped: nothing reads its result")
                continue
            region, sizes, dims, why = symbolic_region(region)
            try:
                if why:
                    raise ValueError(why)
                cl = norm_cl or channels_last_boundary(region)
                tokens = tokens_all & (set(region.inputs) | set(region.outputs))
                task = region_to_task(gm, region, values, channels_last=cl, dynamic=dims, sizes=sizes,
                                      row_major=row_major_boundary(region, cl, values) | tokens)
            except ValueError as e:
                found.problems.append(f"{where} skipped: {e}")
                continue
            seen = by_sig.get(task.signature)
            if seen is None:
                by_sig[task.signature] = seen = task
                found.values[task.signature] = [values[a] for a in region.inputs]
            else:   # identical layer: one task, counted and attributed to every module
                seen.count += 1
                seen.modules += [m for m in task.modules if m not in seen.modules]
            found.sites.append(Site(gi, region, seen))
    found.tasks = sorted(by_sig.values(), key=lambda t: (-cost(t), t.signature))
    return found


# ---- declared dynamic dims (OptimizeConfig.dynamic) -----------------------------------------

def check_dynamic(dynamic: dict, args: tuple) -> dict[int, dict[int, tuple[int, int]]]:
    """OptimizeConfig.dynamic checked against the example inputs (the config alone cannot see
    them): each index a positional tensor input, each dim one of its dims, each range holding the
    example's size. Returns it with plain int keys and (low, high) tuples; a ConfigError if not.

        >>> check_dynamic({0: {0: (1, 64)}}, (torch.randn(8, 16),))
        {0: {0: (1, 64)}}
    """
    from torch_htam.config import ConfigError
    out: dict[int, dict[int, tuple[int, int]]] = {}
    for i, dims in dynamic.items():
        x = args[i] if isinstance(i, int) and 0 <= i < len(args) else None
        if not isinstance(x, torch.Tensor):
            raise ConfigError("dynamic", dynamic, f"keyed by the index of a positional tensor input "
                                                  f"(input {i!r} is not one of the {len(args)})")
        for d, (low, high) in dims.items():
            if not 0 <= d < x.dim() or not low <= x.shape[d] <= high:
                raise ConfigError("dynamic", dynamic, f"ranges holding the example's size (input {i} "
                                                      f"has shape {list(x.shape)}; dim {d}: ({low}, {high}))")
            out.setdefault(int(i), {})[int(d)] = (int(low), int(high))
    return out


def symbolic_region(region: Region) -> tuple[Region, dict, dict, str]:
    """(the region over its tensor inputs only, its size inputs as sizes of those
    (symbolic.region_sizes), its ranged boundary dims (symbolic.region_dims), why it cannot be a
    task or ""). A region of a static graph comes back as it is, with no sizes and no dims."""
    sizes, why = symbolic.region_sizes(region.inputs)
    if not why and sizes:
        region = Region(region.nodes, [a for a in region.inputs if a not in sizes], region.outputs,
                        region.kind, region.anchor)
    dims, why2 = symbolic.region_dims(list(region.inputs) + list(region.outputs)) if not why else ({}, "")
    return region, sizes, dims, why or why2


def cost(task: Task, gpu=None) -> float:
    """The one cost model that orders tasks: roofline seconds of one call times its count."""
    return estimated_seconds(task, gpu) * task.count


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


# ---- region -> task ------------------------------------------------------------------------

def region_graph(gm: fx.GraphModule, region: Region, channels_last: set[fx.Node] = frozenset(),
                 sizes: dict | None = None, values: dict | None = None,
                 row_major: set[fx.Node] = frozenset()) -> fx.GraphModule:
    """The region as its own GraphModule: placeholders in region.inputs order, one output tuple.
    The inputs in `channels_last` get channels-last meta values (what proposers read layouts from),
    those in `row_major` row-major ones (row_major_boundary).

    sizes: a symbolic region's size inputs as sizes of its tensor inputs (symbolic.region_sizes):
    with `values` (the example call's, capture.record_values), each is the example's int and
    every node's meta value is recomputed at the example's sizes (the graph proposers read and
    signatures hash); without, each becomes `in_j.size(d)` in the graph (what the task's source
    runs, at any size).

        >>> g = region_graph(gm, region); g(*inputs)   # -> tuple of region.outputs values
    """
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    formats = [_format(a, channels_last, row_major) for a in region.inputs]
    for i, (a, fmt) in enumerate(zip(region.inputs, formats)):
        p = g.placeholder(f"in{i}")
        val = a.meta.get("val")
        p.meta["val"] = val.contiguous(memory_format=fmt) if fmt is not None and isinstance(val, torch.Tensor) else val
        env[a] = p
    for s, (j, d, k) in (sizes or {}).items():
        env[s] = values[s] if values is not None else symbolic.size_node(g, env[region.inputs[j]], d, k)
    for n in region.nodes:
        env[n] = g.node_copy(n, lambda a: env[a])
    for o in region.outputs:   # what the task gives (its specs), as the proposers read it
        val = env[o].meta.get("val")
        if o in row_major and isinstance(val, torch.Tensor):
            env[o].meta["val"] = val.contiguous()
    g.output(tuple(env[o] for o in region.outputs))
    g.lint()
    out = fx.GraphModule(torch.nn.Module(), g)
    if sizes is not None and values is not None:
        _at_example(out, [values[a] for a in region.inputs], formats)
    return out


def _format(n: fx.Node, channels_last: set[fx.Node], row_major: set[fx.Node]) -> torch.memory_format | None:
    """The memory format a task lays boundary node n out in (None: as captured)."""
    return torch.channels_last if n in channels_last else torch.contiguous_format if n in row_major else None


def _at_example(g: fx.GraphModule, inputs: list, formats: list) -> None:
    """Every node's meta value recomputed from the example's input values (static sizes), each
    input in its memory format (None: as it is)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes = [mode.from_tensor(x.contiguous(memory_format=fmt) if fmt is not None else x)
             if isinstance(x, torch.Tensor) else x for x, fmt in zip(inputs, formats)]
    FakeTensorProp(g, mode).propagate(*fakes)


def graph_signature(graph: fx.GraphModule, inputs: list[TensorSpec]) -> str:
    """sha256[:16] of op targets, argument structure, constants and input specs (no names/ids).

    Declared size ranges are part of it (a task over batch 1-64 is not the static task at batch
    64: its kernel must be right at every size); a task without any hashes as it always did, so
    the caches of static tasks stay valid.

        >>> graph_signature(task.graph, task.inputs)
        '3f9c0a1b2d4e5f60'
    """
    index: dict[fx.Node, tuple] = {}
    items: list = [[(s.shape, s.dtype, s.stride) for s in inputs]]
    if any(s.ranges for s in inputs):
        items.append(["ranges", [[list(s.dynamic), [list(r) for r in s.ranges]] for s in inputs]])
    for n in graph.graph.nodes:
        if n.op == "placeholder":
            index[n] = ("in", len(index))
            continue
        index[n] = ("n", len(index))
        norm = fx.node.map_arg((n.args, n.kwargs), lambda a: index[a])
        items.append([n.op, target_name(n.target), _normalize(norm)])
    return hashlib.sha256(json.dumps(items, default=str).encode()).hexdigest()[:16]


def static_twin(task) -> str | None:
    """The signature a ranged task's region has in a graph specialized to its example's sizes
    (torch.compile's graph for them, serving.ExampleSplit): the same graph at the example's sizes
    and the same specs, without the declared ranges (graph_signature hashes those only where
    there are any). A kernel kept for the bucket holding the example's size is right there too.
    None for a static task, and for one without its graph (a task read back from a cache).

        >>> static_twin(ranged) == extract(model, example).tasks[0].signature
        True
    """
    if task.graph is None or not any(s.ranges for s in task.inputs):
        return None
    return graph_signature(task.graph, [dataclasses.replace(s, dynamic=(), ranges=()) for s in task.inputs])


def static_twins(tasks: list, kernels: dict) -> dict:
    """{static twin signature: kernel} of the ranged tasks among `tasks` that have a kernel in
    `kernels` ({task signature: kernel}): what the graph specialized to the example's sizes can run
    (inductor.HtamBackend(twins=True))."""
    return {twin: kernels[t.signature] for t in tasks
            if t.signature in kernels and (twin := static_twin(t)) is not None}


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


def region_to_task(gm: fx.GraphModule, region: Region, values: dict | None = None,
                   name: str | None = None, channels_last: set[fx.Node] = frozenset(),
                   dynamic: dict[fx.Node, dict[int, tuple[int, int]]] | None = None,
                   sizes: dict | None = None, row_major: set[fx.Node] = frozenset()) -> Task:
    """Build the Task of one region of a captured graph.

    values: real node values (capture.record_values) give integer inputs their true range
    [low, high); without them integer inputs get [0, 2). channels_last: boundary nodes the task
    takes or gives channels-last (a captured model's conv regions: channels_last_boundary);
    row_major: those it takes or gives row-major (row_major_boundary); the others keep the graph's
    layouts. dynamic: {boundary node: {dim: (low, high)}}, the
    declared size ranges its specs carry (symbolic.region_dims); part of the signature. sizes:
    a symbolic region's size inputs (symbolic.region_sizes): its specs and graph are at the
    example's sizes (from `values`), its source takes the sizes from its inputs.

        >>> task = region_to_task(gm, partition(gm)[0], record_values(gm, flat_inputs))
        >>> task.signature, [s.shape for s in task.inputs]
    """
    cl = channels_last
    dyn = dynamic or {}
    at = values if dyn or sizes else None   # a symbolic region: specs from the example's values
    rm = row_major
    graph = (region_graph(gm, region, cl, sizes or {}, values, rm) if at else
             region_graph(gm, region, cl, row_major=rm))
    positive = _positive_inputs(region)
    inputs = [_ranged(_spec(a, values, a in positive, _format(a, cl, rm), at), dyn.get(a)) for a in region.inputs]
    outputs = [_ranged(_spec(o, None, fmt=_format(o, cl, rm), at=at), dyn.get(o)) for o in region.outputs]
    op_names = [str(n.target) for n in region.nodes if n.op == "call_function"
                and n.target is not operator.getitem]
    sig = graph_signature(graph, inputs)
    task = Task(name or f"{region.kind}_{_short_ops(region)}", region.kind, "", inputs, outputs,
                sig, op_names, 1, _modules(region.nodes))
    task.flops = float(sum(node_flops(n) for n in graph.graph.nodes if n.op == "call_function"))
    task.bytes = float(sum(_distinct_bytes(s) for s in inputs + outputs))
    task.graph = graph
    source_graph = region_graph(gm, region, cl, sizes, row_major=rm) if sizes else graph
    task.source = kernelbench_source(source_graph, inputs, title=f"{task.name}: {' -> '.join(op_names)}")
    return task


def _positive_inputs(region: Region) -> set[fx.Node]:
    """Region inputs that an op reads as a variance (ops.OpInfo.positive), e.g. running_var."""
    out = set()
    for n in region.nodes:
        row = ops.info(op_name(n))
        for i in row.positive if row else ():
            if i < len(n.args) and isinstance(n.args[i], fx.Node):
                out.add(n.args[i])
    return out


# the 2-D conv ops whose regions run channels-last (channels_last_boundary), and where each keeps
# its groups argument
_CONV2D_GROUPS = {"aten.conv2d.default": 6, "aten.conv2d.padding": 6, "aten.convolution.default": 8}
# the ops such a region may hold besides its conv: the chain cuDNN fuses into a channels-last conv
# (conv.render_cl); a region with any other op keeps NCHW, where the other conv kernels run it
_CL_CHAIN = {"aten.batch_norm.default", "aten.add.Tensor", "aten.relu.default", "aten.relu_.default"}


def channels_last_boundary(region: Region) -> set[fx.Node]:
    """The boundary tensors a conv region's task takes and gives channels-last ([N, C, H, W]
    stored N, H, W, C): the activations (the conv's input, a residual of the output's shape) and
    the outputs; never the weight, which stays as the model holds it.

    Why: Inductor runs a model's convs channels-last (its layout optimization), the layout cuDNN's
    tensor-core engines compute in. A kernel that takes NCHW there costs a transpose on each side
    of it (bench/findings.md, ResNet-50), and one that takes channels-last costs none. Only a
    plain 2-D conv (not transposed, groups 1) followed by batch norm, a residual add and ReLU (any
    of them) qualifies; other regions keep the graph's layouts.
    """
    calls = [n for n in region.nodes if n.op == "call_function"]
    convs = [n for n in calls if "conv" in str(n.target)]
    if len(convs) != 1 or (gi := _CONV2D_GROUPS.get(str(convs[0].target))) is None:
        return set()
    if any(str(n.target) not in _CL_CHAIN for n in calls if n is not convs[0]):
        return set()
    conv = convs[0]
    transposed = conv.args[6] if str(conv.target) == "aten.convolution.default" and len(conv.args) > 6 else False
    groups = conv.args[gi] if len(conv.args) > gi else conv.kwargs.get("groups", 1)
    x, y = conv.args[0], conv.meta.get("val")
    if transposed or groups != 1 or not isinstance(y, torch.Tensor) or y.dim() != 4:
        return set()
    # NOTE: sizes as text: a symbolic size (s0) is not hashable, and equal symbols print alike
    shapes = {tuple(map(str, y.shape)), tuple(map(str, _shape(x)))}

    def activation(n) -> bool:
        v = n.meta.get("val")
        return isinstance(v, torch.Tensor) and v.is_floating_point() and tuple(map(str, v.shape)) in shapes
    return ({a for a in region.inputs if a is not conv.args[1] and activation(a)}
            | {o for o in region.outputs if activation(o)})


def runs_convs(gm: fx.GraphModule) -> bool:
    """Whether the graph holds a 2-D convolution, so that Inductor lays its 4-D activations out
    channels-last (its layout optimization: a conv's inputs and outputs and the nodes between
    them), the layout group_norm_boundary poses a group norm's task in."""
    for n in gm.graph.nodes:
        if n.op == "call_function" and str(n.target) in _CONV2D_GROUPS:
            w = n.args[1].meta.get("val") if len(n.args) > 1 and isinstance(n.args[1], fx.Node) else None
            if isinstance(w, torch.Tensor) and w.dim() == 4:
                return True
    return False


# what may follow a group norm in a region posed channels-last (group_norm_chain): nothing, a SiLU
# (a diffusion ResBlock's norm), or the flatten(2) + transpose(1, 2) to [N, H * W, C] tokens (a
# UNet attention block's norm, whose tokens are the channels-last tensor's own memory order)
GN_EPILOGUES = ("none", "silu", "tokens")


def group_norm_chain(calls: list[fx.Node]) -> tuple[fx.Node, str] | None:
    """(the group norm, its epilogue: GN_EPILOGUES) where a region's ops are a 4-D group norm
    followed by one of GN_EPILOGUES and nothing else, else None. gn_cl.py writes these regions'
    kernels channels-last."""
    if not calls or str(calls[0].target) != "aten.group_norm.default":
        return None
    gn, rest = calls[0], [str(n.target) for n in calls[1:]]
    x = gn.args[0].meta.get("val") if isinstance(gn.args[0], fx.Node) else None
    if not isinstance(x, torch.Tensor) or x.dim() != 4 or not x.is_floating_point():
        return None
    if not rest:
        return gn, "none"
    if rest == ["aten.silu.default"] and calls[1].args[0] is gn:
        return gn, "silu"
    if rest == ["aten.flatten.using_ints", "aten.transpose.int"]:
        flat, tr = calls[1], calls[2]
        start, end = (list(flat.args[1:3]) + [0, -1][len(flat.args) - 1:])[:2]
        swapped = sorted(d % 3 for d in tr.args[1:3])
        if flat.args[0] is gn and tr.args[0] is flat and (start, end % 4) == (2, 3) and swapped == [1, 2]:
            return gn, "tokens"
    return None


def group_norm_boundary(region: Region) -> tuple[set[fx.Node], set[fx.Node]]:
    """(the boundary tensors a group norm region's task takes and gives channels-last, those it
    gives row-major): its input and a 4-D output channels-last, a tokens output ([N, H * W, C])
    row-major; two empty sets for any other region. For graphs that run convs (runs_convs).

    Why: Inductor runs such a graph's activations channels-last. A norm task posed NCHW costs a
    layout copy on each side of it in the model: on the diffusion UNet (bf16, reduce-overhead)
    our NCHW group norms beat Inductor's code for their regions by 1.9-2.2x, and every set of them
    lost in the model, 2.079 against 1.717 ms (zoo-20261201-060009)."""
    calls = [n for n in region.nodes if n.op == "call_function"]
    chain = group_norm_chain(calls)
    if chain is None or chain[0].args[0] not in region.inputs or len(region.outputs) != 1:
        return set(), set()
    out = region.outputs[0]
    return {chain[0].args[0]} | ({out} if chain[1] != "tokens" else set()), {out} if chain[1] == "tokens" else set()


def row_major_boundary(region: Region, channels_last: set[fx.Node] = frozenset(),
                       values: dict | None = None) -> set[fx.Node]:
    """The boundary tensors a region's task takes and gives row-major though the capture holds them
    permuted: the dense results of elementwise and row-wise ops (not channels-last 4-D ones: a
    conv's neighbours, channels_last_boundary).

    Why: eager lays an elementwise result out like its inputs, so Whisper's residual stream follows
    its conv front end's transpose ([1, 1500, 512] stored [1, 512, 1500]) through every block.
    Inductor lays such a buffer out as it likes, and the runtime asks it for the task's layout
    (runtime._force_strides: free where the producer's layout is open). At the captured layout a
    task was timed where both sides read transposed rows: Whisper's layer norms beat Inductor's
    code for the region by 1.12x and in the model took 9.2 us a call against Inductor's 2.4-3.4 us
    add + norm (arm_profile-20261130-151735). A view's result (a transpose:
    attention heads, MLP-Mixer's token MLP input) keeps its layout, as Inductor keeps it. values:
    the example call's (capture.record_values), which a graph of symbolic sizes is judged by, so a
    ranged task and its static twin (static_twin) agree."""
    def free(n: fx.Node) -> bool:
        v = values.get(n) if values else None
        v = v if isinstance(v, torch.Tensor) else n.meta.get("val")
        if n in channels_last or n.op != "call_function" or category(n) not in (ELEMENTWISE, ROWWISE):
            return False
        if not isinstance(v, torch.Tensor) or not all(isinstance(d, int) for d in v.shape) or v.is_contiguous():
            return False
        if v.dim() == 4 and v.is_contiguous(memory_format=torch.channels_last):
            return False
        return dense_order(tuple(v.shape), tuple(v.stride())) is not None
    return {n for n in (*region.inputs, *region.outputs) if free(n)}


def _spec(n: fx.Node, values: dict | None, positive: bool = False, fmt: torch.memory_format | None = None,
          at: dict | None = None) -> TensorSpec:
    """n's spec from its meta value, or from its value in `at` (a symbolic region: the example's),
    in memory format fmt (None: as the value is)."""
    val = at[n] if at is not None else n.meta.get("val")
    if not isinstance(val, torch.Tensor):
        raise ValueError(f"region boundary {n.name} is not a tensor ({type(val).__name__})")
    if val.dtype not in DTYPE_NAMES:
        raise ValueError(f"{n.name} has dtype {val.dtype}, which tasks do not support")
    spec = TensorSpec.of(val)
    if fmt is torch.channels_last:
        spec = spec.as_channels_last()
    elif fmt is torch.contiguous_format:
        spec = spec.as_row_major()
    if val.dtype.is_floating_point:
        return TensorSpec(spec.shape, spec.dtype, spec.stride, positive=True) if positive else spec
    low, high = 0, 2
    real = values.get(n) if values else None
    if isinstance(real, torch.Tensor) and real.numel() and val.dtype != torch.bool:
        low, high = int(real.min()), int(real.max()) + 1
    return TensorSpec(spec.shape, spec.dtype, spec.stride, (), low, high)


def _ranged(spec: TensorSpec, ranges: dict[int, tuple[int, int]] | None) -> TensorSpec:
    return spec.with_ranges(ranges) if ranges else spec


def _short_ops(region: Region) -> str:
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


def node_flops(n: fx.Node) -> int:
    """Minimum FLOPs of one node: 2*M*N*K for GEMMs, its conv analog, ops.OpInfo.flops per
    element else (views and no-ops: 0)."""
    cat, name = category(n), op_name(n)
    out = n.meta.get("val")
    numel = out.numel() if isinstance(out, torch.Tensor) else 0
    if cat == ANCHOR:
        kind = ops.info(name).kind
        if kind == "conv":
            w = _shape(n.args[1])   # (C_out, C_in/groups, *kernel)
            return 2 * numel * math.prod(w[1:])
        if kind == "attention":
            q, k, v = (_shape(a) for a in n.args[:3])   # (..., L, E), (..., S, E), (..., S, Ev)
            batch = math.prod(q[:-2])
            causal = n.kwargs.get("is_causal", n.args[5] if len(n.args) > 5 else False)
            f = 2 * batch * q[-2] * k[-2] * (q[-1] + v[-1])
            return f // 2 if causal else f
        a = n.args[1] if name in ("addmm", "baddbmm", "addbmm", "addmv") else n.args[0]
        return 2 * numel * (_shape(a) or (1,))[-1]   # K = last dim of the left operand
    if cat == ROWWISE:
        return ops.info(name).flops * math.prod(_shape(n.args[0]))
    if cat == ELEMENTWISE:
        return ops.info(name).flops * numel
    return 0


def _distinct_bytes(s: TensorSpec) -> int:
    # broadcast (stride-0) dims read the same bytes again: count them once
    n = math.prod(d for d, st in zip(s.shape, s.stride) if st != 0) if s.numel else 0
    return n * torch.empty((), dtype=s.torch_dtype).element_size()


# ---- KernelBench file -> task ----------------------------------------------------------------

def task_from_source(source: str, name: str | None = None) -> Task:
    """One Task covering the whole forward of a KernelBench file (e.g. from KernelBench itself).

    The kind follows its ops (a hand-written attention holding every anchor and row-wise op, as
    partition reads it; else a GEMM/conv/attention anchor wins, then row-wise, else elementwise);
    dynamic dims are empty, integer inputs keep the range seen in get_inputs(). The task's inputs
    are get_inputs()'s, then the weights and buffers Model built (source_weights gives their values).

        >>> task = task_from_source(Path("19_ReLU.py").read_text(), "19_ReLU")
    """
    name = name or "task"
    gm, inputs, ins = _export_source(source, name)
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    outs = list(dict.fromkeys(a for a in out_node.all_input_nodes))
    anchor = next((n for n in nodes if category(n) == ANCHOR), None)
    row = next((n for n in nodes if category(n) == ROWWISE), None)
    kind = ops.info(op_name(anchor)).kind if anchor else "rowwise" if row else "elementwise"
    attn = _sole_attention(nodes)
    if attn is not None:        # MinGPT's q @ k^T ... @ v: an attention, as in a captured model
        kind, anchor = "attention", attn.pv
    region = Region(nodes, ins, outs, kind, anchor or row)
    # NOTE: weights Model built in __init__ become task inputs here, so the generated source
    # (not the original file) is the reference that matches task.inputs.
    return region_to_task(gm, region, record_values(gm, inputs), name=name)


def source_weights(source: str, name: str | None = None) -> list[torch.Tensor]:
    """The tensors Model built in __init__ (weights, registered buffers such as MinGPT's tril
    mask) that task_from_source(source, name) takes as inputs after get_inputs()'s, in its order.
    get_inputs() + source_weights() is what its reference runs on with the file's own values
    (random task inputs would leave a tril mask with no zero, i.e. mask nothing).

        >>> ref(*ns["get_inputs"](), *source_weights(src, "attn_mingpt_fp32"))
    """
    gm, _, ins = _export_source(source, name or "task")
    return [_attr(gm, n.target) for n in ins if n.op == "get_attr"]


def _export_source(source: str, name: str) -> tuple[fx.GraphModule, tuple, list[fx.Node]]:
    """(exported aten graph, get_inputs() values, the graph's inputs in task order: the user
    inputs as get_inputs() lists them, then the weights Model built)."""
    from torch_htam.capture import functionalize
    from torch_htam.decompose import decompose_losses
    ns = exec_source(source, name)
    model = ns["Model"](*ns["get_init_inputs"]()).eval()
    inputs = tuple(ns["get_inputs"]())
    gm = torch.export.export(model, inputs, strict=False).module()
    decompose_losses(gm)        # a loss file's one node (aten.mse_loss) as the ops capture gives
    functionalize(gm)
    ins = [n for op in ("placeholder", "get_attr") for n in gm.graph.nodes if n.op == op and n.users]
    return gm, inputs, ins


def _attr(gm: fx.GraphModule, target: str) -> torch.Tensor:
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj.detach()


def _sole_attention(nodes: list[fx.Node]):
    """The hand-written attention (attn_pattern.Pattern) among nodes that holds every anchor and
    row-wise op of them, or None (elementwise ops around it come along, as the whole forward is one
    task)."""
    heavy = {n for n in nodes if category(n) in (ANCHOR, ROWWISE)}
    return next((p for p in attn_pattern.find(nodes) if heavy <= set(p.nodes)), None)
