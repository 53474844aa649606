# Red-team task: row softmax, fp32, x [4096, 4096] with a dynamic batch dim (0).
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)


def get_inputs():
    return [torch.randn(4096, 4096)]


def get_init_inputs():
    return []
