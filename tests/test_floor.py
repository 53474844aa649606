"""torch.compile is the floor: each way in which optimize() once left a model slower than
torch.compile of it, as a test. Each ends on torch.compile, asserted from what is installed on the
model (its compiled call and the arm the decision chose), with a report note.

CPU tests use Inductor's CPU backend and a stand-in kernel op with the launcher's schema, whose
launches go through fallback.run_or_fallback as the real launcher's do. Timings are faked where
the test is about what the decision does with them (decide.Trials.time), never about speed.
"""
import importlib.util
import itertools
import sys
import textwrap

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_htam
from torch_htam.evaluation import Evaluation
from torch_htam import decide, fallback, inductor, runtime, serving
from torch_htam.config import OptimizeConfig
from torch_htam.deadline import Deadline
from torch_htam.decide import ArmKind, Outcome
from torch_htam.extract import extract
from torch_htam.launcher import decode_out_meta
from torch_htam.timing import ArmTime, ArmTimes, GradMode

# ---- a stand-in kernel op: the launcher's schema, the launcher's failure path --------------------

_KERNELS: dict[int, "StandIn"] = {}
_ids = itertools.count(10_001)


def _launch(handle, inputs, out_meta):
    k = _KERNELS[handle]
    k.calls += 1
    if k.fails or any(tuple(x.stride()) != tuple(s.stride) for x, s in zip(inputs, k.task.inputs)
                      if s.contiguous and x.numel() > 1):
        # what a real kernel does with inputs it was not verified on (launcher.cpp: reason())
        raise RuntimeError(f"htam kernel {handle} returned 1000: HTAM_ERR_SHAPE (the kernel does not "
                           "support these shapes/dtypes; run the original region)")
    outs = list(k.task.graph(*inputs))
    return [m.empty(o.device).copy_(o) for o, m in zip(outs, decode_out_meta(out_meta))]


@torch.library.custom_op("htam_floor::launch", mutates_args=())
def launch_op(handle: int, inputs: list[torch.Tensor], out_meta: list[int]) -> list[torch.Tensor]:
    return fallback.run_or_fallback(handle, inputs, out_meta, _launch)


@launch_op.register_fake
def _(handle, inputs, out_meta):
    return [m.empty(inputs[0].device) for m in decode_out_meta(out_meta)]


class StandIn:
    """Kernel-like (`.handle`): runs the task's own region graph; `fails`: every launch raises."""

    def __init__(self, task, fails=False, vs_inductor=1.5):
        self.task, self.fails, self.calls = task, fails, 0
        self.handle = next(_ids)
        self.speedup = 2.0
        self.evaluation = Evaluation(True, "ok", speedup=2.0, compile_speedup=vs_inductor, ref_ms=1.0)
        _KERNELS[self.handle] = self


PROVIDER = runtime.Provider(torch.ops.htam_floor.launch.default, lambda k: k)


@pytest.fixture
def stand_ins(monkeypatch):
    """Every compile the decision makes runs the stand-in op for its kernels."""
    real = inductor.compile_with

    def compile_with(m, b, mode="default", options=None):
        if b is not None:
            b.provider = PROVIDER
        return real(m, b, mode, options)
    monkeypatch.setattr(inductor, "compile_with", compile_with)
    monkeypatch.setattr(runtime, "launcher_provider", lambda: PROVIDER)


def _times(ms: float) -> ArmTimes:
    return ArmTimes(ArmTime(ms, ms * 0.99, ms * 1.01), ArmTime(ms, ms * 0.99, ms * 1.01))


def fake_timing(monkeypatch, ms_of):
    """decide's timings come from ms_of(arm) (ms, both ways)."""
    def time(self, arms, overrun=False):
        for a in arms:
            if not a.error:
                a.times = _times(ms_of(a))
        return True
    monkeypatch.setattr(decide.Trials, "time", time)


def on_compile(model) -> bool:
    """The model's calls run a torch.compile that optimize installed (not eager, not the replay)."""
    return (model.__dict__.get("_compiled_call_impl") is not None and "forward" not in model.__dict__
            and model.htam_report.decision.chosen.kind in (ArmKind.COMPILE, ArmKind.KERNELS, ArmKind.REEXPORT))


class Block(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.fc = nn.Linear(d, 2 * d)
        self.proj = nn.Linear(2 * d, d)
        self.ln = nn.LayerNorm(d)

    def forward(self, x):
        return self.ln(x + self.proj(F.gelu(self.fc(x))))


def _cfg(**kw):
    return OptimizeConfig(progress=False, **kw)


# ---- the ways the floor broke ---------------------------------------------------------------------

_PROBLEM = textwrap.dedent('''
    import torch
    import torch.nn as nn

    def scale(x):                      # a module-level helper the forward reaches by its globals
        return torch.relu(x) * 0.5

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)

        def forward(self, x):
            return scale(self.conv(x)) + 1.0

    def get_inputs():
        return [torch.randn(2, 3, 16, 16)]

    def get_init_inputs():
        return []
''')


def test_a_model_from_a_module_not_in_sys_modules_ends_on_torch_compile(tmp_path, monkeypatch):
    """KernelBench's harness loads a problem with spec_from_file_location + exec_module and never
    registers it: Dynamo, tracing from a function of ours, re-imported the forward's module by
    name and failed (torch 2.11), and optimize fell to eager at 0.2-0.44x of torch.compile."""
    path = tmp_path / "kb_problem_floor.py"
    path.write_text(_PROBLEM)
    spec = importlib.util.spec_from_file_location("kb_problem_floor_unregistered", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert "kb_problem_floor_unregistered" not in sys.modules
    model, (x,) = mod.Model().eval(), mod.get_inputs()
    fake_timing(monkeypatch, lambda a: 1.0 if a.kind is not ArmKind.ORIGINAL else 2.0)
    with torch.no_grad():
        ref = model(x)
        torch_htam.optimize(model, (x,), _cfg())
        assert on_compile(model), model.htam_report.format()
        assert not any(a.error for a in model.htam_report.decision.arms), model.htam_report.format()
        torch.testing.assert_close(model(x), ref, rtol=1e-4, atol=1e-4)
    assert model.htam_report.note


def test_a_kernel_that_fails_at_run_time_costs_its_region_not_the_model(stand_ins, monkeypatch):
    """A kernel verified on its task that raises inside the model (HTAM_ERR_SHAPE on a layout it
    never saw) ran its region for that call, was dropped, and the model ends on torch.compile,
    not eager (it once fell to eager at 0.55x of torch.compile)."""
    torch.manual_seed(0)
    model, x = Block().eval(), torch.randn(4, 8, 32)
    found = extract(model, (x,))
    kernels = {t.signature: StandIn(t, fails=True) for t in found.tasks}
    sigs = list(kernels)
    # kernels would win if they worked: only their failure can keep them out
    fake_timing(monkeypatch, lambda a: {ArmKind.KERNELS: 0.5, ArmKind.ORIGINAL: 2.0}.get(a.kind, 1.0))
    with torch.no_grad():
        ref = model(x)
        d = decide.decide(model, (x,), _cfg(), found, kernels, Deadline(), ranked=sigs, every=sigs)
        decide.install(model, d, found, kernels, sigs)
        rep = model.htam_report
        assert on_compile(model) and d.chosen.kind is ArmKind.COMPILE, rep.format()
        assert rep.kernel_failures and set(rep.kernel_failures) <= set(sigs), rep.format()
        assert all(t.status is runtime.TaskStatus.FAILED_AT_RUN_TIME for t in rep.tasks if t.signature in sigs)
        # and why, in the launch's own words
        assert all("HTAM_ERR_SHAPE" in t.detail and "strides" in t.detail for t in rep.tasks
                   if t.signature in sigs), rep.format()
        # each task says what kind of region it is and its eager time (the kernel's verification)
        kinds = {t.signature: t.kind for t in found.tasks}
        assert all(t.kind == kinds[t.signature] and t.ref_ms == 1.0 for t in rep.tasks
                   if t.signature in sigs)
        assert "failed at run time" in rep.format()
        torch.testing.assert_close(model(x), ref, rtol=1e-5, atol=1e-5)


def test_run_or_fallback_runs_the_region_in_the_launch_layout(stand_ins):
    """The fallback's outputs are what the launch would have returned: out_meta's dtype, shape
    and memory format; the failure is counted once per call; an unregistered handle re-raises."""
    from torch_htam.launcher import encode_out_meta
    torch.manual_seed(0)
    model, x = Block().eval(), torch.randn(4, 8, 32)
    task = extract(model, (x,)).tasks[0]
    k = StandIn(task, fails=True)
    fallback.register(k.handle, task)
    inputs = [torch.randn(s.shape, dtype=s.torch_dtype) for s in task.inputs]
    meta = encode_out_meta(task.outputs)
    before = fallback.failures().get(k.handle, 0)
    outs = fallback.run_or_fallback(k.handle, inputs, meta, _launch)
    expect = task.graph(*inputs)
    assert [tuple(o.shape) for o in outs] == [tuple(s.shape) for s in task.outputs]
    for o, e in zip(outs, expect):
        torch.testing.assert_close(o, e)
    assert fallback.failures()[k.handle] == before + 1
    with pytest.raises(RuntimeError, match="HTAM_ERR_SHAPE"):
        fallback.run_or_fallback(next(_ids), inputs, meta, lambda *a: _launch(k.handle, *a[1:]))


def test_a_capture_failure_ends_on_torch_compile(monkeypatch):
    from torch_htam import extract as extract_mod
    model, x = Block().eval(), torch.randn(4, 8, 32)

    def broken(*a, **k):
        raise RuntimeError("export exploded")
    monkeypatch.setattr(extract_mod, "extract", broken)
    fake_timing(monkeypatch, lambda a: 1.0 if a.kind is ArmKind.COMPILE else 2.0)
    with torch.no_grad():
        ref = model(x)
        torch_htam.optimize(model, (x,), _cfg())
        assert on_compile(model) and model.htam_report.outcome is Outcome.COMPILE
        assert "export exploded" in model.htam_report.note
        torch.testing.assert_close(model(x), ref, rtol=1e-5, atol=1e-5)


def test_a_failing_trial_compile_is_dropped_not_the_run(stand_ins, monkeypatch):
    """A trial (torch.compile with our kernels) that raises is one arm lost: the floor stays."""
    model, x = Block().eval(), torch.randn(4, 8, 32)
    found = extract(model, (x,))
    kernels = {t.signature: StandIn(t) for t in found.tasks}
    sigs = list(kernels)
    real = inductor.compile_with

    def compile_with(m, b, mode="default", options=None):
        if b is not None and b.kernels:
            raise RuntimeError("Inductor could not lower the trial")
        return real(m, b, mode, options)
    monkeypatch.setattr(inductor, "compile_with", compile_with)
    fake_timing(monkeypatch, lambda a: {ArmKind.KERNELS: 0.5, ArmKind.ORIGINAL: 2.0, ArmKind.REPLAY: 2.0}.get(a.kind, 1.0))
    with torch.no_grad():
        d = decide.decide(model, (x,), _cfg(), found, kernels, Deadline(), ranked=sigs, every=sigs)
        decide.install(model, d, found, kernels, sigs)
    tried = [a for a in d.arms if a.kind is ArmKind.KERNELS]
    assert tried and all("could not lower" in a.error for a in tried)
    assert on_compile(model) and d.outcome is Outcome.COMPILE and model.htam_report.note


@pytest.mark.parametrize("second_ms, kept", [(0.5, True), (1.0, False), (1.3, False)])
def test_a_kernel_choice_stays_only_if_it_beats_the_floor_when_timed_again(stand_ins, monkeypatch,
                                                                           second_ms, kept):
    """The kernels arm wins its trial (0.5 ms against the floor's 1.0); timed again beside the
    floor it is kept only if it still wins there, else the floor stays and the report says why."""
    model, x = Block().eval(), torch.randn(4, 8, 32)
    found = extract(model, (x,))
    kernels = {t.signature: StandIn(t) for t in found.tasks}
    sigs = list(kernels)
    timed = {}

    def ms_of(a):
        if a.kind is not ArmKind.KERNELS:
            return {ArmKind.ORIGINAL: 2.0, ArmKind.REPLAY: 2.0}.get(a.kind, 1.0)
        timed[id(a)] = timed.get(id(a), 0) + 1
        return 0.5 if timed[id(a)] == 1 else second_ms
    fake_timing(monkeypatch, ms_of)
    with torch.no_grad():
        d = decide.decide(model, (x,), _cfg(), found, kernels, Deadline(), ranked=sigs, every=sigs)
    assert max(timed.values()) == 2              # the chosen arm was timed a second time
    if kept:
        assert d.outcome is Outcome.KERNELS and d.chosen.kind is ArmKind.KERNELS
    else:
        assert d.outcome is Outcome.COMPILE and d.chosen.kind is ArmKind.COMPILE
        assert "not confirmed" in d.reason


class Breaks(nn.Module):
    """A forward with a graph break: its frames (forward, its resume) are the user's code objects."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x):
        h = torch.relu(self.a(x))
        torch._dynamo.graph_break()
        return self.b(h) + 1


def test_graph_breaks_do_not_exhaust_the_users_recompile_limit(monkeypatch):
    """Every trial compiles the forward's frames again with its own backend, which Dynamo counts
    as recompiles of the user's code: with the user's limit at 2, the trials once pushed the
    chosen arm (or the user's next compile) past it, onto eager, silently."""
    import torch._dynamo.config as dcfg
    from torch._dynamo.testing import CompileCounter
    monkeypatch.setattr(dcfg, "recompile_limit", 2)
    get = torch._C._dynamo.eval_frame._debug_get_cache_entry_list
    model, x = Breaks().eval(), torch.randn(4, 16)
    fake_timing(monkeypatch, lambda a: 1.0 if a.kind is not ArmKind.ORIGINAL else 2.0)
    with torch.no_grad():
        torch_htam.optimize(model, (x,), _cfg())
        assert on_compile(model), model.htam_report.format()
        assert len(get(Breaks.forward.__code__)) <= 1       # the trials' entries are gone
        model(x)
        other, counter = Breaks().eval(), CompileCounter()
        torch.compile(other, backend=counter)(x)             # the user's own compile still compiles
        assert counter.frame_count >= 1


@pytest.mark.parametrize("mode", [GradMode.NO_GRAD, GradMode.INFERENCE])
def test_the_callers_grad_mode_is_the_one_compiled_and_timed(monkeypatch, mode):
    """A model compiled under inference_mode recompiles on its first no_grad call: optimize
    compiles and times in the caller's mode, so the user's calls hit what was compiled."""
    from torch._dynamo.utils import counters
    seen = []

    def time(self, arms, overrun=False):
        seen.append(GradMode.current())
        for a in arms:
            a.times = _times(1.0 if a.kind is not ArmKind.ORIGINAL else 2.0)
        return True
    monkeypatch.setattr(decide.Trials, "time", time)
    model, x = Block().eval(), torch.randn(4, 8, 32)
    with mode.enter():
        torch_htam.optimize(model, (x,), _cfg())
    assert model.htam_report.decision.grad is mode and on_compile(model)
    frames = counters["stats"]["unique_graphs"]
    with mode.enter():
        model(x)
    assert counters["stats"]["unique_graphs"] == frames     # no recompile on the user's first call


def test_a_producer_layout_unlike_the_consumers_spec_is_constrained(stand_ins):
    """A kernel verified on NCHW input handed a channels-last tensor (its producer swapped to a
    kernel writing channels-last) raised HTAM_ERR_SHAPE inside the compiled model. Every dense
    input is now constrained to its spec's strides: the stand-in (which raises on other strides,
    as a real kernel does) runs without a single failure, replayed and compiled."""
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(4, 8, 3, padding=1)

        def forward(self, x):
            y = self.conv(x)
            return torch.sigmoid(y.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)) * 2.0

    model, x = Net().eval(), torch.randn(2, 4, 8, 8)
    found = extract(model, (x,))
    kernels = {t.signature: StandIn(t) for t in found.tasks}
    with torch.no_grad():
        ref = model(x)
        gm, swapped = runtime.swap(found.capture.graphs[0], found.sites_of(0), kernels, PROVIDER,
                                   force_layouts=True)
        before = sum(fallback.failures(set(gm.htam_handles.values())).values())
        out = gm(x)[0]
        compiled = torch.compile(gm)
        out_c = compiled(x)[0]
    assert swapped
    assert sum(fallback.failures(set(gm.htam_handles.values())).values()) == before
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out_c, ref, rtol=1e-5, atol=1e-5)


def test_restore_gives_back_the_users_own_compile():
    """A user who called model.compile() before optimize gets that compile back on restore (it
    used to be cleared)."""
    model = Block().eval()
    model.compile()
    users = model._compiled_call_impl
    from torch_htam import attach
    attach.compiled(model, lambda *a: None, runtime.Report())
    assert model._compiled_call_impl is not users
    torch_htam.restore(model)
    assert model._compiled_call_impl is users and "htam_report" in model.__dict__


def test_the_deadline_skips_what_does_not_fit_and_says_so(monkeypatch):
    """With no time left after the floor, nothing else is compiled or timed: the floor stays,
    untimed, and the report names what was skipped."""
    model, x = Block().eval(), torch.randn(4, 8, 32)
    with torch.no_grad():
        torch_htam.optimize(model, (x,), _cfg(time_budget_s=1e-3))
    rep = model.htam_report
    assert on_compile(model) and rep.outcome is Outcome.NOT_TIMED, rep.format()
    assert rep.skipped and any("time budget" in s for s in rep.skipped)
    assert set(rep.phases) >= {"capture", "decide: compile"}


def test_better_needs_a_gain_beyond_noise_and_no_loss_either_way():
    base = _times(1.0)
    assert decide.better(base, ArmTimes(ArmTime(0.9, 0.89, 0.91), ArmTime(1.0, 0.99, 1.01)))
    assert not decide.better(base, ArmTimes(ArmTime(0.9, 0.89, 0.91), ArmTime(1.1, 1.09, 1.11)))
    assert not decide.better(base, _times(0.99))                 # inside the noise
    assert decide.better(base, ArmTimes(ArmTime(1.01, 1.0, 1.02), ArmTime(0.8, 0.79, 0.81)))


def _rounds(rounds: list[float]) -> ArmTimes:
    """An arm timed in these rounds (round medians, ms), both ways alike."""
    import statistics
    q = statistics.quantiles(rounds, n=5)
    t = ArmTime(statistics.median(rounds), q[0], q[-1], round_ms=list(rounds))
    return ArmTimes(t, t)


def test_better_compares_arms_round_by_round_where_they_shared_rounds():
    # a host-bound process drifting between 2.6 and 3.8 ms: ours 5% faster in every round, though
    # its 80th percentile is above base's median (the medians alone would refuse it)
    drift = [2.6, 2.7, 2.6, 3.8, 3.7, 3.8, 2.7, 3.8, 2.6, 3.7, 2.7, 3.8, 2.6, 3.7, 2.7]
    base, ours = _rounds(drift), _rounds([x * 0.95 for x in drift])
    assert ours.latency.p80_ms > base.latency.median_ms and decide.better(base, ours)
    # the same medians, but ours the slower in 4 of 15 rounds: not beyond noise
    mixed = [x * (1.03 if i % 4 == 0 else 0.9) for i, x in enumerate(drift)]
    assert not decide.better(base, _rounds(mixed))
    # faster in every round, by less than the margin
    assert not decide.better(base, _rounds([x * 0.99 for x in drift]))
    # rounds of different timings are not paired: the medians decide
    assert not decide.better(base, _rounds([x * 0.95 for x in drift[:10]]))


# ---- on the GPU: the real launcher, inside Inductor's generated code -------------------------------

# A kernel that refuses every call, as one handed a layout it was never verified on does.
REFUSES_CU = r"""
#include "htam_abi.h"
HTAM_ENTRY htam_run(const HtamTensor* in, int n_in, HtamTensor* out, int n_out, cudaStream_t s) {
  return HTAM_ERR_SHAPE;
}
"""


@pytest.mark.gpu
def test_gpu_a_refusing_kernel_inside_the_compiled_model_runs_its_region_and_is_dropped(tmp_path, monkeypatch):
    """The launcher's failure path through inductor.direct_call (extern_kernels.htam_launch):
    the region runs in each failing call, the decision drops the kernel, the model ends on
    torch.compile and is right."""
    from test_runtime import BiasGelu
    from torch_htam import launcher
    from torch_htam.build import build_many
    torch.manual_seed(0)
    model, x = BiasGelu().cuda().eval(), torch.randn(16, 256, device="cuda")
    found = extract(model, (x,))
    target = [t for t in found.tasks if t.kind == "elementwise" and any("gelu" in op for op in t.ops)]
    res = build_many([REFUSES_CU], out_dir=tmp_path)[0]
    assert res.ok, res.log
    kernel = launcher.Kernel(res.so_path)
    kernel.evaluation = Evaluation(True, "ok", speedup=2.0, compile_speedup=2.0, ref_ms=1.0)
    kernels = {target[0].signature: kernel}
    sigs = list(kernels)
    fake_timing(monkeypatch, lambda a: {ArmKind.KERNELS: 0.5, ArmKind.ORIGINAL: 2.0}.get(a.kind, 1.0))
    with torch.no_grad():
        ref = model(x)
        d = decide.decide(model, (x,), _cfg(), found, kernels, Deadline(), ranked=sigs, every=sigs)
        decide.install(model, d, found, kernels, sigs)
        assert on_compile(model) and d.chosen.kind is ArmKind.COMPILE, model.htam_report.format()
        assert model.htam_report.kernel_failures.get(sigs[0], 0) >= 1
        torch.testing.assert_close(model(x), ref, rtol=1e-5, atol=1e-5)
    torch._dynamo.reset()


def test_an_arm_whose_output_differs_from_the_original_is_dropped(stand_ins, monkeypatch):
    """Kernels verified one region at a time can still compose wrongly in the model: an arm is
    checked whole against the original forward before it can be chosen, however fast it is."""
    model, x = Block().eval(), torch.randn(4, 8, 32)
    found = extract(model, (x,))
    kernels = {t.signature: StandIn(t) for t in found.tasks}
    sigs = list(kernels)
    real = _launch

    def off_by_one(handle, inputs, out_meta):      # right shapes, wrong values
        return [o + 1.0 for o in real(handle, inputs, out_meta)]
    monkeypatch.setattr(sys.modules[__name__], "_launch", off_by_one)
    fake_timing(monkeypatch, lambda a: {ArmKind.KERNELS: 0.5, ArmKind.REPLAY: 0.5, ArmKind.ORIGINAL: 2.0}.get(a.kind, 1.0))
    with torch.no_grad():
        ref = model(x)
        d = decide.decide(model, (x,), _cfg(), found, kernels, Deadline(), ranked=sigs, every=sigs)
        decide.install(model, d, found, kernels, sigs)
        tried = [a for a in d.arms if a.kind in (ArmKind.KERNELS, ArmKind.REPLAY)]
        assert tried and all(a.error and "wrong output" in a.error for a in tried), [a.error for a in tried]
        assert on_compile(model) and d.chosen.kind is ArmKind.COMPILE
        torch.testing.assert_close(model(x), ref, rtol=1e-5, atol=1e-5)


def test_a_decision_timed_on_a_busy_host_says_so(monkeypatch):
    """Timing waits for other processes to leave the host's cores; where they don't within the
    wait, the decision and the report say the figures carry their load."""
    from torch_htam import timing
    model, x = Block().eval(), torch.randn(4, 8, 32)
    waits = []
    monkeypatch.setattr(timing, "on_cuda", lambda inputs: True)         # as if the model ran on a GPU
    monkeypatch.setattr(timing, "_sync_for", lambda inputs: lambda: None)
    monkeypatch.setattr(timing, "_device_ms", lambda fn, inputs, cover_ms: 1.0)
    monkeypatch.setattr(timing, "wait_for_quiet_host",
                        lambda max_s: waits.append(max_s) or timing.HostLoad(3.2, max_s))
    with torch.no_grad():
        d = decide.decide(model, (x,), _cfg(), None, {}, Deadline())
    # the first timing waits its whole limit; later ones, on a host that stayed busy, do not
    assert len(waits) >= 2 and waits[0] == timing.QUIET_MAX_S and set(waits[1:]) == {0.0}
    assert d.host_notes and "3.2 CPU cores" in d.host_notes[0] and d.to_json()["host"] == d.host_notes


# ---- declared dynamic sizes: the example's own sizes as plain torch.compile serves them -------------

def test_example_split_routes_by_the_declared_inputs_shapes():
    seen = []
    split = serving.ExampleSplit(lambda *a, **k: seen.append("static"), lambda *a, **k: seen.append("dynamic"),
                                ((0, torch.Size([4, 8])),))
    split(torch.randn(4, 8), torch.randn(3))        # input 1 is not declared: its size is not asked
    split(torch.randn(5, 8))
    split(x=torch.randn(4, 8))                       # a keyword input is not the declared positional one
    assert seen == ["static", "dynamic", "dynamic"]


@pytest.mark.parametrize("static_ms", [1.0, 2.0])
def test_declared_sizes_serve_the_example_on_torch_compiles_own_graph_for_it(monkeypatch, static_ms):
    """With a declared dynamic batch, torch.compile(model) itself would run the example's batch on
    a graph specialized to it (often faster: channels-last convs) and every other batch on a
    dynamic graph. optimize keeps that graph for the example's sizes unless its choice beats it
    there; either way no call recompiles, whichever size comes, batch 1 included (Dynamo
    specializes size 1 in every dynamic graph: optimize compiles that graph too)."""
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    fake_timing(monkeypatch, lambda a: {ArmKind.ORIGINAL: 3.0, ArmKind.STATIC: static_ms}.get(a.kind, 1.5))
    model, x = Block().eval(), torch.randn(4, 8, 32)
    with torch.no_grad():
        ref = []
        for n in (1, 4, 7):
            torch.manual_seed(0)
            ref.append(model(torch.randn(n, 8, 32)))
        torch_htam.optimize(model, (x,), _cfg(dynamic={0: {0: (1, 16)}}))
        d = model.htam_report.decision
        assert [a.kind for a in d.arms][:3] == [ArmKind.COMPILE, ArmKind.STATIC, ArmKind.ORIGINAL], d.arms
        split = isinstance(model._compiled_call_impl, serving.ExampleSplit)
        assert split == (static_ms == 1.0) and (d.at_example is not None) == split, model.htam_report.format()
        graphs = counters["stats"]["unique_graphs"]
        for n, want in zip((1, 4, 7), ref):
            torch.manual_seed(0)
            assert torch.allclose(model(torch.randn(n, 8, 32)), want, atol=1e-5)
        for n in (4, 16, 2, 4, 9, 1):
            model(torch.randn(n, 8, 32))
        assert counters["stats"]["unique_graphs"] == graphs, "a served size recompiled"
    torch._dynamo.reset()


@pytest.mark.parametrize("twin_ms, serves", [(0.8, "twin"), (0.995, "static"), (None, "static")])
def test_a_chosen_cxx_wrapper_offers_the_example_its_static_twin(monkeypatch, twin_ms, serves):
    """Where the chosen arm runs Inductor's C++ wrapper, torch.compile's graph for the example's
    sizes is offered with that wrapper too, and serves them where it beats the plain one beyond
    noise (None: its compile failed)."""
    from torch_htam.inductor import WRAPPER_OPTIONS
    x = torch.randn(4, 8)
    t = decide.Trials(Block(8).eval(), (x,), _cfg(dynamic={0: {0: (1, 16)}}), GradMode.current(), Deadline(None))
    t.plain = (x,)
    calls = {}

    def ready(self, arm):
        self.arms.append(arm)
        arm.call = calls.setdefault(id(arm), lambda *a, arm=arm: arm)
        arm.error = "compile failed" if arm.kind is ArmKind.STATIC and arm.options and twin_ms is None else None
        return arm
    monkeypatch.setattr(decide.Trials, "ready", ready)
    ms = {(ArmKind.STATIC, False): 1.0, (ArmKind.STATIC, True): twin_ms, (ArmKind.WRAPPER, True): 1.1}
    fake_timing(monkeypatch, lambda a: ms[a.kind, bool(a.options)])
    static = t.ready(decide.Arm(ArmKind.STATIC))
    chosen = t.ready(decide.Arm(ArmKind.WRAPPER, options=dict(WRAPPER_OPTIONS)))
    d = t.at_example(decide.Decision(chosen, Outcome.WRAPPER, "the wrapper"))
    assert isinstance(chosen.call, serving.ExampleSplit) and chosen.call(torch.randn(5, 8)) is chosen
    want = static if serves == "static" else next(a for a in t.arms if a.kind is ArmKind.STATIC and a.options)
    assert d.at_example is want and chosen.call(x) is want, d.reason
    # the reason and the timing records tell the two graphs for the example's sizes apart
    assert ("sizes with Inductor's C++ wrapper (" in d.reason) is (serves == "twin"), d.reason
    static_arms = [a for a in t.arms if a.kind is ArmKind.STATIC]
    assert len({a.name for a in static_arms}) == len(static_arms)


def test_a_static_arm_on_channels_last_options_is_not_named_for_the_cxx_wrapper():
    from torch_htam.inductor import WRAPPER_OPTIONS
    layout = decide.Arm(ArmKind.STATIC, options=dict(decide.LAYOUT_OPTIONS)).name
    assert "C++" not in layout and layout == decide.Arm(ArmKind.STATIC).name
    assert decide.Arm(ArmKind.STATIC, options=dict(WRAPPER_OPTIONS)).name.endswith("with Inductor's C++ wrapper")


def test_size_one_inputs_take_each_range_starting_at_one_to_size_one_together():
    ids, mask = torch.arange(12).view(3, 4), torch.ones(3, 4)
    dyn = {0: {0: (1, 8), 1: (2, 16)}, 1: {0: (1, 8), 1: (2, 16)}}
    (one,) = serving.size_one_inputs((ids, mask), dyn)            # the batch range only: 2-16 is no 1
    assert [tuple(t.shape) for t in one] == [(1, 4), (1, 4)] and one[0].tolist() == [[0, 1, 2, 3]]
    seq = serving.size_one_inputs((ids,), {0: {0: (1, 8), 1: (1, 16)}})
    assert [tuple(a[0].shape) for a in seq] == [(1, 4), (3, 1)]
    assert serving.size_one_inputs((ids,), None) == [] and serving.size_one_inputs((ids[:1],), {0: {0: (1, 8)}}) == []


def test_the_size_one_graph_is_compiled_for_tensors_made_as_the_example_was(monkeypatch):
    """optimize called under inference_mode with an example made outside it: the size-1 graph it
    compiles must take a batch-1 request made the same way (Dynamo's guards tell an inference
    tensor from another, so one made in inference mode would leave the request a recompile)."""
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    fake_timing(monkeypatch, lambda a: 3.0 if a.kind is ArmKind.ORIGINAL else 1.0)
    model, x, one = Block().eval(), torch.randn(4, 8, 32), torch.randn(1, 8, 32)
    with torch.inference_mode():
        torch_htam.optimize(model, (x,), _cfg(dynamic={0: {0: (1, 16)}}))
        graphs = counters["stats"]["unique_graphs"]
        model(one)
        assert counters["stats"]["unique_graphs"] == graphs, "the batch-1 request recompiled"
    torch._dynamo.reset()


def test_prime_calls_every_size_of_a_short_range_once_while_the_deadline_allows():
    x = torch.randn(4, 3)
    seen = []
    call = lambda y: seen.append(y.shape[0])                     # noqa: E731
    assert serving.prime(call, (x,), {0: {0: (1, 6)}}, lambda s: True) is None
    assert seen == [2, 3, 5, 6]                                  # not 1 (its own graph) nor the example's 4
    seen.clear()
    assert serving.prime(call, (x,), {0: {0: (1, 6)}}, lambda s: len(seen) < 2) == "sizes 5-6 of the declared range 1-6"
    seen.clear()
    assert serving.prime(call, (x,), {0: {0: (1, 1000)}}, lambda s: True) is None and seen == []   # too long a range


def test_prime_sizes_and_the_first_call_that_prices_them():
    """serving.prime_sizes: what prime() calls (from 2, not the example's, short ranges only);
    first_call_s times one call at the middle one of them and counts them."""
    x = torch.randn(4, 3)
    assert serving.prime_sizes((x,), {0: {0: (1, 6)}}) == [((1, 6), 2), ((1, 6), 3), ((1, 6), 5), ((1, 6), 6)]
    seen = []
    seconds, count = serving.first_call_s(lambda y: seen.append(y.shape[0]), (x,), {0: {0: (1, 6)}})
    assert seen == [5] and count == 4 and seconds >= 0.0
    assert serving.first_call_s(lambda y: seen.append(y), (x,), {0: {0: (1, 1000)}}) is None and seen == [5]


def test_the_trials_keep_the_primings_time(monkeypatch):
    """Trials.time_first_call: where the capture holds convs of symbolic sizes, prime_s is the
    floor's first call at a new size times the sizes settle() primes, at most PRIME_KEEP_SHARE of
    the time left; affords() and the size-1 compile leave it."""
    from types import SimpleNamespace
    conv = torch.fx.symbolic_trace(nn.Sequential(nn.Conv2d(3, 4, 3)))
    found = SimpleNamespace(capture=SimpleNamespace(dynamic=True, graphs=[conv]))
    x = torch.randn(4, 3, 8, 8)
    monkeypatch.setattr(serving, "_timed_call", lambda call, args: 0.5)     # each first call: 0.5 s
    monkeypatch.setattr(decide.Trials, "timing_s", lambda self, n: 1.0 * n)

    def trials(budget_s):
        t = decide.Trials(nn.Identity(), (x,), _cfg(dynamic={0: {0: (1, 6)}}), GradMode.current(), Deadline(budget_s))
        t.arms.append(decide.Arm(ArmKind.COMPILE, call=lambda y: y))
        t.compile_s = 10.0
        return t
    t = trials(None)
    t.time_first_call(SimpleNamespace(capture=SimpleNamespace(dynamic=True, graphs=[])))   # no conv: no priming
    assert t.prime_s == 0.0
    t.time_first_call(found)
    assert t.prime_s == pytest.approx(4 * 0.5) and t.deadline.phases["decide: a first call's time"] >= 0.0
    t = trials(100.0)
    t.time_first_call(found)
    assert t.prime_s == pytest.approx(2.0)
    assert t.affords(2, keep_s=80.0) and not t.affords(2, keep_s=87.0)   # 10 + 2 + 80 + 2 <= 100 < 10 + 2 + 87 + 2
    t = trials(20.0)
    t.time_first_call(found)
    assert t.prime_s == pytest.approx(decide.PRIME_KEEP_SHARE * 20.0, abs=0.1)   # at most a share of the time left
    t = trials(None)
    t.arms[0].call = lambda y: 1 / 0
    monkeypatch.setattr(serving, "_timed_call", lambda call, args: call(*args))
    t.time_first_call(found)                       # the floor failing there: nothing kept, no error
    assert t.prime_s == 0.0


def test_a_served_convnet_is_primed_at_every_size_of_its_range(monkeypatch):
    """optimize calls a served model with convs once at each size of a short declared range, so
    that the per-size planning of its convs is not a request's."""
    torch._dynamo.reset()
    fake_timing(monkeypatch, lambda a: 3.0 if a.kind is ArmKind.ORIGINAL else 1.0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 8 * 8, 5)).eval()
    sizes = []
    model.register_forward_pre_hook(lambda m, a: sizes.append(a[0].shape[0]))
    with torch.no_grad():
        torch_htam.optimize(model, (torch.randn(3, 3, 8, 8),), _cfg(dynamic={0: {0: (1, 5)}}))
    phases = model.htam_report.phases
    assert "decide: priming sizes" in phases and "decide: a first call's time" in phases, model.htam_report.format()
    assert {2, 4, 5} <= set(sizes)
    torch._dynamo.reset()
