"""A crash at any moment leaves LATEST naming a complete checkpoint, and the run's own leftovers never block it.

A kill -9 is simulated by raising a BaseException (not an Exception: nothing catches it) at the moment the
real program would die: between two renames of a checkpoint swap, inside the rmtree of a pruned checkpoint,
before the marker is linked into place. What such a crash leaves (hidden temporary folders and files named by
io/atomic_write.py) is removed by the next run that claims the folder, and only that: a folder of the user's
named like one but holding other files stays."""
import json
import os
import shutil
import types

import numpy as np
import pytest

from tinygrad_ssm.io.checkpoints import resolve_checkpoint
from tinygrad_ssm.train import checkpoint as ckpt
from tinygrad_ssm.train import cli
from tinygrad_ssm.train.loop import train

from tests.support.models import small_model
from tests.support.training import TINY, quiet, snapshot

FLAGS = [f for k, v in TINY.items() for f in (f"--{k.replace('_', '-')}", str(v))]
MOMENTS = {"decay/state/w/exp_avg": np.zeros(3, np.float32), "decay/state/w/exp_avg_sq": np.ones(3, np.float32)}


class Killed(BaseException):
    """The process dies here (kill -9, power loss): nothing after it runs, no handler catches it."""


def proxy(module, **replaced):
    """A stand-in for `module` (os, shutil) in checkpoint.py's namespace with some of its functions replaced."""
    return types.SimpleNamespace(**{**{k: getattr(module, k) for k in dir(module) if not k.startswith("__")},
                                    **replaced})


def test_a_kill_between_the_renames_of_a_rewritten_checkpoint_leaves_latest_on_a_complete_one(run, monkeypatch):
    """Resumed from step-000001, the run writes step-000002 again: the old folder is renamed away, then the new
    one into its name. Killed between the two, LATEST (which named step-000002) names step-000001, which a
    resume accepts; the resume then goes on to the end."""
    assert (run / "checkpoints" / "LATEST").read_text().strip() == "step-000002"
    calls = []

    def replace(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:                      # the second rename: the new checkpoint into step-000002's name
            raise Killed()
        os.replace(src, dst)

    monkeypatch.setattr(ckpt, "os", proxy(os, replace=replace))
    with pytest.raises(Killed):
        train(resume=str(run / "checkpoints" / "step-000001"), stop_at=2, progress=False, say=quiet)
    monkeypatch.undo()
    assert not (run / "checkpoints" / "step-000002").exists()          # the moment the kill landed
    latest = resolve_checkpoint(run)
    assert latest.name == "step-000001"
    assert ckpt.load_trainer_state(latest)["step"] == 1
    assert train(resume=str(run), progress=False, say=quiet).status == "done"
    assert (run / "checkpoints" / "LATEST").read_text().strip() == "step-000003"


def test_a_kill_inside_pruning_leaves_no_partial_checkpoint_named_like_one(tmp_path, monkeypatch):
    """rmtree deletes a checkpoint file by file: killed after trainer_state.json went, the folder would be a
    step-N the run can no longer prove is its own (never pruned again, and refused when the run writes that
    step again). Pruning renames it to a hidden name first, so the kill leaves only hidden debris."""
    run = tmp_path / "run"
    ckpt.save_checkpoint(run, 1, small_model(dtype="float32"), MOMENTS, {"tokens": 0, "run_id": "ours"}, keep=1)

    def dying_rmtree(path, ignore_errors=False):
        for entry in sorted(os.scandir(path), key=lambda e: e.name != ckpt.STATE_FILE):  # the state file first
            if entry.is_dir(follow_symlinks=False):
                dying_rmtree(entry.path)
            else:
                os.unlink(entry.path)
            raise Killed()

    monkeypatch.setattr(ckpt, "shutil", proxy(shutil, rmtree=dying_rmtree))
    with pytest.raises(Killed):
        ckpt.save_checkpoint(run, 2, small_model(dtype="float32"), MOMENTS, {"tokens": 0, "run_id": "ours"}, keep=1)
    monkeypatch.undo()
    root = run / "checkpoints"
    assert (root / "LATEST").read_text().strip() == "step-000002"
    assert not (root / "step-000001").exists()
    # the run writes step 1 again (resumed from an older checkpoint elsewhere): not refused as someone else's
    ckpt.save_checkpoint(run, 1, small_model(dtype="float32"), MOMENTS, {"tokens": 0, "run_id": "ours"}, keep=2)
    assert (root / "step-000001" / ckpt.STATE_FILE).is_file()


def make(folder, files):
    """Files (relative path -> bytes) under `folder`."""
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)


def test_a_new_claim_removes_the_debris_of_killed_saves_and_prunes_and_nothing_else(run, tmp_path):
    root = run / "checkpoints"
    ours = {  # what a kill leaves: a save's folder (one file still temporary), a prune's, an empty .old
        ".step-000003.0123abcd.tmp": {"config.json": b"{}", "model.safetensors": b"w",
                                      ".trainer_state.json.89abcdef.tmp": b'{"st'},
        ".step-000001.deadbeef.old": {"step-000001/config.json": b"{}", "step-000001/optimizer.safetensors": b"m"},
        ".step-000013.6789abcd.tmp": {"generation_config.json": b"{}"},   # a fine-tune's, killed after its first file
    }
    for name, files in ours.items():
        make(root / name, files)
    (root / ".step-000002.00000000.old").mkdir()
    (root / ".LATEST.0a1b2c3d.tmp").write_text("step-0000")                    # a killed write of LATEST
    elsewhere = tmp_path / "elsewhere"
    make(elsewhere, {"config.json": b"the user's"})
    theirs = {  # named alike, but not provably ours: left as they are
        ".step-000004.0badf00d.tmp": {"config.json": b"{}", "notes.txt": b"mine"},
        ".step-000006.11111111.old": {"step-000007/config.json": b"{}"},          # another step inside
        ".step-000008.1234567.tmp": {"config.json": b"{}"},                      # not 8 hex digits
        ".step-000009.22222222.old": {"step-000009/mine/config.json": b"{}"},    # a folder inside the checkpoint
        "step-000010.33333333.tmp": {"config.json": b"{}"},                      # not hidden
    }
    for name, files in theirs.items():
        make(root / name, files)
    (root / ".step-000005.cafe0123.tmp").symlink_to(elsewhere, target_is_directory=True)
    (root / ".step-000011.44444444.tmp").mkdir()
    (root / ".step-000011.44444444.tmp" / "config.json").symlink_to(elsewhere / "config.json")
    (root / ".step-000012.55555555.tmp").write_bytes(b"a file, not a folder")
    (root / ".LATEST.4e5f6a7b.tmp").mkdir()                                      # a folder so named: not ours
    kept = {name for name in os.listdir(root) if name not in ours and name not in (".step-000002.00000000.old",
                                                                                   ".LATEST.0a1b2c3d.tmp")}
    before, outside = {k: v for k, v in snapshot(root).items() if k.split(os.sep)[0] in kept}, snapshot(elsewhere)

    from tinygrad_ssm.train.run_folder import claim_run_folder
    claim_run_folder(run, resuming_from=run).release()
    assert sorted(os.listdir(root)) == sorted(kept)
    assert snapshot(root) == before and snapshot(elsewhere) == outside
    assert resolve_checkpoint(run).name == "step-000002"


@pytest.mark.parametrize("run_id", ["my-run", "a" * 65, "", 7])
def test_a_marker_whose_run_id_no_checkpoint_could_carry_is_refused_as_malformed(corpus, tmp_path, capsys, run_id):
    """The marker's run id goes into every checkpoint, whose trainer_state.json accepts only RUN_ID_RULE: a run
    under "my-run" would train and save, then fail every --resume as damaged. Refused before anything is written."""
    from tinygrad_ssm.train.run_folder import MARKER_FILE, is_run_id
    out = tmp_path / "mine"
    out.mkdir()
    (out / MARKER_FILE).write_text(json.dumps({"format": "tinygrad_ssm run folder", "run_id": run_id}))
    before = snapshot(out)
    assert cli.main(["train", "--data", str(corpus), "--out", str(out), "--steps", "1", "--no-progress",
                     *FLAGS]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert MARKER_FILE in err and "malformed" in err and "run_id" in err and "letters and digits" in err, err
    assert snapshot(out) == before
    assert ckpt._OPTIONAL_STATE_FIELDS["run_id"][0] is is_run_id  # one rule for both


def test_a_log_hard_linked_to_a_users_file_mid_run_is_refused_and_the_file_untouched(tmp_path):
    from tinygrad_ssm.train.log import LOG_FILE, RunLog, RunLogError
    run, user = tmp_path / "run", tmp_path / "notes.txt"
    run.mkdir()
    user.write_bytes(b"my notes\n")
    log = RunLog(run)
    log.append({"step": 1, "train_loss": 1.0})
    os.unlink(run / LOG_FILE)
    os.link(user, run / LOG_FILE)  # planted while the run trains: O_NOFOLLOW does not see a hard link
    with pytest.raises(RunLogError, match="log.jsonl' has another name"):
        log.append({"step": 2, "train_loss": 0.5})
    assert user.read_bytes() == b"my notes\n"


def test_a_marker_temporary_file_a_killed_run_left_does_not_block_the_same_command(corpus, tmp_path):
    """Killed inside _write_marker (before the link), a run leaves `.tinygrad_ssm_run.json.RANDOM.tmp` in the
    folder it created: the same `train --out` again goes on, and removes it; a link named so is not ours."""
    from tinygrad_ssm.io.atomic_write import new_temporary_file
    from tinygrad_ssm.train.run_folder import MARKER_FILE, RunFolderError, claim_run_folder
    out = tmp_path / "run"
    out.mkdir()
    fd, tmp = new_temporary_file(out, MARKER_FILE)
    os.write(fd, b'{"format": "tinygrad_ssm ru')
    os.close(fd)
    lock = claim_run_folder(out, settings={})
    lock.release()
    assert sorted(os.listdir(out)) == sorted([MARKER_FILE, "run.lock"])
    other, user = tmp_path / "other", tmp_path / "notes.txt"
    other.mkdir()
    user.write_bytes(b"mine")
    (other / os.path.basename(tmp)).symlink_to(user)
    with pytest.raises(RunFolderError, match="not a run folder"):
        claim_run_folder(other, settings={})
    assert os.listdir(other) == [os.path.basename(tmp)] and user.read_bytes() == b"mine"


@pytest.mark.parametrize("other_holds_the_lock", [False, True])
def test_a_claim_that_loses_the_race_for_the_marker_never_runs_under_its_own_id(tmp_path, monkeypatch,
                                                                                 other_holds_the_lock):
    """Two trainings claim a missing --out at once; the other writes its marker first. This one either waits its
    turn and refuses (the other holds the lock), or, the lock free, goes on as a run that found that marker:
    under the marker's run id, never with a marker naming one run and checkpoints carrying another's id."""
    import fcntl

    from tinygrad_ssm.train import run_folder
    out = tmp_path / "run"
    real = run_folder._write_marker
    held = []

    def other_first(folder, run_id, settings, replace):
        if not held:
            real(folder, "theirs", {"who": "other"}, replace=False)
            fd = os.open(folder / run_folder.LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o666)
            held.append(fd)
            if other_holds_the_lock:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        real(folder, run_id, settings, replace)

    monkeypatch.setattr(run_folder, "_write_marker", other_first)
    try:
        if other_holds_the_lock:
            with pytest.raises(run_folder.RunFolderError, match="in use by another training"):
                run_folder.claim_run_folder(out, settings={"who": "me"})
            assert json.loads((out / run_folder.MARKER_FILE).read_text())["run_id"] == "theirs"
        else:
            lock = run_folder.claim_run_folder(out, settings={"who": "me"})
            marker = json.loads((out / run_folder.MARKER_FILE).read_text())
            assert lock.run_id == marker["run_id"] == "theirs" and marker["train_config"] == {"who": "me"}
            lock.release()
    finally:
        os.close(held[0])


def test_export_fills_an_existing_empty_out_folder_in_place(stopped_run, tmp_path, monkeypatch, capsys):
    """An empty --out is the user's folder: filled, never replaced by a new one (its inode, mode with setgid,
    owner and ACLs stay), and `--out .` leaves the shell's working directory the folder that holds the export."""
    out = tmp_path / "shared"
    out.mkdir()
    os.chmod(out, 0o2770)
    before = os.stat(out)
    assert cli.main(["export", "--model", str(stopped_run), "--out", str(out)]) == cli.EXIT_OK
    after = os.stat(out)
    assert (after.st_ino, after.st_mode, after.st_uid, after.st_gid) == \
        (before.st_ino, before.st_mode, before.st_uid, before.st_gid)
    assert {"config.json", "model.safetensors"} <= set(os.listdir(out))
    assert not [name for name in os.listdir(out) if name.startswith(".")]
    assert sorted(os.listdir(tmp_path)) == ["shared"]                      # no temporary folder beside it
    here = tmp_path / "cwd"
    here.mkdir()
    monkeypatch.chdir(here)
    assert cli.main(["export", "--model", str(stopped_run), "--out", "."]) == cli.EXIT_OK
    assert "config.json" in os.listdir(".") and os.path.samefile(".", here)
    capsys.readouterr()


def test_save_pretrained_into_a_dangling_symlink_says_so(tmp_path):
    from tinygrad_ssm.models.mamba2.pretrained import PretrainedError
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    with pytest.raises(PretrainedError, match="is a dangling symbolic link .*remove the link"):
        small_model(dtype="float32").save_pretrained(tmp_path / "link")
    assert sorted(os.listdir(tmp_path)) == ["link"]
