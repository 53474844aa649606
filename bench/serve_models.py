"""The models bench/bench_serve.py serves: random weights, built from configs in code, nothing
downloaded, plain torch only (no transformers, no timm, no torchvision), eval mode, seeded.

Each model function is `get(device, dtype, small=False)` and returns

    (model, example_inputs: tuple, dynamic: dict, make_inputs: Callable[[int], tuple])

where `dynamic` is {input index: {dim: (low, high)}}, exactly OptimizeConfig.dynamic's format,
with one declared dim, and make_inputs(size) builds inputs with that dim at `size` (seeded by the
size: the same size gives the same tensors). small=True builds the same architecture tiny, with a
small range, for the CPU tests.

  decoder: Llama-style prefill of one request: token ids (1, S) -> final-normed hidden states
           (1, S, 1024); 4 layers, 16 query / 4 KV heads (head dim 64, GQA), SwiGLU 2816,
           RMSNorm, rotary, SDPA causal, vocab 32000. Example S=512; S in (16, 1024), batch 1.
  encoder: BERT-like post-norm encoder on hidden states (B, 128, 768) -> (B, 128, 768); 4
           layers, 12 heads, GELU MLP 3072, LayerNorm, SDPA. Example B=8; B in (1, 64).
  vision:  ResNet-18-style convnet (BasicBlocks [2, 2, 2, 2], BN + ReLU, 1000 classes) on
           images (B, 3, 224, 224) -> logits (B, 1000). Example B=16; B in (1, 64).

    >>> model, example, dynamic, make_inputs = make("encoder:bf16", small=True, device="cpu")
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from floor_models import RMSNorm, SwiGLU, _randomize_bn   # the floor suite's (Llama's RMSNorm;
                                                            # down(silu(gate(x)) * up(x)); BN stats)

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
# what one unit of a request's size is: a decoder request of size 300 is 300 tokens
UNITS = {"decoder": "tokens", "encoder": "sequences", "vision": "images", "resnet50": "images"}


# ---- decoder: GQA + SwiGLU + RMSNorm, prefill ----------------------------------------------------

def _rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Rotary(nn.Module):
    """Rotary position embedding (Llama's, non-interleaved halves): cos/sin tables of
    (max_pos, head_dim) precomputed as buffers and sliced to the sequence length, as older HF
    Llama did."""

    def __init__(self, head_dim: int, max_pos: int, base: float = 10000.0):
        super().__init__()
        inv = 1.0 / base ** (torch.arange(0, head_dim, 2).float() / head_dim)      # (head_dim / 2,)
        angles = torch.outer(torch.arange(max_pos).float(), inv)                    # (max_pos, hd / 2)
        emb = torch.cat((angles, angles), dim=-1)                                   # (max_pos, hd)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, q, k):
        s = q.shape[-2]                                     # q, k: (b, heads, s, hd)
        cos, sin = self.cos[:s].to(q.dtype), self.sin[:s].to(q.dtype)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


class GQAttention(nn.Module):
    """Causal grouped-query attention through SDPA: `heads` query heads share `kv_heads` K/V heads,
    each K/V head repeated heads // kv_heads times (HF's repeat_kv: expand + reshape)."""

    def __init__(self, d: int, heads: int, kv_heads: int, head_dim: int, max_pos: int):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, head_dim
        self.q = nn.Linear(d, heads * head_dim, bias=False)
        self.k = nn.Linear(d, kv_heads * head_dim, bias=False)
        self.v = nn.Linear(d, kv_heads * head_dim, bias=False)
        self.o = nn.Linear(heads * head_dim, d, bias=False)
        self.rotary = Rotary(head_dim, max_pos)

    def _repeat_kv(self, x):
        b, kv, s, hd = x.shape                                # (b, kv_heads, s, hd) -> (b, heads, s, hd)
        rep = self.heads // kv
        return x[:, :, None].expand(b, kv, rep, s, hd).reshape(b, kv * rep, s, hd)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.hd).transpose(1, 2)        # (b, heads, s, hd)
        k = self.k(x).view(b, s, self.kv_heads, self.hd).transpose(1, 2)     # (b, kv_heads, s, hd)
        v = self.v(x).view(b, s, self.kv_heads, self.hd).transpose(1, 2)
        q, k = self.rotary(q, k)
        y = F.scaled_dot_product_attention(q, self._repeat_kv(k), self._repeat_kv(v), is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, s, -1))


class DecoderLayer(nn.Module):
    def __init__(self, d: int, heads: int, kv_heads: int, head_dim: int, hidden: int, max_pos: int):
        super().__init__()
        self.n1, self.attn = RMSNorm(d), GQAttention(d, heads, kv_heads, head_dim, max_pos)
        self.n2, self.mlp = RMSNorm(d), SwiGLU(d, hidden)

    def forward(self, x):
        x = x + self.attn(self.n1(x))
        return x + self.mlp(self.n2(x))


class Decoder(nn.Module):
    """Token ids (b, s) -> final-normed hidden states (b, s, d): prefill, no LM head (a server
    computes logits for the last position only, outside what this measures)."""

    def __init__(self, vocab: int, d: int, layers: int, heads: int, kv_heads: int, head_dim: int,
                 hidden: int, max_pos: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(DecoderLayer(d, heads, kv_heads, head_dim, hidden, max_pos)
                                    for _ in range(layers))
        self.norm = RMSNorm(d)

    def forward(self, ids):
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


def decoder(device: str = "cuda", dtype: torch.dtype = torch.bfloat16, small: bool = False):
    """Llama-style prefill: 4 layers, hidden 1024, 16/4 KV heads of 64, SwiGLU 2816; ids (1, S), S 16-1024.

    Vocab 32000 (the embedding is a gather: cheap); rotary from cos/sin tables of 1024 positions."""
    # (vocab, d, layers, heads, kv_heads, head_dim, hidden), then the example S and S's range
    cfg, seq, (low, high) = (((64, 32, 2, 4, 2, 8, 64), 16, (4, 32)) if small
                             else ((32000, 1024, 4, 16, 4, 64, 2816), 512, (16, 1024)))
    model = _finish(Decoder(*cfg, max_pos=high), device, dtype)
    vocab = cfg[0]

    def make_inputs(size: int) -> tuple:
        return (torch.randint(0, vocab, (1, size), generator=_gen(size)).to(device),)   # (1, size) int64

    return model, make_inputs(seq), {0: {1: (low, high)}}, make_inputs


# ---- encoder: BERT-like, post-norm ---------------------------------------------------------------

class EncoderLayer(nn.Module):
    """BERT's layer: x = LN(x + attn(x)); x = LN(x + MLP(x)), MHA through SDPA (one fused QKV
    linear, biases), erf-GELU MLP."""

    def __init__(self, d: int, heads: int, hidden: int):
        super().__init__()
        self.heads = heads
        self.qkv, self.proj, self.ln1 = nn.Linear(d, 3 * d), nn.Linear(d, d), nn.LayerNorm(d, eps=1e-12)
        self.fc, self.fc2, self.ln2 = nn.Linear(d, hidden), nn.Linear(hidden, d), nn.LayerNorm(d, eps=1e-12)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2)    # (b, heads, s, hd)
                   for t in self.qkv(x).split(d, dim=2))
        y = F.scaled_dot_product_attention(q, k, v)
        x = self.ln1(x + self.proj(y.transpose(1, 2).reshape(b, s, d)))
        return self.ln2(x + self.fc2(F.gelu(self.fc(x))))


def encoder(device: str = "cuda", dtype: torch.dtype = torch.bfloat16, small: bool = False):
    """BERT-like post-norm encoder: 4 layers, hidden 768, 12 heads, GELU 3072; hidden states (B, 128, 768), B 1-64."""
    # (d, heads, hidden, layers), then seq, the example B and B's range
    (d, heads, hidden, layers), seq, batch, (low, high) = (((32, 4, 64, 2), 8, 4, (1, 8)) if small
                                                          else ((768, 12, 3072, 4), 128, 8, (1, 64)))
    model = _finish(nn.Sequential(*[EncoderLayer(d, heads, hidden) for _ in range(layers)]), device, dtype)

    def make_inputs(size: int) -> tuple:
        return (torch.randn(size, seq, d, generator=_gen(size)).to(device, dtype),)     # (size, seq, d)

    return model, make_inputs(batch), {0: {0: (low, high)}}, make_inputs


# ---- vision: ResNet-18-style convnet --------------------------------------------------------------

def _conv_bn(cin: int, cout: int, k: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2, bias=False), nn.BatchNorm2d(cout))


class BasicBlock(nn.Module):
    """ResNet's basic block: relu(bn(conv3x3(relu(bn(conv3x3(x))))) + shortcut(x)), the shortcut
    a strided 1x1 conv + BN where the shape changes."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.a, self.b = _conv_bn(cin, cout, 3, stride), _conv_bn(cout, cout, 3)
        self.short = _conv_bn(cin, cout, 1, stride) if stride != 1 or cin != cout else nn.Identity()

    def forward(self, x):
        return F.relu(self.b(F.relu(self.a(x))) + self.short(x))


def _resnet(width: int, classes: int) -> nn.Sequential:
    """Stem (7x7/2 conv + BN + ReLU, 3x3/2 max pool), four stages of two blocks (widths w, 2w, 4w,
    8w; stages 2-4 halve the size), global average pool, linear head."""
    layers, cin = [_conv_bn(3, width, 7, 2), nn.ReLU(), nn.MaxPool2d(3, 2, 1)], width
    for i, cout in enumerate((width, 2 * width, 4 * width, 8 * width)):
        layers += [BasicBlock(cin, cout, 1 if i == 0 else 2), BasicBlock(cout, cout, 1)]
        cin = cout
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes))


class Bottleneck(nn.Module):
    """ResNet-50's block: 1x1 down to w, 3x3 (strided), 1x1 up to 4w, each with BN; ReLU after
    the first two and after the residual add (shortcut: a strided 1x1 conv + BN where the shape
    changes)."""

    def __init__(self, cin: int, width: int, stride: int):
        super().__init__()
        cout = 4 * width
        self.a, self.b, self.c = _conv_bn(cin, width, 1), _conv_bn(width, width, 3, stride), _conv_bn(width, cout, 1)
        self.short = _conv_bn(cin, cout, 1, stride) if stride != 1 or cin != cout else nn.Identity()

    def forward(self, x):
        return F.relu(self.c(F.relu(self.b(F.relu(self.a(x))))) + self.short(x))


def _resnet50(width: int, classes: int, blocks=(3, 4, 6, 3)) -> nn.Sequential:
    """ResNet-50's layout: the stem of _resnet, stages of 3, 4, 6, 3 bottlenecks (widths w, 2w,
    4w, 8w; stages 2-4 halve the size), global average pool, linear head."""
    layers, cin = [_conv_bn(3, width, 7, 2), nn.ReLU(), nn.MaxPool2d(3, 2, 1)], width
    for i, n in enumerate(blocks):
        w = width << i
        for j in range(n):
            layers.append(Bottleneck(cin, w, 2 if i > 0 and j == 0 else 1))
            cin = 4 * w
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes))


def vision(device: str = "cuda", dtype: torch.dtype = torch.bfloat16, small: bool = False):
    """ResNet-18-style convnet (BN + ReLU, 1000 classes); images (B, 3, 224, 224), B 1-64."""
    (width, classes, size), batch, (low, high) = (((8, 10, 32), 2, (1, 4)) if small
                                                  else ((64, 1000, 224), 16, (1, 64)))
    model = _finish(_randomize_bn(_resnet(width, classes)), device, dtype)

    def make_inputs(n: int) -> tuple:
        return (torch.randn(n, 3, size, size, generator=_gen(n)).to(device, dtype),)   # (n, 3, size, size)

    return model, make_inputs(batch), {0: {0: (low, high)}}, make_inputs


def resnet50(device: str = "cuda", dtype: torch.dtype = torch.bfloat16, small: bool = False):
    """ResNet-50 (bottleneck blocks, BN + ReLU, 1000 classes); images (B, 3, 224, 224), example B
    32 (where its conv kernels beat torch.compile's at a fixed size), B 1-64."""
    (width, classes, size, blocks), batch, (low, high) = (((8, 10, 32, (1, 1, 1, 1)), 2, (1, 4)) if small
                                                          else ((64, 1000, 224, (3, 4, 6, 3)), 32, (1, 64)))
    model = _finish(_randomize_bn(_resnet50(width, classes, blocks)), device, dtype)

    def make_inputs(n: int) -> tuple:
        return (torch.randn(n, 3, size, size, generator=_gen(n)).to(device, dtype),)   # (n, 3, size, size)

    return model, make_inputs(batch), {0: {0: (low, high)}}, make_inputs


# ---- shared ----------------------------------------------------------------------------------------

def _finish(model: nn.Module, device: str, dtype: torch.dtype) -> nn.Module:
    return model.to(device=device, dtype=dtype).eval()


def _gen(size: int, seed: int = 1234) -> torch.Generator:
    """A CPU generator seeded by the request's size: the same size gives the same inputs, on any
    device (CPU draws, then moved)."""
    return torch.Generator().manual_seed(seed * 100003 + size)


MODELS: dict[str, Callable] = {"decoder": decoder, "encoder": encoder, "vision": vision, "resnet50": resnet50}
ROWS = [f"{m}:{d}" for m in MODELS for d in DTYPES]


def describe(name: str) -> str:
    """The first line of a row's model function's docstring."""
    return (MODELS[name.split(":")[0]].__doc__ or "").strip().splitlines()[0]


def make(name: str, small: bool = False, device: str = "cuda"):
    """Row `name` ("decoder:bf16"): (model, example_inputs, dynamic, make_inputs), seeded (the same
    weights every run)."""
    if name not in ROWS:
        raise KeyError(f"unknown row {name!r}; known: {', '.join(ROWS)}")
    model, dtype = name.split(":")
    torch.manual_seed(0)
    return MODELS[model](device, DTYPES[dtype], small=small)


def dynamic_dim(dynamic: dict) -> tuple[int, int, int, int]:
    """(input index, dim, low, high) of the one declared dim of a model's `dynamic`."""
    ((index, dims),) = dynamic.items()
    ((dim, (low, high)),) = dims.items()
    return index, dim, low, high
