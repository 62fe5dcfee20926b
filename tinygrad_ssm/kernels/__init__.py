"""`ssd(...)`: the Mamba-2 scan as one differentiable call, with interchangeable backends.

- "reference": the chunked algorithm composed of engine ops (reference.py) — what a reader studies.
- "scan": the sequential recurrence (scan.py), slow, for checking.
- "auto": the fastest backend available (for now "reference"); faster kernels register in BACKENDS.
Every backend takes validated tensors of one float dtype and returns (y, final_state).
"""
from __future__ import annotations

import numpy as np

from ..tensor import Tensor
from .reference import ssd_chunked
from .scan import ssd_scan

BACKENDS = {"reference": ssd_chunked, "scan": ssd_scan}
AUTO_ORDER = ("reference",)  # fastest first; "auto" takes the first one registered


def available_backends() -> list[str]:
    return list(BACKENDS)


def _resolve_backend(backend: str):
    if backend == "auto":
        backend = next(name for name in AUTO_ORDER if name in BACKENDS)
    if backend not in BACKENDS:
        raise ValueError(f"ssd: unknown backend {backend!r}; choose 'auto' or one of {sorted(BACKENDS)}")
    return BACKENDS[backend]


def _tensor(name: str, value) -> Tensor:
    t = value if isinstance(value, Tensor) else Tensor(np.asarray(value))
    if t.dtype.kind != "f":
        raise TypeError(f"ssd: {name} must be a floating point tensor, got dtype {t.dtype}")
    return t


def _check_shape(name: str, t: Tensor, expected: tuple, meaning: str):
    if tuple(t.shape) != tuple(expected):
        raise ValueError(f"ssd: {name} must have shape {meaning} = {tuple(expected)}, got {tuple(t.shape)}")


def ssd(x, dt, A, B, C, D=None, initial_state=None, chunk_size: int = 256, backend: str = "auto"):
    """The selective state space scan of Mamba-2, for every batch b and head i (group g(i) = i // (h / g)):

        S_t = exp(dt_t A_i) S_{t-1} + dt_t x_t B_t^T,    S_0 = initial_state (zeros if None)
        y_t = S_t C_t + D_i x_t

    x (b, l, h, p); dt (b, l, h), already softplus'd; A (h,); B, C (b, l, g, n), h divisible by g;
    D (h,) or None; initial_state (b, h, p, n) or None. Returns (y (b, l, h, p), final_state (b, h, p, n)).
    chunk_size bounds the chunks of the chunked backends (they split l into equal chunks no longer than it).
    Gradients reach every tensor input. Everything is computed in the widest input dtype, float32 at least
    (dt, A and their cumulative sums must not be lower)."""
    run = _resolve_backend(backend)
    if not isinstance(chunk_size, (int, np.integer)) or isinstance(chunk_size, bool) or chunk_size < 1:
        raise ValueError(f"ssd: chunk_size must be a positive int, got {chunk_size!r}")
    x, dt, A, B, C = (_tensor(name, v) for name, v in zip("x dt A B C".split(), (x, dt, A, B, C)))
    D = None if D is None else _tensor("D", D)
    initial_state = None if initial_state is None else _tensor("initial_state", initial_state)

    if x.ndim != 4:
        raise ValueError(f"ssd: x must have shape (b, l, h, p), got {tuple(x.shape)}")
    b, l, h, p = x.shape
    if l < 1:
        raise ValueError(f"ssd: x has sequence length 0 (shape {tuple(x.shape)}); need at least one step")
    _check_shape("dt", dt, (b, l, h), "(b, l, h) from x")
    _check_shape("A", A, (h,), "(h,) from x")
    if B.ndim != 4 or B.shape[:2] != (b, l):
        raise ValueError(f"ssd: B must have shape (b, l, g, n) with (b, l) = {(b, l)} from x, got {tuple(B.shape)}")
    g, n = B.shape[2], B.shape[3]
    if g < 1 or h % g:
        raise ValueError(f"ssd: the number of heads h = {h} (x {tuple(x.shape)}) must be divisible by the number "
                         f"of groups g = {g} (B {tuple(B.shape)})")
    _check_shape("C", C, (b, l, g, n), "(b, l, g, n) like B")
    if D is not None:
        _check_shape("D", D, (h,), "(h,) from x")
    if initial_state is not None:
        _check_shape("initial_state", initial_state, (b, h, p, n), "(b, h, p, n) from x and B")

    inputs = [t for t in (x, dt, A, B, C, D, initial_state) if t is not None]
    dtype = np.result_type(np.float32, *[t.dtype for t in inputs])
    x, dt, A, B, C = (t.astype(dtype) for t in (x, dt, A, B, C))
    D = None if D is None else D.astype(dtype)
    initial_state = None if initial_state is None else initial_state.astype(dtype)
    return run(x, dt, A, B, C, D, initial_state, int(chunk_size))


__all__ = ["ssd", "ssd_chunked", "ssd_scan", "BACKENDS", "available_backends"]
