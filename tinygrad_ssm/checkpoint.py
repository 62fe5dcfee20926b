"""Training checkpoints that are never half-written.

Layout of a run folder:

    run/checkpoints/step-000200/   one complete checkpoint (older ones are pruned, the newest `keep` stay)
        config.json, model.safetensors   written by `model.save_pretrained` (so from_pretrained reads it)
        optimizer.safetensors            optimizer moments, flattened to name -> array
        trainer_state.json               step, tokens seen, train config, data sampler + RNG state, ...
    run/checkpoints/LATEST           the name of the newest complete checkpoint folder

A checkpoint is written into a temporary folder next to its final place and renamed into place only when
every file is complete; then LATEST is replaced (os.replace of a small file is atomic). A crash at any
moment leaves LATEST pointing at a complete checkpoint.
"""
from __future__ import annotations

import json
import math
import numbers
import os
import re
import shutil
import tempfile
from pathlib import Path

from .atomic_write import write_atomic
from .file_checks import require_regular_file
from .safetensors_io import load_file, save_file

CHECKPOINTS_DIR = "checkpoints"
LATEST_FILE = "LATEST"
STATE_FILE = "trainer_state.json"
OPTIMIZER_FILE = "optimizer.safetensors"
FORMAT_VERSION = 1
CHECKPOINT_NAME = re.compile(r"step-\d{6,}")  # the only names LATEST may hold: a folder beside it
# the files a checkpoint needs to be resumed from (generation needs only the first two)
CHECKPOINT_FILES = ("config.json", "model.safetensors", OPTIMIZER_FILE, STATE_FILE)


class CheckpointNotFound(FileNotFoundError):
    pass


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


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """A checkpoint folder, or a run folder (-> its newest checkpoint). Raises CheckpointNotFound.

    LATEST may only name a checkpoint folder beside it (step-NNNNNN): a pointer holding a path could send a
    resume (which writes into the checkpoint's run folder) into some other folder."""
    p = Path(path).expanduser()
    if not p.exists():
        raise CheckpointNotFound(f"checkpoint path {str(p)!r} does not exist")
    if (p / STATE_FILE).exists():
        return p
    latest = p / CHECKPOINTS_DIR / LATEST_FILE
    if latest.exists():
        require_regular_file(latest, "checkpoint pointer", CheckpointNotFound)
        name = latest.read_text(encoding="utf-8", errors="replace").strip()
        if not CHECKPOINT_NAME.fullmatch(name):
            raise CheckpointNotFound(f"{str(latest)!r} holds {name[:80]!r}, not the name of a checkpoint folder "
                                     f"beside it (step-NNNNNN); write the newest complete checkpoint's name "
                                     f"into it (its folders: {_checkpoint_names(p)})")
        if (p / CHECKPOINTS_DIR / name / STATE_FILE).is_file():
            return p / CHECKPOINTS_DIR / name
        raise CheckpointNotFound(f"{str(latest)!r} names {name!r}, which is not a complete checkpoint "
                                 f"(its folders: {_checkpoint_names(p)})")
    raise CheckpointNotFound(f"{str(p)!r} is neither a checkpoint folder (no {STATE_FILE}) nor a run folder "
                             f"(no {CHECKPOINTS_DIR}/{LATEST_FILE})")


def _checkpoint_names(run: Path) -> list[str]:
    root = run / CHECKPOINTS_DIR
    return sorted(q.name for q in root.iterdir() if q.is_dir() and CHECKPOINT_NAME.fullmatch(q.name)) \
        if root.is_dir() else []


def run_dir_of(checkpoint_dir: Path) -> Path:
    """The run folder a checkpoint folder belongs to (run/checkpoints/step-N -> run)."""
    checkpoint_dir = Path(checkpoint_dir)
    if checkpoint_dir.parent.name == CHECKPOINTS_DIR:
        return checkpoint_dir.parent.parent
    return checkpoint_dir


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
    from .train import TrainConfig  # imported here: train imports this module
    from .train_checks import train_config_problems
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
