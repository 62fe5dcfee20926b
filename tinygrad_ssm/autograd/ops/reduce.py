"""Reductions and the softmax family: each forward beside its backward.

`axis` arrives normalised (a tuple of non-negative ints, or None for all axes) from `functional`.
A reduction's backward first puts the reduced axes back as size 1 (`_keep`), then broadcasts.
"""
import numpy as np

from ..function import Function


def _keep(grad, input_ndim, axis, keepdims):
    """Reinsert the reduced axes as size 1 so `grad` broadcasts against the input."""
    if keepdims:
        return grad
    axes = range(input_ndim) if axis is None else axis
    return np.expand_dims(grad, tuple(axes))


def _sum_dtype(a: np.ndarray):
    """torch sums integers and bools as int64 (NumPy sums uint8 as uint64); floats keep their dtype."""
    return np.int64 if a.dtype.kind in "biu" else None


class Sum(Function):
    def forward(self, a, axis=None, keepdims=False):
        self.shape, self.axis, self.keepdims = a.shape, axis, keepdims
        return np.sum(a, axis=axis, keepdims=keepdims, dtype=_sum_dtype(a))

    def backward(self, grad):
        return np.broadcast_to(_keep(grad, len(self.shape), self.axis, self.keepdims), self.shape)


class Mean(Function):
    def forward(self, a, axis=None, keepdims=False):
        self.shape, self.axis, self.keepdims = a.shape, axis, keepdims
        self.count = a.size if axis is None else int(np.prod([a.shape[i] for i in axis]))
        if self.count == 0:  # the mean of no elements is nan (as torch), without NumPy's warning
            return np.full(np.sum(a, axis=axis, keepdims=keepdims).shape, np.nan, dtype=a.dtype)
        return np.mean(a, axis=axis, keepdims=keepdims)

    def backward(self, grad):
        if self.count == 0:  # no element had any influence
            return np.zeros(self.shape, dtype=grad.dtype)
        grad = _keep(grad, len(self.shape), self.axis, self.keepdims) / self.count
        return np.broadcast_to(grad, self.shape)


class Max(Function):
    """The gradient goes to the maximal entries (Min: the minimal), split evenly among ties (torch.amax's and
    amin's rule)."""
    extreme = staticmethod(np.max)  # np.min in Min: the one line the two ops differ in

    def forward(self, a, axis=None, keepdims=False):
        out = self.extreme(a, axis=axis, keepdims=True)
        is_extreme = a == out
        self.save_for_backward(is_extreme)
        self.axis, self.keepdims, self.ndim = axis, keepdims, a.ndim
        return out if keepdims else np.squeeze(out, axis=tuple(range(a.ndim)) if axis is None else axis)

    def backward(self, grad):
        (is_extreme,) = self.saved
        ties = is_extreme.sum(axis=self.axis, keepdims=True)
        return _keep(grad, self.ndim, self.axis, self.keepdims) * is_extreme / ties


class Min(Max):
    """The gradient goes to the minimal entries, split evenly among ties (torch.amin's rule)."""
    extreme = staticmethod(np.min)


class LogSumExp(Function):
    """log(sum(exp(a))) computed as m + log(sum(exp(a - m))); d/da = softmax(a)."""

    def forward(self, a, axis=None, keepdims=False):
        m = np.max(a, axis=axis, keepdims=True, initial=-np.inf)  # -inf over no elements
        m = np.where(np.isfinite(m), m, 0)  # an all -inf (or empty) slice gives -inf, not NaN
        with np.errstate(divide="ignore"):  # log(0) = -inf is the answer for an all -inf slice, not a warning
            out = m + np.log(np.sum(np.exp(a - m), axis=axis, keepdims=True))
        self.save_for_backward(a, out)
        self.axis, self.keepdims, self.ndim = axis, keepdims, a.ndim
        return out if keepdims else np.squeeze(out, axis=tuple(range(a.ndim)) if axis is None else axis)

    def backward(self, grad):
        a, out = self.saved
        return _keep(grad, self.ndim, self.axis, self.keepdims) * np.exp(a - out)


def _log_softmax(a, axis):
    # a C-ordered result whatever the input's strides, as torch's: .view works on it
    a = a if a.flags.c_contiguous else a.copy(order="C")
    shifted = a - np.max(a, axis=axis, keepdims=True, initial=-np.inf)  # initial: an empty axis is fine
    with np.errstate(divide="ignore"):  # log(0) only for an empty lane (otherwise the max term adds exp(0) = 1)
        return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


class Softmax(Function):
    """s = exp(a) / sum(exp(a)); the Jacobian-vector product is s * (g - sum(g * s))."""

    def forward(self, a, axis=-1):
        out = np.exp(_log_softmax(a, axis))
        self.save_for_backward(out)
        self.axis = axis
        return out

    def backward(self, grad):
        (s,) = self.saved
        return s * (grad - np.sum(grad * s, axis=self.axis, keepdims=True))


class LogSoftmax(Function):
    """a - logsumexp(a); backward: g - softmax(a) * sum(g)."""

    def forward(self, a, axis=-1):
        out = _log_softmax(a, axis)
        self.save_for_backward(out)
        self.axis = axis
        return out

    def backward(self, grad):
        (out,) = self.saved
        return grad - np.exp(out) * np.sum(grad, axis=self.axis, keepdims=True)


class CrossEntropy(Function):
    """Mean (or sum, or per-item) negative log-likelihood of integer targets under softmax(logits).
    logits (N, C), targets (N,) ints; rows whose target is ignore_index count for nothing, and the mean
    is over the rows that count (as torch). Fused: backward is (softmax - onehot) / count.
    fast/row_ops.py's FusedCrossEntropy is the numba twin of this op: it overrides `_losses` and `backward`."""

    def forward(self, logits, targets, ignore_index=-100, reduction="mean"):
        keep = targets != ignore_index                                  # (N,)
        safe_targets = np.where(keep, targets, 0)
        count = max(int(keep.sum()), 1) if reduction == "mean" else 1
        self.reduction, self.count = reduction, count
        losses = self._losses(logits, safe_targets, keep)              # (N,)
        if reduction == "none":
            return losses
        total = losses.sum()
        if reduction == "mean" and not keep.any():
            return np.asarray(np.nan, logits.dtype)  # torch gives nan for a mean over nothing
        return np.asarray(total / count, dtype=logits.dtype)

    def _losses(self, logits, targets, keep):
        """(N,) losses, 0 where a row is not kept."""
        log_probs = _log_softmax(logits, axis=-1)                      # (N, C)
        rows = np.arange(len(targets))
        # where, not * keep: an ignored row may read a -inf log-probability, and -inf * 0 is nan; with no
        # classes every row is ignored (a target would be out of range) and there is nothing to read
        picked = log_probs[rows, targets] if log_probs.shape[-1] else np.zeros(len(targets), log_probs.dtype)
        losses = np.where(keep, -picked, 0)                             # (N,)
        self.save_for_backward(log_probs, targets, keep)
        return losses

    def _scale(self, grad):
        """The output gradient as a factor of each row's gradient: per row for reduction='none', else / count."""
        return grad[:, None] if self.reduction == "none" else grad / self.count

    def backward(self, grad):
        log_probs, targets, keep = self.saved
        d_logits = np.exp(log_probs)                                    # softmax (N, C)
        if d_logits.shape[-1]:                                          # (no classes: nothing to subtract from)
            d_logits[np.arange(len(targets)), targets] -= 1
        d_logits *= keep[:, None]
        return d_logits * self._scale(grad), None


class Cumsum(Function):
    """Running sum along one axis; its backward is the running sum of grad from the other end."""

    def forward(self, a, axis=0):
        self.axis = axis
        a = a if a.flags.c_contiguous else a.copy(order="C")          # a C-ordered result, as torch's
        return np.cumsum(a, axis=axis, dtype=_sum_dtype(a))

    def backward(self, grad):
        return np.flip(np.cumsum(np.flip(grad, self.axis), axis=self.axis), self.axis)
