"""The command line under an MPI launcher (tinygrad_ssm/train/mpi_cli.py), without MPI: the launcher's environment
stands in for mpiexec (tests/test_mpi_runs.py runs the real thing where mpiexec is installed)."""
import argparse

import pytest

from tinygrad_ssm import distributed
from tinygrad_ssm.train.mpi_cli import python_cmd, refuse_single_process_commands

EXIT_USAGE = 2


@pytest.fixture
def two_ranks(monkeypatch):
    """mpiexec -n 2's environment (Open MPI's variables), MPI itself not started."""
    monkeypatch.setattr(distributed, "_world", None)
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    return lambda rank: monkeypatch.setenv("OMPI_COMM_WORLD_RANK", str(rank))


@pytest.mark.parametrize("command", ["generate", "eval", "export"])
def test_generate_eval_and_export_are_refused_on_every_rank_and_said_once(two_ranks, command, capsys):
    args = argparse.Namespace(command=command)
    for rank in (0, 1):
        two_ranks(rank)
        assert refuse_single_process_commands(args, None, EXIT_USAGE) == (None, EXIT_USAGE)
        err = capsys.readouterr().err
        assert err.count(f"`{command}` runs in one process, but mpiexec started 2") == (rank == 0), err


def test_train_and_a_failed_agreement_pass_through(two_ranks, capsys):
    two_ranks(0)
    train = argparse.Namespace(command="train")
    assert refuse_single_process_commands(train, None, EXIT_USAGE) == (train, None)
    assert refuse_single_process_commands(None, 3, EXIT_USAGE) == (None, 3)      # the arguments' own failure
    assert capsys.readouterr().err == ""


def test_the_command_that_continues_a_run_is_started_as_the_run_was(monkeypatch):
    monkeypatch.setattr(distributed, "_world", None)
    assert python_cmd(1) == python_cmd() == "python"
    assert python_cmd(2) == "mpiexec -n 2 python"
