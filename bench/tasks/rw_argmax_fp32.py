"""Greedy decoding: argmax over a 32000-wide vocabulary, [4096, 32000] (int64 out) (fp32)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPE = torch.float32


class Model(nn.Module):
    def forward(self, x):
        return x.argmax(-1)


def get_inputs():
    return [torch.randn(4096, 32000, dtype=DTYPE)]


def get_init_inputs():
    return []
