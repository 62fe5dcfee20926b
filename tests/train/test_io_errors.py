"""I/O errors end with one line naming the path and the cause, a non-zero status (cli.EXIT_IO), and the last
checkpoint intact (issue 24, class 8): a file size limit (RLIMIT_FSIZE in a subprocess), a full disk (ENOSPC),
a read-only --out or resume folder, `generate | head`, `generate > /dev/full`.

Read-only folders are simulated: the tests run as root, where chmod does not stop writes, and a read-only bind
mount needs privileges the test machine may not have, so os.open / os.mkdir / open() raise EROFS for paths in
the folder (monkeypatched in-process)."""
import builtins
import errno
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from tinygrad_ssm.train import cli

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--d-model", "32", "--n-layer", "1", "--d-state", "16", "--headdim", "16", "--batch-size", "2",
        "--seq-len", "32", "--eval-batches", "1", "--sample-bytes", "8", "--no-progress"]


def _env():
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "PYTHONIOENCODING": "utf-8"}


@pytest.fixture(scope="module")
def one_step_run(tmp_path_factory, corpus):
    out = tmp_path_factory.mktemp("io") / "run"
    assert cli.main(["train", "--data", str(corpus), "--steps", "3", "--stop-at", "1", "--out", str(out),
                     *TINY]) == cli.EXIT_OK
    return out


def _copy(run: Path, to: Path) -> Path:
    import shutil

    shutil.copytree(run, to)
    return to


def _one_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _latest(run: Path) -> str:
    return (run / "checkpoints" / "LATEST").read_text().strip()


def test_a_file_size_limit_is_one_line_and_the_checkpoint_is_intact(one_step_run, tmp_path):
    run = _copy(one_step_run, tmp_path / "run")
    limit = 100_000  # model.safetensors (64 KB) fits, optimizer.safetensors (128 KB) does not

    def set_limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    proc = subprocess.run([sys.executable, "-m", "tinygrad_ssm", "train", "--resume", str(run), "--no-progress"],
                          capture_output=True, text=True, timeout=300, env=_env(), preexec_fn=set_limit)
    assert proc.returncode == cli.EXIT_IO, proc.stderr[-2000:]
    line = _one_line(proc.stderr)
    assert str(run) in line and "File too large" in line and "step-000001 is intact" in line
    assert _latest(run) == "step-000001"
    assert cli.main(["generate", "--checkpoint", str(run), "--max-new-tokens", "2"]) == cli.EXIT_OK


def test_a_full_disk_is_one_line_and_the_checkpoint_is_intact(one_step_run, tmp_path, monkeypatch, capsys):
    run = _copy(one_step_run, tmp_path / "run")
    capsys.readouterr()

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    assert cli.main(["train", "--resume", str(run), "--no-progress"]) == cli.EXIT_IO
    line = _one_line(capsys.readouterr().err)
    assert str(run) in line and "No space left on device" in line and "step-000001 is intact" in line
    assert line.endswith(f"once there is room, continue with: python -m tinygrad_ssm train --resume {run}"), line
    assert _latest(run) == "step-000001"


def _read_only(monkeypatch, folder: Path):
    """os.open, os.mkdir and open() for writing raise EROFS inside `folder` (see the module's note)."""
    folder = str(folder)

    def inside(path) -> bool:
        return isinstance(path, (str, bytes, os.PathLike)) and os.path.abspath(os.fsdecode(path)).startswith(folder)

    def refuse(path):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fsdecode(path))

    real_open, real_mkdir, real_builtin_open = os.open, os.mkdir, builtins.open
    writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def os_open(path, flags, *a, **k):
        if inside(path) and flags & writes:
            refuse(path)
        return real_open(path, flags, *a, **k)

    def mkdir(path, *a, **k):
        if inside(path):
            refuse(path)
        return real_mkdir(path, *a, **k)

    def builtin_open(file, mode="r", *a, **k):
        if inside(file) and any(c in mode for c in "wax+"):
            refuse(file)
        return real_builtin_open(file, mode, *a, **k)

    monkeypatch.setattr(os, "open", os_open)
    monkeypatch.setattr(os, "mkdir", mkdir)
    monkeypatch.setattr(builtins, "open", builtin_open)


def test_a_read_only_out_folder_is_one_line(corpus, tmp_path, monkeypatch, capsys):
    _read_only(monkeypatch, tmp_path / "ro")
    out = tmp_path / "ro" / "run"
    assert cli.main(["train", "--data", str(corpus), "--steps", "1", "--out", str(out), *TINY]) == cli.EXIT_IO
    line = _one_line(capsys.readouterr().err)
    assert str(tmp_path / "ro") in line and "Read-only file system" in line


def test_a_read_only_resume_folder_is_one_line_and_the_checkpoint_is_intact(one_step_run, tmp_path, monkeypatch,
                                                                           capsys):
    run = _copy(one_step_run, tmp_path / "run")
    capsys.readouterr()
    _read_only(monkeypatch, run)
    assert cli.main(["train", "--resume", str(run), "--no-progress"]) == cli.EXIT_IO
    line = _one_line(capsys.readouterr().err)
    assert str(run) in line and "Read-only file system" in line
    assert _latest(run) == "step-000001"


def test_generate_into_a_closed_pipe_is_one_line(one_step_run):
    proc = subprocess.Popen([sys.executable, "-m", "tinygrad_ssm", "generate", "--checkpoint", str(one_step_run),
                             "--max-new-tokens", "100000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=_env())
    proc.stdout.read(5)  # `| head -c 5`
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == cli.EXIT_IO
    line = _one_line(err)
    assert "standard output" in line and "Broken pipe" in line


def test_generate_into_a_closed_pipe_with_its_errors_keeps_its_status(one_step_run):
    """`generate 2>&1 | head -c 5`: the error line itself cannot be written; the status still says why."""
    proc = subprocess.Popen([sys.executable, "-m", "tinygrad_ssm", "generate", "--checkpoint", str(one_step_run),
                             "--max-new-tokens", "100000"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=_env())
    proc.stdout.read(5)
    proc.stdout.close()
    assert proc.wait(timeout=300) == cli.EXIT_IO


def test_train_into_a_closed_pipe_names_standard_output_not_the_run_folder(one_step_run, tmp_path):
    """`train | head -1`: the run's files are fine, standard output is not."""
    run = _copy(one_step_run, tmp_path / "run")
    proc = subprocess.Popen([sys.executable, "-m", "tinygrad_ssm", "train", "--resume", str(run), "--no-progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env())
    proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == cli.EXIT_IO
    line = _one_line(err)
    assert "standard output" in line and "Broken pipe" in line and "run folder" not in line, line
    assert "the last checkpoint" in line and "is intact" in line


@pytest.mark.parametrize("where", ["missing_folder", "a_folder", "under_a_file", "empty"])
def test_eval_json_that_cannot_be_written_is_refused_before_scoring(one_step_run, tmp_path, monkeypatch, capsys,
                                                                   where):
    import tinygrad_ssm.train.cli as cli_module

    monkeypatch.setattr(cli_module, "score", lambda *a, **k: pytest.fail("scored before --json was checked"))
    (tmp_path / "notes.txt").write_text("mine")
    target = {"missing_folder": str(tmp_path / "nodir" / "x.json"), "a_folder": str(tmp_path),
              "under_a_file": str(tmp_path / "notes.txt" / "x.json"), "empty": ""}[where]
    assert cli.main(["eval", "--checkpoint", str(one_step_run), "--json", target]) == cli.EXIT_USAGE
    line = _one_line(capsys.readouterr().err)
    why = {"missing_folder": "does not exist", "a_folder": "is a folder", "under_a_file": "is a file, not a folder",
           "empty": "is an empty path"}[where]
    assert f"--json {target!r}" in line and why in line, line


def test_an_atomic_write_names_the_file_asked_for(tmp_path):
    from tinygrad_ssm.io.atomic_write import write_atomic

    for path, cause in ((tmp_path / "nodir" / "x.json", errno.ENOENT), (tmp_path, errno.EISDIR)):
        with pytest.raises(OSError) as caught:
            write_atomic(path, "{}")
        assert caught.value.filename == str(path) and caught.value.errno == cause
    assert sorted(p.name for p in tmp_path.iterdir()) == []              # no temporary file left behind


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_generate_into_a_full_device_is_one_line(one_step_run):
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "tinygrad_ssm", "generate", "--checkpoint", str(one_step_run),
                               "--max-new-tokens", "20"], stdout=full, stderr=subprocess.PIPE, text=True,
                              timeout=300, env=_env())
    assert proc.returncode == cli.EXIT_IO
    line = _one_line(proc.stderr)
    assert "/dev/full" in line and "No space left on device" in line


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_eval_and_export_into_a_full_device_are_one_line_naming_it(one_step_run, tmp_path):
    """export printed a traceback (exit 1) after a whole export; eval named its stdout '/dev/null', where it had
    pointed it before asking (an audit of the CLI)."""
    (tmp_path / "text.txt").write_text("some text to score, some text to score\n" * 4)
    commands = {"eval": ["eval", "--model", str(one_step_run), "--data", str(tmp_path / "text.txt"), "--no-progress"],
                "export": ["export", "--model", str(one_step_run), "--out", str(tmp_path / "exported")]}
    for name, command in commands.items():
        with open("/dev/full", "w") as full:
            proc = subprocess.run([sys.executable, "-m", "tinygrad_ssm", *command], stdout=full,
                                  stderr=subprocess.PIPE, text=True, timeout=300, env=_env())
        assert proc.returncode == cli.EXIT_IO, (name, proc.stderr)
        line = _one_line(proc.stderr)
        assert "standard output (/dev/full)" in line and "No space left on device" in line, (name, line)
    assert (tmp_path / "exported" / "config.json").is_file()                 # the export itself is whole


def test_a_closed_standard_output_is_one_line(one_step_run):
    """generate ... >&- failed with AttributeError: Python has no sys.stdout then."""
    proc = subprocess.run(["sh", "-c", 'exec "$0" -m tinygrad_ssm generate --model "$1" --prompt a >&-',
                           sys.executable, str(one_step_run)], stderr=subprocess.PIPE, text=True, timeout=300,
                          env=_env())
    assert proc.returncode == cli.EXIT_IO
    assert "standard output is closed" in _one_line(proc.stderr)
