"""Threads sharing work through atomic counters in a plain int64 array, claimed from inside numba kernels (nogil),
so whoever is running takes the next piece of work and nothing waits for a thread that has not started yet.

Work is split into phases, each into chunks. A thread *claims* the next chunk of a phase with compare-and-swap
on the phase's claim counter, computes it, then (where a phase must end before the next begins) counts it done;
it moves to the next phase once every chunk of this one is done. Counters only grow: step s owns the values
[s n, (s + 1) n) of a phase with n chunks, so a thread still in an old step can never claim a newer step's
chunk. Whoever is running does all the work: one thread alone finishes a step, and each chunk is computed by
exactly one thread, so results do not depend on who computed what.

Two users: decoding (models/mamba2/decode.py: a layer's in_proj rows, its heads, ... per token, a helper thread polling
for the next step instead of a pool's wake-up per launch), and the scan's kernels (scan/numba_cpu.py: (batch,
head) work items claimed from both ends of one counter, `claim_from_end`, by the threads of
fast/row_blocks.on_threads).
"""
from __future__ import annotations

import os
import threading
import time

from numba import config, types
from numba.core import cgutils
from numba.extending import intrinsic
from llvmlite import ir  # after numba: where numba is missing, the error names it (llvmlite comes with it)

from .jit import njit

_LINE = 8  # int64s per cache line: the claim and done counters of a phase live on lines of their own


def _pointer(context, builder, aryty, ary_value, index):
    ary = context.make_array(aryty)(context, builder, ary_value)
    return cgutils.get_item_pointer(context, builder, aryty, ary, [index])


@intrinsic
def atomic_load(typingctx, arr, index):
    """arr[index] read with acquire ordering (what was written before the matching release is visible)."""
    def codegen(context, builder, signature, args):
        return builder.load_atomic(_pointer(context, builder, signature.args[0], args[0], args[1]), "acquire", 8)
    return types.int64(arr, index), codegen


@intrinsic
def atomic_store(typingctx, arr, index, value):
    """arr[index] = value with release ordering."""
    def codegen(context, builder, signature, args):
        builder.store_atomic(args[2], _pointer(context, builder, signature.args[0], args[0], args[1]), "release", 8)
        return context.get_dummy_value()
    return types.void(arr, index, types.int64), codegen


@intrinsic
def atomic_increment(typingctx, arr, index):
    """arr[index] += 1 atomically (sequentially consistent)."""
    def codegen(context, builder, signature, args):
        ptr = _pointer(context, builder, signature.args[0], args[0], args[1])
        builder.atomic_rmw("add", ptr, context.get_constant(types.int64, 1), "seq_cst")
        return context.get_dummy_value()
    return types.void(arr, index), codegen


@intrinsic
def compare_and_swap(typingctx, arr, index, expected, new):
    """arr[index] = new if arr[index] == expected, atomically; True when it was swapped."""
    def codegen(context, builder, signature, args):
        ptr = _pointer(context, builder, signature.args[0], args[0], args[1])
        pair = builder.cmpxchg(ptr, args[2], args[3], "seq_cst", "seq_cst")
        return builder.extract_value(pair, 1)
    return types.boolean(arr, index, types.int64, types.int64), codegen


@intrinsic
def pause(typingctx):
    """The spin-wait hint (x86 `pause`; nothing elsewhere)."""
    def codegen(context, builder, signature, args):
        import platform
        if platform.machine().lower() in ("x86_64", "amd64", "i686", "x86"):
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                                "llvm.x86.sse2.pause")
            builder.call(fn, [])
        return context.get_dummy_value()
    return types.void(), codegen


@intrinsic
def sched_yield(typingctx):
    """libc's sched_yield (by name, so a cached function links it again in a new process)."""
    def codegen(context, builder, signature, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(32), []), "sched_yield")
        builder.call(fn, [])
        return context.get_dummy_value()
    return types.void(), codegen


@intrinsic
def cycles(typingctx):
    """The CPU's cycle counter (rdtsc on x86): the decoder's per-phase profile (benchmarks/profile_decode.py)."""
    def codegen(context, builder, signature, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(64), []),
                                            "llvm.readcyclecounter")
        return builder.call(fn, [])
    return types.int64(), codegen


@njit(cache=True, nogil=True)
def relax(spins):
    """One round of waiting; spins counts the rounds so far: spin first, give the core away after a while."""
    if spins < 2000:
        pause()
    else:
        sched_yield()


@njit(cache=True, nogil=True)
def claim(sync, phase, step, n):
    """The next unclaimed chunk in [0, n) of `phase` in step `step`, or -1 when all are claimed."""
    end = (step + 1) * n
    while True:
        c = atomic_load(sync, phase * 2 * _LINE)
        if c >= end:
            return -1
        if compare_and_swap(sync, phase * 2 * _LINE, c, c + 1):
            return c - step * n


@njit(cache=True, nogil=True)
def claim_from_end(counter, n, from_back):
    """The next unclaimed item of [0, n) counted from the front (0, 1, ...) or, from_back, from the back (n - 1,
    n - 2, ...); -1 when every item is claimed. counter[0] holds both counts, the front's in its low 32 bits and
    the back's in its high ones (n < 2^32), so one compare-and-swap claims from either end. Two threads claiming
    from opposite ends work on items far apart until they meet: the scan's (batch, head) items then touch
    different batches, as prange's fixed halves did, and neither thread waits for the other."""
    while True:
        v = atomic_load(counter, 0)
        front, back = v & 0xFFFFFFFF, v >> 32
        if front + back >= n:
            return -1
        if compare_and_swap(counter, 0, v, v + ((1 << 32) if from_back else 1)):
            return n - 1 - back if from_back else front


@njit(cache=True, nogil=True)
def finish(sync, phase):
    atomic_increment(sync, phase * 2 * _LINE + _LINE)


@njit(cache=True, nogil=True)
def wait_done(sync, phase, step, n):
    """Until all n chunks of `phase` in step `step` are done (by any thread)."""
    end = (step + 1) * n
    spins = 0
    while atomic_load(sync, phase * 2 * _LINE + _LINE) < end:
        relax(spins)
        spins += 1


if config.DISABLE_JIT:
    # NUMBA_DISABLE_JIT=1 (stepping through a kernel in a debugger): an intrinsic has no Python body, so each is
    # replaced by the plain operation. Python threads interleave between bytecodes, so the read-modify-writes
    # take one lock; loads and stores of one numpy element are whole under the GIL.
    _lock = threading.Lock()

    def atomic_load(arr, index):  # noqa: F811 - the pure-Python twin of the intrinsic above
        return int(arr[index])

    def atomic_store(arr, index, value):  # noqa: F811
        arr[index] = value

    def atomic_increment(arr, index):  # noqa: F811
        with _lock:
            arr[index] += 1

    def compare_and_swap(arr, index, expected, new):  # noqa: F811
        with _lock:
            if arr[index] == expected:
                arr[index] = new
                return True
            return False

    def pause():  # noqa: F811
        pass

    def sched_yield():  # noqa: F811
        time.sleep(0) if not hasattr(os, "sched_yield") else os.sched_yield()

    def cycles():  # noqa: F811
        return time.perf_counter_ns()


def sync_array(n_phases: int):
    import numpy as np
    return np.zeros(n_phases * 2 * _LINE, np.int64)
