"""Pruning keeps the checkpoint with the best validation of its own step beside the newest --keep-checkpoints, so
that a fine-tuning run which starts to overfit still has the checkpoint from before; the end of the run names it."""
import json

from tinygrad_ssm.train import checkpoint as ckpt
from tinygrad_ssm.train import cli
from tinygrad_ssm.train import loop
from tinygrad_ssm.train.loop import TrainConfig, summary, train

from tests.support.training import TINY, quiet


def scripted_validation(monkeypatch, values: list):
    """Each validation of the run gives the next of `values` (bits per byte), in order."""
    left = list(values)
    monkeypatch.setattr(loop, "evaluate", lambda *args, **kwargs: left.pop(0))
    return left


def kept(run_dir) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("step-"))


def test_the_best_checkpoint_outlives_the_newest_ones_and_the_end_names_it(corpus, tmp_path, monkeypatch):
    out = tmp_path / "run"
    left = scripted_validation(monkeypatch, [5.0, 3.0, 4.0, 4.5])
    cfg = TrainConfig(**{**TINY, "steps": 4, "eval_every": 1, "checkpoint_every": 1, "keep_checkpoints": 1,
                         "sample_bytes": 0}, data=str(corpus), out=str(out))
    result = train(cfg, progress=False, say=quiet)
    assert left == []
    assert kept(out) == ["step-000002", "step-000004"]                  # the best (3.0) and the newest
    assert (out / "checkpoints" / "LATEST").read_text().strip() == "step-000004"
    assert result.best == (out / "checkpoints" / "step-000002", 3.0)
    assert f"best validation: 3.000 bits per byte, at {out / 'checkpoints' / 'step-000002'}" in summary(result)
    assert f"generate --model {out / 'checkpoints' / 'step-000002'}   # the checkpoint with the best" in \
        cli._next_steps(result)
    # resumed, a better checkpoint replaces it; one that is newest and best is named once, as the checkpoint
    scripted_validation(monkeypatch, [2.0, 2.5])
    result = train(resume=str(out), overrides={"steps": 6}, progress=False, say=quiet)
    assert kept(out) == ["step-000005", "step-000006"]
    assert result.best == (out / "checkpoints" / "step-000005", 2.0)
    scripted_validation(monkeypatch, [1.0])
    result = train(resume=str(out), overrides={"steps": 7}, progress=False, say=quiet)
    assert kept(out) == ["step-000007"] and "best validation" not in summary(result)
    assert "the checkpoint with the best" not in cli._next_steps(result)


def test_a_checkpoint_whose_last_validation_came_earlier_is_not_judged_by_it(corpus, tmp_path, monkeypatch):
    """Validating every 2 steps and saving every step: step 3's trainer_state holds step 2's figure, which says
    nothing of step 3's weights; step 2 stays the best, though step 3 would win the tie as the later one."""
    out = tmp_path / "run"
    scripted_validation(monkeypatch, [5.0, 6.0])
    cfg = TrainConfig(**{**TINY, "steps": 4, "eval_every": 2, "checkpoint_every": 1, "keep_checkpoints": 1,
                         "sample_bytes": 0}, data=str(corpus), out=str(out))
    train(cfg, progress=False, say=quiet)
    assert kept(out) == ["step-000002", "step-000004"]
    state = json.loads((out / "checkpoints" / "step-000004" / ckpt.STATE_FILE).read_text())
    assert (state["val_bpb"], state["val_bpb_step"]) == (6.0, 4)


def test_of_two_equal_validations_the_later_checkpoint_is_kept(corpus, tmp_path, monkeypatch):
    out = tmp_path / "run"
    scripted_validation(monkeypatch, [3.0, 3.0, 4.0])
    train(TrainConfig(**{**TINY, "steps": 3, "eval_every": 1, "checkpoint_every": 1, "keep_checkpoints": 1,
                         "sample_bytes": 0}, data=str(corpus), out=str(out)), progress=False, say=quiet)
    assert kept(out) == ["step-000002", "step-000003"]


def test_own_validation_reads_only_a_checkpoints_own_finite_figure():
    assert ckpt.own_validation({"step": 4, "val_bpb": 1.5, "val_bpb_step": 4}) == 1.5
    assert ckpt.own_validation({"step": 4, "val_bpb": 1.5, "val_bpb_step": 3}) is None
    assert ckpt.own_validation({"step": 4, "val_bpb": 1.5}) is None       # saved before val_bpb_step existed
    assert ckpt.own_validation({"step": 4, "val_bpb": None, "val_bpb_step": None}) is None
    assert ckpt.own_validation({"step": 4, "val_bpb": float("nan"), "val_bpb_step": 4}) is None
    assert ckpt.own_validation({"step": True, "val_bpb": 1.0, "val_bpb_step": True}) is None
    assert ckpt.own_validation(None) is None
