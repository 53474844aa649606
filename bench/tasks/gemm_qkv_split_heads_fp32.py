"""GPT-2 small c_attn: linear 768 -> 2304 + split into q, k, v + view + transpose to heads,
x [8, 512, 768] (fp32): three [8, 12, 512, 64] outputs, each a layout of the GEMM result."""
import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPE = torch.float32


class Model(nn.Module):
    def forward(self, x, w, b):
        B, T, C = x.shape
        q, k, v = F.linear(x, w, b).split(C, dim=2)
        return tuple(t.view(B, T, 12, C // 12).transpose(1, 2) for t in (q, k, v))


def get_inputs():
    return [torch.randn(8, 512, 768, dtype=DTYPE), torch.randn(2304, 768, dtype=DTYPE) * 0.02,
            torch.randn(2304, dtype=DTYPE)]


def get_init_inputs():
    return []
