"""Shared by the bench scripts: where a figure came from (device, date, commit) and appending a
section to bench/RESULTS.md."""
from __future__ import annotations

import datetime
import os
import subprocess
import sys
from pathlib import Path

RESULTS = Path(__file__).with_name("RESULTS.md")


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


def append(title: str, body: str, command: str | None = None) -> None:
    """Append `## title: device, date, commit` + the command + body (markdown) to RESULTS.md."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cmd = command or "python3 " + " ".join(sys.argv)
    with RESULTS.open("a") as f:
        f.write(f"\n## {title}: {device()}, {now}, commit {commit()}\n\n`{cmd}`\n\n{body.rstrip()}\n")
