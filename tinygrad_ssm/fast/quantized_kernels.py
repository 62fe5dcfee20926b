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
    for i in range(lo, hi, 4):
        n = min(4, hi - i)
        for r in range(n):
            q, s, w = Q[i + r], S[i + r], buf[r]
            for b in range(S.shape[1]):
                scale = zero + s[b]                                     # in u's dtype: exact q * s in float64
                qb, wb = q[b * block:(b + 1) * block], w[b * block:(b + 1) * block]   # views from 0: vectorise
                for j in range(block):
                    wb[j] = qb[j] * scale
        rows_product(buf, n, i, u, bias, zero, out)


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
