"""Edges of an optimizer's step held to torch 2.13: Adam's first moment as torch's lerp (beta1 < 0.5 included), a
step that cannot write a parameter changes nothing, and clipping gradients whose squares overflow."""
import math
import warnings

import numpy as np
import pytest

import tinygrad_ssm as tg
from tinygrad_ssm import optim


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("dtype, small", [(np.float32, 1e-9), (np.float64, 1e-17)])
def test_adam_with_beta1_0_keeps_a_small_gradient_after_a_large_one_as_torch(fused, dtype, small):
    """exp_avg.lerp_(grad, 1 - beta1) is torch's; its lerp takes a weight of 0.5 or more from the end, so beta1 = 0
    gives exp_avg = grad exactly. Ours computed m + 1 * (g - m): g = 1e-9 after g = 1 gave exp_avg 0 and no move
    (torch: exp_avg 1e-9, a step of lr). betas (0.3, 0.9) goes the same way; (0.9, 0.999) the other."""
    p = tg.Tensor(np.zeros(1, dtype), requires_grad=True)
    opt = optim.Adam([("p", p)], lr=0.1, betas=(0.0, 0.0), eps=1e-12 * small, fused=fused)
    for g in (1.0, small):
        p.grad = tg.Tensor(np.array([g], dtype))
        opt.step()
    assert opt.state["p"]["exp_avg"][0] == dtype(small)
    assert p.data[0] == pytest.approx(-0.2, rel=1e-6)                  # two steps of lr: m / sqrt(v) = 1 each
    torch = pytest.importorskip("torch")
    for betas in ((0.0, 0.0), (0.3, 0.9), (0.5, 0.9), (0.9, 0.999)):
        ours = tg.Tensor(np.zeros(3, dtype), requires_grad=True)
        theirs = torch.zeros(3, dtype=getattr(torch, dtype.__name__), requires_grad=True)
        mine = optim.Adam([("p", ours)], lr=0.1, betas=betas, eps=1e-12, fused=fused)
        ref = torch.optim.Adam([theirs], lr=0.1, betas=betas, eps=1e-12, foreach=False)
        for scale in (1.0, small, 3.0, small):
            g = np.array([scale, -scale, 2 * scale], dtype)
            ours.grad, theirs.grad = tg.Tensor(g), torch.tensor(g)
            mine.step()
            ref.step()
            rtol = 1e-12 if dtype == np.float64 else 1e-6                  # the same float operations, rounded
            np.testing.assert_allclose(mine.state["p"]["exp_avg"], ref.state[theirs]["exp_avg"].numpy(), rtol=rtol)
            np.testing.assert_allclose(ours.data, theirs.detach().numpy(), rtol=rtol)


@pytest.mark.parametrize("make", [lambda ps: optim.Adam(ps, lr=0.1), lambda ps: optim.Adam(ps, lr=0.1, fused=False),
                                  lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9)])
def test_a_read_only_parameter_fails_the_step_before_anything_changes(make):
    """The second parameter's array read-only: the step raised NumPy's "output array is read-only" after updating
    the first and advancing the second's state; a retried step moved the first again. Now nothing changes."""
    a, b = (tg.Tensor(np.ones(2), requires_grad=True) for _ in range(2))
    b.data.flags.writeable = False
    a.grad, b.grad = tg.Tensor(np.ones(2)), tg.Tensor(np.ones(2))
    opt = make([("a", a), ("b", b)])
    for _ in range(2):
        with pytest.raises(ValueError, match=r"parameter 'b' holds a read-only array.*nothing was updated.*copy"):
            opt.step()
        assert a.data.tolist() == [1.0, 1.0] and not opt.state
    b.data = b.data.copy()
    opt.step()
    assert a.data[0] < 1 and b.data[0] < 1


@pytest.mark.parametrize("norm_type", [2.0, 3.0])
def test_clip_grad_norm_of_huge_float64_gradients_is_inf_without_numpys_warning(norm_type):
    """Squares past float64's range: the total is inf and the gradients scaled by 0, as torch; NumPy printed
    "overflow encountered in square" on the way."""
    w = tg.Tensor(np.ones(2), requires_grad=True)
    w.grad = tg.Tensor(np.array([1e200, 1.0]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert optim.clip_grad_norm_([("w", w)], 1.0, norm_type) == math.inf
    assert w.grad.data.tolist() == [0.0, 0.0]


def test_clip_grad_norm_takes_a_retained_non_leaf_gradient_as_torch():
    """torch.nn.utils.clip_grad_norm_ scales any tensor's .grad; ours refused a non-leaf with the optimizer's
    "can't optimize a non-leaf Tensor"."""
    x = tg.Tensor(np.array([3.0, 4.0]), requires_grad=True)
    y = x * 2
    y.retain_grad()
    (y * y).sum().backward()                                            # y.grad = 2y = [12, 16]
    assert optim.clip_grad_norm_([y], 1.0) == pytest.approx(20.0)
    np.testing.assert_allclose(y.grad.data, [0.6, 0.8], rtol=1e-6)
    with pytest.raises(ValueError, match="not a leaf"):
        optim.SGD([y], lr=0.1)                                          # an optimizer still refuses it, as torch
