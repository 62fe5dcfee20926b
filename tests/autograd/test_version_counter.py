"""The Tensor's in-place ops and the version counter that guards saved tensors (PyTorch's rule: a change to a
tensor a recorded op saved makes backward raise); the rest of its semantics: test_tensor_semantics.py."""
from __future__ import annotations


import numpy as np
import pytest

from tinygrad_ssm import Tensor, no_grad

from tests.support.tensors import leaf


# --- in place and the version counter -------------------------------------------------------------------

def test_in_place_on_a_leaf_that_requires_grad_raises_outside_no_grad():
    x = leaf([1.0])
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        x.add_(1.0)
    with no_grad():
        x.add_(1.0)  # an optimizer step
    np.testing.assert_allclose(x.data, [2.0])


def test_modifying_a_saved_tensor_raises_at_backward():
    x = leaf([1.0, 2.0])
    w = Tensor(np.array([3.0, 4.0]))
    loss = (x * w).sum()   # Mul saved w
    w.mul_(2.0)            # version 0 -> 1
    with pytest.raises(RuntimeError, match="modified by an inplace operation.*version 1; expected version 0"):
        loss.backward()


def test_modifying_a_saved_output_through_a_detached_alias_raises():
    x = leaf([0.5, 1.0])
    y = x.exp()            # Exp saved its output, y's array
    y.detach().zero_()     # same storage, same version counter
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_modifying_a_saved_output_through_a_tensor_wrapping_it_raises():
    x = leaf([0.5, 1.0])
    y = x.exp()
    Tensor(y).zero_()      # Tensor(t) shares t's storage, so it must share its version counter too
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_modifying_a_leaf_under_no_grad_after_it_was_saved_raises():
    x = leaf([1.0, 2.0])
    loss = (x * x).sum()
    with no_grad():
        x.mul_(3.0)
    with pytest.raises(RuntimeError, match="expected version 0"):
        loss.backward()


def test_modifying_a_base_through_a_view_is_caught():
    x = leaf([[1.0, 2.0], [3.0, 4.0]])
    base = Tensor(np.array([1.0, 2.0, 3.0, 4.0]))
    view = base.reshape(2, 2)
    loss = (x * view).sum()  # Mul saved the view's array
    base.add_(1.0)           # the view shares its base's version counter
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_modifying_a_tensor_no_op_saved_is_fine():
    x = leaf([1.0, 2.0])
    b = Tensor(np.array([5.0, 6.0]))
    loss = (x + b).sum()     # Add saves nothing: its gradient does not depend on b
    b.add_(1.0)
    loss.backward()
    np.testing.assert_allclose(x.grad.data, [1.0, 1.0])


def test_setitem_bumps_the_version():
    w = Tensor(np.array([1.0, 2.0]))
    x = leaf([1.0, 1.0])
    loss = (x * w).sum()
    w[0] = 7.0
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
