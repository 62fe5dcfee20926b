"""Optimizer hyper-parameters are range-checked with PyTorch's rules (0 <= betas < 1, eps >= 0, lr >= 0,
weight_decay >= 0, momentum >= 0) and must be finite: at construction, on assignment (the training loop sets
`opt.lr` every step) and in load_state_dict (a saved state is data from disk). Errors name the optimizer, the
argument and the value. clip_grad_norm_ needs a finite max_norm >= 0."""
import math

import numpy as np
import pytest

from tinygrad_ssm import VarBuilder, VarMap, optim
from tinygrad_ssm.nn import init

NAN, INF = float("nan"), float("inf")


def params():
    vm = VarMap(seed=0)
    vb = VarBuilder.from_varmap(vm, "float64")
    vb.get((3, 4), "W", init=init.Randn(0, 1))
    vb.get((3,), "b", init=init.Randn(0, 1))
    return vm


@pytest.mark.parametrize("cls", [optim.Adam, optim.AdamW])
@pytest.mark.parametrize("kwargs, arg, shown", [
    (dict(lr=NAN), "lr", "nan"), (dict(lr=-1e-3), "lr", "-0.001"), (dict(lr=INF), "lr", "inf"),
    (dict(eps=NAN), "eps", "nan"), (dict(eps=-1.0), "eps", "-1"), (dict(eps=INF), "eps", "inf"),
    (dict(betas=(5.0, 0.999)), "beta1", "5"), (dict(betas=(0.9, 1.0)), "beta2", "1"),
    (dict(betas=(NAN, 0.999)), "beta1", "nan"), (dict(betas=(-0.1, 0.999)), "beta1", "-0.1"),
    (dict(weight_decay=-0.1), "weight_decay", "-0.1"), (dict(weight_decay=NAN), "weight_decay", "nan"),
])
def test_adam_refuses_out_of_range_hyperparameters(cls, kwargs, arg, shown):
    with pytest.raises(ValueError, match=rf"{cls.__name__}: .*\b{arg}\b.*{shown}") as err:
        cls(params(), **kwargs)
    assert cls.__name__ in str(err.value)


@pytest.mark.parametrize("kwargs, arg", [(dict(lr=NAN), "lr"), (dict(lr=0.1, momentum=NAN), "momentum"),
                                         (dict(lr=0.1, momentum=-1), "momentum"),
                                         (dict(lr=0.1, dampening=NAN), "dampening"),
                                         (dict(lr=0.1, weight_decay=INF), "weight_decay")])
def test_sgd_refuses_out_of_range_hyperparameters(kwargs, arg):
    with pytest.raises(ValueError, match=rf"SGD: .*\b{arg}\b"):
        optim.SGD(params(), **kwargs)


@pytest.mark.parametrize("kwargs", [dict(momentum=0.0), dict(momentum=0.9, dampening=0.1)],
                         ids=["no momentum", "dampening"])
def test_sgd_refuses_nesterov_without_momentum_or_with_dampening_as_torch(kwargs):
    with pytest.raises(ValueError, match="SGD: nesterov momentum requires a momentum and zero dampening"):
        optim.SGD(params(), lr=0.1, nesterov=True, **kwargs)


def test_the_edges_pytorch_allows_are_allowed():
    opt = optim.AdamW(params(), lr=0.0, betas=(0.0, 0.0), eps=0.0, weight_decay=0.0)
    assert (opt.lr, opt.beta1, opt.beta2, opt.eps, opt.weight_decay) == (0.0, 0.0, 0.0, 0.0, 0.0)
    optim.SGD(params(), lr=0.0, momentum=0.0, dampening=0.0)


@pytest.mark.parametrize("value", [NAN, -1.0, INF])
def test_assigning_a_bad_learning_rate_is_refused(value):
    opt = optim.AdamW(params(), lr=1e-3)
    with pytest.raises(ValueError, match=r"AdamW: lr must be a finite number >= 0"):
        opt.lr = value
    assert opt.lr == 1e-3


@pytest.mark.parametrize("key, value", [("beta1", 5.0), ("beta2", 1.0), ("eps", -1.0), ("eps", NAN),
                                        ("lr", NAN), ("lr", -1.0), ("weight_decay", -0.5), ("beta1", INF)])
def test_load_state_dict_refuses_out_of_range_hyperparameters_and_changes_nothing(key, value):
    vm = params()
    opt = optim.AdamW(vm, lr=1e-3)
    state = opt.state_dict()
    state[f"hparams/0/{key}"] = np.array(value)
    before = opt.state_dict()
    with pytest.raises(ValueError, match=rf"(?s)AdamW.load_state_dict: .*'hparams/0/{key}'.*{value:g}"):
        opt.load_state_dict(state)
    after = opt.state_dict()
    assert before.keys() == after.keys() and all(np.array_equal(before[k], after[k], equal_nan=True)
                                                 for k in before)


@pytest.mark.parametrize("max_norm", [-1.0, NAN, INF])
def test_clip_grad_norm_refuses_a_negative_or_non_finite_limit(max_norm):
    vm = params()
    for p in vm.all_vars():
        p.grad = type(p)(np.ones(p.shape))
    before = [p.grad.data.copy() for p in vm.all_vars()]
    with pytest.raises(ValueError, match=rf"clip_grad_norm_: max_norm must be a finite number >= 0, got "
                                         rf"{max_norm}"):
        optim.clip_grad_norm_(vm.all_vars(), max_norm)
    assert all(np.array_equal(b, p.grad.data) for b, p in zip(before, vm.all_vars()))  # untouched


def test_clip_grad_norm_zero_limit_zeroes_the_gradients():
    vm = params()
    for p in vm.all_vars():
        p.grad = type(p)(np.ones(p.shape))
    total = optim.clip_grad_norm_(vm.all_vars(), 0.0)
    assert total == pytest.approx(math.sqrt(15))
    assert all(np.all(p.grad.data == 0) for p in vm.all_vars())


def float32_adam():
    vm = VarMap(seed=0)
    VarBuilder.from_varmap(vm, "float32").get((2,), "w", init=init.Randn(0, 1))
    opt = optim.AdamW(vm)
    for t in vm.all_vars():
        t.grad = np.ones(t.shape, t.dtype)
    opt.step()
    return opt


@pytest.mark.parametrize("key, value, problem", [
    ("state/w/step", np.array(2 ** 64 - 1, np.uint64), r"step must be >= 0 and fit int64"),
    ("state/w/exp_avg_sq", np.array([1e300, 1.0]), r"must be finite numbers in float32"),
    ("hparams/0/lr", np.array([1e-3]), r"'hparams/0/lr': must be 0-d \(one number\), got shape \(1,\)"),
])
def test_load_state_dict_checks_values_as_they_will_be_kept(key, value, problem):
    """A uint64 step of 2**64-1 passed `>= 0` and wrapped to -1 in int64 (the next step divided by zero); a
    float64 moment of 1e300 passed the finiteness check and became inf in float32."""
    opt = float32_adam()
    state = opt.state_dict()
    before = {k: v.copy() for k, v in state.items()}
    state[key] = value
    with pytest.raises(ValueError, match=problem):
        opt.load_state_dict(state)
    after = opt.state_dict()
    assert after.keys() == before.keys() and all(np.array_equal(after[k], before[k]) for k in before)


def test_a_refused_load_state_dict_keeps_the_hyperparameters_even_valid_saved_ones():
    """Everything is checked before anything is set: a state whose hyperparameters are fine but whose moments do not
    fit is refused whole, so the optimizer keeps its own lr (a half-loaded optimizer would run on the saved lr)."""
    vm = params()
    opt = optim.AdamW(vm, lr=1e-3, weight_decay=0.1)
    state = {**opt.state_dict(), "hparams/0/lr": np.array(0.5), "hparams/0/weight_decay": np.array(0.0),
             "state/W/exp_avg": np.zeros((4, 3))}
    with pytest.raises(ValueError, match=r"'state/W/exp_avg': shape \(4, 3\)"):
        opt.load_state_dict(state)
    assert (opt.lr, opt.weight_decay) == (1e-3, 0.1)


def test_a_refused_extra_number_changes_no_hyperparameter():
    """A group's extra number (extra/0/eps, an initial_lr) was checked only as it was set, after that group's lr had
    been replaced: the load raised with the optimizer half-loaded, and the message named no key."""
    vm = params()
    opt = optim.SGD(vm, lr=0.1)
    state = {**opt.state_dict(), "hparams/0/lr": np.array(5.0), "extra/0/eps": np.array(NAN)}
    with pytest.raises(ValueError, match=r"'extra/0/eps': eps must be a finite number >= 0, got nan"):
        opt.load_state_dict(state)
    assert opt.lr == 0.1


def test_sgd_on_a_zero_dim_parameter_with_late_momentum_and_weight_decay_steps_as_torch(tmp_path):
    """A 0-d parameter with weight decay, momentum switched on after two steps: grad + wd * p of two 0-d arrays
    was a NumPy scalar, stored as the buffer, which the in-place updates then left unchanged: wrong steps without
    a word, and a state_dict that could not be saved. Then momentum set to 0 and the state loaded back (torch
    keeps the buffer): it was refused as an unexpected key."""
    torch = pytest.importorskip("torch")
    from tinygrad_ssm.io.safetensors import save_file
    vm = VarMap()
    p = VarBuilder.from_varmap(vm, "float64").get((), "p", init=init.Const(1.5))
    tp = torch.tensor(1.5, dtype=torch.float64, requires_grad=True)
    ours, theirs = optim.SGD(vm, lr=0.1, weight_decay=0.1), torch.optim.SGD([tp], lr=0.1, weight_decay=0.1)
    for step in range(5):
        if step == 2:
            ours.param_groups[0]["momentum"] = theirs.param_groups[0]["momentum"] = 0.9
        p.grad, tp.grad = None, None
        (p * p * 3).sum().backward()
        (tp * tp * 3).backward()
        ours.step(), theirs.step()
    assert p.data == pytest.approx(tp.item(), rel=1e-15)
    save_file(tmp_path / "sgd.safetensors", ours.state_dict())           # real arrays, savable
    ours.param_groups[0]["momentum"] = 0.0
    ours.load_state_dict(ours.state_dict())                              # the buffer kept, as torch keeps it
    assert "momentum_buffer" in ours.state["p"]
