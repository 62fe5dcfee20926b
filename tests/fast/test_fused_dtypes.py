"""Fused ops (tinygrad_ssm/fast/fused.py) against their engine twins over a grid of operand dtypes: the same output
dtype for every combination (integers were computed in integer arithmetic, float16 raised numba's bare
NotImplementedError), the same error where the twin refuses, and for float operands the same values and
gradients (gradients of float16 too)."""
import itertools

import numpy as np
import pytest

import tinygrad_ssm as tg
from tinygrad_ssm.fast import fused
from tests.support.fused_checks import TOL, values_and_grads
from tests.support.kernel_calls import counting_fused_ops

DTYPES = [np.bool_, np.int32, np.int64, np.float16, np.float32, np.float64]
FLOATS = [np.float16, np.float32, np.float64]


def _conv(x, w, b=None, h=None):
    return fused.conv1d_silu(x, w, b, h)


def _conv_reference(x, w, b=None, h=None):
    return fused.reference_conv1d_silu(x, w, b, h)


def _one(fn):
    """fn with its outputs flattened into one tensor (cat takes their common dtype), for values_and_grads."""
    def flat(*tensors):
        out = fn(*tensors)
        return tg.cat([o.reshape(-1) for o in out], axis=0) if isinstance(out, tuple) else out
    return flat


r = np.random.default_rng(3)
X, W, C = r.standard_normal((2, 5, 4)) * 2, r.standard_normal((4, 1, 3)), r.standard_normal(4)
H, DT, DTB = r.standard_normal((2, 2, 4)), r.uniform(-3, 3, (2, 5, 4)), r.uniform(-1, 1, 4)
CASES = {  # name: (fused, twin, arrays (one per operand))
    "conv1d_silu": (_conv, _conv_reference, [X, W]),
    "conv1d_silu bias": (_conv, _conv_reference, [X, W, C]),
    "conv1d_silu bias history": (_conv, _conv_reference, [X, W, C, H]),
    "dt_softplus": (fused.dt_softplus, fused.reference_dt_softplus, [DT, DTB]),
    "dt_softplus clipped": (lambda d, b: fused.dt_softplus(d, b, 0.1, 2.0),
                            lambda d, b: fused.reference_dt_softplus(d, b, 0.1, 2.0), [DT, DTB]),
    "gated_rms_norm": (lambda y, z, w: fused.gated_rms_norm(y, z, w, 2),
                       lambda y, z, w: fused.reference_gated_rms_norm(y, z, w, 2), [X, H.repeat(3, 1)[:, :5], C]),
    "rms_norm": (lambda y, w: fused.gated_rms_norm(y, None, w, 4),
                 lambda y, w: fused.reference_gated_rms_norm(y, None, w, 4), [X, C]),
    "add_rms_norm": (fused.add_rms_norm, fused.reference_add_rms_norm, [X, DT, C]),
    "add_rms_norm norm only": (lambda x, m, w: fused.add_rms_norm(x, m, w, return_total=False),
                               lambda x, m, w: fused.reference_add_rms_norm(x, m, w, return_total=False), [X, DT, C]),
}


def _outputs(fn, arrays, dtypes):
    """fn's outputs (a tuple) on the arrays in these dtypes, or the exception it raised."""
    try:
        out = fn(*(tg.Tensor(a.astype(d)) for a, d in zip(arrays, dtypes)))
    except Exception as e:                                        # the twin refuses some: the fused op must too
        return e
    return out if isinstance(out, tuple) else (out,)


@pytest.mark.parametrize("name", list(CASES))
def test_output_dtype_is_the_twins_for_every_dtype_combination(name):
    fast, slow, arrays = CASES[name]
    for dtypes in itertools.product(DTYPES, repeat=len(arrays)):
        with counting_fused_ops() as ran:
            got = _outputs(fast, arrays, dtypes)
        want = _outputs(slow, arrays, dtypes)
        where = f"{name} with operands {[np.dtype(d).name for d in dtypes]}"
        if isinstance(want, Exception):
            assert type(got) is type(want) and str(got) == str(want), where
            continue
        assert not isinstance(got, Exception), f"{where}: {got!r}"
        assert bool(ran) == kernels_expected(name, dtypes), f"{where}: fused ops run {dict(ran)}"
        assert [o.dtype for o in got] == [o.dtype for o in want], where
        for g, w in zip(got, want):
            _assert_close(g.data, w.data, dtypes, where, F32_OUT, bool(ran))


KERNEL = (np.float32, np.float64)


def kernels_expected(name, dtypes) -> bool:
    """Whether the fused op runs its kernels for operands of these dtypes (else its twin): float32 / float64 only,
    add_rms_norm not where the weight is wider than x + m (the twin's sum keeps x + m's dtype, which the
    kernels, writing sum and norm in one dtype, cannot), and the norms of y (and z) only where every operand has
    one dtype (the twin computes a float32 y's norm in float32, the kernels in the widest)."""
    if not all(d in KERNEL for d in dtypes):
        return False
    if name in ("gated_rms_norm", "rms_norm"):
        return len(set(dtypes)) == 1
    return not name.startswith("add_rms_norm") or np.result_type(*dtypes) == np.result_type(*dtypes[:2])
F32_OUT, F32_GRAD = dict(rtol=1e-5, atol=1e-5), dict(rtol=1e-4, atol=1e-4)   # as test_fused_norms' float32 checks


def _assert_close(got, want, dtypes, where, f32_tol, kernels):
    """Where the fused op runs its twin (`kernels` False: operands of any dtype but float32/float64, mixed ones
    where the twin's rounding differs): the same bits. The kernels: float64's tolerance where every operand is
    float64, float32's where one is float32 (the twin rounds to float32 in other places than the kernels)."""
    if not kernels:
        np.testing.assert_array_equal(got, want, err_msg=where)
    else:
        tol = TOL if set(dtypes) == {np.float64} else f32_tol
        np.testing.assert_allclose(got, want, **tol, err_msg=where)


@pytest.mark.parametrize("name", list(CASES))
def test_gradients_of_float_operands_equal_the_twins(name):
    """Every float dtype combination (float16 runs the twin; float32 with float64 the kernels in the twin's
    dtype): the same gradients, each in its input's dtype."""
    fast, slow, arrays = CASES[name]
    for dtypes in itertools.product(FLOATS, repeat=len(arrays)):
        typed = [a.astype(d) for a, d in zip(arrays, dtypes)]
        with counting_fused_ops() as ran:
            out_f, grads_f = values_and_grads(_one(fast), typed)
        out_s, grads_s = values_and_grads(_one(slow), typed)
        where = f"{name} with operands {[np.dtype(d).name for d in dtypes]}"
        assert bool(ran) == kernels_expected(name, dtypes), f"{where}: fused ops run {dict(ran)}"
        assert out_f.dtype == out_s.dtype, where
        _assert_close(out_f, out_s, dtypes, where, F32_OUT, bool(ran))
        for gf, gs, d in zip(grads_f, grads_s, dtypes):
            assert gf.dtype == gs.dtype == d, where
            _assert_close(gf, gs, dtypes, where, F32_GRAD, bool(ran))


def test_integer_inputs_give_the_twins_floats_not_integer_arithmetic():
    """The QA repro: all-int64 operands gave int64 [0 2 0 0] for conv1d_silu, -2**63 for the norms, [0 0 1 2] for
    dt_softplus. Now the twins' floats: float32 (silu(1), silu(3), silu(-1), silu(1) for the conv), float64 for
    add_rms_norm (its twin's F.rms_norm multiplies the float32 norm by the int64 weight in NumPy's float64)."""
    x, w = tg.Tensor(np.array([[[1], [2], [-3], [4]]])), tg.Tensor(np.ones((1, 1, 2), np.int64))
    out = fused.conv1d_silu(x, w)
    silu = lambda v: v / (1 + np.exp(-v))  # noqa: E731
    assert out.dtype == np.float32
    np.testing.assert_allclose(out.data.ravel(), silu(np.array([1.0, 3.0, -1.0, 1.0])), rtol=1e-6)
    y, ones = tg.Tensor(np.array([[1, 2, 3, 4]])), tg.Tensor(np.ones(4, np.int64))
    want = np.array([1, 2, 3, 4]) / np.sqrt(7.5 + 1e-5)
    zeros = tg.Tensor(np.zeros((1, 4), np.int64))
    for out, dtype in ((fused.gated_rms_norm(y, None, ones, 4), np.float32),
                       (fused.add_rms_norm(y, zeros, ones)[1], np.float64)):
        assert out.dtype == dtype
        np.testing.assert_allclose(out.data.ravel(), want, rtol=1e-6)
    out = fused.dt_softplus(tg.Tensor(np.array([[-3, 0, 1, 2]])), tg.Tensor(np.zeros(4, np.int64)))
    assert out.dtype == np.float32
    np.testing.assert_allclose(out.data.ravel(), np.logaddexp(0, [-3.0, 0, 1, 2]), rtol=1e-6)


@pytest.mark.parametrize("input_dtype", [np.int64, np.float16, np.float64])
def test_rms_norm_layer_fused_and_unfused_give_the_same_dtype(input_dtype):
    """nn.RMSNorm with float32 weights and an int64 input gave float64 fused and float32 unfused."""
    layers = [tg.nn.RMSNorm(tg.VarBuilder(tg.VarMap(seed=0)), 4, fused=f) for f in (True, False)]
    x = tg.Tensor(np.arange(8).reshape(2, 4).astype(input_dtype))
    fused_out, plain_out = (layer(x) for layer in layers)
    assert fused_out.dtype == plain_out.dtype
    np.testing.assert_allclose(fused_out.data, plain_out.data, rtol=1e-6)
