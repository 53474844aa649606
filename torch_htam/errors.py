"""Exceptions torch_htam raises on purpose, with a message that says what to do; the command line
turns them into a one-line `error: ...` (no traceback). Kept free of torch imports so the CLI can
name them before anything heavy is loaded."""
from __future__ import annotations


class EmptyBundleError(RuntimeError):
    """precompile found no kernel to put in a bundle (none cached for the arch, none that verified,
    or none that made the model faster end to end); no bundle is written."""
