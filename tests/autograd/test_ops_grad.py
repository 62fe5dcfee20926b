"""Every op in tinygrad_ssm.autograd.functional.OPS, gradchecked in float64 on hypothesis-drawn shapes and values
(broadcasting included for the binary ops): one test per variant of each op's `grad` entry in the table of
tests/support/op_specs.py (whose completeness test fails when an op has no entry)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.gradcheck import gradcheck
from tests.support.op_specs import SPECS
from tests.support.strategies import arrays, positive, shapes, smooth
from tinygrad_ssm import Function, Tensor
from tinygrad_ssm.autograd import functional as F

GRAD_CASES = [pytest.param(name, variant, id=f"{name}-{variant}" if variant else name)
              for name, spec in SPECS.items() for variant in spec.grad]


@pytest.mark.parametrize("name, variant", GRAD_CASES)
@given(data=st.data())
def test_op_gradient(name, variant, data):
    fn, inputs = SPECS[name].grad[variant](data)
    gradcheck(fn, *inputs)


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


def test_cast_to_float32_grad_comes_back_float64():
    x = Tensor(np.array([1.0, -2.0, 3.0]), requires_grad=True)
    y = F.cast(x, np.float32)
    assert y.dtype == np.float32
    (y * Tensor(np.array([2.0, 3.0, 4.0], np.float32))).sum().backward()
    assert x.grad.dtype == np.float64
    np.testing.assert_array_equal(x.grad.data, [2.0, 3.0, 4.0])


def test_cross_entropy_mean_over_only_ignored_rows():
    # as torch: the mean over no rows is nan, and no row gets a gradient
    logits = Tensor(np.ones((2, 3)), requires_grad=True)
    loss = F.cross_entropy(logits, np.array([-100, -100]))
    assert np.isnan(loss.item())
    loss.backward()
    np.testing.assert_array_equal(logits.grad.data, np.zeros((2, 3)))


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
