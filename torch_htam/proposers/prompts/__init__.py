"""The LLM prompt: templates in this folder (data), filled from a ProposalRequest.

Two messages. The system message is the same for every task and step (role, kernel ABI with one
example, rules, reply format), so endpoints with prefix caching (DeepSeek, vLLM, SGLang) bill and
prefill it once. The user message (step.md) carries the task, GPU, precision policy, direction and
strategies, parent kernel and feedback.

    >>> msgs = render_messages(request)
    >>> [m["role"] for m in msgs]
    ['system', 'user']
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ABI_HEADER = HERE.parent.parent / "csrc" / "htam_abi.h"
DIRECTIONS = HERE.parent.parent / "prior" / "directions.json"   # the HTG prior: id, title, text

MAX_FEEDBACK = 6          # newest attempts shown; older ones are in the parent's history already
MAX_DETAIL_LINES = 25     # compiler output is long; the first errors are the useful ones
MAX_DETAIL_CHARS = 2000
# The code of the newest failed attempts, so the model sees what broke next to the compiler error
# or the mismatch (a hash says nothing). Two, cut to their head, bound the prompt's growth.
MAX_FAILED_SOURCES = 2
MAX_SOURCE_LINES = 80
# The prior's KernelSkill fields shown under each strategy, with their labels.
STRATEGY_FIELDS = (("intent", "Intent"), ("example", "Example"), ("expected", "Expected"),
                   ("forbidden", "Forbidden"))


@functools.lru_cache(maxsize=None)
def template(name: str) -> str:
    """The text of prompts/<name>, without its trailing newline."""
    return (HERE / name).read_text().rstrip("\n")


def render_messages(request) -> list[dict[str, str]]:
    """[system, user] chat messages for one proposal request.

    >>> render_messages(ProposalRequest(task=t, direction="memory_access", strategies=[]))[1]["content"][:30]
    '# Task `gelu_bias` (elementwise'
    """
    return [{"role": "system", "content": render_system()},
            {"role": "user", "content": render_step(request)}]


@functools.lru_cache(maxsize=None)
def render_system() -> str:
    return template("system.md").format(abi_header=ABI_HEADER.read_text().rstrip("\n"),
                                        abi_example=template("abi_example.cu"))


def render_step(request) -> str:
    task = request.task
    policy = request.policy or _default_policy(task)
    return template("step.md").format(
        task_name=task.name, task_kind=task.kind,
        ops=", ".join(f"`{op}`" for op in task.ops) or "unknown",
        reference_source=task.source.strip("\n"),
        inputs=_specs(task.inputs, "in"), outputs=_specs(task.outputs, "out"),
        flops=_si(task.flops, "FLOP"), bytes=_si(task.bytes, "B"),
        roofline=_roofline(task, request.gpu, policy),
        gpu=_gpu(request.gpu), policy=_policy(policy),
        direction=_direction(request.direction), transition=_transition(request.transition),
        strategies="\n".join(_strategy(s) for s in request.strategies) or "- none retrieved",
        parent=_parent(request.parent), feedback=_feedback(request.feedback))


def strategy_id(s: Any) -> str:
    """The id of an htg.Strategy (or of a dict with "id", or a plain string id)."""
    return s if isinstance(s, str) else str(_field(s, "id") or s)


def _field(obj: Any, *names: str) -> Any:
    """The first present, non-empty attribute or key of obj among names (HTG records vary)."""
    for name in names:
        v = obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)
        if v not in (None, "", {}):
            return v
    return None


# --- sections -----------------------------------------------------------------------------------

def _specs(specs, prefix: str) -> str:
    lines = []
    for i, s in enumerate(specs):
        layout = "contiguous" if s.contiguous else f"strides {list(s.stride)} (not contiguous)"
        line = f"- {prefix}[{i}]: {s.dtype} {list(s.shape)}, {layout}"
        if s.dynamic:
            line += f"; dynamic dims {list(s.dynamic)} (any size at run time)"
        if s.low is not None or s.high is not None:
            line += f"; values in [{s.low}, {s.high})"
        lines.append(line)
    return "\n".join(lines) or "- none"


def _roofline(task, gpu, policy) -> str:
    if gpu is None or not gpu.mem_bandwidth or not task.bytes:
        return ""
    t_mem = task.bytes / gpu.mem_bandwidth
    # NOTE: dense TF32 tensor-core rate is half the fp16/bf16 rate on A100/H100.
    peak = {"fp32": gpu.fp32_flops, "tf32": gpu.tensor_flops / 2}.get(policy.name, gpu.tensor_flops)
    t_cmp = task.flops / peak if peak and task.flops else 0.0
    bound = "memory-bound" if t_mem >= t_cmp else "compute-bound"
    return f"Roofline lower bound on this GPU: {max(t_mem, t_cmp) * 1e6:.1f} us ({bound})."


def _gpu(gpu) -> str:
    if gpu is None:
        return template("no_gpu.md")
    return template("gpu.md").format(
        name=gpu.name, arch=gpu.arch, sms=gpu.sms, bandwidth=_si(gpu.mem_bandwidth, "B/s"),
        l2=_binary(gpu.l2_bytes), smem=_binary(gpu.smem_per_block),
        fp32=_si(gpu.fp32_flops, "FLOP/s"), tensor=_si(gpu.tensor_flops, "FLOP/s"))


def _policy(policy) -> str:
    name = "half" if policy.name in ("fp16", "bf16") else policy.name
    return template(f"policy_{name}.md").format(dtype=policy.name, atol=policy.atol, rtol=policy.rtol)


def _default_policy(task):
    from torch_htam.policy import policy_for
    return policy_for(task)


def _direction(ident: str) -> str:
    text = direction_texts().get(ident, {}).get("text", "")
    return f"**{_title(ident)}** (`{ident}`). {text}".rstrip()


@functools.lru_cache(maxsize=None)
def direction_texts() -> dict[str, dict]:
    """Direction id -> its prior entry (title, text); empty if the prior is not there."""
    try:
        return {d["id"]: d for d in json.loads(DIRECTIONS.read_text())["directions"]}
    except (OSError, ValueError, KeyError):
        return {}


def _transition(transition) -> str:
    if not transition or transition[0] == "start":   # htg.START: no kernel before this step
        return "This is the first step of the search."
    prev, chosen = transition
    return f"The previous step followed **{_title(prev)}**; the search moves on to **{_title(chosen)}**."


def _title(ident: str) -> str:
    return direction_texts().get(ident, {}).get("title") or _words(ident)


def _strategy(s: Any) -> str:
    if isinstance(s, str):
        return template("strategy.md").format(id=s, title=_words(s), text="", fields="",
                                              stats="no record yet")
    text = _field(s, "text", "description") or ""
    return template("strategy.md").format(
        id=strategy_id(s), title=_field(s, "title", "name") or _words(strategy_id(s)),
        text=" ".join(text.split()), fields=_strategy_fields(s), stats=_stats(_field(s, "stats")))


def _strategy_fields(s: Any) -> str:
    """The prior's intent / example / expected / forbidden of a strategy, one indented line each
    (the ones it has): what to aim for and the known ways to get it wrong."""
    out = []
    for name, label in STRATEGY_FIELDS:
        v = _field(s, name)
        if isinstance(v, (list, tuple)):
            v = "; ".join(str(x) for x in v)
        if v:
            out.append(f"\n  {label}: {' '.join(str(v).split())}")
    return "".join(out)


def _stats(stats: Any) -> str:
    """Recorded outcomes, whatever shape the HTG keeps them in (dict, dataclass, object)."""
    if stats is None:
        return "no record yet"
    if dataclasses.is_dataclass(stats):
        stats = dataclasses.asdict(stats)
    elif not isinstance(stats, dict):
        stats = {k: v for k, v in getattr(stats, "__dict__", {}).items() if not k.startswith("_")}
    parts = [f"{k}={_num(v)}" for k, v in stats.items() if v not in (None, {}, [])]
    return ", ".join(parts) or "no record yet"


def _parent(parent) -> str:
    if parent is None:
        return template("no_parent.md")
    roof = parent.roofline_fraction
    return template("parent.md").format(
        speedup=_measured(parent.speedup, "{:.2f}x"), kernel_ms=_measured(parent.kernel_ms, "{:.4f} ms"),
        roofline=_measured(roof, "{:.0%}"), bar=_bar(parent), tags=", ".join(parent.tags) or "none",
        ptxas=_ptxas(parent), source=parent.source.strip("\n"))


def _ptxas(item) -> str:
    """ptxas's resources of a parent or an attempt as a clause ("; ptxas: 168 registers, no
    spills"), "" when unknown."""
    text = getattr(item, "ptxas", "")
    return f"; ptxas: {text}" if text else ""


def _bar(parent) -> str:
    """Inductor's time for the region when an evaluation measured it (search.MeasuredParent), as
    a line after the parent's figures: the time a kernel must beat to be used in a compiled model."""
    bar = getattr(parent, "compile_ms", None)
    if not bar:
        return ""
    ratio = getattr(parent, "compile_speedup", None)
    code = getattr(parent, "inductor_code", "")
    return "\n" + template("bar.md").format(compile_ms=f"{bar:.4f} ms",
                                            compile_speedup=_measured(ratio, "{:.2f}x")) + (
        "\n" + template("inductor_code.md").format(code=code.strip("\n")) if code else "")


def _feedback(attempts) -> str:
    if not attempts:
        return "None yet."
    lines = []
    for a in attempts[-MAX_FEEDBACK:]:
        detail = trim(a.detail)
        lines.append(template("attempt.md").format(
            outcome=a.outcome, tags=", ".join(a.tags) or "none",
            speedup=_measured(a.speedup, "{:.2f}x"), kernel_ms=_measured(a.kernel_ms, "{:.4f} ms"),
            ptxas=_ptxas(a), detail=("\n" + _indent(detail)) if detail else ""))
    return "\n".join(lines + _failed_sources(attempts))


def _failed_sources(attempts) -> list[str]:
    """The newest MAX_FAILED_SOURCES failed attempts that kept their source (search.SearchAttempt),
    oldest first, each cut to its first MAX_SOURCE_LINES lines."""
    failed = [a for a in attempts if a.outcome != "ok" and getattr(a, "source", "")]
    out = []
    for a in failed[-MAX_FAILED_SOURCES:]:
        lines = a.source.strip("\n").splitlines()
        cut = (f", first {MAX_SOURCE_LINES} of {len(lines)} lines" if len(lines) > MAX_SOURCE_LINES
               else "")
        out.append("\n" + template("failed_source.md").format(
            outcome=a.outcome, tags=", ".join(a.tags) or "none", cut=cut,
            source="\n".join(lines[:MAX_SOURCE_LINES])))
    return out


# --- formatting ---------------------------------------------------------------------------------

def trim(text: str, lines: int = MAX_DETAIL_LINES, chars: int = MAX_DETAIL_CHARS) -> str:
    """Keep the head of long tool output (the first compiler errors matter most)."""
    text = (text or "").strip()
    kept = text.splitlines()[:lines]
    out = "\n".join(kept)[:chars]
    return out + ("\n[... trimmed]" if out != text else "")


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())


def _words(ident: str) -> str:
    return str(ident).replace("_", " ")


def _measured(x, fmt: str) -> str:
    return "not measured" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)


def _num(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def _si(x: float, unit: str) -> str:
    if not x:
        return f"unknown {unit}" if unit.endswith("/s") else f"0 {unit}"
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if x >= scale:
            return f"{x / scale:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}"


def _binary(n: int) -> str:
    if not n:
        return "unknown"
    for scale, prefix in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if n >= scale:
            return f"{n / scale:.3g} {prefix}"
    return f"{n} B"
