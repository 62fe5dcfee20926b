"""Gradient clipping by the global norm over all parameters (torch.nn.utils.clip_grad_norm_)."""
from __future__ import annotations

import math
import numbers

import numpy as np

from ..autograd.tensor import Tensor
from .optimizer import named_parameters


def clip_grad_norm_(params, max_norm: float, error_if_nonfinite: bool = False) -> float:
    """Scale every gradient by min(1, max_norm / (total + 1e-6)), total = the 2-norm of all gradients
    concatenated (computed in float64). Returns the total norm before clipping. Parameters without a
    gradient are ignored. With error_if_nonfinite a NaN/inf norm raises, naming the parameters at fault;
    without, it is returned and the gradients are left unscaled."""
    # torch checks nothing here: a negative max_norm flips the sign of every gradient (the step climbs the
    # loss), NaN turns them all to NaN, inf disables clipping. Each is a mistake, never a setting: refused
    # before anything is touched (no clipping is "do not call this", and 0 zeroes the gradients as in torch).
    if isinstance(max_norm, bool) or not isinstance(max_norm, numbers.Real) or not math.isfinite(max_norm) \
            or max_norm < 0:
        raise ValueError(f"clip_grad_norm_: max_norm must be a finite number >= 0, got {max_norm!r}; to not "
                         f"clip, do not call clip_grad_norm_")
    if isinstance(params, Tensor):  # one tensor, as torch accepts
        params = [params]
    grads = [(name, p.grad) for name, p in named_parameters(params, "clip_grad_norm_") if p.grad is not None]
    if not grads:
        return 0.0
    total = math.sqrt(sum(float(np.sum(np.square(g.data, dtype=np.float64))) for _, g in grads))
    if not math.isfinite(total):
        if error_if_nonfinite:
            bad = [name for name, g in grads if not np.all(np.isfinite(g.data))]
            raise RuntimeError(f"clip_grad_norm_: the total norm of the gradients is {total}, so it cannot be "
                               f"clipped; non-finite gradients in: {', '.join(bad) or '(overflow in the sum)'}")
        # left as they are, unlike torch: its scale max_norm / (inf + 1e-6) = 0 zeroes every finite gradient (and
        # makes an inf one NaN), a NaN total makes them all NaN; the caller sees the total and can look at them
        return total
    scale = max_norm / (total + 1e-6)
    if scale < 1.0:
        for _, g in grads:
            g.mul_(scale)
    return total
