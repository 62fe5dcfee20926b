"""Writing a file so that a crash never leaves half of it in place of a good one.

Temporary files and folders are created here rather than with `tempfile.mkstemp`/`mkdtemp`: those make them
private (0600/0700) whatever the umask, and a checkpoint is an ordinary file. Created exclusively (O_EXCL,
never through a link someone left at the name) with mode 0666 / 0777 less the umask, as `open()` and
`mkdir` give; a file that replaces another keeps that one's permission bits, as an overwrite in place would."""
from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat

_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def new_temporary_file(directory, name: str, suffix: str = ".tmp") -> tuple[int, str]:
    """(fd open for writing, path) of a new file `.NAME.RANDOM.tmp` in `directory`, mode 0666 less the umask."""
    for _ in range(100):
        path = os.path.join(os.fspath(directory), f".{name}.{secrets.token_hex(4)}{suffix}")
        try:
            return os.open(path, _NEW_FILE, 0o666), path
        except FileExistsError:
            continue
    raise FileExistsError(f"could not create a temporary file for {name!r} in {os.fspath(directory)!r}")


def new_temporary_folder(directory, name: str, suffix: str = ".tmp") -> str:
    """The path of a new, empty folder `.NAME.RANDOM.tmp` in `directory`, mode 0777 less the umask."""
    for _ in range(100):
        path = os.path.join(os.fspath(directory), f".{name}.{secrets.token_hex(4)}{suffix}")
        try:
            os.mkdir(path, 0o777)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"could not create a temporary folder for {name!r} in {os.fspath(directory)!r}")


def keep_mode_of(fd: int, path) -> None:
    """Give the file open at `fd` the permission bits of the regular file at `path`, if there is one (a link
    or anything else there gives nothing: the new file keeps the umask's mode)."""
    try:
        st = os.lstat(path)
    except OSError:
        return
    if stat.S_ISREG(st.st_mode):
        os.fchmod(fd, stat.S_IMODE(st.st_mode))


def write_atomic(path, data: bytes | str | tuple, replace: bool = True) -> None:
    """Write `data` to a temporary file beside `path`, sync it to disk, then rename it over `path`:
    readers see the old file or the new one, never a mix. str is written as UTF-8; a tuple of bytes-like pieces
    one after the other (a file's new header before the rest of another's bytes, without joining them in memory).
    replace=False: `path` must not exist (FileExistsError if a file appeared there meanwhile; it is left as it is).
    A device, pipe or socket at `path` is refused (OSError EINVAL): the rename would replace it with a file
    (`save("/dev/null")` as root took /dev/null away from every program of the machine)."""
    path = os.fspath(path)
    try:
        kind = os.lstat(path).st_mode
    except OSError:
        kind = None                                             # nothing there (or unreadable: the write says so)
    if kind is not None and not (stat.S_ISREG(kind) or stat.S_ISLNK(kind) or stat.S_ISDIR(kind)):
        raise OSError(errno.EINVAL, "not a regular file (a device, pipe or socket), which a file written here "
                                    "would replace; give the path of a file", path)
    directory = os.path.dirname(os.path.abspath(path))
    pieces = data if isinstance(data, tuple) else (data.encode("utf-8") if isinstance(data, str) else data,)
    try:
        fd, tmp = new_temporary_file(directory, os.path.basename(path))
    except OSError as error:                                    # no such folder, not writable: name the file asked for
        raise OSError(error.errno, error.strerror, path) from error
    try:
        if replace:
            keep_mode_of(fd, path)
        _write_synced(fd, pieces)
        if replace:
            os.replace(tmp, path)
        else:  # a hard link is made only where no name is: what appeared at path since it was checked stays
            os.link(tmp, path)
            os.unlink(tmp)
    except BaseException as error:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        if isinstance(error, OSError) and error.errno is not None:
            raise OSError(error.errno, error.strerror, path) from error  # name the file asked for, not the temp
        raise
    _sync_directory(directory)


def _write_synced(fd: int, pieces) -> None:
    """Write the bytes-like `pieces` into the new file open at `fd`, one after the other, sync it to disk, close it."""
    with os.fdopen(fd, "wb") as f:
        for piece in pieces:
            f.write(piece)
        f.flush()
        os.fsync(f.fileno())


@contextlib.contextmanager
def written_aside(path, text: str):
    """`text` written now into a new file beside `path` (a full disk fails here, before anything is replaced),
    renamed over `path` once the block has run; if the block raises, removed and `path` left as it was. Its name is
    new (`.NAME.RANDOM.pending`, created exclusively): a fixed name replaced, then removed, a user's file of it."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, aside = new_temporary_file(directory, os.path.basename(path), ".pending")
    try:
        keep_mode_of(fd, path)
        _write_synced(fd, (text.encode("utf-8"),))
        yield
        os.replace(aside, path)
    finally:
        if os.path.lexists(aside):
            os.unlink(aside)
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
