"""Bundles: precompile -> load round trip with stand-in libraries, integrity failures, arch changes.

The .so files here are bytes (no GPU on CI); the provider maps each bundle entry to a CPU stand-in
that runs the task's own graph (tests/test_runtime.py), so what is checked is which entries the
bundle lets through, and that the model computes the same thing.
"""
import json

import pytest
import torch

from torch_htam import bundle, runtime
from torch_htam.build import BuildResult
from torch_htam.cache import KernelCache
from torch_htam.evaluation import Evaluation
from torch_htam.task import extract_tasks

from test_runtime import MLP, CpuKernel, PROVIDER


def _ev(speedup=1.5):
    return Evaluation(True, "ok", policy={"name": "fp32"}, ref_ms=0.02, kernel_ms=0.02 / speedup,
                      speedup=speedup)


@pytest.fixture
def made(tmp_path, monkeypatch):
    monkeypatch.setenv("HTAM_CACHE_DIR", str(tmp_path / "user_cache"))
    torch.manual_seed(0)
    model, x = MLP().eval(), torch.randn(4, 8, 32)
    tasks = {t.signature: t for t in extract_tasks(model, (x,))}
    cache = KernelCache("sm_fake", root=tmp_path / "cache")
    for t in tasks.values():
        so = tmp_path / f"{t.signature}.so"
        so.write_bytes(b"\x7fELF fake library for " + t.signature.encode() * 50)
        cache.put(t, f"// kernel for {t.name}\n", so, _ev(), {"proposer": "expert"})
    (cache.root / "htg.json").write_text('{"directions": []}')
    stand_ins = {sig: CpuKernel(t) for sig, t in tasks.items()}
    provider = runtime.Provider(PROVIDER.op, lambda entry: stand_ins[entry.signature])
    return model, x, tasks, cache, provider


def _fresh_model():
    torch.manual_seed(0)
    return MLP().eval()


def test_precompile_writes_a_self_contained_bundle(made, tmp_path):
    model, x, tasks, cache, provider = made
    calls = []
    out = bundle.precompile(model, (x,), tmp_path / "b", config="cfg", cache=cache,
                            ensure_kernels=lambda m, inp, cfg: calls.append(cfg))
    assert calls == ["cfg"]
    man = json.loads((out / "manifest.json").read_text())
    assert man["arch"] == "sm_fake" and man["format"] == bundle.BUNDLE_FORMAT and man["toolchain"]
    assert {t["signature"] for t in man["tasks"]} == set(tasks) and all(t["kernel"] for t in man["tasks"])
    for sig in tasks:
        assert sorted(p.name for p in (out / "kernels" / sig).iterdir()) == \
            ["golden.safetensors", "kernel.cu", "kernel.so", "manifest.json", "record.json"]
    assert (out / "htg.json").read_text() == '{"directions": []}'
    assert all(p is None for _, p in KernelCache(root=out).verify_all())


def test_precompile_lists_tasks_without_kernels(made, tmp_path):
    model, x, tasks, cache, provider = made
    missing = next(iter(tasks))
    cache.remove(missing)
    out = bundle.precompile(model, (x,), tmp_path / "b", cache=cache)
    listed = {t["signature"]: t["kernel"] for t in json.loads((out / "manifest.json").read_text())["tasks"]}
    assert listed[missing] is False and sum(listed.values()) == len(tasks) - 1
    assert not (out / "kernels" / missing).exists()


def test_precompile_keeps_only_the_kernels_the_model_used(made, tmp_path):
    model, x, tasks, cache, provider = made
    used = next(iter(tasks))
    out = bundle.precompile(model, (x,), tmp_path / "b", cache=cache, only={used})
    listed = {t["signature"]: t["kernel"] for t in json.loads((out / "manifest.json").read_text())["tasks"]}
    assert listed == {s: s == used for s in listed} and len(listed) == len(tasks)


def test_load_round_trip(made, tmp_path):
    model, x, tasks, cache, provider = made
    out = bundle.precompile(model, (x,), tmp_path / "b", cache=cache)
    fresh = _fresh_model()
    loaded = bundle.load(fresh, out, (x,), provider=provider, arch="sm_fake")
    assert loaded is fresh and loaded.htam_report.swapped == len(tasks)
    with torch.no_grad():
        y = torch.randn(4, 8, 32)
        assert torch.equal(loaded(y), model(y))
    assert loaded.htam_report.fast_calls == 1


def test_load_detects_truncated_library_and_flipped_source(made, tmp_path, caplog):
    model, x, tasks, cache, provider = made
    out = bundle.precompile(model, (x,), tmp_path / "b", cache=cache)
    sig_so, sig_cu = sorted(tasks)[:2]
    so = out / "kernels" / sig_so / "kernel.so"
    so.write_bytes(so.read_bytes()[:64])
    cu = out / "kernels" / sig_cu / "kernel.cu"
    data = bytearray(cu.read_bytes())
    data[5] ^= 0x20
    cu.write_bytes(bytes(data))
    fresh = _fresh_model()
    bundle.load(fresh, out, (x,), provider=provider, arch="sm_fake")
    status = {t.signature: t.status for t in fresh.htam_report.tasks}
    assert status[sig_so] == "needs rebuild + re-verification"
    assert status[sig_cu] == "no kernel"   # a tampered source is never loaded nor rebuilt
    assert fresh.htam_report.swapped == len(tasks) - 2
    assert "kernel.so" in caplog.text and "kernel.cu" in caplog.text
    with torch.no_grad():
        assert torch.equal(fresh(x), model(x))


def test_load_without_gpu_or_compiler_keeps_the_original_path(made, tmp_path, monkeypatch):
    model, x, tasks, cache, provider = made
    out = bundle.precompile(model, (x,), tmp_path / "b", cache=cache)
    monkeypatch.setattr(bundle, "_gpu_arch", lambda: None)
    fresh = bundle.load(_fresh_model(), out, (x,), provider=provider)
    assert "forward" not in fresh.__dict__ and "no CUDA GPU" in fresh.htam_report.note
    monkeypatch.setattr(bundle.paths, "nvcc_path", lambda: None)
    fresh = bundle.load(_fresh_model(), out, (x,), provider=provider, arch="sm_other")
    assert "forward" not in fresh.__dict__ and "no nvcc" in fresh.htam_report.note
    assert "sm_fake" in fresh.htam_report.note


def test_load_other_arch_rebuilds_but_needs_a_gpu_to_verify(made, tmp_path, monkeypatch):
    model, x, tasks, cache, provider = made
    out = bundle.precompile(model, (x,), tmp_path / "b", cache=cache)
    monkeypatch.setattr(bundle.paths, "nvcc_path", lambda: "/usr/bin/nvcc")
    fresh = bundle.load(_fresh_model(), out, (x,), provider=provider, arch="sm_other")
    assert fresh.htam_report.swapped == 0 and "re-verification on a GPU" in fresh.htam_report.note


def test_load_other_arch_rebuilds_and_reverifies(made, tmp_path, monkeypatch):
    model, x, tasks, cache, provider = made
    out = bundle.precompile(model, (x,), tmp_path / "b", cache=cache)
    bad = sorted(tasks)[0]
    monkeypatch.setattr(bundle.paths, "nvcc_path", lambda: "/usr/bin/nvcc")
    monkeypatch.setattr(bundle, "_gpu_arch", lambda: "sm_other")
    built = []

    def fake_build(sources, arch=None, out_dir=None):   # nvcc is not what is tested here
        built.append(arch)
        res = []
        for i, src in enumerate(sources):
            so = tmp_path / f"rebuilt{i}.so"
            so.write_bytes(src.encode())
            res.append(BuildResult(True, str(so), f"h{i}"))
        return res

    def fake_evaluate(task, source):   # the re-verification verdict on "this GPU"
        if task.signature == bad:
            return Evaluation(False, "mismatch", "max abs err 0.3")
        return _ev(1.2)
    monkeypatch.setattr("torch_htam.build.build_many", fake_build)
    monkeypatch.setattr("torch_htam.evaluation.evaluate", fake_evaluate, raising=False)
    fresh = bundle.load(_fresh_model(), out, (x,), provider=provider)
    rep = fresh.htam_report
    assert built == ["sm_other"] and rep.swapped == len(tasks) - 1
    assert "mismatch" in rep.note and f"{len(tasks) - 1} of {len(tasks)}" in rep.note
    local = KernelCache("sm_other")
    assert sorted(local.signatures()) == sorted(s for s in tasks if s != bad)
    assert local.get(sorted(local.signatures())[0]).record["provenance"]["rebuilt_from"] == "sm_fake"
    with torch.no_grad():
        assert torch.equal(fresh(x), model(x))


def test_load_rejects_a_folder_that_is_not_a_bundle(tmp_path):
    with pytest.raises(ValueError, match="not a torch_htam bundle"):
        bundle.load(_fresh_model(), tmp_path, (torch.randn(4, 8, 32),), arch="sm_fake")
