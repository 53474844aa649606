"""MobileNetV2 depthwise conv3x3 (groups = 144) + BatchNorm (inference) + ReLU6, [32, 144, 56, 56] (bf16)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPE = torch.bfloat16


class Model(nn.Module):
    def forward(self, x, w, gamma, beta, mean, var):
        y = F.conv2d(x, w, None, 1, 1, 1, 144)
        return F.relu6(F.batch_norm(y, mean, var, gamma, beta, False, 0.1, 1e-5))


def get_inputs():
    return [torch.randn(32, 144, 56, 56, dtype=DTYPE), torch.randn(144, 1, 3, 3, dtype=DTYPE) * 0.3,
            torch.randn(144, dtype=DTYPE), torch.randn(144, dtype=DTYPE), torch.randn(144, dtype=DTYPE),
            torch.rand(144, dtype=DTYPE) + 0.5]


def get_init_inputs():
    return []
