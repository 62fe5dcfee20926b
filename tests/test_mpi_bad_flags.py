"""Under `mpiexec -n 2`, a rank that stops at its arguments ends the whole job in seconds with the message (issue
24, class 7): before, the rank with the bad flag exited before MPI started and rank 0 waited in MPI forever.
Each rank gets its own command line through mpiexec's MPMD form (`-n 1 python A : -n 1 python B`)."""
import subprocess
import sys
import time

import pytest

from tests.test_distributed import TINY, _mpiexec, mpirun, needs_mpi  # noqa: F401 - mpirun's environment

GUARD_S = 60  # only a guard: the job must end in seconds; a hang fails instead of blocking the suite


def _mpmd(tmp_path, rank0: list, rank1: list) -> tuple[subprocess.CompletedProcess, float]:
    import os

    from tests.test_distributed import ROOT

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1",
           "PYTHONIOENCODING": "utf-8"}
    cmd = [_mpiexec(), "-n", "1", sys.executable, "-m", "tinygrad_ssm", *map(str, rank0),
           ":", "-n", "1", sys.executable, "-m", "tinygrad_ssm", *map(str, rank1)]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=GUARD_S, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"mpiexec -n 2 with a bad flag on one rank still running after {GUARD_S} s (a rank waits)")
    return proc, time.monotonic() - t0


@needs_mpi
@pytest.mark.parametrize("bad", [["--lr", "abc"], ["--no-such-flag"]])
def test_a_bad_flag_on_one_rank_ends_the_job_with_the_message(corpus, tmp_path, bad):
    good = ["train", "--data", corpus, "--out", tmp_path / "run", "--steps", "2", *TINY]
    proc, took = _mpmd(tmp_path, good, [*good, *bad])
    assert proc.returncode != 0
    err = proc.stderr
    assert bad[0] in err, err  # the failing rank's own message (argparse's), naming the flag
    assert "rank 1 of 2" in err, err  # and rank 0 says which rank stopped, and why
    assert not (tmp_path / "run" / "checkpoints").exists()


@needs_mpi
def test_flags_that_differ_between_the_ranks_end_the_job_with_the_message(corpus, tmp_path):
    good = ["train", "--out", tmp_path / "run", "--steps", "2", *TINY]
    proc, took = _mpmd(tmp_path, [*good, "--data", corpus], [*good, "--data", tmp_path / "missing.txt"])
    assert proc.returncode != 0
    # rank 0 alone reads the data, so rank 1's --data would be ignored in silence: flags that differ between the
    # ranks of one data-parallel job are refused, naming the flag and both values
    assert "rank 1 of 2" in proc.stderr and "--data" in proc.stderr and "missing.txt" in proc.stderr, proc.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


@needs_mpi
def test_different_commands_on_the_ranks_end_the_job_with_the_message(corpus, tmp_path):
    good = ["train", "--data", corpus, "--out", tmp_path / "run", "--steps", "2", *TINY]
    proc, took = _mpmd(tmp_path, good, ["generate", "--checkpoint", tmp_path / "nope"])
    assert proc.returncode != 0
    assert "rank 1 of 2" in proc.stderr, proc.stderr


@needs_mpi
def test_help_and_an_argument_error_the_ranks_share_are_printed_once():
    """mpiexec -n 2 ... --help printed the help twice, and an error every rank made (no command) twice (an audit):
    the job's text once, rank 0's (a rank's own that differs is printed too: the test above)."""
    shown = mpirun(2, ["-m", "tinygrad_ssm", "train", "--help"], timeout=GUARD_S)
    assert shown.returncode == 0 and shown.stdout.count("usage: tinygrad-ssm train") == 1, shown.stdout[-2000:]
    assert "error" not in shown.stderr, shown.stderr                              # (it said "stopped at its arguments")
    refused = mpirun(2, ["-m", "tinygrad_ssm"], timeout=GUARD_S)
    assert refused.returncode != 0
    assert refused.stderr.count("usage: tinygrad-ssm") == 1, refused.stderr     # argparse's text once
    assert "rank 1 of 2 stopped at its arguments" in refused.stderr                # the job's line names each rank
