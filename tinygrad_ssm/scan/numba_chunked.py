"""The CPU backend of the scan, "numba_chunked": numba_cpu.py's chunked forward, its checkpoints every
q = min(chunk_size, MAX_CHUNK) steps (none for `inference`), and the backward chunked, as a numba kernel whose
products are BLAS calls made inside the kernel (numba's np.dot, which needs SciPy's BLAS).

Per chunk of q steps, head i of group gi, with a_t = dt_t A_i, X_t = dt_t x_t (p,), s_t = a_1 + ... + a_t
(inclusive, inside the chunk), seg[t, s] = a_{s+1} + ... + a_t (t >= s) and tail_s = seg[q, s], every one a sum
of the a it spans, built as running sums (never a difference of two sums: no cancellation, no -inf; exp(seg) as
running products of the steps' decays exp(a_t), m exps a chunk, not m^2 / 2, as in the forward), the forward
was
    M = exp(seg) o tril(C B^T)   (q, q);   Y = M X + exp(s) o (C S_in^T) + D x
    S_out = exp(s_q) S_in + (exp(tail) o X)^T B

and its backward, given dy and dS_out (d final_state for the last chunk), as docs/kernels.md derives ("The
chunked backward, derived"):

    G = dy X^T;   dX = M^T dy + exp(tail) o (B dS_out^T);   dx = dt dX + D dy
    W = sum over the group's heads of tril(exp(seg) o G);     dC = W B + sum_heads (exp(s) o dy) S_in
                                                              dB = W^T C + sum_heads (exp(tail) o X) dS_out
    dS_in = exp(s_q) dS_out + (exp(s) o dy)^T C               (d initial_state = dS_in of the first chunk)
    da_k = sum_{t>=k} sum_{s<k} dseg[t, s] + sum_{t>=k} v_t + w,  with dseg = G o M (plus, in the last row,
           exp(tail_s) X_s . (dS_out B_s)), v_t = exp(s_t) dy_t . (S_in C_t), w = exp(s_q) <dS_out, S_in>
    ddt = x . dX + A da,   dA = sum dt da,   dD = sum x . dy

S_in is the forward's checkpoint: nothing is recomputed. Why: products of these sizes run at 100-120 GFLOP/s a
core on OpenBLAS, the recurrence at about 35 (docs/kernels.md, "What was tried"); at the training step's shape
this backward takes ~0.63x the recurrence's backward. MAX_CHUNK = 32: the (q, q) work grows with q (at 64 the
prototype's backward was 0.80x, at 32 0.71x), and every product stays below OpenBLAS's threading threshold
(m n k <= 2^18), so it runs on the thread that calls it, as the kernel's own threads want.

Work items (batch, group), claimed from both ends of one counter by the caller's thread and row_blocks' pool
(numba_cpu._on_threads); a group's heads run inside an item, so C B^T and W B, W^T C are computed once for them,
and an item owns its rows of dB and dC. The chunk's pieces of x, dy, B and C are copied into small contiguous
buffers (np.dot takes contiguous operands; 8 KiB each; `numba_cpu._copy_piece`, which the forward shares).
"""
from __future__ import annotations

import numpy as np

from ..fast import heap_reuse
from ..fast.claims import claim_from_end
from ..fast.jit import njit
from . import numba_cpu
from .numba_cpu import (FASTMATH, _contiguous, _copy_piece, _decays, _finite, _masked_own_inputs, _on_threads,
                        _rows_of, on_single_threaded_blas)

MAX_CHUNK = 32

_jit = njit(nogil=True, fastmath=FASTMATH, cache=True)
_inline = njit(inline="always", fastmath=FASTMATH, cache=True)

@_inline
def _lower_t_dot(M, V, m, out):
    """out[s] = sum_{t >= s} M[t, s] V_t: M^T V over the lower triangle only, so a non-finite V_t reaches out_s
    for s <= t alone, as in the recurrence (the product over all of M would give 0 x NaN = NaN for s > t)."""
    for s in range(m):
        for i in range(V.shape[1]):
            acc = V.dtype.type(0)
            for t in range(s, m):
                acc += M[t, s] * V[t, i]
            out[s, i] = acc


@_inline
def _sum_of(V, m):
    """The sum of V's first m rows: not finite exactly when one of them holds a non-finite value."""
    acc = V.dtype.type(0)
    for t in range(m):
        for i in range(V.shape[1]):
            acc += V[t, i]
    return acc


@_jit
def backward_kernel(x, xc, dt, dtc, A, B, Bc, C, Cc, D, checkpoints, dy, dyc, d_final, g, q,
                    dx, dxc, ddt, dA_parts, dB, dBc, dC, dCc, dD_parts, d_initial, claims, share):
    """The chunked backward, per (batch, group) work item, chunks from the last: dx (rows, like the inputs),
    ddt (b, l, h), d_initial (b, h, p, n), dB, dC (rows from column dBc, dCc; a chunk's rows summed over its
    heads in dB_acc, dC_acc, then written once) and per-batch partial sums dA_parts, dD_parts (b, h)."""
    b, l, h = ddt.shape
    p, n = d_final.shape[2], d_final.shape[3]
    r = h // g
    c = checkpoints.shape[2]
    dtype = ddt.dtype
    Bq, Cq, Gq = np.empty((q, n), dtype), np.empty((q, n), dtype), np.empty((q, n), dtype)
    Xq, dyq = np.empty((q, p), dtype), np.empty((q, p), dtype)      # x, dy of the chunk (m, p)
    Xd, Ed, Ex = np.empty((q, p), dtype), np.empty((q, p), dtype), np.empty((q, p), dtype)
    dXq, MTdy, Ent = np.empty((q, p), dtype), np.empty((q, p), dtype), np.empty((q, n), dtype)
    L, M_flat, CB_flat = np.empty((q, q), dtype), np.empty(q * q, dtype), np.empty(q * q, dtype)
    Gm_flat, Wsum_flat = np.empty(q * q, dtype), np.empty(q * q, dtype)
    dS_local = np.empty((p, n), dtype)
    dB_acc, dC_acc = np.empty((q, n), dtype), np.empty((q, n), dtype)   # the chunk's rows of dB, dC (m, n)
    a, s_incl, tail = np.empty(q, dtype), np.empty(q, dtype), np.empty(q, dtype)
    da, from_state, decay_out = np.empty(q, dtype), np.empty(q, dtype), np.empty(q, dtype)
    dstates = np.empty((r, p, n), dtype)                            # the group's heads' dS_out
    while True:
        w = claim_from_end(claims, b * g, share > 0)
        if w < 0:
            break
        bi, gi = w // g, w % g
        for j in range(r):
            dstates[j] = d_final[bi, gi * r + j]
            dA_parts[bi, gi * r + j] = 0.0
            dD_parts[bi, gi * r + j] = 0.0
        for k in range(c - 1, -1, -1):
            t0 = k * q
            m = min(q, l - t0)
            row0 = bi * l + t0
            _copy_piece(B, Bc, n, row0, m, gi, Bq)
            _copy_piece(C, Cc, n, row0, m, gi, Cq)
            CB, M, Gm, Wsum = (CB_flat[:m * m].reshape((m, m)), M_flat[:m * m].reshape((m, m)),
                               Gm_flat[:m * m].reshape((m, m)), Wsum_flat[:m * m].reshape((m, m)))  # contiguous
            np.dot(Cq[:m], Bq[:m].T, CB)                            # (m, m)  C_t . B_s, for every head
            Wsum[:] = 0.0
            dB_acc[:m] = 0.0
            dC_acc[:m] = 0.0
            for j in range(r):
                hi = gi * r + j
                dS = dstates[j]                                     # (p, n)  dS_out of this chunk
                S_in = checkpoints[bi, hi, k]                       # (p, n)
                _decays(dt, dtc, A, hi, row0, m, a, s_incl, tail)
                _copy_piece(x, xc, p, row0, m, hi, Xq)
                _copy_piece(dy, dyc, p, row0, m, hi, dyq)
                e_total = np.exp(s_incl[m - 1])                     # exp(s_q)
                dy_sum = dtype.type(0)                              # not finite if some dy_t is not
                for t in range(m):
                    d, e_in, e_out = dt[row0 + t, dtc + hi], np.exp(s_incl[t]), np.exp(tail[t])
                    decay_out[t] = e_out
                    for i in range(p):
                        Xd[t, i] = Xq[t, i] * d
                        Ed[t, i] = dyq[t, i] * e_in
                        Ex[t, i] = Xd[t, i] * e_out
                        dy_sum += dyq[t, i]
                for t in range(m):                                  # L[t, s] = L[t - 1, s] exp(a_t): m exps
                    L_t, M_t, CB_t = L[t], M[t], CB[t]
                    if t > 0:
                        step, L_before = np.exp(a[t]), L[t - 1]
                        for s in range(t):
                            L_t[s] = L_before[s] * step
                    L_t[t] = 1.0
                    for s in range(t + 1):
                        M_t[s] = L_t[s] * CB_t[s]
                    for s in range(t + 1, m):
                        M_t[s] = 0.0
                np.dot(dyq[:m], Xd[:m].T, Gm)                       # G[t, s] = dy_t . X_s
                if _finite(dy_sum):
                    np.dot(M.T, dyq[:m], MTdy[:m])                  # (m, p)  M^T dy
                else:                                               # a non-finite dy_t: M's masked zeros must
                    _lower_t_dot(M, dyq, m, MTdy)                   # not multiply it (0 x NaN is NaN)
                np.dot(Bq[:m], dS.T, dXq[:m])                       # (m, p)  B dS_out^T
                np.dot(Ed[:m], S_in, Ent[:m])                       # (m, n)  exp(s) dy S_in: dC's, v's term
                np.dot(Ex[:m], dS, Gq[:m])                          # (m, n)  exp(tail) X dS_out: dB's term
                x_dot_dy_sum = dtype.type(0)
                for t in range(m):
                    e_out, d = decay_out[t], dt[row0 + t, dtc + hi]
                    fs, xdx, xdy = dtype.type(0), dtype.type(0), dtype.type(0)
                    out = dx[row0 + t, dxc + hi * p:dxc + (hi + 1) * p]
                    for i in range(p):
                        own = e_out * dXq[t, i]                     # the chunk's own state's term of dX
                        fs += own * Xd[t, i]
                        dX = own + MTdy[t, i]
                        xdx += Xq[t, i] * dX
                        xdy += Xq[t, i] * dyq[t, i]
                        out[i] = dX * d + D[hi] * dyq[t, i]
                    from_state[t] = fs
                    ddt[bi, t0 + t, hi] = xdx                       # + A da below
                    x_dot_dy_sum += xdy
                dD_parts[bi, hi] += x_dot_dy_sum
                for t in range(m):                                  # the per-head terms of dB and dC; v_t
                    v = dtype.type(0)
                    dB_t, dC_t, G_t, E_t, C_t = dB_acc[t], dC_acc[t], Gq[t], Ent[t], Cq[t]
                    for jj in range(n):
                        dB_t[jj] += G_t[jj]
                        dC_t[jj] += E_t[jj]
                        v += E_t[jj] * C_t[jj]
                    da[t] = v                                       # v_t, summed over t >= k below
                # the segment sums: da_k = sum_{t>=k} (sum_{s<k} dseg[t, s] + v_t) + w
                acc = dtype.type(0)
                for t in range(m - 1, -1, -1):
                    acc += da[t]
                    da[t] = acc
                for t in range(m):
                    Wsum_t, G_t, L_t, M_t = Wsum[t], Gm[t], L[t], M[t]
                    run = dtype.type(0)
                    for s in range(t):                              # run = sum_{s' < s + 1} dseg[t, s']
                        dseg = G_t[s] * M_t[s] + (from_state[s] if t == m - 1 else dtype.type(0))
                        run += dseg
                        da[s + 1] += run
                    for s in range(t + 1):
                        Wsum_t[s] += L_t[s] * G_t[s]
                np.dot(Ed[:m].T, Cq[:m], dS_local)                  # (p, n)
                wsum = dtype.type(0)                                # <dS_out, S_in>, as dS becomes dS_in
                for i in range(p):
                    dS_i, S_in_i, local_i = dS[i], S_in[i], dS_local[i]
                    for jj in range(n):
                        wsum += dS_i[jj] * S_in_i[jj]
                        dS_i[jj] = e_total * dS_i[jj] + local_i[jj]
                wsum *= e_total
                dA_sum = dtype.type(0)
                for t in range(m):
                    da_t = da[t] + wsum
                    ddt[bi, t0 + t, hi] += A[hi] * da_t
                    dA_sum += dt[row0 + t, dtc + hi] * da_t
                dA_parts[bi, hi] += dA_sum
            if _finite(_sum_of(Bq, m) + _sum_of(Cq, m)):             # the group's W B and W^T C
                np.dot(Wsum, Bq[:m], Gq[:m])
                np.dot(Wsum.T, Cq[:m], Ent[:m])
            else:                                                   # a non-finite B_s or C_t: W's zeros above
                _masked_own_inputs(Wsum.T, Bq, m, Gq)               # the diagonal must not multiply it (dC_t
                _lower_t_dot(Wsum, Cq, m, Ent)                      # reads B_s for s <= t only, dB_s C_t for t >= s)
            for t in range(m):                                      # the chunk's rows of dB and dC, written once
                dB_out = dB[row0 + t, dBc + gi * n:dBc + (gi + 1) * n]
                dC_out = dC[row0 + t, dCc + gi * n:dCc + (gi + 1) * n]
                dB_t, dC_t, WC_t, WB_t = dB_acc[t], dC_acc[t], Ent[t], Gq[t]
                for jj in range(n):
                    dB_out[jj] = dB_t[jj] + WC_t[jj]
                    dC_out[jj] = dC_t[jj] + WB_t[jj]
        for j in range(r):
            d_initial[bi, gi * r + j] = dstates[j]


def _chunk(l: int, chunk_size: int) -> int:
    return int(max(1, min(chunk_size, MAX_CHUNK, l)))


def forward(x, dt, A, B, C, D, initial_state, chunk_size):
    """The registry's kernel forward: numba_cpu's chunked forward, keeping the state entering every chunk of
    q = min(chunk_size, MAX_CHUNK) steps, the chunks this backward works in."""
    return numba_cpu.forward(x, dt, A, B, C, D, initial_state, _chunk(x.shape[1], chunk_size))


def inference(x, dt, A, B, C, D, initial_state, chunk_size):
    """The registry's forward without a backward to come: (y, final_state), no checkpoints kept."""
    return numba_cpu.forward(x, dt, A, B, C, D, initial_state, _chunk(x.shape[1], chunk_size), checkpoints=False)[:2]


def backward(saved, dy, d_final_state, into=(None, None, None)):
    """The registry's kernel backward: (saved, dy, d final_state) -> (dx, ddt, dA, dB, dC, dD|None, d_initial|None).
    into: arrays shaped like x, B, C (or None) to write dx, dB, dC into and return, instead of new arrays; the model
    passes the pieces of the split's one gradient array (see `SSD.backward`), so the split copies nothing."""
    x, dt, A, B, C, D, checkpoints, (q, had_initial, had_D) = saved   # had_D: D may be given and empty (h = 0)
    b, l, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    out = BackwardArrays(x, dt, B, into)
    args = (*backward_inputs(saved, dy, d_final_state), g, int(q), *out.dx_rows, out.ddt, out.dA_parts,
            out.sums[0][0][0], out.sums[0][1], out.sums[1][0][0], out.sums[1][1], out.dD_parts, out.d_initial)
    on_single_threaded_blas(lambda: _on_threads(backward_kernel, args, numba_cpu._thread_count(b * l * h * p * n)))
    return out.gradients(B.shape, bool(had_D), bool(had_initial))


def backward_inputs(saved, dy, d_final_state) -> tuple:
    """The backward kernel's first arguments: x, dt, A, B, C, D
    (zeros where the layer has none), the checkpoints, dy and d final_state, C-contiguous in x's dtype; x, dt,
    B, C and dy as (rows, col) (`_rows_of`)."""
    x, dt, A, B, C, D, checkpoints, _ = saved
    dtype = x.dtype
    D_or_zeros = D if D.size else np.zeros(x.shape[2], dtype)
    A, D_or_zeros, checkpoints, d_final = _contiguous(A, D_or_zeros, checkpoints,
                                                      d_final_state.astype(dtype, copy=False))
    return (*_rows_of(x), *_rows_of(dt), A, *_rows_of(B), *_rows_of(C), D_or_zeros, checkpoints,
            *_rows_of(dy.astype(dtype, copy=False)), d_final)


class BackwardArrays:
    """The arrays the backward kernel fills: dx (into[0]'s own memory when it can be: `dx_rows`), ddt, per-batch
    partial sums dA_parts and dD_parts (b, h), d_initial, and per dB and dC `sums` (rows (1, b l, w), col):
    into[1] and into[2]'s memory when they can be, else new arrays. The kernel writes every row of dB and dC."""

    def __init__(self, x, dt, B, into):
        b, l, h, p = x.shape
        g, n = B.shape[2], B.shape[3]
        dtype = x.dtype
        self.into = into
        self.dx = into[0]
        self.dx_rows = None if self.dx is None else _rows_in_place(self.dx)
        if self.dx_rows is None:                                        # a new array (copied into into[0] after)
            self.dx = heap_reuse.empty(x.shape, x.dtype)
            self.dx_rows = _rows_of(self.dx)
        self.ddt = np.empty_like(dt)
        self.dA_parts, self.dD_parts = np.empty((b, h), dtype), np.empty((b, h), dtype)
        self.sums = []
        for target in into[1:]:
            rows = _rows_in_place(target) if target is not None else None
            if rows is not None:
                self.sums.append((rows[0][None], rows[1]))
            else:
                self.sums.append((np.empty((1, b * l, g * n), dtype), 0))   # every row written by its item
        self.d_initial = np.empty((b, h, p, n), dtype)

    def gradients(self, B_shape, has_D: bool, had_initial: bool) -> tuple:
        """(dx, ddt, dA, dB, dC, dD | None, d_initial | None) once the kernel has run: dx copied into into[0] if it
        could not be written there, dB and dC copied into into[1:] when given and not written there."""
        dx = self.dx
        if self.into[0] is not None and dx is not self.into[0]:
            self.into[0][...] = dx
            dx = self.into[0]
        dB, dC = (_summed(parts, col, B_shape, target) for (parts, col), target in zip(self.sums, self.into[1:]))
        return (dx, self.ddt, self.dA_parts.sum(0), dB, dC, self.dD_parts.sum(0) if has_D else None,
                self.d_initial if had_initial else None)


def _rows_in_place(a: np.ndarray) -> tuple | None:
    """`_rows_of(a)` when its rows are a's own memory (so the kernel's writes land in a), else None."""
    rows, col = _rows_of(a)
    return (rows, col) if np.may_share_memory(rows, a) and a.flags.writeable else None


def _summed(parts: np.ndarray, col: int, shape: tuple, target) -> np.ndarray:
    """The kernel's dB or dC: parts (1, b l, w), its (b, l, g, n) at column col; in `target` when given (where
    the kernel already wrote it if it could)."""
    if target is not None and np.may_share_memory(parts, target):
        return target
    width = int(np.prod(shape[2:]))
    total = parts[0][:, col:col + width].reshape(shape)
    if target is None:
        return total
    target[...] = total
    return target
