"""The optimizer base: parameter groups as torch.optim's, per-parameter state by name, safetensors-ready state dicts.

`params` is a VarMap, (name, Tensor) pairs, Tensors, or a list of groups {"params": ..., "lr": ..., ...} (groups.py);
`param_groups` is the list of those groups, each a dict whose hyper-parameters a schedule or the user may change
between steps (step() reads them from the group). `opt.lr = x` sets every group's lr; `opt.lr` reads it while
all groups agree.

State is keyed by the parameter's registry name, so it saves beside the weights and loads into a
freshly built model: `state_dict()` is a flat dict str -> ndarray

    "hparams/<group>/lr", "hparams/<group>/weight_decay", ...   0-d float64 arrays; group = 0, 1, ... as in
                                                                param_groups (Adam's betas as beta1, beta2)
    "state/<param name>/<slot>"                         e.g. "state/layers.0.mixer.A_log/exp_avg"
    "state/<param name>/step"                           0-d int64 (steps this parameter was updated)
    "extra/<group>/<key>"                               a group's other numbers (a schedule's "initial_lr")

so `tinygrad_ssm.io.safetensors.save_file(path, opt.state_dict())` writes it as is and a resumed run continues bit
for bit. Hyper-parameters are matched to groups by index (as torch's), state to parameters by name: which group a
parameter is in is the loading optimizer's. A state saved before parameter groups ("hparams/lr": one group, no
index) loads into an optimizer with one group.
"""
from __future__ import annotations

import difflib
import numbers
from collections.abc import Iterator

import numpy as np

from ..autograd.backward import zero_grads
from ..autograd.tensor import Tensor, no_grad
from .groups import HPARAM_RANGES, UNSUPPORTED_SWITCHES, ParamGroup, hparam_problem, named_parameters, split_groups

__all__ = ["HPARAM_RANGES", "Optimizer", "hparam_problem", "named_parameters"]


class Optimizer:
    """Subclasses set `hparam_names` (the numbers a state dict saves per group) and implement
    `_update(param, grad, state, group)`, which updates the param's array (param.data) and its state (name ->
    ndarray) in place with the group's hyper-parameters. Every hyper-parameter is checked whenever it is set (at
    construction, `opt.lr = ...` or `group["lr"] = ...` by a schedule, add_param_group, load_state_dict): a
    ValueError names the optimizer, the group, the argument and the value."""

    hparam_names: tuple = ("lr",)
    slot_names: tuple = ()
    nonnegative_slots: tuple = ()  # slots that can never be negative (Adam's exp_avg_sq): checked on load
    optional_slots: tuple = ()     # slots a state may lack (SGD's buffer before momentum's first step)

    def __init__(self, params, defaults: dict, torch_options: dict | None = None):
        """torch_options: torch.optim's keyword switches these optimizers do not implement (amsgrad, maximize,
        foreach, ...), as a call ported from torch passes them: their neutral False / None taken, anything else
        refused by name, and an unknown keyword named with the ones there are."""
        who = type(self).__name__
        for key, value in (torch_options or {}).items():
            if key not in UNSUPPORTED_SWITCHES:
                raise TypeError(f"{who}: unexpected keyword argument {key!r} (its arguments: params, "
                                f"{', '.join(defaults)}; torch's switches {', '.join(UNSUPPORTED_SWITCHES)} as False)")
            try:
                self._check_hparam(key, value)
            except ValueError as e:
                raise ValueError(f"{who}: {e}") from None
        checked = {}
        for key, value in defaults.items():
            try:
                checked[key] = self._check_hparam(key, value)
            except ValueError as e:
                raise ValueError(f"{who}: {e}") from None
        self._check_group(checked, who)
        object.__setattr__(self, "defaults", checked)
        self.param_groups: list[ParamGroup] = []
        self.state: dict[str, dict[str, np.ndarray]] = {}
        for group in split_groups(params, who):
            self.add_param_group(group)
        if not any(g["params"] for g in self.param_groups):
            used_up = isinstance(params, Iterator)  # a generator read before, e.g. by another optimizer
            raise ValueError(f"{who}: got an empty parameter list" + (" (from an iterator: a generator of "
                             "parameters is used up by the first call that reads it; pass list(...) of them, made "
                             "once)" if used_up else ""))

    # --- groups -----------------------------------------------------------------------------------------
    def add_param_group(self, param_group: dict):
        """Add a group {"params": ..., hyper-parameter: value, ...}; what it leaves out is the optimizer's
        default. A parameter already in a group (the same tensor, or the same name) is refused, as in torch."""
        index = len(self.param_groups)
        where = f"{type(self).__name__}.param_groups[{index}]"
        if not isinstance(param_group, dict) or "params" not in param_group:
            raise TypeError(f"{where}: a parameter group is a dict with a 'params' key, got {param_group!r:.80}")
        params = param_group["params"]
        if isinstance(params, Tensor):  # {"params": tensor}: one parameter, as torch takes it
            params = [params]
        if "param_names" in param_group:  # a group written as torch writes named ones: names beside tensors
            names, params = list(param_group["param_names"]), list(params)
            if len(names) != len(params):
                raise ValueError(f"{where}: {len(names)} param_names for {len(params)} params; give one name each")
            params = list(zip(names, params))
        named = named_parameters(params, where, sum(len(g["params"]) for g in self.param_groups))
        owner = {id(p): (i, n) for i, g in enumerate(self.param_groups) for n, p in zip(g["param_names"], g["params"])}
        names = {n: i for i, g in enumerate(self.param_groups) for n in g["param_names"]}
        for name, p in named:
            if id(p) in owner:
                i, first = owner[id(p)]
                raise ValueError(f"{where}: parameter {name!r} is already in param_groups[{i}] (as {first!r}); a "
                                 f"parameter can be in one group only (torch: some parameters appear in more than "
                                 f"one parameter group)")
            if name in names:
                raise ValueError(f"{where}: the name {name!r} is already used in param_groups[{names[name]}]; the "
                                 f"state is keyed by name, so each parameter needs its own")
        known = (*self.defaults, *UNSUPPORTED_SWITCHES, "initial_lr")   # initial_lr: torch's schedulers add it
        for key in param_group:                 # a user's own key is kept (as torch keeps it), a misspelling is not
            near = difflib.get_close_matches(str(key), known, n=1, cutoff=0.8) if key not in known else []
            if near and key not in ("params", "param_names"):
                raise ValueError(f"{where}: unknown key {key!r}; did you mean {near[0]!r}? (a group's other keys "
                                 f"are kept but never read: this one would leave {near[0]} at its default)")
        group = ParamGroup(where, self._check_hparam)
        group["params"], group["param_names"] = [p for _, p in named], [n for n, _ in named]
        for key, value in param_group.items():
            if key not in ("params", "param_names"):
                group[key] = value  # checked
        for key, value in self.defaults.items():
            if key not in group:
                dict.__setitem__(group, key, value)  # checked at construction
        self._check_group(group, where)
        self.param_groups.append(group)

    def _check_hparam(self, key, value):
        """`value` as a group keeps it; ValueError with the reason when it is not a valid `key`."""
        if key in HPARAM_RANGES:
            bad = hparam_problem(key, value)
            if bad is not None:
                raise ValueError(bad)
            return float(value)
        if key in UNSUPPORTED_SWITCHES and value not in (False, None):
            raise ValueError(f"{key}={value!r} is not supported by this {type(self).__name__} (torch's option; "
                             f"only False); leave it out")
        return value

    def _check_group(self, group: dict, where: str) -> None:
        """Checks across a group's hyper-parameters (SGD: nesterov needs momentum)."""

    def _slots(self, group: dict) -> tuple:
        return self.slot_names

    @property
    def params(self) -> list[tuple[str, Tensor]]:
        """Every (name, parameter) of every group, in order."""
        return [(n, p) for g in self.param_groups for n, p in zip(g["param_names"], g["params"])]

    def __getattr__(self, name):  # only when the attribute is not found: a hyper-parameter all groups share
        prop = getattr(type(self), name, None)
        if isinstance(prop, property):  # the property raised AttributeError (Adam's beta1 when the groups differ in
            return prop.fget(self)      # betas): Python then comes here; run it again so its own message is seen
        defaults = self.__dict__.get("defaults")
        if defaults is None or name not in defaults:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return self._shared(name)

    def _shared(self, key):
        values = [g[key] for g in self.__dict__.get("param_groups") or [self.defaults]]
        if any(v != values[0] for v in values):
            raise AttributeError(f"{type(self).__name__}: the parameter groups differ in {key} ({values}); read "
                                 f"optimizer.param_groups[i][{key!r}]")
        return values[0]

    def __setattr__(self, name, value):  # a hyper-parameter set on the optimizer: every group's, checked
        if name in self.__dict__.get("defaults", ()) and "param_groups" in self.__dict__:
            try:
                value = self._check_hparam(name, value)
            except ValueError as e:
                raise ValueError(f"{type(self).__name__}: {e}") from None
            for group in self.param_groups:
                dict.__setitem__(group, name, value)
            return
        object.__setattr__(self, name, value)

    # --- steps ------------------------------------------------------------------------------------------
    def zero_grad(self, set_to_none: bool = True):
        """Forget the gradients (backward accumulates into .grad)."""
        zero_grads(self.params, set_to_none, f"{type(self).__name__}.zero_grad")

    def step(self):
        """Update every parameter that has a gradient with its group's hyper-parameters as they are now;
        parameters without one are skipped (as torch)."""
        self._check_state_shapes()
        self._check_writable()
        with no_grad():
            for group in self.param_groups:
                for name, p in zip(group["param_names"], group["params"]):
                    if p.grad is None:
                        continue
                    state = self.state.setdefault(name, {})
                    if "step" not in state:
                        state.update({slot: np.zeros_like(p.data) for slot in self._slots(group)})
                        state["step"] = np.array(0, dtype=np.int64)
                    state["step"] = np.array(state["step"] + 1, dtype=np.int64)  # stays an ndarray (safetensors)
                    self._update(p, p.grad.data, state, group)
                    p._bump()  # the update wrote into p.data: a graph that saved the old value must not backward

    def _check_state_shapes(self):
        """Every state array (exp_avg, a momentum buffer, ...) still has its parameter's shape: a parameter whose
        .data was replaced by a larger array after the first step made the fused Adam kernel read and write past
        the state's end (a crash, or wrong updates); torch fails there with a size mismatch too. Checked for every
        parameter before any is updated."""
        for name, p in self.params:
            for slot, value in self.state.get(name, {}).items():
                stale = isinstance(value, np.ndarray) and (value.shape, value.dtype) != (p.shape, p.dtype)
                if slot != "step" and stale:
                    raise RuntimeError(f"{type(self).__name__}.step: parameter {name!r} is {p.shape} {p.dtype} but "
                                       f"its {slot} {value.shape} {value.dtype}: its .data was replaced by an array "
                                       f"of another shape or dtype after the optimizer's first step (a float32 state "
                                       f"would round a float64 model's updates); nothing was updated: make a new "
                                       f"optimizer for it")

    def _check_writable(self):
        """Every parameter to be updated can be written: a read-only array (a memory-mapped file opened read-only,
        np.broadcast_to) failed inside NumPy half-way through a step, the parameters before it updated, its own
        state advanced without it. Checked for every parameter before any is updated."""
        for name, p in self.params:
            if p.grad is not None and not p.data.flags.writeable:
                raise ValueError(f"{type(self).__name__}.step: parameter {name!r} holds a read-only array (a "
                                 f"read-only memory map or a broadcast view?); nothing was updated: give it a "
                                 f"writable copy first, e.g. p.data = p.data.copy()")

    def _update(self, param: Tensor, grad: np.ndarray, state: dict, group: dict):  # pragma: no cover
        raise NotImplementedError

    # --- state ------------------------------------------------------------------------------------------
    def _flat_hparams(self, group: dict) -> dict[str, float]:
        """A group's hyper-parameters as the numbers a state dict saves (hparam_names)."""
        return {k: float(group[k]) for k in self.hparam_names}

    def _group_hparams(self, flat: dict[str, float]) -> dict:
        """The inverse of _flat_hparams: saved numbers -> a group's keys."""
        return dict(flat)

    def _extra_keys(self, group: dict) -> dict:
        """A group's own numbers beside its hyper-parameters (a schedule's "initial_lr", as torch's LambdaLR
        writes it): a state dict keeps them as torch's does. Other values (a "name" string) are not numbers a
        safetensors file holds: the loading optimizer keeps its own."""
        return {k: v for k, v in group.items() if k not in ("params", "param_names") and k not in self.defaults
                and isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_))}

    def state_dict(self) -> dict[str, np.ndarray]:
        out = {f"hparams/{i}/{k}": np.array(v, dtype=np.float64)
               for i, group in enumerate(self.param_groups) for k, v in self._flat_hparams(group).items()}
        out.update({f"extra/{i}/{k}": np.array(v, dtype=np.int64 if isinstance(v, numbers.Integral) else np.float64)
                    for i, group in enumerate(self.param_groups) for k, v in self._extra_keys(group).items()})
        for name, state in self.state.items():
            for slot, array in state.items():
                out[f"state/{name}/{slot}"] = array.copy()
        return out

    def _load_hparams(self, state_dict: dict, problems: list) -> list[dict]:
        """The saved hyper-parameters of each group, checked; problems appended."""
        n = len(self.param_groups)
        hparams, seen = [{} for _ in range(n)], [set() for _ in range(n)]
        for key, value in state_dict.items():
            kind, _, rest = key.partition("/")
            index, _, name = rest.rpartition("/")
            if kind != "hparams":
                continue
            if index == "" and n != 1:
                problems.append(f"{key!r}: saved by an optimizer with one parameter group (no group index), but "
                                f"this one has {n}: load it into one with a single group")
                continue
            if index != "" and not (index.isdigit() and int(index) < n):
                problems.append(f"unexpected key {key!r}: this optimizer has {n} parameter group(s), "
                                f"'hparams/0/...' to 'hparams/{n - 1}/...'")
                continue
            group = int(index or 0)
            if name not in self.hparam_names:
                problems.append(f"unexpected key {key!r}")
                continue
            if name in seen[group]:
                problems.append(f"{key!r}: group {group}'s {name} is given twice ('hparams/{name}' and "
                                f"'hparams/{group}/{name}'); keep one")
                continue
            seen[group].add(name)
            value = np.asarray(value)
            if value.shape != ():
                problems.append(f"{key!r}: must be 0-d (one number), got shape {value.shape}")
            elif value.dtype.kind not in "iuf":
                problems.append(f"{key!r}: must be a number, got dtype {value.dtype}")
            elif hparam_problem(name, float(value)) is not None:
                problems.append(f"{key!r}: {hparam_problem(name, float(value))}; the saved state is damaged, "
                                f"load another one")
            else:
                hparams[group][name] = float(value)
        problems += [f"missing key 'hparams/{i}/{k}'" for i in range(n) for k in self.hparam_names if k not in seen[i]]
        return hparams

    def load_state_dict(self, state_dict: dict):
        """Replace hyperparameters and state with a saved copy. Everything is checked first (unknown
        parameter names, groups or slots, shapes, missing keys): on error nothing changes."""
        who = f"{type(self).__name__}.load_state_dict"
        if not isinstance(state_dict, dict):
            raise TypeError(f"{who}: state_dict must be a dict (what state_dict() returns, or load_file of its "
                            f"save), got {type(state_dict).__name__}")
        problems = []
        hparams = self._load_hparams(state_dict, problems)
        shapes = {name: p.shape for name, p in self.params}
        dtypes = {name: p.dtype for name, p in self.params}
        slots = {}  # each parameter's slots under the hyper-parameters being loaded (SGD: momentum's buffer)
        for i, group in enumerate(self.param_groups):
            loaded = {**group, **(self._group_hparams(hparams[i]) if len(hparams[i]) == len(self.hparam_names)
                                  else {})}
            slots.update({name: self._slots(loaded) for name in group["param_names"]})
        state, extras = {}, [{} for _ in self.param_groups]
        for key, value in state_dict.items():
            value = np.asarray(value)
            kind, _, rest = key.partition("/")
            if kind == "hparams":
                continue
            if kind == "extra":  # a group's own numbers (_extra_keys)
                index, _, name = rest.partition("/")
                if not (index.isdigit() and int(index) < len(extras)) or not name or name in self.defaults \
                        or name in ("params", "param_names"):
                    problems.append(f"unexpected key {key!r}")
                elif value.shape != () or value.dtype.kind not in "iuf":
                    problems.append(f"{key!r}: must be one number, got {value.dtype} {value.shape}")
                else:
                    number = int(value) if value.dtype.kind in "iu" else float(value)
                    try:  # checked now, as the group will check it: on error nothing changes
                        extras[int(index)][name] = self._check_hparam(name, number)
                    except ValueError as e:
                        problems.append(f"{key!r}: {e}")
                continue
            name, _, slot = rest.rpartition("/")
            # an optional slot is kept whatever the settings: SGD's buffer of a momentum since set to 0 (as torch)
            if kind != "state" or name not in shapes or slot not in (*slots[name], *self.optional_slots, "step"):
                problems.append(f"unexpected key {key!r}")
            elif slot == "step" and (value.shape != () or value.dtype.kind not in "iu"):
                problems.append(f"{key!r}: step must be a 0-d integer, got {value.dtype} {value.shape}")
            elif slot == "step" and not 0 <= int(value) <= np.iinfo(np.int64).max:
                problems.append(f"{key!r}: step must be >= 0 and fit int64, got {int(value)}")
            elif slot != "step" and value.shape != shapes[name]:
                problems.append(f"{key!r}: shape {value.shape} but the parameter has shape {shapes[name]}")
            elif slot != "step" and value.dtype.kind not in "iuf":
                problems.append(f"{key!r}: must be real numbers, got dtype {value.dtype}")
            else:
                if slot != "step":  # checked as it will be kept: float64 1e300 is finite, as float32 it is not
                    with np.errstate(over="ignore", invalid="ignore"):
                        value = value.astype(dtypes[name])
                if slot != "step" and not np.all(np.isfinite(value)):
                    problems.append(f"{key!r}: must be finite numbers in {dtypes[name]} (a step from it would "
                                    f"write NaN into the weights); the saved state is damaged, load another one")
                elif slot in self.nonnegative_slots and np.any(value < 0):
                    problems.append(f"{key!r}: must be >= 0 (a mean of squares); the saved state is damaged, "
                                    f"load another one")
                else:
                    state.setdefault(name, {})[slot] = value
        for name, got in state.items():
            absent = [s for s in (*slots[name], "step") if s not in got and s not in self.optional_slots]
            if absent:
                problems.append(f"parameter {name!r}: missing {', '.join(absent)}")
        if problems:
            raise ValueError(f"{who}: the state does not fit this optimizer's parameters:\n  " + "\n  ".join(problems))
        for group, values, extra in zip(self.param_groups, hparams, extras):
            for k, v in self._group_hparams(values).items():
                dict.__setitem__(group, k, v)  # each checked above
            group.update(extra)
        self.state = {name: {slot: np.array(v, dtype=np.int64 if slot == "step" else dtypes[name])
                             for slot, v in saved.items()} for name, saved in state.items()}

    def __repr__(self):
        groups = "; ".join(", ".join(f"{k}={v:g}" for k, v in self._flat_hparams(g).items())
                           for g in self.param_groups)
        return f"{type(self).__name__}({len(self.params)} parameters, {len(self.param_groups)} group(s): {groups})"
