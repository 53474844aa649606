"""A GPT-style decoder stack (nanoGPT layout): pre-LN, causal SDPA, GELU(tanh) MLP.

    $ torch-htam plan examples/gpt_block.py
    >>> model, inputs = get_model(n_layer=2)
"""
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class GPTConfig:
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    block_size: int = 32
    dropout: float = 0.1   # a no-op in eval, kept so capture sees aten.dropout


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.dropout = cfg.dropout

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        # (B, T, C) -> (B, n_head, T, head_dim)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPTStack(nn.Module):
    """Token + position embedding, n_layer blocks, final LayerNorm and LM head."""

    def __init__(self, cfg: GPTConfig, vocab_size: int = 128):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, vocab_size, bias=False)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def get_model(device="cpu", dtype=torch.float32, n_layer=2, batch=2, seq=16, n_embd=64, n_head=4):
    """(model.eval(), (idx,)) with idx: (batch, seq) int64 token ids."""
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=max(32, seq))
    model = GPTStack(cfg).to(device=device, dtype=dtype).eval()
    idx = torch.randint(0, 128, (batch, seq), device=device)
    return model, (idx,)
