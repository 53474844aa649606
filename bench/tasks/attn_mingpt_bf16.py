"""minGPT's hand-written causal attention: q @ k^T * 1/sqrt(d), masked_fill(mask == 0, -inf) with
the block's tril buffer, softmax, eval dropout, @ v; B=8 H=12 T=512 D=64 (bf16). One attention
region (attn_pattern.py), the same flash kernel as SDPA."""
import math

import torch
import torch.nn as nn

DTYPE = torch.bfloat16


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.1)
        self.register_buffer("mask", torch.tril(torch.ones(1024, 1024, dtype=DTYPE)).view(1, 1, 1024, 1024))

    def forward(self, q, k, v):
        T = q.size(-2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf"))
        att = self.drop(torch.softmax(att, dim=-1))
        return att @ v


def get_inputs():
    return [torch.randn(8, 12, 512, 64, dtype=DTYPE) for _ in range(3)]


def get_init_inputs():
    return []
