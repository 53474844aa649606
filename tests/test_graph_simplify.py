"""graph_simplify: constant SDPA masks folded after capture (BERT's all-true mask, Llama's causal
mask), anything input-dependent or additive left alone; the model's outputs unchanged."""
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_htam.capture import capture

SDPA = torch.ops.aten.scaled_dot_product_attention.default


def _sdpa_nodes(gm):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is SDPA]


class Attn(nn.Module):
    """q, k, v from x; the mask is made by `mask_fn(L, device)` from shapes only, or passed in."""

    def __init__(self, mask_fn=None):
        super().__init__()
        self.qkv = nn.Linear(32, 96)
        self.mask_fn = mask_fn

    def forward(self, x, mask=None):
        B, L, _ = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, 4, 8).permute(2, 0, 3, 1, 4)
        if mask is None and self.mask_fn is not None:
            mask = self.mask_fn(L, x.device).expand(B, 1, L, L)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _all_true(L, dev):
    return (torch.arange(L, device=dev) >= 0)[None, None, None, :]


def _causal(L, dev):
    i = torch.arange(L, device=dev)
    return i[None, None, None, :] <= i[None, None, :, None]


def _banded(L, dev):          # a local window: not causal, not all true
    i = torch.arange(L, device=dev)
    return (i[None, None, None, :] - i[None, None, :, None]).abs() <= 2


def _additive_bias(L, dev):   # e.g. ALiBi-like: a real additive input to SDPA
    i = torch.arange(L, device=dev, dtype=torch.float32)
    return -(i[None, None, None, :] - i[None, None, :, None]).abs()


@pytest.mark.parametrize("mask_fn,kind", [(_all_true, "none"), (_causal, "causal"), (_banded, None),
                                          (_additive_bias, None)])
def test_constant_masks_fold_and_outputs_stay_the_same(mask_fn, kind):
    torch.manual_seed(0)
    model = Attn(mask_fn).eval()
    x = torch.randn(2, 16, 32)
    gm = capture(model, (x,)).graphs[0]
    (node,) = _sdpa_nodes(gm)
    has_mask = len(node.args) > 3 or node.kwargs.get("attn_mask") is not None
    assert has_mask == (kind is None)
    assert node.kwargs.get("is_causal", False) == (kind == "causal")
    with torch.no_grad():
        torch.testing.assert_close(gm(x), model(x), atol=1e-6, rtol=1e-5)
        x2 = torch.randn(2, 16, 32)          # other values, same shapes: still the same function
        torch.testing.assert_close(gm(x2), model(x2), atol=1e-6, rtol=1e-5)


def test_a_mask_from_the_inputs_is_left_alone():
    model = Attn().eval()
    x = torch.randn(2, 16, 32)
    mask = torch.ones(2, 1, 16, 16, dtype=torch.bool)     # all true today, but it is an input
    (node,) = _sdpa_nodes(capture(model, (x, mask)).graphs[0])
    assert len(node.args) > 3 or node.kwargs.get("attn_mask") is not None


def test_hf_bert_and_llama_masks_fold():
    transformers = pytest.importorskip("transformers")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import models
    ids = torch.randint(0, 100, (2, 32))
    bert = models.LogitsOnly(transformers.BertModel(transformers.BertConfig(
        num_hidden_layers=1, hidden_size=64, num_attention_heads=2, intermediate_size=128,
        attn_implementation="sdpa"), add_pooling_layer=False), "last_hidden_state").eval()
    llama = models.LogitsOnly(transformers.LlamaModel(transformers.LlamaConfig(
        num_hidden_layers=1, hidden_size=64, intermediate_size=128, num_attention_heads=4,
        num_key_value_heads=2, attn_implementation="sdpa")), "last_hidden_state").eval()
    for model, causal in ((bert, False), (llama, True)):
        gm = capture(model, (ids,)).graphs[0]
        for node in _sdpa_nodes(gm):
            assert len(node.args) == 3 and node.kwargs.get("is_causal") == causal
        with torch.no_grad():
            torch.testing.assert_close(gm(ids), model(ids), atol=1e-5, rtol=1e-5)
