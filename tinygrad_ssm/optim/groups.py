"""Parameter groups as torch.optim takes them: `params` is a VarMap, (name, Tensor) pairs, Tensors, or a list of
dicts {"params": <any of those>, "lr": ..., ...} whose keys override the optimizer's defaults for that group.

Each group of `Optimizer.param_groups` is a ParamGroup: a dict with "params" (the Tensors), "param_names" (their
registry names, the keys of the optimizer's state; torch >= 2.6 adds the same key for named parameters) and the
hyper-parameters, each checked whenever it is set (a schedule writing group["lr"] gets the checks of `opt.lr`).
"""
from __future__ import annotations

import math
import numbers

from ..autograd.tensor import Tensor

# hyper-parameter -> (lowest allowed, the upper bound, excluded; None: none), the rules of torch.optim; every
# one must also be finite (torch accepts lr=nan or eps=nan and then writes NaN into every weight)
HPARAM_RANGES = {"lr": (0.0, None), "eps": (0.0, None), "weight_decay": (0.0, None), "beta1": (0.0, 1.0),
                 "beta2": (0.0, 1.0), "momentum": (0.0, None), "dampening": (0.0, None)}

# torch.optim's per-group switches that these optimizers do not implement: False / None (torch's defaults, as
# in a group copied from a torch optimizer) is accepted and kept, anything else refused rather than ignored
UNSUPPORTED_SWITCHES = ("amsgrad", "maximize", "foreach", "capturable", "differentiable", "fused",
                        "decoupled_weight_decay")


def hparam_problem(name: str, value) -> str | None:
    """Why `value` is not a valid `name` (a sentence naming both), or None."""
    low, high = HPARAM_RANGES.get(name, (None, None))
    interval = ">= 0" if high is None else f"in [{low:g}, {high:g})"
    try:
        finite = not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(float(value))
    except OverflowError:  # an int too large for a float
        finite = False
    if not finite or (low is not None and value < low) or (high is not None and value >= high):
        return f"{name} must be a finite number {interval}, got {value!r}"
    return None


def named_parameters(params, who: str, first_index: int = 0, leaves_only: bool = True) -> list[tuple[str, Tensor]]:
    """VarMap, [(name, tensor)] or [tensor] -> [(name, tensor)]. Bare tensors are named "param.<i>", i counted
    from `first_index` (an optimizer numbers them across its groups, as torch's state_dict does). leaves_only
    False: a tensor that is an op's result is taken too (clip_grad_norm_ scales any .grad, a retain_grad one's).
    A frozen parameter (requires_grad False) is accepted, as torch.optim accepts it: it gets no gradient, so
    step() skips it until it is unfrozen."""
    if isinstance(params, Tensor):  # iterating it would walk its rows
        raise TypeError(f"{who}: params must be a VarMap, (name, Tensor) pairs or Tensors, got one Tensor; "
                        f"pass it in a list: [tensor]")
    if hasattr(params, "named_vars"):
        params = params.named_vars()
    try:
        params = list(params)
    except TypeError:  # None, a number: "'NoneType' object is not iterable" named nothing
        raise TypeError(f"{who}: params must be a VarMap, (name, Tensor) pairs or Tensors, got {params!r:.80}") \
            from None
    named = []
    for i, p in enumerate(params):
        name, tensor = p if isinstance(p, tuple) else (f"param.{first_index + i}", p)
        if not isinstance(tensor, Tensor) or not isinstance(name, str):
            raise TypeError(f"{who}: params must be a VarMap, (name, Tensor) pairs or Tensors; item {i} is {p!r:.80}")
        if leaves_only and not tensor.is_leaf:
            raise ValueError(f"{who}: parameter {name!r} is the result of an op, not a leaf tensor: pass the "
                             f"leaves it was computed from (torch: can't optimize a non-leaf Tensor)")
        named.append((name, tensor))
    names = [n for n, _ in named]
    if len(set(names)) != len(names):
        raise ValueError(f"{who}: duplicate parameter names {sorted({n for n in names if names.count(n) > 1})}")
    if len({id(t) for _, t in named}) != len(named):
        raise ValueError(f"{who}: the same tensor is given twice under different names")
    return named


def split_groups(params, who: str) -> list[dict]:
    """The constructor's `params` as a list of group dicts (one group unless it is a list of dicts)."""
    if isinstance(params, dict):  # torch refuses a lone dict too: it would be iterated as its keys
        raise TypeError(f"{who}: params must be a list of parameter groups, got one dict; pass it in a list: [group]")
    if isinstance(params, Tensor):  # torch refuses one tensor here (and takes it as a group's "params")
        raise TypeError(f"{who}: params must be a VarMap, (name, Tensor) pairs or Tensors, got one Tensor; "
                        f"pass it in a list: [tensor]")
    if hasattr(params, "named_vars"):
        return [{"params": params}]
    try:
        params = list(params)
    except TypeError:  # None, a number: "'NoneType' object is not iterable" named nothing
        raise TypeError(f"{who}: params must be a VarMap, (name, Tensor) pairs, Tensors or a list of parameter "
                        f"groups, got {params!r:.80}") from None
    kinds = {isinstance(p, dict) for p in params}
    if kinds == {True}:
        return params
    if True in kinds:
        raise TypeError(f"{who}: params mixes parameter groups (dicts) with parameters; put every parameter in "
                        f"a group: [{{'params': [...]}}, {{'params': [...], 'lr': ...}}]")
    return [{"params": params}]


class FixedList(list):
    """A group's "params" and "param_names": read as lists, never changed in place. The two are paired by position
    and the state is keyed by name, so a tensor appended to "params" was never updated, and one removed gave the
    next its name and its Adam moments (an audit against torch, whose state is keyed by the tensor)."""

    def _refuse(self, *args, **kwargs):
        raise TypeError("a parameter group's 'params' and 'param_names' cannot be changed in place: the optimizer's "
                        "state is keyed by these parameters; add parameters with add_param_group, or build a new "
                        "optimizer")

    append = extend = insert = remove = pop = clear = sort = reverse = _refuse
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse

    def __reduce__(self):  # pickle and deepcopy: made whole by the constructor, not by append
        return FixedList, (list(self),)


def _restored_group(where: str, check, items: dict) -> ParamGroup:
    group = ParamGroup(where, check)
    for key, value in items.items():
        dict.__setitem__(group, key, value)      # as they were checked when set
    return group


class ParamGroup(dict):
    """One entry of Optimizer.param_groups. Setting a hyper-parameter checks it with the optimizer's rules
    (`check(key, value)` returns the value as kept, or raises ValueError with the reason); "params" and
    "param_names" are fixed once set (add parameters with add_param_group)."""

    def __init__(self, where: str, check):
        super().__init__()
        self._where, self._check = where, check

    def __setitem__(self, key, value):
        if key in ("params", "param_names") and key in self:
            raise ValueError(f"{self._where}[{key!r}] cannot be replaced: the optimizer's state is keyed by these "
                             f"parameters; add parameters with add_param_group, or build a new optimizer")
        if key in ("params", "param_names"):
            value = FixedList(value)
        else:
            try:
                value = self._check(key, value)
            except ValueError as e:
                raise ValueError(f"{self._where}: {e}") from None
        super().__setitem__(key, value)

    def __reduce__(self):  # pickle filled the dict before its attributes, so __setitem__ found no _check
        return _restored_group, (self._where, self._check, dict(self))

    def update(self, *args, **kwargs):  # dict.update would skip __setitem__'s checks
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def setdefault(self, key, default=None):
        if key not in self:
            self[key] = default
        return self[key]
