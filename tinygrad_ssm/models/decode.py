"""Decoding without the engine: two numba calls and two BLAS products per layer advance a Mamba-2 block by
one token, in place on the cache; one more call and product give the logits. The engine's `step` (mamba2.py,
fused=False) is the reference it is tested against (tests/test_decode.py: logits and states to 1e-10).

Per layer and sequence (the equations of Mamba2Mixer.step, written out):
    u = rmsnorm(x) * norm.weight                                           (d_model,)
    z | xBC | dt = in_proj(u)                                              (d_inner,), (conv_dim,), (h,)
    conv state <- [conv state[:, 1:], xBC];  xBC = silu(sum_j conv state[:, j] w[:, j] + conv bias)
    x | B | C = xBC;  dt = clip(softplus(dt + dt_bias), dt_limit);  A = -exp(A_log)
    S <- exp(dt A) S + dt x B^T  (head i reads group i // (h / g));  y = S C + D x
    y = rmsnorm_per_group(y * silu(z)) * norm.weight;  x <- x + out_proj(y)
The matmuls are np.dot inside the kernel (BLAS); the rest is a few loops over (b, h, p, n).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

_JIT = dict(cache=True, nogil=True, fastmath={"reassoc", "contract"})  # sums may vectorise; no nnan/ninf
_EMPTY_CACHE_HINT = "allocate it with model.allocate_cache(batch) or fill it with a prefill forward"


@njit(**_JIT)
def _add_and_norm(x, delta, delta_bias, weight, eps, out):
    """x += delta + delta_bias (the previous mixer's out_proj, when delta has rows); then
    out[i] = x[i] / sqrt(mean(x[i]^2) + eps) * weight (the next pre-norm)."""
    for i in range(x.shape[0]):
        if delta.shape[0]:
            for j in range(x.shape[1]):
                x[i, j] += delta[i, j] + delta_bias[j]
        acc = 0.0
        for j in range(x.shape[1]):
            acc += x[i, j] * x[i, j]
        r = 1.0 / math.sqrt(acc / x.shape[1] + eps)
        for j in range(x.shape[1]):
            out[i, j] = x[i, j] * r * weight[j]


@njit(**_JIT)
def _update_head(S, x, B, C, decay, dt, Dh, y):
    """One head: S (p, n) <- decay S + dt x B^T;  y (p,) = S C + Dh x. The scalars come in S's dtype, so a
    float32 state is updated in float32 lanes (no float64 round trips in the innermost loop)."""
    p, n = S.shape
    for pi in range(p):
        xdt = x[pi] * dt
        acc = decay - decay                                             # 0 in S's dtype
        for ni in range(n):
            s = decay * S[pi, ni] + xdt * B[ni]
            S[pi, ni] = s
            acc += s * C[ni]
        y[pi] = acc + Dh * x[pi]


@njit(**_JIT)
def _mixer_core(proj, in_b, conv_w, conv_b, dt_bias, A_log, D, gnorm_w, eps, conv_state, ssm, ngroups, low, high,
                clamp, y):
    """proj (b, d_in_proj) = in_proj(u) without its bias -> y (b, d_inner), the gated-normed SSM output that
    out_proj reads; conv_state (b, conv_dim, k) and ssm (b, h, p, n) advance by one token in place."""
    nb = proj.shape[0]
    conv_dim, k = conv_w.shape
    _, h, p, n = ssm.shape
    d_inner = y.shape[1]
    r = h // ngroups
    group = d_inner // ngroups
    xbc = np.empty(conv_dim, proj.dtype)
    coef = np.empty(2, ssm.dtype)
    for bi in range(nb):
        for c in range(conv_dim):                                       # conv state shift, conv, silu
            acc = conv_b[c]
            for j in range(k - 1):
                conv_state[bi, c, j] = conv_state[bi, c, j + 1]
                acc += conv_state[bi, c, j] * conv_w[c, j]
            v = proj[bi, d_inner + c] + in_b[d_inner + c]
            conv_state[bi, c, k - 1] = v
            acc += v * conv_w[c, k - 1]
            xbc[c] = acc / (1.0 + math.exp(-acc))
        for hi in range(h):                                             # state update and readout
            v = proj[bi, d_inner + conv_dim + hi] + in_b[d_inner + conv_dim + hi] + dt_bias[hi]
            dt = v if v > 20.0 else max(v, 0.0) + math.log1p(math.exp(-abs(v)))
            if clamp:
                dt = min(max(dt, low), high)
            coef[0], coef[1] = math.exp(dt * -math.exp(A_log[hi])), dt   # in the state's dtype
            b0 = d_inner + (hi // r) * n                                # this head's group's B
            c0 = d_inner + ngroups * n + (hi // r) * n                  # and C
            _update_head(ssm[bi, hi], xbc[hi * p:(hi + 1) * p], xbc[b0:b0 + n], xbc[c0:c0 + n], coef[0], coef[1],
                         D[hi], y[bi, hi * p:(hi + 1) * p])
        for g in range(ngroups):                                        # gated rms norm per group
            acc = 0.0
            for c in range(g * group, (g + 1) * group):
                zv = proj[bi, c] + in_b[c]
                gated = y[bi, c] * zv / (1.0 + math.exp(-zv))
                y[bi, c] = gated
                acc += gated * gated
            rr = 1.0 / math.sqrt(acc / group + eps)
            for c in range(g * group, (g + 1) * group):
                y[bi, c] = y[bi, c] * rr * gnorm_w[c]


def _project(weight: np.ndarray, u: np.ndarray) -> np.ndarray:
    """u (b, in) @ weight (out, in)^T -> (b, out), as (weight @ u^T)^T: OpenBLAS ran the small-b product
    about 2x faster with the weight as the row-major left operand than as a transposed right one."""
    return np.ascontiguousarray((weight @ u.T).T)


def _array(t, dtype):
    return np.ascontiguousarray(t.data, dtype=dtype)


def _zeros_or(t, size, dtype):
    return np.zeros(size, dtype) if t is None else _array(t, dtype)


def _contiguous_state(state, name: str, expected: tuple, dtype):
    """The cache's array for in-place work: C-contiguous, writable, of the model's dtype (replaced once if not)."""
    from ..tensor import Tensor
    tensor = getattr(state, name)
    if tensor.shape != expected:
        raise ValueError(f"decode: cache {name} state has shape {tensor.shape}, expected {expected}; "
                         f"{_EMPTY_CACHE_HINT}")
    a = tensor.data
    if not (a.flags.c_contiguous and a.flags.writeable and a.dtype == dtype):
        a = np.array(a, dtype=dtype, order="C")
        setattr(state, name, Tensor(a))
    return a


def decode_step(model, ids: np.ndarray, cache) -> np.ndarray:
    """ids (b,) ints -> logits (b, padded vocab) in the model's dtype; every layer's cache advances in place.
    Per layer: one numba call for residual + pre-norm, in_proj (BLAS), one numba call for the rest of the
    mixer, out_proj (BLAS). Checks are the caller's (Mamba2LMHeadModel.step)."""
    c, dtype = model.config, model.dtype
    b = ids.shape[0]
    low, high = (float(v) for v in c.dt_limit)
    clamp = (low, high) != (0.0, math.inf)
    x = np.array(model.embedding.weight.data[ids], dtype=dtype)        # (b, d_model) a fresh residual stream
    u = np.empty_like(x)                                                # (b, d_model) the normed stream
    y = np.empty((b, c.d_inner), dtype)
    delta, delta_bias = np.empty((0, c.d_model), dtype), np.zeros(c.d_model, dtype)  # nothing to add yet
    for layer, state in zip(model.layers, cache.layers):
        m = layer.mixer
        conv = _contiguous_state(state, "conv", (b, c.conv_dim, c.d_conv), dtype)
        ssm = _contiguous_state(state, "ssm", (b, c.nheads, c.headdim, c.d_state), dtype)
        _add_and_norm(x, delta, delta_bias, _array(layer.norm.weight, dtype), c.rms_norm_eps, u)
        proj = _project(_array(m.in_proj.weight, dtype), u)             # (b, d_in_proj) BLAS
        _mixer_core(proj, _zeros_or(m.in_proj.bias, c.d_in_proj, dtype),
                    _array(m.conv1d.weight, dtype).reshape(c.conv_dim, c.d_conv),
                    _zeros_or(m.conv1d.bias, c.conv_dim, dtype), _array(m.dt_bias, dtype), _array(m.A_log, dtype),
                    _array(m.D, dtype), _array(m.norm.weight, dtype), c.rms_norm_eps, conv, ssm, c.ngroups, low, high,
                    clamp, y)
        state.conv._bump()
        state.ssm._bump()
        delta = _project(_array(m.out_proj.weight, dtype), y)           # (b, d_model) BLAS
        delta_bias = _zeros_or(m.out_proj.bias, c.d_model, dtype)
    _add_and_norm(x, delta, delta_bias, _array(model.norm_f.weight, dtype), c.rms_norm_eps, u)
    head = model.embedding.weight if model.lm_head is None else model.lm_head.weight
    return _project(_array(head, dtype), u)                             # (b, V) BLAS
