"""Data-parallel runs checked in one process, with a rank of a two-rank job whose MPI calls are played by fakes (the
real runs under mpiexec are tests/test_mpi_runs.py's and tests/test_distributed.py's, where mpi4py is installed):
what a run says when the ranks' weights differ (it must be true of the run folder), and which rank reads
--init-from's folder."""
import errno
import json
from types import SimpleNamespace

import numpy as np
import pytest

from tests.support.models import small_model
from tinygrad_ssm import distributed
from tinygrad_ssm.optim.optimizer import named_parameters
from tinygrad_ssm.train.config import TrainConfig
from tinygrad_ssm.train.loop import _Run
from tinygrad_ssm.train.starting_point import shared_model
from tinygrad_ssm.tokenizer import ByteTokenizer


class RankOneDiffers:
    """COMM_WORLD of a 2-rank job, seen from rank 0, in which rank 1's first weight checksum differs."""

    def Allgather(self, mine, every):  # noqa: N802 - mpi4py's name
        every[0] = mine
        every[1] = mine
        every[1, 0] += 1

    def allgather(self, mine):   # the parameters' names, shapes and dtypes: the same on both ranks
        return [mine, mine]


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

        def allgather(self, mine):
            return [mine, mine]

    distributed.check_same_weights(small_model().varmap, distributed.World(0, 2, Equal()), 1)


def test_a_change_anywhere_in_a_weight_changes_its_checksum():
    """Any element of any parameter, the last one as the first: a rank whose weight differs in one place shows."""
    varmap = small_model().varmap
    before = distributed.weight_checksums(varmap)                       # (parameters,) in registration order
    assert before.shape == (len(varmap.named_vars()),)
    for j, (_, weight) in enumerate(named_parameters(varmap, "test")):
        for at in (0, weight.size - 1):
            kept = weight.data.flat[at]
            weight.data.flat[at] = kept + 1
            after = distributed.weight_checksums(varmap)
            weight.data.flat[at] = kept  # (x + 1) - 1 is not x in float32
            assert after[j] != before[j] and (np.delete(after, j) == np.delete(before, j)).all(), (j, at)
    assert (distributed.weight_checksums(varmap) == before).all()


class FakeWorld:
    """Rank `rank` of a 2-rank job: agree() runs fn here (no other rank fails), broadcast_json() records what rank 0
    sends and hands rank 1 what `sent` holds."""

    def __init__(self, rank, sent=None):
        self.rank, self.size, self.sent = rank, 2, sent

    @property
    def is_root(self):
        return self.rank == 0

    def agree(self, fn, *args):
        return fn(*args)

    def broadcast_json(self, value):
        if self.is_root:
            self.sent = json.loads(json.dumps(value))   # as World.broadcast_json sends it
        return self.sent


def fine_tuning_config(folder):
    return TrainConfig(init_from=str(folder), chunk_size=8, dtype="float32", seed=3)


def test_only_rank_0_reads_the_init_from_folder(tmp_path):
    """Rank 1 builds the model from the config rank 0 sends, so it needs no copy of the folder (a machine of
    its own may have none); its parameters are those rank 0 then broadcasts its loaded weights into."""
    folder = tmp_path / "pretrained"
    small_model(dtype="float32", vocab_size=256).save_pretrained(folder)
    root = FakeWorld(0)
    loaded = shared_model(fine_tuning_config(folder), ByteTokenizer(), None, root)
    assert root.sent == json.loads(json.dumps(loaded.config.to_dict()))
    elsewhere = fine_tuning_config(tmp_path / "not-on-this-machine")   # rank 1 cannot read it: it must not try
    other = shared_model(elsewhere, ByteTokenizer(), None, FakeWorld(1, sent=root.sent))
    assert other.config == loaded.config
    assert [(n, p.shape, p.data.dtype) for n, p in other.varmap.named_vars()] == [
        (n, p.shape, p.data.dtype) for n, p in loaded.varmap.named_vars()]   # what the weights' broadcast fills


def test_a_fresh_run_builds_its_model_on_every_rank():
    cfg = TrainConfig(d_model=32, n_layer=1, d_state=16, headdim=16, chunk_size=8, seed=3)
    world = FakeWorld(1)
    model = shared_model(cfg, ByteTokenizer(), None, world)
    assert world.sent is None and model.config.d_model == 32               # nothing sent: every rank builds it


class Relay:
    """COMM_WORLD of a 2-rank job played in one process: what rank 0 broadcasts is kept and handed to rank 1."""

    sent = None

    def bcast(self, value, root=0):
        if value is not None:
            Relay.sent = value
        return Relay.sent


@pytest.mark.parametrize("error", [OSError(errno.ENOSPC, "No space left on device", "/run/checkpoints/step-000002"),
                                   FileExistsError("--out /run exists"), ValueError("bad state"),
                                   OSError("no errno")])
def test_rank_0s_failed_write_is_raised_alike_on_rank_1(error):
    """World.on_root: rank 0's OSError reaches rank 1 with its type, errno, text and file name (the CLI's message and
    exit status depend on them), a ValueError as a ValueError; both ranks say the error was raised everywhere."""
    def fail():
        raise error

    with pytest.raises(type(error)) as on_root:
        distributed.World(0, 2, Relay()).on_root(fail)
    assert on_root.value is error and on_root.value.raised_on_every_rank
    with pytest.raises(type(error)) as on_other:
        distributed.World(1, 2, Relay()).on_root(fail)  # rank 1 never runs fn: it learns rank 0's error
    other = on_other.value
    assert type(other) is type(error) and str(other) == str(error) and other.raised_on_every_rank
    if isinstance(error, OSError):
        assert (other.errno, other.strerror, other.filename) == (error.errno, error.strerror, error.filename)


def test_rank_0s_result_reaches_rank_1():
    assert distributed.World(0, 2, Relay()).on_root(lambda: {"path": "step-000002"}) == {"path": "step-000002"}
    assert distributed.World(1, 2, Relay()).on_root(lambda: 1 / 0) == {"path": "step-000002"}
