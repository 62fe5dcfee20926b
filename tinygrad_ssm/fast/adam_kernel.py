"""Adam's update of one parameter in one numba pass over p, m, v and the gradient, instead of NumPy's ~10 passes
with temporaries (adam.py's `Adam._update_reference`, the reference). The same operations in the same order in
the parameter's dtype, no fused multiply-add: the same bits as the reference in float32 and float64
(tests/fast/test_adam_kernel.py holds them equal bit for bit).

One thread: inside a training step the update streams p, m, v and the gradient from memory (~50 MB for the
benchmark model's 1.79M parameters, ~4 ms), and blocks of the large matrices handed to both threads
(fast/row_blocks.on_threads) measured slower, 4.7 ms against 4.2 (benchmarks/bench_step_parts.py at commit
3423dbb, which had both): the memory, not the arithmetic, is the limit.
"""
from __future__ import annotations

import math

import numpy as np

from .jit import njit

FLOATS = (np.float32, np.float64)


@njit(cache=True, nogil=True, error_model="numpy")
def _adam(p, m, v, g, decay, coupled_wd, weight, rest, beta2, one_minus_beta2, step_size, bias2_sqrt, eps):
    """p, m, v, g flat, one dtype; the scalars in that dtype (a float64 one would widen a float32 loop).
    decay = 1 - lr wd for AdamW (1 otherwise); coupled_wd = wd for Adam (0 otherwise, then not applied: 0 * inf);
    weight = 1 - beta1 and rest = 1 - weight, torch's lerp (adam.py's lerp_weights)."""
    for i in range(p.size):
        gi = g[i]
        if coupled_wd != 0:
            gi = gi + coupled_wd * p[i]
        pi = p[i] * decay
        if weight < 0.5:                                                 # exp_avg.lerp_(grad, 1 - beta1)
            mi = m[i] + weight * (gi - m[i])
        else:
            mi = gi - (gi - m[i]) * rest
        vi = v[i] * beta2 + one_minus_beta2 * gi * gi
        p[i] = pi - step_size * (mi / (np.sqrt(vi) / bias2_sqrt + eps))
        m[i], v[i] = mi, vi


def takes(p: np.ndarray, m: np.ndarray, v: np.ndarray, grad: np.ndarray) -> bool:
    """Whether the kernel takes these arrays: one float dtype, p, m and v C-contiguous (written in place)."""
    return (p.dtype in FLOATS and m.dtype == v.dtype == grad.dtype == p.dtype
            and p.shape == grad.shape == m.shape == v.shape                      # the kernel reads them flat
            and p.flags.c_contiguous and m.flags.c_contiguous and v.flags.c_contiguous and p.flags.writeable)


def adam_update(p, m, v, grad, t: int, lr, beta1, beta2, eps, weight_decay, decoupled: bool):
    """Adam's step t on p, m, v in place (see adam.py's formulas); the arrays as `takes` requires."""
    f = p.dtype.type
    with np.errstate(over="ignore"):  # a step size past float32's range is inf, as in the twin: the weights go
        decay = f(1 - lr * weight_decay) if decoupled and weight_decay else f(1)  # non-finite and the run's
        coupled = f(weight_decay) if not decoupled else f(0)                       # checks name that, not NumPy
        weight = f(1 - beta1)                                  # adam.py's lerp_weights: w and 1 - w in p's dtype
        scalars = (weight, f(1) - weight, f(beta2), f(1 - beta2), f(lr / (1 - beta1 ** t)),
                   f(math.sqrt(1 - beta2 ** t)), f(eps))
    _adam(p.reshape(-1), m.reshape(-1), v.reshape(-1), np.ascontiguousarray(grad).reshape(-1), decay, coupled,
          *scalars)
