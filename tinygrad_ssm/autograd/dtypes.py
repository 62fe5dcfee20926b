"""What a Tensor may hold: bool, integer and floating point numbers, float32 by default (as torch); a check
that refuses anything else (str, None, objects, complex) naming the op and the argument."""
from __future__ import annotations

import numpy as np

DEFAULT_FLOAT = np.dtype(np.float32)


def _as_dtype(dtype) -> np.dtype:
    if isinstance(dtype, str) and dtype in ("bfloat16",):
        raise TypeError("bfloat16 has no NumPy dtype; store it as float32")
    return np.dtype(dtype)


def is_float(dtype) -> bool:
    return np.dtype(dtype).kind == "f"


def promoted(*dtypes) -> np.dtype:
    """The dtype tensors of these dtypes meet in (cat, where, matmul, the binary ops): torch's category rule,
    an integer or bool tensor meeting a float one takes the float type (NumPy would make int64 + float32
    float64); otherwise NumPy's result_type (float32 + float64 is float64, int32 + int64 int64)."""
    floats = [d for d in dtypes if is_float(d)]
    return np.result_type(*floats) if floats else np.result_type(*dtypes)


def _check_numeric(op: str, argument: str, data, array: np.ndarray):
    """Tensors hold bool, integer or floating point numbers. Anything else (a str, None, objects, complex
    numbers) is refused here, with the op and the argument named, instead of failing later inside NumPy."""
    if array.dtype.kind in "biuf":
        return
    if array.dtype.kind == "c":
        raise TypeError(f"{op}: {argument} has dtype {array.dtype}: complex tensors are not supported; "
                        f"pass the real and imaginary parts (x.real, x.imag) as separate float tensors")
    what = (f"an array of dtype {array.dtype}" if isinstance(data, np.ndarray)
            else f"{type(data).__name__} {data!r}" if not isinstance(data, (list, tuple))
            else f"a {type(data).__name__} that NumPy turns into dtype {array.dtype}")
    raise TypeError(f"{op}: {argument} must be a Tensor, a number or an array of numbers "
                    f"(bool, integer or float), got {what[:120]}")


def carries_dtype(data) -> bool:
    """Whether `data` states its own dtype (an array, a NumPy scalar, a torch tensor, a typed memoryview): kept,
    as torch.tensor keeps it, where Python floats become float32."""
    return isinstance(data, (np.generic, memoryview)) or hasattr(data, "dtype")


def keeps_float64(data) -> bool:
    """Whether data that NumPy made float64 stays float64: it states its dtype, or a nested list or tuple holds
    a float64 that does (torch.tensor([np.float64(1.5)]) is float64, torch.tensor([1.5]) float32)."""
    return _holds_float64(data) if isinstance(data, (list, tuple)) else carries_dtype(data)


_PLAIN = frozenset((float, int, bool))


def _holds_float64(data) -> bool:
    if isinstance(data, (list, tuple)):
        if set(map(type, data)) <= _PLAIN:                              # Python numbers alone: one pass in C
            return False
        return any(_holds_float64(item) for item in data if type(item) not in _PLAIN)
    return isinstance(data, (np.ndarray, np.generic)) and data.dtype == np.float64
