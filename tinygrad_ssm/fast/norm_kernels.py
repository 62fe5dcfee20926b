"""The numba kernels of GatedRMSNorm (fast/fused.py), rows [r0, r1), groups of `group` channels: the gate's
sigmoid inside the loop (fast/fast_exp: exp32 for float32 data, the float64 exp for float64; LLVM vectorises
both, where NumPy's exp was a pass of its own over a scratch block). Two passes over a group each way: forward
the gate with the sum of squares, then the scaling; backward the gate with the dot product and the weight's
gradient, then du with dy and dz.

y, z and grad come as rows from a column on (see row_blocks.as_rows): row slices indexed from 0 vectorise.
consts = [0, 1 / group, 1, eps] in the data's dtype: scalars of that dtype keep a float32 norm in float32 lanes
(float64 literals in the loops made them 2-3x slower). Without a gate (z None) the caller passes y as z and
gated False: the branch sits outside the loops.

Every sum is a loop of its own that only reads (`_sum_of_squares`, `_weighted_dot`). In a loop that also stores,
LLVM guards its vectorised version with a runtime check of the arrays' addresses, and takes the scalar loop,
which adds in another order, when an output lies within a few vectors of an input: the same model gave outputs
2e-8 apart from call to call, as the allocator placed its buffers (found by a CI run that compared two models'
outputs bit for bit; 25 of 200 calls differed, tests/fast/test_kernel_determinism.py). A loop without stores needs
no such check: the same bits every call.
"""
from __future__ import annotations

import math

from .fast_exp import sigmoid
from .jit import njit

_JIT = dict(cache=True, nogil=True, fastmath={"reassoc", "contract"},  # sums may vectorise; no nnan/ninf
            error_model="numpy")  # x / 0 = inf, no ZeroDivisionError check: a branch per division stops SIMD


@njit(**_JIT)
def _sum_of_squares(u, zero):
    """sum u^2, in a loop of its own (see the module's docstring: the same bits every run)."""
    acc = zero
    for ch in range(u.shape[0]):
        acc += u[ch] * u[ch]
    return acc


@njit(**_JIT)
def _gate_and_square(y, z, u, zero):
    """u = y z sigmoid(z) = y silu(z); returns sum u^2."""
    for ch in range(u.shape[0]):
        u[ch] = y[ch] * z[ch] * sigmoid(z[ch])
    return _sum_of_squares(u, zero)


@njit(**_JIT)
def gated_rms_forward(y, ycol, z, zcol, weight, consts, gated, r0, r1, out, rstd):
    """Rows [r0, r1), per group: u = y silu(z) (or y); r = 1 / sqrt(mean(u^2) + eps); out = u r weight."""
    zero, inv_group, one, eps = consts[0], consts[1], consts[2], consts[3]
    d, G = out.shape[1], rstd.shape[1]
    group = d // G
    for r in range(r0, r1):
        o, yr, zr = out[r], y[r, ycol:ycol + d], z[r, zcol:zcol + d]
        for g in range(G):                                              # slices: 0-based loops vectorise
            lo, hi = g * group, (g + 1) * group
            og, yg, wg = o[lo:hi], yr[lo:hi], weight[lo:hi]
            if gated:
                acc = _gate_and_square(yg, zr[lo:hi], og, zero)
            else:
                for ch in range(group):
                    og[ch] = yg[ch]
                acc = _sum_of_squares(og, zero)
            rs = one / math.sqrt(acc * inv_group + eps)
            rstd[r, g] = rs
            for ch in range(group):
                og[ch] = og[ch] * rs * wg[ch]


@njit(**_JIT)
def _weighted_dot(g, u, rs, w, zero):
    """sum g u rs w, in a loop of its own (see the module's docstring: the same bits every run)."""
    dot = zero
    for ch in range(u.shape[0]):
        dot += g[ch] * u[ch] * rs * w[ch]
    return dot


@njit(**_JIT)
def _gate_and_dot(y, z, g, w, rs, u, s, dw, zero):
    """s = sigmoid(z), u = y z s, dw += g u rs; returns sum g u rs w."""
    for ch in range(u.shape[0]):
        sig = sigmoid(z[ch])
        v = y[ch] * z[ch] * sig
        s[ch], u[ch] = sig, v
        dw[ch] += g[ch] * v * rs
    return _weighted_dot(g, u, rs, w, zero)


@njit(**_JIT)
def _norm_backward(g, x, w, rs, inv_d, zero, dw, dx):
    """The plain RMSNorm's backward over one row or group, xhat = x rs: dw += g xhat;
    dx = rs (g w - xhat mean(g w xhat)) (written, not added)."""
    for ch in range(x.shape[0]):
        dw[ch] += g[ch] * x[ch] * rs
    m = _weighted_dot(g, x, rs, w, zero) * inv_d * rs
    for ch in range(x.shape[0]):
        dx[ch] = rs * (g[ch] * w[ch] - x[ch] * m)


@njit(**_JIT)
def gated_rms_backward(y, ycol, z, zcol, weight, rstd, grad, gcol, consts, gated, r0, r1,
                       dy, dycol, dz, dzcol, dw, u, s):
    """Rows [r0, r1): with xhat = u r, du = r (g w - xhat mean(g w xhat)); dy = du silu(z) (= du without a
    gate); dz = du y silu'(z) = du y s (1 + z (1 - s)), s = sigmoid(z); dw += g xhat. u, s: scratch rows (d,)."""
    zero, inv_group, one = consts[0], consts[1], consts[2]
    d, G = weight.shape[0], rstd.shape[1]
    group = d // G
    for r in range(r0, r1):
        yr, zr, gr = y[r, ycol:ycol + d], z[r, zcol:zcol + d], grad[r, gcol:gcol + d]
        dyr, dzr = dy[r, dycol:dycol + d], dz[r, dzcol:dzcol + d]
        for g in range(G):                                              # slices: 0-based loops vectorise
            lo, hi = g * group, (g + 1) * group
            gg, yg, wg, dwg, dyg = gr[lo:hi], yr[lo:hi], weight[lo:hi], dw[lo:hi], dyr[lo:hi]
            rs = rstd[r, g]
            if gated:
                zg, ug, sg, dzg = zr[lo:hi], u[lo:hi], s[lo:hi], dzr[lo:hi]
                m = _gate_and_dot(yg, zg, gg, wg, rs, ug, sg, dwg, zero) * inv_group * rs
                for ch in range(group):
                    du = rs * (gg[ch] * wg[ch] - ug[ch] * m)
                    a, sc = zg[ch], sg[ch]
                    dyg[ch] = du * a * sc
                    dzg[ch] = du * yg[ch] * sc * (one + a * (one - sc))
            else:
                _norm_backward(gg, yg, wg, rs, inv_group, zero, dwg, dyg)


@njit(**_JIT)
def add_rms_forward(x, xcol, m, mcol, weight, consts, r0, r1, total, out, rstd):
    """Rows [r0, r1): total = x + m; r = 1 / sqrt(mean(total^2) + eps); out = total r weight. The same operations
    in the same order as the residual add followed by `gated_rms_forward` without a gate: the same bits."""
    zero, inv_d, one, eps = consts[0], consts[1], consts[2], consts[3]
    d = out.shape[1]
    for r in range(r0, r1):
        xr, mr, tr, o = x[r, xcol:xcol + d], m[r, mcol:mcol + d], total[r], out[r]
        for ch in range(d):
            tr[ch] = xr[ch] + mr[ch]
        rs = one / math.sqrt(_sum_of_squares(tr, zero) * inv_d + eps)
        rstd[r] = rs
        for ch in range(d):
            o[ch] = tr[ch] * rs * weight[ch]


@njit(**_JIT)
def add_rms_backward(total, weight, rstd, grad, gcol, grad_total, tcol, has_total, consts, r0, r1, dx, dw):
    """Rows [r0, r1): with xhat = total r, dx = grad_total + r (g w - xhat mean(g w xhat)) (without grad_total
    when has_total is False), dw += g xhat: the norm's backward with the residual stream's gradient added in the
    same pass (the engine would sum the two in a pass of its own; a + b is b + a, so the same bits)."""
    zero, inv_d = consts[0], consts[1]
    d = weight.shape[0]
    for r in range(r0, r1):
        dxr = dx[r]
        _norm_backward(grad[r, gcol:gcol + d], total[r], weight, rstd[r], inv_d, zero, dw, dxr)
        if has_total:                   # a loop of its own: in one expression LLVM would fuse the add (an FMA)
            gt = grad_total[r, tcol:tcol + d]
            for ch in range(d):
                dxr[ch] += gt[ch]
