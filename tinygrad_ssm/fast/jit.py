"""numba's `njit`, whose on-disk cache (`cache=True`) is kept where numba has somewhere to write it and left out
where it has not, instead of failing.

numba keeps a kernel's compiled code in `__pycache__` beside its source, or, where that folder cannot be written
(a read-only install), under the user's cache folder ($XDG_CACHE_HOME/numba, else ~/.cache/numba; NUMBA_CACHE_DIR
overrides both). Where neither can be written (a system-wide install run by a service account whose home is
/nonexistent) numba refuses the decorator itself ("cannot cache function ...: no locator available"), and every
model and the CLI failed at import. Here the kernel is then compiled without the cache, in every process (about a
minute for the decoder's kernels), and a warning says so once, with the fix (NUMBA_CACHE_DIR). The package sets
no numba setting or environment variable for this: importing it must not change the user's process."""
from __future__ import annotations

import warnings

import numba


class KernelCacheUnavailableWarning(UserWarning):
    """numba found no folder to cache the package's compiled kernels in: they compile in every process."""


_warned = False


def njit(*args, **options):
    """numba.njit(*args, **options); with cache=True and nowhere to cache, numba.njit without the cache."""
    if args:                                      # @njit, bare: numba's own (the package always gives options)
        return numba.njit(*args, **options)
    if not options.get("cache"):
        return numba.njit(**options)

    def decorate(function):
        try:
            return numba.njit(**options)(function)
        except RuntimeError as e:
            if "cannot cache function" not in str(e):
                raise
            _warn_once(e)
            return numba.njit(**{**options, "cache": False})(function)
    return decorate


def _warn_once(error: RuntimeError) -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(f"numba has no folder to cache tinygrad_ssm's compiled kernels in ({error}): they compile in "
                      f"every process; set NUMBA_CACHE_DIR to a writable folder to keep them",
                      KernelCacheUnavailableWarning, stacklevel=3)
