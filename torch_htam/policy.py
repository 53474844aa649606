"""Precision policy: which numeric shortcuts a kernel may take, and the tolerance it is held to.

Follows the user's own settings, as PyTorch does for the same ops: an fp32 GEMM may use TF32 exactly
when torch.get_float32_matmul_precision() is "high" or "medium"; an fp32 conv exactly when
torch.backends.cudnn.allow_tf32 is set (PyTorch's default: True, so eager convs already run TF32);
bf16/fp16 tasks get their dtype's tolerance. The policy is recorded with every verified kernel and
shown in the report, and a cached kernel is used only under a policy at least as loose as the one
it was verified under (`admits`).

    >>> policy_for(task)            # fp32 task, default torch setting
    Precision(name='fp32', atol=0.0001, rtol=0.0001, allow_tf32=False)
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

# NOTE: fp32 1e-4 is KernelBench's current bound (it used to be 1e-2, which let cheats through).
# tf32 keeps a 10-bit mantissa, so a K=4096 dot drifts to ~1e-3 relative; bf16 to ~1e-2.
TOLERANCES = {"fp32": 1e-4, "tf32": 5e-3, "fp16": 1e-2, "bf16": 2e-2}


@dataclass(frozen=True)
class Precision:
    name: str          # "fp32" | "tf32" | "fp16" | "bf16"
    atol: float
    rtol: float
    allow_tf32: bool   # kernel may use tf32 tensor cores for fp32 matmuls

    def to_json(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_json(d: dict) -> "Precision":
        return Precision(**d)


def make(name: str) -> Precision:
    tol = TOLERANCES[name]
    return Precision(name, tol, tol, allow_tf32=(name == "tf32"))


def policy_for(task, matmul_precision: str | None = None, conv_tf32: bool | None = None) -> Precision:
    """The policy for a task: its lowest float dtype decides; fp32 GEMM/conv follow torch's TF32 knobs.

        >>> policy_for(conv_task, conv_tf32=False).name, policy_for(conv_task, conv_tf32=True).name
        ('fp32', 'tf32')
    """
    dtypes = {s.dtype for s in list(task.inputs) + list(task.outputs)}
    if "bfloat16" in dtypes:
        return make("bf16")
    if "float16" in dtypes:
        return make("fp16")
    if task.kind == "conv":
        tf32 = torch.backends.cudnn.allow_tf32 if conv_tf32 is None else conv_tf32
        return make("tf32" if tf32 else "fp32")
    mp = matmul_precision or torch.get_float32_matmul_precision()
    if task.kind in ("gemm", "attention") and mp in ("high", "medium"):
        return make("tf32")
    return make("fp32")


def admits(verified_under: str, wanted: Precision) -> bool:
    """May a kernel verified under policy `verified_under` run where `wanted` applies? Only if its
    tolerance was at least as tight (an fp32-verified kernel serves a tf32 user, not the reverse).

        >>> admits("fp32", make("tf32")), admits("tf32", make("fp32"))
        (True, False)
    """
    return verified_under in TOLERANCES and TOLERANCES[verified_under] <= wanted.atol


def admitted(entry, task):
    """A cache/bundle entry for `task` if it may run under the policy the user's settings give the
    task now (`admits`), else None (e.g. a kernel verified under TF32 once TF32 is turned off).

        >>> admitted(cache.get(task.signature), task)
    """
    return entry if entry is not None and admits(entry.policy, policy_for(task)) else None
