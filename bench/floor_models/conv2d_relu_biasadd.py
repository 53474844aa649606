"""KernelBench-style problem (level 2's Conv2d + ReLU + BiasAdd): a 2D convolution, ReLU, then a
learned per-channel bias added.

Loaded by bench/floor_models.py the way KernelBench's harness loads a problem, with
importlib.util.spec_from_file_location + exec_module and never registered in sys.modules, so
nothing can import this module by name (path (a) of bench/bench_floor.py).
"""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, bias_shape):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        x = self.conv(x)
        x = torch.relu(x)
        return x + self.bias


batch_size = 32
in_channels = 16
out_channels = 64
height, width = 64, 64    # output (32, 64, 62, 62)
kernel_size = 3
bias_shape = (out_channels, 1, 1)


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, bias_shape]
