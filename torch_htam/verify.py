"""The correctness protocol: when a candidate kernel counts as equal to its task's reference.

A kernel is any callable `kernel(inputs, outputs) -> int` (launcher.Kernel on the GPU; a Python
function in the CPU tests) that fills caller-allocated outputs and returns htam_run's code.
`verify` runs it against the task's reference Model under DESIGN.md "What verified means":

- inputs from the task's specs under several value distributions (never uniform [0,1) alone, which
  makes softmax/norm outputs nearly constant), at the task's shape and, when a dim is dynamic, at
  half and double that size, or across its declared range (range_shapes);
- every candidate call gets freshly allocated outputs poisoned with a NaN payload (floats) or a
  sentinel (ints), so reading the reference's freed output memory or skipping elements shows up;
- the candidate runs before AND after the reference, on the same inputs, and both results must be
  bitwise equal (determinism) and inside the policy's tolerance (allclose, in float64); a floating
  output (fp32, bf16, fp16) outside it may still pass against the reference run in float64, if it
  is about as close to that as torch's own result under the policy (within_torch_error);
- inputs are compared bitwise with their clones after every candidate call;
- a task found in a model (task.example) runs once more on the region's real inputs: the
  model's own weights and activations, whose value ranges random draws may miss.

    >>> ok, reason, detail, errs = verify(task, Kernel(so_path), load_reference(task).cuda(), policy_for(task))
    >>> ok, reason, errs["max_abs_err"]
    (True, 'ok', 2.384185791015625e-07)

A task with declared size ranges (TensorSpec.ranges) is verified over them: `verify` demands the
kernel be right at every size of range_shapes, `verify_range` judges each bucket of sizes apart
(buckets_for), so a kernel wrong at size 1 can still serve the buckets where it is right.

    >>> v = verify_range(task, Kernel(so_path), load_reference(task).cuda(), policy_for(task))
    >>> [str(b) for b in v.kept], [(str(w.bucket), w.reason) for w in v.wrong]
    (['in0 dim 0 in [2, 8]', 'in0 dim 0 in [9, 64]'], [('in0 dim 0 in [1, 1]', 'mismatch')])
"""
from __future__ import annotations

import collections
import copy
import functools
import math
from dataclasses import dataclass, field

import torch

from torch_htam.errors import is_crash_message  # noqa: F401 -- verify's callers read it here too
from torch_htam.launcher import task_outputs
from torch_htam.policy import tf32_switches
from torch_htam.task import Task, TensorSpec, order_strides, stride_order

HTAM_ERR_SHAPE = 1000   # csrc/htam_abi.h

# Value distributions, one per seed (cycled): see make_input.
DISTRIBUTIONS = ("normal", "uniform", "outliers")

# Errors after which the CUDA context is unusable: the worker must exit (cudaError_t codes).
STICKY_CUDA_ERRORS = {700: "cudaErrorIllegalAddress", 710: "cudaErrorAssert",
                      714: "cudaErrorHardwareStackError", 715: "cudaErrorIllegalInstruction",
                      716: "cudaErrorMisalignedAddress", 717: "cudaErrorInvalidAddressSpace",
                      718: "cudaErrorInvalidPc", 719: "cudaErrorLaunchFailure"}

# A secondary (doubled) shape is skipped when it would need more than this many bytes of inputs.
MAX_SECOND_SHAPE_BYTES = 2 << 30


@dataclass
class Failure(Exception):
    """One failed check: reason is an evaluation.REASONS entry."""
    reason: str
    detail: str
    errs: dict | None = None


# ---------------------------------------------------------------------------------- inputs

def make_input(spec: TensorSpec, shape: tuple[int, ...], dist: str, gen: torch.Generator,
               device: str | torch.device = "cpu") -> torch.Tensor:
    """One input tensor of `shape` (may differ from spec.shape in dynamic dims), laid out like spec.

    dist (floats only): "normal" N(0,1); "uniform" U(-3,3); "outliers": N(0,1) rows scaled by
    10**U(-2,1) (mixed scales, so per-row softmax/norm outputs are not near constant) with ~0.1%
    of elements set to +-U(64,128) (exp overflows fp32 past 88: an unguarded softmax returns NaN).
    Integer specs draw randint(low, high) (default [0, 16)); bool specs draw fair coins; positive
    specs (variances) draw |N(0,1)| whatever the distribution.

        >>> make_input(spec, (8, 4096), "outliers", torch.Generator().manual_seed(0)).shape
        torch.Size([8, 4096])
    """
    dt = spec.torch_dtype
    if dt == torch.bool:
        x = torch.randint(0, 2, shape, generator=gen).bool()
    elif not dt.is_floating_point:
        lo = 0 if spec.low is None else spec.low
        hi = 16 if spec.high is None else spec.high
        x = torch.randint(lo, hi, shape, generator=gen, dtype=torch.int64)
    elif spec.positive:   # a variance (running_var): |x| of the distribution's normal draw
        x = torch.randn(shape, generator=gen).abs()
    elif dist == "normal":
        x = torch.randn(shape, generator=gen)
    elif dist == "uniform":
        x = torch.rand(shape, generator=gen) * 6 - 3
    elif dist == "outliers":
        x = torch.randn(shape, generator=gen)
        if x.dim() >= 1 and x.numel():
            rows = x.shape[0] if x.dim() > 1 else 1
            scale = 10 ** (torch.rand(rows, generator=gen) * 3 - 2)
            x = (x.reshape(rows, -1) * scale[:, None]).reshape(shape)
            flat = x.view(-1)
            k = max(1, flat.numel() // 1000)
            idx = torch.randint(0, flat.numel(), (k,), generator=gen)
            sign = torch.randint(0, 2, (k,), generator=gen) * 2 - 1
            flat[idx] = sign * (64 + 64 * torch.rand(k, generator=gen))
    else:
        raise ValueError(f"unknown distribution {dist!r}; use one of {DISTRIBUTIONS}")
    x = x.to(dt)
    out = torch.empty_strided(shape, strides_at(spec, shape), dtype=dt, device=device)
    return out.copy_(x.to(device))


def example_inputs(task: Task, device) -> list[torch.Tensor] | None:
    """The region's real inputs (task.example), laid out as the specs say; None when the task has
    none or the file no longer matches its specs."""
    if not task.example:
        return None
    from safetensors.torch import load_file
    try:
        saved = load_file(task.example)
    except (OSError, ValueError):
        return None
    out = []
    for i, spec in enumerate(task.inputs):
        x = saved.get(f"in{i}")
        if x is None or tuple(x.shape) != spec.shape or x.dtype != spec.torch_dtype:
            return None
        t = torch.empty_strided(spec.shape, spec.stride, dtype=spec.torch_dtype, device=device)
        out.append(t.copy_(x.to(device)))
    return out


def strides_like(spec: TensorSpec, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Dense strides for `shape` in the spec's dim order (contiguous, or e.g. a transposed layout)."""
    if not spec.stride:
        return (0,) * len(shape)
    return order_strides(shape, stride_order(spec.stride))


def strides_at(spec: TensorSpec, shape: tuple[int, ...]) -> tuple[int, ...]:
    """An input's strides at `shape`, laid out as the model lays it out there: each dim keeps the
    example's stride, scaled by how much the dims inside it (smaller strides) grew. E.g. q of a
    fused projection, qkv[..., :768].view(B, L, 12, 64) of (B, L, 2304): (L * 2304, 2304, 64, 1)
    at every B and L, rows 2304 apart as served, where strides_like would make them dense (768).
    strides_like's where the example broadcasts (a stride 0), a scaled stride is not whole, or the
    dims would overlap."""
    if not spec.stride or len(spec.stride) != len(shape) or 0 in spec.stride:
        return strides_like(spec, shape)
    order = stride_order(spec.stride)[::-1]
    out, old_in, new_in = [0] * len(shape), 1, 1
    for d in order:   # innermost first
        if spec.stride[d] * new_in % old_in:
            return strides_like(spec, shape)
        out[d] = spec.stride[d] * new_in // old_in
        old_in, new_in = old_in * max(spec.shape[d], 1), new_in * max(shape[d], 1)
    dims = [d for d in order if shape[d] > 1]
    if any(out[b] < out[a] * shape[a] for a, b in zip(dims, dims[1:])):
        return strides_like(spec, shape)
    return tuple(out)


def shape_sets(task: Task) -> list[tuple[list[tuple[int, ...]], list[tuple[int, ...]]]]:
    """(input shapes, output shapes) to verify: the task's own, then (if any input dim is dynamic)
    half and double those sizes; for a task with declared ranges, range_shapes(task).sets instead.

    All dynamic dims, of inputs and outputs alike, scale by the same factor so related dims stay
    consistent (B with B*S). Halving needs every dynamic size even; doubling is skipped past
    MAX_SECOND_SHAPE_BYTES of inputs.

        >>> [ins for ins, outs in shape_sets(task)]     # x: [4096, 64], dynamic=(0,)
        [[(4096, 64)], [(2048, 64)], [(8192, 64)]]
    """
    if leading_dim(task) is not None:
        return range_shapes(task).sets
    specs = list(task.inputs) + list(task.outputs)
    n_in = len(task.inputs)
    sets = [[tuple(s.shape) for s in specs]]
    dyn = [s.shape[d] for s in task.inputs for d in s.dynamic]
    if dyn:
        if all(n % 2 == 0 for n in dyn):
            sets.append(_scaled(specs, 0.5))
        if 2 * sum(s.nbytes for s in task.inputs) <= MAX_SECOND_SHAPE_BYTES:
            sets.append(_scaled(specs, 2))
    return [(s[:n_in], s[n_in:]) for s in sets]


def _scaled(specs: list[TensorSpec], f: float) -> list[tuple[int, ...]]:
    return [tuple(int(n * f) if d in s.dynamic else n for d, n in enumerate(s.shape)) for s in specs]


# ---------------------------------------------------------------------------------- ranges

MAX_RANGE_SHAPES = 8              # shape sets per range verification, the example's included
MAX_RANGE_SHAPE_BYTES = 2 << 30   # inputs + outputs of one shape set; larger sizes are skipped
# Upper ends of the buckets below a range's maximum: [1, 1], [2, 8], [9, 128], [129, 2048], ...
# Size 1 is its own bucket (a GEMV, not a GEMM; a broadcast the kernel may mishandle); from there
# each bucket spans 16x, about where a kernel's best tiling changes.
BUCKET_EDGES = (1, 8, 128, 2048, 32768)
ODD_SIZES = (7, 127)              # a kernel that handles rows in pairs, or in tiles of 8 or 128


@dataclass(frozen=True)
class Bucket:
    """Sizes low..high (inclusive) of a task's leading dynamic dim: inputs[input].shape[dim].

    What a kernel is kept for, and what the runtime checks on the host before a launch (this
    kernel if the size is inside a bucket it was kept for, else the original region).
    """
    input: int
    dim: int
    low: int
    high: int

    def holds(self, size: int) -> bool:
        return self.low <= size <= self.high

    def __str__(self) -> str:
        return f"in{self.input} dim {self.dim} in [{self.low}, {self.high}]"


def leading_dim(task: Task) -> tuple[int, int] | None:
    """(input index, dim) of the task's first dim with a declared range, or None (a static task,
    or one with dynamic dims but no ranges). Its size names each shape set and bucket; every other
    dynamic dim scales with it (B with B*S, as in shape_sets)."""
    for i, s in enumerate(task.inputs):
        for d in s.dynamic:
            if s.range_of(d) is not None:
                return i, d
    return None


def buckets_for(task: Task) -> list[Bucket]:
    """The task's leading dim's range cut at BUCKET_EDGES; [] for a task without ranges.

        >>> [(b.low, b.high) for b in buckets_for(task)]     # batch declared 1-2048
        [(1, 1), (2, 8), (9, 128), (129, 2048)]
    """
    lead = leading_dim(task)
    if lead is None:
        return []
    i, d = lead
    low, high = task.inputs[i].range_of(d)
    out, start = [], low
    for edge in BUCKET_EDGES:
        if start <= edge < high:
            out.append(Bucket(i, d, start, edge))
            start = edge + 1
    return out + [Bucket(i, d, start, high)]


@dataclass
class RangeShapes:
    """What range_shapes picked: sizes[k] is the leading dim's size in sets[k] (the example's
    first); skipped: the sizes left out and why (over the byte cap, over the shape cap)."""
    sizes: list[int]
    sets: list[tuple[list[tuple[int, ...]], list[tuple[int, ...]]]]
    skipped: list[str] = field(default_factory=list)


def range_shapes(task: Task, max_shapes: int = MAX_RANGE_SHAPES,
                 max_bytes: int = MAX_RANGE_SHAPE_BYTES) -> RangeShapes:
    """Shape sets spanning the leading dim's declared range: the example size first, then the
    range's low end (1), the odd sizes 7 and 127, the maximum and powers of two where inside it,
    at most `max_shapes` in all, the powers of two spread over the buckets. Every dynamic dim
    scales by size / example size. A size whose inputs and outputs would pass `max_bytes` is
    skipped and said so (the maximum then gives way to the largest power of two under the cap).

        >>> range_shapes(task).sizes                   # x: [64, 32], batch declared 1-64
        [64, 1, 2, 4, 7, 8, 16, 32]
    """
    i, d = leading_dim(task)
    example = task.inputs[i].shape[d]
    low, high = task.inputs[i].range_of(d)
    specs = list(task.inputs) + list(task.outputs)
    pows = [1 << k for k in range(high.bit_length()) if low <= 1 << k <= high]
    wanted = [n for n in dict.fromkeys([low, *(n for n in ODD_SIZES if low <= n <= high), high])
              if n != example]
    why = {n: _unfit(specs, n, example, max_bytes) for n in wanted + pows}
    skipped = [f"size {n}: {why[n]}" for n in wanted if why[n]]
    big = [p for p in pows if why[p] and p not in wanted]
    if big:
        skipped.append(f"powers of two {big[0]}-{big[-1]}: over the cap of {max_bytes} bytes")
    chosen = [example] + [n for n in wanted if not why[n]]
    if high != example and why[high]:   # test as near the max as fits
        chosen += [p for p in reversed(pows) if not why[p] and p not in chosen][:1]
    chosen += _spread([p for p in pows if not why[p] and p not in chosen], chosen,
                      buckets_for(task), max_shapes - len(chosen))
    if len(chosen) > max_shapes:   # only with max_shapes below the 5 sizes always wanted
        skipped += [f"size {n}: over the cap of {max_shapes} shapes" for n in chosen[max_shapes:]]
        chosen = chosen[:max_shapes]
    sizes = [example] + sorted(chosen[1:])
    n_in = len(task.inputs)
    sets = [(sh[:n_in], sh[n_in:]) for sh in (_sized(specs, n, example) for n in sizes)]
    return RangeShapes(sizes, sets, skipped)


def _spread(candidates: list[int], chosen: list[int], buckets: list[Bucket], room: int) -> list[int]:
    """Up to `room` of candidates, each time one from the bucket holding fewest sizes so far (so
    no bucket is judged on one size where another has five); smaller first among equals."""
    def bucket(n: int) -> Bucket | None:
        return next((b for b in buckets if b.holds(n)), None)
    held = collections.Counter(bucket(n) for n in chosen)
    out, left = [], sorted(candidates)
    while left and len(out) < room:
        n = min(left, key=lambda n: (held[bucket(n)], n))
        left.remove(n)
        out.append(n)
        held[bucket(n)] += 1
    return out


def _unfit(specs: list[TensorSpec], size: int, example: int, max_bytes: int) -> str:
    """Why the shape set at `size` cannot run ("" when it can)."""
    shapes = _sized(specs, size, example)
    if shapes is None:
        return "a dynamic dim does not scale to an integer size"
    n = _bytes(specs, shapes)
    return f"{n} bytes of inputs and outputs, over the cap of {max_bytes}" if n > max_bytes else ""


def shapes_at(task: Task, size: int, max_bytes: int = MAX_RANGE_SHAPE_BYTES) -> tuple[list, list] | None:
    """(input shapes, output shapes) of a ranged task with its leading dim at `size` (every other
    dynamic dim scaled with it, as range_shapes does); None where one does not come out whole or
    the set passes max_bytes, as range_shapes skips it."""
    i, d = leading_dim(task)
    specs, example = list(task.inputs) + list(task.outputs), task.inputs[i].shape[d]
    if _unfit(specs, size, example, max_bytes):
        return None
    sh = _sized(specs, size, example)
    return sh[:len(task.inputs)], sh[len(task.inputs):]


def make_set(task: Task, shapes: tuple[list, list], gen: torch.Generator,
             device: str | torch.device = "cuda") -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Normal inputs of shapes[0] and empty outputs of shapes[1], laid out as the task's specs say
    (a conv region's are channels-last), as a launch gets them."""
    ins = [make_input(s, sh, "normal", gen, device) for s, sh in zip(task.inputs, shapes[0])]
    outs = [torch.empty_strided(s.kernel_shape(sh), strides_like(s, s.kernel_shape(sh)), dtype=s.torch_dtype,
                                device=device) for s, sh in zip(task.outputs, shapes[1])]
    return ins, outs


def _sized(specs: list[TensorSpec], size: int, example: int) -> list[tuple[int, ...]] | None:
    """The specs' shapes with every dynamic dim n scaled to n * size / example; None when one
    does not come out an integer."""
    out = []
    for s in specs:
        shape = []
        for d, n in enumerate(s.shape):
            if d in s.dynamic:
                if n * size % example:
                    return None
                n = n * size // example
            shape.append(n)
        out.append(tuple(shape))
    return out


def _bytes(specs: list[TensorSpec], shapes: list[tuple[int, ...]]) -> int:
    size = lambda s: torch.empty((), dtype=s.torch_dtype).element_size()   # noqa: E731
    return sum(math.prod(sh) * size(s) for s, sh in zip(specs, shapes))


# ---------------------------------------------------------------------------------- poison

# Bit patterns written into outputs before each call. Float poisons are NaNs with a payload that
# no arithmetic produces (GPUs return the canonical NaN), so a surviving one means "never written".
_FLOAT_POISON = {torch.float32: (torch.int32, 0x7FC0DEAD), torch.float64: (torch.int64, 0x7FF8DEADBEEF0000),
                 torch.float16: (torch.int16, 0x7E5A), torch.bfloat16: (torch.int16, 0x7FDA)}
_INT_POISON = {torch.int64: (-0x5EADBEEF5EADBEEF, 0x2EADBEEF2EADBEEF), torch.int32: (-0x5EADBEEF, 0x2EADBEEF),
               torch.int8: (-123, 117), torch.uint8: (0xA5, 0x5A), torch.bool: (True, False)}


def poison_(t: torch.Tensor, variant: int = 0) -> torch.Tensor:
    """Fill t with its dtype's poison. Ints/bools have two variants (a sentinel value can be a
    real answer, so only an element equal to the poison under BOTH variants counts as unwritten)."""
    if t.dtype in _FLOAT_POISON:
        ity, bits = _FLOAT_POISON[t.dtype]
        t.view(ity).fill_(bits if variant == 0 else bits ^ 0x1)   # a second payload, still a NaN
    else:
        t.fill_(_INT_POISON[t.dtype][variant])
    return t


def poisoned(t: torch.Tensor, variant: int = 0) -> torch.Tensor:
    """Bool mask of elements of t still holding `variant`'s poison."""
    if t.dtype in _FLOAT_POISON:
        ity, bits = _FLOAT_POISON[t.dtype]
        return t.view(ity) == (bits if variant == 0 else bits ^ 0x1)
    return t == _INT_POISON[t.dtype][variant]


def unwritten(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """Elements left unwritten by a call: first ran under poison variant 0, second under 1."""
    if first.dtype in _FLOAT_POISON:
        return poisoned(first, 0) | poisoned(second, 1)
    return poisoned(first, 0) & poisoned(second, 1)


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Exact equality of the bits (NaN == NaN with the same payload; -0.0 != 0.0)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.is_floating_point:
        ity = {8: torch.int64, 4: torch.int32, 2: torch.int16}[a.element_size()]
        return torch.equal(a.contiguous().view(ity), b.contiguous().view(ity))
    return torch.equal(a, b)


# ---------------------------------------------------------------------------------- compare

def compare(out: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float, name: str = "output 0"
            ) -> tuple[str, str, dict]:
    """(reason, detail, errs) for one output against the reference; reason "ok" when it passes.

    allclose semantics |out - ref| <= atol + rtol * |ref|, in float64. Non-finite candidate values
    where the reference is finite -> "nan"; non-finite reference values must be matched exactly.
    errs: max_abs_err, max_rel_err (relative where |ref| > atol, so near-zero refs don't dominate).

        >>> compare(torch.ones(3), torch.ones(3) + 1e-3, 1e-4, 1e-4)[0]
        'mismatch'
    """
    if tuple(out.shape) != tuple(ref.shape):
        return "shape_mismatch", f"{name}: shape {list(out.shape)}, reference {list(ref.shape)}", {}
    if out.dtype != ref.dtype:
        return "dtype_mismatch", f"{name}: dtype {out.dtype}, reference {ref.dtype}", {}
    a, b = out.double(), ref.double()
    fin_a, fin_b = torch.isfinite(a), torch.isfinite(b)
    diff = torch.where(fin_a & fin_b, (a - b).abs(), torch.zeros_like(a))
    big = b.abs() > atol
    rel = torch.where(big & fin_a & fin_b, diff / b.abs().clamp_min(1e-300), torch.zeros_like(a))
    errs = {"max_abs_err": float(diff.max()) if diff.numel() else 0.0,
            "max_rel_err": float(rel.max()) if rel.numel() else 0.0}
    bad_nan = fin_b & ~fin_a
    if bool(bad_nan.any()):
        n = int(bad_nan.sum())
        i = _unravel(int(bad_nan.reshape(-1).nonzero()[0]), out.shape)
        return "nan", f"{name}: {n} non-finite values where the reference is finite, first at {i}", errs
    ref_nonfinite = ~fin_b
    if bool(ref_nonfinite.any()):
        same = (a == b) | (torch.isnan(a) & torch.isnan(b))
        if not bool(same[ref_nonfinite].all()):
            return "mismatch", f"{name}: reference has inf/nan the candidate does not reproduce", errs
    bad = diff > atol + rtol * b.abs()
    if bool(bad.any()):
        n, i = int(bad.sum()), _unravel(int(bad.reshape(-1).nonzero()[0]), out.shape)
        return "mismatch", (f"{name}: {n}/{out.numel()} values outside atol={atol:g} rtol={rtol:g}; "
                            f"max abs err {errs['max_abs_err']:.3g}, max rel err "
                            f"{errs['max_rel_err']:.3g}; first at {i}: got {float(a.reshape(-1)[bad.reshape(-1)][0]):.6g}, "
                            f"expected {float(b.reshape(-1)[bad.reshape(-1)][0]):.6g}"), errs
    return "ok", "", errs


# NOTE: two correct fp32 kernels that add a long dot product in different orders differ by their
# rounding, and where the sum lands near zero that exceeds atol=1e-4: for linear(x[256, 3072]) under
# the "outliers" inputs, a GEMM accumulated in float64 (the most exact fp32 answer there is) fails
# the plain comparison with torch's own fp32 result (tests/test_verify.py). So an fp32 output that
# fails it is judged once more against a float64 reference: it passes if it is about as close to
# that as torch's own result is, element by element and overall. "Torch's own" follows the policy:
# the strict-fp32 reference, or under TF32 the reference run with TF32 on, as the user's settings
# run it (a TF32 conv missed 5e-3 against strict fp32 on every cuDNN engine but one, H100).
#
# NOTE: bf16 / fp16 outputs get the same second judgement. A reference computed in bf16 rounds its
# intermediates to bf16 where a fused kernel keeps them in fp32: minGPT's hand-written attention
# rounds q @ k^T to bf16 before its softmax (at verification's outlier inputs, scores of ~100 move
# by half an ulp, 0.25, and a probability by e^0.25), so the bf16 reference misses the float64 answer
# by up to 3.3 while a flash kernel (fp32 scores) stays within 2e-2 of it; the plain comparison
# rejected the more exact kernel (attn_mingpt_bf16, H100; tests/test_verify.py).
FP32_ERR_FACTOR = 4.0   # |out - ref64| <= atol + rtol * |ref64| + FP32_ERR_FACTOR * local error scale
FP32_RMS_FACTOR = 2.0   # rms(out - ref64) <= FP32_RMS_FACTOR * rms(ref32 - ref64)


def error_scale(err: torch.Tensor) -> torch.Tensor:
    """Torch's own error |ref32 - ref64| smoothed into a local scale, shaped like err.

    Rounding error follows the size of the terms summed, and inputs scaled per row (of x) and per
    column (of a weight) give an error of about row_i * col_j. The rank-one estimate rowmax_i *
    colmax_j / max over the output ([..., cols] flattened to 2-D) follows that, where one global
    max would let an element of a 0.01-scaled row err like one of a 10-scaled row.

    NOTE: never below torch's own error at the element itself. A conv's error follows its channel's
    batch-norm scale, which no row x column product captures: at verification's outlier inputs the
    estimate gave 7.35 where torch's own error was 50.6, and rejected a result bitwise equal to
    PyTorch's (cuDNN ran PyTorch's engine; docs/RESULTS_LOG.md, H100).

        >>> error_scale(torch.tensor([[1e-6, 1e-4], [1e-8, 1e-6]])).tolist()
        [[1e-06, 0.0001], [1e-08, 1e-06]]
    """
    g = err.max() if err.numel() else err.new_zeros(())
    if err.dim() < 2 or float(g) == 0.0:
        return torch.full_like(err, float(g))
    e2 = err.reshape(-1, err.shape[-1])
    s = e2.amax(1, keepdim=True) * e2.amax(0, keepdim=True) / g
    return torch.maximum(s.reshape(err.shape), err)


def within_torch_error(out: torch.Tensor, ref32: torch.Tensor, ref64: torch.Tensor, atol: float,
                       rtol: float) -> tuple[bool, str]:
    """(passes, why not): is `out` about as close to the float64 reference as torch's result ref32
    (fp32 storage; TF32 math where the policy allows it)?

    Non-finite values of ref32 must be matched exactly; the rest is judged where ref32 and ref64
    are finite, and only when ref64 refines ref32 (float64, rms(ref32 - ref64) <= rtol *
    rms(ref64)): a model whose float64 run computes something else gives no judgement. Then every
    element must satisfy |out - ref64| <= atol + rtol * |ref64| + FP32_ERR_FACTOR * error_scale,
    and rms(out - ref64) <= FP32_RMS_FACTOR * rms(ref32 - ref64) (no pervasive drift either).

        >>> within_torch_error(fp64_accumulated_gemm, torch_fp32_gemm, gemm_in_float64, 1e-4, 1e-4)
        (True, '')
    """
    if ref64.dtype != torch.float64 or ref64.shape != out.shape:
        return False, "no float64 reference for this output"
    a, r32 = out.double(), ref32.double()
    fin = torch.isfinite(r32)
    same = (a == r32) | (torch.isnan(a) & torch.isnan(r32))
    if not bool(same[~fin].all()) or not bool(torch.isfinite(a[fin]).all()):
        return False, "non-finite values differ from torch's"
    # NOTE: inf/nan of the reference (e.g. a batch norm over a negative variance) are matched
    # exactly above; the error is judged where torch's results and the float64 ones are finite.
    fin &= torch.isfinite(ref64)
    a, r32, ref64 = (torch.where(fin, t, torch.zeros_like(t)) for t in (a, r32, ref64))
    e_ref, e_out = (r32 - ref64).abs(), (a - ref64).abs()
    rms = lambda t: float(t.pow(2).mean().sqrt()) if t.numel() else 0.0   # noqa: E731
    if rms(e_ref) > rtol * rms(ref64):
        return False, "the float64 run does not refine torch's fp32 result"
    bad = e_out > atol + rtol * ref64.abs() + FP32_ERR_FACTOR * error_scale(e_ref)
    if bool(bad.any()):
        return False, (f"{int(bad.sum())} values further from it than {FP32_ERR_FACTOR:g}x torch's own "
                       f"error (max {float(e_ref.max()):.3g})")
    if rms(e_out) > FP32_RMS_FACTOR * rms(e_ref):
        return False, (f"rms error {rms(e_out):.3g}, above {FP32_RMS_FACTOR:g}x torch's own "
                       f"{rms(e_ref):.3g}")
    return True, ""


def _unravel(flat: int, shape) -> list[int]:
    idx = []
    for n in reversed(tuple(shape)):
        idx.append(flat % n)
        flat //= n
    return idx[::-1]


# ---------------------------------------------------------------------------------- protocol

def cuda_error_name(code: int) -> str:
    """'cudaErrorIllegalAddress (700): an illegal memory access...' or HTAM_ERR_SHAPE text."""
    if code == HTAM_ERR_SHAPE:
        return "HTAM_ERR_SHAPE (kernel does not support these shapes)"
    name = STICKY_CUDA_ERRORS.get(code, "cudaError")
    try:
        return f"{name} ({code}): {torch.cuda.CudaError(code)}"
    except Exception:   # no CUDA runtime in this torch build
        return f"{name} ({code})"


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _call(kernel, inputs, outputs, device, where: str) -> None:
    """One candidate call + device sync; raises Failure with refused (HTAM_ERR_SHAPE: the kernel
    does not take these inputs) / launch_error / crash."""
    try:
        code = kernel(inputs, outputs)
        _sync(device)
    except Exception as e:   # a sticky CUDA error surfaces as a RuntimeError at the sync
        msg = f"{where}: {type(e).__name__}: {str(e).strip()[:300]}"
        raise Failure("crash" if is_crash_message(str(e)) else "launch_error", msg) from None
    if code:
        reason = ("refused" if code == HTAM_ERR_SHAPE else "crash" if code in STICKY_CUDA_ERRORS
                  else "launch_error")
        raise Failure(reason, f"{where}: htam_run returned {cuda_error_name(int(code))}")


def _as_list(out) -> list[torch.Tensor]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _run_reference(reference, inputs, tf32: bool = False) -> list[torch.Tensor]:
    """The reference's outputs: strict fp32 (the ground truth), or with TF32 on (torch's own result
    under a TF32 policy)."""
    with torch.no_grad(), tf32_switches(tf32):
        out = reference(*[x.clone() for x in inputs])   # a reference with in-place ops stays harmless
    return [o.clone() for o in _as_list(out)]


def _reference64(reference, inputs) -> list[torch.Tensor] | None:
    """The reference run in float64: floating inputs, parameters and buffers promoted (the
    reference itself is left alone). None when it cannot run so (an op without a float64 kernel, a
    dtype fixed inside forward)."""
    model = copy.deepcopy(reference).double() if isinstance(reference, torch.nn.Module) else reference
    args = [x.double() if x.is_floating_point() else x.clone() for x in inputs]
    try:
        with torch.no_grad():
            return _as_list(model(*args))
    except Exception:
        return None


def _fresh_outputs(specs: list[TensorSpec], shapes, variant: int, device) -> list[torch.Tensor]:
    """What the kernel writes: each output dense in its spec's dim order, an expanded one without
    its expand (TensorSpec.kernel_shape), as the launcher allocates them at run time."""
    # Allocated for each call, after the previous tensors were freed: the caching allocator may
    # hand back memory that holds the reference's answer, which the poison then overwrites.
    out = []
    for s, sh in zip(specs, shapes):
        ks = s.kernel_shape(sh)
        out.append(poison_(torch.empty_strided(ks, strides_like(s, ks), dtype=s.torch_dtype, device=device),
                           variant))
    return out


def _check_inputs(inputs, clones, where: str) -> None:
    for i, (x, c) in enumerate(zip(inputs, clones)):
        if not bitwise_equal(x, c):
            raise Failure("input_mutated", f"{where}: input {i} changed (the kernel wrote to it)")


def _check_outputs(k: int, out, first, second, ref, policy, where: str, errs: dict,
                   ref64=lambda: None, ref_torch=None) -> None:
    """Output k of one call. first/second: output k of the calls under poison variants 0 and 1."""
    left = unwritten(first, second)
    if bool(left.any()):
        at = _unravel(int(left.reshape(-1).nonzero()[0]), out.shape)
        raise Failure("partial_write", f"{where}: output {k}: {int(left.sum())}/{out.numel()} elements "
                                       f"never written (poison survived), first at {at}")
    reason, detail, e = judge(k, out, ref, policy, ref64, ref_torch, f"{where}: output {k}")
    if e:
        if e["max_abs_err"] >= errs.get("max_abs_err", -1.0):
            errs.update(max_abs_err=e["max_abs_err"], output=k)
        errs["max_rel_err"] = max(errs.get("max_rel_err", 0.0), e["max_rel_err"])
        if e.get("judged_against_float64"):
            errs["judged_against_float64"] = True
    if reason != "ok":
        raise Failure(reason, detail)


def judge(k: int, out, ref, policy, ref64=lambda: None, ref_torch=None, name: str | None = None
          ) -> tuple[str, str, dict]:
    """(reason, detail, errs) for output k against the reference under the policy: `compare`, then
    for a floating output that mismatches, the float64 judgement (within_torch_error). ref64() /
    ref_torch(): the float64 reference outputs (or None) and torch's own under the policy
    (None: ref itself), called only when needed (see reference_outputs).

        >>> judge(0, out, ref, make("fp32"), ref64, None)[0]
        'ok'
    """
    reason, detail, e = compare(out, ref, policy.atol, policy.rtol, name or f"output {k}")
    if reason == "mismatch" and out.is_floating_point():
        r64 = ref64()
        own = ref_torch()[k] if ref_torch is not None else ref
        ok, why = within_torch_error(out, own, r64[k], policy.atol, policy.rtol) if r64 and k < len(r64) \
            else (False, "no float64 reference (the model does not run in float64)")
        if ok:
            return "ok", "", dict(e, judged_against_float64=True)
        detail += f"; against a float64 reference: {why}"
    return reason, detail, e


def reference_outputs(reference, inputs, policy) -> tuple[list[torch.Tensor], object, object]:
    """(strict-fp32 reference outputs, ref64(), ref_torch() or None) for `judge`; the last two are
    computed on first call only (a float64 run is the cost of a mismatch, not of every check).

        >>> ref, ref64, own = reference_outputs(model, inputs, policy)
    """
    clones = [x.clone() for x in inputs]
    ref = _run_reference(reference, clones)
    ref64 = functools.cache(lambda: _reference64(reference, clones))
    own = functools.cache(lambda: _run_reference(reference, clones, tf32=True)) if policy.allow_tf32 else None
    return ref, ref64, own


def verify(task: Task, kernel, reference, policy, device="cuda", seeds=(0, 1, 2)
           ) -> tuple[bool, str, str, dict]:
    """Run the correctness protocol; returns (ok, reason, detail, errs).

    Every seed runs at the task's shape, cycling DISTRIBUTIONS; each extra shape of shape_sets
    adds one trial. errs: max_abs_err / max_rel_err (worst over outputs and trials), output (its
    index) and shapes (input shapes of every trial run). reason "crash" means the CUDA context is
    dead and the process must not launch anything else.

        >>> verify(task, Kernel(so), load_reference(task).cuda(), policy_for(task))
        (True, 'ok', '', {'shapes': [...], 'max_abs_err': 4.7e-07, 'max_rel_err': 1.1e-06, 'output': 0})
    """
    sets = shape_sets(task)
    trials = [(sets[0], s, DISTRIBUTIONS[i % len(DISTRIBUTIONS)]) for i, s in enumerate(seeds)]
    trials += [(sh, 1000 + j, DISTRIBUTIONS[(j + 2) % len(DISTRIBUTIONS)]) for j, sh in enumerate(sets[1:])]
    errs: dict = {"shapes": []}
    bufs: dict[tuple, list[torch.Tensor]] = {}

    def run_all() -> None:
        for shapes, seed, dist in trials:
            _seeded_trial(task, kernel, reference, policy, device, shapes, seed, dist, errs, bufs)
        _own_trial(task, kernel, reference, policy, device, errs)
    failed = _failure(run_all)
    if failed:
        return False, failed.reason, failed.detail, errs
    return True, "ok", "", errs


def _failure(run) -> Failure | None:
    """run() under the protocol: None when every check passed, else the Failure."""
    try:
        run()
    except Failure as f:
        return f
    except Exception as e:   # the reference tripped over a context the candidate broke
        if not is_crash_message(str(e)):
            raise
        return Failure("crash", f"{type(e).__name__}: {str(e).strip()[:300]}")
    return None


def _seeded_trial(task, kernel, reference, policy, device, shapes, seed, dist, errs, bufs) -> None:
    """One trial on random inputs of `shapes` ((input shapes, output shapes)) drawn from `seed`."""
    in_shapes, out_shapes = shapes
    gen = torch.Generator().manual_seed(seed)
    fresh = [make_input(s, sh, dist, gen, device) for s, sh in zip(task.inputs, in_shapes)]
    # NOTE: new values go into the SAME buffers as the previous trial of these shapes, so a
    # kernel caching its result by input pointer returns stale data and fails.
    inputs = bufs.setdefault(tuple(in_shapes), fresh)
    if inputs is not fresh:
        for x, f in zip(inputs, fresh):
            x.copy_(f)
    del fresh
    errs["shapes"].append([list(s) for s in in_shapes])
    where = f"seed {seed} ({dist}), input shapes {[list(s) for s in in_shapes]}"
    _trial(task, kernel, reference, policy, device, inputs, out_shapes, where, errs)


def _own_trial(task, kernel, reference, policy, device, errs) -> None:
    """One more trial on the model's own inputs and weights, when the task has them."""
    own = example_inputs(task, device)
    if own is not None:
        errs["shapes"].append([list(s.shape) for s in task.inputs])
        _trial(task, kernel, reference, policy, device, own, [s.shape for s in task.outputs],
               "the model's own inputs and weights", errs)


# ---------------------------------------------------------------------------------- range verdicts

@dataclass
class BucketVerdict:
    """How a kernel did in one bucket. sizes: the leading dim's sizes verified in it. reason: "ok",
    the first failure's evaluation.REASONS entry, or "untested" (no size of the bucket could run:
    over the byte cap, or verification stopped before it)."""
    bucket: Bucket
    sizes: list[int]
    ok: bool
    reason: str = "ok"
    detail: str = ""


@dataclass
class RangeVerdict:
    """verify_range's answer. ok: the kernel is kept for at least one bucket (`kept`); reason and
    detail say why not otherwise ("crash": the CUDA context is dead, as for verify). skipped:
    range_shapes' sizes left out and why. errs: as verify's, over every trial run."""
    ok: bool
    reason: str
    detail: str
    buckets: list[BucketVerdict]
    skipped: list[str]
    errs: dict

    @property
    def kept(self) -> list[Bucket]:
        return [v.bucket for v in self.buckets if v.ok]

    @property
    def wrong(self) -> list[BucketVerdict]:
        return [v for v in self.buckets if not v.ok]


def verify_range(task: Task, kernel, reference, policy, device="cuda", seeds=(0, 1, 2),
                 other_sizes: bool = True) -> RangeVerdict:
    """The protocol over a task's declared range, judged per bucket (buckets_for).

    First every seed at the example shape (and the model's own inputs): a kernel wrong there is
    rejected outright, in every bucket. Then one trial per other size of range_shapes, smallest
    first: a bucket is kept when every size verified in it passed, and not when one failed or none
    ran. A crash stops verification (nothing more may launch in this process) and rejects the
    kernel in every bucket: the ones after it went unverified, and a kernel that kills the context
    at a size inside the range is one host-side size check away from killing the model. A task
    without ranges gets verify's verdict and no buckets.

        >>> v = verify_range(task, kernel, reference, make("fp32"), device="cpu")
        >>> v.ok, [str(b) for b in v.kept], [(w.sizes, w.reason) for w in v.wrong]
        (True, ['in0 dim 0 in [2, 8]', 'in0 dim 0 in [9, 64]'], [([1], 'mismatch')])

    other_sizes=False stops after the example's trials: the verdict there, no bucket kept (what a
    search times candidates on before it verifies the fastest over the range, evaluation.py).
    """
    if leading_dim(task) is None:
        ok, reason, detail, errs = verify(task, kernel, reference, policy, device, seeds)
        return RangeVerdict(ok, reason, detail, [], [], errs)
    rs = range_shapes(task)
    buckets = buckets_for(task)
    errs: dict = {"shapes": []}
    bufs: dict[tuple, list[torch.Tensor]] = {}

    def at_example() -> None:
        for i, seed in enumerate(seeds):
            _seeded_trial(task, kernel, reference, policy, device, rs.sets[0], seed,
                          DISTRIBUTIONS[i % len(DISTRIBUTIONS)], errs, bufs)
        _own_trial(task, kernel, reference, policy, device, errs)
    failed = _failure(at_example)
    if failed:
        why = f"wrong at the example size {rs.sizes[0]}: {failed.detail}"
        return RangeVerdict(False, failed.reason, why,
                            [BucketVerdict(b, [], False, failed.reason, why) for b in buckets], rs.skipped, errs)
    if not other_sizes:
        return RangeVerdict(True, "ok", "", [], rs.skipped, errs)
    results: dict[int, Failure | None] = {rs.sizes[0]: None}
    for j, (size, shapes) in enumerate(zip(rs.sizes[1:], rs.sets[1:])):
        dist = DISTRIBUTIONS[(j + 2) % len(DISTRIBUTIONS)]
        results[size] = _failure(lambda: _seeded_trial(task, kernel, reference, policy, device, shapes,
                                                       1000 + j, dist, errs, bufs))
        if results[size] and results[size].reason == "crash":   # rejected outright, as below
            why = f"crashed at size {size}: {results[size].detail}"
            return RangeVerdict(False, "crash", why, [BucketVerdict(b, [], False, "crash", why) for b in buckets],
                                rs.skipped, errs)
    verdicts = [_bucket_verdict(b, results) for b in buckets]
    if any(v.ok for v in verdicts):
        return RangeVerdict(True, "ok", "", verdicts, rs.skipped, errs)
    worst = next((v for v in verdicts if v.reason != "untested"), verdicts[0])
    return RangeVerdict(False, worst.reason, f"kept in no bucket; {worst.bucket}: {worst.detail}",
                        verdicts, rs.skipped, errs)


def _bucket_verdict(bucket: Bucket, results: dict[int, Failure | None]) -> BucketVerdict:
    """The bucket's verdict from the sizes verified in it (results: size -> its Failure or None)."""
    sizes = sorted(n for n in results if bucket.holds(n))
    bad = next(((n, results[n]) for n in sizes if results[n] is not None), None)
    if bad:
        return BucketVerdict(bucket, sizes, False, bad[1].reason, f"size {bad[0]}: {bad[1].detail}")
    if not sizes:
        return BucketVerdict(bucket, sizes, False, "untested", "no size of this bucket was verified")
    return BucketVerdict(bucket, sizes, True)


def _trial(task, kernel, reference, policy, device, inputs, out_shapes, where, errs) -> None:
    """candidate -> reference -> candidate on one input set, then every check."""
    clones = [x.clone() for x in inputs]
    first = _fresh_outputs(task.outputs, out_shapes, 0, device)
    _call(kernel, inputs, first, device, f"{where}, call before the reference")
    _check_inputs(inputs, clones, f"{where}, call before the reference")
    ref, ref64, own = reference_outputs(reference, clones, policy)
    if len(ref) != len(task.outputs):
        raise Failure("shape_mismatch", f"task declares {len(task.outputs)} outputs, reference returns {len(ref)}")
    second = _fresh_outputs(task.outputs, out_shapes, 1, device)
    _call(kernel, inputs, second, device, f"{where}, call after the reference")
    _check_inputs(inputs, clones, f"{where}, call after the reference")
    first, second = (task_outputs(o, task.outputs, out_shapes) for o in (first, second))
    for k, r in enumerate(ref):
        _check_outputs(k, first[k], first[k], second[k], r, policy, f"{where}, first call", errs, ref64, own)
        _check_outputs(k, second[k], first[k], second[k], r, policy, f"{where}, second call", errs, ref64, own)
        if not bitwise_equal(first[k], second[k]):
            raise Failure("nondeterministic", f"{where}: output {k} differs bitwise between two calls "
                                               "on identical inputs")
