"""More rules at the edges, each found by differential testing against torch (an audit, /tmp/audit_autograd): an
infinite gradient meeting a masked-out input, and 0-d and size-0 tensors through cumsum, flatten, transpose, pad.
The expected values are torch 2.13's, written out, so that the tests run without torch."""
from __future__ import annotations

import numpy as np
import pytest

from tinygrad_ssm import Tensor, no_grad
from tinygrad_ssm.autograd import functional as F

from tests.support.tensors import leaf


# --- an infinite gradient where an input was masked out: 0 there (torch picks), not inf * 0 = NaN ---------------

@pytest.mark.parametrize("gate", [
    F.relu, lambda x: F.clip(x, min=0.0), lambda x: F.clip(x, min=0.0, max=9.0), lambda x: F.maximum(x, 0.0),
    lambda x: -F.minimum(-x, 0.0),
], ids=["relu", "clip_min", "clip_both", "maximum", "minimum"])
def test_sqrt_of_a_gate_has_a_zero_gradient_where_the_gate_was_shut(gate):
    """sqrt(relu(x)) at x = -1: the gradient reaching relu is inf (sqrt's at 0); relu's backward multiplied it by
    a 0/1 mask and gave NaN, which the optimizer then wrote into every weight (torch: 0)."""
    x = leaf([-1.0, 4.0, -1e-300])
    F.sqrt(gate(x)).sum().backward()
    np.testing.assert_array_equal(x.grad.data, [0.0, 0.25, 0.0])


def test_relu_is_shut_at_zero_where_clip_and_maximum_pass_half_or_all():
    """At x = 0 exactly torch's relu gives 0, its clamp the whole (inf) gradient, its maximum half of it (inf)."""
    for gate, expected in ((F.relu, 0.0), (lambda x: F.clip(x, min=0.0), np.inf),
                           (lambda x: F.maximum(x, 0.0), np.inf)):
        x = leaf([0.0])
        F.sqrt(gate(x)).sum().backward()
        assert x.grad.data[0] == expected


def test_maximum_splits_a_tie_and_passes_nan_both_ways():
    """The picking keeps the rules of the multiplication it replaced: half of the gradient each on a tie, all of
    it to both where either is NaN (torch's)."""
    a, b = leaf([1.0, 2.0, np.nan, 3.0]), leaf([1.0, 5.0, 0.0, np.nan])
    F.maximum(a, b).backward(Tensor(np.array([2.0, 2.0, 2.0, 2.0])))
    np.testing.assert_array_equal(a.grad.data, [1.0, 0.0, 2.0, 2.0])
    np.testing.assert_array_equal(b.grad.data, [1.0, 2.0, 2.0, 2.0])


def test_pow_lets_an_infinite_gradient_through_its_exponents_zero():
    """log(x ** y) at x = 0, y = 2: d/dy is inf * 0, NaN in torch; the engine replaced the whole product by 0,
    hiding that the loss was -inf. d/dx at y = 0 stays 0 (x ** 0 is 1 for every x), an inf gradient or not."""
    x, y = leaf([0.0, 2.0]), leaf([2.0, 3.0])
    F.log(F.pow(x, y)).sum().backward()
    assert np.isnan(y.grad.data[0]) and y.grad.data[1] == pytest.approx(np.log(2.0))
    x, y = leaf([0.0]), leaf([0.0])
    (F.pow(x, y) * np.inf).sum().backward()
    assert x.grad.data[0] == 0.0


# --- 0-d and size-0 tensors ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype, expected", [(np.float64, np.float64), (np.float32, np.float32), (np.bool_, np.int64),
                                             (np.int32, np.int64)])
def test_cumsum_of_a_0d_tensor_is_a_new_tensor_in_sums_dtype(dtype, expected):
    """It returned a view of its input in the input's dtype: y.add_(1) changed x (torch: x stays)."""
    x = Tensor(np.array(5, dtype=dtype))
    y = F.cumsum(x, 0)
    assert y.shape == () and y.dtype == expected and y.item() == np.array(5, dtype).astype(expected)
    if y.dtype.kind == "f":
        y.add_(1)
        assert x.item() == 5


def test_cumsum_of_a_0d_tensor_has_gradient_one():
    x = leaf(3.0)
    (F.cumsum(x, 0) * 2).backward()
    assert x.grad.item() == 2.0


@pytest.mark.parametrize("shape, start, end, expected", [((0, 3), 1, -1, (0, 3)), ((3, 0), 0, 0, (3, 0)),
                                                         ((0, 2, 3), 1, 1, (0, 2, 3)), ((2, 0, 3), 0, -1, (0,)),
                                                         ((2, 3, 4), 1, 2, (2, 12))])
def test_flatten_of_a_size_0_tensor_keeps_the_other_sizes(shape, start, end, expected):
    """flatten((0, 3), 1) was refused: the -1 it gave reshape cannot be inferred when the rest has size 0."""
    x = Tensor(np.zeros(shape), requires_grad=True)
    out = F.flatten(x, start, end)
    assert out.shape == expected
    out.sum().backward()
    assert x.grad.shape == shape


def test_transpose_and_pad_of_a_0d_tensor_are_the_tensor():
    """transpose(x0d, 0, -1) raised a bare IndexError and pad(x0d, ()) NumPy's 'pad_width must be of integral
    type'; torch gives the value back (pad as a new tensor)."""
    x = leaf(5.0)
    assert F.transpose(x, 0, -1).shape == () and F.transpose(x, 0, -1).item() == 5.0
    padded = F.pad(x, ())
    assert padded.shape == () and padded.item() == 5.0
    (F.transpose(x, 0, 0) * 3 + padded * 2).backward()
    assert x.grad.item() == 5.0
    with pytest.raises(ValueError, match="at most 0 axes"):
        F.pad(x, (1, 1))


# --- writes across dtypes: stored as torch stores them, a value no integer holds refused ---------------------------

def test_copy_into_an_integer_or_bool_tensor_casts_as_torch():
    """copy_ refused float64 into int64 ('convert the tensor first'), where torch's copy_ converts by design."""
    t = Tensor(np.zeros(3, np.int64))
    t.copy_(Tensor(np.array([1.7, -2.2, 0.9])))
    np.testing.assert_array_equal(t.data, [1, -2, 0])                    # truncated toward zero
    b = Tensor(np.zeros(3, bool))
    b.copy_(Tensor(np.array([0.0, 2.0, -0.5])))
    np.testing.assert_array_equal(b.data, [False, True, True])          # nonzero
    u = Tensor(np.zeros(2, np.uint8))
    u.copy_(Tensor(np.array([300, -1])))                                 # an integer wraps, as torch's
    np.testing.assert_array_equal(u.data, [44, 255])


@pytest.mark.parametrize("write", [lambda t, v: t.copy_(Tensor(np.array([v, 1.0]))), lambda t, v: t.fill_(v),
                                   lambda t, v: t.__setitem__(0, v), lambda t, v: t.__setitem__(0, np.float64(v))],
                         ids=["copy_", "fill_", "setitem", "setitem_numpy"])
@pytest.mark.parametrize("value", [np.nan, np.inf, 128.0, -129.0])
def test_a_float_no_integer_of_the_dtype_holds_is_refused_and_nothing_written(write, value):
    """fill_(nan) on an int tensor stored -9223372036854775808 without a word (torch refuses it); 128.0 into int8
    stored -128."""
    t = Tensor(np.array([5, 6], np.int8))
    with pytest.raises(OverflowError, match=r"cannot be stored in this int8 tensor .*-128\.\.127"):
        write(t, value)
    np.testing.assert_array_equal(t.data, [5, 6])
    write(t, 127.9)                                                      # the edge itself: truncated to 127
    assert t.data[0] == 127


def test_in_place_arithmetic_stores_an_integer_result_in_any_integer_tensor_and_no_float_one():
    """uint8.add_(an int64 tensor) was refused by NumPy's same_kind rule; torch wraps it. A float result in an
    integer tensor, or a number in a bool one, stays refused (torch's can_cast)."""
    u = Tensor(np.ones(2, np.uint8))
    u.mul_(Tensor(np.array([300, -1])))
    np.testing.assert_array_equal(u.data, [44, 255])
    i = Tensor(np.ones(2, np.int32))
    i.add_(Tensor(np.array([True, False])))
    np.testing.assert_array_equal(i.data, [2, 1])
    with pytest.raises(TypeError, match=r"add_: the result cannot be stored in place in this int64 tensor \(it is "
                                        r"float64\)"):
        Tensor(np.ones(2, np.int64)).add_(Tensor(np.array([0.5, 0.5])))
    with pytest.raises(TypeError, match=r"add_: the result cannot be stored in place in this bool tensor"):
        Tensor(np.ones(2, bool)).add_(Tensor(np.array([3, 4])))
    with pytest.raises(TypeError, match=r"div_: .* int64 tensor \(it is float64\)"):
        Tensor(np.ones(2, np.int64)).div_(2)


# --- what an op saves: only what its backward reads, so that a change in place elsewhere is not refused ---------

def test_a_power_with_a_number_exponent_lets_its_output_change_in_place():
    """y = x ** 2.0 saved y for d/d(exponent), which nothing needs: y.add_(1) then refused the backward (torch
    runs it); the gradient is 2x, from x and the exponent alone."""
    x = leaf([1.0, 2.0])
    y = x ** 2.0
    with no_grad():
        y.add_(1.0)
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.data, [2.0, 4.0])
    x, e = leaf([1.0, 2.0]), leaf([2.0, 2.0])                          # d/de reads the output: a change is refused
    y = F.pow(x, e)
    with no_grad():
        y.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_relu_saves_its_output_so_its_input_may_change():
    """relu saved its input: changing it in place after relu refused the backward (torch saves the output)."""
    x = leaf([-1.0, 2.0, np.nan])
    h = x * 1.0
    y = F.relu(h)
    with no_grad():
        h.mul_(-1.0)
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.data, [0.0, 1.0, 1.0])     # NaN passes, as torch's threshold_backward
    y = F.relu(x * 1.0)
    with no_grad():
        y.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


@pytest.mark.parametrize("op", [lambda x: F.softmax(x, -1), lambda x: F.log_softmax(x, 0), lambda x: F.cumsum(x, 0),
                                lambda x: F.pad(x, (1, 1))], ids=["softmax", "log_softmax", "cumsum", "pad"])
def test_results_of_a_transposed_input_are_contiguous_so_view_works(op):
    """NumPy kept the transposed input's column order in these results, and .view(-1) refused them (torch's are
    contiguous, its view works). The values are those of the input made contiguous first."""
    a = np.arange(6.0).reshape(2, 3)
    out = op(Tensor(a.copy()).T)
    np.testing.assert_array_equal(out.view(-1).data, op(Tensor(np.ascontiguousarray(a.T))).data.reshape(-1))
