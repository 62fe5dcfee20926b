"""Parameter groups as torch.optim takes them: per-group hyper-parameters that step() reads as they are now (a
schedule changes param_groups[i]["lr"] between steps), add_param_group, a parameter in one group only, and
per-group hyper-parameters through state_dict / load_state_dict (including states saved before groups)."""
import numpy as np
import pytest

import tinygrad_ssm as tg
from tinygrad_ssm import VarBuilder, VarMap, optim
from tinygrad_ssm.nn import init

STEPS = 12


def problem(seed=0):
    """W (3, 4), b (3,), c (2,): loss = 0.5 |W x - y|^2 + sum(b^4) / 4 + sum(c^2 b[:2]) (every one gets a grad)."""
    vm = VarMap(seed=seed)
    vb = VarBuilder.from_varmap(vm, "float64")
    vb.get((3, 4), "W", init=init.Randn(0, 1))
    vb.get((3,), "b", init=init.Randn(0, 1))
    vb.get((2,), "c", init=init.Randn(0, 1))
    r = np.random.default_rng(1)
    return vm, r.standard_normal(4), r.standard_normal(3)


def loss_of(W, b, c, x, y, T):
    err = W @ T(x) - T(y)
    return 0.5 * (err * err).sum() + (b ** 4).sum() / 4 + (c * c * b[:2]).sum()


def lr_at(step):  # changed between steps through param_groups, as a scheduler does
    return [0.05 * (1 + step) / 4 if step < 4 else 0.05 * 0.8 ** (step - 4), 0.02 + 0.001 * step]


CASES = {
    "AdamW": (optim.AdamW, "AdamW", dict(betas=(0.8, 0.95), eps=1e-6), [dict(weight_decay=0.1), dict(weight_decay=0.0)]),
    "Adam": (optim.Adam, "Adam", dict(betas=(0.85, 0.99), eps=1e-7), [dict(weight_decay=0.05), dict(weight_decay=0.0)]),
    "Adam-betas": (optim.Adam, "Adam", dict(), [dict(betas=(0.5, 0.9)), dict(betas=(0.9, 0.999), eps=1e-3)]),
    "SGD": (optim.SGD, "SGD", dict(momentum=0.9), [dict(weight_decay=0.1), dict(momentum=0.5, dampening=0.2)]),
    "SGD-nesterov": (optim.SGD, "SGD", dict(momentum=0.9, nesterov=True), [dict(weight_decay=0.01),
                                                                            dict(momentum=0.0, nesterov=False)]),
    "SGD-plain": (optim.SGD, "SGD", dict(), [dict(), dict(weight_decay=0.3)]),
}


@pytest.mark.parametrize("case, fused", [(c, f) for c in CASES for f in (True, False)
                                         if f or CASES[c][0] is not optim.SGD])  # SGD has one path
def test_groups_and_lr_changed_between_steps_match_torch(case, fused):
    """float64 to 1e-12 against torch.optim over 12 steps, two groups of different lr / weight decay / betas /
    momentum, each group's lr written through param_groups before every step (both optimizers alike)."""
    torch = pytest.importorskip("torch")
    cls, torch_name, defaults, overrides = CASES[case]
    vm, x, y = problem()
    tW, tb, tc = (torch.tensor(vm[k].data.copy(), requires_grad=True) for k in ("W", "b", "c"))
    extra = dict(fused=fused) if cls is not optim.SGD else {}
    ours = cls([{"params": [("W", vm["W"])], **overrides[0]},
                {"params": [("b", vm["b"]), ("c", vm["c"])], **overrides[1]}], lr=0.05, **defaults, **extra)
    theirs = getattr(torch.optim, torch_name)([{"params": [tW], **overrides[0]}, {"params": [tb, tc], **overrides[1]}],
                                              lr=0.05, **defaults)
    for step in range(STEPS):
        for opt in (ours, theirs):
            for group, lr in zip(opt.param_groups, lr_at(step)):
                group["lr"] = lr
        ours.zero_grad(), theirs.zero_grad()
        loss_of(vm["W"], vm["b"], vm["c"], x, y, tg.Tensor).backward()
        loss_of(tW, tb, tc, x, y, torch.tensor).backward()
        ours.step(), theirs.step()
        for k, t in zip("Wbc", (tW, tb, tc)):
            np.testing.assert_allclose(vm[k].data, t.detach().numpy(), rtol=1e-12, atol=1e-14,
                                       err_msg=f"{k} at step {step + 1}")
    assert not np.allclose(vm["W"].data, problem()[0]["W"].data)  # it moved


def two_groups(cls=optim.AdamW, **kwargs):
    vm, x, y = problem()
    return vm, cls([{"params": [("W", vm["W"])], "weight_decay": 0.1},
                    {"params": [("b", vm["b"]), ("c", vm["c"])], "weight_decay": 0.0, "lr": 1e-2}],
                   lr=3e-4, **kwargs), x, y


def steps(opt, vm, x, y, n):
    for _ in range(n):
        opt.zero_grad()
        loss_of(vm["W"], vm["b"], vm["c"], x, y, tg.Tensor).backward()
        opt.step()


def test_param_groups_are_torch_shaped_dicts_with_names():
    vm, opt, _, _ = two_groups()
    g0, g1 = opt.param_groups
    assert g0["params"][0] is vm["W"] and g0["param_names"] == ["W"] and g1["param_names"] == ["b", "c"]
    assert (g0["lr"], g0["weight_decay"], g0["betas"], g0["eps"]) == (3e-4, 0.1, (0.9, 0.999), 1e-8)  # defaults
    assert (g1["lr"], g1["weight_decay"]) == (1e-2, 0.0)
    assert [n for n, _ in opt.params] == ["W", "b", "c"]
    bare = optim.SGD([{"params": [vm["W"]]}, {"params": [vm["b"], vm["c"]], "lr": 0.5}], lr=0.1)
    assert [n for n, _ in bare.params] == ["param.0", "param.1", "param.2"]  # numbered across groups, as torch
    # counted by the parameters before the group, not by the groups (a first group of two: 0, 1, then 2)
    two_first = optim.SGD([{"params": [vm["W"], vm["b"]]}, {"params": [vm["c"]], "lr": 0.5}], lr=0.1)
    assert two_first.param_groups[1]["param_names"] == ["param.2"]
    added = optim.SGD([vm["W"], vm["b"]], lr=0.1)
    added.add_param_group({"params": [vm["c"]]})
    assert added.param_groups[1]["param_names"] == ["param.2"]
    torch_style = optim.SGD([{"params": [vm["W"], vm["b"]], "param_names": ["W", "b"]}], lr=0.1)
    assert [n for n, _ in torch_style.params] == ["W", "b"]
    with pytest.raises(ValueError, match=r"SGD.param_groups\[0\]: 1 param_names for 2 params; give one name each"):
        optim.SGD([{"params": [vm["W"], vm["b"]], "param_names": ["W"]}], lr=0.1)  # zip would drop b


def test_the_optimizers_attribute_is_every_groups_value():
    _, opt, _, _ = two_groups()
    assert opt.eps == 1e-8 and opt.betas == (0.9, 0.999) and opt.beta1 == 0.9
    with pytest.raises(AttributeError, match=r"AdamW: the parameter groups differ in lr \(\[0.0003, 0.01\]\); read "
                                             r"optimizer.param_groups\[i\]\['lr'\]"):
        _ = opt.lr
    opt.lr = 2e-3  # a schedule that sets opt.lr sets it for every group
    assert [g["lr"] for g in opt.param_groups] == [2e-3, 2e-3] and opt.lr == 2e-3
    opt.beta2 = 0.95
    assert [g["betas"] for g in opt.param_groups] == [(0.9, 0.95)] * 2
    with pytest.raises(ValueError, match=r"AdamW: lr must be a finite number >= 0, got -1"):
        opt.lr = -1
    assert opt.lr == 2e-3


def test_setting_one_beta_keeps_each_groups_other_beta():
    vm, _, _ = problem()
    opt = optim.Adam([{"params": [vm["W"]], "betas": (0.8, 0.99)}, {"params": [vm["b"]], "betas": (0.5, 0.9)}])
    for name in ("beta1", "beta2", "betas"):    # beta1 said "'Adam' object has no attribute 'beta1'"
        with pytest.raises(AttributeError, match=r"Adam: the parameter groups differ in betas"):
            getattr(opt, name)
    with pytest.raises(AttributeError, match=r"'Adam' object has no attribute 'beta3'"):
        _ = opt.beta3
    opt.beta2 = 0.95
    assert [g["betas"] for g in opt.param_groups] == [(0.8, 0.95), (0.5, 0.95)]
    opt.beta1 = 0.7
    assert [g["betas"] for g in opt.param_groups] == [(0.7, 0.95), (0.7, 0.95)] and opt.beta1 == 0.7
    with pytest.raises(ValueError, match=r"Adam: beta2 must be a finite number in \[0, 1\), got 1"):
        opt.beta2 = 1
    assert [g["betas"] for g in opt.param_groups] == [(0.7, 0.95), (0.7, 0.95)]  # checked before any is set


@pytest.mark.parametrize("key, value, problem", [
    ("lr", -1.0, "lr must be a finite number >= 0, got -1.0"), ("lr", float("nan"), "lr must be a finite number"),
    ("betas", (0.9, 1.0), r"beta2 must be a finite number in \[0, 1\), got 1.0 \(betas=\(0.9, 1.0\)\)"),
    ("weight_decay", -0.1, "weight_decay must be a finite number >= 0"),
    ("amsgrad", True, "amsgrad=True is not supported by this AdamW"),
    ("maximize", True, "maximize=True is not supported by this AdamW"),
])
def test_a_groups_hyperparameter_is_checked_when_set(key, value, problem):
    vm, opt, _, _ = two_groups()
    before = opt.param_groups[1].get(key)
    with pytest.raises(ValueError, match=rf"AdamW.param_groups\[1\]: {problem}"):
        opt.param_groups[1][key] = value
    assert opt.param_groups[1].get(key) == before
    with pytest.raises(ValueError, match=rf"AdamW.param_groups\[1\]: {problem}"):
        opt.param_groups[1].update({key: value})
    if key not in opt.param_groups[1]:  # setdefault sets only a key the group lacks: checked as well
        with pytest.raises(ValueError, match=rf"AdamW.param_groups\[1\]: {problem}"):
            opt.param_groups[1].setdefault(key, value)
        assert key not in opt.param_groups[1]
    with pytest.raises(ValueError, match=rf"AdamW.param_groups\[1\]: {problem}"):
        optim.AdamW([{"params": [vm["W"]]}, {"params": [vm["b"]], key: value}])


def test_torchs_default_switches_are_accepted_and_metadata_kept():
    """A group copied from a torch optimizer carries amsgrad=False, foreach=None, ...; a user's own key stays."""
    vm, _, _ = problem()
    opt = optim.AdamW([{"params": [vm["W"]], "amsgrad": False, "foreach": None, "maximize": False, "name": "mats"}])
    assert opt.param_groups[0]["name"] == "mats"


def test_add_param_group_and_a_parameter_in_two_groups():
    vm, x, y = problem()
    opt = optim.AdamW([("W", vm["W"])], lr=1e-3, weight_decay=0.1)
    opt.add_param_group({"params": [("b", vm["b"])], "weight_decay": 0.0})
    g = opt.param_groups[1]
    assert g["param_names"] == ["b"] and g["weight_decay"] == 0.0 and g["lr"] == 1e-3  # the rest: the defaults
    with pytest.raises(ValueError, match=r"AdamW.param_groups\[2\]: parameter 'again' is already in "
                                         r"param_groups\[0\] \(as 'W'\); a parameter can be in one group only"):
        opt.add_param_group({"params": [("again", vm["W"])]})
    with pytest.raises(ValueError, match=r"AdamW.param_groups\[2\]: the name 'b' is already used in "
                                         r"param_groups\[1\]"):
        opt.add_param_group({"params": [("b", vm["c"])]})
    with pytest.raises(ValueError, match=r"AdamW.param_groups\[1\]: parameter 'param.1' is already in "
                                         r"param_groups\[0\] \(as 'param.0'\)"):
        optim.AdamW([{"params": [vm["W"]]}, {"params": [vm["W"]]}])  # torch: ValueError too
    with pytest.raises(TypeError, match=r"a parameter group is a dict with a 'params' key"):
        opt.add_param_group([vm["c"]])
    with pytest.raises(TypeError, match=r"mixes parameter groups \(dicts\) with parameters"):
        optim.AdamW([{"params": [vm["W"]]}, vm["b"]])
    with pytest.raises(TypeError, match=r"got one dict; pass it in a list: \[group\]"):
        optim.AdamW({"params": [vm["W"]]})
    with pytest.raises(ValueError, match=r"\['params'\] cannot be replaced"):
        opt.param_groups[0]["params"] = [vm["c"]]
    with pytest.raises(ValueError, match=r"\['param_names'\] cannot be replaced"):
        opt.param_groups[0]["param_names"] = ["renamed"]  # the state is keyed by these names
    assert opt.param_groups[0]["param_names"] == ["W"]
    with pytest.raises(ValueError, match="got an empty parameter list"):
        optim.AdamW([{"params": []}])
    assert len(opt.param_groups) == 2
    opt.add_param_group({"params": [("c", vm["c"])], "lr": 0.0})
    before = vm["c"].data.copy()
    steps(opt, vm, x, y, 2)
    assert np.array_equal(vm["c"].data, before) and int(opt.state["c"]["step"]) == 2  # lr 0: stepped, not moved


def test_sgd_nesterov_is_checked_per_group():
    vm, _, _ = problem()
    with pytest.raises(ValueError, match=r"SGD.param_groups\[1\]: nesterov momentum requires a momentum and zero "
                                         r"dampening"):
        optim.SGD([{"params": [vm["W"]]}, {"params": [vm["b"]], "nesterov": True}], lr=0.1, momentum=0.0)
    with pytest.raises(ValueError, match=r"SGD.param_groups\[0\]: nesterov must be True or False, got 1"):
        optim.SGD([{"params": [vm["W"]], "nesterov": 1}], lr=0.1, momentum=0.9)


# --- state_dict -------------------------------------------------------------------------------------------

def test_per_group_hyperparameters_round_trip_and_a_resumed_run_is_bit_identical(tmp_path):
    from tinygrad_ssm.io.safetensors import load_file, save_file
    vm, opt, x, y = two_groups()
    steps(opt, vm, x, y, 3)
    opt.param_groups[0]["lr"], opt.param_groups[1]["betas"] = 7e-4, (0.5, 0.75)  # changed since construction
    state = opt.state_dict()
    assert {k for k in state if k.startswith("hparams/")} == {f"hparams/{i}/{k}" for i in (0, 1) for k in
                                                              ("lr", "beta1", "beta2", "eps", "weight_decay")}
    assert (state["hparams/0/lr"], state["hparams/1/lr"], state["hparams/1/beta1"]) == (7e-4, 1e-2, 0.5)
    save_file(tmp_path / "optimizer.safetensors", state)
    vm.save(tmp_path / "model.safetensors")
    steps(opt, vm, x, y, 4)
    continued = {k: vm[k].data.copy() for k in "Wbc"}

    vm2, opt2, _, _ = two_groups()  # built with the original hyper-parameters: the saved ones replace them
    vm2.load(tmp_path / "model.safetensors")
    opt2.load_state_dict(load_file(tmp_path / "optimizer.safetensors"))
    assert [(g["lr"], g["betas"], g["weight_decay"]) for g in opt2.param_groups] == \
        [(7e-4, (0.9, 0.999), 0.1), (1e-2, (0.5, 0.75), 0.0)]
    steps(opt2, vm2, x, y, 4)
    assert all(continued[k].tobytes() == vm2[k].data.tobytes() for k in "Wbc")


def legacy(state: dict) -> dict:
    """A one-group state as saved before parameter groups: "hparams/lr" (no group index)."""
    return {k.replace("hparams/0/", "hparams/"): v for k, v in state.items()}


def test_a_state_saved_before_groups_loads_into_one_group():
    vm, x, y = problem()
    opt = optim.AdamW(vm, lr=3e-3, weight_decay=0.2)
    steps(opt, vm, x, y, 2)
    old = legacy(opt.state_dict())
    assert "hparams/lr" in old and not any(k.startswith("hparams/0/") for k in old)
    fresh = optim.AdamW(problem()[0], lr=1.0, weight_decay=0.0)
    fresh.load_state_dict(old)
    assert (fresh.lr, fresh.weight_decay) == (3e-3, 0.2)
    assert fresh.state_dict().keys() == opt.state_dict().keys()
    assert all(np.array_equal(fresh.state_dict()[k], v) for k, v in opt.state_dict().items())


def test_load_state_dict_refuses_states_of_other_groupings_and_changes_nothing():
    vm, opt, x, y = two_groups()
    steps(opt, vm, x, y, 1)
    good = opt.state_dict()
    before = opt.state_dict()
    one = optim.AdamW(problem()[0], lr=0.1)
    cases = [
        (legacy(one.state_dict()),
         r"'hparams/lr': saved by an optimizer with one parameter group \(no group index\), but this one has 2"),
        ({**good, "hparams/2/lr": np.array(0.1)},
         (r"unexpected key 'hparams/2/lr': this optimizer has 2 parameter group\(s\), 'hparams/0/...' to "
          r"'hparams/1/...'")),
        ({k: v for k, v in good.items() if k != "hparams/1/eps"}, r"missing key 'hparams/1/eps'"),
        ({**good, "hparams/1/momentum": np.array(0.9)}, r"unexpected key 'hparams/1/momentum'"),
    ]
    for state, problem_text in cases:
        with pytest.raises(ValueError, match=problem_text):
            opt.load_state_dict(state)
    after = opt.state_dict()
    assert after.keys() == before.keys() and all(np.array_equal(after[k], before[k]) for k in before)
    with pytest.raises(ValueError, match=r"'hparams/lr': group 0's lr is given twice"):
        one.load_state_dict({**one.state_dict(), "hparams/lr": np.array(0.5)})


def test_sgd_state_without_the_buffer_of_a_momentum_set_since_the_last_step_loads():
    """Momentum set after the last step (the buffer starts at the next one, as torch's None buffer): the state
    had a step but no buffer, and loading it back was refused ("missing momentum_buffer")."""
    a = tg.Tensor(np.array([1.0, -2.0]), requires_grad=True)
    opt = optim.SGD([("a", a)], lr=0.1)
    (a * a * a).sum().backward()
    opt.step()
    opt.momentum = 0.9
    saved = opt.state_dict()
    assert "state/a/momentum_buffer" not in saved and saved["hparams/0/momentum"] == 0.9
    twin = optim.SGD([("a", tg.Tensor(a.data.copy(), requires_grad=True))], lr=0.1)
    twin.load_state_dict(saved)
    for o, p in ((opt, a), (twin, twin.params[0][1])):
        o.zero_grad()
        (p * p * p).sum().backward()
        o.step()
    assert np.array_equal(a.data, twin.params[0][1].data) and twin.momentum == 0.9


def test_a_groups_own_numbers_round_trip_as_torch_keeps_them(tmp_path):
    """torch's LambdaLR writes "initial_lr" into each group and reads it back after a resume: a state dict keeps a
    group's numbers beside its hyper-parameters (ints as ints), through a safetensors file, into a fresh
    optimizer; a string key is no number a safetensors file holds, so the loading optimizer keeps its own."""
    from tinygrad_ssm.io.safetensors import load_file, save_file
    vm, x, y = problem()
    named = dict(vm.named_vars())
    def build():
        return optim.AdamW([{"params": [("W", named["W"])], "name": "matrices"},
                            {"params": [("b", named["b"]), ("c", named["c"])], "weight_decay": 0.0}], lr=0.01)
    opt = build()
    opt.param_groups[0]["initial_lr"], opt.param_groups[1]["initial_lr"] = 0.01, 0.003
    opt.param_groups[1]["cycles"] = 3
    save_file(tmp_path / "opt.safetensors", opt.state_dict())
    fresh = build()
    fresh.param_groups[0]["name"] = "mine"
    fresh.load_state_dict(load_file(tmp_path / "opt.safetensors"))
    assert fresh.param_groups[0]["initial_lr"] == 0.01 and fresh.param_groups[1]["initial_lr"] == 0.003
    assert fresh.param_groups[1]["cycles"] == 3 and type(fresh.param_groups[1]["cycles"]) is int
    assert fresh.param_groups[0]["name"] == "mine" and "initial_lr" not in build().param_groups[0]
    for bad in ({"extra/2/initial_lr": np.array(1.0)}, {"extra/0/lr": np.array(1.0)},
                {"extra/0/initial_lr": np.zeros(2)}):
        with pytest.raises(ValueError, match="extra/"):
            build().load_state_dict({**opt.state_dict(), **bad})


def test_a_state_with_momentum_loads_into_an_sgd_built_without_it():
    """The slots a state may hold follow the momentum being loaded, not the loading optimizer's own: an SGD built
    with momentum 0 takes a saved momentum 0.9 and its buffer, and continues as the saved one does."""
    vm, x, y = problem()
    opt = optim.SGD(vm, lr=0.05, momentum=0.9)
    steps(opt, vm, x, y, 2)
    saved = opt.state_dict()
    assert "state/W/momentum_buffer" in saved
    vm2, _, _ = problem()
    for k in "Wbc":
        vm2.set_one(k, vm[k].data)
    twin = optim.SGD(vm2, lr=0.05)
    twin.load_state_dict(saved)
    assert twin.momentum == 0.9
    assert np.array_equal(twin.state["W"]["momentum_buffer"], opt.state["W"]["momentum_buffer"])
    steps(opt, vm, x, y, 2), steps(twin, vm2, x, y, 2)
    assert all(vm[k].data.tobytes() == vm2[k].data.tobytes() for k in "Wbc")


def test_torchs_keyword_switches_are_taken_at_their_neutral_values_and_named_otherwise():
    """AdamW(p, lr, amsgrad=False) (a call ported from torch, its defaults spelled out) failed with Python's bare
    "unexpected keyword argument", where the same keys in a group were taken (found by an audit); a misspelt
    keyword is named with the arguments there are, and an empty parameter list from a used-up generator says so."""
    vm = problem()[0]
    params = list(vm.all_vars())
    optim.AdamW(params, lr=1e-3, amsgrad=False, foreach=None, maximize=False, capturable=False, differentiable=False,
                fused=None)
    optim.SGD(params, lr=0.1, maximize=False, foreach=None, differentiable=False)
    assert optim.Adam(params, fused=None).fused is True                  # torch's default: ours
    with pytest.raises(ValueError, match=r"AdamW: amsgrad=True is not supported by this AdamW .* leave it out"):
        optim.AdamW(params, amsgrad=True)
    with pytest.raises(ValueError, match=r"SGD: maximize=True is not supported"):
        optim.SGD(params, lr=0.1, maximize=True)
    with pytest.raises(TypeError, match=r"AdamW: unexpected keyword argument 'weight_deacy' \(its arguments: params, "
                                        r"lr, betas, eps, weight_decay; torch's switches amsgrad, "):
        optim.AdamW(params, weight_deacy=0.0)
    generator = (p for p in vm.all_vars())
    optim.AdamW(generator)
    with pytest.raises(ValueError, match=r"got an empty parameter list \(from an iterator: a generator of parameters "
                                         r"is used up .* pass list\(\.\.\.\)"):
        optim.SGD(generator, lr=0.1)
    with pytest.raises(ValueError, match=r"got an empty parameter list$"):
        optim.SGD([], lr=0.1)


def test_a_misspelt_group_key_is_refused_and_a_users_own_key_kept():
    """{"params": p, "weight_deacy": 0.0} kept the typo and decayed the group at the default (found by an audit);
    torch keeps any key, and so does this for a key of the user's own ("name")."""
    vm = problem()[0]
    W, b = vm["W"], vm["b"]
    with pytest.raises(ValueError, match=r"param_groups\[0\]: unknown key 'weight_deacy'; did you mean 'weight_decay'"):
        optim.AdamW([{"params": [W], "weight_deacy": 0.0}], lr=1e-3)
    with pytest.raises(ValueError, match=r"unknown key 'momentun'; did you mean 'momentum'"):
        optim.SGD([{"params": [W]}, {"params": [b], "momentun": 0.9}], lr=0.1)
    opt = optim.AdamW([{"params": [W], "name": "matrices", "weight_decay": 0.0}], lr=1e-3)
    assert opt.param_groups[0]["name"] == "matrices" and opt.param_groups[0]["weight_decay"] == 0.0

