"""Python's and NumPy's protocols on Tensor, as PyTorch has them: elementwise comparisons giving bool
tensors, NumPy ufuncs sent to the engine's ops (Tensor.__array_ufunc__), and NumPy's reduction keywords.
The Tensor methods that use these are in tinygrad_ssm/tensor.py."""
from __future__ import annotations

import numpy as np

from . import functional as F
from .tensor import Tensor


def numpy_reduction_input(op: str, x: Tensor, dtype, out) -> Tensor:
    if out is not None:
        raise TypeError(f"{op}: out= is not supported with tensors; use the returned tensor")
    return x if dtype is None else F.cast(x, dtype)


def compare(op: str, ufunc, a: Tensor, other):
    """a (op) other elementwise -> a bool Tensor. A Python number is compared as it is (against a float32
    tensor it is rounded to float32, as torch); something that is not a number nor an array gives
    NotImplemented, so `t == "x"` is False and `t < "x"` a TypeError, as for any Python object."""
    if isinstance(other, Tensor):
        b = other.data
    elif isinstance(other, (bool, int, float, np.generic)):
        b = other
    elif isinstance(other, (np.ndarray, list, tuple)):
        b = np.asarray(other)
        if b.dtype.kind not in "biuf":
            return NotImplemented
    else:
        return NotImplemented
    try:
        return Tensor(ufunc(a.data, b))
    except ValueError:
        raise ValueError(f"{op}: shapes {a.shape} and {np.shape(b)} do not broadcast") from None


# NumPy ufuncs that are engine ops: Tensor.__array_ufunc__ sends them to tinygrad_ssm.functional
UFUNC_OPS = {
    "add": F.add, "subtract": F.sub, "multiply": F.mul, "divide": F.div, "power": F.pow, "matmul": F.matmul,
    "maximum": F.maximum, "minimum": F.minimum, "negative": F.neg, "exp": F.exp, "log": F.log, "sqrt": F.sqrt,
    "absolute": F.abs, "tanh": F.tanh,
    "equal": lambda a, b: compare_any("eq", np.equal, a, b),
    "not_equal": lambda a, b: compare_any("ne", np.not_equal, a, b),
    "less": lambda a, b: compare_any("lt", np.less, a, b),
    "less_equal": lambda a, b: compare_any("le", np.less_equal, a, b),
    "greater": lambda a, b: compare_any("gt", np.greater, a, b),
    "greater_equal": lambda a, b: compare_any("ge", np.greater_equal, a, b),
}
MIRRORED = {np.less: np.greater, np.less_equal: np.greater_equal, np.greater: np.less,
            np.greater_equal: np.less_equal, np.equal: np.equal, np.not_equal: np.not_equal}


def compare_any(op, ufunc, a, b):
    """A comparison where the tensor may be on the right (ndarray == tensor)."""
    if isinstance(a, Tensor):
        return compare(op, ufunc, a, b)
    return compare(op, MIRRORED[ufunc], b, a)
