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

Arrays of 32 MiB and more (glibc maps each afresh, and NumPy asks for 2 MiB huge pages for them, which the
kernel zeroes at the first write) come from a pool instead, through `empty` and `zeros`, which the fast paths
use for their outputs and gradients: the logits of a step and their gradient (412 MB each at 4 x 512 tokens
and a 50k vocabulary), the head's weight gradient. A block of the pool is handed out again only once no array
uses it any more (no view of it is left: its reference count says so), to a request of the same dtype and at
least 3/4 of its size. The pool holds at most twice the most bytes its arrays had in use at once (a step's
blocks of several sizes are in use at different moments: with no more than the peak, the pool gave up and
remade 4 of its 24 blocks every step): when a request needs a new block, unused ones go back to the system
first, the least recently used first; `release_unused()` hands back all unused ones (torch.cuda.empty_cache()).
At the 130M shape a fine-tuning step at 4 x 512 spent 2.8-4.2 s of system time zeroing such pages (perf:
clear_page_erms under do_huge_pmd_anonymous_page, 18% of the process's CPU time) and took 12.0 s; with the pool
0.7 s and 10.5 s (`python benchmarks/profile_step.py --shape 130m --batch 4`). The pool is on once
`keep_freed_memory` has run, unless TINYGRAD_SSM_KEEP_FREED_MEMORY=0.
"""
from __future__ import annotations

import ctypes
import math
import os
import sys
import threading

import numpy as np

from ..autograd.backward import register_block_keeper

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3   # mallopt's parameter numbers (malloc.h)
MMAP_THRESHOLD = 32 << 20                     # glibc's largest allowed: below it, arrays come from the heap
TRIM_THRESHOLD = 1 << 30                      # the heap is shrunk only when its top has 1 GiB free
ENVIRONMENT = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")
SWITCH = "TINYGRAD_SSM_KEEP_FREED_MEMORY"     # "0": leave glibc's thresholds alone

took_effect = False    # glibc's thresholds were set
pooling = False        # arrays of LARGE bytes and more come from the pool (`empty`)
LARGE = MMAP_THRESHOLD # what glibc would map afresh
SLACK = 4              # a block serves requests of at least (1 - 1 / SLACK) of its size
HOLD = 2               # the pool holds at most HOLD x the most bytes its arrays had in use at once


def keep_freed_memory() -> bool:
    """Set glibc's mmap and trim thresholds once (see the module's docstring). True if they are set."""
    global took_effect, pooling
    if not took_effect:
        took_effect = _set_thresholds()
    pooling = os.environ.get(SWITCH, "1") != "0"
    return took_effect


def _set_thresholds() -> bool:
    if os.environ.get(SWITCH, "1") == "0" or any(name in os.environ for name in ENVIRONMENT):
        return False
    try:
        libc = ctypes.CDLL(None)  # the process's own symbols, the C library's among them (find_library("c") ran
        # /sbin/ldconfig -p in a subprocess: building a model forked the user's process)
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018  (only glibc has it: musl's mallopt does nothing)
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


# --- the pool of large arrays ------------------------------------------------------------------------------

_blocks: list = []     # 1-d arrays, each of one dtype; the least recently handed out first
_peak_in_use = 0       # the most bytes of blocks in use at once
_lock = threading.Lock()


def empty(shape, dtype) -> np.ndarray:
    """np.empty(shape, dtype), C order. With the pool on and LARGE bytes or more: a view of a block of the pool
    that no array uses any more (its contents are whatever they were)."""
    return _allocate(shape, dtype, np.empty)


def zeros(shape, dtype) -> np.ndarray:
    """np.zeros(shape, dtype): a pooled block filled with zeros where `empty` would pool, else np.zeros itself
    (whose pages the system zeroes as they are first touched)."""
    return _allocate(shape, dtype, np.zeros)


def _allocate(shape, dtype, unpooled) -> np.ndarray:
    shape, dtype = (tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)), np.dtype(dtype)
    count = math.prod(shape)
    if not pooling or count * dtype.itemsize < LARGE:
        return unpooled(shape, dtype)
    out = _unused_block(count, dtype)[:count].reshape(shape)
    if unpooled is np.zeros:
        out.fill(0)
    return out


def release_unused() -> int:
    """Hand the blocks no array uses back to the system; returns the bytes released."""
    with _lock:
        unused = _unused_indices()
        released = sum(_blocks[i].nbytes for i in unused)
        for i in reversed(unused):
            del _blocks[i]
        return released


def pooled_bytes() -> int:
    """Bytes the pool holds, in use or not."""
    return sum(b.nbytes for b in _blocks)


def _references_held(block: np.ndarray) -> int:
    """The references the pool holds to `block` (its list's): 1 if it is one of the pool's blocks, else 0. The
    backward walk asks (autograd/backward.py's register_block_keeper), so that a pooled gradient only the walk
    holds is summed into in place and kept as a leaf's .grad, as an array of its own would be: the tied
    embedding's two 154 MB gradients at the 130M shape were summed into a new array, which the system zeroed."""
    return 1 if any(b is block for b in _blocks) else 0


register_block_keeper(_references_held)


def _is_unused(i: int) -> bool:
    # references: the list's, and getrefcount's argument. Any array made from the block (the view `empty`
    # returns, its views, an array that keeps one as its base) holds one more.
    return sys.getrefcount(_blocks[i]) == 2


def _unused_indices() -> list:
    return [i for i in range(len(_blocks)) if _is_unused(i)]


def _unused_block(count: int, dtype) -> np.ndarray:
    global _peak_in_use
    with _lock:
        unused = _unused_indices()
        fits = [i for i in unused
                if _blocks[i].dtype == dtype and count <= _blocks[i].size <= count + count // (SLACK - 1)]
        if fits:
            block = _blocks.pop(min(fits, key=lambda i: _blocks[i].size))
            _blocks.append(block)                                       # now the most recently handed out
            return block
        need = count * dtype.itemsize
        in_use = pooled_bytes() - sum(_blocks[i].nbytes for i in unused)
        _peak_in_use = max(_peak_in_use, in_use + need)
        total, dropped = pooled_bytes(), []
        for i in unused:                                                # the least recently handed out first
            if total + need <= HOLD * _peak_in_use:
                break
            total -= _blocks[i].nbytes
            dropped.append(i)
        for i in reversed(dropped):
            del _blocks[i]
        block = np.empty(count, dtype)
        _blocks.append(block)
        return block
