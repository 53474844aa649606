"""Precision policy: which numeric shortcuts a kernel may take, and the tolerance it is held to.

Follows the user's own setting by default: TF32 is allowed exactly when
torch.get_float32_matmul_precision() is "high" or "medium"; bf16/fp16 tasks get their dtype's
tolerance. The policy is recorded with every verified kernel and shown in the report.

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


def policy_for(task, matmul_precision: str | None = None) -> Precision:
    """The policy for a task: its lowest float dtype decides; fp32 GEMM/conv follow the TF32 setting."""
    dtypes = {s.dtype for s in list(task.inputs) + list(task.outputs)}
    if "bfloat16" in dtypes:
        return make("bf16")
    if "float16" in dtypes:
        return make("fp16")
    mp = matmul_precision or torch.get_float32_matmul_precision()
    if task.kind in ("gemm", "conv", "attention") and mp in ("high", "medium"):
        return make("tf32")
    return make("fp32")
