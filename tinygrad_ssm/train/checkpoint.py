"""Training checkpoints that are never half-written.

The run folder's layout is io/checkpoints.py's. A checkpoint is written into a temporary folder next to its final
place and renamed into place only when every file is complete; then LATEST is replaced (os.replace of a small file
is atomic). A crash at any moment leaves LATEST pointing at a complete checkpoint.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import warnings
from pathlib import Path

import numpy as np

from ..autograd.args import is_integer, is_real_number
from ..io.atomic_write import new_temporary_folder, write_atomic
from ..io.checkpoints import (CHECKPOINT_FILES, CHECKPOINT_NAME, CHECKPOINTS_DIR, FILE_DIGESTS,  # noqa: F401
                              FORMAT_VERSION, LATEST_FILE, OPTIMIZER_FILE, STATE_DIGEST, STATE_FILE,
                              CheckpointNotFound,
                              check_file_digests, checkpoint_names, file_digest, is_digest_record,
                              resolve_checkpoint, run_dir_of, state_digest, step_of)
from ..io.file_checks import require_regular_file
from ..io.finite import non_finite_problems  # noqa: F401 (step.py takes it from here)
from ..io.safetensors import load_file, save_file
from ..models.mamba2.checkpoint_config import NotMambaSsmLoadableWarning
from .checks import train_config_problems
from .config import TrainConfig
from .run_folder import RUN_ID_RULE, is_run_id


class NonFiniteCheckpoint(ValueError):
    """The weights or optimizer moments to be saved hold NaN or inf (or a negative second moment)."""


def check_loaded_state(checkpoint_dir: Path, file: str, tensors) -> None:
    """Refuse a checkpoint whose `file` (model or optimizer state, as loaded) is not finite, naming the file,
    the tensors and the other checkpoints to resume from."""
    bad = non_finite_problems(tensors)
    if bad:
        path = Path(checkpoint_dir) / file
        shown = "; ".join(bad[:5]) + (f"; and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise CheckpointNotFound(f"{str(path)!r} is damaged: {shown}; resume from another checkpoint "
                                 f"(checkpoints of this run: {checkpoint_names(run_dir_of(checkpoint_dir))})")


class CheckpointWriteRefused(FileExistsError):
    """Writing the checkpoint would follow a symbolic link or replace a folder this run cannot prove is its own."""


def save_checkpoint(run_dir: str | os.PathLike, step: int, model, optimizer_state: dict, trainer_state: dict,
                    keep: int = 2, tokenizer_files: dict | None = None) -> Path:
    """Write checkpoint `step` of the run in `run_dir` atomically; returns its folder. `trainer_state["run_id"]`
    (the run family's id) is what pruning checks: only checkpoints that carry it are ever deleted or replaced.
    tokenizer_files: the run's tokenizer, file name -> text (a copy in every checkpoint: generate, eval and
    --resume read it there), and the generation_config.json a fine-tuning run carries (starting_point)."""
    run_dir = Path(run_dir)
    bad = non_finite_problems([*model.varmap.named_vars(), *optimizer_state.items()])
    if bad:  # never written: it would become LATEST, and push the last finite checkpoint out when pruning
        raise NonFiniteCheckpoint(f"checkpoint step-{step:06d} of {str(run_dir)!r} was not written: "
                                  f"{'; '.join(bad[:5])}; the checkpoints already there were left as they are")
    root = run_dir / CHECKPOINTS_DIR
    if root.is_symlink():
        raise CheckpointWriteRefused(f"{str(root)!r} is a symbolic link; checkpoints are never written through a "
                                     f"link (it could lead out of the run folder): remove it, or choose another --out")
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    run_id = trainer_state.get("run_id")
    if os.path.lexists(final) and (run_id is None or _run_id_of(final) != run_id):
        raise CheckpointWriteRefused(f"{str(final)!r} exists and is not a checkpoint of this run (run id "
                                     f"{run_id}); it was left as it is: move it away, or choose another --out")
    foreign = _not_written_by_the_save(final) if os.path.lexists(final) else []
    if foreign:  # rewriting the step replaces the whole folder: what was put into it since would go with it
        raise CheckpointWriteRefused(f"{str(final)!r} (a checkpoint of this run, to be written again) holds what "
                                     f"the run did not write: {', '.join(foreign[:5])}; it was left as it is: move "
                                     f"those out of it, or resume from a later checkpoint")
    tmp = Path(new_temporary_folder(root, final.name))  # 0777 less the umask, as its files are 0666 less it
    try:
        with warnings.catch_warnings():  # a run's checkpoint is this package's to read, not mamba_ssm's
            warnings.simplefilter("ignore", NotMambaSsmLoadableWarning)
            model.save_pretrained(tmp)
        for name, text in (tokenizer_files or {}).items():
            write_atomic(tmp / name, text)
        save_file(tmp / OPTIMIZER_FILE, optimizer_state, metadata={"format": "tinygrad_ssm optimizer"})
        # each file's size and SHA-256, read back from the disk: a loader refuses a file changed since (a disk
        # error, a copy cut short), where NaN checks would pass a file whose last pages became zeros
        digests = {name: file_digest(tmp / name) for name in sorted(os.listdir(tmp))}
        state = {"format_version": FORMAT_VERSION, "step": step, **trainer_state, FILE_DIGESTS: digests}
        state[STATE_DIGEST] = state_digest(state)   # the file itself: a changed digit is refused on resume
        write_atomic(tmp / STATE_FILE, json.dumps(state, indent=1))
        if final.exists():  # re-writing a step of this run (a resumed run passing an old checkpoint): swap it out
            _latest_away_from(root, final.name, run_id)  # a kill between the two renames: LATEST names a whole one
            old = _move_aside(root, final)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    write_atomic(root / LATEST_FILE, final.name + "\n")
    _prune(root, keep, current=final.name, run_id=run_id)
    return final


def _latest_away_from(root: Path, name: str, run_id: str | None) -> None:
    """Before checkpoint `name` is swapped out (two renames: for a moment no folder has its name), point LATEST
    at the newest other complete checkpoint of this run family, when LATEST names `name`: a crash between the
    renames then leaves LATEST naming a checkpoint that is there (save_checkpoint points it back after). With no
    other checkpoint of the run LATEST is left as it is."""
    latest = root / LATEST_FILE
    try:
        named = latest.read_text(encoding="utf-8", errors="replace").strip() if latest.is_file() else None
    except OSError:
        named = None
    if named != name or run_id is None:
        return
    others = [p for p, _ in _ours_by_step(root, run_id)
              if p.name != name and all((p / f).is_file() and not (p / f).is_symlink() for f in CHECKPOINT_FILES)]
    if others:
        write_atomic(latest, others[-1].name + "\n")


def _move_aside(root: Path, checkpoint: Path) -> Path:
    """Rename `checkpoint` (atomically) into a new hidden folder `.step-NNNNNN.RANDOM.old` beside it and return that
    folder, for the caller to delete: a crash while deleting it then leaves a hidden folder (removed by the next
    run, checkpoint_debris.py), never a folder named like a checkpoint that holds part of one."""
    old = Path(new_temporary_folder(root, checkpoint.name, suffix=".old"))
    try:
        os.replace(checkpoint, old / checkpoint.name)
    except BaseException:
        os.rmdir(old)
        raise
    return old


def _state_of(checkpoint: Path) -> dict | None:
    """A checkpoint folder's trainer_state.json; None when it is not a (readable) one: a symbolic link, a folder
    without the file, a file that is not a JSON object."""
    path = checkpoint / STATE_FILE
    if checkpoint.is_symlink() or not checkpoint.is_dir() or path.is_symlink() or not path.is_file():
        return None
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return state if isinstance(state, dict) else None


def _run_id_of(checkpoint: Path) -> str | None:
    """The run id in a checkpoint folder's trainer_state.json; None when it is not a (readable) one of ours,
    or one from before run ids."""
    state = _state_of(checkpoint)
    return state.get("run_id") if state is not None and isinstance(state.get("run_id"), str) else None


def own_validation(state: dict | None) -> float | None:
    """The validation bits per byte of a checkpoint's own step (its trainer_state's val_bpb, when val_bpb_step is
    its step); None when the last validation before it was at an earlier step, or there was none."""
    if state is None or not is_integer(state.get("step")) or state.get("val_bpb_step") != state["step"]:
        return None
    value = state.get("val_bpb")
    return float(value) if _is_finite_number(value) else None


def _ours_by_step(root: Path, run_id: str) -> list[tuple[Path, dict]]:
    """(folder, trainer state) of this run family's checkpoints under `root`, oldest first."""
    ours = []
    for p in root.iterdir():
        state = _state_of(p) if CHECKPOINT_NAME.fullmatch(p.name) else None
        if state is not None and state.get("run_id") == run_id:
            ours.append((p, state))
    return sorted(ours, key=lambda item: step_of(item[0].name))


def best_checkpoint(run_dir: str | os.PathLike, run_id: str | None) -> tuple[Path, float] | None:
    """(folder, bits per byte) of the run family's checkpoint with the lowest validation of its own step (the
    later one on a tie), or None when none has one."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    if run_id is None or not root.is_dir():
        return None
    return _best_of(_ours_by_step(root, run_id))


def _best_of(ours: list[tuple[Path, dict]]) -> tuple[Path, float] | None:
    scored = [(value, p) for p, state in ours if (value := own_validation(state)) is not None]
    if not scored:
        return None
    best = min(value for value, _ in scored)
    return next((p, value) for value, p in reversed(scored) if value == best)


def _prune(root: Path, keep: int, current: str, run_id: str | None = None) -> None:
    """Delete this run family's checkpoints (those whose trainer_state.json holds `run_id`) but the newest `keep`
    and the one with the best validation of its own step (`best_checkpoint`: fine-tuning that starts to overfit
    keeps the checkpoint from before). A folder the run cannot prove it wrote (the user's, another run's, one
    from before run ids) is never deleted, nor counted."""
    if run_id is None or keep <= 0:
        return
    ours = _ours_by_step(root, run_id)
    best = _best_of(ours)
    for p, state in ours[:-keep]:
        if p.name != current and (best is None or p != best[0]) and not _not_written_by_the_save(p, state):
            try:
                aside = _move_aside(root, p)  # a kill inside rmtree then leaves no step-N holding part of one
            except OSError:
                continue                      # not pruned this time (as rmtree's errors were ignored)
            shutil.rmtree(aside, ignore_errors=True)


# what a save may have written into a checkpoint folder, for those saved before trainer_state.json listed its files
_SAVED_BEFORE_THE_RECORD = frozenset(CHECKPOINT_FILES) | {"tokenizer.json", "tokenizer_config.json",
                                                          "generation_config.json"}


def _not_written_by_the_save(checkpoint: Path, state: dict | None = None) -> list[str]:
    """The entries of a checkpoint folder its save did not write (sorted): a folder exported into it, a user's
    file. Pruning leaves such a checkpoint as it is, and a save refuses to write its step again: either would
    delete the folder and all in it. `state`: its trainer_state.json, when the caller has read it."""
    state = _state_of(checkpoint) if state is None else state
    record = state.get(FILE_DIGESTS) if state is not None else None
    written = set(record) | {STATE_FILE} if is_digest_record(record) else _SAVED_BEFORE_THE_RECORD
    try:
        entries = list(os.scandir(checkpoint))
    except OSError:
        return ["(unreadable)"]
    return sorted(e.name for e in entries if e.name not in written or not e.is_file(follow_symlinks=False))


def _is_finite_number(v) -> bool:
    return is_real_number(v) and math.isfinite(v)


# trainer_state.json: field -> (check, what it must be)
_STATE_FIELDS = {
    "step": (lambda v: is_integer(v) and v >= 0, "an integer >= 0"),
    "tokens": (lambda v: is_integer(v) and v >= 0, "an integer >= 0"),
    "train_s": (lambda v: _is_finite_number(v) and v >= 0, "a finite number >= 0"),
    "val_bpb": (lambda v: v is None or _is_finite_number(v), "null or a finite number"),
    "train_config": (lambda v: isinstance(v, dict), "an object"),
    "model_config": (lambda v: isinstance(v, dict), "an object"),
    "sampler": (lambda v: isinstance(v, dict) and is_integer(v.get("batches_drawn")) and
                isinstance(v.get("bit_generator"), dict) and all(is_integer(v.get(k)) for k in
                                                                 ("batch_size", "seq_len", "data_len")),
                "an object with batches_drawn, bit_generator, batch_size, seq_len and data_len"),
    "data_fingerprint": (lambda v: isinstance(v, dict), "an object"),
}
# optional fields (checkpoints written before them lack them): field -> (check, what it must be)
_OPTIONAL_STATE_FIELDS = {
    "run_id": (is_run_id, f"a run id ({RUN_ID_RULE})"),
    FILE_DIGESTS: (is_digest_record, "file names mapped to {'bytes': size, 'sha256': hex}"),
    STATE_DIGEST: (lambda v: isinstance(v, str) and len(v) == 64, "a SHA-256 in hex"),
    "threads": (lambda v: is_integer(v) and v >= 1, "an integer >= 1 (numba's thread count)"),
}


def load_trainer_state(checkpoint_dir: Path) -> dict:
    """The checkpoint's trainer_state.json, checked field by field, after checking that every file a resume
    reads is there: a damaged checkpoint fails here, naming the file or field, before anything is built."""
    checkpoint_dir = Path(checkpoint_dir)
    for name in CHECKPOINT_FILES:
        try:
            require_regular_file(checkpoint_dir / name, "checkpoint file", CheckpointNotFound)
        except CheckpointNotFound as e:
            others = checkpoint_names(run_dir_of(checkpoint_dir))
            raise CheckpointNotFound(f"{e}: the checkpoint {str(checkpoint_dir)!r} is incomplete; resume from "
                                     f"another one (checkpoints of this run: {others})") from None
    path = checkpoint_dir / STATE_FILE
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:  # (ValueError: also an int past Python's 4,300 digits)
        raise CheckpointNotFound(f"cannot read {str(path)!r}: {type(e).__name__}: {str(e)[:200]}") from e
    if not isinstance(state, dict):
        raise CheckpointNotFound(f"{str(path)!r} must hold a JSON object")
    if state.get("format_version") != FORMAT_VERSION:
        raise CheckpointNotFound(f"{str(path)!r} has format_version {state.get('format_version')!r}; "
                                 f"this version reads {FORMAT_VERSION}")
    bad = [f"{field!r} must be {what}, got {state[field]!r}" if field in state else f"{field!r} is missing"
           for field, (ok, what) in _STATE_FIELDS.items() if field not in state or not ok(state[field])]
    bad += [f"{field!r} must be {what}, got {state[field]!r}" for field, (ok, what) in _OPTIONAL_STATE_FIELDS.items()
            if field in state and not ok(state[field])]
    if bad:
        raise CheckpointNotFound(f"{str(path)!r} is damaged: {'; '.join(bad)}; resume from another checkpoint")
    try:
        bad = train_config_problems(TrainConfig.from_dict(state["train_config"]), machine=False)
    except (TypeError, ValueError) as e:
        bad = [str(e)]
    if bad:
        raise CheckpointNotFound(f"{str(path)!r} is damaged: its 'train_config' is not a valid run "
                                 f"({'; '.join(bad)}); resume from another checkpoint")
    counters = {"the folder's name": step_of(checkpoint_dir.name) if CHECKPOINT_NAME.fullmatch(checkpoint_dir.name)
                else None, "the sampler's batches_drawn": state["sampler"].get("batches_drawn")}
    disagree = [f"{what} says {n}" for what, n in counters.items() if n is not None and n != state["step"]]
    if disagree:  # resumed as it was, the run would rewrite and then prune the checkpoint it came from
        raise CheckpointNotFound(f"{str(path)!r} is damaged: its 'step' is {state['step']}, but "
                                 f"{', '.join(disagree)}; resume from another checkpoint")
    check_file_digests(checkpoint_dir, state=state)  # every file a resume reads, as it was saved
    return state


def check_optimizer_steps(checkpoint_dir: Path, step: int, moments: dict) -> None:
    """Each parameter's AdamW step count is at most the checkpoint's step, and the largest is that step (every
    parameter with a gradient is updated at every step): a moment file from another checkpoint fails here."""
    not_counts = [k for k, v in moments.items()                   # int() of a (2,) array: a bare TypeError out of
                  if k.endswith("/step") and (np.ndim(v) != 0 or np.asarray(v).dtype.kind not in "iu")]   # the CLI
    if not_counts:
        raise CheckpointNotFound(f"{str(Path(checkpoint_dir) / OPTIMIZER_FILE)!r} is damaged: {not_counts[0]!r} is not "
                                 f"a step count (a 0-d integer); resume from another checkpoint")
    counts = {int(v) for k, v in moments.items() if k.endswith("/step")}
    if counts and (max(counts) != step or min(counts) < 0):
        raise CheckpointNotFound(f"{str(Path(checkpoint_dir) / OPTIMIZER_FILE)!r} does not belong to step {step}: "
                                 f"its parameters' step counts are {sorted(counts)[:5]}; resume from another "
                                 f"checkpoint")


def load_optimizer_state(checkpoint_dir: Path) -> dict:
    return load_file(Path(checkpoint_dir) / OPTIMIZER_FILE)
