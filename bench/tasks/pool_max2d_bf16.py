"""ResNet stem max pool: max_pool2d k=3, stride 2, pad 1, [32, 64, 112, 112] -> [32, 64, 56, 56] (bf16)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPE = torch.bfloat16


class Model(nn.Module):
    def forward(self, x):
        return F.max_pool2d(x, 3, 2, 1)


def get_inputs():
    return [torch.randn(32, 64, 112, 112, dtype=DTYPE)]


def get_init_inputs():
    return []
