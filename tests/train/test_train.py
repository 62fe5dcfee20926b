"""The training loop: it learns, resumes bit for bit, stops cleanly on Ctrl-C and on a NaN loss."""
import hashlib
import json
import signal
from pathlib import Path

import numpy as np
import pytest

import tinygrad_ssm.optim as optim_pkg
from tinygrad_ssm.train import checkpoint as ckpt
from tinygrad_ssm.train.data import DEFAULT_VAL_FRACTION, DataError, default_corpus_root, stdlib_sources
from tinygrad_ssm.train.data import unigram_entropy_bits
from tinygrad_ssm.io.safetensors import load_file
from tinygrad_ssm.autograd.tensor import no_grad
from tinygrad_ssm.optim import AdamW
from tinygrad_ssm.train.loop import TrainConfig, TrainingDiverged
from tinygrad_ssm.train.loop import train

from tests.support.training import quiet

TINY = dict(d_model=32, n_layer=1, d_state=16, headdim=16, batch_size=4, seq_len=32, eval_batches=1,
            sample_bytes=8, lr=1e-2, min_lr=1e-3, warmup_steps=2)


@pytest.fixture(scope="module")
def slice_file(tmp_path_factory):
    """A fixed slice of the corpus: the first 24 standard library modules, sorted by path (~0.5 MB)."""
    root = default_corpus_root()
    files = stdlib_sources(root)[:24]
    text = b"".join(p.read_bytes() for p in files)
    path = tmp_path_factory.mktemp("corpus") / "slice.py"
    path.write_bytes(text)
    return path


def tiny(slice_file, out, **kw):
    return TrainConfig(**{**TINY, "data": str(slice_file), "out": str(out), **kw})


def file_digests(folder: Path) -> dict:
    """name -> sha256 of every file (digests: a failing comparison prints short, not megabytes)."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def assert_same_tensors(file_a: Path, file_b: Path):
    """Byte-identical safetensors files; on a mismatch, name the tensors that differ."""
    if file_a.read_bytes() == file_b.read_bytes():
        return
    a, b = load_file(file_a), load_file(file_b)
    differ = sorted(k for k in a.keys() | b.keys() if k not in a or k not in b or
                    a[k].tobytes() != b[k].tobytes())
    raise AssertionError(f"{file_a} and {file_b} differ in {len(differ)} tensors: {differ[:8]}")


def test_learns_well_below_the_unigram_entropy(slice_file, tmp_path):
    data = np.frombuffer(slice_file.read_bytes(), dtype=np.uint8)
    val = data[len(data) - int(len(data) * DEFAULT_VAL_FRACTION):]
    entropy = unigram_entropy_bits(val)
    cfg = tiny(slice_file, tmp_path, d_model=64, headdim=32, batch_size=16, seq_len=64, steps=60, lr=2e-2,
               warmup_steps=6, eval_every=60, eval_batches=4, checkpoint_every=1000)
    result = train(cfg, progress=False, say=quiet)
    assert result.status == "done" and result.step == 60
    assert result.unigram_bits == pytest.approx(entropy)
    # well below what a context-free model can reach: the model uses context
    assert result.val_bpb < entropy - 1.0, (result.val_bpb, entropy)
    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    train_bpb = [r["train_bpb"] for r in records if "train_bpb" in r]
    assert len(train_bpb) == 60
    assert np.mean(train_bpb[-10:]) < entropy - 1.0 < np.mean(train_bpb[:3])



@pytest.mark.parametrize("steps, want", [
    # lr 1e-2, min_lr 1e-3, warmup 2: lr (s + 1) / 2, then min_lr + (lr - min_lr) (1 + cos(pi (s - 2) / 3)) / 2
    (5, [5e-3, 1e-2, 1e-2, 1e-3 + 9e-3 * 0.75, 1e-3 + 9e-3 * 0.25]),
    (1, [1e-2]),                              # --steps 1: the default warmup (not given) shortened to 1 step
])
def test_the_logged_learning_rate_is_warmup_then_cosine_over_the_runs_steps(slice_file, tmp_path, steps, want):
    """Each step's lr in log.jsonl is the schedule's (optim.WarmupCosine): a linear warmup of warmup_steps (at most
    the run's steps) to --lr, then a cosine to --min-lr over the rest of the run's own --steps. (A warmup given,
    as a flag or a TrainConfig field, longer than the run is refused: test_train_api.py.)"""
    warmup = {} if steps > 1 else {"warmup_steps": TrainConfig().warmup_steps}
    cfg = tiny(slice_file, tmp_path, steps=steps, eval_every=1000, checkpoint_every=1000, **warmup)
    assert train(cfg, progress=False, say=quiet).status == "done"
    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["lr"] for r in records if "train_loss" in r] == pytest.approx(want, rel=1e-12)

def test_resume_is_bit_identical(slice_file, tmp_path):
    common = dict(steps=6, eval_every=3, checkpoint_every=2, keep_checkpoints=10)
    whole = train(tiny(slice_file, tmp_path / "whole", **common), progress=False, say=quiet)

    def ctrl_c_at_step_3(info):
        if info.step == 3:
            signal.raise_signal(signal.SIGINT)  # the real Ctrl-C path: the handler lets the step finish

    before = signal.getsignal(signal.SIGINT)
    first = train(tiny(slice_file, tmp_path / "split", **common), progress=False, say=quiet,
                  callback=ctrl_c_at_step_3)
    assert first.status == "interrupted" and first.step == 3
    assert first.checkpoint.name == "step-000003"
    assert signal.getsignal(signal.SIGINT) is before  # the Ctrl-C handler is only installed while training
    second = train(resume=str(tmp_path / "split"), progress=False, say=quiet)
    assert second.status == "done" and second.step == 6 and second.tokens == whole.tokens

    for name in ("model.safetensors", "optimizer.safetensors"):
        assert_same_tensors(whole.checkpoint / name, second.checkpoint / name)
    state = ckpt.load_trainer_state(second.checkpoint)
    assert state["sampler"] == ckpt.load_trainer_state(whole.checkpoint)["sampler"]
    assert second.val_bpb == whole.val_bpb

    # resuming from an older checkpoint (step 2) redoes step 3: same weights again, and a clean log
    third = train(resume=str(tmp_path / "split" / "checkpoints" / "step-000002"), progress=False, say=quiet)
    assert_same_tensors(third.checkpoint / "model.safetensors", whole.checkpoint / "model.safetensors")
    steps = [r["step"] for r in map(json.loads, (tmp_path / "split" / "log.jsonl").read_text().splitlines())
             if "train_loss" in r]
    assert steps == [1, 2, 3, 4, 5, 6]


def test_keyboard_interrupt_writes_a_checkpoint(slice_file, tmp_path):
    def interrupt(info):
        if info.step == 2:
            raise KeyboardInterrupt

    result = train(tiny(slice_file, tmp_path, steps=10, checkpoint_every=100), progress=False, say=quiet,
                   callback=interrupt)
    assert result.status == "interrupted" and result.step == 2
    assert ckpt.resolve_checkpoint(tmp_path) == tmp_path / "checkpoints" / "step-000002"
    assert ckpt.load_trainer_state(result.checkpoint)["step"] == 2


def test_ctrl_c_while_the_last_checkpoint_is_written_waits_for_it(slice_file, tmp_path, monkeypatch):
    """The final save ran after the Ctrl-C handler was gone: a Ctrl-C then (a 1.5 GB write at the 130M shape
    takes seconds) stopped the write, and every step since the last checkpoint was lost."""
    messages, real_save = [], ckpt.save_checkpoint

    def save_with_ctrl_c_inside(*args, **kwargs):
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)
        return real_save(*args, **kwargs)

    def ctrl_c_at_step_3(info):
        if info.step == 3:
            monkeypatch.setattr(ckpt, "save_checkpoint", save_with_ctrl_c_inside)
            signal.raise_signal(signal.SIGINT)

    before = signal.getsignal(signal.SIGINT)
    result = train(tiny(slice_file, tmp_path, steps=10, checkpoint_every=100), progress=False,
                   say=messages.append, callback=ctrl_c_at_step_3)
    assert result.status == "interrupted" and result.checkpoint.name == "step-000003"
    assert ckpt.load_trainer_state(ckpt.resolve_checkpoint(tmp_path))["step"] == 3
    assert sum("the checkpoint is being written; stopping as soon as it is complete" in m for m in messages) == 1
    assert signal.getsignal(signal.SIGINT) is before



def test_sigterm_stops_after_the_step_with_a_checkpoint_as_ctrl_c_does(slice_file, tmp_path, monkeypatch):
    """`kill PID`, a scheduler's time limit or preemption: SIGTERM ended the process at once, losing every step
    since the last checkpoint; now it stops the run as a first Ctrl-C does, and one during the last save waits
    for it."""
    messages, real_save = [], ckpt.save_checkpoint

    def save_with_sigterm_inside(*args, **kwargs):
        signal.raise_signal(signal.SIGTERM)
        return real_save(*args, **kwargs)

    def sigterm_at_step_2(info):
        if info.step == 2:
            monkeypatch.setattr(ckpt, "save_checkpoint", save_with_sigterm_inside)
            signal.raise_signal(signal.SIGTERM)

    class SigtermNotTaken(Exception):
        pass

    def not_taken(signum, frame):  # the training left SIGTERM to the handler before it (by default: the process ends)
        raise SigtermNotTaken("SIGTERM reached the handler installed before train(): the training did not take it")

    before = signal.signal(signal.SIGTERM, not_taken)
    try:
        result = train(tiny(slice_file, tmp_path, steps=10, checkpoint_every=100), progress=False,
                       say=messages.append, callback=sigterm_at_step_2)
        assert signal.getsignal(signal.SIGTERM) is not_taken
    finally:
        signal.signal(signal.SIGTERM, before)
    assert result.status == "interrupted" and result.step == 2 and result.checkpoint.name == "step-000002"
    assert ckpt.load_trainer_state(ckpt.resolve_checkpoint(tmp_path))["step"] == 2
    assert "SIGTERM: stopping after this step and writing a checkpoint (SIGTERM again to stop now)" in messages
    assert "SIGTERM: the checkpoint is being written; stopping as soon as it is complete" in messages

def test_a_second_sigterm_is_named_as_sigterm_not_ctrl_c(monkeypatch, capsys):
    """The second signal stops at once; the message names the signal that came (it said Ctrl-C for SIGTERM)."""
    from tinygrad_ssm.train import cli
    from tinygrad_ssm.train.sigint import StopOnSigint
    messages = []
    with StopOnSigint(messages.append):
        signal.raise_signal(signal.SIGTERM)
        with pytest.raises(KeyboardInterrupt) as stopped:
            signal.raise_signal(signal.SIGTERM)
    assert stopped.value.args == ("SIGTERM",)

    def train_stopped_twice(*args, **kwargs):
        raise stopped.value
    monkeypatch.setattr(cli, "train", train_stopped_twice)
    assert cli.main(["train", "--steps", "1", "--no-progress"]) == cli.EXIT_INTERRUPTED
    assert capsys.readouterr().err.strip().endswith("stopped by SIGTERM")


def test_nan_loss_stops_and_leaves_the_last_checkpoint_untouched(slice_file, tmp_path):
    snapshot = {}

    def corrupt_after_step_4(info):
        if info.step == 4:  # the step-4 checkpoint is written before the callback runs
            snapshot.update(file_digests(ckpt.resolve_checkpoint(tmp_path)))
            name, weight = info.model.varmap.named_vars()[0]
            with no_grad():
                weight.data[...] = np.nan  # as if an update had blown the weights up

    with pytest.raises(TrainingDiverged, match=r"loss is nan at step 5 .*step-000004 was left untouched"):
        train(tiny(slice_file, tmp_path, steps=10, checkpoint_every=2), progress=False, say=quiet,
              callback=corrupt_after_step_4)
    latest = ckpt.resolve_checkpoint(tmp_path)
    assert latest.name == "step-000004" and file_digests(latest) == snapshot
    leftovers = [p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".")]
    assert leftovers == []


def assert_weights_are_the_checkpoint(model, checkpoint: Path):
    """The weights in memory are exactly those saved in `checkpoint`: no update was applied since."""
    saved = load_file(checkpoint / "model.safetensors")
    named = dict(model.varmap.named_vars())
    assert set(saved) == set(named)
    moved = sorted(n for n, t in named.items() if saved[n].tobytes() != np.ascontiguousarray(t.data).tobytes())
    assert moved == [], f"updated after the last checkpoint: {moved[:8]}"


@pytest.mark.parametrize("bad", [np.inf, np.nan])
def test_non_finite_gradient_stops_before_the_update(slice_file, tmp_path, monkeypatch, bad):
    """The loss stays finite, one gradient entry does not: the run must stop before AdamW turns the
    weights into NaN, and leave the last checkpoint as it was."""
    seen = {}

    def keep_step_4(info):
        if info.step == 4:  # the step-4 checkpoint is written before the callback runs
            seen.update(model=info.model, digests=file_digests(ckpt.resolve_checkpoint(tmp_path)))

    real_clip = optim_pkg.clip_grad_norm_

    def clip_with_one_bad_gradient(params, max_norm, **kw):
        if "model" in seen:  # step 5: backward is done, the loss was finite
            grad = next(p.grad for p in params if p.grad is not None)
            grad.data.flat[0] = bad
        return real_clip(params, max_norm, **kw)

    # train() imports clip_grad_norm_ from tinygrad_ssm.optim when it starts, so patch it there
    monkeypatch.setattr(optim_pkg, "clip_grad_norm_", clip_with_one_bad_gradient)
    with pytest.raises(TrainingDiverged, match=rf"gradient norm is {bad} at step 5 .*step-000004 was left "
                                               rf"untouched"):
        train(tiny(slice_file, tmp_path, steps=10, checkpoint_every=2), progress=False, say=quiet,
              callback=keep_step_4)
    latest = ckpt.resolve_checkpoint(tmp_path)
    assert latest.name == "step-000004" and file_digests(latest) == seen["digests"]
    assert_weights_are_the_checkpoint(seen["model"], latest)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["LATEST", "step-000002",
                                                                             "step-000004"]


def test_ctrl_c_twice_during_the_weight_update_lets_the_step_finish_and_saves_it_whole(slice_file, tmp_path,
                                                                                       monkeypatch):
    """Ctrl-C twice while AdamW is half-way through an update (one parameter group updated, the other not): half-updated
    weights must never become a checkpoint. The second Ctrl-C used to stop there and save nothing (every step since
    the last checkpoint lost); a second Ctrl-C between the update and the step's log record saved the step without
    its record or its tokens (a fuzz of interruptions). Now the update, its counters and its record finish (a
    fraction of a second), then the run stops with the step saved whole, and a resume ends as the run never stopped."""
    messages, done = [], {}
    real_step = AdamW.step

    def step_then_ctrl_c_twice(self):
        real_step(self)
        if done.get("steps") == 4 and "interrupted" not in done:   # step 5, after the first parameter group
            done["interrupted"] = True
            signal.raise_signal(signal.SIGINT)  # first: "stop after this step"
            signal.raise_signal(signal.SIGINT)  # second: held until the step is whole, then KeyboardInterrupt

    monkeypatch.setattr(AdamW, "step", step_then_ctrl_c_twice)
    before = signal.getsignal(signal.SIGINT)
    try:
        stopped = train(tiny(slice_file, tmp_path / "run", steps=8, checkpoint_every=2), progress=False,
                        say=messages.append, callback=lambda info: done.__setitem__("steps", info.step))
    except KeyboardInterrupt:
        pytest.fail(f"the second Ctrl-C stopped the run in the middle of its update: {messages[-1:]}")
    assert signal.getsignal(signal.SIGINT) is before
    assert stopped.status == "interrupted" and stopped.step == 5 and "interrupted" in done
    assert ckpt.resolve_checkpoint(tmp_path / "run").name == "step-000005"
    monkeypatch.undo()
    train(resume=str(tmp_path / "run"), progress=False, say=quiet)
    train(tiny(slice_file, tmp_path / "whole", steps=8, checkpoint_every=2), progress=False, say=quiet)
    for name in ("model.safetensors", "optimizer.safetensors"):
        assert_same_tensors(ckpt.resolve_checkpoint(tmp_path / "run") / name,
                            ckpt.resolve_checkpoint(tmp_path / "whole") / name)

    def log(run):
        return [{k: v for k, v in r.items() if k not in ("tokens_per_s", "time")}
                for r in map(json.loads, (tmp_path / run / "log.jsonl").read_text().splitlines())]
    assert log("run") == log("whole")                 # every step's record, once, as the run never stopped had it


def test_bad_data_fails_before_any_work(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(DataError, match="does not exist"):
        train(TrainConfig(data=str(tmp_path / "missing"), out=str(out)), progress=False, say=quiet)
    short = tmp_path / "short.txt"
    short.write_bytes(b"x" * 100)
    with pytest.raises(DataError, match="--seq-len 512"):
        train(TrainConfig(data=str(short), out=str(out), seq_len=512), progress=False, say=quiet)
    assert not out.exists()


def test_resume_refuses_changed_settings_and_an_existing_run(slice_file, tmp_path):
    train(tiny(slice_file, tmp_path, steps=2), progress=False, say=quiet)
    with pytest.raises(ValueError, match=r"--d-model \(saved 32, given 64\)"):
        train(resume=str(tmp_path), overrides={"d_model": 64}, progress=False, say=quiet)
    with pytest.raises(FileExistsError, match="already holds a run"):
        train(tiny(slice_file, tmp_path, steps=2), progress=False, say=quiet)


def test_resume_takes_a_flag_given_with_the_saved_value_and_only_the_safe_changes():
    """--resume compares each given flag with the saved run's: the same value (a command line repeated whole) is
    no change; --steps and the RESUME_SAFE settings may change; anything else is refused, named."""
    from tinygrad_ssm.train.config import _resume_config
    saved = TrainConfig(d_model=32, seq_len=64, steps=10).to_dict()
    cfg = _resume_config(saved, {"d_model": 32, "seq_len": 64, "steps": 20})
    assert (cfg.d_model, cfg.seq_len, cfg.steps) == (32, 64, 20)
    with pytest.raises(ValueError, match=r"--seq-len \(saved 64, given 128\)") as refused:
        _resume_config(saved, {"d_model": 32, "seq_len": 128})
    assert "--d-model" not in str(refused.value)


def test_a_second_ctrl_c_during_a_validation_is_made_up_for_on_resume(slice_file, tmp_path, monkeypatch):
    """A second Ctrl-C during step N's validation saved step N without its validation, and the resumed run went on
    to N + 1: log.jsonl never had step N's val_bpb (a fuzz of interruptions). The resumed run validates step N
    first, and its log is the uninterrupted run's."""
    from tinygrad_ssm.train import loop
    real_evaluate, calls = loop.evaluate, []

    def evaluate_with_ctrl_c_twice(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:                                   # step 4's validation
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
        return real_evaluate(*args, **kwargs)

    monkeypatch.setattr(loop, "evaluate", evaluate_with_ctrl_c_twice)
    cfg = dict(steps=6, eval_every=2, checkpoint_every=3)
    stopped = train(tiny(slice_file, tmp_path / "run", **cfg), progress=False, say=quiet)
    assert stopped.status == "interrupted" and stopped.step == 4
    assert json.loads((ckpt.resolve_checkpoint(tmp_path / "run") / "trainer_state.json").read_text())[
        "val_bpb_step"] == 2
    monkeypatch.undo()
    said = []
    train(resume=str(tmp_path / "run"), progress=False, say=said.append)
    assert any(m.startswith("step 4: validation ") for m in said), said
    train(tiny(slice_file, tmp_path / "whole", **cfg), progress=False, say=quiet)

    def log(run):
        return [{k: v for k, v in r.items() if k != "tokens_per_s"}
                for r in map(json.loads, (tmp_path / run / "log.jsonl").read_text().splitlines())]
    assert log("run") == log("whole")
