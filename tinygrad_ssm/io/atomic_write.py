"""Writing a file so that a crash never leaves half of it in place of a good one."""
from __future__ import annotations

import os
import tempfile


def write_atomic(path, data: bytes | str, replace: bool = True) -> None:
    """Write `data` to a temporary file beside `path`, sync it to disk, then rename it over `path`:
    readers see the old file or the new one, never a mix. str is written as UTF-8. replace=False: `path` must
    not exist (FileExistsError if a file appeared there meanwhile; it is left as it is)."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    payload = data.encode("utf-8") if isinstance(data, str) else data
    try:
        fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    except OSError as error:                                    # no such folder, not writable: name the file asked for
        raise OSError(error.errno, error.strerror, path) from error
    try:
        os.chmod(tmp, 0o644)  # mkstemp makes it private; these are ordinary files
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        if replace:
            os.replace(tmp, path)
        else:  # a hard link is made only where no name is: what appeared at path since it was checked stays
            os.link(tmp, path)
            os.unlink(tmp)
    except BaseException as error:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(error, OSError) and error.errno is not None:
            raise OSError(error.errno, error.strerror, path) from error  # name the file asked for, not the temp
        raise
    _sync_directory(directory)


def _sync_directory(directory: str) -> None:
    """Make the rename itself durable (where the platform allows syncing a directory)."""
    try:
        dir_fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)
