"""Turn one LLM reply into a kernel source and the strategy ids it claims, or a reason why not.

    >>> r = parse_reply(text, known_ids={"vec_loads", "warp_reduce"})
    >>> r.source is not None, r.tags, r.reason
    (True, ['vec_loads'], '')

Reasons (the first word is stable; the loop and HTG record it): "no_code" (no code block),
"no_entry_point" (code, but none defines an exported htam_run), "static_check: <problem>" (the
build module's pre-compile check rejected it).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

CODE_LANGS = ("cuda", "cu", "cpp", "c++", "cxx", "c")
REASONS = ("no_code", "no_entry_point", "static_check")

# ```lang\n ... ``` ; the language tag is optional. Non-greedy so blocks don't merge.
_BLOCK = re.compile(r"```[ \t]*([\w+#.-]*)[^\n]*\n(.*?)```", re.S)
_THINK = re.compile(r"<think(?:ing)?>.*?</think(?:ing)?>", re.S | re.I)
_OPEN_THINK = re.compile(r"^\s*<think(?:ing)?>", re.I)
_CLOSE_THINK = re.compile(r"</think(?:ing)?>", re.I)
# A definition (a body follows), not a declaration: htam_run(...) {
_DEFINES = re.compile(r"\bhtam_run\s*\([^;{}]*\)\s*\{")
_EXPORTED = re.compile(r"\bHTAM_ENTRY\s+htam_run\b|extern\s+\"C\"")
_TAGS = re.compile(r"^[\s*_>#-]*STRATEGIES[\s*_]*:(.*)$", re.I | re.M)


@dataclass
class Reply:
    """source: the kernel (None when unusable); tags: known strategy ids it claims to apply;
    reason: why there is no source ("" when there is one); dropped: claimed ids we don't know."""
    source: str | None
    tags: list[str] = field(default_factory=list)
    reason: str = ""
    dropped: list[str] = field(default_factory=list)


def parse_reply(text: str, known_ids=(), static_check: bool = True) -> Reply:
    """Pick the kernel out of a reply, check it, and read its STRATEGIES line.

    >>> parse_reply("```cuda\\n" + src + "```\\nSTRATEGIES: vec_loads, bogus", {"vec_loads"}).tags
    ['vec_loads']
    """
    answer = strip_reasoning(text or "")
    blocks = code_blocks(answer)
    tags, dropped = parse_tags(_outside_blocks(answer), known_ids)
    if not blocks:
        truncated = bool(_OPEN_THINK.match(text or "")) and not _CLOSE_THINK.search(text or "")
        return Reply(None, tags, "no_code (reply ended inside <think>: raise max_tokens)"
                     if truncated else "no_code", dropped)
    source = pick_block(blocks)
    if source is None:
        return Reply(None, tags, "no_entry_point", dropped)
    problem = run_static_check(source) if static_check else None
    if problem:
        return Reply(None, tags, f"static_check: {problem}", dropped)
    return Reply(source, tags, "", dropped)


def strip_reasoning(text: str) -> str:
    """Drop <think>...</think> blocks; a reply still inside an unterminated leading <think> has no
    answer yet; a lone </think> (servers that put the opening tag in the chat template) ends one."""
    text = _THINK.sub("", text)
    if _OPEN_THINK.match(text):
        return ""
    close = _CLOSE_THINK.search(text)
    return text[close.end():] if close else text


def code_blocks(text: str) -> list[tuple[str, str]]:
    """[(language tag lower-cased, body)] of the fenced blocks in text."""
    return [(m.group(1).lower(), m.group(2)) for m in _BLOCK.finditer(text)]


def defines_entry(source: str) -> bool:
    """True if source defines (not only declares) an exported htam_run."""
    return bool(_DEFINES.search(source) and _EXPORTED.search(source))


def pick_block(blocks: list[tuple[str, str]]) -> str | None:
    """The kernel: among blocks defining htam_run, prefer CUDA/C++ tagged ones, then the largest."""
    good = [(lang in CODE_LANGS, len(body), body) for lang, body in blocks if defines_entry(body)]
    if not good:
        return None
    return max(good, key=lambda g: (g[0], g[1]))[2].strip("\n") + "\n"


def parse_tags(text: str, known_ids=()) -> tuple[list[str], list[str]]:
    """(known ids in order of mention, unknown ids) from the last STRATEGIES: line."""
    found = _TAGS.findall(text)
    if not found:
        return [], []
    known, kept, dropped = set(known_ids), [], []
    for raw in re.split(r"[,\s]+", found[-1]):
        tag = raw.strip("`'\"*.[]()")
        if not tag or tag.lower() == "none" or tag in kept or tag in dropped:
            continue
        (kept if tag in known else dropped).append(tag)
    return kept, dropped


def run_static_check(source: str) -> str | None:
    """The build module's pre-compile check (torch_htam.build.check_source), if it exists.

    Accepts a check that returns None/""/[] for a clean source, or problem text / a list of
    problems, or raises ValueError with the problem. Skipped while build.py is absent.
    """
    try:
        from torch_htam.build import check_source
    except ImportError:
        return None
    try:
        result = check_source(source)
    except ValueError as e:
        return str(e) or type(e).__name__
    if isinstance(result, (list, tuple)):
        return "; ".join(str(p) for p in result) or None
    return str(result) if result else None


def _outside_blocks(text: str) -> str:
    return _BLOCK.sub("", text)
