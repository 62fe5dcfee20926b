"""Train a byte-level Mamba-2 language model: AdamW, warmup + cosine decay, gradient clipping.

One step: draw a batch, loss = mean cross entropy of the next byte, backward, clip the global gradient
norm, AdamW update with the scheduled learning rate. Validation bits per byte are measured on fixed
windows of the validation files every `eval_every` steps. Checkpoints (see checkpoint.py) hold everything
that decides the next step: weights, optimizer moments, step, sampler state (its RNG), config; so a
resumed run continues bit for bit.

Stopping: Ctrl-C finishes the step in progress, writes a checkpoint and returns ("interrupted"); a second
Ctrl-C stops at once (still writing a checkpoint when no weight update was half-done). A NaN or infinite
loss or gradient norm raises TrainingDiverged before the update is applied, and writes nothing, so the
last good checkpoint stays as it was.
"""
from __future__ import annotations

import dataclasses
import math
import signal
import sys
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from . import checkpoint as ckpt
from .data import (BatchSampler, Corpus, bits_per_byte, check_length, eval_batches, load_corpus,
                   sample_prompt_from, unigram_entropy_bits)
from .generate import escape_controls
from .run_folder import claim_run_folder
from .runlog import PLOT_FILE, RunLog, plot_curves, plot_unavailable_reason, progress_bar
from .train_checks import check_train_config, flag

VOCAB_SIZE = 256  # bytes


@dataclass
class TrainConfig:
    """Everything that defines a run. The defaults are the README's first command: about four minutes on 2 cores.

    How they were chosen (measured on the default corpus, 100 steps of 4,096 bytes; ~1.3-1.6 s per step on
    2 idle cores, so 150 steps + 6 evaluations take ~4-4.5 minutes there):
    the model is the suggested d_model 256, 4 layers, d_state 64, headdim 64 (1.8M parameters). At equal
    bytes per step, more and shorter sequences learn faster in a run this short: validation after 100 steps
    was 2.35 bits per byte for 8 x 512, 2.27 for 16 x 256, 2.16 for 32 x 128 (each measured with windows
    of its own length, so the shorter ones are, if anything, penalised). Peak lr 4e-3 beat 3e-3 (2.38 vs
    2.35 at 8 x 512) and 6e-3 (2.29 vs 2.27 at 16 x 256); 1e-2 was worse still early on. Chunk 64 instead of
    256 is ~3x faster here.
    """

    # data
    data: str | None = None  # None: the running interpreter's standard library sources
    data_seed: int = 0  # file order and train/validation split; separate from `seed` so runs compare
    val_fraction: float = 0.05
    # model
    d_model: int = 256
    n_layer: int = 4
    d_state: int = 64
    headdim: int = 64
    chunk_size: int = 64  # SSD chunk: 64 is ~3x faster than the official 256 at seq_len 512 on CPU
    # optimisation
    steps: int = 150
    batch_size: int = 32
    seq_len: int = 128
    lr: float = 4e-3
    min_lr: float | None = None  # None: lr / 10
    warmup_steps: int = 10
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    seed: int = 0  # weight init and batch sampling
    backend: str = "auto"
    # bookkeeping
    out: str = ""  # run folder; "" -> runs/mamba2-<date>-<time>
    eval_every: int = 25
    eval_batches: int = 4
    checkpoint_every: int = 50
    keep_checkpoints: int = 2
    sample_bytes: int = 300
    sample_prompt: str = ""  # "" -> the first line of the validation text (see data.sample_prompt_from)

    # flags that may differ on --resume without changing the weights the run produces
    RESUME_SAFE = ("out", "eval_every", "eval_batches", "checkpoint_every", "keep_checkpoints", "sample_bytes",
                   "sample_prompt", "backend")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"TrainConfig: unknown fields {sorted(unknown)}")
        return cls(**d)


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
    sample: str | None = None


class TrainingDiverged(RuntimeError):
    """The loss or the gradient norm became NaN or infinite; nothing was written after the last good step."""


class _StopOnSigint:
    """First Ctrl-C: set `.requested` (the loop stops after the current step). Second: KeyboardInterrupt."""

    def __init__(self, say: Callable[[str], None]):
        self.requested, self._say, self._previous = False, say, None

    def _handler(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        self._say("Ctrl-C: stopping after this step and writing a checkpoint (Ctrl-C again to stop now)")

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():  # signals reach the main thread only
            self._previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
        return False


def default_out_dir() -> str:
    return str(Path("runs") / time.strftime("mamba2-%Y%m%d-%H%M%S"))


def build_model(cfg: TrainConfig):
    from .models.mamba2 import Mamba2Config, Mamba2LMHeadModel
    from .registry import VarMap

    config = Mamba2Config(d_model=cfg.d_model, n_layer=cfg.n_layer, vocab_size=VOCAB_SIZE, d_state=cfg.d_state,
                          headdim=cfg.headdim, chunk_size=cfg.chunk_size)
    return Mamba2LMHeadModel(config, varmap=VarMap(seed=cfg.seed), backend=cfg.backend)


def build_optimizers(model, cfg: TrainConfig) -> dict:
    """AdamW with weight decay on matrices (ndim >= 2) only; vectors (norm weights, biases, A_log, D, dt_bias)
    are not decayed (as mamba_ssm and nanoGPT do): pulling them to 0 has no regularising meaning."""
    from .optim import AdamW

    named = model.varmap.named_vars()
    groups = {"decay": [(n, p) for n, p in named if p.ndim >= 2],
              "no_decay": [(n, p) for n, p in named if p.ndim < 2]}
    return {name: AdamW(params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                        weight_decay=cfg.weight_decay if name == "decay" else 0.0)
            for name, params in groups.items() if params}


def _optimizer_state(optimizers: dict) -> dict:
    flat = {}
    for group, opt in optimizers.items():
        for key, value in opt.state_dict().items():
            flat[f"{group}/{key}"] = np.asarray(value)
    return flat


def _load_optimizer_state(optimizers: dict, flat: dict) -> None:
    for group, opt in optimizers.items():
        prefix = f"{group}/"
        opt.load_state_dict({k[len(prefix):]: v for k, v in flat.items() if k.startswith(prefix)})


def _fingerprint(corpus: Corpus) -> dict:
    # a resumed run must see the same bytes (another Python version has another standard library)
    return {"train_bytes": int(len(corpus.train)), "val_bytes": int(len(corpus.val)),
            "train_crc32": zlib.crc32(corpus.train.tobytes()), "val_crc32": zlib.crc32(corpus.val.tobytes())}


def evaluate(model, data: np.ndarray, cfg: TrainConfig) -> float:
    """Mean next-byte cross entropy on the fixed validation windows, in bits per byte."""
    from .tensor import no_grad

    total, count = 0.0, 0
    with no_grad():
        for x, y in eval_batches(data, cfg.batch_size, cfg.seq_len, cfg.eval_batches):
            total += float(model.loss(x, y).data) * y.size
            count += y.size
    return bits_per_byte(total / count)


def _resume_config(saved: dict, overrides: dict) -> TrainConfig:
    cfg = TrainConfig.from_dict(saved)
    changed = {k: v for k, v in overrides.items() if getattr(cfg, k) != v}
    bad = sorted(k for k in changed if k not in TrainConfig.RESUME_SAFE and k != "steps")
    if bad:
        raise ValueError("--resume continues the saved run; these settings differ from it and would change "
                         "what it computes: " + ", ".join(f"{flag(k)} (saved {getattr(cfg, k)!r}, given "
                                                          f"{changed[k]!r})" for k in bad))
    return dataclasses.replace(cfg, **changed)


def train(cfg: TrainConfig | None = None, *, resume: str | None = None, overrides: dict | None = None,
          stop_at: int | None = None, progress: bool = True, callback: Callable[[StepInfo], None] | None = None,
          say: Callable[[str], None] | None = None) -> TrainResult:
    """Run (or continue, with `resume`= a run or checkpoint folder) a training run.

    overrides: settings given on the command line; with `resume` they are checked against the saved run.
    stop_at: stop (with a checkpoint) once this many steps are done; the schedule still spans `cfg.steps`.
    callback: called with a StepInfo after every step (tests use it to interrupt or to corrupt weights).
    """
    from tqdm import tqdm

    from .optim import WarmupCosine, clip_grad_norm_

    t_begin = time.perf_counter()
    bar = None

    def _say(msg: str) -> None:
        (say or (lambda m: tqdm.write(m, file=sys.stdout)))(msg)

    # ---- configuration and data: every error about paths or sizes happens here, before any work
    state, resume_dir = None, None
    if resume is not None:
        resume_dir = ckpt.resolve_checkpoint(resume)
        state = ckpt.load_trainer_state(resume_dir)
        cfg = _resume_config(state["train_config"], overrides or {})
        if cfg.steps != state["train_config"]["steps"]:
            _say(f"note: --steps changed from {state['train_config']['steps']} to {cfg.steps}: the learning-rate "
                 f"schedule now spans {cfg.steps} steps, so this run is not the one it would have been")
        if "out" not in (overrides or {}):
            cfg.out = str(ckpt.run_dir_of(resume_dir))
    else:
        cfg = dataclasses.replace(cfg or TrainConfig(), **(overrides or {}))
        if cfg.data is not None:  # absolute, so that --resume works from any folder
            cfg.data = str(Path(cfg.data).expanduser().absolute())
    check_train_config(cfg, tuple(overrides or {}), stop_at, state["step"] if state is not None else 0)
    corpus = load_corpus(cfg.data, seed=cfg.data_seed, val_fraction=cfg.val_fraction)
    check_length(corpus.train, cfg.seq_len, "training", corpus.source)
    check_length(corpus.val, cfg.seq_len, "validation", corpus.source)
    fingerprint = _fingerprint(corpus)
    if state is not None and state["data_fingerprint"] != fingerprint:
        raise ValueError(f"--resume: the corpus {corpus.source!r} is not the one this run was trained on "
                         f"(saved {state['data_fingerprint']}, now {fingerprint})")
    out = Path(cfg.out or default_out_dir())
    cfg.out = str(out)
    run_lock = claim_run_folder(out, ckpt.run_dir_of(resume_dir) if state is not None else None)
    val_unigram = unigram_entropy_bits(corpus.val)
    _say(corpus.describe())
    _say(f"unigram entropy: train {unigram_entropy_bits(corpus.train):.3f}, validation {val_unigram:.3f} "
         f"bits per byte")

    # ---- model, optimizer, schedule, sampler (restored from the checkpoint when resuming)
    model = build_model(cfg)
    optimizers = build_optimizers(model, cfg)
    params = model.varmap.all_vars()
    warmup = min(cfg.warmup_steps, cfg.steps)  # a short run (--steps 3) warms up over all its steps
    schedule = WarmupCosine(cfg.lr, warmup, cfg.steps, min_lr=cfg.lr / 10 if cfg.min_lr is None else cfg.min_lr)
    sampler = BatchSampler(corpus.train, cfg.batch_size, cfg.seq_len, seed=cfg.seed)
    log = RunLog(out)
    step, tokens, train_s = 0, 0, 0.0
    last_ckpt, saved_step, val_bpb, loss_val = None, None, None, None
    if state is not None:
        model.varmap.load(resume_dir / "model.safetensors")
        _load_optimizer_state(optimizers, ckpt.load_optimizer_state(resume_dir))
        sampler.load_state_dict(state["sampler"])
        step, tokens, train_s = state["step"], state["tokens"], state["train_s"]
        val_bpb, last_ckpt, saved_step = state.get("val_bpb"), resume_dir, step
        log.truncate_after(step)
        _say(f"resumed from {resume_dir} at step {step}")
    _say(f"model: {model.varmap.num_parameters():,} parameters (d_model {cfg.d_model}, {cfg.n_layer} layers, "
         f"d_state {cfg.d_state}, headdim {cfg.headdim}); {cfg.steps} steps of {cfg.batch_size} x "
         f"{cfg.seq_len} bytes; out {out}")

    def save() -> Path:
        nonlocal saved_step
        trainer_state = {"tokens": tokens, "train_s": train_s, "val_bpb": val_bpb,
                         "train_config": cfg.to_dict(), "model_config": model.config.to_dict(),
                         "sampler": sampler.state_dict(), "data_fingerprint": fingerprint}
        path = ckpt.save_checkpoint(out, step, model, _optimizer_state(optimizers), trainer_state,
                                    keep=cfg.keep_checkpoints)
        saved_step = step
        return path

    status, in_update, rate = "done", False, None
    bar = progress_bar(total=cfg.steps, initial=step, disable=not progress, unit="step", dynamic_ncols=True,
                       file=sys.stderr)
    try:
        with _StopOnSigint(_say) as sigint:
            try:
                while step < cfg.steps:
                    if sigint.requested or (stop_at is not None and step >= stop_at):
                        status = "interrupted" if sigint.requested else "stopped"
                        break
                    t0 = time.perf_counter()
                    lr = schedule(step)
                    x, y = sampler.next_batch()  # (b, l) each
                    for opt in optimizers.values():
                        opt.zero_grad()
                    loss = model.loss(x, y)
                    loss_val = float(loss.data)
                    if not math.isfinite(loss_val):
                        raise TrainingDiverged(_diverged(f"loss is {loss_val}", step + 1, lr, last_ckpt))
                    loss.backward()
                    grad_norm = float(clip_grad_norm_(params, cfg.grad_clip))
                    if not math.isfinite(grad_norm):
                        raise TrainingDiverged(_diverged(f"gradient norm is {grad_norm}", step + 1, lr, last_ckpt))
                    in_update = True
                    for opt in optimizers.values():
                        opt.lr = lr
                        opt.step()
                    in_update = False
                    step += 1
                    tokens += x.size
                    dt = time.perf_counter() - t0
                    train_s += dt
                    rate = x.size / dt if rate is None else 0.9 * rate + 0.1 * x.size / dt  # smoothed tokens/s
                    log.append({"step": step, "train_loss": loss_val, "train_bpb": bits_per_byte(loss_val),
                                "lr": lr, "grad_norm": grad_norm, "tokens": tokens, "tokens_per_s": x.size / dt})
                    bar.update(1)
                    bar.set_postfix(loss=f"{loss_val:.3f}", tok_s=f"{rate:,.0f}", lr=f"{lr:.2e}", refresh=False)
                    if step % cfg.eval_every == 0 or step == cfg.steps:
                        val_bpb = evaluate(model, corpus.val, cfg)
                        log.append({"step": step, "val_bpb": val_bpb, "tokens": tokens})
                        _say(f"step {step}: validation {val_bpb:.3f} bits per byte (train loss {loss_val:.3f})")
                    if step % cfg.checkpoint_every == 0 and step < cfg.steps:
                        last_ckpt = save()
                    if callback is not None:
                        callback(StepInfo(step, loss_val, lr, model))
            except KeyboardInterrupt:
                if in_update:  # weights are half-updated: saving them would poison the run
                    _say(f"stopped during a weight update at step {step + 1}; nothing saved "
                         f"(last checkpoint: {last_ckpt})")
                    raise
                status = "interrupted"
    finally:
        bar.close()

    # ---- the end: checkpoint, curves, summary
    if step > 0 and (saved_step != step or status == "done"):
        last_ckpt = save()
    plot = plot_curves(log.records(), out / PLOT_FILE, val_unigram)
    wall = time.perf_counter() - t_begin
    result = TrainResult(status, step, out, last_ckpt, val_bpb, loss_val, tokens, wall, train_s,
                         tokens / train_s if train_s else 0.0, val_unigram, plot)
    if status != "done":
        _say(f"stopped at step {step}/{cfg.steps}; checkpoint {last_ckpt}\n"
             f"continue with: python -m tinygrad_ssm train --resume {out}")
        run_lock.release()
        return result
    from .generate import sample_text

    prompt = cfg.sample_prompt or sample_prompt_from(corpus.val)
    result.sample = prompt + sample_text(model, prompt, cfg.sample_bytes, temperature=0.8, seed=cfg.seed)
    _say(summary(result))
    run_lock.release()
    return result


def _diverged(what: str, step: int, lr: float, last_ckpt: Path | None) -> str:
    where = (f"the last good checkpoint {last_ckpt} was left untouched" if last_ckpt is not None
             else "no checkpoint had been written yet")
    return (f"training diverged: {what} at step {step} (lr {lr:.3g}); stopped without updating the weights; "
            f"{where}. Try a lower --lr or more --warmup-steps.")


def summary(r: TrainResult) -> str:
    lines = [
        "",
        f"final validation: {r.val_bpb:.3f} bits per byte (unigram entropy of the validation text: "
        f"{r.unigram_bits:.3f})",
        f"tokens: {r.tokens:,} in {r.train_s:.1f} s of training ({r.tokens_per_s:,.0f} tokens/s); "
        f"wall time {r.wall_s:.1f} s",
        f"checkpoint: {r.checkpoint}",
    ]
    lines.append(f"curves: {r.plot}" if r.plot is not None else f"no loss plot: {plot_unavailable_reason()}")
    if r.sample is not None:  # control bytes escaped: a sample must not drive the terminal
        lines += ["sample:", "-" * 60, escape_controls(r.sample), "-" * 60]
    return "\n".join(lines)
