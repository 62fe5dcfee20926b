"""The numba kernels of Conv1dSilu (fast/fused.py): causal depthwise conv1d + SiLU, forward and backward, over the
steps [t0, t1) of one sequence, one pass per output row with the exp inside the loop (fast/fast_exp: exp32
for float32 data, the float64 exp for float64; LLVM vectorises both, where NumPy's exp was a pass of its own
over a scratch block and the conv's sum k + 1 passes).

The weight comes transposed and zero-padded at the front to a multiple of 4 rows, w (kp, c) with w[kp - k:] =
weight.T, and pre[t] = bias + sum_j w[j] x[t + j - (kp - 1)]. The official width, 4, has a loop of its own for
every step whose rows are all there (forward from step 3 on, backward's dx also up to step l - 4): 4 rows
sliced straight, no choice. The other steps (a sequence's first 3, backward's last 3) and other widths take
`_generic_*`: 4 rows at a time, a row that is not there (before the sequence, past its end, a padding row of w)
read as `zero`, so it adds exact zeros. Measured on the forward at the benchmark's shape: with every row picked
by such a condition the loop took a third longer.
Rows come as slices from column col on (see row_blocks.as_rows): indexed from 0 they vectorise, indexed
x[r, col + ch] they would not.
"""
from __future__ import annotations

from .fast_exp import sigmoid, silu
from .jit import njit

_JIT = dict(cache=True, nogil=True, fastmath={"reassoc", "contract"},  # sums may vectorise; no nnan/ninf
            error_model="numpy")  # x / 0 = inf, no ZeroDivisionError check: a branch per division stops SIMD


@njit(cache=True, nogil=True, inline="always")
def _row(a, r, col, c, real, zero):
    """a[r, col:col + c] when `real`, else the zero row."""
    return a[r, col:col + c] if real else zero


@njit(cache=True, nogil=True, inline="always")
def _x_rows(x, col, c, r, t, q, kp, k, zero):
    """The 4 rows x[t + j - (kp - 1)] for j = q..q + 3 (sequence step t is base row r): zero where t + j - (kp - 1)
    < 0 or j < kp - k (a padding row of w)."""
    o = q - (kp - 1)
    return (_row(x, r + o, col, c, t + o >= 0 and q >= kp - k, zero),
            _row(x, r + o + 1, col, c, t + o + 1 >= 0 and q + 1 >= kp - k, zero),
            _row(x, r + o + 2, col, c, t + o + 2 >= 0 and q + 2 >= kp - k, zero),
            _row(x, r + o + 3, col, c, t + o + 3 >= 0 and q + 3 >= kp - k, zero))


@njit(**_JIT)
def _generic_pre(x, col, r, t, w, k, bias, zero, pre):
    """pre = bias + sum_j w[j] x[t + j - (kp - 1)] for step t (base row r), 4 rows of w at a time."""
    c, kp = pre.shape[0], w.shape[0]
    for q in range(0, kp, 4):
        x0, x1, x2, x3 = _x_rows(x, col, c, r, t, q, kp, k, zero)
        w0, w1, w2, w3 = w[q], w[q + 1], w[q + 2], w[q + 3]
        acc = bias if q == 0 else pre                                    # the sum so far
        for ch in range(c):
            pre[ch] = acc[ch] + w0[ch] * x0[ch] + w1[ch] * x1[ch] + w2[ch] * x2[ch] + w3[ch] * x3[ch]


@njit(**_JIT)
def _generic_silu(x, col, r, t, w, k, bias, zero, out):
    """out = silu(pre) for step t (base row r)."""
    _generic_pre(x, col, r, t, w, k, bias, zero, out)
    for ch in range(out.shape[0]):
        out[ch] = silu(out[ch])


@njit(**_JIT)
def _generic_d(x, col, r, t, w, k, bias, zero, one, g, d):
    """d = g silu'(pre) for step t (base row r), as in conv_silu_backward."""
    _generic_pre(x, col, r, t, w, k, bias, zero, d)
    for ch in range(d.shape[0]):
        s = sigmoid(d[ch])
        d[ch] = g[ch] * s * (one + d[ch] * (one - s))


@njit(**_JIT)
def conv_silu_forward(x, col, l, w, k, bias, zero, seq, t0, t1, out):
    """out[seq l + t] = silu(pre[t]) for t in [t0, t1); x (rows of the (b l, c) input from column col on), out
    (b l, c). silu(v) = v / (1 + exp(-v)) (exp(-v) = inf: -0)."""
    c = out.shape[1]
    w0, w1, w2, w3 = w[0], w[1], w[2], w[3]
    for t in range(t0, t1):
        r = seq * l + t
        o = out[r]
        if k == 4 and t >= 3:
            x0, x1, x2, x3 = x[r - 3, col:col + c], x[r - 2, col:col + c], x[r - 1, col:col + c], x[r, col:col + c]
            for ch in range(c):
                o[ch] = silu(bias[ch] + w0[ch] * x0[ch] + w1[ch] * x1[ch] + w2[ch] * x2[ch] + w3[ch] * x3[ch])
        else:
            _generic_silu(x, col, r, t, w, k, bias, zero, o)


@njit(**_JIT)
def _generic_dx_dw(x, col, l, w, k, zero, t, i, r, d, out, dw, db):
    """Step t (row i of d, base row r): out = sum_j w[j] d[i + kp - 1 - j] (zero past step l - 1 and for padding
    rows), dw[j] += d[i] x[t + j - (kp - 1)], db += d[i]; 4 rows of w at a time."""
    c, kp = d.shape[1], w.shape[0]
    g = d[i]
    for ch in range(c):
        out[ch] = zero[ch]
        db[ch] += g[ch]
    for q in range(0, kp, 4):
        o = kp - 1 - q                                                   # d row i + o - jj pairs with w row q + jj
        d0 = _row(d, i + o, 0, c, t + o < l and q >= kp - k, zero)
        d1 = _row(d, i + o - 1, 0, c, t + o - 1 < l and q + 1 >= kp - k, zero)
        d2 = _row(d, i + o - 2, 0, c, t + o - 2 < l and q + 2 >= kp - k, zero)
        d3 = _row(d, i + o - 3, 0, c, t + o - 3 < l and q + 3 >= kp - k, zero)
        x0, x1, x2, x3 = _x_rows(x, col, c, r, t, q, kp, k, zero)
        w0, w1, w2, w3 = w[q], w[q + 1], w[q + 2], w[q + 3]
        a0, a1, a2, a3 = dw[q], dw[q + 1], dw[q + 2], dw[q + 3]
        for ch in range(c):
            out[ch] += w0[ch] * d0[ch] + w1[ch] * d1[ch] + w2[ch] * d2[ch] + w3[ch] * d3[ch]
            a0[ch] += g[ch] * x0[ch]
            a1[ch] += g[ch] * x1[ch]
            a2[ch] += g[ch] * x2[ch]
            a3[ch] += g[ch] * x3[ch]


@njit(**_JIT)
def conv_silu_grad(x, col, l, w, k, bias, zero, one, grad, gcol, seq, t0, t1, d):
    """The backward's first half, steps [t0, h) of sequence seq, h = min(t1 + kp - 1, l) (dx at t needs d up to
    t + kp - 1): d[t - t0] = grad s (1 + pre (1 - s)), s = sigmoid(pre) = 1 / (1 + exp(-pre)), pre recomputed as
    in forward; d (t1 - t0 + kp - 1, c) scratch. one: 1 in the data's dtype (a float64 literal would widen
    float32 lanes). Then conv_dx_dw, on the block's rows while they are in L2."""
    c, kp = d.shape[1], w.shape[0]
    w0, w1, w2, w3 = w[0], w[1], w[2], w[3]
    for t in range(t0, min(t1 + kp - 1, l)):
        r = seq * l + t
        dt, g = d[t - t0], grad[r, gcol:gcol + c]
        if k == 4 and t >= 3:
            x0, x1, x2, x3 = x[r - 3, col:col + c], x[r - 2, col:col + c], x[r - 1, col:col + c], x[r, col:col + c]
            for ch in range(c):
                v = bias[ch] + w0[ch] * x0[ch] + w1[ch] * x1[ch] + w2[ch] * x2[ch] + w3[ch] * x3[ch]
                s = sigmoid(v)
                dt[ch] = g[ch] * s * (one + v * (one - s))
        else:
            _generic_d(x, col, r, t, w, k, bias, zero, one, g, dt)


@njit(**_JIT)
def conv_dx_dw(x, col, l, w, k, zero, seq, t0, t1, d, dx, dxcol, dw, db):
    """The backward's second half, steps [t0, t1), d from conv_silu_grad: dx[t] = sum_j w[j] d[t + kp - 1 - j]
    (d = 0 from step l on), dw[j] += sum_t d[t] x[t + j - (kp - 1)], db += sum_t d[t]; dw (kp, c) padded like w."""
    c = d.shape[1]
    w0, w1, w2, w3 = w[0], w[1], w[2], w[3]
    a0, a1, a2, a3 = dw[0], dw[1], dw[2], dw[3]
    for t in range(t0, t1):
        i, r = t - t0, seq * l + t
        out = dx[r, dxcol:dxcol + c]
        if k == 4 and 3 <= t < l - 3:
            x0, x1, x2, x3 = x[r - 3, col:col + c], x[r - 2, col:col + c], x[r - 1, col:col + c], x[r, col:col + c]
            g, d1, d2, d3 = d[i], d[i + 1], d[i + 2], d[i + 3]
            for ch in range(c):
                out[ch] = w3[ch] * g[ch] + w2[ch] * d1[ch] + w1[ch] * d2[ch] + w0[ch] * d3[ch]
                db[ch] += g[ch]
                a0[ch] += g[ch] * x0[ch]
                a1[ch] += g[ch] * x1[ch]
                a2[ch] += g[ch] * x2[ch]
                a3[ch] += g[ch] * x3[ch]
        else:
            _generic_dx_dw(x, col, l, w, k, zero, t, i, r, d, out, dw, db)
