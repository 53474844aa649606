"""Mean over the last dim with an elementwise prologue: mean(silu(x) * s, -1), [8, 512, 768]."""
import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPE = torch.float32


class Model(nn.Module):
    def forward(self, x, s):
        return (F.silu(x) * s).mean(dim=-1)


def get_inputs():
    return [torch.randn(8, 512, 768, dtype=DTYPE), torch.randn(768, dtype=DTYPE)]


def get_init_inputs():
    return []
