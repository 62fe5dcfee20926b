"""Optimizers against NumPy transcriptions of their update rules (and torch.optim when installed),
state dicts that resume bit-identically, gradient clipping, and the learning-rate schedule."""
import math

import numpy as np
import pytest

import tinygrad_ssm as tg
from tinygrad_ssm import VarBuilder, VarMap, optim
from tinygrad_ssm.nn import init
from tinygrad_ssm.io.safetensors import load_file, save_file

STEPS = 20


def problem(dtype="float64", seed=0):
    """Three parameters; "frozen_b" never gets a gradient. loss = 0.5 |W x - y|^2 + sum(b^4) / 4."""
    vm = VarMap(seed=seed)
    vb = VarBuilder.from_varmap(vm, dtype)
    vb.get((3, 4), "W", init=init.Randn(0, 1))
    vb.get((3,), "b", init=init.Randn(0, 1))
    vb.get((2,), "unused", init=init.Randn(0, 1))
    r = np.random.default_rng(1)
    return vm, r.standard_normal(4).astype(dtype), r.standard_normal(3).astype(dtype)


def loss_of(vm, x, y):
    err = vm["W"] @ tg.Tensor(x) - tg.Tensor(y)
    return 0.5 * (err * err).sum() + (vm["b"] ** 4).sum() / 4


def numpy_grads(W, b, x, y):
    return {"W": np.outer(W @ x - y, x), "b": b ** 3}


def numpy_adam(params, x, y, lr, betas, eps, wd, decoupled, steps=STEPS):
    """The update rule as written in the Adam / AdamW papers (bias-corrected moments)."""
    p = {k: v.copy() for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(v) for k, v in p.items()}
    history = []
    for t in range(1, steps + 1):
        grads = numpy_grads(p["W"], p["b"], x, y)
        for k, g in grads.items():
            if decoupled:
                p[k] = p[k] - lr * wd * p[k]
            else:
                g = g + wd * p[k]
            m[k] = betas[0] * m[k] + (1 - betas[0]) * g
            v[k] = betas[1] * v[k] + (1 - betas[1]) * g * g
            m_hat, v_hat = m[k] / (1 - betas[0] ** t), v[k] / (1 - betas[1] ** t)
            p[k] = p[k] - lr * m_hat / (np.sqrt(v_hat) + eps)
        history.append({k: a.copy() for k, a in p.items()})
    return history


def run(opt, vm, x, y, steps=STEPS):
    history = []
    for _ in range(steps):
        opt.zero_grad()
        loss_of(vm, x, y).backward()
        opt.step()
        history.append({k: vm[k].data.copy() for k in ("W", "b")})
    return history


ADAM_CASES = [(optim.Adam, 0.0), (optim.Adam, 0.1), (optim.AdamW, 1e-2), (optim.AdamW, 0.3)]


@pytest.mark.parametrize("cls, wd", ADAM_CASES)
def test_adam_trajectory_equals_numpy_transcription(cls, wd):
    vm, x, y = problem()
    start = {k: vm[k].data.copy() for k in ("W", "b")}
    unused = vm["unused"].data.copy()
    opt = cls(vm.named_vars(), lr=0.05, betas=(0.8, 0.95), eps=1e-6, weight_decay=wd)
    got = run(opt, vm, x, y)
    expected = numpy_adam(start, x, y, 0.05, (0.8, 0.95), 1e-6, wd, decoupled=cls is optim.AdamW)
    for step, (g, e) in enumerate(zip(got, expected)):
        for k in ("W", "b"):
            np.testing.assert_allclose(g[k], e[k], rtol=1e-12, atol=1e-14, err_msg=f"{k} at step {step + 1}")
    assert not np.allclose(got[-1]["W"], start["W"])  # it moved
    assert np.array_equal(vm["unused"].data, unused) and "unused" not in opt.state  # no grad: skipped


@pytest.mark.parametrize("cls, wd", ADAM_CASES)
def test_adam_trajectory_equals_torch(cls, wd):
    torch = pytest.importorskip("torch")
    vm, x, y = problem()
    tW, tb = (torch.tensor(vm[k].data.copy(), requires_grad=True) for k in ("W", "b"))
    tcls = torch.optim.Adam if cls is optim.Adam else torch.optim.AdamW
    topt = tcls([tW, tb], lr=0.05, betas=(0.8, 0.95), eps=1e-6, weight_decay=wd)
    opt = cls(vm.named_vars(), lr=0.05, betas=(0.8, 0.95), eps=1e-6, weight_decay=wd)
    got = run(opt, vm, x, y)
    tx, ty = torch.tensor(x), torch.tensor(y)
    for step in range(STEPS):
        topt.zero_grad()
        err = tW @ tx - ty
        (0.5 * (err * err).sum() + (tb ** 4).sum() / 4).backward()
        topt.step()
        np.testing.assert_allclose(got[step]["W"], tW.detach().numpy(), rtol=1e-6, atol=1e-12)
        np.testing.assert_allclose(got[step]["b"], tb.detach().numpy(), rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("make", [
    lambda vm: optim.Adam(vm.named_vars(), lr=0.05, weight_decay=0.1, fused=False),
    lambda vm: optim.Adam(vm.named_vars(), lr=0.05, weight_decay=0.1, fused=True),
    lambda vm: optim.AdamW(vm.named_vars(), lr=0.05, weight_decay=0.1, fused=False),
    lambda vm: optim.SGD(vm.named_vars(), lr=0.05, momentum=0.9, weight_decay=0.1),
], ids=["Adam-numpy", "Adam-fused", "AdamW-numpy", "SGD"])
def test_a_step_leaves_the_gradients_as_backward_left_them(make):
    """torch's optimizers read .grad and never write it (Adam's L2 term is `grad.add(param, alpha=wd)`, out of
    place): a gradient logged, clipped or reused after step() is still the loss's gradient. Adam's NumPy path is
    also what any dtype the numba kernel does not take runs."""
    vm, x, y = problem()
    opt = make(vm)
    for _ in range(2):  # the second step: state exists, the momentum / moment branches run
        opt.zero_grad()
        loss_of(vm, x, y).backward()
        grads = {k: vm[k].grad.data.copy() for k in ("W", "b")}
        opt.step()
        for k, g in grads.items():
            np.testing.assert_array_equal(vm[k].grad.data, g, err_msg=k)


def test_defaults_are_pytorchs():
    vm, _, _ = problem()
    adam, adamw = optim.Adam(vm.named_vars()), optim.AdamW(vm.named_vars())
    assert (adam.lr, adam.betas, adam.eps, adam.weight_decay) == (1e-3, (0.9, 0.999), 1e-8, 0.0)
    assert (adamw.lr, adamw.betas, adamw.eps, adamw.weight_decay) == (1e-3, (0.9, 0.999), 1e-8, 1e-2)


# dampening scales every gradient into the buffer but the first (torch: the first step's buffer is the gradient)
SGD_CASES = [(0.0, False, 0.0, 0.0), (0.9, False, 0.0, 0.0), (0.9, True, 0.01, 0.0), (0.9, False, 0.01, 0.3)]


@pytest.mark.parametrize("momentum, nesterov, wd, dampening", SGD_CASES)
def test_sgd_matches_transcription(momentum, nesterov, wd, dampening):
    vm, x, y = problem()
    p = {k: vm[k].data.copy() for k in ("W", "b")}
    got = run(optim.SGD(vm.named_vars(), lr=0.05, momentum=momentum, nesterov=nesterov, weight_decay=wd,
                        dampening=dampening), vm, x, y)
    buf = {}
    for step in range(STEPS):
        for k, g in numpy_grads(p["W"], p["b"], x, y).items():
            g = g + wd * p[k]
            if momentum:
                buf[k] = g if step == 0 else momentum * buf[k] + (1 - dampening) * g
                g = g + momentum * buf[k] if nesterov else buf[k]
            p[k] = p[k] - 0.05 * g
        for k in p:
            np.testing.assert_allclose(got[step][k], p[k], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("momentum, nesterov, wd, dampening", SGD_CASES)
def test_sgd_matches_torch(momentum, nesterov, wd, dampening):
    torch = pytest.importorskip("torch")
    vm, x, y = problem()
    got = run(optim.SGD(vm.named_vars(), lr=0.05, momentum=momentum, nesterov=nesterov, weight_decay=wd,
                        dampening=dampening), vm, x, y)
    vm2, _, _ = problem()
    tW, tb = (torch.tensor(vm2[k].data.copy(), requires_grad=True) for k in ("W", "b"))
    topt = torch.optim.SGD([tW, tb], lr=0.05, momentum=momentum, nesterov=nesterov, weight_decay=wd,
                           dampening=dampening)
    for _ in range(STEPS):
        topt.zero_grad()
        err = tW @ torch.tensor(x) - torch.tensor(y)
        (0.5 * (err * err).sum() + (tb ** 4).sum() / 4).backward()
        topt.step()
    np.testing.assert_allclose(got[-1]["W"], tW.detach().numpy(), rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(got[-1]["b"], tb.detach().numpy(), rtol=1e-6, atol=1e-12)


def test_state_dict_is_safetensors_ready_and_a_resumed_run_is_bit_identical(tmp_path):
    def fresh():
        vm, x, y = problem("float32")
        return vm, optim.AdamW(vm.named_vars(), lr=3e-2), x, y

    vm, opt, x, y = fresh()
    run(opt, vm, x, y, steps=7)
    vm.save(tmp_path / "model.safetensors")
    state = opt.state_dict()
    assert all(isinstance(k, str) and isinstance(v, np.ndarray) for k, v in state.items())
    assert state["state/W/step"].dtype == np.int64 and int(state["state/W/step"]) == 7
    assert state["state/W/exp_avg"].shape == (3, 4) and state["hparams/0/lr"] == 3e-2
    assert not any(k.startswith("state/unused/") for k in state)
    save_file(tmp_path / "optimizer.safetensors", state)
    continued = run(opt, vm, x, y, steps=6)

    vm2, opt2, _, _ = fresh()
    vm2.load(tmp_path / "model.safetensors")
    opt2.lr = 123.0  # overwritten by the saved hyperparameters
    opt2.load_state_dict(load_file(tmp_path / "optimizer.safetensors"))
    assert opt2.lr == 3e-2
    resumed = run(opt2, vm2, x, y, steps=6)
    for a, b in zip(continued, resumed):
        for k in a:
            assert a[k].tobytes() == b[k].tobytes()


@pytest.mark.parametrize("cls, kwargs", [(optim.AdamW, {}), (optim.SGD, dict(momentum=0.9))])
def test_a_state_dict_in_memory_is_a_snapshot_not_the_live_state(cls, kwargs):
    """A state dict kept in memory (a best-so-far checkpoint, a snapshot before a risky step) must not follow the
    optimizer's later steps, nor may the optimizer that loaded it write into it: the moments are updated in place."""
    vm, x, y = problem()
    opt = cls(vm.named_vars(), lr=0.05, **kwargs)
    run(opt, vm, x, y, steps=3)
    snapshot = opt.state_dict()
    frozen = {k: v.copy() for k, v in snapshot.items()}
    run(opt, vm, x, y, steps=2)
    opt2 = cls(vm.named_vars(), lr=0.05, **kwargs)
    opt2.load_state_dict(snapshot)
    run(opt2, vm, x, y, steps=2)
    assert all(np.array_equal(snapshot[k], frozen[k]) for k in frozen), "the saved state changed after saving"


def test_load_state_dict_rejects_a_foreign_state_and_changes_nothing():
    vm, x, y = problem()
    opt = optim.Adam(vm.named_vars(), lr=0.1)
    run(opt, vm, x, y, steps=2)
    good = opt.state_dict()
    before = opt.state_dict()
    bad = dict(good)
    bad["state/W/exp_avg"] = np.zeros((4, 3))
    bad["state/other.weight/exp_avg"] = np.zeros(2)
    bad["state/W/exp_avg_sqr"] = np.zeros((3, 4))  # a known parameter, a slot Adam does not have
    del bad["state/b/exp_avg_sq"]
    with pytest.raises(ValueError) as err:
        opt.load_state_dict(bad)
    text = str(err.value)
    assert "'state/W/exp_avg': shape (4, 3) but the parameter has shape (3, 4)" in text
    assert "unexpected key 'state/other.weight/exp_avg'" in text
    assert "unexpected key 'state/W/exp_avg_sqr'" in text
    assert "parameter 'b': missing exp_avg_sq" in text
    after = opt.state_dict()
    assert before.keys() == after.keys() and all(np.array_equal(before[k], after[k]) for k in before)
    sgd = optim.SGD(vm.named_vars(), lr=0.1)  # no momentum, so no slots: Adam's moments are foreign to it
    with pytest.raises(ValueError, match="unexpected key 'state/W/exp_avg'"):
        sgd.load_state_dict({**{k: v for k, v in good.items() if not k.startswith("hparams/")},
                             **{k: v for k, v in sgd.state_dict().items()}})
    assert sgd.state == {}


def test_zero_grad_lr_and_parameter_forms():
    vm, x, y = problem()
    opt = optim.SGD(vm.all_vars(), lr=0.0)  # bare tensors are named by position
    assert [n for n, _ in opt.params] == ["param.0", "param.1", "param.2"]
    loss_of(vm, x, y).backward()
    before = vm["W"].data.copy()
    opt.step()
    assert np.array_equal(vm["W"].data, before)  # lr 0: no change
    opt.lr = 0.1
    opt.step()
    assert not np.array_equal(vm["W"].data, before)
    opt.zero_grad(set_to_none=False)
    assert np.all(vm["W"].grad.data == 0)
    opt.zero_grad()
    assert vm["W"].grad is None
    assert len(optim.Adam(vm).params) == 3  # a VarMap works too
    with pytest.raises(ValueError, match="duplicate parameter names"):
        optim.Adam([("a", vm["W"]), ("a", vm["b"])])
    with pytest.raises(ValueError, match="'a' is the result of an op, not a leaf tensor"):
        optim.Adam([("a", vm["W"] * 2)])
    with pytest.raises(TypeError, match=r"got one Tensor; pass it in a list: \[tensor\]"):
        optim.SGD(vm["W"], lr=0.1)  # iterating it would have walked its rows
    with pytest.raises(ValueError, match="betas"):
        optim.Adam(vm, betas=(1.0, 0.9))


def test_a_step_bumps_the_version_so_a_stale_graph_cannot_backward():
    vm, x, y = problem()
    opt = optim.SGD(vm.named_vars(), lr=0.1)
    loss_of(vm, x, y).backward()
    stale = (vm["b"] ** 4).sum()  # saved b before the update
    opt.step()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        stale.backward()


def test_inplace_python_scalars_keep_float64_precision():
    """Engine fix: float64_tensor.mul_(0.1) used 0.1 rounded to float32."""
    t = tg.Tensor(np.ones(3))
    t.mul_(0.1)
    t.add_(0.2)
    assert np.array_equal(t.data, np.full(3, 1.0 * 0.1 + 0.2))
    f = tg.Tensor(np.ones(2, np.float32))
    f.div_(3.0)
    assert f.dtype == np.float32 and np.array_equal(f.data, np.full(2, np.float32(1) / np.float32(3)))


# --- clip_grad_norm_ --------------------------------------------------------------------------------------

def test_clip_grad_norm_scales_to_max_norm_and_returns_the_total():
    vm, x, y = problem()
    loss_of(vm, x, y).backward()
    grads = {k: vm[k].grad.data.copy() for k in ("W", "b")}
    total = math.sqrt(sum(float(np.sum(g ** 2)) for g in grads.values()))
    assert optim.clip_grad_norm_(vm.named_vars(), max_norm=1e9) == pytest.approx(total, rel=1e-14)
    assert all(np.array_equal(vm[k].grad.data, grads[k]) for k in grads)  # below the max: untouched
    returned = optim.clip_grad_norm_(vm.all_vars(), max_norm=0.5)
    assert returned == pytest.approx(total, rel=1e-14)
    clipped = math.sqrt(sum(float(np.sum(vm[k].grad.data ** 2)) for k in grads))
    assert clipped == pytest.approx(0.5 * total / (total + 1e-6), rel=1e-12)
    for k in grads:  # one scale for all: directions are kept
        np.testing.assert_allclose(vm[k].grad.data, grads[k] * 0.5 / (total + 1e-6), rtol=1e-12)


def test_clip_grad_norm_sums_float32_squares_in_float64():
    """float32 gradients whose squares overflow float32 (|g| > 1.8e19) have a finite total in float64, and are
    clipped by it (torch computes the norm in the gradients' dtype and returns inf there)."""
    p = tg.Tensor(np.zeros(2, dtype=np.float32), requires_grad=True)
    p.grad = tg.Tensor(np.array([3e19, 4e19], dtype=np.float32))
    total = optim.clip_grad_norm_([("p", p)], 1.0)
    assert total == pytest.approx(5e19, rel=1e-6)
    assert p.grad.dtype == np.float32 and np.linalg.norm(p.grad.data.astype(np.float64)) == pytest.approx(1.0, rel=1e-6)


def test_clip_grad_norm_nonfinite():
    vm, x, y = problem()
    loss_of(vm, x, y).backward()
    vm["b"].grad = np.array([np.nan, 1.0, 2.0])
    before = {k: vm[k].grad.data.copy() for k in ("W", "b")}
    with pytest.raises(RuntimeError, match="non-finite gradients in: b;"):
        optim.clip_grad_norm_(vm.named_vars(), 1.0, error_if_nonfinite=True)
    for k, g in before.items():  # raised before anything was scaled
        np.testing.assert_array_equal(vm[k].grad.data, g, err_msg=k)
    assert math.isnan(optim.clip_grad_norm_(vm.named_vars(), 1.0))


@pytest.mark.parametrize("bad", [np.inf, np.nan])
def test_clip_grad_norm_scales_the_gradients_by_a_non_finite_total_as_torch(bad):
    """torch's default (error_if_nonfinite=False): the scale max_norm / (inf + 1e-6) = 0 zeroes every finite
    gradient and makes an inf one NaN; a NaN total makes them all NaN. They were left as they were, unlike torch
    (the training loop stops on the non-finite total it returns before any step, either way)."""
    vm, x, y = problem()
    loss_of(vm, x, y).backward()
    vm["b"].grad = np.array([bad, 1.0, 2.0])
    total = optim.clip_grad_norm_(vm.named_vars(), 1.0)
    assert math.isinf(total) if bad == np.inf else math.isnan(total)
    if bad == np.inf:
        np.testing.assert_array_equal(vm["W"].grad.data, np.zeros((3, 4)))
        np.testing.assert_array_equal(vm["b"].grad.data, [np.nan, 0.0, 0.0])
    else:
        assert np.isnan(vm["W"].grad.data).all() and np.isnan(vm["b"].grad.data).all()


def test_clip_grad_norm_matches_torch():
    torch = pytest.importorskip("torch")
    vm, x, y = problem()
    loss_of(vm, x, y).backward()
    tparams = []
    for _, p in vm.named_vars():
        t = torch.tensor(p.data.copy(), requires_grad=True)
        t.grad = None if p.grad is None else torch.tensor(p.grad.data.copy())
        tparams.append(t)
    expected = float(torch.nn.utils.clip_grad_norm_(tparams, 0.3))
    assert optim.clip_grad_norm_(vm.named_vars(), 0.3) == pytest.approx(expected, rel=1e-12)
    for (_, p), t in zip(vm.named_vars(), tparams):
        if p.grad is not None:
            np.testing.assert_allclose(p.grad.data, t.grad.numpy(), rtol=1e-6)


# --- schedule ---------------------------------------------------------------------------------------------

def test_warmup_cosine():
    s = optim.WarmupCosine(1.0, warmup_steps=10, total_steps=110, min_lr=0.1)
    assert s(0) == pytest.approx(0.1) and s(4) == pytest.approx(0.5) and s(9) == pytest.approx(1.0)
    assert s(10) == pytest.approx(1.0)
    assert s(60) == pytest.approx(0.55)  # half way down the cosine
    assert s(110) == pytest.approx(0.1) and s(10_000) == 0.1
    after = [s(i) for i in range(10, 111)]
    assert all(a >= b for a, b in zip(after, after[1:]))
    no_warmup = optim.WarmupCosine(2e-3, 0, 100)
    assert no_warmup(0) == 2e-3 and no_warmup(100) == 0.0
    with pytest.raises(ValueError, match="warmup_steps <= total_steps"):
        optim.WarmupCosine(1.0, 20, 10)
    with pytest.raises(ValueError, match="min_lr"):
        optim.WarmupCosine(1.0, 0, 10, min_lr=2.0)


def test_a_frozen_parameter_is_skipped_until_unfrozen_as_in_torch():
    """AdamW(varmap) refused a VarMap with a frozen parameter; torch.optim takes it and skips it while it has
    no gradient."""
    vm, x, y = problem()
    vm["b"].requires_grad_(False)
    opt = optim.AdamW(vm, lr=0.1)
    frozen_before = vm["b"].data.copy()
    loss_of(vm, x, y).backward()
    assert optim.clip_grad_norm_(vm, 1e9) > 0
    opt.step()
    assert np.array_equal(vm["b"].data, frozen_before) and "b" not in opt.state
    vm["b"].requires_grad_(True)
    opt.zero_grad()
    loss_of(vm, x, y).backward()
    opt.step()
    assert not np.array_equal(vm["b"].data, frozen_before) and int(opt.state["b"]["step"]) == 1


def test_clip_grad_norm_takes_one_tensor_as_torch():
    p = tg.Tensor(np.zeros(3), requires_grad=True)
    p.grad = tg.Tensor(np.full(3, 10.0))
    assert optim.clip_grad_norm_(p, 1.0) == pytest.approx(np.sqrt(300.0))
    assert np.linalg.norm(p.grad.data) == pytest.approx(1.0, rel=1e-5)


@pytest.mark.parametrize("dampening", [0.0, 0.5])
def test_sgd_momentum_set_after_construction_starts_its_buffer_as_torch(dampening):
    """It raised KeyError('momentum_buffer'): the buffer was only made for a momentum given to __init__. The buffer
    starts as the gradient itself, undampened, as torch's None buffer does (and as on a first step)."""
    torch = pytest.importorskip("torch")
    a = tg.Tensor(np.array([1.0, -2.0]), requires_grad=True)
    ta = torch.tensor([1.0, -2.0], dtype=torch.float64, requires_grad=True)
    ours, theirs = optim.SGD([("a", a)], lr=0.1), torch.optim.SGD([ta], lr=0.1)
    for step in range(4):
        if step == 2:
            ours.momentum = theirs.param_groups[0]["momentum"] = 0.9
            ours.dampening = theirs.param_groups[0]["dampening"] = dampening
        ours.zero_grad(), theirs.zero_grad()
        (a * a * a).sum().backward(), (ta * ta * ta).sum().backward()
        ours.step(), theirs.step()
    np.testing.assert_allclose(a.data, ta.detach().numpy(), rtol=1e-14)


@pytest.mark.parametrize("slot, value, problem", [
    ("exp_avg_sq", [-1.0, -1.0], "must be >= 0"), ("exp_avg", [np.nan, 0.0], "must be finite numbers"),
    ("exp_avg", [np.inf, 0.0], "must be finite numbers"), ("step", -3, "step must be >= 0"),
])
def test_load_state_dict_refuses_damaged_moments(slot, value, problem):
    """Damaged hyper-parameters were refused but damaged moments loaded, and the next step wrote NaN."""
    a = tg.Tensor(np.ones(2), requires_grad=True)
    opt = optim.AdamW([("a", a)], lr=0.1)
    (a * a).sum().backward()
    opt.step()
    saved = opt.state_dict()
    saved[f"state/a/{slot}"] = np.array(value)
    fresh = optim.AdamW([("a", tg.Tensor(np.ones(2), requires_grad=True))], lr=0.1)
    with pytest.raises(ValueError, match=f"'state/a/{slot}': .*{problem}"):
        fresh.load_state_dict(saved)
    assert fresh.state == {}


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("make", [lambda ps, fused: optim.AdamW(ps, lr=0.1, fused=fused),
                                  lambda ps, fused: optim.SGD(ps, lr=0.1, momentum=0.9)], ids=["adamw", "sgd"])
def test_a_parameter_whose_data_changed_shape_after_the_first_step_is_refused_naming_it(make, fused):
    """x.data rebound to a larger array after a step: the fused Adam kernel read and wrote past the end of exp_avg
    (a wrong third element at size 3, a segfault at 1e6); refused, naming the parameter, before any update."""
    x = tg.Tensor(np.array([1.0, 2.0]), requires_grad=True)
    y = tg.Tensor(np.array([3.0]), requires_grad=True)
    opt = make([("y", y), ("x", x)], fused)
    x.grad, y.grad = tg.Tensor(np.ones(2)), tg.Tensor(np.ones(1))
    opt.step()
    x.data = np.ones(3)
    x.grad = tg.Tensor(np.ones(3))
    y_before = y.data.copy()
    with pytest.raises(RuntimeError, match=r"parameter 'x' is \(3,\) float64 but its (exp_avg|momentum_buffer) \(2,\)"):
        opt.step()
    np.testing.assert_array_equal(y.data, y_before)                      # nothing was updated
    np.testing.assert_array_equal(x.data, np.ones(3))
    x.data = np.ones(2, np.float32)                                      # another dtype: torch raises too ("expected
    x.grad = tg.Tensor(np.ones(2, np.float32))                           # dtype float for `end` but got double")
    with pytest.raises(RuntimeError, match=r"parameter 'x' is \(2,\) float32 but its (exp_avg|momentum_buffer) "
                                           r"\(2,\) float64"):
        opt.step()


@pytest.mark.parametrize("call,message", [
    (lambda: optim.WarmupCosine(1e-3, 0, 10)(float("nan")), r"step must be an int >= 0, got nan"),     # lr was nan
    (lambda: optim.WarmupCosine(1e-3, 0, 10)(None), r"step must be an int >= 0, got None"),
    (lambda: optim.WarmupCosine("1e-3", 0, 10), r"lr must be a finite number, got '1e-3'"),
    (lambda: optim.WarmupCosine(float("inf"), 0, 10), r"lr must be a finite number, got inf"),
    (lambda: optim.WarmupCosine(1e-3, 0.5, 10), r"warmup_steps must be an int, got 0.5"),
])
def test_a_schedule_names_a_bad_argument(call, message):
    """Found by an API audit: a NaN step gave a NaN learning rate, an inf lr was taken, a str lr failed inside a
    comparison."""
    with pytest.raises(ValueError, match=message):
        call()


def test_zero_grad_takes_a_bool_only():
    """set_to_none="no" (truthy) dropped the gradients it was asked to keep."""
    x = tg.Tensor(np.ones(2), requires_grad=True)
    opt = optim.SGD([x], lr=0.1)
    x.grad = tg.Tensor(np.ones(2))
    with pytest.raises(TypeError, match=r"zero_grad: set_to_none must be True or False, got 'no'"):
        opt.zero_grad(set_to_none="no")
    assert x.grad is not None
    opt.zero_grad(set_to_none=False)
    assert x.grad is not None and not x.grad.data.any()
