"""Per-token LM loss: F.cross_entropy(reduction='none') of [4096, 32000] logits (batch 8 x
sequence 512 over a 32000-token vocabulary) against int64 targets: one row kernel, the target's
log-probability picked in its per-row epilogue. NOTE: targets stay in [0, 32000): verification
draws them from the range get_inputs() shows, and an ignore_index (-100) there would make it draw
other negative indices, on which torch's gather fails (bf16)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPE = torch.bfloat16


class Model(nn.Module):
    def forward(self, logits, target):
        return F.cross_entropy(logits, target, reduction='none')


def get_inputs():
    return [torch.randn(4096, 32000, dtype=DTYPE), torch.randint(0, 32000, (4096,))]


def get_init_inputs():
    return []
