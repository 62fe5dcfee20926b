"""The chunked SSD scan on NumPy arrays, its backward written by hand: nearly all the work in BLAS matmuls.

The same algorithm as reference.py (ssd_minimal's), on plain arrays: l is cut into c = ceil(l / chunk_size)
equal chunks of q = ceil(l / c) steps, X and a zero-padded in the tail (a padded step neither adds to nor decays
the state). Notation: K = b c chunks of all batches; per chunk, head i of group gi (r = h / g heads per group),
a_t = dt_t A_i, X_t = dt_t x_t (p,), s_t = a_1 + ... + a_t (inclusive, inside the chunk), and

    seg[t, s] = a_{s+1} + ... + a_t  (t >= s, 0 above the diagonal)    L = exp(seg)    CB[t, s] = C_t . B_s
    M = L o tril(CB)   (the masked (q, q) "attention" of the chunk; exp(seg) is 1 above the diagonal, and the
                        0/1 mask on CB, shared by the r heads of a group, zeroes it: no -inf is ever formed)

Forward, per chunk (S_in (p, n) the state entering it, S_out the state leaving it):

    y_t   = sum_{s<=t} M[t, s] X_s  +  exp(s_t) S_in C_t  (+ D_i x_t)          Y = M X  +  exp(s) o (C S_in^T)
    S_out = exp(s_q) S_in + sum_s exp(seg[q, s]) X_s B_s^T                      (seg[q, :] = L's last row)

The local sums are matmuls per chunk: M X per head ((q, q) @ (q, p)); the chunk's own state and the entering
state's output for all r heads of a group at once (the heads side by side as a (q, r p) matrix:
B^T (n, q) @ (exp(seg[q, :]) o X) (q, r p), and C (q, n) @ S_in^T (n, r p)). Between chunks only the
recurrence S_in(z + 1) = exp(s_q(z)) S_in(z) + local(z) runs, c elementwise steps. States are held transposed,
(n, r p) per group ("ST"), the layout those matmuls read and write.

Speed (benchmarks/bench_ssd_backends.py, docs/kernels.md): slower than the numba recurrence at the model's
shapes, 1.6x at p = n = 64, q = 64 and 2.4x at q = 256 (a whole training step 1.4x). The chunked form does
~1.7x the recurrence's multiply-adds (forward M X, the chunk states, C S_in^T and the segment sums; backward
nine matmuls of the same size), the (q, q) matmuls of q = 64 run at ~100 GFLOP/s on one core, and the
elementwise passes over (q, q) per head cost as much again. Kept as what "auto" takes where numba is missing
(far faster than the engine-op reference), and as a second, independently derived kernel backend.

Backward, given dy and dS_out (d final_state for the last chunk), per chunk:

    dS_in  = exp(s_q) dS_out + sum_t exp(s_t) dy_t C_t^T        (reverse recurrence: dS_out(z - 1) = dS_in(z),
                                                                   d initial_state = dS_in of chunk 0)
    G[t, s] = dy_t . X_s                       (q, q) per head:  G = dy X^T
    dX_s   = sum_{t>=s} M[t, s] dy_t + exp(seg[q, s]) dS_out B_s          dX = M^T dy + exp(seg[q]) o (B dS_out^T)
    W      = tril(sum_{heads} L o G)           (q, q) per group: the heads summed BEFORE multiplying by B or C
    dC_t   = sum_s W[t, s] B_s + sum_{heads} exp(s_t) S_in^T dy_t         dC = W B + (exp(s) o dy) S_in
    dB_s   = sum_t W[t, s] C_t + sum_{heads} exp(seg[q, s]) dS_out^T X_s  dB = W^T C + (exp(seg[q]) o X) dS_out

and the segment sums' gradients, exactly (each segment sum is a plain sum of the a_k it spans, so
d seg[t, s] / d a_k = 1 for s < k <= t, and d s_t / d a_k = 1 for k <= t; no difference of cumsums is formed):

    dseg[t, s] = G o M                         (from the diagonal blocks' L)
    dseg[q, s] += exp(seg[q, s]) X_s . (dS_out B_s)     (from the chunk's own state)
    v_t        = exp(s_t) dy_t . (S_in C_t)            (from the entering state's output, d s_t)
    w          = exp(s_q) <dS_out, S_in>               (from S_out's exp(s_q) S_in, d s_q)
    da_k = sum_{t>=k} sum_{s<k} dseg[t, s] + sum_{t>=k} v_t + w
         (the first as R = dseg @ [s < k], then the column sums of R over rows t >= k)

then, with X = dt x and a = dt A:  dx = dX dt + D dy,  ddt = dX . x + da A,  dA = sum da dt,  dD = sum dy . x.

Every (q, q) segment sum is exact too: seg = tril(1) @ (a o [k > s]) (a matmul: a sum of a_k and exact zeros),
or for chunks longer than SEGSUM_MATMUL_MAX_Q (where that q^3 matmul dominates) from blocks of ~sqrt(q) steps,
three sums of disjoint runs of a (`_segsum_blocked`). v_t comes from the per-head (q, n) products
exp(s_t) S_in^T dy_t (v_t = C_t . that), whose head sum is dC's second term: one matmul for both.

Work: per chunk, K (g, r, q, q) arrays and matmuls, cut into slabs of chunks (SLAB_ELEMENTS of a (q, q) array
per slab, so one slab's temporaries stay near the L2 cache) that up to `THREADS` Python threads take as they
come (the caller's and the fused ops' pool, fast/row_blocks.py; NumPy's matmuls and ufuncs release the GIL),
with OpenBLAS set to one thread meanwhile (its matmuls are small; OpenBLAS waking a second thread per call, or
two of ours each asking for two, ran 2x to 30x slower on a busy 2-core machine); each slab computes the same
whatever thread runs it, so the result is bit-identical for any thread
count. Memory: the forward saves the inputs and the state entering every chunk,
(b, c, g, n, r p), as the numba backend does; the backward recomputes the rest per slab.
"""
from __future__ import annotations

import math
import os

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ..fast.row_blocks import on_threads

SEGSUM_MATMUL_MAX_Q = 64   # chunks up to this long build their segment sums with a matmul, longer ones in blocks
SLAB_ELEMENTS = 1 << 18   # one slab's (g, r, q, q) arrays hold about this many floats (1 MiB in float32)
THREADS = min(2, len(os.sched_getaffinity(0)))   # Python threads that take the slabs
PARALLEL_MIN_WORK = 1 << 18   # below this many b l h p n one thread: handing slabs to threads costs more

def available() -> bool:
    return True


def _chunking(l: int, chunk_size: int) -> tuple[int, int]:
    """(c, q): c chunks of q steps, equal length, q <= chunk_size, c q - l < c padded steps."""
    c = -(-l // chunk_size)
    return c, -(-l // c)


def _padded(v: np.ndarray, length: int) -> np.ndarray:
    """v (b, l, ...) -> (b, length, ...) with zeros after step l, C-contiguous (v itself when it already is)."""
    if v.shape[1] == length:
        return np.ascontiguousarray(v)
    out = np.zeros((v.shape[0], length) + v.shape[2:], v.dtype)
    out[:, :v.shape[1]] = v
    return out


def _masks(q: int, dtype):
    """The 0/1 (q, q) matrices the chunks use: tril[t, s] = [s <= t] (also [t >= k] over the rows t of a column k);
    after[k, s] = [k > s] (a_k is inside seg[., s]); before[s, k] = [s < k]."""
    tril = np.tri(q, q, 0, dtype=dtype)
    after = np.tri(q, q, -1, dtype=dtype)
    return tril, after, after.T.copy()


def _exp_segsum(a_h: np.ndarray, tril: np.ndarray, after: np.ndarray) -> np.ndarray:
    """a_h (..., q) -> exp(seg) (..., q, q), seg[t, s] = a_{s+1} + ... + a_t below the diagonal: every entry a sum of
    the a_k it spans (never a difference of cumsums). Above the diagonal the entries are finite (0 for q up to
    SEGSUM_MATMUL_MAX_Q, else sums of a within the chunk) and every use masks them.
    Short chunks: seg = tril @ (a_k [k > s]), one matmul (a sum of the a_k and exact zeros); longer ones (where
    the matmul's q^3 outgrows the q^2 of the rest): `_segsum_blocked`."""
    if a_h.shape[-1] <= SEGSUM_MATMUL_MAX_Q:
        seg = np.matmul(tril, a_h[..., :, None] * after)               # (..., q, q)
    else:
        seg = _segsum_blocked(a_h)                                      # (..., q, q)
    return np.exp(seg, out=seg)


def _segsum_blocked(a_h: np.ndarray) -> np.ndarray:
    """a_h (..., q) -> seg (..., q, q) in blocks of w ~ sqrt(q) steps (the chunk zero-padded to nb w): for t in block
    i and s in an earlier block j,
        seg[t, s] = prefix[i, t] + between[i, j] + suffix[j, s]
    (a[i, ..t], the whole blocks j+1 .. i-1, a[j, s+1..]: three sums of disjoint runs of a), and inside a block the
    run a[i, s+1..t] itself. Costs two passes over the (q, q) array instead of a q^3 matmul."""
    q = a_h.shape[-1]
    lead = a_h.shape[:-1]
    w = max(1, math.isqrt(q))
    nb = -(-q // w)
    if nb * w != q:
        a_h = np.concatenate([a_h, np.zeros(lead + (nb * w - q,), a_h.dtype)], axis=-1)
    ab = a_h.reshape(lead + (nb, w))                                    # (..., nb, w)
    prefix = np.cumsum(ab, axis=-1)                                     # (..., nb, w)  a[i, 0..u]
    suffix = np.zeros_like(ab)                                          # (..., nb, w)  a[j, v+1..w-1]
    suffix[..., :-1] = np.cumsum(ab[..., :0:-1], axis=-1)[..., ::-1]
    totals = np.where(np.tri(nb, nb, -1, dtype=bool), prefix[..., :, None, -1], 0)   # (..., nb, nb) [m, j]: m > j
    between = np.zeros(lead + (nb, nb), a_h.dtype)                      # (..., nb, nb)  blocks j+1 .. i-1
    between[..., 1:, :] = np.cumsum(totals, axis=-2)[..., :-1, :]
    seg = prefix[..., :, :, None, None] + between[..., :, None, :, None]    # (..., nb, w, nb, 1)
    seg = seg + suffix[..., None, None, :, :]                           # (..., nb, w, nb, w)
    inside = np.cumsum(np.where(np.tri(w, w, -1, dtype=bool), ab[..., :, :, None], 0), axis=-2)  # (..., nb, w, w)
    st = seg.strides                                                    # the diagonal blocks i = j, as a view
    as_strided(seg, lead + (nb, w, w), st[:-4] + (st[-4] + st[-2], st[-3], st[-1]), writeable=True)[...] = inside
    seg = seg.reshape(lead + (nb * w, nb * w))
    return seg if nb * w == q else np.ascontiguousarray(seg[..., :q, :q])


def openblas_threads_setter(accept=lambda path: True):
    """The `openblas_set_num_threads_local(n) -> previous` of the first OpenBLAS loaded in this process whose path
    `accept` takes (NumPy's, as this module calls it at import; numba_chunked.py asks for SciPy's), or None where
    it cannot be found (another BLAS, an older OpenBLAS, no /proc). Despite its name it sets that OpenBLAS's
    thread count for the whole process (measured: a value set in one thread is what another thread's call
    returns), so only the calling thread uses it."""
    try:
        import ctypes
        with open("/proc/self/maps") as maps:
            paths = sorted({line.split()[-1] for line in maps if "openblas" in line.lower() and "/" in line})
        for path in filter(accept, paths):
            setter = getattr(ctypes.CDLL(path), "openblas_set_num_threads_local", None)
            if setter is not None:
                setter.argtypes, setter.restype = [ctypes.c_int], ctypes.c_int
                return setter
    except OSError:
        pass
    return None


_set_blas_threads = openblas_threads_setter()


def _run_slabs(work, chunks: int, per_chunk: int, threads: int):
    """work(k0, k1) for slabs of consecutive chunks (about SLAB_ELEMENTS / per_chunk each), on `threads` threads,
    with OpenBLAS on one thread meanwhile: the matmuls here are small (q, q, p), and OpenBLAS waking its second
    thread for them (or two of our threads each asking for two) cost 2x to 30x in wall time on a busy 2-core
    machine. The caller's OpenBLAS setting is restored afterwards."""
    size = max(1, SLAB_ELEMENTS // per_chunk)
    slabs = [(k0, min(chunks, k0 + size)) for k0 in range(0, chunks, size)]

    def take(indices, share):                                           # the slabs a thread is handed
        for i in indices:
            work(*slabs[i])
    blas_threads_before = None if _set_blas_threads is None else _set_blas_threads(1)
    try:
        on_threads(take, len(slabs), threads)                           # the fused ops' threads (fast/row_blocks.py)
    finally:
        if blas_threads_before is not None:
            _set_blas_threads(blas_threads_before)


def _thread_count(work: int) -> int:
    return 1 if work < PARALLEL_MIN_WORK else THREADS


class _Chunks:
    """The inputs cut into chunks of q steps (zero-padded to c q): x (K, q, g, r, p), dt, a (K, q, g, r),
    B, C (K, q, g, n), and the inclusive sums inside each chunk: exp_s = exp(s_t) (K, q, g, r) and
    exp_total = exp(s_q) (K, g, r p) (repeated over each head's p columns, the layout of the (n, r p) states)."""

    def __init__(self, x, dt, A, B, C, c, q):
        b, l, h, p = x.shape
        g, n = B.shape[2], B.shape[3]
        self.b, self.l, self.h, self.p, self.g, self.n, self.r = b, l, h, p, g, n, h // g
        self.c, self.q = c, q
        self.K = b * c
        rows, length = (self.K, q, g), c * q
        self.x = _padded(x, length).reshape(rows + (self.r, p))                    # (K, q, g, r, p)
        self.dt = _padded(dt, length).reshape(rows + (self.r,))                    # (K, q, g, r)
        self.a = self.dt * A.reshape(g, self.r)                                    # (K, q, g, r)
        self.B = _padded(B, length).reshape(rows + (n,))                           # (K, q, g, n)
        self.C = _padded(C, length).reshape(rows + (n,))                           # (K, q, g, n)
        s = np.cumsum(self.a, axis=1)                                              # (K, q, g, r)  s_t
        self.exp_total = np.repeat(np.exp(s[:, -1]), p, axis=-1)                   # (K, g, r p)   exp(s_q)
        self.exp_s = np.exp(s, out=s)                                              # (K, q, g, r)  exp(s_t)
        self.tril, self.after, self.before = _masks(q, x.dtype)

    def per_chunk(self) -> int:
        return self.g * self.r * self.q * self.q

    def X(self, k0, k1):
        """X = dt x of chunks k0:k1, (k, q, g, r, p), a new array."""
        return self.x[k0:k1] * self.dt[k0:k1, ..., None]

    def diagonal_blocks(self, k0, k1):
        """For chunks k0:k1: L = exp(seg) (k, g, r, q, q) (1 above the diagonal), M = L o tril(CB) (same shape),
        and the group matrices B, C (k, g, q, n)."""
        L = _exp_segsum(np.moveaxis(self.a[k0:k1], 1, 3), self.tril, self.after)  # (k, g, r, q, q)
        Bg, Cg = _groups(self.B[k0:k1]), _groups(self.C[k0:k1])                   # (k, g, q, n)
        CB = np.matmul(Cg, Bg.swapaxes(-1, -2))                                    # (k, g, q, q) C_t . B_s
        CB *= self.tril
        return L, L * CB[:, :, None], Bg, Cg


def _heads(v):
    """Rows (k, q, g, r, p) -> the per-head matrices (k, g, r, q, p), a view."""
    return np.moveaxis(v, 1, 3)


def _groups(v):
    """Rows (k, q, g, r, p) or (k, q, g, n) -> the per-group matrices (k, g, q, r p or n), a view when possible."""
    return v.reshape(v.shape[:3] + (-1,)).transpose(0, 2, 1, 3)


def _states_as_heads(ST, r):
    """Transposed states (b, g, n, r p) -> (b, h, p, n)."""
    b, g, n, rp = ST.shape
    return ST.reshape(b, g, n, r, rp // r).transpose(0, 1, 3, 4, 2).reshape(b, g * r, rp // r, n)


def _heads_as_states(S, g):
    """States (b, h, p, n) -> transposed (b, g, n, r p)."""
    b, h, p, n = S.shape
    return S.reshape(b, g, h // g, p, n).transpose(0, 1, 4, 2, 3).reshape(b, g, n, h // g * p)


def forward(x, dt, A, B, C, D, initial_state, chunk_size):
    """The registry's kernel forward: arrays in (one float dtype, validated by `ssd`), (y, final_state, saved) out.
    saved = (x, dt, A, B, C, D or an empty array, the states entering each chunk (b, c, g, n, r p),
    [chunk length q, whether an initial state was given])."""
    b, l, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    ch = _Chunks(x, dt, A, B, C, *_chunking(l, chunk_size))
    K, q, r, c = ch.K, ch.q, ch.r, ch.c
    Y = np.empty((K, q, g, r, p), x.dtype)                              # (K, q, g, r, p) = (b, c q, h, p)
    local = np.empty((K, g, n, r * p), x.dtype)                         # (K, g, n, r p) each chunk's own state^T

    def diagonal(k0, k1):
        X = ch.X(k0, k1)                                                 # (k, q, g, r, p)
        L, M, Bg, _ = ch.diagonal_blocks(k0, k1)                         # (k, g, r, q, q) x2, (k, g, q, n)
        Y[k0:k1] = np.moveaxis(np.matmul(M, _heads(X)), 3, 1)            # (k, q, g, r, p)  M X
        X *= np.moveaxis(L[..., -1, :], 3, 1)[..., None]                 # (k, q, g, r, p)  exp(seg[q, s]) X_s
        np.matmul(Bg.swapaxes(-1, -2), _groups(X), out=local[k0:k1])     # (k, g, n, r p)

    threads = _thread_count(b * l * h * p * n)
    _run_slabs(diagonal, K, ch.per_chunk(), threads)

    # between chunks: S_in(z + 1) = exp(s_q(z)) S_in(z) + local(z), transposed states (b, g, n, r p)
    S_in = np.empty((b, c, g, n, r * p), x.dtype)                       # (b, c, g, n, r p)
    S = np.zeros((b, g, n, r * p), x.dtype) if initial_state is None else _heads_as_states(initial_state, g).copy()
    exp_total = ch.exp_total.reshape(b, c, g, 1, r * p)
    local = local.reshape(b, c, g, n, r * p)
    for z in range(c):
        S_in[:, z] = S
        np.multiply(exp_total[:, z], S, out=S)                          # (b, g, n, r p)
        S += local[:, z]
    final_state = _states_as_heads(S, r)                                # (b, h, p, n)

    S_in_k = S_in.reshape(K, g, n, r * p)
    D_heads = None if D is None else D.reshape(g, r, 1)

    def entering(k0, k1):
        Y_off = np.matmul(_groups(ch.C[k0:k1]), S_in_k[k0:k1])           # (k, g, q, r p)  C S_in^T
        Y_off = Y_off.reshape(k1 - k0, g, q, r, p).transpose(0, 2, 1, 3, 4)   # (k, q, g, r, p)
        Y[k0:k1] += ch.exp_s[k0:k1, ..., None] * Y_off
        if D_heads is not None:
            Y[k0:k1] += ch.x[k0:k1] * D_heads

    _run_slabs(entering, K, ch.per_chunk(), threads)
    y = Y.reshape(b, c * q, h, p)
    y = y if c * q == l else np.ascontiguousarray(y[:, :l])             # (b, l, h, p)
    return y, final_state, (x, dt, A, B, C, D if D is not None else np.zeros(0, x.dtype), S_in,
                            np.array([q, initial_state is not None]))


def backward(saved, dy, d_final_state):
    """The registry's kernel backward: (saved, dy, d final_state) -> (dx, ddt, dA, dB, dC, dD|None, d_initial|None)."""
    x, dt, A, B, C, D, S_in, (q, had_initial) = saved
    b, l, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    dtype = x.dtype
    c = S_in.shape[1]
    ch = _Chunks(x, dt, A, B, C, c, int(q))
    K, q, r = ch.K, ch.q, ch.r
    dy_k = _padded(dy.astype(dtype, copy=False), c * q).reshape(K, q, g, r, p)      # (K, q, g, r, p)
    threads = _thread_count(b * l * h * p * n)

    # between chunks, in reverse: dS_in = exp(s_q) dS_out + C^T (exp(s) o dy), transposed (b, g, n, r p)
    into = np.empty((K, g, n, r * p), dtype)                            # (K, g, n, r p)

    def entering(k0, k1):
        dyE = dy_k[k0:k1] * ch.exp_s[k0:k1, ..., None]                   # (k, q, g, r, p)
        np.matmul(_groups(ch.C[k0:k1]).swapaxes(-1, -2), _groups(dyE), out=into[k0:k1])

    _run_slabs(entering, K, ch.per_chunk(), threads)
    into = into.reshape(b, c, g, n, r * p)
    dS_out = np.empty((b, c, g, n, r * p), dtype)                       # (b, c, g, n, r p)
    dS = _heads_as_states(d_final_state.astype(dtype, copy=False), g).copy()   # (b, g, n, r p)
    exp_total = ch.exp_total.reshape(b, c, g, 1, r * p)
    for z in range(c - 1, -1, -1):
        dS_out[:, z] = dS
        np.multiply(exp_total[:, z], dS, out=dS)                        # (b, g, n, r p)
        dS += into[:, z]
    d_initial = _states_as_heads(dS, r) if had_initial else None

    S_in_k, dS_out_k = S_in.reshape(K, g, n, r * p), dS_out.reshape(K, g, n, r * p)
    D_heads = D.reshape(g, r, 1) if D.size else None
    dx = np.empty((K, q, g, r, p), dtype)                               # (K, q, g, r, p)
    dB, dC = np.empty((K, q, g, n), dtype), np.empty((K, q, g, n), dtype)
    da = np.empty((K, g, r, q), dtype)                                  # (K, g, r, q)
    x_dot_dX = np.empty((K, q, g, r), dtype)                            # (K, q, g, r)  x_t . dX_t
    x_dot_dy = np.empty((K, q, g, r), dtype)                            # (K, q, g, r)  x_t . dy_t

    def chunk_gradients(k0, k1):
        k = k1 - k0
        x_c, dy_c = ch.x[k0:k1], dy_k[k0:k1]                             # (k, q, g, r, p)
        X = ch.X(k0, k1)                                                 # (k, q, g, r, p)
        dyE = dy_c * ch.exp_s[k0:k1, ..., None]                          # (k, q, g, r, p)  exp(s_t) dy_t
        L, M, Bg, Cg = ch.diagonal_blocks(k0, k1)                        # (k, g, r, q, q) x2, (k, g, q, n) x2
        G = np.matmul(_heads(dy_c), _heads(X).swapaxes(-1, -2))          # (k, g, r, q, q)  dy_t . X_s
        decay_out = np.moveaxis(L[..., -1, :], 3, 1)[..., None]          # (k, q, g, r, 1)  exp(seg[q, s])
        # dX: the chunk's own state's term, exp(seg[q]) o (B dS_out^T), for all heads of a group in one matmul,
        # then the diagonal blocks' M^T dy
        dX = np.matmul(Bg, dS_out_k[k0:k1]).reshape(k, g, q, r, p).transpose(0, 2, 1, 3, 4) * decay_out
        from_state = (dX * X).sum(-1)                                    # (k, q, g, r)  d seg[q, s]
        dX += np.moveaxis(np.matmul(M.swapaxes(-1, -2), _heads(dy_c)), 3, 1)   # (k, q, g, r, p)
        dx[k0:k1] = dX * ch.dt[k0:k1, ..., None]
        if D_heads is not None:
            dx[k0:k1] += dy_c * D_heads
        np.sum(dX * x_c, axis=-1, out=x_dot_dX[k0:k1])
        np.sum(dy_c * x_c, axis=-1, out=x_dot_dy[k0:k1])
        # dB and dC: the heads summed in W before the matmuls
        W = (L * G).sum(axis=2)                                          # (k, g, q, q)
        W *= ch.tril
        X *= decay_out                                                   # (k, q, g, r, p)  exp(seg[q, s]) X_s
        # exp(s_t) S_in^T dy_t per head (k, g, r, q, n): summed over the heads it is dC's second term, and
        # against C_t it is v_t = exp(s_t) dy_t . (S_in C_t), the entering state's term of ds_t
        entering_dC = np.matmul(_heads(dyE), S_in_k[k0:k1].reshape(k, g, n, r, p).transpose(0, 1, 3, 4, 2))
        v = (entering_dC * Cg[:, :, None]).sum(-1)                       # (k, g, r, q)
        dC_g = np.matmul(W, Bg) + entering_dC.sum(axis=2)                # (k, g, q, n)
        dB_g = np.matmul(W.swapaxes(-1, -2), Cg) + np.matmul(_groups(X), dS_out_k[k0:k1].swapaxes(-1, -2))
        dC[k0:k1], dB[k0:k1] = dC_g.transpose(0, 2, 1, 3), dB_g.transpose(0, 2, 1, 3)
        # the segment sums: da_k = sum_{t>=k} sum_{s<k} dseg[t, s] + sum_{t>=k} v_t + w
        dseg = np.multiply(G, M, out=G)                                  # (k, g, r, q, q)
        dseg[..., -1, :] += np.moveaxis(from_state, 1, 3)
        R = np.matmul(dseg, ch.before)                                   # (k, g, r, q, q)  sum_{s<k} dseg[t, s]
        R *= ch.tril
        w = (dS_out_k[k0:k1] * S_in_k[k0:k1]).reshape(k, g, n, r, p).sum(axis=(2, 4))   # (k, g, r)
        w *= ch.exp_total[k0:k1, :, ::p]
        da_c = np.cumsum(v[..., ::-1], axis=-1)[..., ::-1]               # (k, g, r, q)  sum_{t>=k} v_t
        da_c += R.sum(axis=-2)
        da_c += w[..., None]
        da[k0:k1] = da_c

    _run_slabs(chunk_gradients, K, ch.per_chunk(), threads)

    da = np.moveaxis(da, 3, 1)                                          # (K, q, g, r)
    ddt = (da * A.reshape(g, r) + x_dot_dX).reshape(b, c * q, h)[:, :l]
    dA = (da * ch.dt).sum(axis=(0, 1)).reshape(h)
    dD = x_dot_dy.sum(axis=(0, 1)).reshape(h) if D_heads is not None else None
    crop = (lambda v: v) if c * q == l else (lambda v: np.ascontiguousarray(v[:, :l]))
    return (crop(dx.reshape(b, c * q, h, p)), crop(ddt) if c * q != l else np.ascontiguousarray(ddt), dA,
            crop(dB.reshape(b, c * q, g, n)), crop(dC.reshape(b, c * q, g, n)), dD, d_initial)
