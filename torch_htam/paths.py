"""Where torch_htam keeps things, and the toolchain key that partitions them.

    <root>/                         platformdirs.user_cache_dir("torch_htam") or $HTAM_CACHE_DIR
      <arch>-<toolchain>/           e.g. sm_90a-torch2.11.0-cu13.0-nvcc13.0-f1
        kernels/<signature>/        cache entries (cache.py)
        build/                      candidate .so files by content hash (build.py)
        htg.json                    the HTG memory before it moved to htg/ (read once, copied)
        trajectories/               search logs, JSONL (search.py)
      launcher/<torch version>/     the C++ launcher extension (launcher.py)
      htg/<arch>-<proposer>.json    the HTG memory (htg.py): per GPU arch and proposer, not per
                                    toolchain, so a torch or CUDA upgrade keeps the experience

    >>> paths.arch_dir("sm_90a")
    PosixPath('/root/.cache/torch_htam/sm_90a-torch2.11.0-cu13.0-nvcc13.0-f1')
"""
from __future__ import annotations

import functools
import glob
import os
import re
import shutil
import subprocess
from pathlib import Path

FORMAT_VERSION = 1   # bump when the cache entry layout or the kernel ABI changes

# An nvcc GPU target: sm_80, sm_86, sm_89, sm_90, sm_90a, sm_100a, sm_120, sm_120f, ...
ARCH_PATTERN = re.compile(r"sm_\d{2,3}[af]?")


def cache_root() -> Path:
    env = os.environ.get("HTAM_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    try:
        import platformdirs
        return Path(platformdirs.user_cache_dir("torch_htam"))
    except ImportError:  # NOTE: the GPU image lacks platformdirs; follow its XDG convention.
        return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "torch_htam"


@functools.lru_cache(maxsize=None)
def nvcc_path() -> str | None:
    """nvcc from $CUDA_HOME, then PATH, then /usr/local/cuda; None if there is no compiler."""
    for cand in (os.environ.get("CUDA_HOME") and os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc"),
                 shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if cand and os.path.exists(cand):
            return cand
    return None


@functools.lru_cache(maxsize=None)
def nvcc_version() -> str:
    nvcc = nvcc_path()
    if nvcc is None:
        return "none"
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release (\d+\.\d+)", out)
    return m.group(1) if m else "unknown"


def toolchain_key() -> str:
    """torch, CUDA runtime and nvcc versions plus our format: anything that can change a binary."""
    import torch
    cuda = torch.version.cuda or "cpu"
    return f"torch{torch.__version__.split('+')[0]}-cu{cuda}-nvcc{nvcc_version()}-f{FORMAT_VERSION}"


def check_arch(arch: str, source: str = "--arch") -> str:
    """`arch` if it names an nvcc GPU target, else ValueError (one line: where it came from, what
    to write). Checked where a user types it: a typo must not become a cache folder of its own."""
    if not isinstance(arch, str) or not ARCH_PATTERN.fullmatch(arch):
        raise ValueError(f"{source} {arch!r}: not a GPU arch; use an nvcc target such as sm_80, "
                         "sm_86, sm_89, sm_90a, sm_100a or sm_120")
    return arch


def arch_dir(arch: str) -> Path:
    return cache_root() / f"{arch}-{toolchain_key()}"


def memory_path(arch: str, proposer: str) -> Path:
    """The HTG memory of one GPU arch and proposer (Proposer.name). Experience is about kernels on
    the GPU, not about the binaries a toolchain makes, so it is not keyed by toolchain. On first
    use (no file yet) the newest toolchain-keyed <arch>-<toolchain>/htg.json, where the memory was
    kept before, is copied there.

    >>> paths.memory_path("sm_90a", "expert")
    PosixPath('/root/.cache/torch_htam/htg/sm_90a-expert.json')
    """
    root = cache_root()
    path = root / "htg" / f"{arch}-{re.sub(r'[^A-Za-z0-9._+-]', '_', proposer)}.json"
    if not path.exists():
        # NOTE: toolchain keys start with "torch", so sm_90 does not pick up sm_90a's directories
        old = [p for p in root.glob(f"{glob.escape(arch)}-torch*/htg.json") if p.is_file()]
        if old:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".migrating")
            shutil.copyfile(max(old, key=lambda p: p.stat().st_mtime), tmp)
            os.replace(tmp, path)   # NOTE: never a half-copied memory at the final name
    return path



def write_json_atomic(path: Path, data) -> None:
    """JSON to a tmp file beside `path`, fsync, os.replace: a reader (or a crash) sees the old
    file or the new one, never half of one."""
    import json
    import tempfile
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
