"""InstanceNorm2d(64, affine=True) on [16, 64, 56, 56] (eval: instance statistics) (fp32)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPE = torch.float32


class Model(nn.Module):
    def forward(self, x, w, b):
        return F.instance_norm(x, None, None, w, b, True, 0.1, 1e-5)


def get_inputs():
    return [torch.randn(16, 64, 56, 56, dtype=DTYPE), torch.randn(64, dtype=DTYPE),
            torch.randn(64, dtype=DTYPE)]


def get_init_inputs():
    return []
