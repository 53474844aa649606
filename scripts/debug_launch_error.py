"""Reproduce: htam::launch on a kernel that returns an error code (HTAM_ERR_SHAPE)."""
import sys, torch
sys.path.insert(0, ".")
from torch_htam import build, launcher
src = open("tests/kernels/add_f32.cu").read()
b = build.build(src)
assert b.ok, b.error
k = launcher.Kernel(b.so_path)
a = torch.randn(16, device="cuda", dtype=torch.float16)
print("run code", k([a, a], [torch.empty_like(a)]), flush=True)
try:
    torch.ops.htam.load("/nonexistent.so")
except RuntimeError as e:
    print("load raised OK:", str(e)[:80], flush=True)
try:
    k.launch([a, a], [1, 1, 16])
except RuntimeError as e:
    print("launch raised OK:", str(e)[:120], flush=True)
