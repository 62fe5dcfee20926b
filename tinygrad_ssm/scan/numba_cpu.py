"""The SSD scan's forward as a numba CPU kernel: the recurrence, float32 and float64, and the machinery the CPU
backend's kernels share (inputs read in place as rows, work items claimed by every thread). The backward is
numba_chunked.py's; the two make the "numba_chunked" backend.

Per batch bi and head i (group gi = i // r, r = h / g heads per group), with a_t = exp(dt_t A_i):

    S_t = a_t S_{t-1} + dt_t x_t B_t^T        (p, n)      S_0 = initial_state (zeros if None)
    y_t = S_t C_t + D_i x_t                   (p,)

Why a recurrence and not the chunked matmuls of reference.py: at p = n = 64 a step of the recurrence is 2 p n
multiply-adds on a (p, n) state that stays in the L1 cache, and a chunked forward measured no faster
(docs/kernels.md). Memory: the forward saves the state entering every chunk of `chunk_size` steps,
(b, h, c, p, n) with c = ceil(l / chunk_size), never a state per step: the backward starts each chunk from it.

Parallel over (batch, head) work items that every thread claims from one atomic counter (`_on_threads`).
Inside a work item the state is held as ROWS = 4 planes (see below) and each pass over it takes four rows at
once; the math of those four rows is written once, in the plain function `output_rows_step`, which numba
compiles inline into the kernel.
"""
from __future__ import annotations

import numpy as np

from ..fast import heap_reuse
from ..fast.claims import claim_from_end, sync_array
from ..fast.row_blocks import as_rows, on_threads

import numba
from numba import njit

FASTMATH = {"reassoc", "contract", "nsz"}   # lets LLVM vectorise the dot products; keeps inf/NaN semantics
ROWS = 4   # rows of the state per pass (the functions below are written for 4)
PARALLEL_MIN_WORK = 1 << 18   # below this many b l h p n, one thread: waking the others costs more (tens of us
                              # to ms on a busy machine) than the whole scan


# --- the math, written once: a block of ROWS rows of the state, as plain functions --------------------------
#
# The state (p, n) is held as ROWS planes of pq = ceil(p / ROWS) rows, (ROWS, pq, n): row i = r pq + k is
# S[r, k], so S.reshape(ROWS pq, n)[:p] is the (p, n) state. A pass takes the ROWS rows k, pq + k, 2 pq + k,
# 3 pq + k of block k together: B_t and C_t are loaded once per
# four rows, and each row's dot product is one more accumulator in flight. The rows come from separate planes
# because LLVM vectorised the loop over n for those, but not for four adjacent rows of one (p, n) array (which
# ran 1.5x slower than one row at a time). Rows past p (when ROWS does not divide p) are zero and stay zero:
# their x is taken as 0, and their y is not stored.

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


_jit_inline = njit(inline="always", fastmath=FASTMATH, cache=True)
_output_rows_step = _jit_inline(output_rows_step)

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
    y = heap_reuse.empty((b, l, h, p), dtype)
    final_state = np.empty((b, h, p, n), dtype)
    checkpoints = heap_reuse.empty((b, h, c, p, n), dtype)              # (b, h, c, p, n): c states, not l
    A, D_or_zeros, S0 = _contiguous(A, D_or_zeros, S0)
    _on_threads(forward_kernel, (*_rows_of(x), *_rows_of(dt), A, *_rows_of(B), *_rows_of(C), D_or_zeros, S0, B.shape[2],
                                 q, y, final_state, checkpoints), _thread_count(b * l * h * p * n))
    return y, final_state, (x, dt, A, B, C, D if D is not None else np.zeros(0, dtype), checkpoints,
                            np.array([q, initial_state is not None]))


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
