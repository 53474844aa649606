"""Residual add with a scaled branch (DeepNorm-style): x * 0.5 + y, [8, 512, 768]."""
import torch
import torch.nn as nn

DTYPE = torch.float32


class Model(nn.Module):
    def forward(self, x, y):
        return x * 0.5 + y


def get_inputs():
    return [torch.randn(8, 512, 768, dtype=DTYPE), torch.randn(8, 512, 768, dtype=DTYPE)]


def get_init_inputs():
    return []
