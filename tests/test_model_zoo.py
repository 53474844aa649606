"""bench/model_zoo.py on the CPU: every row builds tiny (small=True) in fp32 and bf16 and runs a
finite forward of the expected leading dims, seeded (the same name twice: identical weights and
inputs); the table holds the issue's families; an unknown name raises KeyError naming the known
ones; and every family at full size builds and runs on the meta device with the shapes its
docstring states (no memory, no compute). No GPU, no optimize()."""
import pytest
import torch

from test_floor_bench import ROOT, _load   # a bench/ script as a module (bench/ is no package)

zm = _load("model_zoo", ROOT / "bench" / "model_zoo.py")

# the issue's families (#34): today's five bench families, and the seven written in plain torch
REUSED = ("llama", "gpt2", "resnet50", "bert", "mlp_mixer")
NEW = ("t5", "whisper", "convnext", "mobilenetv3", "swin", "unet", "vit")

# family -> (full-size input shapes, full-size output shape), as the docstrings say
FULL = {
    "llama": ([(4, 512)], (4, 512, 1024)),
    "gpt2": ([(8, 256, 768)], (8, 256, 768)),
    "bert": ([(8, 128, 768)], (8, 128, 768)),
    "t5": ([(4, 512), (4, 128)], (4, 128, 32128)),
    "whisper": ([(1, 80, 3000)], (1, 1500, 512)),
    "resnet18": ([(16, 3, 224, 224)], (16, 1000)),
    "resnet50": ([(32, 3, 224, 224)], (32, 1000)),
    "mobilenetv3": ([(32, 3, 224, 224)], (32, 1000)),
    "convnext": ([(16, 3, 224, 224)], (16, 1000)),
    "swin": ([(16, 3, 224, 224)], (16, 1000)),
    "vit": ([(16, 3, 224, 224)], (16, 1000)),
    "mlp_mixer": ([(32, 3, 64, 64)], (32, 100)),
    "unet": ([(8, 4, 64, 64), (8,)], (8, 4, 64, 64)),
}


def _leading(family: str, inputs: tuple) -> tuple:
    """The dims an output must start with: the batch, and for sequence models the (target)
    sequence length too."""
    x = inputs[-1] if family == "t5" else inputs[0]
    if family == "whisper":
        return x.shape[0], x.shape[2] // 2
    if family in ("llama", "gpt2", "bert", "t5"):
        return tuple(x.shape[:2])
    return (x.shape[0],)


def test_table_holds_the_issue_families():
    assert len(zm.MODELS) >= 12
    assert set(REUSED + NEW) <= set(zm.MODELS)
    assert set(FULL) == set(zm.MODELS)
    assert zm.ROWS == [f"{m}:{d}" for m in zm.MODELS for d in ("fp32", "bf16")]
    for family in zm.MODELS:
        line = zm.describe(f"{family}:bf16")
        assert line and ";" in line, family            # architecture; realistic shape


def test_unknown_name_raises_naming_the_known_ones():
    with pytest.raises(KeyError, match="llama:fp32.*unet:bf16"):
        zm.make("nope:fp32", small=True, device="cpu")
    with pytest.raises(KeyError):
        zm.make("vit:fp16", small=True, device="cpu")


@pytest.mark.parametrize("name", zm.ROWS)
def test_row_builds_small_and_runs_finite(name):
    family, dt = name.split(":")
    dtype = zm.DTYPES[dt]
    model, inputs = zm.make(name, small=True, device="cpu")
    assert not model.training
    assert sum(p.numel() for p in model.parameters()) < 500_000                 # tiny
    assert all(p.dtype == dtype for p in model.parameters())
    for x in inputs:
        assert x.dtype == dtype if x.is_floating_point() else x.dtype == torch.int64
    with torch.no_grad():
        out = model(*inputs)
    assert out.dtype == dtype
    assert tuple(out.shape[:len(_leading(family, inputs))]) == _leading(family, inputs)
    assert torch.isfinite(out.float()).all()
    assert out.float().std() > 0                                                # not a constant


@pytest.mark.parametrize("family", list(zm.MODELS))
def test_same_name_same_weights_and_inputs(family):
    name = f"{family}:fp32"
    (m1, x1), (m2, x2) = (zm.make(name, small=True, device="cpu") for _ in range(2))
    s1, s2 = m1.state_dict(), m2.state_dict()
    assert s1.keys() == s2.keys()
    assert all(torch.equal(s1[k], s2[k]) for k in s1)
    assert len(x1) == len(x2) and all(torch.equal(a, b) for a, b in zip(x1, x2))


def test_batchnorm_stats_are_randomized():
    model, _ = zm.make("mobilenetv3:fp32", small=True, device="cpu")
    bns = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert bns and all(not torch.all(m.running_var == 1) for m in bns)


@pytest.mark.parametrize("family", list(zm.MODELS))
def test_full_size_shapes_on_meta(family):
    """The full-size config (the bench's) builds and runs on the meta device with the docstring's
    shapes."""
    ins, out_shape = FULL[family]
    with torch.device("meta"):
        model, inputs = zm.make(f"{family}:bf16", device="meta")
        out = model(*inputs)
    assert [tuple(x.shape) for x in inputs] == ins
    assert tuple(out.shape) == out_shape and out.dtype == torch.bfloat16
    assert str(ins[0]).replace(" ", "") in zm.describe(family).replace(" ", "")   # docstring shape
