"""The public ops, named as PyTorch names them. Each checks its arguments (a bad shape, axis or index is
an error that names the op and the shapes), turns Python numbers and arrays into tensors, and calls the
op's `Function` in `tinygrad_ssm/ops/`, where the forward and the backward live side by side."""
from __future__ import annotations

import builtins
import numbers

import numpy as np

from .ops import elementwise as E
from .ops import linalg as L
from .ops import movement as M
from .ops import nn as N
from .ops import reduce as R
from .tensor import DEFAULT_FLOAT, Tensor, is_float

# Every differentiable op; tests/test_ops_grad.py fails if one of these has no gradient check.
OPS = (
    "add", "sub", "mul", "div", "neg", "pow", "exp", "log", "sqrt", "rsqrt", "abs", "tanh", "sigmoid", "silu",
    "softplus", "relu", "maximum", "minimum", "clip", "where", "cast",
    "sum", "mean", "max", "logsumexp", "softmax", "log_softmax", "cross_entropy", "cumsum",
    "matmul", "einsum",
    "reshape", "flatten", "permute", "transpose", "expand", "unsqueeze", "squeeze", "getitem", "cat", "stack",
    "split", "pad", "flip", "tril", "triu",
    "embedding", "causal_conv1d", "rms_norm",
)


# --- argument helpers ------------------------------------------------------------------------------------

def _shape_text(*tensors) -> str:
    return " and ".join(str(tuple(t.shape)) for t in tensors)


def _as_tensor(x, like: Tensor | None = None) -> Tensor:
    """A Python number takes the dtype of the tensor it meets (a scalar never upcasts float32);
    an array or list becomes a tensor of its own dtype."""
    if isinstance(x, Tensor):
        return x
    if isinstance(x, numbers.Number) and not isinstance(x, bool) or isinstance(x, np.generic):
        if like is not None and is_float(like.dtype):
            return Tensor(np.asarray(x, dtype=like.dtype))
        is_integral = isinstance(x, numbers.Integral) or np.issubdtype(type(x), np.integer)
        return Tensor(np.asarray(x, dtype=np.int64 if is_integral else DEFAULT_FLOAT))
    return Tensor(x)


def _binary(op: str, fn, a, b):
    like = a if isinstance(a, Tensor) else b if isinstance(b, Tensor) else None
    a, b = _as_tensor(a, like), _as_tensor(b, like)
    try:
        np.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        raise ValueError(f"{op}: shapes {_shape_text(a, b)} do not broadcast") from None
    # an integer tensor meeting a float one takes its dtype (torch's rule; NumPy would give float64)
    if is_float(a.dtype) and not is_float(b.dtype):
        b = Tensor(b.data.astype(a.dtype))
    elif is_float(b.dtype) and not is_float(a.dtype):
        a = Tensor(a.data.astype(b.dtype))
    return fn.apply(a, b)


def _float_input(op: str, x) -> Tensor:
    x = _as_tensor(x)
    if not is_float(x.dtype):
        x = Tensor(x.data.astype(DEFAULT_FLOAT))
    return x


def _axis(op: str, axis: int, ndim: int, shape: tuple = ()) -> int:
    """`shape` is the tensor's, for the error message (ndim may be one more, for unsqueeze and stack)."""
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise TypeError(f"{op}: axis must be an int, got {axis!r} (tensor of shape {tuple(shape)})")
    if not -builtins.max(ndim, 1) <= axis < builtins.max(ndim, 1):  # a 0-d tensor takes axis 0 or -1, as torch
        raise IndexError(f"{op}: axis {axis} is out of range for a tensor of shape {tuple(shape)} "
                         f"(valid: {-builtins.max(ndim, 1)} to {builtins.max(ndim, 1) - 1})")
    return int(axis) % builtins.max(ndim, 1)


def _axes(op: str, axis, ndim: int, shape: tuple = ()):
    """None -> None (all axes); an int or a sequence -> a sorted tuple of non-negative axes."""
    if axis is None:
        return None
    axes = tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)
    normalised = tuple(sorted(_axis(op, a, ndim, shape) for a in axes))
    if len(set(normalised)) != len(normalised):
        raise ValueError(f"{op}: axis {axis} repeats an axis (tensor of shape {tuple(shape)})")
    return normalised if ndim else ()  # reducing a 0-d tensor over its axis 0 / -1 leaves it as is (torch)


# --- elementwise ----------------------------------------------------------------------------------------

def add(a, b): return _binary("add", E.Add, a, b)
def sub(a, b): return _binary("sub", E.Sub, a, b)
def mul(a, b): return _binary("mul", E.Mul, a, b)
def div(a, b):
    a, b = (v if isinstance(v, numbers.Number) else _float_input("div", v) for v in (a, b))
    return _binary("div", E.Div, a, b)


def pow(a, b): return _binary("pow", E.Pow, a, b)
def maximum(a, b): return _binary("maximum", E.Maximum, a, b)
def minimum(a, b): return _binary("minimum", E.Minimum, a, b)
def neg(x): return E.Neg.apply(_as_tensor(x))
def exp(x): return E.Exp.apply(_float_input("exp", x))
def log(x): return E.Log.apply(_float_input("log", x))
def sqrt(x): return E.Sqrt.apply(_float_input("sqrt", x))
def rsqrt(x): return E.Rsqrt.apply(_float_input("rsqrt", x))
def abs(x): return E.Abs.apply(_as_tensor(x))
def tanh(x): return E.Tanh.apply(_float_input("tanh", x))
def sigmoid(x): return E.Sigmoid.apply(_float_input("sigmoid", x))
def silu(x): return E.Silu.apply(_float_input("silu", x))
def relu(x): return E.Relu.apply(_as_tensor(x))


def softplus(x, beta: float = 1.0, threshold: float = 20.0):
    """log(1 + exp(beta x)) / beta, exactly x where beta x > threshold (as torch.nn.functional.softplus)."""
    return E.Softplus.apply(_float_input("softplus", x), beta=beta, threshold=threshold)


def clip(x, min=None, max=None):
    if min is None and max is None:
        raise ValueError("clip: at least one of min and max must be given")
    return E.Clip.apply(_as_tensor(x), low=min, high=max)


clamp = clip


def where(condition, x, y):
    """Pick x where condition is true, else y; all three broadcast together."""
    condition = condition.data if isinstance(condition, Tensor) else np.asarray(condition)
    if condition.dtype != np.bool_:
        raise TypeError(f"where: condition must be a bool tensor, got dtype {condition.dtype}")
    like = x if isinstance(x, Tensor) else y if isinstance(y, Tensor) else None
    x, y = _as_tensor(x, like), _as_tensor(y, like)
    try:
        np.broadcast_shapes(condition.shape, x.shape, y.shape)
    except ValueError:
        raise ValueError(f"where: condition {condition.shape}, x {x.shape} and y {y.shape} do not broadcast") from None
    if x.dtype != y.dtype:
        dtype = np.result_type(x.dtype, y.dtype)
        x, y = cast(x, dtype), cast(y, dtype)
    return E.Where.apply(condition, x, y)


def cast(x, dtype):
    x = _as_tensor(x)
    dtype = np.dtype(dtype)
    if dtype == x.dtype:
        return x
    if x.requires_grad and not is_float(dtype):
        raise TypeError(f"cast: a tensor that requires grad can't become {dtype}; detach() it first")
    return E.Cast.apply(x, dtype=dtype)


# --- reductions -----------------------------------------------------------------------------------------

def sum(x, axis=None, keepdims=False):
    x = _as_tensor(x)
    return R.Sum.apply(x, axis=_axes("sum", axis, x.ndim, x.shape), keepdims=keepdims)


def mean(x, axis=None, keepdims=False):
    x = _float_input("mean", x)
    return R.Mean.apply(x, axis=_axes("mean", axis, x.ndim, x.shape), keepdims=keepdims)


def max(x, axis=None, keepdims=False):
    x = _as_tensor(x)
    if x.size == 0:
        raise ValueError(f"max: the tensor of shape {x.shape} is empty")
    return R.Max.apply(x, axis=_axes("max", axis, x.ndim, x.shape), keepdims=keepdims)


def logsumexp(x, axis=None, keepdims=False):
    x = _float_input("logsumexp", x)
    return R.LogSumExp.apply(x, axis=_axes("logsumexp", axis, x.ndim, x.shape), keepdims=keepdims)


def softmax(x, axis=-1):
    x = _float_input("softmax", x)
    return R.Softmax.apply(x, axis=_axis("softmax", axis, x.ndim, x.shape))


def log_softmax(x, axis=-1):
    x = _float_input("log_softmax", x)
    return R.LogSoftmax.apply(x, axis=_axis("log_softmax", axis, x.ndim, x.shape))


def cross_entropy(logits, targets, ignore_index: int = -100, reduction: str = "mean"):
    """Negative log-likelihood of integer targets under softmax(logits).
    logits (..., C) float, targets (...) int; rows with target == ignore_index are left out."""
    logits = _as_tensor(logits)
    targets = targets.data if isinstance(targets, Tensor) else np.asarray(targets)
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"cross_entropy: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    if not is_float(logits.dtype) or not np.issubdtype(targets.dtype, np.integer):
        raise TypeError(f"cross_entropy: needs float logits and integer targets, got {logits.dtype} and {targets.dtype}")
    if logits.ndim < 1 or logits.shape[:-1] != targets.shape:
        raise ValueError(f"cross_entropy: logits {logits.shape} need targets of shape {logits.shape[:-1]}, "
                         f"got {targets.shape}")
    classes = logits.shape[-1]
    bad = (targets != ignore_index) & ((targets < 0) | (targets >= classes))
    if bad.any():
        raise IndexError(f"cross_entropy: target {targets[bad][0]} is out of range for {classes} classes "
                         f"(logits {logits.shape}, targets {targets.shape})")
    flat = reshape(logits, (-1, classes))
    losses = R.CrossEntropy.apply(flat, targets.reshape(-1), ignore_index=ignore_index, reduction=reduction)
    return reshape(losses, targets.shape) if reduction == "none" else losses


def cumsum(x, axis):
    x = _as_tensor(x)
    axis = _axis("cumsum", axis, x.ndim, x.shape)
    if x.ndim == 0:  # a 0-d tensor is its own running sum (np.cumsum would make it 1-d)
        return reshape(x, ())
    return R.Cumsum.apply(x, axis=axis)


# --- linear algebra -------------------------------------------------------------------------------------

def matmul(a, b):
    """a @ b with NumPy's rules: 1-d operands are a row / a column, leading (batch) axes broadcast."""
    a, b = _as_tensor(a), _as_tensor(b)
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"matmul: both operands need at least 1 dimension, got shapes {_shape_text(a, b)}")
    a2 = reshape(a, (1, a.shape[0])) if a.ndim == 1 else a
    b2 = reshape(b, (b.shape[0], 1)) if b.ndim == 1 else b
    if a2.shape[-1] != b2.shape[-2]:
        raise ValueError(f"matmul: inner dimensions differ: {tuple(a.shape)} @ {tuple(b.shape)}")
    try:
        batch = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    except ValueError:
        raise ValueError(f"matmul: batch dimensions of {tuple(a.shape)} @ {tuple(b.shape)} do not broadcast") from None
    if a2.dtype != b2.dtype:
        dtype = np.result_type(a2.dtype, b2.dtype)
        a2, b2 = cast(a2, dtype), cast(b2, dtype)
    out = L.Matmul.apply(a2, b2)
    if a.ndim == 1 or b.ndim == 1:
        shape = batch + ((a2.shape[-2],) if a.ndim > 1 else ()) + ((b2.shape[-1],) if b.ndim > 1 else ())
        out = reshape(out, shape)
    return out


def einsum(subscripts: str, *operands):
    """np.einsum over tensors, differentiable in every operand. Ellipses and implicit outputs are
    allowed; a letter repeated inside one operand (a diagonal) is not."""
    operands = [_as_tensor(o) for o in operands]
    input_specs, output_spec = L.parse_einsum(subscripts, [o.shape for o in operands])
    sizes = {}
    for spec, o in zip(input_specs, operands):
        for letter, n in zip(spec, o.shape):
            if sizes.get(letter, 1) not in (1, n) and n != 1:
                raise ValueError(f"einsum: '{letter}' has sizes {sizes[letter]} and {n} in {subscripts!r} "
                                 f"for shapes {_shape_text(*operands)}")
            sizes[letter] = builtins.max(sizes.get(letter, 1), n)
    return L.Einsum.apply(*operands, input_specs=tuple(input_specs), output_spec=output_spec)


# --- shape ----------------------------------------------------------------------------------------------

def reshape(x, shape):
    x = _as_tensor(x)
    shape = tuple(int(s) for s in ((shape,) if isinstance(shape, (int, np.integer)) else shape))
    known = int(np.prod([s for s in shape if s != -1]))
    if shape.count(-1) > 1 or (-1 not in shape and known != x.size) or (-1 in shape and (known == 0 or x.size % known)):
        raise ValueError(f"reshape: can't reshape a tensor of shape {x.shape} ({x.size} elements) into {shape}")
    return M.Reshape.apply(x, shape=shape)


def flatten(x, start=0, end=-1):
    x = _as_tensor(x)
    if x.ndim == 0:
        return reshape(x, (1,))
    start, end = _axis("flatten", start, x.ndim, x.shape), _axis("flatten", end, x.ndim, x.shape)
    return reshape(x, x.shape[:start] + (-1,) + x.shape[end + 1:])


def permute(x, axes):
    x = _as_tensor(x)
    axes = tuple(_axis("permute", a, x.ndim, x.shape) for a in axes)
    if sorted(axes) != list(range(x.ndim)):
        raise ValueError(f"permute: {axes} is not a permutation of the axes of a tensor of shape {x.shape}")
    return M.Permute.apply(x, axes=axes)


def transpose(x, axis0=-2, axis1=-1):
    x = _as_tensor(x)
    axes = list(range(x.ndim))
    i, j = _axis("transpose", axis0, x.ndim, x.shape), _axis("transpose", axis1, x.ndim, x.shape)
    axes[i], axes[j] = axes[j], axes[i]
    return M.Permute.apply(x, axes=tuple(axes))


def expand(x, shape):
    """broadcast_to; -1 keeps a size."""
    x = _as_tensor(x)
    shape = tuple(shape)
    lead = len(shape) - x.ndim
    if lead < 0:
        raise ValueError(f"expand: can't expand shape {x.shape} to fewer dimensions {shape}")
    shape = tuple(x.shape[i - lead] if s == -1 and i >= lead else s for i, s in enumerate(shape))
    if not _broadcasts(x.shape, shape) or np.broadcast_shapes(x.shape, shape) != shape:
        raise ValueError(f"expand: shape {x.shape} can't be broadcast to {shape}")
    return M.Expand.apply(x, shape=shape)


broadcast_to = expand


def _broadcasts(shape, target) -> bool:
    try:
        np.broadcast_shapes(shape, target)
        return True
    except ValueError:
        return False


def unsqueeze(x, axis):
    x = _as_tensor(x)
    axis = _axis("unsqueeze", axis, x.ndim + 1, x.shape)
    return reshape(x, x.shape[:axis] + (1,) + x.shape[axis:])


def squeeze(x, axis=None):
    x = _as_tensor(x)
    axes = (_axes("squeeze", axis, x.ndim, x.shape) if axis is not None
            else tuple(i for i, n in enumerate(x.shape) if n == 1))
    return reshape(x, tuple(n for i, n in enumerate(x.shape) if not (i in axes and n == 1)))


def getitem(x, index):
    """x[index]: ints, slices, None, Ellipsis, integer arrays/tensors and bool masks, as NumPy."""
    x = _as_tensor(x)
    items = index if isinstance(index, tuple) else (index,)
    items = tuple(np.asarray(i.data if isinstance(i, Tensor) else i) if isinstance(i, (Tensor, list)) else i
                  for i in items)
    for i in items:
        if isinstance(i, np.ndarray) and not (np.issubdtype(i.dtype, np.integer) or i.dtype == np.bool_):
            raise IndexError(f"getitem: index arrays must be integers or bools, got dtype {i.dtype}")
    index = items if isinstance(index, tuple) else items[0]
    try:
        x.data[index]  # let NumPy validate the index before anything is recorded
    except IndexError as e:
        raise IndexError(f"getitem: {e} (tensor of shape {x.shape})") from None
    return M.Getitem.apply(x, index=index)


def cat(tensors, axis=0):
    tensors = [_as_tensor(t) for t in tensors]
    if not tensors:
        raise ValueError("cat: needs at least one tensor")
    axis = _axis("cat", axis, tensors[0].ndim, tensors[0].shape)
    first = tensors[0].shape
    for t in tensors[1:]:
        if t.ndim != len(first) or t.shape[:axis] + t.shape[axis + 1:] != first[:axis] + first[axis + 1:]:
            raise ValueError(f"cat: shapes {_shape_text(*tensors)} differ outside axis {axis}")
    return M.Cat.apply(*_same_dtype(tensors), axis=axis)


concatenate = cat


def stack(tensors, axis=0):
    tensors = [_as_tensor(t) for t in tensors]
    if not tensors or any(t.shape != tensors[0].shape for t in tensors):
        raise ValueError(f"stack: needs tensors of one shape, got {_shape_text(*tensors) or 'none'}")
    return M.Stack.apply(*_same_dtype(tensors), axis=_axis("stack", axis, tensors[0].ndim + 1, tensors[0].shape))


def _same_dtype(tensors):
    dtype = np.result_type(*[t.dtype for t in tensors])
    return [cast(t, dtype) for t in tensors]


def split(x, split_size_or_sections, axis=0):
    """torch.split: an int gives pieces of that size (the last may be smaller); a list gives those sizes."""
    x = _as_tensor(x)
    axis = _axis("split", axis, x.ndim, x.shape)
    n = x.shape[axis]
    if isinstance(split_size_or_sections, (int, np.integer)):
        if split_size_or_sections <= 0:
            raise ValueError(f"split: size must be positive, got {split_size_or_sections}")
        sizes = [builtins.min(split_size_or_sections, n - s) for s in range(0, n, split_size_or_sections)]
    else:
        sizes = list(split_size_or_sections)
        if builtins.sum(sizes) != n or builtins.min(sizes, default=0) < 0:
            raise ValueError(f"split: sizes {sizes} don't add up to {n}, the size of axis {axis} of {x.shape}")
    pieces, start = [], 0
    for size in sizes:
        index = (slice(None),) * axis + (slice(start, start + size),)
        pieces.append(getitem(x, index))
        start += size
    return tuple(pieces)


def pad(x, pad, value=0.0):
    """torch.nn.functional.pad, constant mode: pad = (last_before, last_after, second_last_before, ...)."""
    x = _as_tensor(x)
    pad = tuple(int(p) for p in pad)
    if len(pad) % 2 or len(pad) // 2 > x.ndim or builtins.min(pad, default=0) < 0:
        raise ValueError(f"pad: {pad} must be non-negative pairs for at most {x.ndim} axes of shape {x.shape}")
    widths = [(0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        widths[x.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    return M.Pad.apply(x, widths=tuple(widths), value=value)


def flip(x, axis):
    x = _as_tensor(x)
    return M.Flip.apply(x, axis=_axes("flip", axis, x.ndim, x.shape))


def tril(x, k=0):
    x = _as_tensor(x)
    if x.ndim < 2:
        raise ValueError(f"tril: needs at least 2 dimensions, got shape {x.shape}")
    return M.Triangle.apply(x, k=k, lower=True)


def triu(x, k=0):
    x = _as_tensor(x)
    if x.ndim < 2:
        raise ValueError(f"triu: needs at least 2 dimensions, got shape {x.shape}")
    return M.Triangle.apply(x, k=k, lower=False)


# --- layers' building blocks ----------------------------------------------------------------------------

def embedding(ids, weight):
    """torch.nn.functional.embedding: rows of weight (V, d) picked by integer ids (...) -> (..., d)."""
    ids = ids.data if isinstance(ids, Tensor) else np.asarray(ids)
    weight = _as_tensor(weight)
    if not np.issubdtype(ids.dtype, np.integer):
        raise TypeError(f"embedding: ids must be integers, got dtype {ids.dtype}")
    if weight.ndim != 2:
        raise ValueError(f"embedding: weight must be (vocab, dim), got shape {weight.shape}")
    if ids.size and (ids.min() < 0 or ids.max() >= weight.shape[0]):
        raise IndexError(f"embedding: ids must be in [0, {weight.shape[0]}) for weight of shape {weight.shape}, "
                         f"got min {ids.min()} max {ids.max()} (ids of shape {ids.shape})")
    return N.Embedding.apply(weight, ids)


def causal_conv1d(x, weight, bias=None):
    """Depthwise causal conv over time, channels last. x (b, l, c); weight (c, 1, k) as in PyTorch's
    Conv1d(groups=c) or (c, k); bias (c,) or None. Output (b, l, c): step t sees steps t-k+1..t."""
    x, weight = _as_tensor(x), _as_tensor(weight)
    given_weight_shape = weight.shape  # for the error message, before the (c, 1, k) -> (c, k) reshape
    if weight.ndim == 3 and weight.shape[1] == 1:
        weight = reshape(weight, (weight.shape[0], weight.shape[2]))
    if x.ndim != 3 or weight.ndim != 2 or weight.shape[0] != x.shape[2]:
        raise ValueError(f"causal_conv1d: need x (b, l, c) and weight (c, 1, k) or (c, k) with the same c, "
                         f"got x {x.shape} and weight {given_weight_shape}")
    if bias is not None:
        bias = _as_tensor(bias)
        if bias.shape != (x.shape[2],):
            raise ValueError(f"causal_conv1d: bias must have shape ({x.shape[2]},), got {bias.shape}")
        return N.CausalConv1d.apply(x, weight, bias)
    return N.CausalConv1d.apply(x, weight)


def rms_norm(x, weight=None, eps: float = 1e-5):
    """x / sqrt(mean(x^2, last axis) + eps) * weight; weight (d,) or None."""
    x = _float_input("rms_norm", x)
    if weight is not None:
        weight = _as_tensor(weight)
        if weight.shape != x.shape[-1:]:
            raise ValueError(f"rms_norm: weight must have shape {x.shape[-1:]}, got {weight.shape}")
        return N.RMSNorm.apply(x, weight, eps=eps)
    return N.RMSNorm.apply(x, eps=eps)
