"""Whisper-large encoder after its second conv: GELU output [8, 1280, 1500] permuted to
[8, 1500, 1280] + the positional embedding [1500, 1280] (a strided read of the conv output) (bf16)."""
import torch
import torch.nn as nn

DTYPE = torch.bfloat16


class Model(nn.Module):
    def forward(self, x, pos):
        return x.permute(0, 2, 1) + pos


def get_inputs():
    return [torch.randn(8, 1280, 1500, dtype=DTYPE), torch.randn(1500, 1280, dtype=DTYPE)]


def get_init_inputs():
    return []
