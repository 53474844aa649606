"""GPT-2 MLP down-projection + residual: linear(x, W, b) + r, x [8, 512, 3072], W [768, 3072] (fp32)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPE = torch.float32


class Model(nn.Module):
    def forward(self, x, w, b, r):
        return F.linear(x, w, b) + r


def get_inputs():
    return [torch.randn(8, 512, 3072, dtype=DTYPE), torch.randn(768, 3072, dtype=DTYPE) * 0.02,
            torch.randn(768, dtype=DTYPE), torch.randn(8, 512, 768, dtype=DTYPE)]


def get_init_inputs():
    return []
