"""The check every layer makes of what it is called with: a Tensor (or a NumPy array), as torch's layers take
tensors only; a list gave an AttributeError from deep inside (an audit of the layers against torch)."""
from __future__ import annotations

import numpy as np

from ..autograd.tensor import Tensor


def layer_input(layer: str, argument: str, x):
    """`x` if it is a Tensor or an array, else a TypeError naming the layer (its class and name) and the argument."""
    if not isinstance(x, (Tensor, np.ndarray)):
        raise TypeError(f"{layer}: {argument} must be a Tensor, got {type(x).__name__}")
    return x
