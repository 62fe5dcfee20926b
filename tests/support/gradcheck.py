"""gradcheck: the engine's gradients against central finite differences, in float64: eps 1e-6 as torch.autograd's
gradcheck, but atol 1e-8 and rtol 1e-6 where torch's are 1e-5 and 1e-3. In float64 a central difference at eps 1e-6
is off by ~1e-13 times fn's third derivative (truncation) plus ~2e-10 |w^T fn(x)| (rounding), so torch's rtol let
a gradient 0.09% wrong (rsqrt's or tanh's backward times 1.0009) pass every gradient check here; these catch it.

fn takes Tensors and returns a Tensor (any shape). We check the vector-Jacobian product the engine
computes, w^T J for a random w, against finite differences of w^T fn(x):
- full mode (small inputs): every entry of every input is perturbed;
- fast mode (big inputs, `fast=True`): a random unit direction u per input, checking
  (w^T J) . u == (w^T fn(x + eps u) - w^T fn(x - eps u)) / (2 eps), like torch's fast_mode.
"""
from __future__ import annotations

import numpy as np

import tinygrad_ssm as tg

EPS, ATOL, RTOL = 1e-6, 1e-8, 1e-6


def _as_inputs(inputs):
    tensors = []
    for x in inputs:
        data = x.data if isinstance(x, tg.Tensor) else np.asarray(x)
        if data.dtype != np.float64:
            raise TypeError(f"gradcheck needs float64 inputs, got {data.dtype}")
        tensors.append(tg.Tensor(data.copy(), requires_grad=True))
    return tensors


def _weighted(fn, arrays, weight) -> float:
    with tg.no_grad():
        out = fn(*[tg.Tensor(a) for a in arrays])
    return float(np.sum(out.data * weight))


def gradcheck(fn, *inputs, eps=EPS, atol=ATOL, rtol=RTOL, fast=False, seed=0) -> bool:
    """Raise AssertionError naming the input and the worst entry when an analytic gradient is off."""
    rng = np.random.default_rng(seed)
    tensors = _as_inputs(inputs)
    out = fn(*tensors)
    weight = rng.standard_normal(out.shape)
    (out * tg.Tensor(weight)).sum().backward()
    arrays = [t.data.copy() for t in tensors]
    for k, t in enumerate(tensors):
        if t.grad is None:
            raise AssertionError(f"input {k} (shape {t.shape}) got no gradient")
        analytic = t.grad.data
        if fast:
            u = rng.standard_normal(t.shape)
            u /= np.linalg.norm(u) or 1.0
            plus = [a + eps * u if i == k else a for i, a in enumerate(arrays)]
            minus = [a - eps * u if i == k else a for i, a in enumerate(arrays)]
            numeric = (_weighted(fn, plus, weight) - _weighted(fn, minus, weight)) / (2 * eps)
            projected = float(np.sum(analytic * u))
            if not abs(projected - numeric) <= atol + rtol * abs(numeric):
                raise AssertionError(f"input {k} (shape {t.shape}): analytic {projected:.8g} vs numeric {numeric:.8g} "
                                     f"along a random direction")
            continue
        numeric = np.zeros_like(arrays[k])
        for index in np.ndindex(*t.shape):
            plus = [a.copy() for a in arrays]
            minus = [a.copy() for a in arrays]
            plus[k][index] += eps
            minus[k][index] -= eps
            numeric[index] = (_weighted(fn, plus, weight) - _weighted(fn, minus, weight)) / (2 * eps)
        bad = ~(np.abs(analytic - numeric) <= atol + rtol * np.abs(numeric))
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise AssertionError(f"input {k} (shape {t.shape}): {int(bad.sum())} entries off; at {where} analytic "
                                 f"{analytic[where]:.8g} vs numeric {numeric[where]:.8g}")
    return True
