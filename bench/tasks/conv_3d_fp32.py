"""R3D-18 video block: conv3d 3x3x3 64 -> 64 channels, pad 1, + BatchNorm (inference) + ReLU, [4, 64, 8, 56, 56] (fp32)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPE = torch.float32


class Model(nn.Module):
    def forward(self, x, w, gamma, beta, mean, var):
        y = F.conv3d(x, w, None, 1, 1)
        return F.relu(F.batch_norm(y, mean, var, gamma, beta, False, 0.1, 1e-5))


def get_inputs():
    return [torch.randn(4, 64, 8, 56, 56, dtype=DTYPE), torch.randn(64, 64, 3, 3, 3, dtype=DTYPE) * 0.025,
            torch.randn(64, dtype=DTYPE), torch.randn(64, dtype=DTYPE), torch.randn(64, dtype=DTYPE),
            torch.rand(64, dtype=DTYPE) + 0.5]


def get_init_inputs():
    return []
