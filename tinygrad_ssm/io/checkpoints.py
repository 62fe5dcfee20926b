"""The checkpoint folders of a training run, as the library reads them (from_pretrained of a run folder) and the
training application writes them (train/checkpoint.py):

    run/checkpoints/step-000200/   one complete checkpoint (older ones are pruned: the newest `keep` stay, and
                                   the one with the best validation of its own step)
        config.json, model.safetensors   written by `model.save_pretrained` (so from_pretrained reads it)
        optimizer.safetensors            optimizer moments, flattened to name -> array
        trainer_state.json               step, tokens seen, validation (val_bpb, val_bpb_step), train config,
                                         data sampler + RNG state, the size and SHA-256 of each file above
                                         ("files": a file damaged on disk afterwards is refused, naming it), ...
    run/checkpoints/LATEST           the name of the newest complete checkpoint folder
"""
from __future__ import annotations

import hashlib
import json
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


class CheckpointDamaged(CheckpointNotFound):
    """A checkpoint's file no longer has the size or SHA-256 its trainer_state.json recorded when it was saved."""


FILE_DIGESTS = "files"  # trainer_state.json's field: file name -> {"bytes": size, "sha256": hex digest}


STATE_DIGEST = "state_sha256"  # trainer_state.json's field: the SHA-256 of the rest of it (state_digest)


def state_digest(state: dict) -> str:
    """The SHA-256 of a trainer state's content (canonical JSON: sorted keys, no spaces) but its "files" record and
    this digest: the "files" digests cover every file but trainer_state.json itself, where one changed digit of
    the sampler's state or the lr resumed a run that was no longer the one saved, without a word (an audit). The
    record is left out so that an entry removed on purpose (a file changed by hand) still loads; a record damaged
    otherwise no longer matches its files."""
    rest = {k: v for k, v in state.items() if k not in (STATE_DIGEST, FILE_DIGESTS)}
    return hashlib.sha256(json.dumps(rest, sort_keys=True, separators=(",", ":")).encode("utf-8")).hexdigest()


def file_digest(path) -> dict:
    """{"bytes": size, "sha256": hex} of the file at `path`, read in pieces (never all of it in memory)."""
    with open(path, "rb") as f:
        digest = hashlib.file_digest(f, "sha256") if hasattr(hashlib, "file_digest") else _sha256_of(f)
        return {"bytes": f.tell(), "sha256": digest.hexdigest()}


def _sha256_of(f):  # Python 3.10 has no hashlib.file_digest
    digest = hashlib.sha256()
    while piece := f.read(1 << 22):
        digest.update(piece)
    return digest


def is_digest_record(value) -> bool:
    """A trainer_state.json "files" field: {name: {"bytes": int >= 0, "sha256": 64 lowercase hex digits}}, each
    name a file of the folder itself (no path: a record naming /dev/zero or ../x would be read)."""
    return isinstance(value, dict) and all(
        isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\\" not in name
        and isinstance(d, dict) and set(d) == {"bytes", "sha256"}
        and isinstance(d["bytes"], int) and not isinstance(d["bytes"], bool) and d["bytes"] >= 0
        and isinstance(d["sha256"], str) and re.fullmatch(r"[0-9a-f]{64}", d["sha256"]) is not None
        for name, d in value.items())


def check_file_digests(checkpoint_dir, names=None, state: dict | None = None) -> None:
    """Each file `names` (all it recorded when None) of a checkpoint folder against the size and SHA-256 that its
    trainer_state.json recorded when the checkpoint was saved; CheckpointDamaged names the first that differs (a
    file cut short, zeroed or changed on disk since). A checkpoint saved before the record, or a folder without
    trainer_state.json, has nothing to check against. `state`: the trainer state when the caller has read it."""
    checkpoint_dir = Path(checkpoint_dir)
    if state is None:
        if not os.path.lexists(checkpoint_dir / STATE_FILE):
            return  # not a training checkpoint
        require_regular_file(checkpoint_dir / STATE_FILE, "trainer state", CheckpointDamaged)  # a FIFO: never read
        try:
            state = json.loads((checkpoint_dir / STATE_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):
            return  # not a training checkpoint (or its state is unreadable: load_trainer_state names that)
    if isinstance(state, dict) and STATE_DIGEST in state and state[STATE_DIGEST] != state_digest(state):
        others = (f"resume from another checkpoint (this run's: {checkpoint_names(run_dir_of(checkpoint_dir))})"
                  if checkpoint_dir.parent.name == CHECKPOINTS_DIR else "use an undamaged copy")
        raise CheckpointDamaged(f"{str(checkpoint_dir / STATE_FILE)!r} is damaged: its content differs from the one "
                                f"saved (its {STATE_DIGEST!r}); {others}. Changed on purpose: remove its "
                                f"{STATE_DIGEST!r} line to load it unchecked")
    record = state.get(FILE_DIGESTS) if isinstance(state, dict) else None
    if record is None:
        return
    if not is_digest_record(record):
        raise CheckpointDamaged(f"{str(checkpoint_dir / STATE_FILE)!r} is damaged: its {FILE_DIGESTS!r} must map "
                                f"file names to {{'bytes': size, 'sha256': hex}}; resume from another checkpoint")
    for name in (record if names is None else [n for n in names if n in record]):
        path = checkpoint_dir / name
        require_regular_file(path, "checkpoint file", CheckpointDamaged)   # a FIFO's read would never end
        try:
            found = file_digest(path)
        except OSError as e:
            raise CheckpointDamaged(f"cannot read {str(path)!r} to check it: {e.strerror or e}") from e
        if found != record[name]:
            what = (f"{found['bytes']:,} bytes where {record[name]['bytes']:,} were saved"
                    if found["bytes"] != record[name]["bytes"] else "its SHA-256 differs from the one saved")
            others = (f"use another checkpoint (this run's: {checkpoint_names(run_dir_of(checkpoint_dir))})"
                      if checkpoint_dir.parent.name == CHECKPOINTS_DIR else "use an undamaged copy")
            raise CheckpointDamaged(f"{str(path)!r} is damaged: {what} (the file changed on disk after the "
                                    f"checkpoint was written); {others}. A file changed on purpose: remove its "
                                    f"entry from {FILE_DIGESTS!r} in {STATE_FILE} to load it unchecked")



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


def latest_name(path) -> str | None:
    """What LATEST of the run folder `path` (or of its checkpoints/ folder) names now; None for any other path."""
    p = Path(path).expanduser()
    latest = (p.parent if p.name == CHECKPOINTS_DIR else p) / CHECKPOINTS_DIR / LATEST_FILE
    try:
        return latest.read_text(encoding="utf-8", errors="replace").strip() if latest.is_file() else None
    except OSError:
        return None


def read_newest(path, read, attempts: int = 3):
    """read(path), again while the run's LATEST moved on during it: a run saving beside the reader (with
    --keep-checkpoints 1 it prunes the checkpoint LATEST named a moment before) made a reader of a run folder fail,
    saying that a checkpoint which was whole when it started is missing or incomplete. A checkpoint folder named
    itself is read once: the one asked for is gone."""
    for attempt in range(attempts):
        before = latest_name(path)
        try:
            return read(path)
        except (OSError, ValueError):
            if attempt == attempts - 1 or before is None or latest_name(path) == before:
                raise


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
