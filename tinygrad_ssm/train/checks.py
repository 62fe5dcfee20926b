"""Checking a training configuration before any work, one message per setting, each naming its flag.

`train_config_problems(cfg)` returns every problem at once (so one run of the command shows them all); each
message names the command-line flag (`--lr`, not `lr`), the value given, and what would work. Settings that
JSON or a caller can get wrong are checked too: a type (an int where an int is needed, never a bool), a
non-finite float (argparse's float() accepts "nan" and "inf"), a negative seed (NumPy refuses one), and a
batch whose activations cannot fit in this machine's memory.
"""
from __future__ import annotations

import math
import os

from ..autograd.args import is_integer, is_real_number
from ..scan import available_backends

# TrainConfig field -> smallest allowed value, for the integer settings
_MIN_INT = {"steps": 1, "batch_size": 1, "grad_accum": 1, "seq_len": 1, "d_model": 1, "n_layer": 1, "d_state": 1,
            "headdim": 1, "chunk_size": 1, "eval_every": 1, "eval_batches": 1, "checkpoint_every": 1,
            "keep_checkpoints": 1, "warmup_steps": 0, "sample_bytes": 0, "seed": 0, "data_seed": 0}
# bytes of NumPy memory per (token x unit) of a training step's forward + backward, measured with tracemalloc
# on four model sizes (13.3 to 13.9 bytes; units: see step_memory_bytes)
_BYTES_PER_UNIT = 14
MAX_SAMPLE = 1_000_000  # --sample-bytes: about 10 minutes of sampling at the default model's speed
VOCAB = 256             # a byte-level run's vocabulary (a tokenizer's or a checkpoint's: the vocab_size argument)


def flag(field: str) -> str:
    """TrainConfig field -> its command-line flag (beta1 and beta2 have none: they are named as fields)."""
    return field if field.startswith("beta") else "--" + field.replace("_", "-")


def divisors(n: int) -> list[int]:
    """The positive divisors of n >= 1, ascending (what a batch of n sequences can be split by)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def step_memory_bytes(cfg, vocab_size: int = VOCAB, ranks: int = 1) -> int:
    """Estimated peak bytes of one process's training step (activations kept for backward, and their gradients),
    of one micro-batch (--grad-accum: a micro-batch's activations are freed before the next; under MPI a rank's
    micro-batches split its share, --batch-size / ranks), and the whole batch's ids (the sampler draws the global
    batch at once, on every rank). Per token and layer the
    mixer keeps its in_proj output, the conv input/output, several d_inner-wide tensors and the (heads x chunk)
    decay matrix of the SSD scan; the head keeps logits and their softmax."""
    d_inner = 2 * cfg.d_model
    nheads = max(1, d_inner // max(1, cfg.headdim))
    conv_dim = d_inner + 2 * cfg.d_state
    d_in_proj = 2 * d_inner + 2 * cfg.d_state + nheads
    per_layer = d_in_proj + 2 * conv_dim + 4 * d_inner + nheads * min(cfg.chunk_size, cfg.seq_len)  # a chunk <= l
    micro_batch = -(-cfg.batch_size // (ranks * cfg.grad_accum))
    batch_ids = 16 * cfg.batch_size * cfg.seq_len  # the global batch's inputs and targets (int64), drawn whole
    return _BYTES_PER_UNIT * micro_batch * cfg.seq_len * (cfg.n_layer * per_layer + 3 * vocab_size) + batch_ids


def parameter_memory_bytes(cfg, vocab_size: int = VOCAB) -> int:
    """Bytes of the weights, their gradients and AdamW's two moments (float32): 16 per parameter."""
    d_inner = 2 * cfg.d_model
    nheads = max(1, d_inner // max(1, cfg.headdim))
    conv_dim = d_inner + 2 * cfg.d_state
    d_in_proj = 2 * d_inner + 2 * cfg.d_state + nheads
    per_layer = d_in_proj * cfg.d_model + conv_dim * 5 + 3 * nheads + d_inner + d_inner * cfg.d_model + cfg.d_model
    return 16 * (vocab_size * cfg.d_model + cfg.n_layer * per_layer + cfg.d_model)


def physical_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not every platform tells
        return None


def tightest_machine(machines) -> tuple[str, int, int | None]:
    """Of the job's machines, (name, ranks on it, memory bytes), the one with the least memory a rank: each rank
    holds the same weights and the same share of a step, so if any machine runs short, that one does."""
    known = [m for m in machines if m[2] is not None]
    return min(known, key=lambda m: m[2] / m[1]) if known else (machines[0][0], machines[0][1], None)


def train_config_problems(cfg, explicit=(), stop_at=None, resumed_step: int = 0, machine: bool = True,
                          vocab_size: int = VOCAB, ranks: int = 1, machines=None) -> list[str]:
    """Every problem of `cfg` (a TrainConfig), as messages naming flags. `explicit`: the fields given on the
    command line (a default warmup longer than a short run is shortened; a given one is an error).
    machine=False leaves out what depends on this machine (the backends it has, its memory): for judging
    a saved config. vocab_size: the embedding rows the run trains (a tokenizer's or --init-from's, padded).
    ranks: the MPI ranks sharing each step's batch; machines: (name, ranks on it, memory bytes) for each machine
    of the job (World.machines), None for this one alone. Each rank holds the weights, their gradients and
    optimizer state, and its own share's activations."""

    bad = []
    for field, low in _MIN_INT.items():
        value = getattr(cfg, field)
        if not is_integer(value):
            bad.append(f"{flag(field)} must be an integer, got {value!r}")
        elif value < low:
            bad.append(f"{flag(field)} must be >= {low}, got {value}")
        elif field == "sample_bytes" and value > MAX_SAMPLE:   # made a token at a time at the end: 1e22 never ended
            bad.append(f"--sample-bytes must be at most {MAX_SAMPLE:,} (the end's sample is made a token at a time; "
                       f"`generate --model RUN --max-new-tokens N` writes a longer text), got {value}")
    floats = {"lr": (0, None, False), "weight_decay": (0, None, True), "grad_clip": (0, None, False),
              "val_fraction": (0, 1, False), "beta1": (0, 1, True), "beta2": (0, 1, True)}
    for field, (low, high, low_ok) in floats.items():
        value = getattr(cfg, field)
        if not is_real_number(value) or not math.isfinite(value):
            bad.append(f"{flag(field)} must be a finite number, got {value!r}")
        elif value < low or (value == low and not low_ok) or (high is not None and value >= high):
            interval = f"{'[' if low_ok else '('}{low}, {'inf)' if high is None else f'{high})'}"
            bad.append(f"{flag(field)} must be in {interval}, got {value}")
    if cfg.min_lr is not None:
        if not is_real_number(cfg.min_lr) or not math.isfinite(cfg.min_lr):
            bad.append(f"--min-lr must be a finite number, got {cfg.min_lr!r}")
        elif is_real_number(cfg.lr) and not 0 <= cfg.min_lr <= cfg.lr:
            bad.append(f"--min-lr must be in [0, --lr = {cfg.lr}], got {cfg.min_lr}")
    if not isinstance(cfg.backend, str) or (machine and cfg.backend != "auto" and
                                            cfg.backend not in available_backends()):
        bad.append(f"--backend must be 'auto' or one of {', '.join(available_backends())}, got {cfg.backend!r}")
    for field in ("out", "sample_prompt", "text_field"):
        if not isinstance(getattr(cfg, field), str):
            bad.append(f"{flag(field)} must be a string, got {getattr(cfg, field)!r}")
    for field in ("data", "val_data"):
        if getattr(cfg, field) is not None and not isinstance(getattr(cfg, field), str):
            bad.append(f"{flag(field)} must be a path, got {getattr(cfg, field)!r}")
    if cfg.val_data is not None and "val_fraction" in explicit:
        bad.append(f"--val-fraction {cfg.val_fraction} splits --data into training and validation, and --val-data "
                   f"gives the validation text: leave one of them out")
    if stop_at is not None and (not is_integer(stop_at) or stop_at < 1):
        bad.append(f"--stop-at must be a step >= 1, got {stop_at!r}")
    if cfg.dtype not in ("float32", "float64"):
        bad.append(f"--dtype must be float32 or float64, got {cfg.dtype!r}")
    if bad:  # the checks below combine settings that are each fine
        return bad
    if (2 * cfg.d_model) % cfg.headdim:
        bad.append(f"--headdim {cfg.headdim} must divide 2 * --d-model = {2 * cfg.d_model}")
    if cfg.batch_size % cfg.grad_accum:
        bad.append(f"--grad-accum {cfg.grad_accum} must divide --batch-size {cfg.batch_size} (each step's batch in "
                   f"that many equal micro-batches); give one of {', '.join(map(str, divisors(cfg.batch_size)))}")
    if cfg.lr * cfg.weight_decay > 2:  # AdamW: w <- (1 - lr wd) w - lr update; |1 - lr wd| > 1 grows w every step
        bad.append(f"--weight-decay {cfg.weight_decay} with --lr {cfg.lr}: AdamW's decay multiplies the matrices by "
                   f"1 - lr x weight decay = {1 - cfg.lr * cfg.weight_decay:.3g} at each step at the peak, which grows "
                   f"them until they overflow; keep --lr x --weight-decay well under 1 (torch's AdamW defaults, lr 1e-3 "
                   f"and weight decay 0.01, give 1e-5)")
    if "warmup_steps" in explicit and cfg.warmup_steps > cfg.steps:
        bad.append(f"--warmup-steps {cfg.warmup_steps} is longer than the whole run (--steps {cfg.steps}): the "
                   f"learning rate would never reach --lr; give at most {cfg.steps}")
    if cfg.steps < resumed_step:                                      # a run cannot go back
        bad.append(f"--steps {cfg.steps} is before the checkpoint being resumed (step {resumed_step}); give "
                   f"--steps {resumed_step} or more (the step the run ends at)")
    elif stop_at is not None:
        if stop_at > cfg.steps:
            bad.append(f"--stop-at {stop_at} is past the end of the run (--steps {cfg.steps}); give a step in "
                       f"[{resumed_step + 1}, {cfg.steps}] or raise --steps")
        elif stop_at <= resumed_step:
            room = (f"give a step in [{resumed_step + 1}, {cfg.steps}]" if cfg.steps > resumed_step else  # none left:
                    f"the run has done all its --steps {cfg.steps}; raise --steps to train on")      # [3, 2] said so
            bad.append(f"--stop-at {stop_at} is not after the checkpoint being resumed (step {resumed_step}); {room}")
    name, ranks_here, have = tightest_machine(machines or [("", 1, physical_memory_bytes())])
    have = have if machine else None
    weights = parameter_memory_bytes(cfg, vocab_size)
    weights, need = ranks_here * weights, ranks_here * (weights + step_memory_bytes(cfg, vocab_size, ranks))
    vocab = "" if vocab_size == VOCAB else f", vocabulary {vocab_size:,}"   # a tokenizer's or a checkpoint's
    this = "this machine" if machines is None or len(machines) == 1 else f"machine {name}"
    here = "" if ranks_here == 1 else f" (for each of the {ranks_here} MPI ranks on {this})"
    if have is not None and weights > have:
        bad.append(f"--d-model {cfg.d_model} with --n-layer {cfg.n_layer} and --d-state {cfg.d_state}{vocab} makes "
                   f"a model whose weights, gradients and optimizer state need about {weights / 2 ** 30:,.0f} GiB"
                   f"{here}, more than {this}'s {have / 2 ** 30:,.0f} GiB of memory; lower --d-model or "
                   f"--n-layer{'' if ranks_here == 1 else ', or start fewer ranks on each machine'}")
    elif have is not None and need > have:
        micro = "" if cfg.grad_accum == 1 else f" in {cfg.grad_accum} micro-batches"
        share = "" if ranks == 1 else f" ({cfg.batch_size // ranks} sequences on each of {ranks} MPI ranks)"
        bad.append(f"--batch-size {cfg.batch_size}{share} x --seq-len {cfg.seq_len}{micro} (with --d-model "
                   f"{cfg.d_model}, --n-layer {cfg.n_layer}{vocab}) needs about {need / 2 ** 30:,.0f} GiB for one "
                   f"training step{here}, more than {this}'s {have / 2 ** 30:,.0f} GiB of memory; raise "
                   f"--grad-accum (the same step in smaller pieces) or lower --batch-size or --seq-len")
    return bad


def check_train_config(cfg, explicit=(), stop_at=None, resumed_step: int = 0, vocab_size: int = VOCAB,
                       ranks: int = 1, machines=None) -> None:
    """Raise ValueError listing every problem (one line each), or return."""
    bad = train_config_problems(cfg, explicit, stop_at, resumed_step, vocab_size=vocab_size, ranks=ranks,
                                machines=machines)
    if bad:
        raise ValueError("; ".join(bad) if len(bad) == 1 else "\n  " + "\n  ".join(bad))
