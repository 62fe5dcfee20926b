"""The chunked SSD (state space duality) scan of Mamba-2, composed of engine ops: ssd_minimal's algorithm.

The sequence is cut into chunks of q steps. Inside a chunk the scan is a masked (q, q) "attention" matrix
(quadratic, but a few large matmuls); between chunks only a (p, n) state per head is passed on (linear).
Every step is an engine op, so the backward comes for free and this file is what a reader studies; the
faster kernels of this package compute the same thing.

Notation: b batch, l length, h heads, p head dim, g groups, r = h / g heads per group, n state size,
q chunk length, c number of chunks. Heads are laid out (g, r): head i reads group i // r, exactly as
reshaping h -> (g, r) does, so B and C broadcast over r instead of being copied per head.
"""
from __future__ import annotations

import functools

import numpy as np

from .. import functional as F
from ..tensor import Tensor


# Up to this length segsum is one matmul with a 0/1 tensor of T^3 entries (8 MiB in float32 at T = 128), which
# NumPy runs several times faster than the masked cumsum; longer (the chunk-level segsum of a long sequence)
# take the cumsum path.
SEGSUM_MATMUL_MAX = 128


@functools.lru_cache(maxsize=16)
def _segsum_selector(T: int, dtype: np.dtype) -> np.ndarray:
    """(T, T * T) of 0/1: column (i, j) selects the steps k with j < k <= i."""
    k, i, j = np.ogrid[:T, :T, :T]
    selector = ((j < k) & (k <= i)).astype(dtype).reshape(T, T * T)
    selector.flags.writeable = False
    return selector


def segsum(a: Tensor) -> Tensor:
    """a (..., T) -> (..., T, T): segsum[i, j] = a[j+1] + ... + a[i] for i >= j, exactly 0 above the diagonal.

    Always masking then summing, never cumsum[i] - cumsum[j]: that difference cancels catastrophically once
    the running sum is large. Short T: one matmul with a 0/1 selector (a masked sum); long T: a[i] placed
    in row i below the diagonal, then cumsum down the rows."""
    T = a.shape[-1]
    if T <= SEGSUM_MATMUL_MAX:
        flat = F.reshape(a, (-1, T))                                    # (N, T)
        picked = F.matmul(flat, Tensor(_segsum_selector(T, a.dtype)))   # (N, T T)
        return F.reshape(picked, a.shape + (T,))                        # (..., T, T)
    rows = F.expand(F.unsqueeze(a, -1), a.shape + (T,))                 # (..., T, T): [i, j] = a[i]
    return F.cumsum(F.where(np.tri(T, T, -1, dtype=bool), rows, 0.0), axis=-2)


def exp_segsum(a: Tensor) -> Tensor:
    """a (..., T) -> (..., T, T): L[i, j] = exp(a[j+1] + ... + a[i]) for i >= j, and 0 above the diagonal.
    Above the diagonal segsum is exactly 0, so exp gives 1 and the 0/1 mask zeroes it: no -inf is ever
    formed, so no inf * 0 = NaN can appear in the backward."""
    T = a.shape[-1]
    return F.exp(segsum(a)) * np.tri(T, T, 0, dtype=a.dtype)            # (..., T, T)


def ssd_chunked(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor | None = None,
                initial_state: Tensor | None = None, chunk_size: int = 256):
    """y_t = sum_{s<=t} C_t . (prod_{s<k<=t} exp(dt_k A)) dt_s B_s x_s  (+ D x_t), with the state carried in.

    x (b, l, h, p); dt (b, l, h) already softplus'd; A (h,); B, C (b, l, g, n); D (h,) or None;
    initial_state (b, h, p, n) or None. Returns y (b, l, h, p) and the final state (b, h, p, n).
    Arguments arrive validated (see `tinygrad_ssm.kernels.ssd`)."""
    b, l, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    r = h // g
    c = -(-l // chunk_size)                                             # chunks of at most chunk_size steps,
    q = -(-l // c)                                                      # of equal length q: a short input is
    tail = c * q - l                                                    # one chunk, and the padding is < c steps

    X = x * F.unsqueeze(dt, -1)                                         # (b, l, h, p)   discretised input
    a = dt * A                                                          # (b, l, h)      log of the decay
    if tail:  # pad with X = 0 and a = 0 only: the padded steps then neither add to nor decay the state
        X = F.pad(X, (0, 0, 0, 0, 0, tail))
        a = F.pad(a, (0, 0, 0, tail))
        B = F.pad(B, (0, 0, 0, 0, 0, tail))
        C = F.pad(C, (0, 0, 0, 0, 0, tail))

    X = F.reshape(X, (b, c, q, g, r, p))                                # (b, c, q, g, r, p)
    X_rqp = F.permute(X, (0, 1, 3, 4, 2, 5))                            # (b, c, g, r, q, p) heads batched
    X_qrp = F.permute(X, (0, 1, 3, 2, 4, 5))                            # (b, c, g, q, r, p) heads side by side
    a = F.permute(F.reshape(a, (b, c, q, g, r)), (0, 1, 3, 4, 2))       # (b, c, g, r, q)
    B = F.permute(F.reshape(B, (b, c, q, g, n)), (0, 1, 3, 2, 4))       # (b, c, g, q, n) shared by r heads
    C = F.permute(F.reshape(C, (b, c, q, g, n)), (0, 1, 3, 2, 4))       # (b, c, g, q, n)

    # 1. inside each chunk: y = (C B^T masked by the decays) X
    L = exp_segsum(a)                                                   # (b, c, g, r, q, q)
    CB = F.matmul(C, F.transpose(B, -1, -2))                             # (b, c, g, q, q)
    Y_diag = F.matmul(L * F.unsqueeze(CB, 3), X_rqp)                     # (b, c, g, r, q, p)

    # 2. the state each chunk leaves behind, from its own inputs: decay from step j to the chunk's end is
    #    L's last row (exp(sum of a after j)), so no cumsum difference is needed here either
    #    (one GEMM per (b, c, g): the r heads' p rows stacked, (r p, q) @ (q, n))
    decay_to_end = F.permute(L[..., -1, :], (0, 1, 2, 4, 3))            # (b, c, g, q, r)
    X_decayed = X_qrp * F.unsqueeze(decay_to_end, -1)                   # (b, c, g, q, r, p)
    X_decayed = F.reshape(X_decayed, (b, c, g, q, r * p))               # (b, c, g, q, r p)
    chunk_states = F.matmul(F.transpose(X_decayed, -1, -2), B)          # (b, c, g, r p, n)
    chunk_states = F.reshape(chunk_states, (b, c, g, r, p * n))         # (b, c, g, r, p n)

    # 3. pass states between chunks: S_in(c) = sum_{c' < c} exp(a summed over chunks c'..c-1) s_c'
    #    + the decayed initial state; a (c+1, c+1) segsum over the chunk totals does all of it at once
    a_cumsum = F.cumsum(a, axis=-1)                                     # (b, c, g, r, q)
    chunk_totals = F.permute(a_cumsum[..., -1], (0, 2, 3, 1))            # (b, g, r, c)
    if initial_state is None:
        start = Tensor(np.zeros((b, g, r, 1, p * n), dtype=x.dtype))
    else:
        start = F.reshape(initial_state, (b, g, r, 1, p * n))
    states = F.cat([start, F.permute(chunk_states, (0, 2, 3, 1, 4))], axis=3)  # (b, g, r, c + 1, p n)
    decay_chunk = exp_segsum(F.pad(chunk_totals, (1, 0)))                # (b, g, r, c + 1, c + 1)
    states = F.matmul(decay_chunk, states)                               # (b, g, r, c + 1, p n)
    final_state = F.reshape(states[:, :, :, -1], (b, h, p, n))          # (b, h, p, n)
    states_in = F.reshape(states[:, :, :, :-1], (b, g, r, c, p, n))     # (b, g, r, c, p, n) entering chunk c

    # 4. what the incoming state contributes inside the chunk: exp(a summed up to i) * (S_in C_i)
    #    (one GEMM per (b, c, g): (q, n) @ (n, r p) for the group's r heads at once)
    states_in = F.reshape(F.permute(states_in, (0, 3, 1, 5, 2, 4)), (b, c, g, n, r * p))  # (b, c, g, n, r p)
    Y_off = F.reshape(F.matmul(C, states_in), (b, c, g, q, r, p))      # (b, c, g, q, r, p)
    decay_from_start = F.permute(F.exp(a_cumsum), (0, 1, 2, 4, 3))      # (b, c, g, q, r)
    Y_off = Y_off * F.unsqueeze(decay_from_start, -1)                   # (b, c, g, q, r, p)

    y = F.permute(Y_diag, (0, 1, 4, 2, 3, 5)) + F.permute(Y_off, (0, 1, 3, 2, 4, 5))  # (b, c, q, g, r, p)
    y = F.reshape(y, (b, c * q, h, p))                                  # (b, c q, h, p)
    if tail:
        y = y[:, :l]                                                    # (b, l, h, p)
    if D is not None:
        y = y + x * F.reshape(D, (h, 1))
    return y, final_state
