"""Shared by the bench scripts: where a figure came from (device, date, commit, command) and
writing one run's raw results as JSON to bench/results/.

Each run is one file, bench/results/<suite>-<YYYYmmdd-HHMMSS>.json, written once and never edited:

    {"suite", "date" (ISO 8601, UTC), "commit", "device", "torch", "command", ...payload}

The payload holds the figures as measured (numbers, not formatted text), normally a "rows" list of
dicts. bench/RESULTS.md is generated from these files by bench/render.py.
"""
from __future__ import annotations

import datetime
import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = Path(__file__).resolve().with_name("results")


def geomean(xs: list[float]) -> float | None:
    """The geometric mean of the positive values of xs (None and non-positive left out); None
    where none is left."""
    xs = [x for x in xs if x is not None and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def commit() -> str:
    """HTAM_COMMIT (device runs copy no .git), else git, else "unknown"."""
    if os.environ.get("HTAM_COMMIT"):
        return os.environ["HTAM_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).parent, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def device() -> str:
    import torch
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def command(argv: list[str] | None = None) -> str:
    """`python3 <script> <args>` as run, the script's path relative to the repository when inside it."""
    argv = list(sys.argv if argv is None else argv)
    if argv:
        try:
            argv[0] = str(Path(argv[0]).resolve().relative_to(ROOT))
        except ValueError:
            pass
    return " ".join(["python3", *argv])


def write(suite: str, payload: dict, results_dir: Path | None = None, cmd: str | None = None,
          path: Path | None = None) -> Path:
    """Write one run's results to <results_dir>/<suite>-<UTC YYYYmmdd-HHMMSS>.json; its path.

    The file holds suite, date, commit, device, torch version and command, then `payload` as given
    (values JSON cannot hold, such as Paths, are written as strings). path: a file this run wrote
    before, rewritten with the run's results so far (a run cut short keeps what it measured).
    """
    import torch
    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    data = {"suite": suite, "date": now.isoformat(), "commit": commit(), "device": device(),
            "torch": torch.__version__, "command": cmd or command(), **payload}
    folder = Path(results_dir) if results_dir is not None else RESULTS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    if path is None:
        stem = f"{suite}-{now.strftime('%Y%m%d-%H%M%S')}"
        path, n = folder / f"{stem}.json", 1
        while path.exists():              # two runs of one suite in one second keep both files
            n += 1
            path = folder / f"{stem}-{n}.json"
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")
    print(f"wrote {path} (regenerate bench/RESULTS.md: python3 bench/render.py)", file=sys.stderr)
    return path
