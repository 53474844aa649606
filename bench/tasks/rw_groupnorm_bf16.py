"""GroupNorm(32, 256) on [16, 256, 32, 32] (a diffusion UNet block's norm) (bf16)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPE = torch.bfloat16


class Model(nn.Module):
    def forward(self, x, w, b):
        return F.group_norm(x, 32, w, b, 1e-5)


def get_inputs():
    return [torch.randn(16, 256, 32, 32, dtype=DTYPE), torch.randn(256, dtype=DTYPE),
            torch.randn(256, dtype=DTYPE)]


def get_init_inputs():
    return []
