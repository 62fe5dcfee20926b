"""Run folders: one training at a time (a lock), never into a foreign folder, a LATEST pointer that cannot
lead out of its run, and damaged resume state (missing or wrong-typed fields, a deleted weights file, a torn
log line) that fails clearly, or, for the torn log line, does not block the resume."""
import contextlib
import json
import shutil
from pathlib import Path
import subprocess
import sys
import textwrap

import pytest

from tinygrad_ssm.train import checkpoint as ckpt
from tinygrad_ssm.train import cli
from tinygrad_ssm.train.run_folder import LOCK_FILE, RunFolderError, claim_run_folder, lock_run_folder
from tinygrad_ssm.train.log import RunLog, RunLogError
from tinygrad_ssm.train.loop import TrainConfig
from tinygrad_ssm.train.loop import train

from tests.support.training import TINY, quiet



def resume(run, **kw):
    return train(resume=str(run), progress=False, say=quiet, **kw)


HOLD_LOCK = textwrap.dedent("""
    import fcntl, os, sys, time
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.pwrite(fd, b"%d\\n" % os.getpid(), 0)
    print("locked", flush=True)
    sys.stdin.read()
""")
TRY_LOCK = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR); "
            "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB); print('free')")


def test_a_second_training_on_the_same_folder_refuses(run, capsys):
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(run / LOCK_FILE)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        log_before = (run / "log.jsonl").read_bytes()
        assert cli.main(["train", "--resume", str(run), "--no-progress"]) == cli.EXIT_USAGE
        err = capsys.readouterr().err
        assert "in use by another training" in err and f"process {holder.pid}" in err and str(run) in err
        assert (run / "log.jsonl").read_bytes() == log_before  # nothing written
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    # the holder exited, so its lock is gone; ours is released when train returns
    assert resume(run).status == "done"
    probe = subprocess.run([sys.executable, "-c", TRY_LOCK, str(run / LOCK_FILE)], capture_output=True, text=True)
    assert probe.stdout.strip() == "free", probe.stderr


HOLD_OUR_LOCK = textwrap.dedent("""
    import sys
    from tinygrad_ssm.train.run_folder import lock_run_folder
    lock = lock_run_folder(sys.argv[1])
    print("locked", flush=True)
    sys.stdin.read()
""")


@contextlib.contextmanager
def _holding(script: str, path):
    """A process running `script` on `path`, which has taken the lock (it printed "locked"), until the block ends."""
    holder = subprocess.Popen([sys.executable, "-c", script, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2])
    try:
        assert holder.stdout.readline().strip() == "locked"
        yield holder
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)


def test_the_run_lock_is_exclusive_between_two_of_our_processes(tmp_path):
    """Two trainings take the lock the same way: the second must be refused (two shared locks would both hold)."""
    out = tmp_path / "run"
    with _holding(HOLD_OUR_LOCK, out) as holder:
        with pytest.raises(RunFolderError, match=f"in use by another training \\(process {holder.pid}\\)"):
            lock_run_folder(out)
    lock_run_folder(out).release()  # the holder's lock ended with it


def test_a_new_run_refuses_a_foreign_non_empty_folder(corpus, tmp_path, capsys):
    folder = tmp_path / "my_project"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    (folder / "log.jsonl").write_text('{"not": "ours"}\n')
    args = ["train", "--data", str(corpus), "--out", str(folder), "--steps", "1", "--no-progress"]
    assert cli.main(args + [f for k, v in TINY.items() for f in (f"--{k.replace('_', '-')}", str(v))]) == \
        cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "non-empty folder that is not a run folder" in err and "notes.txt" in err
    assert (folder / "log.jsonl").read_text() == '{"not": "ours"}\n' and sorted(p.name for p in folder.iterdir()) \
        == ["log.jsonl", "notes.txt"]
    with pytest.raises(RunFolderError, match="is a file"):
        claim_run_folder(folder / "notes.txt")


def test_out_as_a_dangling_symlink_is_refused_naming_its_target(tmp_path):
    link = tmp_path / "runs"
    link.symlink_to(tmp_path / "gone")
    for out in (link, link / "run" / "x"):                             # --out, or a folder above it
        with pytest.raises(RunFolderError, match=r"--out .*: .*runs' is a symlink to .*gone', which does not exist"):
            claim_run_folder(out)
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(RunFolderError, match=r"notes.txt' is a file, not a folder; choose another --out"):
        claim_run_folder(tmp_path / "notes.txt" / "run")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "runs"] and not (tmp_path / "gone").exists()


def test_resume_takes_the_data_path_however_it_is_spelled(run, monkeypatch, tmp_path):
    """The run saved --data absolute; --resume with the same file given relative (or through ..) continues it,
    and another file is still refused."""
    saved = Path(json.loads((ckpt.resolve_checkpoint(run) / ckpt.STATE_FILE).read_text())["train_config"]["data"])
    monkeypatch.chdir(saved.parent)
    for i, spelling in enumerate((saved.name, f"../{saved.parent.name}/{saved.name}")):
        copy = shutil.copytree(run, tmp_path / f"copy{i}", symlinks=True)
        assert resume(copy, overrides={"data": spelling}).status == "done"
    with pytest.raises(ValueError, match=r"--data path 'elsewhere.txt' does not exist"):
        resume(run, overrides={"data": "elsewhere.txt"})


def test_a_run_resumes_on_its_data_moved_elsewhere_and_on_no_other(corpus, tmp_path):
    """A --data folder moved elsewhere could not be resumed at all (--data was pinned to the saved path, and without
    it the error was "--data path ... does not exist", naming a flag not given); the data's fingerprint already held
    the content to the run's. Now the new place is taken, other data is refused saying what differs, and a saved
    place that is gone is named with the fix."""
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(corpus, data / "text.txt")
    run = tmp_path / "run"
    train(TrainConfig(**TINY, steps=2, data=str(data), out=str(run)), stop_at=1, progress=False, say=quiet)
    moved = data.rename(tmp_path / "moved")
    with pytest.raises(ValueError, match=r"--resume: the run's --data '.*data' no longer exists; if it was moved, give "
                                         r"its new place with --data PATH"):
        resume(run)
    edited = shutil.copytree(moved, tmp_path / "edited")
    (edited / "text.txt").write_bytes((edited / "text.txt").read_bytes()[:-1000])
    with pytest.raises(ValueError, match=r"is not the one this run was trained on: the training split has \d+ ids, "
                                         r"not \d+.*; resume on the data the run read"):
        resume(run, overrides={"data": str(edited)})
    assert resume(run, overrides={"data": str(moved)}).step == 2
    state = json.loads((ckpt.resolve_checkpoint(run) / ckpt.STATE_FILE).read_text())
    assert state["train_config"]["data"] == str(moved)


def test_a_new_run_may_reuse_a_folder_of_ours_without_a_checkpoint(corpus, tmp_path):
    out = tmp_path / "run"
    claim_run_folder(out).release()  # a run of ours (its marker proves it: test_ownership.py) ...
    (out / "log.jsonl").write_text('{"step": 1, "train_loss": 9.0}\n')  # ... stopped before any checkpoint
    result = train(TrainConfig(**TINY, steps=1, data=str(corpus), out=str(out)), progress=False, say=quiet)
    assert result.status == "done"
    assert [r["train_loss"] != 9.0 for r in RunLog(out).records() if "train_loss" in r] == [True]


def test_an_existing_run_is_not_started_over(run):
    with pytest.raises(RunFolderError, match="already holds a run; continue it with --resume"):
        claim_run_folder(run)


@pytest.mark.parametrize("pointer", ["../../elsewhere/checkpoints/step-000002", "/tmp/x", "step-000002/../..",
                                     "step-2", ""])
def test_latest_must_name_a_checkpoint_beside_it(run, tmp_path, pointer):
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(run, elsewhere)  # a complete run the pointer could lead a resume into
    (run / "checkpoints" / "LATEST").write_text(pointer + "\n")
    with pytest.raises(ckpt.CheckpointNotFound, match="not the name of a checkpoint folder beside it"):
        resume(run)
    assert sorted(p.name for p in (elsewhere / "checkpoints").iterdir()) == ["LATEST", "step-000001", "step-000002"]


BAD_RUN = r"its 'train_config' is not a valid run \("


@pytest.mark.parametrize("damage,message", [
    (lambda s: s.pop("sampler"), "'sampler' is missing"),
    (lambda s: s.update(step="2"), "'step' must be an integer >= 0, got '2'"),
    (lambda s: s.update(tokens=-1), "'tokens' must be an integer >= 0"),
    (lambda s: s.update(train_s=float("nan")), "'train_s' must be a finite number"),
    (lambda s: s.update(val_bpb="low"), "'val_bpb' must be null or a finite number"),
    (lambda s: s["sampler"].pop("bit_generator"), "'sampler' must be an object with"),
    (lambda s: s.update(train_config=[1]), "'train_config' must be an object"),
    (lambda s: s["train_config"].update(lr="fast"), BAD_RUN + r"--lr must be a finite"),
    (lambda s: s["train_config"].update(steps=True), BAD_RUN + r"--steps must be an int"),
    (lambda s: s["train_config"].update(stepz=3), BAD_RUN + r"TrainConfig: unknown fields"),
])
def test_damaged_trainer_state_is_named_field_by_field(run, damage, message):
    path = run / "checkpoints" / "step-000002" / "trainer_state.json"
    state = json.loads(path.read_text())
    damage(state)
    path.write_text(json.dumps(state))
    with pytest.raises(ckpt.CheckpointNotFound, match=f"trainer_state.json' is damaged: {message}"):
        resume(run)


@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.safetensors", "config.json"])
def test_a_deleted_checkpoint_file_is_named_with_the_other_checkpoints(run, capsys, name):
    (run / "checkpoints" / "step-000002" / name).unlink()
    assert cli.main(["train", "--resume", str(run), "--no-progress"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert f"step-000002/{name}' does not exist" in err and "is incomplete" in err
    assert "['step-000001', 'step-000002']" in err  # where to resume from instead


def test_latest_naming_a_folder_without_its_trainer_state_is_not_a_checkpoint(run):
    """LATEST names a folder whose trainer_state.json (written last, the mark of a complete checkpoint) is gone:
    resolving the run names the folder as incomplete and lists the others, rather than handing it on."""
    newest = ckpt.resolve_checkpoint(run)
    (newest / ckpt.STATE_FILE).unlink()
    with pytest.raises(ckpt.CheckpointNotFound, match=f"names '{newest.name}', which is not a complete checkpoint "
                                                      r"\(its folders: \['step-000001', 'step-000002'\]\)"):
        ckpt.resolve_checkpoint(run)


def test_a_torn_last_log_line_does_not_block_a_resume(run):
    with open(run / "log.jsonl", "a") as f:
        f.write('{"step": 3, "train_lo')  # the process died while appending step 3
    assert [r["step"] for r in RunLog(run).records() if "train_loss" in r] == [1, 2]
    assert resume(run).status == "done"
    records = RunLog(run).records()
    assert [r["step"] for r in records if "train_loss" in r] == [1, 2, 3]
    assert (run / "log.jsonl").read_text().endswith("}\n")


def test_a_broken_line_inside_the_log_is_named(run):
    lines = (run / "log.jsonl").read_text().splitlines(keepends=True)
    lines[1] = "garbage\n"
    (run / "log.jsonl").write_text("".join(lines))
    with pytest.raises(RunLogError, match=r"log.jsonl' line 2 is not a log record \('garbage'\)"):
        resume(run)


def test_only_a_last_line_without_its_newline_is_a_torn_one(tmp_path):
    """A whole last line (its newline written) that is not a record was not torn by a dying append: it is named."""
    log = RunLog(tmp_path)
    log.append({"step": 1, "train_loss": 1.0})
    with open(log.path, "a") as f:
        f.write("garbage\n")
    with pytest.raises(RunLogError, match=r"line 2 is not a log record \('garbage'\)"):
        log.records()
    log.path.write_text('{"step": 1, "train_loss": 1.0}\n{"step": 2, "tr')
    assert log.records() == [{"step": 1, "train_loss": 1.0}]


def test_a_runs_checkpoints_folder_resolves_to_its_newest_checkpoint(run, capsys):
    newest = ckpt.resolve_checkpoint(run)
    assert ckpt.resolve_checkpoint(run / "checkpoints") == newest
    from tinygrad_ssm.models.mamba2 import Mamba2LMHeadModel                 # and in Python, as the CLI takes it
    assert Mamba2LMHeadModel.from_pretrained(run / "checkpoints").config == Mamba2LMHeadModel.from_pretrained(
        newest).config
    assert cli.main(["generate", "--model", str(run / "checkpoints"), "--max-new-tokens", "3"]) == cli.EXIT_OK
    capsys.readouterr()


def test_resuming_a_run_stopped_before_its_first_checkpoint_says_so(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    claim_run_folder(out).release()                                    # a run of ours that saved nothing yet
    assert cli.main(["train", "--resume", str(out), "--no-progress"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "stopped before its first checkpoint" in err and f"start it again with --out {out}" in err
    assert cli.main(["train", "--resume", str(tmp_path), "--no-progress"]) == cli.EXIT_USAGE   # not a run
    assert "is neither a checkpoint folder" in capsys.readouterr().err


def test_a_resume_from_an_older_checkpoint_keeps_the_newest_ones_log_until_it_saves(run, monkeypatch):
    """A resume of step-000001 while LATEST named step-000002 dropped the log's records of step 2 when it started:
    killed before its first save, it left LATEST at step 2 with a log that stopped at step 1."""
    from tinygrad_ssm.train import loop
    before = (run / "log.jsonl").read_text()
    assert {r["step"] for r in RunLog(run).records()} == {1, 2}

    def dies(*args, **kwargs):
        raise RuntimeError("killed")
    monkeypatch.setattr(loop, "train_step", dies)
    with pytest.raises(RuntimeError, match="killed"):
        train(resume=str(run / "checkpoints" / "step-000001"), progress=False, say=quiet)
    assert (run / "checkpoints" / "LATEST").read_text().strip() == "step-000002"
    assert (run / "log.jsonl").read_text() == before                     # still step 2's log
    monkeypatch.undo()
    assert train(resume=str(run / "checkpoints" / "step-000001"), progress=False, say=quiet).status == "done"
    steps = [r["step"] for r in RunLog(run).records() if "train_loss" in r]
    assert steps == [1, 2, 3]                                            # the branch's 2 and 3 replaced the old 2


def test_a_branch_of_the_log_replaces_the_old_records_only_when_saved(tmp_path):
    log = RunLog(tmp_path)
    for step in (1, 2, 3, 4):
        log.append({"step": step, "train_loss": float(step)})
    log.resume_at(2, newest_saved_step=3)       # step 4 was never saved: it goes now; 3 stays until a save
    assert [r["step"] for r in log.records()] == [1, 2, 3]
    log.append({"step": 3, "train_loss": 30.0})
    assert [r["train_loss"] for r in RunLog(tmp_path).records()] == [1.0, 2.0, 3.0]
    log.saved()
    assert [r["train_loss"] for r in log.records()] == [1.0, 2.0, 30.0]
    log.append({"step": 4, "train_loss": 40.0})                           # then appended as usual
    assert [r["train_loss"] for r in RunLog(tmp_path).records()] == [1.0, 2.0, 30.0, 40.0]
    log.resume_at(4, newest_saved_step=4)                                 # from the newest: nothing is held
    assert log.branch_step is None


def test_out_with_a_tilde_the_shell_left_is_the_home_folder(corpus, tmp_path, monkeypatch):
    """--out=~/run (bash expands no ~ after '=') made a folder named '~' in the working folder, and printed
    --resume '~/run', which the shell then expanded to the home folder, where no run was."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "home").mkdir()
    assert cli.main(["train", "--data", str(corpus), "--out=~/run", "--steps", "1", "--no-progress", "--d-model", "32",
                     "--n-layer", "1", "--d-state", "16", "--headdim", "16", "--batch-size", "2", "--seq-len", "32",
                     "--eval-batches", "1", "--sample-bytes", "4"]) == 0
    assert (tmp_path / "home" / "run" / "checkpoints" / "step-000001").is_dir()
    assert not (tmp_path / "~").exists()


def test_checkpoint_names_are_in_step_order_past_a_million(tmp_path):
    """step-1000000 sorted before step-999998 (as strings), so the 'newest' a message offered was an older one."""
    for step in (999998, 999999, 1000000):
        (tmp_path / "checkpoints" / f"step-{step:06d}").mkdir(parents=True)
    assert ckpt.checkpoint_names(tmp_path) == ["step-999998", "step-999999", "step-1000000"]


HOLD_THEN_WRITE_PID = textwrap.dedent("""
    import fcntl, os, sys, time
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o666)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)   # the lock taken, its id not written yet: the window of a race
    print("locked", flush=True)
    time.sleep(0.1)
    os.pwrite(fd, f"{os.getpid()}\\n".encode(), 0)
    sys.stdin.read()
""")


def test_a_claim_that_loses_the_race_by_a_moment_names_the_holder(tmp_path):
    """Two resumes started at the same instant: the refused one read the lock file before the winner had written
    its process id and said "process unknown" (a fuzz of interruptions); it waits a moment for the id."""
    out = tmp_path / "run"
    out.mkdir()
    with _holding(HOLD_THEN_WRITE_PID, out / LOCK_FILE) as holder:
        with pytest.raises(RunFolderError, match=f"in use by another training \\(process {holder.pid}\\)"):
            lock_run_folder(out)
