"""Whisper: layer_norm over the channels of a transposed conv output, [8, 384, 1500] -> [8, 1500, 384] (bf16)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPE = torch.bfloat16


class Model(nn.Module):
    def forward(self, x, w, b):
        return F.layer_norm(x.permute(0, 2, 1), (384,), w, b, 1e-5)


def get_inputs():
    return [torch.randn(8, 384, 1500, dtype=DTYPE), torch.randn(384, dtype=DTYPE),
            torch.randn(384, dtype=DTYPE)]


def get_init_inputs():
    return []
