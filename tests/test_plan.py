"""The plan command: a table for a real model, clean messages for unusable specs and models."""
import io
import re
import sys
import json
from pathlib import Path

import pytest
import torch

from torch_htam.modelspec import ModelSpecError, load_model_spec
from torch_htam.plan import run_plan

GPT = str(Path(__file__).resolve().parent.parent / "examples" / "gpt_block.py")

UNCAPTURABLE = '''
import torch
import torch.nn as nn

class ToList(nn.Module):
    def forward(self, x):
        return torch.tensor([v * 2.0 for v in x.tolist()])

class Raises(nn.Module):
    def forward(self, x):
        raise RuntimeError("this model is broken")

def tolist():
    return ToList(), (torch.randn(8),)

def raises():
    return Raises(), (torch.randn(8),)
'''


MIXED = '''
import torch
import torch.nn as nn
import torch.nn.functional as F

class Mixed(nn.Module):
    """A GEMM the expert has a path for, a max pool it has none for (an unbatched one)."""
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 64)

    def forward(self, x, img):
        return F.gelu(self.fc(x)), F.max_pool2d(img, 2)

def get_model():
    return Mixed().eval(), (torch.randn(8, 64), torch.randn(4, 16, 16))
'''


def plan(spec, **kw):
    out = io.StringIO()
    code = run_plan(spec, out=out, device="cpu", **kw)
    return code, out.getvalue()


def test_plan_table_and_export(tmp_path):
    code, text = plan(GPT, export_dir=str(tmp_path))
    assert code == 0
    lines = text.splitlines()
    assert lines[0].startswith("9 tasks (capture: export)")
    assert any("linear,gelu" in line and " 2 " in line for line in lines)
    index = json.loads((tmp_path / "tasks.json").read_text())
    assert len(index) == 9 and all((tmp_path / t["file"]).is_file() for t in index)


def test_plan_path_column_reason_and_footer(tmp_path):
    path = tmp_path / "mixed.py"
    path.write_text(MIXED)
    code, text = plan(str(path))
    lines = text.splitlines()
    assert code == 0 and "  path  " in lines[1]
    gemm = next(i for i, line in enumerate(lines) if "linear,gelu" in line)
    pool = next(i for i, line in enumerate(lines) if "max_pool2d" in line)
    assert " yes " in lines[gemm] and not lines[gemm + 1].strip().startswith("no path")
    assert " no " in lines[pool]
    assert lines[pool + 1].strip() == "no path: max_pool2d on a 3-D input (need batched [N, C, ...])"
    assert all(len(line) <= 120 for line in lines)
    footer = next(line for line in lines if line.startswith("built-in proposer has a path"))
    assert footer.startswith("built-in proposer has a path for 1 of 2 tasks: ")


def test_plan_json_is_one_object_with_shares(tmp_path):
    path = tmp_path / "mixed.py"
    path.write_text(MIXED)
    code, text = plan(str(path), json_out=True, export_dir=str(tmp_path / "kb"))
    doc = json.loads(text)          # stdout is the JSON object and nothing else
    assert code == 0 and doc["capture"] == "export" and doc["problems"] == []
    rows = {r["kind"]: r for r in doc["tasks"]}
    assert rows["gemm"]["path"] and rows["gemm"]["why"] is None
    assert not rows["rowwise"]["path"] and "max_pool2d" in rows["rowwise"]["why"]
    # shares count-weighted: the GEMM's FLOPs and bytes over all
    flops = rows["gemm"]["flops"] / (rows["gemm"]["flops"] + rows["rowwise"]["flops"])
    nbytes = rows["gemm"]["bytes"] / (rows["gemm"]["bytes"] + rows["rowwise"]["bytes"])
    assert doc["coverage"] == pytest.approx({"flops": flops, "bytes": nbytes})
    assert 0.5 < doc["coverage"]["flops"] < 1 and 0 < doc["coverage"]["bytes"] < 1
    assert (tmp_path / "kb" / "tasks.json").is_file()


def test_cli_plan_json(tmp_path, capsys):
    from torch_htam.cli import main
    path = tmp_path / "mixed.py"
    path.write_text(MIXED)
    assert main(["plan", str(path), "--json", "--device", "cpu"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"capture", "tasks", "coverage", "problems"} and len(doc["tasks"]) == 2


def test_uncapturable_model_gives_message_and_empty_plan(tmp_path):
    path = tmp_path / "bad.py"
    path.write_text(UNCAPTURABLE)
    code, text = plan(f"{path}:tolist")
    assert code == 2 and text.startswith("0 tasks")
    assert "not captured: " in text
    assert "Traceback" not in text
    assert "% of FLOPs" not in text        # no share of nothing


def test_a_model_that_fails_on_its_inputs_says_so(tmp_path, capsys):
    """Not "nothing captured" with an empty table: the model's own error, and exit 1."""
    from torch_htam.cli import main
    path = tmp_path / "bad.py"
    path.write_text(UNCAPTURABLE + SHAPES)
    with pytest.raises(ModelSpecError, match=r"the model raised RuntimeError on its example inputs: "
                                             r"this model is broken \(at .*bad.py:\d+\)"):
        plan(f"{path}:raises")
    assert main(["plan", f"{path}:mismatch", "--device", "cpu"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith(f"error: {path}:mismatch: the model raised RuntimeError on its "
                                   "example inputs: mat1 and mat2 shapes cannot be multiplied")


SHAPES = """
class Mismatch(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 4)

    def forward(self, x):
        return self.fc(x)

def mismatch():
    return Mismatch(), (torch.randn(2, 5),)
"""


LONG = "the kernel cannot take this region because " + " ".join(f"reason{i}" for i in range(20)) + " END"


def test_reasons_are_whole_in_json_and_wrapped_in_the_table(tmp_path, monkeypatch):
    from torch_htam.plan import WHY_LINES
    from torch_htam.proposers.expert import proposer
    path = tmp_path / "mixed.py"
    path.write_text(MIXED)

    def fails(task, policy, targets=None):
        raise RuntimeError(LONG)
    monkeypatch.setattr(proposer, "match_task", fails)
    doc = json.loads(plan(str(path), json_out=True)[1])
    assert all(r["why"] == f"matching failed: RuntimeError: {LONG}" for r in doc["tasks"])
    lines = plan(str(path))[1].splitlines()
    assert all(len(line) <= 120 for line in lines)
    first = next(i for i, line in enumerate(lines) if "no path: matching failed: RuntimeError" in line)
    n = 1 + next(k for k, line in enumerate(lines[first + 1:]) if not line.startswith(" " * 27))
    assert 1 < n <= WHY_LINES                                # wrapped, all of it
    assert " ".join(" ".join(lines[first:first + n]).split()).endswith(LONG)


def test_a_reason_too_long_to_read_is_cut_in_the_table_only(tmp_path, monkeypatch):
    from torch_htam.plan import WHY_LINES
    from torch_htam.proposers.expert import proposer
    path = tmp_path / "mixed.py"
    path.write_text(MIXED)
    huge = "shape mismatch: " + "x" * 3000

    def fails(task, policy, targets=None):
        raise ValueError(huge)
    monkeypatch.setattr(proposer, "match_task", fails)
    lines = plan(str(path))[1].splitlines()
    first = next(i for i, line in enumerate(lines) if "no path: matching failed: ValueError: shape mismatch" in line)
    block = lines[first:first + WHY_LINES]
    assert block[-1].endswith("(whole reason: --json)") and not lines[first + WHY_LINES].startswith(" " * 27)
    assert all(len(line) <= 120 for line in lines)
    assert json.loads(plan(str(path), json_out=True)[1])["tasks"][0]["why"].endswith("x" * 3000)


def test_the_gpt_example_has_a_path_for_every_task():
    """The README's flagship: its attention (a transpose and a view after SDPA) included."""
    code, text = plan(GPT, json_out=True)
    doc = json.loads(text)
    assert code == 0 and [r for r in doc["tasks"] if not r["path"]] == []
    assert any(r["kind"] == "attention" for r in doc["tasks"])


def test_bad_specs_are_clear(tmp_path):
    with pytest.raises(ModelSpecError, match="does not exist"):
        plan(str(tmp_path / "missing.py"))
    with pytest.raises(ModelSpecError, match="no function 'nope'"):
        plan(f"{GPT}:nope")
    with pytest.raises(ModelSpecError, match="cannot import"):
        load_model_spec("no_such_module_xyz:get_model")


def test_spec_forms_and_kwargs():
    model, inputs = load_model_spec(GPT, device="cpu", dtype=torch.float64)
    assert next(model.parameters()).dtype == torch.float64 and inputs[0].dtype == torch.int64
    model, inputs = load_model_spec(f"{GPT}:get_model")
    assert not model.training


@pytest.mark.gpu
def test_plan_times_tasks_on_cuda():
    out = io.StringIO()
    assert run_plan(GPT, out=out, device="cuda") == 0
    rows = [line for line in out.getvalue().splitlines() if re.match(r"[0-9a-f]{16} ", line)]
    shares = [float(tok[:-1]) for line in rows for tok in line.split() if tok.endswith("%")]
    assert len(rows) == 9 and len(shares) == 9 and abs(sum(shares) - 100) < 1.0


def test_a_model_from_a_file_compiles_under_torch_compile(tmp_path):
    # Dynamo imports a traced function's module by name: a model file must be importable by it
    same = tmp_path / "a" / "net.py", tmp_path / "b" / "net.py"   # one stem, two files
    for i, f in enumerate(same):
        f.parent.mkdir()
        f.write_text("import torch\nSCALE = %d.0\n\nclass Net(torch.nn.Module):\n"
                     "    def forward(self, x):\n        return torch.relu(x) * SCALE\n\n"
                     "def get_model():\n    return Net(), (torch.randn(4, 8),)\n" % (i + 1))
    for i, f in enumerate(same):
        model, (x,) = load_model_spec(str(f), device="cpu")
        # NOTE: torch 2.11's Dynamo imports it (sys.modules) and failed without; 2.14 falls back
        assert sys.modules[type(model).__module__].Net is type(model)
        torch._dynamo.reset()
        out = torch.compile(lambda t: model(t), backend="eager", fullgraph=True)(x)   # forward inlined
        assert torch.equal(out, torch.relu(x) * (i + 1))
    bad = tmp_path / "bad.py"
    bad.write_text("raise ValueError('top level')\n")
    before = set(sys.modules)
    with pytest.raises(ModelSpecError, match="top-level code raised ValueError"):
        load_model_spec(str(bad))
    assert set(sys.modules) == before   # a failed import leaves no module behind
