"""Exceptions that the command line turns into a one-line `error: ...` (no traceback).

Kept free of torch imports so the CLI can name them before anything heavy is loaded.
"""
from __future__ import annotations


class EmptyBundleError(RuntimeError):
    """precompile() would write a bundle with no kernel in it (nothing swapped, nothing cached for
    the arch); the message says why and what to run first."""
