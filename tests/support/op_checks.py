"""The pieces the op table in tests/support/op_specs.py is made of, one kind per family of ops:

- a gradient case draws, through hypothesis' `data`, a function of tensors and the float64 arrays to
  gradcheck it at: `case(data) -> (fn, [arrays])`. Values stay away from each op's kinks (tests/support/strategies.py);
- a forward check draws inputs the same way and compares the op with an independent reference
  (tests/support/op_references.py): `check(data)` asserts. float64 at rtol = atol = 1e-12 (the references differ
  only by rounding), float32 outputs against the float64 reference at a few ulps.

Builders for the big families (unary, binary, reductions, along an axis) take the op and its reference;
ops with an argument structure of their own (cross_entropy, einsum, ...) have their functions here, the shape
ops' (reshape to flip, compared bit for bit) in tests/support/shape_checks.py."""
from __future__ import annotations

import math
import struct

import numpy as np
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from .op_references import assert_close, assert_forward, gather_ref, lanes_ref, pointwise, reduce_ref, row_major
from .strategies import (arrays, away_from, away_from_zero, axis_arguments, broadcastable_shapes,
                        cross_entropy_forward_inputs, cross_entropy_grad_inputs, distinct_arrays, einsum_shapes,
                        matmul_shapes, shape_and_axis, shapes, smooth, untied_pair, where_inputs)
from tinygrad_ssm import Tensor
from tinygrad_ssm.autograd import functional as F


# --- families -------------------------------------------------------------------------------------------

def unary_grad(op, values):
    return lambda data: (op, [data.draw(arrays(data.draw(shapes()), values), label="x")])


def unary_forward(op, reference, values):
    def check(data):
        x = data.draw(arrays(data.draw(shapes()), values), label="x")
        assert_forward(op, lambda v: pointwise(reference, v), x)
    return check


def binary_grad(op, values_a, values_b):
    def case(data):
        shape_a, shape_b = data.draw(broadcastable_shapes(2), label="shapes")
        event(f"broadcasting: {shape_a != shape_b}")
        return op, [data.draw(arrays(shape_a, values_a), label="a"), data.draw(arrays(shape_b, values_b), label="b")]
    return case


def binary_forward(op, reference, values_a, values_b):
    def check(data):
        shape_a, shape_b = data.draw(broadcastable_shapes(2), label="shapes")
        a, b = data.draw(arrays(shape_a, values_a), label="a"), data.draw(arrays(shape_b, values_b), label="b")
        assert_forward(op, lambda *ab: pointwise(reference, *ab), a, b)
    return check


def reduction_grad(op, values=None):
    """values=None: smooth values; `distinct` for max, where a tie would split the gradient."""
    def case(data):
        keepdims = data.draw(st.booleans(), label="keepdims")
        shape = data.draw(shapes(), label="shape")
        axis = data.draw(axis_arguments(len(shape)), label="axis")
        x = data.draw(distinct_arrays(shape) if values == "distinct" else arrays(shape), label="x")
        return (lambda t: op(t, axis=axis, keepdims=keepdims)), [x]
    return case


def reduction_forward(op, reference):
    def check(data):
        keepdims = data.draw(st.booleans(), label="keepdims")
        x = data.draw(arrays(data.draw(shapes()), smooth(-5, 5)), label="x")
        axis = data.draw(axis_arguments(x.ndim), label="axis")
        assert_forward(lambda t: op(t, axis, keepdims), lambda v: reduce_ref(v, axis, keepdims, reference), x)
    return check


def along_axis_grad(op):
    def case(data):
        shape, axis = data.draw(shape_and_axis(min_dims=0), label="shape, axis")
        return (lambda t: op(t, axis)), [data.draw(arrays(shape), label="x")]
    return case


def along_axis_forward(op, reference):
    def check(data):
        shape, axis = data.draw(shape_and_axis(), label="shape, axis")
        x = data.draw(arrays(shape, smooth(-5, 5)), label="x")
        assert_forward(lambda t: op(t, axis), lambda v: lanes_ref(v, axis, reference), x)
    return check


# --- elementwise with arguments of their own ------------------------------------------------------------

def clip_forward(data):
    low, high = data.draw(st.sampled_from([(-0.5, 0.7), (None, 0.3), (-1.0, None), (0.2, 0.2)]), label="bounds")
    x = data.draw(arrays(data.draw(shapes())), label="x")
    expected = pointwise(lambda v: min(v if low is None else max(v, low), math.inf if high is None else high), x)
    assert_close(F.clip(Tensor(x), low, high), expected)


def cast_forward(data):
    x = data.draw(arrays(data.draw(shapes()), smooth(-1e6, 1e6)), label="x")
    to_float32 = [struct.unpack("f", struct.pack("f", v))[0] for v in row_major(x)]  # C's round-to-nearest
    out = F.cast(Tensor(x), np.float32)
    assert out.dtype == np.float32 and out.shape == x.shape
    assert row_major(out.data) == to_float32
    out = F.cast(Tensor(x), np.int64)  # truncation toward zero, as C and torch
    assert out.dtype == np.int64 and row_major(out.data) == [int(v) for v in row_major(x)]
    assert row_major(F.cast(out, np.float64).data) == [float(int(v)) for v in row_major(x)]


def cast_grad(data):
    # A float32 round trip would round the eps=1e-6 perturbation away, so the cast under test goes up to the
    # wider long double and back: both directions of Cast, and a backward (x^2) computed in long double.
    x = data.draw(arrays(data.draw(shapes())), label="x")
    return (lambda t: F.cast(F.cast(t, np.longdouble) * F.cast(t, np.longdouble), np.float64)), [x]


# --- cross entropy --------------------------------------------------------------------------------------

def cross_entropy_grad(data):
    logits, targets, reduction = data.draw(cross_entropy_grad_inputs(), label="logits, targets, reduction")
    return (lambda t: F.cross_entropy(t, targets, reduction=reduction)), [logits]


def cross_entropy_forward(reference):
    def check(data):
        logits, targets, ignore_index, reduction = data.draw(cross_entropy_forward_inputs(), label="case")
        assert_forward(lambda t: F.cross_entropy(t, targets, ignore_index=ignore_index, reduction=reduction),
                       lambda v: reference(v, targets, ignore_index, reduction), logits)
    return check


def triangle_grad(op):
    def case(data):
        k = data.draw(st.integers(-2, 2), label="k")
        shape = data.draw(shapes(min_dims=2), label="shape")
        return (lambda t: op(t, k)), [data.draw(arrays(shape), label="x")]
    return case


def triangle_forward(op, lower: bool):
    def check(data):
        k = data.draw(st.integers(-3, 3), label="k")
        x = data.draw(arrays(data.draw(shapes(min_dims=2))), label="x")
        keep = (lambda row, col: col - row <= k) if lower else (lambda row, col: col - row >= k)
        expected = gather_ref(x.shape, lambda i: x[i] if keep(i[-2], i[-1]) else 0.0)
        assert_close(op(Tensor(x), k), expected, rtol=0, atol=0)
    return check


# --- elementwise, the rest ------------------------------------------------------------------------------

def untied_grad(op):
    """maximum / minimum: a and b never (nearly) equal, away from the kink a == b."""
    def case(data):
        a, b = data.draw(untied_pair(broadcastable_shapes(2)), label="a, b")
        event(f"broadcasting: {a.shape != b.shape}")
        return op, [a, b]
    return case


def where_grad(data):
    condition, x, y = data.draw(where_inputs(), label="condition, x, y")
    return (lambda x, y: F.where(condition, x, y)), [x, y]


def where_forward(data):
    condition, x, y = data.draw(where_inputs(), label="condition, x, y")
    assert_close(F.where(condition, Tensor(x), Tensor(y)), pointwise(lambda c, a, b: a if c else b, condition, x, y))


def clip_grad(data):
    low, high = data.draw(st.sampled_from([(-0.5, 0.5), (-0.5, None), (None, 0.5)]), label="bounds")
    x = data.draw(arrays(data.draw(shapes()), away_from([-0.5, 0.5])), label="x")
    return (lambda t: F.clip(t, low, high)), [x]


def softplus_grad(data):
    beta = data.draw(st.sampled_from([1.0, 2.0]), label="beta")
    # beta * x either in the soft region or clearly past the threshold (20), never at the switch
    values = st.one_of(smooth(-6.0, 6.0), smooth(10.5, 14.0))
    x = data.draw(arrays(data.draw(shapes()), values), label="x")
    return (lambda t: F.softplus(t, beta=beta)), [x]


# --- linear algebra -------------------------------------------------------------------------------------

def matmul_grad(data):
    shape_a, shape_b = data.draw(matmul_shapes(), label="shapes")
    event(f"operand dims: {len(shape_a)}, {len(shape_b)}")
    return F.matmul, [data.draw(arrays(shape_a), label="a"), data.draw(arrays(shape_b), label="b")]


def matmul_transposed_grad(data):
    """2-d products of transposed views (Linear's x @ W.T), whose gradients Matmul lays out like the operand:
    a_t.T @ b, a @ b_t.T or a_t.T @ b_t.T, the stored arrays drawn transposed."""
    m, k, n = (data.draw(st.integers(1, 4), label=name) for name in "mkn")
    which = data.draw(st.sampled_from(["a", "b", "both"]), label="transposed")
    a = data.draw(arrays((k, m) if which != "b" else (m, k)), label="a")
    b = data.draw(arrays((n, k) if which != "a" else (k, n)), label="b")

    def fn(x, y):
        return F.matmul(x.T if which != "b" else x, y.T if which != "a" else y)
    return fn, [a, b]


def matmul_forward(reference):
    def check(data):
        shape_a, shape_b = data.draw(matmul_shapes(), label="shapes")
        a, b = data.draw(arrays(shape_a), label="a"), data.draw(arrays(shape_b), label="b")
        assert_forward(F.matmul, reference, a, b)
        assert_close(Tensor(a) @ Tensor(b), reference(a, b))
    return check


def einsum_grad(subscripts):
    def case(data):
        operand_shapes = data.draw(einsum_shapes(subscripts), label="shapes")
        operands = [data.draw(arrays(s), label=f"operand {i}") for i, s in enumerate(operand_shapes)]
        return (lambda *ts: F.einsum(subscripts, *ts)), operands
    return case


def einsum_forward(subscripts, reference):
    def check(data):
        operands = [data.draw(arrays(s), label=f"x{i}") for i, s in enumerate(data.draw(einsum_shapes(subscripts)))]
        assert_close(F.einsum(subscripts, *map(Tensor, operands)), reference(subscripts, *operands))
    return check


# --- layers' building blocks ----------------------------------------------------------------------------

def embedding_grad(data):
    vocab, dim = data.draw(st.integers(1, 5), label="vocab"), data.draw(st.integers(1, 3), label="dim")
    ids = data.draw(hnp.arrays(np.int64, shapes(min_dims=0, max_dims=2), elements=st.integers(0, vocab - 1)),
                    label="ids")  # repeated ids: their rows' gradients must add up
    return (lambda w: F.embedding(ids, w)), [data.draw(arrays((vocab, dim)), label="weight")]


def embedding_forward(data):
    vocab, dim = data.draw(st.integers(1, 5), label="vocab"), data.draw(st.integers(1, 3), label="dim")
    ids = data.draw(hnp.arrays(np.int64, shapes(min_dims=0, max_dims=2), elements=st.integers(0, vocab - 1)))
    weight = data.draw(arrays((vocab, dim)), label="weight")  # (V, d)
    rows = weight.tolist()
    expected = np.array([rows[i] for i in ids.reshape(-1).tolist()]).reshape(ids.shape + (dim,))  # (..., d)
    assert_close(F.embedding(ids, Tensor(weight)), expected, rtol=0, atol=0)


def causal_conv1d_grad(data):
    with_bias = data.draw(st.booleans(), label="with_bias")
    b, l, c, k = (data.draw(st.integers(1, n), label=name) for n, name in ((2, "b"), (5, "l"), (3, "c"), (4, "k")))
    x = data.draw(arrays((b, l, c)), label="x")           # (b, l, c)
    weight = data.draw(arrays((c, 1, k)), label="weight")  # (c, 1, k)
    if with_bias:
        return F.causal_conv1d, [x, weight, data.draw(arrays((c,)), label="bias")]
    return F.causal_conv1d, [x, weight]


def causal_conv1d_forward(reference):
    def check(data):
        with_bias, weight_3d = data.draw(st.booleans(), label="with_bias"), data.draw(st.booleans(), label="3-d")
        b, l, c, k = (data.draw(st.integers(1, n), label=name) for n, name in ((2, "b"), (6, "l"), (3, "c"), (4, "k")))
        x = data.draw(arrays((b, l, c)), label="x")                                   # (b, l, c)
        weight = data.draw(arrays((c, 1, k) if weight_3d else (c, k)), label="weight")  # (c, 1, k) or (c, k)
        bias = data.draw(arrays((c,)), label="bias") if with_bias else None           # (c,)
        assert_forward(F.causal_conv1d, reference, x, weight, bias)
    return check


def rms_norm_grad(data):
    with_weight = data.draw(st.booleans(), label="with_weight")
    shape = data.draw(shapes(min_dims=1), label="shape")
    x = data.draw(arrays(shape, away_from_zero(0.2, 2.0)), label="x")  # (..., d), rms well above sqrt(eps)
    if with_weight:
        return (lambda t, w: F.rms_norm(t, w, eps=1e-5)), [x, data.draw(arrays(shape[-1:]), label="weight")]
    return (lambda t: F.rms_norm(t, eps=1e-5)), [x]


def rms_norm_forward(reference):
    def check(data):
        with_weight = data.draw(st.booleans(), label="with_weight")
        eps = data.draw(st.sampled_from([1e-5, 1e-6, 0.5]), label="eps")
        x = data.draw(arrays(data.draw(shapes(min_dims=1))), label="x")
        weight = data.draw(arrays(x.shape[-1:]), label="weight") if with_weight else None  # (d,)
        assert_forward(lambda t, w: F.rms_norm(t, w, eps), lambda v, w: reference(v, w, eps), x, weight)
    return check
