"""Hinge embedding loss (margin 1, mean) of [4096, 1024] distances against +-1 labels (bf16)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPE = torch.bfloat16


class Model(nn.Module):
    def forward(self, x, y):
        return F.hinge_embedding_loss(x, y)


def get_inputs():
    return [torch.randn(4096, 1024, dtype=DTYPE).abs(), torch.randint(0, 2, (4096, 1024)).to(DTYPE) * 2 - 1]


def get_init_inputs():
    return []
