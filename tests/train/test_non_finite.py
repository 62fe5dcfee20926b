"""A checkpoint is never written non-finite, "last good" is only said of one that is, and a checkpoint whose
weights or optimizer moments are non-finite (or whose second moment is negative) is refused on load, naming the
file and the tensor (issue 24, class 3)."""
import json
import re

import numpy as np
import pytest

from tinygrad_ssm.io.safetensors import load_file, save_file
from tinygrad_ssm.train import checkpoint as ckpt
from tinygrad_ssm.train import cli

from tests.support.models import small_model
from tests.support.training import TINY, forget_digest



def all_finite(checkpoint):
    """(every tensor of the checkpoint's weights and moments is finite, every exp_avg_sq >= 0)."""
    weights, moments = load_file(checkpoint / "model.safetensors"), load_file(checkpoint / "optimizer.safetensors")
    finite = all(np.all(np.isfinite(a)) for a in [*weights.values(), *moments.values()])
    return finite and all(np.all(a >= 0) for k, a in moments.items() if k.endswith("/exp_avg_sq"))


def test_a_diverging_update_never_writes_a_non_finite_checkpoint(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    flags = [f for k, v in {**TINY, "warmup_steps": 0}.items() for f in (f"--{k.replace('_', '-')}", str(v))]
    rc = cli.main(["train", "--data", str(corpus), "--out", str(out), "--steps", "6", "--lr", "3e38",
                   "--weight-decay", "0",
                   "--keep-checkpoints", "2", "--no-progress", *flags])
    err = capsys.readouterr().err
    assert rc == cli.EXIT_DIVERGED, err
    root = out / "checkpoints"
    saved = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    assert all(all_finite(p) for p in saved), [p.name for p in saved if not all_finite(p)]
    if (root / "LATEST").exists():
        assert all_finite(root / (root / "LATEST").read_text().strip())
    named = re.search(r"last good checkpoint (\S+) was left untouched", err)
    if named:  # "last good" is only said of a checkpoint that is
        assert all_finite(out / "checkpoints" / named.group(1).rstrip(".").split("/")[-1])
    else:
        assert "no checkpoint had been written yet" in err
    assert "non-finite" in err or "loss is" in err or "gradient norm is" in err


def damage(path, key_suffix, value):
    tensors = load_file(path)
    key = sorted(k for k in tensors if k.endswith(key_suffix))[0]
    tensors[key] = tensors[key].copy()
    tensors[key].flat[0] = value
    save_file(path, tensors)
    forget_digest(path.parent, path.name)  # its values checked, not its bytes (test_checkpoint_digests.py)
    return key


@pytest.mark.parametrize("file, suffix, value, what", [
    ("model.safetensors", "in_proj.weight", np.nan, "non-finite"),
    ("model.safetensors", "A_log", np.inf, "non-finite"),
    ("optimizer.safetensors", "/exp_avg", np.nan, "non-finite"),
    ("optimizer.safetensors", "/exp_avg_sq", np.inf, "non-finite"),
    ("optimizer.safetensors", "/exp_avg_sq", -1e-3, "negative"),
])
def test_a_non_finite_checkpoint_is_refused_on_load(run, capsys, file, suffix, value, what):
    path = run / "checkpoints" / "step-000002" / file
    key = damage(path, suffix, value)
    log_before = (run / "log.jsonl").read_bytes()
    assert cli.main(["train", "--resume", str(run), "--no-progress"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert f"step-000002/{file}" in err and key in err and what in err, err
    assert "resume from another checkpoint" in err and "step-000001" in err
    assert (run / "log.jsonl").read_bytes() == log_before  # nothing written
    assert (run / "checkpoints" / "LATEST").read_text().strip() == "step-000002"


@pytest.mark.parametrize("bad", ["weights", "exp_avg_sq"])
def test_save_checkpoint_refuses_non_finite_state_and_writes_nothing(tmp_path, bad):
    model = small_model(dtype="float32")
    moments = {"decay/state/w/exp_avg": np.zeros(3, np.float32), "decay/state/w/exp_avg_sq": np.ones(3, np.float32)}
    if bad == "weights":
        name, var = model.varmap.named_vars()[0]
        var.data.flat[0] = np.nan
    else:
        moments["decay/state/w/exp_avg_sq"][1] = -1.0
    with pytest.raises(ckpt.NonFiniteCheckpoint, match="not written"):
        ckpt.save_checkpoint(tmp_path, 1, model, moments, {"tokens": 0, "run_id": "abc"})
    assert list(tmp_path.iterdir()) == []  # no checkpoints/ folder, no LATEST, no temporary folder


def test_the_weights_are_checked_after_the_update(run, monkeypatch, capsys):
    """An update that makes a weight non-finite (a finite loss and gradient norm) stops the run before any
    save; the message names the tensor and says which checkpoint is the last good one."""
    from tinygrad_ssm.optim import AdamW
    real_step = AdamW.step

    def poisoned_step(self):
        real_step(self)
        self.params[0][1].data.flat[0] = np.inf

    monkeypatch.setattr(AdamW, "step", poisoned_step)
    before = json.loads((run / "checkpoints" / "step-000002" / "trainer_state.json").read_text())
    assert cli.main(["train", "--resume", str(run), "--no-progress"]) == cli.EXIT_DIVERGED
    err = capsys.readouterr().err
    assert "non-finite" in err and "step-000002 was left untouched" in err
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["LATEST", "step-000001", "step-000002"]
    assert json.loads((run / "checkpoints" / "step-000002" / "trainer_state.json").read_text()) == before


def test_a_resume_into_a_new_out_whose_checkpoint_is_refused_leaves_no_folder(run, tmp_path, capsys):
    """--resume CKPT --out NEW: the new folder (its marker and lock) was made before the checkpoint's weights and
    moments were checked, and stayed when they were refused (found by a fuzz of the command line)."""
    damage(run / "checkpoints" / "step-000002" / "optimizer.safetensors", "/exp_avg", np.nan)
    new = tmp_path / "new" / "run"
    assert cli.main(["train", "--resume", str(run), "--out", str(new), "--no-progress"]) == cli.EXIT_USAGE
    assert "non-finite" in capsys.readouterr().err
    assert not new.exists()
