"""Kernel cache: layout, atomic concurrent writes, integrity checks, and the `cache` CLI."""
import io
import json
import logging
import multiprocessing as mp
import sys
from pathlib import Path

import pytest

from torch_htam.cache import FILES, KernelCache, sha256_file
from torch_htam.cli import main as cli


def cli_main(argv):
    """`torch-htam cache ARGV...` as the command line runs it."""
    return cli(["cache", *argv])
from torch_htam.evaluation import Evaluation
from torch_htam.task import Task, TensorSpec

SO_BYTES = b"\x7fELF" + bytes(range(256)) * 64   # a stand-in library: only its bytes matter here


def make_task(sig: str, name: str = "gelu_bias") -> Task:
    spec = TensorSpec((8, 64), "float32", (64, 1))
    return Task(name, "elementwise", "class Model: ...", [spec], [spec], sig, ["aten.gelu.default"])


def make_eval(speedup: float = 1.5) -> Evaluation:
    return Evaluation(True, "ok", policy={"name": "fp32", "atol": 1e-4, "rtol": 1e-4, "allow_tf32": False},
                      ref_ms=0.03, kernel_ms=0.03 / speedup, speedup=speedup, max_abs_err=1e-7)


def put(cache: KernelCache, tmp_path, sig: str, speedup: float = 1.5, so=SO_BYTES, proposer="expert"):
    so_path = tmp_path / f"{sig}.so"
    so_path.write_bytes(so)
    return cache.put(make_task(sig), f"// kernel {sig}\n", so_path, make_eval(speedup),
                     {"proposer": proposer, "tags": ["vec16"], "params": {"block": 256},
                      "steps": 3, "gpu": "test"})


@pytest.fixture
def cache(tmp_path):
    return KernelCache("sm_test", root=tmp_path / "cache")


def test_layout_and_record(cache, tmp_path):
    e = put(cache, tmp_path, "a" * 32)
    d = cache.root / "kernels" / ("a" * 32)
    assert sorted(p.name for p in d.iterdir()) == sorted(FILES + ("manifest.json",))
    assert (d / "kernel.so").read_bytes() == SO_BYTES
    manifest = json.loads((d / "manifest.json").read_text())
    assert manifest["files"] == {n: sha256_file(d / n) for n in FILES}
    rec = json.loads((d / "record.json").read_text())
    assert rec["task"]["signature"] == "a" * 32 and rec["tags"] == ["vec16"]
    assert rec["params"] == {"block": 256}
    assert rec["provenance"]["proposer"] == "expert" and rec["provenance"]["steps"] == 3
    assert {"torch_htam", "date", "arch", "toolchain"} <= set(rec["provenance"])
    got = cache.get("a" * 32)
    assert got.problem is None and got.so_path == d / "kernel.so"
    assert got.task.signature == "a" * 32 and got.evaluation.speedup == pytest.approx(1.5)
    assert got.usable(1.03) and not got.usable(2.0)
    assert e.signature == got.signature and cache.get("b" * 32) is None


def test_put_replaces_and_remove(cache, tmp_path):
    put(cache, tmp_path, "a" * 32, speedup=1.2)
    put(cache, tmp_path, "a" * 32, speedup=2.0)
    assert cache.get("a" * 32).speedup == pytest.approx(2.0)
    assert [e.signature for e in cache.ls()] == ["a" * 32]
    assert cache.remove("a" * 32) and cache.get("a" * 32) is None and not cache.remove("a" * 32)


def _writer(root, tmp, prefix, n):
    cache = KernelCache("sm_test", root=root)
    from pathlib import Path
    for i in range(n):
        # every process writes the shared signature too, so replacements race
        put(cache, Path(tmp), f"{prefix}{i:031d}", so=SO_BYTES * (2 + i))
        put(cache, Path(tmp), "s" * 32, so=SO_BYTES * 3)


def test_two_processes_write_at_once(cache, tmp_path):
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(cache.root, tmp_path, p, 6)) for p in "xy"]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert all(p.exitcode == 0 for p in procs)
    sigs = cache.signatures()
    assert len(sigs) == 13 and "s" * 32 in sigs
    assert all(problem is None for _, problem in cache.verify_all())
    leftovers = [p.name for p in cache.kernels.iterdir() if p.name.startswith(".")]
    assert leftovers == []   # no temporary or half-replaced folders survive


def test_truncated_library_is_flagged_for_rebuild(cache, tmp_path, caplog):
    put(cache, tmp_path, "a" * 32)
    so = cache.kernels / ("a" * 32) / "kernel.so"
    so.write_bytes(so.read_bytes()[:100])
    with caplog.at_level(logging.WARNING, logger="torch_htam"):
        e = cache.get("a" * 32)
    assert e.needs_rebuild and e.so_path is None and not e.usable()
    assert "kernel.so" in e.problem and "rebuilt" in caplog.text
    assert e.source == "// kernel " + "a" * 32 + "\n"   # the source is still trusted


def test_flipped_source_byte_is_ignored(cache, tmp_path, caplog):
    put(cache, tmp_path, "a" * 32)
    cu = cache.kernels / ("a" * 32) / "kernel.cu"
    data = bytearray(cu.read_bytes())
    data[3] ^= 0x01
    cu.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="torch_htam"):
        assert cache.get("a" * 32) is None
    assert "corrupt" in caplog.text and "kernel.cu" in caplog.text
    assert cache.verify_all() == [("a" * 32, "hash mismatch or missing: kernel.cu")]


def test_missing_manifest_and_tampered_record(cache, tmp_path):
    put(cache, tmp_path, "a" * 32)
    put(cache, tmp_path, "b" * 32)
    (cache.kernels / ("a" * 32) / "manifest.json").unlink()
    rec = cache.kernels / ("b" * 32) / "record.json"
    rec.write_text(rec.read_text().replace('"speedup": 1.5', '"speedup": 9.5'))
    assert cache.get("a" * 32) is None and cache.get("b" * 32) is None
    problems = dict(cache.verify_all())
    assert "manifest" in problems["a" * 32] and "record.json" in problems["b" * 32]


def test_cli(cache, tmp_path, capsys, monkeypatch):
    put(cache, tmp_path, "a" * 32, speedup=1.84)
    put(cache, tmp_path, "b" * 32)
    monkeypatch.setattr("torch_htam.cache._cli_cache", lambda arch: cache)
    assert cli_main(["ls"]) == 0
    out = capsys.readouterr().out
    assert "a" * 16 in out and "gelu_bias" in out and "1.84x" in out and "fp32" in out
    assert cli_main(["show", "aaaa"]) == 0
    shown = capsys.readouterr().out
    assert '"proposer": "expert"' in shown and '"speedup": 1.84' in shown
    assert cli_main(["show", "zzz"]) == 1
    assert cli_main(["verify"]) == 0 and "all entries intact" in capsys.readouterr().out
    (cache.kernels / ("b" * 32) / "kernel.so").write_bytes(b"junk")
    assert cli_main(["verify"]) == 1 and "kernel.so" in capsys.readouterr().out
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))   # not a tty: clear does not ask
    assert cli_main(["clear"]) == 0 and cache.ls() == []


def test_cli_clear_asks_on_a_tty(cache, tmp_path, capsys, monkeypatch):
    put(cache, tmp_path, "a" * 32)
    monkeypatch.setattr("torch_htam.cache._cli_cache", lambda arch: cache)
    tty = io.StringIO("n\n")
    tty.isatty = lambda: True
    monkeypatch.setattr(sys, "stdin", tty)
    assert cli_main(["clear"]) == 1 and len(cache.ls()) == 1
    assert cli_main(["clear", "--yes"]) == 0 and cache.ls() == []


def test_cli_arch_without_gpu(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HTAM_CACHE_DIR", str(tmp_path / "root"))
    monkeypatch.delenv("HTAM_ARCH", raising=False)
    monkeypatch.setattr("torch_htam.gpu.detect", lambda device=0: None)
    c = KernelCache("sm_80")
    put(c, tmp_path, "c" * 32)
    assert cli_main(["ls"]) == 1                                  # which arch? it says, and lists
    err = capsys.readouterr().err
    assert "pass --arch" in err and "sm_80" in err
    assert cli_main(["ls", "--arch", "sm_80"]) == 0
    out = capsys.readouterr().out
    assert "sm_80-" in out and "c" * 16 in out
    monkeypatch.setenv("HTAM_ARCH", "sm_80")
    assert cli_main(["ls"]) == 0 and "c" * 16 in capsys.readouterr().out
    assert cli_main(["ls", "--arch", "sm_90a"]) == 0 and "empty" in capsys.readouterr().out


# ---- shipped kernels (torch_htam/shipped/) ----------------------------------------------------------------------

def _seed_env(monkeypatch, tmp_path, verdicts):
    """A fake GPU, nvcc and evaluate: seeding logic is under test, not the compiler."""
    from torch_htam.build import BuildResult
    monkeypatch.setattr("torch_htam.gpu.detect", lambda device=0: object())
    monkeypatch.setattr("torch_htam.paths.nvcc_path", lambda: "/usr/bin/nvcc")
    built = []

    def fake_build(sources, arch=None, out_dir=None):
        built.extend(sources)
        out = []
        for i, src in enumerate(sources):
            so = tmp_path / f"seed{len(built)}_{i}.so"
            so.write_bytes(src.encode() * 10)
            out.append(BuildResult(True, str(so), f"h{i}"))
        return out
    monkeypatch.setattr("torch_htam.build.build_many", fake_build)
    monkeypatch.setattr("torch_htam.evaluation.evaluate",
                        lambda task, src: verdicts[task.signature], raising=False)
    return built


def test_install_shipped(cache, tmp_path, monkeypatch):
    from torch_htam.shipped_kernels import list_shipped, install_shipped, write_shipped
    seeds = tmp_path / "shipped"
    seeds.mkdir()
    assert install_shipped(cache, "sm_test", seeds) == {}            # an empty folder installs nothing
    # an LLM's kernels ship as source (the expert's as params: the next test)
    good = put(KernelCache("sm_src", root=tmp_path / "src"), tmp_path, "a" * 32, proposer="llm")
    bad = put(KernelCache("sm_src", root=tmp_path / "src"), tmp_path, "b" * 32, proposer="llm")
    write_shipped(seeds, "good", good)
    write_shipped(seeds, "bad", bad)
    (seeds / "incomplete").mkdir()
    assert [s.name for s in list_shipped(seeds)] == ["bad", "good"]

    monkeypatch.setattr("torch_htam.gpu.detect", lambda device=0: None)
    assert set(install_shipped(cache, "sm_test", seeds).values()) == {"not installed: no GPU to re-verify on"}
    assert cache.signatures() == []

    built = _seed_env(monkeypatch, tmp_path, {"a" * 32: make_eval(1.3),
                                              "b" * 32: Evaluation(False, "mismatch", "max abs err 0.2")})
    out = install_shipped(cache, "sm_test", seeds)
    assert out == {"good": "cached (1.30x)", "bad": "rejected: mismatch max abs err 0.2"}
    e = cache.get("a" * 32)
    assert e.usable() and e.record["provenance"]["proposer"] == "shipped:good"
    assert e.evaluation.speedup == pytest.approx(1.3)       # measured here, not the shipped 1.5
    assert cache.get("b" * 32) is None
    assert install_shipped(cache, "sm_test", seeds) == {} and len(built) == 2   # nothing is redone
    (seeds / "bad" / "kernel.cu").write_text("// fixed\n")
    assert list(install_shipped(cache, "sm_test", seeds)) == ["bad"] and len(built) == 3


def test_an_expert_kernel_ships_as_its_configuration(cache, tmp_path, monkeypatch):
    # rendered at install by today's templates: a template fix reaches shipped kernels
    from torch_htam.extract import task_from_source
    from torch_htam.policy import policy_for
    from torch_htam.proposers.expert.proposer import match_task
    from torch_htam.shipped_kernels import install_shipped, list_shipped, write_shipped
    path = Path(__file__).parents[1] / "bench" / "tasks" / "rw_layernorm_fp32.py"
    task = task_from_source(path.read_text(), path.stem)
    target = match_task(task, policy_for(task))
    params = dict(target.defaults)
    source = target.render(params)
    so = tmp_path / "k.so"
    so.write_bytes(SO_BYTES)
    entry = KernelCache("sm_src", root=tmp_path / "src").put(
        task, source, so, make_eval(1.2), {"proposer": "expert", "params": params, "tags": []})
    seeds = tmp_path / "shipped"
    out = write_shipped(seeds, "ln", entry)
    assert not (out / "kernel.cu").exists()
    [k] = list_shipped(seeds)
    assert k.source == source

    # a configuration today's expert no longer takes is reported, not installed, not raised
    record = json.loads((out / "record.json").read_text())
    record["params"] = {"no_such_knob": 1}
    (out / "record.json").write_text(json.dumps(record))
    monkeypatch.setattr("torch_htam.gpu.detect", lambda device=0: None)
    [why] = install_shipped(cache, "sm_test", seeds).values()
    assert why.startswith("not installed: the expert no longer renders"), why


def test_the_test_session_never_writes_the_users_cache():
    # conftest points HTAM_CACHE_DIR at a temporary directory before torch_htam is imported
    import tempfile
    from torch_htam import paths
    root = paths.cache_root().resolve()
    assert str(root).startswith(str(Path(tempfile.gettempdir()).resolve()))
    assert not str(root).startswith(str((Path.home() / ".cache").resolve()))


def test_cli_rm(cache, tmp_path, capsys, monkeypatch):
    put(cache, tmp_path, "ab" + "1" * 30)
    put(cache, tmp_path, "ab" + "2" * 30)
    put(cache, tmp_path, "cd" + "3" * 30)
    monkeypatch.setattr("torch_htam.cache._cli_cache", lambda arch: cache)
    assert cli_main(["rm", "ab"]) == 1                       # ambiguous: says which
    err = capsys.readouterr().err
    assert "ab" + "1" * 14 in err and "ab" + "2" * 14 in err and len(cache.signatures()) == 3
    assert cli_main(["rm", "ff"]) == 1 and "no cache entry" in capsys.readouterr().err
    assert cli_main(["rm", "ab2"]) == 0 and "removed" in capsys.readouterr().out
    assert cache.signatures() == ["ab" + "1" * 30, "cd" + "3" * 30]
    assert cli_main(["rm", "cd" + "3" * 30]) == 0            # a full signature
    assert cache.signatures() == ["ab" + "1" * 30]
    (cache.kernels / ("ab" + "1" * 30) / "kernel.cu").write_text("tampered")
    assert cli_main(["verify"]) == 1
    assert cli_main(["rm", "ab1"]) == 0 and cache.signatures() == []   # a corrupt entry too
    assert cli_main(["rm", ""]) == 1


def test_remove_prefix_holds_the_writers_lock(cache, tmp_path, monkeypatch):
    put(cache, tmp_path, "a" * 32)
    seen = []
    real = cache._lock
    monkeypatch.setattr(cache, "_lock", lambda exclusive: seen.append(exclusive) or real(exclusive))
    assert cache.remove_prefix("aaa") == ("a" * 32, ["a" * 32])
    assert seen == [True] and cache.signatures() == []


# ---- read-only commands write nothing; a typo'd arch is an error, not a new cache -----------------

def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


@pytest.mark.parametrize("arch", ["banana", "sm90a", "sm_9", "sm_90x", "sm_1000", "SM_90A", "sm_90a "])
def test_cli_rejects_an_unknown_arch_and_creates_nothing(tmp_path, capsys, monkeypatch, arch):
    monkeypatch.setenv("HTAM_CACHE_DIR", str(tmp_path / "root"))
    for cmd in (["ls"], ["verify"], ["show", "ab"], ["rm", "ab"], ["clear", "--yes"]):
        assert cli_main([*cmd, "--arch", arch]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"--arch {arch!r}: not a GPU arch" in err and "sm_90a" in err
    monkeypatch.delenv("HTAM_ARCH", raising=False)
    monkeypatch.setattr("torch_htam.gpu.detect", lambda device=0: None)
    monkeypatch.setenv("HTAM_ARCH", arch)
    assert cli_main(["ls"]) == 1 and "$HTAM_ARCH" in capsys.readouterr().err
    assert not (tmp_path / "root").exists()


@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100a", "sm_120", "sm_120f"])
def test_cli_takes_real_archs(tmp_path, capsys, monkeypatch, arch):
    monkeypatch.setenv("HTAM_CACHE_DIR", str(tmp_path / "root"))
    assert cli_main(["ls", "--arch", arch]) == 0 and "empty" in capsys.readouterr().out


def test_read_only_cache_commands_create_no_folder_or_file(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HTAM_CACHE_DIR", str(tmp_path / "root"))
    for cmd in (["ls"], ["verify"], ["show", "ab"], ["rm", "ab"], ["clear", "--yes"]):
        cli_main([*cmd, "--arch", "sm_90a"])
    assert not (tmp_path / "root").exists()
    # a cache copied in from another machine, without its lock file: read as it is, left as it was
    src = KernelCache("sm_src", root=tmp_path / "src")
    put(src, tmp_path, "a" * 32)
    cache = KernelCache("sm_90a")
    cache.put_entry(src.get("a" * 32))
    (cache.root / ".lock").unlink()
    before = _files(cache.root)
    for cmd in (["ls"], ["verify"], ["show", "aaaa"]):
        assert cli_main([*cmd, "--arch", "sm_90a"]) == 0
    assert "a" * 16 in capsys.readouterr().out
    assert cache.get("a" * 32).usable() and _files(cache.root) == before


def test_writes_still_take_the_lock(cache, tmp_path):
    put(cache, tmp_path, "a" * 32)
    assert (cache.root / ".lock").is_file()
