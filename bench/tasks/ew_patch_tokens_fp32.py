"""ViT-B/16 patch tokens after the patch conv: [32, 768, 14, 14] -> reshape + permute to
[32, 196, 768], the class token cat in front, + the position embedding [1, 197, 768] (fp32)."""
import torch
import torch.nn as nn

DTYPE = torch.float32


class Model(nn.Module):
    def forward(self, x, cls, pos):
        B, C = x.shape[:2]
        x = x.reshape(B, C, -1).permute(0, 2, 1)
        return torch.cat([cls.expand(B, -1, -1), x], dim=1) + pos


def get_inputs():
    return [torch.randn(32, 768, 14, 14, dtype=DTYPE), torch.randn(1, 1, 768, dtype=DTYPE),
            torch.randn(1, 197, 768, dtype=DTYPE)]


def get_init_inputs():
    return []
