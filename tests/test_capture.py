"""Capture: export path, Dynamo fallback around graph breaks, and clean failure."""
import torch
import torch.nn as nn

from torch_htam.capture import capture, record_values


class Branchy(nn.Module):
    """A data-dependent branch: torch.export cannot trace it, Dynamo breaks the graph there."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        y = torch.relu(self.a(x))
        if y.sum().item() > 0:
            y = y * 2
        return self.b(y)


class Numpy(nn.Module):
    def forward(self, x):
        return torch.from_numpy(x.numpy() * 2) + 1


class Raises(nn.Module):
    def forward(self, x):
        raise RuntimeError("this model is broken")


def test_export_path_has_meta_and_module_names():
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)).eval()
    x = torch.randn(2, 8)
    cap = capture(model, (x,))
    assert cap.method == "export" and cap.problems == [] and cap.exported is not None
    calls = [n for n in cap.graphs[0].graph.nodes if n.op == "call_function"]
    assert all("val" in n.meta for n in calls)
    stacks = [list(n.meta["nn_module_stack"].values())[-1][0] for n in calls]
    assert stacks[0] == "0" and stacks[-1] == "2"
    out = [v for n, v in record_values(cap.graphs[0], cap.inputs[0]).items() if n is calls[-1]][0]
    torch.testing.assert_close(out, model(x))


def test_dynamo_fallback_captures_pieces_around_a_graph_break():
    torch.manual_seed(0)
    model, x = Branchy().eval(), torch.randn(2, 8)
    cap = capture(model, (x,))
    assert cap.method == "dynamo" and len(cap.graphs) == 2
    assert cap.problems and cap.problems[0].startswith("torch.export failed")
    targets = [str(n.target) for g in cap.graphs for n in g.graph.nodes if n.op == "call_function"]
    assert "aten.linear.default" in targets and "aten.relu.default" in targets
    paths = {p for g in cap.graphs for n in g.graph.nodes
             for p, _ in (n.meta.get("nn_module_stack") or {}).values()}
    assert {"a", "b"} <= paths
    for g, flat in zip(cap.graphs, cap.inputs):
        record_values(g, flat)   # each piece runs on its recorded inputs


def test_numpy_in_forward_falls_back_to_dynamo():
    # Dynamo traces numpy calls as tensor ops; export cannot run .numpy() on fake tensors
    cap = capture(Numpy(), (torch.randn(2, 8),))
    assert cap.method == "dynamo" and ".numpy()" in cap.problems[0]


def test_uncapturable_model_reports_instead_of_raising():
    cap = capture(Raises(), (torch.randn(2, 8),))
    assert cap.method == "none" and cap.graphs == []
    assert any("nothing could be captured" in p for p in cap.problems)
    assert all("\n" not in p for p in cap.problems)


def test_in_place_ops_on_intermediates_join_regions_as_their_twins():
    """`out += x; relu_(out)` after a conv + BN becomes add + relu: one conv region with its epilogue."""
    import torch.nn as nn
    from torch_htam.extract import extract

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn, self.relu = nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4), nn.ReLU(inplace=True)

        def forward(self, x):
            out = self.bn(self.conv(x))
            out += x
            return self.relu(out)

    found = extract(Block().eval(), (torch.randn(2, 4, 8, 8),))
    assert [t.name for t in found.tasks] == ["conv_conv2d_batch_norm_add_relu"]
    ops = found.tasks[0].ops
    assert "aten.add.Tensor" in ops and "aten.relu.default" in ops and not any(o.endswith("_.default") for o in ops)


def test_an_in_place_write_to_an_input_stays_as_it_is():
    from torch_htam.capture import capture

    class M(torch.nn.Module):
        def forward(self, x):
            x.relu_()          # the caller's tensor: others may read it, so never rewritten
            return x * 2

    gm = capture(M(), (torch.randn(4),)).graphs[0]
    assert any(str(n.target) == "aten.relu_.default" for n in gm.graph.nodes)


def test_a_data_dependent_branch_is_said_and_torch_dumps_nothing(capfd):
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.l = torch.nn.Linear(16, 16)

        def forward(self, x):
            y = self.l(x)
            return torch.relu(y) if y.sum() > 0 else torch.sigmoid(y)

    cap = capture(M().eval(), (torch.randn(4, 16),))
    out, err = capfd.readouterr()
    assert cap.method == "dynamo" and any("branches on tensor values" in p for p in cap.problems)
    assert "def forward" not in out + err     # torch's partial-graph dump stays off the terminal


def test_a_reexported_graph_pickles_for_inductors_graph_cache():
    """export_graph's module carries no local functions (export's hooks, train / eval overrides,
    guards submodule): Inductor's FX graph cache can key it, instead of warning and recompiling."""
    import torch._inductor.codecache as cc
    from torch_htam.capture import export_graph

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            return torch.relu(self.lin(x))
    m, x = M(), torch.randn(2, 4)
    sub, why = export_graph(torch.fx.symbolic_trace(m), [x])
    assert sub is not None, why
    assert cc.FxGraphCachePickler(sub).dumps(sub)
    torch.testing.assert_close(sub(x), m(x))     # still the model's computation
