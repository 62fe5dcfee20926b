"""numba kernels for two plain ops of a training step that NumPy does in several passes with temporaries: the
embedding's gradient (ops/nn.py's Embedding backward) and cross entropy (ops/reduce.py's CrossEntropy).
Each op keeps its NumPy code as the reference, run when the op's class has `fast = False` or the input is not a
case the kernels take; tests/test_row_kernels.py holds the two equal (benchmarks/bench_step_parts.py times them).

    scatter_add_rows(out, ids, rows)        out[ids[i]] += rows[i] for i = 0, 1, ...: np.add.at's order, its bits
    cross_entropy_rows(x, targets, keep,    per row m = max(x), log_s = log(sum(exp(x - m))),
                       grad_scale)          loss = log_s - (x[target] - m) (0 where not kept), and the gradient
                                            (exp(x - m) / sum - onehot(target)) * grad_scale (0 where not kept)

Cross entropy runs over blocks of rows (ops/row_blocks.py) on numba's threads; each row is read from memory once
(its max, its exps and the gradient's row are computed while it is in L1). Backward's gradient is computed in
forward, where the exps are at hand (the scale of a mean, 1 / count, folded in): backward then has nothing left
to do for the loss's usual gradient 1, and it holds what the reference holds, one (N, C) array (its
log-probabilities). exp is models/fast_exp.py's (a few ulp from NumPy's), sums are reassociated into SIMD lanes:
float rounding differs from the reference, nothing else.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, types
from numba.extending import overload

from ..models.fast_exp import exp, exp32
from .row_blocks import on_threads, rows_per_block

_JIT = dict(cache=True, nogil=True, error_model="numpy")
_SUMS = dict(_JIT, fastmath={"reassoc"})          # the exp sum may go into SIMD lanes; no nnan/ninf, no FMA
LANES = 16                                         # the row max keeps 16 running maxima (LLVM does not vectorise
                                                   # a max reduction itself here)
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
def _row_max(row, lanes):
    """max(row) (row non-empty) through LANES running maxima in `lanes` (scratch), so it vectorises. A NaN may be
    skipped: the caller's sum of exps is NaN for such a row anyway."""
    n = row.size
    whole = n - n % LANES
    mx = row[0]
    if whole:
        lanes[:] = row[:LANES]
        for j in range(LANES, whole, LANES):
            block = row[j:j + LANES]
            for k in range(LANES):
                lanes[k] = lanes[k] if lanes[k] >= block[k] else block[k]
        for k in range(LANES):
            mx = mx if mx >= lanes[k] else lanes[k]
    for j in range(whole, n):
        mx = mx if mx >= row[j] else row[j]
    return mx


@njit(**_SUMS)
def _cross_entropy_block(x, targets, keep, mx, log_s, losses, lanes, with_grad, scale, grad):
    """Rows of x (n, C): mx = max, log_s = log(sum(exp(x - mx))), losses = log_s - (x[target] - mx) (0 where not
    kept) and, with_grad, the rows of grad = (softmax(x) - onehot(target)) * scale (0 where not kept), softmax =
    exp(x - mx) / sum. scale is in x's dtype (a float64 literal would widen a float32 loop)."""
    zero = scale - scale                                               # scale is finite: 0 and 1 in its dtype
    one = zero + 1
    for r in range(x.shape[0]):
        row = x[r]
        m = _row_max(row, lanes)
        s = zero
        if with_grad:
            g = grad[r]
            for j in range(row.size):
                e = _exp(row[j] - m)
                g[j] = e
                s += e
        else:
            for j in range(row.size):
                s += _exp(row[j] - m)
        mx[r], log_s[r] = m, np.log(s)
        t = targets[r]
        losses[r] = log_s[r] - (row[t] - m) if keep[r] else zero
        if with_grad:
            if not keep[r]:
                g[:] = zero
                continue
            inverse = one / s
            p_target = g[t] * inverse
            for j in range(row.size):
                g[j] = g[j] * inverse * scale
            g[t] = (p_target - one) * scale


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
    grad = np.empty(x.shape if with_grad else (0, 0), x.dtype)
    scale = x.dtype.type(grad_scale if with_grad else 1)
    rows, n_blocks = _row_blocks(x)

    def work(blocks, share):
        lanes = np.empty(LANES, x.dtype)
        for blk in blocks:
            part = slice(blk * rows, min(n, (blk + 1) * rows))
            _cross_entropy_block(x[part], targets[part], keep[part], mx[part], log_s[part], losses[part], lanes,
                                 with_grad, scale, grad[part] if with_grad else grad)
    with np.errstate(divide="ignore", invalid="ignore"):  # a row that is not finite: the caller falls back
        on_threads(work, n_blocks)
    return losses, mx, log_s, (grad if with_grad else None)
