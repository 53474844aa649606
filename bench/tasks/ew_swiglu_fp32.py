"""Llama SwiGLU gate: silu(gate) * up, [8, 512, 2752] (fp32)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPE = torch.float32


class Model(nn.Module):
    def forward(self, gate, up):
        return F.silu(gate) * up


def get_inputs():
    return [torch.randn(8, 512, 2752, dtype=DTYPE), torch.randn(8, 512, 2752, dtype=DTYPE)]


def get_init_inputs():
    return []
