"""The public ops, named as PyTorch names them. Each checks its arguments (a bad shape, axis or index is
an error that names the op and the shapes), turns Python numbers and arrays into tensors, and calls the
op's `Function` in `tinygrad_ssm/autograd/ops/`, where the forward and the backward live side by side."""
from __future__ import annotations

import builtins

import numpy as np

from . import args as A
from . import indexing as I
from .ops import elementwise as E
from .ops import linalg as L
from .ops import movement as M
from .ops import reduce as R
from .dtypes import is_float, promoted
from .tensor import DEFAULT_FLOAT, Tensor
from .torch_names import torch_names

# Every differentiable op, by name, in the order defined below: `@op` adds a function here. Each one has an
# entry in tests/support/op_specs.py, the table every op test reads (its completeness test fails otherwise).
OPS: list[str] = []


def op(fn):
    """Register a public differentiable op (see OPS). It takes torch's names for its axis arguments too (dim=,
    keepdim=, ...: torch_names)."""
    OPS.append(fn.__name__)
    return torch_names(fn)


def _binary(op_name: str, fn, a, b, floats_only: bool = False):
    """A binary op's checks and dtype rules; `floats_only`: operands that meet in an integer or bool dtype are
    float32 (true division, as torch)."""
    like = a if isinstance(a, Tensor) else b if isinstance(b, Tensor) else None
    a, b = A.as_tensor(op_name, "a", a, like), A.as_tensor(op_name, "b", b, like)
    A.broadcast_shape(op_name, f"shapes {A.shape_text(a, b)}", a.shape, b.shape)
    a, b = _meet(a, b)
    if floats_only and not is_float(a.dtype):
        a, b = cast(a, DEFAULT_FLOAT), cast(b, DEFAULT_FLOAT)
    return fn.apply(a, b)


def _meet(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """Two operands in the dtype torch gives their result: a number or 0-d tensor never widens a tensor of its
    kind (float32 with a 0-d float64 stays float32); an integer tensor meeting a float one takes its dtype."""
    if is_float(a.dtype) != is_float(b.dtype):
        dtype = promoted(a.dtype, b.dtype)
        return tuple(t if t.dtype == dtype else Tensor(t.data.astype(dtype)) for t in (a, b))
    if a.dtype != b.dtype and (a.ndim == 0) != (b.ndim == 0) and (a.dtype.kind == "b") == (b.dtype.kind == "b"):
        return (cast(a, b.dtype), b) if a.ndim == 0 else (a, cast(b, a.dtype))
    return a, b


# --- elementwise ----------------------------------------------------------------------------------------

@op
def add(a, b): return _binary("add", E.Add, a, b)
@op
def sub(a, b): return _binary("sub", E.Sub, a, b)
@op
def mul(a, b): return _binary("mul", E.Mul, a, b)


@op
def div(a, b):
    """True division: the operands meet as for any binary op (torch's rule), then a result that would be an integer
    or a bool is float32 (int / int, as torch). Casting each integer operand to float32 first gave an int64 tensor
    over a 0-d float64 one float32 (torch: float64) and an int over a float16 float32 (torch: float16)."""
    return _binary("div", E.Div, a, b, floats_only=True)


@op
def pow(a, b): return _binary("pow", E.Pow, a, b)
@op
def maximum(a, b): return _binary("maximum", E.Maximum, a, b)
@op
def minimum(a, b): return _binary("minimum", E.Minimum, a, b)
@op
def neg(x): return E.Neg.apply(A.as_tensor("neg", "x", x))
@op
def exp(x): return E.Exp.apply(A.float_tensor("exp", "x", x))
@op
def log(x): return E.Log.apply(A.float_tensor("log", "x", x))
@op
def sqrt(x): return E.Sqrt.apply(A.float_tensor("sqrt", "x", x))
@op
def rsqrt(x): return E.Rsqrt.apply(A.float_tensor("rsqrt", "x", x))
@op
def abs(x): return E.Abs.apply(A.as_tensor("abs", "x", x))
@op
def tanh(x): return E.Tanh.apply(A.float_tensor("tanh", "x", x))
@op
def sigmoid(x): return E.Sigmoid.apply(A.float_tensor("sigmoid", "x", x))
@op
def silu(x): return E.Silu.apply(A.float_tensor("silu", "x", x))
@op
def relu(x): return E.Relu.apply(A.as_tensor("relu", "x", x))


@op
def softplus(x, beta: float = 1.0, threshold: float = 20.0):
    """log(1 + exp(beta x)) / beta, exactly x where beta x > threshold (as torch.nn.functional.softplus)."""
    beta, threshold = A.number("softplus", "beta", beta), A.number("softplus", "threshold", threshold)
    return E.Softplus.apply(A.float_tensor("softplus", "x", x), beta=beta, threshold=threshold)



@op
def clip(x, min=None, max=None):
    min, max = A.number("clip", "min", min, allow_none=True), A.number("clip", "max", max, allow_none=True)
    if min is None and max is None:
        raise ValueError("clip: at least one of min and max must be given")
    x = A.as_tensor("clip", "x", x)
    if not is_float(x.dtype) and builtins.any(isinstance(bound, float) for bound in (min, max)):
        x = cast(x, DEFAULT_FLOAT)  # torch: an integer tensor clamped to a float bound is float32, as in x + 0.5
    return E.Clip.apply(x, low=min, high=max)


clamp = clip


@op
def where(condition, x, y):
    """Pick x where condition is true, else y; all three broadcast together."""
    condition = A.constant_array("where", "condition", condition, kinds="b", what="bools")
    like = x if isinstance(x, Tensor) else y if isinstance(y, Tensor) else None
    x, y = A.as_tensor("where", "x", x, like), A.as_tensor("where", "y", y, like)
    A.broadcast_shape("where", f"condition {condition.shape}, x {x.shape} and y {y.shape}", condition.shape, x.shape,
                      y.shape)
    x, y = _meet(x, y)
    if x.dtype != y.dtype:  # Where takes one dtype (NumPy's ufuncs meet the others' on their own)
        dtype = promoted(x.dtype, y.dtype)
        x, y = cast(x, dtype), cast(y, dtype)
    return E.Where.apply(condition, x, y)


@op
def cast(x, dtype):
    x = A.as_tensor("cast", "x", x)
    try:
        dtype = np.dtype(dtype) if dtype is not None else None
    except TypeError:
        dtype = None
    if dtype is None or dtype.kind not in "biuf":
        raise TypeError(f"cast: dtype must be a bool, integer or float NumPy dtype (np.float32, 'int64', ...), "
                        f"got {dtype!r}" if dtype is not None else "cast: dtype must be a bool, integer or float "
                        "NumPy dtype (np.float32, 'int64', ...), got None or an unknown name")
    if dtype == x.dtype:
        return x
    if not is_float(dtype):  # as torch's x.long(): no gradient reaches an integer or bool, so the graph ends here
        x = x.detach()
    return E.Cast.apply(x, dtype=dtype)


# --- reductions -----------------------------------------------------------------------------------------

@op
def sum(x, axis=None, keepdims=False):
    x = A.as_tensor("sum", "x", x)
    axis = A.reduced_axes("sum", axis, x.ndim, x.shape)
    return R.Sum.apply(x, axis=axis, keepdims=A.flag("sum", "keepdims", keepdims))


@op
def mean(x, axis=None, keepdims=False):
    """The mean over no elements is nan, as torch."""
    x = A.float_tensor("mean", "x", x)
    axis = A.reduced_axes("mean", axis, x.ndim, x.shape)
    return R.Mean.apply(x, axis=axis, keepdims=A.flag("mean", "keepdims", keepdims))


@op
def max(x, axis=None, keepdims=False): return _extreme("max", R.Max, x, axis, keepdims)
@op
def min(x, axis=None, keepdims=False): return _extreme("min", R.Min, x, axis, keepdims)


def _extreme(name: str, function: type, x, axis, keepdims):
    """max and min: NumPy's, torch's amax and amin (the values only; the indices are argmax's and argmin's)."""
    x = A.as_tensor(name, "x", x)
    axis = A.reduced_axes(name, axis, x.ndim, x.shape)
    A.nonempty_reduction(name, x, axis)
    return function.apply(x, axis=axis, keepdims=A.flag(name, "keepdims", keepdims))


@torch_names
def amax(x, axis=None, keepdims=False):
    """torch.amax: max under the name that takes dim= (max refuses it: torch.max(x, dim) gives (values, indices))."""
    return max(x, axis, keepdims)


@torch_names
def amin(x, axis=None, keepdims=False):
    """torch.amin: min under the name that takes dim= (see amax)."""
    return min(x, axis, keepdims)


@op
def logsumexp(x, axis=None, keepdims=False):
    """-inf over no elements (log of an empty sum), as torch."""
    x = A.float_tensor("logsumexp", "x", x)
    axis = A.reduced_axes("logsumexp", axis, x.ndim, x.shape)
    return R.LogSumExp.apply(x, axis=axis, keepdims=A.flag("logsumexp", "keepdims", keepdims))


@op
def softmax(x, axis=-1):
    x = A.float_tensor("softmax", "x", x)
    return R.Softmax.apply(x, axis=A.axis("softmax", axis, x.ndim, x.shape))


@op
def log_softmax(x, axis=-1):
    x = A.float_tensor("log_softmax", "x", x)
    return R.LogSoftmax.apply(x, axis=A.axis("log_softmax", axis, x.ndim, x.shape))


@op
def cumsum(x, axis):
    x = A.as_tensor("cumsum", "x", x)
    axis = A.axis("cumsum", axis, x.ndim, x.shape)
    if x.ndim == 0:  # a 0-d tensor is its own running sum (np.cumsum would make it 1-d): a new one, in sum's dtype
        return reshape(R.Cumsum.apply(reshape(x, (1,)), axis=0), ())
    return R.Cumsum.apply(x, axis=axis)


# --- linear algebra -------------------------------------------------------------------------------------

@op
def matmul(a, b):
    """a @ b with NumPy's rules: 1-d operands are a row / a column, leading (batch) axes broadcast."""
    return apply_matmul(L.Matmul, a, b)


def apply_matmul(function: type, a, b):
    """matmul's checks and reshapes around `function`: L.Matmul or a twin of it (e.g. fast/products.py's)."""
    a, b = A.as_tensor("matmul", "a", a), A.as_tensor("matmul", "b", b)
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"matmul: both operands need at least 1 dimension, got shapes {A.shape_text(a, b)}")
    a2 = reshape(a, (1, a.shape[0])) if a.ndim == 1 else a
    b2 = reshape(b, (b.shape[0], 1)) if b.ndim == 1 else b
    if a2.shape[-1] != b2.shape[-2]:
        raise ValueError(f"matmul: inner dimensions differ: {tuple(a.shape)} @ {tuple(b.shape)}")
    batch = A.broadcast_shape("matmul", f"batch dimensions of {A.shape_text(a, b)}", a2.shape[:-2], b2.shape[:-2])
    if a2.dtype != b2.dtype:
        dtype = promoted(a2.dtype, b2.dtype)
        a2, b2 = cast(a2, dtype), cast(b2, dtype)
    out = function.apply(a2, b2)
    if a.ndim == 1 or b.ndim == 1:
        shape = batch + ((a2.shape[-2],) if a.ndim > 1 else ()) + ((b2.shape[-1],) if b.ndim > 1 else ())
        out = reshape(out, shape)
    return out


@op
def einsum(subscripts: str, *operands):
    """np.einsum over tensors, differentiable in every operand. Ellipses and implicit outputs are
    allowed; a letter repeated inside one operand (a diagonal) is not."""
    operands = [A.as_tensor("einsum", f"operands[{i}]", o) for i, o in enumerate(operands)]
    operands = same_dtype(operands) if operands else operands   # as matmul (np.einsum's own rule widened to float64)
    input_specs, output_spec = A.parse_einsum(subscripts, [o.shape for o in operands])
    sizes = {}
    for spec, o in zip(input_specs, operands):
        for letter, n in zip(spec, o.shape):
            if sizes.get(letter, 1) not in (1, n) and n != 1:
                raise ValueError(f"einsum: '{letter}' has sizes {sizes[letter]} and {n} in {subscripts!r} "
                                 f"for shapes {A.shape_text(*operands)}")
            sizes[letter] = builtins.max(sizes.get(letter, 1), n)
    return L.Einsum.apply(*operands, input_specs=tuple(input_specs), output_spec=output_spec)


# --- shape ----------------------------------------------------------------------------------------------

@op
def reshape(x, shape):
    x = A.as_tensor("reshape", "x", x)
    shape = A.int_sequence("reshape", "shape", shape, x.shape)
    known = int(np.prod([s for s in shape if s != -1]))
    if (shape.count(-1) > 1 or builtins.min(shape, default=0) < -1 or (-1 not in shape and known != x.size)
            or (-1 in shape and (known == 0 or x.size % known))):
        raise ValueError(f"reshape: can't reshape a tensor of shape {x.shape} ({x.size} elements) into {shape}")
    return M.Reshape.apply(x, shape=shape)


@op
def flatten(x, start=0, end=-1):
    x = A.as_tensor("flatten", "x", x)
    if x.ndim == 0:
        return reshape(x, (1,))
    start, end = A.axis("flatten", start, x.ndim, x.shape), A.axis("flatten", end, x.ndim, x.shape)
    if start > end:
        raise ValueError(f"flatten: start axis {start} comes after end axis {end} (tensor of shape {x.shape}); "
                         f"give start <= end")
    merged = int(np.prod(x.shape[start:end + 1]))   # not -1: reshape cannot infer it from a size-0 rest
    return reshape(x, x.shape[:start] + (merged,) + x.shape[end + 1:])


@op
def permute(x, axes):
    x = A.as_tensor("permute", "x", x)
    axes = tuple(A.axis("permute", a, x.ndim, x.shape) for a in A.int_sequence("permute", "axes", axes, x.shape))
    if sorted(axes) != list(range(x.ndim)):
        raise ValueError(f"permute: {axes} is not a permutation of the axes of a tensor of shape {x.shape}")
    return M.Permute.apply(x, axes=axes)


@op
def transpose(x, axis0=-2, axis1=-1):
    x = A.as_tensor("transpose", "x", x)
    axes = list(range(x.ndim))
    i, j = A.axis("transpose", axis0, x.ndim, x.shape), A.axis("transpose", axis1, x.ndim, x.shape)
    if x.ndim:  # a 0-d tensor's axis 0 (or -1) names no axis to swap (torch's rule): the tensor as it is
        axes[i], axes[j] = axes[j], axes[i]
    return M.Permute.apply(x, axes=tuple(axes))


@op
def expand(x, shape):
    """broadcast_to; -1 keeps a size."""
    x = A.as_tensor("expand", "x", x)
    shape = A.int_sequence("expand", "shape", shape, x.shape)
    lead = len(shape) - x.ndim
    if lead < 0:
        raise ValueError(f"expand: can't expand shape {x.shape} to fewer dimensions {shape}")
    shape = tuple(x.shape[i - lead] if s == -1 and i >= lead else s for i, s in enumerate(shape))
    try:
        broadcast = np.broadcast_shapes(x.shape, shape)
    except ValueError:
        broadcast = None
    if broadcast != shape:
        raise ValueError(f"expand: shape {x.shape} can't be broadcast to {shape}")
    return M.Expand.apply(x, shape=shape)


broadcast_to = expand


@op
def unsqueeze(x, axis):
    x = A.as_tensor("unsqueeze", "x", x)
    axis = A.axis("unsqueeze", axis, x.ndim + 1, x.shape)
    return reshape(x, x.shape[:axis] + (1,) + x.shape[axis:])


@op
def squeeze(x, axis=None):
    x = A.as_tensor("squeeze", "x", x)
    axes = (A.axes("squeeze", axis, x.ndim, x.shape) if axis is not None
            else tuple(i for i, n in enumerate(x.shape) if n == 1))
    return reshape(x, tuple(n for i, n in enumerate(x.shape) if not (i in axes and n == 1)))


@op
def getitem(x, index):
    """x[index]: ints, slices, None, Ellipsis, integer arrays/tensors/sequences and bool masks, as torch reads
    them (`indexing.py`: integers apply before index arrays). A bad index is an IndexError, as in NumPy and torch."""
    x = A.as_tensor("getitem", "x", x)
    items = I.index_items(index)
    for i in items:
        if isinstance(i, np.ndarray) and not (np.issubdtype(i.dtype, np.integer) or i.dtype == np.bool_):
            raise IndexError(f"getitem: index arrays must be integers or bools, got dtype {i.dtype}")
    index = items if isinstance(index, tuple) else items[0]
    try:
        x.data[index]  # let NumPy validate the index before anything is recorded
    except IndexError as e:
        raise A.index_error("getitem", e, x.shape, index) from None
    if stages := I.torch_stages(items):
        integers_first, rest = stages
        return M.Getitem.apply(M.Getitem.apply(x, index=integers_first), index=rest)
    return M.Getitem.apply(x, index=index)


@op
def cat(tensors, axis=0):
    tensors = A.tensor_list("cat", tensors)
    if not tensors:
        raise ValueError("cat: needs at least one tensor")
    for i, t in enumerate(tensors):
        if t.ndim == 0:  # torch's rule: a 0-d tensor has no axis to join along
            raise ValueError(f"cat: tensors[{i}] is 0-d and can't be concatenated; use stack, or unsqueeze it first")
    axis = A.axis("cat", axis, tensors[0].ndim, tensors[0].shape)
    first = tensors[0].shape
    for t in tensors[1:]:
        if t.ndim != len(first) or t.shape[:axis] + t.shape[axis + 1:] != first[:axis] + first[axis + 1:]:
            raise ValueError(f"cat: shapes {A.shape_text(*tensors)} differ outside axis {axis}")
    return M.Cat.apply(*same_dtype(tensors), axis=axis)


concatenate = cat


@op
def stack(tensors, axis=0):
    tensors = A.tensor_list("stack", tensors)
    if not tensors or builtins.any(t.shape != tensors[0].shape for t in tensors):
        raise ValueError(f"stack: needs tensors of one shape, got {A.shape_text(*tensors) or 'none'}")
    return M.Stack.apply(*same_dtype(tensors), axis=A.axis("stack", axis, tensors[0].ndim + 1, tensors[0].shape))


def same_dtype(tensors):
    """The tensors cast to the dtype they meet in (dtypes.promoted), for an op that takes one dtype."""
    dtype = promoted(*[t.dtype for t in tensors])
    return [cast(t, dtype) for t in tensors]


@op
def split(x, split_size_or_sections, axis=0):
    """torch.split: an int gives pieces of that size (the last may be smaller); a list gives those sizes."""
    x = A.as_tensor("split", "x", x)
    if x.ndim == 0:
        raise ValueError("split: needs a tensor with at least 1 dimension, got a 0-d tensor")
    axis = A.axis("split", axis, x.ndim, x.shape)
    n = x.shape[axis]
    sizes = A.int_sequence("split", "split_size_or_sections", split_size_or_sections, x.shape)
    if isinstance(split_size_or_sections, (int, np.integer)):
        if split_size_or_sections <= 0:
            raise ValueError(f"split: size must be positive, got {split_size_or_sections}")
        # an empty axis still gives one (empty) piece, as torch
        sizes = [builtins.min(split_size_or_sections, n - s) for s in range(0, n, split_size_or_sections)] or [0]
    elif builtins.sum(sizes) != n or builtins.min(sizes, default=0) < 0:
        raise ValueError(f"split: sizes {list(sizes)} don't add up to {n}, the size of axis {axis} of {x.shape}")
    pieces, start = [], 0
    for size in sizes:
        index = (slice(None),) * axis + (slice(start, start + size),)
        pieces.append(getitem(x, index))
        start += size
    return tuple(pieces)


@op
def pad(x, pad, value=0.0):
    """torch.nn.functional.pad, constant mode: pad = (last_before, last_after, second_last_before, ...)."""
    x = A.as_tensor("pad", "x", x)
    pad = A.int_sequence("pad", "pad", pad, x.shape)
    value = A.number("pad", "value", value)
    if len(pad) % 2 or len(pad) // 2 > x.ndim or builtins.min(pad, default=0) < 0:
        raise ValueError(f"pad: {pad} must be non-negative pairs for at most {x.ndim} axes of shape {x.shape}")
    widths = [(0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        widths[x.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    return M.Pad.apply(x, widths=tuple(widths), value=value)


@op
def flip(x, axis):
    x = A.as_tensor("flip", "x", x)
    return M.Flip.apply(x, axis=A.axes("flip", axis, x.ndim, x.shape))


@op
def tril(x, k=0): return _triangle("tril", x, k, lower=True)
@op
def triu(x, k=0): return _triangle("triu", x, k, lower=False)


def _triangle(name: str, x, k, lower: bool):
    x = A.as_tensor(name, "x", x)
    if x.ndim < 2:
        raise ValueError(f"{name}: needs at least 2 dimensions, got shape {x.shape}")
    return M.Triangle.apply(x, k=A.integer(name, "k", k), lower=lower)


from .functional_nn import (apply_cross_entropy, apply_embedding, causal_conv1d, cross_entropy,  # noqa: E402,F401
                            embedding, rms_norm)  # the layers' ops, made of this module's (they import it)
