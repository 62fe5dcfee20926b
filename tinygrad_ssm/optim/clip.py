"""Gradient clipping by the global norm over all parameters (torch.nn.utils.clip_grad_norm_)."""
from __future__ import annotations

import math
import numbers

import numpy as np

from ..autograd.tensor import Tensor
from .optimizer import named_parameters


def _norm_type(norm_type) -> float:
    try:
        p = float(norm_type)  # torch takes "inf" too
    except (TypeError, ValueError):
        p = math.nan
    if isinstance(norm_type, bool) or not p > 0:
        raise ValueError(f"clip_grad_norm_: norm_type must be a number > 0 or math.inf (2.0: the Euclidean norm, "
                         f"torch's default), got {norm_type!r}")
    return p


def clip_grad_norm_(params, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                    foreach=None) -> float:
    """Scale every gradient by min(1, max_norm / (total + 1e-6)), total = the norm_type-norm of all gradients
    concatenated (computed in float64, so float32 gradients of 1e20 give 1.4e20 where torch's float32 norm is inf
    and zeroes them all, and 1e-30 ones 1.4e-30 where torch's is 0; inf: the largest |g|). Returns the total norm
    before clipping. Parameters without a gradient are ignored. torch's signature and behaviour, also when the total
    is NaN or inf: with error_if_nonfinite it raises, naming the parameters at fault, and leaves the gradients;
    without (torch's default) the gradients are scaled anyway, by max_norm / (inf + 1e-6) = 0 (finite ones become 0,
    inf ones NaN) or by NaN (all NaN), and the non-finite total is returned: check it before stepping (the training
    loop stops there), or pass error_if_nonfinite=True to be told which parameters to look at."""
    # torch checks nothing here: a negative max_norm flips the sign of every gradient (the step climbs the
    # loss), NaN turns them all to NaN, inf disables clipping. Each is a mistake, never a setting: refused
    # before anything is touched (no clipping is "do not call this", and 0 zeroes the gradients as in torch).
    if isinstance(max_norm, bool) or not isinstance(max_norm, numbers.Real) or not math.isfinite(max_norm) \
            or max_norm < 0:
        raise ValueError(f"clip_grad_norm_: max_norm must be a finite number >= 0, got {max_norm!r}; to not "
                         f"clip, do not call clip_grad_norm_")
    p = _norm_type(norm_type)
    if foreach not in (None, False):   # torch's switch of kernels, as the optimizers take it: its neutral values
        raise ValueError(f"clip_grad_norm_: foreach={foreach!r} is not supported (torch's option; only None or "
                         f"False); leave it out")
    if not isinstance(error_if_nonfinite, (bool, np.bool_)):  # a norm_type passed in its old place lands here
        raise TypeError(f"clip_grad_norm_: error_if_nonfinite must be True or False, got {error_if_nonfinite!r} "
                        f"(the third argument is norm_type, as in torch)")
    if isinstance(params, Tensor):  # one tensor, as torch accepts
        params = [params]
    grads = [(name, g.grad) for name, g in named_parameters(params, "clip_grad_norm_", leaves_only=False)
             if g.grad is not None]
    if not grads:
        return 0.0
    if p == math.inf:
        total = max(float(np.max(np.abs(g.data), initial=0.0)) for _, g in grads)
        if any(np.isnan(g.data).any() for _, g in grads):  # max() skips NaN; torch's max does not
            total = math.nan
    else:
        with np.errstate(over="ignore"):  # float64 gradients past 1e154: the total is inf (as torch's), no warning
            total = _total(grads, p)
    if not math.isfinite(total) and error_if_nonfinite:
        bad = [name for name, g in grads if not np.all(np.isfinite(g.data))]
        raise RuntimeError(f"clip_grad_norm_: the total norm of order {p:g} of the gradients is {total}, so it "
                           f"cannot be clipped; non-finite gradients in: {', '.join(bad) or '(overflow in the sum)'}"
                           f"; the gradients were left as they are (error_if_nonfinite=False scales them anyway)")
    scale = max_norm / (total + 1e-6)  # NaN for a NaN total, 0 for an infinite one: both applied, as torch
    if not scale >= 1.0:
        read_only = [name for name, g in grads if not g.data.flags.writeable]   # checked before any is scaled: a
        if read_only:                                   # broadcast view as .grad failed half-way, the rest scaled
            raise ValueError(f"clip_grad_norm_: the gradient of {', '.join(read_only)} is a read-only array (a "
                             f"broadcast view?); nothing was scaled: give it a writable gradient (.grad = "
                             f"Tensor(array.copy()))")
        for _, g in grads:
            with np.errstate(invalid="ignore"):  # inf * 0 = NaN, as in torch
                g.mul_(scale)
    return total


def _total(grads: list, p: float) -> float:
    """The p-norm of all gradients concatenated, in float64."""
    if p == 2.0:
        return math.sqrt(sum(float(np.sum(np.square(g.data, dtype=np.float64))) for _, g in grads))
    return sum(float(np.sum(np.abs(g.data.astype(np.float64)) ** p)) for _, g in grads) ** (1.0 / p)
