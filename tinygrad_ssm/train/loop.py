"""Train a byte-level Mamba-2 language model: AdamW, warmup + cosine decay, gradient clipping.

One step (step.py): draw a batch, loss = mean cross entropy of the next byte, backward (in --grad-accum
micro-batches), clip the global gradient norm, AdamW update with the scheduled learning rate. Validation bits per
byte are measured on fixed windows of the validation files every `eval_every` steps. Checkpoints (see
train/checkpoint.py) hold everything that decides the next step: weights, optimizer moments, step, sampler state
(its RNG), config; so a resumed run continues bit for bit (with the same thread count and ranks: it says when not).

Stopping: Ctrl-C (or SIGTERM) finishes the step in progress, writes a checkpoint and returns ("interrupted"); a second
Ctrl-C stops at once and writes a checkpoint, but waits for a weight update under way to end with its step's counters
and log record (a fraction of a second: the checkpoint then holds a whole step), and a Ctrl-C during the checkpoint's
write waits for it (train/sigint.py). A step saved before its validation was done is validated first on resume.
Under MPI the handler stays until the run's end, any rank's first Ctrl-C stops every rank after the same step (rank 0
says which rank asked), and a second one aborts the job (exit 130).
A NaN or infinite loss or gradient norm raises TrainingDiverged before the update is applied, and writes nothing,
so the last good checkpoint stays as it was.

Under MPI (`mpiexec -n N python -m tinygrad_ssm train`, see distributed/ and docs/distributed.md) every rank
draws the same global batch and keeps its own 1/N of the rows; the gradients are averaged over the ranks
before clipping, so every rank applies the same AdamW step. Rank 0 alone prints, logs, plots and saves.
"""
from __future__ import annotations

import contextlib
import math
import os
import sys
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numba
import numpy as np

from .. import optim
from ..autograd.grad_mode import no_grad
from ..distributed import (SINGLE, DistributedError, GradientAllreducer, RanksDiverged, World,
                           broadcast_weights_and_optimizers, check_same_weights, launcher_world_size)
from . import checkpoint as ckpt
from .checks import divisors
from .config import VOCAB_SIZE, TrainConfig, _resume_config  # noqa: F401 (re-exported)
from .batches import BatchSampler, eval_batches
from .data import (Corpus, bits_per_byte, check_length, fingerprint_differences, load_corpus, sample_prompt_from,
                   tokenize, unigram_entropy_bits)
from .generate import escape_controls, sample_text
from .log import PLOT_FILE, RunLog, plot_curves, plot_unavailable_reason, progress_bar
from .mpi_cli import python_cmd
from .output_errors import EXIT_IO, io_cause
from .optimizers import flat_optimizer_state, build_optimizers
from .resuming import restore, resume_notes
from .run_config import resolve_on_root
from .run_folder import RunFolderLock, claim_run_folder, remove_new_run_folder
from .sigint import FinishTheSave, StopOnSigint, signal_said
from .step import TrainingDiverged, last_good, train_step  # noqa: F401 (TrainingDiverged re-exported)
from .starting_point import (carried_files, shared_model,
                             shared_tokenizer, tokenizer_files)


@dataclass
class StepInfo:
    """Passed to the `callback` of `train` after each step (and its evaluation / checkpoint, if any)."""

    step: int
    loss: float
    lr: float
    model: object


@dataclass
class TrainResult:
    status: str  # "done", "stopped" (reached stop_at) or "interrupted" (Ctrl-C)
    step: int
    out: Path
    checkpoint: Path | None
    val_bpb: float | None
    train_loss: float | None
    tokens: int
    wall_s: float  # this invocation, start to end
    train_s: float  # time spent in training steps, over all resumed segments
    tokens_per_s: float
    unigram_bits: float  # of the validation split: what a context-free model would reach
    plot: Path | None = None
    best: tuple[Path, float] | None = None  # (folder, bits per byte): the best validation of a checkpoint's own step
    sample: str | None = None
    val_step: int | None = None  # the step val_bpb was measured at (a stopped run's may be an earlier one)


def default_out_dir() -> str:
    return str(Path("runs") / time.strftime("mamba2-%Y%m%d-%H%M%S"))


def _fingerprint(corpus: Corpus, tokenizer) -> dict:
    # a resumed run must see the same bytes (another Python version has another standard library), read into the
    # same tokens (a byte run's fingerprint is what it was before tokenizers: its checkpoints still resume)
    found = {"train_bytes": int(len(corpus.train)), "val_bytes": int(len(corpus.val)),
             "train_crc32": zlib.crc32(corpus.train), "val_crc32": zlib.crc32(corpus.val)}   # (in place: no copy)
    return found if tokenizer.fingerprint() == "bytes" else {**found, "tokenizer": tokenizer.fingerprint()}


def evaluate(model, data: np.ndarray, cfg: TrainConfig, world: World = SINGLE, tokens_per_byte: float = 1.0) -> float:
    """Mean next-token cross entropy on the fixed validation windows, in bits per byte. Under MPI each rank
    takes every world.size-th batch and the sums are added up over the ranks. A batch runs in --grad-accum
    pieces, as training's (its logits alone are 3.3 GB at 32 x 512 tokens of a 50k vocabulary)."""

    total, count = 0.0, 0
    with no_grad():
        for i, (x, y) in enumerate(eval_batches(data, cfg.batch_size, cfg.seq_len, cfg.eval_batches)):
            if i % world.size == world.rank:
                for xm, ym in zip(np.array_split(x, cfg.grad_accum), np.array_split(y, cfg.grad_accum)):
                    if len(ym):  # the last batch may hold fewer windows than pieces
                        total += float(model.loss(xm, ym).data) * ym.size
                        count += ym.size
    total, count = (float(v) for v in world.sum([total, count]))
    return bits_per_byte(total / count, tokens_per_byte)


@dataclass
class _Run:
    """Everything one run carries from step to step; `save()` writes it as a checkpoint."""

    cfg: TrainConfig
    out: Path
    corpus: Corpus
    tokenizer: object
    fingerprint: dict
    val_unigram: float
    model: object
    optimizers: dict
    schedule: Callable[[int], float]
    sampler: BatchSampler
    log: RunLog
    clip: Callable  # clip_grad_norm_, looked up when the run starts (tests patch it)
    world: World = SINGLE
    lock: RunFolderLock | None = None  # rank 0 holds the run folder's lock until the run ends
    carried: dict = field(default_factory=dict)  # starting_point.carried_files: rank 0's, copied into each checkpoint
    reducer: object = None  # a distributed.GradientAllreducer when there are several ranks
    step: int = 0
    tokens: int = 0
    train_s: float = 0.0
    last_ckpt: Path | None = None
    saved_step: int | None = None
    val_bpb: float | None = None
    val_step: int | None = None  # the step val_bpb was measured at: a checkpoint's own validation, or an earlier one
    loss_val: float | None = None
    rate: float | None = None  # smoothed tokens/s, for the progress bar
    in_update: bool = False  # True while AdamW writes the weights: a checkpoint now would be half-updated (a second
    # Ctrl-C waits for the step's end there, run.hold_signals; a guard should another exception end it half-way)
    stop_requested: bool = False  # under MPI: some rank got Ctrl-C; all stop after the same step
    hold_signals: Callable = contextlib.nullcontext  # StopOnSigint.hold once the loop runs (train_step's update)
    stop_signals: dict = field(default_factory=dict)  # under MPI: rank -> the signal it got (SIGINT, SIGTERM)
    run_id: str | None = None  # the run family's id (train/run_folder.py): pruning deletes only its checkpoints

    def save(self) -> Path:
        """Under MPI: first the ranks' weights compared (RanksDiverged: nothing of diverged ranks is saved); rank 0
        alone writes, and every rank learns the checkpoint's path, or rank 0's write error (raised on every rank)."""
        _check_ranks_agree(self)
        self.last_ckpt, self.saved_step = Path(self.world.on_root(self._write)), self.step
        if self.world.is_root:
            self.log.saved()
        return self.last_ckpt

    def _write(self) -> str:
        trainer_state = {"tokens": self.tokens, "train_s": self.train_s, "val_bpb": self.val_bpb,
                         "val_bpb_step": self.val_step,
                         "train_config": self.cfg.to_dict(), "model_config": self.model.config.to_dict(),
                         "sampler": self.sampler.state_dict(), "data_fingerprint": self.fingerprint,
                         "world_size": self.world.size, "threads": numba.get_num_threads(),
                         **({"run_id": self.run_id} if self.run_id else {})}
        return str(ckpt.save_checkpoint(self.out, self.step, self.model, flat_optimizer_state(self.optimizers),
                                        trainer_state, keep=self.cfg.keep_checkpoints,
                                        tokenizer_files=tokenizer_files(self.tokenizer) | self.carried))


def _load_data(cfg: TrainConfig, state: dict | None, tokenizer, world: World = SINGLE) -> tuple[Corpus, dict]:
    if cfg.batch_size % world.size:
        counts = " or ".join(map(str, divisors(cfg.batch_size)))
        if state is not None:  # the batch is the run's: the number of ranks must fit it
            raise ValueError(f"--resume: this run's global batch is {cfg.batch_size} sequences (its --batch-size, kept "
                             f"in the checkpoint; a resumed run keeps it), which {world.size} MPI ranks cannot share "
                             f"evenly; resume it with a number of ranks that divides it: {counts} (mpiexec -n N; 1: "
                             f"without mpiexec)")
        raise ValueError(f"--batch-size {cfg.batch_size} (the global batch) must be divisible by the number of "
                         f"MPI ranks, {world.size}: each rank trains on batch_size / ranks sequences")
    share = cfg.batch_size // world.size
    if share % cfg.grad_accum:  # train_config_problems checked it for one process
        raise ValueError(f"--grad-accum {cfg.grad_accum} must divide each MPI rank's share of the batch (--batch-size "
                         f"{cfg.batch_size} over {world.size} ranks: {share} sequences), the rank's micro-batches "
                         f"being equal; give --grad-accum one of {', '.join(map(str, divisors(share)))}")
    corpus = tokenize(load_corpus(cfg.data, seed=cfg.data_seed, val_fraction=cfg.val_fraction,
                                  text_field=cfg.text_field, val_path=cfg.val_data), tokenizer, cfg.document_end)
    check_length(corpus.train, cfg.seq_len, "training", corpus.source, corpus.train_files, corpus.unit)
    check_length(corpus.val, cfg.seq_len, "validation", corpus.val_source or corpus.source, corpus.val_files,
                 corpus.unit, of_val_data=corpus.val_source is not None)
    fingerprint = _fingerprint(corpus, tokenizer)
    saved = state["data_fingerprint"] if state is not None else fingerprint
    if saved != fingerprint and {**saved, "tokenizer": None} == {**fingerprint, "tokenizer": None}:
        raise ValueError(f"--resume: the tokenizer {tokenizer.name!r} now tokenizes the data otherwise than when "
                         f"this run began (saved {saved.get('tokenizer')}, now {fingerprint.get('tokenizer')}): its "
                         f"special tokens (a BOS) are added as transformers adds them; start a new run, or fine-tune "
                         f"the checkpoint with --init-from")
    if state is not None and state["data_fingerprint"] != fingerprint:
        raise ValueError(f"--resume: the corpus {corpus.source!r} is not the one this run was trained on: "
                         f"{fingerprint_differences(saved, fingerprint)}; resume on the data the run read (--data PATH where "
                         f"it is now, if it was moved), or start a new run from the checkpoint with --init-from")
    return corpus, fingerprint


def _same_corpus_as_root(corpus: Corpus, fingerprint: dict, world: World) -> None:
    """Every rank read the corpus rank 0 read. A collective of its own, after every rank has loaded its data: inside
    _load_data a rank that failed before the broadcast skipped it, and with 4 ranks or more a rank fed through it
    waited for ever (MPICH's broadcast tree; found by an audit)."""
    root_fingerprint = world.broadcast_json(fingerprint)
    if root_fingerprint != fingerprint:
        raise ValueError(f"rank {world.rank} reads another corpus from {corpus.source!r} than rank 0 "
                         f"(rank {world.rank}: {fingerprint}; rank 0: {root_fingerprint}); every machine needs "
                         f"the same --data")


def _make_run_folder(cfg: TrainConfig, resume_dir: Path | None, world: World,
                     state: dict | None = None) -> tuple[Path, RunFolderLock | None, bool]:
    """(the run folder, checked and locked by rank 0 (train/run_folder.py): no second run writes into it meanwhile;
    its lock; whether this call made the folder)."""
    out = Path(cfg.out or default_out_dir()).expanduser()  # --out=~/x: the shell leaves that ~ to us
    if world.size > 1:  # one folder for all ranks, named by rank 0's clock
        out = Path(world.broadcast_json(str(out)))
    lock, created = None, False
    if world.is_root:
        created = not os.path.lexists(out)
        lock = claim_run_folder(out, ckpt.run_dir_of(resume_dir) if resume_dir is not None else None,
                                run_id=(state or {}).get("run_id"), settings=cfg.to_dict())
    return out, lock, created


def _setup(cfg, resume, overrides, stop_at, say, world: World = SINGLE) -> _Run:
    """Config, data, run folder, model, optimizers, schedule and sampler (restored when resuming). Every
    error about paths or sizes happens here, before any work, and under MPI on every rank at once."""

    cfg, state, resume_dir = resolve_on_root(cfg, resume, overrides, stop_at, say, world)
    tokenizer = shared_tokenizer(cfg, resume_dir, world)  # rank 0's, sent to the others
    carried = world.agree(lambda: carried_files(cfg, resume_dir) if world.is_root else {})  # rank 0 saves
    corpus, fingerprint = world.agree(_load_data, cfg, state, tokenizer, world)   # no collective inside (each rank
    world.agree(_same_corpus_as_root, corpus, fingerprint, world)                  # may fail alone), then one
    model = shared_model(cfg, tokenizer, state, world)  # before the run folder: a bad --init-from changes nothing
    out, lock, created = world.agree(_make_run_folder, cfg, resume_dir, world, state)
    cfg.out = str(out)
    val_unigram = unigram_entropy_bits(corpus.val) * corpus.val_tokens_per_byte
    run = _Run(cfg, out, corpus, tokenizer, fingerprint, val_unigram, model, build_optimizers(model, cfg),
               optim.WarmupCosine(cfg.lr, min(cfg.warmup_steps, cfg.steps), cfg.steps,  # --steps 3: warm up 3
                                  min_lr=cfg.lr / 10 if cfg.min_lr is None else cfg.min_lr),
               BatchSampler(corpus.train, cfg.batch_size, cfg.seq_len, seed=cfg.seed), RunLog(out),
               optim.clip_grad_norm_, world, lock, carried, run_id=lock.run_id if lock is not None else None)
    say(corpus.describe())
    say(f"unigram entropy: train {unigram_entropy_bits(corpus.train) * corpus.train_tokens_per_byte:.3f}, "
        f"validation {run.val_unigram:.3f} bits per byte"
        + (f" (tokenizer {tokenizer.name}: {1 / corpus.val_tokens_per_byte:.2f} bytes per token)"
           if tokenizer.name != "bytes" else ""))
    if state is not None:
        try:
            world.agree(restore, run, state, resume_dir)
        except BaseException:
            if created:  # --resume CKPT --out NEW whose checkpoint fails its checks: no new folder left behind
                remove_new_run_folder(out, lock)
            raise
        say(f"resumed from {resume_dir} at step {run.step}")
        for note in resume_notes(state, world.size):
            say(note)
    if world.size > 1:  # every rank starts from rank 0's weights and moments, fresh or resumed

        broadcast_weights_and_optimizers(run.model.varmap, run.optimizers, world)
    layers, steps = f"{cfg.n_layer} layer{'s' * (cfg.n_layer != 1)}", f"{cfg.steps} step{'s' * (cfg.steps != 1)}"
    origin = f"; from {cfg.init_from}" if cfg.init_from and state is None else ""
    unit = "bytes" if tokenizer.name == "bytes" else "tokens"
    ranks = f" over {world.size} MPI ranks" if world.size > 1 else ""
    per_rank = " per rank" if world.size > 1 else ""
    micro = (f" (in {cfg.grad_accum} micro-batches of {cfg.batch_size // world.size // cfg.grad_accum}{per_rank})"
             if cfg.grad_accum > 1 else "")
    say(f"model: {run.model.varmap.num_parameters():,} parameters (d_model {cfg.d_model}, {layers}, d_state "
        f"{cfg.d_state}, headdim {cfg.headdim}{origin}); {steps} of {cfg.batch_size} x {cfg.seq_len} {unit}{ranks}"
        f"{micro}; out {out}")
    return run


def _after_step(run: _Run, record: dict, bar, say) -> None:
    """After a step (train_step logged it): validate every `eval_every` steps and at the end (under MPI, first check
    that every rank holds the same weights); checkpoint every `checkpoint_every`."""
    bar.update(1)
    bar.set_postfix(loss=f"{run.loss_val:.3f}", tok_s=f"{run.rate:,.0f}", lr=f"{record['lr']:.2e}", refresh=False)
    cfg = run.cfg
    if _validation_due(run):
        _validate(run, say)
    if run.step % cfg.checkpoint_every == 0 and run.step < cfg.steps:
        run.save()


def _validation_due(run: _Run) -> bool:
    return run.step % run.cfg.eval_every == 0 or run.step == run.cfg.steps


def _validate(run: _Run, say) -> None:
    """Validation bits per byte at this step, logged (under MPI, first check that every rank holds the same
    weights). A resumed run whose checkpoint was saved by a second Ctrl-C during its step's validation does it first
    (train): the log then holds it as the run never stopped had (a fuzz of interruptions)."""
    _check_ranks_agree(run)
    run.val_bpb = evaluate(run.model, run.corpus.val, run.cfg, run.world, run.corpus.val_tokens_per_byte)
    if not math.isfinite(run.val_bpb):  # finite weights whose forward overflows: a checkpoint of them is no good
        raise TrainingDiverged(f"training diverged: the validation loss is {run.val_bpb} after step {run.step} (the "
                               f"weights are finite, their forward on the validation text is not); nothing was "
                               f"saved; {last_good(run.last_ckpt)}. Try a lower --lr or more --warmup-steps.")
    run.val_step = run.step
    if run.world.is_root:
        run.log.append({"step": run.step, "val_bpb": run.val_bpb, "tokens": run.tokens})
    loss = "" if run.loss_val is None else f" (train loss {run.loss_val:.3f})"   # (none yet in a resumed session)
    say(f"step {run.step}: validation {run.val_bpb:.3f} bits per byte{loss}")


def _finish(run: _Run, status: str, t_begin: float, say, sigint=None) -> TrainResult:
    """The end: a last checkpoint, the curves, the summary and (when done) a sample, which a Ctrl-C (`sigint`'s, said
    during the last steps' validation or the sample itself) leaves out; files on rank 0 only."""
    # a step not in a checkpoint yet (the last one's is saved here); a resume with nothing left to do leaves the
    # checkpoint as it is (it was written again, its world_size and file times those of the resume: an audit)
    if run.step > 0 and run.saved_step != run.step:
        with FinishTheSave(say):
            run.save()
    # a stop is said before the curves are drawn: a second Ctrl-C during the drawing (matplotlib's first import, half
    # a second) ended the run with no word of its checkpoint or how to continue (a fuzz of interruptions)
    if status != "done" and run.last_ckpt is None:  # stopped before the first step was done: there is no checkpoint
        say(f"stopped at step {run.step}/{run.cfg.steps}, before the first checkpoint; nothing was saved\n"
            f"start it again with: {python_cmd(run.world.size)} -m tinygrad_ssm train --out {run.out} and its flags")
    elif status != "done":
        say(f"stopped at step {run.step}/{run.cfg.steps}; checkpoint {run.last_ckpt}\n"
            f"continue with: {python_cmd(run.world.size)} -m tinygrad_ssm train --resume {run.out}")
    plot = plot_curves(run.log.records(), run.out / PLOT_FILE, run.val_unigram) if run.world.is_root else None
    result = TrainResult(status, run.step, run.out, run.last_ckpt, run.val_bpb, run.loss_val, run.tokens,
                         time.perf_counter() - t_begin, run.train_s,
                         run.tokens / run.train_s if run.train_s else 0.0, run.val_unigram, plot,
                         best=ckpt.best_checkpoint(run.out, run.run_id) if run.world.is_root else None,
                         val_step=run.val_step)
    if status == "done" and run.world.is_root:

        val_text = run.corpus.val if run.corpus.val_text is None else np.frombuffer(run.corpus.val_text, np.uint8)
        prompt = run.cfg.sample_prompt or sample_prompt_from(val_text)
        try:
            if sigint is not None and sigint.requested:
                raise _SampleStopped
            result.sample = prompt + sample_text(run.model, prompt, run.cfg.sample_bytes, tokenizer=run.tokenizer,
                                                 temperature=0.8, seed=run.cfg.seed, on_piece=lambda piece:
                                                 _stop_if(sigint is not None and sigint.requested))
        except _SampleStopped:  # every step is done and saved: only the sample is left out
            say("the run is done and saved; the sample is left out (stopped by a signal)")
        say(summary(result))
    if run.lock is not None:
        run.lock.release()
    run.world.sum([0.0])  # under MPI every rank ends with rank 0, its Ctrl-C handler still in place
    return result


class _SampleStopped(Exception):
    """A Ctrl-C or SIGTERM during the end's sample: the sample stops there."""


def _stop_if(requested: bool) -> None:
    if requested:
        raise _SampleStopped


def _loop(run: _Run, stop_at, callback, bar, sigint, say) -> str:
    """Steps until the end, `stop_at` or Ctrl-C; returns the status."""
    while run.step < run.cfg.steps:
        if run.world.size == 1 and sigint.requested:
            return "interrupted"
        if run.stop_requested:  # agreed by every rank in the last step
            if 0 not in run.stop_signals:  # rank 0 printed its own Ctrl-C; another rank's is said here
                got = ", ".join(f"{signal_said(s)} on rank {r}" for r, s in run.stop_signals.items())
                say(f"{got} of {run.world.size}: every rank stops "
                    f"after step {run.step} and a checkpoint is written (Ctrl-C again to stop now)")
            return "interrupted"
        if stop_at is not None and run.step >= stop_at:
            return "stopped"
        record = train_step(run, sigint.signum)
        _after_step(run, record, bar, say)
        if callback is not None:
            callback(StepInfo(run.step, run.loss_val, record["lr"], run.model))
    return "done"


def train(cfg: TrainConfig | None = None, *, resume: str | None = None, overrides: dict | None = None,
          stop_at: int | None = None, progress: bool = True, callback: Callable[[StepInfo], None] | None = None,
          say: Callable[[str], None] | None = None, world: World = SINGLE, overlap: bool = True) -> TrainResult:
    """Run (or continue, with `resume`= a run or checkpoint folder) a training run.

    overrides: settings given on the command line; with `resume` they are checked against the saved run.
    stop_at: stop (with a checkpoint) once this many steps are done; the schedule still spans `cfg.steps`.
    callback: called with a StepInfo after every step (tests use it to interrupt or to corrupt weights).
    world: `distributed.init()` to train data-parallel over MPI ranks (launched with mpiexec; required there:
    the default single-process World under mpiexec -n N, N > 1, raises DistributedError); `overlap`
    starts each gradient bucket's allreduce during the backward (False: all of them after it).
    """
    if world.size == 1 and launcher_world_size() > 1:  # N lone copies would train into one folder
        raise DistributedError(f"train(): a launcher (mpiexec) started {launcher_world_size()} processes, but world= "
                               f"is the single-process default, so each would train alone; pass "
                               f"world=tinygrad_ssm.distributed.init() (or start one process, without mpiexec)")
    t_begin = time.perf_counter()
    run = None
    try:  # from here on one rank's error ends the whole job (below): an import failing on one rank left all waiting
        from tqdm import tqdm
        tqdm.get_lock()  # made now: a Ctrl-C while the first message made it left tqdm.write a traceback (a fuzz)
        say = (say or (lambda m: tqdm.write(m, file=sys.stdout))) if world.is_root else (lambda m: None)
        run = _setup(cfg, resume, overrides, stop_at, say, world)
        if world.size > 1:

            run.reducer = GradientAllreducer(run.model.varmap, world, overlap=overlap)
        with StopOnSigint(say) as sigint:  # until the end: a Ctrl-C after the agreed stop is a second one
            run.hold_signals = sigint.hold
            with progress_bar(total=run.cfg.steps, initial=run.step, disable=not (progress and world.is_root),
                              unit="step", dynamic_ncols=True, file=sys.stderr) as bar:
                try:
                    try:
                        if run.step > 0 and _validation_due(run) and run.val_step != run.step:   # a resumed run's
                            _validate(run, say)        # checkpoint saved before its step's validation was done
                        status = _loop(run, stop_at, callback, bar, sigint, say)
                    except TypeError as e:                              # numba swallowed the second Ctrl-C
                        raise sigint.as_interrupt(e) or e               # (sigint.py), with its cause
                except KeyboardInterrupt as e:
                    said = e.args[0] if e.args else "Ctrl-C"  # SIGTERM too (sigint.py)
                    if run.in_update:  # weights are half-updated: saving them would poison the run
                        say(f"stopped during a weight update at step {run.step + 1}; nothing saved "
                            f"(last checkpoint: {run.last_ckpt})")
                        raise
                    if world.size > 1:  # the ranks may be anywhere (one inside an allreduce): abort the job
                        say(f"second {said} under MPI: stopping every rank now; nothing saved "
                            f"(last checkpoint: {run.last_ckpt})")
                        raise
                    status = "interrupted"
            return _finish(run, status, t_begin, say, sigint)
    except BaseException as e:
        if run is not None and run.lock is not None:  # the folder free again now, not when the traceback goes (a
            run.lock.release()                        # notebook keeps it: a resume elsewhere was refused)
        every_rank = isinstance(e, (TrainingDiverged, RanksDiverged)) or getattr(e, "raised_on_every_rank", False)
        if world.size > 1 and not every_rank:  # one rank's error ends the whole job: none is left waiting
            if isinstance(e, OSError):  # a file of this rank's own (rank 0's log or plot): one line, 74 as alone
                last = f"the last checkpoint is {run.last_ckpt}" if run is not None and run.last_ckpt else \
                    "no checkpoint had been written yet"
                world.abort(e, EXIT_IO, f"cannot write {e.filename or 'a file of the run'}: {io_cause(e)}; every "
                                        f"rank stops, {last}")
            world.abort(e, 130 if isinstance(e, KeyboardInterrupt) else 1)
        raise


def _check_ranks_agree(run: _Run) -> None:
    """check_same_weights, its RanksDiverged told what is left: the last good checkpoint (resume from it), or none
    yet (the run starts again). Under MPI every rank raises it alike, with the same checkpoint (save() tells all)."""
    try:
        check_same_weights(run.model.varmap, run.world, run.step)
    except RanksDiverged as e:
        then = (f"; resume from it: --resume {run.last_ckpt}" if run.last_ckpt is not None
                else "; start the run again")
        raise RanksDiverged(f"{e}; nothing of the diverged ranks was saved; {last_good(run.last_ckpt)}"
                            f"{then}") from None


def summary(r: TrainResult) -> str:
    lines = [
        "",
        f"final validation: {r.val_bpb:.3f} bits per byte (unigram entropy of the validation text: "
        f"{r.unigram_bits:.3f})",
        f"tokens: {r.tokens:,} in {r.train_s:.1f} s of training ({r.tokens_per_s:,.0f} tokens/s; both over every "
        f"session of the run); this session's wall time {r.wall_s:.1f} s",
        f"checkpoint: {r.checkpoint}",
    ]
    if r.best is not None and r.checkpoint is not None and Path(r.best[0]) != Path(r.checkpoint):
        lines.append(f"best validation: {r.best[1]:.3f} bits per byte, at {r.best[0]} (kept until a checkpoint "
                     f"validates better)")
    lines.append(f"curves: {r.plot}" if r.plot is not None else f"no loss plot: {plot_unavailable_reason()}")
    if r.sample is not None:  # control bytes escaped: a sample must not drive the terminal
        lines += ["sample:", "-" * 60, escape_controls(r.sample), "-" * 60]
    return "\n".join(lines)
