"""SGD with momentum (PyTorch's formula: the first step's buffer is the gradient itself)."""
from __future__ import annotations

import numpy as np

from .optimizer import Optimizer


class SGD(Optimizer):
    """g <- grad + weight_decay * p;  buf <- momentum * buf + (1 - dampening) * g  (buf = g on the first step);
    p <- p - lr * (g + momentum * buf if nesterov else buf). lr, momentum, dampening, weight_decay and nesterov
    are per parameter group (torch's keys); a state dict saves the four numbers, not nesterov (a switch of the
    code, like fused). torch's maximize is not implemented (a group asking for it is refused)."""

    hparam_names = ("lr", "momentum", "dampening", "weight_decay")
    optional_slots = ("momentum_buffer",)  # absent: momentum set after the last step; the next step starts it

    def __init__(self, params, lr: float, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, **torch_options):
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                                      nesterov=nesterov), torch_options)

    def _check_hparam(self, key, value):
        if key == "nesterov" and not isinstance(value, (bool, np.bool_)):
            raise ValueError(f"nesterov must be True or False, got {value!r}")
        return bool(value) if key == "nesterov" else super()._check_hparam(key, value)

    def _check_group(self, group, where):
        if group["nesterov"] and (group["momentum"] <= 0 or group["dampening"] != 0):
            raise ValueError(f"{where}: nesterov momentum requires a momentum and zero dampening")

    def _slots(self, group) -> tuple:  # the buffer exists once there is momentum (it may be set after construction)
        return ("momentum_buffer",) if group["momentum"] else ()

    def _update(self, param, grad, state, group):
        p, lr, momentum, dampening, wd = param.data, group["lr"], group["momentum"], group["dampening"], \
            group["weight_decay"]
        if wd:
            grad = grad + wd * p
        if momentum:
            buf = state.get("momentum_buffer")
            if buf is None:  # momentum set after this parameter's first steps: its buffer starts now
                # np.array, not astype: grad + wd * p of two 0-d arrays is a NumPy scalar, which the in-place
                # updates below would leave unchanged in the state
                buf = state["momentum_buffer"] = np.array(grad, dtype=p.dtype)
            elif state["step"] == 1:
                np.copyto(buf, grad)
            else:
                buf *= momentum
                buf += (1 - dampening) * grad
            grad = grad + momentum * buf if group["nesterov"] else buf
        p -= lr * grad
