"""ViT-B/16 encoder under nn.MultiheadAttention: layer_norm over [32, 197, 768], then transpose(1, 0)
to [197, 32, 768] (the row kernel stores through the output's permuted strides) (bf16)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPE = torch.bfloat16


class Model(nn.Module):
    def forward(self, x, w, b):
        return F.layer_norm(x, (768,), w, b, 1e-6).transpose(1, 0)


def get_inputs():
    return [torch.randn(32, 197, 768, dtype=DTYPE), torch.randn(768, dtype=DTYPE),
            torch.randn(768, dtype=DTYPE)]


def get_init_inputs():
    return []
