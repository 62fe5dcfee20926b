"""A --data folder's files, as train and eval read them: which are listed, in which order, and what is left out
(and said so on the corpus line)."""
from __future__ import annotations

import os
from pathlib import Path

from .eval_report import is_eval_report
from .json_records import NAMED_SUFFIX
from .run_folder import MARKER_FILE as RUN_MARKER_FILE


class DataError(ValueError):
    """The corpus path is missing, empty or unreadable, or holds too little text for the run."""


def folder_files(root: Path, run_folders: list | None = None, eval_reports: list | None = None) -> list[Path]:
    """Every regular, non-hidden file under `root` (recursively, through linked folders too, each real folder
    and each real file once: a link to a file beside it would put its text in both training and validation),
    sorted by relative path. A run folder of this package (its marker file says so: `--data .` with the
    default --out puts runs/ inside) holds logs and checkpoints, not text: it is left out, and its relative
    path appended to `run_folders`; so is a report eval --json wrote (eval_report.py: scored, it would change the
    next eval's figures), appended to `eval_reports`. A link to nothing is a DataError naming it."""
    root_real = os.path.realpath(root)
    found, seen = [], {root_real}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        kept = []
        for d in sorted(dirnames):
            real = os.path.realpath(os.path.join(dirpath, d))
            # a link back up would loop; one to a folder above --data would read files outside it
            if d.startswith(".") or d == "__pycache__" or real in seen or Path(root_real).is_relative_to(real):
                continue
            seen.add(real)
            if os.path.isfile(os.path.join(real, RUN_MARKER_FILE)):
                if run_folders is not None:
                    run_folders.append((Path(dirpath) / d).relative_to(root).as_posix())
                continue
            kept.append(d)
        dirnames[:] = kept
        found.extend(Path(dirpath) / f for f in filenames if not f.startswith("."))
    files, real_files = [], set()
    for p in sorted(found, key=lambda p: p.relative_to(root).as_posix()):
        if p.is_symlink() and not p.exists():
            raise DataError(f"cannot read corpus file {str(p)!r}: it is a symbolic link to {os.readlink(p)!r}, which "
                            f"does not exist; remove the link or restore its file")
        if not p.is_file():
            continue
        identity = file_identity(p)
        if identity in real_files:   # a link or a hard link to a file listed already: its text in both splits
            continue
        real_files.add(identity)
        if eval_reports is not None and p.suffix.lower() == NAMED_SUFFIX and is_eval_report(p):
            eval_reports.append(p.relative_to(root).as_posix())
            continue
        files.append(p)
    return files


def file_identity(path) -> tuple[int, int]:
    """(st_dev, st_ino): one file whatever links or hard links name it."""
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def left_out_note(binary: tuple, run_folders: tuple, eval_reports: tuple) -> str:
    """What a folder's text leaves out, for the corpus line (train) and the data line (eval), each kind named."""
    def named(names):
        return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    note = ""
    if binary:
        utf16 = "; UTF-16 text is read only as UTF-8: convert it" if any(n.endswith(" (UTF-16)") for n in binary) \
            else ""
        note += f", {_count(len(binary), 'binary file')} skipped ({named(binary)}{utf16})"
    if run_folders:
        note += f", {_count(len(run_folders), 'run folder')} left out ({named(run_folders)})"
    if eval_reports:
        note += f", {_count(len(eval_reports), 'eval report')} left out ({named(eval_reports)})"
    return note
