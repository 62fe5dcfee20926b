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
levels: first the states entering each block of SUB_STEPS steps (c_sub = chunk_size / SUB_STEPS of them), then,
block by block from the last, the block's SUB_STEPS states, so the buffer that the reverse sweep reads stays in
the L2 cache (32 x 64 x 64 float32 = 512 KiB).

Parallel over work items with prange: (batch, head) in the forward; (batch, group, slice of the group's heads)
in the backward, since the heads of a group add into the same dB and dC (slices > 1 only when b g is smaller
than the number of threads; each slice then has its own dB, dC summed afterwards).

The math of one row i of the state is written once, in the plain functions `state_row_step`,
`output_row_step` and `adjoint_row_step` (1-D arrays and scalars, no allocation): numba compiles them inline
here, and a GPU backend can compile the same functions as device functions.
"""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np

try:
    import numba
    from numba import njit, prange
except ImportError:  # the backend reports itself unavailable
    numba = None

BLOCK_BYTES = 1 << 20   # the backward recomputes states in blocks of at most this many bytes: it is read in
                        # the reverse sweep right after being written, so it should stay in the L2 cache
FASTMATH = {"reassoc", "contract", "nsz"}   # lets LLVM vectorise the dot products; keeps inf/NaN semantics
PARALLEL_MIN_WORK = 1 << 18   # below this many b l h p n, one thread: waking the others costs more (tens of us
                              # to ms on a busy machine) than the whole scan


# --- the math, written once: one row i of the state, as plain functions ------------------------------------

def state_row_step(S_prev_row, a, u, B_t, S_row):
    """S_t[i, :] = a_t S_{t-1}[i, :] + u B_t into S_row (may be S_prev_row itself); u = dt_t x_t[i].
    S_prev_row, B_t, S_row (n,)."""
    for j in range(S_row.shape[0]):
        S_row[j] = a * S_prev_row[j] + u * B_t[j]


def output_row_step(S_row, a, u, B_t, C_t):
    """`state_row_step`, then returns y_t[i] - D x_t[i] = S_t[i, :] . C_t. S_row, B_t, C_t (n,)."""
    acc = S_row.dtype.type(0)                                           # in the state's dtype
    for j in range(S_row.shape[0]):
        s = a * S_row[j] + u * B_t[j]
        S_row[j] = s
        acc += s * C_t[j]
    return acc


def adjoint_row_step(G_row, S_prev_row, a, dy_i, x_i, B_t, C_t, dB_acc, dC_acc):
    """Row i of one reverse step. G_row (n,) holds a_{t+1} G_{t+1}[i, :] on entry and a_t G_t[i, :] on exit.
    With G_t[i, :] = G_row + dy_t[i] C_t, adds G_t[i, :] x_t[i] to dB_acc and S_{t-1}[i, :] dy_t[i] to dC_acc
    (both (n,)), and returns (G_t[i, :] . B_t, G_t[i, :] . S_{t-1}[i, :])."""
    gb = G_row.dtype.type(0)
    gs = G_row.dtype.type(0)
    for j in range(G_row.shape[0]):
        g_ = G_row[j] + dy_i * C_t[j]
        gb += g_ * B_t[j]
        gs += g_ * S_prev_row[j]
        dB_acc[j] += g_ * x_i
        dC_acc[j] += S_prev_row[j] * dy_i
        G_row[j] = a * g_
    return gb, gs


if numba is not None:
    _jit_inline = njit(inline="always", fastmath=FASTMATH, cache=True)
    _state_row_step = _jit_inline(state_row_step)
    _output_row_step = _jit_inline(output_row_step)
    _adjoint_row_step = _jit_inline(adjoint_row_step)

    @_jit_inline
    def _advance(S_prev, x, dt, A, B, bi, hi, gi, t, S):
        """S (p, n) <- the state after step t of head hi, from S_prev (p, n) before it (S may be S_prev)."""
        a = np.exp(dt[bi, t, hi] * A[hi])
        B_t = B[bi, t, gi]
        for i in range(S.shape[0]):
            _state_row_step(S_prev[i], a, dt[bi, t, hi] * x[bi, t, hi, i], B_t, S[i])

    @njit(parallel=True, fastmath=FASTMATH, cache=True)
    def forward_kernel(x, dt, A, B, C, D, S0, q, y, final_state, checkpoints):
        """The scan, per (batch, head) work item, one step at a time (a_t = exp(dt_t A_i), group gi = i // r):
            S_t = a_t S_{t-1} + dt_t x_t B_t^T  (p, n);   y_t = S_t C_t + D_i x_t  (p,);   S_0 = S0.
        Fills y (b, l, h, p), final_state (b, h, p, n) = S_l and checkpoints (b, h, c, p, n): the state entering
        each chunk of q steps (checkpoints[:, :, 0] = S0). x (b, l, h, p), dt (b, l, h), A, D (h,),
        B, C (b, l, g, n), S0 (b, h, p, n); all C-contiguous, one dtype."""
        b, l, h, p = x.shape
        g = B.shape[2]
        r = h // g
        for w in prange(b * h):
            bi, hi = w // h, w % h
            gi = hi // r
            S = S0[bi, hi].copy()                                       # (p, n)
            for t in range(l):
                if t % q == 0:
                    checkpoints[bi, hi, t // q] = S
                a = np.exp(dt[bi, t, hi] * A[hi])
                B_t, C_t = B[bi, t, gi], C[bi, t, gi]                   # (n,), (n,)
                for i in range(p):
                    x_i = x[bi, t, hi, i]
                    y[bi, t, hi, i] = _output_row_step(S[i], a, dt[bi, t, hi] * x_i, B_t, C_t) + D[hi] * x_i
            final_state[bi, hi] = S

    @njit(parallel=True, fastmath=FASTMATH, cache=True)
    def backward_kernel(x, dt, A, B, C, D, checkpoints, dy, d_final, q, sub, slices,
                        dx, ddt, dA_parts, dB_parts, dC_parts, dD_parts, d_initial):
        """The reverse sweep of the adjoint G_t = dL/dS_t (p, n), from G_l = d_final down to t = 1:
            G_t = a_{t+1} G_{t+1} + dy_t C_t^T;   dx_t = dt_t G_t B_t + D_i dy_t;   dB_t += dt_t G_t^T x_t;
            dC_t += a_t S_{t-1}^T dy_t + dt_t (x_t . dy_t) B_t;   ddt_t = x_t . G_t B_t + A_i a_t <G_t, S_{t-1}>;
            dA_i += dt_t a_t <G_t, S_{t-1}>;   dD_i += x_t . dy_t;   d_initial = a_1 G_1,
        with S_{t-1} recomputed from the checkpoints of `forward_kernel`: per chunk of q steps (from the last),
        first the states entering its blocks of `sub` steps, then per block (from the last) its sub states.
        Work item: (batch, group, slice of the group's r heads: every slices-th head). Inputs as
        `forward_kernel`, dy (b, l, h, p), d_final (b, h, p, n). Fills dx (b, l, h, p), ddt (b, l, h),
        d_initial (b, h, p, n), and partial sums the caller adds up: dA_parts, dD_parts (b, h) over batches;
        dB_parts, dC_parts (slices, b, l, g, n), zeroed on entry, over slices."""
        b, l, h, p = x.shape
        g, n = B.shape[2], B.shape[3]
        r = h // g
        c = checkpoints.shape[2]
        zero = x.dtype.type(0)
        for w in prange(b * g * slices):
            bi, gi, si = w // (g * slices), (w // slices) % g, w % slices
            G = np.empty((p, n), x.dtype)                               # the adjoint of the state
            block_starts = np.empty((-(-q // sub), p, n), x.dtype)      # states entering each block of a chunk
            states = np.empty((sub, p, n), x.dtype)                     # S_{t-1} for the steps of one block
            dB_acc, dC_acc = np.empty(n, x.dtype), np.empty(n, x.dtype)
            for hi in range(gi * r + si, (gi + 1) * r, slices):
                G[:] = d_final[bi, hi]
                dA_sum, dD_sum = zero, zero
                for k in range(c - 1, -1, -1):
                    t0, t1 = k * q, min(l, (k + 1) * q)
                    blocks = -(-(t1 - t0) // sub)
                    block_starts[0] = checkpoints[bi, hi, k]
                    for m in range(1, blocks):
                        _advance(block_starts[m - 1], x, dt, A, B, bi, hi, gi, t0 + (m - 1) * sub, block_starts[m])
                        for t in range(t0 + (m - 1) * sub + 1, t0 + m * sub):
                            _advance(block_starts[m], x, dt, A, B, bi, hi, gi, t, block_starts[m])
                    for m in range(blocks - 1, -1, -1):
                        s0, s1 = t0 + m * sub, min(t1, t0 + (m + 1) * sub)
                        states[0] = block_starts[m]
                        for t in range(s0 + 1, s1):
                            _advance(states[t - s0 - 1], x, dt, A, B, bi, hi, gi, t - 1, states[t - s0])
                        for t in range(s1 - 1, s0 - 1, -1):
                            S_prev = states[t - s0]                     # (p, n) S_{t-1}
                            dt_t = dt[bi, t, hi]
                            a = np.exp(dt_t * A[hi])
                            B_t, C_t = B[bi, t, gi], C[bi, t, gi]
                            dB_acc[:] = 0.0
                            dC_acc[:] = 0.0
                            x_dot_gb, gs, x_dot_dy = zero, zero, zero
                            for i in range(p):
                                x_i, dy_i = x[bi, t, hi, i], dy[bi, t, hi, i]
                                gb_i, gs_i = _adjoint_row_step(G[i], S_prev[i], a, dy_i, x_i, B_t, C_t, dB_acc, dC_acc)
                                dx[bi, t, hi, i] = dt_t * gb_i + D[hi] * dy_i
                                x_dot_gb += x_i * gb_i
                                x_dot_dy += x_i * dy_i
                                gs += gs_i
                            ddt[bi, t, hi] = x_dot_gb + A[hi] * a * gs
                            dA_sum += dt_t * a * gs
                            dD_sum += x_dot_dy
                            for j in range(n):
                                dB_parts[si, bi, t, gi, j] += dt_t * dB_acc[j]
                                dC_parts[si, bi, t, gi, j] += a * dC_acc[j] + dt_t * x_dot_dy * B_t[j]
                dA_parts[bi, hi] = dA_sum
                dD_parts[bi, hi] = dD_sum
                d_initial[bi, hi] = G


def available() -> bool:
    return numba is not None


def _contiguous(*arrays):
    """C-contiguous and writeable (a read-only array is another numba type: one more compilation)."""
    return tuple(np.require(a, requirements="CW") for a in arrays)


def forward(x, dt, A, B, C, D, initial_state, chunk_size):
    """The registry's kernel forward: arrays in (one float dtype, validated by `ssd`), (y, final_state, saved) out.
    saved = (x, dt, A, B, C, D or an empty array, checkpoints, [chunk length q, whether an initial state was given])."""
    b, l, h, p = x.shape
    n = B.shape[3]
    q = int(min(chunk_size, l))
    c = -(-l // q)
    dtype = x.dtype
    D_or_zeros = np.zeros(h, dtype) if D is None else D
    S0 = np.zeros((b, h, p, n), dtype) if initial_state is None else initial_state
    y = np.empty((b, l, h, p), dtype)
    final_state = np.empty((b, h, p, n), dtype)
    checkpoints = np.empty((b, h, c, p, n), dtype)                      # (b, h, c, p, n): c states, not l
    with _threads(_thread_count(b * l * h * p * n)):
        forward_kernel(*_contiguous(x, dt, A, B, C, D_or_zeros, S0), q, y, final_state, checkpoints)
    return y, final_state, (x, dt, A, B, C, D if D is not None else np.zeros(0, dtype), checkpoints,
                            np.array([q, initial_state is not None]))


def backward(saved, dy, d_final_state):
    """The registry's kernel backward: (saved, dy, d final_state) -> (dx, ddt, dA, dB, dC, dD|None, d_initial|None)."""
    x, dt, A, B, C, D, checkpoints, (q, had_initial) = saved
    b, l, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    q = int(q)
    dtype = x.dtype
    threads = _thread_count(b * l * h * p * n)
    slices = _head_slices(b, g, h // g, threads)
    dx, ddt = np.empty_like(x), np.empty_like(dt)
    dA_parts, dD_parts = np.empty((b, h), dtype), np.empty((b, h), dtype)
    dB_parts, dC_parts = np.zeros((slices, b, l, g, n), dtype), np.zeros((slices, b, l, g, n), dtype)
    d_initial = np.empty((b, h, p, n), dtype)
    D_or_zeros = D if D.size else np.zeros(h, dtype)
    with _threads(threads):
        backward_kernel(*_contiguous(x, dt, A, B, C, D_or_zeros, checkpoints, dy.astype(dtype, copy=False),
                                     d_final_state.astype(dtype, copy=False)),
                        q, _block_steps(q, p * n * dtype.itemsize), slices, dx, ddt, dA_parts, dB_parts, dC_parts,
                        dD_parts, d_initial)
    dB, dC = (dB_parts[0], dC_parts[0]) if slices == 1 else (dB_parts.sum(0), dC_parts.sum(0))
    return (dx, ddt, dA_parts.sum(0), dB, dC, dD_parts.sum(0) if D.size else None,
            d_initial if had_initial else None)



def _block_steps(q: int, state_bytes: int) -> int:
    """Steps per recomputed block: as many (p, n) states as fit in BLOCK_BYTES, at most a chunk's q."""
    return max(1, min(q, BLOCK_BYTES // state_bytes))


def _head_slices(b: int, g: int, r: int, threads: int) -> int:
    """How many slices to cut each group's r heads into, so the backward's b g slices work items keep every
    thread busy (each slice past the first costs one more (b, l, g, n) buffer for dB and one for dC)."""
    return int(min(r, -(-threads // (b * g))))


def _thread_count(work: int) -> int:
    return 1 if work < PARALLEL_MIN_WORK else numba.get_num_threads()


@contextmanager
def _threads(count: int):
    """Run the kernels inside on `count` of numba's threads, then restore the caller's setting."""
    before = numba.get_num_threads()
    numba.set_num_threads(count)
    try:
        yield
    finally:
        numba.set_num_threads(before)
