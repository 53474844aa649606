"""A BERT-style encoder: post-LN blocks, bidirectional attention with a padding mask, erf GELU.

    $ torch-htam plan examples/bert_encoder.py
    >>> model, inputs = get_model()
"""
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class BertConfig:
    n_layer: int = 2
    n_head: int = 4
    hidden: int = 64
    intermediate: int = 256
    vocab_size: int = 128
    max_pos: int = 32
    dropout: float = 0.1
    eps: float = 1e-12


class SelfAttention(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.n_head, self.d = cfg.n_head, cfg.hidden // cfg.n_head
        self.query = nn.Linear(cfg.hidden, cfg.hidden)
        self.key = nn.Linear(cfg.hidden, cfg.hidden)
        self.value = nn.Linear(cfg.hidden, cfg.hidden)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x, mask_bias):
        B, T, C = x.shape
        # (B, T, C) -> (B, n_head, T, d)
        q, k, v = (p(x).view(B, T, self.n_head, self.d).transpose(1, 2)
                   for p in (self.query, self.key, self.value))
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.d) + mask_bias   # (B, h, T, T)
        probs = self.dropout(F.softmax(scores, dim=-1))
        return (probs @ v).transpose(1, 2).reshape(B, T, C)


class Layer(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.attn = SelfAttention(cfg)
        self.attn_out = nn.Linear(cfg.hidden, cfg.hidden)
        self.ln_attn = nn.LayerNorm(cfg.hidden, eps=cfg.eps)
        self.inter = nn.Linear(cfg.hidden, cfg.intermediate)
        self.out = nn.Linear(cfg.intermediate, cfg.hidden)
        self.ln_out = nn.LayerNorm(cfg.hidden, eps=cfg.eps)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x, mask_bias):
        x = self.ln_attn(x + self.dropout(self.attn_out(self.attn(x, mask_bias))))
        return self.ln_out(x + self.dropout(self.out(F.gelu(self.inter(x)))))


class BertEncoder(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.word = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.pos = nn.Embedding(cfg.max_pos, cfg.hidden)
        self.ln_emb = nn.LayerNorm(cfg.hidden, eps=cfg.eps)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.n_layer))

    def forward(self, input_ids, attention_mask):
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.ln_emb(self.word(input_ids) + self.pos(pos))
        # 1 = attend, 0 = padding -> additive bias (B, 1, 1, T)
        mask_bias = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        for layer in self.layers:
            x = layer(x, mask_bias)
        return x


def get_model(device="cpu", dtype=torch.float32, n_layer=2, batch=2, seq=16):
    """(model.eval(), (input_ids, attention_mask)), both (batch, seq) int64; the last 3 tokens
    of the second sequence are padding."""
    torch.manual_seed(0)
    model = BertEncoder(BertConfig(n_layer=n_layer)).to(device=device, dtype=dtype).eval()
    ids = torch.randint(0, 128, (batch, seq), device=device)
    mask = torch.ones(batch, seq, dtype=torch.int64, device=device)
    mask[-1, -3:] = 0
    return model, (ids, mask)
