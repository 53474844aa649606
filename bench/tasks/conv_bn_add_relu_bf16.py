"""ResNet-50 bottleneck tail: conv1x1 + BatchNorm (inference) + residual add + ReLU, [32, 256, 56, 56], bf16."""
import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPE = torch.bfloat16


class Model(nn.Module):
    def forward(self, x, w, gamma, beta, mean, var, residual):
        y = F.conv2d(x, w)
        return F.relu(F.batch_norm(y, mean, var, gamma, beta, False, 0.1, 1e-5) + residual)


def get_inputs():
    return [torch.randn(32, 64, 56, 56, dtype=DTYPE), torch.randn(256, 64, 1, 1, dtype=DTYPE) * 0.1,
            torch.randn(256, dtype=DTYPE), torch.randn(256, dtype=DTYPE), torch.randn(256, dtype=DTYPE),
            torch.rand(256, dtype=DTYPE) + 0.5, torch.randn(32, 256, 56, 56, dtype=DTYPE)]


def get_init_inputs():
    return []
