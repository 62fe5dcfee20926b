"""An independent float64 NumPy forward of the Mamba-2 LM, written straight from docs/mamba2.md (section 3).

It reads the parameters by their official names (backbone.embedding.weight, backbone.layers.{i}.mixer.*, ...)
from a plain dict of arrays and never calls the engine or the model, so a test comparing it with the model's
logits checks the model against the equations, not against itself. Loops over time are deliberate: the
sequential SSD recurrence is the definition; the model's chunked form must agree with it.
"""
from __future__ import annotations

import math

import numpy as np

from .scan_inputs import numpy_scan   # the SSD recurrence S_t = exp(dt_t A) S_{t-1} + dt_t x_t B_t^T, y_t = S_t C_t


def softplus(v):
    """log(1 + exp(v)), and v itself for v > 20 (the threshold-20 identity of torch / mamba_ssm)."""
    return np.where(v > 20, v, np.log1p(np.exp(np.minimum(v, 20))))


def silu(v):
    return v / (1 + np.exp(-v))


def rms_norm(v, weight, eps):
    """v / sqrt(mean(v^2, last axis) + eps) * weight (weight None: no scale)."""
    normed = v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + eps)
    return normed if weight is None else normed * weight


def causal_depthwise_conv(xBC, weight, bias):
    """xBC (b, l, c), weight (c, 1, k), bias (c,) or None -> (b, l, c): left-pad k-1 zeros, keep l outputs.
    out[t] = sum_j weight[:, 0, j] * x[t - (k - 1) + j] (cross-correlation, like torch's conv1d)."""
    b, l, c = xBC.shape
    k = weight.shape[-1]
    padded = np.concatenate([np.zeros((b, k - 1, c)), xBC], axis=1)     # (b, k - 1 + l, c)
    out = sum(padded[:, j:j + l] * weight[:, 0, j] for j in range(k))  # (b, l, c)
    return out if bias is None else out + bias


def linear(v, weight, bias):
    out = v @ weight.T
    return out if bias is None else out + bias


def mixer(u, W, prefix, c):
    """u (b, l, d_model) -> (b, l, d_model): steps 1-7 of section 3 of docs/mamba2.md (the mixer)."""
    b, l, _ = u.shape
    d_inner = c.expand * c.d_model
    h, p, g, n = d_inner // c.headdim, c.headdim, c.ngroups, c.d_state
    P = lambda name: W.get(prefix + name)                               # None when the model has no such parameter
    zxbcdt = linear(u, P("in_proj.weight"), P("in_proj.bias"))          # (b, l, 2 d_inner + 2 g n + h)
    z, xBC, dt = np.split(zxbcdt, [d_inner, 2 * d_inner + 2 * g * n], axis=-1)
    xBC = silu(causal_depthwise_conv(xBC, P("conv1d.weight"), P("conv1d.bias")))   # (b, l, d_inner + 2 g n)
    x, B, C = np.split(xBC, [d_inner, d_inner + g * n], axis=-1)
    x, B, C = x.reshape(b, l, h, p), B.reshape(b, l, g, n), C.reshape(b, l, g, n)
    dt = softplus(dt + P("dt_bias"))                                    # (b, l, h)
    low, high = c.dt_limit
    if (low, high) != (0.0, math.inf):
        dt = np.clip(dt, low, high)
    A = -np.exp(P("A_log"))                                             # (h,)
    y, _ = numpy_scan(x, dt, A, B, C, P("D"))                           # (b, l, h, p), from S_0 = 0
    y = y.reshape(b, l, d_inner) * silu(z)                              # gate first (norm_before_gate False)
    y = rms_norm(y.reshape(b, l, g, d_inner // g), None, c.rms_norm_eps).reshape(b, l, d_inner)
    y = y * P("norm.weight")
    return linear(y, P("out_proj.weight"), P("out_proj.bias"))          # (b, l, d_model)


def lm_logits(W, ids, c):
    """W: {official name: float64 array}, ids (b, l) ints, c: the config's plain fields -> logits (b, l, V)."""
    emb = W["backbone.embedding.weight"]                                # (V, d_model)
    x = emb[ids]                                                        # (b, l, d_model)
    for i in range(c.n_layer):
        prefix = f"backbone.layers.{i}."
        x = x + mixer(rms_norm(x, W[prefix + "norm.weight"], c.rms_norm_eps), W, prefix + "mixer.", c)
    x = rms_norm(x, W["backbone.norm_f.weight"], c.rms_norm_eps)
    head = emb if c.tie_embeddings else W["lm_head.weight"]             # (V, d_model)
    return x @ head.T
