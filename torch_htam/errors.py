"""Exceptions torch_htam raises on purpose, with a message that says what to do; the command line
turns them into a one-line `error: ...` (no traceback). Kept free of torch imports so the CLI can
name them before anything heavy is loaded."""
from __future__ import annotations


class EmptyBundleError(RuntimeError):
    """precompile found no kernel to put in a bundle (none cached for the arch, none that verified,
    or none that made the model faster end to end); no bundle is written."""


# What a CUDA error message says when the context is lost: nothing runs on that device after it.
_CRASH_WORDS = ("illegal memory access", "illegal address", "misaligned address",
                "illegal instruction", "unspecified launch failure", "device-side assert",
                "hardware stack error", "invalid program counter")


def is_crash_message(msg: str) -> bool:
    """True when a CUDA error message means the device context is unusable (a crash, not a
    refusal such as HTAM_ERR_SHAPE)."""
    m = msg.lower()
    return any(w in m for w in _CRASH_WORDS)
