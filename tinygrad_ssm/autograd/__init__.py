"""The engine: Tensor, Function, the backward walk and the differentiable ops. NumPy only (no numba): read it,
import it and test it without anything else. docs/autograd.md walks through it in reading order."""
from . import functional
from .creation import arange, full, new_tensor, ones, ones_like, rand, randn, zeros, zeros_like
from .function import Function
from .grad_mode import enable_grad, is_grad_enabled, no_grad
from .tensor import Tensor

__all__ = ["Tensor", "Function", "functional", "no_grad", "enable_grad", "is_grad_enabled", "new_tensor", "zeros",
           "zeros_like", "ones", "ones_like", "full", "rand", "randn", "arange"]
