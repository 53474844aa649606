"""U-Net decoder up-convolution: conv_transpose2d 256 -> 128 channels, k=2, stride 2, + bias + ReLU, [16, 256, 32, 32] -> [16, 128, 64, 64] (bf16)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPE = torch.bfloat16


class Model(nn.Module):
    def forward(self, x, w, b):
        return F.relu(F.conv_transpose2d(x, w, b, 2))


def get_inputs():
    return [torch.randn(16, 256, 32, 32, dtype=DTYPE), torch.randn(256, 128, 2, 2, dtype=DTYPE) * 0.06,
            torch.randn(128, dtype=DTYPE) * 0.1]


def get_init_inputs():
    return []
