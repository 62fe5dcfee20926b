"""Training checkpoints that are never half-written.

The run folder's layout is io/checkpoints.py's. A checkpoint is written into a temporary folder next to its final
place and renamed into place only when every file is complete; then LATEST is replaced (os.replace of a small file
is atomic). A crash at any moment leaves LATEST pointing at a complete checkpoint.
"""
from __future__ import annotations

import json
import math
import numbers
import os

import shutil
import tempfile
from pathlib import Path

from ..io.atomic_write import write_atomic
from ..io.checkpoints import (CHECKPOINT_FILES, CHECKPOINT_NAME, CHECKPOINTS_DIR, FORMAT_VERSION,  # noqa: F401
                              LATEST_FILE, OPTIMIZER_FILE, STATE_FILE, CheckpointNotFound, _checkpoint_names,
                              resolve_checkpoint, run_dir_of)
from ..io.file_checks import require_regular_file
from ..io.safetensors import load_file, save_file
from .checks import train_config_problems
from .config import TrainConfig


def save_checkpoint(run_dir: str | os.PathLike, step: int, model, optimizer_state: dict, trainer_state: dict,
                    keep: int = 2) -> Path:
    """Write checkpoint `step` of the run in `run_dir` atomically; returns its folder."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{final.name}.", suffix=".tmp"))
    try:
        model.save_pretrained(tmp)
        save_file(tmp / OPTIMIZER_FILE, optimizer_state, metadata={"format": "tinygrad_ssm optimizer"})
        state = {"format_version": FORMAT_VERSION, "step": step, **trainer_state}
        write_atomic(tmp / STATE_FILE, json.dumps(state, indent=1))
        if final.exists():  # re-writing a step (a resumed run passing an old checkpoint): swap it out
            old = Path(tempfile.mkdtemp(dir=root, prefix=f".{final.name}.", suffix=".old"))
            os.replace(final, old / final.name)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    write_atomic(root / LATEST_FILE, final.name + "\n")
    _prune(root, keep, current=final.name)
    return final


def _prune(root: Path, keep: int, current: str) -> None:
    done = sorted(p for p in root.glob("step-*") if p.is_dir() and not p.name.endswith((".tmp", ".old")))
    for p in done[:-keep] if keep > 0 else []:
        if p.name != current:
            shutil.rmtree(p, ignore_errors=True)


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)


# trainer_state.json: field -> (check, what it must be)
_STATE_FIELDS = {
    "step": (lambda v: _is_int(v) and v >= 0, "an integer >= 0"),
    "tokens": (lambda v: _is_int(v) and v >= 0, "an integer >= 0"),
    "train_s": (lambda v: _is_number(v) and v >= 0, "a finite number >= 0"),
    "val_bpb": (lambda v: v is None or _is_number(v), "null or a finite number"),
    "train_config": (lambda v: isinstance(v, dict), "an object"),
    "model_config": (lambda v: isinstance(v, dict), "an object"),
    "sampler": (lambda v: isinstance(v, dict) and _is_int(v.get("batches_drawn")) and
                isinstance(v.get("bit_generator"), dict) and all(_is_int(v.get(k)) for k in
                                                                 ("batch_size", "seq_len", "data_len")),
                "an object with batches_drawn, bit_generator, batch_size, seq_len and data_len"),
    "data_fingerprint": (lambda v: isinstance(v, dict), "an object"),
}


def load_trainer_state(checkpoint_dir: Path) -> dict:
    """The checkpoint's trainer_state.json, checked field by field, after checking that every file a resume
    reads is there: a damaged checkpoint fails here, naming the file or field, before anything is built."""
    checkpoint_dir = Path(checkpoint_dir)
    for name in CHECKPOINT_FILES:
        try:
            require_regular_file(checkpoint_dir / name, "checkpoint file", CheckpointNotFound)
        except CheckpointNotFound as e:
            others = _checkpoint_names(run_dir_of(checkpoint_dir))
            raise CheckpointNotFound(f"{e}: the checkpoint {str(checkpoint_dir)!r} is incomplete; resume from "
                                     f"another one (checkpoints of this run: {others})") from None
    path = checkpoint_dir / STATE_FILE
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointNotFound(f"cannot read {str(path)!r}: {e}") from e
    if not isinstance(state, dict):
        raise CheckpointNotFound(f"{str(path)!r} must hold a JSON object")
    if state.get("format_version") != FORMAT_VERSION:
        raise CheckpointNotFound(f"{str(path)!r} has format_version {state.get('format_version')!r}; "
                                 f"this version reads {FORMAT_VERSION}")
    bad = [f"{field!r} must be {what}, got {state[field]!r}" if field in state else f"{field!r} is missing"
           for field, (ok, what) in _STATE_FIELDS.items() if field not in state or not ok(state[field])]
    if bad:
        raise CheckpointNotFound(f"{str(path)!r} is damaged: {'; '.join(bad)}; resume from another checkpoint")
    try:
        bad = train_config_problems(TrainConfig.from_dict(state["train_config"]), machine=False)
    except (TypeError, ValueError) as e:
        bad = [str(e)]
    if bad:
        raise CheckpointNotFound(f"{str(path)!r} is damaged: its 'train_config' is not a valid run "
                                 f"({'; '.join(bad)}); resume from another checkpoint")
    return state


def load_optimizer_state(checkpoint_dir: Path) -> dict:
    return load_file(Path(checkpoint_dir) / OPTIMIZER_FILE)
