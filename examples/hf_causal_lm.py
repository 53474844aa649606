"""A small Llama (Hugging Face transformers) from config, random weights: RMSNorm, rotary
embeddings, grouped-query attention, SiLU-gated MLP. Its forward returns a cache object, which
is what the Dynamo fallback of capture is for when torch.export cannot flatten it.

    $ torch-htam plan examples/hf_causal_lm.py
    >>> model, inputs = get_model()
"""
import torch


def get_model(device="cpu", dtype=torch.float32, n_layer=2, batch=1, seq=16):
    """(model.eval(), (input_ids,)) with input_ids: (batch, seq) int64."""
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as e:
        raise ImportError(f"examples/hf_causal_lm.py needs transformers: pip install transformers ({e})") from e
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512,
                      num_hidden_layers=n_layer, num_attention_heads=8, num_key_value_heads=2,
                      max_position_embeddings=128)
    model = LlamaForCausalLM(cfg).to(device=device, dtype=dtype).eval()
    return model, (torch.randint(0, cfg.vocab_size, (batch, seq), device=device),)
