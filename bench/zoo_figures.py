"""The zoo's figures over a set of rows: one run's summary (bench_zoo writes it into the run's file)
and the zoo-wide view of each model's latest row (render's zoo section). Standard library only,
since render.py imports it and CI runs render --check.

A row is bench_zoo's (bench_zoo.empty_row has every field): "vs_compile" = torch.compile ms / ours
ms, "vs_compile_ro", "vs_max_autotune" and "vs_max_autotune_ro" (compile_ma / ours_ro) likewise,
each also "_b2b" (back to back) and "_low" (from each arm's 20th-percentile round); "regions" / "ours_ro_regions" per task with its kind,
status, "vs_inductor" and "share_of_eager".
"""
from __future__ import annotations

from record import geomean   # (standard library only, as this module)

HEADLINE = ("vs_compile", "vs_compile_ro", "vs_max_autotune", "vs_max_autotune_ro")
WAYS = {"latency": "", "throughput": "_b2b"}       # timing way -> the ratio fields' suffix
OURS_ARMS = ("ours", "ours_ro")
COLD_LIMIT_S = 600.0      # the issue: a cold optimize within 10 minutes


def prefix(arm: str) -> str:
    """The prefix of an ours arm's report fields: none for ours (bench_serve's names), ours_ro_."""
    return "" if arm == "ours" else f"{arm}_"


def kept_any(row: dict) -> bool:
    """Whether either ours arm of the row kept at least one kernel."""
    return any((row.get(f"{prefix(arm)}kernels_kept") or 0) > 0 for arm in OURS_ARMS)


def beat_inductor(rows: list[dict]) -> dict[str, list[dict]]:
    """{region kind: [its regions whose kernel ran in a row's ours arm and beat Inductor's code
    for the region (vs_inductor > 1)]}, each as {model, arm, task, vs_inductor, share_of_eager}:
    the issue's per-region table of which kernel families beat Inductor, by how much, and how
    much of the model's time they cover."""
    out: dict[str, list[dict]] = {}
    for row in rows:
        for arm in OURS_ARMS:
            for r in row.get(f"{prefix(arm)}regions") or ():
                if r.get("status") == "swapped" and (r.get("vs_inductor") or 0) > 1.0:
                    out.setdefault(r.get("kind") or "other", []).append(
                        {"model": row["model"], "arm": arm, "task": r["task"], "vs_inductor": r["vs_inductor"],
                         "share_of_eager": r.get("share_of_eager")})
    return out


def summarize(rows: list[dict]) -> dict:
    """The rows' figures: rows, errors, correct; per ratio (HEADLINE and vs_eager, each from latency
    and _b2b, and HEADLINE's _low) the geomean and minimum over the rows that measured it and how
    many did; rows with kernels kept (either ours arm); rows whose optimize took (or was cut off
    after) more than COLD_LIMIT_S; beat_inductor; the longest optimize."""
    out = {"rows": len(rows), "errors": sum(1 for r in rows if r.get("error")),
           "correct": sum(1 for r in rows if r.get("ours_correct") is True),
           "ours_ro_correct": sum(1 for r in rows if r.get("ours_ro_correct") is True),
           "close_as_compile": sum(1 for r in rows if r.get("ours_close_as_compile") is True)}
    for name in HEADLINE + ("vs_eager",) + tuple(f"{h}_low" for h in HEADLINE):
        for suffix in WAYS.values():
            vals = [r[f"{name}{suffix}"] for r in rows if r.get(f"{name}{suffix}") is not None]
            out[f"geomean_{name}{suffix}"] = geomean(vals)
            out[f"min_{name}{suffix}"] = min(vals) if vals else None
            out[f"n_{name}{suffix}"] = len(vals)
    out["kernels_kept_rows"] = [r["model"] for r in rows if kept_any(r)]
    # what ran each row's ours arm (report.outcome: "kernels", "C++ wrapper", "torch.compile", ...):
    # a row's gain is a kernel's only where "kernels" ran it
    out["outcomes"] = {arm: outcomes(rows, arm) for arm in OURS_ARMS}
    out["over_600_s"] = [r["model"] for r in rows if any(
        (r.get(k) or 0) > COLD_LIMIT_S for k in ("optimize_s", "ours_ro_optimize_s", "optimize_s_at_least"))]
    out["beat_inductor"] = beat_inductor(rows)
    spent = [r[k] for r in rows for k in ("optimize_s", "ours_ro_optimize_s") if r.get(k) is not None]
    out["max_optimize_s"] = max(spent) if spent else None
    return out


def outcomes(rows: list[dict], arm: str = "ours") -> dict[str, int]:
    """{what ran the arm (its report's outcome): rows}, over the rows that recorded one."""
    out: dict[str, int] = {}
    for r in rows:
        if (o := r.get(f"{prefix(arm)}outcome")) is not None:
            out[o] = out.get(o, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))


def models(rows: list[dict]) -> list[str]:
    """The model families of the rows ("swin" of "swin:bf16"), each once, in order."""
    return list(dict.fromkeys(r["model"].split(":")[0] for r in rows))


def families_table(beat: dict[str, list[dict]]) -> list[dict]:
    """beat_inductor's regions as rows for a table, by kind, then model, best vs_inductor first."""
    return [dict(r, kind=kind) for kind in sorted(beat)
            for r in sorted(beat[kind], key=lambda r: (r["model"], -r["vs_inductor"]))]
