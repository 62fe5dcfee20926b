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

Every (q, q) segment sum is exact too: seg = tril(1) @ (a o [k > s]) (a matmul: a sum of a_k and exact zeros).

Work: per chunk, K (g, r, q, q) arrays and matmuls, cut into slabs of chunks (SLAB_ELEMENTS of a (q, q) array
per slab, so one slab's temporaries stay near the L2 cache) that `THREADS` Python threads take as they come
(NumPy's matmuls and ufuncs release the GIL); each slab computes the same whatever thread runs it, so the result
is bit-identical for any thread count. Memory: the forward saves the inputs and the state entering every chunk,
(b, c, g, n, r p), as the numba backend does; the backward recomputes the rest per slab.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

SLAB_ELEMENTS = 1 << 18   # one slab's (g, r, q, q) arrays hold about this many floats (1 MiB in float32)
THREADS = min(2, len(os.sched_getaffinity(0)))   # Python threads that take the slabs
PARALLEL_MIN_WORK = 1 << 18   # below this many b l h p n one thread: handing slabs to threads costs more

_pools: dict[int, ThreadPoolExecutor] = {}


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
    """The 0/1 (q, q) matrices the chunks use: tril[t, s] = [s <= t]; after[k, s] = [k > s] (a_k inside seg[., s]);
    before[s, k] = [s < k]; from_k[t, k] = [t >= k] (= tril)."""
    tril = np.tri(q, q, 0, dtype=dtype)
    after = np.tri(q, q, -1, dtype=dtype)
    return tril, after, after.T.copy()


def _exp_segsum(a_h: np.ndarray, tril: np.ndarray, after: np.ndarray) -> np.ndarray:
    """a_h (..., q) -> exp(seg) (..., q, q), seg[t, s] = a_{s+1} + ... + a_t below the diagonal and exactly 0 above
    it (so exp gives 1 there, never inf): seg = tril @ (a_k [k > s]), a sum of the a_k and exact zeros."""
    seg = np.matmul(tril, a_h[..., :, None] * after)                   # (..., q, q)
    return np.exp(seg, out=seg)


def _run_slabs(work, chunks: int, per_chunk: int, threads: int):
    """work(k0, k1) for slabs of consecutive chunks (about SLAB_ELEMENTS / per_chunk each), on `threads` threads."""
    size = max(1, SLAB_ELEMENTS // per_chunk)
    slabs = [(k0, min(chunks, k0 + size)) for k0 in range(0, chunks, size)]
    if threads <= 1 or len(slabs) == 1:
        for k0, k1 in slabs:
            work(k0, k1)
        return
    pool = _pools.get(threads) or _pools.setdefault(threads, ThreadPoolExecutor(threads, "blas_chunked"))
    for done in [pool.submit(work, k0, k1) for k0, k1 in slabs]:
        done.result()                                                   # re-raises a worker's error here


def _thread_count(work: int) -> int:
    return 1 if work < PARALLEL_MIN_WORK else THREADS


class _Chunks:
    """The inputs cut into chunks: X (K, q, g, r, p), a (K, q, g, r), B, C (K, q, g, n), and the inclusive
    sums inside each chunk: exp_s = exp(s_t) (K, q, g, r), exp_total = exp(s_q) (K, g, r)."""

    def __init__(self, x, dt, A, B, C, c, q):
        b, l, h, p = x.shape
        g, n = B.shape[2], B.shape[3]
        self.b, self.l, self.h, self.p, self.g, self.n, self.r = b, l, h, p, g, n, h // g
        self.c, self.q = c, q
        self.K = b * self.c
        shape = (self.K, self.q, g)
        length = self.c * self.q
        self.X = _padded(x * dt[..., None], length).reshape(shape + (self.r, p))   # (K, q, g, r, p)
        self.a = _padded(dt * A, length).reshape(shape + (self.r,))                # (K, q, g, r)
        self.B = _padded(B, length).reshape(shape + (n,))                          # (K, q, g, n)
        self.C = _padded(C, length).reshape(shape + (n,))                          # (K, q, g, n)
        s = np.cumsum(self.a, axis=1)                                              # (K, q, g, r)  s_t
        self.exp_total = np.exp(s[:, -1])                                          # (K, g, r)     exp(s_q)
        self.exp_s = np.exp(s, out=s)                                              # (K, q, g, r)  exp(s_t)
        self.tril, self.after, self.before = _masks(self.q, x.dtype)

    def per_chunk(self) -> int:
        return self.g * self.r * self.q * self.q

    def heads(self, v, k0, k1):
        """(K, q, g, r, ...) rows -> the per-head view (k, g, r, q, ...) of chunks k0:k1."""
        return np.moveaxis(v[k0:k1], 1, 3)

    def groups(self, v, k0, k1):
        """(K, q, g, r, p) or (K, q, g, n) rows -> the per-group matrices (k, g, q, r p or n) of chunks k0:k1."""
        v = v[k0:k1]
        return v.reshape(v.shape[:3] + (-1,)).transpose(0, 2, 1, 3)

    def diagonal_blocks(self, k0, k1):
        """For chunks k0:k1: L = exp(seg) (k, g, r, q, q) (1 above the diagonal), M = L o tril(CB) (same shape),
        and the group matrices B, C (k, g, q, n)."""
        L = _exp_segsum(self.heads(self.a, k0, k1), self.tril, self.after)        # (k, g, r, q, q)
        Bg, Cg = self.groups(self.B, k0, k1), self.groups(self.C, k0, k1)         # (k, g, q, n)
        CB = np.matmul(Cg, Bg.swapaxes(-1, -2))                                    # (k, g, q, q) C_t . B_s
        CB *= self.tril
        return L, L * CB[:, :, None], Bg, Cg


def _states_as_heads(ST, r):
    """Transposed states (..., g, n, r p) -> (..., h, p, n)."""
    *lead, g, n, rp = ST.shape
    return ST.reshape(*lead, g, n, r, rp // r).transpose(*range(len(lead)), len(lead), len(lead) + 2,
                                                         len(lead) + 3, len(lead) + 1).reshape(*lead, g * r, rp // r, n)


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
        L, M, Bg, _ = ch.diagonal_blocks(k0, k1)                         # (k, g, r, q, q) x2, (k, g, q, n)
        np.matmul(M, ch.heads(ch.X, k0, k1), out=ch.heads(Y, k0, k1))    # (k, g, r, q, p)  M X
        decay_out = np.moveaxis(L[..., -1, :], 3, 1)                     # (k, q, g, r)     exp(seg[q, s])
        Xd = ch.X[k0:k1] * decay_out[..., None]                          # (k, q, g, r, p)
        np.matmul(Bg.swapaxes(-1, -2), ch.groups(Xd, 0, k1 - k0), out=local[k0:k1])  # (k, g, n, r p)

    threads = _thread_count(b * l * h * p * n)
    _run_slabs(diagonal, K, ch.per_chunk(), threads)

    # between chunks: S_in(z + 1) = exp(s_q(z)) S_in(z) + local(z), transposed states (b, g, n, r, p)
    S_in = np.empty((b, c, g, n, r * p), x.dtype)                       # (b, c, g, n, r p)
    S = (np.zeros((b, g, n, r * p), x.dtype) if initial_state is None
         else _heads_as_states(initial_state, g)).reshape(b, g, n, r, p)
    exp_total = ch.exp_total.reshape(b, c, g, 1, r, 1)
    local = local.reshape(b, c, g, n, r, p)
    for z in range(c):
        S_in[:, z] = S.reshape(b, g, n, r * p)
        S = exp_total[:, z] * S + local[:, z]                           # (b, g, n, r, p)
    final_state = _states_as_heads(S.reshape(b, g, n, r * p), r)        # (b, h, p, n)

    S_in_k = S_in.reshape(K, g, n, r * p)

    def entering(k0, k1):
        Y_off = np.matmul(ch.groups(ch.C, k0, k1), S_in_k[k0:k1])        # (k, g, q, r p)  C S_in^T
        Y_off = Y_off.reshape(k1 - k0, g, q, r, p).transpose(0, 2, 1, 3, 4)   # (k, q, g, r, p)
        Y[k0:k1] += ch.exp_s[k0:k1, ..., None] * Y_off

    _run_slabs(entering, K, ch.per_chunk(), threads)
    y = Y.reshape(b, c * q, h, p)[:, :l]                                # (b, l, h, p)
    if D is not None:
        y += x * D[:, None]
    y = np.ascontiguousarray(y)
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
    dyE = dy_k * ch.exp_s[..., None]                                    # (K, q, g, r, p)  exp(s_t) dy_t
    threads = _thread_count(b * l * h * p * n)

    # between chunks, in reverse: dS_in = exp(s_q) dS_out + C^T (exp(s) o dy); transposed (b, g, n, r, p)
    into = np.matmul(ch.groups(ch.C, 0, K).swapaxes(-1, -2), ch.groups(dyE, 0, K))  # (K, g, n, r p)
    into = into.reshape(b, c, g, n, r, p)
    dS_out = np.empty((b, c, g, n, r * p), dtype)                       # (b, c, g, n, r p)
    dS = _heads_as_states(d_final_state.astype(dtype, copy=False), g).reshape(b, g, n, r, p)
    exp_total = ch.exp_total.reshape(b, c, g, 1, r, 1)
    for z in range(c - 1, -1, -1):
        dS_out[:, z] = dS.reshape(b, g, n, r * p)
        dS = exp_total[:, z] * dS + into[:, z]                          # (b, g, n, r, p)
    d_initial = _states_as_heads(dS.reshape(b, g, n, r * p), r) if had_initial else None

    S_in_k, dS_out_k = S_in.reshape(K, g, n, r * p), dS_out.reshape(K, g, n, r * p)
    dX = np.empty((K, q, g, r, p), dtype)                               # (K, q, g, r, p)
    dB, dC = np.empty((K, q, g, n), dtype), np.empty((K, q, g, n), dtype)
    da = np.empty((K, q, g, r), dtype)                                  # (K, q, g, r)

    def chunk_gradients(k0, k1):
        k = k1 - k0
        L, M, Bg, Cg = ch.diagonal_blocks(k0, k1)                        # (k, g, r, q, q) x2, (k, g, q, n) x2
        X_h, dy_h = ch.heads(ch.X, k0, k1), ch.heads(dy_k, k0, k1)       # (k, g, r, q, p)
        G = np.matmul(dy_h, X_h.swapaxes(-1, -2))                        # (k, g, r, q, q)  dy_t . X_s
        np.matmul(M.swapaxes(-1, -2), dy_h, out=ch.heads(dX, k0, k1))    # (k, g, r, q, p)  M^T dy
        decay_out = np.moveaxis(L[..., -1, :], 3, 1)[..., None]          # (k, q, g, r, 1)  exp(seg[q, s])
        # the chunk's own state: dX += exp(seg[q]) o (B dS_out^T), all heads of a group in one matmul
        state_dX = np.matmul(Bg, dS_out_k[k0:k1])                        # (k, g, q, r p)
        state_dX = state_dX.reshape(k, g, q, r, p).transpose(0, 2, 1, 3, 4) * decay_out   # (k, q, g, r, p)
        dX[k0:k1] += state_dX
        from_state = (state_dX * ch.X[k0:k1]).sum(-1)                    # (k, q, g, r)     dseg[q, s]
        # dB and dC: the heads summed in W before the matmuls
        W = (L * G).sum(axis=2)                                          # (k, g, q, q)
        W *= ch.tril
        Xd = ch.X[k0:k1] * decay_out                                     # (k, q, g, r, p)
        dC_g = np.matmul(W, Bg) + np.matmul(ch.groups(dyE, k0, k1), S_in_k[k0:k1].swapaxes(-1, -2))   # (k, g, q, n)
        dB_g = np.matmul(W.swapaxes(-1, -2), Cg) + np.matmul(ch.groups(Xd, 0, k), dS_out_k[k0:k1].swapaxes(-1, -2))
        dC[k0:k1], dB[k0:k1] = dC_g.transpose(0, 2, 1, 3), dB_g.transpose(0, 2, 1, 3)
        # the segment sums: da_k = sum_{t>=k} sum_{s<k} dseg[t, s] + sum_{t>=k} v_t + w
        dseg = np.multiply(G, M, out=G)                                  # (k, g, r, q, q)
        dseg[..., -1, :] += np.moveaxis(from_state, 1, 3)
        R = np.matmul(dseg, ch.before)                                   # (k, g, r, q, q)  sum_{s<k} dseg[t, s]
        R *= ch.tril
        da_diag = R.sum(axis=-2)                                         # (k, g, r, q)
        Y_off = np.matmul(Cg, S_in_k[k0:k1]).reshape(k, g, q, r, p).transpose(0, 2, 1, 3, 4)   # (k, q, g, r, p)
        v = (dyE[k0:k1] * Y_off).sum(-1)                                 # (k, q, g, r)
        v_from = np.cumsum(v[:, ::-1], axis=1)[:, ::-1]                  # (k, q, g, r)  sum_{t>=k} v_t
        w = (dS_out_k[k0:k1] * S_in_k[k0:k1]).reshape(k, g, n, r, p).sum(axis=(2, 4))   # (k, g, r)
        w *= ch.exp_total[k0:k1]
        da[k0:k1] = np.moveaxis(da_diag, 3, 1) + v_from + w[:, None]

    _run_slabs(chunk_gradients, K, ch.per_chunk(), threads)

    dX = dX.reshape(b, c * q, h, p)[:, :l]                              # (b, l, h, p)
    da = da.reshape(b, c * q, h)[:, :l]                                 # (b, l, h)
    dx = dX * dt[..., None]
    ddt = da * A + (dX * x).sum(-1)
    dA = np.einsum("blh,blh->h", da, dt)
    dD = None
    if D.size:
        dx += dy * D[:, None]
        dD = np.einsum("blhp,blhp->h", dy, x)
    dB = np.ascontiguousarray(dB.reshape(b, c * q, g, n)[:, :l])
    dC = np.ascontiguousarray(dC.reshape(b, c * q, g, n)[:, :l])
    return dx, ddt, dA, dB, dC, dD, d_initial
