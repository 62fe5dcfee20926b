"""The numba decoder's products on quantized weights (models/mamba2/quantize.py gives the formats and their spec,
`dequantize`): out[:, lo:hi] = u (b, in) @ W[lo:hi]^T + bias[lo:hi], with W
- int8: q (out, in) int8 and scales (out, in / block) float32, the weight q * s;
- bfloat16: (out, in) uint16, the weight those bits << 16 read as float32.

8 and 16 bits are there to read fewer bytes (a float32 decoding step is at the memory-bandwidth wall), so the
products must widen the weights as fast as memory brings them. What stood in the way, measured on the 50,288 x
768 LM head, batch 1, one thread, against the float32 product (_matvec_rows: 5.0-5.4 ms, 154 MB from memory):
- numba's loops do not vectorise the widening. With a literal block of 32, LLVM unrolled it completely into 32
  scalar `vcvtsi2ss` (16-22 ms); with a run-time block the loop vectoriser works, but it sums its vector to one
  number at the end of every block of 32 (3.3 ms). So the block loop is written in LLVM's vectors
  (`_block_dots`, a numba intrinsic): 32 weights loaded as one <32 x i8> (or <32 x i16>), widened at once,
  multiplied by a batch row's 32 values into a vector sum that stays a vector until the row ends; the block's
  scale multiplies its products once (sum_j q_j s u_j = s sum_j q_j u_j). With the head in L2: 1.7 ms.
- Four weight rows at a time (to share the loads of u, as _matvec_blocks does) read memory 2x slower than one
  row at a time (int8 4.2 vs 2.1 ms, bfloat16 7.7 vs 3.1): rows are read one by one, in order.
- The products ran ahead of the hardware prefetcher: the loop prefetches PREFETCH_BYTES ahead in its row (the
  rows that follow; a prefetch never faults, so past the matrix's end is harmless). In whole 130M-shape
  decoding (bench_quantized.py, 2 threads, two rounds each) int8 went from 2.42 / 2.62x float32 without it to
  2.69 / 2.92x with it; bfloat16 1.95 / 1.81x -> 1.89 / 1.93x.
A batch row's values are re-read from L1 for every weight row; the widening is shared by 8 (or 4) batch rows.
Columns past the last whole 32 (bfloat16 with `in` not a multiple of 32) take a plain numba loop (`_scalar_dot`)
after the vectors; int8 blocks that are not a multiple of 32 a loop per block (`_rows_in_blocks`).

In a float64 work dtype the widened weights are exact (q * s has at most 8 + 24 significant bits; a bfloat16 is
a float32), so the products equal the float64 twin's up to the order of the sums.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import config, types
from numba.core import cgutils
from numba.extending import intrinsic

from .jit import njit
from .prefetch import TO_L1, emit_prefetch

# the options of decode_kernels._JIT (not imported: decode_kernels imports this module)
_JIT = {"cache": True, "nogil": True, "fastmath": {"reassoc", "contract"}, "error_model": "numpy"}

VECTOR = 32             # weights widened at once: the int8 block of llama.cpp's Q8_0, one 256-bit load of int8
PREFETCH_BYTES = 4096   # how far ahead of its row the block loop prefetches (measured: the docstring)


def _block_dots(n_batch: int, width: int = VECTOR):
    """An intrinsic: dots(W, S, i, u, bi, n_vectors, per_scale) -> the n_batch sums W[i, :k] . u[bi + c, :k],
    k = width n_vectors; W int8 (S its scales, `per_scale` vectors of `width` to a scale: block / width) or
    bfloat16 bits (S None); W, S and u C-contiguous. Each sum is a vector of lanes, added into one number after
    the last block. width 32, or 8 for int8 blocks that 32 does not divide (24, 40, ...)."""
    lanes = min(16 if n_batch <= 4 else 8, width)                      # 8 sums of 16 lanes would not fit the
                                                                        # registers beside the weights
    @intrinsic
    def dots(typingctx, W, S, i, u, bi, n_vectors, per_scale):
        ok = (isinstance(W, types.Array) and W.layout == "C" and W.dtype in (types.int8, types.uint16)
              and isinstance(u, types.Array) and u.layout == "C" and u.dtype in (types.float32, types.float64)
              and (S == types.none if W.dtype == types.uint16 else isinstance(S, types.Array) and S.layout == "C"))
        if not ok:
            return None
        return types.UniTuple(u.dtype, n_batch)(W, S, i, u, bi, n_vectors, per_scale), _codegen

    def _codegen(context, builder, signature, args):
        Wt, St, it, ut, bt, nt, pt = signature.args
        intp, i32 = context.get_value_type(types.intp), ir.IntType(32)
        T = context.get_value_type(ut.dtype)
        itemsize = context.get_abi_sizeof(T)
        block_t, lane_t = ir.VectorType(T, width), ir.VectorType(T, lanes)

        def const(n):
            return ir.Constant(intp, n)

        def mask(values):
            return ir.Constant(ir.VectorType(i32, len(values)), list(values))

        def index(value, typ):
            return context.cast(builder, value, typ, types.intp)

        def row(array_type, array, r):                                  # pointer to array[r, 0]
            return cgutils.get_item_pointer(context, builder, array_type, array, [r, const(0)])

        W = context.make_array(Wt)(context, builder, args[0])
        u = context.make_array(ut)(context, builder, args[3])
        w_row, b0 = row(Wt, W, index(args[2], it)), index(args[4], bt)
        u_rows = [row(ut, u, builder.add(b0, const(c))) for c in range(n_batch)]
        scaled = Wt.dtype == types.int8
        if scaled:
            s_row = row(St, context.make_array(St)(context, builder, args[1]), index(args[2], it))
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(lane_t, [lane_t] * 3),
                                             f"llvm.fma.v{lanes}{'f32' if itemsize == 4 else 'f64'}")
        pieces = [mask(range(p, p + lanes)) for p in range(0, width, lanes)]
        sums = [cgutils.alloca_once_value(builder, ir.Constant(lane_t, None)) for _ in range(n_batch)]
        ahead = const(PREFETCH_BYTES // context.get_abi_sizeof(context.get_value_type(Wt.dtype)))
        per_scale = index(args[6], pt)                                  # >= 1 (the caller's)
        with cgutils.for_range(builder, builder.udiv(index(args[5], nt), per_scale)) as scale_loop:
            if scaled:                                                  # (lanes,) this block's scale
                s = context.cast(builder, builder.load(builder.gep(s_row, [scale_loop.index])), St.dtype, ut.dtype)
                s = builder.shuffle_vector(builder.insert_element(ir.Constant(lane_t, ir.Undefined), s,
                                                                  ir.Constant(i32, 0)),
                                           ir.Constant(lane_t, ir.Undefined), mask([0] * lanes))
            with cgutils.for_range(builder, per_scale) as loop:
                col = builder.mul(builder.add(builder.mul(scale_loop.index, per_scale), loop.index), const(width))
                emit_prefetch(builder, builder.gep(w_row, [builder.add(col, ahead)]), TO_L1)
                raw = builder.load(builder.bitcast(builder.gep(w_row, [col]),
                                                   ir.VectorType(w_row.type.pointee, width).as_pointer()), align=1)
                w = _widen(builder, raw, Wt.dtype, block_t)             # (width,) weights in u's dtype
                w = [builder.shuffle_vector(w, w, m) for m in pieces]
                for c in range(n_batch):
                    x = builder.load(builder.bitcast(builder.gep(u_rows[c], [col]), block_t.as_pointer()),
                                     align=itemsize)                   # (width,) of batch row c
                    x = [builder.shuffle_vector(x, x, m) for m in pieces]
                    dot = builder.fmul(w[0], x[0])                      # (lanes,) the 32 products, folded
                    for p in range(1, len(pieces)):
                        dot = builder.call(fma, [w[p], x[p], dot])
                    acc = builder.load(sums[c])
                    builder.store(builder.call(fma, [dot, s, acc]) if scaled else builder.fadd(acc, dot), sums[c])
        out = []
        for c in range(n_batch):
            acc, n = builder.load(sums[c]), lanes
            while n > 1:                                                # halves added: 16 -> 8 -> ... -> 1
                n //= 2
                acc = builder.fadd(builder.shuffle_vector(acc, acc, mask(range(n))),
                                   builder.shuffle_vector(acc, acc, mask(range(n, 2 * n))))
            out.append(builder.extract_element(acc, ir.Constant(i32, 0)))
        return context.make_tuple(builder, signature.return_type, out)

    return dots


def _widen(builder, raw, dtype, block_t):
    """(width,) int8 or bfloat16 bits -> (width,) floats of block_t's element type (exact either way)."""
    if dtype == types.int8:
        return builder.sitofp(raw, block_t)
    width = block_t.count
    bits = builder.shl(builder.zext(raw, ir.VectorType(ir.IntType(32), width)),
                       ir.Constant(ir.VectorType(ir.IntType(32), width), [16] * width))
    wide = builder.bitcast(bits, ir.VectorType(ir.FloatType(), width))
    return wide if block_t.element == ir.FloatType() else builder.fpext(wide, block_t)


@intrinsic
def _bfloat16_value(typingctx, bits):
    """The float32 whose upper 16 bits are `bits` (uint16), lower 16 zero."""
    def codegen(context, builder, signature, args):
        wide = builder.shl(builder.zext(args[0], ir.IntType(32)), ir.Constant(ir.IntType(32), 16))
        return builder.bitcast(wide, ir.FloatType())
    return types.float32(bits), codegen


NARROW = 8   # the vector of int8 blocks that are a multiple of 8 but not of 32
_dots_8, _dots_4, _dots_1 = _block_dots(8), _block_dots(4), _block_dots(1)
_narrow_8, _narrow_4, _narrow_1 = _block_dots(8, NARROW), _block_dots(4, NARROW), _block_dots(1, NARROW)

if config.DISABLE_JIT:                                                  # NUMBA_DISABLE_JIT=1: the same sums
    def _python_dots(n_batch, width=VECTOR):                            # in NumPy (intrinsics need the JIT)
        def dots(W, S, i, u, bi, n_vectors, per_scale):
            k = n_vectors * width
            w = (W[i, :k] * np.repeat(S[i].astype(np.float64), per_scale * width)[:k] if S is not None
                 else (W[i, :k].astype(np.uint32) << 16).view(np.float32))
            return tuple(u[bi:bi + n_batch, :k] @ w.astype(u.dtype))
        return dots

    _dots_8, _dots_4, _dots_1 = _python_dots(8), _python_dots(4), _python_dots(1)
    _narrow_8, _narrow_4, _narrow_1 = _python_dots(8, NARROW), _python_dots(4, NARROW), _python_dots(1, NARROW)

    def _bfloat16_value(bits):  # noqa: F811
        return np.array(np.uint32(bits) << np.uint32(16), np.uint32).view(np.float32)[()]


@njit(**_JIT)
def int8_rows(Q, S, lo, hi, u, bias, zero, out):
    """out[:, lo:hi] = u (b, in) @ (q * s)[lo:hi]^T + bias[lo:hi]; Q (out, in) int8, S (out, in / block) f32."""
    block = Q.shape[1] // S.shape[1]
    if block % VECTOR == 0:
        _rows(Q, S, lo, hi, u, bias, zero, out, Q.shape[1] // VECTOR, block // VECTOR, False)
    elif block % NARROW == 0:   # blocks of another size (default_block: d_model 48 takes 24), in vectors of 8
        _rows(Q, S, lo, hi, u, bias, zero, out, Q.shape[1] // NARROW, block // NARROW, True)
    else:
        _rows_in_blocks(Q, S, lo, hi, u, bias, zero, out)


@njit(**_JIT)
def bfloat16_rows(W, lo, hi, u, bias, zero, out):
    """out[:, lo:hi] = u (b, in) @ float32(W << 16)[lo:hi]^T + bias[lo:hi]; W (out, in) uint16."""
    _rows(W, None, lo, hi, u, bias, zero, out, W.shape[1] // VECTOR, 1, False)


@njit(inline="always", **_JIT)
def _rows(W, S, lo, hi, u, bias, zero, out, n_vectors, per_scale, narrow):
    """One weight row at a time (the weights stream in order), times batch rows in groups of 8, 4, then 1:
    columns [0, 32 n_vectors) in vectors (_block_dots), then the rest, if any, in _scalar_dot (a loop of its
    own: beside the vector loop it made the batch-8 products 2x slower). narrow: vectors of NARROW, not 32."""
    nb, start = u.shape[0], n_vectors * (NARROW if narrow else VECTOR)
    for i in range(lo, hi):
        bi = 0
        while bi + 8 <= nb:
            sums8 = (_narrow_8 if narrow else _dots_8)(W, S, i, u, bi, n_vectors, per_scale)
            for c in range(8):
                out[bi + c, i] = sums8[c] + bias[i]
            bi += 8
        if bi + 4 <= nb:
            sums4 = (_narrow_4 if narrow else _dots_4)(W, S, i, u, bi, n_vectors, per_scale)
            for c in range(4):
                out[bi + c, i] = sums4[c] + bias[i]
            bi += 4
        for c in range(bi, nb):
            out[c, i] = (_narrow_1 if narrow else _dots_1)(W, S, i, u, c, n_vectors, per_scale)[0] + bias[i]
    if S is None and start < W.shape[1]:   # bfloat16's last columns (an int8 row is whole vectors: they divide its
        for i in range(lo, hi):              # block, and the block the row)
            for c in range(nb):
                out[c, i] += _scalar_dot(W, i, u, c, start, zero)


@njit(inline="always", **_JIT)
def _rows_in_blocks(Q, S, lo, hi, u, bias, zero, out):
    """int8 in blocks that are not a multiple of 32: each weight row widened into a buffer (q * s, a loop per
    block), then its dot with every batch row (one long loop numba vectorises). Through _scalar_dot, an integer
    division a weight, a 16,000 x 792 product at block 24 took 74 ms against float32's 1.7; summing each block
    in a loop of its own, 12 ms (loops of 24 are too short to vectorise)."""
    n_blocks, n = S.shape[1], Q.shape[1]
    block = n // n_blocks
    row = np.empty(n, u.dtype)
    for i in range(lo, hi):
        for k in range(n_blocks):
            scale = S[i, k]
            for j in range(k * block, (k + 1) * block):
                row[j] = (zero + Q[i, j]) * scale
        for c in range(u.shape[0]):
            acc = zero
            for j in range(n):
                acc += row[j] * u[c, j]
            out[c, i] = acc + bias[i]


@njit(inline="always", **_JIT)
def _scalar_dot(W, i, u, bi, start, zero):
    """sum over columns j >= start of bfloat16 weight (i, j) * u[bi, j], widened one at a time."""
    acc = zero
    for j in range(start, W.shape[1]):
        acc += (zero + _bfloat16_value(W[i, j])) * u[bi, j]
    return acc


@njit(**_JIT)
def int8_dequantized(Q, S, out):
    """out (rows, in) = q * s for Q (rows, in) int8 and S (rows, in / block) float32: each product in float64,
    where it is exact, rounded once to out's dtype: the bits of quantize.dequantize (its twin). The forward's
    prefill and eval dequantize blocks of rows with it; a block loop of run-time length vectorises (NumPy's
    astype and multiply took 10x as long: at the 130M shape 0.14 s of a 512-token prompt's 0.93 s)."""
    block = np.uint64(Q.shape[1] // S.shape[1])
    for i in range(Q.shape[0]):
        q, s, w = Q[i], S[i], out[i]
        for b in range(S.shape[1]):
            scale, base = np.float64(s[b]), np.uint64(b) * block
            for j in range(block):
                w[base + j] = np.float64(q[base + j]) * scale


@njit(**_JIT)
def bfloat16_dequantized(W, out):
    """out (rows, in) = the bfloat16 bits W (rows, in) uint16 widened (exact), in out's dtype."""
    for i in range(W.shape[0]):
        bits, w = W[i], out[i]
        for j in range(W.shape[1]):
            w[j] = _bfloat16_value(bits[j])


@njit(**_JIT)
def int8_row(Q, S, token, out):
    """out (in,) = the dequantized row `token` of (Q, S): an embedding lookup."""
    block = Q.shape[1] // S.shape[1]
    for j in range(Q.shape[1]):
        out[j] = np.float64(Q[token, j]) * np.float64(S[token, j // block])  # exact, then rounded once


@njit(**_JIT)
def bfloat16_row(W, token, out):
    """out (in,) = the row `token` of bfloat16 bits W, widened."""
    bits = np.empty(W.shape[1], np.uint32)
    for j in range(W.shape[1]):
        bits[j] = np.uint32(W[token, j]) << np.uint32(16)
    wide = bits.view(np.float32)
    for j in range(W.shape[1]):
        out[j] = wide[j]
