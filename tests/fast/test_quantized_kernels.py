"""The decoder's products on quantized weights (fast/quantized_kernels.py, reached through decode_kernels'
weight_rows / embedding_row) against their twin: dequantize (models/mamba2/quantize.py's spec), then the float64
product. float64 work rows: 1e-10 (the dequantized weights are exact in float64, only the order of the sums
differs). float32: each product and sum rounds in float32, so the bound is k * eps32 * sum_j |w_j u_j| (the
standard bound of a k-term float32 dot product) plus the rounding of q * s to float32."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from numba import njit

from tinygrad_ssm.fast.decode_kernels import embedding_row, weight_rows
from tinygrad_ssm.models.mamba2.quantize import QuantizedWeight, dequantize


@njit(cache=False)
def _rows(W, lo, hi, u, bias, zero, out):
    weight_rows(W, lo, hi, u, bias, zero, out)


@njit(cache=False)
def _row(E, token, out):
    embedding_row(E, token, out)


def _case(fmt, rows, blocks, block, batch, dtype, seed, extra=0):
    """A random (rows, k) weight quantized to fmt, k = blocks * block (+ extra columns for bfloat16, which has
    no blocks: a k that is not a multiple of the kernel's vectors of 32)."""
    rng = np.random.default_rng(seed)
    k = blocks * block + (extra if fmt == "bfloat16" else 0)
    w = rng.standard_normal((rows, k)) * rng.uniform(0.01, 3.0, (rows, 1))
    if rows > 1:
        w[1, :block] = 0.0                                              # a zero block
    qw = QuantizedWeight.from_float(w, fmt, block)
    u = rng.standard_normal((batch, k)).astype(dtype)                   # (b, in)
    bias = rng.standard_normal(rows).astype(dtype)
    return qw, u, bias


def _spec(qw, lo, hi, dtype=np.float64):
    """Rows lo:hi of qw by quantize.dequantize, the formats' spec (NumPy)."""
    return dequantize(qw.format, qw.data[lo:hi], None if qw.scales is None else qw.scales[lo:hi], dtype)


@given(fmt=st.sampled_from(["int8", "bfloat16"]), rows=st.integers(1, 13), blocks=st.integers(1, 4),
       block=st.sampled_from([4, 8, 24, 32, 40, 64, 96, 128]), batch=st.integers(1, 21), lo=st.integers(0, 12),
       extra=st.integers(0, 40), seed=st.integers(0, 2**16))
def test_quantized_rows_equal_the_dequantized_float64_product(fmt, rows, blocks, block, batch, lo, extra, seed):
    """Batches of up to 21 rows: groups of 8, 4 and single rows; blocks of 32, 64, 96, 128 (1 to 4 vectors of 32
    to a scale), 8, 24, 40 (vectors of 8), 4 (a row widened, then its dots); bfloat16 with columns past the last
    vector."""
    qw, u, bias = _case(fmt, rows, blocks, block, batch, np.float64, seed, extra)
    lo = min(lo, rows)
    out = np.full((batch, rows), np.nan)
    _rows(qw.kernel_form(), lo, rows, u, bias, 0.0, out)
    expected = u @ _spec(qw, 0, rows).T + bias                          # the twin: dequantize, float64 product
    np.testing.assert_allclose(out[:, lo:], expected[:, lo:], rtol=1e-10, atol=1e-10)
    assert np.isnan(out[:, :lo]).all()                                  # rows outside [lo, hi) untouched


@pytest.mark.parametrize("block", [1, 4, 12, 8, 16, 24, 48, 32, 64, 96])
def test_int8_rows_of_every_kind_of_block_equal_the_dequantized_product(block):
    """Each block the int8 products treat apart, whatever the draws above took: not a multiple of 8 (a row widened
    into a buffer, then its dots), a multiple of 8 but not of 32 (vectors of 8, 1 to 6 of them to a scale: 48 is
    1.5 vectors of 32), 32 and its multiples (vectors of 32, 1 to 3 of them to a scale)."""
    qw, u, bias = _case("int8", 5, 2, block, 9, np.float64, block, 0)
    out = np.full((9, 5), np.nan)
    _rows(qw.kernel_form(), 0, 5, u, bias, 0.0, out)
    np.testing.assert_allclose(out, u @ _spec(qw, 0, 5).T + bias, rtol=1e-10, atol=1e-10)


@given(fmt=st.sampled_from(["int8", "bfloat16"]), rows=st.integers(1, 13), blocks=st.integers(1, 4),
       block=st.sampled_from([32, 64]), batch=st.integers(1, 13), extra=st.integers(0, 40),
       seed=st.integers(0, 2**16))
def test_float32_rows_are_within_float32_rounding_of_the_twin(fmt, rows, blocks, block, batch, extra, seed):
    qw, u, bias = _case(fmt, rows, blocks, block, batch, np.float32, seed, extra)
    out = np.zeros((batch, rows), np.float32)
    _rows(qw.kernel_form(), 0, rows, u, bias, np.float32(0), out)
    w = _spec(qw, 0, rows)
    expected = u.astype(np.float64) @ w.T + bias
    k = w.shape[1]
    bound = (k + 2) * np.finfo(np.float32).eps * (np.abs(u.astype(np.float64)) @ np.abs(w).T + np.abs(bias))
    assert (np.abs(out - expected) <= bound + 1e-30).all()


@given(fmt=st.sampled_from(["int8", "bfloat16"]), blocks=st.integers(1, 3), block=st.sampled_from([4, 32]),
       dtype=st.sampled_from([np.float32, np.float64]), seed=st.integers(0, 2**16))
def test_embedding_row_is_the_dequantized_row(fmt, blocks, block, dtype, seed):
    qw, _, _ = _case(fmt, 6, blocks, block, 1, np.float64, seed)
    out = np.empty(blocks * block, dtype)
    _row(qw.kernel_form(), 3, out)
    np.testing.assert_array_equal(out, _spec(qw, 3, 4, dtype)[0])


def test_float_weights_still_take_the_float_kernel():
    rng = np.random.default_rng(0)
    W, u = rng.standard_normal((9, 16)), rng.standard_normal((5, 16))
    out = np.zeros((5, 9))
    _rows(W, 0, 9, u, np.zeros(9), 0.0, out)
    np.testing.assert_allclose(out, u @ W.T, rtol=1e-12, atol=1e-12)


@given(fmt=st.sampled_from(["int8", "bfloat16"]), rows=st.integers(1, 9), blocks=st.integers(1, 4),
       block=st.sampled_from([4, 32, 96]), extra=st.integers(0, 40), start=st.integers(0, 9),
       dtype=st.sampled_from([np.float32, np.float64]), seed=st.integers(0, 2**16))
def test_dequantized_rows_have_the_bits_of_the_spec(fmt, rows, blocks, block, extra, start, dtype, seed):
    """QuantizedWeight.rows (the numba kernels, used by the forward) against dequantize (NumPy, the spec):
    the same bits, float32 and float64, any row range (empty ones too)."""
    qw, _, _ = _case(fmt, rows, blocks, block, 1, np.float64, seed, extra)
    got, want = qw.rows(start, rows, dtype), _spec(qw, start, rows, dtype)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
