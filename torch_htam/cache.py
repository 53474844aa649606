"""The per-arch kernel cache: verified kernels keyed by task signature, integrity-checked on read.

    <arch dir>/                      paths.arch_dir(arch), e.g. ~/.cache/torch_htam/sm_90a-torch2.11.0-...
      .lock                          fcntl lock: writers exclusive, readers shared
      kernels/<signature>/
        kernel.cu                    the source (what verification saw)
        kernel.so                    the library built from it for this arch and toolchain
        record.json                  task, evaluation (policy, errors, times), tags/params, provenance
        manifest.json                sha256 of the three files above

A write goes into a temporary folder next to the entry and is renamed into place, so a reader sees
either the old entry, no entry, or the new one, never a half-written file. A bundle (bundle.py) uses
the same layout, so `KernelCache(root=bundle_dir)` reads it with the same checks.

    >>> cache = KernelCache("sm_90a")
    >>> entry = cache.put(task, source, "build/ab12.so", evaluation, {"proposer": "expert"})
    >>> cache.get(task.signature).speedup
    1.84
"""
from __future__ import annotations

import contextlib
import functools
import datetime
import fcntl
import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from torch_htam import paths
from torch_htam.evaluation import Evaluation
from torch_htam.task import Task

log = logging.getLogger("torch_htam")

FILES = ("kernel.cu", "kernel.so", "record.json")   # what manifest.json vouches for
MANIFEST = "manifest.json"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@dataclass
class Entry:
    """One cache entry as read back. problem: None when every hash matched, else what is wrong.

    needs_rebuild: the library is missing or corrupt but source and record hash right; `so_path` is
    then None so nothing can load it, and the entry must be rebuilt and re-verified before use.
    """
    signature: str
    path: Path
    record: dict[str, Any]
    problem: str | None = None
    needs_rebuild: bool = False

    @property
    def so_path(self) -> Path | None:
        return None if self.needs_rebuild or self.problem else self.path / "kernel.so"

    @property
    def source(self) -> str:
        return (self.path / "kernel.cu").read_text()

    @property
    def task(self) -> Task:
        return Task.from_json(self.record["task"])

    @functools.cached_property
    def evaluation(self) -> Evaluation:
        """The verdict recorded with the kernel; a record without one reads as never verified."""
        ev = self.record.get("evaluation")
        return Evaluation.from_json(ev) if ev else Evaluation(False, "unverified", "the record has no evaluation")

    @property
    def name(self) -> str:
        return self.record.get("task", {}).get("name", "?")

    @property
    def speedup(self) -> float | None:
        return self.evaluation.speedup

    @property
    def policy(self) -> str:
        return self.evaluation.policy.get("name", "?")

    @property
    def date(self) -> str:
        return self.record.get("provenance", {}).get("date", "?")

    @property
    def size_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.path.iterdir() if p.is_file())

    def usable(self, min_speedup: float = 1.0) -> bool:
        """Intact, verified correct, and at least `min_speedup` times faster than the original."""
        ev = self.evaluation
        return self.so_path is not None and ev.correct and (ev.speedup or 0.0) >= min_speedup


def default_arch() -> str:
    """The nvcc target of this machine's GPU, or $HTAM_ARCH; a clear error when there is neither."""
    return _arch_and_source()[0]


def _arch_and_source() -> tuple[str, str]:
    """(this machine's GPU arch, else $HTAM_ARCH; where it came from, as an error names it)."""
    from torch_htam import gpu
    info = gpu.detect()
    if info:
        return info.arch, "GPU arch"
    if os.environ.get("HTAM_ARCH"):
        return os.environ["HTAM_ARCH"], "$HTAM_ARCH"
    raise RuntimeError("no CUDA GPU found and HTAM_ARCH is not set: pass arch= (e.g. 'sm_90a') "
                       "to say which architecture's kernel cache to use")


def command_arch(arch: str | None) -> str:
    """The arch a command's --arch means: it, else default_arch(); checked as an nvcc target
    (ValueError naming where it came from: --arch, $HTAM_ARCH or the GPU); RuntimeError where
    there is none. Shared by `torch-htam cache` and `torch-htam libraries`."""
    return paths.check_arch(*((arch, "--arch") if arch else _arch_and_source()))


class KernelCache:
    """Kernels for one GPU arch and toolchain. root overrides the folder (a bundle, a test dir).

        >>> KernelCache("sm_90a").ls()
        [Entry(signature='3f2a...', ...), ...]
    """

    def __init__(self, arch: str | None = None, root: str | Path | None = None):
        self.arch = arch if arch is not None or root is not None else default_arch()
        self.root = Path(root) if root is not None else paths.arch_dir(self.arch)
        self.kernels = self.root / "kernels"

    def __repr__(self) -> str:
        return f"KernelCache(arch={self.arch!r}, root='{self.root}')"

    @contextlib.contextmanager
    def _lock(self, exclusive: bool) -> Iterator[None]:
        # NOTE: flock is per open file description, so each process (and each call) opens its own.
        path = self.root / ".lock"
        if exclusive:
            self.root.mkdir(parents=True, exist_ok=True)
        elif not path.exists():
            # A reader creates nothing (`cache ls` must not make a folder). Without a lock file no
            # writer has replaced an entry here yet (the first write makes it), so nothing to guard.
            yield
            return
        with open(path, "a+" if exclusive else "r") as f:
            fcntl.flock(f, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    # ---- reading -------------------------------------------------------------------------------

    def _read(self, signature: str) -> Entry | None:
        """The entry with its integrity verdict; None only when there is no such entry at all."""
        d = self.kernels / signature
        if not d.is_dir():
            return None
        try:
            manifest = json.loads((d / MANIFEST).read_text())
            want = manifest["files"]
        except (OSError, ValueError, KeyError) as e:
            return Entry(signature, d, {}, problem=f"manifest.json unreadable ({type(e).__name__})")
        bad = [name for name in FILES
               if not (d / name).is_file() or sha256_file(d / name) != want.get(name)]
        try:
            record = json.loads((d / "record.json").read_text()) if "record.json" not in bad else {}
        except ValueError:
            record, bad = {}, bad + ["record.json"]
        if record and record.get("signature") != signature:
            return Entry(signature, d, record, problem=f"record is for {record.get('signature')!r}")
        if not bad:
            return Entry(signature, d, record)
        problem = "hash mismatch or missing: " + ", ".join(bad)
        # A good source and record can be rebuilt and re-verified; the library alone is never trusted.
        return Entry(signature, d, record, problem=problem, needs_rebuild=(bad == ["kernel.so"]))

    def get(self, signature: str) -> Entry | None:
        """The intact entry for `signature`; a source-intact entry flagged needs_rebuild; else None.

        A corrupt or tampered entry is reported with a warning and never returned as loadable.
        """
        with self._lock(exclusive=False):
            entry = self._read(signature)
        if entry is None or entry.problem is None:
            return entry
        if entry.needs_rebuild:
            log.warning("torch_htam cache: %s: %s; its source is intact, so it will be rebuilt and "
                        "re-verified before use (%s)", signature[:16], entry.problem, entry.path)
            return entry
        log.warning("torch_htam cache: ignoring corrupt entry %s: %s. Remove it with "
                    "`torch-htam cache rm %s` or delete %s", signature[:16], entry.problem,
                    signature[:16], entry.path)
        return None

    def signatures(self) -> list[str]:
        if not self.kernels.is_dir():
            return []
        return sorted(p.name for p in self.kernels.iterdir() if p.is_dir() and not p.name.startswith("."))

    def ls(self) -> list[Entry]:
        """Every entry, corrupt ones included (their `problem` says what is wrong)."""
        with self._lock(exclusive=False):
            return [e for s in self.signatures() if (e := self._read(s)) is not None]

    def verify_all(self) -> list[tuple[str, str | None]]:
        """(signature, problem or None) for every entry: the manifest hashes, file by file."""
        return [(e.signature, e.problem) for e in self.ls()]

    # ---- writing -------------------------------------------------------------------------------

    def put(self, task: Task, source: str, so_path: str | Path, evaluation: Evaluation,
            meta: dict[str, Any] | None = None) -> Entry:
        """Store a verified kernel, replacing any entry of the same signature, atomically.

        meta: "tags" and "params" (the proposer's) are kept as such; everything else (proposer, gpu,
        steps, ...) goes into the record's provenance next to version, date, arch and toolchain.
        """
        record = make_record(task, evaluation, meta, arch=self.arch)
        return self._write(task.signature, lambda tmp: write_entry_files(tmp, source, Path(so_path), record))

    def put_entry(self, entry: Entry) -> Entry:
        """Copy an intact entry (from a bundle or another cache) into this one, files as they are."""
        if entry.problem is not None:
            raise ValueError(f"refusing to copy entry {entry.signature[:16]}: {entry.problem}")
        def copy(tmp: Path) -> None:
            for name in FILES + (MANIFEST,):
                shutil.copy2(entry.path / name, tmp / name)
        return self._write(entry.signature, copy)

    def _write(self, signature: str, fill) -> Entry:
        """Atomically (re)place one entry: fill(tmp_dir) writes its files into a temp folder,
        which replaces kernels/<signature> under the exclusive lock; the result is read back."""
        self.kernels.mkdir(parents=True, exist_ok=True)
        with self._lock(exclusive=True):
            _clear_orphans(self.kernels)
            tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{signature[:16]}-", dir=self.kernels))
            try:
                fill(tmp)
                _replace_dir(tmp, self.kernels / signature)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            out = self._read(signature)
        assert out is not None and out.problem is None, out
        return out

    def remove(self, signature: str) -> bool:
        with self._lock(exclusive=True):
            d = self.kernels / signature
            if not d.is_dir():
                return False
            shutil.rmtree(d)
            return True

    def matching(self, prefix: str) -> list[str]:
        """The signatures that start with `prefix` (just `prefix` when it is a whole signature)."""
        sigs = self.signatures()
        return [prefix] if prefix in sigs else [s for s in sigs if s.startswith(prefix)]

    def remove_prefix(self, prefix: str) -> tuple[str | None, list[str]]:
        """Remove the one entry whose signature is or starts with `prefix`, under the writers' lock
        (so no put() of it is half done and nobody reads it meanwhile).

        Returns (the removed signature, [it]); (None, matches) when none or several match, and
        then nothing is removed. Corrupt entries are removed like intact ones.
        """
        if not prefix or not self.kernels.is_dir():   # nothing to remove: create no folder either
            return None, []
        with self._lock(exclusive=True):
            matches = self.matching(prefix)
            if len(matches) != 1:
                return None, matches
            shutil.rmtree(self.kernels / matches[0])
            return matches[0], matches

    def clear(self) -> int:
        """Remove every entry (and stray temporaries); returns how many entries there were."""
        with self._lock(exclusive=True):
            n = len(self.signatures())
            if self.kernels.is_dir():
                shutil.rmtree(self.kernels)
            return n


def make_record(task: Task, evaluation: Evaluation, meta: dict[str, Any] | None,
                arch: str | None) -> dict[str, Any]:
    from torch_htam.version import __version__
    meta = dict(meta or {})
    tags, params = meta.pop("tags", []), meta.pop("params", {})
    provenance = {"torch_htam": __version__,
                  "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  "arch": arch, "toolchain": paths.toolchain_key(), **meta}
    return {"signature": task.signature, "task": task.to_json(), "evaluation": evaluation.to_json(),
            "tags": list(tags), "params": dict(params), "provenance": provenance}


def write_entry_files(d: Path, source: str, so_path: Path, record: dict[str, Any]) -> None:
    """kernel.cu, kernel.so, record.json and their manifest into folder `d` (fsynced)."""
    (d / "kernel.cu").write_text(source)
    shutil.copyfile(so_path, d / "kernel.so")
    (d / "record.json").write_text(json.dumps(record, indent=1, sort_keys=True, default=str))
    manifest = {"format": paths.FORMAT_VERSION, "files": {n: sha256_file(d / n) for n in FILES}}
    (d / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    for name in FILES + (MANIFEST,):
        with open(d / name, "rb") as f:
            os.fsync(f.fileno())


def _clear_orphans(kernels: Path) -> None:
    """What a writer killed mid-put left (a killed Ray or pool worker, the OOM killer): writers make
    and remove .tmp-*/.old-* folders only under the exclusive lock, so any seen while holding it
    are orphans. A temporary is removed; an entry set aside but not yet replaced goes back."""
    for p in kernels.glob(".tmp-*"):
        shutil.rmtree(p, ignore_errors=True)
    for p in kernels.glob(".old-*"):
        dest = kernels / p.name[len(".old-"):].rpartition("-")[0]
        if dest.name and not dest.exists():
            os.replace(p, dest)
        else:
            shutil.rmtree(p, ignore_errors=True)


def _replace_dir(new: Path, dest: Path) -> None:
    # NOTE: rename(2) cannot replace a non-empty directory, so the old entry is renamed aside first;
    # callers hold the exclusive lock, and readers take the shared one, so nobody sees the gap.
    old = None
    if dest.exists():
        old = dest.with_name(f".old-{dest.name}-{os.getpid()}")
        os.replace(dest, old)
    os.replace(new, dest)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# ---- torch-htam cache ... -------------------------------------------------------------------------
# The argparse side lives in cli.py (so `--help` imports nothing heavy); these run the subcommands.

class CacheCliError(Exception):
    """A `torch-htam cache` command that cannot be done; the CLI prints `error: <message>`, exit 1."""


def _cli_cache(arch: str | None) -> KernelCache:
    """The cache for --arch, else this GPU's arch, else $HTAM_ARCH; else an error naming --arch.
    An arch that is not an nvcc target (a typo) is an error, not a new empty cache."""
    try:
        return KernelCache(command_arch(arch))
    except ValueError as e:
        raise CacheCliError(str(e)) from None
    except RuntimeError:
        root = paths.cache_root()
        found = sorted({p.name.split("-")[0] for p in root.iterdir() if (p / "kernels").is_dir()}
                       ) if root.is_dir() else []
        raise CacheCliError("no CUDA GPU detected and $HTAM_ARCH is not set: pass --arch (e.g. "
                            "--arch sm_90a) to say which arch's kernel cache to use"
                            + (f"; {root} has caches for: {', '.join(found)}" if found else "")) from None


def _fmt_size(n: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _cmd_ls(cache: KernelCache) -> int:
    entries = cache.ls()
    if not entries:
        print(f"{cache.root}: empty, no kernels cached for {cache.arch} with this toolchain; "
              "fill it with `torch-htam optimize MODEL`")
        return 0
    print(f"{cache.root}  ({len(entries)} kernels)")
    print(f"  {'signature':16}  {'task':28}  {'speedup':>7}  {'policy':6}  {'date':25}  {'size':>9}  status")
    for e in entries:
        sp = f"{e.speedup:.2f}x" if e.speedup else "-"
        status = "ok" if e.problem is None else ("REBUILD: " if e.needs_rebuild else "CORRUPT: ") + e.problem
        print(f"  {e.signature[:16]:16}  {e.name[:28]:28}  {sp:>7}  {e.policy:6}  {e.date:25}  "
              f"{_fmt_size(e.size_bytes):>9}  {status}")
    return 0


def _no_single_match(cache: KernelCache, sig: str, matches: list[str]) -> CacheCliError:
    if not matches:
        return CacheCliError(f"no cache entry matches {sig!r} in {cache.root}; "
                             "`torch-htam cache ls` lists them")
    return CacheCliError(f"{sig!r} matches {len(matches)} cache entries, give more of the signature: "
                         + ", ".join(m[:16] for m in matches))


def _cmd_show(cache: KernelCache, sig: str) -> int:
    with cache._lock(exclusive=False):
        matches = cache.matching(sig) if sig else []
        e = cache._read(matches[0]) if len(matches) == 1 else None
    if e is None:
        raise _no_single_match(cache, sig, matches)
    print(f"# {e.path}" + (f"\n# PROBLEM: {e.problem}" if e.problem else ""))
    record = dict(e.record)
    if "task" in record:  # the reference source is long and has its own file in `plan --export`
        record["task"] = {k: v for k, v in record["task"].items() if k != "source"}
    print(json.dumps(record, indent=2, sort_keys=True))
    return 0


def _cmd_rm(cache: KernelCache, sig: str) -> int:
    removed, matches = cache.remove_prefix(sig)
    if removed is None:
        raise _no_single_match(cache, sig, matches)
    print(f"removed {removed} from {cache.root}")
    return 0


def _cmd_clear(cache: KernelCache, yes: bool) -> int:
    n = len(cache.signatures())
    if n == 0:
        print(f"{cache.root}: the cache is empty")
        return 0
    if not yes and sys.stdin.isatty():
        if input(f"remove {n} cached kernels from {cache.root}? [y/N] ").strip().lower() not in ("y", "yes"):
            print("nothing removed")
            return 1
    print(f"removed {cache.clear()} cached kernels")
    return 0


def _cmd_verify(cache: KernelCache) -> int:
    bad = 0
    for sig, problem in cache.verify_all():
        print(f"{sig[:16]}  {'ok' if problem is None else problem}")
        bad += problem is not None
    if bad:
        print(f"{bad} entr{'y' if bad == 1 else 'ies'} with problems; remove one with "
              "`torch-htam cache rm SIG` (or all with `torch-htam cache clear`)")
    else:
        print("all entries intact")
    return 1 if bad else 0


def run_cli(args) -> int:
    """Run a parsed `torch-htam cache ...` (cli.py builds the parser): args.cache_cmd, args.arch,
    args.signature (show, rm), args.yes (clear). Raises CacheCliError for what the user must fix."""
    cache = _cli_cache(args.arch)
    if args.cache_cmd == "ls":
        return _cmd_ls(cache)
    if args.cache_cmd == "show":
        return _cmd_show(cache, args.signature)
    if args.cache_cmd == "rm":
        return _cmd_rm(cache, args.signature)
    if args.cache_cmd == "clear":
        return _cmd_clear(cache, args.yes)
    return _cmd_verify(cache)
