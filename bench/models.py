"""End-to-end benchmark models: real architectures from configs, random weights, no downloads.

Each `get_<name>(dtype="fp32"|"bf16", batch=None, device="cuda")` returns (model.eval(), inputs)
and works as a torch-htam MODEL_SPEC, e.g. `torch-htam bench bench/models.py:get_gpt2`.
Batch sizes default to inference sizes that fill an H100 (the issue's reference points:
GPT-2 batch 8 x 512 tokens, ResNet-50 batch 32).

    >>> model, inputs = get_gpt2("bf16")
"""
from __future__ import annotations

import torch
from torch import nn

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class LogitsOnly(nn.Module):
    """HF models return ModelOutput objects (and caches); benchmarks compare one tensor.
    NOTE: use_cache=False keeps the graph free of cache objects; the wrapped model is `.hf`."""

    def __init__(self, hf: nn.Module, field: str = "logits"):
        super().__init__()
        self.hf, self.field = hf, field

    def forward(self, *args):
        out = self.hf(*args, use_cache=False) if "use_cache" in self.hf.forward.__code__.co_varnames \
            else self.hf(*args)
        return getattr(out, self.field)


def _finish(model: nn.Module, inputs: tuple, dtype: str, device: str):
    model = model.to(device=device, dtype=DTYPES[dtype]).eval()
    inputs = tuple(x.to(device, DTYPES[dtype]) if x.is_floating_point() else x.to(device)
                   for x in inputs)
    return model, inputs


def get_gpt2(dtype: str = "fp32", batch: int = 8, seq: int = 512, device: str = "cuda"):
    """GPT-2 small (124M): 12 layers, hidden 768, 12 heads."""
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(n_positions=1024, n_embd=768, n_layer=12, n_head=12,
                     attn_implementation="sdpa")
    ids = torch.randint(0, cfg.vocab_size, (batch, seq))
    return _finish(LogitsOnly(GPT2LMHeadModel(cfg)), (ids,), dtype, device)


def get_bert(dtype: str = "fp32", batch: int = 16, seq: int = 512, device: str = "cuda"):
    """BERT-base: 12 layers, hidden 768, 12 heads; the encoder's last hidden state."""
    from transformers import BertConfig, BertModel
    torch.manual_seed(0)
    cfg = BertConfig(attn_implementation="sdpa")
    ids = torch.randint(0, cfg.vocab_size, (batch, seq))
    return _finish(LogitsOnly(BertModel(cfg, add_pooling_layer=False), "last_hidden_state"),
                   (ids,), dtype, device)


def get_llama(dtype: str = "bf16", batch: int = 4, seq: int = 1024, device: str = "cuda"):
    """Llama-style decoder: hidden 1024, 8 layers, GQA (16 query heads, 4 KV heads), SwiGLU, RMSNorm."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=1024, intermediate_size=4096, num_hidden_layers=8,
                      num_attention_heads=16, num_key_value_heads=4, vocab_size=32000,
                      max_position_embeddings=2048, attn_implementation="sdpa")
    ids = torch.randint(0, cfg.vocab_size, (batch, seq))
    return _finish(LogitsOnly(LlamaForCausalLM(cfg)), (ids,), dtype, device)


def get_vit(dtype: str = "fp32", batch: int = 64, device: str = "cuda"):
    """ViT-B/16 at 224x224 (torchvision's definition, random weights)."""
    from torchvision.models import vit_b_16
    torch.manual_seed(0)
    return _finish(vit_b_16(weights=None), (torch.randn(batch, 3, 224, 224),), dtype, device)


def get_resnet50(dtype: str = "fp32", batch: int = 32, device: str = "cuda"):
    """ResNet-50 at 224x224 (torchvision's definition, random weights)."""
    from torchvision.models import resnet50
    torch.manual_seed(0)
    return _finish(resnet50(weights=None), (torch.randn(batch, 3, 224, 224),), dtype, device)


MODELS = {"gpt2": get_gpt2, "bert": get_bert, "llama": get_llama, "vit": get_vit,
          "resnet50": get_resnet50}


def get_model(device: str = "cuda"):
    """Default MODEL_SPEC entry: GPT-2 fp32."""
    return get_gpt2("fp32", device=device)
