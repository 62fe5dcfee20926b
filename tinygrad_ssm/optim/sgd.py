"""SGD with momentum (PyTorch's formula: the first step's buffer is the gradient itself)."""
from __future__ import annotations

import numpy as np

from .optimizer import Optimizer


class SGD(Optimizer):
    """g <- grad + weight_decay * p;  buf <- momentum * buf + (1 - dampening) * g  (buf = g on the first step);
    p <- p - lr * (g + momentum * buf if nesterov else buf)."""

    hparam_names = ("lr", "momentum", "dampening", "weight_decay")

    def __init__(self, params, lr: float, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False):
        super().__init__(params, lr)
        self.momentum, self.dampening, self.weight_decay = momentum, dampening, weight_decay  # checked: __setattr__
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("SGD: nesterov momentum requires a momentum and zero dampening")
        self.nesterov = nesterov

    @property
    def slot_names(self) -> tuple:  # the buffer exists once there is momentum (it may be set after construction)
        return ("momentum_buffer",) if self.momentum else ()

    def _update(self, param, grad, state):
        p = param.data
        if self.weight_decay:
            grad = grad + self.weight_decay * p
        if self.momentum:
            buf = state.get("momentum_buffer")
            if buf is None:  # momentum set after this parameter's first steps: its buffer starts now
                buf = state["momentum_buffer"] = grad.astype(p.dtype, copy=True)
            elif state["step"] == 1:
                np.copyto(buf, grad)
            else:
                buf *= self.momentum
                buf += (1 - self.dampening) * grad
            grad = grad + self.momentum * buf if self.nesterov else buf
        p -= self.lr * grad
