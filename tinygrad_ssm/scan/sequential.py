"""The SSD scan in its sequential form, one time step after another, composed of engine ops.

It is the definition written out (the recurrence of docs/mamba2.md, section 1), slow (a Python loop over time,
and a graph that grows with l) but obviously right: the chunked form and the fast kernels are checked
against it. Per batch, head:  S_t = exp(dt_t A) S_{t-1} + dt_t x_t B_t^T;  y_t = S_t C_t  (+ D x_t).
"""
from __future__ import annotations

import numpy as np

from ..autograd import functional as F
from ..autograd.tensor import Tensor


def ssd_step(state: Tensor, x_t: Tensor, dt_t: Tensor, A: Tensor, B_t: Tensor, C_t: Tensor, D: Tensor | None = None):
    """One step of the recurrence, for decoding: O(1) work and memory per token.
    state (b, h, p, n); x_t (b, h, p); dt_t (b, h); A (h,); B_t, C_t (b, g, n); D (h,) or None.
    Returns (y_t (b, h, p), new state (b, h, p, n))."""
    b, h, p, n = state.shape
    g = B_t.shape[1]
    r = h // g                                                          # heads per group: head i reads group i // r
    decay = F.reshape(F.exp(dt_t * A), (b, g, r, 1, 1))                 # (b, g, r, 1, 1)
    X = F.reshape(x_t * F.unsqueeze(dt_t, -1), (b, g, r, p, 1))          # (b, g, r, p, 1)
    S = F.reshape(state, (b, g, r, p, n))                               # (b, g, r, p, n)
    S = decay * S + X * F.reshape(B_t, (b, g, 1, 1, n))                 # (b, g, r, p, n)
    y = F.reshape(F.matmul(S, F.reshape(C_t, (b, g, 1, n, 1))), (b, h, p))  # (b, h, p)
    if D is not None:
        y = y + x_t * F.reshape(D, (h, 1))
    return y, F.reshape(S, (b, h, p, n))


def ssd_scan(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor | None = None,
             initial_state: Tensor | None = None, chunk_size: int | None = None):
    """Same arguments and results as `ssd_chunked` (chunk_size is accepted and ignored): `ssd_step` l times."""
    b, l, h, p = x.shape
    n = B.shape[3]
    state = initial_state if initial_state is not None else Tensor(np.zeros((b, h, p, n), dtype=x.dtype))
    ys = []
    for t in range(l):
        y_t, state = ssd_step(state, x[:, t], dt[:, t], A, B[:, t], C[:, t], D)  # (b, h, p), (b, h, p, n)
        ys.append(y_t)
    return F.stack(ys, axis=1), state                                   # (b, l, h, p), (b, h, p, n)
