"""The per-token math of the numba decoder (decode.py), one function per piece of a Mamba-2 step: the products
(_matvec_rows), the pre-norm, in_proj's conv and dt, a head's state update and readout with its gate, the group
norm. decode.py cuts a step into chunks of these and shares them between threads.

Loops run over views indexed from 0 where they must vectorise: with an index that might be negative numba
adds a wraparound select and LLVM no longer vectorises the loop. The official sizes (a conv of width 4, a state
of 64) are passed as literals to an inlined body, so their loops unroll. The products use 512-bit vectors where
the CPU has them (fast/vector_width.py).
"""
from __future__ import annotations

import math

import numpy as np
from numba import types
from numba.extending import overload

from .fast_exp import silu
from .jit import njit
from .prefetch import prefetch_to_l2
from .quantized_kernels import bfloat16_row, bfloat16_rows, int8_row, int8_rows
from .vector_width import prefer_512_bit_vectors

# sums may vectorise (no nnan/ninf); no ZeroDivisionError check (no division here can be by 0): with it, no
# loop holding a division vectorised (the SiLU gates ran 6x slower)
_JIT = {"cache": True, "nogil": True, "fastmath": {"reassoc", "contract"}, "error_model": "numpy"}


@njit(**_JIT)
def _update_head(S, x, B, C, decay, dt, Dh, y):
    """One head: S (p, n) <- decay S + dt x B^T;  y (p,) = S C + Dh x. The scalars come in S's dtype, so a
    float32 state is updated in float32 lanes (no float64 round trips in the innermost loop). With d_state 64
    (the usual size) a literal: the inner loop unrolls, no remainder or trip-count checks per state row."""
    if S.shape[1] == 64:
        _update_head_n(S, x, B, C, decay, dt, Dh, y, 64)
    else:
        _update_head_n(S, x, B, C, decay, dt, Dh, y, S.shape[1])


@njit(inline="always", **_JIT)
def _update_head_n(S, x, B, C, decay, dt, Dh, y, n):
    for pi in range(S.shape[0]):
        xdt = x[pi] * dt
        acc = decay - decay                                             # 0 in S's dtype
        for ni in range(n):
            s = decay * S[pi, ni] + xdt * B[ni]
            S[pi, ni] = s
            acc += s * C[ni]
        y[pi] = acc + Dh * x[pi]


@njit(**_JIT)
def _dot(W, i, u, bi, zero):
    acc = zero
    for j in range(W.shape[1]):
        acc += W[i, j] * u[bi, j]
    return acc


@njit(**_JIT)
def _matvec_rows(W, lo, hi, u, bias, zero, out):
    """out[:, lo:hi] = u (b, in) @ W[lo:hi] (rows, in)^T + bias[lo:hi]: each weight row is read once (from L3
    when the model does not fit L2) and used for every batch row while it sits in L1. Blocks of four weight rows
    times four batch rows (_matvec_blocks) for all it can, four weight rows against each batch row left over
    while those four are in L1; batch 1 to 3: two weight rows from the two halves of the range against each
    batch row (_matvec_halves). The last row of a range not a multiple of the rows taken at once: one sum at
    a time."""
    nb = u.shape[0]
    if nb >= 4:
        rows_end = lo + (hi - lo) // 4 * 4                              # the blocks' weight rows
        _matvec_blocks(W, lo, rows_end, u, bias, zero, out)
    else:
        rows_end = lo + (hi - lo) // 2 * 2                              # the two halves' weight rows
        _matvec_halves(W, lo, rows_end, u, bias, zero, out)
    for r in range(rows_end, hi):
        for bi in range(nb):
            out[bi, r] = _dot(W, r, u, bi, zero) + bias[r]


@njit(**_JIT)
def _matvec_halves(W, lo, hi, u, bias, zero, out):
    """_matvec_rows for weight rows [lo, hi) (an even count) and every batch row (fewer than 4): row i of the
    first half and row i of the second summed side by side against one batch row, then the same two (now in L1)
    against the next. The memory sees two long forward streams, which its prefetcher follows at nearly the rate
    of one: on a 1 GiB float32 matrix of 768 columns, 2 threads, 35.4 GB/s against 32.3 for four adjacent rows
    side by side (four streams restarting every row) and 36.3 for a plain sum; 1536 columns 34.2 against 32.0
    (and 31.7 for two adjacent rows). A decoding step at batch 1, the 130M shape: 0.956x the time of four
    adjacent rows (`benchmarks/dev/ab.py --what generate`; batch 2 0.986x, 3 0.995x); one row at a time (_dot)
    streamed 24.8 GB/s. The bias is added in a pass of its own after the sums: against adding it as each pair is
    stored, a batch-1 step 0.966-0.982x the time in five runs of ab.py (10 rounds each), 1.01x in a sixth; the
    sums' loop compiles to the same instructions either way (what differs is at the rows' ends)."""
    half = (hi - lo) // 2
    for i in range(lo, lo + half):
        for bi in range(u.shape[0]):
            _two_sums(W, i, i + half, u, bi, zero, out)
    for i in range(lo, hi):
        for bi in range(u.shape[0]):
            out[bi, i] += bias[i]


@njit(inline="always", **_JIT)
def _two_sums(W, i, k, u, bi, zero, out):
    """out[bi, i], out[bi, k] = W[i] . u[bi], W[k] . u[bi]: two weight rows side by side."""
    a0 = a1 = zero
    for j in range(W.shape[1]):
        x = u[bi, j]
        a0, a1 = a0 + W[i, j] * x, a1 + W[k, j] * x
    out[bi, i], out[bi, k] = a0, a1


@njit(inline="always", **_JIT)
def _four_sums(W, i, u, bi, bias, zero, out):
    """out[bi, i:i + 4] = W[i:i + 4] @ u[bi] + bias[i:i + 4]: four weight rows side by side."""
    a0 = a1 = a2 = a3 = zero
    for j in range(W.shape[1]):
        x = u[bi, j]
        a0, a1, a2, a3 = a0 + W[i, j] * x, a1 + W[i + 1, j] * x, a2 + W[i + 2, j] * x, a3 + W[i + 3, j] * x
    out[bi, i], out[bi, i + 1] = a0 + bias[i], a1 + bias[i + 1]
    out[bi, i + 2], out[bi, i + 3] = a2 + bias[i + 2], a3 + bias[i + 3]


@njit(**_JIT)
def _matvec_blocks(W, lo, hi, u, bias, zero, out):
    """_matvec_rows for weight rows [lo, hi) (a multiple of 4) and every batch row (at least 4): four weight rows
    times four batch rows, then the same four weight rows, still in L1, against each batch row left over
    (_four_sums: a 17-token prompt had read its weights twice, 46.9 ms a step against 41.8 for 20 tokens at the
    130M shape). Four weight rows times four batch rows share their loads (16 sums at once; measured against
    two rows by four, one thread, a 1160 x 256 float32 in_proj at batch 8: 53 vs 66 us from L2, 68 vs 77 us
    streamed from L3). Vectors of 512 bits where the CPU has them (fast/vector_width.py); the sums below batch 4
    keep 256 (one row at a time ran 6% slower with 512, four adjacent rows no faster, two adjacent rows
    streamed 29-30 GB/s against 35.5-36.4 with 256 on a 1 GiB matrix).
    While a block's rows are used for the batch rows, the next block's rows are prefetched into L2, a share
    before each group of four batch rows: the hardware's prefetcher, which follows one stream well, fell behind
    the four rows read side by side (a 16-token prompt's step at the 130M shape, batch 1, 2 threads: 0.83-0.91x
    the time with it; batch 8's steps within the noise)."""
    prefer_512_bit_vectors()
    k = u.shape[1]
    per_line = max(1, 64 // W.itemsize)                                 # items in a 64-byte cache line
    nb = u.shape[0] // 4 * 4                                            # the batch rows in blocks
    lines, groups = -(-k // per_line), nb // 4                          # of a weight row; of batch rows
    for i in range(lo, hi, 4):
        for bi in range(0, nb, 4):
            if i + 4 < hi:                                              # the next block's rows i + 4 ... i + 7
                first, last = bi // 4 * lines // groups, (bi // 4 + 1) * lines // groups
                for r in range(i + 4, i + 8):
                    for line in range(first, last):
                        prefetch_to_l2(W, r, line * per_line)
            a0 = a1 = a2 = a3 = c0 = c1 = c2 = c3 = d0 = d1 = d2 = d3 = e0 = e1 = e2 = e3 = zero
            for j in range(k):
                w0, w1, w2, w3 = W[i, j], W[i + 1, j], W[i + 2, j], W[i + 3, j]
                u0, u1, u2, u3 = u[bi, j], u[bi + 1, j], u[bi + 2, j], u[bi + 3, j]
                a0, a1, a2, a3 = a0 + w0 * u0, a1 + w0 * u1, a2 + w0 * u2, a3 + w0 * u3
                c0, c1, c2, c3 = c0 + w1 * u0, c1 + w1 * u1, c2 + w1 * u2, c3 + w1 * u3
                d0, d1, d2, d3 = d0 + w2 * u0, d1 + w2 * u1, d2 + w2 * u2, d3 + w2 * u3
                e0, e1, e2, e3 = e0 + w3 * u0, e1 + w3 * u1, e2 + w3 * u2, e3 + w3 * u3
            _store4(out, bi, i, bias[i], a0, a1, a2, a3)
            _store4(out, bi, i + 1, bias[i + 1], c0, c1, c2, c3)
            _store4(out, bi, i + 2, bias[i + 2], d0, d1, d2, d3)
            _store4(out, bi, i + 3, bias[i + 3], e0, e1, e2, e3)
        for bi in range(nb, u.shape[0]):                                # the batch rows left over
            _four_sums(W, i, u, bi, bias, zero, out)


@njit(inline="always", **_JIT)
def _store4(out, bi, i, bias, s0, s1, s2, s3):
    out[bi, i], out[bi + 1, i], out[bi + 2, i], out[bi + 3, i] = s0 + bias, s1 + bias, s2 + bias, s3 + bias


def weight_rows(W, lo, hi, u, bias, zero, out):
    """out[:, lo:hi] = u (b, in) @ W[lo:hi]^T + bias[lo:hi] for any weight form the decoder holds: a float
    array (_matvec_rows), int8 as a tuple (q, scales) or bfloat16 bits as a uint16 array (quantized_kernels).
    Chosen by numba from W's type at compile time (the overload below): the float path compiles to _matvec_rows
    itself. This Python body is the same choice made at run time, for NUMBA_DISABLE_JIT=1
    (tests/test_jit_disabled.py)."""
    if isinstance(W, tuple):
        return int8_rows(W[0], W[1], lo, hi, u, bias, zero, out)
    if W.dtype == np.uint16:
        return bfloat16_rows(W, lo, hi, u, bias, zero, out)
    return _matvec_rows(W, lo, hi, u, bias, zero, out)


@overload(weight_rows, jit_options={"nogil": True})
def _weight_rows_of(W, lo, hi, u, bias, zero, out):
    if isinstance(W, types.BaseTuple):
        return lambda W, lo, hi, u, bias, zero, out: int8_rows(W[0], W[1], lo, hi, u, bias, zero, out)
    if W.dtype == types.uint16:
        return lambda W, lo, hi, u, bias, zero, out: bfloat16_rows(W, lo, hi, u, bias, zero, out)
    return lambda W, lo, hi, u, bias, zero, out: _matvec_rows(W, lo, hi, u, bias, zero, out)


def embedding_row(E, token, out):
    """out (d,) = row `token` of the embedding E, in any weight form (see weight_rows; this body: without the JIT)."""
    if isinstance(E, tuple):
        return int8_row(E[0], E[1], token, out)
    if E.dtype == np.uint16:
        return bfloat16_row(E, token, out)
    out[:] = E[token]


@overload(embedding_row, jit_options={"nogil": True})
def _embedding_row_of(E, token, out):
    if isinstance(E, types.BaseTuple):
        return lambda E, token, out: int8_row(E[0], E[1], token, out)
    if E.dtype == types.uint16:
        return lambda E, token, out: bfloat16_row(E, token, out)

    def copy(E, token, out):
        for j in range(out.shape[0]):
            out[j] = E[token, j]
    return copy


@njit(**_JIT)
def _residual_norm(first, x, delta, emb, ids, weight, eps, u, bi):
    """Row bi: x = embedding(ids) (first layer) or x += delta (the previous block's out_proj, bias included);
    u = x / sqrt(mean(x^2) + eps) * weight (the next pre-norm)."""
    if first:
        embedding_row(emb, ids[bi], x[bi])
    else:
        for j in range(x.shape[1]):
            x[bi, j] = x[bi, j] + delta[bi, j]
    acc = 0.0
    for j in range(x.shape[1]):
        acc += x[bi, j] * x[bi, j]
    r = 1.0 / math.sqrt(acc / x.shape[1] + eps)
    for j in range(x.shape[1]):
        u[bi, j] = x[bi, j] * r * weight[j]


@njit(**_JIT)
def _silu_inplace(a):
    """a (n,) = silu(a): a loop of its own vectorises (inside the conv's loop nest it did not)."""
    for i in range(a.shape[0]):
        a[i] = silu(a[i])


@njit(**_JIT)
def _gate_inplace(y, z):
    """y (n,) *= silu(z)."""
    for i in range(y.shape[0]):
        y[i] = y[i] * silu(z[i])


@njit(inline="always", **_JIT)
def _conv_silu(proj, d_inner, c_lo, c_hi, conv_w, conv_b, conv_state, xbc, k):
    """Channels [c_lo, c_hi) of every row: conv state (b, c, k) <- [state[:, :, 1:], new]; xbc = silu(sum_j
    state[:, :, j] w[:, j] + bias), new = those channels' in_proj outputs. The state and the weights are read
    flat (channel c's taps at k c .. k c + k - 1): a 2-D view of a channel range has strides numba only knows
    at run time, and that loop took 1.7x as long (b8, 640 channels: 9.1 against 5.4 us with the SiLU). Views
    start at index 0: no index can be negative, so numba adds no wraparound select; called with k a literal 4,
    the taps unroll (5x faster than channel loops per tap).
    A prompt's rows are token-major (row r = t b + bi reads state bi = r % b): rows run in order, so each
    state sees its sequence's tokens one after the other."""
    w, bias = conv_w.reshape(-1)[k * c_lo:k * c_hi], conv_b[c_lo:c_hi]    # (channels k,), (channels,)
    for r in range(proj.shape[0]):
        st = conv_state[r % conv_state.shape[0]].reshape(-1)[k * c_lo:k * c_hi]   # (channels k,) a view
        new, out = proj[r, d_inner + c_lo:d_inner + c_hi], xbc[r, c_lo:c_hi]
        for c in range(c_hi - c_lo):
            q = k * c
            acc = bias[c]
            for j in range(k - 1):
                s = st[q + j + 1]
                st[q + j] = s
                acc += s * w[q + j]
            v = new[c]
            st[q + k - 1] = v
            out[c] = acc + v * w[q + k - 1]
        _silu_inplace(out)


@njit(**_JIT)
def _in_proj_rows(W, lo, hi, u, in_b, zero, conv_w, conv_b, conv_state, dt_bias, low, high, clamp, proj, xbc, dtv):
    """Rows [lo, hi) of z | xBC | dt = in_proj(u), then what only needs those rows: for an xBC channel the
    conv state shift, the conv and SiLU (-> xbc); for a head's dt the bias, softplus and clamp (-> dtv)."""
    weight_rows(W, lo, hi, u, in_b, zero, proj)
    d_inner, (conv_dim, k) = proj.shape[1] - conv_w.shape[0] - dt_bias.shape[0], conv_w.shape
    c_lo = max(lo, d_inner) - d_inner                                   # these rows' channels [c_lo, c_hi)
    c_hi = max(c_lo, min(hi, d_inner + conv_dim) - d_inner)             # (never below c_lo: a slice would wrap)
    if k == 4:                                                          # the official width, a constant: 4x faster
        _conv_silu(proj, d_inner, c_lo, c_hi, conv_w, conv_b, conv_state, xbc, 4)
    else:
        _conv_silu(proj, d_inner, c_lo, c_hi, conv_w, conv_b, conv_state, xbc, k)
    for i in range(max(lo, d_inner + conv_dim), hi):
        hi_ = i - d_inner - conv_dim
        for bi in range(u.shape[0]):
            v = proj[bi, i] + dt_bias[hi_]
            dt = v if v > 20.0 else max(v, 0.0) + math.log1p(math.exp(-abs(v)))
            dtv[bi, hi_] = min(max(dt, low), high) if clamp else dt


@njit(**_JIT)
def _head_update(bi, hi, pair, ngroups, proj, xbc, dtv, A_log, D, ssm, coef, y, hsq):
    """Head hi of row bi, and hi + 1 when pair: the state update and readout (_update_head, or _update_heads2
    for two heads streamed at once: ~15% faster from L3 when both cores stream), then the gate y *= silu(z);
    hsq[bi, head] = the head's sum of gated squares (in float64) for the group norm. Row bi updates state
    bi % b (a prompt's token-major rows, see _conv_silu)."""
    nb_state, h, p, n = ssm.shape
    si = bi % nb_state
    heads = 2 if pair else 1
    for k in range(heads):
        dt = dtv[bi, hi + k]
        coef[2 * k], coef[2 * k + 1] = math.exp(dt * -math.exp(A_log[hi + k])), dt  # in the state's dtype
    b0 = h * p + (hi // (h // ngroups)) * n                             # this head's group's B in xbc
    c0 = b0 + ngroups * n                                               # and C
    if pair:
        b1 = h * p + ((hi + 1) // (h // ngroups)) * n                   # the next head's (another group's?)
        c1 = b1 + ngroups * n
        _update_heads2(ssm[si, hi], ssm[si, hi + 1], xbc[bi, hi * p:(hi + 2) * p], xbc[bi, b0:b0 + n],
                       xbc[bi, c0:c0 + n], xbc[bi, b1:b1 + n], xbc[bi, c1:c1 + n], coef, D[hi], D[hi + 1],
                       y[bi, hi * p:(hi + 2) * p])
    else:
        _update_head(ssm[si, hi], xbc[bi, hi * p:(hi + 1) * p], xbc[bi, b0:b0 + n], xbc[bi, c0:c0 + n], coef[0],
                     coef[1], D[hi], y[bi, hi * p:(hi + 1) * p])
    for k in range(heads):
        yh = y[bi, (hi + k) * p:(hi + k + 1) * p]
        _gate_inplace(yh, proj[bi, (hi + k) * p:(hi + k + 1) * p])
        acc = 0.0
        for c in range(p):                                              # a view from 0: no wraparound, it vectorises
            acc += yh[c] * yh[c]
        hsq[bi, hi + k] = acc


@njit(**_JIT)
def _update_heads2(S, T, x, B, C, B1, C1, coef, Dh, Dh1, y):
    """_update_head on two heads at once, row by row (two states streamed together): S with x[:p], B, C,
    coef[0:2], Dh -> y[:p]; T with x[p:], B1, C1, coef[2:4], Dh1 -> y[p:]."""
    if S.shape[1] == 64:
        _update_heads2_n(S, T, x, B, C, B1, C1, coef, Dh, Dh1, y, 64)
    else:
        _update_heads2_n(S, T, x, B, C, B1, C1, coef, Dh, Dh1, y, S.shape[1])


@njit(inline="always", **_JIT)
def _update_heads2_n(S, T, x, B, C, B1, C1, coef, Dh, Dh1, y, n):
    p = S.shape[0]
    decay, dt, decay1, dt1 = coef[0], coef[1], coef[2], coef[3]
    for pi in range(p):
        xdt, xdt1 = x[pi] * dt, x[p + pi] * dt1
        acc = acc1 = decay - decay                                      # 0 in S's dtype
        for ni in range(n):
            s = decay * S[pi, ni] + xdt * B[ni]
            S[pi, ni] = s
            acc += s * C[ni]
            t = decay1 * T[pi, ni] + xdt1 * B1[ni]
            T[pi, ni] = t
            acc1 += t * C1[ni]
        y[pi], y[p + pi] = acc + Dh * x[pi], acc1 + Dh1 * x[p + pi]


@njit(**_JIT)
def _group_norm(bi, g, ngroups, hsq, weight, eps, y):
    """Group g of row bi: y *= 1 / sqrt(mean of its gated squares + eps) * weight."""
    heads, group = hsq.shape[1] // ngroups, y.shape[1] // ngroups
    acc = 0.0
    for hi in range(g * heads, (g + 1) * heads):
        acc += hsq[bi, hi]
    r = 1.0 / math.sqrt(acc / group + eps)
    yg, wg = y[bi, g * group:(g + 1) * group], weight[g * group:(g + 1) * group]
    for c in range(group):                                              # views from 0: it vectorises
        yg[c] = yg[c] * r * wg[c]
