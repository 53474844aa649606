#!/usr/bin/env bash
# Device-machine probe: toolchain facts the build needs (cuBLAS/cuDNN include+lib dirs, nvcc, torch).
set -u
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
which python3 nvcc ninja; nvcc --version | tail -1
python3 - <<'PY'
import torch, os, glob, importlib
print("torch", torch.__version__, "cuda", torch.version.cuda, "cap", torch.cuda.get_device_capability())
p = torch.cuda.get_device_properties(0)
print("sms", p.multi_processor_count, "L2", getattr(p, "L2_cache_size", None),
      "memclk", getattr(p, "memory_clock_rate", None), "bus", getattr(p, "memory_bus_width", None),
      "smem_optin", getattr(p, "shared_memory_per_block_optin", None))
for mod in ("nvidia", "nvidia.cublas", "nvidia.cu13", "nvidia.cudnn"):
    try:
        m = importlib.import_module(mod); print(mod, list(getattr(m, "__path__", [])))
    except Exception as e:
        print(mod, "MISSING", e)
PY
for pat in cublasLt.h cudnn.h cudnn_cnn.h; do echo "== $pat"; find / -name "$pat" -not -path "/proc/*" 2>/dev/null | head -5; done
for pat in "libcublasLt.so*" "libcudnn.so*"; do echo "== $pat"; find / -name "$pat" -not -path "/proc/*" 2>/dev/null | head -5; done
ls /usr/local/cuda/include | grep -i -E "cublas|cudnn" | head
echo "CUDA_HOME=${CUDA_HOME:-unset}"
python3 -c "import platformdirs" 2>&1 | tail -1; python3 -c "import openai" 2>&1 | tail -1
python3 -c "import transformers, torchvision, timm; print(transformers.__version__, torchvision.__version__, timm.__version__)"
