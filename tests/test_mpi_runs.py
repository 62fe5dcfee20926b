"""Training runs under `mpiexec -n 2` as a user meets them: resuming, stopping, failing, saving (QA walk of the
MPI path). The helpers and the skip without mpi4py are tests/test_distributed.py's."""
import shutil

import pytest

from tests.test_distributed import TINY, mpirun, needs_mpi  # noqa: F401 - mpirun's environment


@needs_mpi
def test_a_tokenized_run_resumes_on_two_ranks_without_the_tokenizer_file(corpus, bpe_tokenizer, tmp_path):
    """docs/distributed.md: rank 0 reads the checkpoint and sends it; the tokenizer too, so the file the run was
    given may be gone (rank 1 read it again and failed) or replaced (rank 1 tokenized with another one)."""
    tok = tmp_path / "tok" / "tokenizer.json"
    tok.parent.mkdir()
    shutil.copy(bpe_tokenizer, tok)
    run = tmp_path / "run"
    first = mpirun(2, ["-m", "tinygrad_ssm", "train", *TINY, "--data", corpus, "--tokenizer", tok, "--steps", "2",
                       "--stop-at", "1", "--out", run])
    assert first.returncode == 0, first.stderr[-3000:]
    tok.unlink()
    gone = mpirun(2, ["-m", "tinygrad_ssm", "train", "--resume", run, "--no-progress", "--stop-at", "2"])
    assert gone.returncode == 0, gone.stderr[-3000:]
    assert "resumed from" in gone.stdout, gone.stdout
    tok.write_text('{"not": "a tokenizer"}')   # another file at the path: the checkpoint's copy is still the one
    replaced = mpirun(2, ["-m", "tinygrad_ssm", "train", "--resume", run, "--no-progress"])
    assert replaced.returncode == 0, replaced.stderr[-3000:]
    assert "final validation" in replaced.stdout


@needs_mpi
@pytest.mark.parametrize("command", [["generate", "--max-new-tokens", "5", "--prompt", "a"], ["eval", "--json"]])
def test_generate_and_eval_under_mpiexec_are_refused_once(stopped_run, tmp_path, command):
    """They run in one process: under mpiexec -n 2 every rank ran the whole command (the output twice; two
    writers of one --json file, and a false error from the one that lost)."""
    if command[-1] == "--json":
        command = [*command, tmp_path / "report.json"]
    proc = mpirun(2, ["-m", "tinygrad_ssm", command[0], "--model", stopped_run, *command[1:]])
    assert proc.returncode == 2, proc.stderr[-3000:]
    message = f"error: `{command[0]}` runs in one process, but mpiexec started 2"
    assert proc.stderr.count(message) == 1 and "without mpiexec" in proc.stderr, proc.stderr
    assert proc.stdout == "" and not (tmp_path / "report.json").exists()
