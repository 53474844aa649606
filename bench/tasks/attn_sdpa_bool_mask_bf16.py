"""BERT-size attention with a padding mask: SDPA, bool mask [8, 1, 1, 512] (True = attend),
B=8 H=12 L=S=512 D=64 (bf16)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPE = torch.bfloat16


class Model(nn.Module):
    def forward(self, q, k, v, keep):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep)


def get_inputs():
    keep = torch.ones(8, 1, 1, 512, dtype=torch.bool)
    keep[:, :, :, 400:] = torch.rand(8, 1, 1, 112) > 0.5     # padded tails, never a whole row
    return [torch.randn(8, 12, 512, 64, dtype=DTYPE) for _ in range(3)] + [keep]


def get_init_inputs():
    return []
