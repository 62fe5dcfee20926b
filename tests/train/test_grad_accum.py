"""--grad-accum N: each step's batch as N equal micro-batches, their gradients summed. The same step as one batch
(float64, to rounding), a micro-batch's activations at a time, resumable with another N; bad values named."""
import json
from pathlib import Path

import numpy as np
import pytest

from tinygrad_ssm.io.safetensors import load_file
from tinygrad_ssm.models.mamba2.model import Mamba2LMHeadModel
from tinygrad_ssm.train import checkpoint as ckpt
from tinygrad_ssm.train import cli
from tinygrad_ssm.train.checks import divisors, step_memory_bytes, train_config_problems
from tinygrad_ssm.train.loop import TrainConfig, train

from tests.support.training import quiet

SMALL = dict(d_model=32, n_layer=1, d_state=16, headdim=16, batch_size=8, seq_len=32, eval_batches=2,
             sample_bytes=0, lr=1e-2, min_lr=1e-3, warmup_steps=2, steps=3, eval_every=2, checkpoint_every=1,
             keep_checkpoints=3, dtype="float64")


def run(corpus, out: Path, **kw) -> Path:
    train(TrainConfig(**{**SMALL, "data": str(corpus), "out": str(out), **kw}), progress=False, say=quiet)
    return out


def weights(run_dir: Path) -> dict:
    return load_file(ckpt.resolve_checkpoint(run_dir) / "model.safetensors")


def log(run_dir: Path) -> list:
    return [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]


def worst_relative(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float(np.abs(a[k] - b[k]).max() / np.abs(b[k]).max()) for k in b)


def test_micro_batches_make_the_step_of_the_whole_batch(corpus, tmp_path, monkeypatch):
    """Batch 8 as 1, 2 or 4 micro-batches: the same weights, losses, gradient norms and validation figures, up to
    the order of the sums; the model never sees more rows at once than a micro-batch."""
    whole = run(corpus, tmp_path / "whole")
    rows_seen, real_loss = [], Mamba2LMHeadModel.loss
    monkeypatch.setattr(Mamba2LMHeadModel, "loss", lambda self, x, y: rows_seen.append(len(x)) or real_loss(self, x, y))
    for pieces in (2, 4):
        rows_seen.clear()
        split = run(corpus, tmp_path / f"in{pieces}", grad_accum=pieces)
        assert set(rows_seen) == {8 // pieces}, rows_seen                # training's and validation's pieces
        assert worst_relative(weights(split), weights(whole)) < 1e-10
        for mine, theirs in zip(log(split), log(whole), strict=True):
            assert mine.keys() == theirs.keys() and mine["tokens"] == theirs["tokens"], (mine, theirs)
            for key in ("train_loss", "grad_norm", "val_bpb"):
                if key in theirs:
                    assert abs(mine[key] - theirs[key]) <= 1e-12 * abs(theirs[key]), (key, mine, theirs)


def test_a_run_resumes_with_another_grad_accum(corpus, tmp_path):
    """A run that ran out of memory goes on in smaller pieces: the result is the uninterrupted run's, to rounding."""
    whole = run(corpus, tmp_path / "whole")
    train(TrainConfig(**{**SMALL, "data": str(corpus), "out": str(tmp_path / "split")}), stop_at=1, progress=False,
          say=quiet)
    train(resume=str(tmp_path / "split"), overrides={"grad_accum": 4}, progress=False, say=quiet)
    assert worst_relative(weights(tmp_path / "split"), weights(whole)) < 1e-10
    state = json.loads((ckpt.resolve_checkpoint(tmp_path / "split") / "trainer_state.json").read_text())
    assert state["train_config"]["grad_accum"] == 4


@pytest.mark.parametrize("flags,message", [
    (["--batch-size", "6", "--grad-accum", "4"],
     "--grad-accum 4 must divide --batch-size 6 (each step's batch in that many equal micro-batches); give one of "
     "1, 2, 3, 6"),
    (["--grad-accum", "0"], "--grad-accum must be >= 1, got 0"),
])
def test_a_grad_accum_that_cannot_split_the_batch_is_named(corpus, tmp_path, capsys, flags, message):
    code = cli.main(["train", "--data", str(corpus), "--out", str(tmp_path / "run"), "--d-model", "32", "--n-layer",
                     "1", "--d-state", "16", "--headdim", "16", "--seq-len", "32", "--no-progress", *flags])
    assert code == cli.EXIT_USAGE
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_the_memory_estimate_is_one_micro_batchs():
    """A batch too big for this machine fits in pieces: the estimate is the micro-batch's, and the message says
    --grad-accum is the way that keeps the step."""
    ids = 16 * 128  # a sequence's input and target ids (int64), drawn for the whole batch at once
    one = step_memory_bytes(TrainConfig(batch_size=8)) - 8 * ids
    assert step_memory_bytes(TrainConfig(batch_size=32, grad_accum=4)) == one + 32 * ids
    assert step_memory_bytes(TrainConfig(batch_size=32)) == 4 * one + 32 * ids
    refused = train_config_problems(TrainConfig(batch_size=10 ** 8, grad_accum=4))
    assert len(refused) == 1 and "in 4 micro-batches" in refused[0] and "raise --grad-accum" in refused[0], refused


def test_divisors():
    for n in range(1, 300):
        assert divisors(n) == [d for d in range(1, n + 1) if n % d == 0], n


def test_the_memory_estimate_is_each_ranks_share_times_the_ranks_on_this_machine():
    """Under MPI the check counted the whole global batch in one process (a run of 2 ranks that fits on 2
    machines, 13.5 GiB each, was refused as needing 27) and one copy of the model for N ranks on one machine (an
    audit): now each rank's share, times the ranks on this machine."""
    from tinygrad_ssm.train.checks import physical_memory_bytes
    ids = 16 * 128
    half = step_memory_bytes(TrainConfig(batch_size=16))
    assert step_memory_bytes(TrainConfig(batch_size=32), ranks=2) == half + 16 * ids
    assert step_memory_bytes(TrainConfig(batch_size=32, grad_accum=2), ranks=2) == \
        step_memory_bytes(TrainConfig(batch_size=8)) + 24 * ids
    have = physical_memory_bytes()
    if have is None:
        pytest.skip("this platform does not tell its memory")
    one = step_memory_bytes(TrainConfig(batch_size=1)) - ids
    cfg = TrainConfig(batch_size=2 * int(0.7 * have / one))                   # 1.4 machines' memory in one process
    assert len(train_config_problems(cfg)) == 1
    assert train_config_problems(cfg, ranks=2) == []                           # 0.7 on each of 2 machines
    refused = train_config_problems(cfg, ranks=2, machines=[("here", 2, have)])  # both on this one
    assert len(refused) == 1, refused
    assert (f"--batch-size {cfg.batch_size} ({cfg.batch_size // 2} sequences on each of 2 MPI ranks)" in refused[0]
            and "for each of the 2 MPI ranks on this machine" in refused[0]), refused


def test_the_memory_check_reads_every_machine_of_the_job():
    """It read rank 0's machine alone (an audit): a run that fits there but not on a machine with less memory, or
    with more ranks on it, started and ran that one out of memory at its first step."""
    from tinygrad_ssm.train.checks import tightest_machine
    gib = 2 ** 30
    cfg = TrainConfig(batch_size=4 * int(0.7 * 64 * gib / (step_memory_bytes(TrainConfig(batch_size=1)))))
    assert step_memory_bytes(cfg, ranks=4) < 64 * gib < step_memory_bytes(cfg, ranks=2)
    fits = [("root", 1, 64 * gib), ("big", 1, 64 * gib)]
    assert train_config_problems(cfg, ranks=4, machines=fits + [("b", 2, 128 * gib)]) == []
    for small in (("node7", 1, 16 * gib), ("node7", 2, 64 * gib)):   # less memory; more ranks on the same memory
        assert tightest_machine(fits + [small]) == small
        refused = train_config_problems(cfg, ranks=4, machines=fits + [small])
        assert len(refused) == 1 and "more than machine node7's" in refused[0], refused
    assert tightest_machine([("a", 1, None), ("b", 1, None)]) == ("a", 1, None)   # nothing known: nothing refused
    assert train_config_problems(cfg, ranks=4, machines=[("a", 1, None), ("b", 1, None)]) == []
