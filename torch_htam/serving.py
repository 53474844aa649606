"""Serving declared dynamic sizes: what runs beside the compiled graphs, and the inputs the
decision compiles and times them at.

    ExampleSplit          the example's own sizes on torch.compile's graph for them, every other
                          size on the chosen arm's dynamic graphs (a shape compare per call)
    BucketSplit           the sizes where every ranged kernel of an arm was kept on that arm, a
                          group of others on an arm of the kernels kept there (subsets_by_size),
                          the rest on the arm it was built on (kept_sizes: which sizes)
    high_end_inputs       the example tiled to each declared range's high end
    size_one_inputs       the example cut to size 1 per range starting at 1 (Dynamo's own graph)
    prime                 one call at every size of a short range (cuDNN's plans per conv size)

Dynamic dims are declared as OptimizeConfig.dynamic: {input index: {dim: (low, high)}}.
"""
from __future__ import annotations

import enum
import re
import time
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn


@dataclass(frozen=True)
class ExampleSplit:
    """A model served over declared dynamic sizes, split as plain torch.compile splits it: calls at
    the example's own sizes run `at_example` (torch.compile's graph specialized to them), every
    other call `elsewhere` (the chosen arm: graphs dynamic over the declared ranges). One shape
    compare per declared input and call; neither side ever sees a size it would recompile for.

    NOTE: plain torch.compile(model) specializes its first graph to the first call's sizes and
    compiles a dynamic one at the second size. A specialized graph can be much faster: Inductor
    lays a specialized graph's convs out channels-last and a symbolic one's not (LAYOUT_OPTIONS),
    and served ResNet-50 bf16 with its batch declared dynamic from the first call ran 0.946x of
    plain torch.compile's throughput where 20% of requests came at the example's size
    (bench_serve-20261128-045423). One compiled function cannot hold both graphs in that order:
    Dynamo tries its newest cache entry first, and a marked call after a plain one makes a
    dynamic graph that then serves the example's sizes too. Hence two compiled functions.

    shapes: (positional argument, its example shape) of each input with declared dynamic dims."""
    at_example: Callable
    elsewhere: Callable
    shapes: tuple[tuple[int, torch.Size], ...]

    def __call__(self, *args, **kwargs):
        return (self.at_example if self.holds(args) else self.elsewhere)(*args, **kwargs)

    def holds(self, args: tuple) -> bool:
        """Whether args are at the example's own sizes."""
        return all(i < len(args) and getattr(args[i], "shape", None) == shape for i, shape in self.shapes)


def split_at_example(static: Callable, elsewhere: Callable, inputs: tuple, dynamic: dict) -> ExampleSplit:
    """ExampleSplit of `static` (compiled for the example `inputs`' sizes) and `elsewhere`, at the
    shapes of the inputs with declared dynamic dims ({input index: {dim: (low, high)}})."""
    return ExampleSplit(static, elsewhere, tuple((i, inputs[i].shape) for i in sorted(dynamic)))


@dataclass(frozen=True)
class BucketSplit:
    """A kernels arm over one declared range, run only at the sizes where each of its ranged
    kernels was kept (verify.Bucket: won its bucket, evaluation.winning_buckets); every other size
    runs `base`, the arm the kernels were built on (the same graphs with Inductor's code for those
    regions). One size read per call.

    NOTE: inside the kernels arm's graph a size outside a kernel's buckets runs the region's
    reference, op by op from Python (fallback.py): correct, but slower than Inductor's fused code
    for it. Served ResNet-50 bf16 (batch 1-64, H200) kept 4 conv kernels whose buckets left out
    sizes 2-8 for some: 32.5% of requests ran such regions, and the mix's p99 was 0.654x and its
    throughput 0.970x of torch.compile's (bench_serve-20261128-211017).

    at: (positional argument, dim) read for the size; sizes: where `kernels` runs; more: (sizes,
    call) of arms with a subset of the kernels, each for sizes where just those were kept
    (decide.Trials.bucket_arm): served vision bf16 kept 6 conv kernels of which 2 lost at batch 4,
    where the other 4 won by 1.2-1.5x, so sizes 2-8 (40% of its requests) ran none
    (bench_serve-20261128-234914)."""
    kernels: Callable
    base: Callable
    at: tuple[int, int]
    sizes: frozenset
    more: tuple[tuple[frozenset, Callable], ...] = ()

    def __call__(self, *args, **kwargs):
        return self.route_of(args)(*args, **kwargs)

    def route_of(self, args: tuple) -> Callable:
        """The arm that serves args: the kernels', one of `more`, else the base."""
        n = self.size_of(args)
        if n in self.sizes:
            return self.kernels
        return next((call for sizes, call in self.more if n in sizes), self.base)

    def holds(self, args: tuple) -> bool:
        """Whether args are at a size some of the kernels run at."""
        n = self.size_of(args)
        return n in self.sizes or any(n in sizes for sizes, _ in self.more)

    def size_of(self, args: tuple) -> int | None:
        i, d = self.at
        return args[i].shape[d] if i < len(args) and getattr(args[i], "shape", None) is not None else None


class Route(enum.Enum):
    """Which graph a served call runs (route)."""
    EXAMPLE = "the example's own graph"          # ExampleSplit.at_example
    KERNELS = "the kernels' graph"               # BucketSplit.kernels
    BASE = "outside the kernels' buckets"        # BucketSplit.base
    CHOSEN = "the chosen arm"                    # no split decides it


def route(call: Callable, args: tuple) -> Route:
    """Where the splits of an optimized model's call (ExampleSplit over BucketSplit, either may be
    missing) send `args`: what serves a request, for a benchmark to count.

        >>> route(model._compiled_call_impl, (torch.randn(3, 16),))
        <Route.KERNELS: "the kernels' graph">
    """
    if isinstance(call, ExampleSplit):
        if call.holds(args):
            return Route.EXAMPLE
        call = call.elsewhere
    if isinstance(call, BucketSplit):
        return Route.KERNELS if call.holds(args) else Route.BASE
    return Route.CHOSEN


def kept_sizes(kept: list[tuple], dynamic: dict) -> tuple[tuple[int, int], frozenset] | None:
    """((input, dim), sizes) for BucketSplit: the sizes of the one declared range ({input index:
    {dim: (low, high)}}) at which every ranged kernel is inside a bucket it was kept for (kept and
    None as held_sizes).

        >>> kept_sizes([(task, [[0, 0, 9, 64]])], {0: {0: (1, 64)}})      # task batch 2-64
        ((0, 0), frozenset({9, 10, ..., 64}))
    """
    found = held_sizes(kept, dynamic)
    return None if found is None else (found[0], common_sizes(found[1], found[2]))


def common_sizes(served: tuple[int, int], held: list) -> frozenset:
    """The sizes of the served range (low, high) that every kernel of held_sizes' list (None: any
    size) runs at."""
    low, high = served
    return frozenset(n for n in range(low, high + 1) if all(h is None or n in h for h in held))


def held_sizes(kept: list[tuple], dynamic: dict) -> tuple[tuple[int, int], tuple[int, int], list] | None:
    """((input, dim), the served range (low, high), per kept kernel the sizes it runs at, None for
    a static task's: any) over the one declared range ({input index: {dim: (low, high)}}). kept:
    (task, buckets) per kernel, buckets as verify.Bucket or [input, dim, low, high] (
    Evaluation.buckets). A task's leading dim is k times the size a dynamic graph serves (k *
    symbolic.served_range: size 1 has Dynamo's own graph, of static tasks), so bucket [lo, hi]
    holds the sizes ceil(lo/k)..floor(hi/k). None where it cannot be said: more than one declared
    range, a task range that is no multiple of the served one, a ranged kernel without buckets, or
    no ranged kernel."""
    from torch_htam.verify import Bucket, leading_dim
    one = one_range(dynamic)
    if one is None:
        return None
    at, (low, high) = one
    out = []
    for task, buckets in kept:
        lead = leading_dim(task)
        if lead is None:
            out.append(None)
            continue
        lo, hi = task.inputs[lead[0]].range_of(lead[1])
        k = lo // low
        if k < 1 or (k * low, k * high) != (lo, hi) or not buckets:   # no verdict per bucket: no split
            return None
        held = set()
        for b in buckets:
            b = b if isinstance(b, Bucket) else Bucket(*b)
            held |= set(range(-(-b.low // k), b.high // k + 1))
        out.append(frozenset(held))
    return (at, (low, high), out) if any(h is not None for h in out) else None


def one_range(dynamic: dict | None) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """((input, dim) read for the size, the served part of the range (low, high)) where the declared
    dynamic dims ({input index: {dim: (low, high)}}) hold one range; None where they hold none or
    several (a size split by one number cannot be said there).

        >>> one_range({0: {0: (1, 64)}, 1: {0: (1, 64)}})
        ((0, 0), (2, 64))
    """
    from torch_htam.symbolic import served_range
    ranges = {r for dims in (dynamic or {}).values() for r in dims.values()}
    if len(ranges) != 1:
        return None
    (low, high), = ranges
    return min((i, d) for i, dims in dynamic.items() for d in dims), served_range(low, high)


def served_sizes(found: tuple[tuple[int, int], frozenset] | None, dynamic: dict,
                 upto: int | None) -> tuple[tuple[int, int], frozenset] | None:
    """kept_sizes' ((input, dim), sizes) without the sizes above `upto` (a kernels arm's cut,
    decide.Trials.range_cut; None: no cut); with no sizes found, every served size of the one
    declared range up to it."""
    if upto is None:
        return found
    if found is None:
        one = one_range(dynamic)
        if one is None:
            return None
        at, (low, high) = one
        found = at, frozenset(range(low, high + 1))
    return found[0], frozenset(n for n in found[1] if n <= upto)


def subsets_by_size(held: list, sizes) -> dict[frozenset, frozenset]:
    """{indices of the kernels that run at a size (held_sizes' list; None: every size): those of
    `sizes`}, leaving out sizes where none does.

        >>> subsets_by_size([frozenset({2, 3}), None, frozenset({3})], [2, 3, 4])
        {frozenset({0, 1}): frozenset({2}), frozenset({0, 1, 2}): frozenset({3}), frozenset({1}): frozenset({4})}
    """
    groups: dict[frozenset, set] = {}
    for n in sizes:
        idx = frozenset(i for i, h in enumerate(held) if h is None or n in h)
        if idx:
            groups.setdefault(idx, set()).add(n)
    return {k: frozenset(v) for k, v in groups.items()}


def entries_kept_sizes(entries, dynamic: dict) -> tuple[tuple[int, int], frozenset] | None:
    """kept_sizes of kernel cache entries; None where one has no verdict (entries_kept)."""
    kept = entries_kept(entries)
    return None if kept is None else kept_sizes(kept, dynamic)


def entries_kept(entries) -> list[tuple] | None:
    """(task, buckets) of kernel cache entries (each its .task and .evaluation.buckets), as
    kept_sizes and held_sizes take them; None where one has neither (a kernel object without a
    verdict)."""
    if not all(hasattr(e, "task") and hasattr(e, "evaluation") for e in entries):
        return None
    return [(e.task, e.evaluation.buckets) for e in entries]


def high_end_inputs(inputs: tuple, dynamic: dict | None) -> tuple | None:
    """The inputs with every declared dynamic dim ({input index: {dim: (low, high)}}) at its
    range's high end, the example tiled along it (token ids and masks stay values the model was
    given); None where nothing is declared or every declared dim is at its high end already."""
    out = tuple(inputs)
    for r in sorted({r for dims in (dynamic or {}).values() for r in dims.values()}):
        out = at_size(out, dynamic, r, r[1]) or out
    return None if all(a is b for a, b in zip(out, inputs)) else out


def size_one_inputs(inputs: tuple, dynamic: dict | None) -> list[tuple]:
    """Per range that starts at 1 among the declared dynamic dims, the inputs with every dim of
    that range at 1 (at_size). NOTE: Dynamo specializes size 1 in every dynamic graph, so each of
    these is a graph of its own, compiled on the first call at it: a served model's first
    batch-1 request would otherwise wait for a whole compile."""
    ranges = sorted({r for dims in (dynamic or {}).values() for r in dims.values() if r[0] == 1})
    return [args for r in ranges if (args := at_size(inputs, dynamic, r, 1)) is not None]


def at_size(inputs: tuple, dynamic: dict, r: tuple[int, int], n: int) -> tuple | None:
    """The inputs with every dim declared with range r at size n, the example cut or tiled along
    it (dims declared with one range are taken for one size, as a batch shared by ids and mask),
    the rest as in the example; None where no dim changes. Each is made as the example was (an
    inference tensor or not): Dynamo's guards tell the two apart, and a graph compiled on one
    kind recompiles for requests of the other."""
    args, changed = list(inputs), _changed_dims(inputs, dynamic, r, n)
    for i, d in changed:   # NOTE: a cut or tiled dim leaves the input's other dims as they were
        x = args[i]
        with torch.inference_mode(x.is_inference()):
            args[i] = x.index_select(d, torch.arange(n, device=x.device) % x.shape[d])
    return tuple(args) if changed else None


def _changed_dims(inputs: tuple, dynamic: dict, r: tuple[int, int], n: int) -> list[tuple[int, int]]:
    """(input, dim) of each tensor dim declared with range r whose size is not n: what at_size
    changes."""
    return [(i, d) for i, dims in dynamic.items() for d, rd in dims.items()
            if rd == r and isinstance(inputs[i], torch.Tensor) and inputs[i].shape[d] != n]


# A declared range of at most this many sizes is primed whole (prime), where it is primed at all.
PRIME_MAX_SIZES = 64


def prime_sizes(inputs: tuple, dynamic: dict) -> list[tuple[tuple[int, int], int]]:
    """(range, size) for each call prime() makes: every size of each declared range of at most
    PRIME_MAX_SIZES sizes, from 2 (size 1 has graphs of its own), but the example's own (at_size:
    no dim changes), in order."""
    ranges = sorted({r for dims in dynamic.values() for r in dims.values() if r[1] - r[0] < PRIME_MAX_SIZES})
    return [(r, n) for r in ranges for n in range(max(r[0], 2), r[1] + 1) if _changed_dims(inputs, dynamic, r, n)]


def prime(call: Callable, inputs: tuple, dynamic: dict, allows: Callable[[float], bool]) -> str | None:
    """Call `call` once at each of prime_sizes (the example's and size 1's graphs are compiled
    already), while allows(seconds the next call is expected to take) holds; None where every size
    was called, else what was left. NOTE: for a graph with convs, the first call at a new size
    plans cuDNN's algorithms for it (60-100 ms a size on ResNet-50, README), which otherwise lands
    on the first request of that size; the call's own time is what the next is expected to take."""
    last_s = 0.0
    for r, n in prime_sizes(inputs, dynamic):
        if not allows(last_s):
            return f"sizes {n}-{r[1]} of the declared range {r[0]}-{r[1]}"
        last_s = _timed_call(call, at_size(inputs, dynamic, r, n))
    return None


def first_call_s(call: Callable, inputs: tuple, dynamic: dict) -> tuple[float, int] | None:
    """(seconds, count): `call` timed once at the middle one of prime_sizes, a size it has not met
    (its first call there, as each of prime()'s will be), and how many sizes prime() calls; None
    where it calls none."""
    sizes = prime_sizes(inputs, dynamic)
    if not sizes:
        return None
    r, n = sizes[len(sizes) // 2]
    return _timed_call(call, at_size(inputs, dynamic, r, n)), len(sizes)


def _timed_call(call: Callable, args: tuple) -> float:
    """Seconds of one call of `call` on args, synchronized where they are on a GPU."""
    from torch_htam.timing import _sync_for
    sync = _sync_for(args)
    t0 = time.perf_counter()
    call(*args)
    sync()
    return time.perf_counter() - t0


_CONV = re.compile(r"conv(olution|_?[123]d)")   # aten.convolution, F.conv2d, torch.conv1d; not convert_*


def has_conv(graphs) -> bool:
    """Whether any of the fx graphs holds a convolution (is_conv)."""
    return any(is_conv(gm, n) for gm in graphs for n in gm.graph.nodes)


def is_conv(gm, n) -> bool:
    """Node n of graph gm is a convolution (a call of one, or an nn.Conv*d module's call)."""
    if n.op == "call_module":
        return isinstance(gm.get_submodule(n.target), nn.modules.conv._ConvNd)
    return n.op == "call_function" and bool(_CONV.search(getattr(n.target, "__name__", str(n.target))))
