"""The benchmark zoo (issue #34): real model families at realistic inference shapes, in fp32 and
bf16, for comparing torch_htam.optimize against torch.compile. Random weights built from configs
in code, nothing downloaded, plain torch only (no torchvision, timm or transformers: a CPU-only
torch imports this), eval mode, seeded.

Each family is a function `(dtype: torch.dtype, small: bool, device: str) -> (model, inputs)`;
its docstring's first line says the architecture and the full-size example shape. Row names are
"<family>:<dtype>" (ROWS); `make(name, small=False, device="cuda")` builds one after
torch.manual_seed(0), so the same name gives the same weights and inputs. small=True builds the
same architecture tiny (a few hundred K parameters, tiny inputs) for the CPU tests.

Reused from bench/serve_models.py and bench/floor_models.py (imported, not copied): llama,
bert, resnet18, resnet50 (serve_models), gpt2 (floor_models.gpt_block), mlp_mixer. Written here:
t5, whisper, convnext, mobilenetv3, swin, unet, vit.

    >>> model, inputs = make("convnext:bf16", small=True, device="cpu")
"""
from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

# NOTE: bench/ is no package; its scripts import their siblings by name (serve_models imports
# floor_models), so this module works when loaded by path too
_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import floor_models as fm     # noqa: E402
import serve_models as sm     # noqa: E402
from floor_models import RMSNorm, _randomize_bn   # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
_DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


def _finish(model: nn.Module, inputs: tuple, dtype: torch.dtype, device: str, channels_last: bool = False):
    """floor_models._finish: model and float inputs on device in dtype (integer inputs stay
    integer), eval mode, optionally channels-last."""
    return fm._finish(model, inputs, _DTYPE_NAMES[dtype], device, channels_last=channels_last)


# ---- reused families ---------------------------------------------------------------------------

def llama(dtype: torch.dtype, small: bool, device: str):
    """Llama-style GQA decoder prefill (RMSNorm, rotary, SwiGLU), 4 layers, h1024, 16/4 heads; ids (4, 512)."""
    model, _, _, _ = sm.decoder(device, dtype, small=small)                  # serve_models' config
    batch, seq = (2, 16) if small else (4, 512)
    ids = torch.randint(0, model.embed.num_embeddings, (batch, seq))         # (4, 512) int64
    return _finish(model, (ids,), dtype, device)                             # -> (4, 512, 1024)


def gpt2(dtype: torch.dtype, small: bool, device: str):
    """GPT-2-style block stack (pre-LN, causal MHA, tanh-GELU), 2 blocks, h768; hidden (8, 256, 768)."""
    model, inputs = fm.gpt_block(_DTYPE_NAMES[dtype], small, device)
    return model, inputs                                                     # -> (8, 256, 768)


def bert(dtype: torch.dtype, small: bool, device: str):
    """BERT-like post-norm encoder, 4 layers, h768, 12 heads, GELU 3072; hidden (8, 128, 768)."""
    model, example, _, _ = sm.encoder(device, dtype, small=small)
    return model, example                                                    # -> (8, 128, 768)


def resnet18(dtype: torch.dtype, small: bool, device: str):
    """ResNet-18-style convnet (BasicBlocks, BN + ReLU), 1000 classes; images (16, 3, 224, 224)."""
    model, example, _, _ = sm.vision(device, dtype, small=small)
    return model, example                                                    # -> (16, 1000)


def resnet50(dtype: torch.dtype, small: bool, device: str):
    """ResNet-50 (bottlenecks [3, 4, 6, 3], BN + ReLU), 1000 classes; images (32, 3, 224, 224)."""
    model, example, _, _ = sm.resnet50(device, dtype, small=small)
    return model, example                                                    # -> (32, 1000)


def mlp_mixer(dtype: torch.dtype, small: bool, device: str):
    """MLP-Mixer, 64x64 images in 8x8 patches (64 tokens), dim 256, 4 blocks; images (32, 3, 64, 64)."""
    return fm.mlp_mixer(_DTYPE_NAMES[dtype], small, device)                  # -> (32, 100)


# ---- shared transformer pieces -----------------------------------------------------------------

class MHA(nn.Module):
    """Multi-head attention through SDPA; self-attention when `kv` is None, else cross-attention
    over `kv`; `bias` an additive (1 | b, heads, q, k) float mask."""

    def __init__(self, d: int, heads: int, head_dim: int | None = None, qkv_bias: bool = True, scale=None):
        super().__init__()
        self.heads, self.hd, self.scale = heads, head_dim or d // heads, scale
        inner = heads * self.hd
        self.q = nn.Linear(d, inner, bias=qkv_bias)
        self.kv = nn.Linear(d, 2 * inner, bias=qkv_bias)
        self.o = nn.Linear(inner, d, bias=qkv_bias)

    def forward(self, x, kv=None, bias=None, causal=False):
        b, s, _ = x.shape
        kv = x if kv is None else kv
        q = self.q(x).view(b, s, self.heads, self.hd).transpose(1, 2)                      # (b, h, s, hd)
        k, v = (t.view(b, kv.shape[1], self.heads, self.hd).transpose(1, 2)                # (b, h, t, hd)
                for t in self.kv(kv).chunk(2, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, is_causal=causal, scale=self.scale)
        return self.o(y.transpose(1, 2).reshape(b, s, -1))


class PreLNBlock(nn.Module):
    """ViT / Whisper encoder block: x + attn(LN(x)); x + fc2(gelu(fc1(LN(x))))."""

    def __init__(self, d: int, heads: int, hidden: int, eps: float = 1e-5):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(d, eps=eps), MHA(d, heads)
        self.ln2 = nn.LayerNorm(d, eps=eps)
        self.mlp = nn.Sequential(nn.Linear(d, hidden), nn.GELU(), nn.Linear(hidden, d))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


# ---- t5: encoder-decoder with cross-attention --------------------------------------------------

def _t5_bucket(rel: torch.Tensor, bidirectional: bool, buckets: int = 32, max_distance: int = 128):
    """T5's relative position bucket of key_pos - query_pos: exact for small distances, log-spaced
    up to max_distance (HF's _relative_position_bucket)."""
    ret, n = 0, -rel
    if bidirectional:
        buckets //= 2
        ret, n = (n < 0).long() * buckets, n.abs()
    else:
        n = n.clamp(min=0)
    exact = buckets // 2
    large = exact + (torch.log(n.float().clamp(min=1) / exact) / math.log(max_distance / exact)
                     * (buckets - exact)).long()
    return ret + torch.where(n < exact, n, large.clamp(max=buckets - 1))


class T5RelBias(nn.Module):
    """Per-head learned bias over relative position buckets -> (1, heads, q, k)."""

    def __init__(self, heads: int, bidirectional: bool):
        super().__init__()
        self.emb, self.bidirectional = nn.Embedding(32, heads), bidirectional

    def forward(self, q: int, k: int, device):
        rel = torch.arange(k, device=device)[None, :] - torch.arange(q, device=device)[:, None]   # (q, k)
        return self.emb(_t5_bucket(rel, self.bidirectional)).permute(2, 0, 1)[None]               # (1, h, q, k)


class T5Layer(nn.Module):
    """T5 layer (pre-RMSNorm, unscaled attention, ReLU FF): self-attn [, cross-attn], FF."""

    def __init__(self, d: int, heads: int, d_kv: int, ff: int, cross: bool):
        super().__init__()
        self.n1, self.attn = RMSNorm(d), MHA(d, heads, d_kv, qkv_bias=False, scale=1.0)
        if cross:
            self.n_x, self.xattn = RMSNorm(d), MHA(d, heads, d_kv, qkv_bias=False, scale=1.0)
        self.n2 = RMSNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, ff, bias=False), nn.ReLU(), nn.Linear(ff, d, bias=False))

    def forward(self, x, bias, memory=None):
        x = x + self.attn(self.n1(x), bias=bias)
        if memory is not None:
            x = x + self.xattn(self.n_x(x), kv=memory)
        return x + self.ff(self.n2(x))


class T5(nn.Module):
    """src ids (b, s), tgt ids (b, t) -> logits (b, t, vocab): encoder over src, decoder over tgt
    with causal self-attention and cross-attention to the encoder's output (teacher forcing)."""

    def __init__(self, vocab: int, d: int, heads: int, d_kv: int, ff: int, layers: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)                                   # shared by both stacks
        self.enc_bias, self.dec_bias = T5RelBias(heads, True), T5RelBias(heads, False)
        self.enc = nn.ModuleList(T5Layer(d, heads, d_kv, ff, cross=False) for _ in range(layers))
        self.dec = nn.ModuleList(T5Layer(d, heads, d_kv, ff, cross=True) for _ in range(layers))
        self.enc_norm, self.dec_norm = RMSNorm(d), RMSNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, src, tgt):
        x = self.embed(src)                                                   # (b, s, d)
        bias = self.enc_bias(src.shape[1], src.shape[1], src.device).to(x.dtype)
        for layer in self.enc:
            x = layer(x, bias)
        memory = self.enc_norm(x)
        y, t = self.embed(tgt), tgt.shape[1]                                  # (b, t, d)
        causal = torch.full((t, t), float("-inf"), device=tgt.device).triu(1)
        bias = (self.dec_bias(t, t, tgt.device) + causal).to(y.dtype)        # (1, h, t, t)
        for layer in self.dec:
            y = layer(y, bias, memory)
        return self.lm_head(self.dec_norm(y))                                 # (b, t, vocab)


def t5(dtype: torch.dtype, small: bool, device: str):
    """T5-small-like encoder-decoder (rel-pos bias, RMSNorm, ReLU FF), 6+6 layers, d512; src (4, 512), tgt (4, 128)."""
    # (vocab, d, heads, d_kv, ff, layers), batch, src len, tgt len
    cfg, batch, s, t = ((128, 32, 2, 16, 64, 2), 2, 16, 8) if small else ((32128, 512, 8, 64, 2048, 6), 4, 512, 128)
    model = T5(*cfg)
    src, tgt = torch.randint(0, cfg[0], (batch, s)), torch.randint(0, cfg[0], (batch, t))
    return _finish(model, (src, tgt), dtype, device)                         # -> (4, 128, 32128)


# ---- whisper: audio encoder --------------------------------------------------------------------

class WhisperEncoder(nn.Module):
    """log-mels (b, mels, frames) -> (b, frames / 2, d): two conv1d + GELU (the second stride 2),
    sinusoidal positions, pre-LN blocks, final LayerNorm."""

    def __init__(self, mels: int, d: int, heads: int, layers: int, ctx: int):
        super().__init__()
        self.conv1 = nn.Conv1d(mels, d, 3, padding=1)
        self.conv2 = nn.Conv1d(d, d, 3, stride=2, padding=1)
        inv = torch.exp(-math.log(10000) / (d // 2 - 1) * torch.arange(d // 2))
        t = torch.arange(ctx)[:, None] * inv[None, :]                         # (ctx, d / 2)
        self.register_buffer("pos", torch.cat([t.sin(), t.cos()], dim=1), persistent=False)   # (ctx, d)
        self.blocks = nn.Sequential(*[PreLNBlock(d, heads, 4 * d) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)

    def forward(self, mel):
        x = F.gelu(self.conv2(F.gelu(self.conv1(mel))))                      # (b, d, frames / 2)
        x = x.transpose(1, 2) + self.pos[: x.shape[2]]                        # (b, frames / 2, d)
        return self.ln(self.blocks(x))


def whisper(dtype: torch.dtype, small: bool, device: str):
    """Whisper-base-like audio encoder (conv1d stem x2 + GELU, 6 pre-LN layers, d512, 8 heads); mels (1, 80, 3000)."""
    (mels, d, heads, layers), batch, frames = ((16, 32, 2, 2), 2, 32) if small else ((80, 512, 8, 6), 1, 3000)
    model = WhisperEncoder(mels, d, heads, layers, ctx=frames // 2)
    return _finish(model, (torch.randn(batch, mels, frames),), dtype, device)   # -> (1, 1500, 512)


# ---- convnext: depthwise 7x7 + LayerNorm + GELU MLP --------------------------------------------

class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of (b, c, h, w), through a channels-last permute (timm's)."""

    def forward(self, x):
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNeXtBlock(nn.Module):
    """x + gamma * pw2(gelu(pw1(LN(dw7x7(x))))), the pointwise layers as Linear on channels-last."""

    def __init__(self, c: int):
        super().__init__()
        self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.ln, self.pw1, self.pw2 = nn.LayerNorm(c, eps=1e-6), nn.Linear(c, 4 * c), nn.Linear(4 * c, c)
        # layer scale: trained ConvNeXts hold gammas far from the 1e-6 init; a tiny one would make
        # each block nearly the identity (and a wrong kernel unnoticed)
        self.gamma = nn.Parameter(torch.empty(c).uniform_(0.05, 0.3))

    def forward(self, x):                                                     # (b, c, h, w)
        y = self.dw(x).permute(0, 2, 3, 1)                                    # (b, h, w, c)
        y = self.gamma * self.pw2(F.gelu(self.pw1(self.ln(y))))
        return x + y.permute(0, 3, 1, 2)


def _convnext(dims, depths, classes: int) -> nn.Sequential:
    """Stem 4x4/4 conv + LN, stages of blocks with LN + 2x2/2 conv downsampling between them,
    global average pool, LN, linear head."""
    layers, cin = [nn.Conv2d(3, dims[0], 4, stride=4), LayerNorm2d(dims[0], eps=1e-6)], dims[0]
    for i, (c, n) in enumerate(zip(dims, depths)):
        if i:
            layers += [LayerNorm2d(cin, eps=1e-6), nn.Conv2d(cin, c, 2, stride=2)]
        layers += [ConvNeXtBlock(c) for _ in range(n)]
        cin = c
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.LayerNorm(cin, eps=1e-6),
                         nn.Linear(cin, classes))


def convnext(dtype: torch.dtype, small: bool, device: str):
    """ConvNeXt-tiny-like (dw7x7 + LN + GELU MLP, [3, 3, 9, 3] x [96 .. 768]), channels-last; images (16, 3, 224, 224)."""
    (dims, depths, classes), batch, size = ((((8, 16, 32, 64), (1, 1, 1, 1), 10), 2, 32) if small
                                            else (((96, 192, 384, 768), (3, 3, 9, 3), 1000), 16, 224))
    model = _convnext(dims, depths, classes)
    return _finish(model, (torch.randn(batch, 3, size, size),), dtype, device, channels_last=True)   # -> (16, 1000)


# ---- mobilenetv3: inverted residuals + squeeze-excite + hardswish ------------------------------

def _div8(v: float) -> int:
    """torchvision's _make_divisible(v, 8): round to a multiple of 8, never below 90% of v."""
    n = max(8, int(v + 4) // 8 * 8)
    return n + 8 if n < 0.9 * v else n


def _conv_bn_act(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1, act=nn.Hardswish):
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(cout), act() if act else nn.Identity())


class SqueezeExcite(nn.Module):
    """x * hardsigmoid(fc2(relu(fc1(avgpool(x))))), the FCs as 1x1 convs."""

    def __init__(self, c: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(c, _div8(c / 4), 1), nn.Conv2d(_div8(c / 4), c, 1)

    def forward(self, x):
        return x * F.hardsigmoid(self.fc2(F.relu(self.fc1(F.adaptive_avg_pool2d(x, 1)))))


class InvertedResidual(nn.Module):
    """1x1 expand, kxk depthwise (strided), [SE], 1x1 project (no activation); residual where the
    shape is kept."""

    def __init__(self, cin: int, k: int, exp: int, cout: int, se: bool, act, stride: int):
        super().__init__()
        layers = [_conv_bn_act(cin, exp, 1, act=act)] if exp != cin else []
        layers += [_conv_bn_act(exp, exp, k, stride, groups=exp, act=act)]
        layers += [SqueezeExcite(exp)] if se else []
        self.body = nn.Sequential(*layers, _conv_bn_act(exp, cout, 1, act=None))
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.body(x) if self.residual else self.body(x)


RE, HS = nn.ReLU, nn.Hardswish
# MobileNetV3-Large's bnecks: (kernel, expand, out, SE, activation, stride)
MBV3_LARGE = [(3, 16, 16, False, RE, 1), (3, 64, 24, False, RE, 2), (3, 72, 24, False, RE, 1),
              (5, 72, 40, True, RE, 2), (5, 120, 40, True, RE, 1), (5, 120, 40, True, RE, 1),
              (3, 240, 80, False, HS, 2), (3, 200, 80, False, HS, 1), (3, 184, 80, False, HS, 1),
              (3, 184, 80, False, HS, 1), (3, 480, 112, True, HS, 1), (3, 672, 112, True, HS, 1),
              (5, 672, 160, True, HS, 2), (5, 960, 160, True, HS, 1), (5, 960, 160, True, HS, 1)]
MBV3_TINY = [(3, 16, 16, True, RE, 2), (3, 32, 16, False, RE, 1), (5, 48, 24, True, HS, 2), (3, 64, 24, True, HS, 1)]


def _mobilenetv3(table, last: int, head: int, classes: int) -> nn.Sequential:
    """3x3/2 stem (16, hardswish), the bneck table, 1x1 conv to 6x the last width, pool,
    linear + hardswish, linear head (dropout omitted: eval)."""
    layers, cin = [_conv_bn_act(3, 16, 3, 2)], 16
    for k, exp, cout, se, act, stride in table:
        layers.append(InvertedResidual(cin, k, exp, cout, se, act, stride))
        cin = cout
    return nn.Sequential(*layers, _conv_bn_act(cin, last, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(last, head), nn.Hardswish(), nn.Linear(head, classes))


def mobilenetv3(dtype: torch.dtype, small: bool, device: str):
    """MobileNetV3-Large-like (inverted residuals, SE, hardswish, 15 bnecks), channels-last; images (32, 3, 224, 224)."""
    (table, last, head, classes), batch, size = (((MBV3_TINY, 96, 128, 10), 2, 32) if small
                                                 else ((MBV3_LARGE, 960, 1280, 1000), 32, 224))
    model = _randomize_bn(_mobilenetv3(table, last, head, classes))
    return _finish(model, (torch.randn(batch, 3, size, size),), dtype, device, channels_last=True)   # -> (32, 1000)


# ---- swin: attention within windows -------------------------------------------------------------

class WindowAttention(nn.Module):
    """MHA within non-overlapping w x w windows of (b, h, w, c), plus Swin's learned relative
    position bias ((2w - 1)^2 x heads table). Shifted windows are not modelled."""

    def __init__(self, c: int, heads: int, window: int):
        super().__init__()
        self.heads, self.w = heads, window
        self.qkv, self.proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.table = nn.Parameter(torch.randn((2 * window - 1) ** 2, heads) * 0.02)
        ys, xs = torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")
        pos = torch.stack([ys.flatten(), xs.flatten()])                        # (2, w*w)
        rel = (pos[:, :, None] - pos[:, None, :]) + (window - 1)              # (2, w*w, w*w), >= 0
        self.register_buffer("index", rel[0] * (2 * window - 1) + rel[1], persistent=False)

    def forward(self, x):                                                     # (b, H, W, c)
        b, H, W, c, w = *x.shape, self.w
        win = (x.view(b, H // w, w, W // w, w, c).permute(0, 1, 3, 2, 4, 5)
               .reshape(-1, w * w, c))                                        # (b * windows, w*w, c)
        q, k, v = (t.view(-1, w * w, self.heads, c // self.heads).transpose(1, 2)   # (bw, h, w*w, hd)
                   for t in self.qkv(win).chunk(3, dim=-1))
        bias = self.table[self.index].permute(2, 0, 1)[None]                  # (1, h, w*w, w*w)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        y = self.proj(y.transpose(1, 2).reshape(-1, w * w, c))
        return (y.view(b, H // w, W // w, w, w, c).permute(0, 1, 3, 2, 4, 5)
                .reshape(b, H, W, c))                                         # windows merged back


class SwinBlock(nn.Module):
    def __init__(self, c: int, heads: int, window: int):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(c), WindowAttention(c, heads, window)
        self.ln2, self.mlp = nn.LayerNorm(c), nn.Sequential(nn.Linear(c, 4 * c), nn.GELU(), nn.Linear(4 * c, c))

    def forward(self, x):                                                     # (b, H, W, c)
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class PatchMerging(nn.Module):
    """(b, H, W, c) -> (b, H/2, W/2, 2c): concat each 2x2 neighbourhood, LN, linear 4c -> 2c."""

    def __init__(self, c: int):
        super().__init__()
        self.ln, self.reduce = nn.LayerNorm(4 * c), nn.Linear(4 * c, 2 * c, bias=False)

    def forward(self, x):
        x = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], dim=-1)
        return self.reduce(self.ln(x))


class Swin(nn.Module):
    def __init__(self, c: int, depths, heads, window: int, size: int, classes: int):
        super().__init__()
        self.embed, self.embed_ln = nn.Conv2d(3, c, 4, stride=4), nn.LayerNorm(c)
        stages, res = [], size // 4
        for i, (n, h) in enumerate(zip(depths, heads)):
            if i:
                stages.append(PatchMerging(c))
                c, res = 2 * c, res // 2
            stages += [SwinBlock(c, h, min(window, res)) for _ in range(n)]   # last stage: one window
        self.stages, self.ln, self.head = nn.Sequential(*stages), nn.LayerNorm(c), nn.Linear(c, classes)

    def forward(self, img):
        x = self.embed_ln(self.embed(img).permute(0, 2, 3, 1))                # (b, H/4, W/4, c)
        return self.head(self.ln(self.stages(x)).mean(dim=(1, 2)))            # (b, classes)


def swin(dtype: torch.dtype, small: bool, device: str):
    """Swin-T-like windowed ViT (7x7 windows, no shift, rel-pos bias, [2, 2, 6, 2], c96); images (16, 3, 224, 224)."""
    (c, depths, heads, window, classes), batch, size = (((16, (1, 1), (2, 4), 4, 10), 2, 32) if small
                                                        else ((96, (2, 2, 6, 2), (3, 6, 12, 24), 7, 1000), 16, 224))
    model = Swin(c, depths, heads, window, size, classes)
    return _finish(model, (torch.randn(batch, 3, size, size),), dtype, device)    # -> (16, 1000)


# ---- unet: diffusion UNet (GroupNorm + SiLU ResBlocks, timestep embedding, attention) ---------

class UResBlock(nn.Module):
    """conv(silu(GN(x))) + temb projection, conv(silu(GN(.))), + 1x1 shortcut where widths differ."""

    def __init__(self, cin: int, cout: int, temb: int, groups: int):
        super().__init__()
        self.n1, self.c1 = nn.GroupNorm(groups, cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.t = nn.Linear(temb, cout)
        self.n2, self.c2 = nn.GroupNorm(groups, cout), nn.Conv2d(cout, cout, 3, padding=1)
        self.short = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x, temb):
        h = self.c1(F.silu(self.n1(x))) + self.t(F.silu(temb))[:, :, None, None]
        return self.short(x) + self.c2(F.silu(self.n2(h)))


class UAttn(nn.Module):
    """Self-attention over the h*w positions of (b, c, h, w): GN, MHA (head dim 64), residual."""

    def __init__(self, c: int, groups: int):
        super().__init__()
        self.norm, self.attn = nn.GroupNorm(groups, c), MHA(c, max(1, c // 64))

    def forward(self, x):
        b, c, h, w = x.shape
        y = self.attn(self.norm(x).flatten(2).transpose(1, 2))                # (b, h*w, c)
        return x + y.transpose(1, 2).reshape(b, c, h, w)


class UNet(nn.Module):
    """latents (b, 4, H, W), timesteps (b,) int -> predicted noise (b, 4, H, W): levels of widths
    ch (a ResBlock each, attention on all but the first, 3x3/2 conv down), a mid ResBlock + attn +
    ResBlock, and the mirror up path (skip concat, ResBlock, attention, nearest x2 + conv up)."""

    def __init__(self, ch, groups: int):
        super().__init__()
        c0, temb = ch[0], 4 * ch[0]
        self.c0 = c0
        self.temb = nn.Sequential(nn.Linear(c0, temb), nn.SiLU(), nn.Linear(temb, temb))
        self.conv_in = nn.Conv2d(4, c0, 3, padding=1)
        self.down, cin = nn.ModuleList(), c0
        for i, c in enumerate(ch):
            self.down.append(nn.ModuleList([UResBlock(cin, c, temb, groups),
                                            UAttn(c, groups) if i else nn.Identity(),
                                            nn.Conv2d(c, c, 3, 2, 1) if i < len(ch) - 1 else nn.Identity()]))
            cin = c
        self.mid = nn.ModuleList([UResBlock(cin, cin, temb, groups), UAttn(cin, groups),
                                  UResBlock(cin, cin, temb, groups)])
        self.up = nn.ModuleList()
        for i, c in reversed(list(enumerate(ch))):
            self.up.append(nn.ModuleList([UResBlock(cin + c, c, temb, groups),
                                          UAttn(c, groups) if i else nn.Identity(),
                                          nn.Conv2d(c, c, 3, padding=1) if i else nn.Identity()]))
            cin = c
        self.out = nn.Sequential(nn.GroupNorm(groups, c0), nn.SiLU(), nn.Conv2d(c0, 4, 3, padding=1))

    def forward(self, x, t):
        half = self.c0 // 2                                                   # sinusoidal timestep embedding
        freqs = torch.exp(-math.log(10000) * torch.arange(half, device=t.device) / half)
        ang = t.float()[:, None] * freqs[None]                                # (b, c0 / 2)
        temb = self.temb(torch.cat([ang.cos(), ang.sin()], dim=1).to(x.dtype))   # (b, 4 c0)
        h, skips = self.conv_in(x), []                                        # (b, c0, H, W)
        for res, attn, down in self.down:
            h = attn(res(h, temb))
            skips.append(h)                                                   # (b, c_i, H / 2^i, W / 2^i)
            h = down(h)
        h = self.mid[2](self.mid[1](self.mid[0](h, temb)), temb)
        for res, attn, up in self.up:
            h = attn(res(torch.cat([h, skips.pop()], dim=1), temb))
            if not isinstance(up, nn.Identity):
                h = up(F.interpolate(h, scale_factor=2.0, mode="nearest"))
        return self.out(h)


def unet(dtype: torch.dtype, small: bool, device: str):
    """SD-style diffusion UNet (GN + SiLU ResBlocks, t-emb, attention, 128/256/512); latents (8, 4, 64, 64) + t (8,)."""
    (ch, groups), batch, size = (((8, 16, 32), 4), 2, 16) if small else (((128, 256, 512), 32), 8, 64)
    model = UNet(ch, groups)
    inputs = (torch.randn(batch, 4, size, size), torch.randint(0, 1000, (batch,)))   # t: int64
    return _finish(model, inputs, dtype, device)                              # -> (8, 4, 64, 64)


# ---- vit: ViT-B/16 -----------------------------------------------------------------------------

class ViT(nn.Module):
    """16x16 patch conv, class token, learned positions, pre-LN blocks, LN, head on the class token."""

    def __init__(self, size: int, patch: int, d: int, heads: int, layers: int, classes: int):
        super().__init__()
        self.embed = nn.Conv2d(3, d, patch, stride=patch)
        self.cls = nn.Parameter(torch.randn(1, 1, d) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, (size // patch) ** 2 + 1, d) * 0.02)
        self.blocks = nn.Sequential(*[PreLNBlock(d, heads, 4 * d, eps=1e-6) for _ in range(layers)])
        self.ln, self.head = nn.LayerNorm(d, eps=1e-6), nn.Linear(d, classes)

    def forward(self, img):
        x = self.embed(img).flatten(2).transpose(1, 2)                        # (b, 196, d)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos   # (b, 197, d)
        return self.head(self.ln(self.blocks(x))[:, 0])                       # (b, classes)


def vit(dtype: torch.dtype, small: bool, device: str):
    """ViT-B/16 (12 pre-LN layers, d768, 12 heads, MLP 3072, 197 tokens); images (16, 3, 224, 224)."""
    cfg, batch = ((32, 8, 32, 2, 2, 10), 2) if small else ((224, 16, 768, 12, 12, 1000), 16)
    model = ViT(*cfg)
    return _finish(model, (torch.randn(batch, 3, cfg[0], cfg[0]),), dtype, device)   # -> (16, 1000)


# ---- the table ---------------------------------------------------------------------------------

MODELS: dict[str, Callable] = {f.__name__: f for f in (
    llama, gpt2, bert, t5, whisper, resnet18, resnet50, mobilenetv3, convnext, swin, vit, mlp_mixer, unet)}
ROWS = [f"{m}:{d}" for m in MODELS for d in ("fp32", "bf16")]


def describe(name: str) -> str:
    """The first line of a row's (or family's) model function's docstring."""
    return (MODELS[name.split(":")[0]].__doc__ or "").strip().splitlines()[0]


def make(name: str, small: bool = False, device: str = "cuda"):
    """Row `name` ("vit:bf16"): (model, example_inputs), seeded (the same weights and inputs every
    run), eval mode, on `device` in the row's dtype (integer inputs stay integer)."""
    if name not in ROWS:
        raise KeyError(f"unknown row {name!r}; known: {', '.join(ROWS)}")
    family, dtype = name.split(":")
    torch.manual_seed(0)
    return MODELS[family](DTYPES[dtype], small, device)
