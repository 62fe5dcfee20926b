"""What a data-parallel run says when it stops, checked in one process with a two-rank World whose MPI calls are
played by a fake communicator (the real runs under mpiexec are tests/test_mpi_runs.py's, where mpi4py is
installed): the message must state what is true of the run folder."""
from types import SimpleNamespace

import pytest

from tests.support.models import small_model
from tinygrad_ssm import distributed
from tinygrad_ssm.train.loop import _Run


class RankOneDiffers:
    """COMM_WORLD of a 2-rank job, seen from rank 0, in which rank 1's first weight checksum differs."""

    def Allgather(self, mine, every):  # noqa: N802 - mpi4py's name
        every[0] = mine
        every[1] = mine
        every[1, 0] += 1


def diverged_run(last_ckpt):
    """What _Run.save reads before writing: the weights, the world, the step and the last checkpoint."""
    return SimpleNamespace(model=small_model(), world=distributed.World(0, 2, RankOneDiffers()), step=2,
                           last_ckpt=last_ckpt)


def test_ranks_that_differ_before_any_checkpoint_do_not_claim_one_is_intact():
    with pytest.raises(distributed.RanksDiverged) as caught:
        _Run.save(diverged_run(None))
    message = str(caught.value)
    assert "after step 2 the weights of rank(s) [1] differ from rank 0's in 1 parameters" in message
    assert "no checkpoint had been written yet; start the run again" in message, message
    assert "intact" not in message and "resume" not in message, message


def test_ranks_that_differ_after_a_checkpoint_name_it_to_resume_from(tmp_path):
    last = tmp_path / "run" / "checkpoints" / "step-000001"
    with pytest.raises(distributed.RanksDiverged) as caught:
        _Run.save(diverged_run(last))
    message = str(caught.value)
    assert f"the last good checkpoint {last} was left untouched; resume from it: --resume {last}" in message, message
    assert "nothing of the diverged ranks was saved" in message


def test_the_api_check_alone_claims_nothing_about_checkpoints():
    """dist.check_same_weights in one's own loop (docs/distributed.md) knows of no checkpoint: it names none."""
    with pytest.raises(distributed.RanksDiverged) as caught:
        distributed.check_same_weights(small_model().varmap, distributed.World(0, 2, RankOneDiffers()), 5)
    assert "checkpoint" not in str(caught.value) and "after step 5" in str(caught.value)


def test_equal_ranks_pass():
    class Equal:
        def Allgather(self, mine, every):  # noqa: N802
            every[:] = mine

    distributed.check_same_weights(small_model().varmap, distributed.World(0, 2, Equal()), 1)
