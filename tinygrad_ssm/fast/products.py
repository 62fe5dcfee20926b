"""Matrix products shared out over the package's threads: the output cut into one block per thread
(fast/row_blocks.py's pool, numba's thread count), each block one BLAS call with BLAS on a single thread
(fast/blas_threads.py). The twin of the engine's Matmul (autograd/ops/linalg.py), for 2-d operands: the layers
and the model use it with fused=True; tests/fast/test_products.py holds the two equal.

Why: the products then run on the same threads as the numba kernels around them, and OpenBLAS's own threads,
never woken, cannot spin after a product and take a core from the kernel that follows. Its threads' spin time
is fixed when NumPy loads OpenBLAS, so with OpenBLAS threading the products, a training step was 1.3x slower
when NumPy was imported before the package (benchmarks/bench_import_order.py: the same speed whatever the
import order this way). Small products (under MIN_WORK multiply-adds, which OpenBLAS runs on one thread
anyway) stay single calls.
"""
from __future__ import annotations

import numpy as np

from ..autograd import functional as F
from ..autograd.ops.linalg import Matmul, is_transposed
from . import heap_reuse
from .blas_threads import single_threaded_blas
from .row_blocks import on_threads, shares

MIN_WORK = 1 << 18   # m k n below which a product is one BLAS call (OpenBLAS's own single-thread threshold)
BLOCK_MIN = 32       # rows (or columns) of the smallest block
FLOATS = (np.float32, np.float64)


def rows_product(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """left (m, k) @ right (k, n) -> (m, n) C-contiguous: the output in one block per thread, cut along its longer
    side. BLAS packs both operands of each call: blocks of rows all pack the whole of `right` (k n each), blocks of
    columns the whole of `left` (m k). At 512 rows (eval's and a prompt's windows) columns ran 2-9% faster for
    in_proj, out_proj and the head; at 2,048 rows the two were within 2% of each other wherever the longer side
    is the columns (in_proj's and the head's forward, out_proj's weight gradient), and rows were up to 10% faster
    wherever it is the rows."""
    m, n = left.shape[0], right.shape[1]
    out = heap_reuse.empty((m, n), np.result_type(left, right))
    if m * left.shape[1] * n < MIN_WORK:
        return np.matmul(left, right, out=out)                       # one thread in OpenBLAS anyway
    by_rows = m >= n
    blocks = shares((m if by_rows else n) // BLOCK_MIN)               # blocks of at least BLOCK_MIN rows or columns
    bounds = [(m if by_rows else n) * i // blocks for i in range(blocks + 1)]

    def work(claimed, share):
        for blk in claimed:
            lo, hi = bounds[blk], bounds[blk + 1]
            if by_rows:
                np.matmul(left[lo:hi], right, out=out[lo:hi])
            else:
                np.matmul(left, right[:, lo:hi], out=out[:, lo:hi])
    with single_threaded_blas():                                      # also for one block: nothing may spin after
        on_threads(work, blocks)
    return out


class RowSplitMatmul(Matmul):
    """Matmul whose 2-d products (forward, and both gradients) are `rows_product`s; the same layouts as
    Matmul's (a transposed operand gets its gradient transposed too). Other shapes and dtypes: Matmul's code."""

    def forward(self, a, b):
        self.save_for_backward(a, b)
        self.takes = _takes(a, b)                   # noted here: backward may hold only one of the operands
        out = rows_product(a, b) if self.takes else a @ b
        self.transposed = (is_transposed(a, out), is_transposed(b, out))
        return out

    def backward(self, grad):
        if not self.takes:
            return super().backward(grad)
        a, b = self.saved
        grad_a = grad_b = None
        if self.needs_input_grad[0]:
            grad_a = rows_product(b, grad.T).T if self.transposed[0] else rows_product(grad, b.T)
        if self.needs_input_grad[1]:
            grad_b = rows_product(grad.T, a).T if self.transposed[1] else rows_product(a.T, grad)
        return grad_a, grad_b


def _takes(a: np.ndarray, b: np.ndarray) -> bool:
    return a.ndim == b.ndim == 2 and a.dtype == b.dtype and a.dtype in FLOATS


def matmul(a, b):
    """F.matmul (the same checks and results) through RowSplitMatmul."""
    return F.apply_matmul(RowSplitMatmul, a, b)
