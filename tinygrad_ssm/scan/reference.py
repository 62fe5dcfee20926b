"""The chunked SSD (state space duality) scan of Mamba-2, composed of engine ops: ssd_minimal's algorithm.

This is the spec: what a reader studies, and what every kernel backend is tested against (in float64, to 1e-10).
It is written for reading, not speed (the numba kernels are the fast path): one named einsum per step, the
four steps of ssd_minimal numbered, the shape beside every line.

The sequence is cut into c chunks of q steps. Inside a chunk the scan is a masked (q, q) "attention" matrix
(quadratic, but a few large matmuls); between chunks only a (p, n) state per head is passed on (linear).

Notation: b batch, l length, h heads, p head dim, g groups, r = h / g heads per group, n state size,
q chunk length, c number of chunks; in the einsums l is a step of a chunk and s the step it reads from, z a
chunk boundary. Heads are laid out (g, r): head i reads group i // r, exactly as reshaping h -> (g, r) does, so
B and C broadcast over r instead of being copied per head.

Exact by construction: no -inf is ever formed (exp of a masked sum, then a where), and no decay is a
difference of cumulative sums (which cancels once the running sum is large): every decay is exp of a sum of the
steps it spans, or (between chunks) a product of such.

Causal also for non-finite values: a NaN at step t reaches no output before t, and a NaN in the gradient of
y at step t no input gradient after t. A masked product written as (mask * values) summed over s would give
0 * NaN = NaN for a masked term, so the sum that a causal mask restricts inside a chunk (over s <= l, step 1)
masks each factor with `where` before multiplying and then sums (`masked_product`): the masked terms are exact
zeros forwards, and backwards every gradient reaching a factor passes the same `where`. C_l . B_s itself is
masked so too (its einsum over every (l, s) pair, masked afterwards, gave backwards 0 * NaN: a NaN in B at step s
made dC NaN at every step of the chunk, a NaN in C at l dB at every step). This costs a (q, q, n) product per
chunk and group and a (q, q, p) product per chunk and head in step 1 instead of one einsum. Between chunks
(step 3) the state is passed on chunk by chunk, which is causal as it stands (ssd_minimal's (c+1, c+1) segsum
there would need the same masking, over (c+1)^2 states: memory quadratic in l).
"""
from __future__ import annotations

import numpy as np

from ..autograd import functional as F
from ..autograd.tensor import Tensor


def segsum(a: Tensor) -> Tensor:
    """a (..., T) -> (..., T, T): segsum[i, j] = a[j+1] + ... + a[i] for i >= j, exactly 0 above the diagonal.
    a[i] is placed in row i below the diagonal, then summed down the rows: masking then summing, never
    cumsum[i] - cumsum[j], which cancels catastrophically once the running sum is large."""
    T = a.shape[-1]
    rows = F.expand(F.unsqueeze(a, -1), a.shape + (T,))                 # (..., T, T): [i, j] = a[i]
    below = F.where(np.tri(T, T, -1, dtype=bool), rows, 0.0)            # (..., T, T): a[i] where j < i
    return F.cumsum(below, axis=-2)                                     # (..., T, T)


def exp_segsum(a: Tensor) -> Tensor:
    """a (..., T) -> (..., T, T): L[i, j] = exp(a[j+1] + ... + a[i]) for i >= j, and 0 above the diagonal.
    Above the diagonal segsum is exactly 0, so exp gives 1 and `where` zeroes it: no -inf is ever formed, and
    no 0 * NaN either (a mask multiplied in would give one forwards or backwards)."""
    T = a.shape[-1]
    return F.where(np.tri(T, T, 0, dtype=bool), F.exp(segsum(a)), 0.0)  # (..., T, T)


def masked_product(mask: np.ndarray, u: Tensor, v: Tensor) -> Tensor:
    """where(mask, u, 0) * where(mask, v, 0): a masked term is an exact 0 whatever u and v hold there (NaN
    included), and no gradient of a masked term reaches u or v (mask * u * v would give 0 * NaN = NaN)."""
    return F.where(mask, u, 0.0) * F.where(mask, v, 0.0)


def ssd_chunked(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor | None = None,
                initial_state: Tensor | None = None, chunk_size: int = 256):
    """y_t = sum_{s<=t} C_t . (prod_{s<k<=t} exp(dt_k A)) dt_s B_s x_s  (+ D x_t), with the state carried in.

    x (b, l, h, p); dt (b, l, h) already softplus'd; A (h,); B, C (b, l, g, n); D (h,) or None;
    initial_state (b, h, p, n) or None. Returns y (b, l, h, p) and the final state (b, h, p, n).
    Arguments arrive validated (see `tinygrad_ssm.scan.ssd`)."""
    b, l, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    r = h // g
    c = -(-l // chunk_size)                                             # chunks of at most chunk_size steps,
    q = -(-l // c)                                                      # of equal length q: a short input is
    tail = c * q - l                                                    # one chunk, and the padding is < c steps

    X = x * F.unsqueeze(dt, -1)                                         # (b, l, h, p)   discretised input
    a = dt * A                                                          # (b, l, h)      log of each step's decay
    if tail:  # pad with X = 0 and a = 0 only: the padded steps then neither add to nor decay the state
        X = F.pad(X, (0, 0, 0, 0, 0, tail))                             # (b, c q, h, p)
        a = F.pad(a, (0, 0, 0, tail))                                   # (b, c q, h)
        B = F.pad(B, (0, 0, 0, 0, 0, tail))                             # (b, c q, g, n)
        C = F.pad(C, (0, 0, 0, 0, 0, tail))                             # (b, c q, g, n)
    X = F.reshape(X, (b, c, q, g, r, p))                                # (b, c, q, g, r, p)
    B = F.reshape(B, (b, c, q, g, n))                                   # (b, c, q, g, n)
    C = F.reshape(C, (b, c, q, g, n))                                   # (b, c, q, g, n)
    a = F.permute(F.reshape(a, (b, c, q, g, r)), (0, 3, 4, 1, 2))       # (b, g, r, c, q)
    a_cumsum = F.cumsum(a, axis=-1)                                     # (b, g, r, c, q)

    # 1. inside each chunk (the diagonal blocks): y_l = sum_{s<=l} (C_l . B_s) exp(a_{s+1} + ... + a_l) X_s
    L = exp_segsum(a)                                                   # (b, g, r, c, q, q)
    causal = np.tri(q, q, 0, dtype=bool)                                # (q, q): [l, s] = s <= l
    Cl = F.unsqueeze(F.permute(C, (0, 3, 1, 2, 4)), 4)                  # (b, g, c, q, 1, n)  C_l
    Bs = F.unsqueeze(F.permute(B, (0, 3, 1, 2, 4)), 3)                  # (b, g, c, 1, q, n)  B_s
    CB = F.unsqueeze(F.sum(masked_product(causal[:, :, None], Cl, Bs), axis=-1), 2)  # (b, g, 1, c, q, q)  C_l.B_s
    M = masked_product(causal, CB, L)                                   # (b, g, r, c, q, q)  masked C.B L
    Xs = F.unsqueeze(F.permute(X, (0, 3, 4, 1, 2, 5)), 4)               # (b, g, r, c, 1, q, p)  X_s
    Y_diag = F.sum(masked_product(causal[:, :, None], F.unsqueeze(M, -1), Xs), axis=5)  # (b, g, r, c, q, p)
    Y_diag = F.permute(Y_diag, (0, 3, 4, 1, 2, 5))                      # (b, c, q, g, r, p)

    # 2. the state each chunk leaves behind from its own inputs: sum_s exp(a_{s+1} + ... + a_q) X_s B_s^T
    #    (the decay from step s to the chunk's end is L's last row: no difference of cumsums)
    decay_states = L[..., -1, :]                                        # (b, g, r, c, q)
    states = F.einsum("bclgn,bgrcl,bclgrp->bcgrpn", B, decay_states, X)  # (b, c, g, r, p, n)

    # 3. between chunks: the state entering chunk z + 1 is the state entering z, decayed by z's total, plus z's
    #    own state; one (p, n) state per head is passed on, chunk by chunk (a NaN in chunk z reaches later chunks
    #    only, and the memory is linear in c)
    if initial_state is None:
        state = Tensor(np.zeros((b, g, r, p, n), dtype=x.dtype))       # (b, g, r, p, n)
    else:
        state = F.reshape(initial_state, (b, g, r, p, n))              # (b, g, r, p, n)
    chunk_decay = F.unsqueeze(F.unsqueeze(F.exp(a_cumsum[..., -1]), -1), -1)  # (b, g, r, c, 1, 1)
    entering = []
    for z in range(c):
        entering.append(state)
        state = state * chunk_decay[:, :, :, z] + states[:, z]         # (b, g, r, p, n)
    states, final_state = F.stack(entering, axis=1), state              # (b, c, g, r, p, n), (b, g, r, p, n)

    # 4. what the entering state gives each step of its chunk: exp(a_1 + ... + a_l) S C_l
    state_decay_out = F.exp(a_cumsum)                                   # (b, g, r, c, q)
    Y_off = F.einsum("bclgn,bcgrpn,bgrcl->bclgrp", C, states, state_decay_out)  # (b, c, q, g, r, p)

    y = F.reshape(Y_diag + Y_off, (b, c * q, h, p))                     # (b, c q, h, p)
    if tail:
        y = y[:, :l]                                                    # (b, l, h, p)
    if D is not None:
        y = y + x * F.reshape(D, (h, 1))                                # (b, l, h, p)
    return y, F.reshape(final_state, (b, h, p, n))                      # (b, l, h, p), (b, h, p, n)
