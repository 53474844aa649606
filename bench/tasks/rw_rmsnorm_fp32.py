"""Llama RMSNorm, [8, 512, 4096] (fp32)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPE = torch.float32


class Model(nn.Module):
    def forward(self, x, w):
        return F.rms_norm(x, (x.shape[-1],), w, 1e-6)


def get_inputs():
    return [torch.randn(8, 512, 4096, dtype=DTYPE), torch.randn(4096, dtype=DTYPE)]


def get_init_inputs():
    return []
