# Red-team task: y = gelu(x) * w + b, fp32, x [4096, 4096] with a dynamic batch dim (0).
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def forward(self, x, w, b):
        return F.gelu(x) * w + b


def get_inputs():
    return [torch.randn(4096, 4096), torch.randn(4096), torch.randn(4096)]


def get_init_inputs():
    return []
