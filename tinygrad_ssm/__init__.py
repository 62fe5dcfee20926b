"""tinygrad_ssm: a reverse-mode autograd engine on NumPy, with a Mamba-2 language model built on it."""
from . import blas_threads  # noqa: F401  (first: OpenBLAS's threads sleep after a matmul; before NumPy loads)
from . import heap_reuse  # noqa: F401  (freed arrays' pages are reused by the next step: no page faults)
from . import functional
from .creation import arange, full, new_tensor, ones, ones_like, rand, randn, zeros, zeros_like
from .functional import (cat, concatenate, einsum, matmul, maximum, minimum, stack, where)
from .tensor import Function, Tensor, enable_grad, is_grad_enabled, no_grad
from . import tensor  # the module tinygrad_ssm/tensor.py (torch.tensor(data) is new_tensor(data) here)
from . import init, nn
from .registry import VarBuilder, VarMap
from . import optim
from .diagnostics import gradient_report
from .kernels import ssd
from .models import Mamba2Config, Mamba2LMHeadModel

float32 = "float32"
float64 = "float64"

__version__ = "0.1.0"
