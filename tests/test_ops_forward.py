"""Forward values of every op in tinygrad_ssm.functional.OPS against independent expected values
(tests/op_references.py: textbook formulas in Python's math module and explicit loops). Gradient checks only
compare the backward with the forward, so a wrong forward passes them, and the torch parity tests skip
without torch: in CI this file is the forward's independent check. `COVERAGE` (tests/op_coverage.py) records which test
checks which op; `test_every_public_op_has_a_forward_check` fails when an op of the public list has none.

Tolerances: float64 rtol = atol = 1e-12 (the references differ from the ops only by rounding: math.exp vs
np.exp, fsum vs pairwise sums); float32 outputs against the float64 reference on the same float32 inputs."""
from __future__ import annotations

import itertools
import math
import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from op_coverage import OpCoverage
from op_references import (causal_conv1d_ref, cross_entropy_ref, cumsum_ref, einsum_ref, gather_ref,
                           log_softmax_ref, logsumexp_ref, lanes_ref, matmul_ref, pointwise, reduce_ref, rms_norm_ref,
                           row_major, sigmoid_ref, softmax_ref, softplus_ref, strict_floats)
from strategies import (EINSUM_SPECS, arrays, away_from_zero, axis_arguments, broadcastable_shapes, einsum_shapes,
                        expand_pairs, matmul_shapes, positive, reshape_targets, shape_and_axis, shapes, smooth,
                        where_inputs)
from tinygrad_ssm import Tensor
from tinygrad_ssm import functional as F

RTOL = ATOL = 1e-12
F32_RTOL = F32_ATOL = 2e-6  # a few float32 ulps, summed over the handful of terms a reduction here adds
F32_TINY = float(np.finfo(np.float32).tiny)  # below the smallest normal float32 there is no relative precision

COVERAGE = OpCoverage("forward-value check")
checks = COVERAGE.checks


def test_every_public_op_has_a_forward_check():
    COVERAGE.assert_complete()


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


# --- elementwise ----------------------------------------------------------------------------------------

UNARY = {  # name: (op, scalar reference, values)
    "neg": (F.neg, lambda x: -x, smooth()),
    "exp": (F.exp, math.exp, smooth(-5, 5)),
    "log": (F.log, math.log, positive(1e-3, 50.0)),
    "sqrt": (F.sqrt, math.sqrt, positive(0.0, 50.0)),
    "rsqrt": (F.rsqrt, lambda x: 1 / math.sqrt(x), positive(1e-3, 50.0)),
    "abs": (F.abs, math.fabs, smooth()),
    "tanh": (F.tanh, math.tanh, smooth(-10, 10)),
    "sigmoid": (F.sigmoid, sigmoid_ref, smooth(-30, 30)),
    "silu": (F.silu, lambda x: x * sigmoid_ref(x), smooth(-30, 30)),
    "softplus": (F.softplus, softplus_ref, smooth(-30, 30)),
    "relu": (F.relu, lambda x: max(x, 0.0), smooth()),
}


@checks(*UNARY)
@pytest.mark.parametrize("name", sorted(UNARY))
@given(data=st.data())
def test_unary_forward(name, data):
    op, reference, values = UNARY[name]
    x = data.draw(arrays(data.draw(shapes()), values), label="x")
    assert_forward(op, lambda v: pointwise(reference, v), x)


BINARY = {  # name: (op, scalar reference, values of a, values of b)
    "add": (F.add, lambda a, b: a + b, smooth(), smooth()),
    "sub": (F.sub, lambda a, b: a - b, smooth(), smooth()),
    "mul": (F.mul, lambda a, b: a * b, smooth(), smooth()),
    "div": (F.div, lambda a, b: a / b, smooth(), away_from_zero(0.1, 3.0)),
    "pow": (F.pow, math.pow, positive(0.1, 3.0), smooth()),
    "maximum": (F.maximum, max, smooth(), smooth()),
    "minimum": (F.minimum, min, smooth(), smooth()),
}


@checks(*BINARY)
@pytest.mark.parametrize("name", sorted(BINARY))
@given(data=st.data())
def test_binary_forward_broadcasting(name, data):
    op, reference, values_a, values_b = BINARY[name]
    shape_a, shape_b = data.draw(broadcastable_shapes(2), label="shapes")
    a, b = data.draw(arrays(shape_a, values_a), label="a"), data.draw(arrays(shape_b, values_b), label="b")
    assert_forward(op, lambda *ab: pointwise(reference, *ab), a, b)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_operators_with_python_scalars_keep_the_tensor_dtype(dtype):
    x = np.array([-1.5, -0.25, 0.5, 2.0], dtype=dtype)
    t = Tensor(x)
    rtol, atol = (RTOL, ATOL) if dtype == np.float64 else (F32_RTOL, F32_ATOL)
    for out, reference in ((t + 2.5, lambda v: v + 2.5), (2.5 - t, lambda v: 2.5 - v), (t * -1.5, lambda v: -1.5 * v),
                           (3.0 / t, lambda v: 3.0 / v), (t ** 3, lambda v: v ** 3), (2.0 ** t, lambda v: 2.0 ** v),
                           (-t, lambda v: -v), (F.abs(t) ** 0.5, lambda v: math.sqrt(abs(v)))):
        assert_close(out, pointwise(reference, x), dtype, rtol, atol)
    ints = Tensor(np.array([1, -2, 3]))  # an int tensor meeting a float one takes the float dtype (torch)
    assert_close(ints * Tensor(np.array([0.5], dtype)), [0.5, -1.0, 1.5], dtype)


@checks("clip")
@given(data=st.data(), bounds=st.sampled_from([(-0.5, 0.7), (None, 0.3), (-1.0, None), (0.2, 0.2)]))
def test_clip_forward(data, bounds):
    low, high = bounds
    x = data.draw(arrays(data.draw(shapes())), label="x")
    expected = pointwise(lambda v: min(v if low is None else max(v, low), math.inf if high is None else high), x)
    assert_close(F.clip(Tensor(x), low, high), expected)


@checks("where")
@given(data=st.data())
def test_where_forward(data):
    condition, x, y = data.draw(where_inputs(), label="condition, x, y")
    assert_close(F.where(condition, Tensor(x), Tensor(y)), pointwise(lambda c, a, b: a if c else b, condition, x, y))


@checks("cast")
@given(x=arrays(shapes(), smooth(-1e6, 1e6)))
def test_cast_forward(x):
    to_float32 = [struct.unpack("f", struct.pack("f", v))[0] for v in row_major(x)]  # C's round-to-nearest
    out = F.cast(Tensor(x), np.float32)
    assert out.dtype == np.float32 and out.shape == x.shape
    assert row_major(out.data) == to_float32
    out = F.cast(Tensor(x), np.int64)  # truncation toward zero, as C and torch
    assert out.dtype == np.int64 and row_major(out.data) == [int(v) for v in row_major(x)]
    assert row_major(F.cast(out, np.float64).data) == [float(int(v)) for v in row_major(x)]


# --- reductions -----------------------------------------------------------------------------------------

REDUCTIONS = {
    "sum": (F.sum, math.fsum),
    "mean": (F.mean, lambda v: math.fsum(v) / len(v)),
    "max": (F.max, max),
    "logsumexp": (F.logsumexp, logsumexp_ref),
}


@checks(*REDUCTIONS)
@pytest.mark.parametrize("name", sorted(REDUCTIONS))
@given(data=st.data(), keepdims=st.booleans())
def test_reduction_forward(name, data, keepdims):
    op, reference = REDUCTIONS[name]
    x = data.draw(arrays(data.draw(shapes()), smooth(-5, 5)), label="x")
    axis = data.draw(axis_arguments(x.ndim), label="axis")
    assert_forward(lambda t: op(t, axis, keepdims), lambda v: reduce_ref(v, axis, keepdims, reference), x)


def test_integer_sum_and_max_stay_integers():
    x = np.arange(-6, 6).reshape(3, 4)
    assert_close(F.sum(Tensor(x), 1), [sum(r) for r in x.tolist()], np.int64)
    assert_close(F.max(Tensor(x), 0), [max(c) for c in zip(*x.tolist())], np.int64)


ALONG_AXIS = {"softmax": (F.softmax, softmax_ref), "log_softmax": (F.log_softmax, log_softmax_ref),
              "cumsum": (F.cumsum, cumsum_ref)}


@checks(*ALONG_AXIS)
@pytest.mark.parametrize("name", sorted(ALONG_AXIS))
@given(data=st.data())
def test_along_axis_forward(name, data):
    op, reference = ALONG_AXIS[name]
    shape, axis = data.draw(shape_and_axis(), label="shape, axis")
    x = data.draw(arrays(shape, smooth(-5, 5)), label="x")
    assert_forward(lambda t: op(t, axis), lambda v: lanes_ref(v, axis, reference), x)


def test_softmax_family_of_a_scalar_and_of_huge_logits():
    assert_close(F.softmax(Tensor(np.array(0.7)), -1), np.array(1.0))
    assert_close(F.cumsum(Tensor(np.array(0.7)), 0), np.array(0.7))
    # 1000 + v overflows exp; softmax and logsumexp - 1000 don't depend on the shift, and 1000 + k/8 is exact
    small = np.array([[0.0, 1.0, -2.5, 0.125], [3.0, 3.0, -1.0, 2.0]])
    huge = Tensor(1000.0 + small)
    with strict_floats():
        assert_close(F.softmax(huge, -1), lanes_ref(small, -1, softmax_ref))
        assert_close(F.log_softmax(huge, -1), lanes_ref(small, -1, log_softmax_ref))
        assert_close(F.logsumexp(huge, 1) - 1000.0, reduce_ref(small, 1, False, logsumexp_ref))


def test_reductions_of_rows_with_minus_infinity():
    x = np.array([[-np.inf, 0.0, 1.0], [-np.inf, -np.inf, -np.inf], [-np.inf, 2.0, -np.inf], [np.inf, 0.0, 1.0]])
    with strict_floats():  # a fully masked row is -inf, silently, as torch
        assert_close(F.logsumexp(Tensor(x), 1), reduce_ref(x, 1, False, logsumexp_ref))
        assert_close(F.logsumexp(Tensor(x[:3]), None), reduce_ref(x[:3], None, False, logsumexp_ref))
        assert_close(F.logsumexp(Tensor(x[:3].astype(np.float32)), 1, keepdims=True),
                     reduce_ref(x[:3], 1, True, logsumexp_ref), np.float32, F32_RTOL, F32_ATOL)
        masked = x[[0, 2]]  # masked attention: -inf entries get probability 0 (log-probability -inf)
        assert_close(F.softmax(Tensor(masked), -1), lanes_ref(masked, -1, softmax_ref))
        assert_close(F.log_softmax(Tensor(masked), -1), lanes_ref(masked, -1, log_softmax_ref))
        assert_close(F.max(Tensor(x), 1), [1.0, -np.inf, 2.0, np.inf])


@st.composite
def cross_entropy_cases(draw):
    """logits (..., C), integer targets (...) with some rows ignored, an ignore_index (sometimes a real class,
    which torch ignores too) and a reduction."""
    lead = draw(shapes(min_dims=1, max_dims=2))
    classes = draw(st.integers(1, 5))
    ignore_index = draw(st.sampled_from([-100, 0, classes - 1]))
    logits = draw(arrays(lead + (classes,), smooth(-6, 6)))
    targets = draw(hnp.arrays(np.int64, lead, elements=st.integers(0, classes - 1) | st.just(ignore_index)))
    return logits, targets, ignore_index, draw(st.sampled_from(["mean", "sum", "none"]))


@checks("cross_entropy")
@given(case=cross_entropy_cases())
def test_cross_entropy_forward(case):
    logits, targets, ignore_index, reduction = case
    assert_forward(lambda t: F.cross_entropy(t, targets, ignore_index=ignore_index, reduction=reduction),
                   lambda v: cross_entropy_ref(v, targets, ignore_index, reduction), logits)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_cross_entropy_over_only_ignored_rows(dtype):
    logits, targets = Tensor(np.ones((2, 3), dtype)), np.array([-100, -100])
    with strict_floats():
        assert np.isnan(F.cross_entropy(logits, targets).item())  # torch: the mean over no rows is nan
        assert_close(F.cross_entropy(logits, targets, reduction="mean"), np.array(np.nan), dtype)
        assert_close(F.cross_entropy(logits, targets, reduction="sum"), np.array(0.0), dtype)
        assert_close(F.cross_entropy(logits, targets, reduction="none"), [0.0, 0.0], dtype)


def test_cross_entropy_with_minus_infinity_logits():
    # masked-out classes (-inf) in every row, also at class 0, where ignored rows used to be read
    logits = np.array([[-np.inf, 1.0, 2.0], [0.5, -np.inf, -1.0], [-np.inf, -np.inf, 3.0]])
    targets = np.array([-100, 0, 2])
    with strict_floats():
        for reduction in ("none", "sum", "mean"):
            assert_close(F.cross_entropy(Tensor(logits), targets, reduction=reduction),
                         cross_entropy_ref(logits, targets, reduction=reduction))


# --- linear algebra -------------------------------------------------------------------------------------

@checks("matmul")
@given(data=st.data())
def test_matmul_forward(data):
    shape_a, shape_b = data.draw(matmul_shapes(), label="shapes")
    a, b = data.draw(arrays(shape_a), label="a"), data.draw(arrays(shape_b), label="b")
    assert_forward(F.matmul, matmul_ref, a, b)
    assert_close(Tensor(a) @ Tensor(b), matmul_ref(a, b))


@checks("einsum")
@pytest.mark.parametrize("subscripts", EINSUM_SPECS)
@given(data=st.data())
def test_einsum_forward(subscripts, data):
    operands = [data.draw(arrays(s), label=f"x{i}") for i, s in enumerate(data.draw(einsum_shapes(subscripts)))]
    assert_close(F.einsum(subscripts, *map(Tensor, operands)), einsum_ref(subscripts, *operands))


def test_einsum_float32_and_an_implicit_output():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 3, 4)).astype(np.float32), rng.standard_normal((2, 4, 5)).astype(np.float32)
    assert_close(F.einsum("bij,bjk->bik", Tensor(a), Tensor(b)), einsum_ref("bij,bjk->bik", a, b),
                 np.float32, F32_RTOL, F32_ATOL)
    x, y = rng.standard_normal((3, 2)), rng.standard_normal((2, 4))  # "ij,jk" means "ij,jk->ik"
    assert_close(F.einsum("ij,jk", Tensor(x), Tensor(y)), gather_ref((3, 4), lambda i: math.fsum(
        x[i[0], j] * y[j, i[1]] for j in range(2))))


# --- shape ----------------------------------------------------------------------------------------------

def assert_same_elements(out, shape, elements):
    """A view op: `shape`, and the input's elements in this row-major order, bit for bit."""
    assert out.shape == tuple(shape) and out.dtype == np.float64
    assert row_major(out.data) == elements


@checks("reshape")
@given(data=st.data())
def test_reshape_forward(data):
    x = data.draw(arrays(data.draw(shapes())), label="x")
    target = data.draw(reshape_targets(x.shape), label="target")
    known = math.prod(n for n in target if n != -1)
    assert_same_elements(F.reshape(Tensor(x), target), [x.size // known if n == -1 else n for n in target],
                         row_major(x))


@checks("flatten")
@given(data=st.data())
def test_flatten_forward(data):
    x = data.draw(arrays(data.draw(shapes(min_dims=1))), label="x")
    start = data.draw(st.integers(0, x.ndim - 1), label="start")
    end = data.draw(st.integers(start, x.ndim - 1), label="end")
    expected = x.shape[:start] + (math.prod(x.shape[start:end + 1]),) + x.shape[end + 1:]
    assert_same_elements(F.flatten(Tensor(x), start, end - x.ndim), expected, row_major(x))
    assert_same_elements(F.flatten(Tensor(np.array(2.5))), (1,), [2.5])


@checks("permute", "transpose")
@given(data=st.data())
def test_permute_and_transpose_forward(data):
    x = data.draw(arrays(data.draw(shapes())), label="x")
    axes = data.draw(st.permutations(range(x.ndim)), label="axes")
    out_shape = tuple(x.shape[a] for a in axes)

    def source(index):  # out[index] = x[j] with j[axes[d]] = index[d]
        j = [0] * x.ndim
        for d, a in enumerate(axes):
            j[a] = index[d]
        return x[tuple(j)]
    assert_close(F.permute(Tensor(x), axes), gather_ref(out_shape, source), rtol=0, atol=0)
    if x.ndim >= 1:
        i, j = data.draw(st.integers(-x.ndim, x.ndim - 1)), data.draw(st.integers(-x.ndim, x.ndim - 1))
        swapped = list(range(x.ndim))
        swapped[i], swapped[j] = swapped[j], swapped[i]
        expected = gather_ref(tuple(x.shape[a] for a in swapped), lambda k: x[tuple(k[swapped.index(a)]
                                                                                    for a in range(x.ndim))])
        assert_close(F.transpose(Tensor(x), i, j), expected, rtol=0, atol=0)


@checks("expand")
@given(pair=expand_pairs(), data=st.data())
def test_expand_forward(pair, data):
    source, target = pair
    x = data.draw(arrays(source), label="x")
    lead = len(target) - len(source)
    expected = gather_ref(target, lambda i: x[tuple(0 if n == 1 else i[lead + d] for d, n in enumerate(source))])
    assert_close(F.expand(Tensor(x), target), expected, rtol=0, atol=0)


@checks("unsqueeze", "squeeze")
@given(data=st.data())
def test_unsqueeze_and_squeeze_forward(data):
    x = data.draw(arrays(data.draw(shapes(max_side=2))), label="x")  # plenty of size-1 axes
    axis = data.draw(st.integers(-x.ndim - 1, x.ndim), label="unsqueeze axis")
    at = axis % (x.ndim + 1)
    assert_same_elements(F.unsqueeze(Tensor(x), axis), x.shape[:at] + (1,) + x.shape[at:], row_major(x))
    assert_same_elements(F.squeeze(Tensor(x)), [n for n in x.shape if n != 1], row_major(x))
    squeeze_axes = data.draw(axis_arguments(x.ndim), label="squeeze axes")
    if squeeze_axes is not None:
        chosen = {a % max(x.ndim, 1) for a in (squeeze_axes if isinstance(squeeze_axes, tuple) else (squeeze_axes,))}
        expected = [n for d, n in enumerate(x.shape) if not (d in chosen and n == 1)]  # size > 1 axes stay
        assert_same_elements(F.squeeze(Tensor(x), squeeze_axes), expected, row_major(x))


X43 = np.arange(12.0).reshape(4, 3) * 1.5 - 4.0
L43 = X43.tolist()
ROWS, COLS = [2, 0, 2, -1], [0, 1, 2, 1]
MASK = (np.arange(12).reshape(4, 3) % 5) < 2
GETITEM_CASES = {  # index -> the expected value written with Python lists
    "int": (1, L43[1]), "negative int": (-1, L43[3]), "two ints": ((2, -2), L43[2][1]),
    "slice with step": ((1, slice(None, None, 2)), L43[1][::2]),
    "reversed rows": (slice(None, None, -1), L43[::-1]),
    "ellipsis and None": ((Ellipsis, None, 1), [[r[1]] for r in L43]),
    "integer array": (np.array(ROWS), [L43[r] for r in ROWS]),
    "integer tensor": (Tensor(np.array(ROWS)), [L43[r] for r in ROWS]),
    "integer list": (ROWS, [L43[r] for r in ROWS]),
    "integer array and slice": ((np.array(ROWS), slice(1, 3)), [L43[r][1:3] for r in ROWS]),
    "two integer arrays": ((np.array(ROWS), np.array(COLS)), [L43[r][c] for r, c in zip(ROWS, COLS)]),
    "bool mask": (MASK, [L43[i][j] for i in range(4) for j in range(3) if MASK[i, j]]),
    "bool rows": (MASK[:, 0], [L43[i] for i in range(4) if MASK[i, 0]]),
}


@checks("getitem")
@pytest.mark.parametrize("name", list(GETITEM_CASES))
def test_getitem_forward(name):
    index, expected = GETITEM_CASES[name]
    assert_close(F.getitem(Tensor(X43), index), np.array(expected), rtol=0, atol=0)
    assert_close(Tensor(X43)[index], np.array(expected), rtol=0, atol=0)


@given(data=st.data())
def test_getitem_basic_indices_forward(data):
    x = data.draw(arrays(data.draw(shapes(min_dims=1))), label="x")
    index = data.draw(hnp.basic_indices(x.shape, min_dims=0, allow_newaxis=True, allow_ellipsis=True), label="index")
    assert_close(F.getitem(Tensor(x), index), x[index], rtol=0, atol=0)  # NumPy's indexing is the definition


@st.composite
def concat_cases(draw, same_shape: bool):
    base, axis = draw(shape_and_axis(min_dims=1))
    shape_list = [tuple(base[:axis % len(base)]) + ((base[axis] if same_shape else draw(st.integers(0, 3))),)
                  + tuple(base[axis % len(base) + 1:]) for _ in range(draw(st.integers(1, 3)))]
    return [draw(arrays(s)) for s in shape_list], axis


@checks("cat")
@given(case=concat_cases(same_shape=False))
def test_cat_forward(case):
    pieces, axis = case
    axis %= pieces[0].ndim
    shape = list(pieces[0].shape)
    shape[axis] = sum(p.shape[axis] for p in pieces)
    expected, start = np.full(shape, np.nan), 0
    for p in pieces:  # each piece written into its own stretch of the axis
        expected[(slice(None),) * axis + (slice(start, start + p.shape[axis]),)] = p
        start += p.shape[axis]
    assert_close(F.cat([Tensor(p) for p in pieces], axis), expected, rtol=0, atol=0)


@checks("stack")
@given(case=concat_cases(same_shape=True), data=st.data())
def test_stack_forward(case, data):
    pieces, _ = case
    axis = data.draw(st.integers(-pieces[0].ndim - 1, pieces[0].ndim), label="axis")
    at = axis % (pieces[0].ndim + 1)
    expected = gather_ref(pieces[0].shape[:at] + (len(pieces),) + pieces[0].shape[at:],
                          lambda i: pieces[i[at]][i[:at] + i[at + 1:]])
    assert_close(F.stack([Tensor(p) for p in pieces], axis), expected, rtol=0, atol=0)


@checks("split")
@given(data=st.data())
def test_split_forward(data):
    shape, axis = data.draw(shape_and_axis(), label="shape, axis")
    x = data.draw(arrays(shape), label="x")
    n, axis = shape[axis], axis % len(shape)
    size = data.draw(st.integers(1, n + 1), label="size")
    sections = data.draw(st.lists(st.integers(0, n), max_size=3).map(lambda c: np.diff([0, *sorted(c), n]).tolist()))
    for argument, sizes in ((size, [min(size, n - s) for s in range(0, n, size)]), (sections, sections)):
        pieces = F.split(Tensor(x), argument, axis - len(shape))
        assert len(pieces) == len(sizes)
        starts = list(itertools.accumulate([0] + sizes))
        for piece, start, length in zip(pieces, starts, sizes):
            expected = gather_ref(shape[:axis] + (length,) + shape[axis + 1:],
                                  lambda i: x[i[:axis] + (start + i[axis],) + i[axis + 1:]])
            assert_close(piece, expected, rtol=0, atol=0)


@checks("pad")
@given(data=st.data(), value=st.sampled_from([0.0, -1.5]))
def test_pad_forward(data, value):
    # written as "fill, then copy the middle in": the op itself calls np.pad
    x = data.draw(arrays(data.draw(shapes(min_dims=1))), label="x")
    pad = data.draw(st.lists(st.integers(0, 2), max_size=2 * x.ndim).filter(lambda p: len(p) % 2 == 0), label="pad")
    before, after = [0] * x.ndim, [0] * x.ndim
    for i in range(len(pad) // 2):  # torch order: the last axis first
        before[x.ndim - 1 - i], after[x.ndim - 1 - i] = pad[2 * i], pad[2 * i + 1]
    expected = np.full([b + n + a for b, n, a in zip(before, x.shape, after)], value)
    expected[tuple(slice(b, b + n) for b, n in zip(before, x.shape))] = x
    assert_close(F.pad(Tensor(x), pad, value), expected, rtol=0, atol=0)


@checks("flip")
@given(data=st.data())
def test_flip_forward(data):
    x = data.draw(arrays(data.draw(shapes())), label="x")
    axis = data.draw(axis_arguments(x.ndim), label="axis")
    flipped = (set(range(x.ndim)) if axis is None else
               {a % max(x.ndim, 1) for a in (axis if isinstance(axis, tuple) else (axis,))})
    expected = gather_ref(x.shape, lambda i: x[tuple(n - 1 - j if d in flipped else j
                                                      for d, (j, n) in enumerate(zip(i, x.shape)))])
    assert_close(F.flip(Tensor(x), axis), expected, rtol=0, atol=0)


@checks("tril", "triu")
@pytest.mark.parametrize("name", ["tril", "triu"])
@given(data=st.data(), k=st.integers(-3, 3))
def test_triangle_forward(name, data, k):
    x = data.draw(arrays(data.draw(shapes(min_dims=2))), label="x")
    keep = (lambda row, col: col - row <= k) if name == "tril" else (lambda row, col: col - row >= k)
    expected = gather_ref(x.shape, lambda i: x[i] if keep(i[-2], i[-1]) else 0.0)
    assert_close(getattr(F, name)(Tensor(x), k), expected, rtol=0, atol=0)


# --- layers' building blocks ----------------------------------------------------------------------------

@checks("embedding")
@given(data=st.data())
def test_embedding_forward(data):
    vocab, dim = data.draw(st.integers(1, 5), label="vocab"), data.draw(st.integers(1, 3), label="dim")
    ids = data.draw(hnp.arrays(np.int64, shapes(min_dims=0, max_dims=2), elements=st.integers(0, vocab - 1)))
    weight = data.draw(arrays((vocab, dim)), label="weight")  # (V, d)
    rows = weight.tolist()
    expected = np.array([rows[i] for i in ids.reshape(-1).tolist()]).reshape(ids.shape + (dim,))  # (..., d)
    assert_close(F.embedding(ids, Tensor(weight)), expected, rtol=0, atol=0)


@checks("causal_conv1d")
@given(data=st.data(), with_bias=st.booleans(), weight_3d=st.booleans())
def test_causal_conv1d_forward(data, with_bias, weight_3d):
    b, l, c, k = (data.draw(st.integers(1, n), label=name) for n, name in ((2, "b"), (6, "l"), (3, "c"), (4, "k")))
    x = data.draw(arrays((b, l, c)), label="x")                                   # (b, l, c)
    weight = data.draw(arrays((c, 1, k) if weight_3d else (c, k)), label="weight")  # (c, 1, k) or (c, k)
    bias = data.draw(arrays((c,)), label="bias") if with_bias else None           # (c,)
    assert_forward(F.causal_conv1d, causal_conv1d_ref, x, weight, bias)


@checks("rms_norm")
@given(data=st.data(), with_weight=st.booleans(), eps=st.sampled_from([1e-5, 1e-6, 0.5]))
def test_rms_norm_forward(data, with_weight, eps):
    x = data.draw(arrays(data.draw(shapes(min_dims=1))), label="x")
    weight = data.draw(arrays(x.shape[-1:]), label="weight") if with_weight else None  # (d,)
    assert_forward(lambda t, w: F.rms_norm(t, w, eps), lambda v, w: rms_norm_ref(v, w, eps), x, weight)


# --- edge values ----------------------------------------------------------------------------------------

def tolerances(dtype):
    return (RTOL, ATOL) if dtype == np.float64 else (F32_RTOL, F32_TINY)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_softplus_at_large_inputs(dtype):
    x = np.array([-800.0, -100.0, -30.0, -1.0, 0.0, 1.0, 19.5, 20.0, 20.25, 25.0, 100.0, 800.0, 3e38], dtype)
    with strict_floats():
        out = F.softplus(Tensor(x))
        out_beta = F.softplus(Tensor(x[:-1]), beta=2.0, threshold=10.0)  # 2 * 3e38 would overflow float32
    above = x > 20  # exactly the input there, bit for bit (torch's threshold is strict: 20 itself is soft)
    np.testing.assert_array_equal(out.data[above], x[above])
    soft = [math.log1p(math.exp(v)) for v in x[~above].tolist()]  # at 20: 20 + 2.06e-9, not 20
    assert_close(Tensor(out.data[~above]), soft, dtype, *tolerances(dtype))
    if dtype == np.float64:  # in float32, 20 + 2e-9 rounds to 20
        assert out.data[x == 20.0][0] > 20.0
    assert_close(out_beta, pointwise(lambda v: softplus_ref(v, 2.0, 10.0), x[:-1]), dtype, *tolerances(dtype))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_sigmoid_and_silu_at_large_inputs(dtype):
    x = np.array([-800.0, -700.0, -100.0, -40.0, 40.0, 100.0, 700.0, 800.0], dtype)
    with strict_floats():
        sig, silu = F.sigmoid(Tensor(x)), F.silu(Tensor(x))
    # 1/(1+exp(-x)) overflows in Python below -709; there sigmoid(x) = exp(x) (1 - exp(x) + ...) and the
    # correction is below 1e-17 of the value for x <= -40, so exp(x) is the correctly rounded answer
    expected = np.array([math.exp(v) if v < 0 else sigmoid_ref(v) for v in x.tolist()])
    assert_close(sig, expected, dtype, *tolerances(dtype))
    assert_close(silu, x.astype(np.float64) * expected, dtype, *tolerances(dtype))
    assert (sig.data[x > 0] == 1.0).all() and sig.data[0] == 0.0
