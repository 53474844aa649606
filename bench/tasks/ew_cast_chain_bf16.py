"""Mixed-precision cast chain: fp32 activations -> bf16, scaled, upcast and added to an fp32 residual, [4096, 4096]."""
import torch
import torch.nn as nn

DTYPE = torch.bfloat16


class Model(nn.Module):
    def forward(self, x, r):
        y = (x.to(DTYPE) * 2.0).float()
        return y + r


def get_inputs():
    return [torch.randn(4096, 4096), torch.randn(4096, 4096)]


def get_init_inputs():
    return []
