"""The SSD scan's forward as a numba CPU kernel, chunked, its products BLAS calls made inside the kernel (numba's
np.dot, through SciPy's BLAS), and the machinery the CPU backend's kernels share (inputs read in place as rows,
work items claimed by every thread). The backward is numba_chunked.py's; the two make the "numba_chunked" backend.

Per batch bi and head i (group gi = i // r, r = h / g heads per group) the scan is

    S_t = exp(dt_t A_i) S_{t-1} + dt_t x_t B_t^T        (p, n)      S_0 = initial_state (zeros if None)
    y_t = S_t C_t + D_i x_t                             (p,)

computed a piece of m <= PIECE steps at a time (reference.py's chunked form, one piece): with a_t = dt_t A_i,
X_t = dt_t x_t, s_t = a_1 + ... + a_t inside the piece and tail_t = a_{t+1} + ... + a_m (running sums, as the
backward's), and S_in the state entering the piece,

    Y = (L o C B^T) X + exp(s) o (C S_in^T) + D x       L[t, u] = exp(a_{u+1} + ... + a_t) for t >= u, else 0
    S_out = exp(s_m) S_in + (exp(tail) o X)^T B

where L's entries are running products of the steps' decays exp(a_t), so a piece takes m exps, not m^2 / 2.
Per step and head that is m p + 2 p n multiply-adds in three BLAS products (and C B^T's m n, once for the
heads of a work item). The recurrence that computed it before did 2 p n, but as a multiply and two multiply-adds
per state element with a horizontal sum per row, and took 1.3-1.7x the time of this forward without checkpoints
(1.1-1.6x with them) at the shapes of docs/kernels.md ("The forward: chunked"). For the backward the forward
keeps the state entering every chunk of q steps (each chunk cut into ceil(q / PIECE) near-equal pieces),
(b, h, c, p, n) with c = ceil(l / q), never a state per step; `inference` (numba_chunked.py) keeps none.

Work items (batch, group, block of the group's heads), claimed by every thread from one atomic counter
(`_on_threads`): a piece's C B^T is computed once per item for its heads, and there are enough items for every
thread to take several (`head_blocks`).
"""
from __future__ import annotations

import numba
import numpy as np

from ..fast import heap_reuse
from ..fast.blas_threads import refresh_libraries, single_threaded_blas
from ..fast.claims import claim_from_end, sync_array
from ..fast.jit import njit
from ..fast.row_blocks import as_rows, on_threads

FASTMATH = {"reassoc", "contract", "nsz"}   # lets LLVM vectorise the sums; keeps inf/NaN semantics
PIECE = 16   # steps per piece of the forward: at the 130M shape (n = 128) pieces of 8, 12, 16, 24, 32, 64 took
             # 0.82, 0.77, 0.73, 0.88, 0.84, 0.85x the recurrence's time (no checkpoints, 2 threads): the (m, m)
             # work grows with m, and below 16 the products are too small for BLAS to run at its rate
ITEMS_PER_THREAD = 4   # at least this many work items per thread, where the heads allow (see head_blocks)
PARALLEL_MIN_WORK = 1 << 18   # below this many b l h p n, one thread: waking the others costs more (tens of us
                              # to ms on a busy machine) than the whole scan

_jit = njit(nogil=True, fastmath=FASTMATH, cache=True)
_inline = njit(inline="always", fastmath=FASTMATH, cache=True)
_scipy_blas_loaded = False


# --- pieces of the chunked form, shared with the backward (numba_chunked.py) ---------------------------------

@_inline
def _finite(v):
    """Whether v is finite, as a comparison: under FASTMATH's reassoc, np.isfinite(u + w) was folded to True (its
    v - v == 0 test reassociated to 0), so a NaN sum read as finite (tests/scan/test_causality.py caught it)."""
    return abs(v) < np.inf


@_inline
def _decays(dt, dtc, A, hi, row0, m, a, s_incl, tail):
    """Steps row0 .. row0 + m of head hi: a_t = dt_t A, s_t = a_0 + ... + a_t, tail_t = a_{t+1} + ... +
    a_{m-1}, as running sums (never a difference of two sums: no cancellation, no -inf)."""
    acc = a.dtype.type(0)
    for i in range(m):
        a[i] = dt[row0 + i, dtc + hi] * A[hi]
        acc += a[i]
        s_incl[i] = acc
    acc = a.dtype.type(0)
    for i in range(m - 1, -1, -1):
        tail[i] = acc
        acc += a[i]

@_inline
def _copy_piece(rows, col, width, row0, m, i, out):
    """out[:m] = the (m, width) piece i of rows row0 .. row0 + m (x, dy: a head's p; B, C: a group's n): np.dot
    takes contiguous operands."""
    for t in range(m):
        src = rows[row0 + t, col + i * width:col + (i + 1) * width]
        for j in range(width):
            out[t, j] = src[j]


# --- the forward ---------------------------------------------------------------------------------------------

@_inline
def _masked_decayed_scores(scores, a, m, decays, out):
    """out (m, m) = L^T o scores: out[u, t] = exp(a_{u+1} + ... + a_t) scores[u, t] for t >= u, 0 for t < u.
    L's column u is column u + 1's times exp(a_{u+1}), one vector loop, so a piece takes m exps, not m^2 / 2;
    a product of decays underflows to 0 as the exp of their sum does. decays (>= m,): scratch, L[t, u]."""
    for u in range(m - 1, -1, -1):
        if u + 1 < m:
            step = np.exp(a[u + 1])
            decays[u + 1] = step                                        # L[u + 1, u]
            for t in range(u + 2, m):
                decays[t] *= step                                       # L[t, u] = L[t, u + 1] exp(a_{u+1})
        row, score = out[u], scores[u]
        for t in range(u):
            row[t] = 0.0
        row[u] = score[u]
        for t in range(u + 1, m):
            row[t] = decays[t] * score[t]


@_inline
def _masked_own_inputs(LT, X, m, out):
    """out[t] = sum_{u <= t} LT[u, t] X_u: (L o C B^T) X over the lower triangle only, so a non-finite X_u reaches
    y_t for t >= u alone, as in the recurrence (the product over all of LT would give 0 x NaN = NaN for t < u)."""
    for t in range(m):
        for i in range(X.shape[1]):
            acc = X.dtype.type(0)
            for u in range(t + 1):
                acc += LT[u, t] * X[u, i]
            out[t, i] = acc


@_jit
def forward_kernel(x, xc, dt, dtc, A, B, Bc, C, Cc, D, S0, g, q, blocks, y, final_state, checkpoints, claims, share):
    """The scan per work item (batch bi, group gi, block of the group's heads), chunks of q steps in order, each
    cut into pieces of at most PIECE steps (the module's docstring gives the math). Fills y (b, l, h, p),
    final_state (b, h, p, n) and, when it has room (c = ceil(l / q), else 0), checkpoints (b, h, c, p, n): the
    state entering each chunk. x, dt, B, C as rows read in place (`_rows_of`): x (b, l, h, p) = x[:, xc:xc + h p],
    dt (b, l, h) = dt[:, dtc:dtc + h], B, C (b, l, g, n) = B[:, Bc:Bc + g n], C[:, Cc:Cc + g n], reshaped; A, D (h,),
    S0 (b, h, p, n) or (0, h, p, n) for zeros; all C-contiguous, one dtype. blocks: head blocks per group."""
    b, l, h, p = y.shape
    n = final_state.shape[3]
    r = h // g
    per_block = -(-r // blocks)
    keep = checkpoints.shape[2] > 0
    dtype = y.dtype
    Xq, Xd, Ex = np.empty((PIECE, p), dtype), np.empty((PIECE, p), dtype), np.empty((PIECE, p), dtype)
    own, from_state = np.empty((PIECE, p), dtype), np.empty((PIECE, p), dtype)
    Bq, Cq = np.empty((PIECE, n), dtype), np.empty((PIECE, n), dtype)
    scores_flat, LT_flat = np.empty(PIECE * PIECE, dtype), np.empty(PIECE * PIECE, dtype)
    a, s_incl, tail, decays = (np.empty(PIECE, dtype), np.empty(PIECE, dtype), np.empty(PIECE, dtype),
                               np.empty(PIECE, dtype))
    states, S_piece = np.empty((per_block, p, n), dtype), np.empty((p, n), dtype)
    while True:
        w = claim_from_end(claims, b * g * blocks, share > 0)
        if w < 0:
            break
        bi, gi, blk = w // (g * blocks), w // blocks % g, w % blocks
        h_lo = gi * r + blk * per_block
        heads = min(per_block, gi * r + r - h_lo)                       # the last block may hold fewer, or none
        for j in range(heads):
            if S0.shape[0]:
                states[j] = S0[bi, h_lo + j]
            else:                                                       # no initial state: zeros
                states[j] = 0.0
        for k in range(-(-l // q)):
            t0 = k * q
            m_chunk = min(q, l - t0)
            if keep:                                                    # row by row: as one (p, n) assignment
                for j in range(heads):                                  # the copy took ~1.3x as long
                    kept, state = checkpoints[bi, h_lo + j, k], states[j]
                    for i in range(p):
                        kept_i, state_i = kept[i], state[i]
                        for jj in range(n):
                            kept_i[jj] = state_i[jj]
            pieces = -(-m_chunk // PIECE)
            for piece in range(pieces):
                start = t0 + piece * m_chunk // pieces
                m = t0 + (piece + 1) * m_chunk // pieces - start
                row0 = bi * l + start
                _copy_piece(B, Bc, n, row0, m, gi, Bq)
                _copy_piece(C, Cc, n, row0, m, gi, Cq)
                scores, LT = scores_flat[:m * m].reshape((m, m)), LT_flat[:m * m].reshape((m, m))   # contiguous
                np.dot(Bq[:m], Cq[:m].T, scores)                        # (m, m) B_u . C_t, for every head
                for j in range(heads):
                    hi = h_lo + j
                    S = states[j]                                       # (p, n) S_in
                    _decays(dt, dtc, A, hi, row0, m, a, s_incl, tail)
                    _copy_piece(x, xc, p, row0, m, hi, Xq)
                    Xd_sum = dtype.type(0)                              # not finite if some X_t is not
                    for t in range(m):
                        d, e_out = dt[row0 + t, dtc + hi], np.exp(tail[t])
                        for i in range(p):
                            Xd[t, i] = Xq[t, i] * d
                            Ex[t, i] = Xd[t, i] * e_out
                            Xd_sum += Xd[t, i]
                    _masked_decayed_scores(scores, a, m, decays, LT)
                    if _finite(Xd_sum):
                        np.dot(LT.T, Xd[:m], own[:m])                   # (m, p) the piece's own inputs
                    else:                                               # LT's masked zeros must not multiply it
                        _masked_own_inputs(LT, Xd, m, own)
                    np.dot(Cq[:m], S.T, from_state[:m])                 # (m, p) C_t . S_in
                    for t in range(m):
                        e_in, out = np.exp(s_incl[t]), y[bi, start + t, hi]
                        for i in range(p):
                            out[i] = own[t, i] + e_in * from_state[t, i] + D[hi] * Xq[t, i]
                    np.dot(Ex[:m].T, Bq[:m], S_piece)                   # (p, n) the inputs' share of S_out
                    e_total = np.exp(s_incl[m - 1])
                    for i in range(p):
                        for jj in range(n):
                            S[i, jj] = e_total * S[i, jj] + S_piece[i, jj]
        for j in range(heads):
            final_state[bi, h_lo + j] = states[j]


def head_blocks(b: int, g: int, r: int, threads: int) -> int:
    """Blocks of a group's r heads per (batch, group): enough work items for ITEMS_PER_THREAD on each thread (so a
    thread that starts late, or runs slower, leaves the others less to wait for), never more than r. An item's
    piece computes C B^T once for its heads: at the 130M shape (b 1, one group of 24 heads) 8 blocks of 3."""
    return int(max(1, min(r, -(-ITEMS_PER_THREAD * threads // max(b * g, 1)))))   # b = 0: an empty scan


def _contiguous(*arrays):
    """C-contiguous and writeable (a read-only array is another numba type: one more compilation)."""
    return tuple(np.require(a, requirements="CW") for a in arrays)


def _rows_of(a: np.ndarray) -> tuple:
    """a (b, l, ...) -> (rows, col) with a.reshape(b l, w) == rows[:, col:col + w], w the size of a step: in place
    when a is a column slice of a C-contiguous array, as the model's x, B and C are (pieces of the conv's output),
    else a contiguous copy. The kernels copy a piece's rows into small contiguous buffers (`_copy_piece`)."""
    b, l, w = a.shape[0], a.shape[1], int(np.prod(a.shape[2:]))
    rows, col = as_rows(a.reshape(b, l, w), a.dtype)
    if not rows.flags.writeable:                                        # see _contiguous
        rows, col = _contiguous(rows[:, col:col + w])[0], 0
    return rows, col


def forward(x, dt, A, B, C, D, initial_state, chunk_size, checkpoints: bool = True):
    """The registry's kernel forward: arrays in (one float dtype, validated by `ssd`), (y, final_state, saved) out.
    saved = (x, dt, A, B, C, D or an empty array, the checkpoints, [chunk length q, whether an initial state was
    given]); checkpoints=False keeps none (an empty (b, h, 0, p, n) array: for `inference`)."""
    b, l, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    q = int(min(chunk_size, l))
    c = -(-l // q) if checkpoints else 0
    dtype = x.dtype
    D_or_zeros = np.zeros(h, dtype) if D is None else D
    S0 = np.zeros((0, h, p, n), dtype) if initial_state is None else initial_state   # (0, ...): start from zeros
    y = heap_reuse.empty((b, l, h, p), dtype)
    final_state = np.empty((b, h, p, n), dtype)
    kept = heap_reuse.empty((b, h, c, p, n), dtype)                     # (b, h, c, p, n): c states, not l
    A, D_or_zeros, S0 = _contiguous(A, D_or_zeros, S0)
    threads = _thread_count(b * l * h * p * n)
    args = (*_rows_of(x), *_rows_of(dt), A, *_rows_of(B), *_rows_of(C), D_or_zeros, S0, g, q,
            head_blocks(b, g, h // g, threads), y, final_state, kept)
    on_single_threaded_blas(lambda: _on_threads(forward_kernel, args, threads))
    return y, final_state, (x, dt, A, B, C, D if D is not None else np.zeros(0, dtype), kept,
                            np.array([q, initial_state is not None, D is not None]))


def on_single_threaded_blas(run):
    """run() with BLAS on one thread (SciPy's OpenBLAS, which the kernels' np.dot calls, among them), the thread
    counts restored afterwards: the kernels' products are small and run on the threads that call them (past
    m n k = 2^18, e.g. d_state 256, OpenBLAS would start threads of its own for each)."""
    global _scipy_blas_loaded
    if not _scipy_blas_loaded:
        import scipy.linalg.cython_blas  # noqa: F401  (loads SciPy's OpenBLAS, as the kernels are about to)
        refresh_libraries()                                             # so that the limit reaches it
        _scipy_blas_loaded = True
    with single_threaded_blas():
        return run()


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
