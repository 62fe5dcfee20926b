"""Causal depthwise 1-d convolution over time, channels last (Mamba-2's conv1d)."""
from __future__ import annotations

import math

from ..autograd import functional as F
from . import init
from .inputs import layer_input
from ..fast import fused as fused_ops
from ..registry import VarBuilder
from ..autograd.tensor import Tensor


class CausalDepthwiseConv1d:
    """y[b, t, c] = bias[c] + sum_j weight[c, 0, j] * x[b, t + j - (k - 1), c]: step t sees steps t-k+1..t.
    "weight" (c, 1, k) and "bias" (c,), PyTorch's Conv1d(groups=c) layout and default init
    (U(+-1/sqrt(k)) for both, since fan_in = k). fused=True makes `silu_of` one numba op (fast/fused.py)."""

    def __init__(self, vb: VarBuilder, channels: int, kernel_size: int, bias: bool = True,
                 weight_init=None, bias_init=None, fused: bool = False):
        if kernel_size < 1:
            raise ValueError(f"CausalDepthwiseConv1d {vb.prefix!r}: kernel_size must be >= 1, got {kernel_size}")
        self.name, self.channels, self.kernel_size, self.fused = vb.prefix, channels, kernel_size, fused
        bound = 1.0 / math.sqrt(kernel_size)
        self.weight = vb.get((channels, 1, kernel_size), "weight",
                             init=weight_init or init.KaimingUniform(a=math.sqrt(5)))   # (c, 1, k)
        self.bias = vb.get((channels,), "bias", init=bias_init or init.Uniform(-bound, bound)) if bias else None

    def __call__(self, x: Tensor) -> Tensor:
        layer_input(f"CausalDepthwiseConv1d {self.name!r}", "x", x)
        if x.ndim != 3 or x.shape[2] != self.channels:
            raise ValueError(f"CausalDepthwiseConv1d {self.name!r}: x must be (b, l, {self.channels}), got {x.shape}")
        return F.causal_conv1d(x, self.weight, self.bias)               # (b, l, c)

    def silu_of(self, x: Tensor, history: Tensor | None = None) -> Tensor:
        """silu(self(x)), the mixer's conv and activation: one fused op, or two engine ops (fused=False).
        history (b, k - 1, c): the inputs before x (a sequence continued from a cache), seen instead of zeros."""
        layer_input(f"CausalDepthwiseConv1d {self.name!r}", "x", x)
        if history is not None:
            layer_input(f"CausalDepthwiseConv1d {self.name!r}", "history", history)
        if x.ndim != 3 or x.shape[2] != self.channels:
            raise ValueError(f"CausalDepthwiseConv1d {self.name!r}: x must be (b, l, {self.channels}), got {x.shape}")
        expected = (x.shape[0], self.kernel_size - 1, self.channels)
        if history is not None and tuple(history.shape) != expected:  # the engine path cut a shorter output
            raise ValueError(f"CausalDepthwiseConv1d {self.name!r}: history must be (b, k - 1, c) = {expected}, got "
                             f"{tuple(history.shape)}")
        if not self.fused:
            if history is None:
                return F.silu(self(x))
            return F.silu(self(F.cat([history, x], axis=1)))[:, self.kernel_size - 1:]   # (b, l, c)
        return fused_ops.conv1d_silu(x, self.weight, self.bias, history)  # (b, l, c)

    def step(self, state: Tensor, x_t: Tensor) -> tuple[Tensor, Tensor]:
        """One decoding step. state (b, c, k): the last k raw inputs, oldest first; x_t (b, c).
        Returns (y_t (b, c), new state (b, c, k)); stepping through a sequence equals __call__ on it."""
        layer_input(f"CausalDepthwiseConv1d.step {self.name!r}", "state", state)
        b = layer_input(f"CausalDepthwiseConv1d.step {self.name!r}", "x_t", x_t).shape[0]
        if x_t.shape != (b, self.channels) or state.shape != (b, self.channels, self.kernel_size):
            raise ValueError(f"CausalDepthwiseConv1d.step {self.name!r}: need state (b, {self.channels}, "
                             f"{self.kernel_size}) and x_t (b, {self.channels}), got {state.shape} and {x_t.shape}")
        state = F.cat([state[:, :, 1:], F.unsqueeze(x_t, 2)], axis=2)     # (b, c, k)
        w = F.reshape(self.weight, (self.channels, self.kernel_size))     # (c, k)
        y = F.sum(state * w, axis=2)                                       # (b, c)
        if self.bias is not None:
            y = y + self.bias
        return y, state

    def __repr__(self):
        return f"CausalDepthwiseConv1d({self.name!r}, channels={self.channels}, k={self.kernel_size})"
