"""Python's and NumPy's protocols on Tensor, as PyTorch has them: elementwise comparisons giving bool
tensors, NumPy ufuncs sent to the engine's ops (Tensor.__array_ufunc__), NumPy's reduction keywords, `in`, and
pickle and deepcopy.
The Tensor methods that use these are in tinygrad_ssm/autograd/tensor.py."""
from __future__ import annotations

import copy
import warnings

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
    x = a.data
    python_number = isinstance(b, (bool, int, float)) and not isinstance(b, np.generic)   # (np.float64 is a float)
    if np.ndim(x) != np.ndim(b) and 0 in (np.ndim(x), np.ndim(b)) and not python_number:
        # as arithmetic's operands meet (functional._meet): a 0-d float (np.float64(0.1), a 0-d tensor) never
        # widens a float tensor, so float32 == np.float64(0.1) compares 0.1 rounded to float32, as torch
        bd = np.asarray(b).dtype
        if x.dtype.kind == bd.kind == "f" and x.dtype != bd:
            x, b = (x, np.asarray(b, x.dtype)) if np.ndim(b) == 0 else (x.astype(bd), b)
    try:
        return Tensor(ufunc(x, b))
    except ValueError:
        raise ValueError(f"{op}: shapes {a.shape} and {np.shape(b)} do not broadcast") from None


# NumPy ufuncs that are engine ops (ufunc name -> the op's name in tinygrad_ssm.autograd.functional), and comparisons
UFUNC_OPS = {"add": "add", "subtract": "sub", "multiply": "mul", "divide": "div", "power": "pow",
             "matmul": "matmul", "maximum": "maximum", "minimum": "minimum", "negative": "neg", "exp": "exp",
             "log": "log", "sqrt": "sqrt", "absolute": "abs", "tanh": "tanh"}
COMPARISONS = {"equal": "eq", "not_equal": "ne", "less": "lt", "less_equal": "le", "greater": "gt",
               "greater_equal": "ge"}


def is_engine_ufunc(ufunc) -> bool:
    return ufunc.__name__ in UFUNC_OPS or ufunc.__name__ in COMPARISONS


def apply_ufunc(ufunc, inputs):
    """ufunc(*inputs) as the engine's op (differentiable), for a ufunc where is_engine_ufunc holds."""
    if ufunc.__name__ in COMPARISONS:
        return compare_any(COMPARISONS[ufunc.__name__], ufunc, *inputs)
    return getattr(F, UFUNC_OPS[ufunc.__name__])(*inputs)


MIRRORED = {np.less: np.greater, np.less_equal: np.greater_equal, np.greater: np.less,
            np.greater_equal: np.less_equal, np.equal: np.equal, np.not_equal: np.not_equal}


def compare_any(op, ufunc, a, b):
    """A comparison where the tensor may be on the right (ndarray == tensor)."""
    if isinstance(a, Tensor):
        return compare(op, ufunc, a, b)
    return compare(op, MIRRORED[ufunc], b, a)


def as_array(t: Tensor, dtype=None, copy=None) -> np.ndarray:
    """np.asarray(t) / np.array(t): the tensor's own array (no copy unless asked), refused when t requires
    grad (as numpy()), so an array never silently leaves the graph."""
    if t.requires_grad:
        raise RuntimeError("Can't convert a Tensor that requires grad to a NumPy array "
                           "(np.asarray / np.array). Use tensor.detach().numpy() instead.")
    if copy is False and dtype is not None and np.dtype(dtype) != t.dtype:
        raise ValueError(f"np.asarray(tensor, copy=False): the tensor is {t.dtype}, not {np.dtype(dtype)}")
    array = t.data if dtype is None else t.data.astype(dtype, copy=False)
    return array.copy() if copy and array is t.data else array


def array_ufunc(ufunc, method: str, inputs: tuple, kwargs: dict):
    """Tensor.__array_ufunc__: ufuncs the engine has become its ops (so np.exp(t) is differentiable); any
    other works on tensors that don't require grad and gives a Tensor, as torch; on one that requires grad
    it is a TypeError naming the ufunc."""
    if method == "__call__" and not kwargs and is_engine_ufunc(ufunc):
        return apply_ufunc(ufunc, inputs)
    if any(isinstance(t, Tensor) and t.requires_grad for t in (*inputs, *kwargs.get("out", ()))):
        raise TypeError(f"np.{ufunc.__name__}{'' if method == '__call__' else '.' + method}: not "
                        f"differentiable in tinygrad_ssm (on a tensor that requires grad). Use the ops of "
                        f"tinygrad_ssm.autograd.functional, or apply it to tensor.detach()")
    if "out" in kwargs:
        raise TypeError(f"np.{ufunc.__name__}: out= is not supported with tensors (an array updated in place "
                        f"with a tensor: `p.data -= lr * p.grad`); update the tensor under no_grad() (`with "
                        f"no_grad(): p -= lr * p.grad`), or use the tensor's array (`p.data -= lr * p.grad.data`)")
    arrays = [t.data if isinstance(t, Tensor) else t for t in inputs]
    result = getattr(ufunc, method)(*arrays, **kwargs)
    if isinstance(result, tuple):
        return tuple(Tensor(r) for r in result)
    return None if result is None else Tensor(result)


def contains(t: Tensor, element) -> bool:
    """`element in t`: whether any entry of t equals element (a number or a tensor that broadcasts)."""
    if not isinstance(element, (Tensor, bool, int, float, np.generic)):
        raise RuntimeError(f"Tensor.__contains__ only supports Tensor or scalar, but you passed in a "
                           f"{type(element).__name__}")
    return bool((t == element).data.any())


def assigned_grad(t: Tensor, value) -> Tensor:
    """`t.grad = value`, checked: a Tensor (or the engine's storage, a NumPy array) of t's shape and dtype, since
    later gradients are summed into it in its dtype (torch refuses both too); kept detached. A list or a number is
    refused, as torch's, where it was wrapped silently."""
    if not isinstance(value, (Tensor, np.ndarray)):
        raise TypeError(f"grad: assigned grad must be a Tensor, a NumPy array or None, got {type(value).__name__}")
    value = value if isinstance(value, Tensor) else Tensor(value)
    if value.shape != t.shape:
        raise ValueError(f"grad: assigned grad has shape {value.shape} but the tensor has shape {t.shape}")
    if value.dtype != t.dtype:
        raise TypeError(f"grad: assigned grad has dtype {value.dtype} but the tensor has dtype {t.dtype}; "
                        f"convert it first (e.g. grad.astype('{t.dtype}'))")
    return value.detach()


def positive(t: Tensor) -> Tensor:
    """+t: t itself, as torch's (not a copy); a bool tensor is refused, as NumPy and torch refuse it."""
    if t.dtype == np.bool_:
        raise TypeError("+t: unary + is not defined for a bool tensor (NumPy and torch refuse it too); use t")
    return t


_NOT_COPIED = ("_ctx", "_hooks", "_grad_hooks")   # the graph (weak references to its outputs) and the hooks


def pickled_state(t: Tensor) -> dict:
    """What pickle keeps of a tensor, as torch's: its array, dtype and requires_grad, as a leaf (an op's output
    comes back a leaf); not .grad (torch drops it too) nor hooks (with a
    warning). (Its graph's weak references failed pickle.)"""
    if t._hooks or t._grad_hooks:
        warnings.warn("pickle: the hooks registered on this tensor are not pickled (as torch's)", UserWarning,
                      stacklevel=3)
    return {**{k: v for k, v in t.__dict__.items() if k not in _NOT_COPIED}, "_ctx": None, "_retains_grad": False,
            "_grad": None}


def deep_copy(t: Tensor, memo: dict) -> Tensor:
    """copy.deepcopy of a leaf, as torch's: its array, requires_grad and .grad, no hooks (a copied hook ran on the
    copy, and the original's handle could not remove it). An op's output is refused, as in torch: its copied
    graph pointed at the original outputs, and a backward through the copy gave no gradient anywhere."""
    if t._ctx is not None:
        raise RuntimeError("deepcopy: only leaf tensors (made by the user, not by an op) support the deepcopy "
                           "protocol, as in torch; copy t.detach() instead")
    out = Tensor.__new__(Tensor)
    memo[id(t)] = out
    out.__dict__.update(copy.deepcopy({k: v for k, v in t.__dict__.items() if k not in _NOT_COPIED}, memo))
    out._ctx = None
    return out
