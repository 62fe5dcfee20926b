"""The numba decoder's products on quantized weights (models/mamba2/quantize.py gives the formats and their spec,
`dequantize`): out[:, lo:hi] = u (b, in) @ W[lo:hi]^T + bias[lo:hi], with W
- int8: q (out, in) int8 and scales (out, in / block) float32, the weight q * s;
- bfloat16: (out, in) uint16, the weight those bits << 16 read as float32.

Four weight rows at a time are dequantized into a small buffer (4 x in: 12 KB at in = 768, it stays in L1), then
multiplied like decode_kernels' float rows: four weight rows times four batch rows share their loads. The
weights are read from memory once, in 1 or 2 bytes, and widened in L1: the step is bandwidth-bound, and the
widening is cheap next to the bytes it saves. In a float64 model the dequantized weights are exact (q * s has
at most 8 + 24 significant bits; a bfloat16 is a float32), so the products are the float64 twin's up to the
order of the sums.
"""
from __future__ import annotations

import numpy as np
from numba import njit

# the options of decode_kernels._JIT (not imported: decode_kernels imports this module)
_JIT = {"cache": True, "nogil": True, "fastmath": {"reassoc", "contract"}, "error_model": "numpy"}


@njit(**_JIT)
def int8_rows(Q, S, lo, hi, u, bias, zero, out):
    """out[:, lo:hi] = u (b, in) @ (q * s)[lo:hi]^T + bias[lo:hi]; Q (out, in) int8, S (out, in / block) f32.
    The usual blocks (32, 64, 128) are literals: the block loop unrolls and vectorises."""
    block = Q.shape[1] // S.shape[1]
    buf = np.empty((4, Q.shape[1]), u.dtype)                            # (4, in) dequantized rows, in L1
    if block == 32:
        _int8_rows_n(Q, S, lo, hi, u, bias, zero, out, buf, 32)
    elif block == 64:
        _int8_rows_n(Q, S, lo, hi, u, bias, zero, out, buf, 64)
    elif block == 128:
        _int8_rows_n(Q, S, lo, hi, u, bias, zero, out, buf, 128)
    else:
        _int8_rows_n(Q, S, lo, hi, u, bias, zero, out, buf, block)


@njit(inline="always", **_JIT)
def _int8_rows_n(Q, S, lo, hi, u, bias, zero, out, buf, block):
    """Four weight rows at a time, summed straight from the int8 bytes: each weight widened and scaled once
    (w = q s) and used for four batch rows (or one, for the last nb % 4). Indices are unsigned: numba adds no
    wraparound select and the one long loop over a row vectorises (measured at the 50,288 x 768 head, one
    thread, batch 1: a loop per block of 32 over slices took 18-22 ms, a slice costing a reference count;
    this one 5.3 ms, float32 4.5-5.4 ms). A last group of fewer than 4 rows goes through buf."""
    nb, k, width = u.shape[0], np.uint64(Q.shape[1]), np.uint64(block)
    nb4 = nb // 4 * 4
    for i in range(lo, hi, 4):
        n = min(4, hi - i)
        if n < 4:
            for r in range(n):
                q, s, w = Q[i + r], S[i + r], buf[r]
                for j in range(k):
                    w[j] = q[j]                                         # widened, then scaled in u's
                    w[j] *= zero + s[j // width]                        # dtype (exact in float64)
            rows_product(buf, n, i, u, bias, zero, out)
            continue
        q0, q1, q2, q3, s0, s1, s2, s3 = Q[i], Q[i + 1], Q[i + 2], Q[i + 3], S[i], S[i + 1], S[i + 2], S[i + 3]
        for bi in range(0, nb4, 4):
            a0 = a1 = a2 = a3 = c0 = c1 = c2 = c3 = d0 = d1 = d2 = d3 = e0 = e1 = e2 = e3 = zero
            u0, u1, u2, u3 = u[bi], u[bi + 1], u[bi + 2], u[bi + 3]
            for j in range(k):
                b = j // width
                w0, w1 = q0[j] * (zero + s0[b]), q1[j] * (zero + s1[b])  # scales in u's dtype: exact
                w2, w3 = q2[j] * (zero + s2[b]), q3[j] * (zero + s3[b])  # in float64
                x0, x1, x2, x3 = u0[j], u1[j], u2[j], u3[j]
                a0, a1, a2, a3 = a0 + w0 * x0, a1 + w0 * x1, a2 + w0 * x2, a3 + w0 * x3
                c0, c1, c2, c3 = c0 + w1 * x0, c1 + w1 * x1, c2 + w1 * x2, c3 + w1 * x3
                d0, d1, d2, d3 = d0 + w2 * x0, d1 + w2 * x1, d2 + w2 * x2, d3 + w2 * x3
                e0, e1, e2, e3 = e0 + w3 * x0, e1 + w3 * x1, e2 + w3 * x2, e3 + w3 * x3
            _store4(out, bi, i, bias[i], a0, a1, a2, a3)
            _store4(out, bi, i + 1, bias[i + 1], c0, c1, c2, c3)
            _store4(out, bi, i + 2, bias[i + 2], d0, d1, d2, d3)
            _store4(out, bi, i + 3, bias[i + 3], e0, e1, e2, e3)
        for bi in range(nb4, nb):
            ub = u[bi]
            a0 = a1 = a2 = a3 = zero
            for j in range(k):
                b = j // width
                x = ub[j]
                a0 += x * q0[j] * s0[b]
                a1 += x * q1[j] * s1[b]
                a2 += x * q2[j] * s2[b]
                a3 += x * q3[j] * s3[b]
            out[bi, i], out[bi, i + 1] = a0 + bias[i], a1 + bias[i + 1]
            out[bi, i + 2], out[bi, i + 3] = a2 + bias[i + 2], a3 + bias[i + 3]


@njit(**_JIT)
def bfloat16_rows(W, lo, hi, u, bias, zero, out):
    """out[:, lo:hi] = u (b, in) @ float32(W << 16)[lo:hi]^T + bias[lo:hi]; W (out, in) uint16."""
    bits = np.empty((4, W.shape[1]), np.uint32)                        # (4, in) widened rows, in L1
    buf = bits.view(np.float32)                                         # the same memory as float32
    for i in range(lo, hi, 4):
        n = min(4, hi - i)
        for r in range(n):
            w, b = W[i + r], bits[r]
            for j in range(w.shape[0]):
                b[j] = np.uint32(w[j]) << np.uint32(16)
        rows_product(buf, n, i, u, bias, zero, out)


@njit(**_JIT)
def rows_product(buf, n, row0, u, bias, zero, out):
    """out[:, row0 + r] = u (b, in) @ buf[r] + bias[row0 + r] for r < n (buf (4, in): weight rows row0...).
    With four rows and four or more batch rows, 4 x 4 blocks (as decode_kernels._matvec_blocks); the rest one
    sum at a time."""
    nb, k = u.shape[0], u.shape[1]
    batch_end = nb // 4 * 4 if n == 4 else 0
    for bi in range(0, batch_end, 4):
        a0 = a1 = a2 = a3 = c0 = c1 = c2 = c3 = d0 = d1 = d2 = d3 = e0 = e1 = e2 = e3 = zero
        for j in range(k):
            w0, w1, w2, w3 = buf[0, j], buf[1, j], buf[2, j], buf[3, j]
            u0, u1, u2, u3 = u[bi, j], u[bi + 1, j], u[bi + 2, j], u[bi + 3, j]
            a0, a1, a2, a3 = a0 + w0 * u0, a1 + w0 * u1, a2 + w0 * u2, a3 + w0 * u3
            c0, c1, c2, c3 = c0 + w1 * u0, c1 + w1 * u1, c2 + w1 * u2, c3 + w1 * u3
            d0, d1, d2, d3 = d0 + w2 * u0, d1 + w2 * u1, d2 + w2 * u2, d3 + w2 * u3
            e0, e1, e2, e3 = e0 + w3 * u0, e1 + w3 * u1, e2 + w3 * u2, e3 + w3 * u3
        _store4(out, bi, row0, bias[row0], a0, a1, a2, a3)
        _store4(out, bi, row0 + 1, bias[row0 + 1], c0, c1, c2, c3)
        _store4(out, bi, row0 + 2, bias[row0 + 2], d0, d1, d2, d3)
        _store4(out, bi, row0 + 3, bias[row0 + 3], e0, e1, e2, e3)
    for bi in range(batch_end, nb):
        for r in range(n):
            acc = zero
            for j in range(k):
                acc += buf[r, j] * u[bi, j]
            out[bi, row0 + r] = acc + bias[row0 + r]


@njit(inline="always", **_JIT)
def _store4(out, bi, i, bias, s0, s1, s2, s3):
    out[bi, i], out[bi + 1, i], out[bi + 2, i], out[bi + 3, i] = s0 + bias, s1 + bias, s2 + bias, s3 + bias


@njit(**_JIT)
def int8_row(Q, S, token, out):
    """out (in,) = the dequantized row `token` of (Q, S): an embedding lookup."""
    block = Q.shape[1] // S.shape[1]
    for j in range(Q.shape[1]):
        out[j] = np.float64(Q[token, j]) * np.float64(S[token, j // block])  # exact, then rounded once


@njit(**_JIT)
def bfloat16_row(W, token, out):
    """out (in,) = the row `token` of bfloat16 bits W, widened."""
    bits = np.empty(W.shape[1], np.uint32)
    for j in range(W.shape[1]):
        bits[j] = np.uint32(W[token, j]) << np.uint32(16)
    wide = bits.view(np.float32)
    for j in range(W.shape[1]):
        out[j] = wide[j]
