"""The layers' ops of `tinygrad_ssm/autograd/functional.py` (torch.nn.functional's): cross entropy, embedding,
causal depthwise conv1d, RMS norm. Each checks its arguments, as functional's ops do, and calls its `Function` in
`tinygrad_ssm/autograd/ops/`; functional imports them at its end, so `functional.embedding` is this module's."""
from __future__ import annotations

from . import args as A
from . import functional as F
from .dtypes import is_float
from .functional import op
from .ops import nn as N
from .ops import reduce as R


@op
def cross_entropy(logits, targets, ignore_index: int = -100, reduction: str = "mean"):
    """Negative log-likelihood of integer targets under softmax(logits). logits (..., C) float, targets (...)
    int: the class axis is the LAST (torch's (N, C, L) is (N, L, C) here); target == ignore_index is left out."""
    return apply_cross_entropy(R.CrossEntropy, logits, targets, ignore_index, reduction)


def apply_cross_entropy(function: type, logits, targets, ignore_index: int = -100, reduction: str = "mean"):
    """cross_entropy's checks and reshapes around `function`: R.CrossEntropy or a twin (fast/row_ops.py's)."""
    logits = A.as_tensor("cross_entropy", "logits", logits)
    targets = A.constant_array("cross_entropy", "targets", targets,
                               what="integers (class indices; probability targets are not supported)")
    ignore_index = A.integer("cross_entropy", "ignore_index", ignore_index)
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"cross_entropy: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    if not is_float(logits.dtype):
        raise TypeError(f"cross_entropy: logits must be floating point, got dtype {logits.dtype}")
    if logits.ndim == 0:
        raise ValueError("cross_entropy: logits must have a class axis, (..., C) or (C,), got a 0-d tensor")
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"cross_entropy: logits {logits.shape} need targets of shape {logits.shape[:-1]}, got "
                         f"{targets.shape} (the class axis is the last: torch's (N, C, L) logits are (N, L, C) here)")
    classes = logits.shape[-1]
    bad = (targets != ignore_index) & ((targets < 0) | (targets >= classes))
    if bad.any():
        raise IndexError(f"cross_entropy: target {targets[bad][0]} is out of range for {classes} classes "
                         f"(logits {logits.shape}, targets {targets.shape})")
    flat = F.reshape(logits, (targets.size, classes))
    losses = function.apply(flat, targets.reshape(-1), ignore_index=ignore_index, reduction=reduction)
    return F.reshape(losses, targets.shape) if reduction == "none" else losses


# --- layers' building blocks ----------------------------------------------------------------------------

@op
def embedding(ids, weight):
    """torch.nn.functional.embedding: rows of weight (V, d) picked by integer ids (...) -> (..., d)."""
    return apply_embedding(N.Embedding, ids, weight)


def apply_embedding(function: type, ids, weight):
    """embedding's checks around `function`: N.Embedding or a twin of it (e.g. fast/row_ops.FusedEmbedding)."""
    ids, weight = A.constant_array("embedding", "ids", ids), A.as_tensor("embedding", "weight", weight)
    if weight.ndim != 2:
        raise ValueError(f"embedding: weight must be (vocab, dim), got shape {weight.shape}")
    if ids.size and (ids.min() < 0 or ids.max() >= weight.shape[0]):
        raise IndexError(f"embedding: ids must be in [0, {weight.shape[0]}) for weight of shape {weight.shape}, "
                         f"got min {ids.min()} max {ids.max()} (ids of shape {ids.shape})")
    return function.apply(weight, ids)


@op
def causal_conv1d(x, weight, bias=None):
    """Depthwise causal conv over time, channels last. x (b, l, c); weight (c, 1, k) as in PyTorch's
    Conv1d(groups=c) or (c, k); bias (c,) or None. Output (b, l, c): step t sees steps t-k+1..t."""
    x, weight = A.as_tensor("causal_conv1d", "x", x), A.as_tensor("causal_conv1d", "weight", weight)
    bias = None if bias is None else A.as_tensor("causal_conv1d", "bias", bias)
    given_weight_shape = weight.shape  # for the error message, before the (c, 1, k) -> (c, k) reshape
    if weight.ndim == 3 and weight.shape[1] == 1:
        weight = F.reshape(weight, (weight.shape[0], weight.shape[2]))
    if x.ndim != 3 or weight.ndim != 2 or weight.shape[0] != x.shape[2] or weight.shape[1] < 1:
        raise ValueError(f"causal_conv1d: need x (b, l, c) and weight (c, 1, k) or (c, k) with the same c and k >= 1, "
                         f"got x {x.shape} and weight {given_weight_shape}")
    if bias is not None and bias.shape != (x.shape[2],):
        raise ValueError(f"causal_conv1d: bias must have shape ({x.shape[2]},), got {bias.shape}")
    # one dtype for every operand, by the binary ops' rule (as matmul): an integer x meeting a float weight or bias
    # takes the float type, and a float64 bias is never rounded into a float32 output
    operands = F.same_dtype([x, weight] if bias is None else [x, weight, bias])
    return N.CausalConv1d.apply(*operands)


@op
def rms_norm(x, weight=None, eps: float = 1e-5):
    """x / sqrt(mean(x^2, last axis) + eps) * weight; weight (d,) or None."""
    x = A.float_tensor("rms_norm", "x", x)
    eps = A.number("rms_norm", "eps", eps)
    if x.ndim == 0:
        raise ValueError("rms_norm: x needs a last axis to normalise over, got a 0-d tensor")
    if weight is not None:
        weight = A.as_tensor("rms_norm", "weight", weight)
        if weight.shape != x.shape[-1:]:
            raise ValueError(f"rms_norm: weight must have shape {x.shape[-1:]}, got {weight.shape}")
        return N.RMSNorm.apply(x, weight, eps=eps)
    return N.RMSNorm.apply(x, eps=eps)
