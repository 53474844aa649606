"""Several rows at once on a multi-GPU host: each row's process gets a lane, one GPU and an equal
share of the host's cores with Inductor and torch_htam caches of its own, so it runs as on a
one-GPU machine of that share (a 4-GPU H100 host of 64 cores: four 16-core "machines").

    python3 bench/bench_zoo.py gpt2:bf16 bert:bf16 llama:bf16 vit:bf16 --lanes 4
    (bench_floor.py and bench_serve.py take --lanes too: bench_floor.add_run_flags)

What a lane does not give: the rows still share the host's memory bandwidth, PCIe and disk, so
absolute figures are noisier than a machine alone (ResNet-18's torch.compile read 1.269 ms in one
such run and 2.069 ms in the next, zoo-20261127-215814 / -221456); the arms of a row are timed
interleaved, so its ratios are compared on the same conditions. Each row records its lane
("lane"). Standard library only.
"""
from __future__ import annotations

import os
import queue
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable


@dataclass(frozen=True)
class Lane:
    gpu: int                   # the CUDA device index the row's process sees as its only GPU
    cpus: tuple[int, ...]      # the cores it (and every process it starts) may run on
    cache_dir: str             # its Inductor and torch_htam caches live under this folder

    def env(self, base: dict | None = None) -> dict:
        """The row process's environment: its GPU alone, its own caches (a cold start, as a fresh
        machine would have, and no lane reading another's files half written)."""
        env = dict(os.environ if base is None else base)
        env.update(CUDA_VISIBLE_DEVICES=str(self.gpu),
                   TORCHINDUCTOR_CACHE_DIR=str(Path(self.cache_dir) / "inductor"),
                   HTAM_CACHE_DIR=str(Path(self.cache_dir) / "htam"))
        return env

    def pin(self, pid: int) -> None:
        """Pin process `pid` to the lane's cores; the processes it starts after this inherit them
        (set right after the start: the child takes a second to import torch before it compiles)."""
        os.sched_setaffinity(pid, self.cpus)

    def to_json(self) -> dict:
        return {"gpu": self.gpu, "cpus": f"{self.cpus[0]}-{self.cpus[-1]}" if self.cpus else ""}


def start(cmd: list[str], lane: Lane | None, env: dict | None = None) -> subprocess.Popen:
    """cmd in a process group of its own (a row's process: its group is ended with it), with a
    lane on the lane's GPU, cores and caches."""
    proc = subprocess.Popen(cmd, start_new_session=True, env=lane.env(env) if lane is not None else env)
    if lane is not None:
        lane.pin(proc.pid)
    return proc


def split(n: int, cache_root: str, cpus: list[int] | None = None) -> list[Lane]:
    """n lanes over GPUs 0..n-1, the usable cores (this process's affinity) cut into n equal,
    contiguous shares (the remainder unused, so every lane has as many)."""
    if n < 1:
        raise ValueError(f"--lanes must be at least 1, not {n}")
    cpus = sorted(os.sched_getaffinity(0)) if cpus is None else sorted(cpus)
    per = len(cpus) // n
    if per < 1:
        raise ValueError(f"{n} lanes need at least {n} CPU cores; this process may use {len(cpus)}")
    return [Lane(i, tuple(cpus[i * per:(i + 1) * per]), str(Path(cache_root) / f"lane{i}")) for i in range(n)]


def run(names: list[str], lanes: list[Lane], run_one: Callable[[str, Lane], dict],
        done: Callable[[int, dict], None]) -> None:
    """run_one(name, lane) for every name, at most one row per lane at a time, each row on the
    next free lane; done(index of its name, row) as each finishes (called from one thread at a
    time). A run_one that raises is the caller's to catch: it ends the run."""
    free: queue.Queue = queue.Queue()
    for lane in lanes:
        free.put(lane)
    lock = threading.Lock()
    failures: list[BaseException] = []

    def one(i: int, name: str, lane: Lane) -> None:
        try:
            row = run_one(name, lane)
            with lock:
                done(i, row)
        except BaseException as e:  # noqa: BLE001 - raised again in the caller's thread
            failures.append(e)
        finally:
            free.put(lane)

    threads = []
    for i, name in enumerate(names):
        lane = free.get()                 # wait for a lane to come free
        if failures:
            break
        t = threading.Thread(target=one, args=(i, name, lane), daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    if failures:
        raise failures[0]
