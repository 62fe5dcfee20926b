"""Telling the user about output that failed: the cause of an I/O error in words, which standard output is
meant, and the error line itself, written even when stdout or stderr is a closed pipe (`... | head`)."""
from __future__ import annotations

import errno
import os
import sys

# the command line's exit statuses (here, not in arguments.py: importing that builds the help, which asks every scan
# backend whether it runs here, and numba-cuda's import spawns /sbin/ldconfig; the training loop needs EXIT_IO)
EXIT_OK, EXIT_DIVERGED, EXIT_USAGE, EXIT_IO, EXIT_INTERRUPTED = 0, 1, 2, 74, 130  # 74: sysexits' EX_IOERR

IO_CAUSES = {"ENOSPC": "the disk is full", "EFBIG": "the file size limit (ulimit -f) is reached",
             "EROFS": "the file system is read-only", "EACCES": "permission denied",
             "EPERM": "operation not permitted", "EDQUOT": "the disk quota is exceeded",
             "EPIPE": "the reader closed the pipe"}


def io_cause(e: OSError) -> str:
    name = errno.errorcode.get(e.errno or 0, "")
    text = os.strerror(e.errno) if e.errno else str(e)
    return f"{text} ({IO_CAUSES[name]})" if name in IO_CAUSES else text


def stdout_name() -> str:
    try:
        target = os.readlink(f"/proc/self/fd/{sys.stdout.fileno()}")
    except (OSError, ValueError, AttributeError):
        return "standard output"
    return f"standard output ({target})" if target.startswith("/") else "standard output (a pipe)"


def silence_stdout() -> None:
    """After a failed write to stdout, point it at /dev/null: Python's flush at exit must not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def say_error(message: str) -> None:
    """The error line on stderr, unless stderr itself is gone (`2>&1 | head`): then the exit status says it."""
    try:
        print(f"error: {message}", file=sys.stderr)
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
