"""Adam and AdamW: one update rule, weight decay coupled (Adam, L2 in the gradient) or decoupled (AdamW).
PyTorch's defaults and formulas (torch.optim.Adam / AdamW, single-tensor path):

    Adam:   g <- g + wd * p                    AdamW:  p <- p * (1 - lr * wd)
    m <- m + (1 - b1) (g - m);   v <- b2 v + (1 - b2) g^2
    p <- p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)

With fused=True (the default; torch's flag of the same name) a float32 / float64 parameter is updated by one
numba pass (fast/adam_kernel.py), the same bits as the NumPy code of `_update_reference`, the reference that
fused=False runs.
"""
from __future__ import annotations

import math

import numpy as np

from ..fast import adam_kernel
from .optimizer import Optimizer


class Adam(Optimizer):
    hparam_names = ("lr", "beta1", "beta2", "eps", "weight_decay")
    slot_names = ("exp_avg", "exp_avg_sq")
    nonnegative_slots = ("exp_avg_sq",)
    decoupled_weight_decay = False

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
                 *, fused: bool = True):
        super().__init__(params, lr)
        who = type(self).__name__
        if not isinstance(fused, bool):
            raise TypeError(f"{who}: fused must be True or False, got {fused!r}")
        self.fused = fused
        try:  # each checked on assignment (Optimizer.__setattr__): finite, betas in [0, 1), eps, wd >= 0
            beta1, beta2 = betas
        except (TypeError, ValueError):
            raise ValueError(f"{who}: betas must be a pair (beta1, beta2), each in [0, 1), got {betas!r}") from None
        try:
            self.beta1, self.beta2 = beta1, beta2
        except ValueError as e:
            raise ValueError(f"{e} (betas={betas!r})") from None
        self.eps, self.weight_decay = eps, weight_decay

    @property
    def betas(self) -> tuple[float, float]:
        return self.beta1, self.beta2

    def _update(self, param, grad, state):
        p, m, v = param.data, state["exp_avg"], state["exp_avg_sq"]
        if self.fused and adam_kernel.takes(p, m, v, grad):
            adam_kernel.adam_update(p, m, v, grad, int(state["step"]), self.lr, self.beta1, self.beta2, self.eps,
                                    self.weight_decay, self.decoupled_weight_decay)
        else:
            self._update_reference(p, grad, m, v, int(state["step"]))

    def _update_reference(self, p, grad, m, v, t: int):
        if self.weight_decay:
            if self.decoupled_weight_decay:
                p *= 1 - self.lr * self.weight_decay
            else:
                grad = grad + self.weight_decay * p
        m += (1 - self.beta1) * (grad - m)                    # torch: exp_avg.lerp_(grad, 1 - beta1)
        v *= self.beta2
        v += (1 - self.beta2) * grad * grad
        step_size = self.lr / (1 - self.beta1 ** t)
        denom = np.sqrt(v) / math.sqrt(1 - self.beta2 ** t) + self.eps
        p -= step_size * (m / denom)


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter), default weight_decay 1e-2."""

    decoupled_weight_decay = True

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 1e-2,
                 *, fused: bool = True):
        super().__init__(params, lr, betas, eps, weight_decay, fused=fused)
