"""SafetensorsFile.read_into: a stored tensor read straight into an existing array, converted (F16 / BF16 / F64 ->
float32, ...) in pieces of at most READ_PIECE_BYTES: bit for bit what NumPy's astype of the stored values gives,
whatever the piece size, and never a full-size temporary (tracemalloc sees NumPy's allocations)."""
import json
import struct
import tracemalloc
from unittest import mock

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinygrad_ssm.io import safetensors
from tinygrad_ssm.io.safetensors import CheckpointError, SafetensorsFile

STORED = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2"}


def write_tensors(path, entries: dict):
    """name -> (tag, float values): the values stored under the tag (BF16: the top 16 bits of their float32)."""
    header, data, offset = {}, b"", 0
    for name, (tag, values) in entries.items():
        values = np.asarray(values)
        raw = ((values.astype(np.float32).view(np.uint32) >> 16).astype("<u2") if tag == "BF16"
               else values.astype(STORED[tag])).tobytes()
        header[name] = {"dtype": tag, "shape": list(values.shape), "data_offsets": [offset, offset + len(raw)]}
        data, offset = data + raw, offset + len(raw)
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + data)


def expected(path, name: str, dtype) -> np.ndarray:
    """The old read: the tensor's bytes as one array, widened (BF16) and converted by astype in one go."""
    f = SafetensorsFile(path)
    info = f.tensors[name]
    raw = path.read_bytes()
    start = 8 + struct.unpack("<Q", raw[:8])[0] + info.begin
    array = np.frombuffer(raw[start:start + info.end - info.begin], dtype=STORED[info.dtype]).reshape(info.shape)
    if info.dtype == "BF16":
        array = (array.astype(np.uint32) << 16).view(np.float32)
    return array.astype(dtype)


SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-42, 65504.0, 7e4, 3.0e38, 1.0 / 3.0]


@given(shape=st.lists(st.integers(0, 7), max_size=3), tag=st.sampled_from(sorted(STORED)),
       dtype=st.sampled_from(["float32", "float64"]), piece_bytes=st.sampled_from([2, 8, 24, 1 << 20]),
       seed=st.integers(0, 2**16))
def test_read_into_equals_the_one_piece_astype_bit_for_bit(tmp_path_factory, shape, tag, dtype, piece_bytes, seed):
    rng = np.random.default_rng(seed)
    values = rng.standard_normal(shape) * 10.0 ** rng.integers(-8, 8, shape)
    flat = values.reshape(-1)
    flat[:len(SPECIAL)] = SPECIAL[:flat.size]                           # non-finite, signed zero, subnormal, overflow
    path = tmp_path_factory.mktemp("read") / "t.safetensors"
    with np.errstate(over="ignore"):
        write_tensors(path, {"other": ("F32", np.ones(3)), "w": (tag, values)})
    out = np.full(tuple(shape), 7.0, dtype=dtype)
    with mock.patch.object(safetensors, "READ_PIECE_BYTES", piece_bytes), np.errstate(over="ignore"):
        returned = SafetensorsFile(path).read_into("w", out)
        reference = expected(path, "w", dtype)
        read = SafetensorsFile(path).read("w", dtype)
    assert returned is out and out.dtype == np.dtype(dtype)
    assert out.tobytes() == reference.tobytes() == read.tobytes()


@given(rows=st.integers(0, 9), cols=st.lists(st.integers(1, 4), max_size=2), tag=st.sampled_from(sorted(STORED)),
       dtype=st.sampled_from([None, "float32", "float64"]), data=st.data())
def test_read_rows_is_the_slice_of_read(tmp_path_factory, rows, cols, tag, dtype, data):
    start = data.draw(st.integers(0, rows))
    stop = data.draw(st.integers(start, rows))
    values = np.random.default_rng(rows).standard_normal((rows, *cols))
    path = tmp_path_factory.mktemp("rows") / "t.safetensors"
    write_tensors(path, {"before": ("F16", np.ones(5)), "w": (tag, values)})
    with mock.patch.object(safetensors, "READ_PIECE_BYTES", 6):
        got = SafetensorsFile(path).read_rows("w", start, stop, dtype)
    want = SafetensorsFile(path).read("w", dtype)[start:stop]
    assert got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes()


def test_read_rows_refuses_a_range_outside_the_tensor(tmp_path):
    write_tensors(tmp_path / "f.safetensors", {"w": ("F32", np.ones((4, 2))), "s": ("F32", np.float32(1))})
    f = SafetensorsFile(tmp_path / "f.safetensors")
    for start, stop in [(3, 5), (-1, 2), (3, 2)]:
        with pytest.raises(ValueError, match=rf"read_rows 'w': need 0 <= start <= stop <= rows .*\(4, 2\), got "
                                             rf"{start}:{stop}"):
            f.read_rows("w", start, stop)
    with pytest.raises(ValueError, match=r"read_rows 's'.*shape \(\)"):
        f.read_rows("s", 0, 0)


def test_float32_is_read_into_the_array_as_stored(tmp_path):
    values = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    write_tensors(tmp_path / "f.safetensors", {"w": ("F32", values)})
    out = np.empty((5, 3), np.float32)
    SafetensorsFile(tmp_path / "f.safetensors").read_into("w", out)
    assert out.tobytes() == values.tobytes()


def test_bad_out_arrays_are_refused_naming_the_tensor(tmp_path):
    path = tmp_path / "f.safetensors"
    write_tensors(path, {"w": ("F16", np.ones((4, 3)))})
    f = SafetensorsFile(path)
    with pytest.raises(ValueError, match=r"read_into 'w': out has shape \(3, 4\) but .*f\.safetensors' stores "
                                         r"shape \(4, 3\)"):
        f.read_into("w", np.empty((3, 4), np.float32))
    with pytest.raises(ValueError, match="C-contiguous and writable"):
        f.read_into("w", np.empty((4, 6), np.float32)[:, ::2])
    read_only = np.empty((4, 3), np.float32)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="C-contiguous and writable"):
        f.read_into("w", read_only)
    with pytest.raises(TypeError, match="must be a NumPy array, got list"):
        f.read_into("w", [[0.0] * 3] * 4)
    with pytest.raises(KeyError, match=r"no tensor named 'v' \(the file holds 1 tensors\)"):
        f.read_into("v", np.empty((4, 3), np.float32))


@pytest.mark.parametrize("tag", ["F32", "BF16"])
def test_a_file_that_shrinks_after_opening_is_a_checkpoint_error(tmp_path, tag):
    path = tmp_path / "f.safetensors"
    write_tensors(path, {"w": (tag, np.ones((64, 8)))})
    f = SafetensorsFile(path)
    with open(path, "r+b") as handle:
        handle.truncate(path.stat().st_size - 10)
    with pytest.raises(CheckpointError, match=r"f\.safetensors.*truncated while reading 'w'"):
        f.read_into("w", np.empty((64, 8), np.float32))


@pytest.mark.parametrize(("tag", "dtype"), [("F32", "float32"), ("BF16", "float32"), ("F16", "float32"),
                                            ("F64", "float32"), ("F32", "float64")])
def test_no_full_size_temporary(tmp_path, tag, dtype):
    rows = 2048                                                         # (2048, 1024): 8 MiB as float32
    write_tensors(tmp_path / "big.safetensors", {"w": (tag, np.ones((rows, 1024), np.float32))})
    f = SafetensorsFile(tmp_path / "big.safetensors")
    out = np.empty((rows, 1024), dtype)
    tracemalloc.start()
    try:
        f.read_into("w", out)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert (out == 1).all()
    # one buffer of READ_PIECE_BYTES and, for BF16 into float64, its float32 widening: never the tensor's size
    assert peak <= 3 * safetensors.READ_PIECE_BYTES + 64 * 1024 < out.nbytes / 2, (peak, out.nbytes)
