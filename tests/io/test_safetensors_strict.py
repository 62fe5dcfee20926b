"""Safetensors files are read as strictly as the library reads them, and read from the file that was opened:
the data section covered exactly, metadata a map of strings, the header's length limit named, a key given
twice inside one entry named with its tensor; a dtype NumPy cannot hold refused only when that tensor is read;
a file replaced at its path after it was opened still read as opened; a conversion that would overflow refused;
and `save_file` refusing what no reader could read back."""
import json
import re
import struct

import numpy as np
import pytest

from tinygrad_ssm.io.safetensors import MAX_HEADER_BYTES, CheckpointError, SafetensorsFile, load_file, save_file


def write_header(path, header, data: bytes = b""):
    blob = (header if isinstance(header, str) else json.dumps(header)).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + data)


def entry(tag, shape, begin, end):
    return {"dtype": tag, "shape": shape, "data_offsets": [begin, end]}


@pytest.mark.parametrize("header,data,message", [
    ({"a": entry("F32", [1], 0, 4)}, bytes(8), r"4 bytes follow the last tensor's data"),
    ({"a": entry("F32", [1], 0, 4), "b": entry("F32", [1], 8, 12)}, bytes(12), r"data bytes 4\.\.8 belong to no tensor"),
    ({}, bytes(4), r"4 bytes follow the last tensor's data"),
    ({"a": entry("F32", [1], 4, 8)}, bytes(8), r"data bytes 0\.\.4 belong to no tensor \(a gap before 'a'\)"),
    ({"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 4, 12)}, bytes(12), r"tensors 'a' and 'b' overlap"),
    ({"a": entry("F32", [2], 0, 8), "b": entry("F32", [1], 7, 11)}, bytes(11), r"tensors 'a' and 'b' overlap"),
])
def test_data_not_covered_exactly_is_refused_as_by_the_library(tmp_path, header, data, message):
    path = tmp_path / "gap.safetensors"
    write_header(path, header, data)
    with pytest.raises(CheckpointError, match=r"gap\.safetensors.*" + message):
        SafetensorsFile(path)
    safetensors = pytest.importorskip("safetensors.numpy")
    with pytest.raises(Exception):  # the library refuses the same file
        safetensors.load_file(str(path))


@pytest.mark.parametrize("metadata", [[], 0, "", {"k": 1}])
def test_metadata_must_be_a_map_of_strings(tmp_path, metadata):
    path = tmp_path / "meta.safetensors"
    write_header(path, {"__metadata__": metadata, "a": entry("F32", [1], 0, 4)}, bytes(4))
    with pytest.raises(CheckpointError, match="__metadata__ must map strings to strings"):
        SafetensorsFile(path)


def test_null_metadata_reads_as_none_given(tmp_path):
    path = tmp_path / "meta.safetensors"
    write_header(path, {"__metadata__": None, "a": entry("F32", [1], 0, 4)}, bytes(4))
    assert SafetensorsFile(path).metadata == {}


def test_a_header_over_the_limit_is_named_as_such(tmp_path):
    path = tmp_path / "huge.safetensors"
    path.write_bytes(struct.pack("<Q", MAX_HEADER_BYTES + 1) + b"{}")
    with pytest.raises(CheckpointError, match=r"over the format's limit of 100,000,000"):
        SafetensorsFile(path)
    assert MAX_HEADER_BYTES == 100_000_000  # safetensors' own MAX_HEADER_SIZE


def test_a_field_given_twice_inside_an_entry_names_the_tensor(tmp_path):
    path = tmp_path / "dup.safetensors"
    write_header(path, '{"w": {"dtype": "F32", "dtype": "F16", "shape": [1], "data_offsets": [0, 4]}}', bytes(4))
    with pytest.raises(CheckpointError, match=r"entry 'w' gives 'dtype' twice"):
        SafetensorsFile(path)
    write_header(path, '{"__metadata__": {"k": "a", "k": "b"}}')
    with pytest.raises(CheckpointError, match=r"__metadata__ names 'k' twice"):
        SafetensorsFile(path)


@pytest.mark.parametrize("tag,size", [("F8_E4M3", 1), ("F8_E5M2", 1), ("F8_E4M3FNUZ", 1), ("F8_E5M2FNUZ", 1),
                                      ("C64", 8)])   # the FNUZ ones (safetensors 0.8's torch API) made the file refused
def test_a_dtype_numpy_cannot_hold_fails_only_when_read(tmp_path, tag, size):
    path = tmp_path / "mixed.safetensors"
    weight = np.arange(3, dtype="<f4")
    write_header(path, {"w": entry("F32", [3], 0, 12), "q": entry(tag, [2], 12, 12 + 2 * size)},
                 weight.tobytes() + bytes(2 * size))
    stored = SafetensorsFile(path)
    assert stored.read("w").tolist() == [0, 1, 2]
    assert stored.info("q").not_float_reason() == f"stored dtype {tag} cannot be read (the float dtypes read: " \
                                                  f"F64, F32, F16, BF16)"
    with pytest.raises(CheckpointError, match=f"mixed.safetensors.*'q' has dtype {tag}, which NumPy cannot hold"):
        stored.read("q")


def test_a_file_replaced_after_it_was_opened_is_read_as_opened(tmp_path):
    path = tmp_path / "ckpt.safetensors"
    save_file(path, {"w": np.arange(4, dtype=np.float32)})
    stored = SafetensorsFile(path)
    save_file(path, {"w": np.arange(100, 104, dtype=np.float32)}, metadata={"step": "2"})  # atomically replaced
    assert stored.read("w").tolist() == [0, 1, 2, 3]       # the bytes of the file whose header was validated
    assert load_file(path)["w"].tolist() == [100, 101, 102, 103]
    path.unlink()                                            # moved away: what was opened is still read
    assert stored.read_rows("w", 1, 3).tolist() == [1, 2]
    stored.close()
    with pytest.raises(ValueError, match=r"ckpt\.safetensors' was closed"):
        stored.read("w")


def test_a_conversion_past_the_dtypes_range_is_refused(tmp_path):
    path = tmp_path / "wide.safetensors"
    save_file(path, {"w": np.array([1.0, 1e300, np.inf]), "h": np.array([70000.0], np.float32)})
    stored = SafetensorsFile(path)
    with pytest.raises(CheckpointError, match=r"wide\.safetensors.*'w' holds 1e\+300, beyond the range of float32"):
        stored.read("w", np.float32)
    with pytest.raises(CheckpointError, match=r"'h' holds 70000\.0, beyond the range of float16"):
        stored.read("h", np.float16)
    assert stored.read("w", np.float64)[1] == 1e300         # a stored infinity is a value, read as it is
    save_file(path, {"w": np.array([np.inf, -np.inf, 1.0])})
    assert SafetensorsFile(path).read("w", np.float32).tolist() == [np.inf, -np.inf, 1.0]


@pytest.mark.parametrize("array", [np.zeros(2, np.complex64), np.array(["a", "b"]), np.zeros(2, object),
                                   np.zeros(2, "datetime64[s]")])
def test_save_refuses_a_dtype_no_reader_reads_back(tmp_path, array):
    path = tmp_path / "out.safetensors"
    with pytest.raises(TypeError, match=rf"out\.safetensors.*tensor 'x' has dtype {re.escape(str(array.dtype))}"):
        save_file(path, {"x": array})
    assert not path.exists()


def test_save_refuses_the_reserved_name_and_metadata_that_is_not_a_dict(tmp_path):
    path = tmp_path / "out.safetensors"
    with pytest.raises(ValueError, match="may not be named '__metadata__'"):
        save_file(path, {"__metadata__": np.zeros(2)})
    with pytest.raises(TypeError, match=r"metadata must be a dict of str -> str, got list"):
        save_file(path, {"x": np.zeros(2)}, metadata=[("a", "b")])
    assert not path.exists()
    save_file(path, {"x": np.zeros(2, ">f8"), "b": np.ones(3, bool)})  # big-endian and bool are held
    assert load_file(path)["b"].tolist() == [True] * 3
