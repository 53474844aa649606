"""GPT-2's MLP up-projection as HF writes it: Conv1D (addmm of the flattened tokens
x [4096, 768] by W [768, 3072] plus bias), then NewGELU spelled out,
0.5 * h * (1 + tanh(sqrt(2/pi) * (h + 0.044715 * h^3))), viewed back to 2-D for c_proj (fp32)."""
import math

import torch
import torch.nn as nn

DTYPE = torch.float32


class Model(nn.Module):
    def forward(self, x, w, b):
        h = torch.addmm(b, x, w).view(8, -1, w.shape[-1])      # [8, 512, 3072]
        g = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))
        return g.view(-1, g.shape[-1])     # as the next Conv1D (c_proj) reads it


def get_inputs():
    return [torch.randn(8 * 512, 768, dtype=DTYPE), torch.randn(768, 3072, dtype=DTYPE) * 0.02,
            torch.randn(3072, dtype=DTYPE)]


def get_init_inputs():
    return []
