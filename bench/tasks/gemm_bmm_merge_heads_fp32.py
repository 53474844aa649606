"""Attention output: att [96, 512, 512] @ v [96, 512, 64], heads merged back to [8, 512, 768]
(transpose + contiguous + view, GPT-2 small; fp32)."""
import torch
import torch.nn as nn

DTYPE = torch.float32


class Model(nn.Module):
    def forward(self, att, v):
        y = torch.bmm(att, v).view(8, 12, 512, 64)
        return y.transpose(1, 2).contiguous().view(8, 512, 768)


def get_inputs():
    return [torch.softmax(torch.randn(96, 512, 512), -1).to(DTYPE), torch.randn(96, 512, 64, dtype=DTYPE)]


def get_init_inputs():
    return []
