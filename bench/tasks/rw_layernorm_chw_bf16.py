"""LayerNorm([64, 28, 28]) on [32, 64, 28, 28]: a row of three trailing dims (bf16)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPE = torch.bfloat16


class Model(nn.Module):
    def forward(self, x, w, b):
        return F.layer_norm(x, (64, 28, 28), w, b, 1e-5)


def get_inputs():
    return [torch.randn(32, 64, 28, 28, dtype=DTYPE), torch.randn(64, 28, 28, dtype=DTYPE),
            torch.randn(64, 28, 28, dtype=DTYPE)]


def get_init_inputs():
    return []
