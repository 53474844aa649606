"""GPT-2 MLP up-projection: linear + bias + GELU (tanh), x [8, 512, 768] @ W[3072, 768]^T (bf16)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPE = torch.bfloat16


class Model(nn.Module):
    def forward(self, x, w, b):
        return F.gelu(F.linear(x, w, b), approximate="tanh")


def get_inputs():
    return [torch.randn(8, 512, 768, dtype=DTYPE), torch.randn(3072, 768, dtype=DTYPE) * 0.02,
            torch.randn(3072, dtype=DTYPE)]


def get_init_inputs():
    return []
