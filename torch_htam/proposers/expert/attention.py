"""Attention regions: one flash-attention kernel (attention.cuh) for SDPA and hand-written attention.

Two region shapes reach it, both read as O = softmax(score(q k^T)) v with a score pipeline:
  - aten.scaled_dot_product_attention (q, k, v, attn_mask bool / additive, is_causal, scale,
    enable_gqa; dropout_p must be 0): steps [* scale, mask]; a row every key of which is masked
    gives 0, as torch's math path does;
  - a hand-written chain found by attn_pattern (q @ k^T, * / c, masked_fill, where, + mask,
    softmax, eval dropout, @ v): its steps as written; a fully masked row gives NaN, as softmax
    over all -inf does in torch.
Views on the way in (split, view, transpose, select, expand of q, k, v and masks) and on the way
out (transpose + reshape to [B, L, H * D]) are traced at match time with index tensors (_bind):
each operand becomes 4 strided dims (batch, head, row, col) of a task tensor, so the kernel reads
and writes in place, without copies. Anything else in the region is Unsupported.

Kernel: bf16 / fp16 on mma.sync tensor cores, fp32 accumulation; fp32 inputs on TF32 tensor cores
where the policy allows TF32 matmuls (params "tf32"), else with plain FMAs (fp32's 1e-4 under any
policy). Head dims (q/k's E and v's Ev) up to 256 (padded
to 16 on chip; 16-byte loads where they are multiples of 8 and rows aligned); any L and S, batch,
heads.

    >>> am = match(task.graph, policy); src = render(am, defaults(am))
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import torch
import torch.fx as fx

from torch_htam import attn_pattern
from torch_htam.attn_pattern import Mask, Step
from torch_htam.ops import FREE
from torch_htam.proposers.expert.cuda import DT, PRELUDE, c_float, cuh
from torch_htam.proposers.expert.ir import Unsupported, dtype_of, shape_of
from torch_htam.proposers.expert.strategies import TaskFacts
from torch_htam.proposers.expert.target import Target

aten = torch.ops.aten
SDPA = aten.scaled_dot_product_attention.default
FLASH = cuh("attention.cuh")
MAX_HEAD_DIM = 256
SMEM_LIMIT = 227 * 1024
LOG2E = 1.4426950408889634
MASK_DTYPES = {torch.bool: ("bool", "HTAM_BOOL"), torch.float32: ("float32", "HTAM_FLOAT32"),
               torch.bfloat16: ("bfloat16", "HTAM_BFLOAT16"), torch.float16: ("float16", "HTAM_FLOAT16")}


@dataclass(frozen=True)
class Bind:
    """How a kernel operand's 4 dims (batch, head, row, col) read task tensor `index` (an input,
    or output 0 when out): attention.cuh's fa::Bind. mode 0: the tensor itself; 1: strided view
    (stride j = sum_i coef[j][i] * strides[i]); 2: a view of the contiguous tensor (strides fst).
    grow (mode 1): per dim j, the tensor dim i whose size it takes at run time (-1: size[j] as
    traced), where the views pass dim i through whole and alone (_grows): a ranged task's batch or
    sequence then serves every size of its range, not only the example's."""
    index: int
    mode: int = 0
    src: tuple[int, ...] = ()
    coef: tuple[tuple[int, ...], ...] = ()
    base: tuple[int, ...] = ()
    fst: tuple[int, ...] = (0, 0, 0, 0)
    foff: int = 0
    size: tuple[int, ...] = (1, 1, 1, 1)
    grow: tuple[int, ...] = (-1, -1, -1, -1)

    def cxx(self) -> str:
        pad = lambda xs, n=8: "{" + ", ".join(str(int(x)) for x in (list(xs) + [0] * n)[:n]) + "}"  # noqa: E731
        coef = "{" + ", ".join(pad(c) for c in (list(self.coef) + [()] * 4)[:4]) + "}"
        return (f"{{{self.mode}, {len(self.src)}, {pad(self.src)}, {coef}, {pad(self.base)}, "
                f"{pad(self.fst, 4)}, {self.foff}, {pad(self.size, 4)}, {{{', '.join(map(str, self.grow))}}}}}")


@dataclass
class MaskIn:
    """A mask tensor the score pipeline reads (kernel slot p.m[slot])."""
    bind: Bind
    dtype: str                   # "bool" | a float dtype name
    code: str                    # HtamDtype


@dataclass
class AttnMatch:
    dtype: str                   # q, k, v and output dtype
    head_dim: int                # E
    v_dim: int                   # Ev
    q: Bind
    k: Bind
    v: Bind
    o: Bind
    steps: list[Step]            # on the scores, in natural units, after q . k
    masks: list[MaskIn]          # in the order steps first read them
    mask_of: dict                # id(Mask.node) -> slot
    causal: bool
    gqa: bool
    zero_empty: bool             # SDPA: a fully masked row gives 0; hand-written softmax: NaN
    n_inputs: int
    sizes: tuple[int, int, int, int]   # (B, H, L, S) at capture
    facts: TaskFacts = None
    nodes: list = field(default_factory=list, repr=False)


# ---- match -----------------------------------------------------------------------------------

def match(gm, policy) -> AttnMatch:
    """An SDPA or hand-written attention region (with views around it); raises Unsupported."""
    from torch_htam.partition import category, op_name
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    ph = [n for n in gm.graph.nodes if n.op == "placeholder"]
    sdpa = [n for n in nodes if n.target is SDPA]
    if len(sdpa) > 1:
        raise Unsupported(f"{len(sdpa)} attention ops in one region (need one)")
    if sdpa:
        node = sdpa[0]
        q, k, v, steps, causal, gqa, own = _sdpa(node)
        result, zero_empty = node, True
    else:
        pats = attn_pattern.find(list(gm.graph.nodes))
        if len(pats) != 1:
            raise Unsupported("no scaled_dot_product_attention and no hand-written attention "
                              "(q @ k^T, scale, mask, softmax, @ v) in the region")
        pat = pats[0]
        q, k, v, steps, causal, gqa = pat.a, pat.b, pat.v, pat.steps, False, False
        own, result, zero_empty = set(pat.nodes) | set(pat.through), pat.pv, False
    dt = dtype_of(result)
    for x in (q, k, v):
        if dtype_of(x) != dt:
            raise Unsupported("attention with mixed dtypes of q, k, v")
    E, S, Ev = shape_of(q)[-1], shape_of(v)[-2], shape_of(v)[-1]
    for name, d in (("q/k", E), ("v", Ev)):
        if d > MAX_HEAD_DIM:
            raise Unsupported(f"attention head dim {d} ({name}): the kernel takes head dims up to "
                              f"{MAX_HEAD_DIM} (its O accumulators and tiles live on chip)")
    used: set = set(own)
    qb = _operand(q, ph, used, "q")
    kb = _operand(k, ph, used, "k", transposed=not sdpa)
    vb = _operand(v, ph, used, "v")
    ob = _output(gm, result, used)
    masks, mask_of = [], {}
    for st in steps:
        if st.mask is not None and id(st.mask.node) not in mask_of:
            mb = _operand(st.mask.node, ph, used, "mask", mask=True)
            val = st.mask.node.meta["val"]
            if val.dtype not in MASK_DTYPES:
                raise Unsupported(f"attention mask of dtype {val.dtype}")
            if st.mask.cond is not None and st.mask.cond[1] != float(torch.tensor(st.mask.cond[1], dtype=val.dtype)):
                raise Unsupported("mask compared with a constant its dtype cannot hold")
            mask_of[id(st.mask.node)] = len(masks)
            masks.append(MaskIn(mb, *MASK_DTYPES[val.dtype]))
    if len(masks) > 2:
        raise Unsupported(f"{len(masks)} masks on the scores (the kernel reads up to 2)")
    extra = [n for n in nodes if n not in used and category(n) is not None]
    if extra:
        raise Unsupported("ops besides the attention and views in an attention region: "
                          + ", ".join(sorted({str(op_name(n)) for n in extra})))
    # torch rounds a fill value to the scores' dtype (bf16 -1e9 is not -1e9)
    sdt = meta_dtype(result)
    steps = [Step(s.op, float(torch.tensor(s.value, dtype=sdt)) if s.op == "fill" else s.value, s.mask)
             for s in steps]
    qshape = shape_of(q)
    B = math.prod(qshape[:-3]) if len(qshape) > 3 else 1
    H = qshape[-3] if len(qshape) > 2 else 1
    am = AttnMatch(dt, E, Ev, qb, kb, vb, ob, steps, masks, mask_of, causal, gqa, zero_empty,
                   len(ph), (B, H, qshape[-2], S), nodes=nodes)
    low = dt != "float32"
    am.facts = TaskFacts("attention", S, 16 // DT[dt][2], has_softmax_pair=True,
                         has_transcendental=True, low_precision=low,
                         allow_tf32=bool(policy and policy.allow_tf32), fp32=not low,
                         cudnn_attention=cudnn_why_not(am) is None and _cudnn_library())
    return am


def meta_dtype(n: fx.Node) -> torch.dtype:
    return n.meta["val"].dtype


def _sdpa(node: fx.Node):
    """(q, k, v, steps, causal, gqa, own nodes) of an SDPA call."""
    args, kw = list(node.args), dict(node.kwargs)
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")
    for i, name in enumerate(names):
        if i < len(args):
            kw[name] = args[i]
    q, k, v = kw["query"], kw["key"], kw["value"]
    mask, causal = kw.get("attn_mask"), bool(kw.get("is_causal", False))
    if kw.get("dropout_p", 0.0):
        raise Unsupported("attention with dropout_p > 0 (random dropout inside SDPA)")
    if mask is not None and causal:
        raise Unsupported("SDPA with both attn_mask and is_causal")
    scale = kw.get("scale")
    scale = 1.0 / math.sqrt(shape_of(q)[-1]) if scale is None else float(scale)
    steps = [Step("mul", scale)]
    if isinstance(mask, fx.Node):
        if meta_dtype(mask) == torch.bool:      # keep where true: -inf where mask == 0
            steps.append(Step("fill", float("-inf"), Mask(mask, ("eq", 0.0))))
        else:
            steps.append(Step("bias", mask=Mask(mask)))
    return q, k, v, steps, causal, bool(kw.get("enable_gqa", False)), {node}


def _chain(x: fx.Node, ph: list, what: str) -> tuple[int, list[fx.Node]]:
    """The placeholder x reads and the free ops (views, no-ops) from it to x, in order."""
    from torch_htam.partition import category
    chain = []
    while x not in ph:
        if x.op != "call_function" or category(x) not in FREE or not x.args or not isinstance(x.args[0], fx.Node):
            raise Unsupported(f"attention {what} is computed inside the region ({x.target}); only "
                              "views of region inputs are read")
        if any(isinstance(a, fx.Node) for a in list(x.args[1:]) + list(x.kwargs.values())):
            raise Unsupported(f"attention {what} view {x.target} takes another tensor")
        chain.append(x)
        x = x.args[0]
    return ph.index(x), chain[::-1]


def _freeze(x):
    return tuple(_freeze(v) for v in x) if isinstance(x, (list, tuple)) else x


def _key(chain: list[fx.Node]) -> tuple:
    """The chain as data: (target, constant args after the first, kwargs) per op (hashable, so a
    traced binding is computed once per chain and shape: the trace moves index tensors of the
    operand's size, ~1 s at [8, 12, 512, 64])."""
    return tuple((n.target, _freeze(n.args[1:]), _freeze(sorted(n.kwargs.items()))) for n in chain)


# NOTE: a region's views are replayed as reshapes: the export drops a no-op `.contiguous()` (e.g.
# gpt's y.transpose(1, 2).contiguous().view(B, T, C)), leaving a view that is illegal on the
# strided index tensor traced here; on values, which is all the trace reads, view == reshape.
_AS_RESHAPE = {torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default}


def _run(key: tuple, x):
    for target, args, kwargs in key:
        target = torch.ops.aten.reshape.default if target in _AS_RESHAPE else target
        x = target(x, *args, **dict(kwargs))
    return x


def _kernel_dims(nd: int, what: str) -> list:
    if nd < 2 or nd > 4:
        raise Unsupported(f"attention {what} of rank {nd} (the kernel takes 2 to 4 dims)")
    return [None] * (4 - nd) + list(range(nd))


def _affine(idx: torch.Tensor, shape: tuple[int, ...]):
    """idx: (n, *shape) integer coordinates. (base, per-dim deltas) when idx is affine in the
    position (idx[:, p] = base + sum_j p_j delta_j), else None."""
    nd = len(shape)
    base = idx[(slice(None),) + (0,) * nd]
    deltas, pred = [], base.view(-1, *[1] * nd).clone()
    for j, s in enumerate(shape):
        if s > 1:
            d = idx[(slice(None),) + tuple(1 if k == j else 0 for k in range(nd))] - base
        else:
            d = torch.zeros_like(base)
        deltas.append(d)
        view = [1] * nd
        view[j] = s
        pred = pred + d.view(-1, *[1] * nd) * torch.arange(s).view(view)
    return (base, deltas) if torch.equal(pred.expand_as(idx), idx) else None


def _operand(x: fx.Node, ph: list, used: set, what: str, transposed: bool = False,
             mask: bool = False) -> Bind:
    """The Bind of q / k / v / a mask: x seen from its placeholder through views. transposed: x is
    k^T ([..., E, S]) and the kernel wants k. Marks the chain's nodes used."""
    index, chain = _chain(x, ph, what)
    used.update(chain)
    shape = shape_of(x)
    dims = _kernel_dims(len(shape), what)
    if transposed:
        dims[2], dims[3] = dims[3], dims[2]
    if not chain and not transposed:
        return Bind(index)
    return _traced_input(_key(chain), shape_of(ph[index]), shape, tuple(dims), index, what)


@functools.lru_cache(maxsize=256)
def _traced_input(key: tuple, src: tuple, shape: tuple, dims: tuple, index: int, what: str) -> Bind:
    n = math.prod(src)
    if n == 0:
        raise Unsupported(f"empty attention {what}")
    flat = _run(key, torch.arange(n).view(src))
    multi = torch.stack(torch.unravel_index(flat, src)) if src else flat.view(1, *flat.shape)
    size = tuple(1 if d is None else shape[d] for d in dims)
    got = _affine(multi, shape)
    if got is not None:
        base, deltas = got
        coef = tuple(tuple([0] * len(src)) if d is None else tuple(int(c) for c in deltas[d]) for d in dims)
        base = tuple(int(b) for b in base)
        return Bind(index, 1, src, coef, base, size=size, grow=_grows(src, coef, base, size))
    got = _affine(flat.reshape(1, *shape), shape)
    if got is None:
        raise Unsupported(f"attention {what}: its views are not a strided view of a region input")
    base, deltas = got
    fst = tuple(0 if d is None else int(deltas[d][0]) for d in dims)
    return Bind(index, 2, src, fst=fst, foff=int(base[0]), size=size)


def _grows(src: tuple, coef: tuple, base: tuple, size: tuple) -> tuple[int, ...]:
    """Bind.grow of a strided view: dim j takes tensor dim i's run-time size where the views pass
    i through whole and alone (one step along j is one step along i, no other dim moves along i,
    j starts at 0 and spans all of it). E.g. q = qkv[..., :768].view(B, L, 12, 64).transpose(1, 2)
    over a (B, L, 2304) tensor: dims 0 and 1 of the tensor grow dims 0 (batch) and 2 (rows); its
    dim 2, split into heads and columns, grows none."""
    out = [-1] * 4
    for i, n in enumerate(src):
        along = [j for j in range(4) if coef[j][i] != 0]
        if len(along) == 1 and coef[along[0]][i] == 1 and base[i] == 0 and size[along[0]] == n and n > 1:
            out[along[0]] = i
    return tuple(out)


def _output(gm, result: fx.Node, used: set) -> Bind:
    """The Bind of the output: the attention result [..., L, Ev] seen through the views that lead
    to the region's one output (traced forward, then inverted)."""
    from torch_htam.partition import category
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    outs = list(out_node.args[0])
    if len(outs) != 1:
        raise Unsupported(f"attention region with {len(outs)} outputs (the kernel writes one)")
    chain, x = [], result
    while x is not outs[0]:
        users = list(x.users)
        if len(users) != 1 or category(users[0]) not in FREE or users[0].args[0] is not x or any(
                isinstance(a, fx.Node) for a in list(users[0].args[1:]) + list(users[0].kwargs.values())):
            raise Unsupported("the attention result is read by something other than views to the output")
        x = users[0]
        chain.append(x)
    used.update(chain)
    rshape, oshape = shape_of(result), shape_of(outs[0])
    dims = _kernel_dims(len(rshape), "result")
    if not chain:
        return Bind(0)
    return _traced_output(_key(chain), rshape, oshape, tuple(dims))


@functools.lru_cache(maxsize=256)
def _traced_output(key: tuple, rshape: tuple, oshape: tuple, dims: tuple) -> Bind:
    n = math.prod(rshape)
    flat = _run(key, torch.arange(n).view(rshape)).reshape(-1)
    if flat.numel() != n or not torch.equal(torch.sort(flat).values, torch.arange(n)):
        raise Unsupported("the views after attention are not a permutation of its result")
    pos = torch.empty(n, dtype=torch.long)
    pos[flat] = torch.arange(n)                        # result element -> flat output position
    multi = torch.stack(torch.unravel_index(pos, oshape)).view(len(oshape), *rshape)
    size = tuple(1 if d is None else rshape[d] for d in dims)
    got = _affine(multi, rshape)
    if got is not None:
        base, deltas = got
        coef = tuple(tuple([0] * len(oshape)) if d is None else tuple(int(c) for c in deltas[d]) for d in dims)
        base = tuple(int(b) for b in base)
        return Bind(0, 1, oshape, coef, base, size=size, grow=_grows(oshape, coef, base, size))
    got = _affine(pos.view(1, *rshape), rshape)
    if got is None:
        raise Unsupported("the views after attention are not strided")
    base, deltas = got
    fst = tuple(0 if d is None else int(deltas[d][0]) for d in dims)
    return Bind(0, 2, oshape, fst=fst, foff=int(base[0]), size=size)


# ---- render ----------------------------------------------------------------------------------

def _pad16(d: int) -> int:
    return -(-d // 16) * 16


def _tf32(am: AttnMatch, params: dict) -> bool:
    """fp32 on TF32 tensor cores (fa_mma's Tf32 tag): asked for, and allowed by the policy."""
    return am.dtype == "float32" and bool(params.get("tf32")) and am.facts.allow_tf32


def smem_bytes(am: AttnMatch, params: dict) -> int:
    """Dynamic shared memory of the kernel params choose: fa_fma's fma_smem (fp32 off TF32), else
    fa_mma's mma_smem (rows padded by 16 bytes)."""
    bm, bn, dp, dvp = params["bm"], params["bn"], _pad16(am.head_dim), _pad16(am.v_dim)
    if am.dtype == "float32" and not _tf32(am, params):
        return 4 * (bm * (dp + 1) + bn * (dp + 1) + bn * dvp + bm * bn)
    esz = DT[am.dtype][2]
    pad = 16 // esz
    return esz * (bm * (dp + pad) + params["stages"] * bn * (dp + pad + dvp + pad))


def _score_fn(am: AttnMatch) -> str:
    """SC::at: the scores' steps in C++, in the units SC::ex takes (log2 units for half types:
    leading constant factors and log2(e) fold into one multiply)."""
    low = am.dtype != "float32"
    unit = LOG2E if low else 1.0
    lines, k, i = [], unit, 0
    steps = list(am.steps)
    if low:                                         # fold the leading constant scales
        while i < len(steps) and steps[i].op in ("mul", "div"):
            k = k * steps[i].value if steps[i].op == "mul" else k / steps[i].value
            i += 1
        lines.append(f"x = x * {c_float(k)};")
    for st in steps[i:]:
        if st.op == "mul":
            lines.append(f"x = x * {c_float(st.value)};")
        elif st.op == "div":
            lines.append(f"x = x / {c_float(st.value)};" if not low else f"x = x * {c_float(1.0 / st.value)};")
        elif st.op == "fill":
            cond = _mask_expr(am, st.mask)
            lines.append(f"if ({cond}) x = {c_float(st.value * unit) if math.isfinite(st.value) else c_float(st.value)};")
        elif st.op == "bias":
            m = _mask_value(am, st.mask)
            lines.append(f"x = fmaf({m}, {c_float(unit)}, x);" if low else f"x = x + {m};")
    body = "\n    ".join(lines)
    ex = "exp2f(x)" if low else "expf(x)"
    inv = "l > 0.f ? 1.f / l : 0.f" if am.zero_empty else "1.f / l"
    return f"""struct SC {{
  static constexpr bool CAUSAL = {str(am.causal).lower()};
  static __device__ __forceinline__ float ex(float x) {{ return {ex}; }}
  static __device__ __forceinline__ float inv(float l) {{ return {inv}; }}
  static __device__ __forceinline__ float at(const fa::Params& p, float x, int64_t b, int64_t h, int64_t i, int64_t j) {{
    {body}
    return x;
  }}
}};"""


def _mask_value(am: AttnMatch, m: Mask) -> str:
    slot = am.mask_of[id(m.node)]
    mi = am.masks[slot]
    off = f"b * p.ms[{slot}][0] + h * p.ms[{slot}][1] + i * p.ms[{slot}][2] + j * p.ms[{slot}][3]"
    if mi.dtype == "bool":
        return f"(float)(static_cast<const unsigned char*>(p.m[{slot}])[{off}] != 0)"
    t = DT[mi.dtype][0]
    return f"{t}::to_f(__ldg(static_cast<const {t}::raw*>(p.m[{slot}]) + {off}))"


def _mask_expr(am: AttnMatch, m: Mask) -> str:
    v = _mask_value(am, m)
    cond = f"({v} {attn_pattern.COMPARE[m.cond[0]]} {c_float(m.cond[1])})" if m.cond else f"({v} != 0.f)"
    return f"!{cond}" if m.negate else cond


def _operand_cxx(b: Bind, dtype: str, code: str) -> str:
    """b as an fa::Operand initializer: the tensor, its HtamDtype and bytes per element, the binding."""
    esz = 1 if dtype == "bool" else DT[dtype][2]
    return f"{{{b.index}, {code}, {esz}, {b.cxx()}}}"


def _region(am: AttnMatch) -> str:
    """struct Region: fa::run's per-region constants (the tensors q, k, v, o and the masks read)."""
    dt = DT[am.dtype]
    ops = [f"  static constexpr fa::Operand {n} = {_operand_cxx(b, am.dtype, dt[1])};"
           for n, b in (("q", am.q), ("k", am.k), ("v", am.v), ("o", am.o))]
    masks = ", ".join(_operand_cxx(m.bind, m.dtype, m.code) for m in am.masks)
    return "\n".join([
        "struct Region {",
        f"  static constexpr int N_IN = {am.n_inputs}, D = {am.head_dim}, DV = {am.v_dim}, NMASK = {len(am.masks)};",
        f"  static constexpr bool GQA = {str(am.gqa).lower()};",
        *ops,
        f"  static constexpr fa::Operand m[2] = {{{masks}}};",
        "};"])


# ---- cuDNN's fused attention: the htam_cudnn_sdpa library (csrc/cudnn_sdpa.cu) ---------------------
CUDNN_LIBRARY = "cudnn_sdpa"
CUDNN_MAX_HEAD_DIM = 128


def cudnn_why_not(am: AttnMatch) -> str | None:
    """Why cuDNN's fused attention cannot run the region (None: it can): half types, one scale on
    the scores (no mask but causal), q/k and v of one head dim, at most CUDNN_MAX_HEAD_DIM, a
    multiple of 8."""
    if am.dtype not in ("bfloat16", "float16"):
        return f"cuDNN's fused attention takes bf16 / fp16, not {am.dtype}"
    if am.masks or any(st.op not in ("mul", "div") for st in am.steps):
        return "cuDNN's fused attention here takes a scale and a causal mask only"
    if am.head_dim != am.v_dim or am.head_dim > CUDNN_MAX_HEAD_DIM or am.head_dim % 8:
        return f"head dims {am.head_dim} / {am.v_dim}: cuDNN's fused attention here needs one, <= 128, of 8s"
    return None


def cudnn_scale(am: AttnMatch) -> float:
    """The scores' one scale (cudnn_why_not: only mul / div steps)."""
    k = 1.0
    for st in am.steps:
        k = k * st.value if st.op == "mul" else k / st.value
    return k


def _cudnn_library() -> bool:
    """Whether the library is built for this machine's arch. NOTE: on a GPU machine, asking starts
    its build in the background (minutes: build.library): the expert proposes cuDNN's attention
    once it is there, and the search does not wait for it."""
    from torch_htam import build, gpu
    info = gpu.detect()
    if info is None:
        return build.library_ready(CUDNN_LIBRARY, build.default_arch())
    if not build.library_ready(CUDNN_LIBRARY, info.arch) and build.find_cudnn_frontend() is not None:
        build.library_in_background(CUDNN_LIBRARY, info.arch)
    return build.library_ready(CUDNN_LIBRARY, info.arch)


def render_cudnn(am: AttnMatch) -> str:
    """The region's source on cuDNN's fused attention: the Region tensors bound as for the flash
    kernel (fa::operands), then one htam_cudnn_sdpa call with the scale and causal mask."""
    why = cudnn_why_not(am)
    if why is not None:
        raise Unsupported(why)
    return "\n".join([
        f"// torch_htam expert: cuDNN fused attention {'causal ' if am.causal else ''}dtype={am.dtype} "
        f"E={am.head_dim}",
        "#define HTAM_CUDNN_SDPA", PRELUDE, '#include "cudnn_sdpa.h"', FLASH, _region(am), "",
        "HTAM_ENTRY htam_run(const HtamTensor* in, int n_in, HtamTensor* out, int n_out, cudaStream_t stream) {",
        f"  return fa::run_cudnn<Region>(in, n_in, out, n_out, stream, {c_float(cudnn_scale(am))}, "
        f"{str(am.causal).lower()});",
        "}", ""])


def render(am: AttnMatch, params: dict) -> str:
    """The region's source: the score function SC and the Region tensors around attention.cuh's
    kernels, and an htam_run that instantiates fa::run at the tile shape params choose; with
    backend "cudnn", cuDNN's fused attention (render_cudnn)."""
    if params.get("backend") == "cudnn":
        return render_cudnn(am)
    bm, bn, stages = params["bm"], params["bn"], params.get("stages", 2)
    smem = smem_bytes(am, params)
    if smem > SMEM_LIMIT:
        raise Unsupported(f"attention tiles {bm}x{bn} need {smem} bytes of shared memory")
    tag = f"fa::Tf32<{str(bool(params.get('split'))).lower()}>" if _tf32(am, params) else DT[am.dtype][0]
    run = f"fa::run<{tag}, SC, Region, {bm}, {bn}, {_pad16(am.head_dim)}, {_pad16(am.v_dim)}, {stages}>"
    return "\n".join([
        f"// torch_htam expert: flash attention {'causal ' if am.causal else ''}dtype={am.dtype} "
        f"E={am.head_dim} Ev={am.v_dim} params={sorted(params.items())}",
        PRELUDE, FLASH, _score_fn(am), _region(am), "",
        "HTAM_ENTRY htam_run(const HtamTensor* in, int n_in, HtamTensor* out, int n_out, cudaStream_t stream) {",
        f"  return {run}(in, n_in, out, n_out, stream);",
        "}", ""])


# ---- the target --------------------------------------------------------------------------------

def defaults(am: AttnMatch) -> dict:
    big = max(am.head_dim, am.v_dim) > 128
    if am.dtype == "float32" and am.facts.allow_tf32:
        return {"bm": 64, "bn": 32 if big else 64, "stages": 2, "tf32": True, "split": True}
    if am.dtype == "float32":
        return {"bm": 32 if big else 64, "bn": 32 if big else 64, "stages": 1}
    return {"bm": 64 if big else 128, "bn": 32 if big else 64, "stages": 2}


def valid_for(am: AttnMatch, params: dict) -> bool:
    return smem_bytes(am, params) <= SMEM_LIMIT


def grid(am: AttnMatch, base: dict) -> list[dict]:
    """Block rows x key tile x pipeline depth (_tiles); cuDNN's fused attention where it can run
    the region and its library is built."""
    cudnn = [canonical(am, dict(base, backend="cudnn"))] if am.facts.cudnn_attention else []
    return cudnn + _tiles(am, base)


def _tiles(am: AttnMatch, base: dict) -> list[dict]:
    """bf16 / fp16: block rows x key tile x stages; fp32: the TF32 kernel's tiles (where allowed:
    3xTF32 scores first: Tf32's SPLIT), then the FMA kernel's (no pipeline)."""
    half = [dict(base, bm=bm, bn=bn, stages=s) for bm in (64, 128) for bn in (32, 64, 128) for s in (2, 3)]
    off = {"tf32": False, "split": False} if am.facts.allow_tf32 else {}
    fma = [dict(base, bm=bm, bn=bn, stages=1, **off) for bm in (32, 64, 128) for bn in (32, 64)]
    tf32 = [{**base, "bm": bm, "bn": bn, "stages": s, "tf32": True, "split": split} for split in (True, False)
            for bm in (64, 128) for bn in (32, 64) for s in (2, 3)] if am.facts.allow_tf32 else []
    out = half if am.dtype != "float32" else tf32 + fma
    return [p for p in out if p != base and valid_for(am, p)]


def tags(am: AttnMatch, params: dict) -> list[str]:
    if params.get("backend") == "cudnn":
        return ["cudnn_fused_attention"]
    cores = ["bf16_tensor_cores"] if not am.facts.fp32 else ["tf32_tensor_cores"] if _tf32(am, params) else []
    return ["single_kernel_launch", "online_softmax"] + cores


def canonical(am: AttnMatch, params: dict) -> dict:
    """cuDNN's attention reads none of the flash kernel's tile knobs: they stay at the defaults."""
    return {**defaults(am), "backend": "cudnn"} if params.get("backend") == "cudnn" else params


def retag(am: AttnMatch, params: dict, ids: list[str]) -> list[str]:
    return ids


def _render(am: AttnMatch, params: dict) -> str:
    return render(am, params)


TARGET = Target(kind="attention", match=match, defaults=defaults, tags=tags, retag=retag,
                start_order=("flash_attention_tiling", "async_copy_pipeline"), grid=grid, render=_render,
                canonical=canonical,
                valid=lambda params: params.get("bm", 0) in (32, 64, 128) and params.get("bn", 0) in (32, 64, 128))
