"""The norm and cross-entropy kernels give the same bits wherever the allocator puts their arrays. A sum in a loop
that also stored was vectorised behind a runtime check of the arrays' addresses, and ran as the scalar loop
(another order of additions) when an output lay within a few vectors of an input: one model's outputs moved by
2e-8 from call to call (a CI run compared two models' outputs bit for bit; 25 of 200 calls after random
allocations differed)."""
import numpy as np
import pytest

from tinygrad_ssm.fast import norm_kernels as K
from tinygrad_ssm.fast import row_kernels as R


def placed(gap: int, d: int, dtype):
    """(x, m, total, out) rows of one buffer, in that order, each `gap` elements after the one before (0: adjacent:
    a store just past a load is what the vectorised loop's check refused)."""
    buf = np.zeros(4 * (d + gap) + 64, dtype)
    return tuple(buf[i * (d + gap):i * (d + gap) + d].reshape(1, d) for i in range(4))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("d", [8, 16, 24, 64, 200])
def test_the_fused_add_and_norm_gives_the_same_bits_wherever_its_arrays_lie(dtype, d):
    rng = np.random.default_rng(d)
    x_values, m_values = rng.standard_normal(d).astype(dtype), rng.standard_normal(d).astype(dtype)
    weight, consts = rng.standard_normal(d).astype(dtype), np.array([0.0, 1.0 / d, 1.0, 1e-5], dtype)
    results = set()
    for gap in (0, 1, 3, 8, 17, 40, 1000):
        x, m, total, out = placed(gap, d, dtype)
        x[0], m[0] = x_values, m_values
        rstd = np.empty(1, dtype)
        K.add_rms_forward(x, 0, m, 0, weight, consts, 0, 1, total, out, rstd)
        results.add((out.tobytes(), rstd.tobytes()))
    assert len(results) == 1


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("d", [8, 16, 24, 64])
def test_the_gated_norm_gives_the_same_bits_wherever_its_arrays_lie(dtype, gated, d):
    rng = np.random.default_rng(d)
    y_values, z_values = rng.standard_normal(d).astype(dtype), rng.standard_normal(d).astype(dtype)
    weight, consts = rng.standard_normal(d).astype(dtype), np.array([0.0, 1.0 / d, 1.0, 1e-5], dtype)
    results = set()
    for gap in (0, 1, 3, 8, 17, 40, 1000):
        y, z, out, _ = placed(gap, d, dtype)
        y[0], z[0] = y_values, z_values
        rstd = np.empty((1, 1), dtype)
        K.gated_rms_forward(y, 0, z if gated else y, 0, weight, consts, gated, 0, 1, out, rstd)
        results.add((out.tobytes(), rstd.tobytes()))
    assert len(results) == 1


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("d", [8, 16, 24, 64])
def test_the_gated_norms_backward_gives_the_same_bits_wherever_its_arrays_lie(dtype, gated, d):
    rng = np.random.default_rng(d)
    values = [rng.standard_normal(d).astype(dtype) for _ in range(3)]                     # y, z, grad
    weight, consts = rng.standard_normal(d).astype(dtype), np.array([0.0, 1.0 / d, 1.0, 1e-5], dtype)
    rstd = np.array([[0.7]], dtype)
    results = set()
    for gap in (0, 1, 3, 8, 17, 40, 1000):
        buf = np.zeros(7 * (d + gap) + 64, dtype)
        y, z, grad, u, s, dy, dz = (buf[i * (d + gap):i * (d + gap) + d].reshape(1, d) for i in range(7))
        y[0], z[0], grad[0] = values
        dw = np.zeros(d, dtype)
        K.gated_rms_backward(y, 0, z if gated else y, 0, weight, rstd, grad, 0, consts, gated, 0, 1,
                             dy, 0, dz, 0, dw, u[0], s[0])
        results.add((dy.tobytes(), dz.tobytes() if gated else b"", dw.tobytes()))
    assert len(results) == 1


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("d", [8, 16, 24, 64, 200])
def test_cross_entropys_exps_and_sum_give_the_same_bits_wherever_the_gradient_lies(dtype, d):
    """The loss of the same logits came out in other bits as the allocator placed the gradient's row (a store of
    exp(x - m) and its sum in one loop: float32 at 24 classes, float64 at 16)."""
    values = np.random.default_rng(d).standard_normal(d).astype(dtype)
    results = set()
    for gap in (0, 1, 3, 8, 17, 40, 1000):
        row, out = placed(gap, d, dtype)[:2]
        row[0] = values
        total = R._exps_and_sum(row[0], dtype(values.max()), out[0], dtype(0))
        results.add((float(total), out.tobytes()))
    assert len(results) == 1
