"""Every op in tinygrad_ssm.functional.OPS, gradchecked in float64 on hypothesis-drawn shapes and values
(broadcasting included for the binary ops). `COVERAGE` (tests/op_coverage.py) records which test checks which op, and
`test_every_public_op_has_a_gradient_check` fails when an op of the public list has none."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import event, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from op_coverage import OpCoverage
from gradcheck import gradcheck
from strategies import (EINSUM_SPECS, arrays, away_from, away_from_zero, axis_arguments, broadcastable_shapes,
                        distinct_arrays, einsum_shapes, expand_pairs, matmul_shapes, positive, reshape_targets,
                        shape_and_axis, shapes, smooth, untied_pair,
                        where_inputs)
from tinygrad_ssm import Function, Tensor
from tinygrad_ssm import functional as F

COVERAGE = OpCoverage("gradient check")
checks = COVERAGE.checks


def test_every_public_op_has_a_gradient_check():
    COVERAGE.assert_complete()


class _SquareWithWrongBackward(Function):
    def forward(self, a):
        self.save_for_backward(a)
        return a * a

    def backward(self, grad):
        (a,) = self.saved
        return grad * a  # the 2 is missing


@pytest.mark.parametrize("fast", [False, True])
def test_gradcheck_rejects_a_wrong_backward(fast):
    x = np.linspace(0.5, 2.0, 6).reshape(2, 3)
    gradcheck(lambda t: t * t, x, fast=fast)  # the right one passes
    with pytest.raises(AssertionError, match="input 0"):
        gradcheck(_SquareWithWrongBackward.apply, x, fast=fast)


# --- elementwise ----------------------------------------------------------------------------------------

UNARY = {
    "neg": (F.neg, smooth()),
    "exp": (F.exp, smooth()),
    "log": (F.log, positive()),
    "sqrt": (F.sqrt, positive()),
    "rsqrt": (F.rsqrt, positive()),
    "abs": (F.abs, away_from_zero()),
    "tanh": (F.tanh, smooth(-4, 4)),
    "sigmoid": (F.sigmoid, smooth(-6, 6)),
    "silu": (F.silu, smooth(-6, 6)),
    "relu": (F.relu, away_from_zero()),
}


@checks(*UNARY)
@pytest.mark.parametrize("name", sorted(UNARY))
@given(data=st.data())
def test_unary_grad(name, data):
    op, values = UNARY[name]
    x = data.draw(arrays(data.draw(shapes()), values), label="x")
    gradcheck(op, x)


BINARY = {
    "add": (F.add, smooth(), smooth()),
    "sub": (F.sub, smooth(), smooth()),
    "mul": (F.mul, smooth(), smooth()),
    "div": (F.div, smooth(), away_from_zero(0.5, 2.0)),
    "pow": (F.pow, positive(0.5, 2.0), smooth(-2.0, 2.0)),  # a > 0: d/db = a^b log a exists
}


@checks(*BINARY)
@pytest.mark.parametrize("name", sorted(BINARY))
@given(data=st.data())
def test_binary_grad_broadcasting(name, data):
    op, values_a, values_b = BINARY[name]
    shape_a, shape_b = data.draw(broadcastable_shapes(2), label="shapes")
    event(f"broadcasting: {shape_a != shape_b}")
    a = data.draw(arrays(shape_a, values_a), label="a")
    b = data.draw(arrays(shape_b, values_b), label="b")
    gradcheck(op, a, b)


WITH_SCALAR = {  # the reflected operators (__rsub__, __rtruediv__, __rpow__) route the scalar correctly
    "x + 2.5": lambda x: x + 2.5, "2.5 - x": lambda x: 2.5 - x, "x * -1.5": lambda x: x * -1.5,
    "3.0 / x": lambda x: 3.0 / x, "x / 4.0": lambda x: x / 4.0, "x ** 3": lambda x: x ** 3,
    "x ** 0.5": lambda x: x ** 0.5, "2.0 ** x": lambda x: 2.0 ** x,
}


@pytest.mark.parametrize("expression", list(WITH_SCALAR))
@given(data=st.data())
def test_operator_with_python_scalar_grad(expression, data):
    x = data.draw(arrays(data.draw(shapes()), positive(0.5, 2.0)), label="x")
    gradcheck(WITH_SCALAR[expression], x)


@checks("maximum", "minimum")
@pytest.mark.parametrize("name", ["maximum", "minimum"])
@given(data=st.data())
def test_maximum_minimum_grad(name, data):
    a, b = data.draw(untied_pair(broadcastable_shapes(2)), label="a, b")
    event(f"broadcasting: {a.shape != b.shape}")
    gradcheck(getattr(F, name), a, b)


@checks("where")
@given(data=st.data())
def test_where_grad(data):
    condition, x, y = data.draw(where_inputs(), label="condition, x, y")
    gradcheck(lambda x, y: F.where(condition, x, y), x, y)


CLIP_BOUNDS = [(-0.5, 0.5), (-0.5, None), (None, 0.5)]


@checks("clip")
@given(data=st.data(), bounds=st.sampled_from(CLIP_BOUNDS))
def test_clip_grad(data, bounds):
    low, high = bounds
    x = data.draw(arrays(data.draw(shapes()), away_from([-0.5, 0.5])), label="x")
    gradcheck(lambda t: F.clip(t, low, high), x)


@checks("softplus")
@given(data=st.data(), beta=st.sampled_from([1.0, 2.0]))
def test_softplus_grad(data, beta):
    # beta * x either in the soft region or clearly past the threshold (20), never at the switch
    values = st.one_of(smooth(-6.0, 6.0), smooth(10.5, 14.0))
    x = data.draw(arrays(data.draw(shapes()), values), label="x")
    gradcheck(lambda t: F.softplus(t, beta=beta), x)


@checks("cast")
@given(data=st.data())
def test_cast_grad(data):
    # A float32 round trip would round the eps=1e-6 perturbation away, so the cast under test goes up to the
    # wider long double and back: both directions of Cast, and a backward (x^2) computed in long double.
    x = data.draw(arrays(data.draw(shapes())), label="x")
    gradcheck(lambda t: F.cast(F.cast(t, np.longdouble) * F.cast(t, np.longdouble), np.float64), x)


def test_cast_to_float32_grad_comes_back_float64():
    x = Tensor(np.array([1.0, -2.0, 3.0]), requires_grad=True)
    y = F.cast(x, np.float32)
    assert y.dtype == np.float32
    (y * Tensor(np.array([2.0, 3.0, 4.0], np.float32))).sum().backward()
    assert x.grad.dtype == np.float64
    np.testing.assert_array_equal(x.grad.data, [2.0, 3.0, 4.0])


# --- reductions -----------------------------------------------------------------------------------------

REDUCTIONS = {"sum": F.sum, "mean": F.mean, "logsumexp": F.logsumexp}


@checks(*REDUCTIONS)
@pytest.mark.parametrize("name", sorted(REDUCTIONS))
@given(data=st.data(), keepdims=st.booleans())
def test_reduction_grad(name, data, keepdims):
    shape = data.draw(shapes(), label="shape")
    axis = data.draw(axis_arguments(len(shape)), label="axis")
    x = data.draw(arrays(shape), label="x")
    gradcheck(lambda t: REDUCTIONS[name](t, axis=axis, keepdims=keepdims), x)


@checks("max")
@given(data=st.data(), keepdims=st.booleans())
def test_max_grad(data, keepdims):
    shape = data.draw(shapes(), label="shape")
    axis = data.draw(axis_arguments(len(shape)), label="axis")
    x = data.draw(distinct_arrays(shape), label="x")  # no ties: the max is a single entry
    gradcheck(lambda t: F.max(t, axis=axis, keepdims=keepdims), x)


ALONG_AXIS = {"softmax": F.softmax, "log_softmax": F.log_softmax, "cumsum": F.cumsum}


@checks(*ALONG_AXIS)
@pytest.mark.parametrize("name", sorted(ALONG_AXIS))
@given(data=st.data())
def test_along_axis_grad(name, data):
    shape, axis = data.draw(shape_and_axis(min_dims=0), label="shape, axis")
    x = data.draw(arrays(shape), label="x")
    gradcheck(lambda t: ALONG_AXIS[name](t, axis), x)


@st.composite
def cross_entropy_cases(draw):
    """logits (..., C), integer targets (...) with some rows ignored (-100), and a reduction."""
    lead = draw(shapes(min_dims=1, max_dims=2))
    classes = draw(st.integers(1, 5))
    logits = draw(arrays(lead + (classes,), smooth(-4, 4)))
    targets = draw(hnp.arrays(np.int64, lead, elements=st.one_of(st.integers(0, classes - 1), st.just(-100))))
    reduction = draw(st.sampled_from(["mean", "sum", "none"]))
    if reduction == "mean" and (targets == -100).all():
        targets.flat[0] = classes - 1  # a mean over no rows is nan, as in torch; that case has its own test
    return logits, targets, reduction


@checks("cross_entropy")
@given(case=cross_entropy_cases())
def test_cross_entropy_grad(case):
    logits, targets, reduction = case
    gradcheck(lambda t: F.cross_entropy(t, targets, reduction=reduction), logits)


def test_cross_entropy_mean_over_only_ignored_rows():
    # as torch: the mean over no rows is nan, and no row gets a gradient
    logits = Tensor(np.ones((2, 3)), requires_grad=True)
    loss = F.cross_entropy(logits, np.array([-100, -100]))
    assert np.isnan(loss.item())
    loss.backward()
    np.testing.assert_array_equal(logits.grad.data, np.zeros((2, 3)))


# --- linear algebra -------------------------------------------------------------------------------------

@checks("matmul")
@given(data=st.data())
def test_matmul_grad(data):
    shape_a, shape_b = data.draw(matmul_shapes(), label="shapes")
    event(f"operand dims: {len(shape_a)}, {len(shape_b)}")
    a, b = data.draw(arrays(shape_a), label="a"), data.draw(arrays(shape_b), label="b")
    gradcheck(F.matmul, a, b)


@checks("einsum")
@pytest.mark.parametrize("subscripts", EINSUM_SPECS)
@given(data=st.data())
def test_einsum_grad(subscripts, data):
    operand_shapes = data.draw(einsum_shapes(subscripts), label="shapes")
    operands = [data.draw(arrays(s), label=f"operand {i}") for i, s in enumerate(operand_shapes)]
    gradcheck(lambda *ts: F.einsum(subscripts, *ts), *operands)


# --- shape ----------------------------------------------------------------------------------------------

@checks("reshape")
@given(data=st.data())
def test_reshape_grad(data):
    shape = data.draw(shapes(), label="shape")
    target = data.draw(reshape_targets(shape), label="target")
    x = data.draw(arrays(shape), label="x")
    gradcheck(lambda t: F.reshape(t, target), x)


@checks("flatten")
@given(data=st.data())
def test_flatten_grad(data):
    shape = data.draw(shapes(min_dims=1), label="shape")
    start = data.draw(st.integers(0, len(shape) - 1), label="start")
    end = data.draw(st.integers(start, len(shape) - 1), label="end")
    gradcheck(lambda t: F.flatten(t, start, end), data.draw(arrays(shape), label="x"))


@checks("permute")
@given(data=st.data())
def test_permute_grad(data):
    shape = data.draw(shapes(), label="shape")
    axes = data.draw(st.permutations(range(len(shape))), label="axes")
    gradcheck(lambda t: F.permute(t, axes), data.draw(arrays(shape), label="x"))


@checks("transpose")
@given(data=st.data())
def test_transpose_grad(data):
    shape = data.draw(shapes(min_dims=2), label="shape")
    axis0, axis1 = (data.draw(st.integers(-len(shape), len(shape) - 1), label=n) for n in ("axis0", "axis1"))
    gradcheck(lambda t: F.transpose(t, axis0, axis1), data.draw(arrays(shape), label="x"))


@checks("expand")
@given(data=st.data())
def test_expand_grad(data):
    source, target = data.draw(expand_pairs(), label="source, target")
    gradcheck(lambda t: F.expand(t, target), data.draw(arrays(source), label="x"))


@checks("unsqueeze")
@given(data=st.data())
def test_unsqueeze_grad(data):
    shape = data.draw(shapes(), label="shape")
    axis = data.draw(st.integers(-len(shape) - 1, len(shape)), label="axis")
    gradcheck(lambda t: F.unsqueeze(t, axis), data.draw(arrays(shape), label="x"))


@checks("squeeze")
@given(data=st.data())
def test_squeeze_grad(data):
    shape = data.draw(shapes(min_side=1, max_side=2), label="shape")  # plenty of size-1 axes
    axis = data.draw(axis_arguments(len(shape)), label="axis")
    gradcheck(lambda t: F.squeeze(t, axis), data.draw(arrays(shape), label="x"))


@st.composite
def getitem_cases(draw):
    """(shape, index): basic indexing (ints, slices with steps, None, Ellipsis), integer arrays (repeats make
    the scatter-add matter), integer arrays mixed with a slice, or a bool mask."""
    shape = draw(shapes(min_dims=1))
    kind = draw(st.sampled_from(["basic", "integer", "mixed", "mask"]))
    if kind == "basic":
        index = draw(hnp.basic_indices(shape, min_dims=0, allow_newaxis=True, allow_ellipsis=True))
    elif kind == "integer":
        index = draw(hnp.integer_array_indices(shape, result_shape=shapes(min_dims=1, max_dims=2)))
    elif kind == "mixed":
        rows = draw(hnp.arrays(np.int64, draw(shapes(min_dims=1, max_dims=2)),
                               elements=st.integers(-shape[0], shape[0] - 1)))
        index = (rows,) + (slice(None, None, -1),) * (len(shape) > 1)
    else:
        index = draw(hnp.arrays(np.bool_, shape))
    return shape, index, kind


@checks("getitem")
@given(case=getitem_cases(), data=st.data())
def test_getitem_grad(case, data):
    shape, index, kind = case
    event(f"index kind: {kind}")
    gradcheck(lambda t: F.getitem(t, index), data.draw(arrays(shape), label="x"))


@st.composite
def concat_cases(draw, same_shape: bool):
    """1-3 shapes equal except along `axis` (all equal when `same_shape`), and the axis."""
    base, axis = draw(shape_and_axis(min_dims=1))
    count = draw(st.integers(1, 3))
    out = []
    for _ in range(count):
        shape = list(base)
        if not same_shape:
            shape[axis] = draw(st.integers(1, 3))
        out.append(tuple(shape))
    return out, axis


@checks("cat")
@given(case=concat_cases(same_shape=False), data=st.data())
def test_cat_grad(case, data):
    shape_list, axis = case
    inputs = [data.draw(arrays(s), label=f"x{i}") for i, s in enumerate(shape_list)]
    gradcheck(lambda *ts: F.cat(ts, axis), *inputs)


@checks("stack")
@given(case=concat_cases(same_shape=True), data=st.data())
def test_stack_grad(case, data):
    shape_list, axis = case
    axis = data.draw(st.integers(-len(shape_list[0]) - 1, len(shape_list[0])), label="stack axis")
    inputs = [data.draw(arrays(s), label=f"x{i}") for i, s in enumerate(shape_list)]
    gradcheck(lambda *ts: F.stack(ts, axis), *inputs)


@checks("split")
@given(data=st.data())
def test_split_grad(data):
    shape, axis = data.draw(shape_and_axis(), label="shape, axis")
    n = shape[axis]
    sections = data.draw(st.one_of(st.integers(1, n + 1), st.lists(st.integers(0, n), min_size=1, max_size=3)
                                   .map(lambda cuts: np.diff([0, *sorted(cuts), n]).tolist())), label="sections")

    def split_then_join(t):  # each piece scaled differently, so a gradient routed to the wrong piece shows
        pieces = F.split(t, sections, axis)
        return F.cat([p * float(i + 1) for i, p in enumerate(pieces)], axis)

    gradcheck(split_then_join, data.draw(arrays(shape), label="x"))


@checks("pad")
@given(data=st.data(), value=st.sampled_from([0.0, -1.5]))
def test_pad_grad(data, value):
    shape = data.draw(shapes(min_dims=1), label="shape")
    pad = data.draw(st.lists(st.integers(0, 2), min_size=0, max_size=2 * len(shape))
                    .filter(lambda p: len(p) % 2 == 0), label="pad")
    gradcheck(lambda t: F.pad(t, pad, value), data.draw(arrays(shape), label="x"))


@checks("flip")
@given(data=st.data())
def test_flip_grad(data):
    shape = data.draw(shapes(), label="shape")
    axis = data.draw(axis_arguments(len(shape)), label="axis")
    gradcheck(lambda t: F.flip(t, axis), data.draw(arrays(shape), label="x"))


@checks("tril", "triu")
@pytest.mark.parametrize("name", ["tril", "triu"])
@given(data=st.data(), k=st.integers(-2, 2))
def test_triangle_grad(name, data, k):
    shape = data.draw(shapes(min_dims=2), label="shape")
    gradcheck(lambda t: getattr(F, name)(t, k), data.draw(arrays(shape), label="x"))


# --- layers' building blocks ----------------------------------------------------------------------------

@checks("embedding")
@given(data=st.data())
def test_embedding_grad(data):
    vocab, dim = data.draw(st.integers(1, 5), label="vocab"), data.draw(st.integers(1, 3), label="dim")
    ids = data.draw(hnp.arrays(np.int64, shapes(min_dims=0, max_dims=2), elements=st.integers(0, vocab - 1)),
                    label="ids")  # repeated ids: their rows' gradients must add up
    gradcheck(lambda w: F.embedding(ids, w), data.draw(arrays((vocab, dim)), label="weight"))


@checks("causal_conv1d")
@given(data=st.data(), with_bias=st.booleans())
def test_causal_conv1d_grad(data, with_bias):
    b, l, c, k = (data.draw(st.integers(1, n), label=name) for n, name in ((2, "b"), (5, "l"), (3, "c"), (4, "k")))
    x = data.draw(arrays((b, l, c)), label="x")           # (b, l, c)
    weight = data.draw(arrays((c, 1, k)), label="weight")  # (c, 1, k)
    if with_bias:
        gradcheck(F.causal_conv1d, x, weight, data.draw(arrays((c,)), label="bias"))
    else:
        gradcheck(F.causal_conv1d, x, weight)


@checks("rms_norm")
@given(data=st.data(), with_weight=st.booleans())
def test_rms_norm_grad(data, with_weight):
    shape = data.draw(shapes(min_dims=1), label="shape")
    x = data.draw(arrays(shape, away_from_zero(0.2, 2.0)), label="x")  # (..., d), rms well above sqrt(eps)
    if with_weight:
        gradcheck(lambda t, w: F.rms_norm(t, w, eps=1e-5), x, data.draw(arrays(shape[-1:]), label="weight"))
    else:
        gradcheck(lambda t: F.rms_norm(t, eps=1e-5), x)


# --- whole graphs: fan-out, reuse and broadcasting mixed -------------------------------------------------

GRAPH_STEPS = {  # each step makes a new node from one or two earlier ones
    "add": lambda a, b: a + b, "mul": lambda a, b: a * b, "sub": lambda a, b: a - b,
    "tanh": lambda a, b: F.tanh(a), "sigmoid": lambda a, b: F.sigmoid(a), "square": lambda a, b: a * a,
    "row_sum": lambda a, b: F.sum(a, axis=-1, keepdims=True) * 0.3,  # (.., 1): broadcasts back in later steps
}


@st.composite
def random_graphs(draw):
    """A recipe of 2-8 steps over 1-3 inputs; every step may reuse any earlier node (fan-out, diamonds)."""
    n_inputs = draw(st.integers(1, 3))
    steps = []
    for i in range(draw(st.integers(2, 8))):
        available = n_inputs + i
        steps.append((draw(st.sampled_from(sorted(GRAPH_STEPS))), draw(st.integers(0, available - 1)),
                      draw(st.integers(0, available - 1))))
    return n_inputs, steps


@given(recipe=random_graphs(), data=st.data())
def test_random_graph_grad(recipe, data):
    n_inputs, steps = recipe
    shape = data.draw(shapes(min_dims=1, max_dims=2), label="shape")
    inputs = [data.draw(arrays(shape, smooth(-1.5, 1.5)), label=f"x{i}") for i in range(n_inputs)]

    def graph(*xs):
        nodes = list(xs)
        for name, i, j in steps:
            nodes.append(GRAPH_STEPS[name](nodes[i], nodes[j]))
        out = nodes[-1]
        for x in xs:
            out = out + x * 0.0  # an input no step used still gets its (zero) gradient
        return out

    gradcheck(graph, *inputs)
