"""CUTLASS's Hopper conv with batch norm in its epilogue (csrc/cutlass_conv.cu, the cutlass_conv
library) and the candidates that link it (proposers/expert/conv_cutlass.py): one launch of a
channels-last bf16 conv2d + batch norm [+ residual] [+ ReLU].

CPU: where the expert offers it (only where the library is built), why it does not apply, the tile
the defaults pick against the probe's measured fastest. Build (`build`): the library for sm_90a and
candidates linking it. GPU (`gpu`): every tile against eager torch at three batches, a weight KCRS
or channels-last, a weight written in place between calls, a misaligned tensor refused."""
from __future__ import annotations

import ctypes
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from test_conv_igemm import _region
from torch_htam import build, paths
from torch_htam.proposers.expert import conv, conv_cutlass, strategies

PROBE = Path(__file__).resolve().parents[1] / "docs" / "experiments" / "cutlass_conv" / "conv_bn_probe.json"


@pytest.fixture
def built(monkeypatch):
    """The library counts as built (the expert asks conv_cutlass.library_ready)."""
    monkeypatch.setattr(conv_cutlass, "library_ready", lambda: True)


def test_the_cutlass_conv_is_the_default_and_leads_the_grid_once_built(built):
    from compile_check import assert_library_leads
    *_, cp = _region()
    assert conv_cutlass.reason(cp) is None and cp.facts.cutlass_tiles == (0, 1, 2)
    base = assert_library_leads(conv.TARGET, cp, "ct_tile", 3)     # then cuDNN's and the implicit GEMM's
    # cuDNN's knobs mean nothing on this path; the tile does
    assert conv.canonical(cp, dict(base, algo=3, vec32=False)) == conv.canonical(cp, base)
    assert {"smem_tiling", "bf16_tensor_cores", "fold_batchnorm"} <= set(conv.tags(cp, base))


def test_moves_reach_it_and_leave_it(built):
    """smem_tiling's moves start with its tiles, then the implicit GEMM's (which leave it); a move
    of cuDNN's knobs returns to cuDNN's path."""
    *_, cp = _region()
    moves = strategies.moves_for("smem_tiling", cp.facts)
    assert [m.get("ct_tile") for m in moves[:3]] == [0, 1, 2] and all(m["cutlass"] for m in moves[:3])
    base = conv.defaults(cp)
    ig = conv.canonical(cp, conv.refit(cp, dict(base, **moves[3]), moves[3]))
    assert conv.igemm(cp, ig) and not conv.cutlass(cp, ig)
    back = conv.refit(cp, dict(base, algo=2), {"algo": 2})
    assert not conv.cutlass(cp, back) and "CUTLASS" not in conv.render(cp, back).splitlines()[0]


def test_without_the_library_nothing_changes():
    *_, cp = _region()
    assert cp.facts.cutlass_tiles == ()
    base = conv.defaults(cp)
    assert "cutlass" not in base and not any(p.get("cutlass") for p in conv.grid(cp, base))
    # asked for anyway by a setting from memory, it renders only where the region allows it
    *_, fp16 = _region(dtype=torch.float16)
    assert "CUTLASS" not in conv.render(fp16, dict(conv.defaults(fp16), cutlass=True)).splitlines()[0]


@pytest.mark.parametrize("ready", [True, False])
def test_a_first_step_proposes_cudnns_default_beside_cutlass(monkeypatch, ready):
    """Neither path wins at every conv site on the GPU: a task's first step times both defaults
    (beyond the request's n), and only where CUTLASS's is the default."""
    from torch_htam.policy import policy_for
    from torch_htam.proposers.base import ProposalRequest
    from torch_htam.proposers.expert import ExpertProposer
    monkeypatch.setattr(conv_cutlass, "library_ready", lambda: ready)
    _, _, task, _, _ = _region()
    cands = ExpertProposer().propose(ProposalRequest(task, "seed", [], n=1, policy=policy_for(task))).candidates
    heads = [c.source.splitlines()[0] for c in cands]
    if ready:
        assert len(cands) == 2 and "CUTLASS" in heads[0] and "cuDNN" in heads[1]
        assert not cands[1].params.get("cutlass") and "ct_tile" not in cands[1].params
    else:
        assert len(cands) == 1 and "cuDNN" in heads[0]
    more = ExpertProposer().propose(ProposalRequest(task, "seed", [], n=3, policy=policy_for(task))).candidates
    assert len(more) == 3 + ready and len({c.source for c in more}) == len(more)
    # a replay proposes only settings its table measured: the alternate where it is among them
    from torch_htam.proposers.expert.proposer import setting_key
    first = setting_key(cands[0].params)
    alone = ExpertProposer(within={first}).propose(ProposalRequest(task, "seed", [], n=1, policy=policy_for(task)))
    assert [c.params for c in alone.candidates] == [cands[0].params]


def test_the_expert_asks_for_the_library_before_the_search_reaches_a_conv(monkeypatch):
    """ExpertProposer.prepare matches every task once (the pipeline calls it after capture), so a
    conv that would link the library asks for it, and on a GPU machine its build starts then."""
    from torch_htam.policy import policy_for
    from torch_htam.proposers.expert import ExpertProposer
    asked = []
    monkeypatch.setattr(conv_cutlass, "library_ready", lambda: asked.append(1) or False)
    _, _, task, _, _ = _region()
    asked.clear()
    ExpertProposer().prepare([task, object()], policy_for)      # a task no target takes is skipped
    assert asked == [1]


def test_the_search_waits_for_a_library_building_in_the_background(monkeypatch):
    import threading
    import time
    done = threading.Event()
    t = threading.Thread(target=done.wait, daemon=True)
    t.start()
    monkeypatch.setattr(build, "_BACKGROUND", {("cutlass_conv", "sm_90a"): t})
    assert build.libraries_building() == ["cutlass_conv"]
    t0 = time.monotonic()
    assert build.wait_for_libraries(0.05) == ["cutlass_conv"] and time.monotonic() - t0 < 5
    threading.Timer(0.05, done.set).start()
    assert build.wait_for_libraries(30.0) == [] and build.libraries_building() == []


def test_hardswish_is_in_its_epilogue(built):
    """conv + batch norm + hardswish (MobileNetV3's) takes CUTLASS's kernel with the activation in
    its epilogue, by default."""
    *_, cp = _region(act="hardswish")
    assert cp.hardswish and conv_cutlass.reason(cp) is None and cp.facts.cutlass_tiles
    base = conv.defaults(cp)
    src = conv.render(cp, base)
    assert base["cutlass"] and "hardswish" in src.splitlines()[0] and "HTAM_CONV_ACT_HARDSWISH" in src
    *_, plain = _region(act=None, res=True, c=64)
    assert "HTAM_CONV_ACT_NONE" in conv.render(plain, conv.defaults(plain))


@pytest.mark.parametrize("kw, why", [
    (dict(dtype=torch.float16), "bf16 only"),
    (dict(c=12), "multiples of 8"),
    (dict(k=20), "multiples of 8"),
    (dict(bias=True), "no conv bias"),
])
def test_it_says_why_it_does_not_apply(built, kw, why):
    *_, cp = _region(**kw)
    assert why in conv_cutlass.reason(cp)
    assert cp.facts.cutlass_tiles == () and not any(p.get("cutlass") for p in conv.grid(cp, conv.defaults(cp)))


def test_the_default_tile_is_the_fastest_the_probe_measured():
    """default_tile against docs/experiments/cutlass_conv's H200 probe: per ResNet-50 conv shape and
    batch, the fastest of the three tiles."""
    probe = json.loads(PROBE.read_text())
    names = {f"{m}x{n}": i for i, (m, n) in enumerate(conv_cutlass.TILES)}
    rows = [r for r in probe["rows"] if "best_tile" in r]
    assert len(rows) == 21
    for r in rows:
        p = (r["H"] + 2 * (r["R"] // 2) - r["R"]) // r["stride"] + 1
        assert conv_cutlass.default_tile(r["batch"] * p * p, r["K"]) == names[r["best_tile"]], r


# ---- builds (nvcc, CUTLASS's headers) ------------------------------------------------------------

CT_REGIONS = {   # name: _region's arguments
    "3x3_bn_relu_kcrs": dict(w_cl=False),
    "3x3_bn_add_relu_krsc": dict(res=True, c=64),
    "1x1_s2_bn": dict(r=1, stride=2, act=None, w_cl=False, k=96),
    "1x1_bn_add_relu": dict(r=1, w_cl=False, res=True, c=64, k=96),
    "1x1_bn_hardswish": dict(r=1, w_cl=False, act="hardswish", k=96),     # MobileNetV3's expansion
    "3x3_bn_add_krsc": dict(res=True, c=64, act=None),                   # a residual, no activation
}
needs_cutlass = pytest.mark.skipif(paths.nvcc_path() is None or build.find_cutlass() is None,
                                   reason="needs nvcc and CUTLASS's headers (pip install --no-deps nvidia-cutlass)")


@pytest.mark.build
@needs_cutlass
def test_the_library_builds_once_and_candidates_link_it(built, tmp_path, monkeypatch):
    """csrc/cutlass_conv.cu builds for sm_90a (a minute and more), once; not for an arch without
    wgmma; the proposed sources of each region, every tile, build against it, and load beside a
    copy of the library elsewhere. In a cache of its own: the session's other tests see no library
    built."""
    from compile_check import assert_compiles, assert_library_builds_once
    monkeypatch.setenv("HTAM_CACHE_DIR", str(tmp_path))
    so = assert_library_builds_once(conv_cutlass.LIBRARY)
    todo = []
    for name, kw in CT_REGIONS.items():
        *_, cp = _region(**kw)
        todo += [(f"{name}/{t}", conv.render(cp, dict(conv.defaults(cp), ct_tile=t))) for t in cp.facts.cutlass_tiles]
    assert_compiles(todo)
    # a server's copy: a kernel's link names the library's soname, so a copy loaded first from
    # anywhere (a bundle's: bundle.preload_libraries) serves it where the build's cache is not
    kernel = build.build_many([todo[0][1]], arch="sm_90a")[0]
    server = tmp_path / "server"
    server.mkdir()
    k2, l2 = shutil.copy(kernel.so_path, server / "kernel.so"), shutil.copy(so, server / so.name)
    away = so.rename(so.with_suffix(".away"))
    try:
        with pytest.raises(OSError):
            ctypes.CDLL(str(k2))
        ctypes.CDLL(str(l2), mode=os.RTLD_GLOBAL)
        assert ctypes.CDLL(str(k2)).htam_run
    finally:
        away.rename(so)


# ---- on the GPU --------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("name", CT_REGIONS)
def test_each_tile_matches_torch_at_other_batches(built, name):
    """Every tile against eager torch at the captured batch, 1 and 7, judged as verification judges;
    then the weight and a batch-norm vector written in place are seen by the next call."""
    from torch_htam.launcher import Kernel
    from torch_htam.policy import policy_for
    from torch_htam.verify import within_torch_error
    block, _, task, keep, cp = _region(device="cuda", **CT_REGIONS[name])
    policy = policy_for(task)
    params = [dict(conv.defaults(cp), cutlass=True, ct_tile=t) for t in range(len(conv_cutlass.TILES))]
    results = build.build_many([conv.render(cp, p) for p in params])
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]

    def check(kernel, xs, what):
        with torch.no_grad():
            ref = block(*xs)
            ref64 = block(*[x.double() if x is not None else None for x in xs])
        out = torch.full_like(ref, float("nan")).to(memory_format=torch.channels_last)
        assert kernel([xs[i] for i in keep], [out]) == 0, what
        torch.cuda.synchronize()
        assert torch.isfinite(out).all(), what
        assert (torch.allclose(out.float(), ref.float(), atol=policy.atol, rtol=policy.rtol)
                or within_torch_error(out.float(), ref.float(), ref64, policy.atol, policy.rtol)[0]), what

    for n in (2, 1, 7):
        torch.manual_seed(n)
        _, xs, *_ = _region(device="cuda", n=n, **CT_REGIONS[name])
        for p, res in zip(params, results):
            kernel = Kernel(res.so_path)
            check(kernel, xs, (p["ct_tile"], n))
            xs[1].mul_(-0.5)          # the weight, in place: same pointer, new values
            xs[3].add_(1.0)           # a batch-norm vector likewise
            check(kernel, xs, (p["ct_tile"], n, "written in place"))


@pytest.mark.gpu
def test_a_misaligned_tensor_is_refused_not_misread(built):
    """An input whose data starts 2 bytes past a 16-byte boundary: HTAM_ERR_SHAPE (the runtime runs
    the original region), not a wrong answer."""
    from torch_htam.launcher import Kernel
    _, xs, task, keep, cp = _region(device="cuda", **CT_REGIONS["3x3_bn_relu_kcrs"])
    res = build.build_many([conv.render(cp, conv.defaults(cp))])[0]
    assert res.ok, res.error
    x = xs[0]
    flat = torch.empty(x.numel() + 1, dtype=x.dtype, device="cuda")
    shifted = flat[1:].view(x.shape[0], x.shape[2], x.shape[3], x.shape[1]).permute(0, 3, 1, 2)
    shifted.copy_(x)
    assert shifted.is_contiguous(memory_format=torch.channels_last)
    ins = [shifted if i == 0 else xs[i] for i in keep]
    y = torch.empty(x.shape[0], xs[1].shape[0], x.shape[2], x.shape[3], dtype=x.dtype,
                    device="cuda").to(memory_format=torch.channels_last)
    assert Kernel(res.so_path)(ins, [y]) == 1000
