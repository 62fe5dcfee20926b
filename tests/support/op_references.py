"""Expected values of the ops, written from their textbook definitions for tests/autograd/test_ops_forward.py:
Python's math module element by element (math.fsum for sums) and explicit loops over rows, lanes, time steps
and indices, never the NumPy routine the op itself calls, so a wrong forward can't agree with its reference.
Also the assertions that compare an op's output with them.

Tolerances: float64 rtol = atol = 1e-12 (the references differ from the ops only by rounding: math.exp vs
np.exp, fsum vs pairwise sums); float32 outputs against the float64 reference on the same float32 inputs."""
from __future__ import annotations

import contextlib
import itertools
import math
import warnings

import numpy as np

from tinygrad_ssm import Tensor

RTOL = ATOL = 1e-12
F32_RTOL = F32_ATOL = 2e-6  # a few float32 ulps, summed over the handful of terms a reduction here adds
F32_TINY = float(np.finfo(np.float32).tiny)  # below the smallest normal float32 there is no relative precision


def assert_close(out, expected, dtype=np.float64, rtol=RTOL, atol=ATOL):
    expected = np.asarray(expected)
    assert isinstance(out, Tensor)
    assert out.shape == expected.shape, f"shape {out.shape}, expected {expected.shape}"
    assert out.dtype == np.dtype(dtype), f"dtype {out.dtype}, expected {np.dtype(dtype)}"
    np.testing.assert_allclose(out.data, expected, rtol=rtol, atol=atol)


def assert_forward(op, reference, *inputs):
    """op(*Tensors) against reference(*arrays) on the float64 inputs, then on them rounded to float32
    (the op must keep float32). None inputs (an absent bias) stay None."""
    for dtype, rtol, atol in ((np.float64, RTOL, ATOL), (np.float32, F32_RTOL, F32_ATOL)):
        arrays_ = [None if x is None else x.astype(dtype) for x in inputs]
        assert_close(op(*(None if x is None else Tensor(x) for x in arrays_)), reference(*arrays_), dtype, rtol, atol)


def assert_same_elements(out, shape, elements):
    """A view op: `shape`, and the input's elements in this row-major order, bit for bit."""
    assert out.shape == tuple(shape) and out.dtype == np.float64
    assert row_major(out.data) == elements


@contextlib.contextmanager
def strict_floats():
    """Overflow, 0/0 and log(0) (and any RuntimeWarning) are errors. Underflow to 0 stays allowed: for
    sigmoid(-800) or exp(-800), 0 is the correctly rounded answer."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with np.errstate(over="raise", divide="raise", invalid="raise", under="ignore"):
            yield


# --- references ----------------------------------------------------------------------------------------

def pointwise(fn, *arrays):
    """fn on Python floats, element by element, after broadcasting the arrays together."""
    arrays = np.broadcast_arrays(*arrays)
    shape = arrays[0].shape
    return np.array([fn(*(a[i].item() for a in arrays)) for i in np.ndindex(shape)], dtype=np.float64).reshape(shape)


def sigmoid_ref(x):
    return 1 / (1 + math.exp(-x))


def softplus_ref(x, beta=1.0, threshold=20.0):
    return x if beta * x > threshold else math.log1p(math.exp(beta * x)) / beta  # torch: identity above


def logsumexp_ref(values):
    total = math.fsum(math.exp(v) for v in values)  # exp(-inf) = 0; an all -inf list sums to 0
    return math.log(total) if total > 0 else -math.inf


def reduce_ref(x, axis, keepdims, fn):
    """fn(list of the reduced Python floats) at every output position."""
    if x.ndim == 0:
        return np.array(fn([x.item()]))
    axes = range(x.ndim) if axis is None else [a % x.ndim for a in (axis if isinstance(axis, tuple) else (axis,))]
    kept_shape = tuple(1 if i in axes else n for i, n in enumerate(x.shape))
    out = np.empty(kept_shape)
    for idx in np.ndindex(kept_shape):
        lanes = [range(n) if i in axes else (idx[i],) for i, n in enumerate(x.shape)]
        out[idx] = fn([x[j].item() for j in itertools.product(*lanes)])
    return out if keepdims else out.reshape(tuple(n for i, n in enumerate(x.shape) if i not in axes))


def lanes_ref(x, axis, fn):
    """fn(list of Python floats) -> list, on every 1-d lane along `axis`."""
    out = np.empty(x.shape)
    lanes, out_lanes = np.moveaxis(x, axis, -1), np.moveaxis(out, axis, -1)  # views
    for idx in np.ndindex(lanes.shape[:-1]):
        out_lanes[idx] = fn([v.item() for v in lanes[idx]])
    return out


def softmax_ref(values):
    e = [math.exp(v) for v in values]
    total = math.fsum(e)
    return [v / total for v in e]


def log_softmax_ref(values):
    lse = logsumexp_ref(values)
    return [v - lse for v in values]


def cumsum_ref(values):
    return list(itertools.accumulate(values))


def cross_entropy_ref(logits, targets, ignore_index=-100, reduction="mean"):
    """An explicit loop over rows: -log softmax(row)[target], rows with target == ignore_index skipped."""
    classes = logits.shape[-1]
    losses, counted = [], 0
    for row, target in zip(logits.reshape(-1, classes).tolist(), targets.reshape(-1).tolist()):
        if target == ignore_index:
            losses.append(0.0)
            continue
        losses.append(logsumexp_ref(row) - row[target])
        counted += 1
    if reduction == "none":
        return np.array(losses).reshape(targets.shape)
    if reduction == "sum":
        return np.array(math.fsum(losses))
    return np.array(math.fsum(losses) / counted if counted else math.nan)  # torch: nan over no rows


def row_major(a):
    return [a[i].item() for i in np.ndindex(a.shape)]


def gather_ref(out_shape, source_index):
    """out[i] = source_index(i) for every position i of out_shape."""
    out = np.empty(out_shape)
    for i in np.ndindex(out_shape):
        out[i] = source_index(i)
    return out


def matmul_ref(a, b):
    a2 = a[None, :] if a.ndim == 1 else a  # (..., m, k)
    b2 = b[:, None] if b.ndim == 1 else b  # (..., k, n)
    batch = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    a2, b2 = np.broadcast_to(a2, batch + a2.shape[-2:]), np.broadcast_to(b2, batch + b2.shape[-2:])
    out = gather_ref(batch + (a2.shape[-2], b2.shape[-1]), lambda i: math.fsum(
        a2[i[:-1] + (k,)].item() * b2[i[:-2] + (k, i[-1])].item() for k in range(a2.shape[-1])))
    if b.ndim == 1:
        out = out[..., 0]
    if a.ndim == 1:
        out = out[..., 0, :] if b.ndim > 1 else out[..., 0]
    return out


def einsum_ref(subscripts, *operands):
    """Every output entry as the fsum over the summed letters of the product of the operands' entries.
    '...' is spelled out with capitals (right-aligned); without '->' the output is NumPy's implicit one."""
    inputs, arrow, output = subscripts.replace(" ", "").partition("->")
    specs = inputs.split(",")
    widths = [op.ndim - (len(s) - 3) for s, op in zip(specs, operands) if "..." in s]
    ellipsis = "ABCDEFGH"[:max(widths, default=0)]
    specs = [s.replace("...", ellipsis[len(ellipsis) - (op.ndim - len(s) + 3):] if "..." in s else "")
             for s, op in zip(specs, operands)]
    if arrow:
        output = output.replace("...", ellipsis)
    else:
        letters = "".join(specs)
        output = ellipsis + "".join(sorted(c for c in set(letters) if letters.count(c) == 1 and c not in ellipsis))
    sizes = {}
    for spec, op in zip(specs, operands):
        for c, n in zip(spec, op.shape):
            sizes[c] = max(sizes.get(c, 1), n)
    summed = sorted(set("".join(specs)) - set(output))

    def entry(out_index):
        letter_at = dict(zip(output, out_index))
        terms = []
        for summed_index in itertools.product(*(range(sizes[c]) for c in summed)):
            letter_at.update(zip(summed, summed_index))
            term = 1.0
            for spec, op in zip(specs, operands):  # a size-1 axis broadcasts: always index 0
                term *= op[tuple(letter_at[c] if n > 1 else 0 for c, n in zip(spec, op.shape))].item()
            terms.append(term)
        return math.fsum(terms)
    return gather_ref(tuple(sizes[c] for c in output), entry)


def causal_conv1d_ref(x, weight, bias=None):
    """y[b, t, c] = bias[c] + sum_j weight[c, j] x[b, t - (k - 1) + j, c], x = 0 before t = 0."""
    weight = weight.reshape(weight.shape[0], -1)  # (c, 1, k) -> (c, k)
    k = weight.shape[1]
    return gather_ref(x.shape, lambda i: math.fsum(
        [weight[i[2], j] * x[i[0], i[1] - (k - 1) + j, i[2]] for j in range(k) if i[1] - (k - 1) + j >= 0]
        + [bias[i[2]] if bias is not None else 0.0]))


def rms_norm_ref(x, weight=None, eps=1e-5):
    out = np.empty(x.shape)
    for idx in np.ndindex(x.shape[:-1]):
        row = x[idx].tolist()
        rms = math.sqrt(math.fsum(v * v for v in row) / len(row) + eps)
        out[idx] = [v / rms * (1.0 if weight is None else weight[j]) for j, v in enumerate(row)]
    return out
