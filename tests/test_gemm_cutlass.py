"""CUTLASS's Hopper GEMM with the activation in its epilogue (csrc/cutlass_gemm.cu, the cutlass_gemm
library) and the candidates that link it (proposers/expert/gemm_cutlass.py): one launch of a bf16
gelu(x @ w^T + bias), GELU with erf (torch's default) or tanh, or of silu(x @ w^T) * up (SwiGLU).

CPU: where the expert offers it (only where the library is built), why it does not apply, the
moves that reach and leave it. Build (`build`): the library for sm_90a and candidates linking it.
GPU (`gpu`): every tile and GELU against eager torch, at the captured and other row counts,
with and without a bias, a weight written in place between calls, a misaligned tensor refused."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_htam import build, paths
from torch_htam.policy import policy_for
from torch_htam.proposers.expert import gemm, gemm_cutlass, strategies
from torch_htam.proposers.expert.proposer import match_task
from torch_htam.task import Task, TensorSpec

EXPERIMENTS = Path(__file__).resolve().parents[1] / "docs" / "experiments" / "cutlass_gemm"
ACTS = {"gelu": nn.GELU(), "gelu_tanh": nn.GELU(approximate="tanh"), "relu": nn.ReLU(), "silu": nn.SiLU(),
        "none": nn.Identity()}


def _apply(act: str, bias: bool, mul: bool, args):
    """The region: act(F.linear(x, w[, b])) [* u] on args (x, w[, b][, u])."""
    x, w, *rest = args
    y = ACTS[act](F.linear(x, w, rest.pop(0) if bias else None))
    return y * rest[0] if mul else y


def _region(act="gelu", bias=True, k=64, n=96, rows=(2, 40), dtype=torch.bfloat16, device="cpu", mul=False):
    """(its inputs, task, match) of a linear [+ bias] + act region, x [*rows, k]; with mul, the
    activation times u [*rows, n] (a SwiGLU MLP's gate times its up projection)."""
    torch.manual_seed(0)
    fc = nn.Linear(k, n, bias=bias).to(device=device, dtype=dtype)
    x = torch.randn(*rows, k, device=device, dtype=dtype)
    args = [x, *[p.detach() for p in fc.parameters()]] + ([torch.randn(*rows, n, device=device, dtype=dtype)] if mul else [])

    class Fn(nn.Module):      # the region as the partition cuts it: weight and bias are inputs
        def forward(self, *xs):
            return _apply(act, bias, mul, xs)
    gm = torch.export.export(Fn(), tuple(args), strict=False).graph_module
    out = _apply(act, bias, mul, args)
    task = Task("linear_act", "gemm", "", [TensorSpec.of(a) for a in args], [TensorSpec.of(out)], "sig", [],
                graph=gm)
    return args, task, match_task(task, policy_for(task)).region


@pytest.fixture
def built(monkeypatch):
    """The library counts as built (the expert asks gemm_cutlass.library_ready)."""
    monkeypatch.setattr(gemm_cutlass, "library_ready", lambda: True)


@pytest.mark.parametrize("act, bias, mul, want", [("gelu", True, False, "gelu_erf"), ("gelu_tanh", True, False, "gelu_tanh"),
                                                   ("gelu", False, False, "gelu_erf"), ("silu", False, True, "silu_mul")])
def test_the_epilogue_is_read_as_an_activation_of_the_biased_product(built, act, bias, mul, want):
    *_, gp = _region(act, bias, mul=mul)
    epi = gemm.cutlass_epilogue(gp)
    assert epi.act == want and (epi.bias is not None) == bias
    assert epi.mul == (2 if mul else None)           # SwiGLU's up projection: the region's input 2
    assert gemm.cutlass_reason(gp) is None and gp.facts.cutlass_tiles == tuple(range(len(gemm_cutlass.TILES)))


def test_it_is_the_default_and_leads_the_grid_once_built(built):
    from compile_check import assert_library_leads
    *_, gp = _region()
    tiles = len(gemm_cutlass.TILES)
    base = assert_library_leads(gemm.TARGET, gp, "cg_tile", tiles)
    assert all("cuBLASLt" in gemm.render(gp, p).splitlines()[0] for p in gemm.grid(gp, base)[tiles:tiles + 2])
    # cuBLASLt's knobs mean nothing on this path; the tile does
    assert gemm.canonical(gp, dict(base, algo=3, lt_epilogue=False)) == gemm.canonical(gp, base)
    assert base["cg_tile"] == 0 and gemm.canonical(gp, dict(base, cg_tile=2)) != gemm.canonical(gp, base)
    assert {"smem_tiling", "bf16_tensor_cores", "fuse_elementwise_chain"} <= set(gemm.tags(gp, base))
    # a first step times cuBLASLt's default beside it
    alt, = gemm.alternates(gp, base)
    assert not gemm.cutlass(gp, alt) and "cuBLASLt" in gemm.render(gp, alt).splitlines()[0]


def test_moves_reach_it_and_leave_it(built):
    *_, gp = _region()
    moves = strategies.moves_for("smem_tiling", gp.facts)
    tiles = len(gemm_cutlass.TILES)    # then the tiles forced on cuBLASLt (test_expert's lt_tile test)
    assert moves[:tiles] == [{"cutlass": True, "cg_tile": t} for t in range(tiles)]
    assert all("lt_tile" in m for m in moves[tiles:])
    on = dict(gemm.defaults(gp), cutlass=True)
    off = gemm.refit(gp, dict(on, **moves[tiles]), moves[tiles])
    assert not gemm.cutlass(gp, off) and off["lt_tile"] == moves[tiles]["lt_tile"]   # a cuBLASLt tile leaves CUTLASS
    base = dict(gemm.defaults(gp), cutlass=False)
    there = gemm.refit(gp, dict(base, **moves[1]), moves[1])
    assert gemm.cutlass(gp, there) and there["cg_tile"] == 1
    back = gemm.refit(gp, dict(there, algo=2), {"algo": 2})
    assert not gemm.cutlass(gp, back)


def test_without_the_library_nothing_changes():
    *_, gp = _region()
    assert gp.facts.cutlass_tiles == ()
    base = gemm.defaults(gp)
    assert "cutlass" not in base and not any(p.get("cutlass") for p in gemm.grid(gp, base))
    assert all("cutlass" not in m for m in strategies.moves_for("smem_tiling", gp.facts))
    assert gemm.TARGET.libraries(gp) == (gemm_cutlass.LIBRARY,)    # what a build would bring


@pytest.mark.parametrize("kw, why", [
    (dict(act="none"), "GELU"),                         # a bias alone: cuBLASLt's epilogue writes it once
    (dict(act="relu"), "GELU"),                         # cuBLASLt's epilogue fuses it
    (dict(act="silu"), "GELU"),
    (dict(act="silu", bias=True, mul=True), "GELU"),    # the library's silu * up takes no bias
    (dict(act="gelu", bias=False, mul=True), "GELU"),
    (dict(dtype=torch.float16), "bf16 only"),
    (dict(k=60), "multiples of 8"),
    (dict(n=100), "multiples of 8"),
])
def test_it_says_why_it_does_not_apply(built, kw, why):
    *_, gp = _region(**kw)
    assert why in gemm.cutlass_reason(gp) and gp.facts.cutlass_tiles == ()
    assert gemm.TARGET.libraries(gp) == ()


def test_silu_times_a_broadcast_vector_is_not_read_as_swiglu(built):
    """silu(x @ w^T) * v with v [N] (a per-column scale, not another GEMM's [..., N] output): the
    library's silu * up reads a whole [M, N] operand, so it is not offered."""
    class Fn(nn.Module):
        def forward(self, x, w, v):
            return F.silu(F.linear(x, w)) * v
    args = [torch.randn(2, 40, 64, dtype=torch.bfloat16), torch.randn(96, 64, dtype=torch.bfloat16),
            torch.randn(96, dtype=torch.bfloat16)]
    gm = torch.export.export(Fn(), tuple(args), strict=False).graph_module
    task = Task("linear_silu_scale", "gemm", "", [TensorSpec.of(a) for a in args], [TensorSpec.of(Fn()(*args))],
                "sig", [], graph=gm)
    gp = match_task(task, policy_for(task)).region
    assert gemm.cutlass_epilogue(gp) is None and "GELU" in gemm.cutlass_reason(gp)


# each of TILES' number in the measured files (ab507f2's library also had 128x256 on 2x1 clusters, as 1)
MEASURED_AS = (0, 2, 3, 4, 5)


def _measured_tiles() -> list[tuple[int, int, list[float]]]:
    """(M, N, us per tile of TILES) under CUDA graphs on an H200: the zoo's GELU MLP shapes as the zoo
    runs them (zoo_shapes.py) and at batch 32 (probe.py); each file's JSON is its last line."""
    out = []
    for name, key in (("zoo_shapes-h200-ab507f2.txt", "t{}_graphed_ms"), ("probe-h200-ab507f2.txt", "tile{}_ms")):
        rows = json.loads((EXPERIMENTS / name).read_text().strip().splitlines()[-1])["rows"]
        out += [(r["m"], r["n"], [r[key.format(t)] * 1e3 for t in MEASURED_AS]) for r in rows]
    return out


def test_the_default_tile_is_the_fastest_of_its_choices_measured():
    """default_tile picks the fastest of DEFAULT_CHOICES at every measured shape; where the wave
    decides, it decides as measured (BERT's [1024 -> 3072]: 128x192, 128 tiles in one wave)."""
    measured = _measured_tiles()
    assert len(measured) == 14
    for m, n, us in measured:
        assert gemm_cutlass.default_tile(m, n) == min(gemm_cutlass.DEFAULT_CHOICES, key=lambda t: us[t]), (m, n, us)
    assert gemm_cutlass.default_tile(1024, 3072) == 2 and gemm_cutlass.TILES[2][:2] == (128, 192)
    assert gemm_cutlass.fill(132 * 128, 128, 0) == 1.0 and gemm_cutlass.fill(128, 64, 0) < 0.01


@pytest.mark.skipif(shutil.which("c++") is None, reason="needs a host C++ compiler")
def test_the_epilogue_gelu_is_torchs_erf_gelu_to_4e6(tmp_path):
    """csrc/gelu_erf.h (the epilogue's GELU), compiled for the host, against torch's exact GELU in
    fp64 from -20 to 20 and at the edges: within 4.0e-6 (its fit's bound), NaN kept, +inf kept,
    and exact enough near 0 that gelu(x) / x stays 0.5 + x / sqrt(2 pi) to 1e-6."""
    xs = torch.cat([torch.linspace(-20, 20, 400_001), torch.tensor([0.0, -0.0, 1e-30, -1e-30, 6.0, -6.0])])
    prog = tmp_path / "gelu.cpp"
    prog.write_text('#include <cstdio>\n#include "gelu_erf.h"\nint main() { float x; '
                    'while (std::fread(&x, 4, 1, stdin) == 1) { float y = htam_gelu_erf(x); std::fwrite(&y, 4, 1, stdout); } }\n')
    exe = tmp_path / "gelu"
    subprocess.run(["c++", "-O2", "-std=c++17", f"-I{build.CSRC}", str(prog), "-o", str(exe)], check=True)

    def run(x: torch.Tensor) -> torch.Tensor:
        out = subprocess.run([str(exe)], input=x.float().numpy().tobytes(), capture_output=True, check=True).stdout
        return torch.frombuffer(bytearray(out), dtype=torch.float32).double()
    ours, exact = run(xs), F.gelu(xs.float().double())
    assert (ours - exact).abs().max() < 4.0e-6
    small = torch.tensor([1e-3, -1e-3, 1e-6])
    assert torch.allclose(run(small) / small.double(), 0.5 + small.double() / (2 * torch.pi) ** 0.5, atol=1e-6)
    edge = run(torch.tensor([float("nan"), float("inf")]))
    assert edge[0].isnan() and edge[1] == float("inf")


# ---- build and GPU ----------------------------------------------------------------------------------

CASES = {"gelu_bias": dict(act="gelu"), "gelu_tanh_bias": dict(act="gelu_tanh"), "gelu": dict(act="gelu", bias=False),
         "gelu_k40": dict(act="gelu", k=40, n=72), "silu_mul": dict(act="silu", bias=False, mul=True),
         "silu_mul_k40": dict(act="silu", bias=False, mul=True, k=40, n=72)}
needs_cutlass = pytest.mark.skipif(paths.nvcc_path() is None or build.find_cutlass() is None,
                                   reason="needs nvcc and CUTLASS's headers (pip install --no-deps nvidia-cutlass)")


@pytest.mark.build
@needs_cutlass
def test_the_library_builds_once_and_candidates_link_it(built, tmp_path, monkeypatch):
    """csrc/cutlass_gemm.cu builds for sm_90a (minutes), once; not for an arch without wgmma; the
    proposed sources of each region, every tile, build against it. In a cache of its own."""
    from compile_check import assert_compiles, assert_library_builds_once
    monkeypatch.setenv("HTAM_CACHE_DIR", str(tmp_path))
    assert_library_builds_once(gemm_cutlass.LIBRARY)
    todo = []
    for name, kw in CASES.items():
        *_, gp = _region(**kw)
        todo += [(f"{name}/{t}", gemm.render(gp, dict(gemm.defaults(gp), cg_tile=t))) for t in gp.facts.cutlass_tiles]
    assert_compiles(todo)


@pytest.mark.gpu
@pytest.mark.parametrize("name", CASES)
def test_each_tile_matches_torch_at_other_row_counts(built, name):
    """Every tile against eager torch at the captured rows, 1 and 300, judged as verification
    judges; then the weight written in place is seen by the next call."""
    from torch_htam.launcher import Kernel
    from torch_htam.verify import within_torch_error
    _, task, gp = _region(device="cuda", **CASES[name])
    policy = policy_for(task)
    params = [dict(gemm.defaults(gp), cg_tile=t) for t in range(len(gemm_cutlass.TILES))]
    results = build.build_many([gemm.render(gp, p) for p in params])
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]

    case = dict(dict(act="gelu", bias=True, mul=False), **CASES[name])
    act, bias, mul = case["act"], case["bias"], case["mul"]

    def check(kernel, xs, what):
        ref = _apply(act, bias, mul, xs)
        ref64 = _apply(act, bias, mul, [x.double() for x in xs])
        out = torch.full_like(ref, float("nan"))
        assert kernel(xs, [out]) == 0, what
        torch.cuda.synchronize()
        assert torch.isfinite(out).all(), what
        assert (torch.allclose(out.float(), ref.float(), atol=policy.atol, rtol=policy.rtol)
                or within_torch_error(out.float(), ref.float(), ref64, policy.atol, policy.rtol)[0]), what

    for rows in ((2, 40), (1,), (3, 100)):
        xs, *_ = _region(device="cuda", rows=rows, **CASES[name])
        for p, res in zip(params, results):
            kernel = Kernel(res.so_path)
            check(kernel, xs, (p["cg_tile"], rows))
            xs[1].mul_(-0.5)          # the weight, in place: same pointer, new values
            check(kernel, xs, (p["cg_tile"], rows, "written in place"))


@pytest.mark.gpu
def test_a_misaligned_tensor_is_refused_not_misread(built):
    """An input whose data starts 2 bytes past a 16-byte boundary: HTAM_ERR_SHAPE (the runtime runs
    the original region), not a wrong answer."""
    from torch_htam.launcher import Kernel
    xs, task, gp = _region(device="cuda")
    res = build.build_many([gemm.render(gp, gemm.defaults(gp))])[0]
    assert res.ok, res.error
    x = xs[0]
    flat = torch.empty(x.numel() + 1, dtype=x.dtype, device="cuda")
    shifted = flat[1:].view(x.shape)
    shifted.copy_(x)
    y = torch.empty(*x.shape[:-1], xs[1].shape[0], dtype=x.dtype, device="cuda")
    assert Kernel(res.so_path)([shifted, *xs[1:]], [y]) == 1000


def test_a_library_built_after_the_first_step_is_proposed_at_the_next(monkeypatch):
    """The first step ran before the library was built (cuBLASLt's path only); once it is, the next
    step proposes the new defaults (CUTLASS's) first, beyond its n, and only until they were tried."""
    from torch_htam.proposers.base import Parent, ProposalRequest, source_key
    from torch_htam.proposers.expert import ExpertProposer
    monkeypatch.setattr(gemm_cutlass, "library_ready", lambda: False)
    *_, task, gp = _region()
    policy = policy_for(task)
    first = ExpertProposer().propose(ProposalRequest(task, "fusion", [], n=1, policy=policy))
    assert first.candidates and not any(c.params.get("cutlass") for c in first.candidates)
    won = first.candidates[0]
    parent = Parent(won.source, won.tags, 1.0, 0.1, None, won.params)
    tried = {source_key(c.source) for c in first.candidates}

    def step(tried):
        return ExpertProposer().propose(ProposalRequest(task, "compute_precision", ["bf16_tensor_cores"], n=1,
                                                        parent=parent, policy=policy, tried=tried)).candidates
    monkeypatch.setattr(gemm_cutlass, "library_ready", lambda: True)
    nxt = step(tried)
    assert gemm.cutlass(gp, nxt[0].params) and len(nxt) == 2
    tried |= {source_key(c.source) for c in nxt}
    assert not any(c.params.get("cutlass") for c in step(tried))
