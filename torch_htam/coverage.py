"""Coverage: which tasks the built-in proposer (the expert) has a path for, and how much of a
model's work they hold.

A task has a path when one of the expert's targets matches its graph (proposer.match_task); else
the reason is one line: the Unsupported message of the target of the task's own kind (or "no
<kind> target" when the expert has none), which says what to add.

    >>> path_of(task)                       # None: the expert writes kernels for it
    >>> path_of(attn_task)
    'attention head dim 12 (q/k): the kernel takes head dims that are multiples of 8 up to 256'
    >>> coverage(found.tasks)["flops"]      # share of FLOPs (x count) in tasks with a path
    0.97
"""
from __future__ import annotations

import re

from torch_htam.policy import policy_for

WHY_WIDTH = 100


def path_of(task, policy=None) -> str | None:
    """None when the expert has a path for the task; else why not, in one line."""
    from torch_htam.proposers.expert.ir import Unsupported
    from torch_htam.proposers.expert.proposer import TARGETS, match_task
    if task.graph is None:
        return "task has no graph (rebuild it from its source first)"
    policy = policy if policy is not None else policy_for(task)
    try:
        match_task(task, policy)
        return None
    except Unsupported:
        pass
    except Exception as e:   # NOTE: the proposer treats a failing match as unsupported too
        return _short(f"matching failed: {type(e).__name__}: {e}")
    kind = [t for t in TARGETS if t.takes(task.kind)]
    # a target that claims the graph (a pooling region) speaks for it; else the kind's generic one
    claimed = tuple(t for t in kind if t.claims is not None and t.claims(task.graph))
    own = claimed or tuple(t for t in kind if t.claims is None)
    if not own:
        return f"the built-in proposer has no {task.kind} target"
    try:
        match_task(task, policy, own)
    except Unsupported as e:
        return _short(str(e).split(": ", 1)[-1])      # drop the "<kind>: " prefix match_task adds
    except Exception as e:
        return _short(f"matching failed: {type(e).__name__}: {e}")
    return None   # NOTE: unreachable unless the targets disagree between two calls


def _short(msg: str) -> str:
    """One line, `aten.op.default` as `op`, at most WHY_WIDTH characters."""
    msg = re.sub(r"aten\.(\w+)\.default\b", r"\1", " ".join(msg.split()))
    return msg if len(msg) <= WHY_WIDTH else msg[:WHY_WIDTH - 3] + "..."


def coverage(tasks) -> dict:
    """Per-task rows and the shares of FLOPs and bytes (each task's times its count) in tasks with
    a path: {"tasks": [{signature, name, kind, count, flops, bytes, path, why}], "flops": x,
    "bytes": y, "with_path": n}. Shares are 1.0 for a model with no work at all."""
    rows = []
    for t in tasks:
        why = path_of(t)
        rows.append({"signature": t.signature, "name": t.name, "kind": t.kind, "count": t.count,
                     "flops": t.flops * t.count, "bytes": t.bytes * t.count,
                     "path": why is None, "why": why})

    def share(key: str) -> float:
        total = sum(r[key] for r in rows)
        return sum(r[key] for r in rows if r["path"]) / total if total else 1.0

    return {"tasks": rows, "flops": share("flops"), "bytes": share("bytes"),
            "with_path": sum(r["path"] for r in rows)}
