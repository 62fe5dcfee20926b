"""Where a run stops, found by an audit of the training command (2026-12-06): a second Ctrl-C inside a step, a NaN
validation loss, a Ctrl-C in the end's sample or before the first step, and the schedule a resume continues."""
import json
import signal

import numpy as np
import pytest

import tinygrad_ssm.optim as optim_pkg
from tinygrad_ssm.io.checkpoints import STATE_DIGEST, state_digest
from tinygrad_ssm.io.safetensors import load_file
from tinygrad_ssm.train import checkpoint as ckpt
from tinygrad_ssm.train import cli, loop
from tinygrad_ssm.train.loop import TrainConfig, TrainingDiverged, train

from tests.support.training import TINY, quiet


def _cfg(corpus, out, **kw):
    return TrainConfig(**{**TINY, "data": str(corpus), "out": str(out), **kw})


def test_a_second_ctrl_c_inside_a_step_saves_a_checkpoint_that_resumes_as_the_whole_run(corpus, tmp_path,
                                                                                       monkeypatch):
    """The step had drawn its batch when the second Ctrl-C stopped it: the checkpoint saved the step count of the
    step before with the sampler one batch on, and --resume refused it ("the sampler's batches_drawn says 5")."""
    whole = train(_cfg(corpus, tmp_path / "whole", steps=4, checkpoint_every=100), progress=False, say=quiet)
    real_clip, calls = optim_pkg.clip_grad_norm_, []

    def clip_then_ctrl_c(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:                                              # inside step 3, before its update
            raise KeyboardInterrupt("Ctrl-C")
        return real_clip(*args, **kwargs)
    monkeypatch.setattr(optim_pkg, "clip_grad_norm_", clip_then_ctrl_c)
    cut = train(_cfg(corpus, tmp_path / "cut", steps=4, checkpoint_every=100), progress=False, say=quiet)
    assert cut.status == "interrupted" and cut.step == 2
    monkeypatch.undo()
    resumed = train(resume=str(tmp_path / "cut"), progress=False, say=quiet)
    assert resumed.status == "done" and resumed.step == 4
    assert load_file(resumed.checkpoint / "model.safetensors").keys() == load_file(
        whole.checkpoint / "model.safetensors").keys()
    for name, array in load_file(whole.checkpoint / "model.safetensors").items():
        assert np.array_equal(load_file(resumed.checkpoint / "model.safetensors")[name], array), name


def test_a_nan_validation_loss_stops_the_run_and_saves_nothing(corpus, tmp_path, monkeypatch):
    """The run printed "validation nan bits per byte", saved a checkpoint holding val_bpb NaN that its own --resume
    refused, and called it the last good one when the next step diverged."""
    real, calls = loop.evaluate, []

    def nan_at_the_second_validation(model, data, cfg, *args):
        calls.append(1)
        return float("nan") if len(calls) == 2 else real(model, data, cfg, *args)
    monkeypatch.setattr(loop, "evaluate", nan_at_the_second_validation)
    with pytest.raises(TrainingDiverged, match=r"the validation loss is nan after step 2 .* nothing was saved; "
                                               r"the last good checkpoint .*step-000001"):
        train(_cfg(corpus, tmp_path / "run", steps=4, eval_every=1), progress=False, say=quiet)
    assert ckpt.resolve_checkpoint(tmp_path / "run").name == "step-000001"
    monkeypatch.undo()
    assert train(resume=str(tmp_path / "run"), progress=False, say=quiet, stop_at=2).status == "stopped"


def test_a_ctrl_c_during_the_ends_sample_stops_it(corpus, tmp_path, monkeypatch):
    """A Ctrl-C after the last step (during its validation, or the sample) was acknowledged ("stopping after this
    step") and then ignored while a long sample was generated; a SIGTERM ran on for minutes."""
    said = []
    pieces = []

    def ctrl_c_at_the_first_piece(piece):
        pieces.append(piece)
        if len(pieces) == 1:
            signal.raise_signal(signal.SIGINT)
    real_sample = loop.sample_text

    def sample_with_ctrl_c(*args, on_piece=None, **kwargs):
        return real_sample(*args, on_piece=lambda piece: (ctrl_c_at_the_first_piece(piece), on_piece(piece)),
                           **kwargs)
    monkeypatch.setattr(loop, "sample_text", sample_with_ctrl_c)
    result = train(_cfg(corpus, tmp_path / "run", steps=2, sample_bytes=100_000), progress=False, say=said.append)
    assert result.status == "done" and result.sample is None and len(pieces) == 1
    assert any("the run is done and saved; the sample is left out" in m for m in said), said
    assert ckpt.resolve_checkpoint(tmp_path / "run").name == "step-000002"


def test_a_ctrl_c_before_the_first_step_says_to_start_again(corpus, tmp_path, monkeypatch):
    """It said "checkpoint None" and "continue with: ... --resume RUN", which then failed: nothing was saved."""
    said = []
    monkeypatch.setattr(optim_pkg, "clip_grad_norm_", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
    result = train(_cfg(corpus, tmp_path / "run", steps=3), progress=False, say=said.append)
    assert result.status == "interrupted" and result.step == 0
    text = "\n".join(said)
    assert "before the first checkpoint; nothing was saved" in text and "--resume" not in text
    assert f"train --out {tmp_path / 'run'} and its flags" in text


def test_a_resume_with_more_steps_does_not_warm_up_again(corpus, tmp_path):
    """A run of 6 steps warmed up over all 6 (the default warmup is 10); its printed "train on" resume with --steps
    12 then warmed up again from the sixth step to the tenth: the learning rate fell and rose."""
    cfg = _cfg(corpus, tmp_path / "run", steps=6, warmup_steps=10, checkpoint_every=100)
    train(cfg, progress=False, say=quiet)
    train(resume=str(tmp_path / "run"), overrides={"steps": 12}, progress=False, say=quiet)
    lrs = [r["lr"] for r in map(json.loads, (tmp_path / "run" / "log.jsonl").read_text().splitlines())
           if "train_loss" in r]
    assert len(lrs) == 12 and np.argmax(lrs) == 5                         # the peak at step 6, where warmup ended
    assert all(b <= a for a, b in zip(lrs[5:], lrs[6:]))                   # then only down


def test_resume_takes_min_lr_of_the_default_value(corpus, tmp_path, capsys):
    """--min-lr 0.001 on a run saved with the default (lr / 10 = 0.001) was refused as a change ("saved None")."""
    out = tmp_path / "run"
    flags = ["--data", str(corpus), "--d-model", "32", "--n-layer", "1", "--d-state", "16", "--headdim", "16",
             "--batch-size", "2", "--seq-len", "32", "--eval-batches", "1", "--sample-bytes", "4", "--no-progress",
             "--lr", "0.01"]
    assert cli.main(["train", *flags, "--steps", "2", "--out", str(out)]) == cli.EXIT_OK
    assert cli.main(["train", "--resume", str(out), "--steps", "3", "--min-lr", "0.001", "--no-progress"]) == 0
    assert cli.main(["train", "--resume", str(out), "--steps", "4", "--min-lr", "0.002",
                     "--no-progress"]) == cli.EXIT_USAGE                   # another value is still a change
    assert "--min-lr (saved None, given 0.002)" in capsys.readouterr().err


def test_a_huge_batch_in_micro_batches_is_refused_naming_the_batch(corpus, tmp_path, capsys):
    """--batch-size 10**18 --grad-accum 10**18 passed the memory check (one micro-batch of 1) and then failed to
    allocate the global batch's 6.9 EiB of ids: a traceback and exit 1, the divergence status."""
    huge = str(10 ** 18)
    assert cli.main(["train", "--data", str(corpus), "--out", str(tmp_path / "run"), "--batch-size", huge,
                     "--grad-accum", huge, "--no-progress"]) == cli.EXIT_USAGE
    assert f"--batch-size {huge}" in capsys.readouterr().err


def test_a_resume_with_another_thread_count_says_it_is_not_bit_for_bit(run, capsys):
    """The fused products cut their work into one BLAS call per thread, whose rounding can differ (an audit of
    determinism: float64 runs with 1 and 2 threads differed in the last digits); the checkpoint records its count."""
    import numba
    checkpoint = run / "checkpoints" / "step-000002"
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    assert state["threads"] == numba.get_num_threads()
    state["threads"] += 1
    state[STATE_DIGEST] = state_digest(state)                # as a run on another thread count saved it
    (checkpoint / "trainer_state.json").write_text(json.dumps(state))
    assert cli.main(["train", "--resume", str(run), "--no-progress", "--steps", "3"]) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert (f"note: saved with {state['threads']} thread(s), resumed with {numba.get_num_threads()}" in out and
            f"NUMBA_NUM_THREADS={state['threads']} continues bit for bit" in out), out


def test_a_second_ctrl_c_numba_swallowed_inside_a_step_still_saves(corpus, tmp_path, monkeypatch):
    """The second Ctrl-C landing while numba read a kernel's arguments came out as numba's TypeError: the run
    ended in a traceback, nothing saved, where a second Ctrl-C inside a step saves the step before."""
    from tests.train.test_generate_errors import ctrl_c_swallowed_as_numba_does
    real_clip, calls = optim_pkg.clip_grad_norm_, []

    def clip_then_two_ctrl_c(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:                                              # inside step 3, before its update
            signal.raise_signal(signal.SIGINT)                           # the first: stop after this step
            ctrl_c_swallowed_as_numba_does()                             # the second, lost inside numba
        return real_clip(*args, **kwargs)
    monkeypatch.setattr(optim_pkg, "clip_grad_norm_", clip_then_two_ctrl_c)
    said = []
    cut = train(_cfg(corpus, tmp_path / "cut", steps=4, checkpoint_every=100), progress=False, say=said.append)
    assert cut.status == "interrupted" and cut.step == 2
    assert ckpt.load_trainer_state(ckpt.resolve_checkpoint(tmp_path / "cut"))["step"] == 2


def test_a_diverging_run_says_one_error_line_without_numpys_warnings(corpus, tmp_path, capsys):
    """--lr 1e18 printed NumPy's "overflow encountered in exp" (and its source line) before the run's own error:
    the commands check every result for non-finite values and say so, so NumPy's warnings are noise there."""
    import warnings
    from tests.train.test_cli import TINY_FLAGS
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code = cli.main(["train", "--data", str(corpus), "--steps", "4", "--lr", "1e18", "--weight-decay", "0",
                         "--warmup-steps", "0",
                         "--out", str(tmp_path / "run"), *TINY_FLAGS])
    assert code == cli.EXIT_DIVERGED and "training diverged" in capsys.readouterr().err
    assert not [w for w in caught if issubclass(w.category, RuntimeWarning)], [str(w.message) for w in caught]
    assert np.geterr()["over"] == "warn"                                 # the caller's settings as they were


def test_a_second_ctrl_c_while_the_curves_are_drawn_has_said_how_to_continue(corpus, tmp_path, monkeypatch):
    """After a stop the end drew the curves (matplotlib's first import: half a second) before it said where the
    checkpoint is: a second Ctrl-C there ended the run with "stopped by Ctrl-C" alone (a fuzz of interruptions)."""
    said = []
    monkeypatch.setattr(loop, "plot_curves", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt("Ctrl-C")))
    with pytest.raises(KeyboardInterrupt):
        train(_cfg(corpus, tmp_path / "run", steps=3), progress=False, say=said.append,
              callback=lambda info: info.step == 1 and signal.raise_signal(signal.SIGINT))
    text = "\n".join(said)
    assert f"stopped at step 1/3; checkpoint {tmp_path / 'run' / 'checkpoints' / 'step-000001'}" in text, said
    assert f"continue with: python -m tinygrad_ssm train --resume {tmp_path / 'run'}" in text


def test_a_ctrl_c_while_the_first_message_is_written_is_one_line(corpus, tmp_path, monkeypatch, capsys):
    """tqdm.write makes its lock at the first message: a Ctrl-C landing there left tqdm's `finally` releasing a lock
    that was never made, an AttributeError traceback and exit status 1 (a fuzz of interruptions)."""
    import tqdm as tqdm_package
    from tqdm import tqdm
    monkeypatch.delattr(tqdm, "_lock", raising=False)
    made = []

    def interrupted_lock(*args, **kwargs):       # the Ctrl-C arrives while the lock is being made, the first time
        made.append(1)
        if len(made) == 1:
            raise KeyboardInterrupt
        return real_lock(*args, **kwargs)
    real_lock = tqdm_package.std.TqdmDefaultWriteLock
    monkeypatch.setattr(tqdm_package.std, "TqdmDefaultWriteLock", interrupted_lock)
    code = cli.main(["train", "--data", str(corpus), "--out", str(tmp_path / "run"), "--steps", "2", "--no-progress"])
    err = capsys.readouterr().err
    assert code == cli.EXIT_INTERRUPTED and "Traceback" not in err and "AttributeError" not in err, err
    monkeypatch.delattr(tqdm, "_lock", raising=False)


def test_a_sigterm_while_a_run_is_set_up_stops_it_as_a_ctrl_c(corpus, tmp_path):
    """Before the training loop takes the signals over, SIGTERM killed the process (exit 143, no word) where the
    help says 130 for it as for Ctrl-C (a fuzz of interruptions): python -m tinygrad_ssm takes it from the start."""
    import subprocess
    import sys
    script = ("import os, runpy, signal, sys\n"
              "import tinygrad_ssm.train.loop as loop\n"
              "real = loop._setup\n"
              "def setup(*args, **kwargs):\n"
              "    os.kill(os.getpid(), signal.SIGTERM)   # a scheduler's SIGTERM while the run is set up\n"
              "    return real(*args, **kwargs)\n"
              "loop._setup = setup\n"
              f"sys.argv = ['tinygrad_ssm', 'train', '--data', {str(corpus)!r}, '--out', {str(tmp_path / 'run')!r}, "
              "'--steps', '1', '--no-progress']\n"
              "runpy.run_module('tinygrad_ssm', run_name='__main__', alter_sys=True)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == cli.EXIT_INTERRUPTED and "stopped by SIGTERM" in done.stderr, (done.returncode,
                                                                                            done.stderr[-2000:])
    assert "Traceback" not in done.stderr
