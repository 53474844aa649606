"""Sum over the middle dim of [128, 4096, 64] (strided columns: the column mapping) (bf16)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPE = torch.bfloat16


class Model(nn.Module):
    def forward(self, x):
        return x.sum(1)


def get_inputs():
    return [torch.randn(128, 4096, 64, dtype=DTYPE)]


def get_init_inputs():
    return []
