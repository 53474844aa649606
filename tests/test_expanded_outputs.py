"""Region outputs that are expanded views (stride 0 along a dim of size > 1: a mask's
expand_as(scores), a row sum's expand_as(x)).

The kernel writes the tensor before the expand (TensorSpec.kernel_shape: size 1 at those dims) and
its caller returns the expand of it, as torch's own expand is a view: verification, the launcher's
out_meta and the runtime's swapped graph all do so. CPU: specs, the lowered program, verify's
protocol and the runtime swap with stand-in kernels that hold to that contract, nvcc compile. GPU
(@gpu): the generated kernels through verify.verify.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from torch_htam import build, launcher, paths, runtime
from torch_htam.extract import extract, task_from_source
from torch_htam.policy import policy_for
from torch_htam.proposers.expert.ir import lower
from torch_htam.proposers.expert.proposer import match_task
from torch_htam.task import TensorSpec, load_reference
from torch_htam.verify import verify
from compile_check import assert_compiles

HTAM_ERR_SHAPE = 1000

# bench/tasks/ew_mask_bool_fp32.py at a small size: the bool mask is returned expanded over heads
MASK_SOURCE = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, scores, q_idx, k_idx, pad):
        keep = (k_idx <= q_idx) & (pad == 1)
        return scores.masked_fill(~keep, torch.finfo(torch.float32).min), keep.expand_as(scores)


def get_inputs():
    return [torch.randn(2, 3, 16, 16), torch.arange(16).view(16, 1), torch.arange(16),
            (torch.arange(2 * 16).view(2, 1, 1, 16) % 5 != 0).long()]


def get_init_inputs():
    return []
'''


class RowSumExpanded(nn.Module):
    """A row sum handed back expanded over the row: partition puts the expand in the region."""

    def forward(self, x):
        return (x * 2).sum(-1, keepdim=True).expand_as(x)


def mask_task():
    return task_from_source(MASK_SOURCE, "mask_expanded")


def row_task():
    ex = extract(RowSumExpanded().eval(), (torch.randn(6, 40),))
    (task,) = ex.tasks
    return task


class StandIn:
    """A kernel under the ABI's contract, on the CPU: outputs must have the kernel's shapes
    (HTAM_ERR_SHAPE otherwise, as the generated host code answers); writes the region's values."""

    def __init__(self, task):
        self.task, self.ref = task, load_reference(task)

    def __call__(self, inputs, outputs) -> int:
        vals = self.ref(*inputs)
        vals = vals if isinstance(vals, tuple) else (vals,)
        for o, v, s in zip(outputs, vals, self.task.outputs):
            if tuple(o.shape) != s.kernel_shape(tuple(v.shape)):
                return HTAM_ERR_SHAPE
            for d in s.broadcast_dims:
                v = v.narrow(d, 0, 1)
            o.copy_(v)
        return 0


def test_an_expanded_output_is_written_before_its_expand():
    task = mask_task()
    scores, mask = task.outputs
    assert scores.broadcast_dims == () and scores.kernel_shape() == (2, 3, 16, 16)
    assert mask.broadcast_dims == (1,) and mask.kernel_shape() == (2, 1, 16, 16)
    assert mask.kernel_nbytes == 2 * 16 * 16
    # the launcher allocates what the kernel writes and hands back the expand (no copy)
    assert launcher.decode_out_meta(launcher.encode_out_meta(task.outputs))[1][:2] == (torch.bool, (2, 1, 16, 16))
    base = torch.zeros(2, 1, 16, 16, dtype=torch.bool)
    _, view = launcher.task_outputs([torch.zeros(2, 3, 16, 16), base], task.outputs)
    assert view.shape == (2, 3, 16, 16) and view.stride(1) == 0 and view.data_ptr() == base.data_ptr()
    # an output that is neither dense nor the expand of a contiguous tensor stays refused
    for spec in [TensorSpec((4, 8), "float32", (16, 1)), TensorSpec((4, 8, 2), "float32", (0, 1, 8))]:
        with pytest.raises(ValueError, match="allocates dense outputs"):
            launcher.encode_out_meta([spec])


@pytest.mark.parametrize("make", [mask_task, row_task], ids=["elementwise_mask", "row_sum"])
def test_the_program_stores_an_expanded_output_through_strides(make):
    task = make()
    prog = lower(task.graph)
    k = next(i for i, s in enumerate(task.outputs) if s.broadcast_dims)
    assert prog.outputs[k].broadcast and prog.outputs[k].dims is not None
    # the iteration sizes are never read off the expanded output (its sizes are 1 there)
    assert not (prog.size_source[0] == "out" and prog.size_source[1] == k)
    assert match_task(task, policy_for(task)).kind == task.kind


@pytest.mark.parametrize("make", [mask_task, row_task], ids=["elementwise_mask", "row_sum"])
def test_verify_hands_the_kernel_the_tensor_before_the_expand(make):
    task = make()
    ok, reason, detail, _ = verify(task, StandIn(task), load_reference(task), policy_for(task), device="cpu")
    assert ok, (reason, detail)

    def full_size(inputs, outputs) -> int:      # a kernel that wants the expanded shape is refused
        return 0 if all(tuple(o.shape) == s.shape for o, s in zip(outputs, task.outputs)) else HTAM_ERR_SHAPE
    ok, reason, detail, _ = verify(task, full_size, load_reference(task), policy_for(task), device="cpu")
    assert not ok and reason == "refused", (reason, detail)


@torch.library.custom_op("htam_test_expanded::run", mutates_args=())
def _run_op(handle: int, inputs: list[torch.Tensor], out_meta: list[int]) -> list[torch.Tensor]:
    kernel = _STAND_INS[handle]
    outs = [m.empty("cpu") for m in launcher.decode_out_meta(out_meta)]
    assert kernel(inputs, outs) == 0
    return outs


@_run_op.register_fake
def _(handle, inputs, out_meta):
    return [m.empty(inputs[0].device) for m in launcher.decode_out_meta(out_meta)]


_STAND_INS: dict[int, StandIn] = {}


def test_the_runtime_swaps_a_region_with_an_expanded_output():
    model, x = RowSumExpanded().eval(), torch.randn(6, 40)
    found = extract(model, (x,))
    (task,) = found.tasks
    kernel = StandIn(task)
    kernel.handle = 7001
    _STAND_INS[kernel.handle] = kernel
    provider = runtime.Provider(torch.ops.htam_test_expanded.run.default, lambda k: k)
    new, swapped = runtime.swap(found.capture.graphs[0], found.sites_of(0), {task.signature: kernel},
                                provider)
    assert [s.signature for s in swapped] == [task.signature], new.htam_load_errors
    (y,) = new(x)
    assert torch.equal(y, model(x)) and y.stride() == (1, 0)


@pytest.mark.build
@pytest.mark.skipif(paths.nvcc_path() is None, reason="needs nvcc")
def test_expanded_output_sources_compile_for_sm90a():
    todo = []
    for make in (mask_task, row_task):
        task = make()
        tm = match_task(task, policy_for(task))
        todo.append((task.name, tm.render(tm.defaults)))
    assert_compiles(todo)


@pytest.mark.gpu
@pytest.mark.parametrize("make", [mask_task, row_task], ids=["elementwise_mask", "row_sum"])
def test_expanded_output_kernels_verify_on_the_gpu(make):
    """The generated kernels under verify's protocol (poisoned outputs of the kernel's shapes,
    several seeds, the expand compared with the reference's), then with a contiguous full-size
    output too (any layout whose sizes match is written through its strides)."""
    from torch_htam.launcher import Kernel
    task = make()
    tm = match_task(task, policy_for(task))
    res = build.build_many([tm.render(tm.defaults)])[0]
    assert res.ok, res.error
    kernel = Kernel(res.so_path)
    ref = load_reference(task).cuda()
    ok, reason, detail, _ = verify(task, kernel, ref, policy_for(task))
    assert ok, (reason, detail)
    inputs = [x.cuda() for x in task_inputs(task)]
    want = ref(*inputs)
    want = list(want) if isinstance(want, tuple) else [want]
    outs = [torch.full(s.shape, 7, dtype=s.torch_dtype, device="cuda") for s in task.outputs]
    assert kernel(inputs, outs) == 0
    torch.cuda.synchronize()
    policy = policy_for(task)
    for o, w in zip(outs, want):      # (bools exactly; a row sum within the policy: another order)
        torch.testing.assert_close(o, w, atol=policy.atol, rtol=policy.rtol)


def task_inputs(task) -> list[torch.Tensor]:
    from torch_htam.verify import make_input
    gen = torch.Generator().manual_seed(0)
    return [make_input(s, s.shape, "normal", gen, "cpu") for s in task.inputs]
