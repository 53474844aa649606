"""LM-head log_softmax over a 32000-token vocabulary, [512, 32000] (rows longer than registers: streaming)."""
import torch
import torch.nn as nn

DTYPE = torch.float32


class Model(nn.Module):
    def forward(self, logits):
        return torch.log_softmax(logits, dim=-1)


def get_inputs():
    return [torch.randn(512, 32000, dtype=DTYPE)]


def get_init_inputs():
    return []
