"""MobileNetV3 classifier head: linear + bias + hardswish, x [4096, 960] @ W[1280, 960]^T (fp32).
cuBLASLt adds the bias; hardswish runs in the fused epilogue kernel."""
import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPE = torch.float32


class Model(nn.Module):
    def forward(self, x, w, b):
        return F.hardswish(F.linear(x, w, b))


def get_inputs():
    return [torch.randn(4096, 960, dtype=DTYPE), torch.randn(1280, 960, dtype=DTYPE) * 0.03,
            torch.randn(1280, dtype=DTYPE)]


def get_init_inputs():
    return []
