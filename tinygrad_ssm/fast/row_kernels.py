"""numba kernels for two plain ops of a training step that NumPy does in several passes with temporaries: the
embedding's gradient and cross entropy. The ops that run them are fast/row_ops.py's, twins of the engine's
Embedding (autograd/ops/nn.py) and CrossEntropy (autograd/ops/reduce.py), which stay the reference;
tests/fast/test_row_kernels.py holds each pair equal.

    scatter_add_rows(out, ids, rows)        out[ids[i]] += rows[i] for i = 0, 1, ...: np.add.at's order, its bits
    cross_entropy_rows(x, targets, keep,    per row m = max(x), log_s = log(sum(exp(x - m))),
                       grad_scale)          loss = log_s - (x[target] - m) (0 where not kept), and the gradient
                                            (exp(x - m) / sum - onehot(target)) * grad_scale (0 where not kept)

Cross entropy runs over blocks of rows (fast/row_blocks.py) on numba's threads; each row is read from memory once
(its max, its exps and the gradient's row are computed while it is in L1). Backward's gradient is computed in
forward, where the exps are at hand (the scale of a mean, 1 / count, folded in): backward then has nothing left
to do for the loss's usual gradient 1, and it holds what the reference holds, one (N, C) array (its
log-probabilities). exp is fast/fast_exp.py's (a few ulp from NumPy's), sums are reassociated into SIMD lanes:
float rounding differs from the reference, nothing else.
"""
from __future__ import annotations

import math

import numpy as np
from numba import types
from numba.extending import overload

from . import heap_reuse
from .fast_exp import exp, exp32
from .jit import njit
from .row_blocks import on_threads, rows_per_block

_JIT = dict(cache=True, nogil=True, error_model="numpy")
_SUMS = dict(_JIT, fastmath={"reassoc", "contract"})  # sums into SIMD lanes, FMAs in exp; no nnan/ninf
FLOATS = (np.float32, np.float64)


# --- the embedding's gradient ---------------------------------------------------------------------------

@njit(**_JIT)
def scatter_add_rows(out, ids, rows):
    """out (V, d)[ids[i]] += rows (n, d)[i], i in order: for each entry the additions np.add.at makes, in its
    order, so the same bits. One thread: 4096 rows of 256 take ~0.15 ms, less than waking a second one."""
    for i in range(ids.size):
        o, r = out[ids[i]], rows[i]
        for j in range(o.size):
            o[j] += r[j]


# --- cross entropy ----------------------------------------------------------------------------------------

def _exp(v):  # pragma: no cover - only its numba overload runs
    return math.exp(v)


@overload(_exp)
def _exp_overload(v):
    return (lambda v: exp32(v)) if v == types.float32 else (lambda v: exp(v))


@njit(**_JIT)
def _larger(a, b):
    return a if a >= b else b


@njit(**_JIT)
def _row_max(row):
    """max(row) (row non-empty) through 8 running maxima, so that LLVM puts them in one SIMD register (it does
    not vectorise a plain max reduction here). A NaN may be skipped: the caller's sum of exps is NaN anyway."""
    n = row.size
    whole = n - n % 8
    m = row[0]
    if whole:
        a0, a1, a2, a3, a4, a5, a6, a7 = row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7]
        for j in range(8, whole, 8):
            b = row[j:j + 8]
            a0, a1, a2, a3 = _larger(a0, b[0]), _larger(a1, b[1]), _larger(a2, b[2]), _larger(a3, b[3])
            a4, a5, a6, a7 = _larger(a4, b[4]), _larger(a5, b[5]), _larger(a6, b[6]), _larger(a7, b[7])
        m = _larger(_larger(_larger(a0, a4), _larger(a1, a5)), _larger(_larger(a2, a6), _larger(a3, a7)))
    for j in range(whole, n):
        m = _larger(m, row[j])
    return m


@njit(**_SUMS)
def _sum_exp(row, m, zero):
    """sum(exp(row - m))."""
    s = zero
    for j in range(row.size):
        s += _exp(row[j] - m)
    return s


@njit(**_SUMS)
def _exps_and_sum(row, m, out, zero):
    """out = exp(row - m); returns sum(out), in a loop of its own that only reads: summed in the loop that stores,
    LLVM's vectorised loop was guarded by a check of the arrays' addresses and ran scalar, another order, when out
    lay just past row (the same logits gave a loss in other bits as the allocator placed the gradient)."""
    for j in range(row.size):
        out[j] = _exp(row[j] - m)
    s = zero
    for j in range(out.size):
        s += out[j]
    return s


@njit(**_JIT)
def _softmax_minus_onehot(g, s, t, scale, one):
    """g = exp(row - m) becomes (g / s - onehot(t)) * scale."""
    inverse = one / s
    p_target = g[t] * inverse
    for j in range(g.size):
        g[j] = g[j] * inverse * scale
    g[t] = (p_target - one) * scale


@njit(**_JIT)
def _cross_entropy_block(x, targets, keep, mx, log_s, losses, with_grad, scale, grad):
    """Rows of x (n, C): mx = max, log_s = log(sum(exp(x - mx))), losses = log_s - (x[target] - mx) (0 where not
    kept) and, with_grad, the rows of grad = (softmax(x) - onehot(target)) * scale (0 where not kept), softmax =
    exp(x - mx) / sum. scale is in x's dtype (a float64 literal would widen a float32 loop)."""
    zero = scale - scale                                               # scale is finite: 0 and 1 in its dtype
    one = zero + 1
    for r in range(x.shape[0]):
        row, t = x[r], targets[r]
        m = _row_max(row)
        s = _exps_and_sum(row, m, grad[r], zero) if with_grad else _sum_exp(row, m, zero)
        mx[r], log_s[r] = m, np.log(s)
        losses[r] = log_s[r] - (row[t] - m) if keep[r] else zero
        if with_grad:
            if keep[r]:
                _softmax_minus_onehot(grad[r], s, t, scale, one)
            else:
                grad[r, :] = zero


def _row_blocks(x: np.ndarray) -> tuple[int, int]:
    """(rows per block, number of blocks) for x (N, C)."""
    rows = rows_per_block(x.shape[1], x.itemsize)
    return rows, -(-x.shape[0] // rows)


def cross_entropy_rows(x: np.ndarray, targets: np.ndarray, keep: np.ndarray, grad_scale=None):
    """x (N, C) C-contiguous float, N, C >= 1; targets (N,) ints in [0, C) where keep (N,) bool, anything in
    range elsewhere -> (losses, mx, log_s, grad): losses, mx and log_s (N,) of x's dtype; grad (N, C) the
    gradient of sum(losses) * grad_scale with respect to x, or None when grad_scale is None."""
    n = x.shape[0]
    mx, log_s, losses = (np.empty(n, x.dtype) for _ in range(3))
    with_grad = grad_scale is not None
    grad = heap_reuse.empty(x.shape if with_grad else (0, 0), x.dtype)
    scale = x.dtype.type(grad_scale if with_grad else 1)
    rows, n_blocks = _row_blocks(x)

    def work(blocks, share):
        for blk in blocks:
            part = slice(blk * rows, min(n, (blk + 1) * rows))
            _cross_entropy_block(x[part], targets[part], keep[part], mx[part], log_s[part], losses[part],
                                 with_grad, scale, grad[part] if with_grad else grad)
    with np.errstate(divide="ignore", invalid="ignore"):  # a row that is not finite: the caller falls back
        on_threads(work, n_blocks)
    return losses, mx, log_s, (grad if with_grad else None)
