"""The models and KernelBench-style problems of bench/bench_floor.py: random weights, built from
code, nothing downloaded, eval mode, seeded.

Each row name is "<model>:<dtype>"; `make(name, small=False, device="cuda")` returns
(model, inputs). small=True builds the same architecture at a tiny size (the CPU tests run every
builder that way). Several rows are written to hit the paths where optimize() once left a model
slower than torch.compile of it:

  (a) kb_*: KernelBench-style problem files (bench/floor_models/*.py: class Model, get_inputs(),
      get_init_inputs()) loaded as KernelBench's harness loads them, with
      importlib.util.spec_from_file_location + exec_module and NOT registered in sys.modules, so
      their module is not importable by name;
  (b) cnn_pw_silu: bf16 channels-last CNN where a 1x1 conv + BN + SiLU consumes the output of a
      conv + BN + add + ReLU block;
  (c) cnn_small: a small fp32 conv/BN/ReLU CNN;
  (d) graph_break, item_branch: forwards with graph breaks (torch._dynamo.graph_break(), and an
      .item()-driven Python branch);
  (e) gqa_decoder, gpt_block: a grouped-query-attention decoder (SDPA, SwiGLU, RMSNorm) and a
      small GPT (LayerNorm, SDPA, GELU MLP);
  (f) resnet18 (torchvision, imported lazily), mlp_mixer and mlp_gelu (GEMM + GELU chains).

    >>> model, inputs = make("cnn_small:fp32", small=True, device="cpu")
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# NOTE: a folder beside this module of the same name: `import floor_models` still finds this file
# (a module wins over a folder without __init__.py), and the problems in the folder stay
# unimportable by name, which is the point of path (a)
PROBLEMS_DIR = Path(__file__).resolve().with_name("floor_models")


class Unavailable(Exception):
    """A row that cannot be built here (an optional package is missing): skipped with this note."""


def _finish(model: nn.Module, inputs: tuple, dtype: str, device: str, channels_last: bool = False):
    """model and inputs on `device` in `dtype` (float tensors only), eval mode, optionally
    channels-last (4-D tensors)."""
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    model = model.to(device=device, dtype=DTYPES[dtype]).eval()
    if channels_last:
        model = model.to(memory_format=fmt)
    out = []
    for x in inputs:
        x = x.to(device, DTYPES[dtype]) if x.is_floating_point() else x.to(device)
        out.append(x.contiguous(memory_format=fmt) if channels_last and x.dim() == 4 else x)
    return model, tuple(out)


def _randomize_bn(model: nn.Module) -> nn.Module:
    """BatchNorm with non-trivial affine weights and running statistics (fresh BN in eval mode is
    nearly the identity, which a fused kernel could get wrong unnoticed)."""
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            with torch.no_grad():
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 1.5)
    return model


# ---- (a) KernelBench-style problems, loaded as KernelBench's harness does ----------------------

# problem -> its file in PROBLEMS_DIR and the module globals that make it tiny (small=True);
# get_inputs() / get_init_inputs() read the globals when called, so overriding them is enough
PROBLEMS = {
    "kb_convt3d_ln": ("convt3d_layernorm.py",
                      # W_out = (2 - 1) * 2 - 2 + 4 = 4 = out_channels, as LayerNorm needs
                      dict(batch_size=1, in_channels=2, out_channels=4, D=2, H=2, W=2)),
    "kb_conv_relu_bias": ("conv2d_relu_biasadd.py",
                          dict(batch_size=2, in_channels=3, out_channels=4, height=8, width=8,
                               bias_shape=(4, 1, 1))),
    "kb_conv_gn": ("conv2d_groupnorm.py",
                   dict(batch_size=2, in_channels=3, out_channels=8, height=8, width=8, num_groups=4)),
}


def load_problem(path: Path):
    """The module of a KernelBench problem file, executed under a name that is in no sys.modules
    (KernelBench's harness does the same): nothing can import it by name, pickle its classes or
    find its source through sys.modules."""
    spec = importlib.util.spec_from_file_location(f"floor_problem_{Path(path).stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)    # NOTE: deliberately not sys.modules[spec.name] = mod
    return mod


def _problem(key: str):
    def build(dtype: str, small: bool, device: str):
        file, tiny = PROBLEMS[key]
        mod = load_problem(PROBLEMS_DIR / file)
        if small:
            for k, v in tiny.items():
                setattr(mod, k, v)
        model = mod.Model(*mod.get_init_inputs())
        return _finish(model, tuple(mod.get_inputs()), dtype, device)   # get_inputs: CPU tensors
    build.__doc__ = f"KernelBench-style problem bench/floor_models/{PROBLEMS[key][0]}, loaded unregistered"
    return build


# ---- (b) bf16 channels-last CNN: 1x1 conv + BN + SiLU after a conv + BN + add + ReLU block -----

def _conv_bn(cin: int, cout: int, k: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2, bias=False), nn.BatchNorm2d(cout))


class ResBlock(nn.Module):
    """relu(bn(conv(relu(bn(conv(x))))) + x): the conv + BN + add + ReLU producer."""

    def __init__(self, c: int):
        super().__init__()
        self.a, self.b = _conv_bn(c, c, 3), _conv_bn(c, c, 3)

    def forward(self, x):
        return F.relu(self.b(F.relu(self.a(x))) + x)


class PwBnSiLU(nn.Module):
    """silu(bn(conv1x1(x))): the consumer that reads the block's channels-last output."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.conv = _conv_bn(cin, cout, 1)

    def forward(self, x):
        return F.silu(self.conv(x))


def cnn_pw_silu(dtype: str, small: bool, device: str):
    """bf16 channels-last CNN: stem, then twice [conv+BN+add+ReLU block -> 1x1 conv+BN+SiLU]."""
    c, batch, size = (4, 2, 16) if small else (64, 32, 112)
    model = nn.Sequential(                              # (32, 3, 112, 112) -> (32, 256, 56, 56)
        _conv_bn(3, c, 3, stride=2), nn.ReLU(),
        ResBlock(c), PwBnSiLU(c, 2 * c),
        ResBlock(2 * c), PwBnSiLU(2 * c, 4 * c))
    return _finish(_randomize_bn(model), (torch.randn(batch, 3, size, size),), dtype, device,
                   channels_last=True)


# ---- (c) small fp32 CNN ------------------------------------------------------------------------

def cnn_small(dtype: str, small: bool, device: str):
    """fp32 CNN: four conv+BN+ReLU layers (two strided), global average pool, linear head."""
    w, batch, size = (4, 2, 16) if small else (32, 16, 64)
    layers = []
    for cin, cout, stride in ((3, w, 1), (w, 2 * w, 2), (2 * w, 2 * w, 1), (2 * w, 4 * w, 2)):
        layers += [_conv_bn(cin, cout, 3, stride), nn.ReLU()]
    model = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * w, 10))
    return _finish(_randomize_bn(model), (torch.randn(batch, 3, size, size),), dtype, device)


# ---- (d) graph breaks --------------------------------------------------------------------------

class GraphBreakMLP(nn.Module):
    """Two residual MLP halves with torch._dynamo.graph_break() between and after them: Dynamo
    compiles three graphs and runs Python between them."""

    def __init__(self, d: int):
        super().__init__()
        self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.up1, self.down1 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.up2, self.down2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        x = x + self.down1(F.gelu(self.up1(self.n1(x))))
        torch._dynamo.graph_break()
        x = x + self.down2(F.gelu(self.up2(self.n2(x))))
        torch._dynamo.graph_break()
        return x * 0.5


def graph_break(dtype: str, small: bool, device: str):
    """fp32 token MLP with two explicit graph breaks: (16, 256, 512) -> same."""
    d, batch, seq = (8, 2, 4) if small else (512, 16, 256)
    return _finish(GraphBreakMLP(d), (torch.randn(batch, seq, d),), dtype, device)


class ItemBranch(nn.Module):
    """A Python branch on a tensor's value (.item(): a host sync and a graph break), each branch an
    MLP; the same input always takes the same branch."""

    def __init__(self, d: int):
        super().__init__()
        self.stem = nn.Sequential(nn.Linear(d, d), nn.GELU())
        self.wide = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.narrow = nn.Linear(d, d)
        self.head = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, d))

    def forward(self, x):
        h = self.stem(x)
        if h.float().abs().mean().item() > 0.05:
            h = h + self.wide(h)
        else:
            h = h + self.narrow(h)
        return self.head(h)


def item_branch(dtype: str, small: bool, device: str):
    """bf16 MLP whose forward branches on .item(): (8, 256, 1024) -> same."""
    d, batch, seq = (8, 2, 4) if small else (1024, 8, 256)
    return _finish(ItemBranch(d), (torch.randn(batch, seq, d),), dtype, device)


# ---- (e) transformer decoders ------------------------------------------------------------------

class RMSNorm(nn.Module):
    """Llama's RMSNorm, computed in fp32 and cast back, as HF's LlamaRMSNorm."""

    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class GQAttention(nn.Module):
    """Causal grouped-query attention through SDPA: `heads` query heads share `kv_heads` K/V heads
    (each K/V head repeated heads // kv_heads times, as HF's repeat_kv)."""

    def __init__(self, d: int, heads: int, kv_heads: int):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, d // heads
        self.q = nn.Linear(d, heads * self.hd, bias=False)
        self.k = nn.Linear(d, kv_heads * self.hd, bias=False)
        self.v = nn.Linear(d, kv_heads * self.hd, bias=False)
        self.o = nn.Linear(heads * self.hd, d, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.hd).transpose(1, 2)        # (b, heads, s, hd)
        k = self.k(x).view(b, s, self.kv_heads, self.hd).transpose(1, 2)     # (b, kv_heads, s, hd)
        v = self.v(x).view(b, s, self.kv_heads, self.hd).transpose(1, 2)
        rep = self.heads // self.kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, s, -1))


class SwiGLU(nn.Module):
    def __init__(self, d: int, hidden: int):
        super().__init__()
        self.gate = nn.Linear(d, hidden, bias=False)
        self.up = nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class GQALayer(nn.Module):
    def __init__(self, d: int, heads: int, kv_heads: int, hidden: int):
        super().__init__()
        self.n1, self.attn = RMSNorm(d), GQAttention(d, heads, kv_heads)
        self.n2, self.mlp = RMSNorm(d), SwiGLU(d, hidden)

    def forward(self, x):
        x = x + self.attn(self.n1(x))
        return x + self.mlp(self.n2(x))


def gqa_decoder(dtype: str, small: bool, device: str):
    """Llama-style decoder on hidden states: 3 layers, hidden 768, 12 query / 4 KV heads (head dim
    64), SwiGLU 2048, RMSNorm; batch 4 x seq 512 -> (4, 512, 768)."""
    d, heads, kv, hidden, layers, batch, seq = ((16, 4, 2, 32, 2, 2, 8) if small
                                                else (768, 12, 4, 2048, 3, 4, 512))
    model = nn.Sequential(*[GQALayer(d, heads, kv, hidden) for _ in range(layers)], RMSNorm(d))
    return _finish(model, (torch.randn(batch, seq, d),), dtype, device)


class GPTBlock(nn.Module):
    """GPT-2's block: pre-LayerNorm, causal MHA through SDPA (one fused QKV linear), tanh-GELU MLP."""

    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.qkv, self.proj = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ln2, self.fc, self.fc2 = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2)    # (b, heads, s, hd)
                   for t in self.qkv(self.ln1(x)).split(d, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


def gpt_block(dtype: str, small: bool, device: str):
    """Small GPT: 2 GPT-2 blocks, hidden 768, 12 heads, final LayerNorm; batch 8 x seq 256."""
    d, heads, blocks, batch, seq = (16, 2, 2, 2, 8) if small else (768, 12, 2, 8, 256)
    model = nn.Sequential(*[GPTBlock(d, heads) for _ in range(blocks)], nn.LayerNorm(d))
    return _finish(model, (torch.randn(batch, seq, d),), dtype, device)


# ---- (f) torchvision ResNet-18, MLP-Mixer, GELU MLP --------------------------------------------

def resnet18(dtype: str, small: bool, device: str):
    """torchvision ResNet-18 (weights=None), channels-last; batch 32 x 224 x 224."""
    try:
        import torchvision   # NOTE: lazily, so the other rows run where torchvision is missing
    except ImportError as e:
        raise Unavailable(f"torchvision is not installed ({e})") from e
    batch, size = (1, 32) if small else (32, 224)
    model = _randomize_bn(torchvision.models.resnet18(weights=None))
    return _finish(model, (torch.randn(batch, 3, size, size),), dtype, device, channels_last=True)


class MixerBlock(nn.Module):
    """MLP-Mixer's block: a GELU MLP across tokens, then one across channels, each pre-LayerNorm
    with a residual."""

    def __init__(self, tokens: int, d: int, token_hidden: int, channel_hidden: int):
        super().__init__()
        self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.token_mlp = nn.Sequential(nn.Linear(tokens, token_hidden), nn.GELU(), nn.Linear(token_hidden, tokens))
        self.channel_mlp = nn.Sequential(nn.Linear(d, channel_hidden), nn.GELU(), nn.Linear(channel_hidden, d))

    def forward(self, x):                                                # x: (b, tokens, d)
        x = x + self.token_mlp(self.n1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mlp(self.n2(x))


class MLPMixer(nn.Module):
    def __init__(self, size: int, patch: int, d: int, depth: int, classes: int = 100):
        super().__init__()
        tokens = (size // patch) ** 2
        self.embed = nn.Conv2d(3, d, patch, stride=patch)
        self.blocks = nn.Sequential(*[MixerBlock(tokens, d, d // 2, 4 * d) for _ in range(depth)])
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, classes)

    def forward(self, img):
        x = self.embed(img).flatten(2).transpose(1, 2)                  # (b, tokens, d)
        return self.head(self.norm(self.blocks(x)).mean(dim=1))


def mlp_mixer(dtype: str, small: bool, device: str):
    """timm-free MLP-Mixer: 64x64 images in 8x8 patches (64 tokens), dim 256, 4 blocks; batch 32."""
    size, patch, d, depth, batch = (16, 8, 8, 2, 2) if small else (64, 8, 256, 4, 32)
    return _finish(MLPMixer(size, patch, d, depth), (torch.randn(batch, 3, size, size),), dtype, device)


class GeluMLP(nn.Module):
    """Residual pre-LayerNorm GELU MLPs in a chain: x + fc2(gelu(fc1(ln(x)))) per layer."""

    def __init__(self, d: int, layers: int):
        super().__init__()
        self.layers = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
            for _ in range(layers))

    def forward(self, x):
        for mlp in self.layers:
            x = x + mlp(x)
        return x


def mlp_gelu(dtype: str, small: bool, device: str):
    """GEMM + GELU chain: 4 residual MLPs 1024 -> 4096 -> 1024 on (8, 256, 1024)."""
    d, layers, batch, seq = (8, 2, 2, 4) if small else (1024, 4, 8, 256)
    return _finish(GeluMLP(d, layers), (torch.randn(batch, seq, d),), dtype, device)


# ---- the table ---------------------------------------------------------------------------------

# row name ("<model>:<dtype>") -> builder(dtype, small, device) -> (model, inputs); in this order
# the bench runs them (bench/bench_floor.py --list)
ROWS = {
    "kb_convt3d_ln:fp32": _problem("kb_convt3d_ln"),
    "kb_conv_relu_bias:fp32": _problem("kb_conv_relu_bias"),
    "kb_conv_gn:fp32": _problem("kb_conv_gn"),
    "cnn_pw_silu:bf16": cnn_pw_silu,
    "cnn_small:fp32": cnn_small,
    "graph_break:fp32": graph_break,
    "item_branch:bf16": item_branch,
    "gqa_decoder:bf16": gqa_decoder,
    "gpt_block:fp32": gpt_block,
    "gpt_block:bf16": gpt_block,
    "resnet18:bf16": resnet18,
    "mlp_mixer:fp32": mlp_mixer,
    "mlp_gelu:bf16": mlp_gelu,
}


def describe(name: str) -> str:
    """The first line of a row's builder's docstring."""
    return (ROWS[name].__doc__ or "").strip().splitlines()[0]


def make(name: str, small: bool = False, device: str = "cuda"):
    """(model, inputs) of row `name`, seeded (the same weights and inputs every run). Raises
    Unavailable where the row cannot be built here."""
    if name not in ROWS:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(ROWS)}")
    dtype = name.rsplit(":", 1)[1]
    torch.manual_seed(0)
    return ROWS[name](dtype, small, device)
