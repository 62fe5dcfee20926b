"""Removing what a killed save or prune of a checkpoint left in checkpoints/, and nothing else.

train/checkpoint.py writes a checkpoint in a hidden temporary folder `.step-NNNNNN.RANDOM.tmp` and, to replace or
prune one, first renames it into a hidden folder `.step-NNNNNN.RANDOM.old` (io/atomic_write.new_temporary_folder
makes both), and writes LATEST through a temporary file `.LATEST.RANDOM.tmp`. A process killed at that moment
(kill -9, a power loss, the OOM killer) leaves such a folder or file behind for good: every later kill adds one, and
each folder holds a checkpoint's weights. The next training that claims the run
folder (train/run_folder.claim_run_folder, holding its lock: no other save of this run is under way) removes them,
but only a folder it can prove is such a leftover: its name is exactly of that pattern, it is a folder (not a
link), and it holds only what those folders hold (the checkpoint's file names and their temporary files, regular
files; in a `.old` folder, the checkpoint folder of its own step, holding only those). Anything else, a folder of
the user's named alike with other files in it included, is left as it is.
"""
from __future__ import annotations

import os
import re
import shutil
import stat
from pathlib import Path

from ..io.checkpoints import CHECKPOINT_FILES, LATEST_FILE
from ..models.mamba2.pretrained import GENERATION_CONFIG_NAME
from ..tokenizer import TOKENIZER_CONFIG_FILE, TOKENIZER_FILE

# what a checkpoint folder holds (train/checkpoint.save_checkpoint): the files it needs, its tokenizer's copy and
# what it carries from --init-from's folder (starting_point.carried_files: a fine-tune's save killed with only that
# file written was left for good)
_FILE_NAMES = frozenset(CHECKPOINT_FILES) | {TOKENIZER_FILE, TOKENIZER_CONFIG_FILE, GENERATION_CONFIG_NAME}
# a temporary file of one of them (io/atomic_write.new_temporary_file: `.NAME.RANDOM.tmp`, RANDOM 8 hex digits)
_TEMPORARY_FILE = re.compile(r"\.(?P<name>[^/]+)\.[0-9a-f]{8}\.tmp")
# the leftover folders themselves (new_temporary_folder's names for a checkpoint step-NNNNNN)
DEBRIS_FOLDER = re.compile(r"\.(?P<step>step-\d{6,})\.[0-9a-f]{8}\.(?P<kind>tmp|old)")
# a temporary file of LATEST (write_atomic's, killed before its rename)
DEBRIS_LATEST = re.compile(r"\." + re.escape(LATEST_FILE) + r"\.[0-9a-f]{8}\.tmp")


def _is_real(path: str, kind) -> bool:
    """`path` is (without following a link) of the `kind` stat.S_ISDIR / S_ISREG."""
    try:
        return kind(os.lstat(path).st_mode)
    except OSError:
        return False


def _holds_only_checkpoint_files(folder: str) -> bool:
    """Every entry of `folder` is a regular file named as a checkpoint's files are, or a temporary file of one."""
    try:
        names = os.listdir(folder)
    except OSError:
        return False
    for name in names:
        temporary = _TEMPORARY_FILE.fullmatch(name)
        if name not in _FILE_NAMES and not (temporary and temporary["name"] in _FILE_NAMES):
            return False
        if not _is_real(os.path.join(folder, name), stat.S_ISREG):
            return False
    return True


def is_checkpoint_debris(path: str | os.PathLike) -> bool:
    """Whether `path` is a leftover of a killed save or prune (module docstring), provably."""
    path = os.fspath(path)
    if DEBRIS_LATEST.fullmatch(os.path.basename(path)):
        return _is_real(path, stat.S_ISREG)
    match = DEBRIS_FOLDER.fullmatch(os.path.basename(path))
    if match is None or not _is_real(path, stat.S_ISDIR):
        return False
    if match["kind"] == "tmp":
        return _holds_only_checkpoint_files(path)
    try:
        names = os.listdir(path)
    except OSError:
        return False
    if not names:                                   # killed between making the folder and the rename into it
        return True
    inner = os.path.join(path, match["step"])
    return names == [match["step"]] and _is_real(inner, stat.S_ISDIR) and _holds_only_checkpoint_files(inner)


def remove_checkpoint_debris(checkpoints: str | os.PathLike) -> list[str]:
    """Delete the leftovers of killed saves and prunes in the run's `checkpoints` folder (every one checked first,
    then deleted); returns their names. A folder that is not one, or not there, or a link, is left as it is.
    Call it only while holding the run folder's lock."""
    checkpoints = Path(checkpoints)
    if not _is_real(os.fspath(checkpoints), stat.S_ISDIR):
        return []
    try:
        debris = sorted(p for p in checkpoints.iterdir() if is_checkpoint_debris(p))
    except OSError:
        return []
    for path in debris:                             # a leftover that cannot be deleted does not stop the run
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                path.unlink()
            except OSError:
                pass
    return [p.name for p in debris]
