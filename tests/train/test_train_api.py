"""train() from Python at edges an audit found: two trainings of one process into one folder, a cfg passed with
resume (ignored), TrainConfig fields that count as given, NumPy numbers in a TrainConfig, the folder's lock after
train() raised, and a provenance field set by hand."""
import json
import threading

import numpy as np
import pytest

from tinygrad_ssm.train import cli
from tinygrad_ssm.train.config import TrainConfig
from tinygrad_ssm.train.loop import train
from tinygrad_ssm.train.run_folder import RunFolderError, lock_run_folder

from tests.support.training import TINY, quiet


def tiny(corpus, out, **kw):
    return TrainConfig(**{**TINY, "data": str(corpus), "out": str(out), "steps": 3, **kw})


def test_a_second_training_of_this_process_cannot_claim_a_folder_in_use(corpus, tmp_path):
    """A nested claim reused the lock: two threads trained into one folder, their log.jsonl records mixed and the
    marker's seed not the checkpoints'."""
    held = lock_run_folder(tmp_path / "lock")
    with pytest.raises(RunFolderError, match=r"is in use by another training in this process"):
        lock_run_folder(tmp_path / "lock")
    held.release()
    out, at_step_1, go_on = tmp_path / "run", threading.Event(), threading.Event()

    def hold_at_1(info):
        if info.step == 1:
            at_step_1.set()
            go_on.wait(120)
    first = threading.Thread(target=lambda: train(tiny(corpus, out), callback=hold_at_1, progress=False, say=quiet))
    first.start()
    try:
        assert at_step_1.wait(120)
        with pytest.raises(RunFolderError, match=r"is in use by another training in this process"):
            train(resume=str(out), progress=False, say=quiet)
    finally:
        go_on.set()
        first.join(120)
    assert [r["step"] for r in map(json.loads, (out / "log.jsonl").read_text().splitlines()) if "train_loss" in r] \
        == [1, 2, 3]                                                    # one run's records, once each


def test_a_cfg_given_with_resume_is_refused_not_ignored(corpus, tmp_path):
    """train(cfg, resume=run) went on with the saved settings, cfg's lr, steps and d_model never compared."""
    out = tmp_path / "run"
    train(tiny(corpus, out), stop_at=2, progress=False, say=quiet)
    with pytest.raises(ValueError, match=r"train\(cfg, resume=...\): .* overrides=\{field: value\}"):
        train(tiny(corpus, out, lr=0.1, steps=6), resume=str(out), progress=False, say=quiet)
    assert train(TrainConfig(), resume=str(out), progress=False, say=quiet).status == "done"   # the CLI's way


def test_fields_set_in_a_trainconfig_count_as_given(corpus, tmp_path):
    """A warmup longer than the run was shortened without a word, and val_fraction beside val_data dropped, where
    the same flags are refused."""
    val = tmp_path / "val.txt"
    val.write_text("validation text, validation text\n" * 20)
    for kw, message in ((dict(steps=4, warmup_steps=100), "--warmup-steps 100 is longer than the whole run"),
                        (dict(val_fraction=0.3, val_data=str(val)), "--val-fraction 0.3 splits --data")):
        with pytest.raises(ValueError, match=message):
            train(tiny(corpus, tmp_path / "run", **kw), progress=False, say=quiet)
        assert not (tmp_path / "run").exists()


def test_numpy_numbers_in_a_trainconfig_are_taken_as_pythons(corpus, tmp_path):
    """steps=np.int64(3) passed the checks, then failed writing the JSON marker, leaving an empty folder."""
    out = tmp_path / "run"
    result = train(tiny(corpus, out, steps=np.int64(3), lr=np.float32(0.004), data_seed=np.uint64(1)),
                   progress=False, say=quiet)
    assert result.status == "done" and result.step == 3
    saved = json.loads((out / "tinygrad_ssm_run.json").read_text())
    assert json.dumps(saved)                                           # (plain JSON numbers)


def test_the_folder_is_free_once_train_raised_and_provenance_is_not_taken_from_the_caller(corpus, tmp_path):
    """The lock stayed held while the exception was (a notebook keeps it): `train --resume` elsewhere was refused;
    init_from_sha256 given by hand was recorded as the run's provenance."""
    out = tmp_path / "run"

    def fail_at_2(info):
        if info.step == 2:
            raise RuntimeError("stop here")
    with pytest.raises(RuntimeError, match="stop here") as kept:
        train(tiny(corpus, out, init_from_sha256={"x": "junk"}), callback=fail_at_2, progress=False, say=quiet)
    assert kept.value is not None
    assert cli.main(["train", "--resume", str(out), "--no-progress"]) == cli.EXIT_OK
    saved = json.loads((out / "tinygrad_ssm_run.json").read_text())
    assert saved["train_config"]["init_from_sha256"] is None, saved


def test_out_may_be_a_path_as_data_may(corpus, tmp_path):
    """out=Path(...) was refused as 'not a string' where data, val_data and init_from take a Path."""
    cfg = tiny(corpus, tmp_path / "run")
    cfg.out, cfg.data = tmp_path / "run", corpus
    assert train(cfg, progress=False, say=quiet).status == "done"
    assert isinstance(cfg.out, type(tmp_path))                         # the caller's cfg as it was
    assert train(resume=str(tmp_path / "run"), overrides={"out": tmp_path / "on", "steps": 4}, progress=False,
                 say=quiet).status == "done"
    assert (tmp_path / "on" / "checkpoints" / "LATEST").is_file()


def test_the_result_says_at_which_step_its_val_bpb_was_measured(corpus, tmp_path):
    """TrainResult gave val_bpb without its step: a run stopped at step 3 held step 2's validation as if of 3."""
    out = tmp_path / "run"
    stopped = train(tiny(corpus, out, steps=4, eval_every=2), stop_at=3, progress=False, say=quiet)
    assert (stopped.status, stopped.step, stopped.val_step) == ("stopped", 3, 2) and stopped.val_bpb is not None
    done = train(resume=str(out), progress=False, say=quiet)
    assert (done.status, done.step, done.val_step) == ("done", 4, 4)
    logged = [r for r in map(json.loads, (out / "log.jsonl").read_text().splitlines()) if "val_bpb" in r]
    assert [(r["step"], r["val_bpb"]) for r in logged][-1] == (4, done.val_bpb)
