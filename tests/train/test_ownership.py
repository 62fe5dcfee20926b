"""Nothing of the user's is touched (issue 24, classes 1 and 2).

A folder is a run folder of ours only when it holds the marker a run writes, atomically, when it creates the
folder: files merely named like ours (a user's log.jsonl, loss.png, run.lock, checkpoints/step-000001/) do not
make it one, and a new run refuses it, naming the folder and --out. Pruning deletes only checkpoints of this
run family. Nothing the package writes follows a symbolic link: run.lock, the log, the plot, their temporary
files, the checkpoints folder."""
import json
import os
import shutil

import numpy as np
import pytest

from tinygrad_ssm.io.safetensors import load_file, save_file
from tinygrad_ssm.train import checkpoint as ckpt
from tinygrad_ssm.train import cli
from tinygrad_ssm.train.loop import train
from tinygrad_ssm.train.run_folder import MARKER_FILE, RunFolderError, claim_run_folder, lock_run_folder

from tests.support.models import small_model
from tests.support.training import TINY, forget_digest, quiet, snapshot

FLAGS = [f for k, v in TINY.items() for f in (f"--{k.replace('_', '-')}", str(v))]


def new_run(corpus, out, *extra):
    return cli.main(["train", "--data", str(corpus), "--out", str(out), "--steps", "2", "--no-progress",
                     "--keep-checkpoints", "1", *FLAGS, *extra])


LONE = {
    "log.jsonl": b'{"step": 1, "note": "my own experiment log"}\n',
    "loss.png": b"\x89PNG my figure",
    "run.lock": b"my lock file, with content\n",
    "checkpoints/step-000001/notes.txt": b"my checkpoint",
}


@pytest.mark.parametrize("name", sorted(LONE))
def test_a_folder_holding_only_files_named_like_ours_is_refused(corpus, tmp_path, capsys, name):
    folder = tmp_path / "mine"
    (folder / name).parent.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(LONE[name])
    before = snapshot(folder)
    assert new_run(corpus, folder) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert str(folder) in err and "--out" in err and "not a run folder" in err
    assert snapshot(folder) == before  # nothing written, truncated, replaced or pruned


def test_a_new_run_writes_the_marker_with_its_settings(corpus, tmp_path):
    out = tmp_path / "fresh"
    assert new_run(corpus, out) == cli.EXIT_OK
    marker = json.loads((out / MARKER_FILE).read_text())
    assert marker["format"] == "tinygrad_ssm run folder" and len(marker["run_id"]) == 32
    assert marker["train_config"]["d_model"] == TINY["d_model"]
    state = json.loads((out / "checkpoints" / "step-000002" / "trainer_state.json").read_text())
    assert state["run_id"] == marker["run_id"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert new_run(corpus, empty) == cli.EXIT_OK and (empty / MARKER_FILE).is_file()


def test_pruning_deletes_only_checkpoints_of_this_run(run, corpus, tmp_path):
    """A checkpoint folder of another run (or the user's) beside ours is never pruned, even when older."""
    root = run / "checkpoints"
    users = root / "step-000000"
    users.mkdir()
    (users / "notes.txt").write_text("mine")
    other = tmp_path / "other"  # a whole checkpoint of another run, copied in by the user
    assert new_run(corpus, other) == cli.EXIT_OK
    foreign = root / "step-000005"
    shutil.copytree(other / "checkpoints" / "step-000002", foreign)
    before = {p: snapshot(p) for p in (users, foreign)}
    result = train(resume=str(run), overrides={"keep_checkpoints": 1}, progress=False, say=quiet)
    assert result.status == "done" and result.step == 3
    assert {p: snapshot(p) for p in (users, foreign)} == before
    assert not (root / "step-000001").exists() and not (root / "step-000002").exists()  # ours: pruned
    assert (root / "step-000003").is_dir()


def test_a_checkpoint_holding_what_its_save_did_not_write_is_neither_pruned_nor_written_again(run, capsys):
    """`export --out RUN/checkpoints/step-000001/hf` (accepted) and a user's file put into a checkpoint: pruning
    deleted the checkpoint with them, and a resume from an older checkpoint rewrote the step, the folder with it
    (found by a fuzz of the command line). Both leave such a checkpoint as it is."""
    root = run / "checkpoints"
    assert cli.main(["export", "--model", str(root / "step-000001"), "--out", str(root / "step-000001" / "hf")]) == 0
    (root / "step-000002" / "notes.txt").write_text("mine")
    before = {name: snapshot(root / name) for name in ("step-000001", "step-000002")}
    assert cli.main(["train", "--resume", str(root / "step-000001"), "--no-progress"]) == cli.EXIT_USAGE
    assert "step-000002' (a checkpoint of this run, to be written again) holds what the run did not write: " \
           "notes.txt" in capsys.readouterr().err
    (root / "step-000002" / "notes.txt").unlink()
    result = train(resume=str(run), overrides={"keep_checkpoints": 1}, progress=False, say=quiet)
    assert result.status == "done" and result.step == 3
    assert snapshot(root / "step-000001") == before["step-000001"]           # kept, the export inside it too
    assert not (root / "step-000002").exists() and (root / "step-000003").is_dir()   # ours alone: pruned


def test_a_new_run_reuses_a_folder_of_ours_stopped_before_its_first_checkpoint(corpus, tmp_path):
    out = tmp_path / "run"
    claim_run_folder(out).release()  # what a run does first: the folder, its marker and lock
    run_id = json.loads((out / MARKER_FILE).read_text())["run_id"]
    (out / "log.jsonl").write_text('{"step": 1, "train_loss": 9.0}\n')
    assert new_run(corpus, out) == cli.EXIT_OK
    assert json.loads((out / MARKER_FILE).read_text())["run_id"] == run_id


@pytest.mark.parametrize("marker", ["not json", '{"format": "something else"}', '[1]'])
def test_a_damaged_or_foreign_marker_is_refused(corpus, tmp_path, capsys, marker):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / MARKER_FILE).write_text(marker)
    (folder / "log.jsonl").write_bytes(LONE["log.jsonl"])
    before = snapshot(folder)
    assert new_run(corpus, folder) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert str(folder) in err and MARKER_FILE in err and "--out" in err
    assert snapshot(folder) == before


# --- symbolic links (class 2) ----------------------------------------------------------------------------
@pytest.fixture
def target(tmp_path):
    """A file of the user's outside the run folder, that a link in the run folder points at."""
    path = tmp_path / "precious.txt"
    path.write_bytes(b"the user's file\n")
    return path


def test_a_run_lock_that_is_a_symlink_is_refused_and_its_target_untouched(run, corpus, tmp_path, target, capsys):
    (run / "run.lock").unlink()
    (run / "run.lock").symlink_to(target)
    assert cli.main(["train", "--resume", str(run), "--no-progress"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "run.lock" in err and "symbolic link" in err and str(run) in err
    assert target.read_bytes() == b"the user's file\n"
    with pytest.raises(RunFolderError, match="symbolic link"):
        lock_run_folder(run)
    assert target.read_bytes() == b"the user's file\n"
    fresh = tmp_path / "fresh"  # a folder of ours, stopped before a checkpoint, whose lock became a link
    claim_run_folder(fresh).release()
    (fresh / "run.lock").unlink()
    (fresh / "run.lock").symlink_to(target)
    assert new_run(corpus, fresh) == cli.EXIT_USAGE
    assert target.read_bytes() == b"the user's file\n"


@pytest.mark.parametrize("name", ["loss.png.tmp.png", "log.jsonl", "loss.png", "checkpoints/LATEST",
                                  "checkpoints"])
def test_no_write_follows_a_symlink_out_of_the_run_folder(run, target, tmp_path, name):
    """Each of the names the package writes (and the fixed temporary name it used to use) made a link to a
    file outside: the run either refuses or replaces the link itself; the target is never written."""
    link = run / name
    if name == "checkpoints":  # the whole folder elsewhere: writing checkpoints there writes outside
        elsewhere = tmp_path / "elsewhere"
        shutil.move(str(link), str(elsewhere))
        link.symlink_to(elsewhere, target_is_directory=True)
        guarded = elsewhere
    else:
        if link.exists() or link.is_symlink():
            link.unlink()
        link.symlink_to(target)
        guarded = target
    before = snapshot(guarded) if guarded.is_dir() else guarded.read_bytes()
    try:
        train(resume=str(run), progress=False, say=quiet)
    except (RunFolderError, FileNotFoundError, ValueError) as e:
        assert "symbolic link" in str(e) or "does not exist" in str(e) or "not the name" in str(e), e
    assert (snapshot(guarded) if guarded.is_dir() else guarded.read_bytes()) == before



def test_save_checkpoint_itself_refuses_a_checkpoints_folder_that_is_a_link(tmp_path):
    """The claim of the run folder refuses a linked checkpoints/ (above); save_checkpoint checks again as it
    writes (a link made since, a caller of the library): nothing is written into the folder the link leads to."""
    elsewhere, run = tmp_path / "elsewhere", tmp_path / "run"
    elsewhere.mkdir()
    run.mkdir()
    (run / "checkpoints").symlink_to(elsewhere, target_is_directory=True)
    moments = {"decay/state/w/exp_avg": np.zeros(3, np.float32), "decay/state/w/exp_avg_sq": np.ones(3, np.float32)}
    with pytest.raises(ckpt.CheckpointWriteRefused, match="checkpoints' is a symbolic link"):
        ckpt.save_checkpoint(run, 1, small_model(dtype="float32"), moments, {"tokens": 0, "run_id": "abc"})
    assert list(elsewhere.iterdir()) == []

@pytest.mark.parametrize("where", ["a checkpoints folder of the user's", "a plain folder"])
def test_resuming_a_checkpoint_copied_out_of_its_run_writes_nothing_of_the_users(run, tmp_path, capsys, where):
    """The folder around a copied checkpoint became the run folder: its loss.png, log.jsonl, run.lock and LATEST
    were overwritten and a marker written, though no marker proved it a run's."""
    mine = tmp_path / "proj"
    checkpoint = (mine / "checkpoints" / "best") if where.startswith("a checkpoints") else mine / "model"
    shutil.copytree(run / "checkpoints" / "step-000002", checkpoint)
    (mine / "loss.png").write_text("MY PLOT")
    (mine / "log.jsonl").write_text('{"step": 9, "note": "keep me"}\n')
    before = snapshot(mine)
    assert cli.main(["train", "--resume", str(checkpoint), "--steps", "3", "--no-progress"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "has no tinygrad_ssm_run.json, the file that proves a folder is a run" in err and "--init-from" in err
    assert snapshot(mine) == before
    # the fix the message gives: the same --resume into a new folder
    assert cli.main(["train", "--resume", str(checkpoint), "--out", str(tmp_path / "new"), "--steps", "3",
                     "--no-progress"]) == 0
    assert (tmp_path / "new" / "checkpoints" / "step-000003").is_dir() and snapshot(mine) == before


def test_a_checkpoint_without_latest_is_named_and_never_overwritten_by_a_new_run(run, corpus, capsys):
    """A full disk at the LATEST write left a complete checkpoint without its pointer: --resume said there was
    no checkpoint, and a new run in the folder took the checkpoint for its own, rewrote it and pruned it."""
    (run / "checkpoints" / "LATEST").unlink()
    before = snapshot(run / "checkpoints")
    assert cli.main(["train", "--resume", str(run), "--no-progress"]) == cli.EXIT_USAGE
    assert f"holds the checkpoint folders ['step-000001', 'step-000002']: give one of them, e.g. " \
           f"'{run / 'checkpoints' / 'step-000002'}'" in capsys.readouterr().err
    assert new_run(corpus, run, "--seed", "5") == cli.EXIT_USAGE
    assert f"continue it with --resume {run / 'checkpoints' / 'step-000002'}" in capsys.readouterr().err
    assert snapshot(run / "checkpoints") == before
    assert cli.main(["train", "--resume", str(run / "checkpoints" / "step-000002"), "--no-progress"]) == cli.EXIT_OK


@pytest.mark.parametrize("step", [1, 3])
def test_a_checkpoint_whose_counters_disagree_is_refused(run, capsys, step):
    """trainer_state's step edited to 1 in step-000002: it resumed "at step 1", rewrote the checkpoint it came
    from and then pruned it. A step past the folder's name and the sampler's batches disagrees as much."""
    state_file = run / "checkpoints" / "step-000002" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    state_file.write_text(json.dumps({**state, "step": step}))
    before = snapshot(run)
    assert cli.main(["train", "--resume", str(run), "--no-progress"]) == cli.EXIT_USAGE
    assert f"its 'step' is {step}, but the folder's name says 2, the sampler's batches_drawn says 2" in \
        capsys.readouterr().err
    assert snapshot(run) == before


def test_an_optimizer_file_of_another_step_is_refused(run, capsys):
    shutil.copyfile(run / "checkpoints" / "step-000001" / "optimizer.safetensors",
                    run / "checkpoints" / "step-000002" / "optimizer.safetensors")
    forget_digest(run / "checkpoints" / "step-000002", "optimizer.safetensors")   # the step counts checked
    log_before = (run / "log.jsonl").read_bytes()
    assert cli.main(["train", "--resume", str(run), "--no-progress"]) == cli.EXIT_USAGE
    assert "does not belong to step 2: its parameters' step counts are [1]" in capsys.readouterr().err
    assert (run / "log.jsonl").read_bytes() == log_before


def test_a_fifo_in_place_of_the_log_is_refused_not_waited_on(run, capsys):
    (run / "log.jsonl").unlink()
    os.mkfifo(run / "log.jsonl")
    assert cli.main(["train", "--resume", str(run), "--no-progress"]) == cli.EXIT_USAGE  # it blocked for ever
    assert "log.jsonl' is not a regular file as a run makes it" in capsys.readouterr().err


def test_a_run_lock_hard_linked_to_a_users_file_is_refused_and_the_file_untouched(tmp_path, target):
    out = tmp_path / "run"
    out.mkdir()
    os.link(target, out / "run.lock")  # a second name of the user's file: writing the pid would truncate it
    with pytest.raises(RunFolderError, match="not a lock file of ours"):
        lock_run_folder(out)
    assert target.read_bytes() == b"the user's file\n"


def test_pruning_keeps_the_newest_by_step_number_past_six_digits(tmp_path):
    """step-1000000 is newer than step-999999 though it sorts before it as a name: pruning counts steps."""
    root = tmp_path / "run" / "checkpoints"
    for step in (999998, 999999, 1000000):
        folder = root / f"step-{step:06d}"
        folder.mkdir(parents=True)
        (folder / ckpt.STATE_FILE).write_text(json.dumps({"run_id": "ours"}))
    ckpt._prune(root, 2, current="step-1000000", run_id="ours")
    assert sorted(p.name for p in root.iterdir()) == ["step-1000000", "step-999999"]


def test_an_optimizer_file_whose_moments_do_not_fit_names_the_file(run, capsys):
    """A moment of another shape or an unexpected key was refused naming the key alone ('decay/state/...'), not
    the file it came from."""
    moments_file = run / "checkpoints" / "step-000002" / "optimizer.safetensors"
    moments = load_file(moments_file)
    key = sorted(k for k in moments if k.endswith("/exp_avg") and moments[k].ndim == 2)[0]
    moments[key] = moments[key][:, :-1].copy()
    save_file(moments_file, moments)
    forget_digest(moments_file.parent, moments_file.name)   # its values checked, not its bytes
    log_before = (run / "log.jsonl").read_bytes()
    assert cli.main(["train", "--resume", str(run), "--no-progress"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert f"{str(moments_file)!r} does not fit this run's optimizers" in err and key.split("/", 1)[1] in err, err
    assert (run / "log.jsonl").read_bytes() == log_before
