"""Kernel 7 of backend "cuda" (cuda.py): the gradient of the log decay a_t = dt_t A, da_t, then ddt and dA.

da_t = <G_t, exp(a_t) S_{t-1}> needs S and G at the same step, which no pass of cuda.py has: those run S forwards
and G backwards. Inside chunk k (steps start .. e, entering state S_in = boundary[k], G_out = grad_boundary[k+1]
the gradient of its last state from later steps, d final_state for the last chunk) it is instead

  fast   da_t = <G_out, S_e> + sum_{t <= t' <= e} (C_t'.V_t' - dt_t' B_t'.W_t')
         (<G_t, S_t> = C_t.V_t + da_{t+1} and S_t - exp(a_t) S_{t-1} = dt_t x_t B_t^T), with V, W from kernel 6,
         which also leaves the n column products of <G_out, S_e> in end_dots (its thread holds both columns at
         the chunk's end: p multiply-adds a column and chunk, no extra read). 2 n multiply-adds a step. Only a
         chunk's own steps: no sum runs across chunks (<G_out, S_e> is computed, not carried from later chunks).
  exact  da_t = w + sum_{t' >= t} v_t' + sum_{s < t} f_s + sum_{s < t <= t'} exp(a_{s+1} + .. + a_t') g[t', s]
         w = exp(a_start + .. + a_e) <G_out, S_in>          v_t = exp(a_start + .. + a_t) dy_t . (S_in C_t)
         f_s = exp(a_{s+1} + .. + a_e) X_s . (G_out B_s)    g[t', s] = (dy_t' . X_s)(C_t' . B_s),  X_s = dt_s x_s
         (G_t and S_{t-1} written out as the chunk's terms and multiplied), 2 q p n + q^2 (p + n) / 2 per chunk.

The fast sum cancels its terms: every step t' >= t of the chunk enters da_t, the later x and B among them, so a
non-finite B or x at step t' made da (and so ddt) non-finite at every earlier step too, where the recurrence's is
non-finite only from t' on; and with strong decay its terms are far larger than the da_t they make (da_t is
exp(a_t) times <G_t, S_t>), so that their rounding is all that is left. Each exact term multiplies only what the
recurrence multiplies (as numba_chunked's segment sums): a non-finite input reaches da_t exactly where it reaches
<G_t, exp(a_t) S_{t-1}>, and nothing cancels. A chunk is redone the exact way, by the same thread, from global
memory, when the fast total is not finite (NaN stays NaN, inf stays inf or becomes NaN) or when it cancelled: its
rounding, at most ~16 eps of sum_t dt_t added_t (added_t: the absolute values the sum has added up to step t),
passes 1,000 eps of sum_t dt_t |da_t|. Either way ddt_t = B_t.W_t + A da_t and dA = sum_t dt_t da_t.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from .cuda_availability import import_numba_cuda

cuda = None           # numba.cuda, a module global as in cuda.py (the simulator swaps it in kernels)
EXACT_EVERYWHERE = False   # every chunk the exact way: for tests under the simulator, which reads it at run time
                           # (a compiled kernel took its value when it compiled)


@functools.lru_cache(maxsize=None)
def kernels(float_type: str) -> dict:
    """{"decay_grads": the kernel} for one float type ('float32' | 'float64'); sizes are read from the arrays."""
    global cuda
    cuda = import_numba_cuda()
    INF = np.dtype(float_type).type(np.inf)     # constants in the kernel's float type (no float64 in float32)
    ZERO = np.dtype(float_type).type(0)
    # the fast sum is kept while its rounding (at most ~16 eps of what it added, a bound) stays within 1,000 eps of
    # the size of dA's terms: past that it cancelled, and the chunk is redone the exact way
    CANCELLED = np.dtype(float_type).type(16 / 1000)

    @cuda.jit
    def decay_grads(x, dt, A, B, C, dy, V, W, end_dots, boundary, grad_boundary, r, q, da, ddt, dA_partial):
        """7. da_t by the fast sum over the chunk's steps, by the exact form where that is not finite or cancelled
        (the module's docstring); ddt_t = B_t.W_t + A da_t and dA_partial = sum_{t in c} dt_t da_t.
        grid (ceil(b h c / 128),), block (128,): thread = (bi, hi, chunk). end_dots (b, c, h, n): the columns of
        <G_out, S_e>; da (b, l, h): the exact form's da (scratch). -> ddt (b, l, h), dA_partial (b, c, h).
        (One kernel, no device function: typing a call to one needs a GPU, which test_ssd_cuda_compile.py lacks.)"""
        i = cuda.grid(1)
        b, c, h = dA_partial.shape
        if i >= b * h * c:
            return
        bi, hi, ck = i // (h * c), i // c % h, i % c
        gi = hi // r
        start, end = ck * q, min(ck * q + q, dt.shape[1])
        a, p, n = A[hi], boundary.shape[3], boundary.shape[4]
        run = ZERO
        added = ZERO                                 # the size of all the sum has added: its rounding's scale
        for k in range(n):
            run += end_dots[bi, ck, hi, k]
            added += abs(end_dots[bi, ck, hi, k])
        dA_sum = ZERO
        rounding = ZERO                              # sum_t dt_t added_t: dA's rounding, in units of eps
        size = ZERO                                  # sum_t dt_t |da_t|: the size of dA's terms
        for t in range(end - 1, start - 1, -1):
            cv = ZERO
            bw = ZERO
            for k in range(n):
                cv += C[bi, t, gi, k] * V[bi, t, hi, k]
                bw += B[bi, t, gi, k] * W[bi, t, hi, k]
            run += cv - dt[bi, t, hi] * bw
            added += abs(cv) + dt[bi, t, hi] * abs(bw)
            ddt[bi, t, hi] = bw + a * run
            dA_sum += dt[bi, t, hi] * run
            rounding += dt[bi, t, hi] * added
            size += dt[bi, t, hi] * abs(run)
        # the exact form where a term is not finite (NaN stays NaN, inf inf or NaN), and where the fast sum cancelled
        # (strong decay: da_t is far smaller than the terms that make it, and their rounding is all that is left)
        if EXACT_EVERYWHERE or not abs(run) < INF or not CANCELLED * rounding <= size:
            s_incl = ZERO                            # the exact form, da_t = w + the reverse sum of v, ...
            for t in range(start, end):
                s_incl += dt[bi, t, hi] * a
                v = ZERO
                for j in range(p):
                    row = ZERO
                    for k in range(n):
                        row += boundary[ck, bi, hi, j, k] * C[bi, t, gi, k]
                    v += dy[bi, t, hi, j] * row
                da[bi, t, hi] = math.exp(s_incl) * v
            w = ZERO
            for j in range(p):
                for k in range(n):
                    w += grad_boundary[ck + 1, bi, hi, j, k] * boundary[ck, bi, hi, j, k]
            run = math.exp(s_incl) * w
            for t in range(end - 1, start - 1, -1):
                run += da[bi, t, hi]
                da[bi, t, hi] = run
            tail = ZERO                             # f_s, to every later step: tail_s = a_{s+1} + .. + a_e in ddt
            for t in range(end - 1, start - 1, -1):
                ddt[bi, t, hi] = tail
                tail += dt[bi, t, hi] * a
            run = ZERO
            for t in range(start, end):
                da[bi, t, hi] += run
                f = ZERO
                for j in range(p):
                    row = ZERO
                    for k in range(n):
                        row += grad_boundary[ck + 1, bi, hi, j, k] * B[bi, t, gi, k]
                    f += x[bi, t, hi, j] * row
                run += math.exp(ddt[bi, t, hi]) * dt[bi, t, hi] * f
            # the pairs s < t <= t', t going down: R[s] = sum_{t' >= t} exp(a_{t+1} + .. + a_t') g[t', s] (in
            # ddt[s], for s < t only: a later x_s or B_s never enters); da_t += sum_{s < t} exp(a_{s+1} + .. + a_t) R[s]
            for t in range(end - 1, start, -1):
                later = math.exp(dt[bi, t + 1, hi] * a) if t < end - 1 else ZERO
                for s in range(start, t):
                    xdy, cb = ZERO, ZERO
                    for j in range(p):
                        xdy += dy[bi, t, hi, j] * x[bi, s, hi, j]
                    for k in range(n):
                        cb += C[bi, t, gi, k] * B[bi, s, gi, k]
                    g = dt[bi, s, hi] * xdy * cb
                    ddt[bi, s, hi] = g if t == end - 1 else g + later * ddt[bi, s, hi]
                seg, pairs = ZERO, ZERO
                for s in range(t - 1, start - 1, -1):
                    seg += dt[bi, s + 1, hi] * a
                    pairs += math.exp(seg) * ddt[bi, s, hi]
                da[bi, t, hi] += pairs
            dA_sum = ZERO                            # ... then ddt and dA from it
            for t in range(start, end):
                bw = ZERO
                for k in range(n):
                    bw += B[bi, t, gi, k] * W[bi, t, hi, k]
                ddt[bi, t, hi] = bw + a * da[bi, t, hi]
                dA_sum += dt[bi, t, hi] * da[bi, t, hi]
        dA_partial[bi, ck, hi] = dA_sum

    return dict(decay_grads=decay_grads)
