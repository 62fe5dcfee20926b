"""The numba twins of two engine ops of a training step: cross entropy and the embedding's gradient, which NumPy
does in several passes with temporaries. Each is a subclass of its engine op (the reference: the same
arguments, results and checks) that runs fast/row_kernels.py where the kernels take the case and the engine
op's own code elsewhere. The model and the layers choose them with fused=True; tests/fast/test_row_kernels.py
holds each equal to its engine op.

    FusedCrossEntropy   twin of autograd/ops/reduce.py CrossEntropy     cross_entropy(logits, targets, ...)
    FusedEmbedding      twin of autograd/ops/nn.py Embedding            embedding(ids, weight)
"""
from __future__ import annotations

import numpy as np

from ..autograd import functional as F
from ..autograd.grad_mode import is_grad_enabled
from ..autograd.ops.nn import Embedding
from ..autograd.ops.reduce import CrossEntropy
from . import heap_reuse, row_kernels


class FusedCrossEntropy(CrossEntropy):
    """One pass over each row gives its loss and, when grad mode is on, its gradient for an output gradient
    of 1 (the mean's 1 / count folded in), which backward hands back as it is (or times the output gradient).
    float32/float64 logits whose rows are all finite; the other cases run CrossEntropy's NumPy code."""

    def _losses(self, logits, targets, keep):
        self.by_kernels, self.kernel_grad = False, None
        # the kernels index rows by target unchecked: the targets must be in range
        if not (logits.dtype in row_kernels.FLOATS and logits.ndim == 2 and min(logits.shape) > 0
                and targets.min() >= 0 and targets.max() < logits.shape[1]):
            return super()._losses(logits, targets, keep)
        x = np.ascontiguousarray(logits)
        scale = 1 / self.count if is_grad_enabled() else None
        losses, mx, log_s, d_logits = row_kernels.cross_entropy_rows(x, targets, keep, scale)
        if not (np.isfinite(mx).all() and np.isfinite(log_s).all()):
            return super()._losses(logits, targets, keep)
        self.save_for_backward(x, targets, keep, mx, log_s)
        self.by_kernels, self.kernel_grad = True, d_logits              # (N, C) for an output gradient of 1
        return losses

    def _check_versions(self):
        # the first backward hands out the gradient made in forward and reads nothing saved: logits changed in place
        # in between are no error (as torch, whose cross entropy saves log-probabilities of its own); a second
        # backward of a retained graph computes it again from the saved logits, so they must be as they were
        if self.kernel_grad is None:
            super()._check_versions()

    def backward(self, grad):
        if not self.by_kernels:
            return super().backward(grad)
        x, targets, keep, mx, log_s = self.saved
        d_logits, self.kernel_grad = self.kernel_grad, None             # handed out once (a second backward of a
        if d_logits is None:                                            # retained graph computes it again)
            d_logits = np.exp((x - mx[:, None]) - log_s[:, None])
            d_logits[np.arange(len(targets)), targets] -= 1
            d_logits *= keep[:, None]
            return d_logits * self._scale(grad), None
        factor = grad[:, None] if self.reduction == "none" else grad    # 1 / count is in d_logits already
        return (d_logits if factor.size == 1 and factor == 1 else d_logits * factor), None


class FusedEmbedding(Embedding):
    """Backward adds the rows in np.add.at's order in one numba loop (row_kernels.scatter_add_rows): the same
    bits. float32/float64 gradients and integer ids; the other cases run Embedding's np.add.at."""

    def backward(self, grad):
        (ids,) = self.saved
        if not (grad.dtype in row_kernels.FLOATS and ids.dtype.kind in "iu"):
            return super().backward(grad)
        grad_weight = heap_reuse.zeros(self.weight_shape, grad.dtype)
        rows = np.ascontiguousarray(grad.reshape(ids.size, self.weight_shape[1]))  # (n, d); d may be 0
        # the ids indexed the weight in forward, so they are in [-V, V): the kernel wraps negatives as NumPy
        row_kernels.scatter_add_rows(grad_weight, ids.ravel(), rows)
        return grad_weight, None


def cross_entropy(logits, targets, ignore_index: int = -100, reduction: str = "mean"):
    """F.cross_entropy (the same checks and results) through FusedCrossEntropy."""
    return F.apply_cross_entropy(FusedCrossEntropy, logits, targets, ignore_index, reduction)


def embedding(ids, weight):
    """F.embedding (the same checks and results) through FusedEmbedding."""
    return F.apply_embedding(FusedEmbedding, ids, weight)
