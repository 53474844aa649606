"""Llama-size attention heads: SDPA without a mask, head dim 128, B=4 H=16 L=S=1024 (fp32)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPE = torch.float32


class Model(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v)


def get_inputs():
    return [torch.randn(4, 16, 1024, 128, dtype=DTYPE) for _ in range(3)]


def get_init_inputs():
    return []
