"""Whisper encoder's first conv: conv1d 80 -> 384 channels, k=3, pad 1, + bias + GELU, [8, 80, 3000] (bf16)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPE = torch.bfloat16


class Model(nn.Module):
    def forward(self, x, w, b):
        return F.gelu(F.conv1d(x, w, b, 1, 1))


def get_inputs():
    return [torch.randn(8, 80, 3000, dtype=DTYPE), torch.randn(384, 80, 3, dtype=DTYPE) * 0.06,
            torch.randn(384, dtype=DTYPE) * 0.1]


def get_init_inputs():
    return []
