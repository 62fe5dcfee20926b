"""clip_grad_norm_ and WarmupCosine held to torch: torch.nn.utils.clip_grad_norm_ (its return value, norm_type,
error_if_nonfinite and what its default does to the gradients when the norm is not finite) and
torch.optim.lr_scheduler's warmup + cosine (LinearLR then CosineAnnealingLR), step by step from step 0."""
import math

import numpy as np
import pytest

import tinygrad_ssm as tg
from tinygrad_ssm import optim


def grads(bad=None):
    """Three float64 parameters with gradients and one without; `bad` (nan / inf) put into the second."""
    r = np.random.default_rng(3)
    arrays = [r.standard_normal((3, 4)) * 2, r.standard_normal(5), r.standard_normal((2, 2, 2)) * 0.1]
    if bad is not None:
        arrays[1][2] = bad
    ours, theirs = [], []
    torch = pytest.importorskip("torch")
    for i, a in enumerate([*arrays, None]):
        p = tg.Tensor(np.zeros(a.shape if a is not None else 2), requires_grad=True)
        t = torch.zeros(p.shape, dtype=torch.float64, requires_grad=True)
        if a is not None:
            p.grad, t.grad = tg.Tensor(a.copy()), torch.tensor(a.copy())
        ours.append((f"p{i}", p))
        theirs.append(t)
    return ours, theirs, torch


@pytest.mark.parametrize("norm_type", [2.0, math.inf, 1.0, 3.0, 0.5, "inf"])
@pytest.mark.parametrize("max_norm", [0.7, 1e6, 0.0])
def test_clip_grad_norm_matches_torch(norm_type, max_norm):
    ours, theirs, torch = grads()
    expected = float(torch.nn.utils.clip_grad_norm_(theirs, max_norm, norm_type))  # positional, as torch's
    got = optim.clip_grad_norm_(ours, max_norm, norm_type)
    assert got == pytest.approx(expected, rel=1e-12)
    for (name, p), t in zip(ours, theirs):
        if t.grad is None:
            assert p.grad is None
        else:
            np.testing.assert_allclose(p.grad.data, t.grad.numpy(), rtol=1e-12, atol=1e-300, err_msg=name)


@pytest.mark.parametrize("norm_type", [2.0, math.inf, 1.0])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_total_is_handled_as_torch(bad, norm_type):
    """Default: the gradients are scaled anyway (0 for an infinite total, NaN for a NaN one: the same arrays as
    torch's, NaN where torch has NaN) and the total returned; error_if_nonfinite=True raises and scales nothing."""
    ours, theirs, torch = grads(bad)
    expected = float(torch.nn.utils.clip_grad_norm_(theirs, 1.0, norm_type))
    got = optim.clip_grad_norm_(ours, 1.0, norm_type)
    assert (math.isnan(got) and math.isnan(expected)) or got == expected
    for (name, p), t in zip(ours, theirs):
        if t.grad is not None:
            np.testing.assert_array_equal(p.grad.data, t.grad.numpy(), err_msg=name)

    ours, theirs, torch = grads(bad)
    before = [None if p.grad is None else p.grad.data.copy() for _, p in ours]
    with pytest.raises(RuntimeError, match="non-finite"):
        torch.nn.utils.clip_grad_norm_(theirs, 1.0, norm_type, error_if_nonfinite=True)
    with pytest.raises(RuntimeError, match=r"norm of order .* of the gradients is (nan|inf), so it cannot be "
                                           r"clipped; non-finite gradients in: p1; the gradients were left"):
        optim.clip_grad_norm_(ours, 1.0, norm_type, error_if_nonfinite=True)
    for b, (name, p) in zip(before, ours):
        if b is not None:
            np.testing.assert_array_equal(p.grad.data, b, err_msg=name)


@pytest.mark.parametrize("norm_type", [0, -1.0, math.nan, "two", True])
def test_clip_grad_norm_refuses_a_norm_type_that_is_no_norm(norm_type):
    ours, _, _ = grads()
    with pytest.raises(ValueError, match=r"clip_grad_norm_: norm_type must be a number > 0 or math.inf"):
        optim.clip_grad_norm_(ours, 1.0, norm_type)


def test_error_if_nonfinite_must_be_a_bool():
    """The third argument was error_if_nonfinite: a torch call clip_grad_norm_(params, 1.0, 2.0) turned it on."""
    ours, _, _ = grads()
    with pytest.raises(TypeError, match=r"error_if_nonfinite must be True or False, got 2.0 \(the third argument "
                                        r"is norm_type, as in torch\)"):
        optim.clip_grad_norm_(ours, 1.0, 2.0, 2.0)


# --- schedule ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("warmup, total, min_lr", [(5, 40, 3e-5), (0, 30, 0.0), (2, 2, 1e-4), (3, 50, 0.0)])
def test_warmup_cosine_is_torchs_linear_warmup_then_cosine_annealing(warmup, total, min_lr):
    """WarmupCosine(step) with step = optimizer steps done before this one (the training loop's run.step, 0 at
    the first step) is the lr torch's LinearLR(start_factor=1/warmup, total_iters=warmup-1) followed at
    `warmup` by CosineAnnealingLR(T_max=total-warmup, eta_min=min_lr) gives that step, scheduler.step() after
    each optimizer step: lr / warmup at step 0, lr at step warmup - 1 and warmup, min_lr from step `total` on
    (torch's cosine climbs again after T_max; this one stays at min_lr)."""
    torch = pytest.importorskip("torch")
    lr = 3e-3
    ours = optim.WarmupCosine(lr, warmup, total, min_lr=min_lr)
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr)
    lrs = torch.optim.lr_scheduler
    cosine = lrs.CosineAnnealingLR(opt, T_max=max(total - warmup, 1), eta_min=min_lr)
    if warmup > 1:
        linear = lrs.LinearLR(opt, start_factor=1 / warmup, end_factor=1.0, total_iters=warmup - 1)
        scheduler = lrs.SequentialLR(opt, [linear, cosine], milestones=[warmup])
    else:
        scheduler = cosine
    for step in range(total):
        expected = opt.param_groups[0]["lr"]
        if step >= warmup and total == warmup:
            expected = min_lr  # no cosine to run: torch would need T_max = 0
        assert ours(step) == pytest.approx(expected, rel=1e-12, abs=1e-18), f"step {step}"
        opt.step()
        scheduler.step()
    assert ours(total) == min_lr and ours(total + 100) == min_lr
    assert ours(0) == (lr / warmup if warmup else lr)


def test_warmup_cosine_written_into_param_groups_drives_the_step():
    """The schedule's value written into each group before the step (as the training loop does) is what the
    step uses: two groups stepped with SGD move by exactly lr * grad."""
    s = optim.WarmupCosine(0.1, 3, 10, min_lr=0.01)
    a, b = (tg.Tensor(np.zeros(2), requires_grad=True) for _ in range(2))
    opt = optim.SGD([{"params": [("a", a)]}, {"params": [("b", b)], "lr": 5.0}], lr=1.0)
    expected = 0.0
    for step in range(12):
        for group in opt.param_groups:
            group["lr"] = s(step)
        a.grad, b.grad = tg.Tensor(np.ones(2)), tg.Tensor(np.ones(2))
        opt.step()
        expected -= s(step)
        np.testing.assert_allclose(a.data, expected, rtol=1e-15)
        np.testing.assert_allclose(b.data, expected, rtol=1e-15)
