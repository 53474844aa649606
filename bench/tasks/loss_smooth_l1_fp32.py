"""Smooth L1 (beta=0.5, mean over all elements) of [16, 64, 64, 64] predictions against targets (fp32)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPE = torch.float32


class Model(nn.Module):
    def forward(self, pred, target):
        return F.smooth_l1_loss(pred, target, beta=0.5)


def get_inputs():
    return [torch.randn(16, 64, 64, 64, dtype=DTYPE), torch.randn(16, 64, 64, 64, dtype=DTYPE)]


def get_init_inputs():
    return []
