"""Initialisation schemes for registry variables.

An init is any callable `fn(shape, rng, dtype) -> np.ndarray`. The VarMap passes its one generator as
`rng`, so the seed and the order in which variables are created decide every weight, bit for bit.
Random numbers are drawn in float64 and then cast, so the values do not depend on the requested dtype
beyond its rounding.

Fans follow PyTorch (`torch.nn.init._calculate_fan_in_and_fan_out`): for a weight (out, in, *kernel),
fan_in = in * prod(kernel) and fan_out = out * prod(kernel).
"""
from __future__ import annotations

import math

import numpy as np

from ..autograd.args import is_real_number

__all__ = ["Init", "Const", "Randn", "Uniform", "KaimingUniform", "KaimingNormal", "calculate_gain", "fans"]


def fans(shape) -> tuple[int, int]:
    """(fan_in, fan_out) of a weight of this shape."""
    shape = tuple(shape)
    if len(shape) < 2:
        raise ValueError(f"init: fan in and fan out need a tensor of at least 2 dimensions, got shape {shape}")
    receptive = int(np.prod(shape[2:], dtype=np.int64)) if len(shape) > 2 else 1
    return shape[1] * receptive, shape[0] * receptive


def calculate_gain(nonlinearity: str = "leaky_relu", a: float | None = None) -> float:
    """torch.nn.init.calculate_gain for the nonlinearities a Kaiming init is used with; `a` is leaky_relu's
    negative slope, 0.01 when not given (torch's `param=None`; the Kaiming inits pass their own a, 0 by default)."""
    if nonlinearity in ("linear", "identity", "sigmoid", "conv1d", "conv2d", "conv3d"):
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        a = 0.01 if a is None else _finite("init.calculate_gain", "a (leaky_relu's negative slope)", a)
        return math.sqrt(2.0 / (1 + a * a))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"init: unknown nonlinearity {nonlinearity!r}")


def _finite(what: str, argument: str, value) -> float:
    """A finite real number, not a bool (torch refuses a = True; a = 'x' failed in a product, a = nan or Uniform's
    hi = inf in NumPy's sampler, naming neither the init nor the argument: an audit)."""
    if not is_real_number(value) or not math.isfinite(value):
        raise ValueError(f"{what}: {argument} must be a finite number, got {value!r}")
    return float(value)


class Init:
    """Base class: subclasses implement `sample(shape, rng) -> float64 array`."""

    def __call__(self, shape, rng: np.random.Generator, dtype) -> np.ndarray:
        return np.asarray(self.sample(tuple(shape), rng)).astype(dtype, copy=False)

    def sample(self, shape, rng):  # pragma: no cover - every scheme overrides it
        raise NotImplementedError

    def __repr__(self):
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({fields})"


class Const(Init):
    """Every entry equals `value` (no random numbers are drawn)."""

    def __init__(self, value: float):
        self.value = value

    def sample(self, shape, rng):
        return np.full(shape, self.value, dtype=np.float64)


class Randn(Init):
    """Normal(mean, std)."""

    def __init__(self, mean: float = 0.0, std: float = 1.0):
        mean, std = _finite("init.Randn", "mean", mean), _finite("init.Randn", "std", std)
        if std < 0:
            raise ValueError(f"init.Randn: std must be >= 0, got {std}")
        self.mean, self.std = mean, std

    def sample(self, shape, rng):
        return self.mean + self.std * rng.standard_normal(shape)


class Uniform(Init):
    """Uniform on [lo, hi)."""

    def __init__(self, lo: float, hi: float):
        lo, hi = _finite("init.Uniform", "lo", lo), _finite("init.Uniform", "hi", hi)
        if not lo <= hi:
            raise ValueError(f"init.Uniform: need lo <= hi, got lo={lo}, hi={hi}")
        self.lo, self.hi = lo, hi

    def sample(self, shape, rng):
        return rng.uniform(self.lo, self.hi, size=shape)


class _Kaiming(Init):
    def __init__(self, a: float = 0.0, fan: str = "fan_in", nonlinearity: str = "leaky_relu"):
        if fan not in ("fan_in", "fan_out"):
            raise ValueError(f"init.{type(self).__name__}: fan must be 'fan_in' or 'fan_out', got {fan!r}")
        calculate_gain(nonlinearity, a)  # validate now, not at first use
        self.a, self.fan, self.nonlinearity = a, fan, nonlinearity

    def __call__(self, shape, rng: np.random.Generator, dtype) -> np.ndarray:
        if 0 in tuple(shape):  # nothing to draw, whatever the fans (torch: "a no-op", Linear(0, 3) included)
            fans(shape)
            return np.empty(shape, dtype=dtype)
        return super().__call__(shape, rng, dtype)

    def std(self, shape) -> float:
        fan_in, fan_out = fans(shape)
        fan = fan_in if self.fan == "fan_in" else fan_out
        if fan == 0:
            raise ValueError(f"init.{type(self).__name__}: {self.fan} is 0 for shape {tuple(shape)}")
        return calculate_gain(self.nonlinearity, self.a) / math.sqrt(fan)


class KaimingUniform(_Kaiming):
    """U(-bound, bound), bound = gain * sqrt(3 / fan). With a = sqrt(5) (PyTorch's Linear and Conv default)
    the bound is 1 / sqrt(fan_in)."""

    def sample(self, shape, rng):
        bound = math.sqrt(3.0) * self.std(shape)
        return rng.uniform(-bound, bound, size=shape)


class KaimingNormal(_Kaiming):
    """Normal(0, gain / sqrt(fan)). The default (a=0, leaky_relu) gives He init, std sqrt(2 / fan_in)."""

    def sample(self, shape, rng):
        return self.std(shape) * rng.standard_normal(shape)
