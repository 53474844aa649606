"""Choose SearchConfig.recall on the held-out protocol's train tables alone (#35): each train model's
tables replayed (bench/anytime.py, arms htg_warm and the fair none, 3 seeds) with htg_warm's memory
learned from the other train models' tables; the saving of htg_warm's candidates to 99% of the
best against none's, summed over the folds, per recall value. The test tables stay unread.

    python3 docs/experiments/htg_prior/recall_lomo.py 0 4 8 16 24    # ~4 min per value on 2 cores
"""
import functools
import glob
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
import anytime  # noqa: E402


RESULTS = ROOT / "bench" / "results"
TRAIN = [str(RESULTS / "anytime_table-20261126-232056.json")] + sorted(
    glob.glob(str(RESULTS / "anytime_table-20261126-2321*.json")))


def by_model() -> dict[str, list[dict]]:
    """The train tables by the zoo model their task came from (bench/heldout/manifest.json)."""
    tables, _ = anytime.load_tables(TRAIN)
    manifest = json.loads((ROOT / "bench" / "heldout" / "manifest.json").read_text())
    model = {Path(e["file"]).name: e["row"] for es in manifest["sets"].values() for e in es}
    out: dict[str, list[dict]] = {}
    for t in tables:
        out.setdefault(model.get(Path(t["path"]).name, "?"), []).append(t)
    return out


SEARCH_LOG = anytime.search_log


def with_recall(recall: int):
    """anytime.search_log with SearchConfig.recall set (the replay's workers, forked, call it)."""
    return functools.partial(SEARCH_LOG, recall=recall)


def lomo(recall: int, models: dict[str, list[dict]]) -> tuple[int, int]:
    """(htg_warm's, none's) candidates to 99% of the best, summed over folds, seeds and tasks."""
    anytime.search_log = with_recall(recall)
    warm = none = 0
    for m, tables in models.items():
        rest = [t for other, ts in models.items() if other != m for t in ts]
        res = anytime.replay(tables, 24, seeds=3, arms=("htg_warm", "none"), train=rest, jobs=2)
        for row in res["rows"]:
            if row["best"] is not None:
                warm += sum(row["to99"]["htg_warm"])
                none += sum(row["to99"]["none"])
    return warm, none


def main() -> None:
    models = by_model()
    for recall in map(int, sys.argv[1:]):
        warm, none = lomo(recall, models)
        print(f"recall={recall}: LOMO saving {1 - warm / none:+.1%} (warm {warm}, none {none})", flush=True)


if __name__ == "__main__":
    main()
