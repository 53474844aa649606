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


@pytest.mark.parametrize("fn", ["tolist", "raises"])
def test_uncapturable_model_gives_message_and_empty_plan(tmp_path, fn):
    path = tmp_path / "bad.py"
    path.write_text(UNCAPTURABLE)
    code, text = plan(f"{path}:{fn}")
    assert code == 2 and text.startswith("0 tasks")
    assert "not captured: " in text
    assert "Traceback" not in text


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
