"""Whether backend "cuda" (tinygrad_ssm/scan/cuda.py) can run here, and if not, why and what to do about it.

It can where numba-cuda is installed, numba was imported without the simulator, numba-cuda finds a GPU, and
numba-cuda can compile a kernel with the NumPy installed (see `_target_fails`).
"""
from __future__ import annotations

import functools
import importlib.util

import numpy as np


def import_numba_cuda():
    """numba-cuda's `numba.cuda` (numba-cuda replaces numba's built-in, deprecated target when installed)."""
    if importlib.util.find_spec("numba_cuda") is None:  # numba alone would give its deprecated built-in target
        raise ImportError("backend 'cuda' needs the numba-cuda package: pip install numba-cuda")
    from numba import cuda
    return cuda


def simulated() -> bool:
    """True under the CUDA simulator (NUMBA_ENABLE_CUDASIM=1, read when numba is first imported)."""
    from numba import config
    return bool(getattr(config, "ENABLE_CUDASIM", False))


@functools.lru_cache(maxsize=1)
def why_unavailable() -> str | None:
    """None where the backend can run here; else why not, and what to do about it."""
    try:
        cuda = import_numba_cuda()
    except ImportError as error:
        return str(error)
    except Exception as error:  # noqa: BLE001 - numba.cuda itself failed to import
        return f"numba.cuda failed to import: {type(error).__name__}: {error}"
    if simulated():
        return "under the CUDA simulator (NUMBA_ENABLE_CUDASIM=1) the kernels run only where the tests call them"
    try:
        if not cuda.is_available():
            return "numba-cuda finds no CUDA GPU (no device, or no driver)"
    except Exception as error:  # noqa: BLE001 - a broken driver or runtime is reported, not raised
        return f"numba-cuda could not look for a GPU: {type(error).__name__}: {error}"
    return _target_fails()


def _target_fails() -> str | None:
    """Why numba-cuda cannot type and lower a kernel here, or None.

    numba-cuda loads its CUDA target's typing and lowering (NumPy's functions among them) at the first compile.
    A NumPy newer than it supports fails there: numba-cuda 0.30.4 with NumPy 2.5.2 on an H200 raised
    "module 'numpy' has no attribute 'row_stack'", in the middle of the first forward. A trivial kernel typed and
    lowered to LLVM IR (no GPU, no toolkit needed) meets that failure here instead, so "auto" passes the backend
    by and `ssd(backend="cuda")` says why."""
    try:
        from numba import types
        from numba.cuda.compiler import compile_cuda
        # any compute capability will do: the probe stops at LLVM IR (7.5, the oldest that CUDA 13 builds for)
        compile_cuda(_probe_kernel, types.void, (types.float32[::1],), cc=(7, 5))
    except Exception as error:  # noqa: BLE001 - whatever breaks the compiler, the backend cannot run
        from importlib.metadata import version
        return (f"numba-cuda {version('numba-cuda')} cannot compile a kernel with NumPy {np.__version__} "
                f"({type(error).__name__}: {error}); install a NumPy it supports (e.g. pip install 'numpy<2.5') "
                f"or a newer numba-cuda")
    return None


def _probe_kernel(out):
    out[0] = 1.0


def available() -> bool:
    """A real GPU that numba-cuda can compile for; False under the simulator, where the tests call the functions."""
    return why_unavailable() is None
