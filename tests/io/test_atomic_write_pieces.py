"""write_atomic of a tuple of pieces (what a bfloat16 save writes: a new header, then the rest of another buffer
without joining the two): the pieces in order, and on a failure nothing written, the old file left as it was."""
import pytest

from tinygrad_ssm.io.atomic_write import write_atomic


def test_the_pieces_are_written_in_order(tmp_path):
    path = tmp_path / "f.bin"
    write_atomic(path, (b"ab", memoryview(b"xcd")[1:], bytearray(b"e")))
    assert path.read_bytes() == b"abcde"


def test_a_failing_piece_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "f.bin"
    write_atomic(path, b"old")
    with pytest.raises(TypeError):
        write_atomic(path, (b"new", 7))                                  # not bytes-like: write() refuses it
    assert path.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["f.bin"]
