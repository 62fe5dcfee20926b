"""Layers' building blocks as single fused ops: embedding lookup, causal depthwise conv1d, RMS norm.
Each could be composed from smaller ops; fused, they save memory and time, and the backward is short."""
import numpy as np

from ..function import Function


class Embedding(Function):
    """weight (V, d)[ids (...)] -> (..., d). Backward scatter-adds: a token used twice gets both rows.
    fast/row_ops.py's FusedEmbedding is the numba twin of this op (the same bits; its backward one loop)."""

    def forward(self, weight, ids):
        self.save_for_backward(np.array(ids))  # a copy: the caller may reuse the ids buffer before backward
        self.weight_shape = weight.shape
        return weight[ids]

    def backward(self, grad):
        (ids,) = self.saved
        grad_weight = np.zeros(self.weight_shape, dtype=grad.dtype)
        np.add.at(grad_weight, ids.ravel(), grad.reshape(ids.size, self.weight_shape[1]))   # (n, d); d may be 0
        return grad_weight, None


class CausalConv1d(Function):
    """Depthwise causal convolution over time, channels last:
        y[b, t, c] = bias[c] + sum_j weight[c, j] * x[b, t + j - (k - 1), c]     (x = 0 before t = 0)
    x (b, l, c), weight (c, k), bias (c,) or None. Output t sees inputs t-k+1..t only: causal."""

    def forward(self, x, weight, bias=None):
        b, l, c = x.shape
        k = weight.shape[1]
        x_padded = np.pad(x, ((0, 0), (k - 1, 0), (0, 0)))           # (b, l + k - 1, c)
        out = np.zeros((b, l, c), dtype=np.result_type(x, weight))
        for j in range(k):
            out += x_padded[:, j:j + l, :] * weight[:, j]
        if bias is not None:
            out += bias
        self.save_for_backward(x_padded, weight)
        return out

    def backward(self, grad):                                          # grad (b, l, c)
        x_padded, weight = self.saved
        k = weight.shape[1]
        l = grad.shape[1]
        grad_x = grad_weight = grad_bias = None
        if self.needs_input_grad[0]:
            grad_padded = np.zeros(x_padded.shape, dtype=grad.dtype)
            for j in range(k):
                grad_padded[:, j:j + l, :] += grad * weight[:, j]
            grad_x = grad_padded[:, k - 1:, :]
        if self.needs_input_grad[1]:
            grad_weight = np.stack([np.einsum("blc,blc->c", grad, x_padded[:, j:j + l, :]) for j in range(k)], axis=1)
        if len(self.needs_input_grad) > 2 and self.needs_input_grad[2]:
            grad_bias = grad.sum(axis=(0, 1))
        return grad_x, grad_weight, grad_bias


class RMSNorm(Function):
    """y = x / sqrt(mean(x^2, last axis) + eps) * weight.
    With xhat = x * r and r = 1 / rms: dx = r * (dxhat - xhat * mean(dxhat * xhat)), dxhat = g * weight."""

    def forward(self, x, weight=None, eps=1e-5):
        r = 1 / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) / max(x.shape[-1], 1) + eps)   # (..., 1)
        x_hat = x * r
        self.save_for_backward(x_hat, r, weight)
        return x_hat * weight if weight is not None else x_hat

    def backward(self, grad):
        x_hat, r, weight = self.saved
        d_xhat = grad * weight if weight is not None else grad
        grad_x = r * (d_xhat - x_hat * np.sum(d_xhat * x_hat, axis=-1, keepdims=True) / max(x_hat.shape[-1], 1))
        grad_weight = None
        if weight is not None and self.needs_input_grad[1]:
            grad_weight = (grad * x_hat).sum(axis=tuple(range(x_hat.ndim - 1)))   # (d,) every leading axis
        return grad_x, grad_weight
