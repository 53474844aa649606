"""A held-out task set for bench/anytime.py: the regions of some zoo models (train) and of OTHER
zoo models (test), as KernelBench files, on CPU.

    python3 bench/heldout.py                                   # the default split -> bench/heldout/
    python3 bench/heldout.py --train llama:bf16 bert:bf16 --test gpt2:bf16 --out /tmp/h
    python3 bench/heldout.py --small --out /tmp/h              # tiny models (what the CPU test runs)

Then, on a GPU: measure both sets and replay test with memory learned from train only:
    python3 bench/anytime.py bench/heldout/train --table-only --out train.json
    python3 bench/anytime.py bench/heldout/test --table-only --out test.json
    python3 bench/anytime.py --replay test.json --train train.json

A GPU hour buys about 90 tables (about 40 s each at --limit 24 on an H100), so a run may measure a
sample, split over GPUs: --sample prints a set's files, drawn per kind in proportion to the set
(each kind at least once, seeded), in an order that alternates kinds so shards are alike:
    python3 bench/heldout.py --sample test 56 --shard 0/4     # every 4th file of the sample

Each row of bench/model_zoo.py ("convnext:bf16") is built full size (model_zoo.make, seeded) on
CPU and cut into its tasks (extract.extract, as `torch-htam plan` does). The rules, in order:
  - one task per signature in a set: the first row (in the given order) that has it keeps it,
    the later rows of the same set are listed in its "also";
  - every task's file is loaded as anytime loads it (extract.task_from_source): its file
    signature, how bench/tasks files are signed, can differ from the region's (torch.export adds
    _assert_tensor_metadata nodes after a dtype cast), so the two rules below match either one;
  - a task whose signature is one of --exclude's files (default bench/tasks/) is dropped from
    both sets;
  - a test task whose signature a train region has (measurable or not) is dropped from test: the
    test set is what the train models never showed (there it would be a cache hit, no search);
  - a task anytime's measure cannot prepare (its file does not load, or the expert proposer has
    no target for it, or no setting renders) is dropped: one such file would end the GPU run.
    anytime.measure itself runs on each file, with an evaluator that times nothing.
A row that fails to build or capture is listed in "skipped" with the error, and the run goes on.

Writes, under --out (default bench/heldout/):
  train/, test/   the task files, by task.export_tasks (<kind>_<ops>_<signature>.py, tasks.json)
  manifest.json   command, small, seconds (the whole run), train_rows, test_rows, excluded
                  (signatures read from --exclude), models (per row: seconds to build and
                  extract, tasks, regions), sets {"train": [...], "test": [...]} with per task:
                  file, signature (the region's), file_signature, kind, row, count (regions of
                  that signature in row), regions (all the row's regions), also; kinds
                  {set: {kind: n}}; dropped [{set, row, signature, kind, why}]; skipped
                  [{row, why}]; bytes (of the task files)
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
import anytime     # noqa: E402
import model_zoo   # noqa: E402

from torch_htam.extract import extract, task_from_source   # noqa: E402
from torch_htam.task import export_tasks                    # noqa: E402

# Split by family: no family has a row in both sets. bf16 rows only (they give 40+ test tasks).
TRAIN = ["llama:bf16", "bert:bf16", "resnet50:bf16", "swin:bf16", "unet:bf16", "whisper:bf16"]
TEST = ["gpt2:bf16", "t5:bf16", "convnext:bf16", "mobilenetv3:bf16", "vit:bf16", "mlp_mixer:bf16",
        "resnet18:bf16"]
LIMIT = 24   # settings per task anytime measures (its --limit default); the dry run renders as many


class DryEvaluator:
    """anytime.measure's evaluator that times nothing: it keeps how many candidate sources the
    task's search space rendered, so measure's own path (load, policy, expert match, render) runs
    on CPU."""

    def __init__(self):
        self.rendered = 0

    def evaluate_many(self, task, sources, policy=None, inductor=False) -> list:
        self.rendered = len(sources)
        return []


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def excluded_signatures(folder: Path) -> dict[str, str]:
    """{signature: file stem} of every KernelBench file in folder, signed as anytime loads it."""
    out = {}
    for p in sorted(folder.glob("*.py")):
        if p.name.startswith("__"):
            continue
        out[task_from_source(p.read_text(), p.stem).signature] = p.stem
    return out


def capture_row(row: str, small: bool) -> dict:
    """One zoo row's tasks on CPU: {"row", "tasks", "regions", "seconds"}, or {"row", "why"}
    when it cannot be built or captured."""
    t0 = time.time()
    try:
        model, inputs = model_zoo.make(row, small=small, device="cpu")
        found = extract(model, inputs)
    except Exception as e:   # NOTE: one family that fails on CPU must not end the export
        return {"row": row, "why": f"{type(e).__name__}: {e}"}
    if not found.tasks:
        return {"row": row, "why": "no task: " + "; ".join(found.problems or ["no region"])}
    return {"row": row, "tasks": found.tasks, "regions": len(found.sites),
            "seconds": round(time.time() - t0, 1)}


def collect(captured: list[dict]) -> dict[str, dict]:
    """{signature: entry} over rows in order: the first row with a signature keeps its task
    (prepared: its file signature and measure problem), the later ones go to "also"."""
    out: dict[str, dict] = {}
    for cap in captured:
        for t in cap["tasks"]:
            if t.signature in out:
                out[t.signature]["also"].append(cap["row"])
                continue
            out[t.signature] = {"task": t, "row": cap["row"], "count": t.count,
                                "regions": cap["regions"], "also": [], **prepare(t)}
    return out


def prepare(task) -> dict:
    """{"file_signature", "problem"} of the task's file, as the exporter writes it and anytime
    loads it. file_signature: task_from_source's (how bench/tasks files are signed; it can differ
    from the region's, e.g. where torch.export adds _assert_tensor_metadata nodes after a dtype
    cast); None when it does not load. problem: why anytime.measure, run on it with DryEvaluator,
    could not prepare it (None: it can)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = export_tasks([task], tmp)[0]
        dry = DryEvaluator()
        try:
            signature = task_from_source(path.read_text(), path.stem).signature
            anytime.measure(path, dry, LIMIT)
        except Exception as e:
            return {"file_signature": None, "problem": f"{type(e).__name__}: {str(e)[:300]}"}
    problem = None if dry.rendered else "no setting of its search space renders"
    return {"file_signature": signature, "problem": problem}


def drop(entries: dict[str, dict], name: str, why_of, dropped: list[dict]) -> dict[str, dict]:
    """entries without those why_of(signature, entry) gives a reason for; each one dropped is
    appended to `dropped`."""
    kept = {}
    for sig, e in entries.items():
        why = why_of(sig, e)
        if why:
            dropped.append({"set": name, "row": e["row"], "signature": sig, "kind": e["task"].kind,
                            "why": why})
        else:
            kept[sig] = e
    return kept


def found_in(known: dict[str, str], label: str):
    """A drop rule: the entry's region or file signature is a key of known ({signature: what})."""
    def why(sig: str, e: dict) -> str | None:
        hit = next((s for s in (sig, e["file_signature"]) if s in known), None)
        return hit and f"{label}: {known[hit]}"
    return why


def unmeasurable(sig: str, e: dict) -> str | None:
    return e["problem"]


def split(train_caps: list[dict], test_caps: list[dict], excluded: dict[str, str]) -> tuple:
    """(train, test, dropped): {signature: entry} per set after the module docstring's rules. A
    test task is checked against every train region, measurable or not: the train models showed
    it either way."""
    dropped: list[dict] = []
    seen = collect(train_caps)
    train = seen
    for rule in (found_in(excluded, "in --exclude"), unmeasurable):
        train = drop(train, "train", rule, dropped)
    train_sigs = {s: e["row"] for e in seen.values() for s in (e["task"].signature, e["file_signature"]) if s}
    test = collect(test_caps)
    for rule in (found_in(excluded, "in --exclude"), found_in(train_sigs, "in train"), unmeasurable):
        test = drop(test, "test", rule, dropped)
    return train, test, dropped


def clear(folder: Path) -> None:
    """Remove what an earlier run wrote here (task files, tasks.json): a stale file would join
    the set anytime globs."""
    for p in list(folder.glob("*.py")) + list(folder.glob("tasks.json")):
        p.unlink()


def write_set(entries: dict[str, dict], folder: Path) -> list[dict]:
    """Export the set's tasks into folder; their manifest rows, in file-name order."""
    folder.mkdir(parents=True, exist_ok=True)
    clear(folder)
    paths = export_tasks([e["task"] for e in entries.values()], folder)
    rows = [{"file": str(p.relative_to(folder.parent)), "signature": sig,
             "file_signature": e["file_signature"], "kind": e["task"].kind, "row": e["row"],
             "count": e["count"], "regions": e["regions"], "also": e["also"]}
            for p, (sig, e) in zip(paths, entries.items())]
    names = [p.name for p in paths]
    if len(set(names)) != len(names):   # export_tasks names by signature: unique per set
        raise RuntimeError(f"two tasks of {folder} share a file name")
    return sorted(rows, key=lambda r: r["file"])


def capture_all(rows: list[str], small: bool, skipped: list[dict]) -> list[dict]:
    """capture_row per row, with progress; failures go to skipped."""
    out = []
    for row in rows:
        cap = capture_row(row, small)
        if "why" in cap:
            log(f"{row}: skipped ({cap['why'][:200]})")
            skipped.append(cap)
            continue
        log(f"{row}: {len(cap['tasks'])} tasks, {cap['regions']} regions, {cap['seconds']} s")
        out.append(cap)
    return out


def build(train_rows: list[str], test_rows: list[str], out: Path, exclude: Path, small: bool,
          command: str) -> dict:
    """Capture, split and write the set; return the manifest (also written to out/manifest.json)."""
    both = sorted(set(train_rows) & set(test_rows))
    if both:
        raise ValueError(f"rows {both} are in both sets: a held-out set needs other models")
    t0 = time.time()
    excluded = excluded_signatures(exclude)
    log(f"{len(excluded)} signatures in {exclude} ({time.time() - t0:.1f} s)")
    skipped: list[dict] = []
    train_caps = capture_all(train_rows, small, skipped)
    test_caps = capture_all(test_rows, small, skipped)
    train, test, dropped = split(train_caps, test_caps, excluded)
    sets = {"train": write_set(train, out / "train"), "test": write_set(test, out / "test")}
    manifest = {
        "command": command, "small": small, "seconds": round(time.time() - t0, 1),
        "train_rows": train_rows, "test_rows": test_rows, "excluded": len(excluded),
        "models": {c["row"]: {"seconds": c["seconds"], "tasks": len(c["tasks"]),
                              "regions": c["regions"]} for c in train_caps + test_caps},
        "sets": sets,
        "kinds": {name: dict(Counter(r["kind"] for r in rows)) for name, rows in sets.items()},
        "dropped": dropped, "skipped": skipped,
        "bytes": sum((out / r["file"]).stat().st_size for rows in sets.values() for r in rows),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def sample(manifest: dict, which: str, n: int, seed: int = 0) -> list[str]:
    """n task files of set `which` (paths relative to the manifest's folder): per kind, in
    proportion to the set by largest remainder, each kind at least once, drawn by
    random.Random(seed); listed one kind after another in turn, so any every-k-th shard gets a
    like mix of kinds (a conv table takes longer than an elementwise one)."""
    import random
    entries = manifest["sets"][which]
    by_kind: dict[str, list[str]] = {}
    for e in entries:
        by_kind.setdefault(e["kind"], []).append(e["file"])
    n = min(n, len(entries))
    share = {k: n * len(v) / len(entries) for k, v in by_kind.items()}
    take = {k: max(1, int(q)) for k, q in share.items()}
    for k in sorted(share, key=lambda k: share[k] - int(share[k]), reverse=True):
        if sum(take.values()) >= n:
            break
        take[k] += take[k] < len(by_kind[k])
    rng = random.Random(seed)
    drawn = {k: rng.sample(sorted(v), min(take[k], len(v))) for k, v in sorted(by_kind.items())}
    out: list[str] = []
    while any(drawn.values()):
        for k in sorted(drawn):
            if drawn[k]:
                out.append(drawn[k].pop(0))
    return out


def shard(files: list[str], spec: str) -> list[str]:
    """The i-th of k shards ("i/k", 0-based): every k-th file from the i-th."""
    i, k = (int(x) for x in spec.split("/"))
    if not 0 <= i < k:
        raise ValueError(f"--shard {spec}: want i/k with 0 <= i < k")
    return files[i::k]


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--train", nargs="+", default=TRAIN, metavar="ROW", help="model_zoo rows")
    ap.add_argument("--test", nargs="+", default=TEST, metavar="ROW", help="model_zoo rows")
    ap.add_argument("--out", default=str(HERE / "heldout"), help="folder for train/, test/, manifest")
    ap.add_argument("--exclude", default=str(HERE / "tasks"),
                    help="KernelBench files no task of either set may be")
    ap.add_argument("--small", action="store_true", help="tiny models (model_zoo small=True)")
    ap.add_argument("--sample", nargs=2, metavar=("SET", "N"),
                    help="print N files of SET (train or test) of --out's manifest, builds nothing")
    ap.add_argument("--seed", type=int, default=0, help="the sample's draw")
    ap.add_argument("--shard", help="with --sample: i/k, print the i-th of k shards")
    args = ap.parse_args(argv)
    if args.sample and args.sample[0] not in ("train", "test"):
        ap.error("--sample SET: train or test")
    unknown = [r for r in args.train + args.test if r not in model_zoo.ROWS]
    if unknown:
        ap.error(f"unknown rows {unknown}; known: {' '.join(model_zoo.ROWS)}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.sample:
        folder = Path(args.out)
        files = sample(json.loads((folder / "manifest.json").read_text()), args.sample[0],
                       int(args.sample[1]), args.seed)
        print("\n".join(str(folder / f) for f in (shard(files, args.shard) if args.shard else files)))
        return 0
    command = " ".join(["python3", "bench/heldout.py", *(sys.argv[1:] if argv is None else argv)])
    m = build(args.train, args.test, Path(args.out), Path(args.exclude), args.small, command)
    for name in ("train", "test"):
        log(f"{name}: {len(m['sets'][name])} tasks {m['kinds'][name]}")
    log(f"dropped {len(m['dropped'])}, skipped {len(m['skipped'])}, "
        f"{m['bytes'] / 1e3:.0f} kB of task files, {m['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
