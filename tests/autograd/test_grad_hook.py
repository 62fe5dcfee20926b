"""register_post_accumulate_grad_hook: called once per backward, when a leaf's gradient is final."""
import numpy as np
import pytest

from tinygrad_ssm import Tensor


def test_hook_sees_the_final_gradient_once():
    a = Tensor(np.array([1.0, 2.0]), requires_grad=True)  # used three times, first in the forward
    b = Tensor(np.array([3.0, 4.0]), requires_grad=True)  # used once, last in the forward
    unused = Tensor(np.array([5.0]), requires_grad=True)
    seen = []
    for name, t in (("a", a), ("b", b), ("unused", unused)):
        t.register_post_accumulate_grad_hook(lambda leaf, name=name: seen.append((name, leaf.grad.data.copy())))
    loss = ((a * a).sum() + (a.tanh() * b).sum()) * 2.0
    loss.backward()
    assert sorted(n for n, _ in seen) == ["a", "b"]  # once each; never for a leaf that got no gradient
    seen = dict(seen)
    np.testing.assert_array_equal(seen["a"], a.grad.data)  # all three uses of a already summed in
    np.testing.assert_allclose(a.grad.data, 2 * (2 * a.data + (1 - np.tanh(a.data) ** 2) * b.data))
    np.testing.assert_array_equal(seen["b"], b.grad.data)


def test_hook_accumulating_backward_and_remove():
    a = Tensor(np.array([1.0]), requires_grad=True)
    grads = []
    handle = a.register_post_accumulate_grad_hook(lambda leaf: grads.append(float(leaf.grad.data[0])))
    (a * 3.0).sum().backward()
    (a * 3.0).sum().backward()  # .grad accumulates across backwards: the hook sees the running sum
    assert grads == [3.0, 6.0]
    handle.remove()
    (a * 3.0).sum().backward()
    assert grads == [3.0, 6.0]


def test_hook_only_on_leaves():
    a = Tensor(np.array([1.0]), requires_grad=True)
    with pytest.raises(RuntimeError, match="only leaf tensors"):
        (a * 2.0).register_post_accumulate_grad_hook(lambda t: None)
