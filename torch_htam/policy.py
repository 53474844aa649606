"""Precision policy: which numeric shortcuts a kernel may take, and the tolerance it is held to.

Follows the user's own settings, as PyTorch does for the same ops: an fp32 GEMM may use TF32 exactly
when torch runs fp32 matmuls in TF32 (torch.set_float32_matmul_precision("high") or the matmul
fp32_precision "tf32"); an fp32 conv exactly when cuDNN convs run TF32 (PyTorch's default, so eager
convs already do); bf16/fp16 tasks get their dtype's tolerance. The policy is recorded with every verified kernel and
shown in the report, and a cached kernel is used only under a policy at least as loose as the one
it was verified under (`admits`).

    >>> policy_for(task)            # fp32 task, default torch setting
    Precision(name='fp32', atol=0.0001, rtol=0.0001, allow_tf32=False)
"""
from __future__ import annotations

import contextlib
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


# NOTE: torch keeps TF32 in two APIs. The fp32_precision strings (op, then backend, then generic;
# "none" defers to the next level) are the truth, and Inductor's FX graph cache key holds them. The
# legacy flags (allow_tf32, float32_matmul_precision) mirror them, but reading one raises once a user
# has set the strings in a way they cannot express. So TF32 is read from the strings, and a switch
# restores the strings exactly: a leaked "none" -> "ieee" changes no numerics but does change every
# cache key, so a bundle's Inductor code would miss in the server.
def _fp32_precision(*levels) -> str:
    """The first explicit setting from the most specific level up; "ieee" when all defer."""
    return next((lv.fp32_precision for lv in levels if lv.fp32_precision != "none"), "ieee")


def matmul_tf32() -> bool:
    """Does torch run fp32 CUDA matmuls in TF32 now?"""
    return _fp32_precision(torch.backends.cuda.matmul, torch.backends) == "tf32"


def conv_tf32() -> bool:
    """Does torch run fp32 cuDNN convs in TF32 now? (PyTorch's default: yes.)"""
    cudnn = torch.backends.cudnn
    return _fp32_precision(cudnn.conv, cudnn, torch.backends) == "tf32"


@contextlib.contextmanager
def tf32_switches(on: bool):
    """TF32 for fp32 matmuls and cuDNN ops set to `on` inside the block, through both of torch's APIs
    (Inductor reads the legacy ones: the matmul precision for its cache key, cudnn.allow_tf32 to lower
    a conv); the user's settings back after it (kept_precision)."""
    b = torch.backends
    with kept_precision():
        torch.set_float32_matmul_precision("high" if on else "highest")
        b.cudnn.allow_tf32 = on
        for lv in (b.cuda.matmul, b.cudnn, b.cudnn.conv, b.cudnn.rnn):
            lv.fp32_precision = "tf32" if on else "ieee"
        yield


@contextlib.contextmanager
def kept_precision():
    """torch's precision settings put back after the block: the legacy ones where they could be
    read, then every fp32_precision string exactly."""
    b = torch.backends
    levels = precision_levels()
    strings = [lv.fp32_precision for lv in levels]
    matmul, cudnn = _readable(torch.get_float32_matmul_precision), _readable(lambda: b.cudnn.allow_tf32)
    try:
        yield
    finally:
        if matmul is not None:
            torch.set_float32_matmul_precision(matmul)
        if cudnn is not None:
            b.cudnn.allow_tf32 = cudnn
        for lv, p in zip(levels, strings):
            lv.fp32_precision = p


def precision_levels() -> tuple:
    """Every object of torch.backends that holds an fp32_precision string: generic, CUDA, cuDNN, CPU."""
    b = torch.backends
    return (b, b.cuda.matmul, b.cudnn, b.cudnn.conv, b.cudnn.rnn, b.mkldnn, b.mkldnn.matmul, b.mkldnn.conv,
            b.mkldnn.rnn)


def _readable(read):
    """read(), or None where torch refuses a legacy read after a mix of its two APIs."""
    try:
        return read()
    except RuntimeError:
        return None


def policy_for(task, matmul: bool | None = None, conv: bool | None = None) -> Precision:
    """The policy for a task: its lowest float dtype decides; fp32 GEMM/conv follow torch's TF32 knobs.

        >>> policy_for(conv_task, conv=False).name, policy_for(conv_task, conv=True).name
        ('fp32', 'tf32')
    """
    dtypes = {s.dtype for s in list(task.inputs) + list(task.outputs)}
    if "bfloat16" in dtypes:
        return make("bf16")
    if "float16" in dtypes:
        return make("fp16")
    if task.kind == "conv":
        tf32 = conv_tf32() if conv is None else conv
        return make("tf32" if tf32 else "fp32")
    tf32 = matmul_tf32() if matmul is None else matmul
    if task.kind in ("gemm", "attention") and tf32:
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
    """A cache/bundle entry for `task` if the policy the user's settings give the task now admits
    it (`admits`), else None (e.g. a kernel verified under TF32 once TF32 is turned off). Whether
    it may run is why_not's: this is the cache lookup's first filter (an admitted entry that needs
    a rebuild is rebuilt, not skipped).

        >>> admitted(cache.get(task.signature), task)
    """
    return entry if entry is not None and admits(entry.policy, policy_for(task)) else None


def why_not(entry, task=None, min_speedup: float = 1.0, against_inductor: bool = False) -> str | None:
    """The one place that decides whether a kernel may run for a task: None when it may, else why
    not, in one line. Every path that swaps a kernel in asks here (optimize, the torch.compile
    backend, the replay, bundles).

    entry: a cache or bundle Entry, or a kernel object (a test's stand-in, a loaded .so: its
    caller vouches for it, so only what it carries is checked). task: where given, the kernel's
    precision policy must still admit it under the user's settings now (`admits`).
    against_inductor: it must also have beaten Inductor's code for its region by min_speedup
    (inside a compiled model that, not eager, is the bar).

        >>> why_not(cache.get(task.signature), task, 1.03)
        'needs rebuild + re-verification'
    """
    if entry is None:
        return "no kernel"
    if task is not None and hasattr(entry, "policy") and not admits(entry.policy, policy_for(task)):
        return f"verified under {entry.policy}, looser than the task's policy now ({policy_for(task).name})"
    if hasattr(entry, "usable") and not entry.usable(min_speedup):
        return ("needs rebuild + re-verification" if getattr(entry, "needs_rebuild", False)
                else f"not usable (corrupt, unverified or below {min_speedup}x)")
    if against_inductor and not beats_inductor(entry, min_speedup):
        return "slower than Inductor's code for the region"
    return None


def beats_inductor(entry, min_speedup: float = 1.0) -> bool:
    """The kernel was timed against its region under torch.compile and beat it by min_speedup.

    NOTE: not timed counts as not beaten: a kernel that wins over eager can lose to Inductor
    (GPT-2 bf16's lm_head: 1.09x over eager, 0.55x of torch.compile for the whole model,
    bench/results/bench_swaps-20261123-172030.json); optimize() times such kernels first.
    """
    ev = getattr(entry, "evaluation", None)    # a kernel object without a verdict has not beaten it
    return ev is not None and (ev.compile_speedup or 0.0) >= min_speedup


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64 (METHOD.md: fp32 lands far under 1e-3)."""
    out, ref = out.double(), ref.double()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def end_to_end_tolerance(model: torch.nn.Module) -> float:
    """The norm-relative error against eager that a whole model's output is held to: the precision
    policy's tolerance for its dtype (policy.TOLERANCES). An fp32 model takes TF32's where PyTorch
    itself runs TF32: its convs when cuDNN runs them TF32 (the default), its GEMMs when fp32
    matmuls run TF32 (policy.conv_tf32, policy.matmul_tf32).
    """
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    if dtype in (torch.bfloat16, torch.float16):
        return TOLERANCES["bf16" if dtype == torch.bfloat16 else "fp16"]
    convs = any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in model.modules())
    tf32 = (convs and conv_tf32()) or matmul_tf32()
    return TOLERANCES["tf32" if tf32 else "fp32"]
