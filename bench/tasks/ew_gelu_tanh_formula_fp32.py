"""GELU (tanh) spelled out as in minGPT / older BERT code: 0.5 * x * (1 + tanh(sqrt(2/pi) *
(x + 0.044715 * x^3))), [8, 512, 3072] (fp32): one region, one kernel."""
import math

import torch
import torch.nn as nn

DTYPE = torch.float32


class Model(nn.Module):
    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def get_inputs():
    return [torch.randn(8, 512, 3072, dtype=DTYPE)]


def get_init_inputs():
    return []
