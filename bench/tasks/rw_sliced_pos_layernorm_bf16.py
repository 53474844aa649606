"""GPT-style embedding sum before the first layer_norm: x + pos[:, :T] with a learned position
table longer than the sequence, x [8, 1024, 768], pos [1, 2048, 768] (the row kernel reads the
slice in place) (bf16)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPE = torch.bfloat16


class Model(nn.Module):
    def forward(self, x, pos, w, b):
        return F.layer_norm(x + pos[:, :x.shape[1]], (768,), w, b)


def get_inputs():
    return [torch.randn(8, 1024, 768, dtype=DTYPE), torch.randn(1, 2048, 768, dtype=DTYPE),
            torch.randn(768, dtype=DTYPE), torch.randn(768, dtype=DTYPE)]


def get_init_inputs():
    return []
