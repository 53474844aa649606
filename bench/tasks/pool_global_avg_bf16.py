"""ResNet-50 head: global average pool + flatten, [32, 2048, 7, 7] -> [32, 2048] (bf16)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPE = torch.bfloat16


class Model(nn.Module):
    def forward(self, x):
        return torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)


def get_inputs():
    return [torch.randn(32, 2048, 7, 7, dtype=DTYPE)]


def get_init_inputs():
    return []
