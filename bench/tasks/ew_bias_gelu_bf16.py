"""GPT-2 MLP activation: bias add + GELU (tanh), [8, 512, 3072] (bf16)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPE = torch.bfloat16


class Model(nn.Module):
    def forward(self, x, b):
        return F.gelu(x + b, approximate="tanh")


def get_inputs():
    return [torch.randn(8, 512, 3072, dtype=DTYPE), torch.randn(3072, dtype=DTYPE)]


def get_init_inputs():
    return []
