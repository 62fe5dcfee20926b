"""Adam and AdamW: one update rule, weight decay coupled (Adam, L2 in the gradient) or decoupled (AdamW).
PyTorch's defaults and formulas (torch.optim.Adam / AdamW, single-tensor path):

    Adam:   g <- g + wd * p                    AdamW:  p <- p * (1 - lr * wd)
    m <- m + (1 - b1) (g - m);   v <- b2 v + (1 - b2) g^2
    p <- p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)

lr, betas, eps and weight_decay are per parameter group (torch's keys: group["betas"] is the pair); a state
dict saves betas as beta1, beta2. torch's amsgrad, maximize, capturable and differentiable are not implemented
(a group asking for them is refused).

With fused=True (the default; torch's flag of the same name) a float32 / float64 parameter is updated by one
numba pass (fast/adam_kernel.py), the same bits as the NumPy code of `_update_reference`, the reference that
fused=False runs.
"""
from __future__ import annotations

import math

import numpy as np

from ..fast import adam_kernel
from .optimizer import Optimizer, hparam_problem


class Adam(Optimizer):
    hparam_names = ("lr", "beta1", "beta2", "eps", "weight_decay")
    slot_names = ("exp_avg", "exp_avg_sq")
    nonnegative_slots = ("exp_avg_sq",)
    decoupled_weight_decay = False

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
                 *, fused: bool | None = True, **torch_options):
        who = type(self).__name__
        if fused is None:                                               # torch's default: its choice, ours True
            fused = True
        if not isinstance(fused, bool):
            raise TypeError(f"{who}: fused must be True or False, got {fused!r}")
        self.fused = fused
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay), torch_options)

    def _check_hparam(self, key, value):
        if key == "decoupled_weight_decay":     # a group copied from torch's AdamW holds True, from its Adam False
            if value not in (None, self.decoupled_weight_decay):
                raise ValueError(f"decoupled_weight_decay={value!r} is not how {type(self).__name__} decays (torch's "
                                 f"option); use {'Adam' if self.decoupled_weight_decay else 'AdamW'} for that")
            return value
        if key != "betas":
            return super()._check_hparam(key, value)
        try:  # torch's rule: each in [0, 1), and finite
            beta1, beta2 = value
        except (TypeError, ValueError):
            raise ValueError(f"betas must be a pair (beta1, beta2), each in [0, 1), got {value!r}") from None
        bad = hparam_problem("beta1", beta1) or hparam_problem("beta2", beta2)
        if bad is not None:
            raise ValueError(f"{bad} (betas={value!r})")
        return float(beta1), float(beta2)

    @property
    def beta1(self) -> float:
        return self.betas[0]

    @beta1.setter
    def beta1(self, value):
        self._set_beta(0, value)

    @property
    def beta2(self) -> float:
        return self.betas[1]

    @beta2.setter
    def beta2(self, value):
        self._set_beta(1, value)

    def _set_beta(self, i: int, value):  # each group keeps its other beta; all checked before any is set
        try:
            pairs = [self._check_hparam("betas", [value if j == i else b for j, b in enumerate(g["betas"])])
                     for g in self.param_groups]
        except ValueError as e:
            raise ValueError(f"{type(self).__name__}: {e}") from None
        for group, pair in zip(self.param_groups, pairs):
            dict.__setitem__(group, "betas", pair)

    def _flat_hparams(self, group):
        return {"lr": group["lr"], "beta1": group["betas"][0], "beta2": group["betas"][1], "eps": group["eps"],
                "weight_decay": group["weight_decay"]}

    def _group_hparams(self, flat):
        rest = {k: v for k, v in flat.items() if k not in ("beta1", "beta2")}
        return {**rest, "betas": (flat["beta1"], flat["beta2"])}

    def _update(self, param, grad, state, group):
        p, m, v = param.data, state["exp_avg"], state["exp_avg_sq"]
        (beta1, beta2), lr, eps, wd = group["betas"], group["lr"], group["eps"], group["weight_decay"]
        if self.fused and adam_kernel.takes(p, m, v, grad):
            adam_kernel.adam_update(p, m, v, grad, int(state["step"]), lr, beta1, beta2, eps, wd,
                                    self.decoupled_weight_decay)
        else:
            self._update_reference(p, grad, m, v, int(state["step"]), lr, beta1, beta2, eps, wd)

    def _update_reference(self, p, grad, m, v, t: int, lr, beta1, beta2, eps, weight_decay):
        if weight_decay:
            if self.decoupled_weight_decay:
                p *= 1 - lr * weight_decay
            else:
                grad = grad + weight_decay * p
        weight, rest = lerp_weights(1 - beta1, p.dtype)  # torch: exp_avg.lerp_(grad, 1 - beta1)
        if weight < 0.5:
            m += weight * (grad - m)
        else:                                           # from the end: beta1 = 0 gives exp_avg = grad exactly
            m[...] = grad - (grad - m) * rest
        v *= beta2
        v += (1 - beta2) * grad * grad
        step_size = lr / (1 - beta1 ** t)
        denom = np.sqrt(v) / math.sqrt(1 - beta2 ** t) + eps
        p -= step_size * (m / denom)


def lerp_weights(weight: float, dtype) -> tuple:
    """torch's lerp(start, end, w) in `dtype`: start + w (end - start) for w < 0.5, end - (end - start)(1 - w)
    above, so that w = 1 gives end exactly (start + 1 (end - start) loses an end much smaller than start: Adam
    with beta1 = 0 lost a small gradient after a large one). Returns w and 1 - w, each in `dtype`."""
    one = np.dtype(dtype).type(1)
    weight = np.dtype(dtype).type(weight)
    return weight, one - weight


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter), default weight_decay 1e-2."""

    decoupled_weight_decay = True

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 1e-2,
                 *, fused: bool | None = True, **torch_options):
        super().__init__(params, lr, betas, eps, weight_decay, fused=fused, **torch_options)
