"""Llama k with grouped-query attention: rotary embedding on 8 kv heads, then each repeated 4 times
(repeat_kv: expand + reshape), k [4, 8, 1024, 128] -> [4, 32, 1024, 128] (fp32)."""
import torch
import torch.nn as nn

DTYPE = torch.float32


class Model(nn.Module):
    def forward(self, k, cos, sin):
        B, KV, T, d = k.shape
        k = k * cos + torch.cat((-k[..., d // 2:], k[..., :d // 2]), dim=-1) * sin
        return k[:, :, None].expand(B, KV, 4, T, d).reshape(B, KV * 4, T, d)


def get_inputs():
    return [torch.randn(4, 8, 1024, 128, dtype=DTYPE), torch.randn(4, 1, 1024, 128, dtype=DTYPE),
            torch.randn(4, 1, 1024, 128, dtype=DTYPE)]


def get_init_inputs():
    return []
