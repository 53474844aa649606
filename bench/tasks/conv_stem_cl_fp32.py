"""ResNet-50 stem conv7x7/2 + BatchNorm (inference) + ReLU over channels-last x, [32, 3, 224, 224] (fp32, TF32 as PyTorch runs cuDNN convs): 3
channels, 12 bytes a pixel, where cuDNN's runtime-fusion engines are slow (conv.render_cl, fused=False splits the epilogue)."""
import torch
import torch.nn.functional as F

DTYPE = torch.float32


class Model(torch.nn.Module):
    def forward(self, x, w, gamma, beta, mean, var):
        y = F.conv2d(x, w, None, 2, 3)
        return F.relu(F.batch_norm(y, mean, var, gamma, beta, False, 0.1, 1e-5))


def get_inputs():
    x = torch.randn(32, 3, 224, 224, dtype=DTYPE).to(memory_format=torch.channels_last)
    return [x, torch.randn(64, 3, 7, 7, dtype=DTYPE) * 0.1, torch.randn(64, dtype=DTYPE),
            torch.randn(64, dtype=DTYPE), torch.randn(64, dtype=DTYPE), torch.rand(64, dtype=DTYPE) + 0.5]


def get_init_inputs():
    return []
