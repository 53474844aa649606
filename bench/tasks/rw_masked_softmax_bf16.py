"""MinGPT attention scores: scale + masked_fill(bool causal mask, -inf) + softmax, [16, 12, 256, 256] (bf16)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPE = torch.bfloat16


class Model(nn.Module):
    def forward(self, x, mask):
        return torch.softmax((x * 0.125).masked_fill(mask, float("-inf")), dim=-1)


def get_inputs():
    return [torch.randn(16, 12, 256, 256, dtype=DTYPE),
            torch.ones(256, 256, dtype=torch.bool).triu(1).view(1, 1, 256, 256)]


def get_init_inputs():
    return []
