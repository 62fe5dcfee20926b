"""Making tensors (tinygrad_ssm/autograd/creation.py): the dtypes they come in, and random ones drawn from the
generator given."""
import numpy as np
import pytest

import tinygrad_ssm as tg


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.float64, np.float32, np.bool_])
def test_zeros_like_and_ones_like_keep_the_tensors_dtype(dtype):
    t = tg.Tensor(np.ones((2, 3), dtype))
    for make, value in ((tg.zeros_like, 0), (tg.ones_like, 1)):
        out = make(t)
        assert out.dtype == dtype and out.shape == (2, 3) and (out.data == value).all()
        assert make(t, dtype=np.float64).dtype == np.float64                     # a dtype given wins


def test_arange_is_float32_from_python_floats_and_keeps_a_numpy_scalars_dtype():
    """torch.arange(0, 1, 0.25) is float32 (NumPy's would be float64); a NumPy float64 bound states its dtype, as
    tensor(np.float64(x)) keeps float64."""
    assert tg.arange(0, 1, 0.25).dtype == np.float32
    assert tg.arange(np.float64(0), 1, 0.25).dtype == np.float64
    assert tg.arange(0, np.float64(1), 0.25).dtype == np.float64
    assert tg.arange(0, 1, 0.25, dtype=np.float64).dtype == np.float64
    assert tg.arange(4).dtype == np.int64
    np.testing.assert_array_equal(tg.arange(np.float64(0), 1, 0.25).data, [0, 0.25, 0.5, 0.75])


@pytest.mark.parametrize("make, draw", [(tg.randn, "standard_normal"), (tg.rand, "random")])
def test_random_tensors_are_drawn_from_the_generator_given(make, draw):
    out = make(3, 4, rng=np.random.default_rng(5))
    expected = getattr(np.random.default_rng(5), draw)((3, 4)).astype(np.float32)
    assert out.dtype == np.float32 and np.array_equal(out.data, expected)
    assert np.array_equal(make((3, 4), dtype=np.float64, rng=np.random.default_rng(5)).data,
                          getattr(np.random.default_rng(5), draw)((3, 4)))


@pytest.mark.parametrize("call,error,message", [
    (lambda: tg.full((2,), None), TypeError, r"full: value must be a number, got None"),       # was [nan, nan]
    (lambda: tg.full((2,), "1"), TypeError, r"full: value must be a number"),
    (lambda: tg.zeros_like([1, 2]), TypeError, r"zeros_like: input must be a Tensor, got list"),
    (lambda: tg.ones_like(None), TypeError, r"ones_like: input must be a Tensor, got NoneType"),
    (lambda: tg.arange(0, 10, 0), ValueError, r"arange: step must not be zero"),                # ZeroDivisionError
    (lambda: tg.zeros(2, -1), ValueError, r"zeros: sizes must be >= 0, got \(2, -1\)"),       # NumPy's, no op named
    (lambda: tg.ones((-1,)), ValueError, r"ones: sizes must be >= 0"),
    (lambda: tg.full(-1, 0.0), ValueError, r"full: sizes must be >= 0"),
    (lambda: tg.randn(2.5), TypeError, r"randn: sizes must be ints, got \(2.5,\)"),
    (lambda: tg.rand(True), TypeError, r"rand: sizes must be ints"),
    (lambda: tg.Tensor(np.ones(2), requires_grad="no"), TypeError, r"requires_grad must be True or False"),
    (lambda: tg.Tensor(np.ones(2)).requires_grad_("no"), TypeError, r"requires_grad must be True or False"),
    (lambda: tg.Tensor(np.ones(2), requires_grad=1), TypeError, r"requires_grad must be True or False"),
])
def test_bad_arguments_are_refused_naming_them(call, error, message):
    """Found by an API audit: requires_grad="no" made a tensor that required grad (the string is truthy), and
    full(shape, None) silently filled NaN."""
    with pytest.raises(error, match=message):
        call()


def test_full_takes_an_int_shape_as_zeros_does():
    assert tg.full(2, 1.5).shape == tg.zeros(2).shape == (2,)
    assert tg.Tensor(np.ones(2), requires_grad=np.bool_(True)).requires_grad


@pytest.mark.parametrize("value, dtype", [(1, np.int64), (1.5, np.float32), (True, np.bool_), (np.float64(1.5), np.float64),
                                          (np.int32(2), np.int32)])
def test_full_takes_the_values_kind_as_torch_full(value, dtype):
    """torch.full((2,), 1) is int64, full((2,), True) bool, full((2,), 1.5) float32; ours was float32 for all."""
    out = tg.full((2,), value)
    assert out.dtype == dtype and out.data.tolist() == [value, value]
    assert tg.full((2,), 1, dtype=np.float64).dtype == np.float64                  # a dtype given wins
    with pytest.raises(OverflowError, match=r"full: value 9223372036854775808 does not fit int64"):
        tg.full((2,), 2**63)                                                     # was uint64
    assert tg.full((2,), -2**63).dtype == np.int64


@pytest.mark.parametrize("data, dtype", [([np.float64(1.5)], np.float64), ([1.5, np.float64(2)], np.float64),
                                         ([[1.5], [np.float64(2)]], np.float64), ((1, np.float64(2)), np.float64),
                                         ([np.array([1.5]), np.array([2.0])], np.float64), ([1.5, 2.0], np.float32),
                                         ([np.float32(1.5), 2.0], np.float32), ([np.float16(1), 2.5], np.float32),
                                         ([True, 1.5], np.float32), ([np.int32(1), 2], np.int64)])
@pytest.mark.parametrize("make", [tg.Tensor, tg.tensor])
def test_a_list_holding_numpy_float64s_stays_float64_as_torch_tensor(data, dtype, make):
    """torch.tensor([np.float64(1.5)]) is float64 (each of the table's dtypes is torch 2.13's); ours was float32."""
    assert make(data).dtype == dtype
