"""BLAS on one thread while the package's own threads share out the work: the products of fast/products.py (each
cut into row blocks, one per thread) and the scan's chunked backward (small products inside its numba kernel).

Why: OpenBLAS's worker threads spin after each multi-threaded product (for about 0.1 s by default), and in a
training step a numba kernel follows nearly every product: on 2 cores the spinning thread took one of the two
from it. How much depended on the import order, since OpenBLAS reads OPENBLAS_THREAD_TIMEOUT once, when NumPy
loads it (a step took 0.38 s with the package imported first, which set that variable, and 0.49-0.51 s with
NumPy first). With BLAS asked for one thread during those calls its workers are never woken, so there is
nothing to spin, whatever was imported first (benchmarks/bench_import_order.py).

The limit is set through threadpoolctl, at run time, on every BLAS library loaded in the process, for the
duration of the call only: the thread counts are restored afterwards, so the user's own products keep their
threads. OpenBLAS's thread count is one setting for the whole process, so the first thread to enter owns the
limit and restores it when it leaves; a call from another thread meanwhile runs under it and changes nothing
(threadpoolctl likewise lets one Python thread at a time set OpenBLAS's count: where another thread of the
user's holds it, the limit is not set, and the products run as they would have, only slower).
"""
from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from threadpoolctl import ThreadpoolController

_lock = threading.Lock()
_controller: ThreadpoolController | None = None
_owner: threading.Thread | None = None   # the thread that set the limit
_depth = 0                               # how deep the owner is in nested single_threaded_blas() calls
_limiter = None                          # what restores the thread counts when the owner leaves
_fork_hook = False                       # _reset_after_fork registered


def _reset_after_fork() -> None:
    """In a child forked while another thread held the limit (or the lock), neither that thread nor its release
    exists: a fresh lock and no owner, else the child's first fused product waited for ever (found by an audit),
    and the thread counts put back, else the child's BLAS kept one thread for good. Forked by the owner itself
    (inside the `with`), the child leaves the `with` as the parent does, and restores them then."""
    global _lock, _owner, _depth, _limiter
    _lock = threading.Lock()
    if _owner is not threading.current_thread():
        if _limiter is not None:
            _restore(_limiter)
        _owner, _depth, _limiter = None, 0, None


def _restore(limiter) -> None:
    """The thread counts put back, and OpenBLAS's control handed back: threadpoolctl lets only the first thread
    that sets OpenBLAS's count set it again, for as long as that thread lives, so after the main thread's first
    fused product a limit set from any other thread (a training in a thread) changed nothing."""
    limiter.restore_original_limits()
    from threadpoolctl import OpenBLASController
    release = getattr(OpenBLASController, "clear_controlling_thread", None)   # threadpoolctl >= 3.6
    if release is not None:
        release()                                  # only if this thread has it (not the user's own)


def _new_controller() -> ThreadpoolController:
    # imported here, when a limit is first needed: threadpoolctl's import sets KMP_DUPLICATE_LIB_OK in os.environ
    # (README, "What the fast paths change"), which importing the package or the scan alone must not do; the
    # fork hook likewise (it touches only this module's state)
    global _fork_hook
    if not _fork_hook and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_reset_after_fork)
        _fork_hook = True
    from threadpoolctl import ThreadpoolController
    return ThreadpoolController()


def refresh_libraries() -> None:
    """Look for the BLAS libraries loaded in the process again (threadpoolctl finds them once, when first asked):
    call after loading one, as the scan's chunked backward does with SciPy's."""
    global _controller
    with _lock:
        _controller = _new_controller()


@contextmanager
def single_threaded_blas():
    """Every loaded BLAS on one thread inside the `with`, its thread count restored afterwards."""
    global _controller, _owner, _depth, _limiter
    me = threading.current_thread()
    with _lock:
        if _owner is None:
            if _controller is None:
                _controller = _new_controller()
            _owner, _limiter = me, _controller.limit(limits=1, user_api="blas")
        owns = _owner is me
        if owns:
            _depth += 1
    try:
        yield
    finally:
        if owns:
            with _lock:
                _depth -= 1
                if _depth == 0:
                    _restore(_limiter)
                    _owner = _limiter = None
