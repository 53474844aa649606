"""Cosine similarity along dim=1 of [4096, 768] embedding pairs (eps=1e-8), one value per row (bf16)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPE = torch.bfloat16


class Model(nn.Module):
    def forward(self, a, b):
        return F.cosine_similarity(a, b, dim=1)


def get_inputs():
    return [torch.randn(4096, 768, dtype=DTYPE), torch.randn(4096, 768, dtype=DTYPE)]


def get_init_inputs():
    return []
