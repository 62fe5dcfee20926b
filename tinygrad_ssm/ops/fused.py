"""Fused ops for the Mamba-2 mixer's hot chains: one engine op (and one pass over memory) where the plain
composition takes several. Internal: the model and the layers call them when built with fused=True; every
one has a slow twin made of engine ops (the `reference_*` function beside it), which tests/test_fused.py
holds equal in float64 to 1e-10, and gradchecks.

    split_last(x, sizes)               = F.split(x, sizes, axis=-1), one op whose backward writes one array
    conv1d_silu(x, weight, bias)       = silu(causal_conv1d(x, weight, bias))
    dt_softplus(dt, bias, low, high)   = clip(softplus(dt + bias), low, high)
    gated_rms_norm(y, z, weight, G, e) = rms_norm per group of G channels of (y * silu(z)), times weight

The numba kernels loop over rows in parallel (prange) and over channels innermost (contiguous); they keep
the input dtype (a float32 model stays float32) and recompute cheap intermediates in backward instead of
saving them, so a fused op holds less memory than its composition.
"""
from __future__ import annotations

import math
import os

import numba
import numpy as np
from numba import njit, prange

from .. import functional as F
from ..tensor import Function, Tensor

_JIT = dict(cache=True, nogil=True, fastmath={"reassoc", "contract"})  # sums may vectorise; no nnan/ninf

# numba's default OpenMP pool spins after each parallel loop and starves the BLAS threads of the matmul that
# follows (a training step ran 2-5x slower on 2 cores); the workqueue pool sleeps. Set before the first
# parallel launch; NUMBA_THREADING_LAYER in the environment still decides when given.
if "NUMBA_THREADING_LAYER" not in os.environ:
    numba.config.THREADING_LAYER = "workqueue"


def _sigmoid(a: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-a)) in a's dtype with NumPy's SIMD exp: numba's scalar exp (no SVML here) was most of
    each fused kernel's time. exp overflowing to inf gives exactly 0, as it should."""
    with np.errstate(over="ignore"):
        s = np.exp(-a)
    s += 1
    return np.reciprocal(s, out=s)


# --- split along the last axis ------------------------------------------------------------------------------

class SplitLast(Function):
    """x (..., sum(sizes)) -> views x[..., s_i:s_i + n_i]. Backward: the pieces' gradients side by side
    (one concatenate; an unused piece arrives as zeros), instead of one full-size zeros array per piece."""

    is_view = True

    def forward(self, x, sizes=()):
        starts = np.cumsum((0,) + tuple(sizes))
        return tuple(x[..., a:b] for a, b in zip(starts[:-1], starts[1:]))

    def backward(self, *grads):
        return np.concatenate(grads, axis=-1)


def split_last(x: Tensor, sizes) -> tuple:
    sizes = tuple(int(s) for s in sizes)
    if sum(sizes) != x.shape[-1] or min(sizes, default=0) < 0:
        raise ValueError(f"split_last: sizes {sizes} don't add up to the last axis of {x.shape}")
    return SplitLast.apply(x, sizes=sizes)


# --- causal depthwise conv1d + SiLU -------------------------------------------------------------------------

@njit(parallel=True, **_JIT)
def _conv_silu_pre(x, wT, bias, pre):
    """pre[b, t, c] = bias[c] + sum_j wT[j, c] x[b, t + j - (k - 1), c]   (x = 0 before t = 0)."""
    nb, l, c = x.shape
    k = wT.shape[0]
    for i in prange(nb * l):
        bi, t = i // l, i % l
        for ch in range(c):
            pre[bi, t, ch] = bias[ch]
        for j in range(k):
            s = t + j - (k - 1)
            if s >= 0:
                for ch in range(c):
                    pre[bi, t, ch] += wT[j, ch] * x[bi, s, ch]


@njit(parallel=True, **_JIT)
def _conv_silu_backward(x, wT, grad, dpre, sig, ones, dx, dw_partial):
    """dpre holds pre (the conv output) on entry and its gradient on exit; sig = sigmoid(pre); ones = [1] in
    the data's dtype (a float64 literal would widen every float32 lane). dx[b, s] = sum_j wT[j] dpre[b, s + k
    - 1 - j]; dw_partial[b, j, c] = sum_t dpre[b, t, c] x[b, t + j - (k - 1), c] (summed over b by the caller)."""
    nb, l, c = x.shape
    k = wT.shape[0]
    one = ones[0]
    for bi in prange(nb):
        for t in range(l):
            for ch in range(c):
                a, s = dpre[bi, t, ch], sig[bi, t, ch]
                dpre[bi, t, ch] = grad[bi, t, ch] * s * (one + a * (one - s))
        for s_ in range(l):
            for ch in range(c):
                dx[bi, s_, ch] = 0.0
            for j in range(k):
                t = s_ + (k - 1) - j
                if t < l:
                    for ch in range(c):
                        dx[bi, s_, ch] += wT[j, ch] * dpre[bi, t, ch]
        for j in range(k):
            for ch in range(c):
                dw_partial[bi, j, ch] = 0.0
            for t in range(max(0, (k - 1) - j), l):
                for ch in range(c):
                    dw_partial[bi, j, ch] += dpre[bi, t, ch] * x[bi, t + j - (k - 1), ch]


class Conv1dSilu(Function):
    """y = silu(pre), pre[b, t, c] = bias[c] + sum_j weight[c, j] x[b, t + j - (k - 1), c].
    x (b, l, c) (a strided view is copied), weight (c, k), bias (c,) or None. Saves x only: pre is recomputed in
    backward (k multiply-adds per entry). With d = grad * s (1 + pre (1 - s)), s = sigmoid(pre):
    dx[t] = sum_j weight[:, j] d[t + k - 1 - j], dweight[:, j] = sum_t d[t] x[t + j - (k - 1)], dbias = sum d."""

    def forward(self, x, weight, bias=None):
        dtype = np.result_type(x, weight)
        wT = np.ascontiguousarray(weight.T, dtype=dtype)                 # (k, c)
        b_ = np.zeros(x.shape[2], dtype) if bias is None else bias.astype(dtype, copy=False)
        # the kernels run on a contiguous copy of a strided x (the in_proj split's view): over the view they
        # ran 2-3x slower (no vector loads). The view itself is saved (its base lives on anyway), and copied
        # again in backward: one more pass, no memory held between forward and backward
        self.save_for_backward(x, wT, b_)
        x = np.ascontiguousarray(x, dtype=dtype)
        out = np.empty(x.shape, dtype)                                   # (b, l, c)
        _conv_silu_pre(x, wT, b_, out)
        return np.multiply(out, _sigmoid(out), out=out)

    def backward(self, grad):                                          # grad (b, l, c)
        x, wT, b_ = self.saved
        x = np.ascontiguousarray(x, dtype=wT.dtype)
        grad = np.ascontiguousarray(grad, dtype=x.dtype)
        d = np.empty(x.shape, x.dtype)
        _conv_silu_pre(x, wT, b_, d)
        dx = np.empty(x.shape, x.dtype)
        dw_partial = np.empty((x.shape[0],) + wT.shape, x.dtype)        # (b, k, c)
        _conv_silu_backward(x, wT, grad, d, _sigmoid(d), np.ones(1, x.dtype), dx, dw_partial)
        grad_bias = d.sum(axis=(0, 1)) if len(self.needs_input_grad) > 2 and self.needs_input_grad[2] else None
        return dx, dw_partial.sum(axis=0).T, grad_bias


def _conv_weight(weight: Tensor) -> Tensor:
    return F.reshape(weight, (weight.shape[0], weight.shape[2])) if weight.ndim == 3 else weight


def conv1d_silu(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """silu(causal_conv1d(x, weight, bias)): x (b, l, c), weight (c, 1, k) or (c, k), bias (c,) or None."""
    weight = _conv_weight(weight)
    if x.ndim != 3 or weight.ndim != 2 or weight.shape[0] != x.shape[2]:
        raise ValueError(f"conv1d_silu: need x (b, l, c) and weight (c, 1, k) or (c, k) with the same c, got "
                         f"x {x.shape} and weight {weight.shape}")
    return Conv1dSilu.apply(x, weight, bias) if bias is not None else Conv1dSilu.apply(x, weight)


def reference_conv1d_silu(x, weight, bias=None):
    return F.silu(F.causal_conv1d(x, weight, bias))


# --- dt: softplus(dt + bias), clamped -------------------------------------------------------------------------

class DtSoftplus(Function):
    """out = clip(softplus(dt + bias), low, high); softplus(v) = v where v > 20 (torch's threshold).
    d/d dt = sigmoid(v) (1 where v > 20), times 0 where the clip is active; d bias = the same, summed."""

    def forward(self, dt, bias, low=0.0, high=math.inf):
        v = dt + bias                                                    # (..., h)
        linear = v > 20.0
        soft = np.where(linear, v, np.maximum(v, 0) + np.log1p(np.exp(-np.abs(v))))
        out = np.clip(soft, low, high) if (low, high) != (0.0, math.inf) else soft
        inside = (soft >= low) & (soft <= high)                          # where the clip passes the gradient
        self.save_for_backward(v, linear, inside)
        return out.astype(np.result_type(dt, bias), copy=False)

    def backward(self, grad):
        v, linear, inside = self.saved
        e = np.exp(-np.abs(v))                                           # sigmoid(v), overflow-free
        slope = np.where(linear, 1.0, np.where(v >= 0, 1.0 / (1.0 + e), e / (1.0 + e))).astype(v.dtype)
        d = grad * slope * inside
        return d, d


def dt_softplus(dt: Tensor, bias: Tensor, low: float = 0.0, high: float = math.inf) -> Tensor:
    return DtSoftplus.apply(dt, bias, low=float(low), high=float(high))


def reference_dt_softplus(dt, bias, low=0.0, high=math.inf):
    out = F.softplus(dt + bias)
    return F.clip(out, low, high) if (low, high) != (0.0, math.inf) else out


# --- gated (grouped) RMS norm ---------------------------------------------------------------------------------

# consts = [0, 1 / group, 1, eps] in the data's dtype: scalars of that dtype keep a float32 norm in float32
# lanes (float64 literals in the loops made them 2-3x slower); the gate's branch sits outside the loops


@njit(**_JIT)
def _gated_input(y, z, s, gated_flag, u):
    """u = y * silu(z) = y z sigmoid(z), given s = sigmoid(z); u = y without a gate."""
    if gated_flag:
        for ch in range(y.shape[0]):
            u[ch] = y[ch] * z[ch] * s[ch]
    else:
        for ch in range(y.shape[0]):
            u[ch] = y[ch]


@njit(**_JIT)
def _gated_rms_forward_row(y, z, sig, weight, consts, gated_flag, out, rstd):
    G = rstd.shape[0]
    group = y.shape[0] // G
    _gated_input(y, z, sig, gated_flag, out)
    for g in range(G):
        lo = g * group
        acc = consts[0]
        for ch in range(lo, lo + group):
            acc += out[ch] * out[ch]
        rstd[g] = 1.0 / math.sqrt(acc * consts[1] + consts[3])
        r = rstd[g]
        for ch in range(lo, lo + group):
            out[ch] = out[ch] * r * weight[ch]


@njit(parallel=True, **_JIT)
def _gated_rms_forward(y, z, sig, weight, consts, gated_flag, out, rstd):
    """Per row and group: u = y * silu(z) (or y); r = 1 / sqrt(mean(u^2) + eps); out = u r weight."""
    for i in prange(y.shape[0]):
        _gated_rms_forward_row(y[i], z[i], sig[i], weight, consts, gated_flag, out[i], rstd[i])


@njit(**_JIT)
def _gated_rms_backward_row(y, z, s, weight, rstd, grad, consts, gated_flag, dy, dz, dw, u):
    """One row; s = sigmoid(z); u is a scratch row (the gated input). du = r (g w - u r mean(g w u r))."""
    G = rstd.shape[0]
    group = y.shape[0] // G
    _gated_input(y, z, s, gated_flag, u)
    for g in range(G):
        lo = g * group
        r = rstd[g]
        dot = consts[0]
        for ch in range(lo, lo + group):
            gu = grad[ch] * u[ch] * r
            dot += gu * weight[ch]
            dw[ch] += gu
        m = dot * consts[1] * r
        for ch in range(lo, lo + group):
            dy[ch] = r * (grad[ch] * weight[ch] - u[ch] * m)            # du
    if gated_flag:
        one = consts[2]
        for ch in range(y.shape[0]):
            du, a, sg = dy[ch], z[ch], s[ch]
            dy[ch] = du * a * sg
            dz[ch] = du * y[ch] * sg * (one + a * (one - sg))


@njit(parallel=True, **_JIT)
def _gated_rms_backward(y, z, sig, weight, rstd, grad, consts, gated_flag, dy, dz, dw_partial):
    """dxhat = grad w; du = r (dxhat - xhat mean(dxhat xhat)); dy = du silu(z); dz = du y silu'(z);
    dw_partial[block] = sum over the block's rows of grad xhat (rows cut into len(dw_partial) blocks)."""
    N, d = y.shape
    blocks = dw_partial.shape[0]
    for blk in prange(blocks):
        dw_partial[blk, :] = 0.0
        u = np.empty(d, y.dtype)
        for i in range(blk * N // blocks, (blk + 1) * N // blocks):
            _gated_rms_backward_row(y[i], z[i], sig[i], weight, rstd[i], grad[i], consts, gated_flag, dy[i], dz[i],
                                    dw_partial[blk], u)


class GatedRMSNorm(Function):
    """out = u r weight, u = y * silu(z) (u = y without z), r = 1 / sqrt(mean over each group of u^2 + eps).
    y, z (..., d), weight (d,). Saves y, z (as given: a view stays a view) and r (one number per row and
    group); u and sigmoid(z) are recomputed.
    With xhat = u r:  du = r (g w - xhat mean(g w xhat)),  dy = du silu(z),  dz = du y silu'(z),
    dweight = sum over rows of g xhat."""

    def forward(self, y, z, weight, group=1, eps=1e-5):
        d = y.shape[-1]
        dtype = np.result_type(y, weight) if z is None else np.result_type(y, z, weight)
        y2 = np.ascontiguousarray(y.reshape(-1, d), dtype=dtype)         # (N, d)
        z2 = y2 if z is None else np.ascontiguousarray(z.reshape(-1, d), dtype=dtype)
        w = weight.astype(dtype, copy=False)
        out = np.empty_like(y2)
        rstd = np.empty((y2.shape[0], d // group), dtype)                # (N, G)
        sig = _sigmoid(z2) if z is not None else y2                    # (N, d); unused without a gate
        consts = np.array([0.0, 1.0 / group, 1.0, eps], dtype)
        _gated_rms_forward(y2, z2, sig, w, consts, z is not None, out, rstd)
        self.save_for_backward(y, z, weight, rstd)                       # z may be a view: copied again later
        self.consts, self.gated, self.shape, self.dtype = consts, z is not None, y.shape, dtype
        return out.reshape(y.shape)

    def backward(self, grad):
        y, z, weight, rstd = self.saved
        d = self.shape[-1]
        y2 = np.ascontiguousarray(y.reshape(-1, d), dtype=self.dtype)    # (N, d)
        z2 = y2 if z is None else np.ascontiguousarray(z.reshape(-1, d), dtype=self.dtype)
        w = weight.astype(self.dtype, copy=False)
        g2 = np.ascontiguousarray(grad.reshape(y2.shape), dtype=y2.dtype)
        dy = np.empty_like(y2)
        dz = np.empty_like(y2) if self.gated else dy
        blocks = max(1, min(16, y2.shape[0]))
        dw_partial = np.empty((blocks, y2.shape[1]), y2.dtype)
        sig = _sigmoid(z2) if self.gated else y2
        _gated_rms_backward(y2, z2, sig, w, rstd, g2, self.consts, self.gated, dy, dz, dw_partial)
        grad_z = dz.reshape(self.shape) if self.gated else None
        return dy.reshape(self.shape), grad_z, dw_partial.sum(axis=0)


def gated_rms_norm(y: Tensor, z: Tensor | None, weight: Tensor, group_size: int, eps: float = 1e-5) -> Tensor:
    """rms_norm over each group of group_size channels of y * silu(z) (of y when z is None), times weight.
    With group_size = d and z None it is the plain RMSNorm."""
    d = y.shape[-1]
    if weight.shape != (d,) or group_size <= 0 or d % group_size or (z is not None and z.shape != y.shape):
        raise ValueError(f"gated_rms_norm: need y (..., d), z None or y's shape, weight (d,), d divisible by "
                         f"group_size; got y {y.shape}, z {None if z is None else z.shape}, weight {weight.shape}, "
                         f"group_size {group_size}")
    return GatedRMSNorm.apply(y, z, weight, group=int(group_size), eps=float(eps))


def reference_gated_rms_norm(y, z, weight, group_size, eps=1e-5):
    if z is not None:
        y = y * F.silu(z)
    d = y.shape[-1]
    grouped = F.reshape(y, (*y.shape[:-1], d // group_size, group_size))
    return F.reshape(F.rms_norm(grouped, None, eps), y.shape) * weight


__all__ = ["split_last", "conv1d_silu", "dt_softplus", "gated_rms_norm", "reference_conv1d_silu",
           "reference_dt_softplus", "reference_gated_rms_norm"]
