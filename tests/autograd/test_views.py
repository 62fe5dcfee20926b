"""Views and the version counter, for every op: an op whose output shares memory with an input must be
marked as a view (`is_view`), so the output shares the input's version counter and an in-place change
through either one makes backward raise instead of giving a wrong gradient, as in PyTorch.

The sweep records every Function application (ops inside ops too, like the reshape in matmul) while each
op of tests/support/op_specs.py runs on its example and on hypothesis-drawn gradient cases, and checks
np.shares_memory(output, input) against is_view: a future op that returns a view unmarked fails here."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.op_specs import SPECS
from tests.support.tensors import leaf
from tinygrad_ssm import Function, Tensor, no_grad
from tinygrad_ssm.autograd import functional as F


@contextlib.contextmanager
def recording_applications():
    """Yields a list that gets (Function class, input tensors, output tensors) for every op applied inside."""
    recorded = []
    original = Function.apply.__func__

    def recording_apply(cls, *inputs, **kwargs):
        out = original(cls, *inputs, **kwargs)
        recorded.append((cls, inputs, out if isinstance(out, tuple) else (out,)))
        return out
    Function.apply = classmethod(recording_apply)
    try:
        yield recorded
    finally:
        Function.apply = classmethod(original)


def assert_views_are_marked(applications):
    assert applications, "no op ran"
    for cls, inputs, outputs in applications:
        for out in outputs:
            ctx = out.grad_fn
            assert ctx is not None, f"{cls.__name__}: inputs required grad, the op was not recorded"
            is_view = bool(getattr(ctx, "is_view", False))
            for i, t in enumerate(inputs):
                if not isinstance(t, Tensor) or out.size == 0 or t.size == 0:
                    continue
                if np.shares_memory(out.data, t.data):
                    assert is_view, (f"{ctx.name}: the output {out.shape} shares memory with input {i} {t.shape} "
                                     f"but the op is not marked is_view")
                    assert i == 0, f"{ctx.name}: a view must be of its first input, shares with input {i}"
                    assert out._version is t._version, f"{ctx.name}: a view must share its base's version counter"
            if is_view and out.size and isinstance(inputs[0], Tensor) and inputs[0].size:
                assert np.shares_memory(out.data, inputs[0].data), \
                    f"{ctx.name}: marked is_view but the output {out.shape} is a copy"


@pytest.mark.parametrize("name", list(SPECS))
def test_every_op_marks_the_outputs_that_share_memory(name):
    with recording_applications() as applications:
        getattr(F, name)(*SPECS[name].example())
    assert_views_are_marked(applications)


@pytest.mark.parametrize("name, variant", [(n, v) for n, s in SPECS.items() for v in s.grad])
@settings(max_examples=6)  # a few drawn cases per variant: the 0-d, empty and non-contiguous corners
@given(data=st.data())
def test_every_op_marks_views_on_drawn_inputs(name, variant, data):
    fn, arrays = SPECS[name].grad[variant](data)
    with recording_applications() as applications:
        fn(*[Tensor(a, requires_grad=True) for a in arrays])
    assert_views_are_marked(applications)


def test_the_sweep_catches_an_unmarked_view():
    class UnmarkedFlip(Function):  # np.flip is a view: without is_view the version counter is not shared
        def forward(self, a):
            return np.flip(a, 0)

        def backward(self, grad):
            return np.flip(grad, 0)
    with recording_applications() as applications:
        UnmarkedFlip.apply(Tensor(np.ones(3), requires_grad=True))
    with pytest.raises(AssertionError, match="UnmarkedFlip: the output .* shares memory .* not marked is_view"):
        assert_views_are_marked(applications)


# --- what the marking buys: in-place changes through a view or its base are caught ----------------------

@pytest.mark.parametrize("make_view", [
    lambda a: a[::-1], lambda a: a.reshape(3, 1), lambda a: a[1:], lambda a: a.unsqueeze(0),
    lambda a: a.expand(2, 3), lambda a: F.split(a, 2)[0], lambda a: a.squeeze(),
], ids=["reversed slice", "reshape", "slice", "unsqueeze", "expand", "split", "squeeze"])
def test_changing_the_base_of_a_saved_view_makes_backward_raise(make_view):
    a = Tensor(np.array([1.0, 2.0, 3.0]))
    view = make_view(a)
    w = Tensor(np.ones(view.shape), requires_grad=True)
    loss = (w * view).sum()  # Mul saved the view; w.grad would be the view's values
    a.mul_(10.0)             # before views were marked, w.grad silently became 10x here
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_changing_a_view_of_a_saved_tensor_makes_backward_raise():
    a = Tensor(np.array([1.0, 2.0, 3.0]))
    w = leaf([1.0, 1.0, 1.0])
    loss = (w * a).sum()
    a[::-1].mul_(2.0)        # writes through the view into a
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_copies_are_independent():
    a = Tensor(np.array([[1.0, 2.0], [3.0, 4.0]]))
    w = leaf(np.ones((4,)))
    copied = a.transpose().reshape(4)  # a transpose can't be flattened in place: NumPy copies
    assert not np.shares_memory(copied.data, a.data)
    loss = (w * copied).sum()
    a.mul_(10.0)             # not what Mul saved: the gradient is right
    loss.backward()
    np.testing.assert_array_equal(w.grad.data, [1.0, 3.0, 2.0, 4.0])
    out = F.einsum("ij->ji", a)  # NumPy's einsum returns a view for a transposition: the op copies
    assert not np.shares_memory(out.data, a.data)


def test_in_place_under_no_grad_through_a_view_is_seen_by_the_base():
    a = leaf([1.0, 2.0, 3.0])
    loss = (a * a).sum()
    with no_grad():
        a.detach()[::-1].add_(1.0)
    with pytest.raises(RuntimeError, match="expected version 0"):
        loss.backward()
