"""The checkpoint folders of a training run, as the library reads them (from_pretrained of a run folder) and the
training application writes them (train/checkpoint.py):

    run/checkpoints/step-000200/   one complete checkpoint (older ones are pruned: the newest `keep` stay, and
                                   the one with the best validation of its own step)
        config.json, model.safetensors   written by `model.save_pretrained` (so from_pretrained reads it)
        optimizer.safetensors            optimizer moments, flattened to name -> array
        trainer_state.json               step, tokens seen, validation (val_bpb, val_bpb_step), train config,
                                         data sampler + RNG state, ...
    run/checkpoints/LATEST           the name of the newest complete checkpoint folder
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from .file_checks import require_regular_file

CHECKPOINTS_DIR = "checkpoints"
LATEST_FILE = "LATEST"
STATE_FILE = "trainer_state.json"
OPTIMIZER_FILE = "optimizer.safetensors"
FORMAT_VERSION = 1
CHECKPOINT_NAME = re.compile(r"step-\d{6,}")  # the only names LATEST may hold: a folder beside it
# the files a checkpoint needs to be resumed from (generation needs only the first two)
CHECKPOINT_FILES = ("config.json", "model.safetensors", OPTIMIZER_FILE, STATE_FILE)


def step_of(name: str) -> int:
    """The step a checkpoint folder's name (CHECKPOINT_NAME) gives: step-000660 -> 660."""
    return int(name.removeprefix("step-"))


class CheckpointNotFound(FileNotFoundError):
    pass



def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """A checkpoint folder, or a run folder or its checkpoints/ folder (-> its newest checkpoint). Raises
    CheckpointNotFound.

    LATEST may only name a checkpoint folder beside it (step-NNNNNN): a pointer holding a path could send a
    resume (which writes into the checkpoint's run folder) into some other folder."""
    p = Path(path).expanduser()
    if not p.exists():
        raise CheckpointNotFound(f"checkpoint path {str(p)!r} does not exist")
    if (p / STATE_FILE).exists():
        return p
    if p.name == CHECKPOINTS_DIR and (p / LATEST_FILE).exists():        # run/checkpoints: the run's newest
        p = p.parent
    latest = p / CHECKPOINTS_DIR / LATEST_FILE
    if latest.exists():
        require_regular_file(latest, "checkpoint pointer", CheckpointNotFound)
        name = latest.read_text(encoding="utf-8", errors="replace").strip()
        if not CHECKPOINT_NAME.fullmatch(name):
            raise CheckpointNotFound(f"{str(latest)!r} holds {name[:80]!r}, not the name of a checkpoint folder "
                                     f"beside it (step-NNNNNN); write the newest complete checkpoint's name "
                                     f"into it (its folders: {checkpoint_names(p)})")
        if (p / CHECKPOINTS_DIR / name / STATE_FILE).is_file():
            return p / CHECKPOINTS_DIR / name
        raise CheckpointNotFound(f"{str(latest)!r} names {name!r}, which is not a complete checkpoint "
                                 f"(its folders: {checkpoint_names(p)})")
    saved = checkpoint_names(p)
    if saved:  # LATEST is written after the folder: a failed write (a full disk) leaves a checkpoint without it
        raise CheckpointNotFound(f"{str(p)!r} is a run folder without {CHECKPOINTS_DIR}/{LATEST_FILE} (which names "
                                 f"the newest complete checkpoint), but it holds the checkpoint folders {saved}: "
                                 f"give one of them, e.g. {str(p / CHECKPOINTS_DIR / saved[-1])!r}")
    raise CheckpointNotFound(f"{str(p)!r} is neither a checkpoint folder (no {STATE_FILE}) nor a run folder "
                             f"(no {CHECKPOINTS_DIR}/{LATEST_FILE})")


def checkpoint_names(run: Path) -> list[str]:
    """The checkpoint folders (step-NNNNNN) of a run folder, oldest first; each got its name once complete."""
    root = run / CHECKPOINTS_DIR
    names = [q.name for q in root.iterdir() if q.is_dir() and CHECKPOINT_NAME.fullmatch(q.name)] if root.is_dir() else []
    return sorted(names, key=step_of)  # by step, not as strings: step-1000000 after step-999999


def run_dir_of(checkpoint_dir: Path) -> Path:
    """The run folder a checkpoint folder belongs to (run/checkpoints/step-N -> run)."""
    checkpoint_dir = Path(checkpoint_dir)
    if checkpoint_dir.parent.name == CHECKPOINTS_DIR:
        return checkpoint_dir.parent.parent
    return checkpoint_dir
