"""OpenBLAS's worker threads should go to sleep as soon as a matmul ends. Imported first by the package, before
NumPy loads OpenBLAS (it reads the setting once, when it starts).

After each product OpenBLAS's threads spin, by default for 2^28 cycles (about a tenth of a second), waiting for
the next one. In a training step a numba kernel follows nearly every matmul, and on 2 cores the spinning thread
takes one of the two from it: a b=8 x 512 step took 0.67-0.88 s with the default and 0.48-0.51 s with 2^4
(`benchmarks/profile_step.py`, runs interleaved; the wake-up a product then pays is microseconds).

OPENBLAS_THREAD_TIMEOUT already in the environment wins. If NumPy was imported before tinygrad_ssm, OpenBLAS
has started with its default: set OPENBLAS_THREAD_TIMEOUT=4 in the environment instead (`took_effect` says).

`openblas_threads_setter` finds a loaded OpenBLAS's thread-count setter at run time (ctypes; no NumPy import).
"""
from __future__ import annotations

import os
import sys

SPIN_EXPONENT = "4"   # OpenBLAS spins 2^SPIN_EXPONENT rounds before sleeping (it accepts 4..30)

took_effect = "numpy" not in sys.modules
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", SPIN_EXPONENT)


def openblas_threads_setter(accept=lambda path: True):
    """The `openblas_set_num_threads_local(n) -> previous` of the first OpenBLAS loaded in this process whose path
    `accept` takes (scan/numba_chunked.py asks for SciPy's), or None where
    it cannot be found (another BLAS, an older OpenBLAS, no /proc). Despite its name it sets that OpenBLAS's
    thread count for the whole process (measured: a value set in one thread is what another thread's call
    returns), so only the calling thread uses it."""
    try:
        import ctypes
        with open("/proc/self/maps") as maps:
            paths = sorted({line.split()[-1] for line in maps if "openblas" in line.lower() and "/" in line})
        for path in filter(accept, paths):
            setter = getattr(ctypes.CDLL(path), "openblas_set_num_threads_local", None)
            if setter is not None:
                setter.argtypes, setter.restype = [ctypes.c_int], ctypes.c_int
                return setter
    except OSError:
        pass
    return None
