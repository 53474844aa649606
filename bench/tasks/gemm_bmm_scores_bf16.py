"""Attention scores as a batched matmul with a transposed operand: q [96, 512, 64] @ k^T * 1/sqrt(64)
(GPT-2 small, 8 x 12 heads; bf16)."""
import torch
import torch.nn as nn

DTYPE = torch.bfloat16


class Model(nn.Module):
    def forward(self, q, k):
        return torch.bmm(q, k.transpose(1, 2)) * 0.125


def get_inputs():
    return [torch.randn(96, 512, 64, dtype=DTYPE), torch.randn(96, 512, 64, dtype=DTYPE)]


def get_init_inputs():
    return []
