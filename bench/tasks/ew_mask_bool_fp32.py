"""Attention mask arithmetic: causal (key index <= query index) and padding (eq) masks combined
into a bool, applied to the scores with masked_fill; both outputs [8, 12, 512, 512] (fp32 scores,
bool mask stored as bytes)."""
import torch
import torch.nn as nn

DTYPE = torch.float32


class Model(nn.Module):
    def forward(self, scores, q_idx, k_idx, pad):
        keep = (k_idx <= q_idx) & (pad == 1)
        return scores.masked_fill(~keep, torch.finfo(DTYPE).min), keep.expand_as(scores)


def get_inputs():
    pad = (torch.rand(8, 1, 1, 512) > 0.2).long()
    return [torch.randn(8, 12, 512, 512, dtype=DTYPE), torch.arange(512).view(512, 1), torch.arange(512), pad]


def get_init_inputs():
    return []
