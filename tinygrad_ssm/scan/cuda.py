"""The SSD scan as numba CUDA kernels (package numba-cuda), forward and backward: backend "cuda".

Per batch bi and head hi (group gi = hi // r, r = h / g heads per group), with a_t = dt_t A (log decay):
    S_t = exp(a_t) S_{t-1} + dt_t x_t B_t^T        (p, n)      S_0 = initial_state (zeros if None)
    y_t = S_t C_t + D x_t                            (p,)
The sequence is cut into c chunks of q steps (the last may be shorter), and each pass runs all chunks at once:
  forward   1. chunk_states     every chunk's own state from zero, and its total log decay      (chunk-parallel)
            2. pass_chunks      the boundary states, one short sequential loop over the c chunks (element-parallel)
            3. chunk_outputs    y, recomputing each chunk's states from its boundary state      (chunk-parallel)
  backward  G_t = dL/dS_t runs backwards:  G_t = exp(a_{t+1}) G_{t+1} + dy_t C_t^T,  G_l += d final_state
            4. chunk_grad_states  every chunk's own G entering it, from zero                     (chunk-parallel)
            2. pass_chunks (reverse) the boundary gradients, d initial_state among them
            5. chunk_grad_rows    dx_t = dt_t G_t B_t + D dy_t, and the dD partial sums         (thread per p row)
            6. chunk_grad_columns V_t = S_t^T dy_t and W_t = G_t^T x_t (n-vectors per head)     (thread per n column)
            7. decay_grads        the gradient of a_t, then ddt and dA (cuda_decay.py)                (thread per chunk)
            8. group_sums         dC = sum over the group's heads of V, dB = sum of dt W
Only the c + 1 boundary states are kept between forward and backward; the backward recomputes the rest.
The gradient of the log decay a_t is <G_t, exp(a_t) S_{t-1}>, which needs S and G at the same step; inside a
chunk it is a sum over the chunk's later steps of V and W and a chunk-end product that kernel 6 leaves, exact
only where those are finite (cuda_decay.py's docstring), so forward-running and backward-running passes never meet.

Layout: a row kernel's block is (chunk, batch * head, tile of p rows), one thread per row of the state, its n
entries in a thread-local array; a column kernel's block is (chunk, batch * head, tile of n columns), one
thread per column, its p entries thread-local. The inputs a block's threads all read (B, C for rows; x, dy for
columns; dt and exp(a)) are staged in shared memory STAGE steps at a time. Nothing here uses warp shuffles,
PTX linking or events, so the CUDA simulator (NUMBA_ENABLE_CUDASIM=1) runs every kernel.

The backend takes and returns NumPy arrays (the interface of tinygrad_ssm.scan): every call copies its
inputs to the GPU and its results back. `forward_device` / `backward_device` run on arrays already on the
device (what benchmarks/gpu_check.py times).
"""
from __future__ import annotations

import functools
import math

import numpy as np

from . import cuda_decay
from .cuda_availability import import_numba_cuda
from .cuda_availability import available, simulated, why_unavailable  # noqa: F401  (the backend's interface)

STAGE = 16            # steps of B, C (rows) or x, dy (columns) staged in shared memory at once
MAX_TILE = 128        # threads per block at most (p rows or n columns)
MAX_STATE = 256       # p and n at most: a thread keeps a row (n) or a column (p) of the state in local memory
SHARED_LIMIT = 48 * 1024   # bytes of static shared memory a block may have (more needs dynamic shared memory)


cuda = None           # numba.cuda, imported on first use; a module global, as the simulator swaps it in kernels


def _cuda():
    """numba-cuda's `numba.cuda`, kept in this module's global `cuda` for the kernels."""
    global cuda
    if cuda is None:
        cuda = import_numba_cuda()
    return cuda


def static_shared_bytes(itemsize: int, n: int, p: int) -> dict[str, int]:
    """Bytes of static shared memory of each kernel below that has any: STAGE steps of B, C (n wide) or x, dy (p
    wide) and of dt, exp(a). tests/scan/test_ssd_cuda_compile.py holds these to the compiled kernels'."""
    tiles = {"chunk_states": (1, n, 2), "chunk_outputs": (2, n, 2), "chunk_grad_states": (1, n, 1),
             "chunk_grad_rows": (2, n, 2), "chunk_grad_columns": (2, p, 2)}   # (wide tiles, width, step tiles)
    return {name: (wide * STAGE * width + steps * STAGE) * itemsize for name, (wide, width, steps) in tiles.items()}


@functools.lru_cache(maxsize=None)
def kernels(float_type: str, n: int, p: int):
    """The eight kernels, compiled for one float type ('float32' | 'float64') and state size (p, n): the
    thread-local rows and columns and the shared tiles need sizes known at compile time."""
    _cuda()
    from numba import types
    ft = getattr(types, float_type)
    ZERO = np.dtype(float_type).type(0)         # accumulators in the kernels' float type (no float64 in float32)
    N, P = n, p

    @cuda.jit
    def chunk_states(x, dt, A, B, r, q, local_states, chunk_log_decay):
        """1. s_c = sum_{t in c} exp(a_{t+1} + ... + a_end) dt_t x_t B_t^T: the state chunk c leaves from a zero
        start, by the recurrence s = exp(a_t) s + dt_t x_t B_t^T; and chunk_log_decay = sum_{t in c} a_t.
        grid (c, b h, ceil(p / tile)), block (tile,): thread = one row pi of s (n entries, thread-local).
        x (b, l, h, p), dt (b, l, h), A (h,), B (b, l, g, n)
        -> local_states (c, b, h, p, n), chunk_log_decay (b, c, h)."""
        B_tile = cuda.shared.array((STAGE, N), ft)
        dt_tile = cuda.shared.array(STAGE, ft)
        decay_tile = cuda.shared.array(STAGE, ft)
        ck, tid = cuda.blockIdx.x, cuda.threadIdx.x
        bi, hi = cuda.blockIdx.y // A.shape[0], cuda.blockIdx.y % A.shape[0]
        gi, pi = hi // r, cuda.blockIdx.z * cuda.blockDim.x + tid
        start, end = ck * q, min(ck * q + q, x.shape[1])
        s = cuda.local.array(N, ft)
        for k in range(N):
            s[k] = ZERO
        total = ZERO
        for t0 in range(start, end, STAGE):
            steps = min(STAGE, end - t0)
            cuda.syncthreads()                      # the previous tile is used up
            for i in range(tid, steps * N, cuda.blockDim.x):
                B_tile[i // N, i % N] = B[bi, t0 + i // N, gi, i % N]
            for i in range(tid, steps, cuda.blockDim.x):
                dt_tile[i] = dt[bi, t0 + i, hi]
                decay_tile[i] = math.exp(dt[bi, t0 + i, hi] * A[hi])
            cuda.syncthreads()
            for i in range(steps):
                total += dt_tile[i] * A[hi]
                if pi < P:
                    u = dt_tile[i] * x[bi, t0 + i, hi, pi]
                    for k in range(N):
                        s[k] = decay_tile[i] * s[k] + u * B_tile[i, k]
        if pi < P:
            for k in range(N):
                local_states[ck, bi, hi, pi, k] = s[k]
        if pi == 0:
            chunk_log_decay[bi, ck, hi] = total

    @cuda.jit
    def pass_chunks(start, local_states, chunk_log_decay, reverse, boundary):
        """2. Across the chunk boundaries, one element of the state per thread, sequential over the c chunks:
        forward  boundary[0] = start (initial state),     boundary[k+1] = exp(sum a over chunk k) boundary[k] + s_k
        reverse  boundary[c] = start (d final_state),     boundary[k]   = exp(sum a over chunk k) boundary[k+1] + g_k
        (boundary[k] sits before chunk k: the state entering it, or the gradient of that state).
        grid (ceil(b h p n / 128),), block (128,). start (b, h, p, n), local_states (c, b, h, p, n),
        chunk_log_decay (b, c, h) -> boundary (c + 1, b, h, p, n)."""
        i = cuda.grid(1)
        b, c, h = chunk_log_decay.shape
        if i >= b * h * P * N:
            return
        bi, hi, pi, ni = i // (h * P * N), i // (P * N) % h, i // N % P, i % N
        v = start[bi, hi, pi, ni]
        boundary[c if reverse else 0, bi, hi, pi, ni] = v
        for k in range(c):
            ck = c - 1 - k if reverse else k
            v = math.exp(chunk_log_decay[bi, ck, hi]) * v + local_states[ck, bi, hi, pi, ni]
            boundary[ck if reverse else ck + 1, bi, hi, pi, ni] = v

    @cuda.jit
    def chunk_outputs(x, dt, A, B, C, D, boundary, r, q, y):
        """3. y_t = S_t C_t + D x_t, with S_t recomputed inside chunk c from S = boundary[c] by
        S = exp(a_t) S + dt_t x_t B_t^T. Same grid and block as chunk_states (thread = row pi of S).
        x (b, l, h, p), dt (b, l, h), A, D (h,), B, C (b, l, g, n), boundary (c + 1, b, h, p, n) -> y (b, l, h, p)."""
        B_tile = cuda.shared.array((STAGE, N), ft)
        C_tile = cuda.shared.array((STAGE, N), ft)
        dt_tile = cuda.shared.array(STAGE, ft)
        decay_tile = cuda.shared.array(STAGE, ft)
        ck, tid = cuda.blockIdx.x, cuda.threadIdx.x
        bi, hi = cuda.blockIdx.y // A.shape[0], cuda.blockIdx.y % A.shape[0]
        gi, pi = hi // r, cuda.blockIdx.z * cuda.blockDim.x + tid
        start, end = ck * q, min(ck * q + q, x.shape[1])
        S = cuda.local.array(N, ft)
        if pi < P:
            for k in range(N):
                S[k] = boundary[ck, bi, hi, pi, k]
        for t0 in range(start, end, STAGE):
            steps = min(STAGE, end - t0)
            cuda.syncthreads()
            for i in range(tid, steps * N, cuda.blockDim.x):
                B_tile[i // N, i % N] = B[bi, t0 + i // N, gi, i % N]
                C_tile[i // N, i % N] = C[bi, t0 + i // N, gi, i % N]
            for i in range(tid, steps, cuda.blockDim.x):
                dt_tile[i] = dt[bi, t0 + i, hi]
                decay_tile[i] = math.exp(dt[bi, t0 + i, hi] * A[hi])
            cuda.syncthreads()
            if pi < P:
                for i in range(steps):
                    xt = x[bi, t0 + i, hi, pi]
                    u = dt_tile[i] * xt
                    acc = D[hi] * xt
                    for k in range(N):
                        S[k] = decay_tile[i] * S[k] + u * B_tile[i, k]
                        acc += S[k] * C_tile[i, k]
                    y[bi, t0 + i, hi, pi] = acc

    @cuda.jit
    def chunk_grad_states(dy, dt, A, C, r, q, local_grads):
        """4. g_c = the gradient of the state entering chunk c from the dy inside it alone: from G = 0 at the
        chunk's end, backwards over its steps, G += dy_t C_t^T then G = exp(a_t) G.
        Same grid and block as chunk_states (thread = row pi of G).
        dy (b, l, h, p), dt (b, l, h), A (h,), C (b, l, g, n) -> local_grads (c, b, h, p, n)."""
        C_tile = cuda.shared.array((STAGE, N), ft)
        decay_tile = cuda.shared.array(STAGE, ft)
        ck, tid = cuda.blockIdx.x, cuda.threadIdx.x
        bi, hi = cuda.blockIdx.y // A.shape[0], cuda.blockIdx.y % A.shape[0]
        gi, pi = hi // r, cuda.blockIdx.z * cuda.blockDim.x + tid
        start, end = ck * q, min(ck * q + q, dy.shape[1])
        G = cuda.local.array(N, ft)
        for k in range(N):
            G[k] = ZERO
        for t1 in range(end, start, -STAGE):        # tiles from the chunk's end, [t0, t1)
            t0 = max(start, t1 - STAGE)
            cuda.syncthreads()
            for i in range(tid, (t1 - t0) * N, cuda.blockDim.x):
                C_tile[i // N, i % N] = C[bi, t0 + i // N, gi, i % N]
            for i in range(tid, t1 - t0, cuda.blockDim.x):
                decay_tile[i] = math.exp(dt[bi, t0 + i, hi] * A[hi])
            cuda.syncthreads()
            if pi < P:
                for i in range(t1 - t0 - 1, -1, -1):
                    d = dy[bi, t0 + i, hi, pi]
                    for k in range(N):
                        G[k] = decay_tile[i] * (G[k] + d * C_tile[i, k])
        if pi < P:
            for k in range(N):
                local_grads[ck, bi, hi, pi, k] = G[k]

    @cuda.jit
    def chunk_grad_rows(x, dt, A, B, C, D, dy, grad_boundary, r, q, dx, dD_partial):
        """5. dx_t = dt_t G_t B_t + D dy_t, with G_t recomputed backwards inside chunk c from G = grad_boundary[c+1]
        (G += dy_t C_t^T gives G_t; then G = exp(a_t) G), and dD_partial = sum_{t in c} dy_t x_t per row.
        Same grid and block as chunk_states (thread = row pi of G).
        -> dx (b, l, h, p), dD_partial (b, c, h, p)."""
        B_tile = cuda.shared.array((STAGE, N), ft)
        C_tile = cuda.shared.array((STAGE, N), ft)
        dt_tile = cuda.shared.array(STAGE, ft)
        decay_tile = cuda.shared.array(STAGE, ft)
        ck, tid = cuda.blockIdx.x, cuda.threadIdx.x
        bi, hi = cuda.blockIdx.y // A.shape[0], cuda.blockIdx.y % A.shape[0]
        gi, pi = hi // r, cuda.blockIdx.z * cuda.blockDim.x + tid
        start, end = ck * q, min(ck * q + q, dy.shape[1])
        G = cuda.local.array(N, ft)
        if pi < P:
            for k in range(N):
                G[k] = grad_boundary[ck + 1, bi, hi, pi, k]
        dD_sum = ZERO
        for t1 in range(end, start, -STAGE):
            t0 = max(start, t1 - STAGE)
            cuda.syncthreads()
            for i in range(tid, (t1 - t0) * N, cuda.blockDim.x):
                B_tile[i // N, i % N] = B[bi, t0 + i // N, gi, i % N]
                C_tile[i // N, i % N] = C[bi, t0 + i // N, gi, i % N]
            for i in range(tid, t1 - t0, cuda.blockDim.x):
                dt_tile[i] = dt[bi, t0 + i, hi]
                decay_tile[i] = math.exp(dt[bi, t0 + i, hi] * A[hi])
            cuda.syncthreads()
            if pi < P:
                for i in range(t1 - t0 - 1, -1, -1):
                    d = dy[bi, t0 + i, hi, pi]
                    GB = ZERO
                    for k in range(N):
                        G[k] += d * C_tile[i, k]
                        GB += G[k] * B_tile[i, k]
                        G[k] *= decay_tile[i]
                    dx[bi, t0 + i, hi, pi] = dt_tile[i] * GB + D[hi] * d
                    dD_sum += d * x[bi, t0 + i, hi, pi]
        if pi < P:
            dD_partial[bi, ck, hi, pi] = dD_sum

    @cuda.jit
    def chunk_grad_columns(x, dt, A, B, C, dy, boundary, grad_boundary, r, q, V, W, end_dots):
        """6. Per head, V_t = S_t^T dy_t and W_t = G_t^T x_t (n-vectors, sums over p): S_t recomputed forwards
        from boundary[c], G_t backwards from grad_boundary[c+1], one column ni of each per thread; and, where the
        thread holds both, end_dots = column ni of <grad_boundary[c+1], S at the chunk's end> (for kernel 7).
        grid (c, b h, ceil(n / tile)), block (tile,); x, dy staged in shared memory.
        -> V, W (b, l, h, n), end_dots (b, c, h, n)."""
        x_tile = cuda.shared.array((STAGE, P), ft)
        dy_tile = cuda.shared.array((STAGE, P), ft)
        dt_tile = cuda.shared.array(STAGE, ft)
        decay_tile = cuda.shared.array(STAGE, ft)
        ck, tid = cuda.blockIdx.x, cuda.threadIdx.x
        bi, hi = cuda.blockIdx.y // A.shape[0], cuda.blockIdx.y % A.shape[0]
        gi, ni = hi // r, cuda.blockIdx.z * cuda.blockDim.x + tid
        start, end = ck * q, min(ck * q + q, dy.shape[1])
        col = cuda.local.array(P, ft)
        if ni < N:
            for k in range(P):
                col[k] = boundary[ck, bi, hi, k, ni]
        for t0 in range(start, end, STAGE):         # forwards: S_t and V_t
            steps = min(STAGE, end - t0)
            cuda.syncthreads()
            for i in range(tid, steps * P, cuda.blockDim.x):
                x_tile[i // P, i % P] = x[bi, t0 + i // P, hi, i % P]
                dy_tile[i // P, i % P] = dy[bi, t0 + i // P, hi, i % P]
            for i in range(tid, steps, cuda.blockDim.x):
                dt_tile[i] = dt[bi, t0 + i, hi]
                decay_tile[i] = math.exp(dt[bi, t0 + i, hi] * A[hi])
            cuda.syncthreads()
            if ni < N:
                for i in range(steps):
                    u = dt_tile[i] * B[bi, t0 + i, gi, ni]
                    acc = ZERO
                    for k in range(P):
                        col[k] = decay_tile[i] * col[k] + u * x_tile[i, k]
                        acc += col[k] * dy_tile[i, k]
                    V[bi, t0 + i, hi, ni] = acc
        if ni < N:
            end_dot = ZERO
            for k in range(P):                      # col: S at the chunk's end, then G entering it from later
                g_end = grad_boundary[ck + 1, bi, hi, k, ni]
                end_dot += g_end * col[k]
                col[k] = g_end
            end_dots[bi, ck, hi, ni] = end_dot
        for t1 in range(end, start, -STAGE):        # backwards: G_t and W_t
            t0 = max(start, t1 - STAGE)
            cuda.syncthreads()
            for i in range(tid, (t1 - t0) * P, cuda.blockDim.x):
                x_tile[i // P, i % P] = x[bi, t0 + i // P, hi, i % P]
                dy_tile[i // P, i % P] = dy[bi, t0 + i // P, hi, i % P]
            for i in range(tid, t1 - t0, cuda.blockDim.x):
                decay_tile[i] = math.exp(dt[bi, t0 + i, hi] * A[hi])
            cuda.syncthreads()
            if ni < N:
                for i in range(t1 - t0 - 1, -1, -1):
                    c_t = C[bi, t0 + i, gi, ni]
                    acc = ZERO
                    for k in range(P):
                        col[k] += dy_tile[i, k] * c_t
                        acc += col[k] * x_tile[i, k]
                        col[k] *= decay_tile[i]
                    W[bi, t0 + i, hi, ni] = acc

    @cuda.jit
    def group_sums(dt, V, W, r, dB, dC):
        """9. dC[.., gi, :] = sum over the group's heads of V, dB[.., gi, :] = sum of dt W.
        grid (ceil(b l g n / 128),), block (128,): thread = one element of dB and dC (b, l, g, n)."""
        i = cuda.grid(1)
        b, l, g, n = dB.shape
        if i >= b * l * g * n:
            return
        bi, t, gi, ni = i // (l * g * n), i // (g * n) % l, i // n % g, i % n
        sb = ZERO
        sc = ZERO
        for hi in range(gi * r, gi * r + r):
            sb += dt[bi, t, hi] * W[bi, t, hi, ni]
            sc += V[bi, t, hi, ni]
        dB[bi, t, gi, ni] = sb
        dC[bi, t, gi, ni] = sc

    return dict(chunk_states=chunk_states, pass_chunks=pass_chunks, chunk_outputs=chunk_outputs,
                chunk_grad_states=chunk_grad_states, chunk_grad_rows=chunk_grad_rows,
                chunk_grad_columns=chunk_grad_columns, group_sums=group_sums, **cuda_decay.kernels(float_type))


def chunk_geometry(l: int, chunk_size: int) -> tuple[int, int]:
    """(c, q): c chunks of q steps (the last may be shorter), the same split as the reference backend."""
    c = -(-l // chunk_size)
    return c, -(-l // c)


def refuses(b: int, h: int, p: int, n: int, dtype) -> str | None:
    """Why the kernels cannot take these sizes (ssd's "auto" then takes the next backend), None where they can."""
    if min(b, h, p, n) < 1:
        return None                          # an empty result, made without a launch
    try:
        _check_sizes(b, h, p, n, dtype)
    except ValueError as e:
        return str(e)
    return None


def _check_sizes(b: int, h: int, p: int, n: int, dtype):
    if min(b, h, p, n) < 1:
        raise ValueError(f"ssd backend 'cuda': b, h, p and n must be at least 1 to launch the kernels, got b = {b}, "
                         f"h = {h}, p = {p}, n = {n} (forward and backward return empty results without launching)")
    if p > MAX_STATE or n > MAX_STATE:
        raise ValueError(f"ssd backend 'cuda': head dim p = {p} and state size n = {n} must be at most "
                         f"{MAX_STATE} (a thread keeps a row or column of the state); use backend 'numba_chunked'")
    shared = static_shared_bytes(np.dtype(dtype).itemsize, n, p)
    kernel = max(shared, key=shared.get)
    if shared[kernel] > SHARED_LIMIT:
        raise ValueError(f"ssd backend 'cuda': {np.dtype(dtype)} with head dim p = {p} and state size n = {n} needs "
                         f"{shared[kernel]:,} bytes of static shared memory in kernel {kernel}, over CUDA's limit of "
                         f"{SHARED_LIMIT:,} bytes (48 KiB) a block; use float32 or backend 'numba_chunked'")
    if b * h > 65535:
        raise ValueError(f"ssd backend 'cuda': batch * heads = {b * h} must be at most 65535 (grid dimension y)")


def _row_grid(c, b, h, p):
    tile = min(p, MAX_TILE)
    return (c, b * h, -(-p // tile)), (tile,)


def forward_device(x, dt, A, B, C, D, initial_state, chunk_size: int):
    """Device arrays in (x (b, l, h, p), dt (b, l, h), A (h,), B, C (b, l, g, n), D (h,), initial_state
    (b, h, p, n), all one float type, no None) -> device arrays y (b, l, h, p), boundary (c + 1, b, h, p, n):
    the states entering each chunk, the final state last, and chunk_log_decay (b, c, h): each chunk's sum of
    dt A. Returns without synchronising."""
    cuda = _cuda()
    b, l, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    _check_sizes(b, h, p, n, x.dtype)
    c, q = chunk_geometry(l, chunk_size)
    k = kernels(str(x.dtype), n, p)
    local_states = cuda.device_array((c, b, h, p, n), x.dtype)
    chunk_log_decay = cuda.device_array((b, c, h), x.dtype)
    boundary = cuda.device_array((c + 1, b, h, p, n), x.dtype)
    y = cuda.device_array((b, l, h, p), x.dtype)
    grid, block = _row_grid(c, b, h, p)
    k["chunk_states"][grid, block](x, dt, A, B, h // g, q, local_states, chunk_log_decay)
    k["pass_chunks"][-(-b * h * p * n // 128), 128](initial_state, local_states, chunk_log_decay, 0, boundary)
    k["chunk_outputs"][grid, block](x, dt, A, B, C, D, boundary, h // g, q, y)
    return y, boundary, chunk_log_decay


def backward_device(x, dt, A, B, C, D, boundary, chunk_log_decay, dy, d_final, chunk_size: int):
    """Device arrays in (the forward's inputs, its boundary states and chunk_log_decay, dy (b, l, h, p),
    d_final (b, h, p, n)) -> device arrays dx (b, l, h, p), ddt (b, l, h), dA_partial (b, c, h), dB, dC
    (b, l, g, n), dD_partial (b, c, h, p) and grad_boundary (c + 1, b, h, p, n), whose [0] is the gradient of
    the initial state. The small partial sums dA_partial and dD_partial are left to the caller to sum.
    Returns without synchronising."""
    cuda = _cuda()
    b, l, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    r, dtype = h // g, x.dtype
    _check_sizes(b, h, p, n, dtype)
    c, q = chunk_geometry(l, chunk_size)
    k = kernels(str(dtype), n, p)
    rows, row_block = _row_grid(c, b, h, p)
    local_grads = cuda.device_array((c, b, h, p, n), dtype)
    k["chunk_grad_states"][rows, row_block](dy, dt, A, C, r, q, local_grads)
    grad_boundary = cuda.device_array((c + 1, b, h, p, n), dtype)
    k["pass_chunks"][-(-b * h * p * n // 128), 128](d_final, local_grads, chunk_log_decay, 1, grad_boundary)
    dx, dD_partial = cuda.device_array((b, l, h, p), dtype), cuda.device_array((b, c, h, p), dtype)
    k["chunk_grad_rows"][rows, row_block](x, dt, A, B, C, D, dy, grad_boundary, r, q, dx, dD_partial)
    V, W = cuda.device_array((b, l, h, n), dtype), cuda.device_array((b, l, h, n), dtype)
    end_dots = cuda.device_array((b, c, h, n), dtype)
    tile = min(n, MAX_TILE)
    k["chunk_grad_columns"][(c, b * h, -(-n // tile)), (tile,)](x, dt, A, B, C, dy, boundary, grad_boundary,
                                                                 r, q, V, W, end_dots)
    da, ddt = cuda.device_array((b, l, h), dtype), cuda.device_array((b, l, h), dtype)   # da: scratch
    dA_partial = cuda.device_array((b, c, h), dtype)
    k["decay_grads"][-(-b * h * c // 128), 128](x, dt, A, B, C, dy, V, W, end_dots, boundary, grad_boundary,
                                                r, q, da, ddt, dA_partial)
    dB, dC = cuda.device_array((b, l, g, n), dtype), cuda.device_array((b, l, g, n), dtype)
    k["group_sums"][-(-b * l * g * n // 128), 128](dt, V, W, r, dB, dC)
    return dx, ddt, dA_partial, dB, dC, dD_partial, grad_boundary


# --- the backend's interface: NumPy arrays in and out, copied to and from the device on every call ---------

def forward(x, dt, A, B, C, D, initial_state, chunk_size):
    """Backend.forward: arrays -> (y, final_state, saved); saved keeps the inputs and the c + 1 boundary states."""
    cuda = _cuda()
    b, l, h, p = x.shape
    n = B.shape[3]
    D_or_zeros = np.zeros(h, x.dtype) if D is None else D
    start = np.zeros((b, h, p, n), x.dtype) if initial_state is None else initial_state
    if min(b, h, p, n) == 0:          # an empty state (CUDA refuses a zero-size grid): y = D x, nothing launched
        c = chunk_geometry(l, chunk_size)[0]
        y, boundary_host = x * D_or_zeros[:, None], np.zeros((c + 1, b, h, p, n), x.dtype)
        chunk_log_decay = np.zeros((b, c, h), x.dtype)
    else:
        on_device = [cuda.to_device(np.ascontiguousarray(a, dtype=x.dtype))
                     for a in (x, dt, A, B, C, D_or_zeros, start)]
        y, boundary, chunk_log_decay = (a.copy_to_host() for a in forward_device(*on_device, chunk_size))
        boundary_host = boundary                                         # (c + 1, b, h, p, n)
    saved = (x, dt, A, B, C, D_or_zeros, boundary_host, chunk_log_decay,
             np.array(initial_state is not None), np.array(D is not None), np.array(chunk_size))
    final_state = boundary_host[-1].copy()
    return y, final_state, saved


def backward(saved, dy, d_final):
    """Backend.backward: (saved, dy, d final_state) -> (dx, ddt, dA, dB, dC, dD | None, d_initial | None)."""
    cuda = _cuda()
    x, dt, A, B, C, D, boundary, chunk_log_decay, had_initial, had_D, chunk_size = saved
    b, l, h, p = x.shape
    if min(b, h, p, B.shape[3]) == 0:   # an empty state: only y = D x has gradients; nothing launched
        dD = np.einsum("blhp,blhp->h", x, dy) if had_D else None
        d_initial = np.zeros(boundary.shape[1:], x.dtype) if had_initial else None
        return dy * D[:, None], np.zeros_like(dt), np.zeros_like(A), np.zeros_like(B), np.zeros_like(C), dD, d_initial
    on_device = [cuda.to_device(np.ascontiguousarray(a, dtype=x.dtype))
                 for a in (x, dt, A, B, C, D, boundary, chunk_log_decay, dy, d_final)]
    dx, ddt, dA_partial, dB, dC, dD_partial, grad_boundary = backward_device(*on_device, int(chunk_size))
    dA = dA_partial.copy_to_host().sum(axis=(0, 1))
    dD = dD_partial.copy_to_host().sum(axis=(0, 1, 3)) if had_D else None
    d_initial = grad_boundary[0].copy_to_host() if had_initial else None
    return dx.copy_to_host(), ddt.copy_to_host(), dA, dB.copy_to_host(), dC.copy_to_host(), dD, d_initial
