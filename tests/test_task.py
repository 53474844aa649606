"""Every task of the example models, fed the region's real inputs, reproduces the region's outputs."""
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from torch_htam.capture import capture, record_values
from torch_htam.extract import extract, extract_tasks, region_to_task, task_from_source
from torch_htam.partition import partition
from torch_htam.task import export_tasks, load_reference

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def load_example(name, **kw):
    spec = importlib.util.spec_from_file_location(f"ex_{name}", EXAMPLES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.get_model(**kw)


def needs(module):
    try:
        __import__(module)
        return pytest.mark.skipif(False, reason="")
    except ImportError:
        return pytest.mark.skip(reason=f"{module} is not importable here")


MODELS = [
    pytest.param("gpt_block", id="gpt"),
    pytest.param("bert_encoder", id="bert"),
    pytest.param("resnet18", id="resnet18", marks=needs("torchvision")),
    pytest.param("hf_causal_lm", id="hf_llama", marks=needs("transformers")),
]


def check_regions(model, inputs) -> int:
    """Run every region's task on the region's real inputs and compare with its real outputs."""
    cap = capture(model, inputs)
    assert cap.graphs, cap.problems
    checked = 0
    for gm, flat in zip(cap.graphs, cap.inputs):
        values = record_values(gm, flat)
        for region in partition(gm):
            task = region_to_task(gm, region, values)
            ref = load_reference(task)
            got = ref(*[values[a] for a in region.inputs])
            got = got if isinstance(got, tuple) else (got,)
            assert len(got) == len(region.outputs) == len(task.outputs)
            for g, o, spec in zip(got, region.outputs, task.outputs):
                assert tuple(g.shape) == spec.shape and str(g.dtype) == f"torch.{spec.dtype}"
                torch.testing.assert_close(g, values[o], rtol=1e-5, atol=1e-5, msg=task.name)
            # the source also runs on its own random inputs
            ns = {}
            exec(task.source, ns)
            ns["Model"](*ns["get_init_inputs"]())(*ns["get_inputs"]())
            checked += 1
    return checked


@pytest.mark.parametrize("name", MODELS)
def test_every_task_reproduces_its_region(name):
    torch.manual_seed(0)
    assert check_regions(*load_example(name)) >= 5


class DownBlock(torch.nn.Module):
    """ResNet's stride-2 BasicBlock: in-place ReLU and `out += identity` overwrite BN outputs."""

    def __init__(self, c_in=8, c_out=16):
        super().__init__()
        nn = torch.nn
        self.conv1 = nn.Conv2d(c_in, c_out, 3, 2, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.down = nn.Sequential(nn.Conv2d(c_in, c_out, 1, 2, bias=False), nn.BatchNorm2d(c_out))
        self.relu = nn.ReLU(inplace=True)
        for bn in (self.bn1, self.bn2, self.down[1]):   # non-trivial eval statistics
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.5, 2)

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += self.down(x)
        return self.relu(out)


def test_in_place_ops_do_not_change_recorded_region_outputs():
    # Regression: record_values kept the live tensor of each node, so bn2's recorded output was
    # later overwritten by add_ and relu_, and its conv+BN task looked wrong (resnet18).
    torch.manual_seed(0)
    model, x = DownBlock().eval(), torch.randn(1, 8, 8, 8)
    cap = capture(model, (x,))
    values = record_values(cap.graphs[0], cap.inputs[0])
    bns = [n for n in cap.graphs[0].graph.nodes if n.target is torch.ops.aten.batch_norm.default]
    with torch.no_grad():
        torch.testing.assert_close(values[bns[1]], model.bn2(model.conv2(model.relu(model.bn1(model.conv1(x))))))
    assert check_regions(model, (x,)) >= 3   # conv1+bn1, conv2+bn2, down conv+bn


@pytest.mark.parametrize("name", ["gpt_block", "bert_encoder"])
def test_depth_does_not_add_tasks(name):
    shallow = extract_tasks(*load_example(name, n_layer=2))
    deep = extract_tasks(*load_example(name, n_layer=12))
    assert len(deep) == len(shallow)
    assert sum(t.count for t in deep) > sum(t.count for t in shallow)
    assert {t.signature for t in deep} == {t.signature for t in shallow}


def test_signature_is_stable_and_shape_sensitive():
    a = extract_tasks(*load_example("gpt_block"))
    b = extract_tasks(*load_example("gpt_block"))
    assert [t.signature for t in a] == [t.signature for t in b]
    # every GPT region reads an activation with the sequence dim, so every signature changes
    c = extract_tasks(*load_example("gpt_block", seq=8))
    assert not {t.signature for t in a} & {t.signature for t in c}


def test_task_fields_are_consistent():
    tasks = extract_tasks(*load_example("gpt_block", n_layer=3))
    assert [t.signature for t in tasks] == list(dict.fromkeys(t.signature for t in tasks))
    mlp = next(t for t in tasks if t.ops[:2] == ["aten.linear.default", "aten.gelu.default"])
    assert mlp.kind == "gemm" and mlp.count == 3
    assert mlp.modules[0] == "h.0.mlp.c_fc" and "h.2.mlp.c_fc" in mlp.modules
    x, w, b = mlp.inputs
    assert mlp.flops >= 2 * x.shape[0] * x.shape[1] * w.shape[0] * w.shape[1]
    assert mlp.bytes == sum(s.nbytes for s in mlp.inputs + mlp.outputs)
    ph = [n for n in mlp.graph.graph.nodes if n.op == "placeholder"]
    assert len(ph) == len(mlp.inputs)


def test_task_from_source_and_export(tmp_path):
    src = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)

    def forward(self, x, ids):
        return torch.softmax(self.norm(x), dim=-1) * ids

def get_inputs():
    return [torch.randn(4, 32), torch.randint(0, 7, (4, 32))]

def get_init_inputs():
    return [32]
'''
    torch.manual_seed(0)
    task = task_from_source(src, "norm_softmax")
    assert task.kind == "rowwise" and task.name == "norm_softmax"
    assert [s.shape for s in task.inputs] == [(4, 32), (4, 32), (32,), (32,)]
    assert (task.inputs[1].low, task.inputs[1].high) == (0, 7)   # range seen in get_inputs()
    ns = {}
    exec(src, ns)
    x, ids = ns["get_inputs"]()
    orig = ns["Model"](32)
    ref = load_reference(task)
    torch.testing.assert_close(ref(x, ids, orig.norm.weight, orig.norm.bias), orig(x, ids))
    paths = export_tasks([task], tmp_path)
    assert paths[0].name == f"norm_softmax_{task.signature}.py"
    index = json.loads((tmp_path / "tasks.json").read_text())
    assert index[0]["signature"] == task.signature and index[0]["file"] == paths[0].name


def test_batch_norm_variances_are_drawn_positive():
    """A task's own get_inputs() gives a batch norm a positive running_var: no NaN outputs."""
    import torch.nn as nn
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8)).eval()
    task = extract_tasks(model, (torch.randn(2, 3, 16, 16),))[0]
    assert sum(s.positive for s in task.inputs) == 1
    for _ in range(3):
        ns = {}
        exec(task.source, ns)
        out = ns["Model"]()(*ns["get_inputs"]())
        assert not torch.isnan(out).any()


def test_a_region_nothing_reads_is_no_task():
    class Dead(torch.nn.Module):
        def forward(self, x):
            _ = (x + 1).unsqueeze(0)      # computed, never used: export keeps it
            return torch.relu(x)

    from torch_htam.extract import extract
    found = extract(Dead(), (torch.randn(4, 8),))
    assert [t.name for t in found.tasks] == ["elementwise_relu"]
    assert any("nothing reads its result" in p for p in found.problems)


# ---- declared size ranges (OptimizeConfig.dynamic) -------------------------------------------

def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8)).eval()


def test_a_static_tasks_signature_is_what_it_was_before_ranges():
    """Existing caches are keyed by these: computed before ranges joined the signature."""
    tasks = extract_tasks(_mlp(), (torch.randn(4, 16),))
    assert [t.signature for t in tasks] == ["108a72a4a5b62f41", "7825b824f31fd309"]
    assert all("ranges" not in s for t in tasks for s in t.to_json()["inputs"])


def test_ranges_round_trip_and_old_json_loads():
    from torch_htam.task import TensorSpec
    spec = TensorSpec((64, 32), "float32", (32, 1)).with_ranges({0: (1, 128)})
    assert (spec.dynamic, spec.ranges, spec.range_of(0), spec.range_of(1)) == ((0,), ((1, 128),), (1, 128), None)
    assert TensorSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec
    old = {"shape": [64, 32], "dtype": "float32", "stride": [32, 1], "dynamic": [0], "low": None,
           "high": None, "positive": False}   # written before ranges existed
    assert TensorSpec.from_json(old) == TensorSpec((64, 32), "float32", (32, 1), (0,))
    with pytest.raises(ValueError, match="one \\(low, high\\) per dynamic dim"):
        TensorSpec((64, 32), "float32", (32, 1), (0,), ranges=((1, 64), (1, 64)))
    with pytest.raises(ValueError, match="must hold its size 64"):
        TensorSpec((64, 32), "float32", (32, 1)).with_ranges({0: (1, 32)})


def test_a_ranged_task_has_its_own_signature():
    from torch_htam.extract import graph_signature
    task = extract_tasks(_mlp(), (torch.randn(4, 16),))[0]
    ranged = [task.inputs[0].with_ranges({0: (1, 64)})] + task.inputs[1:]
    wider = [task.inputs[0].with_ranges({0: (1, 2048)})] + task.inputs[1:]
    sigs = {graph_signature(task.graph, task.inputs), graph_signature(task.graph, ranged),
            graph_signature(task.graph, wider)}
    assert len(sigs) == 3 and graph_signature(task.graph, task.inputs) == task.signature
