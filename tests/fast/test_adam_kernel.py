"""Adam's numba update (fast/adam_kernel.py) against the NumPy code it replaces (`fused=False`): the same
bits in float32 and float64, for Adam and AdamW, on hypothesis-drawn shapes, hyperparameters and step counts,
arrays the kernel does not take go to the reference."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import tinygrad_ssm as tg
from tinygrad_ssm import optim
from tinygrad_ssm.fast import adam_kernel
from tests.support.kernel_calls import counting


def trajectory(cls, start, grads, hparams, fused):
    """Parameter, exp_avg and exp_avg_sq after each step, the gradients given."""
    p = tg.Tensor(start.copy(order="K"), requires_grad=True)              # keeps a transposed layout
    opt = cls([("p", p)], **hparams, fused=fused)
    out = []
    for g in grads:
        p.grad = tg.Tensor(g)
        opt.step()
        state = opt.state["p"]
        out.append((p.data.copy(), state["exp_avg"].copy(), state["exp_avg_sq"].copy()))
    return out


@given(cls=st.sampled_from([optim.Adam, optim.AdamW]), dtype=st.sampled_from([np.float32, np.float64]),
       shape=st.sampled_from([(1,), (7,), (5, 13), (3, 1, 4), (40, 33)]),
       lr=st.sampled_from([1e-3, 0.05, 1.0]),
       betas=st.sampled_from([(0.9, 0.999), (0.8, 0.95), (0.3, 0.9), (0.0, 0.0)]),   # lerp's two sides
       eps=st.sampled_from([1e-8, 1e-3]), weight_decay=st.sampled_from([0.0, 0.01, 0.3]),
       steps=st.integers(1, 4), seed=st.integers(0, 2 ** 16))
def test_adam_kernel_is_the_reference_bit_for_bit(cls, dtype, shape, lr, betas, eps, weight_decay, steps, seed):
    rng = np.random.default_rng(seed)
    start = rng.standard_normal(shape).astype(dtype)
    grads = [(rng.standard_normal(shape) * 10.0 ** rng.integers(-6, 3)).astype(dtype) for _ in range(steps)]
    grads[0].flat[0] = 0.0                                               # v = 0 there: the denominator is eps
    hparams = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    with counting((adam_kernel, "adam_update")) as fused_calls:
        got = trajectory(cls, start, grads, hparams, fused=True)
    with counting((adam_kernel, "adam_update")) as reference_calls:
        expected = trajectory(cls, start, grads, hparams, fused=False)
    assert fused_calls["adam_update"] == steps and not reference_calls         # each side ran what it names
    for step, (g, e) in enumerate(zip(got, expected)):
        for name, a, b in zip(("param", "exp_avg", "exp_avg_sq"), g, e):
            assert a.dtype == dtype
            np.testing.assert_array_equal(a, b, err_msg=f"{name} at step {step + 1}")


def test_adam_kernel_takes_contiguous_arrays_of_one_dtype_only():
    p, g = np.zeros((4, 3), np.float32), np.ones((4, 3), np.float32)
    assert adam_kernel.takes(p, p.copy(), p.copy(), g)
    assert adam_kernel.takes(p, p.copy(), p.copy(), np.ones((3, 4), np.float32).T)   # a strided grad is copied
    assert not adam_kernel.takes(p, p.copy(), p.copy(), g.astype(np.float64))
    assert not adam_kernel.takes(p.T, p.T.copy(), p.T.copy(), g.T)                    # p written in place: no
    assert not adam_kernel.takes(p, np.asfortranarray(p), p.copy(), g)               # m and v are too
    assert not adam_kernel.takes(p, p.copy(), np.asfortranarray(p), g)
    assert not adam_kernel.takes(p.astype(np.float16), *(a.astype(np.float16) for a in (p, p)), g.astype(np.float16))


def test_adam_with_arrays_the_kernel_does_not_take_runs_the_reference():
    """A parameter that is a transposed view (a .grad of another dtype than its tensor's is refused when
    assigned, and backward gives each tensor its own dtype)."""
    rng = np.random.default_rng(0)
    start = rng.standard_normal((6, 5)).astype(np.float32).T                         # F-ordered (5, 6)
    grads = [rng.standard_normal((5, 6)).astype(np.float32) for _ in range(3)]
    with counting((adam_kernel, "adam_update")) as fused_calls:
        got = trajectory(optim.AdamW, start, grads, dict(lr=0.1), fused=True)
    expected = trajectory(optim.AdamW, start, grads, dict(lr=0.1), fused=False)
    assert not fused_calls
    for g, e in zip(got, expected):
        for a, b in zip(g, e):
            np.testing.assert_array_equal(a, b)


def test_fused_must_be_a_bool():
    with pytest.raises(TypeError, match="AdamW: fused must be True or False"):
        optim.AdamW([("p", tg.Tensor(np.zeros(3), requires_grad=True))], fused="yes")
