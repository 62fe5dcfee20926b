"""Ops with several outputs (PyTorch's rules): forward returns a tuple of arrays, apply gives a tuple of
tensors sharing one node, backward receives one gradient per output (zeros for an output that did not reach
the loss) and runs once however many outputs were used."""
import gc

import numpy as np
import pytest
from hypothesis import given, strategies as st

import tinygrad_ssm as tg
from tests.support.gradcheck import gradcheck
from tests.support.strategies import arrays, shapes
from tinygrad_ssm import Function, Tensor


class ProductAndSum(Function):
    """(a, b) -> (a * b, a + b); records what backward received, so the tests can look."""
    calls: list = []

    def forward(self, a, b):
        self.save_for_backward(a, b)
        return a * b, a + b

    def backward(self, grad_product, grad_sum):
        ProductAndSum.calls.append((grad_product.copy(), grad_sum.copy()))
        a, b = self.saved
        return grad_product * b + grad_sum, grad_product * a + grad_sum


@given(data=st.data(), shape=shapes(max_dims=3))
def test_gradcheck_when_both_outputs_are_used(data, shape):
    a, b = data.draw(arrays(shape), label="a"), data.draw(arrays(shape), label="b")

    def both(ta, tb):
        product, total = ProductAndSum.apply(ta, tb)
        return product * 2.0 + total.tanh() * product                   # both outputs, one used twice

    gradcheck(both, a, b)


def test_unused_output_gets_zeros_and_backward_runs_once():
    ProductAndSum.calls.clear()
    a = Tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    b = Tensor(np.array([4.0, 5.0, 6.0]), requires_grad=True)
    product, total = ProductAndSum.apply(a, b)
    assert product._ctx is total._ctx and product.grad_fn.name == "ProductAndSum"
    (total * 3.0).sum().backward()
    assert len(ProductAndSum.calls) == 1
    grad_product, grad_sum = ProductAndSum.calls[0]
    assert np.array_equal(grad_product, np.zeros(3)) and np.array_equal(grad_sum, np.full(3, 3.0))
    assert np.array_equal(a.grad.data, np.full(3, 3.0)) and np.array_equal(b.grad.data, np.full(3, 3.0))


def test_an_output_dropped_before_backward_still_gets_zeros():
    ProductAndSum.calls.clear()
    a = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    product = ProductAndSum.apply(a, Tensor(np.array([3.0, 4.0])))[0]   # the sum output is garbage now
    gc.collect()
    product.sum().backward()
    assert np.array_equal(ProductAndSum.calls[0][1], np.zeros(2))
    assert np.array_equal(a.grad.data, [3.0, 4.0])


def test_both_outputs_reach_the_loss_through_one_backward_call():
    ProductAndSum.calls.clear()
    a = Tensor(np.array([1.0, -2.0]), requires_grad=True)
    b = Tensor(np.array([0.5, 3.0]), requires_grad=True)
    product, total = ProductAndSum.apply(a, b)
    (product + total * total).sum().backward()
    assert len(ProductAndSum.calls) == 1
    grad_product, grad_sum = ProductAndSum.calls[0]
    assert np.array_equal(grad_product, np.ones(2)) and np.allclose(grad_sum, 2 * (a.data + b.data))
    assert np.allclose(a.grad.data, b.data + 2 * (a.data + b.data))


def test_retain_grad_on_an_output_and_no_second_backward():
    a = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    product, total = ProductAndSum.apply(a, Tensor(np.array([3.0, 4.0])))
    total.retain_grad()
    loss = (product * total).sum()
    loss.backward()
    assert np.array_equal(total.grad.data, product.data)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        loss.backward()


def test_an_inplace_change_to_a_saved_input_is_caught():
    a = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    b = Tensor(np.array([3.0, 4.0]))
    product, _ = ProductAndSum.apply(a, b)
    b.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        product.sum().backward()


def test_no_graph_under_no_grad():
    a = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    with tg.no_grad():
        product, total = ProductAndSum.apply(a, a)
    assert product._ctx is None and total._ctx is None and not product.requires_grad


def test_a_leaf_gradient_is_written_once_every_use_has_passed_back():
    """The leaf is used by two ops in different places of the graph: .grad is their sum, written once."""
    a = Tensor(np.array([2.0]), requires_grad=True)
    product, total = ProductAndSum.apply(a, a)                          # a used twice by one op
    (product * a + total).sum().backward()                              # and once more by another
    # d/da [a^2 * a + 2a] = 3 a^2 + 2
    assert np.allclose(a.grad.data, [3 * 4.0 + 2])
