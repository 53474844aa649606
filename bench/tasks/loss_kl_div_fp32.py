"""Distillation loss, F.kl_div of student log-probs against teacher probs over a 32000-token vocabulary, reduction='batchmean', [512, 32000] (fp32)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPE = torch.float32


class Model(nn.Module):
    def forward(self, log_p, q):
        return F.kl_div(log_p, q, reduction='batchmean')


def get_inputs():
    return [torch.randn(512, 32000).log_softmax(-1).to(DTYPE), torch.randn(512, 32000).softmax(-1).to(DTYPE)]


def get_init_inputs():
    return []
