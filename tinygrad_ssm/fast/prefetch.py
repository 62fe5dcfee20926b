"""Software prefetch: asking the CPU to bring a cache line in before a kernel loads it (LLVM's `llvm.prefetch`,
a hint that never faults, so an address past an array's end is harmless; targets without it drop it).

Where it is used, each measured against the same code without it:
- the decoder's 4 x 4 product blocks (fast/decode_kernels._matvec_blocks), for the next block's weight rows:
  a 16-token prompt's step at the 130M shape, batch 1, 2 threads, 0.83-0.91x the time;
- the int8 and bfloat16 row products (fast/quantized_kernels.py), 4 KB ahead in the row.
"""
from __future__ import annotations

from llvmlite import ir
from numba import config, types
from numba.core import cgutils
from numba.extending import intrinsic

TO_L2 = 2       # LLVM's locality 0-3: 3 keeps the line in every level (x86 prefetcht0), 2 in L2 and out (prefetcht1)
TO_L1 = 3


def emit_prefetch(builder, pointer, locality: int) -> None:
    """A read prefetch of the line holding `pointer` (any pointer type), for code written in LLVM IR."""
    i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                                        "llvm.prefetch.p0")
    builder.call(fn, [builder.bitcast(pointer, i8p), ir.Constant(i32, 0), ir.Constant(i32, locality),
                      ir.Constant(i32, 1)])                             # read, locality, data cache


@intrinsic
def prefetch_to_l2(typingctx, array, i, j):
    """Prefetch the line holding array[i, j] (a 2-D array) into L2; i, j are not checked against the shape."""
    def codegen(context, builder, signature, args):
        array_type = signature.args[0]
        array_value = context.make_array(array_type)(context, builder, args[0])
        pointer = cgutils.get_item_pointer(context, builder, array_type, array_value, [args[1], args[2]],
                                           wraparound=False)
        emit_prefetch(builder, pointer, TO_L2)
        return context.get_dummy_value()
    if isinstance(array, types.Array) and array.ndim == 2:
        return types.void(array, i, j), codegen
    return None


if config.DISABLE_JIT:
    def prefetch_to_l2(array, i, j):  # noqa: F811 - NUMBA_DISABLE_JIT=1: a hint to a compiler that does not run
        pass
