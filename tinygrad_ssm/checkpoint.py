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
import os
import shutil
import tempfile
from pathlib import Path

from .atomic_write import write_atomic
from .safetensors_io import load_file, save_file

CHECKPOINTS_DIR = "checkpoints"
LATEST_FILE = "LATEST"
STATE_FILE = "trainer_state.json"
OPTIMIZER_FILE = "optimizer.safetensors"
FORMAT_VERSION = 1


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
    """A checkpoint folder, or a run folder (-> its newest checkpoint). Raises CheckpointNotFound."""
    p = Path(path).expanduser()
    if not p.exists():
        raise CheckpointNotFound(f"checkpoint path {str(p)!r} does not exist")
    if (p / STATE_FILE).is_file():
        return p
    latest = p / CHECKPOINTS_DIR / LATEST_FILE
    if latest.is_file():
        name = latest.read_text(encoding="utf-8").strip()
        if (p / CHECKPOINTS_DIR / name / STATE_FILE).is_file():
            return p / CHECKPOINTS_DIR / name
        raise CheckpointNotFound(f"{str(latest)!r} names {name!r}, which is not a complete checkpoint")
    raise CheckpointNotFound(f"{str(p)!r} is neither a checkpoint folder (no {STATE_FILE}) nor a run folder "
                             f"(no {CHECKPOINTS_DIR}/{LATEST_FILE})")


def run_dir_of(checkpoint_dir: Path) -> Path:
    """The run folder a checkpoint folder belongs to (run/checkpoints/step-N -> run)."""
    checkpoint_dir = Path(checkpoint_dir)
    if checkpoint_dir.parent.name == CHECKPOINTS_DIR:
        return checkpoint_dir.parent.parent
    return checkpoint_dir


def load_trainer_state(checkpoint_dir: Path) -> dict:
    path = Path(checkpoint_dir) / STATE_FILE
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointNotFound(f"cannot read {str(path)!r}: {e}") from e
    if state.get("format_version") != FORMAT_VERSION:
        raise CheckpointNotFound(f"{str(path)!r} has format_version {state.get('format_version')!r}; "
                                 f"this version reads {FORMAT_VERSION}")
    return state


def load_optimizer_state(checkpoint_dir: Path) -> dict:
    return load_file(Path(checkpoint_dir) / OPTIMIZER_FILE)
