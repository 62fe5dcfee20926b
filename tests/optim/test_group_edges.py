"""Parameter groups and clipping at the edges an audit against torch.optim found: a group's parameter list changed
in place, an optimizer through pickle, a group copied from torch's AdamW, one tensor as a group's params, params
that are not parameters, and read-only gradients met half-way through clipping or zeroing."""
import copy
import pickle

import numpy as np
import pytest

import tinygrad_ssm as tg
from tinygrad_ssm import optim


def leaf(*values):
    return tg.Tensor(np.array(values, dtype=np.float64), requires_grad=True)


def test_a_groups_params_cannot_change_in_place():
    """opt.param_groups[0]["params"].append(b) was silently never updated, and .remove(a) gave the next tensor a's
    name and Adam moments (the list is paired by position with the names the state is keyed by)."""
    a, b = leaf(1.0, 1.0), leaf(1.0, 1.0)
    opt = optim.SGD([a], lr=0.5)
    group = opt.param_groups[0]
    for change in (lambda: group["params"].append(b), lambda: group["params"].remove(a),
                   lambda: group["params"].__setitem__(0, b), lambda: group["param_names"].pop(),
                   lambda: group["params"].__iadd__([b])):
        with pytest.raises(TypeError, match="'params' and 'param_names' cannot be changed in place.*add_param_group"):
            change()
    assert group["params"] == [a] and group["param_names"] == ["param.0"]
    opt.add_param_group({"params": [b]})                                 # the way to add one
    a.grad, b.grad = tg.Tensor(np.ones(2)), tg.Tensor(np.ones(2))
    opt.step()
    assert a.data.tolist() == b.data.tolist() == [0.5, 0.5]


def test_an_optimizer_goes_through_pickle_and_deepcopy_and_steps_on_as_before():
    """pickle.loads(pickle.dumps(AdamW(...))) failed: pickle filled the group dict before its attributes."""
    a = leaf(1.0, -2.0, 3.0)
    opt = optim.AdamW([a], lr=0.1, weight_decay=0.5)
    a.grad = tg.Tensor(np.array([0.5, -1.0, 2.0]))
    opt.step()
    for copied in (pickle.loads(pickle.dumps(opt)), copy.deepcopy(opt)):
        twin = copied.param_groups[0]["params"][0]
        assert twin is not a and twin.data.tolist() == a.data.tolist()
        with pytest.raises(ValueError, match=r"lr must be a finite number >= 0, got -1"):   # still checked
            copied.param_groups[0]["lr"] = -1
        with pytest.raises(TypeError, match="cannot be changed in place"):
            copied.param_groups[0]["params"].append(leaf(0.0))
        twin.grad = tg.Tensor(np.array([0.5, -1.0, 2.0]))
        copied.step()
        assert copied.state["param.0"]["step"] == 2
    a.grad = tg.Tensor(np.array([0.5, -1.0, 2.0]))
    opt.step()
    assert twin.data.tolist() == a.data.tolist()


def test_decoupled_weight_decay_as_each_adam_decays():
    """A group copied from torch's AdamW holds decoupled_weight_decay=True and was refused ('only False'), while
    AdamW(decoupled_weight_decay=False) was taken and still decayed decoupled."""
    a = leaf(1.0)
    assert optim.AdamW([{"params": [a], "decoupled_weight_decay": True}]).param_groups[0]["decoupled_weight_decay"]
    optim.Adam([a], decoupled_weight_decay=False)
    with pytest.raises(ValueError, match=r"decoupled_weight_decay=False is not how AdamW decays .* use Adam"):
        optim.AdamW([a], decoupled_weight_decay=False)
    with pytest.raises(ValueError, match=r"decoupled_weight_decay=True is not how Adam decays .* use AdamW"):
        optim.Adam([a], decoupled_weight_decay=True)
    torch = pytest.importorskip("torch")
    group = dict(torch.optim.AdamW([torch.zeros(1, requires_grad=True)], lr=0.1).param_groups[0], params=[a])
    assert optim.AdamW([group]).param_groups[0]["lr"] == 0.1


def test_params_that_are_not_parameters_are_named_and_one_tensor_is_a_group():
    """SGD(None) and Adam(5) said "'NoneType' object is not iterable"; {"params": tensor} was refused where torch
    takes it as one parameter (a lone tensor as the whole params stays refused, as in torch)."""
    for params in (None, 5):
        with pytest.raises(TypeError, match=rf"SGD: params must be a VarMap, .* got {params!r}"):
            optim.SGD(params, lr=0.1)
    a = leaf(1.0)
    assert optim.Adam([{"params": a, "lr": 0.1}]).param_groups[0]["params"] == [a]
    with pytest.raises(TypeError, match="got one Tensor; pass it in a list"):
        optim.Adam(a)


def test_a_read_only_gradient_is_found_before_any_is_scaled_or_zeroed():
    """clip_grad_norm_ scaled the gradients before a broadcast view's, then failed in mul_ naming none; zero_grad
    (set_to_none=False) the same."""
    a, b = leaf(0.0, 0.0, 0.0), leaf(0.0, 0.0, 0.0)
    a.grad, b.grad = tg.Tensor(np.full(3, 10.0)), tg.Tensor(np.broadcast_to(np.ones(1), (3,)))
    with pytest.raises(ValueError, match=r"clip_grad_norm_: the gradient of param.1 is a read-only array"):
        optim.clip_grad_norm_([a, b], 1.0)
    with pytest.raises(ValueError, match=r"SGD.zero_grad: the gradient of param.1 is a read-only array"):
        optim.SGD([a, b], lr=0.1).zero_grad(set_to_none=False)
    assert a.grad.data.tolist() == [10.0] * 3
    assert optim.clip_grad_norm_([a, b], 100.0, foreach=None) == pytest.approx(np.sqrt(303))  # no scaling: no write
    with pytest.raises(ValueError, match=r"foreach=True is not supported"):
        optim.clip_grad_norm_([a], 1.0, foreach=True)
