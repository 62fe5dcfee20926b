"""One optimizer step of a training run (`train_step`), and how a run that diverges says so.

The step: draw the global batch, take this rank's rows of it, run them through the model in --grad-accum equal
micro-batches (one forward and backward each: the activations of one micro-batch at a time, the gradients
summed in .grad), average the gradients over the MPI ranks, clip their global norm, update with AdamW. Each
micro-batch's loss is divided by their number, so the sum is the gradient of the mean loss over the rank's
share: the step computes what one batch of the whole share computes, up to the order of the sums. Under MPI
the backwards before the last keep their gradients at home (`GradientAllreducer.no_sync`); the last one sends
the sums, bucket by bucket, while it runs.

A NaN or infinite loss or gradient norm raises TrainingDiverged before the update; an update that makes a weight
non-finite raises it before anything is saved: the message names the last good checkpoint.
"""
from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path

import numpy as np

from . import checkpoint as ckpt
from .data import bits_per_byte


class TrainingDiverged(RuntimeError):
    """The loss or the gradient norm became NaN or infinite; nothing was written after the last good step."""


def last_good(last_ckpt: Path | None) -> str:
    """What a stopped run leaves to go on from (its checkpoints are written only while the weights are good)."""
    return (f"the last good checkpoint {last_ckpt} was left untouched" if last_ckpt is not None
            else "no checkpoint had been written yet")


def diverged_message(what: str, step: int, lr: float, last_ckpt: Path | None) -> str:
    return (f"training diverged: {what} at step {step} (lr {lr:.3g}); stopped without updating the weights; "
            f"{last_good(last_ckpt)}. Try a lower --lr or more --warmup-steps.")


def train_step(run, stop_signal: int = 0) -> dict:
    """One optimizer step of `run` (loop._Run): batch, loss, backward, clip, AdamW. Returns the step's log record.
    Under MPI the rank's rows of the global batch; the loss and the gradients averaged over ranks, and each rank
    told which got a Ctrl-C or SIGTERM (stop_signal: this rank's signal number, 0 for none)."""
    t0 = time.perf_counter()
    lr = run.schedule(run.step)
    step, drawn_before = run.step, run.sampler.state_dict()
    x, y = run.sampler.next_batch()  # (b, l) each: the global batch, the same on every rank
    try:
        return _step_on(run, x, y, lr, stop_signal, t0)
    except BaseException:
        if run.step == step:  # the step was not done: a checkpoint saved now (a second Ctrl-C) would skip its batch
            run.sampler.load_state_dict(drawn_before)
        raise


def _step_on(run, x, y, lr: float, stop_signal: int, t0: float) -> dict:
    """train_step after its batch (x, y) is drawn; run.step counts the step once its update is done."""
    rows = slice(run.world.rank * len(x) // run.world.size, (run.world.rank + 1) * len(x) // run.world.size)
    x, y = x[rows], y[rows]  # (b / ranks, l): this rank's share
    for opt in run.optimizers.values():
        opt.zero_grad()
    # --grad-accum N: the share in N equal micro-batches, one forward and backward each, freed before the next;
    # each loss divided by N, so that the gradients summed in .grad are those of the share's mean loss
    pieces = run.cfg.grad_accum
    micro = list(zip(np.split(x, pieces), np.split(y, pieces)))       # (b / ranks / N, l) each
    loss_sum = 0.0
    for xm, ym in micro[:-1]:
        loss = run.model.loss(xm, ym)
        loss_sum += float(loss.data)
        with _unsent(run.reducer):  # the sums go to the other ranks once, in the last backward
            (loss / pieces).backward()
        del loss
    loss = run.model.loss(*micro[-1])
    run.loss_val = (loss_sum + float(loss.data)) / pieces
    if run.world.size > 1:
        sums = run.world.sum([run.loss_val, *(np.arange(run.world.size) == run.world.rank) * stop_signal])
        run.loss_val, run.stop_signals = sums[0] / run.world.size, {r: int(s) for r, s in enumerate(sums[1:]) if s}
        run.stop_requested = bool(run.stop_signals)
    if not math.isfinite(run.loss_val):
        raise TrainingDiverged(diverged_message(f"loss is {run.loss_val}", run.step + 1, lr, run.last_ckpt))
    (loss / pieces).backward()
    del loss
    if run.reducer is not None:
        run.reducer.finish()
    grad_norm = float(run.clip(run.model.varmap.all_vars(), run.cfg.grad_clip))
    if not math.isfinite(grad_norm):
        raise TrainingDiverged(diverged_message(f"gradient norm is {grad_norm}", run.step + 1, lr, run.last_ckpt))
    # from the update to the step's log record a second Ctrl-C waits (run.hold_signals: sigint.py): a stop saved
    # then holds the whole step (its counters and record; a fuzz of interruptions found a checkpoint of step N with
    # no record of it in log.jsonl, and its tokens not counted)
    with run.hold_signals():
        run.in_update = True
        for opt in run.optimizers.values():
            opt.lr = lr
            opt.step()
        run.step += 1  # (before in_update ends: an interrupt between the two finds the update half-done: no save)
        run.in_update = False
        bad = ckpt.non_finite_problems(run.model.varmap.named_vars())
        if bad:  # a finite gradient times a huge lr: nothing after the last good checkpoint may be saved
            raise TrainingDiverged(f"training diverged: the update at step {run.step} (lr {lr:.3g}) made the "
                                   f"weights non-finite ({bad[0]}{f' and {len(bad) - 1} more' if len(bad) > 1 else ''})"
                                   f"; nothing was saved; {last_good(run.last_ckpt)}. Try a lower --lr or more "
                                   f"--warmup-steps.")
        n_tokens = x.size * run.world.size
        run.tokens += n_tokens
        dt = time.perf_counter() - t0
        run.train_s += dt
        run.rate = n_tokens / dt if run.rate is None else 0.9 * run.rate + 0.1 * n_tokens / dt
        record = {"step": run.step, "train_loss": run.loss_val,
                  "train_bpb": bits_per_byte(run.loss_val, run.corpus.train_tokens_per_byte), "lr": lr,
                  "grad_norm": grad_norm, "tokens": run.tokens, "tokens_per_s": n_tokens / dt}
        if run.reducer is not None:
            record["allreduce_s"] = run.reducer.last_finish_s
            record["buckets_sent_in_backward"] = f"{run.reducer.last_launched_early}/{len(run.reducer.buckets)}"
        if run.log is not None and run.world.is_root:
            run.log.append(record)
    return record


def _unsent(reducer):
    """The context of a micro-batch's backward whose gradients are not the step's last: under MPI they stay in
    .grad (the reducer's no_sync), alone there is nothing to hold back."""
    return reducer.no_sync() if reducer is not None else contextlib.nullcontext()
