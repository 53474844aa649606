"""policy.py: which precision a task is held to, and which cached kernels a policy admits (CPU)."""
from types import SimpleNamespace

import torch

from torch_htam.policy import admits, admitted, make, policy_for
from torch_htam.task import TensorSpec


def _task(kind, dtype="float32", signature="sig"):
    spec = TensorSpec((8, 8), dtype, (8, 1))
    return SimpleNamespace(kind=kind, inputs=[spec], outputs=[spec], signature=signature)


def test_conv_follows_cudnn_tf32_and_gemm_follows_matmul_precision(monkeypatch):
    assert policy_for(_task("conv"), conv_tf32=True).name == "tf32"
    assert policy_for(_task("conv"), conv_tf32=False).name == "fp32"
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    assert policy_for(_task("conv")).name == "fp32"
    assert policy_for(_task("gemm"), matmul_precision="highest").name == "fp32"
    assert policy_for(_task("gemm"), matmul_precision="high").name == "tf32"
    assert policy_for(_task("elementwise"), matmul_precision="high").name == "fp32"
    assert policy_for(_task("conv", "bfloat16"), conv_tf32=False).name == "bf16"


def test_a_kernel_serves_only_policies_at_least_as_loose_as_its_own():
    assert admits("fp32", make("fp32")) and admits("fp32", make("tf32")) and admits("tf32", make("bf16"))
    assert not admits("tf32", make("fp32")) and not admits("bf16", make("fp16"))
    assert not admits("?", make("bf16"))                     # a record without a policy: never


def test_a_cached_tf32_kernel_is_not_admitted_once_tf32_is_off(monkeypatch):
    entry = SimpleNamespace(policy="tf32")
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    assert admitted(entry, _task("conv")) is entry
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    assert admitted(entry, _task("conv")) is None     # optimize: a miss, searched again under fp32
    assert admitted(None, _task("conv")) is None
