"""`generate --checkpoint RUN` says what is wrong with the run's checkpoints/LATEST (issue 24, class 10), instead of
"no config.json for from_pretrained", which sends the user looking for the wrong file."""
import pytest

from tinygrad_ssm.train import cli


def _run_folder(tmp_path, latest: str | None, step_files=("config.json",)):
    run = tmp_path / "run"
    (run / "checkpoints" / "step-000002").mkdir(parents=True)
    for name in step_files:
        (run / "checkpoints" / "step-000002" / name).write_text("{}")
    if latest is not None:
        (run / "checkpoints" / "LATEST").write_text(latest)
    return run


def _generate_error(run, capsys) -> str:
    assert cli.main(["generate", "--checkpoint", str(run), "--max-new-tokens", "1"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "config.json for from_pretrained" not in err, err
    return err


def test_generate_says_latest_is_missing(tmp_path, capsys):
    err = _generate_error(_run_folder(tmp_path, None), capsys)
    assert "checkpoints/LATEST" in err and "run folder" in err


def test_generate_says_latest_names_a_missing_folder(tmp_path, capsys):
    err = _generate_error(_run_folder(tmp_path, "step-000007\n"), capsys)
    assert "LATEST" in err and "'step-000007'" in err and "not a complete checkpoint" in err
    assert "step-000002" in err  # the folders there are, to choose from


def test_generate_says_latest_names_an_incomplete_checkpoint(tmp_path, capsys):
    err = _generate_error(_run_folder(tmp_path, "step-000002"), capsys)  # no trainer_state.json in it
    assert "LATEST" in err and "'step-000002'" in err and "not a complete checkpoint" in err


def test_generate_says_latest_holds_something_else(tmp_path, capsys):
    err = _generate_error(_run_folder(tmp_path, "../../elsewhere"), capsys)
    assert "LATEST" in err and "not the name of a checkpoint folder" in err


def test_a_repetition_penalty_too_near_0_is_one_line_and_exit_2(stopped_run, tmp_path, capsys):
    """--repetition-penalty 1e-320 divided a seen token's logit past float64's range: a traceback and exit 1 (found
    by a fuzz of the command line), for --batch-file too, where no --json file may be left."""
    flags = ["generate", "--model", str(stopped_run), "--max-new-tokens", "5", "--repetition-penalty", "1e-320"]
    batch = tmp_path / "prompts.txt"
    batch.write_text("one\ntwo\n")
    for extra in ([], ["--batch-file", str(batch), "--json", str(tmp_path / "out.jsonl")]):
        assert cli.main(flags + extra) == cli.EXIT_USAGE
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.startswith("error:")]
        assert len(lines) == 1 and "repetition_penalty 1e-320 divides the logit" in lines[0], err
        assert "np.float64" not in err and "Traceback" not in err
    assert not (tmp_path / "out.jsonl").exists()


def test_sigterm_stops_generate_as_ctrl_c_does(stopped_run):
    """`kill PID` (`timeout`, a scheduler) ended generate at once with exit 143; the help says 130 for it, as for
    Ctrl-C (found by a fuzz of the command line)."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "tinygrad_ssm", "generate", "--model", str(stopped_run),
                             "--prompt", "a", "--max-new-tokens", "10000000"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, cwd=root)
    try:
        import select
        ready, _, _ = select.select([proc.stdout], [], [], 300)         # a generate that hangs fails, not the suite
        assert ready and proc.stdout.read(3), "generate printed nothing in 300 s"   # the prompt and a first piece
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == cli.EXIT_INTERRUPTED and b"Traceback" not in err, err[-2000:]


NUMBA_SWALLOWED = "can't unbox a <class 'numba.typed.typedlist.List'> as a <NULL>"


def ctrl_c_swallowed_as_numba_does():
    """A Ctrl-C landing while numba reads a compiled function's arguments: the handler's KeyboardInterrupt makes
    numba's type check of a typed List fail, and numba raises its TypeError in the interrupt's place."""
    import signal
    try:
        signal.raise_signal(signal.SIGINT)
    except KeyboardInterrupt:
        raise TypeError(NUMBA_SWALLOWED) from None


def test_a_ctrl_c_numba_swallowed_stops_generate_with_130_not_a_traceback(stopped_run, monkeypatch, capsys):
    """The long-running audit's Ctrl-C inside numba's unboxing reached the user as a TypeError traceback, exit 1.
    A TypeError with no signal behind it is still the error it is."""
    monkeypatch.setattr(cli, "_generate", lambda args: ctrl_c_swallowed_as_numba_does())
    assert cli.main(["generate", "--model", str(stopped_run), "--prompt", "a"]) == cli.EXIT_INTERRUPTED
    assert "stopped by Ctrl-C" in capsys.readouterr().err

    def unrelated(args):
        raise TypeError(NUMBA_SWALLOWED)                                # the same words, no Ctrl-C: not taken
    monkeypatch.setattr(cli, "_generate", unrelated)
    with pytest.raises(TypeError, match="<NULL>"):
        cli.main(["generate", "--model", str(stopped_run), "--prompt", "a"])
