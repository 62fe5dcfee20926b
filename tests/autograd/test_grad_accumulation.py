"""How backward accumulates into .grad, as torch's AccumulateGrad does: the first gradient becomes .grad, later
ones are added into that same tensor in place (a handle on it sees the sum, also after zero_()), each leaf's
.grad its own memory; a .grad assigned by the user is accumulated into, a read-only one replaced."""
import numpy as np

from tinygrad_ssm import Tensor

from tests.support.tensors import leaf


def test_gradients_accumulate_across_backward_calls():
    x = leaf([1.0, 2.0])
    (x * x).sum().backward()
    (x * x).sum().backward()
    np.testing.assert_allclose(x.grad.data, 4 * x.data)
    x.grad = None  # the user resets between steps
    (x * 5.0).sum().backward()
    np.testing.assert_allclose(x.grad.data, [5.0, 5.0])


def test_a_handle_on_grad_sees_what_later_backwards_add():
    x = leaf([1.0, 2.0, 3.0])
    (x * x).sum().backward()
    g = x.grad
    (x * x).sum().backward()
    assert x.grad is g
    np.testing.assert_array_equal(g.data, [4.0, 8.0, 12.0])
    g.zero_()                                                          # torch's optimizer.zero_grad(set_to_none=False)
    (x * 3.0).sum().backward()
    assert x.grad is g
    np.testing.assert_array_equal(g.data, [3.0, 3.0, 3.0])


def test_leaves_fed_by_one_gradient_keep_their_own_grads():
    """y = a + b passes one upstream gradient to both leaves (and x + x twice to one): adding into one leaf's
    .grad in place must not change the other's."""
    a, b, x = leaf([1.0, 2.0]), leaf([3.0, 4.0]), leaf([5.0, 6.0])
    for _ in range(3):
        (a + b).sum().backward()
        ((x + x) * 1.0).sum().backward()
    assert a.grad.data is not b.grad.data and not np.shares_memory(a.grad.data, b.grad.data)
    np.testing.assert_array_equal(a.grad.data, [3.0, 3.0])
    np.testing.assert_array_equal(b.grad.data, [3.0, 3.0])
    np.testing.assert_array_equal(x.grad.data, [6.0, 6.0])


def test_an_assigned_grad_is_accumulated_into_and_a_read_only_one_replaced():
    x = leaf([1.0, 2.0])
    mine = Tensor(np.array([10.0, 10.0]))
    x.grad = mine
    (x * 2.0).sum().backward()
    np.testing.assert_array_equal(mine.data, [12.0, 12.0])             # the same memory, as in torch
    frozen = np.array([1.0, 1.0])
    frozen.flags.writeable = False
    x.grad = Tensor(frozen)
    (x * 2.0).sum().backward()
    np.testing.assert_array_equal(x.grad.data, [3.0, 3.0])
    np.testing.assert_array_equal(frozen, [1.0, 1.0])
