"""Recall: which settings won on tasks of similar size, so a search on a new task tries them first.

The HTG learns which *strategies* pay in a coarse state; what carries from one model's regions to
another's is more often which *setting* won (a conv algorithm, a tile, threads per row), and that
depends on the task's sizes. Recall keeps, per task kind, one record per searched task:

    TaskRecord(signature, features, shares)   shares: {change: its speedup / the task's best}

over the verified settings its search evaluated, each named by its change to the task's defaults
(change(): the knobs it sets otherwise, a knob it drops as None; {} is the defaults), so the same
move names the same kernel choice on a task whose defaults differ (another dtype, another size).
For a new task of the kind it scores every remembered change by its nearness-weighted mean share
(bench/prior_transfer.py's "neighbours" rule, measured there on the held-out tables: 11.4% of the
candidates to 99% of the best saved, against 7.0% by kind alone):

    score(c) = sum_t w_t * share_t(c) / sum_t w_t     over the records t that evaluated c
    w_t      = 2 ** -|f - f_t|                         f: features(), log2 sizes

so a task one doubling away in every size counts half as much as the same sizes. The expert
proposer applies the top SearchConfig.recall changes to the task's defaults and tries those in its
space first, after the defaults (proposers/expert/proposer.py, _ordered).

    >>> r = Recall()
    >>> r.record("gemm", "sig1", (10.0, 11.0, 9.0, 7.0), {'{"algo": 1}': 2.0, '{}': 1.0})
    >>> r.ranked("gemm", (10.0, 11.0, 9.0, 7.0))
    [('{"algo": 1}', 1.0), ('{}', 0.5)]
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

MAX_RECORDS = 2000    # per kind: the oldest go first (a model has ~10-60 distinct regions)


def change(params: dict, defaults: dict) -> dict:
    """What a setting changes in the defaults: the knobs it sets otherwise, and None for a knob of
    the defaults it does not have (canonical params drop what their path does not read)."""
    out = {k: v for k, v in params.items() if defaults.get(k, object()) != v}
    out.update({k: None for k in defaults if k not in params})
    return out


def applied(delta: dict, defaults: dict) -> dict:
    """The setting a change makes of these defaults (change()'s inverse)."""
    out = {**defaults, **delta}
    return {k: v for k, v in out.items() if not (v is None and k in delta)}


def change_id(delta: dict) -> str | None:
    """A change's identity across tasks: sorted JSON; None unless every value is a scalar (others
    would not come back from JSON as the same, hashable knobs)."""
    if not all(v is None or isinstance(v, (bool, int, float, str)) for v in delta.values()):
        return None
    return json.dumps(delta, sort_keys=True)


def features(task) -> tuple[float, ...]:
    """The task's sizes, log2 (a doubling is one unit whatever the size): its FLOPs, its output's
    elements and innermost extent, and its largest input's elements. For a GEMM they give M*N*K,
    M*N, N and max(M*K, N*K); for a row op the rows times the row length and the row length (a
    norm's output keeps the input's shape); for a conv the work, the output pixels times channels
    and the innermost extent. Kind-agnostic, so one rule serves every kind."""
    def lg(n: float) -> float:
        return math.log2(max(1.0, float(n)))
    out = max(task.outputs, key=lambda s: math.prod(s.shape), default=None)
    big = max((math.prod(s.shape) for s in task.inputs), default=1)
    return (lg(task.flops), lg(math.prod(out.shape) if out else 1),
            lg(out.shape[-1] if out and out.shape else 1), lg(big))


@dataclass
class TaskRecord:
    """One searched task: its signature, features() and each verified change's share of the best."""
    signature: str
    features: tuple[float, ...]
    shares: dict[str, float]

    def to_json(self) -> dict[str, Any]:
        return {"signature": self.signature, "features": [round(f, 4) for f in self.features],
                "shares": {k: round(v, 4) for k, v in self.shares.items()}}

    @staticmethod
    def from_json(d: dict[str, Any]) -> "TaskRecord":
        return TaskRecord(str(d["signature"]), tuple(float(f) for f in d["features"]),
                          {str(k): float(v) for k, v in d["shares"].items()})


@dataclass
class Recall:
    """Per kind, the records of searched tasks, oldest first (module docstring)."""
    kinds: dict[str, list[TaskRecord]] = field(default_factory=dict)

    def record(self, kind: str, signature: str, feats: tuple[float, ...], speeds: dict[str, float]) -> None:
        """Remember one task's search: speeds {change_id: speedup} of its verified settings (any
        unit: shares are taken against their best). A task searched again replaces its record."""
        speeds = {k: v for k, v in speeds.items() if v and v > 0}
        if not speeds:
            return
        best = max(speeds.values())
        rows = [r for r in self.kinds.get(kind, []) if r.signature != signature]
        rows.append(TaskRecord(signature, tuple(feats), {k: v / best for k, v in speeds.items()}))
        self.kinds[kind] = rows[-MAX_RECORDS:]

    def ranked(self, kind: str, feats: tuple[float, ...]) -> list[tuple[str, float]]:
        """Every remembered change of the kind with its score for a task of these features, best
        first (ties: the change seen first)."""
        num: dict[str, float] = {}
        den: dict[str, float] = {}
        for r in self.kinds.get(kind, []):
            if len(r.features) != len(feats):   # a record of another features() rule
                continue
            w = 2.0 ** -math.dist(feats, r.features)
            for k, share in r.shares.items():
                num[k] = num.get(k, 0.0) + w * share
                den[k] = den.get(k, 0.0) + w
        scores = [(k, num[k] / den[k]) for k in num if den[k] > 0]
        return sorted(scores, key=lambda x: -x[1])   # NOTE: stable: ties keep first-seen order

    def to_json(self) -> dict[str, Any]:
        return {kind: [r.to_json() for r in rows] for kind, rows in self.kinds.items() if rows}

    @staticmethod
    def from_json(d: dict[str, Any]) -> "Recall":
        return Recall({str(kind): [TaskRecord.from_json(r) for r in rows][-MAX_RECORDS:] for kind, rows in d.items()})
