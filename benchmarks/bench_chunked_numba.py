"""A measurement for the next scan kernel, not a backend: the chunked SSD as numba kernels whose products are
BLAS calls made from inside the kernel (numba's np.dot, which needs SciPy), against the numba recurrence
(tinygrad_ssm/kernels/numba_cpu.py) on one thread. docs/kernels.md, "The way to 0.5x", says why.

    pip install scipy && python benchmarks/bench_chunked_numba.py      # b 8, l 512, h 8, p = n = 64, float32

Per (batch, head) and chunk of q steps (a_t = dt_t A, X_t = dt_t x_t; seg[t, s] = a_{s+1} + ... + a_t, built as
running sums, never as differences of cumulative sums; s_t = a_1 + ... + a_t inside the chunk):
  forward:  M = exp(seg) o tril(C B^T) o dt;  Y = M x + exp(s) o (C S_in^T) + D x;  S_out = exp(s_q) S_in +
            (exp(seg[q, :]) o X)^T B                                         (four np.dot calls a chunk)
  backward: G = dy X^T;  dX = M'^T dy + exp(seg[q, :]) o (B dS_out^T);  W = tril(exp(seg) o G);
            dC = W B + (exp(s) o dy) S_in;  dB = W^T C + (exp(seg[q, :]) o X) dS_out;
            dS_in = exp(s_q) dS_out + (exp(s) o dy)^T C                      (nine np.dot calls a chunk)
What the prototypes leave out, so the figures are a lower bound on the work: the backward's segment-sum
gradient (ddt, dA) is only its (q, q) pass (G o M and its weighted sum), not the row and column sums that
finish it; C B^T and W are computed per head, where a kernel would share them among the r heads of a group;
g = 1, l a multiple of q, no initial state. Checked: y and the final state against the recurrence's forward;
dx, dB, dC and d initial-state against its backward (float32, relative to each array's largest entry).
Prints a table and writes benchmarks/results/bench_chunked_numba.json.
"""
from __future__ import annotations

import argparse
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")   # one thread: small products, both sides on one core

import tinygrad_ssm  # noqa: F401, E402, I001  (first: see tinygrad_ssm/blas_threads.py)
import numba  # noqa: E402
import numpy as np  # noqa: E402
from numba import njit  # noqa: E402

from common import RESULTS, timeit, write_result  # noqa: E402
from tinygrad_ssm.kernels import numba_cpu  # noqa: E402

FASTMATH = {"reassoc", "contract", "nsz"}


@njit(nogil=True, fastmath=FASTMATH)
def _decays(dt, A, bi, hi, t0, q, a, s_incl, tail):
    """a_t = dt_t A, s_t = a_0 + ... + a_t (inclusive), tail_t = a_{t+1} + ... + a_{q-1}: running sums."""
    acc = dt.dtype.type(0)
    for i in range(q):
        a[i] = dt[bi, t0 + i, hi] * A[hi]
        acc += a[i]
        s_incl[i] = acc
    acc = dt.dtype.type(0)
    for i in range(q - 1, -1, -1):
        tail[i] = acc
        acc += a[i]


@njit(nogil=True, fastmath=FASTMATH)
def chunked_forward(xh, dt, A, B, C, D, q, y, final):
    """xh (b, h, l, p), dt (b, l, h), B, C (b, l, n), y (b, h, l, p), final (b, h, p, n)."""
    b, h, l, p = xh.shape
    n = B.shape[2]
    dtype = xh.dtype
    M, CS = np.empty((q, q), dtype), np.empty((q, p), dtype)
    XW, S, SB = np.empty((p, q), dtype), np.empty((p, n), dtype), np.empty((p, n), dtype)
    a, s_incl, tail = np.empty(q, dtype), np.empty(q, dtype), np.empty(q, dtype)
    for bi in range(b):
        for hi in range(h):
            S[:] = 0
            for t0 in range(0, l, q):
                Xc, Bc, Cc = xh[bi, hi, t0:t0 + q], B[bi, t0:t0 + q], C[bi, t0:t0 + q]   # (q, p), (q, n), (q, n)
                _decays(dt, A, bi, hi, t0, q, a, s_incl, tail)
                CB = np.dot(Cc, Bc.T)                                   # (q, q)
                for t in range(q):
                    seg = dtype.type(0)                                 # a_{s+1} + ... + a_t, s from t down
                    for s in range(t, -1, -1):
                        M[t, s] = CB[t, s] * np.exp(seg) * dt[bi, t0 + s, hi]
                        seg += a[s]
                    for s in range(t + 1, q):
                        M[t, s] = 0
                Y = y[bi, hi, t0:t0 + q]
                np.dot(M, Xc, Y)                                        # (q, p): inside the chunk
                np.dot(Cc, S.T, CS)                                     # (q, p): from the entering state
                for t in range(q):
                    e = np.exp(s_incl[t])
                    for j in range(p):
                        Y[t, j] += e * CS[t, j] + D[hi] * Xc[t, j]
                for s in range(q):
                    w = np.exp(tail[s]) * dt[bi, t0 + s, hi]
                    for j in range(p):
                        XW[j, s] = Xc[s, j] * w
                np.dot(XW, Bc, SB)                                      # (p, n): the chunk's own state
                e = np.exp(s_incl[q - 1])
                for i in range(p):
                    for j in range(n):
                        S[i, j] = e * S[i, j] + SB[i, j]
            final[bi, hi] = S


@njit(nogil=True, fastmath=FASTMATH)
def chunked_backward(xh, dyh, dt, A, B, C, D, checkpoints, d_final, q, dxh, dB, dC, d_initial, seg_terms):
    """From the recurrence's checkpoints (b, h, c, p, n): dxh (b, h, l, p), dB, dC (b, l, n), d_initial."""
    b, h, l, p = xh.shape
    n = B.shape[2]
    dtype = xh.dtype
    M, W, Gm = np.empty((q, q), dtype), np.empty((q, q), dtype), np.empty((q, q), dtype)
    Xd, Ed = np.empty((q, p), dtype), np.empty((q, p), dtype)          # dt x, exp(s) dy
    Ex, MTdy = np.empty((q, p), dtype), np.empty((q, p), dtype)        # exp(tail) dt x, M^T dy
    dS, dS_local, tmp_qn = np.empty((p, n), dtype), np.empty((p, n), dtype), np.empty((q, n), dtype)
    a, s_incl, tail = np.empty(q, dtype), np.empty(q, dtype), np.empty(q, dtype)
    dB[:] = 0
    dC[:] = 0
    for bi in range(b):
        for hi in range(h):
            dS[:] = d_final[bi, hi]
            for k in range(l // q - 1, -1, -1):
                t0 = k * q
                Xc, dyc = xh[bi, hi, t0:t0 + q], dyh[bi, hi, t0:t0 + q]
                Bc, Cc, S_in = B[bi, t0:t0 + q], C[bi, t0:t0 + q], checkpoints[bi, hi, k]
                _decays(dt, A, bi, hi, t0, q, a, s_incl, tail)
                for i in range(q):
                    d, e_in, e_out = dt[bi, t0 + i, hi], np.exp(s_incl[i]), np.exp(tail[i])
                    for j in range(p):
                        Xd[i, j] = Xc[i, j] * d
                        Ed[i, j] = dyc[i, j] * e_in
                        Ex[i, j] = Xd[i, j] * e_out
                CB = np.dot(Cc, Bc.T)                                   # (q, q)
                np.dot(dyc, Xd.T, Gm)                                   # G[t, s] = dy_t . X_s
                for t in range(q):
                    seg = dtype.type(0)
                    for s in range(t, -1, -1):
                        L = np.exp(seg)
                        M[t, s] = L * CB[t, s]
                        W[t, s] = L * Gm[t, s]
                        seg += a[s]
                    for s in range(t + 1, q):
                        M[t, s] = 0
                        W[t, s] = 0
                np.dot(M.T, dyc, MTdy)                                  # (q, p)
                dX = dxh[bi, hi, t0:t0 + q]
                np.dot(Bc, dS.T, dX)                                    # (q, p)
                for i in range(q):
                    e_out, d = np.exp(tail[i]), dt[bi, t0 + i, hi]
                    for j in range(p):
                        dX[i, j] = (e_out * dX[i, j] + MTdy[i, j]) * d + D[hi] * dyc[i, j]
                np.dot(W, Bc, tmp_qn)
                dC[bi, t0:t0 + q] += tmp_qn
                np.dot(Ed, S_in, tmp_qn)
                dC[bi, t0:t0 + q] += tmp_qn
                np.dot(W.T, Cc, tmp_qn)
                dB[bi, t0:t0 + q] += tmp_qn
                np.dot(Ex, dS, tmp_qn)
                dB[bi, t0:t0 + q] += tmp_qn
                total = dtype.type(0)                                   # the segment sums' (q, q) pass: G o M
                for t in range(q):
                    for s in range(t + 1):
                        total += Gm[t, s] * M[t, s] * (t - s)
                seg_terms[bi, hi, k] = total
                np.dot(Ed.T, Cc, dS_local)                              # (p, n)
                e = np.exp(s_incl[q - 1])
                for i in range(p):
                    for j in range(n):
                        dS[i, j] = e * dS[i, j] + dS_local[i, j]
            d_initial[bi, hi] = dS


def _relative(reference, other) -> float:
    return float(np.abs(reference - other).max() / np.abs(reference).max())


def main(argv=None) -> dict | None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    try:
        import scipy  # noqa: F401  (numba's np.dot calls BLAS through SciPy)
    except ImportError:
        print("bench_chunked_numba needs SciPy (pip install scipy): numba's np.dot calls BLAS through it")
        return None
    numba.set_num_threads(1)
    rng = np.random.default_rng(0)
    b, l, h, p, n = 8, 512, 8, 64, 64
    f32 = np.float32
    x = rng.standard_normal((b, l, h, p)).astype(f32)
    dt = (rng.random((b, l, h)) * 0.1).astype(f32)
    A, D = -rng.random(h).astype(f32), rng.standard_normal(h).astype(f32)
    B = (rng.standard_normal((b, l, 1, n)) * 0.3).astype(f32)
    C = (rng.standard_normal((b, l, 1, n)) * 0.3).astype(f32)
    dy = rng.standard_normal((b, l, h, p)).astype(f32)
    xh, dyh = (np.ascontiguousarray(v.transpose(0, 2, 1, 3)) for v in (x, dy))   # (b, h, l, p)
    B1, C1 = np.ascontiguousarray(B[:, :, 0]), np.ascontiguousarray(C[:, :, 0])     # (b, l, n)
    rows, checks = [], {}
    for q in args.chunks:
        y_ref, final_ref, saved = numba_cpu.forward(x, dt, A, B, C, D, None, q)
        d_final = (rng.standard_normal(final_ref.shape) * 0.1).astype(f32)
        y, final = np.empty_like(xh), np.empty_like(final_ref)
        dxh, dB, dC, d_initial = np.empty_like(xh), np.empty_like(B1), np.empty_like(C1), np.empty_like(final_ref)
        seg_terms = np.empty((b, h, l // q), f32)
        forward_args = (xh, dt, A, B1, C1, D, q, y, final)
        backward_args = (xh, dyh, dt, A, B1, C1, D, saved[6], d_final, q, dxh, dB, dC, d_initial, seg_terms)
        chunked_forward(*forward_args)
        chunked_backward(*backward_args)
        # the reference's d initial state: its backward with an initial state of zeros given
        _, _, saved0 = numba_cpu.forward(x, dt, A, B, C, D, np.zeros_like(final_ref), q)
        grads = numba_cpu.backward(saved0, dy, d_final)
        checks[q] = {"y": _relative(y_ref, y.transpose(0, 2, 1, 3)), "final_state": _relative(final_ref, final),
                     "dx": _relative(grads[0], dxh.transpose(0, 2, 1, 3)), "dB": _relative(grads[3][:, :, 0], dB),
                     "dC": _relative(grads[4][:, :, 0], dC), "d_initial": _relative(grads[6], d_initial)}
        sides = (("forward", lambda: numba_cpu.forward(x, dt, A, B, C, D, None, q),
                  lambda: chunked_forward(*forward_args)),
                 ("backward", lambda: numba_cpu.backward(saved, dy, d_final),
                  lambda: chunked_backward(*backward_args)))
        for part, recurrence, chunked in sides:
            ours, theirs = [], []
            for _ in range(args.repeats):                               # interleaved, so drift hits both
                ours.append(timeit(recurrence, repeat=1, warmup=0)["median"])
                theirs.append(timeit(chunked, repeat=1, warmup=0)["median"])
            r_ms, c_ms = 1e3 * float(np.median(ours)), 1e3 * float(np.median(theirs))
            rows.append([part, q, round(r_ms, 2), round(c_ms, 2), round(c_ms / r_ms, 3)])
    for q, diffs in checks.items():
        print(f"q {q}: largest difference from the recurrence, relative: "
              + ", ".join(f"{k} {v:.1e}" for k, v in diffs.items()))
    return write_result(RESULTS / "bench_chunked_numba.json", "bench_chunked_numba",
                        "The chunked scan in numba with BLAS products (a prototype) against the recurrence",
                        ["part", "q", "recurrence ms", "chunked ms", "chunked / recurrence"], rows,
                        notes=[f"b {b}, l {l}, h {h}, p {p}, n {n}, g 1, float32, one thread, median of "
                               f"{args.repeats} interleaved; what the prototypes leave out: the script's docstring"],
                        checks={str(q): v for q, v in checks.items()})


if __name__ == "__main__":
    main()
