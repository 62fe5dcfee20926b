"""io/file_checks.py: a path is checked to be a regular file before it is opened (a FIFO would block the read
forever), and a missing one is a FileNotFoundError whatever error the caller names for the wrong kinds."""
import os

import pytest

from tinygrad_ssm.io.checkpoints import CheckpointNotFound
from tinygrad_ssm.io.file_checks import require_regular_file


class Refused(ValueError):
    pass


def test_a_regular_file_or_a_link_to_one_passes_with_its_size(tmp_path):
    (tmp_path / "f").write_bytes(b"12345")
    (tmp_path / "link").symlink_to(tmp_path / "f")
    assert require_regular_file(tmp_path / "f", "data", Refused) == 5
    assert require_regular_file(tmp_path / "link", "data", Refused) == 5


def test_a_missing_file_is_a_file_not_found_error_of_the_callers_kind_where_it_is_one(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"^data '.*nothing' does not exist$") as error:
        require_regular_file(tmp_path / "nothing", "data", Refused)
    assert not isinstance(error.value, Refused)          # a ValueError would be taken for a bad file, not a gone one
    with pytest.raises(CheckpointNotFound, match="checkpoint file '.*nothing' does not exist"):
        require_regular_file(tmp_path / "nothing", "checkpoint file", CheckpointNotFound)
    (tmp_path / "dangling").symlink_to(tmp_path / "nothing")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        require_regular_file(tmp_path / "dangling", "data", Refused)


def test_a_folder_or_a_fifo_is_refused_with_the_callers_error_naming_its_kind(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(Refused, match=r"data '.*pipe' is a named pipe \(FIFO\), not a regular file"):
        require_regular_file(tmp_path / "pipe", "data", Refused)
    with pytest.raises(Refused, match=r"data '.*' is a folder, not a regular file"):
        require_regular_file(tmp_path, "data", Refused)
