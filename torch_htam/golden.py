"""Golden records: per kernel, inputs and reference outputs recorded at precompile, checked at load.

A bundle (bundle.py) stores one safetensors file per kernel, kernels/<signature>/golden.safetensors:

    in0 .. inN        the inputs: verify.make_input at the task's own shape, seed GOLDEN_SEED,
                      distribution GOLDEN_DIST (verification's first trial), stored contiguous; the
                      layout (strides) is the task spec's, in the entry's record.json
    out0 .. outM      the reference's outputs (load_reference(task)), TF32 off: verification's
                      ground truth
    out64_0 ..        the reference run in float64, when it runs so and the policy is fp32/tf32
    tf32_out0 ..      the reference with TF32 on, under a TF32 policy (torch's own result there)

At load, `check` runs the kernel through the runtime's Provider (the launcher on the GPU; a CPU
stand-in in tests) on the golden inputs, into outputs the launch allocates, and judges each output
with verify.judge under the policy the kernel was verified under: the same comparison, tolerances
and float64 fallback as verification. A few milliseconds a kernel, plus reading the file.

NOTE: the golden outputs come from the reference run on whatever device precompile ran the model
on: the GPU normally; the CPU when precompile(arch=...) bundles cached kernels on a machine without
one. That is sound because a kernel is never held to bitwise equality with the reference: plain
comparison at the policy's tolerance (fp32 1e-4, tf32 5e-3, fp16 1e-2, bf16 2e-2; policy.py), and
for an fp32 output that misses it, verify.within_torch_error against the float64 reference, which
is just as exact computed on the CPU. CPU and GPU fp32 references differ by rounding, as two correct
GPU kernels do, and that fallback exists for exactly that. What a CPU record cannot give is torch's
own TF32 result (the CPU has no TF32), so under a TF32 policy the fallback measures against strict
fp32's error: a correct kernel may then fail the check (it stays on PyTorch, never the reverse);
the manifest says on which device each record was made.

    >>> tensors = record(task, policy, "cuda"); save(path, tensors, task, policy, "cuda")
    >>> g = read(path, entry.task, "cuda"); check(provider, entry, g)     # None: passed
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from torch_htam.policy import Precision, make
from torch_htam.task import Task

GOLDEN_SEED = 0
GOLDEN_DIST = "normal"
FILE = "golden.safetensors"


def policy_of(entry) -> Precision:
    """The policy a cache/bundle entry was verified under (its record), as a Precision."""
    d = entry.evaluation.policy
    try:
        return Precision.from_json(d)
    except TypeError:
        return make(d.get("name", "fp32"))


def make_inputs(task: Task, device) -> list[torch.Tensor]:
    """The golden inputs: verification's first trial (seed GOLDEN_SEED, GOLDEN_DIST, the task's
    shape), laid out like the task's specs."""
    from torch_htam.verify import make_input
    gen = torch.Generator().manual_seed(GOLDEN_SEED)
    return [make_input(s, tuple(s.shape), GOLDEN_DIST, gen, device) for s in task.inputs]


def record(task: Task, policy: Precision, device) -> dict[str, torch.Tensor]:
    """The tensors of one golden record (on the CPU, contiguous), keyed as the module doc says.

    Raises whatever the reference raises (e.g. an op without a kernel on this device)."""
    from torch_htam.task import load_reference
    from torch_htam.verify import reference_outputs
    inputs = make_inputs(task, device)
    reference = load_reference(task).to(device)
    ref, ref64, own = reference_outputs(reference, inputs, policy)
    if len(ref) != len(task.outputs):
        raise ValueError(f"task declares {len(task.outputs)} outputs, its reference returns {len(ref)}")
    out = {f"in{i}": x for i, x in enumerate(inputs)}
    out.update({f"out{k}": r for k, r in enumerate(ref)})
    if policy.name in ("fp32", "tf32") and any(r.dtype == torch.float32 for r in ref):
        r64 = ref64()
        if r64 is not None and len(r64) == len(ref):
            out.update({f"out64_{k}": r for k, r in enumerate(r64)})
    if own is not None:
        out.update({f"tf32_out{k}": r for k, r in enumerate(own())})
    return {k: v.detach().to("cpu").contiguous() for k, v in out.items()}


def save(path: str | Path, tensors: dict[str, torch.Tensor], task: Task, policy: Precision,
         device) -> None:
    """Write a record with safetensors (atomically: a temp file renamed into place)."""
    from safetensors.torch import save_file
    path = Path(path)
    meta = {"signature": task.signature, "policy": policy.name, "seed": str(GOLDEN_SEED),
            "dist": GOLDEN_DIST, "device": torch.device(device).type}
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    save_file(tensors, str(tmp), metadata=meta)
    os.replace(tmp, path)


@dataclass
class Golden:
    """One record as read back for a kernel: inputs laid out like its task's specs, on the device
    the kernel runs on; outputs, and the float64 / TF32 references when recorded."""
    inputs: list[torch.Tensor]
    outputs: list[torch.Tensor]
    out64: list[torch.Tensor] | None = None
    tf32: list[torch.Tensor] | None = None


def read(path: str | Path, task: Task, device) -> Golden:
    """Load a record onto `device`; inputs get the strides of task.inputs (verification's layout).

    Raises ValueError when the file does not hold what the task needs."""
    from safetensors.torch import load_file
    from torch_htam.verify import strides_like
    t = {k: v.to(device) for k, v in load_file(str(path)).items()}
    n_in, n_out = len(task.inputs), len(task.outputs)
    missing = [k for k in [f"in{i}" for i in range(n_in)] + [f"out{k}" for k in range(n_out)] if k not in t]
    if missing:
        raise ValueError(f"golden record lacks {', '.join(missing)}")
    inputs = []
    for i, s in enumerate(task.inputs):
        x = t[f"in{i}"]
        if tuple(x.shape) != tuple(s.shape) or x.dtype != s.torch_dtype:
            raise ValueError(f"golden in{i} is {x.dtype} {list(x.shape)}, the task wants "
                             f"{s.torch_dtype} {list(s.shape)}")
        inputs.append(torch.empty_strided(x.shape, strides_like(s, tuple(s.shape)), dtype=x.dtype,
                                          device=x.device).copy_(x))

    def listed(prefix):
        keys = [f"{prefix}{k}" for k in range(n_out)]
        return [t[k] for k in keys] if all(k in t for k in keys) else None
    return Golden(inputs, listed("out"), listed("out64_"), listed("tf32_out"))


def check(provider, entry, golden: Golden) -> str | None:
    """Run `entry`'s kernel through `provider` (runtime.Provider: load, then op) on the golden
    inputs and judge it against the golden outputs; None if it passes, else why not
    ("reason: detail", the reason an evaluation.REASONS word: launch_error, crash, mismatch, ...).

        >>> check(runtime.launcher_provider(), bundle_cache.get(sig), read(path, task, "cuda"))
    """
    from torch_htam.launcher import encode_out_meta, task_outputs
    from torch_htam.verify import bitwise_equal, is_crash_message, judge
    task, policy = entry.task, policy_of(entry)
    clones = [x.clone() for x in golden.inputs]
    try:
        kernel = provider.load(entry)
        outs = task_outputs(list(provider.op(int(kernel.handle), golden.inputs, encode_out_meta(task.outputs))),
                            task.outputs)
        if any(x.is_cuda for x in golden.inputs):
            torch.cuda.synchronize()   # an asynchronous launch error surfaces here
    except Exception as e:  # noqa: BLE001 -- any failure to run is a failed check, not a crash of load
        reason = "crash" if is_crash_message(str(e)) else "launch_error"
        return f"{reason}: {type(e).__name__}: {str(e).strip()[:300]}"
    if len(outs) != len(golden.outputs):
        return f"shape_mismatch: {len(outs)} outputs, the record has {len(golden.outputs)}"
    for i, (x, c) in enumerate(zip(golden.inputs, clones)):
        if not bitwise_equal(x, c):
            return f"input_mutated: input {i} changed (the kernel wrote to it)"
    ref64 = (lambda: golden.out64)
    own = (lambda: golden.tf32) if golden.tf32 is not None else None
    for k, (out, ref) in enumerate(zip(outs, golden.outputs)):
        reason, detail, _ = judge(k, out, ref, policy, ref64, own)
        if reason != "ok":
            return f"{reason}: {detail}"
    return None
