"""Freed arrays' memory stays in the process, for the next training step's arrays of the same sizes (glibc).

A training step allocates and frees tens of MB of arrays a few MB each. glibc's malloc gives an allocation above
its mmap threshold (adaptive, 128 KiB up to 32 MiB) fresh pages from the kernel and hands them back when it is
freed, and shrinks the heap when its top has more than the trim threshold free: either way the next step's
arrays are new pages again, each 4 KiB page a fault into the kernel that zeroes it. A b=8 x 512 step of the
benchmark model took ~15,000-20,000 page faults and 0.03-0.19 s of system time (the more, the busier the
machine) of a ~0.45 s step; with the two thresholds fixed below, ~100-200 faults and 0.005-0.06 s
(`python benchmarks/profile_step.py` prints both per step).

The price: the process keeps the memory of its largest step (as PyTorch's caching allocator does) instead of
returning it between steps; allocations above 32 MiB (glibc's limit for the threshold) are mmapped as before.
These are settings of the whole process, so they are made only where they pay: when a model with fused=True
(the fast path for training) is built, not when the package is imported. TINYGRAD_SSM_KEEP_FREED_MEMORY=0 turns
them off; any MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ / MALLOC_TOP_PAD_ in the environment wins (glibc
reads them at process start): nothing is changed then. Elsewhere than glibc (macOS, musl) nothing is done.
`took_effect` says whether they were set.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3   # mallopt's parameter numbers (malloc.h)
MMAP_THRESHOLD = 32 << 20                     # glibc's largest allowed: below it, arrays come from the heap
TRIM_THRESHOLD = 1 << 30                      # the heap is shrunk only when its top has 1 GiB free
ENVIRONMENT = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")
SWITCH = "TINYGRAD_SSM_KEEP_FREED_MEMORY"     # "0": leave glibc's thresholds alone

took_effect = False


def keep_freed_memory() -> bool:
    """Set glibc's mmap and trim thresholds once (see the module's docstring). True if they are set."""
    global took_effect
    if not took_effect:
        took_effect = _set_thresholds()
    return took_effect


def _set_thresholds() -> bool:
    if os.environ.get(SWITCH, "1") == "0" or any(name in os.environ for name in ENVIRONMENT):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018  (only glibc has it: musl's mallopt does nothing)
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))

