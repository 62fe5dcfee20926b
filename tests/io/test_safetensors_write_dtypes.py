"""Storing float arrays in another dtype (io/safetensors.py: float_to_bf16, stored_as, save_file's `bfloat16`):
bfloat16 rounded to nearest, ties to even, as torch's .to(torch.bfloat16); float16 as NumPy's astype (IEEE
round to nearest); a finite value that would become infinity refused, naming the tensor; the file's header tags
and bytes as the safetensors library itself reads them."""
import json
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tinygrad_ssm.io.safetensors import (STORED_DTYPES, SafetensorsFile, bf16_to_float32, check_storable,
                                         float_to_bf16, load_file, save_file, stored_as)

FLOAT32S = hnp.arrays(np.float32, hnp.array_shapes(max_dims=2, max_side=6),
                      elements=st.floats(width=32, allow_nan=False, allow_infinity=False))


def _nearest_bf16(x: float) -> float:
    """The bfloat16 value nearest to float32 x, by search over the two neighbours that truncation gives (the
    spec: no bit tricks), ties to the one whose last mantissa bit is 0."""
    bits = int(np.array(x, np.float32).view(np.uint32))
    down = bits & 0xFFFF0000
    up = down + 0x10000
    lo, hi = (float(np.array(b, np.uint32).view(np.float32)) for b in (down, up))
    if np.isinf(hi):        # past the largest: infinity stands where 2^128 would be, and is chosen as that would be
        beyond = float(np.copysign(2.0 ** 128, float(x)))
        chosen = _nearest_of(x, lo, beyond, down)
        return hi if chosen == beyond else lo
    return _nearest_of(x, lo, hi, down)


def _nearest_of(x: float, lo: float, hi: float, down: int) -> float:
    d_lo, d_hi = abs(float(x) - lo), abs(hi - float(x))
    if d_lo != d_hi:
        return lo if d_lo < d_hi else hi
    return lo if (down >> 16) % 2 == 0 else hi


@settings(max_examples=60, deadline=None)
@given(FLOAT32S)
def test_bfloat16_is_the_nearest_value_ties_to_even(values):
    got = bf16_to_float32(float_to_bf16(values))                        # same shape
    assert got.shape == values.shape
    want = np.array([_nearest_bf16(float(x)) for x in values.ravel()], np.float32).reshape(values.shape)
    np.testing.assert_array_equal(got, want)


def test_bfloat16_ties_go_to_the_even_neighbour():
    # 1 + 2^-8 lies halfway between 1 (even) and 1 + 2^-7 (odd); 1 + 3 * 2^-8 halfway between 1 + 2^-7 (odd)
    # and 1 + 2^-6 (even): truncation or rounding halves up would give another value for one of them
    halfway = np.array([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8)], np.float32)
    np.testing.assert_array_equal(bf16_to_float32(float_to_bf16(halfway)), [1.0, 1 + 2**-6, -1.0])


def test_bfloat16_past_its_largest_value_ties_to_infinity():
    """The float32 halfway between bfloat16's largest (odd) and where the next would be (2^128) goes to infinity,
    as IEEE's rounding (and torch) has it; just under it, to the largest."""
    largest = float(bf16_to_float32(np.array([0x7F7F], np.uint16))[0])
    halfway = np.array([0x7F7F8000, 0x7F7F7FFF], np.uint32).view(np.float32)
    got = bf16_to_float32(float_to_bf16(np.concatenate([halfway, -halfway])))
    np.testing.assert_array_equal(got, [np.inf, largest, -np.inf, -largest])
    assert [_nearest_bf16(x) for x in halfway] == [np.inf, largest]


def test_bfloat16_of_nan_and_infinity():
    bits = float_to_bf16(np.array([np.nan, -np.nan, np.inf, -np.inf], np.float32))
    back = bf16_to_float32(bits)
    assert np.isnan(back[:2]).all() and list(back[2:]) == [np.inf, -np.inf]


def test_bfloat16_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.standard_normal(5000) * 10.0 ** rng.integers(-30, 30, 5000),
                             rng.standard_normal(100)]).astype(np.float64)
    want = torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(float_to_bf16(values), want)           # float64 through float32, as torch


@pytest.mark.parametrize("dtype, fits, past", [("float16", 65519.0, 65520.0), ("bfloat16", 3.3961e38, 3.3962e38),
                                               ("float32", 3.4028235e38, 3.41e38)])
def test_a_value_past_the_dtypes_range_is_refused_naming_the_tensor(dtype, fits, past):
    stored = stored_as("w", np.array([1.0, -fits]), dtype)              # rounds to the largest, not to infinity
    widened = bf16_to_float32(stored) if dtype == "bfloat16" else stored
    assert np.isfinite(widened).all()
    with pytest.raises(ValueError, match=rf"store 'layers.0.w': its values reach .* past the largest {dtype}"):
        stored_as("layers.0.w", np.array([1.0, -past]), dtype)


def test_non_finite_values_are_not_an_overflow_and_an_unknown_dtype_is_named():
    check_storable("w", np.array([np.inf, np.nan, 1.0]), "float16")     # already infinite: stored as it is
    with pytest.raises(ValueError, match="dtype must be one of float64, float32, float16, bfloat16, got 'int8'"):
        stored_as("w", np.ones(2), "int8")


@pytest.mark.parametrize("dtype", STORED_DTYPES)
def test_save_file_writes_each_dtype_as_the_library_reads_it(tmp_path, dtype):
    """The header's tag and the bytes, read back by the safetensors library's own reader (numpy has no bfloat16:
    its bits are compared) and by ours."""
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    values = np.random.default_rng(1).standard_normal((3, 5))
    arrays = {"a": stored_as("a", values, dtype), "scalar": stored_as("scalar", np.float64(2.5), dtype)}
    path = tmp_path / "w.safetensors"
    save_file(path, arrays, metadata={"format": "pt"}, bfloat16=set(arrays) if dtype == "bfloat16" else set())
    n = struct.unpack("<Q", path.read_bytes()[:8])[0]
    header = json.loads(path.read_bytes()[8:8 + n])
    tag = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16"}[dtype]
    assert header["a"]["dtype"] == tag and header["a"]["shape"] == [3, 5] and header["scalar"]["shape"] == []
    if dtype != "bfloat16":
        read = safetensors_numpy.load_file(str(path))
        assert read["a"].dtype == np.dtype(dtype) and read["a"].tobytes() == arrays["a"].tobytes()
    with SafetensorsFile(path) as f:
        assert f.tensors["a"].dtype == tag
    ours = load_file(path)
    want = bf16_to_float32(arrays["a"]) if dtype == "bfloat16" else arrays["a"]
    np.testing.assert_array_equal(ours["a"], want)
    assert ours["scalar"].shape == () and float(ours["scalar"]) == 2.5


def test_save_file_refuses_bfloat16_names_that_are_not_bits_or_not_saved(tmp_path):
    with pytest.raises(TypeError, match="tensor 'a' is to be stored as BF16 but holds float32"):
        save_file(tmp_path / "w.safetensors", {"a": np.ones(2, np.float32)}, bfloat16={"a"})
    with pytest.raises(ValueError, match=r"bfloat16 names tensors that are not saved: \['b'\]"):
        save_file(tmp_path / "w.safetensors", {"a": np.ones(2, np.uint16)}, bfloat16={"b"})
    assert not list(tmp_path.iterdir())


def test_big_endian_arrays_are_written_little_endian(tmp_path):
    values = np.arange(6, dtype=">f4").reshape(2, 3)
    save_file(tmp_path / "w.safetensors", {"a": values})
    np.testing.assert_array_equal(load_file(tmp_path / "w.safetensors")["a"], values)
