"""Running a fused op's numba kernels over blocks of rows on every thread, and reading strided inputs in place
(fast/fused.py). A block's rows of the few arrays it touches stay in L2 while the kernel and NumPy's ufuncs
make their passes; blocks go to whichever thread asks first."""
from __future__ import annotations

import itertools
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np

BLOCK_BYTES = 128 * 1024  # one block's rows of one array: the few arrays a block touches stay in L2 (2 MiB)

_pool: ThreadPoolExecutor | None = None
_pool_pid = 0   # the process that started the pool: a forked child has the pool object but not its threads


def shares(n_blocks: int, threads: int | None = None) -> int:
    """How many threads work on n_blocks blocks (their per-thread partial sums have this many rows): numba's
    thread count, or `threads` when given, at most one per block."""
    return max(1, min(numba.get_num_threads() if threads is None else threads, n_blocks))


def on_threads(work, n_blocks: int, threads: int | None = None):
    """work(blocks, share) on shares(n_blocks, threads) threads, the caller's (share 0) and the pool's: `blocks` yields
    the indices of [0, n_blocks) to whichever thread asks first. So a thread that the machine does not run now
    (another process's, BLAS threads spinning after a matmul) delays nothing: the caller never waits for a
    helper that has not started, only for the block a started one is in. The kernels are nogil and NumPy's
    ufuncs release the GIL."""
    global _pool, _pool_pid
    n = shares(n_blocks, threads)
    counter = itertools.count()                                          # next() is atomic under the GIL

    def blocks():
        for blk in counter:
            if blk >= n_blocks:
                return
            yield blk
    if n == 1:
        return work(blocks(), 0)
    if _pool is None or _pool_pid != os.getpid():
        _pool = ThreadPoolExecutor(max_workers=max(1, numba.config.NUMBA_NUM_THREADS - 1),
                                   thread_name_prefix="fused")
        _pool_pid = os.getpid()
    lock = threading.Condition()
    state = {"closed": False, "busy": 0, "errors": []}
    errstate = np.geterr()  # thread-local: the caller's np.errstate (the CLI's) holds for its blocks on the helpers too

    def helper(share):
        with lock:
            if state["closed"]:                                          # started too late: nothing to do
                return
            state["busy"] += 1
        try:
            with np.errstate(**errstate):
                work(blocks(), share)
        except BaseException as error:  # noqa: BLE001 - raised again in the caller's thread
            state["errors"].append(error)
        finally:
            with lock:
                state["busy"] -= 1
                lock.notify_all()
    for share in range(1, n):
        try:
            _pool.submit(helper, share)
        except RuntimeError:  # the interpreter is shutting down (a non-daemon thread's or an atexit handler's op):
            break             # concurrent.futures takes no new work then; the caller's thread does every block
    try:
        work(blocks(), 0)
    finally:
        with lock:                                                       # no helper touches anything after this
            state["closed"] = True
            while state["busy"]:
                lock.wait()
    if state["errors"]:
        raise state["errors"][0]


def rows_per_block(width: int, itemsize: int) -> int:
    """Rows of `width` items per block: BLOCK_BYTES of one array."""
    return max(1, BLOCK_BYTES // max(1, width * itemsize))


def as_rows(x: np.ndarray, dtype) -> tuple:
    """x (..., c) -> (rows (N, D) C-contiguous, col) with x.reshape(N, c) == rows[:, col:col + c]. No copy when x
    is a column slice of a C-contiguous array of `dtype` (a split's view: rows of its base, from x's column on);
    otherwise a contiguous copy, col 0. The kernels take row slices rows[i, col:col + c], contiguous, so they
    vectorise (over x itself numba sees layout 'A' and does not)."""
    c = x.shape[-1]
    n = x.size // c if c else 0
    if x.dtype != dtype:
        return np.ascontiguousarray(x, dtype).reshape(n, c), 0
    view = x.reshape(n, c)                      # a view when the rows are evenly spaced, else a contiguous copy
    if view.flags.c_contiguous:
        return view, 0
    owner, item = x.base, x.itemsize
    if (n > 1 and view.strides[1] == item and view.strides[0] >= c * item and view.strides[0] % item == 0
            and isinstance(owner, np.ndarray) and owner.dtype == dtype and owner.flags.c_contiguous):
        width = view.strides[0] // item
        flat = owner.reshape(-1)
        offset, rest = divmod(view.__array_interface__["data"][0] - flat.__array_interface__["data"][0], item)
        col = offset % width
        start = offset - col
        # col + c <= width: a view whose rows run past its base's (t[5:33].reshape(4, 7)[:, :6]) is no column slice
        if rest == 0 and start >= 0 and start + n * width <= flat.size and col + c <= width:
            return flat[start:start + n * width].reshape(n, width), col
    return np.ascontiguousarray(view), 0
