"""Scalar numba functions applied to whole arrays, to test them against NumPy."""
import numpy as np
from numba import njit


def elementwise(fn):
    """A numba function applying the scalar numba function fn to every entry of a 1-d array."""
    @njit
    def apply(a):
        out = np.empty_like(a)
        for i in range(a.shape[0]):
            out[i] = fn(a[i])
        return out
    return apply
