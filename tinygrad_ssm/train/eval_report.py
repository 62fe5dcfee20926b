"""The file eval --json writes, and how it is known again: the only existing file eval replaces, and a file a
--data folder's text never includes (a report written inside the folder would be scored by the next eval).

A report starts with its mark, REPORT_HEAD, so that a report of any size is known from its first bytes (a
folder of 8,000 files gives a report over 1 MiB); reports of earlier versions, which put the mark last, are
read whole, up to 1 MiB."""
from __future__ import annotations

import errno
import json
from pathlib import Path

from ..io.atomic_write import write_atomic

REPORT_MARK, REPORT_MARK_VALUE = "written_by", "tinygrad_ssm eval"  # a key of every report eval --json writes
_OLD_REPORT_BYTES = 1 << 20


def report_text(report: dict) -> str:
    """The report as eval --json writes it: its mark first."""
    return json.dumps({REPORT_MARK: REPORT_MARK_VALUE, **report}, indent=1, allow_nan=False) + "\n"  # strict JSON


REPORT_HEAD = report_text({})[:-3].encode()  # '{\n "written_by": "tinygrad_ssm eval"': every report's first bytes


def is_eval_report(path: Path) -> bool:
    """Whether `path` is a report eval --json wrote (a regular file, not a link, holding our mark)."""
    try:
        if path.is_symlink() or not path.is_file():
            return False
        with open(path, "rb") as f:
            head = f.read(len(REPORT_HEAD) + 1)
        if head[:-1] == REPORT_HEAD and head[-1:] in (b",", b"\n"):
            return True
        if path.stat().st_size > _OLD_REPORT_BYTES:
            return False
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(report, dict) and report.get(REPORT_MARK) == REPORT_MARK_VALUE


def write_report(path: Path, text: str) -> None:
    """eval --json FILE: a new file, or over an earlier report, checked again here (a file may have appeared at
    that path while scoring: FileExistsError, and it is left as it is)."""
    existing = path.exists() or path.is_symlink()
    if existing and not is_eval_report(path):
        raise FileExistsError(errno.EEXIST, "exists", str(path))
    write_atomic(path, text, replace=existing)
