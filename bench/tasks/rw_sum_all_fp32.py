"""A full reduction to a scalar: sum of [2048, 1024] (fp32)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPE = torch.float32


class Model(nn.Module):
    def forward(self, x):
        return x.sum()


def get_inputs():
    return [torch.randn(2048, 1024, dtype=DTYPE)]


def get_init_inputs():
    return []
