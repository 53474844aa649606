"""LM loss: F.cross_entropy (mean over tokens) of [4096, 32000] logits (batch 8 x sequence 512
over a 32000-token vocabulary) against int64 targets: one row kernel (log_softmax statistics, the
target's log-probability gathered per row, per-group partial sums over rows), then one block adds
the partials and divides by the count of targets (bf16)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPE = torch.bfloat16


class Model(nn.Module):
    def forward(self, logits, target):
        return F.cross_entropy(logits, target)


def get_inputs():
    return [torch.randn(4096, 32000, dtype=DTYPE), torch.randint(0, 32000, (4096,))]


def get_init_inputs():
    return []
