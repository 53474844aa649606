"""Kernels over a declared size range, on CPU: the shape set spans the range (1, odd sizes, powers
of two, the max) and a kernel is judged per bucket of sizes, so one wrong at size 1 or at odd sizes
is kept only where it is right. Python 'kernels' stand in for CUDA ones (as in test_verify.py)."""
import pytest
import torch
import torch.nn.functional as F

from torch_htam import verify as V
from torch_htam.policy import make
from torch_htam.task import Task, load_reference

from test_verify import GELU_SRC, spec


def ranged_task(rows=64, cols=32, low=1, high=64):
    """gelu(x) * w + b with x's rows (and the output's) declared dynamic over [low, high]."""
    x = spec((rows, cols)).with_ranges({0: (low, high)})
    out = spec((rows, cols)).with_ranges({0: (low, high)})
    return Task("gelu_affine", "elementwise", GELU_SRC, [x, spec((cols,)), spec((cols,))], [out],
                "sig", ["aten.gelu.default"])


def honest(inputs, outputs):
    x, w, b = inputs
    outputs[0].copy_(F.gelu(x) * w + b)
    return 0


def wrong_at_one(inputs, outputs):
    """A GEMV-style special case for one row that forgets the bias."""
    x, w, b = inputs
    outputs[0].copy_(F.gelu(x) * w if x.shape[0] == 1 else F.gelu(x) * w + b)
    return 0


def pairs_of_rows(inputs, outputs):
    """Processes rows two at a time and drops the last row of an odd count (1, 7, 127)."""
    x, w, b = inputs
    n = x.shape[0] // 2 * 2
    outputs[0][:n].copy_(F.gelu(x[:n]) * w + b)
    return 0


def wrong_at_example(inputs, outputs):
    honest(inputs, outputs)
    if inputs[0].shape[0] == 64:
        outputs[0][0, 0] += 1.0
    return 0


def run(kernel, task=None):
    task = task or ranged_task()
    return V.verify_range(task, kernel, load_reference(task), make("fp32"), device="cpu")


def spans(verdicts):
    return [(v.bucket.low, v.bucket.high) for v in verdicts]


# ------------------------------------------------------------------------------ the shape set

def test_the_shape_set_spans_the_range_under_the_cap():
    task = ranged_task(high=2048)
    rs = V.range_shapes(task)
    assert rs.sizes[0] == 64                                    # the example first
    assert {1, 7, 127, 2048} <= set(rs.sizes) and len(rs.sizes) <= V.MAX_RANGE_SHAPES
    assert any(n & (n - 1) == 0 and n > 1 for n in rs.sizes)   # a power of two
    assert len(set(rs.sizes)) == len(rs.sizes) and rs.skipped == []
    assert rs.sets[rs.sizes.index(7)] == ([(7, 32), (32,), (32,)], [(7, 32)])
    assert V.shape_sets(task) == rs.sets                        # verify() runs the same set
    # every bucket gets a size
    assert all(any(b.holds(n) for n in rs.sizes) for b in V.buckets_for(task))


def test_only_sizes_inside_the_range():
    rs = V.range_shapes(ranged_task(high=64))
    assert 127 not in rs.sizes and max(rs.sizes) == 64 and {1, 7} <= set(rs.sizes)
    rs = V.range_shapes(ranged_task(rows=16, low=4, high=100))
    assert min(rs.sizes) == 4 and 100 in rs.sizes and 1 not in rs.sizes


def test_sizes_over_the_byte_cap_are_skipped_and_said():
    task = ranged_task(high=4096)
    per_row = 2 * 32 * 4                                        # x and the output, fp32
    rs = V.range_shapes(task, max_bytes=per_row * 1000)
    assert max(rs.sizes) == 512                                 # as near the max as fits
    assert any("size 4096" in s and "over the cap" in s for s in rs.skipped)
    assert any("powers of two 1024-2048" in s for s in rs.skipped)
    rs = V.range_shapes(task, max_shapes=3)
    assert len(rs.sizes) == 3 and any("over the cap of 3 shapes" in s for s in rs.skipped)


def test_related_dims_scale_together():
    """B and B*S: the flattened output's size follows the batch (as shape_sets' half/double)."""
    x = spec((64, 8)).with_ranges({0: (1, 128)})
    out = spec((512,)).with_ranges({0: (8, 1024)})
    task = Task("t", "other", "", [x, spec((8,))], [out], "s", [])
    rs = V.range_shapes(task)
    assert rs.sets[rs.sizes.index(7)] == ([(7, 8), (8,)], [(56,)])
    assert rs.sets[rs.sizes.index(1)] == ([(1, 8), (8,)], [(8,)])


def test_buckets_cut_the_range():
    assert spans(V.BucketVerdict(b, [], True) for b in V.buckets_for(ranged_task(high=2048))) == \
        [(1, 1), (2, 8), (9, 128), (129, 2048)]
    assert [(b.low, b.high) for b in V.buckets_for(ranged_task(rows=16, low=4, high=100))] == [(4, 8), (9, 100)]
    b = V.buckets_for(ranged_task())[1]
    assert (b.input, b.dim, b.holds(2), b.holds(9), str(b)) == (0, 0, True, False, "in0 dim 0 in [2, 8]")
    static = Task("t", "other", "", [spec((64, 32), dynamic=(0,))], [spec((64, 32))], "s", [])
    assert V.buckets_for(static) == [] and V.leading_dim(static) is None


# ------------------------------------------------------------------------------ verdicts per bucket

def test_an_honest_kernel_is_kept_in_every_bucket():
    v = run(honest)
    assert (v.ok, v.reason, v.wrong) == (True, "ok", [])
    assert spans(v.buckets) == [(1, 1), (2, 8), (9, 64)]
    assert sorted(s[0][0] for s in v.errs["shapes"]) == sorted([64] * 2 + V.range_shapes(ranged_task()).sizes)


def test_a_kernel_wrong_at_size_one_is_kept_for_the_other_buckets():
    v = run(wrong_at_one)
    assert v.ok and [(b.low, b.high) for b in v.kept] == [(2, 8), (9, 64)]
    (w,) = v.wrong
    assert (w.bucket.low, w.bucket.high, w.sizes, w.reason) == (1, 1, [1], "mismatch")
    assert w.detail.startswith("size 1: ")
    # the strict protocol (every size must pass) rejects it
    task = ranged_task()
    assert V.verify(task, wrong_at_one, load_reference(task), make("fp32"), device="cpu")[:2] == (False, "mismatch")


def test_the_example_s_trials_alone_judge_the_example_and_keep_no_bucket():
    """other_sizes=False (a search's first look at a ranged candidate, evaluation.py): the example's
    trials run, nothing else; a kernel wrong at size 1 passes them, and is kept in no bucket until
    verified over the range."""
    task = ranged_task()
    v = V.verify_range(task, wrong_at_one, load_reference(task), make("fp32"), device="cpu", other_sizes=False)
    assert (v.ok, v.kept) == (True, []) and {s[0][0] for s in v.errs["shapes"]} == {64}
    bad = V.verify_range(task, wrong_at_example, load_reference(task), make("fp32"), device="cpu", other_sizes=False)
    assert (bad.ok, bad.reason) == (False, "mismatch")


def test_a_kernel_wrong_at_odd_sizes_is_kept_only_where_every_size_is_even():
    v = run(pairs_of_rows, ranged_task(high=2048))
    assert [(b.low, b.high) for b in v.kept] == [(129, 2048)]
    assert spans(v.wrong) == [(1, 1), (2, 8), (9, 128)]
    assert {w.reason for w in v.wrong} == {"partial_write"}
    assert [w.detail.split(":")[0] for w in v.wrong] == ["size 1", "size 7", "size 127"]


def test_a_kernel_wrong_at_the_example_shape_is_rejected_outright():
    v = run(wrong_at_example)
    assert (v.ok, v.reason, v.kept) == (False, "mismatch", [])
    assert "example size 64" in v.detail and len(v.wrong) == 3
    assert v.errs["shapes"] == [[[64, 32], [32], [32]]]         # nothing ran past the first seed


def test_a_kernel_declining_small_sizes_keeps_the_rest():
    """HTAM_ERR_SHAPE is how a kernel says a size is not its: those buckets fall back."""
    v = run(lambda i, o: V.HTAM_ERR_SHAPE if i[0].shape[0] < 8 else honest(i, o))
    assert [(b.low, b.high) for b in v.kept] == [(9, 64)]
    assert {w.reason for w in v.wrong} == {"refused"} and "HTAM_ERR_SHAPE" in v.wrong[0].detail


def test_a_kernel_right_only_at_the_example_is_kept_nowhere():
    v = run(lambda i, o: honest(i, o) if i[0].shape[0] == 64 else (o[0].zero_(), 0)[1])
    assert (v.ok, v.kept) == (False, []) and v.reason == "mismatch" and "kept in no bucket" in v.detail


def test_a_crash_stops_verification_and_rejects():
    def crash_at_seven(i, o):
        if i[0].shape[0] == 7:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return honest(i, o)
    v = run(crash_at_seven)
    assert (v.ok, v.reason, v.kept) == (False, "crash", [])
    assert {w.reason for w in v.wrong} == {"crash"} and "crashed at size 7" in v.detail
    assert [s[0][0] for s in v.errs["shapes"]][-1] == 7        # nothing launched after it


def test_a_task_without_ranges_gets_verifys_verdict():
    from test_verify import gelu_task
    task = gelu_task()
    v = V.verify_range(task, honest, load_reference(task), make("fp32"), device="cpu")
    assert (v.ok, v.reason, v.buckets) == (True, "ok", [])
    assert [s[0] for s in v.errs["shapes"]] == [[64, 32]] * 3 + [[32, 32], [128, 32]]


# ------------------------------------------------------------------------------ declared in the model

def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8)).eval()


def test_declared_batch_reaches_every_region_it_flows_to():
    from torch_htam.extract import extract
    found = extract(_mlp(), (torch.randn(4, 16),), dynamic={0: {0: (1, 64)}})
    assert found.problems == [] and found.capture.dynamic and len(found.tasks) == 2
    for t in found.tasks:
        x, w, b = t.inputs
        # size 1 is left out: torch.compile gives a size-1 call a graph of its own (symbolic.SERVED_LOW)
        assert (x.dynamic, x.ranges, w.dynamic, b.dynamic) == ((0,), ((2, 64),), (), ())
        assert (t.outputs[0].dynamic, t.outputs[0].ranges) == ((0,), ((2, 64),))
    # not the static tasks (tests/test_task.py pins their signatures)
    assert not {t.signature for t in found.tasks} & {"108a72a4a5b62f41", "7825b824f31fd309"}


def test_an_extracted_ranged_task_is_verified_per_bucket():
    from torch_htam.extract import extract
    task = extract(_mlp(), (torch.randn(4, 16),), dynamic={0: {0: (1, 64)}}).tasks[0]
    ref = load_reference(task)

    def kernel(inputs, outputs, odd_bug=False):
        out = ref(*inputs)
        outputs[0].copy_(out + (1.0 if odd_bug and inputs[0].shape[0] == 7 else 0.0))
        return 0
    v = V.verify_range(task, kernel, ref, make("fp32"), device="cpu")
    assert v.ok and len(v.kept) == 2 and {2, 4, 7, 64} <= {n for b in v.buckets for n in b.sizes}
    v = V.verify_range(task, lambda i, o: kernel(i, o, True), ref, make("fp32"), device="cpu")
    assert [(b.low, b.high) for b in v.kept] == [(9, 64)]


def test_flattened_dims_scale_with_the_batch():
    class Flat(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x.flatten(0, 1)) * 2   # [B, 8, 4] -> [B * 8, 4]

    from torch_htam.extract import extract
    found = extract(Flat(), (torch.randn(4, 8, 4),), dynamic={0: {0: (1, 64)}})
    outs = [s for t in found.tasks for s in t.outputs if s.shape[0] == 32]
    assert outs and all((s.dynamic, s.ranges) == ((0,), ((16, 512),)) for s in outs)


def test_a_view_of_the_batch_takes_its_size_from_the_input():
    """x.view(B, ...) with B = x.shape[0]: the task's source reads the size off its input, so the
    reference runs at any batch, and its graph (what proposers read) holds the example's size."""
    class Heads(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x):
            return torch.softmax(self.lin(x).view(x.shape[0], 2, 4), -1)

    from torch_htam.extract import extract
    torch.manual_seed(0)
    model = Heads().eval()
    found = extract(model, (torch.randn(4, 8),), dynamic={0: {0: (1, 64)}})
    gemm = next(t for t in found.tasks if "aten.view.default" in t.ops)
    assert gemm.inputs[0].ranges == ((2, 64),) and gemm.outputs[0].ranges == ((2, 64),)
    view = next(n for n in gemm.graph.graph.nodes if n.target is torch.ops.aten.view.default)
    assert view.args[1] == [4, 2, 4]
    ref = load_reference(gemm)
    x = torch.randn(9, 8)
    torch.testing.assert_close(ref(x, model.lin.weight, model.lin.bias), model.lin(x).view(9, 2, 4))


def test_a_literal_size_keeps_the_model_static_and_says_so():
    class View(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x):
            y = self.lin(x)
            return torch.softmax(y.view(4, 2, 4), -1)   # the batch written into the model

    from torch_htam.extract import extract
    found = extract(View().eval(), (torch.randn(4, 8),), dynamic={0: {0: (1, 64)}})
    assert [t.ops for t in found.tasks] == [["aten.linear.default", "aten.view.default"], ["aten.softmax.int"]]
    assert all(not s.ranges for t in found.tasks for s in t.inputs + t.outputs)
    assert not found.capture.dynamic
    assert found.problems[0].startswith("the declared dynamic sizes could not be kept (")
    assert found.problems[0].endswith("every task is at the example's sizes")


def test_a_strided_window_is_not_linear_in_its_size():
    """A dim through a stride-2 conv halves ((H - 1) // 2 + 1): not k * H, so that region gets no
    task; the batch does scale through it."""
    from torch_htam.extract import extract
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, 2, 1), torch.nn.ReLU()).eval()
    x = torch.randn(2, 3, 16, 16)
    found = extract(model, (x,), dynamic={0: {2: (8, 64)}})
    assert found.tasks == [] and "is not a multiple of one dynamic size" in found.problems[0]
    found = extract(model, (x,), dynamic={0: {0: (1, 32)}})
    (t,) = found.tasks
    assert t.inputs[0].ranges == ((2, 32),) and t.outputs[0].ranges == ((2, 32),)


def test_a_region_varying_with_two_sizes_gets_no_task():
    """A task's sizes scale by one factor (verify.range_shapes); x's rows and y's rows both reach
    this region, which runs on PyTorch (said so)."""
    class Two(torch.nn.Module):
        def forward(self, x, y):
            return torch.relu(x @ y.t())

    from torch_htam.extract import extract
    found = extract(Two(), (torch.randn(4, 8), torch.randn(3, 8)), dynamic={0: {0: (1, 64)}, 1: {0: (1, 16)}})
    assert found.tasks == [] and "it varies with two dynamic sizes" in found.problems[0]


def test_the_graph_taking_the_declared_input_is_ranged():
    """Capture with declared sizes goes through Dynamo (as torch.compile will run the model). The
    graph that takes the declared input has it symbolic; the one after a data-dependent branch
    starts from values Dynamo first sees static (its regions' tasks are at the example's sizes)."""
    class Branchy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)
            self.out = torch.nn.Linear(8, 4)

        def forward(self, x):
            y = self.lin(x)
            if y.sum() > 0:
                y = torch.relu(y)
            return self.out(y)

    from torch_htam.extract import extract
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    found = extract(Branchy().eval(), (x,), dynamic={0: {0: (1, 64)}})
    assert found.capture.method == "dynamo" and len(found.capture.graphs) == 2
    first = {s.task.signature for s in found.sites if s.graph == 0}
    gemms = [t for t in found.tasks if t.kind == "gemm"]
    assert [t.inputs[0].ranges for t in gemms if t.signature in first] == [((2, 64),)]
    assert [t.inputs[0].ranges for t in gemms if t.signature not in first] == [()]
    assert not hasattr(x, "_dynamo_dynamic_indices")   # the user's tensor carries no mark


@pytest.mark.parametrize("dynamic, words", [
    ({0: {0: (8, 64)}}, "holding the example's size"), ({0: {2: (1, 64)}}, "holding the example's size"),
    ({1: {0: (1, 64)}}, "positional tensor input"),
])
def test_a_range_that_misses_the_example_is_a_config_error(dynamic, words):
    from torch_htam.config import ConfigError
    from torch_htam.extract import extract
    with pytest.raises(ConfigError, match=words) as info:
        extract(_mlp(), (torch.randn(4, 16),), dynamic=dynamic)
    assert info.value.field == "dynamic" and "\n" not in str(info.value)


def test_the_buckets_a_kernel_verified_in_travel_in_its_evaluation():
    # the worker's verdict (run_job: verify_range) reaches the cache record and back; a record
    # written before buckets existed reads as a static task's kernel (no buckets)
    from torch_htam.evaluation import Evaluation
    ev = Evaluation(True, "ok", buckets=[[0, 0, 2, 8], [0, 0, 9, 64]])
    assert Evaluation.from_json(ev.to_json()).buckets == [[0, 0, 2, 8], [0, 0, 9, 64]]
    old = {k: v for k, v in ev.to_json().items() if k != "buckets"}
    assert Evaluation.from_json(old).buckets == []


# ------------------------------------------------------------------------------ timed per bucket

def _kept(task=None):
    """The buckets of ranged_task() (batch 1-64, example 64): [1, 1], [2, 8], [9, 64]."""
    return V.buckets_for(task or ranged_task())


def spans_of(buckets):
    return [(b.low, b.high) for b in buckets]


def test_a_bucket_slower_beyond_noise_is_dropped_one_within_noise_kept():
    from torch_htam.evaluation import BUCKET_NOISE, BucketTime, winning_buckets
    kept = _kept()
    times = [BucketTime(1, 1, 1, 0.0105, 0.0100),     # 5% slower: lost
             BucketTime(2, 8, 4, 0.0101, 0.0100)]     # 1% slower: a tie, inside time_fn's noise
    assert BUCKET_NOISE == 0.02
    assert spans_of(winning_buckets(kept, 64, times)) == [(2, 8), (9, 64)]
    assert spans_of(winning_buckets(kept, 64, times, noise=0.1)) == [(1, 1), (2, 8), (9, 64)]


def test_the_examples_bucket_is_always_kept_and_an_untimed_one_dropped():
    from torch_htam.evaluation import BucketTime, winning_buckets
    kept = _kept()
    slow_everywhere = [BucketTime(b.low, b.high, b.low, 2.0, 1.0) for b in kept]
    assert spans_of(winning_buckets(kept, 64, slow_everywhere)) == [(9, 64)]
    # the bucket [2, 8] has no time (its timing launch was refused): no evidence of a win
    assert spans_of(winning_buckets(kept, 64, [BucketTime(1, 1, 1, 0.5, 1.0)])) == [(1, 1), (9, 64)]


def test_a_static_task_keeps_no_buckets_and_is_not_timed_per_bucket():
    """run_job times buckets only for a verdict with kept buckets; a static task's has none."""
    from test_verify import gelu_task
    from torch_htam.evaluation import winning_buckets
    task = gelu_task()
    v = V.verify_range(task, honest, load_reference(task), make("fp32"), device="cpu")
    assert v.kept == [] and winning_buckets(v.kept, 64, []) == []


def test_a_bucket_is_timed_at_its_verified_size_nearest_its_geometric_middle():
    from torch_htam.evaluation import representative_size
    b = V.Bucket(0, 0, 9, 128)                               # middle sqrt(9 * 128) = 33.9
    assert representative_size(V.BucketVerdict(b, [16, 32, 127], True)) == 32
    assert representative_size(V.BucketVerdict(V.Bucket(0, 0, 2, 8), [2, 4, 7, 8], True)) == 4
    assert representative_size(V.BucketVerdict(V.Bucket(0, 0, 1, 1), [1], True)) == 1


class _FakeTiming:
    def __init__(self, ms):
        self.median_ms = ms


def test_kept_buckets_are_timed_at_the_shapes_verify_ran(monkeypatch):
    """_time_buckets on CPU: _time_at (time_fn on the GPU) stands in, slower than the baseline at
    size 1 only; the compiled reference is the baseline when it was timed."""
    from torch_htam import evaluation as E
    task = ranged_task()
    v = run(honest, task)
    seen = []

    def fake_time_at(task, kernel, ref, policy, shapes, inductor=False, retime=False):
        seen.append(shapes)
        n = shapes[0][0][0]
        return E._Times(_FakeTiming(2.0 if n == 1 else 1.0), _FakeTiming(0.5),
                        _FakeTiming(1.5) if inductor else None)
    monkeypatch.setattr(E, "_time_at", fake_time_at)
    res = E._time_buckets(task, honest, None, make("fp32"), True, v)
    rs = V.range_shapes(task)
    assert [s[0][0][0] for s in seen] == [1, 4] and seen == [rs.sets[rs.sizes.index(n)] for n in (1, 4)]
    assert res["bucket_times"] == [[1, 1, 1, 2.0, 1.5], [2, 8, 4, 1.0, 1.5]]
    assert res["buckets"] == [[0, 0, 2, 8], [0, 0, 9, 64]]
    # against the eager reference (0.5 ms) the kernel loses both: the example's bucket stays
    seen.clear()
    res = E._time_buckets(task, honest, None, make("fp32"), False, v)
    assert res["buckets"] == [[0, 0, 9, 64]] and [t[4] for t in res["bucket_times"]] == [0.5, 0.5]


def test_a_refused_timing_launch_drops_its_bucket(monkeypatch):
    from torch_htam import evaluation as E
    task = ranged_task()

    def fake_time_at(task, kernel, ref, policy, shapes, inductor=False, retime=False):
        if shapes[0][0][0] == 1:
            raise E._Refused(V.HTAM_ERR_SHAPE)
        return E._Times(_FakeTiming(1.0), _FakeTiming(2.0))
    monkeypatch.setattr(E, "_time_at", fake_time_at)
    res = E._time_buckets(task, honest, None, make("fp32"), False, run(honest, task))
    assert res["buckets"] == [[0, 0, 2, 8], [0, 0, 9, 64]] and res["bucket_times"] == [[2, 8, 4, 1.0, 2.0]]


def test_bucket_times_travel_in_the_evaluation():
    from torch_htam.evaluation import Evaluation
    ev = Evaluation(True, "ok", buckets=[[0, 0, 9, 64]], bucket_times=[[2, 8, 4, 0.02, 0.01]])
    assert Evaluation.from_json(ev.to_json()).bucket_times == [[2, 8, 4, 0.02, 0.01]]
    old = {k: v for k, v in ev.to_json().items() if k != "bucket_times"}
    assert Evaluation.from_json(old).bucket_times == [] and Evaluation.from_json(old).buckets == [[0, 0, 9, 64]]


ADD_SRC = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, a, b):
        return a + b

def get_inputs():
    return [torch.randn(64, 4096), torch.randn(64, 4096)]

def get_init_inputs():
    return []
'''


@pytest.mark.gpu
def test_run_job_times_a_ranged_kernel_per_bucket():
    """tests/kernels/add_f32.cu over batch 1-64 (example 64): the buckets away from the example are
    timed at a verified size each, and kept exactly where the kernel is no slower than torch."""
    from pathlib import Path
    from torch_htam import build
    from torch_htam.evaluation import BUCKET_NOISE, Evaluation, run_job
    from torch_htam.policy import policy_for
    rows = [spec((64, 4096)).with_ranges({0: (1, 64)}) for _ in range(3)]
    task = Task("add_ranged", "elementwise", ADD_SRC, rows[:2], rows[2:], "sig-add", ["aten.add.Tensor"])
    res = build.build((Path(__file__).parent / "kernels" / "add_f32.cu").read_text())
    assert res.ok, res.error
    out = run_job({"kind": "evaluate", "task": task.to_json(), "so_path": res.so_path,
                   "policy": policy_for(task).to_json(), "time": True})
    assert (out["correct"], out["reason"]) == (True, "ok"), out["detail"]
    times = out["bucket_times"]
    assert [(t[0], t[1], t[2]) for t in times] == [(1, 1, 1), (2, 8, 4)]
    won = [[0, 0, lo, hi] for lo, hi, _, k, b in times if k <= b * (1 + BUCKET_NOISE)]
    assert out["buckets"] == won + [[0, 0, 9, 64]]
    assert Evaluation(**{k: out[k] for k in ("correct", "reason", "buckets", "bucket_times")}).bucket_times == times
