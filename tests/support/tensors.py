"""Small builders of engine tensors shared by the autograd tests."""
import numpy as np

from tinygrad_ssm import Tensor


def leaf(values, dtype=np.float64):
    """A leaf tensor that requires grad, holding `values` (nested lists or an array) as `dtype`."""
    return Tensor(np.array(values, dtype=dtype), requires_grad=True)
