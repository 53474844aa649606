"""Bundles: precompile -> load round trip with stand-in libraries, integrity failures, arch changes.

The .so files here are bytes (no GPU on CI); the provider maps each bundle entry to a CPU stand-in
that runs the task's own graph (tests/test_runtime.py), so what is checked is which entries the
bundle lets through, and that the model computes the same thing.
"""
import json

import pytest
import torch

from torch_htam import bundle, runtime, serving
from torch_htam.build import BuildResult
from torch_htam.cache import KernelCache
from torch_htam.evaluation import Evaluation
from torch_htam.extract import extract_tasks
from torch_htam.policy import kept_precision
from torch_htam.report import TaskStatus

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


def test_load_says_so_where_its_example_inputs_match_none_of_the_bundles_kernels(made, tmp_path, caplog):
    """A task's signature holds its shapes: a bundle loaded with example inputs of other shapes
    than its precompile's swaps nothing, and the report says how many kernels matched nothing and
    at which shapes it was precompiled; loaded as made, it says nothing of the kind."""
    model, x, tasks, cache, provider = made
    out = bundle.precompile(model, (x,), tmp_path / "b", cache=cache)
    loaded = bundle.load(_fresh_model(), out, (torch.randn(2, 8, 32),), provider=provider, arch="sm_fake")
    assert loaded.htam_report.swapped == 0
    note = loaded.htam_report.note
    assert f"{len(tasks)} of the bundle's {len(tasks)} kernels match no region" in note
    assert "[[2, 8, 32]]" in note and "[[4, 8, 32]]" in note and "match no region" in caplog.text
    same = bundle.load(_fresh_model(), out, (x,), provider=provider, arch="sm_fake")
    assert same.htam_report.swapped == len(tasks) and "match no region" not in (same.htam_report.note or "")


def test_load_runs_the_model_the_way_the_optimized_model_ran(made, tmp_path):
    """A bundle whose model ran under torch.compile with the kernels inside loads that way (in the
    recorded mode), not as the replay; a bundle without "run" loads as the replay it was."""
    model, x, tasks, cache, provider = made
    torch._dynamo.reset()
    out = bundle.precompile(model, (x,), tmp_path / "b", cache=cache, run={"compile": True, "mode": "default"})
    assert json.loads((out / "manifest.json").read_text())["run"] == {"compile": True, "mode": "default"}
    fresh = bundle.load(_fresh_model(), out, (x,), provider=provider, arch="sm_fake")
    assert fresh._compiled_call_impl is not None and "forward" not in fresh.__dict__
    assert bundle.run_of(fresh) == {"compile": True, "mode": "default", "reexport": False}
    with torch.inference_mode():
        y = torch.randn(4, 8, 32)
        assert torch.allclose(fresh(y), model(y), atol=1e-6)
    from torch_htam import inductor
    inductor.sync_report(fresh)
    assert fresh.htam_report.swapped == len(tasks)
    runtime.restore(fresh)
    torch._dynamo.reset()
    man = json.loads((out / "manifest.json").read_text())
    man["run"]["reexport"] = True        # optimize's base was Inductor on our re-exported graph
    (out / "manifest.json").write_text(json.dumps(man))
    again = bundle.load(_fresh_model(), out, (x,), provider=provider, arch="sm_fake")
    assert again._htam_backend.keep_reexport and bundle.run_of(again)["reexport"]
    runtime.restore(again)
    torch._dynamo.reset()
    del man["run"]
    (out / "manifest.json").write_text(json.dumps(man))
    old = bundle.load(_fresh_model(), out, (x,), provider=provider, arch="sm_fake")
    assert bundle.run_of(old) == bundle.REPLAY and hasattr(old.forward, "htam")


def test_inductor_code_in_the_bundle_is_loaded_only_on_its_own_stack(made, tmp_path, monkeypatch):
    """A compiled run's bundle carries Inductor's cache artifacts with the stack they are for; load
    puts them in Inductor's caches on that stack, and on another one (or altered) compiles instead."""
    from torch_htam import inductor
    model, x, tasks, cache, provider = made
    run = {"compile": True, "mode": "default"}
    out = bundle.precompile(model, (x,), tmp_path / "b", cache=cache, run=run, inductor_code=b"compiled code")
    man = json.loads((out / "manifest.json").read_text())
    assert man["inductor"]["stack"] == inductor.stack() and (out / man["inductor"]["file"]).read_bytes() == b"compiled code"
    loaded, real_stack = [], inductor.stack
    monkeypatch.setattr(inductor, "load_artifacts", loaded.append)

    def load(stack=None):
        monkeypatch.setattr(inductor, "stack", lambda: {**real_stack(), **(stack or {})})
        m = bundle.load(_fresh_model(), out, (x,), provider=provider, arch="sm_fake")
        runtime.restore(m)
        return m.htam_report.note
    assert "Inductor code loaded from the bundle" in load() and loaded == [b"compiled code"]
    assert "another stack (gpu" in load({"gpu": "NVIDIA B200"}) and len(loaded) == 1
    with kept_precision():           # TF32 matmuls: another FX graph cache key, so compile
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        assert "another stack (matmul" in load() and len(loaded) == 1
    (out / man["inductor"]["file"]).write_bytes(b"compiled c0de")
    assert "missing or altered" in load() and len(loaded) == 1
    replay = bundle.precompile(model, (x,), tmp_path / "r", cache=cache, inductor_code=b"compiled code")
    assert json.loads((replay / "manifest.json").read_text())["inductor"] is None   # a replay needs none


def test_a_bundle_carries_its_check_of_our_launches_under_the_cpp_wrapper_to_its_own_stack(made, tmp_path, monkeypatch):
    """Where our launches were checked under Inductor's C++ wrapper at precompile (inductor.warm_main),
    a server of the same stack and launcher sources takes that check (its first compile keeps the
    wrapper the decision timed); another stack or launcher checks for itself."""
    import torch._inductor.runtime.cache_dir_utils as cdu
    from torch_htam import inductor, launcher
    model, x, tasks, cache, provider = made
    monkeypatch.setattr(cdu, "cache_dir", lambda: str(tmp_path / "server"))
    (tmp_path / "server").mkdir()
    monkeypatch.setattr(inductor, "stable_launches_checked", lambda: True)     # the precompile machine's
    out = bundle.precompile(model, (x,), tmp_path / "b", cache=cache, run={"compile": True, "mode": "default"},
                            inductor_code=b"compiled code")
    man = json.loads((out / "manifest.json").read_text())
    assert man["inductor"]["stable_launches"] == launcher.source_hash()
    monkeypatch.undo()
    monkeypatch.setattr(cdu, "cache_dir", lambda: str(tmp_path / "server"))
    monkeypatch.setattr(inductor, "load_artifacts", lambda data: None)
    real_stack = inductor.stack

    def load(stack=None):
        monkeypatch.setattr(inductor, "stack", lambda: {**real_stack(), **(stack or {})})
        runtime.restore(bundle.load(_fresh_model(), out, (x,), provider=provider, arch="sm_fake"))
        return inductor.stable_launches_checked()
    assert load({"torch": "9.9"}) is False                     # another stack: not taken
    assert load() is True
    assert inductor.adopt_stable_launches("another launcher's sources") is False


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
    report = {t.signature: t for t in fresh.htam_report.tasks}
    assert report[sig_so].status == runtime.TaskStatus.UNUSABLE
    assert report[sig_so].detail == "needs rebuild + re-verification"
    assert report[sig_cu].status == "no kernel"   # a tampered source is never loaded nor rebuilt
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
    monkeypatch.setattr(bundle, "_gpu_arch", lambda: None)   # also on a GPU box (it failed on an H100)
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


# ---- golden records ------------------------------------------------------------------------------

def test_golden_records_are_written_and_read_back(made, tmp_path):
    from safetensors.torch import load_file
    from torch_htam import golden
    from torch_htam.cache import sha256_file
    from torch_htam.task import load_reference
    model, x, tasks, cache, provider = made
    out = bundle.precompile(model, (x,), tmp_path / "b", cache=cache)
    man = {t["signature"]: t for t in json.loads((out / "manifest.json").read_text())["tasks"]}
    for sig, task in tasks.items():
        g = man[sig]["golden"]
        path = out / g["file"]
        assert path == out / "kernels" / sig / "golden.safetensors" and g["sha256"] == sha256_file(path)
        assert g["policy"]["name"] == "fp32" and g["policy"]["atol"] == 1e-4 and g["device"] == "cpu"
        raw = load_file(str(path))
        n_in, n_out = len(task.inputs), len(task.outputs)
        assert {f"in{i}" for i in range(n_in)} | {f"out{k}" for k in range(n_out)} <= set(raw)
        assert all(raw[f"out64_{k}"].dtype == torch.float64 for k in range(n_out))
        inputs = golden.make_inputs(task, "cpu")   # verification's seed-0 trial, regenerated
        assert all(torch.equal(raw[f"in{i}"], a) for i, a in enumerate(inputs))
        with torch.no_grad():
            ref = load_reference(task)(*inputs)
        ref = ref if isinstance(ref, (tuple, list)) else [ref]
        assert all(torch.equal(raw[f"out{k}"], r) for k, r in enumerate(ref))
        back = golden.read(path, task, "cpu")
        assert [tuple(a.stride()) for a in back.inputs] == [s.stride for s in task.inputs]
        assert golden.check(provider, KernelCache(root=out).get(sig), back) is None


def test_golden_inputs_keep_a_strided_spec(tmp_path):
    from torch_htam import golden
    from torch_htam.extract import task_from_source
    from torch_htam.task import TensorSpec
    task = task_from_source(
        "import torch\nimport torch.nn as nn\n"
        "class Model(nn.Module):\n    def forward(self, a):\n        return a * 2\n"
        "def get_inputs():\n    return [torch.randn(8, 4).t()]\n"
        "def get_init_inputs():\n    return []\n", "scale_t")
    assert task.inputs[0].stride == (1, 4) and not task.inputs[0].contiguous
    tensors = golden.record(task, golden.make("fp32"), "cpu")
    assert tensors["in0"].is_contiguous()
    golden.save(tmp_path / "g.safetensors", tensors, task, golden.make("fp32"), "cpu")
    back = golden.read(tmp_path / "g.safetensors", task, "cpu")
    assert back.inputs[0].stride() == (1, 4) and torch.equal(back.outputs[0], back.inputs[0] * 2)


class WrongKernel(CpuKernel):
    def __call__(self, inputs):
        return [o + 1e-2 for o in super().__call__(inputs)]


class NanKernel(CpuKernel):
    def __call__(self, inputs):
        outs = [o.clone() for o in super().__call__(inputs)]
        for o in outs:
            o.view(-1)[7] = float("nan")
        return outs


class FailingKernel(CpuKernel):
    def __call__(self, inputs):
        raise RuntimeError("htam_run returned cudaErrorInvalidValue (1)")


def test_load_swaps_only_kernels_that_pass_their_golden_check(made, tmp_path):
    model, x, tasks, cache, provider = made
    out = bundle.precompile(model, (x,), tmp_path / "b", cache=cache)
    wrong, nan, err = sorted(tasks)   # the MLP's three tasks: each kernel fails its check one way
    kinds = {wrong: WrongKernel, nan: NanKernel, err: FailingKernel}
    stand_ins = {s: kinds[s](t) for s, t in tasks.items()}
    fresh = bundle.load(_fresh_model(), out, (x,), arch="sm_fake",
                        provider=runtime.Provider(provider.op, lambda e: stand_ins[e.signature]))
    rep = fresh.htam_report
    assert {t.status for t in rep.tasks} == {TaskStatus.GOLDEN_FAILED}
    status = {t.signature: t.detail for t in rep.tasks}
    assert status[wrong].startswith("mismatch") and "atol=0.0001" in status[wrong]
    assert status[nan].startswith("nan")
    assert status[err].startswith("launch_error") and "cudaErrorInvalidValue" in status[err]
    assert rep.swapped == 0 and "golden check: 0 of 3 kernels passed in" in rep.note
    assert "forward" not in fresh.__dict__   # nothing passed: the original path

    # one bad kernel: the other two are swapped in and the model computes what it did
    one_bad = {s: (WrongKernel if s == wrong else CpuKernel)(t) for s, t in tasks.items()}
    fresh = bundle.load(_fresh_model(), out, (x,), arch="sm_fake",
                        provider=runtime.Provider(provider.op, lambda e: one_bad[e.signature]))
    rep = fresh.htam_report
    assert rep.swapped == len(tasks) - 1 and "golden check: 2 of 3 kernels passed in" in rep.note
    assert {t.signature for t in rep.tasks if t.status == "swapped"} == set(tasks) - {wrong}
    with torch.no_grad():
        assert torch.equal(fresh(x), model(x))
    assert rep.fast_calls == 1 and one_bad[wrong].calls == 1   # its golden check only


def test_load_rejects_a_missing_or_altered_golden_record(made, tmp_path):
    model, x, tasks, cache, provider = made
    out = bundle.precompile(model, (x,), tmp_path / "b", cache=cache)
    gone, altered = sorted(tasks)[:2]
    (out / "kernels" / gone / "golden.safetensors").unlink()
    g = out / "kernels" / altered / "golden.safetensors"
    data = bytearray(g.read_bytes())
    data[-3] ^= 0x10   # a bit of an output value
    g.write_bytes(bytes(data))
    fresh = bundle.load(_fresh_model(), out, (x,), provider=provider, arch="sm_fake")
    status = {t.signature: t.detail for t in fresh.htam_report.tasks if t.status is TaskStatus.GOLDEN_FAILED}
    assert set(status) == {gone, altered}
    assert "no golden record" in status[gone] and "re-make the bundle" in status[gone]
    assert "sha256" in status[altered]
    assert fresh.htam_report.swapped == len(tasks) - 2


def test_a_format_1_bundle_must_be_remade(made, tmp_path):
    model, x, tasks, cache, provider = made
    out = bundle.precompile(model, (x,), tmp_path / "b", cache=cache)
    man = json.loads((out / "manifest.json").read_text())
    man["format"] = 1
    (out / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(ValueError, match="no golden records.*re-make the bundle with torch_htam.precompile"):
        bundle.load(_fresh_model(), out, (x,), provider=provider, arch="sm_fake")


# ---- empty bundles, and bundling without a GPU ---------------------------------------------------

def test_no_kernel_to_bundle_raises_and_writes_no_manifest(made, tmp_path):
    from torch_htam.errors import EmptyBundleError
    model, x, tasks, cache, provider = made
    empty = KernelCache("sm_fake", root=tmp_path / "empty")
    with pytest.raises(EmptyBundleError, match=r"no kernel to bundle for sm_fake: the cache at .*empty has "
                                               r"no verified kernel for this model's 3 tasks; run `torch-htam optimize`"):
        bundle.precompile(model, (x,), tmp_path / "b", cache=empty)
    assert not (tmp_path / "b" / "manifest.json").exists()
    with pytest.raises(EmptyBundleError, match="not faster end to end"):
        bundle.precompile(model, (x,), tmp_path / "b", cache=cache, only=set())
    assert not (tmp_path / "b" / "manifest.json").exists()
    assert issubclass(EmptyBundleError, RuntimeError)


def test_torch_compile_alone_bundles_its_inductor_code_and_loads_compiled(made, tmp_path, monkeypatch):
    """optimize kept no kernel (torch.compile alone was fastest): the bundle is Inductor's code for
    the model, and load runs torch.compile, as the optimized model did, with none of our kernels."""
    from torch_htam import inductor
    model, x, tasks, cache, provider = made
    loaded = []
    monkeypatch.setattr(inductor, "load_artifacts", loaded.append)
    torch._dynamo.reset()
    run = {"compile": True, "mode": "default", "reexport": False}
    out = bundle.precompile(model, (x,), tmp_path / "b", cache=cache, only=set(), run=run,
                            inductor_code=b"compiled code")
    man = json.loads((out / "manifest.json").read_text())
    assert man["run"] == run and not any(t["kernel"] for t in man["tasks"]) and man["inductor"]
    assert not (out / "kernels").exists() or not any((out / "kernels").iterdir())
    fresh = bundle.load(_fresh_model(), out, (x,), provider=provider, arch="sm_fake")
    assert bundle.run_of(fresh) == run and loaded == [b"compiled code"]
    with torch.inference_mode():
        y = torch.randn(4, 8, 32)
        torch.testing.assert_close(fresh(y), model(y))
    inductor.sync_report(fresh)
    assert fresh.htam_report.swapped == 0
    runtime.restore(fresh)
    torch._dynamo.reset()


def test_a_kernel_whose_golden_record_fails_is_left_out(made, tmp_path, monkeypatch):
    from torch_htam import golden
    from torch_htam.errors import EmptyBundleError
    model, x, tasks, cache, provider = made
    left = sorted(tasks)[0]
    real = golden.record

    def record(task, policy, device):
        if task.signature == left:
            raise RuntimeError("no kernel for this op on cpu")
        return real(task, policy, device)
    monkeypatch.setattr(golden, "record", record)
    out = bundle.precompile(model, (x,), tmp_path / "b", cache=cache)
    man = {t["signature"]: t for t in json.loads((out / "manifest.json").read_text())["tasks"]}
    assert man[left]["kernel"] is False and "no kernel for this op" in man[left]["left_out"]
    assert not (out / "kernels" / left).exists() and sum(t["kernel"] for t in man.values()) == 2
    monkeypatch.setattr(golden, "record", lambda *a: (_ for _ in ()).throw(RuntimeError("out of memory")))
    with pytest.raises(EmptyBundleError, match="golden record of every kernel failed.*out of memory"):
        bundle.precompile(model, (x,), tmp_path / "b", cache=cache)
    assert not (out / "manifest.json").exists()   # the previous bundle is not left looking whole


def test_precompile_with_arch_and_no_gpu_bundles_the_cached_kernels(made, tmp_path, monkeypatch):
    import torch_htam
    from torch_htam import pipeline
    model, x, tasks, cache, provider = made
    monkeypatch.setattr(bundle, "_gpu_arch", lambda: None)
    monkeypatch.setattr(pipeline, "optimize", lambda *a, **k: pytest.fail("no search without a GPU"))
    monkeypatch.delenv("HTAM_ARCH", raising=False)
    with pytest.raises(RuntimeError, match="no CUDA GPU detected: pass arch="):
        torch_htam.precompile(model, (x,), tmp_path / "none")
    assert not (tmp_path / "none").exists()
    user = KernelCache("sm_fake")   # the user's cache for that arch (HTAM_CACHE_DIR in the fixture)
    for e in cache.ls():
        user.put_entry(e)
    out = torch_htam.precompile(model, (x,), tmp_path / "b", arch="sm_fake")
    man = json.loads((out / "manifest.json").read_text())
    assert man["arch"] == "sm_fake" and all(t["kernel"] for t in man["tasks"])
    assert {t["golden"]["device"] for t in man["tasks"]} == {"cpu"}
    assert man["run"] == {"compile": True, "mode": "default"}   # optimize's default path
    torch._dynamo.reset()
    fresh = bundle.load(_fresh_model(), out, (x,), provider=provider, arch="sm_fake")
    with torch.inference_mode():
        torch.testing.assert_close(fresh(x), model(x))   # compiles: the kernels go in here
    from torch_htam import inductor
    inductor.sync_report(fresh)
    assert fresh.htam_report.swapped == len(tasks)
    runtime.restore(fresh)
    torch._dynamo.reset()
    monkeypatch.setenv("HTAM_ARCH", "sm_other")   # stands for arch= without a GPU: its cache is empty
    from torch_htam.errors import EmptyBundleError
    with pytest.raises(EmptyBundleError, match="for sm_other"):
        torch_htam.precompile(model, (x,), tmp_path / "c")


@pytest.mark.gpu
def test_gpu_golden_check_through_the_launcher(tmp_path):
    """The real path: a built kernel, goldens recorded on the GPU (and on the CPU, for the
    precompile(arch=) case), checked at load through the launcher; a wrong kernel is refused."""
    from test_runtime import BIAS_GELU_CU, BiasGelu
    from torch_htam.build import build_many

    def fresh(device="cuda"):
        torch.manual_seed(0)
        return BiasGelu().to(device).eval()
    model, x = fresh(), torch.randn(16, 256, device="cuda")
    target = [t for t in extract_tasks(model, (x,)) if t.kind == "elementwise"]
    assert len(target) == 1
    target = target[0]
    wrong_cu = BIAS_GELU_CU.replace("y[i] = 0.5f * v", "y[i] = 0.501f * v")
    good, wrong = build_many([BIAS_GELU_CU, wrong_cu], out_dir=tmp_path)
    assert good.ok and wrong.ok, (good.log, wrong.log)
    arch = bundle._gpu_arch()
    for name, res, device in (("gpu", good, "cuda"), ("cpu", good, "cpu"), ("wrong", wrong, "cuda")):
        cache = KernelCache(arch, root=tmp_path / f"cache_{name}")
        cache.put(target, BIAS_GELU_CU, res.so_path, _ev(), {"proposer": "test"})
        out = bundle.precompile(fresh(device), (x.to(device),), tmp_path / f"b_{name}", cache=cache)
        man = json.loads((out / "manifest.json").read_text())
        assert [t["golden"]["device"] for t in man["tasks"] if t["kernel"]] == [device]
        loaded = bundle.load(fresh(), out, (x,))
        rep = loaded.htam_report
        status = {t.signature: (t.status, t.detail) for t in rep.tasks}
        if name == "wrong":
            assert rep.swapped == 0 and status[target.signature][0] is TaskStatus.GOLDEN_FAILED
            assert status[target.signature][1].startswith("mismatch")
            assert "golden check: 0 of 1 kernels passed in" in rep.note
        else:
            assert rep.swapped == 1 and status[target.signature][0] is TaskStatus.SWAPPED, rep.format()
            assert "golden check: 1 of 1 kernels passed in" in rep.note
            with torch.no_grad():
                torch.testing.assert_close(loaded(x), fresh()(x), atol=1e-5, rtol=1e-5)


# The server: a fresh process with empty torch_htam and Inductor caches loads the bundle, then
# times the model's first call; prints Inductor's FX graph cache counters, the seconds and the error.
SERVER = r"""
import json, sys, time, torch
sys.path.insert(0, sys.argv[1])
import torch_htam
from torch._dynamo.utils import counters
from torch_htam import inductor
from test_runtime import BiasGelu
torch.manual_seed(0)
model = BiasGelu().cuda().eval()
x = torch.randn(16, 256, device="cuda", generator=torch.Generator("cuda").manual_seed(1))
want = BiasGelu.forward(model, x)
t0 = time.perf_counter()
model = torch_htam.load(model, sys.argv[2], (x,))
load_s = time.perf_counter() - t0
t0 = time.perf_counter()
with torch.inference_mode():
    got = model(x)
torch.cuda.synchronize()
first_s = time.perf_counter() - t0
inductor.sync_report(model)
print(json.dumps({"hit": counters["inductor"]["fxgraph_cache_hit"], "miss": counters["inductor"]["fxgraph_cache_miss"],
                  "swapped": model.htam_report.swapped, "load_s": load_s, "first_call_s": first_s,
                  "err": (got - want).abs().max().item(), "note": model.htam_report.note}))
"""


@pytest.mark.gpu
def test_gpu_compiled_bundle_serves_its_first_call_from_its_inductor_code(tmp_path):
    """precompile of a compiled run (a real kernel inside Inductor's graph) carries Inductor's code;
    a fresh process with empty caches loads the bundle and its first call reads that code (FX graph
    cache hit, no miss), with the kernel swapped and the output right. The seconds are printed."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    from test_runtime import BIAS_GELU_CU, BiasGelu
    from torch_htam import inductor, launcher
    from torch_htam.build import build_many
    from torch_htam.extract import extract
    torch.manual_seed(0)
    model = BiasGelu().cuda().eval()
    x = torch.randn(16, 256, device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    found = extract(model, (x,))
    target = next(t for t in found.tasks if t.kind == "elementwise")
    res = build_many([BIAS_GELU_CU], out_dir=tmp_path / "build")[0]
    assert res.ok, res.log
    cache = KernelCache(bundle._gpu_arch(), root=tmp_path / "cache")
    entry = cache.put(target, BIAS_GELU_CU, res.so_path, _ev(), {"proposer": "test"})
    torch._dynamo.reset()
    inductor.install(model, found, {target.signature: launcher.Kernel(str(entry.so_path))})
    with torch.inference_mode():
        model(x)                                         # compiles: Inductor's code for the bundle
    inductor.sync_report(model)
    assert model.htam_report.swapped == 1
    code = inductor.save_artifacts()
    runtime.restore(model)
    out = bundle.precompile(model, (x,), tmp_path / "b", cache=cache,
                            run={"compile": True, "mode": "default"}, inductor_code=code)
    env = {**os.environ, "HTAM_CACHE_DIR": str(tmp_path / "server"),
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "server_inductor")}
    r = subprocess.run([sys.executable, "-c", SERVER, str(Path(__file__).parent), str(out)], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    print(got)
    assert got["swapped"] == 1 and got["err"] < 1e-4 and "Inductor code loaded" in got["note"]
    assert got["hit"] >= 1 and got["miss"] == 0, got
    torch._dynamo.reset()


def _ranged_bundle(tmp_path, monkeypatch, run_args: tuple, buckets: list):
    """MLP (batch declared 1-16, example 4) bundled with a stand-in kernel per ranged task, each
    kept for `buckets` (or buckets(i) for the i-th task), with run = bundle.with_dynamic(compiled
    run, dynamic, *run_args) (or *run_args(signatures)); loaded back. Returns (model, x, tasks,
    stand_ins, loaded model, bundle folder)."""
    monkeypatch.setenv("HTAM_CACHE_DIR", str(tmp_path / "user_cache"))
    torch.manual_seed(0)
    torch._dynamo.reset()
    model, x, dynamic = MLP().eval(), torch.randn(4, 8, 32), {0: {0: (1, 16)}}
    tasks = {t.signature: t for t in extract_tasks(model, (x,), dynamic=dynamic)}
    cache = KernelCache("sm_fake", root=tmp_path / "cache")
    for i, t in enumerate(tasks.values()):
        so = tmp_path / f"{t.signature}.so"
        so.write_bytes(b"\x7fELF fake library for " + t.signature.encode() * 50)
        ev = _ev()
        ev.buckets = buckets(i) if callable(buckets) else buckets
        cache.put(t, f"// kernel for {t.name}\n", so, ev, {"proposer": "expert"})
    stand_ins = {sig: CpuKernel(t) for sig, t in tasks.items()}   # MLP's graphs take any batch
    provider = runtime.Provider(PROVIDER.op, lambda entry: stand_ins[entry.signature])
    run_args = run_args(list(tasks)) if callable(run_args) else run_args
    run = bundle.with_dynamic({"compile": True, "mode": "default"}, dynamic, *run_args)
    out = bundle.precompile(model, (x,), tmp_path / "b", cache=cache, run=run)
    with torch.no_grad():
        fresh = bundle.load(_fresh_model(), out, (x,), provider=provider, arch="sm_fake")
    return model, x, tasks, stand_ins, fresh, out


@pytest.mark.parametrize("at_example", [{}, None])
def test_a_bundle_for_declared_sizes_serves_them_without_a_recompile(tmp_path, monkeypatch, at_example):
    """precompile with OptimizeConfig.dynamic records the sizes in the manifest's run; its tasks are
    the ranged ones, and load() compiles the model with those dims dynamic: new batch sizes run the
    kernels in the one dynamic graph, and the example's own sizes torch.compile's graph for them."""
    from torch_htam import inductor
    model, x, tasks, stand_ins, fresh, out = _ranged_bundle(tmp_path, monkeypatch, (at_example,),
                                                            [[0, 0, 2, 8], [0, 0, 9, 16]])
    assert tasks and all(t.inputs[0].ranges == ((2, 16),) for t in tasks.values())
    assert json.loads((out / "manifest.json").read_text())["run"]["dynamic"] == {"0": {"0": [1, 16]}}
    # the example's own sizes on torch.compile's graph for them where optimize served them so
    assert isinstance(fresh._compiled_call_impl, serving.ExampleSplit) == (at_example is not None)
    # the range's graph and Dynamo's own graph for batch 1, both compiled by load
    assert [bool(r.swapped) for r in fresh._htam_backend.records] == [True, False]
    with torch.no_grad():
        for n in (3, 4, 11, 16, 1):
            y = torch.randn(n, 8, 32)
            assert torch.allclose(fresh(y), model(y), atol=1e-6)
    assert len(fresh._htam_backend.records) == 2   # no size compiled a graph of its own
    inductor.sync_report(fresh)
    assert fresh.htam_report.swapped == len(tasks)
    assert all(k.calls >= 4 for k in stand_ins.values())   # the load's own call, then 3 sizes
    torch._dynamo.reset()


@pytest.mark.parametrize("at_example_kernels", [True, False])
def test_a_bundles_example_graph_runs_its_kernels_where_optimize_ran_them(tmp_path, monkeypatch, at_example_kernels):
    """A bundle whose run says the example's own graph ran the kernels (their static twins,
    decide.Trials.at_example) loads that graph with them: a call at the example's sizes runs
    every kernel there; without it that graph is torch.compile's alone."""
    model, x, _, stand_ins, fresh, _ = _ranged_bundle(tmp_path, monkeypatch, ({}, None, at_example_kernels),
                                                      [[0, 0, 2, 8], [0, 0, 9, 16]])
    assert isinstance(fresh._compiled_call_impl, serving.ExampleSplit)
    calls = [k.calls for k in stand_ins.values()]
    with torch.no_grad():
        assert torch.allclose(fresh(x), model(x), atol=1e-6)
    ran = [k.calls - c for k, c in zip(stand_ins.values(), calls)]
    assert ran == [int(at_example_kernels)] * len(ran), ran
    torch._dynamo.reset()


def test_a_bundle_serves_sizes_where_some_kernels_were_kept_on_a_graph_of_those(tmp_path, monkeypatch):
    """A bundle whose run records a bucket arm (decide.Trials.bucket_arm: sizes 2-8, where only the
    first task's kernel was kept) loads it: those sizes run that kernel alone, 9-16 every kernel,
    size 1 none, each right."""
    model, _, _, stand_ins, fresh, out = _ranged_bundle(
        tmp_path, monkeypatch, lambda sigs: (None, {}, False, [{"kernels": sigs[:1], "sizes": list(range(2, 9))}]),
        lambda i: [[0, 0, 2, 8], [0, 0, 9, 16]] if i == 0 else [[0, 0, 9, 16]])
    assert len(stand_ins) > 1
    assert isinstance(fresh._compiled_call_impl, serving.BucketSplit) and len(fresh._compiled_call_impl.more) == 1
    assert json.loads((out / "manifest.json").read_text())["run"]["bucket_arms"][0]["sizes"] == list(range(2, 9))

    def ran(n):
        calls = [k.calls for k in stand_ins.values()]
        y = torch.randn(n, 8, 32)
        with torch.no_grad():
            assert torch.allclose(fresh(y), model(y), atol=1e-6)
        return [k.calls > c for k, c in zip(stand_ins.values(), calls)]
    first_only = [True] + [False] * (len(stand_ins) - 1)
    assert ran(3) == first_only and ran(8) == first_only
    assert ran(11) == [True] * len(stand_ins) and ran(1) == [False] * len(stand_ins)
    torch._dynamo.reset()


def test_a_bundle_serves_sizes_outside_its_kernels_buckets_on_the_graph_without_them(tmp_path, monkeypatch):
    """A bundle whose run records by_bucket (optimize split its kernels arm by their buckets,
    serving.BucketSplit) loads that split: sizes outside every kernel's kept buckets run the
    graph without our kernels, right, and never reach a kernel."""
    model, _, _, stand_ins, fresh, _ = _ranged_bundle(tmp_path, monkeypatch, (None, {}), [[0, 0, 2, 8]])
    assert isinstance(fresh._compiled_call_impl, serving.BucketSplit)
    calls = [k.calls for k in stand_ins.values()]
    with torch.no_grad():
        for n in (11, 16, 1):
            y = torch.randn(n, 8, 32)
            assert torch.allclose(fresh(y), model(y), atol=1e-6)
        assert [k.calls for k in stand_ins.values()] == calls        # no kernel outside 2-8
        y = torch.randn(3, 8, 32)
        assert torch.allclose(fresh(y), model(y), atol=1e-6)
    assert all(k.calls > c for k, c in zip(stand_ins.values(), calls))
    torch._dynamo.reset()


def test_a_bundle_serves_no_size_above_its_kernels_cut(tmp_path, monkeypatch):
    """A bundle whose run records upto (optimize's kernels arm lost to the graph without it above
    that size, decide.Trials.range_cut) runs its kernels up to that size only, though they were
    kept in every bucket; the sizes above run the graph without them, right."""
    model, _, _, stand_ins, fresh, out = _ranged_bundle(tmp_path, monkeypatch, (None, {}, False, [], 9),
                                                        [[0, 0, 2, 8], [0, 0, 9, 16]])
    assert json.loads((out / "manifest.json").read_text())["run"]["upto"] == 9
    assert isinstance(fresh._compiled_call_impl, serving.BucketSplit)

    def ran(n):
        calls = [k.calls for k in stand_ins.values()]
        y = torch.randn(n, 8, 32)
        with torch.no_grad():
            assert torch.allclose(fresh(y), model(y), atol=1e-6)
        return all(k.calls > c for k, c in zip(stand_ins.values(), calls))
    assert [ran(n) for n in (3, 9, 10, 16)] == [True, True, False, False]
    torch._dynamo.reset()


def test_a_bundle_carries_the_libraries_its_kernels_link_and_loads_them_first(made, tmp_path, monkeypatch):
    """A kernel that links a library of ours (its source includes cutlass_conv.h) takes the
    library into the bundle (lib/<name>/), and load() loads that copy before any kernel; one that
    does not load is said in the report, and a bundle without such kernels carries none."""
    from torch_htam import build
    model, x, tasks, cache, provider = made
    plain = bundle.precompile(model, (x,), tmp_path / "plain", cache=cache)
    assert json.loads((plain / "manifest.json").read_text())["libraries"] == {}
    sig = next(iter(tasks))
    so = tmp_path / "linked.so"
    so.write_bytes(b"\x7fELF a kernel linking cutlass_conv " + sig.encode() * 50)
    cache.put(tasks[sig], '#include "cutlass_conv.h"\n// kernel\n', so, _ev(), {"proposer": "expert"})
    lib = build.library_path("cutlass_conv", "sm_fake")
    lib.parent.mkdir(parents=True, exist_ok=True)
    lib.write_bytes(b"\x7fELF the cutlass_conv library")
    out = bundle.precompile(model, (x,), tmp_path / "b", cache=cache)
    libs = json.loads((out / "manifest.json").read_text())["libraries"]
    assert libs == {"cutlass_conv": f"lib/cutlass_conv/{lib.name}"}
    assert (out / libs["cutlass_conv"]).read_bytes() == lib.read_bytes()

    opened = []
    monkeypatch.setattr(bundle, "_PRELOADED", {})
    monkeypatch.setattr(bundle.ctypes, "CDLL", lambda path, mode=0: opened.append(path) or object())
    loaded = bundle.load(_fresh_model(), out, (x,), provider=provider, arch="sm_fake")
    assert opened == [str((out / libs["cutlass_conv"]).resolve())] and loaded.htam_report.swapped == len(tasks)

    def broken(path, mode=0):
        raise OSError("invalid ELF header")
    monkeypatch.setattr(bundle, "_PRELOADED", {})
    monkeypatch.setattr(bundle.ctypes, "CDLL", broken)
    loaded = bundle.load(_fresh_model(), out, (x,), provider=provider, arch="sm_fake")
    assert "the cutlass_conv library did not load (invalid ELF header)" in loaded.htam_report.note
