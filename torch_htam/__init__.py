"""torch_htam: make PyTorch models faster with generated, verified CUDA kernels.

    >>> import torch_htam
    >>> fast = torch_htam.optimize(model, (x,))        # verified kernels swapped in
    >>> tasks = torch_htam.extract_tasks(model, (x,))  # the regions, as KernelBench-style tasks
"""
from torch_htam.evaluation import Evaluation
from torch_htam.policy import Precision
from torch_htam.task import Task, TensorSpec

__all__ = ["Evaluation", "Precision", "Task", "TensorSpec"]
__version__ = "0.1.0"
