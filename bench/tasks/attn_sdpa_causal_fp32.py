"""GPT-2-size causal self-attention: SDPA, is_causal, B=8 H=12 L=S=512 D=64 (fp32)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPE = torch.float32


class Model(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def get_inputs():
    return [torch.randn(8, 12, 512, 64, dtype=DTYPE) for _ in range(3)]


def get_init_inputs():
    return []
