"""torchvision's ResNet-18 with random weights (convs + eval-mode batch norm + ReLU + pooling).

    $ torch-htam plan examples/resnet18.py
    >>> model, inputs = get_model()
"""
import torch


def get_model(device="cpu", dtype=torch.float32, batch=1, size=64):
    """(model.eval(), (images,)) with images: (batch, 3, size, size)."""
    try:
        import torchvision
    except ImportError as e:
        raise ImportError("examples/resnet18.py needs torchvision: pip install torchvision "
                          f"(the build matching your torch) ({e})") from e
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).to(device=device, dtype=dtype).eval()
    return model, (torch.randn(batch, 3, size, size, device=device, dtype=dtype),)
