"""The SSD scan as numba CPU kernels: a recomputing recurrent scan, forward and backward, float32 and float64.

Per batch bi and head i (group gi = i // r, r = h / g heads per group), with a_t = exp(dt_t A_i):

    S_t = a_t S_{t-1} + dt_t x_t B_t^T        (p, n)      S_0 = initial_state (zeros if None)
    y_t = S_t C_t + D_i x_t                   (p,)

Backward: the adjoint G_t = dL/dS_t runs the other way, from G_l = d final_state:

    G_t     = a_{t+1} G_{t+1} + dy_t C_t^T                      (the first term is what step t+1 passed back)
    dx_t    = dt_t G_t B_t + D_i dy_t            dB_t += dt_t G_t^T x_t       (summed over the r heads of a group)
    dC_t   += S_t^T dy_t = a_t S_{t-1}^T dy_t + dt_t (x_t . dy_t) B_t
    ddt_t   = x_t . (G_t B_t) + A_i a_t <G_t, S_{t-1}>      dA_i += dt_t a_t <G_t, S_{t-1}>
    dD_i   += x_t . dy_t                         d initial_state = a_1 G_1 (= what step 1 passes back)

Why a recurrence and not the chunked matmuls of reference.py: at p = n = 64 a step of the recurrence is 2 p n
multiply-adds forward and ~6 p n backward on a (p, n) state that stays in the L1 cache, fewer than the chunked
form's (q p + 2 p n + q n / r) per step at q = 64, and numba has no BLAS without SciPy (see docs/kernels.md).

Memory: the forward saves the state entering every chunk of `chunk_size` steps, (b, h, c, p, n) with
c = ceil(l / chunk_size), never a state per step. The backward recomputes each chunk from its checkpoint in two
levels: first the states entering each block of `_block_steps` steps, then, block by block from the last, the
block's states, so the buffer that the reverse sweep reads stays in the L2 cache (BLOCK_BYTES).

Parallel over work items that every thread claims from one atomic counter (`_on_threads`): (batch, head) in the
forward; (batch, group, slice of the group's heads) in the backward, since the heads of a group add into the same
dB and dC (slices > 1 only when b g is smaller than the number of threads; each slice then has its own dB, dC
summed afterwards).

Inside a work item the state is held as ROWS = 4 planes (see below) and each pass over it takes four rows at
once. The math of those four rows is written once, in the plain functions `output_rows_step` (a forward step
and its outputs) and `adjoint_rows_step` (a reverse step), and of one row in `state_row_step` (the backward's
recompute); numba compiles them inline into both kernels.
"""
from __future__ import annotations

import numpy as np

from ..fast.claims import claim_from_end, sync_array
from ..fast.row_blocks import as_rows, on_threads

import numba
from numba import njit

BLOCK_BYTES = 1 << 20   # the backward recomputes states in blocks of at most this many bytes: it is read in
                        # the reverse sweep right after being written, so it should stay in the L2 cache
FASTMATH = {"reassoc", "contract", "nsz"}   # lets LLVM vectorise the dot products; keeps inf/NaN semantics
ROWS = 4   # rows of the state per pass (the functions below are written for 4)
PARALLEL_MIN_WORK = 1 << 18   # below this many b l h p n, one thread: waking the others costs more (tens of us
                              # to ms on a busy machine) than the whole scan


# --- the math, written once: a block of ROWS rows of the state, as plain functions --------------------------
#
# The state (p, n) is held as ROWS planes of pq = ceil(p / ROWS) rows, (ROWS, pq, n): row i = r pq + k is
# S[r, k], so S.reshape(ROWS pq, n)[:p] is the (p, n) state. A pass takes the ROWS rows k, pq + k, 2 pq + k,
# 3 pq + k of block k together: B_t and C_t (and, backward, the dB and dC rows being summed) are loaded once per
# four rows, and each row's dot product is one more accumulator in flight. The rows come from separate planes
# because LLVM vectorised the loop over n for those, but not for four adjacent rows of one (p, n) array (which
# ran 1.5x slower than one row at a time). Rows past p (when ROWS does not divide p) are zero and stay zero:
# their x and dy are taken as 0, and their y and dx are not stored.

def state_row_step(S_prev_row, a, u, B_t, S_row):
    """S_t[i, :] = a_t S_{t-1}[i, :] + u B_t into S_row (may be S_prev_row itself); u = dt_t x_t[i].
    S_prev_row, B_t, S_row (n,). One row at a time: the same update four rows per pass, from one array of planes
    into another, ran 2x slower (measured over a block of 64 states at p = n = 64)."""
    for j in range(S_row.shape[0]):
        S_row[j] = a * S_prev_row[j] + u * B_t[j]


def output_rows_step(S, k, a, u, B_t, C_t):
    """S_t[i, :] = a_t S_{t-1}[i, :] + u_i B_t in place for the ROWS rows i of block k of S (ROWS, pq, n), then
    returns the four y_t[i] - D x_t[i] = S_t[i, :] . C_t. u: the 4-tuple of dt_t x_t[i]; B_t, C_t (n,)."""
    u0, u1, u2, u3 = u
    y0 = y1 = y2 = y3 = S.dtype.type(0)                                 # in the state's dtype
    for j in range(S.shape[2]):
        b_, c_ = B_t[j], C_t[j]
        s0 = a * S[0, k, j] + u0 * b_
        s1 = a * S[1, k, j] + u1 * b_
        s2 = a * S[2, k, j] + u2 * b_
        s3 = a * S[3, k, j] + u3 * b_
        S[0, k, j], S[1, k, j], S[2, k, j], S[3, k, j] = s0, s1, s2, s3
        y0 += s0 * c_
        y1 += s1 * c_
        y2 += s2 * c_
        y3 += s3 * c_
    return y0, y1, y2, y3


def adjoint_rows_step(G, S_prev, k, a, dy, x, B_t, C_t, dB_acc, dC_acc):
    """One reverse step of the ROWS rows i of block k. G (ROWS, pq, n) holds a_{t+1} G_{t+1}[i, :] on entry and
    a_t G_t[i, :] on exit. With G_t[i, :] = G[i] + dy_t[i] C_t, adds sum_i G_t[i, :] x_t[i] to dB_acc and
    sum_i S_{t-1}[i, :] dy_t[i] to dC_acc (both (n,)), and returns the four G_t[i, :] . B_t and then
    sum_i G_t[i, :] . S_{t-1}[i, :]. dy, x: 4-tuples of dy_t[i], x_t[i]."""
    dy0, dy1, dy2, dy3 = dy
    x0, x1, x2, x3 = x
    gb0 = gb1 = gb2 = gb3 = gs = G.dtype.type(0)
    for j in range(G.shape[2]):
        b_, c_ = B_t[j], C_t[j]
        p0, p1, p2, p3 = S_prev[0, k, j], S_prev[1, k, j], S_prev[2, k, j], S_prev[3, k, j]
        g0 = G[0, k, j] + dy0 * c_
        g1 = G[1, k, j] + dy1 * c_
        g2 = G[2, k, j] + dy2 * c_
        g3 = G[3, k, j] + dy3 * c_
        gb0 += g0 * b_
        gb1 += g1 * b_
        gb2 += g2 * b_
        gb3 += g3 * b_
        gs += g0 * p0 + g1 * p1 + g2 * p2 + g3 * p3
        dB_acc[j] += g0 * x0 + g1 * x1 + g2 * x2 + g3 * x3
        dC_acc[j] += p0 * dy0 + p1 * dy1 + p2 * dy2 + p3 * dy3
        G[0, k, j], G[1, k, j], G[2, k, j], G[3, k, j] = a * g0, a * g1, a * g2, a * g3
    return gb0, gb1, gb2, gb3, gs


_jit_inline = njit(inline="always", fastmath=FASTMATH, cache=True)
_state_row_step = _jit_inline(state_row_step)
_output_rows_step = _jit_inline(output_rows_step)
_adjoint_rows_step = _jit_inline(adjoint_rows_step)

@_jit_inline
def _rows(v, k, pq):
    """The 4-tuple v[k], v[pq + k], v[2 pq + k], v[3 pq + k] of a (p,) vector: the rows of block k, 0 past p."""
    p, zero = v.shape[0], v.dtype.type(0)
    return (v[k], v[pq + k] if pq + k < p else zero, v[2 * pq + k] if 2 * pq + k < p else zero,
            v[3 * pq + k] if 3 * pq + k < p else zero)

@_jit_inline
def _store_rows(out, k, pq, values):
    """out[r pq + k] = values[r] for the rows r pq + k < p of block k; out (p,)."""
    p = out.shape[0]
    for r in range(ROWS):
        if r * pq + k < p:
            out[r * pq + k] = values[r]

@_jit_inline
def _piece(rows, col, width, row, i):
    """Piece i (a head's p values, a group's n) of step `row` (= bi l + t) of an input read in place:
    rows[row, col + i width : col + (i + 1) width], contiguous (see `_rows_of`)."""
    start = col + i * width
    return rows[row, start:start + width]

@_jit_inline
def _advance(S_prev, x, xc, dt, dtc, A, B, Bc, p, row, hi, gi, S):
    """S <- the state after the step in `row` (= bi l + t) of head hi, from S_prev before it (S may be
    S_prev); both the (ROWS pq, n) row view of the planes, whose rows past p stay zero."""
    dt_t = dt[row, dtc + hi]
    a = np.exp(dt_t * A[hi])
    B_t = _piece(B, Bc, S.shape[1], row, gi)                        # (n,)
    x_t = _piece(x, xc, p, row, hi)                                 # (p,)
    for i in range(x_t.shape[0]):
        _state_row_step(S_prev[i], a, dt_t * x_t[i], B_t, S[i])

@njit(nogil=True, fastmath=FASTMATH, cache=True)
def forward_kernel(x, xc, dt, dtc, A, B, Bc, C, Cc, D, S0, g, q, y, final_state, checkpoints, claims, share):
    """The scan, per (batch, head) work item, one step at a time (a_t = exp(dt_t A_i), group gi = i // r):
        S_t = a_t S_{t-1} + dt_t x_t B_t^T  (p, n);   y_t = S_t C_t + D_i x_t  (p,);   S_0 = S0.
    Fills y (b, l, h, p), final_state (b, h, p, n) = S_l and checkpoints (b, h, c, p, n): the state entering
    each chunk of q steps (checkpoints[:, :, 0] = S0). x, dt, B, C as rows read in place (`_rows_of`):
    x (b, l, h, p) = x[:, xc:xc + h p], dt (b, l, h) = dt[:, dtc:dtc + h], B, C (b, l, g, n) = B[:, Bc:Bc + g n],
    C[:, Cc:Cc + g n], reshaped; A, D (h,), S0 (b, h, p, n) or (0, h, p, n) for zeros; all C-contiguous, one
    dtype. Each thread that runs the kernel claims work items w = bi h + hi from the counter `claims` until none
    is left, from the front (share 0, the caller) or from the back (`_on_threads`)."""
    b, l, h, p = y.shape
    n = S0.shape[3]
    r = h // g
    pq = -(-p // ROWS)
    S = np.zeros((ROWS, pq, n), x.dtype)                            # the state as planes, rows past p zero
    S_rows = S.reshape((ROWS * pq, n))[:p]                          # (p, n) view: row i = S[i // pq, i % pq]
    while True:
        w = claim_from_end(claims, b * h, share > 0)                # the next (batch, head), or -1: all taken
        if w < 0:
            break
        bi, hi = w // h, w % h
        gi = hi // r
        if S0.shape[0]:
            S_rows[:] = S0[bi, hi]
        else:                                                       # no initial state: zeros
            S_rows[:] = 0.0
        for t in range(l):
            if t % q == 0:
                checkpoints[bi, hi, t // q] = S_rows
            row = bi * l + t
            dt_t = dt[row, dtc + hi]
            a = np.exp(dt_t * A[hi])
            B_t, C_t = _piece(B, Bc, n, row, gi), _piece(C, Cc, n, row, gi)  # (n,), (n,)
            x_t, y_t = _piece(x, xc, p, row, hi), y[bi, t, hi]              # (p,), (p,)
            for k in range(pq):
                x0, x1, x2, x3 = _rows(x_t, k, pq)
                y0, y1, y2, y3 = _output_rows_step(S, k, a, (dt_t * x0, dt_t * x1, dt_t * x2, dt_t * x3), B_t, C_t)
                _store_rows(y_t, k, pq, (y0 + D[hi] * x0, y1 + D[hi] * x1, y2 + D[hi] * x2, y3 + D[hi] * x3))
        final_state[bi, hi] = S_rows

@njit(nogil=True, fastmath=FASTMATH, cache=True)
def backward_kernel(x, xc, dt, dtc, A, B, Bc, C, Cc, D, checkpoints, dy, dyc, d_final, g, q, sub, slices,
                    dx, dxc, ddt, dA_parts, dB_parts, dBc, dC_parts, dCc, dD_parts, d_initial, claims, share):
    """The reverse sweep of the adjoint G_t = dL/dS_t (p, n), from G_l = d_final down to t = 1:
        G_t = a_{t+1} G_{t+1} + dy_t C_t^T;   dx_t = dt_t G_t B_t + D_i dy_t;   dB_t += dt_t G_t^T x_t;
        dC_t += a_t S_{t-1}^T dy_t + dt_t (x_t . dy_t) B_t;   ddt_t = x_t . G_t B_t + A_i a_t <G_t, S_{t-1}>;
        dA_i += dt_t a_t <G_t, S_{t-1}>;   dD_i += x_t . dy_t;   d_initial = a_1 G_1,
    with S_{t-1} recomputed from the checkpoints of `forward_kernel`: per chunk of q steps (from the last),
    first the states entering its blocks of `sub` steps, then per block (from the last) its sub states.
    Work item: (batch, group, slice of the group's r heads: every slices-th head), claimed from `claims` as in
    `forward_kernel`. Inputs as `forward_kernel`, dy (b, l, h, p) = dy[:, dyc:dyc + h p] in place too,
    d_final (b, h, p, n).
    Fills dx (b, l, h, p) = dx[:, dxc:dxc + h p] (rows too, like the inputs), ddt (b, l, h), d_initial (b, h, p, n),
    and partial sums the caller adds up: dA_parts, dD_parts (b, h) over batches; dB_parts[si], dC_parts[si]
    (slices, b l, width) with (b, l, g, n) = dB_parts[si][:, dBc:dBc + g n] reshaped, summed over
    slices (each item zeroes its own rows of them first: the caller passes them uninitialised)."""
    b, l, h = ddt.shape
    p, n = d_final.shape[2], d_final.shape[3]
    r = h // g
    c = checkpoints.shape[2]
    pq = -(-p // ROWS)
    zero = x.dtype.type(0)
    # the adjoint and the recomputed states, as planes (ROWS, pq, n) whose rows past p are zero and stay zero
    # (nothing writes them), so one set per thread serves all its work items
    G = np.zeros((ROWS, pq, n), x.dtype)
    block_starts = np.zeros((-(-q // sub), ROWS, pq, n), x.dtype)  # states entering each block of a chunk
    states = np.zeros((sub, ROWS, pq, n), x.dtype)                  # S_{t-1} for the steps of one block
    G_rows = G.reshape((ROWS * pq, n))[:p]                          # (p, n) view
    start_rows = block_starts.reshape((-1, ROWS * pq, n))           # (blocks, ROWS pq, n) row views
    state_rows = states.reshape((sub, ROWS * pq, n))
    dB_acc, dC_acc = np.empty(n, x.dtype), np.empty(n, x.dtype)
    while True:
        w = claim_from_end(claims, b * g * slices, share > 0)
        if w < 0:
            break
        bi, gi, si = w // (g * slices), (w // slices) % g, w % slices
        for t in range(l):                                          # this item's rows of dB and dC: it adds
            _piece(dB_parts[si], dBc, n, bi * l + t, gi)[:] = 0.0   # into them below, and no other item
            _piece(dC_parts[si], dCc, n, bi * l + t, gi)[:] = 0.0   # touches them
        for hi in range(gi * r + si, (gi + 1) * r, slices):
            G_rows[:] = d_final[bi, hi]
            dA_sum, dD_sum = zero, zero
            for k in range(c - 1, -1, -1):
                t0, t1 = k * q, min(l, (k + 1) * q)
                blocks = -(-(t1 - t0) // sub)
                start_rows[0, :p] = checkpoints[bi, hi, k]
                for m in range(1, blocks):
                    _advance(start_rows[m - 1], x, xc, dt, dtc, A, B, Bc, p, bi * l + t0 + (m - 1) * sub, hi, gi,
                             start_rows[m])
                    for t in range(t0 + (m - 1) * sub + 1, t0 + m * sub):
                        _advance(start_rows[m], x, xc, dt, dtc, A, B, Bc, p, bi * l + t, hi, gi, start_rows[m])
                for m in range(blocks - 1, -1, -1):
                    s0, s1 = t0 + m * sub, min(t1, t0 + (m + 1) * sub)
                    states[0] = block_starts[m]
                    for t in range(s0 + 1, s1):
                        _advance(state_rows[t - s0 - 1], x, xc, dt, dtc, A, B, Bc, p, bi * l + t - 1, hi, gi,
                                 state_rows[t - s0])
                    for t in range(s1 - 1, s0 - 1, -1):
                        S_prev = states[t - s0]                     # (ROWS, pq, n) S_{t-1}
                        row = bi * l + t
                        dt_t = dt[row, dtc + hi]
                        a = np.exp(dt_t * A[hi])
                        B_t, C_t = _piece(B, Bc, n, row, gi), _piece(C, Cc, n, row, gi)   # (n,), (n,)
                        x_t, dy_t = _piece(x, xc, p, row, hi), _piece(dy, dyc, p, row, hi)  # (p,), (p,)
                        dx_t = _piece(dx, dxc, p, row, hi)          # (p,)
                        dB_acc[:] = 0.0
                        dC_acc[:] = 0.0
                        x_dot_gb, gs, x_dot_dy = zero, zero, zero
                        for kk in range(pq):
                            x0, x1, x2, x3 = _rows(x_t, kk, pq)
                            dy0, dy1, dy2, dy3 = _rows(dy_t, kk, pq)
                            gb0, gb1, gb2, gb3, gs_k = _adjoint_rows_step(
                                G, S_prev, kk, a, (dy0, dy1, dy2, dy3), (x0, x1, x2, x3), B_t, C_t, dB_acc, dC_acc)
                            _store_rows(dx_t, kk, pq, (dt_t * gb0 + D[hi] * dy0, dt_t * gb1 + D[hi] * dy1,
                                                       dt_t * gb2 + D[hi] * dy2, dt_t * gb3 + D[hi] * dy3))
                            x_dot_gb += x0 * gb0 + x1 * gb1 + x2 * gb2 + x3 * gb3
                            x_dot_dy += x0 * dy0 + x1 * dy1 + x2 * dy2 + x3 * dy3
                            gs += gs_k
                        ddt[bi, t, hi] = x_dot_gb + A[hi] * a * gs
                        dA_sum += dt_t * a * gs
                        dD_sum += x_dot_dy
                        dB_t = _piece(dB_parts[si], dBc, n, row, gi)  # (n,)
                        dC_t = _piece(dC_parts[si], dCc, n, row, gi)  # (n,)
                        for j in range(n):
                            dB_t[j] += dt_t * dB_acc[j]
                            dC_t[j] += a * dC_acc[j] + dt_t * x_dot_dy * B_t[j]
            dA_parts[bi, hi] = dA_sum
            dD_parts[bi, hi] = dD_sum
            d_initial[bi, hi] = G_rows


def _contiguous(*arrays):
    """C-contiguous and writeable (a read-only array is another numba type: one more compilation)."""
    return tuple(np.require(a, requirements="CW") for a in arrays)


def _rows_of(a: np.ndarray) -> tuple:
    """a (b, l, ...) -> (rows, col) with a.reshape(b l, w) == rows[:, col:col + w], w the size of a step: in place
    when a is a column slice of a C-contiguous array, as the model's x, B and C are (pieces of the conv's output),
    else a contiguous copy. The kernels read a step's piece as one contiguous row slice (`_piece`)."""
    b, l, w = a.shape[0], a.shape[1], int(np.prod(a.shape[2:]))
    rows, col = as_rows(a.reshape(b, l, w), a.dtype)
    if not rows.flags.writeable:                                        # see _contiguous
        rows, col = _contiguous(rows[:, col:col + w])[0], 0
    return rows, col


def forward(x, dt, A, B, C, D, initial_state, chunk_size):
    """The registry's kernel forward: arrays in (one float dtype, validated by `ssd`), (y, final_state, saved) out.
    saved = (x, dt, A, B, C, D or an empty array, checkpoints, [chunk length q, whether an initial state was given])."""
    b, l, h, p = x.shape
    n = B.shape[3]
    q = int(min(chunk_size, l))
    c = -(-l // q)
    dtype = x.dtype
    D_or_zeros = np.zeros(h, dtype) if D is None else D
    S0 = np.zeros((0, h, p, n), dtype) if initial_state is None else initial_state   # (0, ...): start from zeros
    y = np.empty((b, l, h, p), dtype)
    final_state = np.empty((b, h, p, n), dtype)
    checkpoints = np.empty((b, h, c, p, n), dtype)                      # (b, h, c, p, n): c states, not l
    A, D_or_zeros, S0 = _contiguous(A, D_or_zeros, S0)
    _on_threads(forward_kernel, (*_rows_of(x), *_rows_of(dt), A, *_rows_of(B), *_rows_of(C), D_or_zeros, S0, B.shape[2],
                                 q, y, final_state, checkpoints), _thread_count(b * l * h * p * n))
    return y, final_state, (x, dt, A, B, C, D if D is not None else np.zeros(0, dtype), checkpoints,
                            np.array([q, initial_state is not None]))


def backward(saved, dy, d_final_state, into=(None, None, None)):
    """The registry's kernel backward: (saved, dy, d final_state) -> (dx, ddt, dA, dB, dC, dD|None, d_initial|None).
    into: arrays shaped like x, B, C (or None) to write dx, dB, dC into and return, instead of new arrays; the model
    passes the pieces of the split's one gradient array (see `SSD.backward`), so the split copies nothing."""
    x, dt, A, B, C, D, checkpoints, (q, had_initial) = saved
    b, l, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    q = int(q)
    dtype = x.dtype
    threads = _thread_count(b * l * h * p * n)
    slices = _head_slices(b, g, h // g, threads)
    out = BackwardArrays(x, dt, B, into, slices)
    _on_threads(backward_kernel, (*backward_inputs(saved, dy, d_final_state), g, q,
                                  _block_steps(q, p * n * dtype.itemsize), slices, *out.dx_rows, out.ddt, out.dA_parts,
                                  *out.sums[0], *out.sums[1], out.dD_parts, out.d_initial), threads)
    return out.gradients(B.shape, D.size > 0, bool(had_initial))


def backward_inputs(saved, dy, d_final_state) -> tuple:
    """A backward kernel's first arguments, shared by this module's and numba_chunked.py's: x, dt, A, B, C, D
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
    """The arrays a backward kernel fills, shared by this module's and numba_chunked.py's backward: dx (into[0]'s
    own memory when it can be: `dx_rows`), ddt, per-batch partial sums dA_parts and dD_parts (b, h), d_initial,
    and per dB and dC `sums` (rows (slices, b l, w), col): into[1] and into[2]'s memory when they can be (one
    slice), else new arrays. The kernels zero the dB and dC rows they add into."""

    def __init__(self, x, dt, B, into, slices: int):
        b, l, h, p = x.shape
        g, n = B.shape[2], B.shape[3]
        dtype = x.dtype
        self.into = into
        self.dx = into[0]
        self.dx_rows = None if self.dx is None else _rows_in_place(self.dx)
        if self.dx_rows is None:                                        # a new array (copied into into[0] after)
            self.dx = np.empty_like(x)
            self.dx_rows = _rows_of(self.dx)
        self.ddt = np.empty_like(dt)
        self.dA_parts, self.dD_parts = np.empty((b, h), dtype), np.empty((b, h), dtype)
        self.sums = []
        for target in into[1:]:
            rows = _rows_in_place(target) if target is not None and slices == 1 else None
            if rows is not None:
                self.sums.append((rows[0][None], rows[1]))
            else:
                self.sums.append((np.empty((slices, b * l, g * n), dtype), 0))   # every row zeroed by its item
        self.d_initial = np.empty((b, h, p, n), dtype)

    def gradients(self, B_shape, has_D: bool, had_initial: bool) -> tuple:
        """(dx, ddt, dA, dB, dC, dD | None, d_initial | None) once the kernel has run: dx copied into into[0] if it
        could not be written there, dB and dC summed over slices into into[1:] when given."""
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
    """The kernel's dB or dC: parts (slices, b l, w), its (b, l, g, n) at column col, summed over slices; in
    `target` when given (where the kernel already wrote it if it could)."""
    if target is not None and np.may_share_memory(parts, target):
        return target
    width = int(np.prod(shape[2:]))
    total = (parts[0] if parts.shape[0] == 1 else parts.sum(0))[:, col:col + width].reshape(shape)
    if target is None:
        return total
    target[...] = total
    return target


def _block_steps(q: int, state_bytes: int) -> int:
    """Steps per recomputed block: as many (p, n) states as fit in BLOCK_BYTES, at most a chunk's q."""
    return max(1, min(q, BLOCK_BYTES // state_bytes))


def _head_slices(b: int, g: int, r: int, threads: int) -> int:
    """How many slices to cut each group's r heads into, so the backward's b g slices work items keep every
    thread busy (each slice past the first costs one more (b, l, g, n) buffer for dB and one for dC)."""
    return int(min(r, -(-threads // (b * g))))


def _thread_count(work: int) -> int:
    return 1 if work < PARALLEL_MIN_WORK else numba.get_num_threads()


def _on_threads(kernel, args, threads: int):
    """kernel(*args, claims, share) on `threads` threads, the caller's (share 0) and fast/row_blocks' pool's, all
    claiming work items from one counter until none is left: the caller from the front, the others from the back
    (fast/claims.claim_from_end), so the two threads work on different batches until they meet. The items go to
    whoever is running, so a thread that starts late delays nothing (with numba's prange each thread had a fixed
    half: inside a training step the scan used 1.44 of 2 cores forward and 1.83 backward, now 1.99 and 1.98; a
    whole step 0.96-0.99x, see docs/kernels.md, "Parallelism and threads"). Plain nogil kernels also
    compile in 14 s instead of prange's 33, and may run in two Python threads at once. Each item writes only its
    own outputs, so the results do not depend on which thread ran it."""
    claims = sync_array(1)

    def work(blocks, share):
        for _ in blocks:                                                # one call per thread; the later ones find
            kernel(*args, claims, share)                                # nothing left to claim
    on_threads(work, threads, threads)
