"""What the fused-op tests share (tests/fast/test_fused.py, test_fused_norms.py): values and gradients of an op
against its engine-op twin, and the memory layouts the ops must read."""
import numpy as np
from hypothesis import strategies as st

import tinygrad_ssm as tg
from tests.support.kernel_calls import counting_fused_ops

TOL = dict(rtol=1e-10, atol=1e-10)


def values_and_grads(fn, arrays, weight_seed=0):
    """fn(*tensors) and the gradient of sum(fn * w) for each input, float64."""
    tensors = [None if a is None else tg.Tensor(a.copy(), requires_grad=True) for a in arrays]
    out = fn(*tensors)
    w = np.random.default_rng(weight_seed).standard_normal(out.shape)
    (out * tg.Tensor(w)).sum().backward()
    return out.data, [None if t is None else t.grad.data for t in tensors]


def layout(x: np.ndarray, how: str) -> np.ndarray:
    """The same values as x (b, l, c) in another memory layout: a column slice at an offset (a split's view) or
    of every other step, both read in place; every other column or a transpose, both copied by the ops."""
    if how == "offset view":
        wide = np.zeros(x.shape[:-1] + (x.shape[-1] + 3,))
        wide[..., 2:-1] = x
        return wide[..., 2:-1]
    if how == "every other column":
        wide = np.zeros(x.shape[:-1] + (2 * x.shape[-1],))
        wide[..., ::2] = x
        return wide[..., ::2]
    if how == "every other step":                             # rows evenly spaced, two base rows apart
        wide = np.zeros((x.shape[0], 2 * x.shape[1], x.shape[2] + 3))
        wide[:, ::2, 2:-1] = x
        return wide[:, ::2, 2:-1]
    if how == "transposed":
        return np.ascontiguousarray(np.swapaxes(x, 0, 1)).swapaxes(0, 1)
    return x


LAYOUTS = st.sampled_from(["contiguous", "offset view", "every other step", "every other column", "transposed"])


def fused_values_and_grads(fn, arrays):
    """values_and_grads of a call that must run a fused op (fast/fused.py), not fall back to its twin."""
    with counting_fused_ops() as ops:
        result = values_and_grads(fn, arrays)
    assert ops, "no fused op ran: the call fell back to its engine-op twin"
    return result


def assert_same(fast, slow, arrays):
    """fast's values and gradients equal slow's (TOL), and fast ran a fused op where slow ran none."""
    out_f, grads_f = fused_values_and_grads(fast, arrays)
    with counting_fused_ops() as slow_ops:
        out_s, grads_s = values_and_grads(slow, arrays)
    assert not slow_ops, f"the twin ran fused ops: {dict(slow_ops)}"
    np.testing.assert_allclose(out_f, out_s, **TOL)
    for i, (gf, gs) in enumerate(zip(grads_f, grads_s)):
        if gs is not None:
            np.testing.assert_allclose(gf, gs, **TOL, err_msg=f"input {i}")
