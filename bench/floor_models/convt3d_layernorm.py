"""KernelBench-style problem (the shape of level 2's ConvTranspose3d + LayerNorm problems):
a 3D transposed convolution, then LayerNorm over the last dimension.

Loaded by bench/floor_models.py the way KernelBench's harness loads a problem, with
importlib.util.spec_from_file_location + exec_module and never registered in sys.modules, so
nothing can import this module by name (path (a) of bench/bench_floor.py).
"""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, eps=1e-5):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose3d(in_channels, out_channels, kernel_size,
                                                 stride=stride, padding=padding)
        # NOTE: normalizes the last dim (W_out), which the sizes below make equal to out_channels,
        # as in KernelBench's problem
        self.layer_norm = nn.LayerNorm(out_channels, eps=eps)

    def forward(self, x):
        x = self.conv_transpose(x)
        return self.layer_norm(x)


batch_size = 16
in_channels = 16
out_channels = 32
D, H, W = 8, 16, 16       # output (16, 32, 16, 32, 32): W_out = (W - 1) * 2 - 2 * 1 + 4 = 32
kernel_size = 4
stride = 2
padding = 1


def get_inputs():
    return [torch.randn(batch_size, in_channels, D, H, W)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, stride, padding]
