"""RMS norms: plain (per token) and gated per group of channels (Mamba-2's output norm)."""
from __future__ import annotations

import math
import numbers

from ..autograd import functional as F
from ..autograd.args import is_integer
from . import init
from .inputs import layer_input
from ..fast import fused as fused_ops
from ..registry import VarBuilder
from ..autograd.tensor import Tensor


def _positive_eps(layer: str, name: str, eps) -> float:
    """eps as a float > 0: a negative one made every output NaN, a str failed at the first call (an API audit)."""
    if not isinstance(eps, numbers.Real) or isinstance(eps, bool) or not 0 < eps < math.inf:
        raise ValueError(f"{layer} {name!r}: eps must be a positive finite number, got {eps!r}")
    return float(eps)


class RMSNorm:
    """x / sqrt(mean(x^2, last axis) + eps) * weight; "weight" (dim,) init 1, no bias.
    fused=True runs one numba op (fast/fused.py) instead of the engine's RMSNorm op; the same numbers."""

    def __init__(self, vb: VarBuilder, dim: int, eps: float = 1e-5, fused: bool = False):
        self.name, self.dim, self.eps, self.fused = vb.prefix, dim, _positive_eps("RMSNorm", vb.prefix, eps), fused
        self.weight = vb.get((dim,), "weight", init=init.Const(1.0))   # (dim,)

    def __call__(self, x: Tensor) -> Tensor:
        layer_input(f"RMSNorm {self.name!r}", "input", x)
        if x.shape[-1:] != (self.dim,):
            raise ValueError(f"RMSNorm {self.name!r}: input must end with dim={self.dim}, got shape {x.shape}")
        if self.fused and self.dim:      # (a norm of zero width has no group: the engine op gives its empty result)
            return fused_ops.gated_rms_norm(x, None, self.weight, self.dim, self.eps)
        return F.rms_norm(x, self.weight, self.eps)

    def __repr__(self):
        return f"RMSNorm({self.name!r}, {self.dim}, eps={self.eps})"


class GatedRMSNorm:
    """norm(y, z) = rmsnorm_per_group(y * silu(z)) * weight (gate first, as Mamba-2's norm_before_gate=False).
    The dim channels are split into groups of `group_size`; each group is normalised on its own.
    "weight" (dim,) init 1, no bias. Without z it is a grouped RMSNorm. fused=True runs the whole chain as
    one numba op (fast/fused.py); fused=False composes engine ops (the reference)."""

    def __init__(self, vb: VarBuilder, dim: int, group_size: int, eps: float = 1e-5, fused: bool = False):
        if not is_integer(group_size) or not is_integer(dim):   # 2.0 passed here and failed at the first call
            raise TypeError(f"GatedRMSNorm {vb.prefix!r}: dim and group_size must be ints, got dim={dim!r}, "
                            f"group_size={group_size!r}")
        if group_size <= 0 or dim % group_size:
            raise ValueError(f"GatedRMSNorm {vb.prefix!r}: dim={dim} must be a multiple of group_size={group_size}")
        self.name, self.dim, self.group_size, self.fused = vb.prefix, dim, group_size, fused
        self.eps = _positive_eps("GatedRMSNorm", vb.prefix, eps)
        self.weight = vb.get((dim,), "weight", init=init.Const(1.0))   # (dim,)

    def __call__(self, y: Tensor, z: Tensor | None = None) -> Tensor:
        layer_input(f"GatedRMSNorm {self.name!r}", "y", y)
        if z is not None:
            layer_input(f"GatedRMSNorm {self.name!r}", "z", z)
        if y.shape[-1:] != (self.dim,):
            raise ValueError(f"GatedRMSNorm {self.name!r}: y must end with dim={self.dim}, got shape {y.shape}")
        if z is not None:
            if z.shape != y.shape:
                raise ValueError(f"GatedRMSNorm {self.name!r}: z must have y's shape {y.shape}, got {z.shape}")
        if self.fused:
            return fused_ops.gated_rms_norm(y, z, self.weight, self.group_size, self.eps)
        if z is not None:
            y = y * F.silu(z)                                            # (..., dim)
        groups = self.dim // self.group_size
        grouped = F.reshape(y, (*y.shape[:-1], groups, self.group_size))  # (..., g, dim / g)
        normed = F.reshape(F.rms_norm(grouped, None, self.eps), y.shape)  # (..., dim)
        return normed * self.weight

    def __repr__(self):
        return f"GatedRMSNorm({self.name!r}, {self.dim}, group_size={self.group_size}, eps={self.eps})"
