"""Claiming a run folder: one training at a time, never into someone else's files.

- A lock (fcntl.flock on `run.lock` inside the folder) is held while a training writes there; a second
  training on the same folder refuses at once, naming the folder and the process that holds it. The kernel
  drops the lock when the process ends, however it ends, so a crash never leaves a stale lock behind.
- What proves a folder is a run folder of ours is its marker, `tinygrad_ssm_run.json`, written atomically
  (and never over an existing file) by the run that created the folder, or found it empty: the run's id and
  settings. Files merely named like ours (a user's log.jsonl, loss.png, run.lock, checkpoints/) prove nothing.
- A new run (not --resume) goes only into a folder that does not exist, is empty, or holds a marker of ours
  and no checkpoint yet (a run stopped before its first checkpoint: its log is cleared). A folder with a
  checkpoint must be resumed; any other non-empty folder is refused, so nothing of the user's is appended to,
  overwritten or pruned.
- No name the package writes may be a symbolic link (run.lock, the marker, the log, the plot, checkpoints/):
  a link would send the write out of the run folder; the lock is opened with O_NOFOLLOW.
- The run id (the marker's, carried by every checkpoint's trainer_state.json and into a resumed run) is what
  pruning checks: only checkpoints of this run family are ever deleted. It is letters and digits (is_run_id),
  checked in the marker as in the checkpoints: a marker the run's checkpoints could not carry is refused.
- What a killed run left of its own (the temporary files of the marker, log and plot, io/atomic_write.py's
  `.NAME.RANDOM.tmp`; in checkpoints/, the temporary folders of a save or prune, checkpoint_debris.py) does not
  make the folder someone else's, and is removed by the next run once it holds the lock.
"""
from __future__ import annotations

import json
import os
import re
import stat
import time
import uuid
import weakref
from pathlib import Path

from ..io.atomic_write import _sync_directory, keep_mode_of, new_temporary_file
from ..io.checkpoints import CHECKPOINT_NAME, CHECKPOINTS_DIR, LATEST_FILE
from .checkpoint_debris import remove_checkpoint_debris
from .log import LOG_FILE, PLOT_FILE

LOCK_FILE = "run.lock"
MARKER_FILE = "tinygrad_ssm_run.json"
MARKER_FORMAT = "tinygrad_ssm run folder"
OUR_FILES = frozenset({LOCK_FILE, MARKER_FILE, LOG_FILE, PLOT_FILE, CHECKPOINTS_DIR})
# a temporary file of the marker, log or plot (io/atomic_write.new_temporary_file's `.NAME.RANDOM.tmp`)
OWN_TEMPORARY_FILE = re.compile(r"\.(?:" + "|".join(map(re.escape, (MARKER_FILE, LOG_FILE, PLOT_FILE)))
                                + r")\.[0-9a-f]{8}\.tmp")
RUN_ID_RULE = "1 to 64 letters and digits"


def is_run_id(value) -> bool:
    """A run id (RUN_ID_RULE; a new run's is a uuid4's hex). One rule for the marker and for every checkpoint's
    trainer_state.json (train/checkpoint.py): a marker whose id the checkpoints could not carry would train and
    save, then fail every --resume as a damaged checkpoint."""
    return isinstance(value, str) and 0 < len(value) <= 64 and value.isalnum()


def _own_leftover(path: Path) -> bool:
    """A temporary file of the marker, log or plot that a killed run left: named exactly so, a regular file (not
    a link)."""
    if OWN_TEMPORARY_FILE.fullmatch(path.name) is None:
        return False
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False

try:
    import fcntl
except ImportError:  # Windows: no flock; the folder checks still apply
    fcntl = None


class RunFolderError(FileExistsError):
    """The run folder is in use by another training, or is not a folder a new run may write into."""


class RunFolderLock:
    """An exclusive lock on a run folder, held until `release()` (or the process ends)."""

    def __init__(self, out: Path, fd: int | None, run_id: str | None = None):
        self.out, self._fd, self.run_id = out, fd, run_id

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


# folders this process holds: a second claim of one is refused as another process's is (two threads training into
# one folder mixed their logs and checkpoints); weak, so that a lock nobody holds any more is released when it goes
_held: "weakref.WeakValueDictionary[str, RunFolderLock]" = weakref.WeakValueDictionary()


def _key(out: Path) -> str:
    return os.path.realpath(out)


def lock_run_folder(out: str | os.PathLike) -> RunFolderLock:
    """Take the run folder's lock (creating the folder); RunFolderError when another process holds it, or
    when run.lock is a symbolic link or not a regular file (it is opened without following a link)."""
    out = Path(out)
    held = _held.get(_key(out))
    if held is not None and held._fd is not None:
        raise RunFolderError(f"--out {str(out)!r} is in use by another training in this process (another thread, "
                             f"or a train() that has not returned); wait for it to finish, or choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    path = out / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0),
                     0o666)
    except OSError:
        if os.path.islink(path):
            raise RunFolderError(_link_message(out, LOCK_FILE)) from None
        raise                                                            # an I/O error naming the lock's path
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:  # a FIFO, a device, a hard link to someone's file
        os.close(fd)
        raise RunFolderError(f"{str(path)!r} is not a lock file of ours (not a regular file with one name); "
                             f"it was left as it is: remove it or choose another --out")
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder_pid(fd)
            os.close(fd)
            raise RunFolderError(f"--out {str(out)!r} is in use by another training (process {holder}); wait for "
                                 f"it to finish, or choose another --out") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)  # for the message a second training shows
    lock = _held[_key(out)] = RunFolderLock(out, fd)
    return lock


def _holder_pid(fd: int, wait_s: float = 0.5) -> str:
    """The process id the lock's holder writes just after it takes the lock: a claim that loses the race by
    microseconds read it before it was there ("process unknown", a fuzz of interruptions), so it waits a little."""
    deadline = time.monotonic() + wait_s
    while True:
        holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
        if holder or time.monotonic() > deadline:
            return holder or "unknown"
        time.sleep(0.01)


def _link_message(out: Path, name: str) -> str:
    return (f"{str(out / name)!r} is a symbolic link; a run writes {name} itself and never through a link "
            f"(it could lead out of the run folder {str(out)!r}); remove the link or choose another --out")


def _check_no_links(out: Path) -> None:
    """Each of the run's own names is absent, or what the run made there: no link, and a file where a file goes
    (a FIFO named log.jsonl would block the resume that reads it, forever)."""
    for name in sorted(OUR_FILES) + [f"{CHECKPOINTS_DIR}/{LATEST_FILE}"]:
        place = out / name
        if os.path.islink(place):
            raise RunFolderError(_link_message(out, name))
        kind_ok = place.is_dir() if name == CHECKPOINTS_DIR else place.is_file()
        if os.path.lexists(place) and not kind_ok:
            raise RunFolderError(f"{str(place)!r} is not a regular {'folder' if name == CHECKPOINTS_DIR else 'file'}"
                                 f" as a run makes it (a FIFO, a device, ...); a run reads and writes it, so move it "
                                 f"away or choose another --out")


def read_marker(out: Path) -> dict | None:
    """The folder's marker (None when there is none); RunFolderError when it is there but not ours."""
    path = out / MARKER_FILE
    if not os.path.lexists(path):
        return None
    problem = None
    if os.path.islink(path) or not path.is_file():
        problem = "is not a regular file"
    else:
        try:
            marker = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            problem = f"cannot be read as JSON ({e})"
        else:
            if not (isinstance(marker, dict) and marker.get("format") == MARKER_FORMAT and "run_id" in marker):
                problem = f"is not the marker of a tinygrad_ssm run (format {MARKER_FORMAT!r} with a run_id)"
            elif not is_run_id(marker["run_id"]):
                problem = (f"is malformed: its run_id {str(marker['run_id'])[:80]!r} is not a run id "
                           f"({RUN_ID_RULE}, as a run writes it)")
    if problem is not None:
        raise RunFolderError(f"--out {str(out)!r} is not a run folder of ours: {str(path)!r} {problem}; it was "
                             f"left as it is: choose a new or empty folder for --out")
    return marker


def _write_marker(out: Path, run_id: str, settings: dict | None, replace: bool) -> None:
    """Atomically: a complete temporary file beside it, then link()ed to its name (never over an existing file)
    or, when `replace` (the folder is already ours), os.replace()d over the old marker."""
    text = json.dumps({"format": MARKER_FORMAT, "run_id": run_id, "train_config": settings}, indent=1) + "\n"
    fd, tmp = new_temporary_file(out, MARKER_FILE)
    try:
        if replace:
            keep_mode_of(fd, out / MARKER_FILE)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if replace:
            os.replace(tmp, out / MARKER_FILE)
        else:
            os.link(tmp, out / MARKER_FILE)  # FileExistsError if another run got there first
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
    _sync_directory(str(out))


def _remove_leftovers(out: Path) -> None:
    """Delete what killed runs left of their own in `out` (module docstring); called holding the lock."""
    for p in sorted(out.iterdir()):
        if _own_leftover(p):
            try:
                p.unlink()
            except OSError:
                pass                          # a leftover that cannot be deleted does not stop the run
    remove_checkpoint_debris(out / CHECKPOINTS_DIR)


def remove_new_run_folder(out: Path, lock: RunFolderLock) -> None:
    """Undo the claim of a folder the claim made, for a run that failed before writing into it: its lock and
    marker files, then the folder itself when nothing else is in it."""
    lock.release()
    for name in (MARKER_FILE, LOCK_FILE):
        try:
            (out / name).unlink()
        except FileNotFoundError:
            pass
    try:
        out.rmdir()
    except OSError:  # something else is in it: left as it is
        pass


def claim_run_folder(out: str | os.PathLike, resuming_from: str | os.PathLike | None = None,
                     run_id: str | None = None, settings: dict | None = None) -> RunFolderLock:
    """Check that a training may write into `out`, then lock it. `resuming_from`: the run folder of the
    checkpoint being resumed (None for a new run); `run_id`: the run family being continued (a resume;
    None: the marker's, or a new one); `settings`: the run's TrainConfig as a dict, for the marker.
    Returns the lock, whose `run_id` is the run's. Raises RunFolderError naming the folder and the fix."""
    out = Path(out)
    for place in (*reversed(out.parents), out):                        # the folders it will make, and itself
        if os.path.islink(place) and not place.exists():
            raise RunFolderError(f"--out {str(out)!r}: {str(place)!r} is a symlink to {os.readlink(place)!r}, which "
                                 f"does not exist; a run does not write through a link it cannot check: choose "
                                 f"another --out")
        if place != out and place.exists() and not place.is_dir():
            raise RunFolderError(f"--out {str(out)!r}: {str(place)!r} is a file, not a folder; choose another --out")
    if out.exists() and not out.is_dir():
        raise RunFolderError(f"--out {str(out)!r} is a file, not a folder; choose a folder path for --out")
    same_run = resuming_from is not None and out.exists() and os.path.samefile(out, resuming_from)
    marker = None
    if out.is_dir():
        _check_no_links(out)
        marker = read_marker(out)
    if same_run and marker is None:  # a checkpoint copied out of its run: the folder around it is the user's
        raise RunFolderError(f"--resume: {str(out)!r}, where the checkpoint's run would go on (its log, plot and "
                             f"new checkpoints), has no {MARKER_FILE}, the file that proves a folder is a run of "
                             f"this package (a checkpoint copied out of its run, or a run made before the marker "
                             f"existed), so nothing is written there: continue the run in a new folder (the same --resume, "
                             f"with --out NEW_DIR), or start from its weights with --init-from")
    if not same_run and out.is_dir():
        entries = sorted(p.name for p in out.iterdir() if not _own_leftover(p))  # a killed run's: removed below
        checkpoints = out / CHECKPOINTS_DIR
        saved = sorted(p.name for p in checkpoints.iterdir() if CHECKPOINT_NAME.fullmatch(p.name)) \
            if checkpoints.is_dir() else []
        if (checkpoints / LATEST_FILE).exists():
            raise RunFolderError(f"{str(out)!r} already holds a run; continue it with --resume {out} "
                                 f"or choose another --out")
        if saved and marker is not None:  # a run's checkpoint whose LATEST was never written (a full disk)
            raise RunFolderError(f"{str(out)!r} already holds a run (its checkpoints {saved}, with no "
                                 f"{CHECKPOINTS_DIR}/{LATEST_FILE}); continue it with --resume "
                                 f"{checkpoints / saved[-1]} or choose another --out")
        foreign = [name for name in entries if name not in OUR_FILES or marker is None]
        if foreign:
            shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
            raise RunFolderError(f"--out {str(out)!r} is a non-empty folder that is not a run folder (it holds "
                                 f"{shown}"
                                 f"{'' if marker is not None else f', and no {MARKER_FILE}'}); a run writes "
                                 f"checkpoints and logs there, so choose a new or empty folder for --out")
    out.mkdir(parents=True, exist_ok=True)
    new_id = run_id or (marker or {}).get("run_id") or uuid.uuid4().hex
    if marker is None:
        try:
            _write_marker(out, new_id, settings, replace=False)
        except (FileExistsError, FileNotFoundError):  # another run made the folder's marker at this moment (or
            if read_marker(out) is None:              # removed our temporary file as its leftover): the folder
                raise                                 # is that run's, checked again as a folder found so
            return claim_run_folder(out, resuming_from, run_id=run_id, settings=settings)
    run_id = new_id
    lock = lock_run_folder(out)
    _remove_leftovers(out)
    if marker is not None and not same_run and settings is not None:  # reused before its first checkpoint
        _write_marker(out, run_id, settings, replace=True)
    lock.run_id = run_id
    if not same_run and (out / LOG_FILE).exists():  # a run stopped before its first checkpoint: start over
        (out / LOG_FILE).unlink()
    return lock
