"""policy.py: which precision a task is held to, and which cached kernels a policy admits (CPU)."""
from types import SimpleNamespace

import pytest

import torch

from torch_htam.policy import (_readable, admits, admitted, conv_tf32, kept_precision, make, matmul_tf32,
                               policy_for, precision_levels, tf32_switches)
from torch_htam.task import TensorSpec


def _task(kind, dtype="float32", signature="sig"):
    spec = TensorSpec((8, 8), dtype, (8, 1))
    return SimpleNamespace(kind=kind, inputs=[spec], outputs=[spec], signature=signature)


def test_conv_follows_cudnn_tf32_and_gemm_follows_matmul_precision():
    assert policy_for(_task("conv"), conv=True).name == "tf32"
    assert policy_for(_task("conv"), conv=False).name == "fp32"
    with tf32_switches(False):
        assert policy_for(_task("conv")).name == "fp32" and policy_for(_task("gemm")).name == "fp32"
    with tf32_switches(True):
        assert policy_for(_task("conv")).name == "tf32" and policy_for(_task("gemm")).name == "tf32"
    assert policy_for(_task("gemm"), matmul=False).name == "fp32"
    assert policy_for(_task("gemm"), matmul=True).name == "tf32"
    assert policy_for(_task("elementwise"), matmul=True).name == "fp32"
    assert policy_for(_task("conv", "bfloat16"), conv=False).name == "bf16"


def _precision_state() -> tuple:
    """Every fp32_precision string torch holds, and its legacy TF32 settings (None where torch
    refuses the read)."""
    b = torch.backends
    return tuple(lv.fp32_precision for lv in precision_levels()), (
        _readable(lambda: b.cuda.matmul.allow_tf32), _readable(lambda: b.cudnn.allow_tf32),
        _readable(torch.get_float32_matmul_precision))


# How users set TF32: nothing, the legacy flags, the matmul precision, or the fp32_precision strings
# (after which torch refuses some legacy reads).
USER_SETTINGS = {
    "default": lambda b: None,
    "legacy matmul on": lambda b: setattr(b.cuda.matmul, "allow_tf32", True),
    "legacy convs off": lambda b: setattr(b.cudnn, "allow_tf32", False),
    "matmul precision high": lambda b: torch.set_float32_matmul_precision("high"),
    "matmul precision medium": lambda b: torch.set_float32_matmul_precision("medium"),
    "new API matmul tf32": lambda b: setattr(b.cuda.matmul, "fp32_precision", "tf32"),
    "new API convs ieee": lambda b: setattr(b.cudnn.conv, "fp32_precision", "ieee"),
    "new API generic tf32": lambda b: setattr(b, "fp32_precision", "tf32"),
}


@pytest.mark.parametrize("setting", USER_SETTINGS)
def test_tf32_switches_set_both_apis_inside_and_restore_the_users_state_exactly(setting):
    """Inside: TF32 as asked for matmuls and convs, and every legacy read works (Inductor makes
    them). After: the fp32_precision strings exactly as before (they are in Inductor's FX graph cache
    key: a leaked "none" -> "ieee" made a bundle's Inductor code miss in a fresh server), and each
    legacy setting that was readable before reads the same."""
    with kept_precision():                  # the user's setting undone for later tests
        USER_SETTINGS[setting](torch.backends)
        strings, legacy = _precision_state()
        for on in (True, False, True):
            with tf32_switches(on):
                assert (matmul_tf32(), conv_tf32()) == (on, on)
                assert None not in _precision_state()[1]
            after_strings, after_legacy = _precision_state()
            assert after_strings == strings
            assert all(b is None or a == b for b, a in zip(legacy, after_legacy))
        assert policy_for(_task("gemm")).name == make("tf32" if matmul_tf32() else "fp32").name


def test_a_kernel_serves_only_policies_at_least_as_loose_as_its_own():
    assert admits("fp32", make("fp32")) and admits("fp32", make("tf32")) and admits("tf32", make("bf16"))
    assert not admits("tf32", make("fp32")) and not admits("bf16", make("fp16"))
    assert not admits("?", make("bf16"))                     # a record without a policy: never


def test_a_cached_tf32_kernel_is_not_admitted_once_tf32_is_off():
    entry = SimpleNamespace(policy="tf32")
    with tf32_switches(True):
        assert admitted(entry, _task("conv")) is entry
    with tf32_switches(False):
        assert admitted(entry, _task("conv")) is None     # optimize: a miss, searched again under fp32
    assert admitted(None, _task("conv")) is None


def test_why_not_is_the_one_rule_for_using_a_kernel():
    """Each reason a kernel may not run, from the one function every swap path asks."""
    from torch_htam.evaluation import Evaluation
    from torch_htam.policy import why_not

    class Entry(SimpleNamespace):
        def usable(self, min_speedup):
            return self.so_path is not None and self.speedup >= min_speedup
    good = Entry(policy="fp32", so_path="k.so", speedup=1.5, needs_rebuild=False,
                 evaluation=Evaluation(True, "ok", speedup=1.5, compile_speedup=1.2))
    with tf32_switches(False):
        assert why_not(good, _task("gemm"), 1.03) is None
        assert why_not(good, _task("gemm"), 1.03, against_inductor=True) is None
        assert "Inductor" in why_not(good, _task("gemm"), 1.3, against_inductor=True)
        assert "below 2.0x" in why_not(good, _task("gemm"), 2.0)
        assert why_not(Entry(**{**vars(good), "so_path": None, "needs_rebuild": True}), None) \
            == "needs rebuild + re-verification"
        assert "policy" in why_not(Entry(**{**vars(good), "policy": "tf32"}), _task("conv"))
    assert why_not(None) == "no kernel"
    assert why_not(object(), None, 5.0) is None                    # a kernel object: the caller's word
