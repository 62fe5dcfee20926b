"""A reader of a run folder (from_pretrained, generate, eval) while the run saves beside it: with
--keep-checkpoints 1 the save prunes the checkpoint LATEST named when the reader began, and the reader failed
saying that checkpoint was missing or incomplete (44 of 7,499 loads in a tight loop beside a training run, found by
an audit of the run folders). The reader now starts again from the checkpoint LATEST names after the save."""
import shutil

import numpy as np
import pytest

from tinygrad_ssm import Mamba2LMHeadModel
from tinygrad_ssm.models.mamba2 import quantized_files
from tinygrad_ssm.train.generate import load_model


def _save_during_the_first_read(monkeypatch, run, tmp_path):
    """The first load of a checkpoint's weights finds them pruned by a save that moved LATEST on (to step-000001,
    standing in for the new checkpoint)."""
    real = quantized_files.load_pretrained
    calls = []

    def pruned_while_read(cls, folder, **kwargs):
        calls.append(folder.name)
        if len(calls) == 1:
            (run / "checkpoints" / "LATEST").write_text("step-000001\n")
            shutil.move(run / "checkpoints" / "step-000002", tmp_path / "pruned")
        return real(cls, folder, **kwargs)

    monkeypatch.setattr(quantized_files, "load_pretrained", pruned_while_read)
    return calls


def _weights(model):
    return {name: t.data for name, t in model.varmap.named_vars()}


@pytest.mark.parametrize("reader", ["from_pretrained", "load_model"])
def test_a_run_folder_is_read_again_from_its_new_latest(run, tmp_path, monkeypatch, reader):
    expected = _weights(Mamba2LMHeadModel.from_pretrained(run / "checkpoints" / "step-000001"))
    calls = _save_during_the_first_read(monkeypatch, run, tmp_path)
    model = Mamba2LMHeadModel.from_pretrained(run) if reader == "from_pretrained" else load_model(run)[0]
    assert calls == ["step-000002", "step-000001"]
    got = _weights(model)
    assert got.keys() == expected.keys() and all(np.array_equal(got[k], expected[k]) for k in got)


def test_a_checkpoint_named_itself_is_read_once(run, tmp_path, monkeypatch):
    """The one asked for is gone: that is the error, not another checkpoint."""
    calls = _save_during_the_first_read(monkeypatch, run, tmp_path)
    with pytest.raises(FileNotFoundError):
        Mamba2LMHeadModel.from_pretrained(run / "checkpoints" / "step-000002")
    assert calls == ["step-000002"]


def test_read_newest_tries_a_run_again_only_while_its_latest_moves(tmp_path):
    """Counted on read_newest's own calls of `read` (the test above counts loads, which a retry of a folder that is
    gone never reaches): a checkpoint named itself, or a run whose LATEST stays, is read once; a run whose LATEST
    moves during the read is read again, up to `attempts` times."""
    from tinygrad_ssm.io.checkpoints import read_newest
    root = tmp_path / "run" / "checkpoints"
    (root / "step-000001").mkdir(parents=True)
    latest = root / "LATEST"
    latest.write_text("step-000001\n")
    calls, saves = [], iter(range(2, 100))

    def fails(path, move=False):
        calls.append(path)
        if move:                                                        # a save meanwhile: LATEST names a newer one
            latest.write_text(f"step-{next(saves):06d}\n")
        raise FileNotFoundError("gone")
    for path, move, reads in ((root / "step-000001", True, 1), (root.parent, False, 1), (root.parent, True, 3)):
        calls.clear()
        with pytest.raises(FileNotFoundError):
            read_newest(path, lambda p: fails(p, move))
        assert len(calls) == reads, (path, move)
