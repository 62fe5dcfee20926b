"""Forward values of every op in tinygrad_ssm.autograd.functional.OPS against independent expected values
(tests/support/op_references.py: textbook formulas in Python's math module and explicit loops): one test per variant
of each op's `forward` entry in the table of tests/support/op_specs.py. Gradient checks only compare the backward
with the forward, so a wrong forward passes them, and the torch parity tests skip without torch: in CI this
file is the forward's independent check. Below the table's tests: edge values (huge, infinite, ignored).

Tolerances (tests/support/op_references.py): float64 rtol = atol = 1e-12 (the references differ from the ops only by
rounding: math.exp vs np.exp, fsum vs pairwise sums); float32 outputs against the float64 reference on the
same float32 inputs."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.op_references import (ATOL, F32_ATOL, F32_RTOL, F32_TINY, RTOL, assert_close, cross_entropy_ref, einsum_ref,
                           gather_ref, lanes_ref, log_softmax_ref, logsumexp_ref, pointwise, reduce_ref,
                           softmax_ref, softplus_ref, sigmoid_ref, strict_floats)
from tests.support.op_specs import SPECS
from tinygrad_ssm import Tensor
from tinygrad_ssm.autograd import functional as F

FORWARD_CASES = [pytest.param(name, variant, id=f"{name}-{variant}" if variant else name)
                 for name, spec in SPECS.items() for variant in spec.forward]


@pytest.mark.parametrize("name, variant", FORWARD_CASES)
@given(data=st.data())
def test_op_forward(name, variant, data):
    SPECS[name].forward[variant](data)


# --- edge values ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_operators_with_python_scalars_keep_the_tensor_dtype(dtype):
    x = np.array([-1.5, -0.25, 0.5, 2.0], dtype=dtype)
    t = Tensor(x)
    rtol, atol = (RTOL, ATOL) if dtype == np.float64 else (F32_RTOL, F32_ATOL)
    for out, reference in ((t + 2.5, lambda v: v + 2.5), (2.5 - t, lambda v: 2.5 - v), (t * -1.5, lambda v: -1.5 * v),
                           (3.0 / t, lambda v: 3.0 / v), (t ** 3, lambda v: v ** 3), (2.0 ** t, lambda v: 2.0 ** v),
                           (-t, lambda v: -v), (F.abs(t) ** 0.5, lambda v: math.sqrt(abs(v)))):
        assert_close(out, pointwise(reference, x), dtype, rtol, atol)
    ints = Tensor(np.array([1, -2, 3]))  # an int tensor meeting a float one takes the float dtype (torch)
    assert_close(ints * Tensor(np.array([0.5], dtype)), [0.5, -1.0, 1.5], dtype)


def test_integer_sum_and_max_stay_integers():
    x = np.arange(-6, 6).reshape(3, 4)
    assert_close(F.sum(Tensor(x), 1), [sum(r) for r in x.tolist()], np.int64)
    assert_close(F.max(Tensor(x), 0), [max(c) for c in zip(*x.tolist())], np.int64)


def test_softmax_family_of_a_scalar_and_of_huge_logits():
    assert_close(F.softmax(Tensor(np.array(0.7)), -1), np.array(1.0))
    assert_close(F.cumsum(Tensor(np.array(0.7)), 0), np.array(0.7))
    # 1000 + v overflows exp; softmax and logsumexp - 1000 don't depend on the shift, and 1000 + k/8 is exact
    small = np.array([[0.0, 1.0, -2.5, 0.125], [3.0, 3.0, -1.0, 2.0]])
    huge = Tensor(1000.0 + small)
    with strict_floats():
        assert_close(F.softmax(huge, -1), lanes_ref(small, -1, softmax_ref))
        assert_close(F.log_softmax(huge, -1), lanes_ref(small, -1, log_softmax_ref))
        assert_close(F.logsumexp(huge, 1) - 1000.0, reduce_ref(small, 1, False, logsumexp_ref))


def test_reductions_of_rows_with_minus_infinity():
    x = np.array([[-np.inf, 0.0, 1.0], [-np.inf, -np.inf, -np.inf], [-np.inf, 2.0, -np.inf], [np.inf, 0.0, 1.0]])
    with strict_floats():  # a fully masked row is -inf, silently, as torch
        assert_close(F.logsumexp(Tensor(x), 1), reduce_ref(x, 1, False, logsumexp_ref))
        assert_close(F.logsumexp(Tensor(x[:3]), None), reduce_ref(x[:3], None, False, logsumexp_ref))
        assert_close(F.logsumexp(Tensor(x[:3].astype(np.float32)), 1, keepdims=True),
                     reduce_ref(x[:3], 1, True, logsumexp_ref), np.float32, F32_RTOL, F32_ATOL)
        masked = x[[0, 2]]  # masked attention: -inf entries get probability 0 (log-probability -inf)
        assert_close(F.softmax(Tensor(masked), -1), lanes_ref(masked, -1, softmax_ref))
        assert_close(F.log_softmax(Tensor(masked), -1), lanes_ref(masked, -1, log_softmax_ref))
        assert_close(F.max(Tensor(x), 1), [1.0, -np.inf, 2.0, np.inf])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_cross_entropy_over_only_ignored_rows(dtype):
    logits, targets = Tensor(np.ones((2, 3), dtype)), np.array([-100, -100])
    with strict_floats():
        assert np.isnan(F.cross_entropy(logits, targets).item())  # torch: the mean over no rows is nan
        assert_close(F.cross_entropy(logits, targets, reduction="mean"), np.array(np.nan), dtype)
        assert_close(F.cross_entropy(logits, targets, reduction="sum"), np.array(0.0), dtype)
        assert_close(F.cross_entropy(logits, targets, reduction="none"), [0.0, 0.0], dtype)


def test_cross_entropy_with_minus_infinity_logits():
    # masked-out classes (-inf) in every row, also at class 0, where ignored rows used to be read
    logits = np.array([[-np.inf, 1.0, 2.0], [0.5, -np.inf, -1.0], [-np.inf, -np.inf, 3.0]])
    targets = np.array([-100, 0, 2])
    with strict_floats():
        for reduction in ("none", "sum", "mean"):
            assert_close(F.cross_entropy(Tensor(logits), targets, reduction=reduction),
                         cross_entropy_ref(logits, targets, reduction=reduction))


def test_einsum_float32_and_an_implicit_output():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 3, 4)).astype(np.float32), rng.standard_normal((2, 4, 5)).astype(np.float32)
    assert_close(F.einsum("bij,bjk->bik", Tensor(a), Tensor(b)), einsum_ref("bij,bjk->bik", a, b),
                 np.float32, F32_RTOL, F32_ATOL)
    x, y = rng.standard_normal((3, 2)), rng.standard_normal((2, 4))  # "ij,jk" means "ij,jk->ik"
    assert_close(F.einsum("ij,jk", Tensor(x), Tensor(y)), gather_ref((3, 4), lambda i: math.fsum(
        x[i[0], j] * y[j, i[1]] for j in range(2))))


def test_einsum_ellipses_of_different_lengths_broadcast_from_the_right():
    """NumPy's rule: an operand whose ellipsis covers fewer axes lines them up with the last of the other's
    (the operands' hypothesis shapes share one ellipsis, so the property tests never meet this)."""
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((5, 2, 3, 4)), rng.standard_normal((2, 4, 6))      # ... is (5, 2) and (2,)
    assert_close(F.einsum("...ij,...jk->...ik", Tensor(a), Tensor(b)), einsum_ref("...ij,...jk->...ik", a, b))
    assert_close(F.einsum("...jk,...ij", Tensor(b), Tensor(a)), einsum_ref("...jk,...ij", b, a))


def tolerances(dtype):
    return (RTOL, ATOL) if dtype == np.float64 else (F32_RTOL, F32_TINY)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_softplus_at_large_inputs(dtype):
    x = np.array([-800.0, -100.0, -30.0, -1.0, 0.0, 1.0, 19.5, 20.0, 20.25, 25.0, 100.0, 800.0, 3e38], dtype)
    with strict_floats():
        out = F.softplus(Tensor(x))
        out_beta = F.softplus(Tensor(x[:-1]), beta=2.0, threshold=10.0)  # 2 * 3e38 would overflow float32
    above = x > 20  # exactly the input there, bit for bit (torch's threshold is strict: 20 itself is soft)
    np.testing.assert_array_equal(out.data[above], x[above])
    soft = [math.log1p(math.exp(v)) for v in x[~above].tolist()]  # at 20: 20 + 2.06e-9, not 20
    assert_close(Tensor(out.data[~above]), soft, dtype, *tolerances(dtype))
    if dtype == np.float64:  # in float32, 20 + 2e-9 rounds to 20
        assert out.data[x == 20.0][0] > 20.0
    assert_close(out_beta, pointwise(lambda v: softplus_ref(v, 2.0, 10.0), x[:-1]), dtype, *tolerances(dtype))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_sigmoid_and_silu_at_large_inputs(dtype):
    x = np.array([-800.0, -700.0, -100.0, -40.0, 40.0, 100.0, 700.0, 800.0], dtype)
    with strict_floats():
        sig, silu = F.sigmoid(Tensor(x)), F.silu(Tensor(x))
    # 1/(1+exp(-x)) overflows in Python below -709; there sigmoid(x) = exp(x) (1 - exp(x) + ...) and the
    # correction is below 1e-17 of the value for x <= -40, so exp(x) is the correctly rounded answer
    expected = np.array([math.exp(v) if v < 0 else sigmoid_ref(v) for v in x.tolist()])
    assert_close(sig, expected, dtype, *tolerances(dtype))
    assert_close(silu, x.astype(np.float64) * expected, dtype, *tolerances(dtype))
    assert (sig.data[x > 0] == 1.0).all() and sig.data[0] == 0.0
