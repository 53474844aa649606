"""conv3x3 -> ReLU -> BatchNorm (inference): the batch norm after the nonlinearity, so it does not
fold into the conv; it runs in the epilogue kernel, [32, 64, 56, 56] (bf16)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPE = torch.bfloat16


class Model(nn.Module):
    def forward(self, x, w, gamma, beta, mean, var):
        y = F.relu(F.conv2d(x, w, None, 1, 1))
        return F.batch_norm(y, mean, var, gamma, beta, False, 0.1, 1e-5)


def get_inputs():
    return [torch.randn(32, 64, 56, 56, dtype=DTYPE), torch.randn(64, 64, 3, 3, dtype=DTYPE) * 0.05,
            torch.randn(64, dtype=DTYPE), torch.randn(64, dtype=DTYPE), torch.randn(64, dtype=DTYPE),
            torch.rand(64, dtype=DTYPE) + 0.5]


def get_init_inputs():
    return []
