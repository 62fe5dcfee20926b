"""Safetensors headers that used to pass validation and give wrong or absurd results now fail, naming the file
and the tensor: a key written twice, shapes whose element count overflows 64 bits, sizes that are not integers;
and a FIFO in place of the file fails at once instead of blocking the read."""
import json
import os
import struct
import threading

import numpy as np
import pytest

from tinygrad_ssm.io.safetensors import CheckpointError, SafetensorsFile, load_file, save_file


def write_header(path, header_text: str, data: bytes = b""):
    blob = header_text.encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + data)


def test_a_key_written_twice_is_refused(tmp_path):
    # JSON keeps the last of two equal keys, so the first tensor's bytes would be silently skipped
    path = tmp_path / "dup.safetensors"
    entry_a = '{"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}'
    entry_b = '{"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}'
    write_header(path, f'{{"w": {entry_a}, "w": {entry_b}}}', np.array([1, 2], "<f4").tobytes())
    with pytest.raises(CheckpointError, match=r"dup\.safetensors.*'w' twice"):
        SafetensorsFile(path)
    write_header(path, f'{{"w": {entry_a}, "v": {entry_b}}}', np.array([1, 2], "<f4").tobytes())
    assert load_file(path)["w"].tolist() == [1.0]  # the same file without the duplicate reads


@pytest.mark.parametrize("shape,offsets", [
    ([2 ** 32, 2 ** 32], [0, 0]),          # 2**64 elements: wrapped to 0 in int64, matching empty offsets
    ([2 ** 33, 2 ** 31], [0, 0]),
    ([2 ** 62, 4], [0, 0]),
])
def test_element_counts_that_overflow_are_refused(tmp_path, shape, offsets):
    path = tmp_path / "big.safetensors"
    write_header(path, json.dumps({"w": {"dtype": "F32", "shape": shape, "data_offsets": offsets}}))
    with pytest.raises(CheckpointError, match=r"big\.safetensors.*'w'.*needs \d+ bytes"):
        SafetensorsFile(path)


@pytest.mark.parametrize("shape,offsets", [([True, 2], [0, 8]), ([2.0], [0, 8]), (["2"], [0, 8]),
                                           ([2], [0.0, 8]), ([2], [False, 8]), ([-1], [0, 0])])
def test_shapes_and_offsets_must_be_integers(tmp_path, shape, offsets):
    path = tmp_path / "types.safetensors"
    write_header(path, json.dumps({"w": {"dtype": "F32", "shape": shape, "data_offsets": offsets}}), bytes(8))
    with pytest.raises(CheckpointError, match=r"types\.safetensors.*'w'.*integers >= 0"):
        SafetensorsFile(path)


def test_an_unhashable_dtype_is_named(tmp_path):
    path = tmp_path / "dtype.safetensors"
    write_header(path, json.dumps({"w": {"dtype": ["F32"], "shape": [1], "data_offsets": [0, 4]}}), bytes(4))
    with pytest.raises(CheckpointError, match="'w' has dtype"):
        SafetensorsFile(path)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes need POSIX")
def test_a_fifo_in_place_of_the_file_fails_at_once(tmp_path):
    path = tmp_path / "model.safetensors"
    os.mkfifo(path)
    result = {}

    def load():
        try:
            load_file(path)
        except CheckpointError as e:
            result["error"] = str(e)

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    worker.join(timeout=20)
    if worker.is_alive():  # unblock the reader so the test process can end, then fail
        with open(path, "wb"):
            pass
        pytest.fail("load_file blocked on a FIFO")
    assert "named pipe" in result["error"] and "model.safetensors" in result["error"]


def test_round_trip_still_reads(tmp_path):
    path = tmp_path / "ok.safetensors"
    save_file(path, {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.zeros((0, 4), np.float32)})
    out = load_file(path)
    assert out["a"].tolist() == [[0, 1, 2], [3, 4, 5]] and out["b"].shape == (0, 4)


def test_a_git_lfs_pointer_in_place_of_the_weights_is_named_with_the_fix(tmp_path):
    """`git clone` of a model repository without git-lfs leaves a ~130-byte text where model.safetensors should be:
    its first 8 bytes read as a header length of 2.3e17 ("over the format's limit"), which named no cause."""
    path = tmp_path / "model.safetensors"
    path.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:" + "ab" * 32 + "\nsize 516000000\n")
    with pytest.raises(CheckpointError, match=r"not a valid safetensors file: it is a Git LFS pointer, not the file "
                                              r".*git lfs pull"):
        SafetensorsFile(path)
    save_file(tmp_path / "short.safetensors", {})                       # a file shorter than the pointer's mark
    with SafetensorsFile(tmp_path / "short.safetensors") as f:
        assert f.tensors == {}
