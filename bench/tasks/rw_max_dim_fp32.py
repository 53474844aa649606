"""max over the last dim with its indices (values and int64 indices), [8192, 1024] (fp32)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPE = torch.float32


class Model(nn.Module):
    def forward(self, x):
        v, i = x.max(-1)
        return v, i


def get_inputs():
    return [torch.randn(8192, 1024, dtype=DTYPE)]


def get_init_inputs():
    return []
