"""GPT-2 / Llama position ids and the extended attention mask from a padding mask: int64 index
arithmetic (positions + past length, padded slots set to 1) and the mask as (1 - m) * min of the
compute dtype, [32, 2048] (bf16 mask)."""
import torch
import torch.nn as nn

DTYPE = torch.bfloat16


class Model(nn.Module):
    def forward(self, positions, past, mask):
        ids = (positions + past).masked_fill(mask == 0, 1)
        ext = (1.0 - mask.to(DTYPE)) * torch.finfo(DTYPE).min
        return ids, ext


def get_inputs():
    mask = (torch.rand(32, 2048) > 0.1).long()
    return [torch.arange(2048), torch.tensor(17), mask]


def get_init_inputs():
    return []
