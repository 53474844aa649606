"""Llama v projection with grouped-query attention: linear 4096 -> 1024 + view + transpose to 8 kv
heads, each repeated 4 times (expand + reshape), x [4, 1024, 4096] -> [4, 32, 1024, 128] (fp32):
the repeat is a stride-0 dim of the output's map, written by the store kernel."""
import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPE = torch.float32


class Model(nn.Module):
    def forward(self, x, w):
        B, T, _ = x.shape
        v = F.linear(x, w).view(B, T, 8, 128).transpose(1, 2)
        return v[:, :, None].expand(B, 8, 4, T, 128).reshape(B, 32, T, 128)


def get_inputs():
    return [torch.randn(4, 1024, 4096, dtype=DTYPE), torch.randn(1024, 4096, dtype=DTYPE) * 0.02]


def get_init_inputs():
    return []
