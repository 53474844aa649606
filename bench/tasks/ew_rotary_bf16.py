"""Llama rotary embedding on q heads: q * cos + cat(-q2, q1) * sin, q [4, 32, 1024, 128], cos / sin
[4, 1, 1024, 128] (bf16): the cat is index math in the elementwise kernel."""
import torch
import torch.nn as nn

DTYPE = torch.bfloat16


class Model(nn.Module):
    def forward(self, q, cos, sin):
        h = q.shape[-1] // 2
        return q * cos + torch.cat((-q[..., h:], q[..., :h]), dim=-1) * sin


def get_inputs():
    return [torch.randn(4, 32, 1024, 128, dtype=DTYPE), torch.randn(4, 1, 1024, 128, dtype=DTYPE),
            torch.randn(4, 1, 1024, 128, dtype=DTYPE)]


def get_init_inputs():
    return []
