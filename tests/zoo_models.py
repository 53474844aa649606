"""A zoo of real architectures built from configs: tiny sizes, random weights, eval mode, no
downloads. Each builder returns (model, example_inputs); it raises ImportError when its library
does not import (the zoo test skips that model).

    >>> model, inputs = ZOO["gpt2"]()
"""
from __future__ import annotations

import math

import torch
from torch import nn


class LogitsOnly(nn.Module):
    """One tensor out of an HF model (bench/models.py's pattern): `field` of its output."""

    def __init__(self, hf: nn.Module, field: str = "logits"):
        super().__init__()
        self.hf, self.field = hf, field

    def forward(self, *args, **kwargs):
        if "use_cache" in self.hf.forward.__code__.co_varnames:
            kwargs["use_cache"] = False
        return getattr(self.hf(*args, **kwargs), self.field)


class T5Logits(nn.Module):
    """T5 needs decoder inputs: forward(input_ids, decoder_input_ids) -> logits."""

    def __init__(self, hf: nn.Module):
        super().__init__()
        self.hf = hf

    def forward(self, ids, dec):
        return self.hf(input_ids=ids, decoder_input_ids=dec, use_cache=False).logits


def _eval(model: nn.Module, *inputs):
    return model.eval(), inputs


# ---- torchvision ---------------------------------------------------------------------------

def resnet18():
    from torchvision.models import resnet18 as build
    torch.manual_seed(0)
    return _eval(build(weights=None, num_classes=10), torch.randn(1, 3, 32, 32))


def mobilenet_v2():
    from torchvision.models import mobilenet_v2 as build
    torch.manual_seed(0)
    return _eval(build(weights=None, num_classes=10, width_mult=0.25), torch.randn(1, 3, 32, 32))


def efficientnet_b0():
    from torchvision.models import efficientnet_b0 as build
    torch.manual_seed(0)
    return _eval(build(weights=None, num_classes=10), torch.randn(1, 3, 32, 32))


def vit():
    from torchvision.models import VisionTransformer
    torch.manual_seed(0)
    m = VisionTransformer(image_size=32, patch_size=16, num_layers=1, num_heads=2, hidden_dim=32,
                          mlp_dim=64, num_classes=10)
    return _eval(m, torch.randn(1, 3, 32, 32))


# ---- transformers ---------------------------------------------------------------------------

SEQ = 16


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=128, n_positions=64, n_embd=32, n_layer=2, n_head=2,
                     bos_token_id=0, eos_token_id=0, attn_implementation="sdpa")
    return _eval(LogitsOnly(GPT2LMHeadModel(cfg)), torch.randint(0, 128, (1, SEQ)))


def bert():
    from transformers import BertConfig, BertModel
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=64, attn_implementation="sdpa")
    return _eval(LogitsOnly(BertModel(cfg, add_pooling_layer=False), "last_hidden_state"),
                 torch.randint(0, 128, (1, SEQ)))


def llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      attn_implementation="sdpa")
    return _eval(LogitsOnly(LlamaForCausalLM(cfg)), torch.randint(0, 128, (1, SEQ)))


def t5():
    from transformers import T5Config, T5ForConditionalGeneration
    torch.manual_seed(0)
    cfg = T5Config(vocab_size=128, d_model=32, d_kv=16, d_ff=64, num_layers=1,
                   num_decoder_layers=1, num_heads=2, decoder_start_token_id=0)
    return _eval(T5Logits(T5ForConditionalGeneration(cfg)), torch.randint(0, 128, (1, SEQ)),
                 torch.randint(0, 128, (1, 8)))


def whisper_encoder():
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder
    torch.manual_seed(0)
    cfg = WhisperConfig(vocab_size=128, num_mel_bins=16, d_model=32, encoder_layers=1,
                        encoder_attention_heads=2, decoder_layers=1, decoder_attention_heads=2,
                        encoder_ffn_dim=64, decoder_ffn_dim=64, max_source_positions=32,
                        max_target_positions=32, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                        decoder_start_token_id=1, attn_implementation="sdpa")
    enc = WhisperEncoder(cfg)   # the encoder alone, as WhisperModel(cfg).encoder is
    # the encoder's two convs (the second stride 2) take 2 * max_source_positions frames
    return _eval(LogitsOnly(enc, "last_hidden_state"), torch.randn(1, 16, 64))


# ---- hand-written ---------------------------------------------------------------------------

class MinGPTAttention(nn.Module):
    """minGPT's attention written out: matmul, scale, causal masked_fill, softmax, dropout, matmul."""

    def __init__(self, d: int, heads: int, block: int):
        super().__init__()
        self.qkv, self.proj, self.heads = nn.Linear(d, 3 * d), nn.Linear(d, d), heads
        self.drop = nn.Dropout(0.1)
        self.register_buffer("mask", torch.tril(torch.ones(block, block)).view(1, 1, block, block))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf"))
        att = self.drop(torch.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)


class MinGPTBlock(nn.Module):
    def __init__(self, d: int, heads: int, block: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = MinGPTAttention(d, heads, block)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d), nn.Dropout(0.1))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class MinGPT(nn.Module):
    def __init__(self, vocab: int = 128, d: int = 32, heads: int = 2, layers: int = 2, block: int = 32):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Parameter(torch.zeros(1, block, d))
        self.blocks = nn.Sequential(*[MinGPTBlock(d, heads, block) for _ in range(layers)])
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos[:, :idx.shape[1]]
        return self.head(self.ln(self.blocks(x)))


def mingpt():
    torch.manual_seed(0)
    return _eval(MinGPT(), torch.randint(0, 128, (1, SEQ)))


ZOO = {f.__name__: f for f in (resnet18, mobilenet_v2, efficientnet_b0, vit, gpt2, bert, llama,
                               t5, whisper_encoder, mingpt)}
