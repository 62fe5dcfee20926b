"""Argument checks for the public ops of `tinygrad_ssm/autograd/functional.py`: every bad argument is an error here,
before anything runs, that names the op and the argument (and the shapes, axes or letters involved).
Nothing reaches NumPy that NumPy would reject with its own message.

Also here: the einsum subscripts parser, which is argument parsing too."""
from __future__ import annotations

import builtins
import numbers
import re

import numpy as np

from .tensor import DEFAULT_FLOAT, Tensor, _check_numeric, is_float


def shape_text(*tensors) -> str:
    return " and ".join(str(tuple(t.shape)) for t in tensors)


def broadcast_shape(op: str, what: str, *shapes) -> tuple:
    """The shape `shapes` broadcast to, or a ValueError "op: what do not broadcast" (what names the shapes)."""
    try:
        return np.broadcast_shapes(*shapes)
    except ValueError:
        raise ValueError(f"{op}: {what} do not broadcast") from None


def _describe(x) -> str:
    if isinstance(x, np.ndarray):
        return f"an array of dtype {x.dtype}"
    text = repr(x)
    return f"{type(x).__name__} {text if len(text) < 60 else text[:57] + '...'}"


def as_tensor(op: str, argument: str, x, like: Tensor | None = None) -> Tensor:
    """A tensor argument: a Tensor as is; a Python or NumPy number takes the dtype of the tensor it meets
    (`like`: a scalar never upcasts float32, an integer never widens int32); an array or a (nested) list
    becomes a tensor of its own dtype. Anything else (a str, None, objects, complex numbers, a ragged list) is
    a TypeError naming op and argument."""
    if isinstance(x, Tensor):
        return x
    if isinstance(x, (bool, np.bool_)):
        return Tensor(np.asarray(x))
    if isinstance(x, (int, float, np.integer, np.floating)):
        is_integral = isinstance(x, (numbers.Integral, np.integer))
        # torch: int32_tensor + 1 stays int32 (a number never widens a tensor of its kind)
        if like is not None and is_integral and like.dtype.kind in "iu":
            return Tensor(integer_as(op, argument, x, like.dtype))
        if like is not None and is_float(like.dtype):
            return Tensor(np.asarray(x, dtype=like.dtype))
        return Tensor(np.asarray(x, dtype=np.int64 if is_integral else DEFAULT_FLOAT))
    if not isinstance(x, (np.ndarray, list, tuple, np.generic, complex)):
        raise TypeError(f"{op}: {argument} must be a Tensor, an array or a number, got {_describe(x)}")
    try:
        array = np.asarray(x)
    except ValueError:
        raise TypeError(f"{op}: {argument} is a ragged nested list (rows of different lengths), "
                        f"not an array of numbers") from None
    _check_numeric(op, argument, x, array)
    return Tensor(x)


def integer_as(op: str, argument: str, x, dtype: np.dtype) -> np.ndarray:
    """An integer in an integer tensor's dtype, wrapped as torch wraps it (uint8 + 300 adds 44, uint8 + -1 takes 1
    away; NumPy 2 raises a bare OverflowError); one beyond int64 a clear error, as torch refuses it."""
    try:
        return np.asarray(x, dtype=dtype)
    except OverflowError:
        if not np.iinfo(np.int64).min <= int(x) <= np.iinfo(np.int64).max:
            raise OverflowError(f"{op}: {argument} = {int(x)} is beyond int64, the widest integer a tensor holds")
        return np.asarray(int(x), dtype=np.int64).astype(dtype)


def integer_operand(op: str, value: int, dtype: np.dtype) -> np.ndarray:
    """A Python int meeting an integer tensor in place, as torch has it: arithmetic (uint8.add_(1), .add_(-1))
    wraps, as out of place; a value written (fill_, t[i] = v, copy_) that the dtype cannot hold is refused (NumPy
    wrote 300 into uint8 as 44)."""
    if op in ("add_", "sub_", "mul_", "div_"):
        return integer_as(op, "the value", value, dtype)
    info = np.iinfo(dtype)
    low = -info.max if dtype.kind == "u" else info.min        # torch's: an unsigned one takes -max.., wrapped
    if not low <= value <= info.max:
        raise OverflowError(f"{op}: the value {value} does not fit in this {dtype} tensor ({low}..{info.max}); "
                            f"convert the tensor first (t.long())")
    return integer_as(op, "the value", value, dtype)


WRITES = ("fill_", "__setitem__", "copy_")   # the in-place ops that store a value rather than combine with one


def written_as(op: str, array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A value written into a tensor (fill_, t[i] = v, copy_) as torch stores it in one of `dtype`: a float into an
    integer tensor truncated toward zero, any number into a bool one as nonzero. A float that no integer of `dtype`
    holds (NaN, inf, beyond its range) is refused: NumPy stored NaN as -9223372036854775808 (torch refuses fill_'s,
    and stores what the machine gives for copy_'s)."""
    if dtype.kind in "iu" and array.dtype.kind == "f":
        info = np.iinfo(dtype)
        with np.errstate(invalid="ignore"):
            whole = np.trunc(array)
            bad = ~np.isfinite(array) | (whole < info.min) | (whole >= float(info.max) + 1)
        if bad.any():
            value = array.reshape(-1)[np.argmax(bad.reshape(-1))]
            raise OverflowError(f"{op}: the value {value} cannot be stored in this {dtype} tensor (it holds "
                                f"{info.min}..{info.max}); convert the tensor first (t.double())")
        return whole.astype(dtype)
    return array.astype(dtype) if dtype.kind == "b" and array.dtype.kind != "b" else array


def can_store(result: np.dtype, dtype: np.dtype) -> bool:
    """torch's rule for an in-place result stored in a `dtype` tensor: any result but a float in an integer or bool
    tensor, or a number in a bool one (an integer result wraps: uint8.add_(int64 tensor), NumPy's same_kind refused)."""
    return not (result.kind == "f" and dtype.kind in "iub") and not (result.kind != "b" and dtype.kind == "b")


def float_tensor(op: str, argument: str, x) -> Tensor:
    """A tensor argument of an op that only makes sense in floating point: integers become float32."""
    x = as_tensor(op, argument, x)
    return x if is_float(x.dtype) else Tensor(x.data.astype(DEFAULT_FLOAT))


def constant_array(op: str, argument: str, x, kinds: str = "iu", what: str = "integers") -> np.ndarray:
    """An argument that is not differentiated (ids, targets, a mask): its array, holding `what`
    (dtype kinds `kinds`: "iu" integers, "b" bools)."""
    if isinstance(x, Tensor):
        array = x.data
    elif isinstance(x, (np.ndarray, list, tuple, int, bool, np.generic)):
        try:
            array = np.asarray(x)
        except ValueError:
            raise TypeError(f"{op}: {argument} is a ragged nested list (rows of different lengths), "
                            f"not an array of {what}") from None
    else:
        raise TypeError(f"{op}: {argument} must be a tensor or an array of {what}, got {_describe(x)}")
    if array.dtype.kind not in kinds:
        raise TypeError(f"{op}: {argument} must hold {what}, got dtype {array.dtype}")
    return array


def tensor_list(op: str, tensors) -> list[Tensor]:
    """The `tensors` argument of cat and stack: a list or tuple (not a tensor, which would be cut into rows)."""
    if isinstance(tensors, Tensor) or not isinstance(tensors, (list, tuple)):
        raise TypeError(f"{op}: tensors must be a list or tuple of tensors, got {_describe(tensors)}")
    return [as_tensor(op, f"tensors[{i}]", t) for i, t in enumerate(tensors)]


def number(op: str, argument: str, value, allow_none: bool = False):
    """A Python or NumPy real number (a bound, a beta, an eps, a fill value), returned as a Python int or float:
    a NumPy float64 scalar would widen a float32 tensor it meets, where a Python number never does."""
    if value is None and allow_none:
        return None
    if not is_real_number(value):
        raise TypeError(f"{op}: {argument} must be a real number{' or None' if allow_none else ''}, "
                        f"got {_describe(value)}")
    return int(value) if isinstance(value, (int, np.integer)) else float(value)


def is_real_number(value) -> bool:
    """A Python or NumPy int or float (not a bool): an operand that takes the dtype of the tensor it meets."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def is_integer(value) -> bool:
    """A Python or NumPy int (not a bool): a size, a step, a count."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def flag(op: str, argument: str, value) -> bool:
    """A switch such as keepdims: a bool (NumPy would take "no" as true and a str as an axis count)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{op}: {argument} must be True or False, got {_describe(value)}")
    return bool(value)


def integer(op: str, argument: str, value) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{op}: {argument} must be an int, got {_describe(value)}")
    return int(value)


def one_or_many(sizes: tuple) -> tuple:
    """x.reshape(2, 3) and x.reshape((2, 3)) (or [2, 3]) mean the same, as in torch: the sizes as one tuple."""
    return tuple(sizes[0]) if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)) else sizes


def int_sequence(op: str, argument: str, values, shape: tuple = ()) -> tuple:
    """A shape, a permutation or pad widths: an int or a sequence of ints."""
    if isinstance(values, (int, np.integer)) and not isinstance(values, (bool, np.bool_)):
        return (int(values),)
    if isinstance(values, np.ndarray) and values.ndim == 1 and values.dtype.kind in "iu":
        values = values.tolist()
    if isinstance(values, Tensor) or not isinstance(values, (list, tuple)) or not builtins.all(
            isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) for v in values):
        raise TypeError(f"{op}: {argument} must be a tuple of ints, got {_describe(values)} "
                        f"(tensor of shape {tuple(shape)})")
    return tuple(int(v) for v in values)


def axis(op: str, axis, ndim: int, shape: tuple = ()) -> int:
    """One axis, negative allowed, normalised to 0..ndim-1. `shape` is the tensor's, for the error message
    (ndim may be one more, for unsqueeze and stack). A 0-d tensor takes axis 0 or -1, as torch."""
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise TypeError(f"{op}: axis must be an int, got {axis!r} (tensor of shape {tuple(shape)})")
    if not -builtins.max(ndim, 1) <= axis < builtins.max(ndim, 1):
        raise IndexError(f"{op}: axis {axis} is out of range for a tensor of shape {tuple(shape)} "
                         f"(valid: {-builtins.max(ndim, 1)} to {builtins.max(ndim, 1) - 1})")
    return int(axis) % builtins.max(ndim, 1)


def axes(op: str, axis_argument, ndim: int, shape: tuple = ()):
    """None -> None (all axes); an int or a sequence -> a sorted tuple of non-negative axes."""
    if axis_argument is None:
        return None
    listed = tuple(axis_argument) if isinstance(axis_argument, (tuple, list)) else (axis_argument,)
    normalised = tuple(sorted(axis(op, a, ndim, shape) for a in listed))
    if len(set(normalised)) != len(normalised):
        raise ValueError(f"{op}: axis {axis_argument} repeats an axis (tensor of shape {tuple(shape)})")
    return normalised if ndim else ()  # reducing a 0-d tensor over its axis 0 / -1 leaves it as is (torch)


def reduced_axes(op: str, axis_argument, ndim: int, shape: tuple = ()):
    """A reduction's axes: as `axes`, except that no axes (dim=() or dim=[]) reduce every axis, as torch's
    sum(x, dim=()) does (NumPy's sum(x, axis=()) reduces none)."""
    if isinstance(axis_argument, (tuple, list)) and not axis_argument:
        return None
    return axes(op, axis_argument, ndim, shape)


def nonempty_reduction(op: str, x: Tensor, reduced) -> None:
    """max and the like have no value over no elements (torch: 'Expected reduction dim to have non-zero
    size'); a reduction over non-empty axes of an empty tensor is fine (an empty result)."""
    sizes = x.shape if reduced is None else [x.shape[a] for a in reduced]
    if x.ndim and 0 in sizes:
        where = "the tensor" if reduced is None else f"axis {[a for a in reduced if x.shape[a] == 0][0]}"
        raise ValueError(f"{op}: {where} of shape {x.shape} is empty, and {op} of no elements is undefined; "
                         f"reduce over a non-empty axis (axis=...) or check the input's size")


def parse_einsum(subscripts: str, shapes):
    """'...ij,jk->...ik' and the operands' shapes -> (['Aij', 'jk'], 'Aik'): ellipses spelled out with
    spare letters, the implicit output (letters used once, alphabetical) made explicit."""
    if not isinstance(subscripts, str):
        raise TypeError(f"einsum: subscripts must be a str such as 'ij,jk->ik', got {_describe(subscripts)}")
    text = subscripts.replace(" ", "")
    inputs, arrow, output = text.partition("->")
    input_specs = inputs.split(",")
    if len(input_specs) != len(shapes):
        raise ValueError(f"einsum: {subscripts!r} names {len(input_specs)} operands, got {len(shapes)}")
    used = set(c for c in text if c.isalpha())
    spare = iter(c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz" if c not in used)
    ellipsis_ndim = builtins.max([len(s) - (len(spec) - 3) for spec, s in zip(input_specs, shapes) if "..." in spec],
                                 default=0)
    ellipsis_letters = "".join(next(spare) for _ in range(ellipsis_ndim))
    expanded = []
    for spec, shape in zip(input_specs, shapes):
        if "..." in spec:
            n = len(shape) - (len(spec) - 3)
            spec = spec.replace("...", ellipsis_letters[len(ellipsis_letters) - n:] if n else "")
        if len(spec) != len(shape) or not (spec.isalpha() or spec == ""):  # "" is a 0-d operand
            raise ValueError(f"einsum: subscripts {spec!r} don't fit an operand of shape {tuple(shape)}")
        if len(set(spec)) != len(spec):
            raise ValueError(f"einsum: repeated letter in {spec!r} (diagonals) is not supported")
        expanded.append(spec)
    if arrow:
        output = output.replace("...", ellipsis_letters)
    else:
        counts = {c: "".join(expanded).count(c) for c in set("".join(expanded))}
        once = sorted(c for c, n in counts.items() if n == 1 and c not in ellipsis_letters)
        output = ellipsis_letters + "".join(once)
    if not set(output) <= set("".join(expanded)) or len(set(output)) != len(output):
        raise ValueError(f"einsum: output {output!r} of {subscripts!r} must use each input letter at most once")
    return expanded, output


_BOOL_MISMATCH = re.compile(r"boolean index did not match indexed array along (?:axis|dimension) (\d+); "
                            r"(?:size|dimension) of axis is (\d+) but size of corresponding boolean (?:axis|dimension) "
                            r"is (\d+)")
_TOO_MANY = re.compile(r"too many indices for array: array is (\d+)-dimensional, but (\d+) were indexed")


def index_error(op: str, error: IndexError, shape, index) -> IndexError:
    """NumPy's IndexError for x[index] reworded to name the op and the shapes (NumPy names neither the
    tensor's shape nor the boolean mask's)."""
    shape = tuple(shape)
    message = str(error)
    if m := _BOOL_MISMATCH.search(message):
        items = index if isinstance(index, tuple) else (index,)
        masks = [np.shape(i) for i in items if isinstance(i, np.ndarray) and i.dtype == np.bool_]
        mask = f"a boolean index of shape {masks[0]}" if masks else "a boolean index"
        return IndexError(f"{op}: {mask} does not match axis {m.group(1)} of size {m.group(2)} (its size there is "
                          f"{m.group(3)}; tensor of shape {shape})")
    if m := _TOO_MANY.search(message):
        return IndexError(f"{op}: {m.group(2)} indices for a tensor of shape {shape} ({m.group(1)} dimensions)")
    return IndexError(f"{op}: {message} (tensor of shape {shape})")
