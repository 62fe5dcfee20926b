"""exp in float64 that LLVM can vectorise inside a numba loop (math.exp is a scalar libm call here: no SVML),
for the SiLU gates of decoding (decode.py). exp(x) = 2^n e^r with n = round(x / ln 2), |r| <= ln(2) / 2: e^r by
its Taylor series to r^13 (the next term is below 2e-16 relative), 2^n written straight into the exponent bits.
Within a few ulp of math.exp (tests/fast/test_decode_kernels.py); NaN stays NaN, +-inf go to inf and 0; below
-708 (where e^x < 3.3e-308) it gives 0.

exp32 is the same in float32 (a float32 model's gates): twice the lanes per vector, r^7 is enough (the next
term is below float32's half ulp), below -86 it gives 0 and above 88.5 inf (float32's exp is finite from -87.3,
in its normal numbers, to 88.72: a silu of v past -88.5 is -0, not -3e-37, and no result of the package changes).
silu and sigmoid pick the one of their argument's precision.
"""
from __future__ import annotations

import math

import numpy as np
from numba import config, types
from numba.extending import intrinsic, overload
from llvmlite import ir  # after numba: where numba is missing, the error names it (llvmlite comes with it)

from .jit import njit

_LOG2E = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01   # ln 2 split so n * _LN2_HI is exact for |n| < 2^11
_LN2_LO = 1.90821492927058770002e-10
_INV_FACTORIALS = tuple(1.0 / math.factorial(k) for k in range(14))


@intrinsic
def _float64_from_bits(typingctx, bits):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())
    return types.float64(types.int64), codegen


@njit(cache=True, nogil=True, inline="always")
def exp(x):
    xc = min(max(x, -708.0), 709.79)
    n = math.floor(xc * _LOG2E + 0.5)
    r = (xc - n * _LN2_HI) - n * _LN2_LO
    p = _INV_FACTORIALS[13]
    p = p * r + _INV_FACTORIALS[12]
    p = p * r + _INV_FACTORIALS[11]
    p = p * r + _INV_FACTORIALS[10]
    p = p * r + _INV_FACTORIALS[9]
    p = p * r + _INV_FACTORIALS[8]
    p = p * r + _INV_FACTORIALS[7]
    p = p * r + _INV_FACTORIALS[6]
    p = p * r + _INV_FACTORIALS[5]
    p = p * r + _INV_FACTORIALS[4]
    p = p * r + _INV_FACTORIALS[3]
    p = p * r + _INV_FACTORIALS[2]
    p = p * r + 1.0
    p = p * r + 1.0
    e = p * _float64_from_bits((int(n) + 1022) << 52) * 2.0                # 2^(n-1) * 2: n = 1024 fits
    e = math.inf if x > 709.79 else e                                   # selects, not branches: it vectorises
    e = 0.0 if x < -708.0 else e
    return e if x == x else x                                           # NaN stays NaN


@intrinsic
def _float32_from_bits(typingctx, bits):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())
    return types.float32(types.int32), codegen


_F = np.float32

if config.DISABLE_JIT:
    # NUMBA_DISABLE_JIT=1: an intrinsic has no Python body; the same bit casts through NumPy views
    def _float64_from_bits(bits):  # noqa: F811
        return float(np.array(bits, dtype=np.int64).view(np.float64))

    def _float32_from_bits(bits):  # noqa: F811
        return np.array(bits, dtype=np.int32).view(np.float32)[()]


@njit(cache=True, nogil=True, inline="always")
def exp32(x):
    """exp(x) for a float32 x, in float32 lanes (every constant a float32: one float64 would widen the loop)."""
    xc = min(max(x, _F(-86.0)), _F(88.5))
    n = np.floor(xc * _F(_LOG2E) + _F(0.5))
    r = (xc - n * _F(0.693145751953125)) - n * _F(1.428606765330187e-06)    # ln 2 split: n * hi is exact
    p = _F(_INV_FACTORIALS[7])
    p = p * r + _F(_INV_FACTORIALS[6])
    p = p * r + _F(_INV_FACTORIALS[5])
    p = p * r + _F(_INV_FACTORIALS[4])
    p = p * r + _F(_INV_FACTORIALS[3])
    p = p * r + _F(_INV_FACTORIALS[2])
    p = p * r + _F(1.0)
    p = p * r + _F(1.0)
    # 2^(n-1) * 2 (n = 128 fits), n in int32 lanes: an int64 n took zmm conversions, exp32 ran 25% slower
    e = p * _float32_from_bits((np.int32(n) + np.int32(126)) << np.int32(23)) * _F(2.0)
    e = _F(math.inf) if x > _F(88.5) else e
    e = _F(0.0) if x < _F(-86.0) else e
    return e if x == x else x


@njit(cache=True, nogil=True, inline="always")
def _silu64(v):
    return v / (1.0 + exp(-v))


@njit(cache=True, nogil=True, inline="always")
def _silu32(v):
    return v / (_F(1.0) + exp32(-v))


def silu(v):
    """v * sigmoid(v) = v / (1 + e^-v) in v's precision (float32 -> exp32, else float64; e^-v overflowing to inf
    gives -0, as it should). Callers compile with error_model="numpy": Python's zero-division check keeps a
    loop from vectorising."""
    v = float(v)
    return v / (1.0 + math.exp(-v)) if v > -700 else -0.0


@overload(silu, inline="always")
def _silu_overload(v):
    return (lambda v: _silu32(v)) if v == types.float32 else (lambda v: _silu64(v))


@njit(cache=True, nogil=True, inline="always")
def _sigmoid64(v):
    return 1.0 / (1.0 + exp(-v))


@njit(cache=True, nogil=True, inline="always")
def _sigmoid32(v):
    return _F(1.0) / (_F(1.0) + exp32(-v))


def sigmoid(v):
    """1 / (1 + e^-v) in v's precision, like silu (e^-v = inf gives 0)."""
    v = float(v)
    return 1.0 / (1.0 + math.exp(-v)) if v > -700 else 0.0


@overload(sigmoid, inline="always")
def _sigmoid_overload(v):
    return (lambda v: _sigmoid32(v)) if v == types.float32 else (lambda v: _sigmoid64(v))


if config.DISABLE_JIT:
    # in Python, math.floor(NaN) raises where the compiled kernel's select passes the NaN through
    _exp_body, _exp32_body = exp, exp32

    def exp(x):  # noqa: F811
        return x if x != x else _exp_body(x)

    def exp32(x):  # noqa: F811
        return x if x != x else _exp32_body(x)
