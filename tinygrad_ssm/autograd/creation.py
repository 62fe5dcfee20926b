"""Making tensors: from data, filled, random, ranges. Float tensors are float32 unless a dtype is given."""
import numbers

import numpy as np

from .tensor import DEFAULT_FLOAT, Tensor, keeps_float64


def new_tensor(data, dtype=None, requires_grad=False) -> Tensor:
    """A new tensor holding a copy of `data`: torch.tensor(data) under a name that does not shadow the module
    `tinygrad_ssm.autograd.tensor` (tinygrad_ssm/autograd/tensor.py). Python floats become float32, as in torch;
    data that states its dtype (an array, a tensor, a NumPy scalar, a torch tensor) keeps it."""
    source = data.data if isinstance(data, Tensor) else data
    # np.array(x, copy=True) on an object with its own __array__ (a torch tensor) warns in NumPy 2: asarray first
    array = np.array(source, copy=True) if isinstance(source, (np.ndarray, list, tuple)) or np.isscalar(source) \
        else np.asarray(source).copy()
    if dtype is None and array.dtype == np.float64 and not keeps_float64(data):
        array = array.astype(DEFAULT_FLOAT)
    return Tensor(array, dtype=dtype, requires_grad=requires_grad)


def _shape(op: str, shape) -> tuple:
    """zeros(2, 3) and zeros((2, 3)) alike; every size an int >= 0, or a TypeError/ValueError naming the op."""
    shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else tuple(shape)
    if not all(isinstance(n, (int, np.integer)) and not isinstance(n, (bool, np.bool_)) for n in shape):
        raise TypeError(f"{op}: sizes must be ints, got {shape}")
    if any(n < 0 for n in shape):
        raise ValueError(f"{op}: sizes must be >= 0, got {shape}")
    return shape


def zeros(*shape, dtype=DEFAULT_FLOAT, requires_grad=False) -> Tensor:
    return Tensor(np.zeros(_shape("zeros", shape), dtype=dtype), requires_grad=requires_grad)


def ones(*shape, dtype=DEFAULT_FLOAT, requires_grad=False) -> Tensor:
    return Tensor(np.ones(_shape("ones", shape), dtype=dtype), requires_grad=requires_grad)


def full(shape, value, dtype=None, requires_grad=False) -> Tensor:
    """Without a dtype, the value's kind decides, as torch.full: a bool gives bool, an int int64, a float float32
    (a NumPy scalar keeps its own dtype)."""
    if not isinstance(value, numbers.Number):  # None became NaN: torch refuses it
        raise TypeError(f"full: value must be a number, got {value!r}")
    shape = _shape("full", (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape))   # as zeros(2)
    if dtype is None:
        if isinstance(value, int) and not isinstance(value, bool) and not -2**63 <= value < 2**63:
            raise OverflowError(f"full: value {value} does not fit int64 (torch refuses it too); pass a float or "
                                f"a dtype")                         # NumPy made a uint64 or object array of it
        dtype = Tensor(value).dtype
    return Tensor(np.full(shape, value, dtype=dtype), requires_grad=requires_grad)


def _like(name: str, t) -> Tensor:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name}: input must be a Tensor, got {type(t).__name__}")
    return t


def zeros_like(t: Tensor, dtype=None, requires_grad=False) -> Tensor:
    return Tensor(np.zeros(_like("zeros_like", t).shape, dtype=dtype or t.dtype), requires_grad=requires_grad)


def ones_like(t: Tensor, dtype=None, requires_grad=False) -> Tensor:
    return Tensor(np.ones(_like("ones_like", t).shape, dtype=dtype or t.dtype), requires_grad=requires_grad)


def arange(start, stop=None, step=1, dtype=None) -> Tensor:
    """np.arange; from Python floats float32, as torch.arange (NumPy would give float64)."""
    if step == 0:
        raise ValueError("arange: step must not be zero")
    values = np.arange(start, stop, step, dtype=dtype)
    from_python_floats = not any(isinstance(v, np.floating) for v in (start, stop, step))
    if dtype is None and values.dtype == np.float64 and from_python_floats:
        values = values.astype(DEFAULT_FLOAT)
    return Tensor(values)


def randn(*shape, dtype=DEFAULT_FLOAT, requires_grad=False, rng=None) -> Tensor:
    rng = rng if rng is not None else np.random.default_rng()
    return Tensor(rng.standard_normal(_shape("randn", shape)).astype(dtype), requires_grad=requires_grad)


def rand(*shape, dtype=DEFAULT_FLOAT, requires_grad=False, rng=None) -> Tensor:
    rng = rng if rng is not None else np.random.default_rng()
    return Tensor(rng.random(_shape("rand", shape)).astype(dtype), requires_grad=requires_grad)
