"""Unbiased variance over the middle dim of [64, 512, 1024], keepdim (fp32)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPE = torch.float32


class Model(nn.Module):
    def forward(self, x):
        return x.var(1, keepdim=True)


def get_inputs():
    return [torch.randn(64, 512, 1024, dtype=DTYPE)]


def get_init_inputs():
    return []
