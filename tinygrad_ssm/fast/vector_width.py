"""A compiler hint for numba kernels: 512-bit vectors in one function, where the CPU has them.

Numba compiles for the host CPU, and LLVM's tuning for AVX-512 Xeons prefers 256-bit vectors (wider ones may
lower the clock). Numba has no per-function setting; NUMBA_CPU_FEATURES=<host>,-prefer-256-bit changes every
numba function of the process, the user's too. LLVM reads the preference per function, from the function
attribute "prefer-vector-width", so a kernel that gains from wider vectors calls `prefer_512_bit_vectors()`
first and only it changes. Where it was measured (each against the same code without it):
- the decoder's 4 x 4 product blocks (fast/decode_kernels._matvec_blocks): batch-8 generation 7% faster;
  its heads, its conv and batch 1's one-row sums were no faster or slower, and do not use it;
- the scan's forward kernel, when it was the recurrence (A/B with `benchmarks/dev/ab.py --what ssd`): the same on
  one thread (1.008x), 0.94x on two, the forward + backward 0.995x: not used.
A CPU without AVX-512 keeps its widest vectors; other targets ignore the attribute.
"""
from __future__ import annotations

from numba import config, types
from numba.extending import intrinsic

PREFER_512_BIT = '"prefer-vector-width"="512"'


@intrinsic
def prefer_512_bit_vectors(typingctx):
    """Gives the calling function the attribute PREFER_512_BIT. llvmlite takes only its list of attribute
    names, so the string attribute goes into its set as written (it prints the set's items as they are); where
    that fails, nothing changes but the speed (tests/fast/test_decode_kernels.py checks the attribute is there)."""
    def codegen(context, builder, signature, args):
        try:
            set.add(builder.function.attributes, PREFER_512_BIT)
        except TypeError:                                               # llvmlite's attributes no longer a set
            pass
        return context.get_dummy_value()
    return types.void(), codegen


if config.DISABLE_JIT:
    def prefer_512_bit_vectors():  # noqa: F811 - NUMBA_DISABLE_JIT=1: a hint to a compiler that does not run
        pass
