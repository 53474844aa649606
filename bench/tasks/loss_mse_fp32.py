"""Reconstruction loss, F.mse_loss (mean over all elements: a full reduction) of [16, 3, 256, 256] predictions against targets (fp32)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPE = torch.float32


class Model(nn.Module):
    def forward(self, pred, target):
        return F.mse_loss(pred, target)


def get_inputs():
    return [torch.randn(16, 3, 256, 256, dtype=DTYPE), torch.randn(16, 3, 256, 256, dtype=DTYPE)]


def get_init_inputs():
    return []
