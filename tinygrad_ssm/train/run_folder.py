"""Claiming a run folder: one training at a time, never into someone else's files.

- A lock (fcntl.flock on `run.lock` inside the folder) is held while a training writes there; a second
  training on the same folder refuses at once, naming the folder and the process that holds it. The kernel
  drops the lock when the process ends, however it ends, so a crash never leaves a stale lock behind.
- A new run (not --resume) goes only into a folder that does not exist, is empty, or holds only the files a
  run of ours writes but no checkpoint (a run stopped before its first checkpoint: its log is cleared). A
  folder with a checkpoint must be resumed; any other non-empty folder is refused, so nothing of the user's
  is appended to or overwritten.
"""
from __future__ import annotations

import os
import weakref
from pathlib import Path

from ..io.checkpoints import CHECKPOINTS_DIR, LATEST_FILE
from .log import LOG_FILE, PLOT_FILE

LOCK_FILE = "run.lock"
OUR_FILES = frozenset({LOCK_FILE, LOG_FILE, PLOT_FILE, CHECKPOINTS_DIR})

try:
    import fcntl
except ImportError:  # Windows: no flock; the folder checks still apply
    fcntl = None


class RunFolderError(FileExistsError):
    """The run folder is in use by another training, or is not a folder a new run may write into."""


class RunFolderLock:
    """An exclusive lock on a run folder, held until `release()` (or the process ends)."""

    def __init__(self, out: Path, fd: int | None):
        self.out, self._fd = out, fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            _held.pop(_key(self.out), None)
            os.close(fd)  # closing the descriptor releases the flock

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()
        return False

    def __del__(self):
        self.release()


# folders this process holds (a nested claim reuses the lock); weak, so that a lock nobody holds any more (a
# training that raised) is released when it is collected
_held: "weakref.WeakValueDictionary[str, RunFolderLock]" = weakref.WeakValueDictionary()


def _key(out: Path) -> str:
    return os.path.realpath(out)


def lock_run_folder(out: str | os.PathLike) -> RunFolderLock:
    """Take the run folder's lock (creating the folder); RunFolderError when another process holds it."""
    out = Path(out)
    held = _held.get(_key(out))
    if held is not None and held._fd is not None:
        return held
    out.mkdir(parents=True, exist_ok=True)
    path = out / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise RunFolderError(f"--out {str(out)!r} is in use by another training (process {holder}); wait for "
                                 f"it to finish, or choose another --out") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)  # for the message a second training shows
    lock = _held[_key(out)] = RunFolderLock(out, fd)
    return lock


def claim_run_folder(out: str | os.PathLike, resuming_from: str | os.PathLike | None = None) -> RunFolderLock:
    """Check that a training may write into `out`, then lock it. `resuming_from`: the run folder of the
    checkpoint being resumed (None for a new run). Raises RunFolderError naming the folder and the fix."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise RunFolderError(f"--out {str(out)!r} is a file, not a folder; choose a folder path for --out")
    same_run = resuming_from is not None and out.exists() and os.path.samefile(out, resuming_from)
    if not same_run and out.is_dir():
        entries = sorted(p.name for p in out.iterdir())
        if (out / CHECKPOINTS_DIR / LATEST_FILE).exists():
            raise RunFolderError(f"{str(out)!r} already holds a run; continue it with --resume {out} "
                                 f"or choose another --out")
        foreign = [name for name in entries if name not in OUR_FILES]
        if foreign:
            shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
            raise RunFolderError(f"--out {str(out)!r} is a non-empty folder that is not a run folder (it holds "
                                 f"{shown}); a run writes checkpoints and logs there, so choose a new or empty "
                                 f"folder for --out")
    lock = lock_run_folder(out)
    if not same_run and (out / LOG_FILE).exists():  # a run stopped before its first checkpoint: start over
        (out / LOG_FILE).unlink()
    return lock
