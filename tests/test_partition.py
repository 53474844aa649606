"""Partition: region shapes on small graphs, and structural invariants on the example models."""
import importlib.util
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_htam import attn_pattern
from torch_htam.capture import capture
from torch_htam.ops import FREE, OPS
from torch_htam.partition import category, partition


def regions_of(model, *inputs):
    cap = capture(model.eval(), inputs)
    assert cap.graphs, cap.problems
    gm = cap.graphs[0]
    return gm, partition(gm)


def ops(region):
    return [n.target.overloadpacket.__name__ for n in region.nodes
            if category(n) not in FREE and hasattr(n.target, "overloadpacket")]


def check_invariants(gm, regions):
    """No node in two regions; boundaries are tensors; no region reads its own output."""
    seen = set()
    for r in regions:
        inside = set(r.nodes)
        assert not inside & seen
        seen |= inside
        assert all(isinstance(n.meta["val"], torch.Tensor) for n in r.inputs + r.outputs)
        # nothing a region reads may depend on the region (else its kernel could not run)
        stack, visited = list(r.inputs), set()
        while stack:
            n = stack.pop()
            assert n not in inside, f"cycle through {n.name}"
            if n not in visited:
                visited.add(n)
                stack.extend(n.all_input_nodes)


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)) + y)
        return self.fc(y.mean((2, 3)))


def test_conv_bn_relu_regions_and_the_pool_after_them():
    torch.manual_seed(0)
    gm, regions = regions_of(ConvNet(), torch.randn(2, 3, 8, 8))
    check_invariants(gm, regions)
    assert [r.kind for r in regions] == ["conv", "conv", "rowwise", "gemm"]   # graph order
    by_kind = {r.kind: r for r in regions}
    assert ops(regions[0]) == ["conv2d", "batch_norm", "relu"]
    # NOTE: the second conv keeps bn + residual add + relu as its epilogue (ops' keeps_epilogue)
    # rather than giving them to the pool's prologue: the same bytes move either way (one
    # activation written, then read by the pool), and the conv epilogue kernel is the measured win
    assert ops(regions[1]) == ["conv2d", "batch_norm", "add", "relu"]
    assert ops(by_kind["rowwise"]) == ["mean"]


def test_views_and_dropout_are_absorbed_not_tasks():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(16, 16)
            self.drop = nn.Dropout(0.1)

        def forward(self, x):
            return self.drop(torch.softmax(self.l(x).view(4, 2, 16).transpose(0, 1), -1)).contiguous()

    gm, regions = regions_of(M(), torch.randn(8, 16))
    check_invariants(gm, regions)
    assert [r.kind for r in regions] == ["gemm", "rowwise"]
    free = [n for r in regions for n in r.nodes if category(n) in FREE]
    # NOTE: export drops the .contiguous() here (softmax output already is)
    assert {n.target.overloadpacket.__name__ for n in free} == {"view", "transpose", "dropout"}
    assert regions[1].outputs[0].target.overloadpacket.__name__ == "dropout"   # trailing no-op inside


def test_elementwise_chain_and_shared_input_make_no_cycle():
    # y = exp(x); z = y @ w; out = z + y: joining the add to the GEMM is fine, but an elementwise
    # region {exp, add} would read the GEMM it feeds: partition must not build that.
    class M(nn.Module):
        def forward(self, x, w):
            y = torch.exp(x) * 2
            return y @ w + y, torch.tanh(y)

    gm, regions = regions_of(M(), torch.randn(8, 8), torch.randn(8, 8))
    check_invariants(gm, regions)
    kinds = sorted(r.kind for r in regions)
    assert kinds == ["elementwise", "gemm"]


def test_rms_norm_takes_residual_add_prologue():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(32))

        def forward(self, x, r):
            h = x + r
            return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w, h

    gm, regions = regions_of(M(), torch.randn(4, 32), torch.randn(4, 32))
    check_invariants(gm, regions)
    assert len(regions) == 1 and regions[0].kind == "rowwise"
    assert ops(regions[0]) == ["add", "pow", "mean", "add", "rsqrt", "mul", "mul"]
    assert len(regions[0].outputs) == 2     # the normed value and the residual sum


def test_op_table_is_data():
    assert OPS["linear"].category == "anchor" and OPS["softmax"].category == "rowwise"
    assert OPS["gelu"].category == "elementwise" and OPS["dropout"].category == "noop"
    assert OPS["view"].category == "view"


EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.parametrize("name", ["gpt_block", "bert_encoder"])
def test_example_models_partition_cleanly(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    model, inputs = mod.get_model()
    gm, regions = regions_of(model, *inputs)
    check_invariants(gm, regions)
    anchors = [n for n in gm.graph.nodes if category(n) == "anchor"]
    # a hand-written attention's two matmuls (q @ k^T, p @ v) are one attention region
    written = len(attn_pattern.find(list(gm.graph.nodes)))
    assert sum(r.kind in ("gemm", "attention") for r in regions) == len(anchors) - written


def test_a_conv_keeps_its_epilogue_when_pooling_follows():
    """conv -> BN -> ReLU -> max_pool: the conv region takes BN + ReLU (ops' keeps_epilogue), the
    pool stands alone; a GEMM's residual add still goes to the LayerNorm after it."""
    import torch.nn as nn
    from torch_htam.capture import capture

    stem = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(inplace=True), nn.MaxPool2d(2)).eval()
    gm = capture(stem, (torch.randn(2, 3, 16, 16),)).graphs[0]
    kinds = sorted((r.kind, tuple(op for n in r.nodes if (op := _name(n)))) for r in partition(gm))
    assert kinds == [("conv", ("conv2d", "batch_norm", "relu")), ("rowwise", ("max_pool2d",))]

    class Post(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.ln = nn.Linear(16, 16), nn.LayerNorm(16)

        def forward(self, x):
            return self.ln(x + self.fc(x))
    gm = capture(Post().eval(), (torch.randn(4, 16),)).graphs[0]
    rows = [r for r in partition(gm) if r.kind == "rowwise"]
    assert [_name(n) for n in rows[0].nodes if _name(n)] == ["add", "layer_norm"]


def _name(n):
    from torch_htam.partition import op_name
    name = op_name(n)
    return name if name is not None and category(n) not in FREE else None


def test_chains_that_meet_are_one_region():
    """GELU spelled out: (0.5 * x) and (x**3 ... tanh + 1) start as two chains (neither reads a
    compute op) and meet at the last mul: one region, one kernel; two chains joined through a
    GEMM between them stay apart (their union would read the GEMM it feeds)."""
    import math

    class Gelu(nn.Module):
        def forward(self, x):
            return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))

    gm, regions = regions_of(Gelu(), torch.randn(4, 64))
    check_invariants(gm, regions)
    assert [r.kind for r in regions] == ["elementwise"]
    assert ops(regions[0]).count("mul") == 4 and "tanh" in ops(regions[0])

    class Through(nn.Module):
        def forward(self, x, w):
            a = torch.exp(x)
            return torch.sigmoid(a @ w) * a.neg()

    gm, regions = regions_of(Through(), torch.randn(8, 8), torch.randn(8, 8))
    check_invariants(gm, regions)


def test_a_chain_over_a_smaller_operand_stays_its_own_region():
    """(1 + w) over a [C] weight meets the [N, C] chain at the mul: merging would recompute it per
    element and, as it is also an output, leave one region with outputs of two shapes."""
    class M(nn.Module):
        def forward(self, x, w):
            s = w + 1
            return torch.tanh(x) * s, s
    gm, regions = regions_of(M(), torch.randn(4, 16), torch.randn(16))
    check_invariants(gm, regions)
    assert sorted(len(r.nodes) for r in regions if r.kind == "elementwise") == [1, 2]
