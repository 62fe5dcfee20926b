"""Checks on a path before it is opened, so that a wrong kind of file fails at once with its name.

A FIFO (named pipe) or a character device passes `os.path.exists` but `open(...).read()` on it blocks until
a writer appears, forever for a pipe nobody writes: every file we read (weights, configs, trainer state, a
corpus file) is checked to be a regular file first.
"""
from __future__ import annotations

import os
import stat


def require_regular_file(path, what: str, error: type[Exception] = ValueError) -> int:
    """Raise `error` naming `what` and `path` unless `path` is a regular file (symlinks followed); returns
    its size in bytes. FileNotFoundError (a subclass of the error when it is one) when it does not exist."""
    path = os.fspath(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise (error if issubclass(error, FileNotFoundError) else FileNotFoundError)(
            f"{what} {path!r} does not exist") from None
    except OSError as e:
        raise error(f"cannot read {what} {path!r}: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        kind = ("a folder" if stat.S_ISDIR(st.st_mode) else "a named pipe (FIFO)" if stat.S_ISFIFO(st.st_mode)
                else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "a socket"
                if stat.S_ISSOCK(st.st_mode) else "not a regular file")
        raise error(f"{what} {path!r} is {kind}, not a regular file; give the path of a regular file")
    return st.st_size


GIT_LFS_POINTER = b"version https://git-lfs.github.com/spec/"   # how a Git LFS pointer file starts
GIT_LFS_FIX = ("it is a Git LFS pointer, not the file (a clone made without git-lfs holds these ~130-byte stand-ins "
               "for large files): run `git lfs install && git lfs pull` in the clone, or download the file itself")


def is_git_lfs_pointer(head: bytes) -> bool:
    """Whether a file's first bytes are a Git LFS pointer's."""
    return head.startswith(GIT_LFS_POINTER)


def broken_link(path) -> str | None:
    """Why `path` is missing when it is a symlink to nothing (a download cut short, a Hugging Face cache's snapshot
    copied without its blobs, a blob removed); None when it is no such link."""
    path = os.fspath(path)
    if not os.path.islink(path) or os.path.exists(path):
        return None
    return (f"{path!r} is a link to {os.readlink(path)!r}, which is missing (a download cut short, or a Hugging Face "
            f"cache's snapshot copied or pruned without its blobs): fetch the folder again")
