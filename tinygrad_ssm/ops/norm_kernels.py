"""The numba kernels of GatedRMSNorm (ops/fused.py), rows [r0, r1), groups of `group` channels: the gate's
sigmoid inside the loop (models/fast_exp: exp32 for float32 data, the float64 exp for float64; LLVM vectorises
both, where NumPy's exp was a pass of its own over a scratch block), the sum of squares in the gate's loop and
the backward's du in the loop that writes dy and dz: two passes over a row each way.

y, z and grad come as rows from a column on (see row_blocks.as_rows): row slices indexed from 0 vectorise.
consts = [0, 1 / group, 1, eps] in the data's dtype: scalars of that dtype keep a float32 norm in float32 lanes
(float64 literals in the loops made them 2-3x slower). Without a gate (z None) the caller passes y as z and
gated False: the branch sits outside the loops.
"""
from __future__ import annotations

import math

from numba import njit

from ..models.fast_exp import sigmoid

_JIT = dict(cache=True, nogil=True, fastmath={"reassoc", "contract"},  # sums may vectorise; no nnan/ninf
            error_model="numpy")  # x / 0 = inf, no ZeroDivisionError check: a branch per division stops SIMD


@njit(**_JIT)
def _gate(y, z, u):
    """u = y z sigmoid(z) = y silu(z)."""
    for ch in range(u.shape[0]):
        u[ch] = y[ch] * z[ch] * sigmoid(z[ch])


@njit(**_JIT)
def gated_rms_forward(y, ycol, z, zcol, weight, consts, gated, r0, r1, out, rstd):
    """Rows [r0, r1), per group: u = y silu(z) (or y); r = 1 / sqrt(mean(u^2) + eps); out = u r weight."""
    zero, inv_group, one, eps = consts[0], consts[1], consts[2], consts[3]
    d, G = out.shape[1], rstd.shape[1]
    group = d // G
    for r in range(r0, r1):
        o, yr = out[r], y[r, ycol:ycol + d]
        if gated:
            _gate(yr, z[r, zcol:zcol + d], o)
        else:
            o[:] = yr
        for g in range(G):                                              # slices: 0-based loops vectorise
            og, wg = o[g * group:(g + 1) * group], weight[g * group:(g + 1) * group]
            acc = zero
            for ch in range(group):
                acc += og[ch] * og[ch]
            rs = one / math.sqrt(acc * inv_group + eps)
            rstd[r, g] = rs
            for ch in range(group):
                og[ch] = og[ch] * rs * wg[ch]


@njit(**_JIT)
def _gate_and_sigmoid(y, z, u, s):
    """s = sigmoid(z), u = y z s."""
    for ch in range(u.shape[0]):
        sig = sigmoid(z[ch])
        s[ch] = sig
        u[ch] = y[ch] * z[ch] * sig


@njit(**_JIT)
def gated_rms_backward(y, ycol, z, zcol, weight, rstd, grad, gcol, consts, gated, r0, r1,
                       dy, dycol, dz, dzcol, dw, u, s):
    """Rows [r0, r1): with xhat = u r, du = r (g w - xhat mean(g w xhat)); dy = du silu(z) (= du without a
    gate); dz = du y silu'(z) = du y s (1 + z (1 - s)), s = sigmoid(z); dw += g xhat. u, s: scratch rows (d,)."""
    zero, inv_group, one = consts[0], consts[1], consts[2]
    d, G = weight.shape[0], rstd.shape[1]
    group = d // G
    for r in range(r0, r1):
        yr, gr = y[r, ycol:ycol + d], grad[r, gcol:gcol + d]
        if gated:
            _gate_and_sigmoid(yr, z[r, zcol:zcol + d], u, s)
        else:
            u[:] = yr
        dyr = dy[r, dycol:dycol + d]
        for g in range(G):                                              # slices: 0-based loops vectorise
            lo, hi = g * group, (g + 1) * group
            gg, ug, wg, dwg = gr[lo:hi], u[lo:hi], weight[lo:hi], dw[lo:hi]
            rs = rstd[r, g]
            dot = zero
            for ch in range(group):
                gu = gg[ch] * ug[ch] * rs
                dot += gu * wg[ch]
                dwg[ch] += gu
            m = dot * inv_group * rs
            if gated:
                zg, yg, sg, dyg = z[r, zcol + lo:zcol + hi], yr[lo:hi], s[lo:hi], dyr[lo:hi]
                dzg = dz[r, dzcol + lo:dzcol + hi]
                for ch in range(group):
                    du = rs * (gg[ch] * wg[ch] - ug[ch] * m)
                    a, sc = zg[ch], sg[ch]
                    dyg[ch] = du * a * sc
                    dzg[ch] = du * yg[ch] * sc * (one + a * (one - sc))
            else:
                dyg = dyr[lo:hi]
                for ch in range(group):
                    dyg[ch] = rs * (gg[ch] * wg[ch] - ug[ch] * m)
