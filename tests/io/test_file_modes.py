"""Files and folders the package writes (the loss plot too) get the modes `open()` and `mkdir` would give under the user's umask
(tempfile's private 0600/0700 are not kept, nor is a fixed 0644 forced on a user whose umask is 077); a file
written over another keeps that one's permission bits, as an overwrite in place would."""
import os
import stat

import numpy as np
import pytest

from tinygrad_ssm.io.atomic_write import new_temporary_folder, write_atomic
from tinygrad_ssm.io.safetensors import save_file

pytestmark = pytest.mark.skipif(os.name != "posix", reason="permission bits are POSIX")


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def umask():
    old = os.umask(0o022)

    def set_to(value):
        os.umask(value)
    yield set_to
    os.umask(old)


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o027])
def test_new_files_and_folders_follow_the_umask(tmp_path, umask, mask):
    umask(mask)
    save_file(tmp_path / "w.safetensors", {"w": np.zeros(2)})
    write_atomic(tmp_path / "n.json", "{}")
    folder = new_temporary_folder(tmp_path, "step-000001")
    assert mode(tmp_path / "w.safetensors") == mode(tmp_path / "n.json") == 0o666 & ~mask
    assert mode(folder) == 0o777 & ~mask


def test_a_replaced_file_keeps_its_permission_bits(tmp_path, umask):
    path = tmp_path / "w.safetensors"
    save_file(path, {"w": np.zeros(2)})
    os.chmod(path, 0o600)
    save_file(path, {"w": np.ones(2)})
    assert mode(path) == 0o600
    os.chmod(path, 0o640)
    write_atomic(path, b"text")
    assert mode(path) == 0o640


def test_a_checkpoint_follows_the_umask(tmp_path, umask):
    from tinygrad_ssm.train import checkpoint as ckpt
    from tests.support.models import small_model
    umask(0o077)
    moments = {"decay/state/w/exp_avg": np.zeros(3, np.float32)}
    folder = ckpt.save_checkpoint(tmp_path, 1, small_model(dtype="float32"), moments, {"tokens": 0, "run_id": "r"})
    assert mode(folder) == 0o700
    assert {mode(f) for f in folder.iterdir()} == {0o600}


def test_the_loss_plot_follows_the_umask_and_a_replaced_one_keeps_its_bits(tmp_path, umask):
    pytest.importorskip("matplotlib")
    from tinygrad_ssm.train.log import plot_curves
    umask(0o022)
    records = [{"step": 1, "train_bpb": 3.0}, {"step": 2, "train_bpb": 2.5, "val_bpb": 2.6}]
    path = plot_curves(records, tmp_path / "loss.png")
    assert mode(path) == 0o644  # not the temporary file's private 0600
    os.chmod(path, 0o640)
    plot_curves(records, path)
    assert mode(path) == 0o640


def test_a_pipe_or_device_at_the_path_is_refused_not_replaced(tmp_path):
    """The rename put a regular file in place of whatever was at the path: save_file("/dev/null", ...) run as root
    replaced the machine's /dev/null (found when a test did just that). A FIFO stands in for the device here."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for write in (lambda: write_atomic(fifo, b"x"), lambda: save_file(fifo, {"w": np.zeros(2)})):
        with pytest.raises(OSError, match="not a regular file"):
            write()
        assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]     # no temporary file left
