"""Four differences from torch 2.13 that gave wrong values without an error, found by a differential audit of the
engine against torch (2026-12-07): each test states torch's behaviour, checked by hand with torch."""
from __future__ import annotations

import numpy as np
import pytest

import tinygrad_ssm as tg
from tinygrad_ssm import Tensor
from tinygrad_ssm.autograd import functional as F


@pytest.mark.parametrize("axis", [1, None])
def test_changing_logsumexps_output_in_place_before_backward_is_an_error(axis):
    """logsumexp saves its output with the reduced axes kept and returns it squeezed, a view: the version check
    matched saved arrays to tensors by identity, missed the view, and backward gave softmax times e."""
    a = np.array([[0., 1., 2.], [3., 1., -1.]])
    x = Tensor(a.copy(), requires_grad=True)
    y = F.logsumexp(x, axis=axis)
    y.detach().sub_(1.0)                                                # the output, changed in place
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()
    x = Tensor(a.copy(), requires_grad=True)                            # unchanged: softmax, as before
    F.logsumexp(x, axis=1).sum().backward()
    np.testing.assert_allclose(x.grad, np.exp(a) / np.exp(a).sum(1, keepdims=True), rtol=1e-12)


def test_no_grad_on_a_generator_function_holds_inside_its_body_only():
    """@no_grad() wrapped only the call that makes the generator: its body then ran with grad on (torch: off),
    and the caller's code between two yields must keep the caller's mode."""
    w = Tensor(np.ones(2), requires_grad=True)

    @tg.no_grad()
    def body(w):
        sent = yield w * 2
        yield w * sent
        return "done"
    gen = body(w)
    first = next(gen)
    between = w * 3                                                     # the caller's code: grad on
    second = gen.send(4.0)
    with pytest.raises(StopIteration) as stop:
        next(gen)
    assert not first.requires_grad and not second.requires_grad and between.requires_grad
    assert stop.value.value == "done"

    @tg.no_grad()
    def catches(w):
        try:
            yield w * 2
        except ValueError:
            yield w * 5                                                 # thrown in: still in the mode
    gen = catches(w)
    next(gen)
    assert not gen.throw(ValueError("x")).requires_grad


def test_an_in_place_op_on_one_element_picked_by_integers_changes_the_tensor():
    """t[0] came back as a copy of NumPy's scalar, so t[0].add_(10) changed nothing (torch: t[0] is 11)."""
    t = Tensor(np.array([1., 2., 3.]))
    t[0].add_(10.)
    m = Tensor(np.array([[1., 2.], [3., 4.]]))
    m[0, 1].zero_()
    z = Tensor(np.array(5.))
    z[()].add_(1.)
    assert t.tolist() == [11., 2., 3.] and m.tolist() == [[1., 0.], [3., 4.]] and z.item() == 6.
    picked = Tensor(np.array([1., 2., 3.]))[np.array([0, 0])]         # integer arrays: a copy, as torch
    picked.add_(1.)
    x = Tensor(np.array([1., 2., 3.]), requires_grad=True)              # and the gradient of one element
    (x[1] * 3).backward()
    assert x.grad.tolist() == [0., 3., 0.]


def test_a_float32_tensor_compares_with_a_0d_float64_in_float32():
    """float32 == np.float64(0.1) (or a 0-d float64 array or tensor) compared in float64: [False, False] where
    torch says [True, False], and a mask picked nothing; arithmetic already kept such an operand from widening."""
    o = Tensor(np.array([0.1, 0.5], np.float32))
    for other in (np.float64(0.1), np.array(0.1), Tensor(np.array(0.1)), 0.1):
        assert (o == other).tolist() == [True, False], other
        assert (other == o).tolist() == [True, False], other
    assert (o != np.float64(0.1)).tolist() == [False, True] and (o < np.float64(0.5)).tolist() == [True, False]
    assert o[o == np.float64(0.1)].shape == (1,)
    scalar32 = Tensor(np.array(0.1, np.float32))                        # a 0-d float32 against a float64 array:
    assert (scalar32 == np.array([0.1, 0.5])).tolist() == [False, False]  # float64, as torch promotes it


def test_a_leaf_that_stopped_requiring_grad_after_its_use_gets_no_grad():
    """x.requires_grad_(False) between the forward and backward: torch leaves x.grad None; it was filled."""
    x = Tensor(np.ones(2), requires_grad=True)
    w = Tensor(np.full(2, 3.0), requires_grad=True)
    y = (x * w).sum()
    x.requires_grad_(False)
    y.backward()
    assert x.grad is None and w.grad.tolist() == [1.0, 1.0]


def test_changing_an_operand_no_gradient_reads_is_no_error():
    """Mul and Div kept both operands and checked both versions: `y = (w * 3).sum()`, then an in-place change of w
    under no_grad (an optimizer step), then y.backward() raised, where torch (which saves only what a gradient
    reads) gives 3. An operand a gradient does read is still checked."""
    from tinygrad_ssm import no_grad
    for make, want in ((lambda w, c: w * 3, [3., 3.]), (lambda w, c: c * w, [2., 2.]), (lambda w, c: w / c, [.5, .5])):
        w, c = Tensor(np.ones(2), requires_grad=True), Tensor(np.full(2, 2.0))
        y = make(w, c).sum()
        with no_grad():
            w.sub_(0.1)
        y.backward()
        assert w.grad.tolist() == want
    for make in (lambda w, c: w * c, lambda w, c: w / c, lambda w, c: c / w):
        w, c = Tensor(np.ones(2), requires_grad=True), Tensor(np.full(2, 2.0))
        y = make(w, c).sum()
        with no_grad():
            c.sub_(0.1)                                                 # read by w's gradient
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.backward()


def test_a_retained_non_leaf_grad_is_a_new_sum_at_each_backward():
    """torch sums a retain_grad tensor's gradient out of place (a handle on the old .grad keeps [4, 8]); ours added
    into it in place ([8, 16] through the old handle). A leaf's .grad is still summed in place, as torch."""
    x = Tensor(np.array([1., 2.]), requires_grad=True)
    y = x * 2
    y.retain_grad()
    loss = (y * y).sum()
    loss.backward(retain_graph=True)
    first, first_leaf = y.grad, x.grad
    loss.backward()
    assert first.tolist() == [4., 8.] and y.grad.tolist() == [8., 16.]
    assert first_leaf is x.grad and x.grad.tolist() == [16., 32.]


def test_changing_a_product_operand_no_gradient_reads_is_no_error(matmul=F.matmul):
    """As Mul above, for the products: `(w @ c).sum()`, w changed in place under no_grad, then backward raised
    the version error; torch saves only the operand w's gradient reads (c) and gives 4 everywhere. A transposed
    view (the layout Linear's W.T has) keeps its gradient's layout without the operand. c is still checked.
    tests/fast/test_products.py runs this with the row-split twin's matmul."""
    from tinygrad_ssm import no_grad
    for make, want in ((lambda w, c: matmul(w, c), 4.), (lambda w, c: matmul(c.T, w.T), 4.),
                       (lambda w, c: F.einsum("ij,jk->ik", w, c), 4.),
                       (lambda w, c: F.einsum("ij,j->i", w, c[:, 0]), 2.)):
        w, c = Tensor(np.ones((2, 3)), requires_grad=True), Tensor(np.full((3, 2), 2.0))
        y = make(w, c).sum()
        with no_grad():
            w.sub_(0.1)
        y.backward()
        assert w.grad.shape == (2, 3) and w.grad.tolist() == [[want] * 3] * 2
    for make in (lambda w, c: matmul(w, c), lambda w, c: F.einsum("ij,jk->ik", w, c)):
        w, c = Tensor(np.ones((2, 3)), requires_grad=True), Tensor(np.full((3, 2), 2.0))
        y = make(w, c).sum()
        with no_grad():
            c.sub_(0.1)                                                 # read by w's gradient
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.backward()


def test_ops_that_keep_no_array_may_run_backward_twice():
    """torch's tril, triu and a transposing einsum save no tensors, so a second backward without retain_graph
    runs (and adds the gradient again); ours saved the triangle's mask and the operand and refused."""
    for make, once in ((lambda x: x.tril(), np.tril(np.ones((3, 3)))), (lambda x: x.triu(1), np.triu(np.ones((3, 3)), 1)),
                       (lambda x: F.einsum("ij->ji", x), np.ones((3, 3)))):
        x = Tensor(np.ones((3, 3)), requires_grad=True)
        y = make(x).sum()
        y.backward()
        y.backward()
        np.testing.assert_array_equal(x.grad.data, 2 * once)
    x = Tensor(np.ones((3, 3)), requires_grad=True)
    y = (x * x).sum()                                                   # x is saved: refused, as torch
    y.backward()
    with pytest.raises(RuntimeError, match="a second time"):
        y.backward()
