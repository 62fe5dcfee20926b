"""The settings of a training run (TrainConfig) and what may change on --resume (their checks: train/checks.py)."""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

from .checks import flag

VOCAB_SIZE = 256  # bytes


@dataclass
class TrainConfig:
    """Everything that defines a run. The defaults are the README's first command: about three minutes on 2 cores.

    Why these (measured on the default corpus, 2 cores): batches of 32 x 128 bytes, since at equal bytes per
    step more and shorter sequences learn faster in a run this short; peak lr 4e-3, which beat 3e-3 and 6e-3;
    chunk 64 (the CPU's numba scan cuts it to 32-step chunks, as any chunk from 32 up: the same computation);
    3 layers of d_model 256 with d_state 64, since in a few minutes a model this small sees about two bytes per
    parameter, so fewer layers and more steps win (2 layers fell behind); 660 steps, what fitted in about four minutes on a fresh clone, install and compilation included,
    when they were chosen (about three today: the step got faster; validation about 1.68 bits per byte). The
    runs behind these choices, and the default run's figures through the package's history: CHANGELOG.md.
    """

    # data
    data: str | None = None  # None: the running interpreter's standard library sources
    data_seed: int = 0  # file order and train/validation split; separate from `seed` so runs compare
    val_fraction: float = 0.05
    val_data: str | None = None  # validate on this text file or folder (all of --data trained on); absolute
    tokenizer: str = "bytes"  # "bytes", or the absolute path of the tokenizer.json --data was tokenized with
    document_end: str = "none"  # "eos": the tokenizer's EOS token after each document (file, .jsonl record) of --data
    text_field: str = "text"  # the field of a .jsonl file's records that holds the text (train/json_records.py)
    init_from: str | None = None  # fine-tuning: the model folder whose weights the run started from
    init_from_sha256: dict | None = None  # its files as read (file -> sha256), set when the run starts: no flag
    # model
    d_model: int = 256
    n_layer: int = 3
    d_state: int = 64
    headdim: int = 64
    chunk_size: int = 64  # SSD chunk of the reference and cuda backends; numba_chunked (CPU) caps it at 32
    dtype: str = "float32"  # of the weights; float64 for exact comparisons
    # optimisation
    steps: int = 660
    batch_size: int = 32
    seq_len: int = 128
    grad_accum: int = 1  # each step's batch in this many micro-batches, one after another: memory, not the math
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
    eval_every: int = 50
    eval_batches: int = 4
    checkpoint_every: int = 50
    keep_checkpoints: int = 2
    sample_bytes: int = 300
    sample_prompt: str = ""  # "" -> the first line of the validation text (see data.sample_prompt_from)

    # flags that may differ on --resume without changing the weights the run produces (backend and grad_accum:
    # the same sums, up to rounding; a run that ran out of memory resumes with a higher --grad-accum; data and
    # val_data: a folder moved elsewhere, its content held to the run's by the data fingerprint)
    RESUME_SAFE = ("out", "eval_every", "eval_batches", "checkpoint_every", "keep_checkpoints", "sample_bytes",
                   "sample_prompt", "backend", "grad_accum", "data", "val_data")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"TrainConfig: unknown fields {sorted(unknown)}")
        return cls(**d)


def _resume_config(saved: dict, overrides: dict) -> TrainConfig:
    cfg = TrainConfig.from_dict(saved)
    # min_lr None is --lr / 10 (the schedule's default): --min-lr of that value changes nothing
    as_run = {"min_lr": cfg.lr / 10} if cfg.min_lr is None else {}
    changed = {k: v for k, v in overrides.items() if as_run.get(k, getattr(cfg, k)) != v}
    bad = sorted(k for k in changed if k not in TrainConfig.RESUME_SAFE and k != "steps")
    if bad:
        raise ValueError("--resume continues the saved run; these settings differ from it and would change "
                         "what it computes: " + ", ".join(f"{flag(k)} (saved {getattr(cfg, k)!r}, given "
                                                          f"{changed[k]!r})" for k in bad))
    for field in ("data", "val_data"):   # the saved place, gone: say how to give the new one
        saved_path = getattr(cfg, field)
        if field not in overrides and saved_path and not os.path.lexists(Path(saved_path).expanduser()):
            raise ValueError(f"--resume: the run's {flag(field)} {saved_path!r} no longer exists; if it was moved, "
                             f"give its new place with {flag(field)} PATH (its content is checked against the run's)")
    return dataclasses.replace(cfg, **changed)
