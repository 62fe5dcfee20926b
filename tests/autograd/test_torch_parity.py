"""Forward values and gradients of every op against PyTorch on the same float64 inputs, at float64
tolerances (atol 1e-12, rtol 1e-10): both sides compute the same formulas, so they differ only by rounding.
The cases are each op's `torch` entry in the table of tests/support/op_specs.py. PyTorch is only a reference here
(the `bench` extra): without it this file skips."""
from __future__ import annotations

import numpy as np
import pytest

from tests.support.op_specs import SPECS
from tinygrad_ssm import Tensor

torch = pytest.importorskip("torch")

FORWARD_ATOL, FORWARD_RTOL = 1e-12, 1e-10
GRAD_ATOL, GRAD_RTOL = 1e-12, 1e-10

CASES = [pytest.param(ours, theirs, inputs, id=f"{name}-{i}")
         for name, spec in SPECS.items() for i, (inputs, ours, theirs) in enumerate(spec.torch)]


@pytest.mark.parametrize("ours, theirs, inputs", CASES)
def test_forward_and_gradients_match_torch(ours, theirs, inputs):
    mine = [Tensor(x.copy(), requires_grad=True) for x in inputs]
    out = ours(*mine)
    weight = np.random.default_rng(0).standard_normal(out.shape)  # a random upstream gradient
    (out * Tensor(weight)).sum().backward()

    reference = [torch.tensor(x, requires_grad=True) for x in inputs]
    expected = theirs(*reference)
    (expected * torch.from_numpy(weight)).sum().backward()

    assert out.shape == tuple(expected.shape)
    assert out.dtype == np.dtype(str(expected.dtype).removeprefix("torch."))
    np.testing.assert_allclose(out.data, expected.detach().numpy(), atol=FORWARD_ATOL, rtol=FORWARD_RTOL)
    for i, (x, r) in enumerate(zip(mine, reference)):
        np.testing.assert_allclose(x.grad.data, r.grad.numpy(), atol=GRAD_ATOL, rtol=GRAD_RTOL,
                                   err_msg=f"gradient of input {i}")
