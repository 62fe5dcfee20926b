"""The optimizer base: parameters by name, per-parameter state by name, safetensors-ready state dicts.

State is keyed by the parameter's registry name, so it saves beside the weights and loads into a
freshly built model: `state_dict()` is a flat dict str -> ndarray

    "hparams/lr", "hparams/weight_decay", ...          0-d float64 arrays
    "state/<param name>/<slot>"                         e.g. "state/layers.0.mixer.A_log/exp_avg"
    "state/<param name>/step"                           0-d int64 (steps this parameter was updated)

so `safetensors_io.save_file(path, opt.state_dict())` writes it as is and a resumed run continues bit for bit.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from ..autograd.tensor import Tensor, no_grad


def named_parameters(params, who: str) -> list[tuple[str, Tensor]]:
    """VarMap, [(name, tensor)] or [tensor] -> [(name, tensor)]. Bare tensors are named "param.<i>".
    A frozen parameter (requires_grad False) is accepted, as torch.optim accepts it: it gets no gradient, so
    step() skips it until it is unfrozen."""
    if isinstance(params, Tensor):  # iterating it would walk its rows
        raise TypeError(f"{who}: params must be a VarMap, (name, Tensor) pairs or Tensors, got one Tensor; "
                        f"pass it in a list: [tensor]")
    if hasattr(params, "named_vars"):
        params = params.named_vars()
    params = list(params)
    named = []
    for i, p in enumerate(params):
        name, tensor = p if isinstance(p, tuple) else (f"param.{i}", p)
        if not isinstance(tensor, Tensor) or not isinstance(name, str):
            raise TypeError(f"{who}: params must be a VarMap, (name, Tensor) pairs or Tensors; item {i} is {p!r:.80}")
        if not tensor.is_leaf:
            raise ValueError(f"{who}: parameter {name!r} is the result of an op, not a leaf tensor: pass the "
                             f"leaves it was computed from (torch: can't optimize a non-leaf Tensor)")
        named.append((name, tensor))
    names = [n for n, _ in named]
    if len(set(names)) != len(names):
        raise ValueError(f"{who}: duplicate parameter names {sorted({n for n in names if names.count(n) > 1})}")
    if len({id(t) for _, t in named}) != len(named):
        raise ValueError(f"{who}: the same tensor is given twice under different names")
    return named


# hyper-parameter -> (lowest allowed, the upper bound, excluded; None: none), the rules of torch.optim; every
# one must also be finite (torch accepts lr=nan or eps=nan and then writes NaN into every weight)
HPARAM_RANGES = {"lr": (0.0, None), "eps": (0.0, None), "weight_decay": (0.0, None), "beta1": (0.0, 1.0),
                 "beta2": (0.0, 1.0), "momentum": (0.0, None), "dampening": (0.0, None)}


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


class Optimizer:
    """Subclasses set `hparam_names` and implement `_update(param, grad, state)`, which updates the param's
    array (param.data) and its state (name -> ndarray) in place. Every hyper-parameter is checked whenever
    it is set (at construction, `opt.lr = ...` by a schedule, load_state_dict): a ValueError names the
    optimizer, the argument and the value."""

    hparam_names: tuple = ("lr",)
    slot_names: tuple = ()
    nonnegative_slots: tuple = ()  # slots that can never be negative (Adam's exp_avg_sq): checked on load

    def __init__(self, params, lr: float):
        self.params = named_parameters(params, type(self).__name__)
        if not self.params:
            raise ValueError(f"{type(self).__name__}: got an empty parameter list")
        self.lr = lr
        self.state: dict[str, dict[str, np.ndarray]] = {}

    def __setattr__(self, name, value):
        if name in HPARAM_RANGES:
            bad = hparam_problem(name, value)
            if bad is not None:
                raise ValueError(f"{type(self).__name__}: {bad}")
            value = float(value)
        object.__setattr__(self, name, value)

    def zero_grad(self, set_to_none: bool = True):
        """Forget the gradients (backward accumulates into .grad)."""
        for _, p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def step(self):
        """Update every parameter that has a gradient; parameters without one are skipped (as torch)."""
        with no_grad():
            for name, p in self.params:
                if p.grad is None:
                    continue
                grad = p.grad.data
                state = self.state.setdefault(name, {})
                if "step" not in state:
                    state.update({slot: np.zeros_like(p.data) for slot in self.slot_names})
                    state["step"] = np.array(0, dtype=np.int64)
                state["step"] = np.array(state["step"] + 1, dtype=np.int64)  # stays an ndarray (safetensors)
                self._update(p, grad, state)
                p._bump()  # the update wrote into p.data: a graph that saved the old value must not backward

    def _update(self, param: Tensor, grad: np.ndarray, state: dict):  # pragma: no cover
        raise NotImplementedError

    # --- state ------------------------------------------------------------------------------------------
    def _hparams(self) -> dict[str, float]:
        return {k: float(getattr(self, k)) for k in self.hparam_names}

    def state_dict(self) -> dict[str, np.ndarray]:
        out = {f"hparams/{k}": np.array(v, dtype=np.float64) for k, v in self._hparams().items()}
        for name, state in self.state.items():
            for slot, array in state.items():
                out[f"state/{name}/{slot}"] = array.copy()
        return out

    def load_state_dict(self, state_dict: dict):
        """Replace hyperparameters and state with a saved copy. Everything is checked first (unknown
        parameter names or slots, shapes, missing keys): on error nothing changes."""
        who = f"{type(self).__name__}.load_state_dict"
        shapes = {name: p.shape for name, p in self.params}
        dtypes = {name: p.dtype for name, p in self.params}
        hparams, state, problems = {}, {}, []
        for key, value in state_dict.items():
            value = np.asarray(value)
            kind, _, rest = key.partition("/")
            if kind == "hparams" and rest in self.hparam_names and value.shape != ():
                problems.append(f"{key!r}: must be 0-d (one number), got shape {value.shape}")
                continue
            if kind == "hparams" and rest in self.hparam_names:
                if value.dtype.kind not in "iuf":
                    problems.append(f"{key!r}: must be a number, got dtype {value.dtype}")
                    continue
                bad = hparam_problem(rest, float(value))
                if bad is not None:
                    problems.append(f"{key!r}: {bad}; the saved state is damaged, load another one")
                    continue
                hparams[rest] = float(value)
                continue
            name, _, slot = rest.rpartition("/")
            if kind != "state" or name not in shapes or slot not in (*self.slot_names, "step"):
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
        problems += [f"missing key 'hparams/{k}'" for k in self.hparam_names
                     if k not in hparams and f"hparams/{k}" not in state_dict]
        for name, slots in state.items():
            absent = [s for s in (*self.slot_names, "step") if s not in slots]
            if absent:
                problems.append(f"parameter {name!r}: missing {', '.join(absent)}")
        if problems:
            raise ValueError(f"{who}: the state does not fit this optimizer's parameters:\n  " + "\n  ".join(problems))
        for k, v in hparams.items():
            setattr(self, k, v)
        self.state = {name: {slot: np.array(v, dtype=np.int64 if slot == "step" else dtypes[name])
                             for slot, v in slots.items()} for name, slots in state.items()}

    def __repr__(self):
        hp = ", ".join(f"{k}={v:g}" for k, v in self._hparams().items())
        return f"{type(self).__name__}({len(self.params)} parameters, {hp})"

